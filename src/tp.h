/* tp.h — tensor parallelism's communicator (issue 25; docs/notes/2026-12-05-tensor-parallel.md):
 * the ranks of one split, each a backend holding its share of the model, and the sum of a buffer
 * over them (the backends' all_reduce op). Ranks in one process on CPU backends sum through
 * host memory; CUDA ranks (NCCL) are step 3 of the plan. */
#ifndef COTI_TP_H
#define COTI_TP_H

#include "backend.h"

#define TP_MAX_RANKS 8

struct tp_comm;

/* A communicator of n ranks (2..TP_MAX_RANKS), or NULL (out of memory / n out of range). */
struct tp_comm *tp_comm_new(int n);
void tp_comm_free(struct tp_comm *c);
/* Backend be becomes rank `rank` of c: its all_reduce then sums over c's ranks. Refused (an error)
 * where the backend cannot join a split of several ranks (be->supports(all_reduce) is false). */
int tp_attach(struct backend *be, struct tp_comm *c, int rank, char *err, size_t err_size);
/* x[0, n) (host memory) of every rank = the sum of the ranks' x in rank order: the same bits on
 * every rank. Each rank calls it with the same n; it returns when all have. */
void tp_comm_sum_host(struct tp_comm *c, int rank, float *x, int64_t n);

#endif
