/* matmul.cuh — what the CUDA matmul's files share: the activation formats (converted rows on
 * the device) and their Q8 quantization, the weight types' unit decoders (qt<T>), the fused
 * input description a matvec forms (mv_input), the launch parameters (mv_params), the weight
 * types the matmul computes (CUDA_MM_TYPES, in slot order) and the entry points between the
 * files:
 *   matmul_input.cu   activation conversion and the kernels that form an input and its codes
 *   matvec.cu         the matvec kernel (<= 8 rows: converted, staged, fused) and the direct one
 *   matmul_tiles.cu   the int8 tensor-core tiles (prefill)
 *   get_rows.cu       embedding rows, exact dequantization
 *   matmul_choose.cu  the matmul op: which of these runs for which input, type and shape
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
 *   the CPU reference. F32/F16/BF16 weights use the matvec in groups of 8 tokens. */
#ifndef COTI_CUDA_MATMUL_CUH
#define COTI_CUDA_MATMUL_CUH

#include "cuda_internal.cuh"

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

static inline size_t align256(size_t v) { return (v + 255) & ~(size_t)255; }

/* Elements per converted activation row of n values: n rounded up to 256, the padding zero. */
static inline int x_stride(int64_t n) { return (int)align256((size_t)n); }

/* Bytes of format f for n_tok rows; if base is given, also lay the parts out from it. */
static inline size_t xfmt_layout(int f, int n_tok, int stride, uint8_t *base, xact *xa) {
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

/* ---- matvec limits, fused inputs, launch parameters --------------------------------------- */

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
#define MV_GNORM_MAX_GROUPS 128  /* token rows x groups whose scales a fused launch keeps */

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

/* The weight of P that global row `row` falls in (P.row0 is increasing). */
__device__ __forceinline__ int mv_weight_of(const mv_params &P, int row) {
    int k = 0;
    while (k + 1 < P.n_w && row >= P.row0[k + 1]) k++;
    return k;
}
/* The bytes of global row `row` of P. */
__device__ __forceinline__ const uint8_t *mv_row_bytes(const mv_params &P, int row) {
    const int k = mv_weight_of(P, row);
    return P.w[k] + (size_t)(row - P.row0[k]) * P.rb[k];
}

/* cp.async of the storage blocks that hold units [u0, uend) of a type-T row into dst: the
 * 16-byte-aligned span around them (dst's copy starts at the row bytes' address & 15), 16
 * bytes at a time, this thread taking copies first, first + step, ... (no commit). */
template <int T>
__device__ __forceinline__ void stage_row_units(const uint8_t *row, int u0, int uend, uint8_t *dst, int first, int step) {
    typedef qt<T> Q;
    const uint8_t *gs = row + (size_t)(u0 / Q::UPB) * Q::BB;
    const uint8_t *ge = row + (size_t)((uend + Q::UPB - 1) / Q::UPB) * Q::BB;
    const uint8_t *a0 = (const uint8_t *)((uintptr_t)gs & ~(uintptr_t)15);
    const int n16 = (int)((ge - a0 + 15) / 16);
    for (int i = first; i < n16; i += step) cp_async16(dst + 16 * i, a0 + 16 * i);
}

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

/* The direct kernel's blocks per SM (its register bound). */
#define MV_DIRECT_PER_SM 2

/* ---- the weight types, and the entry points between the matmul's files --------------------- */

/* The weight types the matmul computes, in slot order: the per-type tables of matvec.cu,
 * matmul_tiles.cu and get_rows.cu are written from these lists, and the per-kernel caches of
 * struct cuda_ctx are indexed by slot. */
#define CUDA_MM_FLOAT_TYPES(X) X(GGML_TYPE_F32) X(GGML_TYPE_F16) X(GGML_TYPE_BF16)
#define CUDA_MM_QUANT_TYPES(X)                                                                       \
    X(GGML_TYPE_Q8_0) X(GGML_TYPE_Q4_0) X(GGML_TYPE_Q4_1) X(GGML_TYPE_Q5_0) X(GGML_TYPE_Q5_1)        \
    X(GGML_TYPE_Q4_K) X(GGML_TYPE_Q5_K) X(GGML_TYPE_Q6_K)
#define CUDA_MM_TYPES(X) CUDA_MM_FLOAT_TYPES(X) CUDA_MM_QUANT_TYPES(X)

/* A weight type's slot, or -1 where the matmul does not compute it. */
static inline int cuda_mm_slot(enum ggml_type t) {
#define CUDA_MM_LIST(T) T,
    static const enum ggml_type types[] = {CUDA_MM_TYPES(CUDA_MM_LIST)};
#undef CUDA_MM_LIST
    for (int i = 0; i < (int)(sizeof types / sizeof types[0]); i++)
        if (types[i] == t) return i;
    return -1;
}

typedef void (*mv_launch_fn)(struct cuda_ctx *c, int slot, const mv_params &P, const float *xf, const xact &x,
                             int t_base, int n_groups);

/* matvec.cu: a weight type's matvec launches (NULL where a kernel form does not exist: the
 * float types are never fused, staged or tiled) and what the choice reads about them. */
struct mv_type {
    int slot;
    int xf;                                 /* the activation format its kernels read */
    bool quantized;
    mv_launch_fn mv[MV_MAX_NT];             /* [NT - 1], activations converted by a separate kernel */
    mv_launch_fn mv_fused[MV_FUSED_MAX_NT]; /* [NT - 1], quantized (and formed) in the kernel */
    mv_launch_fn mv_norm2[MV_NORM2_MAX_NT]; /* [NT - 1], the NORM2 input formed in the kernel */
    mv_launch_fn mv_staged;                 /* one converted token, copied to shared memory first */
    int fused_wbytes[MV_NORM2_MAX_NT];      /* [NT - 1]: their weight stages' shared memory */
};
const struct mv_type *mv_type_find(enum ggml_type t);
/* y = w · one token of Q8_0 codes x (the direct kernel; w Q8_0). */
void mv_direct(struct cuda_ctx *c, const struct bweight *w, const xact &x, float *y);

/* The tensor-core tiles' epilogue (matmul_tiles.cu, matmul_f16.cu): output row `row` of P (the
 * weight it falls in) for the 8 tokens t0 + 8·ni + e (ni < 4, e < 2) that a lane holds in
 * acc[ni][2h + e] (an mma's c0 c1 for h 0, c2 c3 for h 1); rows past the launch's `total` and
 * tokens past n_tok are dropped. */
__device__ __forceinline__ void tile_store_row(const mv_params &P, int row, int total, const float (&acc)[4][4], int h,
                                               int t0, int n_tok) {
    if (row >= total) return;
    const int k = mv_weight_of(P, row);
    float *y = P.y[k] + (row - P.row0[k]);
    const size_t ldy = (size_t)P.n_out[k];
#pragma unroll
    for (int ni = 0; ni < 4; ni++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int t = t0 + ni * 8 + e;
            if (t < n_tok) y[(size_t)t * ldy] = acc[ni][2 * h + e];
        }
}

/* matmul_tiles.cu: P's rows against n_tok converted rows by the tensor-core tiles (quantized
 * types). */
void mmq_run(struct cuda_ctx *c, int slot, const mv_params &P, const xact &x, int n_tok);
/* matmul_f16.cu: the same on f16 tensor cores, x f16 rows (XF_F16), P.n a multiple of 32: not
 * bit-identical to the reference (prompts only). */
#define MMF_K_MULTIPLE 32
void mmf_run(struct cuda_ctx *c, int slot, const mv_params &P, const xact &x, int n_tok);

/* matmul_input.cu */
void convert_activations(struct cuda_ctx *c, int f, const float *x, int n, int n_tok, const xact &xa);
/* n_tok rows of format f laid out in the activation scratch, for a kernel that forms and
 * converts a matvec input in one pass. */
xact converted_scratch(struct cuda_ctx *c, int f, int n_tok, int stride);
/* x_out = x + m (m may be NULL), a = rmsnorm of that ⊙ w, and a's Q8_0 / Q8_1 codes (format f)
 * in the scratch, rows of n, in one launch. */
xact norm_q8(struct cuda_ctx *c, const float *x, const float *m, float *x_out, const float *w, float eps, float *a,
             int n, int n_tok, int f);
/* A swiglu or output-gate input (in.mode) of n_tok rows of n formed and converted to format f. */
xact form_q8(struct cuda_ctx *c, const float *x, int n, int n_tok, const mv_input &in, int f);
/* One token's delta-net gated norm (groups of dim, n wide) as Q8_0 codes, for the direct kernel. */
xact gnorm_q8(struct cuda_ctx *c, const float *x, const float *z, const float *w, int dim, float eps, int n);
/* The same as Q8_K codes (n a multiple of dim), for the staged matvec of the K-quants. */
xact gnorm_q8K(struct cuda_ctx *c, const float *x, const float *z, const float *w, int dim, float eps, int n);

#endif
