/* gemma4.h — what the outside may know of the gemma4 architecture (dense, with the E-series'
 * per-layer embeddings and shared-KV layers, and 26B-A4B's routed experts beside the dense FFN):
 * its hparams, width ids, layer kinds and tensor table (engine/weights.h), which `coti mkmodel
 * --arch gemma4` writes from. */
#ifndef COTI_GEMMA4_H
#define COTI_GEMMA4_H

#include "engine/weights.h"

#define GEMMA4_MAX_LAYERS 256

struct gemma4_hparams {
    int n_layer, n_embd, n_vocab, n_ctx_train;
    int n_head[GEMMA4_MAX_LAYERS], n_head_kv[GEMMA4_MAX_LAYERS], n_ff[GEMMA4_MAX_LAYERS];
    bool swa[GEMMA4_MAX_LAYERS];         /* sliding-window (local) layer */
    int head_dim, head_dim_swa;          /* K = V head size of full and of sliding layers */
    int n_rot, n_rot_swa;
    int window;                          /* sliding window, positions */
    int n_kv_shared;                     /* trailing layers that read an earlier layer's K/V */
    int n_embd_per_layer;                /* P of the per-layer embeddings (E-series), 0: none */
    int n_expert, n_expert_used, n_ff_exp; /* 26B-A4B's experts, chosen per token, their FFN width */
    bool moe[GEMMA4_MAX_LAYERS];         /* the layer has the expert branch (its router is in the file) */
    float eps, rope_base, rope_base_swa, softcap;
};

enum gemma4_width {
    GEMMA4_W_ONE = WEIGHT_WIDTH_ONE,
    GEMMA4_W_EMBD, GEMMA4_W_VOCAB, GEMMA4_W_Q, GEMMA4_W_KV, GEMMA4_W_HEAD_DIM, GEMMA4_W_FF, GEMMA4_W_ROPE_FREQS,
    GEMMA4_W_PLE, GEMMA4_W_PLE_ALL,      /* P, and P·n_layer (every layer's slice of a token's row) */
    GEMMA4_W_EXPERTS, GEMMA4_W_FF_EXP, GEMMA4_W_FF_EXP2, /* n_expert; an expert's FFN width, twice it */
    GEMMA4_N_WIDTHS
};

enum {
    GEMMA4_LAYER_SWA = 1,                /* sliding-window attention */
    GEMMA4_LAYER_FULL = 2,               /* full attention */
    GEMMA4_LAYER_KV = 4,                 /* owns its K/V (not a shared-KV layer) */
    GEMMA4_LAYER_PLE = 8,                /* adds its per-layer embedding (a model with P > 0) */
    GEMMA4_LAYER_MOE = 16,               /* routed experts beside the dense FFN (26B-A4B) */
};

extern const struct weight_desc gemma4_tensors[];
extern const int gemma4_n_tensors;

/* Widths of layer il (for the globals, any layer: they read EMBD, VOCAB, ROPE_FREQS, PLE*). */
void gemma4_widths(const struct gemma4_hparams *hp, int il, int64_t widths[GEMMA4_N_WIDTHS]);
unsigned gemma4_layer_kind(const struct gemma4_hparams *hp, int il);
/* The layer whose K/V layer il reads (itself unless it is a shared-KV layer), or -1 when the
 * layout has no such layer where llama.cpp looks for it. */
int gemma4_kv_source(const struct gemma4_hparams *hp, int il);

#endif
