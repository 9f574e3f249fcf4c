/* mtp.c — NextN self-speculation: the target's own MTP head drafts (arch-qwen35.md §7).
 * Row q of the head takes (token x_q, the target's post-norm hidden hn_{q-1}) and predicts
 * x_{q+1}; its attention reads the head's own KV cache, which holds one entry per position
 * the target has accepted. Chained drafts feed the head's own output hidden back.
 *
 * Per sequence the drafter stages the target hidden rows it has not consumed yet:
 * staged row r = hn at position len-1+r (len: the head's seq_len) (row 0 = zeros before the first token). A draft
 * call runs every pending catch-up row AND the first draft row in one batch of the head —
 * after a verify that accepted a drafts that is a+1 rows for the price of about one — then
 * chains single rows for further drafts, and finally truncates the head's cache to the
 * pending token's row, which was computed from the true hidden and stays valid. Greedy drafts
 * never leave the device: each argmax feeds the next row's embedding lookup and the verify
 * batch, so drafting queues work without waiting for the host. Several sequences' greedy
 * drafts run together (mtp_draft_batch): their catch-up rows in one batch of the head, then one
 * row per sequence per chained step.
 * Where the backend queues work, the head follows a greedy verify before its acceptance is known
 * (mtp_observe_ahead, llama.cpp's process() over every decoded batch): row q of the verify
 * batch with the target's argmax of it is the head's row q + 1, right if the drafts up to it are
 * kept; observe then drops the head's rows past the kept ones, and the next draft starts from the
 * pending token's row, already run: no catch-up forward, and at depth 1 no forward at all. A
 * prompt's rows are caught up as they are observed (the prompt's time, as in llama.cpp). */
#include <stdlib.h>
#include <string.h>

#include "drafters/drafter.h"

struct mtp_seq {
    float *staged;               /* backend memory, [cap][n_embd] */
    int n_staged;
    /* ahead_L >= 0: the head ran ahead over the ahead_n verify rows from position ahead_L
     * (their rows of the head are its positions ahead_L + 1 ..), the stage holds its output
     * rows and ahead_ids their argmaxes; observe keeps the accepted ones. pending >= 0: the row
     * of those that is the pending token's, where the next draft starts. */
    int ahead_L, ahead_n, pending;
};

struct mtp {
    struct drafter base;
    struct model *m;
    const struct model_nextn *head;
    int cap;                     /* staged rows per sequence = n_batch of the model */
    int E;
    struct mtp_seq *seqs;
    float *h_zero;               /* backend memory, [E] zeros: hn_{-1} */
    int32_t *pos, *tok, *seqv;   /* host, [cap] */
    bool *want;
    struct draft_picker pick;
    /* gathered rows of several sequences (mtp_draft_batch: up to MTP_BATCH_ROWS of each;
     * consume_stages: prompts' rows, at most n_batch in all) */
    int batch_rows;              /* max(n_seq * MTP_BATCH_ROWS, n_batch) */
    int32_t *bpos, *btok, *bseqv; /* host, [batch_rows] */
    bool *bwant;
    float *bh_in, *bh_chain;     /* backend, [batch_rows][E] / [n_seq][E]: gathered input rows */
    int32_t *bids[2];            /* backend, [n_seq]: one step's argmaxes (the next step's tokens) */
    /* mtp_observe_ahead: backend, [batch_rows] the rows' tokens and the head's argmaxes in batch
     * order; [n_seq][MTP_BATCH_ROWS] the argmaxes of each sequence's rows run ahead */
    int32_t *btok_dev, *bids_all, *ahead_ids;
};

/* Catch-up rows a sequence may bring to a batched draft: those of a verify (accepted drafts,
 * the target's token) and one more; a longer stage (after a prompt) drafts alone. */
#define MTP_BATCH_ROWS (SPEC_MAX_DRAFT + 2)

static struct mtp *mtp_of(struct drafter *d) { return (struct mtp *)d; }

static void ahead_clear(struct mtp_seq *sq) {
    sq->ahead_L = -1;
    sq->ahead_n = 0;
    sq->pending = -1;
}

static int32_t *ahead_id(const struct mtp *t, int s, int row) { return t->ahead_ids + (size_t)s * MTP_BATCH_ROWS + row; }

/* The position of the next row observe takes: the pending token's (staged rows end before it). */
static int observe_next(const struct mtp *t, int s) {
    const struct mtp_seq *sq = &t->seqs[s];
    return sq->ahead_L >= 0 ? sq->ahead_L : t->head->seq_len(t->m, s) - 1 + sq->n_staged;
}

