/* batch.h — a model_batch cut into slices of at most n_batch rows, each checked against the
 * sequences' lengths and split into runs (the consecutive rows of one sequence), and the
 * per-row metadata the ops read (token, position, KV cell, first cell and cells visible of the
 * row's sequence; each run's sequence), uploaded in one copy per slice. */
#ifndef COTI_BATCH_H
#define COTI_BATCH_H

#include "memory/kv.h"
#include "model.h"

struct run { int start, len, seq; };

#define BATCH_MAX_RUNS 256

struct slice {
    int n, n_runs;
    const int32_t *tokens, *pos, *seq;
    const int32_t *tokens_dev;   /* backend memory, instead of tokens */
    struct run runs[BATCH_MAX_RUNS];
};

/* Metadata sections of a slice this small are packed this many rows apart, so that its upload
 * is one small copy: with n_batch 512 the sections span 8 KB, and an 8 KB host-to-device copy
 * costs ~9 µs on the device's timeline against ~2 µs for 256 bytes (H200, between graphs). */
#define BATCH_META_SMALL 16
#define BATCH_META_SECTIONS 10   /* tokens, pos, cells, cell0, nctx, each run's sequence, then the
                                    window's cell0, nctx, cells and second cells (kv.h's rings) */
_Static_assert(BATCH_META_SMALL * sizeof(int32_t) <= 64, "a section, 64-byte rounded, holds a small slice");

struct batch_meta {
    int32_t *dev;                /* backend block of BATCH_META_SECTIONS sections */
    int32_t *host;               /* its host mirror */
    size_t stride;               /* int32s per section for a full slice (64-byte rounded n_batch) */
    /* where the current slice's sections are on the device (the ops, and graphs recorded from
     * them, read these); a sliding-window layer attends [win_cell0, win_cell0 + win_nctx) and
     * stores at win_cells (and, holding a ring, again at win_cells2) */
    int32_t *tokens, *pos, *cells, *cell0, *nctx;
    int32_t *run_seq;            /* run r's sequence (struct state_set.seq) */
    int32_t *win_cell0, *win_nctx, *win_cells, *win_cells2;
};

/* Bytes of the device block for n_batch rows (an arena slot), and the host mirror. */
size_t batch_meta_bytes(int n_batch);
int batch_meta_init(struct batch_meta *bm, int n_batch);
void batch_meta_free(struct batch_meta *bm);

/* Rows [i0, i0 + n) of b as a slice (runs are filled in by slice_check). */
void slice_take(struct slice *sl, const struct model_batch *b, int i0, int n);
/* Check the slice against lengths len[] of n_seq sequences of n_ctx positions (tokens below
 * n_vocab) and split it into runs. */
int slice_check(struct slice *sl, const int32_t *len, int n_seq, int n_ctx, int n_vocab, char *err, size_t err_size);
/* Upload the slice's metadata: one copy from the host (each copy is a node on the device's
 * timeline, a few µs of a decode step). Tokens already on the device (greedy drafts) are read
 * where they are. Cells by the full layers' rule; window > 0: also the cells a sliding-window
 * layer stores to and sees by its rule (a position sees the window's last positions up to
 * itself, llama.cpp's p - p_j < window). */
void slice_upload(struct backend *be, struct batch_meta *bm, const struct slice *sl, const struct kv_cells *full,
                  const struct kv_cells *win, int window);

static inline bool row_wants_logits(const bool *want, bool last_only, int n, int i) {
    return want ? want[i] : (last_only && i == n - 1);
}

#endif
