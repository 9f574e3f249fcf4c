/* backend_cpu.c — the CPU backend: host memory, a thread pool, SIMD matmul kernels from
 * quant.h chosen once at init, and plain-C ops for everything that is not a matmul.
 * Ops small enough that a thread hand-off costs more than the work (norms and elementwise
 * ops over a few hundred floats per token) run on the calling thread.
 * Numerics follow llama.cpp's CPU path where it matters for logit agreement: activations are
 * converted to the weight type's vec_dot type before a matmul; the KV cache rows are stored as
 * llama.cpp stores them (f16, bf16, or q8_0 / q4_0 blocks of 32 by the reference rule) and
 * attention reads them converted to f32 a block of rows at a time; norms,
 * rope, softmax, conv and the delta rule are f32. Each output value is computed the same way
 * whatever the batch size or thread count, so a verify batch reproduces plain decode bit for
 * bit. */
#include "backend.h"
#include "threadpool.h"
#include "cpu/ops.h"
#include "tp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cpu_ctx {
    struct threadpool *tp;
    enum quant_cpu_level level;
    const struct cpu_ops *ops;   /* attention and delta-rule kernels for this level */
    struct quant_kernels kernels[GGML_TYPE_COUNT];
    bool have_kernels[GGML_TYPE_COUNT];
    /* activation conversion scratch, grown on demand (only while warming up) */
    void *xconv;
    size_t xconv_size;
    struct gdn_chunk_scratch *chunk_scratch; /* one per thread (~300 KB each) */
    float *gates;                /* a delta-rule call's formed g, then beta; grown on demand */
    size_t gates_n;
    void *moe;                   /* matmul_id's slot order, formed rows and outputs; grown on demand */
    size_t moe_size;
    int64_t marks_us[BACKEND_N_MARKS];
};

static struct cpu_ctx *cpu(struct backend *be) { return be->ctx; }

/* ---- memory ------------------------------------------------------------------------ */

static void *cpu_alloc(struct backend *be, size_t bytes) {
    void *p = NULL;
    size_t n = (bytes + 63) & ~(size_t)63;
    if (n < bytes || posix_memalign(&p, 64, n ? n : 64) != 0) return NULL;
    memset(p, 0, n);
    return p;
}
static void cpu_free(struct backend *be, void *p) { free(p); }
/* MemAvailable of /proc/meminfo: alloc touches every byte it gives (zeroing), so a request past
 * it would push the machine into swap or the OOM killer rather than fail; SIZE_MAX when
 * unknown. */
static size_t cpu_mem_available(struct backend *be) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[128];
    unsigned long long kib = 0;
    bool found = false;
    while (f && !found && fgets(line, sizeof line, f)) found = sscanf(line, "MemAvailable: %llu kB", &kib) == 1;
    if (f) fclose(f);
    return found && kib < SIZE_MAX / 1024 ? (size_t)kib * 1024 : SIZE_MAX;
}
static void cpu_memcpy(struct backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes) memmove(dst, src, bytes);
}
static void cpu_copy_n(struct backend *be, void *const *dst, const void *const *src, const size_t *bytes, int n) {
    for (int i = 0; i < n; i++) cpu_memcpy(be, dst[i], src[i], bytes[i]);
}
static void cpu_copy_n_at(struct backend *be, void *const *dst, const void *const *src, const size_t *step,
                          const size_t *bytes, int n, const int32_t *sel, int limit) {
    const int32_t a = sel[0];
    if (a < 0 || a >= limit) return;
    for (int i = 0; i < n; i++) cpu_memcpy(be, dst[i], (const uint8_t *)src[i] + (size_t)a * step[i], bytes[i]);
}
static void cpu_sync(struct backend *be) {}

/* Weights are used in place from the mapping, unless the kernels of this CPU level have a
 * packed layout for the type (packed.c): then the backend keeps a repacked copy. */
static bool cpu_supports(struct backend *be, enum backend_op op, enum ggml_type type) {
    switch (op) {
    case BACKEND_OP_matmul:
    case BACKEND_OP_matmul_id:
    case BACKEND_OP_get_rows: return (int)type >= 0 && type < GGML_TYPE_COUNT && cpu(be)->have_kernels[type];
    case BACKEND_OP_attn_prep:
    case BACKEND_OP_kv_store:
    case BACKEND_OP_attention: return kv_type_ok(type, 32); /* kv.h's types (every one tiles 32) */
    default: return (int)op >= 0 && op < BACKEND_OP_COUNT && type == GGML_TYPE_F32;
    }
}

static int cpu_weight_init(struct backend *be, struct bweight *w, enum ggml_type type,
                           int64_t n_in, int64_t n_out, const void *host_data) {
    if (!cpu_supports(be, BACKEND_OP_matmul, type)) return COTI_E_UNSUPPORTED;
    const struct quant_kernels *k = &cpu(be)->kernels[type];
    w->type = type;
    w->n_in = n_in;
    w->n_out = n_out;
    w->row_bytes = ggml_row_size(type, n_in);
    w->data = host_data;
    w->repacked = false;
    if (!w->row_bytes) return COTI_E_FORMAT;
    size_t packed = k->packed_size ? k->packed_size(n_in, n_out) : 0;
    if (packed) {
        void *p = NULL;
        if (posix_memalign(&p, 64, packed) != 0) return COTI_E_NOMEM;
        k->pack(host_data, w->row_bytes, n_in, n_out, p);
        w->data = p;
        w->repacked = true;
    }
    return 0;
}
static void cpu_weight_free(struct backend *be, struct bweight *w) {
    if (w->repacked) free((void *)w->data);
    w->data = NULL;
    w->repacked = false;
}

/* ---- matmul ------------------------------------------------------------------------ */

/* Rows handed to one thread at a time are a multiple of this, so threads do not share
 * cache lines of y and kernels get whole tiles. */
#define CPU_MATMUL_ROW_QUANTUM QUANT_PACK_ROWS   /* also whole groups of a packed weight */

