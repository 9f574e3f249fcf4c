/* backend_cuda.h — the CUDA backend (the .cu files beside this one; `make CUDA=1` builds them). */
#ifndef COTI_BACKEND_CUDA_H
#define COTI_BACKEND_CUDA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct backend;

/* A backend on CUDA device `device` with its own stream. Needs compute capability 9.0 (the
 * kernels are built for sm_90 + compute_90 PTX). Returns NULL with a message in err if there is
 * no such device or a resource cannot be had. After init, a failing CUDA call (a sticky device
 * error, out of memory while growing scratch) prints file:line and aborts. */
struct backend *backend_cuda_init(int device, char *err, size_t err_size);

/* The cudaStream_t (as void *) every op of a CUDA backend is queued on: for CUDA events in
 * benchmarks, or graph capture. NULL if be is not a CUDA backend. */
void *backend_cuda_stream(struct backend *be);

/* The matmul's kernel variants (src/cuda/matmul_choose.cu says which runs when). For tests
 * only: backend_cuda_force_matvec makes one variant run wherever it can (CUDA_MV_AUTO: the
 * rules again), so that each is checked against the reference; backend_cuda_matvec_launches
 * counts the launches of one since the backend was made. */
enum cuda_matvec {
    CUDA_MV_AUTO,
    CUDA_MV_CONVERTED,   /* the matvec over activations converted by a kernel before it */
    CUDA_MV_STAGED,      /* the same, one token copied into shared memory first */
    CUDA_MV_FUSED,       /* the matvec forms and quantizes its input rows itself (<= 2, NORM2 <= 4) */
    CUDA_MV_DIRECT,      /* one token of Q8_0, weights straight into registers (gated norm, gate) */
    CUDA_MV_TILES,       /* the int8 tensor-core tiles (quantized types; the prefill kernel) */
    CUDA_MV_F16,         /* f16 tensor cores over weight tiles decoded in shared memory (prompts) */
    CUDA_MV_COUNT
};
void backend_cuda_force_matvec(struct backend *be, int variant);
long backend_cuda_matvec_launches(struct backend *be, int variant);
/* launches of a prompt's attention tiles (attention_tiles.cu) since the backend was made */
long backend_cuda_attention_tile_launches(struct backend *be);

#ifdef __cplusplus
}
#endif

#endif
