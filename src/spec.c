/* spec.c — the speculative driver (see spec.h). */
#include "spec.h"

#include "draft_depth.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Resume points looked at per source sequence (a memory has a few checkpoints and its length). */
#define SPEC_MAX_RESUME_POINTS 8
/* Checkpoint positions a prefill takes from its caller. */
#define SPEC_MAX_CHECKPOINTS 8
/* Calibrated verify shapes: 1, 2, 4, ... sequences (up to 2^(SPEC_COST_SEQS - 1)), each with
 * 1 .. SPEC_COST_ROWS rows (a batched cycle's depths past SPEC_COST_ROWS - 1 extrapolate). */
#define SPEC_COST_SEQS 7
#define SPEC_COST_ROWS 5
#define SPEC_BATCH_EXPLORE_EVERY 128 /* batched cycles between explorations: one draft more than pays */
#define SPEC_BATCH_EXPLORE_LEN 4 /* ...for this many cycles: the first catches up, the rest are timed */
#define SPEC_BATCH_IDLE_SKIP 16  /* batched cycles without drafts after which a drafter stops following */
#define SPEC_DRAFT_SAMPLES 4  /* batched cycles whose draft cost draft_cost_us looks at */
/* The device marks (backend.h) of a batched step's queued drafts; 0 and 1 time a draft phase. */
#define SPEC_MARK_QUEUED 2
/* ...and of the drafters' run ahead over a verify (observe_ahead), the next drafts' share */
#define SPEC_MARK_AHEAD 4

/* What the engine knows of one drafter kind's drafts, for the depths of later cycles. */
struct kind_depth {
    struct depth_record rec;     /* what its drafts were worth over the requests so far */
    struct depth_pause pause;    /* where its last single-sequence cycle left its pause */
    struct depth_mean draft_us;  /* a drafted token's time in single-sequence cycles */
    /* the draft phase's time per drafted token in the last SPEC_DRAFT_SAMPLES batched cycles in
     * which only this kind drafted (on the device; an n-gram draft costs next to nothing, an
     * MTP one a forward of the head) */
    double batch_draft_us[SPEC_DRAFT_SAMPLES];
    int batch_draft_n;
};

struct spec_seq {
    int32_t *hist;               /* prompt + emitted tokens; the last one is pending. During a
                                    cycle the drafts follow it (each verify row's penalty
                                    history); n_ctx + SPEC_MAX_DRAFT + 2 entries */
    int n_hist;
    struct sampler *smp;         /* target sampler */
    struct sampler *dsmp;        /* draft sampler (sampled drafts) */
    struct sampler_params sp;
    struct spec_params p;
    struct spec_stats st;
    /* a greedy draft the previous step queued for position ahead_L: ahead_n drafts in this
     * sequence's dev_toks + 1 (0: none). It runs on the device while the caller handles the
     * step's tokens; a step that wants another draft drops it unread. */
    int ahead_L, ahead_n;
    int n_top_probs;             /* < 0: no log-probabilities (spec_seq_want_probs) */
    struct spec_token_prob probs[SPEC_MAX_DRAFT + 1]; /* the last begin's / step's tokens' */
    /* under a grammar (p.grammar): its state after every emitted token (pending one included),
     * and a scratch state for the drafts and verify rows */
    struct grammar_state *gs, *gtmp;
    /* a prompt being processed (spec_seq_prefill): the next position, the prompt's end, the
     * positions whose state is remembered (checkpoints), time spent so far */
    int pf_at, pf_end, pf_ck[SPEC_MAX_CHECKPOINTS], pf_n_ck;
    int64_t pf_us;
    struct depth_seq dp;         /* its draft depth policy (draft_depth.h) */
    int depth;                   /* the drafts its next single-sequence cycle asks for */
    int batch_idle;              /* batched cycles in a row without drafts (0 after any other;
                                    kept across the slot's requests, up to SPEC_BATCH_IDLE_SKIP) */
    bool fixed_depth;            /* always n_max (spec_params.fixed_depth, or sampled drafts) */
};

struct spec_engine {
    struct model *m;
    struct drafter **drafters;   /* [i]: drafter_kinds[i]'s, NULL where not available */
    struct spec_seq *seqs;
    int V;
    float *row;                  /* host [V]: one logits row for host-side sampling */
    float *qdense;               /* host [V]: draft distribution lookup, kept all-zero */
    struct sampler_cand *resid;  /* host [V] */
    int32_t *d_ids;              /* backend [batch rows]: the target's argmax per row */
    int32_t *d_btoks;            /* backend [batch rows]: a batched verify's tokens, right after
                                    d_ids' rows (one download brings both back) */
    int batch_rows;
    int32_t *d_toks;             /* backend [n_seq][1 + SPEC_MAX_DRAFT]: each sequence's verify
                                    batch tokens (its own: a queued draft outlives the step) */
    int32_t *d_acc;              /* backend [2 + SPEC_MAX_DRAFT]: accept_greedy's result */
    /* spec_engine_calibrate: a verify forward's time for 2^i sequences of r + 1 rows each
     * (cost_n sequence points, cost_r[i] row points each; cost_n 0: not calibrated, batched
     * cycles then draft as deep as asked) */
    double cost_us[SPEC_COST_SEQS][SPEC_COST_ROWS];
    int cost_n, cost_r[SPEC_COST_SEQS];
    long batch_cycles;           /* batched cycles so far (batch_depths' exploration) */
    int explore_left, explore_d; /* cycles the current exploration still drafts explore_d deep */
    /* Batched steps' times (host clock, the whole step) by live sequences and depth, from
     * steady steps only (the step before had as many sequences at the same depth: no drafter
     * was catching up). batch_depths takes them over its model once measured: the model (a
     * calibrated verify plus the draft phase's device time) put 4 sequences' mtp:1 steps at
     * 537 us where they took 481 (H100, tiny), and kept them at depth 0 (0.96x off instead of
     * 1.13x). */
    struct depth_mean step_us[SPEC_MAX_BATCH][SPEC_MAX_DRAFT + 1];
    int step_n, step_d;          /* the last batched step's live sequences and depth */
    /* drafts batch_queue_next queued between marks SPEC_MARK_QUEUED and SPEC_MARK_QUEUED + 1,
     * of kind queued_kind (-1: mixed), until the next batched step reads their time */
    int queued_n, queued_kind;
    int32_t *pos, *seqv;         /* host [max(n_batch, batch rows)] */
    bool *want;                  /* host [max(n_batch, batch rows)] */
    struct depth_costs costs;    /* single-sequence cycles' verifies, by rows */
    struct kind_depth *kinds;    /* [i]: drafter_kinds[i]'s */
    /* the backend queues work (CUDA; spec_engine_set_queued): drafters run ahead over batched
     * greedy verifies (drafter.h observe_ahead), and none stops following a sequence only
     * because batches take no drafts (seq_release_drafter): its catch-up is one many-row forward
     * there, and cells it skipped would be stale when drafting resumes */
    bool queued;
};

struct spec_params spec_params_default(void) {
    return (struct spec_params){.drafter = NULL, .n_max = 3};
}

void spec_engine_free(struct spec_engine *e) {
    if (!e) return;
    for (int s = 0; e->seqs && s < e->m->n_seq; s++) {
        free(e->seqs[s].hist);
        sampler_free(e->seqs[s].smp);
        sampler_free(e->seqs[s].dsmp);
        grammar_state_free(e->seqs[s].gs);
        grammar_state_free(e->seqs[s].gtmp);
    }
    for (int i = 0; e->drafters && i < n_drafter_kinds; i++)
        if (e->drafters[i]) e->drafters[i]->vt->free(e->drafters[i]);
    if (e->d_ids) e->m->be->free(e->m->be, e->d_ids);
    if (e->d_toks) e->m->be->free(e->m->be, e->d_toks);
    if (e->d_acc) e->m->be->free(e->m->be, e->d_acc);
    free(e->kinds);
    free(e->drafters); free(e->seqs); free(e->row); free(e->qdense); free(e->resid); free(e->pos); free(e->seqv); free(e->want);
    free(e);
}

