/* backend_cuda.cu — the CUDA backend object: device memory, one stream per backend, the upload
 * staging, weight upload, supports(), and the op table filled from the op-family files
 * (matmul_choose.cu, get_rows.cu, attention.cu, deltanet.cu, ops.cu).
 *
 * Every op is queued on the backend's stream and returns at once; download() and sync() are the
 * only calls that wait (upload() also waits when the host buffer is larger than half the pinned
 * staging area, or when it wraps onto a half whose copies are still queued). Host buffers passed
 * to upload() may be reused as soon as it returns.
 *
 * Errors: init failures return NULL with a message; after init a failing CUDA call prints
 * file:line and aborts (a sticky device error cannot be recovered from in-process). alloc()
 * returns NULL when the device is out of memory. */
#include "cuda_internal.cuh"
#include "kv_types.cuh"
#include "backend_cuda.h"

#include <string.h>

extern "C" {
#include "common.h"
}

/* Pinned staging for upload(): two halves of this size together. */
#define CUDA_STAGE_BYTES ((size_t)4 << 20)
/* Device allocations are padded so kernels may read a 16-byte vector (or a partial unit of a
 * weight row) past the last byte without leaving the allocation. */
#define CUDA_ALLOC_PAD 256

/* ---- memory ------------------------------------------------------------------------ */

static void *cuda_alloc(struct backend *be, size_t bytes) {
    struct cuda_ctx *c = cuda_enter(be);
    void *p = NULL;
    if (bytes > SIZE_MAX - CUDA_ALLOC_PAD) return NULL;
    if (cudaMalloc(&p, bytes + CUDA_ALLOC_PAD) != cudaSuccess) {
        (void)cudaGetLastError(); /* out-of-memory is not sticky: clear it */
        return NULL;
    }
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes + CUDA_ALLOC_PAD, c->stream));
    return p;
}

/* What the device has free now (cudaMemGetInfo). */
static size_t cuda_mem_available(struct backend *be) {
    cuda_enter(be);
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    return free_b;
}

static void cuda_free(struct backend *be, void *p) {
    struct cuda_ctx *c = cuda_enter(be);
    if (!p) return;
    CUDA_CHECK(cudaStreamSynchronize(c->stream)); /* queued kernels may still read it */
    CUDA_CHECK(cudaFree(p));
}

static void cuda_upload(struct backend *be, void *dst, const void *src, size_t bytes) {
    struct cuda_ctx *c = cuda_enter(be);
    const size_t half = CUDA_STAGE_BYTES / 2;
    if (!bytes) return;
    if (bytes > half) { /* large (state resets, weights): straight from pageable memory */
        CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream));
        CUDA_CHECK(cudaStreamSynchronize(c->stream));
        return;
    }
    if (c->stage_pos + bytes > (size_t)(c->stage_half + 1) * half) {
        /* leave this half (its copies are fenced by an event), enter the other one once the
         * copies queued from it last time are done */
        CUDA_CHECK(cudaEventRecord(c->stage_ev[c->stage_half], c->stream));
        c->stage_ev_live[c->stage_half] = true;
        c->stage_half ^= 1;
        c->stage_pos = (size_t)c->stage_half * half;
        if (c->stage_ev_live[c->stage_half]) CUDA_CHECK(cudaEventSynchronize(c->stage_ev[c->stage_half]));
    }
    uint8_t *s = c->stage + c->stage_pos;
    memcpy(s, src, bytes);
    CUDA_CHECK(cudaMemcpyAsync(dst, s, bytes, cudaMemcpyHostToDevice, c->stream));
    c->stage_pos += (bytes + 63) & ~(size_t)63;
}

static void cuda_download(struct backend *be, void *dst, const void *src, size_t bytes) {
    struct cuda_ctx *c = cuda_enter(be);
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
}

static void cuda_copy(struct backend *be, void *dst, const void *src, size_t bytes) {
    struct cuda_ctx *c = cuda_enter(be);
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream));
}

/* copy_n: one launch for many regions (a memcpy per region is a node of its own on the device's
 * timeline, ~2 µs each; a rollback restores two per recurrent layer). Block (x, y) copies part
 * x of region y, in 16-byte words where the region allows. copy_n_at: the same with each source
 * offset by a count the device holds (sel; no copy when it is >= limit). */
