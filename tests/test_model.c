/* test_model.c — whole-model properties of the qwen35 forward on the shipped trained model:
 * batch shape does not change results, sequences do not leak into each other, rollback
 * restores exactly the state of a run that never saw the rejected tokens, and the SIMD
 * kernels agree with the scalar reference. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model.h"
#include "sample.h"

#define MODEL_PATH "models/coti-tiny-qwen35-mtp-q8_0.gguf"

struct fixture {
    struct backend *be;
    struct model *m;
};

static struct fixture open_model_at(const char *path, int n_seq, int n_keep, enum quant_cpu_level level, int n_threads) {
    struct fixture f;
    char err[512];
    f.be = backend_cpu_init(n_threads, level);
    cr_assert_not_null(f.be);
    struct model_params p = {n_seq, 512, 128, n_keep, NULL, GGML_TYPE_F16, GGML_TYPE_F16, 0, 0};
    int rc = model_load(&f.m, path, f.be, &p, err, sizeof err);
    cr_assert_eq(rc, 0, "load: %s", err);
    return f;
}

static struct fixture open_model(int n_seq, int n_keep, enum quant_cpu_level level, int n_threads) {
    return open_model_at(MODEL_PATH, n_seq, n_keep, level, n_threads);
}

static void close_model(struct fixture *f) {
    model_free(f->m);
    backend_free(f->be);
}

/* Pseudo-random token ids (never a constant sequence), reproducible. */
static void random_tokens(int32_t *t, int n, int V, uint32_t seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        t[i] = (int32_t)((seed >> 8) % (uint32_t)V);
    }
}

/* Feed tokens [p0, p0+n) of seq s in one batch; copy the last row's logits to out. */
static void feed(struct fixture *f, int s, const int32_t *toks, int n, int p0, bool keep, float *out) {
    int32_t pos[256], seq[256];
    char err[256];
    for (int i = 0; i < n; i++) { pos[i] = p0 + i; seq[i] = s; }
    struct model_batch b = {.n = n, .tokens = toks, .pos = pos, .seq = seq, .keep_states = keep};
    struct model_output o;
    int rc = model_forward(f->m, &b, &o, err, sizeof err);
    cr_assert_eq(rc, 0, "forward: %s", err);
    cr_assert_eq(o.n_logits, 1);
    if (out) f->be->download(f->be, out, o.logits, sizeof(float) * (size_t)f->m->info.n_vocab);
}

/* Whether sequences s0 and s1 hold bit-identical recurrent state. */
static bool same_state(struct model *m, int s0, int s1) {
    long ns = m->vt->seq_state_read(m, s0, NULL, 0);
    cr_assert_gt(ns, 0);
    float *a = malloc(sizeof(float) * ns), *b = malloc(sizeof(float) * ns);
    cr_assert_eq(m->vt->seq_state_read(m, s0, a, ns), ns);
    cr_assert_eq(m->vt->seq_state_read(m, s1, b, ns), ns);
    const bool same = memcmp(a, b, sizeof(float) * ns) == 0;
    free(a); free(b);
    return same;
}

static float max_abs_diff(const float *a, const float *b, size_t n) {
    float d = 0;
    for (size_t i = 0; i < n; i++) d = fmaxf(d, fabsf(a[i] - b[i]));
    return d;
}

Test(model, prefill_equals_token_by_token_bitwise) {
    struct fixture f = open_model(2, 0, quant_cpu_level_detect(), 2);
    const int V = f.m->info.n_vocab, n = 40;
    int32_t t[40];
    random_tokens(t, n, V, 7);
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
    feed(&f, 0, t, n, 0, false, a);
    for (int i = 0; i < n; i++) feed(&f, 1, t + i, 1, i, false, b);
    /* short runs use the per-token recurrence and every kernel is batch-independent */
    cr_assert_eq(memcmp(a, b, sizeof(float) * V), 0, "max diff %g", max_abs_diff(a, b, V));
    free(a); free(b);
    close_model(&f);
}

/* qwen35moe: a prefill's rows share their experts' matmuls (grouped by expert), yet its last
 * row equals decoding token by token, bit for bit, at every CPU level and weight type. */
