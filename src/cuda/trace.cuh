/* trace.cuh — a per-block timeline of every kernel, for builds made with `make cuda-trace`
 * (COTI_CUDA_TRACE); in other builds the hooks are empty and compile to nothing.
 *
 * Thread 0 of every block notes when the block started (cuda_pdl_trigger), when its wait for
 * the previous kernel returned (cuda_pdl_wait) and, in the matvec, when its prologue ended and
 * when its last warp finished. The records go to a per-SM region whose slot is taken when the
 * block starts, before the wait, so the trace adds little to the chain it measures (a slot
 * drawn after the wait from one counter for the whole device added ~1.5 µs per kernel).
 * COTI_TRACE=file at run time: trace.cu writes the records there when the backend is
 * destroyed; scripts/cuda_timeline.py reads them. Nsight Systems is not on the device
 * machine, and Nsight Compute times kernels one at a time, outside the chain. */
#ifndef COTI_CUDA_TRACE_CUH
#define COTI_CUDA_TRACE_CUH

#ifdef COTI_CUDA_TRACE
#define CUDA_TRACE_SMS 256
#define CUDA_TRACE_CAP 16384 /* records per SM */
#define CUDA_TRACE_WORDS 8   /* t_start, t_release, t_mid, t_end, grid<<32 | block, smid<<32 | smem, block id, 0 */

/* Each translation unit has its own copy of the device symbol (no relocatable device code);
 * trace.cu sets every copy through the setter CUDA_TRACE_TU defines. */
static __device__ unsigned long long *cuda_trace_buf;

__device__ __forceinline__ unsigned long long cuda_trace_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ unsigned long long *&cuda_trace_rec() {
    __shared__ unsigned long long *r;
    return r;
}
__device__ __forceinline__ void cuda_trace_start() {
    if (threadIdx.x || threadIdx.y) return;
    unsigned long long *r = NULL;
    if (cuda_trace_buf) {
        const unsigned long long t0 = cuda_trace_now();
        unsigned smid, smem;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(smem));
        smid %= CUDA_TRACE_SMS;
        const unsigned long long slot = atomicAdd(cuda_trace_buf + smid, 1ull);
        if (slot < CUDA_TRACE_CAP) {
            r = cuda_trace_buf + CUDA_TRACE_SMS + ((size_t)smid * CUDA_TRACE_CAP + slot) * CUDA_TRACE_WORDS;
            r[0] = t0;
            r[4] = ((unsigned long long)(gridDim.x * gridDim.y * gridDim.z) << 32) | (blockDim.x * blockDim.y);
            r[5] = ((unsigned long long)smid << 32) | smem;
            r[6] = blockIdx.x + (unsigned long long)blockIdx.y * gridDim.x;
        }
    }
    cuda_trace_rec() = r;
}
/* after the wait; the barrier publishes the record's address to the block's other warps */
__device__ __forceinline__ void cuda_trace_release() {
    if (threadIdx.x == 0 && threadIdx.y == 0 && cuda_trace_rec()) cuda_trace_rec()[1] = cuda_trace_now();
    __syncthreads();
}
__device__ __forceinline__ void cuda_trace_mid() {
    if (threadIdx.x == 0 && cuda_trace_rec()) cuda_trace_rec()[2] = cuda_trace_now();
}
__device__ __forceinline__ void cuda_trace_end() {
    if (threadIdx.x % 32 == 0 && cuda_trace_rec()) atomicMax(cuda_trace_rec() + 3, cuda_trace_now());
}
#define CUDA_TRACE_TU(name) \
    void cuda_trace_set_##name(unsigned long long *p) { cudaMemcpyToSymbol(cuda_trace_buf, &p, sizeof p); }
void cuda_trace_set_backend(unsigned long long *p);
void cuda_trace_set_matmul_input(unsigned long long *p);
void cuda_trace_set_matvec(unsigned long long *p);
void cuda_trace_set_matmul_tiles(unsigned long long *p);
void cuda_trace_set_get_rows(unsigned long long *p);
void cuda_trace_set_attention(unsigned long long *p);
void cuda_trace_set_deltanet(unsigned long long *p);
void cuda_trace_set_ops(unsigned long long *p);
void cuda_trace_set_moe(unsigned long long *p);
/* trace.cu: allocate the records where COTI_TRACE names a file; write them out */
void cuda_trace_open(void);
void cuda_trace_close(void);
#else
__device__ __forceinline__ void cuda_trace_start() {}
__device__ __forceinline__ void cuda_trace_release() {}
__device__ __forceinline__ void cuda_trace_mid() {}
__device__ __forceinline__ void cuda_trace_end() {}
#define CUDA_TRACE_TU(name)
#endif

#endif
