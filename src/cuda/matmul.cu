/* matmul.cu — matmul / matmul_n / get_rows for F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
 * Q4_K, Q5_K and Q6_K weights, kept on the device in their GGUF block layout.
 *
 * Numerics: the CPU path's. Activations are converted on the device to the weight type's
 * vec_dot type by the reference rules of quant-formats.md §5.1 (Q8_0 for Q8_0/Q4_0/Q5_0, Q8_1
 * for Q4_1/Q5_1, Q8_K for the K-quants, f16 / bf16 for F16 / BF16; F32 stays f32), producing
 * the same codes and scales bit for bit. Every block's integer sum is exact (dp4a, or int8
 * tensor cores) and its float scale products are formed in the reference's order with
 * non-contracted multiplies.
 * - Up to 8 tokens (decode, verify): blocks are summed in f32 in a different order than the
 *   CPU's (per lane, then a warp butterfly; K-quants per 32-element sub-block), so an output
 *   differs from the CPU reference by f32 reassociation alone: |Δ| <= n_in · 2^-24 · Σ|w_i x_i|
 *   in the worst case, ~2e-7 · Σ|w_i x_i| seen; the test bounds it by 2e-6 · Σ|w_i x_i|.
 * - More than 8 tokens (prefill), quantized weights: every output sums its blocks in row order
 *   as the reference does (K-quants per super-block from exact integer sums): bit-identical to
 *   the CPU reference. F32/F16/BF16 weights use the matvec in groups of 8 tokens.
 *
 * Kernels (one per weight type and token count):
 * - matvec (<= 8 tokens per launch group): a persistent grid; a warp owns R weight rows (R = 1
 *   up to 4 tokens, 4 for 5-8, so an activation load serves R rows there) and streams them
 *   in chunks: cp.async copies each chunk's 16-byte-aligned span (any row alignment works)
 *   into the warp's shared memory, two stages deep, so the next chunk is in flight while lanes
 *   decode the current one. A lane takes whole 32-element units (a 32-block, or an eighth of
 *   a K super-block): unit u of every row goes to lane u % 32, in increasing u, so an output's
 *   value depends only on its row and its token's activations, never on n_tok, R or the
 *   group: a verify batch reproduces plain decode bit for bit. The first two chunks are
 *   requested before the kernel waits for the previous kernel (programmatic dependent
 *   launch). For 1-2 tokens of quantized weights the kernel quantizes the activations itself
 *   (each block into its shared memory), so a matmul is a single launch; it also forms a norm,
 *   gated norm, output gate or swiglu input itself where that measured faster (mv_fuses);
 *   past that a norm's own kernel writes the activation codes with its output.
 * - prefill tiles (mmq_kernel below) for > 8 tokens of quantized weights.
 * - Several weights of one type in matmul_n share one launch; activations are converted once
 *   per distinct vec_dot type (when the matvec does not quantize them itself). */
#include "cuda_internal.cuh"

#include <string.h>

/* ---- activation formats on the device --------------------------------------------------- */

enum xfmt { XF_Q8_0, XF_Q8_1, XF_Q8_K, XF_F16, XF_BF16, XF_F32, XF_COUNT };

/* Converted activations: rows `stride` elements apart (stride = n_in rounded up to 256, the
 * padding zero). q: int8 codes, or f16/bf16 bits, or f32; d: per-32 scales (Q8_0/Q8_1, the f16
 * value as f32) or per-256 scales (Q8_K, f32); s: Q8_1's f16(d·Σq) as f32; bs: Q8_K's sums of
 * 16 codes. */
struct xact {
    const void *q;
    const float *d;
    const float *s;
    const int16_t *bs;
    int stride;
};

static size_t align256(size_t v) { return (v + 255) & ~(size_t)255; }

/* Elements per converted activation row of n values: n rounded up to 256, the padding zero. */
static int x_stride(int64_t n) { return (int)align256((size_t)n); }

/* Bytes of format f for n_tok rows; if base is given, also lay the parts out from it. */
static size_t xfmt_layout(int f, int n_tok, int stride, uint8_t *base, xact *xa) {
    const size_t nt = (size_t)n_tok, S = (size_t)stride;
    size_t q_bytes = 0, d_bytes = 0, s_bytes = 0, bs_bytes = 0;
    switch (f) {
    case XF_Q8_0: q_bytes = nt * S; d_bytes = nt * (S / 32) * 4; break;
    case XF_Q8_1: q_bytes = nt * S; d_bytes = s_bytes = nt * (S / 32) * 4; break;
    case XF_Q8_K: q_bytes = nt * S; d_bytes = nt * (S / 256) * 4; bs_bytes = nt * (S / 16) * 2; break;
    case XF_F16: case XF_BF16: q_bytes = nt * S * 2; break;
    default: q_bytes = nt * S * 4; break;
    }
    size_t off = 0;
    if (xa) {
        xa->q = base;
        xa->d = d_bytes ? (const float *)(base + align256(q_bytes)) : NULL;
        xa->s = s_bytes ? (const float *)(base + align256(q_bytes) + align256(d_bytes)) : NULL;
        xa->bs = bs_bytes ? (const int16_t *)(base + align256(q_bytes) + align256(d_bytes) + align256(s_bytes)) : NULL;
        xa->stride = stride;
    }
    off = align256(q_bytes) + align256(d_bytes) + align256(s_bytes) + align256(bs_bytes);
    return off;
}

/* A Q8_0 / Q8_1 code: r = value / scale rounded half away from zero, clamped, NaN to 0. */
__device__ __forceinline__ int q8_code(float r) {
    return !(r == r) ? 0 : r >= 127.0f ? 127 : r <= -127.0f ? -127 : (int)roundf(r);
}

/* Q8_0 / Q8_1 by quant.c's reference rule, one 32-block over 8 consecutive lanes, 4 values
 * each: v = elements 4·part .. 4·part + 3 of the block, part = lane % 8 (every lane of the
 * warp calls). Codes to q (the block's, 4-byte aligned), f16(d) as f32 to *d, and for Q8_1
 * f16(d·Σq) to *s. The scale is the block's max |value| / 127 and a code depends only on its
 * value and the scale, so spreading the block does not change a bit. */
__device__ __forceinline__ void q8_block_oct(const float (&v)[4], int part, int8_t *q, float *d, float *s) {
    float amax = 0.0f; /* NaN ignored, as fmaxf from 0 does */
#pragma unroll
    for (int i = 0; i < 4; i++) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
    const float dd = amax / 127.0f, id = dd != 0.0f ? 1.0f / dd : 0.0f;
    uint32_t w = 0;
    int sum = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int qi = q8_code(v[i] * id);
        sum += qi;
        w |= (uint32_t)(qi & 0xFF) << (8 * i);
    }
    *(uint32_t *)(q + 4 * part) = w;
    if (s) {
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
    }
    if (part == 0) {
        *d = __half2float(__float2half_rn(dd));
        if (s) *s = __half2float(__float2half_rn((float)sum * dd));
    }
}

/* Q8_0 / Q8_1 blocks of n_tok rows (n elements, stride per row, blocks past n zero), 8 lanes
 * per block: `val(t, e0, v)` gives the 4 values from element e0 of row t (e0 < n). Threads
 * tid, tid + n_threads, ... take the (row, block, part) items; n_threads is a multiple of 32,
 * and so is the item count (stride is a multiple of 256), so every lane of a warp calls. */
template <typename V>
__device__ __forceinline__ void q8_rows(V val, int n, int n_tok, int stride, int tid, int n_threads, int8_t *q,
                                        float *d, float *s) {
    const int nb = stride / 32;
    for (int i = tid; i < n_tok * nb * 8; i += n_threads) {
        const int blk = i / 8, part = i % 8, t = blk / nb, b = blk % nb, e0 = 32 * b + 4 * part;
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (e0 < n) val(t, e0, v);
        q8_block_oct(v, part, q + (size_t)t * stride + 32 * b, d + blk, s ? s + blk : NULL);
    }
}

/* The 4 values of f32 row t of x (n wide) from e0: one 16-byte load where aligned. */
__device__ __forceinline__ void x_vals4(const float *x, int n, int t, int e0, float (&v)[4]) {
    const float *p = x + (size_t)t * n + e0;
    if (e0 + 4 <= n && ((uintptr_t)p & 15) == 0) {
        const float4 f = *(const float4 *)p;
        v[0] = f.x; v[1] = f.y; v[2] = f.z; v[3] = f.w;
    } else {
#pragma unroll
        for (int k = 0; k < 4; k++) v[k] = e0 + k < n ? p[k] : 0.0f;
    }
}

/* Q8_K by quant_k.c's reference rule, one 256-block by one warp, 8 values per lane: the scale
 * comes from the signed value of largest magnitude, the first one on ties. xb = NULL: padding. */
__device__ __forceinline__ void q8K_block_vals(const float (&v)[8], int lane, int8_t *q, float *d, int16_t *bs);
__device__ __forceinline__ void q8K_block_warp(const float *xb, int lane, int8_t *q, float *d, int16_t *bs) {
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; i++) v[i] = xb ? xb[8 * lane + i] : 0.0f;
    q8K_block_vals(v, lane, q, d, bs);
}

/* The Q8_K rule on a warp's 256 values in registers (8 per lane). */
__device__ __forceinline__ void q8K_block_vals(const float (&v)[8], int lane, int8_t *q, float *d, int16_t *bs) {
    float amax = 0.0f, mx = 0.0f;
    int idx = 1 << 30;
#pragma unroll
    for (int i = 0; i < 8; i++)
        if (fabsf(v[i]) > amax) { amax = fabsf(v[i]); mx = v[i]; idx = 8 * lane + i; }
    for (int o = 16; o > 0; o >>= 1) {
        const float oa = __shfl_xor_sync(0xFFFFFFFFu, amax, o);
        const float om = __shfl_xor_sync(0xFFFFFFFFu, mx, o);
        const int oi = __shfl_xor_sync(0xFFFFFFFFu, idx, o);
        if (oa > amax || (oa == amax && oi < idx)) { amax = oa; mx = om; idx = oi; }
    }
    uint32_t w0 = 0, w1 = 0;
    int sum = 0;
    float dd = 0.0f;
    if (amax != 0.0f) {
        const float iscale = -127.0f / mx;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const float r = iscale * v[i];
            const int c = !(r == r) ? 0 : r >= 127.0f ? 127 : r <= -127.0f ? -127 : __float2int_rn(r);
            sum += c;
            if (i < 4) w0 |= (uint32_t)(c & 0xFF) << (8 * i);
            else w1 |= (uint32_t)(c & 0xFF) << (8 * (i - 4));
        }
        dd = 1.0f / iscale;
    }
    *(uint2 *)(q + 8 * lane) = make_uint2(w0, w1);
    sum += __shfl_xor_sync(0xFFFFFFFFu, sum, 1);
    if ((lane & 1) == 0) bs[lane / 2] = (int16_t)sum;
    if (lane == 0) *d = dd;
}

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

