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

/* ---- penalties and typical_p, against hand-computed values ---- */

static struct sampler *make_params(const struct sampler_params *p, int n_vocab) {
    struct sampler *s = NULL;
    char err[256] = "";
    cr_assert_eq(sampler_init(&s, p, n_vocab, err, sizeof err), 0, "%s", err);
    return s;
}

/* The chain's distribution at temperature 1 with nothing but the stage under test, as a dense
 * vector by id. */
static void probs_dense(struct sampler *s, const float *l, const int32_t *prev, int n_prev, double *out, int n_vocab) {
    const struct sampler_cand *c;
    size_t n;
    sampler_probs(s, l, prev, n_prev, &c, &n);
    for (int i = 0; i < n_vocab; i++) out[i] = 0;
    for (size_t i = 0; i < n; i++) out[c[i].id] = c[i].p;
}

Test(sample, penalties_hand_checked) {
    const float l[5] = {2.0f, -1.0f, 0.5f, 3.0f, 0.0f};
    /* the window of 4 is {0, 1, 1, 3}: counts 0:1, 1:2, 3:1; the first 0 is outside it, 7 and
     * -1 are not token ids of this vocabulary and count for nothing */
    const int32_t prev[7] = {0, 7, -1, 0, 1, 1, 3};
    struct sampler_params p = sampler_params_basic(1.0f, 0, 1.0f, 0.0f, 1);
    p.repeat_last_n = 4;
    struct {
        float repeat, freq, presence;
        float want[5];
    } cases[] = {
        /* repeat 2: positive logits halve, non-positive ones double */
        {2.0f, 0.0f, 0.0f, {1.0f, -2.0f, 0.5f, 1.5f, 0.0f}},
        /* frequency 0.5: minus 0.5 per occurrence */
        {1.0f, 0.5f, 0.0f, {1.5f, -2.0f, 0.5f, 2.5f, 0.0f}},
        /* presence 1: minus 1 once per token present */
        {1.0f, 0.0f, 1.0f, {1.0f, -2.0f, 0.5f, 2.0f, 0.0f}},
        /* all three: repeat first, then count * 0.5 + 1 */
        {2.0f, 0.5f, 1.0f, {-0.5f, -4.0f, 0.5f, 0.0f, 0.0f}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        p.repeat_penalty = cases[k].repeat;
        p.frequency_penalty = cases[k].freq;
        p.presence_penalty = cases[k].presence;
        struct sampler *s = make_params(&p, 5);
        double want[5], got[5];
        softmax_ref(cases[k].want, 5, 1.0, want);
        for (int rep = 0; rep < 2; rep++) { /* twice: the count scratch is left clean */
            probs_dense(s, l, prev, 7, got, 5);
            for (int i = 0; i < 5; i++) cr_assert_float_eq(got[i], want[i], 1e-6, "case %zu id %d: %g, want %g", k, i, got[i], want[i]);
        }
        sampler_free(s);
    }
    /* greedy: the argmax of the penalised logits (id 2 at 0.5), not of the raw ones (id 3) */
    p.temperature = 0.0f;
    struct sampler *g = make_params(&p, 5);
    cr_assert(!sampler_params_plain_argmax(&p));
    cr_assert_eq(sampler_sample(g, l, prev, 7), 2);
    cr_assert_eq(sampler_sample(g, l, prev, 0), 3, "no history, no penalty");
    sampler_free(g);
    /* repeat_last_n -1 reads the whole history (id 0 twice: 2/2 - (2*0.5 + 1) = -1), 0 none */
    p.temperature = 1.0f;
    p.repeat_last_n = -1;
    struct sampler *w = make_params(&p, 5);
    const float whole[5] = {-1.0f, -4.0f, 0.5f, 0.0f, 0.0f};
    double want[5], got[5];
    softmax_ref(whole, 5, 1.0, want);
    probs_dense(w, l, prev, 7, got, 5);
    for (int i = 0; i < 5; i++) cr_assert_float_eq(got[i], want[i], 1e-6, "whole history, id %d", i);
    sampler_free(w);
    p.repeat_last_n = 0;
    struct sampler *off = make_params(&p, 5);
    softmax_ref(l, 5, 1.0, want);
    probs_dense(off, l, prev, 7, got, 5);
    for (int i = 0; i < 5; i++) cr_assert_float_eq(got[i], want[i], 1e-6, "window 0 is off, id %d", i);
    sampler_free(off);
}

Test(sample, penalty_parameters_are_checked) {
    struct sampler_params p = sampler_params_basic(1.0f, 0, 1.0f, 0.0f, 1);
    struct sampler *s = NULL;
    char err[256];
    p.repeat_penalty = 0.0f;
    cr_assert_eq(sampler_init(&s, &p, 4, err, sizeof err), COTI_E_ARG);
    p.repeat_penalty = 1.0f;
    p.frequency_penalty = INFINITY;
    cr_assert_eq(sampler_init(&s, &p, 4, err, sizeof err), COTI_E_ARG);
    p.frequency_penalty = 0.0f;
    p.typical_p = NAN;
    cr_assert_eq(sampler_init(&s, &p, 4, err, sizeof err), COTI_E_ARG);
    cr_assert_null(s);
}

Test(sample, typical_hand_checked) {
    /* p = {1/2, 1/4, 1/8, 1/8}: entropy H = 1.75 ln 2, surprisal {1, 2, 3, 3} ln 2, so
     * |surprisal - H| = {0.75, 0.25, 1.25, 1.25} ln 2: the typical order is 1, 0, 2, 3 with
     * cumulative mass 1/4, 3/4, 7/8, 1 */
    const float l[4] = {logf(0.5f), logf(0.25f), logf(0.125f), logf(0.125f)};
    struct {
        float typical;
        int min_keep;
        double want[4];
    } cases[] = {
        {0.5f, 0, {2.0 / 3, 1.0 / 3, 0, 0}},                    /* 3/4 > 0.5 after two */
        {0.2f, 0, {0, 1, 0, 0}},                                 /* 1/4 > 0.2 at once */
        {0.8f, 0, {4.0 / 7, 2.0 / 7, 1.0 / 7, 0}},               /* 7/8 > 0.8 after three */
        {0.2f, 3, {4.0 / 7, 2.0 / 7, 1.0 / 7, 0}},               /* min_keep 3 */
        {0.75f, 0, {4.0 / 7, 2.0 / 7, 1.0 / 7, 0}},              /* strictly above p: 3/4 is not */
        {1.0f, 0, {0.5, 0.25, 0.125, 0.125}},                    /* 1 is off */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        struct sampler_params p = sampler_params_basic(1.0f, 0, 1.0f, 0.0f, 1);
        p.typical_p = cases[k].typical;
        p.min_keep = cases[k].min_keep;
        struct sampler *s = make_params(&p, 4);
        double got[4];
        probs_dense(s, l, NULL, 0, got, 4);
        for (int i = 0; i < 4; i++)
            cr_assert_float_eq(got[i], cases[k].want[i], 1e-6, "typical_p %g min_keep %d id %d: %g, want %g", cases[k].typical,
                               cases[k].min_keep, i, got[i], cases[k].want[i]);
        sampler_free(s);
    }
    /* greedy picks the best of the typical set: id 1 at typical_p 0.2, although id 0 is the argmax */
    struct sampler_params g = sampler_params_basic(0.0f, 0, 1.0f, 0.0f, 1);
    g.typical_p = 0.2f;
    cr_assert(!sampler_params_plain_argmax(&g));
    struct sampler *s = make_params(&g, 4);
    cr_assert_eq(sampler_sample(s, l, NULL, 0), 1);
    g.typical_p = 0.5f;
    cr_assert_eq(sampler_reset(s, &g, NULL, 0), 0);
    cr_assert_eq(sampler_sample(s, l, NULL, 0), 0);
    sampler_free(s);
}

/* Exact rejection sampling stays exact under penalties: the draft comes from an unpenalised q
 * (a drafter that knows nothing of them), the target's p is the penalised chain's, and the
 * emitted tokens follow the penalised distribution computed here by hand — not the raw one. */
Test(sample, rejection_sampling_exact_with_penalties) {
    const float l[RS_V] = {1.5f, 1.0f, 0.5f, 0.0f, -0.5f, 0.8f};
    const int32_t prev[4] = {0, 0, 5, 1};
    struct sampler_params tp = sampler_params_basic(1.0f, 0, 1.0f, 0.0f, 12345);
    tp.repeat_penalty = 1.5f;
    tp.frequency_penalty = 0.4f;
    tp.presence_penalty = 0.3f;
    /* by hand: id 0 (count 2) 1.5/1.5 - (0.8 + 0.3) = -0.1; id 1 (1) 1/1.5 - 0.7; id 5 (1) 0.8/1.5 - 0.7 */
    const float pen[RS_V] = {-0.1f, 1.0f / 1.5f - 0.7f, 0.5f, 0.0f, -0.5f, 0.8f / 1.5f - 0.7f};
    double p_want[RS_V], p_raw[RS_V], q[RS_V];
    softmax_ref(pen, RS_V, 1.0, p_want);
    softmax_ref(l, RS_V, 1.0, p_raw);
    const float ql[RS_V] = {2.0f, 0.2f, 0.0f, 0.6f, 0.1f, 1.2f};
    softmax_ref(ql, RS_V, 1.0, q);
    struct sampler *smp = make_params(&tp, RS_V);
    const struct sampler_cand *pc;
    size_t pn;
    sampler_probs(smp, l, prev, 4, &pc, &pn);
    cr_assert_eq(pn, RS_V);
    struct sampler_cand pcopy[RS_V], qc[RS_V], resid[RS_V];
    memcpy(pcopy, pc, sizeof pcopy);
    for (int i = 0; i < RS_V; i++) qc[i] = (struct sampler_cand){i, 0, (float)q[i]};
    float qdense[RS_V] = {0};
    int count[RS_V] = {0};
    for (int n = 0; n < RS_TRIALS; n++) {
        int32_t d = sampler_draw(smp, qc, RS_V);
        int32_t r = sampler_rejection_step(smp, pcopy, RS_V, qc, RS_V, d, qdense, resid);
        count[r < 0 ? d : r]++;
    }
    sampler_free(smp);
    const double x = chi2(count, p_want, RS_V, RS_TRIALS);
    cr_assert_lt(x, CHI2_DF5_P1E6, "emitted tokens deviate from the penalised target: chi2 %.1f", x);
    const double raw = chi2(count, p_raw, RS_V, RS_TRIALS);
    cr_assert_gt(raw, CHI2_DF5_P1E6, "the penalties made no measurable difference: chi2 against raw %.1f", raw);
}

Test(sample, logit_bias_moves_and_bans) {
    float row[8] = {0.5f, 3.0f, 1.0f, 2.9f, -1.0f, 0.0f, 0.2f, 2.0f};
    char err[128];
    struct logit_bias ban = {1, -INFINITY}, lift = {4, 10.0f};
    struct sampler_params p = sampler_params_basic(0.0f, 40, 0.95f, 0.05f, 1);
    cr_assert(sampler_params_plain_argmax(&p));
    struct sampler *s;
    p.bias = &ban;
    p.n_bias = 1;
    cr_assert_not(sampler_params_plain_argmax(&p), "a bias can move the argmax");
    cr_assert_eq(sampler_init(&s, &p, 8, err, sizeof err), 0, "%s", err);
    cr_assert_eq(sampler_sample(s, row, NULL, 0), 3, "the banned best gives way to the next");
    struct logit_bias both[2] = {ban, lift};
    p.bias = both;
    p.n_bias = 2;
    cr_assert_eq(sampler_reset(s, &p, err, sizeof err), 0, "%s", err);
    both[1].id = 0; /* the sampler keeps its own copy */
    cr_assert_eq(sampler_sample(s, row, NULL, 0), 4, "a large bias forces its token");
    /* sampled: a banned token is never drawn */
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.bias = &ban;
    p.n_bias = 1;
    cr_assert_eq(sampler_reset(s, &p, err, sizeof err), 0, "%s", err);
    for (int i = 0; i < 2000; i++) cr_assert_neq(sampler_sample(s, row, NULL, 0), 1);
    struct logit_bias bad = {8, 1.0f};
    p.bias = &bad;
    cr_assert_eq(sampler_reset(s, &p, err, sizeof err), COTI_E_ARG, "an id outside the vocabulary");
    bad = (struct logit_bias){2, NAN};
    cr_assert_eq(sampler_reset(s, &p, err, sizeof err), COTI_E_ARG, "a NaN bias");
    sampler_free(s);
}