Test(model, moe_prefill_equals_token_by_token_bitwise) {
    const char *types[3] = {"q8_0", "q4_0", "f16"};
    for (int ti = 0; ti < 3; ti++) {
        char path[128], cmd[512];
        snprintf(path, sizeof path, "/tmp/coti-test-model-moe-%d-%s.gguf", (int)getpid(), types[ti]);
        snprintf(cmd, sizeof cmd, "./coti mkmodel --arch qwen35moe -o %s --type %s --seed %d > /dev/null 2>&1", path,
                 types[ti], 30 + ti);
        cr_assert_eq(system(cmd), 0, "mkmodel failed: %s", cmd);
        for (int l = QUANT_CPU_REF; l <= (int)quant_cpu_level_detect(); l++) {
            struct fixture f = open_model_at(path, 2, 0, (enum quant_cpu_level)l, 2);
            cr_assert_str_eq(f.m->info.arch, "qwen35moe");
            const int V = f.m->info.n_vocab, n = 40;
            int32_t t[40];
            random_tokens(t, n, V, 5 + ti);
            float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
            feed(&f, 0, t, n, 0, false, a);
            for (int i = 0; i < n; i++) feed(&f, 1, t + i, 1, i, false, b);
            cr_assert_eq(memcmp(a, b, sizeof(float) * V), 0, "%s level %d: max diff %g", types[ti], l, max_abs_diff(a, b, V));
            cr_assert_gt(max_abs_diff(a, a + 1, (size_t)V - 1), 0.0f, "real logits");
            free(a); free(b);
            close_model(&f);
        }
        remove(path);
    }
}

/* qwen35moe's experts with gate and up merged (ffn_gate_up_exps) compute what the separate
 * tensors of the same weights do, bit for bit (mkmodel writes the same rows either way): at the
 * reference level the separate stacks stay apart (the backend reads the file in place), above
 * it the loader merges them (weights_merge_experts), which must give the file's merged rows. */
Test(model, moe_gate_up_merged_equals_separate) {
    char p1[128], p2[128], cmd[768];
    snprintf(p1, sizeof p1, "/tmp/coti-test-model-moe-apart-%d.gguf", (int)getpid());
    snprintf(p2, sizeof p2, "/tmp/coti-test-model-moe-merged-%d.gguf", (int)getpid());
    snprintf(cmd, sizeof cmd,
             "./coti mkmodel --arch qwen35moe -o %s --seed 9 > /dev/null 2>&1 && "
             "./coti mkmodel --arch qwen35moe -o %s --seed 9 --gate-up-merged > /dev/null 2>&1", p1, p2);
    cr_assert_eq(system(cmd), 0, "mkmodel failed");
    const enum quant_cpu_level levels[2] = {QUANT_CPU_REF, quant_cpu_level_detect()};
    for (int li = 0; li < 2; li++) {
        struct fixture a = open_model_at(p1, 1, 0, levels[li], 2), b = open_model_at(p2, 1, 0, levels[li], 2);
        const int V = a.m->info.n_vocab, n = 12;
        int32_t t[12];
        random_tokens(t, n, V, 3);
        float *la = malloc(sizeof(float) * V), *lb = malloc(sizeof(float) * V);
        feed(&a, 0, t, n, 0, false, la);
        feed(&b, 0, t, n, 0, false, lb);
        cr_assert_eq(memcmp(la, lb, sizeof(float) * V), 0, "level %d: max diff %g", (int)levels[li], max_abs_diff(la, lb, V));
        feed(&a, 0, t, 1, n, false, la);
        feed(&b, 0, t, 1, n, false, lb);
        cr_assert_eq(memcmp(la, lb, sizeof(float) * V), 0, "level %d decode: max diff %g", (int)levels[li],
                     max_abs_diff(la, lb, V));
        free(la); free(lb);
        close_model(&a);
        close_model(&b);
    }
    remove(p1);
    remove(p2);
}