static void convert_activations(struct cuda_ctx *c, int f, const float *x, int n, int n_tok, const xact &xa) {
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

/* ---- shared-memory readers ---------------------------------------------------------------- */

/* N little-endian words starting at byte `off` (any alignment) of a shared buffer; reads one
 * word past the end. */
template <int N>
__device__ __forceinline__ void lds_words(const uint8_t *sm, int off, uint32_t (&out)[N]) {
    const uint32_t *w = (const uint32_t *)(sm + (off & ~3));
    const uint32_t sh = (uint32_t)(off & 3) * 8;
    uint32_t prev = w[0];
#pragma unroll
    for (int i = 0; i < N; i++) {
        const uint32_t nx = w[i + 1];
        out[i] = __funnelshift_r(prev, nx, sh);
        prev = nx;
    }
}
/* f16 scale at an even offset */
__device__ __forceinline__ float lds_h2f(const uint8_t *sm, int off) {
    return cuda_h2f(*(const uint16_t *)(sm + off));
}

/* 5th bits: bit i of h (i < 4) to bit 4 of byte i */
__device__ __forceinline__ uint32_t spread4(uint32_t h) {
    return ((h & 1u) << 4) | ((h & 2u) << 11) | ((h & 4u) << 18) | ((h & 8u) << 25);
}

/* ---- weight types: decode one 32-element unit into 8 words of int8 codes ------------------
 * BB: bytes per storage block; UPB: 32-element units per block; U: units per lane in a chunk
 * of one row when a warp has one row (a chunk is then 32·U units, 1.5-4 KB; with R rows,
 * max(1, U/R) units per lane per row); XF: the activation format.
 * decode() fills the codes of unit `sub` of the block at smem offset `off` and its scale info;
 * combine() turns the exact integer sums of the unit's two 16-element halves (lo, hi) against
 * one token into the unit's f32 contribution, with the reference's multiplication order. */

struct usc {
    float d, m;
    int a, b;
};

/* A token's scale data for one unit: d (Q8_0/Q8_1: per 32; Q8_K: per 256), s (Q8_1), b (Q8_K:
 * the sum of the unit's 32 codes). */
struct uxs {
    float d, s;
    int b;
};

template <bool XS, typename V> __device__ __forceinline__ V xld(const V *p) {
    if constexpr (XS) return *p;
    else return __ldg(p);
}

template <int XF, bool XS> __device__ __forceinline__ uxs load_xs(const xact &x, size_t t, int u) {
    uxs r;
    if constexpr (XF == XF_Q8_K) {
        r.d = xld<XS>(x.d + t * (x.stride / 256) + u / 8);
        const int16_t *bs = x.bs + t * (x.stride / 16) + 2 * u;
        r.b = (int)xld<XS>(bs) + (int)xld<XS>(bs + 1);
        r.s = 0.0f;
    } else {
        const size_t i = t * (x.stride / 32) + u;
        r.d = xld<XS>(x.d + i);
        r.s = XF == XF_Q8_1 ? xld<XS>(x.s + i) : 0.0f;
        r.b = 0;
    }
    return r;
}

template <int T> struct qt;

template <> struct qt<GGML_TYPE_Q8_0> {
    enum { BB = 34, UPB = 1, U = 2, XF = XF_Q8_0 };
    static __device__ __forceinline__ void decode(const uint8_t *sm, int off, int sub, uint32_t (&c)[8], usc &s) {
        s.d = lds_h2f(sm, off);
        lds_words<8>(sm, off + 2, c);
    }
    static __device__ __forceinline__ float combine(const usc &s, int lo, int hi, const uxs &x) {
        return __fmul_rn(__fmul_rn(s.d, x.d), (float)(lo + hi));
    }
};

template <> struct qt<GGML_TYPE_Q4_0> {
    enum { BB = 18, UPB = 1, U = 4, XF = XF_Q8_0 };
    static __device__ __forceinline__ void decode(const uint8_t *sm, int off, int sub, uint32_t (&c)[8], usc &s) {
        uint32_t w[4];
        s.d = lds_h2f(sm, off);
        lds_words<4>(sm, off + 2, w);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            c[k] = __vsub4(w[k] & 0x0F0F0F0Fu, 0x08080808u);
            c[4 + k] = __vsub4((w[k] >> 4) & 0x0F0F0F0Fu, 0x08080808u);
        }
    }
    static __device__ __forceinline__ float combine(const usc &s, int lo, int hi, const uxs &x) {
        return qt<GGML_TYPE_Q8_0>::combine(s, lo, hi, x);
    }
};

template <> struct qt<GGML_TYPE_Q4_1> {
    enum { BB = 20, UPB = 1, U = 4, XF = XF_Q8_1 };
    static __device__ __forceinline__ void decode(const uint8_t *sm, int off, int sub, uint32_t (&c)[8], usc &s) {
        uint32_t w[4];
        s.d = lds_h2f(sm, off);
        s.m = lds_h2f(sm, off + 2);
        lds_words<4>(sm, off + 4, w);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            c[k] = w[k] & 0x0F0F0F0Fu;
            c[4 + k] = (w[k] >> 4) & 0x0F0F0F0Fu;
        }
    }
    static __device__ __forceinline__ float combine(const usc &s, int lo, int hi, const uxs &x) {
        return __fadd_rn(__fmul_rn(__fmul_rn(s.d, x.d), (float)(lo + hi)), __fmul_rn(s.m, x.s));
    }
};

template <> struct qt<GGML_TYPE_Q5_0> {
    enum { BB = 22, UPB = 1, U = 4, XF = XF_Q8_0 };
    static __device__ __forceinline__ void decode(const uint8_t *sm, int off, int sub, uint32_t (&c)[8], usc &s) {
        uint32_t qh[1], w[4];
        s.d = lds_h2f(sm, off);
        lds_words<1>(sm, off + 2, qh);
        lds_words<4>(sm, off + 6, w);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            c[k] = __vsub4((w[k] & 0x0F0F0F0Fu) | spread4(qh[0] >> (4 * k)), 0x10101010u);
            c[4 + k] = __vsub4(((w[k] >> 4) & 0x0F0F0F0Fu) | spread4(qh[0] >> (16 + 4 * k)), 0x10101010u);
        }
    }
    static __device__ __forceinline__ float combine(const usc &s, int lo, int hi, const uxs &x) {
        return qt<GGML_TYPE_Q8_0>::combine(s, lo, hi, x);
    }
};

template <> struct qt<GGML_TYPE_Q5_1> {
    enum { BB = 24, UPB = 1, U = 4, XF = XF_Q8_1 };
    static __device__ __forceinline__ void decode(const uint8_t *sm, int off, int sub, uint32_t (&c)[8], usc &s) {
        uint32_t qh[1], w[4];
        s.d = lds_h2f(sm, off);
        s.m = lds_h2f(sm, off + 2);
        lds_words<1>(sm, off + 4, qh);
        lds_words<4>(sm, off + 8, w);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            c[k] = (w[k] & 0x0F0F0F0Fu) | spread4(qh[0] >> (4 * k));
            c[4 + k] = ((w[k] >> 4) & 0x0F0F0F0Fu) | spread4(qh[0] >> (16 + 4 * k));
        }
    }
    static __device__ __forceinline__ float combine(const usc &s, int lo, int hi, const uxs &x) {
        return qt<GGML_TYPE_Q4_1>::combine(s, lo, hi, x);
    }
};

/* Q4_K/Q5_K: 6-bit scale and min of sub-block j from the 12-byte scales field (3 words). */
__device__ __forceinline__ void k4_scale_min(int j, const uint32_t (&sw)[3], int &sc, int &mn) {
#define SB(k) ((int)((sw[(k) / 4] >> (8 * ((k) % 4))) & 0xFFu))
    if (j < 4) {
        sc = SB(j) & 63;
        mn = SB(j + 4) & 63;
    } else {
        sc = (SB(j + 4) & 0xF) | ((SB(j - 4) >> 6) << 4);
        mn = (SB(j + 4) >> 4) | ((SB(j) >> 6) << 4);
    }
#undef SB
}

/* d·x.d·(sc·Σ) − dmin·x.d·(mn·bsum): the reference's per-super-block formula applied to one
 * sub-block */
__device__ __forceinline__ float k4_combine(const usc &s, int lo, int hi, const uxs &x) {
    const float dd = __fmul_rn(s.d, x.d), dm = __fmul_rn(s.m, x.d);
    return __fsub_rn(__fmul_rn(dd, (float)(s.a * (lo + hi))), __fmul_rn(dm, (float)(s.b * x.b)));
}

/* a whole super-block from its exact sums: d·dx·isum − dmin·dx·msum, the reference's order */
__device__ __forceinline__ float k4_sb(const usc &s, int is, int ms, float xd) {
    const float dd = __fmul_rn(s.d, xd), dm = __fmul_rn(s.m, xd);
    return __fsub_rn(__fmul_rn(dd, (float)is), __fmul_rn(dm, (float)ms));
}

template <> struct qt<GGML_TYPE_Q4_K> {
    enum { BB = 144, UPB = 8, U = 4, XF = XF_Q8_K };
    static __device__ __forceinline__ void decode(const uint8_t *sm, int off, int sub, uint32_t (&c)[8], usc &s) {
        uint32_t sw[3];
        s.d = lds_h2f(sm, off);
        s.m = lds_h2f(sm, off + 2);
        lds_words<3>(sm, off + 4, sw);
        k4_scale_min(sub, sw, s.a, s.b);
        lds_words<8>(sm, off + 16 + 32 * (sub / 2), c);
        const int sh = (sub & 1) * 4;
#pragma unroll
        for (int k = 0; k < 8; k++) c[k] = (c[k] >> sh) & 0x0F0F0F0Fu;
    }
    static __device__ __forceinline__ float combine(const usc &s, int lo, int hi, const uxs &x) {
        return k4_combine(s, lo, hi, x);
    }
    static __device__ __forceinline__ int isum(const usc &s, int lo, int hi) { return s.a * (lo + hi); }
    static __device__ __forceinline__ int msum(const usc &s, const uxs &x) { return s.b * x.b; }
    static __device__ __forceinline__ float sb(const usc &s, int is, int ms, float xd) { return k4_sb(s, is, ms, xd); }
};

template <> struct qt<GGML_TYPE_Q5_K> {
    enum { BB = 176, UPB = 8, U = 4, XF = XF_Q8_K };
    static __device__ __forceinline__ void decode(const uint8_t *sm, int off, int sub, uint32_t (&c)[8], usc &s) {
        uint32_t sw[3], qh[8];
        s.d = lds_h2f(sm, off);
        s.m = lds_h2f(sm, off + 2);
        lds_words<3>(sm, off + 4, sw);
        k4_scale_min(sub, sw, s.a, s.b);
        lds_words<8>(sm, off + 16, qh);
        lds_words<8>(sm, off + 48 + 32 * (sub / 2), c);
        const int sh = (sub & 1) * 4;
#pragma unroll
        for (int k = 0; k < 8; k++) c[k] = ((c[k] >> sh) & 0x0F0F0F0Fu) | (((qh[k] >> sub) & 0x01010101u) << 4);
    }
    static __device__ __forceinline__ float combine(const usc &s, int lo, int hi, const uxs &x) {
        return k4_combine(s, lo, hi, x);
    }
    static __device__ __forceinline__ int isum(const usc &s, int lo, int hi) { return s.a * (lo + hi); }
    static __device__ __forceinline__ int msum(const usc &s, const uxs &x) { return s.b * x.b; }
    static __device__ __forceinline__ float sb(const usc &s, int is, int ms, float xd) { return k4_sb(s, is, ms, xd); }
};

template <> struct qt<GGML_TYPE_Q6_K> {
    enum { BB = 210, UPB = 8, U = 4, XF = XF_Q8_K };
    static __device__ __forceinline__ void decode(const uint8_t *sm, int off, int sub, uint32_t (&c)[8], usc &s) {
        const int h = sub / 4, g = sub % 4;
        uint32_t qh[8];
        lds_words<8>(sm, off + 64 * h + 32 * (g & 1), c);
        lds_words<8>(sm, off + 128 + 32 * h, qh);
        const int shl = 4 * (g >> 1), shh = 2 * g;
#pragma unroll
        for (int k = 0; k < 8; k++)
            c[k] = __vsub4(((c[k] >> shl) & 0x0F0F0F0Fu) | (((qh[k] >> shh) & 0x03030303u) << 4), 0x20202020u);
        const uint16_t sc2 = *(const uint16_t *)(sm + off + 192 + 2 * sub);
        s.a = (int)(int8_t)(sc2 & 0xFF);
        s.b = (int)(int8_t)(sc2 >> 8);
        s.d = lds_h2f(sm, off + 208);
    }
    static __device__ __forceinline__ float combine(const usc &s, int lo, int hi, const uxs &x) {
        return __fmul_rn(__fmul_rn(s.d, x.d), (float)(s.a * lo + s.b * hi));
    }
    static __device__ __forceinline__ int isum(const usc &s, int lo, int hi) { return s.a * lo + s.b * hi; }
    static __device__ __forceinline__ int msum(const usc &s, const uxs &x) { return 0; }
    static __device__ __forceinline__ float sb(const usc &s, int is, int ms, float xd) {
        return __fmul_rn(__fmul_rn(s.d, xd), (float)is);
    }
};

/* float types: a unit is 32 elements; products are formed from the converted activations */
template <> struct qt<GGML_TYPE_F16> { enum { BB = 64, UPB = 1, U = 1, XF = XF_F16 }; };
template <> struct qt<GGML_TYPE_BF16> { enum { BB = 64, UPB = 1, U = 1, XF = XF_BF16 }; };
template <> struct qt<GGML_TYPE_F32> { enum { BB = 128, UPB = 1, U = 1, XF = XF_F32 }; };

