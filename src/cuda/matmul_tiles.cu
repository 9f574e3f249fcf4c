/* matmul_tiles.cu — the prefill matmul: int8 tensor-core tiles over converted activations, for
 * the quantized weight types, summing every output's blocks in the CPU reference's order. */
#include "matmul.cuh"

/* ---- prefill: int8 tensor-core tiles ------------------------------------------------------
 * For more than MV_MAX_NT tokens. A block computes a 64-row x 64- or 128-token tile with 4 or 8
 * warps (each 32 x 32) over K tiles of KU units (4 blocks of 32, or 1 super-block of 8 units): cp.async
 * stages the raw weight bytes of the next K tile while the threads decode the current one into
 * int8 codes (the same decode() as the matvec) and its converted activations are loaded; then
 * per unit an mma.sync m16n8k32 (s8 x s8 -> s32) gives the exact integer sum of every output,
 * or two m16n8k16 its 16-element halves lo / hi where the type scales them apart (Q6_K).
 * Each output accumulates its blocks in row order exactly as the CPU reference does: per unit
 * with combine() for the 32-element formats, and per super-block from exact integer sums for
 * the K-quants (sb()), so prefill outputs are bit-identical to the CPU reference.
 * KU 4 for the 32-element formats keeps a block's shared memory near 48 KB, so 4 blocks share
 * an SM (registers allow 4): at KU 8, 88.6 KB let 2 (ncu, 9B Q8_0 prefill: 2 warps per
 * scheduler, 0.67 eligible, issue slots 46% busy). */

#define MMQ_BM 64
#define MMQ_WM 2 /* warps down the rows; WN warps across the tokens, each warp 32 x 32 */

/* A tile of 64 rows x 32·WN tokens. WN 4 (128 tokens, 256 threads) decodes each K tile of weights
 * once for twice the tokens of WN 2 (H100, 9B Q8_0: prompts of 512 and 4096 tokens +8 %); a
 * prompt of 64 tokens or fewer takes WN 2 (half a 128-token tile would idle), and so do the
 * K-quants and launches too narrow to spread 128-token tiles evenly (mmq_launch). Every output
 * sums the same units in the same order at either width, so the geometry does not change a bit
 * of the result. */
template <int T, int WN> struct mmq_shape {
    enum {
        BN = 32 * WN,
        THREADS = 32 * MMQ_WM * WN,
        KU = qt<T>::UPB == 8 ? 8 : 4,                    /* units per K tile */
        LD = KU * 32 + 16,                               /* padded row stride of the code tiles (no bank conflicts) */
        RAW = KU / qt<T>::UPB * qt<T>::BB,               /* raw bytes of a row per K tile */
        RSLOT = ((RAW + 30) / 16) * 16 + 16,
        /* per SM: what shared memory allows (4 warps: 4 blocks at KU 4, 3 at KU 8; 8 warps: 2 at KU 4) */
        MIN_BLOCKS = WN == 2 ? (KU == 4 ? 4 : 3) : 2,
        SMEM = 2 * MMQ_BM * RSLOT + (MMQ_BM + BN) * LD + MMQ_BM * KU * (int)sizeof(usc) +
               BN * KU * (int)sizeof(uxs) + MMQ_BM * (int)sizeof(void *),
    };
};

/* Whether a type's unit contributes through the sum of its two halves only (one k32 mma). */
template <int T> struct mmq_whole_unit { enum { V = T != GGML_TYPE_Q6_K }; };

__device__ __forceinline__ void mma_s8_16832(uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1,
                                             int (&c)[4]) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
}

__device__ __forceinline__ void mma_s8_16816(uint32_t a0, uint32_t a1, uint32_t b0, int (&c)[4]) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a0), "r"(a1), "r"(b0), "r"(0));
}

