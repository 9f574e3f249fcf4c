/* quant.c — type traits, scalar fp16/bf16 conversions, the plain-C reference for the float and
 * 32-element formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1), and the kernel dispatch.
 *
 * The reference is the spec (style.md §5): loops in the order the formulas of
 * quant-formats.md are written, no intrinsics. Dequantization forms every float product in the
 * same order as llama.cpp's dequantize_row_* (ggml-quants.c) so results are bit-exact; the
 * quantizers follow llama.cpp's quantize_row_*_ref rules (the activation quantizers decide how
 * closely our logits agree with llama.cpp's, §5.1); dot products compute the exact integer
 * block sums of §5.2 and accumulate blocks in f32 in row order.
 * K-quants live in kquants.c, the SIMD kernels in kernels_avx2.c / kernels_avx512.c.
 *
 * Degenerate inputs (NaN, inf, values so small that 1/d overflows) never cause UB: every
 * float -> int conversion goes through a clamp. For such blocks the stored scale is 0 or
 * non-finite, so the codes carry no information and may differ from llama.cpp's. */
#include "quant/quant.h"
#include "quant/internal.h"
#include "common.h"

#include <math.h>
#include <float.h>
#include <string.h>
#include <strings.h>
#if defined(__clang__)
#include <cpuid.h>
#endif

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF   /* a*b+c must round twice, as in llama.cpp's reference */
#endif

/* ------------------------------------------------------------------------------------------
 * Type traits. Known ids coti cannot compute keep their name and block bytes but get
 * block_elems = 0 (quant.h: "not supported"); ids never defined by ggml return NULL. */

static const struct ggml_type_traits type_traits[GGML_TYPE_COUNT] = {
    [GGML_TYPE_F32]  = {"f32", 1, 4, GGML_TYPE_F32},
    [GGML_TYPE_F16]  = {"f16", 1, 2, GGML_TYPE_F16},
    [GGML_TYPE_Q4_0] = {"q4_0", QK4_0, 18, GGML_TYPE_Q8_0},
    [GGML_TYPE_Q4_1] = {"q4_1", QK4_1, 20, GGML_TYPE_Q8_1},
    [GGML_TYPE_Q5_0] = {"q5_0", QK5_0, 22, GGML_TYPE_Q8_0},
    [GGML_TYPE_Q5_1] = {"q5_1", QK5_1, 24, GGML_TYPE_Q8_1},
    [GGML_TYPE_Q8_0] = {"q8_0", QK8_0, 34, GGML_TYPE_Q8_0},
    [GGML_TYPE_Q8_1] = {"q8_1", QK8_1, 36, GGML_TYPE_Q8_1},
    [GGML_TYPE_Q2_K] = {"q2_K", QK_K, 84, GGML_TYPE_Q8_K},
    [GGML_TYPE_Q3_K] = {"q3_K", QK_K, 110, GGML_TYPE_Q8_K},
    [GGML_TYPE_Q4_K] = {"q4_K", QK_K, 144, GGML_TYPE_Q8_K},
    [GGML_TYPE_Q5_K] = {"q5_K", QK_K, 176, GGML_TYPE_Q8_K},
    [GGML_TYPE_Q6_K] = {"q6_K", QK_K, 210, GGML_TYPE_Q8_K},
    [GGML_TYPE_Q8_K] = {"q8_K", QK_K, 292, GGML_TYPE_Q8_K},
    [GGML_TYPE_BF16] = {"bf16", 1, 2, GGML_TYPE_BF16},
    /* known to ggml, not computed by coti (block_elems 0); bytes per block for diagnostics */
    [16] = {"iq2_xxs", 0, 66, GGML_TYPE_Q8_K},
    [17] = {"iq2_xs", 0, 74, GGML_TYPE_Q8_K},
    [18] = {"iq3_xxs", 0, 98, GGML_TYPE_Q8_K},
    [19] = {"iq1_s", 0, 50, GGML_TYPE_Q8_K},
    [20] = {"iq4_nl", 0, 18, GGML_TYPE_Q8_0},
    [21] = {"iq3_s", 0, 110, GGML_TYPE_Q8_K},
    [22] = {"iq2_s", 0, 82, GGML_TYPE_Q8_K},
    [23] = {"iq4_xs", 0, 136, GGML_TYPE_Q8_K},
    [24] = {"i8", 0, 1, 24},
    [25] = {"i16", 0, 2, 25},
    [26] = {"i32", 0, 4, 26},
    [27] = {"i64", 0, 8, 27},
    [28] = {"f64", 0, 8, 28},
    [29] = {"iq1_m", 0, 56, GGML_TYPE_Q8_K},
    [34] = {"tq1_0", 0, 54, GGML_TYPE_Q8_K},
    [35] = {"tq2_0", 0, 66, GGML_TYPE_Q8_K},
    [39] = {"mxfp4", 0, 17, GGML_TYPE_Q8_0},
    [40] = {"nvfp4", 0, 36, GGML_TYPE_Q8_0},
};

