/* test_backend_ops.c — backend ops against plain references on seeded random data:
 * the delta rule (recurrent and chunked forms against an f64 recurrence), conv, attention,
 * rope identities, and the CPU matmul at every SIMD level against the reference level. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
    return (float)((rng_state >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}
static void fill(float *x, size_t n, float scale) { for (size_t i = 0; i < n; i++) x[i] = frand() * scale; }

/* f64 reference of arch-qwen35.md §5.5 (one sequence, all heads). */
static void gdn_ref(const float *qkv, int stride, const float *g, const float *beta, double *S, int n_tok,
                    int nk, int nv, int dk, int dv, float eps, double *out) {
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < nv; h++) {
            const float *row = qkv + (size_t)t * stride;
            const float *q = row + (h % nk) * dk, *k = row + nk * dk + (h % nk) * dk, *v = row + 2 * nk * dk + h * dv;
            double qn = 0, kn = 0;
            for (int i = 0; i < dk; i++) { qn += (double)q[i] * q[i]; kn += (double)k[i] * k[i]; }
            qn = fmax(sqrt(qn), eps); kn = fmax(sqrt(kn), eps);
            double *Sh = S + (size_t)h * dk * dv;
            double decay = exp(g[t * nv + h]);
            for (int j = 0; j < dv; j++) {
                double kv = 0;
                for (int i = 0; i < dk; i++) { Sh[j * dk + i] *= decay; kv += Sh[j * dk + i] * k[i] / kn; }
                double d = beta[t * nv + h] * (v[j] - kv), o = 0;
                for (int i = 0; i < dk; i++) { Sh[j * dk + i] += k[i] / kn * d; o += Sh[j * dk + i] * q[i] / qn; }
                out[((size_t)t * nv + h) * dv + j] = o / sqrt((double)dk);
            }
        }
}

static void check_gdn_level(bool chunked, int n_tok, float gscale, enum quant_cpu_level level) {
    const int nk = 2, nv = 4, dk = 16, dv = 16, ch = 2 * nk * dk + nv * dv;
    struct backend *be = backend_cpu_init(2, level);
    float *qkv = malloc(sizeof(float) * n_tok * ch), *g = malloc(sizeof(float) * n_tok * nv);
    float *beta = malloc(sizeof(float) * n_tok * nv), *S = malloc(sizeof(float) * nv * dk * dv);
    float *out = malloc(sizeof(float) * n_tok * nv * dv);
    double *Sd = malloc(sizeof(double) * nv * dk * dv), *outd = malloc(sizeof(double) * n_tok * nv * dv);
    fill(qkv, (size_t)n_tok * ch, 1.0f);
    for (int i = 0; i < n_tok * nv; i++) { g[i] = -gscale * (frand() + 1.0f); beta[i] = 0.5f * (frand() + 1.0f); }
    fill(S, (size_t)nv * dk * dv, 0.5f);
    for (int i = 0; i < nv * dk * dv; i++) Sd[i] = S[i];
    gdn_ref(qkv, ch, g, beta, Sd, n_tok, nk, nv, dk, dv, 1e-6f, outd);
    if (chunked) be->gdn_chunked(be, qkv, ch, g, beta, S, n_tok, nk, nv, dk, dv, 1e-6f, out);
    else be->gdn(be, qkv, ch, g, beta, S, n_tok, nk, nv, dk, dv, 1e-6f, out, NULL, 0);
    /* f32 against f64: outputs are O(1); a few hundred rounding steps per value */
    double worst = 0, worst_s = 0;
    for (int i = 0; i < n_tok * nv * dv; i++) worst = fmax(worst, fabs(out[i] - outd[i]));
    for (int i = 0; i < nv * dk * dv; i++) worst_s = fmax(worst_s, fabs(S[i] - Sd[i]));
    cr_assert_lt(worst, 2e-5, "%s gdn, %d tokens, level %d: max |dout| %g", chunked ? "chunked" : "recurrent", n_tok, (int)level, worst);
    cr_assert_lt(worst_s, 2e-5, "%s gdn, %d tokens: max |dstate| %g", chunked ? "chunked" : "recurrent", n_tok, worst_s);
    free(qkv); free(g); free(beta); free(S); free(out); free(Sd); free(outd);
    backend_free(be);
}

