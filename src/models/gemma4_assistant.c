/* gemma4_assistant.c — the gemma4-assistant drafter model (arch-gemma4.md §4): loading (its
 * hparams describe views of the target's cache and must match the target's layers they read)
 * and one draft step: u = W_pre·[E_t(tok)·√D_t ; h], per layer a pre-normed query-only attention
 * over the target's last sliding / last full layer's K/V (scale 1, the window on sliding layers)
 * and a GeGLU FFN with their post-norms and the layer's output scale; logits = E_d·norm(u) (no
 * soft-cap), h_next = W_post·norm(u). It writes no target state: its KV views are read-only. */
#include "models/gemma4_assistant.h"
#include "engine/engine.h"
#include "engine/weights.h"
#include "models/blocks.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define G4A_MAX_LAYERS 16

struct g4a_layer {
    float *attn_norm, *q_norm, *post_attn_norm, *ffn_norm, *post_ffw_norm;
    struct bweight q, o;
    struct glu_ffn_weights ffn;
    float out_scale;
};

struct g4a_globals {
    struct bweight head, pre, post;      /* token_embd (the LM head only), pre/post projections */
    float *out_norm, *rope_freqs;
};

enum { G4A_W_ONE = WEIGHT_WIDTH_ONE, G4A_W_EMBD, G4A_W_EMBD_T2, G4A_W_EMBD_T, G4A_W_VOCAB, G4A_W_Q, G4A_W_HEAD_DIM,
       G4A_W_FF, G4A_W_ROPE_FREQS, G4A_N_WIDTHS };

#define W(x) G4A_W_##x
#define MAT(name, layers, in, out, field) {name, WEIGHT_MATRIX, layers, W(in), W(out), field, WEIGHT_REQUIRED, WEIGHT_INIT_MATRIX}
#define VEC(name, layers, in, field) {name, WEIGHT_VECTOR, layers, W(in), W(ONE), field, WEIGHT_REQUIRED, WEIGHT_INIT_NORM}
#define LY(f) offsetof(struct g4a_layer, f)
#define GL(f) offsetof(struct g4a_globals, f)
static const struct weight_desc g4a_tensors[] = {
    {"rope_freqs.weight", WEIGHT_VECTOR, 0, W(ROPE_FREQS), W(ONE), GL(rope_freqs), WEIGHT_OPTIONAL, WEIGHT_INIT_NORM},
    MAT("token_embd.weight", 0, EMBD, VOCAB, GL(head)),
    MAT("nextn.pre_projection.weight", 0, EMBD_T2, EMBD, GL(pre)),
    MAT("nextn.post_projection.weight", 0, EMBD, EMBD_T, GL(post)),
    VEC("blk.%d.attn_norm.weight", 1, EMBD, LY(attn_norm)),
    MAT("blk.%d.attn_q.weight", 1, EMBD, Q, LY(q)),
    MAT("blk.%d.attn_output.weight", 1, Q, EMBD, LY(o)),
    VEC("blk.%d.attn_q_norm.weight", 1, HEAD_DIM, LY(q_norm)),
    VEC("blk.%d.post_attention_norm.weight", 1, EMBD, LY(post_attn_norm)),
    VEC("blk.%d.ffn_norm.weight", 1, EMBD, LY(ffn_norm)),
    MAT("blk.%d.ffn_gate.weight", 1, EMBD, FF, LY(ffn.gate)),
    MAT("blk.%d.ffn_up.weight", 1, EMBD, FF, LY(ffn.up)),
    MAT("blk.%d.ffn_down.weight", 1, FF, EMBD, LY(ffn.down)),
    VEC("blk.%d.post_ffw_norm.weight", 1, EMBD, LY(post_ffw_norm)),
    {"blk.%d.layer_output_scale.weight", WEIGHT_SCALAR, 1, W(ONE), W(ONE), LY(out_scale), WEIGHT_REQUIRED, WEIGHT_INIT_NORM},
    {"output_norm.weight", WEIGHT_VECTOR, WEIGHT_GLOBAL_LAST, W(EMBD), W(ONE), GL(out_norm), WEIGHT_REQUIRED, WEIGHT_INIT_NORM},
};
#undef MAT
#undef VEC
#undef LY
#undef GL