const struct ggml_type_traits *ggml_type_traits_get(enum ggml_type t) {
    if ((int)t < 0 || (int)t >= GGML_TYPE_COUNT || !type_traits[t].name) return NULL;
    return &type_traits[t];
}

bool ggml_type_supported(enum ggml_type t) {
    const struct ggml_type_traits *tr = ggml_type_traits_get(t);
    return tr && tr->block_elems > 0;
}

size_t ggml_row_size(enum ggml_type t, int64_t n) {
    const struct ggml_type_traits *tr = ggml_type_traits_get(t);
    if (!tr || tr->block_elems <= 0 || n < 0 || n % tr->block_elems) return 0;
    size_t bytes;
    if (!coti_mul_size((size_t)(n / tr->block_elems), (size_t)tr->block_bytes, &bytes)) return 0;
    return bytes;
}

enum ggml_type ggml_type_from_name(const char *name) {
    if (!name) return GGML_TYPE_COUNT;
    for (int t = 0; t < GGML_TYPE_COUNT; t++)   /* case-insensitive: "Q4_K", "q4_k", "q4_K" */
        if (type_traits[t].name && !strcasecmp(type_traits[t].name, name)) return (enum ggml_type)t;
    return GGML_TYPE_COUNT;
}

enum ggml_type ggml_type_for_rows(enum ggml_type want, int64_t n) {
    const enum ggml_type chain[3] = {want, GGML_TYPE_Q8_0, GGML_TYPE_F16};
    for (int i = 0; i < 3; i++)
        if (ggml_row_size(chain[i], n) != 0) return chain[i];
    return GGML_TYPE_F32;
}

uint32_t ggml_file_type_of(enum ggml_type t) {
    switch (t) {
    case GGML_TYPE_F32: return 0;
    case GGML_TYPE_F16: return 1;
    case GGML_TYPE_Q4_0: return 2;
    case GGML_TYPE_Q4_1: return 3;
    case GGML_TYPE_Q8_0: return 7;
    case GGML_TYPE_Q5_0: return 8;
    case GGML_TYPE_Q5_1: return 9;
    case GGML_TYPE_Q2_K: return 10;
    case GGML_TYPE_Q3_K: return 12;   /* Q3_K_M */
    case GGML_TYPE_Q4_K: return 15;   /* Q4_K_M */
    case GGML_TYPE_Q5_K: return 17;   /* Q5_K_M */
    case GGML_TYPE_Q6_K: return 18;
    case GGML_TYPE_BF16: return 32;
    default: return 7;
    }
}

/* ------------------------------------------------------------------------------------------
 * Scalar conversions. */

static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float f32_from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float fp16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
    /* inf; NaN keeps its payload and is made quiet, as the F16C instruction does */
    if (exp == 0x1F) return f32_from_bits(sign | 0x7F800000u | (mant << 13) | (mant ? 0x400000u : 0));
    if (exp == 0) {   /* zero or subnormal: mant * 2^-24, exact in f32 */
        float v = (float)mant * 0x1p-24f;
        return sign ? -v : v;
    }
    return f32_from_bits(sign | ((exp + 112) << 23) | (mant << 13));  /* rebias 15 -> 127 */
}