int spec_engine_init(struct spec_engine **out, struct model *m, const char *draft_path, char *err, size_t err_size) {
    if (m->n_keep_states < SPEC_MAX_DRAFT + 1)
        return coti_fail(err, err_size, COTI_E_ARG, "model must keep %d states for speculation (has %d)",
                         SPEC_MAX_DRAFT + 1, m->n_keep_states);
    struct spec_engine *e = calloc(1, sizeof *e);
    if (!e) return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory");
    e->m = m;
    e->V = m->info.n_vocab;
    e->seqs = calloc((size_t)m->n_seq, sizeof *e->seqs);
    e->drafters = calloc((size_t)n_drafter_kinds, sizeof *e->drafters);
    e->kinds = calloc((size_t)n_drafter_kinds, sizeof *e->kinds);
    e->row = malloc(sizeof(float) * (size_t)e->V);
    e->qdense = calloc((size_t)e->V, sizeof(float));
    e->resid = malloc(sizeof(struct sampler_cand) * (size_t)e->V);
    /* a batched verify's rows: at most SPEC_MAX_BATCH sequences' (1 + SPEC_MAX_DRAFT) */
    const size_t batch_rows = (size_t)COTI_MIN(m->n_seq, SPEC_MAX_BATCH) * (1 + SPEC_MAX_DRAFT);
    /* host rows: a prefill step's (n_batch) or a verify's, which may be longer (-b 1) */
    const size_t host_rows = COTI_MAX((size_t)m->n_batch, batch_rows);
    e->pos = malloc(sizeof(int32_t) * host_rows);
    e->seqv = malloc(sizeof(int32_t) * host_rows);
    e->want = malloc(sizeof(bool) * host_rows);
    e->batch_rows = (int)batch_rows;
    e->d_ids = m->be->alloc(m->be, sizeof(int32_t) * 2 * batch_rows);
    e->d_btoks = e->d_ids ? e->d_ids + batch_rows : NULL;
    e->d_toks = m->be->alloc(m->be, sizeof(int32_t) * (1 + SPEC_MAX_DRAFT) * (size_t)m->n_seq);
    e->d_acc = m->be->alloc(m->be, sizeof(int32_t) * (2 + SPEC_MAX_DRAFT));
    bool ok = e->seqs && e->drafters && e->kinds && e->row && e->qdense && e->resid && e->pos && e->seqv && e->want && e->d_ids && e->d_btoks && e->d_toks && e->d_acc;
    for (int s = 0; ok && s < m->n_seq; s++) ok = (e->seqs[s].hist = malloc(sizeof(int32_t) * ((size_t)m->n_ctx + SPEC_MAX_DRAFT + 2))) != NULL;
    for (int s = 0; ok && s < m->n_seq; s++) e->seqs[s].n_top_probs = -1;
    if (!ok) { spec_engine_free(e); return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory"); }
    /* (graphs exist only where the backend queues work) on the CPU a run ahead over rows that
     * are then rejected is only work (MTP's LM head on every row), and following a paused
     * sequence costs the head's layer over every row */
    e->queued = m->be->capture_begin != NULL;
    /* every available drafter exists from here on: a request only picks one */
    const struct drafter_config dc = {.m = m, .n_seq = m->n_seq, .draft_path = draft_path};
    for (int i = 0; i < n_drafter_kinds; i++) {
        const struct drafter_kind *k = drafter_kinds[i];
        int rc = k->available(&dc) ? k->init(&e->drafters[i], &dc, err, err_size) : 0;
        if (rc) { spec_engine_free(e); return rc; }
    }
    *out = e;
    return 0;
}

/* Index of drafter kind k in drafter_kinds (-1: off). */
static int kind_index(const struct drafter_kind *k) {
    for (int i = 0; k && i < n_drafter_kinds; i++)
        if (drafter_kinds[i] == k) return i;
    return -1;
}

/* The engine's drafter of kind k; NULL for off or a kind not available. */
static struct drafter *drafter_for(const struct spec_engine *e, const struct drafter_kind *k) {
    const int i = kind_index(k);
    return i >= 0 ? e->drafters[i] : NULL;
}

/* What the engine knows of kind k's drafts; NULL for off. */
static struct kind_depth *kind_of(const struct spec_engine *e, const struct drafter_kind *k) {
    const int i = kind_index(k);
    return i >= 0 ? &e->kinds[i] : NULL;
}

/* The depth of a drafting sequence's next single-sequence cycle; its pause becomes its kind's. */
static int seq_choose_depth(struct spec_engine *e, struct spec_seq *q) {
    struct kind_depth *kd = kind_of(e, q->p.drafter);
    const int d = depth_next(&q->dp, &e->costs, &kd->draft_us, q->p.n_min, q->p.n_max);
    kd->pause = q->dp.pause;
    return d;
}

/* A sequence whose next cycle drafts nothing lets its drafter stop following it (drafter.h's
 * skip) when its drafts are of no use, or when batches have not taken them for
 * SPEC_BATCH_IDLE_SKIP cycles: there the rows of a verify cost more than drafts bring (a small
 * model on few cores), and following (MTP: the head's layer over every token, at the next
 * draft) costs for drafts that are not asked for. The count is the slot's, not the request's
 * (kept across its requests). The count not where the backend queues work (e->queued): there
 * following costs one many-row forward at the next draft, and skipped cells would leave that
 * draft without the context between. Useless drafts everywhere (H100, the random 9B, nothing
 * accepted: mtp:3 0.87x off following, 0.96x skipping). */
static void seq_release_drafter(struct spec_engine *e, int s) {
    struct spec_seq *q = &e->seqs[s];
    struct drafter *d = drafter_for(e, q->p.drafter);
    if (d && q->depth == 0 && d->vt->skip &&
        (depth_drafts_useless(&q->dp.rec) || (!e->queued && q->batch_idle >= SPEC_BATCH_IDLE_SKIP)))
        d->vt->skip(d, s, DEPTH_KEEP_ROWS);
}

bool spec_engine_supports(const struct spec_engine *e, const struct drafter_kind *k) {
    return !k || drafter_for(e, k);
}

const struct spec_stats *spec_seq_stats(const struct spec_engine *e, int s) { return &e->seqs[s].st; }

void spec_seq_want_probs(struct spec_engine *e, int s, int n_top) {
    if (s >= 0 && s < e->m->n_seq) e->seqs[s].n_top_probs = COTI_MIN(n_top, SPEC_MAX_TOP_LOGPROBS);
}

const struct spec_token_prob *spec_seq_probs(const struct spec_engine *e, int s) {
    return e->seqs[s].n_top_probs >= 0 ? e->seqs[s].probs : NULL;
}

void spec_token_prob_of_row(const float *row, int n, int32_t id, int n_top, struct spec_token_prob *p) {
    /* log-softmax in double: max, then the log of the sum of exponentials */
    float mx = row[0];
    for (int i = 1; i < n; i++) mx = row[i] > mx ? row[i] : mx;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += exp((double)row[i] - mx);
    const double lse = mx + log(sum);
    p->logprob = id >= 0 && id < n ? (float)(row[id] - lse) : -INFINITY;
    /* the n_top best by insertion: n_top <= 20, one pass over the row */
    p->n_top = 0;
    n_top = COTI_MAX(COTI_MIN(n_top, SPEC_MAX_TOP_LOGPROBS), 0);
    for (int i = 0; i < n && n_top > 0; i++) {
        const float v = row[i];
        if (p->n_top == n_top && v <= row[p->top_id[n_top - 1]]) continue; /* ties: the lower id stays */
        int at = p->n_top < n_top ? p->n_top++ : n_top - 1;
        while (at > 0 && row[p->top_id[at - 1]] < v) {
            p->top_id[at] = p->top_id[at - 1];
            at--;
        }
        p->top_id[at] = i;
    }
    for (int k = 0; k < p->n_top; k++) p->top_logprob[k] = (float)(row[p->top_id[k]] - lse);
}

const int32_t *spec_seq_tokens(const struct spec_engine *e, int s, int *n) {
    *n = e->seqs[s].n_hist;
    return e->seqs[s].hist;
}

/* ---- constrained decoding: small hooks into grammar.c ---- */

/* Sequence q starts at the beginning of p's grammar (or without one). */
static int grammar_begin(struct spec_engine *e, struct spec_seq *q, const struct spec_params *p, char *err, size_t err_size) {
    grammar_state_free(q->gs);
    grammar_state_free(q->gtmp);
    q->gs = q->gtmp = NULL;
    if (!p->grammar) return 0;
    if (!p->grammar_vocab || grammar_vocab_size(p->grammar_vocab) != e->V)
        return coti_fail(err, err_size, COTI_E_ARG, "a grammar needs the vocabulary of the model's %d logits", e->V);
    int rc = grammar_state_init(&q->gs, p->grammar, err, err_size);
    if (!rc) rc = grammar_state_init(&q->gtmp, p->grammar, err, err_size);
    return rc;
}

/* The target's token from the logits row e->row (host) after hist[0, n_hist), under grammar
 * state g when there is one (a plain argmax: the best token g accepts; else the sampler on the
 * masked row, so biases and penalties apply as without a grammar). Returns the token, or -1
 * (err set) when the grammar accepts none. */
static int32_t pick_token(struct spec_engine *e, struct spec_seq *q, struct grammar_state *g, const int32_t *hist, int n_hist,
                          char *err, size_t err_size) {
    if (!g) return sampler_sample(q->smp, e->row, hist, n_hist);
    int32_t t;
    if (sampler_params_plain_argmax(&q->sp)) {
        t = grammar_argmax(g, q->p.grammar_vocab, e->row, e->V);
    } else {
        /* a partial mask (over the matcher's limits) is no distribution to sample from */
        t = grammar_mask(g, q->p.grammar_vocab, e->row, e->V) ? -1 : sampler_sample(q->smp, e->row, hist, n_hist);
        if (t >= 0 && !grammar_token_ok(g, q->p.grammar_vocab, t)) t = -1;
    }
    if (t < 0)
        coti_fail(err, err_size, COTI_E_RANGE, "grammar: no token of the vocabulary can continue the output, or the "
                                               "grammar is over the matcher's limits");
    return t;
}

/* Drafts on the host, cut before the first one the grammar rejects after the pending token. */
static int grammar_cut_drafts(struct spec_engine *e, struct spec_seq *q, const int32_t *d_drafts, struct draft_result *dr) {
    if (dr->on_device && dr->n > 0) e->m->be->download(e->m->be, dr->tokens, d_drafts, sizeof(int32_t) * (size_t)dr->n);
    dr->on_device = false;
    int rc = grammar_state_copy(q->gtmp, q->gs), n = 0;
    /* an end-of-generation draft is cut too: no row could follow it */
    while (!rc && n < dr->n && grammar_accept_token(q->gtmp, q->p.grammar_vocab, dr->tokens[n]) == 0 && !grammar_done(q->gtmp)) n++;
    dr->n = n;
    return rc;
}

/* Where sequence s's prefill remembers its state (model_seq_checkpoint): the given positions
 * and the prompt's last-but-one (an identical prompt then runs one token). */
struct seq_checkpoints {
    const int *at;
    int n;
};

/* The start of spec_seq_begin with the first n_keep prompt tokens already held by sequence s
 * (0: reset), checkpoints at ck's positions when ck is not NULL: everything but the prompt's
 * forwards, which seq_prefill runs. */
static int seq_setup(struct spec_engine *e, int s, const int32_t *prompt, int n_prompt, int n_keep,
                     const struct seq_checkpoints *ck, const struct sampler_params *sp, const struct spec_params *p,
                     char *err, size_t err_size) {
    struct model *m = e->m;
    if (s < 0 || s >= m->n_seq) return coti_fail(err, err_size, COTI_E_ARG, "sequence %d out of range", s);
    if (n_prompt < 1) return coti_fail(err, err_size, COTI_E_ARG, "empty prompt");
    if (n_prompt >= m->n_ctx)
        return coti_fail(err, err_size, COTI_E_RANGE, "prompt of %d tokens does not fit the context of %d", n_prompt, m->n_ctx);
    if (p->n_max < 1 || p->n_max > SPEC_MAX_DRAFT || p->n_min < 0 || p->n_min > p->n_max || !(p->p_min >= 0.0f && p->p_min <= 1.0f))
        return coti_fail(err, err_size, COTI_E_ARG, "speculative parameters out of range (n_max in [1, %d], 0 <= n_min <= n_max, p_min in [0, 1])",
                         SPEC_MAX_DRAFT);
    if (!spec_engine_supports(e, p->drafter))
        return coti_fail(err, err_size, COTI_E_UNSUPPORTED, "speculation '%s' is not available for this model",
                         drafter_kind_name(p->drafter));
    struct spec_seq *q = &e->seqs[s];
    struct drafter *d = drafter_for(e, p->drafter);
    int rc;
    if (q->smp) rc = sampler_reset(q->smp, sp, err, err_size);
    else rc = sampler_init(&q->smp, sp, e->V, err, err_size);
    if (rc) return rc;
    if (d && p->sample_drafts && sp->temperature > 0.0f && d->n_vocab > 0) {
        struct sampler_params dsp = *sp;
        dsp.seed = sp->seed ^ 0x5bd1e9955bd1e995ull; /* its own stream, still a function of the seed */
        sampler_free(q->dsmp);
        q->dsmp = NULL;
        if ((rc = sampler_init(&q->dsmp, &dsp, d->n_vocab, err, err_size))) return rc;
    }
    q->sp = *sp;
    q->sp.bias = NULL; /* the samplers hold their copies; the caller's list may go away */
    q->p = *p;
    if ((rc = grammar_begin(e, q, p, err, err_size))) return rc;
    memset(&q->st, 0, sizeof q->st);
    q->ahead_n = 0;
    const struct kind_depth *kd = kind_of(e, p->drafter);
    depth_seq_start(&q->dp, kd ? &kd->rec : NULL, kd ? &kd->pause : NULL);
    /* (batch_idle stays: it describes the batches this slot runs in, not the request) */
    /* sampled drafts draw from the seed's stream per draft: a depth that follows the machine's
     * timing would make a seed's text depend on it */
    q->fixed_depth = p->fixed_depth || (p->sample_drafts && sp->temperature > 0.0f);
    q->depth = !d ? 0 : q->fixed_depth ? p->n_max : seq_choose_depth(e, q);
    if (n_keep == 0) {
        model_seq_reset(m, s);
        if (d) d->vt->reset(d, s);
    }
    memcpy(q->hist, prompt, sizeof(int32_t) * (size_t)n_prompt);
    q->n_hist = n_prompt;

    q->pf_at = n_keep;
    q->pf_end = n_prompt;
    q->pf_n_ck = 0;
    /* with checkpoints (ck), the prompt's last-but-one position is remembered too (an identical
     * prompt then runs one token) */
    if (ck) q->pf_ck[q->pf_n_ck++] = n_prompt - 1;
    for (int k = 0; ck && k < ck->n && q->pf_n_ck < SPEC_MAX_CHECKPOINTS; k++) q->pf_ck[q->pf_n_ck++] = ck->at[k];
    q->pf_us = 0;
    q->st.n_prompt = n_prompt - n_keep;
    return 0;
}

/* Sequence s's prompt is in: the first token, picked from logits row `row` of o (or the greedy
 * pick at ids[row] of the forward's argmax_out), into *first. */
static int prefill_first(struct spec_engine *e, int s, const struct model_output *o, int row, int32_t *first,
                         char *err, size_t err_size) {
    struct model *m = e->m;
    struct spec_seq *q = &e->seqs[s];
    const float *logits = o->logits + (size_t)row * e->V;
    int rc;
    if (sampler_params_plain_argmax(&q->sp) && !q->gs) {
        m->be->download(m->be, first, e->d_ids + row, sizeof *first);
        if (q->n_top_probs >= 0) m->be->download(m->be, e->row, logits, sizeof(float) * (size_t)e->V);
    } else {
        m->be->download(m->be, e->row, logits, sizeof(float) * (size_t)e->V);
        if ((*first = pick_token(e, q, q->gs, q->hist, q->n_hist, err, err_size)) < 0) return COTI_E_RANGE;
        if (q->gs && (rc = grammar_accept_token(q->gs, q->p.grammar_vocab, *first)))
            return coti_fail(err, err_size, rc, "grammar: the first token was not accepted");
    }
    if (q->n_top_probs >= 0) spec_token_prob_of_row(e->row, e->V, *first, q->n_top_probs, &q->probs[0]);
    q->hist[q->n_hist++] = *first;
    q->st.n_gen = 1;
    return 0;
}

/* Rows the target accepted, seen[0, n), shown to their sequences' drafters, one observe call per
 * drafter (MTP's head then runs once for all of its sequences); a drafter's error goes to
 * rc[who[j]] of each of its entries. */
static void observe_by_drafter(struct spec_engine *e, int n, const struct draft_observed *seen, const int *who, int *rc,
                               char *err, size_t err_size) {
    for (int t = 0; t < n_drafter_kinds; t++) {
        struct drafter *d = e->drafters[t];
        if (!d) continue;
        int idx[SPEC_MAX_BATCH], nb = 0;
        struct draft_observed mine[SPEC_MAX_BATCH];
        for (int j = 0; j < n; j++)
            if (drafter_for(e, e->seqs[seen[j].s].p.drafter) == d) {
                idx[nb] = who[j];
                mine[nb++] = seen[j];
            }
        const int drc = nb ? d->vt->observe(d, nb, mine, err, err_size) : 0;
        for (int j = 0; j < nb && drc; j++) rc[idx[j]] = drc;
    }
}

/* The prompt pieces of a prefill forward o (sequence seqs[in[j]]: rows row0[j].., up to position
 * end[j]) to their drafters (observe_by_drafter; rc indexed as seqs). */
static void observe_pieces(struct spec_engine *e, int n_in, const int *in, const int *seqs, const int *row0,
                           const int *end, const struct model_output *o, int *rc, char *err, size_t err_size) {
    struct draft_observed seen[SPEC_MAX_BATCH];
    for (int j = 0; j < n_in; j++) {
        const struct spec_seq *q = &e->seqs[seqs[in[j]]];
        seen[j] = (struct draft_observed){seqs[in[j]], q->pf_at, end[j] - q->pf_at, q->hist,
                                          o->hidden + (size_t)row0[j] * e->m->info.n_embd, true, NULL};
    }
    observe_by_drafter(e, n_in, seen, in, rc, err, err_size);
}

/* Up to max_rows more of each sequence's prompt (seq_setup), the sequences' pieces together in
 * forwards of at most n_batch rows (a piece also ends where a checkpoint is wanted); a sequence
 * whose prompt is in gets its first token in first[i] and done[i] set; rc[i] its status. */
static int seqs_prefill(struct spec_engine *e, int n, const int *seqs, int max_rows, int32_t *first, bool *done,
                        int *rc, char *err, size_t err_size) {
    struct model *m = e->m;
    int stop[SPEC_MAX_BATCH];
    for (int i = 0; i < n; i++) {
        const struct spec_seq *q = &e->seqs[seqs[i]];
        done[i] = false;
        rc[i] = q->pf_at >= q->pf_end ? coti_fail(err, err_size, COTI_E_ARG, "sequence %d has no prompt to process", seqs[i]) : 0;
        stop[i] = max_rows >= q->pf_end - q->pf_at ? q->pf_end : q->pf_at + COTI_MAX(max_rows, 1);
    }
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)m->n_batch);
    if (!toks) return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory");
    for (;;) {
        const int64_t t0 = coti_time_us();
        int rows = 0, in[SPEC_MAX_BATCH], row0[SPEC_MAX_BATCH], end[SPEC_MAX_BATCH], n_in = 0, family = -1;
        bool greedy = false;
        for (int i = 0; i < n && rows < m->n_batch; i++) {
            struct spec_seq *q = &e->seqs[seqs[i]];
            if (rc[i] || q->pf_at >= stop[i]) continue;
            /* one kernel family a forward, by each prompt's whole length (backend.h
             * set_prompt): the others go in the next one */
            const int fam = model_prompt_family(m, q->pf_end);
            if (family >= 0 && fam != family) continue;
            family = fam;
            int e_i = COTI_MIN(q->pf_at + m->n_batch - rows, stop[i]);
            for (int k = 0; k < q->pf_n_ck; k++)
                if (q->pf_ck[k] > q->pf_at && q->pf_ck[k] < e_i) e_i = q->pf_ck[k];
            in[n_in] = i;
            row0[n_in] = rows;
            end[n_in++] = e_i;
            for (int r = q->pf_at; r < e_i; r++, rows++) {
                toks[rows] = q->hist[r];
                e->pos[rows] = r;
                e->seqv[rows] = seqs[i];
                e->want[rows] = r == q->pf_end - 1; /* the prompt's last row: the first token */
            }
            greedy = greedy || (e_i == q->pf_end && sampler_params_plain_argmax(&q->sp) && !q->gs);
        }
        if (!n_in) break;
        /* (the greedy picks come with the forward; they are per wanted row) */
        struct model_batch b = {.n = rows, .tokens = toks, .pos = e->pos, .seq = e->seqv, .want_logits = e->want,
                                .prompt = family, .argmax_out = greedy ? e->d_ids : NULL};
        struct model_output o;
        const int frc = model_forward(m, &b, &o, err, err_size);
        if (!frc) observe_pieces(e, n_in, in, seqs, row0, end, &o, rc, err, err_size);
        int wanted = 0;
        for (int j = 0; j < n_in; j++) {
            const int i = in[j], s = seqs[i];
            struct spec_seq *q = &e->seqs[s];
            if (frc) { rc[i] = frc; continue; }
            if (rc[i]) continue;
            const int len = end[j] - q->pf_at;
            const float *hidden = o.hidden + (size_t)row0[j] * m->info.n_embd;
            for (int k = 0; k < q->pf_n_ck; k++)
                if (q->pf_ck[k] == end[j]) {
                    model_seq_checkpoint(m, s, hidden + (size_t)(len - 1) * m->info.n_embd);
                    break;
                }
            q->pf_at = end[j];
            if (q->pf_at == q->pf_end) {
                rc[i] = prefill_first(e, s, &o, wanted++, &first[i], err, err_size);
                done[i] = rc[i] == 0;
            }
        }
        const int64_t dt = coti_time_us() - t0;
        for (int j = 0; j < n_in; j++) {
            struct spec_seq *q = &e->seqs[seqs[in[j]]];
            q->pf_us += dt;
            if (done[in[j]]) q->st.t_prompt_us = q->pf_us;
        }
    }
    free(toks);
    return 0;
}