struct matmul_job {
    struct cpu_ctx *c;
    const struct bweight *const *ws;
    float *const *ys;
    const void *const *xs;       /* converted input per weight */
    const size_t *x_row_bytes;
    int n_w;
    int n_tok;
    int64_t total_quanta;
};

/* Rows [lo, hi) of weight w; lo and hi are multiples of the row quantum or n_out, which for a
 * packed weight are whole groups. */
static void matmul_rows(const struct quant_kernels *k, const struct bweight *w, int64_t lo, int64_t hi,
                        const void *x, size_t x_row_bytes, int n_tok, float *y) {
    if (w->repacked)
        k->packed_gemm(w->n_in, (const uint8_t *)w->data + k->packed_size(w->n_in, lo) /* rows before lo */, hi - lo, x,
                       x_row_bytes, n_tok, y + lo, w->n_out);
    else
        k->gemm(w->n_in, (const uint8_t *)w->data + (size_t)lo * w->row_bytes, w->row_bytes, hi - lo,
                x, x_row_bytes, n_tok, y + lo, w->n_out);
}

/* Each weight's rows are cut into quanta counted from its own row 0; thread ith takes a
 * contiguous run of the quanta of all weights. */
static void matmul_worker(void *arg, int ith, int nth) {
    struct matmul_job *j = arg;
    int64_t q0 = j->total_quanta * ith / nth, q1 = j->total_quanta * (ith + 1) / nth, base = 0;
    for (int i = 0; i < j->n_w && q0 < q1; i++) {
        const struct bweight *w = j->ws[i];
        int64_t nq = (w->n_out + CPU_MATMUL_ROW_QUANTUM - 1) / CPU_MATMUL_ROW_QUANTUM;
        int64_t lo = COTI_MAX(q0, base) - base, hi = COTI_MIN(q1, base + nq) - base;
        if (lo < hi)
            matmul_rows(&j->c->kernels[w->type], w, lo * CPU_MATMUL_ROW_QUANTUM,
                        COTI_MIN(hi * CPU_MATMUL_ROW_QUANTUM, w->n_out), j->xs[i], j->x_row_bytes[i],
                        j->n_tok, j->ys[i]);
        base += nq;
    }
}

#define CPU_MATMUL_MAX_WEIGHTS 8

/* A matmul's input conversions: one per distinct vec_dot type of its weights, into the scratch
 * xconv, and the job that reads them. */
struct matmul_plan {
    struct matmul_job j;
    const void *xs[CPU_MATMUL_MAX_WEIGHTS];
    size_t xrb[CPU_MATMUL_MAX_WEIGHTS];
    const struct quant_kernels *conv[CPU_MATMUL_MAX_WEIGHTS]; /* [n_conv]: the converting kernels */
    uint8_t *conv_dst[CPU_MATMUL_MAX_WEIGHTS];
    size_t conv_rb[CPU_MATMUL_MAX_WEIGHTS];
    int n_conv;
};

static void matmul_plan(struct cpu_ctx *c, const struct bweight *const *ws, float *const *ys, int n_w, int n_tok,
                        struct matmul_plan *p) {
    int64_t n_in = ws[0]->n_in, total = 0;

    /* size the conversion scratch for every distinct vec_dot type */
    size_t need = 0;
    for (int i = 0; i < n_w; i++) {
        enum ggml_type vt = c->kernels[ws[i]->type].vec_dot_type;
        size_t rb = ggml_row_size(vt, n_in);
        p->xrb[i] = rb;
        need += rb * (size_t)n_tok + 64;
        total += (ws[i]->n_out + CPU_MATMUL_ROW_QUANTUM - 1) / CPU_MATMUL_ROW_QUANTUM;
    }
    if (need > c->xconv_size) {
        free(c->xconv);
        c->xconv = NULL;
        if (posix_memalign(&c->xconv, 64, need) != 0) abort(); /* resource failure at warm-up */
        c->xconv_size = need;
    }
    size_t off = 0;
    p->n_conv = 0;
    for (int i = 0; i < n_w; i++) {
        const struct quant_kernels *k = &c->kernels[ws[i]->type];
        int found = -1;
        for (int d = 0; d < p->n_conv; d++) if (p->conv[d]->vec_dot_type == k->vec_dot_type) found = d;
        if (found < 0) {
            found = p->n_conv++;
            p->conv[found] = k;
            p->conv_dst[found] = (uint8_t *)c->xconv + off;
            p->conv_rb[found] = p->xrb[i];
            off += (p->xrb[i] * (size_t)n_tok + 63) & ~(size_t)63;
        }
        p->xs[i] = p->conv_dst[found];
    }
    p->j = (struct matmul_job){c, ws, ys, p->xs, p->xrb, n_w, n_tok, total};
}

/* Rows [t0, t1) of x (n_in wide) into every conversion of p. */
static void matmul_convert(const struct matmul_plan *p, const float *x, int64_t n_in, int t0, int t1) {
    for (int d = 0; d < p->n_conv; d++)
        for (int t = t0; t < t1; t++) p->conv[d]->from_float(x + (size_t)t * n_in, p->conv_dst[d] + (size_t)t * p->conv_rb[d], n_in);
}

static void cpu_get_rows(struct backend *be, const struct bweight *w, const int32_t *ids, int n, float *out) {
    const struct quant_kernels *k = &cpu(be)->kernels[w->type];
    for (int t = 0; t < n; t++) {
        float *dst = out + (size_t)t * w->n_in;
        if (w->repacked) k->packed_row(w->data, w->n_in, ids[t], dst);
        else k->dequantize_row((const uint8_t *)w->data + (size_t)ids[t] * w->row_bytes, dst, w->n_in);
    }
}

/* ---- norms and elementwise --------------------------------------------------------- */

static void cpu_add(struct backend *be, const float *a, const float *b, int64_t n, float *y) {
    for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}

