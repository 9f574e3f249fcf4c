/* matvec.cu — the matvec kernels, for up to MV_MAX_NT (8) token rows per launch group, and their
 * per-type launch table.
 * - matvec_kernel: a persistent grid; a warp owns R weight rows (one, two or four for wide rows
 *   of 4-8 tokens: mv_launch's rule) and streams them in chunks: cp.async copies
 *   each chunk's 16-byte-aligned span (any row alignment works) into the warp's shared memory,
 *   two stages deep, so the next chunk is in flight while lanes decode the current one. A lane
 *   takes whole 32-element units of a quantized row (a 32-block, or an eighth of a K
 *   super-block): unit u of every row goes to lane u % 32, in increasing u (float rows: the
 *   same words of every unit, chunk_dot_float), so an output's value depends only on its row
 *   and its token's activations, never on n_tok, R or the group: a verify batch reproduces
 *   plain decode bit for bit. The first two chunks are requested before the kernel waits for the
 *   previous kernel (programmatic dependent launch). Its input comes converted (MV_CONVERTED),
 *   converted and copied into shared memory first (MV_STAGED), or as f32 rows the kernel forms
 *   (a norm, gated norm, output gate or swiglu, mv_input) and quantizes itself (MV_FUSED,
 *   MV_FUSED_NORM2), which makes a matmul a single launch.
 * - matvec_q8_0_direct_kernel: one token of Q8_0, weights straight into registers.
 * Several weights of one type share one launch (mv_params). */
#include "matmul.cuh"

/* One unit of R quantized rows (smem offsets off[r]) against NT token rows; XS: the
 * activations are in shared memory (plain loads), else global (read-only loads). */
template <int T, int NT, int R, bool XS>
__device__ __forceinline__ void unit_dot(const uint8_t *const (&sm)[R], const int (&off)[R], int sub, const xact &x,
                                         int t0, int u, float (&acc)[R][NT]) {
    typedef qt<T> Q;
    uint32_t c[R][8];
    usc s[R];
#pragma unroll
    for (int r = 0; r < R; r++) Q::decode(sm[r], off[r], sub, c[r], s[r]);
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const size_t t = (size_t)(t0 + j);
        const int4 *xp = (const int4 *)((const int8_t *)x.q + t * x.stride) + 2 * u;
        const int4 xa = xld<XS>(xp), xb = xld<XS>(xp + 1);
        const uxs xs = load_xs<Q::XF, XS>(x, t, u);
#pragma unroll
        for (int r = 0; r < R; r++) acc[r][j] += Q::combine(s[r], dp4a_half(c[r], xa), dp4a_half(c[r] + 4, xb), xs);
    }
}

__device__ __forceinline__ float2 h2_to_f2(uint32_t w) { return __half22float2(*(const __half2 *)&w); }
__device__ __forceinline__ float2 bf2_to_f2(uint32_t w) {
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xFFFF0000u));
}

/* A chunk of float weights (F32, F16, BF16: W words per 32-element unit) word by word: lane l
 * takes word l % W of units l / W, l / W + 32 / W, ... of the chunk. Consecutive lanes read
 * consecutive words, so a warp's shared-memory read has no bank conflict and its activation
 * loads coalesce; with a lane per unit, as the quantized types go, all 32 lanes hit one bank
 * (the 35B-A3B's F32 router matvec, 257 rows of 2048, took 22 us of a 5 ms decode step per
 * layer). A lane sums its words of every unit in increasing u: the order depends on the row
 * alone, whatever the batch. */
template <int T, int NT, int CU>
__device__ __forceinline__ void chunk_dot_float(const uint8_t *sm, int off0, const xact &x, int t0, int u0, int n_u,
                                                int n, int lane, float (&acc)[NT]) {
    constexpr int W = T == GGML_TYPE_F32 ? 32 : 16;
    const int wi = lane % W;
#pragma unroll 8 /* loads of several steps in flight */
    for (int k = 0; k < CU * W / 32; k++) {
        const int g = k * (32 / W) + lane / W;
        if (g >= n_u) continue;
        uint32_t w[1];
        lds_words<1>(sm, off0 + g * qt<T>::BB + 4 * wi, w);
        if constexpr (T == GGML_TYPE_F32) {
            const int e = 32 * (u0 + g) + wi;
            const float wf = e < n ? __uint_as_float(w[0]) : 0.0f; /* a row's tail past n */
#pragma unroll
            for (int j = 0; j < NT; j++)
                acc[j] = fmaf(wf, __ldg((const float *)x.q + (size_t)(t0 + j) * x.stride + e), acc[j]);
        } else {
            const int e = 32 * (u0 + g) + 2 * wi;
            if (e >= n) w[0] = 0;
            else if (e + 1 >= n) w[0] &= 0xFFFFu;
            const float2 wf = T == GGML_TYPE_F16 ? h2_to_f2(w[0]) : bf2_to_f2(w[0]);
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const uint32_t xw = __ldg((const uint32_t *)((const uint16_t *)x.q + (size_t)(t0 + j) * x.stride + e));
                const float2 xf = T == GGML_TYPE_F16 ? h2_to_f2(xw) : bf2_to_f2(xw);
                acc[j] = fmaf(wf.x, xf.x, acc[j]); /* the products are exact in f32 */
                acc[j] = fmaf(wf.y, xf.y, acc[j]);
            }
        }
    }
}

