/* ops.cu — norms, elementwise ops, rope, KV store and argmax on the device.
 *
 * Numerics follow backend_cpu.c operation by operation (non-contracted multiplies where the CPU
 * rounds twice); what differs: Σx² of a norm is accumulated in double in another order (the
 * f32 scale then matches the CPU's except in rare last-bit cases), expf/sinf/cosf are CUDA's
 * (≤ 2 ulp) instead of glibc's, and argmax's softmax sum is taken in double in another order. */
#include "cuda_internal.cuh"
#include "kv_types.cuh"

#include <math.h>

/* ---- rmsnorm / rmsnorm_gated ---------------------------------------------------------------- */

/* TPR threads per row (32: a warp per row, 8 rows per block; 1024: a block per row). The first
 * CACHE elements of each thread are loaded together into registers and reused by the second
 * pass. A decode step's norm is one block on an idle GPU, so its time is latency: as the 9B
 * model's residual norm, 1024 threads with 4 loads each ran the step 8% faster than 256 threads
 * with 16 (H200, 281 vs 260 tok/s; the residual norms are norm_rows_kernel's now).
 * z, if given, gates the output with silu(z) (z rows have y's stride). In place (y == x) is
 * safe: a row is read whole before it is written. ADD: the normed value is added to y's element
 * and the sum scaled by ys_scale (rmsnorm_add; y must not overlap x). */
template <int TPR, int CACHE, bool ADD = false>
__global__ void __launch_bounds__(1024) rmsnorm_kernel(const float *x, int xs, const float *__restrict__ w,
                                                       int n_rows, int dim, float eps, float *y, int ys,
                                                       const float *z, float y_scale) {
    cuda_pdl_begin();
    const int row = blockIdx.x * (blockDim.x / TPR) + threadIdx.x / TPR, tid = threadIdx.x % TPR;
    if (row >= n_rows) return;
    const float *xr = x + (size_t)row * xs;
    float c[CACHE];
#pragma unroll
    for (int k = 0; k < CACHE; k++) {
        const int i = tid + TPR * k;
        c[k] = i < dim ? xr[i] : 0.0f;
    }
    double sum = 0.0;
#pragma unroll
    for (int k = 0; k < CACHE; k++) sum += (double)c[k] * c[k];
    for (int i = tid + TPR * CACHE; i < dim; i += TPR) sum += (double)xr[i] * xr[i];
    sum = cuda_warp_sum_d(sum);
    if constexpr (TPR > 32) {
        __shared__ double part[TPR / 32];
        if (tid % 32 == 0) part[tid / 32] = sum;
        __syncthreads();
        sum = 0.0;
        for (int i = 0; i < TPR / 32; i++) sum += part[i];
    }
    const float s = cuda_rms_inv(sum, dim, eps);
    float *yr = y + (size_t)row * ys;
    const float *zr = z ? z + (size_t)row * ys : NULL;
#pragma unroll
    for (int k = 0; k < CACHE; k++) {
        const int i = tid + TPR * k;
        if (i < dim) {
            float v = __fmul_rn(__fmul_rn(c[k], s), w[i]);
            if (zr) v = __fmul_rn(v, cuda_silu(zr[i]));
            yr[i] = ADD ? __fmul_rn(__fadd_rn(yr[i], v), y_scale) : v;
        }
    }
    for (int i = tid + TPR * CACHE; i < dim; i += TPR) {
        float v = __fmul_rn(__fmul_rn(xr[i], s), w[i]);
        if (zr) v = __fmul_rn(v, cuda_silu(zr[i]));
        yr[i] = ADD ? __fmul_rn(__fadd_rn(yr[i], v), y_scale) : v;
    }
}

static void rmsnorm_launch(struct cuda_ctx *c, const float *x, int xs, const float *w, int n_rows, int dim,
                           float eps, float *y, int ys, const float *z) {
    if (n_rows < 1) return;
    if (dim <= 1024) cuda_launch(c, cuda_cdiv(n_rows, 8), 256, rmsnorm_kernel<32, 8>, x, xs, w, n_rows, dim, eps, y, ys, z, 1.0f);
    else cuda_launch(c, n_rows, 1024, rmsnorm_kernel<1024, 4>, x, xs, w, n_rows, dim, eps, y, ys, z, 1.0f);
}

void cuda_rmsnorm(struct backend *be, const float *x, int x_stride, const float *w, int n_rows,
                  int dim, float eps, float *y, int y_stride) {
    rmsnorm_launch(cuda_enter(be), x, x_stride, w, n_rows, dim, eps, y, y_stride, NULL);
}

