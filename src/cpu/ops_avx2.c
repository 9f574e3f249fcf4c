/* ops_avx2.c — the AVX2 + FMA + F16C instance of ops_body.h, for the CPUs without AVX-512
 * (which otherwise ran the reference loops: on a 2-core EPYC the scalar delta rule alone was
 * 12% of a decode step). 8-lane dot/axpy primitives, f16 by vcvtph2ps, an 8-lane e^x (the
 * AVX-512 file's polynomial, with 2^n formed in two exact steps in place of vscalefps), an
 * 8-way reduction tree. f32 tails go through the same vector code with vmaskmov loads and
 * stores (zeros in the lanes past the end), so an element's value never depends on where a
 * call's length puts it. */
#include <immintrin.h>
#include "cpu/ops.h"
#include "quant/quant.h"
#include "cpu/kv_rows_simd.h"

#define UNROLL8 _Pragma("GCC unroll 8")   /* keeps per-row accumulators in registers */

/* lanes [0, r) set, for vmaskmov (r < 8) */
static inline __m256i tail_mask(int r) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(r), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline __m256 load_tail(const float *p, int r) { return _mm256_maskload_ps(p, tail_mask(r)); }
static inline void store_tail(float *p, int r, __m256 v) { _mm256_maskstore_ps(p, tail_mask(r), v); }

static inline float hsum8(__m256 v) {
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}

static inline float vdot(const float *a, const float *b, int n) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    if (i < n) acc = _mm256_fmadd_ps(load_tail(a + i, n - i), load_tail(b + i, n - i), acc);
    return hsum8(acc);
}
static inline void vaxpy(float *y, float a, const float *x, int n) {
    const __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    if (i < n) store_tail(y + i, n - i, _mm256_fmadd_ps(va, load_tail(x + i, n - i), load_tail(y + i, n - i)));
}
static inline void vscale(float *y, float a, int n) {
    const __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(va, _mm256_loadu_ps(y + i)));
    if (i < n) store_tail(y + i, n - i, _mm256_mul_ps(va, load_tail(y + i, n - i)));
}
/* y[i] *= x[i] */
static inline void vmul(float *y, const float *x, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    if (i < n) store_tail(y + i, n - i, _mm256_mul_ps(load_tail(x + i, n - i), load_tail(y + i, n - i)));
}

/* y = a y + b x */
static inline void vscale_add(float *y, float a, float b, const float *x, int n) {
    const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(vb, _mm256_loadu_ps(x + i), _mm256_mul_ps(va, _mm256_loadu_ps(y + i))));
    if (i < n) store_tail(y + i, n - i, _mm256_fmadd_ps(vb, load_tail(x + i, n - i), _mm256_mul_ps(va, load_tail(y + i, n - i))));
}

/* Lane i of the result = the sum of the 8 lanes of v[i]: pairwise horizontal adds within the
 * 128-bit halves, then the two halves of each row added. */
static inline __m256 reduce8(const __m256 v[8]) {
    const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

/* f16 rows (stride bytes apart) to packed f32 rows of n */
static inline void cvt_rows_f16(float *y, const uint8_t *x, size_t stride, int nb, int n) {
    for (int c = 0; c < nb; c++) {
        const uint16_t *xr = (const uint16_t *)(x + (size_t)c * stride);
        float *yr = y + (size_t)c * n;
        int i = 0;
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(yr + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(xr + i))));
        for (; i < n; i++) yr[i] = fp16_to_f32(xr[i]);
    }
}

/* out[c] = (q · row c of k) * scale for nb packed rows of n: 8 rows at a time, each with its
 * own accumulator, then one reduction tree. Rows past nb re-read the first row and are not
 * stored. */
