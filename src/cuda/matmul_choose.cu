/* matmul_choose.cu — the CUDA matmul op (struct backend's matmul): which kernels run for which
 * input kind, weight type, width and row count, and the launches that follow. Every rule of
 * that choice is in this file, named, with the measurement behind it.
 *
 * Two choices, in this order:
 * 1. How a formed input (struct matmul_in other than PLAIN) reaches the weights (choose_form):
 *    IN_MATVEC  every matvec block forms the input and quantizes it itself: one launch;
 *    DIRECT     a form kernel writes one token's Q8_0 codes for the direct kernel;
 *    GNORM_K    one token's gated norm as Q8_K codes from a form kernel, for the staged matvec;
 *    CODES      one kernel forms the input and writes its Q8 codes, which the matvec reads;
 *    SEPARATE   the op's own kernel writes the formed f32 rows to in->a, then a plain matmul.
 * 2. For each group of weights of one type, its kernel (choose_kernel): FUSED (quantizes f32
 *    rows itself, forming them first where the input is formed), TILES (int8 tensor-core tiles),
 *    F16 (f16 tensor cores over weight tiles decoded in shared memory: long prompts, not
 *    bit-identical),
 *    STAGED (one converted token copied into shared memory first), or CONVERTED (activations
 *    converted by a kernel before it).
 * Each choice first asks what can run (kernel instances, shared memory, shapes: the can_*
 * functions), then the measured rules pick among those. A test may force one variant
 * (backend_cuda_force_matvec): it wins wherever it can run. Every path forms the same values
 * and the same codes; the matvec variants sum every output in one order (bit-identical to one
 * another, whatever the batch), the tiles in the CPU reference's order. */
#include "matmul.cuh"
#include "backend_cuda.h"

#include <string.h>

static const mv_input MV_PLAIN = {MV_IN_X, NULL, NULL, NULL, NULL, 0.0f, 0, 0, 0, NULL};

static const struct mv_type *type_get(const struct bweight *w) {
    const struct mv_type *te = mv_type_find(w->type);
    if (!te) { /* weight_init refused it: a caller bug */
        fprintf(stderr, "cuda: matmul on a weight of unsupported type %d\n", (int)w->type);
        abort();
    }
    return te;
}

bool cuda_weight_type_supported(enum ggml_type t) { return cuda_mm_slot(t) >= 0; }

/* ---- the kernel of a weight group ------------------------------------------------------------ */

/* Whether a weight type's matvec can quantize n_tok activation rows itself: a quantized type,
 * an instance for that many rows (NORM2 has its own, up to MV_NORM2_MAX_NT), and the rows
 * fitting the block's shared memory beside its weight stages (Q4_1 / Q5_0 / Q5_1 stages take
 * 83-99 KB, and took 167-195 KB for two tokens when those ran two rows per warp; the fused
 * kernels' static shared memory is below 1 KB). */
static bool mv_x_fits(const struct cuda_ctx *c, const struct mv_type *te, int n_tok, int stride) {
    const int xb = xs_bytes(te->xf, n_tok, stride);
    return xb <= MV_FUSED_MAX_XBYTES && te->fused_wbytes[n_tok - 1] + xb + 1024 <= c->smem_block_max;
}
static bool can_fuse(const struct cuda_ctx *c, const struct mv_type *te, int n_tok, int stride, int mode) {
    return te->quantized && n_tok <= (mode == MV_IN_NORM2 ? MV_NORM2_MAX_NT : MV_FUSED_MAX_NT) &&
           mv_x_fits(c, te, n_tok, stride);
}

/* Rule: rows a launch forms its input for, by input mode and row width. Every block forms
 * every row, so past one row the forming is paid once per block and row: at 2-4 rows, H200,
 * graphs of 50 calls, µs per call (fused / the op's kernel, a converter and the matvec): a
 * norm 384 -> 2304 5.12 at 2 rows fused against 4.92 at 3 unfused, 4096 -> 4096 15.2 against
 * 12.0; the gated norm, output gate and plain inputs gain at 2 rows only when narrow (tiny
 * gated norm 4.28 fused at 2 against 5.27 unfused at 3; 9B 22.1 against 12.5). */
