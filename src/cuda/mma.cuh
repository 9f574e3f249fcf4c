/* mma.cuh — f16 tensor-core fragments: ldmatrix loads of 8x8 f16 tiles from shared memory and
 * the m16n8k16 f16 x f16 -> f32 mma, shared by the prompt kernels (matmul_f16.cu,
 * attention_tiles.cu). */
#ifndef COTI_CUDA_MMA_CUH
#define COTI_CUDA_MMA_CUH

#include <cuda_fp16.h>
#include <stdint.h>

/* four 8x8 tiles; lane l gives the row address of tile l / 8 */
__device__ __forceinline__ void ldsm_x4(const __half *p, uint32_t (&r)[4]) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

/* the same, each tile transposed (a row-major K x N operand read as the mma's B fragments) */
__device__ __forceinline__ void ldsm_x4_trans(const __half *p, uint32_t (&r)[4]) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

/* c += a (16 x 16, row-major) · b (16 x 8, column-major) */
__device__ __forceinline__ void mma_f16_16816(const uint32_t (&a)[4], uint32_t b0, uint32_t b1, float (&c)[4]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_h2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *(const uint32_t *)&h;
}

#endif
