/* kv.c — allocation of attention KV caches and the copy regions of a sequence's cells. */
#include "memory/kv.h"
#include "backend.h"
#include "memory/memory.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>

const enum ggml_type kv_types[KV_N_TYPES] = {GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0};

bool kv_type_ok(enum ggml_type type, int head_dim) {
    for (int i = 0; i < KV_N_TYPES; i++)
        if (type == kv_types[i]) return head_dim > 0 && head_dim % ggml_type_traits_get(type)->block_elems == 0;
    return false;
}

/* Whether the backend's attention ops read and write the type. */
static bool kv_type_supported(struct backend *be, enum ggml_type type) {
    return be->supports(be, BACKEND_OP_attention, type) && be->supports(be, BACKEND_OP_kv_store, type) &&
           be->supports(be, BACKEND_OP_attn_prep, type);
}

int kv_cache_init(struct kv_cache *kv, struct backend *be, const struct kv_layer_spec *specs, int n_layer,
                  int n_seq, int n_ctx, int n_rows, enum ggml_type k_type, enum ggml_type v_type) {
    const int ctx_block = n_ctx >= 0 && n_ctx <= INT_MAX / 4 ? kv_block_cells(n_ctx) : 0;
    *kv = (struct kv_cache){.be = be, .n_layer = n_layer, .n_seq = n_seq, .n_ctx = n_ctx, .full = {ctx_block, 0, 0},
                            .win = {ctx_block, 0, 0}};
    if (!ctx_block && n_ctx) return COTI_E_ARG; /* past what the cells' int sums hold */
    if (n_layer <= 0) return n_layer ? COTI_E_ARG : 0;
    if (!kv_type_supported(be, k_type) || !kv_type_supported(be, v_type)) return COTI_E_UNSUPPORTED;
    for (int il = 0; il < n_layer; il++)
        if (!kv_type_ok(k_type, specs[il].head_dim) || !kv_type_ok(v_type, specs[il].head_dim)) return COTI_E_UNSUPPORTED;
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
        kv->win = (struct kv_cells){kv_block_cells(2 * window - 1 + n_rows), window - 1 + n_rows, window};
    /* every layer's storage is sized before any is allocated: a cache that cannot fit is
     * refused whole, before the device is asked for it (where it says what it has free) */
    size_t total = 0;
    for (int il = 0; il < n_layer; il++) {
        const struct kv_layer_spec *sp = &specs[il];
        kv->windowed[il] = sp->window > 0;
        if (sp->shared_from >= 0) {
            if (sp->shared_from >= il || kv->windowed[sp->shared_from] != kv->windowed[il]) return COTI_E_ARG;
            continue;
        }
        const size_t cells = (size_t)n_seq * (size_t)(kv->windowed[il] ? kv->win : kv->full).block;
        const struct kv_view v = kv_view_make(k_type, v_type, sp->n_head_kv, sp->head_dim, NULL, NULL);
        size_t k_bytes, v_bytes;
        if (__builtin_mul_overflow(cells, v.k_row_bytes, &k_bytes) || __builtin_mul_overflow(cells, v.v_row_bytes, &v_bytes) ||
            __builtin_add_overflow(total, k_bytes, &total) || __builtin_add_overflow(total, v_bytes, &total))
            total = SIZE_MAX;
    }
    kv->bytes = total;
    if (total == SIZE_MAX || (be->mem_available && total > be->mem_available(be))) return COTI_E_NOMEM;
    for (int il = 0; il < n_layer; il++) {
        const struct kv_layer_spec *sp = &specs[il];
        struct kv_view *v = &kv->layers[il];
        if (sp->shared_from >= 0) {
            *v = kv->layers[sp->shared_from];
            continue;
        }
        const size_t cells = (size_t)n_seq * (size_t)(kv->windowed[il] ? kv->win : kv->full).block;
        *v = kv_view_make(k_type, v_type, sp->n_head_kv, sp->head_dim, NULL, NULL);
        v->max_rows = kv->windowed[il] ? COTI_MIN(sp->window, n_ctx) : n_ctx;
        kv->owns[il] = true;
        v->k = be->alloc(be, cells * v->k_row_bytes);
        v->v = be->alloc(be, cells * v->v_row_bytes);
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

void kv_cache_bytes_per_seq(const struct kv_cache *kv, size_t *k_bytes, size_t *v_bytes) {
    *k_bytes = *v_bytes = 0;
    for (int il = 0; il < kv->n_layer; il++) {
        if (!kv->owns[il]) continue;
        const size_t cells = (size_t)(kv->windowed[il] ? kv->win : kv->full).block;
        *k_bytes += cells * kv->layers[il].k_row_bytes;
        *v_bytes += cells * kv->layers[il].v_row_bytes;
    }
}

void kv_copy_regions(const struct kv_cache *kv, int dst, int src, int n_pos, struct mem_regions *r) {
    for (int il = 0; il < kv->n_layer; il++) {
        if (!kv->owns[il]) continue;
        const struct kv_view *v = &kv->layers[il];
        const struct kv_cells *c = kv->windowed[il] ? &kv->win : &kv->full;
        const size_t d = (size_t)kv_cells_at(c, dst, 0), s = (size_t)kv_cells_at(c, src, 0);
        const size_t n = (size_t)(c->ring ? c->block : n_pos);
        const size_t kb = n * v->k_row_bytes, vb = n * v->v_row_bytes;
        mem_regions_add(r, (uint8_t *)v->k + d * v->k_row_bytes, (const uint8_t *)v->k + s * v->k_row_bytes, kb, kb);
        mem_regions_add(r, (uint8_t *)v->v + d * v->v_row_bytes, (const uint8_t *)v->v + s * v->v_row_bytes, vb, vb);
    }
}
