/* attention_tiles.cu — a prompt's attention on f16 tensor cores (flash attention): a block takes
 * 64 query rows, the query heads of one KV head for 64 / G consecutive tokens (G heads a KV
 * head), and walks the union of their cache rows in tiles of 64 keys: S = Q·Kᵀ by mma, masked
 * to each row's own cells, an online softmax in f32 per row, O += P·V by mma with P rounded to
 * f16. Each cache row is read once per 64 query rows, where attention.cu's prompt kernel reads
 * it once per token (the 9B's 4096-token prefill waited on the L2 there: 24 µs per token).
 * For f16 caches and heads of 64, 128 or 256; others keep attention.cu's kernel. Not
 * bit-identical to anything (q and P rounded to f16): prompts only, like every kernel past
 * set_prompt. A row's result depends on its own cells alone, whatever tokens share its block:
 * the key tiles lie on a fixed grid of cells (multiples of 64), a tile none of the block's rows
 * attends is skipped, and one that misses a row is an exact no-op for it (its scores -inf, its
 * weights 0, the running max unchanged). */
#include "cuda_internal.cuh"
#include "mma.cuh"

#include <limits.h>
#include <math.h>

#define FA_ROWS 64    /* query rows per block: 4 warps of 16 */
#define FA_KEYS 64    /* keys per tile */
#define FA_THREADS 128

template <int D> struct fa_shape {
    enum {
        LD = D + 8, /* halves per shared row: ldmatrix rows 16 bytes apart modulo 128 */
        SMEM = 3 * FA_ROWS * LD * 2,
        NT = D / 8, /* n-tiles of the output */
    };
};

/* grid (token tiles, KV heads). q rows (token t, head h) at q + t·q_stride + h·q_head_stride;
 * a token attends cells [cell0[t], cell0[t] + n_ctx[t]) of the cache; out[t][h][D]. */
