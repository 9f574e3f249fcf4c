/* mkmodel.c — `coti mkmodel`: writes a random-weight `qwen35` GGUF in exactly llama.cpp's
 * metadata and tensor layout (arch-qwen35.md §2 keys, §4 tensor names and shapes, the
 * converter's F32 rule for 1-D tensors, ssm_conv1d and ssm_a), for tests and benchmarks.
 *
 * Architectures: qwen35 and gemma4 (dense; `--kv-equal` drops attn_v on full layers, the K=V
 * files; `--kv-shared N` makes the last N layers read earlier layers' K/V; `--n-embd-per-layer P`
 * adds the E-series' per-layer embeddings, `--double-wide-ff` their shared-KV layers' 2x FFN).
 *
 * Owns: the hyper-parameter presets (default tiny, coti-tiny, 9b), the model's tensor list
 * built from the architecture's own table (models/qwen35.h), deterministic random initialisation (each tensor seeded from the run seed and
 * a hash of its name, each row from that and its index, so values depend neither on creation
 * order nor on the thread count), type selection with llama-quantize's fallback, and the
 * tokenizer metadata (copied from --vocab-from, truncated/padded to --n-vocab, or synthetic).
 * Tensors are generated one at a time while the file is written (gguf_writer_write_fill):
 * peak memory is one quantized tensor plus one f32 row per thread, so the 9b preset needs
 * about 1.1 GB (its token_embd at q8_0), not the 36 GB of an f32 copy. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "gguf.h"
#include "models/gemma4.h"
#include "models/qwen35.h"
#include "tools.h"

/* Bounds on the options: they keep every size product far from overflow and refuse
 * shapes no real model has (the largest real Qwen3.5 is 5120 wide with a 248320 vocab). */
#define MK_MAX_DIM (1 << 16)        /* n_embd, head_dim, d_state, n_head... */
#define MK_MAX_FF (1 << 18)
#define MK_MAX_LAYER 512            /* llama.cpp's block_count limit */
#define MK_MAX_VOCAB (1 << 22)
#define MK_MAX_CONV 64
#define MK_MAX_THREADS 64
/* Synthetic vocabularies: 3 control tokens, then the 256 GPT-2 byte tokens. */
#define MK_N_SPECIAL 3
#define MK_SYNTH_MIN_VOCAB (MK_N_SPECIAL + 256)
/* Rows x columns below which a tensor is generated on one thread (thread start-up costs
 * more than the work). */
#define MK_PARALLEL_MIN_ELEMS (1 << 20)

#define MK_DEFAULT_VOCAB_FROM "models/" CLI_DEFAULT_MODEL
#define MK_DEFAULT_SHAPE "tiny"
#define MK_DEFAULT_TYPE GGML_TYPE_Q8_0
#define MK_DEFAULT_SEED 42ull

