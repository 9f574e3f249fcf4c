/* weights.c — binding a GGUF file's tensors to backend weights through an architecture's
 * tensor table, metadata getters, and the load-time Q4_0 requantization of a matrix. */
#include "engine/weights.h"
#include "model.h"
#include "threadpool.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A tensor of `bytes` is on the backend: tell the caller's progress hook. */
static void note_progress(const struct weight_loader *L, size_t bytes) {
    struct load_progress *p = L->progress;
    if (!p) return;
    p->done += bytes;
    if (p->fn) p->fn(p->user, p->done, p->total);
}

void weight_name(const struct weight_desc *d, int il, char *out, size_t size) {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    if (d->layers && d->layers != WEIGHT_GLOBAL_LAST) snprintf(out, size, d->name, il);
    else snprintf(out, size, "%s", d->name);
#pragma GCC diagnostic pop
}

/* A tensor {n_in, n_out, n_mat} (n_mat 0: 2-D, or 1-D when n_out is 1; else 3-D with any ne[2] up
 * to n_mat) on the backend as one bweight of ne[2]·n_out rows. */
static int bind_rows(const struct weight_loader *L, struct bweight *w, const char *name, int64_t n_in, int64_t n_out,
                     int64_t n_mat) {
    const struct gguf_tensor *t = gguf_find_tensor(L->g, name);
    if (!t) return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "missing tensor %s", name);
    const uint32_t dims = n_mat ? 3 : n_out == 1 ? t->n_dims : 2;
    if (t->n_dims != dims || t->ne[0] != n_in || t->ne[1] != n_out || t->ne[2] < 1 || t->ne[2] > COTI_MAX(n_mat, 1) ||
        t->ne[3] != 1)
        return coti_fail(L->err, L->err_size, COTI_E_FORMAT,
                         "tensor %s has shape {%lld, %lld, %lld} (%u dims), expected {%lld, %lld%s}", name,
                         (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], t->n_dims, (long long)n_in,
                         (long long)n_out, n_mat ? ", n_expert" : "");
    if (!ggml_type_supported(t->type))
        return coti_fail(L->err, L->err_size, COTI_E_UNSUPPORTED, "tensor %s has unsupported type %d", name, (int)t->type);
    int rc = L->be->weight_init(L->be, w, t->type, n_in, n_out * t->ne[2], t->data);
    if (rc) return coti_fail(L->err, L->err_size, rc, "backend cannot hold tensor %s", name);
    note_progress(L, t->size_bytes);
    return 0;
}

static int64_t runs_total(const struct weight_shard_runs *r, int64_t whole) {
    int64_t n = 0;
    if (!r || !r->n) return whole;
    for (int i = 0; i < r->n; i++) n += r->len[i];
    return n;
}

int weights_shard_gather(const struct weight_loader *L, const struct gguf_tensor *t, int64_t n_in, int64_t n_out,
                         const struct weight_shard_runs *rows, const struct weight_shard_runs *cols, void **buf,
                         int64_t *n_in_out, int64_t *n_out_out) {
    const struct ggml_type_traits *tr = ggml_type_traits_get(t->type);
    const size_t rb = ggml_row_size(t->type, n_in);
    if (!tr || !rb) return coti_fail(L->err, L->err_size, COTI_E_UNSUPPORTED, "tensor %s: type %d cannot be split", t->name, (int)t->type);
    const struct weight_shard_runs all_r = {1, {0}, {n_out}}, all_c = {1, {0}, {n_in}};
    if (!rows || !rows->n) rows = &all_r;
    if (!cols || !cols->n) cols = &all_c;
    for (int i = 0; i < rows->n; i++)
        if (rows->start[i] < 0 || rows->len[i] < 1 || rows->start[i] + rows->len[i] > n_out)
            return coti_fail(L->err, L->err_size, COTI_E_ARG, "tensor %s: rows [%lld, +%lld) outside its %lld", t->name,
                             (long long)rows->start[i], (long long)rows->len[i], (long long)n_out);
    for (int i = 0; i < cols->n; i++)
        if (cols->start[i] < 0 || cols->len[i] < 1 || cols->start[i] + cols->len[i] > n_in ||
            cols->start[i] % tr->block_elems || cols->len[i] % tr->block_elems)
            return coti_fail(L->err, L->err_size, COTI_E_UNSUPPORTED,
                             "tensor %s: columns [%lld, +%lld) of %lld do not fall on its %s blocks of %d", t->name,
                             (long long)cols->start[i], (long long)cols->len[i], (long long)n_in, tr->name, tr->block_elems);
    const int64_t ni = runs_total(cols, n_in), no = runs_total(rows, n_out);
    const size_t out_rb = ggml_row_size(t->type, ni);
    uint8_t *out = malloc(out_rb * (size_t)no);
    if (!out) return coti_fail(L->err, L->err_size, COTI_E_NOMEM, "out of memory for a part of %s", t->name);
    uint8_t *dst = out;
    for (int i = 0; i < rows->n; i++)
        for (int64_t r = rows->start[i]; r < rows->start[i] + rows->len[i]; r++) {
            const uint8_t *src = (const uint8_t *)t->data + (size_t)r * rb;
            for (int c = 0; c < cols->n; c++) {
                const size_t off = (size_t)(cols->start[c] / tr->block_elems) * (size_t)tr->block_bytes;
                const size_t len = (size_t)(cols->len[c] / tr->block_elems) * (size_t)tr->block_bytes;
                memcpy(dst, src + off, len);
                dst += len;
            }
        }
    *buf = out;
    *n_in_out = ni;
    *n_out_out = no;
    return 0;
}