template <int T, int WN>
__global__ void __launch_bounds__(mmq_shape<T, WN>::THREADS, mmq_shape<T, WN>::MIN_BLOCKS)
    mmq_kernel(const mv_params P, const xact x, int n_tok) {
    typedef qt<T> Q;
    typedef mmq_shape<T, WN> S;
    constexpr int MMQ_BN = S::BN, MMQ_THREADS = S::THREADS, TPR = MMQ_THREADS / MMQ_BM;
    constexpr bool KQ = Q::UPB == 8, WHOLE = mmq_whole_unit<T>::V;
    constexpr int KU = S::KU, LD = S::LD;
    extern __shared__ __align__(16) uint8_t dsm[];
    uint8_t(*raw)[MMQ_BM][S::RSLOT] = reinterpret_cast<uint8_t(*)[MMQ_BM][S::RSLOT]>(dsm);
    uint8_t *acode = dsm + 2 * MMQ_BM * S::RSLOT;
    uint8_t *xcode = acode + MMQ_BM * LD;
    usc *wsc = (usc *)(xcode + MMQ_BN * LD);
    uxs *xsc = (uxs *)(wsc + MMQ_BM * KU);
    const uint8_t **rowp = (const uint8_t **)(xsc + MMQ_BN * KU);
    cuda_pdl_trigger();
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, tq = lane % 4;
    const int wm = warp / WN, wn = warp % WN;
    const int total = P.row0[P.n_w], row_base = blockIdx.x * MMQ_BM, tok_base = blockIdx.y * MMQ_BN;
    const int n_kt = (P.n_units + KU - 1) / KU;
    if (tid < MMQ_BM) { /* rows past the end repeat the last one (results dropped) */
        rowp[tid] = mv_row_bytes(P, min(row_base + tid, total - 1));
    }
    __syncthreads();
    /* raw bytes of K tile kt: TPR threads per row */
    auto issue = [&](int kt, int st) {
        const int i = tid / TPR, u0 = kt * KU;
        stage_row_units<T>(rowp[i], u0, min(u0 + KU, P.n_units), raw[st][i], tid % TPR, TPR);
        cp_async_commit();
    };
    issue(0, 0);
    cuda_pdl_wait();

    float acc[2][4][4];
    int isum[2][4][4], msum[2][4][4];
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) { acc[mi][ni][e] = 0.0f; isum[mi][ni][e] = 0; msum[mi][ni][e] = 0; }

    /* the converted activations of a K tile: read into registers one tile ahead (their loads
     * in flight during the tile before), stored to shared memory when their tile starts; at K
     * tiles of 8 units the registers held across a tile would halve the blocks per SM (ptxas:
     * Q4_K 168 -> 249), so those read their own tile's */
    constexpr bool AHEAD = KU == 4;
    constexpr int XV = MMQ_BN * 2 * KU / MMQ_THREADS, XSN = MMQ_BN * KU / MMQ_THREADS;
    uint4 xr[XV];
    uxs xsr[XSN];
    auto load_x = [&](int kt) {
        const int u0 = kt * KU;
#pragma unroll
        for (int i = 0; i < XV; i++) {
            const int p = tid + i * MMQ_THREADS, j = p / (2 * KU), q = p % (2 * KU), t = min(tok_base + j, n_tok - 1);
            xr[i] = __ldg((const uint4 *)((const int8_t *)x.q + (size_t)t * x.stride + 32 * u0) + q);
        }
#pragma unroll
        for (int i = 0; i < XSN; i++) {
            const int p = tid + i * MMQ_THREADS, j = p / KU, uu = p % KU, t = min(tok_base + j, n_tok - 1);
            xsr[i] = u0 + uu < P.n_units ? load_xs<Q::XF, false>(x, (size_t)t, u0 + uu) : uxs{0.0f, 0.0f, 0};
        }
    };
    if constexpr (AHEAD) load_x(0);

    for (int kt = 0; kt < n_kt; kt++) {
        const int st = kt & 1, u0 = kt * KU;
        if (kt + 1 < n_kt) issue(kt + 1, st ^ 1);
        else cp_async_commit();
        if constexpr (!AHEAD) load_x(kt);
#pragma unroll
        for (int i = 0; i < XV; i++) {
            const int p = tid + i * MMQ_THREADS, j = p / (2 * KU), q = p % (2 * KU);
            *(uint4 *)(xcode + j * LD + 16 * q) = xr[i];
        }
#pragma unroll
        for (int i = 0; i < XSN; i++) xsc[tid + i * MMQ_THREADS] = xsr[i];
        if (AHEAD && kt + 1 < n_kt) load_x(kt + 1);
        cp_async_wait1();
        __syncthreads();
        /* decode: 4 (row, unit) pairs per thread */
        for (int p = tid; p < MMQ_BM * KU; p += MMQ_THREADS) {
            const int i = p / KU, uu = p % KU;
            uint32_t c[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            usc s = {0.0f, 0.0f, 0, 0};
            if (u0 + uu < P.n_units) {
                const int off0 = (int)((uintptr_t)(rowp[i] + (size_t)(u0 / Q::UPB) * Q::BB) & 15);
                Q::decode(&raw[st][i][0], off0 + (uu / Q::UPB) * Q::BB, uu % Q::UPB, c, s);
            }
            uint4 *dst = (uint4 *)(acode + i * LD + 32 * uu);
            dst[0] = make_uint4(c[0], c[1], c[2], c[3]);
            dst[1] = make_uint4(c[4], c[5], c[6], c[7]);
            wsc[p] = s;
        }
        __syncthreads();
        /* tensor cores: per unit, lo and hi halves of every output of the warp's 32 x 32 */
        const int uend = min(KU, P.n_units - u0);
#pragma unroll(KU == 4 ? 4 : 1) /* 8 units unrolled: 234 registers for Q4_K */
        for (int uu = 0; uu < KU; uu++) {
            if (uu >= uend) break;
            uint32_t a[2][2][2], b[4][2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
#pragma unroll
                for (int mi = 0; mi < 2; mi++) {
                    const uint8_t *ap = acode + (wm * 32 + mi * 16 + g) * LD + 32 * uu + 16 * h + 4 * tq;
                    a[mi][h][0] = *(const uint32_t *)ap;
                    a[mi][h][1] = *(const uint32_t *)(ap + 8 * LD);
                }
#pragma unroll
                for (int ni = 0; ni < 4; ni++)
                    b[ni][h] = *(const uint32_t *)(xcode + (wn * 32 + ni * 8 + g) * LD + 32 * uu + 16 * h + 4 * tq);
            }
            usc ws[2][2];
            uxs xs[4][2];
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int rr = 0; rr < 2; rr++) ws[mi][rr] = wsc[(wm * 32 + mi * 16 + g + 8 * rr) * KU + uu];
#pragma unroll
            for (int ni = 0; ni < 4; ni++)
#pragma unroll
                for (int cc = 0; cc < 2; cc++) xs[ni][cc] = xsc[(wn * 32 + ni * 8 + 2 * tq + cc) * KU + uu];
#pragma unroll
            for (int mi = 0; mi < 2; mi++) {
                /* a row group's mmas first, then their sums: the combines wait on the first only */
                int lo[4][4], hi[4][4];
#pragma unroll
                for (int ni = 0; ni < 4; ni++) {
                    if constexpr (WHOLE) {
                        mma_s8_16832(a[mi][0][0], a[mi][0][1], a[mi][1][0], a[mi][1][1], b[ni][0], b[ni][1], lo[ni]);
#pragma unroll
                        for (int e = 0; e < 4; e++) hi[ni][e] = 0;
                    } else {
                        mma_s8_16816(a[mi][0][0], a[mi][0][1], b[ni][0], lo[ni]);
                        mma_s8_16816(a[mi][1][0], a[mi][1][1], b[ni][1], hi[ni]);
                    }
                }
#pragma unroll
                for (int ni = 0; ni < 4; ni++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const usc &sw = ws[mi][e / 2];
                        const uxs &sx = xs[ni][e % 2];
                        if constexpr (KQ) {
                            isum[mi][ni][e] += Q::isum(sw, lo[ni][e], hi[ni][e]);
                            msum[mi][ni][e] += Q::msum(sw, sx);
                        } else {
                            acc[mi][ni][e] += Q::combine(sw, lo[ni][e], hi[ni][e], sx);
                        }
                    }
            }
        }
        if constexpr (KQ) { /* the K tile is one super-block: fold its exact sums */
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const usc &sw = wsc[(wm * 32 + mi * 16 + g + 8 * (e / 2)) * KU];
                        const uxs &sx = xsc[(wn * 32 + ni * 8 + 2 * tq + e % 2) * KU];
                        acc[mi][ni][e] += Q::sb(sw, isum[mi][ni][e], msum[mi][ni][e], sx.d);
                        isum[mi][ni][e] = 0;
                        msum[mi][ni][e] = 0;
                    }
        }
        __syncthreads(); /* the tiles are refilled next */
    }
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int rr = 0; rr < 2; rr++)
            tile_store_row(P, row_base + wm * 32 + mi * 16 + g + 8 * rr, total, acc[mi], rr, tok_base + wn * 32 + 2 * tq,
                           n_tok);
}

