/* engine.c — engine set-up and the forward driver: batch validation, slicing, one pass per
 * slice (eager or through the graph cache), and the memory's bookkeeping after it. */
#include "engine/engine.h"
#include "engine/ranks.h"

#include <stdlib.h>
#include <string.h>

int engine_init(struct engine *e, struct model *m, const struct engine_params *p) {
    *e = (struct engine){.m = m, .n_vocab = p->n_vocab, .n_embd = p->n_embd, .window = p->window,
                         .softcap = p->softcap, .lm_head = p->lm_head, .draft_head = p->draft_head};
    memcpy(e->passes, p->passes, sizeof e->passes);
    m->engine = e;
    struct arena_slot *slots = calloc((size_t)p->n_slots + 5, sizeof *slots);
    if (!slots) return COTI_E_NOMEM;
    memcpy(slots, p->slots, sizeof *slots * (size_t)p->n_slots);
    const size_t nb = (size_t)m->n_batch;
    int n = p->n_slots;
    slots[n++] = (struct arena_slot){(void **)&e->hn, sizeof(float) * nb * (size_t)p->n_embd};
    if (p->passes[ENGINE_DRAFT_HEAD]) slots[n++] = (struct arena_slot){(void **)&e->hn_head, sizeof(float) * nb * (size_t)p->n_embd};
    slots[n++] = (struct arena_slot){(void **)&e->lm_in, sizeof(float) * nb * (size_t)p->n_embd};
    slots[n++] = (struct arena_slot){(void **)&e->logits, sizeof(float) * nb * (size_t)p->n_vocab};
    slots[n++] = (struct arena_slot){(void **)&e->meta.dev, batch_meta_bytes(m->n_batch)};
    e->arena = arena_alloc(m->be, slots, n);
    free(slots);
    e->len_scratch = malloc(sizeof(int32_t) * (size_t)m->n_seq);
    int rc = e->arena && e->len_scratch ? 0 : COTI_E_NOMEM;
    if (!rc) rc = batch_meta_init(&e->meta, m->n_batch);
    if (!rc) rc = graph_cache_init(&e->graphs, m->be, m->n_seq);
    struct memory_params mp = *p->mem;
    mp.n_embd = p->n_embd;
    if (!rc) rc = memory_init(&e->mem, m->be, &mp);
    m->seq_len = e->mem.seq_len;
    return rc;
}

int engine_init_fail(const struct model *m, int rc, char *err, size_t err_size) {
    const char *tk = ggml_type_traits_get(m->cache_type_k)->name, *tv = ggml_type_traits_get(m->cache_type_v)->name;
    if (rc == COTI_E_UNSUPPORTED)
        return coti_fail(err, err_size, rc,
                         "the %s backend has no KV cache of K type %s and V type %s for this model's heads (q8_0 and "
                         "q4_0 need head widths that are multiples of 32)",
                         m->be->name, tk, tv);
    const struct memory *mem = m->engine ? &m->engine->mem : NULL;
    const double mib = mem ? (mem->kv.bytes + mem->head.bytes) / 1048576.0 : 0.0;
    return coti_fail(err, err_size, rc,
                     "out of memory for activations/KV (n_seq %d, n_ctx %d, n_batch %d; KV cache %.1f MiB, K %s, V %s): "
                     "a smaller context (-c), fewer slots or a quantized cache (-ctk / -ctv q8_0) needs less",
                     m->n_seq, m->n_ctx, m->n_batch, mib, tk, tv);
}

void engine_free(struct engine *e) {
    if (!e->m) return;
    engine_ranks_free(e->ranks);
    struct backend *be = e->m->be;
    if (e->arena) be->free(be, e->arena);
    free(e->len_scratch);
    graph_cache_free(&e->graphs);
    batch_meta_free(&e->meta);
    memory_free(&e->mem);
    e->m->seq_len = NULL;
    *e = (struct engine){0};
}

struct pass_call {
    struct engine *e;
    enum engine_pass pass;
    const struct slice_ops_args *a;
};

