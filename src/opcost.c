/* opcost.c — the forwarding backend behind `coti bench --op-cost` (opcost.h). Memory, weights,
 * marks and graphs always pass through; compute ops pass unless their family is skipped. */
#include "opcost.h"

#include <stdlib.h>

struct opcost {
    struct backend be;           /* first: the ops receive &be and find the rest from it */
    struct backend *inner;
    int skip;                    /* an enum opcost_family, or -1 */
};

/* A graph recorded with a skip choice replays only under the same choice. */
struct opcost_graph {
    void *inner;
    int skip;
};

static const char *const family_names[OPCOST_COUNT] = {
    "matmul, <= n_in outputs", "matmul, wider", "matmul, LM head", "norms", "attention",
    "rope, kv store, gate", "delta-net", "add, swiglu", "embedding rows", "argmax, accept",
};

const char *opcost_family_name(int family) {
    return family >= 0 && family < OPCOST_COUNT ? family_names[family] : "(none)";
}

static struct opcost *oc(struct backend *be) { return (struct opcost *)be; }
static struct backend *in(struct backend *be) { return oc(be)->inner; }
static bool skipped(struct backend *be, int family) { return oc(be)->skip == family; }

static int matmul_family(const struct bweight *const *ws, int n_w) {
    int64_t rows = 0;
    for (int i = 0; i < n_w; i++) rows += ws[i]->n_out;
    const int64_t n_in = ws[0]->n_in;
    return rows <= n_in ? OPCOST_MATMUL_NARROW : rows >= 16 * n_in ? OPCOST_MATMUL_HEAD : OPCOST_MATMUL_WIDE;
}

/* ---- always forwarded ---- */

static void *o_alloc(struct backend *be, size_t bytes) { return in(be)->alloc(in(be), bytes); }
static void o_free(struct backend *be, void *p) { in(be)->free(in(be), p); }
static void o_upload(struct backend *be, void *dst, const void *src, size_t bytes) { in(be)->upload(in(be), dst, src, bytes); }
static void o_download(struct backend *be, void *dst, const void *src, size_t bytes) { in(be)->download(in(be), dst, src, bytes); }
static void o_copy(struct backend *be, void *dst, const void *src, size_t bytes) { in(be)->copy(in(be), dst, src, bytes); }
static void o_copy_n(struct backend *be, void *const *dst, const void *const *src, const size_t *bytes, int n) {
    in(be)->copy_n(in(be), dst, src, bytes, n);
}
static void o_copy_n_at(struct backend *be, void *const *dst, const void *const *src, const size_t *step,
                        const size_t *bytes, int n, const int32_t *sel, int limit) {
    in(be)->copy_n_at(in(be), dst, src, step, bytes, n, sel, limit);
}
static void o_sync(struct backend *be) { in(be)->sync(in(be)); }
static int o_weight_init(struct backend *be, struct bweight *w, enum ggml_type type, int64_t n_in, int64_t n_out,
                         const void *host_data) {
    return in(be)->weight_init(in(be), w, type, n_in, n_out, host_data);
}
static void o_weight_free(struct backend *be, struct bweight *w) { in(be)->weight_free(in(be), w); }
static void o_mark(struct backend *be, int i) { in(be)->mark(in(be), i); }
static double o_mark_elapsed_us(struct backend *be, int from, int to) { return in(be)->mark_elapsed_us(in(be), from, to); }

static void o_capture_begin(struct backend *be) { in(be)->capture_begin(in(be)); }
static void *o_capture_end(struct backend *be) {
    void *g = in(be)->capture_end(in(be));
    if (!g) return NULL;
    struct opcost_graph *w = malloc(sizeof *w);
    if (!w) {
        in(be)->graph_free(in(be), g);
        return NULL;
    }
    w->inner = g;
    w->skip = oc(be)->skip;
    return w;
}
static bool o_graph_launch(struct backend *be, void *graph) {
    struct opcost_graph *w = graph;
    return w->skip == oc(be)->skip && in(be)->graph_launch(in(be), w->inner);
}
static void o_graph_free(struct backend *be, void *graph) {
    struct opcost_graph *w = graph;
    in(be)->graph_free(in(be), w->inner);
    free(w);
}

static void o_destroy(struct backend *be) {
    backend_free(in(be));
    free(oc(be));
}

/* ---- compute ops, by family ---- */