/* Shapes of a matvec instance: R rows per warp (mv_launch's rule), CU units of each row per
 * chunk (a quarter at four rows, so the stages fit shared memory), SLOT bytes of shared memory
 * per row and stage (the chunk's aligned span plus read slack). */
template <int T, int NT, int R> struct mv_shape {
    enum {
        FLOAT = T == GGML_TYPE_F16 || T == GGML_TYPE_BF16 || T == GGML_TYPE_F32,
        CU = 32 * (R <= 2 ? qt<T>::U : qt<T>::U / 4 > 1 ? qt<T>::U / 4 : 1),
        CB = CU / qt<T>::UPB * qt<T>::BB,
        SLOT = ((CB + 30) / 16) * 16 + 16,
        WBYTES = MV_WARPS * 2 * R * SLOT,                   /* weight stages of a block */
    };
};

/* What a matvec launch does with its input (the kernel's FUSED parameter): read converted
 * activations from global memory; quantize f32 rows (a fused input mode) in every block; the
 * same for the NORM2 input alone, compiled apart so that the other fused launches keep their
 * code; or copy one converted token into shared memory first (9B FFN down: +0.5% decode
 * against reading it in the dot products). */
enum { MV_CONVERTED, MV_FUSED, MV_FUSED_NORM2, MV_STAGED, MV_VARIANTS };
static_assert(MV_VARIANTS == sizeof(((struct cuda_ctx *)0)->mv_regs[0][0][0]) / sizeof(int),
              "cuda_ctx's per-kernel tables hold every variant");

/* Persistent matvec: block b takes a contiguous share of the row sets (R rows each), its warp w
 * sets w, w + MV_WARPS, ... of the share, and streams their chunks through two shared-memory
 * stages as one sequence of (set, chunk) items: an issue cursor runs two items ahead of the
 * compute cursor, across row sets. The first two items are requested before the kernel waits
 * for the previous one.
 * MV_FUSED / MV_FUSED_NORM2: xf holds f32 rows (tokens t_base..) and the block quantizes them
 * into shared memory first; else x is the converted activations in global memory, which
 * MV_STAGED copies into shared memory first. */