uint16_t f32_to_fp16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7FFFFFFF;
    /* NaN: quiet it and keep the top payload bits, as the F16C instruction does, so the scalar
     * and SIMD conversions of activations agree bit for bit. */
    if (a > 0x7F800000u) return sign | 0x7E00 | (uint16_t)((a >> 13) & 0x3FF);
    /* >= 65520 (halfway between 65504 and 2^16; the tie goes to the even 2^16) -> inf */
    if (a >= 0x477FF000u) return sign | 0x7C00;
    uint32_t m, h;
    int shift;
    if (a >= 0x38800000u) {          /* f16 normal range (>= 2^-14): drop 13 mantissa bits */
        h = ((((a >> 23) - 127 + 15) << 10) | ((a >> 13) & 0x3FF));
        m = a;
        shift = 13;
    } else {                         /* f16 subnormal or zero: value * 2^24 rounded to int */
        uint32_t e = a >> 23;
        if (e < 102) return sign;    /* below 2^-25: rounds to zero (2^-25 itself ties to 0) */
        m = (a & 0x7FFFFF) | 0x800000;
        shift = (int)(126 - e);      /* 14..24 */
        h = m >> shift;
    }
    uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) h++;   /* a carry into the exponent is right */
    return sign | (uint16_t)h;
}

float bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

uint16_t f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7FFFFFFF) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40);   /* quiet NaN */
    return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

/* ------------------------------------------------------------------------------------------
 * Rounding helpers. llama.cpp converts with plain casts, which is UB for out-of-range values;
 * these clamp first (NaN -> lo) and agree with the cast whenever the cast is defined. */

static inline int trunc_clamp(float v, int lo, int hi) {   /* (int)v, clamped */
    if (!(v >= (float)lo)) return lo;
    if (v >= (float)hi) return hi;
    return (int)v;
}

static inline int8_t round_q8(float v) {   /* roundf (half away from zero) into [-127, 127] */
    if (!(v == v)) return 0;
    if (v >= 127.0f) return 127;
    if (v <= -127.0f) return -127;
    return (int8_t)roundf(v);
}

/* ------------------------------------------------------------------------------------------
 * Float formats: F32, F16, BF16 (one element per block). */

static void dequant_f32(const void *src, float *dst, int64_t n) { memcpy(dst, src, (size_t)n * 4); }

static void dequant_f16(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n; i++) dst[i] = fp16_to_f32(quant_rd_u16(p + 2 * i));
}

static void dequant_bf16(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_f32(quant_rd_u16(p + 2 * i));
}

static void quant_f32(const float *x, void *y, int64_t n) { memcpy(y, x, (size_t)n * 4); }

static void quant_f16(const float *x, void *y, int64_t n) {
    uint8_t *p = y;
    for (int64_t i = 0; i < n; i++) { uint16_t h = f32_to_fp16(x[i]); memcpy(p + 2 * i, &h, 2); }
}

static void quant_bf16(const float *x, void *y, int64_t n) {
    uint8_t *p = y;
    for (int64_t i = 0; i < n; i++) { uint16_t h = f32_to_bf16(x[i]); memcpy(p + 2 * i, &h, 2); }
}

static float dot_f32(const void *w, const void *x, int64_t n) {
    const uint8_t *a = w, *b = x;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) sum += quant_rd_f32(a + 4 * i) * quant_rd_f32(b + 4 * i);
    return sum;
}

/* f16 * f16 products are exact in f32 (11 x 11 significant bits), so only the sum rounds. */
static float dot_f16(const void *w, const void *x, int64_t n) {
    const uint8_t *a = w, *b = x;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++)
        sum += fp16_to_f32(quant_rd_u16(a + 2 * i)) * fp16_to_f32(quant_rd_u16(b + 2 * i));
    return sum;
}

static float dot_bf16(const void *w, const void *x, int64_t n) {
    const uint8_t *a = w, *b = x;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++)
        sum += bf16_to_f32(quant_rd_u16(a + 2 * i)) * bf16_to_f32(quant_rd_u16(b + 2 * i));
    return sum;
}

/* ------------------------------------------------------------------------------------------
 * 32-element formats. Blocks are copied into a local struct (file data has no alignment). */

/* Copy block ib of a row into a local struct. */
#define LOAD_BLOCK(b, src, ib) memcpy(&(b), (const uint8_t *)(src) + (ib) * sizeof(b), sizeof(b))

