/* test_cuda_ops.c — every op of the CUDA backend against the CPU reference backend
 * (backend_cpu_init(1, QUANT_CPU_REF)) on seeded random inputs, plus a matvec bandwidth bench.
 * Standalone (not under tests/: CI has no GPU). Exit status 0 only if every case passes.
 *
 * Build: `make cuda` (build-cuda/test_cuda_ops, next to build-cuda/coti).
 * Run:
 *   build-cuda/test_cuda_ops [--seed N] [--only OP]     correctness; one line per case (OP: an op of
 *                                                       backend_ops.h, or memory, supports, copy_n,
 *                                                       copy_n_at, marks, graphs)
 *   build-cuda/test_cuda_ops --bench [--only formed|attention|matmul|prefill]  Q8_0 matvec GB/s against a D2D copy,
 *                                                       and the fused-input matmuls' µs per call
 *
 * Tolerances (each case prints its max abs / rel error and the bound):
 * - matmul: the GPU quantizes activations exactly as the CPU reference does and forms every
 *   block's integer sum and scale products identically; the matvec (<= 8 tokens) only changes
 *   the f32 order of the block sum, so |gpu - cpu| <= 2e-6 · Σ_i |w_i x_i| per output (f32
 *   reassociation of <= n/32 block terms: ~2e-7 seen, the worst case is n·2^-24). A row's
 *   output must be bit-identical whatever batch it came in; a prompt's rows (set_prompt) too,
 *   among batches of their family. A short prompt's rows of quantized types (and a long one's
 *   where the f16 K tiles do not divide the row) take the int8 tiles, which sum blocks in the
 *   reference's order: bit-exact against the CPU; a long prompt's others take the f16 tiles
 *   (test_matmul_prompt_f16's bound).
 * - get_rows, kv_store, add, ssm_conv state/snapshots: bit-exact (same f32/f16 operations; the
 *   q8_0 / q4_0 cache rows by quant.c's reference rules on both sides).
 * - rmsnorm: 4 ulp relative (Σx² reordered, in double on both sides).
 * - ops with expf/sinf/cosf (rmsnorm_gated, swiglu, mul_sigmoid, rope, ssm_conv output):
 *   CUDA's functions are within 2 ulp of glibc's, so 2e-6 relative (+1e-6·max|x|
 *   absolute for rope, whose outputs cancel).
 * - attention: q·k sums and the softmax merge are reordered; 1e-5 relative to max|v|, for
 *   every cache type (both sides convert a cached element to the same f32, d·code exactly).
 * - gdn / gdn_chunked: O(1) outputs after up to 70 steps of f32 rank-1 updates reordered
 *   (test_backend_ops.c bounds CPU f32 against f64 by 2e-5), the gates formed from raw inputs
 *   by expf / log1pf on both sides: 2e-5 absolute.
 * - argmax: the same index; p_max within 1e-6 relative (double sums on both sides).
 * - accept_greedy: bit-exact. mark: the time of 4 GiB of copies between two marks.
 * - moe_route: the same ids; weights 2e-6 relative. moe_sum: 2e-6 relative (expf's sigmoid).
 * - matmul_id: quantized experts: the inputs converted as the CPU does, exact integer sums,
 *   so the matvec's 2e-6·Σ|w x|; float experts: f32 inputs on the GPU where the CPU rounds
 *   them to f16 / bf16, so Σ|w|·amax(x)/127 more; a GLU's activation (expf / tanhf, ulps
 *   apart) may take the neighbouring Q8 code: two codes' worth, 2·max|w|·amax/127; a token
 *   alone equals its slots in a batch, bit for bit.
 * - graphs: a replay equals the op run eagerly, bit for bit.
 * Every op of backend_ops.h has an entry in op_tests (main fails for one without); the matmul's
 * cases run under the variant rules and then with each kernel variant forced
 * (backend_cuda_force_matvec), each checked against the CPU reference and seen to run. */
#include <cuda_runtime_api.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cuda/backend_cuda.h"

static struct backend *cpu, *gpu;
/* backend.h prompt families: a long prompt's (the f16 tiles) and a short one's (the int8 tiles) */
#define LONG_PROMPT gpu->prompt_family(gpu, 1 << 20)
#define SHORT_PROMPT gpu->prompt_family(gpu, 64)
static int n_pass, n_fail;
static const char *only;
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float frand(void) { /* uniform in [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}
static void reseed(uint64_t seed, int stream) {
    rng_state = (seed ^ (0xbf58476d1ce4e5b9ull * (uint64_t)(stream + 1))) | 1;
}
static void fill(float *x, size_t n, float scale) { for (size_t i = 0; i < n; i++) x[i] = frand() * scale; }
static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) { fprintf(stderr, "out of memory\n"); exit(2); }
    return p;
}
static bool want(const char *op) { return !only || strcmp(only, op) == 0; }
static int mv_forced = CUDA_MV_AUTO; /* the matmul variant the GPU backend is told to run */

/* device helpers */
static void *gdup(const void *h, size_t bytes) {
    void *d = gpu->alloc(gpu, bytes);
    if (!d) { fprintf(stderr, "cuda alloc of %zu bytes failed\n", bytes); exit(2); }
    gpu->upload(gpu, d, h, bytes);
    return d;
}
static void *galloc(size_t bytes) {
    void *d = gpu->alloc(gpu, bytes);
    if (!d) { fprintf(stderr, "cuda alloc of %zu bytes failed\n", bytes); exit(2); }
    return d;
}
static void gget(void *h, const void *d, size_t bytes) { gpu->download(gpu, h, d, bytes); }
static void gput(void *d, const void *h, size_t bytes) { gpu->upload(gpu, d, h, bytes); }

/* Element-wise: |got - ref| <= abs_tol + rel_tol·|ref|, NaN where the reference has NaN. */
static bool check(const char *op, const char *shape, const float *got, const float *ref, size_t n,
                  double abs_tol, double rel_tol) {
    double max_abs = 0, max_rel = 0;
    size_t bad = n;
    for (size_t i = 0; i < n; i++) {
        if (isnan(ref[i]) != isnan(got[i])) { bad = i; break; }
        if (isnan(ref[i])) continue;
        double d = fabs((double)got[i] - ref[i]);
        double r = d / fmax(fabs(ref[i]), 1e-30);
        if (d > max_abs) max_abs = d;
        if (r > max_rel && fabs(ref[i]) > 1e-30) max_rel = r;
        if (!(d <= abs_tol + rel_tol * fabs(ref[i])) && bad == n) bad = i;
    }
    bool ok = bad == n;
    printf("%-5s %-14s %-44s max_abs %.3e max_rel %.3e (tol abs %.1e rel %.1e)", ok ? "ok" : "FAIL", op, shape,
           max_abs, max_rel, abs_tol, rel_tol);
    if (!ok) printf("  first bad [%zu]: got %.9g want %.9g", bad, got[bad], ref[bad]);
    printf("\n");
    ok ? n_pass++ : n_fail++;
    return ok;
}

/* Bit equality (ints, f16 caches, float outputs that must not change). */
static bool check_bits(const char *op, const char *shape, const void *got, const void *ref, size_t bytes) {
    const unsigned char *a = got, *b = ref;
    size_t bad = bytes;
    for (size_t i = 0; i < bytes; i++) if (a[i] != b[i]) { bad = i; break; }
    bool ok = bad == bytes;
    printf("%-5s %-14s %-44s bit-exact%s", ok ? "ok" : "FAIL", op, shape, ok ? "" : " MISMATCH");
    if (!ok) printf(" at byte %zu", bad);
    printf("\n");
    ok ? n_pass++ : n_fail++;
    return ok;
}

/* ---- matmul / get_rows ----------------------------------------------------------------- */

/* The matmul op with each input kind, in the shape of the separate ops that form the input. */
static void matmul1(struct backend *be, const struct bweight *w, const float *x, int n_tok, float *y) {
    backend_matmul(be, w, &(struct matmul_in){.kind = MATMUL_PLAIN, .x = x}, n_tok, y);
}
/* matmul1 on the GPU as the rows of a prompt of that kernel family (backend.h set_prompt) */
static void prompt_matmul1(int family, const struct bweight *w, const float *x, int n_tok, float *y) {
    gpu->set_prompt(gpu, family);
    matmul1(gpu, w, x, n_tok, y);
    gpu->set_prompt(gpu, 0);
}
static void matmul_n(struct backend *be, const struct bweight *const *ws, float *const *ys, int n_w, const float *x,
                     int n_tok) {
    be->matmul(be, ws, ys, n_w, &(struct matmul_in){.kind = MATMUL_PLAIN, .x = x}, n_tok);
}
static void norm_matmul_n(struct backend *be, const float *x, const float *m, float *x_out, const float *w, float eps,
                          float *a, const struct bweight *const *ws, float *const *ys, int n_w, int n_tok) {
    be->matmul(be, ws, ys, n_w,
               &(struct matmul_in){.kind = MATMUL_RMSNORM, .x = x, .m = m, .x_out = x_out, .w = w, .eps = eps, .a = a},
               n_tok);
}
static void swiglu_matmul(struct backend *be, const struct bweight *w, float *g, const float *u, int n_tok, float *y) {
    backend_matmul(be, w, &(struct matmul_in){.kind = MATMUL_SWIGLU, .x = g, .m = u, .a = g}, n_tok, y);
}
static void rmsnorm_gated_matmul(struct backend *be, const float *x, const float *w, const float *z, int dim, float eps,
                                 float *a, const struct bweight *wt, int n_tok, float *y) {
    backend_matmul(be, wt,
                   &(struct matmul_in){.kind = MATMUL_GATED_NORM, .x = x, .m = z, .w = w, .dim = dim, .eps = eps, .a = a},
                   n_tok, y);
}
static void norm2_matmul(struct backend *be, const float *x1, const float *w1, const float *x2, const float *w2, int dim,
                         float eps, float *a, const struct bweight *wt, int n_tok, float *y) {
    backend_matmul(be, wt,
                   &(struct matmul_in){.kind = MATMUL_NORM2, .x = x1, .m = x2, .w = w1, .w2 = w2, .dim = dim,
                                       .eps = eps, .a = a},
                   n_tok, y);
}
static void mul_sigmoid_matmul(struct backend *be, float *x, const float *gate, int n_head, int dim, int gate_stride,
                               int gate_head_stride, const struct bweight *wt, int n_tok, float *y) {
    (void)n_head; /* n_in / dim */
    backend_matmul(be, wt,
                   &(struct matmul_in){.kind = MATMUL_SIGMOID_GATE, .x = x, .m = gate, .dim = dim,
                                       .gate_stride = gate_stride, .gate_head_stride = gate_head_stride, .a = x},
                   n_tok, y);
}

static const enum ggml_type mm_types[] = {
    GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1,
    GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K,
};

struct hweight {
    enum ggml_type type;
    int n_in, n_out;
    size_t rb;
    void *data;      /* host, GGUF layout */
    float *deq;      /* dequantized, for the error scale */
};

static struct hweight make_weight(enum ggml_type t, int n_in, int n_out) {
    struct hweight w = {t, n_in, n_out, ggml_row_size(t, n_in), NULL, NULL};
    float *row = xmalloc(sizeof(float) * n_in);
    w.data = xmalloc(w.rb * n_out);
    w.deq = xmalloc(sizeof(float) * (size_t)n_in * n_out);
    for (int o = 0; o < n_out; o++) {
        float rs = 0.25f + 0.75f * fabsf(frand()); /* rows of different magnitude */
        for (int i = 0; i < n_in; i++) row[i] = frand() * rs;
        quant_quantize_row_ref(t, row, (char *)w.data + (size_t)o * w.rb, n_in);
        quant_dequantize_row_ref(t, (char *)w.data + (size_t)o * w.rb, w.deq + (size_t)o * n_in, n_in);
    }
    free(row);
    return w;
}
static void free_hweight(struct hweight *w) { free(w->data); free(w->deq); }

/* Σ_i |w_oi x_ti| for every output: the scale of f32 reassociation error. */
static void dot_scale(const struct hweight *w, const float *x, int n_tok, float *scale) {
    for (int t = 0; t < n_tok; t++)
        for (int o = 0; o < w->n_out; o++) {
            double s = 0;
            for (int i = 0; i < w->n_in; i++) s += fabs((double)w->deq[(size_t)o * w->n_in + i] * x[(size_t)t * w->n_in + i]);
            scale[(size_t)t * w->n_out + o] = (float)s;
        }
}

/* |got - ref| <= k·S (+ allow[i] where allow is given: a bound of its own kind, counted apart) */
static bool check_scaled_allow(const char *op, const char *shape, const float *got, const float *ref,
                               const float *scale, const double *allow, size_t n, double k) {
    double max_abs = 0, max_ratio = 0;
    size_t bad = n, past = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (isnan(got[i]) || isnan(ref[i])) d = INFINITY;
        if (d > max_abs) max_abs = d;
        double r = d / fmax(scale[i], 1e-30);
        if (r > max_ratio) max_ratio = r;
        const double tol = k * scale[i] + 1e-30;
        past += d > tol;
        if (!(d <= tol + (allow ? allow[i] : 0.0)) && bad == n) bad = i;
    }
    bool ok = bad == n;
    printf("%-5s %-14s %-44s max_abs %.3e max |d|/S %.3e (tol %.1e·S, S = Σ|w·x|)", ok ? "ok" : "FAIL", op, shape,
           max_abs, max_ratio, k);
    if (allow) printf(", %zu past it within the code-step allowance", past);
    if (!ok) printf("  first bad [%zu]: got %.9g want %.9g S %.3g", bad, got[bad], ref[bad], scale[bad]);
    printf("\n");
    ok ? n_pass++ : n_fail++;
    return ok;
}

static bool check_scaled(const char *op, const char *shape, const float *got, const float *ref, const float *scale,
                         size_t n, double k) {
    return check_scaled_allow(op, shape, got, ref, scale, NULL, n, k);
}

#define MM_TOL 2e-6
/* The f16 prompt matmul rounds each activation to f16 once (unit roundoff 2^-11) and each
 * weight value up to twice (a K-quant's scale product, then the value): a term is off by
 * ~3·2^-11 of |w x|, or of its unit's range where a min offset cancels (up to ~3x |w| for these
 * rows). Against the CPU, whose activations are Q8 (steps of max|x| / 127 a block, random in
 * sign), the distance adds that reference's own error. 2^-8 of S covers both; a wrong code or
 * scale moves an output by a large part of S. */
#define MMF_TOL (1.0 / 256.0)
static double mm_tol(void) { return mv_forced == CUDA_MV_F16 ? MMF_TOL : MM_TOL; }

/* Inputs formed with expf (swiglu, the gated norm's silu, the output gate's sigmoid) differ
 * from glibc's by up to 2 ulp, so a value at a rounding boundary can take the next Q8 code on
 * one side: the output then moves by |w| times one code step. In a 12288-wide row about one
 * such value is expected (12288 values x ~1e-5 chance each), and one step at a large weight is
 * about MM_TOL·S there. So these comparisons allow MM_FLIPS code steps at the row's largest
 * |w| and step (its max |x| / 127) on top of MM_TOL·S. */
#define MM_FLIPS 2
static bool check_scaled_flips(const char *op, const char *shape, const float *got, const float *ref, const float *scale,
                               const struct hweight *w, const float *x, int n_tok) {
    float *wmax = xmalloc(sizeof(float) * w->n_out);
    double *allow = xmalloc(sizeof(double) * (size_t)n_tok * w->n_out);
    for (int o = 0; o < w->n_out; o++) {
        wmax[o] = 0.0f;
        for (int i = 0; i < w->n_in; i++) wmax[o] = fmaxf(wmax[o], fabsf(w->deq[(size_t)o * w->n_in + i]));
    }
    for (int t = 0; t < n_tok; t++) {
        float xmax = 0.0f;
        for (int i = 0; i < w->n_in; i++) xmax = fmaxf(xmax, fabsf(x[(size_t)t * w->n_in + i]));
        for (int o = 0; o < w->n_out; o++) allow[(size_t)t * w->n_out + o] = MM_FLIPS * (double)wmax[o] * xmax / 127.0;
    }
    const bool ok = check_scaled_allow(op, shape, got, ref, scale, allow, (size_t)n_tok * w->n_out, mm_tol());
    free(wmax);
    free(allow);
    return ok;
}

static void test_matmul_type(enum ggml_type t, int n_in, int n_out) {
    /* 70 and 150: the prefill tiles 64 and 128 tokens wide, each with a partial tile */
    static const int toks[] = {1, 2, 3, 4, 5, 7, 8, 9, 17, 70, 150};
    const int max_tok = 150, ref_tok = 8;
    const char *tn = ggml_type_traits_get(t)->name;
    const bool quantized = ggml_type_traits_get(t)->block_elems > 1;
    struct hweight hw = make_weight(t, n_in, n_out);
    struct bweight wc = {0}, wg = {0};
    if (cpu->weight_init(cpu, &wc, t, n_in, n_out, hw.data) || gpu->weight_init(gpu, &wg, t, n_in, n_out, hw.data)) {
        printf("FAIL  matmul %s: weight_init refused\n", tn);
        n_fail++;
        free_hweight(&hw);
        return;
    }
    float *x = xmalloc(sizeof(float) * (size_t)max_tok * n_in);
    for (int tk = 0; tk < max_tok; tk++) fill(x + (size_t)tk * n_in, n_in, tk % 3 == 0 ? 3.0f : 0.7f);
    float *yc = xmalloc(sizeof(float) * (size_t)max_tok * n_out), *yg = xmalloc(sizeof(float) * (size_t)max_tok * n_out);
    float *yref = xmalloc(sizeof(float) * (size_t)max_tok * n_out), *scale = xmalloc(sizeof(float) * (size_t)max_tok * n_out);
    dot_scale(&hw, x, max_tok, scale);
    float *dx = gdup(x, sizeof(float) * (size_t)max_tok * n_in), *dy = galloc(sizeof(float) * (size_t)max_tok * n_out);
    /* decode and verify batches (<= 8 rows) must reproduce the 8-row batch's rows bit for bit */
    matmul1(gpu, &wg, dx, ref_tok, dy);
    gget(yref, dy, sizeof(float) * (size_t)ref_tok * n_out);
    /* a prompt's rows, however many, must reproduce the longest batch's rows of its family */
    const bool prompt_rows = quantized && mv_forced == CUDA_MV_AUTO;
    const int families[2] = {SHORT_PROMPT, LONG_PROMPT};
    float *yprompt[2];
    for (int f = 0; f < 2; f++) {
        yprompt[f] = xmalloc(sizeof(float) * (size_t)max_tok * n_out);
        if (!prompt_rows) continue;
        prompt_matmul1(families[f], &wg, dx, max_tok, dy);
        gget(yprompt[f], dy, sizeof(float) * (size_t)max_tok * n_out);
    }
    char shape[96];
    for (size_t k = 0; k < sizeof toks / sizeof toks[0]; k++) {
        int nt = toks[k];
        matmul1(cpu, &wc, x, nt, yc);
        matmul1(gpu, &wg, dx, nt, dy);
        gget(yg, dy, sizeof(float) * (size_t)nt * n_out);
        snprintf(shape, sizeof shape, "%s %dx%d tok %d", tn, n_in, n_out, nt);
        check_scaled("matmul", shape, yg, yc, scale, (size_t)nt * n_out, mm_tol());
        if (nt < ref_tok) check_bits("matmul-batch", shape, yg, yref, sizeof(float) * (size_t)nt * n_out);
        /* past 8 rows too, in any batch but a prompt's: a verify row = the decode row */
        if (nt > ref_tok && mv_forced == CUDA_MV_AUTO)
            check_bits("matmul-batch", shape, yg, yref, sizeof(float) * (size_t)ref_tok * n_out);
        /* the int8 tiles (a prompt's rows where the f16 K tiles do not divide the row, or
         * forced) sum every output's blocks in the CPU reference's order */
        if (quantized && mv_forced == CUDA_MV_TILES) check_bits("matmul-exact", shape, yg, yc, sizeof(float) * (size_t)nt * n_out);
        for (int f = 0; f < 2 && prompt_rows; f++) {
            const long tiles0 = backend_cuda_matvec_launches(gpu, CUDA_MV_TILES);
            prompt_matmul1(families[f], &wg, dx, nt, dy);
            gget(yg, dy, sizeof(float) * (size_t)nt * n_out);
            snprintf(shape, sizeof shape, "%s %dx%d tok %d prompt %s", tn, n_in, n_out, nt, f ? "long" : "short");
            check_bits("matmul-prompt-batch", shape, yg, yprompt[f], sizeof(float) * (size_t)nt * n_out);
            if (backend_cuda_matvec_launches(gpu, CUDA_MV_TILES) > tiles0)
                check_bits("matmul-exact", shape, yg, yc, sizeof(float) * (size_t)nt * n_out);
        }
    }
    for (int f = 0; f < 2 && prompt_rows; f++) { /* a prompt row from the middle of a batch, alone */
        prompt_matmul1(families[f], &wg, dx + (size_t)5 * n_in, 1, dy);
        gget(yg, dy, sizeof(float) * n_out);
        snprintf(shape, sizeof shape, "%s %dx%d prompt %s row 5 alone", tn, n_in, n_out, f ? "long" : "short");
        check_bits("matmul-prompt-batch", shape, yg, yprompt[f] + (size_t)5 * n_out, sizeof(float) * n_out);
    }
    for (int f = 0; f < 2; f++) free(yprompt[f]);
    /* a single row taken from the middle of the batch (x offset) */
    matmul1(gpu, &wg, dx + (size_t)5 * n_in, 1, dy);
    gget(yg, dy, sizeof(float) * n_out);
    snprintf(shape, sizeof shape, "%s %dx%d row 5 alone", tn, n_in, n_out);
    check_bits("matmul-batch", shape, yg, yref + (size_t)5 * n_out, sizeof(float) * n_out);

    gpu->free(gpu, dx); gpu->free(gpu, dy);
    cpu->weight_free(cpu, &wc);
    gpu->weight_free(gpu, &wg);
    free(x); free(yc); free(yg); free(yref); free(scale);
    free_hweight(&hw);
}

