/* gemma4.c — the Gemma 4 dense architecture (`gemma4`): hparams from GGUF metadata (per-layer
 * arrays), its tensor table, and the block order of its trunk: per layer a pre-normed attention
 * (sliding-window or full, each with its own head size, rope base and rotation; q/k normed with
 * weights, v without; scale 1) and a GeGLU FFN, each output normed before its residual add, the
 * layer scaled by its output scale; √D-scaled embeddings; a soft-capped, usually tied, LM head.
 * The E-series (E2B/E4B) features: layers past n_layer - shared_kv_layers read an earlier
 * layer's K/V, and per-layer embeddings (PLE: every layer adds a gated projection of its own P
 * wide input, formed once per token from a second embedding table and a projection of the
 * token's embedding). 26B-A4B's MoE layers (those whose router is in the file) add to the dense
 * FFN's normed output the normed sum of routed GeGLU experts, which read their own norm of the
 * layer input; the router reads its unweighted norm times a scale vector, over √E.
 * Reference: ../shared/docs/arch-gemma4.md; llama.cpp src/models/gemma4.cpp (behaviour). */
#include "models/gemma4.h"
#include "models/blocks.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GEMMA4_MAX_HEAD_DIM 512
#define GEMMA4_MAX_WIDTH (1 << 24)

struct layer {
    unsigned kind;                       /* GEMMA4_LAYER_* */
    float *attn_norm, *q_norm, *k_norm, *post_attn_norm, *ffn_norm, *post_ffw_norm;
    struct bweight q, k, v, o;           /* v absent: V is the K projection */
    struct glu_ffn_weights ffn;
    float out_scale;                     /* layer_output_scale, 1 when absent */
    int kv_src;                          /* the memory layer whose K/V it reads */
    struct bweight ple_gate, ple_proj;   /* PLE: E -> P gate, P -> E projection */
    float *ple_post_norm;
    struct moe_ffn_weights moe;          /* MoE: router and experts (no shared expert: the dense FFN) */
    float *router_scale, *exp_norm, *post_ffw_norm_1, *post_ffw_norm_2;
    float *down_scale;                   /* per expert, optional */
};

struct globals {
    struct bweight tok_embd, lm_head;    /* lm_head.data == tok_embd.data: tied */
    float *out_norm, *rope_freqs;        /* rope_freqs: full layers' pair factors, or NULL */
    struct bweight ple_embd, ple_model_proj; /* PLE: [P·n_layer] per token; E -> P·n_layer */
    float *ple_proj_norm;                /* [P], shared by every layer's slice */
};