typedef void (*mmq_launch_fn)(struct cuda_ctx *c, int slot, const mv_params &P, const xact &x, int n_tok);

template <int T, int WN>
static void mmq_launch_wn(struct cuda_ctx *c, int slot, const mv_params &P, const xact &x, int n_tok) {
    typedef mmq_shape<T, WN> S;
    void (*kern)(const mv_params, const xact, int) = mmq_kernel<T, WN>;
    if (!c->mmq_ready[WN / 4][slot]) {
        CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, S::SMEM));
        c->mmq_ready[WN / 4][slot] = true;
    }
    const dim3 grid(cuda_cdiv(P.row0[P.n_w], MMQ_BM), cuda_cdiv(n_tok, S::BN));
    cuda_launch_smem(c, grid, S::THREADS, S::SMEM, kern, P, x, n_tok);
}

/* Tokens of tile width the busiest SM works through when a launch of n_rows x n_tok goes in
 * tiles bn tokens wide: the blocks go round the SMs, so one SM holds ceil(blocks / n_sm). */
static int mmq_sm_tokens(const struct cuda_ctx *c, int n_rows, int n_tok, int bn) {
    return cuda_cdiv(cuda_cdiv(n_rows, MMQ_BM) * cuda_cdiv(n_tok, bn), c->n_sm) * bn;
}

