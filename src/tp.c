/* tp.c — see tp.h. The host sum: each rank publishes its buffer, all meet, each sums every
 * rank's buffer in rank order into scratch of its own, all meet again (no buffer is written
 * before every rank has read it), then each copies its sum back. */
#include "tp.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct tp_comm {
    int n;
    pthread_barrier_t meet;
    float *x[TP_MAX_RANKS];      /* the buffers of the call in progress */
    float *sum[TP_MAX_RANKS];    /* each rank's scratch */
    int64_t sum_n[TP_MAX_RANKS];
};

struct tp_comm *tp_comm_new(int n) {
    if (n < 2 || n > TP_MAX_RANKS) return NULL;
    struct tp_comm *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->n = n;
    if (pthread_barrier_init(&c->meet, NULL, (unsigned)n) != 0) { free(c); return NULL; }
    return c;
}

void tp_comm_free(struct tp_comm *c) {
    if (!c) return;
    for (int r = 0; r < c->n; r++) free(c->sum[r]);
    pthread_barrier_destroy(&c->meet);
    free(c);
}

int tp_attach(struct backend *be, struct tp_comm *c, int rank, char *err, size_t err_size) {
    if (rank < 0 || rank >= c->n) return coti_fail(err, err_size, COTI_E_ARG, "rank %d of %d", rank, c->n);
    if (!be->supports(be, BACKEND_OP_all_reduce, GGML_TYPE_F32))
        return coti_fail(err, err_size, COTI_E_UNSUPPORTED, "this backend cannot be a rank of a tensor-parallel split yet");
    be->comm = c;
    be->rank = rank;
    return 0;
}

void tp_comm_sum_host(struct tp_comm *c, int rank, float *x, int64_t n) {
    if (n > c->sum_n[rank]) {
        free(c->sum[rank]);
        c->sum[rank] = malloc(sizeof(float) * (size_t)n);
        if (!c->sum[rank]) abort(); /* resource failure: the other ranks wait on this one */
        c->sum_n[rank] = n;
    }
    float *s = c->sum[rank];
    c->x[rank] = x;
    pthread_barrier_wait(&c->meet);
    memcpy(s, c->x[0], sizeof(float) * (size_t)n);
    for (int r = 1; r < c->n; r++) {
        const float *y = c->x[r];
        for (int64_t i = 0; i < n; i++) s[i] += y[i];
    }
    pthread_barrier_wait(&c->meet);
    memcpy(x, s, sizeof(float) * (size_t)n);
}