struct gemma4_assistant {
    struct model *t;                     /* the target */
    struct backend *be;
    int n_layer, D, Dt, V, window, ff;
    int n_head[G4A_MAX_LAYERS], head_dim[G4A_MAX_LAYERS], n_rot[G4A_MAX_LAYERS];
    float rope_base[G4A_MAX_LAYERS];
    bool swa[G4A_MAX_LAYERS];
    float eps;
    struct kv_view kv[G4A_MAX_LAYERS];   /* read-only views of the target layers it reads */
    struct g4a_layer layers[G4A_MAX_LAYERS];
    struct g4a_globals g;
    struct gguf_file *gguf;
    void *arena;
    float *cat, *u, *a, *q, *att, *o, *fg, *fu, *n, *logits;
    int32_t *meta;                       /* backend: pos, cell0, nctx, win_cell0, win_nctx, token */
};

int gemma4_assistant_n_vocab(const struct gemma4_assistant *a) { return a->V; }

void gemma4_assistant_free(struct gemma4_assistant *a) {
    if (!a) return;
    struct backend *be = a->be;
    for (int il = 0; il < a->n_layer; il++) weights_unbind(be, g4a_tensors, (int)COTI_ARRAY_LEN(g4a_tensors), 1, &a->layers[il]);
    weights_unbind(be, g4a_tensors, (int)COTI_ARRAY_LEN(g4a_tensors), 0, &a->g);
    if (a->arena) be->free(be, a->arena);
    gguf_close(a->gguf);
    free(a);
}

