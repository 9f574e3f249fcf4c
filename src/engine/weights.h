/* weights.h — an architecture's tensors as a table, and the binding of a GGUF file's tensors
 * to backend weights through it. The same table tells `coti mkmodel` which tensors a model of
 * the architecture has, in the converter's order, with their shapes and how to initialise
 * them, so the loader and the generator cannot disagree.
 *
 * A tensor's shape is given by width ids into the architecture's widths array (computed from
 * its hparams); a per-layer tensor's name has a %d for the layer and belongs to the layer kinds
 * in its mask. Where a bound weight lives is an offset into the architecture's per-layer (or
 * global) struct. */
#ifndef COTI_WEIGHTS_H
#define COTI_WEIGHTS_H

#include "backend.h"
#include "gguf.h"

enum weight_kind {
    WEIGHT_MATRIX,               /* a struct bweight: {n_in, n_out} of any supported type */
    WEIGHT_VECTOR,               /* a float * on the backend: F32 of width[in]·width[out] elements */
    WEIGHT_SCALAR,               /* a float on the host: an F32 tensor of one element */
    WEIGHT_EXPERTS,              /* a struct bweight: a 3-D {n_in, n_out, n_expert} stack of a MoE's
                                    experts, bound as n_expert·n_out rows (n_expert from the file,
                                    at most BACKEND_MOE_MAX_EXPERTS: the architecture checks it) */
};

enum weight_presence {
    WEIGHT_REQUIRED,
    WEIGHT_OPTIONAL,             /* may be absent; the generator writes it */
    WEIGHT_TIED,                 /* absent when the LM head is tied to the embedding */
    WEIGHT_ALTERNATIVE,          /* may be absent, and the generator leaves it out: another layout
                                    of tensors the table also lists (the architecture checks that
                                    one of them is there) */
};

/* How the generator fills a tensor (random, deterministic, with the statistics of a trained
 * model's tensor of that role, so that activations keep their scale). */
enum weight_init {
    WEIGHT_INIT_MATRIX,          /* uniform, std 1/sqrt(n_in) */
    WEIGHT_INIT_NORM,            /* around 1 */
    WEIGHT_INIT_DECAY,           /* strictly negative (a state decay: the delta net's A) */
    WEIGHT_INIT_BIAS,            /* small around 0 */
    WEIGHT_INIT_CONV,            /* conv taps, std 0.5/sqrt(k) */
    WEIGHT_INIT_ROPE_FREQS,      /* rope pair factors: 1 for the first quarter, 1e30 (no turn) after */
};

#define WEIGHT_WIDTH_ONE 0       /* width id 0 is 1 in every architecture (a 1-D tensor's out) */
/* layers value of a global tensor the converter writes after the blocks (bound with the
 * global ones, kind 0) */
#define WEIGHT_GLOBAL_LAST 0x80000000u

struct weight_desc {
    const char *name;            /* "output_norm.weight", or "blk.%d.attn_q.weight" */
    enum weight_kind kind;
    unsigned layers;             /* layer kinds (architecture bits) it belongs to; 0 (or
                                    WEIGHT_GLOBAL_LAST): global */
    int in, out;                 /* width ids: ne[0], ne[1] */
    size_t offset;               /* of its struct bweight / float * in the layer (global) struct */
    enum weight_presence presence;
    enum weight_init init;
};

struct load_progress;

/* Tensor parallelism (docs/notes/2026-12-05-tensor-parallel.md): along a split width, the
 * indices a rank holds, as runs in increasing order. A matrix whose out width is split keeps
 * those rows; else one whose in width is split keeps those columns of every row (its matmul is
 * then a partial sum, all-reduced by the caller); else it is whole on every rank. Vectors the
 * same, element-wise. */
#define WEIGHT_SHARD_MAX_RUNS 64
struct weight_shard_runs {
    int n;                       /* 0: the width is not split */
    int64_t start[WEIGHT_SHARD_MAX_RUNS], len[WEIGHT_SHARD_MAX_RUNS];
};