template <int T, int NT, int FUSED, int R>
__global__ void __launch_bounds__(MV_WARPS * 32) matvec_kernel(const mv_params P, const float *xf, xact x, int t_base) {
    typedef qt<T> Q;
    typedef mv_shape<T, NT, R> S;
    constexpr int CU = S::CU, SLOT = S::SLOT;
    extern __shared__ __align__(16) uint8_t dsm[];
    uint8_t(*wsm)[2][R][SLOT] = reinterpret_cast<uint8_t(*)[2][R][SLOT]>(dsm);
    cuda_pdl_trigger();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int total = P.row0[P.n_w], n_sets = (total + R - 1) / R, n_chunks = (P.n_units + CU - 1) / CU;
    /* block b takes the contiguous row sets [first_set(b), first_set(b + 1)), its warps
     * interleaved in them (9B +1.6% against sets interleaved over the whole grid) */
    auto first_set = [&](int b) -> int { return (int)((long long)b * n_sets / gridDim.x); };
    const int s_end = first_set(blockIdx.x + 1);

    /* a cursor over (set, chunk); rows past the end repeat the last one (results dropped) */
    struct cursor {
        int set, ch;
        const uint8_t *row[R];
        int wi[R];
    };
    auto rows_of = [&](cursor &cu) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int row = min(cu.set * R + r, total - 1), k = mv_weight_of(P, row);
            cu.wi[r] = k;
            cu.row[r] = P.w[k] + (size_t)(row - P.row0[k]) * P.rb[k];
        }
    };
    auto advance = [&](cursor &cu) {
        if (++cu.ch == n_chunks) {
            cu.ch = 0;
            cu.set += MV_WARPS;
            if (cu.set < s_end) rows_of(cu);
        }
    };
    /* copy the cursor's chunk into stage st (one commit group; empty past the end) */
    auto issue = [&](const cursor &cu, int st) {
        if (cu.set < s_end) {
            const int u0 = cu.ch * CU, uend = min(u0 + CU, P.n_units);
#pragma unroll
            for (int r = 0; r < R; r++) stage_row_units<T>(cu.row[r], u0, uend, wsm[warp][st][r], lane, 32);
        }
        cp_async_commit();
    };

    cursor cc, ic; /* compute, issue */
    cc.set = first_set(blockIdx.x) + warp;
    cc.ch = 0;
    if (cc.set < s_end) rows_of(cc);
    ic = cc;
    issue(ic, 0); /* weights never change: fetch before the wait */
    advance(ic);
    issue(ic, 1);
    advance(ic);
    cuda_pdl_wait();
    int t0 = t_base + blockIdx.y * NT;
    if constexpr (FUSED == MV_STAGED && !S::FLOAT) {
        /* converted rows t0.. copied into shared memory once, in the fused layout, so that the
         * dot products load nothing but weights from global memory */
        const int stride = x.stride, nq = NT * stride;
        const int nd = Q::XF == XF_Q8_K ? NT * (stride / 256) : NT * (stride / 32);
        const xs_parts xp = xs_layout(dsm + S::WBYTES, Q::XF, NT, stride);
        int8_t *q = xp.q;
        float *d = xp.d;
        uint8_t *e = xp.e;
        const int4 *gq = (const int4 *)((const int8_t *)x.q + (size_t)t0 * stride);
        for (int i = threadIdx.x; i < nq / 16; i += MV_WARPS * 32) ((int4 *)q)[i] = gq[i];
        const size_t d0 = Q::XF == XF_Q8_K ? (size_t)t0 * (stride / 256) : (size_t)t0 * (stride / 32);
        for (int i = threadIdx.x; i < nd; i += MV_WARPS * 32) {
            d[i] = x.d[d0 + i];
            if (Q::XF == XF_Q8_1) ((float *)e)[i] = x.s[d0 + i];
        }
        if constexpr (Q::XF == XF_Q8_K) {
            for (int i = threadIdx.x; i < NT * (stride / 16); i += MV_WARPS * 32)
                ((int16_t *)e)[i] = x.bs[(size_t)t0 * (stride / 16) + i];
            x.bs = (const int16_t *)e;
        }
        x.q = q;
        x.d = d;
        x.s = Q::XF == XF_Q8_1 ? (const float *)e : NULL;
        t0 = 0;
        __syncthreads();
        cuda_trace_mid();
    }
    if constexpr ((FUSED == MV_FUSED || FUSED == MV_FUSED_NORM2) && !S::FLOAT) {
        /* NORM: each token row's 1/rms, by the standalone norm's reduction (cuda_row_sumsq) */
        __shared__ double red[MV_WARPS];
        float sc0 = 1.0f, sc1 = 1.0f;
        if (P.in.mode == MV_IN_NORM)
            for (int t = 0; t < NT; t++) {
                const float *xr = xf + (size_t)(t_base + t) * P.n;
                const float *mr = P.in.m ? P.in.m + (size_t)(t_base + t) * P.n : NULL;
                const bool vec = P.n % 4 == 0 && ((uintptr_t)xf & 15) == 0 && ((uintptr_t)P.in.m & 15) == 0;
                const double ss =
                    cuda_row_sumsq([&](int g, float (&v)[8]) { cuda_group8(xr, mr, P.n, vec, g, v); }, P.n, red);
                const float sc = cuda_rms_inv(ss, P.n, P.in.eps);
                if (t == 0) sc0 = sc;
                else sc1 = sc;
            }
        /* GNORM: each (token, group)'s 1/rms, a warp per group as the standalone norm does */
        __shared__ float gsc[MV_GNORM_MAX_GROUPS];
        const int n_grp = P.in.mode == MV_IN_GNORM ? P.n / P.in.dim : 0;
        if (P.in.mode == MV_IN_GNORM) {
            for (int i = warp; i < NT * n_grp; i += MV_WARPS)
                gsc[i] = cuda_warp_rms_inv(xf + (size_t)(t_base + i / n_grp) * P.n + (size_t)(i % n_grp) * P.in.dim,
                                           P.in.dim, P.in.eps, lane);
            __syncthreads();
        }
        if constexpr (FUSED == MV_FUSED_NORM2) { /* each row's two halves' 1/rms, as the standalone rmsnorm forms it */
            for (int i = warp; i < 2 * NT; i += MV_WARPS) {
                const size_t r = (size_t)(t_base + i / 2) * P.in.dim;
                gsc[i] = cuda_warp_rms_inv(i % 2 ? P.in.m + r : xf + r, P.in.dim, P.in.eps, lane);
            }
            __syncthreads();
        }
        /* element e (< P.n) of input row t; loads only, so a thread's loads are all in flight
         * together (a store between them, to memory that might alias, would serialize them) */
        auto in_val = [&](int t, int e) -> float {
            const size_t o = (size_t)(t_base + t) * P.n + e;
            if constexpr (FUSED == MV_FUSED_NORM2) {
                const size_t r = (size_t)(t_base + t) * P.in.dim;
                return e < P.in.dim ? __fmul_rn(__fmul_rn(xf[r + e], gsc[2 * t]), P.in.w[e])
                                    : __fmul_rn(__fmul_rn(P.in.m[r + e - P.in.dim], gsc[2 * t + 1]), P.in.w2[e - P.in.dim]);
            }
            if (P.in.mode == MV_IN_SWIGLU) return __fmul_rn(cuda_silu(xf[o]), P.in.m[o]);
            if (P.in.mode == MV_IN_SIGMOID)
                return __fmul_rn(xf[o], cuda_sigmoid(P.in.m[(size_t)(t_base + t) * P.in.gs +
                                                         (size_t)(e / P.in.dim) * P.in.ghs + e % P.in.dim]));
            if (P.in.mode == MV_IN_GNORM)
                return __fmul_rn(__fmul_rn(__fmul_rn(xf[o], gsc[t * n_grp + e / P.in.dim]), P.in.w[e % P.in.dim]),
                                 cuda_silu(P.in.m[o]));
            float v = xf[o];
            if (P.in.mode == MV_IN_NORM) {
                if (P.in.m) v = v + P.in.m[o];
                v = __fmul_rn(__fmul_rn(v, t == 0 ? sc0 : sc1), P.in.w[e]);
            }
            return v;
        };
        /* elements e0 .. e0 + 3 of input row t (e0 a multiple of 4), by in_val's expressions:
         * where every operand row is 16-byte aligned and the group / head size a multiple of
         * 4, one vector load per operand and one group / head index for the four (a matvec
         * forms its whole input in every block, so this is most of its own instructions) */
        const bool vec4 = FUSED != MV_FUSED_NORM2 && P.n % 4 == 0 && ((uintptr_t)xf & 15) == 0 &&
                          ((uintptr_t)P.in.m & 15) == 0 && ((uintptr_t)P.in.w & 15) == 0 &&
                          (P.in.mode == MV_IN_GNORM || P.in.mode == MV_IN_SIGMOID ? P.in.dim % 4 == 0 : true) &&
                          (P.in.mode == MV_IN_SIGMOID ? P.in.gs % 4 == 0 && P.in.ghs % 4 == 0 : true);
        auto in_vals4 = [&](int t, int e0, float (&v)[4]) {
            if (!vec4 || e0 + 4 > P.n) {
#pragma unroll
                for (int k = 0; k < 4; k++) v[k] = e0 + k < P.n ? in_val(t, e0 + k) : 0.0f;
                return;
            }
            const size_t o = (size_t)(t_base + t) * P.n + e0;
            const float4 x4 = *(const float4 *)(xf + o);
            const float xv[4] = {x4.x, x4.y, x4.z, x4.w};
            float mv[4] = {0.0f, 0.0f, 0.0f, 0.0f}, wv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            int g = 0;
            if (P.in.mode == MV_IN_GNORM || P.in.mode == MV_IN_SIGMOID) g = e0 / P.in.dim;
            const int j = e0 - g * (P.in.mode == MV_IN_GNORM || P.in.mode == MV_IN_SIGMOID ? P.in.dim : 0);
            const float *mp = P.in.mode == MV_IN_SIGMOID
                                  ? P.in.m + (size_t)(t_base + t) * P.in.gs + (size_t)g * P.in.ghs + j
                                  : P.in.m ? P.in.m + o : NULL;
            if (mp) {
                const float4 m4 = *(const float4 *)mp;
                mv[0] = m4.x; mv[1] = m4.y; mv[2] = m4.z; mv[3] = m4.w;
            }
            if (P.in.mode == MV_IN_GNORM || P.in.mode == MV_IN_NORM) {
                const float4 w4 = *(const float4 *)(P.in.w + (P.in.mode == MV_IN_GNORM ? j : e0));
                wv[0] = w4.x; wv[1] = w4.y; wv[2] = w4.z; wv[3] = w4.w;
            }
            const float sc = P.in.mode == MV_IN_GNORM ? gsc[t * n_grp + g] : t == 0 ? sc0 : sc1;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                if (P.in.mode == MV_IN_SWIGLU) v[k] = __fmul_rn(cuda_silu(xv[k]), mv[k]);
                else if (P.in.mode == MV_IN_SIGMOID) v[k] = __fmul_rn(xv[k], cuda_sigmoid(mv[k]));
                else if (P.in.mode == MV_IN_GNORM) v[k] = cuda_gnorm(xv[k], sc, wv[k], mv[k]);
                else if (P.in.mode == MV_IN_NORM) v[k] = __fmul_rn(__fmul_rn(P.in.m ? xv[k] + mv[k] : xv[k], sc), wv[k]);
                else v[k] = xv[k];
            }
        };
        /* NORM: x + m and the normed rows are written out too, an 8-element group per thread
         * spread over the grid (loads before stores: one latency, and no block runs long) */
        if (P.in.mode == MV_IN_NORM) {
            const int ng = (P.n + 7) / 8;
            const bool vec = P.n % 8 == 0 && ((uintptr_t)xf & 15) == 0 && ((uintptr_t)P.in.m & 15) == 0 &&
                             ((uintptr_t)P.in.w & 15) == 0 && ((uintptr_t)P.in.xout & 15) == 0 &&
                             ((uintptr_t)P.in.a & 15) == 0;
            for (int i = blockIdx.x * MV_WARPS * 32 + threadIdx.x; i < NT * ng; i += gridDim.x * MV_WARPS * 32) {
                const int t = i / ng, e0 = 8 * (i % ng);
                const size_t o = (size_t)(t_base + t) * P.n + e0;
                float r[8], w8[8];
                cuda_group8(xf + (size_t)(t_base + t) * P.n, P.in.m ? P.in.m + (size_t)(t_base + t) * P.n : NULL, P.n,
                            vec, i % ng, r);
                cuda_group8(P.in.w, NULL, P.n, vec, i % ng, w8);
                float a8[8];
#pragma unroll
                for (int k = 0; k < 8; k++) a8[k] = __fmul_rn(__fmul_rn(r[k], t == 0 ? sc0 : sc1), w8[k]);
                if (vec) {
                    if (P.in.m) {
                        ((float4 *)(P.in.xout + o))[0] = make_float4(r[0], r[1], r[2], r[3]);
                        ((float4 *)(P.in.xout + o))[1] = make_float4(r[4], r[5], r[6], r[7]);
                    }
                    ((float4 *)(P.in.a + o))[0] = make_float4(a8[0], a8[1], a8[2], a8[3]);
                    ((float4 *)(P.in.a + o))[1] = make_float4(a8[4], a8[5], a8[6], a8[7]);
                } else {
                    for (int k = 0; k < 8 && e0 + k < P.n; k++) {
                        if (P.in.m) P.in.xout[o + k] = r[k];
                        P.in.a[o + k] = a8[k];
                    }
                }
            }
        }
        /* quantize the NT activation rows into shared memory, laid out like the global form */
        const int stride = x.stride;
        const xs_parts xp = xs_layout(dsm + S::WBYTES, Q::XF, NT, stride);
        int8_t *q = xp.q;
        float *d = xp.d;
        if constexpr (Q::XF == XF_Q8_K) {
            const int nb = stride / 256;
            int16_t *bs = (int16_t *)xp.e;
            for (int i = warp; i < NT * nb; i += MV_WARPS) {
                const int t = i / nb, b = i % nb;
                int8_t *qb = q + (size_t)t * stride + 256 * b;
                int16_t *bsb = bs + (size_t)t * (stride / 16) + 16 * b;
                if (P.in.mode == MV_IN_X) {
                    q8K_block_warp(256 * b < P.n ? xf + (size_t)(t_base + t) * P.n + 256 * b : NULL, lane, qb, d + i, bsb);
                } else {
                    float v[8];
#pragma unroll
                    for (int k = 0; k < 8; k++) {
                        const int e = 256 * b + 8 * lane + k;
                        v[k] = e < P.n ? in_val(t, e) : 0.0f;
                    }
                    q8K_block_vals(v, lane, qb, d + i, bsb);
                }
            }
            x.bs = bs;
        } else {
            float *sx = Q::XF == XF_Q8_1 ? (float *)xp.e : NULL;
            q8_rows(
                [&](int t, int e0, float (&v)[4]) {
                    if (P.in.mode == MV_IN_X) x_vals4(xf + (size_t)t_base * P.n, P.n, t, e0, v);
                    else in_vals4(t, e0, v);
                },
                P.n, NT, stride, threadIdx.x, MV_WARPS * 32, q, d, sx);
            x.s = sx;
        }
        x.q = q;
        x.d = d;
        t0 = 0;
        __syncthreads();
        cuda_trace_mid();
    }
    if (cc.set >= s_end) {
        cuda_trace_end();
        return;
    }

    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int j = 0; j < NT; j++) acc[r][j] = 0.0f;
    for (int k = 0;; k++) {
        const int st = k & 1;
        cp_async_wait1(); /* item k has landed (item k + 1 may still be in flight) */
        __syncwarp();
        const int u0 = cc.ch * CU, uend = min(u0 + CU, P.n_units);
        const uint8_t *sm[R];
        int off0[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            sm[r] = &wsm[warp][st][r][0];
            off0[r] = (int)((uintptr_t)(cc.row[r] + (size_t)(u0 / Q::UPB) * Q::BB) & 15);
        }
        if constexpr (S::FLOAT) {
            chunk_dot_float<T, NT, CU>(sm[0], off0[0], x, t0, u0, uend - u0, P.n, lane, acc[0]);
        } else {
#pragma unroll
            for (int j = 0; j < CU / 32; j++) {
                const int ul = lane + 32 * j, u = u0 + ul;
                if (u < uend) {
                    int off[R];
#pragma unroll
                    for (int r = 0; r < R; r++) off[r] = off0[r] + (ul / Q::UPB) * Q::BB;
                    unit_dot<T, NT, R, FUSED != MV_CONVERTED>(sm, off, ul % Q::UPB, x, t0, u, acc);
                }
            }
        }
        __syncwarp(); /* this stage is refilled now */
        issue(ic, st);
        advance(ic);
        if (cc.ch + 1 == n_chunks) { /* the set is done */
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    const float v = cuda_warp_sum(acc[r][j]);
                    acc[r][j] = 0.0f;
                    const int row = cc.set * R + r;
                    if (lane == 0 && row < total)
                        P.y[cc.wi[r]][(size_t)(t_base + blockIdx.y * NT + j) * P.n_out[cc.wi[r]] + (row - P.row0[cc.wi[r]])] = v;
                }
        }
        advance(cc);
        if (cc.set >= s_end) break;
    }
    cuda_trace_end();
}

