/* qwen35.c — the Qwen3.5/3.6 dense hybrid architecture (`qwen35`): hparams from GGUF
 * metadata, tensor binding, the forward pass over a batch of tokens of one or more
 * sequences, per-sequence memory (f16 KV cache for the full-attention layers, conv + delta
 * state for the gated-delta-net layers, per-token state snapshots for rollback), and the
 * NextN (MTP) draft head. Written against backend.h only: nothing here runs arithmetic, except
 * the load-time requantization of the LM head the NextN drafts read (make_draft_head).
 * Reference: ../shared/docs/arch-qwen35.md; llama.cpp src/models/qwen35.cpp (behaviour). */
#include "memory/memory.h"
#include "model.h"
#include "threadpool.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Sizes beyond these are rejected at load: they bound on-stack scratch in the backends and
 * are far above any published Qwen3.5 shape (head dim 256, state 128). */
#define QWEN35_MAX_HEAD_DIM 512
#define QWEN35_MAX_STATE 256
#define QWEN35_MAX_LAYERS 512
/* Every width the forward forms from hparams (a projection's rows, a state's elements) is
 * bounded here, so the file's int arithmetic on them cannot overflow on absurd metadata. */
#define QWEN35_MAX_WIDTH (1 << 24)
/* Runs at least this long (prompts) use the chunked delta rule; shorter ones (decode,
 * verify) the per-token recurrence, so spec-on and spec-off decode share one path. */
#define QWEN35_CHUNKED_MIN_RUN 64

struct qwen35_hparams {
    int n_layer_all, n_layer, n_mtp;
    int n_embd, n_ff, n_head, n_head_kv, head_dim, n_rot, n_vocab, n_ctx_train;
    int ssm_k, ssm_dk, ssm_dv, ssm_nk, ssm_nv, ssm_ch; /* conv kernel, dims, heads, channels */
    int interval;
    float eps, rope_base;
};

struct attn_weights {
    struct bweight q, k, v, o;
    float *q_norm, *k_norm;
};

struct gdn_weights {
    struct bweight qkv, gate, beta, alpha, out;
    float *conv, *dt_bias, *a, *norm;
};

struct layer {
    bool is_gdn;
    float *attn_norm, *post_norm;
    struct attn_weights at;
    struct gdn_weights dn;
    struct bweight ffn_gate, ffn_up, ffn_down;
    int mem_il;                          /* its layer in the memory's KV cache or recurrent state */
};

struct mtp_weights {
    struct layer blk;                    /* a full-attention block with its own KV cache */
    struct bweight eh_proj;
    float *enorm, *hnorm, *head_norm;
};

/* Activation scratch for n_batch rows, sliced from one allocation. */
struct scratch {
    float *x, *x2, *a, *m, *qg, *k, *v, *att, *qkv, *z, *bet, *alp, *y, *o, *og;
    float *fg, *fu, *hn, *lm_in, *logits, *cat;
    /* device metadata: sections of one block, meta_stride (or QWEN35_META_SMALL) apart, in
     * this order, so that a forward uploads them in one copy */
    int32_t *tokens, *pos, *cells, *cell0, *nctx;
};

/* Graphs of the small batches (decode, draft rows, verify) on backends that have them: what
 * the recorded ops depend on besides device memory contents. */
#define QWEN35_GRAPH_MAX_ROWS 16
/* Metadata sections of a slice this small are packed this many rows apart, so that its upload
 * is one small copy: with n_batch 512 the sections span 8 KB, and an 8 KB host-to-device copy
 * costs ~9 µs on the device's timeline against ~2 µs for 256 bytes (H200, between graphs). */
#define QWEN35_META_SMALL 16
#define QWEN35_META_SECTIONS 5 /* tokens, pos, cells, cell0, nctx */
_Static_assert(QWEN35_META_SMALL * sizeof(int32_t) <= 64, "meta_stride, 64-byte rounded, holds a small slice");
/* Graph slots per sequence (the key includes the sequence: its state is baked into the graph).
 * A sequence's speculative cycle uses ~3·(n_max + 1) shapes (verify rows, the head's catch-up
 * rows, its chained row after each accepted count), and every short prompt adds shapes seen
 * once; the least recently used slot of the sequence is replaced, so one-off shapes push out
 * each other, not the cycle's. Every miss is an eager forward (hundreds of launches) and the
 * next sighting a recording. */
#define QWEN35_GRAPHS_PER_SEQ 48

struct graph_key {
    bool mtp;                            /* the NextN head, not the trunk */
    int n, seq;                          /* rows, all of one sequence */
    uint32_t want;                       /* rows that want logits, bit i = row i */
    bool keep;                           /* recurrent snapshots per row */
    const float *h_in;                   /* NextN input hidden rows */
    float *logits;                       /* where the slice's logits go */
    const struct bweight *head;          /* which LM head */
    const int32_t *ids;                  /* where the token ids are read */
    int32_t *argmax_out, *accept_out;    /* greedy picks on the device (model_batch) */
    float *hn;                           /* where the post-norm hidden rows go */
};

struct graph_slot {
    bool used;
    uint64_t last_use;                   /* graph_tick when last looked up */
    struct graph_key key;
    void *graph;                         /* NULL: seen once, not recorded yet */
};

struct qwen35 {
    struct model base;
    struct qwen35_hparams hp;
    struct layer *layers;
    struct bweight tok_embd, lm_head;
    float *out_norm;
    bool has_mtp;
    struct mtp_weights mtp;
    struct memory mem;                   /* the NextN head's cache is mem.head */
    /* The NextN head's drafts use a Q4_0 copy of the LM head when the LM head has more bits:
     * the head's logits are read once per draft token and a draft only has to be probable,
     * not exact (the target verifies it). draft_head_host holds its bytes. */
    struct bweight draft_head;
    void *draft_head_host;
    struct scratch s;
    void *scratch_block;
    /* host mirror of the metadata block (s.tokens ..), sections meta_stride int32s apart, or
     * QWEN35_META_SMALL apart for a slice of at most that many rows (slice_upload) */
    int32_t *h_meta, *meta;
    size_t meta_stride;
    struct graph_slot *graphs;           /* [n_seq][QWEN35_GRAPHS_PER_SEQ] recorded small-batch forwards */
    int n_graphs;
    uint64_t graph_tick;
};

static struct qwen35 *q35(struct model *m) { return (struct qwen35 *)m; }

/* ---- loading ------------------------------------------------------------------------ */

struct loader {
    struct gguf_file *g;
    struct backend *be;
    const char *arch;
    char *err;
    size_t err_size;
};

static int get_u32_req(struct loader *L, const char *key, int *out) {
    char k[256];
    uint32_t v;
    snprintf(k, sizeof k, "%s.%s", L->arch, key);
    int rc = gguf_get_u32(L->g, k, &v, L->err, L->err_size);
    if (rc == COTI_E_ARG) return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "missing metadata key %s", k);
    if (rc) return rc;
    if (v > (1u << 30)) return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "%s = %u is out of range", k, v);
    *out = (int)v;
    return 0;
}

