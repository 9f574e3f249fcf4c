/* test_draft_depth.c — the draft depth policy (draft_depth.h) on records and costs made up to
 * have a known best answer, and in the driver on a model whose drafts are never accepted. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "backend.h"
#include "draft_depth.h"
#include "model.h"
#include "spec.h"

/* Costs with plain decoding at 100 us, each verify row `row` us more, a drafted token `draft`. */
static void costs_make(struct depth_costs *c, struct depth_mean *draft_us, double row, double draft) {
    memset(c, 0, sizeof *c);
    for (int r = 1; r <= SPEC_MAX_DRAFT + 1; r++) c->verify[r - 1] = (struct depth_mean){100.0 + row * (r - 1), 8, 0};
    *draft_us = (struct depth_mean){draft, 8, 0};
}

/* n cycles of depth `asked`, each accepting `accepted` of its drafts */
static void record_cycles(struct depth_seq *q, int n, int asked, int accepted) {
    for (int i = 0; i < n; i++) depth_seq_record(q, NULL, asked, asked, asked, accepted);
}

/* A CPU's costs and a request whose drafts were never accepted. */
static void losing_seq(struct depth_costs *c, struct depth_mean *d, struct depth_seq *q) {
    costs_make(c, d, 30.0, 20.0);
    depth_seq_start(q, NULL, NULL);
    record_cycles(q, 8, 2, 0);
}

Test(draft_depth, a_mean_forgets_past_its_window_and_its_count_stops_there) {
    struct depth_mean m = {0};
    for (int i = 0; i < 100; i++) depth_mean_add(&m, 1.0, 8);
    cr_assert_float_eq(m.v, 1.0, 1e-12);
    for (int i = 0; i < 100; i++) depth_mean_add(&m, 0.0, 8);
    cr_assert_lt(m.v, 1e-5, "after 100 zeros the mean is %g", m.v);
    cr_assert_eq(m.n, 8, "the count stops at the window");
}

/* A cost passes over its first samples (on a GPU a shape's first forward runs op by op, its
 * second records a graph) and counts a spike far above its mean at a capped size. */
Test(draft_depth, a_cost_passes_over_cold_samples_and_caps_spikes) {
    struct depth_mean m = {0};
    depth_cost_add(&m, 5000.0);
    depth_cost_add(&m, 3000.0);
    cr_assert_eq(m.n, 0, "the first two samples are passed over");
    for (int i = 0; i < 8; i++) depth_cost_add(&m, 300.0);
    cr_assert_float_eq(m.v, 300.0, 1e-9);
    depth_cost_add(&m, 3000.0);
    cr_assert_float_eq(m.v, 300.0 + (450.0 - 300.0) / 9, 1e-9, "a spike counts as 1.5x the mean: %g", m.v);
    for (int i = 0; i < 60; i++) depth_cost_add(&m, 900.0);
    cr_assert_gt(m.v, 850.0, "a lasting rise is followed (capped steps): %g", m.v);
}

Test(draft_depth, cheap_rows_and_good_drafts_go_deep) {
    struct depth_costs c;
    struct depth_mean d;
    costs_make(&c, &d, 2.0, 3.0); /* a GPU: a verify row and a draft cost a few percent */
    struct depth_seq q;
    depth_seq_start(&q, NULL, NULL);
    record_cycles(&q, 40, 4, 4);
    cr_assert_eq(depth_next(&q, &c, &d, 0, 4), 4);
    cr_assert(!depth_drafts_useless(&q.rec));
}

Test(draft_depth, dear_rows_keep_drafts_shallow) {
    struct depth_costs c;
    struct depth_mean d;
    costs_make(&c, &d, 30.0, 20.0); /* a small model on a CPU: rows cost compute */
    struct depth_seq q;
    depth_seq_start(&q, NULL, NULL);
    /* the first draft almost always accepted, the second half the time, the third rarely */
    for (int i = 0; i < 40; i++) depth_seq_record(&q, NULL, 3, 3, 3, i % 10 == 0 ? 0 : i % 2 ? 1 : i % 8 == 0 ? 3 : 2);
    const int got = depth_next(&q, &c, &d, 0, 3);
    double best = 0;
    int want = 0;
    for (int k = 0; k <= 3; k++) {
        const double r = depth_rate(&q.rec, &c, &d, k);
        if (r > best) { best = r; want = k; }
    }
    cr_assert(want >= 1 && want < 3, "the made-up costs should favour a middle depth, got %d", want);
    cr_assert_eq(got, want);
}