/* ---- one token, Q8_0, weights loaded straight into registers -------------------------------
 * For narrow matrices (a row or less per warp: the 9B's 4096 x 4096 out- and o-projections),
 * where the staged matvec's time after the PDL wait (its input formed in every block, chunks
 * through shared memory) is most of its time. The input arrives as codes written by a form
 * kernel; each lane loads its own 34-byte blocks as the nine aligned words that cover them (a
 * block starts 0 or 2 bytes into a word), its first MV_DIRECT_PRE before the wait. Lane l sums
 * units l, l + 32, ... in order with unit_dot's arithmetic, so every output equals the staged
 * kernels' bit for bit (decode and verify agree). Standalone, a chain of 4096 x 4096 matvecs
 * took 6.1 µs each with its form kernel against 9.0 for the fused staged form (H200). */
#define MV_DIRECT_PRE 2

__device__ __forceinline__ void q8_0_words(const uint8_t *blk, uint32_t (&v)[9]) {
    const uint32_t *a = (const uint32_t *)((uintptr_t)blk & ~(uintptr_t)3);
#pragma unroll
    for (int j = 0; j < 9; j++) v[j] = __ldg(a + j);
}

__device__ __forceinline__ float q8_0_unit(const uint8_t *blk, const uint32_t (&v)[9], const xact &x, int u) {
    const bool odd = ((uintptr_t)blk & 3) != 0;
    const uint16_t db = odd ? (uint16_t)(v[0] >> 16) : (uint16_t)(v[0] & 0xFFFFu);
    uint32_t c[8];
#pragma unroll
    for (int j = 0; j < 8; j++) c[j] = odd ? v[j + 1] : __funnelshift_r(v[j], v[j + 1], 16);
    const int4 *xp = (const int4 *)x.q + 2 * u;
    const int lo = dp4a_half(c, __ldg(xp)), hi = dp4a_half(c + 4, __ldg(xp + 1));
    return __fmul_rn(__fmul_rn(__half2float(__ushort_as_half(db)), __ldg(x.d + u)), (float)(lo + hi));
}

