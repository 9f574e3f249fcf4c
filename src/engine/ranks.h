/* ranks.h — the ranks of a tensor-parallel split behind rank 0's model (issue 25; the plan:
 * docs/notes/2026-12-05-tensor-parallel.md). Every engine entry that computes or changes a
 * sequence runs on each rank (engine.c): the forwards at once, one host thread per rank, since
 * the ranks meet in their all_reduce; the memory operations one rank after the other. Drivers and
 * drafters see one model, rank 0, whose outputs they read; the other ranks write theirs to
 * buffers of their own. */
#ifndef COTI_ENGINE_RANKS_H
#define COTI_ENGINE_RANKS_H

#include "model.h"
#include "tp.h"

struct engine_ranks {
    int n;
    struct model *m[TP_MAX_RANKS];
    struct backend *be[TP_MAX_RANKS];    /* ranks 1.. : owned (rank 0's is the caller's) */
    struct tp_comm *comm;
    struct threadpool *pool;             /* n threads: the caller runs rank 0 */
    /* ranks 1.. : where a forward's argmax_out / accept_out / hidden_out go instead */
    int32_t *ids[TP_MAX_RANKS];          /* [2 * n_batch + 1] */
    float *hidden[TP_MAX_RANKS];         /* [n_batch][n_embd] */
};

/* Load `path` as n ranks (2..TP_MAX_RANKS), rank r onto bes[r] (distinct backends that can be
 * ranks: tp.h tp_attach), p's tp fields ignored, and return rank 0 as *out. On success *out owns
 * bes[1..n) (model_free frees them); bes[0] stays the caller's. On failure nothing is kept but the
 * backends, which stay the caller's. */
int engine_ranks_load(struct model **out, const char *path, struct backend *const *bes, int n,
                      const struct model_params *p, char *err, size_t err_size);
void engine_ranks_free(struct engine_ranks *r);
/* fn(m[r], r, ctx) for every rank at once; returns when all have. */
void engine_ranks_run(struct engine_ranks *r, void (*fn)(struct model *m, int rank, void *ctx), void *ctx);

#endif