Test(model, chunked_prefill_close_to_token_by_token) {
    struct fixture f = open_model(2, 0, quant_cpu_level_detect(), 2);
    const int V = f.m->info.n_vocab, n = 150; /* > 2 chunks of 64, last one partial */
    int32_t t[150];
    random_tokens(t, n, V, 11);
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
    feed(&f, 0, t, n, 0, false, a);
    for (int i = 0; i < n; i++) feed(&f, 1, t + i, 1, i, false, b);
    /* The chunked delta rule differs from the recurrence by f32 rounding (~1e-6 relative,
     * tests/test_backend_ops.c bounds it against f64). In a Q8_0 model every matmul input is
     * re-quantized to 8 bits per block, so such a difference can flip an activation code by
     * one step (1/127 of the block maximum, ~0.8%), and the flips compound over 8 layers:
     * the bound here is that of a few code flips, and the argmax must not move. The tight
     * model-level check runs on an F32 model (test_mkmodel_models.c). */
    float d = max_abs_diff(a, b, V);
    cr_assert_lt(d, 0.25f, "chunked vs recurrent prefill: max |dlogit| %g", d);
    cr_assert_eq(sample_argmax(a, V), sample_argmax(b, V));
    free(a); free(b);
    close_model(&f);
}

Test(model, two_sequences_in_one_batch_equal_each_alone) {
    struct fixture f = open_model(3, 0, quant_cpu_level_detect(), 2);
    const int V = f.m->info.n_vocab;
    int32_t ta[24], tb[17], both[41], pos[41], seq[41];
    random_tokens(ta, 24, V, 3);
    random_tokens(tb, 17, V, 5);
    for (int i = 0; i < 24; i++) { both[i] = ta[i]; pos[i] = i; seq[i] = 0; }
    for (int i = 0; i < 17; i++) { both[24 + i] = tb[i]; pos[24 + i] = i; seq[24 + i] = 1; }
    bool want[41] = {0};
    want[23] = want[40] = true;
    struct model_batch b = {.n = 41, .tokens = both, .pos = pos, .seq = seq, .want_logits = want};
    struct model_output o;
    char err[256];
    cr_assert_eq(model_forward(f.m, &b, &o, err, sizeof err), 0, "%s", err);
    cr_assert_eq(o.n_logits, 2);
    float *joint = malloc(sizeof(float) * 2 * V), *alone = malloc(sizeof(float) * V);
    f.be->download(f.be, joint, o.logits, sizeof(float) * 2 * V);
    feed(&f, 2, ta, 24, 0, false, alone);
    cr_assert_eq(memcmp(joint, alone, sizeof(float) * V), 0, "seq 0 differs: %g", max_abs_diff(joint, alone, V));
    model_seq_reset(f.m, 2);
    feed(&f, 2, tb, 17, 0, false, alone);
    cr_assert_eq(memcmp(joint + V, alone, sizeof(float) * V), 0, "seq 1 differs: %g", max_abs_diff(joint + V, alone, V));
    free(joint); free(alone);
    close_model(&f);
}

/* Verify [s d1 d2 d3], keep 3 - n_drop of the drafts, then decode x: logits and recurrent state
 * must equal those of a sequence that only ever saw the kept tokens and x — bit for bit (n_drop
 * 0: the verify's last row was left pending, and x's forward applies it; 1: the pending row is
 * dropped; 2, 3: a snapshot is restored). */
Test(model, rollback_restores_accepted_prefix_exactly) {
    struct fixture f = open_model(2, 4, quant_cpu_level_detect(), 2);
    const int V = f.m->info.n_vocab;
    int32_t prompt[30], verify[4], x;
    random_tokens(prompt, 30, V, 21);
    random_tokens(verify, 4, V, 22);
    random_tokens(&x, 1, V, 23);
    for (int n_drop = 0; n_drop <= 3; n_drop++) {
        model_seq_reset(f.m, 0);
        model_seq_reset(f.m, 1);
        float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
        feed(&f, 0, prompt, 30, 0, false, NULL);
        feed(&f, 0, verify, 4, 30, true, NULL);
        cr_assert_eq(model_seq_rollback(f.m, 0, n_drop), 0);
        cr_assert_eq(f.m->seq_len[0], 34 - n_drop);
        feed(&f, 0, &x, 1, 34 - n_drop, false, a);

        feed(&f, 1, prompt, 30, 0, false, NULL);
        int32_t kept[5];
        memcpy(kept, verify, sizeof(int32_t) * (size_t)(4 - n_drop));
        kept[4 - n_drop] = x;
        feed(&f, 1, kept, 5 - n_drop, 30, false, b);
        cr_assert_eq(memcmp(a, b, sizeof(float) * V), 0, "n_drop %d: logits differ by %g", n_drop, max_abs_diff(a, b, V));
        cr_assert(same_state(f.m, 0, 1), "n_drop %d: recurrent state differs", n_drop);
        free(a); free(b);
    }
    close_model(&f);
}

