/* ops_avx512.c — the AVX-512 instance of ops_body.h: 16-lane dot/axpy primitives, f16
 * conversion by vcvtph2ps, a 16-lane e^x. Lengths not a multiple of 16 are finished with
 * masked loads. */
#include <immintrin.h>

#include "cpu/ops.h"

static inline __mmask16 tail_mask(int r) { return (__mmask16)((1u << r) - 1u); }

static inline float vdot(const float *a, const float *b, int n) {
    __m512 acc = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc);
    }
    return _mm512_reduce_add_ps(acc);
}
static inline __m512 load_f16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
static inline __m512 load_f16_mask(__mmask16 m, const uint16_t *p) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}
static inline float vdot_f16(const float *a, const uint16_t *b, int n) {
    __m512 acc = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), load_f16(b + i), acc);
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), load_f16_mask(m, b + i), acc);
    }
    return _mm512_reduce_add_ps(acc);
}
static inline void vaxpy(float *y, float a, const float *x, int n) {
    const __m512 va = _mm512_set1_ps(a);
    int i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
    }
}
static inline void vaxpy_f16(float *y, float a, const uint16_t *x, int n) {
    const __m512 va = _mm512_set1_ps(a);
    int i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, load_f16(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(va, load_f16_mask(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
    }
}
static inline void vscale(float *y, float a, int n) {
    const __m512 va = _mm512_set1_ps(a);
    int i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_mul_ps(va, _mm512_loadu_ps(y + i)));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(va, _mm512_maskz_loadu_ps(m, y + i)));
    }
}

/* e^x, 16 lanes: x = n ln2 + r with |r| <= ln2/2 (ln2 split in two so n ln2 is exact enough),
 * e^r by a degree-7 Taylor-form polynomial (Cephes expf coefficients), scaled by 2^n with
 * vscalefps, which also gives inf on overflow and 0 below the subnormals. About 2 ulp from
 * glibc's expf on [-87, 88]; tests/test_backend_ops.c checks it on random inputs. NaN stays NaN
 * (vminps/vmaxps return the second operand when one is NaN). */
static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-104.0f), _mm512_min_ps(_mm512_set1_ps(89.0f), x));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

static inline float vexp_shift(float *x, int n, float m) {
    const __m512 vm = _mm512_set1_ps(m);
    __m512 acc = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm));
        _mm512_storeu_ps(x + i, e);
        acc = _mm512_add_ps(acc, e);
    }
    if (i < n) {
        __mmask16 k = tail_mask(n - i);
        __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), vm));
        _mm512_mask_storeu_ps(x + i, k, e);
        acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(k, e));
    }
    return _mm512_reduce_add_ps(acc);
}

/* y = x / (1 + e^-x) (silu) or 1 / (1 + e^-x) (sigmoid), 16 lanes at a time */
#define DEF_LOGISTIC(NAME, NUM)                                                                \
    static void NAME(const float *x, float *y, int n) {                                        \
        const __m512 one = _mm512_set1_ps(1.0f);                                               \
        int i = 0;                                                                             \
        for (; i + 16 <= n; i += 16) {                                                         \
            __m512 v = _mm512_loadu_ps(x + i);                                                 \
            __m512 d = _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), v)));       \
            _mm512_storeu_ps(y + i, _mm512_div_ps(NUM, d));                                    \
        }                                                                                      \
        if (i < n) {                                                                           \
            __mmask16 k = tail_mask(n - i);                                                    \
            __m512 v = _mm512_maskz_loadu_ps(k, x + i);                                        \
            __m512 d = _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), v)));       \
            _mm512_mask_storeu_ps(y + i, k, _mm512_div_ps(NUM, d));                            \
        }                                                                                      \
    }
DEF_LOGISTIC(silu_avx512, v)
DEF_LOGISTIC(sigmoid_avx512, one)

/* the maximum first (vmaxps keeps the accumulator when the loaded lane is NaN), then the
 * first index holding it: the same answer as the scalar scan */
static int argmax_avx512(const float *x, int n) {
    if (n <= 0 || x[0] != x[0]) return 0;
    __m512 mx = _mm512_set1_ps(x[0]);
    int i = 0;
    for (; i + 16 <= n; i += 16) mx = _mm512_max_ps(_mm512_loadu_ps(x + i), mx);
    if (i < n) mx = _mm512_mask_max_ps(mx, tail_mask(n - i), _mm512_maskz_loadu_ps(tail_mask(n - i), x + i), mx);
    const float m = _mm512_reduce_max_ps(mx);
    const __m512 vm = _mm512_set1_ps(m);
    for (i = 0; i + 16 <= n; i += 16) {
        __mmask16 eq = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), vm, _CMP_EQ_OQ);
        if (eq) return i + __builtin_ctz(eq);
    }
    for (; i < n; i++) if (x[i] == m) return i;
    return 0;
}

#define OPS_NAME(x) x##_avx512
#include "cpu/ops_body.h"

const struct cpu_ops cpu_ops_avx512 = {attn_one_avx512, gdn_head_avx512, gdn_chunked_head_avx512,
                                       silu_avx512, sigmoid_avx512, argmax_avx512};
