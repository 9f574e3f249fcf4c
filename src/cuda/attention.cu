/* attention.cu — causal softmax attention over the KV cache (K and V each f16, bf16, q8_0 or
 * q4_0: kv_types.cuh, read in place), GQA, online softmax in f32.
 *
 * A block of ATTN_WARPS warps serves one (token, q head, slice of the token's cache rows). Its
 * rows are walked by "walkers" of lw lanes (8 for heads of <= 64, 16 for <= 128, else 32) with
 * the head dimension spread over a walker's lanes (8 consecutive elements per lane per 8·lw
 * when head_dim % 8 == 0, always so for the block types, whose 8 then lie in one block); a
 * warp of a narrow head walks 32/lw rows at once instead of leaving most lanes idle. Each
 * walker keeps its own running max / sum / accumulator; the walkers are merged in a fixed
 * order. Decode and verify batches (n_tok <= ATTN_SMALL_BATCH) cut every token's rows into
 * attn_n_split(n_ctx) slices (32 up to 8192 rows, then one per 256 rows up to 128: a long
 * context needs more blocks in flight, its loads are the whole cost), a function of that
 * token's n_ctx only, and the last slice block of a (token, head) to finish merges them, so the
 * whole GPU works on one token and a token's output does not depend on the batch it came in.
 * A prompt's tokens past ATTN_SMALL_BATCH take one slice each; other batches that long go in
 * launches of ATTN_SMALL_BATCH tokens with their slices (the same rows as alone).
 * Differences from the CPU: the order of the q·k sum and the merge of the partial softmaxes
 * (rounding only), CUDA's expf, and for a block type's K the query rounded to int8 per 8
 * elements (scale amax/127): the K·q products are then integer dot products (__dp4a), as
 * llama.cpp's quantized-K attention forms them, instead of a conversion and an FMA per element. */
#include "cuda_internal.cuh"
#include "kv_types.cuh"

#include <limits.h>

#define ATTN_WARPS 4
#define ATTN_SPLIT_MIN 32
#define ATTN_SPLIT_MAX 128       /* a multiple of 32: the merge's weights are one warp's */
#define ATTN_SLICE_ROWS 256
#define ATTN_SMALL_BATCH 8
#define ATTN_MAX_D 512

/* The slices of a token that attends len rows: the same whatever the batch or the launch. */
__host__ __device__ __forceinline__ int attn_n_split(int len) {
    const int s = (len + ATTN_SLICE_ROWS - 1) / ATTN_SLICE_ROWS;
    return s < ATTN_SPLIT_MIN ? ATTN_SPLIT_MIN : s > ATTN_SPLIT_MAX ? ATTN_SPLIT_MAX : s;
}

/* Element i (< NE) of a walker lane's share of a head (sub: the lane within its walker of lw
 * lanes; lw is 32 wherever NE > 8). VEC: 8 consecutive per 8·lw elements. */
template <int NE, bool VEC> __device__ __forceinline__ int attn_elem(int sub, int i) {
    return VEC ? 256 * (i / 8) + 8 * sub + (i % 8) : sub + 32 * i;
}

/* A walker lane's NE elements of the cached head row at p (type T) into o (zeros past D), as
 * kv_load8 gives them: codes for the block types, with each 8's factor in d (else 1). */
template <int T, int NE, bool VEC>
__device__ __forceinline__ void attn_load(const uint8_t *p, int sub, int D, float (&o)[NE], float (&d)[NE / 8]) {
    if constexpr (VEC) {
#pragma unroll
        for (int c = 0; c < NE / 8; c++) {
            const int e = 256 * c + 8 * sub;
            if (e < D) {
                d[c] = kv_load8<T>(p, e, &o[8 * c]);
            } else {
                d[c] = 0.0f;
#pragma unroll
                for (int i = 0; i < 8; i++) o[8 * c + i] = 0.0f;
            }
        }
    } else {
#pragma unroll
        for (int c = 0; c < NE / 8; c++) d[c] = 1.0f;
#pragma unroll
        for (int i = 0; i < NE; i++) {
            const int e = sub + 32 * i;
            o[i] = e < D ? kv_load1<T>(p, e) : 0.0f;
        }
    }
}

