/* deltanet.cu — the gated delta net's conv, gates and delta rule on the device.
 *
 * ssm_conv: a thread per (channel, token): every output reads its window of inputs (the state's
 *   for the first ks tokens) in the CPU's operation order, non-contracted; only expf in SiLU
 *   differs. A prompt's tokens run in parallel (a thread walking them in order made the 9B's
 *   prefill wait on one dependent load per token and layer).
 * gdn: the recurrence of arch-qwen35.md §5.5 with the state row S[j][·] of each value index j
 *   independent of the others given (q, k, β, g, v_j); each row lives in registers for the
 *   whole call and steps through the tokens, two dot products per token (Sᵀk, then Sᵀq). The
 *   loads, norms and gates of the tokens are staged in shared memory first, off that chain.
 *   Two layouts of the rows over the lanes:
 *   - decode and verify (any batch but a prompt's, chunks of GDN_ROWS_MAX_TOK tokens): a warp
 *     per GDN_ROWS rows, 32 lanes per row; the state's reads and writes coalesce, which is what
 *     a single token costs;
 *   - prompts, however long (a run's kernel by its length made a prompt's bits depend on where
 *     a server cut it): L lanes per row (16; 8 for dk <= 32), so each
 *     dot ends in a reduction over L lanes instead of 32, a token's output reduction beside
 *     the next token's Sᵀk reduction, chunks double-buffered with cp.async
 *     (H200, 9B prefill of 512 tokens: 27.7 µs per token in the delta-net with the 32-lane
 *     form, 20.5 with 4 lanes, which at a single token cost 9B decode 5 %; H100, 16 lanes
 *     instead of 4: 9B pp512 +4.5 %).
 *   Sums are reordered against the CPU (lane partials + butterfly), so outputs agree to f32
 *   rounding. The gates (decay, β) are formed from their raw inputs by the CPU's expressions.
 * gdn_chunked: the same recurrent kernel (the interface allows any form equal up to rounding);
 *   a chunked tensor-core form is future work for long prompts. */
#include "cuda_internal.cuh"

#define CONV_MAX_TAPS 16

/* The runs of one launch (struct state_run), by value: a batched cycle's sequences are one
 * launch of each kernel, blockIdx.y (conv) or blockIdx.z (rule) picking the run, instead of a
 * launch per sequence (tiny model, 4 sequences: ~80 µs of a 360 µs cycle went to those). */
#define CUDA_RUNS 32
struct cuda_run { int start, len, n_snap, run; };
/* The states (struct state_set, no pending rows here): a run's sequence is read from seq when
 * the kernel runs, so a graph of these launches serves any sequences. */
struct cuda_states {
    float *state, *snap;
    size_t state_step, snap_step;
    const int32_t *seq;
};
struct cuda_runs { cuda_states st; cuda_run r[CUDA_RUNS]; };

/* runs[r0, r0 + n) of the states st into a launch's argument; the longest run's length into
 * *max_len */
static cuda_runs runs_arg(const struct state_set *st, const struct state_run *runs, int r0, int n, int *max_len) {
    cuda_runs a;
    a.st = {st->state, st->snap, st->state_step, st->snap_step, st->seq};
    *max_len = 0;
    for (int i = 0; i < n; i++) {
        const struct state_run *ru = &runs[r0 + i];
        a.r[i] = {ru->start, ru->len, st->snap ? ru->n_snap : 0, ru->run};
        *max_len = COTI_MAX(*max_len, ru->len);
    }
    return a;
}