__device__ __forceinline__ int dp4a_half(const uint32_t *c, int4 a) {
    int s = __dp4a((int)c[0], a.x, 0);
    s = __dp4a((int)c[1], a.y, s);
    s = __dp4a((int)c[2], a.z, s);
    return __dp4a((int)c[3], a.w, s);
}

/* One unit of R quantized rows (smem offsets off[r]) against NT token rows; XS: the
 * activations are in shared memory (plain loads), else global (read-only loads). */
template <int T, int NT, int R, bool XS>
__device__ __forceinline__ void unit_dot(const uint8_t *const (&sm)[R], const int (&off)[R], int sub, const xact &x,
                                         int t0, int u, float (&acc)[R][NT]) {
    typedef qt<T> Q;
    uint32_t c[R][8];
    usc s[R];
#pragma unroll
    for (int r = 0; r < R; r++) Q::decode(sm[r], off[r], sub, c[r], s[r]);
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const size_t t = (size_t)(t0 + j);
        const int4 *xp = (const int4 *)((const int8_t *)x.q + t * x.stride) + 2 * u;
        const int4 xa = xld<XS>(xp), xb = xld<XS>(xp + 1);
        const uxs xs = load_xs<Q::XF, XS>(x, t, u);
#pragma unroll
        for (int r = 0; r < R; r++) acc[r][j] += Q::combine(s[r], dp4a_half(c[r], xa), dp4a_half(c[r] + 4, xb), xs);
    }
}

__device__ __forceinline__ float2 h2_to_f2(uint32_t w) { return __half22float2(*(const __half2 *)&w); }
__device__ __forceinline__ float2 bf2_to_f2(uint32_t w) {
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xFFFF0000u));
}

template <int T, int NT>
__device__ __forceinline__ void unit_dot_half(const uint8_t *sm, int off, const xact &x, int t0, int u, int n,
                                              float (&acc)[NT]) {
    uint32_t w[16];
    lds_words<16>(sm, off, w);
    if (32 * u + 32 > n) /* last unit of a row whose length is not a multiple of 32 */
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const int e = 32 * u + 2 * i;
            if (e >= n) w[i] = 0;
            else if (e + 1 >= n) w[i] &= 0xFFFFu;
        }
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const uint4 *xp = (const uint4 *)((const uint16_t *)x.q + (size_t)(t0 + j) * x.stride) + 4 * u;
        float a = acc[j];
#pragma unroll
        for (int v = 0; v < 4; v++) {
            const uint4 xv = __ldg(xp + v);
            const uint32_t xw[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float2 wf, xf;
                if constexpr (T == GGML_TYPE_F16) { wf = h2_to_f2(w[4 * v + i]); xf = h2_to_f2(xw[i]); }
                else { wf = bf2_to_f2(w[4 * v + i]); xf = bf2_to_f2(xw[i]); }
                a = fmaf(wf.x, xf.x, a); /* the products are exact in f32 */
                a = fmaf(wf.y, xf.y, a);
            }
        }
        acc[j] = a;
    }
}

template <int NT>
__device__ __forceinline__ void unit_dot_f32(const uint8_t *sm, int off, const xact &x, int t0, int u, int n,
                                             float (&acc)[NT]) {
    uint32_t w[32];
    lds_words<32>(sm, off, w);
    if (32 * u + 32 > n)
#pragma unroll
        for (int i = 0; i < 32; i++)
            if (32 * u + i >= n) w[i] = 0;
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const float4 *xp = (const float4 *)((const float *)x.q + (size_t)(t0 + j) * x.stride) + 8 * u;
        float a = acc[j];
#pragma unroll
        for (int v = 0; v < 8; v++) {
            const float4 xv = __ldg(xp + v);
            a = fmaf(__uint_as_float(w[4 * v + 0]), xv.x, a);
            a = fmaf(__uint_as_float(w[4 * v + 1]), xv.y, a);
            a = fmaf(__uint_as_float(w[4 * v + 2]), xv.z, a);
            a = fmaf(__uint_as_float(w[4 * v + 3]), xv.w, a);
        }
        acc[j] = a;
    }
}

/* ---- matvec kernel ---------------------------------------------------------------------- */

#define MV_MAX_W 8
#define MV_MAX_NT 8            /* tokens per matvec launch group; more go to the tensor-core tiles */
#define MV_WARPS 16            /* persistent blocks, ~2 per SM: activations staged once per block */
#define MV_FUSED_MAX_NT 2      /* up to this many tokens the kernel quantizes x itself */
#define MV_FUSED_MAX_XBYTES (64 << 10)
#define MV_NORM2_MAX_NT 4      /* the NextN head's input formed in the matvec up to this many rows */

/* A fused matvec's input: the f32 rows x as they are (X); rmsnorm(x + m) ⊙ w with x + m and
 * the normed rows also written out, spread over the grid (NORM, m may be NULL); silu(x) ⊙ m
 * (SWIGLU); rmsnorm(x) ⊙ w ⊙ silu(m) with the norm over groups of dim elements (GNORM, the
 * delta-net's gated norm); or x ⊙ sigmoid(m) per head of dim (SIGMOID, m's rows gs and heads
 * ghs apart: the attention output gate); or, for up to MV_NORM2_MAX_NT rows, [rmsnorm(x) ⊙ w,
 * rmsnorm(m) ⊙ w2] with x and m dim wide (NORM2, the NextN head's input). The values are formed by the same
 * operations as the standalone kernels (norm_rows, swiglu, rmsnorm_gated, mul_sigmoid, rmsnorm),
 * so fused and unfused launches quantize the same bits. */
enum { MV_IN_X, MV_IN_NORM, MV_IN_SWIGLU, MV_IN_GNORM, MV_IN_SIGMOID, MV_IN_NORM2 };
struct mv_input {
    int mode;
    const float *m, *w;
    float *xout, *a;
    float eps;
    int dim;                  /* GNORM: elements per norm group; SIGMOID: per head; NORM2: per half */
    int gs, ghs;              /* SIGMOID: the gate's row and head strides */
    const float *w2;          /* NORM2: the second half's norm weight */
};
static const mv_input MV_PLAIN = {MV_IN_X, NULL, NULL, NULL, NULL, 0.0f, 0, 0, 0, NULL};
#define MV_GNORM_MAX_GROUPS 128  /* token rows x groups whose scales a fused launch keeps */

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

struct mv_params {
    const uint8_t *w[MV_MAX_W];
    float *y[MV_MAX_W];
    size_t rb[MV_MAX_W];
    int row0[MV_MAX_W + 1];   /* first global row of each weight; row0[n_w] = all rows */
    int n_out[MV_MAX_W];
    int n_w;
    int n;                    /* elements per row */
    int n_units;              /* 32-element units per row */
    mv_input in;              /* what a fused launch computes its input rows from */
};

/* Shapes of a matvec instance: R rows per warp, CU units of each row per chunk, SLOT bytes of
 * shared memory per row and stage (the chunk's aligned span plus read slack). */
template <int T, int NT> struct mv_shape {
    enum {
        FLOAT = T == GGML_TYPE_F16 || T == GGML_TYPE_BF16 || T == GGML_TYPE_F32,
        /* a verify batch (2-4 rows) is latency-bound: one row per warp spreads it over twice
         * the warps and half the shared memory (tiny mtp:2 6071-6104 -> 6236-6312 tok/s,
         * mtp:3 5387-5425 -> 6222-6241 against R = 2 for 2-3 and 4 for 4, H200) */
        R = FLOAT ? 1 : NT <= 4 ? 1 : 4,
        UR = R <= 2 ? qt<T>::U : qt<T>::U / 4 > 1 ? qt<T>::U / 4 : 1,
        CU = 32 * UR,
        CB = CU / qt<T>::UPB * qt<T>::BB,
        SLOT = ((CB + 30) / 16) * 16 + 16,
        WBYTES = MV_WARPS * 2 * R * SLOT,                   /* weight stages of a block */
    };
};

/* Bytes of shared memory for NT tokens of format f quantized in the block (codes, then d,
 * then s or bs), each part 16-byte aligned. */
static __host__ __device__ __forceinline__ int xs_bytes(int f, int nt, int stride) {
    const int q = nt * stride, d = f == XF_Q8_K ? nt * (stride / 256) * 4 : nt * (stride / 32) * 4;
    const int e = f == XF_Q8_1 ? nt * (stride / 32) * 4 : f == XF_Q8_K ? nt * (stride / 16) * 2 : 0;
    return ((q + 15) & ~15) + ((d + 15) & ~15) + ((e + 15) & ~15);
}

/* Where xs_bytes' parts start from base: the codes, d, and e (s for Q8_1, bs for Q8_K). */
struct xs_parts {
    int8_t *q;
    float *d;
    uint8_t *e;
};
__device__ __forceinline__ xs_parts xs_layout(uint8_t *base, int f, int nt, int stride) {
    const int nq = nt * stride, nd = f == XF_Q8_K ? nt * (stride / 256) : nt * (stride / 32);
    xs_parts p;
    p.q = (int8_t *)base;
    p.d = (float *)(base + ((nq + 15) & ~15));
    p.e = (uint8_t *)p.d + ((nd * 4 + 15) & ~15);
    return p;
}

__device__ __forceinline__ void cp_async16(uint8_t *smem, const void *gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait1() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }

/* What a matvec launch does with its input (the kernel's FUSED parameter): read converted
 * activations from global memory; quantize f32 rows (a fused input mode) in every block; the
 * same for the NORM2 input alone, compiled apart so that the other fused launches keep their
 * code; or copy one converted token into shared memory first (9B FFN down: +0.5% decode
 * against reading it in the dot products). */
enum { MV_CONVERTED, MV_FUSED, MV_FUSED_NORM2, MV_STAGED, MV_VARIANTS };
static_assert(MV_VARIANTS == sizeof(((struct cuda_ctx *)0)->mv_regs[0][0]) / sizeof(int),
              "cuda_ctx's per-kernel tables hold every variant");

/* Persistent matvec: block b takes a contiguous share of the row sets (R rows each), its warp w
 * sets w, w + MV_WARPS, ... of the share, and streams their chunks through two shared-memory
 * stages as one sequence of (set, chunk) items: an issue cursor runs two items ahead of the
 * compute cursor, across row sets. The first two items are requested before the kernel waits
 * for the previous one.
 * MV_FUSED / MV_FUSED_NORM2: xf holds f32 rows (tokens t_base..) and the block quantizes them
 * into shared memory first; else x is the converted activations in global memory, which
 * MV_STAGED copies into shared memory first. */