/* get_rows: exact dequantization */
static void test_get_rows_type(enum ggml_type t, int n_in, int n_out) {
    char shape[96];
    struct hweight hw = make_weight(t, n_in, n_out);
    struct bweight wc = {0}, wg = {0};
    if (cpu->weight_init(cpu, &wc, t, n_in, n_out, hw.data) || gpu->weight_init(gpu, &wg, t, n_in, n_out, hw.data)) {
        printf("FAIL  get_rows %s: weight_init refused\n", ggml_type_traits_get(t)->name);
        n_fail++;
        free_hweight(&hw);
        return;
    }
    int32_t ids[5] = {0, n_out - 1, n_out / 2, 0, n_out / 3};
    float *rc = xmalloc(sizeof(float) * 5 * n_in), *rg = xmalloc(sizeof(float) * 5 * n_in);
    int32_t *dids = gdup(ids, sizeof ids);
    float *dr = galloc(sizeof(float) * 5 * n_in);
    cpu->get_rows(cpu, &wc, ids, 5, rc);
    gpu->get_rows(gpu, &wg, dids, 5, dr);
    gget(rg, dr, sizeof(float) * 5 * n_in);
    snprintf(shape, sizeof shape, "%s %dx%d 5 ids", ggml_type_traits_get(t)->name, n_in, n_out);
    check_bits("get_rows", shape, rg, rc, sizeof(float) * 5 * n_in);
    gpu->free(gpu, dids); gpu->free(gpu, dr);
    cpu->weight_free(cpu, &wc);
    gpu->weight_free(gpu, &wg);
    free(rc); free(rg);
    free_hweight(&hw);
}

/* each(type, n_in, n_out) over every weight type at the shapes that matter for it */
static void for_weight_shapes(void (*each)(enum ggml_type, int, int)) {
    for (size_t i = 0; i < sizeof mm_types / sizeof mm_types[0]; i++) {
        enum ggml_type t = mm_types[i];
        int be = ggml_type_traits_get(t)->block_elems;
        if (be == 256) {
            each(t, 256, 37);
            each(t, 2304, 130);   /* 9 super-blocks: rows at every alignment */
        } else if (be == 32) {
            each(t, 384, 130);    /* the tiny model's width */
            each(t, 4096, 67);
            each(t, 96, 5);
        } else {
            each(t, 100, 37);     /* a partial 32-element unit, rows 8-byte aligned */
            each(t, 1024, 70);
            each(t, 33, 3);
        }
    }
    /* n_out not a multiple of the rows per block, n_in < 32 */
    each(GGML_TYPE_F32, 7, 1);
    /* wide rows whose quantized activations do not fit beside Q5_1's weight stages: 1-2 tokens
     * fall back to the unfused path instead of a launch over the shared-memory limit */
    each(GGML_TYPE_Q5_1, 20480, 9);
    /* wider than a matvec quantizes itself: converted rows, one token copied into shared memory */
    each(GGML_TYPE_Q8_0, 8192, 70);
    each(GGML_TYPE_Q4_K, 4608, 40);
}

/* Mixed types in one matmul_n (one conversion per vec_dot type, one launch per weight type). */
static void test_matmul_n(void) {
    const enum ggml_type ts[4] = {GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q8_0, GGML_TYPE_F16};
    const int n_outs[4] = {64, 33, 200, 9}, n_in = 512, n_tok = 5;
    struct hweight hw[4];
    struct bweight wc[4], wg[4];
    const struct bweight *pc[4], *pg[4];
    float *yc[4], *yg[4], *dy[4], *scale[4];
    float *x = xmalloc(sizeof(float) * n_tok * n_in);
    fill(x, (size_t)n_tok * n_in, 1.5f);
    float *dx = gdup(x, sizeof(float) * n_tok * n_in);
    for (int i = 0; i < 4; i++) {
        hw[i] = make_weight(ts[i], n_in, n_outs[i]);
        memset(&wc[i], 0, sizeof wc[i]);
        memset(&wg[i], 0, sizeof wg[i]);
        cpu->weight_init(cpu, &wc[i], ts[i], n_in, n_outs[i], hw[i].data);
        gpu->weight_init(gpu, &wg[i], ts[i], n_in, n_outs[i], hw[i].data);
        pc[i] = &wc[i];
        pg[i] = &wg[i];
        yc[i] = xmalloc(sizeof(float) * n_tok * n_outs[i]);
        yg[i] = xmalloc(sizeof(float) * n_tok * n_outs[i]);
        scale[i] = xmalloc(sizeof(float) * n_tok * n_outs[i]);
        dy[i] = galloc(sizeof(float) * n_tok * n_outs[i]);
        dot_scale(&hw[i], x, n_tok, scale[i]);
    }
    matmul_n(cpu, pc, yc, 4, x, n_tok);
    matmul_n(gpu, pg, dy, 4, dx, n_tok);
    for (int i = 0; i < 4; i++) {
        char shape[96];
        gget(yg[i], dy[i], sizeof(float) * n_tok * n_outs[i]);
        snprintf(shape, sizeof shape, "[%d] %s %dx%d tok %d", i, ggml_type_traits_get(ts[i])->name, n_in, n_outs[i], n_tok);
        check_scaled("matmul_n", shape, yg[i], yc[i], scale[i], (size_t)n_tok * n_outs[i], mm_tol());
        cpu->weight_free(cpu, &wc[i]);
        gpu->weight_free(gpu, &wg[i]);
        gpu->free(gpu, dy[i]);
        free(yc[i]); free(yg[i]); free(scale[i]);
        free_hweight(&hw[i]);
    }
    gpu->free(gpu, dx);
    free(x);
    /* an unsupported type is refused */
    struct bweight w = {0};
    static unsigned char q2k[4 * 84];
    int rc = gpu->weight_init(gpu, &w, GGML_TYPE_Q2_K, 256, 4, q2k);
    printf("%-5s %-14s %-44s rc %d\n", rc == COTI_E_UNSUPPORTED ? "ok" : "FAIL", "weight_init", "q2_K refused", rc);
    rc == COTI_E_UNSUPPORTED ? n_pass++ : n_fail++;
}

/* norm_matmul_n, swiglu_matmul, rmsnorm_gated_matmul, norm2_matmul and mul_sigmoid_matmul. 1-2 rows run fused
 * (the matvec forms its input itself) where narrow enough; 3+ rows, and wide rows, run a kernel
 * that forms the input (and for Q8 formats also writes its codes) and then the matmul: the two must quantize the same input, so
 * every row's outputs (and x_out, a) are bit-identical between the paths, as decode and verify
 * need; and both match the CPU's unfused ops. */
static void test_fused_matmul(enum ggml_type t, int n_in, int n_out) {
    enum { NT = 5 };
    const char *tn = ggml_type_traits_get(t)->name;
    const float eps = 1e-6f;
    struct hweight hw = make_weight(t, n_in, n_out);
    struct bweight wc = {0}, wg = {0};
    cpu->weight_init(cpu, &wc, t, n_in, n_out, hw.data);
    gpu->weight_init(gpu, &wg, t, n_in, n_out, hw.data);
    const struct bweight *pc = &wc, *pg = &wg;
    const size_t nx = (size_t)NT * n_in, ny = (size_t)NT * n_out;
    float *x = xmalloc(sizeof(float) * nx), *m = xmalloc(sizeof(float) * nx), *w = xmalloc(sizeof(float) * n_in);
    float *xo = xmalloc(sizeof(float) * nx), *a = xmalloc(sizeof(float) * nx), *yc = xmalloc(sizeof(float) * ny);
    float *scale = xmalloc(sizeof(float) * ny), *poison = xmalloc(sizeof(float) * nx);
    float *g5 = xmalloc(sizeof(float) * ny), *gx = xmalloc(sizeof(float) * nx), *ga = xmalloc(sizeof(float) * nx);
    float *gy = xmalloc(sizeof(float) * ny), *gxo = xmalloc(sizeof(float) * nx), *ga5 = xmalloc(sizeof(float) * nx);
    fill(x, nx, 3.0f);
    fill(m, nx, 1.0f);
    fill(poison, nx, 100.0f);
    for (int i = 0; i < n_in; i++) w[i] = 1.0f + 0.5f * frand();
    float *dx = gdup(x, sizeof(float) * nx), *dm = gdup(m, sizeof(float) * nx), *dw = gdup(w, sizeof(float) * n_in);
    float *dxo = galloc(sizeof(float) * nx), *da = galloc(sizeof(float) * nx), *dy = galloc(sizeof(float) * ny);
    char shape[96];
    for (int with_m = 1; with_m >= 0; with_m--) {
        const float *hm = with_m ? m : NULL, *gm = with_m ? dm : NULL;
        norm_matmul_n(cpu, x, hm, xo, w, eps, a, &pc, &yc, 1, NT);
        dot_scale(&hw, a, NT, scale);
        norm_matmul_n(gpu, dx, gm, dxo, dw, eps, da, &pg, &dy, 1, NT);
        gget(g5, dy, sizeof(float) * ny);
        gget(ga5, da, sizeof(float) * nx);
        snprintf(shape, sizeof shape, "%s %dx%d tok %d%s", tn, n_in, n_out, NT, with_m ? " +m" : "");
        check_scaled("norm_matmul", shape, g5, yc, scale, ny, mm_tol());
        check("norm_matmul a", shape, ga5, a, nx, 0, 4.8e-7);
        if (with_m) {
            gget(gxo, dxo, sizeof(float) * nx);
            check_bits("norm_matmul x+m", shape, gxo, xo, sizeof(float) * nx);
        }
        for (int nt = 1; nt <= 2; nt++) {
            gpu->upload(gpu, dxo, poison, sizeof(float) * nx);
            gpu->upload(gpu, da, poison, sizeof(float) * nx);
            norm_matmul_n(gpu, dx, gm, dxo, dw, eps, da, &pg, &dy, 1, nt);
            gget(gy, dy, sizeof(float) * (size_t)nt * n_out);
            gget(ga, da, sizeof(float) * (size_t)nt * n_in);
            snprintf(shape, sizeof shape, "%s %dx%d tok %d%s", tn, n_in, n_out, nt, with_m ? " +m" : "");
            check_bits("norm_matmul-batch", shape, gy, g5, sizeof(float) * (size_t)nt * n_out);
            check_bits("norm_matmul-a", shape, ga, ga5, sizeof(float) * (size_t)nt * n_in);
            if (with_m) {
                gget(gx, dxo, sizeof(float) * (size_t)nt * n_in);
                check_bits("norm_matmul-x+m", shape, gx, xo, sizeof(float) * (size_t)nt * n_in);
            }
        }
    }
    /* swiglu_matmul: g (x here) is clobbered, so it is uploaded before every call */
    memcpy(gx, x, sizeof(float) * nx);
    swiglu_matmul(cpu, &wc, gx, m, NT, yc); /* gx now holds silu(x) ⊙ m */
    dot_scale(&hw, gx, NT, scale);
    gpu->upload(gpu, dx, x, sizeof(float) * nx);
    swiglu_matmul(gpu, &wg, dx, dm, NT, dy);
    gget(g5, dy, sizeof(float) * ny);
    snprintf(shape, sizeof shape, "%s %dx%d tok %d", tn, n_in, n_out, NT);
    check_scaled_flips("swiglu_matmul", shape, g5, yc, scale, &hw, gx, NT);
    for (int nt = 1; nt <= 2; nt++) {
        gpu->upload(gpu, dx, x, sizeof(float) * nx);
        swiglu_matmul(gpu, &wg, dx, dm, nt, dy);
        gget(gy, dy, sizeof(float) * (size_t)nt * n_out);
        snprintf(shape, sizeof shape, "%s %dx%d tok %d", tn, n_in, n_out, nt);
        check_bits("swiglu_matmul-batch", shape, gy, g5, sizeof(float) * (size_t)nt * n_out);
    }
    /* rmsnorm_gated_matmul, groups of 128 with m as the gate (w's first 128 as the norm weight) */
    if (n_in % 128 == 0) {
        gpu->upload(gpu, dx, x, sizeof(float) * nx); /* swiglu_matmul clobbered it */
        rmsnorm_gated_matmul(cpu, x, w, m, 128, eps, a, &wc, NT, yc);
        dot_scale(&hw, a, NT, scale);
        rmsnorm_gated_matmul(gpu, dx, dw, dm, 128, eps, da, &wg, NT, dy);
        gget(g5, dy, sizeof(float) * ny);
        snprintf(shape, sizeof shape, "%s %dx%d tok %d", tn, n_in, n_out, NT);
        check_scaled_flips("rmsnorm_gated_matmul", shape, g5, yc, scale, &hw, a, NT);
        for (int nt = 1; nt <= 2; nt++) {
            rmsnorm_gated_matmul(gpu, dx, dw, dm, 128, eps, da, &wg, nt, dy);
            gget(gy, dy, sizeof(float) * (size_t)nt * n_out);
            snprintf(shape, sizeof shape, "%s %dx%d tok %d", tn, n_in, n_out, nt);
            check_bits("rmsnorm_gated_matmul-batch", shape, gy, g5, sizeof(float) * (size_t)nt * n_out);
        }
    }
    /* norm2_matmul: x and m as the two halves' sources (rows of n_in / 2), w's halves as the weights;
     * 1-4 rows run fused where narrow (the matvec forms both halves) and must equal the unfused
     * batch's rows */
    if (n_in % 64 == 0) {
        const int half = n_in / 2;
        gpu->upload(gpu, dx, x, sizeof(float) * nx);
        norm2_matmul(cpu, x, w, m, w + half, half, eps, a, &wc, NT, yc);
        dot_scale(&hw, a, NT, scale);
        norm2_matmul(gpu, dx, dw, dm, dw + half, half, eps, da, &wg, NT, dy);
        gget(g5, dy, sizeof(float) * ny);
        snprintf(shape, sizeof shape, "%s %dx%d tok %d", tn, n_in, n_out, NT);
        check_scaled("norm2_matmul", shape, g5, yc, scale, ny, mm_tol());
        for (int nt = 1; nt < NT; nt++) {
            norm2_matmul(gpu, dx, dw, dm, dw + half, half, eps, da, &wg, nt, dy);
            gget(gy, dy, sizeof(float) * (size_t)nt * n_out);
            snprintf(shape, sizeof shape, "%s %dx%d tok %d", tn, n_in, n_out, nt);
            check_bits("norm2_matmul-batch", shape, gy, g5, sizeof(float) * (size_t)nt * n_out);
        }
    }
    /* mul_sigmoid_matmul, heads of 64 with m as the gate at strides of its own; x is clobbered */
    if (n_in % 64 == 0) {
        const int nh = n_in / 64;
        memcpy(gx, x, sizeof(float) * nx);
        mul_sigmoid_matmul(cpu, gx, m, nh, 64, n_in, 64, &wc, NT, yc); /* gx now holds x ⊙ sigmoid(m) */
        dot_scale(&hw, gx, NT, scale);
        gpu->upload(gpu, dx, x, sizeof(float) * nx);
        mul_sigmoid_matmul(gpu, dx, dm, nh, 64, n_in, 64, &wg, NT, dy);
        gget(g5, dy, sizeof(float) * ny);
        snprintf(shape, sizeof shape, "%s %dx%d tok %d", tn, n_in, n_out, NT);
        check_scaled_flips("mul_sigmoid_matmul", shape, g5, yc, scale, &hw, gx, NT);
        for (int nt = 1; nt <= 2; nt++) {
            gpu->upload(gpu, dx, x, sizeof(float) * nx);
            mul_sigmoid_matmul(gpu, dx, dm, nh, 64, n_in, 64, &wg, nt, dy);
            gget(gy, dy, sizeof(float) * (size_t)nt * n_out);
            snprintf(shape, sizeof shape, "%s %dx%d tok %d", tn, n_in, n_out, nt);
            check_bits("mul_sigmoid_matmul-batch", shape, gy, g5, sizeof(float) * (size_t)nt * n_out);
        }
    }
    gpu->free(gpu, dx); gpu->free(gpu, dm); gpu->free(gpu, dw); gpu->free(gpu, dxo); gpu->free(gpu, da);
    gpu->free(gpu, dy);
    cpu->weight_free(cpu, &wc);
    gpu->weight_free(gpu, &wg);
    free(x); free(m); free(w); free(xo); free(a); free(yc); free(scale); free(poison); free(g5); free(gx);
    free(ga); free(gy); free(gxo); free(ga5);
    free_hweight(&hw);
}

/* copy_n: regions of mixed sizes and alignments (16-byte words and bytes), one launch group
 * past COPY_N_MAX; bytes between regions stay as they were. */
static void test_copy_n(int n) {
    const size_t total = 70000 * (size_t)n;
    unsigned char *h = xmalloc(total), *ref = xmalloc(total), *got = xmalloc(total);
    for (size_t i = 0; i < total; i++) h[i] = (unsigned char)(frand() * 255.0f);
    unsigned char *ds = gdup(h, total), *dd = galloc(total);
    memset(ref, 0, total);
    void **dst = xmalloc(sizeof(void *) * n);
    const void **src = xmalloc(sizeof(void *) * n);
    size_t *bytes = xmalloc(sizeof(size_t) * n);
    for (int i = 0; i < n; i++) {
        const size_t base = 70000 * (size_t)i, off = i % 3 == 0 ? 16 * (size_t)i % 256 : (size_t)(7 * i) % 64;
        bytes[i] = i % 2 ? 65536 : 12 + 13 * (size_t)i;
        dst[i] = dd + base + off;
        src[i] = ds + total - base - off - bytes[i];
        memcpy(ref + base + off, h + total - base - off - bytes[i], bytes[i]);
    }
    gpu->copy_n(gpu, dst, src, bytes, n);
    gget(got, dd, total);
    char shape[64];
    snprintf(shape, sizeof shape, "%d regions", n);
    check_bits("copy_n", shape, got, ref, total);
    gpu->free(gpu, ds); gpu->free(gpu, dd);
    free(h); free(ref); free(got); free(dst); free(src); free(bytes);
}

/* copy_n_at: each source offset by the count the device holds times its step; nothing copied
 * once the count reaches the limit. */
static void test_copy_n_at(int n, int32_t sel, int limit) {
    const size_t step = 4096, total = (size_t)n * 4 * step;
    unsigned char *h = xmalloc(total), *ref = xmalloc(total), *got = xmalloc(total);
    for (size_t i = 0; i < total; i++) h[i] = (unsigned char)(frand() * 255.0f);
    unsigned char *ds = gdup(h, total), *dd = gdup(h, total);
    memcpy(ref, h, total);
    void **dst = xmalloc(sizeof(void *) * n);
    const void **src = xmalloc(sizeof(void *) * n);
    size_t *bytes = xmalloc(sizeof(size_t) * n), *steps = xmalloc(sizeof(size_t) * n);
    for (int i = 0; i < n; i++) {
        bytes[i] = i % 2 ? 1000 + (size_t)i : step; /* words and bytes */
        steps[i] = step;
        dst[i] = dd + (size_t)i * 4 * step + 3 * step; /* the last of the region's four steps */
        src[i] = ds + (size_t)i * 4 * step;
        if (sel < limit) memcpy(ref + (size_t)i * 4 * step + 3 * step, h + (size_t)i * 4 * step + (size_t)sel * step, bytes[i]);
    }
    int32_t *dsel = gdup(&sel, sizeof sel);
    gpu->copy_n_at(gpu, dst, src, steps, bytes, n, dsel, limit);
    gget(got, dd, total);
    char shape[64];
    snprintf(shape, sizeof shape, "%d regions, sel %d of %d", n, sel, limit);
    check_bits("copy_n_at", shape, got, ref, total);
    gpu->free(gpu, ds); gpu->free(gpu, dd); gpu->free(gpu, dsel);
    free(h); free(ref); free(got); free(dst); free(src); free(bytes); free(steps);
}

/* ---- norms and elementwise ---------------------------------------------------------------- */