/* Run ru's live state and snapshots (after cuda_pdl_begin: seq may come from the step before) */
__device__ __forceinline__ void run_states(const cuda_runs &a, const cuda_run &ru, float **state, float **snap) {
    const size_t s = (size_t)a.st.seq[ru.run];
    *state = a.st.state + s * a.st.state_step;
    *snap = ru.n_snap ? a.st.snap + s * a.st.snap_step : nullptr;
}

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
ssm_conv_kernel(const float *__restrict__ x, int n_ch, int k, const float *__restrict__ w, float *y, const cuda_runs runs) {
    cuda_pdl_begin();
    const cuda_run &ru = runs.r[blockIdx.y];
    const int n_tok = ru.len, n_snap = ru.n_snap;
    float *state, *snap;
    run_states(runs, ru, &state, &snap);
    x += (size_t)ru.start * n_ch;
    y += (size_t)ru.start * n_ch;
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

void cuda_ssm_conv(struct backend *be, const float *x, int n_ch, int k, const float *w, float *y,
                   const struct state_set *st, const struct state_run *runs, int n_runs) {
    struct cuda_ctx *c = cuda_enter(be);
    if (n_ch < 1) return;
    if (k < 1 || k > CONV_MAX_TAPS) abort(); /* model loading rejects such files */
    for (int r0 = 0; r0 < n_runs; r0 += CUDA_RUNS) {
        const int n = COTI_MIN(CUDA_RUNS, n_runs - r0);
        int max_len;
        const cuda_runs a = runs_arg(st, runs, r0, n, &max_len);
        if (max_len < 1) continue;
        cuda_launch(c, dim3(cuda_cdiv(n_ch, CONV_CH), n), dim3(CONV_CH, CONV_TOK), ssm_conv_kernel, x, n_ch, k, w, y, a);
    }
}

#define GDN_WARPS 4
#define GDN_MAX_DIM 256
#define GDN_ROWS_MAX_TOK 16
#define GDN_ROWS 4
#define GDN_BLOCK_ROWS (GDN_WARPS * GDN_ROWS)

/* A chunk of n_ch tokens in shared memory, both kernels: q and k (dk each), then the decay and
 * beta (raw, then formed in place) and the block's br values of v, per token. */
struct gdn_buf {
    float *q, *k, *dec, *bet, *v;
};
static __host__ __device__ __forceinline__ size_t gdn_buf_floats(int n_ch, int dk, int br) {
    return (size_t)n_ch * (2 * (size_t)dk + 2 + (size_t)br);
}
__device__ __forceinline__ gdn_buf gdn_buf_at(float *base, int n_ch, int dk) {
    gdn_buf b;
    b.q = base;
    b.k = b.q + (size_t)n_ch * dk;
    b.dec = b.k + (size_t)n_ch * dk;
    b.bet = b.dec + n_ch;
    b.v = b.bet + n_ch;
    return b;
}

/* The decay from its raw input, as the CPU forms it; 1/|x| from Σx² with the CPU's eps floor. */
__device__ __forceinline__ float gdn_decay(float a, float dt_bias, float ssm_a) {
    const float av = a + dt_bias;
    const float sp = av > 20.0f ? av : log1pf(expf(av));
    return expf(sp * ssm_a);
}
__device__ __forceinline__ float gdn_inv_norm(float sum_sq, float eps) {
    const float n = sqrtf(sum_sq);
    return 1.0f / (n > eps ? n : eps);
}

/* ---- decode and verify rows: a warp per GDN_ROWS state rows, chunks of <= GDN_ROWS_MAX_TOK ---- */

/* NE = key elements per lane (dk <= 32·NE): element i of a lane is lane + 32·i. First every
 * warp stages some of the tokens (loads, the norms of q and k, the gates) into shared memory,
 * all in flight together, then each warp runs the recurrence through them from there. */
template <int NE>
__global__ void __launch_bounds__(GDN_WARPS * 32)
gdn_rows_kernel(const float *__restrict__ qkv, int qkv_stride, gdn_gates gt, int nk, int nv, int dk, int dv, float eps,
                int n_ch, float *__restrict__ out, const cuda_runs runs) {
    cuda_pdl_begin();
    const cuda_run &ru = runs.r[blockIdx.z];
    const int n_tok = ru.len, n_snap = ru.n_snap;
    float *state, *snap;
    run_states(runs, ru, &state, &snap);
    qkv += (size_t)ru.start * qkv_stride;
    out += (size_t)ru.start * nv * dv;
    gt.a += (size_t)ru.start * gt.a_stride;
    gt.b += (size_t)ru.start * gt.b_stride;
    extern __shared__ float gsm[];
    const gdn_buf cb = gdn_buf_at(gsm, n_ch, dk);
    float *qs = cb.q, *ks = cb.k, *decs = cb.dec, *bets = cb.bet, *vs = cb.v;
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
    /* the warp's rows of the state into a head's dk x dv block (the state, or a snapshot) */
    auto put_rows = [&](float *base) {
#pragma unroll
        for (int r = 0; r < GDN_ROWS; r++)
#pragma unroll
            for (int i = 0; i < NE; i++) {
                const int e = lane + 32 * i;
                if (e < dk && j0 + r < dv) base[(size_t)(j0 + r) * dk + e] = s[r][i];
            }
    };
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
            const float iq = gdn_inv_norm(sq, eps), ik = gdn_inv_norm(sk, eps);
#pragma unroll
            for (int i = 0; i < NE; i++) {
                const int e = lane + 32 * i;
                if (e < dk) { qs[(size_t)tt * dk + e] = qv[i] * iq; ks[(size_t)tt * dk + e] = kv[i] * ik; }
            }
            /* the gates, as the CPU forms them */
            if (lane == 0) {
                const size_t t = (size_t)(t0 + tt);
                decs[tt] = gdn_decay(gt.a[t * gt.a_stride + h], gt.dt_bias[h], gt.ssm_a[h]);
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
            if (snap && t < n_snap) put_rows(snap + (size_t)t * st_elems + (size_t)h * dk * dv);
        }
    }
    put_rows(S);
}

