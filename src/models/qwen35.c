/* qwen35.c — the Qwen3.5/3.6 hybrid architectures, dense (`qwen35`) and mixture-of-experts
 * (`qwen35moe`, Qwen3.6-35B-A3B): hparams from GGUF metadata, their tensor table, and the block
 * order of the trunk (gated delta nets with a gated full-attention block every interval-th
 * layer, each followed by its FFN: SwiGLU, or routed experts + a gated shared expert) and of
 * the NextN (MTP) draft head, whose FFN is of the same kind. The blocks are models/blocks.c,
 * memory, batching, graphs and the forward driver the engine's (src/engine/); the LM head's
 * Q4_0 copy for drafting is made here.
 * Reference: ../shared/docs/arch-qwen35.md; llama.cpp src/models/qwen35.cpp and qwen35moe.cpp
 * (behaviour). */
#include "models/qwen35.h"
#include "models/blocks.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Sizes beyond these are rejected at load: they bound on-stack scratch in the backends and
 * are far above any published Qwen3.5 shape (head dim 256, state 128). */
#define QWEN35_MAX_HEAD_DIM 512
#define QWEN35_MAX_STATE 256
#define QWEN35_MAX_LAYERS 512
/* Every width the forward forms from hparams (a projection's rows, a state's elements) is
 * bounded here, so the file's int arithmetic on them cannot overflow on absurd metadata. */
#define QWEN35_MAX_WIDTH (1 << 24)

/* The NextN head's own tensors, beside its attention + FFN block. */
struct nextn_weights {
    struct bweight eh_proj;
    float *enorm, *hnorm;
    float *head_norm;                    /* NULL: the trunk's output_norm */
};

struct layer {
    unsigned kind;                       /* QWEN35_LAYER_* */
    float *attn_norm, *post_norm;
    struct gated_attn_weights at;
    struct delta_net_weights dn;
    struct glu_ffn_weights ffn;
    struct moe_ffn_weights moe;
    struct nextn_weights nx;
    int mem_il;                          /* its layer in the memory's KV cache or recurrent state */
};

struct globals {
    struct bweight tok_embd, lm_head;    /* lm_head.data == tok_embd.data: tied */
    float *out_norm;
};

