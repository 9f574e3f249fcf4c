/* test_spec.c — the speculative driver is lossless: greedy output with MTP and n-gram
 * speculation equals plain decoding for many prompts and every draft depth, on the shipped
 * trained model and on generated random qwen35 models (the rejection rule's own test is in
 * test_sample.c). */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "spec.h"
#include "tokenizer.h"

#define MODEL_PATH "models/coti-tiny-qwen35-mtp-q8_0.gguf"
#define N_GEN 20

struct env {
    struct backend *be;
    struct model *m;
    struct spec_engine *e;
};

static struct env env_open_seqs(const char *path, int n_seq, int n_batch) {
    struct env v;
    char err[512];
    v.be = backend_cpu_init(1, quant_cpu_level_detect());
    struct model_params p = {n_seq, 1024, n_batch, SPEC_MAX_DRAFT + 1, NULL, GGML_TYPE_F16, GGML_TYPE_F16, 0, 0};
    cr_assert_eq(model_load(&v.m, path, v.be, &p, err, sizeof err), 0, "%s", err);
    cr_assert_eq(spec_engine_init(&v.e, v.m, NULL, err, sizeof err), 0, "%s", err);
    return v;
}

/* Speculation parameters that draft n_max every cycle: the tests of each depth must see it. */
static struct spec_params fixed_depth_params(void) {
    struct spec_params p = spec_params_default();
    p.fixed_depth = true;
    return p;
}

static struct env env_open(const char *path) { return env_open_seqs(path, 1, 128); }

static void env_close(struct env *v) {
    spec_engine_free(v->e);
    model_free(v->m);
    backend_free(v->be);
}

/* Generation of n tokens with the given sampling and speculation. */
static void generate_with(struct env *v, const int32_t *prompt, int np, const struct sampler_params *sp,
                          const struct spec_params *p, int32_t *out, int n) {
    char err[512];
    const int n_max = p->n_max;
    int32_t first;
    cr_assert_eq(spec_seq_begin(v->e, 0, prompt, np, sp, p, &first, err, sizeof err), 0, "%s", err);
    out[0] = first;
    int k = 1, nb;
    int32_t buf[SPEC_MAX_DRAFT + 1];
    while (k < n) {
        cr_assert_eq(spec_seq_step(v->e, 0, n - k, buf, &nb, NULL, err, sizeof err), 0, "%s", err);
        cr_assert(nb >= 1 && nb <= n_max + 1 && nb <= n - k, "cycle emitted %d tokens", nb);
        memcpy(out + k, buf, sizeof(int32_t) * (size_t)nb);
        k += nb;
    }
}

/* Generation of N_GEN tokens for ns sequences (8-token prompts), in batched steps. */
static void generate_batched(struct env *v, int ns, const int32_t (*prompts)[8], const struct sampler_params *sp,
                             const struct spec_params *p, int32_t (*got)[N_GEN]) {
    char err[512];
    int n_got[SPEC_MAX_BATCH];
    for (int i = 0; i < ns; i++) {
        cr_assert_eq(spec_seq_begin(v->e, i, prompts[i], 8, &sp[i], &p[i], &got[i][0], err, sizeof err), 0, "%s", err);
        n_got[i] = 1;
    }
    for (;;) {
        int seqs[SPEC_MAX_BATCH], max_new[SPEC_MAX_BATCH], n_out[SPEC_MAX_BATCH], rc[SPEC_MAX_BATCH], n = 0;
        int32_t out[SPEC_MAX_BATCH][SPEC_MAX_DRAFT + 1];
        for (int i = 0; i < ns; i++)
            if (n_got[i] < N_GEN) { seqs[n] = i; max_new[n++] = N_GEN - n_got[i]; }
        if (!n) break;
        cr_assert_eq(spec_step_batch(v->e, n, seqs, max_new, out, n_out, rc, NULL, err, sizeof err), 0, "%s", err);
        for (int j = 0; j < n; j++) {
            cr_assert_eq(rc[j], 0, "sequence %d: %s", seqs[j], err);
            cr_assert(n_out[j] >= 1 && n_out[j] <= max_new[j]);
            memcpy(&got[seqs[j]][n_got[seqs[j]]], out[j], sizeof(int32_t) * (size_t)n_out[j]);
            n_got[seqs[j]] += n_out[j];
        }
    }
}

/* Greedy generation of n tokens with the given speculation. */
static void generate(struct env *v, const int32_t *prompt, int np, const struct drafter_kind *k, int n_max, int32_t *out,
                     int n) {
    struct sampler_params sp = sampler_params_basic(0.0f, 0, 1.0f, 0.0f, 1);
    struct spec_params p = fixed_depth_params();
    p.drafter = k;
    p.n_max = n_max;
    generate_with(v, prompt, np, &sp, &p, out, n);
}

/* Every prompt, every depth 1..4, every drafter: the tokens equal plain decoding. Returns
 * the number of accepted drafts, so callers can check speculation really happened. */
static long check_lossless(struct env *v, int32_t **prompts, const int *np, int n_prompts) {
    long accepted = 0;
    int32_t ref[N_GEN], got[N_GEN];
    for (int i = 0; i < n_prompts; i++) {
        generate(v, prompts[i], np[i], NULL, 1, ref, N_GEN);
        for (int n_max = 1; n_max <= 4; n_max++) {
            for (int t = 0; t < n_drafter_kinds; t++) {
                if (!spec_engine_supports(v->e, drafter_kinds[t])) continue;
                generate(v, prompts[i], np[i], drafter_kinds[t], n_max, got, N_GEN);
                for (int k = 0; k < N_GEN; k++)
                    cr_assert_eq(got[k], ref[k], "prompt %d, %s n_max %d: token %d is %d, plain decoding gave %d", i,
                                 drafter_kinds[t]->name, n_max, k, got[k], ref[k]);
                accepted += spec_seq_stats(v->e, 0)->n_accepted;
            }
        }
    }
    return accepted;
}