template <int D>
__global__ void __launch_bounds__(FA_THREADS, 2)
fa_kernel(const float *q, int q_stride, int q_head_stride, const uint8_t *kc, const uint8_t *vc, size_t k_row,
          size_t v_row, size_t k_head, size_t v_head, const int32_t *cell0, const int32_t *n_ctx, int n_tok, int n_head,
          int G, float scale_log2, float *out) {
    typedef fa_shape<D> S;
    constexpr int LD = S::LD, NT = S::NT;
    extern __shared__ __align__(16) uint8_t dsm[];
    __half(*Qs)[LD] = reinterpret_cast<__half(*)[LD]>(dsm);
    __half(*Ks)[LD] = reinterpret_cast<__half(*)[LD]>(dsm + FA_ROWS * LD * 2);
    __half(*Vs)[LD] = reinterpret_cast<__half(*)[LD]>(dsm + 2 * FA_ROWS * LD * 2);
    __shared__ int range[2], next[2];
    cuda_pdl_begin();
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, qd = lane % 4;
    const int tpt = FA_ROWS / G, t0 = blockIdx.x * tpt, hk = blockIdx.y;
    /* the union of the tile's cells */
    if (warp == 0) {
        int lo = INT_MAX, hi = INT_MIN;
        for (int i = lane; i < tpt; i += 32)
            if (t0 + i < n_tok) {
                lo = min(lo, cell0[t0 + i]);
                hi = max(hi, cell0[t0 + i] + n_ctx[t0 + i]);
            }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            lo = min(lo, __shfl_xor_sync(0xFFFFFFFFu, lo, o));
            hi = max(hi, __shfl_xor_sync(0xFFFFFFFFu, hi, o));
        }
        if (lane == 0) { range[0] = lo; range[1] = hi; next[0] = next[1] = INT_MAX; }
    }
    /* the query rows as f16: row r is token t0 + r / G, head hk·G + r % G (zeros past them) */
    for (int i = tid; i < FA_ROWS * D / 4; i += FA_THREADS) {
        const int r = i / (D / 4), e = 4 * (i % (D / 4)), t = t0 + r / G;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (r < tpt * G && t < n_tok) v = *(const float4 *)(q + (size_t)t * q_stride + (size_t)(hk * G + r % G) * q_head_stride + e);
        *(uint2 *)&Qs[r][e] = make_uint2(pack_h2(v.x, v.y), pack_h2(v.z, v.w));
    }
    __syncthreads();
    const int lo = range[0], hi = range[1];
    /* this thread's two rows (g and g + 8 of its warp's 16): their cells */
    int rb[2], re[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = warp * 16 + g + 8 * h, t = t0 + r / G;
        const bool live = r < tpt * G && t < n_tok;
        rb[h] = live ? cell0[t] : 0;
        re[h] = live ? cell0[t] + n_ctx[t] : 0;
    }
    /* tile j's (cells 64j ..) K or V rows into shared memory; cells outside the block's rows'
     * span repeat its edge (masked: no cell past the cache, none of a sequence before it) */
    auto issue = [&](const uint8_t *base, size_t row, size_t head, __half (*dst)[LD], int j) {
        constexpr int CPR = D / 8; /* 16-byte chunks a row */
        for (int i = tid; i < FA_KEYS * CPR; i += FA_THREADS) {
            const int k = i / CPR, c = i % CPR, cell = min(max(j * FA_KEYS + k, lo), hi - 1);
            cp_async16(&dst[k][8 * c], base + (size_t)cell * row + (size_t)hk * head + 16 * c);
        }
        cp_async_commit();
    };
    /* the first tile past j that one of the block's rows attends (INT_MAX: none), a minimum over
     * the block through next[slot], read after the barrier that follows */
    auto offer_next = [&](int j, int slot) {
        const int from = (j + 1) * FA_KEYS;
        int cand = INT_MAX;
#pragma unroll
        for (int h = 0; h < 2; h++)
            if (re[h] > from) cand = min(cand, max(rb[h], from) / FA_KEYS);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) cand = min(cand, __shfl_xor_sync(0xFFFFFFFFu, cand, o));
        if (lane == 0 && cand != INT_MAX) atomicMin(&next[slot], cand);
    };
    float o[NT][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[n][e] = 0.0f;
    const int first = hi > lo ? lo / FA_KEYS : INT_MAX;
    if (first != INT_MAX) {
        issue(kc, k_row, k_head, Ks, first);
        issue(vc, v_row, v_head, Vs, first);
    }
    for (int j = first, it = 0; j != INT_MAX; it++) {
        cp_async_wait1(); /* K of tile j (its V may still be in flight) */
        __syncthreads();
        float s[FA_KEYS / 8][4];
#pragma unroll
        for (int n = 0; n < FA_KEYS / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[n][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            uint32_t a[4];
            ldsm_x4(&Qs[warp * 16 + lane % 16][kk * 16 + (lane / 16) * 8], a);
#pragma unroll
            for (int nj = 0; nj < FA_KEYS / 16; nj++) {
                uint32_t b[4];
                ldsm_x4(&Ks[nj * 16 + lane % 8 + (lane / 16) * 8][kk * 16 + ((lane / 8) % 2) * 8], b);
                mma_f16_16816(a, b[0], b[1], s[2 * nj]);
                mma_f16_16816(a, b[2], b[3], s[2 * nj + 1]);
            }
        }
        offer_next(j, it & 1);
        __syncthreads(); /* every warp is past Ks: the next tile's K may come */
        const int jn = next[it & 1];
        if (tid == 0) next[(it + 1) & 1] = INT_MAX; /* rearmed: its offers come after two barriers */
        if (jn != INT_MAX) issue(kc, k_row, k_head, Ks, jn);
        else cp_async_commit();
        /* mask to each row's cells, scale into log2 units, online softmax per row */
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < FA_KEYS / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int h = e / 2, cell = j * FA_KEYS + n * 8 + 2 * qd + (e & 1);
                s[n][e] = cell >= rb[h] && cell < re[h] ? s[n][e] * scale_log2 : -INFINITY;
                mx[h] = fmaxf(mx[h], s[n][e]);
            }
        float corr[2], mref[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xFFFFFFFFu, mx[h], 1));
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xFFFFFFFFu, mx[h], 2));
            const float mn = fmaxf(m[h], mx[h]);
            mref[h] = mn == -INFINITY ? 0.0f : mn; /* a row with no cell yet: every p is 0 */
            corr[h] = exp2f(m[h] - mref[h]);
            m[h] = mn;
            l[h] *= corr[h];
        }
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[n][e] *= corr[e / 2];
        uint32_t p[FA_KEYS / 16][4]; /* P as the A fragments of the k16 steps over the keys */