#define L_ATTN QWEN35_LAYER_ATTN
#define L_DELTA QWEN35_LAYER_DELTA
#define L_NEXTN QWEN35_LAYER_NEXTN
#define L_DENSE QWEN35_LAYER_DENSE
#define L_MOE QWEN35_LAYER_MOE
#define W(x) QWEN35_W_##x
#define MAT(name, layers, in, out, field) {name, WEIGHT_MATRIX, layers, W(in), W(out), field, WEIGHT_REQUIRED, WEIGHT_INIT_MATRIX}
#define VEC(name, layers, in, out, field, init) {name, WEIGHT_VECTOR, layers, W(in), W(out), field, WEIGHT_REQUIRED, WEIGHT_INIT_##init}
#define LY(f) offsetof(struct layer, f)
#define GL(f) offsetof(struct globals, f)
#define EXPERTS(name, in, out, field, presence) \
    {name, WEIGHT_EXPERTS, L_MOE, W(in), W(out), field, WEIGHT_##presence, WEIGHT_INIT_MATRIX}

/* In the converter's order (arch-qwen35.md §4): globals, then per block its attention or delta
 * net, its FFN, and the NextN extras. */
const struct weight_desc qwen35_tensors[] = {
    MAT("token_embd.weight", 0, EMBD, VOCAB, GL(tok_embd)),
    VEC("output_norm.weight", 0, EMBD, ONE, GL(out_norm), NORM),
    {"output.weight", WEIGHT_MATRIX, 0, W(EMBD), W(VOCAB), GL(lm_head), WEIGHT_TIED, WEIGHT_INIT_MATRIX},
    VEC("blk.%d.attn_norm.weight", L_ATTN | L_DELTA, EMBD, ONE, LY(attn_norm), NORM),
    MAT("blk.%d.attn_q.weight", L_ATTN, EMBD, QG, LY(at.q)),
    MAT("blk.%d.attn_k.weight", L_ATTN, EMBD, KV, LY(at.k)),
    MAT("blk.%d.attn_v.weight", L_ATTN, EMBD, KV, LY(at.v)),
    MAT("blk.%d.attn_output.weight", L_ATTN, HD, EMBD, LY(at.o)),
    VEC("blk.%d.attn_q_norm.weight", L_ATTN, HEAD_DIM, ONE, LY(at.q_norm), NORM),
    VEC("blk.%d.attn_k_norm.weight", L_ATTN, HEAD_DIM, ONE, LY(at.k_norm), NORM),
    MAT("blk.%d.attn_qkv.weight", L_DELTA, EMBD, SSM_CH, LY(dn.qkv)),
    MAT("blk.%d.attn_gate.weight", L_DELTA, EMBD, SSM_NVD, LY(dn.gate)),
    VEC("blk.%d.ssm_conv1d.weight", L_DELTA, CONV, SSM_CH, LY(dn.conv), CONV), /* 2-D, kept F32 */
    VEC("blk.%d.ssm_dt.bias", L_DELTA, SSM_NV, ONE, LY(dn.dt_bias), BIAS),
    VEC("blk.%d.ssm_a", L_DELTA, SSM_NV, ONE, LY(dn.a), DECAY),
    MAT("blk.%d.ssm_beta.weight", L_DELTA, EMBD, SSM_NV, LY(dn.beta)),
    MAT("blk.%d.ssm_alpha.weight", L_DELTA, EMBD, SSM_NV, LY(dn.alpha)),
    VEC("blk.%d.ssm_norm.weight", L_DELTA, SSM_DV, ONE, LY(dn.norm), NORM),
    MAT("blk.%d.ssm_out.weight", L_DELTA, SSM_NVD, EMBD, LY(dn.out)),
    VEC("blk.%d.post_attention_norm.weight", L_ATTN | L_DELTA, EMBD, ONE, LY(post_norm), NORM),
    MAT("blk.%d.ffn_gate.weight", L_DENSE, EMBD, FF, LY(ffn.gate)),
    MAT("blk.%d.ffn_up.weight", L_DENSE, EMBD, FF, LY(ffn.up)),
    MAT("blk.%d.ffn_down.weight", L_DENSE, FF, EMBD, LY(ffn.down)),
    MAT("blk.%d.ffn_gate_inp.weight", L_MOE, EMBD, EXPERTS, LY(moe.gate_inp)),
    EXPERTS("blk.%d.ffn_gate_exps.weight", EMBD, FF_EXP, LY(moe.gate_exps), OPTIONAL),
    EXPERTS("blk.%d.ffn_up_exps.weight", EMBD, FF_EXP, LY(moe.up_exps), OPTIONAL),
    EXPERTS("blk.%d.ffn_gate_up_exps.weight", EMBD, FF_EXP2, LY(moe.gate_up_exps), ALTERNATIVE),
    EXPERTS("blk.%d.ffn_down_exps.weight", FF_EXP, EMBD, LY(moe.down_exps), REQUIRED),
    MAT("blk.%d.ffn_gate_inp_shexp.weight", L_MOE, EMBD, ONE, LY(moe.gate_inp_shexp)), /* 1-D */
    MAT("blk.%d.ffn_gate_shexp.weight", L_MOE, EMBD, FF_SHEXP, LY(moe.gate_shexp)),
    MAT("blk.%d.ffn_up_shexp.weight", L_MOE, EMBD, FF_SHEXP, LY(moe.up_shexp)),
    MAT("blk.%d.ffn_down_shexp.weight", L_MOE, FF_SHEXP, EMBD, LY(moe.down_shexp)),
    MAT("blk.%d.nextn.eh_proj.weight", L_NEXTN, EMBD2, EMBD, LY(nx.eh_proj)),
    VEC("blk.%d.nextn.enorm.weight", L_NEXTN, EMBD, ONE, LY(nx.enorm), NORM),
    VEC("blk.%d.nextn.hnorm.weight", L_NEXTN, EMBD, ONE, LY(nx.hnorm), NORM),
    {"blk.%d.nextn.shared_head_norm.weight", WEIGHT_VECTOR, L_NEXTN, W(EMBD), W(ONE), LY(nx.head_norm),
     WEIGHT_OPTIONAL, WEIGHT_INIT_NORM},
};
const int qwen35_n_tensors = (int)COTI_ARRAY_LEN(qwen35_tensors);

#undef MAT
#undef VEC
#undef EXPERTS
#undef LY
#undef GL

void qwen35_widths(const struct qwen35_hparams *hp, int64_t w[QWEN35_N_WIDTHS]) {
    const int64_t D = hp->head_dim;
    w[W(ONE)] = 1;
    w[W(EMBD)] = hp->n_embd;
    w[W(EMBD2)] = 2 * (int64_t)hp->n_embd;
    w[W(FF)] = hp->n_ff;
    w[W(VOCAB)] = hp->n_vocab;
    w[W(QG)] = 2 * hp->n_head * D;
    w[W(HD)] = hp->n_head * D;
    w[W(KV)] = hp->n_head_kv * D;
    w[W(HEAD_DIM)] = D;
    w[W(SSM_CH)] = hp->ssm_ch;
    w[W(SSM_NVD)] = (int64_t)hp->ssm_nv * hp->ssm_dv;
    w[W(SSM_NV)] = hp->ssm_nv;
    w[W(SSM_DV)] = hp->ssm_dv;
    w[W(CONV)] = hp->ssm_k;
    w[W(EXPERTS)] = hp->n_expert;
    w[W(FF_EXP)] = hp->n_ff_exp;
    w[W(FF_EXP2)] = 2 * (int64_t)hp->n_ff_exp;
    w[W(FF_SHEXP)] = hp->n_ff_shexp;
}

/* Append [start, start + len) to r, merged with the last run where they touch. */
static void run_add(struct weight_shard_runs *r, int64_t start, int64_t len) {
    if (r->n && r->start[r->n - 1] + r->len[r->n - 1] == start) { r->len[r->n - 1] += len; return; }
    r->start[r->n] = start;
    r->len[r->n++] = len;
}

int qwen35_shard(const struct qwen35_hparams *hp, int rank, int n, struct qwen35_hparams *local,
                 struct weight_shard_runs runs[QWEN35_N_WIDTHS], char *err, size_t err_size) {
    memset(runs, 0, sizeof(struct weight_shard_runs) * QWEN35_N_WIDTHS);
    *local = *hp;
    if (n == 1) return 0;
    if (n < 1 || rank < 0 || rank >= n)
        return coti_fail(err, err_size, COTI_E_ARG, "rank %d of %d", rank, n);
    if (hp->n_expert)
        return coti_fail(err, err_size, COTI_E_UNSUPPORTED, "a tensor-parallel split of a mixture of experts is not built yet");
    if (hp->n_head_kv % n || hp->ssm_nk % n || hp->n_ff % n)
        return coti_fail(err, err_size, COTI_E_UNSUPPORTED,
                         "%d ranks do not divide the KV heads (%d), the delta-net key heads (%d) and the feed-forward "
                         "width (%d)", n, hp->n_head_kv, hp->ssm_nk, hp->n_ff);
    const int64_t D = hp->head_dim, G = hp->n_head / hp->n_head_kv, kvr = hp->n_head_kv / n, kv0 = rank * kvr;
    const int64_t dk = hp->ssm_dk, dv = hp->ssm_dv, nk = hp->ssm_nk, nkr = nk / n, k0 = rank * nkr;
    const int64_t ffr = hp->n_ff / n;
    local->n_head = (int)(kvr * G);
    local->n_head_kv = (int)kvr;
    local->ssm_nk = (int)nkr;
    local->ssm_nv = hp->ssm_nv / n;
    local->ssm_ch = 2 * local->ssm_nk * local->ssm_dk + local->ssm_nv * local->ssm_dv;
    local->n_ff = (int)ffr;
    run_add(&runs[W(QG)], kv0 * G * 2 * D, kvr * G * 2 * D);
    run_add(&runs[W(HD)], kv0 * G * D, kvr * G * D);
    run_add(&runs[W(KV)], kv0 * D, kvr * D);
    run_add(&runs[W(FF)], rank * ffr, ffr);
    /* the conv channels: q of the rank's k-heads, k of them, v of the v-heads that use them */
    run_add(&runs[W(SSM_CH)], k0 * dk, nkr * dk);
    run_add(&runs[W(SSM_CH)], nk * dk + k0 * dk, nkr * dk);
    for (int64_t h = 0; h < hp->ssm_nv; h++) {
        if (h % nk < k0 || h % nk >= k0 + nkr) continue;
        run_add(&runs[W(SSM_CH)], 2 * nk * dk + h * dv, dv);
        run_add(&runs[W(SSM_NVD)], h * dv, dv);
        run_add(&runs[W(SSM_NV)], h, 1);
    }
    return 0;
}

unsigned qwen35_layer_kind(const struct qwen35_hparams *hp, int il) {
    const unsigned ffn = hp->n_expert ? L_MOE : L_DENSE;
    if (il >= hp->n_layer) return L_ATTN | L_NEXTN | ffn;    /* arch-qwen35.md §3 */
    return ((il + 1) % hp->interval ? L_DELTA : L_ATTN) | ffn;
}

/* Activation scratch for n_batch rows besides the blocks': the residual stream (x, x2), a
 * block's output (m) and the NextN head's concatenated input (cat). */
struct scratch {
    struct block_scratch b;
    float *x, *x2, *m, *cat;
};

struct qwen35 {
    struct model base;
    struct qwen35_hparams hp;
    struct attn_shape attn;
    struct delta_net_shape delta;
    struct moe_shape moe;
    struct layer *layers;                /* [n_layer_all]: the trunk, then the NextN block */
    struct globals g;
    /* The NextN head's drafts use a Q4_0 copy of the LM head when the LM head has more bits:
     * the head's logits are read once per draft token and a draft only has to be probable,
     * not exact (the target verifies it). draft_head_host holds its bytes. */
    struct bweight draft_head;
    void *draft_head_host;
    struct scratch s;
    struct engine eng;
    struct weight_shard_runs shard[QWEN35_N_WIDTHS]; /* a tensor-parallel rank's (model_params.tp_n > 1) */
    int64_t shard_whole[QWEN35_N_WIDTHS];
};

static struct qwen35 *q35(struct model *m) { return (struct qwen35 *)m; }

/* ---- loading ------------------------------------------------------------------------ */

/* qwen35moe's expert hparams (llama.cpp's defaults: expert FFN n_ff / n_used, shared n_ff). */
static int read_moe_hparams(const struct weight_loader *L, struct qwen35_hparams *hp) {
    int rc = 0;
    if ((rc = weights_get_u32(L, "expert_count", &hp->n_expert))) return rc;
    if ((rc = weights_get_u32(L, "expert_used_count", &hp->n_expert_used))) return rc;
    const int ff_exp_default = hp->n_expert_used > 0 ? hp->n_ff / hp->n_expert_used : 0;
    if ((rc = weights_get_u32_opt(L, "expert_feed_forward_length", &hp->n_ff_exp, ff_exp_default))) return rc;
    if ((rc = weights_get_u32_opt(L, "expert_shared_feed_forward_length", &hp->n_ff_shexp, hp->n_ff))) return rc;
    if ((rc = block_moe_check_shape(L, &(struct moe_shape){hp->n_expert, hp->n_expert_used, hp->n_ff_exp}, hp->n_embd,
                                    QWEN35_MAX_WIDTH)))
        return rc;
    if (hp->n_ff_shexp < 1 || hp->n_ff_shexp > QWEN35_MAX_WIDTH)
        return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "expert_shared_feed_forward_length %d is out of range [1, %d]",
                         hp->n_ff_shexp, QWEN35_MAX_WIDTH);
    return 0;
}

