/* backend.h — the interface every compute backend (CPU, CUDA) implements: buffers, weights,
 * timing, graphs, and the compute ops the models are written with (listed once, in
 * backend_ops.h, which makes their members here). Models hold device pointers they never
 * dereference; only backend calls touch them, so the same model code runs on any backend.
 *
 * Layout conventions: activations are f32, row-major, one row per token; "stride" arguments
 * are in elements. Integer metadata (token ids, positions, cache cells) lives in device
 * memory too (uploaded once per forward), so a device-resident loop can produce it itself.
 * Every op is asynchronous with respect to the host on devices that queue work; download()
 * and sync() are the only points that wait. */
#ifndef COTI_BACKEND_H
#define COTI_BACKEND_H

#include "common.h"
#include "memory/kv.h"
#include "quant/quant.h"

#define BACKEND_N_MARKS 6

/* A matrix weight as the backend stores it: n_out rows of n_in elements of `type`. */
struct bweight {
    enum ggml_type type;
    int64_t n_in, n_out;
    size_t row_bytes;
    const void *data;            /* backend memory */
    bool repacked;               /* data is the backend's own copy in a layout of its choice */
    void *host_copy;             /* a loader-made copy (a rank's part) that data may point into:
                                    weights_unbind frees it after the backend's weight_free */
};

/* A delta-net layer's gate inputs for a run of tokens: for token t and v-head h the decay is
 * exp(g) with g = softplus(a[t][h] + dt_bias[h]) · ssm_a[h] (softplus(v) = v past 20), and
 * beta = sigmoid(b[t][h]); a and b rows are a_stride / b_stride apart. */
struct gdn_gates {
    const float *a, *b, *dt_bias, *ssm_a;
    int a_stride, b_stride;
};

/* One sequence's rows in a batch, for the ops that carry a recurrent state along a sequence
 * (the delta-net's conv and rule): rows [start, start + len) of the op's inputs and outputs, of
 * sequence states.seq[run] (struct state_set); its live state is read and then updated to the
 * state after the run; the state after the run's row t goes to snapshot slot t (one state
 * further each) for t < n_snap. The runs of one call are of different sequences.
 * defer, for the delta rule on a backend with gdn_pending (others get false; ssm_conv ignores
 * it): a row left pending in the sequence's record (gdn_pend_floats) is applied to the state
 * before the run's rows. With defer, the run's last row is computed as usual but its update of
 * the state is left in the record instead (so the state after the run is the state after row
 * len - 2, and snapshots cover t < n_snap <= len - 2); without, the record is left with no row
 * pending. A verify then writes no snapshot for the row before its last: accepting every row
 * keeps the pending update, rejecting the last drops it (memory.c). len 0 just applies a
 * pending row. */
struct state_run {
    int start, len;
    int run;                     /* index into state_set.seq */
    int n_snap;
    bool defer;
};

/* One layer's recurrent states of every sequence: sequence s's live state at state +
 * s·state_step floats, its snapshot slots from snap + s·snap_step, its pending-row record at
 * pend + s·pend_step (NULL where the backend has no gdn_pending). seq (backend memory, read
 * when the op runs): the sequence of each run. The engine uploads it with a batch's metadata,
 * so a graph recorded from these ops runs for any sequences. */
struct state_set {
    float *state, *snap, *pend;
    size_t state_step, snap_step, pend_step;
    const int32_t *seq;
};

/* Run r's states, where the op runs (host code: a backend whose memory the host reads). */
struct run_states { float *state, *snap, *pend; };
static inline struct run_states state_set_run(const struct state_set *st, const struct state_run *r) {
    const size_t s = (size_t)st->seq[r->run];
    return (struct run_states){st->state + s * st->state_step, st->snap ? st->snap + s * st->snap_step : NULL,
                               st->pend ? st->pend + s * st->pend_step : NULL};
}

/* A delta-rule row left pending (state_run.defer): S_h <- d_h S_h + k_h δ_hᵀ per v-head h, as
 * the rule's update writes it. Floats, per v-head h of nv: a flag at [h] (1: pending, 0: none,
 * as zeroed memory says), d at [nv + h], δ_h at [2nv + h·dv], the normalised key k_h after the
 * δs at [2nv + nv·dv + h·dk]. Every part is per head, so a split of the heads splits it too. */
static inline size_t gdn_pend_floats(int nv, int dk, int dv) { return (size_t)nv * (2 + (size_t)dv + (size_t)dk); }