/* The same norm (and sum order) as cuda_rmsnorm, its result added into x and scaled. */
void cuda_rmsnorm_add(struct backend *be, float *x, const float *y, const float *w, int n_rows, int dim, float eps,
                      float s) {
    struct cuda_ctx *c = cuda_enter(be);
    if (n_rows < 1) return;
    if (dim <= 1024)
        cuda_launch(c, cuda_cdiv(n_rows, 8), 256, rmsnorm_kernel<32, 8, true>, y, dim, w, n_rows, dim, eps, x, dim,
                    (const float *)NULL, s);
    else cuda_launch(c, n_rows, 1024, rmsnorm_kernel<1024, 4, true>, y, dim, w, n_rows, dim, eps, x, dim, (const float *)NULL, s);
}

/* One block per row; the same sum of squares as a norm fused into a matvec (cuda_row_sumsq). */
__global__ void __launch_bounds__(CUDA_NORM_THREADS)
norm_rows_kernel(const float *x, const float *m, float *x_out, const float *__restrict__ w, int dim, float eps, float *y) {
    __shared__ double red[CUDA_NORM_THREADS / 32];
    cuda_pdl_begin();
    const size_t o = (size_t)blockIdx.x * dim;
    const float *xr = x + o, *mr = m ? m + o : NULL;
    auto val = [&](int e) { return mr ? xr[e] + mr[e] : xr[e]; };
    const bool vec = dim % 4 == 0 && ((uintptr_t)x & 15) == 0 && ((uintptr_t)m & 15) == 0;
    const double ss = cuda_row_sumsq([&](int g, float (&v)[8]) { cuda_group8(xr, mr, dim, vec, g, v); }, dim, red);
    const float s = cuda_rms_inv(ss, dim, eps);
    for (int e = threadIdx.x; e < dim; e += CUDA_NORM_THREADS) {
        const float v = val(e); /* read before x_out (maybe x) is written, by this thread only */
        if (mr) x_out[o + e] = v;
        y[o + e] = __fmul_rn(__fmul_rn(v, s), w[e]);
    }
}

void cuda_norm_rows(struct cuda_ctx *c, const float *x, const float *m, float *x_out, const float *w, int n_rows,
                    int dim, float eps, float *y) {
    if (n_rows < 1) return;
    cuda_launch(c, n_rows, CUDA_NORM_THREADS, norm_rows_kernel, x, m, x_out, w, dim, eps, y);
}

void cuda_add_rmsnorm(struct backend *be, float *x, const float *m, const float *w, int n_rows, int dim,
                      float eps, float *y) {
    cuda_norm_rows(cuda_enter(be), x, m, x, w, n_rows, dim, eps, y);
}

void cuda_rmsnorm_gated(struct backend *be, const float *x, const float *w, const float *z,
                        int n_rows, int dim, float eps, float *y) {
    rmsnorm_launch(cuda_enter(be), x, dim, w, n_rows, dim, eps, y, dim, z);
}

/* ---- elementwise ------------------------------------------------------------------------------ */

static int elem_grid(struct cuda_ctx *c, int64_t n) {
    return (int)COTI_MAX((int64_t)1, COTI_MIN((n + 255) / 256, (int64_t)c->n_sm * 8));
}

__global__ void add_kernel(const float *a, const float *b, int64_t n, float *y) {
    cuda_pdl_begin();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = a[i] + b[i];
}

__global__ void swiglu_kernel(const float *g, const float *u, int64_t n, float *y) {
    cuda_pdl_begin();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __fmul_rn(cuda_silu(g[i]), u[i]);
}

__global__ void geglu_kernel(const float *g, const float *u, int64_t n, float *y) {
    cuda_pdl_begin();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = cuda_geglu(g[i], u[i]);
}

__global__ void scale_kernel(float *x, int64_t n, float s) {
    cuda_pdl_begin();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] = __fmul_rn(x[i], s);
}

__global__ void softcap_kernel(float *x, int64_t n, float c, float inv) {
    cuda_pdl_begin();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] = __fmul_rn(c, tanhf(__fmul_rn(x[i], inv)));
}

void cuda_geglu(struct backend *be, const float *g, const float *u, int64_t n, float *y) {
    struct cuda_ctx *c = cuda_enter(be);
    if (n < 1) return;
    cuda_launch(c, elem_grid(c, n), 256, geglu_kernel, g, u, n, y);
}

