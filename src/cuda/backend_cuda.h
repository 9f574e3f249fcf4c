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

#ifdef __cplusplus
}
#endif

#endif