__global__ void __launch_bounds__(MV_WARPS * 32, MV_DIRECT_PER_SM)
matvec_q8_0_direct_kernel(const uint8_t *__restrict__ w, size_t rb, int n_units, int n_rows, const xact x,
                          float *__restrict__ y) {
    constexpr int BB = qt<GGML_TYPE_Q8_0>::BB;
    cuda_pdl_trigger();
    const int lane = threadIdx.x % 32, nw = gridDim.x * MV_WARPS;
    int row = blockIdx.x * MV_WARPS + threadIdx.x / 32;
    uint32_t pre[MV_DIRECT_PRE][9];
    if (row < n_rows)
#pragma unroll
        for (int k = 0; k < MV_DIRECT_PRE; k++)
            if (lane + 32 * k < n_units) q8_0_words(w + (size_t)row * rb + (size_t)(lane + 32 * k) * BB, pre[k]);
    cuda_pdl_wait();
    for (bool first = true; row < n_rows; row += nw, first = false) {
        const uint8_t *wr = w + (size_t)row * rb;
        float acc = 0.0f;
#pragma unroll
        for (int k = 0; k < MV_DIRECT_PRE; k++) {
            const int u = lane + 32 * k;
            if (u >= n_units) continue;
            uint32_t v[9];
            if (first) {
#pragma unroll
                for (int j = 0; j < 9; j++) v[j] = pre[k][j];
            } else q8_0_words(wr + (size_t)u * BB, v);
            acc += q8_0_unit(wr + (size_t)u * BB, v, x, u);
        }
        for (int u0 = 32 * MV_DIRECT_PRE; u0 < n_units; u0 += 64) { /* two units' loads in flight */
            const int u = u0 + lane, u1 = u + 32;
            uint32_t v[9], v1[9];
            if (u < n_units) q8_0_words(wr + (size_t)u * BB, v);
            if (u1 < n_units) q8_0_words(wr + (size_t)u1 * BB, v1);
            if (u < n_units) acc += q8_0_unit(wr + (size_t)u * BB, v, x, u);
            if (u1 < n_units) acc += q8_0_unit(wr + (size_t)u1 * BB, v1, x, u1);
        }
        acc = cuda_warp_sum(acc);
        if (lane == 0) y[row] = acc;
    }
    cuda_trace_end();
}