static void test_rmsnorm(int n_rows, int dim, int xs, int ys, bool in_place) {
    char shape[96];
    size_t nx = (size_t)n_rows * xs, ny = (size_t)n_rows * ys;
    float *x = xmalloc(sizeof(float) * nx), *w = xmalloc(sizeof(float) * dim);
    float *yc = xmalloc(sizeof(float) * (in_place ? nx : ny)), *yg = xmalloc(sizeof(float) * (in_place ? nx : ny));
    fill(x, nx, 2.0f);
    fill(yc, in_place ? nx : ny, 1.0f);
    for (int i = 0; i < dim; i++) w[i] = 1.0f + 0.5f * frand();
    float *dx = gdup(x, sizeof(float) * nx), *dw = gdup(w, sizeof(float) * dim);
    if (in_place) {
        memcpy(yc, x, sizeof(float) * nx);
        cpu->rmsnorm(cpu, yc, xs, w, n_rows, dim, 1e-6f, yc, xs);
        gpu->rmsnorm(gpu, dx, xs, dw, n_rows, dim, 1e-6f, dx, xs);
        gget(yg, dx, sizeof(float) * nx);
        ny = nx;
    } else {
        float *dy = gdup(yc, sizeof(float) * ny); /* untouched gaps keep their (nonzero) values */
        cpu->rmsnorm(cpu, x, xs, w, n_rows, dim, 1e-6f, yc, ys);
        gpu->rmsnorm(gpu, dx, xs, dw, n_rows, dim, 1e-6f, dy, ys);
        gget(yg, dy, sizeof(float) * ny);
        gpu->free(gpu, dy);
    }
    snprintf(shape, sizeof shape, "%d rows x %d, strides %d/%d%s", n_rows, dim, xs, ys, in_place ? " in place" : "");
    check("rmsnorm", shape, yg, yc, ny, 0, 4.8e-7);
    gpu->free(gpu, dx); gpu->free(gpu, dw);
    free(x); free(w); free(yc); free(yg);
}

/* x += m (bit-identical: one f32 add), then the norm of the sum */
static void test_add_rmsnorm(int n_rows, int dim) {
    char shape[96];
    const size_t n = (size_t)n_rows * dim;
    float *x = xmalloc(sizeof(float) * n), *m = xmalloc(sizeof(float) * n), *w = xmalloc(sizeof(float) * dim);
    float *yc = xmalloc(sizeof(float) * n), *yg = xmalloc(sizeof(float) * n), *xg = xmalloc(sizeof(float) * n);
    fill(x, n, 2.0f);
    fill(m, n, 1.0f);
    for (int i = 0; i < dim; i++) w[i] = 1.0f + 0.5f * frand();
    float *dx = gdup(x, sizeof(float) * n), *dm = gdup(m, sizeof(float) * n), *dw = gdup(w, sizeof(float) * dim);
    float *dy = gdup(yc, sizeof(float) * n);
    cpu->add_rmsnorm(cpu, x, m, w, n_rows, dim, 1e-6f, yc);
    gpu->add_rmsnorm(gpu, dx, dm, dw, n_rows, dim, 1e-6f, dy);
    gget(xg, dx, sizeof(float) * n);
    gget(yg, dy, sizeof(float) * n);
    snprintf(shape, sizeof shape, "%d rows x %d", n_rows, dim);
    check_bits("add_rmsnorm sum", shape, xg, x, sizeof(float) * n);
    check("add_rmsnorm", shape, yg, yc, n, 0, 4.8e-7);
    gpu->free(gpu, dx); gpu->free(gpu, dm); gpu->free(gpu, dw); gpu->free(gpu, dy);
    free(x); free(m); free(w); free(yc); free(yg); free(xg);
}

/* x = (x + rmsnorm(y) ⊙ w) · s: the norm's 4.8e-7 relative, on normed terms up to ~5 wide (|y|
 * sc ≤ ~3, w ≤ 1.5), is an absolute error after the add (which may cancel), then two roundings */
static void test_rmsnorm_add(int n_rows, int dim, float s) {
    char shape[96];
    const size_t n = (size_t)n_rows * dim;
    float *x = xmalloc(sizeof(float) * n), *y = xmalloc(sizeof(float) * n), *w = xmalloc(sizeof(float) * dim);
    float *xg = xmalloc(sizeof(float) * n);
    fill(x, n, 2.0f);
    fill(y, n, 1.0f);
    for (int i = 0; i < dim; i++) w[i] = 1.0f + 0.5f * frand();
    float *dx = gdup(x, sizeof(float) * n), *dy = gdup(y, sizeof(float) * n), *dw = gdup(w, sizeof(float) * dim);
    cpu->rmsnorm_add(cpu, x, y, w, n_rows, dim, 1e-6f, s);
    gpu->rmsnorm_add(gpu, dx, dy, dw, n_rows, dim, 1e-6f, s);
    gget(xg, dx, sizeof(float) * n);
    snprintf(shape, sizeof shape, "%d rows x %d, scale %g", n_rows, dim, s);
    check("rmsnorm_add", shape, xg, x, n, 4e-6, 1e-6);
    gpu->free(gpu, dx); gpu->free(gpu, dy); gpu->free(gpu, dw);
    free(x); free(y); free(w); free(xg);
}

static void test_rmsnorm_gated(int n_rows, int dim) {
    char shape[96];
    size_t n = (size_t)n_rows * dim;
    float *x = xmalloc(sizeof(float) * n), *z = xmalloc(sizeof(float) * n), *w = xmalloc(sizeof(float) * dim);
    float *yc = xmalloc(sizeof(float) * n), *yg = xmalloc(sizeof(float) * n);
    fill(x, n, 2.0f);
    fill(z, n, 4.0f);
    for (int i = 0; i < dim; i++) w[i] = 1.0f + 0.5f * frand();
    float *dx = gdup(x, sizeof(float) * n), *dz = gdup(z, sizeof(float) * n), *dw = gdup(w, sizeof(float) * dim);
    float *dy = galloc(sizeof(float) * n);
    cpu->rmsnorm_gated(cpu, x, w, z, n_rows, dim, 1e-6f, yc);
    gpu->rmsnorm_gated(gpu, dx, dw, dz, n_rows, dim, 1e-6f, dy);
    gget(yg, dy, sizeof(float) * n);
    snprintf(shape, sizeof shape, "%d rows x %d", n_rows, dim);
    check("rmsnorm_gated", shape, yg, yc, n, 1e-30, 2e-6);
    gpu->free(gpu, dx); gpu->free(gpu, dz); gpu->free(gpu, dw); gpu->free(gpu, dy);
    free(x); free(z); free(w); free(yc); free(yg);
}

static void test_elementwise(int64_t n, bool swiglu) {
    char shape[96];
    float *a = xmalloc(sizeof(float) * n), *b = xmalloc(sizeof(float) * n);
    float *yc = xmalloc(sizeof(float) * n), *yg = xmalloc(sizeof(float) * n);
    fill(a, n, 6.0f);
    fill(b, n, 2.0f);
    float *da = gdup(a, sizeof(float) * n), *db = gdup(b, sizeof(float) * n), *dy = galloc(sizeof(float) * n);
    snprintf(shape, sizeof shape, "n %lld", (long long)n);
    if (!swiglu) {
        cpu->add(cpu, a, b, n, yc);
        gpu->add(gpu, da, db, n, dy);
        gget(yg, dy, sizeof(float) * n);
        check_bits("add", shape, yg, yc, sizeof(float) * n);
    } else {
        cpu->swiglu(cpu, a, b, n, yc);
        gpu->swiglu(gpu, da, db, n, dy);
        gget(yg, dy, sizeof(float) * n);
        check("swiglu", shape, yg, yc, n, 1e-30, 2e-6);
        /* in place, as the model calls it: y = g */
        memcpy(yc, a, sizeof(float) * n);
        cpu->swiglu(cpu, yc, b, n, yc);
        gpu->swiglu(gpu, da, db, n, da);
        gget(yg, da, sizeof(float) * n);
        check("swiglu", "in place", yg, yc, n, 1e-30, 2e-6);
    }
    gpu->free(gpu, da); gpu->free(gpu, db); gpu->free(gpu, dy);
    free(a); free(b); free(yc); free(yg);
}

/* gemma4's elementwise ops: the device's tanhf forms against the CPU's sigmoid forms (the same
 * functions; near 0 the forms differ by ~1e-7 absolute: 1 - tanh cancels in one, 2σ - 1 in the
 * other), scale bit for bit. */
static void test_gemma_elementwise(int64_t n) {
    char shape[96];
    float *a = xmalloc(sizeof(float) * n), *b = xmalloc(sizeof(float) * n);
    float *yc = xmalloc(sizeof(float) * n), *yg = xmalloc(sizeof(float) * n);
    fill(a, n, 6.0f);
    fill(b, n, 2.0f);
    float *da = gdup(a, sizeof(float) * n), *db = gdup(b, sizeof(float) * n), *dy = galloc(sizeof(float) * n);
    snprintf(shape, sizeof shape, "n %lld", (long long)n);
    cpu->geglu(cpu, a, b, n, yc);
    gpu->geglu(gpu, da, db, n, dy);
    gget(yg, dy, sizeof(float) * n);
    /* both round gelu to f16 (llama.cpp's CPU table): a tanhf / sigmoid difference at a rounding
     * boundary moves a value by one f16 step, 2^-10 relative */
    check("geglu", shape, yg, yc, n, 1e-5, 1.5e-3);
    for (int64_t i = 0; i < n; i++) a[i] *= 10.0f; /* logits-sized values for the cap */
    gpu->upload(gpu, da, a, sizeof(float) * n);
    cpu->softcap(cpu, a, n, 30.0f);
    gpu->softcap(gpu, da, n, 30.0f);
    gget(yg, da, sizeof(float) * n);
    check("softcap", shape, yg, a, n, 1e-5, 4e-6);
    cpu->scale(cpu, b, n, 16.0f);
    gpu->scale(gpu, db, n, 16.0f);
    gget(yg, db, sizeof(float) * n);
    check_bits("scale", shape, yg, b, sizeof(float) * n);
    gpu->free(gpu, da); gpu->free(gpu, db); gpu->free(gpu, dy);
    free(a); free(b); free(yc); free(yg);
}

static void test_mul_sigmoid(int n_tok, int n_head, int dim) {
    char shape[96];
    const int gs = 2 * n_head * dim, ghs = 2 * dim; /* the gate interleaved with q, as qwen35 does */
    size_t nx = (size_t)n_tok * n_head * dim, ng = (size_t)n_tok * gs;
    float *x = xmalloc(sizeof(float) * nx), *g = xmalloc(sizeof(float) * ng), *yg = xmalloc(sizeof(float) * nx);
    fill(x, nx, 3.0f);
    fill(g, ng, 5.0f);
    float *dx = gdup(x, sizeof(float) * nx), *dg = gdup(g, sizeof(float) * ng);
    cpu->mul_sigmoid(cpu, x, g + dim, n_tok, n_head, dim, gs, ghs);
    gpu->mul_sigmoid(gpu, dx, dg + dim, n_tok, n_head, dim, gs, ghs);
    gget(yg, dx, sizeof(float) * nx);
    snprintf(shape, sizeof shape, "%d tok x %d heads x %d", n_tok, n_head, dim);
    check("mul_sigmoid", shape, yg, x, nx, 1e-30, 2e-6);
    gpu->free(gpu, dx); gpu->free(gpu, dg);
    free(x); free(g); free(yg);
}

/* ---- rope, kv store, attention ------------------------------------------------------------- */

static void test_rope(int n_tok, int n_head, int head_dim, int n_rot, int tok_stride, int head_stride, int pos0) {
    char shape[96];
    size_t n = (size_t)n_tok * tok_stride;
    float *x = xmalloc(sizeof(float) * n), *yg = xmalloc(sizeof(float) * n);
    int32_t *pos = xmalloc(sizeof(int32_t) * n_tok);
    fill(x, n, 2.0f);
    for (int t = 0; t < n_tok; t++) pos[t] = pos0 + 3 * t;
    float *dx = gdup(x, sizeof(float) * n);
    int32_t *dpos = gdup(pos, sizeof(int32_t) * n_tok);
    cpu->rope_neox(cpu, x, n_tok, tok_stride, n_head, head_stride, n_rot, pos, 10000000.0f, NULL);
    gpu->rope_neox(gpu, dx, n_tok, tok_stride, n_head, head_stride, n_rot, dpos, 10000000.0f, NULL);
    gget(yg, dx, sizeof(float) * n);
    snprintf(shape, sizeof shape, "%d tok %d heads dim %d rot %d pos %d..", n_tok, n_head, head_dim, n_rot, pos0);
    check("rope_neox", shape, yg, x, n, 2e-6 * 2.0, 2e-6);
    gpu->free(gpu, dx); gpu->free(gpu, dpos);
    free(x); free(yg); free(pos);
}

/* kv_store of n_tok rows of hkv heads of D into K type tk and V type tv: the CPU's bytes (both
 * follow quant.c's reference rules), every cell not stored left as it was. */
static void test_kv_store(enum ggml_type tk, enum ggml_type tv, int n_tok, int hkv, int D, int n_cells) {
    char shape[128];
    const int kvd = hkv * D, ks = kvd + 8; /* k rows with a stride, as q/k/v slices of a wider row */
    const size_t kb = ggml_row_size(tk, kvd) * n_cells, vb = ggml_row_size(tv, kvd) * n_cells;
    float *k = xmalloc(sizeof(float) * n_tok * ks), *v = xmalloc(sizeof(float) * n_tok * kvd);
    int32_t *cells = xmalloc(sizeof(int32_t) * n_tok);
    uint8_t *kc = xmalloc(kb), *vc = xmalloc(vb), *kg = xmalloc(kb), *vg = xmalloc(vb);
    fill(k, (size_t)n_tok * ks, 4.0f);
    /* f16: some beyond its range (inf); the block types' fast CPU paths leave non-finite input's
     * bytes unspecified, so they get finite values */
    fill(v, (size_t)n_tok * kvd, tv == GGML_TYPE_F16 ? 70000.0f : 3.0f);
    for (int t = 0; t < n_tok; t++) cells[t] = (t * 7 + 3) % n_cells;
    for (size_t i = 0; i < kb; i++) kc[i] = (uint8_t)(i * 2654435761u >> 16);
    for (size_t i = 0; i < vb; i++) vc[i] = (uint8_t)(i * 2654435761u >> 16);
    uint8_t *dkc = gdup(kc, kb), *dvc = gdup(vc, vb);
    float *dk = gdup(k, sizeof(float) * n_tok * ks), *dv = gdup(v, sizeof(float) * n_tok * kvd);
    int32_t *dcells = gdup(cells, sizeof(int32_t) * n_tok);
    const struct kv_view kvc = kv_view_make(tk, tv, hkv, D, kc, vc);
    const struct kv_view kvg = kv_view_make(tk, tv, hkv, D, dkc, dvc);
    cpu->kv_store(cpu, k, ks, v, kvd, n_tok, cells, &kvc);
    gpu->kv_store(gpu, dk, ks, dv, kvd, n_tok, dcells, &kvg);
    gget(kg, dkc, kb);
    gget(vg, dvc, vb);
    const char *nk = ggml_type_traits_get(tk)->name, *nv = ggml_type_traits_get(tv)->name;
    snprintf(shape, sizeof shape, "%d tok %d heads of %d cells %d (K %s)", n_tok, hkv, D, n_cells, nk);
    check_bits("kv_store", shape, kg, kc, kb);
    snprintf(shape, sizeof shape, "%d tok %d heads of %d cells %d (V %s)", n_tok, hkv, D, n_cells, nv);
    check_bits("kv_store", shape, vg, vc, vb);
    gpu->free(gpu, dkc); gpu->free(gpu, dvc); gpu->free(gpu, dk); gpu->free(gpu, dv); gpu->free(gpu, dcells);
    free(k); free(v); free(cells); free(kc); free(vc); free(kg); free(vg);
}

/* attn_prep against the CPU's separate ops (within the norm's and rope's tolerances; the cache
 * as f16 of those values) and against the GPU's own separate kernels, bit for bit. q rows hold
 * [q_h ; gate_h] per head as qwen35 lays them out. */
/* gemma: gemma4's form, rope_freqs (the first quarter of the pairs turn, 1e30 for the rest)
 * and v rows normed with a weight of ones before the store; kv_ring: also v taken from the raw
 * k rows (K = V layers) and a second store of every row at cells2 (a window ring's). */
static void test_attn_prep_types(enum ggml_type tk, enum ggml_type tv, int n_tok, int H, int HKV, int D, int n_rot,
                                 int n_cells, bool gemma, bool kv_ring) {
    char shape[128];
    const int QS = 2 * H * D, KV = HKV * D, pos0 = 40;
    const size_t nq = (size_t)n_tok * QS, nk = (size_t)n_tok * KV;
    const size_t kcb = ggml_row_size(tk, KV) * n_cells, vcb = ggml_row_size(tv, KV) * n_cells;
    float *q = xmalloc(sizeof(float) * nq), *k = xmalloc(sizeof(float) * nk), *v = xmalloc(sizeof(float) * nk);
    float *qn = xmalloc(sizeof(float) * D), *kn = xmalloc(sizeof(float) * D);
    float *qg = xmalloc(sizeof(float) * nq), *kg = xmalloc(sizeof(float) * nk);
    float *qg2 = xmalloc(sizeof(float) * nq), *kg2 = xmalloc(sizeof(float) * nk);
    uint8_t *kc = xmalloc(kcb), *vc = xmalloc(vcb), *kcg = xmalloc(kcb), *vcg = xmalloc(vcb);
    uint8_t *kcg2 = xmalloc(kcb), *vcg2 = xmalloc(vcb);
    int32_t *pos = xmalloc(sizeof(int32_t) * n_tok), *cells = xmalloc(sizeof(int32_t) * n_tok);
    int32_t *cells2 = xmalloc(sizeof(int32_t) * n_tok); /* disjoint from cells: n_cells >= 2 n_tok */
    fill(q, nq, 3.0f);
    fill(k, nk, 3.0f);
    fill(v, nk, 2.0f);
    for (int i = 0; i < D; i++) { qn[i] = 1.0f + 0.5f * frand(); kn[i] = 1.0f + 0.5f * frand(); }
    for (int t = 0; t < n_tok; t++) { pos[t] = pos0 + t; cells[t] = (t * 5 + 2) % n_cells; }
    for (int t = 0; t < n_tok; t++) {
        cells2[t] = n_cells - 1 - t;
        for (int u = 0; kv_ring && u < n_tok; u++)
            if (cells[u] == cells2[t]) { fprintf(stderr, "test_attn_prep: cells overlap\n"); abort(); }
    }
    float *ones = xmalloc(sizeof(float) * D), *freqs = xmalloc(sizeof(float) * D / 2);
    for (int i = 0; i < D; i++) ones[i] = 1.0f;
    for (int i = 0; i < D / 2; i++) freqs[i] = i < n_rot / 8 ? 1.0f : 1e30f;
    float *dones = gdup(ones, sizeof(float) * D), *dfreqs = gdup(freqs, sizeof(float) * D / 2);
    memset(kc, 0, kcb);
    memset(vc, 0, vcb);
    float *dq = gdup(q, sizeof(float) * nq), *dk = gdup(k, sizeof(float) * nk), *dv = gdup(v, sizeof(float) * nk);
    float *dqn = gdup(qn, sizeof(float) * D), *dkn = gdup(kn, sizeof(float) * D);
    uint8_t *dkc = gdup(kc, kcb), *dvc = gdup(vc, vcb);
    int32_t *dpos = gdup(pos, sizeof(int32_t) * n_tok), *dcells = gdup(cells, sizeof(int32_t) * n_tok);
    int32_t *dcells2 = gdup(cells2, sizeof(int32_t) * n_tok);
    const struct kv_view kvg = kv_view_make(tk, tv, HKV, D, dkc, dvc);
    const struct kv_view kvc = kv_view_make(tk, tv, HKV, D, kc, vc);
    const struct attn_prep_in gin = {.q = dq, .q_stride = QS, .q_head_stride = 2 * D, .q_norm = dqn, .k = dk,
                                     .k_stride = KV, .k_norm = dkn, .v = dv, .v_stride = KV, .v_norm = gemma ? dones : NULL,
                                     .v_from_k = kv_ring, .cells2 = kv_ring ? dcells2 : NULL, .eps = 1e-6f, .n_head = H, .n_rot = n_rot, .rope_base = 1e7f,
                                     .rope_freqs = gemma ? dfreqs : NULL};
    gpu->attn_prep(gpu, &gin, n_tok, dpos, dcells, &kvg);
    gget(qg, dq, sizeof(float) * nq);
    gget(kg, dk, sizeof(float) * nk);
    gget(kcg, dkc, kcb);
    gget(vcg, dvc, vcb);
    /* the GPU's separate kernels on the same input */
    gpu->upload(gpu, dq, q, sizeof(float) * nq);
    gpu->upload(gpu, dk, k, sizeof(float) * nk);
    gpu->upload(gpu, dv, v, sizeof(float) * nk);
    gpu->upload(gpu, dkc, kc, kcb);
    gpu->upload(gpu, dvc, vc, vcb);
    if (kv_ring) gpu->copy(gpu, dv, dk, sizeof(float) * nk);
    gpu->rmsnorm(gpu, dq, 2 * D, dqn, n_tok * H, D, 1e-6f, dq, 2 * D);
    gpu->rmsnorm(gpu, dk, D, dkn, n_tok * HKV, D, 1e-6f, dk, D);
    gpu->rope_neox(gpu, dq, n_tok, QS, H, 2 * D, n_rot, dpos, 1e7f, gemma ? dfreqs : NULL);
    gpu->rope_neox(gpu, dk, n_tok, KV, HKV, D, n_rot, dpos, 1e7f, gemma ? dfreqs : NULL);
    if (gemma) gpu->rmsnorm(gpu, dv, D, dones, n_tok * HKV, D, 1e-6f, dv, D);
    gpu->kv_store(gpu, dk, KV, dv, KV, n_tok, dcells, &kvg);
    if (kv_ring) gpu->kv_store(gpu, dk, KV, dv, KV, n_tok, dcells2, &kvg);
    gget(qg2, dq, sizeof(float) * nq);
    gget(kg2, dk, sizeof(float) * nk);
    gget(kcg2, dkc, kcb);
    gget(vcg2, dvc, vcb);
    const struct attn_prep_in cin = {.q = q, .q_stride = QS, .q_head_stride = 2 * D, .q_norm = qn, .k = k,
                                     .k_stride = KV, .k_norm = kn, .v = v, .v_stride = KV, .v_norm = gemma ? ones : NULL,
                                     .v_from_k = kv_ring, .cells2 = kv_ring ? cells2 : NULL, .eps = 1e-6f, .n_head = H, .n_rot = n_rot, .rope_base = 1e7f,
                                     .rope_freqs = gemma ? freqs : NULL};
    cpu->attn_prep(cpu, &cin, n_tok, pos, cells, &kvc);
    snprintf(shape, sizeof shape, "%d tok %d/%d heads of %d rot %d%s%s K %s V %s", n_tok, H, HKV, D, n_rot,
             gemma ? " gemma" : "", kv_ring ? " k=v ring" : "", ggml_type_traits_get(tk)->name, ggml_type_traits_get(tv)->name);
    check("attn_prep q", shape, qg, q, nq, 2e-6 * 3.0, 4e-6);
    check("attn_prep k", shape, kg, k, nk, 2e-6 * 3.0, 4e-6);
    check_bits("attn_prep q-sep", shape, qg, qg2, sizeof(float) * nq);
    check_bits("attn_prep k-sep", shape, kg, kg2, sizeof(float) * nk);
    check_bits("attn_prep kc-sep", shape, kcg, kcg2, kcb);
    check_bits("attn_prep vc-sep", shape, vcg, vcg2, vcb);
    /* v is stored as is: the CPU's bytes, by the same reference rule */
    if (!gemma) check_bits("attn_prep vc", shape, vcg, vc, vcb);
    gpu->free(gpu, dq); gpu->free(gpu, dk); gpu->free(gpu, dv); gpu->free(gpu, dqn); gpu->free(gpu, dkn);
    gpu->free(gpu, dkc); gpu->free(gpu, dvc); gpu->free(gpu, dpos); gpu->free(gpu, dcells); gpu->free(gpu, dcells2);
    free(q); free(k); free(v); free(qn); free(kn); free(qg); free(kg); free(qg2); free(kg2); free(kc); free(vc);
    free(kcg); free(vcg); free(kcg2); free(vcg2); free(pos); free(cells); free(cells2);
    gpu->free(gpu, dones); gpu->free(gpu, dfreqs);
    free(ones); free(freqs);
}