static int read_hparams(struct gemma4_assistant *a, const struct weight_loader *L) {
    int rc, dh, dh_swa, rot, rot_swa, pattern[G4A_MAX_LAYERS], n_kv[G4A_MAX_LAYERS], ffs[G4A_MAX_LAYERS], nextn;
    float base, base_swa;
    if ((rc = weights_get_u32(L, "block_count", &a->n_layer))) return rc;
    if (a->n_layer < 1 || a->n_layer > G4A_MAX_LAYERS)
        return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "block_count %d out of range [1, %d]", a->n_layer, G4A_MAX_LAYERS);
    if ((rc = weights_get_u32_opt(L, "nextn_predict_layers", &nextn, a->n_layer))) return rc;
    if (nextn != a->n_layer)
        return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "nextn_predict_layers %d != block_count %d", nextn, a->n_layer);
    if ((rc = weights_get_u32(L, "embedding_length", &a->D)) || (rc = weights_get_u32(L, "embedding_length_out", &a->Dt)))
        return rc;
    if ((rc = weights_get_per_layer(L, "feed_forward_length", a->n_layer, ffs, true, 0))) return rc;
    if ((rc = weights_get_per_layer(L, "attention.head_count", a->n_layer, a->n_head, true, 0))) return rc;
    if ((rc = weights_get_per_layer(L, "attention.head_count_kv", a->n_layer, n_kv, false, a->n_head[0]))) return rc;
    if ((rc = weights_get_u32(L, "attention.key_length", &dh))) return rc;
    if ((rc = weights_get_u32_opt(L, "attention.key_length_swa", &dh_swa, dh))) return rc;
    if ((rc = weights_get_u32_opt(L, "rope.dimension_count", &rot, dh))) return rc;
    if ((rc = weights_get_u32_opt(L, "rope.dimension_count_swa", &rot_swa, rot))) return rc;
    if ((rc = weights_get_f32_opt(L, "rope.freq_base", &base, 10000.0f))) return rc;
    if ((rc = weights_get_f32_opt(L, "rope.freq_base_swa", &base_swa, 10000.0f))) return rc;
    if ((rc = weights_get_u32(L, "attention.sliding_window", &a->window))) return rc;
    if ((rc = weights_get_per_layer(L, "attention.sliding_window_pattern", a->n_layer, pattern, true, 0))) return rc;
    if ((rc = weights_get_f32(L, "attention.layer_norm_rms_epsilon", &a->eps))) return rc;
    a->ff = 0;
    for (int il = 0; il < a->n_layer; il++) {
        a->swa[il] = pattern[il] != 0;
        a->head_dim[il] = a->swa[il] ? dh_swa : dh;
        a->n_rot[il] = a->swa[il] ? rot_swa : rot;
        a->rope_base[il] = a->swa[il] ? base_swa : base;
        a->ff = COTI_MAX(a->ff, ffs[il]);
        if (ffs[il] != ffs[0]) return coti_fail(L->err, L->err_size, COTI_E_UNSUPPORTED, "per-layer feed-forward widths");
        if (a->n_head[il] < 1 || a->head_dim[il] < 2 || a->head_dim[il] > 512 || a->n_rot[il] > a->head_dim[il] ||
            a->n_rot[il] % 2 || a->n_head[il] * a->head_dim[il] > (1 << 20) || n_kv[il] < 1 || a->n_head[il] % n_kv[il])
            return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "layer %d: heads %d / %d of %d (rope %d) out of range", il,
                             a->n_head[il], n_kv[il], a->head_dim[il], a->n_rot[il]);
    }
    if (a->D < 1 || a->D > (1 << 20) || a->Dt < 1 || a->Dt > (1 << 20) || a->ff < 1 || a->ff > (1 << 24) || a->window < 1 ||
        !(a->eps > 0.0f && a->eps < 1.0f))
        return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "assistant widths %d / %d / %d, window %d or eps out of range", a->D,
                         a->Dt, a->ff, a->window);
    /* the K/V it reads: the target's last sliding and last full layer (their views) */
    const struct model *t = a->t;
    const struct kv_cache *tkv = &t->engine->mem.kv;
    for (int il = 0; il < a->n_layer; il++) {
        const int src = tkv->n_layer - (a->swa[il] ? 2 : 1);
        if (src < 0) return coti_fail(L->err, L->err_size, COTI_E_UNSUPPORTED, "the target has too few layers");
        a->kv[il] = kv_view_read_only(tkv, src);
        if (a->kv[il].head_dim != a->head_dim[il] || a->kv[il].n_head_kv != n_kv[il])
            return coti_fail(L->err, L->err_size, COTI_E_UNSUPPORTED,
                             "assistant layer %d reads %d KV heads of %d; the target's layer %d holds %d of %d", il, n_kv[il],
                             a->head_dim[il], src, a->kv[il].n_head_kv, a->kv[il].head_dim);
    }
    return 0;
}