static const char CHATML_TEMPLATE[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

enum mk_arch { MK_QWEN35, MK_GEMMA4, MK_QWEN35MOE };

struct mk_hparams {
    enum mk_arch arch;
    long n_embd, n_layer, n_ff, n_head, n_head_kv, head_dim, n_vocab;   /* n_vocab 0: from vocab */
    /* gemma4: head_dim and n_head_kv are the sliding layers', these the full layers'; the window;
     * trailing layers reading an earlier layer's K/V; full layers without attn_v (K = V) */
    long head_dim_full, n_head_kv_full, window, kv_shared, kv_equal;
    long n_embd_per_layer, double_wide_ff;   /* PLE width P; 2x n_ff on the shared-KV layers */
    long d_state, n_group, dt_rank, conv, interval, nextn, rope_dims, ctx;
    long n_expert, n_expert_used, n_ff_exp, n_ff_shexp;   /* qwen35moe */
    bool gate_up_merged;         /* qwen35moe: ffn_gate_up_exps instead of ffn_gate_exps + ffn_up_exps */
    long sections[4];
    bool sections_set;
    double rope_theta, eps;
    bool tied;
};

struct mk_tensor {
    char name[64];
    uint32_t n_dims;
    int64_t ne[3];
    enum ggml_type type;
    enum weight_init init;
};

struct mk_model {
    struct mk_hparams hp;
    enum ggml_type wtype;
    uint64_t seed;
    int n_threads;
    struct mk_tensor *t;
    size_t n_t, cap_t;
};

/* ---------------------------------------------------------------------------------------
 * Deterministic random numbers: splitmix64 (one state per row).
 * ------------------------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t fnv1a64(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* Uniform in [-1, 1) from 24 random bits (exact in float). */
static float uniform_pm1(uint64_t *s) {
    return (float)(splitmix64(s) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

/* A merged ffn_gate_up_exps holds, per expert, the rows the separate ffn_gate_exps and
 * ffn_up_exps of the same seed would: the two layouts make the same model. */
static const char *gen_source(const struct mk_model *m, const struct mk_tensor *t, int64_t *row, char *buf, size_t size) {
    const char *at = strstr(t->name, "ffn_gate_up_exps");
    if (!at) return t->name;
    const int64_t F = m->hp.n_ff_exp, e = *row / (2 * F), j = *row % (2 * F);
    snprintf(buf, size, "%.*s%s%s", (int)(at - t->name), t->name, j < F ? "ffn_gate_exps" : "ffn_up_exps",
             at + strlen("ffn_gate_up_exps"));
    *row = e * F + j % F;
    return buf;
}

static void gen_row(const struct mk_model *m, const struct mk_tensor *t, int64_t row, float *dst) {
    char src[80];
    const char *name = gen_source(m, t, &row, src, sizeof src);
    uint64_t s = m->seed ^ fnv1a64(name);
    uint64_t st = splitmix64(&s) + (uint64_t)row * 0xD1B54A32D192ED03ull;
    int64_t n = t->ne[0];
    switch (t->init) {
    case WEIGHT_INIT_MATRIX: {   /* uniform with std 1/sqrt(n_in): activations keep their scale */
        float a = sqrtf(3.0f / (float)n);
        for (int64_t i = 0; i < n; i++) dst[i] = a * uniform_pm1(&st);
        break;
    }
    case WEIGHT_INIT_NORM:   /* around 1 (the +1 of Qwen's norms is baked in) */
        for (int64_t i = 0; i < n; i++) dst[i] = 1.0f + 0.1f * uniform_pm1(&st);
        break;
    case WEIGHT_INIT_DECAY:   /* -exp(A_log), strictly negative: the state decays */
        for (int64_t i = 0; i < n; i++) dst[i] = -expf(uniform_pm1(&st));
        break;
    case WEIGHT_INIT_BIAS:
        for (int64_t i = 0; i < n; i++) dst[i] = 0.1f * uniform_pm1(&st);
        break;
    case WEIGHT_INIT_ROPE_FREQS: /* gemma4's partial rotation: a quarter of the pairs turn */
        for (int64_t i = 0; i < n; i++) dst[i] = i < (n + 3) / 4 ? 1.0f : 1e30f;
        break;
    case WEIGHT_INIT_CONV: {   /* taps with std 0.5/sqrt(k) */
        float a = sqrtf(3.0f) * 0.5f / sqrtf((float)n);
        for (int64_t i = 0; i < n; i++) dst[i] = a * uniform_pm1(&st);
        break;
    }
    }
}

/* ---------------------------------------------------------------------------------------
 * Tensor list (the architecture's table, models/qwen35.h) and type selection
 * ------------------------------------------------------------------------------------- */

/* n_expert: the architecture's experts, the third dimension of a WEIGHT_EXPERTS stack */
static int add_tensor(struct mk_model *m, const struct weight_desc *d, int layer, const int64_t *widths, int n_expert) {
    if (m->n_t == m->cap_t) {
        size_t cap = m->cap_t ? 2 * m->cap_t : 256;
        struct mk_tensor *t = realloc(m->t, cap * sizeof *t);
        if (!t) return COTI_E_NOMEM;
        m->t = t;
        m->cap_t = cap;
    }
    struct mk_tensor *t = &m->t[m->n_t++];
    memset(t, 0, sizeof *t);
    weight_name(d, layer, t->name, sizeof t->name);
    /* a tensor of one width is 1-D, a matrix's too (qwen35moe's shared-expert gate), and kept
     * F32 by the converter like every 1-D tensor; ssm_conv1d is a 2-D vector (F32); stacked
     * experts are 3-D; a MoE router stays F32, as llama-quantize leaves it (by its name) */
    const bool keep_f32 = d->out == WEIGHT_WIDTH_ONE || strstr(d->name, "ffn_gate_inp.weight"),
               matrix = d->kind == WEIGHT_MATRIX || d->kind == WEIGHT_EXPERTS;
    t->n_dims = d->kind == WEIGHT_EXPERTS ? 3 : d->out == WEIGHT_WIDTH_ONE ? 1 : 2;
    t->ne[0] = widths[d->in];
    t->ne[1] = widths[d->out];
    t->ne[2] = d->kind == WEIGHT_EXPERTS ? n_expert : 1;
    t->init = d->init;
    t->type = !matrix || keep_f32 ? GGML_TYPE_F32 : ggml_type_for_rows(m->wtype, t->ne[0]);
    return 0;
}

/* The architecture's hparams from the options (dv == dk: llama.cpp requires it). */
static struct qwen35_hparams arch_hparams(const struct mk_hparams *h) {
    struct qwen35_hparams hp = {
        .n_layer_all = (int)(h->n_layer + h->nextn), .n_layer = (int)h->n_layer, .n_mtp = (int)h->nextn,
        .n_embd = (int)h->n_embd, .n_ff = (int)h->n_ff, .n_head = (int)h->n_head, .n_head_kv = (int)h->n_head_kv,
        .head_dim = (int)h->head_dim, .n_vocab = (int)h->n_vocab, .ssm_k = (int)h->conv, .ssm_dk = (int)h->d_state,
        .ssm_dv = (int)h->d_state, .ssm_nk = (int)h->n_group, .ssm_nv = (int)h->dt_rank, .interval = (int)h->interval,
    };
    if (h->arch == MK_QWEN35MOE) {
        hp.n_expert = (int)h->n_expert;
        hp.n_expert_used = (int)h->n_expert_used;
        hp.n_ff_exp = (int)h->n_ff_exp;
        hp.n_ff_shexp = (int)h->n_ff_shexp;
    }
    hp.ssm_ch = 2 * hp.ssm_nk * hp.ssm_dk + hp.ssm_nv * hp.ssm_dv;
    return hp;
}

/* gemma4's hparams from the options: a full layer every interval-th and last. */
static struct gemma4_hparams gemma4_arch_hparams(const struct mk_hparams *h) {
    struct gemma4_hparams hp = {
        .n_layer = (int)h->n_layer, .n_embd = (int)h->n_embd, .n_vocab = (int)h->n_vocab, .head_dim = (int)h->head_dim_full,
        .head_dim_swa = (int)h->head_dim, .n_rot = (int)h->head_dim_full, .n_rot_swa = (int)h->head_dim,
        .window = (int)h->window, .n_kv_shared = (int)h->kv_shared, .n_embd_per_layer = (int)h->n_embd_per_layer,
        .n_expert = (int)h->n_expert, .n_expert_used = (int)h->n_expert_used, .n_ff_exp = (int)h->n_ff_exp,
    };
    for (int il = 0; il < hp.n_layer; il++) {
        hp.moe[il] = hp.n_expert > 0; /* 26B-A4B: every layer */
        hp.swa[il] = (il + 1) % h->interval != 0 && il != hp.n_layer - 1;
        hp.n_head[il] = (int)h->n_head;
        hp.n_head_kv[il] = (int)(hp.swa[il] ? h->n_head_kv : h->n_head_kv_full);
        hp.n_ff[il] = (int)(h->double_wide_ff && il >= hp.n_layer - hp.n_kv_shared ? 2 * h->n_ff : h->n_ff);
    }
    return hp;
}

/* The architecture's tensor table, in its (the converter's) order: the globals written first,
 * each block, then the globals written last. */
static int build_tensor_list(struct mk_model *m) {
    const bool g4 = m->hp.arch == MK_GEMMA4;
    const struct qwen35_hparams qh = arch_hparams(&m->hp);
    const struct gemma4_hparams gh = g4 ? gemma4_arch_hparams(&m->hp) : (struct gemma4_hparams){0};
    const struct weight_desc *tab = g4 ? gemma4_tensors : qwen35_tensors;
    const int n_tab = g4 ? gemma4_n_tensors : qwen35_n_tensors, n_layer = g4 ? gh.n_layer : qh.n_layer_all;
    const int n_expert = g4 ? gh.n_expert : qh.n_expert;
    int64_t widths[(int)QWEN35_N_WIDTHS > (int)GEMMA4_N_WIDTHS ? (int)QWEN35_N_WIDTHS : (int)GEMMA4_N_WIDTHS];
    if (g4) gemma4_widths(&gh, 0, widths);
    else qwen35_widths(&qh, widths);
    int rc = 0;
    for (int i = 0; i < n_tab && !rc; i++) {
        const struct weight_desc *d = &tab[i];
        if (d->layers || (d->presence == WEIGHT_TIED && m->hp.tied) || d->presence == WEIGHT_ALTERNATIVE) continue;
        if (g4 && !gh.n_embd_per_layer && !strncmp(d->name, "per_layer_", 10)) continue; /* the PLE globals */
        rc = add_tensor(m, d, -1, widths, n_expert);
    }
    for (int L = 0; L < n_layer && !rc; L++) {
        const unsigned kind = g4 ? gemma4_layer_kind(&gh, L) : qwen35_layer_kind(&qh, L);
        if (g4) gemma4_widths(&gh, L, widths);
        for (int i = 0; i < n_tab && !rc; i++) {
            const struct weight_desc *d = &tab[i];
            if (d->layers == WEIGHT_GLOBAL_LAST || !(d->layers & kind)) continue;
            if (g4 && m->hp.kv_equal && !gh.swa[L] && !strcmp(d->name, "blk.%d.attn_v.weight")) continue;
            /* qwen35moe's experts: gate and up apart (the table's default), or merged */
            const bool merged = strstr(d->name, "ffn_gate_up_exps") != NULL;
            if (m->hp.gate_up_merged ? !merged && (strstr(d->name, "ffn_gate_exps") || strstr(d->name, "ffn_up_exps"))
                                     : d->presence == WEIGHT_ALTERNATIVE)
                continue;
            rc = add_tensor(m, d, L, widths, n_expert);
        }
    }
    for (int i = 0; i < n_tab && !rc; i++)
        if (tab[i].layers == WEIGHT_GLOBAL_LAST) rc = add_tensor(m, &tab[i], -1, widths, n_expert);
    return rc;
}

/* ---------------------------------------------------------------------------------------
 * Tensor data, generated while the file is written
 * ------------------------------------------------------------------------------------- */

struct fill_ctx {
    const struct mk_model *m;
    const struct mk_tensor *t;
    uint8_t *dst;
    size_t row_bytes;
};

static int fill_rows(void *arg, int64_t r0, int64_t r1) {
    const struct fill_ctx *c = arg;
    float *row = malloc((size_t)c->t->ne[0] * sizeof *row);
    if (!row) return COTI_E_NOMEM;
    for (int64_t r = r0; r < r1; r++) {
        gen_row(c->m, c->t, r, row);
        uint8_t *out = c->dst + (size_t)r * c->row_bytes;
        if (c->t->type == GGML_TYPE_Q4_K) quant_quantize_q4_K_grid(row, out, c->t->ne[0]); /* the search: 35B params in hours */
        else quant_quantize_row_ref(c->t->type, row, out, c->t->ne[0]);
    }
    free(row);
    return 0;
}

/* the writer's tensor `index` is m->t[index]: both lists are in the same order */
static int fill_tensor(void *ctx, size_t index, const char *name, void *dst, size_t size, char *err, size_t err_size) {
    const struct mk_model *m = ctx;
    if (index >= m->n_t || strcmp(m->t[index].name, name))
        return coti_fail(err, err_size, COTI_E_ARG, "mkmodel: unknown tensor '%s'", name);
    const struct mk_tensor *t = &m->t[index];
    cli_progress("mkmodel: tensor %zu/%zu %s", index + 1, m->n_t, t->name);
    size_t row_bytes = ggml_row_size(t->type, t->ne[0]);
    const int64_t n_rows = t->ne[1] * t->ne[2];
    if (row_bytes * (size_t)n_rows != size)
        return coti_fail(err, err_size, COTI_E_ARG, "mkmodel: tensor '%s' size mismatch", name);

    int nth = 1;
    if ((uint64_t)t->ne[0] * (uint64_t)n_rows >= MK_PARALLEL_MIN_ELEMS) nth = (int)m->n_threads;
    struct fill_ctx c = {m, t, dst, row_bytes};
    const int rc = cli_parallel_rows(n_rows, nth, fill_rows, &c);
    if (rc) return coti_fail(err, err_size, rc, "mkmodel: out of memory generating '%s'", name);
    return 0;
}

/* ---------------------------------------------------------------------------------------
 * Tokenizer metadata
 * ------------------------------------------------------------------------------------- */

/* GPT-2 byte-level alphabet: byte b -> the UTF-8 text of its printable stand-in. */
static void gpt2_byte_token(int b, char out[5]) {
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    unsigned cp;
    if (printable) cp = (unsigned)b;
    else {
        int k = 0;   /* index among the non-printable bytes below b */
        for (int c = 0; c < b; c++)
            if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255))) k++;
        cp = 256u + (unsigned)k;
    }
    if (cp < 0x80) { out[0] = (char)cp; out[1] = 0; }
    else { out[0] = (char)(0xC0 | cp >> 6); out[1] = (char)(0x80 | (cp & 0x3F)); out[2] = 0; }
}