static void pass_ops(void *ctx) {
    const struct pass_call *c = ctx;
    struct engine *e = c->e;
    const struct slice_ops_args *a = c->a;
    e->passes[c->pass](e->m, a);
    if (c->pass == ENGINE_TRUNK && a->accept_out && a->keep) {
        /* the rollback of the rejected drafts, here rather than after the host has read the
         * count: the state after the last accepted row (accept_out[0]) becomes the live one */
        memory_restore_at(&e->mem, a->sl->runs[0].seq, a->accept_out, a->sl->n);
    }
}

/* Queue one slice's pass (metadata already uploaded): a small slice on a backend with graphs
 * goes through the graph cache. */
static void run_pass(struct engine *e, enum engine_pass pass, const struct slice_ops_args *a) {
    struct backend *be = e->m->be;
    const struct slice *sl = a->sl;
    struct pass_call c = {e, pass, a};
    if (!be->capture_begin || sl->n_runs > GRAPH_MAX_RUNS || sl->n > GRAPH_MAX_ROWS) {
        pass_ops(&c);
        return;
    }
    struct graph_key key = {.pass = pass, .n = sl->n, .n_runs = sl->n_runs, .keep = a->keep,
                            .prompt = a->prompt,
                            .ptr = {a->h_in, a->logits, a->head, a->ids, a->argmax_out, a->accept_out, a->hn}};
    for (int r = 0; r < sl->n_runs; r++) key.runs[r] = (struct graph_run){sl->runs[r].seq, sl->runs[r].len};
    for (int i = 0; i < sl->n; i++) key.want |= (uint64_t)row_wants_logits(a->want, a->last_only, sl->n, i) << i;
    graph_cache_run(&e->graphs, &key, pass_ops, &c);
}

struct graph_stats engine_graph_stats(const struct model *m) {
    return m->engine ? m->engine->graphs.stats : (struct graph_stats){0};
}

static int forward_local(struct model *m, const struct model_batch *b, struct model_output *out, char *err,
                         size_t err_size) {
    struct engine *e = m->engine;
    if (b->n < 1) return coti_fail(err, err_size, COTI_E_ARG, "empty batch");
    /* the logits buffer holds n_batch rows */
    int want_total = 0;
    for (int i = 0; i < b->n; i++) want_total += b->want_logits ? b->want_logits[i] : (i == b->n - 1);
    if (want_total > m->n_batch)
        return coti_fail(err, err_size, COTI_E_ARG, "batch wants %d logit rows, at most %d", want_total, m->n_batch);
    if (b->accept_out && (!b->argmax_out || !b->tokens_dev || want_total != b->n || b->n > m->n_batch))
        return coti_fail(err, err_size, COTI_E_ARG, "a verify batch needs argmax_out, device tokens and logits on "
                         "every row, in one step of at most %d rows", m->n_batch);
    if (b->hidden_out && b->n > m->n_batch)
        return coti_fail(err, err_size, COTI_E_ARG, "hidden_out takes one step of at most %d rows", m->n_batch);
    /* All slices are validated before any state changes, so a bad batch leaves memory intact.
     * (Nothing here can fail on one rank of a split alone: the others would wait in their
     * all-reduce. Hence the lengths' scratch is the engine's.) */
    int32_t *len = e->len_scratch;
    memcpy(len, m->seq_len, sizeof(int32_t) * (size_t)m->n_seq);
    struct slice sl;
    for (int i0 = 0; i0 < b->n; i0 += m->n_batch) {
        slice_take(&sl, b, i0, COTI_MIN(m->n_batch, b->n - i0));
        int rc = slice_check(&sl, len, m->n_seq, m->n_ctx, e->n_vocab, err, err_size);
        if (!rc && b->accept_out && (sl.n_runs != 1 || (b->keep_states && b->n - 1 > m->n_keep_states)))
            rc = coti_fail(err, err_size, COTI_E_ARG, "a verify batch is one sequence's run of at most %d drafts",
                           m->n_keep_states);
        if (rc) return rc;
        for (int r = 0; r < sl.n_runs; r++) len[sl.runs[r].seq] += sl.runs[r].len;
    }

    int n_logits = 0;
    for (int i0 = 0; i0 < b->n; i0 += m->n_batch) {
        slice_take(&sl, b, i0, COTI_MIN(m->n_batch, b->n - i0));
        slice_check(&sl, m->seq_len, m->n_seq, m->n_ctx, e->n_vocab, NULL, 0);
        slice_upload(m->be, &e->meta, &sl, &e->mem.kv.full, &e->mem.kv.win, e->window);
        const struct slice_ops_args a = {.sl = &sl, .want = b->want_logits ? b->want_logits + i0 : NULL,
                                         .last_only = i0 + sl.n == b->n, .keep = b->keep_states,
                                         .logits = e->logits + (size_t)n_logits * e->n_vocab, .head = e->lm_head,
                                         .ids = sl.tokens_dev ? sl.tokens_dev : e->meta.tokens,
                                         .argmax_out = b->argmax_out ? b->argmax_out + n_logits : NULL,
                                         .accept_out = b->accept_out, .hn = b->hidden_out ? b->hidden_out : e->hn,
                                         .prompt = b->prompt};
        run_pass(e, ENGINE_TRUNK, &a);
        for (int r = 0; r < sl.n_runs; r++)
            memory_note_run(&e->mem, sl.runs[r].seq, sl.runs[r].len, b->keep_states, b->keep_states && b->accept_out);
        for (int i = 0; i < sl.n; i++) n_logits += row_wants_logits(a.want, a.last_only, sl.n, i);
    }
    /* hidden rows of the last slice only: callers needing every row keep batches <= n_batch */
    out->n = sl.n;
    out->hidden = b->hidden_out ? b->hidden_out : e->hn;
    out->n_logits = n_logits;
    out->logits = e->logits;
    return 0;
}