void cuda_scale(struct backend *be, float *x, int64_t n, float s) {
    struct cuda_ctx *c = cuda_enter(be);
    if (n < 1) return;
    cuda_launch(c, elem_grid(c, n), 256, scale_kernel, x, n, s);
}

void cuda_softcap(struct backend *be, float *x, int64_t n, float cap) {
    struct cuda_ctx *c = cuda_enter(be);
    if (n < 1) return;
    cuda_launch(c, elem_grid(c, n), 256, softcap_kernel, x, n, cap, 1.0f / cap);
}

/* One rank: nothing to sum (tp_attach refuses a CUDA backend, cuda_supports). */
void cuda_all_reduce(struct backend *be, float *x, int64_t n) {}

void cuda_add(struct backend *be, const float *a, const float *b, int64_t n, float *y) {
    struct cuda_ctx *c = cuda_enter(be);
    if (n < 1) return;
    cuda_launch(c, elem_grid(c, n), 256, add_kernel, a, b, n, y);
}

void cuda_swiglu(struct backend *be, const float *g, const float *u, int64_t n, float *y) {
    struct cuda_ctx *c = cuda_enter(be);
    if (n < 1) return;
    cuda_launch(c, elem_grid(c, n), 256, swiglu_kernel, g, u, n, y);
}

__global__ void mul_sigmoid_kernel(float *x, const float *gate, int n_tok, int n_head, int dim, int gs, int ghs) {
    cuda_pdl_begin();
    const int64_t n = (int64_t)n_tok * n_head * dim;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int e = (int)(i % dim);
        const int64_t th = i / dim;
        const int h = (int)(th % n_head);
        const int64_t t = th / n_head;
        x[i] = __fmul_rn(x[i], cuda_sigmoid(gate[t * gs + (int64_t)h * ghs + e]));
    }
}

void cuda_mul_sigmoid(struct backend *be, float *x, const float *gate, int n_tok, int n_head,
                      int dim, int gate_stride, int gate_head_stride) {
    struct cuda_ctx *c = cuda_enter(be);
    const int64_t n = (int64_t)n_tok * n_head * dim;
    if (n < 1) return;
    cuda_launch(c, elem_grid(c, n), 256, mul_sigmoid_kernel, x, gate, n_tok, n_head, dim, gate_stride, gate_head_stride);
}

/* ---- rope ---------------------------------------------------------------------------------------- */

#define ROPE_MAX_HALF 256

/* cos / sin of pair d's angle for d = tid, tid + n_threads, ... < half, by repeated
 * multiplication (theta_d = pos·scale^d rounded at every step, as the CPU forms them), divided
 * by freqs[d] when given. */
__device__ __forceinline__ void rope_angles(float pos, float theta_scale, int half, int tid, int n_threads,
                                            const float *__restrict__ freqs, float *cs, float *sn) {
    for (int d = tid; d < half; d += n_threads) {
        float theta = pos;
        for (int i = 0; i < d; i++) theta *= theta_scale;
        if (freqs) theta = __fdiv_rn(theta, freqs[d]);
        cs[d] = cosf(theta);
        sn[d] = sinf(theta);
    }
}

/* Rotate pair (v[d], v[d + half]) of a head by angle d. */
__device__ __forceinline__ void rope_pair(float *v, int d, int half, const float *cs, const float *sn) {
    const float a = v[d], b = v[d + half];
    v[d] = __fsub_rn(__fmul_rn(a, cs[d]), __fmul_rn(b, sn[d]));
    v[d + half] = __fadd_rn(__fmul_rn(a, sn[d]), __fmul_rn(b, cs[d]));
}

/* One block per token: the angles (rope_angles), then every head's pairs. */
__global__ void rope_kernel(float *x, int tok_stride, int n_head, int head_stride, int half,
                            const int32_t *__restrict__ pos, float theta_scale, const float *__restrict__ freqs) {
    __shared__ float cs[ROPE_MAX_HALF], sn[ROPE_MAX_HALF];
    cuda_pdl_begin();
    const int t = blockIdx.x;
    rope_angles((float)pos[t], theta_scale, half, threadIdx.x, blockDim.x, freqs, cs, sn);
    __syncthreads();
    for (int i = threadIdx.x; i < n_head * half; i += blockDim.x)
        rope_pair(x + (size_t)t * tok_stride + (size_t)(i / half) * head_stride, i % half, half, cs, sn);
}

