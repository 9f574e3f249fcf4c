/* matmul_f16.cu — the long-prompt matmul on f16 tensor cores, working from the quantized bytes:
 * each block copies its weight rows' raw bytes into shared memory, decodes them into int8 codes
 * (the matvec's decode()), turns the codes into f16 values there (scale and offset of the unit
 * in f16 arithmetic) and multiplies them with f16 activation rows (wgmma m64n128k16, f32 sums).
 * wgmma exists for sm_90a only: this file alone is built for it, and devices of another compute
 * capability take the int8 tiles instead (cuda_ctx.mmf_ok). No f16 copy of the weights exists in
 * global memory: session 18's version dequantized every weight to global f16 per prompt slice and
 * lost 7 % on the 9B for it; mma.sync (session 25) ran ~12 % slower than wgmma with the 128-byte
 * swizzle (docs/notes/2026-12-04-prefill.md).
 * Not bit-identical to the CPU reference or to the matvec (weights and activations rounded to
 * f16): it serves the rows of prompts of the f16 family (cuda_prompt_family: 128 tokens or
 * more); decode and verify rows keep the exact kernels. An output sums its K tiles in order with
 * the same mmas whatever the number of tokens, so it depends on its row and token alone: a
 * prompt gives the same bits in any batch. */
#include "matmul.cuh"

#define MMF_BM 128          /* weight rows per block */
#define MMF_BN 128          /* tokens per block */
#define MMF_KT 2            /* 32-element units per K tile: 64 halves, one 128-byte swizzle row */
#define MMF_THREADS 256     /* 2 warpgroups, 64 rows x 128 tokens each */
/* A K tile of 128 rows (or tokens) x 64 halves in shared memory as wgmma's K-major operand with
 * the 128-byte swizzle: 8-row atoms of 1024 bytes; in row r of an atom, 16-byte chunk c (8
 * halves of K) lies at chunk c ^ (r % 8), so the tensor cores' reads of 8 rows x 16 bytes fall
 * in 8 bank groups (session 22's unswizzled layout conflicted there). */
#define MMF_TILE_BYTES (128 * 128)
__device__ __forceinline__ int mmf_off(int r, int chunk) { return (r / 8) * 1024 + (r % 8) * 128 + ((chunk ^ (r % 8)) * 16); }

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
        /* after the tiles: the raw rows, the row pointers; and 1024 bytes to align the tiles'
         * swizzle atoms wherever the dynamic shared memory starts */
        REST = NRAW * MMF_BM * RSLOT + MMF_BM * (int)sizeof(void *) + 1024,
        /* activation stages: three (K tile kt + 2 in flight while kt is multiplied) where two
         * blocks an SM still fit, else two (Q6_K's staged super-block is too large) */
        XS = 2 * (5 * MMF_TILE_BYTES + REST) <= 227 * 1024 ? 3 : 2,
        /* what a block asks for: two stages of As, XS of Bs, then REST */
        SMEM = (2 + XS) * MMF_TILE_BYTES + REST,
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

/* An operand descriptor of wgmma: a K-major tile at a (1024-byte aligned atoms), 128-byte
 * swizzle, atoms of 8 rows 1024 bytes apart (SBO); LBO unused by swizzled K-major layouts. */
__device__ __forceinline__ uint64_t mmf_desc(const void *a) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(a);
    return (uint64_t)((s >> 4) & 0x3FFF) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}

/* d (64 rows x 128 columns over the warpgroup) += A (64 x 16) · B (16 x 128), both K-major in
 * shared memory. d's layout per warp w of the group: rows 16w + g and 16w + g + 8 (g = lane / 4),
 * for each 8 columns j: d[4j], d[4j + 1] at columns 8j + 2(lane % 4) + 0, 1 of the first row,
 * d[4j + 2], d[4j + 3] of the second (mma.sync's c fragment, per 8 columns). */
__device__ __forceinline__ void wgmma_64x128x16(float (&d)[64], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, 1, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db));
}

/* Block (tokens bx, rows by), K tiles in a pipeline, one barrier each: after the barrier (K
 * tile kt decoded and its activations landed, every warpgroup's wgmmas of kt - 1 done), each
 * warpgroup issues K tile kt's four wgmmas (async), the activations of kt + 2 (XS 3; kt + 1 with
 * two stages) and the raw bytes of the tile after next go in flight, the block decodes kt + 1
 * into the other weight stage while the tensor cores work, and only then waits for its wgmmas.
 * A K-quant's super-block lands only once the last K tile of the one before is decoded: those
 * iterations (one in four) wait for it before decoding. Each output takes its K tiles in order
 * with the same k16 steps whatever the tokens: its bits depend on its row and token alone. */
