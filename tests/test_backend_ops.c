/* test_backend_ops.c — backend ops against plain references on seeded random data:
 * the delta rule (recurrent and chunked forms against an f64 recurrence), conv, attention,
 * rope identities, and the CPU matmul at every SIMD level against the reference level. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "opcost.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
    return (float)((rng_state >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}
static void fill(float *x, size_t n, float scale) { for (size_t i = 0; i < n; i++) x[i] = frand() * scale; }

/* f64 reference of arch-qwen35.md §5.5 (one sequence, all heads), gates formed from their raw
 * inputs as struct gdn_gates describes. */
static void gdn_ref(const float *qkv, int stride, const struct gdn_gates *gt, double *S, int n_tok,
                    int nk, int nv, int dk, int dv, float eps, double *out) {
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < nv; h++) {
            const float *row = qkv + (size_t)t * stride;
            const float *q = row + (h % nk) * dk, *k = row + nk * dk + (h % nk) * dk, *v = row + 2 * nk * dk + h * dv;
            double qn = 0, kn = 0;
            for (int i = 0; i < dk; i++) { qn += (double)q[i] * q[i]; kn += (double)k[i] * k[i]; }
            qn = fmax(sqrt(qn), eps); kn = fmax(sqrt(kn), eps);
            double *Sh = S + (size_t)h * dk * dv;
            const double av = (double)gt->a[(size_t)t * gt->a_stride + h] + gt->dt_bias[h];
            const double decay = exp((av > 20.0 ? av : log1p(exp(av))) * gt->ssm_a[h]);
            const double beta = 1.0 / (1.0 + exp(-(double)gt->b[(size_t)t * gt->b_stride + h]));
            for (int j = 0; j < dv; j++) {
                double kv = 0;
                for (int i = 0; i < dk; i++) { Sh[j * dk + i] *= decay; kv += Sh[j * dk + i] * k[i] / kn; }
                double d = beta * (v[j] - kv), o = 0;
                for (int i = 0; i < dk; i++) { Sh[j * dk + i] += k[i] / kn * d; o += Sh[j * dk + i] * q[i] / qn; }
                out[((size_t)t * nv + h) * dv + j] = o / sqrt((double)dk);
            }
        }
}

/* One sequence's states (sequence 0 of a set). */
static const int32_t seq0[1] = {0};
static struct state_set one_seq(float *state, float *snap, float *pend) {
    return (struct state_set){state, snap, pend, 0, 0, 0, seq0};
}

static void check_gdn_level(bool chunked, int n_tok, float gscale, enum quant_cpu_level level, int dk, int dv) {
    const int nk = 2, nv = 4, ch = 2 * nk * dk + nv * dv;
    struct backend *be = backend_cpu_init(2, level);
    const int as = nv + 1, bs = nv + 2; /* gate rows wider than the heads, as a layer's need not be */
    float *qkv = malloc(sizeof(float) * n_tok * ch), *a = malloc(sizeof(float) * n_tok * as);
    float *b = malloc(sizeof(float) * n_tok * bs), *S = malloc(sizeof(float) * nv * dk * dv);
    float *out = malloc(sizeof(float) * n_tok * nv * dv), dt[4], sa[4];
    double *Sd = malloc(sizeof(double) * nv * dk * dv), *outd = malloc(sizeof(double) * n_tok * nv * dv);
    fill(qkv, (size_t)n_tok * ch, 1.0f);
    /* decays exp(g), g = softplus(a + dt) · ssm_a in about [-1.7, -0.1] · gscale; head 0's
     * a + dt past softplus's threshold (20), its ssm_a scaled to keep g in that range */
    fill(a, (size_t)n_tok * as, 1.0f);
    fill(b, (size_t)n_tok * bs, 3.0f);
    for (int h = 0; h < nv; h++) { dt[h] = 0.5f * frand(); sa[h] = -gscale * (0.75f + 0.25f * frand()); }
    for (int t = 0; t < n_tok; t++) a[(size_t)t * as] = 24.0f + frand();
    sa[0] /= 25.0f;
    const struct gdn_gates gt = {a, b, dt, sa, as, bs};
    fill(S, (size_t)nv * dk * dv, 0.5f);
    for (int i = 0; i < nv * dk * dv; i++) Sd[i] = S[i];
    gdn_ref(qkv, ch, &gt, Sd, n_tok, nk, nv, dk, dv, 1e-6f, outd);
    const struct state_set st = one_seq(S, NULL, NULL);
    const struct state_run run = {0, n_tok, 0, 0, false};
    if (chunked) be->gdn_chunked(be, qkv, ch, &gt, nk, nv, dk, dv, 1e-6f, out, &st, &run, 1);
    else be->gdn(be, qkv, ch, &gt, nk, nv, dk, dv, 1e-6f, out, &st, &run, 1);
    /* f32 against f64: outputs are O(1); a few hundred rounding steps per value */
    double worst = 0, worst_s = 0;
    for (int i = 0; i < n_tok * nv * dv; i++) worst = fmax(worst, fabs(out[i] - outd[i]));
    for (int i = 0; i < nv * dk * dv; i++) worst_s = fmax(worst_s, fabs(S[i] - Sd[i]));
    cr_assert_lt(worst, 2e-5, "%s gdn, %d tokens, level %d: max |dout| %g", chunked ? "chunked" : "recurrent", n_tok, (int)level, worst);
    cr_assert_lt(worst_s, 2e-5, "%s gdn, %d tokens: max |dstate| %g", chunked ? "chunked" : "recurrent", n_tok, worst_s);
    free(qkv); free(a); free(b); free(S); free(out); free(Sd); free(outd);
    backend_free(be);
}

/* every kernel level against the same f64 reference: never a kernel against itself */
static void check_gdn(bool chunked, int n_tok, float gscale) {
    for (int l = QUANT_CPU_REF; l <= (int)quant_cpu_level_detect(); l++) {
        check_gdn_level(chunked, n_tok, gscale, (enum quant_cpu_level)l, 16, 16);
        check_gdn_level(chunked, n_tok, gscale, (enum quant_cpu_level)l, 20, 12); /* vector tails */
        check_gdn_level(chunked, n_tok, gscale, (enum quant_cpu_level)l, 64, 72); /* value rows past one pass */
    }
}

Test(backend_ops, gdn_recurrent_matches_f64_reference) { check_gdn(false, 1, 0.3f); check_gdn(false, 150, 0.3f); check_gdn(false, 150, 4.0f); }
Test(backend_ops, gdn_chunked_matches_f64_reference) { check_gdn(true, 1, 0.3f); check_gdn(true, 64, 0.3f); check_gdn(true, 150, 0.3f); check_gdn(true, 150, 4.0f); check_gdn(true, 150, 0.01f); }

/* A kept run's last row left pending (state_run.defer) and applied by the next call gives, bit
 * for bit, what one run over all the rows gives: outputs, the snapshot and live state after the
 * first run, the state at the end, whether the next call is stepwise, chunked or only applies
 * (no rows); a dropped record leaves the state after the row before. Every CPU level. */
static void check_gdn_pending(enum quant_cpu_level level, int dk, int dv) {
    enum { NK = 2, NV = 4, N1 = 4, N = 80 };
    const int ch = 2 * NK * dk + NV * dv;
    const size_t st = (size_t)NV * dk * dv, pe = gdn_pend_floats(NV, dk, dv);
    struct backend *be = backend_cpu_init(2, level);
    cr_assert(be->gdn_pending);
    float *qkv = malloc(sizeof(float) * N * ch), *a = malloc(sizeof(float) * N * NV), *b = malloc(sizeof(float) * N * NV);
    float dt[NV], sa[NV];
    fill(qkv, (size_t)N * ch, 1.0f);
    fill(a, (size_t)N * NV, 1.0f);
    fill(b, (size_t)N * NV, 3.0f);
    for (int h = 0; h < NV; h++) { dt[h] = 0.5f * frand(); sa[h] = -0.3f * (0.75f + 0.25f * frand()); }
    const struct gdn_gates gt = {a, b, dt, sa, NV, NV};
    float *S0 = malloc(sizeof(float) * st), *Se = malloc(sizeof(float) * st), *Sp = malloc(sizeof(float) * st);
    float *snap_e = calloc(N1 * st, sizeof(float)), *snap_p = calloc(N1 * st, sizeof(float)), *pend = calloc(pe, sizeof(float));
    float *oe = malloc(sizeof(float) * N * NV * dv), *op = malloc(sizeof(float) * N * NV * dv);
    fill(S0, st, 0.5f);
    for (int next = 0; next < 3; next++) { /* the call after the kept run: 0 stepwise, 1 chunked, 2 no rows */
        const int n2 = next == 0 ? 3 : next == 1 ? N - N1 : 0;
        memcpy(Se, S0, sizeof(float) * st);
        memcpy(Sp, S0, sizeof(float) * st);
        /* eagerly: the kept run with a snapshot after each row, then the rest */
        const struct state_set se = one_seq(Se, snap_e, NULL), sp = one_seq(Sp, snap_p, pend);
        const struct state_run e1 = {0, N1, 0, N1 - 1, false}, e2 = {N1, n2, 0, 0, false};
        const struct state_run p1 = {0, N1, 0, N1 - 2, true}, p2 = {N1, n2, 0, 0, false};
        be->gdn(be, qkv, ch, &gt, NK, NV, dk, dv, 1e-6f, oe, &se, &e1, 1);
        be->gdn(be, qkv, ch, &gt, NK, NV, dk, dv, 1e-6f, op, &sp, &p1, 1);
        cr_assert_eq(memcmp(oe, op, sizeof(float) * N1 * NV * dv), 0, "kept run's outputs (level %d, %dx%d)", (int)level, dk, dv);
        for (int h = 0; h < NV; h++) cr_assert_eq(pend[h], 1.0f, "the last row is pending");
        cr_assert_eq(memcmp(snap_e, snap_p, sizeof(float) * (N1 - 2) * st), 0, "snapshots before the row before the last");
        cr_assert_eq(memcmp(snap_e + (N1 - 2) * st, Sp, sizeof(float) * st), 0, "the live state: after the row before the last");
        if (next == 1) {
            be->gdn_chunked(be, qkv, ch, &gt, NK, NV, dk, dv, 1e-6f, oe, &se, &e2, 1);
            be->gdn_chunked(be, qkv, ch, &gt, NK, NV, dk, dv, 1e-6f, op, &sp, &p2, 1);
        } else {
            be->gdn(be, qkv, ch, &gt, NK, NV, dk, dv, 1e-6f, oe, &se, &e2, 1);
            be->gdn(be, qkv, ch, &gt, NK, NV, dk, dv, 1e-6f, op, &sp, &p2, 1);
        }
        for (int h = 0; h < NV; h++) cr_assert_eq(pend[h], 0.0f, "applied, nothing pending");
        cr_assert_eq(memcmp(oe + N1 * NV * dv, op + N1 * NV * dv, sizeof(float) * n2 * NV * dv), 0, "next call's outputs (%d)", next);
        cr_assert_eq(memcmp(Se, Sp, sizeof(float) * st), 0, "states after the next call (%d, level %d)", next, (int)level);
    }
    /* a dropped record: the state stays the one after row N1 - 2, which the next call continues */
    memcpy(Sp, S0, sizeof(float) * st);
    const struct state_set sp = one_seq(Sp, NULL, pend);
    const struct state_run p1 = {0, N1, 0, 0, true}, none = {N1, 0, 0, 0, false};
    be->gdn(be, qkv, ch, &gt, NK, NV, dk, dv, 1e-6f, op, &sp, &p1, 1);
    memset(pend, 0, sizeof(float) * NV);
    be->gdn(be, qkv, ch, &gt, NK, NV, dk, dv, 1e-6f, op, &sp, &none, 1);
    cr_assert_eq(memcmp(snap_e + (N1 - 2) * st, Sp, sizeof(float) * st), 0, "a dropped row leaves no trace");
    free(qkv); free(a); free(b); free(S0); free(Se); free(Sp); free(snap_e); free(snap_p); free(pend); free(oe); free(op);
    backend_free(be);
}

