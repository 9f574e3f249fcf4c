/* ops_avx512.c — the AVX-512 instance of ops_body.h: 16-lane dot/axpy primitives, f16
 * conversion by vcvtph2ps, a 16-lane e^x, a 16-way reduction tree. Lengths not a multiple of 16 are finished with
 * masked loads. */
#include <immintrin.h>

#include "cpu/ops.h"
#include "cpu/kv_rows_simd.h"

#define UNROLL16 _Pragma("GCC unroll 16")   /* keeps per-row accumulators in registers */

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
static inline void vscale(float *y, float a, int n) {
    const __m512 va = _mm512_set1_ps(a);
    int i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_mul_ps(va, _mm512_loadu_ps(y + i)));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(va, _mm512_maskz_loadu_ps(m, y + i)));
    }
}
/* y[i] *= x[i] */
static inline void vmul(float *y, const float *x, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
    }
}

/* y = a y + b x */
static inline void vscale_add(float *y, float a, float b, const float *x, int n) {
    const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b);
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(vb, _mm512_loadu_ps(x + i), _mm512_mul_ps(va, _mm512_loadu_ps(y + i))));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m, x + i), _mm512_mul_ps(va, _mm512_maskz_loadu_ps(m, y + i))));
    }
}

/* Lane i of the result = the sum of the 16 lanes of v[i]: a tree of in-register shuffles and
 * adds (quarters, then halves of quarters) instead of 16 separate horizontal sums. After the
 * tree, lane 4q + e holds v[q + 4e]; the final permute puts v[i] in lane i. */
