/* matmul_f16.cu — the long-prompt matmul on f16 tensor cores, working from the quantized bytes:
 * each block copies its weight rows' raw bytes into shared memory, decodes them into int8 codes
 * (the matvec's decode()), turns the codes into f16 values there (scale and offset of the unit
 * in f16 arithmetic) and multiplies them with f16 activation rows (mma.sync m16n8k16, f32
 * sums). No f16 copy of the weights exists in global memory: session 18's version dequantized
 * every weight to global f16 per prompt slice and lost 7 % on the 9B for it
 * (docs/notes/2026-12-04-prefill.md).
 * Not bit-identical to the CPU reference or to the matvec (weights and activations rounded to
 * f16): it serves the rows of prompts of the f16 family (cuda_prompt_family: 128 tokens or
 * more); decode and verify rows keep the exact kernels. An output sums its K tiles in order with
 * the same mmas whatever the number of tokens, so it depends on its row and token alone: a
 * prompt gives the same bits in any batch. */
#include "matmul.cuh"
#include "mma.cuh"

#define MMF_BM 128          /* weight rows per block */
#define MMF_BN 128          /* tokens per block */
#define MMF_KT 2            /* 32-element units per K tile */
#define MMF_LD (32 * MMF_KT + 8) /* halves per shared row: 144 bytes, ldmatrix without bank conflicts */
#define MMF_THREADS 256     /* 8 warps: 2 down the rows x 4 across the tokens, 64 x 32 each */

/* Raw weight bytes are staged per raw tile of RU units: a K tile's two blocks for the
 * 32-element formats, in two buffers (the tile after next lands while the next is decoded);
 * a whole super-block (four K tiles) for the K-quants, in one buffer (two do not fit beside
 * a second block on the SM). */
template <int T> struct mmf_shape {
    enum {
        RU = qt<T>::UPB == 8 ? 8 : MMF_KT,
        NRAW = qt<T>::UPB == 8 ? 1 : 2,
        RAW = RU / qt<T>::UPB * qt<T>::BB,
        /* an odd count of 16 bytes a row: rows of whole 16s (Q6_K's 256) would start every
         * staged row on one bank, 16-way conflicts in decode() */
        RSLOT = (((RAW + 30) / 16 + 1) | 1) * 16,
        SMEM = NRAW * MMF_BM * RSLOT + 4 * MMF_BM * MMF_LD * 2 + MMF_BM * (int)sizeof(void *),
    };
};

/* A unit's value for a code c is scale·c + offset (per 16-element half: Q6_K scales its halves
 * apart); the reference's products of scales are formed in f32 and rounded to f16 once. */
template <int T> __device__ __forceinline__ void unit_affine(const usc &s, int half, float &scale, float &offset) {
    if constexpr (T == GGML_TYPE_Q4_1 || T == GGML_TYPE_Q5_1) {
        scale = s.d;
        offset = s.m;
    } else if constexpr (T == GGML_TYPE_Q4_K || T == GGML_TYPE_Q5_K) {
        scale = __fmul_rn(s.d, (float)s.a);
        offset = -__fmul_rn(s.m, (float)s.b);
    } else if constexpr (T == GGML_TYPE_Q6_K) {
        scale = __fmul_rn(s.d, (float)(half ? s.b : s.a));
        offset = 0.0f;
    } else {
        scale = s.d;
        offset = 0.0f;
    }
}

/* Four signed int8 codes to two f16 pairs, exactly: a code's byte + 128 goes into the low
 * mantissa byte of 1024.0 (0x6400), and 1152 comes off. */
__device__ __forceinline__ void codes_to_h2(uint32_t w, __half2 &lo, __half2 &hi) {
    const uint32_t u = w ^ 0x80808080u;
    const uint32_t p0 = __byte_perm(u, 0x64646464u, 0x4140), p1 = __byte_perm(u, 0x64646464u, 0x4342);
    const __half2 bias = __halves2half2(__ushort_as_half(0x6480), __ushort_as_half(0x6480));
    lo = __hsub2(*(const __half2 *)&p0, bias);
    hi = __hsub2(*(const __half2 *)&p1, bias);
}