Test(backend_ops, gdn_pending_row_lands_as_the_rule_writes_it) {
    for (int l = QUANT_CPU_REF; l <= (int)quant_cpu_level_detect(); l++) {
        check_gdn_pending((enum quant_cpu_level)l, 16, 16);
        check_gdn_pending((enum quant_cpu_level)l, 20, 12);
        check_gdn_pending((enum quant_cpu_level)l, 64, 72);
    }
}

/* Several sequences' runs in one call (a batched cycle's delta-net) equal each run alone, bit
 * for bit: the conv, the recurrent rule with snapshots, and the chunked rule; the rows between
 * runs (no run's) are left alone; each run works on the sequence state_set.seq names for it. */
Test(backend_ops, state_ops_over_runs_equal_runs_alone) {
    enum { NK = 2, NV = 4, DK = 16, DV = 16, CH = 2 * NK * DK + NV * DV, K = 4, N = 40, NR = 4, KEEP = 3 };
    static const int start[NR] = {0, 3, 4, 16}, len[NR] = {3, 1, 9, 24}; /* row 13-15: no run's */
    static const int32_t seq[NR] = {2, 0, 3, 1};
    const size_t conv_el = (size_t)CH * (K - 1), ssm_el = (size_t)NV * DK * DV;
    struct backend *be = backend_cpu_init(2, quant_cpu_level_detect());
    float *x = malloc(sizeof(float) * N * CH), *w = malloc(sizeof(float) * CH * K), *a = malloc(sizeof(float) * N * NV);
    float *b = malloc(sizeof(float) * N * NV), dt[NV], sa[NV];
    fill(x, (size_t)N * CH, 1.0f);
    fill(w, (size_t)CH * K, 0.5f);
    fill(a, (size_t)N * NV, 1.0f);
    fill(b, (size_t)N * NV, 3.0f);
    for (int h = 0; h < NV; h++) { dt[h] = 0.5f * frand(); sa[h] = -0.3f * (0.75f + 0.25f * frand()); }
    const struct gdn_gates gt = {a, b, dt, sa, NV, NV};
    /* [0]: all runs in one call, [1]: one run per call; states and snapshots per run */
    float *cs[2], *ss[2], *csn[2], *ssn[2], *y[2], *o[2];
    for (int v = 0; v < 2; v++) {
        cs[v] = malloc(sizeof(float) * NR * conv_el);
        ss[v] = malloc(sizeof(float) * NR * ssm_el);
        csn[v] = calloc((size_t)NR * KEEP * conv_el, sizeof(float));
        ssn[v] = calloc((size_t)NR * KEEP * ssm_el, sizeof(float));
        y[v] = malloc(sizeof(float) * N * CH);
        o[v] = malloc(sizeof(float) * N * NV * DV);
        for (size_t i = 0; i < (size_t)N * CH; i++) y[v][i] = 7.0f;
        for (size_t i = 0; i < (size_t)N * NV * DV; i++) o[v][i] = 7.0f;
    }
    fill(cs[0], NR * conv_el, 1.0f);
    fill(ss[0], NR * ssm_el, 0.5f);
    memcpy(cs[1], cs[0], sizeof(float) * NR * conv_el);
    memcpy(ss[1], ss[0], sizeof(float) * NR * ssm_el);
    for (int chunked = 0; chunked < 2; chunked++) {
        /* [0]: the runs in one call, by state_set.seq; [1]: each alone, its sequence's states
         * given directly */
        const struct state_set conv_all = {cs[0], csn[0], NULL, conv_el, KEEP * conv_el, 0, seq};
        const struct state_set rule_all = {ss[0], ssn[0], NULL, ssm_el, KEEP * ssm_el, 0, seq};
        struct state_run runs[NR];
        struct state_set conv_one[NR], rule_one[NR];
        for (int r = 0; r < NR; r++) {
            const int n_snap = chunked ? 0 : COTI_MIN(len[r] - 1, KEEP);
            runs[r] = (struct state_run){start[r], len[r], r, n_snap, false};
            conv_one[r] = one_seq(cs[1] + seq[r] * conv_el, csn[1] + seq[r] * KEEP * conv_el, NULL);
            rule_one[r] = one_seq(ss[1] + seq[r] * ssm_el, ssn[1] + seq[r] * KEEP * ssm_el, NULL);
        }
        be->ssm_conv(be, x, CH, K, w, y[0], &conv_all, runs, NR);
        for (int r = 0; r < NR; r++) {
            const struct state_run alone = {start[r], len[r], 0, runs[r].n_snap, false};
            be->ssm_conv(be, x, CH, K, w, y[1], &conv_one[r], &alone, 1);
        }
        if (chunked) be->gdn_chunked(be, y[0], CH, &gt, NK, NV, DK, DV, 1e-6f, o[0], &rule_all, runs, NR);
        else be->gdn(be, y[0], CH, &gt, NK, NV, DK, DV, 1e-6f, o[0], &rule_all, runs, NR);
        for (int r = 0; r < NR; r++) {
            const struct state_run alone = {start[r], len[r], 0, runs[r].n_snap, false};
            if (chunked) be->gdn_chunked(be, y[1], CH, &gt, NK, NV, DK, DV, 1e-6f, o[1], &rule_one[r], &alone, 1);
            else be->gdn(be, y[1], CH, &gt, NK, NV, DK, DV, 1e-6f, o[1], &rule_one[r], &alone, 1);
        }
        cr_assert_eq(memcmp(y[0], y[1], sizeof(float) * N * CH), 0, "conv outputs (chunked pass %d)", chunked);
        cr_assert_eq(memcmp(o[0], o[1], sizeof(float) * N * NV * DV), 0, "rule outputs (chunked %d)", chunked);
        cr_assert_eq(memcmp(cs[0], cs[1], sizeof(float) * NR * conv_el), 0, "conv states");
        cr_assert_eq(memcmp(ss[0], ss[1], sizeof(float) * NR * ssm_el), 0, "rule states");
        cr_assert_eq(memcmp(csn[0], csn[1], sizeof(float) * NR * KEEP * conv_el), 0, "conv snapshots");
        cr_assert_eq(memcmp(ssn[0], ssn[1], sizeof(float) * NR * KEEP * ssm_el), 0, "rule snapshots");
        cr_assert_eq(y[0][14 * CH], 7.0f, "rows of no run are left alone");
        cr_assert_eq(o[0][14 * NV * DV], 7.0f);
        cr_assert_neq(ssn[0][2 * KEEP * ssm_el], 0.0f, "snapshots were written");
    }
    for (int v = 0; v < 2; v++) { free(cs[v]); free(ss[v]); free(csn[v]); free(ssn[v]); free(y[v]); free(o[v]); }
    free(x); free(w); free(a); free(b);
    backend_free(be);
}

/* f64 attention of q over the first nctx[t] cells of K and V rows given as floats (kvd per
 * cell), into want[t][h][i]. */
static void attention_f64(const float *q, const float *k, const float *v, int n_tok, int H, int HKV, int D,
                          const int32_t *nctx, float scale, double *want) {
    const int kvd = HKV * D;
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < H; h++) {
            const int hk = h / (H / HKV);
            double s[512], mx = -1e300, sum = 0;
            for (int c = 0; c < nctx[t]; c++) {
                double d = 0;
                for (int i = 0; i < D; i++) d += (double)q[(t * H + h) * D + i] * k[c * kvd + hk * D + i];
                s[c] = d * scale;
                if (s[c] > mx) mx = s[c];
            }
            for (int c = 0; c < nctx[t]; c++) { s[c] = exp(s[c] - mx); sum += s[c]; }
            for (int i = 0; i < D; i++) {
                double o = 0;
                for (int c = 0; c < nctx[t]; c++) o += s[c] / sum * v[c * kvd + hk * D + i];
                want[(t * H + h) * D + i] = o;
            }
        }
}