static int read_hparams(const struct weight_loader *L, struct qwen35_hparams *hp, bool moe) {
    int rc = 0;
    if ((rc = weights_get_u32(L, "block_count", &hp->n_layer_all))) return rc;
    if ((rc = weights_get_u32_opt(L, "nextn_predict_layers", &hp->n_mtp, 0))) return rc;
    if ((rc = weights_get_u32_opt(L, "context_length", &hp->n_ctx_train, 4096))) return rc;
    if ((rc = weights_get_u32(L, "embedding_length", &hp->n_embd))) return rc;
    if ((rc = moe ? weights_get_u32_opt(L, "feed_forward_length", &hp->n_ff, 0)
                  : weights_get_u32(L, "feed_forward_length", &hp->n_ff)))
        return rc;
    if ((rc = weights_get_u32(L, "attention.head_count", &hp->n_head))) return rc;
    if ((rc = weights_get_u32_opt(L, "attention.head_count_kv", &hp->n_head_kv, hp->n_head))) return rc;
    if (hp->n_head < 1 || hp->n_head_kv < 1 || hp->n_head % hp->n_head_kv)
        return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "head_count %d must be a positive multiple of head_count_kv %d",
                         hp->n_head, hp->n_head_kv);
    if ((rc = weights_get_u32_opt(L, "attention.key_length", &hp->head_dim, hp->n_embd / hp->n_head))) return rc;
    int vlen;
    if ((rc = weights_get_u32_opt(L, "attention.value_length", &vlen, hp->head_dim))) return rc;
    if (vlen != hp->head_dim)
        return coti_fail(L->err, L->err_size, COTI_E_UNSUPPORTED, "value_length %d != key_length %d", vlen, hp->head_dim);
    if ((rc = weights_get_u32_opt(L, "rope.dimension_count", &hp->n_rot, hp->head_dim))) return rc;
    if ((rc = weights_get_u32(L, "ssm.conv_kernel", &hp->ssm_k))) return rc;
    int inner;
    if ((rc = weights_get_u32(L, "ssm.inner_size", &inner))) return rc;
    if ((rc = weights_get_u32(L, "ssm.state_size", &hp->ssm_dk))) return rc;
    if ((rc = weights_get_u32(L, "ssm.time_step_rank", &hp->ssm_nv))) return rc;
    if ((rc = weights_get_u32(L, "ssm.group_count", &hp->ssm_nk))) return rc;
    if ((rc = weights_get_u32_opt(L, "full_attention_interval", &hp->interval, 4))) return rc;
    if ((rc = weights_get_f32(L, "attention.layer_norm_rms_epsilon", &hp->eps))) return rc;
    if ((rc = weights_get_f32_opt(L, "rope.freq_base", &hp->rope_base, 10000.0f))) return rc;

    if (hp->ssm_nv < 1 || hp->ssm_nk < 1 || hp->ssm_nv % hp->ssm_nk || inner % hp->ssm_nv)
        return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "ssm heads: time_step_rank %d, group_count %d, inner_size %d are inconsistent",
                         hp->ssm_nv, hp->ssm_nk, inner);
    hp->ssm_dv = inner / hp->ssm_nv;
    if (hp->ssm_dv != hp->ssm_dk)
        return coti_fail(L->err, L->err_size, COTI_E_UNSUPPORTED, "delta-net value head dim %d != key head dim %d", hp->ssm_dv, hp->ssm_dk);
    const int64_t widths[] = {
        hp->n_embd, 2 * (int64_t)hp->n_embd, moe ? 1 : hp->n_ff, 2 * (int64_t)hp->n_head * hp->head_dim,
        (int64_t)hp->n_head_kv * hp->head_dim, 2 * (int64_t)hp->ssm_nk * hp->ssm_dk + (int64_t)hp->ssm_nv * hp->ssm_dv,
        (int64_t)hp->ssm_nv * hp->ssm_dk * hp->ssm_dv,
    };
    for (size_t i = 0; i < COTI_ARRAY_LEN(widths); i++)
        if (widths[i] < 1 || widths[i] > QWEN35_MAX_WIDTH)
            return coti_fail(L->err, L->err_size, COTI_E_FORMAT,
                             "hparams out of range: embedding %d, feed-forward %d, heads %d/%d x %d, ssm %d x %d x %d "
                             "(a width is %lld, the limit %d)",
                             hp->n_embd, hp->n_ff, hp->n_head, hp->n_head_kv, hp->head_dim, hp->ssm_nv, hp->ssm_nk,
                             hp->ssm_dk, (long long)widths[i], QWEN35_MAX_WIDTH);
    hp->ssm_ch = 2 * hp->ssm_nk * hp->ssm_dk + hp->ssm_nv * hp->ssm_dv;
    hp->n_layer = hp->n_layer_all - hp->n_mtp;
    if (hp->n_layer_all > QWEN35_MAX_LAYERS || hp->n_mtp < 0 || hp->n_mtp > 1 || hp->n_layer < 1)
        return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "block_count %d with nextn_predict_layers %d is out of range (at most 1 NextN layer)",
                         hp->n_layer_all, hp->n_mtp);
    if (hp->head_dim < 2 || hp->head_dim > QWEN35_MAX_HEAD_DIM || hp->n_rot < 2 || hp->n_rot > hp->head_dim || hp->n_rot % 2)
        return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "head_dim %d / rope dims %d out of range", hp->head_dim, hp->n_rot);
    if (hp->ssm_dk < 1 || hp->ssm_dk > QWEN35_MAX_STATE || hp->ssm_k < 1 || hp->ssm_k > 16 || hp->interval < 1)
        return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "ssm state %d / conv kernel %d / interval %d out of range",
                         hp->ssm_dk, hp->ssm_k, hp->interval);
    if (!(hp->eps > 0.0f && hp->eps < 1.0f) || !(hp->rope_base > 1.0f))
        return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "rms eps %g / rope base %g out of range", hp->eps, hp->rope_base);
    if (hp->n_ff < 0 || hp->n_ff > QWEN35_MAX_WIDTH)
        return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "feed_forward_length %d out of range", hp->n_ff);
    return moe ? read_moe_hparams(L, hp) : 0;
}

