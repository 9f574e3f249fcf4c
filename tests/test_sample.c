/* test_sample.c — samplers: greedy ties, seeded reproducibility, the temperature -> 0 limit,
 * top_k = 1 == greedy, the top_p/min_p sets, and the empirical distribution of the draw
 * against softmax by a chi-square test; speculative rejection sampling reproduces the target
 * distribution (and a wrong rule is caught by the same statistic). Expected values are computed here from the
 * definitions (softmax by hand), never by the sampler under test. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "sample.h"

/* Chi-square critical value for 5 degrees of freedom at upper-tail probability 1e-6
 * (computed from the regularized upper incomplete gamma function Q(5/2, x/2) = 1e-6):
 * a correct sampler fails the test with probability ~1e-6 per seed. */
#define CHI2_DF5_P1E6 35.888

static struct sampler *make(float temp, int32_t top_k, float top_p, float min_p, uint64_t seed, int n_vocab) {
    struct sampler_params p = sampler_params_basic(temp, top_k, top_p, min_p, seed);
    struct sampler *s = NULL;
    char err[256] = "";
    cr_assert_eq(sampler_init(&s, &p, n_vocab, err, sizeof err), 0, "%s", err);
    return s;
}

static void softmax_ref(const float *l, int n, double temp, double *p) {
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < n; i++) mx = fmax(mx, l[i]);
    for (int i = 0; i < n; i++) sum += p[i] = exp((l[i] - mx) / temp);
    for (int i = 0; i < n; i++) p[i] /= sum;
}

static double chi2(const int *obs, const double *p, int n, int draws) {
    double x = 0;
    for (int i = 0; i < n; i++) {
        double e = p[i] * draws;
        x += (obs[i] - e) * (obs[i] - e) / e;
    }
    return x;
}

static uint64_t lcg(uint64_t *x) {
    *x = *x * 6364136223846793005ull + 1442695040888963407ull;
    return *x >> 33;
}

Test(sample, argmax_ties_lowest_id) {
    const float l[] = {1.0f, 3.0f, 3.0f, 2.0f, 3.0f};
    cr_assert_eq(sample_argmax(l, 5), 1);
    const float nan_first[] = {NAN, -1.0f, 5.0f, 5.0f};
    cr_assert_eq(sample_argmax(nan_first, 4), 2);
    const float all_ninf[] = {-INFINITY, -INFINITY};
    cr_assert_eq(sample_argmax(all_ninf, 2), 0);
    cr_assert_eq(sample_argmax(l, 0), -1);

    struct sampler *s = make(0.0f, 40, 0.95f, 0.05f, 1, 5);
    for (int i = 0; i < 10; i++) cr_assert_eq(sampler_sample(s, l, NULL, 0), 1);
    const struct sampler_cand *c;
    size_t n;
    sampler_probs(s, l, NULL, 0, &c, &n);
    cr_assert_eq(n, 1);
    cr_assert_eq(c[0].id, 1);
    cr_assert_float_eq(c[0].p, 1.0f, 0.0f);
    sampler_free(s);
}

Test(sample, init_rejects_bad_params) {
    struct sampler_params p = sampler_params_default(1);
    struct sampler *s = (struct sampler *)1;
    char err[256] = "";
    cr_assert_eq(sampler_init(&s, &p, 0, err, sizeof err), COTI_E_ARG);
    cr_assert_null(s);
    p.top_p = NAN;
    cr_assert_eq(sampler_init(&s, &p, 10, err, sizeof err), COTI_E_ARG);
    cr_assert(strstr(err, "NaN") != NULL);
}

Test(sample, seed_reproducible) {
    enum { V = 64, N = 2000 };
    float l[V];
    uint64_t x = 7;
    for (int i = 0; i < V; i++) l[i] = (float)(lcg(&x) % 1000) / 250.0f;
    struct sampler *a = make(1.0f, 0, 1.0f, 0.0f, 42, V);
    struct sampler *b = make(1.0f, 0, 1.0f, 0.0f, 42, V);
    struct sampler *c = make(1.0f, 0, 1.0f, 0.0f, 43, V);
    int32_t first[N];
    int diff = 0;
    for (int i = 0; i < N; i++) {
        first[i] = sampler_sample(a, l, NULL, 0);
        cr_assert_eq(first[i], sampler_sample(b, l, NULL, 0));
        diff += first[i] != sampler_sample(c, l, NULL, 0);
    }
    cr_assert_gt(diff, N / 4, "another seed should give another sequence (%d of %d differ)", diff, N);
    /* reset restarts the stream */
    struct sampler_params p = sampler_params_basic(1.0f, 0, 1.0f, 0.0f, 42);
    cr_assert_eq(sampler_reset(a, &p, NULL, 0), 0);
    for (int i = 0; i < N; i++) cr_assert_eq(sampler_sample(a, l, NULL, 0), first[i]);
    sampler_free(a);
    sampler_free(b);
    sampler_free(c);
}