#define MV_MULTI_FUSE_MAX_N 1536
/* Rule: a plain input wider than this is converted once, grid-wide, not in every block: the
 * 9B's 12288-wide FFN down input, formed and converted by form_q8_kernel (swiglu + codes in one
 * launch) in place of a swiglu kernel and 264 blocks each quantizing 12288 values, went
 * 302.6 -> 317.2 tok/s (H200). */
#define MV_X_FUSE_MAX_N 4096
static int fused_rows_max(int mode, int n) {
    if (mode == MV_IN_X && n > MV_X_FUSE_MAX_N) return 0;
    if (mode == MV_IN_NORM2) return n > MV_MULTI_FUSE_MAX_N ? 1 : MV_NORM2_MAX_NT;
    if (mode == MV_IN_NORM || n > MV_MULTI_FUSE_MAX_N) return 1;
    return MV_FUSED_MAX_NT;
}
static bool fuses(const struct cuda_ctx *c, const struct mv_type *te, int n_tok, int stride, int mode, int n) {
    return can_fuse(c, te, n_tok, stride, mode) && n_tok <= fused_rows_max(mode, n);
}

/* The f16 tensor-core matmul can take this weight type and row length on this device: wgmma
 * needs compute capability 9.0, and the K tiles must divide the row. */
static bool f16_fits(const struct cuda_ctx *c, const struct mv_type *te, int n) {
    return te->quantized && n % MMF_K_MULTIPLE == 0 && c->mmf_ok;
}

/* The kernel for a weight group's n_tok rows of n (mode: what the launch forms, MV_IN_X for rows
 * as they are); converted: the rows come already converted (no launch quantizes them itself).
 * Rules: a prompt's rows of a quantized type, however many, take their family's tiles
 * (cuda_prompt_family, by the prompt's length, never by the batch's rows): the f16 tensor-core
 * matmul (matmul_f16.cu: each weight tile decoded once per 128 tokens; H100, 9B Q8_0, against
 * the int8 tiles: pp512 +21 %, pp4096 +15 %), or the int8 tiles (also where f16_fits says no);
 * either gives a row what it gives in any batch. Then fused where it pays (fuses); one
 * converted token staged in shared memory where it fits (9B FFN down +0.5% decode against
 * reading it in the dot products); else the converted matvec, in groups of
 * MV_MAX_NT rows, which sums every output in one order whatever the batch (a verify row equals
 * the decode row). */

static int choose_kernel(const struct cuda_ctx *c, const struct mv_type *te, int n_tok, int stride, int mode, int n,
                         bool converted) {
    const bool can_staged = n_tok == 1 && te->quantized && mv_x_fits(c, te, 1, stride);
    switch (c->mv_force) {
    case CUDA_MV_FUSED: if (!converted && can_fuse(c, te, n_tok, stride, mode)) return CUDA_MV_FUSED; break;
    case CUDA_MV_TILES: if (!converted && te->quantized) return CUDA_MV_TILES; break;
    case CUDA_MV_F16: if (!converted && f16_fits(c, te, n)) return CUDA_MV_F16; break;
    case CUDA_MV_STAGED: if (can_staged) return CUDA_MV_STAGED; break;
    case CUDA_MV_CONVERTED: if (mode == MV_IN_X) return CUDA_MV_CONVERTED; break;
    default: break;
    }
    if (c->prompt && !converted && te->quantized)
        return c->prompt == CUDA_PROMPT_F16 && f16_fits(c, te, n) ? CUDA_MV_F16 : CUDA_MV_TILES;
    if (!converted && fuses(c, te, n_tok, stride, mode, n)) return CUDA_MV_FUSED;
    if (can_staged) return CUDA_MV_STAGED;
    return CUDA_MV_CONVERTED;
}

/* All token rows of one weight group by kernel k: the converted matvec in groups of 8 rows in
 * one launch (grid.y), the rest in a second. */
