/* memory.c — per-sequence memory of a model: lengths, reset, rollback of a verify's rejected
 * tokens, copy between sequences, over the KV caches and recurrent state it holds. */
#include "memory/memory.h"

#include <stdlib.h>

void mem_regions_add(struct mem_regions *g, void *dst, const void *src, size_t bytes, size_t step) {
    if (g->n == g->cap) return; /* sized by memory_init for every region a sequence has */
    g->dst[g->n] = dst;
    g->src[g->n] = src;
    g->bytes[g->n] = bytes;
    g->step[g->n] = step;
    g->n++;
}

int memory_init(struct memory *mem, struct backend *be, const struct memory_params *p) {
    *mem = (struct memory){.be = be, .n_seq = p->n_seq, .n_ctx = p->n_ctx};
    const size_t ns = (size_t)p->n_seq;
    mem->seq_len = calloc(ns, sizeof(int32_t));
    mem->head_len = calloc(ns, sizeof(int32_t));
    mem->last_run_len = calloc(ns, sizeof(int32_t));
    mem->last_run_kept = calloc(ns, sizeof(bool));
    mem->last_run_restored = calloc(ns, sizeof(bool));
    const size_t n_ck = ns * MEM_N_CHECKPOINTS;
    mem->n_embd = p->n_embd;
    mem->ck_pos = malloc(sizeof(int32_t) * n_ck);
    mem->ck_age = calloc(n_ck, sizeof(uint64_t));
    mem->ck_has_hidden = calloc(n_ck, sizeof(bool));
    for (size_t i = 0; mem->ck_pos && i < n_ck; i++) mem->ck_pos[i] = -1;
    /* two regions (K and V) per attention layer, three (conv, delta state, pending row) per
     * recurrent layer, twice when a resume also copies a checkpoint, and one hidden row */
    struct mem_regions *g = &mem->rg;
    g->cap = 2 * (p->n_kv + p->n_head_kv) + 6 * p->n_rec + 1;
    const size_t cap = (size_t)COTI_MAX(g->cap, 1);
    g->dst = calloc(cap, sizeof *g->dst);
    g->src = calloc(cap, sizeof *g->src);
    g->step = calloc(cap, sizeof *g->step);
    g->bytes = calloc(cap, sizeof *g->bytes);
    if (!mem->seq_len || !mem->head_len || !mem->last_run_len || !mem->last_run_kept || !mem->last_run_restored ||
        !mem->ck_pos || !mem->ck_age || !mem->ck_has_hidden || !g->dst || !g->src || !g->step || !g->bytes)
        return COTI_E_NOMEM;
    if (p->n_embd > 0 && !(mem->ck_hidden = be->alloc(be, sizeof(float) * n_ck * (size_t)p->n_embd))) return COTI_E_NOMEM;
    /* a rollback drops at most a kept run (memory_seq_rollback), a forward writes at most n_batch */
    const int n_rows = mem->n_rows = COTI_MAX(p->n_batch, p->n_keep);
    int rc = kv_cache_init(&mem->kv, be, p->kv, p->n_kv, p->n_seq, p->n_ctx, n_rows, p->k_type, p->v_type);
    if (!rc) rc = rec_state_init(&mem->rec, be, p->n_rec, p->n_seq, p->n_keep, MEM_N_CHECKPOINTS, p->conv_elems, p->rule);
    if (!rc) rc = kv_cache_init(&mem->head, be, p->head_kv, p->n_head_kv, p->n_seq, p->n_ctx, n_rows, p->k_type, p->v_type);
    return rc;
}

void memory_kv_bytes_per_seq(const struct memory *mem, size_t *k_bytes, size_t *v_bytes) {
    size_t hk, hv;
    kv_cache_bytes_per_seq(&mem->kv, k_bytes, v_bytes);
    kv_cache_bytes_per_seq(&mem->head, &hk, &hv);
    *k_bytes += hk;
    *v_bytes += hv;
}

size_t memory_bytes_per_seq(const struct memory *mem) {
    const struct rec_state *r = &mem->rec;
    const size_t rec = (size_t)r->n_layer *
                       ((1 + (size_t)r->n_slots + (size_t)r->n_ck) * (r->conv_elems + r->ssm_elems) +
                        (1 + (size_t)r->n_ck) * r->pend_elems) * sizeof(float);
    size_t k, v;
    memory_kv_bytes_per_seq(mem, &k, &v);
    return k + v + rec;
}

