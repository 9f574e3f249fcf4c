/* moe.cu — the mixture-of-experts ops: routing (moe_route), the routed experts' matmul
 * (matmul_id) and the weighted sum with the gated shared expert (moe_sum). The chosen ids
 * stay on the device: matmul_id's blocks find their expert and its slots themselves, and only
 * chosen experts get blocks. Quantized experts are dotted with the inputs converted to the
 * weight's activation format, as the matvec and the CPU do. */
#include "matmul.cuh"
#include "dequant.cuh"

/* ---- moe_route: a warp per token (at most BACKEND_MOE_MAX_EXPERTS experts) ------------------- */

#define MOE_ROUTE_PER_LANE (BACKEND_MOE_MAX_EXPERTS / 32)

/* The CPU's arithmetic: f32 exponentials of l - max, their sum in double (here per lane, then
 * across the warp: the order differs, the double sum does not round to another f32 reciprocal
 * in practice), p = e · (1/sum); the top n_used by repeated selection (the larger p, the lower
 * expert on ties), their p over their f32 sum in selection order. */
__global__ void moe_route_kernel(const float *__restrict__ logits, int n_tok, int n_expert, int n_used,
                                 int32_t *__restrict__ ids, float *__restrict__ wts) {
    cuda_pdl_begin();
    const int t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (t >= n_tok) return;
    const float *l = logits + (size_t)t * n_expert;
    float p[MOE_ROUTE_PER_LANE];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < MOE_ROUTE_PER_LANE; i++) {
        const int e = lane + 32 * i;
        p[i] = e < n_expert ? l[e] : -INFINITY;
        mx = fmaxf(mx, p[i]);
    }
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, o));
    double sum = 0.0;
#pragma unroll
    for (int i = 0; i < MOE_ROUTE_PER_LANE; i++)
        if (lane + 32 * i < n_expert) sum += (p[i] = expf(p[i] - mx));
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
    const float inv = (float)(1.0 / sum);
#pragma unroll
    for (int i = 0; i < MOE_ROUTE_PER_LANE; i++) p[i] = lane + 32 * i < n_expert ? p[i] * inv : -2.0f;
    float wsum = 0.0f;
    float *wt = wts + (size_t)t * n_used;
    for (int k = 0; k < n_used; k++) {
        float bp = -3.0f;
        int be = 1 << 30;
#pragma unroll
        for (int i = 0; i < MOE_ROUTE_PER_LANE; i++)
            if (p[i] > bp) { bp = p[i]; be = lane + 32 * i; }
        for (int o = 16; o > 0; o >>= 1) {
            const float op = __shfl_xor_sync(0xFFFFFFFFu, bp, o);
            const int oe = __shfl_xor_sync(0xFFFFFFFFu, be, o);
            if (op > bp || (op == bp && oe < be)) { bp = op; be = oe; }
        }
#pragma unroll
        for (int i = 0; i < MOE_ROUTE_PER_LANE; i++)
            if (lane + 32 * i == be) p[i] = -1.0f; /* taken */
        wsum += bp;
        if (lane == 0) {
            ids[(size_t)t * n_used + k] = be;
            wt[k] = bp;
        }
    }
    wsum = fmaxf(wsum, 6.103515625e-5f);
    __syncwarp();
    for (int k = lane; k < n_used; k += 32) wt[k] = wt[k] / wsum;
}

void cuda_moe_route(struct backend *be, const float *logits, int n_tok, int n_expert, int n_used, int32_t *ids,
                    float *wts) {
    struct cuda_ctx *c = cuda_enter(be);
    if (n_tok < 1 || n_expert > BACKEND_MOE_MAX_EXPERTS || n_used > n_expert) return;
    cuda_launch(c, dim3(cuda_cdiv(n_tok, 4)), dim3(128), moe_route_kernel, logits, n_tok, n_expert, n_used, ids, wts);
}

/* ---- matmul_id ------------------------------------------------------------------------------ */

#define MOE_WARPS 8                /* a block is (chosen expert, 8 x rows a warp) */
/* Lanes a weight row takes: half a warp where the row is at most 16 units (a warp then dots two
 * rows at once), else the whole warp. */