static void run_kernel(struct cuda_ctx *c, const struct mv_type *te, int k, const mv_params &P, const float *xf,
                       const xact &x, int n_tok) {
    c->mv_launches[k]++;
    switch (k) {
    case CUDA_MV_FUSED:
        if (P.in.mode == MV_IN_NORM2) te->mv_norm2[n_tok - 1](c, te->slot, P, xf, x, 0, 1);
        else te->mv_fused[n_tok - 1](c, te->slot, P, xf, x, 0, 1);
        return;
    case CUDA_MV_TILES: mmq_run(c, te->slot, P, x, n_tok); return;
    case CUDA_MV_F16: mmf_run(c, te->slot, P, x, n_tok); return;
    case CUDA_MV_STAGED: te->mv_staged(c, te->slot, P, xf, x, 0, 1); return;
    default: {
        const int full = n_tok / MV_MAX_NT, rem = n_tok % MV_MAX_NT;
        if (full) te->mv[MV_MAX_NT - 1](c, te->slot, P, xf, x, 0, full);
        if (rem) te->mv[rem - 1](c, te->slot, P, xf, x, MV_MAX_NT * full, 1);
    }
    }
}

/* ys[i] = ws[i] · input rows; in.mode other than X only where every weight's kernel is FUSED.
 * pre: the rows already converted to the one format every weight reads (or NULL). */
static void matmul_n_with(struct cuda_ctx *c, const struct bweight *const *ws, float *const *ys, int n_w,
                          const float *x, int n_tok, const mv_input &in, const xact *pre = NULL) {
    const int n = (int)ws[0]->n_in, stride = x_stride(n);
    xact xa[XF_COUNT];
    memset(xa, 0, sizeof xa);
    for (int f = 0; f < XF_COUNT; f++) xa[f].stride = stride;
    if (pre) {
        for (int f = 0; f < XF_COUNT; f++) xa[f] = *pre;
    } else {
        bool need[XF_COUNT] = {};
        for (int i = 0; i < n_w; i++) {
            const struct mv_type *te = type_get(ws[i]);
            const int k = choose_kernel(c, te, n_tok, stride, in.mode, n, false);
            if (k != CUDA_MV_FUSED) need[k == CUDA_MV_F16 ? XF_F16 : te->xf] = true;
        }
        size_t total = 0;
        for (int f = 0; f < XF_COUNT; f++)
            if (need[f]) total += xfmt_layout(f, n_tok, stride, NULL, NULL);
        uint8_t *base = total ? (uint8_t *)cuda_scratch(c, &c->xq, &c->xq_size, total) : NULL;
        size_t off = 0;
        for (int f = 0; f < XF_COUNT; f++) {
            if (!need[f]) continue;
            off += xfmt_layout(f, n_tok, stride, base + off, &xa[f]);
            convert_activations(c, f, x, n, n_tok, xa[f]);
        }
    }
    /* one launch per weight type (per 8 weights of it) */
    for (int i = 0; i < n_w; i++) {
        bool seen = false;
        for (int j = 0; j < i; j++) seen |= ws[j]->type == ws[i]->type;
        if (seen) continue;
        const struct mv_type *te = type_get(ws[i]);
        const int k = choose_kernel(c, te, n_tok, stride, in.mode, n, pre != NULL);
        const xact &xk = xa[k == CUDA_MV_F16 ? XF_F16 : te->xf];
        mv_params P;
        memset(&P, 0, sizeof P);
        P.n = n;
        P.n_units = cuda_cdiv(n, 32);
        P.in = in;
        int rows = 0;
        for (int j = i; j < n_w; j++) {
            if (ws[j]->type != ws[i]->type) continue;
            const int w = P.n_w++;
            P.w[w] = (const uint8_t *)ws[j]->data;
            P.y[w] = ys[j];
            P.rb[w] = ws[j]->row_bytes;
            P.row0[w] = rows;
            P.n_out[w] = (int)ws[j]->n_out;
            rows += (int)ws[j]->n_out;
            P.row0[w + 1] = rows;
            if (P.n_w == MV_MAX_W) {
                run_kernel(c, te, k, P, x, xk, n_tok);
                P.n_w = 0;
                rows = 0;
            }
        }
        if (P.n_w) run_kernel(c, te, k, P, x, xk, n_tok);
    }
}

