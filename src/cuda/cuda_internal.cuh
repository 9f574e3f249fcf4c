/* cuda_internal.cuh — what the CUDA backend's translation units share: the per-backend context,
 * the error macro, scratch growth, small device helpers, and the host entry points each op
 * family (matmul_choose.cu and the files of matmul.cuh, attention.cu, deltanet.cu, ops.cu)
 * gives backend_cuda.cu's table.
 * Not for other modules: they see backend_cuda.h only. */
#ifndef COTI_CUDA_INTERNAL_CUH
#define COTI_CUDA_INTERNAL_CUH

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

extern "C" {
#include "backend.h"
}
#include "backend_cuda.h"
#include "trace.cuh"

/* backend.h prompt families: a prompt's rows take the decode kernels (NONE: prompts of at most
 * 8 tokens), or the int8 tiles (TILES), or the f16 tiles (F16) for its quantized matmuls, with
 * attention's prompt tiles and the prompt delta-net beside either (cuda_prompt_family picks by
 * the prompt's length). Every kernel of a family gives a row what it gives in any batch. */
enum { CUDA_PROMPT_NONE, CUDA_PROMPT_TILES, CUDA_PROMPT_F16 };

/* Everything a backend object owns. No file-scope state anywhere in src/cuda: two backends
 * (a target and a drafter, or two devices) never share a stream or a scratch buffer. */
struct cuda_ctx {
    int device;
    int n_sm;
    bool mmf_ok;               /* the f16 prompt matmul runs here (sm_90a code: compute capability 9.0) */
    cudaStream_t stream;
    /* pinned staging for small uploads: two halves, each fenced by an event */
    uint8_t *stage;
    size_t stage_pos;
    int stage_half;
    cudaEvent_t stage_ev[2];
    bool stage_ev_live[2];
    cudaEvent_t marks[BACKEND_N_MARKS]; /* timing events of mark() */
    /* scratch, grown on first use (warm-up), never per call once sized */
    void *xq;          size_t xq_size;      /* converted matmul activations */
    /* the side queue (backend.h side_begin): its stream, the events that fork it from and join
     * it to the main one, and its own activation scratch (swapped with xq while it is
     * current: the two queues' matmuls run at once) */
    cudaStream_t main_stream, side;
    cudaEvent_t side_fork, side_done;
    bool in_side, side_pending;
    void *xq_side;     size_t xq_side_size;
    void *attn_part;   size_t attn_part_size;
    void *attn_count;  size_t attn_count_size;
    void *amax_part;   size_t amax_part_size;
    /* graph capture: a scratch buffer replaced while graphs exist makes them stale (they hold
     * its old address); growth is impossible while capturing (it waits for the stream) */
    unsigned scratch_gen;
    bool capturing, capture_broken;
    /* device limits for sizing persistent grids */
    int smem_per_sm, smem_block_max, smem_reserved;
    /* registers of each matvec kernel (type slot, NT - 1, one row per warp or NT's wider choice,
     * variant), read on first launch */
    int mv_regs[16][8][2][4];     /* [type][NT - 1][R > 1][FUSED: matvec.cu's MV_VARIANTS] */
    int mv_smem_static[16][8][2][4];
    bool mmq_ready[2][16];     /* prefill kernels' shared-memory limit raised (tile widths 64, 128) */
    bool mmf_ready[16];        /* the same for the f16 prompt matmul (matmul_f16.cu) */
    bool fa_ready[3];          /* and for the prompt attention's tiles (heads of 128, 256) */
    long attn_tile_launches;   /* launches of the prompt attention's tiles, for the tests */
    int mv_force;                         /* enum cuda_matvec: a test's choice, or CUDA_MV_AUTO */
    int prompt;                           /* backend.h set_prompt: a CUDA_PROMPT_* family */
    long mv_launches[CUDA_MV_COUNT];      /* matmul launches by variant, for the tests */
};

static inline struct cuda_ctx *cuda_ctx_of(struct backend *be) { return (struct cuda_ctx *)be->ctx; }

/* A CUDA failure after init is a broken device or a resource failure at warm-up: say where
 * and stop (the CPU backend aborts on the same class of failure). */
#define CUDA_CHECK(call)                                                                       \
    do {                                                                                       \
        cudaError_t err_ = (call);                                                             \
        if (err_ != cudaSuccess) {                                                             \
            fprintf(stderr, "cuda: %s:%d: %s: %s\n", __FILE__, __LINE__, #call,                \
                    cudaGetErrorString(err_));                                                 \
            abort();                                                                           \
        }                                                                                      \
    } while (0)

/* Make this backend's device current (cheap when it already is). */
static inline struct cuda_ctx *cuda_enter(struct backend *be) {
    struct cuda_ctx *c = cuda_ctx_of(be);
    int cur = -1;
    CUDA_CHECK(cudaGetDevice(&cur));
    if (cur != c->device) CUDA_CHECK(cudaSetDevice(c->device));
    return c;
}

/* Ensure *p holds at least `need` bytes of device memory. Growing waits for the stream (the
 * old buffer may still be read by queued kernels), so it happens only while warming up. */