static inline void vdot_rows(const float *q, const float *k, int nb, int n, float scale, float *out) {
    for (int c0 = 0; c0 < nb; c0 += 8) {
        const int m = nb - c0 < 8 ? nb - c0 : 8;
        const float *kr[8];
        __m256 v[8];
        UNROLL8 for (int r = 0; r < 8; r++) {
            kr[r] = k + (size_t)(c0 + (r < m ? r : 0)) * n;
            v[r] = _mm256_setzero_ps();
        }
        int i = 0;
        for (; i + 8 <= n; i += 8) {
            const __m256 qv = _mm256_loadu_ps(q + i);
            UNROLL8 for (int r = 0; r < 8; r++) v[r] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kr[r] + i), v[r]);
        }
        if (i < n) {
            const __m256 qv = load_tail(q + i, n - i);
            UNROLL8 for (int r = 0; r < 8; r++) v[r] = _mm256_fmadd_ps(qv, load_tail(kr[r] + i, n - i), v[r]);
        }
        const __m256 s = _mm256_mul_ps(reduce8(v), _mm256_set1_ps(scale));
        if (m == 8) _mm256_storeu_ps(out + c0, s);
        else store_tail(out + c0, m, s);
    }
}

/* oa[c] = a · row c, ob[c] = b · row c (two passes: the 8-lane unit has too few registers
 * for both products of 8 rows) */
static inline void vdot2_rows(const float *a, const float *b, const float *k, int nb, int n, float *oa, float *ob) {
    vdot_rows(a, k, nb, n, 1.0f, oa);
    vdot_rows(b, k, nb, n, 1.0f, ob);
}

/* y += Σ_c a[c] · row c of x (nb packed rows of n): up to 8 8-float slices of y kept in
 * registers over all rows (each element sums the rows in order) */
static inline void vaxpy_rows(float *y, const float *a, const float *x, int nb, int n) {
    for (int i0 = 0; i0 < n; i0 += 64) {
        const int w = n - i0 < 64 ? n - i0 : 64;
        if (w < 64) { /* the last, partial slice group: one slice at a time */
            for (int c = 0; c < nb; c++) vaxpy(y + i0, a[c], x + (size_t)c * n + i0, w);
            break;
        }
        __m256 acc[8];
        UNROLL8 for (int s = 0; s < 8; s++) acc[s] = _mm256_loadu_ps(y + i0 + 8 * s);
        for (int c = 0; c < nb; c++) {
            const __m256 ac = _mm256_set1_ps(a[c]);
            const float *xr = x + (size_t)c * n + i0;
            UNROLL8 for (int s = 0; s < 8; s++) acc[s] = _mm256_fmadd_ps(ac, _mm256_loadu_ps(xr + 8 * s), acc[s]);
        }
        UNROLL8 for (int s = 0; s < 8; s++) _mm256_storeu_ps(y + i0 + 8 * s, acc[s]);
    }
}

static inline float hmax8(__m256 v) {
    __m128 b = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    b = _mm_max_ps(b, _mm_movehl_ps(b, b));
    b = _mm_max_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}

/* max(init, x[0..n)); NaNs never win (vmaxps keeps the accumulator when the loaded lane is
 * NaN); tail lanes past n hold the accumulator itself */
static inline float vmax(const float *x, int n, float init) {
    __m256 acc = _mm256_set1_ps(init);
    int i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_max_ps(_mm256_loadu_ps(x + i), acc);
    if (i < n)
        acc = _mm256_max_ps(_mm256_blendv_ps(acc, load_tail(x + i, n - i), _mm256_castsi256_ps(tail_mask(n - i))), acc);
    return hmax8(acc);
}

/* e^x, 8 lanes: the AVX-512 file's exp16 (same range reduction and polynomial, so the same
 * bits), with p·2^n as p·2^(n/2)·2^(n - n/2): both factors are normal floats for every n the
 * clamp allows, the first product is exact and the second rounds once, as vscalefps does. */
static inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(_mm256_set1_ps(-104.0f), _mm256_min_ps(_mm256_set1_ps(89.0f), x));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i ni = _mm256_cvtps_epi32(n);                     /* NaN lanes: p is NaN anyway */
    const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    const __m256 f1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    const __m256 f2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, f1), f2);
}