void memory_free(struct memory *mem) {
    if (mem->kv.be) kv_cache_free(&mem->kv);
    if (mem->rec.be) rec_state_free(&mem->rec);
    if (mem->head.be) kv_cache_free(&mem->head);
    free(mem->seq_len); free(mem->head_len);
    free(mem->last_run_len); free(mem->last_run_kept); free(mem->last_run_restored);
    free(mem->rg.dst); free(mem->rg.src); free(mem->rg.step); free(mem->rg.bytes);
    if (mem->ck_hidden) mem->be->free(mem->be, mem->ck_hidden);
    free(mem->ck_pos); free(mem->ck_age); free(mem->ck_has_hidden);
    *mem = (struct memory){0};
}

void memory_note_run(struct memory *mem, int s, int len, bool kept, bool restored) {
    mem->seq_len[s] += len;
    mem->last_run_len[s] = len;
    mem->last_run_kept[s] = kept;
    mem->last_run_restored[s] = restored;
}

void memory_restore_at(struct memory *mem, int s, const int32_t *accepted, int n) {
    struct backend *be = mem->be;
    struct mem_regions *g = &mem->rg;
    const bool pend = mem->rec.pending;
    if (!mem->rec.n_layer) return;
    /* rows 0 .. n-2 may end the kept prefix: their conv states (and the pending last row's
     * drop); the delta state after row n-2 is live already where the last row was pending */
    g->n = 0;
    rec_restore_regions(&mem->rec, s, true, !pend, g);
    be->copy_n_at(be, g->dst, g->src, g->step, g->bytes, g->n, accepted, n - 1);
    if (pend && n > 2) {
        g->n = 0;
        rec_restore_regions(&mem->rec, s, false, true, g);
        be->copy_n_at(be, g->dst, g->src, g->step, g->bytes, g->n, accepted, n - 2);
    }
}

/* Forget sequence s's checkpoints past position len (all of them: len -1). */
static void ck_drop_after(struct memory *mem, int s, int len) {
    for (int k = 0; k < MEM_N_CHECKPOINTS; k++)
        if (mem->ck_pos[s * MEM_N_CHECKPOINTS + k] > len) mem->ck_pos[s * MEM_N_CHECKPOINTS + k] = -1;
}

static void ck_clear(struct memory *mem, int s) { ck_drop_after(mem, s, -1); }

void memory_seq_reset(struct memory *mem, int s) {
    if (s < 0 || s >= mem->n_seq) return;
    ck_clear(mem, s);
    /* attention cells need no clearing: a position is always written before it is read */
    rec_seq_zero(&mem->rec, s);
    mem->seq_len[s] = 0;
    mem->head_len[s] = 0;
    mem->last_run_len[s] = 0;
    mem->last_run_restored[s] = false;
}

int memory_seq_rollback(struct memory *mem, int s, int n_drop) {
    struct backend *be = mem->be;
    if (s < 0 || s >= mem->n_seq || n_drop < 0) return COTI_E_ARG;
    if (n_drop == 0) return 0;
    const int r = mem->last_run_len[s];
    const int keep_idx = r - 1 - n_drop; /* the state after this token of the last run survives */
    if (!mem->last_run_kept[s] || keep_idx < 0 || keep_idx >= COTI_MIN(r - 1, mem->rec.n_keep)) return COTI_E_RANGE;
    if (mem->kv.win.ring && n_drop > mem->n_rows) return COTI_E_RANGE; /* the ring kept no more (kv.h) */
    /* a greedy verify restored the state on the device already (its accepted count is n_drop's
     * complement: the caller drops exactly the rejected drafts) */
    if (!mem->last_run_restored[s] && mem->rec.n_layer) {
        struct mem_regions *g = &mem->rg;
        g->n = 0;
        /* with the last row pending, the delta state after row r - 2 is the live one */
        rec_restore_regions(&mem->rec, s, true, !mem->rec.pending || keep_idx < r - 2, g);
        for (int i = 0; i < g->n; i++) g->src[i] = (const uint8_t *)g->src[i] + (size_t)keep_idx * g->step[i];
        be->copy_n(be, g->dst, g->src, g->bytes, g->n);
    }
    mem->seq_len[s] -= n_drop;
    /* the head keeps at most the pending token's row (one that ran ahead over the verify
     * computed it from the kept rows) */
    if (mem->head_len[s] > mem->seq_len[s] + 1) mem->head_len[s] = mem->seq_len[s] + 1;
    ck_drop_after(mem, s, mem->seq_len[s]);
    mem->last_run_len[s] = keep_idx + 1;
    mem->last_run_kept[s] = false;
    mem->last_run_restored[s] = false;
    return 0;
}