/* The rows kv_store wrote, back as floats (the quant reference's dequantization). */
static float *cache_values(enum ggml_type t, const void *cache, int n_rows, int kvd) {
    float *f = malloc(sizeof(float) * n_rows * kvd);
    const size_t rb = ggml_row_size(t, kvd);
    for (int c = 0; c < n_rows; c++) quant_dequantize_row_ref(t, (const uint8_t *)cache + c * rb, f + (size_t)c * kvd, kvd);
    return f;
}

/* Attention over a cache of K type tk and V type tv at one CPU level, random K/V in [-1, 1):
 * (1) kv_store writes each row as quant_quantize_row_ref does (the reference's bytes, which is
 * what makes a verify's rows equal decode's); (2) the output equals f64 attention over the
 * values as stored to f32 rounding (1e-5: outputs are convex combinations of values in [-1, 1]
 * and the block conversion is exact); (3) against the f16 cache's f64 reference it is off by
 * less than `tol`, the format's rounding at these values (the caller's bound). */
static void check_attention_types(enum quant_cpu_level level, int n_ctx, int D, enum ggml_type tk, enum ggml_type tv,
                                  double tol) {
    const int H = 4, HKV = 2, kvd = HKV * D, n_tok = 3;
    struct backend *be = backend_cpu_init(2, level);
    float *q = malloc(sizeof(float) * n_tok * H * D), *out = malloc(sizeof(float) * n_tok * H * D);
    float *kf = malloc(sizeof(float) * n_ctx * kvd), *vf = malloc(sizeof(float) * n_ctx * kvd);
    const size_t krb = ggml_row_size(tk, kvd), vrb = ggml_row_size(tv, kvd);
    uint8_t *kc = malloc(krb * n_ctx), *vc = malloc(vrb * n_ctx), *row = malloc(krb + vrb);
    double *want = malloc(sizeof(double) * n_tok * H * D), *want16 = malloc(sizeof(double) * n_tok * H * D);
    fill(q, (size_t)n_tok * H * D, 1.0f);
    fill(kf, (size_t)n_ctx * kvd, 1.0f);
    fill(vf, (size_t)n_ctx * kvd, 1.0f);
    int32_t cells[512], cell0[3], nctx[3];
    for (int i = 0; i < n_ctx; i++) cells[i] = n_ctx - 1 - i; /* not in order: a cell is where it was put */
    const struct kv_view kvv = kv_view_make(tk, tv, HKV, D, kc, vc);
    be->kv_store(be, kf, kvd, vf, kvd, n_ctx, cells, &kvv);
    for (int i = 0; i < n_ctx; i++) {
        quant_quantize_row_ref(tk, kf + (size_t)i * kvd, row, kvd);
        cr_assert_eq(memcmp(row, kc + (size_t)cells[i] * krb, krb), 0, "K row %d of %s: the reference's bytes", i,
                     ggml_type_traits_get(tk)->name);
        quant_quantize_row_ref(tv, vf + (size_t)i * kvd, row, kvd);
        cr_assert_eq(memcmp(row, vc + (size_t)cells[i] * vrb, vrb), 0, "V row %d of %s: the reference's bytes", i,
                     ggml_type_traits_get(tv)->name);
    }
    for (int t = 0; t < n_tok; t++) { cell0[t] = 0; nctx[t] = n_ctx - n_tok + 1 + t; }
    const float scale = 1.0f / sqrtf((float)D);
    be->attention(be, q, H * D, D, &kvv, cell0, nctx, n_tok, H, scale, out);
    /* the references index cells: the values as stored, and the f16 cache's values */
    float *ks = cache_values(tk, kc, n_ctx, kvd), *vs = cache_values(tv, vc, n_ctx, kvd);
    float *k16 = malloc(sizeof(float) * n_ctx * kvd), *v16 = malloc(sizeof(float) * n_ctx * kvd);
    for (int i = 0; i < n_ctx; i++)
        for (int e = 0; e < kvd; e++) {
            k16[(size_t)cells[i] * kvd + e] = fp16_to_f32(f32_to_fp16(kf[(size_t)i * kvd + e]));
            v16[(size_t)cells[i] * kvd + e] = fp16_to_f32(f32_to_fp16(vf[(size_t)i * kvd + e]));
        }
    attention_f64(q, ks, vs, n_tok, H, HKV, D, nctx, scale, want);
    attention_f64(q, k16, v16, n_tok, H, HKV, D, nctx, scale, want16);
    double worst = 0, worst16 = 0;
    for (int i = 0; i < n_tok * H * D; i++) {
        worst = fmax(worst, fabs(want[i] - out[i]));
        worst16 = fmax(worst16, fabs(want16[i] - out[i]));
    }
    const char *nk = ggml_type_traits_get(tk)->name, *nv = ggml_type_traits_get(tv)->name;
    cr_assert_lt(worst, 1e-5, "attention level %d, ctx %d, D %d, K %s V %s: max |dout| %g against its stored values",
                 (int)level, n_ctx, D, nk, nv, worst);
    cr_assert_lt(worst16, tol, "attention level %d, ctx %d, D %d, K %s V %s: max |dout| %g against the f16 cache's",
                 (int)level, n_ctx, D, nk, nv, worst16);
    if (getenv("COTI_TEST_VERBOSE"))
        fprintf(stderr, "attention K %s V %s ctx %d D %d: %g from f16 (bound %g)\n", nk, nv, n_ctx, D, worst16, tol);
    free(k16); free(v16); free(ks); free(vs);
    free(q); free(out); free(kf); free(vf); free(kc); free(vc); free(row); free(want); free(want16);
    backend_free(be);
}

Test(backend_ops, attention_matches_f64_reference) {
    for (int l = QUANT_CPU_REF; l <= (int)quant_cpu_level_detect(); l++) {
        const enum quant_cpu_level lv = (enum quant_cpu_level)l;
        check_attention_types(lv, 5, 64, GGML_TYPE_F16, GGML_TYPE_F16, 1e-5);
        check_attention_types(lv, 300, 64, GGML_TYPE_F16, GGML_TYPE_F16, 1e-5);
        check_attention_types(lv, 37, 24, GGML_TYPE_F16, GGML_TYPE_F16, 1e-5); /* head dim not a multiple of 16: tails */
        check_attention_types(lv, 37, 20, GGML_TYPE_F16, GGML_TYPE_F16, 1e-5); /* nor of 8 */
    }
}

/* A batch's attention rows equal each row alone, bit for bit, at every level and cache type:
 * two sequences' tokens (a prompt's causal lengths and a verify's), so passes share converted
 * blocks across tokens and heads, and cut where the sequence or the pass's pairs end. Head dims
 * 64 (one block of 64 rows) and 96 (blocks of 42: the last block of each token differs). */
Test(backend_ops, attention_rows_of_a_batch_equal_rows_alone) {
    const enum ggml_type types[3] = {GGML_TYPE_F16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0};
    const int dims[2] = {64, 96};
    for (int l = QUANT_CPU_REF; l <= (int)quant_cpu_level_detect(); l++)
        for (int ti = 0; ti < 3; ti++)
            for (int di = 0; di < 2; di++) {
                const int H = 6, HKV = 2, D = dims[di], kvd = HKV * D, cells = 400, n_tok = 13;
                const enum ggml_type tk = types[ti], tv = types[(ti + 1) % 3];
                struct backend *be = backend_cpu_init(2, (enum quant_cpu_level)l);
                const size_t krb = ggml_row_size(tk, kvd), vrb = ggml_row_size(tv, kvd);
                uint8_t *kc = malloc(krb * cells), *vc = malloc(vrb * cells);
                float *kf = malloc(sizeof(float) * cells * kvd), *vf = malloc(sizeof(float) * cells * kvd);
                float *q = malloc(sizeof(float) * n_tok * H * D), *all = malloc(sizeof(float) * n_tok * H * D);
                float *one = malloc(sizeof(float) * H * D);
                int32_t *cl = malloc(sizeof(int32_t) * cells), cell0[13], nctx[13];
                fill(kf, (size_t)cells * kvd, 1.0f);
                fill(vf, (size_t)cells * kvd, 1.0f);
                fill(q, (size_t)n_tok * H * D, 1.0f);
                for (int i = 0; i < cells; i++) cl[i] = i;
                const struct kv_view kvv = kv_view_make(tk, tv, HKV, D, kc, vc);
                be->kv_store(be, kf, kvd, vf, kvd, cells, cl, &kvv);
                /* sequence A at cell 0: 9 prompt tokens at 120..128; sequence B at cell 200: 4 rows at 190..193 */
                for (int t = 0; t < n_tok; t++) {
                    cell0[t] = t < 9 ? 0 : 200;
                    nctx[t] = t < 9 ? 121 + t : 191 + (t - 9);
                }
                be->attention(be, q, H * D, D, &kvv, cell0, nctx, n_tok, H, 1.0f / sqrtf((float)D), all);
                for (int t = 0; t < n_tok; t++) {
                    be->attention(be, q + (size_t)t * H * D, H * D, D, &kvv, &cell0[t], &nctx[t], 1, H,
                                  1.0f / sqrtf((float)D), one);
                    cr_assert_eq(memcmp(one, all + (size_t)t * H * D, sizeof(float) * H * D), 0,
                                 "level %d, K %s V %s, D %d: row %d of the batch differs from it alone", l,
                                 ggml_type_traits_get(tk)->name, ggml_type_traits_get(tv)->name, D, t);
                }
                free(kc); free(vc); free(kf); free(vf); free(q); free(all); free(one); free(cl);
                backend_free(be);
            }
}

/* The quantized and bf16 caches, K and V alike or not. The bound against the f16 cache is the
 * format's rounding of values in [-1, 1): an output is a softmax-weighted mean of V values, each
 * off by at most half a step (bf16: 2^-9 relative; q8_0: amax/254 <= 1/254; q4_0: amax/16, and
 * up to amax/8 at the clamped end of a block), and K's rounding moves the weights a little
 * (|dscore| <= scale·Σ|q||dk|, ~scale·√D·step/√12 for random signs). Over few cells (ctx 5) a
 * mean averages little of it away. Bounds: bf16 0.004 (one step), q8_0 0.008 (one step, 1/127),
 * q4_0 0.15 (seen: <= 0.002, 0.004 and 0.08). */
