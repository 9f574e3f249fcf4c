/* kernels_avx2.c — AVX2 + FMA + F16C kernels: activation conversion (from_float) and tiled gemm
 * for F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K .. Q6_K. Compiled with the AVX2
 * flags (Makefile: *_avx2.c) and only called when quant_cpu_level_detect() found them.
 * The AVX-512 file replaces most of these on CPUs that have it; this is the path for the
 * others, so it favours plain code over the last few percent.
 *
 * Integer dot products are exact (quant-formats.md §5.2): vpmaddubsw multiplies unsigned by
 * signed bytes into int16 pairs, vpmaddwd widens (with the sub-block scale for K-quants).
 * Saturation cannot happen: |pair sum| <= 2 * 63 * 127 for codes <= 63, and Q8_0 x Q8_0 uses
 * the sign trick (|w| times x with w's sign; activation codes are never -128), so
 * |pair| <= 2 * 128 * 127 = 32512. Signed 4- and 5-bit codes c - k are handled by subtracting
 * the int16 pair sums of k * x, computed once per activation block for the whole tile.
 * Block results are converted to f32 and accumulated with FMA in 8 lanes per output; one
 * fixed horizontal sum per output, the same in every tile shape (internal.h).
 *
 * from_float writes the reference bytes for finite input (see kernels_avx512.c). */
#include "quant/internal.h"

#include <immintrin.h>

#define UNROLL _Pragma("GCC unroll 4")

/* ------------------------------------------------------------------------------------------
 * Helpers. */

static inline float hsum256(__m256 v) {   /* the one reduction every output goes through */
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}

static inline float f16_at(const uint8_t *p) { return _cvtsh_ss(quant_rd_u16(p)); }

struct tile {
    const uint8_t *w[QUANT_TILE_MAX], *x[QUANT_TILE_MAX];
    __m256 acc[QUANT_TILE_MAX][QUANT_TILE_MAX];
};

QUANT_ALWAYS_INLINE void tile_init(struct tile *tl, const struct quant_gemm_args *g, int64_t o0,
                                   int64_t t0, int R, int T) {
    UNROLL for (int r = 0; r < R; r++) tl->w[r] = g->w + (size_t)(o0 + r) * g->rb;
    UNROLL for (int t = 0; t < T; t++) tl->x[t] = g->x + (size_t)(t0 + t) * g->xrb;
    UNROLL for (int r = 0; r < R; r++)
        UNROLL for (int t = 0; t < T; t++) tl->acc[r][t] = _mm256_setzero_ps();
}

QUANT_ALWAYS_INLINE void tile_store(const struct tile *tl, const struct quant_gemm_args *g,
                                    int64_t o0, int64_t t0, int R, int T) {
    UNROLL for (int t = 0; t < T; t++)
        UNROLL for (int r = 0; r < R; r++) g->y[(t0 + t) * g->ldy + o0 + r] = hsum256(tl->acc[r][t]);
}

static inline __m256i loadu256(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* int16 pairs -> int32 sums of pairs. */
static inline __m256i sum_pairs(__m256i p16) { return _mm256_madd_epi16(p16, _mm256_set1_epi16(1)); }

/* 16 nibble bytes -> 32 codes in element order (low nibbles are elements 0..15). */
static inline __m256i nibbles_32(const uint8_t *p) {
    __m128i q = _mm_loadu_si128((const __m128i *)p);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
}

/* 0x10 in byte j where bit j of the 32-bit qh is set (the 5th bit of Q5_0/Q5_1 codes). */
static inline __m256i qh_bits_32(uint32_t qh) {
    const __m256i spread = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                             0x0101010101010101, 0x0000000000000000);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), spread);   /* byte j <- qh byte j/8 */
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);   /* 1 << (j%8) */
    __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

/* ------------------------------------------------------------------------------------------
 * Q8_0 x Q8_0 (sign trick), Q4_0 / Q5_0 x Q8_0 (unsigned codes minus k). */