static int get_u32_opt(struct loader *L, const char *key, int *out, int def) {
    *out = def;
    int rc = get_u32_req(L, key, out);
    if (rc == COTI_E_FORMAT && strncmp(L->err, "missing", 7) == 0) { *out = def; return 0; }
    return rc;
}

static int get_f32_opt(struct loader *L, const char *key, float *out, float def) {
    char k[256];
    snprintf(k, sizeof k, "%s.%s", L->arch, key);
    int rc = gguf_get_f32(L->g, k, out, L->err, L->err_size);
    if (rc == COTI_E_ARG) { *out = def; return 0; }
    return rc;
}

static int bind_matrix(struct loader *L, struct bweight *w, const char *name, int64_t n_in, int64_t n_out) {
    const struct gguf_tensor *t = gguf_find_tensor(L->g, name);
    if (!t) return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "missing tensor %s", name);
    if (t->n_dims != 2 || t->ne[0] != n_in || t->ne[1] != n_out)
        return coti_fail(L->err, L->err_size, COTI_E_FORMAT,
                         "tensor %s has shape {%lld, %lld} (%u dims), expected {%lld, %lld}", name,
                         (long long)t->ne[0], (long long)t->ne[1], t->n_dims, (long long)n_in, (long long)n_out);
    if (!ggml_type_supported(t->type))
        return coti_fail(L->err, L->err_size, COTI_E_UNSUPPORTED, "tensor %s has unsupported type %d", name, (int)t->type);
    int rc = L->be->weight_init(L->be, w, t->type, n_in, n_out, t->data);
    if (rc) return coti_fail(L->err, L->err_size, rc, "backend cannot hold tensor %s", name);
    return 0;
}

/* Rows [row0, row1) of a requantization split over a temporary thread pool. */
struct requant_job {
    const uint8_t *src;
    enum ggml_type src_type;
    size_t src_rb, dst_rb;
    uint8_t *dst;
    int64_t n, rows;
    atomic_bool oom;                     /* a worker could not get its row buffer */
};

static void requant_rows(void *arg, int ith, int nth) {
    struct requant_job *j = arg;
    float *row = malloc(sizeof(float) * (size_t)j->n);
    if (!row) { atomic_store(&j->oom, true); return; }
    for (int64_t r = j->rows * ith / nth; r < j->rows * (ith + 1) / nth; r++) {
        quant_dequantize_row_ref(j->src_type, j->src + (size_t)r * j->src_rb, row, j->n);
        quant_quantize_row_ref(GGML_TYPE_Q4_0, row, j->dst + (size_t)r * j->dst_rb, j->n);
    }
    free(row);
}

/* Above this many weights the requantization runs on every core: a 9B head (248320 x 4096)
 * takes ~5 s on one, and every load of an MTP model pays it. */
#define DRAFT_HEAD_PARALLEL_MIN (1 << 24)

/* q->draft_head: the LM head requantized to Q4_0 (via f32, llama.cpp's reference rounding)
 * when it has more than 4.5 bits per weight and the backend computes Q4_0; else the LM head
 * itself. Acceptance with it: docs/notes/2026-11-29-packed-q8_0.md. */
static int make_draft_head(struct loader *L, struct qwen35 *q) {
    const struct gguf_tensor *t = gguf_find_tensor(L->g, "output.weight");
    if (!t) t = gguf_find_tensor(L->g, "token_embd.weight");
    const struct ggml_type_traits *tr = ggml_type_traits_get(q->lm_head.type);
    const int64_t n = q->hp.n_embd, rows = q->hp.n_vocab;
    q->draft_head = q->lm_head;
    if (!t || !tr || (double)tr->block_bytes * 8.0 / tr->block_elems <= 4.5 || n % 32) return 0;
    struct requant_job j = {(const uint8_t *)t->data, t->type, ggml_row_size(t->type, n),
                            ggml_row_size(GGML_TYPE_Q4_0, n), NULL, n, rows, false};
    q->draft_head_host = j.dst = malloc(j.dst_rb * (size_t)rows);
    long ncpu = n * rows >= DRAFT_HEAD_PARALLEL_MIN ? sysconf(_SC_NPROCESSORS_ONLN) : 1;
    struct threadpool *tp = j.dst ? threadpool_init((int)COTI_MAX(1, COTI_MIN(ncpu, 64))) : NULL;
    if (tp) threadpool_run(tp, requant_rows, &j);
    threadpool_free(tp);
    if (!tp || atomic_load(&j.oom)) return coti_fail(L->err, L->err_size, COTI_E_NOMEM, "out of memory for the draft LM head");
    struct bweight w = {0};
    if (L->be->weight_init(L->be, &w, GGML_TYPE_Q4_0, n, rows, q->draft_head_host) == 0) q->draft_head = w;
    return 0;
}

/* A small f32 tensor copied to the backend; n elements (any shape with that count). */
static int bind_vector(struct loader *L, float **out, const char *name, int64_t n) {
    const struct gguf_tensor *t = gguf_find_tensor(L->g, name);
    if (!t) return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "missing tensor %s", name);
    int64_t count = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    if (t->type != GGML_TYPE_F32 || count != n)
        return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "tensor %s must be F32 with %lld elements (type %d, %lld elements)",
                         name, (long long)n, (int)t->type, (long long)count);
    *out = L->be->alloc(L->be, sizeof(float) * (size_t)n);
    if (!*out) return coti_fail(L->err, L->err_size, COTI_E_NOMEM, "out of memory for %s", name);
    L->be->upload(L->be, *out, t->data, sizeof(float) * (size_t)n);
    return 0;
}