#define COPY_N_MAX 64
#define COPY_N_BLOCKS 16
struct copy_list {
    uint8_t *dst[COPY_N_MAX];
    const uint8_t *src[COPY_N_MAX];
    size_t bytes[COPY_N_MAX];
    size_t step[COPY_N_MAX];
    const int32_t *sel;          /* NULL: plain copy_n */
    int limit;
};

__global__ void copy_n_kernel(const copy_list L) {
    cuda_pdl_begin();
    uint8_t *d = L.dst[blockIdx.y];
    const uint8_t *s = L.src[blockIdx.y];
    if (L.sel) {
        const int a = L.sel[0];
        if (a < 0 || a >= L.limit) return;
        s += (size_t)a * L.step[blockIdx.y];
    }
    const size_t n = L.bytes[blockIdx.y], tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t nthr = (size_t)gridDim.x * blockDim.x;
    if ((((uintptr_t)d | (uintptr_t)s | n) & 15) == 0) {
        for (size_t i = tid; i < n / 16; i += nthr) ((uint4 *)d)[i] = ((const uint4 *)s)[i];
    } else {
        for (size_t i = tid; i < n; i += nthr) d[i] = s[i];
    }
}

static void cuda_copy_n_at(struct backend *be, void *const *dst, const void *const *src, const size_t *step,
                           const size_t *bytes, int n, const int32_t *sel, int limit) {
    struct cuda_ctx *c = cuda_enter(be);
    for (int i0 = 0; i0 < n; i0 += COPY_N_MAX) {
        copy_list L;
        const int k = COTI_MIN(COPY_N_MAX, n - i0);
        for (int i = 0; i < k; i++) {
            L.dst[i] = (uint8_t *)dst[i0 + i];
            L.src[i] = (const uint8_t *)src[i0 + i];
            L.bytes[i] = bytes[i0 + i];
            L.step[i] = step ? step[i0 + i] : 0;
        }
        L.sel = sel;
        L.limit = limit;
        cuda_launch(c, dim3(COPY_N_BLOCKS, k), 256, copy_n_kernel, L);
    }
}

static void cuda_copy_n(struct backend *be, void *const *dst, const void *const *src, const size_t *bytes, int n) {
    cuda_copy_n_at(be, dst, src, NULL, bytes, n, NULL, 0);
}

static void cuda_sync(struct backend *be) {
    struct cuda_ctx *c = cuda_enter(be);
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
}

static void cuda_mark(struct backend *be, int i) {
    struct cuda_ctx *c = cuda_enter(be);
    CUDA_CHECK(cudaEventRecord(c->marks[i], c->stream));
}

static void cuda_set_prompt(struct backend *be, int family) { cuda_enter(be)->prompt = family; }
/* Rule: prompts past 8 tokens take the tiles, from 128 tokens the f16 tiles. By the prompt's
 * whole length, never by the rows a batch holds of it: a server cuts and packs prompts by what
 * else is queued, and a family chosen by the batch's rows made concurrent requests answer
 * otherwise than alone (serve identity 15/16, session 26). H100, 9B Q8_0 prefill tok/s, int8
 * tiles / f16 tiles: 64 tokens 3,119 / 2,028, 128 5,046 / 5,498, 512 10,950 / 11,059; one to 8
 * tokens in the f16 tiles cost ten times the decode kernels (25 against 273 tok/s at one). */
static int cuda_prompt_family(const struct backend *be, int prompt_len) {
    (void)be;
    return prompt_len >= 128 ? CUDA_PROMPT_F16 : prompt_len > 8 ? CUDA_PROMPT_TILES : CUDA_PROMPT_NONE;
}

static double cuda_mark_elapsed_us(struct backend *be, int from, int to) {
    struct cuda_ctx *c = cuda_enter(be);
    float ms = 0.0f;
    CUDA_CHECK(cudaEventSynchronize(c->marks[to]));
    CUDA_CHECK(cudaEventElapsedTime(&ms, c->marks[from], c->marks[to]));
    return 1000.0 * ms;
}

/* ---- the side queue ------------------------------------------------------------------ */