#pragma unroll
        for (int n = 0; n < FA_KEYS / 8; n++) {
            float pe[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                pe[e] = exp2f(s[n][e] - mref[e / 2]);
                l[e / 2] += pe[e];
            }
            p[n / 2][2 * (n % 2)] = pack_h2(pe[0], pe[1]);
            p[n / 2][2 * (n % 2) + 1] = pack_h2(pe[2], pe[3]);
        }
        cp_async_wait1(); /* V of tile j */
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < FA_KEYS / 16; kk++)
#pragma unroll
            for (int dn = 0; dn < D / 16; dn++) {
                uint32_t b[4];
                ldsm_x4_trans(&Vs[kk * 16 + lane % 8 + ((lane / 8) % 2) * 8][dn * 16 + (lane / 16) * 8], b);
                mma_f16_16816(p[kk], b[0], b[1], o[2 * dn]);
                mma_f16_16816(p[kk], b[2], b[3], o[2 * dn + 1]);
            }
        __syncthreads(); /* every warp is past Vs */
        if (jn != INT_MAX) issue(vc, v_row, v_head, Vs, jn);
        else cp_async_commit();
        j = jn;
    }
    cp_async_wait0();
    /* the row sums over the quad, then out = O / l */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        l[h] += __shfl_xor_sync(0xFFFFFFFFu, l[h], 1);
        l[h] += __shfl_xor_sync(0xFFFFFFFFu, l[h], 2);
        const int r = warp * 16 + g + 8 * h, t = t0 + r / G;
        if (r >= tpt * G || t >= n_tok) continue;
        const float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
        float *orow = out + (size_t)t * n_head * D + (size_t)(hk * G + r % G) * D;
#pragma unroll
        for (int n = 0; n < NT; n++)
            *(float2 *)(orow + n * 8 + 2 * qd) = make_float2(o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
    }
}

/* The kernel a prompt's attention over kv can take: f16 K and V, heads of 64, 128 or 256, at
 * most 64 query heads a KV head, q rows 16-byte aligned. */
bool cuda_attention_tiles_fit(const struct kv_view *kv, int n_head, const float *q, int q_stride, int q_head_stride) {
    const int D = kv->head_dim;
    return kv->k_type == GGML_TYPE_F16 && kv->v_type == GGML_TYPE_F16 && (D == 64 || D == 128 || D == 256) &&
           n_head / kv->n_head_kv <= FA_ROWS && q_stride % 4 == 0 && q_head_stride % 4 == 0 && ((uintptr_t)q & 15) == 0;
}

template <int D>
static void fa_launch(struct cuda_ctx *c, const float *q, int q_stride, int q_head_stride, const struct kv_view *kv,
                      const int32_t *cell0, const int32_t *n_ctx, int n_tok, int n_head, float scale, float *out) {
    typedef fa_shape<D> S;
    void (*kern)(const float *, int, int, const uint8_t *, const uint8_t *, size_t, size_t, size_t, size_t,
                 const int32_t *, const int32_t *, int, int, int, float, float *) = fa_kernel<D>;
    if (S::SMEM > 48 * 1024 && !c->fa_ready[D / 128]) {
        CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, S::SMEM));
        c->fa_ready[D / 128] = true;
    }
    const int G = n_head / kv->n_head_kv, tpt = FA_ROWS / G;
    const dim3 grid(cuda_cdiv(n_tok, tpt), kv->n_head_kv);
    c->attn_tile_launches++;
    cuda_launch_smem(c, grid, FA_THREADS, S::SMEM, kern, q, q_stride, q_head_stride, (const uint8_t *)kv->k,
                     (const uint8_t *)kv->v, kv->k_row_bytes, kv->v_row_bytes, (size_t)D * 2, (size_t)D * 2, cell0, n_ctx,
                     n_tok, n_head, G, scale * 1.4426950408889634f, out);
}

void cuda_attention_tiles(struct cuda_ctx *c, const float *q, int q_stride, int q_head_stride, const struct kv_view *kv,
                          const int32_t *cell0, const int32_t *n_ctx, int n_tok, int n_head, float scale, float *out) {
    switch (kv->head_dim) {
    case 64: fa_launch<64>(c, q, q_stride, q_head_stride, kv, cell0, n_ctx, n_tok, n_head, scale, out); break;
    case 128: fa_launch<128>(c, q, q_stride, q_head_stride, kv, cell0, n_ctx, n_tok, n_head, scale, out); break;
    default: fa_launch<256>(c, q, q_stride, q_head_stride, kv, cell0, n_ctx, n_tok, n_head, scale, out); break;
    }
}

extern "C" long backend_cuda_attention_tile_launches(struct backend *be) { return cuda_ctx_of(be)->attn_tile_launches; }

CUDA_TRACE_TU(attention_tiles)