QUANT_ALWAYS_INLINE void q8_0_tile(const struct quant_gemm_args *g, int64_t o0, int64_t t0, int R,
                                   int T) {
    struct tile tl;
    tile_init(&tl, g, o0, t0, R, T);
    for (int64_t ib = 0; ib < g->n / 32; ib++) {
        __m256i wq[QUANT_TILE_MAX], aw[QUANT_TILE_MAX];
        __m256 dw[QUANT_TILE_MAX];
        UNROLL for (int r = 0; r < R; r++) {
            const uint8_t *p = tl.w[r] + ib * 34;
            wq[r] = loadu256(p + 2);
            aw[r] = _mm256_sign_epi8(wq[r], wq[r]);
            dw[r] = _mm256_set1_ps(f16_at(p));
        }
        UNROLL for (int t = 0; t < T; t++) {
            const uint8_t *p = tl.x[t] + ib * 34;
            __m256i xq = loadu256(p + 2);
            __m256 dx = _mm256_set1_ps(f16_at(p));
            UNROLL for (int r = 0; r < R; r++) {
                __m256i s = sum_pairs(_mm256_maddubs_epi16(aw[r], _mm256_sign_epi8(xq, wq[r])));
                tl.acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw[r], dx), tl.acc[r][t]);
            }
        }
    }
    tile_store(&tl, g, o0, t0, R, T);
}

QUANT_ALWAYS_INLINE __m256i q4_0_codes(const uint8_t *p) { return nibbles_32(p + 2); }
QUANT_ALWAYS_INLINE __m256i q5_0_codes(const uint8_t *p) {
    return _mm256_or_si256(nibbles_32(p + 6), qh_bits_32(quant_rd_u32(p + 2)));
}

#define DEF_OFFSET32(NAME, BLOCK_BYTES, OFFSET, CODES)                                         \
    QUANT_ALWAYS_INLINE void NAME##_tile(const struct quant_gemm_args *g, int64_t o0,          \
                                         int64_t t0, int R, int T) {                           \
        struct tile tl;                                                                        \
        tile_init(&tl, g, o0, t0, R, T);                                                       \
        for (int64_t ib = 0; ib < g->n / 32; ib++) {                                           \
            __m256i wq[QUANT_TILE_MAX];                                                        \
            __m256 dw[QUANT_TILE_MAX];                                                         \
            UNROLL for (int r = 0; r < R; r++) {                                               \
                const uint8_t *p = tl.w[r] + ib * (BLOCK_BYTES);                               \
                wq[r] = CODES(p);                                                              \
                dw[r] = _mm256_set1_ps(f16_at(p));                                             \
            }                                                                                  \
            UNROLL for (int t = 0; t < T; t++) {                                               \
                const uint8_t *p = tl.x[t] + ib * 34;                                          \
                __m256i xq = loadu256(p + 2);                                                  \
                __m256 dx = _mm256_set1_ps(f16_at(p));                                         \
                __m256i kx = _mm256_maddubs_epi16(_mm256_set1_epi8(OFFSET), xq);               \
                UNROLL for (int r = 0; r < R; r++) {                                           \
                    __m256i p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(wq[r], xq), kx);       \
                    tl.acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum_pairs(p16)),         \
                                                   _mm256_mul_ps(dw[r], dx), tl.acc[r][t]);    \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
        tile_store(&tl, g, o0, t0, R, T);                                                      \
    }                                                                                          \
    QUANT_TILES(NAME)

QUANT_TILES(q8_0)
DEF_OFFSET32(q4_0, 18, 8, q4_0_codes)
DEF_OFFSET32(q5_0, 22, 16, q5_0_codes)
QUANT_GEMM(q8_0, 2, 2)
QUANT_GEMM(q4_0, 2, 2)
QUANT_GEMM(q5_0, 2, 2)

/* ------------------------------------------------------------------------------------------
 * Q4_1 / Q5_1 x Q8_1: unsigned codes; the min term m*s goes into lane 0 with one FMA. */

QUANT_ALWAYS_INLINE __m256i q4_1_codes(const uint8_t *p) { return nibbles_32(p + 4); }
QUANT_ALWAYS_INLINE __m256i q5_1_codes(const uint8_t *p) {
    return _mm256_or_si256(nibbles_32(p + 8), qh_bits_32(quant_rd_u32(p + 4)));
}