/* A verify's pending last row belongs to the sequence's state wherever it goes: a copy, a
 * checkpoint resumed elsewhere and the state read all carry it, and each continues exactly as a
 * sequence that decoded the same tokens one by one. */
Test(model, pending_row_travels_with_copies_and_checkpoints) {
    struct fixture f = open_model(4, 4, quant_cpu_level_detect(), 2);
    const int V = f.m->info.n_vocab;
    int32_t prompt[20], verify[4], x;
    random_tokens(prompt, 20, V, 51);
    random_tokens(verify, 4, V, 52);
    random_tokens(&x, 1, V, 53);
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V), *c = malloc(sizeof(float) * V);
    feed(&f, 0, prompt, 20, 0, false, NULL);
    feed(&f, 0, verify, 4, 20, true, NULL);      /* every row accepted: the last one pending */
    model_seq_checkpoint(f.m, 0, NULL);
    cr_assert_eq(model_seq_copy(f.m, 1, 0), 0);
    cr_assert_eq(model_seq_resume(f.m, 2, 0, 24), 0);
    feed(&f, 3, prompt, 20, 0, false, NULL);
    for (int i = 0; i < 4; i++) feed(&f, 3, &verify[i], 1, 20 + i, false, NULL);
    cr_assert(same_state(f.m, 0, 3), "the state read applies the pending row");
    feed(&f, 3, &x, 1, 24, false, a);
    feed(&f, 1, &x, 1, 24, false, b);
    feed(&f, 2, &x, 1, 24, false, c);
    cr_assert_eq(memcmp(a, b, sizeof(float) * V), 0, "copy: %g", max_abs_diff(a, b, V));
    cr_assert_eq(memcmp(a, c, sizeof(float) * V), 0, "checkpoint: %g", max_abs_diff(a, c, V));
    cr_assert(same_state(f.m, 1, 3) && same_state(f.m, 2, 3));
    free(a); free(b); free(c);
    close_model(&f);
}

Test(model, rollback_beyond_kept_states_is_refused) {
    struct fixture f = open_model(1, 2, quant_cpu_level_detect(), 1);
    int32_t t[4] = {5, 6, 7, 8};
    feed(&f, 0, t, 4, 0, true, NULL);
    /* only the states after tokens 0 and 1 were kept: dropping 3 would need token 0's... ok;
     * dropping 1 needs the state after token 2, which was not kept */
    cr_assert_neq(model_seq_rollback(f.m, 0, 1), 0);
    cr_assert_eq(f.m->seq_len[0], 4, "a refused rollback must not change the sequence");
    cr_assert_eq(model_seq_rollback(f.m, 0, 3), 0);
    cr_assert_eq(f.m->seq_len[0], 1);
    close_model(&f);
}