/* Block (tokens bx, rows by): K tiles in a software pipeline, one barrier each: while the
 * warps multiply K tile kt (f16 tile As[kt % 2], activations Bs[kt % 2]), they decode K tile
 * kt + 1 from its raw bytes into As[(kt + 1) % 2], the activations of kt + 1 and the raw bytes
 * of the tile after are in flight. Decoding (integer and f16 arithmetic) and the mmas then
 * share the issue slots of one interval instead of taking turns between barriers. A K-quant's
 * super-block lands only once the last K tile of the one before is decoded: those iterations
 * (one in four) multiply first and decode after a second barrier. Each output takes its K
 * tiles in order with the same mmas as before: the same bits. */
template <int T>
__global__ void __launch_bounds__(MMF_THREADS, 2) mmf_kernel(const mv_params P, const xact x, int n_tok) {
    typedef qt<T> Q;
    typedef mmf_shape<T> S;
    constexpr int RU = S::RU, KPR = RU / MMF_KT, NRAW = S::NRAW; /* K tiles per raw tile */
    extern __shared__ __align__(16) uint8_t dsm[];
    uint8_t(*raw)[MMF_BM][S::RSLOT] = reinterpret_cast<uint8_t(*)[MMF_BM][S::RSLOT]>(dsm);
    uint8_t *tiles = dsm + NRAW * MMF_BM * S::RSLOT;
    __half(*As)[MMF_BM][MMF_LD] = reinterpret_cast<__half(*)[MMF_BM][MMF_LD]>(tiles);
    __half(*Bs)[MMF_BN][MMF_LD] = reinterpret_cast<__half(*)[MMF_BN][MMF_LD]>(tiles + 2 * MMF_BM * MMF_LD * 2);
    const uint8_t **rowp = (const uint8_t **)(tiles + 4 * MMF_BM * MMF_LD * 2);
    cuda_pdl_trigger();
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int wm = warp / 4, wn = warp % 4;
    const int total = P.row0[P.n_w], tok_base = blockIdx.x * MMF_BN, row_base = blockIdx.y * MMF_BM;
    const int n_kt = (P.n_units + MMF_KT - 1) / MMF_KT, n_rt = (P.n_units + RU - 1) / RU;
    const __half *X = (const __half *)x.q;
    if (tid < MMF_BM) { /* rows past the end repeat the last one (results dropped) */
        rowp[tid] = mv_row_bytes(P, min(row_base + tid, total - 1));
    }
    __syncthreads();
    /* raw tile rt's bytes into its buffer, two threads a row (their 16-byte-aligned span) */
    auto issue_raw = [&](int rt) {
        const int i = tid / 2, u0 = rt * RU;
        stage_row_units<T>(rowp[i], u0, min(u0 + RU, P.n_units), raw[rt % NRAW][i], tid % 2, 2);
    };
    /* K tile kt of the activations (64 halves of each token; the rows are zero-padded to the
     * stride, which K tiles never pass); tokens past the end repeat the last one */
    auto issue_x = [&](int kt) {
#pragma unroll
        for (int i = 0; i < MMF_BN * 8 / MMF_THREADS; i++) {
            const int c = tid + i * MMF_THREADS, r = c / 8, q = c % 8, t = min(tok_base + r, n_tok - 1);
            cp_async16(&Bs[kt & 1][r][8 * q], X + (size_t)t * x.stride + (size_t)kt * 32 * MMF_KT + 8 * q);
        }
    };
    /* K tile kt into As[kt % 2], (row, unit) = (tid / 2, tid % 2) */
    auto decode = [&](int kt) {
        const int i = tid / 2, uu = tid % 2, u = kt * MMF_KT + uu;
        uint4 *dst = (uint4 *)&As[kt & 1][i][32 * uu];
        if (u < P.n_units) {
            const int ur = u % RU, rt0 = u - ur;
            const int off0 = (int)((uintptr_t)(rowp[i] + (size_t)(rt0 / Q::UPB) * Q::BB) & 15);
            uint32_t c[8];
            usc s = {0.0f, 0.0f, 0, 0};
            Q::decode(&raw[(u / RU) % NRAW][i][0], off0 + (ur / Q::UPB) * Q::BB, u % Q::UPB, c, s);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float sc, of;
                unit_affine<T>(s, h, sc, of);
                const __half2 s2 = __float2half2_rn(sc), o2 = __float2half2_rn(of);
                uint32_t v[8];
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    __half2 a, b;
                    codes_to_h2(c[4 * h + k], a, b);
                    a = __hfma2(a, s2, o2);
                    b = __hfma2(b, s2, o2);
                    v[2 * k] = *(const uint32_t *)&a;
                    v[2 * k + 1] = *(const uint32_t *)&b;
                }
                dst[2 * h] = make_uint4(v[0], v[1], v[2], v[3]);
                dst[2 * h + 1] = make_uint4(v[4], v[5], v[6], v[7]);
            }
        } else { /* a unit past the row's end adds nothing */
#pragma unroll
            for (int k = 0; k < 4; k++) dst[k] = make_uint4(0, 0, 0, 0);
        }
    };
    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;
    /* K tile kt's mmas: each warp's 64 x 32 outputs, 4 k16 steps */
    auto multiply = [&](int kt) {
        const int st = kt & 1;
#pragma unroll
        for (int k16 = 0; k16 < 32 * MMF_KT; k16 += 16) {
            uint32_t a[4][4], b[2][4];
#pragma unroll
            for (int mi = 0; mi < 4; mi++) ldsm_x4(&As[st][wm * 64 + mi * 16 + lane % 16][k16 + (lane / 16) * 8], a[mi]);
#pragma unroll
            for (int nj = 0; nj < 2; nj++)
                ldsm_x4(&Bs[st][wn * 32 + nj * 16 + lane % 8 + (lane / 16) * 8][k16 + ((lane / 8) % 2) * 8], b[nj]);
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++)
                    mma_f16_16816(a[mi], b[ni / 2][2 * (ni % 2)], b[ni / 2][2 * (ni % 2) + 1], acc[mi][ni]);
        }
    };

    issue_raw(0); /* weights never change: fetch before the wait */
    if (NRAW == 2 && n_rt > 1) issue_raw(1);
    cp_async_commit();
    cuda_pdl_wait();
    issue_x(0);
    cp_async_commit();
    cp_async_wait0();
    __syncthreads();
    decode(0);
    for (int kt = 0; kt < n_kt; kt++) {
        /* kt + 1 starts a super-block whose bytes could not come earlier (one raw buffer) */
        const bool late = NRAW == 1 && kt + 1 < n_kt && (kt + 1) % KPR == 0;
        cp_async_wait0();
        __syncthreads(); /* As[kt % 2] decoded, Bs[kt % 2] and the next raw tile landed; As and
                          * Bs of kt + 1 and the raw buffer of the tile after next are free */
        if (kt + 1 < n_kt) issue_x(kt + 1);
        if (NRAW == 2 && kt + 2 < n_rt) issue_raw(kt + 2);
        if (late) issue_raw((kt + 1) / KPR);
        cp_async_commit();
        if (kt + 1 < n_kt && !late) decode(kt + 1);
        multiply(kt);
        if (late) {
            cp_async_wait0();
            __syncthreads();
            decode(kt + 1);
        }
    }
    cp_async_wait0();
    /* c0 c1: row g, tokens 2q, 2q + 1; c2 c3: row g + 8 */
    const int g = lane / 4, q = lane % 4;
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            tile_store_row(P, row_base + wm * 64 + mi * 16 + g + 8 * h, total, acc[mi], h, tok_base + wn * 32 + 2 * q,
                           n_tok);
}