static inline __m256 lane0(float v) { return _mm256_zextps128_ps256(_mm_set_ss(v)); }

#define DEF_MIN32(NAME, BLOCK_BYTES, CODES)                                                    \
    QUANT_ALWAYS_INLINE void NAME##_tile(const struct quant_gemm_args *g, int64_t o0,          \
                                         int64_t t0, int R, int T) {                           \
        struct tile tl;                                                                        \
        tile_init(&tl, g, o0, t0, R, T);                                                       \
        for (int64_t ib = 0; ib < g->n / 32; ib++) {                                           \
            __m256i wq[QUANT_TILE_MAX];                                                        \
            __m256 dw[QUANT_TILE_MAX], mw[QUANT_TILE_MAX];                                     \
            UNROLL for (int r = 0; r < R; r++) {                                               \
                const uint8_t *p = tl.w[r] + ib * (BLOCK_BYTES);                               \
                wq[r] = CODES(p);                                                              \
                dw[r] = _mm256_set1_ps(f16_at(p));                                             \
                mw[r] = lane0(f16_at(p + 2));                                                  \
            }                                                                                  \
            UNROLL for (int t = 0; t < T; t++) {                                               \
                const uint8_t *p = tl.x[t] + ib * 36;                                          \
                __m256i xq = loadu256(p + 4);                                                  \
                __m256 dx = _mm256_set1_ps(f16_at(p)), sx = lane0(f16_at(p + 2));              \
                UNROLL for (int r = 0; r < R; r++) {                                           \
                    __m256i s = sum_pairs(_mm256_maddubs_epi16(wq[r], xq));                    \
                    __m256 a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw[r], dx), \
                                               tl.acc[r][t]);                                  \
                    tl.acc[r][t] = _mm256_fmadd_ps(mw[r], sx, a);                              \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
        tile_store(&tl, g, o0, t0, R, T);                                                      \
    }                                                                                          \
    QUANT_TILES(NAME)

DEF_MIN32(q4_1, 20, q4_1_codes)
DEF_MIN32(q5_1, 24, q5_1_codes)
QUANT_GEMM(q4_1, 2, 2)
QUANT_GEMM(q5_1, 2, 2)

/* ------------------------------------------------------------------------------------------
 * K-quants x Q8_K (292-byte activation blocks: d f32 @0, qs@4, bsums@260). Per weight row and
 * block the codes and int16 scales are unpacked once into 8 vectors of 32 elements, then each
 * token of the tile runs maddubs + madd(scale) over them. */

#define Q8K_BYTES 292

struct k_row {
    __m256i c[8];     /* codes of elements 32j..32j+31, unsigned */
    __m256i sc[8];    /* int16 scale of each code pair of c[j] */
    __m256i mn;       /* Q4_K/Q5_K: int16 min per bsum; Q6_K: -32 * scale per bsum */
    float d, dmin;
};

QUANT_ALWAYS_INLINE void k4_row_scales(const uint8_t *b, struct k_row *k) {
    uint64_t sc8, mn8;
    quant_k4_scales_mins(b + 4, &sc8, &mn8);
    UNROLL for (int j = 0; j < 8; j++) k->sc[j] = _mm256_set1_epi16((short)((sc8 >> (8 * j)) & 0xFF));
    __m128i mn16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)mn8));   /* mn0..mn7 */
    k->mn = _mm256_set_m128i(_mm_unpackhi_epi16(mn16, mn16), _mm_unpacklo_epi16(mn16, mn16));
    k->d = f16_at(b);
    k->dmin = f16_at(b + 2);
}

QUANT_ALWAYS_INLINE void k4_nibbles(const uint8_t *qs, struct k_row *k) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    UNROLL for (int c = 0; c < 4; c++) {   /* 32 bytes: sub-block 2c low, 2c+1 high nibbles */
        __m256i v = loadu256(qs + 32 * c);
        k->c[2 * c] = _mm256_and_si256(v, m4);
        k->c[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    }
}

QUANT_ALWAYS_INLINE void q4_K_row(const uint8_t *b, struct k_row *k) {
    k4_row_scales(b, k);
    k4_nibbles(b + 16, k);
}