#define L_SWA GEMMA4_LAYER_SWA
#define L_FULL GEMMA4_LAYER_FULL
#define L_KV GEMMA4_LAYER_KV
#define L_PLE GEMMA4_LAYER_PLE
#define L_MOE GEMMA4_LAYER_MOE
#define L_ALL (L_SWA | L_FULL)
#define W(x) GEMMA4_W_##x
#define MAT(name, layers, in, out, field) {name, WEIGHT_MATRIX, layers, W(in), W(out), field, WEIGHT_REQUIRED, WEIGHT_INIT_MATRIX}
#define VEC(name, layers, in, field) {name, WEIGHT_VECTOR, layers, W(in), W(ONE), field, WEIGHT_REQUIRED, WEIGHT_INIT_NORM}
#define EXPERTS(name, in, out, field, presence) \
    {name, WEIGHT_EXPERTS, L_MOE, W(in), W(out), field, WEIGHT_##presence, WEIGHT_INIT_MATRIX}
#define LY(f) offsetof(struct layer, f)
#define GL(f) offsetof(struct globals, f)

/* In the converter's order: rope factors and the embeddings, each block, the output norm (the
 * PLE globals, optional here, are required when the metadata gives P > 0: gemma4_load). */
const struct weight_desc gemma4_tensors[] = {
    {"rope_freqs.weight", WEIGHT_VECTOR, 0, W(ROPE_FREQS), W(ONE), GL(rope_freqs), WEIGHT_OPTIONAL, WEIGHT_INIT_ROPE_FREQS},
    MAT("token_embd.weight", 0, EMBD, VOCAB, GL(tok_embd)),
    {"output.weight", WEIGHT_MATRIX, 0, W(EMBD), W(VOCAB), GL(lm_head), WEIGHT_TIED, WEIGHT_INIT_MATRIX},
    {"per_layer_token_embd.weight", WEIGHT_MATRIX, 0, W(PLE_ALL), W(VOCAB), GL(ple_embd), WEIGHT_OPTIONAL,
     WEIGHT_INIT_MATRIX},
    {"per_layer_model_proj.weight", WEIGHT_MATRIX, 0, W(EMBD), W(PLE_ALL), GL(ple_model_proj), WEIGHT_OPTIONAL,
     WEIGHT_INIT_MATRIX},
    {"per_layer_proj_norm.weight", WEIGHT_VECTOR, 0, W(PLE), W(ONE), GL(ple_proj_norm), WEIGHT_OPTIONAL, WEIGHT_INIT_NORM},
    VEC("blk.%d.attn_norm.weight", L_ALL, EMBD, LY(attn_norm)),
    MAT("blk.%d.attn_q.weight", L_ALL, EMBD, Q, LY(q)),
    MAT("blk.%d.attn_k.weight", L_KV, EMBD, KV, LY(k)),
    {"blk.%d.attn_v.weight", WEIGHT_MATRIX, L_KV, W(EMBD), W(KV), LY(v), WEIGHT_OPTIONAL, WEIGHT_INIT_MATRIX},
    MAT("blk.%d.attn_output.weight", L_ALL, Q, EMBD, LY(o)),
    VEC("blk.%d.attn_q_norm.weight", L_ALL, HEAD_DIM, LY(q_norm)),
    VEC("blk.%d.attn_k_norm.weight", L_KV, HEAD_DIM, LY(k_norm)),
    VEC("blk.%d.post_attention_norm.weight", L_ALL, EMBD, LY(post_attn_norm)),
    VEC("blk.%d.ffn_norm.weight", L_ALL, EMBD, LY(ffn_norm)),
    MAT("blk.%d.ffn_gate.weight", L_ALL, EMBD, FF, LY(ffn.gate)),
    MAT("blk.%d.ffn_up.weight", L_ALL, EMBD, FF, LY(ffn.up)),
    MAT("blk.%d.ffn_down.weight", L_ALL, FF, EMBD, LY(ffn.down)),
    VEC("blk.%d.post_ffw_norm.weight", L_ALL, EMBD, LY(post_ffw_norm)),
    MAT("blk.%d.inp_gate.weight", L_PLE, EMBD, PLE, LY(ple_gate)),
    MAT("blk.%d.proj.weight", L_PLE, PLE, EMBD, LY(ple_proj)),
    VEC("blk.%d.post_norm.weight", L_PLE, EMBD, LY(ple_post_norm)),
    MAT("blk.%d.ffn_gate_inp.weight", L_MOE, EMBD, EXPERTS, LY(moe.gate_inp)),
    VEC("blk.%d.ffn_gate_inp.scale", L_MOE, EMBD, LY(router_scale)),
    VEC("blk.%d.pre_ffw_norm_2.weight", L_MOE, EMBD, LY(exp_norm)),
    VEC("blk.%d.post_ffw_norm_1.weight", L_MOE, EMBD, LY(post_ffw_norm_1)),
    VEC("blk.%d.post_ffw_norm_2.weight", L_MOE, EMBD, LY(post_ffw_norm_2)),
    EXPERTS("blk.%d.ffn_gate_exps.weight", EMBD, FF_EXP, LY(moe.gate_exps), OPTIONAL),
    EXPERTS("blk.%d.ffn_up_exps.weight", EMBD, FF_EXP, LY(moe.up_exps), OPTIONAL),
    EXPERTS("blk.%d.ffn_gate_up_exps.weight", EMBD, FF_EXP2, LY(moe.gate_up_exps), ALTERNATIVE),
    EXPERTS("blk.%d.ffn_down_exps.weight", FF_EXP, EMBD, LY(moe.down_exps), REQUIRED),
    {"blk.%d.ffn_down_exps.scale", WEIGHT_VECTOR, L_MOE, W(EXPERTS), W(ONE), LY(down_scale), WEIGHT_OPTIONAL,
     WEIGHT_INIT_NORM},
    {"blk.%d.layer_output_scale.weight", WEIGHT_SCALAR, L_ALL, W(ONE), W(ONE), LY(out_scale), WEIGHT_OPTIONAL,
     WEIGHT_INIT_NORM},
    {"output_norm.weight", WEIGHT_VECTOR, WEIGHT_GLOBAL_LAST, W(EMBD), W(ONE), GL(out_norm), WEIGHT_REQUIRED,
     WEIGHT_INIT_NORM},
};
const int gemma4_n_tensors = (int)COTI_ARRAY_LEN(gemma4_tensors);

#undef MAT
#undef VEC
#undef EXPERTS
#undef LY
#undef GL

static int head_dim_of(const struct gemma4_hparams *hp, int il) { return hp->swa[il] ? hp->head_dim_swa : hp->head_dim; }

void gemma4_widths(const struct gemma4_hparams *hp, int il, int64_t w[GEMMA4_N_WIDTHS]) {
    const int64_t D = head_dim_of(hp, il);
    w[W(ONE)] = 1;
    w[W(EMBD)] = hp->n_embd;
    w[W(VOCAB)] = hp->n_vocab;
    w[W(Q)] = hp->n_head[il] * D;
    w[W(KV)] = hp->n_head_kv[il] * D;
    w[W(HEAD_DIM)] = D;
    w[W(FF)] = hp->n_ff[il];
    w[W(ROPE_FREQS)] = hp->head_dim / 2;
    w[W(PLE)] = hp->n_embd_per_layer;
    w[W(PLE_ALL)] = (int64_t)hp->n_embd_per_layer * hp->n_layer;
    w[W(EXPERTS)] = hp->n_expert;
    w[W(FF_EXP)] = hp->n_ff_exp;
    w[W(FF_EXP2)] = 2 * (int64_t)hp->n_ff_exp;
}

unsigned gemma4_layer_kind(const struct gemma4_hparams *hp, int il) {
    return (hp->swa[il] ? L_SWA : L_FULL) | (il < hp->n_layer - hp->n_kv_shared ? L_KV : 0) |
           (hp->n_embd_per_layer ? L_PLE : 0) | (hp->moe[il] ? L_MOE : 0);
}

int gemma4_kv_source(const struct gemma4_hparams *hp, int il) {
    const int n_own = hp->n_layer - hp->n_kv_shared;
    if (il < n_own) return il;
    /* llama.cpp's rule: the sliding layers read layer n_own - 2, the full ones n_own - 1 (the
     * last sliding and last full owner in every E-series file); any other layout it cannot load */
    const int src = n_own - (hp->swa[il] ? 2 : 1);
    return src >= 0 && hp->swa[src] == hp->swa[il] ? src : -1;
}

struct scratch {
    float *x, *a, *q, *k, *v, *att, *o, *fg, *fu;
    float *logits, *wts, *gu, *ye, *mo;  /* MoE: router logits, slot weights, [gate ; up], outputs, sum */
    int32_t *ids;                        /* MoE: the chosen experts */
    float *ones;                         /* [max head dim] of 1: the weightless v norm */
    /* PLE: a slice's per-layer inputs are formed in ple_tok ([n][n_layer][P], a token's layers
     * side by side) and, for n > 1, regrouped into ple_in ([n_layer][n][P]) so that each layer's
     * rows are contiguous; ple_g is a layer's gate rows [n][P]. */
    float *ple_tok, *ple_in, *ple_g;
    void **ple_dst;                      /* host: the regrouping's n_batch·n_layer copies */
    const void **ple_src;
    size_t *ple_bytes;
};

struct gemma4 {
    struct model base;
    struct gemma4_hparams hp;
    struct layer *layers;
    struct globals g;
    struct scratch s;
    struct engine eng;
};

static struct gemma4 *g4(struct model *m) { return (struct gemma4 *)m; }

/* ---- loading ------------------------------------------------------------------------ */

/* 26B-A4B's experts: counts and width from the metadata; a layer has the expert branch when its
 * router is in the file (llama.cpp's test). */
static int read_expert_hparams(const struct weight_loader *L, struct gemma4_hparams *hp) {
    int rc;
    if ((rc = weights_get_u32_opt(L, "expert_count", &hp->n_expert, 0))) return rc;
    if (!hp->n_expert) return 0;
    if ((rc = weights_get_u32(L, "expert_used_count", &hp->n_expert_used))) return rc;
    if ((rc = weights_get_u32(L, "expert_feed_forward_length", &hp->n_ff_exp))) return rc;
    if ((rc = block_moe_check_shape(L, &(struct moe_shape){hp->n_expert, hp->n_expert_used, hp->n_ff_exp}, hp->n_embd,
                                    GEMMA4_MAX_WIDTH)))
        return rc;
    for (int il = 0; il < hp->n_layer; il++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.weight", il);
        hp->moe[il] = gguf_find_tensor(L->g, name) != NULL;
    }
    return 0;
}

static int read_hparams(const struct weight_loader *L, struct gemma4_hparams *hp) {
    int rc;
    if ((rc = weights_get_u32(L, "block_count", &hp->n_layer))) return rc;
    if (hp->n_layer < 1 || hp->n_layer > GEMMA4_MAX_LAYERS)
        return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "block_count %d is out of range [1, %d]", hp->n_layer, GEMMA4_MAX_LAYERS);
    const int nl = hp->n_layer;
    if ((rc = weights_get_u32_opt(L, "context_length", &hp->n_ctx_train, 4096))) return rc;
    if ((rc = weights_get_u32(L, "embedding_length", &hp->n_embd))) return rc;
    if ((rc = weights_get_per_layer(L, "feed_forward_length", nl, hp->n_ff, true, 0))) return rc;
    if ((rc = weights_get_per_layer(L, "attention.head_count", nl, hp->n_head, true, 0))) return rc;
    if ((rc = weights_get_per_layer(L, "attention.head_count_kv", nl, hp->n_head_kv, false, hp->n_head[0]))) return rc;
    int vlen, vlen_swa;
    if ((rc = weights_get_u32_opt(L, "attention.key_length", &hp->head_dim, hp->n_head[0] ? hp->n_embd / hp->n_head[0] : 0))) return rc;
    if ((rc = weights_get_u32_opt(L, "attention.value_length", &vlen, hp->head_dim))) return rc;
    if ((rc = weights_get_u32_opt(L, "attention.key_length_swa", &hp->head_dim_swa, hp->head_dim))) return rc;
    if ((rc = weights_get_u32_opt(L, "attention.value_length_swa", &vlen_swa, hp->head_dim_swa))) return rc;
    if (vlen != hp->head_dim || vlen_swa != hp->head_dim_swa)
        return coti_fail(L->err, L->err_size, COTI_E_UNSUPPORTED, "value lengths %d / %d differ from key lengths %d / %d", vlen,
                         vlen_swa, hp->head_dim, hp->head_dim_swa);
    if ((rc = weights_get_u32(L, "attention.sliding_window", &hp->window))) return rc;
    int pattern[GEMMA4_MAX_LAYERS];
    char k[256];
    snprintf(k, sizeof k, "%s.attention.sliding_window_pattern", L->arch);
    const struct gguf_kv *kv = gguf_find_kv(L->g, k);
    if (!kv) return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "missing metadata key %s", k);
    if (kv->type == GGUF_TYPE_ARRAY) {
        if ((rc = weights_get_per_layer(L, "attention.sliding_window_pattern", nl, pattern, true, 0))) return rc;
        for (int i = 0; i < nl; i++) hp->swa[i] = pattern[i] != 0;
    } else { /* a period: every n-th layer (the last of each n) is full */
        int period;
        if ((rc = weights_get_u32(L, "attention.sliding_window_pattern", &period))) return rc;
        if (period < 1) return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "%s = %d is out of range", k, period);
        for (int i = 0; i < nl; i++) hp->swa[i] = i % period < period - 1;
    }
    if ((rc = weights_get_u32_opt(L, "attention.shared_kv_layers", &hp->n_kv_shared, 0))) return rc;
    if ((rc = weights_get_u32_opt(L, "embedding_length_per_layer_input", &hp->n_embd_per_layer, 0))) return rc;
    if ((rc = read_expert_hparams(L, hp))) return rc;
    if ((rc = weights_get_f32(L, "attention.layer_norm_rms_epsilon", &hp->eps))) return rc;
    if ((rc = weights_get_f32_opt(L, "rope.freq_base", &hp->rope_base, 10000.0f))) return rc;
    if ((rc = weights_get_f32_opt(L, "rope.freq_base_swa", &hp->rope_base_swa, 10000.0f))) return rc;
    if ((rc = weights_get_u32_opt(L, "rope.dimension_count", &hp->n_rot, hp->head_dim))) return rc;
    if ((rc = weights_get_u32_opt(L, "rope.dimension_count_swa", &hp->n_rot_swa, hp->n_rot))) return rc;
    if ((rc = weights_get_f32_opt(L, "final_logit_softcapping", &hp->softcap, 30.0f))) return rc;

    /* ranges: every width the forward forms stays far from int overflow */
    for (int i = 0; i < nl; i++) {
        const int64_t D = head_dim_of(hp, i);
        if (hp->n_head[i] < 1 || hp->n_head_kv[i] < 1 || hp->n_head[i] % hp->n_head_kv[i] || hp->n_ff[i] < 1 ||
            hp->n_ff[i] > GEMMA4_MAX_WIDTH || hp->n_head[i] * D > GEMMA4_MAX_WIDTH)
            return coti_fail(L->err, L->err_size, COTI_E_FORMAT,
                             "layer %d: heads %d / %d (a positive multiple) of %lld, feed-forward %d are out of range", i,
                             hp->n_head[i], hp->n_head_kv[i], (long long)D, hp->n_ff[i]);
    }
    if (hp->n_embd < 1 || hp->n_embd > GEMMA4_MAX_WIDTH)
        return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "embedding_length %d is out of range", hp->n_embd);
    if (hp->n_embd_per_layer < 0 || (int64_t)hp->n_embd_per_layer * nl > GEMMA4_MAX_WIDTH)
        return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "embedding_length_per_layer_input %d is out of range",
                         hp->n_embd_per_layer);
    const int dims[4] = {hp->head_dim, hp->head_dim_swa, hp->n_rot, hp->n_rot_swa};
    for (int i = 0; i < 4; i++)
        if (dims[i] < 2 || dims[i] > GEMMA4_MAX_HEAD_DIM || dims[i] % 2)
            return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "head dims %d / %d and rope dims %d / %d must be even, in [2, %d]",
                             hp->head_dim, hp->head_dim_swa, hp->n_rot, hp->n_rot_swa, GEMMA4_MAX_HEAD_DIM);
    if (hp->n_rot > hp->head_dim || hp->n_rot_swa > hp->head_dim_swa)
        return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "rope dims %d / %d exceed head dims %d / %d", hp->n_rot,
                         hp->n_rot_swa, hp->head_dim, hp->head_dim_swa);
    if (hp->window < 1 || hp->n_kv_shared < 0 || hp->n_kv_shared > nl - 1)
        return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "sliding window %d / shared KV layers %d out of range", hp->window,
                         hp->n_kv_shared);
    for (int i = 0; i < nl; i++)
        if (gemma4_kv_source(hp, i) < 0)
            return coti_fail(L->err, L->err_size, COTI_E_FORMAT,
                             "shared-KV layer %d reads layer %d, which must be a %s layer that owns its K/V", i,
                             hp->n_layer - hp->n_kv_shared - (hp->swa[i] ? 2 : 1), hp->swa[i] ? "sliding" : "full");
    if (!(hp->eps > 0.0f && hp->eps < 1.0f) || !(hp->rope_base > 1.0f) || !(hp->rope_base_swa > 1.0f) || !(hp->softcap >= 0.0f))
        return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "rms eps %g / rope bases %g, %g / soft-cap %g out of range", hp->eps,
                         hp->rope_base, hp->rope_base_swa, hp->softcap);
    return 0;
}