/* String -> id set over a token array (open addressing); used to keep only merges whose
 * parts and result survive a vocabulary truncation. */
struct strset { const char **keys; size_t cap; };

static int strset_init(struct strset *s, const char *const *keys, size_t n) {
    s->cap = 16;
    while (s->cap < 2 * n + 16) s->cap *= 2;
    if (!(s->keys = calloc(s->cap, sizeof *s->keys))) return COTI_E_NOMEM;
    for (size_t i = 0; i < n; i++) {
        size_t h = (size_t)fnv1a64(keys[i]) & (s->cap - 1);
        while (s->keys[h] && strcmp(s->keys[h], keys[i])) h = (h + 1) & (s->cap - 1);
        s->keys[h] = keys[i];
    }
    return 0;
}

static bool strset_has(const struct strset *s, const char *key) {
    size_t h = (size_t)fnv1a64(key) & (s->cap - 1);
    for (; s->keys[h]; h = (h + 1) & (s->cap - 1))
        if (!strcmp(s->keys[h], key)) return true;
    return false;
}

/* Everything the vocabulary needs to own until the file is written. */
struct mk_vocab {
    struct gguf_file *src;
    char **tokens;        /* n_vocab pointers (into src or owned strings) */
    char *owned;          /* backing store of generated token texts */
    int32_t *types;
    float *scores;
    const char **merges;
    size_t n_merges;
};

static void vocab_free(struct mk_vocab *v) {
    free(v->tokens);
    free(v->owned);
    free(v->types);
    free(v->scores);
    free(v->merges);
    gguf_close(v->src);
}

/* Fills ids [from, n) with "<t%d>" tokens; texts go to v->owned. */
static int vocab_pad(struct mk_vocab *v, size_t from, size_t n) {
    size_t bytes = (n - from) * 16 + 1;   /* "<t4194303>" is 10 chars + NUL */
    if (!(v->owned = malloc(bytes))) return COTI_E_NOMEM;
    char *p = v->owned;
    for (size_t i = from; i < n; i++) {
        int k = snprintf(p, 16, "<t%zu>", i);
        v->tokens[i] = p;
        p += k + 1;
        v->types[i] = 1;   /* NORMAL */
        if (v->scores) v->scores[i] = 0.0f;
    }
    return 0;
}

static int write_synthetic_vocab(struct gguf_writer *w, struct mk_vocab *v, size_t n, char *err, size_t err_size) {
    static const char *const special[MK_N_SPECIAL] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    static char bytes[256][5];
    if (n < MK_SYNTH_MIN_VOCAB)
        return coti_fail(err, err_size, COTI_E_ARG, "a synthetic vocabulary needs --n-vocab >= %d, got %zu",
                         MK_SYNTH_MIN_VOCAB, n);
    if (!(v->tokens = calloc(n, sizeof *v->tokens)) || !(v->types = calloc(n, sizeof *v->types)))
        return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory");
    for (int i = 0; i < MK_N_SPECIAL; i++) {
        v->tokens[i] = (char *)special[i];
        v->types[i] = 3;   /* CONTROL */
    }
    for (int b = 0; b < 256; b++) {
        gpt2_byte_token(b, bytes[b]);
        v->tokens[MK_N_SPECIAL + b] = bytes[b];
        v->types[MK_N_SPECIAL + b] = 1;
    }
    if (vocab_pad(v, MK_SYNTH_MIN_VOCAB, n)) return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory");
    gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_writer_set_str(w, "tokenizer.ggml.pre", "qwen2");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->tokens, n);
    gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", v->types, n);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", NULL, 0);   /* llama.cpp requires the key */
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 0);
    gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", 0);
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 0);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false);
    gguf_writer_set_str(w, "tokenizer.chat_template", CHATML_TEMPLATE);
    return 0;
}

static bool is_special_id_key(const char *key) {
    size_t n = strlen(key);
    return !strncmp(key, "tokenizer.ggml.", 15) && n > 9 && !strcmp(key + n - 9, "_token_id");
}

/* Copies the tokenizer.* keys of v->src in their order; token-indexed arrays are truncated or
 * padded to n, merges are filtered to the surviving tokens, special ids >= n are dropped. */
