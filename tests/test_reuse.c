/* test_reuse.c — prefix reuse across requests and sequences (spec_seq_reusable /
 * spec_seq_begin_reuse over memory.h's checkpoints): a sequence that takes another's prefix, its
 * own checkpoint, or an identical prompt's, generates exactly what a cold start generates, with
 * MTP, n-gram and no speculation, and takes as many tokens as the checkpoints allow. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "spec.h"
#include "tokenizer.h"

#define MODEL_PATH "models/coti-tiny-qwen35-mtp-q8_0.gguf"
#define N_GEN 16

static struct backend *be;
static struct model *m;
static struct spec_engine *eng;
static struct tokenizer *tok;
/* The recurrent state sequence s holds after its prompt, per run (index = sequence). A wrong
 * state hardly shows in the tiny model's greedy text (its attention sees the whole prompt), so
 * the states are compared too. */
static float *state[3];

static void setup(void) {
    char err[512];
    be = backend_cpu_init(1, quant_cpu_level_detect());
    struct model_params p = {3, 512, 32, SPEC_MAX_DRAFT + 1, NULL, GGML_TYPE_F16, GGML_TYPE_F16, 0, 0};
    cr_assert_eq(model_load(&m, MODEL_PATH, be, &p, err, sizeof err), 0, "%s", err);
    cr_assert_eq(tokenizer_init(&tok, m->gguf, err, sizeof err), 0, "%s", err);
    cr_assert_eq(spec_engine_init(&eng, m, NULL, err, sizeof err), 0, "%s", err);
}

static void teardown(void) {
    for (int i = 0; i < 3; i++) { free(state[i]); state[i] = NULL; }
    spec_engine_free(eng);
    tokenizer_free(tok);
    model_free(m);
    backend_free(be);
}

static int encode(const char *text, int32_t *out, int cap) {
    int32_t *ids = NULL;
    size_t n = 0;
    char err[256];
    cr_assert_eq(tokenizer_encode(tok, text, strlen(text), false, false, &ids, &n, err, sizeof err), 0, "%s", err);
    cr_assert((int)n <= cap);
    memcpy(out, ids, sizeof(int32_t) * n);
    free(ids);
    return (int)n;
}


/* Largest |a - b| over the two sequences' states, relative to the largest |b|. */
static double state_diff(int a, int b) {
    const long n = m->vt->seq_state_read(m, 0, NULL, 0);
    double d = 0, mx = 0;
    for (long i = 0; i < n; i++) {
        d = fmax(d, fabs((double)state[a][i] - state[b][i]));
        mx = fmax(mx, fabs((double)state[b][i]));
    }
    return d / mx;
}

/* Start sequence s on prompt taking n_reuse tokens from src (checkpoint at mark when > 0), keep
 * its state, then generate N_GEN tokens greedily; returns what it took. */
static int run(int s, int src, int n_reuse, const int32_t *prompt, int n, int mark, const struct drafter_kind *k,
               int32_t *out) {
    char err[512];
    const struct sampler_params sp = sampler_params_default(1);
    struct sampler_params greedy = sp;
    greedy.temperature = 0.0f;
    struct spec_params p = spec_params_default();
    p.drafter = k;
    int32_t first;
    int cached = -1;
    cr_assert_eq(spec_seq_begin_reuse(eng, s, src, n_reuse, prompt, n, &mark, mark > 0, &greedy, &p, &first, &cached, err,
                                      sizeof err),
                 0, "%s", err);
    const long n_state = m->vt->seq_state_read(m, s, NULL, 0);
    if (!state[s]) state[s] = malloc(sizeof(float) * (size_t)n_state);
    cr_assert_eq(m->vt->seq_state_read(m, s, state[s], (size_t)n_state), n_state);
    out[0] = first;
    int32_t buf[SPEC_MAX_DRAFT + 1];
    for (int g = 1, nb; g < N_GEN; g += nb) {
        cr_assert_eq(spec_seq_step(eng, s, N_GEN - g, buf, &nb, NULL, err, sizeof err), 0, "%s", err);
        memcpy(out + g, buf, sizeof(int32_t) * (size_t)nb);
    }
    return cached;
}

