/* assistant.c — external-drafter MTP: a gemma4-assistant model loaded from its own file
 * (--spec assistant --spec-draft FILE; llama.cpp's -md FILE --spec-type draft-mtp) drafts for a
 * gemma4 target. Step 1 of a round is (the pending token t_L, position L, the target's
 * post-norm hidden row of position L-1); step k is (draft d_{k-1}, the same position L, the
 * assistant's own next-hidden row of step k-1). Every step reads the target's committed cells
 * [0, L) through read-only views and writes nothing, so the drafter keeps no state that a
 * rejection could leave wrong: per sequence only the last hidden row the target accepted.
 * Greedy drafts never leave the device (each argmax feeds the next step and the verify batch),
 * and on a backend with graphs such a round's whole chain of steps is one recorded graph per
 * (sequence, draft count): its ~60 launches a step cost more than its arithmetic. */
#include <stdlib.h>
#include <string.h>

#include "drafters/drafter.h"
#include "engine/graphs.h"
#include "models/gemma4_assistant.h"

struct assistant_seq {
    float *h;                    /* backend [E]: the target's hidden row of position h_pos */
    int h_pos;                   /* -1: none yet */
};

struct assistant {
    struct drafter base;
    struct model *m;
    struct gemma4_assistant *a;
    int E;
    struct assistant_seq *seqs;
    int32_t *d_tok;              /* backend: a sampled draft from the host */
    struct draft_picker pick;
    struct graph_cache chains;   /* recorded greedy rounds (backends with graphs) */
};

static struct assistant *as_of(struct drafter *d) { return (struct assistant *)d; }

static void assistant_free(struct drafter *d) {
    struct assistant *t = as_of(d);
    struct backend *be = t->m->be;
    for (int s = 0; t->seqs && s < t->m->n_seq; s++) if (t->seqs[s].h) be->free(be, t->seqs[s].h);
    if (t->d_tok) be->free(be, t->d_tok);
    draft_picker_free(&t->pick);
    graph_cache_free(&t->chains);
    gemma4_assistant_free(t->a);
    free(t->seqs);
    free(t);
}

static void assistant_reset(struct drafter *d, int s) { as_of(d)->seqs[s].h_pos = -1; }

/* Each sequence's last row, the rows of all in one copy_n. */
static int assistant_observe(struct drafter *d, int n, const struct draft_observed *seen, char *err, size_t err_size) {
    struct assistant *t = as_of(d);
    void *dst[SPEC_MAX_BATCH];
    const void *src[SPEC_MAX_BATCH];
    size_t bytes[SPEC_MAX_BATCH];
    int nc = 0;
    if (n > SPEC_MAX_BATCH) return coti_fail(err, err_size, COTI_E_ARG, "assistant: %d sequences observed at once", n);
    for (int i = 0; i < n; i++) {
        const struct draft_observed *o = &seen[i];
        if (o->n < 1) continue;
        dst[nc] = t->seqs[o->s].h;
        src[nc] = o->hidden + (size_t)(o->n - 1) * t->E;
        bytes[nc++] = sizeof(float) * (size_t)t->E;
        t->seqs[o->s].h_pos = o->pos0 + o->n - 1;
    }
    if (nc) t->m->be->copy_n(t->m->be, dst, src, bytes, nc);
    return 0;
}

/* A greedy round of n steps whose picks stay on the device: no step depends on the host. */
struct chain_call {
    struct assistant *t;
    const int32_t *tok0;
    const float *h0;
    int32_t *dev_tokens;
    int n;
};

static void chain_ops(void *ctx) {
    const struct chain_call *c = ctx;
    const float *logits, *h = c->h0;
    const int32_t *tok = c->tok0;
    for (int i = 0; i < c->n; i++) {
        gemma4_assistant_step(c->t->a, tok, h, c->dev_tokens + i, &logits, &h);
        tok = c->dev_tokens + i;
    }
}