static inline __m512 reduce16(const __m512 v[16]) {
    __m512 w[8], x[4], y[2];
    UNROLL16 for (int i = 0; i < 8; i++)
        w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    UNROLL16 for (int i = 0; i < 4; i++)
        x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    UNROLL16 for (int i = 0; i < 2; i++)
        y[i] = _mm512_add_ps(_mm512_shuffle_ps(x[2 * i], x[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(x[2 * i], x[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(y[0], y[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_ps(y[0], y[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512i to_row = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    return _mm512_permutexvar_ps(to_row, r);
}

/* f16 rows (stride bytes apart) to packed f32 rows of n */
static inline void cvt_rows_f16(float *y, const uint8_t *x, size_t stride, int nb, int n) {
    for (int c = 0; c < nb; c++) {
        const uint16_t *xr = (const uint16_t *)(x + (size_t)c * stride);
        float *yr = y + (size_t)c * n;
        int i = 0;
        for (; i + 16 <= n; i += 16) _mm512_storeu_ps(yr + i, load_f16(xr + i));
        if (i < n) _mm512_mask_storeu_ps(yr + i, tail_mask(n - i), load_f16_mask(tail_mask(n - i), xr + i));
    }
}

/* out[c] = (q · row c of k) * scale for nb packed rows of n: 16 rows at a time, each with its
 * own accumulator (16 independent FMA chains), then one reduction tree. Rows past nb re-read
 * the first row and are not stored. */
static inline void vdot_rows(const float *q, const float *k, int nb, int n, float scale, float *out) {
    for (int c0 = 0; c0 < nb; c0 += 16) {
        const int m = nb - c0 < 16 ? nb - c0 : 16;
        const float *kr[16];
        __m512 v[16];
        UNROLL16 for (int r = 0; r < 16; r++) {
            kr[r] = k + (size_t)(c0 + (r < m ? r : 0)) * n;
            v[r] = _mm512_setzero_ps();
        }
        int i = 0;
        for (; i + 16 <= n; i += 16) {
            const __m512 qv = _mm512_loadu_ps(q + i);
            UNROLL16 for (int r = 0; r < 16; r++) v[r] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(kr[r] + i), v[r]);
        }
        if (i < n) {
            const __mmask16 t = tail_mask(n - i);
            const __m512 qv = _mm512_maskz_loadu_ps(t, q + i);
            UNROLL16 for (int r = 0; r < 16; r++) v[r] = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(t, kr[r] + i), v[r]);
        }
        _mm512_mask_storeu_ps(out + c0, m == 16 ? (__mmask16)0xFFFF : tail_mask(m),
                              _mm512_mul_ps(reduce16(v), _mm512_set1_ps(scale)));
    }
}

/* oa[c] = a · row c, ob[c] = b · row c for nb packed rows of n: 8 rows at a time, each row
 * loaded once for both products, the 16 sums in one reduction tree. */
static inline void vdot2_rows(const float *a, const float *b, const float *k, int nb, int n, float *oa, float *ob) {
    for (int c0 = 0; c0 < nb; c0 += 8) {
        const int m = nb - c0 < 8 ? nb - c0 : 8;
        const float *kr[8];
        __m512 v[16];
        UNROLL16 for (int r = 0; r < 8; r++) {
            kr[r] = k + (size_t)(c0 + (r < m ? r : 0)) * n;
            v[r] = v[r + 8] = _mm512_setzero_ps();
        }
        for (int i = 0; i < n; i += 16) {
            const __mmask16 t = n - i >= 16 ? (__mmask16)0xFFFF : tail_mask(n - i);
            const __m512 av = _mm512_maskz_loadu_ps(t, a + i), bv = _mm512_maskz_loadu_ps(t, b + i);
            UNROLL16 for (int r = 0; r < 8; r++) {
                const __m512 kv = _mm512_maskz_loadu_ps(t, kr[r] + i);
                v[r] = _mm512_fmadd_ps(av, kv, v[r]);
                v[r + 8] = _mm512_fmadd_ps(bv, kv, v[r + 8]);
            }
        }
        const __m512 sums = reduce16(v);
        const __mmask8 keep = (__mmask8)(m == 8 ? 0xFF : tail_mask(m));
        _mm256_mask_storeu_ps(oa + c0, keep, _mm512_castps512_ps256(sums));
        _mm256_mask_storeu_ps(ob + c0, keep, _mm512_extractf32x8_ps(sums, 1));
    }
}

/* y += Σ_c a[c] · row c of x (nb packed rows of n): up to 4 16-float slices of y kept in
 * registers over all rows (four independent FMA chains; each element sums the rows in order) */
static inline void vaxpy_rows(float *y, const float *a, const float *x, int nb, int n) {
    for (int i0 = 0; i0 < n; i0 += 64) {
        __m512 acc[4];
        __mmask16 t[4];
        UNROLL16 for (int s = 0; s < 4; s++) {
            const int i = i0 + 16 * s;
            t[s] = i >= n ? 0 : n - i >= 16 ? (__mmask16)0xFFFF : tail_mask(n - i);
            acc[s] = _mm512_maskz_loadu_ps(t[s], y + i);
        }
        for (int c = 0; c < nb; c++) {
            const __m512 ac = _mm512_set1_ps(a[c]);
            const float *xr = x + (size_t)c * n + i0;
            UNROLL16 for (int s = 0; s < 4; s++) acc[s] = _mm512_fmadd_ps(ac, _mm512_maskz_loadu_ps(t[s], xr + 16 * s), acc[s]);
        }
        UNROLL16 for (int s = 0; s < 4; s++) _mm512_mask_storeu_ps(y + i0 + 16 * s, t[s], acc[s]);
    }
}

/* max(init, x[0..n)); NaNs never win (vmaxps keeps the accumulator when the loaded lane is NaN) */
static inline float vmax(const float *x, int n, float init) {
    __m512 acc = _mm512_set1_ps(init);
    int i = 0;
    for (; i + 16 <= n; i += 16) acc = _mm512_max_ps(_mm512_loadu_ps(x + i), acc);
    if (i < n) acc = _mm512_mask_max_ps(acc, tail_mask(n - i), _mm512_maskz_loadu_ps(tail_mask(n - i), x + i), acc);
    return _mm512_reduce_max_ps(acc);
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

/* 16 channels at a time: the state's three columns and the four taps taken apart by lane
 * permutes (gathers cost several times more on the CPUs measured), the same products summed
 * in the same order as the scalar loop (so the same bits); the new state is the old one moved
 * by one float through the [c][3] array with the new inputs permuted into every third lane. */
static void conv4_token_avx512(const float *x, int n_ch, const float *w, float *state, float *y) {
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i i3 = _mm512_mullo_epi32(lane, _mm512_set1_epi32(3)), i4 = _mm512_slli_epi32(lane, 2);
    /* state column j, lane i: float 3i + j of 48; past 32 it comes from the third vector */
    __m512i sidx[3];
    __mmask16 shigh[3];
    for (int j = 0; j < 3; j++) {
        sidx[j] = _mm512_add_epi32(i3, _mm512_set1_epi32(j));
        shigh[j] = _mm512_cmpge_epi32_mask(sidx[j], _mm512_set1_epi32(32));
    }
    /* new state vector v, lane l (float 16v + l): x[(16v + l) / 3] where (16v + l) % 3 == 2 */
    const __mmask16 xin[3] = {0x4924, 0x2492, 0x9249};
    __m512i xidx[3];
    for (int v = 0; v < 3; v++)
        xidx[v] = _mm512_srli_epi32(_mm512_mullo_epi32(_mm512_add_epi32(lane, _mm512_set1_epi32(16 * v)),
                                                       _mm512_set1_epi32(0xAAAB)), 17);   /* / 3 */
    int c = 0;
    for (; c + 16 <= n_ch; c += 16) {
        float *st = state + 3 * c;
        const float *wc = w + 4 * c;
        const __m512 xv = _mm512_loadu_ps(x + c);
        const __m512 s0 = _mm512_loadu_ps(st), s1 = _mm512_loadu_ps(st + 16), s2 = _mm512_loadu_ps(st + 32);
        const __m512 w0 = _mm512_loadu_ps(wc), w1 = _mm512_loadu_ps(wc + 16), w2 = _mm512_loadu_ps(wc + 32),
                     w3 = _mm512_loadu_ps(wc + 48);
        __m512 tap[4], col[3];
        for (int j = 0; j < 4; j++) {
            const __m512i idx = _mm512_add_epi32(i4, _mm512_set1_epi32(j));
            tap[j] = _mm512_mask_blend_ps(0xFF00, _mm512_permutex2var_ps(w0, idx, w1), _mm512_permutex2var_ps(w2, idx, w3));
        }
        for (int j = 0; j < 3; j++)
            col[j] = _mm512_mask_permutexvar_ps(_mm512_permutex2var_ps(s0, sidx[j], s1), shigh[j], sidx[j], s2);
        __m512 s = _mm512_setzero_ps();
        s = _mm512_add_ps(s, _mm512_mul_ps(tap[0], col[0]));
        s = _mm512_add_ps(s, _mm512_mul_ps(tap[1], col[1]));
        s = _mm512_add_ps(s, _mm512_mul_ps(tap[2], col[2]));
        s = _mm512_add_ps(s, _mm512_mul_ps(tap[3], xv));
        _mm512_storeu_ps(y + c, s);
        /* float e of the new 48 is float e + 1 of the old, or an input */
        const __m512i one = _mm512_set1_epi32(1);
        const __m512 n0 = _mm512_permutex2var_ps(s0, _mm512_add_epi32(lane, one), s1);
        const __m512 n1 = _mm512_permutex2var_ps(s1, _mm512_add_epi32(lane, one), s2);
        const __m512 n2 = _mm512_permutexvar_ps(_mm512_add_epi32(lane, one), s2);
        _mm512_storeu_ps(st, _mm512_mask_permutexvar_ps(n0, xin[0], xidx[0], xv));
        _mm512_storeu_ps(st + 16, _mm512_mask_permutexvar_ps(n1, xin[1], xidx[1], xv));
        _mm512_storeu_ps(st + 32, _mm512_mask_permutexvar_ps(n2, xin[2], xidx[2], xv));
    }
    conv4_channels(x, c, n_ch, w, state, y);
}

/* 8 double lanes, two accumulators (16 floats a step) */
static double sum_sq_avx512(const float *x, int n) {
    __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512d lo = _mm512_cvtps_pd(_mm256_loadu_ps(x + i)), hi = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8));
        a0 = _mm512_fmadd_pd(lo, lo, a0);
        a1 = _mm512_fmadd_pd(hi, hi, a1);
    }
    double sum = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
    for (; i < n; i++) sum += (double)x[i] * x[i];
    return sum;
}

/* vcvtps2ph rounds to nearest even like the scalar f32_to_fp16 */
static void to_f16_avx512(const float *x, uint16_t *y, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(y + i), _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (i < n) {
        const __mmask16 t = tail_mask(n - i);
        _mm256_mask_storeu_epi16(y + i, t, _mm512_cvtps_ph(_mm512_maskz_loadu_ps(t, x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
}

/* 16 f32 lanes of e^(x - m) (each term <= 1), summed per lane, the lanes in double */
static double exp_sum_avx512(const float *x, int n, float m) {
    const __m512 vm = _mm512_set1_ps(m);
    __m512 acc = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) acc = _mm512_add_ps(acc, exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm)));
    if (i < n) {
        const __mmask16 t = tail_mask(n - i);
        acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(t, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(t, x + i), vm))));
    }
    float lanes[16];
    _mm512_storeu_ps(lanes, acc);
    double sum = 0.0;
    for (int k = 0; k < 16; k++) sum += lanes[k];
    return sum;
}

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

const struct cpu_ops cpu_ops_avx512 = {attn_tokens_avx512, gdn_head_avx512, gdn_chunked_head_avx512,
                                       silu_avx512, sigmoid_avx512, conv4_token_avx512,
                                       sum_sq_avx512, to_f16_avx512, exp_sum_avx512, argmax_avx512};