template <int T, int NT, int FUSED>
__global__ void __launch_bounds__(MV_WARPS * 32) matvec_kernel(const mv_params P, const float *xf, xact x, int t_base) {
    typedef qt<T> Q;
    typedef mv_shape<T, NT> S;
    constexpr int R = S::R, CU = S::CU, SLOT = S::SLOT;
    extern __shared__ __align__(16) uint8_t dsm[];
    uint8_t(*wsm)[2][R][SLOT] = reinterpret_cast<uint8_t(*)[2][R][SLOT]>(dsm);
    cuda_pdl_trigger();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int total = P.row0[P.n_w], n_sets = (total + R - 1) / R, n_chunks = (P.n_units + CU - 1) / CU;
    /* block b takes the contiguous row sets [first_set(b), first_set(b + 1)), its warps
     * interleaved in them (9B +1.6% against sets interleaved over the whole grid) */
    auto first_set = [&](int b) -> int { return (int)((long long)b * n_sets / gridDim.x); };
    const int s_end = first_set(blockIdx.x + 1);

    /* a cursor over (set, chunk); rows past the end repeat the last one (results dropped) */
    struct cursor {
        int set, ch;
        const uint8_t *row[R];
        int wi[R];
    };
    auto rows_of = [&](cursor &cu) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int row = min(cu.set * R + r, total - 1);
            int k = 0;
            while (k + 1 < P.n_w && row >= P.row0[k + 1]) k++;
            cu.wi[r] = k;
            cu.row[r] = P.w[k] + (size_t)(row - P.row0[k]) * P.rb[k];
        }
    };
    auto advance = [&](cursor &cu) {
        if (++cu.ch == n_chunks) {
            cu.ch = 0;
            cu.set += MV_WARPS;
            if (cu.set < s_end) rows_of(cu);
        }
    };
    /* copy the cursor's chunk into stage st (one commit group; empty past the end) */
    auto issue = [&](const cursor &cu, int st) {
        if (cu.set < s_end) {
            const int u0 = cu.ch * CU, uend = min(u0 + CU, P.n_units);
#pragma unroll
            for (int r = 0; r < R; r++) {
                const uint8_t *gs = cu.row[r] + (size_t)(u0 / Q::UPB) * Q::BB;
                const uint8_t *ge = cu.row[r] + (size_t)((uend + Q::UPB - 1) / Q::UPB) * Q::BB;
                const uint8_t *a0 = (const uint8_t *)((uintptr_t)gs & ~(uintptr_t)15);
                const int n16 = (int)((ge - a0 + 15) / 16);
                for (int i = lane; i < n16; i += 32) cp_async16(&wsm[warp][st][r][16 * i], a0 + 16 * i);
            }
        }
        cp_async_commit();
    };

    cursor cc, ic; /* compute, issue */
    cc.set = first_set(blockIdx.x) + warp;
    cc.ch = 0;
    if (cc.set < s_end) rows_of(cc);
    ic = cc;
    issue(ic, 0); /* weights never change: fetch before the wait */
    advance(ic);
    issue(ic, 1);
    advance(ic);
    cuda_pdl_wait();
    int t0 = t_base + blockIdx.y * NT;
    if constexpr (FUSED == MV_STAGED && !S::FLOAT) {
        /* converted rows t0.. copied into shared memory once, in the fused layout, so that the
         * dot products load nothing but weights from global memory */
        const int stride = x.stride, nq = NT * stride;
        const int nd = Q::XF == XF_Q8_K ? NT * (stride / 256) : NT * (stride / 32);
        const xs_parts xp = xs_layout(dsm + S::WBYTES, Q::XF, NT, stride);
        int8_t *q = xp.q;
        float *d = xp.d;
        uint8_t *e = xp.e;
        const int4 *gq = (const int4 *)((const int8_t *)x.q + (size_t)t0 * stride);
        for (int i = threadIdx.x; i < nq / 16; i += MV_WARPS * 32) ((int4 *)q)[i] = gq[i];
        const size_t d0 = Q::XF == XF_Q8_K ? (size_t)t0 * (stride / 256) : (size_t)t0 * (stride / 32);
        for (int i = threadIdx.x; i < nd; i += MV_WARPS * 32) {
            d[i] = x.d[d0 + i];
            if (Q::XF == XF_Q8_1) ((float *)e)[i] = x.s[d0 + i];
        }
        if constexpr (Q::XF == XF_Q8_K) {
            for (int i = threadIdx.x; i < NT * (stride / 16); i += MV_WARPS * 32)
                ((int16_t *)e)[i] = x.bs[(size_t)t0 * (stride / 16) + i];
            x.bs = (const int16_t *)e;
        }
        x.q = q;
        x.d = d;
        x.s = Q::XF == XF_Q8_1 ? (const float *)e : NULL;
        t0 = 0;
        __syncthreads();
        cuda_trace_mid();
    }
    if constexpr ((FUSED == MV_FUSED || FUSED == MV_FUSED_NORM2) && !S::FLOAT) {
        /* NORM: each token row's 1/rms, by the standalone norm's reduction (cuda_row_sumsq) */
        __shared__ double red[MV_WARPS];
        float sc0 = 1.0f, sc1 = 1.0f;
        if (P.in.mode == MV_IN_NORM)
            for (int t = 0; t < NT; t++) {
                const float *xr = xf + (size_t)(t_base + t) * P.n;
                const float *mr = P.in.m ? P.in.m + (size_t)(t_base + t) * P.n : NULL;
                const bool vec = P.n % 4 == 0 && ((uintptr_t)xf & 15) == 0 && ((uintptr_t)P.in.m & 15) == 0;
                const double ss =
                    cuda_row_sumsq([&](int g, float (&v)[8]) { cuda_group8(xr, mr, P.n, vec, g, v); }, P.n, red);
                const float sc = cuda_rms_inv(ss, P.n, P.in.eps);
                if (t == 0) sc0 = sc;
                else sc1 = sc;
            }
        /* GNORM: each (token, group)'s 1/rms, a warp per group as the standalone norm does */
        __shared__ float gsc[MV_GNORM_MAX_GROUPS];
        const int n_grp = P.in.mode == MV_IN_GNORM ? P.n / P.in.dim : 0;
        if (P.in.mode == MV_IN_GNORM) {
            for (int i = warp; i < NT * n_grp; i += MV_WARPS)
                gsc[i] = cuda_warp_rms_inv(xf + (size_t)(t_base + i / n_grp) * P.n + (size_t)(i % n_grp) * P.in.dim,
                                           P.in.dim, P.in.eps, lane);
            __syncthreads();
        }
        if constexpr (FUSED == MV_FUSED_NORM2) { /* each row's two halves' 1/rms, as the standalone rmsnorm forms it */
            for (int i = warp; i < 2 * NT; i += MV_WARPS) {
                const size_t r = (size_t)(t_base + i / 2) * P.in.dim;
                gsc[i] = cuda_warp_rms_inv(i % 2 ? P.in.m + r : xf + r, P.in.dim, P.in.eps, lane);
            }
            __syncthreads();
        }
        /* element e (< P.n) of input row t; loads only, so a thread's loads are all in flight
         * together (a store between them, to memory that might alias, would serialize them) */
        auto in_val = [&](int t, int e) -> float {
            const size_t o = (size_t)(t_base + t) * P.n + e;
            if constexpr (FUSED == MV_FUSED_NORM2) {
                const size_t r = (size_t)(t_base + t) * P.in.dim;
                return e < P.in.dim ? __fmul_rn(__fmul_rn(xf[r + e], gsc[2 * t]), P.in.w[e])
                                    : __fmul_rn(__fmul_rn(P.in.m[r + e - P.in.dim], gsc[2 * t + 1]), P.in.w2[e - P.in.dim]);
            }
            if (P.in.mode == MV_IN_SWIGLU) return __fmul_rn(cuda_silu(xf[o]), P.in.m[o]);
            if (P.in.mode == MV_IN_SIGMOID)
                return __fmul_rn(xf[o], cuda_sigmoid(P.in.m[(size_t)(t_base + t) * P.in.gs +
                                                         (size_t)(e / P.in.dim) * P.in.ghs + e % P.in.dim]));
            if (P.in.mode == MV_IN_GNORM)
                return __fmul_rn(__fmul_rn(__fmul_rn(xf[o], gsc[t * n_grp + e / P.in.dim]), P.in.w[e % P.in.dim]),
                                 cuda_silu(P.in.m[o]));
            float v = xf[o];
            if (P.in.mode == MV_IN_NORM) {
                if (P.in.m) v = v + P.in.m[o];
                v = __fmul_rn(__fmul_rn(v, t == 0 ? sc0 : sc1), P.in.w[e]);
            }
            return v;
        };
        /* elements e0 .. e0 + 3 of input row t (e0 a multiple of 4), by in_val's expressions:
         * where every operand row is 16-byte aligned and the group / head size a multiple of
         * 4, one vector load per operand and one group / head index for the four (a matvec
         * forms its whole input in every block, so this is most of its own instructions) */
        const bool vec4 = FUSED != MV_FUSED_NORM2 && P.n % 4 == 0 && ((uintptr_t)xf & 15) == 0 &&
                          ((uintptr_t)P.in.m & 15) == 0 && ((uintptr_t)P.in.w & 15) == 0 &&
                          (P.in.mode == MV_IN_GNORM || P.in.mode == MV_IN_SIGMOID ? P.in.dim % 4 == 0 : true) &&
                          (P.in.mode == MV_IN_SIGMOID ? P.in.gs % 4 == 0 && P.in.ghs % 4 == 0 : true);
        auto in_vals4 = [&](int t, int e0, float (&v)[4]) {
            if (!vec4 || e0 + 4 > P.n) {
#pragma unroll
                for (int k = 0; k < 4; k++) v[k] = e0 + k < P.n ? in_val(t, e0 + k) : 0.0f;
                return;
            }
            const size_t o = (size_t)(t_base + t) * P.n + e0;
            const float4 x4 = *(const float4 *)(xf + o);
            const float xv[4] = {x4.x, x4.y, x4.z, x4.w};
            float mv[4] = {0.0f, 0.0f, 0.0f, 0.0f}, wv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            int g = 0;
            if (P.in.mode == MV_IN_GNORM || P.in.mode == MV_IN_SIGMOID) g = e0 / P.in.dim;
            const int j = e0 - g * (P.in.mode == MV_IN_GNORM || P.in.mode == MV_IN_SIGMOID ? P.in.dim : 0);
            const float *mp = P.in.mode == MV_IN_SIGMOID
                                  ? P.in.m + (size_t)(t_base + t) * P.in.gs + (size_t)g * P.in.ghs + j
                                  : P.in.m ? P.in.m + o : NULL;
            if (mp) {
                const float4 m4 = *(const float4 *)mp;
                mv[0] = m4.x; mv[1] = m4.y; mv[2] = m4.z; mv[3] = m4.w;
            }
            if (P.in.mode == MV_IN_GNORM || P.in.mode == MV_IN_NORM) {
                const float4 w4 = *(const float4 *)(P.in.w + (P.in.mode == MV_IN_GNORM ? j : e0));
                wv[0] = w4.x; wv[1] = w4.y; wv[2] = w4.z; wv[3] = w4.w;
            }
            const float sc = P.in.mode == MV_IN_GNORM ? gsc[t * n_grp + g] : t == 0 ? sc0 : sc1;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                if (P.in.mode == MV_IN_SWIGLU) v[k] = __fmul_rn(cuda_silu(xv[k]), mv[k]);
                else if (P.in.mode == MV_IN_SIGMOID) v[k] = __fmul_rn(xv[k], cuda_sigmoid(mv[k]));
                else if (P.in.mode == MV_IN_GNORM) v[k] = cuda_gnorm(xv[k], sc, wv[k], mv[k]);
                else if (P.in.mode == MV_IN_NORM) v[k] = __fmul_rn(__fmul_rn(P.in.m ? xv[k] + mv[k] : xv[k], sc), wv[k]);
                else v[k] = xv[k];
            }
        };
        /* NORM: x + m and the normed rows are written out too, an 8-element group per thread
         * spread over the grid (loads before stores: one latency, and no block runs long) */
        if (P.in.mode == MV_IN_NORM) {
            const int ng = (P.n + 7) / 8;
            const bool vec = P.n % 8 == 0 && ((uintptr_t)xf & 15) == 0 && ((uintptr_t)P.in.m & 15) == 0 &&
                             ((uintptr_t)P.in.w & 15) == 0 && ((uintptr_t)P.in.xout & 15) == 0 &&
                             ((uintptr_t)P.in.a & 15) == 0;
            for (int i = blockIdx.x * MV_WARPS * 32 + threadIdx.x; i < NT * ng; i += gridDim.x * MV_WARPS * 32) {
                const int t = i / ng, e0 = 8 * (i % ng);
                const size_t o = (size_t)(t_base + t) * P.n + e0;
                float r[8], w8[8];
                cuda_group8(xf + (size_t)(t_base + t) * P.n, P.in.m ? P.in.m + (size_t)(t_base + t) * P.n : NULL, P.n,
                            vec, i % ng, r);
                cuda_group8(P.in.w, NULL, P.n, vec, i % ng, w8);
                float a8[8];
#pragma unroll
                for (int k = 0; k < 8; k++) a8[k] = __fmul_rn(__fmul_rn(r[k], t == 0 ? sc0 : sc1), w8[k]);
                if (vec) {
                    if (P.in.m) {
                        ((float4 *)(P.in.xout + o))[0] = make_float4(r[0], r[1], r[2], r[3]);
                        ((float4 *)(P.in.xout + o))[1] = make_float4(r[4], r[5], r[6], r[7]);
                    }
                    ((float4 *)(P.in.a + o))[0] = make_float4(a8[0], a8[1], a8[2], a8[3]);
                    ((float4 *)(P.in.a + o))[1] = make_float4(a8[4], a8[5], a8[6], a8[7]);
                } else {
                    for (int k = 0; k < 8 && e0 + k < P.n; k++) {
                        if (P.in.m) P.in.xout[o + k] = r[k];
                        P.in.a[o + k] = a8[k];
                    }
                }
            }
        }
        /* quantize the NT activation rows into shared memory, laid out like the global form */
        const int stride = x.stride;
        const xs_parts xp = xs_layout(dsm + S::WBYTES, Q::XF, NT, stride);
        int8_t *q = xp.q;
        float *d = xp.d;
        if constexpr (Q::XF == XF_Q8_K) {
            const int nb = stride / 256;
            int16_t *bs = (int16_t *)xp.e;
            for (int i = warp; i < NT * nb; i += MV_WARPS) {
                const int t = i / nb, b = i % nb;
                int8_t *qb = q + (size_t)t * stride + 256 * b;
                int16_t *bsb = bs + (size_t)t * (stride / 16) + 16 * b;
                if (P.in.mode == MV_IN_X) {
                    q8K_block_warp(256 * b < P.n ? xf + (size_t)(t_base + t) * P.n + 256 * b : NULL, lane, qb, d + i, bsb);
                } else {
                    float v[8];
#pragma unroll
                    for (int k = 0; k < 8; k++) {
                        const int e = 256 * b + 8 * lane + k;
                        v[k] = e < P.n ? in_val(t, e) : 0.0f;
                    }
                    q8K_block_vals(v, lane, qb, d + i, bsb);
                }
            }
            x.bs = bs;
        } else {
            float *sx = Q::XF == XF_Q8_1 ? (float *)xp.e : NULL;
            q8_rows(
                [&](int t, int e0, float (&v)[4]) {
                    if (P.in.mode == MV_IN_X) x_vals4(xf + (size_t)t_base * P.n, P.n, t, e0, v);
                    else in_vals4(t, e0, v);
                },
                P.n, NT, stride, threadIdx.x, MV_WARPS * 32, q, d, sx);
            x.s = sx;
        }
        x.q = q;
        x.d = d;
        t0 = 0;
        __syncthreads();
        cuda_trace_mid();
    }
    if (cc.set >= s_end) {
        cuda_trace_end();
        return;
    }

    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int j = 0; j < NT; j++) acc[r][j] = 0.0f;
    for (int k = 0;; k++) {
        const int st = k & 1;
        cp_async_wait1(); /* item k has landed (item k + 1 may still be in flight) */
        __syncwarp();
        const int u0 = cc.ch * CU, uend = min(u0 + CU, P.n_units);
        const uint8_t *sm[R];
        int off0[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            sm[r] = &wsm[warp][st][r][0];
            off0[r] = (int)((uintptr_t)(cc.row[r] + (size_t)(u0 / Q::UPB) * Q::BB) & 15);
        }
#pragma unroll
        for (int j = 0; j < CU / 32; j++) {
            const int ul = lane + 32 * j, u = u0 + ul;
            if (u < uend) {
                int off[R];
#pragma unroll
                for (int r = 0; r < R; r++) off[r] = off0[r] + (ul / Q::UPB) * Q::BB;
                if constexpr (T == GGML_TYPE_F16 || T == GGML_TYPE_BF16) unit_dot_half<T, NT>(sm[0], off[0], x, t0, u, P.n, acc[0]);
                else if constexpr (T == GGML_TYPE_F32) unit_dot_f32<NT>(sm[0], off[0], x, t0, u, P.n, acc[0]);
                else unit_dot<T, NT, R, FUSED != MV_CONVERTED>(sm, off, ul % Q::UPB, x, t0, u, acc);
            }
        }
        __syncwarp(); /* this stage is refilled now */
        issue(ic, st);
        advance(ic);
        if (cc.ch + 1 == n_chunks) { /* the set is done */
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    const float v = cuda_warp_sum(acc[r][j]);
                    acc[r][j] = 0.0f;
                    const int row = cc.set * R + r;
                    if (lane == 0 && row < total)
                        P.y[cc.wi[r]][(size_t)(t_base + blockIdx.y * NT + j) * P.n_out[cc.wi[r]] + (row - P.row0[cc.wi[r]])] = v;
                }
        }
        advance(cc);
        if (cc.set >= s_end) break;
    }
    cuda_trace_end();
}