int memory_seq_copy(struct memory *mem, int dst, int src) {
    if (dst < 0 || dst >= mem->n_seq || src < 0 || src >= mem->n_seq) return COTI_E_ARG;
    if (dst == src) return 0;
    /* every region in one copy_n: the recurrent state, the cells the source holds, the head's */
    struct mem_regions *g = &mem->rg;
    g->n = 0;
    rec_copy_regions(&mem->rec, dst, src, g);
    kv_copy_regions(&mem->kv, dst, src, mem->seq_len[src], g);
    kv_copy_regions(&mem->head, dst, src, mem->head_len[src], g);
    mem->be->copy_n(mem->be, g->dst, g->src, g->bytes, g->n);
    mem->seq_len[dst] = mem->seq_len[src];
    mem->head_len[dst] = mem->head_len[src];
    ck_clear(mem, dst);
    mem->last_run_len[dst] = 0;
    mem->last_run_kept[dst] = false;
    mem->last_run_restored[dst] = false;
    return 0;
}

void memory_head_truncate(struct memory *mem, int s, int n) {
    if (s >= 0 && s < mem->n_seq && n >= 0 && n < mem->head_len[s]) mem->head_len[s] = n;
}

void memory_head_skip(struct memory *mem, int s, int n) {
    if (s >= 0 && s < mem->n_seq && n > mem->head_len[s] && n <= mem->seq_len[s]) mem->head_len[s] = n;
}

/* ---- checkpoints ---------------------------------------------------------------------- */

static float *ck_hidden_row(const struct memory *mem, int s, int k) {
    return mem->ck_hidden + ((size_t)s * MEM_N_CHECKPOINTS + (size_t)k) * (size_t)mem->n_embd;
}

void memory_checkpoint(struct memory *mem, int s, const float *hidden) {
    if (s < 0 || s >= mem->n_seq) return;
    const int len = mem->seq_len[s];
    int32_t *pos = mem->ck_pos + s * MEM_N_CHECKPOINTS;
    uint64_t *age = mem->ck_age + s * MEM_N_CHECKPOINTS;
    int k = -1;
    for (int i = 0; i < MEM_N_CHECKPOINTS && k < 0; i++)
        if (pos[i] == len) k = i;
    for (int i = 0; i < MEM_N_CHECKPOINTS && k < 0; i++)
        if (pos[i] < 0) k = i;
    if (k < 0) {
        k = 0;
        for (int i = 1; i < MEM_N_CHECKPOINTS; i++)
            if (age[i] < age[k]) k = i;
    }
    struct mem_regions *g = &mem->rg;
    g->n = 0;
    rec_ck_save_regions(&mem->rec, s, k, g);
    const bool has_hidden = hidden && mem->ck_hidden;
    if (has_hidden) mem_regions_add(g, ck_hidden_row(mem, s, k), hidden, sizeof(float) * (size_t)mem->n_embd, 0);
    if (g->n) mem->be->copy_n(mem->be, g->dst, g->src, g->bytes, g->n);
    pos[k] = len;
    age[k] = ++mem->ck_clock;
    mem->ck_has_hidden[s * MEM_N_CHECKPOINTS + k] = has_hidden;
}

/* Whether src's sliding-window ring still holds the window of positions before q. */
static bool ring_holds(const struct memory *mem, int src, int q) {
    const struct kv_cells *w = &mem->kv.win;
    return !w->ring || q == 0 || q - w->window + 1 >= mem->seq_len[src] - w->ring;
}

/* Resume point v (hidden row h) into q[0, *n), longest first. */
static void points_insert(int *q, const float **hidden, int *n, int v, const float *h) {
    int at = 0;
    while (at < *n && q[at] > v) at++;
    for (int i = *n; i > at; i--) { q[i] = q[i - 1]; hidden[i] = hidden[i - 1]; }
    q[at] = v;
    hidden[at] = h;
    (*n)++;
}