/* 5-bit code of element j (0..31) of a Q5 block: its nibble plus bit j of qh as bit 4. */
static inline int q5_code(const uint8_t *qs, uint32_t qh, int j) {
    int nib = j < 16 ? (qs[j] & 0xF) : (qs[j - 16] >> 4);
    return nib | (int)(((qh >> j) & 1) << 4);
}

static void dequant_q4_0(const void *src, float *dst, int64_t n) {
    for (int64_t ib = 0; ib < n / 32; ib++) {
        struct block_q4_0 b;
        LOAD_BLOCK(b, src, ib);
        float d = fp16_to_f32(b.d), *y = dst + 32 * ib;
        for (int j = 0; j < 16; j++) {
            y[j] = (float)((b.qs[j] & 0xF) - 8) * d;
            y[j + 16] = (float)((b.qs[j] >> 4) - 8) * d;
        }
    }
}

static void dequant_q4_1(const void *src, float *dst, int64_t n) {
    for (int64_t ib = 0; ib < n / 32; ib++) {
        struct block_q4_1 b;
        LOAD_BLOCK(b, src, ib);
        float d = fp16_to_f32(b.d), m = fp16_to_f32(b.m), *y = dst + 32 * ib;
        for (int j = 0; j < 16; j++) {
            y[j] = (float)(b.qs[j] & 0xF) * d + m;
            y[j + 16] = (float)(b.qs[j] >> 4) * d + m;
        }
    }
}

static void dequant_q5_0(const void *src, float *dst, int64_t n) {
    for (int64_t ib = 0; ib < n / 32; ib++) {
        struct block_q5_0 b;
        LOAD_BLOCK(b, src, ib);
        float d = fp16_to_f32(b.d), *y = dst + 32 * ib;
        uint32_t qh = quant_rd_u32(b.qh);
        for (int j = 0; j < 32; j++) y[j] = (float)(q5_code(b.qs, qh, j) - 16) * d;
    }
}

static void dequant_q5_1(const void *src, float *dst, int64_t n) {
    for (int64_t ib = 0; ib < n / 32; ib++) {
        struct block_q5_1 b;
        LOAD_BLOCK(b, src, ib);
        float d = fp16_to_f32(b.d), m = fp16_to_f32(b.m), *y = dst + 32 * ib;
        uint32_t qh = quant_rd_u32(b.qh);
        for (int j = 0; j < 32; j++) y[j] = (float)q5_code(b.qs, qh, j) * d + m;
    }
}

static void dequant_q8_0(const void *src, float *dst, int64_t n) {
    for (int64_t ib = 0; ib < n / 32; ib++) {
        struct block_q8_0 b;
        LOAD_BLOCK(b, src, ib);
        float d = fp16_to_f32(b.d), *y = dst + 32 * ib;
        for (int j = 0; j < 32; j++) y[j] = (float)b.qs[j] * d;
    }
}

static void dequant_q8_1(const void *src, float *dst, int64_t n) {
    for (int64_t ib = 0; ib < n / 32; ib++) {
        struct block_q8_1 b;
        LOAD_BLOCK(b, src, ib);
        float d = fp16_to_f32(b.d), *y = dst + 32 * ib;
        for (int j = 0; j < 32; j++) y[j] = (float)b.qs[j] * d;
    }
}

/* Largest |x| of a block and the signed value that has it (the first one on ties). */
static inline float block_absmax_signed(const float *x, int n, float *amax_out) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++)
        if (fabsf(x[j]) > amax) { amax = fabsf(x[j]); max = x[j]; }
    *amax_out = amax;
    return max;
}

static inline void block_min_max(const float *x, int n, float *min, float *max) {
    *min = FLT_MAX;
    *max = -FLT_MAX;
    for (int j = 0; j < n; j++) {
        if (x[j] < *min) *min = x[j];
        if (x[j] > *max) *max = x[j];
    }
}

