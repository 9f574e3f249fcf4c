/* engine.h — the machinery every architecture runs on: its memory (memory.h), the activation
 * arena, batch slicing and metadata (batch.h), the graph cache (graphs.h) and the forward
 * driver that validates a batch, cuts it into slices and runs an architecture's pass over
 * each. An architecture file gives its hparams, tensor table, buffers and passes (the block
 * order of its trunk and of a draft head); the model_vtable entries below do the rest. */
#ifndef COTI_ENGINE_H
#define COTI_ENGINE_H

#include "engine/arena.h"
#include "engine/batch.h"
#include "engine/graphs.h"
#include "memory/memory.h"
#include "model.h"

/* What the ops of one slice's pass read besides device memory (all of it is in a graph key). */
struct slice_ops_args {
    const struct slice *sl;
    const bool *want;            /* per row of the slice, or NULL: last row if last_only */
    bool last_only, keep;
    float *logits;               /* the slice's first logits row */
    const struct bweight *head;  /* the LM head (drafting: maybe its cheaper copy) */
    const float *h_in;           /* draft head only: its input hidden rows */
    const int32_t *ids;          /* the slice's token ids (backend memory) */
    int32_t *argmax_out, *accept_out;
    float *hn;                   /* where the post-norm hidden rows go */
    int prompt;                  /* the kernel family the pass runs in (model_batch.prompt) */
};

struct engine_ranks;

struct engine_ranks;

enum engine_pass { ENGINE_TRUNK, ENGINE_DRAFT_HEAD, ENGINE_N_PASSES };

typedef void (*engine_pass_fn)(struct model *m, const struct slice_ops_args *a);

struct engine_params {
    int n_vocab, n_embd;
    int window;                          /* sliding-window layers' window, or 0 (batch.h) */
    float softcap;                       /* logits = c·tanh(logits / c) for c > 0 (block_lm_head) */
    const struct memory_params *mem;
    const struct arena_slot *slots;      /* the architecture's activation buffers */
    int n_slots;
    engine_pass_fn passes[ENGINE_N_PASSES]; /* a NULL draft head: the model has none */
    const struct bweight *lm_head;
    const struct bweight *draft_head;    /* the head drafts may use (model_batch.draft_head) */
};

struct engine {
    struct model *m;
    int n_vocab, n_embd, window;
    float softcap;
    struct memory mem;                   /* the draft head's cache is mem.head */
    struct batch_meta meta;
    struct graph_cache graphs;
    void *arena;
    float *logits;                       /* [n_batch][n_vocab]: a forward's logits rows */
    float *hn;                           /* [n_batch][n_embd]: post-norm hidden rows */
    float *hn_head;                      /* [n_batch][n_embd]: the draft head's, apart, so that a head
                                            forward leaves the trunk's rows to be read after it */
    float *lm_in;                        /* [n_batch][n_embd]: hidden rows gathered for the head */
    engine_pass_fn passes[ENGINE_N_PASSES];
    const struct bweight *lm_head, *draft_head;
    struct engine_ranks *ranks;          /* rank 0 of a tensor-parallel split: the others (ranks.h) */
    int32_t *len_scratch;                /* [n_seq]: a forward's validation */
};

/* Set up e under m (m->engine = e, m->seq_len = its lengths); engine_free is safe after a
 * failure. */
int engine_init(struct engine *e, struct model *m, const struct engine_params *p);
void engine_free(struct engine *e);
/* The message for engine_init's failure rc under m (an architecture loader's, for its n_seq,
 * n_ctx, n_batch and KV cache types): returns rc. */
int engine_init_fail(const struct model *m, int rc, char *err, size_t err_size);

/* model_vtable entries for an architecture on the engine. */
/* How the forwards went through the graph cache so far (all zero on a backend without graphs). */
struct graph_stats engine_graph_stats(const struct model *m);
int engine_forward(struct model *m, const struct model_batch *b, struct model_output *out, char *err, size_t err_size);
void engine_seq_reset(struct model *m, int s);
int engine_seq_rollback(struct model *m, int s, int n_drop);
int engine_seq_copy(struct model *m, int dst, int src);
long engine_seq_state_read(struct model *m, int s, float *dst, size_t n);
void engine_seq_checkpoint(struct model *m, int s, const float *hidden);
int engine_seq_resume_points(const struct model *m, int src, int p, int *q, const float **hidden, int max);
int engine_seq_resume(struct model *m, int dst, int src, int q);
/* The draft head of a model whose engine has one (model_vtable.nextn). */
extern const struct model_nextn engine_nextn;

#endif