static __host__ __device__ __forceinline__ int moe_lanes_per_row(int n_units) { return n_units <= 16 ? 16 : 32; }
/* Rows a warp takes, a multiple of the rows it dots at once: 2, or 4 on half-warps (the
 * 35B-A3B's down, 512 wide, then runs in 512 blocks instead of 1024, 1.3 waves of 3 per SM
 * instead of 2.6, each block staging its slots' inputs once for twice the rows). */
static int moe_rows_per_warp(int n_units) { return moe_lanes_per_row(n_units) == 16 ? 4 : 2; }
#define MOE_SLOTS_PER_PASS 8       /* slots a warp dots while it decodes a row once */
#define MOE_MAX_SLOT_LIST 2048     /* a block's slot list in shared memory, refilled past this */

/* The input row of slot s: its token's row, or its own row when slots have their own inputs
 * (the down projection's swiglu of the slot's gate and up). */
__device__ __forceinline__ const float *moe_src(const float *x, int r, bool per_slot, int n_used, int tok_stride,
                                                int slot_stride) {
    return per_slot ? x + (size_t)(r / n_used) * tok_stride + (size_t)(r % n_used) * slot_stride
                    : x + (size_t)r * tok_stride;
}
/* element e of input row p (n wide): a GLU forms act(gate) · up as the swiglu / geglu op does */
__device__ __forceinline__ float moe_val(const float *p, int n, int e, int glu) {
    return e >= n                ? 0.0f
           : glu == MOE_GLU_NONE ? p[e]
           : glu == MOE_GLU_SWIGLU ? __fmul_rn(cuda_silu(p[e]), p[n + e])
                                   : cuda_geglu(p[e], p[n + e]);
}

/* The input rows converted to the weight's activation format (Q8_0 / Q8_1), once per call:
 * the codes of quant.c's reference rule, as the CPU converts each slot's row. */
__global__ void moe_q8_rows_kernel(const float *__restrict__ x, int n, int n_rows, bool per_slot, int n_used,
                                   int tok_stride, int slot_stride, int glu, int stride, int8_t *__restrict__ q,
                                   float *__restrict__ d, float *__restrict__ s) {
    cuda_pdl_begin();
    q8_rows(
        [&](int r, int e0, float (&v)[4]) {
            const float *p = moe_src(x, r, per_slot, n_used, tok_stride, slot_stride);
#pragma unroll
            for (int k = 0; k < 4; k++) v[k] = moe_val(p, n, e0 + k, glu);
        },
        n, n_rows, stride, blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x, q, d, s);
}

/* The same to Q8_K (the K-quants): a warp per 256-block. */
__global__ void moe_q8K_rows_kernel(const float *__restrict__ x, int n, int n_rows, bool per_slot, int n_used,
                                    int tok_stride, int slot_stride, int glu, int stride, int8_t *__restrict__ q,
                                    float *__restrict__ d, int16_t *__restrict__ bs) {
    cuda_pdl_begin();
    const int nb = stride / 256, gw = blockIdx.x * 8 + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (gw >= n_rows * nb) return;
    const int r = gw / nb, b = gw % nb;
    const float *p = moe_src(x, r, per_slot, n_used, tok_stride, slot_stride);
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; i++) v[i] = moe_val(p, n, 256 * b + 8 * lane + i, glu);
    q8K_block_vals(v, lane, q + (size_t)r * stride + 256 * b, d + (size_t)r * nb + b, bs + (size_t)r * (stride / 16) + 16 * b);
}

/* The a-th smallest expert that some slot chose, or -1 past the last: a bitmap of the chosen
 * experts, then warp 0 finds the word and the bit by a scan of the words' counts. Every thread
 * of the block calls; the answer is the block's. */
