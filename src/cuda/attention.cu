/* attention.cu — causal softmax attention over the KV cache (K and V each f16, bf16, q8_0 or
 * q4_0: kv_types.cuh, read in place), GQA, online softmax in f32.
 *
 * A block of ATTN_WARPS warps serves one (token, q head, slice of the token's cache rows); each
 * warp takes every ATTN_WARPS-th row of the slice with the head dimension spread over its lanes
 * (8 consecutive elements per lane per 256 when head_dim % 8 == 0, always so for the block
 * types, whose 8 then lie in one block), keeps its own running
 * max / sum / accumulator, and the warps are merged in a fixed order. Decode and verify batches
 * (n_tok <= ATTN_SMALL_BATCH) cut every token's rows into ATTN_SPLIT slices (a function of that
 * token's n_ctx only), and the last slice block of a (token, head) to finish merges them, so
 * the whole GPU works on one token and a token's output does not depend on the batch it came
 * in. A prompt's tokens past ATTN_SMALL_BATCH take one slice each; other batches that long go
 * in launches of ATTN_SMALL_BATCH tokens with their slices (the same rows as alone).
 * Differences from the CPU: the order of the q·k sum and the merge of the partial softmaxes
 * (rounding only), and CUDA's expf. */
#include "cuda_internal.cuh"
#include "kv_types.cuh"

#define ATTN_WARPS 4
#define ATTN_SPLIT 32           /* <= 32: the merge forms the slice weights in one warp */
#define ATTN_SMALL_BATCH 8
#define ATTN_MAX_D 512

/* Element i (< NE) of a lane's share of a head: VEC: 8 consecutive per 256-element chunk. */
template <int NE, bool VEC> __device__ __forceinline__ int attn_elem(int lane, int i) {
    return VEC ? 256 * (i / 8) + 8 * lane + (i % 8) : lane + 32 * i;
}

/* A lane's NE elements of the cached head row at p (type T) into o (zeros past D). */
template <int T, int NE, bool VEC>
__device__ __forceinline__ void attn_load(const uint8_t *p, int lane, int D, float (&o)[NE]) {
    if constexpr (VEC) {
#pragma unroll
        for (int c = 0; c < NE / 8; c++) {
            const int e = 256 * c + 8 * lane;
            if (e < D) {
                kv_load8<T>(p, e, &o[8 * c]);
            } else {
#pragma unroll
                for (int i = 0; i < 8; i++) o[8 * c + i] = 0.0f;
            }
        }
    } else {
#pragma unroll
        for (int i = 0; i < NE; i++) {
            const int e = lane + 32 * i;
            o[i] = e < D ? kv_load1<T>(p, e) : 0.0f;
        }
    }
}

/* Merge a token-head's slices (pp: its n_split partials) into o: the slice weights exp(m_s - M)
 * are formed once, by one warp, then every element sums its slices in slice order (every
 * slice's loads issued before the first add: one round trip, not one per slice). The partials
 * were written by other blocks of the launch: loads go to L2 (__ldcg), past this SM's L1. */
__device__ __forceinline__ void attn_merge(const float *pp, int n_split, int D, float *o) {
    __shared__ float f[ATTN_SPLIT];
    __shared__ float inv_l;
    if (threadIdx.x < 32) {
        const int s = threadIdx.x;
        const float ms = s < n_split ? __ldcg(pp + (size_t)s * (D + 2)) : -INFINITY;
        const float M = cuda_warp_max(ms);
        f[s] = ms == -INFINITY ? 0.0f : expf(ms - M);
        const float ls = ms == -INFINITY ? 0.0f : __ldcg(pp + (size_t)s * (D + 2) + 1) * f[s];
        float L = 0.0f; /* in slice order, as before */
        for (int k = 0; k < n_split; k++) L += __shfl_sync(0xFFFFFFFFu, ls, k);
        if (s == 0) inv_l = L > 0.0f ? 1.0f / L : 0.0f;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < D; e += blockDim.x) {
        float v[ATTN_SPLIT];
#pragma unroll
        for (int s = 0; s < ATTN_SPLIT; s++) v[s] = s < n_split ? __ldcg(pp + (size_t)s * (D + 2) + 2 + e) : 0.0f;
        float a = 0.0f;
#pragma unroll
        for (int s = 0; s < ATTN_SPLIT; s++)
            if (s < n_split && f[s] != 0.0f) a += v[s] * f[s];
        o[e] = a * inv_l;
    }
}

/* HG query heads of one KV head per block (HG > 1: prompts, one slice): each cache row loaded
 * serves all HG, so a prompt's blocks read the cache HG times less (a block per query head
 * made the 9B's prefill of 4096 tokens wait on the L2: 42 µs per token in attention). */