/* q->draft_head: the LM head requantized to Q4_0 (via f32, llama.cpp's reference rounding)
 * when it has more than 4.5 bits per weight and the backend computes Q4_0; else the LM head
 * itself. Acceptance with it: docs/notes/2026-11-29-packed-q8_0.md. */
static int make_draft_head(const struct weight_loader *L, struct qwen35 *q) {
    const struct gguf_tensor *t = gguf_find_tensor(L->g, "output.weight");
    if (!t) t = gguf_find_tensor(L->g, "token_embd.weight");
    const struct ggml_type_traits *tr = ggml_type_traits_get(q->g.lm_head.type);
    q->draft_head = q->g.lm_head;
    if (!t || !tr || (double)tr->block_bytes * 8.0 / tr->block_elems <= 4.5 || q->hp.n_embd % 32) return 0;
    return weights_requant_q4_0(L, t, q->hp.n_embd, q->hp.n_vocab, &q->draft_head, &q->draft_head_host);
}

static void qwen35_free(struct model *m) {
    struct qwen35 *q = q35(m);
    struct backend *be = m->be;
    engine_free(&q->eng);
    for (int il = 0; q->layers && il < q->hp.n_layer_all; il++)
        weights_unbind(be, qwen35_tensors, qwen35_n_tensors, q->layers[il].kind, &q->layers[il]);
    free(q->layers);
    if (q->draft_head_host) {
        if (q->draft_head.data) be->weight_free(be, &q->draft_head);
        free(q->draft_head_host);
    }
    /* a tied head shares the embedding's storage: free it once */
    if (q->g.lm_head.data == q->g.tok_embd.data) q->g.lm_head = (struct bweight){0};
    weights_unbind(be, qwen35_tensors, qwen35_n_tensors, 0, &q->g);
    gguf_close(m->gguf);
    free(q);
}

