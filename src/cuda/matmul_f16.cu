/* matmul_f16.cu — the long-prompt matmul on f16 tensor cores: the weight rows dequantized to
 * f16 (a chunk of rows at a time, into scratch), the activations converted to f16, and a tiled
 * f16 x f16 -> f32 product (mma.sync m16n8k16). Not bit-identical to the CPU reference or to the
 * matvec (two roundings to f16 per product term): it serves prompts of MMF_MIN_TOK tokens or
 * more only (set_prompt), where a batch may depend on its batch; decode and verify rows keep
 * the exact kernels. An output sums its K tiles in order, so it does not depend on the number
 * of tokens or on where a token sits in the tile. */
#include "matmul.cuh"
#include "dequant.cuh"

#define MMF_BM 128            /* weight rows per block */
#define MMF_BN 128            /* tokens per block */
#define MMF_BK 32             /* K per stage */
#define MMF_LD (MMF_BK + 8)   /* halves per shared row: 80 bytes, ldmatrix without bank conflicts */
#define MMF_STAGES 3
#define MMF_THREADS 256       /* 8 warps: 2 down the rows x 4 across the tokens, 64 x 32 each */
#define MMF_SMEM (MMF_STAGES * (MMF_BM + MMF_BN) * MMF_LD * 2)
/* f16 weight scratch per chunk of rows: at most this many bytes (and at least one block's rows) */
#define MMF_CHUNK_BYTES (64u << 20)

/* Rows [r0, r0 + n_rows) of P's weights as f16, row-major n wide (n a multiple of 8): 8
 * elements a thread, the exact dequantization rounded once. */
template <int T>
__global__ void mmf_dequant_kernel(const mv_params P, int r0, int n_rows, __half *__restrict__ out) {
    cuda_pdl_begin();
    const int per_row = P.n / 8;
    const int64_t total = (int64_t)n_rows * per_row;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int r = (int)(i / per_row), e0 = (int)(i % per_row) * 8, row = r0 + r;
        int k = 0;
        while (k + 1 < P.n_w && row >= P.row0[k + 1]) k++;
        const uint8_t *w = P.w[k] + (size_t)(row - P.row0[k]) * P.rb[k];
        __align__(16) __half h[8];
#pragma unroll
        for (int j = 0; j < 8; j++) h[j] = __float2half_rn(deq<T>(w, e0 + j));
        *(uint4 *)(out + (size_t)r * P.n + e0) = *(const uint4 *)h;
    }
}

__device__ __forceinline__ void ldsm_x4(const __half *p, uint32_t (&r)[4]) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

__device__ __forceinline__ void mma_f16_16816(const uint32_t (&a)[4], uint32_t b0, uint32_t b1, float (&c)[4]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Y[t][row] for rows [r0, r0 + M) of P (their f16 copy W, M x K) and tokens [0, N) of X (f16,
 * rows `ldx` halves apart, read below K only). Block (rows by.x, tokens by.y): 3-stage
 * cp.async pipeline of 128 x 32 and 128 x 32 half tiles; a warp's 64 x 32 outputs in f32. */
__global__ void __launch_bounds__(MMF_THREADS, 1)
mmf_kernel(const __half *__restrict__ W, const __half *__restrict__ X, int ldx, int M, int N, int K, const mv_params P,
           int r0) {
    extern __shared__ __align__(16) uint8_t dsm[];
    __half(*As)[MMF_BM][MMF_LD] = reinterpret_cast<__half(*)[MMF_BM][MMF_LD]>(dsm);
    __half(*Bs)[MMF_BN][MMF_LD] = reinterpret_cast<__half(*)[MMF_BN][MMF_LD]>(dsm + MMF_STAGES * MMF_BM * MMF_LD * 2);
    cuda_pdl_begin();
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int wm = warp / 4, wn = warp % 4;
    const int m_base = blockIdx.x * MMF_BM, n_base = blockIdx.y * MMF_BN;
    const int n_kt = K / MMF_BK;
    /* a stage: 128 rows x 64 bytes of each operand, 2 16-byte copies a thread per operand; rows
     * past the end repeat the last one (their results are dropped) */
    auto load = [&](int kt, int st) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int c = tid + i * MMF_THREADS, r = c / 4, q = c % 4;
            const int m = min(m_base + r, M - 1), t = min(n_base + r, N - 1);
            cp_async16(&As[st][r][8 * q], W + (size_t)m * K + (size_t)kt * MMF_BK + 8 * q);
            cp_async16(&Bs[st][r][8 * q], X + (size_t)t * ldx + (size_t)kt * MMF_BK + 8 * q);
        }
    };
    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;