Test(model, simd_kernels_match_reference_and_threads_do_not_matter) {
    struct fixture fr = open_model(1, 0, QUANT_CPU_REF, 1);
    struct fixture fs = open_model(1, 0, quant_cpu_level_detect(), 2);
    struct fixture f1 = open_model(1, 0, quant_cpu_level_detect(), 1);
    const int V = fr.m->info.n_vocab;
    int32_t t[33];
    random_tokens(t, 33, V, 99);
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V), *c = malloc(sizeof(float) * V);
    feed(&fr, 0, t, 33, 0, false, a);
    feed(&fs, 0, t, 33, 0, false, b);
    feed(&f1, 0, t, 33, 0, false, c);
    /* Same activation quantizer, different f32 summation order in attention and the delta
     * rule (16-lane partial sums): ~1e-7 relative, which can move a Q8_0 activation code by
     * one step when the model re-quantizes (see chunked_prefill_close_to_token_by_token for
     * that bound); the F32 model below has no re-quantization and gets the tight bound. */
    float d = max_abs_diff(a, b, V);
    cr_assert_lt(d, 0.25f, "simd vs reference: max |dlogit| %g", d);
    cr_assert_eq(sample_argmax(a, V), sample_argmax(b, V));
    cr_assert_eq(memcmp(b, c, sizeof(float) * V), 0, "1 vs 2 threads differ: %g", max_abs_diff(b, c, V));
    free(a); free(b); free(c);
    close_model(&fr); close_model(&fs); close_model(&f1);
}

/* A verify batch whose argmaxes and greedy acceptance run inside the forward gives what plain
 * decoding picks: two drafts that greedy decoding would emit are accepted, a wrong third is
 * not, and the target's own token follows. */
Test(model, greedy_picks_in_the_forward_equal_plain_decoding) {
    struct fixture f = open_model(2, 4, quant_cpu_level_detect(), 2);
    struct backend *be = f.be;
    const int V = f.m->info.n_vocab;
    char err[256];
    int32_t prompt[12], g[4];
    random_tokens(prompt, 12, V, 31);
    float *row = malloc(sizeof(float) * V);
    feed(&f, 1, prompt, 12, 0, false, row);
    g[0] = sample_argmax(row, V); /* the pending token */
    for (int i = 1; i < 4; i++) {
        feed(&f, 1, &g[i - 1], 1, 12 + i - 1, false, row);
        g[i] = sample_argmax(row, V);
    }
    feed(&f, 0, prompt, 12, 0, false, NULL);
    int32_t toks[4] = {g[0], g[1], g[2], (g[3] + 1) % V}, pos[4], seq[4] = {0, 0, 0, 0}, ids[4], acc[5];
    bool want[4] = {true, true, true, true};
    for (int i = 0; i < 4; i++) pos[i] = 12 + i;
    int32_t *d_toks = be->alloc(be, sizeof toks), *d_ids = be->alloc(be, sizeof ids), *d_acc = be->alloc(be, sizeof acc);
    be->upload(be, d_toks, toks, sizeof toks);
    struct model_batch b = {.n = 4, .tokens_dev = d_toks, .pos = pos, .seq = seq, .want_logits = want, .keep_states = true,
                            .accept_out = d_acc};
    struct model_output o;
    cr_assert_neq(model_forward(f.m, &b, &o, err, sizeof err), 0, "acceptance without argmax_out must be refused");
    cr_assert_eq(f.m->seq_len[0], 12);
    b.argmax_out = d_ids;
    cr_assert_eq(model_forward(f.m, &b, &o, err, sizeof err), 0, "forward: %s", err);
    be->download(be, ids, d_ids, sizeof ids);
    be->download(be, acc, d_acc, sizeof acc);
    for (int i = 0; i < 3; i++) cr_assert_eq(ids[i], g[i + 1], "row %d picks %d, plain decoding %d", i, ids[i], g[i + 1]);
    be->download(be, row, o.logits + (size_t)3 * V, sizeof(float) * V);
    cr_assert_eq(ids[3], sample_argmax(row, V));
    cr_assert_eq(acc[0], 2, "accepted %d of 3 drafts", acc[0]);
    for (int i = 0; i < 3; i++) cr_assert_eq(acc[1 + i], g[1 + i]);
    /* the rejected draft's state was dropped on the device: the rollback only trims, and the
     * sequence now holds what plain decoding of the accepted tokens left */
    cr_assert_eq(model_seq_rollback(f.m, 0, 1), 0);
    cr_assert_eq(f.m->seq_len[0], f.m->seq_len[1]);
    cr_assert(same_state(f.m, 0, 1), "recurrent state differs from plain decoding's");
    be->free(be, d_toks); be->free(be, d_ids); be->free(be, d_acc);
    free(row);
    close_model(&f);
}