/* A persistent grid: as many blocks as fit on the device at once (from the kernel's registers
 * and this launch's shared memory), at most one row set per warp. */
template <int T, int NT, int FUSED, int R>
static void mv_launch_rows(struct cuda_ctx *c, int slot, const mv_params &P, const float *xf, const xact &x,
                           int t_base, int n_groups) {
    typedef mv_shape<T, NT, R> S;
    void (*kern)(const mv_params, const float *, xact, int) = matvec_kernel<T, NT, FUSED, R>;
    const int smem = S::WBYTES + (FUSED != MV_CONVERTED ? xs_bytes(qt<T>::XF, NT, x.stride) : 0);
    int &regs = c->mv_regs[slot][NT - 1][R > 1][FUSED], &smem_static = c->mv_smem_static[slot][NT - 1][R > 1][FUSED];
    if (!regs) {
        cudaFuncAttributes fa;
        CUDA_CHECK(cudaFuncGetAttributes(&fa, kern));
        smem_static = (int)fa.sharedSizeBytes;
        CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, c->smem_block_max - smem_static));
        regs = fa.numRegs > 0 ? fa.numRegs : 1;
    }
    const int warp_regs = (regs * 32 + 255) / 256 * 256;
    const int by_regs = 65536 / (warp_regs * MV_WARPS);
    const int by_smem = c->smem_per_sm / (smem + smem_static + c->smem_reserved);
    const int per_sm = COTI_MAX(1, COTI_MIN(COTI_MIN(by_regs, by_smem), 2048 / (MV_WARPS * 32)));
    const int sets = cuda_cdiv(P.row0[P.n_w], R);
    /* Rule: float rows (no input forming in the blocks) spread over every SM, as few as a row set
     * a block: the 35B-A3B's F32 router (257 rows, a block per 16) read 2 MB on 17 SMs, 8.7 us */
    const int grid = S::FLOAT ? COTI_MIN(sets, c->n_sm * per_sm) : COTI_MIN(cuda_cdiv(sets, MV_WARPS), c->n_sm * per_sm);
    cuda_launch_smem(c, dim3(grid, n_groups), MV_WARPS * 32, smem, kern, P, xf, x, t_base);
}