static void gemma4_free(struct model *m) {
    struct gemma4 *q = g4(m);
    struct backend *be = m->be;
    engine_free(&q->eng);
    for (int il = 0; q->layers && il < q->hp.n_layer; il++)
        weights_unbind(be, gemma4_tensors, gemma4_n_tensors, q->layers[il].kind, &q->layers[il]);
    free(q->layers);
    if (q->s.ones) be->free(be, q->s.ones);
    free(q->s.ple_dst);
    free(q->s.ple_src);
    free(q->s.ple_bytes);
    if (q->g.lm_head.data == q->g.tok_embd.data) q->g.lm_head = (struct bweight){0};
    weights_unbind(be, gemma4_tensors, gemma4_n_tensors, 0, &q->g);
    gguf_close(m->gguf);
    free(q);
}

static void trunk_pass(struct model *m, const struct slice_ops_args *a);

static int init_engine(struct gemma4 *q) {
    struct model *m = &q->base;
    const struct gemma4_hparams *hp = &q->hp;
    size_t qw = 0, kvw = 0, ff = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        const size_t D = (size_t)head_dim_of(hp, il);
        qw = COTI_MAX(qw, (size_t)hp->n_head[il] * D);
        kvw = COTI_MAX(kvw, (size_t)hp->n_head_kv[il] * D);
        ff = COTI_MAX(ff, (size_t)hp->n_ff[il]);
    }
    const size_t nb = (size_t)m->n_batch, f = sizeof(float), E = (size_t)hp->n_embd;
    const size_t P = (size_t)hp->n_embd_per_layer, nl = (size_t)hp->n_layer;
    const size_t NE = (size_t)hp->n_expert, K = (size_t)hp->n_expert_used, F = (size_t)hp->n_ff_exp;
    struct scratch *s = &q->s;
