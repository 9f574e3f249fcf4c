/* moe.cu — the mixture-of-experts ops: routing (moe_route), the routed experts' matmul
 * (matmul_id) and the weighted sum with the gated shared expert (moe_sum). The chosen ids
 * stay on the device: matmul_id's blocks find their expert's slots themselves. */
#include "matmul.cuh"
#include "dequant.cuh"

/* ---- moe_route: one thread per token (at most BACKEND_MOE_MAX_EXPERTS experts) ---------------- */

__global__ void moe_route_kernel(const float *__restrict__ logits, int n_tok, int n_expert, int n_used,
                                 int32_t *__restrict__ ids, float *__restrict__ wts) {
    cuda_pdl_begin();
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_tok) return;
    float p[BACKEND_MOE_MAX_EXPERTS];
    const float *l = logits + (size_t)t * n_expert;
    float mx = -INFINITY;
    for (int e = 0; e < n_expert; e++) mx = fmaxf(mx, l[e]);
    double sum = 0.0;
    for (int e = 0; e < n_expert; e++) sum += (p[e] = expf(l[e] - mx));
    const float inv = (float)(1.0 / sum);
    for (int e = 0; e < n_expert; e++) p[e] *= inv;
    float wsum = 0.0f;
    for (int k = 0; k < n_used; k++) {
        int best = 0;
        for (int e = 1; e < n_expert; e++)
            if (p[e] > p[best]) best = e;
        ids[(size_t)t * n_used + k] = best;
        wts[(size_t)t * n_used + k] = p[best];
        wsum += p[best];
        p[best] = -1.0f; /* taken */
    }
    wsum = fmaxf(wsum, 6.103515625e-5f);
    for (int k = 0; k < n_used; k++) wts[(size_t)t * n_used + k] /= wsum;
}

void cuda_moe_route(struct backend *be, const float *logits, int n_tok, int n_expert, int n_used, int32_t *ids,
                    float *wts) {
    struct cuda_ctx *c = cuda_enter(be);
    if (n_tok < 1 || n_expert > BACKEND_MOE_MAX_EXPERTS || n_used > n_expert) return;
    cuda_launch(c, dim3(cuda_cdiv(n_tok, 64)), dim3(64), moe_route_kernel, logits, n_tok, n_expert, n_used, ids, wts);
}

/* ---- matmul_id ------------------------------------------------------------------------------ */

#define MOE_ROWS_PER_BLOCK 32      /* one warp per row, 8 warps, 4 rows each */
#define MOE_WARPS 8
#define MOE_SLOTS_PER_PASS 8       /* slots a warp accumulates while it reads a row once */
#define MOE_MAX_SLOT_LIST 2048     /* a block's slot list in shared memory, refilled past this */

/* Block (expert e, rows [r0, r0 + 32)): the slots that chose e, then per row (a warp each) the
 * row dequantized once per pass of up to 8 slots and dotted with their inputs. A slot's sum is
 * over the row in one fixed order (lane-strided, then the warp reduction), whatever the other
 * slots: a verify row equals its decode row. Inputs are f32 (formed silu(g)·u when swiglu). */
