/* test_quant.c — quant.h against its spec (quant-formats.md) and the fast kernels against the
 * reference, at every CPU level this machine has.
 *
 *   traits_*       type table, row sizes, names, unknown ids
 *   fp16_* bf16_*  scalar conversions: known bit patterns, ties, subnormals, inf/NaN,
 *                  exhaustive f16 round trip, scalar vs the F16C instruction
 *   t1_dequant     §7 T1 vectors (C-verified against llama.cpp): bit-exact dequantization
 *   t2_*           §7 T2 vectors: activation quantizers and dots against llama.cpp's numbers
 *   t3_*           §7 T3 invariants
 *   rmse_*         quantize_ref -> dequantize error per type, bounded by named constants
 *   from_float     fast activation conversion == reference bytes (finite inputs)
 *   gemm_vs_ref    fast gemm vs the reference dot, error bound from f32 summation
 *   gemm_bits      gemm output bit-identical whatever n_tok and the n_out split
 *   packed_*       packed Q8_0 weights: gemm bit-identical to the reference dot, rows dequantize
 *                  exactly, which shapes pack
 *
 * Inputs come from a seeded generator (never zeros or constants, except the blocks that test
 * the zero path on purpose); a failure message names type, level and shape. */
#include <criterion/criterion.h>

#include "quant/quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <immintrin.h>

/* ------------------------------------------------------------------------------------------
 * Helpers. */

static uint64_t rng_next(uint64_t *s) {   /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static float rng_uniform(uint64_t *s) {   /* [-1, 1) */
    return (float)((double)(rng_next(s) >> 11) * 0x1p-53 * 2.0 - 1.0);
}
static float rng_gauss(uint64_t *s) {
    double u1 = ((double)(rng_next(s) >> 11) + 1.0) * 0x1p-53, u2 = (double)(rng_next(s) >> 11) * 0x1p-53;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}
/* Activation-like data: gaussian, a per-32 scale that varies over 3 decades, rare outliers. */
static void fill_act(uint64_t *s, float *x, int64_t n) {
    float scale = 1.0f;
    for (int64_t i = 0; i < n; i++) {
        if (i % 32 == 0) scale = powf(10.0f, 1.5f * rng_uniform(s));
        x[i] = rng_gauss(s) * scale;
        if ((rng_next(s) & 255) == 0) x[i] *= 20.0f;
    }
}
static void fill_uniform(uint64_t *s, float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = rng_uniform(s);
}

static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float f32_from(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static const enum ggml_type k_types[] = {
    GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1,
    GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0, GGML_TYPE_Q8_1, GGML_TYPE_Q2_K,
    GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_Q8_K,
};
static const char *level_name[] = {"ref", "avx2", "avx512"};

static int block_of(enum ggml_type t) { return ggml_type_traits_get(t)->block_elems; }
static const char *tname(enum ggml_type t) { return ggml_type_traits_get(t)->name; }

/* ------------------------------------------------------------------------------------------
 * Traits. */

Test(quant, traits_table) {
    static const struct { enum ggml_type t; const char *name; int elems, bytes; enum ggml_type vdt; } want[] = {
        {GGML_TYPE_F32, "f32", 1, 4, GGML_TYPE_F32},     {GGML_TYPE_F16, "f16", 1, 2, GGML_TYPE_F16},
        {GGML_TYPE_BF16, "bf16", 1, 2, GGML_TYPE_BF16},  {GGML_TYPE_Q4_0, "q4_0", 32, 18, GGML_TYPE_Q8_0},
        {GGML_TYPE_Q4_1, "q4_1", 32, 20, GGML_TYPE_Q8_1}, {GGML_TYPE_Q5_0, "q5_0", 32, 22, GGML_TYPE_Q8_0},
        {GGML_TYPE_Q5_1, "q5_1", 32, 24, GGML_TYPE_Q8_1}, {GGML_TYPE_Q8_0, "q8_0", 32, 34, GGML_TYPE_Q8_0},
        {GGML_TYPE_Q8_1, "q8_1", 32, 36, GGML_TYPE_Q8_1}, {GGML_TYPE_Q2_K, "q2_K", 256, 84, GGML_TYPE_Q8_K},
        {GGML_TYPE_Q3_K, "q3_K", 256, 110, GGML_TYPE_Q8_K}, {GGML_TYPE_Q4_K, "q4_K", 256, 144, GGML_TYPE_Q8_K},
        {GGML_TYPE_Q5_K, "q5_K", 256, 176, GGML_TYPE_Q8_K}, {GGML_TYPE_Q6_K, "q6_K", 256, 210, GGML_TYPE_Q8_K},
        {GGML_TYPE_Q8_K, "q8_K", 256, 292, GGML_TYPE_Q8_K},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const struct ggml_type_traits *tr = ggml_type_traits_get(want[i].t);
        cr_assert(tr, "type %d", want[i].t);
        cr_expect_str_eq(tr->name, want[i].name);
        cr_expect_eq(tr->block_elems, want[i].elems, "%s", want[i].name);
        cr_expect_eq(tr->block_bytes, want[i].bytes, "%s", want[i].name);
        cr_expect_eq(tr->vec_dot_type, want[i].vdt, "%s", want[i].name);
        cr_expect(ggml_type_supported(want[i].t), "%s", want[i].name);
        cr_expect_eq(ggml_type_from_name(want[i].name), want[i].t, "%s", want[i].name);
        struct quant_kernels k;
        cr_expect(quant_kernels_get(want[i].t, QUANT_CPU_REF, &k), "%s", want[i].name);
    }
    cr_expect_eq(ggml_type_from_name("Q4_K"), GGML_TYPE_Q4_K);
    cr_expect_eq(ggml_type_from_name("nope"), GGML_TYPE_COUNT);
}

Test(quant, traits_unknown_and_unsupported) {
    const int unknown[] = {-1, 4, 5, 31, 32, 33, 36, 37, 38, GGML_TYPE_COUNT, 1000};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        cr_expect_null(ggml_type_traits_get((enum ggml_type)unknown[i]), "id %d", unknown[i]);
        cr_expect_not(ggml_type_supported((enum ggml_type)unknown[i]), "id %d", unknown[i]);
        cr_expect_eq(ggml_row_size((enum ggml_type)unknown[i], 256), 0);
    }
    /* known ids coti cannot compute: traits with a name, block_elems 0, no kernels */
    const int known[] = {16, 17, 18, 19, 20, 21, 22, 23, 29, 34, 35, 39, 40};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        const struct ggml_type_traits *tr = ggml_type_traits_get((enum ggml_type)known[i]);
        cr_assert(tr, "id %d", known[i]);
        cr_expect(tr->name && tr->name[0]);
        cr_expect_eq(tr->block_elems, 0, "%s", tr->name);
        cr_expect_not(ggml_type_supported((enum ggml_type)known[i]));
        struct quant_kernels k;
        cr_expect_not(quant_kernels_get((enum ggml_type)known[i], QUANT_CPU_AVX512, &k));
    }
    cr_expect_str_eq(ggml_type_traits_get((enum ggml_type)20)->name, "iq4_nl");
}

