/* graphs.h — recorded forwards of small slices (decode, draft rows, verify, and the batched
 * cycle's rows of several sequences) on backends that have graphs. A shape is recorded the
 * second time it is seen (the first run, eager, also grows the backend's scratch to it) and
 * replayed from then on, which turns a launch-bound step of a few hundred kernel launches into
 * one.
 *
 * The key is everything the recorded ops depend on besides device memory contents: the pass
 * (trunk, draft head), the run lengths (the rows' places in the scratch follow from them),
 * which rows want logits, whether states are kept, whether the rows are a prompt chunk
 * (backend.h set_prompt picks other kernels), the buffers the pass reads and writes, and for
 * one sequence which one. A pass over several sequences reaches their recurrent states through
 * the runs' sequences uploaded with the metadata (backend.h struct state_set), never through
 * a pointer of its own, so one graph serves a shape on any slots: a server's streams move over
 * its slots. A graph gone stale (the backend replaced scratch it used) is recorded again over
 * itself, which the backend rewrites in place (capture_end's reuse) instead of instantiating. */
#ifndef COTI_GRAPHS_H
#define COTI_GRAPHS_H

#include "backend.h"

#define GRAPH_MAX_ROWS 64
#define GRAPH_MAX_RUNS 64
/* Graph slots per sequence. A sequence's speculative cycle uses ~3·(n_max + 1) shapes (verify
 * rows, the head's catch-up rows, its chained row after each accepted count), and every short
 * prompt adds shapes seen once; the least recently used slot of the sequence is replaced, so
 * one-off shapes push out each other, not the cycle's. Every miss is an eager forward (hundreds
 * of launches) and the next sighting a recording. */
#define GRAPHS_PER_SEQ 48
/* Slots shared by slices of several sequences (the batched cycle): a set of busy slots decoding
 * without drafts is one shape per pass; drafts of varying depth make more. */
#define GRAPHS_MULTI 96
#define GRAPH_KEY_PTRS 8

struct graph_run { int seq, len; };

struct graph_key {
    int pass;
    int n, n_runs;
    struct graph_run runs[GRAPH_MAX_RUNS];
    uint64_t want;               /* rows that want logits, bit i = row i */
    bool keep;
    int prompt;                  /* the kernel family (backend.h set_prompt) */
    const void *ptr[GRAPH_KEY_PTRS];
};

struct graph_slot {
    bool used;
    uint64_t last_use;           /* tick when last looked up */
    struct graph_key key;
    void *graph;                 /* NULL: seen once, not recorded yet */
};

/* How the slices went: replayed from a graph, recorded (then replayed), recorded over its
 * stale graph rewritten in place (then replayed), run eagerly (first sighting, or recording
 * failed). */
struct graph_stats { uint64_t replayed, recorded, updated, eager; };

struct graph_cache {
    struct backend *be;
    struct graph_slot *slots;    /* [n_seq][GRAPHS_PER_SEQ], then [GRAPHS_MULTI] */
    int n_seq;
    uint64_t tick;
    struct graph_stats stats;
};

int graph_cache_init(struct graph_cache *c, struct backend *be, int n_seq);
void graph_cache_free(struct graph_cache *c);
/* Run ops(ctx) for the slice the key describes: replayed, recorded, or eager. */
void graph_cache_run(struct graph_cache *c, const struct graph_key *key, void (*ops)(void *ctx), void *ctx);

#endif