/* The head's forward. Its rows are drafts, never a verify's, so the backend may compute them
 * as it computes a prompt of as many rows (model.h's prompt family): a long prompt's catch-up
 * runs on the many-row kernels, a draft of a few rows on the decode kernels. */
static int head_forward(struct mtp *t, const struct model_batch *b, const float *h_in, struct model_output *o,
                        char *err, size_t err_size) {
    struct model_batch pb = *b;
    pb.prompt = model_prompt_family(t->m, b->n);
    return t->head->forward(t->m, &pb, h_in, o, err, err_size);
}
static size_t row_bytes(const struct mtp *t) { return sizeof(float) * (size_t)t->E; }

static void mtp_free(struct drafter *d) {
    struct mtp *t = mtp_of(d);
    struct backend *be = t->m->be;
    for (int s = 0; s < t->m->n_seq && t->seqs; s++) if (t->seqs[s].staged) be->free(be, t->seqs[s].staged);
    if (t->h_zero) be->free(be, t->h_zero);
    if (t->bh_in) be->free(be, t->bh_in);
    if (t->bh_chain) be->free(be, t->bh_chain);
    for (int i = 0; i < 2; i++) if (t->bids[i]) be->free(be, t->bids[i]);
    if (t->btok_dev) be->free(be, t->btok_dev);
    if (t->bids_all) be->free(be, t->bids_all);
    if (t->ahead_ids) be->free(be, t->ahead_ids);
    draft_picker_free(&t->pick);
    free(t->seqs); free(t->pos); free(t->tok); free(t->seqv); free(t->want);
    free(t->bpos); free(t->btok); free(t->bseqv); free(t->bwant);
    free(t);
}

static void mtp_reset(struct drafter *d, int s) {
    struct mtp *t = mtp_of(d);
    struct backend *be = t->m->be;
    t->head->seq_truncate(t->m, s, 0);
    /* hn_{-1} = 0: the first row of a sequence sees a zero hidden */
    be->copy(be, t->seqs[s].staged, t->h_zero, sizeof(float) * t->E);
    t->seqs[s].n_staged = 1;
    ahead_clear(&t->seqs[s]);
}

/* Run the head over staged rows [0, n_rows) (positions from the head's seq_len), logits on the last row if
 * want_last (and its argmax into argmax_out, backend memory, unless NULL). Consumes those rows
 * from the stage. */
static int mtp_run_rows(struct mtp *t, int s, const int32_t *history, int n_rows, bool want_last,
                        int32_t *argmax_out, struct model_output *o, char *err, size_t err_size) {
    struct model *m = t->m;
    const int q0 = t->head->seq_len(m, s);
    for (int i = 0; i < n_rows; i++) {
        t->pos[i] = q0 + i;
        t->tok[i] = history[q0 + i];
        t->want[i] = want_last && i == n_rows - 1;
    }
    for (int i = 0; i < n_rows; i++) t->seqv[i] = s;
    struct model_batch b = {.n = n_rows, .tokens = t->tok, .pos = t->pos, .seq = t->seqv, .want_logits = t->want,
                            .draft_head = true, .argmax_out = argmax_out};
    return head_forward(t, &b, t->seqs[s].staged, o, err, err_size);
}

/* The head over every staged row but the last, which becomes row 0 (a full stage; a prompt). */
static int consume_stage(struct mtp *t, int s, const int32_t *history, char *err, size_t err_size) {
    struct mtp_seq *sq = &t->seqs[s];
    if (sq->n_staged < 2) return 0;
    struct model_output out;
    int rc = mtp_run_rows(t, s, history, sq->n_staged - 1, false, NULL, &out, err, err_size);
    if (rc) return rc;
    t->m->be->copy(t->m->be, sq->staged, sq->staged + (size_t)(sq->n_staged - 1) * t->E, row_bytes(t));
    sq->n_staged = 1;
    return 0;
}

/* Rows of several sequences' stages gathered into bh_in for one head forward (consume_stages, the
 * catch-up of mtp_draft_batch): their host metadata in bpos / btok / bseqv / bwant, one copy each. */
struct gather {
    int s[SPEC_MAX_BATCH], n, rows;
    void *dst[SPEC_MAX_BATCH];
    const void *src[SPEC_MAX_BATCH];
    size_t bytes[SPEC_MAX_BATCH];
};