/* A token-head's partials (ATTN_PART floats): the slices' maxima, then their sums, then per
 * group of 4 elements a float4 for each slice, the slices side by side: a slice block stores a
 * float4 per group, a merge thread reads one per slice from consecutive addresses. */
#define ATTN_PART(D) ((size_t)(2 + 4 * (((D) + 3) / 4)) * ATTN_SPLIT_MAX)

/* Merge a token-head's slices (ph: its partials, n_split of them) into o. The slice weights
 * exp(m_s - M) are formed once, by one warp (lane l holds slices l, l + 32, ...; its share of
 * the sum in that order, then the warp's butterfly). Then thread (g, p) sums slice group p
 * (the p-th of P contiguous ranges) of element group g, 8 loads in flight before their adds,
 * and the groups' sums are added in order p = 0, 1, ...: a fixed order for a given n_split and
 * D. The partials were written by other blocks of the launch: loads go to L2 (__ldcg), past
 * this SM's L1. */
__device__ __forceinline__ void attn_merge(const float *ph, int n_split, int D, float *o) {
    __shared__ float f[ATTN_SPLIT_MAX];
    __shared__ float inv_l;
    __shared__ float4 red[ATTN_WARPS * 32];
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        float ms[ATTN_SPLIT_MAX / 32], M = -INFINITY;
#pragma unroll
        for (int j = 0; j < ATTN_SPLIT_MAX / 32; j++) {
            const int s = lane + 32 * j;
            ms[j] = s < n_split ? __ldcg(ph + s) : -INFINITY;
            M = fmaxf(M, ms[j]);
        }
        M = cuda_warp_max(M);
        float L = 0.0f;
#pragma unroll
        for (int j = 0; j < ATTN_SPLIT_MAX / 32; j++) {
            const int s = lane + 32 * j;
            const float fs = ms[j] == -INFINITY ? 0.0f : expf(ms[j] - M);
            if (s < n_split) f[s] = fs;
            if (fs != 0.0f) L += __ldcg(ph + ATTN_SPLIT_MAX + s) * fs;
        }
        L = cuda_warp_sum(L);
        if (lane == 0) inv_l = L > 0.0f ? 1.0f / L : 0.0f;
    }
    __syncthreads();
    const int n_grp = (D + 3) / 4, P = max(1, (int)blockDim.x / n_grp); /* n_grp <= blockDim.x */
    const int g = threadIdx.x % n_grp, p = threadIdx.x / n_grp;
    const bool on = p < P;
    float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (on) {
        const float4 *row = (const float4 *)(ph + (size_t)(2 + 4 * g) * ATTN_SPLIT_MAX);
        const int s_lo = p * n_split / P, s_hi = (p + 1) * n_split / P;
        for (int s0 = s_lo; s0 < s_hi; s0 += 8) {
            float4 v[8];
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] = s0 + k < s_hi ? __ldcg(row + s0 + k) : make_float4(0, 0, 0, 0);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                const float w = s0 + k < s_hi ? f[s0 + k] : 0.0f;
                if (w != 0.0f) {
                    a.x += v[k].x * w;
                    a.y += v[k].y * w;
                    a.z += v[k].z * w;
                    a.w += v[k].w * w;
                }
            }
        }
    }
    if (P > 1) {
        if (on) red[threadIdx.x] = a;
        __syncthreads();
        if (p == 0)
            for (int q = 1; q < P; q++) {
                const float4 b = red[q * n_grp + g];
                a.x += b.x; a.y += b.y; a.z += b.z; a.w += b.w;
            }
    }
    if (p == 0) {
        const float r[4] = {a.x, a.y, a.z, a.w};
        for (int c = 0; c < 4 && 4 * g + c < D; c++) o[4 * g + c] = r[c] * inv_l;
    }
}

