/* threadpool.h — a fixed pool of worker threads for data-parallel ops (ggml's shape):
 * one pool made at init, each job receives (ith, nth) and splits its rows itself; the caller
 * takes part as thread 0; threadpool_run returns when every thread has finished the job.
 * Workers spin briefly between jobs (decode issues hundreds of small jobs per token, and a
 * sleep/wake costs more than the job), then fall back to a condition variable when idle. */
#ifndef COTI_THREADPOOL_H
#define COTI_THREADPOOL_H

#include <stdatomic.h>

struct threadpool;
typedef void (*threadpool_fn)(void *ctx, int ith, int nth);

/* n_threads >= 1 (1 = run everything on the caller). NULL on failure. */
struct threadpool *threadpool_init(int n_threads);
void threadpool_free(struct threadpool *tp);
int threadpool_n_threads(const struct threadpool *tp);
/* Run fn(ctx, ith, nth) on every thread; not reentrant (one job at a time). */
void threadpool_run(struct threadpool *tp, threadpool_fn fn, void *ctx);
/* Inside a job: wait until all nth threads of the job have arrived. *count starts at 0 and
 * serves one such meeting (the job's threads all run at once, so none waits forever). */
void threadpool_meet(atomic_int *count, int nth);

#endif