/* ---- prompts: L lanes per state row ---- */
#define GDN_STAGE_FLOATS 4096   /* q and k of a chunk of tokens: 16 KB, twice (double-buffered) */

/* Tokens per chunk buffer (two of them: double-buffered). */
static int gdn_chunk(int dk) { return COTI_MAX(1, COTI_MIN(32, GDN_STAGE_FLOATS / (2 * dk))); }

/* Element i (< NE) of the row slice held by lane r (< L) of a row's L lanes: float4 chunks
 * interleaved over the lanes, so the L lanes' shared-memory reads of k and q are consecutive. */
template <int L> __device__ __forceinline__ int gdn_elem(int r, int i) { return 4 * ((i / 4) * L + r) + i % 4; }

/* L lanes own a state row S[j][·] (NE elements each, dk <= L·NE), 32/L rows per warp, for the
 * whole run, in registers. Tokens go in chunks through two buffers: while the rows step
 * through one chunk, cp.async brings the next chunk's q, k, v and raw gates; a chunk's warps
 * first form the norms of q and k (a warp per token, lane + 32·i elements, the warp sum) and
 * the gates in place; then every row steps through it: per token its dots with k and q each
 * end in a reduction over L lanes only. */
/* four blocks an SM (the 9B's 512 blocks in one wave): without the bound ptxas gave the 9B's
 * instance 72 registers and a spill */
