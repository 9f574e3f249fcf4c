/* kernels_avx512.c — AVX-512 (F, BW, VL, DQ, VNNI) kernels: activation conversion (from_float)
 * and tiled gemm for F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.
 * Compiled with the AVX-512 flags (Makefile: *_avx512.c) and only called when
 * quant_cpu_level_detect() found all of them. Types not handled here keep the AVX2 kernels.
 *
 * Integer dot products (quant-formats.md §5.2) are exact: the int32 lanes hold partial block
 * sums, converted to f32 once per block and accumulated with FMA into 16 f32 lanes per output;
 * one fixed horizontal sum at the end. Only that f32 accumulation differs from the reference
 * (summation order), and it is the same for every tile shape (see internal.h).
 *
 * VNNI's vpdpbusd multiplies unsigned by signed bytes. 32-element formats use it with an offset
 * instead of the sign trick: for weight codes c in [0, 255] meaning c - k (Q8_0: k = 128 after
 * flipping the sign bit; Q4_0: k = 8; Q5_0: k = 16), Σ (c - k) x = dpbusd(-k Σx, c, x), where the
 * -k Σx lanes are computed once per activation block and shared by all weight rows of the tile.
 * K-quants use vpmaddubsw (codes ≤ 63, activations ≤ 127: pair sums ≤ 16002, no saturation)
 * then vpdpwssd with the sub-block scales as int16, which folds the scale multiply into the
 * accumulate.
 *
 * from_float produces the same bytes as the reference quantizers for finite inputs: Q8_0/Q8_1
 * round half away from zero like roundf (truncate, then step by the sign when the fraction is
 * >= 0.5), Q8_K rounds to nearest-even like llama.cpp's nearest_int, and scales are computed in
 * scalar f32 exactly as the reference does. */
#include "quant/internal.h"

#include <immintrin.h>

#define UNROLL _Pragma("GCC unroll 4")

/* ------------------------------------------------------------------------------------------
 * Helpers. */

static inline float hsum512(__m512 v) {   /* the one reduction every output goes through */
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}

static inline float f16_at(const uint8_t *p) { return _cvtsh_ss(quant_rd_u16(p)); }

/* Accumulators and row pointers of one R x T tile. */
struct tile {
    const uint8_t *w[QUANT_TILE_MAX], *x[QUANT_TILE_MAX];
    __m512 acc[QUANT_TILE_MAX][QUANT_TILE_MAX];
};

QUANT_ALWAYS_INLINE void tile_init(struct tile *tl, const struct quant_gemm_args *g, int64_t o0,
                                   int64_t t0, int R, int T) {
    UNROLL for (int r = 0; r < R; r++) tl->w[r] = g->w + (size_t)(o0 + r) * g->rb;
    UNROLL for (int t = 0; t < T; t++) tl->x[t] = g->x + (size_t)(t0 + t) * g->xrb;
    UNROLL for (int r = 0; r < R; r++)
        UNROLL for (int t = 0; t < T; t++) tl->acc[r][t] = _mm512_setzero_ps();
}

QUANT_ALWAYS_INLINE void tile_store(const struct tile *tl, const struct quant_gemm_args *g,
                                    int64_t o0, int64_t t0, int R, int T) {
    UNROLL for (int t = 0; t < T; t++)
        UNROLL for (int r = 0; r < R; r++) g->y[(t0 + t) * g->ldy + o0 + r] = hsum512(tl->acc[r][t]);
}

/* 32-element blocks are processed two at a time, one per 256-bit half. A row with an odd
 * number of blocks ends with a single block in the low half and zeros in the high half (zero
 * codes, zero scales: the high lanes then add exactly +0). */

/* 32 bytes at p and, if two, 32 bytes at p + stride. */
QUANT_ALWAYS_INLINE __m512i load_2x32(const uint8_t *p, size_t stride, int two) {
    __m256i lo = _mm256_loadu_si256((const __m256i *)p);
    if (!two) return _mm512_zextsi256_si512(lo);
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo),
                              _mm256_loadu_si256((const __m256i *)(p + stride)), 1);
}

/* 16 nibble bytes at p (and p + stride) -> 32 (64) codes in element order: the low nibbles
 * are elements 0..15 and the high nibbles 16..31 of each block. */