Test(sample, temperature_to_zero_is_argmax) {
    enum { V = 200 };
    float l[V];
    uint64_t x = 11;
    for (int i = 0; i < V; i++) l[i] = (float)(lcg(&x) % 100000) / 10000.0f;
    const int32_t am = sample_argmax(l, V);
    /* the gap to the runner-up is >= 1e-4; at temp 1e-6 its odds are e^-100 */
    struct sampler *s = make(1e-6f, 0, 1.0f, 0.0f, 5, V);
    for (int i = 0; i < 500; i++) cr_assert_eq(sampler_sample(s, l, NULL, 0), am);
    /* an extreme temperature overflows logit/temp to inf; still the argmax, never NaN */
    struct sampler *t = make(1e-38f, 0, 1.0f, 0.0f, 5, V);
    for (int i = 0; i < 50; i++) cr_assert_eq(sampler_sample(t, l, NULL, 0), am);
    sampler_free(s);
    sampler_free(t);
}

Test(sample, top_k_1_is_greedy) {
    enum { V = 300 };
    float l[V];
    uint64_t x = 3;
    struct sampler *s = make(1.5f, 1, 0.95f, 0.05f, 9, V);
    for (int round = 0; round < 50; round++) {
        for (int i = 0; i < V; i++) l[i] = (float)(lcg(&x) % 64) / 8.0f; /* many ties */
        cr_assert_eq(sampler_sample(s, l, NULL, 0), sample_argmax(l, V));
    }
    sampler_free(s);
}

Test(sample, top_p_and_min_p_sets) {
    /* softmax of {3, 2, 1, 0, -1} = .6364 .2341 .0861 .0317 .0117 */
    const float l[] = {1.0f, 3.0f, -1.0f, 2.0f, 0.0f};
    const struct sampler_cand *c;
    size_t n;

    struct sampler *s = make(1.0f, 0, 0.85f, 0.0f, 1, 5);
    sampler_probs(s, l, NULL, 0, &c, &n);
    cr_assert_eq(n, 2); /* .6364 + .2341 = .8705 >= .85 */
    cr_assert_eq(c[0].id, 1);
    cr_assert_eq(c[1].id, 3);
    cr_assert_float_eq(c[0].p, 0.6364 / 0.8705, 1e-3);
    cr_assert_float_eq(c[0].p + c[1].p, 1.0f, 1e-6);
    sampler_free(s);

    /* min_p 0.1: keep p >= 0.1 * .6364, i.e. logits >= 3 + ln 0.1 = 0.697: ids 1, 3, 0 */
    s = make(1.0f, 0, 1.0f, 0.1f, 1, 5);
    sampler_probs(s, l, NULL, 0, &c, &n);
    cr_assert_eq(n, 3);
    int seen = 0;
    for (size_t i = 0; i < n; i++) seen |= 1 << c[i].id;
    cr_assert_eq(seen, (1 << 0) | (1 << 1) | (1 << 3));
    sampler_free(s);

    /* top_k 4 then temperature 2: p over {3, 2, 1, 0} / 2 */
    s = make(2.0f, 4, 1.0f, 0.0f, 1, 5);
    sampler_probs(s, l, NULL, 0, &c, &n);
    cr_assert_eq(n, 4);
    const float kept[4] = {3.0f, 2.0f, 1.0f, 0.0f};
    double ref[4];
    softmax_ref(kept, 4, 2.0, ref);
    for (int i = 0; i < 4; i++) cr_assert_float_eq(c[i].p, ref[i], 1e-6);
    sampler_free(s);
}

