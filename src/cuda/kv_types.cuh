/* kv_types.cuh — the KV cache's element types on the device: a warp's store of one head row
 * (attn_prep and kv_store) and a lane's load of its elements of a cached head row (attention),
 * for f16, bf16, q8_0 and q4_0 (kv.h's kv_types), and the dispatch of a kernel template over a
 * view's K and V types.
 *
 * Stores follow quant.c's reference rules bit for bit, so a row is the same bytes whichever
 * op or batch stored it and whatever the CPU stores for the same floats: q8_0 d = amax/127,
 * codes roundf(x·(1/d)) clamped to ±127; q4_0 d = (the signed value of largest magnitude, the
 * first on ties)/-8, codes trunc(x·(1/d) + 8.5) clamped to [0, 15]; products and sums rounded
 * one at a time (no FMA contraction), as the host's compiler does them. Loads give the codes and d
 * apart (d·code is exact in f32; a reader applies d once per 8 elements). */
#ifndef COTI_CUDA_KV_TYPES_CUH
#define COTI_CUDA_KV_TYPES_CUH

#include "cuda_internal.cuh"

/* One head row x[0, D) stored by the 32 lanes of a warp at dst, in type T (D a multiple of 32
 * for the block types: kv_type_ok). x is read by every lane: the caller synchronised the warp
 * after writing it. */
template <int T> __device__ __forceinline__ void kv_store_head(uint8_t *dst, const float *x, int D, int lane) {
    if constexpr (T == GGML_TYPE_F16 || T == GGML_TYPE_BF16) {
        uint16_t *d16 = (uint16_t *)dst;
        for (int i = lane; i < D; i += 32) d16[i] = T == GGML_TYPE_F16 ? cuda_f2h(x[i]) : cuda_f2bf(x[i]);
    } else if constexpr (T == GGML_TYPE_Q8_0) {
        for (int b = 0; b < D / 32; b++) {
            uint8_t *blk = dst + 34 * (size_t)b;
            const float v = x[32 * b + lane];
            const float amax = cuda_warp_max(fabsf(v));
            const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            const float s = __fmul_rn(v, id);
            const int q = !(s == s) ? 0 : s >= 127.0f ? 127 : s <= -127.0f ? -127 : (int)roundf(s);
            if (lane == 0) *(uint16_t *)blk = cuda_f2h(d);
            blk[2 + lane] = (uint8_t)(int8_t)q;
        }
    } else {
        static_assert(T == GGML_TYPE_Q4_0, "a KV type");
        for (int b = 0; b < D / 32; b++) {
            uint8_t *blk = dst + 18 * (size_t)b;
            const float v = x[32 * b + lane];
            /* the value of largest magnitude, the lowest lane on ties (the reference's scan keeps
             * the first strictly larger one) */
            float a = fabsf(v), m = v;
            int at = lane;
            for (int o = 16; o > 0; o >>= 1) {
                const float a2 = __shfl_xor_sync(0xFFFFFFFFu, a, o), m2 = __shfl_xor_sync(0xFFFFFFFFu, m, o);
                const int at2 = __shfl_xor_sync(0xFFFFFFFFu, at, o);
                if (a2 > a || (a2 == a && at2 < at)) { a = a2; m = m2; at = at2; }
            }
            if (a == 0.0f) m = 0.0f; /* all zero (or -0): the reference's max stays 0 */
            const float d = m / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            const float s = __fadd_rn(__fmul_rn(v, id), 8.5f);
            const int q = !(s >= 0.0f) ? 0 : s >= 15.0f ? 15 : (int)s;
            const int hi = __shfl_down_sync(0xFFFFFFFFu, q, 16);
            if (lane == 0) *(uint16_t *)blk = cuda_f2h(d);
            if (lane < 16) blk[2 + lane] = (uint8_t)(q | (hi << 4));
        }
    }
}

/* Small integers to f32 without I2F (a quarter-rate pipe on sm_90, the attention loop's
 * bottleneck for block caches): the integer (biased to >= 0) becomes the low mantissa bits of
 * 2^23, and the subtraction of 2^23 + bias is exact, so the float is the one I2F gives. */
__device__ __forceinline__ float kv_s8_to_f32(uint32_t word, int byte) { /* signed byte `byte` of word */
    return __uint_as_float(__byte_perm(word ^ 0x80808080u, 0x4B000000u, 0x7540 + byte)) - 8388736.0f;
}
__device__ __forceinline__ float kv_q4_to_f32(uint32_t nibble) { /* a q4_0 code 0..15: nibble - 8 */
    return __uint_as_float(0x4B000000u | nibble) - 8388616.0f;
}

/* Elements [e, e + 8) of a cached head row at p (e a multiple of 8): into o the values (float
 * types) or the codes (block types, exact in f32), and returned the factor that makes the
 * codes values, the block's d (1 for the float types): a reader multiplies once per 8. */