static int read_hparams(struct loader *L, struct qwen35_hparams *hp) {
    int rc = 0;
    if ((rc = get_u32_req(L, "block_count", &hp->n_layer_all))) return rc;
    if ((rc = get_u32_opt(L, "nextn_predict_layers", &hp->n_mtp, 0))) return rc;
    if ((rc = get_u32_opt(L, "context_length", &hp->n_ctx_train, 4096))) return rc;
    if ((rc = get_u32_req(L, "embedding_length", &hp->n_embd))) return rc;
    if ((rc = get_u32_req(L, "feed_forward_length", &hp->n_ff))) return rc;
    if ((rc = get_u32_req(L, "attention.head_count", &hp->n_head))) return rc;
    if ((rc = get_u32_opt(L, "attention.head_count_kv", &hp->n_head_kv, hp->n_head))) return rc;
    if (hp->n_head < 1 || hp->n_head_kv < 1 || hp->n_head % hp->n_head_kv)
        return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "head_count %d must be a positive multiple of head_count_kv %d",
                         hp->n_head, hp->n_head_kv);
    if ((rc = get_u32_opt(L, "attention.key_length", &hp->head_dim, hp->n_embd / hp->n_head))) return rc;
    int vlen;
    if ((rc = get_u32_opt(L, "attention.value_length", &vlen, hp->head_dim))) return rc;
    if (vlen != hp->head_dim)
        return coti_fail(L->err, L->err_size, COTI_E_UNSUPPORTED, "value_length %d != key_length %d", vlen, hp->head_dim);
    if ((rc = get_u32_opt(L, "rope.dimension_count", &hp->n_rot, hp->head_dim))) return rc;
    if ((rc = get_u32_req(L, "ssm.conv_kernel", &hp->ssm_k))) return rc;
    int inner;
    if ((rc = get_u32_req(L, "ssm.inner_size", &inner))) return rc;
    if ((rc = get_u32_req(L, "ssm.state_size", &hp->ssm_dk))) return rc;
    if ((rc = get_u32_req(L, "ssm.time_step_rank", &hp->ssm_nv))) return rc;
    if ((rc = get_u32_req(L, "ssm.group_count", &hp->ssm_nk))) return rc;
    if ((rc = get_u32_opt(L, "full_attention_interval", &hp->interval, 4))) return rc;
    char k[128];
    snprintf(k, sizeof k, "%s.attention.layer_norm_rms_epsilon", L->arch);
    rc = gguf_get_f32(L->g, k, &hp->eps, L->err, L->err_size);
    if (rc == COTI_E_ARG) return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "missing metadata key %s", k);
    if (rc) return rc;
    if ((rc = get_f32_opt(L, "rope.freq_base", &hp->rope_base, 10000.0f))) return rc;

    if (hp->ssm_nv < 1 || hp->ssm_nk < 1 || hp->ssm_nv % hp->ssm_nk || inner % hp->ssm_nv)
        return coti_fail(L->err, L->err_size, COTI_E_FORMAT, "ssm heads: time_step_rank %d, group_count %d, inner_size %d are inconsistent",
                         hp->ssm_nv, hp->ssm_nk, inner);
    hp->ssm_dv = inner / hp->ssm_nv;
    if (hp->ssm_dv != hp->ssm_dk)
        return coti_fail(L->err, L->err_size, COTI_E_UNSUPPORTED, "delta-net value head dim %d != key head dim %d", hp->ssm_dv, hp->ssm_dk);
    const int64_t widths[] = {
        hp->n_embd, 2 * (int64_t)hp->n_embd, hp->n_ff, 2 * (int64_t)hp->n_head * hp->head_dim,
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
    return 0;
}

static int bind_attention(struct loader *L, const struct qwen35_hparams *hp, struct layer *ly, int il) {
    char n[128];
    int rc, E = hp->n_embd, D = hp->head_dim;
#define NAME(suffix) (snprintf(n, sizeof n, "blk.%d." suffix, il), n)
    if ((rc = bind_matrix(L, &ly->at.q, NAME("attn_q.weight"), E, 2 * hp->n_head * D))) return rc;
    if ((rc = bind_matrix(L, &ly->at.k, NAME("attn_k.weight"), E, hp->n_head_kv * D))) return rc;
    if ((rc = bind_matrix(L, &ly->at.v, NAME("attn_v.weight"), E, hp->n_head_kv * D))) return rc;
    if ((rc = bind_matrix(L, &ly->at.o, NAME("attn_output.weight"), hp->n_head * D, E))) return rc;
    if ((rc = bind_vector(L, &ly->at.q_norm, NAME("attn_q_norm.weight"), D))) return rc;
    if ((rc = bind_vector(L, &ly->at.k_norm, NAME("attn_k_norm.weight"), D))) return rc;
    return 0;
}

static int bind_layer(struct loader *L, const struct qwen35_hparams *hp, struct layer *ly, int il) {
    char n[128];
    int rc, E = hp->n_embd;
    if ((rc = bind_vector(L, &ly->attn_norm, NAME("attn_norm.weight"), E))) return rc;
    if ((rc = bind_vector(L, &ly->post_norm, NAME("post_attention_norm.weight"), E))) return rc;
    if ((rc = bind_matrix(L, &ly->ffn_gate, NAME("ffn_gate.weight"), E, hp->n_ff))) return rc;
    if ((rc = bind_matrix(L, &ly->ffn_up, NAME("ffn_up.weight"), E, hp->n_ff))) return rc;
    if ((rc = bind_matrix(L, &ly->ffn_down, NAME("ffn_down.weight"), hp->n_ff, E))) return rc;
    if (!ly->is_gdn) return bind_attention(L, hp, ly, il);
    int nvdv = hp->ssm_nv * hp->ssm_dv;
    if ((rc = bind_matrix(L, &ly->dn.qkv, NAME("attn_qkv.weight"), E, hp->ssm_ch))) return rc;
    if ((rc = bind_matrix(L, &ly->dn.gate, NAME("attn_gate.weight"), E, nvdv))) return rc;
    if ((rc = bind_matrix(L, &ly->dn.beta, NAME("ssm_beta.weight"), E, hp->ssm_nv))) return rc;
    if ((rc = bind_matrix(L, &ly->dn.alpha, NAME("ssm_alpha.weight"), E, hp->ssm_nv))) return rc;
    if ((rc = bind_matrix(L, &ly->dn.out, NAME("ssm_out.weight"), nvdv, E))) return rc;
    if ((rc = bind_vector(L, &ly->dn.conv, NAME("ssm_conv1d.weight"), (int64_t)hp->ssm_k * hp->ssm_ch))) return rc;
    if ((rc = bind_vector(L, &ly->dn.dt_bias, NAME("ssm_dt.bias"), hp->ssm_nv))) return rc;
    if ((rc = bind_vector(L, &ly->dn.a, NAME("ssm_a"), hp->ssm_nv))) return rc;
    if ((rc = bind_vector(L, &ly->dn.norm, NAME("ssm_norm.weight"), hp->ssm_dv))) return rc;
    return 0;
}

static int bind_mtp(struct loader *L, const struct qwen35_hparams *hp, struct mtp_weights *mt) {
    char n[128];
    int rc, il = hp->n_layer, E = hp->n_embd;
    mt->blk.is_gdn = false;
    if ((rc = bind_layer(L, hp, &mt->blk, il))) return rc;
    if ((rc = bind_matrix(L, &mt->eh_proj, NAME("nextn.eh_proj.weight"), 2 * E, E))) return rc;
    if ((rc = bind_vector(L, &mt->enorm, NAME("nextn.enorm.weight"), E))) return rc;
    if ((rc = bind_vector(L, &mt->hnorm, NAME("nextn.hnorm.weight"), E))) return rc;
    if (gguf_find_tensor(L->g, NAME("nextn.shared_head_norm.weight"))) {
        if ((rc = bind_vector(L, &mt->head_norm, n, E))) return rc;
    } else {
        mt->head_norm = NULL; /* falls back to output_norm */
    }
    if (gguf_find_tensor(L->g, NAME("nextn.embed_tokens.weight")) || gguf_find_tensor(L->g, NAME("nextn.shared_head_head.weight")))
        return coti_fail(L->err, L->err_size, COTI_E_UNSUPPORTED, "separate NextN embedding/head tensors are not supported");
    return 0;
#undef NAME
}

static void free_vec(struct backend *be, float *p) { if (p) be->free(be, p); }