#define SLOT(p, n) {(void **)&(p), f * nb * (n)}
    const struct arena_slot slots[] = {
        SLOT(s->x, E), SLOT(s->a, E), SLOT(s->q, qw), SLOT(s->k, kvw), SLOT(s->v, kvw), SLOT(s->att, qw),
        SLOT(s->o, E), SLOT(s->fg, ff), SLOT(s->fu, ff),
        SLOT(s->ple_tok, P * nl), SLOT(s->ple_in, P * nl), SLOT(s->ple_g, P),
        SLOT(s->logits, NE), SLOT(s->wts, K), SLOT(s->ids, K), SLOT(s->gu, K * 2 * F), SLOT(s->ye, K * E),
        SLOT(s->mo, E),
    };
#undef SLOT
    if (P) {
        s->ple_dst = malloc(sizeof(void *) * nb * nl);
        s->ple_src = malloc(sizeof(void *) * nb * nl);
        s->ple_bytes = malloc(sizeof(size_t) * nb * nl);
        if (!s->ple_dst || !s->ple_src || !s->ple_bytes) return COTI_E_NOMEM;
    }
    const int max_d = COTI_MAX(hp->head_dim, hp->head_dim_swa);
    float *ones = malloc(sizeof(float) * (size_t)max_d);
    s->ones = m->be->alloc(m->be, sizeof(float) * (size_t)max_d);
    struct kv_layer_spec *kv = calloc((size_t)hp->n_layer, sizeof *kv);
    int rc = ones && s->ones && kv ? 0 : COTI_E_NOMEM;
    if (!rc) {
        for (int i = 0; i < max_d; i++) ones[i] = 1.0f;
        m->be->upload(m->be, s->ones, ones, sizeof(float) * (size_t)max_d);
        for (int il = 0; il < hp->n_layer; il++) {
            const int src = gemma4_kv_source(hp, il);
            kv[il] = (struct kv_layer_spec){hp->n_head_kv[il], head_dim_of(hp, il), src == il ? -1 : src,
                                            hp->swa[il] ? hp->window : 0};
            q->layers[il].kv_src = src;
        }
        const struct memory_params mp = {.n_seq = m->n_seq, .n_ctx = m->n_ctx, .n_keep = m->n_keep_states,
                                         .n_batch = m->n_batch, .kv = kv, .n_kv = hp->n_layer,
                                         .k_type = m->cache_type_k, .v_type = m->cache_type_v};
        const struct engine_params ep = {.n_vocab = hp->n_vocab, .n_embd = hp->n_embd, .window = hp->window,
                                         .softcap = hp->softcap, .mem = &mp, .slots = slots,
                                         .n_slots = (int)COTI_ARRAY_LEN(slots), .passes = {trunk_pass, NULL},
                                         .lm_head = &q->g.lm_head, .draft_head = &q->g.lm_head};
        rc = engine_init(&q->eng, m, &ep);
    }
    free(ones);
    free(kv);
    return rc;
}