static void trunk_pass(struct model *m, const struct slice_ops_args *a);
static void nextn_pass(struct model *m, const struct slice_ops_args *a);

/* The engine: activation buffers, memory (a KV layer per attention block, a recurrent layer
 * per delta net, the NextN head's own KV) and the passes. */
static int init_engine(struct qwen35 *q) {
    struct model *m = &q->base;
    const struct qwen35_hparams *hp = &q->hp;
    const size_t nb = (size_t)m->n_batch, f = sizeof(float);
    const size_t HD = (size_t)hp->n_head * hp->head_dim, KV = (size_t)hp->n_head_kv * hp->head_dim;
    const size_t NVD = (size_t)hp->ssm_nv * hp->ssm_dv, E = (size_t)hp->n_embd;
    /* a MoE's router rows, chosen experts and weights, per-slot [gate ; up] and output rows; its
     * shared expert uses the dense FFN's buffers */
    const size_t FF = (size_t)COTI_MAX(hp->n_ff, hp->n_ff_shexp), NE = (size_t)COTI_MAX(hp->n_expert, 1);
    const size_t K = (size_t)COTI_MAX(hp->n_expert_used, 1), FE = (size_t)hp->n_ff_exp;
    struct scratch *s = &q->s;
#define SLOT(p, n) {(void **)&(p), f * nb * (n)}
    const struct arena_slot slots[] = {
        SLOT(s->x, E), SLOT(s->x2, E), SLOT(s->b.a, E), SLOT(s->m, E), SLOT(s->b.qg, 2 * HD), SLOT(s->b.k, KV),
        SLOT(s->b.v, KV), SLOT(s->b.att, HD), SLOT(s->b.qkv, (size_t)hp->ssm_ch), SLOT(s->b.z, NVD),
        SLOT(s->b.bet, (size_t)hp->ssm_nv), SLOT(s->b.alp, (size_t)hp->ssm_nv), SLOT(s->b.y, (size_t)hp->ssm_ch),
        SLOT(s->b.o, NVD), SLOT(s->b.og, NVD), SLOT(s->b.fg, FF), SLOT(s->b.fu, FF),
        SLOT(s->cat, 2 * E),
        SLOT(s->b.logits, NE), SLOT(s->b.ids, K), SLOT(s->b.wts, K), SLOT(s->b.gu, K * 2 * FE),
        SLOT(s->b.ye, hp->n_expert ? K * E : 1), SLOT(s->b.sh_gate, 1), SLOT(s->b.sh, hp->n_expert ? E : 1),
    };
#undef SLOT
    struct kv_layer_spec *kv = calloc((size_t)hp->n_layer + 1, sizeof *kv);
    if (!kv) return COTI_E_NOMEM;
    int n_kv = 0, n_rec = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        struct layer *ly = &q->layers[il];
        if (ly->kind & L_DELTA) ly->mem_il = n_rec++;
        else kv[ly->mem_il = n_kv++] = (struct kv_layer_spec){hp->n_head_kv, hp->head_dim, -1, 0};
    }
    const struct kv_layer_spec head = {hp->n_head_kv, hp->head_dim, -1, 0};
    const struct memory_params mp = {.n_seq = m->n_seq, .n_ctx = m->n_ctx, .n_keep = m->n_keep_states,
                                     .kv = kv, .n_kv = n_kv, .n_rec = n_rec,
                                     .conv_elems = (size_t)(hp->ssm_k - 1) * hp->ssm_ch,
                                     .rule = {hp->ssm_nv, hp->ssm_dk, hp->ssm_dv},
                                     .head_kv = &head, .n_head_kv = hp->n_mtp,
                                     .k_type = m->cache_type_k, .v_type = m->cache_type_v};
    const struct engine_params ep = {.n_vocab = hp->n_vocab, .n_embd = hp->n_embd, .mem = &mp, .slots = slots,
                                     .n_slots = (int)COTI_ARRAY_LEN(slots),
                                     .passes = {trunk_pass, hp->n_mtp ? nextn_pass : NULL},
                                     .lm_head = &q->g.lm_head, .draft_head = &q->draft_head};
    int rc = engine_init(&q->eng, m, &ep);
    free(kv);
    return rc;
}