QUANT_ALWAYS_INLINE void q5_K_row(const uint8_t *b, struct k_row *k) {
    k4_row_scales(b, k);
    k4_nibbles(b + 48, k);
    __m256i qh = loadu256(b + 16);   /* bit j of qh[l]: 5th bit of element 32j + l */
    UNROLL for (int j = 0; j < 8; j++) {
        __m256i bit = _mm256_set1_epi8((char)(1 << j));
        __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
        k->c[j] = _mm256_or_si256(k->c[j], _mm256_and_si256(set, _mm256_set1_epi8(16)));
    }
}

/* 16 int16 scales, one per 16-element sub-block: c[j] (32 elements) covers sub-blocks 2j
 * (pairs 0..7) and 2j + 1 (pairs 8..15). */
QUANT_ALWAYS_INLINE void k16_pair_scales(__m256i sc16, struct k_row *k) {
    int16_t s[16];
    _mm256_storeu_si256((__m256i *)s, sc16);
    UNROLL for (int j = 0; j < 8; j++)
        k->sc[j] = _mm256_set_m128i(_mm_set1_epi16(s[2 * j + 1]), _mm_set1_epi16(s[2 * j]));
}

QUANT_ALWAYS_INLINE void q6_K_row(const uint8_t *b, struct k_row *k) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
    UNROLL for (int h = 0; h < 2; h++) {
        __m256i ql0 = loadu256(b + 64 * h), ql1 = loadu256(b + 64 * h + 32);
        __m256i qh = loadu256(b + 128 + 32 * h);
        /* group g (elements 128h + 32g + l): low 4 bits from ql, bits 2g..2g+1 of qh on top */
        __m256i lo[4] = {_mm256_and_si256(ql0, m4), _mm256_and_si256(ql1, m4),
                         _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                         _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4)};
        UNROLL for (int g = 0; g < 4; g++) {
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * g), m3);
            k->c[4 * h + g] = _mm256_or_si256(lo[g], _mm256_slli_epi16(hi, 4));
        }
    }
    __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 192)));
    k16_pair_scales(sc16, k);
    k->mn = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc16, 5));
    k->d = f16_at(b + 208);
    k->dmin = 0.0f;
}

/* 2-bit codes of Q2_K / Q3_K: element 128h + 32j + l is bits 2j..2j+1 of qs[32h + l]. */
QUANT_ALWAYS_INLINE __m256i k2_low_bits(const uint8_t *qs, int h, int j) {
    return _mm256_and_si256(_mm256_srli_epi16(loadu256(qs + 32 * h), 2 * j), _mm256_set1_epi8(3));
}

/* Q3_K: code + 4 = low bits + 4 * (bit 4h + j of hmask[l]); the +4 comes back out as
 * -4 * Σ_t sc_t bsums_t. */
QUANT_ALWAYS_INLINE void q3_K_row(const uint8_t *b, struct k_row *k) {
    __m256i hm = loadu256(b);
    UNROLL for (int h = 0; h < 2; h++)
        UNROLL for (int j = 0; j < 4; j++) {
            __m256i bit = _mm256_set1_epi8((char)(1 << (4 * h + j)));
            __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit);
            k->c[4 * h + j] = _mm256_or_si256(k2_low_bits(b + 32, h, j),
                                              _mm256_and_si256(set, _mm256_set1_epi8(4)));
        }
    uint32_t w[4];
    quant_k3_scales_u6(b + 96, w);
    __m256i sc16 = _mm256_sub_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)w)),
                                    _mm256_set1_epi16(32));
    k16_pair_scales(sc16, k);
    k->mn = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc16, 2));
    k->d = f16_at(b + 108);
    k->dmin = 0.0f;
}

/* Q2_K: codes 0..3; byte t of scales: low nibble scale, high nibble min of sub-block t. */
QUANT_ALWAYS_INLINE void q2_K_row(const uint8_t *b, struct k_row *k) {
    UNROLL for (int h = 0; h < 2; h++)
        UNROLL for (int j = 0; j < 4; j++) k->c[4 * h + j] = k2_low_bits(b + 16, h, j);
    __m128i s = _mm_loadu_si128((const __m128i *)b);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    k16_pair_scales(_mm256_cvtepu8_epi16(_mm_and_si128(s, m4)), k);
    k->mn = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), m4));
    k->d = f16_at(b + 80);
    k->dmin = f16_at(b + 82);
}