Test(quant, traits_row_size) {
    cr_expect_eq(ggml_row_size(GGML_TYPE_Q8_0, 384), 12 * 34);
    cr_expect_eq(ggml_row_size(GGML_TYPE_Q4_K, 4096), 16 * 144);
    cr_expect_eq(ggml_row_size(GGML_TYPE_F16, 7), 14);
    cr_expect_eq(ggml_row_size(GGML_TYPE_Q4_K, 384), 0);   /* not a multiple of 256 */
    cr_expect_eq(ggml_row_size(GGML_TYPE_Q8_0, 33), 0);
    cr_expect_eq(ggml_row_size(GGML_TYPE_Q8_0, -32), 0);
    cr_expect_eq(ggml_row_size(GGML_TYPE_F32, INT64_MAX), 0);   /* overflow */
}

/* llama-quantize's fallback for rows that are not whole blocks: q8_0, then f16 */
Test(quant, type_for_rows) {
    cr_expect_eq(ggml_type_for_rows(GGML_TYPE_Q4_K, 4096), GGML_TYPE_Q4_K);
    cr_expect_eq(ggml_type_for_rows(GGML_TYPE_Q4_K, 384), GGML_TYPE_Q8_0);
    cr_expect_eq(ggml_type_for_rows(GGML_TYPE_Q4_0, 48), GGML_TYPE_F16);
    cr_expect_eq(ggml_type_for_rows(GGML_TYPE_F32, 7), GGML_TYPE_F32);
    cr_expect_eq(ggml_type_for_rows(GGML_TYPE_BF16, 7), GGML_TYPE_BF16);
    cr_expect_eq(ggml_file_type_of(GGML_TYPE_Q4_K), 15);   /* llama_ftype Q4_K_M */
    cr_expect_eq(ggml_file_type_of(GGML_TYPE_F32), 0);
}

/* ------------------------------------------------------------------------------------------
 * fp16 / bf16. */

Test(quant, fp16_known_patterns) {
    static const struct { float f; uint16_t h; } enc[] = {
        {1.0f, 0x3C00}, {-2.0f, 0xC000}, {0.0f, 0x0000}, {-0.0f, 0x8000}, {65504.0f, 0x7BFF},
        {0.1f, 0x2E66}, {0x1p-14f, 0x0400},                 /* smallest normal */
        {0x1p-24f, 0x0001},                                  /* smallest subnormal */
        {0x1p-25f, 0x0000},                                  /* half of it: tie to even 0 */
        {0x1.000002p-25f, 0x0001},                           /* just above the tie */
        {0x1.8p-24f, 0x0002},                                /* 1.5 ulp: tie to even 2 */
        {0x1.002p+0f, 0x3C00},                               /* 1 + 2^-11: tie to even */
        {0x1.006p+0f, 0x3C02},                               /* 1 + 3*2^-11: tie to even */
        {0x1.002002p+0f, 0x3C01},                            /* 1 + 2^-11 + 2^-23: above the tie */
        {65519.0f, 0x7BFF}, {65520.0f, 0x7C00},              /* overflow threshold */
        {1e10f, 0x7C00}, {-1e10f, 0xFC00}, {INFINITY, 0x7C00}, {-INFINITY, 0xFC00},
        {0x1.ffcp-15f, 0x0400},                              /* largest subnormal+ rounds up */
        {1e-30f, 0x0000}, {-1e-30f, 0x8000},
    };
    for (size_t i = 0; i < sizeof enc / sizeof enc[0]; i++)
        cr_expect_eq(f32_to_fp16(enc[i].f), enc[i].h, "f32_to_fp16(%a) = %#x, want %#x", enc[i].f,
                     f32_to_fp16(enc[i].f), enc[i].h);
    cr_expect_eq(fp16_to_f32(0x3C00), 1.0f);
    cr_expect_eq(fp16_to_f32(0x7BFF), 65504.0f);
    cr_expect_eq(fp16_to_f32(0x0001), 0x1p-24f);
    cr_expect_eq(fp16_to_f32(0x03FF), 1023 * 0x1p-24f);
    cr_expect_eq(fp16_to_f32(0x0400), 0x1p-14f);
    cr_expect(isinf(fp16_to_f32(0x7C00)) && fp16_to_f32(0x7C00) > 0);
    cr_expect(isinf(fp16_to_f32(0xFC00)) && fp16_to_f32(0xFC00) < 0);
    cr_expect(isnan(fp16_to_f32(0x7E00)) && isnan(fp16_to_f32(0x7C01)) && isnan(fp16_to_f32(0xFE00)));
    cr_expect(signbit(fp16_to_f32(0x8000)) && fp16_to_f32(0x8000) == 0.0f);
    /* NaN stays NaN, quiet, with the sign and top payload bits kept */
    cr_expect_eq(f32_to_fp16(f32_from(0x7FC00000)), 0x7E00);
    cr_expect_eq(f32_to_fp16(f32_from(0xFFC00000)), 0xFE00);
    cr_expect_eq(f32_to_fp16(f32_from(0x7F800001)), 0x7E00);   /* signalling -> quiet */
    cr_expect_eq(f32_to_fp16(f32_from(0x7FFFE000)), 0x7FFF);
}

Test(quant, fp16_exhaustive_round_trip) {
    for (uint32_t h = 0; h < 65536; h++) {
        float f = fp16_to_f32((uint16_t)h);
        bool nan = ((h >> 10) & 0x1F) == 0x1F && (h & 0x3FF);
        if (nan) {
            cr_assert(isnan(f), "%#x", h);
            cr_assert_eq(f32_to_fp16(f) & 0x7E00, 0x7E00, "%#x", h);
        } else {
            cr_assert_eq(f32_to_fp16(f), h, "round trip %#x -> %a -> %#x", h, f, f32_to_fp16(f));
        }
        /* the value halfway to the next f16 up (in magnitude) rounds to the even neighbour */
        if (!nan && (h & 0x7FFF) < 0x7BFF) {
            float next = fp16_to_f32((uint16_t)(h + 1));
            float mid = (float)(((double)f + (double)next) / 2);   /* exact: 12 significant bits */
            uint16_t want = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
            cr_assert_eq(f32_to_fp16(mid), want, "tie above %#x", h);
        }
    }
}

/* The F16C instruction is an independent implementation of the same rounding. */
__attribute__((target("f16c"))) static uint16_t hw_f32_to_fp16(float f) {
    return (uint16_t)_cvtss_sh(f, 0);
}
__attribute__((target("f16c"))) static float hw_fp16_to_f32(uint16_t h) { return _cvtsh_ss(h); }

Test(quant, fp16_matches_f16c) {
    if (quant_cpu_level_detect() < QUANT_CPU_AVX2) { cr_skip_test("no F16C"); }   /* AVX2 level implies it */
    uint64_t s = 1;
    for (int i = 0; i < 2000000; i++) {
        uint32_t u = (uint32_t)rng_next(&s);
        if (i & 1) u = (u & 0x87FFFFFFu) | 0x30000000u;   /* half the draws near the f16 range */
        float f = f32_from(u);
        cr_assert_eq(f32_to_fp16(f), hw_f32_to_fp16(f), "bits %#x", u);
    }
    for (uint32_t h = 0; h < 65536; h++) {
        float a = fp16_to_f32((uint16_t)h), b = hw_fp16_to_f32((uint16_t)h);
        cr_assert_eq(f32_bits(a), f32_bits(b), "%#x", h);
    }
}

