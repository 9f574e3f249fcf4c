/* deltanet.cu — the gated delta net's conv, gates and delta rule on the device.
 *
 * ssm_conv: a thread per (channel, token): every output reads its window of inputs (the state's
 *   for the first ks tokens) in the CPU's operation order, non-contracted; only expf in SiLU
 *   differs. A prompt's tokens run in parallel (a thread walking them in order made the 9B's
 *   prefill wait on one dependent load per token and layer).
 * gdn: the recurrence of arch-qwen35.md §5.5 with the state row S[j][·] of each value index j
 *   independent of the others given (q, k, β, g, v_j): a warp owns GDN_ROWS rows of one head
 *   for the whole run, in registers (dk spread over the lanes), and steps through the tokens;
 *   per token two warp reductions per row (Sᵀk, then Sᵀq). The loads, norms and gates of a
 *   chunk of tokens are staged in shared memory first, in parallel, off that chain. Sums are
 *   reordered against the CPU (lane partials + butterfly), so outputs agree to f32 rounding. The gates (decay, β) are
 *   formed here from their raw inputs by the CPU's expressions.
 * gdn_chunked: the same recurrent kernel (the interface allows any form equal up to rounding);
 *   a chunked tensor-core form is future work for long prompts. */
#include "cuda_internal.cuh"

#define CONV_MAX_TAPS 16

/* Input p of channel c: token p's for p >= 0, the state's (the last ks inputs before the
 * batch, oldest first) for -ks <= p < 0. */
__device__ __forceinline__ float conv_in(const float *__restrict__ x, const float *state, int n_ch, int ks, int c, int p) {
    return p >= 0 ? x[(size_t)p * n_ch + c] : state[(size_t)c * ks + ks + p];
}

/* A block serves CONV_CH channels (threadIdx.x) for every token (threadIdx.y strides them): the
 * outputs and snapshots read inputs only, so tokens are independent; the new state is written
 * once every thread of the block has read the old one. */
#define CONV_CH 32
#define CONV_TOK 8
__global__ void __launch_bounds__(CONV_CH * CONV_TOK)
ssm_conv_kernel(const float *__restrict__ x, int n_tok, int n_ch, int k, const float *__restrict__ w, float *state,
                float *y, float *snap, int n_snap) {
    cuda_pdl_begin();
    const int c = blockIdx.x * CONV_CH + threadIdx.x, ks = k - 1;
    const bool live = c < n_ch;
    float wv[CONV_MAX_TAPS];
#pragma unroll
    for (int i = 0; i < CONV_MAX_TAPS; i++) wv[i] = live && i < k ? w[(size_t)c * k + i] : 0.0f;
    for (int t = threadIdx.y; t < n_tok && live; t += CONV_TOK) {
        float s = 0.0f; /* the window t-ks .. t-1 in order, then token t: the CPU's order */
#pragma unroll
        for (int i = 0; i < CONV_MAX_TAPS - 1; i++)
            if (i < ks) s = __fadd_rn(s, __fmul_rn(wv[i], conv_in(x, state, n_ch, ks, c, t - ks + i)));
        const float xt = x[(size_t)t * n_ch + c];
        s = __fadd_rn(s, __fmul_rn(wv[ks], xt));
        y[(size_t)t * n_ch + c] = cuda_silu(s);
        if (snap && t < n_snap) { /* the state after token t: inputs t+1-ks .. t */
            float *sp = snap + (size_t)t * n_ch * ks + (size_t)c * ks;
#pragma unroll
            for (int i = 0; i < CONV_MAX_TAPS - 1; i++)
                if (i < ks) sp[i] = conv_in(x, state, n_ch, ks, c, t + 1 - ks + i);
        }
    }
    __syncthreads();
    if (threadIdx.y == 0 && live) {
        float st[CONV_MAX_TAPS - 1]; /* all read before any is written: they may be the state's own */
#pragma unroll
        for (int i = 0; i < CONV_MAX_TAPS - 1; i++) st[i] = i < ks ? conv_in(x, state, n_ch, ks, c, n_tok - ks + i) : 0.0f;
#pragma unroll
        for (int i = 0; i < CONV_MAX_TAPS - 1; i++)
            if (i < ks) state[(size_t)c * ks + i] = st[i];
    }
}

void cuda_ssm_conv(struct backend *be, const float *x, int n_tok, int n_ch, int k, const float *w,
                   float *state, float *y, float *snap, int n_snap) {
    struct cuda_ctx *c = cuda_enter(be);
    if (n_tok < 1 || n_ch < 1) return;
    if (k < 1 || k > CONV_MAX_TAPS) abort(); /* model loading rejects such files */
    cuda_launch(c, cuda_cdiv(n_ch, CONV_CH), dim3(CONV_CH, CONV_TOK), ssm_conv_kernel, x, n_tok, n_ch, k, w, state, y,
                snap, n_snap);
}