static const struct model_vtable gemma4_vtable;

int gemma4_load(struct model **out, struct gguf_file *g, struct backend *be, const struct model_params *p, char *err,
                size_t err_size) {
    const struct weight_loader L = {g, be, "gemma4", err, err_size, p->progress, NULL, NULL};
    if (p->tp_n > 1) /* (its shard map, and the assistant's reads of its caches: issue 25's step 3) */
        return coti_fail(err, err_size, COTI_E_UNSUPPORTED, "a tensor-parallel split of gemma4 is not built yet");
    struct gemma4 *q = calloc(1, sizeof(*q));
    if (!q) return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory");
    struct model *m = &q->base;
    model_base_init(m, &gemma4_vtable, be, p);
    struct gemma4_hparams *hp = &q->hp;
    int rc = read_hparams(&L, hp);
    if (rc) { free(q); return rc; }
    m->gguf = g; /* owned once loading succeeds: gemma4_free closes it */

    const struct gguf_tensor *te = gguf_find_tensor(g, "token_embd.weight");
    if (!te || te->n_dims != 2 || te->ne[0] != hp->n_embd || te->ne[1] < 1 || te->ne[1] > (1 << 24)) {
        rc = coti_fail(err, err_size, COTI_E_FORMAT, "token_embd.weight missing or not {%d, n_vocab}", hp->n_embd);
        goto fail;
    }
    hp->n_vocab = (int)te->ne[1];
    int64_t widths[GEMMA4_N_WIDTHS];
    gemma4_widths(hp, 0, widths);
    if ((rc = weights_bind(&L, gemma4_tensors, gemma4_n_tensors, 0, 0, &q->g, widths))) goto fail;
    if (!q->g.lm_head.data) q->g.lm_head = q->g.tok_embd; /* tied */
    q->layers = calloc((size_t)hp->n_layer, sizeof(struct layer));
    if (!q->layers) { rc = coti_fail(err, err_size, COTI_E_NOMEM, "out of memory"); goto fail; }
    bool any_full = false;
    for (int il = 0; il < hp->n_layer; il++) {
        struct layer *ly = &q->layers[il];
        ly->kind = gemma4_layer_kind(hp, il);
        ly->out_scale = 1.0f;
        any_full |= !hp->swa[il];
        gemma4_widths(hp, il, widths);
        if ((rc = weights_bind(&L, gemma4_tensors, gemma4_n_tensors, ly->kind, il, ly, widths))) goto fail;
        if ((ly->kind & L_MOE) &&
            (rc = block_moe_finish_load(&L, &ly->moe, &(struct moe_shape){hp->n_expert, hp->n_expert_used, hp->n_ff_exp},
                                        hp->n_embd, il)))
            goto fail;
    }
    if (hp->n_embd_per_layer && !(q->g.ple_embd.data && q->g.ple_model_proj.data && q->g.ple_proj_norm)) {
        rc = coti_fail(err, err_size, COTI_E_FORMAT,
                       "per-layer embeddings (P = %d) need per_layer_token_embd, per_layer_model_proj and "
                       "per_layer_proj_norm",
                       hp->n_embd_per_layer);
        goto fail;
    }
    if (any_full && !q->g.rope_freqs) {
        rc = coti_fail(err, err_size, COTI_E_FORMAT, "missing tensor rope_freqs.weight (the full layers' rotation)");
        goto fail;
    }
    if ((rc = init_engine(q))) {
        rc = engine_init_fail(m, rc, err, err_size);
        goto fail;
    }
    m->info = (struct model_info){.arch = "gemma4", .n_vocab = hp->n_vocab, .n_embd = hp->n_embd, .n_layer = hp->n_layer,
                                  .n_ctx_train = hp->n_ctx_train};
    *out = m;
    return 0;
fail:
    m->gguf = NULL; /* on failure the caller keeps the file (model_load closes it) */
    gemma4_free(m);
    return rc;
}