Test(spec, greedy_lossless_on_default_model_16_prompts, .timeout = 300) {
    struct env v = env_open(MODEL_PATH);
    char err[256];
    struct tokenizer *tok;
    cr_assert_eq(tokenizer_init(&tok, v.m->gguf, err, sizeof err), 0, "%s", err);
    FILE *f = fopen("tests/data-prompts.json", "rb");
    cr_assert_not_null(f);
    char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    cJSON *arr = cJSON_Parse(buf);
    cr_assert(cJSON_IsArray(arr));
    int32_t *prompts[16];
    int np[16];
    for (int i = 0; i < 16; i++) {
        const char *s = cJSON_GetArrayItem(arr, i)->valuestring;
        size_t nt;
        /* the first ~160 bytes keep the suite fast; code and prose both occur */
        cr_assert_eq(tokenizer_encode(tok, s, strlen(s) < 160 ? strlen(s) : 160, false, false, &prompts[i], &nt, err, sizeof err), 0);
        np[i] = (int)nt;
    }
    long accepted = check_lossless(&v, prompts, np, 16);
    cr_assert_gt(accepted, 100, "speculation must actually accept drafts on the trained model (accepted %ld)", accepted);
    for (int i = 0; i < 16; i++) free(prompts[i]);
    cJSON_Delete(arr);
    tokenizer_free(tok);
    env_close(&v);
}

/* The paths that bring drafts back to the host: sample-and-match at temperature > 0 with
 * greedy drafts draws one target sample per emitted token, exactly as plain sampling does, so
 * with the same seed the streams are equal; p_min > 0 reads each draft's probability and may
 * stop early, and must stay lossless. */
Test(spec, sampled_and_p_min_paths_match_plain_decoding, .timeout = 120) {
    struct env v = env_open(MODEL_PATH);
    const int32_t prompt[] = {1, 35, 2000, 17, 5, 90, 400, 12};
    const int np = (int)(sizeof prompt / sizeof prompt[0]);
    int32_t ref[48], got[48];
    struct sampler_params hot = sampler_params_basic(0.8f, 40, 0.95f, 0.0f, 7);
    struct spec_params p = fixed_depth_params();
    generate_with(&v, prompt, np, &hot, &p, ref, 48);
    p.drafter = &drafter_kind_mtp;
    for (p.n_max = 1; p.n_max <= 3; p.n_max++) {
        generate_with(&v, prompt, np, &hot, &p, got, 48);
        for (int k = 0; k < 48; k++) cr_assert_eq(got[k], ref[k], "temperature 0.8, n_max %d: token %d differs", p.n_max, k);
        cr_assert_gt(spec_seq_stats(v.e, 0)->n_accepted, 0, "no draft was accepted at n_max %d", p.n_max);
    }
    struct sampler_params greedy = sampler_params_basic(0.0f, 0, 1.0f, 0.0f, 1);
    p.drafter = NULL;
    generate_with(&v, prompt, np, &greedy, &p, ref, 48);
    p.drafter = &drafter_kind_mtp;
    p.n_max = 4;
    double per_verify[2];
    for (int i = 0; i < 2; i++) {
        p.p_min = i ? 0.6f : 0.0f;
        generate_with(&v, prompt, np, &greedy, &p, got, 48);
        for (int k = 0; k < 48; k++) cr_assert_eq(got[k], ref[k], "p_min %g: token %d differs", p.p_min, k);
        const struct spec_stats *st = spec_seq_stats(v.e, 0);
        cr_assert_gt(st->n_accepted, 0);
        per_verify[i] = (double)st->n_drafted / (double)st->n_verify;
    }
    /* p_min was consulted: some cycles stopped early */
    cr_assert_lt(per_verify[1], per_verify[0], "drafts per verify: %g with p_min, %g without", per_verify[1], per_verify[0]);
    env_close(&v);
}

static void random_prompt(int32_t *t, int n, int V, uint32_t seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        /* a small alphabet repeats n-grams, so the n-gram drafter gets to propose */
        t[i] = (int32_t)((seed >> 8) % (uint32_t)(i % 3 ? V : 7));
    }
}

/* Random models of an architecture, at two weight types each: spec on equals spec off. */
static void check_random_models(const char *arch, const char *const types[2], int seed) {
    for (int ti = 0; ti < 2; ti++) {
        char path[128], cmd[512];
        snprintf(path, sizeof path, "/tmp/coti-test-spec-%d-%s-%s.gguf", (int)getpid(), arch, types[ti]);
        snprintf(cmd, sizeof cmd, "./coti mkmodel --arch %s -o %s --type %s --seed %d > /dev/null 2>&1", arch, path,
                 types[ti], seed + ti);
        cr_assert_eq(system(cmd), 0, "mkmodel failed: %s", cmd);
        struct env v = env_open(path);
        cr_assert_str_eq(v.m->info.arch, arch);
        int32_t p[6][24], *pp[6];
        int np[6];
        for (int i = 0; i < 6; i++) { random_prompt(p[i], 24, v.m->info.n_vocab, 100 + i); pp[i] = p[i]; np[i] = 24; }
        check_lossless(&v, pp, np, 6);
        env_close(&v);
        remove(path);
    }
}

Test(spec, greedy_lossless_on_random_models, .timeout = 300) {
    check_random_models("qwen35", (const char *const[2]){"q8_0", "f32"}, 40);
}

/* qwen35moe: verify batches route every row to its own experts, grouped with the other rows'
 * (matmul_id); each row must still equal the decode row it replaces. */
Test(spec, greedy_lossless_on_random_moe_models, .timeout = 300) {
    check_random_models("qwen35moe", (const char *const[2]){"q8_0", "q4_0"}, 60);
}

/* A warmup leaves nothing behind: every sequence is empty afterwards (no cached prefix), and
 * what follows decodes as on a fresh engine, for both drafters and plain decoding. */
Test(spec, warmup_leaves_every_sequence_as_new, .timeout = 120) {
    struct env v = env_open(MODEL_PATH), w = env_open(MODEL_PATH);
    char err[512];
    int32_t warm[6] = {300, 301, 302, 303, 304, 305}, prompt[9] = {11, 220, 1500, 42, 901, 17, 5, 660, 8};
    struct sampler_params sp = sampler_params_basic(0.0f, 0, 1.0f, 0.0f, 7);
    for (int t = -1; t < n_drafter_kinds; t++) { /* -1: off */
        const struct drafter_kind *k = t < 0 ? NULL : drafter_kinds[t];
        if (!spec_engine_supports(v.e, k)) continue; /* a drafter this model has no file for */
        struct spec_params p = spec_params_default();
        p.drafter = k;
        p.n_max = 3;
        cr_assert_eq(spec_engine_warmup(v.e, warm, 6, &sp, &p, 24, err, sizeof err), 0, "%s", err);
        int n_hist = -1;
        spec_seq_tokens(v.e, 0, &n_hist);
        cr_assert_eq(n_hist, 0, "warmup left %d tokens", n_hist);
        cr_assert_eq(v.m->seq_len[0], 0);
        int32_t a[N_GEN], b[N_GEN];
        generate(&v, prompt, 9, k, 3, a, N_GEN);
        generate(&w, prompt, 9, k, 3, b, N_GEN);
        cr_assert_eq(memcmp(a, b, sizeof a), 0, "%s: decoding after the warmup differs", drafter_kind_name(k));
    }
    env_close(&v);
    env_close(&w);
}