struct weight_loader {
    struct gguf_file *g;
    struct backend *be;
    const char *arch;            /* metadata key prefix */
    char *err;
    size_t err_size;
    struct load_progress *progress; /* model_params' (model.h), or NULL */
    /* NULL: whole tensors; else [width id] the rank's runs (weights_bind: by the table's width
     * ids; the widths given there are the rank's) */
    const struct weight_shard_runs *shard;
    const int64_t *shard_whole;  /* with shard: [width id] the whole model's widths (the file's shapes) */
};

/* Bind the tensors of `table` that belong to layer kind `kind` (0: the global ones) of layer il
 * into the struct at base. A missing optional tensor leaves its field zero. */
int weights_bind(const struct weight_loader *L, const struct weight_desc *table, int n, unsigned kind, int il,
                 void *base, const int64_t *widths);
/* The rank's part of tensor t (n_in x n_out of the file, rows and columns where their runs say,
 * NULL runs: all) in a new buffer (free()), *n_in_out / *n_out_out its shape. Column runs must
 * start and end on the type's blocks. Returns 0 or an error. */
int weights_shard_gather(const struct weight_loader *L, const struct gguf_tensor *t, int64_t n_in, int64_t n_out,
                         const struct weight_shard_runs *rows, const struct weight_shard_runs *cols, void **buf,
                         int64_t *n_in_out, int64_t *n_out_out);
/* Free the fields weights_bind binds for kind (0: the global ones) in the struct at base that
 * are bound (safe on a struct bound half-way: fields are zero until bound). */
void weights_unbind(struct backend *be, const struct weight_desc *table, int n, unsigned kind, void *base);
/* The tensor's GGUF name for layer il. */
void weight_name(const struct weight_desc *d, int il, char *out, size_t size);

int weights_bind_matrix(const struct weight_loader *L, struct bweight *w, const char *name, int64_t n_in, int64_t n_out);
/* A 3-D tensor {n_in, n_out, n} (any n in [1, BACKEND_MOE_MAX_EXPERTS]) as one bweight of n·n_out rows. */
int weights_bind_experts(const struct weight_loader *L, struct bweight *w, const char *name, int64_t n_in,
                         int64_t n_out);
/* Two expert stacks bound apart (a: name_a, b: name_b, n_expert experts each) become one in
 * *out, each expert's rows of a then its rows of b (the layout of llama.cpp's merged
 * ffn_gate_up_exps), where the backend holds a copy of the weights anyway: one matmul_id call
 * then reads both. a and b are freed and zeroed then; left as they are (0 returned) where the
 * backend reads the file's bytes in place. */
int weights_merge_experts(const struct weight_loader *L, struct bweight *a, const char *name_a, struct bweight *b,
                          const char *name_b, int n_expert, struct bweight *out);
/* A small F32 tensor of n elements (any shape with that count) copied to the backend. */
int weights_bind_vector(const struct weight_loader *L, float **out, const char *name, int64_t n);

/* Metadata "<arch>.<key>": a required / optional u32 (at most 2^30), a required / optional f32. */
int weights_get_u32(const struct weight_loader *L, const char *key, int *out);
int weights_get_u32_opt(const struct weight_loader *L, const char *key, int *out, int def);
int weights_get_f32(const struct weight_loader *L, const char *key, float *out);
int weights_get_f32_opt(const struct weight_loader *L, const char *key, float *out, float def);
/* "<arch>.<key>" per layer: an array of n_layer integers in [0, 2^30], or one value for all
 * (required, or def when absent and not required). */
int weights_get_per_layer(const struct weight_loader *L, const char *key, int n_layer, int *out, bool required, int def);

/* A Q4_0 copy of the matrix in tensor t (n_in x n_out) on the backend, requantized through f32
 * with the reference rounding, on every core when it is large; *host keeps its bytes (free()
 * after weight_free). Returns 0 with out->data NULL when the backend cannot hold it. */
int weights_requant_q4_0(const struct weight_loader *L, const struct gguf_tensor *t, int64_t n_in, int64_t n_out,
                         struct bweight *out, void **host);

#endif