/* A 2-D tensor split along the table's width ids (L->shard; the widths are the rank's). */
static int bind_shard(const struct weight_loader *L, const struct weight_desc *d, const char *name, const int64_t *widths,
                      void *field) {
    const struct gguf_tensor *t = gguf_find_tensor(L->g, name);
    if (!t) return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "missing tensor %s", name);
    const struct weight_shard_runs *rows = &L->shard[d->out], *cols = rows->n ? NULL : &L->shard[d->in];
    const int64_t n_in = t->ne[0], n_out = t->n_dims < 2 ? 1 : t->ne[1];
    if (t->n_dims > 2 || (d->kind == WEIGHT_VECTOR && t->type != GGML_TYPE_F32) || n_in != L->shard_whole[d->in] ||
        n_out != L->shard_whole[d->out])
        return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "tensor %s has shape {%lld, %lld} (%u dims, type %d), "
                         "expected {%lld, %lld}", name, (long long)n_in, (long long)n_out, t->n_dims, (int)t->type,
                         (long long)L->shard_whole[d->in], (long long)L->shard_whole[d->out]);
    void *buf;
    int64_t ni, no;
    int rc = weights_shard_gather(L, t, n_in, n_out, rows, cols, &buf, &ni, &no);
    if (rc) return rc;
    if (ni != widths[d->in] || no != widths[d->out]) {
        free(buf);
        return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "tensor %s: the rank's part is {%lld, %lld}, expected {%lld, %lld}",
                         name, (long long)ni, (long long)no, (long long)widths[d->in], (long long)widths[d->out]);
    }
    if (d->kind == WEIGHT_VECTOR) {
        float **p = field;
        *p = L->be->alloc(L->be, sizeof(float) * (size_t)(ni * no));
        if (*p) L->be->upload(L->be, *p, buf, sizeof(float) * (size_t)(ni * no));
        rc = *p ? 0 : coti_fail(L->err, L->err_size, COTI_E_NOMEM, "out of memory for %s", name);
    } else {
        struct bweight *w = field;
        rc = L->be->weight_init(L->be, w, t->type, ni, no, buf);
        if (!rc && !w->repacked && w->data == buf) { /* the backend reads the bytes where they are: keep them */
            w->host_copy = buf;
            buf = NULL;
        }
        if (rc) rc = coti_fail(L->err, L->err_size, rc, "backend cannot hold the rank's part of %s", name);
    }
    free(buf);
    if (!rc) note_progress(L, t->size_bytes);
    return rc;
}

int weights_bind_matrix(const struct weight_loader *L, struct bweight *w, const char *name, int64_t n_in, int64_t n_out) {
    return bind_rows(L, w, name, n_in, n_out, 0);
}

int weights_bind_experts(const struct weight_loader *L, struct bweight *w, const char *name, int64_t n_in,
                         int64_t n_out) {
    return bind_rows(L, w, name, n_in, n_out, BACKEND_MOE_MAX_EXPERTS);
}