template <int L, int NE, bool FULL>
__global__ void __launch_bounds__(GDN_WARPS * 32, 4)
gdn_kernel(const float *__restrict__ qkv, int qkv_stride, gdn_gates gt, int nk, int nv, int dk, int dv, float eps,
           int n_ch, float *__restrict__ out, const cuda_runs runs) {
    constexpr int RW = 32 / L, BR = GDN_WARPS * RW;
    cuda_pdl_begin();
    const cuda_run &ru = runs.r[blockIdx.z];
    const int n_tok = ru.len, n_snap = ru.n_snap;
    float *state, *snap;
    run_states(runs, ru, &state, &snap);
    qkv += (size_t)ru.start * qkv_stride;
    out += (size_t)ru.start * nv * dv;
    gt.a += (size_t)ru.start * gt.a_stride;
    gt.b += (size_t)ru.start * gt.b_stride;
    extern __shared__ __align__(16) float gsm[];
    const int h = blockIdx.y, tid = threadIdx.x, warp = tid / 32, lane = tid % 32, r = lane % L;
    const int jb = blockIdx.x * BR, jr = warp * RW + lane / L, j = jb + jr;
    const bool live = j < dv;
    const int gk = h % nk;
    const size_t st_elems = (size_t)nv * dk * dv, buf_floats = gdn_buf_floats(n_ch, dk, BR);
    const bool vec = dk % 4 == 0; /* rows in float4s */
    const bool al16 = vec && qkv_stride % 4 == 0 && ((uintptr_t)qkv & 15) == 0;
    /* FULL: dk = L·NE, a multiple of 4 (every model's shape): no element past the row */
    auto ld4 = [&](const float *row, int e) {
        if (FULL) return *(const float4 *)(row + e);
        if (e >= dk) return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (vec) return *(const float4 *)(row + e);
        return make_float4(row[e], e + 1 < dk ? row[e + 1] : 0.0f, e + 2 < dk ? row[e + 2] : 0.0f, e + 3 < dk ? row[e + 3] : 0.0f);
    };
    /* the copies of the chunk at t0 into buffer bi, as one group */
    auto stage = [&](int t0, int bi) {
        const gdn_buf cb = gdn_buf_at(gsm + bi * buf_floats, n_ch, dk);
        float *qs = cb.q, *ks = cb.k, *decs = cb.dec, *bets = cb.bet, *vs = cb.v;
        const int n_here = min(n_ch, n_tok - t0);
        /* q and k rows in copies of w floats: 16 bytes where aligned, else 4 */
        const int w = al16 ? 4 : 1, per = dk / w;
        for (int p = tid; p < n_here * 2 * per; p += GDN_WARPS * 32) {
            const int tt = p / (2 * per), c = p % (2 * per), isk = c >= per, ce = w * (c - isk * per);
            const float *row = qkv + (size_t)(t0 + tt) * qkv_stride + (size_t)isk * nk * dk + (size_t)gk * dk;
            float *dst = (isk ? ks : qs) + (size_t)tt * dk + ce;
            if (al16) cp_async16(dst, row + ce);
            else cp_async4(dst, row + ce);
        }
        for (int p = tid; p < n_here * BR; p += GDN_WARPS * 32) {
            const int tt = p / BR, jj = jb + p % BR;
            if (jj < dv) cp_async4(&vs[p], qkv + (size_t)(t0 + tt) * qkv_stride + (size_t)2 * nk * dk + (size_t)h * dv + jj);
            else vs[p] = 0.0f;
        }
        for (int p = tid; p < n_here; p += GDN_WARPS * 32) {
            const size_t t = (size_t)(t0 + p);
            cp_async4(&decs[p], &gt.a[t * gt.a_stride + h]);
            cp_async4(&bets[p], &gt.b[t * gt.b_stride + h]);
        }
        cp_async_commit();
    };
    stage(0, 0);
    float *S = state + (size_t)h * dk * dv;
    float s[NE];
#pragma unroll
    for (int i = 0; i < NE; i += 4) {
        const float4 v = live ? ld4(S + (size_t)j * dk, gdn_elem<L>(r, i)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        s[i] = v.x; s[i + 1] = v.y; s[i + 2] = v.z; s[i + 3] = v.w;
    }
    const float qscale = 1.0f / sqrtf((float)dk), dt_bias = gt.dt_bias[h], ssm_a = gt.ssm_a[h];
    int bi = 0;
    for (int t0 = 0; t0 < n_tok; t0 += n_ch, bi ^= 1) {
        const int n_here = min(n_ch, n_tok - t0);
        if (t0 + n_ch < n_tok) stage(t0 + n_ch, bi ^ 1); /* its buffer was consumed before the last barrier */
        else cp_async_commit();
        cp_async_wait1();
        __syncthreads();
        const gdn_buf cb = gdn_buf_at(gsm + bi * buf_floats, n_ch, dk);
        float *qs = cb.q, *ks = cb.k, *decs = cb.dec, *bets = cb.bet, *vs = cb.v;
        /* norms of q and k, and the gates as the CPU forms them */
        for (int tt = warp; tt < n_here; tt += GDN_WARPS) {
            float *q = qs + (size_t)tt * dk, *k = ks + (size_t)tt * dk;
            float sq = 0.0f, sk = 0.0f;
            for (int e = lane; e < dk; e += 32) { sq = fmaf(q[e], q[e], sq); sk = fmaf(k[e], k[e], sk); }
            sq = cuda_warp_sum(sq);
            sk = cuda_warp_sum(sk);
            const float iq = gdn_inv_norm(sq, eps), ik = gdn_inv_norm(sk, eps);
            for (int e = lane; e < dk; e += 32) { q[e] *= iq; k[e] *= ik; }
            if (lane == 0) {
                decs[tt] = gdn_decay(decs[tt], dt_bias, ssm_a);
                bets[tt] = cuda_sigmoid(bets[tt]);
            }
        }
        __syncthreads();
        /* token tt's k slice, and the state decayed by its gate dotted with it (lane partials) */
        float kv[NE], p = 0.0f;
        auto decay_dot_k = [&](int tt) {
#pragma unroll
            for (int i = 0; i < NE; i += 4) {
                const float4 k4 = ld4(ks + (size_t)tt * dk, gdn_elem<L>(r, i));
                kv[i] = k4.x; kv[i + 1] = k4.y; kv[i + 2] = k4.z; kv[i + 3] = k4.w;
            }
            const float decay = decs[tt];
            float a4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int i = 0; i < NE; i++) { s[i] *= decay; a4[i % 4] = fmaf(s[i], kv[i], a4[i % 4]); }
            return (a4[0] + a4[1]) + (a4[2] + a4[3]);
        };
        /* Each token's output sum (Sᵀq over the row's L lanes) goes down its butterfly beside
         * the next token's Sᵀk: both depend on the state once updated, and the chain from one
         * token to the next then holds one butterfly instead of two. The same adds in the same
         * order as one after the other. */
        if (n_here > 0) {
            p = decay_dot_k(0);
#pragma unroll
            for (int o = L / 2; o > 0; o >>= 1) p += __shfl_xor_sync(0xFFFFFFFFu, p, o);
        }
        for (int tt = 0; tt < n_here; tt++) {
            const int t = t0 + tt;
            const float delta = bets[tt] * (vs[tt * BR + jr] - p);
            float a4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int i = 0; i < NE; i += 4) {
                const float4 q4 = ld4(qs + (size_t)tt * dk, gdn_elem<L>(r, i));
                const float qv[4] = {q4.x, q4.y, q4.z, q4.w};
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    s[i + c] = fmaf(kv[i + c], delta, s[i + c]);
                    a4[c] = fmaf(s[i + c], qv[c], a4[c]);
                }
            }
            float o = (a4[0] + a4[1]) + (a4[2] + a4[3]);
            if (snap && t < n_snap && live) {
                float *sp = snap + (size_t)t * st_elems + (size_t)h * dk * dv + (size_t)j * dk;
#pragma unroll
                for (int i = 0; i < NE; i++) {
                    const int e = gdn_elem<L>(r, i);
                    if (FULL || e < dk) sp[e] = s[i];
                }
            }
            if (tt + 1 < n_here) {
                p = decay_dot_k(tt + 1);
#pragma unroll
                for (int w = L / 2; w > 0; w >>= 1) {
                    o += __shfl_xor_sync(0xFFFFFFFFu, o, w);
                    p += __shfl_xor_sync(0xFFFFFFFFu, p, w);
                }
            } else {
#pragma unroll
                for (int w = L / 2; w > 0; w >>= 1) o += __shfl_xor_sync(0xFFFFFFFFu, o, w);
            }
            if (r == 0 && live) out[(size_t)t * nv * dv + (size_t)h * dv + j] = o * qscale;
        }
        __syncthreads(); /* this buffer is staged again next */
    }
    if (live) {
#pragma unroll
        for (int i = 0; i < NE; i += 4) {
            const int e = gdn_elem<L>(r, i);
            if (FULL || (vec && e < dk)) {
                *(float4 *)(S + (size_t)j * dk + e) = make_float4(s[i], s[i + 1], s[i + 2], s[i + 3]);
            } else {
#pragma unroll
                for (int c = 0; c < 4; c++)
                    if (e + c < dk) S[(size_t)j * dk + e + c] = s[i + c];
            }
        }
    }
}