__device__ int moe_nth_chosen(const int32_t *__restrict__ ids, int n_slots, int E, int a) {
    __shared__ uint32_t bits[BACKEND_MOE_MAX_EXPERTS / 32];
    __shared__ int found;
    const int nw = (E + 31) / 32, lane = threadIdx.x % 32;
    for (int i = threadIdx.x; i < nw; i += blockDim.x) bits[i] = 0;
    __syncthreads();
    for (int s = threadIdx.x; s < n_slots; s += blockDim.x) {
        const int e = ids[s];
        if (e >= 0 && e < E) atomicOr(&bits[e / 32], 1u << (e % 32));
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        int res = -1, base = 0;
        for (int w0 = 0; w0 < nw && res < 0; w0 += 32) {
            const int wi = w0 + lane;
            uint32_t v = wi < nw ? bits[wi] : 0u;
            const int cnt = __popc(v);
            int inc = cnt;
            for (int o = 1; o < 32; o <<= 1) {
                const int t = __shfl_up_sync(0xFFFFFFFFu, inc, o);
                if (lane >= o) inc += t;
            }
            const int k = a - base - (inc - cnt);
            int mine = -1;
            if (k >= 0 && k < cnt) {
                for (int i = 0; i < k; i++) v &= v - 1;
                mine = 32 * wi + __ffs((int)v) - 1;
            }
            const unsigned hit = __ballot_sync(0xFFFFFFFFu, mine >= 0);
            if (hit) res = __shfl_sync(0xFFFFFFFFu, mine, __ffs((int)hit) - 1);
            base += __shfl_sync(0xFFFFFFFFu, inc, 31);
        }
        if (lane == 0) found = res;
    }
    __syncthreads();
    return found;
}

/* The slots in [base, base + MOE_MAX_SLOT_LIST) that chose expert e, into the block's shared
 * list (in any order: a slot's output does not depend on the others); returns their count.
 * Every thread of the block calls. */
__device__ __forceinline__ int moe_slots_of(const int32_t *__restrict__ ids, int base, int n_slots, int e, int *list,
                                            int *n_list) {
    __syncthreads();
    if (threadIdx.x == 0) *n_list = 0;
    __syncthreads();
    const int end = min(n_slots, base + MOE_MAX_SLOT_LIST);
    for (int s = base + threadIdx.x; s < end; s += blockDim.x)
        if (ids[s] == e) list[atomicAdd(n_list, 1)] = s;
    __syncthreads();
    return *n_list;
}

/* The input rows of slots list[0 .. nj) into the block's shared stage xs (load_xs's layout for
 * MOE_SLOTS_PER_PASS rows), by cp.async; every thread of the block calls. */
template <int XF>
__device__ __forceinline__ void moe_stage_x(const xact &x, const xact &xs, const int *list, int nj, bool per_slot,
                                            int n_used) {
    const int S = x.stride, nq = S / 16, nd = XF == XF_Q8_K ? S / 256 : S / 32;
    const int ne = XF == XF_Q8_0 ? 0 : S / 32; /* 4-byte words of s (Q8_1) or bs (Q8_K) */
    for (int i = threadIdx.x; i < nj * nq; i += blockDim.x) {
        const int j = i / nq, r = per_slot ? list[j] : list[j] / n_used;
        cp_async16((int8_t *)xs.q + (size_t)j * S + 16 * (i % nq), (const int8_t *)x.q + (size_t)r * S + 16 * (i % nq));
    }
    for (int i = threadIdx.x; i < nj * (nd + ne); i += blockDim.x) {
        const int j = i / (nd + ne), k = i % (nd + ne), r = per_slot ? list[j] : list[j] / n_used;
        if (k < nd) cp_async4((float *)xs.d + (size_t)j * nd + k, x.d + (size_t)r * nd + k);
        else if (XF == XF_Q8_1) cp_async4((float *)xs.s + (size_t)j * ne + k - nd, x.s + (size_t)r * ne + k - nd);
        else cp_async4((int32_t *)xs.bs + (size_t)j * ne + k - nd, (const int32_t *)x.bs + (size_t)r * ne + k - nd);
    }
    cp_async_commit();
}

/* Block (the blockIdx.x-th chosen expert e, rows [8·rpw·blockIdx.y, +8·rpw)): the slots that
 * chose e, then per row (a warp has rpw) and per pass of up to 8 slots, each 32-element unit decoded
 * once and dotted with the slots' codes (dp4a, exact integer sums, the matvec's combine). The
 * rows and each pass's input codes are copied into shared memory asynchronously, the rows
 * while the block lists its slots, so that the dot products wait on no global load: with the
 * codes read from global memory in the dot loop, every row paid that latency in turn and the
 * 35B-A3B's expert launches took ~17 us each at decode whatever their rows per warp (H100).
 * A slot's sum is over the row in one fixed order (lane-strided units, then the butterfly over
 * the row's lanes), whatever the other slots: a verify row equals its decode row; against the CPU
 * it differs by f32 reassociation alone. At most 80 registers, so that three blocks share an
 * SM (148 without the bound: one block, 8 warps per SM, and the expert reads ran at ~150 GB/s). */