/* ---- how a formed input reaches the weights ------------------------------------------------ */

enum { FORM_IN_MATVEC, FORM_DIRECT, FORM_GNORM_K, FORM_CODES, FORM_SEPARATE };

/* The mv_input a matvec forms for in (the fields its mode reads, the others zero). */
static mv_input mv_input_of(const struct matmul_in *in) {
    switch (in->kind) {
    case MATMUL_RMSNORM: return mv_input{MV_IN_NORM, in->m, in->w, in->x_out, in->a, in->eps, 0, 0, 0, NULL};
    case MATMUL_SWIGLU: return mv_input{MV_IN_SWIGLU, in->m, NULL, NULL, NULL, 0.0f, 0, 0, 0, NULL};
    case MATMUL_GATED_NORM: return mv_input{MV_IN_GNORM, in->m, in->w, NULL, NULL, in->eps, in->dim, 0, 0, NULL};
    case MATMUL_NORM2: return mv_input{MV_IN_NORM2, in->m, in->w, NULL, NULL, in->eps, in->dim, 0, 0, in->w2};
    case MATMUL_SIGMOID_GATE:
        return mv_input{MV_IN_SIGMOID, in->m, NULL, NULL, NULL, 0.0f, in->dim, in->gate_stride, in->gate_head_stride, NULL};
    default: return MV_PLAIN;
    }
}

/* Rule: rows up to this wide are formed in the matvec (FORM_IN_MATVEC). Every block of the grid
 * forms the whole input, which costs less than a kernel boundary for the norms, the gated norm
 * and the output gate up to 4096 wide (9B, H200: 296 -> 302 tok/s for the norms; with one
 * thread per 32-block quantizing, 4096 had lost, 281 -> 237). A swiglu is formed in the matvec
 * only up to 1024 wide: the 9B's 12288-wide one, an expf per element in each of 264 blocks,
 * lost (296 -> 288), and the tiny model's 1152-wide one measured as noise in a build with other
 * changes (notes, session 5; an earlier note here took it for 1024 wide and fused). */
#define MV_FUSE_MAX_N 4096
#define MV_SWIGLU_FUSE_MAX_N 1024

/* Rule: a one-token Q8_0 gated norm or output gate runs as a form kernel + the direct kernel
 * where there is at most a row per warp of its grid, and an input wide enough that forming it
 * in every block costs more than the form kernel's launch. H200, against the fused staged
 * matvec: 9B (4096-wide out- / o-projections) 330.3 -> 345.1 tok/s; the tiny model (384-512
 * wide) off -3%, mtp:2 -2%, so the width bound lies between. */
#define MV_DIRECT_MIN_N 2048

/* Rule: a one-token gated norm for weights that all read Q8_K (the K-quants) and at least this
 * wide is formed once by gnorm_q8K, and the matvec copies its codes (STAGED): formed in each of
 * the 128 blocks of the 35B-A3B's ssm_out (4096 wide, Q4_K), it took 8.4 of the launch's 12.8
 * us (H100, session 17). */
#define MV_GNORM_K_MIN_N 2048

/* Whether every weight reads one Q8 format from a converter (*f): what a form kernel can write. */
static bool one_q8_format(const struct bweight *const *ws, int n_w, int *f) {
    *f = type_get(ws[0])->xf;
    if (*f != XF_Q8_0 && *f != XF_Q8_1) return false;
    for (int i = 0; i < n_w; i++)
        if (type_get(ws[i])->xf != *f) return false;
    return true;
}