/* What a matmul multiplies: its input rows as they are (MATMUL_PLAIN) or formed on the way
 * from x and the fields its kind names below, rows of the weights' n_in. Backends fuse the
 * forming into the matmul where they can; the values are those of the separate ops.
 * - MATMUL_RMSNORM: a = rmsnorm(x + m) ⊙ w (m NULL: of x), with x + m written to x_out when m
 *   is given, and a written (a block's opening: the residual add and its norm). x_out, a and x
 *   must not overlap.
 * - MATMUL_SWIGLU: silu(x) ⊙ m (the FFN's gate and up rows).
 * - MATMUL_GATED_NORM: rmsnorm(x) ⊙ w ⊙ silu(m), the norm over each group of dim elements (w
 *   has dim): the delta-net's gated output norm.
 * - MATMUL_NORM2: [rmsnorm(x) ⊙ w, rmsnorm(m) ⊙ w2] side by side, x and m rows dim wide
 *   (n_in = 2·dim), each half normed on its own: the NextN head's enorm and hnorm. The output
 *   must not overlap x or m.
 * - MATMUL_SIGMOID_GATE: x ⊙ sigmoid(gate) per head of dim, the gate m's rows gate_stride and
 *   heads gate_head_stride apart (mul_sigmoid's layout): the attention output gate.
 * a: where the formed rows may be written (n_tok rows of n_in). RMSNORM leaves the normed rows
 * there; for the other formed kinds it is scratch, contents afterwards unspecified, and may be
 * x itself for SWIGLU and SIGMOID_GATE (x is then clobbered). */
enum matmul_in_kind {
    MATMUL_PLAIN,
    MATMUL_RMSNORM,
    MATMUL_SWIGLU,
    MATMUL_GEGLU,
    MATMUL_GATED_NORM,
    MATMUL_NORM2,
    MATMUL_SIGMOID_GATE,
    MATMUL_IN_KINDS
};
struct matmul_in {
    enum matmul_in_kind kind;
    const float *x;
    const float *m;              /* RMSNORM: the residual (or NULL); SWIGLU, GEGLU: up; GATED_NORM,
                                    SIGMOID_GATE: the gate; NORM2: the second half's rows */
    const float *w, *w2;         /* norm weights (w2: NORM2's second half) */
    float *x_out, *a;
    float eps;
    int dim;                     /* GATED_NORM: per norm group; NORM2: per half; SIGMOID_GATE: per head */
    int gate_stride, gate_head_stride;
};

/* What matmul_id multiplies: the weight stacks n_expert matrices of n_out / n_expert rows each
 * (expert e's rows are e·rows.. of it, as llama.cpp's 3-D expert tensors lay them out); slot k
 * of token t (k < n_used) multiplies expert ids[t·n_used + k] with the input row at
 * x + t·tok_stride + k·slot_stride (tok_stride n_in and slot_stride 0: every slot of a token
 * reads the token's row), formed as act(g) ⊙ u of its halves when glu is not MOE_GLU_NONE (the
 * row is then [g ; u], 2·n_in wide; act: the swiglu or geglu op's), and writes
 * y + (t·n_used + k)·y_stride. An id out of [0, n_expert) leaves its slot's output unwritten. */
#define BACKEND_MOE_MAX_EXPERTS 512   /* llama.cpp's LLAMA_MAX_EXPERTS */
enum moe_glu { MOE_GLU_NONE, MOE_GLU_SWIGLU, MOE_GLU_GEGLU };
struct matmul_id_in {
    const int32_t *ids;
    int n_used, n_expert;
    const float *x;
    int tok_stride, slot_stride;
    enum moe_glu glu;
    int y_stride;
};

/* What attn_prep reads and writes besides the slice's positions and cells. */
struct attn_prep_in {
    float *q;
    int q_stride, q_head_stride;   /* q rows; q heads within a row */
    const float *q_norm;
    float *k;                      /* NULL: the q heads only, nothing stored (a query-only layer) */
    int k_stride;
    const float *k_norm;
    float *v;
    int v_stride;
    const float *v_norm;           /* NULL: v is stored as projected */
    bool v_from_k;                 /* v's rows are first set to k's rows as given (K = V layers) */
    const int32_t *cells2;         /* or NULL: k and v also go to cells2[t] (a ring's second store) */
    float eps;
    int n_head;
    int n_rot;
    float rope_base;
    const float *rope_freqs;       /* NULL: none (rope_neox's freqs) */
};

/* The compute ops by name: BACKEND_OP_matmul, ... (for supports() and the op tests). */
enum backend_op {
#define BACKEND_OP(name, family, params, args) BACKEND_OP_##name,
#include "backend_ops.h"
#undef BACKEND_OP
    BACKEND_OP_COUNT
};

static inline const char *backend_op_name(enum backend_op op) {
    static const char *const names[] = {
#define BACKEND_OP(name, family, params, args) #name,
#include "backend_ops.h"
#undef BACKEND_OP
    };
    return (int)op >= 0 && op < BACKEND_OP_COUNT ? names[op] : "(none)";
}

struct backend {
    const char *name;
    void *ctx;

    /* memory */
    void *(*alloc)(struct backend *be, size_t bytes);            /* zeroed; NULL on failure */
    /* Optional (NULL: unknown): bytes alloc can still give (CUDA: the device's free memory;
     * CPU: MemAvailable), so that a large allocation (a KV cache) is refused with a message
     * before it is attempted. */
    size_t (*mem_available)(struct backend *be);
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