/* Everything a layer may hold; fields never bound are NULL (the layers are calloc'ed). */
static void free_layer(struct backend *be, struct layer *ly) {
    free_vec(be, ly->attn_norm); free_vec(be, ly->post_norm);
    free_vec(be, ly->at.q_norm); free_vec(be, ly->at.k_norm);
    free_vec(be, ly->dn.conv); free_vec(be, ly->dn.dt_bias); free_vec(be, ly->dn.a); free_vec(be, ly->dn.norm);
    struct bweight *ws[] = {&ly->at.q, &ly->at.k, &ly->at.v, &ly->at.o, &ly->dn.qkv, &ly->dn.gate,
                            &ly->dn.beta, &ly->dn.alpha, &ly->dn.out, &ly->ffn_gate, &ly->ffn_up, &ly->ffn_down};
    for (size_t i = 0; i < COTI_ARRAY_LEN(ws); i++) if (ws[i]->data) be->weight_free(be, ws[i]);
}

static void qwen35_free(struct model *m) {
    struct qwen35 *q = q35(m);
    struct backend *be = m->be;
    if (q->layers) {
        for (int il = 0; il < q->hp.n_layer; il++) free_layer(be, &q->layers[il]);
        free(q->layers);
    }
    /* also when has_mtp is still false: a NextN layer that failed half-way is partly bound */
    free_layer(be, &q->mtp.blk);
    if (q->mtp.eh_proj.data) be->weight_free(be, &q->mtp.eh_proj);
    free_vec(be, q->mtp.enorm); free_vec(be, q->mtp.hnorm); free_vec(be, q->mtp.head_norm);
    if (q->draft_head_host) {
        if (q->draft_head.data) be->weight_free(be, &q->draft_head);
        free(q->draft_head_host);
    }
    /* a tied head shares the embedding's storage: free it once, before the embedding */
    if (q->lm_head.data && q->lm_head.data != q->tok_embd.data) be->weight_free(be, &q->lm_head);
    if (q->tok_embd.data) be->weight_free(be, &q->tok_embd);
    free_vec(be, q->out_norm);
    if (q->scratch_block) be->free(be, q->scratch_block);
    for (int i = 0; q->graphs && i < q->n_graphs; i++) if (q->graphs[i].graph) be->graph_free(be, q->graphs[i].graph);
    free(q->graphs);
    free(q->h_meta);
    memory_free(&q->mem);
    gguf_close(m->gguf);
    free(q);
}

/* Slice every activation buffer out of one backend allocation (llm.c's malloc_and_point). */
static int alloc_scratch(struct qwen35 *q) {
    const struct qwen35_hparams *hp = &q->hp;
    struct model *m = &q->base;
    const size_t nb = (size_t)m->n_batch;
    const int HD = hp->n_head * hp->head_dim, KV = hp->n_head_kv * hp->head_dim;
    const int NVD = hp->ssm_nv * hp->ssm_dv;
    struct { float **p; size_t n; } f[] = {
        {&q->s.x, nb * hp->n_embd}, {&q->s.x2, nb * hp->n_embd}, {&q->s.a, nb * hp->n_embd}, {&q->s.m, nb * hp->n_embd},
        {&q->s.qg, nb * 2 * HD}, {&q->s.k, nb * KV}, {&q->s.v, nb * KV}, {&q->s.att, nb * HD},
        {&q->s.qkv, nb * hp->ssm_ch}, {&q->s.z, nb * NVD}, {&q->s.bet, nb * hp->ssm_nv},
        {&q->s.alp, nb * hp->ssm_nv}, {&q->s.y, nb * hp->ssm_ch},
        {&q->s.o, nb * NVD}, {&q->s.og, nb * NVD},
        {&q->s.fg, nb * hp->n_ff}, {&q->s.fu, nb * hp->n_ff}, {&q->s.hn, nb * hp->n_embd},
        {&q->s.lm_in, nb * hp->n_embd}, {&q->s.logits, nb * hp->n_vocab}, {&q->s.cat, nb * 2 * hp->n_embd},
    };
    q->meta_stride = ((nb * sizeof(int32_t) + 63) & ~(size_t)63) / sizeof(int32_t);
    size_t total = 0;
    for (size_t i = 0; i < COTI_ARRAY_LEN(f); i++) total += (f[i].n * sizeof(float) + 63) & ~(size_t)63;
    total += QWEN35_META_SECTIONS * q->meta_stride * sizeof(int32_t);
    uint8_t *blk = m->be->alloc(m->be, total);
    if (!blk) return COTI_E_NOMEM;
    q->scratch_block = blk;
    size_t off = 0;
    for (size_t i = 0; i < COTI_ARRAY_LEN(f); i++) {
        *f[i].p = (float *)(blk + off);
        off += (f[i].n * sizeof(float) + 63) & ~(size_t)63;
    }
    q->meta = (int32_t *)(blk + off); /* laid out per slice by slice_upload */
    q->h_meta = calloc(QWEN35_META_SECTIONS * q->meta_stride, sizeof(int32_t));
    q->n_graphs = QWEN35_GRAPHS_PER_SEQ * m->n_seq;
    q->graphs = calloc((size_t)q->n_graphs, sizeof *q->graphs);
    return (q->h_meta && q->graphs) ? 0 : COTI_E_NOMEM;
}

/* The memory of the trunk's layers (attention KV or delta-net state) and the NextN head's KV. */
static int alloc_memory(struct qwen35 *q) {
    struct model *m = &q->base;
    const struct qwen35_hparams *hp = &q->hp;
    struct kv_layer_spec *kv = calloc((size_t)hp->n_layer + 1, sizeof *kv);
    if (!kv) return COTI_E_NOMEM;
    int n_kv = 0, n_rec = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        struct layer *ly = &q->layers[il];
        if (ly->is_gdn) ly->mem_il = n_rec++;
        else kv[ly->mem_il = n_kv++] = (struct kv_layer_spec){hp->n_head_kv, hp->head_dim, -1};
    }
    const struct kv_layer_spec head = {hp->n_head_kv, hp->head_dim, -1};
    const struct memory_params p = {.n_seq = m->n_seq, .n_ctx = m->n_ctx, .n_keep = m->n_keep_states,
                                    .kv = kv, .n_kv = n_kv, .n_rec = n_rec,
                                    .conv_elems = (size_t)(hp->ssm_k - 1) * hp->ssm_ch,
                                    .ssm_elems = (size_t)hp->ssm_nv * hp->ssm_dk * hp->ssm_dv,
                                    .head_kv = &head, .n_head_kv = q->has_mtp ? 1 : 0};
    int rc = memory_init(&q->mem, m->be, &p);
    free(kv);
    m->seq_len = q->mem.seq_len;
    return rc;
}

static const struct model_vtable qwen35_vtable;