/* ---- penalties and typical_p under speculation ---- */

#define PEN_N 40

/* The probe's view of plain penalised greedy decoding: each row's argmax after penalties
 * computed here from the definition (counts over the last 64 tokens before the row). */
struct pen_check {
    const int32_t *full;         /* prompt + generated */
    struct sampler_params sp;
    int n_rows, n_wrong, n_moved; /* rows seen; picks that differ; rows where the penalty moved the argmax */
    float *pen;
};

static void pen_on_row(void *user, int pos, const float *logits, int n_vocab) {
    struct pen_check *c = user;
    memcpy(c->pen, logits, sizeof(float) * (size_t)n_vocab);
    const int n_prev = pos + 1, w0 = n_prev > c->sp.repeat_last_n ? n_prev - c->sp.repeat_last_n : 0;
    for (int t = 0; t < n_vocab; t++) {
        int count = 0;
        for (int i = w0; i < n_prev; i++) count += c->full[i] == t;
        if (!count) continue;
        float x = logits[t] <= 0 ? logits[t] * c->sp.repeat_penalty : logits[t] / c->sp.repeat_penalty;
        c->pen[t] = x - ((float)count * c->sp.frequency_penalty + c->sp.presence_penalty);
    }
    const int32_t want = sample_argmax(c->pen, n_vocab);
    c->n_wrong += want != c->full[pos + 1];
    c->n_moved += want != sample_argmax(logits, n_vocab);
    c->n_rows++;
}

/* Every verify row is sampled with the history plain decoding had at that position (the
 * drafts before it included), so with penalties and typical_p greedy output equals plain
 * decoding for every drafter and depth, and so does sampled output at the same seed (greedy
 * drafts: one target draw per emitted token, as in plain decoding); and plain greedy with
 * penalties is the argmax of each row's penalised logits. */
Test(spec, penalties_and_typical_lossless_with_speculation, .timeout = 300) {
    struct env v = env_open(MODEL_PATH);
    /* the second prompt is "int main(" in the shipped vocabulary: its greedy continuation under
     * a frequency penalty repeats three-token groups, which the n-gram drafter picks up */
    const int32_t prompts[2][8] = {{1, 35, 2000, 17, 5, 90, 400, 12}, {370, 4756, 10}};
    const int n_prompt[2] = {8, 3};
    const int32_t scrub[8] = {9, 900, 90, 9000, 99, 909, 999, 9};
    struct sampler_params settings[4];
    settings[0] = sampler_params_basic(0.0f, 0, 1.0f, 0.0f, 1);
    settings[0].repeat_penalty = 1.3f;
    settings[0].frequency_penalty = 0.3f;
    settings[0].presence_penalty = 0.2f;
    settings[1] = settings[0];
    settings[1].typical_p = 0.9f;
    settings[1].top_k = 40;
    settings[2] = sampler_params_basic(0.8f, 40, 0.95f, 0.0f, 7);
    settings[2].repeat_penalty = 1.2f;
    settings[2].presence_penalty = 0.5f;
    settings[2].typical_p = 0.9f;
    settings[3] = sampler_params_basic(0.0f, 0, 1.0f, 0.0f, 1);
    settings[3].frequency_penalty = 0.3f;
    int32_t ref[PEN_N], got[PEN_N], plain[PEN_N];
    long drafted[SPEC_MAX_DRAFT] = {0}, accepted[SPEC_MAX_DRAFT] = {0};
    int moved = 0;
    for (int si = 0; si < 4; si++) {
        for (int pi = 0; pi < 2; pi++) {
            struct spec_params p = fixed_depth_params();
            generate_with(&v, prompts[pi], n_prompt[pi], &settings[si], &p, ref, PEN_N);
            if (si == 0) {
                struct sampler_params none = sampler_params_basic(0.0f, 0, 1.0f, 0.0f, 1);
                generate_with(&v, prompts[pi], n_prompt[pi], &none, &p, plain, PEN_N);
                moved += memcmp(plain, ref, sizeof ref) != 0;
            }
            for (int t = 0; t < n_drafter_kinds; t++) {
                if (!spec_engine_supports(v.e, drafter_kinds[t])) continue;
                p.drafter = drafter_kinds[t];
                for (p.n_max = 1; p.n_max <= 4; p.n_max++) {
                    /* the driver's history past the pending token still holds what the last
                     * run left there; another text there makes a row that read it instead of
                     * this cycle's drafts go wrong */
                    struct spec_params off = spec_params_default();
                    struct sampler_params none = sampler_params_basic(0.0f, 0, 1.0f, 0.0f, 1);
                    generate_with(&v, scrub, 8, &none, &off, got, PEN_N);
                    generate_with(&v, prompts[pi], n_prompt[pi], &settings[si], &p, got, PEN_N);
                    for (int k = 0; k < PEN_N; k++)
                        cr_assert_eq(got[k], ref[k], "setting %d prompt %d %s n_max %d: token %d is %d, plain decoding gave %d", si, pi,
                                     drafter_kinds[t]->name, p.n_max, k, got[k], ref[k]);
                    drafted[t] += spec_seq_stats(v.e, 0)->n_drafted;
                    accepted[t] += spec_seq_stats(v.e, 0)->n_accepted;
                }
            }
        }
    }
    cr_assert_gt(moved, 0, "the penalties changed no greedy output");
    /* every drafter's drafts were accepted, so verify rows after drafts were sampled */
    for (int t = 0; t < n_drafter_kinds; t++) {
        if (!spec_engine_supports(v.e, drafter_kinds[t])) continue;
        cr_assert_gt(accepted[t], 0, "%s: %ld drafted, none accepted", drafter_kinds[t]->name, drafted[t]);
    }

    /* teacher-force the penalised greedy output and check each row's pick by hand */
    struct spec_params off = spec_params_default();
    generate_with(&v, prompts[0], 8, &settings[0], &off, ref, PEN_N);
    int32_t full[8 + PEN_N];
    memcpy(full, prompts[0], sizeof prompts[0]);
    memcpy(full + 8, ref, sizeof ref);
    struct pen_check chk = {.full = full, .sp = settings[0], .pen = malloc(sizeof(float) * (size_t)v.m->info.n_vocab)};
    cr_assert_not_null(chk.pen);
    char err[512];
    int32_t first, buf[SPEC_MAX_DRAFT + 1];
    cr_assert_eq(spec_seq_begin(v.e, 0, prompts[0], 8, &settings[0], &off, &first, err, sizeof err), 0, "%s", err);
    cr_assert_eq(first, ref[0]);
    struct spec_probe probe = {.forced = ref + 1, .n_forced = PEN_N - 1, .on_row = pen_on_row, .user = &chk};
    while (probe.n_used < probe.n_forced) {
        int nb;
        cr_assert_eq(spec_seq_step(v.e, 0, PEN_N, buf, &nb, &probe, err, sizeof err), 0, "%s", err);
    }
    cr_assert_eq(chk.n_rows, PEN_N - 1);
    cr_assert_eq(chk.n_wrong, 0, "%d of %d penalised greedy picks are not the argmax of the penalised row", chk.n_wrong, chk.n_rows);
    cr_assert_gt(chk.n_moved, 0, "no row's pick was moved by the penalties");
    free(chk.pen);
    env_close(&v);
}