Test(quant, bf16_known_patterns) {
    static const struct { uint32_t f; uint16_t h; } enc[] = {
        {0x3F800000, 0x3F80},   /* 1.0 */
        {0x3F808000, 0x3F80},   /* tie, even below */
        {0x3F818000, 0x3F82},   /* tie, even above */
        {0x3F808001, 0x3F81},   /* above the tie */
        {0x3F807FFF, 0x3F80},   /* below the tie */
        {0x7F7FFFFF, 0x7F80},   /* max float rounds to inf */
        {0x7F800000, 0x7F80}, {0xFF800000, 0xFF80},   /* inf */
        {0x7F800001, 0x7FC0}, {0xFFC00000, 0xFFC0}, {0x7FA00000, 0x7FE0},   /* NaN: quiet */
        {0x00008000, 0x0000}, {0x00018000, 0x0002}, {0x00000001, 0x0000},   /* subnormals kept */
        {0x80000000, 0x8000},
    };
    for (size_t i = 0; i < sizeof enc / sizeof enc[0]; i++)
        cr_expect_eq(f32_to_bf16(f32_from(enc[i].f)), enc[i].h, "f32_to_bf16(%#x) = %#x, want %#x",
                     enc[i].f, f32_to_bf16(f32_from(enc[i].f)), enc[i].h);
    for (uint32_t h = 0; h < 65536; h++)
        cr_assert_eq(f32_bits(bf16_to_f32((uint16_t)h)), h << 16);
}

/* ------------------------------------------------------------------------------------------
 * §7 T1: dequantization vectors. */

struct t1_case {
    enum ggml_type t;
    int d_off, m_off;   /* f16 fields set to 0.5 and -0.25 (m_off < 0: none) */
    float y0_7[8], ylast;
    double sum, wsum;
};
static const struct t1_case t1_cases[] = {
    {GGML_TYPE_Q4_0, 0, -1, {-1.5, 1, 3.5, -2, 0.5, 3, -2.5, 0}, 0, -10.5, -259},
    {GGML_TYPE_Q4_1, 0, 2, {7.25, 1.75, 4.25, 6.75, 1.25, 3.75, 6.25, 0.75}, 5.75, 114.5, 1859.5},
    {GGML_TYPE_Q5_0, 0, -1, {4.5, -1, 1.5, -4, 6.5, -7, 3.5, -2}, 0.5, 7.5, 56},
    {GGML_TYPE_Q5_1, 0, 2, {9.25, 11.75, 14.25, 8.75, 11.25, 5.75, 0.25, 10.75}, 2.25, 244.5, 3818.5},
    {GGML_TYPE_Q8_0, 0, -1, {42.5, 61, -48.5, -30, -11.5, 7, 25.5, 44}, -24, -88, -4040},
    {GGML_TYPE_Q2_K, 80, 82, {16.5, 0, 5.5, 11, 16.5, 0, 5.5, 11}, 3.75, 1869.5, 237249},
    {GGML_TYPE_Q3_K, 108, -1, {40.5, -54, 13.5, -27, 40.5, -54, 13.5, -27}, 21, 479, 88572.5},
    {GGML_TYPE_Q4_K, 0, 2, {183.25, 12.75, 90.25, 167.75, 245.25, 74.75, 152.25, 229.75}, 41.75, 31444, 4262132},
    {GGML_TYPE_Q5_K, 0, 2, {431.25, 12.75, 338.25, 167.75, 493.25, 74.75, 400.25, 229.75}, 71.75, 62332, 8489436},
    {GGML_TYPE_Q6_K, 208, -1, {-715.5, 848, 291.5, -265, -821.5, 742, 185.5, -371}, -30, 2306, 392210},
};

static void t1_block(const struct t1_case *c, uint8_t *b, int salt) {
    int bytes = ggml_type_traits_get(c->t)->block_bytes;
    for (int i = 0; i < bytes; i++) b[i] = (uint8_t)((37 * i + 11 + salt) % 256);
    uint16_t d = 0x3800, m = 0xB400;   /* 0.5, -0.25 */
    memcpy(b + c->d_off, &d, 2);
    if (c->m_off >= 0) memcpy(b + c->m_off, &m, 2);
}

Test(quant, t1_dequant) {
    for (size_t i = 0; i < sizeof t1_cases / sizeof t1_cases[0]; i++) {
        const struct t1_case *c = &t1_cases[i];
        uint8_t blk[400];
        float y[256];
        int ne = block_of(c->t);
        t1_block(c, blk, 0);
        for (int level = 0; level <= (int)quant_cpu_level_detect(); level++) {
            struct quant_kernels k;
            cr_assert(quant_kernels_get(c->t, (enum quant_cpu_level)level, &k));
            for (int pass = 0; pass < 2; pass++) {
                memset(y, 0xFF, sizeof y);
                if (pass == 0) quant_dequantize_row_ref(c->t, blk, y, ne);
                else k.dequantize_row(blk, y, ne);
                double sum = 0, wsum = 0;
                for (int e = 0; e < ne; e++) { sum += y[e]; wsum += (e + 1) * (double)y[e]; }
                for (int e = 0; e < 8; e++)
                    cr_expect_eq(y[e], c->y0_7[e], "%s y[%d] = %g, want %g", tname(c->t), e, y[e], c->y0_7[e]);
                cr_expect_eq(y[ne - 1], c->ylast, "%s ylast %g", tname(c->t), y[ne - 1]);
                cr_expect_eq(sum, c->sum, "%s sum %.17g", tname(c->t), sum);
                cr_expect_eq(wsum, c->wsum, "%s wsum %.17g", tname(c->t), wsum);
            }
        }
    }
}

/* ------------------------------------------------------------------------------------------
 * §7 T2: activation quantization and dots, numbers from llama.cpp's reference code. */

static void t2_input(float *x) {
    for (int i = 0; i < 256; i++) x[i] = sinf(0.37f * i) * (1 + i / 64.0f);
}

Test(quant, t2_q8_0) {
    float x[256];
    uint8_t q[8 * 34];
    t2_input(x);
    quant_quantize_row_ref(GGML_TYPE_Q8_0, x, q, 256);
    static const double d_want[8] = {0.011505127, 0.0151290894, 0.0187988281, 0.0229797363,
                                     0.0271759033, 0.0313720703, 0.0340270996, 0.0380249023};
    static const int8_t codes[8] = {0, 32, 60, 82, 92, 90, 76, 51};
    int sum = 0;
    for (int b = 0; b < 8; b++) {
        uint16_t h;
        memcpy(&h, q + 34 * b, 2);
        cr_expect(fabs(fp16_to_f32(h) - d_want[b]) < 1e-9, "block %d d %.10g", b, fp16_to_f32(h));
        for (int j = 0; j < 32; j++) sum += (int8_t)q[34 * b + 2 + j];
    }
    for (int j = 0; j < 8; j++) cr_expect_eq((int8_t)q[2 + j], codes[j], "code %d", j);
    cr_expect_eq(sum, -39);
}