/* Q4_0: d = (signed max) / -8, so the extreme maps to code 0; code = trunc(x/d + 8.5). */
static void quant_q4_0(const float *x, void *dst, int64_t n) {
    for (int64_t ib = 0; ib < n / 32; ib++, x += 32) {
        struct block_q4_0 b;
        float amax, max = block_absmax_signed(x, 32, &amax);
        float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        b.d = f32_to_fp16(d);
        for (int j = 0; j < 16; j++) {
            int lo = trunc_clamp(x[j] * id + 8.5f, 0, 15);
            int hi = trunc_clamp(x[j + 16] * id + 8.5f, 0, 15);
            b.qs[j] = (uint8_t)(lo | (hi << 4));
        }
        memcpy((uint8_t *)dst + ib * sizeof b, &b, sizeof b);
    }
}

/* Q4_1: d = (max - min) / 15, m = min; code = trunc((x - min)/d + 0.5). */
static void quant_q4_1(const float *x, void *dst, int64_t n) {
    for (int64_t ib = 0; ib < n / 32; ib++, x += 32) {
        struct block_q4_1 b;
        float min, max;
        block_min_max(x, 32, &min, &max);
        float d = (max - min) / 15.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        b.d = f32_to_fp16(d);
        b.m = f32_to_fp16(min);
        for (int j = 0; j < 16; j++) {
            int lo = trunc_clamp((x[j] - min) * id + 0.5f, 0, 15);
            int hi = trunc_clamp((x[j + 16] - min) * id + 0.5f, 0, 15);
            b.qs[j] = (uint8_t)(lo | (hi << 4));
        }
        memcpy((uint8_t *)dst + ib * sizeof b, &b, sizeof b);
    }
}

static inline void q5_pack(const int *code, uint8_t *qs, uint8_t *qh_bytes) {
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)((code[j] & 0xF) | ((code[j + 16] & 0xF) << 4));
    for (int j = 0; j < 32; j++) qh |= (uint32_t)((code[j] >> 4) & 1) << j;
    memcpy(qh_bytes, &qh, 4);
}

/* Q5_0: d = (signed max) / -16; code = trunc(x/d + 16.5). */
static void quant_q5_0(const float *x, void *dst, int64_t n) {
    for (int64_t ib = 0; ib < n / 32; ib++, x += 32) {
        struct block_q5_0 b;
        float amax, max = block_absmax_signed(x, 32, &amax);
        float d = max / -16.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        int code[32];
        b.d = f32_to_fp16(d);
        for (int j = 0; j < 32; j++) code[j] = trunc_clamp(x[j] * id + 16.5f, 0, 31);
        q5_pack(code, b.qs, b.qh);
        memcpy((uint8_t *)dst + ib * sizeof b, &b, sizeof b);
    }
}

/* Q5_1: d = (max - min) / 31, m = min; code = trunc((x - min)/d + 0.5). */
static void quant_q5_1(const float *x, void *dst, int64_t n) {
    for (int64_t ib = 0; ib < n / 32; ib++, x += 32) {
        struct block_q5_1 b;
        float min, max;
        block_min_max(x, 32, &min, &max);
        float d = (max - min) / 31.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        int code[32];
        b.d = f32_to_fp16(d);
        b.m = f32_to_fp16(min);
        for (int j = 0; j < 32; j++) code[j] = trunc_clamp((x[j] - min) * id + 0.5f, 0, 31);
        q5_pack(code, b.qs, b.qh);
        memcpy((uint8_t *)dst + ib * sizeof b, &b, sizeof b);
    }
}

/* Q8_0 (quant-formats.md §5.1): d = amax/127; codes round(x * (1/d)) half away from zero,
 * computed with the unrounded f32 d; d is stored as f16. */
static void quant_q8_0(const float *x, void *dst, int64_t n) {
    for (int64_t ib = 0; ib < n / 32; ib++, x += 32) {
        struct block_q8_0 b;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        b.d = f32_to_fp16(d);
        for (int j = 0; j < 32; j++) b.qs[j] = round_q8(x[j] * id);
        memcpy((uint8_t *)dst + ib * sizeof b, &b, sizeof b);
    }
}

