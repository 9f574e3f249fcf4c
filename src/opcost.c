/* opcost.c — the forwarding backend behind `coti bench --op-cost` and `--verify-cost`
 * (opcost.h). Memory, weights, marks and graphs always pass through; compute ops pass unless
 * their family is skipped; while counting is on, every op counts its call and the matmuls
 * their weights' bytes. */
#include "opcost.h"

#include <stdlib.h>
#include <string.h>

struct opcost {
    struct backend be;           /* first: the ops receive &be and find the rest from it */
    struct backend *inner;
    int skip;                    /* an enum opcost_family, or -1 */
    bool counting;
    struct opcost_counts counted;
};

/* A graph recorded with a skip choice replays only under the same choice. */
struct opcost_graph {
    void *inner;
    int skip;
};

static const char *const family_names[OPCOST_COUNT] = {
    "matmul, <= n_in outputs", "matmul, wider", "matmul, LM head", "norms", "attention",
    "rope, kv store, gate", "delta-net", "add, swiglu", "embedding rows", "argmax, accept", "routed experts",
};

const char *opcost_family_name(int family) {
    return family >= 0 && family < OPCOST_COUNT ? family_names[family] : "(none)";
}

static struct opcost *oc(struct backend *be) { return (struct opcost *)be; }
static struct backend *inner_of(struct backend *be) { return oc(be)->inner; }
static bool skipped(struct backend *be, int family) { return oc(be)->skip == family; }

static int matmul_family(const struct bweight *const *ws, int n_w) {
    int64_t rows = 0;
    for (int i = 0; i < n_w; i++) rows += ws[i]->n_out;
    const int64_t n_in = ws[0]->n_in;
    return rows <= n_in ? OPCOST_MATMUL_NARROW : rows >= 16 * n_in ? OPCOST_MATMUL_HEAD : OPCOST_MATMUL_WIDE;
}

/* ---- always forwarded ---- */

static void *o_alloc(struct backend *be, size_t bytes) { return inner_of(be)->alloc(inner_of(be), bytes); }
static size_t o_mem_available(struct backend *be) { return inner_of(be)->mem_available(inner_of(be)); }
static void o_free(struct backend *be, void *p) { inner_of(be)->free(inner_of(be), p); }
static void o_upload(struct backend *be, void *dst, const void *src, size_t bytes) { inner_of(be)->upload(inner_of(be), dst, src, bytes); }
static void o_download(struct backend *be, void *dst, const void *src, size_t bytes) { inner_of(be)->download(inner_of(be), dst, src, bytes); }
static void o_copy(struct backend *be, void *dst, const void *src, size_t bytes) { inner_of(be)->copy(inner_of(be), dst, src, bytes); }
static void o_copy_n(struct backend *be, void *const *dst, const void *const *src, const size_t *bytes, int n) {
    inner_of(be)->copy_n(inner_of(be), dst, src, bytes, n);
}
static void o_copy_n_at(struct backend *be, void *const *dst, const void *const *src, const size_t *step,
                        const size_t *bytes, int n, const int32_t *sel, int limit) {
    inner_of(be)->copy_n_at(inner_of(be), dst, src, step, bytes, n, sel, limit);
}
static void o_sync(struct backend *be) { inner_of(be)->sync(inner_of(be)); }
static int o_weight_init(struct backend *be, struct bweight *w, enum ggml_type type, int64_t n_in, int64_t n_out,
                         const void *host_data) {
    return inner_of(be)->weight_init(inner_of(be), w, type, n_in, n_out, host_data);
}
static void o_weight_free(struct backend *be, struct bweight *w) { inner_of(be)->weight_free(inner_of(be), w); }
static void o_mark(struct backend *be, int i) { inner_of(be)->mark(inner_of(be), i); }
static void o_set_prompt(struct backend *be, int family) { inner_of(be)->set_prompt(inner_of(be), family); }
static int o_prompt_family(const struct backend *be, int prompt_len) {
    const struct backend *in = ((const struct opcost *)be)->inner;
    return in->prompt_family(in, prompt_len);
}
static double o_mark_elapsed_us(struct backend *be, int from, int to) { return inner_of(be)->mark_elapsed_us(inner_of(be), from, to); }

static void o_side_begin(struct backend *be) { inner_of(be)->side_begin(inner_of(be)); }
static void o_side_end(struct backend *be) { inner_of(be)->side_end(inner_of(be)); }
static void o_side_join(struct backend *be) { inner_of(be)->side_join(inner_of(be)); }
static void o_capture_begin(struct backend *be) { inner_of(be)->capture_begin(inner_of(be)); }
static void *o_capture_end(struct backend *be, void *reuse) {
    struct opcost_graph *r = reuse;
    void *g = inner_of(be)->capture_end(inner_of(be), r ? r->inner : NULL);
    if (!g) return NULL;
    if (r && g == r->inner) {
        r->skip = oc(be)->skip;
        return r;
    }
    struct opcost_graph *w = malloc(sizeof *w);
    if (!w) {
        inner_of(be)->graph_free(inner_of(be), g);
        return NULL;
    }
    w->inner = g;
    w->skip = oc(be)->skip;
    return w;
}
static bool o_graph_launch(struct backend *be, void *graph) {
    struct opcost_graph *w = graph;
    return w->skip == oc(be)->skip && inner_of(be)->graph_launch(inner_of(be), w->inner);
}
static void o_graph_free(struct backend *be, void *graph) {
    struct opcost_graph *w = graph;
    inner_of(be)->graph_free(inner_of(be), w->inner);
    free(w);
}