/* ---- the trunk ------------------------------------------------------------------------ */

static void attention(struct gemma4 *q, const struct layer *ly, int il, int n) {
    struct backend *be = q->base.be;
    const struct gemma4_hparams *hp = &q->hp;
    const struct scratch *s = &q->s;
    const struct batch_meta *meta = &q->eng.meta;
    const bool swa = hp->swa[il];
    const int D = head_dim_of(hp, il), H = hp->n_head[il], QS = H * D, KV = hp->n_head_kv[il] * D;
    const int n_rot = swa ? hp->n_rot_swa : hp->n_rot;
    const float base = swa ? hp->rope_base_swa : hp->rope_base;
    const float *freqs = swa ? NULL : q->g.rope_freqs;
    const struct matmul_in in = {.kind = MATMUL_RMSNORM, .x = s->x, .w = ly->attn_norm, .eps = hp->eps, .a = s->a};
    const struct kv_view *kv = &q->eng.mem.kv.layers[ly->kv_src];
    if (ly->kind & L_KV) {
        const struct bweight *ws[3] = {&ly->q, &ly->k, &ly->v};
        float *ys[3] = {s->q, s->k, s->v};
        be->matmul(be, ws, ys, ly->v.data ? 3 : 2, &in, n);
        /* K = V layers (no attn_v): V is the raw K projection; a ring stores twice (kv.h) */
        const struct attn_prep_in prep = {.q = s->q, .q_stride = QS, .q_head_stride = D, .q_norm = ly->q_norm, .k = s->k,
                                          .k_stride = KV, .k_norm = ly->k_norm, .v = s->v, .v_stride = KV,
                                          .v_norm = s->ones, .v_from_k = !ly->v.data,
                                          .cells2 = swa && q->eng.mem.kv.win.ring ? meta->win_cells2 : NULL,
                                          .eps = hp->eps, .n_head = H, .n_rot = n_rot, .rope_base = base,
                                          .rope_freqs = freqs};
        be->attn_prep(be, &prep, n, meta->pos, swa ? meta->win_cells : meta->cells, kv);
    } else { /* reads kv_src's cache, stores nothing */
        be->matmul(be, (const struct bweight *const[]){&ly->q}, (float *const[]){s->q}, 1, &in, n);
        be->rmsnorm(be, s->q, D, ly->q_norm, n * H, D, hp->eps, s->q, D);
        be->rope_neox(be, s->q, n, QS, H, D, n_rot, meta->pos, base, freqs);
    }
    be->attention(be, s->q, QS, D, kv, swa ? meta->win_cell0 : meta->cell0, swa ? meta->win_nctx : meta->nctx, n, H,
                  1.0f, s->att);
    backend_matmul(be, &ly->o, &(struct matmul_in){.kind = MATMUL_PLAIN, .x = s->att}, n, s->o);
}