static int seq_prefill(struct spec_engine *e, int s, int max_rows, int32_t *first, bool *done, char *err, size_t err_size) {
    int rc;
    const int frc = seqs_prefill(e, 1, &s, max_rows, first, done, &rc, err, err_size);
    return frc ? frc : rc;
}

static int seq_start(struct spec_engine *e, int s, const int32_t *prompt, int n_prompt, int n_keep,
                     const struct seq_checkpoints *ck, const struct sampler_params *sp, const struct spec_params *p,
                     int32_t *first, char *err, size_t err_size) {
    bool done;
    int rc = seq_setup(e, s, prompt, n_prompt, n_keep, ck, sp, p, err, err_size);
    return rc ? rc : seq_prefill(e, s, n_prompt, first, &done, err, err_size);
}


int spec_seq_begin(struct spec_engine *e, int s, const int32_t *prompt, int n_prompt,
                   const struct sampler_params *sp, const struct spec_params *p, int32_t *first,
                   char *err, size_t err_size) {
    return seq_start(e, s, prompt, n_prompt, 0, NULL, sp, p, first, err, err_size);
}

/* Whether sequence s continues where it is: its last start succeeded with drafter kind k and the
 * target holds exactly its history but the pending token, hist[0, n_have) = prompt[0, n_have),
 * n_have < n_prompt. Returns n_have or 0. */
