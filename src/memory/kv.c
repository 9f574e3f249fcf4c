/* kv.c — allocation of attention KV caches and the copy regions of a sequence's cells. */
#include "memory/kv.h"
#include "memory/memory.h"

#include <stdlib.h>

int kv_cache_init(struct kv_cache *kv, struct backend *be, const struct kv_layer_spec *specs, int n_layer,
                  int n_seq, int n_ctx, int n_rows, enum ggml_type type) {
    *kv = (struct kv_cache){.be = be, .n_layer = n_layer, .n_seq = n_seq, .n_ctx = n_ctx, .full = {n_ctx, 0, 0},
                            .win = {n_ctx, 0, 0}};
    if (type != GGML_TYPE_F16) return COTI_E_UNSUPPORTED;
    if (!n_layer) return 0;
    kv->layers = calloc((size_t)n_layer, sizeof *kv->layers);
    kv->owns = calloc((size_t)n_layer, sizeof *kv->owns);
    kv->windowed = calloc((size_t)n_layer, sizeof *kv->windowed);
    if (!kv->layers || !kv->owns || !kv->windowed) return COTI_E_NOMEM;
    int window = 0;
    for (int il = 0; il < n_layer; il++) {
        if (specs[il].window < 0 || (window && specs[il].window && specs[il].window != window)) return COTI_E_UNSUPPORTED;
        if (specs[il].window) window = specs[il].window;
    }
    /* the last window - 1 positions before a forward's first row, its n_rows rows: with a
     * rollback of at most n_rows after it, no cell still visible is overwritten (kv.h) */
    if (window > 0 && n_rows > 0 && (int64_t)window - 1 + n_rows + window < n_ctx)
        kv->win = (struct kv_cells){2 * window - 1 + n_rows, window - 1 + n_rows, window};
    for (int il = 0; il < n_layer; il++) {
        const struct kv_layer_spec *sp = &specs[il];
        struct kv_view *v = &kv->layers[il];
        kv->windowed[il] = sp->window > 0;
        if (sp->shared_from >= 0) {
            if (sp->shared_from >= il || kv->windowed[sp->shared_from] != kv->windowed[il]) return COTI_E_ARG;
            *v = kv->layers[sp->shared_from];
            continue;
        }
        const size_t cells = (size_t)n_seq * (size_t)(kv->windowed[il] ? kv->win : kv->full).block;
        *v = kv_view_make(type, sp->n_head_kv, sp->head_dim, NULL, NULL);
        size_t bytes;
        if (__builtin_mul_overflow(cells, v->row_bytes, &bytes)) return COTI_E_NOMEM;
        kv->owns[il] = true;
        v->k = be->alloc(be, bytes);
        v->v = be->alloc(be, bytes);
        if (!v->k || !v->v) return COTI_E_NOMEM;
    }
    return 0;
}

void kv_cache_free(struct kv_cache *kv) {
    for (int il = 0; kv->layers && il < kv->n_layer; il++) {
        if (!kv->owns[il]) continue;
        if (kv->layers[il].k) kv->be->free(kv->be, kv->layers[il].k);
        if (kv->layers[il].v) kv->be->free(kv->be, kv->layers[il].v);
    }
    free(kv->layers);
    free(kv->owns);
    free(kv->windowed);
    *kv = (struct kv_cache){0};
}

void kv_copy_regions(const struct kv_cache *kv, int dst, int src, int n_pos, struct mem_regions *r) {
    for (int il = 0; il < kv->n_layer; il++) {
        if (!kv->owns[il]) continue;
        const struct kv_view *v = &kv->layers[il];
        const struct kv_cells *c = kv->windowed[il] ? &kv->win : &kv->full;
        const size_t d = (size_t)kv_cells_at(c, dst, 0) * v->row_bytes;
        const size_t s = (size_t)kv_cells_at(c, src, 0) * v->row_bytes;
        const size_t bytes = (size_t)(c->ring ? c->block : n_pos) * v->row_bytes;
        mem_regions_add(r, (uint8_t *)v->k + d, (const uint8_t *)v->k + s, bytes, bytes);
        mem_regions_add(r, (uint8_t *)v->v + d, (const uint8_t *)v->v + s, bytes, bytes);
    }
}