Test(quant, t2_q8_K) {
    float x[256];
    uint8_t q[292];
    t2_input(x);
    quant_quantize_row_ref(GGML_TYPE_Q8_K, x, q, 256);
    float d;
    memcpy(&d, q, 4);
    cr_expect(fabs(d - 0.0380352251) < 1e-9, "d %.10g", d);
    static const int8_t codes[8] = {0, 10, 18, 25, 28, 27, 23, 15};
    static const int16_t bsums[16] = {-8, 9, 29, 44, 58, 61, 54, 36, 11, -25, -57, -87, -107, -111, -100, -75};
    for (int j = 0; j < 8; j++) cr_expect_eq((int8_t)q[4 + j], codes[j], "code %d", j);
    for (int j = 0; j < 16; j++) {
        int16_t b;
        memcpy(&b, q + 260 + 2 * j, 2);
        cr_expect_eq(b, bsums[j], "bsum %d = %d", j, b);
    }
}

/* Relative 1e-6: llama.cpp's generic kernels accumulate the same exact integer block sums in a
 * different f32 order (per-lane partials for the K-quants). */
#define T2_DOT_REL 1e-6

Test(quant, t2_dots) {
    float x[256];
    uint8_t xk[292], x8[8 * 34], blk[256], row[8 * 34];
    t2_input(x);
    quant_quantize_row_ref(GGML_TYPE_Q8_K, x, xk, 256);
    quant_quantize_row_ref(GGML_TYPE_Q8_0, x, x8, 256);
    const struct t1_case *q4k = &t1_cases[7], *q6k = &t1_cases[9];
    cr_assert_eq(q4k->t, GGML_TYPE_Q4_K);
    cr_assert_eq(q6k->t, GGML_TYPE_Q6_K);
    const struct t1_case q80 = {GGML_TYPE_Q8_0, 0, -1, {0}, 0, 0, 0};
    for (int b = 0; b < 8; b++) t1_block(&q80, row + 34 * b, 7 * b);
    uint8_t blk6[256];
    t1_block(q4k, blk, 0);
    t1_block(q6k, blk6, 0);
    const struct { enum ggml_type t; const uint8_t *w, *x; int n; double want; } dots[3] = {
        {GGML_TYPE_Q4_K, blk, xk, 256, -3180.438965},
        {GGML_TYPE_Q6_K, blk6, xk, 256, -19397.755859},
        {GGML_TYPE_Q8_0, row, x8, 256, 173.001495},
    };
    for (int i = 0; i < 3; i++) {
        float r = quant_vec_dot_ref(dots[i].t, dots[i].w, dots[i].x, dots[i].n);
        cr_expect(fabs(r - dots[i].want) <= T2_DOT_REL * fabs(dots[i].want), "%s ref dot %.6f want %.6f",
                  tname(dots[i].t), r, dots[i].want);
        for (int level = 0; level <= (int)quant_cpu_level_detect(); level++) {
            struct quant_kernels k;
            float y;
            quant_kernels_get(dots[i].t, (enum quant_cpu_level)level, &k);
            k.gemm(dots[i].n, dots[i].w, 0, 1, dots[i].x, 0, 1, &y, 1);
            cr_expect(fabs(y - dots[i].want) <= T2_DOT_REL * fabs(dots[i].want), "%s %s dot %.6f want %.6f",
                      tname(dots[i].t), level_name[level], y, dots[i].want);
        }
    }
}

/* ------------------------------------------------------------------------------------------
 * §7 T3: invariants. */

Test(quant, t3_q8_0_within_half_step) {
    uint64_t s = 3;
    float x[1024], y[1024];
    uint8_t q[32 * 34];
    fill_act(&s, x, 1024);
    quant_quantize_row_ref(GGML_TYPE_Q8_0, x, q, 1024);
    quant_dequantize_row_ref(GGML_TYPE_Q8_0, q, y, 1024);
    for (int b = 0; b < 32; b++) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[32 * b + j]));
        /* half a step of the f32 d, plus the f16 rounding of d applied to up to 127 steps */
        float d = amax / 127, tol = d / 2 + 127 * d * 0x1p-11f;
        for (int j = 0; j < 32; j++)
            cr_assert(fabsf(y[32 * b + j] - x[32 * b + j]) <= tol, "block %d elem %d", b, j);
    }
}

Test(quant, t3_k_scales_and_bsums) {
    uint64_t s = 4;
    float x[2048];
    uint8_t q[8 * 292];
    fill_act(&s, x, 2048);
    quant_quantize_row_ref(GGML_TYPE_Q8_K, x, q, 2048);
    for (int b = 0; b < 8; b++)
        for (int t = 0; t < 16; t++) {
            int sum = 0;
            for (int i = 0; i < 16; i++) sum += (int8_t)q[292 * b + 4 + 16 * t + i];
            int16_t bs;
            memcpy(&bs, q + 292 * b + 260 + 2 * t, 2);
            cr_assert_eq(bs, sum, "block %d bsum %d", b, t);
        }
}

/* Quantizing a row equals quantizing its blocks one by one (no cross-block state), and so does
 * dequantizing. */
Test(quant, t3_rows_are_blocks) {
    uint64_t s = 5;
    float x[1024], y1[1024], y2[1024];
    uint8_t q1[4 * 1024], q2[4 * 1024];
    fill_act(&s, x, 1024);
    for (size_t i = 0; i < sizeof k_types / sizeof k_types[0]; i++) {
        enum ggml_type t = k_types[i];
        int be = block_of(t), bb = ggml_type_traits_get(t)->block_bytes;
        int64_t n = be == 1 ? 1024 : be * (1024 / be);
        quant_quantize_row_ref(t, x, q1, n);
        for (int64_t b = 0; b < n / be; b++) quant_quantize_row_ref(t, x + b * be, q2 + b * bb, be);
        cr_assert(!memcmp(q1, q2, ggml_row_size(t, n)), "%s", tname(t));
        quant_dequantize_row_ref(t, q1, y1, n);
        for (int64_t b = 0; b < n / be; b++) quant_dequantize_row_ref(t, q1 + b * bb, y2 + b * be, be);
        cr_assert(!memcmp(y1, y2, (size_t)n * 4), "%s", tname(t));
    }
}

/* ------------------------------------------------------------------------------------------
 * RMSE of quantize_ref -> dequantize, relative to the RMS of the input, on uniform [-1, 1)
 * data. An ideal uniform quantizer with step q has RMS error q/sqrt(12); the input's RMS is
 * 1/sqrt(3), so its relative RMSE is q/2 (q in units of the block's max |x|, about 1). Each
 * bound is 1.1x that ideal value for the format's step: the 10% covers the sampling noise of
 * an 8192-value estimate (~1%), the clipped top code on the side opposite the block maximum
 * (Q4_0, Q5_0: codes reach -8..7 times d) and the f16 rounding of the scales; the K-quants'
 * fitted scales land well below. Measured values (seed 7) in the comments. */