/* ---- one token, Q8_0, weights loaded straight into registers -------------------------------
 * For narrow matrices (a row or less per warp: the 9B's 4096 x 4096 out- and o-projections),
 * where the staged matvec's time after the PDL wait (its input formed in every block, chunks
 * through shared memory) is most of its time. The input arrives as codes written by a form
 * kernel; each lane loads its own 34-byte blocks as the nine aligned words that cover them (a
 * block starts 0 or 2 bytes into a word), its first MV_DIRECT_PRE before the wait. Lane l sums
 * units l, l + 32, ... in order with unit_dot's arithmetic, so every output equals the staged
 * kernels' bit for bit (decode and verify agree). Standalone, a chain of 4096 x 4096 matvecs
 * took 6.1 µs each with its form kernel against 9.0 for the fused staged form (H200). */
#define MV_DIRECT_PRE 2
#define MV_DIRECT_PER_SM 2     /* blocks per SM (its register bound) */

__device__ __forceinline__ void q8_0_words(const uint8_t *blk, uint32_t (&v)[9]) {
    const uint32_t *a = (const uint32_t *)((uintptr_t)blk & ~(uintptr_t)3);
#pragma unroll
    for (int j = 0; j < 9; j++) v[j] = __ldg(a + j);
}

__device__ __forceinline__ float q8_0_unit(const uint8_t *blk, const uint32_t (&v)[9], const xact &x, int u) {
    const bool odd = ((uintptr_t)blk & 3) != 0;
    const uint16_t db = odd ? (uint16_t)(v[0] >> 16) : (uint16_t)(v[0] & 0xFFFFu);
    uint32_t c[8];
#pragma unroll
    for (int j = 0; j < 8; j++) c[j] = odd ? v[j + 1] : __funnelshift_r(v[j], v[j + 1], 16);
    const int4 *xp = (const int4 *)x.q + 2 * u;
    const int lo = dp4a_half(c, __ldg(xp)), hi = dp4a_half(c + 4, __ldg(xp + 1));
    return __fmul_rn(__fmul_rn(__half2float(__ushort_as_half(db)), __ldg(x.d + u)), (float)(lo + hi));
}

__global__ void __launch_bounds__(MV_WARPS * 32, MV_DIRECT_PER_SM)
matvec_q8_0_direct_kernel(const uint8_t *__restrict__ w, size_t rb, int n_units, int n_rows, const xact x,
                          float *__restrict__ y) {
    constexpr int BB = qt<GGML_TYPE_Q8_0>::BB;
    cuda_pdl_trigger();
    const int lane = threadIdx.x % 32, nw = gridDim.x * MV_WARPS;
    int row = blockIdx.x * MV_WARPS + threadIdx.x / 32;
    uint32_t pre[MV_DIRECT_PRE][9];
    if (row < n_rows)
#pragma unroll
        for (int k = 0; k < MV_DIRECT_PRE; k++)
            if (lane + 32 * k < n_units) q8_0_words(w + (size_t)row * rb + (size_t)(lane + 32 * k) * BB, pre[k]);
    cuda_pdl_wait();
    for (bool first = true; row < n_rows; row += nw, first = false) {
        const uint8_t *wr = w + (size_t)row * rb;
        float acc = 0.0f;
#pragma unroll
        for (int k = 0; k < MV_DIRECT_PRE; k++) {
            const int u = lane + 32 * k;
            if (u >= n_units) continue;
            uint32_t v[9];
            if (first) {
#pragma unroll
                for (int j = 0; j < 9; j++) v[j] = pre[k][j];
            } else q8_0_words(wr + (size_t)u * BB, v);
            acc += q8_0_unit(wr + (size_t)u * BB, v, x, u);
        }
        for (int u0 = 32 * MV_DIRECT_PRE; u0 < n_units; u0 += 64) { /* two units' loads in flight */
            const int u = u0 + lane, u1 = u + 32;
            uint32_t v[9], v1[9];
            if (u < n_units) q8_0_words(wr + (size_t)u * BB, v);
            if (u1 < n_units) q8_0_words(wr + (size_t)u1 * BB, v1);
            if (u < n_units) acc += q8_0_unit(wr + (size_t)u * BB, v, x, u);
            if (u1 < n_units) acc += q8_0_unit(wr + (size_t)u1 * BB, v1, x, u1);
        }
        acc = cuda_warp_sum(acc);
        if (lane == 0) y[row] = acc;
    }
    cuda_trace_end();
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

/* ---- prefill: int8 tensor-core tiles ------------------------------------------------------
 * For more than MV_MAX_NT tokens. A block computes a 64-row x 64-token tile with 4 warps (each
 * 32 x 32) over K tiles of 8 units (256 elements): cp.async stages the raw weight bytes of the
 * next K tile while the threads decode the current one into int8 codes (the same decode() as
 * the matvec) and its converted activations are loaded; then per unit and 16-element half an
 * mma.sync m16n8k16 (s8 x s8 -> s32) gives the exact integer sums lo / hi of every output.
 * Each output accumulates its blocks in row order exactly as the CPU reference does: per unit
 * with combine() for the 32-element formats, and per super-block from exact integer sums for
 * the K-quants (sb()), so prefill outputs are bit-identical to the CPU reference. */

#define MMQ_BM 64
#define MMQ_BN 64
#define MMQ_KU 8                      /* units per K tile: 8 blocks of 32, or 1 super-block */
#define MMQ_LD (MMQ_KU * 32 + 16)     /* padded row stride of the code tiles (no bank conflicts) */
#define MMQ_THREADS 128

template <int T> struct mmq_shape {
    enum {
        RAW = MMQ_KU / qt<T>::UPB * qt<T>::BB,            /* raw bytes of a row per K tile */
        RSLOT = ((RAW + 30) / 16) * 16 + 16,
        SMEM = 2 * MMQ_BM * RSLOT + (MMQ_BM + MMQ_BN) * MMQ_LD + MMQ_BM * MMQ_KU * (int)sizeof(usc) +
               MMQ_BN * MMQ_KU * (int)sizeof(uxs) + MMQ_BM * (int)sizeof(void *),
    };
};

__device__ __forceinline__ void mma_s8_16816(uint32_t a0, uint32_t a1, uint32_t b0, int (&c)[4]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0), "r"(0));
}