/* The first k staged rows of sequence s (positions from the head's seq_len), logits on the last
 * if want_last. */
static void gather_add(struct mtp *t, struct gather *g, int s, const int32_t *history, int k, bool want_last) {
    const int q0 = t->head->seq_len(t->m, s);
    for (int r = 0; r < k; r++) {
        t->bpos[g->rows + r] = q0 + r;
        t->btok[g->rows + r] = history[q0 + r];
        t->bseqv[g->rows + r] = s;
        t->bwant[g->rows + r] = want_last && r == k - 1;
    }
    g->dst[g->n] = t->bh_in + (size_t)g->rows * t->E;
    g->src[g->n] = t->seqs[s].staged;
    g->bytes[g->n] = row_bytes(t) * (size_t)k;
    g->s[g->n++] = s;
    g->rows += k;
}

/* The head over the gathered rows; each of their stages keeps its last row as row 0. */
static int gather_consume(struct mtp *t, struct gather *g, char *err, size_t err_size) {
    struct backend *be = t->m->be;
    if (!g->n) return 0;
    be->copy_n(be, g->dst, g->src, g->bytes, g->n);
    struct model_batch b = {.n = g->rows, .tokens = t->btok, .pos = t->bpos, .seq = t->bseqv, .want_logits = t->bwant,
                            .draft_head = true};
    struct model_output o;
    int rc = head_forward(t, &b, t->bh_in, &o, err, err_size);
    if (rc) return rc;
    for (int j = 0; j < g->n; j++) {
        struct mtp_seq *sq = &t->seqs[g->s[j]];
        g->dst[j] = sq->staged;
        g->src[j] = sq->staged + (size_t)(sq->n_staged - 1) * t->E;
        g->bytes[j] = row_bytes(t);
        sq->n_staged = 1;
    }
    be->copy_n(be, g->dst, g->src, g->bytes, g->n);
    g->n = g->rows = 0;
    return 0;
}

/* consume_stage for the prompts among seen[0, n), the short ones' rows together in head forwards
 * of at most n_batch rows: a batched prefill's catch-up reads the head's weights once per
 * forward, not once per prompt (16 streams on the H100: ~10 ms more to the first token with a
 * forward per prompt). */
static int consume_stages(struct mtp *t, int n, const struct draft_observed *seen, char *err, size_t err_size) {
    const int n_batch = t->m->n_batch;
    struct gather g = {.n = 0};
    for (int i = 0; i < n; i++) {
        const int s = seen[i].s, k = seen[i].prompt ? t->seqs[s].n_staged - 1 : 0;
        int rc;
        if (k < 1) continue;
        if (k > n_batch / 2) { /* a long one alone */
            if ((rc = consume_stage(t, s, seen[i].history, err, err_size))) return rc;
            continue;
        }
        if (g.rows + k > n_batch && (rc = gather_consume(t, &g, err, err_size))) return rc;
        gather_add(t, &g, s, seen[i].history, k, false);
    }
    return gather_consume(t, &g, err, err_size);
}

/* One sequence's accepted rows into its stage; a full stage (a long prompt) is consumed by the
 * head first. */
static int observe_one(struct mtp *t, const struct draft_observed *o, char *err, size_t err_size) {
    struct backend *be = t->m->be;
    struct mtp_seq *sq = &t->seqs[o->s];
    const size_t row = row_bytes(t);
    const float *hidden = o->hidden;
    int n = o->n;
    while (n > 0) {
        float *dst = sq->staged + (size_t)sq->n_staged * t->E;
        int room = t->cap - sq->n_staged;
        if (room == 0) {
            int rc = consume_stage(t, o->s, o->history, err, err_size);
            if (rc) return rc;
            continue;
        }
        int k = COTI_MIN(room, n);
        if (hidden != dst) be->copy(be, dst, hidden, row * (size_t)k); /* else written there (hidden_dest) */
        sq->n_staged += k;
        hidden += (size_t)k * t->E;
        n -= k;
    }
    return 0;
}

/* The rows that fit their stages go in one copy_n (a batched cycle's were a call per sequence,
 * its glue), before any head forward a full stage runs, which may reuse the memory they are
 * read from. */