static int continuation_len(const struct spec_engine *e, int s, const int32_t *prompt, int n_prompt,
                            const struct drafter_kind *k) {
    const struct spec_seq *q = &e->seqs[s];
    const int n_have = q->n_hist - 1;
    bool ok = q->smp && n_have > 0 && n_have < n_prompt && model_seq_len(e->m, s) == n_have && q->p.drafter == k &&
              memcmp(q->hist, prompt, sizeof(int32_t) * (size_t)n_have) == 0;
    return ok ? n_have : 0;
}

/* The longest resume point q of src for prompt (held positions that equal the prompt's, at
 * most n_prompt - 1) that drafter kind k's drafter can continue from; *hidden its row. */
static int resume_point(const struct spec_engine *e, int src, const int32_t *prompt, int n_prompt,
                        const struct drafter_kind *k, const float **hidden) {
    const struct spec_seq *sq = &e->seqs[src];
    int common = 0;
    const int held = COTI_MIN(sq->n_hist - 1, model_seq_len(e->m, src));
    const int lim = COTI_MIN(held, n_prompt - 1);
    while (common < lim && sq->hist[common] == prompt[common]) common++;
    if (common < 1) return 0;
    int qs[SPEC_MAX_RESUME_POINTS];
    const float *hs[SPEC_MAX_RESUME_POINTS];
    const int n = model_seq_resume_points(e->m, src, common, qs, hs, SPEC_MAX_RESUME_POINTS);
    const struct drafter *d = drafter_for(e, k);
    for (int i = 0; i < n; i++) {
        if (d && d->vt->can_resume && !d->vt->can_resume(d, src, qs[i], hs[i])) continue;
        *hidden = hs[i];
        return qs[i];
    }
    return 0;
}

int spec_seq_reusable(const struct spec_engine *e, int s, int src, const int32_t *prompt, int n_prompt,
                      const struct drafter_kind *k) {
    if (s < 0 || s >= e->m->n_seq || src < 0 || src >= e->m->n_seq || n_prompt < 1) return 0;
    const float *h;
    const int cont = src == s ? continuation_len(e, s, prompt, n_prompt, k) : 0;
    return COTI_MAX(cont, resume_point(e, src, prompt, n_prompt, k, &h));
}

int spec_seq_start_reuse(struct spec_engine *e, int s, int src, int n_reuse, const int32_t *prompt, int n_prompt,
                         const int *ck_at, int n_ck_at, const struct sampler_params *sp, const struct spec_params *p,
                         int *n_cached, char *err, size_t err_size) {
    *n_cached = 0;
    if (s < 0 || s >= e->m->n_seq || src < 0 || src >= e->m->n_seq)
        return coti_fail(err, err_size, COTI_E_ARG, "sequence %d or %d out of range", s, src);
    const struct seq_checkpoints ck = {ck_at, COTI_MAX(n_ck_at, 0)};
    int keep = 0;
    if (n_reuse > 0 && src == s && continuation_len(e, s, prompt, n_prompt, p->drafter) == n_reuse) {
        keep = n_reuse; /* s goes on from where it is */
    } else if (n_reuse > 0) {
        const float *hidden = NULL;
        const int q = resume_point(e, src, prompt, n_prompt, p->drafter, &hidden);
        struct drafter *d = drafter_for(e, p->drafter);
        if (q == n_reuse && model_seq_resume(e->m, s, src, q) == 0) {
            if (d && d->vt->resume) d->vt->resume(d, s, q, hidden);
            keep = q;
        }
    }
    int rc = seq_setup(e, s, prompt, n_prompt, keep, &ck, sp, p, err, err_size);
    if (!rc) *n_cached = keep;
    return rc;
}

int spec_seqs_prefill(struct spec_engine *e, int n, const int *seqs, int max_rows, int32_t *first, bool *done, int *rc,
                      char *err, size_t err_size) {
    if (n < 0 || n > SPEC_MAX_BATCH) return coti_fail(err, err_size, COTI_E_ARG, "%d sequences in a batch (at most %d)", n, SPEC_MAX_BATCH);
    for (int i = 0; i < n; i++) {
        if (seqs[i] < 0 || seqs[i] >= e->m->n_seq) return coti_fail(err, err_size, COTI_E_ARG, "sequence %d out of range", seqs[i]);
        for (int j = 0; j < i; j++)
            if (seqs[j] == seqs[i]) return coti_fail(err, err_size, COTI_E_ARG, "sequence %d twice in a batch", seqs[i]);
    }
    return seqs_prefill(e, n, seqs, max_rows, first, done, rc, err, err_size);
}

int spec_seq_begin_reuse(struct spec_engine *e, int s, int src, int n_reuse, const int32_t *prompt, int n_prompt,
                         const int *ck_at, int n_ck_at, const struct sampler_params *sp, const struct spec_params *p,
                         int32_t *first, int *n_cached, char *err, size_t err_size) {
    bool done;
    int rc = spec_seq_start_reuse(e, s, src, n_reuse, prompt, n_prompt, ck_at, n_ck_at, sp, p, n_cached, err, err_size);
    return rc ? rc : seq_prefill(e, s, n_prompt, first, &done, err, err_size);
}

int spec_engine_warmup(struct spec_engine *e, const int32_t *prompt, int n_prompt, const struct sampler_params *sp,
                       const struct spec_params *p, int n_gen, char *err, size_t err_size) {
    struct model *m = e->m;
    if (n_prompt < 1) return coti_fail(err, err_size, COTI_E_ARG, "empty warmup prompt");
    n_gen = COTI_MIN(n_gen, m->n_ctx - n_prompt - SPEC_MAX_DRAFT - 2);
    if (n_gen < 1) return 0; /* a context too small to warm anything in */
    struct sampler_params sps[2] = {*sp, *sp};
    sps[0].temperature = 0.0f;
    if (sps[1].temperature <= 0.0f) sps[1].temperature = 0.8f;
    int32_t out[SPEC_MAX_DRAFT + 1];
    /* first the largest step a prompt can take (n_batch rows): a backend sizes its scratch
     * memory to it now, rather than when a long prompt arrives, which would make every graph
     * recorded so far stale (each records again on its next use) */
    const int n_big = COTI_MIN(m->n_batch, m->n_ctx - 1);
    int32_t *big = malloc(sizeof(int32_t) * (size_t)n_big), first;
    if (!big) return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory");
    for (int i = 0; i < n_big; i++) big[i] = prompt[i % n_prompt];
    int rc = spec_seq_begin(e, 0, big, n_big, &sps[0], p, &first, err, err_size);
    free(big);
    if (rc) return rc;
    for (int s = 0; s < m->n_seq; s++) {
        for (int v = 0; v < 2; v++) {
            rc = spec_seq_begin(e, s, prompt, n_prompt, &sps[v], p, &first, err, err_size);
            for (int n = 1; !rc && n < n_gen;) {
                int nb;
                rc = spec_seq_step(e, s, n_gen - n, out, &nb, NULL, err, err_size);
                n += nb;
            }
            if (rc) return rc;
        }
        /* nothing of it may look like a reusable prefix */
        e->seqs[s].n_hist = 0;
        e->seqs[s].ahead_n = 0;
        model_seq_reset(m, s);
    }
    return 0;
}

/* Sequence s's verify tokens on the device: the pending one, then its drafts. */
static int32_t *seq_dev_tokens(const struct spec_engine *e, int s) { return e->d_toks + (size_t)s * (1 + SPEC_MAX_DRAFT); }

/* One sequence's cycle between its draft and its acceptance (spec_seq_step, spec_step_batch). */
struct cycle {
    int s, L, max_new;
    int asked, k_drafted, k;     /* drafts asked for, made, verified (a grammar may cut some) */
    bool drafting, greedy;
    struct draft_result dr;
    int32_t toks[1 + SPEC_MAX_DRAFT]; /* the verify rows' tokens: the pending one, then the drafts
                                         (those left on the device only there) */
    int row0;                    /* its first row in the verify batch */
    int a;                       /* drafts accepted */
    int32_t next;                /* the target's token after them */
    int64_t t0;
};

/* The start of sequence s's cycle: *rq is the draft it needs (*need), unless it has no drafter,
 * no room for drafts, or the previous step queued the draft already. */
static int cycle_plan(struct spec_engine *e, int s, int max_new, int depth, struct spec_probe *probe, struct cycle *c,
                      struct draft_request *rq, bool *need, char *err, size_t err_size) {
    struct model *m = e->m;
    struct spec_seq *q = &e->seqs[s];
    struct drafter *d = drafter_for(e, q->p.drafter);
    memset(c, 0, sizeof *c);
    *need = false;
    c->s = s;
    c->max_new = max_new;
    c->L = q->n_hist - 1;
    const int L = c->L;
    if (L + 1 >= m->n_ctx) return coti_fail(err, err_size, COTI_E_RANGE, "context of %d positions is full", m->n_ctx);
    c->t0 = coti_time_us();
    /* draft; the device marks split its time from the verify's without a sync in between */
    int k_cap = COTI_MIN(COTI_MIN(q->p.n_max, depth), max_new - 1);
    k_cap = COTI_MIN(k_cap, m->n_ctx - 1 - (L + 1));
    if (probe) k_cap = COTI_MIN(k_cap, probe->n_forced - probe->n_used - 1);
    c->drafting = d && k_cap > 0;
    c->asked = c->drafting ? k_cap : 0;
    int32_t *d_toks = seq_dev_tokens(e, s);
    if (c->drafting && q->ahead_n == k_cap && q->ahead_L == L) {
        c->dr.n = k_cap; /* queued by the previous step, the same call as the one below */
        c->dr.on_device = true;
    } else if (c->drafting) {
        *rq = (struct draft_request){q->hist, L, k_cap, COTI_MIN(q->p.n_min, k_cap), q->p.p_min,
                                     q->dsmp && q->sp.temperature > 0.0f && !q->gs ? q->dsmp : NULL, d_toks + 1};
        *need = true;
    }
    q->ahead_n = 0;
    return 0;
}