static void test_attn_prep(int n_tok, int H, int HKV, int D, int n_rot, int n_cells, bool gemma, bool kv_ring) {
    test_attn_prep_types(GGML_TYPE_F16, GGML_TYPE_F16, n_tok, H, HKV, D, n_rot, n_cells, gemma, kv_ring);
}

/* attn_prep without k (a query-only layer, the assistant's): the GPU's q norm and rope kernels
 * bit for bit, the CPU within their tolerances, and the cache untouched. */
static void test_attn_prep_q_only(int H, int HKV, int D, int n_rot) {
    char shape[96];
    const size_t nq = (size_t)H * D, nc = (size_t)4 * HKV * D;
    float *q = xmalloc(sizeof(float) * nq), *qn = xmalloc(sizeof(float) * D), *qg = xmalloc(sizeof(float) * nq);
    float *qg2 = xmalloc(sizeof(float) * nq);
    uint16_t *kc = xmalloc(2 * nc), *kcg = xmalloc(2 * nc);
    const int32_t pos = 77;
    fill(q, nq, 3.0f);
    for (int i = 0; i < D; i++) qn[i] = 1.0f + 0.5f * frand();
    for (size_t i = 0; i < nc; i++) kc[i] = (uint16_t)(0x3c00 + i % 512);
    float *dq = gdup(q, sizeof(float) * nq), *dqn = gdup(qn, sizeof(float) * D);
    uint16_t *dkc = gdup(kc, 2 * nc), *dvc = gdup(kc, 2 * nc);
    int32_t *dpos = gdup(&pos, sizeof pos);
    const struct kv_view kvg = kv_view_make(GGML_TYPE_F16, GGML_TYPE_F16, HKV, D, dkc, dvc);
    struct kv_view kvc = kv_view_make(GGML_TYPE_F16, GGML_TYPE_F16, HKV, D, kc, kc);
    const struct attn_prep_in gin = {.q = dq, .q_stride = H * D, .q_head_stride = D, .q_norm = dqn, .eps = 1e-6f,
                                     .n_head = H, .n_rot = n_rot, .rope_base = 1e4f};
    gpu->attn_prep(gpu, &gin, 1, dpos, NULL, &kvg);
    gget(qg, dq, sizeof(float) * nq);
    gget(kcg, dkc, 2 * nc);
    gpu->upload(gpu, dq, q, sizeof(float) * nq);
    gpu->rmsnorm(gpu, dq, D, dqn, H, D, 1e-6f, dq, D);
    gpu->rope_neox(gpu, dq, 1, H * D, H, D, n_rot, dpos, 1e4f, NULL);
    gget(qg2, dq, sizeof(float) * nq);
    const struct attn_prep_in cin = {.q = q, .q_stride = H * D, .q_head_stride = D, .q_norm = qn, .eps = 1e-6f,
                                     .n_head = H, .n_rot = n_rot, .rope_base = 1e4f};
    cpu->attn_prep(cpu, &cin, 1, &pos, NULL, &kvc);
    snprintf(shape, sizeof shape, "%d heads of %d rot %d, q only", H, D, n_rot);
    check("attn_prep q", shape, qg, q, nq, 2e-6 * 3.0, 4e-6);
    check_bits("attn_prep q-sep", shape, qg, qg2, sizeof(float) * nq);
    check_bits("attn_prep cache kept", shape, kcg, kc, 2 * nc);
    gpu->free(gpu, dq); gpu->free(gpu, dqn); gpu->free(gpu, dkc); gpu->free(gpu, dvc); gpu->free(gpu, dpos);
    free(q); free(qn); free(qg); free(qg2); free(kc); free(kcg);
}

/* n_tok tokens of sequence seq continuing a cache of len0 rows (causal), n_seq sequences of
 * n_ctx cells each; also checks that every token alone gives the bits it gave in the batch. */
/* gemma: gemma4's layout (q heads packed, scale 1), with a sliding window of `window` rows (0: none) */
static void test_attention_win(enum ggml_type tk, enum ggml_type tv, int n_tok, int len0, int n_head, int n_head_kv,
                               int D, int seq, bool gemma, int window, int max_rows) {
    char shape[128];
    const int n_ctx = len0 + n_tok + 5, n_cells = (seq + 1) * n_ctx, kvd = n_head_kv * D;
    /* q interleaved with its gate, as qwen35 does; packed heads as gemma4 does */
    const int qs = (gemma ? 1 : 2) * n_head * D, qhs = (gemma ? 1 : 2) * D;
    const size_t krb = ggml_row_size(tk, kvd), vrb = ggml_row_size(tv, kvd);
    float *q = xmalloc(sizeof(float) * n_tok * qs), *row = xmalloc(sizeof(float) * kvd);
    uint8_t *kc = xmalloc(krb * n_cells), *vc = xmalloc(vrb * n_cells);
    int32_t *cell0 = xmalloc(sizeof(int32_t) * n_tok), *nctx = xmalloc(sizeof(int32_t) * n_tok);
    float *oc = xmalloc(sizeof(float) * n_tok * n_head * D), *og = xmalloc(sizeof(float) * n_tok * n_head * D);
    float *o1 = xmalloc(sizeof(float) * n_head * D);
    fill(q, (size_t)n_tok * qs, 1.5f);
    /* A block type's K meets the query rounded to int8 per 8 elements on the device (scale
     * amax/127, round to nearest even). The query given is on that grid already: the device's
     * rounding must then leave it as it is, and the CPU's float arithmetic is the reference to
     * rounding. (What the rounding itself moves, at most amax/254 · Σ|k| per 8 in a score, is
     * the format's; the gate's equivalence holds either way, decode and verify rows sharing it.) */
    if (tk == GGML_TYPE_Q8_0 || tk == GGML_TYPE_Q4_0)
        for (int t = 0; t < n_tok; t++)
            for (int h = 0; h < n_head; h++)
                for (int i0 = 0; i0 < D; i0 += 8) {
                    float *x = q + (size_t)t * qs + (size_t)h * qhs + i0, amax = 0;
                    for (int i = 0; i < 8; i++) amax = fmaxf(amax, fabsf(x[i]));
                    const float inv = amax > 0 ? 127.0f / amax : 0.0f, d = amax / 127.0f;
                    for (int i = 0; i < 8; i++) x[i] = rintf(x[i] * inv) * d;
                }
    /* f16 caches: the query on the f16 grid, which a prompt's tensor-core tiles round it to
     * (attention_tiles.cu), so that their only rounding left is P's (checked tightly below) */
    const bool f16_cache = tk == GGML_TYPE_F16 && tv == GGML_TYPE_F16;
    if (f16_cache)
        for (size_t i = 0; i < (size_t)n_tok * qs; i++) q[i] = fp16_to_f32(f32_to_fp16(q[i]));
    float vmax = 0;
    for (int c = 0; c < n_cells; c++) { /* rows as the reference stores them; vmax of the values held */
        fill(row, (size_t)kvd, 2.0f);
        quant_quantize_row_ref(tk, row, kc + (size_t)c * krb, kvd);
        fill(row, (size_t)kvd, 3.0f);
        quant_quantize_row_ref(tv, row, vc + (size_t)c * vrb, kvd);
        quant_dequantize_row_ref(tv, vc + (size_t)c * vrb, row, kvd);
        for (int i = 0; i < kvd; i++) vmax = fmaxf(vmax, fabsf(row[i]));
    }
    for (int t = 0; t < n_tok; t++) {
        const int len = len0 + t + 1, from = window && len > window ? len - window : 0;
        cell0[t] = seq * n_ctx + from;
        nctx[t] = len - from;
    }
    float *dq = gdup(q, sizeof(float) * n_tok * qs);
    uint8_t *dkc = gdup(kc, krb * n_cells), *dvc = gdup(vc, vrb * n_cells);
    int32_t *dc0 = gdup(cell0, sizeof(int32_t) * n_tok), *dn = gdup(nctx, sizeof(int32_t) * n_tok);
    float *dout = galloc(sizeof(float) * n_tok * n_head * D);
    const float scale = gemma ? 1.0f : 1.0f / sqrtf((float)D);
    const struct kv_view kvc = kv_view_make(tk, tv, n_head_kv, D, kc, vc);
    struct kv_view kvg = kv_view_make(tk, tv, n_head_kv, D, dkc, dvc);
    kvg.max_rows = max_rows < 0 ? n_ctx : max_rows; /* -1: the sequence's cells, as a cache says */
    cpu->attention(cpu, q, qs, qhs, &kvc, cell0, nctx, n_tok, n_head, scale, oc);
    /* an error of the order of rounding in a score s is s·ε relative in its weight exp(s - m),
     * so the tolerance grows with the largest |score| seen (gemma4's scale 1 makes them large) */
    float smax = 0;
    float *kd = xmalloc(sizeof(float) * kvd);
    for (int t = 0; t < n_tok; t++)
        for (int c = cell0[t]; c < cell0[t] + nctx[t]; c++) {
            quant_dequantize_row_ref(tk, kc + (size_t)c * krb, kd, kvd);
            for (int h = 0; h < n_head; h++) {
                const float *qh = q + (size_t)t * qs + (size_t)h * qhs, *kh = kd + (size_t)(h / (n_head / n_head_kv)) * D;
                float dot = 0;
                for (int i = 0; i < D; i++) dot += qh[i] * kh[i];
                smax = fmaxf(smax, fabsf(dot * scale));
            }
        }
    free(kd);
    const float tol = vmax * (1e-5f + 8.0f * smax * FLT_EPSILON);
    snprintf(shape, sizeof shape, "%d tok ctx %d..%d heads %d/%d dim %d K %s V %s%s", n_tok, len0 + 1, len0 + n_tok,
             n_head, n_head_kv, D, ggml_type_traits_get(tk)->name, ggml_type_traits_get(tv)->name, window ? " window" : gemma ? " packed" : "");
    { /* as a prompt, however short: the tensor-core tiles where they fit, else one slice per token */
        const long before = backend_cuda_attention_tile_launches(gpu);
        gpu->set_prompt(gpu, LONG_PROMPT);
        gpu->attention(gpu, dq, qs, qhs, &kvg, dc0, dn, n_tok, n_head, scale, dout);
        gpu->set_prompt(gpu, 0);
        const bool tiles = backend_cuda_attention_tile_launches(gpu) > before;
        gget(og, dout, sizeof(float) * n_tok * n_head * D);
        char ps[160];
        snprintf(ps, sizeof ps, "%.120s prompt%s", shape, tiles ? " tiles" : "");
        /* the tiles round each weight exp(s - m) to f16 (2^-11 relative) before P·V: the output
         * moves by at most 2^-11 of max|v| on top of the float kernels' bound */
        check("attention", ps, og, oc, (size_t)n_tok * n_head * D, tiles ? tol + vmax / 2048.0f : tol, 0);
        if (f16_cache && (D == 64 || D == 128 || D == 256) && n_head / n_head_kv <= 64) {
            printf("%-5s %-14s %-44s %s\n", tiles ? "ok" : "FAIL", "attention", ps, tiles ? "tiles ran" : "tiles did not run");
            tiles ? n_pass++ : n_fail++;
        }
        /* the tokens from the 6th on, grouped otherwise into blocks, and the last token alone:
         * the same bits (a server cuts and packs prompts as it likes) */
        const int from[] = {5, n_tok - 1};
        for (int k = 0; k < 2; k++) {
            const int t0 = from[k];
            if (t0 < 1 || (k == 0 && t0 >= n_tok - 1)) continue;
            float *og5 = xmalloc(sizeof(float) * (n_tok - t0) * n_head * D);
            gpu->set_prompt(gpu, LONG_PROMPT);
            gpu->attention(gpu, dq + (size_t)t0 * qs, qs, qhs, &kvg, dc0 + t0, dn + t0, n_tok - t0, n_head, scale, dout);
            gpu->set_prompt(gpu, 0);
            gget(og5, dout, sizeof(float) * (n_tok - t0) * n_head * D);
            check_bits("attention-prompt-batch", ps, og5, og + (size_t)t0 * n_head * D, sizeof(float) * (n_tok - t0) * n_head * D);
            free(og5);
        }
    }
    gpu->attention(gpu, dq, qs, qhs, &kvg, dc0, dn, n_tok, n_head, scale, dout);
    gget(og, dout, sizeof(float) * n_tok * n_head * D);
    check("attention", shape, og, oc, (size_t)n_tok * n_head * D, tol, 0);
    if (n_tok > 1) { /* decode of each row alone = the row in any batch but a prompt's */
        bool same = true;
        for (int t = 0; t < n_tok && same; t++) {
            gpu->attention(gpu, dq + (size_t)t * qs, qs, qhs, &kvg, dc0 + t, dn + t, 1, n_head, scale, dout);
            gget(o1, dout, sizeof(float) * n_head * D);
            same = memcmp(o1, og + (size_t)t * n_head * D, sizeof(float) * n_head * D) == 0;
        }
        check_bits("attention-1", shape, &same, &(bool){true}, sizeof same);
    }
    gpu->free(gpu, dq); gpu->free(gpu, dkc); gpu->free(gpu, dvc); gpu->free(gpu, dc0); gpu->free(gpu, dn); gpu->free(gpu, dout);
    free(q); free(row); free(kc); free(vc); free(cell0); free(nctx); free(oc); free(og); free(o1);
}
static void test_attention_types(enum ggml_type tk, enum ggml_type tv, int n_tok, int len0, int n_head, int n_head_kv,
                                 int D, int seq) {
    test_attention_win(tk, tv, n_tok, len0, n_head, n_head_kv, D, seq, false, 0, -1);
}
static void test_attention(int n_tok, int len0, int n_head, int n_head_kv, int D, int seq) {
    test_attention_types(GGML_TYPE_F16, GGML_TYPE_F16, n_tok, len0, n_head, n_head_kv, D, seq);
}

/* ---- delta net ------------------------------------------------------------------------------ */

/* One sequence's states: sequence 0 of a set whose seq array lives on that backend. */
static struct state_set one_seq(bool on_gpu, float *state, float *snap) {
    static const int32_t host0[1] = {0};
    static int32_t *dev0;
    if (on_gpu && !dev0) dev0 = gdup(host0, sizeof host0);
    return (struct state_set){state, snap, NULL, 0, 0, 0, on_gpu ? dev0 : host0};
}

static void test_ssm_conv(int n_tok, int n_ch, int k, int n_snap) {
    char shape[96];
    const int ks = k - 1;
    float *x = xmalloc(sizeof(float) * n_tok * n_ch), *w = xmalloc(sizeof(float) * n_ch * k);
    float *st = xmalloc(sizeof(float) * (n_ch * ks + 1)), *stg = xmalloc(sizeof(float) * (n_ch * ks + 1));
    float *yc = xmalloc(sizeof(float) * n_tok * n_ch), *yg = xmalloc(sizeof(float) * n_tok * n_ch);
    size_t nsnap = (size_t)COTI_MAX(n_snap, 1) * n_ch * ks + 1;
    float *sc = xmalloc(sizeof(float) * nsnap), *sg = xmalloc(sizeof(float) * nsnap);
    fill(x, (size_t)n_tok * n_ch, 3.0f);
    fill(w, (size_t)n_ch * k, 1.0f);
    fill(st, (size_t)n_ch * ks + 1, 2.0f);
    fill(sc, nsnap, 1.0f);
    float *dx = gdup(x, sizeof(float) * n_tok * n_ch), *dw = gdup(w, sizeof(float) * n_ch * k);
    float *dst = gdup(st, sizeof(float) * (n_ch * ks + 1)), *dy = galloc(sizeof(float) * n_tok * n_ch);
    float *dsn = gdup(sc, sizeof(float) * nsnap);
    const struct state_set sc_set = one_seq(false, st, n_snap ? sc : NULL), sg_set = one_seq(true, dst, n_snap ? dsn : NULL);
    const struct state_run run = {0, n_tok, 0, n_snap, false};
    cpu->ssm_conv(cpu, x, n_ch, k, w, yc, &sc_set, &run, 1);
    gpu->ssm_conv(gpu, dx, n_ch, k, dw, dy, &sg_set, &run, 1);
    gget(yg, dy, sizeof(float) * n_tok * n_ch);
    gget(stg, dst, sizeof(float) * (n_ch * ks + 1));
    gget(sg, dsn, sizeof(float) * nsnap);
    snprintf(shape, sizeof shape, "%d tok %d ch k %d snap %d", n_tok, n_ch, k, n_snap);
    check("ssm_conv", shape, yg, yc, (size_t)n_tok * n_ch, 1e-30, 2e-6);
    check_bits("ssm_conv-state", shape, stg, st, sizeof(float) * (n_ch * ks + 1));
    check_bits("ssm_conv-snap", shape, sg, sc, sizeof(float) * nsnap);
    gpu->free(gpu, dx); gpu->free(gpu, dw); gpu->free(gpu, dst); gpu->free(gpu, dy); gpu->free(gpu, dsn);
    free(x); free(w); free(st); free(stg); free(yc); free(yg); free(sc); free(sg);
}

/* Several sequences' runs in one call (a batched cycle): conv and rule against the CPU's
 * (which the CPU suite checks equal to each run alone), and bit for bit the GPU's own
 * run-by-run results, prompts too: a row of a sequence does not depend on the others in its batch.
 * len[] 0-terminated; a row between runs 1 and 2 belongs to none; each run keeps up to 3
 * snapshots outside prompts; run r works on sequence nr - 1 - r (state_set.seq). */
