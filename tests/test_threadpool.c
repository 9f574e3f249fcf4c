/* test_threadpool.c — the pool's jobs: every thread runs a job once, and a meeting inside a job
 * holds each thread until all have arrived (what the CPU matmul's formed rows rely on). */
#include <criterion/criterion.h>
#include <stdatomic.h>

#include "threadpool.h"

#define POOL_THREADS 4
#define MEET_ROUNDS 2000

struct meet_job {
    atomic_int met;
    atomic_int written[POOL_THREADS];
    int ran[POOL_THREADS];
    atomic_int missed_atomic;    /* threads that saw a slot unwritten after the meeting */
};

static void meet_worker(void *arg, int ith, int nth) {
    struct meet_job *j = arg;
    j->ran[ith]++;
    atomic_store_explicit(&j->written[ith], 1, memory_order_relaxed);
    threadpool_meet(&j->met, nth);
    for (int i = 0; i < nth; i++)
        if (!atomic_load_explicit(&j->written[i], memory_order_relaxed)) atomic_fetch_add(&j->missed_atomic, 1);
}

Test(threadpool, meeting_holds_every_thread_until_all_arrive) {
    struct threadpool *tp = threadpool_init(POOL_THREADS);
    cr_assert_not_null(tp);
    cr_assert_eq(threadpool_n_threads(tp), POOL_THREADS);
    int missed = 0;
    for (int r = 0; r < MEET_ROUNDS; r++) {
        struct meet_job j = {0};
        threadpool_run(tp, meet_worker, &j);
        for (int i = 0; i < POOL_THREADS; i++) cr_assert_eq(j.ran[i], 1, "round %d: thread %d ran %d times", r, i, j.ran[i]);
        cr_assert_eq(atomic_load(&j.met), POOL_THREADS);
        missed += atomic_load(&j.missed_atomic);
    }
    cr_assert_eq(missed, 0, "%d threads passed the meeting before every thread had arrived", missed);
    threadpool_free(tp);
}

Test(threadpool, one_thread_runs_on_the_caller_and_meets_alone) {
    struct threadpool *tp = threadpool_init(1);
    cr_assert_not_null(tp);
    struct meet_job j = {0};
    threadpool_run(tp, meet_worker, &j);
    cr_assert_eq(j.ran[0], 1);
    cr_assert_eq(atomic_load(&j.met), 1);
    cr_assert_eq(atomic_load(&j.missed_atomic), 0);
    threadpool_free(tp);
}