static int mtp_observe(struct drafter *d, int n, const struct draft_observed *seen, char *err, size_t err_size) {
    struct mtp *t = mtp_of(d);
    struct backend *be = t->m->be;
    void *dst[SPEC_MAX_BATCH];
    const void *src[SPEC_MAX_BATCH];
    size_t bytes[SPEC_MAX_BATCH];
    int nc = 0;
    bool fits[SPEC_MAX_BATCH];
    if (n > SPEC_MAX_BATCH) return coti_fail(err, err_size, COTI_E_ARG, "mtp: %d sequences observed at once", n);
    /* every position checked before any stage moves: an error leaves them all as they were */
    for (int i = 0; i < n; i++) {
        const struct mtp_seq *sq = &t->seqs[seen[i].s];
        if (seen[i].pos0 != observe_next(t, seen[i].s) || (sq->ahead_L >= 0 && seen[i].n > sq->ahead_n))
            return coti_fail(err, err_size, COTI_E_ARG, "mtp: observed position %d does not follow the staged rows",
                             seen[i].pos0);
    }
    for (int i = 0; i < n; i++) {
        const struct draft_observed *o = &seen[i];
        struct mtp_seq *sq = &t->seqs[o->s];
        if (sq->ahead_L >= 0) { /* run ahead: the kept rows are the head's already, the rest go */
            t->head->seq_truncate(t->m, o->s, o->pos0 + o->n + 1);
            sq->ahead_L = -1;
            sq->pending = o->n - 1;
            fits[i] = true;
            continue;
        }
        sq->pending = -1;
        fits[i] = sq->n_staged + o->n <= t->cap;
        if (!fits[i]) continue;
        float *to = sq->staged + (size_t)sq->n_staged * t->E;
        if (o->hidden != to && o->n > 0) { /* else written there (hidden_dest) */
            dst[nc] = to;
            src[nc] = o->hidden;
            bytes[nc++] = row_bytes(t) * (size_t)o->n;
        }
        sq->n_staged += o->n;
    }
    if (nc) be->copy_n(be, dst, src, bytes, nc);
    for (int i = 0; i < n; i++) {
        int rc = fits[i] ? 0 : observe_one(t, &seen[i], err, err_size);
        if (rc) return rc;
    }
    return consume_stages(t, n, seen, err, err_size);
}

/* drafter.h observe_ahead: the head over every row of the sequences whose head holds the
 * verify's pending row (they drafted this cycle, nothing is staged), the target's argmax as each
 * row's token; its output rows into their stages, which the next draft starts from. */
static int mtp_observe_ahead(struct drafter *d, int n, const struct draft_observed *rows, bool *ran, char *err,
                             size_t err_size) {
    struct mtp *t = mtp_of(d);
    struct model *m = t->m;
    struct backend *be = m->be;
    const size_t row = row_bytes(t);
    int idx[SPEC_MAX_BATCH], nr = 0, total = 0;
    void *dst[2 * SPEC_MAX_BATCH];
    const void *src[2 * SPEC_MAX_BATCH];
    size_t bytes[2 * SPEC_MAX_BATCH];
    bool in_place = true; /* the rows follow each other where the target left them (a whole batch) */
    if (n > SPEC_MAX_BATCH) return coti_fail(err, err_size, COTI_E_ARG, "mtp: %d sequences run ahead at once", n);
    for (int i = 0; i < n; i++) {
        const struct draft_observed *o = &rows[i];
        const struct mtp_seq *sq = &t->seqs[o->s];
        ran[i] = false;
        if (!o->ids || o->n < 1 || o->n > MTP_BATCH_ROWS || total + o->n > m->n_batch || sq->n_staged != 0 ||
            sq->ahead_L >= 0 || t->head->seq_len(m, o->s) != o->pos0 + 1 || o->pos0 + o->n >= m->n_ctx)
            continue; /* observe stages its rows as usual */
        for (int r = 0; r < o->n; r++) {
            t->bpos[total + r] = o->pos0 + 1 + r;
            t->bseqv[total + r] = o->s;
            t->bwant[total + r] = true;
        }
        in_place = in_place && (!nr || (o->hidden == rows[idx[0]].hidden + (size_t)total * t->E &&
                                        o->ids == rows[idx[0]].ids + total));
        dst[2 * nr] = t->bh_in + (size_t)total * t->E;
        src[2 * nr] = o->hidden;
        bytes[2 * nr] = row * (size_t)o->n;
        dst[2 * nr + 1] = t->btok_dev + total;
        src[2 * nr + 1] = o->ids;
        bytes[2 * nr + 1] = sizeof(int32_t) * (size_t)o->n;
        idx[nr++] = i;
        total += o->n;
    }
    if (!nr) return 0;
    /* (the head writes its hidden rows apart from the target's: engine.h hn_head) */
    if (!in_place) be->copy_n(be, dst, src, bytes, 2 * nr);
    struct model_batch b = {.n = total, .tokens_dev = in_place ? rows[idx[0]].ids : t->btok_dev, .pos = t->bpos,
                            .seq = t->bseqv, .want_logits = t->bwant, .draft_head = true, .argmax_out = t->bids_all};
    struct model_output o;
    int rc = head_forward(t, &b, in_place ? rows[idx[0]].hidden : t->bh_in, &o, err, err_size);
    if (rc) return rc;
    total = 0;
    for (int j = 0; j < nr; j++) {
        const struct draft_observed *r = &rows[idx[j]];
        struct mtp_seq *sq = &t->seqs[r->s];
        dst[2 * j] = sq->staged;
        src[2 * j] = o.hidden + (size_t)total * t->E;
        bytes[2 * j] = row * (size_t)r->n;
        dst[2 * j + 1] = ahead_id(t, r->s, 0);
        src[2 * j + 1] = t->bids_all + total;
        bytes[2 * j + 1] = sizeof(int32_t) * (size_t)r->n;
        sq->ahead_L = r->pos0;
        sq->ahead_n = r->n;
        sq->pending = -1;
        ran[idx[j]] = true;
        total += r->n;
    }
    be->copy_n(be, dst, src, bytes, 2 * nr);
    return 0;
}