static const struct model_vtable qwen35_vtable;

static int load(struct model **out, struct gguf_file *g, struct backend *be, const struct model_params *p, char *err,
                size_t err_size, const char *arch) {
    const bool moe = !strcmp(arch, "qwen35moe");
    struct weight_loader L = {g, be, arch, err, err_size, p->progress, NULL, NULL};
    struct qwen35 *q = calloc(1, sizeof(*q));
    if (!q) return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory");
    struct model *m = &q->base;
    model_base_init(m, &qwen35_vtable, be, p);
    struct qwen35_hparams *hp = &q->hp;
    int rc = read_hparams(&L, hp, moe);
    if (rc) { free(q); return rc; }
    struct qwen35_hparams whole = *hp;
    if (p->tp_n > 1) { /* a rank of a tensor-parallel split: its share of the heads and widths */
        if ((rc = qwen35_shard(&whole, p->tp_rank, p->tp_n, hp, q->shard, err, err_size))) { free(q); return rc; }
        L.shard = q->shard;
        L.shard_whole = q->shard_whole;
    }
    m->gguf = g; /* owned once loading succeeds: qwen35_free closes it */

    const struct gguf_tensor *te = gguf_find_tensor(g, "token_embd.weight");
    if (!te || te->n_dims != 2 || te->ne[0] != hp->n_embd || te->ne[1] < 1 || te->ne[1] > (1 << 24)) {
        rc = coti_fail(err, err_size, COTI_E_FORMAT, "token_embd.weight missing or not {%d, n_vocab}", hp->n_embd);
        goto fail;
    }
    hp->n_vocab = whole.n_vocab = (int)te->ne[1];
    qwen35_widths(&whole, q->shard_whole); /* the file's shapes (a rank's split tensors are checked against them) */
    q->attn = (struct attn_shape){hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_rot, hp->rope_base};
    q->delta = (struct delta_net_shape){hp->ssm_k, hp->ssm_ch, hp->ssm_nk, hp->ssm_nv, hp->ssm_dk, hp->ssm_dv};
    q->moe = (struct moe_shape){hp->n_expert, hp->n_expert_used, hp->n_ff_exp};
    int64_t widths[QWEN35_N_WIDTHS];
    qwen35_widths(hp, widths);
    if ((rc = weights_bind(&L, qwen35_tensors, qwen35_n_tensors, 0, 0, &q->g, widths))) goto fail;
    if (!q->g.lm_head.data) q->g.lm_head = q->g.tok_embd; /* tied */
    q->layers = calloc((size_t)hp->n_layer_all, sizeof(struct layer));
    if (!q->layers) { rc = coti_fail(err, err_size, COTI_E_NOMEM, "out of memory"); goto fail; }
    for (int il = 0; il < hp->n_layer_all; il++) {
        q->layers[il].kind = qwen35_layer_kind(hp, il);
        if ((rc = weights_bind(&L, qwen35_tensors, qwen35_n_tensors, q->layers[il].kind, il, &q->layers[il], widths)))
            goto fail;
        if (moe && (rc = block_moe_finish_load(&L, &q->layers[il].moe,
                                                &(struct moe_shape){hp->n_expert, hp->n_expert_used, hp->n_ff_exp},
                                                hp->n_embd, il)))
            goto fail;
    }
    if (hp->n_mtp) {
        char n1[128], n2[128];
        snprintf(n1, sizeof n1, "blk.%d.nextn.embed_tokens.weight", hp->n_layer);
        snprintf(n2, sizeof n2, "blk.%d.nextn.shared_head_head.weight", hp->n_layer);
        if (gguf_find_tensor(g, n1) || gguf_find_tensor(g, n2)) {
            rc = coti_fail(err, err_size, COTI_E_UNSUPPORTED, "separate NextN embedding/head tensors are not supported");
            goto fail;
        }
        if ((rc = make_draft_head(&L, q))) goto fail;
    }
    if ((rc = init_engine(q))) {
        rc = engine_init_fail(m, rc, err, err_size);
        goto fail;
    }
    m->info = (struct model_info){.arch = moe ? "qwen35moe" : "qwen35", .n_vocab = hp->n_vocab, .n_embd = hp->n_embd,
                                  .n_layer = hp->n_layer,
                                  .n_ctx_train = hp->n_ctx_train, .has_mtp = hp->n_mtp == 1, .has_recurrent = true};
    *out = m;
    return 0;
fail:
    m->gguf = NULL; /* on failure the caller keeps the file (model_load closes it) */
    qwen35_free(m);
    return rc;
}