int weights_merge_experts(const struct weight_loader *L, struct bweight *a, const char *name_a, struct bweight *b,
                          const char *name_b, int n_expert, struct bweight *out) {
    const struct gguf_tensor *ta = gguf_find_tensor(L->g, name_a), *tb = gguf_find_tensor(L->g, name_b);
    if (!ta || !tb || a->type != b->type || a->n_in != b->n_in || a->data == ta->data || b->data == tb->data ||
        n_expert < 1 || a->n_out % n_expert || b->n_out % n_expert)
        return 0; /* the backend reads the file's bytes: a merged copy would only add one */
    const size_t rb = a->row_bytes, ra = (size_t)(a->n_out / n_expert) * rb, rbb = (size_t)(b->n_out / n_expert) * rb;
    uint8_t *buf = malloc((ra + rbb) * (size_t)n_expert);
    if (!buf) return coti_fail(L->err, L->err_size, COTI_E_NOMEM, "out of memory");
    for (int e = 0; e < n_expert; e++) {
        memcpy(buf + (ra + rbb) * (size_t)e, (const uint8_t *)ta->data + ra * (size_t)e, ra);
        memcpy(buf + (ra + rbb) * (size_t)e + ra, (const uint8_t *)tb->data + rbb * (size_t)e, rbb);
    }
    struct bweight m = {0};
    int rc = L->be->weight_init(L->be, &m, a->type, a->n_in, a->n_out + b->n_out, buf);
    if (!rc && !m.repacked && m.data == buf) { /* kept a pointer to it after all: keep the two */
        L->be->weight_free(L->be, &m);
        free(buf);
        return 0;
    }
    free(buf);
    if (rc) return coti_fail(L->err, L->err_size, rc, "backend cannot hold the merged %s and %s", name_a, name_b);
    L->be->weight_free(L->be, a);
    L->be->weight_free(L->be, b);
    memset(a, 0, sizeof *a);
    memset(b, 0, sizeof *b);
    *out = m;
    return 0;
}

int weights_bind_vector(const struct weight_loader *L, float **out, const char *name, int64_t n) {
    const struct gguf_tensor *t = gguf_find_tensor(L->g, name);
    if (!t) return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "missing tensor %s", name);
    int64_t count = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    if (t->type != GGML_TYPE_F32 || count != n)
        return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "tensor %s must be F32 with %lld elements (type %d, %lld elements)",
                         name, (long long)n, (int)t->type, (long long)count);
    *out = L->be->alloc(L->be, sizeof(float) * (size_t)n);
    if (!*out) return coti_fail(L->err, L->err_size, COTI_E_NOMEM, "out of memory for %s", name);
    L->be->upload(L->be, *out, t->data, sizeof(float) * (size_t)n);
    note_progress(L, t->size_bytes);
    return 0;
}

static bool weight_in_kind(const struct weight_desc *d, unsigned kind) {
    const bool global = d->layers == 0 || d->layers == WEIGHT_GLOBAL_LAST;
    return kind ? !global && (d->layers & kind) : global;
}

static int weights_bind_scalar(const struct weight_loader *L, float *out, const char *name) {
    const struct gguf_tensor *t = gguf_find_tensor(L->g, name);
    if (!t) return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "missing tensor %s", name);
    if (t->type != GGML_TYPE_F32 || t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3] != 1)
        return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "tensor %s must be one F32 value", name);
    memcpy(out, t->data, sizeof *out);
    return 0;
}

int weights_bind(const struct weight_loader *L, const struct weight_desc *table, int n, unsigned kind, int il,
                 void *base, const int64_t *widths) {
    char name[128];
    for (int i = 0; i < n; i++) {
        const struct weight_desc *d = &table[i];
        if (!weight_in_kind(d, kind)) continue;
        weight_name(d, il, name, sizeof name);
        if (d->presence != WEIGHT_REQUIRED && !gguf_find_tensor(L->g, name)) continue;
        void *field = (uint8_t *)base + d->offset;
        const bool split = L->shard && (d->kind == WEIGHT_MATRIX || d->kind == WEIGHT_VECTOR) &&
                           (L->shard[d->in].n || L->shard[d->out].n);
        int rc = split                      ? bind_shard(L, d, name, widths, field)
                 : d->kind == WEIGHT_EXPERTS  ? weights_bind_experts(L, field, name, widths[d->in], widths[d->out])
                 : d->kind == WEIGHT_MATRIX ? weights_bind_matrix(L, field, name, widths[d->in], widths[d->out])
                 : d->kind == WEIGHT_VECTOR ? weights_bind_vector(L, field, name, widths[d->in] * widths[d->out])
                                            : weights_bind_scalar(L, field, name);
        if (rc) return rc;
    }
    return 0;
}

void weights_unbind(struct backend *be, const struct weight_desc *table, int n, unsigned kind, void *base) {
    for (int i = 0; i < n; i++) {
        if (!weight_in_kind(&table[i], kind) || table[i].kind == WEIGHT_SCALAR) continue;
        void *field = (uint8_t *)base + table[i].offset;
        if (table[i].kind == WEIGHT_MATRIX || table[i].kind == WEIGHT_EXPERTS) {
            struct bweight *w = field;
            if (w->data) be->weight_free(be, w);
            free(w->host_copy);
            *w = (struct bweight){0};
        } else {
            float **p = field;
            if (*p) be->free(be, *p);
            *p = NULL;
        }
    }
}

int weights_get_u32(const struct weight_loader *L, const char *key, int *out) {
    char k[256];
    uint32_t v;
    snprintf(k, sizeof k, "%s.%s", L->arch, key);
    int rc = gguf_get_u32(L->g, k, &v, L->err, L->err_size);
    if (rc == COTI_E_ARG) return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "missing metadata key %s", k);
    if (rc) return rc;
    if (v > (1u << 30)) return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "%s = %u is out of range", k, v);
    *out = (int)v;
    return 0;
}