static int mtp_draft(struct drafter *d, int s, const struct draft_request *rq, struct draft_result *out,
                     char *err, size_t err_size) {
    struct mtp *t = mtp_of(d);
    struct model *m = t->m;
    struct mtp_seq *sq = &t->seqs[s];
    out->n = 0;
    /* the stage must reach hn_{L-1}: rows len..L are then computable */
    if (t->head->seq_len(m, s) - 1 + sq->n_staged != rq->L)
        return coti_fail(err, err_size, COTI_E_ARG, "mtp: staged hidden rows end at %d, expected %d",
                         t->head->seq_len(m, s) - 1 + sq->n_staged, rq->L);
    /* greedy drafts stay on the device: draft i is the argmax written into dev_tokens[i],
     * which the next chained row and the verify batch read there; without a p_min check the
     * argmax is part of the head's forward (its probability costs a softmax pass and a sync) */
    out->on_device = !rq->sampler;
    const bool want_p = out->on_device && rq->p_min > 0.0f;
    const bool pick_in_forward = out->on_device && !want_p;
    struct model_output o = {0};
    const float *h_prev; /* the hidden the next chained row reads */
    int rc;
    if (sq->pending >= 0) {
        /* the head ran the pending token's row ahead: its argmax is the first draft (the driver
         * runs ahead only for drafts picked in the forward, which read no logits here) */
        if (!pick_in_forward)
            return coti_fail(err, err_size, COTI_E_ARG, "mtp: a row run ahead needs greedy drafts without p_min");
        t->m->be->copy(t->m->be, rq->dev_tokens, ahead_id(t, s, sq->pending), sizeof(int32_t));
        h_prev = sq->staged + (size_t)sq->pending * t->E;
        out->catch_up = 0;
    } else {
        out->catch_up = sq->n_staged - 1;
        /* a brim-full stage (n_batch + 1 rows: cycles that staged rows without drafting) is one
         * row more than a head forward takes */
        if (sq->n_staged > m->n_batch && (rc = consume_stage(t, s, rq->history, err, err_size))) return rc;
        rc = mtp_run_rows(t, s, rq->history, sq->n_staged, true, pick_in_forward ? rq->dev_tokens : NULL, &o, err, err_size);
        if (rc) return rc;
        h_prev = o.hidden + (size_t)(o.n - 1) * t->E;
    }
    const int L = rq->L;
    for (int i = 0; i < rq->n_max; i++) {
        if (!draft_pick(&t->pick, o.logits, rq, i, out)) break;
        out->n++;
        if (i + 1 == rq->n_max || L + i + 1 >= m->n_ctx) break;
        /* chain: row (d_i, L+1+i, the head's own hidden), read where the head left it (its
         * output rows are written only after its input norm has read them) */
        int32_t pos = L + 1 + i, seqv = s;
        bool want = true;
        struct model_batch b = {.n = 1, .pos = &pos, .seq = &seqv, .want_logits = &want, .draft_head = true,
                                .argmax_out = pick_in_forward ? rq->dev_tokens + i + 1 : NULL};
        if (out->on_device) b.tokens_dev = rq->dev_tokens + i;
        else b.tokens = &out->tokens[i];
        rc = head_forward(t, &b, h_prev, &o, err, err_size);
        if (rc) return rc;
        h_prev = o.hidden;
    }
    /* keep the pending token's row (computed from the true hidden); drop the chained ones */
    t->head->seq_truncate(m, s, L + 1);
    sq->n_staged = 0;
    sq->pending = -1;
    return 0;
}