static int write_copied_vocab(struct gguf_writer *w, struct mk_vocab *v, size_t n, char *err, size_t err_size) {
    const struct gguf_file *f = v->src;
    const struct gguf_kv *tok = gguf_find_kv(f, "tokenizer.ggml.tokens");
    if (!tok || tok->type != GGUF_TYPE_ARRAY || tok->arr_type != GGUF_TYPE_STRING || tok->n == 0)
        return coti_fail(err, err_size, COTI_E_FORMAT, "vocab file has no tokenizer.ggml.tokens string array");
    size_t n_src = (size_t)tok->n;
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const struct gguf_kv *kv = &f->kv[i];
        if (strncmp(kv->key, "tokenizer.", 10) != 0) continue;
        bool per_token = kv->type == GGUF_TYPE_ARRAY && kv->n == n_src &&
                         (!strcmp(kv->key, "tokenizer.ggml.tokens") || !strcmp(kv->key, "tokenizer.ggml.token_type") ||
                          !strcmp(kv->key, "tokenizer.ggml.scores"));
        if (n == n_src || !(per_token || !strcmp(kv->key, "tokenizer.ggml.merges") || is_special_id_key(kv->key))) {
            gguf_writer_set_kv(w, kv);
            continue;
        }
        if (is_special_id_key(kv->key)) {
            if (kv->type == GGUF_TYPE_UINT32 && kv->v.u64 < n) gguf_writer_set_kv(w, kv);
            else fprintf(stderr, "mkmodel: dropping %s (%llu is outside the %zu-token vocabulary)\n", kv->key,
                         (unsigned long long)kv->v.u64, n);
            continue;
        }
        if (!strcmp(kv->key, "tokenizer.ggml.tokens")) {
            if (!(v->tokens = calloc(n, sizeof *v->tokens)) || !(v->types = calloc(n, sizeof *v->types)))
                return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory");
            for (size_t k = 0; k < n && k < n_src; k++) v->tokens[k] = kv->arr_str[k];
            if (n > n_src && vocab_pad(v, n_src, n)) return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory");
            gguf_writer_set_arr_str(w, kv->key, (const char *const *)v->tokens, n);
        } else if (!strcmp(kv->key, "tokenizer.ggml.merges")) {
            if (kv->type != GGUF_TYPE_ARRAY || kv->arr_type != GGUF_TYPE_STRING) { gguf_writer_set_kv(w, kv); continue; }
            if (!v->tokens)
                return coti_fail(err, err_size, COTI_E_FORMAT, "vocab file: merges come before tokens");
            struct strset set;
            if (strset_init(&set, (const char *const *)v->tokens, n) ||
                !(v->merges = malloc(((size_t)kv->n + 1) * sizeof *v->merges))) {
                free(set.keys);
                return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory");
            }
            char buf[1024];
            for (uint64_t k = 0; k < kv->n; k++) {
                const char *mg = kv->arr_str[k], *sp = strchr(mg, ' ');
                size_t len = strlen(mg);
                if (!sp || len >= sizeof buf) continue;
                memcpy(buf, mg, len + 1);
                buf[sp - mg] = '\0';
                bool keep = strset_has(&set, buf) && strset_has(&set, buf + (sp - mg) + 1);
                memmove(buf + (sp - mg), buf + (sp - mg) + 1, len - (size_t)(sp - mg));   /* "a b" -> "ab" */
                if (keep && strset_has(&set, buf)) v->merges[v->n_merges++] = mg;
            }
            free(set.keys);
            gguf_writer_set_arr_str(w, kv->key, v->merges, v->n_merges);
        } else if (!strcmp(kv->key, "tokenizer.ggml.token_type") && kv->arr_type == GGUF_TYPE_INT32) {
            /* n > n_src: padded entries were set by vocab_pad when tokens came first */
            if (!v->types && !(v->types = calloc(n, sizeof *v->types)))
                return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory");
            for (size_t k = n_src; k < n; k++) v->types[k] = 1;
            memcpy(v->types, kv->arr, COTI_MIN(n, n_src) * sizeof(int32_t));
            gguf_writer_set_arr_i32(w, kv->key, v->types, n);
        } else if (!strcmp(kv->key, "tokenizer.ggml.scores") && kv->arr_type == GGUF_TYPE_FLOAT32) {
            if (!(v->scores = calloc(n, sizeof *v->scores)))
                return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory");
            memcpy(v->scores, kv->arr, COTI_MIN(n, n_src) * sizeof(float));
            gguf_writer_set_arr_f32(w, kv->key, v->scores, n);
        } else {
            return coti_fail(err, err_size, COTI_E_FORMAT, "vocab file: %s has an unexpected type", kv->key);
        }
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------
 * Options
 * ------------------------------------------------------------------------------------- */

static void hp_default(struct mk_hparams *h) {
    *h = (struct mk_hparams){
        .n_embd = 64, .n_layer = 4, .n_ff = 128, .n_head = 4, .n_head_kv = 2, .head_dim = 16,
        .d_state = 16, .n_group = 2, .dt_rank = 4, .conv = 4, .interval = 4, .nextn = 1,
        .rope_dims = 0, .ctx = 256, .rope_theta = 1e7, .eps = 1e-6, .tied = true,
    };
}

static int hp_preset(struct mk_hparams *h, const char *name, enum mk_arch arch) {
    hp_default(h);
    h->arch = arch;
    if (arch == MK_GEMMA4) { /* the shipped gemma4's structure at a smaller width, a window tests reach */
        h->head_dim = 16; h->head_dim_full = 32; h->n_head_kv_full = 1; h->window = 8; h->rope_theta = 1e6;
        if (!strcmp(name, "tiny")) return 0;
        if (!strcmp(name, "tiny-moe")) { /* tiny with 26B-A4B's branch: 8 experts of 32, 2 used */
            h->n_expert = 8; h->n_expert_used = 2; h->n_ff_exp = 32;
            return 0;
        }
        if (!strcmp(name, "26b-a4b")) { /* Gemma 4 26B-A4B (arch-gemma4.md §3.8): full layers 5, 11, .., 29 */
            h->n_embd = 2816; h->n_layer = 30; h->n_ff = 2112; h->n_head = 16; h->n_head_kv = 8; h->n_head_kv_full = 2;
            h->head_dim = 256; h->head_dim_full = 512; h->window = 1024; h->interval = 6; h->kv_equal = 1;
            h->n_expert = 128; h->n_expert_used = 8; h->n_ff_exp = 704; h->n_vocab = 262144; h->ctx = 262144;
            return 0;
        }
        if (!strcmp(name, "coti-tiny")) { /* models/MODEL_CARD-gemma4.md */
            h->n_embd = 256; h->n_layer = 8; h->n_ff = 640; h->head_dim = 64; h->head_dim_full = 128; h->window = 128;
            h->kv_equal = 1; h->ctx = 4096;
            return 0;
        }
        if (!strcmp(name, "e2b-tiny")) { /* E2B's structure (arch-gemma4.md §3.8) at coti-tiny's widths, so that
                                           * the shipped assistant fits it: full layers 4 and 9, the last 5
                                           * layers reading layers 3 / 4, per-layer embeddings, attn_v kept */
            h->n_embd = 256; h->n_layer = 10; h->n_ff = 640; h->head_dim = 64; h->head_dim_full = 128; h->window = 128;
            h->interval = 5; h->kv_shared = 5; h->n_embd_per_layer = 64; h->double_wide_ff = 1; h->ctx = 4096;
            return 0;
        }
        return -1;
    }
    if (arch == MK_QWEN35MOE) {
        /* tiny: qwen35's tiny trunk with 16 experts of 32, 4 used, a shared expert of 64 */
        h->n_expert = 16; h->n_expert_used = 4; h->n_ff_exp = 32; h->n_ff_shexp = 64; h->n_ff = 32;
        if (!strcmp(name, "tiny")) return 0;
        if (!strcmp(name, "35b-a3b")) {   /* Qwen3.6-35B-A3B (its HF config; llama.cpp's qwen35moe) */
            h->n_embd = 2048; h->n_layer = 40; h->n_head = 16; h->n_head_kv = 2; h->head_dim = 256;
            h->d_state = 128; h->n_group = 16; h->dt_rank = 32; h->rope_dims = 64;
            h->n_expert = 256; h->n_expert_used = 8; h->n_ff_exp = 512; h->n_ff_shexp = 512; h->n_ff = 512;
            h->n_vocab = 248320; h->tied = false; h->ctx = 262144;
            long s[4] = {11, 11, 10, 0};
            memcpy(h->sections, s, sizeof s);
            h->sections_set = true;
            return 0;
        }
        return -1;
    }
    if (!strcmp(name, "tiny")) return 0;
    if (!strcmp(name, "coti-tiny")) {   /* the shipped model's shape (MODEL_CARD.md) */
        h->n_embd = 384; h->n_layer = 8; h->n_ff = 1152; h->n_head = 6; h->n_head_kv = 2;
        h->head_dim = 64; h->d_state = 64; h->n_group = 4; h->dt_rank = 8; h->rope_dims = 16;
        h->ctx = 4096;
        return 0;
    }
    if (!strcmp(name, "9b")) {   /* Qwen3.5-9B-style, arch-qwen35.md §1 */
        h->n_embd = 4096; h->n_layer = 32; h->n_ff = 12288; h->n_head = 16; h->n_head_kv = 4;
        h->head_dim = 256; h->d_state = 128; h->n_group = 16; h->dt_rank = 32; h->rope_dims = 64;
        h->n_vocab = 248320; h->tied = false; h->ctx = 262144;
        long s[4] = {11, 11, 10, 0};
        memcpy(h->sections, s, sizeof s);
        h->sections_set = true;
        return 0;
    }
    return -1;
}

static void help(FILE *out, const struct cli_common *unused) {
    fprintf(out,
        "usage: coti mkmodel --arch qwen35|qwen35moe|gemma4 -o OUT.gguf [options]\n"
        "Write a random-weight model in llama.cpp's GGUF layout of the architecture.\n"
        "  --shape NAME        preset (default %s; qwen35: tiny, coti-tiny, 9b; qwen35moe: tiny, 35b-a3b;\n"
        "                      gemma4: tiny, coti-tiny, e2b-tiny, tiny-moe, 26b-a4b); the other options override it\n"
        "  --type T            2-D weight type: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q2_K..q6_K (default %s)\n"
        "  --seed N            random seed (default %llu)\n"
        "  --n-embd N --n-layer N --n-ff N --n-head N --n-head-kv N --head-dim N\n"
        "  --n-vocab N         default: the size of the --vocab-from vocabulary\n"
        "  --ssm-d-state N --ssm-n-group N --ssm-dt-rank N --ssm-conv N\n"
        "  --full-attn-interval N --nextn 0|1 --ctx N\n"
        "  qwen35moe, gemma4: --n-expert N --n-expert-used K --n-ff-exp N (experts, chosen per token, an\n"
        "          expert's FFN width); qwen35moe: --n-ff-shexp N (the shared expert's); --gate-up-merged\n"
        "          (ffn_gate_up_exps, the same weights as the separate ffn_gate_exps and ffn_up_exps of the seed)\n"
        "  --rope-dims N (default head-dim/4) --rope-sections A,B,C,D --rope-theta X --eps X\n"
        "  --tied | --untied   share token_embd as the LM head (default tied; 9b: untied)\n"
        "  gemma4: --head-dim (sliding layers) --head-dim-full N --n-head-kv (sliding) --n-head-kv-full N\n"
        "          --window N --kv-shared N --kv-equal (no attn_v on full layers); a full layer every\n"
        "          --full-attn-interval layers and last; --n-embd-per-layer P (per-layer embeddings),\n"
        "          --double-wide-ff (2x --n-ff on the shared-KV layers); presets tiny, coti-tiny (the shipped\n"
        "          model's layout), e2b-tiny (E2B's: shared-KV layers, per-layer embeddings), tiny-moe and\n"
        "          26b-a4b (26B-A4B's routed experts beside the dense FFN)\n"
        "  --vocab-from FILE   copy tokenizer.* keys (default %s, looked up as coti run's -m default);\n"
        "                      'none' writes a synthetic byte-level vocabulary\n"
        "  --threads N         generation threads (default: all CPUs)\n"
        "  -h, --help          this text\n"
        "A value follows its option as the next argument or after '=' (--seed=7).\n",
        MK_DEFAULT_SHAPE, ggml_type_traits_get(MK_DEFAULT_TYPE)->name, (unsigned long long)MK_DEFAULT_SEED, CLI_DEFAULT_MODEL);
}

static int parse_long(const char *opt, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "coti mkmodel: %s: '%s' is not an integer in [%ld, %ld]\n", opt, s ? s : "", lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_double(const char *opt, const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = s ? strtod(s, &end) : 0;
    if (!s || errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "coti mkmodel: %s: '%s' is not a number in [%g, %g]\n", opt, s ? s : "", lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

static int check_hparams(const struct mk_hparams *h) {
    const char *why = NULL;
    if (h->n_head % h->n_head_kv) why = "--n-head must be a multiple of --n-head-kv";
    else if (h->dt_rank % h->n_group) why = "--ssm-dt-rank (v heads) must be a multiple of --ssm-n-group (k heads)";
    else if (h->rope_dims % 2 || h->rope_dims > h->head_dim) why = "--rope-dims must be even and <= --head-dim";
    else if (h->sections[0] + h->sections[1] + h->sections[2] + h->sections[3] > h->rope_dims / 2)
        why = "--rope-sections must sum to at most rope-dims/2";
    else if (h->n_expert && h->n_expert_used > h->n_expert) why = "--n-expert-used must be at most --n-expert";
    else if (h->arch == MK_QWEN35 && h->n_expert) why = "--n-expert is for --arch qwen35moe or gemma4";
    else if (h->gate_up_merged && !h->n_expert) why = "--gate-up-merged is for a model with experts";
    if (why) fprintf(stderr, "coti mkmodel: %s\n", why);
    return why ? -1 : 0;
}

/* "<arch>.<suffix>" in buf */
static const char *key(char *buf, size_t size, const char *arch, const char *suffix) {
    snprintf(buf, size, "%s.%s", arch, suffix);
    return buf;
}

static void write_metadata(struct gguf_writer *w, const struct mk_model *m, const char *shape) {
    const struct mk_hparams *h = &m->hp;
    char name[96], k[96];
    const bool moe = h->arch == MK_QWEN35MOE;
    const char *arch = moe ? "qwen35moe" : "qwen35";
    snprintf(name, sizeof name, "coti-mkmodel-%s-%s-seed%llu", arch, shape, (unsigned long long)m->seed);
    int32_t sections[4];
    for (int i = 0; i < 4; i++) sections[i] = (int32_t)h->sections[i];
    /* key order and types as the converter writes them (cf. the shipped model) */
    gguf_writer_set_str(w, "general.architecture", arch);
    gguf_writer_set_str(w, "general.type", "model");
    gguf_writer_set_str(w, "general.name", name);
    gguf_writer_set_u32(w, key(k, sizeof k, arch, "block_count"), (uint32_t)(h->n_layer + h->nextn));
    gguf_writer_set_u32(w, key(k, sizeof k, arch, "context_length"), (uint32_t)h->ctx);
    gguf_writer_set_u32(w, key(k, sizeof k, arch, "embedding_length"), (uint32_t)h->n_embd);
    gguf_writer_set_u32(w, key(k, sizeof k, arch, "feed_forward_length"), (uint32_t)h->n_ff);
    gguf_writer_set_u32(w, key(k, sizeof k, arch, "attention.head_count"), (uint32_t)h->n_head);
    gguf_writer_set_u32(w, key(k, sizeof k, arch, "attention.head_count_kv"), (uint32_t)h->n_head_kv);
    gguf_writer_set_arr_i32(w, key(k, sizeof k, arch, "rope.dimension_sections"), sections, 4);
    gguf_writer_set_f32(w, key(k, sizeof k, arch, "rope.freq_base"), (float)h->rope_theta);
    gguf_writer_set_f32(w, key(k, sizeof k, arch, "attention.layer_norm_rms_epsilon"), (float)h->eps);
    gguf_writer_set_u32(w, key(k, sizeof k, arch, "attention.key_length"), (uint32_t)h->head_dim);
    gguf_writer_set_u32(w, key(k, sizeof k, arch, "attention.value_length"), (uint32_t)h->head_dim);
    gguf_writer_set_u32(w, "general.file_type", ggml_file_type_of(m->wtype));
    gguf_writer_set_u32(w, key(k, sizeof k, arch, "ssm.conv_kernel"), (uint32_t)h->conv);
    gguf_writer_set_u32(w, key(k, sizeof k, arch, "ssm.state_size"), (uint32_t)h->d_state);
    gguf_writer_set_u32(w, key(k, sizeof k, arch, "ssm.group_count"), (uint32_t)h->n_group);
    gguf_writer_set_u32(w, key(k, sizeof k, arch, "ssm.time_step_rank"), (uint32_t)h->dt_rank);
    gguf_writer_set_u32(w, key(k, sizeof k, arch, "ssm.inner_size"), (uint32_t)(h->dt_rank * h->d_state));
    gguf_writer_set_u32(w, key(k, sizeof k, arch, "full_attention_interval"), (uint32_t)h->interval);
    gguf_writer_set_u32(w, key(k, sizeof k, arch, "rope.dimension_count"), (uint32_t)h->rope_dims);
    if (h->nextn > 0) gguf_writer_set_u32(w, key(k, sizeof k, arch, "nextn_predict_layers"), (uint32_t)h->nextn);
    if (moe) {
        gguf_writer_set_u32(w, key(k, sizeof k, arch, "expert_count"), (uint32_t)h->n_expert);
        gguf_writer_set_u32(w, key(k, sizeof k, arch, "expert_used_count"), (uint32_t)h->n_expert_used);
        gguf_writer_set_u32(w, key(k, sizeof k, arch, "expert_feed_forward_length"), (uint32_t)h->n_ff_exp);
        gguf_writer_set_u32(w, key(k, sizeof k, arch, "expert_shared_feed_forward_length"), (uint32_t)h->n_ff_shexp);
    }
    gguf_writer_set_u32(w, "general.quantization_version", 2);
}

/* gemma4's keys in the converter's order (cf. models/coti-tiny-gemma4-q8_0.gguf). */
static void write_gemma4_metadata(struct gguf_writer *w, const struct mk_model *m, const char *shape) {
    const struct mk_hparams *h = &m->hp;
    const struct gemma4_hparams gh = gemma4_arch_hparams(h);
    char name[96];
    snprintf(name, sizeof name, "coti-mkmodel-gemma4-%s-seed%llu", shape, (unsigned long long)m->seed);
    int32_t kv[GEMMA4_MAX_LAYERS];
    for (int il = 0; il < gh.n_layer; il++) kv[il] = gh.n_head_kv[il];
    gguf_writer_set_str(w, "general.architecture", "gemma4");
    gguf_writer_set_str(w, "general.type", "model");
    gguf_writer_set_str(w, "general.name", name);
    gguf_writer_set_u32(w, "gemma4.block_count", (uint32_t)h->n_layer);
    gguf_writer_set_u32(w, "gemma4.context_length", (uint32_t)h->ctx);
    gguf_writer_set_u32(w, "gemma4.embedding_length", (uint32_t)h->n_embd);
    int32_t ff[GEMMA4_MAX_LAYERS];
    for (int il = 0; il < gh.n_layer; il++) ff[il] = gh.n_ff[il];
    if (h->double_wide_ff) gguf_writer_set_arr_i32(w, "gemma4.feed_forward_length", ff, (size_t)gh.n_layer);
    else gguf_writer_set_u32(w, "gemma4.feed_forward_length", (uint32_t)h->n_ff);
    gguf_writer_set_u32(w, "gemma4.attention.head_count", (uint32_t)h->n_head);
    gguf_writer_set_arr_i32(w, "gemma4.attention.head_count_kv", kv, (size_t)gh.n_layer);
    gguf_writer_set_f32(w, "gemma4.rope.freq_base", (float)h->rope_theta);
    gguf_writer_set_f32(w, "gemma4.rope.freq_base_swa", 10000.0f);
    gguf_writer_set_f32(w, "gemma4.attention.layer_norm_rms_epsilon", (float)h->eps);
    gguf_writer_set_u32(w, "general.file_type", ggml_file_type_of(m->wtype));
    gguf_writer_set_u32(w, "gemma4.attention.sliding_window", (uint32_t)h->window);
    gguf_writer_set_u32(w, "gemma4.attention.shared_kv_layers", (uint32_t)h->kv_shared);
    gguf_writer_set_u32(w, "gemma4.embedding_length_per_layer_input", (uint32_t)h->n_embd_per_layer);
    uint8_t pattern[GEMMA4_MAX_LAYERS];
    for (int il = 0; il < gh.n_layer; il++) pattern[il] = gh.swa[il];
    gguf_writer_set_arr(w, "gemma4.attention.sliding_window_pattern", GGUF_TYPE_BOOL, pattern, (size_t)gh.n_layer);
    gguf_writer_set_u32(w, "gemma4.attention.key_length", (uint32_t)h->head_dim_full);
    gguf_writer_set_u32(w, "gemma4.attention.value_length", (uint32_t)h->head_dim_full);
    gguf_writer_set_u32(w, "gemma4.attention.key_length_swa", (uint32_t)h->head_dim);
    gguf_writer_set_u32(w, "gemma4.attention.value_length_swa", (uint32_t)h->head_dim);
    gguf_writer_set_u32(w, "gemma4.rope.dimension_count", (uint32_t)h->head_dim_full);
    gguf_writer_set_u32(w, "gemma4.rope.dimension_count_swa", (uint32_t)h->head_dim);
    gguf_writer_set_f32(w, "gemma4.final_logit_softcapping", 30.0f);
    if (h->n_expert) {
        gguf_writer_set_u32(w, "gemma4.expert_count", (uint32_t)h->n_expert);
        gguf_writer_set_u32(w, "gemma4.expert_used_count", (uint32_t)h->n_expert_used);
        gguf_writer_set_u32(w, "gemma4.expert_feed_forward_length", (uint32_t)h->n_ff_exp);
    }
    gguf_writer_set_u32(w, "general.quantization_version", 2);
}

/* The integer options: each sets one field of the hparams, over the preset. */
static const struct { const char *opt; size_t off; long lo, hi; } mk_ints[] = {
    {"n-embd", offsetof(struct mk_hparams, n_embd), 1, MK_MAX_DIM},
    {"n-layer", offsetof(struct mk_hparams, n_layer), 1, MK_MAX_LAYER - 1},
    {"n-ff", offsetof(struct mk_hparams, n_ff), 1, MK_MAX_FF},
    {"n-head", offsetof(struct mk_hparams, n_head), 1, MK_MAX_DIM},
    {"n-head-kv", offsetof(struct mk_hparams, n_head_kv), 1, MK_MAX_DIM},
    {"head-dim", offsetof(struct mk_hparams, head_dim), 1, MK_MAX_DIM},
    {"n-vocab", offsetof(struct mk_hparams, n_vocab), 1, MK_MAX_VOCAB},
    {"ssm-d-state", offsetof(struct mk_hparams, d_state), 1, MK_MAX_DIM},
    {"ssm-n-group", offsetof(struct mk_hparams, n_group), 1, MK_MAX_DIM},
    {"ssm-dt-rank", offsetof(struct mk_hparams, dt_rank), 1, MK_MAX_DIM},
    {"ssm-conv", offsetof(struct mk_hparams, conv), 1, MK_MAX_CONV},
    {"full-attn-interval", offsetof(struct mk_hparams, interval), 1, MK_MAX_LAYER},
    {"nextn", offsetof(struct mk_hparams, nextn), 0, 1},   /* llama.cpp supports one */
    {"rope-dims", offsetof(struct mk_hparams, rope_dims), 0, MK_MAX_DIM},
    {"ctx", offsetof(struct mk_hparams, ctx), 1, 1L << 24},
    {"head-dim-full", offsetof(struct mk_hparams, head_dim_full), 2, 512},
    {"n-head-kv-full", offsetof(struct mk_hparams, n_head_kv_full), 1, MK_MAX_DIM},
    {"window", offsetof(struct mk_hparams, window), 1, 1L << 24},
    {"kv-shared", offsetof(struct mk_hparams, kv_shared), 0, MK_MAX_LAYER},
    {"n-embd-per-layer", offsetof(struct mk_hparams, n_embd_per_layer), 0, MK_MAX_DIM},
    {"n-expert", offsetof(struct mk_hparams, n_expert), 1, 512},
    {"n-expert-used", offsetof(struct mk_hparams, n_expert_used), 1, 64},
    {"n-ff-exp", offsetof(struct mk_hparams, n_ff_exp), 1, MK_MAX_FF},
    {"n-ff-shexp", offsetof(struct mk_hparams, n_ff_shexp), 1, MK_MAX_FF},
};
#define MK_N_INTS COTI_ARRAY_LEN(mk_ints)

/* Every option as given; the preset is applied first and the rest over it, whatever the order. */
struct mk_opts {
    const char *out, *arch, *shape, *vocab_from;
    long ints[MK_N_INTS];
    bool int_set[MK_N_INTS];
    int tied;                    /* -1 preset, 0 untied, 1 tied */
    bool kv_equal, double_wide_ff, sections_set, gate_up_merged;
    long sections[4];
    double rope_theta, eps;      /* 0: the preset's */
    uint64_t seed;
    enum ggml_type wtype;
    long n_threads;
};

enum {
    OPT_INT = CLI_TOOL_CODE,     /* + index into mk_ints */
    OPT_ARCH = CLI_TOOL_CODE + 100, OPT_SHAPE, OPT_VOCAB_FROM, OPT_MK_SEED, OPT_TYPE, OPT_MK_THREADS, OPT_ROPE_THETA,
    OPT_EPS, OPT_ROPE_SECTIONS, OPT_TIED, OPT_UNTIED, OPT_KV_EQUAL, OPT_DOUBLE_WIDE_FF, OPT_GATE_UP_MERGED,
};

static int on_option(void *state, int code, const char *name, const char *val) {
    struct mk_opts *o = state;
    if (code >= OPT_INT && code < OPT_INT + (int)MK_N_INTS) {
        const size_t k = (size_t)(code - OPT_INT);
        o->int_set[k] = true;
        return parse_long(name, val, mk_ints[k].lo, mk_ints[k].hi, &o->ints[k]);
    }
    switch (code) {
    case 'o': o->out = val; return 0;
    case OPT_ARCH: o->arch = val; return 0;
    case OPT_SHAPE: o->shape = val; return 0;
    case OPT_VOCAB_FROM: o->vocab_from = val; return 0;
    case OPT_TIED: o->tied = 1; return 0;
    case OPT_UNTIED: o->tied = 0; return 0;
    case OPT_KV_EQUAL: o->kv_equal = true; return 0;
    case OPT_GATE_UP_MERGED: o->gate_up_merged = true; return 0;
    case OPT_DOUBLE_WIDE_FF: o->double_wide_ff = true; return 0;
    case OPT_MK_SEED: {
        char *end;
        errno = 0;
        unsigned long long s = strtoull(val, &end, 10);
        if (errno || end == val || *end || val[0] == '-') {
            fprintf(stderr, "coti mkmodel: --seed: '%s' is not an unsigned integer\n", val);
            return -1;
        }
        o->seed = s;
        return 0;
    }
    case OPT_TYPE:
        o->wtype = ggml_type_from_name(val);
        if (!ggml_type_supported(o->wtype) || o->wtype == GGML_TYPE_Q8_1 || o->wtype == GGML_TYPE_Q8_K) {
            fprintf(stderr, "coti mkmodel: --type: '%s' is not a weight type coti supports\n", val);
            return -1;
        }
        return 0;
    case OPT_MK_THREADS: return parse_long(name, val, 1, MK_MAX_THREADS, &o->n_threads);
    case OPT_ROPE_THETA: return parse_double(name, val, 1.0, 1e12, &o->rope_theta);
    case OPT_EPS: return parse_double(name, val, 1e-12, 1.0, &o->eps);
    case OPT_ROPE_SECTIONS: {
        long *sec = o->sections;
        char extra;
        if (sscanf(val, "%ld,%ld,%ld,%ld%c", &sec[0], &sec[1], &sec[2], &sec[3], &extra) != 4 ||
            sec[0] < 0 || sec[1] < 0 || sec[2] < 0 || sec[3] < 0 || sec[0] + sec[1] + sec[2] + sec[3] > MK_MAX_DIM) {
            fprintf(stderr, "coti mkmodel: --rope-sections: '%s' is not A,B,C,D (non-negative)\n", val);
            return -1;
        }
        o->sections_set = true;
        return 0;
    }
    }
    return -1;
}

int tool_mkmodel_main(int argc, char **argv) {
    struct mk_model m = {0};
    long n_threads = sysconf(_SC_NPROCESSORS_ONLN);
    n_threads = n_threads < 1 ? 1 : COTI_MIN(n_threads, MK_MAX_THREADS);
    struct mk_opts o = {.shape = MK_DEFAULT_SHAPE, .tied = -1, .seed = MK_DEFAULT_SEED, .wtype = MK_DEFAULT_TYPE,
                        .n_threads = n_threads};

    struct option opts[MK_N_INTS + 16] = {
        {"output", required_argument, NULL, 'o'},
        {"arch", required_argument, NULL, OPT_ARCH},
        {"shape", required_argument, NULL, OPT_SHAPE},
        {"vocab-from", required_argument, NULL, OPT_VOCAB_FROM},
        {"seed", required_argument, NULL, OPT_MK_SEED},
        {"type", required_argument, NULL, OPT_TYPE},
        {"threads", required_argument, NULL, OPT_MK_THREADS},
        {"rope-theta", required_argument, NULL, OPT_ROPE_THETA},
        {"eps", required_argument, NULL, OPT_EPS},
        {"rope-sections", required_argument, NULL, OPT_ROPE_SECTIONS},
        {"tied", no_argument, NULL, OPT_TIED},
        {"untied", no_argument, NULL, OPT_UNTIED},
        {"kv-equal", no_argument, NULL, OPT_KV_EQUAL},
        {"double-wide-ff", no_argument, NULL, OPT_DOUBLE_WIDE_FF},
        {"gate-up-merged", no_argument, NULL, OPT_GATE_UP_MERGED},
    };
    for (size_t k = 0, n = 15; k < MK_N_INTS; k++, n++)
        opts[n] = (struct option){mk_ints[k].opt, required_argument, NULL, OPT_INT + (int)k};
    const struct cli_tool tool = {.name = "mkmodel", .help = help, .short_opts = "o:", .opts = opts,
                                  .on_option = on_option, .state = &o, .no_common = true};
    int pr = cli_parse(NULL, &tool, argc, argv);
    if (pr != CLI_PARSE_OK) return pr == CLI_PARSE_EXIT ? 0 : 1;

    const char *out = o.out, *arch = o.arch, *shape = o.shape, *vocab_from = o.vocab_from;
    const enum mk_arch march = arch && !strcmp(arch, "gemma4")      ? MK_GEMMA4
                               : arch && !strcmp(arch, "qwen35moe") ? MK_QWEN35MOE
                                                                     : MK_QWEN35;
    if (hp_preset(&m.hp, shape, march) != 0) {
        fprintf(stderr, "coti mkmodel: --shape: unknown preset '%s' (%s)\n", shape,
                march == MK_GEMMA4      ? "tiny, coti-tiny, e2b-tiny"
                : march == MK_QWEN35MOE ? "tiny, 35b-a3b"
                                        : "tiny, coti-tiny, 9b");
        return 1;
    }
    struct mk_hparams *h = &m.hp;
    bool synthetic = !strcmp(shape, "9b") || !strcmp(shape, "35b-a3b");
    for (size_t k = 0; k < MK_N_INTS; k++)
        if (o.int_set[k]) *(long *)((char *)h + mk_ints[k].off) = o.ints[k];
    if (o.tied >= 0) h->tied = o.tied;
    if (o.kv_equal) h->kv_equal = 1;
    if (o.gate_up_merged) h->gate_up_merged = true;
    if (o.double_wide_ff) h->double_wide_ff = 1;
    if (o.rope_theta > 0) h->rope_theta = o.rope_theta;
    if (o.eps > 0) h->eps = o.eps;
    if (o.sections_set) { memcpy(h->sections, o.sections, sizeof o.sections); h->sections_set = true; }
    m.seed = o.seed;
    m.wtype = o.wtype;
    char vocab_buf[PATH_MAX];
    n_threads = o.n_threads;
    if (!arch || (strcmp(arch, "qwen35") && strcmp(arch, "qwen35moe") && strcmp(arch, "gemma4"))) {
        fprintf(stderr, "coti mkmodel: --arch qwen35, qwen35moe or gemma4 is required\n");
        return 1;
    }
    if (!out) { fprintf(stderr, "coti mkmodel: -o OUT.gguf is required\n"); return 1; }
    if (vocab_from) synthetic = !strcmp(vocab_from, "none");
    else if (!(vocab_from = cli_find_default_model(vocab_buf, sizeof vocab_buf))) vocab_from = MK_DEFAULT_VOCAB_FROM;
    if (h->rope_dims == 0) h->rope_dims = COTI_MAX(2, h->head_dim / 4 / 2 * 2);
    if (!h->sections_set) {   /* [3/8, 3/8, 2/8] of the rotary pairs, as Qwen's [11, 11, 10, 0] */
        long pairs = h->rope_dims / 2;
        h->sections[0] = h->sections[1] = (pairs + 2) / 3;
        h->sections[2] = pairs - 2 * h->sections[0];
        h->sections[3] = 0;
        if (h->sections[2] < 0) { h->sections[1] += h->sections[2]; h->sections[2] = 0; }
    }
    if (check_hparams(h)) return 1;
    if (h->arch == MK_GEMMA4 && (h->n_layer > GEMMA4_MAX_LAYERS || h->n_head % h->n_head_kv_full || h->head_dim % 2 ||
                                 h->head_dim_full % 2 ||
                                 h->kv_shared > h->n_layer - 2 || (h->n_layer > 1 && h->interval > h->n_layer))) {
        fprintf(stderr, "coti mkmodel: gemma4: at most %d layers, --n-head a multiple of --n-head-kv-full, head dims "
                        "even, --kv-shared at most n-layer - 2, a full layer within the layers\n", GEMMA4_MAX_LAYERS);
        return 1;
    }
    if (h->arch == MK_GEMMA4) {
        const struct gemma4_hparams gh = gemma4_arch_hparams(h);
        for (int il = 0; il < gh.n_layer; il++)
            if (gemma4_kv_source(&gh, il) < 0) {
                fprintf(stderr, "coti mkmodel: gemma4: with --kv-shared %ld the last layer owning K/V must be a full layer "
                                "and the one before it a sliding one (llama.cpp reads those)\n", h->kv_shared);
                return 1;
            }
    }
    m.n_threads = (int)n_threads;

    char err[512];
    int rc = 0;
    struct mk_vocab vocab = {0};
    struct gguf_writer *w = gguf_writer_init();
    if (!w) { fprintf(stderr, "coti mkmodel: out of memory\n"); return 1; }
    if (!synthetic) {
        if ((rc = gguf_open(&vocab.src, vocab_from, err, sizeof err))) goto done;
        const struct gguf_kv *tok = gguf_find_kv(vocab.src, "tokenizer.ggml.tokens");
        if (h->n_vocab == 0 && tok && tok->type == GGUF_TYPE_ARRAY) h->n_vocab = (long)COTI_MIN(tok->n, (uint64_t)MK_MAX_VOCAB);
    } else if (h->n_vocab == 0) {
        h->n_vocab = 512;
    }
    if (h->arch == MK_GEMMA4) write_gemma4_metadata(w, &m, shape);
    else write_metadata(w, &m, shape);
    rc = synthetic ? write_synthetic_vocab(w, &vocab, (size_t)h->n_vocab, err, sizeof err)
                   : write_copied_vocab(w, &vocab, (size_t)h->n_vocab, err, sizeof err);
    if (rc) goto done;
    if ((rc = build_tensor_list(&m))) { snprintf(err, sizeof err, "out of memory"); goto done; }
    uint64_t n_params = 0;
    for (size_t i = 0; i < m.n_t; i++) {
        const struct mk_tensor *t = &m.t[i];
        n_params += (uint64_t)t->ne[0] * (uint64_t)t->ne[1] * (uint64_t)t->ne[2];
        gguf_writer_add_tensor_info(w, t->name, t->type, t->n_dims, t->ne);
    }
    /* a failed set_* or add_* above is sticky in the writer: this call reports it and
     * writes nothing */
    int64_t t0 = coti_time_us();
    rc = gguf_writer_write_fill(w, out, fill_tensor, &m, err, sizeof err);
    cli_progress_end();
    if (!rc)
        fprintf(stderr, "coti mkmodel: wrote %s: %s %s, %zu tensors, %.2f M params, %s, seed %llu, %.1f s\n",
                out, arch, shape, m.n_t, n_params / 1e6, ggml_type_traits_get(m.wtype)->name,
                (unsigned long long)m.seed, (coti_time_us() - t0) / 1e6);
done:
    if (rc) fprintf(stderr, "coti mkmodel: %s\n", err);
    gguf_writer_free(w);
    vocab_free(&vocab);
    free(m.t);
    return rc ? 1 : 0;
}