void cuda_rope_neox(struct backend *be, float *x, int n_tok, int tok_stride, int n_head,
                    int head_stride, int n_rot, const int32_t *pos, float base, const float *freqs) {
    struct cuda_ctx *c = cuda_enter(be);
    const int half = n_rot / 2;
    if (n_tok < 1 || half < 1) return;
    if (half > ROPE_MAX_HALF) abort(); /* model loading rejects such files (head_dim <= 512) */
    const float theta_scale = powf(base, -2.0f / (float)n_rot); /* the host's powf, as the CPU's */
    cuda_launch(c, n_tok, 256, rope_kernel, x, tok_stride, n_head, head_stride, half, pos, theta_scale, freqs);
}

/* ---- attention inputs: q/k norms, rope, KV store in one launch ------------------------------------ */

/* A warp per (head, token), q heads first: the head's norm in place (cuda_warp_rms_inv, the
 * order of rmsnorm_kernel<32, ...>), the rotation of its first 2·half dims (rope_angles and
 * rope_pair, as rope_kernel), and for a k head the stores of its k and v rows (types TK, TV:
 * kv_store_head) into cache row cells[t] (and cells2[t]: a ring's second store). v_from_k: the v row is first a
 * copy of the k row as projected (K = V layers). Bit for bit the separate kernels and copies,
 * one launch instead of five to seven. */
template <int TK, int TV>
__global__ void __launch_bounds__(32)
attn_prep_kernel(float *q, int q_stride, int q_head_stride, const float *__restrict__ q_norm, float *k, int k_stride,
                 const float *__restrict__ k_norm, float *v, int v_stride, const float *__restrict__ v_norm, float eps,
                 int n_head, int D, int half, const int32_t *__restrict__ pos, float theta_scale,
                 const float *__restrict__ freqs, const int32_t *__restrict__ cells, const int32_t *__restrict__ cells2,
                 bool v_from_k, uint8_t *kc, uint8_t *vc, size_t k_row, size_t v_row, size_t k_head, size_t v_head) {
    __shared__ float cs[ROPE_MAX_HALF], sn[ROPE_MAX_HALF];
    cuda_pdl_begin();
    const int t = blockIdx.y, lane = threadIdx.x;
    const bool is_k = (int)blockIdx.x >= n_head;
    const int h = is_k ? blockIdx.x - n_head : blockIdx.x;
    float *row = is_k ? k + (size_t)t * k_stride + (size_t)h * D : q + (size_t)t * q_stride + (size_t)h * q_head_stride;
    const float *w = is_k ? k_norm : q_norm;
    if (is_k && v_from_k) {
        float *vr = v + (size_t)t * v_stride + (size_t)h * D;
        for (int i = lane; i < D; i += 32) vr[i] = row[i];
        __syncwarp();
    }
    rope_angles((float)pos[t], theta_scale, half, lane, 32, freqs, cs, sn);
    const float s = cuda_warp_rms_inv(row, D, eps, lane);
    for (int i = lane; i < D; i += 32) row[i] = __fmul_rn(__fmul_rn(row[i], s), w[i]);
    __syncwarp();
    for (int d = lane; d < half; d += 32) rope_pair(row, d, half, cs, sn);
    if (!is_k) return;
    __syncwarp();
    float *vr = v + (size_t)t * v_stride + (size_t)h * D;
    if (v_norm) {
        const float sv = cuda_warp_rms_inv(vr, D, eps, lane);
        for (int i = lane; i < D; i += 32) vr[i] = __fmul_rn(__fmul_rn(vr[i], sv), v_norm[i]);
        __syncwarp();
    }
    kv_store_head<TK>(kc + (size_t)cells[t] * k_row + (size_t)h * k_head, row, D, lane);
    kv_store_head<TV>(vc + (size_t)cells[t] * v_row + (size_t)h * v_head, vr, D, lane);
    if (!cells2) return;
    kv_store_head<TK>(kc + (size_t)cells2[t] * k_row + (size_t)h * k_head, row, D, lane);
    kv_store_head<TV>(vc + (size_t)cells2[t] * v_row + (size_t)h * v_head, vr, D, lane);
}