QUANT_ALWAYS_INLINE __m512i load_nibbles_2x16(const uint8_t *p, size_t stride, int two) {
    __m256i a = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
    __m512i v = two ? _mm512_inserti64x4(_mm512_castsi256_si512(a),
                                         _mm256_broadcastsi128_si256(
                                             _mm_loadu_si128((const __m128i *)(p + stride))), 1)
                    : _mm512_zextsi256_si512(a);
    /* shift the second copy of each block right by 4: 128-bit lanes 1 and 3 */
    const __m512i sh = _mm512_set_epi32(0x40004, 0x40004, 0x40004, 0x40004, 0, 0, 0, 0,
                                        0x40004, 0x40004, 0x40004, 0x40004, 0, 0, 0, 0);
    return _mm512_and_si512(_mm512_srlv_epi16(v, sh), _mm512_set1_epi8(0x0F));
}

/* Block scales are fetched 16 blocks at a time: one dword gather per row reads the f16 at the
 * start of each block and the f16 after it (Q4_1/Q5_1: m; Q8_1: s), converted to f32 into a
 * small array; pairs of blocks then take their [s0 x8 | s1 x8] vector with two broadcasts
 * from memory instead of a convert and a shuffle each. Lanes past the row's end are zero. */
#define CHUNK_BLOCKS 16

QUANT_ALWAYS_INLINE void gather_scales16(const uint8_t *p, int stride, __mmask16 m, float *d,
                                         float *second) {
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32(stride));
    __m512i v = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, idx, p, 1);
    _mm512_store_ps(d, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v)));
    if (second) _mm512_store_ps(second, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16))));
}

/* [s[0] x8 | s[1] x8], or [s[0] x8 | 0 x8] for a single block. */
QUANT_ALWAYS_INLINE __m512 bcast_2(const float *s, int two) {
    if (!two) return _mm512_maskz_broadcastss_ps(0x00FF, _mm_load_ss(s));
    return _mm512_mask_broadcastss_ps(_mm512_set1_ps(s[0]), 0xFF00, _mm_load_ss(s + 1));
}

/* [s[0], 0 x7 | s[1], 0 x7]: a per-block term added once (lane 0 of each half). */
QUANT_ALWAYS_INLINE __m512 lane0_2(const float *s, int two) {
    return _mm512_maskz_expandloadu_ps(two ? 0x0101 : 0x0001, s);
}

/* -k * (sum of each group of 4 activation bytes): the dpbusd starting value that turns
 * unsigned codes c into c - k. */
static inline __m512i offset_init(__m512i xq, int k) {
    __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)k), xq);
    return _mm512_sub_epi32(_mm512_setzero_si512(), s);
}

/* ------------------------------------------------------------------------------------------
 * Q8_0 x Q8_0, Q4_0 x Q8_0, Q5_0 x Q8_0 (34-byte activation blocks: d@0, qs@2). */

/* Codes of the weight block at p (and of the next one, if two) as unsigned bytes whose value
 * minus the type's offset is the signed code. */
QUANT_ALWAYS_INLINE __m512i q8_0_codes(const uint8_t *p, int two) {   /* +128 via sign flip */
    return _mm512_xor_si512(load_2x32(p + 2, 34, two), _mm512_set1_epi8((char)0x80));
}
QUANT_ALWAYS_INLINE __m512i q4_0_codes(const uint8_t *p, int two) {
    return load_nibbles_2x16(p + 2, 18, two);
}
QUANT_ALWAYS_INLINE __m512i q5_0_codes(const uint8_t *p, int two) {
    __m512i c = load_nibbles_2x16(p + 6, 22, two);
    uint64_t qh = quant_rd_u32(p + 2) | (two ? (uint64_t)quant_rd_u32(p + 24) << 32 : 0);
    return _mm512_mask_add_epi8(c, (__mmask64)qh, c, _mm512_set1_epi8(16));
}

struct chunk_scales {   /* f32 scales of the current 16-block chunk, per tile row / token */
    _Alignas(64) float w[QUANT_TILE_MAX][CHUNK_BLOCKS], wm[QUANT_TILE_MAX][CHUNK_BLOCKS];
    _Alignas(64) float x[QUANT_TILE_MAX][CHUNK_BLOCKS], xm[QUANT_TILE_MAX][CHUNK_BLOCKS];
};

/* Walk the row in chunks of 16 blocks and pairs of blocks within them (the single-block tail,
 * if any, comes last: 16 is even), calling STEP(tl, cs, ib, k, R, T, two) per pair. */