/* Σx² in double, then 1/sqrt in f32 — llama.cpp's order of operations. */
static float rms_scale(const struct cpu_ops *ops, const float *x, int dim, float eps) {
    return 1.0f / sqrtf((float)(ops->sum_sq(x, dim) / dim) + eps);
}

static void cpu_rmsnorm(struct backend *be, const float *x, int x_stride, const float *w, int n_rows,
                        int dim, float eps, float *y, int y_stride) {
    for (int r = 0; r < n_rows; r++) {
        const float *xr = x + (size_t)r * x_stride;
        float *yr = y + (size_t)r * y_stride;
        float s = rms_scale(cpu(be)->ops, xr, dim, eps);
        for (int i = 0; i < dim; i++) yr[i] = (xr[i] * s) * w[i];
    }
}

static void cpu_add_rmsnorm(struct backend *be, float *x, const float *m, const float *w, int n_rows, int dim,
                            float eps, float *y) {
    cpu_add(be, x, m, (int64_t)n_rows * dim, x);
    cpu_rmsnorm(be, x, dim, w, n_rows, dim, eps, y, dim);
}

static void cpu_rmsnorm_add(struct backend *be, float *x, const float *y, const float *w, int n_rows, int dim,
                            float eps, float s) {
    for (int r = 0; r < n_rows; r++) {
        float *xr = x + (size_t)r * dim;
        const float *yr = y + (size_t)r * dim;
        const float sc = rms_scale(cpu(be)->ops, yr, dim, eps);
        for (int i = 0; i < dim; i++) xr[i] = (xr[i] + (yr[i] * sc) * w[i]) * s;
    }
}

/* The exp-based activations go through the level's vector kernels in pieces of this many
 * values (a stack buffer). */
#define CPU_ACT_PIECE 256

static void cpu_rmsnorm_gated(struct backend *be, const float *x, const float *w, const float *z,
                              int n_rows, int dim, float eps, float *y) {
    const struct cpu_ops *ops = cpu(be)->ops;
    float act[CPU_ACT_PIECE];
    for (int r = 0; r < n_rows; r++) {
        const float *xr = x + (size_t)r * dim, *zr = z + (size_t)r * dim;
        float *yr = y + (size_t)r * dim;
        float s = rms_scale(ops, xr, dim, eps);
        for (int i0 = 0; i0 < dim; i0 += CPU_ACT_PIECE) {
            const int n = COTI_MIN(CPU_ACT_PIECE, dim - i0);
            ops->silu(zr + i0, act, n);
            for (int i = 0; i < n; i++) yr[i0 + i] = ((xr[i0 + i] * s) * w[i0 + i]) * act[i];
        }
    }
}

static void cpu_swiglu(struct backend *be, const float *g, const float *u, int64_t n, float *y) {
    const struct cpu_ops *ops = cpu(be)->ops;
    for (int64_t i0 = 0; i0 < n; i0 += CPU_ACT_PIECE) {
        const int m = (int)COTI_MIN(CPU_ACT_PIECE, n - i0);
        ops->silu(g + i0, y + i0, m);
        for (int i = 0; i < m; i++) y[i0 + i] *= u[i0 + i];
    }
}

/* gelu's tanh form and the soft-cap through the level's vector sigmoid: 0.5·(1 + tanh(u)) =
 * sigmoid(2u) and c·tanh(x/c) = c·(2·sigmoid(2x/c) - 1), the same functions as llama.cpp's
 * tanhf forms up to f32 rounding (the soft-cap's absolute error stays ~1e-7·c near 0). */

/* GeGLU as llama.cpp's CPU computes it (a table over f16): gelu of the f16-rounded gate,
 * rounded to f16, times up; 0 at or below -10, the gate itself at or above 10. Exact f32 gelu
 * moved random quantized gemma4 models' logits 4x further from llama.cpp's (median |Δ logprob|
 * 0.055 against 0.013: docs/notes/2026-12-03-gemma4.md). */
static void cpu_geglu(struct backend *be, const float *g, const float *u, int64_t n, float *y) {
    const struct cpu_ops *ops = cpu(be)->ops;
    const float two_sqrt_2_over_pi = 1.5957691216057307f, coef_a = 0.044715f;
    float t[CPU_ACT_PIECE], xh[CPU_ACT_PIECE];
    for (int64_t i0 = 0; i0 < n; i0 += CPU_ACT_PIECE) {
        const int m = (int)COTI_MIN(CPU_ACT_PIECE, n - i0);
        for (int i = 0; i < m; i++) {
            const float x = xh[i] = fp16_to_f32(f32_to_fp16(g[i0 + i]));
            t[i] = two_sqrt_2_over_pi * x * (1.0f + coef_a * x * x);
        }
        ops->sigmoid(t, t, m);
        for (int i = 0; i < m; i++) {
            const float x = g[i0 + i];
            const float gelu = x <= -10.0f ? 0.0f : x >= 10.0f ? x : fp16_to_f32(f32_to_fp16(xh[i] * t[i]));
            y[i0 + i] = gelu * u[i0 + i];
        }
    }
}

static void cpu_all_reduce(struct backend *be, float *x, int64_t n) {
    if (be->comm) tp_comm_sum_host(be->comm, be->rank, x, n);
}

static void cpu_scale(struct backend *be, float *x, int64_t n, float s) {
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

static void cpu_softcap(struct backend *be, float *x, int64_t n, float c) {
    const struct cpu_ops *ops = cpu(be)->ops;
    const float k = 2.0f / c;
    float t[CPU_ACT_PIECE];
    for (int64_t i0 = 0; i0 < n; i0 += CPU_ACT_PIECE) {
        const int m = (int)COTI_MIN(CPU_ACT_PIECE, n - i0);
        for (int i = 0; i < m; i++) t[i] = x[i0 + i] * k;
        ops->sigmoid(t, t, m);
        for (int i = 0; i < m; i++) x[i0 + i] = c * (2.0f * t[i] - 1.0f);
    }
}

static void cpu_mul_sigmoid(struct backend *be, float *x, const float *gate, int n_tok, int n_head,
                            int dim, int gate_stride, int gate_head_stride) {
    const struct cpu_ops *ops = cpu(be)->ops;
    float act[CPU_ACT_PIECE];
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < n_head; h++) {
            float *xr = x + ((size_t)t * n_head + h) * dim;
            const float *gr = gate + (size_t)t * gate_stride + (size_t)h * gate_head_stride;
            for (int i0 = 0; i0 < dim; i0 += CPU_ACT_PIECE) {
                const int n = COTI_MIN(CPU_ACT_PIECE, dim - i0);
                ops->sigmoid(gr + i0, act, n);
                for (int i = 0; i < n; i++) xr[i0 + i] *= act[i];
            }
        }
}