/* One launch for runs whose longest has max_len tokens: the rows kernel for decode and verify,
 * L lanes per row for prompts. */
static void gdn_launch(struct cuda_ctx *c, const float *qkv, int qkv_stride, const struct gdn_gates *gates, int nk,
                       int nv, int dk, int dv, float eps, float *out, const cuda_runs &a, int n, int max_len) {
    if (!c->prompt) {
        const int n_ch = COTI_MIN(max_len, GDN_ROWS_MAX_TOK);
        const dim3 grid(cuda_cdiv(dv, GDN_BLOCK_ROWS), nv, n);
        const size_t smem = sizeof(float) * gdn_buf_floats(n_ch, dk, GDN_BLOCK_ROWS);
#define GDN_ROWS_LAUNCH(NE)                                                                                         \
    cuda_launch_smem(c, grid, GDN_WARPS * 32, smem, gdn_rows_kernel<NE>, qkv, qkv_stride, *gates, nk, nv, dk, dv, eps, \
                     n_ch, out, a)
        if (dk <= 64) GDN_ROWS_LAUNCH(2);
        else if (dk <= 128) GDN_ROWS_LAUNCH(4);
        else GDN_ROWS_LAUNCH(8);
#undef GDN_ROWS_LAUNCH
        return;
    }
    const int n_ch = COTI_MIN(max_len, gdn_chunk(dk));
    /* L lanes per row (rows per block 4·32/L), NE elements each: 16 lanes (8 for the
     * narrowest rows): the 9B's 128-wide rows at 4 lanes made 128 blocks of 4 warps, one warp
     * per scheduler, each token step a chain of ~1,400 cycles with nothing to hide it; 16 lanes
     * give four times the warps and a quarter of the products per lane */
#define GDN_LAUNCH(L, NE)                                                                                            \
    do {                                                                                                             \
        const dim3 grid(cuda_cdiv(dv, GDN_WARPS * 32 / (L)), nv, n);                                                 \
        const size_t smem = sizeof(float) * 2 * gdn_buf_floats(n_ch, dk, GDN_WARPS * 32 / (L));                      \
        if (dk == (L) * (NE))                                                                                        \
            cuda_launch_smem(c, grid, GDN_WARPS * 32, smem, gdn_kernel<L, NE, true>, qkv, qkv_stride, *gates, nk, nv, \
                             dk, dv, eps, n_ch, out, a);                                                             \
        else                                                                                                         \
            cuda_launch_smem(c, grid, GDN_WARPS * 32, smem, gdn_kernel<L, NE, false>, qkv, qkv_stride, *gates, nk,    \
                             nv, dk, dv, eps, n_ch, out, a);                                                         \
    } while (0)
    if (dk <= 32) GDN_LAUNCH(8, 4);
    else if (dk <= 64) GDN_LAUNCH(16, 4);
    else if (dk <= 128) GDN_LAUNCH(16, 8);
    else GDN_LAUNCH(16, 16);
#undef GDN_LAUNCH
}