/* The rest of the start once the draft is in c->dr: a grammar cuts it; the verify's tokens. */
static int cycle_drafted(struct spec_engine *e, struct cycle *c, struct spec_probe *probe, char *err, size_t err_size) {
    const int s = c->s, L = c->L;
    struct spec_seq *q = &e->seqs[s];
    int32_t *d_toks = seq_dev_tokens(e, s);
    c->k_drafted = c->dr.n;
    if (q->gs && c->k_drafted > 0) {
        int rc = grammar_cut_drafts(e, q, d_toks + 1, &c->dr);
        if (rc) return coti_fail(err, err_size, rc, "out of memory");
    }
    c->k = c->dr.n;
    /* greedy on the device only when the pick is the raw argmax: penalties, typical_p and
     * biases make it depend on more than the row, which the device-side acceptance does not
     * know, and a grammar picks on the host, so such requests take the host path (sample-and-
     * match, which for a greedy sampler is the same rule: accept while the draft equals the
     * pick) */
    c->greedy = sampler_params_plain_argmax(&q->sp) && !probe && !q->gs;
    c->toks[0] = q->hist[L];
    if (!c->dr.on_device) for (int i = 0; i < c->k; i++) c->toks[1 + i] = c->dr.tokens[i];
    return 0;
}

/* The start of sequence s's cycle: its draft (timed on the device; or the one the previous
 * step queued), cut under a grammar. */
static int cycle_draft(struct spec_engine *e, int s, int max_new, int depth, struct spec_probe *probe, struct cycle *c,
                       char *err, size_t err_size) {
    struct backend *be = e->m->be;
    struct draft_request rq;
    bool need;
    int rc = cycle_plan(e, s, max_new, depth, probe, c, &rq, &need, err, err_size);
    if (rc) return rc;
    if (need) {
        struct drafter *d = drafter_for(e, e->seqs[s].p.drafter);
        be->mark(be, 0);
        if ((rc = d->vt->draft(d, s, &rq, &c->dr, err, err_size))) return rc;
        be->mark(be, 1);
    }
    return cycle_drafted(e, c, probe, err, err_size);
}

/* The acceptance of cycle c, whose verify rows are rows row0 .. row0 + k of o: c->a drafts, then
 * the target's c->next, their log-probabilities, the grammar past them. It reads o's logits and
 * nothing else touches the device. acc (greedy only): the accepted count, the accepted drafts
 * and the target's token after them, as the backend's accept_greedy writes them. */
static int cycle_pick(struct spec_engine *e, struct cycle *c, const struct model_output *o, const int32_t *acc,
                      struct spec_probe *probe, char *err, size_t err_size) {
    struct backend *be = e->m->be;
    const int L = c->L, k = c->k;
    struct spec_seq *q = &e->seqs[c->s];
    struct draft_result *dr = &c->dr;
    const float *logits = o->logits + (size_t)c->row0 * e->V;
    int rc;
    /* row i follows hist[0, L] and the drafts before it: the tokens that were emitted before
     * it if it is reached, so its penalties are those of plain decoding at that position */
    if (!c->greedy) memcpy(q->hist + L + 1, dr->tokens, sizeof(int32_t) * (size_t)k);

    /* accept: a drafts, then the target's own token */
    int a = 0;
    int32_t next = -1;
    if (c->greedy) {
        a = acc[0];
        if (a < 0 || a > k) return coti_fail(err, err_size, COTI_E_RANGE, "backend accepted %d of %d drafts", a, k);
        for (int i = 0; i < a; i++) dr->tokens[i] = acc[1 + i];
        next = acc[1 + a];
    }
    /* under a grammar, row i is masked with its state after the pending token and drafts < i */
    struct grammar_state *gr = q->gs ? q->gtmp : NULL;
    if (gr && (rc = grammar_state_copy(gr, q->gs))) return coti_fail(err, err_size, rc, "out of memory");
    for (int i = 0; i <= k && next < 0; i++) {
        const float *row = logits + (size_t)i * e->V;
        if (gr && i > 0 && (rc = grammar_accept_token(gr, q->p.grammar_vocab, dr->tokens[i - 1])))
            return coti_fail(err, err_size, rc, "grammar: a draft it accepted before was refused");
        if (probe) {
            if (probe->on_row) { /* the gate reads the row on the host */
                be->download(be, e->row, row, sizeof(float) * (size_t)e->V);
                if (gr && grammar_mask(gr, q->p.grammar_vocab, e->row, e->V) == COTI_E_NOMEM)
                    return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory");
                probe->on_row(probe->user, L + i, e->row, e->V);
            }
            int32_t want_tok = probe->forced[probe->n_used + i];
            if (i < k && dr->tokens[i] == want_tok) a++;
            else next = want_tok;
        } else if (i < k && dr->q[i]) {
            be->download(be, e->row, row, sizeof(float) * (size_t)e->V);
            const struct sampler_cand *pc;
            size_t pn;
            sampler_probs(q->smp, e->row, q->hist, L + 1 + i, &pc, &pn);
            int32_t r = sampler_rejection_step(q->smp, pc, pn, dr->q[i], dr->q_n[i], dr->tokens[i], e->qdense, e->resid);
            if (r < 0) a++;
            else next = r;
        } else {
            be->download(be, e->row, row, sizeof(float) * (size_t)e->V);
            int32_t t = pick_token(e, q, gr, q->hist, L + 1 + i, err, err_size);
            if (t < 0) return COTI_E_RANGE;
            if (i < k && t == dr->tokens[i]) a++;
            else next = t;
        }
    }
    if (probe) probe->n_used += a + 1;
    /* the emitted tokens' log-probabilities: verify row i is token i's distribution (read
     * before anything else is queued, which the downloads would wait for) */
    for (int i = 0; q->n_top_probs >= 0 && i <= a; i++) {
        be->download(be, e->row, logits + (size_t)i * e->V, sizeof(float) * (size_t)e->V);
        spec_token_prob_of_row(e->row, e->V, i < a ? dr->tokens[i] : next, q->n_top_probs, &q->probs[i]);
    }
    if (gr) { /* the state after the emitted tokens: the accepted drafts (gr is past them) and next */
        if ((rc = grammar_accept_token(gr, q->p.grammar_vocab, next)))
            return coti_fail(err, err_size, rc, "grammar: token %d does not continue the output", next);
        struct grammar_state *t = q->gs;
        q->gs = gr;
        q->gtmp = t;
    }
    c->a = a;
    c->next = next;
    return 0;
}

/* The rest of cycle c after its pick: the rejected drafts rolled back, the tokens into out,
 * statistics (the caller shows the drafter the emitted rows: cycle_observed). t_draft: the
 * draft's share of the time up to t2, when the verify's results arrived. */
static int cycle_commit(struct spec_engine *e, struct cycle *c, int64_t t_draft, int64_t t2, int32_t *out, int *n_out,
                        char *err, size_t err_size) {
    struct model *m = e->m;
    const int s = c->s, L = c->L, k = c->k, a = c->a;
    struct spec_seq *q = &e->seqs[s];
    struct drafter *d = drafter_for(e, q->p.drafter);
    struct draft_result *dr = &c->dr;
    const int32_t next = c->next;
    int rc;
    if (k - a > 0 && (rc = model_seq_rollback(m, s, k - a)))
        return coti_fail(err, err_size, rc, "rollback of %d positions failed", k - a);
    /* drafts the grammar cut were never verified, but the drafter made them */
    if (c->k_drafted - a > 0 && d->vt->rollback) d->vt->rollback(d, s, L + 1 + a);
    for (int i = 0; i < a; i++) q->hist[q->n_hist++] = dr->tokens[i];
    q->hist[q->n_hist++] = next;
    for (int i = 0; i < a; i++) out[i] = dr->tokens[i];
    out[a] = next;
    *n_out = a + 1;

    q->st.n_gen += a + 1;
    if (k > 0) {
        q->st.n_verify++;
        q->st.n_drafted += k;
        q->st.n_accepted += a;
        for (int i = 0; i < k; i++) q->st.drafted_at[i]++;
        for (int i = 0; i < a; i++) q->st.accepted_at[i]++;
    }
    if (c->asked > 0) {
        struct kind_depth *kd = kind_of(e, q->p.drafter);
        depth_seq_record(&q->dp, kd ? &kd->rec : NULL, c->asked, c->k_drafted, k, a);
    }
    q->st.t_draft_us += t_draft;
    q->st.t_verify_us += t2 - c->t0 - t_draft;
    return 0;
}

/* The rows cycle c emitted, as its drafter observes them: its verify rows in o up to the
 * accepted ones. */
static struct draft_observed cycle_observed(const struct spec_engine *e, const struct cycle *c, const struct model_output *o) {
    return (struct draft_observed){c->s, c->L, c->a + 1, e->seqs[c->s].hist, o->hidden + (size_t)c->row0 * e->m->info.n_embd, false, NULL};
}

/* The drafters that follow the target run ahead over the verify rows (in o) of the cycles c[0, n)
 * that allow it, queued behind the verify before its results are read, between the marks
 * SPEC_MARK_AHEAD and SPEC_MARK_AHEAD + 1. Only where the backend queues work (e->queued), and
 * not when any of the cycles reads its logits rows on the host: a drafter's forward may write
 * over them. Returns whether any ran. */
