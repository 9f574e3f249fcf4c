/* matmul.cu — matmul / matmul_n / get_rows for F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
 * Q4_K, Q5_K and Q6_K weights, kept on the device in their GGUF block layout.
 *
 * Numerics: the CPU path's, with only the f32 summation order changed. Activations are
 * converted on the device to the weight type's vec_dot type by the reference rules of
 * quant-formats.md §5.1 (Q8_0 for Q8_0/Q4_0/Q5_0, Q8_1 for Q4_1/Q5_1, Q8_K for the K-quants,
 * f16 / bf16 for F16 / BF16; F32 stays f32), producing the same codes and scales bit for bit.
 * Every block's integer sum is exact (dp4a) and its float scale products are formed in the
 * reference's order with non-contracted multiplies; blocks are then summed in f32 in a
 * different order than the CPU's (per lane, then a warp butterfly), and K-quant blocks are
 * summed per 32-element sub-block. So an output differs from the CPU reference by f32
 * reassociation alone: |Δ| ≲ n_in · 2^-24 · Σ|w_i x_i| in the worst case, ~1e-6 relative in
 * practice (tests/cuda/test_cuda_ops.c bounds it by 1e-5 of Σ|w_i x_i| per output).
 *
 * Kernels (one per weight type and token count):
 * - matvec (any n_tok, in groups of up to 8 tokens per launch): a warp owns R weight rows (R = 1
 *   for one token, 2 for 2-3, 4 for 4-8, so an activation load serves R rows) and streams them
 *   in chunks: cp.async copies each chunk's 16-byte-aligned span (any row alignment works)
 *   into the warp's shared memory, two stages deep, so the next chunk is in flight while lanes
 *   decode the current one. A lane takes whole 32-element units (a 32-block, or an eighth of
 *   a K super-block): unit u of every row goes to lane u % 32, in increasing u, so an output's
 *   value depends only on its row and its token's activations, never on n_tok, R or the
 *   group: a verify batch reproduces plain decode bit for bit. The first chunk is requested
 *   before the kernel waits for the previous kernel (programmatic dependent launch): weight
 *   bytes stream while the activations are still being converted.
 * - Several weights of one type in matmul_n share one launch; activations are converted once
 *   per distinct vec_dot type. */
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

/* Q8_0 / Q8_1 by quant.c's reference rule: one warp per 32 values. */
__global__ void quant_q8_0_kernel(const float *__restrict__ x, int n, int n_tok, int stride,
                                  int8_t *__restrict__ q, float *__restrict__ d, float *__restrict__ s) {
    cuda_pdl_begin();
    const int nb = stride / 32;
    const int gw = blockIdx.x * 8 + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (gw >= n_tok * nb) return;
    const int t = gw / nb, b = gw % nb, e = 32 * b + lane;
    const float v = e < n ? x[(size_t)t * n + e] : 0.0f;
    const float amax = cuda_warp_max(fabsf(v));
    const float dd = amax / 127.0f, id = dd != 0.0f ? 1.0f / dd : 0.0f;
    const float r = v * id;
    int qi = !(r == r) ? 0 : r >= 127.0f ? 127 : r <= -127.0f ? -127 : (int)roundf(r);
    q[(size_t)t * stride + e] = (int8_t)qi;
    if (s) {
        const int sum = cuda_warp_sum_i(qi);
        if (lane == 0) s[(size_t)t * nb + b] = __half2float(__float2half_rn((float)sum * dd));
    }
    if (lane == 0) d[(size_t)t * nb + b] = __half2float(__float2half_rn(dd));
}

/* Q8_K by quant_k.c's reference rule: one warp per 256 values, 8 per lane. The scale comes
 * from the signed value of largest magnitude, the first one on ties. */