Test(backend_ops, attention_over_quantized_caches) {
    const struct { enum ggml_type k, v; double tol; } cases[] = {
        {GGML_TYPE_BF16, GGML_TYPE_BF16, 0.004}, {GGML_TYPE_Q8_0, GGML_TYPE_Q8_0, 0.008},
        {GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, 0.15},  {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, 0.15},
        {GGML_TYPE_Q4_0, GGML_TYPE_F16, 0.15},   {GGML_TYPE_F16, GGML_TYPE_Q8_0, 0.008},
    };
    for (int l = QUANT_CPU_REF; l <= (int)quant_cpu_level_detect(); l++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            check_attention_types((enum quant_cpu_level)l, 5, 64, cases[i].k, cases[i].v, cases[i].tol);
            check_attention_types((enum quant_cpu_level)l, 300, 96, cases[i].k, cases[i].v, cases[i].tol);
        }
}

/* The exp-based activations and argmax of every kernel table this CPU can run, against
 * double-precision formulas / the plain scan: random values over the whole useful range,
 * lengths with and without an 8- or 16-lane tail, and the edges (±large, ±0, NaN, ties). */
#include "cpu/ops.h"

static double max_rel_err(const float *got, const double *want, int n) {
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double d = fabs(got[i] - want[i]), s = fmax(fabs(want[i]), 1e-30);
        if (d / s > worst) worst = d / s;
    }
    return worst;
}

Test(backend_ops, activations_and_argmax_every_level) {
    const int n_levels = (int)quant_cpu_level_detect() + 1;   /* every level up to this CPU's */
    enum { N = 1000 };
    float x[N], y[N];
    double want[N];
    for (int li = 0; li < n_levels; li++) {
        const struct cpu_ops *o = cpu_ops_for_level((enum quant_cpu_level)li);
        for (int len = 1; len <= N; len += len < 40 ? 1 : 97) {
            fill(x, (size_t)len, 30.0f);
            x[0] = len % 2 ? 95.0f : -95.0f;                       /* e^-x over/underflows */
            if (len > 2) x[1] = 0.0f, x[2] = -0.0f;
            o->silu(x, y, len);
            for (int i = 0; i < len; i++) want[i] = x[i] / (1.0 + exp(-(double)x[i]));
            cr_assert_leq(max_rel_err(y, want, len), 4e-7, "level %d silu len %d", li, len);
            o->sigmoid(x, y, len);
            for (int i = 0; i < len; i++) want[i] = 1.0 / (1.0 + exp(-(double)x[i]));
            cr_assert_leq(max_rel_err(y, want, len), 4e-7, "level %d sigmoid len %d", li, len);
            memcpy(y, x, sizeof(float) * (size_t)len);              /* in place */
            o->silu(y, y, len);
            for (int i = 0; i < len; i++) want[i] = x[i] / (1.0 + exp(-(double)x[i]));
            cr_assert_leq(max_rel_err(y, want, len), 4e-7, "level %d silu in place len %d", li, len);

            /* argmax: the first of tied maxima, NaNs skipped, like the scalar scan */
            int expect = 0;
            for (int i = 1; i < len; i++) if (x[i] > x[expect]) expect = i;
            cr_assert_eq(o->argmax(x, len), expect, "level %d argmax len %d", li, len);
            if (len > 20) {
                x[len - 1] = x[expect];
                x[len / 2] = NAN;
                int e2 = 0;
                for (int i = 1; i < len; i++) if (x[i] > x[e2]) e2 = i;
                cr_assert_eq(o->argmax(x, len), e2, "level %d argmax tie/NaN len %d", li, len);
            }
        }
        /* the softmax denominator: terms <= 1, f32 lanes; relative error ~1e-6 at n = 1000 */
        for (int len = 1; len <= N; len += 333) {
            fill(x, (size_t)len, 8.0f);
            float mx = x[o->argmax(x, len)];
            double want_sum = 0;
            for (int i = 0; i < len; i++) want_sum += exp((double)x[i] - mx);
            double got = o->exp_sum(x, len, mx);
            cr_assert_leq(fabs(got - want_sum) / want_sum, 2e-6, "level %d exp_sum len %d: %g vs %g", li, len, got, want_sum);
        }
        x[0] = NAN;
        x[1] = 1.0f;
        cr_assert_eq(o->argmax(x, 2), 0, "level %d: leading NaN", li);
        o->silu(x, y, 2);
        cr_assert(isnan(y[0]), "level %d: silu(NaN)", li);
    }
}

/* The kernel-4 conv step: every level gives the reference's bits (same products, same order),
 * for the output and the shifted state, with and without a 16-channel tail. */
Test(backend_ops, conv4_token_every_level_bitwise) {
    const int n_levels = (int)quant_cpu_level_detect() + 1;   /* every level up to this CPU's */
    enum { C = 1040 };
    static float x[C], w[4 * C], st0[3 * C], st[3 * C], y[C], st_ref[3 * C], y_ref[C];
    for (int n_ch = 1; n_ch <= C; n_ch += n_ch < 50 ? 1 : 331) {
        fill(x, n_ch, 2.0f); fill(w, 4 * (size_t)n_ch, 1.0f); fill(st0, 3 * (size_t)n_ch, 2.0f);
        memcpy(st_ref, st0, sizeof(float) * 3 * (size_t)n_ch);
        for (int c = 0; c < n_ch; c++) {   /* the definition, written out */
            y_ref[c] = 0.0f;
            for (int i = 0; i < 3; i++) y_ref[c] += w[4 * c + i] * st_ref[3 * c + i];
            y_ref[c] += w[4 * c + 3] * x[c];
            st_ref[3 * c] = st_ref[3 * c + 1]; st_ref[3 * c + 1] = st_ref[3 * c + 2]; st_ref[3 * c + 2] = x[c];
        }
        for (int li = 0; li < n_levels; li++) {
            memcpy(st, st0, sizeof(float) * 3 * (size_t)n_ch);
            cpu_ops_for_level((enum quant_cpu_level)li)->conv4_token(x, n_ch, w, st, y);
            cr_assert(!memcmp(y, y_ref, sizeof(float) * (size_t)n_ch), "level %d n_ch %d: output", li, n_ch);
            cr_assert(!memcmp(st, st_ref, sizeof(float) * 3 * (size_t)n_ch), "level %d n_ch %d: state", li, n_ch);
        }
    }
}

/* The accepted count is the first mismatch (or every draft); the target's ids follow, the
 * last of them being the token after the accepted prefix. */
Test(backend_ops, accept_greedy_stops_at_first_mismatch) {
    struct backend *be = backend_cpu_init(1, QUANT_CPU_REF);
    const int32_t target[5] = {11, 22, 33, 44, 55};
    const struct { int32_t draft[4]; int n_draft, a; } cases[] = {
        {{11, 22, 33, 44}, 4, 4}, /* all accepted: out[5] is the bonus token */
        {{11, 22, 99, 44}, 4, 2}, /* a later match after a miss does not count */
        {{99, 22, 33, 44}, 4, 0},
        {{11, 22, 33, 0}, 3, 3},  /* only n_draft drafts are compared */
        {{0}, 0, 0},              /* no drafts: the target's token alone */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int32_t out[6] = {-1, -1, -1, -1, -1, -1};
        be->accept_greedy(be, cases[c].draft, target, cases[c].n_draft, out);
        cr_assert_eq(out[0], cases[c].a, "case %zu: accepted %d, want %d", c, out[0], cases[c].a);
        for (int i = 0; i <= cases[c].n_draft; i++) cr_assert_eq(out[1 + i], target[i], "case %zu: out[%d]", c, 1 + i);
        for (int i = cases[c].n_draft + 2; i < 6; i++) cr_assert_eq(out[i], -1, "case %zu: wrote past the result", c);
    }
    backend_free(be);
}

/* On the CPU a mark is the host clock at the call (ops have finished when they return). */
Test(backend_ops, marks_measure_the_time_between_them) {
    struct backend *be = backend_cpu_init(1, QUANT_CPU_REF);
    be->mark(be, 0);
    const int64_t t0 = coti_time_us();
    while (coti_time_us() - t0 < 3000) {}
    be->mark(be, 1);
    const double us = be->mark_elapsed_us(be, 0, 1);
    cr_assert(us >= 3000.0 && us < 1e6, "3 ms between marks measured as %g us", us);
    cr_assert_eq(be->mark_elapsed_us(be, 1, 1), 0.0);
    backend_free(be);
}

/* RMSNorm's Σx² (double; only the summation order may differ between levels) and the KV
 * cache's f16 conversion (bit-identical to f32_to_fp16 for finite values, including values
 * that round to f16 subnormals, to zero and to ±inf). */
Test(backend_ops, sum_sq_and_to_f16_every_level) {
    const int n_levels = (int)quant_cpu_level_detect() + 1;   /* every level up to this CPU's */
    enum { N = 600 };
    float x[N];
    uint16_t got[N];
    for (int li = 0; li < n_levels; li++)
        for (int len = 1; len <= N; len += len < 40 ? 1 : 113) {
            fill(x, (size_t)len, 3.0f);
            for (int i = 0; i < len; i += 7) x[i] *= (i % 3 == 0) ? 1e-6f : (i % 3 == 1 ? 3e4f : 1e-9f);
            double want = 0;
            for (int i = 0; i < len; i++) want += (double)x[i] * x[i];
            cr_assert_leq(fabs(cpu_ops_for_level((enum quant_cpu_level)li)->sum_sq(x, len) - want), 1e-12 * want, "level %d sum_sq len %d", li, len);
            cpu_ops_for_level((enum quant_cpu_level)li)->to_f16(x, got, len);
            for (int i = 0; i < len; i++)
                cr_assert_eq(got[i], f32_to_fp16(x[i]), "level %d to_f16 len %d: x[%d] = %g", li, len, i, x[i]);
        }
}

/* add_rmsnorm is the residual add then the norm, exactly: the fused op the models use must not
 * change a single bit of the CPU path. */
