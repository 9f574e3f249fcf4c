/* ops_body.h — kernel bodies shared by the reference and SIMD instances (see ops.h).
 * The including file defines the vector primitives vdot, vdot_rows, vdot2_rows, vaxpy_rows, vscale_add, vmul,
 * cvt_rows_f16, cvt_rows_bf16, cvt_rows_q8_0, cvt_rows_q4_0 (cache rows of a KV type, `stride`
 * bytes apart, to packed f32 rows: exact, so every instance gives the same floats), vscale, vmax, vexp_shift and the OPS_NAME(x) suffix macro; the
 * algorithms are written only here. */
#include <math.h>
#include <string.h>

/* nb cache rows of type t, stride bytes apart, to packed f32 rows of n. */
static inline void OPS_NAME(cvt_rows)(enum ggml_type t, float *y, const uint8_t *x, size_t stride, int nb, int n) {
    switch (t) {
    case GGML_TYPE_BF16: cvt_rows_bf16(y, x, stride, nb, n); break;
    case GGML_TYPE_Q8_0: cvt_rows_q8_0(y, x, stride, nb, n); break;
    case GGML_TYPE_Q4_0: cvt_rows_q4_0(y, x, stride, nb, n); break;
    default: cvt_rows_f16(y, x, stride, nb, n); break;
    }
}

/* Tokens [t0, t0 + nt) and one KV head: every (token, query head) pair of the group (GQA) over
 * the cached rows, in blocks that are converted from the cache's types once and shared by the
 * pairs of a pass: the query heads of the KV head and consecutive tokens of one sequence (the
 * same first cell), a prompt's or a verify's tokens reading the rows they share once. Per pair:
 * the block's scores, one rescale of the running sum if the block raised the maximum, the
 * block's exponentials in one vector pass, then the value sum. Blocks start at the sequence's
 * first cell whatever the pass, so a (token, head)'s result depends only on its own q and cache
 * rows, never on the batch or on the pairs beside it. */
#define ATTN_BLOCK 64
#define ATTN_BLOCK_FLOATS 4096          /* f32 per converted block: 64 rows of 64, 8 of 512 */
static void OPS_NAME(attn_tokens)(const struct attn_job *j, int t0, int nt, int hk) {
    const int D = j->head_dim, G = j->n_head / j->n_head_kv;
    const int blk = ATTN_BLOCK_FLOATS / D < ATTN_BLOCK ? ATTN_BLOCK_FLOATS / D : ATTN_BLOCK;
    /* K and V blocks 64 bytes off a 4 KiB multiple from each other: loads from one then do
     * not falsely wait on stores to the other (4K aliasing) */
    float kv[2 * ATTN_BLOCK_FLOATS + 16], p[ATTN_BLOCK];
    float *kf = kv, *vf = kv + ATTN_BLOCK_FLOATS + 16;
    float acc[ATTN_PAIRS_PER_PASS][CPU_ATTN_MAX_HEAD_DIM], m[ATTN_PAIRS_PER_PASS], l[ATTN_PAIRS_PER_PASS];
    int pt[ATTN_PAIRS_PER_PASS], ph[ATTN_PAIRS_PER_PASS];
    int t = t0, g = 0; /* the next pair */
    while (t < t0 + nt) {
        const int32_t c0 = j->cell0[t];
        int np = 0, n_max = 0;
        while (np < ATTN_PAIRS_PER_PASS && t < t0 + nt && j->cell0[t] == c0) {
            pt[np] = t;
            ph[np] = hk * G + g;
            m[np] = -INFINITY;
            l[np] = 0.0f;
            memset(acc[np], 0, sizeof(float) * (size_t)D);
            n_max = j->n_ctx[t] > n_max ? j->n_ctx[t] : n_max;
            np++;
            if (++g == G) { g = 0; t++; }
        }
        for (int b0 = 0; b0 < n_max; b0 += blk) {
            const int nb = n_max - b0 < blk ? n_max - b0 : blk;
            const size_t cell = (size_t)(c0 + b0);
            OPS_NAME(cvt_rows)(j->k_type, kf, j->k + cell * j->k_row_bytes + (size_t)hk * j->k_head_bytes, j->k_row_bytes,
                               nb, D);
            OPS_NAME(cvt_rows)(j->v_type, vf, j->v + cell * j->v_row_bytes + (size_t)hk * j->v_head_bytes, j->v_row_bytes,
                               nb, D);
            for (int i = 0; i < np; i++) {
                const int n = j->n_ctx[pt[i]];
                if (b0 >= n) continue;
                const int nbi = n - b0 < blk ? n - b0 : blk;
                const float *q = j->q + (size_t)pt[i] * j->q_stride + (size_t)ph[i] * j->q_head_stride;
                vdot_rows(q, kf, nbi, D, j->scale, p);
                const float mb = vmax(p, nbi, m[i]);
                if (mb > m[i]) {
                    const float corr = expf(m[i] - mb);
                    vscale(acc[i], corr, D);
                    l[i] *= corr;
                    m[i] = mb;
                }
                l[i] += vexp_shift(p, nbi, m[i]);
                vaxpy_rows(acc[i], p, vf, nbi, D);
            }
        }
        for (int i = 0; i < np; i++) {
            float *o = j->out + (size_t)pt[i] * j->n_head * D + (size_t)ph[i] * D;
            const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
            for (int e = 0; e < D; e++) o[e] = acc[i][e] * inv;
        }
    }
}

