/* graphs.c — the LRU cache of recorded small-slice forwards (graphs.h). */
#include "engine/graphs.h"

#include <stdlib.h>

static int n_slots(const struct graph_cache *c) { return GRAPHS_PER_SEQ * c->n_seq + GRAPHS_MULTI; }

int graph_cache_init(struct graph_cache *c, struct backend *be, int n_seq) {
    *c = (struct graph_cache){.be = be, .n_seq = n_seq};
    c->slots = calloc((size_t)n_slots(c), sizeof *c->slots);
    return c->slots ? 0 : COTI_E_NOMEM;
}

void graph_cache_free(struct graph_cache *c) {
    for (int i = 0; c->slots && i < n_slots(c); i++)
        if (c->slots[i].graph) c->be->graph_free(c->be, c->slots[i].graph);
    free(c->slots);
    c->slots = NULL;
}

/* The same slice: shape, flags and buffers, and for one sequence which one (its own buffers:
 * the verify's rollback, the draft head's stage). Several sequences' passes reach their states
 * only through the uploaded metadata (batch.h run_seq), so their graph serves any sequences:
 * a server's streams move over its slots. */
static bool key_eq(const struct graph_key *x, const struct graph_key *y) {
    if (x->pass != y->pass || x->n != y->n || x->n_runs != y->n_runs || x->want != y->want || x->keep != y->keep ||
        x->prompt != y->prompt)
        return false;
    for (int r = 0; r < x->n_runs; r++)
        if (x->runs[r].len != y->runs[r].len) return false;
    if (x->n_runs == 1 && x->runs[0].seq != y->runs[0].seq) return false;
    for (int i = 0; i < GRAPH_KEY_PTRS; i++)
        if (x->ptr[i] != y->ptr[i]) return false;
    return true;
}

/* Record the ops into slot g, offering its graph (if any: a stale one) for rewriting, and
 * launch them; the ops run eagerly where recording fails. */
static void record(struct graph_cache *c, struct graph_slot *g, void (*ops)(void *ctx), void *ctx) {
    struct backend *be = c->be;
    be->capture_begin(be);
    ops(ctx);
    void *ng = be->capture_end(be, g->graph);
    const bool updated = ng && ng == g->graph;
    if (!updated && g->graph) be->graph_free(be, g->graph);
    g->graph = ng;
    if (ng && be->graph_launch(be, ng)) {
        if (updated) c->stats.updated++;
        else c->stats.recorded++;
        return;
    }
    if (ng) be->graph_free(be, ng);
    g->graph = NULL;
    c->stats.eager++;
    ops(ctx);
}

void graph_cache_run(struct graph_cache *c, const struct graph_key *key, void (*ops)(void *ctx), void *ctx) {
    struct backend *be = c->be;
    struct graph_slot *g = NULL;
    /* one sequence: its own table; several: the shared one */
    const bool one = key->n_runs == 1;
    struct graph_slot *tab = c->slots + (one ? (size_t)key->runs[0].seq * GRAPHS_PER_SEQ : (size_t)GRAPHS_PER_SEQ * c->n_seq);
    struct graph_slot *lru = tab;
    const int n_tab = one ? GRAPHS_PER_SEQ : GRAPHS_MULTI;
    for (int i = 0; i < n_tab && !g; i++) {
        struct graph_slot *t = &tab[i];
        if (t->used && key_eq(&t->key, key)) g = t;
        else if (t->last_use < lru->last_use) lru = t;
    }
    if (!g) { /* first sighting */
        g = lru;
        if (g->graph) be->graph_free(be, g->graph);
        *g = (struct graph_slot){.used = true, .last_use = ++c->tick, .key = *key};
        c->stats.eager++;
        ops(ctx);
        return;
    }
    g->last_use = ++c->tick;
    /* a stale graph (the backend has since replaced scratch memory it used) is recorded again,
     * over itself: the same ops on other buffers, which the backend rewrites in place */
    if (g->graph && be->graph_launch(be, g->graph)) {
        c->stats.replayed++;
        return;
    }
    record(c, g, ops, ctx);
}