static int choose_form(const struct cuda_ctx *c, const struct matmul_in *in, const struct bweight *const *ws, int n_w,
                       int n_tok, int *f) {
    /* a GeGLU is formed by its own kernel: no matvec forms it yet */
    if (in->kind == MATMUL_GEGLU) return FORM_SEPARATE;
    const int n = (int)ws[0]->n_in, stride = x_stride(n), mode = mv_input_of(in).mode;
    const bool per_dim = in->kind == MATMUL_GATED_NORM || in->kind == MATMUL_SIGMOID_GATE;
    const bool shape_ok = (!per_dim || n % in->dim == 0) && (in->kind != MATMUL_NORM2 || n == 2 * in->dim) &&
                          (in->kind != MATMUL_GATED_NORM || n_tok * (n / in->dim) <= MV_GNORM_MAX_GROUPS);
    /* what can run */
    bool all_can_fuse = shape_ok, all_fuse = shape_ok && n <= (in->kind == MATMUL_SWIGLU ? MV_SWIGLU_FUSE_MAX_N : MV_FUSE_MAX_N);
    bool all_q8K = true;
    for (int i = 0; i < n_w; i++) {
        all_can_fuse &= can_fuse(c, type_get(ws[i]), n_tok, stride, mode);
        all_fuse &= fuses(c, type_get(ws[i]), n_tok, stride, mode, n);
        all_q8K &= type_get(ws[i])->xf == XF_Q8_K;
    }
    const bool can_direct = per_dim && n_w == 1 && n_tok == 1 && ws[0]->type == GGML_TYPE_Q8_0 && n % in->dim == 0 &&
                            (in->kind != MATMUL_GATED_NORM || in->dim % 128 == 0);
    const bool can_gnorm_k = in->kind == MATMUL_GATED_NORM && n_tok == 1 && shape_ok && all_q8K;
    const bool can_codes = in->kind != MATMUL_GATED_NORM && in->kind != MATMUL_NORM2 && (!per_dim || n % in->dim == 0) &&
                           one_q8_format(ws, n_w, f);
    switch (c->mv_force) {
    case CUDA_MV_FUSED: if (all_can_fuse) return FORM_IN_MATVEC; break;
    case CUDA_MV_DIRECT: if (can_direct) return FORM_DIRECT; break;
    case CUDA_MV_STAGED: if (can_gnorm_k) return FORM_GNORM_K; return FORM_SEPARATE;
    case CUDA_MV_CONVERTED: return can_codes ? FORM_CODES : FORM_SEPARATE;
    case CUDA_MV_TILES:
    case CUDA_MV_F16: return FORM_SEPARATE;
    default: break;
    }
    /* the rules: a prompt's rows take the tiles (choose_kernel), formed apart */
    if (c->prompt) return FORM_SEPARATE;
    if (can_direct && n >= MV_DIRECT_MIN_N && ws[0]->n_out <= (int64_t)MV_DIRECT_PER_SM * c->n_sm * MV_WARPS)
        return FORM_DIRECT;
    if (can_gnorm_k && n >= MV_GNORM_K_MIN_N) return FORM_GNORM_K;
    if (all_fuse) return FORM_IN_MATVEC;
    /* where the matvec would run after a converter (not the prefill tiles), the kernel that forms
     * the input writes the codes too, one launch fewer per site of a verify batch (a norm at 3
     * rows, H200: 4.92 -> 4.41 µs per site, tiny mtp:2 +2%); at 2 rows the matvec quantizes a
     * plain input itself, which measured faster end to end (mtp:1 -1.5% with the codes from the
     * norm kernel) */
    bool plain_converted = can_codes && n_tok <= MV_MAX_NT;
    for (int i = 0; i < n_w && plain_converted; i++) plain_converted = !fuses(c, type_get(ws[i]), n_tok, stride, MV_IN_X, n);
    if (plain_converted) return FORM_CODES;
    return FORM_SEPARATE;
}