int qwen35_load(struct model **out, struct gguf_file *g, struct backend *be,
                const struct model_params *p, char *err, size_t err_size) {
    struct loader L = {g, be, "qwen35", err, err_size};
    struct qwen35 *q = calloc(1, sizeof(*q));
    if (!q) return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory");
    struct model *m = &q->base;
    m->vt = &qwen35_vtable;
    m->be = be;
    m->n_seq = p->n_seq;
    m->n_ctx = p->n_ctx;
    m->n_batch = p->n_batch;
    m->n_keep_states = p->n_keep_states;
    struct qwen35_hparams *hp = &q->hp;
    int rc = read_hparams(&L, hp);
    if (rc) { free(q); return rc; }
    m->gguf = g; /* owned once loading succeeds: qwen35_free closes it */

    const struct gguf_tensor *te = gguf_find_tensor(g, "token_embd.weight");
    if (!te || te->n_dims != 2 || te->ne[0] != hp->n_embd || te->ne[1] < 1 || te->ne[1] > (1 << 24)) {
        rc = coti_fail(err, err_size, COTI_E_FORMAT, "token_embd.weight missing or not {%d, n_vocab}", hp->n_embd);
        goto fail;
    }
    hp->n_vocab = (int)te->ne[1];
    if ((rc = bind_matrix(&L, &q->tok_embd, "token_embd.weight", hp->n_embd, hp->n_vocab))) goto fail;
    if (gguf_find_tensor(g, "output.weight")) {
        if ((rc = bind_matrix(&L, &q->lm_head, "output.weight", hp->n_embd, hp->n_vocab))) goto fail;
    } else {
        q->lm_head = q->tok_embd; /* tied */
    }
    if ((rc = bind_vector(&L, &q->out_norm, "output_norm.weight", hp->n_embd))) goto fail;
    q->layers = calloc((size_t)hp->n_layer, sizeof(struct layer));
    if (!q->layers) { rc = coti_fail(err, err_size, COTI_E_NOMEM, "out of memory"); goto fail; }
    for (int il = 0; il < hp->n_layer; il++) {
        q->layers[il].is_gdn = (il + 1) % hp->interval != 0;
        if ((rc = bind_layer(&L, hp, &q->layers[il], il))) goto fail;
    }
    if (hp->n_mtp == 1) {
        if ((rc = bind_mtp(&L, hp, &q->mtp))) goto fail;
        q->has_mtp = true;
        if ((rc = make_draft_head(&L, q))) goto fail;
    }
    if ((rc = alloc_scratch(q)) || (rc = alloc_memory(q))) {
        rc = coti_fail(err, err_size, COTI_E_NOMEM, "out of memory for activations/KV (n_seq %d, n_ctx %d, n_batch %d)",
                       m->n_seq, m->n_ctx, m->n_batch);
        goto fail;
    }
    m->info = (struct model_info){.arch = "qwen35", .n_vocab = hp->n_vocab, .n_embd = hp->n_embd, .n_layer = hp->n_layer,
                                  .n_ctx_train = hp->n_ctx_train, .has_mtp = q->has_mtp, .has_recurrent = true};
    *out = m;
    return 0;
fail:
    m->gguf = NULL; /* on failure the caller keeps the file (model_load closes it) */
    qwen35_free(m);
    return rc;
}

/* ---- forward -------------------------------------------------------------------------- */

/* A run: the consecutive rows of one sequence in a batch slice. */
struct run { int start, len, seq; };

#define QWEN35_MAX_RUNS 256

struct slice {
    int n, n_runs;
    const int32_t *tokens, *pos, *seq;
    const int32_t *tokens_dev;   /* backend memory, instead of tokens */
    struct run runs[QWEN35_MAX_RUNS];
};

/* The residual step that opens a block: its input is rmsnorm(x + m) ⊙ norm (m NULL: of x),
 * and x + m goes to x_out, the next residual (fused into the block's first matmul). */
struct block_in {
    const float *x, *m, *norm;
    float *x_out;
};

static void block_matmul_n(struct qwen35 *q, const struct block_in *in, const struct bweight *const *ws,
                           float *const *ys, int n_w, int n) {
    struct backend *be = q->base.be;
    be->norm_matmul_n(be, in->x, in->m, in->x_out, in->norm, q->hp.eps, q->s.a, ws, ys, n_w, n);
}

/* SwiGLU FFN → s.m. */
static void ffn_block(struct qwen35 *q, const struct layer *ly, const struct block_in *in, int n) {
    struct backend *be = q->base.be;
    const struct bweight *ws[2] = {&ly->ffn_gate, &ly->ffn_up};
    float *ys[2] = {q->s.fg, q->s.fu};
    block_matmul_n(q, in, ws, ys, 2, n);
    be->swiglu_matmul(be, &ly->ffn_down, q->s.fg, q->s.fu, n, q->s.m);
}

/* Gated full attention → s.m, using cache rows s.cells / s.cell0 / s.nctx of kv. */
static void attn_block(struct qwen35 *q, const struct layer *ly, const struct kv_view *kv, const struct block_in *in,
                       int n) {
    struct backend *be = q->base.be;
    const struct qwen35_hparams *hp = &q->hp;
    const int D = hp->head_dim, H = hp->n_head, KV = hp->n_head_kv * D;
    const struct bweight *ws[3] = {&ly->at.q, &ly->at.k, &ly->at.v};
    float *ys[3] = {q->s.qg, q->s.k, q->s.v};
    block_matmul_n(q, in, ws, ys, 3, n);
    /* q rows hold [q_h ; gate_h] per head: per-head norm over the first D of every 2D */
    be->attn_prep(be, q->s.qg, 2 * H * D, 2 * D, ly->at.q_norm, q->s.k, KV, ly->at.k_norm, q->s.v, KV, hp->eps, n, H,
                  hp->n_head_kv, D, hp->n_rot, q->s.pos, hp->rope_base, q->s.cells, kv->k, kv->v);
    be->attention(be, q->s.qg, 2 * H * D, 2 * D, kv->k, kv->v, q->s.cell0, q->s.nctx, n, H,
                  hp->n_head_kv, D, 1.0f / sqrtf((float)D), q->s.att);
    be->mul_sigmoid_matmul(be, q->s.att, q->s.qg + D, H, D, 2 * H * D, 2 * D, &ly->at.o, n, q->s.m);
}

