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
    /* two regions (K and V, or conv and delta state) per layer */
    struct mem_regions *g = &mem->rg;
    g->cap = 2 * (p->n_kv + p->n_rec + p->n_head_kv);
    const size_t cap = (size_t)COTI_MAX(g->cap, 1);
    g->dst = calloc(cap, sizeof *g->dst);
    g->src = calloc(cap, sizeof *g->src);
    g->step = calloc(cap, sizeof *g->step);
    g->bytes = calloc(cap, sizeof *g->bytes);
    if (!mem->seq_len || !mem->head_len || !mem->last_run_len || !mem->last_run_kept || !mem->last_run_restored ||
        !g->dst || !g->src || !g->step || !g->bytes)
        return COTI_E_NOMEM;
    /* a rollback drops at most a kept run (memory_seq_rollback), a forward writes at most n_batch */
    const int n_rows = mem->n_rows = COTI_MAX(p->n_batch, p->n_keep);
    int rc = kv_cache_init(&mem->kv, be, p->kv, p->n_kv, p->n_seq, p->n_ctx, n_rows, p->k_type, p->v_type);
    if (!rc) rc = rec_state_init(&mem->rec, be, p->n_rec, p->n_seq, p->n_keep, p->conv_elems, p->ssm_elems);
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
    const size_t rec = (size_t)r->n_layer * (1 + (size_t)r->n_slots) * (r->conv_elems + r->ssm_elems) * sizeof(float);
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
    *mem = (struct memory){0};
}

void memory_note_run(struct memory *mem, int s, int len, bool kept, bool restored) {
    mem->seq_len[s] += len;
    mem->last_run_len[s] = len;
    mem->last_run_kept[s] = kept;
    mem->last_run_restored[s] = restored;
}

int memory_restore_regions(struct memory *mem, int s) {
    mem->rg.n = 0;
    rec_restore_regions(&mem->rec, s, &mem->rg);
    return mem->rg.n;
}

void memory_seq_reset(struct memory *mem, int s) {
    if (s < 0 || s >= mem->n_seq) return;
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
        const int n = memory_restore_regions(mem, s);
        for (int i = 0; i < n; i++) g->src[i] = (const uint8_t *)g->src[i] + (size_t)keep_idx * g->step[i];
        be->copy_n(be, g->dst, g->src, g->bytes, n);
    }
    mem->seq_len[s] -= n_drop;
    if (mem->head_len[s] > mem->seq_len[s]) mem->head_len[s] = mem->seq_len[s];
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
    mem->last_run_len[dst] = 0;
    mem->last_run_kept[dst] = false;
    mem->last_run_restored[dst] = false;
    return 0;
}

void memory_head_truncate(struct memory *mem, int s, int n) {
    if (s >= 0 && s < mem->n_seq && n >= 0 && n < mem->head_len[s]) mem->head_len[s] = n;
}