static void test_state_runs(bool prompt, const int *len, const char *what) {
    enum { NK = 2, NV = 4, DK = 64, DV = 64, K = 4, KEEP = 3, MAXR = 48 };
    const int ch = 2 * NK * DK + NV * DV, ks = K - 1;
    const size_t ce = (size_t)ch * ks, se = (size_t)NV * DK * DV;
    int nr = 0, start[MAXR], n = 0;
    for (; len[nr] && nr < MAXR; nr++) { start[nr] = n; n += len[nr] + (nr == 1); }
    float *x = xmalloc(sizeof(float) * n * ch), *w = xmalloc(sizeof(float) * ch * K), *a = xmalloc(sizeof(float) * n * NV);
    float *b = xmalloc(sizeof(float) * n * NV), dt[NV], sa[NV];
    fill(x, (size_t)n * ch, 1.0f);
    fill(w, (size_t)ch * K, 0.5f);
    fill(a, (size_t)n * NV, 15.0f);
    fill(b, (size_t)n * NV, 6.0f);
    fill(dt, NV, 8.0f);
    for (int h = 0; h < NV; h++) sa[h] = -0.05f * (0.2f + fabsf(frand()));
    const size_t c_n = nr * ce, s_n = nr * se, cs_n = nr * KEEP * ce, ss_n = nr * KEEP * se;
    float *cst = xmalloc(sizeof(float) * c_n), *sst = xmalloc(sizeof(float) * s_n);
    fill(cst, c_n, 1.0f);
    fill(sst, s_n, 0.5f);
    float *zero = xmalloc(sizeof(float) * (ss_n > (size_t)n * ch ? ss_n : (size_t)n * ch));
    for (size_t i = 0; i < (ss_n > (size_t)n * ch ? ss_n : (size_t)n * ch); i++) zero[i] = 0.0f;
    /* host results: [0] CPU, [1] GPU all runs, [2] GPU run by run */
    float *y[3], *o[3], *c[3], *st[3], *csn[3], *ssn[3];
    float *dx = gdup(x, sizeof(float) * n * ch), *dw = gdup(w, sizeof(float) * ch * K);
    float *da = gdup(a, sizeof(float) * n * NV), *db = gdup(b, sizeof(float) * n * NV);
    float *ddt = gdup(dt, sizeof dt), *dsa = gdup(sa, sizeof sa);
    float *dy = galloc(sizeof(float) * n * ch), *dout = galloc(sizeof(float) * n * NV * DV);
    float *dc = galloc(sizeof(float) * c_n), *ds = galloc(sizeof(float) * s_n);
    float *dcs = galloc(sizeof(float) * cs_n), *dss = galloc(sizeof(float) * ss_n);
    for (int v = 0; v < 3; v++) {
        y[v] = xmalloc(sizeof(float) * n * ch);
        o[v] = xmalloc(sizeof(float) * n * NV * DV);
        c[v] = xmalloc(sizeof(float) * c_n);
        st[v] = xmalloc(sizeof(float) * s_n);
        csn[v] = xmalloc(sizeof(float) * cs_n);
        ssn[v] = xmalloc(sizeof(float) * ss_n);
        memcpy(y[v], zero, sizeof(float) * n * ch);
        memcpy(o[v], zero, sizeof(float) * n * NV * DV);
        memcpy(c[v], cst, sizeof(float) * c_n);
        memcpy(st[v], sst, sizeof(float) * s_n);
        memcpy(csn[v], zero, sizeof(float) * cs_n);
        memcpy(ssn[v], zero, sizeof(float) * ss_n);
    }
    struct state_run runs[MAXR];
    int32_t seq[MAXR];
    for (int r = 0; r < nr; r++) {
        runs[r] = (struct state_run){start[r], len[r], r, prompt ? 0 : COTI_MIN(len[r] - 1, KEEP), false};
        seq[r] = nr - 1 - r;
    }
    int32_t *dseq = gdup(seq, sizeof(int32_t) * nr);
    const struct state_set ccs = {c[0], csn[0], NULL, ce, KEEP * ce, 0, seq}, cgs = {st[0], ssn[0], NULL, se, KEEP * se, 0, seq};
    const struct state_set dcs_set = {dc, dcs, NULL, ce, KEEP * ce, 0, dseq}, dgs_set = {ds, dss, NULL, se, KEEP * se, 0, dseq};
    const struct gdn_gates gc = {a, b, dt, sa, NV, NV}, gg = {da, db, ddt, dsa, NV, NV};
    cpu->ssm_conv(cpu, x, ch, K, w, y[0], &ccs, runs, nr);
    cpu->gdn(cpu, y[0], ch, &gc, NK, NV, DK, DV, 1e-6f, o[0], &cgs, runs, nr);
    for (int v = 1; v < 3; v++) {
        gput(dy, zero, sizeof(float) * n * ch);
        gput(dout, zero, sizeof(float) * n * NV * DV);
        gput(dc, cst, sizeof(float) * c_n);
        gput(ds, sst, sizeof(float) * s_n);
        gput(dcs, zero, sizeof(float) * cs_n);
        gput(dss, zero, sizeof(float) * ss_n);
        gpu->set_prompt(gpu, prompt ? LONG_PROMPT : 0);
        if (v == 1) {
            gpu->ssm_conv(gpu, dx, ch, K, dw, dy, &dcs_set, runs, nr);
            gpu->gdn(gpu, dy, ch, &gg, NK, NV, DK, DV, 1e-6f, dout, &dgs_set, runs, nr);
        } else {
            for (int r = 0; r < nr; r++) gpu->ssm_conv(gpu, dx, ch, K, dw, dy, &dcs_set, &runs[r], 1);
            for (int r = 0; r < nr; r++) gpu->gdn(gpu, dy, ch, &gg, NK, NV, DK, DV, 1e-6f, dout, &dgs_set, &runs[r], 1);
        }
        gpu->set_prompt(gpu, 0);
        gget(y[v], dy, sizeof(float) * n * ch);
        gget(o[v], dout, sizeof(float) * n * NV * DV);
        gget(c[v], dc, sizeof(float) * c_n);
        gget(st[v], ds, sizeof(float) * s_n);
        gget(csn[v], dcs, sizeof(float) * cs_n);
        gget(ssn[v], dss, sizeof(float) * ss_n);
    }
    char shape[96];
    snprintf(shape, sizeof shape, "%d runs, %d rows, %s%s", nr, n, what, prompt ? ", prompt" : "");
    check("ssm_conv runs", shape, y[1], y[0], (size_t)n * ch, 1e-30, 2e-6);
    check_bits("ssm_conv runs", shape, c[1], c[0], sizeof(float) * c_n);
    check_bits("ssm_conv runs", shape, csn[1], csn[0], sizeof(float) * cs_n);
    check("gdn runs", shape, o[1], o[0], (size_t)n * NV * DV, 2e-5, 0);
    check("gdn runs", shape, st[1], st[0], s_n, 2e-5, 0);
    check("gdn runs", shape, ssn[1], ssn[0], ss_n, 2e-5, 0);
    {
        snprintf(shape, sizeof shape, "%d runs = run by run, %s", nr, what);
        check_bits("ssm_conv runs", shape, y[1], y[2], sizeof(float) * n * ch);
        check_bits("gdn runs", shape, o[1], o[2], sizeof(float) * n * NV * DV);
        check_bits("gdn runs", shape, st[1], st[2], sizeof(float) * s_n);
        check_bits("gdn runs", shape, ssn[1], ssn[2], sizeof(float) * ss_n);
    }
    for (int v = 0; v < 3; v++) { free(y[v]); free(o[v]); free(c[v]); free(st[v]); free(csn[v]); free(ssn[v]); }
    float *dev[] = {dx, dw, da, db, ddt, dsa, dy, dout, dc, ds, dcs, dss};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) gpu->free(gpu, dev[i]);
    gpu->free(gpu, dseq);
    free(x); free(w); free(a); free(b); free(cst); free(sst); free(zero);
}

static void test_gdn(bool chunked, int n_tok, int nk, int nv, int dk, int n_snap) {
    char shape[96];
    /* odd token counts: rows 7 floats apart beyond their width (not 16-byte aligned: the
     * kernel's 4-byte copies); even: 8 (its 16-byte copies where dk allows) */
    const int dv = dk, ch = 2 * nk * dk + nv * dv, stride = ch + (n_tok % 2 ? 7 : 8);
    const size_t st_n = (size_t)nv * dk * dv, nsnap = (size_t)COTI_MAX(n_snap, 1) * st_n;
    const int as = nv + 3, bs = nv + 5;
    float *qkv = xmalloc(sizeof(float) * n_tok * stride), *a = xmalloc(sizeof(float) * n_tok * as);
    float *b = xmalloc(sizeof(float) * n_tok * bs), *S = xmalloc(sizeof(float) * st_n), *Sg = xmalloc(sizeof(float) * st_n);
    float *dt = xmalloc(sizeof(float) * nv), *sa = xmalloc(sizeof(float) * nv);
    float *oc = xmalloc(sizeof(float) * n_tok * nv * dv), *og = xmalloc(sizeof(float) * n_tok * nv * dv);
    float *sc = xmalloc(sizeof(float) * nsnap), *sg = xmalloc(sizeof(float) * nsnap);
    fill(qkv, (size_t)n_tok * stride, 1.0f);
    /* raw gates on both sides of softplus's threshold (a + dt = 20); ssm_a keeps g = softplus · ssm_a
     * in about [-1.4, 0) */
    fill(a, (size_t)n_tok * as, 15.0f);
    fill(b, (size_t)n_tok * bs, 6.0f);
    fill(dt, nv, 8.0f);
    for (int h = 0; h < nv; h++) sa[h] = -0.05f * (0.2f + fabsf(frand()));
    fill(S, st_n, 0.5f);
    fill(sc, nsnap, 1.0f);
    float *dqkv = gdup(qkv, sizeof(float) * n_tok * stride), *da = gdup(a, sizeof(float) * n_tok * as);
    float *db = gdup(b, sizeof(float) * n_tok * bs), *dS = gdup(S, sizeof(float) * st_n);
    float *ddt = gdup(dt, sizeof(float) * nv), *dsa = gdup(sa, sizeof(float) * nv);
    const struct gdn_gates gc = {a, b, dt, sa, as, bs}, gg = {da, db, ddt, dsa, as, bs};
    float *dout = galloc(sizeof(float) * n_tok * nv * dv), *dsn = gdup(sc, sizeof(float) * nsnap);
    float *S0 = xmalloc(sizeof(float) * st_n), *sc0 = xmalloc(sizeof(float) * nsnap);
    memcpy(S0, S, sizeof(float) * st_n);
    memcpy(sc0, sc, sizeof(float) * nsnap);
    const struct state_set sc_set = one_seq(false, S, chunked || !n_snap ? NULL : sc);
    const struct state_set sg_set = one_seq(true, dS, chunked || !n_snap ? NULL : dsn);
    const struct state_run run = {0, n_tok, 0, n_snap, false};
    if (chunked) cpu->gdn_chunked(cpu, qkv, stride, &gc, nk, nv, dk, dv, 1e-6f, oc, &sc_set, &run, 1);
    else cpu->gdn(cpu, qkv, stride, &gc, nk, nv, dk, dv, 1e-6f, oc, &sc_set, &run, 1);
    /* a prompt takes a kernel of its own, however short: both, from the same state */
    for (int pm = 0; pm < 2; pm++) {
        gput(dS, S0, sizeof(float) * st_n);
        gput(dsn, sc0, sizeof(float) * nsnap);
        gpu->set_prompt(gpu, pm == 1 ? LONG_PROMPT : 0);
        if (chunked) gpu->gdn_chunked(gpu, dqkv, stride, &gg, nk, nv, dk, dv, 1e-6f, dout, &sg_set, &run, 1);
        else gpu->gdn(gpu, dqkv, stride, &gg, nk, nv, dk, dv, 1e-6f, dout, &sg_set, &run, 1);
        gpu->set_prompt(gpu, 0);
        gget(og, dout, sizeof(float) * n_tok * nv * dv);
        gget(Sg, dS, sizeof(float) * st_n);
        gget(sg, dsn, sizeof(float) * nsnap);
        const char *op = chunked ? "gdn_chunked" : "gdn", *mode = pm ? " prompt" : "";
        snprintf(shape, sizeof shape, "%d tok nk %d nv %d d %d snap %d (out)%s", n_tok, nk, nv, dk, n_snap, mode);
        check(op, shape, og, oc, (size_t)n_tok * nv * dv, 2e-5, 0);
        snprintf(shape, sizeof shape, "%d tok nk %d nv %d d %d snap %d (state)%s", n_tok, nk, nv, dk, n_snap, mode);
        check(op, shape, Sg, S, st_n, 2e-5, 0);
        if (!chunked) {
            snprintf(shape, sizeof shape, "%d tok nk %d nv %d d %d snap %d (snap)%s", n_tok, nk, nv, dk, n_snap, mode);
            check(op, shape, sg, sc, nsnap, 2e-5, 0);
        }
    }
    if (!chunked && n_tok > 3) { /* a prompt cut in two (3 tokens, then the rest) = the whole one */
        float *o2 = xmalloc(sizeof(float) * n_tok * nv * dv), *S2 = xmalloc(sizeof(float) * st_n);
        const struct state_set s_set = one_seq(true, dS, NULL);
        const struct state_run whole = {0, n_tok, 0, 0, false}, cut[2] = {{0, 3, 0, 0, false}, {3, n_tok - 3, 0, 0, false}};
        gpu->set_prompt(gpu, LONG_PROMPT);
        gput(dS, S0, sizeof(float) * st_n);
        gpu->gdn(gpu, dqkv, stride, &gg, nk, nv, dk, dv, 1e-6f, dout, &s_set, &whole, 1);
        gget(og, dout, sizeof(float) * n_tok * nv * dv);
        gget(Sg, dS, sizeof(float) * st_n);
        gput(dS, S0, sizeof(float) * st_n);
        for (int k = 0; k < 2; k++) gpu->gdn(gpu, dqkv, stride, &gg, nk, nv, dk, dv, 1e-6f, dout, &s_set, &cut[k], 1);
        gpu->set_prompt(gpu, 0);
        gget(o2, dout, sizeof(float) * n_tok * nv * dv);
        gget(S2, dS, sizeof(float) * st_n);
        snprintf(shape, sizeof shape, "%d tok nk %d nv %d d %d, prompt cut at 3", n_tok, nk, nv, dk);
        check_bits("gdn-prompt-cut", shape, o2, og, sizeof(float) * n_tok * nv * dv);
        check_bits("gdn-prompt-cut", shape, S2, Sg, sizeof(float) * st_n);
        free(o2);
        free(S2);
    }
    free(S0);
    free(sc0);
    gpu->free(gpu, dqkv); gpu->free(gpu, da); gpu->free(gpu, db); gpu->free(gpu, ddt); gpu->free(gpu, dsa);
    gpu->free(gpu, dS); gpu->free(gpu, dout); gpu->free(gpu, dsn);
    free(qkv); free(a); free(b); free(dt); free(sa); free(S); free(Sg); free(oc); free(og); free(sc); free(sg);
}

/* ---- argmax ----------------------------------------------------------------------------------- */

static void test_argmax(int n_rows, int n) {
    char shape[96];
    float *x = xmalloc(sizeof(float) * n_rows * n);
    fill(x, (size_t)n_rows * n, 8.0f);
    for (int r = 0; r < n_rows; r++) { /* a tie across slices: the lower index wins */
        float *xr = x + (size_t)r * n;
        int a = (r * 7919) % n, b = (a + n / 2 + 1) % n;
        xr[a] = xr[b] = 9.5f;
    }
    int32_t *ic = xmalloc(sizeof(int32_t) * n_rows), *ig = xmalloc(sizeof(int32_t) * n_rows);
    float *pc = xmalloc(sizeof(float) * n_rows), *pg = xmalloc(sizeof(float) * n_rows);
    float *dx = gdup(x, sizeof(float) * n_rows * n);
    int32_t *di = galloc(sizeof(int32_t) * n_rows);
    float *dp = galloc(sizeof(float) * n_rows);
    cpu->argmax(cpu, x, n_rows, n, ic, pc);
    gpu->argmax(gpu, dx, n_rows, n, di, dp);
    gget(ig, di, sizeof(int32_t) * n_rows);
    gget(pg, dp, sizeof(float) * n_rows);
    snprintf(shape, sizeof shape, "%d rows x %d", n_rows, n);
    check_bits("argmax", shape, ig, ic, sizeof(int32_t) * n_rows);
    check("argmax-p", shape, pg, pc, n_rows, 0, 1e-6);
    gpu->argmax(gpu, dx, n_rows, n, di, NULL);
    gget(ig, di, sizeof(int32_t) * n_rows);
    check_bits("argmax", "(no p_max)", ig, ic, sizeof(int32_t) * n_rows);
    gpu->free(gpu, dx); gpu->free(gpu, di); gpu->free(gpu, dp);
    free(x); free(ic); free(ig); free(pc); free(pg);
}

/* ---- accept_greedy ---------------------------------------------------------------------------- */

/* draft = target with the first mismatch at `miss` (n_draft: none), against the CPU result. */
static void test_accept_greedy(int n_draft, int miss) {
    char shape[64];
    int32_t draft[16], target[17], oc[18], og[18];
    for (int i = 0; i <= n_draft; i++) target[i] = 1000 + 37 * i;
    for (int i = 0; i < n_draft; i++) draft[i] = i == miss ? target[i] + 1 : target[i];
    int32_t *dd = gdup(draft, sizeof draft), *dt = gdup(target, sizeof target);
    int32_t *dout = galloc(sizeof og);
    cpu->accept_greedy(cpu, draft, target, n_draft, oc);
    gpu->accept_greedy(gpu, dd, dt, n_draft, dout);
    gget(og, dout, sizeof(int32_t) * (size_t)(n_draft + 2));
    snprintf(shape, sizeof shape, "%d drafts, first miss %d", n_draft, miss);
    if (oc[0] != (miss < n_draft ? miss : n_draft)) { n_fail++; printf("FAIL accept_greedy %s: cpu a = %d\n", shape, oc[0]); }
    check_bits("accept_greedy", shape, og, oc, sizeof(int32_t) * (size_t)(n_draft + 2));
    gpu->free(gpu, dd); gpu->free(gpu, dt); gpu->free(gpu, dout);
}

/* marks around queued work: the elapsed time is that work's, not the host's call time */
static void test_marks(void) {
    const size_t n = (size_t)256 << 20;
    void *a = galloc(n), *b = galloc(n);
    gpu->sync(gpu);
    gpu->mark(gpu, 0);
    for (int i = 0; i < 8; i++) gpu->copy(gpu, b, a, n);
    gpu->mark(gpu, 1);
    gpu->mark(gpu, 2);
    const double us = gpu->mark_elapsed_us(gpu, 0, 1), empty = gpu->mark_elapsed_us(gpu, 1, 2);
    /* 4 GiB of traffic takes > 200 us on any device this backend runs on */
    bool ok = us > 200.0 && us < 1e6 && empty >= 0.0 && empty < 100.0;
    if (ok) n_pass++;
    else n_fail++;
    printf("%-5s %-14s %-44s %.1f us / %.1f us\n", ok ? "ok" : "FAIL", "mark", "8 x 256 MiB copies / nothing queued", us, empty);
    gpu->free(gpu, a); gpu->free(gpu, b);
}

/* ---- graphs ------------------------------------------------------------------------------------ */

static void expect(bool ok, const char *what) {
    ok ? n_pass++ : n_fail++;
    printf("%-5s %-14s %s\n", ok ? "ok" : "FAIL", "graph", what);
}

/* The side queue: a matmul queued on the side and another on the main queue at once (both
 * converting their activations, so the side must have scratch of its own) equal the same two
 * in turn, eagerly and replayed from a graph, and the op after side_join reads the side's
 * result. */
static void test_side(void) {
    const int n_in = 2304, n_out = 300, nt = 3;
    const size_t nx = (size_t)nt * n_in, ny = (size_t)nt * n_out;
    struct hweight h1 = make_weight(GGML_TYPE_Q4_K, n_in, n_out), h2 = make_weight(GGML_TYPE_Q8_0, n_in, n_out);
    struct bweight w1 = {0}, w2 = {0};
    gpu->weight_init(gpu, &w1, h1.type, n_in, n_out, h1.data);
    gpu->weight_init(gpu, &w2, h2.type, n_in, n_out, h2.data);
    float *x1 = xmalloc(sizeof(float) * nx), *x2 = xmalloc(sizeof(float) * nx), *poison = xmalloc(sizeof(float) * ny);
    float *ref[3], *got[3];
    for (int i = 0; i < 3; i++) { ref[i] = xmalloc(sizeof(float) * ny); got[i] = xmalloc(sizeof(float) * ny); }
    fill(x1, nx, 2.0f);
    fill(x2, nx, 2.0f);
    fill(poison, ny, 100.0f);
    float *dx1 = gdup(x1, sizeof(float) * nx), *dx2 = gdup(x2, sizeof(float) * nx), *dy[3];
    for (int i = 0; i < 3; i++) dy[i] = galloc(sizeof(float) * ny);
    matmul1(gpu, &w1, dx1, nt, dy[0]);
    matmul1(gpu, &w2, dx2, nt, dy[1]);
    gpu->add(gpu, dy[0], dy[1], (int64_t)ny, dy[2]);
    for (int i = 0; i < 3; i++) gget(ref[i], dy[i], sizeof(float) * ny);
    static const char *const names[3] = {"side", "main", "after join"};
    for (int graph = 0; graph < 2; graph++) {
        for (int i = 0; i < 3; i++) gpu->upload(gpu, dy[i], poison, sizeof(float) * ny);
        if (graph) gpu->capture_begin(gpu);
        backend_side_begin(gpu);
        matmul1(gpu, &w1, dx1, nt, dy[0]);
        backend_side_end(gpu);
        matmul1(gpu, &w2, dx2, nt, dy[1]);
        backend_side_join(gpu);
        gpu->add(gpu, dy[0], dy[1], (int64_t)ny, dy[2]);
        void *g = graph ? gpu->capture_end(gpu, NULL) : NULL;
        if (graph) {
            printf("%-5s %-14s %-44s\n", g ? "ok" : "FAIL", "side", g ? "recorded" : "recording failed");
            g ? n_pass++ : n_fail++;
            if (g) gpu->graph_launch(gpu, g);
        }
        for (int i = 0; i < 3; i++) {
            char shape[64];
            snprintf(shape, sizeof shape, "%s %s, q4_K / q8_0 %dx%d tok %d", graph ? "graph" : "eager", names[i], n_in,
                     n_out, nt);
            gget(got[i], dy[i], sizeof(float) * ny);
            check_bits("side", shape, got[i], ref[i], sizeof(float) * ny);
        }
        if (g) gpu->graph_free(gpu, g);
    }
    for (int i = 0; i < 3; i++) { gpu->free(gpu, dy[i]); free(ref[i]); free(got[i]); }
    gpu->free(gpu, dx1);
    gpu->free(gpu, dx2);
    gpu->weight_free(gpu, &w1);
    gpu->weight_free(gpu, &w2);
    free_hweight(&h1);
    free_hweight(&h2);
    free(x1);
    free(x2);
    free(poison);
}