int memory_resume_points(const struct memory *mem, int src, int p, int *q, const float **hidden, int max) {
    if (src < 0 || src >= mem->n_seq || max < 1) return 0;
    int n = 0;
    const int len = mem->seq_len[src];
    const int32_t *pos = mem->ck_pos + src * MEM_N_CHECKPOINTS;
    /* the checkpoints, longest first (their hidden rows known), then the live length */
    int taken[MEM_N_CHECKPOINTS] = {0};
    for (;;) {
        int best = -1;
        for (int k = 0; k < MEM_N_CHECKPOINTS; k++)
            if (!taken[k] && pos[k] > 0 && pos[k] <= p && pos[k] <= len && ring_holds(mem, src, pos[k]) &&
                (best < 0 || pos[k] > pos[best]))
                best = k;
        if (best < 0 || n == max) break;
        taken[best] = 1;
        q[n] = pos[best];
        hidden[n] = mem->ck_has_hidden[src * MEM_N_CHECKPOINTS + best] ? ck_hidden_row(mem, src, best) : NULL;
        n++;
    }
    if (len > 0 && len <= p && n < max) {
        /* the live state: a checkpoint at the same length already gave its hidden row */
        bool dup = false;
        for (int i = 0; i < n; i++) dup = dup || q[i] == len;
        if (!dup) points_insert(q, hidden, &n, len, NULL);
    }
    /* without recurrent layers any shorter prefix of the cells is one too */
    if (!mem->rec.n_layer && n < max && COTI_MIN(p, len) > 0 && (n == 0 || q[0] < COTI_MIN(p, len)) &&
        ring_holds(mem, src, COTI_MIN(p, len)))
        points_insert(q, hidden, &n, COTI_MIN(p, len), NULL);
    return n;
}

int memory_seq_resume(struct memory *mem, int dst, int src, int q) {
    if (dst < 0 || dst >= mem->n_seq || src < 0 || src >= mem->n_seq || q < 0 || q > mem->seq_len[src])
        return COTI_E_ARG;
    int k = -1;
    for (int i = 0; i < MEM_N_CHECKPOINTS; i++)
        if (mem->ck_pos[src * MEM_N_CHECKPOINTS + i] == q) k = i;
    const bool live = q == mem->seq_len[src];
    if ((!live && k < 0 && mem->rec.n_layer) || !ring_holds(mem, src, q)) return COTI_E_RANGE;
    struct mem_regions *g = &mem->rg;
    g->n = 0;
    const int head = COTI_MIN(mem->head_len[src], q);
    const int kd = 0;            /* dst keeps the checkpoint at q in its first slot */
    if (dst != src) {
        kv_copy_regions(&mem->kv, dst, src, q, g);
        kv_copy_regions(&mem->head, dst, src, head, g);
    }
    if (k >= 0) {
        /* the state at q from the checkpoint (also when live: the same state), which dst keeps */
        if (dst != src || !live) rec_ck_load_regions(&mem->rec, dst, src, k, dst == src ? k : kd, g);
        if (dst != src && mem->ck_has_hidden[src * MEM_N_CHECKPOINTS + k])
            mem_regions_add(g, ck_hidden_row(mem, dst, kd), ck_hidden_row(mem, src, k), sizeof(float) * (size_t)mem->n_embd, 0);
    } else if (dst != src) {
        rec_copy_regions(&mem->rec, dst, src, g);
    }
    if (g->n) mem->be->copy_n(mem->be, g->dst, g->src, g->bytes, g->n);
    if (dst != src) {
        const bool had_hidden = k >= 0 && mem->ck_has_hidden[src * MEM_N_CHECKPOINTS + k];
        ck_clear(mem, dst);
        if (k >= 0) {
            mem->ck_pos[dst * MEM_N_CHECKPOINTS + kd] = q;
            mem->ck_age[dst * MEM_N_CHECKPOINTS + kd] = ++mem->ck_clock;
            mem->ck_has_hidden[dst * MEM_N_CHECKPOINTS + kd] = had_hidden;
        }
    } else {
        ck_drop_after(mem, dst, q);
    }
    mem->seq_len[dst] = q;
    mem->head_len[dst] = head;
    mem->last_run_len[dst] = 0;
    mem->last_run_kept[dst] = false;
    mem->last_run_restored[dst] = false;
    return 0;
}