static inline float vexp_shift(float *x, int n, float m) {
    const __m256 vm = _mm256_set1_ps(m);
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
        _mm256_storeu_ps(x + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    if (i < n) {
        const __m256 e = _mm256_and_ps(exp8(_mm256_sub_ps(load_tail(x + i, n - i), vm)),
                                       _mm256_castsi256_ps(tail_mask(n - i)));
        store_tail(x + i, n - i, e);
        acc = _mm256_add_ps(acc, e);
    }
    return hsum8(acc);
}

/* y = x / (1 + e^-x) (silu) or 1 / (1 + e^-x) (sigmoid), 8 lanes at a time */
#define DEF_LOGISTIC(NAME, NUM)                                                                \
    static inline __m256 NAME##8(__m256 v) {                                                   \
        const __m256 one = _mm256_set1_ps(1.0f);                                               \
        const __m256 d = _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), v)));      \
        return _mm256_div_ps(NUM, d);                                                          \
    }                                                                                          \
    static void NAME(const float *x, float *y, int n) {                                        \
        int i = 0;                                                                             \
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, NAME##8(_mm256_loadu_ps(x + i)));   \
        if (i < n) store_tail(y + i, n - i, NAME##8(load_tail(x + i, n - i)));                 \
    }
DEF_LOGISTIC(silu_avx2, v)
DEF_LOGISTIC(sigmoid_avx2, one)

static void conv4_token_avx2(const float *x, int n_ch, const float *w, float *state, float *y) {
    conv4_channels(x, 0, n_ch, w, state, y);   /* ~0.4% of a step: the reference stays */
}

/* 4 double lanes, two accumulators (8 floats a step) */
static double sum_sq_avx2(const float *x, int n) {
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256d lo = _mm256_cvtps_pd(_mm_loadu_ps(x + i)), hi = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
        a0 = _mm256_fmadd_pd(lo, lo, a0);
        a1 = _mm256_fmadd_pd(hi, hi, a1);
    }
    double lanes[4];
    _mm256_storeu_pd(lanes, _mm256_add_pd(a0, a1));
    double sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    for (; i < n; i++) sum += (double)x[i] * x[i];
    return sum;
}

/* vcvtps2ph rounds to nearest even like the scalar f32_to_fp16 */
static void to_f16_avx2(const float *x, uint16_t *y, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++) y[i] = f32_to_fp16(x[i]);
}

/* 8 f32 lanes of e^(x - m) (each term <= 1), summed per lane, the lanes in double */
static double exp_sum_avx2(const float *x, int n, float m) {
    const __m256 vm = _mm256_set1_ps(m);
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_add_ps(acc, exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm)));
    if (i < n)
        acc = _mm256_add_ps(acc, _mm256_and_ps(exp8(_mm256_sub_ps(load_tail(x + i, n - i), vm)),
                                               _mm256_castsi256_ps(tail_mask(n - i))));
    float lanes[8];
    _mm256_storeu_ps(lanes, acc);
    double sum = 0.0;
    for (int k = 0; k < 8; k++) sum += lanes[k];
    return sum;
}

/* the maximum first, then the first index holding it: the same answer as the scalar scan */
static int argmax_avx2(const float *x, int n) {
    if (n <= 0 || x[0] != x[0]) return 0;
    const float m = vmax(x, n, x[0]);
    const __m256 vm = _mm256_set1_ps(m);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const int eq = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), vm, _CMP_EQ_OQ));
        if (eq) return i + __builtin_ctz((unsigned)eq);
    }
    for (; i < n; i++) if (x[i] == m) return i;
    return 0;
}

#define OPS_NAME(x) x##_avx2
#include "cpu/ops_body.h"

const struct cpu_ops cpu_ops_avx2 = {attn_tokens_avx2, gdn_head_avx2, gdn_chunked_head_avx2,
                                     silu_avx2, sigmoid_avx2, conv4_token_avx2,
                                     sum_sq_avx2, to_f16_avx2, exp_sum_avx2, argmax_avx2};