/* Recording runs nothing; a replay reads the inputs' current contents; a graph whose scratch
 * buffer the backend has since replaced is refused; a recording that would need more scratch
 * than there is fails cleanly. */
static void test_graphs(void) {
    const int n = 1000;
    float *a = xmalloc(sizeof(float) * n), *b = xmalloc(sizeof(float) * n), *y = xmalloc(sizeof(float) * n);
    float *ref = xmalloc(sizeof(float) * n);
    fill(a, n, 1.0f);
    fill(b, n, 1.0f);
    float *da = gdup(a, sizeof(float) * n), *db = gdup(b, sizeof(float) * n), *dy = galloc(sizeof(float) * n);
    /* argmax's scratch grown now: a recording that would grow it fails, and growing it later
     * makes the graphs below stale */
    int32_t *first_id = galloc(sizeof(int32_t));
    gpu->argmax(gpu, da, 1, n, first_id, NULL);
    gpu->capture_begin(gpu);
    gpu->add(gpu, da, db, n, dy);
    void *g = gpu->capture_end(gpu, NULL);
    gget(y, dy, sizeof(float) * n);
    expect(g && y[0] == 0.0f && y[n - 1] == 0.0f, "recording runs nothing");
    for (int round = 0; round < 2; round++) {
        if (round) { fill(a, n, 2.0f); gpu->upload(gpu, da, a, sizeof(float) * n); }
        bool launched = g && gpu->graph_launch(gpu, g);
        gget(y, dy, sizeof(float) * n);
        cpu->add(cpu, a, b, n, ref);
        expect(launched && !memcmp(y, ref, sizeof(float) * n), round ? "replay reads new input contents" : "replay computes the op");
    }
    /* the same op over other buffers, recorded over g: rewritten in place, and the replay writes
     * the new output only */
    float *dy2 = galloc(sizeof(float) * n), *y2 = xmalloc(sizeof(float) * n);
    gpu->upload(gpu, dy2, b, sizeof(float) * n);
    gpu->upload(gpu, dy, b, sizeof(float) * n);
    gpu->capture_begin(gpu);
    gpu->add(gpu, db, da, n, dy2);
    void *g2 = gpu->capture_end(gpu, g);
    bool launched = g2 && gpu->graph_launch(gpu, g2);
    gget(y, dy, sizeof(float) * n);
    gget(y2, dy2, sizeof(float) * n);
    cpu->add(cpu, b, a, n, ref);
    expect(g && g2 == g, "a recording of the same ops rewrites the graph offered");
    expect(launched && !memcmp(y2, ref, sizeof(float) * n) && !memcmp(y, b, sizeof(float) * n),
           "the rewritten graph runs the new arguments only");
    /* other ops: a new graph, the one offered left as it was */
    gpu->capture_begin(gpu);
    gpu->add(gpu, db, da, n, dy2);
    gpu->argmax(gpu, dy2, 1, n, (int32_t *)dy, NULL);
    void *g3 = gpu->capture_end(gpu, g2);
    expect(g3 && g3 != g2, "another structure gets a new graph");
    expect(g2 && gpu->graph_launch(gpu, g2), "the graph offered still runs");
    if (g3) gpu->graph_free(gpu, g3);
    if (g2) gpu->graph_free(gpu, g2);
    if (g && g2 != g) gpu->graph_free(gpu, g);
    gpu->sync(gpu);
    gpu->free(gpu, dy2);
    gpu->free(gpu, first_id);
    free(y2);

    /* argmax uses scratch: record a small one, then make the backend grow that scratch */
    const int rows = 4000, cols = 8192;
    float *big = galloc(sizeof(float) * (size_t)rows * cols);
    int32_t *ids = galloc(sizeof(int32_t) * rows);
    gpu->argmax(gpu, da, 1, n, ids, NULL);
    gpu->capture_begin(gpu);
    gpu->argmax(gpu, da, 1, n, ids, NULL);
    g = gpu->capture_end(gpu, NULL);
    gpu->capture_begin(gpu);
    gpu->argmax(gpu, big, rows, cols, ids, NULL);
    void *too_big = gpu->capture_end(gpu, NULL);
    expect(g && !too_big, "a recording that needs more scratch fails");
    gpu->argmax(gpu, big, rows, cols, ids, NULL);
    expect(g && !gpu->graph_launch(gpu, g), "a graph over replaced scratch is refused");
    if (g) gpu->graph_free(gpu, g);
    gpu->sync(gpu);
    gpu->free(gpu, da); gpu->free(gpu, db); gpu->free(gpu, dy); gpu->free(gpu, big); gpu->free(gpu, ids);
    free(a); free(b); free(y); free(ref);
}

/* ---- memory ------------------------------------------------------------------------------------ */

static void test_memory(void) {
    const size_t n = 3 << 20; /* larger than half the upload staging: the direct path too */
    unsigned char *a = xmalloc(n), *b = xmalloc(n), *z = xmalloc(4096);
    for (size_t i = 0; i < n; i++) a[i] = (unsigned char)(i * 131 + 7);
    unsigned char *d = galloc(n), *e = galloc(n);
    gget(z, d, 4096);
    static const unsigned char zero[4096];
    check_bits("alloc", "zeroed", z, zero, 4096);
    gpu->upload(gpu, d, a, n);
    gpu->copy(gpu, e, d, n);
    gget(b, e, n);
    check_bits("upload+copy", "3 MiB", b, a, n);
    /* many small uploads from one reused host buffer (the model's metadata pattern) wrap the
     * staging halves; each must land intact */
    int32_t v[1000];
    int32_t *dv = galloc(sizeof v * 64);
    for (int k = 0; k < 64 * 50; k++) {
        for (int i = 0; i < 1000; i++) v[i] = k * 1000 + i;
        gpu->upload(gpu, dv + (k % 64) * 1000, v, sizeof v);
    }
    int32_t *got = xmalloc(sizeof v * 64), *exp = xmalloc(sizeof v * 64);
    gget(got, dv, sizeof v * 64);
    for (int j = 0; j < 64; j++)
        for (int i = 0; i < 1000; i++) exp[j * 1000 + i] = (64 * 49 + j) * 1000 + i;
    check_bits("upload", "3200 x 4000 B reused host buffer", got, exp, sizeof v * 64);
    gpu->free(gpu, d); gpu->free(gpu, e); gpu->free(gpu, dv);
    free(a); free(b); free(z); free(got); free(exp);
}

/* ---- bench ------------------------------------------------------------------------------------- */

#define BENCH_CHECK(call)                                                                     \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess) { fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e_)); exit(2); } \
    } while (0)

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Replay a captured graph of `iters` calls `reps` times (at most 16), free it, and return the
 * median µs per call. */
static double graph_us_per_call(void *g, int reps, int iters, cudaEvent_t e0, cudaEvent_t e1) {
    if (!g) { fprintf(stderr, "capture failed\n"); exit(2); }
    cudaStream_t s = (cudaStream_t)backend_cuda_stream(gpu);
    float ts[16];
    for (int r = 0; r < reps; r++) {
        BENCH_CHECK(cudaEventRecord(e0, s));
        if (!gpu->graph_launch(gpu, g)) { fprintf(stderr, "graph stale\n"); exit(2); }
        BENCH_CHECK(cudaEventRecord(e1, s));
        BENCH_CHECK(cudaEventSynchronize(e1));
        BENCH_CHECK(cudaEventElapsedTime(&ts[r], e0, e1));
    }
    gpu->graph_free(gpu, g);
    qsort(ts, reps, sizeof ts[0], cmp_float);
    return ts[reps / 2] * 1e3 / iters;
}

/* A matmul whose input an op forms (in the matvec, or by a kernel before it), timed as a graph
 * of `iters` calls (no host in the loop): what a decode (1 row) or verify (3 rows) step runs
 * per layer. op: 0 norm_matmul_n (+m),
 * 1 swiglu_matmul, 2 rmsnorm_gated_matmul (groups of 64), 3 mul_sigmoid_matmul (heads of 64). */
static void bench_formed(cudaEvent_t e0, cudaEvent_t e1, int op, int n_in, int n_out, int nt) {
    static const char *names[] = {"norm_matmul", "swiglu_matmul", "rmsnorm_gated_matmul", "mul_sigmoid_matmul"};
    const int reps = 7, iters = 50;
    struct hweight hw = make_weight(GGML_TYPE_Q8_0, n_in, n_out);
    struct bweight w = {0};
    gpu->weight_init(gpu, &w, GGML_TYPE_Q8_0, n_in, n_out, hw.data);
    const struct bweight *pw = &w;
    const size_t nx = (size_t)nt * n_in;
    float *x = xmalloc(sizeof(float) * nx);
    fill(x, nx, 1.0f);
    float *dx = gdup(x, sizeof(float) * nx), *dm = gdup(x, sizeof(float) * nx), *dw = gdup(x, sizeof(float) * n_in);
    float *dxo = galloc(sizeof(float) * nx), *da = galloc(sizeof(float) * nx), *dy = galloc(sizeof(float) * nt * n_out);
    /* one call first: it sizes the backend's scratch, which a capture cannot allocate */
    for (int i = -1; i < iters; i++) {
        if (i == 0) gpu->capture_begin(gpu);
        if (op == 0) norm_matmul_n(gpu, dx, dm, dxo, dw, 1e-6f, da, &pw, &dy, 1, nt);
        else if (op == 1) swiglu_matmul(gpu, &w, dx, dm, nt, dy);
        else if (op == 2) rmsnorm_gated_matmul(gpu, dx, dw, dm, 64, 1e-6f, da, &w, nt, dy);
        else mul_sigmoid_matmul(gpu, dx, dm, n_in / 64, 64, n_in, 64, &w, nt, dy);
    }
    printf("%-22s q8_0 %5d -> %5d rows %d graph: %7.2f us per call\n", names[op], n_in, n_out, nt,
           graph_us_per_call(gpu->capture_end(gpu, NULL), reps, iters, e0, e1));
    gpu->free(gpu, dx); gpu->free(gpu, dm); gpu->free(gpu, dw); gpu->free(gpu, dxo); gpu->free(gpu, da); gpu->free(gpu, dy);
    gpu->weight_free(gpu, &w);
    free(x);
    free_hweight(&hw);
}

/* Decode / verify attention over a cache of len rows (n_head / n_head_kv heads of D, K and V of
 * types tk / tv), as a graph of `iters` calls: the split + merge kernels a step runs per
 * attention layer; GB/s of the cache rows the call reads once. The cache is sized for the
 * view's max_rows, as a context of len + n_tok would be. */
static void bench_attention(cudaEvent_t e0, cudaEvent_t e1, int n_tok, int len, int n_head, int n_head_kv, int D,
                            enum ggml_type tk, enum ggml_type tv) {
    const int kvd = n_head_kv * D, qs = 2 * n_head * D, reps = 7, iters = 50, cells = len + n_tok;
    const size_t krb = ggml_row_size(tk, kvd), vrb = ggml_row_size(tv, kvd);
    float *q = xmalloc(sizeof(float) * n_tok * qs), *row = xmalloc(sizeof(float) * kvd);
    uint8_t *kc = xmalloc(krb * cells), *vc = xmalloc(vrb * cells);
    int32_t cell0[8], nctx[8];
    fill(q, (size_t)n_tok * qs, 1.5f);
    for (int c = 0; c < cells; c++) {
        fill(row, (size_t)kvd, 2.0f);
        quant_quantize_row_ref(tk, row, kc + (size_t)c * krb, kvd);
        fill(row, (size_t)kvd, 3.0f);
        quant_quantize_row_ref(tv, row, vc + (size_t)c * vrb, kvd);
    }
    for (int t = 0; t < n_tok; t++) { cell0[t] = 0; nctx[t] = len + t + 1; }
    float *dq = gdup(q, sizeof(float) * n_tok * qs), *dout = galloc(sizeof(float) * n_tok * n_head * D);
    uint8_t *dk = gdup(kc, krb * cells), *dv = gdup(vc, vrb * cells);
    int32_t *dc0 = gdup(cell0, sizeof(int32_t) * n_tok), *dn = gdup(nctx, sizeof(int32_t) * n_tok);
    struct kv_view kvg = kv_view_make(tk, tv, n_head_kv, D, dk, dv);
    kvg.max_rows = cells;
    for (int i = -1; i < iters; i++) {
        if (i == 0) gpu->capture_begin(gpu);
        gpu->attention(gpu, dq, qs, 2 * D, &kvg, dc0, dn, n_tok, n_head, 1.0f / sqrtf((float)D), dout);
    }
    const double us = graph_us_per_call(gpu->capture_end(gpu, NULL), reps, iters, e0, e1);
    printf("attention %2d/%d heads of %3d K %-4s V %-4s rows %d, cache %5d graph: %8.2f us per call, %6.1f GB/s\n",
           n_head, n_head_kv, D, ggml_type_traits_get(tk)->name, ggml_type_traits_get(tv)->name, n_tok, len, us,
           (double)len * (krb + vrb) / us * 1e-3);
    gpu->free(gpu, dq); gpu->free(gpu, dout); gpu->free(gpu, dk); gpu->free(gpu, dv); gpu->free(gpu, dc0); gpu->free(gpu, dn);
    free(q); free(row); free(kc); free(vc);
}

/* A matmul of weight type t, n_in -> n_out, at each row count: µs per call, GB/s of weights
 * against the copy, TOP/s; at 1-2 rows as a graph too. Weights rotate over copies so the working
 * set is well beyond the L2. */
static void bench_matmul(enum ggml_type t, int n_in, int n_out, const int *rows, int n_rows, double copy_gbps,
                         cudaEvent_t e0, cudaEvent_t e1) {
    cudaStream_t s = (cudaStream_t)backend_cuda_stream(gpu);
    const int reps = 7, iters = 50;
    float ts[16];
    const char *tn = ggml_type_traits_get(t)->name;
    const size_t rb = ggml_row_size(t, n_in), bytes = rb * n_out;
    int n_copies = (int)((((size_t)512 << 20) + bytes - 1) / bytes);
    if (n_copies > 16) n_copies = 16;
    /* random weight bytes with sane scales: quantize a few rows and repeat them */
    unsigned char *h = xmalloc(bytes);
    float *row = xmalloc(sizeof(float) * n_in);
    for (int o = 0; o < 64 && o < n_out; o++) {
        fill(row, n_in, 1.0f);
        quant_quantize_row_ref(t, row, h + (size_t)o * rb, n_in);
    }
    for (int o = 64; o < n_out; o++) memcpy(h + (size_t)o * rb, h + (size_t)(o % 64) * rb, rb);
    struct bweight w[16];
    for (int c = 0; c < n_copies; c++) {
        memset(&w[c], 0, sizeof w[c]);
        if (gpu->weight_init(gpu, &w[c], t, n_in, n_out, h)) { fprintf(stderr, "weight_init failed\n"); exit(2); }
    }
    float *x = xmalloc(sizeof(float) * 512 * n_in);
    fill(x, (size_t)512 * n_in, 1.0f);
    float *dx = gdup(x, sizeof(float) * 512 * n_in), *dy = galloc(sizeof(float) * 512 * (size_t)n_out);
    for (int ri = 0; ri < n_rows; ri++) {
        const int nt = rows[ri];
        if ((double)nt * n_out > 2.6e7) continue; /* the 512-row LM head needs 0.5 GB of output */
        gpu->set_prompt(gpu, gpu->prompt_family(gpu, nt)); /* a prompt of nt tokens' kernels */
        for (int i = 0; i < 3; i++) matmul1(gpu, &w[i % n_copies], dx, nt, dy);
        double host_us = 1e30;
        for (int r = 0; r < reps; r++) {
            BENCH_CHECK(cudaEventRecord(e0, s));
            const int64_t h0 = coti_time_us();
            for (int i = 0; i < iters; i++) matmul1(gpu, &w[i % n_copies], dx, nt, dy);
            host_us = fmin(host_us, (double)(coti_time_us() - h0) / iters);
            BENCH_CHECK(cudaEventRecord(e1, s));
            BENCH_CHECK(cudaEventSynchronize(e1));
            BENCH_CHECK(cudaEventElapsedTime(&ts[r], e0, e1));
        }
        qsort(ts, reps, sizeof ts[0], cmp_float);
        const double us = ts[reps / 2] * 1e3 / iters, gbps = bytes / (us * 1e-6) / 1e9;
        const double tops = 2.0 * n_in * (double)n_out * nt / (us * 1e-6) / 1e12;
        printf("matmul %-5s %5d -> %6d rows %3d: %9.2f us %7.1f GB/s %5.1f%% of copy %6.1f TOP/s (spread %.2f..%.2f us, %d copies; host %.2f us/call)\n",
               tn, n_in, n_out, nt, us, gbps, 100.0 * gbps / copy_gbps, tops, ts[0] * 1e3 / iters,
               ts[reps - 1] * 1e3 / iters, n_copies, host_us);
        if (nt <= 2) { /* the same calls recorded once as a graph and replayed: no host in the loop */
            gpu->capture_begin(gpu);
            for (int i = 0; i < iters; i++) matmul1(gpu, &w[i % n_copies], dx, nt, dy);
            const double gus = graph_us_per_call(gpu->capture_end(gpu, NULL), reps, iters, e0, e1);
            const double ggbps = bytes / (gus * 1e-6) / 1e9;
            printf("matmul %-5s %5d -> %6d rows %3d graph: %9.2f us %7.1f GB/s %5.1f%% of copy\n", tn, n_in, n_out,
                   nt, gus, ggbps, 100.0 * ggbps / copy_gbps);
        }
    }
    gpu->set_prompt(gpu, 0);
    for (int c = 0; c < n_copies; c++) gpu->weight_free(gpu, &w[c]);
    gpu->free(gpu, dx);
    gpu->free(gpu, dy);
    free(h); free(row); free(x);
}

/* Median over reps of (time of `iters` calls)/iters, in µs, with CUDA events on the backend's
 * stream. Weights rotate over copies so the working set is well beyond the L2. */