void cuda_gdn(struct backend *be, const float *qkv, int qkv_stride, const struct gdn_gates *gates, int nk, int nv, int dk,
              int dv, float eps, float *out, const struct state_set *st, const struct state_run *runs, int n_runs) {
    struct cuda_ctx *c = cuda_enter(be);
    if (nv < 1) return;
    if (dk > GDN_MAX_DIM || dv > GDN_MAX_DIM || nk < 1) abort(); /* model loading rejects such files */
    for (int r0 = 0; r0 < n_runs; r0 += CUDA_RUNS) {
        int max_len;
        const int n = COTI_MIN(CUDA_RUNS, n_runs - r0);
        const cuda_runs a = runs_arg(st, runs, r0, n, &max_len);
        if (max_len >= 1) gdn_launch(c, qkv, qkv_stride, gates, nk, nv, dk, dv, eps, out, a, n, max_len);
    }
}

/* the same recurrent kernels: the interface allows any form equal up to rounding */
void cuda_gdn_chunked(struct backend *be, const float *qkv, int qkv_stride, const struct gdn_gates *gates, int nk,
                      int nv, int dk, int dv, float eps, float *out, const struct state_set *st,
                      const struct state_run *runs, int n_runs) {
    cuda_gdn(be, qkv, qkv_stride, gates, nk, nv, dk, dv, eps, out, st, runs, n_runs);
}

CUDA_TRACE_TU(deltanet)
