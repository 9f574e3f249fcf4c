/* packed_avx512.c — gemm over packed Q8_0 and Q4_0 weights (layouts: packed.c)
 * with AVX-512 VNNI, activations in Q8_0.
 *
 * Per activation row and block, 8 vpdpbusd (64-byte weight vector x 4 activation bytes
 * broadcast) advance 16 outputs; the weight vectors are loaded (Q4_0: and split into nibbles)
 * once per block for up to 8 activation rows, so a verify row costs its own dpbusds and nothing
 * else. The code offset (+128 for Q8_0, +8 for Q4_0) is taken back by starting the integer sum
 * at -offset * Σ(activation codes of the block), computed once per activation row per call.
 *
 * Each output follows the reference dot (quant.c dot_q8_0 / dot_q4_0) operation for operation: the exact
 * integer block sum, then sumf += (dw * dx) * (float)sumi in block order, as a separate
 * multiply and add. Results are therefore bit-identical to quant_vec_dot_ref, whatever the
 * batch size or the split of the outputs (tested). */
#include "quant/internal.h"

#include <immintrin.h>

#define TILE_TOK 8         /* activation rows per pass over a group: one accumulator each */
#define SCRATCH 8192       /* per-block activation terms precomputed per chunk of rows */
#define L2_WEIGHTS (256 * 1024)   /* weight bytes kept hot while a chunk's tiles pass over them */
/* Software prefetch this far ahead of the block being read. Decode streams the weights from
 * L3 (27 MB per token on the default model); without it a 2-4 row verify tile, which spends
 * more time per byte, fell behind the hardware prefetcher: 2 rows cost 1.24x one row over a
 * 28 MB working set, with it 1.0-1.1x (docs/notes/2026-11-29-packed-q8_0.md). Prefetches past
 * the end of the weights are harmless (they never fault). */
#define PREFETCH_BLOCKS 16
#define UNROLL _Pragma("GCC unroll 8")   /* keeps w[] and acc[] in registers */

/* Per activation row t (of the chunk) and block b, at t*nb + b: the block's scale and the
 * integer sum's starting value. */
struct act_terms {
    float dx[SCRATCH];
    int32_t init[SCRATCH];
};

static void act_terms_fill(const uint8_t *x, size_t xrb, int64_t nb, int64_t n_rows, int offset,
                           struct act_terms *a) {
    const __m256i ones = _mm256_set1_epi8(1);
    for (int64_t t = 0; t < n_rows; t++)
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = x + (size_t)t * xrb + (size_t)b * 34;
            __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, _mm256_loadu_si256((const void *)(blk + 2)));
            a->dx[t * nb + b] = _cvtsh_ss(quant_rd_u16(blk));
            a->init[t * nb + b] = -offset * _mm512_reduce_add_epi32(_mm512_zextsi256_si512(s));
        }
}

enum packed_format { PACKED_Q8_0, PACKED_Q4_0 };

/* Outputs [0, 16) of the group at grp for activation rows t0..t0+T-1 of the chunk. */
QUANT_ALWAYS_INLINE void group_tile(enum packed_format f, const uint8_t *grp, int64_t nb,
                                    const uint8_t *x, size_t xrb, const struct act_terms *a,
                                    int64_t t0, int T, float *y, int64_t ldy) {
    const int block_bytes = f == PACKED_Q8_0 ? QUANT_PACKED_BLOCK : QUANT_PACKED_BLOCK_Q4;
    __m512 acc[TILE_TOK];
    UNROLL for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = grp + b * block_bytes;
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const void *)blk));
        UNROLL for (int j = 0; j * 64 < block_bytes; j++)
            _mm_prefetch((const char *)(blk + PREFETCH_BLOCKS * block_bytes + 64 * j), _MM_HINT_T0);
        __m512i w[8];
        if (f == PACKED_Q8_0) {
            UNROLL for (int j = 0; j < 8; j++) w[j] = _mm512_loadu_si512((const void *)(blk + 32 + 64 * j));
        } else {
            const __m512i lo4 = _mm512_set1_epi8(0x0F);
            UNROLL for (int m = 0; m < 4; m++) {
                const __m512i p = _mm512_loadu_si512((const void *)(blk + 32 + 64 * m));
                w[m] = _mm512_and_si512(p, lo4);
                w[m + 4] = _mm512_and_si512(_mm512_srli_epi16(p, 4), lo4);
            }
        }
        UNROLL for (int t = 0; t < T; t++) {
            const uint8_t *xq = x + (size_t)(t0 + t) * xrb + (size_t)b * 34 + 2;
            const int64_t i = (t0 + t) * nb + b;
            /* two dependency chains; integer sums, so the split does not change the result */
            __m512i s0 = _mm512_set1_epi32(a->init[i]), s1 = _mm512_setzero_si512();
            UNROLL for (int j = 0; j < 8; j += 2) {
                s0 = _mm512_dpbusd_epi32(s0, w[j], _mm512_set1_epi32((int)quant_rd_u32(xq + 4 * j)));
                s1 = _mm512_dpbusd_epi32(s1, w[j + 1], _mm512_set1_epi32((int)quant_rd_u32(xq + 4 * j + 4)));
            }
            __m512 d = _mm512_mul_ps(dw, _mm512_set1_ps(a->dx[i]));
            acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1))));
        }
    }
    UNROLL for (int t = 0; t < T; t++) _mm512_storeu_ps(y + (t0 + t) * ldy, acc[t]);
}