template <int T>
__global__ void __launch_bounds__(MMF_THREADS, 2) mmf_kernel(const mv_params P, const xact x, int n_tok) {
    typedef qt<T> Q;
    typedef mmf_shape<T> S;
    constexpr int RU = S::RU, KPR = RU / MMF_KT, NRAW = S::NRAW, XS = S::XS; /* KPR: K tiles per raw tile */
    /* the 32-element formats wait for their raw tiles in the middle of an iteration (below) */
    static_assert(NRAW == 1 || XS == 3, "raw tiles two ahead need activations two ahead");
    extern __shared__ __align__(16) uint8_t dsm_raw[];
    /* the swizzle atoms need 1024-byte alignment; SMEM has 1024 bytes to spare for it */
    uint8_t *dsm = dsm_raw + ((1024 - ((uint32_t)__cvta_generic_to_shared(dsm_raw) & 1023)) & 1023);
    uint8_t *As = dsm, *Bs = dsm + 2 * MMF_TILE_BYTES;
    uint8_t(*raw)[MMF_BM][S::RSLOT] = reinterpret_cast<uint8_t(*)[MMF_BM][S::RSLOT]>(dsm + (2 + XS) * MMF_TILE_BYTES);
    const uint8_t **rowp = (const uint8_t **)(dsm + (2 + XS) * MMF_TILE_BYTES + NRAW * MMF_BM * S::RSLOT);
    cuda_pdl_trigger();
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, wg = warp / 4;
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
            cp_async16(Bs + (kt % XS) * MMF_TILE_BYTES + mmf_off(r, q), X + (size_t)t * x.stride + (size_t)kt * 32 * MMF_KT + 8 * q);
        }
    };
    /* K tile kt into stage kt % 2 of As, (row, unit) = (tid / 2, tid % 2) */
    auto decode = [&](int kt) {
        const int i = tid / 2, uu = tid % 2, u = kt * MMF_KT + uu;
        uint8_t *at = As + (kt & 1) * MMF_TILE_BYTES;
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
                *(uint4 *)(at + mmf_off(i, 4 * uu + 2 * h)) = make_uint4(v[0], v[1], v[2], v[3]);
                *(uint4 *)(at + mmf_off(i, 4 * uu + 2 * h + 1)) = make_uint4(v[4], v[5], v[6], v[7]);
            }
        } else { /* a unit past the row's end adds nothing */
#pragma unroll
            for (int k = 0; k < 4; k++) *(uint4 *)(at + mmf_off(i, 4 * uu + k)) = make_uint4(0, 0, 0, 0);
        }
    };
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = 0.0f;

    issue_raw(0); /* weights never change: fetch before the wait */
    if (NRAW == 2 && n_rt > 1) issue_raw(1);
    cp_async_commit();
    cuda_pdl_wait();
    issue_x(0);
    if (XS == 3 && n_kt > 1) issue_x(1);
    cp_async_commit();
    cp_async_wait0();
    __syncthreads();
    decode(0);
    for (int kt = 0; kt < n_kt; kt++) {
        /* kt + 1 starts a super-block whose bytes could not come earlier (one raw buffer) */
        const bool late = NRAW == 1 && kt + 1 < n_kt && (kt + 1) % KPR == 0;
        /* the activations of kt (with three stages: the group before last; the last one, of
         * kt + 1, stays in flight) */
        if (XS == 3) cp_async_wait1();
        else cp_async_wait0();
        /* this thread's decode and landed copies seen by wgmma's reads (the async proxy) */
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads(); /* stage kt ready; As and Bs of kt - 1 and the raw buffer of the tile
                          * after next are free (every warpgroup waited for its wgmmas of kt - 1) */
        __syncwarp();    /* the .aligned wgmma instructions need the warp converged */
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
        {
            const uint8_t *at = As + (kt & 1) * MMF_TILE_BYTES + wg * 8 * 1024, *bt = Bs + (kt % XS) * MMF_TILE_BYTES;
            const uint64_t da = mmf_desc(at), db = mmf_desc(bt);
#pragma unroll
            for (int s16 = 0; s16 < 2 * MMF_KT; s16++) /* k16 step: 32 bytes along K in the swizzled rows */
                wgmma_64x128x16(acc, da + 2 * s16, db + 2 * s16);
        }
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        if (kt + XS - 1 < n_kt) issue_x(kt + XS - 1);
        if (NRAW == 2 && kt + 2 < n_rt) issue_raw(kt + 2);
        if (late) issue_raw((kt + 1) / KPR);
        cp_async_commit();
        if (late) { /* the super-block of kt + 1, two threads a row */
            cp_async_wait0();
            __syncthreads();
        } else if (NRAW == 2) { /* raw tile kt + 1 (the group before this one), staged by the
                                 * two threads of each row that decode it: a warp's barrier */
            cp_async_wait1();
            __syncwarp();
        }
        if (kt + 1 < n_kt) decode(kt + 1);
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    }
    cp_async_wait0();
    /* rows 16·(warp % 4) + g (+ 8) of the warpgroup's 64; tokens in four groups of 32 */
    const int g = lane / 4, q = lane % 4;
#pragma unroll
    for (int c = 0; c < 4; c++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            tile_store_row(P, row_base + wg * 64 + (warp % 4) * 16 + g + 8 * h, total,
                           *reinterpret_cast<const float(*)[4][4]>(acc + 16 * c), h, tok_base + 32 * c + 2 * q, n_tok);
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