Test(draft_depth, drafts_that_never_pay_are_paused_then_probed) {
    struct depth_costs c;
    struct depth_mean d;
    struct depth_seq q;
    losing_seq(&c, &d, &q);
    cr_assert_eq(depth_next(&q, &c, &d, 0, 3), 0, "nothing accepted: plain decoding");
    cr_assert(depth_drafts_useless(&q.rec), "a drafter never accepted may stop following the sequence");
    const int first_pause = q.pause.len;
    cr_assert_gt(first_pause, 1);
    for (int i = 1; i < first_pause; i++) cr_assert_eq(depth_next(&q, &c, &d, 0, 3), 0, "cycle %d of the pause drafted", i);
    /* then probes, which draft whatever the record says */
    int probes = 0;
    for (int d0; (d0 = depth_next(&q, &c, &d, 0, 3)) > 0; probes++) record_cycles(&q, 1, d0, 0);
    cr_assert_gt(probes, 0, "the pause ended without a probe");
    cr_assert_gt(q.pause.len, first_pause, "a failed probe must lengthen the next pause");
    /* a new request of the kind takes the pause over instead of probing again at once */
    struct depth_seq q2;
    depth_seq_start(&q2, &q.rec, &q.pause);
    cr_assert_eq(depth_next(&q2, &c, &d, 0, 3), 0);
}

Test(draft_depth, n_min_is_kept_and_unmeasured_plain_cost_comes_first) {
    struct depth_costs c;
    struct depth_mean d;
    struct depth_seq q;
    losing_seq(&c, &d, &q);
    cr_assert_eq(depth_next(&q, &c, &d, 2, 3), 2, "n_min drafts are asked for even when they do not pay");
    struct depth_costs cold = {0};
    struct depth_mean none = {0};
    depth_seq_start(&q, NULL, NULL);
    cr_assert_eq(depth_next(&q, &cold, &none, 0, 3), 0, "without plain decoding's cost there is nothing to compare");
    depth_mean_add(&cold.verify[0], 100.0, 16);
    cr_assert_eq(depth_next(&q, &cold, &none, 0, 3), 3, "unmeasured rows and drafts are taken as free, so they get measured");
}

Test(draft_depth, a_deep_position_needs_samples_before_it_counts) {
    struct depth_costs c;
    struct depth_mean d;
    costs_make(&c, &d, 2.0, 3.0);
    struct depth_seq q;
    depth_seq_start(&q, NULL, NULL);
    depth_seq_record(&q, NULL, 3, 3, 3, 0); /* one bad early cycle, then only the first draft asked */
    record_cycles(&q, 40, 1, 1);
    cr_assert_eq(depth_next(&q, &c, &d, 0, 3), 3, "one early miss at the deep positions must not keep the depth at 1");
}

/* The driver on a random model (its MTP head's drafts are never the target's tokens): the
 * output equals plain decoding and the drafts stop after a few cycles. */
Test(draft_depth, random_model_stops_drafting, .timeout = 120) {
    char path[128], cmd[256], err[512];
    snprintf(path, sizeof path, "/tmp/coti-test-depth-%d.gguf", (int)getpid());
    snprintf(cmd, sizeof cmd, "./coti mkmodel --arch qwen35 -o %s --seed 5 > /dev/null 2>&1", path);
    cr_assert_eq(system(cmd), 0, "mkmodel failed: %s", cmd);
    struct backend *be = backend_cpu_init(1, quant_cpu_level_detect());
    struct model *m;
    struct model_params mp = {1, 1024, 128, SPEC_MAX_DRAFT + 1, NULL, GGML_TYPE_F16, GGML_TYPE_F16, 0, 0};
    cr_assert_eq(model_load(&m, path, be, &mp, err, sizeof err), 0, "%s", err);
    struct spec_engine *e;
    cr_assert_eq(spec_engine_init(&e, m, NULL, err, sizeof err), 0, "%s", err);
    const int32_t prompt[] = {5, 17, 99, 3, 250, 41};
    const struct sampler_params sp = sampler_params_basic(0.0f, 0, 1.0f, 0.0f, 1);
    enum { N = 300 };
    int32_t ref[N], got[N];
    for (int run = 0; run < 2; run++) {
        struct spec_params p = spec_params_default();
        if (run) p.drafter = &drafter_kind_mtp;
        int32_t *out = run ? got : ref;
        cr_assert_eq(spec_seq_begin(e, 0, prompt, 6, &sp, &p, &out[0], err, sizeof err), 0, "%s", err);
        for (int k = 1, nb; k < N; k += nb)
            cr_assert_eq(spec_seq_step(e, 0, N - k, out + k, &nb, NULL, err, sizeof err), 0, "%s", err);
    }
    for (int k = 0; k < N; k++) cr_assert_eq(got[k], ref[k], "token %d differs from plain decoding", k);
    const struct spec_stats *st = spec_seq_stats(e, 0);
    cr_assert_lt(st->n_accepted * 10, st->n_drafted + 10, "the random head's drafts were accepted: the test shows nothing");
    cr_assert_lt(st->n_drafted, N / 5, "%ld drafts over %d tokens: the policy kept drafting for nothing", st->n_drafted, N);
    spec_engine_free(e);
    model_free(m);
    backend_free(be);
    remove(path);
}