/* Q8_1: Q8_0 codes plus s = f16(d * Σ codes), with the f32 d. */
static void quant_q8_1(const float *x, void *dst, int64_t n) {
    for (int64_t ib = 0; ib < n / 32; ib++, x += 32) {
        struct block_q8_1 b;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < 32; j++) { b.qs[j] = round_q8(x[j] * id); sum += b.qs[j]; }
        b.d = f32_to_fp16(d);
        b.s = f32_to_fp16((float)sum * d);
        memcpy((uint8_t *)dst + ib * sizeof b, &b, sizeof b);
    }
}

/* Dots (§5.2): exact int block sum, then f32 sumf += (dx*dy)*sumi (+ m*s for the _1 types). */
static float dot_q4_0(const void *w, const void *x, int64_t n) {
    const uint8_t *xp = x;
    float sumf = 0.0f;
    for (int64_t ib = 0; ib < n / 32; ib++) {
        struct block_q4_0 bw;
        LOAD_BLOCK(bw, w, ib);
        struct block_q8_0 bx;
        memcpy(&bx, xp + ib * sizeof bx, sizeof bx);
        int sumi = 0;
        for (int j = 0; j < 16; j++)
            sumi += ((bw.qs[j] & 0xF) - 8) * bx.qs[j] + ((bw.qs[j] >> 4) - 8) * bx.qs[j + 16];
        sumf += (fp16_to_f32(bw.d) * fp16_to_f32(bx.d)) * (float)sumi;
    }
    return sumf;
}

static float dot_q4_1(const void *w, const void *x, int64_t n) {
    const uint8_t *xp = x;
    float sumf = 0.0f;
    for (int64_t ib = 0; ib < n / 32; ib++) {
        struct block_q4_1 bw;
        LOAD_BLOCK(bw, w, ib);
        struct block_q8_1 bx;
        memcpy(&bx, xp + ib * sizeof bx, sizeof bx);
        int sumi = 0;
        for (int j = 0; j < 16; j++)
            sumi += (bw.qs[j] & 0xF) * bx.qs[j] + (bw.qs[j] >> 4) * bx.qs[j + 16];
        sumf += (fp16_to_f32(bw.d) * fp16_to_f32(bx.d)) * (float)sumi
                + fp16_to_f32(bw.m) * fp16_to_f32(bx.s);
    }
    return sumf;
}

static float dot_q5_0(const void *w, const void *x, int64_t n) {
    const uint8_t *xp = x;
    float sumf = 0.0f;
    for (int64_t ib = 0; ib < n / 32; ib++) {
        struct block_q5_0 bw;
        LOAD_BLOCK(bw, w, ib);
        struct block_q8_0 bx;
        memcpy(&bx, xp + ib * sizeof bx, sizeof bx);
        uint32_t qh = quant_rd_u32(bw.qh);
        int sumi = 0;
        for (int j = 0; j < 32; j++) sumi += (q5_code(bw.qs, qh, j) - 16) * bx.qs[j];
        sumf += (fp16_to_f32(bw.d) * fp16_to_f32(bx.d)) * (float)sumi;
    }
    return sumf;
}

static float dot_q5_1(const void *w, const void *x, int64_t n) {
    const uint8_t *xp = x;
    float sumf = 0.0f;
    for (int64_t ib = 0; ib < n / 32; ib++) {
        struct block_q5_1 bw;
        LOAD_BLOCK(bw, w, ib);
        struct block_q8_1 bx;
        memcpy(&bx, xp + ib * sizeof bx, sizeof bx);
        uint32_t qh = quant_rd_u32(bw.qh);
        int sumi = 0;
        for (int j = 0; j < 32; j++) sumi += q5_code(bw.qs, qh, j) * bx.qs[j];
        sumf += (fp16_to_f32(bw.d) * fp16_to_f32(bx.d)) * (float)sumi
                + fp16_to_f32(bw.m) * fp16_to_f32(bx.s);
    }
    return sumf;
}

static float dot_q8_0(const void *w, const void *x, int64_t n) {
    const uint8_t *xp = x;
    float sumf = 0.0f;
    for (int64_t ib = 0; ib < n / 32; ib++) {
        struct block_q8_0 bw;
        LOAD_BLOCK(bw, w, ib);
        struct block_q8_0 bx;
        memcpy(&bx, xp + ib * sizeof bx, sizeof bx);
        int sumi = 0;
        for (int j = 0; j < 32; j++) sumi += bw.qs[j] * bx.qs[j];
        sumf += (fp16_to_f32(bw.d) * fp16_to_f32(bx.d)) * (float)sumi;
    }
    return sumf;
}