Test(backend_ops, add_rmsnorm_equals_add_then_rmsnorm) {
    struct backend *be = backend_cpu_init(2, quant_cpu_level_detect());
    enum { ROWS = 3, DIM = 4100 };
    static float x[ROWS * DIM], m[ROWS * DIM], w[DIM], x2[ROWS * DIM], y[ROWS * DIM], y2[ROWS * DIM];
    fill(x, ROWS * DIM, 2.0f);
    fill(m, ROWS * DIM, 0.5f);
    fill(w, DIM, 1.0f);
    memcpy(x2, x, sizeof x);
    be->add_rmsnorm(be, x, m, w, ROWS, DIM, 1e-6f, y);
    be->add(be, x2, m, ROWS * DIM, x2);
    be->rmsnorm(be, x2, DIM, w, ROWS, DIM, 1e-6f, y2, DIM);
    cr_assert(memcmp(x, x2, sizeof x) == 0, "residual sum differs");
    cr_assert(memcmp(y, y2, sizeof y) == 0, "normed rows differ");
    double ss = 0;
    for (int i = 0; i < DIM; i++) ss += (double)x2[i] * x2[i];
    const float s = 1.0f / sqrtf((float)(ss / DIM) + 1e-6f);
    cr_assert_float_eq(y[7], x2[7] * s * w[7], 1e-6f * fabsf(x2[7] * s * w[7]) + 1e-30f);
    backend_free(be);
}

/* rmsnorm_add is the norm, the add and the scale in turn, bit for bit (gemma4's outputs on the
 * CPU must not move by fusing them). */
Test(backend_ops, rmsnorm_add_equals_rmsnorm_add_scale) {
    struct backend *be = backend_cpu_init(2, quant_cpu_level_detect());
    enum { ROWS = 3, DIM = 1000 };
    static float x[ROWS * DIM], y[ROWS * DIM], w[DIM], x2[ROWS * DIM], t[ROWS * DIM];
    fill(x, ROWS * DIM, 2.0f);
    fill(y, ROWS * DIM, 0.5f);
    fill(w, DIM, 1.0f);
    memcpy(x2, x, sizeof x);
    be->rmsnorm_add(be, x, y, w, ROWS, DIM, 1e-6f, 0.71f);
    be->rmsnorm(be, y, DIM, w, ROWS, DIM, 1e-6f, t, DIM);
    be->add(be, x2, t, ROWS * DIM, x2);
    be->scale(be, x2, ROWS * DIM, 0.71f);
    cr_assert(memcmp(x, x2, sizeof x) == 0, "fused and separate differ");
    cr_assert(x[5] != 0.0f && x[5] != x2[5] * 0.0f);
    backend_free(be);
}

/* Every matmul input kind on the CPU is the separate ops in sequence, bit for bit: x_out = x + m,
 * a = rmsnorm(x_out) ⊙ w, y = W·a; y = W·(silu(g) ⊙ u); y = W·(rmsnorm per group ⊙ w ⊙ silu(z));
 * y = W·[rmsnorm(x1) ⊙ w1, rmsnorm(x2) ⊙ w2]; y = W·(x ⊙ sigmoid(gate)). */
Test(backend_ops, matmul_inputs_equal_their_separate_ops) {
    struct backend *be = backend_cpu_init(2, quant_cpu_level_detect());
    enum { NT = 3, N_IN = 256, N_OUT = 48 };
    static float x[NT * N_IN], m[NT * N_IN], w[N_IN], xo[NT * N_IN], a[NT * N_IN], y[NT * N_OUT];
    static float x2[NT * N_IN], a2[NT * N_IN], y2[NT * N_OUT], wf[N_OUT * N_IN];
    static unsigned char wq[N_OUT * (N_IN / 32) * 34];
    fill(x, NT * N_IN, 2.0f);
    fill(m, NT * N_IN, 1.0f);
    fill(w, N_IN, 1.0f);
    fill(wf, N_OUT * N_IN, 0.5f);
    const size_t rb = ggml_row_size(GGML_TYPE_Q8_0, N_IN);
    for (int o = 0; o < N_OUT; o++) quant_quantize_row_ref(GGML_TYPE_Q8_0, wf + o * N_IN, wq + o * rb, N_IN);
    struct bweight W = {0};
    cr_assert_eq(be->weight_init(be, &W, GGML_TYPE_Q8_0, N_IN, N_OUT, wq), 0);
    const struct bweight *ws[1] = {&W};
    float *ys[1] = {y};
    const struct matmul_in plain = {.kind = MATMUL_PLAIN, .x = a2};

    be->matmul(be, ws, ys, 1, &(struct matmul_in){.kind = MATMUL_RMSNORM, .x = x, .m = m, .x_out = xo, .w = w,
                                                   .eps = 1e-6f, .a = a}, NT);
    be->add(be, x, m, NT * N_IN, x2);
    be->rmsnorm(be, x2, N_IN, w, NT, N_IN, 1e-6f, a2, N_IN);
    backend_matmul(be, &W, &plain, NT, y2);
    cr_assert(memcmp(xo, x2, sizeof xo) == 0 && memcmp(a, a2, sizeof a) == 0 && memcmp(y, y2, sizeof y) == 0,
              "rmsnorm input with m");
    backend_matmul(be, &W, &(struct matmul_in){.kind = MATMUL_RMSNORM, .x = x, .w = w, .eps = 1e-6f, .a = a}, NT, y);
    be->rmsnorm(be, x, N_IN, w, NT, N_IN, 1e-6f, a2, N_IN);
    backend_matmul(be, &W, &plain, NT, y2);
    cr_assert(memcmp(a, a2, sizeof a) == 0 && memcmp(y, y2, sizeof y) == 0, "rmsnorm input without m");

    memcpy(x2, x, sizeof x);
    backend_matmul(be, &W, &(struct matmul_in){.kind = MATMUL_SWIGLU, .x = x2, .m = m, .a = x2}, NT, y);
    be->swiglu(be, x, m, NT * N_IN, a2);
    backend_matmul(be, &W, &plain, NT, y2);
    cr_assert(memcmp(y, y2, sizeof y) == 0, "swiglu input");

    /* the gated norm over groups of 64 (m as the gate), then W */
    backend_matmul(be, &W,
                   &(struct matmul_in){.kind = MATMUL_GATED_NORM, .x = x, .m = m, .w = w, .dim = 64, .eps = 1e-6f, .a = a},
                   NT, y);
    be->rmsnorm_gated(be, x, w, m, NT * N_IN / 64, 64, 1e-6f, a2);
    backend_matmul(be, &W, &plain, NT, y2);
    cr_assert(memcmp(y, y2, sizeof y) == 0, "gated norm input");

    /* two halves of 128, x and m rows 128 wide, w's halves as their weights */
    backend_matmul(be, &W,
                   &(struct matmul_in){.kind = MATMUL_NORM2, .x = x, .m = m, .w = w, .w2 = w + N_IN / 2,
                                       .dim = N_IN / 2, .eps = 1e-6f, .a = a},
                   NT, y);
    be->rmsnorm(be, x, N_IN / 2, w, NT, N_IN / 2, 1e-6f, a2, N_IN);
    be->rmsnorm(be, m, N_IN / 2, w + N_IN / 2, NT, N_IN / 2, 1e-6f, a2 + N_IN / 2, N_IN);
    backend_matmul(be, &W, &plain, NT, y2);
    cr_assert(memcmp(y, y2, sizeof y) == 0, "norm2 input");

    /* x ⊙ sigmoid(gate) per head (4 heads of 64, the gate m with strides of its own), then W;
     * formed in place (a = x, as qwen35 calls it) and into a buffer of its own */
    memcpy(x2, x, sizeof x);
    backend_matmul(be, &W,
                   &(struct matmul_in){.kind = MATMUL_SIGMOID_GATE, .x = x2, .m = m, .dim = 64, .gate_stride = N_IN,
                                       .gate_head_stride = 64, .a = x2},
                   NT, y);
    memcpy(a2, x, sizeof x);
    be->mul_sigmoid(be, a2, m, NT, 4, 64, N_IN, 64);
    backend_matmul(be, &W, &plain, NT, y2);
    cr_assert(memcmp(y, y2, sizeof y) == 0, "sigmoid gate input in place");
    backend_matmul(be, &W,
                   &(struct matmul_in){.kind = MATMUL_SIGMOID_GATE, .x = x, .m = m, .dim = 64, .gate_stride = N_IN,
                                       .gate_head_stride = 64, .a = a},
                   NT, y);
    cr_assert(memcmp(y, y2, sizeof y) == 0 && memcmp(a, a2, sizeof a) == 0, "sigmoid gate input into a");
    cr_assert(fabsf(y[5]) > 0.0f, "a real output");
    be->weight_free(be, &W);
    backend_free(be);
}

/* ---- mixture of experts ---- */

/* moe_route against a double reference: softmax, the top k in descending order, renormalized.
 * Logits are distinct by construction (a permutation of spaced values plus noise), so the order
 * is defined; one row is all equal (ties: lower index first) and one row has a single huge
 * logit (the selected weights' sum is tiny for all but the first: the normalization's clamp). */