#define RMSE_MARGIN 1.1
#define RMSE_F32  0.0                         /* exact */
#define RMSE_F16  (0x1p-11)                   /* rounding <= 2^-11 relative (1.8e-4) */
#define RMSE_BF16 (0x1p-8)                    /* rounding <= 2^-8 relative (1.5e-3) */
#define RMSE_Q8   (RMSE_MARGIN / 254)         /* step max/127: Q8_0, Q8_1 (3.75e-3), Q8_K (3.95e-3) */
#define RMSE_Q6_K (RMSE_MARGIN / 64)          /* step max/32 (1.33e-2) */
#define RMSE_Q5_0 (RMSE_MARGIN / 32)          /* step max/16 (3.14e-2) */
#define RMSE_Q5_1 (RMSE_MARGIN / 31)          /* step (max-min)/31 (2.96e-2) */
#define RMSE_Q5_K (RMSE_MARGIN / 31)          /* step (max-min)/31, fitted (2.78e-2) */
#define RMSE_Q4_0 (RMSE_MARGIN / 16)          /* step max/8 (6.53e-2) */
#define RMSE_Q4_1 (RMSE_MARGIN / 15)          /* step (max-min)/15 (6.10e-2) */
#define RMSE_Q4_K (RMSE_MARGIN / 15)          /* step (max-min)/15, fitted (5.51e-2) */
#define RMSE_Q3_K (RMSE_MARGIN / 8)           /* step max/4 (1.25e-1) */
#define RMSE_Q2_K (RMSE_MARGIN / 3)           /* step (max-min)/3, fitted (2.36e-1) */

static double rmse_bound(enum ggml_type t) {
    switch (t) {
    case GGML_TYPE_F32: return RMSE_F32;
    case GGML_TYPE_F16: return RMSE_F16;
    case GGML_TYPE_BF16: return RMSE_BF16;
    case GGML_TYPE_Q8_0: case GGML_TYPE_Q8_1: case GGML_TYPE_Q8_K: return RMSE_Q8;
    case GGML_TYPE_Q6_K: return RMSE_Q6_K;
    case GGML_TYPE_Q5_0: return RMSE_Q5_0;
    case GGML_TYPE_Q5_1: return RMSE_Q5_1;
    case GGML_TYPE_Q5_K: return RMSE_Q5_K;
    case GGML_TYPE_Q4_0: return RMSE_Q4_0;
    case GGML_TYPE_Q4_1: return RMSE_Q4_1;
    case GGML_TYPE_Q4_K: return RMSE_Q4_K;
    case GGML_TYPE_Q3_K: return RMSE_Q3_K;
    case GGML_TYPE_Q2_K: return RMSE_Q2_K;
    default: return 0;
    }
}

Test(quant, rmse_per_type) {
    enum { N = 8192 };
    static float x[N], y[N];
    static uint8_t q[N * 4];
    uint64_t s = 7;
    fill_uniform(&s, x, N);
    for (size_t i = 0; i < sizeof k_types / sizeof k_types[0]; i++) {
        enum ggml_type t = k_types[i];
        quant_quantize_row_ref(t, x, q, N);
        quant_dequantize_row_ref(t, q, y, N);
        double se = 0, sx = 0;
        for (int j = 0; j < N; j++) { se += (double)(y[j] - x[j]) * (y[j] - x[j]); sx += (double)x[j] * x[j]; }
        double rel = sqrt(se / sx);
        cr_log_info("rmse %-5s %.3e (bound %.3e)", tname(t), rel, rmse_bound(t));
        cr_expect(rel <= rmse_bound(t), "%s relative rmse %.4e > %.4e", tname(t), rel, rmse_bound(t));
        /* not vacuous: the error is not zero for a lossy format */
        if (t != GGML_TYPE_F32) cr_expect(rel > 0, "%s", tname(t));
    }
}

/* mkmodel's Q4_K (the min/max grid without the search): a valid encoding within Q4_K's
 * step bound on random data, at least as coarse as the reference's fit and no more than
 * 1.5x its error, and never the reference's bytes by accident of the test (the search moves
 * some scales). */
Test(quant, q4_K_grid_within_step_bound) {
    enum { N = 8192 };
    static float x[N], y[N];
    static uint8_t q[N], r[N];
    uint64_t s = 9;
    fill_uniform(&s, x, N);
    quant_quantize_q4_K_grid(x, q, N);
    quant_quantize_row_ref(GGML_TYPE_Q4_K, x, r, N);
    double se = 0, se_ref = 0, sx = 0;
    quant_dequantize_row_ref(GGML_TYPE_Q4_K, q, y, N);
    for (int j = 0; j < N; j++) { se += (double)(y[j] - x[j]) * (y[j] - x[j]); sx += (double)x[j] * x[j]; }
    quant_dequantize_row_ref(GGML_TYPE_Q4_K, r, y, N);
    for (int j = 0; j < N; j++) se_ref += (double)(y[j] - x[j]) * (y[j] - x[j]);
    const double rel = sqrt(se / sx), rel_ref = sqrt(se_ref / sx);
    cr_log_info("q4_K grid rmse %.3e, reference %.3e", rel, rel_ref);
    cr_expect(rel <= RMSE_Q4_K, "grid rmse %.4e > %.4e", rel, RMSE_Q4_K);
    cr_expect(rel >= rel_ref && rel <= 1.5 * rel_ref, "grid rmse %.4e vs the reference's %.4e", rel, rel_ref);
    cr_expect(memcmp(q, r, ggml_row_size(GGML_TYPE_Q4_K, N)) != 0);
}

/* Runs of 256 values at very different magnitudes each round-trip within the bound (catches
 * scale packing that only works near 1). Magnitudes stay >= 0.03: below that the f16 block
 * scale of Q6_K (max/4096) is subnormal and loses relative precision, a property of the
 * format, not of the code. */
Test(quant, rmse_varied_scales) {
    enum { N = 4096 };
    static float x[N], y[N];
    static uint8_t q[N * 4];
    uint64_t s = 8;
    for (int j = 0; j < N; j++) x[j] = rng_uniform(&s) * 0.03f * powf(10.0f, (float)((j / 256) % 4));
    for (size_t i = 0; i < sizeof k_types / sizeof k_types[0]; i++) {
        enum ggml_type t = k_types[i];
        quant_quantize_row_ref(t, x, q, N);
        quant_dequantize_row_ref(t, q, y, N);
        for (int b = 0; b < N / 256; b++) {   /* each 256-run has one scale: uniform there */
            double se = 0, sx = 0;
            for (int j = 256 * b; j < 256 * b + 256; j++) {
                se += (double)(y[j] - x[j]) * (y[j] - x[j]);
                sx += (double)x[j] * x[j];
            }
            /* 1.5x: 256 samples give a noisier estimate than 8192 */
            cr_expect(sqrt(se / sx) <= 1.5 * rmse_bound(t), "%s run %d rel rmse %.4e", tname(t), b, sqrt(se / sx));
        }
    }
}