/* every kernel level against the same f64 reference: never a kernel against itself */
static void check_gdn(bool chunked, int n_tok, float gscale) {
    check_gdn_level(chunked, n_tok, gscale, QUANT_CPU_REF);
    if (quant_cpu_level_detect() != QUANT_CPU_REF) check_gdn_level(chunked, n_tok, gscale, quant_cpu_level_detect());
}

Test(backend_ops, gdn_recurrent_matches_f64_reference) { check_gdn(false, 1, 0.3f); check_gdn(false, 150, 0.3f); check_gdn(false, 150, 4.0f); }
Test(backend_ops, gdn_chunked_matches_f64_reference) { check_gdn(true, 1, 0.3f); check_gdn(true, 64, 0.3f); check_gdn(true, 150, 0.3f); check_gdn(true, 150, 4.0f); check_gdn(true, 150, 0.01f); }

/* f64 reference attention over an f16 cache (values as stored). */
static void check_attention(enum quant_cpu_level level, int n_ctx, int D) {
    const int H = 4, HKV = 2, kvd = HKV * D, n_tok = 3;
    struct backend *be = backend_cpu_init(2, level);
    float *q = malloc(sizeof(float) * n_tok * H * D), *out = malloc(sizeof(float) * n_tok * H * D);
    float *kf = malloc(sizeof(float) * n_ctx * kvd), *vf = malloc(sizeof(float) * n_ctx * kvd);
    uint16_t *kc = malloc(sizeof(uint16_t) * n_ctx * kvd), *vc = malloc(sizeof(uint16_t) * n_ctx * kvd);
    fill(q, (size_t)n_tok * H * D, 1.0f);
    fill(kf, (size_t)n_ctx * kvd, 1.0f);
    fill(vf, (size_t)n_ctx * kvd, 1.0f);
    int32_t cells[512], cell0[3], nctx[3];
    for (int i = 0; i < n_ctx; i++) cells[i] = i;
    be->kv_store(be, kf, kvd, vf, kvd, n_ctx, kvd, cells, kc, vc);
    for (int t = 0; t < n_tok; t++) { cell0[t] = 0; nctx[t] = n_ctx - n_tok + 1 + t; }
    const float scale = 1.0f / sqrtf((float)D);
    be->attention(be, q, H * D, D, kc, vc, cell0, nctx, n_tok, H, HKV, D, scale, out);
    double worst = 0;
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < H; h++) {
            const int hk = h / (H / HKV);
            double s[512], mx = -1e300, sum = 0;
            for (int c = 0; c < nctx[t]; c++) {
                double d = 0;
                for (int i = 0; i < D; i++) d += (double)q[(t * H + h) * D + i] * fp16_to_f32(kc[c * kvd + hk * D + i]);
                s[c] = d * scale;
                if (s[c] > mx) mx = s[c];
            }
            for (int c = 0; c < nctx[t]; c++) { s[c] = exp(s[c] - mx); sum += s[c]; }
            for (int i = 0; i < D; i++) {
                double o = 0;
                for (int c = 0; c < nctx[t]; c++) o += s[c] / sum * fp16_to_f32(vc[c * kvd + hk * D + i]);
                worst = fmax(worst, fabs(o - out[(t * H + h) * D + i]));
            }
        }
    /* outputs are convex combinations of values in [-1, 1]: f32 error ~1e-6 */
    cr_assert_lt(worst, 1e-5, "attention level %d, ctx %d, D %d: max |dout| %g", (int)level, n_ctx, D, worst);
    free(q); free(out); free(kf); free(vf); free(kc); free(vc);
    backend_free(be);
}

Test(backend_ops, attention_matches_f64_reference) {
    enum quant_cpu_level levels[2] = {QUANT_CPU_REF, quant_cpu_level_detect()};
    for (int l = 0; l < 2; l++) {
        check_attention(levels[l], 5, 64);
        check_attention(levels[l], 300, 64);
        check_attention(levels[l], 37, 24); /* head dim not a multiple of 16: masked tails */
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