template <int T>
__global__ void __launch_bounds__(MMQ_THREADS) mmq_kernel(const mv_params P, const xact x, int n_tok) {
    typedef qt<T> Q;
    typedef mmq_shape<T> S;
    constexpr bool KQ = Q::UPB == 8;
    extern __shared__ __align__(16) uint8_t dsm[];
    uint8_t(*raw)[MMQ_BM][S::RSLOT] = reinterpret_cast<uint8_t(*)[MMQ_BM][S::RSLOT]>(dsm);
    uint8_t *acode = dsm + 2 * MMQ_BM * S::RSLOT;
    uint8_t *xcode = acode + MMQ_BM * MMQ_LD;
    usc *wsc = (usc *)(xcode + MMQ_BN * MMQ_LD);
    uxs *xsc = (uxs *)(wsc + MMQ_BM * MMQ_KU);
    const uint8_t **rowp = (const uint8_t **)(xsc + MMQ_BN * MMQ_KU);
    cuda_pdl_trigger();
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, tq = lane % 4;
    const int wm = warp / 2, wn = warp % 2;
    const int total = P.row0[P.n_w], row_base = blockIdx.x * MMQ_BM, tok_base = blockIdx.y * MMQ_BN;
    const int n_kt = (P.n_units + MMQ_KU - 1) / MMQ_KU;
    if (tid < MMQ_BM) { /* rows past the end repeat the last one (results dropped) */
        const int row = min(row_base + tid, total - 1);
        int k = 0;
        while (k + 1 < P.n_w && row >= P.row0[k + 1]) k++;
        rowp[tid] = P.w[k] + (size_t)(row - P.row0[k]) * P.rb[k];
    }
    __syncthreads();
    /* raw bytes of K tile kt: two threads per row */
    auto issue = [&](int kt, int st) {
        const int i = tid / 2, u0 = kt * MMQ_KU, uend = min(u0 + MMQ_KU, P.n_units);
        const uint8_t *gs = rowp[i] + (size_t)(u0 / Q::UPB) * Q::BB;
        const uint8_t *ge = rowp[i] + (size_t)((uend + Q::UPB - 1) / Q::UPB) * Q::BB;
        const uint8_t *a0 = (const uint8_t *)((uintptr_t)gs & ~(uintptr_t)15);
        const int n16 = (int)((ge - a0 + 15) / 16);
        for (int p = tid % 2; p < n16; p += 2) cp_async16(&raw[st][i][16 * p], a0 + 16 * p);
        cp_async_commit();
    };
    issue(0, 0);
    cuda_pdl_wait();

    float acc[2][4][4];
    int isum[2][4][4], msum[2][4][4];
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) { acc[mi][ni][e] = 0.0f; isum[mi][ni][e] = 0; msum[mi][ni][e] = 0; }

    for (int kt = 0; kt < n_kt; kt++) {
        const int st = kt & 1, u0 = kt * MMQ_KU;
        if (kt + 1 < n_kt) issue(kt + 1, st ^ 1);
        else cp_async_commit();
        /* activation codes (zero-padded to the stride in global memory) and scales */
        for (int p = tid; p < MMQ_BN * 16; p += MMQ_THREADS) {
            const int j = p / 16, q = p % 16, t = min(tok_base + j, n_tok - 1);
            const uint4 v = __ldg((const uint4 *)((const int8_t *)x.q + (size_t)t * x.stride + 32 * u0) + q);
            *(uint4 *)(xcode + j * MMQ_LD + 16 * q) = v;
        }
        for (int p = tid; p < MMQ_BN * MMQ_KU; p += MMQ_THREADS) {
            const int j = p / MMQ_KU, uu = p % MMQ_KU, t = min(tok_base + j, n_tok - 1);
            xsc[p] = u0 + uu < P.n_units ? load_xs<Q::XF, false>(x, (size_t)t, u0 + uu) : uxs{0.0f, 0.0f, 0};
        }
        cp_async_wait1();
        __syncthreads();
        /* decode: 4 (row, unit) pairs per thread */
        for (int p = tid; p < MMQ_BM * MMQ_KU; p += MMQ_THREADS) {
            const int i = p / MMQ_KU, uu = p % MMQ_KU;
            uint32_t c[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            usc s = {0.0f, 0.0f, 0, 0};
            if (u0 + uu < P.n_units) {
                const int off0 = (int)((uintptr_t)(rowp[i] + (size_t)(u0 / Q::UPB) * Q::BB) & 15);
                Q::decode(&raw[st][i][0], off0 + (uu / Q::UPB) * Q::BB, uu % Q::UPB, c, s);
            }
            uint4 *dst = (uint4 *)(acode + i * MMQ_LD + 32 * uu);
            dst[0] = make_uint4(c[0], c[1], c[2], c[3]);
            dst[1] = make_uint4(c[4], c[5], c[6], c[7]);
            wsc[p] = s;
        }
        __syncthreads();
        /* tensor cores: per unit, lo and hi halves of every output of the warp's 32 x 32 */
        const int uend = min(MMQ_KU, P.n_units - u0);
        for (int uu = 0; uu < uend; uu++) {
            uint32_t a[2][2][2], b[4][2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
#pragma unroll
                for (int mi = 0; mi < 2; mi++) {
                    const uint8_t *ap = acode + (wm * 32 + mi * 16 + g) * MMQ_LD + 32 * uu + 16 * h + 4 * tq;
                    a[mi][h][0] = *(const uint32_t *)ap;
                    a[mi][h][1] = *(const uint32_t *)(ap + 8 * MMQ_LD);
                }
#pragma unroll
                for (int ni = 0; ni < 4; ni++)
                    b[ni][h] = *(const uint32_t *)(xcode + (wn * 32 + ni * 8 + g) * MMQ_LD + 32 * uu + 16 * h + 4 * tq);
            }
            usc ws[2][2];
            uxs xs[4][2];
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int rr = 0; rr < 2; rr++) ws[mi][rr] = wsc[(wm * 32 + mi * 16 + g + 8 * rr) * MMQ_KU + uu];
#pragma unroll
            for (int ni = 0; ni < 4; ni++)
#pragma unroll
                for (int cc = 0; cc < 2; cc++) xs[ni][cc] = xsc[(wn * 32 + ni * 8 + 2 * tq + cc) * MMQ_KU + uu];
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++) {
                    int lo[4], hi[4];
                    mma_s8_16816(a[mi][0][0], a[mi][0][1], b[ni][0], lo);
                    mma_s8_16816(a[mi][1][0], a[mi][1][1], b[ni][1], hi);
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const usc &sw = ws[mi][e / 2];
                        const uxs &sx = xs[ni][e % 2];
                        if constexpr (KQ) {
                            isum[mi][ni][e] += Q::isum(sw, lo[e], hi[e]);
                            msum[mi][ni][e] += Q::msum(sw, sx);
                        } else {
                            acc[mi][ni][e] += Q::combine(sw, lo[e], hi[e], sx);
                        }
                    }
                }
        }
        if constexpr (KQ) { /* the K tile is one super-block: fold its exact sums */
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const usc &sw = wsc[(wm * 32 + mi * 16 + g + 8 * (e / 2)) * MMQ_KU];
                        const uxs &sx = xsc[(wn * 32 + ni * 8 + 2 * tq + e % 2) * MMQ_KU];
                        acc[mi][ni][e] += Q::sb(sw, isum[mi][ni][e], msum[mi][ni][e], sx.d);
                        isum[mi][ni][e] = 0;
                        msum[mi][ni][e] = 0;
                    }
        }
        __syncthreads(); /* the tiles are refilled next */
    }
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            const int row = row_base + wm * 32 + mi * 16 + g + 8 * rr;
            if (row >= total) continue;
            int k = 0;
            while (k + 1 < P.n_w && row >= P.row0[k + 1]) k++;
            float *y = P.y[k] + (row - P.row0[k]);
            const size_t ldy = (size_t)P.n_out[k];
#pragma unroll
            for (int ni = 0; ni < 4; ni++)
#pragma unroll
                for (int cc = 0; cc < 2; cc++) {
                    const int t = tok_base + wn * 32 + ni * 8 + 2 * tq + cc;
                    if (t < n_tok) y[(size_t)t * ldy] = acc[mi][ni][2 * rr + cc];
                }
        }
}

/* ---- get_rows: exact dequantization, in the reference's float order -------------------------- */

__device__ __forceinline__ uint32_t ldg_u16(const uint8_t *p) { return (uint32_t)p[0] | ((uint32_t)p[1] << 8); }
__device__ __forceinline__ uint32_t ldg_u32(const uint8_t *p) { return ldg_u16(p) | (ldg_u16(p + 2) << 16); }
__device__ __forceinline__ float ldg_h2f(const uint8_t *p) { return cuda_h2f((uint16_t)ldg_u16(p)); }

/* scale and min of sub-block j of a Q4_K/Q5_K scales field (bytes) */
__device__ __forceinline__ void k4_scale_min_bytes(int j, const uint8_t *s, int &sc, int &mn) {
    if (j < 4) {
        sc = s[j] & 63;
        mn = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

template <int T> __device__ __forceinline__ float deq(const uint8_t *row, int e) {
    if constexpr (T == GGML_TYPE_F32) return __uint_as_float(ldg_u32(row + 4 * (size_t)e));
    else if constexpr (T == GGML_TYPE_F16) return ldg_h2f(row + 2 * (size_t)e);
    else if constexpr (T == GGML_TYPE_BF16) return cuda_bf2f((uint16_t)ldg_u16(row + 2 * (size_t)e));
    else if constexpr (T == GGML_TYPE_Q8_0) {
        const uint8_t *b = row + (size_t)(e / 32) * 34;
        return (float)(int8_t)b[2 + e % 32] * ldg_h2f(b);
    } else if constexpr (T == GGML_TYPE_Q4_0 || T == GGML_TYPE_Q4_1) {
        const int j = e % 32, hdr = T == GGML_TYPE_Q4_0 ? 2 : 4;
        const uint8_t *b = row + (size_t)(e / 32) * (T == GGML_TYPE_Q4_0 ? 18 : 20);
        const int byte = b[hdr + j % 16], nib = j < 16 ? byte & 0xF : byte >> 4;
        if constexpr (T == GGML_TYPE_Q4_0) return (float)(nib - 8) * ldg_h2f(b);
        else return __fadd_rn(__fmul_rn((float)nib, ldg_h2f(b)), ldg_h2f(b + 2));
    } else if constexpr (T == GGML_TYPE_Q5_0 || T == GGML_TYPE_Q5_1) {
        const int j = e % 32, hdr = T == GGML_TYPE_Q5_0 ? 2 : 4;
        const uint8_t *b = row + (size_t)(e / 32) * (T == GGML_TYPE_Q5_0 ? 22 : 24);
        const uint32_t qh = ldg_u32(b + hdr);
        const int byte = b[hdr + 4 + j % 16], nib = j < 16 ? byte & 0xF : byte >> 4;
        const int code = nib | (int)(((qh >> j) & 1u) << 4);
        if constexpr (T == GGML_TYPE_Q5_0) return (float)(code - 16) * ldg_h2f(b);
        else return __fadd_rn(__fmul_rn((float)code, ldg_h2f(b)), ldg_h2f(b + 2));
    } else if constexpr (T == GGML_TYPE_Q4_K || T == GGML_TYPE_Q5_K) {
        const uint8_t *b = row + (size_t)(e / 256) * (T == GGML_TYPE_Q4_K ? 144 : 176);
        const int ee = e % 256, j = ee / 32, l = ee % 32, ch = ee / 64;
        int sc, mn;
        k4_scale_min_bytes(j, b + 4, sc, mn);
        const float d1 = __fmul_rn(ldg_h2f(b), (float)sc), m1 = __fmul_rn(ldg_h2f(b + 2), (float)mn);
        const int qs = T == GGML_TYPE_Q4_K ? 16 : 48;
        const int byte = b[qs + 32 * ch + l];
        int code = (ee % 64) < 32 ? byte & 0xF : byte >> 4;
        if constexpr (T == GGML_TYPE_Q5_K) code += 16 * ((b[16 + l] >> j) & 1);
        return __fsub_rn(__fmul_rn(d1, (float)code), m1);
    } else { /* Q6_K */
        const uint8_t *b = row + (size_t)(e / 256) * 210;
        const int ee = e % 256, h = ee / 128, g = (ee % 128) / 32, l = ee % 32;
        const int lowbyte = b[64 * h + l + 32 * (g & 1)];
        const int lo = g < 2 ? lowbyte & 0xF : lowbyte >> 4;
        const int hi = (b[128 + 32 * h + l] >> (2 * g)) & 3;
        const int q = (lo | (hi << 4)) - 32;
        return __fmul_rn(__fmul_rn(ldg_h2f(b + 208), (float)(int8_t)b[192 + ee / 16]), (float)q);
    }
}

template <int T>
__global__ void get_rows_kernel(const uint8_t *__restrict__ w, size_t rb, const int32_t *__restrict__ ids, int n,
                                float *__restrict__ out) {
    cuda_pdl_begin();
    const int t = blockIdx.y;
    const uint8_t *row = w + (size_t)ids[t] * rb;
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < n; e += gridDim.x * blockDim.x)
        out[(size_t)t * n + e] = deq<T>(row, e);
}

/* ---- host side: per-type table, matmul_n, get_rows ------------------------------------------- */

typedef void (*mv_launch_fn)(struct cuda_ctx *c, int slot, const mv_params &P, const float *xf, const xact &x,
                             int t_base, int n_groups);
typedef void (*rows_launch_fn)(struct cuda_ctx *c, const struct bweight *w, const int32_t *ids, int n, float *out);

/* A persistent grid: as many blocks as fit on the device at once (from the kernel's registers
 * and this launch's shared memory), at most one row set per warp. */
template <int T, int NT, int FUSED>
static void mv_launch(struct cuda_ctx *c, int slot, const mv_params &P, const float *xf, const xact &x, int t_base,
                      int n_groups) {
    typedef mv_shape<T, NT> S;
    void (*kern)(const mv_params, const float *, xact, int) = matvec_kernel<T, NT, FUSED>;
    const int smem = S::WBYTES + (FUSED != MV_CONVERTED ? xs_bytes(qt<T>::XF, NT, x.stride) : 0);
    int &regs = c->mv_regs[slot][NT - 1][FUSED], &smem_static = c->mv_smem_static[slot][NT - 1][FUSED];
    if (!regs) {
        cudaFuncAttributes fa;
        CUDA_CHECK(cudaFuncGetAttributes(&fa, kern));
        smem_static = (int)fa.sharedSizeBytes;
        CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, c->smem_block_max - smem_static));
        regs = fa.numRegs > 0 ? fa.numRegs : 1;
    }
    const int warp_regs = (regs * 32 + 255) / 256 * 256;
    const int by_regs = 65536 / (warp_regs * MV_WARPS);
    const int by_smem = c->smem_per_sm / (smem + smem_static + c->smem_reserved);
    const int per_sm = COTI_MAX(1, COTI_MIN(COTI_MIN(by_regs, by_smem), 2048 / (MV_WARPS * 32)));
    const int sets = cuda_cdiv(P.row0[P.n_w], S::R);
    const int grid = COTI_MIN(cuda_cdiv(sets, MV_WARPS), c->n_sm * per_sm);
    cuda_launch_smem(c, dim3(grid, n_groups), MV_WARPS * 32, smem, kern, P, xf, x, t_base);
}