static bool batch_run_ahead(struct spec_engine *e, const struct cycle *c, int n, const bool *live, int *rc,
                            struct spec_probe *const *probes, const struct model_output *o, char *err, size_t err_size) {
    struct backend *be = e->m->be;
    bool ran = false;
    if (!e->queued) return false;
    for (int i = 0; i < n; i++)
        if (live[i] && !rc[i] && (!c[i].greedy || e->seqs[c[i].s].n_top_probs >= 0 || (probes && probes[i]))) return false;
    for (int t = 0; t < n_drafter_kinds; t++) {
        struct drafter *d = e->drafters[t];
        if (!d || !d->vt->observe_ahead) continue;
        int idx[SPEC_MAX_BATCH], nb = 0;
        struct draft_observed rows[SPEC_MAX_BATCH];
        for (int i = 0; i < n; i++)
            /* a cycle that drafted, greedy on the device (the next will too: a request keeps
             * its sampler) */
            if (live[i] && !rc[i] && drafter_for(e, e->seqs[c[i].s].p.drafter) == d && c[i].k > 0 && c[i].dr.on_device &&
                e->seqs[c[i].s].p.p_min <= 0.0f) {
                idx[nb] = i;
                rows[nb++] = (struct draft_observed){c[i].s, c[i].L, c[i].k + 1, e->seqs[c[i].s].hist,
                                                     o->hidden + (size_t)c[i].row0 * e->m->info.n_embd, false, e->d_ids + c[i].row0};
            }
        if (!nb) continue;
        if (!ran) be->mark(be, SPEC_MARK_AHEAD);
        ran = true;
        bool did[SPEC_MAX_BATCH];
        const int drc = d->vt->observe_ahead(d, nb, rows, did, err, err_size);
        for (int j = 0; j < nb; j++) {
            if (drc) rc[idx[j]] = drc;
            else e->seqs[c[idx[j]].s].st.n_ahead += did[j];
        }
    }
    if (ran) be->mark(be, SPEC_MARK_AHEAD + 1);
    return ran;
}

/* A batched step's emitted rows shown to the drafters: one observe call per drafter. */
static void batch_observe(struct spec_engine *e, const struct cycle *c, int n, const bool *live, int *rc,
                          const struct model_output *o, char *err, size_t err_size) {
    int who[SPEC_MAX_BATCH], nb = 0;
    struct draft_observed seen[SPEC_MAX_BATCH];
    for (int i = 0; i < n; i++)
        if (live[i] && !rc[i]) {
            who[nb] = i;
            seen[nb++] = cycle_observed(e, &c[i], o);
        }
    observe_by_drafter(e, nb, seen, who, rc, err, err_size);
}

/* The draft cycle c's sequence queues for its next step, if any: a greedy one of a drafter whose
 * draft writes no state of its own (so the device works on it while the caller turns this
 * step's tokens into text). */
static bool queue_request(struct spec_engine *e, const struct cycle *c, struct draft_request *rq) {
    struct model *m = e->m;
    const struct spec_seq *q = &e->seqs[c->s];
    const struct drafter *d = drafter_for(e, q->p.drafter);
    if (!c->greedy || !d || !d->draft_is_pure || q->p.p_min > 0.0f) return false;
    const int L2 = q->n_hist - 1;
    const int k2 = COTI_MIN(COTI_MIN(q->depth, c->max_new - (c->a + 1) - 1), m->n_ctx - 1 - (L2 + 1));
    if (k2 <= 0) return false;
    *rq = (struct draft_request){q->hist, L2, k2, COTI_MIN(q->p.n_min, k2), 0.0f, NULL, seq_dev_tokens(e, c->s) + 1};
    return true;
}

/* A queued draft the next step can take as it is: all of it, left on the device. */
static bool note_queued(struct spec_seq *q, const struct draft_request *rq, const struct draft_result *dr) {
    if (!dr->on_device || dr->n != rq->n_max) return false;
    q->ahead_L = rq->L;
    q->ahead_n = rq->n_max;
    return true;
}

/* Cycle c's sequence's next draft, queued now (single-sequence cycles). */
static int cycle_queue_next(struct spec_engine *e, const struct cycle *c, char *err, size_t err_size) {
    struct backend *be = e->m->be;
    struct spec_seq *q = &e->seqs[c->s];
    struct drafter *d = drafter_for(e, q->p.drafter);
    struct draft_request rq;
    if (!queue_request(e, c, &rq)) return 0;
    struct draft_result dr = {0};
    be->mark(be, 0);
    int rc = d->vt->draft(d, c->s, &rq, &dr, err, err_size);
    if (rc) return rc;
    be->mark(be, 1);
    note_queued(q, &rq, &dr);
    return 0;
}

/* The next drafts of a batched step's sequences, queued as cycle_queue_next queues one's (pure
 * greedy drafts), in one draft_batch call per drafter that has one, between the marks the next
 * batched step reads when it drafts nothing itself: a draft phase's marks would enclose none of
 * them, and the drafts would look free to batch_depths. */
static void batch_queue_next(struct spec_engine *e, const struct cycle *c, int n, const bool *live, int *rc, char *err,
                             size_t err_size) {
    struct backend *be = e->m->be;
    bool marked = false;
    e->queued_n = 0;
    e->queued_kind = -1;
    for (int t = 0; t < n_drafter_kinds; t++) {
        struct drafter *d = e->drafters[t];
        if (!d) continue;
        int idx[SPEC_MAX_BATCH], bs[SPEC_MAX_BATCH], nb = 0;
        struct draft_request brq[SPEC_MAX_BATCH];
        struct draft_result bdr[SPEC_MAX_BATCH];
        for (int i = 0; i < n; i++)
            if (live[i] && !rc[i] && drafter_for(e, e->seqs[c[i].s].p.drafter) == d && queue_request(e, &c[i], &brq[nb])) {
                idx[nb] = i;
                bs[nb++] = c[i].s;
            }
        if (!nb) continue;
        if (!marked) be->mark(be, SPEC_MARK_QUEUED);
        marked = true;
        if (nb >= 2 && d->vt->draft_batch) {
            const int drc = d->vt->draft_batch(d, nb, bs, brq, bdr, err, err_size);
            for (int j = 0; j < nb && drc; j++) rc[idx[j]] = drc;
        } else {
            for (int j = 0; j < nb; j++) {
                bdr[j] = (struct draft_result){0};
                rc[idx[j]] = d->vt->draft(d, bs[j], &brq[j], &bdr[j], err, err_size);
            }
        }
        for (int j = 0; j < nb; j++) {
            if (rc[idx[j]] || !note_queued(&e->seqs[bs[j]], &brq[j], &bdr[j])) continue;
            e->queued_kind = e->queued_n == 0 || e->queued_kind == t ? t : -1;
            e->queued_n += bdr[j].n;
        }
    }
    if (marked) be->mark(be, SPEC_MARK_QUEUED + 1);
}

/* After a single-sequence cycle: its costs into the engine's means (the verify's host time of its
 * rows; the draft's per token, unless the draft also caught up with more than a verify's rows),
 * then the next cycle's depth; a sequence left without drafts that are of any use lets its
 * drafter stop following. */
static void seq_next_depth(struct spec_engine *e, int s, const struct cycle *c, int64_t t_draft, int64_t t2) {
    struct spec_seq *q = &e->seqs[s];
    depth_cost_add(&e->costs.verify[c->k], (double)(t2 - c->t0 - t_draft));
    if (c->k_drafted > 0 && c->dr.catch_up <= SPEC_MAX_DRAFT + 1)
        depth_cost_add(&kind_of(e, q->p.drafter)->draft_us, (double)t_draft / c->k_drafted);
    q->depth = seq_choose_depth(e, q);
    q->batch_idle = 0;
    seq_release_drafter(e, s);
}

int spec_seq_step(struct spec_engine *e, int s, int max_new, int32_t *out, int *n_out,
                  struct spec_probe *probe, char *err, size_t err_size) {
    struct model *m = e->m;
    struct backend *be = m->be;
    *n_out = 0;
    if (max_new < 1) return 0;
    struct cycle c;
    struct spec_seq *q = &e->seqs[s];
    /* the gate (probe) drafts as deep as asked: it is there to test every depth */
    int rc = cycle_draft(e, s, max_new, probe ? SPEC_MAX_DRAFT : q->depth, probe, &c, err, err_size);
    if (rc) return rc;
    struct drafter *d = drafter_for(e, q->p.drafter);
    const int L = c.L, k = c.k;
    int32_t *d_toks = seq_dev_tokens(e, s);

    /* verify: [pending, d1..dk] at L..L+k; drafts left on the device are read there */
    for (int i = 0; i <= k; i++) { e->pos[i] = L + i; e->seqv[i] = s; e->want[i] = true; }
    struct model_batch b = {.n = k + 1, .pos = e->pos, .seq = e->seqv, .want_logits = e->want, .keep_states = k > 0};
    if (c.dr.on_device || (c.greedy && k > 0)) {
        /* the batch reads its tokens on the device (the acceptance reads the drafts there):
         * drafts left there stay, host ones go up */
        be->upload(be, d_toks, c.toks, sizeof(int32_t) * (size_t)(c.dr.on_device ? 1 : k + 1));
        b.tokens_dev = d_toks;
    } else {
        b.tokens = c.toks;
    }
    /* greedy: the verify's argmaxes and the acceptance run in its own work on the device; the
     * one wait of the cycle brings back the accepted count and tokens (acc[0] = a, acc[1 .. a]
     * the drafts, acc[1 + a] the target's token) */
    if (c.greedy) {
        b.argmax_out = e->d_ids;
        if (k > 0) b.accept_out = e->d_acc;
    }
    if (d && d->vt->hidden_dest) b.hidden_out = d->vt->hidden_dest(d, s, L, k + 1);
    struct model_output o;
    rc = model_forward(m, &b, &o, err, err_size);
    if (rc) return rc;
    int32_t acc[2 + SPEC_MAX_DRAFT];
    if (c.greedy) {
        if (k > 0) {
            be->download(be, acc, e->d_acc, sizeof(int32_t) * (size_t)(k + 2));
        } else {
            acc[0] = 0;
            be->download(be, &acc[1], e->d_ids, sizeof(int32_t));
        }
    } else if (c.dr.on_device) {
        be->download(be, c.dr.tokens, d_toks + 1, sizeof(int32_t) * (size_t)k); /* the host compares */
    } else {
        be->sync(be); /* the verify's time is its own, not the accept loop's */
    }
    int64_t t2 = coti_time_us();
    /* the draft's device time (a draft queued by the previous step: its marks are the last
     * ones set); the rest up to the wait is the verify's. Read before the next draft is queued,
     * whose marks would make this wait for it. */
    const int64_t t_draft = c.drafting ? COTI_MIN((int64_t)be->mark_elapsed_us(be, 0, 1), t2 - c.t0) : 0;
    if ((rc = cycle_pick(e, &c, &o, acc, probe, err, err_size)) ||
        (rc = cycle_commit(e, &c, t_draft, t2, out, n_out, err, err_size)))
        return rc;
    const struct draft_observed seen = cycle_observed(e, &c, &o);
    if (d && (rc = d->vt->observe(d, 1, &seen, err, err_size))) return rc;
    if (d && !probe && !q->fixed_depth) seq_next_depth(e, s, &c, t_draft, t2);
    if ((rc = cycle_queue_next(e, &c, err, err_size))) return rc;
    q->st.t_glue_us += coti_time_us() - t2;
    return 0;
}