/* ---- matmul over a formed input ---------------------------------------------------- */

/* Rows [t0, t1) of the input in formed by the separate ops (n_in wide, n_tok rows in all); the
 * rows formed, where the matmul reads them. Each row is formed alone, so any split of the rows
 * gives the same bits. */
static const float *form_rows(struct backend *be, const struct matmul_in *in, int n_in, int t0, int t1) {
    const size_t o = (size_t)t0 * n_in;
    const int n = t1 - t0;
    switch (in->kind) {
    case MATMUL_PLAIN: return in->x;
    case MATMUL_RMSNORM: {
        const float *x = in->x;
        if (in->m) {
            cpu_add(be, x + o, in->m + o, (int64_t)n * n_in, in->x_out + o);
            x = in->x_out;
        }
        cpu_rmsnorm(be, x + o, n_in, in->w, n, n_in, in->eps, in->a + o, n_in);
        return in->a;
    }
    case MATMUL_SWIGLU: cpu_swiglu(be, in->x + o, in->m + o, (int64_t)n * n_in, in->a + o); return in->a;
    case MATMUL_GEGLU: cpu_geglu(be, in->x + o, in->m + o, (int64_t)n * n_in, in->a + o); return in->a;
    case MATMUL_GATED_NORM:
        cpu_rmsnorm_gated(be, in->x + o, in->w, in->m + o, (int)((int64_t)n * n_in / in->dim), in->dim, in->eps, in->a + o);
        return in->a;
    case MATMUL_NORM2: /* [rmsnorm(x) ⊙ w, rmsnorm(m) ⊙ w2], x and m dim wide */
        cpu_rmsnorm(be, in->x + (size_t)t0 * in->dim, in->dim, in->w, n, in->dim, in->eps, in->a + o, 2 * in->dim);
        cpu_rmsnorm(be, in->m + (size_t)t0 * in->dim, in->dim, in->w2, n, in->dim, in->eps, in->a + o + in->dim, 2 * in->dim);
        return in->a;
    case MATMUL_SIGMOID_GATE:
        if (in->a != in->x) memcpy(in->a + o, in->x + o, sizeof(float) * (size_t)n * n_in);
        cpu_mul_sigmoid(be, in->a + o, in->m + (size_t)t0 * in->gate_stride, n, n_in / in->dim, in->dim, in->gate_stride,
                        in->gate_head_stride);
        return in->a;
    default: abort(); /* a caller bug */
    }
}

/* Several rows in one pool job: each thread forms and converts its share of the rows, waits for
 * the others, then computes its share of the outputs (the forming ops are too small for a
 * dispatch of their own, and on the caller alone they left the other threads spinning: ~30 us
 * of a CPU verify row's ~115, docs/notes/2026-12-05-matvec-rows.md). */
struct formed_job {
    struct backend *be;
    const struct matmul_in *in;
    int n_in, n_tok;
    struct matmul_plan *p;
    atomic_int formed;           /* threads done forming (threadpool_meet) */
};
static void formed_worker(void *arg, int ith, int nth) {
    struct formed_job *f = arg;
    const int t0 = f->n_tok * ith / nth, t1 = f->n_tok * (ith + 1) / nth;
    if (t0 < t1) matmul_convert(f->p, form_rows(f->be, f->in, f->n_in, t0, t1), f->n_in, t0, t1);
    threadpool_meet(&f->formed, nth);
    matmul_worker(&f->p->j, ith, nth);
}

/* The unfused forms: the separate ops, then the matmul of what they wrote, so the CPU path is
 * the yardstick the fused kernels of other backends are held to. One row is formed on the
 * caller; more are formed and multiplied in one pool job (formed_worker). */
static void cpu_matmul(struct backend *be, const struct bweight *const *ws, float *const *ys, int n_w,
                       const struct matmul_in *in, int n_tok) {
    struct cpu_ctx *c = cpu(be);
    const int n_in = (int)ws[0]->n_in;
    struct matmul_plan p;
    matmul_plan(c, ws, ys, n_w, n_tok, &p);
    if (n_tok == 1 || threadpool_n_threads(c->tp) == 1) {
        matmul_convert(&p, form_rows(be, in, n_in, 0, n_tok), n_in, 0, n_tok);
        threadpool_run(c->tp, matmul_worker, &p.j);
        return;
    }
    struct formed_job f = {be, in, n_in, n_tok, &p, 0};
    threadpool_run(c->tp, formed_worker, &f);
}

/* ---- mixture of experts ------------------------------------------------------------ */

/* Softmax as llama.cpp's CPU forms it (f32 exponentials of x - max, their sum in double, one
 * reciprocal), the top n_used by selection, the selected p normalized by their f32 sum. */
