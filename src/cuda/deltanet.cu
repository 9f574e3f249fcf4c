/* deltanet.cu — the gated delta net's conv, gates and delta rule on the device.
 *
 * ssm_conv: a thread per channel walks the tokens in order with the state in registers (the
 *   CPU's operation order, non-contracted; only expf in SiLU differs).
 * gdn: the recurrence of arch-qwen35.md §5.5 with the state row S[j][·] of each value index j
 *   independent of the others given (q, k, β, g, v_j): a warp owns GDN_ROWS rows of one head
 *   for the whole run, in registers (dk spread over the lanes), and steps through the tokens;
 *   per token two warp reductions per row (Sᵀk, then Sᵀq). Sums are reordered against the CPU
 *   (lane partials + butterfly), so outputs agree to f32 rounding. The gates (decay, β) are
 *   formed here from their raw inputs by the CPU's expressions.
 * gdn_chunked: the same recurrent kernel (the interface allows any form equal up to rounding);
 *   a chunked tensor-core form is future work for long prompts. */
#include "cuda_internal.cuh"

#define CONV_MAX_TAPS 16

__global__ void ssm_conv_kernel(const float *__restrict__ x, int n_tok, int n_ch, int k, const float *__restrict__ w,
                                float *state, float *y, float *snap, int n_snap) {
    cuda_pdl_begin();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= n_ch) return;
    const int ks = k - 1;
    float st[CONV_MAX_TAPS - 1], wv[CONV_MAX_TAPS - 1];
#pragma unroll
    for (int i = 0; i < CONV_MAX_TAPS - 1; i++) {
        st[i] = i < ks ? state[(size_t)c * ks + i] : 0.0f;
        wv[i] = i < ks ? w[(size_t)c * k + i] : 0.0f;
    }
    const float wl = w[(size_t)c * k + ks];
    for (int t = 0; t < n_tok; t++) {
        const float xt = x[(size_t)t * n_ch + c];
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < CONV_MAX_TAPS - 1; i++)
            if (i < ks) s = __fadd_rn(s, __fmul_rn(wv[i], st[i]));
        s = __fadd_rn(s, __fmul_rn(wl, xt));
#pragma unroll
        for (int i = 0; i < CONV_MAX_TAPS - 2; i++)
            if (i + 1 < ks) st[i] = st[i + 1];
#pragma unroll
        for (int i = 0; i < CONV_MAX_TAPS - 1; i++)
            if (i == ks - 1) st[i] = xt;
        y[(size_t)t * n_ch + c] = cuda_silu(s);
        if (snap && t < n_snap) {
            float *sp = snap + (size_t)t * n_ch * ks + (size_t)c * ks;
#pragma unroll
            for (int i = 0; i < CONV_MAX_TAPS - 1; i++)
                if (i < ks) sp[i] = st[i];
        }
    }
#pragma unroll
    for (int i = 0; i < CONV_MAX_TAPS - 1; i++)
        if (i < ks) state[(size_t)c * ks + i] = st[i];
}

void cuda_ssm_conv(struct backend *be, const float *x, int n_tok, int n_ch, int k, const float *w,
                   float *state, float *y, float *snap, int n_snap) {
    struct cuda_ctx *c = cuda_enter(be);
    if (n_tok < 1 || n_ch < 1) return;
    if (k < 1 || k > CONV_MAX_TAPS) abort(); /* model loading rejects such files */
    cuda_launch(c, cuda_cdiv(n_ch, 128), 128, ssm_conv_kernel, x, n_tok, n_ch, k, w, state, y, snap, n_snap);
}

#define GDN_WARPS 4
#define GDN_ROWS 4
#define GDN_MAX_DIM 256