/* ------------------------------------------------------------------------------------------
 * from_float: the fast activation converters write the reference's bytes. */

static const enum ggml_type k_act_weight_for[] = {   /* a weight type per vec_dot_type */
    GGML_TYPE_Q8_0, GGML_TYPE_Q4_1, GGML_TYPE_Q4_K, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_F32,
};

/* Blocks chosen to hit the rounding rules: exact .5 ties (Q8_0 rounds them away from zero,
 * Q8_K to even), duplicated extremes of both signs (first one wins), an all-zero block, tiny
 * and subnormal values (1/d overflows), huge values. */
static void fill_awkward(uint64_t *s, float *x, int64_t n) {
    fill_act(s, x, n);
    for (int64_t b = 0; b * 32 < n; b++) {
        float *v = x + 32 * b;
        switch (b % 8) {
        case 0: for (int j = 0; j < 32; j++) v[j] = (float)(j - 16) + 0.5f; v[5] = 127; break;
        case 1: for (int j = 0; j < 32; j++) v[j] = (float)(j - 16) * 0.25f; v[3] = -4; v[9] = 4; break;
        case 2: memset(v, 0, 32 * sizeof *v); break;
        case 3: for (int j = 0; j < 32; j++) v[j] = rng_uniform(s) * 1e-38f; break;
        case 4: for (int j = 0; j < 32; j++) v[j] = rng_uniform(s) * 1e30f; break;
        case 5: for (int j = 0; j < 32; j++) v[j] = (float)(j % 3) * 1e-45f; break;
        default: break;
        }
    }
}

Test(quant, from_float_matches_ref) {
    enum { N = 2048 };
    static float x[N];
    static uint8_t a[N * 4 + 64], b[N * 4 + 64];
    uint64_t s = 11;
    const int64_t sizes[] = {1, 3, 15, 16, 17, 31, 32, 64, 256, 768, 2048};
    for (int level = 0; level <= (int)quant_cpu_level_detect(); level++)
        for (size_t i = 0; i < sizeof k_act_weight_for / sizeof k_act_weight_for[0]; i++) {
            struct quant_kernels k;
            cr_assert(quant_kernels_get(k_act_weight_for[i], (enum quant_cpu_level)level, &k));
            enum ggml_type vt = k.vec_dot_type;
            for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
                int64_t n = sizes[si];
                if (n % block_of(vt)) continue;
                for (int rep = 0; rep < 4; rep++) {
                    if (rep == 0) fill_act(&s, x, n);
                    else fill_awkward(&s, x, n);
                    if (rep == 2)   /* random finite bit patterns: every exponent */
                        for (int64_t j = 0; j < n; j++) x[j] = f32_from((uint32_t)rng_next(&s) & 0xFF7FFFFFu);
                    if (rep == 3)   /* a whole row so small that 1/d overflows, mixed signs, zeros */
                        for (int64_t j = 0; j < n; j++) x[j] = (j % 5 == 0) ? 0.0f : rng_uniform(&s) * 1e-38f;
                    size_t rb = ggml_row_size(vt, n);
                    memset(a, 0xA5, sizeof a);
                    memset(b, 0x5A, sizeof b);
                    quant_quantize_row_ref(vt, x, a, n);
                    k.from_float(x, b, n);
                    size_t bad = rb;
                    for (size_t j = 0; j < rb; j++) if (a[j] != b[j]) { bad = j; break; }
                    cr_assert_eq(bad, rb, "%s %s n=%ld rep %d: first differing byte %zu (ref %#x fast %#x)",
                                 tname(vt), level_name[level], (long)n, rep, bad, a[bad], b[bad]);
                    cr_assert_eq(b[rb], 0x5A, "%s %s wrote past the row", tname(vt), level_name[level]);
                }
            }
        }
}

/* NaN and inf through the f16/bf16 converters (the Q8 formats leave non-finite input unspecified). */
Test(quant, from_float_f16_bf16_nonfinite) {
    float x[37];
    uint8_t a[80], b[80];
    uint64_t s = 12;
    for (int j = 0; j < 37; j++) x[j] = rng_gauss(&s);
    x[0] = NAN; x[5] = -NAN; x[7] = INFINITY; x[20] = -INFINITY; x[33] = f32_from(0x7F800001);
    x[36] = f32_from(0xFFBFFFFF);
    enum ggml_type ws[2] = {GGML_TYPE_F16, GGML_TYPE_BF16};
    for (int level = 0; level <= (int)quant_cpu_level_detect(); level++)
        for (int i = 0; i < 2; i++) {
            struct quant_kernels k;
            quant_kernels_get(ws[i], (enum quant_cpu_level)level, &k);
            quant_quantize_row_ref(ws[i], x, a, 37);
            k.from_float(x, b, 37);
            cr_assert(!memcmp(a, b, 74), "%s %s", tname(ws[i]), level_name[level]);
        }
}

/* ------------------------------------------------------------------------------------------
 * gemm against the reference dot. */

/* Offset of the f16 field that scales the codes (zeroing it leaves only the min term), for the
 * formats with a min; -1 for the others. */
static int d_field(enum ggml_type t) {
    switch (t) {
    case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_1: case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: return 0;
    case GGML_TYPE_Q2_K: return 80;
    default: return -1;
    }
}

/* Σ over elements of (|scaled code| + |min part|) * |x|: the size of the terms the kernels
 * add up, which bounds their rounding error. */
static double term_scale(enum ggml_type t, const uint8_t *w, const uint8_t *x, int64_t n) {
    const struct ggml_type_traits *tr = ggml_type_traits_get(t);
    float *wf = malloc((size_t)n * 4), *mf = calloc((size_t)n, 4), *xf = malloc((size_t)n * 4);
    uint8_t *wm = malloc(ggml_row_size(t, n));
    quant_dequantize_row_ref(t, w, wf, n);
    quant_dequantize_row_ref(tr->vec_dot_type, x, xf, n);
    if (d_field(t) >= 0) {
        memcpy(wm, w, ggml_row_size(t, n));
        for (int64_t b = 0; b < n / tr->block_elems; b++) memset(wm + b * tr->block_bytes + d_field(t), 0, 2);
        quant_dequantize_row_ref(t, wm, mf, n);
    }
    double sum = 0;
    for (int64_t i = 0; i < n; i++)
        sum += (fabs((double)wf[i] - mf[i]) + fabs((double)mf[i])) * fabs((double)xf[i]);
    free(wf); free(mf); free(xf); free(wm);
    return sum;
}

/* Both the reference and the fast path round each term a bounded number of times on its way
 * into the sum: at most one per block (or element) accumulated in sequence, plus the scale
 * products, the int->f32 conversion and the 4-level horizontal sum. Higham's bound for
 * recursive summation then gives |fast - ref| <= 2 * (steps + 16) * 2^-24 * Σ|terms|; for the
 * sizes here that is about 1e-5 relative to Σ|terms|. */
static double gemm_tol(enum ggml_type t, int64_t n, double scale) {
    int64_t steps = n / block_of(t);
    return 2.0 * (double)(steps + 16) * 0x1p-24 * scale + 1e-30;
}

