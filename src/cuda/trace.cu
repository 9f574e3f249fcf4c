/* trace.cu — the host side of trace.cuh's timeline (`make cuda-trace` builds only): one device
 * buffer of per-SM record regions, shared by every backend of the process, written to the file
 * COTI_TRACE names when the first backend is destroyed, after which nothing records (records
 * of 64 bytes, little-endian u64 words: see CUDA_TRACE_WORDS). */
#include "cuda_internal.cuh"

#ifdef COTI_CUDA_TRACE
static unsigned long long *trace_dev;
static const size_t trace_bytes =
    ((size_t)CUDA_TRACE_SMS + (size_t)CUDA_TRACE_SMS * CUDA_TRACE_CAP * CUDA_TRACE_WORDS) * sizeof(unsigned long long);

/* every translation unit's copy of the device symbol */
static void trace_point_all(unsigned long long *p) {
    cuda_trace_set_backend(p);
    cuda_trace_set_matmul_input(p);
    cuda_trace_set_matvec(p);
    cuda_trace_set_matmul_tiles(p);
    cuda_trace_set_get_rows(p);
    cuda_trace_set_attention(p);
    cuda_trace_set_deltanet(p);
    cuda_trace_set_ops(p);
    cuda_trace_set_moe(p);
}

void cuda_trace_open(void) {
    if (!getenv("COTI_TRACE") || trace_dev) return;
    CUDA_CHECK(cudaMalloc(&trace_dev, trace_bytes));
    CUDA_CHECK(cudaMemset(trace_dev, 0, trace_bytes));
    trace_point_all(trace_dev);
}

void cuda_trace_close(void) {
    if (!trace_dev) return;
    CUDA_CHECK(cudaDeviceSynchronize());
    unsigned long long *h = (unsigned long long *)malloc(trace_bytes);
    FILE *f = h ? fopen(getenv("COTI_TRACE"), "wb") : NULL;
    size_t n = 0, full = 0;
    if (f) {
        CUDA_CHECK(cudaMemcpy(h, trace_dev, trace_bytes, cudaMemcpyDeviceToHost));
        for (int sm = 0; sm < CUDA_TRACE_SMS; sm++) {
            const size_t k = h[sm] < CUDA_TRACE_CAP ? (size_t)h[sm] : CUDA_TRACE_CAP;
            full += h[sm] > CUDA_TRACE_CAP;
            fwrite(h + CUDA_TRACE_SMS + (size_t)sm * CUDA_TRACE_CAP * CUDA_TRACE_WORDS, 8 * CUDA_TRACE_WORDS, k, f);
            n += k;
        }
        fclose(f);
        fprintf(stderr, "trace: %zu block records to %s%s\n", n, getenv("COTI_TRACE"),
                full ? " (some SMs' regions filled up: the trace ends early there)" : "");
    } else {
        fprintf(stderr, "trace: cannot write %s\n", getenv("COTI_TRACE"));
    }
    free(h);
    trace_point_all(NULL); /* another backend's kernels may still run: they record nothing now */
    CUDA_CHECK(cudaFree(trace_dev));
    trace_dev = NULL;
}
#endif