#define WALK32(STEP, BLOCK_BYTES, XBLOCK_BYTES, WITH_M)                                        \
    do {                                                                                       \
        const int64_t nb_ = g->n / 32;                                                         \
        struct chunk_scales cs;                                                                \
        for (int64_t c = 0; c < nb_; c += CHUNK_BLOCKS) {                                      \
            int nbc = (int)(nb_ - c < CHUNK_BLOCKS ? nb_ - c : CHUNK_BLOCKS);                  \
            __mmask16 m = (__mmask16)((1u << nbc) - 1);                                        \
            UNROLL for (int r = 0; r < R; r++)                                                 \
                gather_scales16(tl.w[r] + c * (BLOCK_BYTES), BLOCK_BYTES, m, cs.w[r],          \
                                WITH_M ? cs.wm[r] : NULL);                                     \
            UNROLL for (int t = 0; t < T; t++)                                                 \
                gather_scales16(tl.x[t] + c * (XBLOCK_BYTES), XBLOCK_BYTES, m, cs.x[t],        \
                                WITH_M ? cs.xm[t] : NULL);                                     \
            int k = 0;                                                                         \
            for (; k + 2 <= nbc; k += 2) STEP(&tl, &cs, c + k, k, R, T, 1);                    \
            if (k < nbc) STEP(&tl, &cs, c + k, k, R, T, 0);                                    \
        }                                                                                      \
    } while (0)