int qwen35_load(struct model **out, struct gguf_file *g, struct backend *be, const struct model_params *p, char *err,
                size_t err_size) {
    return load(out, g, be, p, err, err_size, "qwen35");
}

int qwen35moe_load(struct model **out, struct gguf_file *g, struct backend *be, const struct model_params *p,
                   char *err, size_t err_size) {
    return load(out, g, be, p, err, err_size, "qwen35moe");
}

/* ---- passes --------------------------------------------------------------------------- */

static struct block_ctx block_ctx(struct qwen35 *q) {
    return (struct block_ctx){q->base.be, &q->s.b, &q->eng.meta, q->hp.eps};
}

/* The block's FFN: dense or routed, as its kind says. */
static void block_ffn(const struct qwen35 *q, const struct block_ctx *c, const struct layer *ly,
                      const struct block_in *in, int n) {
    if (ly->kind & L_MOE) block_moe_ffn(c, &ly->moe, &q->moe, in, n, q->s.m);
    else block_glu_ffn(c, &ly->ffn, in, n, q->s.m);
}

static void trunk_pass(struct model *m, const struct slice_ops_args *a) {
    struct qwen35 *q = q35(m);
    struct backend *be = m->be;
    const struct block_ctx c = block_ctx(q);
    const int n = a->sl->n;
    be->get_rows(be, &q->g.tok_embd, a->ids, n, q->s.x);
    /* the residual stream alternates between s.x and s.x2: a fused add writes the other one */
    float *x = q->s.x, *x_next = q->s.x2;
    for (int il = 0; il < q->hp.n_layer; il++) {
        const struct layer *ly = &q->layers[il];
        const struct block_in in = {x, il ? q->s.m : NULL, ly->attn_norm, x_next};
        if (ly->kind & L_DELTA)
            block_delta_net(&c, &ly->dn, &q->delta, &q->eng.mem.rec, ly->mem_il, &in, a->sl, a->keep, q->s.m);
        else
            block_gated_attn(&c, &ly->at, &q->attn, &q->eng.mem.kv.layers[ly->mem_il], &in, n, q->s.m);
        if (il) { float *t = x; x = x_next; x_next = t; }
        const struct block_in ffn_in = {x, q->s.m, ly->post_norm, x_next};
        block_ffn(q, &c, ly, &ffn_in, n);
        float *t = x; x = x_next; x_next = t;
    }
    be->add_rmsnorm(be, x, q->s.m, q->g.out_norm, n, q->hp.n_embd, q->hp.eps, a->hn);
    block_lm_head(&q->eng, a);
}