int gemma4_assistant_load(struct gemma4_assistant **out, const char *path, struct model *t, char *err, size_t err_size) {
    *out = NULL;
    if (!t->vt->embed || !t->engine || strcmp(t->info.arch, "gemma4") != 0)
        return coti_fail(err, err_size, COTI_E_UNSUPPORTED, "a gemma4-assistant drafter needs a gemma4 target (this is %s)",
                         t->info.arch);
    struct gguf_file *g = NULL;
    int rc = gguf_open(&g, path, err, err_size);
    if (rc) return rc;
    const char *arch = NULL;
    if (gguf_get_str(g, "general.architecture", &arch, NULL, 0) || strcmp(arch, "gemma4-assistant") != 0) {
        rc = coti_fail(err, err_size, COTI_E_FORMAT, "%s: architecture '%s', expected gemma4-assistant", path, arch ? arch : "?");
        gguf_close(g);
        return rc;
    }
    struct gemma4_assistant *a = calloc(1, sizeof *a);
    if (!a) { gguf_close(g); return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory"); }
    a->t = t;
    a->be = t->be;
    a->gguf = g;
    const struct weight_loader L = {g, t->be, "gemma4-assistant", err, err_size, NULL, NULL, NULL};
    if ((rc = read_hparams(a, &L))) goto fail;
    if (a->Dt != t->info.n_embd) {
        rc = coti_fail(err, err_size, COTI_E_UNSUPPORTED, "the assistant expects a target %d wide; this target is %d", a->Dt,
                       t->info.n_embd);
        goto fail;
    }
    const struct gguf_tensor *te = gguf_find_tensor(g, "token_embd.weight");
    if (!te || te->n_dims != 2 || te->ne[0] != a->D || te->ne[1] != t->info.n_vocab) {
        rc = coti_fail(err, err_size, COTI_E_UNSUPPORTED, "the assistant's vocabulary (%lld) is not the target's (%d)",
                       te ? (long long)te->ne[1] : -1LL, t->info.n_vocab);
        goto fail;
    }
    a->V = t->info.n_vocab;
    /* its sliding layers see the target's cells of the last `window` positions: a target
     * keeping fewer (a ring bounded by its own window, memory/kv.h) no longer holds them all */
    if (a->window > t->engine->window) {
        rc = coti_fail(err, err_size, COTI_E_UNSUPPORTED, "the assistant's sliding window (%d) is wider than the target's (%d)",
                       a->window, t->engine->window);
        goto fail;
    }
    int qmax = 0, dmax = 0;
    for (int il = 0; il < a->n_layer; il++) {
        qmax = COTI_MAX(qmax, a->n_head[il] * a->head_dim[il]);
        dmax = COTI_MAX(dmax, a->head_dim[il]);
    }
    int64_t w[G4A_N_WIDTHS] = {[W(ONE)] = 1, [W(EMBD)] = a->D, [W(EMBD_T2)] = 2 * (int64_t)a->Dt, [W(EMBD_T)] = a->Dt,
                               [W(VOCAB)] = a->V, [W(FF)] = a->ff, [W(ROPE_FREQS)] = dmax / 2};
    const int n_t = (int)COTI_ARRAY_LEN(g4a_tensors);
    if ((rc = weights_bind(&L, g4a_tensors, n_t, 0, 0, &a->g, w))) goto fail;
    for (int il = 0; il < a->n_layer; il++) {
        w[W(Q)] = (int64_t)a->n_head[il] * a->head_dim[il];
        w[W(HEAD_DIM)] = a->head_dim[il];
        if ((rc = weights_bind(&L, g4a_tensors, n_t, 1, il, &a->layers[il], w))) goto fail;
        if (!a->swa[il] && !a->g.rope_freqs) {
            rc = coti_fail(err, err_size, COTI_E_FORMAT, "missing tensor rope_freqs.weight (the full layers' rotation)");
            goto fail;
        }
    }
    const size_t f = sizeof(float);
    const struct arena_slot slots[] = {
        {(void **)&a->cat, f * 2 * a->Dt}, {(void **)&a->u, f * a->D}, {(void **)&a->a, f * a->D},
        {(void **)&a->q, f * qmax}, {(void **)&a->att, f * qmax}, {(void **)&a->o, f * a->D},
        {(void **)&a->fg, f * a->ff}, {(void **)&a->fu, f * a->ff}, {(void **)&a->n, f * a->D},
        {(void **)&a->logits, f * a->V}, {(void **)&a->meta, sizeof(int32_t) * 8},
    };
    if (!(a->arena = arena_alloc(a->be, slots, (int)COTI_ARRAY_LEN(slots)))) {
        rc = coti_fail(err, err_size, COTI_E_NOMEM, "out of memory for the assistant");
        goto fail;
    }
    *out = a;
    return 0;
fail:
    gemma4_assistant_free(a);
    return rc;
}

const int32_t *gemma4_assistant_at(struct gemma4_assistant *a, int s, int pos, int32_t token) {
    const struct kv_cache *kv = &a->t->engine->mem.kv;
    const int first = COTI_MAX(0, pos - a->window + 1);
    const int32_t m[6] = {pos, kv_cells_at(&kv->full, s, 0), pos, kv_cells_at(&kv->win, s, first), pos - first, token};
    a->be->upload(a->be, a->meta, m, sizeof m);
    return a->meta + 5;
}

void gemma4_assistant_step(struct gemma4_assistant *a, const int32_t *tok_dev, const float *h_in, int32_t *argmax_out,
                           const float **logits, const float **h_out) {
    struct backend *be = a->be;
    const int32_t *pos = a->meta, *cell0 = a->meta + 1, *nctx = a->meta + 2, *win_cell0 = a->meta + 3, *win_nctx = a->meta + 4;
    /* cat = [the token's scaled embedding ; h_in]: a chained step's h_in is already there */
    float *h_cat = a->cat + a->Dt;
    a->t->vt->embed(a->t, tok_dev, 1, a->cat);
    if (h_in != h_cat) be->copy(be, h_cat, h_in, sizeof(float) * a->Dt);
    backend_matmul(be, &a->g.pre, &(struct matmul_in){.kind = MATMUL_PLAIN, .x = a->cat}, 1, a->u);
    for (int il = 0; il < a->n_layer; il++) {
        const struct g4a_layer *ly = &a->layers[il];
        const int D = a->head_dim[il], H = a->n_head[il];
        backend_matmul(be, &ly->q, &(struct matmul_in){.kind = MATMUL_RMSNORM, .x = a->u, .w = ly->attn_norm, .eps = a->eps, .a = a->a},
                       1, a->q);
        const struct attn_prep_in prep = {.q = a->q, .q_stride = H * D, .q_head_stride = D, .q_norm = ly->q_norm,
                                          .eps = a->eps, .n_head = H, .n_rot = a->n_rot[il], .rope_base = a->rope_base[il],
                                          .rope_freqs = a->swa[il] ? NULL : a->g.rope_freqs};
        be->attn_prep(be, &prep, 1, pos, NULL, &a->kv[il]); /* the query only: nothing is stored */
        be->attention(be, a->q, H * D, D, &a->kv[il], a->swa[il] ? win_cell0 : cell0, a->swa[il] ? win_nctx : nctx, 1, H,
                      1.0f, a->att);
        backend_matmul(be, &ly->o, &(struct matmul_in){.kind = MATMUL_PLAIN, .x = a->att}, 1, a->o);
        be->rmsnorm_add(be, a->u, a->o, ly->post_attn_norm, 1, a->D, a->eps, 1.0f);
        const struct bweight *ws[2] = {&ly->ffn.gate, &ly->ffn.up};
        float *ys[2] = {a->fg, a->fu};
        be->matmul(be, ws, ys, 2, &(struct matmul_in){.kind = MATMUL_RMSNORM, .x = a->u, .w = ly->ffn_norm, .eps = a->eps, .a = a->a}, 1);
        backend_matmul(be, &ly->ffn.down, &(struct matmul_in){.kind = MATMUL_GEGLU, .x = a->fg, .m = a->fu, .a = a->fg}, 1, a->o);
        be->rmsnorm_add(be, a->u, a->o, ly->post_ffw_norm, 1, a->D, a->eps, ly->out_scale);
    }
    be->rmsnorm(be, a->u, a->D, a->g.out_norm, 1, a->D, a->eps, a->n, a->D);
    backend_matmul(be, &a->g.head, &(struct matmul_in){.kind = MATMUL_PLAIN, .x = a->n}, 1, a->logits);
    backend_matmul(be, &a->g.post, &(struct matmul_in){.kind = MATMUL_PLAIN, .x = a->n}, 1, h_cat);
    if (argmax_out) be->argmax(be, a->logits, 1, a->V, argmax_out, NULL);
    *logits = a->logits;
    *h_out = h_cat;
}