#define DEF_SYM32(NAME, BLOCK_BYTES, OFFSET, CODES)                                            \
    QUANT_ALWAYS_INLINE void NAME##_step(struct tile *tl, const struct chunk_scales *cs,       \
                                         int64_t ib, int k, int R, int T, int two) {           \
        __m512i wq[QUANT_TILE_MAX];                                                            \
        UNROLL for (int r = 0; r < R; r++) wq[r] = CODES(tl->w[r] + ib * (BLOCK_BYTES), two);  \
        UNROLL for (int t = 0; t < T; t++) {                                                   \
            __m512i xq = load_2x32(tl->x[t] + ib * 34 + 2, 34, two);                           \
            __m512 dx = bcast_2(&cs->x[t][k], two);                                            \
            __m512i init = offset_init(xq, OFFSET);                                            \
            UNROLL for (int r = 0; r < R; r++) {                                               \
                __m512i s = _mm512_dpbusd_epi32(init, wq[r], xq);                              \
                tl->acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s),                         \
                                                _mm512_mul_ps(bcast_2(&cs->w[r][k], two), dx), \
                                                tl->acc[r][t]);                                \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
    QUANT_ALWAYS_INLINE void NAME##_tile(const struct quant_gemm_args *g, int64_t o0,          \
                                         int64_t t0, int R, int T) {                           \
        struct tile tl;                                                                        \
        tile_init(&tl, g, o0, t0, R, T);                                                       \
        WALK32(NAME##_step, BLOCK_BYTES, 34, 0);                                               \
        tile_store(&tl, g, o0, t0, R, T);                                                      \
    }                                                                                          \
    QUANT_TILES(NAME)

DEF_SYM32(q8_0, 34, 128, q8_0_codes)
DEF_SYM32(q4_0, 18, 8, q4_0_codes)
DEF_SYM32(q5_0, 22, 16, q5_0_codes)
QUANT_GEMM(q8_0, 4, 4)
QUANT_GEMM(q4_0, 4, 4)
QUANT_GEMM(q5_0, 4, 4)

/* ------------------------------------------------------------------------------------------
 * Q4_1 x Q8_1, Q5_1 x Q8_1 (36-byte activation blocks: d@0, s@2, qs@4). Codes are unsigned;
 * the min term m*s goes in with one extra FMA on the block's first lane. */

QUANT_ALWAYS_INLINE __m512i q4_1_codes(const uint8_t *p, int two) {
    return load_nibbles_2x16(p + 4, 20, two);
}
QUANT_ALWAYS_INLINE __m512i q5_1_codes(const uint8_t *p, int two) {
    __m512i c = load_nibbles_2x16(p + 8, 24, two);
    uint64_t qh = quant_rd_u32(p + 4) | (two ? (uint64_t)quant_rd_u32(p + 28) << 32 : 0);
    return _mm512_mask_add_epi8(c, (__mmask64)qh, c, _mm512_set1_epi8(16));
}

#define DEF_ASYM32(NAME, BLOCK_BYTES, CODES)                                                   \
    QUANT_ALWAYS_INLINE void NAME##_step(struct tile *tl, const struct chunk_scales *cs,       \
                                         int64_t ib, int k, int R, int T, int two) {           \
        __m512i wq[QUANT_TILE_MAX];                                                            \
        UNROLL for (int r = 0; r < R; r++) wq[r] = CODES(tl->w[r] + ib * (BLOCK_BYTES), two);  \
        UNROLL for (int t = 0; t < T; t++) {                                                   \
            __m512i xq = load_2x32(tl->x[t] + ib * 36 + 4, 36, two);                           \
            __m512 dx = bcast_2(&cs->x[t][k], two), sx = lane0_2(&cs->xm[t][k], two);          \
            UNROLL for (int r = 0; r < R; r++) {                                               \
                __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq[r], xq);            \
                __m512 a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s),                              \
                                           _mm512_mul_ps(bcast_2(&cs->w[r][k], two), dx),      \
                                           tl->acc[r][t]);                                     \
                tl->acc[r][t] = _mm512_fmadd_ps(lane0_2(&cs->wm[r][k], two), sx, a);           \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
    QUANT_ALWAYS_INLINE void NAME##_tile(const struct quant_gemm_args *g, int64_t o0,          \
                                         int64_t t0, int R, int T) {                           \
        struct tile tl;                                                                        \
        tile_init(&tl, g, o0, t0, R, T);                                                       \
        WALK32(NAME##_step, BLOCK_BYTES, 36, 1);                                               \
        tile_store(&tl, g, o0, t0, R, T);                                                      \
    }                                                                                          \
    QUANT_TILES(NAME)

DEF_ASYM32(q4_1, 20, q4_1_codes)
DEF_ASYM32(q5_1, 24, q5_1_codes)
QUANT_GEMM(q4_1, 4, 4)
QUANT_GEMM(q5_1, 4, 4)

/* ------------------------------------------------------------------------------------------
 * K-quants x Q8_K (292-byte activation blocks: d f32 @0, qs@4, bsums@260). One 256-element
 * block at a time; for each weight row of the tile its codes and scales are unpacked once
 * into four 64-element vectors, then every token of the tile consumes them. */

struct k_row {
    __m512i c[4];     /* codes of elements 64k..64k+63, unsigned */
    __m512i sc[4];    /* int16 scale of each code pair of c[k] */
    __m256i mn;       /* Q4_K/Q5_K: int16 min per bsum; Q6_K: -32 * scale per bsum */
    float d, dmin;
};

#define Q8K_BYTES 292

/* Q4_K/Q5_K scales: sub-block j covers 32 elements = 16 int16 pairs. */
QUANT_ALWAYS_INLINE void k4_row_scales(const uint8_t *b, struct k_row *k) {
    uint64_t sc8, mn8;
    quant_k4_scales_mins(b + 4, &sc8, &mn8);
    __m512i sc16 = _mm512_zextsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc8)));
    const __m512i half = _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_setzero_si512(),
                                                 _mm512_set1_epi16(1));
    UNROLL for (int j = 0; j < 4; j++)
        k->sc[j] = _mm512_permutexvar_epi16(_mm512_add_epi16(half, _mm512_set1_epi16((short)(2 * j))),
                                            sc16);
    /* bsums come in pairs per sub-block: [mn0, mn0, mn1, mn1, ...] */
    __m256i mn16 = _mm256_zextsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)mn8)));
    const __m256i pairs = _mm256_set_epi16(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    k->mn = _mm256_permutexvar_epi16(pairs, mn16);
    k->d = f16_at(b);
    k->dmin = f16_at(b + 2);
}

/* Q4_K/Q5_K nibbles: 64-byte group v holds sub-blocks 2c (low nibbles of bytes 0..31),
 * 2c+1 (their high nibbles), 2c+2 and 2c+3 (bytes 32..63): reorder to element order. */
QUANT_ALWAYS_INLINE void k4_split(__m512i v, __m512i *e0, __m512i *e1) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    *e0 = _mm512_shuffle_i64x2(lo, hi, 0x44);   /* lo[0:256] | hi[0:256] */
    *e1 = _mm512_shuffle_i64x2(lo, hi, 0xEE);   /* lo[256:512] | hi[256:512] */
}

QUANT_ALWAYS_INLINE void q4_K_row(const uint8_t *b, struct k_row *k) {
    k4_row_scales(b, k);
    k4_split(_mm512_loadu_si512(b + 16), &k->c[0], &k->c[1]);
    k4_split(_mm512_loadu_si512(b + 80), &k->c[2], &k->c[3]);
}

