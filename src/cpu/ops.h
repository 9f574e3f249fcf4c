/* ops.h — the CPU backend's non-matmul kernels that are worth SIMD (attention over the KV
 * cache of any KV type, its rows converted a block at a time for several tokens, the delta rule in both forms, the exp-based activations, argmax). Their bodies live once in ops_body.h and are
 * compiled three times: ops_ref.c (plain C, the reference), ops_avx2.c and ops_avx512.c (their
 * vector primitives); backend_cpu.c picks a table at init from the CPU level. */
#ifndef COTI_CPU_OPS_H
#define COTI_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "quant/quant.h"

#define CPU_ATTN_MAX_HEAD_DIM 512
#define ATTN_PAIRS_PER_PASS 16   /* (token, query head) pairs sharing a converted cache block */
#define CPU_GDN_MAX_DIM 256
#define GDN_CHUNK 64

struct attn_job {
    const float *q; int q_stride, q_head_stride;
    const uint8_t *k, *v;                  /* cache rows: k_row_bytes (v_row_bytes) per cell */
    enum ggml_type k_type, v_type;         /* F16, BF16, Q8_0 or Q4_0 (kv.h's kv_types) */
    size_t k_row_bytes, v_row_bytes, k_head_bytes, v_head_bytes;
    const int32_t *cell0, *n_ctx;
    int n_tok, n_head, n_head_kv, head_dim; float scale; float *out;
};

/* pend, defer: struct state_run's (the recurrent form takes both, the chunked form applies a
 * pending row only); a head's worker reads and writes only that head's parts of pend. */
struct gdn_job {
    const float *qkv; int qkv_stride; const float *g, *beta; float *state;
    int n_tok, nk, nv, dk, dv; float eps; float *out, *snap; int n_snap;
    float *pend; bool defer;
};

/* Scratch of one chunked-form call for one thread (too large for a worker's stack). q, k and u
 * hold a chunk's rows packed (dk or dv apart), ut the state update's coefficients per value row
 * (C apart), so the row primitives walk contiguous rows. */
struct gdn_chunk_scratch {
    float q[GDN_CHUNK * CPU_GDN_MAX_DIM], k[GDN_CHUNK * CPU_GDN_MAX_DIM];
    float u[GDN_CHUNK * CPU_GDN_MAX_DIM], ut[GDN_CHUNK * CPU_GDN_MAX_DIM];
    float A[GDN_CHUNK][GDN_CHUNK], P[GDN_CHUNK][GDN_CHUNK], G[GDN_CHUNK], b[GDN_CHUNK];
};

struct cpu_ops {
    /* attention of tokens [t0, t0 + nt) for all query heads of KV head hk */
    void (*attn_tokens)(const struct attn_job *j, int t0, int nt, int hk);
    /* one v-head over all tokens of the job, per-token recurrence */
    void (*gdn_head)(const struct gdn_job *j, int h);
    /* one v-head over all tokens of the job, chunked form */
    void (*gdn_chunked_head)(const struct gdn_job *j, int h, struct gdn_chunk_scratch *cs);
    /* y[i] = x[i] / (1 + e^-x[i]) and y[i] = 1 / (1 + e^-x[i]); y may be x */
    void (*silu)(const float *x, float *y, int n);
    void (*sigmoid)(const float *x, float *y, int n);
    /* one token of the kernel-4 causal conv (the delta-net's): y[c] = Σ_i w[c][i] st[c][i] +
     * w[c][3] x[c], summed in that order; st[c] = {st[c][1], st[c][2], x[c]} */
    void (*conv4_token)(const float *x, int n_ch, const float *w, float *state, float *y);
    /* Σ x[i]² in double (RMSNorm's sum, as llama.cpp keeps it) */
    double (*sum_sq)(const float *x, int n);
    /* y[i] = x[i] as IEEE f16, round to nearest even (the KV cache) */
    void (*to_f16)(const float *x, uint16_t *y, int n);
    /* Σ e^(x[i] - m) (the softmax denominator for the maximum m; 1/it is p of the argmax) */
    double (*exp_sum)(const float *x, int n, float m);
    /* index of the first maximum (NaNs never win; 0 if x[0] is NaN) */
    int (*argmax)(const float *x, int n);
};

/* conv4_token's definition for channels [c0, c1): the reference, and the SIMD tail */
static inline void conv4_channels(const float *x, int c0, int c1, const float *w, float *state, float *y) {
    for (int c = c0; c < c1; c++) {
        float *st = state + 3 * c;
        const float *wc = w + 4 * c;
        float s = 0.0f;
        s += wc[0] * st[0];
        s += wc[1] * st[1];
        s += wc[2] * st[2];
        s += wc[3] * x[c];
        st[0] = st[1];
        st[1] = st[2];
        st[2] = x[c];
        y[c] = s;
    }
}

extern const struct cpu_ops cpu_ops_ref;
extern const struct cpu_ops cpu_ops_avx2;
extern const struct cpu_ops cpu_ops_avx512;

/* The table a CPU level runs: the best instance at or below it. */
static inline const struct cpu_ops *cpu_ops_for_level(enum quant_cpu_level level) {
    return level >= QUANT_CPU_AVX512 ? &cpu_ops_avx512 : level >= QUANT_CPU_AVX2 ? &cpu_ops_avx2 : &cpu_ops_ref;
}

#endif