template <int T>
__global__ void __launch_bounds__(32 * MOE_WARPS, 3)
matmul_id_q_kernel(const uint8_t *__restrict__ w, size_t rb, int rstride, int rows, int n_units, int E,
                   const int32_t *__restrict__ ids, int n_slots, int n_used, bool per_slot, const xact x,
                   float *__restrict__ y, int y_stride, int rpw) {
    typedef qt<T> Q;
    extern __shared__ __align__(16) uint8_t moe_rows[];
    __shared__ int list[MOE_MAX_SLOT_LIST];
    __shared__ int n_list;
    cuda_pdl_begin();
    const int e = moe_nth_chosen(ids, n_slots, E, blockIdx.x);
    if (e < 0) return; /* the block's answer: every thread leaves */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int r0 = (blockIdx.y * MOE_WARPS + warp) * rpw;
    uint8_t *sm0 = moe_rows + (size_t)warp * rpw * rstride;
    for (int q = 0; q < rpw && r0 + q < rows; q++) {
        const uint8_t *row = w + ((size_t)e * rows + r0 + q) * rb;
        uint8_t *sm = sm0 + (size_t)q * rstride;
        if ((rb & 15) == 0 && ((uintptr_t)w & 15) == 0)
            for (int i = lane; i < (int)(rb / 16); i += 32) cp_async16(sm + 16 * i, row + 16 * i);
        else if ((rb & 3) == 0 && ((uintptr_t)w & 3) == 0)
            for (int i = lane; i < (int)(rb / 4); i += 32) cp_async4(sm + 4 * i, row + 4 * i);
        else
            for (int i = lane; i < (int)rb; i += 32) sm[i] = row[i];
        if (lane < 4) ((uint32_t *)(sm + rstride - 16))[lane] = 0; /* the decoders read a word past */
    }
    cp_async_commit();
    const xs_parts xp = xs_layout(moe_rows + (size_t)MOE_WARPS * rpw * rstride, Q::XF,
                                  MOE_SLOTS_PER_PASS, x.stride);
    const xact xs = {xp.q, xp.d, Q::XF == XF_Q8_1 ? (const float *)xp.e : NULL,
                     Q::XF == XF_Q8_K ? (const int16_t *)xp.e : NULL, x.stride};
    for (int base = 0; base < n_slots; base += MOE_MAX_SLOT_LIST) {
        const int n = moe_slots_of(ids, base, n_slots, e, list, &n_list);
        for (int j0 = 0; j0 < n; j0 += MOE_SLOTS_PER_PASS) {
            const int nj = min(MOE_SLOTS_PER_PASS, n - j0);
            moe_stage_x<Q::XF>(x, xs, list + j0, nj, per_slot, n_used);
            cp_async_wait0();
            __syncthreads();
            /* rows of at most 16 units (the 35B-A3B's down: 512 wide) take half a warp each, two
             * of a warp's rows at a time; wider rows take the whole warp in turn */
            const int lpr = moe_lanes_per_row(n_units);
            for (int q0 = 0; q0 < rpw; q0 += 32 / lpr) {
                const int q = q0 + lane / lpr, ul = lane % lpr;
                const bool live = r0 + q < rows; /* every lane stays for the shuffles */
                const uint8_t *sm = sm0 + (size_t)q * rstride;
                float acc[MOE_SLOTS_PER_PASS];
#pragma unroll
                for (int j = 0; j < MOE_SLOTS_PER_PASS; j++) acc[j] = 0.0f;
                for (int u = ul; live && u < n_units; u += lpr) {
                    uint32_t c[8];
                    usc sc;
                    Q::decode(sm, (u / Q::UPB) * Q::BB, u % Q::UPB, c, sc);
#pragma unroll
                    for (int j = 0; j < MOE_SLOTS_PER_PASS; j++) {
                        if (j < nj) {
                            const int4 *xa = (const int4 *)((const int8_t *)xs.q + (size_t)j * xs.stride + 32 * u);
                            const int lo = dp4a_half(c, xa[0]), hi = dp4a_half(c + 4, xa[1]);
                            acc[j] += Q::combine(sc, lo, hi, load_xs<Q::XF, true>(xs, (size_t)j, u));
                        }
                    }
                }
#pragma unroll
                for (int j = 0; j < MOE_SLOTS_PER_PASS; j++) {
                    if (j < nj) { /* nj is the block's: the reduction is uniform */
                        float v = acc[j];
                        for (int o = lpr / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
                        if (live && ul == 0) y[(size_t)list[j0 + j] * y_stride + r0 + q] = v;
                    }
                }
            }
            __syncthreads(); /* the stage is refilled by the next pass */
        }
    }
    cp_async_wait0(); /* (a block none of whose listed slots remained: its rows' copies) */
}

/* Float weights (F32 / F16 / BF16): a block per (expert, 32 rows), each row dequantized
 * exactly and dotted with the f32 inputs, up to 8 slots per read of the row. */
#define MOE_F_ROWS_PER_BLOCK 32
template <int T>
__global__ void __launch_bounds__(32 * MOE_WARPS)
matmul_id_float_kernel(const uint8_t *__restrict__ w, size_t rb, int rows, int n_in, const int32_t *__restrict__ ids,
                       int n_slots, int n_used, const float *__restrict__ x, int tok_stride, int slot_stride, int glu,
                       float *__restrict__ y, int y_stride) {
    cuda_pdl_begin();
    __shared__ int list[MOE_MAX_SLOT_LIST];
    __shared__ int n_list;
    const int e = blockIdx.x, r0 = blockIdx.y * MOE_F_ROWS_PER_BLOCK, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int base = 0; base < n_slots; base += MOE_MAX_SLOT_LIST) {
        const int n = moe_slots_of(ids, base, n_slots, e, list, &n_list);
        for (int r = r0 + warp; r < min(r0 + MOE_F_ROWS_PER_BLOCK, rows); r += MOE_WARPS) {
            const uint8_t *row = w + ((size_t)e * rows + r) * rb;
            for (int j0 = 0; j0 < n; j0 += MOE_SLOTS_PER_PASS) {
                const int nj = min(MOE_SLOTS_PER_PASS, n - j0);
                const float *xs[MOE_SLOTS_PER_PASS];
                float acc[MOE_SLOTS_PER_PASS];
                for (int j = 0; j < MOE_SLOTS_PER_PASS; j++) {
                    const int s = list[j0 + min(j, nj - 1)];
                    xs[j] = x + (size_t)(s / n_used) * tok_stride + (size_t)(s % n_used) * slot_stride;
                    acc[j] = 0.0f;
                }
                for (int i = lane; i < n_in; i += 32) {
                    const float wv = deq<T>(row, i);
#pragma unroll
                    for (int j = 0; j < MOE_SLOTS_PER_PASS; j++) {
                        if (j >= nj) break;
                        const float xv = moe_val(xs[j], n_in, i, glu);
                        acc[j] = fmaf(wv, xv, acc[j]);
                    }
                }
                for (int j = 0; j < nj; j++) {
                    const float v = cuda_warp_sum(acc[j]);
                    if (lane == 0) y[(size_t)list[j0 + j] * y_stride + r] = v;
                }
            }
        }
    }
}