typedef void (*mmq_launch_fn)(struct cuda_ctx *c, int slot, const mv_params &P, const xact &x, int n_tok);

template <int T>
static void mmq_launch(struct cuda_ctx *c, int slot, const mv_params &P, const xact &x, int n_tok) {
    void (*kern)(const mv_params, const xact, int) = mmq_kernel<T>;
    if (!c->mmq_ready[slot]) {
        CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, mmq_shape<T>::SMEM));
        c->mmq_ready[slot] = true;
    }
    const dim3 grid(cuda_cdiv(P.row0[P.n_w], MMQ_BM), cuda_cdiv(n_tok, MMQ_BN));
    cuda_launch_smem(c, grid, MMQ_THREADS, mmq_shape<T>::SMEM, kern, P, x, n_tok);
}

template <int T>
static void rows_launch(struct cuda_ctx *c, const struct bweight *w, const int32_t *ids, int n, float *out) {
    const dim3 grid(cuda_cdiv(w->n_in, 256), n);
    cuda_launch(c, grid, 256, get_rows_kernel<T>, (const uint8_t *)w->data, w->row_bytes, ids, (int)w->n_in, out);
}

struct type_entry {
    enum ggml_type type;
    int xf;
    mv_launch_fn mv[8];        /* [NT - 1], activations converted by a separate kernel */
    mv_launch_fn mv_fused[MV_FUSED_MAX_NT]; /* [NT - 1], quantized in the kernel; NULL for float types */
    mv_launch_fn mv_norm2[MV_NORM2_MAX_NT]; /* [NT - 1], the NORM2 input formed in the kernel */
    mv_launch_fn mv_staged;                 /* one converted token, copied to shared memory first */
    int fused_wbytes[MV_NORM2_MAX_NT];      /* [NT - 1]: their weight stages' shared memory */
    mmq_launch_fn mmq;         /* more than MV_MAX_NT tokens; NULL for float types */
    rows_launch_fn rows;
};

#define MV_ROW(T)                                                                              \
    {mv_launch<T, 1, MV_CONVERTED>, mv_launch<T, 2, MV_CONVERTED>, mv_launch<T, 3, MV_CONVERTED>,   \
     mv_launch<T, 4, MV_CONVERTED>, mv_launch<T, 5, MV_CONVERTED>, mv_launch<T, 6, MV_CONVERTED>,   \
     mv_launch<T, 7, MV_CONVERTED>, mv_launch<T, 8, MV_CONVERTED>}
#define TYPE_ENTRY_Q(T)                                                                                      \
    {T, qt<T>::XF, MV_ROW(T), {mv_launch<T, 1, MV_FUSED>, mv_launch<T, 2, MV_FUSED>},                          \
     {mv_launch<T, 1, MV_FUSED_NORM2>, mv_launch<T, 2, MV_FUSED_NORM2>, mv_launch<T, 3, MV_FUSED_NORM2>,       \
      mv_launch<T, 4, MV_FUSED_NORM2>},                                                                        \
     mv_launch<T, 1, MV_STAGED>,                                                                               \
     {mv_shape<T, 1>::WBYTES, mv_shape<T, 2>::WBYTES, mv_shape<T, 3>::WBYTES, mv_shape<T, 4>::WBYTES},          \
     mmq_launch<T>, rows_launch<T>}
#define TYPE_ENTRY_F(T) {T, qt<T>::XF, MV_ROW(T), {NULL, NULL}, {NULL, NULL, NULL, NULL}, NULL, {0, 0, 0, 0}, NULL, rows_launch<T>}

static const struct type_entry type_table[] = {
    TYPE_ENTRY_F(GGML_TYPE_F32),  TYPE_ENTRY_F(GGML_TYPE_F16),  TYPE_ENTRY_F(GGML_TYPE_BF16),
    TYPE_ENTRY_Q(GGML_TYPE_Q8_0), TYPE_ENTRY_Q(GGML_TYPE_Q4_0), TYPE_ENTRY_Q(GGML_TYPE_Q4_1),
    TYPE_ENTRY_Q(GGML_TYPE_Q5_0), TYPE_ENTRY_Q(GGML_TYPE_Q5_1), TYPE_ENTRY_Q(GGML_TYPE_Q4_K),
    TYPE_ENTRY_Q(GGML_TYPE_Q5_K), TYPE_ENTRY_Q(GGML_TYPE_Q6_K),
};

static const struct type_entry *type_find(enum ggml_type t) {
    for (size_t i = 0; i < sizeof type_table / sizeof type_table[0]; i++)
        if (type_table[i].type == t) return &type_table[i];
    return NULL;
}

bool cuda_weight_type_supported(enum ggml_type t) { return type_find(t) != NULL; }

static const struct type_entry *type_get(const struct bweight *w) {
    const struct type_entry *te = type_find(w->type);
    if (!te) { /* weight_init refused it: a caller bug */
        fprintf(stderr, "cuda: matmul on a weight of unsupported type %d\n", (int)w->type);
        abort();
    }
    return te;
}

static int type_slot(const struct type_entry *te) { return (int)(te - type_table); }

/* Rows a launch forms its input for, by input mode and row width. Every block forms every row,
 * so past one row the forming is paid once per block and row: at 2-4 rows, H200, graphs of 50
 * calls, µs per call (fused / the op's kernel, a converter and the matvec): a norm 384 -> 2304
 * 5.12 at 2 rows fused against 4.92 at 3 unfused, 4096 -> 4096 15.2 against 12.0; the gated
 * norm, output gate and plain inputs gain at 2 rows only when narrow (tiny gated norm 4.28
 * fused at 2 against 5.27 unfused at 3; 9B 22.1 against 12.5). */
#define MV_MULTI_FUSE_MAX_N 1536
/* A plain input wider than this is converted once, grid-wide, not in every block: the 9B's
 * 12288-wide FFN down input, formed and converted by form_q8_kernel (swiglu + codes in one
 * launch) in place of a swiglu kernel and 264 blocks each quantizing 12288 values, went
 * 302.6 -> 317.2 tok/s (H200). */
#define MV_X_FUSE_MAX_N 4096
static int mv_fused_rows_max(int mode, int n) {
    if (mode == MV_IN_X && n > MV_X_FUSE_MAX_N) return 0;
    if (mode == MV_IN_NORM2) return n > MV_MULTI_FUSE_MAX_N ? 1 : MV_NORM2_MAX_NT;
    if (mode == MV_IN_NORM || n > MV_MULTI_FUSE_MAX_N) return 1;
    return MV_FUSED_MAX_NT;
}

/* Whether a weight type's matvec quantizes n_tok activation rows itself (as many as
 * mv_fused_rows_max allows for its input): the rows must fit the block's shared memory beside
 * its weight stages (Q4_1 / Q5_0 / Q5_1 stages take 83-99 KB, and took 167-195 KB for two
 * tokens when those ran two rows per warp; the fused kernels' static shared memory is below
 * 1 KB). */
static bool mv_x_fits(const struct cuda_ctx *c, const struct type_entry *te, int n_tok, int stride) {
    const int xb = xs_bytes(te->xf, n_tok, stride);
    return xb <= MV_FUSED_MAX_XBYTES && te->fused_wbytes[n_tok - 1] + xb + 1024 <= c->smem_block_max;
}
static bool mv_fuses(const struct cuda_ctx *c, const struct type_entry *te, int n_tok, int stride, int mode, int n) {
    return n_tok <= mv_fused_rows_max(mode, n) && te->mv_fused[0] && mv_x_fits(c, te, n_tok, stride);
}

/* All token rows: groups of 8 in one launch (grid.y), the rest in a second. converted: x holds
 * the rows already in the weight's activation format (no launch quantizes them itself). */
static void run_matvec(struct cuda_ctx *c, const struct type_entry *te, const mv_params &P, const float *xf,
                       const xact &x, int n_tok, bool converted) {
    if (!converted && mv_fuses(c, te, n_tok, x.stride, P.in.mode, P.n)) {
        if (P.in.mode == MV_IN_NORM2) te->mv_norm2[n_tok - 1](c, type_slot(te), P, xf, x, 0, 1);
        else te->mv_fused[n_tok - 1](c, type_slot(te), P, xf, x, 0, 1);
        return;
    }
    if (n_tok > MV_MAX_NT && te->mmq) {
        te->mmq(c, type_slot(te), P, x, n_tok);
        return;
    }
    if (n_tok == 1 && te->mv_staged && mv_x_fits(c, te, 1, x.stride)) {
        te->mv_staged(c, type_slot(te), P, xf, x, 0, 1);
        return;
    }
    const int full = n_tok / MV_MAX_NT, rem = n_tok % MV_MAX_NT;
    if (full) te->mv[MV_MAX_NT - 1](c, type_slot(te), P, xf, x, 0, full);
    if (rem) te->mv[rem - 1](c, type_slot(te), P, xf, x, MV_MAX_NT * full, 1);
}

/* ys[i] = ws[i] · input rows; in.mode other than X only where every weight's launch fuses.
 * pre: the rows already converted to the one format every weight reads (or NULL). */
static void matmul_n_with(struct cuda_ctx *c, const struct bweight *const *ws, float *const *ys, int n_w,
                          const float *x, int n_tok, const mv_input &in, const xact *pre = NULL) {
    const int n = (int)ws[0]->n_in, stride = x_stride(n);
    xact xa[XF_COUNT];
    memset(xa, 0, sizeof xa);
    for (int f = 0; f < XF_COUNT; f++) xa[f].stride = stride;
    if (pre) {
        for (int f = 0; f < XF_COUNT; f++) xa[f] = *pre;
    } else {
        bool need[XF_COUNT] = {};
        for (int i = 0; i < n_w; i++) {
            const struct type_entry *te = type_get(ws[i]);
            if (!mv_fuses(c, te, n_tok, stride, in.mode, n)) need[te->xf] = true;
        }
        size_t total = 0;
        for (int f = 0; f < XF_COUNT; f++)
            if (need[f]) total += xfmt_layout(f, n_tok, stride, NULL, NULL);
        uint8_t *base = total ? (uint8_t *)cuda_scratch(c, &c->xq, &c->xq_size, total) : NULL;
        size_t off = 0;
        for (int f = 0; f < XF_COUNT; f++) {
            if (!need[f]) continue;
            off += xfmt_layout(f, n_tok, stride, base + off, &xa[f]);
            convert_activations(c, f, x, n, n_tok, xa[f]);
        }
    }
    /* one launch per weight type (per 8 weights of it) */
    for (int i = 0; i < n_w; i++) {
        bool seen = false;
        for (int j = 0; j < i; j++) seen |= ws[j]->type == ws[i]->type;
        if (seen) continue;
        const struct type_entry *te = type_get(ws[i]);
        mv_params P;
        memset(&P, 0, sizeof P);
        P.n = n;
        P.n_units = cuda_cdiv(n, 32);
        P.in = in;
        int rows = 0;
        for (int j = i; j < n_w; j++) {
            if (ws[j]->type != ws[i]->type) continue;
            const int k = P.n_w++;
            P.w[k] = (const uint8_t *)ws[j]->data;
            P.y[k] = ys[j];
            P.rb[k] = ws[j]->row_bytes;
            P.row0[k] = rows;
            P.n_out[k] = (int)ws[j]->n_out;
            rows += (int)ws[j]->n_out;
            P.row0[k + 1] = rows;
            if (P.n_w == MV_MAX_W) {
                run_matvec(c, te, P, x, xa[te->xf], n_tok, pre != NULL);
                P.n_w = 0;
                rows = 0;
            }
        }
        if (P.n_w) run_matvec(c, te, P, x, xa[te->xf], n_tok, pre != NULL);
    }
}

void cuda_matmul_n(struct backend *be, const struct bweight *const *ws, float *const *ys, int n_w,
                   const float *x, int n_tok) {
    struct cuda_ctx *c = cuda_enter(be);
    if (n_w < 1 || n_tok < 1) return;
    matmul_n_with(c, ws, ys, n_w, x, n_tok, MV_PLAIN);
}

