/* internal.h — block layouts and helpers shared by quant.c (reference), kquants.c
 * (K-quant reference) and the SIMD files kernels_avx2.c / kernels_avx512.c. Not for other modules:
 * they see only quant.h. Layouts follow ggml-common.h byte for byte (quant-formats.md §3-4);
 * every struct is packed by construction (only uint8_t/uint16_t/float members in an order that
 * leaves no padding) and its size is checked below. Weight data comes from an mmap at any
 * alignment, so code reads multi-byte fields through memcpy or unaligned-load intrinsics. */
#ifndef COTI_QUANT_INTERNAL_H
#define COTI_QUANT_INTERNAL_H

#include "quant/quant.h"

#include <string.h>

#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK8_1 32
#define QK_K 256
#define K_SCALE_SIZE 12

typedef uint16_t fp16_t;   /* IEEE binary16 bits */

struct block_q4_0 { fp16_t d; uint8_t qs[QK4_0 / 2]; };
struct block_q4_1 { fp16_t d; fp16_t m; uint8_t qs[QK4_1 / 2]; };
struct block_q5_0 { fp16_t d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; };
struct block_q5_1 { fp16_t d; fp16_t m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; };
struct block_q8_0 { fp16_t d; int8_t qs[QK8_0]; };
struct block_q8_1 { fp16_t d; fp16_t s; int8_t qs[QK8_1]; };
struct block_q2_K { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; fp16_t d; fp16_t dmin; };
struct block_q3_K { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; fp16_t d; };
struct block_q4_K { fp16_t d; fp16_t dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; };
struct block_q5_K {
    fp16_t d; fp16_t dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2];
};
struct block_q6_K { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; fp16_t d; };
struct block_q8_K { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; };

_Static_assert(sizeof(struct block_q4_0) == 18, "q4_0 block size");
_Static_assert(sizeof(struct block_q4_1) == 20, "q4_1 block size");
_Static_assert(sizeof(struct block_q5_0) == 22, "q5_0 block size");
_Static_assert(sizeof(struct block_q5_1) == 24, "q5_1 block size");
_Static_assert(sizeof(struct block_q8_0) == 34, "q8_0 block size");
_Static_assert(sizeof(struct block_q8_1) == 36, "q8_1 block size");
_Static_assert(sizeof(struct block_q2_K) == 84, "q2_K block size");
_Static_assert(sizeof(struct block_q3_K) == 110, "q3_K block size");
_Static_assert(sizeof(struct block_q4_K) == 144, "q4_K block size");
_Static_assert(sizeof(struct block_q5_K) == 176, "q5_K block size");
_Static_assert(sizeof(struct block_q6_K) == 210, "q6_K block size");
_Static_assert(sizeof(struct block_q8_K) == 292, "q8_K block size");
/* The structs have alignment 2 (or 4 for q8_K), weight rows in a file do not: never form a
 * pointer to a struct from file data and dereference it; copy the block (memcpy) or read its
 * bytes at the offsetof() positions. */