/* Gated delta net → s.m; recurrent state per sequence run. */
static void gdn_block(struct qwen35 *q, const struct layer *ly, const struct block_in *in, const struct slice *sl,
                      bool keep) {
    struct backend *be = q->base.be;
    const struct qwen35_hparams *hp = &q->hp;
    const int n = sl->n, NVD = hp->ssm_nv * hp->ssm_dv;
    const struct bweight *ws[4] = {&ly->dn.qkv, &ly->dn.gate, &ly->dn.beta, &ly->dn.alpha};
    float *ys[4] = {q->s.qkv, q->s.z, q->s.bet, q->s.alp};
    block_matmul_n(q, in, ws, ys, 4, n);
    const struct rec_state *rec = &q->mem.rec;
    for (int r = 0; r < sl->n_runs; r++) {
        const struct run *ru = &sl->runs[r];
        const int s = ru->seq;
        /* the state after the run's last token is the live state: snapshot the others only */
        const int n_snap = keep ? COTI_MIN(ru->len - 1, rec->n_keep) : 0;
        float *conv_snap = n_snap ? rec_conv_snap(rec, ly->mem_il, s) : NULL;
        float *ssm_snap = n_snap ? rec_ssm_snap(rec, ly->mem_il, s) : NULL;
        float *ssm_state = rec_ssm(rec, ly->mem_il, s);
        be->ssm_conv(be, q->s.qkv + (size_t)ru->start * hp->ssm_ch, ru->len, hp->ssm_ch, hp->ssm_k, ly->dn.conv,
                     rec_conv(rec, ly->mem_il, s), q->s.y + (size_t)ru->start * hp->ssm_ch, conv_snap, n_snap);
        const float *y = q->s.y + (size_t)ru->start * hp->ssm_ch;
        const struct gdn_gates gates = {q->s.alp + (size_t)ru->start * hp->ssm_nv, q->s.bet + (size_t)ru->start * hp->ssm_nv,
                                        ly->dn.dt_bias, ly->dn.a, hp->ssm_nv, hp->ssm_nv};
        float *o = q->s.o + (size_t)ru->start * NVD;
        if (ru->len >= QWEN35_CHUNKED_MIN_RUN && !n_snap)
            be->gdn_chunked(be, y, hp->ssm_ch, &gates, ssm_state, ru->len, hp->ssm_nk,
                            hp->ssm_nv, hp->ssm_dk, hp->ssm_dv, hp->eps, o);
        else
            be->gdn(be, y, hp->ssm_ch, &gates, ssm_state, ru->len, hp->ssm_nk,
                    hp->ssm_nv, hp->ssm_dk, hp->ssm_dv, hp->eps, o, ssm_snap, n_snap);
    }
    be->rmsnorm_gated_matmul(be, q->s.o, ly->dn.norm, q->s.z, hp->ssm_dv, hp->eps, q->s.og, &ly->dn.out, n, q->s.m);
}

/* Check a batch slice against the sequences' state and split it into runs. */
static int slice_check(struct qwen35 *q, struct slice *sl, const int32_t *len, char *err, size_t err_size) {
    struct model *m = &q->base;
    sl->n_runs = 0;
    for (int i = 0; i < sl->n; i++) {
        int s = sl->seq ? sl->seq[i] : 0;
        if (s < 0 || s >= m->n_seq) return coti_fail(err, err_size, COTI_E_ARG, "row %d: sequence %d out of range [0, %d)", i, s, m->n_seq);
        if (sl->tokens && (sl->tokens[i] < 0 || sl->tokens[i] >= q->hp.n_vocab))
            return coti_fail(err, err_size, COTI_E_ARG, "row %d: token %d out of range [0, %d)", i, sl->tokens[i], q->hp.n_vocab);
        if (i == 0 || s != sl->runs[sl->n_runs - 1].seq) {
            for (int r = 0; r < sl->n_runs; r++)
                if (sl->runs[r].seq == s) return coti_fail(err, err_size, COTI_E_ARG, "row %d: rows of sequence %d are not contiguous", i, s);
            if (sl->n_runs == QWEN35_MAX_RUNS) return coti_fail(err, err_size, COTI_E_ARG, "more than %d sequences in one batch", QWEN35_MAX_RUNS);
            if (sl->pos[i] != len[s])
                return coti_fail(err, err_size, COTI_E_ARG, "row %d: position %d does not continue sequence %d (length %d)", i, sl->pos[i], s, len[s]);
            sl->runs[sl->n_runs++] = (struct run){i, 1, s};
        } else {
            struct run *ru = &sl->runs[sl->n_runs - 1];
            if (sl->pos[i] != sl->pos[i - 1] + 1)
                return coti_fail(err, err_size, COTI_E_ARG, "row %d: positions of sequence %d are not consecutive", i, s);
            ru->len++;
        }
        if (sl->pos[i] >= m->n_ctx)
            return coti_fail(err, err_size, COTI_E_RANGE, "sequence %d: position %d exceeds the context size %d", s, sl->pos[i], m->n_ctx);
    }
    return 0;
}

/* Upload a slice's token / position / cell metadata: one copy from the host (each copy is a
 * node on the device's timeline, a few µs of a decode step). Tokens already on the device
 * (greedy drafts) are read where they are. */
static void slice_upload(struct qwen35 *q, const struct slice *sl) {
    struct backend *be = q->base.be;
    /* the ops (and a graph recorded from them) read the sections where this slice puts them */
    const size_t st = sl->n <= QWEN35_META_SMALL ? QWEN35_META_SMALL : q->meta_stride;
    q->s.tokens = q->meta;
    q->s.pos = q->meta + st;
    q->s.cells = q->meta + 2 * st;
    q->s.cell0 = q->meta + 3 * st;
    q->s.nctx = q->meta + 4 * st;
    int32_t *tok = q->h_meta, *pos = tok + st, *cells = pos + st, *cell0 = cells + st, *nctx = cell0 + st;
    for (int i = 0; i < sl->n; i++) {
        int s = sl->seq ? sl->seq[i] : 0;
        if (!sl->tokens_dev) tok[i] = sl->tokens[i];
        pos[i] = sl->pos[i];
        cell0[i] = s * q->base.n_ctx;
        cells[i] = cell0[i] + sl->pos[i];
        nctx[i] = sl->pos[i] + 1;
    }
    const size_t end = 4 * st + (size_t)sl->n; /* through nctx's rows */
    if (sl->tokens_dev) be->upload(be, q->s.pos, pos, sizeof(int32_t) * (end - st));
    else be->upload(be, q->s.tokens, tok, sizeof(int32_t) * end);
}

/* Rows [i0, i0 + n) of batch b as a slice (runs are filled in by slice_check). */
static void slice_take(struct slice *sl, const struct model_batch *b, int i0, int n) {
    sl->n = n;
    sl->tokens = b->tokens_dev ? NULL : b->tokens + i0;
    sl->tokens_dev = b->tokens_dev ? b->tokens_dev + i0 : NULL;
    sl->pos = b->pos + i0;
    sl->seq = b->seq ? b->seq + i0 : NULL;
}

static bool row_wants_logits(const bool *want, bool last_only, int n, int i) {
    return want ? want[i] : (last_only && i == n - 1);
}

/* lm_head over the rows of hidden (final-normed) that want logits: straight from hidden when
 * they are consecutive (the last row, a verify batch), else gathered first. */
static int head_rows(struct qwen35 *q, const struct bweight *head, const float *hidden, int n, const bool *want,
                     bool last_only, float *logits) {
    struct backend *be = q->base.be;
    const int E = q->hp.n_embd;
    int n_out = 0, first = -1, last = -1;
    for (int i = 0; i < n; i++) {
        if (!row_wants_logits(want, last_only, n, i)) continue;
        if (first < 0) first = i;
        last = i;
        n_out++;
    }
    if (!n_out) return 0;
    if (last - first + 1 == n_out) {
        be->matmul(be, head, hidden + (size_t)first * E, n_out, logits);
        return n_out;
    }
    n_out = 0;
    for (int i = 0; i < n; i++) {
        if (!row_wants_logits(want, last_only, n, i)) continue;
        be->copy(be, q->s.lm_in + (size_t)n_out * E, hidden + (size_t)i * E, sizeof(float) * E);
        n_out++;
    }
    be->matmul(be, head, q->s.lm_in, n_out, logits);
    return n_out;
}