Test(backend_ops, moe_route_matches_reference) {
    enum { NT = 6, NE = 40, K = 7 };
    static float l[NT * NE], wts[NT * K];
    static int32_t ids[NT * K];
    for (int t = 0; t < NT; t++)
        for (int e = 0; e < NE; e++) l[t * NE + e] = 0.37f * (float)((e * 17 + t * 5) % NE) - 6.0f + 0.01f * frand();
    for (int e = 0; e < NE; e++) l[4 * NE + e] = 0.5f;
    l[5 * NE + 11] = 80.0f;
    for (int lv = QUANT_CPU_REF; lv <= (int)quant_cpu_level_detect(); lv++) {
        struct backend *be = backend_cpu_init(2, (enum quant_cpu_level)lv);
        be->moe_route(be, l, NT, NE, K, ids, wts);
        for (int t = 0; t < NT; t++) {
            const float *r = l + t * NE;
            double mx = -1e30, sum = 0, p[NE];
            for (int e = 0; e < NE; e++) mx = fmax(mx, r[e]);
            for (int e = 0; e < NE; e++) sum += p[e] = exp((double)r[e] - mx);
            bool used[NE] = {false};
            double sel = 0, want_p[K];
            int want[K];
            for (int k = 0; k < K; k++) {
                int b = -1;
                for (int e = 0; e < NE; e++)
                    if (!used[e] && (b < 0 || p[e] > p[b])) b = e;
                used[b] = true;
                want[k] = b;
                want_p[k] = p[b] / sum;
                sel += want_p[k];
            }
            sel = fmax(sel, 6.103515625e-5);
            for (int k = 0; k < K; k++) {
                cr_assert_eq(ids[t * K + k], want[k], "level %d row %d slot %d: expert %d, want %d", lv, t, k,
                             ids[t * K + k], want[k]);
                cr_assert_float_eq(wts[t * K + k], want_p[k] / sel, 2e-6 * (want_p[k] / sel) + 1e-30,
                                   "row %d slot %d", t, k);
            }
        }
        cr_assert(wts[4 * K] > 0.14f && wts[4 * K] < 0.15f && ids[4 * K + 1] == 1, "ties: equal weights 1/K, lower index first");
        cr_assert(ids[5 * K] == 11 && wts[5 * K] > 0.99f, "one dominant expert");
        backend_free(be);
    }
}

/* n_expert experts of `rows` rows each over n_in, stacked, random, in type t. */
static void *expert_stack(enum ggml_type t, int n_in, int rows, int n_expert, float scale) {
    const size_t rb = ggml_row_size(t, n_in);
    uint8_t *q = malloc(rb * (size_t)rows * n_expert);
    float *f = malloc(sizeof(float) * (size_t)n_in);
    for (int r = 0; r < rows * n_expert; r++) {
        fill(f, (size_t)n_in, scale);
        quant_quantize_row_ref(t, f, q + (size_t)r * rb, n_in);
    }
    free(f);
    return q;
}

/* matmul_id against the plain matmul of each slot's own expert (a bweight over that expert's
 * rows), bit for bit, at every CPU level: with one input row per token (gate, up) and one per
 * slot formed as silu(g) ⊙ u (down), outputs at a row stride; every slot of a 5-token batch
 * equals the same token computed alone (a verify row equals the decode row it replaces); an id
 * out of range leaves its slot alone. */
static void check_matmul_id(enum quant_cpu_level level, enum ggml_type t, int n_in, int rows) {
    enum { NT = 5, K = 3, NE = 6 };
    const size_t rb = ggml_row_size(t, n_in);
    uint8_t *W = expert_stack(t, n_in, rows, NE, 0.5f);
    struct backend *be = backend_cpu_init(2, level);
    struct bweight w = {0}, we[NE];
    cr_assert_eq(be->weight_init(be, &w, t, n_in, (int64_t)rows * NE, W), 0);
    for (int e = 0; e < NE; e++) {
        we[e] = (struct bweight){0};
        cr_assert_eq(be->weight_init(be, &we[e], t, n_in, rows, W + (size_t)e * rows * rb), 0);
    }
    /* expert 2 chosen by every token (read once for 5 slots), 5 never, a repeated pair */
    const int32_t ids[NT * K] = {2, 0, 4, 1, 2, 3, 2, 4, 0, 3, 1, 2, 0, 2, 1};
    const int ys = rows + 3;
    float *x = malloc(sizeof(float) * NT * K * 2 * n_in), *y = malloc(sizeof(float) * NT * K * ys);
    float *y1 = malloc(sizeof(float) * K * ys), *ref = malloc(sizeof(float) * rows), *a = malloc(sizeof(float) * n_in);
    fill(x, (size_t)NT * K * 2 * n_in, 2.0f);
    for (int glu = MOE_GLU_NONE; glu <= MOE_GLU_GEGLU; glu++) {
        const bool gated = glu != MOE_GLU_NONE;
        const struct matmul_id_in in = {.ids = ids, .n_used = K, .n_expert = NE, .x = x,
                                        .tok_stride = gated ? K * 2 * n_in : n_in, .slot_stride = gated ? 2 * n_in : 0,
                                        .glu = (enum moe_glu)glu, .y_stride = ys};
        for (int i = 0; i < NT * K * ys; i++) y[i] = 1234.5f;
        be->matmul_id(be, &w, &in, NT, y);
        for (int tk = 0; tk < NT; tk++)
            for (int k = 0; k < K; k++) {
                const float *xr = gated ? x + (size_t)(tk * K + k) * 2 * n_in : x + (size_t)tk * n_in;
                if (glu == MOE_GLU_SWIGLU) be->swiglu(be, xr, xr + n_in, n_in, a);
                else if (glu == MOE_GLU_GEGLU) be->geglu(be, xr, xr + n_in, n_in, a);
                else memcpy(a, xr, sizeof(float) * n_in);
                backend_matmul(be, &we[ids[tk * K + k]], &(struct matmul_in){.kind = MATMUL_PLAIN, .x = a}, 1, ref);
                const float *got = y + (size_t)(tk * K + k) * ys;
                cr_assert(memcmp(got, ref, sizeof(float) * rows) == 0,
                          "level %d type %d glu %d: token %d slot %d differs from its expert's matmul (%g vs %g)",
                          (int)level, (int)t, glu, tk, k, got[0], ref[0]);
                cr_assert(got[rows] == 1234.5f, "wrote past the row");
            }
        /* token 3 alone: its slots as in the batch */
        struct matmul_id_in one = in;
        one.ids = ids + 3 * K;
        one.x = x + (size_t)3 * in.tok_stride;
        be->matmul_id(be, &w, &one, 1, y1);
        for (int k = 0; k < K; k++)
            cr_assert(memcmp(y1 + (size_t)k * ys, y + (size_t)(3 * K + k) * ys, sizeof(float) * rows) == 0,
                      "a slot depends on the batch");
    }
    const int32_t bad[K] = {1, NE, -1};
    for (int i = 0; i < K * ys; i++) y1[i] = 7.0f;
    be->matmul_id(be, &w, &(struct matmul_id_in){.ids = bad, .n_used = K, .n_expert = NE, .x = x, .tok_stride = n_in,
                                                 .y_stride = ys},
                  1, y1);
    cr_assert(y1[ys] == 7.0f && y1[2 * ys] == 7.0f && y1[0] != 7.0f, "out-of-range ids are skipped");
    for (int e = 0; e < NE; e++) be->weight_free(be, &we[e]);
    be->weight_free(be, &w);
    backend_free(be);
    free(W); free(x); free(y); free(y1); free(ref); free(a);
}

Test(backend_ops, matmul_id_equals_each_slots_expert_matmul) {
    for (int l = QUANT_CPU_REF; l <= (int)quant_cpu_level_detect(); l++) {
        const enum quant_cpu_level lv = (enum quant_cpu_level)l;
        check_matmul_id(lv, GGML_TYPE_Q8_0, 256, 32);   /* packed at the SIMD levels */
        check_matmul_id(lv, GGML_TYPE_Q4_0, 128, 48);
        check_matmul_id(lv, GGML_TYPE_Q4_K, 256, 16);
        check_matmul_id(lv, GGML_TYPE_F16, 64, 32);
        check_matmul_id(lv, GGML_TYPE_F32, 48, 16);
    }
}

/* moe_sum: the weighted slots in order, then the sigmoid-gated shared row, in f32; or (gemma4)
 * each slot scaled by its expert's scale before its weight, and no shared row. */
Test(backend_ops, moe_sum_matches_reference) {
    enum { NT = 3, K = 4, D = 300, NE = 7 };
    static float y[NT * K * D], w[NT * K], sh[NT * D], g[NT], out[NT * D], es[NE];
    static const int32_t ids[NT * K] = {3, 0, 6, 1, 2, 5, 4, 0, 6, 6, 1, 3};
    fill(y, NT * K * D, 2.0f);
    fill(w, NT * K, 1.0f);
    fill(sh, NT * D, 2.0f);
    fill(g, NT, 4.0f);
    fill(es, NE, 1.5f);
    struct backend *be = backend_cpu_init(1, quant_cpu_level_detect());
    for (int gemma = 0; gemma < 2; gemma++) {
        be->moe_sum(be, y, w, ids, gemma ? es : NULL, NT, K, D, gemma ? NULL : sh, gemma ? NULL : g, out);
        for (int t = 0; t < NT; t++)
            for (int i = 0; i < D; i++) {
                double r = 0;
                for (int k = 0; k < K; k++)
                    r += (double)y[(t * K + k) * D + i] * (gemma ? es[ids[t * K + k]] : 1.0) * w[t * K + k];
                if (!gemma) r += sh[t * D + i] / (1.0 + exp(-(double)g[t]));
                cr_assert_float_eq(out[t * D + i], r, 1e-5, "%s: token %d element %d", gemma ? "scaled" : "shared", t, i);
            }
    }
    backend_free(be);
}

/* The op list makes every table: each op has a distinct name, the CPU backend and the op-cost
 * wrapper fill every op, and supports() says yes to exactly the weight types weight_init takes. */
