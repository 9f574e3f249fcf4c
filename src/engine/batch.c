/* batch.c — slicing, checking and metadata upload of a batch (batch.h). */
#include "engine/batch.h"
#include "memory/kv.h"

#include <stdlib.h>

static size_t meta_stride(int n_batch) { return (((size_t)n_batch * sizeof(int32_t) + 63) & ~(size_t)63) / sizeof(int32_t); }

size_t batch_meta_bytes(int n_batch) { return BATCH_META_SECTIONS * meta_stride(n_batch) * sizeof(int32_t); }

int batch_meta_init(struct batch_meta *bm, int n_batch) {
    bm->stride = meta_stride(n_batch);
    bm->host = calloc(BATCH_META_SECTIONS * bm->stride, sizeof(int32_t));
    return bm->host ? 0 : COTI_E_NOMEM;
}

void batch_meta_free(struct batch_meta *bm) {
    free(bm->host);
    bm->host = NULL;
}

void slice_take(struct slice *sl, const struct model_batch *b, int i0, int n) {
    sl->n = n;
    sl->tokens = b->tokens_dev ? NULL : b->tokens + i0;
    sl->tokens_dev = b->tokens_dev ? b->tokens_dev + i0 : NULL;
    sl->pos = b->pos + i0;
    sl->seq = b->seq ? b->seq + i0 : NULL;
}

int slice_check(struct slice *sl, const int32_t *len, int n_seq, int n_ctx, int n_vocab, char *err, size_t err_size) {
    sl->n_runs = 0;
    for (int i = 0; i < sl->n; i++) {
        int s = sl->seq ? sl->seq[i] : 0;
        if (s < 0 || s >= n_seq) return coti_fail(err, err_size, COTI_E_ARG, "row %d: sequence %d out of range [0, %d)", i, s, n_seq);
        if (sl->tokens && (sl->tokens[i] < 0 || sl->tokens[i] >= n_vocab))
            return coti_fail(err, err_size, COTI_E_ARG, "row %d: token %d out of range [0, %d)", i, sl->tokens[i], n_vocab);
        if (i == 0 || s != sl->runs[sl->n_runs - 1].seq) {
            for (int r = 0; r < sl->n_runs; r++)
                if (sl->runs[r].seq == s) return coti_fail(err, err_size, COTI_E_ARG, "row %d: rows of sequence %d are not contiguous", i, s);
            if (sl->n_runs == BATCH_MAX_RUNS) return coti_fail(err, err_size, COTI_E_ARG, "more than %d sequences in one batch", BATCH_MAX_RUNS);
            if (sl->pos[i] != len[s])
                return coti_fail(err, err_size, COTI_E_ARG, "row %d: position %d does not continue sequence %d (length %d)", i, sl->pos[i], s, len[s]);
            sl->runs[sl->n_runs++] = (struct run){i, 1, s};
        } else {
            struct run *ru = &sl->runs[sl->n_runs - 1];
            if (sl->pos[i] != sl->pos[i - 1] + 1)
                return coti_fail(err, err_size, COTI_E_ARG, "row %d: positions of sequence %d are not consecutive", i, s);
            ru->len++;
        }
        if (sl->pos[i] >= n_ctx)
            return coti_fail(err, err_size, COTI_E_RANGE, "sequence %d: position %d exceeds the context size %d", s, sl->pos[i], n_ctx);
    }
    return 0;
}

void slice_upload(struct backend *be, struct batch_meta *bm, const struct slice *sl, const struct kv_cells *full,
                  const struct kv_cells *win, int window) {
    /* the ops (and a graph recorded from them) read the sections where this slice puts them */
    const size_t st = sl->n <= BATCH_META_SMALL ? BATCH_META_SMALL : bm->stride;
    bm->tokens = bm->dev;
    bm->pos = bm->dev + st;
    bm->cells = bm->dev + 2 * st;
    bm->cell0 = bm->dev + 3 * st;
    bm->nctx = bm->dev + 4 * st;
    bm->run_seq = bm->dev + 5 * st;
    bm->win_cell0 = bm->dev + 6 * st;
    bm->win_nctx = bm->dev + 7 * st;
    bm->win_cells = bm->dev + 8 * st;
    bm->win_cells2 = bm->dev + 9 * st;
    int32_t *tok = bm->host, *pos = tok + st, *cells = pos + st, *cell0 = cells + st, *nctx = cell0 + st;
    int32_t *run_seq = nctx + st, *win_cell0 = run_seq + st, *win_nctx = win_cell0 + st, *win_cells = win_nctx + st;
    int32_t *win_cells2 = win_cells + st;
    for (int r = 0; r < sl->n_runs; r++) run_seq[r] = sl->runs[r].seq;
    for (int i = 0; i < sl->n; i++) {
        int s = sl->seq ? sl->seq[i] : 0;
        if (!sl->tokens_dev) tok[i] = sl->tokens[i];
        pos[i] = sl->pos[i];
        cell0[i] = kv_cells_at(full, s, 0);
        cells[i] = kv_cells_at(full, s, sl->pos[i]);
        nctx[i] = sl->pos[i] + 1;
        if (window > 0) {
            const int first = COTI_MAX(0, sl->pos[i] - window + 1);
            win_cell0[i] = kv_cells_at(win, s, first);
            win_nctx[i] = sl->pos[i] + 1 - first;
            win_cells[i] = kv_cells_at(win, s, sl->pos[i]);
            win_cells2[i] = win->ring ? kv_cells_second(win, s, sl->pos[i]) : win_cells[i];
        }
    }
    const size_t end = (window > 0 ? 9 : 5) * st + (size_t)sl->n; /* through the last section's rows */
    if (sl->tokens_dev) be->upload(be, bm->pos, pos, sizeof(int32_t) * (end - st));
    else be->upload(be, bm->tokens, tok, sizeof(int32_t) * end);
}