static void bench(void) {
    cudaStream_t s = (cudaStream_t)backend_cuda_stream(gpu);
    cudaEvent_t e0, e1;
    BENCH_CHECK(cudaEventCreate(&e0));
    BENCH_CHECK(cudaEventCreate(&e1));
    const int reps = 7;
    float ts[16];
    /* copy baseline: 1 GiB device to device, counted as bytes read + written */
    const size_t cb = (size_t)1 << 30;
    void *ca = galloc(cb), *cbuf = galloc(cb);
    for (int r = 0; r < reps; r++) {
        BENCH_CHECK(cudaEventRecord(e0, s));
        for (int i = 0; i < 5; i++) gpu->copy(gpu, cbuf, ca, cb);
        BENCH_CHECK(cudaEventRecord(e1, s));
        BENCH_CHECK(cudaEventSynchronize(e1));
        BENCH_CHECK(cudaEventElapsedTime(&ts[r], e0, e1));
    }
    qsort(ts, reps, sizeof ts[0], cmp_float);
    const double copy_gbps = 2.0 * cb * 5 / (ts[reps / 2] * 1e-3) / 1e9;
    printf("bench copy d2d 1 GiB: %.1f GB/s (read + write), spread %.1f..%.1f\n", copy_gbps,
           2.0 * cb * 5 / (ts[reps - 1] * 1e-3) / 1e9, 2.0 * cb * 5 / (ts[0] * 1e-3) / 1e9);
    gpu->free(gpu, ca);
    gpu->free(gpu, cbuf);

    /* the floor of one dependent kernel: a chain of tiny adds */
    {
        float *a = galloc(sizeof(float) * 4096);
        double host_us = 1e30;
        for (int r = 0; r < reps; r++) {
            BENCH_CHECK(cudaEventRecord(e0, s));
            const int64_t h0 = coti_time_us();
            for (int i = 0; i < 500; i++) gpu->add(gpu, a, a, 4096, a);
            host_us = fmin(host_us, (double)(coti_time_us() - h0) / 500);
            BENCH_CHECK(cudaEventRecord(e1, s));
            BENCH_CHECK(cudaEventSynchronize(e1));
            BENCH_CHECK(cudaEventElapsedTime(&ts[r], e0, e1));
        }
        qsort(ts, reps, sizeof ts[0], cmp_float);
        printf("bench dependent tiny kernel (add, 4096 floats): %.2f us per launch on the GPU, %.2f us on the host\n",
               ts[reps / 2] * 1e3 / 500, host_us);
        gpu->free(gpu, a);
    }
    /* the tiny model's and the 9B's per-layer matmuls with a formed input, decode and verify rows */
    static const int formed[][3] = {{0, 384, 2304}, {1, 1152, 384}, {2, 512, 384}, {3, 384, 384},
                                    {0, 4096, 4096}, {1, 12288, 4096}, {2, 4096, 4096}, {3, 4096, 4096}};
    for (size_t k = 0; k < sizeof formed / sizeof formed[0] && want("formed"); k++)
        for (int nt = 1; nt <= 4; nt++) bench_formed(e0, e1, formed[k][0], formed[k][1], formed[k][2], nt);
    /* the 9B's heads at short caches (f16); the default model's and the 9B's at 4096 and 32768
     * rows with each cache type */
    static const int att[][2] = {{1, 32}, {1, 160}, {1, 1024}, {3, 160}};
    for (size_t k = 0; k < sizeof att / sizeof att[0] && want("attention"); k++)
        bench_attention(e0, e1, att[k][0], att[k][1], 16, 4, 256, GGML_TYPE_F16, GGML_TYPE_F16);
    static const int att_shape[][3] = {{6, 2, 64}, {16, 4, 256}}, att_len[] = {4096, 32768};
    static const enum ggml_type att_type[][2] = {{GGML_TYPE_F16, GGML_TYPE_F16}, {GGML_TYPE_Q8_0, GGML_TYPE_Q8_0},
                                                 {GGML_TYPE_Q4_0, GGML_TYPE_Q4_0}, {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0}};
    for (int sh = 0; sh < 2 && want("attention"); sh++)
        for (int li = 0; li < 2; li++)
            for (int ty = 0; ty < 4; ty++)
                for (int nt = 1; nt <= 4; nt += 3)
                    bench_attention(e0, e1, nt, att_len[li], att_shape[sh][0], att_shape[sh][1], att_shape[sh][2],
                                    att_type[ty][0], att_type[ty][1]);
    static const int shapes[][2] = {{384, 384}, {384, 16384}, {4096, 4096}, {4096, 12288}, {12288, 4096}, {4096, 248320}};
    static const int rows[] = {1, 2, 3, 4, 5, 6, 8, 64, 512};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0] && want("matmul"); k++)
        bench_matmul(GGML_TYPE_Q8_0, shapes[k][0], shapes[k][1], rows, 9, copy_gbps, e0, e1);
    /* prefill: the 9B's FFN shapes at 512 rows, per weight type (the tiles) */
    static const enum ggml_type pt[] = {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K};
    static const int prow[] = {512};
    for (size_t i = 0; i < sizeof pt / sizeof pt[0] && want("prefill"); i++) {
        bench_matmul(pt[i], 4096, 12288, prow, 1, copy_gbps, e0, e1);
        bench_matmul(pt[i], 12288, 4096, prow, 1, copy_gbps, e0, e1);
    }
    BENCH_CHECK(cudaEventDestroy(e0));
    BENCH_CHECK(cudaEventDestroy(e1));
}

/* ---- mixture of experts ----------------------------------------------------------------- */

/* moe_route: the same experts in the same order (logits spaced so no two probabilities tie), the
 * weights within 2e-6 relative (expf against glibc's, sums in double on both sides). */
static void test_moe_route(int n_tok, int n_expert, int n_used) {
    char shape[96];
    const size_t nl = (size_t)n_tok * n_expert, nk = (size_t)n_tok * n_used;
    float *l = xmalloc(sizeof(float) * nl), *wc = xmalloc(sizeof(float) * nk), *wg = xmalloc(sizeof(float) * nk);
    int32_t *ic = xmalloc(sizeof(int32_t) * nk), *ig = xmalloc(sizeof(int32_t) * nk);
    for (int t = 0; t < n_tok; t++)
        for (int e = 0; e < n_expert; e++)
            l[(size_t)t * n_expert + e] = 8.0f * (float)((e * 37 + t * 11) % n_expert) / n_expert - 4.0f + 1e-3f * frand();
    float *dl = gdup(l, sizeof(float) * nl), *dw = galloc(sizeof(float) * nk);
    int32_t *di = galloc(sizeof(int32_t) * nk);
    cpu->moe_route(cpu, l, n_tok, n_expert, n_used, ic, wc);
    gpu->moe_route(gpu, dl, n_tok, n_expert, n_used, di, dw);
    gget(ig, di, sizeof(int32_t) * nk);
    gget(wg, dw, sizeof(float) * nk);
    snprintf(shape, sizeof shape, "%d tokens, %d experts top-%d: ids", n_tok, n_expert, n_used);
    check_bits("moe_route", shape, ig, ic, sizeof(int32_t) * nk);
    snprintf(shape, sizeof shape, "%d tokens, %d experts top-%d: weights", n_tok, n_expert, n_used);
    check("moe_route", shape, wg, wc, nk, 1e-7, 2e-6);
    gpu->free(gpu, dl); gpu->free(gpu, dw); gpu->free(gpu, di);
    free(l); free(wc); free(wg); free(ic); free(ig);
}

/* matmul_id against the CPU reference. Quantized weights: both sides convert the inputs to the
 * activation type by the same rule and sum exact integer block products, so they differ by f32
 * reassociation alone, 2e-6 · Σ_i |w_i x_i|. Float weights: the GPU dots with f32 inputs where
 * the CPU first rounds them to f16 / bf16 (at most |x|·2^-8), so Σ_i |w_i| · amax(x)/127 more. Then every slot of token 2 computed alone must be
 * bit-identical to the batch's (a verify row equals its decode row), and a slot whose id is out
 * of range is left as it was. */
static void test_matmul_id(enum ggml_type t, int n_in, int rows, int n_expert, int n_used, int n_tok, int glu) {
    const bool gated = glu != MOE_GLU_NONE; /* the slots' rows are [g ; u] */
    char shape[128];
    const int n_slots = n_tok * n_used, xw = gated ? 2 * n_in : n_in, n_xrows = gated ? n_slots : n_tok;
    struct hweight hw = make_weight(t, n_in, rows * n_expert);
    struct bweight wc = {0}, wg = {0};
    if (cpu->weight_init(cpu, &wc, t, n_in, (int64_t)rows * n_expert, hw.data) ||
        gpu->weight_init(gpu, &wg, t, n_in, (int64_t)rows * n_expert, hw.data)) {
        printf("FAIL  matmul_id %s: weight_init refused\n", ggml_type_traits_get(t)->name);
        n_fail++;
        free_hweight(&hw);
        return;
    }
    int32_t *ids = xmalloc(sizeof(int32_t) * n_slots);
    for (int s = 0; s < n_slots; s++) ids[s] = (int32_t)((s * 7 + s / n_used) % n_expert);
    ids[n_slots - 1] = ids[0]; /* a repeated expert */
    float *x = xmalloc(sizeof(float) * (size_t)n_xrows * xw), *a = xmalloc(sizeof(float) * n_in);
    fill(x, (size_t)n_xrows * xw, 2.0f);
    const int ys = rows + 1;
    float *yc = xmalloc(sizeof(float) * (size_t)n_slots * ys), *yg = xmalloc(sizeof(float) * (size_t)n_slots * ys);
    float *bound = xmalloc(sizeof(float) * (size_t)n_slots * ys), *zero = xmalloc(sizeof(float) * (size_t)n_slots * ys);
    for (int i = 0; i < n_slots * ys; i++) yc[i] = zero[i] = 0.0f;
    struct matmul_id_in in = {.ids = ids, .n_used = n_used, .n_expert = n_expert, .x = x,
                              .tok_stride = gated ? n_used * xw : n_in, .slot_stride = gated ? xw : 0,
                              .glu = (enum moe_glu)glu, .y_stride = ys};
    cpu->matmul_id(cpu, &wc, &in, n_tok, yc);
    for (int sl = 0; sl < n_slots; sl++) {
        const float *xr = x + (size_t)(sl / n_used) * in.tok_stride + (size_t)(sl % n_used) * in.slot_stride;
        double amax = 0;
        if (glu == MOE_GLU_SWIGLU) cpu->swiglu(cpu, xr, xr + n_in, n_in, a);
        else if (glu == MOE_GLU_GEGLU) cpu->geglu(cpu, xr, xr + n_in, n_in, a);
        else memcpy(a, xr, sizeof(float) * n_in);
        for (int i = 0; i < n_in; i++) amax = fmax(amax, fabs(a[i]));
        for (int r = 0; r < rows; r++) {
            const float *wr = hw.deq + ((size_t)ids[sl] * rows + r) * n_in;
            double sw = 0, swx = 0, wmax = 0;
            for (int i = 0; i < n_in; i++) {
                sw += fabs(wr[i]);
                swx += fabs((double)wr[i] * a[i]);
                wmax = fmax(wmax, fabs(wr[i]));
            }
            const bool rounded = t == GGML_TYPE_F16 || t == GGML_TYPE_BF16;
            /* geglu rounds each gelu to f16 on both sides: through tanh's last bits a value may
             * land on the neighbouring f16, one ulp (2^-10 relative) of an input element. And
             * silu's / tanh's expf differ by ulps between CPU and GPU: an activation that close
             * to a rounding edge of its Q8 code takes the neighbouring code on one side, |w_i|·d
             * (d = amax/127) per such element; two are allowed. */
            const bool coded = glu != MOE_GLU_NONE && !rounded && t != GGML_TYPE_F32;
            bound[(size_t)sl * ys + r] = (float)((rounded ? sw * amax / 127.0 : 0.0) + 2e-6 * swx +
                                                 (glu == MOE_GLU_GEGLU ? sw * amax / 1024.0 : 0.0) +
                                                 (coded ? 2.0 * wmax * amax / 127.0 : 0.0) + 1e-30);
        }
    }
    int32_t *di = gdup(ids, sizeof(int32_t) * n_slots);
    float *dx = gdup(x, sizeof(float) * (size_t)n_xrows * xw), *dy = gdup(zero, sizeof(float) * (size_t)n_slots * ys);
    in.ids = di;
    in.x = dx;
    gpu->matmul_id(gpu, &wg, &in, n_tok, dy);
    gget(yg, dy, sizeof(float) * (size_t)n_slots * ys);
    double worst = 0;
    size_t bad = SIZE_MAX;
    for (int sl = 0; sl < n_slots; sl++)
        for (int r = 0; r < ys; r++) {
            const size_t i = (size_t)sl * ys + r;
            const double d = fabs((double)yg[i] - yc[i]), b = r < rows ? bound[i] : 0.0;
            if (r < rows) worst = fmax(worst, d / b);
            if (!(d <= b) && bad == SIZE_MAX) bad = i;
        }
    snprintf(shape, sizeof shape, "%s %dx%d x%d top-%d, %d tok%s", ggml_type_traits_get(t)->name, n_in, rows, n_expert,
             n_used, n_tok, glu == MOE_GLU_SWIGLU ? ", swiglu" : glu == MOE_GLU_GEGLU ? ", geglu" : "");
    const bool ok = bad == SIZE_MAX;
    printf("%-5s %-14s %-44s max |d|/bound %.3f", ok ? "ok" : "FAIL", "matmul_id", shape, worst);
    if (!ok) printf("  first bad [%zu]: got %.9g want %.9g", bad, yg[bad], yc[bad]);
    printf("\n");
    ok ? n_pass++ : n_fail++;
    if (n_tok > 2) { /* token 2 alone */
        float *y1 = galloc(sizeof(float) * (size_t)n_used * ys), *h1 = xmalloc(sizeof(float) * (size_t)n_used * ys);
        struct matmul_id_in one = in;
        one.ids = di + 2 * n_used;
        one.x = dx + (size_t)2 * in.tok_stride;
        gpu->matmul_id(gpu, &wg, &one, 1, y1);
        gget(h1, y1, sizeof(float) * (size_t)n_used * ys);
        bool same = true;
        for (int k = 0; k < n_used; k++)
            same &= memcmp(h1 + (size_t)k * ys, yg + (size_t)(2 * n_used + k) * ys, sizeof(float) * rows) == 0;
        printf("%-5s %-14s %-44s a token alone = in the batch, bit for bit\n", same ? "ok" : "FAIL", "matmul_id", shape);
        same ? n_pass++ : n_fail++;
        gpu->free(gpu, y1);
        free(h1);
    }
    gpu->free(gpu, di); gpu->free(gpu, dx); gpu->free(gpu, dy);
    cpu->weight_free(cpu, &wc);
    gpu->weight_free(gpu, &wg);
    free(ids); free(x); free(a); free(yc); free(yg); free(bound); free(zero);
    free_hweight(&hw);
}

/* moe_sum: the same f32 operations in the same order; sigmoid through expf (2 ulp). scaled:
 * gemma4's form (a per-expert scale, no shared expert). */
static void test_moe_sum(int n_tok, int n_used, int dim, bool scaled) {
    char shape[96];
    const size_t ny = (size_t)n_tok * n_used * dim, no = (size_t)n_tok * dim;
    float *y = xmalloc(sizeof(float) * ny), *w = xmalloc(sizeof(float) * n_tok * n_used), *sh = xmalloc(sizeof(float) * no);
    float *g = xmalloc(sizeof(float) * n_tok), *oc = xmalloc(sizeof(float) * no), *og = xmalloc(sizeof(float) * no);
    fill(y, ny, 2.0f); fill(w, (size_t)n_tok * n_used, 1.0f); fill(sh, no, 2.0f); fill(g, n_tok, 4.0f);
    float *dy = gdup(y, sizeof(float) * ny), *dw = gdup(w, sizeof(float) * n_tok * n_used), *dsh = gdup(sh, sizeof(float) * no);
    float *dg = gdup(g, sizeof(float) * n_tok), *dout = galloc(sizeof(float) * no);
    enum { NE = 16 };
    int32_t *ids = xmalloc(sizeof(int32_t) * n_tok * n_used);
    float es[NE];
    for (int i = 0; i < n_tok * n_used; i++) ids[i] = (i * 5 + 3) % NE;
    fill(es, NE, 1.5f);
    int32_t *di = gdup(ids, sizeof(int32_t) * n_tok * n_used);
    float *des = gdup(es, sizeof es);
    cpu->moe_sum(cpu, y, w, ids, scaled ? es : NULL, n_tok, n_used, dim, scaled ? NULL : sh, scaled ? NULL : g, oc);
    gpu->moe_sum(gpu, dy, dw, di, scaled ? des : NULL, n_tok, n_used, dim, scaled ? NULL : dsh, scaled ? NULL : dg, dout);
    gget(og, dout, sizeof(float) * no);
    gpu->free(gpu, di); gpu->free(gpu, des);
    free(ids);
    snprintf(shape, sizeof shape, "%d tokens, top-%d, dim %d%s", n_tok, n_used, dim, scaled ? ", scaled" : "");
    check("moe_sum", shape, og, oc, no, 1e-6, 2e-6);
    gpu->free(gpu, dy); gpu->free(gpu, dw); gpu->free(gpu, dsh); gpu->free(gpu, dg); gpu->free(gpu, dout);
    free(y); free(w); free(sh); free(g); free(oc); free(og);
}

/* ---- the registry: a test for every op of backend_ops.h (main fails for one without) ------ */

static void test_fused_matmuls(void) {
    test_fused_matmul(GGML_TYPE_Q8_0, 4096, 64);
    test_fused_matmul(GGML_TYPE_Q8_0, 4096, 1000);  /* warps with two row sets */
    test_fused_matmul(GGML_TYPE_Q4_1, 2112, 300);   /* Q8_1 codes, stride padding */
    test_fused_matmul(GGML_TYPE_Q8_0, 12288, 40);   /* wider than a matvec quantizes: formed grid-wide */
    test_fused_matmul(GGML_TYPE_Q4_1, 5120, 11);    /* the same with Q8_1 activations */
    test_fused_matmul(GGML_TYPE_Q8_0, 384, 130);    /* the tiny model's width (stride padding) */
    test_fused_matmul(GGML_TYPE_Q8_0, 768, 50);     /* the NextN head's eh_proj input (two halves of 384) */
    test_fused_matmul(GGML_TYPE_Q4_0, 96, 5);
    test_fused_matmul(GGML_TYPE_Q4_1, 256, 11);     /* Q8_1 activations */
    test_fused_matmul(GGML_TYPE_Q4_K, 2304, 37);    /* Q8_K activations */
    test_fused_matmul(GGML_TYPE_Q6_K, 256, 9);
    test_fused_matmul(GGML_TYPE_F16, 1024, 20);     /* never fused: both paths unfused */
}

/* A prompt takes the f16 tensor-core matmul under the rules (matmul_choose.cu): against the
 * exact product of the dequantized weights (double) within the f16 rounding bound, its rows
 * independent of the batch (the first 1, 7 and nt - 40 tokens alone, and token 5 alone, give
 * the same bits), and seen to run. Shapes past the tiles' edges: rows and tokens not multiples of
 * 128, an odd count of 32-element units (a K tile's second unit past the row). */
static void test_matmul_prompt_f16(enum ggml_type t, int n_in, int n_out, int nt) {
    const char *tn = ggml_type_traits_get(t)->name;
    struct hweight hw = make_weight(t, n_in, n_out);
    struct bweight wg = {0};
    gpu->weight_init(gpu, &wg, t, n_in, n_out, hw.data);
    float *x = xmalloc(sizeof(float) * (size_t)nt * n_in), *yx = xmalloc(sizeof(float) * (size_t)nt * n_out);
    float *yg = xmalloc(sizeof(float) * (size_t)nt * n_out), *scale = xmalloc(sizeof(float) * (size_t)nt * n_out);
    for (int tk = 0; tk < nt; tk++) fill(x + (size_t)tk * n_in, n_in, tk % 3 == 0 ? 3.0f : 0.7f);
    dot_scale(&hw, x, nt, scale);
    for (int tk = 0; tk < nt; tk++)
        for (int o = 0; o < n_out; o++) {
            double s = 0;
            for (int i = 0; i < n_in; i++) s += (double)hw.deq[(size_t)o * n_in + i] * x[(size_t)tk * n_in + i];
            yx[(size_t)tk * n_out + o] = (float)s;
        }
    float *dx = gdup(x, sizeof(float) * (size_t)nt * n_in), *dy = galloc(sizeof(float) * (size_t)nt * n_out);
    const long before = backend_cuda_matvec_launches(gpu, CUDA_MV_F16);
    prompt_matmul1(LONG_PROMPT, &wg, dx, nt, dy);
    gget(yg, dy, sizeof(float) * (size_t)nt * n_out);
    char shape[96];
    snprintf(shape, sizeof shape, "%s %dx%d tok %d prompt", tn, n_in, n_out, nt);
    const bool ran = backend_cuda_matvec_launches(gpu, CUDA_MV_F16) > before;
    printf("%-5s %-14s %-44s %s\n", ran ? "ok" : "FAIL", "matmul-f16", shape, ran ? "ran" : "did not run");
    ran ? n_pass++ : n_fail++;
    check_scaled("matmul-f16", shape, yg, yx, scale, (size_t)nt * n_out, MMF_TOL);
    /* the rows of a prompt equal those of any shorter one, down to a single token */
    float *yg2 = xmalloc(sizeof(float) * (size_t)nt * n_out);
    const int sub_tok[] = {1, 7, nt - 40};
    for (int k = 0; k < 3; k++) {
        prompt_matmul1(LONG_PROMPT, &wg, dx, sub_tok[k], dy);
        gget(yg2, dy, sizeof(float) * (size_t)sub_tok[k] * n_out);
        snprintf(shape, sizeof shape, "%s %dx%d tok %d of %d prompt", tn, n_in, n_out, sub_tok[k], nt);
        check_bits("matmul-f16-batch", shape, yg2, yg, sizeof(float) * (size_t)sub_tok[k] * n_out);
    }
    prompt_matmul1(LONG_PROMPT, &wg, dx + (size_t)5 * n_in, 1, dy);
    gget(yg2, dy, sizeof(float) * n_out);
    snprintf(shape, sizeof shape, "%s %dx%d token 5 of %d alone prompt", tn, n_in, n_out, nt);
    check_bits("matmul-f16-batch", shape, yg2, yg + (size_t)5 * n_out, sizeof(float) * n_out);
    gpu->free(gpu, dx);
    gpu->free(gpu, dy);
    gpu->weight_free(gpu, &wg);
    free(x); free(yx); free(yg); free(yg2); free(scale);
    free_hweight(&hw);
}

/* Every matmul input kind and weight type under the rules, then with each kernel variant
 * forced (where it can run; elsewhere the rules choose): every variant against the CPU
 * reference, and each one seen to run. */