/* Little-endian field readers for block bytes at any alignment (x86 is little-endian). */
static inline uint16_t quant_rd_u16(const void *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t quant_rd_u32(const void *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline float quant_rd_f32(const void *p) { float v; memcpy(&v, p, 4); return v; }

/* Decode the 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K 12-byte scales field
 * (quant-formats.md §4 Q4_K): j < 4 keeps them in the low 6 bits of bytes j and j+4; j >= 4
 * splits them into a nibble of byte j+4 plus the top two bits of bytes j-4 and j. */
static inline void quant_k4_scale_min(int j, const uint8_t *s, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* All 8 scales and 8 mins of a Q4_K/Q5_K scales field at once, one byte each (byte j of *sc8
 * is sub-block j's scale): the same decoding as quant_k4_scale_min, four bytes per step. */
static inline void quant_k4_scales_mins(const uint8_t *s, uint64_t *sc8, uint64_t *mn8) {
    uint32_t a0 = quant_rd_u32(s), a1 = quant_rd_u32(s + 4), a2 = quant_rd_u32(s + 8);
    uint32_t sc_lo = a0 & 0x3F3F3F3Fu, mn_lo = a1 & 0x3F3F3F3Fu;
    uint32_t sc_hi = (a2 & 0x0F0F0F0Fu) | (((a0 >> 6) & 0x03030303u) << 4);
    uint32_t mn_hi = ((a2 >> 4) & 0x0F0F0F0Fu) | (((a1 >> 6) & 0x03030303u) << 4);
    *sc8 = sc_lo | (uint64_t)sc_hi << 32;
    *mn8 = mn_lo | (uint64_t)mn_hi << 32;
}

/* All 16 Q3_K scales at once as unsigned 6-bit bytes (byte t = quant_k3_scale(t) + 32): low
 * nibbles of bytes 0..7 are sub-blocks 0..7, their high nibbles 8..15, and byte 8 + t%4 holds
 * the two top bits of sub-block t at bit 2*(t/4). */
static inline void quant_k3_scales_u6(const uint8_t *s, uint32_t w[4]) {
    uint32_t a0 = quant_rd_u32(s), a1 = quant_rd_u32(s + 4), a2 = quant_rd_u32(s + 8);
    const uint32_t m4 = 0x0F0F0F0Fu, m2 = 0x03030303u;
    w[0] = (a0 & m4) | ((a2 & m2) << 4);
    w[1] = (a1 & m4) | (((a2 >> 2) & m2) << 4);
    w[2] = ((a0 >> 4) & m4) | (((a2 >> 4) & m2) << 4);
    w[3] = ((a1 >> 4) & m4) | (((a2 >> 6) & m2) << 4);
}

/* Signed 6-bit scale (-32..31) of sub-block t (0..15) of a Q3_K 12-byte scales field. */
static inline int quant_k3_scale(int t, const uint8_t *s) {
    int lo = t < 8 ? (s[t] & 0xF) : (s[t - 8] >> 4);
    int hi = (s[8 + (t % 4)] >> (2 * (t / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}

/* Row operation signatures (the members of struct quant_kernels). */
typedef void (*quant_from_float_fn)(const float *x, void *y, int64_t n);
typedef void (*quant_gemm_fn)(int64_t n, const void *w, size_t row_bytes, int64_t n_out,
                              const void *x, size_t x_row_bytes, int64_t n_tok, float *y,
                              int64_t ldy);

/* K-quant references (kquants.c); n is a multiple of QK_K. */
#define QUANT_K_REF_DECL(name)                                                                 \
    void quant_dequantize_##name##_ref(const void *src, float *dst, int64_t n);                \
    void quant_quantize_##name##_ref(const float *src, void *dst, int64_t n);                  \
    float quant_dot_##name##_ref(const void *w, const void *x, int64_t n);
QUANT_K_REF_DECL(q2_K)
QUANT_K_REF_DECL(q3_K)
QUANT_K_REF_DECL(q4_K)
QUANT_K_REF_DECL(q5_K)
QUANT_K_REF_DECL(q6_K)
QUANT_K_REF_DECL(q8_K)
#undef QUANT_K_REF_DECL

/* ------------------------------------------------------------------------------------------
 * Tiled gemm driver shared by the SIMD files. A tile computes R weight rows x T activation
 * rows (R, T <= 4) with R*T accumulators, so each weight block is loaded once per T tokens and
 * each activation block once per R rows. Every tile variant runs the SAME per-output sequence
 * of vector operations (block order, lane layout, final horizontal sum) and differs only in
 * how many outputs it carries, so an output's bits do not depend on n_tok, on the tile it fell
 * into, or on how the caller split [0, n_out). Token tiles run inside row tiles: the R weight
 * rows stay in L1 while all tokens stream past them. */

struct quant_gemm_args {
    int64_t n;               /* elements per row */
    const uint8_t *w;        /* weight row 0 */
    size_t rb;               /* bytes between weight rows */
    const uint8_t *x;        /* activation row 0, already in vec_dot_type */
    size_t xrb;              /* bytes between activation rows */
    float *y;
    int64_t ldy;
};
typedef void (*quant_tile_fn)(const struct quant_gemm_args *g, int64_t o0, int64_t t0);

#define QUANT_TILE_MAX 4

static inline void quant_gemm_drive(const quant_tile_fn *tiles, int rmax, int tmax, int64_t n,
                                    const void *w, size_t rb, int64_t n_out, const void *x,
                                    size_t xrb, int64_t n_tok, float *y, int64_t ldy) {
    const struct quant_gemm_args g = {n, w, rb, x, xrb, y, ldy};
    for (int64_t o0 = 0; o0 < n_out; o0 += rmax) {
        int r = (int)(n_out - o0 < rmax ? n_out - o0 : rmax);
        for (int64_t t0 = 0; t0 < n_tok; t0 += tmax) {
            int t = (int)(n_tok - t0 < tmax ? n_tok - t0 : tmax);
            tiles[(r - 1) * QUANT_TILE_MAX + (t - 1)](&g, o0, t0);
        }
    }
}

/* Instantiate NAME##_tile(g, o0, t0, R, T) (an always-inline body) for every R, T in 1..4 and
 * collect them in NAME##_tiles, indexed [(R-1)*4 + (T-1)]. */
#define QUANT_TILE_INST(NAME, R, T)                                                            \
    static void NAME##_tile_##R##_##T(const struct quant_gemm_args *g, int64_t o0, int64_t t0) { \
        NAME##_tile(g, o0, t0, R, T);                                                          \
    }
#define QUANT_TILE_ROW(NAME, R)                                                                \
    QUANT_TILE_INST(NAME, R, 1) QUANT_TILE_INST(NAME, R, 2)                                    \
    QUANT_TILE_INST(NAME, R, 3) QUANT_TILE_INST(NAME, R, 4)
#define QUANT_TILES(NAME)                                                                      \
    QUANT_TILE_ROW(NAME, 1) QUANT_TILE_ROW(NAME, 2) QUANT_TILE_ROW(NAME, 3) QUANT_TILE_ROW(NAME, 4) \
    static const quant_tile_fn NAME##_tiles[16] = {                                            \
        NAME##_tile_1_1, NAME##_tile_1_2, NAME##_tile_1_3, NAME##_tile_1_4,                    \
        NAME##_tile_2_1, NAME##_tile_2_2, NAME##_tile_2_3, NAME##_tile_2_4,                    \
        NAME##_tile_3_1, NAME##_tile_3_2, NAME##_tile_3_3, NAME##_tile_3_4,                    \
        NAME##_tile_4_1, NAME##_tile_4_2, NAME##_tile_4_3, NAME##_tile_4_4,                    \
    };
/* The gemm entry point of a tiled kernel, with rmax x tmax tiles. */
#define QUANT_GEMM(NAME, RMAX, TMAX)                                                           \
    static void NAME##_gemm(int64_t n, const void *w, size_t rb, int64_t n_out, const void *x, \
                            size_t xrb, int64_t n_tok, float *y, int64_t ldy) {                \
        quant_gemm_drive(NAME##_tiles, RMAX, TMAX, n, w, rb, n_out, x, xrb, n_tok, y, ldy);    \
    }

/* Packed Q8_0 / Q4_0 weights (layouts in packed.c): the scalar half there, the gemms
 * in packed_avx512.c. */
#define QUANT_PACKED_BLOCK (32 + QUANT_PACK_ROWS * 32)      /* Q8_0 bytes per block of 16 rows */
#define QUANT_PACKED_BLOCK_Q4 (32 + QUANT_PACK_ROWS * 16)   /* Q4_0 */
#define QUANT_PACKED_MAX_N 32768   /* longer rows stay unpacked: bounds the kernel's scratch */
size_t quant_q8_0_packed_size(int64_t n, int64_t n_out);
void quant_q8_0_pack(const void *w, size_t row_bytes, int64_t n, int64_t n_out, void *wp);
void quant_q8_0_packed_row(const void *wp, int64_t n, int64_t o, float *dst);
void quant_q8_0_packed_gemm_avx512(int64_t n, const void *wp, int64_t n_out, const void *x,
                                   size_t x_row_bytes, int64_t n_tok, float *y, int64_t ldy);
size_t quant_q4_0_packed_size(int64_t n, int64_t n_out);
void quant_q4_0_pack(const void *w, size_t row_bytes, int64_t n, int64_t n_out, void *wp);
void quant_q4_0_packed_row(const void *wp, int64_t n, int64_t o, float *dst);
void quant_q4_0_packed_gemm_avx512(int64_t n, const void *wp, int64_t n_out, const void *x,
                                   size_t x_row_bytes, int64_t n_tok, float *y, int64_t ldy);

#define QUANT_ALWAYS_INLINE static inline __attribute__((always_inline))

/* q8_0_from_float and q8_1_from_float around a level's block quantizer
 * float BLOCK(const float *x, int8_t *qs, int *sum) (codes into qs, returns d, sum of codes):
 * the block layouts live here once, the arithmetic per ISA in kernels_avx2.c / kernels_avx512.c. */
#define QUANT_Q8_FROM_FLOAT(BLOCK)                                                             \
    static void q8_0_from_float(const float *x, void *y, int64_t n) {                          \
        uint8_t *out = y;                                                                      \
        for (int64_t ib = 0; ib < n / 32; ib++, x += 32, out += 34) {                          \
            int sum;                                                                           \
            uint16_t h = f32_to_fp16(BLOCK(x, (int8_t *)(out + 2), &sum));                     \
            memcpy(out, &h, 2);                                                                \
        }                                                                                      \
    }                                                                                          \
    static void q8_1_from_float(const float *x, void *y, int64_t n) {                          \
        uint8_t *out = y;                                                                      \
        for (int64_t ib = 0; ib < n / 32; ib++, x += 32, out += 36) {                          \
            int sum;                                                                           \
            float d = BLOCK(x, (int8_t *)(out + 4), &sum);                                     \
            uint16_t h[2] = {f32_to_fp16(d), f32_to_fp16((float)sum * d)};                     \
            memcpy(out, h, 4);                                                                 \
        }                                                                                      \
    }

/* Per-level kernel tables. Each overwrites only the members it implements for type t and
 * leaves the others (filled by the lower level) alone. Defined in kernels_avx2.c and
 * kernels_avx512.c; must only be called when the CPU supports that level. */
void quant_kernels_fill_avx2(enum ggml_type t, struct quant_kernels *k);
void quant_kernels_fill_avx512(enum ggml_type t, struct quant_kernels *k);

#endif
