/* ops_body.h — kernel bodies shared by the reference and SIMD instances (see ops.h).
 * The including file defines the vector primitives vdot, vdot_f16, vdot_rows_f16, vaxpy,
 * vaxpy_f16, vaxpy_rows_f16, vscale, vexp_shift and the OPS_NAME(x) suffix macro; the
 * algorithms are written only here. */
#include <math.h>
#include <string.h>

/* One (token, head) pair: softmax over the cached rows in blocks of ATTN_BLOCK, f32
 * accumulation: the scores of a block first, then one rescale of the running sum if the
 * block raised the maximum, then the block's exponentials in one vector pass. The result of
 * a (token, head) depends only on its own q and cache rows, never on the batch. */
#define ATTN_BLOCK 64
static void OPS_NAME(attn_one)(const struct attn_job *j, int t, int h) {
    const int D = j->head_dim, kvd = j->n_head_kv * D;
    const int hk = h / (j->n_head / j->n_head_kv);
    const float *q = j->q + (size_t)t * j->q_stride + (size_t)h * j->q_head_stride;
    float acc[CPU_ATTN_MAX_HEAD_DIM], p[ATTN_BLOCK];
    float m = -INFINITY, l = 0.0f;
    memset(acc, 0, sizeof(float) * (size_t)D);
    const int32_t c0 = j->cell0[t], n = j->n_ctx[t];
    for (int b0 = 0; b0 < n; b0 += ATTN_BLOCK) {
        const int nb = n - b0 < ATTN_BLOCK ? n - b0 : ATTN_BLOCK;
        vdot_rows_f16(q, j->k + (size_t)(c0 + b0) * kvd + (size_t)hk * D, (size_t)kvd, nb, D, j->scale, p);
        float mb = m;
        for (int c = 0; c < nb; c++) if (p[c] > mb) mb = p[c];
        if (mb > m) {
            const float corr = expf(m - mb);
            vscale(acc, corr, D);
            l *= corr;
            m = mb;
        }
        l += vexp_shift(p, nb, m);
        vaxpy_rows_f16(acc, p, j->v + (size_t)(c0 + b0) * kvd + (size_t)hk * D, (size_t)kvd, nb, D);
    }
    float *o = j->out + (size_t)t * j->n_head * D + (size_t)h * D;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int i = 0; i < D; i++) o[i] = acc[i] * inv;
}