/* Rule: weight rows per warp. One, but for the converted matvec of a quantized type at least
 * MV_WIDE_ROW_MIN wide two at 4-6 token rows and four at 7-8: each activation load then serves
 * several weight rows, where the dot products, not the bytes, bound a launch. H200, 9B q8_0
 * verify of 1-8 rows (bench --verify-cost 8, us), one / four rows per warp (as before) against
 * two at 2-8: 3657 -> 3772 at 2 rows, 4250 -> 4283 at 3 (one wins), 4895 -> 4800, 5408 -> 5203,
 * 5899 -> 5652 at 4-6 (two wins), 6302 -> 6328, 6710 -> 6885 at 7-8 (four wins); off with 4
 * sequences 775 -> 818 tok/s. Narrow rows keep one per warp: their few weight rows need every
 * warp (384 -> 16384 at 2 rows 7.5 -> 9.2 us at two per warp; the tiny model's 5-row verify
 * 395 us at four against 300 at one; the fused launches, narrow past one row, likewise). */
#define MV_WIDE_ROW_MIN 2048
template <int T, int NT, int FUSED>
static void mv_launch(struct cuda_ctx *c, int slot, const mv_params &P, const float *xf, const xact &x, int t_base,
                      int n_groups) {
    if constexpr (!mv_shape<T, NT, 1>::FLOAT && NT >= 4 && FUSED == MV_CONVERTED)
        if (P.n >= MV_WIDE_ROW_MIN) {
            constexpr int R = NT <= 6 ? 2 : 4;
            return mv_launch_rows<T, NT, FUSED, R>(c, slot, P, xf, x, t_base, n_groups);
        }
    mv_launch_rows<T, NT, FUSED, 1>(c, slot, P, xf, x, t_base, n_groups);
}

