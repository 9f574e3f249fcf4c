/* kv.h — attention KV caches: for each layer of a cache, K and V rows of one element type for
 * every cell, and the cell rule that places a sequence's positions. A backend attention op reads
 * and writes a layer through its struct kv_view, never through raw cache pointers of a model.
 *
 * Cells (struct kv_cells): sequence s owns a block of cells of each layer; in a full layer the
 * block is n_ctx cells (rounded up to KV_BLOCK_ALIGN) and position p is cell p of it. A
 * sliding-window layer holds a ring when that is smaller: position p at p % ring, so it keeps
 * only the last ring positions, which are the window plus what one forward writes or one
 * rollback drops. A cell is written before it is read (a draft head's skipped positions aside:
 * memory.h), so dropping positions (at most n_rows of them: memory.h) is only a length change
 * (the lengths live in memory.h, which owns the per-sequence policy). */
#ifndef COTI_KV_H
#define COTI_KV_H

#include "quant/quant.h"

struct backend;

/* The K/V storage of one attention layer as an op sees it. */
struct kv_view {
    enum ggml_type k_type, v_type; /* element types of K and V rows (kv_type_ok) */
    int n_head_kv, head_dim;
    size_t k_row_bytes, v_row_bytes; /* one cell's K (V) row: n_head_kv·head_dim elements; a
                                    head's part of it is head_dim elements, whole blocks */
    void *k, *v;                 /* backend memory, [n_seq·n_ctx] rows each */
    bool read_only;              /* a drafter reading its target's cache must not store */
    int max_rows;                /* the most rows one token attends (a sequence's cells, or
                                    the window), 0: not known; sizes a backend's work split */
};

/* What a layer of a cache needs: its width, and whether it reuses an earlier layer's storage. */
struct kv_layer_spec {
    int n_head_kv, head_dim;
    int shared_from;             /* index of an earlier layer of the same cache whose K/V this
                                    layer reads, or -1 for storage of its own */
    int window;                  /* a sliding-window layer's window (positions), 0: a full layer */
};

/* Where a layer keeps a sequence's positions: `block` cells per sequence; position p at cell p
 * of its block, or with a ring (ring > 0) at p % ring and, when p % ring < window - 1, also at
 * ring + p % ring. The second copy makes the cells of every window [first, p] (at most window
 * positions) one run from first % ring, which the attention ops read as they read a full layer.
 * The block is ring + window cells; its last one takes the other rows' second store, unread. */
struct kv_cells {
    int block, ring, window;
};

/* A block's cells: the cells it needs, rounded up to KV_BLOCK_ALIGN, so that every sequence's
 * block starts on a multiple of it. Kernels that tile the cache on a fixed grid of cells (CUDA's
 * prompt attention: 64 keys a tile, counted from cell 0) then split a sequence's positions alike
 * in every slot, and a prompt's rows do not depend on the sequence it is prefilled in (a gemma4
 * window block of 767 cells put sequences 1-3 off that grid: the suspect of session 25's failed
 * batched gate on CUDA, docs/notes/device-queue.md). */
#define KV_BLOCK_ALIGN 64
static inline int kv_block_cells(int cells) { /* cells <= INT_MAX / 4: kv_cache_init */
    return (cells + KV_BLOCK_ALIGN - 1) / KV_BLOCK_ALIGN * KV_BLOCK_ALIGN;
}

static inline int32_t kv_cells_at(const struct kv_cells *c, int s, int pos) {
    return (int32_t)(s * c->block + (c->ring ? pos % c->ring : pos));
}
/* The cell of position pos's second store (the unread last cell when it has none); rings only. */
static inline int32_t kv_cells_second(const struct kv_cells *c, int s, int pos) {
    const int r = pos % c->ring;
    return (int32_t)(s * c->block + (r < c->window - 1 ? c->ring + r : c->block - 1));
}

struct kv_cache {
    struct backend *be;
    int n_layer, n_seq, n_ctx;
    struct kv_view *layers;
    bool *owns;                  /* per layer: its storage is its own (not shared) */
    bool *windowed;              /* per layer: it uses `win` (else `full`) */
    struct kv_cells full, win;   /* the full layers' cells, the sliding-window layers' */
    size_t bytes;                /* device bytes of all its storage (set before allocating) */
};

/* The element types a KV cache can hold (f16 first, the default), and whether rows of
 * head_dim elements per head can be cached in type: one of them whose blocks tile a head, so
 * every head starts at a block. */
#define KV_N_TYPES 4
extern const enum ggml_type kv_types[KV_N_TYPES];
bool kv_type_ok(enum ggml_type type, int head_dim);

/* Allocate a cache of n_layer layers for n_seq sequences of n_ctx positions, K in k_type and V
 * in v_type (kv_type_ok for every layer's width). The sliding-window layers (one window for all) hold a ring when window - 1 +
 * n_rows cells are fewer than n_ctx: n_rows bounds the rows one forward writes and the positions
 * one rollback drops. Returns 0 or COTI_E_NOMEM / COTI_E_UNSUPPORTED (two windows, a type that
 * is not kv_type_ok or the backend does not support); kv_cache_free is safe after a failure. */
int kv_cache_init(struct kv_cache *kv, struct backend *be, const struct kv_layer_spec *specs, int n_layer,
                  int n_seq, int n_ctx, int n_rows, enum ggml_type k_type, enum ggml_type v_type);
/* Device bytes the cache holds per sequence for K and for V (shared layers once), the rings
 * counted at their size. */
void kv_cache_bytes_per_seq(const struct kv_cache *kv, size_t *k_bytes, size_t *v_bytes);
void kv_cache_free(struct kv_cache *kv);

/* A view of storage k, v for n_head_kv heads of head_dim elements of k_type and v_type (a
 * cache's layer, or an op test's buffers). */
static inline struct kv_view kv_view_make(enum ggml_type k_type, enum ggml_type v_type, int n_head_kv, int head_dim,
                                          void *k, void *v) {
    const int64_t n = (int64_t)n_head_kv * head_dim;
    struct kv_view w = {k_type, v_type, n_head_kv, head_dim, ggml_row_size(k_type, n), ggml_row_size(v_type, n),
                        k, v, false, 0};
    return w;
}

/* A read-only view of layer il, for a reader that must not change the cache. */
static inline struct kv_view kv_view_read_only(const struct kv_cache *kv, int il) {
    struct kv_view v = kv->layers[il];
    v.read_only = true;
    return v;
}

/* Copy regions (memory.h's struct mem_regions) that copy the first n_pos positions of sequence
 * src onto dst in every layer with storage of its own (a ring: all of its block). */
struct mem_regions;
void kv_copy_regions(const struct kv_cache *kv, int dst, int src, int n_pos, struct mem_regions *r);

#endif