/* No __restrict__ on the inputs: earlier kernels write them, and ptxas may hoist the
 * non-coherent loads that `const __restrict__` allows above the launch wait (the 4-head kernel's
 * were: gemma4's prompts read q and the cache before attn_prep had written them; pdl-check.py). */
template <int TK, int TV, int NE, bool VEC, int HG>
__global__ void __launch_bounds__(ATTN_WARPS * 32)
attn_kernel(const float *q, int q_stride, int q_head_stride, const uint8_t *kc, const uint8_t *vc, size_t k_row,
            size_t v_row, size_t k_head, size_t v_head, const int32_t *cell0, const int32_t *n_ctx, int n_head,
            int n_head_kv, int D, float scale, float *out, float *part, unsigned *count) {
    __shared__ float sm_m[HG][ATTN_WARPS], sm_l[HG][ATTN_WARPS];
    __shared__ float sm_acc[ATTN_WARPS][ATTN_MAX_D];
    cuda_pdl_begin();
    const int s = blockIdx.x, n_split = gridDim.x, h0 = blockIdx.y * HG, t = blockIdx.z;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int hk = h0 / (n_head / n_head_kv);
    const int len = n_ctx[t], c0 = cell0[t];
    const int per = (len + n_split - 1) / n_split, lo = s * per, hi = min(len, lo + per);
    float qv[HG][NE], acc[HG][NE], kf[NE], vf[NE], m[HG], l[HG];
#pragma unroll
    for (int g = 0; g < HG; g++) {
        const float *qh = q + (size_t)t * q_stride + (size_t)(h0 + g) * q_head_stride;
#pragma unroll
        for (int i = 0; i < NE; i++) {
            const int e = attn_elem<NE, VEC>(lane, i);
            qv[g][i] = e < D ? qh[e] : 0.0f;
            acc[g][i] = 0.0f;
        }
        m[g] = -INFINITY;
        l[g] = 0.0f;
    }
    /* the next row's k and v are requested before this row's arithmetic: a warp's rows are few
     * at decode (a slice of a short context), so each load's latency is most of its cost */
    float kn[NE], vn[NE];
    auto load_row = [&](int c) { /* cache row c of this head into kn, vn */
        const size_t cell = (size_t)(c0 + c);
        attn_load<TK, NE, VEC>(kc + cell * k_row + (size_t)hk * k_head, lane, D, kn);
        attn_load<TV, NE, VEC>(vc + cell * v_row + (size_t)hk * v_head, lane, D, vn);
    };
    if (lo + warp < hi) load_row(lo + warp);
    for (int c = lo + warp; c < hi; c += ATTN_WARPS) {
#pragma unroll
        for (int i = 0; i < NE; i++) { kf[i] = kn[i]; vf[i] = vn[i]; }
        if (c + ATTN_WARPS < hi) load_row(c + ATTN_WARPS);
        float sc[HG];
#pragma unroll
        for (int g = 0; g < HG; g++) {
            float dot = 0.0f;
#pragma unroll
            for (int i = 0; i < NE; i++) dot = fmaf(qv[g][i], kf[i], dot);
            sc[g] = dot;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
#pragma unroll
            for (int g = 0; g < HG; g++) sc[g] += __shfl_xor_sync(0xFFFFFFFFu, sc[g], o);
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
            for (int i = 0; i < NE; i++) acc[g][i] = __fadd_rn(acc[g][i], __fmul_rn(p, vf[i]));
        }
    }
    if (lane == 0)
#pragma unroll
        for (int g = 0; g < HG; g++) { sm_m[g][warp] = m[g]; sm_l[g][warp] = l[g]; }
#pragma unroll
    for (int g = 0; g < HG; g++) {
        if (g) __syncthreads(); /* the last head's merge has read sm_acc */
#pragma unroll
        for (int i = 0; i < NE; i++) {
            const int e = attn_elem<NE, VEC>(lane, i);
            if (e < D) sm_acc[warp][e] = acc[g][i];
        }
        __syncthreads();
        float M = sm_m[g][0];
        for (int w = 1; w < ATTN_WARPS; w++) M = fmaxf(M, sm_m[g][w]);
        float f[ATTN_WARPS], L = 0.0f;
        for (int w = 0; w < ATTN_WARPS; w++) {
            f[w] = sm_m[g][w] == -INFINITY ? 0.0f : expf(sm_m[g][w] - M);
            L += sm_l[g][w] * f[w];
        }
        const int h = h0 + g;
        float *o = out + (size_t)t * n_head * D + (size_t)h * D;
        if (n_split == 1) {
            const float inv = L > 0.0f ? 1.0f / L : 0.0f;
            for (int e = threadIdx.x; e < D; e += blockDim.x) {
                float a = 0.0f;
                for (int w = 0; w < ATTN_WARPS; w++) a += sm_acc[w][e] * f[w];
                o[e] = a * inv;
            }
        } else { /* HG 1 */
            float *ph = part + ((size_t)t * n_head + h) * n_split * (D + 2), *pp = ph + (size_t)s * (D + 2);
            if (threadIdx.x == 0) { pp[0] = M; pp[1] = L; }
            for (int e = threadIdx.x; e < D; e += blockDim.x) {
                float a = 0.0f;
                for (int w = 0; w < ATTN_WARPS; w++) a += sm_acc[w][e] * f[w];
                pp[2 + e] = a;
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

/* One launch: n_tok tokens (<= ATTN_SMALL_BATCH where n_split > 1), n_split slices each. */
static void attention_launch(struct cuda_ctx *c, const float *q, int q_stride, int q_head_stride,
                             const struct kv_view *kv, const int32_t *cell0, const int32_t *n_ctx, int n_tok,
                             int n_head, float scale, float *out, int n_split) {
    const int n_head_kv = kv->n_head_kv, head_dim = kv->head_dim;
    const uint8_t *k_cache = (const uint8_t *)kv->k, *v_cache = (const uint8_t *)kv->v;
    const size_t k_head = ggml_row_size(kv->k_type, head_dim), v_head = ggml_row_size(kv->v_type, head_dim);
    float *part = NULL;
    unsigned *count = NULL;
    /* sized for the largest small batch at once: growing it later makes recorded graphs stale */
    if (n_split > 1) {
        part = (float *)cuda_scratch(c, &c->attn_part, &c->attn_part_size,
                                     sizeof(float) * (size_t)ATTN_SMALL_BATCH * n_head * n_split * (head_dim + 2));
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
#define ATTN_LAUNCH_G(TK, TV, NE, VEC, HG)                                                                     \
    cuda_launch(c, grid, ATTN_WARPS * 32, attn_kernel<TK, TV, NE, VEC, HG>, q, q_stride, q_head_stride, k_cache, \
                v_cache, kv->k_row_bytes, kv->v_row_bytes, k_head, v_head, cell0, n_ctx, n_head, n_head_kv,     \
                head_dim, scale, out, part, count)
#define ATTN_LAUNCH(TK, TV, NE, VEC)                                                            \
    do {                                                                                        \
        /* (heads past 256 group by 2 at most: no 4-head instance of the wide kernel) */        \
        if (NE == 8 && hg == 4) ATTN_LAUNCH_G(TK, TV, NE, VEC, (NE == 8 ? 4 : 2));              \
        else if (hg >= 2) ATTN_LAUNCH_G(TK, TV, NE, VEC, 2);                                    \
        else ATTN_LAUNCH_G(TK, TV, NE, VEC, 1);                                                 \
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
#undef ATTN_LAUNCH_G
}

/* A prompt's tokens past ATTN_SMALL_BATCH: one slice each, one launch. Any other batch: every
 * token in ATTN_SPLIT slices, in launches of ATTN_SMALL_BATCH tokens, so that its result is
 * what it gives in any batch (a verify row equals the decode row it replaces). */
void cuda_attention(struct backend *be, const float *q, int q_stride, int q_head_stride, const struct kv_view *kv,
                    const int32_t *cell0, const int32_t *n_ctx, int n_tok, int n_head, float scale, float *out) {
    struct cuda_ctx *c = cuda_enter(be);
    if (n_tok < 1 || n_head < 1) return;
    if (kv->head_dim > ATTN_MAX_D || kv->n_head_kv < 1 || n_head % kv->n_head_kv) abort(); /* model loading rejects these */
    if (c->prompt && n_tok > ATTN_SMALL_BATCH) {
        attention_launch(c, q, q_stride, q_head_stride, kv, cell0, n_ctx, n_tok, n_head, scale, out, 1);
        return;
    }
    for (int t0 = 0; t0 < n_tok; t0 += ATTN_SMALL_BATCH)
        attention_launch(c, q + (size_t)t0 * q_stride, q_stride, q_head_stride, kv, cell0 + t0, n_ctx + t0,
                         COTI_MIN(ATTN_SMALL_BATCH, n_tok - t0), n_head, scale, out + (size_t)t0 * n_head * kv->head_dim,
                         ATTN_SPLIT);
}

CUDA_TRACE_TU(attention)
