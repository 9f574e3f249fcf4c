/* ranks.c — see ranks.h: loading the ranks, their threads and their private output buffers. */
#include "engine/ranks.h"
#include "engine/engine.h"
#include "threadpool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ranks_job {
    struct engine_ranks *r;
    void (*fn)(struct model *m, int rank, void *ctx);
    void *ctx;
};

static void ranks_worker(void *arg, int ith, int nth) {
    struct ranks_job *j = arg;
    j->fn(j->r->m[ith], ith, j->ctx);
}

void engine_ranks_run(struct engine_ranks *r, void (*fn)(struct model *m, int rank, void *ctx), void *ctx) {
    struct ranks_job j = {r, fn, ctx};
    threadpool_run(r->pool, ranks_worker, &j);
}

/* Ranks [from, n) with their output buffers, and backends too where they are owned, then the
 * threads, the communicator and r. */
static void ranks_release(struct engine_ranks *r, int from, bool backends) {
    threadpool_free(r->pool);
    for (int k = from; k < r->n; k++) {
        if (r->ids[k]) r->be[k]->free(r->be[k], r->ids[k]);
        if (r->hidden[k]) r->be[k]->free(r->be[k], r->hidden[k]);
        model_free(r->m[k]);
        if (backends) backend_free(r->be[k]);
    }
    tp_comm_free(r->comm);
    free(r);
}

void engine_ranks_free(struct engine_ranks *r) {
    if (r) ranks_release(r, 1, true); /* (rank 0 is the model being freed) */
}

int engine_ranks_load(struct model **out, const char *path, struct backend *const *bes, int n,
                      const struct model_params *p, char *err, size_t err_size) {
    *out = NULL;
    if (n < 2 || n > TP_MAX_RANKS) return coti_fail(err, err_size, COTI_E_ARG, "%d ranks (2 to %d)", n, TP_MAX_RANKS);
    struct engine_ranks *r = calloc(1, sizeof *r);
    if (!r || !(r->comm = tp_comm_new(n)) || !(r->pool = threadpool_init(n))) {
        if (r) ranks_release(r, 0, false);
        return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory for %d ranks", n);
    }
    int rc = 0;
    for (int k = 0; k < n && !rc; k++) {
        r->be[k] = bes[k];
        if ((rc = tp_attach(bes[k], r->comm, k, err, err_size))) break;
        struct model_params pk = *p;
        pk.tp_rank = k;
        pk.tp_n = n;
        if ((rc = model_load(&r->m[k], path, bes[k], &pk, err, err_size))) break;
        r->n = k + 1;
        if (!r->m[k]->engine) {
            rc = coti_fail(err, err_size, COTI_E_UNSUPPORTED, "this architecture cannot be split into ranks");
            break;
        }
        const size_t nb = (size_t)r->m[k]->n_batch;
        if (k && (!(r->ids[k] = bes[k]->alloc(bes[k], sizeof(int32_t) * (2 * nb + 1))) ||
                  !(r->hidden[k] = bes[k]->alloc(bes[k], sizeof(float) * nb * (size_t)r->m[k]->info.n_embd))))
            rc = coti_fail(err, err_size, COTI_E_NOMEM, "out of memory for rank %d's outputs", k);
    }
    if (rc) { /* every rank loaded so far goes; the backends stay the caller's, unattached */
        for (int k = 0; k < n; k++) {
            bes[k]->comm = NULL;
            bes[k]->rank = 0;
        }
        ranks_release(r, 0, false);
        return rc;
    }
    r->m[0]->engine->ranks = r;
    *out = r->m[0];
    return 0;
}