static int head_forward_local(struct model *m, const struct model_batch *b, const float *h_in,
                              struct model_output *out, char *err, size_t err_size) {
    struct engine *e = m->engine;
    if (!e->passes[ENGINE_DRAFT_HEAD]) return coti_fail(err, err_size, COTI_E_UNSUPPORTED, "model has no NextN head");
    if (b->n < 1 || b->n > m->n_batch)
        return coti_fail(err, err_size, COTI_E_ARG, "NextN batch of %d rows outside [1, %d]", b->n, m->n_batch);
    if (b->accept_out || b->hidden_out)
        return coti_fail(err, err_size, COTI_E_ARG, "the NextN head verifies nothing and keeps its hidden rows");
    struct slice sl;
    slice_take(&sl, b, 0, b->n);
    int rc = slice_check(&sl, e->mem.head_len, m->n_seq, m->n_ctx, e->n_vocab, err, err_size);
    if (rc) return rc;
    slice_upload(m->be, &e->meta, &sl, &e->mem.kv.full, &e->mem.kv.win, e->window);
    const struct slice_ops_args a = {.sl = &sl, .want = b->want_logits, .last_only = true, .logits = e->logits,
                                     .head = b->draft_head ? e->draft_head : e->lm_head, .h_in = h_in,
                                     .ids = sl.tokens_dev ? sl.tokens_dev : e->meta.tokens, .argmax_out = b->argmax_out,
                                     .hn = e->hn_head, .prompt = b->prompt};
    if (m->be->set_prompt) m->be->set_prompt(m->be, b->prompt);
    run_pass(e, ENGINE_DRAFT_HEAD, &a);
    if (m->be->set_prompt) m->be->set_prompt(m->be, 0);
    for (int r = 0; r < sl.n_runs; r++) e->mem.head_len[sl.runs[r].seq] += sl.runs[r].len;
    out->n = sl.n;
    out->hidden = e->hn_head;
    out->n_logits = 0;
    for (int i = 0; i < sl.n; i++) out->n_logits += row_wants_logits(a.want, a.last_only, sl.n, i);
    out->logits = e->logits;
    return 0;
}

/* ---- the ranks of a tensor-parallel split (ranks.h) ------------------------------------ */

/* A forward on every rank at once: rank 0 is the caller's, the others write their argmaxes, verify
 * counts and hidden rows to their own buffers (the same values: every rank holds the whole
 * residual stream after its all-reduces) and read the batch's inputs where the caller left them
 * (host memory on CPU ranks). The first failing rank's error is the call's. */
struct fan {
    const struct engine_ranks *rk;
    const struct model_batch *b;
    const float *h_in;           /* the NextN head's input rows (head) */
    bool head;
    struct model_output out[TP_MAX_RANKS];
    int rc[TP_MAX_RANKS];
    char err[TP_MAX_RANKS][256];
};