void cuda_matmul(struct backend *be, const struct bweight *w, const float *x, int n_tok, float *y) {
    cuda_matmul_n(be, &w, &y, 1, x, n_tok);
}

/* Whether every weight's launch for n_tok rows quantizes its activations itself and so can form
 * them from a fused input, rows up to max_n wide. Every block of the grid forms the whole
 * input, which costs less than a kernel boundary for the norms, the gated norm and the output
 * gate up to 4096 wide (9B, H200: 296 -> 302 tok/s for the norms; with one thread per 32-block
 * quantizing, 4096 had lost, 281 -> 237). A swiglu is formed in the matvec only up to 1024
 * wide: the 9B's 12288-wide one, an expf per element in each of 264 blocks, lost (296 -> 288),
 * and the tiny model's 1152-wide one measured as noise in a build with other changes (notes,
 * session 5; an earlier note here took it for 1024 wide and fused). */
#define MV_FUSE_MAX_N 4096
#define MV_SWIGLU_FUSE_MAX_N 1024
static bool all_fuse(const struct cuda_ctx *c, const struct bweight *const *ws, int n_w, int n_tok, int max_n, int mode) {
    if (ws[0]->n_in > max_n) return false;
    const int stride = x_stride(ws[0]->n_in);
    for (int i = 0; i < n_w; i++)
        if (!mv_fuses(c, type_get(ws[i]), n_tok, stride, mode, (int)ws[0]->n_in)) return false;
    return true;
}

/* Whether every weight reads one Q8 format (*f) from a converter for n_tok rows: the matvec does
 * not quantize a plain input itself there (nor do the prefill tiles read it), so the kernel
 * that forms the input may as well write the codes. */
static bool converted_q8(const struct cuda_ctx *c, const struct bweight *const *ws, int n_w, int n_tok, int *f) {
    const int n = (int)ws[0]->n_in, stride = x_stride(n);
    *f = type_get(ws[0])->xf;
    if ((*f != XF_Q8_0 && *f != XF_Q8_1) || n_tok > MV_MAX_NT) return false;
    for (int i = 0; i < n_w; i++) {
        const struct type_entry *te = type_get(ws[i]);
        if (te->xf != *f || mv_fuses(c, te, n_tok, stride, MV_IN_X, n)) return false;
    }
    return true;
}

/* n_tok rows of format f laid out in the activation scratch, for a kernel that forms and
 * converts a matvec input in one pass. */
static xact converted_scratch(struct cuda_ctx *c, int f, int n_tok, int stride) {
    xact xa;
    uint8_t *base = (uint8_t *)cuda_scratch(c, &c->xq, &c->xq_size, xfmt_layout(f, n_tok, stride, NULL, NULL));
    xfmt_layout(f, n_tok, stride, base, &xa);
    return xa;
}

/* An input formed and converted to format f by form_q8_kernel, in the activation scratch. */
static xact form_q8(struct cuda_ctx *c, const struct bweight *w, const float *x, int n_tok, const mv_input &in, int f) {
    const int n = (int)w->n_in, stride = x_stride(n);
    const xact xa = converted_scratch(c, f, n_tok, stride);
    const int items = n_tok * (stride / 32) * 8;
    cuda_launch(c, cuda_cdiv(items, 256), 256, form_q8_kernel, x, n, n_tok, stride, in, (int8_t *)xa.q, (float *)xa.d,
                f == XF_Q8_1 ? (float *)xa.s : (float *)NULL);
    return xa;
}

/* A formed input converted by form_q8_kernel, then the matvecs. */
static void form_q8_matmul(struct cuda_ctx *c, const struct bweight *w, const float *x, int n_tok, const mv_input &in,
                           int f, float *y) {
    const xact xa = form_q8(c, w, x, n_tok, in, f);
    matmul_n_with(c, &w, &y, 1, x, n_tok, MV_PLAIN, &xa);
}

void cuda_norm_matmul_n(struct backend *be, const float *x, const float *m, float *x_out, const float *w, float eps,
                        float *a, const struct bweight *const *ws, float *const *ys, int n_w, int n_tok) {
    struct cuda_ctx *c = cuda_enter(be);
    if (n_w < 1 || n_tok < 1) return;
    if (all_fuse(c, ws, n_w, n_tok, MV_FUSE_MAX_N, MV_IN_NORM)) {
        matmul_n_with(c, ws, ys, n_w, x, n_tok, mv_input{MV_IN_NORM, m, w, x_out, a, eps, 0, 0, 0, NULL});
        return;
    }
    /* where the matvec would run after a converter (one Q8 format for every weight; not the
     * prefill tiles): the norm kernel writes the codes too, one launch fewer per site of a
     * verify batch (3 rows, H200: 4.92 -> 4.41 µs per site, tiny mtp:2 +2%); at 2 rows the
     * matvec quantizes a plain input itself, which measured faster end to end (mtp:1 -1.5%
     * with the codes from the norm kernel) */
    const int n = (int)ws[0]->n_in, stride = x_stride(n);
    int f;
    if (converted_q8(c, ws, n_w, n_tok, &f)) {
        const xact xa = converted_scratch(c, f, n_tok, stride);
        cuda_launch(c, n_tok, CUDA_NORM_THREADS, norm_q8_rows_kernel, x, m, x_out, w, n, eps, a, stride, (int8_t *)xa.q,
                    (float *)xa.d, f == XF_Q8_1 ? (float *)xa.s : (float *)NULL);
        matmul_n_with(c, ws, ys, n_w, a, n_tok, MV_PLAIN, &xa);
        return;
    }
    cuda_norm_rows(c, x, m, x_out, w, n_tok, n, eps, a);
    matmul_n_with(c, ws, ys, n_w, a, n_tok, MV_PLAIN);
}

void cuda_swiglu_matmul(struct backend *be, const struct bweight *w, float *g, const float *u, int n_tok, float *y) {
    struct cuda_ctx *c = cuda_enter(be);
    if (n_tok < 1) return;
    if (all_fuse(c, &w, 1, n_tok, MV_SWIGLU_FUSE_MAX_N, MV_IN_SWIGLU)) {
        matmul_n_with(c, &w, &y, 1, g, n_tok, mv_input{MV_IN_SWIGLU, u, NULL, NULL, NULL, 0.0f, 0, 0, 0, NULL});
        return;
    }
    int f;
    if (converted_q8(c, &w, 1, n_tok, &f)) {
        form_q8_matmul(c, w, g, n_tok, mv_input{MV_IN_SWIGLU, u, NULL, NULL, NULL, 0.0f, 0, 0, 0, NULL}, f, y);
        return;
    }
    cuda_swiglu(be, g, u, (int64_t)n_tok * w->n_in, g);
    matmul_n_with(c, &w, &y, 1, g, n_tok, MV_PLAIN);
}

/* Whether a one-token Q8_0 matvec runs as a form kernel + matvec_q8_0_direct_kernel: at most a
 * row per warp of its grid, and an input wide enough that forming it in every
 * block costs more than the form kernel's launch. H200, against the fused staged matvec: 9B
 * (4096-wide out- / o-projections) 330.3 -> 345.1 tok/s; the tiny model (384-512 wide) off -3%,
 * mtp:2 -2%, so the width bound lies between. */
#define MV_DIRECT_MIN_N 2048
static bool mv_direct_fits(const struct cuda_ctx *c, const struct bweight *w, int n_tok) {
    return n_tok == 1 && w->type == GGML_TYPE_Q8_0 && w->n_in >= MV_DIRECT_MIN_N &&
           w->n_out <= (int64_t)MV_DIRECT_PER_SM * c->n_sm * MV_WARPS;
}

static void mv_direct(struct cuda_ctx *c, const struct bweight *w, const xact &x, float *y) {
    const int grid = COTI_MIN(cuda_cdiv((int)w->n_out, MV_WARPS), MV_DIRECT_PER_SM * c->n_sm);
    cuda_launch(c, grid, MV_WARPS * 32, matvec_q8_0_direct_kernel, (const uint8_t *)w->data, w->row_bytes,
                (int)((w->n_in + 31) / 32), (int)w->n_out, x, y);
}

void cuda_rmsnorm_gated_matmul(struct backend *be, const float *x, const float *w, const float *z, int dim, float eps,
                               float *a, const struct bweight *wt, int n_tok, float *y) {
    struct cuda_ctx *c = cuda_enter(be);
    if (n_tok < 1) return;
    const int n_grp = (int)(wt->n_in / dim);
    if (mv_direct_fits(c, wt, n_tok) && wt->n_in % dim == 0 && dim % 128 == 0) {
        const xact xa = converted_scratch(c, XF_Q8_0, 1, x_stride(wt->n_in));
        cuda_launch(c, n_grp, 32, gnorm_q8_kernel, x, z, w, dim, eps, (int8_t *)xa.q, (float *)xa.d);
        mv_direct(c, wt, xa, y);
        return;
    }
    if (all_fuse(c, &wt, 1, n_tok, MV_FUSE_MAX_N, MV_IN_GNORM) && wt->n_in % dim == 0 && n_tok * n_grp <= MV_GNORM_MAX_GROUPS) {
        matmul_n_with(c, &wt, &y, 1, x, n_tok, mv_input{MV_IN_GNORM, z, w, NULL, NULL, eps, dim, 0, 0, NULL});
        return;
    }
    cuda_rmsnorm_gated(be, x, w, z, n_tok * n_grp, dim, eps, a);
    matmul_n_with(c, &wt, &y, 1, a, n_tok, MV_PLAIN);
}

void cuda_norm2_matmul(struct backend *be, const float *x1, const float *w1, const float *x2, const float *w2, int dim,
                       float eps, float *a, const struct bweight *wt, int n_tok, float *y) {
    struct cuda_ctx *c = cuda_enter(be);
    if (n_tok < 1) return;
    /* a draft row, or the NextN pass over a verify batch's rows: the matvec forms both halves
     * itself (a warp per row half), three launches fewer */
    if (wt->n_in == 2 * (int64_t)dim && all_fuse(c, &wt, 1, n_tok, MV_FUSE_MAX_N, MV_IN_NORM2)) {
        matmul_n_with(c, &wt, &y, 1, x1, n_tok, mv_input{MV_IN_NORM2, x2, w1, NULL, NULL, eps, dim, 0, 0, w2});
        return;
    }
    cuda_rmsnorm(be, x1, dim, w1, n_tok, dim, eps, a, 2 * dim);
    cuda_rmsnorm(be, x2, dim, w2, n_tok, dim, eps, a + dim, 2 * dim);
    matmul_n_with(c, &wt, &y, 1, a, n_tok, MV_PLAIN);
}

void cuda_mul_sigmoid_matmul(struct backend *be, float *x, const float *gate, int n_head, int dim, int gate_stride,
                             int gate_head_stride, const struct bweight *wt, int n_tok, float *y) {
    struct cuda_ctx *c = cuda_enter(be);
    if (n_tok < 1) return;
    const mv_input in{MV_IN_SIGMOID, gate, NULL, NULL, NULL, 0.0f, dim, gate_stride, gate_head_stride, NULL};
    if (mv_direct_fits(c, wt, n_tok) && wt->n_in == (int64_t)n_head * dim) {
        mv_direct(c, wt, form_q8(c, wt, x, 1, in, XF_Q8_0), y);
        return;
    }
    if (all_fuse(c, &wt, 1, n_tok, MV_FUSE_MAX_N, MV_IN_SIGMOID) && wt->n_in == (int64_t)n_head * dim) {
        matmul_n_with(c, &wt, &y, 1, x, n_tok, in);
        return;
    }
    int f;
    if (wt->n_in == (int64_t)n_head * dim && converted_q8(c, &wt, 1, n_tok, &f)) {
        form_q8_matmul(c, wt, x, n_tok, in, f, y);
        return;
    }
    cuda_mul_sigmoid(be, x, gate, n_tok, n_head, dim, gate_stride, gate_head_stride);
    matmul_n_with(c, &wt, &y, 1, x, n_tok, MV_PLAIN);
}

void cuda_get_rows(struct backend *be, const struct bweight *w, const int32_t *ids, int n, float *out) {
    struct cuda_ctx *c = cuda_enter(be);
    if (n < 1) return;
    type_get(w)->rows(c, w, ids, n, out);
}

CUDA_TRACE_TU(matmul)
