/* threadpool.c — see threadpool.h. A job is published by bumping `generation`; workers spin
 * on it for a while, then wait on a condition variable. Completion is a countdown. */
#include "threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <immintrin.h>

struct worker_arg { struct threadpool *tp; int ith; };

/* Spin iterations before a worker sleeps on the condition variable: pauses, then yields (see
 * below), milliseconds in all: longer than the gaps of a busy server, shorter than an idle one's. */
#define THREADPOOL_SPIN_ITERS 20000
/* Pause-spins before a waiting thread starts yielding its core (~50 us with this CPU's pause:
 * longer than most host glue between two ops of a decode step, so a waiting worker takes the
 * next job without a syscall in between). Without yields at all, a pool of 2 threads on a
 * machine where another process holds one core degraded ~20x (22.7 vs 433 tok/s). Yielding
 * early (after 200 spins) lost too: the default model, 2 threads, 1 sequence 2600 vs 2860 tok/s
 * (the worker was in sched_yield when a job came: 13 % of samples in the syscall), beside one
 * busy process 170 vs 940, beside two < 10 vs 474; 8000 spins gave the same as 2000. */
#define THREADPOOL_YIELD_AFTER 2000

struct threadpool {
    int n_threads;
    pthread_t *threads;
    struct worker_arg *args;
    threadpool_fn fn;
    void *ctx;
    atomic_uint generation;
    atomic_int pending;
    atomic_bool stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_int n_sleeping;
};


static void *worker_main(void *p) {
    struct worker_arg *a = p;
    struct threadpool *tp = a->tp;
    unsigned seen = 0; /* the pool's first generation; a job may be published before this thread runs */
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&tp->generation, memory_order_acquire)) == seen &&
               !atomic_load(&tp->stop)) {
            if (++spins < THREADPOOL_SPIN_ITERS) {
                /* past the first few µs, give the core away between checks: on an
                 * oversubscribed machine the thread we wait for may need this very core */
                if (spins > THREADPOOL_YIELD_AFTER) sched_yield();
                else _mm_pause();
                continue;
            }
            pthread_mutex_lock(&tp->mu);
            atomic_fetch_add(&tp->n_sleeping, 1);
            while (atomic_load(&tp->generation) == seen && !atomic_load(&tp->stop))
                pthread_cond_wait(&tp->cv, &tp->mu);
            atomic_fetch_sub(&tp->n_sleeping, 1);
            pthread_mutex_unlock(&tp->mu);
            spins = 0;
        }
        if (atomic_load(&tp->stop)) return NULL;
        seen = g;
        tp->fn(tp->ctx, a->ith, tp->n_threads);
        atomic_fetch_sub_explicit(&tp->pending, 1, memory_order_release);
    }
}

struct threadpool *threadpool_init(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    struct threadpool *tp = calloc(1, sizeof(*tp));
    if (!tp) return NULL;
    tp->n_threads = n_threads;
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->cv, NULL);
    if (n_threads > 1) {
        tp->threads = calloc((size_t)n_threads, sizeof(pthread_t));
        tp->args = calloc((size_t)n_threads, sizeof(struct worker_arg));
        if (!tp->threads || !tp->args) { tp->n_threads = 1; threadpool_free(tp); return NULL; }
        for (int i = 1; i < n_threads; i++) {
            tp->args[i].tp = tp;
            tp->args[i].ith = i;
            if (pthread_create(&tp->threads[i], NULL, worker_main, &tp->args[i]) != 0) {
                tp->n_threads = i; /* join only those that started */
                threadpool_free(tp);
                return NULL;
            }
        }
    }
    return tp;
}

void threadpool_free(struct threadpool *tp) {
    if (!tp) return;
    if (tp->threads && tp->n_threads > 1) {
        pthread_mutex_lock(&tp->mu);
        atomic_store(&tp->stop, true);
        pthread_cond_broadcast(&tp->cv);
        pthread_mutex_unlock(&tp->mu);
        for (int i = 1; i < tp->n_threads; i++) pthread_join(tp->threads[i], NULL);
    }
    free(tp->threads);
    free(tp->args);
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->cv);
    free(tp);
}

int threadpool_n_threads(const struct threadpool *tp) { return tp->n_threads; }

void threadpool_run(struct threadpool *tp, threadpool_fn fn, void *ctx) {
    if (tp->n_threads == 1) { fn(ctx, 0, 1); return; }
    tp->fn = fn;
    tp->ctx = ctx;
    atomic_store_explicit(&tp->pending, tp->n_threads - 1, memory_order_relaxed);
    atomic_fetch_add(&tp->generation, 1); /* seq_cst: pairs with n_sleeping */
    if (atomic_load(&tp->n_sleeping) > 0) {
        pthread_mutex_lock(&tp->mu);
        pthread_cond_broadcast(&tp->cv);
        pthread_mutex_unlock(&tp->mu);
    }
    fn(ctx, 0, tp->n_threads);
    for (int spins = 0; atomic_load_explicit(&tp->pending, memory_order_acquire) > 0; spins++) {
        if (spins > THREADPOOL_YIELD_AFTER) sched_yield();
        else _mm_pause();
    }
}

void threadpool_meet(atomic_int *count, int nth) {
    atomic_fetch_add_explicit(count, 1, memory_order_acq_rel);
    for (int spins = 0; atomic_load_explicit(count, memory_order_acquire) < nth; spins++) {
        if (spins > THREADPOOL_YIELD_AFTER) sched_yield();
        else _mm_pause();
    }
}