/* Greedy generation of n tokens with their log-probabilities (5 alternatives each). */
static void generate_probs(struct env *v, const int32_t *prompt, int np, const struct drafter_kind *k, int n_max,
                           int32_t *out, struct spec_token_prob *probs, int n) {
    char err[512];
    struct sampler_params sp = sampler_params_default(1);
    sp.temperature = 0.0f;
    struct spec_params p = fixed_depth_params();
    p.drafter = k;
    p.n_max = n_max;
    spec_seq_want_probs(v->e, 0, 5);
    int32_t first;
    cr_assert_eq(spec_seq_begin(v->e, 0, prompt, np, &sp, &p, &first, err, sizeof err), 0, "%s", err);
    out[0] = first;
    probs[0] = spec_seq_probs(v->e, 0)[0];
    int32_t buf[SPEC_MAX_DRAFT + 1];
    for (int g = 1, nb; g < n; g += nb) {
        cr_assert_eq(spec_seq_step(v->e, 0, n - g, buf, &nb, NULL, err, sizeof err), 0, "%s", err);
        memcpy(out + g, buf, sizeof(int32_t) * (size_t)nb);
        memcpy(probs + g, spec_seq_probs(v->e, 0), sizeof *probs * (size_t)nb);
    }
    spec_seq_want_probs(v->e, 0, -1);
}

Test(spec, logprobs_do_not_depend_on_speculation, .timeout = 120) {
    struct env v = env_open(MODEL_PATH);
    const int32_t prompt[] = {1, 400, 401, 402, 403, 400, 401, 402, 403, 400, 401};
    const int np = (int)COTI_ARRAY_LEN(prompt);
    int32_t ref[N_GEN], out[N_GEN];
    struct spec_token_prob pref[N_GEN], p[N_GEN];
    generate_probs(&v, prompt, np, NULL, 1, ref, pref, N_GEN);
    for (int i = 0; i < N_GEN; i++) {
        cr_assert_eq(pref[i].n_top, 5);
        cr_assert_eq(pref[i].top_id[0], ref[i], "greedy picks the most likely token");
        cr_assert_eq(pref[i].logprob, pref[i].top_logprob[0]);
        double mass = 0;
        for (int k = 0; k < 5; k++) {
            mass += exp(pref[i].top_logprob[k]);
            if (k) cr_assert(pref[i].top_logprob[k] <= pref[i].top_logprob[k - 1], "sorted");
            cr_assert(pref[i].top_logprob[k] <= 0.0f);
        }
        cr_assert(mass <= 1.0 + 1e-5 && mass > 0.0, "mass %g", mass);
    }
    const struct { const struct drafter_kind *k; int n_max; } runs[] = {
        {&drafter_kind_mtp, 1}, {&drafter_kind_mtp, 3}, {&drafter_kind_ngram, 4},
    };
    for (size_t r = 0; r < COTI_ARRAY_LEN(runs); r++) {
        generate_probs(&v, prompt, np, runs[r].k, runs[r].n_max, out, p, N_GEN);
        cr_assert_arr_eq(out, ref, sizeof ref);
        for (int i = 0; i < N_GEN; i++) {
            bool same = p[i].logprob == pref[i].logprob && p[i].n_top == pref[i].n_top;
            for (int k = 0; same && k < p[i].n_top; k++)
                same = p[i].top_id[k] == pref[i].top_id[k] && p[i].top_logprob[k] == pref[i].top_logprob[k];
            cr_assert(same, "token %d: log-probabilities differ with %s:%d", i, drafter_kind_name(runs[r].k), runs[r].n_max);
        }
        cr_assert_gt(spec_seq_stats(v.e, 0)->n_accepted, 0, "%s:%d accepted no draft: the test shows nothing",
                     drafter_kind_name(runs[r].k), runs[r].n_max);
    }
    env_close(&v);
}

/* Constrained decoding: under a grammar, greedy output with speculation equals plain decoding
 * (drafts cut where the grammar rejects them, rows masked on the host), every emitted text is
 * in the grammar, and sampled output (greedy drafts, sample-and-match) is in it too. */
static int generate_constrained(struct env *v, const int32_t *prompt, int np, const struct sampler_params *sp,
                                const struct spec_params *p, const struct tokenizer *tok, int32_t *out, int n) {
    char err[512];
    int32_t first;
    cr_assert_eq(spec_seq_begin(v->e, 0, prompt, np, sp, p, &first, err, sizeof err), 0, "%s", err);
    out[0] = first;
    int k = 1, nb;
    int32_t buf[SPEC_MAX_DRAFT + 1];
    while (k < n && !tokenizer_is_eog(tok, out[k - 1])) {
        cr_assert_eq(spec_seq_step(v->e, 0, n - k, buf, &nb, NULL, err, sizeof err), 0, "%s", err);
        for (int i = 0; i < nb && k < n && !tokenizer_is_eog(tok, out[k - 1]); i++) out[k++] = buf[i];
    }
    return k;
}