Test(sample, large_vocab_top_p_partial_sort) {
    /* > 1024 candidates with a flat tail: the nucleus is wider than the 256-wide partial
     * sort, so the full-sort fallback must kick in and the result stay sorted */
    enum { V = 5000 };
    static float l[V];
    for (int i = 0; i < V; i++) l[i] = (float)((i * 7919) % V) / (float)V; /* a permutation of [0,1) */
    struct sampler *s = make(1.0f, 0, 0.9f, 0.0f, 1, V);
    const struct sampler_cand *c;
    size_t n;
    sampler_probs(s, l, NULL, 0, &c, &n);
    cr_assert_gt(n, 256);
    cr_assert_lt(n, V);
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        sum += c[i].p;
        if (i) cr_assert_geq(c[i - 1].logit, c[i].logit);
    }
    cr_assert_float_eq(sum, 1.0, 1e-4);
    sampler_free(s);
}

Test(sample, non_finite_logits) {
    const float l[] = {NAN, 1.0f, INFINITY, 0.0f, INFINITY};
    struct sampler *s = make(1.0f, 0, 1.0f, 0.0f, 3, 5);
    int hits[5] = {0};
    for (int i = 0; i < 200; i++) hits[sampler_sample(s, l, NULL, 0)]++;
    cr_assert_eq(hits[0] + hits[1] + hits[3], 0);
    cr_assert_gt(hits[2], 0);
    cr_assert_gt(hits[4], 0);
    const float none[] = {-INFINITY, NAN, -INFINITY};
    struct sampler *t = make(0.7f, 40, 0.95f, 0.05f, 3, 3);
    for (int i = 0; i < 20; i++) {
        int32_t id = sampler_sample(t, none, NULL, 0);
        cr_assert(id >= 0 && id < 3);
    }
    sampler_free(s);
    sampler_free(t);
}

/* Draw 20000 tokens at temperature 1 with every filter off; compare with softmax. */
Test(sample, empirical_distribution_chi_square) {
    enum { V = 6, DRAWS = 20000 };
    const float l[V] = {0.5f, 2.0f, -3.0f, 1.0f, 0.0f, -1.0f};
    double p[V], wrong[V];
    softmax_ref(l, V, 1.0, p);
    softmax_ref(l, V, 1.2, wrong); /* a sampler that forgot the temperature would look like this */
    struct sampler *s = make(1.0f, 0, 1.0f, 0.0f, 20240601, V);
    int obs[V] = {0};
    for (int i = 0; i < DRAWS; i++) obs[sampler_sample(s, l, NULL, 0)]++;
    const double x_ok = chi2(obs, p, V, DRAWS);
    const double x_wrong = chi2(obs, wrong, V, DRAWS);
    cr_assert_lt(x_ok, CHI2_DF5_P1E6, "chi2 vs softmax = %.2f", x_ok);
    cr_assert_gt(x_wrong, CHI2_DF5_P1E6, "chi2 vs a wrong distribution = %.2f: the test has no power", x_wrong);
    sampler_free(s);
}

/* The same with the default chain (top_k 40, top_p .95, min_p .05, temp .8) on a vocab
 * where every filter is inert except top_p, whose cut is computed here. */
Test(sample, default_chain_distribution) {
    enum { V = 6, DRAWS = 20000 };
    const float l[V] = {0.5f, 2.0f, -4.0f, 1.0f, 0.0f, -1.0f};
    /* softmax(l) sorted: 2.0 .5622, 1.0 .2068, .5 .1255, 0 .0761, -1 .0280, -4 .0014;
     * cumulative reaches .95 at the 4th (.9706): top_p keeps ids {1, 3, 0, 4};
     * min_p .05 keeps logits >= 2 + ln .05 = -0.996: all four survive */
    const float kept[4] = {2.0f, 1.0f, 0.5f, 0.0f};
    const int kept_id[4] = {1, 3, 0, 4};
    double p4[4];
    softmax_ref(kept, 4, 0.8, p4);
    struct sampler_params prm = sampler_params_default(77);
    struct sampler *s = NULL;
    cr_assert_eq(sampler_init(&s, &prm, V, NULL, 0), 0);
    int obs[V] = {0};
    for (int i = 0; i < DRAWS; i++) obs[sampler_sample(s, l, NULL, 0)]++;
    cr_assert_eq(obs[2] + obs[5], 0);
    int o4[4];
    for (int i = 0; i < 4; i++) o4[i] = obs[kept_id[i]];
    /* 3 degrees of freedom: the df=5 bound is looser still (p << 1e-6) */
    const double x = chi2(o4, p4, 4, DRAWS);
    cr_assert_lt(x, CHI2_DF5_P1E6, "chi2 = %.2f", x);

    const struct sampler_cand *c;
    size_t n;
    sampler_probs(s, l, NULL, 0, &c, &n);
    cr_assert_eq(n, 4);
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(c[i].id, kept_id[i]);
        cr_assert_float_eq(c[i].p, p4[i], 1e-6);
    }
    sampler_free(s);
}