/* HG query heads of one KV head per block (HG > 1: prompts, one slice): each cache row loaded
 * serves all HG, so a prompt's blocks read the cache HG times less (a block per query head
 * made the 9B's prefill of 4096 tokens wait on the L2: 42 µs per token in attention). */
/* No __restrict__ on the inputs: earlier kernels write them, and ptxas may hoist the
 * non-coherent loads that `const __restrict__` allows above the launch wait (the 4-head kernel's
 * were: gemma4's prompts read q and the cache before attn_prep had written them; pdl-check.py). */
/* Decode's instances (one head, heads of <= 256) in <= 72 registers, 7 blocks per SM: left
 * alone ptxas takes 95 and fits 5; a walker's load latency is hidden by other warps. */
template <int TK, int TV, int NE, bool VEC, int HG, int LW>
__global__ void __launch_bounds__(ATTN_WARPS * 32, HG == 1 && NE == 8 ? 7 : 1)
attn_kernel(const float *q, int q_stride, int q_head_stride, const uint8_t *kc, const uint8_t *vc, size_t k_row,
            size_t v_row, size_t k_head, size_t v_head, const int32_t *cell0, const int32_t *n_ctx, int n_head,
            int n_head_kv, int D, float scale, float *out, float *part, unsigned *count) {
    constexpr int PER_WARP = 32 / LW, N_WALK = ATTN_WARPS * PER_WARP;
    __shared__ float sm_m[HG][N_WALK], sm_l[HG][N_WALK];
    __shared__ float sm_acc[ATTN_WARPS * ATTN_MAX_D]; /* [walker][D]: walkers · D <= this */
    cuda_pdl_begin();
    const int s = blockIdx.x, h0 = blockIdx.y * HG, t = blockIdx.z;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int sub = lane % LW, walker = warp * PER_WARP + lane / LW;
    const int len = n_ctx[t], c0 = cell0[t];
    /* a block type's K: dot products of its codes with the query rounded to int8 per 8 elements
     * (scale amax / 127), __dp4a four at a time, each 8's two scales applied once */
    constexpr bool KQ = kv_scaled<TK>;
    float qv[HG][NE], acc[HG][NE], kf[NE], vf[NE], m[HG], l[HG];
    uint32_t qi[HG][NE / 4];
    float qsc[HG][NE / 8];
#pragma unroll
    for (int g = 0; g < HG; g++) { /* q before anything that waits for len */
        const float *qh = q + (size_t)t * q_stride + (size_t)(h0 + g) * q_head_stride;
#pragma unroll
        for (int i = 0; i < NE; i++) {
            const int e = attn_elem<NE, VEC>(sub, i);
            qv[g][i] = e < D ? qh[e] : 0.0f;
            acc[g][i] = 0.0f;
        }
        m[g] = -INFINITY;
        l[g] = 0.0f;
        if constexpr (KQ) {
#pragma unroll
            for (int c8 = 0; c8 < NE / 8; c8++) {
                float amax = 0.0f;
#pragma unroll
                for (int i = 8 * c8; i < 8 * c8 + 8; i++) amax = fmaxf(amax, fabsf(qv[g][i]));
                const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
                qsc[g][c8] = amax / 127.0f;
#pragma unroll
                for (int w = 0; w < 2; w++) {
                    uint32_t word = 0;
#pragma unroll
                    for (int b = 0; b < 4; b++)
                        word |= (uint32_t)(__float2int_rn(qv[g][8 * c8 + 4 * w + b] * inv) & 0xFF) << (8 * b);
                    qi[g][2 * c8 + w] = word;
                }
            }
        }
    }
    /* gridDim.x > 1: as many slices as the longest context the launch may see; this token's own
     * are fewer where it is shorter, and the blocks past them have nothing to do */
    const int n_split = gridDim.x == 1 ? 1 : min((int)gridDim.x, attn_n_split(len));
    if (s >= n_split) return;
    const int hk = h0 / (n_head / n_head_kv);
    const int per = (len + n_split - 1) / n_split, lo = s * per, hi = min(len, lo + per);
    /* the next row's k and v are requested before this row's arithmetic: a walker's rows are
     * few (a slice of a context), so each load's latency is most of its cost */
    float kn[NE], vn[NE], kdn[NE / 8], vdn[NE / 8], kd[NE / 8], vd[NE / 8];
    uint32_t kwn[NE / 4], kw[NE / 4]; /* KQ: K's codes */
#pragma unroll
    for (int i = 0; i < NE; i++) kn[i] = vn[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < NE / 4; i++) kwn[i] = 0;
#pragma unroll
    for (int i = 0; i < NE / 8; i++) kdn[i] = vdn[i] = 0.0f;
    auto load_row = [&](int c) { /* cache row c of this head into kn (or kwn), vn (factors kdn, vdn) */
        const size_t cell = (size_t)(c0 + c);
        const uint8_t *kp = kc + cell * k_row + (size_t)hk * k_head;
        if constexpr (KQ) { /* block types: VEC */
#pragma unroll
            for (int c8 = 0; c8 < NE / 8; c8++) {
                const int e = 256 * c8 + 8 * sub;
                uint32_t w[2] = {0, 0};
                kdn[c8] = e < D ? kv_codes8<TK>(kp, e, w) : 0.0f;
                kwn[2 * c8] = w[0];
                kwn[2 * c8 + 1] = w[1];
            }
        } else {
            attn_load<TK, NE, VEC>(kp, sub, D, kn, kdn);
        }
        attn_load<TV, NE, VEC>(vc + cell * v_row + (size_t)hk * v_head, sub, D, vn, vdn);
    };
    /* walker w takes rows lo + w, lo + w + n_walk, ...; a warp's walkers step together (their
     * butterflies need the whole warp), the ones past hi along without a row */
    if (lo + walker < hi) load_row(lo + walker);
    for (int c = lo + walker; c - lane / LW < hi; c += N_WALK) {
        const bool live = c < hi;
#pragma unroll
        for (int i = 0; i < NE; i++) { kf[i] = kn[i]; vf[i] = vn[i]; }
#pragma unroll
        for (int i = 0; i < NE / 4; i++) kw[i] = kwn[i];
#pragma unroll
        for (int i = 0; i < NE / 8; i++) { kd[i] = kdn[i]; vd[i] = vdn[i]; }
        if (c + N_WALK < hi) load_row(c + N_WALK);
        float sc[HG];
#pragma unroll
        for (int g = 0; g < HG; g++) { /* a block type's d once per 8 codes */
            float dot = 0.0f;
#pragma unroll
            for (int c8 = 0; c8 < NE / 8; c8++) {
                if constexpr (KQ) { /* |sum| <= 8·127·128 < 2^24: exact as a float */
                    const int d8 = __dp4a((int)qi[g][2 * c8 + 1], (int)kw[2 * c8 + 1],
                                          __dp4a((int)qi[g][2 * c8], (int)kw[2 * c8], 0));
                    dot = fmaf((float)d8, qsc[g][c8] * kd[c8], dot);
                } else {
                    float d8 = 0.0f;
#pragma unroll
                    for (int i = 8 * c8; i < 8 * c8 + 8; i++) d8 = fmaf(qv[g][i], kf[i], d8);
                    dot = dot + d8;
                }
            }
            sc[g] = dot;
        }
#pragma unroll
        for (int o = LW / 2; o > 0; o >>= 1)
#pragma unroll
            for (int g = 0; g < HG; g++) sc[g] += __shfl_xor_sync(0xFFFFFFFFu, sc[g], o);
        if (!live) continue;
#pragma unroll
        for (int g = 0; g < HG; g++) {
            const float scg = sc[g] * scale;
            if (scg > m[g]) {
                const float corr = expf(m[g] - scg);
#pragma unroll
                for (int i = 0; i < NE; i++) acc[g][i] *= corr;
                l[g] *= corr;
                m[g] = scg;
            }
            const float p = expf(scg - m[g]);
            l[g] += p;
#pragma unroll
            for (int c8 = 0; c8 < NE / 8; c8++) {
                const float pv = kv_scaled<TV> ? p * vd[c8] : p;
#pragma unroll
                for (int i = 8 * c8; i < 8 * c8 + 8; i++) acc[g][i] = fmaf(pv, vf[i], acc[g][i]);
            }
        }
    }
    if (sub == 0)
#pragma unroll
        for (int g = 0; g < HG; g++) { sm_m[g][walker] = m[g]; sm_l[g][walker] = l[g]; }
#pragma unroll
    for (int g = 0; g < HG; g++) {
        if (g) __syncthreads(); /* the last head's merge has read sm_acc */
#pragma unroll
        for (int i = 0; i < NE; i++) {
            const int e = attn_elem<NE, VEC>(sub, i);
            if (e < D) sm_acc[walker * D + e] = acc[g][i];
        }
        __syncthreads();
        float M = sm_m[g][0];
#pragma unroll
        for (int w = 1; w < N_WALK; w++) M = fmaxf(M, sm_m[g][w]);
        float f[N_WALK], L = 0.0f;
#pragma unroll
        for (int w = 0; w < N_WALK; w++) {
            f[w] = sm_m[g][w] == -INFINITY ? 0.0f : expf(sm_m[g][w] - M);
            L += sm_l[g][w] * f[w];
        }
        auto walkers_sum = [&](int e) { /* element e over the walkers, in order */
            float a = 0.0f;
#pragma unroll
            for (int w = 0; w < N_WALK; w++) a += sm_acc[w * D + e] * f[w];
            return a;
        };
        const int h = h0 + g;
        float *o = out + (size_t)t * n_head * D + (size_t)h * D;
        if (n_split == 1) {
            const float inv = L > 0.0f ? 1.0f / L : 0.0f;
            for (int e = threadIdx.x; e < D; e += blockDim.x) o[e] = walkers_sum(e) * inv;
        } else { /* HG 1 */
            float *ph = part + ((size_t)t * n_head + h) * ATTN_PART(D);
            if (threadIdx.x == 0) { ph[s] = M; ph[ATTN_SPLIT_MAX + s] = L; }
            for (int gi = threadIdx.x; 4 * gi < D; gi += blockDim.x) {
                float r[4];
#pragma unroll
                for (int c = 0; c < 4; c++) r[c] = 4 * gi + c < D ? walkers_sum(4 * gi + c) : 0.0f;
                __stcg((float4 *)(ph + (size_t)(2 + 4 * gi) * ATTN_SPLIT_MAX + 4 * s), make_float4(r[0], r[1], r[2], r[3]));
            }
            /* the token-head's last slice to finish merges them all (a merge kernel of its own
             * cost a dependent launch per attention layer) and rearms the counter for the next */
            __shared__ bool last;
            __threadfence();
            __syncthreads();
            unsigned *cnt = count + (size_t)t * n_head + h;
            if (threadIdx.x == 0) last = atomicAdd(cnt, 1u) == (unsigned)n_split - 1;
            __syncthreads();
            if (!last) return;
            __threadfence();
            if (threadIdx.x == 0) *cnt = 0;
            attn_merge(ph, n_split, D, o);
        }
    }
}