Test(spec, grammar_greedy_lossless_and_output_in_grammar, .timeout = 300) {
    struct env v = env_open(MODEL_PATH);
    char err[256];
    struct tokenizer *tok;
    cr_assert_eq(tokenizer_init(&tok, v.m->gguf, err, sizeof err), 0, "%s", err);
    struct grammar_vocab *gv;
    cr_assert_eq(grammar_vocab_init(&gv, tok, v.m->info.n_vocab, err, sizeof err), 0, "%s", err);
    static const char *const grammars[] = {
        "root ::= \"{\" ws \"\\\"name\\\": \\\"\" [A-Za-z ]{1,24} \"\\\", \\\"year\\\": \" [0-9]{1,4} \"}\"\nws ::= [ ]?\n",
        "root ::= ([a-z]+ \" \"){3,12} \"the end.\"\n",
        "root ::= (\"def \" [a-z_]+ \"(\" [a-z, ]* \"):\\n    return \" [^\\n]+ \"\\n\")+\n",
    };
    static const char *const prompts[] = {"The capital of France is", "def add(a, b):", "Once upon a time"};
    const int n_gen = 48;
    long accepted = 0, n_cut_checked = 0;
    for (size_t gi = 0; gi < sizeof grammars / sizeof *grammars; gi++) {
        struct grammar *g;
        cr_assert_eq(grammar_parse(&g, grammars[gi], strlen(grammars[gi]), err, sizeof err), 0, "%s", err);
        for (size_t pi = 0; pi < sizeof prompts / sizeof *prompts; pi++) {
            int32_t *pt;
            size_t np;
            cr_assert_eq(tokenizer_encode(tok, prompts[pi], strlen(prompts[pi]), false, false, &pt, &np, err, sizeof err), 0);
            struct sampler_params sp = sampler_params_basic(0.0f, 0, 1.0f, 0.0f, 1);
            struct spec_params p = fixed_depth_params();
            p.grammar = g;
            p.grammar_vocab = gv;
            int32_t ref[64], got[64];
            const int n_ref = generate_constrained(&v, pt, (int)np, &sp, &p, tok, ref, n_gen);
            /* the text is a prefix of a sentence of the grammar (complete when it ended) */
            char *text;
            size_t len;
            const int n_text = n_ref - (tokenizer_is_eog(tok, ref[n_ref - 1]) ? 1 : 0);
            cr_assert_eq(tokenizer_detokenize(tok, ref, (size_t)n_text, false, &text, &len, err, sizeof err), 0);
            struct grammar_state *st;
            cr_assert_eq(grammar_state_init(&st, g, err, sizeof err), 0);
            cr_assert_eq(grammar_accept_bytes(st, text, len), 0, "grammar %zu prompt %zu: '%s' is not in the grammar", gi, pi, text);
            if (n_text < n_ref) cr_assert(grammar_can_end(st), "ended early: '%s'", text);
            grammar_state_free(st);
            free(text);
            for (int n_max = 1; n_max <= 4; n_max += 3) {
                p.drafter = &drafter_kind_mtp;
                p.n_max = n_max;
                const int n_got = generate_constrained(&v, pt, (int)np, &sp, &p, tok, got, n_gen);
                cr_assert_eq(n_got, n_ref, "grammar %zu prompt %zu n_max %d: %d tokens, plain gave %d", gi, pi, n_max, n_got, n_ref);
                for (int k = 0; k < n_ref; k++)
                    cr_assert_eq(got[k], ref[k], "grammar %zu prompt %zu n_max %d: token %d is %d, plain gave %d", gi, pi, n_max, k,
                                 got[k], ref[k]);
                accepted += spec_seq_stats(v.e, 0)->n_accepted;
                n_cut_checked++;
            }
            /* sampled: greedy drafts and sample-and-match (also when sampled drafts are asked
             * for); every text is still in the grammar */
            sp.temperature = 0.9f;
            sp.seed = 7 + pi;
            p.sample_drafts = true;
            const int n_s = generate_constrained(&v, pt, (int)np, &sp, &p, tok, got, n_gen);
            const int n_stext = n_s - (tokenizer_is_eog(tok, got[n_s - 1]) ? 1 : 0);
            cr_assert_eq(tokenizer_detokenize(tok, got, (size_t)n_stext, false, &text, &len, err, sizeof err), 0);
            cr_assert_eq(grammar_state_init(&st, g, err, sizeof err), 0);
            cr_assert_eq(grammar_accept_bytes(st, text, len), 0, "sampled: '%s' is not in grammar %zu", text, gi);
            grammar_state_free(st);
            free(text);
            free(pt);
        }
        grammar_free(g);
    }
    cr_assert_gt(accepted, 20, "speculation must accept drafts under a grammar (accepted %ld)", accepted);
    cr_assert_eq(n_cut_checked, 18);
    grammar_vocab_free(gv);
    tokenizer_free(tok);
    env_close(&v);
}

/* spec_step_batch: four sequences stepping together (each its own drafter and depth, some
 * greedy, one sampled, the verify rows split over forwards when n_batch is small) emit exactly
 * what each emits alone with spec_seq_step. */