static void cpu_moe_route(struct backend *be, const float *logits, int n_tok, int n_expert, int n_used, int32_t *ids,
                          float *wts) {
    if (n_expert > BACKEND_MOE_MAX_EXPERTS || n_used > n_expert) return; /* a caller bug */
    float p[BACKEND_MOE_MAX_EXPERTS];
    for (int t = 0; t < n_tok; t++) {
        const float *l = logits + (size_t)t * n_expert;
        int32_t *id = ids + (size_t)t * n_used;
        float *wt = wts + (size_t)t * n_used;
        float mx = -INFINITY;
        for (int e = 0; e < n_expert; e++) mx = fmaxf(mx, l[e]);
        double sum = 0.0;
        for (int e = 0; e < n_expert; e++) sum += (p[e] = expf(l[e] - mx));
        const float inv = (float)(1.0 / sum);
        for (int e = 0; e < n_expert; e++) p[e] *= inv;
        float wsum = 0.0f;
        for (int k = 0; k < n_used; k++) {
            int best = 0;
            for (int e = 1; e < n_expert; e++)
                if (p[e] > p[best]) best = e;
            id[k] = best;
            wt[k] = p[best];
            wsum += wt[k];
            p[best] = -1.0f; /* taken */
        }
        wsum = fmaxf(wsum, 6.103515625e-5f);
        for (int k = 0; k < n_used; k++) wt[k] /= wsum;
    }
}

struct matmul_id_job {
    struct cpu_ctx *c;
    const struct bweight *w;
    int64_t rows;                /* per expert */
    const int32_t *active;       /* the experts chosen by some slot, ascending */
    const int32_t *start, *count;/* per expert: its first position in slot order, its slots */
    const uint8_t *x;            /* converted input rows in slot order */
    size_t x_row_bytes;
    float *y;                    /* output rows in slot order, `rows` wide */
    int64_t n_active, quanta;    /* quanta per expert */
};

/* Thread ith takes a contiguous run of (active expert, row quantum) pairs: every expert's rows
 * are read once, against all of its slots' inputs at once. */
static void matmul_id_worker(void *arg, int ith, int nth) {
    const struct matmul_id_job *j = arg;
    const struct bweight *w = j->w;
    const struct quant_kernels *k = &j->c->kernels[w->type];
    const int64_t total = j->n_active * j->quanta, q0 = total * ith / nth, q1 = total * (ith + 1) / nth;
    for (int64_t q = q0; q < q1;) {
        const int64_t a = q / j->quanta, lo_q = q % j->quanta;
        const int64_t hi_q = COTI_MIN(j->quanta, lo_q + (q1 - q));
        const int32_t e = j->active[a];
        const int64_t lo = lo_q * CPU_MATMUL_ROW_QUANTUM, hi = COTI_MIN(hi_q * CPU_MATMUL_ROW_QUANTUM, j->rows);
        const int64_t row0 = (int64_t)e * j->rows + lo;
        const uint8_t *x = j->x + (size_t)j->start[e] * j->x_row_bytes;
        float *y = j->y + (size_t)j->start[e] * j->rows + lo;
        if (w->repacked)
            k->packed_gemm(w->n_in, (const uint8_t *)w->data + k->packed_size(w->n_in, row0), hi - lo, x,
                           j->x_row_bytes, j->count[e], y, j->rows);
        else
            k->gemm(w->n_in, (const uint8_t *)w->data + (size_t)row0 * w->row_bytes, w->row_bytes, hi - lo, x,
                    j->x_row_bytes, j->count[e], y, j->rows);
        q += hi_q - lo_q;
    }
}

/* Slots are put in expert order (a counting sort, stable), their input rows converted once, and
 * each chosen expert multiplied with all of its slots as one gemm; the outputs go back to the
 * slots' rows. A slot's row is computed as the plain matmul of its input would be: the gemm
 * kernels compute every (row, token) alike whatever the token count. A packed weight is cut at
 * expert bounds, so rows per expert must be whole pack groups (the loader checks it). */
static void cpu_matmul_id(struct backend *be, const struct bweight *w, const struct matmul_id_in *in, int n_tok,
                          float *y) {
    struct cpu_ctx *c = cpu(be);
    const struct quant_kernels *k = &c->kernels[w->type];
    const int n_slots = n_tok * in->n_used, E = in->n_expert, n_in = (int)w->n_in;
    const int64_t rows = w->n_out / E;
    if (n_slots <= 0 || E <= 0 || (w->repacked && rows % CPU_MATMUL_ROW_QUANTUM)) return;
    const size_t xrb = ggml_row_size(k->vec_dot_type, n_in);
    /* scratch: start, count, active [E]; order [n_slots]; one formed row; converted rows; outputs */
    const size_t ints = (size_t)3 * E + (size_t)n_slots, xoff = (ints * sizeof(int32_t) + 63) & ~(size_t)63;
    const size_t formed = (sizeof(float) * (size_t)n_in + 63) & ~(size_t)63;
    const size_t xbytes = (xrb * (size_t)n_slots + 63) & ~(size_t)63;
    const size_t need = xoff + formed + xbytes + sizeof(float) * (size_t)n_slots * (size_t)rows;
    if (need > c->moe_size) {
        free(c->moe);
        c->moe = NULL;
        if (posix_memalign(&c->moe, 64, need) != 0) abort(); /* resource failure at warm-up */
        c->moe_size = need;
    }
    int32_t *start = c->moe, *count = start + E, *active = count + E, *order = active + E;
    float *row = (float *)((uint8_t *)c->moe + xoff);
    uint8_t *xc = (uint8_t *)row + formed;
    float *ys = (float *)(xc + xbytes);
    memset(count, 0, sizeof(int32_t) * (size_t)E);
    for (int s = 0; s < n_slots; s++) {
        const int32_t e = in->ids[s];
        if (e >= 0 && e < E) count[e]++;
    }
    int64_t n_active = 0;
    int32_t pos = 0;
    for (int e = 0; e < E; e++) {
        start[e] = pos;
        pos += count[e];
        if (count[e]) active[n_active++] = e;
        count[e] = 0;
    }
    for (int s = 0; s < n_slots; s++) {
        const int32_t e = in->ids[s];
        if (e < 0 || e >= E) continue;
        const int p = start[e] + count[e]++;
        order[p] = s;
        const float *x = in->x + (size_t)(s / in->n_used) * in->tok_stride + (size_t)(s % in->n_used) * in->slot_stride;
        if (in->glu != MOE_GLU_NONE) {
            (in->glu == MOE_GLU_GEGLU ? cpu_geglu : cpu_swiglu)(be, x, x + n_in, n_in, row);
            x = row;
        }
        k->from_float(x, xc + (size_t)p * xrb, n_in);
    }
    struct matmul_id_job j = {c, w, rows, active, start, count, xc, xrb, ys, n_active,
                              (rows + CPU_MATMUL_ROW_QUANTUM - 1) / CPU_MATMUL_ROW_QUANTUM};
    threadpool_run(c->tp, matmul_id_worker, &j);
    for (int p = 0; p < pos; p++)
        memcpy(y + (size_t)order[p] * in->y_stride, ys + (size_t)p * rows, sizeof(float) * (size_t)rows);
}