QUANT_ALWAYS_INLINE void q5_K_row(const uint8_t *b, struct k_row *k) {
    k4_row_scales(b, k);
    k4_split(_mm512_loadu_si512(b + 48), &k->c[0], &k->c[1]);
    k4_split(_mm512_loadu_si512(b + 112), &k->c[2], &k->c[3]);
    /* element 32j + l takes bit j of qh[l] as its 5th bit; c[k] spans j = 2k (low half) and
     * 2k + 1 (high half) */
    __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + 16)));
    UNROLL for (int j = 0; j < 4; j++) {
        __m512i sel = _mm512_mask_blend_epi8(0xFFFFFFFF00000000ull, _mm512_set1_epi8((char)(1 << (2 * j))),
                                             _mm512_set1_epi8((char)(1 << (2 * j + 1))));
        __mmask64 hb = _mm512_test_epi8_mask(qh, sel);
        k->c[j] = _mm512_mask_add_epi8(k->c[j], hb, k->c[j], _mm512_set1_epi8(16));
    }
}

/* 16 int16 scales, one per 16-element sub-block, spread so that c[j]'s code pairs (8 per
 * sub-block) meet their scale: k->sc[j] lane i = scale of sub-block 4j + i/8. */
QUANT_ALWAYS_INLINE void k16_spread_scales(__m256i sc16, struct k_row *k) {
    __m512i sc = _mm512_zextsi256_si512(sc16);
    const __m512i eighth = _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2,
                                            1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    UNROLL for (int j = 0; j < 4; j++)
        k->sc[j] = _mm512_permutexvar_epi16(_mm512_add_epi16(eighth, _mm512_set1_epi16((short)(4 * j))), sc);
}

QUANT_ALWAYS_INLINE void q6_K_row(const uint8_t *b, struct k_row *k) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    /* high bits of group g (32 elements) are bits 2g..2g+1 of qh: move them to bits 4..5 */
    const __m512i shl = _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_set1_epi16(4), _mm512_set1_epi16(2));
    const __m512i shr = _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_setzero_si512(), _mm512_set1_epi16(2));
    UNROLL for (int h = 0; h < 2; h++) {
        __m512i ql = _mm512_loadu_si512(b + 64 * h);
        __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h)));
        __m512i lo = _mm512_and_si512(ql, m4);                          /* groups 0, 1 */
        __m512i hi = _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4);    /* groups 2, 3 */
        k->c[2 * h] = _mm512_or_si512(lo, _mm512_and_si512(_mm512_sllv_epi16(qh, shl), m30));
        k->c[2 * h + 1] = _mm512_or_si512(hi, _mm512_and_si512(_mm512_srlv_epi16(qh, shr), m30));
    }
    /* 16 int8 scales, one per 16 elements */
    __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 192)));
    k16_spread_scales(sc16, k);
    /* codes are stored +32: subtract 32 * Σ_t sc_t bsums_t (|32 sc| <= 4096 fits int16) */
    k->mn = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc16, 5));
    k->d = f16_at(b + 208);
    k->dmin = 0.0f;
}

/* 2-bit codes of Q2_K / Q3_K: element 128h + 32j + l is bits 2j..2j+1 of qs[32h + l]. c[k]
 * (elements 64k..64k+63) holds j = 2(k%2) in its low half and j + 1 in its high half. */
QUANT_ALWAYS_INLINE __m512i k2_low_bits(const uint8_t *qs, int k) {
    int h = k / 2, j = 2 * (k % 2);
    __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qs + 32 * h)));
    __m512i sh = _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_set1_epi16((short)(2 * j)),
                                         _mm512_set1_epi16((short)(2 * j + 2)));
    return _mm512_and_si512(_mm512_srlv_epi16(q, sh), _mm512_set1_epi8(3));
}

/* Q3_K: code + 4 = low bits + 4 * (bit 4h + j of hmask[l]); the +4 is taken back with
 * -4 * Σ_t sc_t bsums_t, as Q6_K does with 32. */
QUANT_ALWAYS_INLINE void q3_K_row(const uint8_t *b, struct k_row *k) {
    __m512i hm = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)b));
    UNROLL for (int j = 0; j < 4; j++) {
        int bit = 4 * (j / 2) + 2 * (j % 2);
        __m512i lo = k2_low_bits(b + 32, j);
        __m512i sel = _mm512_mask_blend_epi8(0xFFFFFFFF00000000ull, _mm512_set1_epi8((char)(1 << bit)),
                                             _mm512_set1_epi8((char)(1 << (bit + 1))));
        k->c[j] = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(hm, sel), lo, _mm512_set1_epi8(4));
    }
    uint32_t w[4];
    quant_k3_scales_u6(b + 96, w);
    __m256i sc16 = _mm256_sub_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)w)),
                                    _mm256_set1_epi16(32));
    k16_spread_scales(sc16, k);
    k->mn = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc16, 2));
    k->d = f16_at(b + 108);
    k->dmin = 0.0f;
}