void cuda_attn_prep(struct backend *be, const struct attn_prep_in *in, int n_tok, const int32_t *pos, const int32_t *cells,
                    const struct kv_view *kv) {
    struct cuda_ctx *c = cuda_enter(be);
    const int n_head_kv = kv->n_head_kv, head_dim = kv->head_dim, n_head = in->n_head;
    const int half = in->n_rot / 2;
    if (n_tok < 1) return;
    if (half > ROPE_MAX_HALF) abort(); /* model loading rejects such files (head_dim <= 512) */
    const float theta_scale = powf(in->rope_base, -2.0f / (float)in->n_rot); /* as cuda_rope_neox forms it */
    const size_t k_head = ggml_row_size(kv->k_type, head_dim), v_head = ggml_row_size(kv->v_type, head_dim);
#define PREP_LAUNCH(TK, TV)                                                                                             \
    cuda_launch(c, dim3(n_head + (in->k ? n_head_kv : 0), n_tok), 32, attn_prep_kernel<TK, TV>, in->q, in->q_stride,    \
                in->q_head_stride, in->q_norm, in->k, in->k_stride, in->k_norm, in->v, in->v_stride, in->v_norm, in->eps, \
                n_head, head_dim, half, pos, theta_scale, in->rope_freqs, cells, in->cells2, in->v_from_k,              \
                (uint8_t *)kv->k, (uint8_t *)kv->v, kv->k_row_bytes, kv->v_row_bytes, k_head, v_head)
    KV_TYPES_DISPATCH(kv->k_type, kv->v_type, PREP_LAUNCH);
#undef PREP_LAUNCH
}

/* ---- KV store ------------------------------------------------------------------------------------ */

/* A warp per (kv head, token): its k and v rows stored as attn_prep stores them. */
template <int TK, int TV>
__global__ void __launch_bounds__(32)
kv_store_kernel(const float *k, int ks, const float *v, int vs, int D, const int32_t *__restrict__ cells, uint8_t *kc,
                uint8_t *vc, size_t k_row, size_t v_row, size_t k_head, size_t v_head) {
    cuda_pdl_begin();
    const int h = blockIdx.x, t = blockIdx.y, lane = threadIdx.x;
    kv_store_head<TK>(kc + (size_t)cells[t] * k_row + (size_t)h * k_head, k + (size_t)t * ks + (size_t)h * D, D, lane);
    kv_store_head<TV>(vc + (size_t)cells[t] * v_row + (size_t)h * v_head, v + (size_t)t * vs + (size_t)h * D, D, lane);
}

void cuda_kv_store(struct backend *be, const float *k, int k_stride, const float *v, int v_stride,
                   int n_tok, const int32_t *cells, const struct kv_view *kv) {
    struct cuda_ctx *c = cuda_enter(be);
    const int D = kv->head_dim;
    if (n_tok < 1 || kv->n_head_kv < 1) return;
    const size_t k_head = ggml_row_size(kv->k_type, D), v_head = ggml_row_size(kv->v_type, D);
#define STORE_LAUNCH(TK, TV)                                                                                  \
    cuda_launch(c, dim3(kv->n_head_kv, n_tok), 32, kv_store_kernel<TK, TV>, k, k_stride, v, v_stride, D, cells, \
                (uint8_t *)kv->k, (uint8_t *)kv->v, kv->k_row_bytes, kv->v_row_bytes, k_head, v_head)
    KV_TYPES_DISPATCH(kv->k_type, kv->v_type, STORE_LAUNCH);
#undef STORE_LAUNCH
}

/* ---- argmax -------------------------------------------------------------------------------------- */

/* Rows are cut into slices of ARGMAX_SLICE elements (a function of n only, so a row's result
 * does not depend on how many rows there are). Each block finds its slice's max (lowest index
 * on ties) and, if asked, Σ exp(x - slice max) in double; a second kernel merges the slices in
 * order. NaN logits give an unspecified index. */
#define ARGMAX_SLICE 4096
#define ARGMAX_MIN_ROWS 16
#define ARGMAX_THREADS 256

struct am_part {
    float v;
    int i;
    double s;
};

__device__ __forceinline__ void am_merge(float &v, int &i, float ov, int oi) {
    if (ov > v || (ov == v && oi < i)) { v = ov; i = oi; }
}