static void o_destroy(struct backend *be) {
    backend_free(inner_of(be));
    free(oc(be));
}

static bool o_supports(struct backend *be, enum backend_op op, enum ggml_type type) {
    return inner_of(be)->supports(inner_of(be), op, type);
}

/* ---- compute ops: forwarded unless their family is skipped ---- */

/* The op list's family MATMUL is decided per call, from the weights the op was given. */
#define OPCOST_MATMUL matmul_family(ws, n_w)
#define BACKEND_OP_ARGS(...) __VA_ARGS__
#define BACKEND_OP(name, family, params, args) \
    static void o_##name params { \
        const int f = OPCOST_##family; \
        if (oc(be)->counting) oc(be)->counted.op_calls[f]++; \
        if (!skipped(be, f)) inner_of(be)->name(inner_of(be), BACKEND_OP_ARGS args); \
    }
#include "backend_ops.h"
#undef BACKEND_OP

/* ---- the matmuls, counted ---- */

static void c_matmul(struct backend *be, const struct bweight *const *ws, float *const *ys, int n_w,
                     const struct matmul_in *in, int n_tok) {
    if (oc(be)->counting)
        for (int i = 0; i < n_w; i++) oc(be)->counted.weight_bytes += (double)ws[i]->row_bytes * (double)ws[i]->n_out;
    o_matmul(be, ws, ys, n_w, in, n_tok);
}

/* An expert is read once per call however many slots chose it: its rows count once. The ids
 * are on the device: reading them waits for the routing (counting runs without graphs). */
static void c_matmul_id(struct backend *be, const struct bweight *w, const struct matmul_id_in *in, int n_tok, float *y) {
    struct opcost *o = oc(be);
    const int n_slots = n_tok * in->n_used;
    int32_t *ids = o->counting ? malloc(sizeof(int32_t) * (size_t)n_slots) : NULL;
    if (ids) {
        bool seen[BACKEND_MOE_MAX_EXPERTS];
        memset(seen, 0, sizeof seen);
        o->inner->download(o->inner, ids, in->ids, sizeof(int32_t) * (size_t)n_slots);
        int n_distinct = 0;
        for (int i = 0; i < n_slots; i++)
            if (ids[i] >= 0 && ids[i] < in->n_expert && !seen[ids[i]]) { seen[ids[i]] = true; n_distinct++; }
        o->counted.weight_bytes += (double)n_distinct * (double)(w->n_out / in->n_expert) * (double)w->row_bytes;
        o->counted.expert_calls++;
        o->counted.experts_read += n_distinct;
        free(ids);
    }
    o_matmul_id(be, w, in, n_tok, y);
}

struct backend *opcost_wrap(struct backend *inner) {
    struct opcost *o = calloc(1, sizeof *o);
    if (!o) return NULL;
    o->inner = inner;
    o->skip = -1;
    struct backend *be = &o->be;
    be->name = inner->name;
    be->ctx = inner->ctx;
    be->alloc = o_alloc;
    if (inner->mem_available) be->mem_available = o_mem_available;
    be->free = o_free;
    be->upload = o_upload;
    be->download = o_download;
    be->copy = o_copy;
    be->copy_n = o_copy_n;
    be->copy_n_at = o_copy_n_at;
    be->sync = o_sync;
    be->weight_init = o_weight_init;
    be->weight_free = o_weight_free;
    be->supports = o_supports;
    be->gdn_pending = inner->gdn_pending;
#define BACKEND_OP(name, family, params, args) be->name = o_##name;
#include "backend_ops.h"
#undef BACKEND_OP
    be->matmul = c_matmul;
    be->matmul_id = c_matmul_id;
    be->mark = o_mark;
    be->mark_elapsed_us = o_mark_elapsed_us;
    if (inner->set_prompt) be->set_prompt = o_set_prompt;
    if (inner->prompt_family) be->prompt_family = o_prompt_family;
    if (inner->capture_begin) { /* graphs only where the inner backend has them */
        be->capture_begin = o_capture_begin;
        be->capture_end = o_capture_end;
        be->graph_launch = o_graph_launch;
        be->graph_free = o_graph_free;
    }
    if (inner->side_begin) {
        be->side_begin = o_side_begin;
        be->side_end = o_side_end;
        be->side_join = o_side_join;
    }
    be->destroy = o_destroy;
    return be;
}

void opcost_skip(struct backend *be, int family) { oc(be)->skip = family; }

void opcost_count(struct backend *be, bool on) {
    struct opcost *o = oc(be);
    o->counting = on;
    if (on) o->counted = (struct opcost_counts){0};
    /* the engine records graphs only where capture_begin is set: none while counting, so that
     * every op runs (and may read its ids back) */
    be->capture_begin = !on && o->inner->capture_begin ? o_capture_begin : NULL;
}

struct opcost_counts opcost_counted(struct backend *be) { return oc(be)->counted; }