    /* Whether this backend computes `op` for `type`: the weight type of matmul, matmul_id and get_rows (what
     * weight_init accepts), the cache cells' type of attn_prep, kv_store and attention, GGML_TYPE_F32
     * (the activations) for the other ops. What the loader and the tests ask before choosing a
     * path; derived from the kernels the backend has. */
    bool (*supports)(struct backend *be, enum backend_op op, enum ggml_type type);

    /* the compute ops: backend_ops.h */
#define BACKEND_OP(name, family, params, args) void (*name) params;
#include "backend_ops.h"
#undef BACKEND_OP

    /* Device-side timing: mark(be, i) notes when the device reaches this point of its queue
     * (0 <= i < BACKEND_N_MARKS); mark_elapsed_us(be, i, j) is the time from mark i to mark j
     * (waits for mark j). Where ops run synchronously a mark reads the host clock. Lets the
     * speculative driver split a cycle's time without a sync between its phases. */
    void (*mark)(struct backend *be, int i);
    double (*mark_elapsed_us)(struct backend *be, int from, int to);

    /* Optional (NULL: every op's rows come out the same in any batch, as on the CPU). The
     * kernel family of a prompt of prompt_len tokens (its whole length, whatever part of it a
     * batch holds): 0 for the decode kernels, else a family of the backend's own. */
    int (*prompt_family)(const struct backend *be, int prompt_len);
    /* Optional, with prompt_family. The family of the ops queued from now on
     * (model_batch.prompt). A family other than 0 may round otherwise than the decode kernels
     * (f16 tensor-core tiles), but a row must equal what it gives in any other batch of its
     * family, of any size, beside any other sequences' rows: concurrent requests then answer
     * as alone and a reused prefix as a cold one, however a server cuts and packs prompts, as
     * long as it packs a batch with prompts of one family. In family 0 (the default) every
     * row must equal what it gives alone or in any other batch: a verify row replaces a decode
     * row bit for bit, or speculation would not be lossless. */
    void (*set_prompt)(struct backend *be, int family);

    /* Graphs — optional (NULL on backends whose ops run synchronously, like the CPU's): a
     * recorded op sequence replayed with one call, for the launch-bound small batches of
     * decode, drafting and verify. capture_begin: the ops queued until capture_end are
     * recorded, not run. capture_end: a graph, or NULL when recording failed (the caller
     * then runs the ops itself); given `reuse` (a graph of this backend, or NULL), it rewrites
     * that graph in place when the recording has its structure (the same ops in the same order,
     * only their arguments changed: instantiating a new one costs more) and returns it, else
     * it returns a new graph and leaves `reuse` as it was. graph_launch queues the recorded
     * ops with the pointers and sizes they were recorded with — only device memory contents
     * (metadata uploaded before the launch) may change between replays; it returns false,
     * queuing nothing, when the graph is stale (the backend has since replaced scratch memory
     * it uses): free it. */
    void (*capture_begin)(struct backend *be);
    void *(*capture_end)(struct backend *be, void *reuse);
    bool (*graph_launch)(struct backend *be, void *graph);
    void (*graph_free)(struct backend *be, void *graph);

    /* A side queue — optional (NULL: every op runs in the order it was queued, as on the CPU).
     * side_begin: the ops queued from now until side_end run on a second queue, once all that
     * was queued before them has run; the ops queued after side_end may run beside them until
     * side_join, after which every op waits for them. A block puts independent work there (a
     * shared expert beside the routed ones): the side ops must neither read what the main ops
     * between side_end and side_join write, nor write what they read. A graph records both. */
    void (*side_begin)(struct backend *be);
    void (*side_end)(struct backend *be);
    void (*side_join)(struct backend *be);

    void (*destroy)(struct backend *be);

    /* Whether gdn and gdn_chunked honour state_run.pend and defer (else the model passes NULL /
     * false and a verify snapshots every row but its last). */
    bool gdn_pending;

    /* Tensor parallelism (tp.h): the split this backend is rank `rank` of, or NULL (one rank:
     * all_reduce does nothing). Set by tp_attach. */
    struct tp_comm *comm;
    int rank;
};

/* CPU backend with a pool of n_threads; level caps the SIMD kernels (QUANT_CPU_REF gives the
 * plain reference path everywhere, which tests use as the yardstick). */
struct backend *backend_cpu_init(int n_threads, enum quant_cpu_level level);

static inline void backend_free(struct backend *be) { if (be) be->destroy(be); }
static inline void backend_side_begin(struct backend *be) { if (be->side_begin) be->side_begin(be); }
static inline void backend_side_end(struct backend *be) { if (be->side_end) be->side_end(be); }
static inline void backend_side_join(struct backend *be) { if (be->side_join) be->side_join(be); }

/* One weight: y = W · (the rows `in` forms). */
static inline void backend_matmul(struct backend *be, const struct bweight *w, const struct matmul_in *in, int n_tok,
                                  float *y) {
    be->matmul(be, &w, &y, 1, in, n_tok);
}

#endif