static void run_matmul(void) {
    static const char *const names[CUDA_MV_COUNT] = {"auto", "converted", "staged", "fused", "direct", "tiles", "f16"};
    for (int v = CUDA_MV_AUTO; v < CUDA_MV_COUNT; v++) {
        printf("---- matmul variant %s\n", names[v]);
        mv_forced = v;
        backend_cuda_force_matvec(gpu, v);
        const long before = backend_cuda_matvec_launches(gpu, v);
        for_weight_shapes(test_matmul_type);
        test_matmul_n();
        test_fused_matmuls();
        if (v != CUDA_MV_AUTO) {
            const bool ran = backend_cuda_matvec_launches(gpu, v) > before;
            printf("%-5s %-14s %-44s\n", ran ? "ok" : "FAIL", "matmul", ran ? "the forced variant ran" : "the forced variant never ran");
            ran ? n_pass++ : n_fail++;
        }
    }
    mv_forced = CUDA_MV_AUTO;
    backend_cuda_force_matvec(gpu, CUDA_MV_AUTO);
    test_matmul_prompt_f16(GGML_TYPE_Q8_0, 512, 300, 330);
    test_matmul_prompt_f16(GGML_TYPE_Q8_0, 800, 129, 300); /* 25 units: a K tile's second unit past the row */
    test_matmul_prompt_f16(GGML_TYPE_Q4_0, 544, 260, 297);
    test_matmul_prompt_f16(GGML_TYPE_Q4_1, 512, 140, 300);
    test_matmul_prompt_f16(GGML_TYPE_Q5_0, 416, 130, 300);
    test_matmul_prompt_f16(GGML_TYPE_Q5_1, 512, 131, 300);
    test_matmul_prompt_f16(GGML_TYPE_Q4_K, 768, 200, 300);
    test_matmul_prompt_f16(GGML_TYPE_Q5_K, 512, 257, 296);
    test_matmul_prompt_f16(GGML_TYPE_Q6_K, 1024, 300, 384);
}
static void run_get_rows(void) { for_weight_shapes(test_get_rows_type); }
static void run_rmsnorm(void) {
    test_rmsnorm(5, 384, 384, 384, false);
    test_rmsnorm(3, 4096, 4096, 4096, false);
    test_rmsnorm(4 * 16, 256, 512, 512, true);   /* per-head q norm over [q ; gate] rows */
    test_rmsnorm(3, 384, 384, 768, false);       /* into half of a concatenated row */
    test_rmsnorm(1, 5000, 5000, 5000, false);
    test_rmsnorm(2, 9000, 9000, 9000, false);    /* past the registers of a block row */
    test_rmsnorm(5, 300, 300, 300, false);       /* past the registers of a warp row */
}
static void run_rmsnorm_gated(void) { test_rmsnorm_gated(4 * 32, 128); test_rmsnorm_gated(3, 1500); }
static void run_rmsnorm_add(void) { test_rmsnorm_add(1, 256, 1.0f); test_rmsnorm_add(5, 640, 0.83f); test_rmsnorm_add(3, 3000, 1.7f); }
static void run_add_rmsnorm(void) { test_add_rmsnorm(1, 4096); test_add_rmsnorm(3, 9000); test_add_rmsnorm(5, 384); test_add_rmsnorm(9, 300); }
static void run_add(void) { test_elementwise(1, false); test_elementwise(12289, false); test_elementwise(3 * 12288, false); }
static void run_swiglu(void) { test_elementwise(1, true); test_elementwise(12289, true); test_elementwise(3 * 12288, true); }
static void run_gemma_elementwise(void) { test_gemma_elementwise(1); test_gemma_elementwise(10240); }
static void run_mul_sigmoid(void) { test_mul_sigmoid(1, 16, 256); test_mul_sigmoid(5, 3, 100); }
static void run_rope_neox(void) {
    test_rope(1, 16, 256, 64, 2 * 16 * 256, 2 * 256, 7);
    test_rope(5, 4, 256, 64, 4 * 256, 256, 30000);
    test_rope(3, 2, 128, 128, 2 * 128, 128, 100000);
    test_rope(70, 8, 64, 32, 8 * 64, 64, 0);
}
static void run_attn_prep(void) {
    test_attn_prep(1, 16, 4, 256, 64, 8, false, false);   /* the 9B's shape, decode */
    test_attn_prep(5, 6, 2, 64, 64, 12, false, false);    /* the tiny model's, a verify batch */
    test_attn_prep(3, 4, 2, 128, 96, 4, false, false);    /* rotation not a multiple of the warp */
    test_attn_prep(3, 4, 2, 128, 128, 6, true, false);    /* gemma4's full layer: partial rotation, v norm */
    test_attn_prep(3, 4, 1, 128, 128, 6, true, true);     /* ... K = V, and a ring's second store */
    test_attn_prep(2, 4, 1, 64, 64, 6, true, true);
    test_attn_prep_q_only(4, 2, 64, 64);                /* the assistant's sliding layer */
    test_attn_prep_q_only(4, 1, 128, 128);
    /* the other cache types (-ctk / -ctv): bytes of the separate kernels and of the CPU */
    test_attn_prep_types(GGML_TYPE_Q8_0, GGML_TYPE_Q8_0, 5, 6, 2, 64, 64, 12, false, false);
    test_attn_prep_types(GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, 1, 16, 4, 256, 64, 8, false, false);
    test_attn_prep_types(GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, 3, 4, 1, 128, 128, 6, true, true);
    test_attn_prep_types(GGML_TYPE_BF16, GGML_TYPE_Q8_0, 3, 4, 2, 128, 96, 4, false, false);
}
static void run_kv_store(void) {
    const enum ggml_type f16 = GGML_TYPE_F16, bf16 = GGML_TYPE_BF16, q8 = GGML_TYPE_Q8_0, q4 = GGML_TYPE_Q4_0;
    test_kv_store(f16, f16, 1, 1, 1024, 10);
    test_kv_store(f16, f16, 9, 1, 512, 20);
    test_kv_store(f16, f16, 3, 1, 100, 5);
    test_kv_store(q8, q8, 9, 4, 128, 20);
    test_kv_store(q4, q4, 3, 2, 256, 5);
    test_kv_store(q8, q4, 1, 16, 64, 10);
    test_kv_store(bf16, bf16, 3, 1, 100, 5);
    test_kv_store(f16, q8, 4, 2, 512, 8);
}
static void run_attention(void) {
    test_attention(1, 0, 16, 4, 256, 0);     /* first token */
    test_attention(1, 700, 16, 4, 256, 1);   /* decode, second sequence */
    test_attention(4, 300, 16, 4, 256, 0);   /* verify batch */
    test_attention(2, 40, 16, 4, 256, 0);    /* short cache: most slices empty */
    test_attention(8, 5000, 8, 2, 128, 2);   /* verify batch, long cache */
    test_attention(40, 0, 4, 1, 64, 0);      /* prefill */
    test_attention(3, 50, 6, 3, 36, 0);      /* head dim not a multiple of 8 */
    test_attention(12, 20, 4, 4, 512, 1);    /* widest head, no GQA */
    test_attention(2, 10, 2, 1, 400, 0);     /* wide, scalar path */
    test_attention(20, 100, 16, 4, 256, 1);  /* prompt: 4 query heads per block */
    test_attention(150, 500, 16, 4, 256, 1); /* prompt tiles: 10 token tiles, 11 key tiles, the last part-full */
    test_attention(100, 0, 8, 1, 128, 0);    /* prompt tiles: 8 query heads a KV head, from the first cell */
    test_attention(10, 30, 4, 2, 512, 0);    /* prompt, widest head: 2 per block */
    test_attention(9, 7, 6, 3, 36, 0);       /* prompt, scalar path, 3 per KV head: 1 per block */
    /* gemma4's trained model: sliding layers (window 128, 2 KV heads of 64), full (1 of 128) */
    test_attention_win(GGML_TYPE_F16, GGML_TYPE_F16, 300, 0, 4, 2, 64, 0, true, 128, -1);
    test_attention_win(GGML_TYPE_F16, GGML_TYPE_F16, 300, 0, 4, 1, 128, 1, true, 0, -1);
    test_attention_win(GGML_TYPE_F16, GGML_TYPE_F16, 5, 200, 4, 2, 64, 0, true, 128, -1);
    /* the other cache types: the same values (exact conversions), the same tolerance */
    const enum ggml_type f16 = GGML_TYPE_F16, bf16 = GGML_TYPE_BF16, q8 = GGML_TYPE_Q8_0, q4 = GGML_TYPE_Q4_0;
    test_attention_types(q8, q8, 1, 700, 16, 4, 256, 1);   /* decode */
    test_attention_types(q8, q8, 4, 300, 16, 4, 256, 0);   /* verify batch */
    test_attention_types(q4, q4, 1, 700, 16, 4, 256, 1);
    test_attention_types(q4, q4, 40, 0, 4, 1, 64, 0);      /* prefill */
    test_attention_types(q8, q4, 8, 5000, 8, 2, 128, 2);   /* asymmetric, long cache */
    test_attention_types(q4, f16, 12, 20, 4, 4, 512, 1);   /* widest head */
    test_attention_types(bf16, bf16, 3, 50, 6, 3, 36, 0);  /* bf16, scalar path */
    test_attention_types(f16, bf16, 2, 10, 2, 1, 400, 0);
    test_attention_types(bf16, q8, 4, 300, 16, 4, 256, 0);
    test_attention_types(q8, q4, 20, 100, 16, 4, 256, 0);  /* prompt, 4 query heads per block */
    /* long caches split past 32 slices (one per 256 rows), narrow heads walked 8 or 16 lanes a
     * row: the default model's 6/2 heads of 64 */
    test_attention(1, 20000, 6, 2, 64, 0);                 /* 79 slices: a part batch of merges */
    test_attention(4, 9000, 6, 2, 64, 1);                  /* verify rows = each alone */
    test_attention(3, 3000, 8, 2, 128, 0);                 /* 16 lanes a row */
    test_attention(10, 70, 6, 2, 64, 0);                   /* prompt, 8 lanes a row */
    test_attention_types(q8, q4, 2, 40000, 6, 2, 64, 0);   /* 128 slices, the most */
    test_attention_types(q4, q4, 3, 33000, 16, 4, 256, 0);
    /* a view that does not say how long it may get: every launch takes the most slices */
    test_attention_win(q8, q8, 3, 12000, 6, 2, 64, 1, false, 0, 0);
}
static void run_ssm_conv(void) {
    test_ssm_conv(1, 8192, 4, 1);
    test_ssm_conv(5, 1000, 4, 3);
    test_ssm_conv(70, 300, 4, 0);
    test_ssm_conv(6, 100, 2, 6);
    test_ssm_conv(4, 77, 16, 2);
    test_ssm_conv(600, 300, 4, 0);   /* a prompt: tokens in parallel */
    test_ssm_conv(40, 64, 4, 40);
}
static void run_state_runs(void) {
    static const int verify[] = {1, 4, 3, 1, 2, 0}, prompts[] = {40, 1, 70, 0}, many[41] = {
        1, 2, 1, 1, 3, 1, 1, 1, 4, 1, 1, 1, 1, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 5, 1, 1, 1, 0};
    test_state_runs(false, verify, "decode and verify rows");
    test_state_runs(false, many, "past one launch's runs");
    test_state_runs(true, prompts, "prompt chunks");
}
static void run_gdn(void) {
    test_gdn(false, 1, 16, 32, 128, 1);
    test_gdn(false, 4, 2, 4, 128, 3);
    test_gdn(false, 70, 2, 4, 16, 0);
    test_gdn(false, 5, 1, 2, 256, 5);
    test_gdn(false, 3, 2, 6, 40, 2);
    test_gdn(false, 70, 2, 4, 128, 40); /* past the staged chunk of 32 tokens, snapshots across it */
    test_gdn(false, 40, 1, 2, 256, 0);  /* chunks of 16 */
    test_gdn(false, 9, 1, 2, 30, 4);    /* rows not in float4s */
    test_gdn(false, 33, 1, 2, 30, 0);   /* a prompt's kernel (> 16 tokens): rows not in float4s */
    test_gdn(false, 34, 2, 4, 40, 0);   /* ... rows in float4s, past the lanes' elements */
    run_state_runs(); /* and ssm_conv over runs */
}
static void run_gdn_chunked(void) { test_gdn(true, 150, 2, 4, 128, 0); test_gdn(true, 64, 2, 4, 16, 0); }
static void run_argmax(void) { test_argmax(1, 248320); test_argmax(5, 1000); test_argmax(3, 4097); }
static void run_accept_greedy(void) {
    for (int n = 0; n <= 8; n += 4)
        for (int miss = 0; miss <= n; miss++) test_accept_greedy(n, miss);
}

static void run_moe_route(void) {
    test_moe_route(1, 256, 8); test_moe_route(5, 16, 4); test_moe_route(70, 64, 2);
    test_moe_route(3, 512, 40); test_moe_route(9, 100, 8); /* past a warp's lanes; not a multiple of 32 */
}
static void run_matmul_id(void) {
    const int none = MOE_GLU_NONE, swiglu = MOE_GLU_SWIGLU, geglu = MOE_GLU_GEGLU;
    for (size_t i = 0; i < sizeof mm_types / sizeof mm_types[0]; i++) {
        const enum ggml_type t = mm_types[i];
        const int n_in = ggml_type_traits_get(t)->block_elems == 256 ? 512 : 256;
        test_matmul_id(t, n_in, 64, 16, 4, 5, none);     /* gate/up rows of a verify batch */
        test_matmul_id(t, n_in, 32, 16, 4, 5, swiglu);   /* down over swiglu slots */
        test_matmul_id(t, n_in, 32, 16, 4, 5, geglu);    /* down over geglu slots (gemma4) */
    }
    test_matmul_id(GGML_TYPE_Q8_0, 2048, 512, 32, 8, 1, none);    /* 35B-A3B's gate widths, decode */
    test_matmul_id(GGML_TYPE_Q4_K, 512, 2048, 32, 8, 1, swiglu);  /* its down's, decode */
    test_matmul_id(GGML_TYPE_Q4_K, 2048, 64, 256, 8, 3, none);    /* 256 experts: blocks for the chosen only */
    test_matmul_id(GGML_TYPE_Q6_K, 512, 40, 512, 8, 5, swiglu);   /* 512 experts, rows not a multiple of 8 */
    test_matmul_id(GGML_TYPE_Q8_0, 256, 48, 8, 2, 300, swiglu);   /* prefill: slot lists past 8 */
    test_matmul_id(GGML_TYPE_Q8_0, 704, 256, 128, 8, 3, geglu);   /* 26B-A4B: 128 experts, down 704 wide */
}
static void run_moe_sum(void) { test_moe_sum(1, 8, 2048, false); test_moe_sum(5, 4, 300, false); test_moe_sum(3, 8, 704, true); }

/* One rank (no split: tp.h): all_reduce leaves x as it is, and the CUDA backend does not offer
 * to be a rank of several (their sum over NCCL is not built). */
static void run_all_reduce(void) {
    const int64_t n = 4099;
    float *x = xmalloc(sizeof(float) * n), *y = xmalloc(sizeof(float) * n);
    fill(x, n, 3.0f);
    float *dx = gdup(x, sizeof(float) * n);
    gpu->all_reduce(gpu, dx, n);
    gget(y, dx, sizeof(float) * n);
    check_bits("all_reduce", "one rank, n 4099", y, x, sizeof(float) * n);
    const bool alone = !gpu->supports(gpu, BACKEND_OP_all_reduce, GGML_TYPE_F32);
    printf("%-5s %-14s %-44s\n", alone ? "ok" : "FAIL", "all_reduce", "no split of several CUDA ranks offered yet");
    alone ? n_pass++ : n_fail++;
    gpu->free(gpu, dx);
    free(x); free(y);
}

static const struct op_test {
    enum backend_op op;
    void (*run)(void);
} op_tests[] = {
    {BACKEND_OP_matmul, run_matmul},
    {BACKEND_OP_get_rows, run_get_rows},
    {BACKEND_OP_rmsnorm, run_rmsnorm},
    {BACKEND_OP_rmsnorm_gated, run_rmsnorm_gated},
    {BACKEND_OP_add_rmsnorm, run_add_rmsnorm},
    {BACKEND_OP_rmsnorm_add, run_rmsnorm_add},
    {BACKEND_OP_add, run_add},
    {BACKEND_OP_swiglu, run_swiglu},
    {BACKEND_OP_geglu, run_gemma_elementwise},
    {BACKEND_OP_scale, run_gemma_elementwise},
    {BACKEND_OP_softcap, run_gemma_elementwise},
    {BACKEND_OP_mul_sigmoid, run_mul_sigmoid},
    {BACKEND_OP_rope_neox, run_rope_neox},
    {BACKEND_OP_attn_prep, run_attn_prep},
    {BACKEND_OP_kv_store, run_kv_store},
    {BACKEND_OP_attention, run_attention},
    {BACKEND_OP_ssm_conv, run_ssm_conv},
    {BACKEND_OP_gdn, run_gdn},
    {BACKEND_OP_gdn_chunked, run_gdn_chunked},
    {BACKEND_OP_argmax, run_argmax},
    {BACKEND_OP_accept_greedy, run_accept_greedy},
    {BACKEND_OP_moe_route, run_moe_route},
    {BACKEND_OP_matmul_id, run_matmul_id},
    {BACKEND_OP_moe_sum, run_moe_sum},
    {BACKEND_OP_all_reduce, run_all_reduce},
};

/* supports() says yes to exactly the weight types weight_init takes, and to f16 caches only */
static void test_supports(void) {
    static unsigned char zeros[4 * 256 * 8];
    bool ok = true;
    int n_taken = 0;
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        if (!ggml_type_supported((enum ggml_type)t)) continue;
        struct bweight w = {0};
        const bool taken = gpu->weight_init(gpu, &w, (enum ggml_type)t, 256, 4, zeros) == 0;
        if (taken) gpu->weight_free(gpu, &w);
        n_taken += taken;
        ok &= gpu->supports(gpu, BACKEND_OP_matmul, (enum ggml_type)t) == taken;
        ok &= gpu->supports(gpu, BACKEND_OP_get_rows, (enum ggml_type)t) == taken;
        ok &= gpu->supports(gpu, BACKEND_OP_matmul_id, (enum ggml_type)t) == taken;
    }
    ok &= n_taken == (int)(sizeof mm_types / sizeof mm_types[0]);
    /* the cache types (-ctk/-ctv), and no other */
    static const enum ggml_type cache_types[] = {GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0};
    for (size_t i = 0; i < sizeof cache_types / sizeof cache_types[0]; i++)
        ok &= gpu->supports(gpu, BACKEND_OP_attention, cache_types[i]) && gpu->supports(gpu, BACKEND_OP_kv_store, cache_types[i]);
    ok &= !gpu->supports(gpu, BACKEND_OP_attention, GGML_TYPE_Q4_K) && !gpu->supports(gpu, BACKEND_OP_attention, GGML_TYPE_F32);
    ok &= gpu->supports(gpu, BACKEND_OP_rmsnorm, GGML_TYPE_F32);
    printf("%-5s %-14s %-44s %d weight types\n", ok ? "ok" : "FAIL", "supports", "= weight_init, the cache types", n_taken);
    ok ? n_pass++ : n_fail++;
}
static void run_copy_n(void) { test_copy_n(1); test_copy_n(14); test_copy_n(70); }
static void run_copy_n_at(void) { test_copy_n_at(12, 0, 3); test_copy_n_at(70, 2, 3); test_copy_n_at(12, 3, 3); }

/* the members of struct backend that are not ops */
static const struct {
    const char *name;
    void (*run)(void);
} member_tests[] = {
    {"memory", test_memory}, {"supports", test_supports}, {"copy_n", run_copy_n}, {"copy_n_at", run_copy_n_at},
    {"marks", test_marks},   {"graphs", test_graphs}, {"side", test_side},
};

int main(int argc, char **argv) {
    bool do_bench = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--bench")) do_bench = true;
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) rng_state = strtoull(argv[++i], NULL, 0) | 1;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else { fprintf(stderr, "usage: %s [--bench] [--seed N] [--only OP]\n", argv[0]); return 2; }
    }
    char err[256] = "";
    gpu = backend_cuda_init(0, err, sizeof err);
    if (!gpu) { fprintf(stderr, "backend_cuda_init: %s\n", err); return 2; }
    if (do_bench) {
        bench();
        backend_free(gpu);
        return 0;
    }
    cpu = backend_cpu_init(1, QUANT_CPU_REF);
    if (!cpu) { fprintf(stderr, "backend_cpu_init failed\n"); return 2; }
    /* each op's tests draw from their own stream, so --only OP sees the data of a full run */
    const uint64_t seed = rng_state;

    for (int op = 0; op < BACKEND_OP_COUNT; op++) {
        const char *name = backend_op_name((enum backend_op)op);
        void (*run)(void) = NULL;
        for (size_t k = 0; k < sizeof op_tests / sizeof op_tests[0]; k++)
            if (op_tests[k].op == (enum backend_op)op) run = op_tests[k].run;
        if (!run) {
            printf("FAIL  %-14s has no entry in op_tests\n", name);
            n_fail++;
        } else if (want(name)) {
            reseed(seed, op);
            run();
        }
    }
    for (size_t k = 0; k < sizeof member_tests / sizeof member_tests[0]; k++)
        if (want(member_tests[k].name)) {
            reseed(seed, BACKEND_OP_COUNT + (int)k);
            member_tests[k].run();
        }

    printf("%d passed, %d failed\n", n_pass, n_fail);
    backend_free(cpu);
    backend_free(gpu);
    return n_fail ? 1 : 0;
}