static void OPS_NAME(l2_normalize)(const float *x, float *y, int n, float eps) {
    const float nrm = sqrtf(vdot(x, x, n));
    const float inv = 1.0f / (nrm > eps ? nrm : eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * inv;
}

/* One v-head over all tokens: S ← e^g S; δ = β(v − Sᵀk); S ← S + k δᵀ; o = Sᵀq / √dk. */
static void OPS_NAME(gdn_head)(const struct gdn_job *j, int h) {
    const int dk = j->dk, dv = j->dv, gk = h % j->nk;
    const size_t st_elems = (size_t)j->nv * dk * dv;
    float *S = j->state + (size_t)h * dk * dv;   /* S[jv][i]: value row jv, key index i */
    float q[CPU_GDN_MAX_DIM], kk[CPU_GDN_MAX_DIM];
    const float qscale = 1.0f / sqrtf((float)dk);
    for (int t = 0; t < j->n_tok; t++) {
        const float *row = j->qkv + (size_t)t * j->qkv_stride;
        OPS_NAME(l2_normalize)(row + (size_t)gk * dk, q, dk, j->eps);
        OPS_NAME(l2_normalize)(row + (size_t)j->nk * dk + (size_t)gk * dk, kk, dk, j->eps);
        const float *v = row + (size_t)2 * j->nk * dk + (size_t)h * dv;
        const float decay = expf(j->g[(size_t)t * j->nv + h]);
        const float b = j->beta[(size_t)t * j->nv + h];
        float *o = j->out + (size_t)t * j->nv * dv + (size_t)h * dv;
        for (int jv = 0; jv < dv; jv++) {
            float *s = S + (size_t)jv * dk;
            vscale(s, decay, dk);
            const float delta = b * (v[jv] - vdot(s, kk, dk));
            vaxpy(s, delta, kk, dk);
            o[jv] = vdot(s, q, dk) * qscale;
        }
        if (j->snap && t < j->n_snap)
            memcpy(j->snap + (size_t)t * st_elems + (size_t)h * dk * dv, S, sizeof(float) * (size_t)dk * dv);
    }
}

/* Chunked form, one v-head: for each chunk of up to GDN_CHUNK tokens, with G the cumulative
 * log-decay inside the chunk and Γ_ij = e^{G_i−G_j}: A_ij = β_i (k_i·k_j) Γ_ij (j < i);
 * solve (I + A) U = diag(β) V and (I + A) W = diag(β e^G) K by forward substitution; then
 * Vnew = U − W S, O = e^G (Q S) + P Vnew with P_ij = (q_i·k_j) Γ_ij (j ≤ i), and
 * S' = e^{G_last} S + Σ_j Γ_last,j k_j Vnew_jᵀ. */
static void OPS_NAME(gdn_chunked_head)(const struct gdn_job *j, int h, struct gdn_chunk_scratch *cs) {
    const int dk = j->dk, dv = j->dv, gk = h % j->nk;
    float *S = j->state + (size_t)h * dk * dv;   /* S[jv][i] */
    const float qscale = 1.0f / sqrtf((float)dk);
    float sT[CPU_GDN_MAX_DIM];
    for (int t0 = 0; t0 < j->n_tok; t0 += GDN_CHUNK) {
        const int C = j->n_tok - t0 < GDN_CHUNK ? j->n_tok - t0 : GDN_CHUNK;
        float G = 0.0f;
        for (int i = 0; i < C; i++) {
            const float *row = j->qkv + (size_t)(t0 + i) * j->qkv_stride;
            OPS_NAME(l2_normalize)(row + (size_t)gk * dk, cs->q[i], dk, j->eps);
            vscale(cs->q[i], qscale, dk);
            OPS_NAME(l2_normalize)(row + (size_t)j->nk * dk + (size_t)gk * dk, cs->k[i], dk, j->eps);
            G += j->g[(size_t)(t0 + i) * j->nv + h];
            cs->G[i] = G;
            cs->b[i] = j->beta[(size_t)(t0 + i) * j->nv + h];
        }
        for (int i = 0; i < C; i++)
            for (int jj = 0; jj <= i; jj++) cs->decay[i][jj] = expf(cs->G[i] - cs->G[jj]);
        for (int i = 0; i < C; i++)
            for (int jj = 0; jj < i; jj++) cs->A[i][jj] = cs->b[i] * vdot(cs->k[i], cs->k[jj], dk) * cs->decay[i][jj];
        /* forward substitution: u_i = β_i v_i − Σ A_ij u_j ; w_i = β_i e^{G_i} k_i − Σ A_ij w_j */
        for (int i = 0; i < C; i++) {
            const float *v = j->qkv + (size_t)(t0 + i) * j->qkv_stride + (size_t)2 * j->nk * dk + (size_t)h * dv;
            const float bw = cs->b[i] * expf(cs->G[i]);
            for (int d = 0; d < dv; d++) cs->u[i][d] = cs->b[i] * v[d];
            for (int d = 0; d < dk; d++) cs->w[i][d] = bw * cs->k[i][d];
            for (int jj = 0; jj < i; jj++) {
                vaxpy(cs->u[i], -cs->A[i][jj], cs->u[jj], dv);
                vaxpy(cs->w[i], -cs->A[i][jj], cs->w[jj], dk);
            }
        }
        /* Vnew = U − W S (into u) */
        for (int i = 0; i < C; i++)
            for (int jv = 0; jv < dv; jv++) cs->u[i][jv] -= vdot(cs->w[i], S + (size_t)jv * dk, dk);
        /* outputs: o_i = e^{G_i} Sᵀq_i + Σ_{j≤i} P_ij Vnew_j */
        for (int i = 0; i < C; i++) {
            float *o = j->out + (size_t)(t0 + i) * j->nv * dv + (size_t)h * dv;
            const float eg = expf(cs->G[i]);
            for (int jv = 0; jv < dv; jv++) o[jv] = eg * vdot(cs->q[i], S + (size_t)jv * dk, dk);
            for (int jj = 0; jj <= i; jj++) vaxpy(o, vdot(cs->q[i], cs->k[jj], dk) * cs->decay[i][jj], cs->u[jj], dv);
        }
        /* state leaving the chunk: row jv of S gets Σ_j Γ_last,j Vnew_j[jv] k_j */
        const int l = C - 1;
        const float egl = expf(cs->G[l]);
        for (int jv = 0; jv < dv; jv++) {
            float *s = S + (size_t)jv * dk;
            vscale(s, egl, dk);
            for (int jj = 0; jj < C; jj++) sT[jj] = cs->decay[l][jj] * cs->u[jj][jv];
            for (int jj = 0; jj < C; jj++) vaxpy(s, sT[jj], cs->k[jj], dk);
        }
    }
}