Test(sample, uniform_stream_and_draw) {
    struct sampler *s = make(1.0f, 0, 1.0f, 0.0f, 99, 4);
    double sum = 0, lo = 1, hi = 0;
    for (int i = 0; i < 100000; i++) {
        double u = sampler_next_uniform(s);
        cr_assert(u >= 0.0 && u < 1.0);
        sum += u;
        lo = fmin(lo, u);
        hi = fmax(hi, u);
    }
    /* mean of 1e5 uniforms: sd 0.00091, so +-0.005 is > 5 sigma */
    cr_assert_float_eq(sum / 100000, 0.5, 0.005);
    cr_assert_lt(lo, 1e-3);
    cr_assert_gt(hi, 1 - 1e-3);
    /* a distribution with zero-mass entries never yields them */
    const struct sampler_cand c[3] = {{.id = 7, .p = 0.0f}, {.id = 8, .p = 1.0f}, {.id = 9, .p = 0.0f}};
    for (int i = 0; i < 1000; i++) cr_assert_eq(sampler_draw(s, c, 3), 8);
    cr_assert_eq(sampler_draw(s, c, 0), -1);
    sampler_free(s);
}

/* ---- exact rejection sampling on a tiny vocabulary ---- */

#define RS_V 6
#define RS_TRIALS 60000

/* Draw d ~ q_true, run the rule with the q it is told; histogram of emitted tokens. */
static double run_rejection(const double *p, const double *q_true, const double *q_told) {
    struct sampler *smp;
    struct sampler_params sp = sampler_params_basic(1.0f, 0, 1.0f, 0.0f, 12345);
    char err[128];
    cr_assert_eq(sampler_init(&smp, &sp, RS_V, err, sizeof err), 0);
    struct sampler_cand pc[RS_V], qc[RS_V], qt[RS_V], resid[RS_V];
    for (int i = 0; i < RS_V; i++) {
        pc[i] = (struct sampler_cand){i, 0, (float)p[i]};
        qc[i] = (struct sampler_cand){i, 0, (float)q_told[i]};
        qt[i] = (struct sampler_cand){i, 0, (float)q_true[i]};
    }
    float qdense[RS_V] = {0};
    int count[RS_V] = {0};
    for (int n = 0; n < RS_TRIALS; n++) {
        int32_t d = sampler_draw(smp, qt, RS_V);
        int32_t r = sampler_rejection_step(smp, pc, RS_V, qc, RS_V, d, qdense, resid);
        count[r < 0 ? d : r]++;
    }
    for (int i = 0; i < RS_V; i++) cr_assert_eq(qdense[i], 0.0f, "scratch must be left zero");
    sampler_free(smp);
    return chi2(count, p, RS_V, RS_TRIALS);
}

Test(sample, rejection_sampling_reproduces_target_distribution) {
    const double p[RS_V] = {0.40, 0.25, 0.15, 0.10, 0.07, 0.03};
    const double q[RS_V] = {0.10, 0.30, 0.05, 0.35, 0.15, 0.05};
    double x = run_rejection(p, q, q);
    cr_assert_lt(x, CHI2_DF5_P1E6, "speculative samples deviate from the target: chi2 %.1f", x);
    /* a rule fed the wrong q (here: believing the draft is p itself) accepts every draft, so
     * the output follows q — the same statistic must reject it */
    double bad = run_rejection(p, q, p);
    cr_assert_gt(bad, CHI2_DF5_P1E6, "a wrong acceptance rule went unnoticed: chi2 %.1f", bad);
}