Test(spec, batched_steps_equal_single_steps, .timeout = 300) {
    enum { NS = 4 };
    static const int32_t prompts[NS][8] = {{11, 220, 1500, 42, 901, 17, 5, 660}, {300, 301, 302, 303, 300, 301, 302, 303},
                                           {7, 8, 9, 10, 11, 12, 13, 14}, {1500, 42, 901, 1500, 42, 901, 1500, 42}};
    struct env one = env_open(MODEL_PATH);
    for (int n_batch = 128; n_batch >= 10; n_batch = n_batch == 128 ? 10 : 0) {
        struct env many = env_open_seqs(MODEL_PATH, NS, n_batch);
        /* n_batch 128: drafters run ahead where a batch allows it (drafter.h observe_ahead; on
         * by default only where the backend queues work), beside sampled and off sequences */
        spec_engine_set_queued(many.e, n_batch == 128);
        if (n_batch == 10) { /* depths chosen from the calibrated verify cost (on a CPU batches may then
                              * take no drafts for long enough that drafters stop following): still
                              * the same tokens */
            char err[256];
            cr_assert_eq(spec_engine_calibrate(many.e, err, sizeof err), 0, "%s", err);
            cr_assert_gt(spec_engine_verify_cost_us(many.e, 1, 1), 0.0);
            cr_assert_geq(spec_engine_verify_cost_us(many.e, 4, 2), spec_engine_verify_cost_us(many.e, 4, 1));
            cr_assert_geq(spec_engine_verify_cost_us(many.e, 3, 1), spec_engine_verify_cost_us(many.e, 2, 1),
                          "between the calibrated counts of sequences");
            for (int s = 0; s < NS; s++) cr_assert_eq(many.m->seq_len[s], 0, "calibration leaves sequence %d empty", s);
        }
        for (int round = 0; round < 4; round++) {
            struct sampler_params sp[NS];
            struct spec_params p[NS];
            int32_t ref[NS][N_GEN], got[NS][N_GEN];
            for (int i = 0; i < NS; i++) {
                /* round 0: every sequence off, mtp, ngram in turn; later rounds mixed; round 3:
                 * all mtp (drafted in one batch), two of them greedy under a penalty: no
                 * sampler, so batched drafts, but picks that are not plain argmaxes (each verify
                 * row read on the host, where a draft's q must be NULL: once it was garbage) */
                const int t = round == 3 ? 0 : (round + i) % (n_drafter_kinds + 1) - 1;
                p[i] = spec_params_default();
                p[i].drafter = t < 0 ? NULL : drafter_kinds[t];
                if (!spec_engine_supports(one.e, p[i].drafter)) p[i].drafter = NULL;
                p[i].n_max = 1 + (i + round) % 4;
                sp[i] = sampler_params_basic(i == 3 && round == 2 ? 0.8f : 0.0f, 0, 1.0f, 0.0f, 5 + (uint64_t)i);
                if (round == 3 && i < 2) sp[i].frequency_penalty = 0.5f;
                generate_with(&one, prompts[i], 8, &sp[i], &p[i], ref[i], N_GEN);
            }
            generate_batched(&many, NS, prompts, sp, p, got);
            for (int i = 0; i < NS; i++)
                cr_assert_eq(memcmp(ref[i], got[i], sizeof ref[i]), 0, "n_batch %d round %d: sequence %d (%s n_max %d) differs",
                             n_batch, round, i, drafter_kind_name(p[i].drafter), p[i].n_max);
        }
        /* refused: a sequence twice, one out of range (each its own status) */
        int seqs[2] = {1, 1}, max_new[2] = {4, 4}, n_out[2], rc[2];
        int32_t out[2][SPEC_MAX_DRAFT + 1];
        char err[256];
        cr_assert_eq(spec_step_batch(many.e, 2, seqs, max_new, out, n_out, rc, NULL, err, sizeof err), 0);
        cr_assert(rc[0] == 0 && rc[1] == COTI_E_ARG && n_out[1] == 0);
        seqs[1] = NS;
        cr_assert_eq(spec_step_batch(many.e, 2, seqs, max_new, out, n_out, rc, NULL, err, sizeof err), 0);
        cr_assert(rc[0] == 0 && rc[1] == COTI_E_ARG);
        env_close(&many);
    }
    env_close(&one);
}

/* A drafter that runs ahead over a batched verify (drafter.h observe_ahead; by default only where
 * the backend queues work) drafts what it would have drafted after catching up: on the CPU a row
 * comes out the same in any batch, so tokens, drafts and accepted drafts all equal the path
 * without it, at every depth (and a sequence's own steps, which do not run ahead, as before). */
Test(spec, running_ahead_drafts_the_same, .timeout = 300) {
    enum { NS = 4 };
    static const int32_t prompts[NS][8] = {{11, 220, 1500, 42, 901, 17, 5, 660}, {300, 301, 302, 303, 300, 301, 302, 303},
                                           {7, 8, 9, 10, 11, 12, 13, 14}, {1500, 42, 901, 1500, 42, 901, 1500, 42}};
    struct env v[2] = {env_open_seqs(MODEL_PATH, NS, 128), env_open_seqs(MODEL_PATH, NS, 128)};
    spec_engine_set_queued(v[0].e, false);
    spec_engine_set_queued(v[1].e, true);
    for (int n_max = 1; n_max <= 3; n_max++) {
        const struct sampler_params sp = sampler_params_basic(0.0f, 0, 1.0f, 0.0f, 1);
        struct spec_params p = fixed_depth_params();
        p.drafter = &drafter_kind_mtp;
        p.n_max = n_max;
        int32_t got[2][NS][N_GEN], alone[2][N_GEN];
        struct spec_stats st[2][NS + 1];
        for (int w = 0; w < 2; w++) {
            generate_with(&v[w], prompts[0], 8, &sp, &p, alone[w], N_GEN);
            st[w][NS] = *spec_seq_stats(v[w].e, 0);
            const struct sampler_params sps[NS] = {sp, sp, sp, sp};
            const struct spec_params ps[NS] = {p, p, p, p};
            generate_batched(&v[w], NS, prompts, sps, ps, got[w]);
            for (int i = 0; i < NS; i++) st[w][i] = *spec_seq_stats(v[w].e, i);
        }
        cr_assert_eq(memcmp(alone[0], alone[1], sizeof alone[0]), 0, "n_max %d: one sequence's tokens differ", n_max);
        cr_assert_eq(memcmp(got[0], got[1], sizeof got[0]), 0, "n_max %d: the batch's tokens differ", n_max);
        long ran = 0, accepted = 0, drafted = 0;
        for (int i = 0; i <= NS; i++) {
            cr_assert_eq(st[0][i].n_ahead, 0);
            cr_assert(st[0][i].n_drafted == st[1][i].n_drafted && st[0][i].n_accepted == st[1][i].n_accepted,
                      "n_max %d, %s %d: drafted %ld / %ld, accepted %ld / %ld", n_max, i < NS ? "sequence" : "alone", i,
                      st[0][i].n_drafted, st[1][i].n_drafted, st[0][i].n_accepted, st[1][i].n_accepted);
            ran += st[1][i].n_ahead;
            accepted += st[1][i].n_accepted;
            drafted += st[1][i].n_drafted;
        }
        /* it ran (every verify but a request's last few: no room for more tokens), and its drafts
         * are the trained head's: noise (a wrong row or token) is next to never kept, the head
         * keeps about half or more of its drafts on these prompts */
        cr_assert_gt(ran, 5 * (NS + 1), "n_max %d: ran ahead %ld times", n_max, ran);
        cr_assert_gt(accepted * 4, drafted, "n_max %d: %ld of %ld drafts accepted", n_max, accepted, drafted);
    }
    env_close(&v[0]);
    env_close(&v[1]);
}

/* Cycles without drafts (a batch's depth 0, or one token of room) still stage the accepted rows
 * for the head: a stage filled to its brim (n_batch + 1 rows) must not become one head forward
 * over more than n_batch rows at the next draft (CI once failed that way, when the batched
 * policy's timings left a sequence undrafted for ten cycles). */