static void quantize_rows(enum ggml_type t, const float *src, uint8_t *dst, int64_t n, int64_t rows) {
    for (int64_t r = 0; r < rows; r++) quant_quantize_row_ref(t, src + r * n, dst + r * ggml_row_size(t, n), n);
}

/* Row lengths per type: one block, a few blocks (odd and even counts). */
static void gemm_sizes(enum ggml_type t, int64_t *sizes, int *count) {
    int be = block_of(t);
    if (be == 1) {
        const int64_t f[] = {1, 7, 16, 37, 100, 300};
        *count = 6;
        memcpy(sizes, f, sizeof f);
    } else if (be == 32) {
        sizes[0] = 32; sizes[1] = 96; sizes[2] = 128; sizes[3] = 384;
        *count = 4;
    } else {
        sizes[0] = 256; sizes[1] = 768; sizes[2] = 1024;
        *count = 3;
    }
}

Test(quant, gemm_vs_ref, .timeout = 120) {
    uint64_t s = 21;
    const int64_t n_outs[] = {1, 3, 6, 13};
    const int64_t n_toks[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 33};
    enum { NMAX = 1024, OMAX = 13, TMAX = 33 };
    float *wf = malloc(sizeof(float) * NMAX * OMAX), *xf = malloc(sizeof(float) * NMAX * TMAX);
    uint8_t *w = malloc(NMAX * 4 * OMAX), *x = malloc(NMAX * 4 * TMAX);
    float *y = malloc(sizeof(float) * (OMAX + 3) * TMAX);
    static float want[OMAX][TMAX];
    static double tol[OMAX][TMAX];
    for (size_t ti = 0; ti < sizeof k_types / sizeof k_types[0]; ti++) {
        enum ggml_type t = k_types[ti];
        enum ggml_type vt = ggml_type_traits_get(t)->vec_dot_type;
        int64_t sizes[8];
        int ns;
        gemm_sizes(t, sizes, &ns);
        for (int si = 0; si < ns; si++) {
            int64_t n = sizes[si];
            size_t rb = ggml_row_size(t, n), xrb = ggml_row_size(vt, n);
            fill_uniform(&s, wf, n * OMAX);
            fill_act(&s, xf, n * TMAX);
            quantize_rows(t, wf, w, n, OMAX);
            quantize_rows(vt, xf, x, n, TMAX);
            for (int o = 0; o < OMAX; o++)
                for (int tt = 0; tt < TMAX; tt++) {
                    want[o][tt] = quant_vec_dot_ref(t, w + o * rb, x + tt * xrb, n);
                    tol[o][tt] = gemm_tol(t, n, term_scale(t, w + o * rb, x + tt * xrb, n));
                }
            for (int level = 0; level <= (int)quant_cpu_level_detect(); level++) {
                struct quant_kernels k;
                cr_assert(quant_kernels_get(t, (enum quant_cpu_level)level, &k));
                for (size_t oi = 0; oi < sizeof n_outs / sizeof n_outs[0]; oi++)
                    for (size_t tk = 0; tk < sizeof n_toks / sizeof n_toks[0]; tk++) {
                        int64_t n_out = n_outs[oi], n_tok = n_toks[tk], ldy = n_out + 3;
                        for (int64_t i = 0; i < ldy * n_tok; i++) y[i] = -12345.0f;
                        k.gemm(n, w, rb, n_out, x, xrb, n_tok, y, ldy);
                        for (int64_t tt = 0; tt < n_tok; tt++) {
                            for (int64_t o = 0; o < n_out; o++) {
                                float got = y[tt * ldy + o];
                                cr_assert(fabs((double)got - want[o][tt]) <= tol[o][tt],
                                          "%s %s n=%ld n_out=%ld n_tok=%ld: y[%ld][%ld] = %.9g, ref %.9g, tol %.3g",
                                          tname(t), level_name[level], (long)n, (long)n_out, (long)n_tok,
                                          (long)tt, (long)o, got, want[o][tt], tol[o][tt]);
                            }
                            for (int64_t o = n_out; o < ldy; o++)
                                cr_assert_eq(y[tt * ldy + o], -12345.0f, "%s wrote outside y", tname(t));
                        }
                    }
            }
        }
    }
    free(wf); free(xf); free(w); free(x); free(y);
}

/* Outputs are bit-identical whatever the batch (n_tok, which tokens) and however [0, n_out) is
 * split: a verify row computed in a batch equals the same row computed alone. */
Test(quant, gemm_bits_independent_of_batch_and_split, .timeout = 120) {
    uint64_t s = 31;
    enum { NMAX = 1024, OUT = 13, TOK = 33 };
    float *wf = malloc(sizeof(float) * NMAX * OUT), *xf = malloc(sizeof(float) * NMAX * TOK);
    uint8_t *w = malloc(NMAX * 4 * OUT), *x = malloc(NMAX * 4 * TOK);
    float *full = malloc(sizeof(float) * OUT * TOK), *part = malloc(sizeof(float) * OUT * TOK);
    for (size_t ti = 0; ti < sizeof k_types / sizeof k_types[0]; ti++) {
        enum ggml_type t = k_types[ti];
        enum ggml_type vt = ggml_type_traits_get(t)->vec_dot_type;
        int64_t sizes[8];
        int ns;
        gemm_sizes(t, sizes, &ns);
        for (int si = 0; si < ns; si++) {
            int64_t n = sizes[si];
            size_t rb = ggml_row_size(t, n), xrb = ggml_row_size(vt, n);
            fill_uniform(&s, wf, n * OUT);
            fill_act(&s, xf, n * TOK);
            quantize_rows(t, wf, w, n, OUT);
            quantize_rows(vt, xf, x, n, TOK);
            for (int level = 0; level <= (int)quant_cpu_level_detect(); level++) {
                struct quant_kernels k;
                quant_kernels_get(t, (enum quant_cpu_level)level, &k);
                k.gemm(n, w, rb, OUT, x, xrb, TOK, full, OUT);
                /* every token batch [a, b) */
                const int spans[][2] = {{0, 1}, {5, 6}, {32, 33}, {0, 2}, {3, 7}, {1, 9}, {2, 10}, {4, 33}};
                for (size_t i = 0; i < sizeof spans / sizeof spans[0]; i++) {
                    int a = spans[i][0], b = spans[i][1];
                    k.gemm(n, w, rb, OUT, x + a * xrb, xrb, b - a, part, OUT);
                    cr_assert(!memcmp(part, full + a * OUT, sizeof(float) * OUT * (b - a)),
                              "%s %s n=%ld: tokens [%d,%d) differ from the full batch", tname(t),
                              level_name[level], (long)n, a, b);
                }
                /* every split point of the rows, and single rows */
                for (int cut = 1; cut < OUT; cut++) {
                    k.gemm(n, w, rb, cut, x, xrb, TOK, part, OUT);
                    k.gemm(n, w + cut * rb, rb, OUT - cut, x, xrb, TOK, part + cut, OUT);
                    cr_assert(!memcmp(part, full, sizeof(float) * OUT * TOK), "%s %s n=%ld: split at %d",
                              tname(t), level_name[level], (long)n, cut);
                }
                for (int o = 0; o < OUT; o++)
                    for (int tt = 0; tt < TOK; tt += 7) {
                        float one;
                        k.gemm(n, w + o * rb, rb, 1, x + tt * xrb, xrb, 1, &one, 1);
                        cr_assert(!memcmp(&one, &full[tt * OUT + o], 4), "%s %s n=%ld: row %d tok %d alone",
                                  tname(t), level_name[level], (long)n, o, tt);
                    }
            }
        }
    }
    free(wf); free(xf); free(w); free(x); free(full); free(part);
}