/* The sum in llama.cpp's order: each expert's output times its scale, times its weight, added
 * in slot order, then the gated shared expert. */
static void cpu_moe_sum(struct backend *be, const float *y, const float *wts, const int32_t *ids, const float *exp_scale,
                        int n_tok, int n_used, int dim, const float *shared, const float *gate, float *out) {
    for (int t = 0; t < n_tok; t++) {
        const float *yt = y + (size_t)t * n_used * dim, *wt = wts + (size_t)t * n_used;
        float *o = out + (size_t)t * dim;
        for (int k = 0; k < n_used; k++) {
            const float *yk = yt + (size_t)k * dim;
            const float s = exp_scale ? exp_scale[ids[(size_t)t * n_used + k]] : 1.0f;
            for (int i = 0; i < dim; i++) {
                const float v = (exp_scale ? yk[i] * s : yk[i]) * wt[k];
                o[i] = k ? o[i] + v : v;
            }
        }
        if (!shared) continue;
        float g;
        cpu(be)->ops->sigmoid(gate + t, &g, 1);
        const float *sh = shared + (size_t)t * dim;
        for (int i = 0; i < dim; i++) o[i] += sh[i] * g;
    }
}

/* ---- rope and attention ------------------------------------------------------------ */

static void cpu_rope_neox(struct backend *be, float *x, int n_tok, int tok_stride, int n_head,
                          int head_stride, int n_rot, const int32_t *pos, float base, const float *freqs) {
    /* angles by repeated multiplication, as llama.cpp computes them */
    const float theta_scale = powf(base, -2.0f / (float)n_rot);
    const int half = n_rot / 2;
    float cs[512], sn[512];
    for (int t = 0; t < n_tok; t++) {
        float theta = (float)pos[t];
        for (int d = 0; d < half; d++) {
            const float th = freqs ? theta / freqs[d] : theta;
            cs[d] = cosf(th);
            sn[d] = sinf(th);
            theta *= theta_scale;
        }
        for (int h = 0; h < n_head; h++) {
            float *v = x + (size_t)t * tok_stride + (size_t)h * head_stride;
            for (int d = 0; d < half; d++) {
                float a = v[d], b = v[d + half];
                v[d] = a * cs[d] - b * sn[d];
                v[d + half] = a * sn[d] + b * cs[d];
            }
        }
    }
}

static void cpu_kv_store(struct backend *be, const float *k, int k_stride, const float *v, int v_stride,
                         int n_tok, const int32_t *cells, const struct kv_view *kv);

static void cpu_attn_prep(struct backend *be, const struct attn_prep_in *in, int n_tok, const int32_t *pos,
                          const int32_t *cells, const struct kv_view *kv) {
    const int n_head_kv = kv->n_head_kv, head_dim = kv->head_dim, n_head = in->n_head, n_rot = in->n_rot;
    float *q = in->q, *k = in->k, *v = in->v;
    const int q_stride = in->q_stride, q_head_stride = in->q_head_stride, k_stride = in->k_stride;
    const float eps = in->eps;
    if (k && in->v_from_k)
        for (int t = 0; t < n_tok; t++)
            memcpy(v + (size_t)t * in->v_stride, k + (size_t)t * k_stride, sizeof(float) * (size_t)n_head_kv * head_dim);
    /* per token, its heads as rmsnorm rows q_head_stride (k: head_dim) apart */
    for (int t = 0; t < n_tok; t++)
        cpu_rmsnorm(be, q + (size_t)t * q_stride, q_head_stride, in->q_norm, n_head, head_dim, eps,
                    q + (size_t)t * q_stride, q_head_stride);
    cpu_rope_neox(be, q, n_tok, q_stride, n_head, q_head_stride, n_rot, pos, in->rope_base, in->rope_freqs);
    if (!k) return;
    for (int t = 0; t < n_tok; t++)
        cpu_rmsnorm(be, k + (size_t)t * k_stride, head_dim, in->k_norm, n_head_kv, head_dim, eps, k + (size_t)t * k_stride,
                    head_dim);
    cpu_rope_neox(be, k, n_tok, k_stride, n_head_kv, head_dim, n_rot, pos, in->rope_base, in->rope_freqs);
    if (in->v_norm)
        for (int t = 0; t < n_tok; t++)
            cpu_rmsnorm(be, v + (size_t)t * in->v_stride, head_dim, in->v_norm, n_head_kv, head_dim, eps,
                        v + (size_t)t * in->v_stride, head_dim);
    cpu_kv_store(be, k, k_stride, v, in->v_stride, n_tok, cells, kv);
    if (in->cells2) cpu_kv_store(be, k, k_stride, v, in->v_stride, n_tok, in->cells2, kv);
}

/* One cache row of type t from x: every CPU level writes the reference's bytes (quant.h's
 * from_float contract), so a row does not depend on the path that stored it. */
static void kv_row_store(struct backend *be, enum ggml_type t, const float *x, void *y, int n) {
    const struct cpu_ctx *c = cpu(be);
    if (t == GGML_TYPE_F16) c->ops->to_f16(x, y, n);
    else if (c->have_kernels[t] && c->kernels[t].vec_dot_type == t) c->kernels[t].from_float(x, y, n);
    else quant_quantize_row_ref(t, x, y, n);
}