/* The embedding rows scaled by √D, as the first layer reads them (also the assistant's input). */
static void gemma4_embed(struct model *m, const int32_t *ids, int n, float *out) {
    struct gemma4 *q = g4(m);
    m->be->get_rows(m->be, &q->g.tok_embd, ids, n, out);
    m->be->scale(m->be, out, (int64_t)n * q->hp.n_embd, sqrtf((float)q->hp.n_embd));
}

/* The per-layer inputs of a slice (arch-gemma4.md §3.2), from its ids and its scaled
 * embedding rows in s->x: for every token and layer l,
 *   (rmsnorm(W_mp·x / √E)[l] ⊙ proj_norm + PLE[id][l]·√P) / √2,
 * in llama.cpp's order of roundings. Returns layer 0's rows; layer l's are n·P further each. */
static const float *ple_inputs(struct gemma4 *q, const int32_t *ids, int n) {
    struct backend *be = q->base.be;
    const struct gemma4_hparams *hp = &q->hp;
    const struct scratch *s = &q->s;
    const int P = hp->n_embd_per_layer, nl = hp->n_layer;
    const int64_t n_all = (int64_t)n * nl * P;
    be->get_rows(be, &q->g.ple_embd, ids, n, s->ple_in);
    be->scale(be, s->ple_in, n_all, sqrtf((float)P));
    backend_matmul(be, &q->g.ple_model_proj, &(struct matmul_in){.kind = MATMUL_PLAIN, .x = s->x}, n, s->ple_tok);
    be->scale(be, s->ple_tok, n_all, 1.0f / sqrtf((float)hp->n_embd));
    be->rmsnorm(be, s->ple_tok, P, q->g.ple_proj_norm, n * nl, P, hp->eps, s->ple_tok, P);
    be->add(be, s->ple_tok, s->ple_in, n_all, s->ple_tok);
    be->scale(be, s->ple_tok, n_all, 1.0f / sqrtf(2.0f));
    if (n == 1) return s->ple_tok; /* [1][n_layer][P] is already [n_layer][1][P] */
    for (int t = 0; t < n; t++)
        for (int l = 0; l < nl; l++) {
            const size_t i = (size_t)t * nl + l;
            s->ple_dst[i] = s->ple_in + ((size_t)l * n + t) * P;
            s->ple_src[i] = s->ple_tok + i * P;
            s->ple_bytes[i] = sizeof(float) * (size_t)P;
        }
    be->copy_n(be, s->ple_dst, s->ple_src, s->ple_bytes, n * nl);
    return s->ple_in;
}

/* x = (x + rmsnorm(W_proj · (gelu(W_gate · x) ⊙ in)) ⊙ post_norm) · out_scale: a layer's
 * per-layer input, then the layer's scale. */