/* What the ops of one slice's forward read besides device memory. */
struct slice_ops_args {
    const struct slice *sl;
    const bool *want;            /* per row of the slice, or NULL: last row if last_only */
    bool last_only, keep;
    float *logits;               /* the slice's first logits row */
    const struct bweight *head;  /* the LM head (NextN drafting: maybe its cheaper copy) */
    const float *h_in;           /* NextN only */
    const int32_t *ids;          /* the slice's token ids (backend memory) */
    int32_t *argmax_out, *accept_out;
    float *hn;                   /* where the post-norm hidden rows go */
};

/* The LM head and the greedy picks that read its rows. */
static void head_ops(struct qwen35 *q, const struct slice_ops_args *a) {
    struct backend *be = q->base.be;
    const int n = a->sl->n;
    const int n_out = head_rows(q, a->head, a->hn, n, a->want, a->last_only, a->logits);
    if (!a->argmax_out || !n_out) return;
    be->argmax(be, a->logits, n_out, q->hp.n_vocab, a->argmax_out, NULL);
    if (a->accept_out) be->accept_greedy(be, a->ids + 1, a->argmax_out, n - 1, a->accept_out);
}

static void trunk_ops(struct qwen35 *q, const struct slice_ops_args *a) {
    struct backend *be = q->base.be;
    const struct qwen35_hparams *hp = &q->hp;
    const int E = hp->n_embd, n = a->sl->n;
    be->get_rows(be, &q->tok_embd, a->ids, n, q->s.x);
    /* the residual stream alternates between s.x and s.x2: a fused add writes the other one */
    float *x = q->s.x, *x_next = q->s.x2;
    for (int il = 0; il < hp->n_layer; il++) {
        const struct layer *ly = &q->layers[il];
        const struct block_in in = {x, il ? q->s.m : NULL, ly->attn_norm, x_next};
        if (ly->is_gdn) gdn_block(q, ly, &in, a->sl, a->keep);
        else attn_block(q, ly, &q->mem.kv.layers[ly->mem_il], &in, n);
        if (il) { float *t = x; x = x_next; x_next = t; }
        const struct block_in ffn_in = {x, q->s.m, ly->post_norm, x_next};
        ffn_block(q, ly, &ffn_in, n);
        float *t = x; x = x_next; x_next = t;
    }
    be->add_rmsnorm(be, x, q->s.m, q->out_norm, n, E, hp->eps, a->hn);
    head_ops(q, a);
    if (a->accept_out && a->keep) {
        /* the rollback of the rejected drafts, here rather than after the host has read the
         * count: the state after the last accepted row (accept_out[0]) becomes the live one */
        const struct mem_regions *g = &q->mem.rg;
        const int n_rg = memory_restore_regions(&q->mem, a->sl->runs[0].seq);
        be->copy_n_at(be, g->dst, g->src, g->step, g->bytes, n_rg, a->accept_out, n - 1);
    }
}

static void mtp_ops(struct qwen35 *q, const struct slice_ops_args *a) {
    struct backend *be = q->base.be;
    const struct qwen35_hparams *hp = &q->hp;
    const struct mtp_weights *mt = &q->mtp;
    const int E = hp->n_embd, n = a->sl->n;
    /* u = eh_proj · [enorm(embed(x)) ; hnorm(h_in)] */
    be->get_rows(be, &q->tok_embd, a->ids, n, q->s.x2);
    be->norm2_matmul(be, q->s.x2, mt->enorm, a->h_in, mt->hnorm, E, hp->eps, q->s.cat, &mt->eh_proj, n, q->s.x);
    const struct block_in in = {q->s.x, NULL, mt->blk.attn_norm, NULL};
    attn_block(q, &mt->blk, &q->mem.head.layers[0], &in, n);
    const struct block_in ffn_in = {q->s.x, q->s.m, mt->blk.post_norm, q->s.x2};
    ffn_block(q, &mt->blk, &ffn_in, n);
    be->add_rmsnorm(be, q->s.x2, q->s.m, mt->head_norm ? mt->head_norm : q->out_norm, n, E, hp->eps, a->hn);
    head_ops(q, a);
}

static bool graph_key_eq(const struct graph_key *x, const struct graph_key *y) {
    return x->mtp == y->mtp && x->n == y->n && x->seq == y->seq && x->want == y->want && x->keep == y->keep &&
           x->h_in == y->h_in && x->logits == y->logits && x->head == y->head && x->ids == y->ids &&
           x->argmax_out == y->argmax_out && x->accept_out == y->accept_out && x->hn == y->hn;
}

/* Queue one slice's ops (metadata already uploaded). A small single-sequence slice on a backend
 * with graphs is a graph replay: its shape is recorded the second time it is seen (the first
 * run, eager, also grows the backend's scratch to it) and replayed from then on, which turns a
 * launch-bound step of a few hundred kernel launches into one. */
static void slice_ops(struct qwen35 *q, bool mtp, const struct slice_ops_args *a) {
    struct backend *be = q->base.be;
    void (*ops)(struct qwen35 *, const struct slice_ops_args *) = mtp ? mtp_ops : trunk_ops;
    const struct slice *sl = a->sl;
    if (!be->capture_begin || sl->n_runs != 1 || sl->n > QWEN35_GRAPH_MAX_ROWS) {
        ops(q, a);
        return;
    }
    struct graph_key key = {.mtp = mtp, .n = sl->n, .seq = sl->runs[0].seq, .keep = a->keep, .h_in = a->h_in,
                           .logits = a->logits, .head = a->head, .ids = a->ids, .argmax_out = a->argmax_out,
                           .accept_out = a->accept_out, .hn = a->hn};
    for (int i = 0; i < sl->n; i++) key.want |= (uint32_t)row_wants_logits(a->want, a->last_only, sl->n, i) << i;
    struct graph_slot *g = NULL;
    struct graph_slot *tab = q->graphs + (size_t)key.seq * QWEN35_GRAPHS_PER_SEQ, *lru = tab;
    for (int i = 0; i < QWEN35_GRAPHS_PER_SEQ && !g; i++) {
        if (tab[i].used && graph_key_eq(&tab[i].key, &key)) g = &tab[i];
        else if (tab[i].last_use < lru->last_use) lru = &tab[i];
    }
    if (g) g->last_use = ++q->graph_tick;
    if (!g) { /* first sighting */
        g = lru;
        if (g->graph) be->graph_free(be, g->graph);
        *g = (struct graph_slot){.used = true, .last_use = ++q->graph_tick, .key = key};
        ops(q, a);
        return;
    }
    if (g->graph) {
        if (be->graph_launch(be, g->graph)) return;
        be->graph_free(be, g->graph); /* stale: record it again */
        g->graph = NULL;
    }
    be->capture_begin(be);
    ops(q, a);
    g->graph = be->capture_end(be);
    if (!g->graph || !be->graph_launch(be, g->graph)) ops(q, a);
}