static void cpu_kv_store(struct backend *be, const float *k, int k_stride, const float *v, int v_stride,
                         int n_tok, const int32_t *cells, const struct kv_view *kv) {
    const int n_kv_dim = kv->n_head_kv * kv->head_dim;
    for (int t = 0; t < n_tok; t++) {
        kv_row_store(be, kv->k_type, k + (size_t)t * k_stride, (uint8_t *)kv->k + (size_t)cells[t] * kv->k_row_bytes, n_kv_dim);
        kv_row_store(be, kv->v_type, v + (size_t)t * v_stride, (uint8_t *)kv->v + (size_t)cells[t] * kv->v_row_bytes, n_kv_dim);
    }
}

struct attn_task { struct attn_job a; const struct cpu_ops *ops; };

/* Work items: groups of consecutive tokens (as many as fill a pass of the kernel with their
 * query heads) x KV heads, round-robin over the threads. */
static void attn_worker(void *arg, int ith, int nth) {
    const struct attn_task *j = arg;
    const int per = COTI_MAX(1, ATTN_PAIRS_PER_PASS / (j->a.n_head / j->a.n_head_kv));
    const int groups = (j->a.n_tok + per - 1) / per, total = groups * j->a.n_head_kv;
    for (int i = ith; i < total; i += nth) {
        const int t0 = (i / j->a.n_head_kv) * per;
        j->ops->attn_tokens(&j->a, t0, COTI_MIN(per, j->a.n_tok - t0), i % j->a.n_head_kv);
    }
}

static void cpu_attention(struct backend *be, const float *q, int q_stride, int q_head_stride,
                          const struct kv_view *kv, const int32_t *cell0, const int32_t *n_ctx, int n_tok,
                          int n_head, float scale, float *out) {
    struct attn_task j = {{q, q_stride, q_head_stride, kv->k, kv->v, kv->k_type, kv->v_type, kv->k_row_bytes,
                           kv->v_row_bytes, ggml_row_size(kv->k_type, kv->head_dim), ggml_row_size(kv->v_type, kv->head_dim),
                           cell0, n_ctx, n_tok, n_head, kv->n_head_kv, kv->head_dim, scale, out},
                          cpu(be)->ops};
    if (kv->head_dim > CPU_ATTN_MAX_HEAD_DIM) abort(); /* model loading rejects such files */
    threadpool_run(cpu(be)->tp, attn_worker, &j);
}

/* ---- delta net ---------------------------------------------------------------------- */

static void cpu_ssm_conv(struct backend *be, const float *x, int n_ch, int k, const float *w, float *y,
                         const struct state_set *st, const struct state_run *runs, int n_runs) {
    const int ks = k - 1;
    for (int r = 0; r < n_runs; r++) {
        const struct state_run *ru = &runs[r];
        const struct run_states rs = state_set_run(st, ru);
        float *state = rs.state;
        for (int t = 0; t < ru->len; t++) {
            const float *xt = x + (size_t)(ru->start + t) * n_ch;
            float *yt = y + (size_t)(ru->start + t) * n_ch;
            if (k == 4) cpu(be)->ops->conv4_token(xt, n_ch, w, state, yt);
            else for (int c = 0; c < n_ch; c++) {
                float *win = state + (size_t)c * ks; /* the channel's last ks inputs */
                const float *wc = w + (size_t)c * k;
                float s = 0.0f;
                for (int i = 0; i < ks; i++) s += wc[i] * win[i];
                s += wc[ks] * xt[c];
                for (int i = 0; i + 1 < ks; i++) win[i] = win[i + 1];
                if (ks > 0) win[ks - 1] = xt[c];
                yt[c] = s;
            }
            cpu(be)->ops->silu(yt, yt, n_ch);
            if (rs.snap && t < ru->n_snap) memcpy(rs.snap + (size_t)t * n_ch * ks, state, sizeof(float) * (size_t)n_ch * ks);
        }
    }
}

/* The gates of the runs' rows, g then beta ([row][h] each, rows up to the last run's end),
 * into the context's scratch. */
static const float *gdn_form_gates(struct cpu_ctx *c, const struct gdn_gates *gt, int n_v, const struct state_run *runs,
                                   int n_runs, size_t *n_rows) {
    int end = 0;
    for (int r = 0; r < n_runs; r++) end = COTI_MAX(end, runs[r].start + runs[r].len);
    const size_t n = (size_t)end * n_v;
    *n_rows = (size_t)end;
    if (2 * n > c->gates_n || !c->gates) { /* allocated even for no rows: the callers offset it */
        free(c->gates);
        c->gates = malloc(sizeof(float) * COTI_MAX(2 * n, 2));
        if (!c->gates) abort(); /* resource failure at warm-up */
        c->gates_n = 2 * n;
    }
    float *g = c->gates, *beta = c->gates + n;
    for (int r = 0; r < n_runs; r++)
        for (int t = runs[r].start; t < runs[r].start + runs[r].len; t++)
            for (int h = 0; h < n_v; h++) {
                float av = gt->a[(size_t)t * gt->a_stride + h] + gt->dt_bias[h];
                float sp = av > 20.0f ? av : log1pf(expf(av));
                g[(size_t)t * n_v + h] = sp * gt->ssm_a[h];
                beta[(size_t)t * n_v + h] = 1.0f / (1.0f + expf(-gt->b[(size_t)t * gt->b_stride + h]));
            }
    return g;
}

/* Runs per thread-pool dispatch: the workers take (run, head) pairs of that many runs. */
#define CPU_GDN_RUNS 16

struct gdn_task { struct gdn_job g[CPU_GDN_RUNS]; int n_jobs; bool chunked; struct cpu_ctx *c; };