/* Q2_K: codes 0..3; byte t of scales: low nibble scale, high nibble min of sub-block t. */
QUANT_ALWAYS_INLINE void q2_K_row(const uint8_t *b, struct k_row *k) {
    UNROLL for (int j = 0; j < 4; j++) k->c[j] = k2_low_bits(b + 16, j);
    __m128i s = _mm_loadu_si128((const __m128i *)b);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    k16_spread_scales(_mm256_cvtepu8_epi16(_mm_and_si128(s, m4)), k);
    k->mn = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), m4));
    k->d = f16_at(b + 80);
    k->dmin = f16_at(b + 82);
}

/* Σ_k scale * code * x over the block, exact in int32, starting from init. */
QUANT_ALWAYS_INLINE __m512i k_isum(const struct k_row *k, const uint8_t *xb, __m512i init) {
    __m512i s = init;
    UNROLL for (int j = 0; j < 4; j++) {
        __m512i p = _mm512_maddubs_epi16(k->c[j], _mm512_loadu_si512(xb + 4 + 64 * j));
        s = _mm512_dpwssd_epi32(s, p, k->sc[j]);
    }
    return s;
}

/* d*dy*isum - dmin*dy*Σ mn*bsums (Q2_K, Q4_K, Q5_K). */
QUANT_ALWAYS_INLINE __m512 k4_block(const struct k_row *k, const uint8_t *xb, __m512 acc) {
    __m512i is = k_isum(k, xb, _mm512_setzero_si512());
    __m256i ms = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(xb + 260)), k->mn);
    float dy = quant_rd_f32(xb);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_set1_ps(k->d * dy), acc);
    return _mm512_fnmadd_ps(_mm512_zextps256_ps512(_mm256_cvtepi32_ps(ms)),
                            _mm512_set1_ps(k->dmin * dy), acc);
}

/* d*dy*(isum - k Σ sc*bsums) (Q6_K: k = 32, Q3_K: k = 4). */
QUANT_ALWAYS_INLINE __m512 q6_block(const struct k_row *k, const uint8_t *xb, __m512 acc) {
    __m256i corr = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(xb + 260)), k->mn);
    __m512i is = k_isum(k, xb, _mm512_zextsi256_si512(corr));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_set1_ps(k->d * quant_rd_f32(xb)), acc);
}

#define DEF_KQ(NAME, BLOCK_BYTES, ROW, BLOCK)                                                  \
    QUANT_ALWAYS_INLINE void NAME##_tile(const struct quant_gemm_args *g, int64_t o0,          \
                                         int64_t t0, int R, int T) {                           \
        struct tile tl;                                                                        \
        tile_init(&tl, g, o0, t0, R, T);                                                       \
        for (int64_t ib = 0; ib < g->n / 256; ib++) {                                          \
            UNROLL for (int r = 0; r < R; r++) {                                               \
                struct k_row k;                                                                \
                ROW(tl.w[r] + ib * (BLOCK_BYTES), &k);                                         \
                UNROLL for (int t = 0; t < T; t++)                                             \
                    tl.acc[r][t] = BLOCK(&k, tl.x[t] + ib * Q8K_BYTES, tl.acc[r][t]);          \
            }                                                                                  \
        }                                                                                      \
        tile_store(&tl, g, o0, t0, R, T);                                                      \
    }                                                                                          \
    QUANT_TILES(NAME)

DEF_KQ(q2_K, 84, q2_K_row, k4_block)
DEF_KQ(q3_K, 110, q3_K_row, q6_block)
DEF_KQ(q4_K, 144, q4_K_row, k4_block)
DEF_KQ(q5_K, 176, q5_K_row, k4_block)
DEF_KQ(q6_K, 210, q6_K_row, q6_block)
QUANT_GEMM(q2_K, 4, 4)
QUANT_GEMM(q3_K, 4, 4)
QUANT_GEMM(q4_K, 4, 4)
QUANT_GEMM(q5_K, 4, 4)
QUANT_GEMM(q6_K, 4, 4)

