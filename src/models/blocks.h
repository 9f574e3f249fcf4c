/* blocks.h — the blocks architectures are built from, written against backend.h: the GLU
 * feed-forward, gated full attention over a KV view, the gated delta net over a recurrent
 * state, and the LM head with its greedy picks. An architecture chooses their order and
 * sizes; each block reads its input through the residual step that opens it (block_in) and
 * writes its output rows to `out`. */
#ifndef COTI_BLOCKS_H
#define COTI_BLOCKS_H

#include "engine/engine.h"
#include "engine/weights.h"

/* The residual step that opens a block: its input is rmsnorm(x + m) ⊙ norm (m NULL: of x),
 * and x + m goes to x_out, the next residual (fused into the block's first matmul). */
struct block_in {
    const float *x, *m, *norm;
    float *x_out;
};

struct glu_ffn_weights { struct bweight gate, up, down; };

/* A mixture-of-experts FFN: the router, the experts (gate and up stacked apart, or gate_up
 * merged: one of the two is bound), a shared expert and its one-row sigmoid gate. */
struct moe_ffn_weights {
    struct bweight gate_inp, gate_exps, up_exps, gate_up_exps, down_exps;
    struct bweight gate_inp_shexp, gate_shexp, up_shexp, down_shexp;
};
struct moe_shape { int n_expert, n_used, n_ff_exp; };

struct gated_attn_weights {
    struct bweight q, k, v, o;               /* q rows hold [q_h ; gate_h] per head */
    float *q_norm, *k_norm;
};

struct delta_net_weights {
    struct bweight qkv, gate, beta, alpha, out;
    float *conv, *dt_bias, *a, *norm;
};

struct attn_shape { int n_head, n_head_kv, head_dim, n_rot; float rope_base; };
struct delta_net_shape { int conv_k, n_ch, nk, nv, dk, dv; };

/* Activation buffers the blocks use, [n_batch] rows each (sized by the architecture). */
struct block_scratch {
    float *a;                                /* normed block input */
    float *qg, *k, *v, *att;                 /* attention */
    float *qkv, *z, *bet, *alp, *y, *o, *og; /* delta net */
    float *fg, *fu;                          /* FFN (MoE: the shared expert's) */
    float *logits, *wts, *gu, *ye, *sh_gate, *sh; /* MoE: router, per-slot [gate ; up], outputs */
    int32_t *ids;                            /* MoE: the chosen experts */
};

struct block_ctx {
    struct backend *be;
    const struct block_scratch *s;
    const struct batch_meta *meta;           /* the slice's positions and cells */
    float eps;                               /* rms norm epsilon */
};

/* Expert matrices are cut at expert bounds: their rows per expert must be whole groups of a
 * backend's packed layout (QUANT_PACK_ROWS), as every published MoE's are. */
#define BLOCK_MOE_ROW_MULTIPLE 16
#define BLOCK_MOE_MAX_USED 64
/* The expert hparams every MoE architecture shares, from its metadata: counts in range, the
 * widths the forward forms (n_expert·2F, n_expert·E, n_used·(2F + E)) within max_width, expert
 * rows in whole pack groups. 0, or COTI_E_FORMAT / COTI_E_UNSUPPORTED with the reason. */
int block_moe_check_shape(const struct weight_loader *L, const struct moe_shape *sh, int n_embd, int64_t max_width);
/* A MoE block's expert stacks once bound: gate and up apart or merged (not both nor neither),
 * every stack holding sh->n_expert experts of its rows; stacks apart are then merged where the
 * backend holds a copy (weights_merge_experts: one matmul_id for both). 0, or an error. */
int block_moe_finish_load(const struct weight_loader *L, struct moe_ffn_weights *w, const struct moe_shape *sh, int n_embd,
                          int il);
/* The routed experts' matmuls: each slot's [gate ; up] row (2F wide, into gu) from its token's
 * row of x (x_stride apart), then its down projection of glu(gate) ⊙ up (into ye, E wide). */
void block_moe_experts(struct backend *be, const struct moe_ffn_weights *w, const struct moe_shape *sh,
                       const int32_t *ids, const float *x, int x_stride, int n, enum moe_glu glu, float *gu, float *ye);

/* SwiGLU FFN. */
void block_glu_ffn(const struct block_ctx *c, const struct glu_ffn_weights *w, const struct block_in *in, int n,
                   float *out);
/* Routed experts (softmax → top-k → renormalized weights) + the sigmoid-gated shared expert. */
void block_moe_ffn(const struct block_ctx *c, const struct moe_ffn_weights *w, const struct moe_shape *sh,
                   const struct block_in *in, int n, float *out);
/* Gated full attention over kv, at the slice's cells. */
void block_gated_attn(const struct block_ctx *c, const struct gated_attn_weights *w, const struct attn_shape *sh,
                      const struct kv_view *kv, const struct block_in *in, int n, float *out);
/* Gated delta net over layer il of rec, per run of the slice; keep: per-token snapshots. */
void block_delta_net(const struct block_ctx *c, const struct delta_net_weights *w, const struct delta_net_shape *sh,
                     const struct rec_state *rec, int il, const struct block_in *in, const struct slice *sl, bool keep,
                     float *out);
/* The LM head over the slice's final-normed hidden rows a->hn that want logits, the engine's
 * soft-cap, then the greedy picks (argmax, accept_greedy) the args ask for. Returns the logits
 * rows written. */
int block_lm_head(struct engine *e, const struct slice_ops_args *a);

#endif