static int qwen35_forward(struct model *m, const struct model_batch *b, struct model_output *out,
                          char *err, size_t err_size) {
    struct qwen35 *q = q35(m);
    const struct qwen35_hparams *hp = &q->hp;
    if (b->n < 1) return coti_fail(err, err_size, COTI_E_ARG, "empty batch");
    /* the logits buffer holds n_batch rows */
    int want_total = 0;
    for (int i = 0; i < b->n; i++) want_total += b->want_logits ? b->want_logits[i] : (i == b->n - 1);
    if (want_total > m->n_batch)
        return coti_fail(err, err_size, COTI_E_ARG, "batch wants %d logit rows, at most %d", want_total, m->n_batch);
    if (b->accept_out && (!b->argmax_out || !b->tokens_dev || want_total != b->n || b->n > m->n_batch))
        return coti_fail(err, err_size, COTI_E_ARG, "a verify batch needs argmax_out, device tokens and logits on "
                         "every row, in one step of at most %d rows", m->n_batch);
    if (b->hidden_out && b->n > m->n_batch)
        return coti_fail(err, err_size, COTI_E_ARG, "hidden_out takes one step of at most %d rows", m->n_batch);
    /* All slices are validated before any state changes, so a bad batch leaves memory intact. */
    int32_t *len = malloc(sizeof(int32_t) * (size_t)m->n_seq);
    if (!len) return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory");
    memcpy(len, m->seq_len, sizeof(int32_t) * (size_t)m->n_seq);
    struct slice sl;
    for (int i0 = 0; i0 < b->n; i0 += m->n_batch) {
        slice_take(&sl, b, i0, COTI_MIN(m->n_batch, b->n - i0));
        int rc = slice_check(q, &sl, len, err, err_size);
        if (!rc && b->accept_out && (sl.n_runs != 1 || (b->keep_states && b->n - 1 > m->n_keep_states)))
            rc = coti_fail(err, err_size, COTI_E_ARG, "a verify batch is one sequence's run of at most %d drafts",
                           m->n_keep_states);
        if (rc) { free(len); return rc; }
        for (int r = 0; r < sl.n_runs; r++) len[sl.runs[r].seq] += sl.runs[r].len;
    }
    free(len);

    int n_logits = 0;
    for (int i0 = 0; i0 < b->n; i0 += m->n_batch) {
        slice_take(&sl, b, i0, COTI_MIN(m->n_batch, b->n - i0));
        slice_check(q, &sl, m->seq_len, NULL, 0);
        slice_upload(q, &sl);
        const struct slice_ops_args a = {.sl = &sl, .want = b->want_logits ? b->want_logits + i0 : NULL,
                                         .last_only = i0 + sl.n == b->n, .keep = b->keep_states,
                                         .logits = q->s.logits + (size_t)n_logits * hp->n_vocab, .head = &q->lm_head,
                                         .ids = sl.tokens_dev ? sl.tokens_dev : q->s.tokens,
                                         .argmax_out = b->argmax_out ? b->argmax_out + n_logits : NULL,
                                         .accept_out = b->accept_out, .hn = b->hidden_out ? b->hidden_out : q->s.hn};
        slice_ops(q, false, &a);
        for (int r = 0; r < sl.n_runs; r++)
            memory_note_run(&q->mem, sl.runs[r].seq, sl.runs[r].len, b->keep_states, b->keep_states && b->accept_out);
        for (int i = 0; i < sl.n; i++) n_logits += row_wants_logits(a.want, a.last_only, sl.n, i);
    }
    /* hidden rows of the last slice only: callers needing every row keep batches <= n_batch */
    out->n = sl.n;
    out->hidden = b->hidden_out ? b->hidden_out : q->s.hn;
    out->n_logits = n_logits;
    out->logits = q->s.logits;
    return 0;
}

/* ---- NextN head ----------------------------------------------------------------------- */

static int qwen35_mtp_forward(struct model *m, const struct model_batch *b, const float *h_in,
                              struct model_output *out, char *err, size_t err_size) {
    struct qwen35 *q = q35(m);
    if (!q->has_mtp) return coti_fail(err, err_size, COTI_E_UNSUPPORTED, "model has no NextN head");
    if (b->n < 1 || b->n > m->n_batch)
        return coti_fail(err, err_size, COTI_E_ARG, "NextN batch of %d rows outside [1, %d]", b->n, m->n_batch);
    if (b->accept_out || b->hidden_out)
        return coti_fail(err, err_size, COTI_E_ARG, "the NextN head verifies nothing and keeps its hidden rows");
    struct slice sl;
    slice_take(&sl, b, 0, b->n);
    int rc = slice_check(q, &sl, q->mem.head_len, err, err_size);
    if (rc) return rc;
    slice_upload(q, &sl);
    const struct slice_ops_args a = {.sl = &sl, .want = b->want_logits, .last_only = true, .logits = q->s.logits,
                                     .head = b->draft_head ? &q->draft_head : &q->lm_head, .h_in = h_in,
                                     .ids = sl.tokens_dev ? sl.tokens_dev : q->s.tokens, .argmax_out = b->argmax_out,
                                     .hn = q->s.hn};
    slice_ops(q, true, &a);
    for (int r = 0; r < sl.n_runs; r++) q->mem.head_len[sl.runs[r].seq] += sl.runs[r].len;
    out->n = sl.n;
    out->hidden = q->s.hn;
    out->n_logits = 0;
    for (int i = 0; i < sl.n; i++) out->n_logits += row_wants_logits(a.want, a.last_only, sl.n, i);
    out->logits = q->s.logits;
    return 0;
}

/* ---- memory ----------------------------------------------------------------------------- */

static void qwen35_seq_reset(struct model *m, int s) { memory_seq_reset(&q35(m)->mem, s); }
static int qwen35_seq_rollback(struct model *m, int s, int n_drop) { return memory_seq_rollback(&q35(m)->mem, s, n_drop); }
static int qwen35_seq_copy(struct model *m, int dst, int src) { return memory_seq_copy(&q35(m)->mem, dst, src); }
static long qwen35_seq_state_read(struct model *m, int s, float *dst, size_t n) {
    return rec_state_read(&q35(m)->mem.rec, s, dst, n);
}
static int qwen35_mtp_seq_len(const struct model *m, int s) { return ((const struct qwen35 *)m)->mem.head_len[s]; }
static void qwen35_mtp_seq_truncate(struct model *m, int s, int n) { memory_head_truncate(&q35(m)->mem, s, n); }

static const struct model_nextn qwen35_nextn = {qwen35_mtp_forward, qwen35_mtp_seq_len, qwen35_mtp_seq_truncate};

static const struct model_vtable qwen35_vtable = {
    .seq_state_read = qwen35_seq_state_read,
    .free = qwen35_free,
    .forward = qwen35_forward,
    .seq_reset = qwen35_seq_reset,
    .seq_rollback = qwen35_seq_rollback,
    .seq_copy = qwen35_seq_copy,
    .nextn = &qwen35_nextn,
};