typedef void (*matmul_id_fn)(struct cuda_ctx *c, const struct bweight *w, const struct matmul_id_in *in, int n_tok,
                             float *y);

template <int T>
static void matmul_id_launch(struct cuda_ctx *c, const struct bweight *w, const struct matmul_id_in *in, int n_tok,
                             float *y) {
    const int E = in->n_expert, rows = (int)(w->n_out / E), n = (int)w->n_in, n_slots = n_tok * in->n_used;
    if constexpr (T == GGML_TYPE_F32 || T == GGML_TYPE_F16 || T == GGML_TYPE_BF16) {
        const dim3 grid(E, cuda_cdiv(rows, MOE_F_ROWS_PER_BLOCK));
        cuda_launch(c, grid, dim3(32 * MOE_WARPS), matmul_id_float_kernel<T>, (const uint8_t *)w->data, w->row_bytes,
                    rows, n, in->ids, n_slots, in->n_used, in->x, in->tok_stride, in->slot_stride, (int)in->glu, y,
                    in->y_stride);
    } else {
        const int f = qt<T>::XF, stride = x_stride(n);
        const bool per_slot = in->slot_stride != 0;
        const int n_rows = per_slot ? n_slots : n_tok;
        const xact xa = converted_scratch(c, f, n_rows, stride);
        if (f == XF_Q8_K)
            cuda_launch(c, cuda_cdiv((int64_t)n_rows * (stride / 256), 8), 256, moe_q8K_rows_kernel, in->x, n, n_rows,
                        per_slot, in->n_used, in->tok_stride, in->slot_stride, (int)in->glu, stride, (int8_t *)xa.q,
                        (float *)xa.d, (int16_t *)xa.bs);
        else
            cuda_launch(c, cuda_cdiv((int64_t)n_rows * (stride / 32) * 8, 256), 256, moe_q8_rows_kernel, in->x, n,
                        n_rows, per_slot, in->n_used, in->tok_stride, in->slot_stride, (int)in->glu, stride,
                        (int8_t *)xa.q, (float *)xa.d, f == XF_Q8_1 ? (float *)xa.s : (float *)NULL);
        const int rstride = (int)((w->row_bytes + 15) & ~(size_t)15) + 16;
        const int rpw = moe_rows_per_warp(n / 32);
        const size_t smem = (size_t)MOE_WARPS * rpw * rstride + xs_bytes(f, MOE_SLOTS_PER_PASS, stride);
        if (smem > 48 * 1024)
            CUDA_CHECK(cudaFuncSetAttribute(matmul_id_q_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        const dim3 grid(min(E, n_slots), cuda_cdiv(rows, MOE_WARPS * rpw));
        cuda_launch_smem(c, grid, dim3(32 * MOE_WARPS), smem, matmul_id_q_kernel<T>, (const uint8_t *)w->data,
                         w->row_bytes, rstride, rows, n / 32, E, in->ids, n_slots, in->n_used, per_slot, xa, y,
                         in->y_stride, rpw);
    }
}

#define MOE_TYPE(T) matmul_id_launch<T>,
static const matmul_id_fn matmul_id_types[] = {CUDA_MM_TYPES(MOE_TYPE)};

void cuda_matmul_id(struct backend *be, const struct bweight *w, const struct matmul_id_in *in, int n_tok, float *y) {
    struct cuda_ctx *c = cuda_enter(be);
    if (n_tok < 1 || in->n_expert < 1 || in->n_used < 1 || in->n_expert > BACKEND_MOE_MAX_EXPERTS) return;
    const int slot = cuda_mm_slot(w->type);
    if (slot < 0) { /* weight_init refused it: a caller bug */
        fprintf(stderr, "cuda: matmul_id on a weight of unsupported type %d\n", (int)w->type);
        abort();
    }
    matmul_id_types[slot](c, w, in, n_tok, y);
}

/* ---- moe_sum: the CPU's order (slots in turn, each scaled then weighted; the shared expert) -- */

__global__ void moe_sum_kernel(const float *y, const float *wts, const int32_t *ids, const float *exp_scale, int n_used,
                               int dim, const float *shared, const float *gate, float *out) {
    cuda_pdl_begin();
    const int t = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= dim) return;
    const float *yt = y + (size_t)t * n_used * dim, *wt = wts + (size_t)t * n_used;
    float o = 0.0f;
    for (int k = 0; k < n_used; k++) {
        float v = yt[(size_t)k * dim + i];
        if (exp_scale) v = __fmul_rn(v, exp_scale[ids[(size_t)t * n_used + k]]);
        v = __fmul_rn(v, wt[k]);
        o = k ? __fadd_rn(o, v) : v;
    }
    if (shared) o = __fadd_rn(o, __fmul_rn(shared[(size_t)t * dim + i], cuda_sigmoid(gate[t])));
    out[(size_t)t * dim + i] = o;
}

void cuda_moe_sum(struct backend *be, const float *y, const float *wts, const int32_t *ids, const float *exp_scale,
                  int n_tok, int n_used, int dim, const float *shared, const float *gate, float *out) {
    struct cuda_ctx *c = cuda_enter(be);
    if (n_tok < 1) return;
    cuda_launch(c, dim3(cuda_cdiv(dim, 256), n_tok), dim3(256), moe_sum_kernel, y, wts, ids, exp_scale, n_used, dim,
                shared, gate, out);
}

CUDA_TRACE_TU(moe)