static void OPS_NAME(l2_normalize)(const float *x, float *y, int n, float eps) {
    const float nrm = sqrtf(vdot(x, x, n));
    const float inv = 1.0f / (nrm > eps ? nrm : eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * inv;
}

/* Where v-head h's parts of a pending-row record lie (struct state_run.pend; all NULL without one). */
struct gdn_pend_head { float *d, *delta, *k; };
static inline struct gdn_pend_head OPS_NAME(gdn_pend_at)(const struct gdn_job *j, int h) {
    float *p = j->pend + j->nv;
    return (struct gdn_pend_head){p + h, p + j->nv + (size_t)h * j->dv, p + j->nv + (size_t)j->nv * j->dv + (size_t)h * j->dk};
}
/* Value rows [r0, r0 + nr) of head state S get the pending row's update: the same vscale_add the
 * rule's own update makes, so a deferred row lands bit for bit as it would have in its run. */
static inline void OPS_NAME(gdn_pend_apply)(const struct gdn_pend_head *ph, float *S, int r0, int nr, int dk) {
    for (int r = r0; r < r0 + nr; r++) vscale_add(S + (size_t)r * dk, *ph->d, ph->delta[r], ph->k, dk);
}

/* One v-head over all tokens: S ← e^g S; δ = β(v − Sᵀk); S ← S + k δᵀ; o = Sᵀq / √dk.
 * Both products are taken from the state before the token, so both come out of one pass of
 * vdot2_rows (a reduction tree per 8 value rows, not a horizontal sum per row): with
 * d = e^g, Sᵀk = d (S_oldᵀk) and Sᵀq = d (S_oldᵀq) + δ (k·q). The state is then written once,
 * S ← d S + k δᵀ. A pending row is applied to each pass's rows just before the first token
 * reads them; a deferred last token keeps its δ, d and k instead of writing S. */
#define GDN_ROWS 64   /* value rows per pass: the products of a pass stay on the stack */
static void OPS_NAME(gdn_head)(const struct gdn_job *j, int h) {
    const int dk = j->dk, dv = j->dv, gk = h % j->nk;
    const size_t st_elems = (size_t)j->nv * dk * dv;
    float *S = j->state + (size_t)h * dk * dv;   /* S[jv][i]: value row jv, key index i */
    float q[CPU_GDN_MAX_DIM], kk[CPU_GDN_MAX_DIM], sk[GDN_ROWS], sq[GDN_ROWS];
    const float qscale = 1.0f / sqrtf((float)dk);
    struct gdn_pend_head ph = {0};
    if (j->pend) ph = OPS_NAME(gdn_pend_at)(j, h);
    bool pending = j->pend && j->pend[h] != 0.0f;
    const int n_upd = j->defer ? j->n_tok - 1 : j->n_tok;   /* tokens whose update reaches S */
    if (pending && j->n_tok == 0) OPS_NAME(gdn_pend_apply)(&ph, S, 0, dv, dk);
    for (int t = 0; t < j->n_tok; t++) {
        const float *row = j->qkv + (size_t)t * j->qkv_stride;
        OPS_NAME(l2_normalize)(row + (size_t)gk * dk, q, dk, j->eps);
        OPS_NAME(l2_normalize)(row + (size_t)j->nk * dk + (size_t)gk * dk, kk, dk, j->eps);
        const float *v = row + (size_t)2 * j->nk * dk + (size_t)h * dv;
        const float decay = expf(j->g[(size_t)t * j->nv + h]);
        const float b = j->beta[(size_t)t * j->nv + h];
        const float kq = vdot(kk, q, dk);
        float *o = j->out + (size_t)t * j->nv * dv + (size_t)h * dv;
        for (int r0 = 0; r0 < dv; r0 += GDN_ROWS) {
            const int nr = dv - r0 < GDN_ROWS ? dv - r0 : GDN_ROWS;
            float *S0 = S + (size_t)r0 * dk;
            if (pending) OPS_NAME(gdn_pend_apply)(&ph, S, r0, nr, dk);
            vdot2_rows(kk, q, S0, nr, dk, sk, sq);
            for (int r = 0; r < nr; r++) {
                const float delta = b * (v[r0 + r] - decay * sk[r]);
                o[r0 + r] = (decay * sq[r] + delta * kq) * qscale;
                if (t < n_upd) vscale_add(S0 + (size_t)r * dk, decay, delta, kk, dk);
                else ph.delta[r0 + r] = delta;
            }
        }
        pending = false;
        if (t == n_upd) {
            *ph.d = decay;
            memcpy(ph.k, kk, sizeof(float) * (size_t)dk);
        }
        if (j->snap && t < j->n_snap)
            memcpy(j->snap + (size_t)t * st_elems + (size_t)h * dk * dv, S, sizeof(float) * (size_t)dk * dv);
    }
    if (j->pend) j->pend[h] = j->defer && j->n_tok > 0 ? 1.0f : 0.0f;
}

/* Chunked form, one v-head: for each chunk of up to GDN_CHUNK tokens, with G the cumulative
 * log-decay inside the chunk and Γ_ij = e^{G_i−G_j}: A_ij = β_i (k_i·k_j) Γ_ij (j < i). The new
 * values Vnew solve (I + A) Vnew = X with x_i = β_i (v_i − e^{G_i} Sᵀk_i), by forward
 * substitution; then O = e^G (Q S) + P Vnew with P_ij = (q_i·k_j) Γ_ij (j ≤ i), and
 * S' = e^{G_last} S + Σ_j Γ_last,j k_j Vnew_jᵀ. Every product is a pass of the row primitives
 * over packed rows (a row's sums stay in registers), not a store per element. */
static void OPS_NAME(gdn_chunked_head)(const struct gdn_job *j, int h, struct gdn_chunk_scratch *cs) {
    const int dk = j->dk, dv = j->dv, gk = h % j->nk;
    float *S = j->state + (size_t)h * dk * dv;   /* S[jv][i] */
    const float qscale = 1.0f / sqrtf((float)dk);
    if (j->pend && j->pend[h] != 0.0f) {
        const struct gdn_pend_head ph = OPS_NAME(gdn_pend_at)(j, h);
        OPS_NAME(gdn_pend_apply)(&ph, S, 0, dv, dk);
        j->pend[h] = 0.0f;
    }
    for (int t0 = 0; t0 < j->n_tok; t0 += GDN_CHUNK) {
        const int C = j->n_tok - t0 < GDN_CHUNK ? j->n_tok - t0 : GDN_CHUNK;
        float G = 0.0f;
        for (int i = 0; i < C; i++) {
            const float *row = j->qkv + (size_t)(t0 + i) * j->qkv_stride;
            float *q = cs->q + (size_t)i * dk;
            OPS_NAME(l2_normalize)(row + (size_t)gk * dk, q, dk, j->eps);
            vscale(q, qscale, dk);
            OPS_NAME(l2_normalize)(row + (size_t)j->nk * dk + (size_t)gk * dk, cs->k + (size_t)i * dk, dk, j->eps);
            G += j->g[(size_t)(t0 + i) * j->nv + h];
            cs->G[i] = G;
            cs->b[i] = j->beta[(size_t)(t0 + i) * j->nv + h];
        }
        /* from the state entering the chunk, Sᵀk_i and Sᵀq_i in one pass over S: x_i into u,
         * the outputs' first term e^{G_i} Sᵀq_i into out */
        for (int i = 0; i < C; i++) {
            const float *v = j->qkv + (size_t)(t0 + i) * j->qkv_stride + (size_t)2 * j->nk * dk + (size_t)h * dv;
            float *u = cs->u + (size_t)i * dv, *o = j->out + (size_t)(t0 + i) * j->nv * dv + (size_t)h * dv;
            vdot2_rows(cs->k + (size_t)i * dk, cs->q + (size_t)i * dk, S, dv, dk, u, o);
            const float eg = expf(cs->G[i]), b = cs->b[i];
            vscale_add(u, -b * eg, b, v, dv);
            vscale(o, eg, dv);
        }
        /* row i of Γ (one vector exp), of −A and of P (A's row also gets k_i·k_i, never read);
         * the last row of Γ stays in dec for the state update */
        float dec[GDN_CHUNK];
        for (int i = 0; i < C; i++) {
            for (int jj = 0; jj <= i; jj++) dec[jj] = -cs->G[jj];
            vexp_shift(dec, i + 1, -cs->G[i]);
            vdot2_rows(cs->k + (size_t)i * dk, cs->q + (size_t)i * dk, cs->k, i + 1, dk, cs->A[i], cs->P[i]);
            vmul(cs->A[i], dec, i);
            vscale(cs->A[i], -cs->b[i], i);
            vmul(cs->P[i], dec, i + 1);
        }
        /* forward substitution, each Vnew row as soon as the rows before it are known, and its
         * output's second term */
        for (int i = 0; i < C; i++) {
            vaxpy_rows(cs->u + (size_t)i * dv, cs->A[i], cs->u, i, dv);
            vaxpy_rows(j->out + (size_t)(t0 + i) * j->nv * dv + (size_t)h * dv, cs->P[i], cs->u, i + 1, dv);
        }
        /* state leaving the chunk: row jv of S gets Σ_j Γ_last,j Vnew_j[jv] k_j, the
         * coefficients laid out per value row */
        const int l = C - 1;
        for (int jj = 0; jj < C; jj++) {
            const float c = dec[jj];
            const float *u = cs->u + (size_t)jj * dv;
            for (int jv = 0; jv < dv; jv++) cs->ut[(size_t)jv * C + jj] = c * u[jv];
        }
        const float egl = expf(cs->G[l]);
        for (int jv = 0; jv < dv; jv++) {
            float *s = S + (size_t)jv * dk;
            vscale(s, egl, dk);
            vaxpy_rows(s, cs->ut + (size_t)jv * C, cs->k, C, dk);
        }
    }
}
