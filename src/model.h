/* model.h — the architecture-independent face of a loaded model: load from a GGUF file onto
 * a backend, run a batch of tokens of one or more sequences, expose logits and the hidden
 * states drafters need, and manage per-sequence memory (KV cache, recurrent state).
 * One file per architecture implements struct model_vtable (src/models/<arch>.c), mostly
 * with the engine's entries (src/engine/engine.h). */
#ifndef COTI_MODEL_H
#define COTI_MODEL_H

#include "backend.h"
#include "gguf.h"

struct model_info {
    const char *arch;            /* "qwen35" */
    int n_vocab;
    int n_embd;
    int n_layer;                 /* trunk layers */
    int n_ctx_train;
    bool has_mtp;                /* carries a NextN head usable for self-speculation */
    bool has_recurrent;          /* rollback needs state snapshots, not only KV truncation */
    /* what a server reports about the file, so that it never reads the GGUF itself */
    enum ggml_type weight_type;  /* the token embedding's type (llama.cpp's "ftype" of a file) */
    long long n_params;          /* elements of every tensor in the file */
    uint64_t n_bytes;            /* the file's size */
    const char *chat_template;   /* tokenizer.chat_template, or NULL (the model owns the text) */
    size_t state_bytes_per_seq;  /* device memory of one sequence: KV cells + recurrent state */
    enum ggml_type cache_type_k, cache_type_v; /* the KV cache's element types */
    size_t k_bytes_per_seq, v_bytes_per_seq;   /* its K and V parts of state_bytes_per_seq */
};

/* A batch: tokens of the same sequence are contiguous and at consecutive positions that
 * continue the sequence (pos of the first = the sequence's current length). */
struct model_batch {
    int n;
    const int32_t *tokens;       /* host (unused when tokens_dev is set) */
    const int32_t *tokens_dev;   /* backend memory, or NULL: the ids were produced on the device
                                    (an argmax, so in range) and are read there, which lets a
                                    chain of forwards run without waiting for the host */
    const int32_t *pos;          /* host */
    const int32_t *seq;          /* host; NULL = all sequence 0 */
    const bool *want_logits;     /* host; NULL = only the last row */
    int prompt;                  /* 0, or the rows are a prompt chunk, which replaces no decode row,
                                    of this kernel family (model_prompt_family of the prompt's
                                    length; backend.h set_prompt); verify and decode batches
                                    leave it 0 */
    bool keep_states;            /* recurrent layers keep the state after every token of the
                                    last run of each sequence, so model_seq_rollback works */
    bool draft_head;             /* NextN only: logits from the model's cheaper draft copy of
                                    the LM head, where it has one (drafting; the target checks) */
    int32_t *argmax_out;         /* backend memory, or NULL: the forward also writes the argmax of
                                    every logits row it outputs here, in the same queued (and
                                    recorded) work: greedy picks stay on the device */
    int32_t *accept_out;         /* a greedy verify batch, or NULL: with argmax_out and tokens_dev
                                    and every row wanting logits, also the backend's accept_greedy
                                    of the drafts tokens_dev[1 .. n) against the argmaxes of rows
                                    0 .. n-2, written here (n + 1 ids); with keep_states the
                                    recurrent state is rolled back to the accepted prefix on the
                                    device as well, so the caller's model_seq_rollback must then
                                    drop exactly the rejected drafts (it only trims lengths) */
    float *hidden_out;           /* backend memory, or NULL: where the post-norm hidden rows go
                                    (out->hidden points there; one step of at most n_batch rows),
                                    so a drafter keeping them needs no copy */
};

/* Results of the last forward, in backend memory; valid until the next forward. */
struct model_output {
    int n_logits;                /* rows of logits, in batch order of the rows that wanted them */
    const float *logits;         /* [n_logits][n_vocab] */
    const float *hidden;         /* [n][n_embd] post-output-norm hidden of every row */
    int n;
};

struct model;

struct model_vtable {
    void (*free)(struct model *m);
    int (*forward)(struct model *m, const struct model_batch *b, struct model_output *out,
                   char *err, size_t err_size);
    /* Forget sequence s entirely. */
    void (*seq_reset)(struct model *m, int s);
    /* Drop the last n_drop positions of sequence s, which must all come from the last
     * forward (that ran with keep_states) and number fewer than its tokens of s. */
    int (*seq_rollback)(struct model *m, int s, int n_drop);
    /* Copy sequence src's whole state onto dst (prompt-cache reuse across slots). */
    int (*seq_copy)(struct model *m, int dst, int src);

    /* Copy sequence s's recurrent state (every layer's conv + delta state, in layer order) to
     * host memory dst of n floats; returns the number of floats it needs (call with n = 0 to
     * ask) or a negative coti_err. Tests compare states with it. */
    long (*seq_state_read)(struct model *m, int s, float *dst, size_t n);

    /* The draft head built into the file, or NULL (an architecture without one). */
    const struct model_nextn *nextn;
    /* out[i] = the trunk's input row for token ids[i] (ids in backend memory), as its first layer
     * sees it, for a drafter that borrows the target's embedding; NULL: not offered. */
    void (*embed)(struct model *m, const int32_t *ids, int n, float *out);
};

/* A NextN (MTP) draft head carried by the model file, reached through model_nextn(m). Its rows
 * append to the head's own KV cache, which holds seq_len(m, s) positions of sequence s. */