template <int T> static void mmf_launch(struct cuda_ctx *c, int slot, const mv_params &P, const xact &x, int n_tok) {
    typedef mmf_shape<T> S;
    static_assert(S::SMEM > 48 * 1024 && 2 * S::SMEM <= 227 * 1024, "two blocks an SM, past the default limit");
    void (*kern)(const mv_params, const xact, int) = mmf_kernel<T>;
    if (!c->mmf_ready[slot]) {
        CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, S::SMEM));
        c->mmf_ready[slot] = true;
    }
    /* the token tiles of a row tile run side by side, so its weights come from DRAM once */
    const dim3 grid(cuda_cdiv(n_tok, MMF_BN), cuda_cdiv(P.row0[P.n_w], MMF_BM));
    cuda_launch_smem(c, grid, MMF_THREADS, S::SMEM, kern, P, x, n_tok);
}

#define MMF_NONE(T) NULL,
#define MMF_TYPE(T) mmf_launch<T>,
typedef void (*mmf_launch_fn)(struct cuda_ctx *c, int slot, const mv_params &P, const xact &x, int n_tok);
static const mmf_launch_fn mmf_types[] = {CUDA_MM_FLOAT_TYPES(MMF_NONE) CUDA_MM_QUANT_TYPES(MMF_TYPE)};

void mmf_run(struct cuda_ctx *c, int slot, const mv_params &P, const xact &x, int n_tok) {
    mmf_types[slot](c, slot, P, x, n_tok);
}

CUDA_TRACE_TU(matmul_f16)