QUANT_ALWAYS_INLINE __m256i k_isum(const struct k_row *k, const uint8_t *xb, __m256i s) {
    UNROLL for (int j = 0; j < 8; j++) {
        __m256i p = _mm256_maddubs_epi16(k->c[j], loadu256(xb + 4 + 32 * j));
        s = _mm256_add_epi32(s, _mm256_madd_epi16(p, k->sc[j]));
    }
    return s;
}

QUANT_ALWAYS_INLINE __m256 k4_block(const struct k_row *k, const uint8_t *xb, __m256 acc) {
    __m256i is = k_isum(k, xb, _mm256_setzero_si256());
    __m256i ms = _mm256_madd_epi16(loadu256(xb + 260), k->mn);
    float dy = quant_rd_f32(xb);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_set1_ps(k->d * dy), acc);
    return _mm256_fnmadd_ps(_mm256_cvtepi32_ps(ms), _mm256_set1_ps(k->dmin * dy), acc);
}

QUANT_ALWAYS_INLINE __m256 q6_block(const struct k_row *k, const uint8_t *xb, __m256 acc) {
    __m256i corr = _mm256_madd_epi16(loadu256(xb + 260), k->mn);
    __m256i is = k_isum(k, xb, corr);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_set1_ps(k->d * quant_rd_f32(xb)), acc);
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
QUANT_GEMM(q2_K, 2, 2)
QUANT_GEMM(q3_K, 2, 2)
QUANT_GEMM(q4_K, 2, 2)
QUANT_GEMM(q5_K, 2, 2)
QUANT_GEMM(q6_K, 2, 2)

/* ------------------------------------------------------------------------------------------
 * F32, F16, BF16: 8 elements per step; the row tail (n % 8) is copied into a zeroed buffer so
 * every load is a full one and the tail adds exact zeros. */

QUANT_ALWAYS_INLINE __m256 ld_f32(const uint8_t *p) { return _mm256_loadu_ps((const float *)(const void *)p); }
QUANT_ALWAYS_INLINE __m256 ld_f16(const uint8_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
QUANT_ALWAYS_INLINE __m256 ld_bf16(const uint8_t *p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

#define DEF_FLOAT(NAME, ELEM_BYTES, LOAD)                                                      \
    QUANT_ALWAYS_INLINE void NAME##_step(struct tile *tl, const uint8_t *const *wp,            \
                                         const uint8_t *const *xp, int R, int T) {             \
        __m256 wv[QUANT_TILE_MAX];                                                             \
        UNROLL for (int r = 0; r < R; r++) wv[r] = LOAD(wp[r]);                                \
        UNROLL for (int t = 0; t < T; t++) {                                                   \
            __m256 xv = LOAD(xp[t]);                                                           \
            UNROLL for (int r = 0; r < R; r++)                                                 \
                tl->acc[r][t] = _mm256_fmadd_ps(wv[r], xv, tl->acc[r][t]);                     \
        }                                                                                      \
    }                                                                                          \
    QUANT_ALWAYS_INLINE void NAME##_tile(const struct quant_gemm_args *g, int64_t o0,          \
                                         int64_t t0, int R, int T) {                           \
        struct tile tl;                                                                        \
        tile_init(&tl, g, o0, t0, R, T);                                                       \
        const uint8_t *wp[QUANT_TILE_MAX], *xp[QUANT_TILE_MAX];                                \
        int64_t i = 0;                                                                         \
        for (; i + 8 <= g->n; i += 8) {                                                        \
            UNROLL for (int r = 0; r < R; r++) wp[r] = tl.w[r] + i * (ELEM_BYTES);             \
            UNROLL for (int t = 0; t < T; t++) xp[t] = tl.x[t] + i * (ELEM_BYTES);             \
            NAME##_step(&tl, wp, xp, R, T);                                                    \
        }                                                                                      \
        if (i < g->n) {                                                                        \
            uint8_t wb[QUANT_TILE_MAX][32] = {{0}}, xb[QUANT_TILE_MAX][32] = {{0}};            \
            size_t rest = (size_t)(g->n - i) * (ELEM_BYTES);                                   \
            UNROLL for (int r = 0; r < R; r++) {                                               \
                memcpy(wb[r], tl.w[r] + i * (ELEM_BYTES), rest);                               \
                wp[r] = wb[r];                                                                 \
            }                                                                                  \
            UNROLL for (int t = 0; t < T; t++) {                                               \
                memcpy(xb[t], tl.x[t] + i * (ELEM_BYTES), rest);                               \
                xp[t] = xb[t];                                                                 \
            }                                                                                  \
            NAME##_step(&tl, wp, xp, R, T);                                                    \
        }                                                                                      \
        tile_store(&tl, g, o0, t0, R, T);                                                      \
    }                                                                                          \
    QUANT_TILES(NAME)