typedef void (*group_tile_fn)(const uint8_t *grp, int64_t nb, const uint8_t *x, size_t xrb,
                              const struct act_terms *a, int64_t t0, float *y, int64_t ldy);
#define GROUP_TILE(F, T)                                                                       \
    static void group_tile_##F##_##T(const uint8_t *grp, int64_t nb, const uint8_t *x,         \
                                     size_t xrb, const struct act_terms *a, int64_t t0,        \
                                     float *y, int64_t ldy) {                                  \
        group_tile(PACKED_##F, grp, nb, x, xrb, a, t0, T, y, ldy);                             \
    }
#define GROUP_TILES(F)                                                                         \
    GROUP_TILE(F, 1) GROUP_TILE(F, 2) GROUP_TILE(F, 3) GROUP_TILE(F, 4)                        \
    GROUP_TILE(F, 5) GROUP_TILE(F, 6) GROUP_TILE(F, 7) GROUP_TILE(F, 8)                        \
    static const group_tile_fn group_tiles_##F[TILE_TOK] = {                                   \
        group_tile_##F##_1, group_tile_##F##_2, group_tile_##F##_3, group_tile_##F##_4,        \
        group_tile_##F##_5, group_tile_##F##_6, group_tile_##F##_7, group_tile_##F##_8,        \
    };
GROUP_TILES(Q8_0)
GROUP_TILES(Q4_0)

static void packed_gemm(const group_tile_fn *tiles, size_t block_bytes, int offset, int64_t n,
                        const void *wp, int64_t n_out, const void *x, size_t xrb, int64_t n_tok,
                        float *y, int64_t ldy) {
    const int64_t nb = n / 32, n_grp = n_out / QUANT_PACK_ROWS;
    const size_t grp_bytes = (size_t)nb * block_bytes;
    /* nb <= QUANT_PACKED_MAX_N / 32 = 1024, so a chunk holds at least TILE_TOK rows */
    const int64_t chunk = SCRATCH / nb / TILE_TOK * TILE_TOK;
    const int64_t grp_block = grp_bytes >= L2_WEIGHTS ? 1 : (int64_t)(L2_WEIGHTS / grp_bytes);
    struct act_terms a;
    for (int64_t c0 = 0; c0 < n_tok; c0 += chunk) {
        const int64_t rows = n_tok - c0 < chunk ? n_tok - c0 : chunk;
        const uint8_t *xc = (const uint8_t *)x + (size_t)c0 * xrb;
        act_terms_fill(xc, xrb, nb, rows, offset, &a);
        for (int64_t g0 = 0; g0 < n_grp; g0 += grp_block) {
            const int64_t g1 = g0 + grp_block < n_grp ? g0 + grp_block : n_grp;
            for (int64_t t0 = 0; t0 < rows; t0 += TILE_TOK) {
                const int T = (int)(rows - t0 < TILE_TOK ? rows - t0 : TILE_TOK);
                for (int64_t g = g0; g < g1; g++)
                    tiles[T - 1]((const uint8_t *)wp + (size_t)g * grp_bytes, nb, xc, xrb, &a, t0,
                                 y + c0 * ldy + g * QUANT_PACK_ROWS, ldy);
            }
        }
    }
}

void quant_q8_0_packed_gemm_avx512(int64_t n, const void *wp, int64_t n_out, const void *x,
                                   size_t xrb, int64_t n_tok, float *y, int64_t ldy) {
    packed_gemm(group_tiles_Q8_0, QUANT_PACKED_BLOCK, 128, n, wp, n_out, x, xrb, n_tok, y, ldy);
}

void quant_q4_0_packed_gemm_avx512(int64_t n, const void *wp, int64_t n_out, const void *x,
                                   size_t xrb, int64_t n_tok, float *y, int64_t ldy) {
    packed_gemm(group_tiles_Q4_0, QUANT_PACKED_BLOCK_Q4, 8, n, wp, n_out, x, xrb, n_tok, y, ldy);
}