template <int T>
__global__ void __launch_bounds__(32 * MOE_WARPS)
matmul_id_kernel(const uint8_t *__restrict__ w, size_t rb, int rows, int n_in, const int32_t *__restrict__ ids,
                 int n_slots, int n_used, const float *__restrict__ x, int tok_stride, int slot_stride, int swiglu,
                 float *__restrict__ y, int y_stride) {
    cuda_pdl_begin();
    __shared__ int list[MOE_MAX_SLOT_LIST];
    __shared__ int n_list;
    const int e = blockIdx.x, r0 = blockIdx.y * MOE_ROWS_PER_BLOCK, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int base = 0; base < n_slots; base += MOE_MAX_SLOT_LIST) {
        __syncthreads();
        if (threadIdx.x == 0) n_list = 0;
        __syncthreads();
        const int end = min(n_slots, base + MOE_MAX_SLOT_LIST);
        for (int s = base + threadIdx.x; s < end; s += blockDim.x)
            if (ids[s] == e) list[atomicAdd(&n_list, 1)] = s;
        __syncthreads();
        const int n = n_list;
        for (int r = r0 + warp; r < min(r0 + MOE_ROWS_PER_BLOCK, rows); r += MOE_WARPS) {
            const uint8_t *row = w + ((size_t)e * rows + r) * rb;
            for (int j0 = 0; j0 < n; j0 += MOE_SLOTS_PER_PASS) {
                const int nj = min(MOE_SLOTS_PER_PASS, n - j0);
                const float *xs[MOE_SLOTS_PER_PASS];
                float acc[MOE_SLOTS_PER_PASS];
                for (int j = 0; j < MOE_SLOTS_PER_PASS; j++) {
                    const int s = list[j0 + min(j, nj - 1)];
                    xs[j] = x + (size_t)(s / n_used) * tok_stride + (size_t)(s % n_used) * slot_stride;
                    acc[j] = 0.0f;
                }
                for (int i = lane; i < n_in; i += 32) {
                    const float wv = deq<T>(row, i);
#pragma unroll
                    for (int j = 0; j < MOE_SLOTS_PER_PASS; j++) {
                        if (j >= nj) break;
                        const float xv = swiglu ? cuda_silu(xs[j][i]) * xs[j][n_in + i] : xs[j][i];
                        acc[j] = fmaf(wv, xv, acc[j]);
                    }
                }
                for (int j = 0; j < nj; j++) {
                    const float v = cuda_warp_sum(acc[j]);
                    if (lane == 0) y[(size_t)list[j0 + j] * y_stride + r] = v;
                }
            }
        }
    }
}

typedef void (*matmul_id_fn)(struct cuda_ctx *c, const struct bweight *w, const struct matmul_id_in *in, int n_tok,
                             float *y);

template <int T>
static void matmul_id_launch(struct cuda_ctx *c, const struct bweight *w, const struct matmul_id_in *in, int n_tok,
                             float *y) {
    const int rows = (int)(w->n_out / in->n_expert);
    const dim3 grid(in->n_expert, cuda_cdiv(rows, MOE_ROWS_PER_BLOCK));
    cuda_launch(c, grid, dim3(32 * MOE_WARPS), matmul_id_kernel<T>, (const uint8_t *)w->data, w->row_bytes, rows,
                (int)w->n_in, in->ids, n_tok * in->n_used, in->n_used, in->x, in->tok_stride, in->slot_stride,
                (int)in->swiglu, y, in->y_stride);
}

#define MOE_TYPE(T) matmul_id_launch<T>,
static const matmul_id_fn matmul_id_types[] = {CUDA_MM_TYPES(MOE_TYPE)};

void cuda_matmul_id(struct backend *be, const struct bweight *w, const struct matmul_id_in *in, int n_tok, float *y) {
    struct cuda_ctx *c = cuda_enter(be);
    if (n_tok < 1 || in->n_expert < 1 || in->n_used < 1) return;
    const int slot = cuda_mm_slot(w->type);
    if (slot < 0) { /* weight_init refused it: a caller bug */
        fprintf(stderr, "cuda: matmul_id on a weight of unsupported type %d\n", (int)w->type);
        abort();
    }
    matmul_id_types[slot](c, w, in, n_tok, y);
}

/* ---- moe_sum: the CPU's order (slots in turn, then the gated shared expert) ----------------- */

__global__ void moe_sum_kernel(const float *__restrict__ y, const float *__restrict__ wts, int n_used, int dim,
                               const float *__restrict__ shared, const float *__restrict__ gate, float *__restrict__ out) {
    cuda_pdl_begin();
    const int t = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= dim) return;
    const float *yt = y + (size_t)t * n_used * dim, *wt = wts + (size_t)t * n_used;
    float o = __fmul_rn(yt[i], wt[0]);
    for (int k = 1; k < n_used; k++) o = __fadd_rn(o, __fmul_rn(yt[(size_t)k * dim + i], wt[k]));
    out[(size_t)t * dim + i] = __fadd_rn(o, __fmul_rn(shared[(size_t)t * dim + i], cuda_sigmoid(gate[t])));
}

void cuda_moe_sum(struct backend *be, const float *y, const float *wts, int n_tok, int n_used, int dim,
                  const float *shared, const float *gate, float *out) {
    struct cuda_ctx *c = cuda_enter(be);
    if (n_tok < 1) return;
    cuda_launch(c, dim3(cuda_cdiv(dim, 256), n_tok), dim3(256), moe_sum_kernel, y, wts, n_used, dim, shared, gate, out);
}

CUDA_TRACE_TU(moe)