/* One launch: n_tok tokens (<= ATTN_SMALL_BATCH where split), each in one slice (a prompt)
 * or in its attn_n_split slices (split). */
static void attention_launch(struct cuda_ctx *c, const float *q, int q_stride, int q_head_stride,
                             const struct kv_view *kv, const int32_t *cell0, const int32_t *n_ctx, int n_tok,
                             int n_head, float scale, float *out, bool split) {
    const int n_head_kv = kv->n_head_kv, head_dim = kv->head_dim;
    const uint8_t *k_cache = (const uint8_t *)kv->k, *v_cache = (const uint8_t *)kv->v;
    const size_t k_head = ggml_row_size(kv->k_type, head_dim), v_head = ggml_row_size(kv->v_type, head_dim);
    float *part = NULL;
    unsigned *count = NULL;
    /* the slices of the longest context this view holds (all it may hold if it does not say) */
    const int n_split = split ? attn_n_split(kv->max_rows > 0 ? kv->max_rows : INT_MAX / 2) : 1;
    /* sized for the largest small batch and split at once: growing it later makes recorded
     * graphs stale */
    if (split) {
        part = (float *)cuda_scratch(c, &c->attn_part, &c->attn_part_size,
                                     sizeof(float) * (size_t)ATTN_SMALL_BATCH * n_head * ATTN_PART(head_dim));
        /* the slices' arrival counters, one per (token, head): zero between launches */
        const size_t had = c->attn_count_size;
        count = (unsigned *)cuda_scratch(c, &c->attn_count, &c->attn_count_size,
                                         sizeof(unsigned) * (size_t)ATTN_SMALL_BATCH * n_head);
        if (c->attn_count_size != had) CUDA_CHECK(cudaMemsetAsync(count, 0, c->attn_count_size, c->stream));
    }
    /* prompts: the query heads of a KV head together, up to 4 (2 for heads past 256) */
    const int group = n_head / n_head_kv;
    int hg = 1;
    if (n_split == 1) hg = group % 4 == 0 && head_dim <= 256 ? 4 : group % 2 == 0 ? 2 : 1;
    const dim3 grid(n_split, n_head / hg, n_tok);
    const bool vec = head_dim % 8 == 0;
    /* lanes per row walker: a narrow head's row on fewer lanes, more rows at once */
    const int lw = !vec || head_dim > 128 ? 32 : head_dim > 64 ? 16 : 8;
#define ATTN_LAUNCH_G(TK, TV, NE, VEC, HG, LW)                                                                     \
    cuda_launch(c, grid, ATTN_WARPS * 32, attn_kernel<TK, TV, NE, VEC, HG, LW>, q, q_stride, q_head_stride, k_cache, \
                v_cache, kv->k_row_bytes, kv->v_row_bytes, k_head, v_head, cell0, n_ctx, n_head, n_head_kv,         \
                head_dim, scale, out, part, count)
#define ATTN_LAUNCH_W(TK, TV, NE, VEC, LW)                                                      \
    do {                                                                                        \
        /* (heads past 256 group by 2 at most: no 4-head instance of the wide kernel) */        \
        if (NE == 8 && hg == 4) ATTN_LAUNCH_G(TK, TV, NE, VEC, (NE == 8 ? 4 : 2), LW);          \
        else if (hg >= 2) ATTN_LAUNCH_G(TK, TV, NE, VEC, 2, LW);                                \
        else ATTN_LAUNCH_G(TK, TV, NE, VEC, 1, LW);                                             \
    } while (0)
#define ATTN_LAUNCH(TK, TV, NE, VEC)                                                            \
    do {                                                                                        \
        /* narrower walkers only where a lane holds one 8 of the head; the ternaries keep the   \
         * branches that cannot run from naming instances no one defines (a host function's     \
         * `if constexpr` still instantiates both sides) */                                     \
        if (NE == 8 && VEC && lw == 8) ATTN_LAUNCH_W(TK, TV, NE, VEC, (NE == 8 && VEC ? 8 : 32));   \
        else if (NE == 8 && VEC && lw == 16) ATTN_LAUNCH_W(TK, TV, NE, VEC, (NE == 8 && VEC ? 16 : 32)); \
        else ATTN_LAUNCH_W(TK, TV, NE, VEC, 32);                                                \
    } while (0)
    /* the block types tile heads by 32 (kv_type_ok), so only float caches take the scalar loads */
#define ATTN_VEC(TK, TV)                                                                        \
    do {                                                                                        \
        if (head_dim <= 256) ATTN_LAUNCH(TK, TV, 8, true);                                      \
        else ATTN_LAUNCH(TK, TV, 16, true);                                                     \
    } while (0)
#define ATTN_FLOAT(TK, TV)                                                                      \
    do {                                                                                        \
        if (head_dim <= 256) ATTN_LAUNCH(TK, TV, 8, false);                                     \
        else ATTN_LAUNCH(TK, TV, 16, false);                                                    \
    } while (0)
    if (vec) {
        KV_TYPES_DISPATCH(kv->k_type, kv->v_type, ATTN_VEC);
    } else if (kv->k_type == GGML_TYPE_F16 && kv->v_type == GGML_TYPE_F16) {
        ATTN_FLOAT(GGML_TYPE_F16, GGML_TYPE_F16);
    } else if (kv->k_type == GGML_TYPE_BF16 && kv->v_type == GGML_TYPE_BF16) {
        ATTN_FLOAT(GGML_TYPE_BF16, GGML_TYPE_BF16);
    } else if (kv->k_type == GGML_TYPE_F16 && kv->v_type == GGML_TYPE_BF16) {
        ATTN_FLOAT(GGML_TYPE_F16, GGML_TYPE_BF16);
    } else if (kv->k_type == GGML_TYPE_BF16 && kv->v_type == GGML_TYPE_F16) {
        ATTN_FLOAT(GGML_TYPE_BF16, GGML_TYPE_F16);
    } else {
        abort(); /* a block type with heads it does not tile: kv_cache_init refuses it */
    }
#undef ATTN_VEC
#undef ATTN_FLOAT
#undef ATTN_LAUNCH
#undef ATTN_LAUNCH_W
#undef ATTN_LAUNCH_G
}

