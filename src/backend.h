/* backend.h — the interface every compute backend (CPU, CUDA) implements: buffers and the ops
 * the models are written with. Models hold device pointers they never dereference; only
 * backend calls touch them, so the same model code runs on any backend.
 *
 * Layout conventions: activations are f32, row-major, one row per token; "stride" arguments
 * are in elements. Integer metadata (token ids, positions, cache cells) lives in device
 * memory too (uploaded once per forward), so a device-resident loop can produce it itself.
 * Every op is asynchronous with respect to the host on devices that queue work; download()
 * and sync() are the only points that wait. */
#ifndef COTI_BACKEND_H
#define COTI_BACKEND_H

#include "common.h"
#include "quant/quant.h"

#define BACKEND_N_MARKS 4

/* A matrix weight as the backend stores it: n_out rows of n_in elements of `type`. */
struct bweight {
    enum ggml_type type;
    int64_t n_in, n_out;
    size_t row_bytes;
    const void *data;            /* backend memory */
    bool repacked;               /* data is the backend's own copy in a layout of its choice */
};

/* A delta-net layer's gate inputs for a run of tokens: for token t and v-head h the decay is
 * exp(g) with g = softplus(a[t][h] + dt_bias[h]) · ssm_a[h] (softplus(v) = v past 20), and
 * beta = sigmoid(b[t][h]); a and b rows are a_stride / b_stride apart. */
struct gdn_gates {
    const float *a, *b, *dt_bias, *ssm_a;
    int a_stride, b_stride;
};

struct backend {
    const char *name;
    void *ctx;

    /* memory */
    void *(*alloc)(struct backend *be, size_t bytes);            /* zeroed; NULL on failure */
    void (*free)(struct backend *be, void *p);
    void (*upload)(struct backend *be, void *dst, const void *src_host, size_t bytes);
    void (*download)(struct backend *be, void *dst_host, const void *src, size_t bytes);
    void (*copy)(struct backend *be, void *dst, const void *src, size_t bytes);
    /* n device-to-device copies at once (a recurrent state restore touches every layer):
     * dst[i] <- src[i], bytes[i]; regions must not overlap. */
    void (*copy_n)(struct backend *be, void *const *dst, const void *const *src, const size_t *bytes, int n);
    /* copy_n with the sources picked on the device, so that a rollback needs no host round trip:
     * with a = sel[0] (backend memory, e.g. a verify's accepted count), if a < limit then
     * dst[i] <- src[i] + a·step[i] (step in bytes), bytes[i] each; else nothing is copied. */
    void (*copy_n_at)(struct backend *be, void *const *dst, const void *const *src, const size_t *step,
                      const size_t *bytes, int n, const int32_t *sel, int limit);
    void (*sync)(struct backend *be);
    /* Make a host weight (e.g. in the GGUF mapping, kept alive by the caller) usable by ops. */
    int (*weight_init)(struct backend *be, struct bweight *w, enum ggml_type type,
                       int64_t n_in, int64_t n_out, const void *host_data);
    void (*weight_free)(struct backend *be, struct bweight *w);

    /* y[t][0..n_out) = W · x[t] for t < n_tok (x rows n_in wide, contiguous). */
    void (*matmul)(struct backend *be, const struct bweight *w, const float *x, int n_tok, float *y);
    /* Several weights over the same input (converted once): ys[i] = ws[i] · x. */
    void (*matmul_n)(struct backend *be, const struct bweight *const *ws, float *const *ys, int n_w,
                     const float *x, int n_tok);
    /* A block's opening step: x_out = x + m (m NULL: no add, x_out unused), a = rmsnorm of that
     * (or of x) ⊙ w over rows of the weights' n_in, then ys[i] = ws[i] · a. a is written too;
     * x_out, a and x must not overlap. Backends fuse the add and the norm into the matmul. */
    void (*norm_matmul_n)(struct backend *be, const float *x, const float *m, float *x_out, const float *w,
                          float eps, float *a, const struct bweight *const *ws, float *const *ys, int n_w,
                          int n_tok);
    /* y = W · (silu(g) ⊙ u), fused where a backend can; g's contents afterwards are unspecified. */
    void (*swiglu_matmul)(struct backend *be, const struct bweight *w, float *g, const float *u, int n_tok,
                          float *y);
    /* y = W · (rmsnorm(x) ⊙ w ⊙ silu(z)), the norm over each group of dim elements of the
     * n_tok input rows (W's n_in wide; w has dim elements): the delta-net's gated output norm
     * and its output projection. a is scratch for the normed rows (contents afterwards
     * unspecified). */
    void (*rmsnorm_gated_matmul)(struct backend *be, const float *x, const float *w, const float *z, int dim,
                                 float eps, float *a, const struct bweight *wt, int n_tok, float *y);
    /* y = W · [rmsnorm(x1) ⊙ w1, rmsnorm(x2) ⊙ w2]: two rows of dim, each normed on its own and
     * set side by side as W's input (n_in = 2·dim); x1 and x2 rows dim apart. The NextN head's
     * opening (enorm of the token's embedding, hnorm of the trunk's hidden row). a (n_tok rows
     * of 2·dim) is scratch; y must not overlap x1 or x2. */
    void (*norm2_matmul)(struct backend *be, const float *x1, const float *w1, const float *x2, const float *w2,
                         int dim, float eps, float *a, const struct bweight *wt, int n_tok, float *y);
    /* y = W · (x ⊙ sigmoid(gate)) per head (mul_sigmoid's layout), fused where a backend can;
     * x's contents afterwards are unspecified. The attention output gate and projection. */
    void (*mul_sigmoid_matmul)(struct backend *be, float *x, const float *gate, int n_head, int dim, int gate_stride,
                               int gate_head_stride, const struct bweight *wt, int n_tok, float *y);
    /* out[t] = row ids[t] of w, dequantized (embedding lookup). */
    void (*get_rows)(struct backend *be, const struct bweight *w, const int32_t *ids, int n, float *out);