static void swap_scratch(struct cuda_ctx *c) {
    void *p = c->xq;
    size_t n = c->xq_size;
    c->xq = c->xq_side;
    c->xq_size = c->xq_side_size;
    c->xq_side = p;
    c->xq_side_size = n;
}

#ifdef COTI_CUDA_TRACE
static const bool side_in_order = true; /* cuda_timeline.py reads one chain of launches: with the side
                                         * stream's kernels among them it could not group them */
#else
static const bool side_in_order = false;
#endif

static void cuda_side_begin(struct backend *be) {
    struct cuda_ctx *c = cuda_enter(be);
    if (c->in_side || side_in_order) return; /* then side_end and side_join have nothing to do */
    CUDA_CHECK(cudaEventRecord(c->side_fork, c->stream));
    CUDA_CHECK(cudaStreamWaitEvent(c->side, c->side_fork, 0));
    c->main_stream = c->stream;
    c->stream = c->side; /* every launch goes to c->stream */
    swap_scratch(c);
    c->in_side = true;
}

static void cuda_side_end(struct backend *be) {
    struct cuda_ctx *c = cuda_enter(be);
    if (!c->in_side) return;
    CUDA_CHECK(cudaEventRecord(c->side_done, c->side));
    c->stream = c->main_stream;
    swap_scratch(c);
    c->in_side = false;
    c->side_pending = true;
}

static void cuda_side_join(struct backend *be) {
    struct cuda_ctx *c = cuda_enter(be);
    if (!c->side_pending) return;
    CUDA_CHECK(cudaStreamWaitEvent(c->stream, c->side_done, 0));
    c->side_pending = false;
}

/* ---- graphs ------------------------------------------------------------------------ */

struct cuda_graph {
    cudaGraphExec_t exec;
    unsigned scratch_gen;        /* the scratch buffers it was recorded with */
};

static void cuda_capture_begin(struct backend *be) {
    struct cuda_ctx *c = cuda_enter(be);
    /* relaxed: kernel attribute queries of first launches are not stream work */
    CUDA_CHECK(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeRelaxed));
    c->capturing = true;
    c->capture_broken = false;
}

static void *cuda_capture_end(struct backend *be, void *reuse) {
    struct cuda_ctx *c = cuda_enter(be);
    cudaGraph_t graph = NULL;
    CUDA_CHECK(cudaStreamEndCapture(c->stream, &graph));
    c->capturing = false;
    struct cuda_graph *g = (struct cuda_graph *)reuse;
    if (g && !c->capture_broken) {
        /* launches of the old contents already queued are not affected (CUDA's rule for
         * updates of an executable graph); a failed update leaves it as it was */
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate(g->exec, graph, &info) == cudaSuccess) {
            g->scratch_gen = c->scratch_gen;
            CUDA_CHECK(cudaGraphDestroy(graph));
            return g;
        }
        (void)cudaGetLastError();
    }
    g = NULL;
    if (!c->capture_broken && (g = (struct cuda_graph *)calloc(1, sizeof *g))) {
        if (cudaGraphInstantiate(&g->exec, graph, 0) == cudaSuccess) {
            g->scratch_gen = c->scratch_gen;
        } else {
            (void)cudaGetLastError();
            free(g);
            g = NULL;
        }
    }
    CUDA_CHECK(cudaGraphDestroy(graph));
    return g;
}

static bool cuda_graph_launch(struct backend *be, void *graph) {
    struct cuda_ctx *c = cuda_enter(be);
    struct cuda_graph *g = (struct cuda_graph *)graph;
    if (g->scratch_gen != c->scratch_gen) return false;
    CUDA_CHECK(cudaGraphLaunch(g->exec, c->stream));
    return true;
}

static void cuda_graph_free(struct backend *be, void *graph) {
    struct cuda_ctx *c = cuda_enter(be);
    struct cuda_graph *g = (struct cuda_graph *)graph;
    if (!g) return;
    CUDA_CHECK(cudaStreamSynchronize(c->stream)); /* a queued replay may still run it */
    CUDA_CHECK(cudaGraphExecDestroy(g->exec));
    free(g);
}