/* Greedy drafts of several sequences (drafter.h): the chains of mtp_draft, step by step across
 * the sequences. The sequences go in order of decreasing n_max, so those still drafting at a
 * step are a prefix of the previous step's, whose argmaxes (the step's tokens) and output
 * hidden rows are then the first rows of the previous output. A sequence whose stage holds
 * more than MTP_BATCH_ROWS rows drafts on its own first. */
static int mtp_draft_batch(struct drafter *d, int n, const int *seqs, const struct draft_request *rq, struct draft_result *out,
                           char *err, size_t err_size) {
    struct mtp *t = mtp_of(d);
    struct model *m = t->m;
    struct backend *be = m->be;
    const size_t row = sizeof(float) * (size_t)t->E;
    int ord[SPEC_MAX_BATCH], n_ord = 0, rows_in = 0;
    if (n > SPEC_MAX_BATCH) return coti_fail(err, err_size, COTI_E_ARG, "mtp: %d sequences in a batch", n);
    for (int i = 0; i < n; i++) {
        out[i] = (struct draft_result){.on_device = true}; /* greedy drafts: no q (the driver reads it) */
        const struct mtp_seq *sq = &t->seqs[seqs[i]];
        if (t->head->seq_len(m, seqs[i]) - 1 + sq->n_staged != rq[i].L)
            return coti_fail(err, err_size, COTI_E_ARG, "mtp: staged hidden rows end at %d, expected %d",
                             t->head->seq_len(m, seqs[i]) - 1 + sq->n_staged, rq[i].L);
        if (rq[i].n_max < 1) continue;
        if (sq->n_staged > MTP_BATCH_ROWS || rows_in + sq->n_staged > m->n_batch) {
            int rc = mtp_draft(d, seqs[i], &rq[i], &out[i], err, err_size);
            if (rc) return rc;
            continue;
        }
        rows_in += sq->n_staged;
        out[i].catch_up = sq->pending >= 0 ? 0 : sq->n_staged - 1;
        int at = n_ord++; /* insertion by decreasing n_max */
        while (at > 0 && rq[ord[at - 1]].n_max < rq[i].n_max) { ord[at] = ord[at - 1]; at--; }
        ord[at] = i;
    }
    if (!n_ord) return 0;
    /* the per-sequence copies of each phase go in one copy_n (a launch, not a call per
     * sequence: their host time was the batched cycle's glue) */
    void *dst[3 * SPEC_MAX_BATCH];
    const void *src[3 * SPEC_MAX_BATCH];
    size_t bytes[3 * SPEC_MAX_BATCH];
    /* catch-up: the staged rows of every sequence the head did not run ahead for, logits (and
     * the argmax: draft 0) on each one's last */
    struct gather g = {.n = 0};
    for (int j = 0; j < n_ord; j++) {
        const int i = ord[j];
        if (t->seqs[seqs[i]].pending < 0) gather_add(t, &g, seqs[i], rq[i].history, t->seqs[seqs[i]].n_staged, true);
    }
    struct model_output o = {0};
    int rc;
    if (g.n) {
        be->copy_n(be, g.dst, g.src, g.bytes, g.n);
        struct model_batch b = {.n = g.rows, .tokens = t->btok, .pos = t->bpos, .seq = t->bseqv, .want_logits = t->bwant,
                                .draft_head = true, .argmax_out = t->bids_all};
        if ((rc = head_forward(t, &b, t->bh_in, &o, err, err_size))) return rc;
    }
    /* each sequence's draft 0 (into its verify tokens, and in order for the chain's first step)
     * and the hidden its chain goes on from: its last caught-up row, or the pending token's row
     * run ahead */
    int rows = 0;
    for (int j = 0, w = 0; j < n_ord; j++) {
        const int i = ord[j];
        const struct mtp_seq *sq = &t->seqs[seqs[i]];
        const int32_t *id;
        if (sq->pending >= 0) {
            id = ahead_id(t, seqs[i], sq->pending);
            src[3 * j + 2] = sq->staged + (size_t)sq->pending * t->E;
        } else {
            rows += sq->n_staged;
            id = t->bids_all + w++;
            src[3 * j + 2] = o.hidden + (size_t)(rows - 1) * t->E;
        }
        dst[3 * j] = rq[i].dev_tokens;
        dst[3 * j + 1] = t->bids[0] + j;
        src[3 * j] = src[3 * j + 1] = id;
        bytes[3 * j] = bytes[3 * j + 1] = sizeof(int32_t);
        dst[3 * j + 2] = t->bh_chain + (size_t)j * t->E;
        bytes[3 * j + 2] = row;
        out[i].n = 1;
    }
    be->copy_n(be, dst, src, bytes, 3 * n_ord);
    const float *h_prev = t->bh_chain;
    for (int step = 1, live = n_ord; ; step++) {
        while (live > 0 && (rq[ord[live - 1]].n_max <= step || rq[ord[live - 1]].L + step >= m->n_ctx)) live--;
        if (live == 0) break;
        for (int j = 0; j < live; j++) {
            const int i = ord[j];
            t->bpos[j] = rq[i].L + step;
            t->bseqv[j] = seqs[i];
            t->bwant[j] = true;
        }
        int32_t *ids_in = t->bids[(step - 1) & 1], *ids_out = t->bids[step & 1];
        struct model_batch bc = {.n = live, .tokens_dev = ids_in, .pos = t->bpos, .seq = t->bseqv, .want_logits = t->bwant,
                                 .draft_head = true, .argmax_out = ids_out};
        if ((rc = head_forward(t, &bc, h_prev, &o, err, err_size))) return rc;
        for (int j = 0; j < live; j++) {
            const int i = ord[j];
            dst[j] = rq[i].dev_tokens + step;
            src[j] = ids_out + j;
            bytes[j] = sizeof(int32_t);
            out[i].n = step + 1;
        }
        be->copy_n(be, dst, src, bytes, live);
        h_prev = o.hidden; /* one row per live sequence, in order */
    }
    for (int j = 0; j < n_ord; j++) {
        const int i = ord[j];
        t->head->seq_truncate(m, seqs[i], rq[i].L + 1);
        t->seqs[seqs[i]].n_staged = 0;
        t->seqs[seqs[i]].pending = -1;
    }
    return 0;
}