__global__ void quant_q8_K_kernel(const float *__restrict__ x, int n, int n_tok, int stride,
                                  int8_t *__restrict__ q, float *__restrict__ d, int16_t *__restrict__ bs) {
    cuda_pdl_begin();
    const int nb = stride / 256;
    const int gw = blockIdx.x * 8 + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (gw >= n_tok * nb) return;
    const int t = gw / nb, b = gw % nb;
    float v[8];
    float amax = 0.0f, mx = 0.0f;
    int idx = 1 << 30;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int e = 256 * b + 8 * lane + i;
        v[i] = e < n ? x[(size_t)t * n + e] : 0.0f;
        if (fabsf(v[i]) > amax) { amax = fabsf(v[i]); mx = v[i]; idx = 8 * lane + i; }
    }
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
    *(uint2 *)(q + (size_t)t * stride + 256 * b + 8 * lane) = make_uint2(w0, w1);
    sum += __shfl_xor_sync(0xFFFFFFFFu, sum, 1);
    if ((lane & 1) == 0) bs[(size_t)t * (stride / 16) + 16 * b + lane / 2] = (int16_t)sum;
    if (lane == 0) d[(size_t)t * nb + b] = dd;
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
        const int blocks = n_tok * (stride / 32);
        cuda_launch(c, cuda_cdiv(blocks, 8), 256, quant_q8_0_kernel, x, n, n_tok, stride, (int8_t *)xa.q,
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

template <int XF> __device__ __forceinline__ uxs load_xs(const xact &x, size_t t, int u) {
    uxs r;
    if constexpr (XF == XF_Q8_K) {
        r.d = __ldg(x.d + t * (x.stride / 256) + u / 8);
        const int16_t *bs = x.bs + t * (x.stride / 16) + 2 * u;
        r.b = (int)__ldg(bs) + (int)__ldg(bs + 1);
        r.s = 0.0f;
    } else {
        const size_t i = t * (x.stride / 32) + u;
        r.d = __ldg(x.d + i);
        r.s = XF == XF_Q8_1 ? __ldg(x.s + i) : 0.0f;
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

/* One unit of R quantized rows (smem offsets off[r]) against NT token rows. */
template <int T, int NT, int R>
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
        const int4 xa = __ldg(xp), xb = __ldg(xp + 1);
        const uxs xs = load_xs<Q::XF>(x, t, u);
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
#define MV_WARPS 4

struct mv_params {
    const uint8_t *w[MV_MAX_W];
    float *y[MV_MAX_W];
    size_t rb[MV_MAX_W];
    int row0[MV_MAX_W + 1];   /* first global row of each weight; row0[n_w] = all rows */
    int n_out[MV_MAX_W];
    int n_w;
    int n;                    /* elements per row */
    int n_units;              /* 32-element units per row */
};

/* Shapes of a matvec instance: R rows per warp, CU units of each row per chunk. Sized so a
 * block's shared memory (2 stages) stays under ~25 KB: 8 blocks of 4 warps fit on an SM, so a
 * 4096-row matrix is a single wave with every row's first two chunks in flight at once. */
template <int T, int NT> struct mv_shape {
    enum {
        FLOAT = T == GGML_TYPE_F16 || T == GGML_TYPE_BF16 || T == GGML_TYPE_F32,
        R = FLOAT ? 1 : NT == 1 ? 1 : NT <= 3 ? 2 : 4,
        UR = qt<T>::U / R > 1 ? qt<T>::U / R : 1,
        CU = 32 * UR,                                       /* units per row per chunk */
        CB = CU / qt<T>::UPB * qt<T>::BB,                   /* bytes per row per chunk */
        SLOT = ((CB + 30) / 16) * 16 + 16,                  /* aligned span + read slack */
    };
};

__device__ __forceinline__ void cp_async16(uint8_t *smem, const void *gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait1() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }

template <int T, int NT>
__global__ void __launch_bounds__(MV_WARPS * 32) matvec_kernel(const mv_params P, const xact x, int t_base) {
    typedef qt<T> Q;
    typedef mv_shape<T, NT> S;
    constexpr int R = S::R, CU = S::CU, SLOT = S::SLOT;
    __shared__ __align__(16) uint8_t smem[MV_WARPS][2][R][SLOT];
    cuda_pdl_trigger();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int total = P.row0[P.n_w];
    const int row_first = (blockIdx.x * MV_WARPS + warp) * R;
    if (row_first >= total) return;
    /* this warp's rows; rows past the end repeat the last one (their results are dropped) */
    const uint8_t *wrow[R];
    int wi[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int row = min(row_first + r, total - 1);
        int k = 0;
        while (k + 1 < P.n_w && row >= P.row0[k + 1]) k++;
        wi[r] = k;
        wrow[r] = P.w[k] + (size_t)(row - P.row0[k]) * P.rb[k];
    }
    const int n_chunks = (P.n_units + CU - 1) / CU;
    /* copy chunk ch of every row into stage st, one commit group */
    auto issue = [&](int ch, int st) {
        const int u0 = ch * CU, uend = min(u0 + CU, P.n_units);
#pragma unroll
        for (int r = 0; r < R; r++) {
            const uint8_t *gs = wrow[r] + (size_t)(u0 / Q::UPB) * Q::BB;
            const uint8_t *ge = wrow[r] + (size_t)((uend + Q::UPB - 1) / Q::UPB) * Q::BB;
            const uint8_t *a0 = (const uint8_t *)((uintptr_t)gs & ~(uintptr_t)15);
            const int n16 = (int)((ge - a0 + 15) / 16);
            for (int i = lane; i < n16; i += 32) cp_async16(&smem[warp][st][r][16 * i], a0 + 16 * i);
        }
        cp_async_commit();
    };
    issue(0, 0);
    cuda_pdl_wait(); /* activations come from the previous kernel */
    const int t0 = t_base + blockIdx.y * NT;
    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int j = 0; j < NT; j++) acc[r][j] = 0.0f;

    for (int ch = 0; ch < n_chunks; ch++) {
        const int st = ch & 1;
        if (ch + 1 < n_chunks) issue(ch + 1, st ^ 1);
        else cp_async_commit(); /* an empty group keeps the wait count uniform */
        cp_async_wait1();
        __syncwarp();
        const int u0 = ch * CU, uend = min(u0 + CU, P.n_units);
        const uint8_t *sm[R];
        int off0[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            sm[r] = &smem[warp][st][r][0];
            off0[r] = (int)((uintptr_t)(wrow[r] + (size_t)(u0 / Q::UPB) * Q::BB) & 15);
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
                else unit_dot<T, NT, R>(sm, off, ul % Q::UPB, x, t0, u, acc);
            }
        }
        __syncwarp(); /* this stage is refilled by the next iteration's issue */
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int j = 0; j < NT; j++) acc[r][j] = cuda_warp_sum(acc[r][j]);
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int row = row_first + r;
            if (row >= total) break;
            float *y = P.y[wi[r]] + (row - P.row0[wi[r]]);
            const size_t ldy = (size_t)P.n_out[wi[r]];
#pragma unroll
            for (int j = 0; j < NT; j++) y[(size_t)(t0 + j) * ldy] = acc[r][j];
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

typedef void (*mv_launch_fn)(struct cuda_ctx *c, const mv_params &P, const xact &x, int t_base, int n_groups);
typedef void (*rows_launch_fn)(struct cuda_ctx *c, const struct bweight *w, const int32_t *ids, int n, float *out);

template <int T, int NT>
static void mv_launch(struct cuda_ctx *c, const mv_params &P, const xact &x, int t_base, int n_groups) {
    const dim3 grid(cuda_cdiv(P.row0[P.n_w], MV_WARPS * mv_shape<T, NT>::R), n_groups);
    cuda_launch(c, grid, MV_WARPS * 32, matvec_kernel<T, NT>, P, x, t_base);
}

template <int T>
static void rows_launch(struct cuda_ctx *c, const struct bweight *w, const int32_t *ids, int n, float *out) {
    const dim3 grid(cuda_cdiv(w->n_in, 256), n);
    cuda_launch(c, grid, 256, get_rows_kernel<T>, (const uint8_t *)w->data, w->row_bytes, ids, (int)w->n_in, out);
}

struct type_entry {
    enum ggml_type type;
    int xf;
    mv_launch_fn mv[8];        /* [NT - 1] */
    rows_launch_fn rows;
};

#define TYPE_ENTRY(T)                                                                          \
    {T, qt<T>::XF,                                                                             \
     {mv_launch<T, 1>, mv_launch<T, 2>, mv_launch<T, 3>, mv_launch<T, 4>, mv_launch<T, 5>,     \
      mv_launch<T, 6>, mv_launch<T, 7>, mv_launch<T, 8>},                                      \
     rows_launch<T>}

static const struct type_entry type_table[] = {
    TYPE_ENTRY(GGML_TYPE_F32),  TYPE_ENTRY(GGML_TYPE_F16),  TYPE_ENTRY(GGML_TYPE_BF16),
    TYPE_ENTRY(GGML_TYPE_Q8_0), TYPE_ENTRY(GGML_TYPE_Q4_0), TYPE_ENTRY(GGML_TYPE_Q4_1),
    TYPE_ENTRY(GGML_TYPE_Q5_0), TYPE_ENTRY(GGML_TYPE_Q5_1), TYPE_ENTRY(GGML_TYPE_Q4_K),
    TYPE_ENTRY(GGML_TYPE_Q5_K), TYPE_ENTRY(GGML_TYPE_Q6_K),
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

/* All token rows: groups of 8 in one launch (grid.y), the rest in a second. */
static void run_matvec(struct cuda_ctx *c, const struct type_entry *te, const mv_params &P, const xact &x, int n_tok) {
    const int full = n_tok / 8, rem = n_tok % 8;
    if (full) te->mv[7](c, P, x, 0, full);
    if (rem) te->mv[rem - 1](c, P, x, 8 * full, 1);
}

void cuda_matmul_n(struct backend *be, const struct bweight *const *ws, float *const *ys, int n_w,
                   const float *x, int n_tok) {
    struct cuda_ctx *c = cuda_enter(be);
    if (n_w < 1 || n_tok < 1) return;
    const int n = (int)ws[0]->n_in, stride = (n + 255) & ~255;
    bool need[XF_COUNT] = {};
    for (int i = 0; i < n_w; i++) need[type_get(ws[i])->xf] = true;
    size_t total = 0;
    for (int f = 0; f < XF_COUNT; f++)
        if (need[f]) total += xfmt_layout(f, n_tok, stride, NULL, NULL);
    uint8_t *base = (uint8_t *)cuda_scratch(c, &c->xq, &c->xq_size, total);
    xact xa[XF_COUNT] = {};
    size_t off = 0;
    for (int f = 0; f < XF_COUNT; f++) {
        if (!need[f]) continue;
        off += xfmt_layout(f, n_tok, stride, base + off, &xa[f]);
        convert_activations(c, f, x, n, n_tok, xa[f]);
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
                run_matvec(c, te, P, xa[te->xf], n_tok);
                P.n_w = 0;
                rows = 0;
            }
        }
        if (P.n_w) run_matvec(c, te, P, xa[te->xf], n_tok);
    }
}

void cuda_matmul(struct backend *be, const struct bweight *w, const float *x, int n_tok, float *y) {
    cuda_matmul_n(be, &w, &y, 1, x, n_tok);
}

void cuda_get_rows(struct backend *be, const struct bweight *w, const int32_t *ids, int n, float *out) {
    struct cuda_ctx *c = cuda_enter(be);
    if (n < 1) return;
    type_get(w)->rows(c, w, ids, n, out);
}