Test(backend_ops, every_listed_op_is_filled_and_supports_matches_weight_init) {
    struct backend *cpu = backend_cpu_init(1, quant_cpu_level_detect()), *oc = opcost_wrap(backend_cpu_init(1, QUANT_CPU_REF));
    for (int i = 0; i < BACKEND_OP_COUNT; i++) {
        const char *name = backend_op_name((enum backend_op)i);
        cr_assert(name && strcmp(name, "(none)") != 0, "op %d has a name", i);
        for (int j = 0; j < i; j++) cr_assert_str_neq(name, backend_op_name((enum backend_op)j));
    }
    cr_assert_str_eq(backend_op_name(BACKEND_OP_matmul), "matmul");
    cr_assert_str_eq(backend_op_name(BACKEND_OP_COUNT), "(none)");
    const struct backend *bes[2] = {cpu, oc};
    for (int b = 0; b < 2; b++) {
#define BACKEND_OP(name, family, params, args) cr_assert(bes[b]->name, "%s: op " #name " missing", bes[b]->name);
#include "backend_ops.h"
#undef BACKEND_OP
    }
    static unsigned char zeros[4 * 256 * 8];
    int n_types = 0;
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        if (!ggml_type_supported((enum ggml_type)t)) continue;
        struct bweight w = {0};
        const bool taken = cpu->weight_init(cpu, &w, (enum ggml_type)t, 256, 4, zeros) == 0;
        if (taken) cpu->weight_free(cpu, &w);
        cr_assert_eq(cpu->supports(cpu, BACKEND_OP_matmul, (enum ggml_type)t), taken, "type %d", t);
        cr_assert_eq(cpu->supports(cpu, BACKEND_OP_get_rows, (enum ggml_type)t), taken, "type %d", t);
        cr_assert_eq(cpu->supports(cpu, BACKEND_OP_matmul_id, (enum ggml_type)t), taken, "type %d", t);
        cr_assert_eq(oc->supports(oc, BACKEND_OP_matmul, (enum ggml_type)t), taken, "type %d through opcost", t);
        n_types += taken;
    }
    cr_assert_geq(n_types, 8, "the CPU computes the common weight types");
    /* the attention ops: kv.h's cache types exactly */
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        bool is_kv = false;
        for (int i = 0; i < KV_N_TYPES; i++) is_kv |= kv_types[i] == (enum ggml_type)t;
        cr_assert_eq(cpu->supports(cpu, BACKEND_OP_attention, (enum ggml_type)t), is_kv, "type %d", t);
        cr_assert_eq(cpu->supports(cpu, BACKEND_OP_kv_store, (enum ggml_type)t), is_kv, "type %d", t);
    }
    cr_assert(!cpu->supports(cpu, BACKEND_OP_attention, GGML_TYPE_Q4_1) && !cpu->supports(cpu, BACKEND_OP_attention, GGML_TYPE_F32));
    cr_assert(cpu->supports(cpu, BACKEND_OP_rmsnorm, GGML_TYPE_F32) && !cpu->supports(cpu, BACKEND_OP_rmsnorm, GGML_TYPE_F16));
    backend_free(cpu);
    backend_free(oc);
}

/* attn_prep is the q/k norms, the two ropes and the KV store in sequence, bit for bit: q heads
 * with gate halves between them (as qwen35 lays them out), a partial rotation, cells out of order. */
Test(backend_ops, attn_prep_equals_its_separate_ops) {
    struct backend *be = backend_cpu_init(2, quant_cpu_level_detect());
    enum { NT = 3, H = 4, HKV = 2, D = 64, NROT = 32, CELLS = 8, QS = 2 * H * D, KV = HKV * D };
    static float q[NT * QS], k[NT * KV], v[NT * KV], q2[NT * QS], k2[NT * KV], q0[NT * QS], qn[D], kn[D];
    static uint16_t kc[CELLS * KV], vc[CELLS * KV], kc2[CELLS * KV], vc2[CELLS * KV];
    const int32_t pos[NT] = {5, 6, 7}, cells[NT] = {6, 1, 3};
    fill(q, NT * QS, 3.0f);
    fill(k, NT * KV, 3.0f);
    fill(v, NT * KV, 1.0f);
    for (int i = 0; i < D; i++) { qn[i] = 1.0f + 0.5f * frand(); kn[i] = 1.0f + 0.5f * frand(); }
    memcpy(q2, q, sizeof q);
    memcpy(q0, q, sizeof q);
    memcpy(k2, k, sizeof k);
    const struct kv_view kvv = kv_view_make(GGML_TYPE_F16, GGML_TYPE_F16, HKV, D, kc, vc);
    const struct kv_view kvv2 = kv_view_make(GGML_TYPE_F16, GGML_TYPE_F16, HKV, D, kc2, vc2);
    const struct attn_prep_in in = {.q = q, .q_stride = QS, .q_head_stride = 2 * D, .q_norm = qn, .k = k, .k_stride = KV,
                                    .k_norm = kn, .v = v, .v_stride = KV, .eps = 1e-6f, .n_head = H, .n_rot = NROT,
                                    .rope_base = 1e6f};
    be->attn_prep(be, &in, NT, pos, cells, &kvv);
    be->rmsnorm(be, q2, 2 * D, qn, NT * H, D, 1e-6f, q2, 2 * D);
    be->rmsnorm(be, k2, D, kn, NT * HKV, D, 1e-6f, k2, D);
    be->rope_neox(be, q2, NT, QS, H, 2 * D, NROT, pos, 1e6f, NULL);
    be->rope_neox(be, k2, NT, KV, HKV, D, NROT, pos, 1e6f, NULL);
    be->kv_store(be, k2, KV, v, KV, NT, cells, &kvv2);
    cr_assert(memcmp(q, q2, sizeof q) == 0 && memcmp(k, k2, sizeof k) == 0, "q and k in place");
    cr_assert(memcmp(kc, kc2, sizeof kc) == 0 && memcmp(vc, vc2, sizeof vc) == 0, "the cache rows");
    cr_assert(kc[6 * KV + 1] != 0 && q[1] != q0[1] && q[D + 1] == q0[D + 1], "real values, gate halves kept");
    backend_free(be);
}

/* The op-cost decorator (coti bench --op-cost) forwards ops, except the skipped family's, and
 * while counting counts every call by family (skipped ones too) and the matmuls' bytes. */
Test(backend_ops, opcost_skips_only_the_chosen_family) {
    struct backend *be = opcost_wrap(backend_cpu_init(1, QUANT_CPU_REF));
    cr_assert(be && !be->capture_begin, "no graphs where the inner backend has none");
    enum { N_IN = 64, N_OUT = 64 };
    static float x[N_IN], w[N_IN], y[N_IN], wf[N_OUT * N_IN], ym[N_OUT];
    static unsigned char wq[N_OUT * (N_IN / 32) * 34];
    fill(x, N_IN, 1.0f);
    fill(w, N_IN, 1.0f);
    fill(wf, N_OUT * N_IN, 1.0f);
    for (int o = 0; o < N_OUT; o++) quant_quantize_row_ref(GGML_TYPE_Q8_0, wf + o * N_IN, wq + o * 68, N_IN);
    struct bweight W = {0};
    cr_assert_eq(be->weight_init(be, &W, GGML_TYPE_Q8_0, N_IN, N_OUT, wq), 0);

    opcost_skip(be, OPCOST_NORMS);
    y[0] = 12345.0f;
    be->rmsnorm(be, x, N_IN, w, 1, N_IN, 1e-6f, y, N_IN);
    cr_assert_eq(y[0], 12345.0f, "a skipped norm writes nothing");
    ym[0] = 12345.0f;
    backend_matmul(be, &W, &(struct matmul_in){.kind = MATMUL_PLAIN, .x = x}, 1, ym);
    cr_assert_neq(ym[0], 12345.0f, "other families still run");

    opcost_skip(be, OPCOST_MATMUL_NARROW); /* N_OUT <= N_IN: the narrow family */
    ym[0] = 12345.0f;
    backend_matmul(be, &W, &(struct matmul_in){.kind = MATMUL_PLAIN, .x = x}, 1, ym);
    cr_assert_eq(ym[0], 12345.0f);
    opcost_skip(be, OPCOST_MATMUL_WIDE);
    backend_matmul(be, &W, &(struct matmul_in){.kind = MATMUL_PLAIN, .x = x}, 1, ym);
    cr_assert_neq(ym[0], 12345.0f);

    opcost_skip(be, -1);
    be->rmsnorm(be, x, N_IN, w, 1, N_IN, 1e-6f, y, N_IN);
    cr_assert_neq(y[0], 12345.0f);
    cr_assert_str_eq(opcost_family_name(OPCOST_NORMS), "norms");

    opcost_count(be, true);
    opcost_skip(be, OPCOST_NORMS);
    be->rmsnorm(be, x, N_IN, w, 1, N_IN, 1e-6f, y, N_IN);
    be->rmsnorm(be, x, N_IN, w, 1, N_IN, 1e-6f, y, N_IN);
    backend_matmul(be, &W, &(struct matmul_in){.kind = MATMUL_PLAIN, .x = x}, 1, ym);
    const struct opcost_counts c = opcost_counted(be);
    cr_assert(c.op_calls[OPCOST_NORMS] == 2 && c.op_calls[OPCOST_MATMUL_NARROW] == 1, "%ld norms, %ld matmuls",
              c.op_calls[OPCOST_NORMS], c.op_calls[OPCOST_MATMUL_NARROW]);
    cr_assert(c.op_calls[OPCOST_MATMUL_WIDE] == 0 && c.op_calls[OPCOST_ATTENTION] == 0);
    cr_assert_eq(c.weight_bytes, (double)W.row_bytes * N_OUT);
    opcost_count(be, true);
    cr_assert_eq(opcost_counted(be).op_calls[OPCOST_NORMS], 0, "counting again starts from zero");
    opcost_count(be, false);
    opcost_skip(be, -1);
    be->weight_free(be, &W);
    backend_free(be);
}

/* copy_n copies every region and nothing else */
Test(backend_ops, copy_n_copies_each_region) {
    struct backend *be = backend_cpu_init(1, quant_cpu_level_detect());
    static unsigned char src[1000], dst[1000];
    for (int i = 0; i < 1000; i++) src[i] = (unsigned char)(i * 7 + 3);
    memset(dst, 0xAA, sizeof dst);
    void *d[3] = {dst, dst + 101, dst + 600};
    const void *s[3] = {src + 500, src, src + 333};
    size_t n[3] = {64, 397, 5};
    be->copy_n(be, d, s, n, 3);
    cr_assert(memcmp(dst, src + 500, 64) == 0 && memcmp(dst + 101, src, 397) == 0 && memcmp(dst + 600, src + 333, 5) == 0);
    cr_assert(dst[64] == 0xAA && dst[100] == 0xAA && dst[498] == 0xAA && dst[605] == 0xAA, "nothing else written");
    backend_free(be);
}