/* The rows that follow the stage go straight into it (the verify batch after a draft). */
static float *mtp_hidden_dest(struct drafter *d, int s, int pos0, int n) {
    struct mtp *t = mtp_of(d);
    struct mtp_seq *sq = &t->seqs[s];
    if (pos0 != t->head->seq_len(t->m, s) - 1 + sq->n_staged || sq->n_staged + n > t->cap) return NULL;
    return sq->staged + (size_t)sq->n_staged * t->E;
}

/* The head's cells [0, q) came with the target's (they were computed from true hidden rows, or
 * are stale where src's head had stopped following it: memory_head_skip); the stage then needs
 * hn_{q-1} alone. */
static bool mtp_can_resume(const struct drafter *d, int src, int q, const float *hidden) {
    (void)d;
    (void)src;
    return hidden && q >= 1;
}

static void mtp_resume(struct drafter *d, int s, int q, const float *hidden) {
    struct mtp *t = mtp_of(d);
    t->head->seq_truncate(t->m, s, q);
    t->head->seq_skip(t->m, s, q);
    t->m->be->copy(t->m->be, t->seqs[s].staged, hidden, sizeof(float) * (size_t)t->E);
    t->seqs[s].n_staged = 1;
    ahead_clear(&t->seqs[s]);
}

/* Stop computing the head's rows for s but the last `keep` staged ones: the head takes the
 * positions before them as held (their cells stale, memory_head_skip). Only once the stage holds
 * twice that, so the rows kept never overlap the ones they replace in the copy. */
static void mtp_skip(struct drafter *d, int s, int keep) {
    struct mtp *t = mtp_of(d);
    struct mtp_seq *sq = &t->seqs[s];
    keep = COTI_MAX(1, COTI_MIN(keep, t->cap / 4));
    if (sq->n_staged < 2 * keep) return;
    const int drop = sq->n_staged - keep, len = t->head->seq_len(t->m, s) + drop;
    t->head->seq_skip(t->m, s, len);
    if (t->head->seq_len(t->m, s) != len) return; /* (never: the stage's rows are the target's) */
    t->m->be->copy(t->m->be, sq->staged, sq->staged + (size_t)drop * t->E, row_bytes(t) * (size_t)keep);
    sq->n_staged = keep;
}