Test(spec, drafting_after_a_full_stage, .timeout = 120) {
    enum { N_BATCH = 10 };
    static const int32_t prompt[8] = {11, 220, 1500, 42, 901, 17, 5, 660};
    struct env v = env_open_seqs(MODEL_PATH, 1, N_BATCH);
    const struct sampler_params sp = sampler_params_basic(0.0f, 0, 1.0f, 0.0f, 1);
    struct spec_params p = fixed_depth_params();
    int32_t ref[N_GEN], got[N_GEN];
    generate_with(&v, prompt, 8, &sp, &p, ref, N_GEN);
    p.drafter = &drafter_kind_mtp;
    for (p.n_max = 1; p.n_max <= 3; p.n_max++) {
        for (int undrafted = N_BATCH - 1; undrafted <= N_BATCH + 2; undrafted++) {
            char err[512];
            int nb;
            cr_assert_eq(spec_seq_begin(v.e, 0, prompt, 8, &sp, &p, &got[0], err, sizeof err), 0, "%s", err);
            int k = 1;
            for (; k <= undrafted; k++) /* room for one token: no drafts, the rows staged */
                cr_assert_eq(spec_seq_step(v.e, 0, 1, &got[k], &nb, NULL, err, sizeof err), 0, "%s", err);
            while (k < N_GEN) {
                cr_assert_eq(spec_seq_step(v.e, 0, N_GEN - k, &got[k], &nb, NULL, err, sizeof err), 0,
                             "n_max %d after %d undrafted cycles: %s", p.n_max, undrafted, err);
                k += nb;
            }
            cr_assert_eq(memcmp(ref, got, sizeof ref), 0, "n_max %d after %d undrafted cycles", p.n_max, undrafted);
            cr_assert_gt(spec_seq_stats(v.e, 0)->n_drafted, 0);
        }
    }
    env_close(&v);
}

/* A prompt processed in steps (spec_seq_start_reuse + spec_seq_prefill of a few rows at a time,
 * with a checkpoint inside) gives the tokens of spec_seq_begin, and the steps report progress
 * only at the end. */
Test(spec, prefill_in_steps_equals_whole, .timeout = 120) {
    struct env v = env_open(MODEL_PATH), w = env_open(MODEL_PATH);
    char err[512];
    int32_t prompt[150];
    for (int i = 0; i < 150; i++) prompt[i] = (int32_t)((i * 37 + 11) % 3000);
    for (int t = -1; t < n_drafter_kinds; t++) {
        const struct drafter_kind *k = t < 0 ? NULL : drafter_kinds[t];
        if (!spec_engine_supports(v.e, k)) continue;
        struct sampler_params sp = sampler_params_basic(0.0f, 0, 1.0f, 0.0f, 3);
        struct spec_params p = spec_params_default();
        p.drafter = k;
        int32_t ref[N_GEN], got[N_GEN];
        generate_with(&v, prompt, 150, &sp, &p, ref, N_GEN);
        const int ck = 61;
        int n_cached = -1;
        cr_assert_eq(spec_seq_start_reuse(w.e, 0, 0, 0, prompt, 150, &ck, 1, &sp, &p, &n_cached, err, sizeof err), 0, "%s", err);
        cr_assert_eq(n_cached, 0);
        bool done = false;
        int calls = 0;
        while (!done) {
            got[0] = -1;
            int rc = 0;
            cr_assert_eq(spec_seqs_prefill(w.e, 1, (int[]){0}, 7 + calls % 5, &got[0], &done, &rc, err, sizeof err), 0, "%s", err);
            cr_assert_eq(rc, 0, "%s", err);
            cr_assert(done || got[0] == -1, "a first token before the prompt's end");
            calls++;
        }
        cr_assert_geq(calls, 150 / 11, "the prompt went in steps");
        int rc = 0;
        cr_assert_eq(spec_seqs_prefill(w.e, 1, (int[]){0}, 7, &got[1], &done, &rc, err, sizeof err), 0);
        cr_assert_neq(rc, 0, "nothing left to process");
        for (int n = 1, nb; n < N_GEN; n += nb) {
            int32_t buf[SPEC_MAX_DRAFT + 1];
            cr_assert_eq(spec_seq_step(w.e, 0, N_GEN - n, buf, &nb, NULL, err, sizeof err), 0, "%s", err);
            memcpy(got + n, buf, sizeof(int32_t) * (size_t)nb);
        }
        cr_assert_eq(memcmp(ref, got, sizeof ref), 0, "%s: steps differ from a whole prefill", drafter_kind_name(k));
    }
    env_close(&v);
    env_close(&w);
}

/* A backend with prompt kernel families (backend.h prompt_family; the CPU has one): the prefill
 * must give each forward the family of every prompt in it (by the prompt's whole length), packing
 * prompts of one family together and never two families. The model's forward is wrapped to check
 * each batch against the families the test assigns. */
static int fam_of(int prompt_len) { return prompt_len >= 60 ? 2 : prompt_len > 8 ? 1 : 0; }
static int fam_fake(const struct backend *be, int prompt_len) { (void)be; return fam_of(prompt_len); }
static int fam_set;
static void fam_set_prompt(struct backend *be, int family) { (void)be; fam_set = family; }
static const struct model_vtable *fam_inner;
static const int *fam_len;            /* each sequence's prompt length */
static int fam_forwards[3], fam_packed, fam_mixed;
static int fam_forward(struct model *m, const struct model_batch *b, struct model_output *out, char *err, size_t err_size) {
    if (fam_set != b->prompt) fam_mixed++; /* model_forward set the batch's family */
    if (b->prompt) {
        int seqs = 0, last = -1;
        for (int i = 0; i < b->n; i++) {
            const int s = b->seq ? b->seq[i] : 0;
            if (fam_of(fam_len[s]) != b->prompt) fam_mixed++;
            if (s != last) seqs++;
            last = s;
        }
        fam_forwards[b->prompt]++;
        if (seqs > 1) fam_packed++;
    }
    return fam_inner->forward(m, b, out, err, err_size);
}