/* A copied sequence continues as its source does: same logits for the same next tokens, same
 * recurrent state, same NextN head length; the source is untouched. */
Test(model, seq_copy_continues_like_the_source) {
    struct fixture f = open_model(2, 0, quant_cpu_level_detect(), 2);
    const int V = f.m->info.n_vocab;
    int32_t prompt[20], next[3];
    random_tokens(prompt, 20, V, 41);
    random_tokens(next, 3, V, 42);
    feed(&f, 1, next, 3, 0, false, NULL); /* something to overwrite in the destination */
    feed(&f, 0, prompt, 20, 0, false, NULL);
    /* the head's length travels with the copy: give it 7 rows of sequence 0 */
    const struct model_nextn *head = model_nextn(f.m);
    cr_assert(head);
    float *h_in = f.m->be->alloc(f.m->be, sizeof(float) * 7 * (size_t)f.m->info.n_embd);
    int32_t pos7[7], seq7[7] = {0};
    for (int i = 0; i < 7; i++) pos7[i] = i;
    struct model_batch hb = {.n = 7, .tokens = prompt, .pos = pos7, .seq = seq7};
    struct model_output ho;
    char err[256];
    cr_assert_eq(head->forward(f.m, &hb, h_in, &ho, err, sizeof err), 0, "%s", err);
    f.m->be->free(f.m->be, h_in);
    cr_assert_eq(head->seq_len(f.m, 0), 7);
    cr_assert_eq(model_seq_copy(f.m, 1, 0), 0);
    cr_assert_eq(model_seq_len(f.m, 1), 20);
    cr_assert_eq(head->seq_len(f.m, 1), 7);
    cr_assert(same_state(f.m, 0, 1), "recurrent state differs after the copy");
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
    feed(&f, 0, next, 3, 20, false, a);
    feed(&f, 1, next, 3, 20, false, b);
    cr_assert_eq(memcmp(a, b, sizeof(float) * V), 0, "the copy continues differently: %g", max_abs_diff(a, b, V));
    cr_assert_neq(model_seq_copy(f.m, 2, 0), 0, "a sequence out of range is refused");
    free(a); free(b);
    close_model(&f);
}

Test(model, bad_batches_are_rejected_without_changing_state) {
    struct fixture f = open_model(2, 0, quant_cpu_level_detect(), 1);
    char err[256];
    struct model_output o;
    int32_t tok[2] = {1, 2}, pos[2] = {0, 1}, badpos[2] = {1, 2}, seq[2] = {0, 0}, badseq[2] = {5, 5};
    int32_t badtok[2] = {1, 1 << 30};
    struct model_batch b1 = {.n = 2, .tokens = tok, .pos = badpos, .seq = seq};
    cr_assert_neq(model_forward(f.m, &b1, &o, err, sizeof err), 0);
    struct model_batch b2 = {.n = 2, .tokens = tok, .pos = pos, .seq = badseq};
    cr_assert_neq(model_forward(f.m, &b2, &o, err, sizeof err), 0);
    struct model_batch b3 = {.n = 2, .tokens = badtok, .pos = pos, .seq = seq};
    cr_assert_neq(model_forward(f.m, &b3, &o, err, sizeof err), 0);
    cr_assert(strstr(err, "token") != NULL, "message names the token: %s", err);
    cr_assert_eq(f.m->seq_len[0], 0);
    int32_t far = 600, one = 3;
    struct model_batch b4 = {.n = 1, .tokens = &one, .pos = &far};
    cr_assert_neq(model_forward(f.m, &b4, &o, err, sizeof err), 0);
    close_model(&f);
}