static void fan_forward(struct model *m, int rank, void *ctx) {
    struct fan *f = ctx;
    struct model_batch b = *f->b;
    if (rank) {
        const size_t nb = (size_t)m->n_batch;
        if (b.argmax_out) b.argmax_out = f->rk->ids[rank];
        if (b.accept_out) b.accept_out = f->rk->ids[rank] + nb;
        if (b.hidden_out) b.hidden_out = f->rk->hidden[rank];
    }
    f->rc[rank] = f->head ? head_forward_local(m, &b, f->h_in, &f->out[rank], f->err[rank], sizeof f->err[rank])
                          : forward_local(m, &b, &f->out[rank], f->err[rank], sizeof f->err[rank]);
}

static int fan_out(struct engine_ranks *rk, const struct model_batch *b, const float *h_in, bool head,
                   struct model_output *out, char *err, size_t err_size) {
    struct fan fan = {.rk = rk, .b = b, .h_in = h_in, .head = head}, *f = &fan;
    engine_ranks_run(rk, fan_forward, f);
    int rc = 0;
    for (int r = 0; r < rk->n && !rc; r++) {
        if (!(rc = f->rc[r])) continue;
        if (r) coti_fail(err, err_size, rc, "rank %d: %s", r, f->err[r]);
        else coti_fail(err, err_size, rc, "%s", f->err[0]);
    }
    if (!rc) *out = f->out[0];
    return rc;
}

int engine_forward(struct model *m, const struct model_batch *b, struct model_output *out, char *err, size_t err_size) {
    struct engine_ranks *rk = m->engine->ranks;
    return rk ? fan_out(rk, b, NULL, false, out, err, err_size) : forward_local(m, b, out, err, err_size);
}

static int head_forward(struct model *m, const struct model_batch *b, const float *h_in, struct model_output *out,
                        char *err, size_t err_size) {
    struct engine_ranks *rk = m->engine->ranks;
    return rk ? fan_out(rk, b, h_in, true, out, err, err_size) : head_forward_local(m, b, h_in, out, err, err_size);
}

/* The memory's operations on every rank in turn (rank 0's result: the ranks' memories are alike). */
#define EACH_RANK(m, r, mem) \
    for (int r = 0, n_r_ = (m)->engine->ranks ? (m)->engine->ranks->n : 1; r < n_r_; r++) \
        for (struct memory *mem = &((r ? (m)->engine->ranks->m[r] : (m))->engine->mem); mem; mem = NULL)

void engine_seq_reset(struct model *m, int s) { EACH_RANK(m, r, mem) memory_seq_reset(mem, s); }
int engine_seq_rollback(struct model *m, int s, int n_drop) {
    int rc = 0;
    EACH_RANK(m, r, mem) { const int k = memory_seq_rollback(mem, s, n_drop); if (!r) rc = k; }
    return rc;
}
int engine_seq_copy(struct model *m, int dst, int src) {
    int rc = 0;
    EACH_RANK(m, r, mem) { const int k = memory_seq_copy(mem, dst, src); if (!r) rc = k; }
    return rc;
}
long engine_seq_state_read(struct model *m, int s, float *dst, size_t n) { return rec_state_read(&m->engine->mem.rec, s, dst, n); }
void engine_seq_checkpoint(struct model *m, int s, const float *hidden) { EACH_RANK(m, r, mem) memory_checkpoint(mem, s, hidden); }
int engine_seq_resume_points(const struct model *m, int src, int p, int *q, const float **hidden, int max) {
    return memory_resume_points(&m->engine->mem, src, p, q, hidden, max);
}
int engine_seq_resume(struct model *m, int dst, int src, int q) {
    int rc = 0;
    EACH_RANK(m, r, mem) { const int k = memory_seq_resume(mem, dst, src, q); if (!r) rc = k; }
    return rc;
}

static int head_seq_len(const struct model *m, int s) { return m->engine->mem.head_len[s]; }
static void head_seq_truncate(struct model *m, int s, int n) { EACH_RANK(m, r, mem) memory_head_truncate(mem, s, n); }
static void head_seq_skip(struct model *m, int s, int n) { EACH_RANK(m, r, mem) memory_head_skip(mem, s, n); }

const struct model_nextn engine_nextn = {head_forward, head_seq_len, head_seq_truncate, head_seq_skip};