/* Verify time of point i (2^i sequences) with `rows` rows each: the calibrated rows, past the
 * last along its last segment. */
static double cost_at(const struct spec_engine *e, int i, int rows) {
    const int nr = e->cost_r[i];
    const double *c = e->cost_us[i];
    if (rows <= nr) return c[rows - 1];
    return nr == 1 ? c[0] * rows : c[nr - 1] + (c[nr - 1] - c[nr - 2]) * (rows - nr);
}

/* Verify time of n sequences with up to `rows` rows each: linear in n between the calibrated
 * powers of two, past the last in proportion. */
static double verify_us(const struct spec_engine *e, int n, int rows) {
    int i = 0;
    while (i + 1 < e->cost_n && (1 << (i + 1)) <= n) i++;
    const double lo = cost_at(e, i, rows);
    if (n == 1 << i) return lo;
    if (i + 1 >= e->cost_n) return lo * n / (double)(1 << i);
    return lo + (cost_at(e, i + 1, rows) - lo) * (n - (1 << i)) / (double)(1 << i);
}

/* A batched draft's cost (drafter kind k): the least per-drafted-token time of the last cycles
 * that drafted (with what the drafter ran ahead over their verify). The draft phase also runs
 * the head over the rows accepted since a sequence last drafted, work that is deferred rather
 * than caused by the draft: the least sample is the cycle with the least of it. Drafts are free
 * until SPEC_DRAFT_SAMPLES cycles have drafted, so that the first batched cycles draft and
 * measure (a prompt's catch-up, which a draft timed before any batch was there to keep out of
 * these samples, is the prefill's now). */
static double draft_cost_us(const struct spec_engine *e, const struct drafter_kind *k) {
    const struct kind_depth *kd = kind_of(e, k);
    if (!kd || kd->batch_draft_n < SPEC_DRAFT_SAMPLES) return 0.0;
    double c = kd->batch_draft_us[0];
    for (int i = 1; i < SPEC_DRAFT_SAMPLES; i++) c = fmin(c, kd->batch_draft_us[i]);
    return c;
}

/* Draft depths of a batched cycle: one depth d for every sequence that drafts (within its n_min
 * and n_max), the d whose expected tokens per microsecond are the most. What asking a sequence for d drafts gives comes from its request's
 * record (draft_depth.h: how often its drafter fills each position, how often the target keeps
 * them), so drafts that seldom come (n-gram)
 * are priced by the rows they add; the cycle costs the verify of its sequences with their
 * expected rows each (calibrated: on a GPU the rows of different sequences step their
 * recurrences side by side, so more sequences cost less than more rows of one) and the drafts.
 * Verify rows ride nearly free where a forward's time is its weights' reading (a GPU, a large
 * model): deep drafts; they cost their compute where it is not (a small model on a few cores):
 * shallow or none, so that speculation never makes the batch slower. Once steady steps of as
 * many sequences at a depth have been timed (step_us), that time replaces the model's. Returns
 * the depth, -1 where none was chosen. */
static int batch_depths(struct spec_engine *e, int n, const int *seqs, const int *rc, int *depth) {
    for (int i = 0; i < n; i++) depth[i] = e->cost_n ? 0 : SPEC_MAX_DRAFT;
    if (!e->cost_n) return -1; /* not calibrated: as deep as each asked */
    int n_live = 0, d_top = 0;
    for (int i = 0; i < n; i++) {
        if (rc[i]) continue; /* (a refused entry's sequence may be out of range) */
        const struct spec_seq *q = &e->seqs[seqs[i]];
        n_live++;
        if (q->p.drafter) d_top = COTI_MAX(d_top, q->p.n_max);
    }
    if (!n_live) return -1;
    int best = -1;
    double best_rate = 0;
    for (int d = 0; d <= d_top; d++) {
        double tok = 0, drafts = 0, t_drafts = 0;
        for (int i = 0; i < n; i++) {
            if (rc[i]) continue;
            const struct spec_seq *q = &e->seqs[seqs[i]];
            /* a sequence's n_min drafts are taken whatever they cost (its request asked for them) */
            const int di = q->p.drafter ? COTI_MIN(COTI_MAX(d, q->p.n_min), q->p.n_max) : 0;
            double t, k;
            depth_expected(&q->dp.rec, di, &t, &k);
            tok += t;
            drafts += k;
            t_drafts += k * draft_cost_us(e, q->p.drafter);
        }
        /* the sequences' mean rows, between the calibrated whole numbers of rows */
        const double rows = 1.0 + drafts / n_live;
        const int r0 = (int)rows;
        const double v0 = verify_us(e, n_live, r0), v = v0 + (verify_us(e, n_live, r0 + 1) - v0) * (rows - r0);
        const struct depth_mean *took = &e->step_us[n_live - 1][d];
        const double rate = tok / (took->n ? took->v : v + t_drafts);
        if (best < 0 || rate > best_rate) { best = d; best_rate = rate; }
    }
    /* now and then one draft more than pays, for a few cycles: a record that drafts do not pay
     * is otherwise never asked again, and the text (or the load) may have changed */
    if (e->explore_left > 0) {
        e->explore_left--;
        best = COTI_MIN(e->explore_d, d_top);
    } else if (++e->batch_cycles % SPEC_BATCH_EXPLORE_EVERY == 0 && best < d_top) {
        e->explore_d = ++best;
        e->explore_left = SPEC_BATCH_EXPLORE_LEN - 1;
    }
    for (int i = 0; i < n; i++) {
        if (rc[i]) continue;
        const struct spec_seq *q = &e->seqs[seqs[i]];
        depth[i] = q->p.drafter ? COTI_MIN(COTI_MAX(best, q->p.n_min), q->p.n_max) : 0;
    }
    return best;
}

/* Calibration points of at most this many rows take the best of 5 runs on any backend. */
#define SPEC_COST_FEW_ROWS 32

int spec_engine_calibrate(struct spec_engine *e, char *err, size_t err_size) {
    struct model *m = e->m;
    const int max_seqs = COTI_MIN(m->n_seq, SPEC_MAX_BATCH);
    e->cost_n = 0;
    for (int i = 0; i < n_drafter_kinds; i++) e->kinds[i].batch_draft_n = 0;
    memset(e->step_us, 0, sizeof e->step_us);
    e->step_n = 0;
    if (m->n_ctx <= SPEC_COST_ROWS) return 0; /* no room: batched cycles draft as asked */
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)m->n_batch);
    if (!toks) return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory");
    struct model_output o;
    int rc = 0;
    /* the best of 5 (a shape's first forward runs op by op, its second records a graph, the
     * rest replay it); without graphs the forwards of many rows, which dominate the time at
     * many slots, vary less and take the best of 3 */
    const bool graphs = m->be->capture_begin != NULL;
    for (int i = 0; i < SPEC_COST_SEQS && (1 << i) <= max_seqs; i++) {
        const int ns = 1 << i;
        int r = 1;
        for (; r <= SPEC_COST_ROWS && ns * r <= m->n_batch; r++) {
            const int R = ns * r;
            for (int k = 0; k < R; k++) {
                e->pos[k] = k % r;
                e->seqv[k] = k / r;
                e->want[k] = true;
                toks[k] = (int32_t)((7919u * (unsigned)k + 17u) % (unsigned)e->V);
            }
            double best = 0;
            const int reps = graphs || R <= SPEC_COST_FEW_ROWS ? 5 : 3;
            for (int rep = 0; rep < reps; rep++) {
                for (int s = 0; s < ns; s++) model_seq_reset(m, s);
                struct model_batch b = {.n = R, .tokens = toks, .pos = e->pos, .seq = e->seqv,
                                        .want_logits = e->want, .keep_states = true, .argmax_out = e->d_ids};
                const int64_t t0 = coti_time_us();
                if ((rc = model_forward(m, &b, &o, err, err_size))) break;
                m->be->sync(m->be);
                const double us = (double)(coti_time_us() - t0);
                best = rep == 0 || us < best ? us : best;
            }
            if (rc) break;
            /* more rows never cost less, nor more sequences: a point below the one before it
             * (rows) or below the fewer sequences' (same rows) is the machine's noise */
            double cost = r > 1 ? fmax(best, e->cost_us[i][r - 2]) : best;
            if (i > 0 && r <= e->cost_r[i - 1]) cost = fmax(cost, e->cost_us[i - 1][r - 1]);
            e->cost_us[i][r - 1] = cost;
        }
        e->cost_r[i] = r - 1;
        for (int s = 0; s < ns; s++) model_seq_reset(m, s);
        if (rc) {
            e->cost_n = 0;
            break;
        }
        if (r == 1) break; /* not even one row each fits a forward */
        e->cost_n = i + 1;
    }
    free(toks);
    return rc;
}

void spec_engine_set_queued(struct spec_engine *e, bool on) { e->queued = on; }

double spec_engine_verify_cost_us(const struct spec_engine *e, int n_seqs, int rows) {
    return e->cost_n && n_seqs >= 1 && rows >= 1 ? verify_us(e, n_seqs, rows) : 0.0;
}