#define GDN_WARPS 4
#define GDN_ROWS 4
#define GDN_BLOCK_ROWS (GDN_WARPS * GDN_ROWS)
#define GDN_MAX_DIM 256
#define GDN_STAGE_FLOATS 8192   /* normalized q and k of a chunk of tokens: 32 KB */

/* The shared memory of a chunk of n_ch tokens: q and k (dk each), then decay, beta and the
 * block's GDN_BLOCK_ROWS values of v, per token. */
static size_t gdn_smem(int n_ch, int dk) { return sizeof(float) * (size_t)n_ch * (2 * (size_t)dk + 2 + GDN_BLOCK_ROWS); }
static int gdn_chunk(int dk) { return GDN_STAGE_FLOATS / (2 * dk); }

/* NE = key elements per lane (dk <= 32·NE): element i of a lane is lane + 32·i. Tokens go in
 * chunks: first every warp stages some of the chunk's tokens (loads, the norms of q and k, the
 * gates) into shared memory, all in flight together, then each warp runs the recurrence
 * through the chunk from there, so its token-by-token chain holds only the state's arithmetic. */
template <int NE>
__global__ void __launch_bounds__(GDN_WARPS * 32)
gdn_kernel(const float *__restrict__ qkv, int qkv_stride, const gdn_gates gt, float *state, int n_tok, int nk,
           int nv, int dk, int dv, float eps, int n_ch, float *__restrict__ out, float *__restrict__ snap, int n_snap) {
    cuda_pdl_begin();
    extern __shared__ float gsm[];
    float *qs = gsm, *ks = qs + (size_t)n_ch * dk, *decs = ks + (size_t)n_ch * dk, *bets = decs + n_ch, *vs = bets + n_ch;
    const int h = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int jb = blockIdx.x * GDN_BLOCK_ROWS, j0 = jb + warp * GDN_ROWS;
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
    for (int t0 = 0; t0 < n_tok; t0 += n_ch) {
        const int n_here = min(n_ch, n_tok - t0);
        __syncthreads(); /* the previous chunk is consumed */
        for (int tt = warp; tt < n_here; tt += GDN_WARPS) {
            const float *row = qkv + (size_t)(t0 + tt) * qkv_stride;
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
            for (int i = 0; i < NE; i++) {
                const int e = lane + 32 * i;
                if (e < dk) { qs[(size_t)tt * dk + e] = qv[i] * iq; ks[(size_t)tt * dk + e] = kv[i] * ik; }
            }
            /* the gates, as the CPU forms them */
            if (lane == 0) {
                const size_t t = (size_t)(t0 + tt);
                const float av = gt.a[t * gt.a_stride + h] + gt.dt_bias[h];
                const float sp = av > 20.0f ? av : log1pf(expf(av));
                decs[tt] = expf(sp * gt.ssm_a[h]);
                bets[tt] = cuda_sigmoid(gt.b[t * gt.b_stride + h]);
            }
            if (lane < GDN_BLOCK_ROWS)
                vs[tt * GDN_BLOCK_ROWS + lane] = jb + lane < dv ? row[(size_t)2 * nk * dk + (size_t)h * dv + jb + lane] : 0.0f;
        }
        __syncthreads();
        for (int tt = 0; tt < n_here; tt++) {
            const int t = t0 + tt;
            float qv[NE], kv[NE];
#pragma unroll
            for (int i = 0; i < NE; i++) {
                const int e = lane + 32 * i;
                qv[i] = e < dk ? qs[(size_t)tt * dk + e] : 0.0f;
                kv[i] = e < dk ? ks[(size_t)tt * dk + e] : 0.0f;
            }
            const float decay = decs[tt], b = bets[tt];
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
                const float vj = vs[tt * GDN_BLOCK_ROWS + warp * GDN_ROWS + r];
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
    const dim3 grid(cuda_cdiv(dv, GDN_BLOCK_ROWS), nv);
    const int n_ch = COTI_MIN(n_tok, gdn_chunk(dk));
    const size_t smem = gdn_smem(n_ch, dk);
#define GDN_LAUNCH(NE)                                                                                           \
    cuda_launch_smem(c, grid, GDN_WARPS * 32, smem, gdn_kernel<NE>, qkv, qkv_stride, *gates, state, n_tok, nk, nv, dk, \
                     dv, eps, n_ch, out, snap, snap ? n_snap : 0)
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