static void nextn_pass(struct model *m, const struct slice_ops_args *a) {
    struct qwen35 *q = q35(m);
    struct backend *be = m->be;
    const struct block_ctx c = block_ctx(q);
    const struct layer *ly = &q->layers[q->hp.n_layer];
    const int E = q->hp.n_embd, n = a->sl->n;
    /* u = eh_proj · [enorm(embed(x)) ; hnorm(h_in)] */
    be->get_rows(be, &q->g.tok_embd, a->ids, n, q->s.x2);
    backend_matmul(be, &ly->nx.eh_proj,
                   &(struct matmul_in){.kind = MATMUL_NORM2, .x = q->s.x2, .m = a->h_in, .w = ly->nx.enorm,
                                       .w2 = ly->nx.hnorm, .dim = E, .eps = q->hp.eps, .a = q->s.cat},
                   n, q->s.x);
    const struct block_in in = {q->s.x, NULL, ly->attn_norm, NULL};
    block_gated_attn(&c, &ly->at, &q->attn, &q->eng.mem.head.layers[0], &in, n, q->s.m);
    const struct block_in ffn_in = {q->s.x, q->s.m, ly->post_norm, q->s.x2};
    block_ffn(q, &c, ly, &ffn_in, n);
    be->add_rmsnorm(be, q->s.x2, q->s.m, ly->nx.head_norm ? ly->nx.head_norm : q->g.out_norm, n, E, q->hp.eps, a->hn);
    block_lm_head(&q->eng, a);
}

static const struct model_vtable qwen35_vtable = {
    .free = qwen35_free,
    .forward = engine_forward,
    .seq_reset = engine_seq_reset,
    .seq_rollback = engine_seq_rollback,
    .seq_copy = engine_seq_copy,
    .seq_state_read = engine_seq_state_read,
    .nextn = &engine_nextn,
};