/* in formed by the op's own kernels into in->a (SEPARATE); returns the rows to multiply. */
static const float *form_separate(struct backend *be, struct cuda_ctx *c, const struct matmul_in *in, int n, int n_tok) {
    const size_t n_el = (size_t)n_tok * n;
    switch (in->kind) {
    case MATMUL_RMSNORM: cuda_norm_rows(c, in->x, in->m, in->x_out, in->w, n_tok, n, in->eps, in->a); break;
    case MATMUL_SWIGLU: cuda_swiglu(be, in->x, in->m, (int64_t)n_el, in->a); break;
    case MATMUL_GEGLU: cuda_geglu(be, in->x, in->m, (int64_t)n_el, in->a); break;
    case MATMUL_GATED_NORM: cuda_rmsnorm_gated(be, in->x, in->w, in->m, n_tok * (n / in->dim), in->dim, in->eps, in->a); break;
    case MATMUL_NORM2:
        cuda_rmsnorm(be, in->x, in->dim, in->w, n_tok, in->dim, in->eps, in->a, 2 * in->dim);
        cuda_rmsnorm(be, in->m, in->dim, in->w2, n_tok, in->dim, in->eps, in->a + in->dim, 2 * in->dim);
        break;
    case MATMUL_SIGMOID_GATE:
        if (in->a != in->x) CUDA_CHECK(cudaMemcpyAsync(in->a, in->x, sizeof(float) * n_el, cudaMemcpyDeviceToDevice, c->stream));
        cuda_mul_sigmoid(be, in->a, in->m, n_tok, n / in->dim, in->dim, in->gate_stride, in->gate_head_stride);
        break;
    default: return in->x;
    }
    return in->a;
}

void cuda_matmul(struct backend *be, const struct bweight *const *ws, float *const *ys, int n_w,
                 const struct matmul_in *in, int n_tok) {
    struct cuda_ctx *c = cuda_enter(be);
    if (n_w < 1 || n_tok < 1) return;
    if (in->kind == MATMUL_PLAIN) {
        matmul_n_with(c, ws, ys, n_w, in->x, n_tok, MV_PLAIN);
        return;
    }
    const int n = (int)ws[0]->n_in;
    int f = XF_Q8_0;
    switch (choose_form(c, in, ws, n_w, n_tok, &f)) {
    case FORM_IN_MATVEC: matmul_n_with(c, ws, ys, n_w, in->x, n_tok, mv_input_of(in)); return;
    case FORM_DIRECT: {
        const xact xa = in->kind == MATMUL_GATED_NORM ? gnorm_q8(c, in->x, in->m, in->w, in->dim, in->eps, n)
                                                      : form_q8(c, in->x, n, 1, mv_input_of(in), XF_Q8_0);
        c->mv_launches[CUDA_MV_DIRECT]++;
        mv_direct(c, ws[0], xa, ys[0]);
        return;
    }
    case FORM_GNORM_K: {
        const xact xa = gnorm_q8K(c, in->x, in->m, in->w, in->dim, in->eps, n);
        matmul_n_with(c, ws, ys, n_w, in->x, 1, MV_PLAIN, &xa);
        return;
    }
    case FORM_CODES: {
        if (in->kind == MATMUL_RMSNORM) {
            const xact xa = norm_q8(c, in->x, in->m, in->x_out, in->w, in->eps, in->a, n, n_tok, f);
            matmul_n_with(c, ws, ys, n_w, in->a, n_tok, MV_PLAIN, &xa);
        } else {
            const xact xa = form_q8(c, in->x, n, n_tok, mv_input_of(in), f);
            matmul_n_with(c, ws, ys, n_w, in->x, n_tok, MV_PLAIN, &xa);
        }
        return;
    }
    default: matmul_n_with(c, ws, ys, n_w, form_separate(be, c, in, n, n_tok), n_tok, MV_PLAIN);
    }
}

/* ---- the tests' choice ------------------------------------------------------------------------ */

extern "C" void backend_cuda_force_matvec(struct backend *be, int variant) {
    cuda_ctx_of(be)->mv_force = variant >= 0 && variant < CUDA_MV_COUNT ? variant : CUDA_MV_AUTO;
}

extern "C" long backend_cuda_matvec_launches(struct backend *be, int variant) {
    return variant > CUDA_MV_AUTO && variant < CUDA_MV_COUNT ? cuda_ctx_of(be)->mv_launches[variant] : 0;
}