static void gdn_worker(void *arg, int ith, int nth) {
    const struct gdn_task *j = arg;
    const int nv = j->g[0].nv;
    for (int i = ith; i < j->n_jobs * nv; i += nth) {
        if (j->chunked) j->c->ops->gdn_chunked_head(&j->g[i / nv], i % nv, &j->c->chunk_scratch[ith]);
        else j->c->ops->gdn_head(&j->g[i / nv], i % nv);
    }
}

static void gdn_runs(struct backend *be, const float *qkv, int qkv_stride, const struct gdn_gates *gates, int nk,
                     int nv, int dk, int dv, float eps, float *out, const struct state_set *st,
                     const struct state_run *runs, int n_runs, bool chunked) {
    if (dk > CPU_GDN_MAX_DIM || (chunked && dv > CPU_GDN_MAX_DIM)) abort(); /* model loading rejects such files */
    if (n_runs < 1) return;
    size_t n_rows;
    const float *g = gdn_form_gates(cpu(be), gates, nv, runs, n_runs, &n_rows), *beta = g + n_rows * nv;
    struct gdn_task j = {.chunked = chunked, .c = cpu(be)};
    for (int r0 = 0; r0 < n_runs; r0 += CPU_GDN_RUNS) {
        j.n_jobs = COTI_MIN(CPU_GDN_RUNS, n_runs - r0);
        for (int i = 0; i < j.n_jobs; i++) {
            const struct state_run *ru = &runs[r0 + i];
            if (ru->defer && !st->pend) abort(); /* a caller bug: a deferred row needs its record */
            const struct run_states rs = state_set_run(st, ru);
            const size_t t0 = (size_t)ru->start;
            j.g[i] = (struct gdn_job){qkv + t0 * qkv_stride, qkv_stride, g + t0 * nv, beta + t0 * nv, rs.state, ru->len,
                                      nk, nv, dk, dv, eps, out + t0 * nv * dv, chunked ? NULL : rs.snap,
                                      chunked || !rs.snap ? 0 : ru->n_snap, rs.pend, ru->defer && !chunked};
        }
        threadpool_run(cpu(be)->tp, gdn_worker, &j);
    }
}

static void cpu_gdn(struct backend *be, const float *qkv, int qkv_stride, const struct gdn_gates *gates, int nk, int nv,
                    int dk, int dv, float eps, float *out, const struct state_set *st, const struct state_run *runs,
                    int n_runs) {
    gdn_runs(be, qkv, qkv_stride, gates, nk, nv, dk, dv, eps, out, st, runs, n_runs, false);
}

static void cpu_gdn_chunked(struct backend *be, const float *qkv, int qkv_stride, const struct gdn_gates *gates, int nk,
                            int nv, int dk, int dv, float eps, float *out, const struct state_set *st,
                            const struct state_run *runs, int n_runs) {
    gdn_runs(be, qkv, qkv_stride, gates, nk, nv, dk, dv, eps, out, st, runs, n_runs, true);
}

static void cpu_argmax(struct backend *be, const float *x, int n_rows, int n, int32_t *out, float *p_max) {
    for (int r = 0; r < n_rows; r++) {
        const float *xr = x + (size_t)r * n;
        int best = cpu(be)->ops->argmax(xr, n);
        out[r] = best;
        if (p_max) p_max[r] = (float)(1.0 / cpu(be)->ops->exp_sum(xr, n, xr[best]));
    }
}

static void cpu_accept_greedy(struct backend *be, const int32_t *draft, const int32_t *target, int n_draft,
                              int32_t *out) {
    int a = 0;
    while (a < n_draft && draft[a] == target[a]) a++;
    out[0] = a;
    memcpy(out + 1, target, sizeof(int32_t) * (size_t)(n_draft + 1));
}

/* ops have finished when they return, so the host clock is the device's */
static void cpu_mark(struct backend *be, int i) { cpu(be)->marks_us[i] = coti_time_us(); }

static double cpu_mark_elapsed_us(struct backend *be, int from, int to) {
    return (double)(cpu(be)->marks_us[to] - cpu(be)->marks_us[from]);
}

static void cpu_destroy(struct backend *be) {
    struct cpu_ctx *c = cpu(be);
    threadpool_free(c->tp);
    free(c->xconv);
    free(c->chunk_scratch);
    free(c->gates);
    free(c->moe);
    free(c);
    free(be);
}

struct backend *backend_cpu_init(int n_threads, enum quant_cpu_level level) {
    struct backend *be = calloc(1, sizeof(*be));
    struct cpu_ctx *c = calloc(1, sizeof(*c));
    if (!be || !c) { free(be); free(c); return NULL; }
    c->tp = threadpool_init(n_threads);
    c->chunk_scratch = malloc(sizeof(struct gdn_chunk_scratch) * (size_t)(n_threads < 1 ? 1 : n_threads));
    if (!c->tp || !c->chunk_scratch) { threadpool_free(c->tp); free(c->chunk_scratch); free(be); free(c); return NULL; }
    c->level = level;
    c->ops = cpu_ops_for_level(level);
    for (int t = 0; t < GGML_TYPE_COUNT; t++)
        c->have_kernels[t] = ggml_type_supported((enum ggml_type)t) &&
                             quant_kernels_get((enum ggml_type)t, level, &c->kernels[t]);
    be->name = "cpu";
    be->ctx = c;
    be->alloc = cpu_alloc;
    be->mem_available = cpu_mem_available;
    be->free = cpu_free;
    be->upload = cpu_memcpy;
    be->download = cpu_memcpy;
    be->copy_n = cpu_copy_n;
    be->copy_n_at = cpu_copy_n_at;
    be->gdn_pending = true;
    be->copy = cpu_memcpy;
    be->sync = cpu_sync;
    be->weight_init = cpu_weight_init;
    be->weight_free = cpu_weight_free;
    be->supports = cpu_supports;
#define BACKEND_OP(name, family, params, args) be->name = cpu_##name;
#include "backend_ops.h"
#undef BACKEND_OP
    be->mark = cpu_mark;
    be->mark_elapsed_us = cpu_mark_elapsed_us;
    be->destroy = cpu_destroy;
    return be;
}