template <int T> constexpr bool kv_scaled = T == GGML_TYPE_Q8_0 || T == GGML_TYPE_Q4_0;
template <int T> __device__ __forceinline__ float kv_load8(const uint8_t *p, int e, float *o) {
    if constexpr (T == GGML_TYPE_F16 || T == GGML_TYPE_BF16) {
        const uint4 v = *(const uint4 *)(p + 2 * (size_t)e);
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if constexpr (T == GGML_TYPE_F16) {
                const float2 f = __half22float2(*(const __half2 *)&w[i]);
                o[2 * i] = f.x;
                o[2 * i + 1] = f.y;
            } else {
                o[2 * i] = __uint_as_float(w[i] << 16);
                o[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
            }
        }
        return 1.0f;
    } else if constexpr (T == GGML_TYPE_Q8_0) {
        const uint8_t *blk = p + 34 * (size_t)(e / 32);
        const uint16_t *q = (const uint16_t *)(blk + 2 + e % 32); /* 2-byte aligned */
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t h = q[i];
            o[2 * i] = kv_s8_to_f32(h, 0);
            o[2 * i + 1] = kv_s8_to_f32(h, 1);
        }
        return cuda_h2f(*(const uint16_t *)blk);
    } else {
        static_assert(T == GGML_TYPE_Q4_0, "a KV type");
        const uint8_t *blk = p + 18 * (size_t)(e / 32);
        const int r = e % 32, shift = r < 16 ? 0 : 4;
        const uint16_t *q = (const uint16_t *)(blk + 2 + r % 16);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint16_t h = q[i];
            o[2 * i] = kv_q4_to_f32((h >> shift) & 0xF);
            o[2 * i + 1] = kv_q4_to_f32((h >> (8 + shift)) & 0xF);
        }
        return cuda_h2f(*(const uint16_t *)blk);
    }
}

/* The codes of elements [e, e + 8) of a block type's cached head row at p as signed bytes, four
 * to a word (q4_0's as code - 8), for dot products with __dp4a; returned the block's d. */
template <int T> __device__ __forceinline__ float kv_codes8(const uint8_t *p, int e, uint32_t (&w)[2]) {
    if constexpr (T == GGML_TYPE_Q8_0) {
        const uint8_t *blk = p + 34 * (size_t)(e / 32);
        const uint16_t *q = (const uint16_t *)(blk + 2 + e % 32); /* 2-byte aligned */
        w[0] = q[0] | (uint32_t)q[1] << 16;
        w[1] = q[2] | (uint32_t)q[3] << 16;
        return cuda_h2f(*(const uint16_t *)blk);
    } else {
        static_assert(T == GGML_TYPE_Q4_0, "a block type");
        const uint8_t *blk = p + 18 * (size_t)(e / 32);
        const int r = e % 32, shift = r < 16 ? 0 : 4; /* byte j: code j low, code j + 16 high */
        const uint16_t *q = (const uint16_t *)(blk + 2 + r % 16);
        w[0] = __vsub4(((q[0] | (uint32_t)q[1] << 16) >> shift) & 0x0F0F0F0Fu, 0x08080808u);
        w[1] = __vsub4(((q[2] | (uint32_t)q[3] << 16) >> shift) & 0x0F0F0F0Fu, 0x08080808u);
        return cuda_h2f(*(const uint16_t *)blk);
    }
}

/* Element e of a cached head row of a float type (heads whose width is not a multiple of 8). */
template <int T> __device__ __forceinline__ float kv_load1(const uint8_t *p, int e) {
    static_assert(T == GGML_TYPE_F16 || T == GGML_TYPE_BF16, "the block types load 8 at a time");
    const uint16_t h = ((const uint16_t *)p)[e];
    return T == GGML_TYPE_F16 ? cuda_h2f(h) : cuda_bf2f(h);
}

/* F(TK, TV) for a view's K and V types: F is a macro that launches the kernel template for
 * that pair (every pair of kv_types is instantiated). */
#define KV_TYPES_DISPATCH(tk, tv, F)                                                               \
    do {                                                                                           \
        switch ((tk) * 64 + (tv)) {                                                                \
        KV_TYPES_CASE_ROW(GGML_TYPE_F16, F) KV_TYPES_CASE_ROW(GGML_TYPE_BF16, F)                   \
        KV_TYPES_CASE_ROW(GGML_TYPE_Q8_0, F) KV_TYPES_CASE_ROW(GGML_TYPE_Q4_0, F)                  \
        default: abort(); /* kv_cache_init admits only kv_types */                                 \
        }                                                                                          \
    } while (0)
#define KV_TYPES_CASE_ROW(K, F)                                                                    \
    case (K) * 64 + GGML_TYPE_F16: F(K, GGML_TYPE_F16); break;                                     \
    case (K) * 64 + GGML_TYPE_BF16: F(K, GGML_TYPE_BF16); break;                                   \
    case (K) * 64 + GGML_TYPE_Q8_0: F(K, GGML_TYPE_Q8_0); break;                                   \
    case (K) * 64 + GGML_TYPE_Q4_0: F(K, GGML_TYPE_Q4_0); break;

/* Whether the device ops read and write the type (supports()). */
static inline bool cuda_kv_type(enum ggml_type t) {
    return t == GGML_TYPE_F16 || t == GGML_TYPE_BF16 || t == GGML_TYPE_Q8_0 || t == GGML_TYPE_Q4_0;
}

#endif