#pragma unroll
    for (int s = 0; s < MMF_STAGES - 1; s++) {
        if (s < n_kt) load(s, s);
        cp_async_commit();
    }
    for (int kt = 0; kt < n_kt; kt++) {
        asm volatile("cp.async.wait_group %0;" ::"n"(MMF_STAGES - 2) : "memory");
        __syncthreads(); /* stage kt landed for every thread; stage kt - 1 is no longer read */
        const int st = kt % MMF_STAGES;
#pragma unroll
        for (int k16 = 0; k16 < MMF_BK; k16 += 16) {
            uint32_t a[4][4], b[2][4];
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
                ldsm_x4(&As[st][wm * 64 + mi * 16 + lane % 16][k16 + (lane / 16) * 8], a[mi]);
#pragma unroll
            for (int nj = 0; nj < 2; nj++)
                ldsm_x4(&Bs[st][wn * 32 + nj * 16 + lane % 8 + (lane / 16) * 8][k16 + ((lane / 8) % 2) * 8], b[nj]);
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++)
                    mma_f16_16816(a[mi], b[ni / 2][2 * (ni % 2)], b[ni / 2][2 * (ni % 2) + 1], acc[mi][ni]);
        }
        const int next = kt + MMF_STAGES - 1;
        if (next < n_kt) load(next, next % MMF_STAGES);
        cp_async_commit();
    }
    cp_async_wait0();
    /* c0 c1: row g, tokens 2q, 2q + 1; c2 c3: row g + 8 */
    const int g = lane / 4, q = lane % 4;
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int m = m_base + wm * 64 + mi * 16 + g + 8 * h;
            if (m >= M) continue;
            const int row = r0 + m;
            int k = 0;
            while (k + 1 < P.n_w && row >= P.row0[k + 1]) k++;
            float *y = P.y[k] + (row - P.row0[k]);
#pragma unroll
            for (int ni = 0; ni < 4; ni++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int t = n_base + wn * 32 + ni * 8 + 2 * q + e;
                    if (t < N) y[(size_t)t * P.n_out[k]] = acc[mi][ni][2 * h + e];
                }
        }
}

template <int T>
static void mmf_launch(struct cuda_ctx *c, const mv_params &P, const xact &x, int n_tok) {
    const int rows = P.row0[P.n_w], K = P.n;
    int chunk = (int)COTI_MIN((int64_t)rows, (int64_t)(MMF_CHUNK_BYTES / ((size_t)K * 2)));
    chunk = COTI_MAX(MMF_BM, chunk / MMF_BM * MMF_BM);
    __half *wf = (__half *)cuda_scratch(c, &c->wf16, &c->wf16_size, (size_t)COTI_MIN(chunk, rows) * K * 2);
    static_assert(MMF_SMEM > 48 * 1024, "mmf_kernel's shared memory needs the opt-in");
    CUDA_CHECK(cudaFuncSetAttribute(mmf_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, MMF_SMEM));
    for (int r0 = 0; r0 < rows; r0 += chunk) {
        const int n_rows = COTI_MIN(chunk, rows - r0);
        const int64_t items = (int64_t)n_rows * (K / 8);
        const int grid = (int)COTI_MIN((items + 255) / 256, (int64_t)c->n_sm * 16);
        cuda_launch(c, grid, 256, mmf_dequant_kernel<T>, P, r0, n_rows, wf);
        cuda_launch_smem(c, dim3(cuda_cdiv(n_rows, MMF_BM), cuda_cdiv(n_tok, MMF_BN)), dim3(MMF_THREADS),
                         (size_t)MMF_SMEM, mmf_kernel, (const __half *)wf, (const __half *)x.q, x.stride, n_rows, n_tok,
                         K, P, r0);
    }
}

typedef void (*mmf_launch_fn)(struct cuda_ctx *c, const mv_params &P, const xact &x, int n_tok);
#define MMF_TYPE(T) mmf_launch<T>,
static const mmf_launch_fn mmf_types[] = {CUDA_MM_TYPES(MMF_TYPE)};

void mmf_run(struct cuda_ctx *c, int slot, const mv_params &P, const xact &x, int n_tok) {
    mmf_types[slot](c, P, x, n_tok);
}

CUDA_TRACE_TU(matmul_f16)