/* ------------------------------------------------------------------------------------------
 * Packed weights (the levels that have them). */

static bool packed_kernels(enum ggml_type t, struct quant_kernels *k) {
    return quant_kernels_get(t, quant_cpu_level_detect(), k) && k->packed_gemm;
}

/* Q8_0 and Q4_0. The packed gemm computes each output exactly as quant_vec_dot_ref does, so the comparison
 * is bitwise; shapes cover one and several groups, short and long rows (the longest uses a
 * chunk of 8 activation rows and one group per cache block, so 20 rows span three chunks). */
Test(quant, packed_gemm_bits_equal_reference, .timeout = 120) {
    const enum ggml_type types[] = {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0};
    uint64_t s = 41;
    for (size_t ti = 0; ti < 2; ti++) {
        const enum ggml_type ty = types[ti];
        struct quant_kernels k;
        if (!packed_kernels(ty, &k)) cr_skip_test("no packed kernels at this CPU level");
        const struct { int64_t n, n_out; int n_tok[6]; } shapes[] = {
            {32, 16, {1, 2, 3, 8, 9, 17}}, {96, 48, {1, 4, 5, 7, 16, 33}},
            {384, 32, {1, 2, 3, 4, 8, 40}}, {1152, 16, {1, 2, 6, 9, 11, 12}},
            {32768, 32, {1, 3, 8, 9, 20, 20}},
        };
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const int64_t n = shapes[si].n, n_out = shapes[si].n_out, TOK = 40;
            const size_t rb = ggml_row_size(ty, n), xrb = ggml_row_size(GGML_TYPE_Q8_0, n);
            float *wf = malloc(sizeof(float) * (size_t)(n * n_out)), *xf = malloc(sizeof(float) * (size_t)(n * TOK));
            float *y = malloc(sizeof(float) * (size_t)((n_out + 5) * TOK)), *row = malloc(sizeof(float) * (size_t)n);
            float *want_row = malloc(sizeof(float) * (size_t)n);
            uint8_t *w = malloc(rb * (size_t)n_out), *x = malloc(xrb * TOK);
            size_t psize = k.packed_size(n, n_out);
            cr_assert_eq(psize, rb * (size_t)n_out, "%s n=%ld: packed size %zu", tname(ty), (long)n, psize);
            uint8_t *wp = malloc(psize);
            fill_uniform(&s, wf, n * n_out);
            fill_act(&s, xf, n * TOK);
            quantize_rows(ty, wf, w, n, n_out);
            quantize_rows(GGML_TYPE_Q8_0, xf, x, n, TOK);
            k.pack(w, rb, n, n_out, wp);
            for (int64_t o = 0; o < n_out; o++) {
                k.packed_row(wp, n, o, row);
                quant_dequantize_row_ref(ty, w + o * rb, want_row, n);
                cr_assert(!memcmp(row, want_row, sizeof(float) * (size_t)n), "%s n=%ld: packed row %ld", tname(ty), (long)n, (long)o);
            }
            for (int i = 0; i < 6; i++) {
                const int64_t n_tok = shapes[si].n_tok[i], ldy = n_out + 5;
                for (int64_t j = 0; j < ldy * n_tok; j++) y[j] = -12345.0f;
                /* the second half of the groups on its own, the way the backend splits them */
                const int64_t cut = n_out / QUANT_PACK_ROWS / 2 * QUANT_PACK_ROWS;
                if (cut) k.packed_gemm(n, wp, cut, x, xrb, n_tok, y, ldy);
                k.packed_gemm(n, wp + k.packed_size(n, QUANT_PACK_ROWS) * (size_t)(cut / QUANT_PACK_ROWS),
                              n_out - cut, x, xrb, n_tok, y + cut, ldy);
                for (int64_t t = 0; t < n_tok; t++) {
                    for (int64_t o = 0; o < n_out; o++) {
                        float want = quant_vec_dot_ref(ty, w + o * rb, x + t * xrb, n);
                        cr_assert_eq(f32_bits(y[t * ldy + o]), f32_bits(want),
                                     "%s n=%ld n_out=%ld n_tok=%ld: y[%ld][%ld] = %.9g, ref %.9g", tname(ty), (long)n,
                                     (long)n_out, (long)n_tok, (long)t, (long)o, y[t * ldy + o], want);
                    }
                    for (int64_t o = n_out; o < ldy; o++) cr_assert_eq(y[t * ldy + o], -12345.0f, "wrote outside y");
                }
            }
            free(wf); free(xf); free(y); free(row); free(want_row); free(w); free(x); free(wp);
        }
    }
}

Test(quant, packed_shapes) {
    struct quant_kernels k;
    if (!packed_kernels(GGML_TYPE_Q8_0, &k)) cr_skip_test("no packed kernels at this CPU level");
    cr_expect_eq(k.packed_size(384, 8), 0);         /* not whole groups: stays row-major */
    cr_expect_eq(k.packed_size(384, 24), 0);
    cr_expect_eq(k.packed_size(40, 16), 0);         /* not whole blocks */
    cr_expect_eq(k.packed_size(32768 + 32, 16), 0); /* longer than the kernel's scratch */
    cr_expect_eq(k.packed_size(0, 16), 0);
    cr_expect_gt(k.packed_size(384, 16384), 0);
    struct quant_kernels k4;
    cr_assert(packed_kernels(GGML_TYPE_Q4_0, &k4));
    cr_expect_eq(k4.packed_size(384, 16), ggml_row_size(GGML_TYPE_Q4_0, 384) * 16);
    cr_expect_eq(k4.packed_size(384, 8), 0);
    struct quant_kernels r;
    cr_assert(quant_kernels_get(GGML_TYPE_Q8_0, QUANT_CPU_REF, &r));
    cr_expect(r.packed_gemm == NULL && r.pack == NULL, "the reference level keeps row-major weights");
}

/* Level clamping: asking for more than the CPU has gives the best it has, never a crash. */
Test(quant, kernels_level_clamped) {
    struct quant_kernels a, b;
    cr_assert(quant_kernels_get(GGML_TYPE_Q8_0, (enum quant_cpu_level)99, &a));
    cr_assert(quant_kernels_get(GGML_TYPE_Q8_0, quant_cpu_level_detect(), &b));
    cr_expect(a.gemm == b.gemm && a.from_float == b.from_float);
    cr_expect_not(quant_kernels_get((enum ggml_type)4, QUANT_CPU_REF, &a));
}
