/* get_rows.cu — the get_rows op (embedding lookup): weight rows dequantized exactly, in the
 * reference's float order, for every weight type the matmul computes. */
#include "matmul.cuh"
#include "dequant.cuh"

template <int T>
__global__ void get_rows_kernel(const uint8_t *__restrict__ w, size_t rb, const int32_t *__restrict__ ids, int n,
                                float *__restrict__ out) {
    cuda_pdl_begin();
    const int t = blockIdx.y;
    const uint8_t *row = w + (size_t)ids[t] * rb;
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < n; e += gridDim.x * blockDim.x)
        out[(size_t)t * n + e] = deq<T>(row, e);
}

typedef void (*rows_launch_fn)(struct cuda_ctx *c, const struct bweight *w, const int32_t *ids, int n, float *out);

template <int T>
static void rows_launch(struct cuda_ctx *c, const struct bweight *w, const int32_t *ids, int n, float *out) {
    const dim3 grid(cuda_cdiv(w->n_in, 256), n);
    cuda_launch(c, grid, 256, get_rows_kernel<T>, (const uint8_t *)w->data, w->row_bytes, ids, (int)w->n_in, out);
}

#define ROWS_TYPE(T) rows_launch<T>,
static const rows_launch_fn rows_types[] = {CUDA_MM_TYPES(ROWS_TYPE)};

void cuda_get_rows(struct backend *be, const struct bweight *w, const int32_t *ids, int n, float *out) {
    struct cuda_ctx *c = cuda_enter(be);
    if (n < 1) return;
    const int slot = cuda_mm_slot(w->type);
    if (slot < 0) { /* weight_init refused it: a caller bug */
        fprintf(stderr, "cuda: get_rows on a weight of unsupported type %d\n", (int)w->type);
        abort();
    }
    rows_types[slot](c, w, ids, n, out);
}

CUDA_TRACE_TU(get_rows)