/* ------------------------------------------------------------------------------------------
 * F32, F16, BF16: 16 elements per step, FMA into one accumulator per output; the row tail
 * (n % 16) goes through masked loads that read zeros past the end. */

QUANT_ALWAYS_INLINE __m512 ld_f32(const uint8_t *p, __mmask16 m) {
    return _mm512_maskz_loadu_ps(m, p);
}
QUANT_ALWAYS_INLINE __m512 ld_f16(const uint8_t *p, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}
QUANT_ALWAYS_INLINE __m512 ld_bf16(const uint8_t *p, __mmask16 m) {
    __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

#define DEF_FLOAT(NAME, ELEM_BYTES, LOAD)                                                      \
    QUANT_ALWAYS_INLINE void NAME##_step(struct tile *tl, int64_t i, __mmask16 m, int R,       \
                                         int T) {                                              \
        __m512 wv[QUANT_TILE_MAX];                                                             \
        UNROLL for (int r = 0; r < R; r++) wv[r] = LOAD(tl->w[r] + i * (ELEM_BYTES), m);       \
        UNROLL for (int t = 0; t < T; t++) {                                                   \
            __m512 xv = LOAD(tl->x[t] + i * (ELEM_BYTES), m);                                  \
            UNROLL for (int r = 0; r < R; r++)                                                 \
                tl->acc[r][t] = _mm512_fmadd_ps(wv[r], xv, tl->acc[r][t]);                     \
        }                                                                                      \
    }                                                                                          \
    QUANT_ALWAYS_INLINE void NAME##_tile(const struct quant_gemm_args *g, int64_t o0,          \
                                         int64_t t0, int R, int T) {                           \
        struct tile tl;                                                                        \
        tile_init(&tl, g, o0, t0, R, T);                                                       \
        int64_t i = 0;                                                                         \
        for (; i + 16 <= g->n; i += 16) NAME##_step(&tl, i, 0xFFFF, R, T);                     \
        if (i < g->n) NAME##_step(&tl, i, (__mmask16)((1u << (g->n - i)) - 1), R, T);          \
        tile_store(&tl, g, o0, t0, R, T);                                                      \
    }                                                                                          \
    QUANT_TILES(NAME)

DEF_FLOAT(f32, 4, ld_f32)
DEF_FLOAT(f16, 2, ld_f16)
DEF_FLOAT(bf16, 2, ld_bf16)
QUANT_GEMM(f32, 4, 4)
QUANT_GEMM(f16, 4, 4)
QUANT_GEMM(bf16, 4, 4)

/* ------------------------------------------------------------------------------------------
 * from_float. */

