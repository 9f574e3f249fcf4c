/* matmul_input.cu — how a matmul's input reaches the matvec and the tiles as converted
 * activations: the converters (f32 rows to Q8_0 / Q8_1 / Q8_K codes, or f16 / bf16 / f32 rows
 * padded to the stride), and the kernels that form an input and write its codes in one pass
 * (the norm with its codes; swiglu or the output gate; the delta-net's gated norm for the
 * direct kernel, and as Q8_K codes for the staged matvec). Which of them runs when: matmul_choose.cu. */
#include "matmul.cuh"

/* Q8_0 / Q8_1 conversion kernel: 8 threads per 32-block. */
__global__ void quant_q8_0_kernel(const float *__restrict__ x, int n, int n_tok, int stride, int8_t *__restrict__ q,
                                  float *__restrict__ d, float *__restrict__ s) {
    cuda_pdl_begin();
    q8_rows([&](int t, int e0, float (&v)[4]) { x_vals4(x, n, t, e0, v); }, n, n_tok, stride,
            blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x, q, d, s);
}

/* The unfused form of a NORM matmul input for Q8_0 / Q8_1 weights, one block per row: x_out =
 * x + m, y = rmsnorm(x + m) ⊙ w (the standalone norm kernel's arithmetic, cuda_row_sumsq), and
 * y's Q8 codes straight from the same values (what the converter would read back from y),
 * which saves the converter's launch. A thread owns 4 consecutive elements, reading them before
 * it writes them (x_out may be x). */
__global__ void __launch_bounds__(CUDA_NORM_THREADS)
norm_q8_rows_kernel(const float *x, const float *m, float *x_out, const float *__restrict__ w, int dim, float eps,
                    float *y, int stride, int8_t *__restrict__ q, float *__restrict__ d, float *__restrict__ s) {
    __shared__ double red[CUDA_NORM_THREADS / 32];
    cuda_pdl_begin();
    const int t = blockIdx.x;
    const size_t o = (size_t)t * dim;
    const float *xr = x + o, *mr = m ? m + o : NULL;
    const bool vec = dim % 4 == 0 && ((uintptr_t)x & 15) == 0 && ((uintptr_t)m & 15) == 0;
    const double ss = cuda_row_sumsq([&](int g, float (&v)[8]) { cuda_group8(xr, mr, dim, vec, g, v); }, dim, red);
    const float sc = cuda_rms_inv(ss, dim, eps);
    const int nb = stride / 32;
    q8_rows(
        [&](int, int e0, float (&a)[4]) {
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int e = e0 + k;
                if (e >= dim) continue;
                const float v = mr ? xr[e] + mr[e] : xr[e];
                if (mr) x_out[o + e] = v;
                a[k] = __fmul_rn(__fmul_rn(v, sc), w[e]);
                y[o + e] = a[k];
            }
        },
        dim, 1, stride, threadIdx.x, CUDA_NORM_THREADS, q + (size_t)t * stride, d + (size_t)t * nb,
        s ? s + (size_t)t * nb : NULL);
}

/* Q8_K conversion kernel: one warp per 256-block. */
__global__ void quant_q8_K_kernel(const float *__restrict__ x, int n, int n_tok, int stride,
                                  int8_t *__restrict__ q, float *__restrict__ d, int16_t *__restrict__ bs) {
    cuda_pdl_begin();
    const int nb = stride / 256;
    const int gw = blockIdx.x * 8 + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (gw >= n_tok * nb) return;
    const int t = gw / nb, b = gw % nb;
    q8K_block_warp(256 * b < n ? x + (size_t)t * n + 256 * b : NULL, lane, q + (size_t)t * stride + 256 * b,
                   d + (size_t)t * nb + b, bs + (size_t)t * (stride / 16) + 16 * b);
}