/* Q8_1 is an activation format; its self-dot exists so every supported type has one. */
static float dot_q8_1(const void *w, const void *x, int64_t n) {
    const uint8_t *xp = x;
    float sumf = 0.0f;
    for (int64_t ib = 0; ib < n / 32; ib++) {
        struct block_q8_1 bw;
        LOAD_BLOCK(bw, w, ib);
        struct block_q8_1 bx;
        memcpy(&bx, xp + ib * sizeof bx, sizeof bx);
        int sumi = 0;
        for (int j = 0; j < 32; j++) sumi += bw.qs[j] * bx.qs[j];
        sumf += (fp16_to_f32(bw.d) * fp16_to_f32(bx.d)) * (float)sumi;
    }
    return sumf;
}

/* ------------------------------------------------------------------------------------------
 * Reference table and public reference entry points. */

typedef float (*dot_fn)(const void *w, const void *x, int64_t n);
typedef void (*dequant_fn)(const void *src, float *dst, int64_t n);

struct ref_ops {
    dequant_fn dequantize;
    quant_from_float_fn quantize;
    dot_fn dot;
    quant_gemm_fn gemm;
};

/* The reference gemm: one reference dot per output. Slow, and the spec for the fast ones. */
static inline void gemm_with(dot_fn dot, int64_t n, const void *w, size_t row_bytes,
                             int64_t n_out, const void *x, size_t x_row_bytes, int64_t n_tok,
                             float *y, int64_t ldy) {
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t o = 0; o < n_out; o++)
            y[t * ldy + o] = dot((const uint8_t *)w + o * row_bytes,
                                 (const uint8_t *)x + t * x_row_bytes, n);
}

#define DEF_GEMM_REF(name, dot)                                                                \
    static void gemm_ref_##name(int64_t n, const void *w, size_t rb, int64_t n_out,            \
                                const void *x, size_t xrb, int64_t n_tok, float *y,            \
                                int64_t ldy) {                                                 \
        gemm_with(dot, n, w, rb, n_out, x, xrb, n_tok, y, ldy);                                \
    }
DEF_GEMM_REF(f32, dot_f32)
DEF_GEMM_REF(f16, dot_f16)
DEF_GEMM_REF(bf16, dot_bf16)
DEF_GEMM_REF(q4_0, dot_q4_0)
DEF_GEMM_REF(q4_1, dot_q4_1)
DEF_GEMM_REF(q5_0, dot_q5_0)
DEF_GEMM_REF(q5_1, dot_q5_1)
DEF_GEMM_REF(q8_0, dot_q8_0)
DEF_GEMM_REF(q8_1, dot_q8_1)
DEF_GEMM_REF(q2_K, quant_dot_q2_K_ref)
DEF_GEMM_REF(q3_K, quant_dot_q3_K_ref)
DEF_GEMM_REF(q4_K, quant_dot_q4_K_ref)
DEF_GEMM_REF(q5_K, quant_dot_q5_K_ref)
DEF_GEMM_REF(q6_K, quant_dot_q6_K_ref)
DEF_GEMM_REF(q8_K, quant_dot_q8_K_ref)