DEF_FLOAT(f32, 4, ld_f32)
DEF_FLOAT(f16, 2, ld_f16)
DEF_FLOAT(bf16, 2, ld_bf16)
QUANT_GEMM(f32, 2, 4)
QUANT_GEMM(f16, 2, 4)
QUANT_GEMM(bf16, 2, 4)

/* ------------------------------------------------------------------------------------------
 * from_float. */

/* roundf semantics (half away from zero), clamped to [-127, 127], NaN -> 0. */
static inline __m256i round_away_q8(__m256 v) {
    __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256 frac = _mm256_sub_ps(v, t);   /* exact */
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 up = _mm256_cmp_ps(_mm256_andnot_ps(sign, frac), _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    __m256 one = _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(1.0f));
    t = _mm256_add_ps(t, _mm256_and_ps(up, one));
    t = _mm256_min_ps(_mm256_max_ps(t, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
    t = _mm256_and_ps(t, _mm256_cmp_ps(v, v, _CMP_ORD_Q));
    return _mm256_cvttps_epi32(t);
}

/* Four int32 vectors (already in int8 range) -> 32 bytes in order. */
static inline __m256i pack_32(__m256i a, __m256i b, __m256i c, __m256i d) {
    __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
    __m256i abcd = _mm256_packs_epi16(ab, cd);
    return _mm256_permutevar8x32_epi32(abcd, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

static inline int hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

static inline float hmax_ps(__m256 v) {   /* max is exact, so any order gives the same */
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

static inline __m256 abs_ps(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

static inline float q8_block(const float *x, int8_t *qs, int *sum) {
    __m256 v[4], am = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(x + 8 * i);
        am = _mm256_max_ps(am, abs_ps(v[i]));
    }
    float amax = hmax_ps(am);
    float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    __m256 vid = _mm256_set1_ps(id);
    __m256i q[4];
    for (int i = 0; i < 4; i++) q[i] = round_away_q8(_mm256_mul_ps(v[i], vid));
    _mm256_storeu_si256((__m256i *)qs, pack_32(q[0], q[1], q[2], q[3]));
    *sum = hsum_i32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
    return d;
}

QUANT_Q8_FROM_FLOAT(q8_block)

static void q8_K_from_float(const float *x, void *y, int64_t n) {
    uint8_t *out = y;
    for (int64_t ib = 0; ib < n / 256; ib++, x += 256, out += Q8K_BYTES) {
        __m256 am = _mm256_setzero_ps();
        for (int j = 0; j < 32; j++) am = _mm256_max_ps(am, abs_ps(_mm256_loadu_ps(x + 8 * j)));
        float amax = hmax_ps(am);
        memset(out, 0, Q8K_BYTES);
        if (amax == 0.0f) continue;
        float max = amax;   /* the signed value of the first element with |x| == amax */
        for (int j = 0; j < 256; j++)
            if (x[j] == amax || x[j] == -amax) { max = x[j]; break; }
        float iscale = -127.0f / max;
        const __m256 vs = _mm256_set1_ps(iscale);
        int16_t bsums[16];
        for (int j = 0; j < 8; j++) {   /* 32 values per step */
            __m256i q[4];
            for (int i = 0; i < 4; i++) {
                __m256 p = _mm256_mul_ps(_mm256_loadu_ps(x + 32 * j + 8 * i), vs);
                __m256 ord = _mm256_cmp_ps(p, p, _CMP_ORD_Q);   /* NaN -> 0 */
                p = _mm256_round_ps(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                p = _mm256_min_ps(_mm256_max_ps(p, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
                p = _mm256_and_ps(p, ord);
                q[i] = _mm256_cvttps_epi32(p);
            }
            _mm256_storeu_si256((__m256i *)(out + 4 + 32 * j), pack_32(q[0], q[1], q[2], q[3]));
            bsums[2 * j] = (int16_t)hsum_i32(_mm256_add_epi32(q[0], q[1]));
            bsums[2 * j + 1] = (int16_t)hsum_i32(_mm256_add_epi32(q[2], q[3]));
        }
        float d = 1 / iscale;
        memcpy(out, &d, 4);
        memcpy(out + 260, bsums, sizeof bsums);
    }
}

static void f16_from_float(const float *x, void *y, int64_t n) {
    uint8_t *out = y;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(out + 2 * i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (i < n) {
        float buf[8] = {0};
        uint16_t h[8];
        memcpy(buf, x + i, (size_t)(n - i) * 4);
        _mm_storeu_si128((__m128i *)h, _mm256_cvtps_ph(_mm256_loadu_ps(buf), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        memcpy(out + 2 * i, h, (size_t)(n - i) * 2);
    }
}

/* bf16: round to nearest even on the bit pattern; NaN -> quiet (quant-formats.md §1). */
static inline __m128i bf16_round(__m256 v) {
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb), 16);
    __m256i mag = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
    __m256i nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7F800000));   /* mag >= 0: signed ok */
    __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    r = _mm256_blendv_epi8(r, q, nan);
    __m256i p = _mm256_packus_epi32(r, r);   /* values < 2^16: no saturation */
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(p, 0x08));
}

static void bf16_from_float(const float *x, void *y, int64_t n) {
    uint8_t *out = y;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm_storeu_si128((__m128i *)(out + 2 * i), bf16_round(_mm256_loadu_ps(x + i)));
    if (i < n) {
        float buf[8] = {0};
        uint16_t h[8];
        memcpy(buf, x + i, (size_t)(n - i) * 4);
        _mm_storeu_si128((__m128i *)h, bf16_round(_mm256_loadu_ps(buf)));
        memcpy(out + 2 * i, h, (size_t)(n - i) * 2);
    }
}

/* ------------------------------------------------------------------------------------------
 * Table. */

void quant_kernels_fill_avx2(enum ggml_type t, struct quant_kernels *k) {
    switch (k->vec_dot_type) {
    case GGML_TYPE_Q8_0: k->from_float = q8_0_from_float; break;
    case GGML_TYPE_Q8_1: k->from_float = q8_1_from_float; break;
    case GGML_TYPE_Q8_K: k->from_float = q8_K_from_float; break;
    case GGML_TYPE_F16: k->from_float = f16_from_float; break;
    case GGML_TYPE_BF16: k->from_float = bf16_from_float; break;
    default: break;
    }
    switch (t) {
    case GGML_TYPE_F32: k->gemm = f32_gemm; break;
    case GGML_TYPE_F16: k->gemm = f16_gemm; break;
    case GGML_TYPE_BF16: k->gemm = bf16_gemm; break;
    case GGML_TYPE_Q4_0: k->gemm = q4_0_gemm; break;
    case GGML_TYPE_Q4_1: k->gemm = q4_1_gemm; break;
    case GGML_TYPE_Q5_0: k->gemm = q5_0_gemm; break;
    case GGML_TYPE_Q5_1: k->gemm = q5_1_gemm; break;
    case GGML_TYPE_Q8_0: k->gemm = q8_0_gemm; break;
    case GGML_TYPE_Q2_K: k->gemm = q2_K_gemm; break;
    case GGML_TYPE_Q3_K: k->gemm = q3_K_gemm; break;
    case GGML_TYPE_Q4_K: k->gemm = q4_K_gemm; break;
    case GGML_TYPE_Q5_K: k->gemm = q5_K_gemm; break;
    case GGML_TYPE_Q6_K: k->gemm = q6_K_gemm; break;
    default: break;
    }
}