/* A prompt's tokens, however many: the tensor-core tiles where they fit (attention_tiles.cu),
 * else one slice each, one launch; either gives a token what it gives in any prompt batch. Any
 * other batch: every token in its attn_n_split slices, in launches of ATTN_SMALL_BATCH tokens,
 * so that its result is what it gives in any batch (a verify row equals the decode row it
 * replaces). */
void cuda_attention(struct backend *be, const float *q, int q_stride, int q_head_stride, const struct kv_view *kv,
                    const int32_t *cell0, const int32_t *n_ctx, int n_tok, int n_head, float scale, float *out) {
    struct cuda_ctx *c = cuda_enter(be);
    if (n_tok < 1 || n_head < 1) return;
    if (kv->head_dim > ATTN_MAX_D || kv->n_head_kv < 1 || n_head % kv->n_head_kv) abort(); /* model loading rejects these */
    if (c->prompt) {
        if (cuda_attention_tiles_fit(kv, n_head, q, q_stride, q_head_stride))
            cuda_attention_tiles(c, q, q_stride, q_head_stride, kv, cell0, n_ctx, n_tok, n_head, scale, out);
        else
            attention_launch(c, q, q_stride, q_head_stride, kv, cell0, n_ctx, n_tok, n_head, scale, out, false);
        return;
    }
    for (int t0 = 0; t0 < n_tok; t0 += ATTN_SMALL_BATCH)
        attention_launch(c, q + (size_t)t0 * q_stride, q_stride, q_head_stride, kv, cell0 + t0, n_ctx + t0,
                         COTI_MIN(ATTN_SMALL_BATCH, n_tok - t0), n_head, scale, out + (size_t)t0 * n_head * kv->head_dim,
                         true);
}

CUDA_TRACE_TU(attention)