struct model_nextn {
    /* Row i is (tokens[i] at pos[i] of seq[i], h_in row i) where h_in is the target's post-norm
     * hidden of the previous position (or the head's own output when chaining drafts); the
     * first pos of a sequence's run must equal the head's seq_len. out->hidden gets the head's
     * post-shared_head_norm hidden, out->logits the rows that want them. */
    int (*forward)(struct model *m, const struct model_batch *b, const float *h_in, struct model_output *out,
                   char *err, size_t err_size);
    int (*seq_len)(const struct model *m, int s);
    /* Keep the first n positions of the head's cache for s (n <= seq_len). */
    void (*seq_truncate)(struct model *m, int s, int n);
    /* Hold n >= seq_len positions, those past seq_len uncomputed (memory_head_skip). */
    void (*seq_skip)(struct model *m, int s, int n);
};

struct model {
    const struct model_vtable *vt;
    struct model_info info;
    struct backend *be;
    struct gguf_file *gguf;      /* owned; weights may point into its mapping */
    struct engine *engine;       /* the machinery under the architecture (engine/engine.h) */
    int n_seq, n_ctx, n_batch, n_keep_states;
    enum ggml_type cache_type_k, cache_type_v;
    int32_t *seq_len;            /* host: positions held per sequence (model_seq_len) */
};

/* Progress of a load, reported as the weights are bound: done of total tensor bytes. */
struct load_progress {
    void (*fn)(void *user, uint64_t done, uint64_t total);
    void *user;
    uint64_t done, total;        /* set by the loader */
};

struct model_params {
    int n_seq;                   /* sequences held at once (server slots) */
    int n_ctx;                   /* positions per sequence */
    int n_batch;                 /* max rows per internal forward step (larger batches are split) */
    int n_keep_states;           /* max verify length that must be rollback-able (1 + n_draft) */
    struct load_progress *progress; /* or NULL */
    /* the KV cache's element types (llama.cpp's -ctk / -ctv): f16, bf16, q8_0 or q4_0 (kv.h's
     * kv_types), K and V independently */
    enum ggml_type cache_type_k, cache_type_v;
    /* tp_n > 1: load rank tp_rank of a tensor-parallel split (its share of the heads and
     * widths, docs/notes/2026-12-05-tensor-parallel.md); 0 or 1: the whole model */
    int tp_rank, tp_n;
};

/* An architecture's loader: what its model takes from the load's parameters as they are. */
static inline void model_base_init(struct model *m, const struct model_vtable *vt, struct backend *be,
                                   const struct model_params *p) {
    m->vt = vt;
    m->be = be;
    m->n_seq = p->n_seq;
    m->n_ctx = p->n_ctx;
    m->n_batch = p->n_batch;
    m->cache_type_k = p->cache_type_k;
    m->cache_type_v = p->cache_type_v;
    m->n_keep_states = p->n_keep_states;
}

/* The architectures model_load knows, comma-separated ("qwen35, gemma4"), into buf; returns buf. */
const char *model_arch_names(char *buf, size_t size);

/* Load `path` onto `be`. Returns 0 or a negative coti_err with a message. */
int model_load(struct model **out, const char *path, struct backend *be,
               const struct model_params *p, char *err, size_t err_size);
/* The same from an opened GGUF, which it always takes: on success the model owns g (model_free
 * closes it), on failure g is already closed. */
int model_load_gguf(struct model **out, struct gguf_file *g, struct backend *be,
                    const struct model_params *p, char *err, size_t err_size);
void model_free(struct model *m);

/* model_batch.prompt for the rows of a prompt of prompt_len tokens (backend.h prompt_family;
 * 1 on a backend with one family). */
static inline int model_prompt_family(const struct model *m, int prompt_len) {
    return m->be->prompt_family ? m->be->prompt_family(m->be, prompt_len) : 1;
}
static inline int model_forward(struct model *m, const struct model_batch *b,
                                struct model_output *out, char *err, size_t err_size) {
    if (m->be->set_prompt) m->be->set_prompt(m->be, b->prompt);
    const int rc = m->vt->forward(m, b, out, err, err_size);
    if (m->be->set_prompt) m->be->set_prompt(m->be, 0);
    return rc;
}
static inline int model_seq_len(const struct model *m, int s) { return m->seq_len[s]; }
/* The model's NextN draft head, or NULL when the file carries none. */
static inline const struct model_nextn *model_nextn(const struct model *m) {
    return m->info.has_mtp ? m->vt->nextn : NULL;
}
static inline void model_seq_reset(struct model *m, int s) { m->vt->seq_reset(m, s); }
static inline int model_seq_rollback(struct model *m, int s, int n_drop) { return m->vt->seq_rollback(m, s, n_drop); }
static inline int model_seq_copy(struct model *m, int dst, int src) { return m->vt->seq_copy(m, dst, src); }
/* Prefix reuse (memory.h's checkpoints): remember sequence s's state at its length (hidden: the
 * post-norm hidden row of its last position, backend memory, or NULL); the positions q <= p
 * from which src's first q positions can be resumed (longest first, with their hidden rows or
 * NULL); make dst hold src's first q positions. */
void model_seq_checkpoint(struct model *m, int s, const float *hidden);
int model_seq_resume_points(const struct model *m, int src, int p, int *q, const float **hidden, int max);
int model_seq_resume(struct model *m, int dst, int src, int q);

/* Architecture loaders (one per src/models/<arch>.c). On success the model owns g; on failure
 * g stays the caller's (model_load_gguf closes it) and nothing else is left allocated. */
int qwen35_load(struct model **out, struct gguf_file *g, struct backend *be,
                const struct model_params *p, char *err, size_t err_size);
int qwen35moe_load(struct model **out, struct gguf_file *g, struct backend *be, const struct model_params *p,
                   char *err, size_t err_size);
int gemma4_load(struct model **out, struct gguf_file *g, struct backend *be,
                const struct model_params *p, char *err, size_t err_size);

#endif