static void ple_layer(struct gemma4 *q, const struct layer *ly, const float *in, int n, float out_scale) {
    struct backend *be = q->base.be;
    const struct scratch *s = &q->s;
    backend_matmul(be, &ly->ple_gate, &(struct matmul_in){.kind = MATMUL_PLAIN, .x = s->x}, n, s->ple_g);
    backend_matmul(be, &ly->ple_proj, &(struct matmul_in){.kind = MATMUL_GEGLU, .x = s->ple_g, .m = in, .a = s->ple_g}, n,
                   s->o);
    be->rmsnorm_add(be, s->x, s->o, ly->ple_post_norm, n, q->hp.n_embd, q->hp.eps, out_scale);
}

/* The routed experts of a MoE layer into s->mo: the router over the unweighted norm of the
 * layer input times its scale vector, over √E (llama.cpp's order up to where the 1/√E applies:
 * to the logits here, to the input there); GeGLU experts over their own norm of the input,
 * each output times its expert's scale, weighted, summed in slot order, then normed. */
static void experts(struct gemma4 *q, const struct layer *ly, int n) {
    struct backend *be = q->base.be;
    const struct gemma4_hparams *hp = &q->hp;
    const struct scratch *s = &q->s;
    const int E = hp->n_embd, NE = hp->n_expert, K = hp->n_expert_used;
    backend_matmul(be, &ly->moe.gate_inp,
                   &(struct matmul_in){.kind = MATMUL_RMSNORM, .x = s->x, .w = ly->router_scale, .eps = hp->eps, .a = s->a},
                   n, s->logits);
    be->scale(be, s->logits, (int64_t)n * NE, 1.0f / sqrtf((float)E));
    be->moe_route(be, s->logits, n, NE, K, s->ids, s->wts);
    be->rmsnorm(be, s->x, E, ly->exp_norm, n, E, hp->eps, s->a, E);
    block_moe_experts(be, &ly->moe, &(struct moe_shape){NE, K, hp->n_ff_exp}, s->ids, s->a, E, n, MOE_GLU_GEGLU, s->gu,
                      s->ye);
    be->moe_sum(be, s->ye, s->wts, s->ids, ly->down_scale, n, K, E, NULL, NULL, s->mo);
    be->rmsnorm(be, s->mo, E, ly->post_ffw_norm_2, n, E, hp->eps, s->mo, E);
}

static void trunk_pass(struct model *m, const struct slice_ops_args *a) {
    struct gemma4 *q = g4(m);
    struct backend *be = m->be;
    const struct gemma4_hparams *hp = &q->hp;
    const struct scratch *s = &q->s;
    const int n = a->sl->n, E = hp->n_embd, P = hp->n_embd_per_layer;
    gemma4_embed(m, a->ids, n, s->x);
    const float *ple = P ? ple_inputs(q, a->ids, n) : NULL;
    for (int il = 0; il < hp->n_layer; il++) {
        const struct layer *ly = &q->layers[il];
        attention(q, ly, il, n);
        be->rmsnorm_add(be, s->x, s->o, ly->post_attn_norm, n, E, hp->eps, 1.0f);
        const struct bweight *ws[2] = {&ly->ffn.gate, &ly->ffn.up};
        float *ys[2] = {s->fg, s->fu};
        be->matmul(be, ws, ys, 2, &(struct matmul_in){.kind = MATMUL_RMSNORM, .x = s->x, .w = ly->ffn_norm, .eps = hp->eps, .a = s->a},
                   n);
        backend_matmul(be, &ly->ffn.down, &(struct matmul_in){.kind = MATMUL_GEGLU, .x = s->fg, .m = s->fu, .a = s->fg}, n,
                       s->o);
        if (ly->kind & L_MOE) { /* the dense FFN normed, plus the experts' */
            be->rmsnorm(be, s->o, E, ly->post_ffw_norm_1, n, E, hp->eps, s->o, E);
            experts(q, ly, n);
            be->add(be, s->o, s->mo, (int64_t)n * E, s->o);
        }
        if (P) { /* the per-layer input joins the residual before the layer's scale */
            be->rmsnorm_add(be, s->x, s->o, ly->post_ffw_norm, n, E, hp->eps, 1.0f);
            ple_layer(q, ly, ple + (size_t)il * n * P, n, ly->out_scale);
        } else {
            be->rmsnorm_add(be, s->x, s->o, ly->post_ffw_norm, n, E, hp->eps, ly->out_scale);
        }
    }
    be->rmsnorm(be, s->x, E, q->g.out_norm, n, E, hp->eps, a->hn, E);
    block_lm_head(&q->eng, a);
}

static const struct model_vtable gemma4_vtable = {
    .free = gemma4_free,
    .forward = engine_forward,
    .seq_reset = engine_seq_reset,
    .seq_rollback = engine_seq_rollback,
    .seq_copy = engine_seq_copy,
    .seq_state_read = engine_seq_state_read,
    .embed = gemma4_embed,
};