static int assistant_draft(struct drafter *d, int s, const struct draft_request *rq, struct draft_result *out, char *err,
                           size_t err_size) {
    struct assistant *t = as_of(d);
    struct model *m = t->m;
    struct backend *be = m->be;
    const int L = rq->L;
    out->n = 0;
    if (t->seqs[s].h_pos != L - 1)
        return coti_fail(err, err_size, COTI_E_ARG, "assistant: the last hidden row is of position %d, expected %d",
                         t->seqs[s].h_pos, L - 1);
    out->on_device = !rq->sampler;
    const bool want_p = out->on_device && rq->p_min > 0.0f;
    const bool pick_in_step = out->on_device && !want_p;
    const int32_t *tok = gemma4_assistant_at(t->a, s, L, rq->history[L]);
    if (pick_in_step && be->capture_begin && L + rq->n_max < m->n_ctx) {
        /* the key: the buffers the chain reads and writes besides the assistant's own */
        struct graph_key key = {.n = rq->n_max, .n_runs = 1, .runs = {{s, rq->n_max}}, .ptr = {t->seqs[s].h, rq->dev_tokens}};
        struct chain_call c = {t, tok, t->seqs[s].h, rq->dev_tokens, rq->n_max};
        graph_cache_run(&t->chains, &key, chain_ops, &c);
        out->n = rq->n_max;
        return 0;
    }
    const float *logits, *h;
    gemma4_assistant_step(t->a, tok, t->seqs[s].h, pick_in_step ? rq->dev_tokens : NULL, &logits, &h);
    for (int i = 0; i < rq->n_max; i++) {
        if (!draft_pick(&t->pick, logits, rq, i, out)) break;
        out->n++;
        if (i + 1 == rq->n_max || L + i + 1 >= m->n_ctx) break;
        tok = rq->dev_tokens + i;
        if (!out->on_device) {
            be->upload(be, t->d_tok, &out->tokens[i], sizeof(int32_t));
            tok = t->d_tok;
        }
        gemma4_assistant_step(t->a, tok, h, pick_in_step ? rq->dev_tokens + i + 1 : NULL, &logits, &h);
    }
    return 0;
}

/* A round starts from the target's hidden row of the position before it: that row is all. */
static bool assistant_can_resume(const struct drafter *d, int src, int q, const float *hidden) { return hidden && q >= 1; }

static void assistant_resume(struct drafter *d, int s, int q, const float *hidden) {
    struct assistant *t = as_of(d);
    t->m->be->copy(t->m->be, t->seqs[s].h, hidden, sizeof(float) * (size_t)t->E);
    t->seqs[s].h_pos = q - 1;
}

static const struct drafter_vtable assistant_vtable = {
    .free = assistant_free, .reset = assistant_reset, .observe = assistant_observe, .draft = assistant_draft,
    .can_resume = assistant_can_resume, .resume = assistant_resume,
};

/* Not for a target split into ranks: the assistant's model would sit on rank 0's backend, whose
 * all_reduce waits for ranks that never run it. */
static bool assistant_available(const struct drafter_config *c) { return c->draft_path != NULL && !c->m->be->comm; }

static int assistant_init(struct drafter **out, const struct drafter_config *c, char *err, size_t err_size) {
    struct model *m = c->m;
    if (!c->draft_path)
        return coti_fail(err, err_size, COTI_E_ARG, "--spec assistant needs the drafter's file (--spec-draft FILE)");
    if (m->be->comm)
        return coti_fail(err, err_size, COTI_E_UNSUPPORTED, "the assistant drafter on a tensor-parallel split is not built yet");
    struct assistant *t = calloc(1, sizeof *t);
    if (!t) return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory");
    t->base.vt = &assistant_vtable;
    t->m = m;
    t->E = m->info.n_embd;
    t->base.n_vocab = m->info.n_vocab;
    t->base.draft_is_pure = true; /* a round reads the target and its per-sequence row only */
    int rc = gemma4_assistant_load(&t->a, c->draft_path, m, err, err_size);
    if (rc) { assistant_free(&t->base); return rc; }
    struct backend *be = m->be;
    t->seqs = calloc((size_t)m->n_seq, sizeof *t->seqs);
    t->d_tok = be->alloc(be, sizeof(int32_t));
    bool ok = t->seqs && t->d_tok && draft_picker_init(&t->pick, be, m->info.n_vocab) == 0 &&
              graph_cache_init(&t->chains, be, m->n_seq) == 0;
    for (int s = 0; ok && s < m->n_seq; s++) {
        ok = (t->seqs[s].h = be->alloc(be, sizeof(float) * (size_t)t->E)) != NULL;
        t->seqs[s].h_pos = -1;
    }
    if (!ok) { assistant_free(&t->base); return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory for the assistant drafter"); }
    *out = &t->base;
    return 0;
}

const struct drafter_kind drafter_kind_assistant = {
    .name = "assistant", .llama_name = "draft-mtp", .available = assistant_available, .init = assistant_init,
};