int weights_get_u32_opt(const struct weight_loader *L, const char *key, int *out, int def) {
    *out = def;
    int rc = weights_get_u32(L, key, out);
    if (rc == COTI_E_FORMAT && strncmp(L->err, "missing", 7) == 0) { *out = def; return 0; }
    return rc;
}

int weights_get_f32(const struct weight_loader *L, const char *key, float *out) {
    char k[256];
    snprintf(k, sizeof k, "%s.%s", L->arch, key);
    int rc = gguf_get_f32(L->g, k, out, L->err, L->err_size);
    if (rc == COTI_E_ARG) return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "missing metadata key %s", k);
    return rc;
}

int weights_get_f32_opt(const struct weight_loader *L, const char *key, float *out, float def) {
    char k[256];
    snprintf(k, sizeof k, "%s.%s", L->arch, key);
    int rc = gguf_get_f32(L->g, k, out, L->err, L->err_size);
    if (rc == COTI_E_ARG) { *out = def; return 0; }
    return rc;
}

/* "<arch>.<key>" as one value per layer: an array of n_layer integers, or one broadcast. */
int weights_get_per_layer(const struct weight_loader *L, const char *key, int n_layer, int *out, bool required, int def) {
    char k[256];
    snprintf(k, sizeof k, "%s.%s", L->arch, key);
    const struct gguf_kv *kv = gguf_find_kv(L->g, k);
    if (kv && kv->type == GGUF_TYPE_ARRAY) {
        size_t n = 0;
        int rc = gguf_get_arr_i32(L->g, k, out, (size_t)n_layer, &n, L->err, L->err_size);
        if (rc) return rc;
        if (n != (size_t)n_layer)
            return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "%s has %zu values for %d layers", k, n, n_layer);
        for (int i = 0; i < n_layer; i++)
            if (out[i] < 0 || out[i] > (1 << 30)) return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "%s[%d] = %d is out of range", k, i, out[i]);
        return 0;
    }
    int v;
    int rc = required ? weights_get_u32(L, key, &v) : weights_get_u32_opt(L, key, &v, def);
    if (rc) return rc;
    for (int i = 0; i < n_layer; i++) out[i] = v;
    return 0;
}

/* Rows [row0, row1) of a requantization split over a temporary thread pool. */
struct requant_job {
    const uint8_t *src;
    enum ggml_type src_type;
    size_t src_rb, dst_rb;
    uint8_t *dst;
    int64_t n, rows;
    atomic_bool oom;                     /* a worker could not get its row buffer */
};

static void requant_rows(void *arg, int ith, int nth) {
    struct requant_job *j = arg;
    float *row = malloc(sizeof(float) * (size_t)j->n);
    if (!row) { atomic_store(&j->oom, true); return; }
    for (int64_t r = j->rows * ith / nth; r < j->rows * (ith + 1) / nth; r++) {
        quant_dequantize_row_ref(j->src_type, j->src + (size_t)r * j->src_rb, row, j->n);
        quant_quantize_row_ref(GGML_TYPE_Q4_0, row, j->dst + (size_t)r * j->dst_rb, j->n);
    }
    free(row);
}

/* Above this many weights the requantization runs on every core: a 9B head (248320 x 4096)
 * takes ~5 s on one, and every load of an MTP model pays it. */
#define REQUANT_PARALLEL_MIN (1 << 24)

int weights_requant_q4_0(const struct weight_loader *L, const struct gguf_tensor *t, int64_t n_in, int64_t n_out,
                         struct bweight *out, void **host) {
    struct requant_job j = {(const uint8_t *)t->data, t->type, ggml_row_size(t->type, n_in),
                            ggml_row_size(GGML_TYPE_Q4_0, n_in), NULL, n_in, n_out, false};
    *host = j.dst = malloc(j.dst_rb * (size_t)n_out);
    long ncpu = n_in * n_out >= REQUANT_PARALLEL_MIN ? sysconf(_SC_NPROCESSORS_ONLN) : 1;
    struct threadpool *tp = j.dst ? threadpool_init((int)COTI_MAX(1, COTI_MIN(ncpu, 64))) : NULL;
    if (tp) threadpool_run(tp, requant_rows, &j);
    threadpool_free(tp);
    if (!tp || atomic_load(&j.oom)) return coti_fail(L->err, L->err_size, COTI_E_NOMEM, "out of memory for a Q4_0 copy of %s", t->name);
    struct bweight w = {0};
    if (L->be->weight_init(L->be, &w, GGML_TYPE_Q4_0, n_in, n_out, *host) == 0) *out = w;
    return 0;
}