static inline void *cuda_scratch(struct cuda_ctx *c, void **p, size_t *size, size_t need) {
    if (need <= *size) return *p;
    if (c->capturing) { /* the recorded ops never run: capture_end discards them */
        c->capture_broken = true;
        return *p;
    }
    c->scratch_gen++;
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    if (*p) CUDA_CHECK(cudaFree(*p));
    *p = NULL;
    *size = 0;
    size_t n = (need + need / 4 + 4095) & ~(size_t)4095;
    CUDA_CHECK(cudaMalloc(p, n));
    *size = n;
    return *p;
}

static inline int cuda_cdiv(int64_t a, int64_t b) { return (int)((a + b - 1) / b); }

/* Every kernel is launched with programmatic dependent launch (Hopper): it may be scheduled
 * while the kernel before it in the stream is still running, and must call cuda_pdl_wait()
 * before it touches memory that earlier work writes or reads (every kernel here waits before
 * its first global access; matvec first prefetches weight bytes, which nothing writes). Each
 * kernel lets the next one launch as soon as all its blocks have started (cuda_pdl_trigger);
 * the next one's wait still covers this kernel's completion and memory. Launch gaps then
 * overlap the previous kernel's tail, which matters when decode is launch-bound.
 * The "memory" clobber orders the compiler's loads, not ptxas's: a `const T *__restrict__`
 * parameter becomes non-coherent loads (LDG.E.CONSTANT), which ptxas may move above the wait.
 * New kernels: __restrict__ only on what no kernel writes (weights, norms). Older ones still
 * mark activations so; scripts/pdl-check.py (run by gpu-check.sh) reads a build's SASS and fails
 * on any kernel with a global load before its wait. */
__device__ __forceinline__ void cuda_pdl_trigger() {
    cuda_trace_start();
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
__device__ __forceinline__ void cuda_pdl_wait() {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    cuda_trace_release();
}
__device__ __forceinline__ void cuda_pdl_begin() { cuda_pdl_trigger(); cuda_pdl_wait(); }

template <typename... KArgs, typename... Args>
static inline void cuda_launch_smem(struct cuda_ctx *c, dim3 grid, dim3 block, size_t smem, void (*kernel)(KArgs...),
                                    Args... args) {
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg;
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->stream;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
}

template <typename... KArgs, typename... Args>
static inline void cuda_launch(struct cuda_ctx *c, dim3 grid, dim3 block, void (*kernel)(KArgs...), Args... args) {
    cuda_launch_smem(c, grid, block, 0, kernel, args...);
}

/* ---- device helpers ---- */

__device__ __forceinline__ float cuda_silu(float v) { return v / (1.0f + expf(-v)); }
/* One element of the delta-net's gated norm: x · (1/rms of its group) · w, times silu of the gate. */
__device__ __forceinline__ float cuda_gnorm(float x, float sc, float w, float z) {
    return __fmul_rn(__fmul_rn(__fmul_rn(x, sc), w), cuda_silu(z));
}
__device__ __forceinline__ float cuda_sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }
/* gelu by its tanh form, in llama.cpp's constants and order (the CPU's gelu_tanh) */
__device__ __forceinline__ float cuda_gelu_tanh(float x) {
    const float sqrt_2_over_pi = 0.79788456080286535587989211986876f, coef_a = 0.044715f;
    return 0.5f * x * (1.0f + tanhf(sqrt_2_over_pi * x * (1.0f + coef_a * x * x)));
}
/* One GeGLU element as llama.cpp's CPU forms it (the CPU's cpu_geglu): gelu of the f16-rounded
 * gate, rounded to f16, times up. */
__device__ __forceinline__ float cuda_geglu(float g, float u) {
    const float gelu = g <= -10.0f ? 0.0f
                       : g >= 10.0f ? g
                                    : __half2float(__float2half_rn(cuda_gelu_tanh(__half2float(__float2half_rn(g)))));
    return __fmul_rn(gelu, u);
}
__device__ __forceinline__ float cuda_h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ uint16_t cuda_f2h(float f) { return __half_as_ushort(__float2half_rn(f)); }
__device__ __forceinline__ float cuda_bf2f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
/* f32 -> bf16 bits, RNE with quiet NaN: quant.c's f32_to_bf16 */
__device__ __forceinline__ uint16_t cuda_f2bf(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* Asynchronous copies global -> shared (16 bytes: both 16-aligned; 4: both 4-aligned), in
 * groups: commit closes a group, wait1 returns when all but the newest group have landed, wait0
 * when all have. */
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async4(void *smem, const void *gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait1() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait0() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

__device__ __forceinline__ float cuda_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    return v;
}
__device__ __forceinline__ double cuda_warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    return v;
}
__device__ __forceinline__ float cuda_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
    return v;
}
__device__ __forceinline__ int cuda_warp_sum_i(int v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    return v;
}

/* 1 / rms from a row's Σx² (in double): the f32 scale every norm kernel forms. */
__device__ __forceinline__ float cuda_rms_inv(double sumsq, int dim, float eps) {
    return 1.0f / sqrtf((float)(sumsq / dim) + eps);
}