static bool cuda_supports(struct backend *be, enum backend_op op, enum ggml_type type) {
    switch (op) {
    case BACKEND_OP_matmul:
    case BACKEND_OP_matmul_id:
    case BACKEND_OP_get_rows: return cuda_weight_type_supported(type);
    case BACKEND_OP_attn_prep:
    case BACKEND_OP_kv_store:
    case BACKEND_OP_attention: return cuda_kv_type(type);
    case BACKEND_OP_all_reduce: return false; /* no CUDA rank of a split yet (NCCL: tp.h) */
    default: return (int)op >= 0 && op < BACKEND_OP_COUNT && type == GGML_TYPE_F32;
    }
}

/* The weight goes to device memory once, bytes unchanged (GGUF block layout, rows row_bytes
 * apart), plus CUDA_ALLOC_PAD readable bytes after the last row. */
static int cuda_weight_init(struct backend *be, struct bweight *w, enum ggml_type type,
                            int64_t n_in, int64_t n_out, const void *host_data) {
    struct cuda_ctx *c = cuda_enter(be);
    if (!cuda_supports(be, BACKEND_OP_matmul, type)) return COTI_E_UNSUPPORTED;
    size_t rb = ggml_row_size(type, n_in), bytes;
    if (!rb || n_out < 1 || n_out > INT32_MAX || n_in > INT32_MAX) return COTI_E_FORMAT;
    if (!coti_mul_size(rb, (size_t)n_out, &bytes)) return COTI_E_FORMAT;
    void *d = cuda_alloc(be, bytes);
    if (!d) return COTI_E_NOMEM;
    CUDA_CHECK(cudaMemcpyAsync(d, host_data, bytes, cudaMemcpyHostToDevice, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    w->type = type;
    w->n_in = n_in;
    w->n_out = n_out;
    w->row_bytes = rb;
    w->data = d;
    return 0;
}

static void cuda_weight_free(struct backend *be, struct bweight *w) {
    cuda_free(be, (void *)w->data);
    w->data = NULL;
}

static void cuda_destroy(struct backend *be) {
    struct cuda_ctx *c = cuda_enter(be);
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
#ifdef COTI_CUDA_TRACE
    cuda_trace_close();
#endif
    if (c->xq) CUDA_CHECK(cudaFree(c->xq));
    if (c->xq_side) CUDA_CHECK(cudaFree(c->xq_side));
    CUDA_CHECK(cudaEventDestroy(c->side_fork));
    CUDA_CHECK(cudaEventDestroy(c->side_done));
    CUDA_CHECK(cudaStreamDestroy(c->side));
    if (c->attn_part) CUDA_CHECK(cudaFree(c->attn_part));
    if (c->attn_count) CUDA_CHECK(cudaFree(c->attn_count));
    if (c->amax_part) CUDA_CHECK(cudaFree(c->amax_part));
    for (int i = 0; i < 2; i++) CUDA_CHECK(cudaEventDestroy(c->stage_ev[i]));
    for (int i = 0; i < BACKEND_N_MARKS; i++) CUDA_CHECK(cudaEventDestroy(c->marks[i]));
    CUDA_CHECK(cudaFreeHost(c->stage));
    CUDA_CHECK(cudaStreamDestroy(c->stream));
    free(c);
    free(be);
}

extern "C" void *backend_cuda_stream(struct backend *be) {
    return be && be->destroy == cuda_destroy ? (void *)cuda_ctx_of(be)->stream : NULL;
}

/* ---- init ---------------------------------------------------------------------------- */

#define INIT_CALL(call)                                                                        \
    do {                                                                                       \
        cudaError_t e_ = (call);                                                               \
        if (e_ != cudaSuccess) {                                                               \
            coti_fail(err, err_size, COTI_E_UNSUPPORTED, "cuda: %s: %s", #call,                \
                      cudaGetErrorString(e_));                                                 \
            goto fail;                                                                         \
        }                                                                                      \
    } while (0)

extern "C" struct backend *backend_cuda_init(int device, char *err, size_t err_size) {
    struct backend *be = (struct backend *)calloc(1, sizeof(*be));
    struct cuda_ctx *c = (struct cuda_ctx *)calloc(1, sizeof(*c));
    int n_dev = 0;
    cudaDeviceProp prop;
    if (!be || !c) {
        coti_fail(err, err_size, COTI_E_NOMEM, "out of memory");
        free(be);
        free(c);
        return NULL;
    }
    INIT_CALL(cudaGetDeviceCount(&n_dev));
    if (device < 0 || device >= n_dev) {
        coti_fail(err, err_size, COTI_E_ARG, "cuda: device %d does not exist (%d devices)", device, n_dev);
        goto fail;
    }
    INIT_CALL(cudaSetDevice(device));
    INIT_CALL(cudaGetDeviceProperties(&prop, device));
    if (prop.major < 9) {
        coti_fail(err, err_size, COTI_E_UNSUPPORTED,
                  "cuda: device %d (%s) has compute capability %d.%d; coti's kernels need 9.0",
                  device, prop.name, prop.major, prop.minor);
        goto fail;
    }
    c->device = device;
    c->n_sm = prop.multiProcessorCount;
    c->mmf_ok = prop.major == 9 && prop.minor == 0;
    c->smem_per_sm = (int)prop.sharedMemPerMultiprocessor;
    c->smem_block_max = (int)prop.sharedMemPerBlockOptin;
    c->smem_reserved = (int)prop.reservedSharedMemPerBlock;
    INIT_CALL(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    INIT_CALL(cudaStreamCreateWithFlags(&c->side, cudaStreamNonBlocking));
    INIT_CALL(cudaEventCreateWithFlags(&c->side_fork, cudaEventDisableTiming));
    INIT_CALL(cudaEventCreateWithFlags(&c->side_done, cudaEventDisableTiming));
    INIT_CALL(cudaEventCreateWithFlags(&c->stage_ev[0], cudaEventDisableTiming));
    INIT_CALL(cudaEventCreateWithFlags(&c->stage_ev[1], cudaEventDisableTiming));
    for (int i = 0; i < BACKEND_N_MARKS; i++) INIT_CALL(cudaEventCreate(&c->marks[i]));
    INIT_CALL(cudaHostAlloc((void **)&c->stage, CUDA_STAGE_BYTES, cudaHostAllocDefault));
#ifdef COTI_CUDA_TRACE
    cuda_trace_open();
#endif

    be->name = "cuda";
    be->ctx = c;
    be->alloc = cuda_alloc;
    be->mem_available = cuda_mem_available;
    be->free = cuda_free;
    be->upload = cuda_upload;
    be->download = cuda_download;
    be->copy = cuda_copy;
    be->copy_n = cuda_copy_n;
    be->copy_n_at = cuda_copy_n_at;
    be->sync = cuda_sync;
    be->weight_init = cuda_weight_init;
    be->weight_free = cuda_weight_free;
    be->supports = cuda_supports;
#define BACKEND_OP(name, family, params, args) be->name = cuda_##name;
#include "backend_ops.h"
#undef BACKEND_OP
    be->set_prompt = cuda_set_prompt;
    be->prompt_family = cuda_prompt_family;
    be->mark = cuda_mark;
    be->mark_elapsed_us = cuda_mark_elapsed_us;
    be->capture_begin = cuda_capture_begin;
    be->capture_end = cuda_capture_end;
    be->graph_launch = cuda_graph_launch;
    be->graph_free = cuda_graph_free;
    be->side_begin = cuda_side_begin;
    be->side_end = cuda_side_end;
    be->side_join = cuda_side_join;
    be->destroy = cuda_destroy;
    return be;

fail:
    if (c->stage) cudaFreeHost(c->stage);
    if (c->stage_ev[0]) cudaEventDestroy(c->stage_ev[0]);
    if (c->stage_ev[1]) cudaEventDestroy(c->stage_ev[1]);
    for (int i = 0; i < BACKEND_N_MARKS; i++)
        if (c->marks[i]) cudaEventDestroy(c->marks[i]);
    if (c->side_fork) cudaEventDestroy(c->side_fork);
    if (c->side_done) cudaEventDestroy(c->side_done);
    if (c->side) cudaStreamDestroy(c->side);
    if (c->stream) cudaStreamDestroy(c->stream);
    (void)cudaGetLastError();
    free(c);
    free(be);
    return NULL;
}

CUDA_TRACE_TU(backend)