static const struct ref_ops ref_ops[GGML_TYPE_COUNT] = {
    [GGML_TYPE_F32]  = {dequant_f32, quant_f32, dot_f32, gemm_ref_f32},
    [GGML_TYPE_F16]  = {dequant_f16, quant_f16, dot_f16, gemm_ref_f16},
    [GGML_TYPE_BF16] = {dequant_bf16, quant_bf16, dot_bf16, gemm_ref_bf16},
    [GGML_TYPE_Q4_0] = {dequant_q4_0, quant_q4_0, dot_q4_0, gemm_ref_q4_0},
    [GGML_TYPE_Q4_1] = {dequant_q4_1, quant_q4_1, dot_q4_1, gemm_ref_q4_1},
    [GGML_TYPE_Q5_0] = {dequant_q5_0, quant_q5_0, dot_q5_0, gemm_ref_q5_0},
    [GGML_TYPE_Q5_1] = {dequant_q5_1, quant_q5_1, dot_q5_1, gemm_ref_q5_1},
    [GGML_TYPE_Q8_0] = {dequant_q8_0, quant_q8_0, dot_q8_0, gemm_ref_q8_0},
    [GGML_TYPE_Q8_1] = {dequant_q8_1, quant_q8_1, dot_q8_1, gemm_ref_q8_1},
    [GGML_TYPE_Q2_K] = {quant_dequantize_q2_K_ref, quant_quantize_q2_K_ref, quant_dot_q2_K_ref, gemm_ref_q2_K},
    [GGML_TYPE_Q3_K] = {quant_dequantize_q3_K_ref, quant_quantize_q3_K_ref, quant_dot_q3_K_ref, gemm_ref_q3_K},
    [GGML_TYPE_Q4_K] = {quant_dequantize_q4_K_ref, quant_quantize_q4_K_ref, quant_dot_q4_K_ref, gemm_ref_q4_K},
    [GGML_TYPE_Q5_K] = {quant_dequantize_q5_K_ref, quant_quantize_q5_K_ref, quant_dot_q5_K_ref, gemm_ref_q5_K},
    [GGML_TYPE_Q6_K] = {quant_dequantize_q6_K_ref, quant_quantize_q6_K_ref, quant_dot_q6_K_ref, gemm_ref_q6_K},
    [GGML_TYPE_Q8_K] = {quant_dequantize_q8_K_ref, quant_quantize_q8_K_ref, quant_dot_q8_K_ref, gemm_ref_q8_K},
};

/* NULL for unsupported types or n not a multiple of the block (callers' contract violations:
 * the public entry points then do nothing / return 0 rather than touch memory). */
static const struct ref_ops *ref_ops_for(enum ggml_type t, int64_t n) {
    if (!ggml_type_supported(t) || n < 0 || n % type_traits[t].block_elems) return NULL;
    return &ref_ops[t];
}

void quant_dequantize_row_ref(enum ggml_type t, const void *src, float *dst, int64_t n) {
    const struct ref_ops *r = ref_ops_for(t, n);
    if (r) r->dequantize(src, dst, n);
}

void quant_quantize_row_ref(enum ggml_type t, const float *src, void *dst, int64_t n) {
    const struct ref_ops *r = ref_ops_for(t, n);
    if (r) r->quantize(src, dst, n);
}

float quant_vec_dot_ref(enum ggml_type t, const void *w, const void *x, int64_t n) {
    const struct ref_ops *r = ref_ops_for(t, n);
    return r ? r->dot(w, x, n) : 0.0f;
}

/* ------------------------------------------------------------------------------------------
 * CPU detection and kernel dispatch. */

/* clang before 16 does not know the "f16c" feature name: ask CPUID leaf 1 (ECX bit 29). */
static bool cpu_has_f16c(void) {
#if defined(__clang__)
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
#else
    return __builtin_cpu_supports("f16c");
#endif
}

enum quant_cpu_level quant_cpu_level_detect(void) {
    __builtin_cpu_init();
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
    if (!avx2) return QUANT_CPU_REF;
    /* the AVX-512 file is compiled with F, BW, VL, DQ and VNNI */
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vnni"))
        return QUANT_CPU_AVX512;
    return QUANT_CPU_AVX2;
}

bool quant_kernels_get(enum ggml_type t, enum quant_cpu_level level, struct quant_kernels *out) {
    if (!ggml_type_supported(t) || !out) return false;
    enum ggml_type vt = type_traits[t].vec_dot_type;
    /* never hand out kernels the CPU cannot run, whatever the caller asked for */
    enum quant_cpu_level have = quant_cpu_level_detect();
    if (level > have) level = have;
    *out = (struct quant_kernels){
        .type = t,
        .vec_dot_type = vt,
        .from_float = ref_ops[vt].quantize,
        .gemm = ref_ops[t].gemm,
        .dequantize_row = ref_ops[t].dequantize,
    };
    if (level >= QUANT_CPU_AVX2) quant_kernels_fill_avx2(t, out);
    if (level >= QUANT_CPU_AVX512) quant_kernels_fill_avx512(t, out);
    return true;
}