Test(model, simd_matches_reference_on_f32_model) {
    char path[128], cmd[256], err[256];
    snprintf(path, sizeof path, "/tmp/coti-test-model-%d.gguf", (int)getpid());
    snprintf(cmd, sizeof cmd, "./coti mkmodel --arch qwen35 -o %s --type f32 --seed 12 > /dev/null 2>&1", path);
    cr_assert_eq(system(cmd), 0, "mkmodel failed");
    struct backend *br = backend_cpu_init(1, QUANT_CPU_REF), *bs = backend_cpu_init(2, quant_cpu_level_detect());
    struct model *mr, *ms;
    struct model_params p = {1, 256, 64, 0, NULL, GGML_TYPE_F16, GGML_TYPE_F16, 0, 0};
    cr_assert_eq(model_load(&mr, path, br, &p, err, sizeof err), 0, "%s", err);
    cr_assert_eq(model_load(&ms, path, bs, &p, err, sizeof err), 0, "%s", err);
    struct fixture fr = {br, mr}, fs = {bs, ms};
    const int V = mr->info.n_vocab;
    int32_t t[48];
    random_tokens(t, 48, V, 5);
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
    feed(&fr, 0, t, 48, 0, false, a);
    feed(&fs, 0, t, 48, 0, false, b);
    /* f32 weights and activations: only summation order differs; logits are O(1) */
    float d = max_abs_diff(a, b, V);
    cr_assert_lt(d, 1e-4f, "f32 model, simd vs reference: max |dlogit| %g", d);
    free(a); free(b);
    close_model(&fr); close_model(&fs);
    remove(path);
}

/* The same random weights stored as F32 and as Q8_0 (mkmodel seeds each tensor from the run
 * seed and its name, whatever the type): the quantized model's logits stay close. Q8_0 keeps
 * ~8 bits per weight and per activation (step amax/127: ~0.6% relative RMS per dot product
 * for Gaussian values, weights and activations each); ~20 matmuls in sequence through a
 * random (untrained) network compound that to several percent — 8.5% measured for this seed.
 * A broken quantized path gives uncorrelated logits, a relative RMS difference near 1.4:
 * the bound of 0.15 separates the two. Random-weight logits are nearly flat, so argmax flips
 * are common and only reported. */
Test(model, q8_0_logits_close_to_f32) {
    char p32[128], p8[128], cmd[512], err[256];
    snprintf(p32, sizeof p32, "/tmp/coti-test-f32-%d.gguf", (int)getpid());
    snprintf(p8, sizeof p8, "/tmp/coti-test-q8-%d.gguf", (int)getpid());
    snprintf(cmd, sizeof cmd, "./coti mkmodel --arch qwen35 -o %s --type f32 --seed 21 > /dev/null 2>&1 && "
             "./coti mkmodel --arch qwen35 -o %s --type q8_0 --seed 21 > /dev/null 2>&1", p32, p8);
    cr_assert_eq(system(cmd), 0, "mkmodel failed");
    struct backend *b1 = backend_cpu_init(1, quant_cpu_level_detect()), *b2 = backend_cpu_init(1, quant_cpu_level_detect());
    struct model *m32, *m8;
    struct model_params p = {1, 256, 64, 0, NULL, GGML_TYPE_F16, GGML_TYPE_F16, 0, 0};
    cr_assert_eq(model_load(&m32, p32, b1, &p, err, sizeof err), 0, "%s", err);
    cr_assert_eq(model_load(&m8, p8, b2, &p, err, sizeof err), 0, "%s", err);
    struct fixture f32 = {b1, m32}, f8 = {b2, m8};
    const int V = m32->info.n_vocab;
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
    int32_t t[40];
    random_tokens(t, 40, V, 77);
    int agree = 0;
    double num = 0, den = 0;
    for (int i = 0; i < 40; i++) {
        feed(&f32, 0, t + i, 1, i, false, a);
        feed(&f8, 0, t + i, 1, i, false, b);
        agree += sample_argmax(a, V) == sample_argmax(b, V);
        for (int v = 0; v < V; v++) { num += (double)(a[v] - b[v]) * (a[v] - b[v]); den += (double)a[v] * a[v]; }
    }
    double rel = sqrt(num / den);
    cr_assert_lt(rel, 0.15, "Q8_0 vs F32 logits: relative RMS difference %.4f", rel);
    cr_assert_gt(rel, 1e-5, "Q8_0 and F32 logits identical: the comparison is not testing quantization");
    cr_log_info("Q8_0 vs F32: relative RMS %.4f, top-1 agreement %d/40", rel, agree);
    free(a); free(b);
    close_model(&f32); close_model(&f8);
    remove(p32); remove(p8);
}