#define MV_ROW(T)                                                                              \
    {mv_launch<T, 1, MV_CONVERTED>, mv_launch<T, 2, MV_CONVERTED>, mv_launch<T, 3, MV_CONVERTED>,   \
     mv_launch<T, 4, MV_CONVERTED>, mv_launch<T, 5, MV_CONVERTED>, mv_launch<T, 6, MV_CONVERTED>,   \
     mv_launch<T, 7, MV_CONVERTED>, mv_launch<T, 8, MV_CONVERTED>}
#define MV_TYPE_Q(T)                                                                                         \
    {cuda_mm_slot(T), qt<T>::XF, true, MV_ROW(T), {mv_launch<T, 1, MV_FUSED>, mv_launch<T, 2, MV_FUSED>},      \
     {mv_launch<T, 1, MV_FUSED_NORM2>, mv_launch<T, 2, MV_FUSED_NORM2>, mv_launch<T, 3, MV_FUSED_NORM2>,       \
      mv_launch<T, 4, MV_FUSED_NORM2>},                                                                        \
     mv_launch<T, 1, MV_STAGED>,                                                                               \
     {mv_shape<T, 1, 1>::WBYTES, mv_shape<T, 2, 1>::WBYTES, mv_shape<T, 3, 1>::WBYTES, mv_shape<T, 4, 1>::WBYTES}},
#define MV_TYPE_F(T) {cuda_mm_slot(T), qt<T>::XF, false, MV_ROW(T), {NULL, NULL}, {NULL, NULL, NULL, NULL}, NULL, {0, 0, 0, 0}},

static const struct mv_type mv_types[] = {CUDA_MM_FLOAT_TYPES(MV_TYPE_F) CUDA_MM_QUANT_TYPES(MV_TYPE_Q)};

const struct mv_type *mv_type_find(enum ggml_type t) {
    const int slot = cuda_mm_slot(t);
    return slot >= 0 ? &mv_types[slot] : NULL;
}

void mv_direct(struct cuda_ctx *c, const struct bweight *w, const xact &x, float *y) {
    const int grid = COTI_MIN(cuda_cdiv((int)w->n_out, MV_WARPS), MV_DIRECT_PER_SM * c->n_sm);
    cuda_launch(c, grid, MV_WARPS * 32, matvec_q8_0_direct_kernel, (const uint8_t *)w->data, w->row_bytes,
                (int)((w->n_in + 31) / 32), (int)w->n_out, x, y);
}

CUDA_TRACE_TU(matvec)