/* NE = key elements per lane (dk <= 32·NE): element i of a lane is lane + 32·i. */
template <int NE>
__global__ void __launch_bounds__(GDN_WARPS * 32)
gdn_kernel(const float *__restrict__ qkv, int qkv_stride, const gdn_gates gt, float *state, int n_tok, int nk,
           int nv, int dk, int dv, float eps, float *__restrict__ out, float *__restrict__ snap, int n_snap) {
    cuda_pdl_begin();
    const int h = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int j0 = (blockIdx.x * GDN_WARPS + warp) * GDN_ROWS;
    if (j0 >= dv) return;
    const int gk = h % nk;
    const size_t st_elems = (size_t)nv * dk * dv;
    float *S = state + (size_t)h * dk * dv;
    float s[GDN_ROWS][NE];
#pragma unroll
    for (int r = 0; r < GDN_ROWS; r++)
#pragma unroll
        for (int i = 0; i < NE; i++) {
            const int e = lane + 32 * i;
            s[r][i] = (e < dk && j0 + r < dv) ? S[(size_t)(j0 + r) * dk + e] : 0.0f;
        }
    const float qscale = 1.0f / sqrtf((float)dk);
    for (int t = 0; t < n_tok; t++) {
        const float *row = qkv + (size_t)t * qkv_stride;
        float qv[NE], kv[NE], sq = 0.0f, sk = 0.0f;
#pragma unroll
        for (int i = 0; i < NE; i++) {
            const int e = lane + 32 * i;
            qv[i] = e < dk ? row[(size_t)gk * dk + e] : 0.0f;
            kv[i] = e < dk ? row[(size_t)nk * dk + (size_t)gk * dk + e] : 0.0f;
            sq = fmaf(qv[i], qv[i], sq);
            sk = fmaf(kv[i], kv[i], sk);
        }
        sq = cuda_warp_sum(sq);
        sk = cuda_warp_sum(sk);
        const float nq = sqrtf(sq), nkk = sqrtf(sk);
        const float iq = 1.0f / (nq > eps ? nq : eps), ik = 1.0f / (nkk > eps ? nkk : eps);
#pragma unroll
        for (int i = 0; i < NE; i++) { qv[i] *= iq; kv[i] *= ik; }
        /* the gates, as the CPU forms them (every block of the head forms its own: a few loads
         * beside the row's, where a kernel of their own cost a launch per layer) */
        const float av = gt.a[(size_t)t * gt.a_stride + h] + gt.dt_bias[h];
        const float sp = av > 20.0f ? av : log1pf(expf(av));
        const float decay = expf(sp * gt.ssm_a[h]), b = cuda_sigmoid(gt.b[(size_t)t * gt.b_stride + h]);
        const float *v = row + (size_t)2 * nk * dk + (size_t)h * dv;
        float p[GDN_ROWS];
#pragma unroll
        for (int r = 0; r < GDN_ROWS; r++) {
            float a = 0.0f;
#pragma unroll
            for (int i = 0; i < NE; i++) { s[r][i] *= decay; a = fmaf(s[r][i], kv[i], a); }
            p[r] = a;
        }
#pragma unroll
        for (int r = 0; r < GDN_ROWS; r++) p[r] = cuda_warp_sum(p[r]);
#pragma unroll
        for (int r = 0; r < GDN_ROWS; r++) {
            const float vj = j0 + r < dv ? v[j0 + r] : 0.0f;
            const float delta = b * (vj - p[r]);
            float a = 0.0f;
#pragma unroll
            for (int i = 0; i < NE; i++) { s[r][i] = fmaf(kv[i], delta, s[r][i]); a = fmaf(s[r][i], qv[i], a); }
            p[r] = a;
        }
#pragma unroll
        for (int r = 0; r < GDN_ROWS; r++) p[r] = cuda_warp_sum(p[r]);
        if (lane < GDN_ROWS) {
            float o = p[0];
#pragma unroll
            for (int r = 1; r < GDN_ROWS; r++) if (lane == r) o = p[r];
            if (j0 + lane < dv) out[(size_t)t * nv * dv + (size_t)h * dv + j0 + lane] = o * qscale;
        }
        if (snap && t < n_snap) {
            float *sp = snap + (size_t)t * st_elems + (size_t)h * dk * dv;
#pragma unroll
            for (int r = 0; r < GDN_ROWS; r++)
#pragma unroll
                for (int i = 0; i < NE; i++) {
                    const int e = lane + 32 * i;
                    if (e < dk && j0 + r < dv) sp[(size_t)(j0 + r) * dk + e] = s[r][i];
                }
        }
    }
#pragma unroll
    for (int r = 0; r < GDN_ROWS; r++)
#pragma unroll
        for (int i = 0; i < NE; i++) {
            const int e = lane + 32 * i;
            if (e < dk && j0 + r < dv) S[(size_t)(j0 + r) * dk + e] = s[r][i];
        }
}

void cuda_gdn(struct backend *be, const float *qkv, int qkv_stride, const struct gdn_gates *gates, float *state,
              int n_tok, int nk, int nv, int dk, int dv, float eps, float *out, float *snap, int n_snap) {
    struct cuda_ctx *c = cuda_enter(be);
    if (n_tok < 1 || nv < 1) return;
    if (dk > GDN_MAX_DIM || dv > GDN_MAX_DIM || nk < 1) abort(); /* model loading rejects such files */
    const dim3 grid(cuda_cdiv(dv, GDN_WARPS * GDN_ROWS), nv);
#define GDN_LAUNCH(NE)                                                                          \
    cuda_launch(c, grid, GDN_WARPS * 32, gdn_kernel<NE>, qkv, qkv_stride, *gates, state, n_tok, nk, nv, dk, dv, \
                eps, out, snap, snap ? n_snap : 0)
    if (dk <= 64) GDN_LAUNCH(2);
    else if (dk <= 128) GDN_LAUNCH(4);
    else GDN_LAUNCH(8);
#undef GDN_LAUNCH
}

void cuda_gdn_chunked(struct backend *be, const float *qkv, int qkv_stride, const struct gdn_gates *gates,
                      float *state, int n_tok, int nk, int nv, int dk, int dv, float eps, float *out) {
    cuda_gdn(be, qkv, qkv_stride, gates, state, n_tok, nk, nv, dk, dv, eps, out, NULL, 0);
}

CUDA_TRACE_TU(deltanet)