/* Σ v² over a row of dim values in the one order every residual-stream norm uses, so a norm
 * fused into a matvec and the standalone norm kernel give the same bits (a verify batch must
 * reproduce decode): thread j of CUDA_NORM_THREADS sums the 8-element groups j,
 * j + CUDA_NORM_THREADS, ... (each group in order, in double), then a fixed shuffle tree adds
 * the partials; every warp forms the total the same way. grp(g, v) fills group g's values (0
 * past dim). All threads of the block (exactly CUDA_NORM_THREADS) call it; red:
 * CUDA_NORM_THREADS / 32 doubles of shared memory. */
#define CUDA_NORM_THREADS 512
template <typename G> __device__ __forceinline__ double cuda_row_sumsq(G grp, int dim, double *red) {
    double p = 0.0;
    for (int g = threadIdx.x; 8 * g < dim; g += CUDA_NORM_THREADS) {
        float v[8];
        grp(g, v);
        double s = 0.0;
#pragma unroll
        for (int i = 0; i < 8; i++) s += (double)v[i] * v[i];
        p += s;
    }
    p = cuda_warp_sum_d(p);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = p;
    __syncthreads();
    double t = threadIdx.x % 32 < CUDA_NORM_THREADS / 32 ? red[threadIdx.x % 32] : 0.0;
    t = cuda_warp_sum_d(t);
    __syncthreads(); /* red may be reused */
    return t;
}

/* 1/rms of a row of dim elements by one warp, as rmsnorm_kernel<32, ...> forms it: lane l sums
 * x[i]² for i = l, l + 32, ... in double, a warp butterfly, then 1 / sqrt(mean + eps) in f32
 * (so a matvec that forms the gated norm itself quantizes the standalone kernel's bits). */
__device__ __forceinline__ float cuda_warp_rms_inv(const float *xr, int dim, float eps, int lane) {
    double sum = 0.0;
    int i = lane;
    /* four loads in flight, summed in the loop's order: a 128-wide group is one round trip, not
     * four (the fused gated norm's prologue before the 35B-A3B's ssm_out: 8.4 us, session 17) */
    for (; i + 96 < dim; i += 128) {
        const float a = xr[i], b = xr[i + 32], c = xr[i + 64], d = xr[i + 96];
        sum += (double)a * a;
        sum += (double)b * b;
        sum += (double)c * c;
        sum += (double)d * d;
    }
    for (; i < dim; i += 32) sum += (double)xr[i] * xr[i];
    return cuda_rms_inv(cuda_warp_sum_d(sum), dim, eps);
}

/* Group g (8 values, 0 past dim) of x (+ m) for cuda_row_sumsq; vec: x and m 16-byte aligned. */
__device__ __forceinline__ void cuda_group8(const float *x, const float *m, int dim, bool vec, int g, float (&v)[8]) {
    const int e0 = 8 * g;
    if (vec && e0 + 8 <= dim) {
        const float4 a = ((const float4 *)(x + e0))[0], b = ((const float4 *)(x + e0))[1];
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
        if (m) {
            const float4 c = ((const float4 *)(m + e0))[0], d = ((const float4 *)(m + e0))[1];
            v[0] = v[0] + c.x; v[1] = v[1] + c.y; v[2] = v[2] + c.z; v[3] = v[3] + c.w;
            v[4] = v[4] + d.x; v[5] = v[5] + d.y; v[6] = v[6] + d.z; v[7] = v[7] + d.w;
        }
        return;
    }
#pragma unroll
    for (int i = 0; i < 8; i++) v[i] = e0 + i < dim ? (m ? x[e0 + i] + m[e0 + i] : x[e0 + i]) : 0.0f;
}

/* ---- host entry points of the op families ---- */

/* the struct backend ops, cuda_<op> (matmul_choose.cu, get_rows.cu, ops.cu, attention.cu,
 * deltanet.cu) */
#define BACKEND_OP(name, family, params, args) void cuda_##name params;
#include "backend_ops.h"
#undef BACKEND_OP

/* matmul_choose.cu: the weight types matmul and get_rows compute */
bool cuda_weight_type_supported(enum ggml_type t);

/* ops.cu: y = rmsnorm(x (+ m)) ⊙ w over n_rows rows of dim (contiguous), by cuda_row_sumsq;
 * with m, x_out = x + m (x_out may be x). The unfused form of a NORM matvec input. */
void cuda_norm_rows(struct cuda_ctx *c, const float *x, const float *m, float *x_out, const float *w, int n_rows,
                    int dim, float eps, float *y);

/* attention_tiles.cu: a prompt's attention on f16 tensor cores, where it fits (f16 caches,
 * heads of 64 / 128 / 256); attention.cu's prompt branch asks first */
bool cuda_attention_tiles_fit(const struct kv_view *kv, int n_head, const float *q, int q_stride, int q_head_stride);
void cuda_attention_tiles(struct cuda_ctx *c, const float *q, int q_stride, int q_head_stride, const struct kv_view *kv,
                          const int32_t *cell0, const int32_t *n_ctx, int n_tok, int n_head, float scale, float *out);

#endif