    /* y = x / sqrt(mean(x²) + eps) ⊙ w for n_rows rows of dim elements (strides per row). */
    void (*rmsnorm)(struct backend *be, const float *x, int x_stride, const float *w, int n_rows,
                    int dim, float eps, float *y, int y_stride);
    /* y = rmsnorm(x) ⊙ w ⊙ silu(z) per row of dim (delta-net gated output norm). */
    void (*rmsnorm_gated)(struct backend *be, const float *x, const float *w, const float *z,
                          int n_rows, int dim, float eps, float *y);
    /* x += m, then y = rmsnorm(x) ⊙ w (rows of dim, contiguous): a residual add and the norm
     * that reads its result, in one op (one pass on devices where each op is a launch). */
    void (*add_rmsnorm)(struct backend *be, float *x, const float *m, const float *w, int n_rows, int dim,
                        float eps, float *y);
    void (*add)(struct backend *be, const float *a, const float *b, int64_t n, float *y);
    /* y = silu(g) ⊙ u */
    void (*swiglu)(struct backend *be, const float *g, const float *u, int64_t n, float *y);
    /* x[t][h*dim + i] *= sigmoid(gate[t*gate_stride + h*gate_head_stride + i]) */
    void (*mul_sigmoid)(struct backend *be, float *x, const float *gate, int n_tok, int n_head,
                        int dim, int gate_stride, int gate_head_stride);

    /* NeoX rope on the first n_rot dims of each head, in place: head h of token t at
     * x + t*tok_stride + h*head_stride; angle of pair d = pos[t] · base^(-2d/n_rot). */
    void (*rope_neox)(struct backend *be, float *x, int n_tok, int tok_stride, int n_head,
                      int head_stride, int n_rot, const int32_t *pos, float base);
    /* An attention block's inputs in one op, equal to rmsnorm of every q head (n_head of
     * head_dim, q_head_stride apart, q rows q_stride apart) with q_norm and of every k head
     * (n_head_kv, contiguous, k rows k_stride apart) with k_norm, in place; rope_neox of both
     * (n_rot, pos, base); then kv_store of k and v (v rows v_stride apart) into cells[t]. */
    void (*attn_prep)(struct backend *be, float *q, int q_stride, int q_head_stride, const float *q_norm, float *k,
                      int k_stride, const float *k_norm, const float *v, int v_stride, float eps, int n_tok,
                      int n_head, int n_head_kv, int head_dim, int n_rot, const int32_t *pos, float base,
                      const int32_t *cells, uint16_t *k_cache, uint16_t *v_cache);
    /* Store K and V rows (n_kv_dim wide; k rows k_stride apart) as f16 into cache rows cells[t]. */
    void (*kv_store)(struct backend *be, const float *k, int k_stride, const float *v, int v_stride,
                     int n_tok, int n_kv_dim, const int32_t *cells, uint16_t *k_cache,
                     uint16_t *v_cache);
    /* Causal softmax attention with GQA (head h uses kv head h / (n_head/n_head_kv)): token t
     * attends cache rows [cell0[t], cell0[t] + n_ctx[t]); q head h at q + t*q_stride +
     * h*q_head_stride; out[t][h*head_dim + i]. */
    void (*attention)(struct backend *be, const float *q, int q_stride, int q_head_stride,
                      const uint16_t *k_cache, const uint16_t *v_cache, const int32_t *cell0,
                      const int32_t *n_ctx, int n_tok, int n_head, int n_head_kv, int head_dim,
                      float scale, float *out);