static void check_kind(const struct drafter_kind *k) {
    int32_t a[256], b[256];
    const int head = encode("<|im_start|>system\nYou write C. Keep answers short and exact.<|im_end|>\n", a, 256);
    int na = head + encode("<|im_start|>user\nA function that adds two ints<|im_end|>\n<|im_start|>assistant\n", a + head, 256 - head);
    memcpy(b, a, sizeof(int32_t) * (size_t)head);
    int nb = head + encode("<|im_start|>user\nA loop over an array<|im_end|>\n<|im_start|>assistant\n", b + head, 256 - head);
    int32_t out_a[N_GEN], out_b[N_GEN], cold[N_GEN];

    /* sequence 0 holds prompt a (checkpoints where the user turn starts and before its last token) */
    cr_assert_eq(run(0, 0, 0, a, na, head, k, out_a), 0);
    /* sequence 1 takes the shared system turn from sequence 0 */
    const int r = spec_seq_reusable(eng, 1, 0, b, nb, k);
    cr_assert_eq(r, head, "reusable %d, want the system turn's %d tokens", r, head);
    cr_assert_eq(run(1, 0, r, b, nb, head, k, out_b), head);
    cr_assert_eq(run(2, 2, 0, b, nb, 0, k, cold), 0);
    cr_assert_arr_eq(out_b, cold, sizeof cold, "taken from another sequence: not what a cold start generates");
    /* the same state up to the prefill's split (reduction order) */
    cr_assert_lt(state_diff(1, 2), 1e-4, "state after a reused prefix differs by %g", state_diff(1, 2));

    /* the identical prompt a again, on sequence 2: only its last token runs */
    cr_assert_eq(spec_seq_reusable(eng, 2, 0, a, na, k), na - 1);
    cr_assert_eq(run(2, 0, na - 1, a, na, 0, k, cold), na - 1);
    cr_assert_arr_eq(cold, out_a, sizeof cold, "an identical prompt resumed: not the same text");
    cr_assert_lt(state_diff(2, 0), 1e-4, "state after an identical prompt differs by %g", state_diff(2, 0));

    /* sequence 0 goes back to its own checkpoint for prompt b */
    cr_assert_eq(spec_seq_reusable(eng, 0, 0, b, nb, k), head);
    cr_assert_eq(run(0, 0, head, b, nb, 0, k, out_a), head);
    cr_assert_arr_eq(out_a, out_b, sizeof cold, "resumed from its own checkpoint: not the same text");
    cr_assert_lt(state_diff(0, 1), 1e-4, "state after its own checkpoint differs by %g", state_diff(0, 1));

    /* a stale promise (sequence 1 was overwritten meanwhile) falls back to a full prefill */
    int32_t other[8];
    const int no = encode("int x;", other, 8);
    cr_assert_eq(run(1, 1, 0, other, no, 0, k, cold), 0);
    cr_assert_eq(run(2, 1, head, b, nb, 0, k, cold), 0);
    cr_assert_arr_eq(cold, out_b, sizeof cold);
}

TestSuite(reuse, .init = setup, .fini = teardown, .timeout = 120);

Test(reuse, mtp) { check_kind(&drafter_kind_mtp); }
Test(reuse, ngram) { check_kind(&drafter_kind_ngram); }
Test(reuse, off) { check_kind(NULL); }

Test(reuse, mtp_takes_a_state_its_head_did_not_follow) {
    /* a sequence that ran without MTP has no head cells: MTP takes its state all the same, the
     * head's cells stale (a paused drafter's are too: memory_head_skip), and the tokens are the
     * cold run's: the drafts are proposals */
    int32_t a[128], out[N_GEN], cold[N_GEN];
    const int na = encode("static int add(int a, int b) { return a + b; }\n", a, 128);
    run(0, 0, 0, a, na, 0, NULL, out);
    cr_assert_eq(spec_seq_reusable(eng, 1, 0, a, na, &drafter_kind_mtp), na - 1);
    cr_assert_eq(spec_seq_reusable(eng, 1, 0, a, na, NULL), na - 1);
    cr_assert_eq(run(1, 0, na - 1, a, na, 0, &drafter_kind_mtp, out), na - 1);
    run(2, 2, 0, a, na, 0, &drafter_kind_mtp, cold);
    cr_assert_arr_eq(out, cold, sizeof out);
}