int spec_step_batch(struct spec_engine *e, int n, const int *seqs, const int *max_new, int32_t (*out)[SPEC_MAX_DRAFT + 1],
                    int *n_out, int *rc, struct spec_probe *const *probes, char *err, size_t err_size) {
    struct model *m = e->m;
    struct backend *be = m->be;
    struct cycle c[SPEC_MAX_BATCH];
    if (n < 0 || n > SPEC_MAX_BATCH) return coti_fail(err, err_size, COTI_E_ARG, "%d sequences in a batch (at most %d)", n, SPEC_MAX_BATCH);
    for (int i = 0; i < n; i++) {
        n_out[i] = 0;
        rc[i] = seqs[i] < 0 || seqs[i] >= m->n_seq ? coti_fail(err, err_size, COTI_E_ARG, "sequence %d out of range", seqs[i]) : 0;
        for (int j = 0; j < i && !rc[i]; j++)
            if (seqs[j] == seqs[i]) rc[i] = coti_fail(err, err_size, COTI_E_ARG, "sequence %d twice in a batch", seqs[i]);
    }
    const int64_t t_step = coti_time_us();
    int depth[SPEC_MAX_BATCH];
    const int step_d = batch_depths(e, n, seqs, rc, depth);
    /* drafts first, every sequence's: greedy on-device ones of a drafter that batches them in
     * one call per drafter (each chain step for all its sequences at once), the rest one by one;
     * those the previous step queued are there already */
    bool live[SPEC_MAX_BATCH], need[SPEC_MAX_BATCH], fresh = false;
    struct draft_request rq[SPEC_MAX_BATCH];
    for (int i = 0; i < n; i++) {
        live[i] = !rc[i] && max_new[i] >= 1;
        need[i] = false;
        if (live[i] && (rc[i] = cycle_plan(e, seqs[i], max_new[i], depth[i], probes ? probes[i] : NULL, &c[i], &rq[i], &need[i],
                                           err, err_size)))
            live[i] = false;
        fresh = fresh || (live[i] && need[i]);
    }
    /* the drafts' time between two device marks, without a sync in between: this step's draft
     * phase, or else the drafts the previous one queued (they are the ones this step verifies) */
    int n_drafted = 0, drafted_kind = -1, mark_from = 0;
    if (fresh) {
        be->mark(be, 0);
    } else {
        n_drafted = e->queued_n;
        drafted_kind = e->queued_kind;
        mark_from = SPEC_MARK_QUEUED;
    }
    e->queued_n = 0;
    for (int t = 0; t < n_drafter_kinds; t++) {
        struct drafter *d = e->drafters[t];
        if (!d || !d->vt->draft_batch) continue;
        int idx[SPEC_MAX_BATCH], bs[SPEC_MAX_BATCH], nb = 0;
        struct draft_request brq[SPEC_MAX_BATCH];
        struct draft_result bdr[SPEC_MAX_BATCH];
        for (int i = 0; i < n; i++)
            if (live[i] && need[i] && drafter_for(e, e->seqs[seqs[i]].p.drafter) == d && !rq[i].sampler && rq[i].p_min <= 0.0f) {
                idx[nb] = i;
                bs[nb] = seqs[i];
                brq[nb++] = rq[i];
            }
        if (nb < 2) continue;
        int drc = d->vt->draft_batch(d, nb, bs, brq, bdr, err, err_size);
        for (int j = 0; j < nb; j++) {
            need[idx[j]] = false;
            c[idx[j]].dr = bdr[j];
            if (drc) { rc[idx[j]] = drc; live[idx[j]] = false; }
        }
    }
    for (int i = 0; i < n; i++) {
        if (live[i] && need[i]) {
            struct drafter *d = drafter_for(e, e->seqs[seqs[i]].p.drafter);
            if ((rc[i] = d->vt->draft(d, seqs[i], &rq[i], &c[i].dr, err, err_size))) live[i] = false;
        }
        if (live[i] && (rc[i] = cycle_drafted(e, &c[i], probes ? probes[i] : NULL, err, err_size))) live[i] = false;
        if (fresh && live[i] && c[i].k_drafted > 0) {
            const int ki = kind_index(e->seqs[seqs[i]].p.drafter);
            drafted_kind = n_drafted == 0 || drafted_kind == ki ? ki : -1; /* -1: kinds mixed */
            n_drafted += c[i].k_drafted;
        }
    }
    if (fresh) be->mark(be, 1);
    double t_drafts = -1.0; /* the drafts' time, read once the first forward's results are in */
    /* then verify rows of as many sequences as n_batch holds per forward (a sequence's rows are
     * never split: its states are kept for the last run of each sequence) */
    for (int i0 = 0; i0 < n;) {
        int rows = 0, i1 = i0;
        bool any_greedy = false, any_on_device = false;
        /* the batch's tokens: what the host knows goes up in one copy; drafts left on the
         * device are copied over their rows after it */
        int32_t htoks[SPEC_MAX_BATCH * (1 + SPEC_MAX_DRAFT)];
        /* (a sequence with more rows than n_batch goes alone: the forward splits it, as it
         * would its spec_seq_step) */
        for (; i1 < n && (!live[i1] || rows == 0 || rows + c[i1].k + 1 <= m->n_batch); i1++) {
            if (!live[i1]) continue;
            struct cycle *ci = &c[i1];
            ci->row0 = rows;
            for (int r = 0; r <= ci->k; r++) {
                e->pos[rows + r] = ci->L + r;
                e->seqv[rows + r] = ci->s;
                e->want[rows + r] = true;
                htoks[rows + r] = r == 0 || !ci->dr.on_device ? ci->toks[r] : -1;
            }
            rows += ci->k + 1;
            any_greedy = any_greedy || ci->greedy;
            any_on_device = any_on_device || (ci->dr.on_device && ci->k > 0);
        }
        if (rows == 0) { i0 = i1; continue; }
        be->upload(be, e->d_btoks, htoks, sizeof(int32_t) * (size_t)rows);
        void *cdst[SPEC_MAX_BATCH];
        const void *csrc[SPEC_MAX_BATCH];
        size_t cbytes[SPEC_MAX_BATCH];
        int nc = 0;
        for (int i = i0; i < i1; i++)
            if (live[i] && c[i].dr.on_device && c[i].k > 0) {
                cdst[nc] = e->d_btoks + c[i].row0 + 1;
                csrc[nc] = seq_dev_tokens(e, c[i].s) + 1;
                cbytes[nc++] = sizeof(int32_t) * (size_t)c[i].k;
            }
        if (nc) be->copy_n(be, cdst, csrc, cbytes, nc);
        bool keep = false;
        for (int i = i0; i < i1; i++) keep = keep || (live[i] && c[i].k > 0);
        struct model_batch b = {.n = rows, .tokens_dev = e->d_btoks, .pos = e->pos, .seq = e->seqv, .want_logits = e->want,
                                .keep_states = keep, .argmax_out = any_greedy ? e->d_ids : NULL};
        struct model_output o;
        int frc = model_forward(m, &b, &o, err, err_size);
        /* drafters that follow the target run ahead over these rows now: the wait below covers
         * them, and the next drafts start where they end */
        const bool ahead = !frc && batch_run_ahead(e, c + i0, i1 - i0, live + i0, rc + i0, probes ? probes + i0 : NULL, &o,
                                                   err, err_size);
        /* one wait: every row's argmax and the drafts the device made (d_btoks follows d_ids) */
        int32_t got[2 * SPEC_MAX_BATCH * (1 + SPEC_MAX_DRAFT)], toks[SPEC_MAX_BATCH * (1 + SPEC_MAX_DRAFT)];
        const int32_t *ids = got;
        memcpy(toks, htoks, sizeof(int32_t) * (size_t)rows);
        if (!frc && any_on_device) {
            be->download(be, got, e->d_ids, sizeof(int32_t) * (size_t)(e->batch_rows + rows));
            memcpy(toks, got + e->batch_rows, sizeof(int32_t) * (size_t)rows);
        } else if (!frc && any_greedy) {
            be->download(be, got, e->d_ids, sizeof(int32_t) * (size_t)rows);
        }
        /* the draft phase's time: every sequence's share of the cycle (statistics), and its cost
         * per drafted token for the next depths */
        if (!frc && t_drafts < 0.0) {
            t_drafts = fresh || n_drafted > 0 ? be->mark_elapsed_us(be, mark_from, mark_from + 1) : 0.0;
            if (ahead) t_drafts += be->mark_elapsed_us(be, SPEC_MARK_AHEAD, SPEC_MARK_AHEAD + 1);
            if (n_drafted > 0 && drafted_kind >= 0 && e->cost_n > 0) {
                struct kind_depth *kd = &e->kinds[drafted_kind];
                kd->batch_draft_us[kd->batch_draft_n++ % SPEC_DRAFT_SAMPLES] = t_drafts / n_drafted;
            }
        }
        const int64_t t2 = coti_time_us();
        for (int i = i0; i < i1; i++) {
            if (!live[i]) continue;
            struct cycle *ci = &c[i];
            if (frc) { rc[i] = frc; continue; }
            for (int r = 0; r < ci->k; r++) ci->dr.tokens[r] = toks[ci->row0 + 1 + r];
            ci->dr.on_device = false;
            int32_t acc[2 + SPEC_MAX_DRAFT];
            if (ci->greedy) { /* accept_greedy on the host: drafts while they equal the row before's argmax */
                int a = 0;
                while (a < ci->k && ci->dr.tokens[a] == ids[ci->row0 + a]) { acc[1 + a] = ci->dr.tokens[a]; a++; }
                acc[0] = a;
                acc[1 + a] = ids[ci->row0 + a];
            }
            rc[i] = cycle_pick(e, ci, &o, acc, probes ? probes[i] : NULL, err, err_size);
        }
        /* every pick has read its rows: now the drafters may run (their forwards may reuse the
         * verify's output memory) */
        for (int i = i0; i < i1; i++)
            if (live[i] && !rc[i])
                rc[i] = cycle_commit(e, &c[i], COTI_MIN((int64_t)COTI_MAX(t_drafts, 0.0), t2 - c[i].t0), t2, out[i], &n_out[i],
                                     err, err_size);
        batch_observe(e, c + i0, i1 - i0, live + i0, rc + i0, &o, err, err_size);
        const int64_t t3 = coti_time_us();
        for (int i = i0; i < i1; i++)
            if (live[i] && !rc[i]) e->seqs[c[i].s].st.t_glue_us += t3 - t2;
        i0 = i1;
    }
    /* the next drafts are queued at this cycle's depth (the next batch is likely to choose it
     * again); a sequence left without drafts that are of any use lets its drafter stop
     * following */
    const int64_t t4 = coti_time_us();
    for (int i = 0; i < n; i++) {
        if (!live[i] || rc[i]) continue;
        struct spec_seq *q = &e->seqs[c[i].s];
        q->depth = depth[i];
        /* (a count that stops where it acts: batches may run for weeks) */
        q->batch_idle = depth[i] > 0 ? 0 : COTI_MIN(q->batch_idle + 1, SPEC_BATCH_IDLE_SKIP);
        if (!(probes && probes[i])) seq_release_drafter(e, c[i].s);
    }
    batch_queue_next(e, c, n, live, rc, err, err_size);
    const int64_t t5 = coti_time_us();
    int n_live = 0;
    for (int i = 0; i < n; i++)
        if (live[i] && !rc[i]) {
            e->seqs[c[i].s].st.t_glue_us += t5 - t4;
            n_live++;
        }
    /* the step's time at its depth, when steady (batch_depths) */
    if (step_d >= 0 && n_live > 0 && n_live == e->step_n && step_d == e->step_d)
        depth_cost_add(&e->step_us[n_live - 1][step_d], (double)(t5 - t_step));
    e->step_n = n_live;
    e->step_d = step_d;
    return 0;
}