    /* Causal depthwise conv (kernel k) + SiLU over n_tok tokens of ONE sequence. x rows are
     * n_ch wide; w[c][k] (tap k-1 multiplies the current token); state[c][k-1] (oldest
     * first) is read and updated. If snap, the state after token t goes to
     * snap + t*n_ch*(k-1) for t < n_snap. */
    void (*ssm_conv)(struct backend *be, const float *x, int n_tok, int n_ch, int k,
                     const float *w, float *state, float *y, float *snap, int n_snap);
    /* Gated delta rule over n_tok tokens of ONE sequence (arch-qwen35.md §5.5). qkv rows
     * (stride qkv_stride): q heads [0, nk·dk), k heads [nk·dk, 2nk·dk), v heads after; q and
     * k are L2-normalised here (eps). The gates come raw (struct gdn_gates) and are formed
     * here, per token and v-head. state[h][j][i] (dk fastest) is read and updated; v head h
     * uses k head h % nk. out[t][h*dv + j]. If snap, the state after token t goes to
     * snap + t*nv*dk*dv for t < n_snap. */
    void (*gdn)(struct backend *be, const float *qkv, int qkv_stride, const struct gdn_gates *gates,
                float *state, int n_tok, int nk, int nv, int dk, int dv, float eps, float *out,
                float *snap, int n_snap);

    /* The same rule in its chunked (parallel) form, for long runs without snapshots
     * (prompt processing); equal to gdn up to f32 rounding (arch-qwen35.md §5.6). */
    void (*gdn_chunked)(struct backend *be, const float *qkv, int qkv_stride, const struct gdn_gates *gates,
                        float *state, int n_tok, int nk, int nv, int dk, int dv, float eps, float *out);

    /* out[r] = index of the max of row r (lowest index on ties); if p_max, also the softmax
     * probability of that max (drafters' p_min check) — only ids and scalars leave the op. */
    void (*argmax)(struct backend *be, const float *x, int n_rows, int n, int32_t *out, float *p_max);
    /* Greedy speculative acceptance, so a cycle needs one small download: a = the length of
     * the longest prefix with draft[i] == target[i] (i < n_draft; target[i] is the target's
     * choice after row i of the verify batch); out[0] = a and out[1 + i] = target[i] for
     * i <= n_draft — the accepted tokens are out[1 .. a], the target's own token out[1 + a]. */
    void (*accept_greedy)(struct backend *be, const int32_t *draft, const int32_t *target, int n_draft,
                          int32_t *out);

    /* Device-side timing: mark(be, i) notes when the device reaches this point of its queue
     * (0 <= i < BACKEND_N_MARKS); mark_elapsed_us(be, i, j) is the time from mark i to mark j
     * (waits for mark j). Where ops run synchronously a mark reads the host clock. Lets the
     * speculative driver split a cycle's time without a sync between its phases. */
    void (*mark)(struct backend *be, int i);
    double (*mark_elapsed_us)(struct backend *be, int from, int to);

    /* Graphs — optional (NULL on backends whose ops run synchronously, like the CPU's): a
     * recorded op sequence replayed with one call, for the launch-bound small batches of
     * decode, drafting and verify. capture_begin: the ops queued until capture_end are
     * recorded, not run. capture_end: a graph, or NULL when recording failed (the caller
     * then runs the ops itself). graph_launch queues the recorded ops with the pointers and
     * sizes they were recorded with — only device memory contents (metadata uploaded before
     * the launch) may change between replays; it returns false, queuing nothing, when the
     * graph is stale (the backend has since replaced scratch memory it uses): free it. */
    void (*capture_begin)(struct backend *be);
    void *(*capture_end)(struct backend *be);
    bool (*graph_launch)(struct backend *be, void *graph);
    void (*graph_free)(struct backend *be, void *graph);

    void (*destroy)(struct backend *be);
};

/* CPU backend with a pool of n_threads; level caps the SIMD kernels (QUANT_CPU_REF gives the
 * plain reference path everywhere, which tests use as the yardstick). */
struct backend *backend_cpu_init(int n_threads, enum quant_cpu_level level);

static inline void backend_free(struct backend *be) { if (be) be->destroy(be); }

#endif