static void o_matmul(struct backend *be, const struct bweight *w, const float *x, int n_tok, float *y) {
    if (!skipped(be, matmul_family(&w, 1))) in(be)->matmul(in(be), w, x, n_tok, y);
}
static void o_matmul_n(struct backend *be, const struct bweight *const *ws, float *const *ys, int n_w, const float *x,
                       int n_tok) {
    if (!skipped(be, matmul_family(ws, n_w))) in(be)->matmul_n(in(be), ws, ys, n_w, x, n_tok);
}
static void o_norm_matmul_n(struct backend *be, const float *x, const float *m, float *x_out, const float *w, float eps,
                            float *a, const struct bweight *const *ws, float *const *ys, int n_w, int n_tok) {
    if (!skipped(be, matmul_family(ws, n_w))) in(be)->norm_matmul_n(in(be), x, m, x_out, w, eps, a, ws, ys, n_w, n_tok);
}
static void o_swiglu_matmul(struct backend *be, const struct bweight *w, float *g, const float *u, int n_tok, float *y) {
    if (!skipped(be, matmul_family(&w, 1))) in(be)->swiglu_matmul(in(be), w, g, u, n_tok, y);
}
static void o_rmsnorm_gated_matmul(struct backend *be, const float *x, const float *w, const float *z, int dim,
                                   float eps, float *a, const struct bweight *wt, int n_tok, float *y) {
    if (!skipped(be, matmul_family(&wt, 1))) in(be)->rmsnorm_gated_matmul(in(be), x, w, z, dim, eps, a, wt, n_tok, y);
}
static void o_norm2_matmul(struct backend *be, const float *x1, const float *w1, const float *x2, const float *w2,
                           int dim, float eps, float *a, const struct bweight *wt, int n_tok, float *y) {
    if (!skipped(be, matmul_family(&wt, 1))) in(be)->norm2_matmul(in(be), x1, w1, x2, w2, dim, eps, a, wt, n_tok, y);
}
static void o_mul_sigmoid_matmul(struct backend *be, float *x, const float *gate, int n_head, int dim, int gs, int ghs,
                                 const struct bweight *wt, int n_tok, float *y) {
    if (!skipped(be, matmul_family(&wt, 1))) in(be)->mul_sigmoid_matmul(in(be), x, gate, n_head, dim, gs, ghs, wt, n_tok, y);
}
static void o_get_rows(struct backend *be, const struct bweight *w, const int32_t *ids, int n, float *out) {
    if (!skipped(be, OPCOST_EMBED)) in(be)->get_rows(in(be), w, ids, n, out);
}
static void o_rmsnorm(struct backend *be, const float *x, int x_stride, const float *w, int n_rows, int dim, float eps,
                      float *y, int y_stride) {
    if (!skipped(be, OPCOST_NORMS)) in(be)->rmsnorm(in(be), x, x_stride, w, n_rows, dim, eps, y, y_stride);
}
static void o_rmsnorm_gated(struct backend *be, const float *x, const float *w, const float *z, int n_rows, int dim,
                            float eps, float *y) {
    if (!skipped(be, OPCOST_NORMS)) in(be)->rmsnorm_gated(in(be), x, w, z, n_rows, dim, eps, y);
}
static void o_add_rmsnorm(struct backend *be, float *x, const float *m, const float *w, int n_rows, int dim, float eps,
                          float *y) {
    if (!skipped(be, OPCOST_NORMS)) in(be)->add_rmsnorm(in(be), x, m, w, n_rows, dim, eps, y);
}
static void o_add(struct backend *be, const float *a, const float *b, int64_t n, float *y) {
    if (!skipped(be, OPCOST_ELEMENTWISE)) in(be)->add(in(be), a, b, n, y);
}
static void o_swiglu(struct backend *be, const float *g, const float *u, int64_t n, float *y) {
    if (!skipped(be, OPCOST_ELEMENTWISE)) in(be)->swiglu(in(be), g, u, n, y);
}
static void o_mul_sigmoid(struct backend *be, float *x, const float *gate, int n_tok, int n_head, int dim,
                          int gate_stride, int gate_head_stride) {
    if (!skipped(be, OPCOST_ROPE_KV)) in(be)->mul_sigmoid(in(be), x, gate, n_tok, n_head, dim, gate_stride, gate_head_stride);
}
static void o_rope_neox(struct backend *be, float *x, int n_tok, int tok_stride, int n_head, int head_stride, int n_rot,
                        const int32_t *pos, float base) {
    if (!skipped(be, OPCOST_ROPE_KV)) in(be)->rope_neox(in(be), x, n_tok, tok_stride, n_head, head_stride, n_rot, pos, base);
}
static void o_attn_prep(struct backend *be, float *q, int q_stride, int q_head_stride, const float *q_norm, float *k,
                        int k_stride, const float *k_norm, const float *v, int v_stride, float eps, int n_tok,
                        int n_head, int n_head_kv, int head_dim, int n_rot, const int32_t *pos, float base,
                        const int32_t *cells, uint16_t *k_cache, uint16_t *v_cache) {
    if (!skipped(be, OPCOST_ROPE_KV))
        in(be)->attn_prep(in(be), q, q_stride, q_head_stride, q_norm, k, k_stride, k_norm, v, v_stride, eps, n_tok, n_head,
                          n_head_kv, head_dim, n_rot, pos, base, cells, k_cache, v_cache);
}
static void o_kv_store(struct backend *be, const float *k, int k_stride, const float *v, int v_stride, int n_tok,
                       int n_kv_dim, const int32_t *cells, uint16_t *k_cache, uint16_t *v_cache) {
    if (!skipped(be, OPCOST_ROPE_KV))
        in(be)->kv_store(in(be), k, k_stride, v, v_stride, n_tok, n_kv_dim, cells, k_cache, v_cache);
}
static void o_attention(struct backend *be, const float *q, int q_stride, int q_head_stride, const uint16_t *k_cache,
                        const uint16_t *v_cache, const int32_t *cell0, const int32_t *n_ctx, int n_tok, int n_head,
                        int n_head_kv, int head_dim, float scale, float *out) {
    if (!skipped(be, OPCOST_ATTENTION))
        in(be)->attention(in(be), q, q_stride, q_head_stride, k_cache, v_cache, cell0, n_ctx, n_tok, n_head, n_head_kv,
                          head_dim, scale, out);
}
static void o_ssm_conv(struct backend *be, const float *x, int n_tok, int n_ch, int k, const float *w, float *state,
                       float *y, float *snap, int n_snap) {
    if (!skipped(be, OPCOST_DELTANET)) in(be)->ssm_conv(in(be), x, n_tok, n_ch, k, w, state, y, snap, n_snap);
}
static void o_gdn(struct backend *be, const float *qkv, int qkv_stride, const struct gdn_gates *gates, float *state,
                  int n_tok, int nk, int nv, int dk, int dv, float eps, float *out, float *snap, int n_snap) {
    if (!skipped(be, OPCOST_DELTANET))
        in(be)->gdn(in(be), qkv, qkv_stride, gates, state, n_tok, nk, nv, dk, dv, eps, out, snap, n_snap);
}
static void o_gdn_chunked(struct backend *be, const float *qkv, int qkv_stride, const struct gdn_gates *gates,
                          float *state, int n_tok, int nk, int nv, int dk, int dv, float eps, float *out) {
    if (!skipped(be, OPCOST_DELTANET)) in(be)->gdn_chunked(in(be), qkv, qkv_stride, gates, state, n_tok, nk, nv, dk, dv, eps, out);
}
static void o_argmax(struct backend *be, const float *x, int n_rows, int n, int32_t *out, float *p_max) {
    if (!skipped(be, OPCOST_ARGMAX)) in(be)->argmax(in(be), x, n_rows, n, out, p_max);
}
static void o_accept_greedy(struct backend *be, const int32_t *draft, const int32_t *target, int n_draft, int32_t *out) {
    if (!skipped(be, OPCOST_ARGMAX)) in(be)->accept_greedy(in(be), draft, target, n_draft, out);
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
    be->free = o_free;
    be->upload = o_upload;
    be->download = o_download;
    be->copy = o_copy;
    be->copy_n = o_copy_n;
    be->copy_n_at = o_copy_n_at;
    be->sync = o_sync;
    be->weight_init = o_weight_init;
    be->weight_free = o_weight_free;
    be->matmul = o_matmul;
    be->matmul_n = o_matmul_n;
    be->norm_matmul_n = o_norm_matmul_n;
    be->swiglu_matmul = o_swiglu_matmul;
    be->rmsnorm_gated_matmul = o_rmsnorm_gated_matmul;
    be->norm2_matmul = o_norm2_matmul;
    be->get_rows = o_get_rows;
    be->rmsnorm = o_rmsnorm;
    be->rmsnorm_gated = o_rmsnorm_gated;
    be->add_rmsnorm = o_add_rmsnorm;
    be->add = o_add;
    be->swiglu = o_swiglu;
    be->mul_sigmoid = o_mul_sigmoid;
    be->rope_neox = o_rope_neox;
    be->kv_store = o_kv_store;
    be->attn_prep = o_attn_prep;
    be->mul_sigmoid_matmul = o_mul_sigmoid_matmul;
    be->attention = o_attention;
    be->ssm_conv = o_ssm_conv;
    be->gdn = o_gdn;
    be->gdn_chunked = o_gdn_chunked;
    be->argmax = o_argmax;
    be->accept_greedy = o_accept_greedy;
    be->mark = o_mark;
    be->mark_elapsed_us = o_mark_elapsed_us;
    if (inner->capture_begin) { /* graphs only where the inner backend has them */
        be->capture_begin = o_capture_begin;
        be->capture_end = o_capture_end;
        be->graph_launch = o_graph_launch;
        be->graph_free = o_graph_free;
    }
    be->destroy = o_destroy;
    return be;
}

void opcost_skip(struct backend *be, int family) { oc(be)->skip = family; }