/* f16 / bf16 / f32 rows with zero padding to the stride. */
__global__ void convert_float_kernel(const float *__restrict__ x, int n, int n_tok, int stride, int f,
                                     void *__restrict__ out) {
    cuda_pdl_begin();
    const int64_t total = (int64_t)n_tok * stride;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / stride;
        const int e = (int)(i % stride);
        const float v = e < n ? x[t * n + e] : 0.0f;
        if (f == XF_F16) ((uint16_t *)out)[i] = cuda_f2h(v);
        else if (f == XF_BF16) ((uint16_t *)out)[i] = cuda_f2bf(v);
        else ((float *)out)[i] = v;
    }
}

void convert_activations(struct cuda_ctx *c, int f, const float *x, int n, int n_tok, const xact &xa) {
    const int stride = xa.stride;
    switch (f) {
    case XF_Q8_0:
    case XF_Q8_1: {
        const int items = n_tok * (stride / 32) * 8;
        cuda_launch(c, cuda_cdiv(items, 256), 256, quant_q8_0_kernel, x, n, n_tok, stride, (int8_t *)xa.q,
                    (float *)xa.d, f == XF_Q8_1 ? (float *)xa.s : (float *)NULL);
        break;
    }
    case XF_Q8_K: {
        const int blocks = n_tok * (stride / 256);
        cuda_launch(c, cuda_cdiv(blocks, 8), 256, quant_q8_K_kernel, x, n, n_tok, stride, (int8_t *)xa.q,
                    (float *)xa.d, (int16_t *)xa.bs);
        break;
    }
    default: {
        const int64_t total = (int64_t)n_tok * stride;
        const int grid = (int)COTI_MIN((total + 255) / 256, (int64_t)c->n_sm * 16);
        cuda_launch(c, grid, 256, convert_float_kernel, x, n, n_tok, stride, f, (void *)xa.q);
        break;
    }
    }
}

/* A swiglu (SWIGLU) or output-gate (SIGMOID) input formed and converted to Q8_0 / Q8_1 in one
 * grid-wide pass, the converter's shape and bits: what the op kernel and the converter do in
 * two launches (the op's f32 output is scratch by the interface, so it is not written). The
 * two expressions are the matvec prologue's (in_val) written out again on purpose: routing that
 * prologue through a shared value function changes its generated code, and the last such
 * sharing cost 0.1-0.3 µs per fused call (notes, session 5). */
__global__ void form_q8_kernel(const float *__restrict__ x, int n, int n_tok, int stride, const mv_input in,
                               int8_t *__restrict__ q, float *__restrict__ d, float *__restrict__ s) {
    cuda_pdl_begin();
    q8_rows(
        [&](int t, int e0, float (&v)[4]) {
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int e = e0 + k;
                const size_t o = (size_t)t * n + e;
                if (e >= n) v[k] = 0.0f;
                else if (in.mode == MV_IN_SWIGLU) v[k] = __fmul_rn(cuda_silu(x[o]), in.m[o]);
                else v[k] = __fmul_rn(x[o], cuda_sigmoid(in.m[(size_t)t * in.gs + (size_t)(e / in.dim) * in.ghs + e % in.dim]));
            }
        },
        n, n_tok, stride, blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x, q, d, s);
}


/* The delta-net's gated norm of one token row, as Q8_0 codes for the direct matvec: a warp per
 * group takes the group's 1/rms as the fused matvec does (cuda_warp_rms_inv), then its 32-blocks,
 * 8 lanes a block, by the fused matvec's expression (dim a multiple of 128). */
__global__ void gnorm_q8_kernel(const float *__restrict__ x, const float *__restrict__ z, const float *__restrict__ w,
                                int dim, float eps, int8_t *__restrict__ q, float *__restrict__ d) {
    cuda_pdl_begin();
    const int g = blockIdx.x, lane = threadIdx.x;
    const float *xg = x + (size_t)g * dim, *zg = z + (size_t)g * dim;
    const float sc = cuda_warp_rms_inv(xg, dim, eps, lane);
    for (int b0 = 0; b0 < dim; b0 += 128) {
        const int e0 = b0 + 4 * lane;
        float v[4];
#pragma unroll
        for (int k = 0; k < 4; k++)
            v[k] = cuda_gnorm(xg[e0 + k], sc, w[e0 + k], zg[e0 + k]);
        const int blk = (g * dim + b0) / 32 + lane / 8;
        q8_block_oct(v, lane % 8, q + 32 * (size_t)blk, d + blk, NULL);
    }
}