__global__ void __launch_bounds__(ARGMAX_THREADS) argmax_part_kernel(const float *__restrict__ x, int n, int want_p,
                                                                     am_part *part) {
    __shared__ float sv[ARGMAX_THREADS / 32];
    __shared__ int si[ARGMAX_THREADS / 32];
    __shared__ double ss[ARGMAX_THREADS / 32];
    cuda_pdl_begin();
    const int r = blockIdx.y, b = blockIdx.x, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int lo = b * ARGMAX_SLICE, hi = min(n, lo + ARGMAX_SLICE);
    const float *xr = x + (size_t)r * n;
    float v = -INFINITY;
    int idx = 0x7FFFFFFF;
    if (lo + tid < hi) { v = xr[lo + tid]; idx = lo + tid; }
    for (int i = lo + tid + ARGMAX_THREADS; i < hi; i += ARGMAX_THREADS)
        if (xr[i] > v) { v = xr[i]; idx = i; }
    for (int o = 16; o > 0; o >>= 1) am_merge(v, idx, __shfl_xor_sync(0xFFFFFFFFu, v, o), __shfl_xor_sync(0xFFFFFFFFu, idx, o));
    if (lane == 0) { sv[warp] = v; si[warp] = idx; }
    __syncthreads();
    v = sv[0];
    idx = si[0];
    for (int w = 1; w < ARGMAX_THREADS / 32; w++) am_merge(v, idx, sv[w], si[w]);
    double s = 0.0;
    if (want_p) {
        for (int i = lo + tid; i < hi; i += ARGMAX_THREADS) s += exp((double)xr[i] - (double)v);
        s = cuda_warp_sum_d(s);
        if (lane == 0) ss[warp] = s;
        __syncthreads();
        s = 0.0;
        for (int w = 0; w < ARGMAX_THREADS / 32; w++) s += ss[w];
    }
    if (tid == 0) part[(size_t)r * gridDim.x + b] = am_part{v, idx, s};
}

/* One warp per row. */
__global__ void argmax_final_kernel(const am_part *__restrict__ part, int nb, int n_rows, int32_t *out, float *p_max) {
    cuda_pdl_begin();
    const int r = blockIdx.x * 4 + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (r >= n_rows) return;
    const am_part *p = part + (size_t)r * nb;
    float v = -INFINITY;
    int idx = 0x7FFFFFFF;
    for (int b = lane; b < nb; b += 32) am_merge(v, idx, p[b].v, p[b].i);
    for (int o = 16; o > 0; o >>= 1) am_merge(v, idx, __shfl_xor_sync(0xFFFFFFFFu, v, o), __shfl_xor_sync(0xFFFFFFFFu, idx, o));
    if (p_max) {
        double s = 0.0;
        for (int b = lane; b < nb; b += 32) s += p[b].s * exp((double)p[b].v - (double)v);
        s = cuda_warp_sum_d(s);
        if (lane == 0) p_max[r] = (float)(1.0 / s);
    }
    if (lane == 0) out[r] = idx;
}

void cuda_argmax(struct backend *be, const float *x, int n_rows, int n, int32_t *out, float *p_max) {
    struct cuda_ctx *c = cuda_enter(be);
    if (n_rows < 1 || n < 1) return;
    const int nb = cuda_cdiv(n, ARGMAX_SLICE);
    /* at least a verify batch's rows at once: growing it later makes recorded graphs stale */
    am_part *part = (am_part *)cuda_scratch(c, &c->amax_part, &c->amax_part_size,
                                            sizeof(am_part) * (size_t)nb * COTI_MAX(n_rows, ARGMAX_MIN_ROWS));
    cuda_launch(c, dim3(nb, n_rows), ARGMAX_THREADS, argmax_part_kernel, x, n, (int)(p_max != NULL), part);
    cuda_launch(c, cuda_cdiv(n_rows, 4), 128, argmax_final_kernel, (const am_part *)part, nb, n_rows, out, p_max);
}

/* ---- greedy acceptance ------------------------------------------------------------------------ */

/* At most SPEC_MAX_DRAFT + 1 ids: one thread, so the result is written without a reduction. */
__global__ void accept_greedy_kernel(const int32_t *draft, const int32_t *target, int n_draft, int32_t *out) {
    cuda_pdl_begin();
    int a = 0;
    while (a < n_draft && draft[a] == target[a]) a++;
    out[0] = a;
    for (int i = 0; i <= n_draft; i++) out[1 + i] = target[i];
}

void cuda_accept_greedy(struct backend *be, const int32_t *draft, const int32_t *target, int n_draft, int32_t *out) {
    struct cuda_ctx *c = cuda_enter(be);
    if (n_draft < 0) return;
    cuda_launch(c, 1, 1, accept_greedy_kernel, draft, target, n_draft, out);
}

CUDA_TRACE_TU(ops)