/* copy_n_at offsets each source by the selected count times its step, and copies nothing when
 * the count reaches the limit */
Test(backend_ops, copy_n_at_picks_the_selected_source) {
    struct backend *be = backend_cpu_init(1, quant_cpu_level_detect());
    static unsigned char src[1000], dst[100];
    for (int i = 0; i < 1000; i++) src[i] = (unsigned char)(i * 7 + 3);
    void *d[2] = {dst, dst + 50};
    const void *s[2] = {src, src + 500};
    size_t step[2] = {40, 100}, n[2] = {40, 30};
    for (int32_t sel = 0; sel <= 3; sel++) {
        memset(dst, 0xAA, sizeof dst);
        be->copy_n_at(be, d, s, step, n, 2, &sel, 3);
        if (sel == 3) {
            for (int i = 0; i < 100; i++) cr_assert_eq(dst[i], 0xAA, "a count at the limit copies nothing");
            continue;
        }
        cr_assert(memcmp(dst, src + 40 * sel, 40) == 0 && memcmp(dst + 50, src + 500 + 100 * sel, 30) == 0, "sel %d", sel);
        cr_assert(dst[40] == 0xAA && dst[49] == 0xAA && dst[80] == 0xAA, "nothing else written");
    }
    backend_free(be);
}

/* gemma4's attention inputs: full rotation over the head with the unrotated pairs' angles
 * divided by 1e30 (rope_freqs), and v rows normed (a weight of ones) before they are stored. */
Test(backend_ops, attn_prep_with_freqs_and_v_norm_equals_its_separate_ops) {
    struct backend *be = backend_cpu_init(2, quant_cpu_level_detect());
    enum { NT = 3, H = 2, HKV = 1, D = 32, CELLS = 6, QS = H * D, KV = HKV * D, ROT = 4 };
    static float q[NT * QS], k[NT * KV], v[NT * KV], q2[NT * QS], k2[NT * KV], v2[NT * KV], k0[NT * KV];
    static float qn[D], kn[D], ones[D], freqs[D / 2];
    static uint16_t kc[CELLS * KV], vc[CELLS * KV], kc2[CELLS * KV], vc2[CELLS * KV];
    const int32_t pos[NT] = {0, 9, 40}, cells[NT] = {2, 5, 0};
    fill(q, NT * QS, 3.0f);
    fill(k, NT * KV, 3.0f);
    fill(v, NT * KV, 2.0f);
    for (int i = 0; i < D; i++) { qn[i] = 1.0f + 0.5f * frand(); kn[i] = 1.0f + 0.5f * frand(); ones[i] = 1.0f; }
    for (int i = 0; i < D / 2; i++) freqs[i] = i < ROT ? 1.0f : 1e30f;
    memcpy(q2, q, sizeof q);
    memcpy(k2, k, sizeof k);
    memcpy(v2, v, sizeof v);
    const struct kv_view kvv = kv_view_make(GGML_TYPE_F16, GGML_TYPE_F16, HKV, D, kc, vc);
    const struct kv_view kvv2 = kv_view_make(GGML_TYPE_F16, GGML_TYPE_F16, HKV, D, kc2, vc2);
    const struct attn_prep_in in = {.q = q, .q_stride = QS, .q_head_stride = D, .q_norm = qn, .k = k, .k_stride = KV,
                                    .k_norm = kn, .v = v, .v_stride = KV, .v_norm = ones, .eps = 1e-6f, .n_head = H,
                                    .n_rot = D, .rope_base = 1e6f, .rope_freqs = freqs};
    be->attn_prep(be, &in, NT, pos, cells, &kvv);
    be->rmsnorm(be, q2, D, qn, NT * H, D, 1e-6f, q2, D);
    be->rmsnorm(be, k2, D, kn, NT * HKV, D, 1e-6f, k2, D);
    memcpy(k0, k2, sizeof k2);
    be->rope_neox(be, q2, NT, QS, H, D, D, pos, 1e6f, freqs);
    be->rope_neox(be, k2, NT, KV, HKV, D, D, pos, 1e6f, freqs);
    be->rmsnorm(be, v2, D, ones, NT * HKV, D, 1e-6f, v2, D);
    be->kv_store(be, k2, KV, v2, KV, NT, cells, &kvv2);
    cr_assert(memcmp(q, q2, sizeof q) == 0 && memcmp(k, k2, sizeof k) == 0 && memcmp(v, v2, sizeof v) == 0);
    cr_assert(memcmp(kc, kc2, sizeof kc) == 0 && memcmp(vc, vc2, sizeof vc) == 0, "the cache rows");
    for (int t = 1; t < NT; t++) /* pairs past ROT stay where the norm put them; the first ones turn */
        for (int d = 0; d < D / 2; d++) {
            const bool still = k2[t * KV + d] == k0[t * KV + d] && k2[t * KV + d + D / 2] == k0[t * KV + d + D / 2];
            cr_assert(d < ROT ? !still : still, "token %d pair %d", t, d);
        }
    double ss = 0;
    for (int i = 0; i < D; i++) ss += (double)v[KV + i] * v[KV + i];
    cr_assert_float_eq(ss / D, 1.0, 1e-4, "v rows are normed (mean square %g)", ss / D);
    backend_free(be);
}

/* K = V layers and window rings: v_from_k takes v from the raw k rows (a copy before any norm)
 * and cells2 stores every row a second time, bit for bit a copy and a second kv_store. */
Test(backend_ops, attn_prep_v_from_k_and_second_store_equal_copy_and_kv_store) {
    struct backend *be = backend_cpu_init(2, quant_cpu_level_detect());
    enum { NT = 3, H = 2, HKV = 1, D = 32, CELLS = 8, QS = H * D, KV = HKV * D };
    static float q[NT * QS], k[NT * KV], v[NT * KV], q2[NT * QS], k2[NT * KV], v2[NT * KV];
    static float qn[D], kn[D], ones[D];
    static uint16_t kc[CELLS * KV], vc[CELLS * KV], kc2[CELLS * KV], vc2[CELLS * KV];
    const int32_t pos[NT] = {3, 4, 5}, cells[NT] = {3, 4, 5}, cells2[NT] = {0, 1, 7};
    fill(q, NT * QS, 3.0f);
    fill(k, NT * KV, 3.0f);
    fill(v, NT * KV, 2.0f); /* overwritten from k */
    for (int i = 0; i < D; i++) { qn[i] = 1.0f + 0.5f * frand(); kn[i] = 1.0f + 0.5f * frand(); ones[i] = 1.0f; }
    memcpy(q2, q, sizeof q);
    memcpy(k2, k, sizeof k);
    memcpy(v2, k, sizeof k);
    const struct kv_view kvv = kv_view_make(GGML_TYPE_F16, GGML_TYPE_F16, HKV, D, kc, vc);
    const struct kv_view kvv2 = kv_view_make(GGML_TYPE_F16, GGML_TYPE_F16, HKV, D, kc2, vc2);
    struct attn_prep_in in = {.q = q, .q_stride = QS, .q_head_stride = D, .q_norm = qn, .k = k, .k_stride = KV,
                              .k_norm = kn, .v = v, .v_stride = KV, .v_norm = ones, .v_from_k = true, .cells2 = cells2,
                              .eps = 1e-6f, .n_head = H, .n_rot = D, .rope_base = 1e4f};
    be->attn_prep(be, &in, NT, pos, cells, &kvv);
    in = (struct attn_prep_in){.q = q2, .q_stride = QS, .q_head_stride = D, .q_norm = qn, .k = k2, .k_stride = KV,
                               .k_norm = kn, .v = v2, .v_stride = KV, .v_norm = ones, .eps = 1e-6f, .n_head = H,
                               .n_rot = D, .rope_base = 1e4f};
    be->attn_prep(be, &in, NT, pos, cells, &kvv2);
    be->kv_store(be, k2, KV, v2, KV, NT, cells2, &kvv2);
    cr_assert(memcmp(v, v2, sizeof v) == 0, "v rows from the raw k rows");
    cr_assert(memcmp(kc, kc2, sizeof kc) == 0 && memcmp(vc, vc2, sizeof vc) == 0, "the cache rows, both stores");
    cr_assert(memcmp(kc + 7 * KV, kc + 5 * KV, sizeof(uint16_t) * KV) == 0 && kc[7 * KV] != 0, "the second store");
    backend_free(be);
}

/* The elementwise ops gemma4 adds, against their formulas in double on random values. */
Test(backend_ops, geglu_scale_softcap_follow_their_formulas) {
    struct backend *be = backend_cpu_init(1, quant_cpu_level_detect());
    enum { N = 1000 };
    static float g[N], u[N], y[N], x[N], x0[N];
    fill(g, N, 6.0f);
    fill(u, N, 2.0f);
    fill(x, N, 80.0f);
    memcpy(x0, x, sizeof x);
    be->geglu(be, g, u, N, y);
    for (int i = 0; i < N; i++) { /* gelu of the f16 gate, rounded to f16 (llama.cpp's CPU table) */
        const double a = fp16_to_f32(f32_to_fp16(g[i]));
        const double gelu = 0.5 * a * (1.0 + tanh(sqrt(2.0 / M_PI) * (a + 0.044715 * a * a * a)));
        const double want = fp16_to_f32(f32_to_fp16((float)gelu)) * u[i];
        cr_assert_float_eq(y[i], want, 1e-3 * (1e-3 + fabs(want)), "geglu %d: %g, want %g", i, y[i], want);
    }
    be->softcap(be, x, N, 30.0f);
    for (int i = 0; i < N; i++) {
        cr_assert(fabsf(x[i]) < 30.0f, "softcap bounds %g", x[i]);
        cr_assert_float_eq(x[i], 30.0 * tanh(x0[i] / 30.0), 1e-5 * 30.0, "softcap %d", i);
    }
    memcpy(x, x0, sizeof x);
    be->scale(be, x, N, 16.0f);
    for (int i = 0; i < N; i++) cr_assert_eq(x[i], x0[i] * 16.0f, "scale %d", i);
    backend_free(be);
}
