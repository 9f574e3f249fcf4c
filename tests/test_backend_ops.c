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

static void check_gdn(bool chunked, int n_tok, float gscale) {
    const int nk = 2, nv = 4, dk = 16, dv = 16, ch = 2 * nk * dk + nv * dv;
    struct backend *be = backend_cpu_init(2, quant_cpu_level_detect());
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
    cr_assert_lt(worst, 2e-5, "%s gdn, %d tokens: max |dout| %g", chunked ? "chunked" : "recurrent", n_tok, worst);
    cr_assert_lt(worst_s, 2e-5, "%s gdn, %d tokens: max |dstate| %g", chunked ? "chunked" : "recurrent", n_tok, worst_s);
    free(qkv); free(g); free(beta); free(S); free(out); free(Sd); free(outd);
    backend_free(be);
}

Test(backend_ops, gdn_recurrent_matches_f64_reference) { check_gdn(false, 1, 0.3f); check_gdn(false, 150, 0.3f); check_gdn(false, 150, 4.0f); }
Test(backend_ops, gdn_chunked_matches_f64_reference) { check_gdn(true, 1, 0.3f); check_gdn(true, 64, 0.3f); check_gdn(true, 150, 0.3f); check_gdn(true, 150, 4.0f); check_gdn(true, 150, 0.01f); }