/* roundf semantics (half away from zero) on v, clamped to [-127, 127], NaN -> 0. */
static inline __m512i round_away_q8(__m512 v) {
    __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m512 frac = _mm512_sub_ps(v, t);   /* exact */
    __mmask16 up = _mm512_cmp_ps_mask(_mm512_abs_ps(frac), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    __m512 one = _mm512_or_ps(_mm512_and_ps(v, _mm512_set1_ps(-0.0f)), _mm512_set1_ps(1.0f));
    t = _mm512_mask_add_ps(t, up, t, one);
    t = _mm512_min_ps(_mm512_max_ps(t, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
    __mmask16 ord = _mm512_cmp_ps_mask(v, v, _CMP_ORD_Q);
    return _mm512_maskz_cvttps_epi32(ord, t);
}

/* Q8_0 / Q8_1 block: codes into qs, returns d (f32) and the code sum. */
static inline float q8_block(const float *x, int8_t *qs, int *sum) {
    __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    __m512 vid = _mm512_set1_ps(id);
    __m512i q0 = round_away_q8(_mm512_mul_ps(v0, vid)), q1 = round_away_q8(_mm512_mul_ps(v1, vid));
    _mm_storeu_si128((__m128i *)qs, _mm512_cvtsepi32_epi8(q0));
    _mm_storeu_si128((__m128i *)(qs + 16), _mm512_cvtsepi32_epi8(q1));
    *sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    return d;
}

QUANT_Q8_FROM_FLOAT(q8_block)

static void q8_K_from_float(const float *x, void *y, int64_t n) {
    uint8_t *out = y;
    for (int64_t ib = 0; ib < n / 256; ib++, x += 256, out += Q8K_BYTES) {
        __m512 am = _mm512_setzero_ps();
        for (int j = 0; j < 16; j++) am = _mm512_max_ps(am, _mm512_abs_ps(_mm512_loadu_ps(x + 16 * j)));
        float amax = _mm512_reduce_max_ps(am);
        memset(out, 0, Q8K_BYTES);
        if (amax == 0.0f) continue;
        /* the signed value of the first element with |x| == amax */
        float max = amax;
        for (int j = 0; j < 16; j++) {
            __mmask16 m = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(x + 16 * j)),
                                             _mm512_set1_ps(amax), _CMP_EQ_OQ);
            if (m) { max = x[16 * j + __builtin_ctz(m)]; break; }
        }
        float iscale = -127.0f / max;
        int16_t bsums[16];
        for (int j = 0; j < 16; j++) {
            __m512 p = _mm512_mul_ps(_mm512_loadu_ps(x + 16 * j), _mm512_set1_ps(iscale));
            __mmask16 ord = _mm512_cmp_ps_mask(p, p, _CMP_ORD_Q);   /* NaN -> 0 */
            p = _mm512_min_ps(_mm512_max_ps(p, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
            __m512i q = _mm512_maskz_cvt_roundps_epi32(ord, p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            _mm_storeu_si128((__m128i *)(out + 4 + 16 * j), _mm512_cvtsepi32_epi8(q));
            bsums[j] = (int16_t)_mm512_reduce_add_epi32(q);
        }
        float d = 1 / iscale;
        memcpy(out, &d, 4);
        memcpy(out + 260, bsums, sizeof bsums);
    }
}

static void f16_from_float(const float *x, void *y, int64_t n) {
    uint8_t *out = y;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(out + 2 * i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_mask_storeu_epi16(out + 2 * i, m, h);
    }
}

/* bf16: round to nearest even on the bit pattern; NaN -> quiet (quant-formats.md §1). */
static inline __m256i bf16_round(__m512 v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
    __mmask16 nan = _mm512_cmp_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                          _mm512_set1_epi32(0x7F800000), _MM_CMPINT_NLE);
    r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(r);
}

static void bf16_from_float(const float *x, void *y, int64_t n) {
    uint8_t *out = y;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(out + 2 * i), bf16_round(_mm512_loadu_ps(x + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm256_mask_storeu_epi16(out + 2 * i, m, bf16_round(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

/* ------------------------------------------------------------------------------------------
 * Table. */

void quant_kernels_fill_avx512(enum ggml_type t, struct quant_kernels *k) {
    switch (k->vec_dot_type) {
    case GGML_TYPE_Q8_0: k->from_float = q8_0_from_float; break;
    case GGML_TYPE_Q8_1: k->from_float = q8_1_from_float; break;
    case GGML_TYPE_Q8_K: k->from_float = q8_K_from_float; break;
    case GGML_TYPE_F16: k->from_float = f16_from_float; break;
    case GGML_TYPE_BF16: k->from_float = bf16_from_float; break;
    default: break;   /* F32: the reference copy is as fast as it gets */
    }
    switch (t) {
    case GGML_TYPE_F32: k->gemm = f32_gemm; break;
    case GGML_TYPE_F16: k->gemm = f16_gemm; break;
    case GGML_TYPE_BF16: k->gemm = bf16_gemm; break;
    case GGML_TYPE_Q4_0:
        k->gemm = q4_0_gemm;
        k->packed_size = quant_q4_0_packed_size;
        k->pack = quant_q4_0_pack;
        k->packed_gemm = quant_q4_0_packed_gemm_avx512;
        k->packed_row = quant_q4_0_packed_row;
        break;
    case GGML_TYPE_Q4_1: k->gemm = q4_1_gemm; break;
    case GGML_TYPE_Q5_0: k->gemm = q5_0_gemm; break;
    case GGML_TYPE_Q5_1: k->gemm = q5_1_gemm; break;
    case GGML_TYPE_Q8_0:
        k->gemm = q8_0_gemm;
        k->packed_size = quant_q8_0_packed_size;
        k->pack = quant_q8_0_pack;
        k->packed_gemm = quant_q8_0_packed_gemm_avx512;
        k->packed_row = quant_q8_0_packed_row;
        break;
    case GGML_TYPE_Q2_K: k->gemm = q2_K_gemm; break;
    case GGML_TYPE_Q3_K: k->gemm = q3_K_gemm; break;
    case GGML_TYPE_Q4_K: k->gemm = q4_K_gemm; break;
    case GGML_TYPE_Q5_K: k->gemm = q5_K_gemm; break;
    case GGML_TYPE_Q6_K: k->gemm = q6_K_gemm; break;
    default: break;
    }
}