Test(spec, prompts_prefilled_by_family, .timeout = 120) {
    enum { NS = 4 };
    static const int np[NS] = {90, 5, 53, 70};
    struct env one = env_open(MODEL_PATH), many = env_open_seqs(MODEL_PATH, NS, 200);
    many.be->prompt_family = fam_fake;
    many.be->set_prompt = fam_set_prompt;
    static struct model_vtable vt;
    fam_inner = many.m->vt;
    vt = *fam_inner;
    vt.forward = fam_forward;
    many.m->vt = &vt;
    fam_len = np;
    char err[512];
    int32_t prompt[NS][90], ref[NS][N_GEN], got[NS][N_GEN];
    const struct sampler_params sp = sampler_params_basic(0.0f, 0, 1.0f, 0.0f, 3);
    const struct spec_params p = fixed_depth_params();
    for (int i = 0; i < NS; i++) {
        for (int j = 0; j < np[i]; j++) prompt[i][j] = (int32_t)((j * 37 + 11 * i + 3) % 2000);
        generate_with(&one, prompt[i], np[i], &sp, &p, ref[i], N_GEN);
        int n_cached = -1;
        cr_assert_eq(spec_seq_start_reuse(many.e, i, i, 0, prompt[i], np[i], NULL, 0, &sp, &p, &n_cached, err, sizeof err),
                     0, "%s", err);
    }
    int seqs[NS] = {0, 1, 2, 3}, rc[NS];
    bool done[NS];
    int32_t first[NS];
    cr_assert_eq(spec_seqs_prefill(many.e, NS, seqs, 1 << 20, first, done, rc, err, sizeof err), 0, "%s", err);
    for (int i = 0; i < NS; i++) {
        cr_assert(rc[i] == 0 && done[i], "sequence %d: %s", i, err);
        got[i][0] = first[i];
        for (int k = 1, nb; k < N_GEN; k += nb) {
            int32_t buf[SPEC_MAX_DRAFT + 1];
            cr_assert_eq(spec_seq_step(many.e, i, N_GEN - k, buf, &nb, NULL, err, sizeof err), 0, "%s", err);
            memcpy(&got[i][k], buf, sizeof(int32_t) * (size_t)COTI_MIN(nb, N_GEN - k));
        }
        cr_assert_eq(memcmp(ref[i], got[i], sizeof ref[i]), 0, "sequence %d differs from alone", i);
    }
    cr_assert_eq(fam_mixed, 0, "a forward ran rows of another family than its own");
    /* 90 and 70 tokens (family 2) share their forwards, 53 (family 1) has its own, 5 (family 0)
     * runs as decode rows do */
    cr_assert(fam_forwards[1] >= 1 && fam_forwards[2] >= 1 && fam_packed == fam_forwards[2],
              "forwards of family 1: %d, of family 2: %d, of several prompts: %d", fam_forwards[1], fam_forwards[2],
              fam_packed);
    many.m->vt = fam_inner;
    env_close(&one);
    env_close(&many);
}

/* Prompts of several sequences prefilled together (spec_seqs_prefill: pieces of each in shared
 * forwards of n_batch 40 rows, in steps of 23 rows, one with a checkpoint inside, one greedy
 * with mtp, one sampled) give each sequence the tokens it gets alone. */
Test(spec, prompts_prefilled_together_equal_alone, .timeout = 120) {
    enum { NS = 3 };
    static const int np[NS] = {90, 7, 53};
    struct env one = env_open(MODEL_PATH), many = env_open_seqs(MODEL_PATH, NS, 40);
    char err[512];
    int32_t prompt[NS][90], ref[NS][N_GEN], got[NS][N_GEN];
    struct sampler_params sp[NS];
    struct spec_params p[NS];
    struct spec_stats st[NS];
    for (int i = 0; i < NS; i++) {
        for (int j = 0; j < np[i]; j++) prompt[i][j] = (int32_t)((j * 31 + 7 * i + 5) % 2000);
        sp[i] = sampler_params_basic(i == 2 ? 0.8f : 0.0f, 0, 1.0f, 0.0f, 11 + i);
        p[i] = fixed_depth_params();
        p[i].drafter = i != 1 || !spec_engine_supports(one.e, &drafter_kind_mtp) ? &drafter_kind_mtp : NULL;
        p[i].n_max = 2;
        generate_with(&one, prompt[i], np[i], &sp[i], &p[i], ref[i], N_GEN);
        st[i] = *spec_seq_stats(one.e, 0);
    }
    const int ck = 61;
    for (int i = 0; i < NS; i++) {
        int n_cached = -1;
        cr_assert_eq(spec_seq_start_reuse(many.e, i, i, 0, prompt[i], np[i], &ck, i == 0, &sp[i], &p[i], &n_cached, err,
                                          sizeof err), 0, "%s", err);
    }
    int seqs[NS], rc[NS], n_left = NS, calls = 0;
    bool done[NS], finished[NS] = {false};
    int32_t first[NS];
    while (n_left > 0) {
        int n = 0;
        for (int i = 0; i < NS; i++) if (!finished[i]) seqs[n++] = i;
        /* pieces of 17 rows: the MTP head's catch-up gathers two prompts' into a forward (drafters/mtp.c
         * consume_stages), then the third's in the next */
        cr_assert_eq(spec_seqs_prefill(many.e, n, seqs, 17, first, done, rc, err, sizeof err), 0, "%s", err);
        for (int j = 0; j < n; j++) {
            cr_assert_eq(rc[j], 0, "sequence %d: %s", seqs[j], err);
            if (!done[j]) continue;
            finished[seqs[j]] = true;
            got[seqs[j]][0] = first[j];
            n_left--;
        }
        calls++;
    }
    cr_assert_geq(calls, 4, "the longest prompt went in steps");
    for (int i = 0; i < NS; i++)
        for (int k = 1, nb; k < N_GEN; k += nb) {
            int32_t buf[SPEC_MAX_DRAFT + 1];
            cr_assert_eq(spec_seq_step(many.e, i, N_GEN - k, buf, &nb, NULL, err, sizeof err), 0, "%s", err);
            memcpy(&got[i][k], buf, sizeof(int32_t) * (size_t)COTI_MIN(nb, N_GEN - k));
        }
    for (int i = 0; i < NS; i++) {
        cr_assert_eq(memcmp(ref[i], got[i], sizeof ref[i]), 0, "sequence %d differs from alone", i);
        /* a CPU row is the same in any batch: the head drafted what it drafted alone */
        const struct spec_stats *t = spec_seq_stats(many.e, i);
        cr_assert(t->n_drafted == st[i].n_drafted && t->n_accepted == st[i].n_accepted,
                  "sequence %d: drafted %ld / %ld, accepted %ld / %ld alone", i, t->n_drafted, st[i].n_drafted,
                  t->n_accepted, st[i].n_accepted);
    }
    cr_assert_gt(st[0].n_accepted + st[2].n_accepted, 0);
    int bad[2] = {0, 0};
    cr_assert_neq(spec_seqs_prefill(many.e, 2, bad, 5, first, done, rc, err, sizeof err), 0, "a sequence twice");
    env_close(&one);
    env_close(&many);
}