/* No rollback hook: once a draft returns, the head holds no position past the pending token
 * (mtp_draft truncates its chained rows), and the target never drops that one. */
static const struct drafter_vtable mtp_vtable = {
    .free = mtp_free, .reset = mtp_reset, .observe = mtp_observe, .observe_ahead = mtp_observe_ahead, .draft = mtp_draft,
    .hidden_dest = mtp_hidden_dest,
    .can_resume = mtp_can_resume, .resume = mtp_resume, .skip = mtp_skip, .draft_batch = mtp_draft_batch,
};

static bool mtp_available(const struct drafter_config *c) { return model_nextn(c->m) != NULL; }

static int mtp_init(struct drafter **out, const struct drafter_config *c, char *err, size_t err_size) {
    struct model *m = c->m;
    const struct model_nextn *head = model_nextn(m);
    if (!head)
        return coti_fail(err, err_size, COTI_E_UNSUPPORTED, "the model has no NextN (MTP) head: use --spec ngram or off");
    struct mtp *t = calloc(1, sizeof *t);
    if (!t) return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory");
    t->base.vt = &mtp_vtable;
    t->m = m;
    t->head = head;
    t->E = m->info.n_embd;
    t->cap = m->n_batch + 1;
    t->base.n_vocab = m->info.n_vocab;
    struct backend *be = m->be;
    t->seqs = calloc((size_t)m->n_seq, sizeof *t->seqs);
    t->pos = malloc(sizeof(int32_t) * (size_t)t->cap);
    t->tok = malloc(sizeof(int32_t) * (size_t)t->cap);
    t->seqv = malloc(sizeof(int32_t) * (size_t)t->cap);
    t->want = malloc(sizeof(bool) * (size_t)t->cap);
    t->h_zero = be->alloc(be, sizeof(float) * (size_t)t->E); /* alloc zeroes */
    t->batch_rows = COTI_MAX(m->n_seq * MTP_BATCH_ROWS, m->n_batch);
    t->bpos = malloc(sizeof(int32_t) * (size_t)t->batch_rows);
    t->btok = malloc(sizeof(int32_t) * (size_t)t->batch_rows);
    t->bseqv = malloc(sizeof(int32_t) * (size_t)t->batch_rows);
    t->bwant = malloc(sizeof(bool) * (size_t)t->batch_rows);
    t->bh_in = be->alloc(be, row_bytes(t) * (size_t)t->batch_rows);
    t->bh_chain = be->alloc(be, row_bytes(t) * (size_t)m->n_seq);
    for (int i = 0; i < 2; i++) t->bids[i] = be->alloc(be, sizeof(int32_t) * (size_t)m->n_seq);
    t->btok_dev = be->alloc(be, sizeof(int32_t) * (size_t)t->batch_rows);
    t->bids_all = be->alloc(be, sizeof(int32_t) * (size_t)t->batch_rows);
    t->ahead_ids = be->alloc(be, sizeof(int32_t) * (size_t)m->n_seq * MTP_BATCH_ROWS);
    bool ok = t->seqs && t->pos && t->tok && t->seqv && t->want && t->h_zero && t->bpos && t->btok && t->bseqv &&
              t->bwant && t->bh_in && t->bh_chain && t->bids[0] && t->bids[1] && t->btok_dev && t->bids_all && t->ahead_ids &&
              draft_picker_init(&t->pick, be, m->info.n_vocab) == 0;
    for (int s = 0; ok && s < m->n_seq; s++) {
        t->seqs[s].staged = be->alloc(be, sizeof(float) * (size_t)t->E * t->cap);
        ok = t->seqs[s].staged != NULL;
        t->seqs[s].n_staged = 1;
        ahead_clear(&t->seqs[s]);
    }
    if (!ok) { mtp_free(&t->base); return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory for the MTP drafter"); }
    *out = &t->base;
    return 0;
}

const struct drafter_kind drafter_kind_mtp = {
    .name = "mtp", .aliases = {"draft-mtp"}, .llama_name = "draft-mtp", .available = mtp_available, .init = mtp_init,
};
