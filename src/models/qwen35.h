/* qwen35.h — what the outside may know of the qwen35 architecture and of its mixture-of-experts
 * twin qwen35moe (the same trunk with routed experts + a gated shared expert as every block's
 * FFN, the NextN block's too): its hparams, the widths
 * its tensor shapes are made of, its layer kinds and tensor table (engine/weights.h), which
 * `coti mkmodel` writes from and the loader binds through. */
#ifndef COTI_QWEN35_H
#define COTI_QWEN35_H

#include "engine/weights.h"

struct qwen35_hparams {
    int n_layer_all, n_layer, n_mtp;     /* all blocks = trunk + NextN */
    int n_embd, n_ff, n_head, n_head_kv, head_dim, n_rot, n_vocab, n_ctx_train;
    int ssm_k, ssm_dk, ssm_dv, ssm_nk, ssm_nv, ssm_ch; /* conv kernel, dims, heads, channels */
    int interval;                        /* every interval-th block is full attention */
    float eps, rope_base;
    /* qwen35moe (n_expert > 0): experts, chosen per token, their FFN widths, the shared one's */
    int n_expert, n_expert_used, n_ff_exp, n_ff_shexp;
};

/* Width ids of the tensor table. */
enum qwen35_width {
    QWEN35_W_ONE = WEIGHT_WIDTH_ONE,
    QWEN35_W_EMBD, QWEN35_W_EMBD2, QWEN35_W_FF, QWEN35_W_VOCAB,
    QWEN35_W_QG,                         /* query and gate rows: 2 · n_head · head_dim */
    QWEN35_W_HD, QWEN35_W_KV, QWEN35_W_HEAD_DIM,
    QWEN35_W_SSM_CH, QWEN35_W_SSM_NVD, QWEN35_W_SSM_NV, QWEN35_W_SSM_DV, QWEN35_W_CONV,
    QWEN35_W_EXPERTS, QWEN35_W_FF_EXP, QWEN35_W_FF_EXP2, QWEN35_W_FF_SHEXP,
    QWEN35_N_WIDTHS
};

/* Layer kinds (bits of weight_desc.layers). */
enum {
    QWEN35_LAYER_ATTN = 1,               /* gated full attention */
    QWEN35_LAYER_DELTA = 2,              /* gated delta net */
    QWEN35_LAYER_NEXTN = 4,              /* the NextN head's extras (its block is ATTN too) */
    QWEN35_LAYER_DENSE = 8,              /* a SwiGLU FFN (qwen35) */
    QWEN35_LAYER_MOE = 16,               /* routed experts + a gated shared expert (qwen35moe) */
};

/* Rank `rank` of n in a tensor-parallel split (docs/notes/2026-12-05-tensor-parallel.md): its
 * hparams (*local: the heads, KV heads, delta-net key and value heads and feed-forward width
 * divided by n) and, per width id, the indices of the file's rows or columns it holds (runs[w].n
 * 0: not split). The delta-net's v-heads go with their k-head (h % nk), so the rank's kernels
 * see the same rule on its own numbering. Returns 0, or an error where n does not divide them
 * (or a mixture of experts: not yet). */
int qwen35_shard(const struct qwen35_hparams *hp, int rank, int n, struct qwen35_hparams *local,
                 struct weight_shard_runs runs[QWEN35_N_WIDTHS], char *err, size_t err_size);

extern const struct weight_desc qwen35_tensors[];
extern const int qwen35_n_tensors;

void qwen35_widths(const struct qwen35_hparams *hp, int64_t widths[QWEN35_N_WIDTHS]);
/* Kind of block il of n_layer_all (the NextN block is the last, after the trunk), its FFN's bit
 * included. */
unsigned qwen35_layer_kind(const struct qwen35_hparams *hp, int il);

#endif