/* 128-token tiles where the busiest SM gets no more tokens than with 64-token ones: a launch of
 * many blocks (the 9B's 4096- and 12288-row weights: +8 % at 512 and 4096 tokens, H100) takes
 * them; a narrow one does not (the default model's 384-1152 rows at 4096 tokens: 192 blocks
 * of 128 leave some SMs two where 384 of 64 leave none more than three, and 128-token tiles
 * lost 2-4 %). Forcing the tiles (the op tests) forces the wide ones wherever they may run. */
template <int T>
static void mmq_launch(struct cuda_ctx *c, int slot, const mv_params &P, const xact &x, int n_tok) {
    /* the K-quants' 8-unit K tiles need ~168 registers: 8 warps of them would not fit two
     * blocks per SM without spilling, so they stay at 64 tokens */
    if constexpr (qt<T>::UPB != 8) {
        const int rows = P.row0[P.n_w], bn2 = mmq_shape<T, 2>::BN, bn4 = mmq_shape<T, 4>::BN;
        if (n_tok > bn2 && (c->mv_force == CUDA_MV_TILES ||
                            mmq_sm_tokens(c, rows, n_tok, bn4) <= mmq_sm_tokens(c, rows, n_tok, bn2)))
            return mmq_launch_wn<T, 4>(c, slot, P, x, n_tok);
    }
    mmq_launch_wn<T, 2>(c, slot, P, x, n_tok);
}

#define MMQ_NONE(T) NULL,
#define MMQ_TYPE(T) mmq_launch<T>,
static const mmq_launch_fn mmq_types[] = {CUDA_MM_FLOAT_TYPES(MMQ_NONE) CUDA_MM_QUANT_TYPES(MMQ_TYPE)};

void mmq_run(struct cuda_ctx *c, int slot, const mv_params &P, const xact &x, int n_tok) {
    mmq_types[slot](c, slot, P, x, n_tok);
}

CUDA_TRACE_TU(matmul_tiles)