/* The same gated norm as Q8_K codes (the K-quants' activations), a warp per 256-block: each group
 * it touches takes its 1/rms as the fused matvec does, then the block's values by the fused
 * matvec's expression and the Q8_K rule: the codes a fused launch forms in every block, formed
 * once, so the matvec only copies them (MV_STAGED). n a multiple of dim. */
__global__ void gnorm_q8K_kernel(const float *__restrict__ x, const float *__restrict__ z, const float *__restrict__ w,
                                 int n, int dim, float eps, int stride, int8_t *__restrict__ q, float *__restrict__ d,
                                 int16_t *__restrict__ bs) {
    cuda_pdl_begin();
    const int b = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (b >= stride / 256) return;
    float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    const int e0 = 256 * b, e_end = min(n, e0 + 256);
    for (int g = e0 / dim; g * dim < e_end; g++) {
        const float sc = cuda_warp_rms_inv(x + (size_t)g * dim, dim, eps, lane);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const int e = e0 + 8 * lane + k;
            if (e < n && e / dim == g) v[k] = cuda_gnorm(x[e], sc, w[e % dim], z[e]);
        }
    }
    q8K_block_vals(v, lane, q + (size_t)e0, d + b, bs + 16 * (size_t)b);
}

xact converted_scratch(struct cuda_ctx *c, int f, int n_tok, int stride) {
    xact xa;
    uint8_t *base = (uint8_t *)cuda_scratch(c, &c->xq, &c->xq_size, xfmt_layout(f, n_tok, stride, NULL, NULL));
    xfmt_layout(f, n_tok, stride, base, &xa);
    return xa;
}

xact norm_q8(struct cuda_ctx *c, const float *x, const float *m, float *x_out, const float *w, float eps, float *a,
             int n, int n_tok, int f) {
    const int stride = x_stride(n);
    const xact xa = converted_scratch(c, f, n_tok, stride);
    cuda_launch(c, n_tok, CUDA_NORM_THREADS, norm_q8_rows_kernel, x, m, x_out, w, n, eps, a, stride, (int8_t *)xa.q,
                (float *)xa.d, f == XF_Q8_1 ? (float *)xa.s : (float *)NULL);
    return xa;
}

xact form_q8(struct cuda_ctx *c, const float *x, int n, int n_tok, const mv_input &in, int f) {
    const int stride = x_stride(n);
    const xact xa = converted_scratch(c, f, n_tok, stride);
    const int items = n_tok * (stride / 32) * 8;
    cuda_launch(c, cuda_cdiv(items, 256), 256, form_q8_kernel, x, n, n_tok, stride, in, (int8_t *)xa.q, (float *)xa.d,
                f == XF_Q8_1 ? (float *)xa.s : (float *)NULL);
    return xa;
}

xact gnorm_q8(struct cuda_ctx *c, const float *x, const float *z, const float *w, int dim, float eps, int n) {
    const xact xa = converted_scratch(c, XF_Q8_0, 1, x_stride(n));
    cuda_launch(c, n / dim, 32, gnorm_q8_kernel, x, z, w, dim, eps, (int8_t *)xa.q, (float *)xa.d);
    return xa;
}

xact gnorm_q8K(struct cuda_ctx *c, const float *x, const float *z, const float *w, int dim, float eps, int n) {
    const int stride = x_stride(n);
    const xact xa = converted_scratch(c, XF_Q8_K, 1, stride);
    cuda_launch(c, cuda_cdiv(stride / 256, 8), 256, gnorm_q8K_kernel, x, z, w, n, dim, eps, stride, (int8_t *)xa.q,
                (float *)xa.d, (int16_t *)xa.bs);
    return xa;
}

CUDA_TRACE_TU(matmul_input)
