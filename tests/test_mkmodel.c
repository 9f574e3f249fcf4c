/* test_mkmodel.c — `coti mkmodel`: the generated qwen35 file reopens with gguf_open and has
 * the keys, tensor names, shapes and types arch-qwen35.md §2/§4 prescribe, with sane value
 * ranges; generation is deterministic (same seed -> same bytes, whatever the thread count)
 * and seed-dependent. Tests run from the repo root (the default --vocab-from is
 * models/coti-tiny-qwen35-mtp-q8_0.gguf). */
#include <criterion/criterion.h>

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf.h"

/* src/tools/ is not part of libcoti.a (Makefile: the tools link only into ./coti), so the
 * generator is compiled into this test directly; tools/cli.c, its option parser, is linked
 * into test_coti. */
#include "../src/tools/mkmodel.c"

static void tmp_path(char *buf, size_t size, const char *tag) {
    static int counter;
    snprintf(buf, size, "/tmp/coti_test_mkmodel_%ld_%d_%s.gguf", (long)getpid(), counter++, tag);
}

/* Runs `coti mkmodel --arch qwen35 -o out ARGS... NULL`; returns the exit code. */
static int run_mk(const char *out, ...) {
    char *argv[64];
    int argc = 0;
    argv[argc++] = "mkmodel";
    argv[argc++] = "--arch";
    argv[argc++] = "qwen35";
    if (out) { argv[argc++] = "-o"; argv[argc++] = (char *)out; }
    va_list ap;
    va_start(ap, out);
    for (const char *a; (a = va_arg(ap, const char *)) && argc < 63;) argv[argc++] = (char *)a;
    va_end(ap);
    argv[argc] = NULL;
    return tool_mkmodel_main(argc, argv);
}

static struct gguf_file *open_ok(const char *path) {
    struct gguf_file *f = NULL;
    char err[512];
    cr_assert_eq(gguf_open(&f, path, err, sizeof err), 0, "%s", err);
    return f;
}

static uint32_t get_u32(const struct gguf_file *f, const char *key) {
    uint32_t v = 0;
    char err[256];
    cr_assert_eq(gguf_get_u32(f, key, &v, err, sizeof err), 0, "key %s: %s", key, err);
    return v;
}

static const struct gguf_tensor *tensor(const struct gguf_file *f, const char *name, enum ggml_type type,
                                        int64_t ne0, int64_t ne1) {
    const struct gguf_tensor *t = gguf_find_tensor(f, name);
    cr_assert(t, "tensor %s missing", name);
    cr_assert_eq(t->type, type, "%s: type %d, expected %d", name, t->type, type);
    cr_assert_eq(t->n_dims, ne1 ? 2u : 1u, "%s: n_dims %u", name, t->n_dims);
    cr_assert_eq(t->ne[0], ne0, "%s: ne[0] %lld, expected %lld", name, (long long)t->ne[0], (long long)ne0);
    if (ne1) cr_assert_eq(t->ne[1], ne1, "%s: ne[1] %lld, expected %lld", name, (long long)t->ne[1], (long long)ne1);
    return t;
}

static bool files_equal(const char *a, const char *b) {
    struct gguf_file *fa = open_ok(a), *fb = open_ok(b);
    bool eq = fa->size == fb->size && memcmp(fa->base, fb->base, fa->size) == 0;
    gguf_close(fa);
    gguf_close(fb);
    return eq;
}

/* ---------------------------------------------------------------------------------------
 * The default tiny shape: E 64, 4 trunk layers (3 DeltaNet + 1 full) + 1 NextN block,
 * F 128, H 4 / Hkv 2 / D 16, nk 2 / nv 4 / dk 16, Kc 4.
 * ------------------------------------------------------------------------------------- */

Test(gguf, mkmodel_tiny_layout) {
    char path[128];
    tmp_path(path, sizeof path, "tiny");
    cr_assert_eq(run_mk(path, "--n-vocab", "512", NULL), 0);
    struct gguf_file *f = open_ok(path);
    const char *s;
    char err[256];
    cr_assert_eq(gguf_get_str(f, "general.architecture", &s, err, sizeof err), 0);
    cr_assert_str_eq(s, "qwen35");
    cr_assert_eq(get_u32(f, "qwen35.block_count"), 5);
    cr_assert_eq(get_u32(f, "qwen35.nextn_predict_layers"), 1);
    cr_assert_eq(get_u32(f, "qwen35.embedding_length"), 64);
    cr_assert_eq(get_u32(f, "qwen35.feed_forward_length"), 128);
    cr_assert_eq(get_u32(f, "qwen35.attention.head_count"), 4);
    cr_assert_eq(get_u32(f, "qwen35.attention.head_count_kv"), 2);
    cr_assert_eq(get_u32(f, "qwen35.attention.key_length"), 16);
    cr_assert_eq(get_u32(f, "qwen35.attention.value_length"), 16);
    cr_assert_eq(get_u32(f, "qwen35.rope.dimension_count"), 4);
    cr_assert_eq(get_u32(f, "qwen35.ssm.conv_kernel"), 4);
    cr_assert_eq(get_u32(f, "qwen35.ssm.state_size"), 16);
    cr_assert_eq(get_u32(f, "qwen35.ssm.group_count"), 2);
    cr_assert_eq(get_u32(f, "qwen35.ssm.time_step_rank"), 4);
    cr_assert_eq(get_u32(f, "qwen35.ssm.inner_size"), 64);
    cr_assert_eq(get_u32(f, "qwen35.full_attention_interval"), 4);
    cr_assert_eq(get_u32(f, "qwen35.context_length"), 256);
    cr_assert_eq(get_u32(f, "general.file_type"), 7);
    /* llama.cpp type-checks strictly: these must be exactly UINT32 / FLOAT32 / INT32 array */
    cr_assert_eq(gguf_find_kv(f, "qwen35.block_count")->type, GGUF_TYPE_UINT32);
    cr_assert_eq(gguf_find_kv(f, "qwen35.rope.freq_base")->type, GGUF_TYPE_FLOAT32);
    cr_assert_eq(gguf_find_kv(f, "qwen35.attention.layer_norm_rms_epsilon")->type, GGUF_TYPE_FLOAT32);
    const struct gguf_kv *sec = gguf_find_kv(f, "qwen35.rope.dimension_sections");
    cr_assert(sec && sec->type == GGUF_TYPE_ARRAY && sec->arr_type == GGUF_TYPE_INT32 && sec->n == 4);

    /* vocabulary: copied from the shipped model, truncated to 512, merges filtered */
    const struct gguf_kv *tok = gguf_find_kv(f, "tokenizer.ggml.tokens");
    cr_assert(tok && tok->arr_type == GGUF_TYPE_STRING && tok->n == 512);
    cr_assert_str_eq(tok->arr_str[0], "<|endoftext|>");
    const struct gguf_kv *tt = gguf_find_kv(f, "tokenizer.ggml.token_type");
    cr_assert(tt && tt->arr_type == GGUF_TYPE_INT32 && tt->n == 512);
    const struct gguf_kv *mg = gguf_find_kv(f, "tokenizer.ggml.merges");
    cr_assert(mg && mg->arr_type == GGUF_TYPE_STRING && mg->n > 0 && mg->n < 512);
    for (uint64_t i = 0; i < mg->n; i++) {   /* parts and result are all tokens */
        char buf[256];
        snprintf(buf, sizeof buf, "%s", mg->arr_str[i]);
        char *sp = strchr(buf, ' ');
        cr_assert(sp);
        *sp = '\0';
        bool l = false, r = false, both = false;
        char cat[256];
        snprintf(cat, sizeof cat, "%s%s", buf, sp + 1);
        for (uint64_t k = 0; k < tok->n; k++) {
            l |= !strcmp(tok->arr_str[k], buf);
            r |= !strcmp(tok->arr_str[k], sp + 1);
            both |= !strcmp(tok->arr_str[k], cat);
        }
        cr_assert(l && r && both, "merge '%s' refers to a dropped token", mg->arr_str[i]);
    }
    cr_assert_eq(get_u32(f, "tokenizer.ggml.eos_token_id"), 0);
    cr_assert(gguf_find_kv(f, "tokenizer.chat_template"));
    cr_assert_str_eq(gguf_find_kv(f, "tokenizer.ggml.pre")->str, "qwen2");

    /* tensors (arch-qwen35.md §4): tied, so no output.weight */
    const int64_t E = 64, V = 512, F = 128, H = 4, Hkv = 2, D = 16, nk = 2, nv = 4, dk = 16, Kc = 4;
    const int64_t Cc = 2 * nk * dk + nv * dk;
    cr_assert_eq(f->n_tensors, 2 + 3 * 14 + 11 + 15);
    tensor(f, "token_embd.weight", GGML_TYPE_Q8_0, E, V);
    tensor(f, "output_norm.weight", GGML_TYPE_F32, E, 0);
    cr_assert_null(gguf_find_tensor(f, "output.weight"));
    char name[64];
    for (int L = 0; L < 5; L++) {
        bool full = L == 3 || L == 4;
#define T(suffix) (snprintf(name, sizeof name, "blk.%d.%s", L, suffix), name)
        tensor(f, T("attn_norm.weight"), GGML_TYPE_F32, E, 0);
        tensor(f, T("post_attention_norm.weight"), GGML_TYPE_F32, E, 0);
        tensor(f, T("ffn_gate.weight"), GGML_TYPE_Q8_0, E, F);
        tensor(f, T("ffn_up.weight"), GGML_TYPE_Q8_0, E, F);
        tensor(f, T("ffn_down.weight"), GGML_TYPE_Q8_0, F, E);
        if (full) {
            tensor(f, T("attn_q.weight"), GGML_TYPE_Q8_0, E, 2 * H * D);
            tensor(f, T("attn_k.weight"), GGML_TYPE_Q8_0, E, Hkv * D);
            tensor(f, T("attn_v.weight"), GGML_TYPE_Q8_0, E, Hkv * D);
            tensor(f, T("attn_output.weight"), GGML_TYPE_Q8_0, H * D, E);
            tensor(f, T("attn_q_norm.weight"), GGML_TYPE_F32, D, 0);
            tensor(f, T("attn_k_norm.weight"), GGML_TYPE_F32, D, 0);
            cr_assert_null(gguf_find_tensor(f, T("attn_qkv.weight")));
            cr_assert_null(gguf_find_tensor(f, T("ssm_a")));
        } else {
            tensor(f, T("attn_qkv.weight"), GGML_TYPE_Q8_0, E, Cc);
            tensor(f, T("attn_gate.weight"), GGML_TYPE_Q8_0, E, nv * dk);
            tensor(f, T("ssm_conv1d.weight"), GGML_TYPE_F32, Kc, Cc);
            tensor(f, T("ssm_dt.bias"), GGML_TYPE_F32, nv, 0);
            const struct gguf_tensor *a = tensor(f, T("ssm_a"), GGML_TYPE_F32, nv, 0);
            tensor(f, T("ssm_beta.weight"), GGML_TYPE_Q8_0, E, nv);
            tensor(f, T("ssm_alpha.weight"), GGML_TYPE_Q8_0, E, nv);
            tensor(f, T("ssm_norm.weight"), GGML_TYPE_F32, dk, 0);
            tensor(f, T("ssm_out.weight"), GGML_TYPE_Q8_0, nv * dk, E);
            cr_assert_null(gguf_find_tensor(f, T("attn_q.weight")));
            for (int i = 0; i < nv; i++) cr_assert_lt(((const float *)a->data)[i], 0.0f);
        }
        if (L == 4) {   /* the NextN block */
            tensor(f, T("nextn.eh_proj.weight"), GGML_TYPE_Q8_0, 2 * E, E);
            tensor(f, T("nextn.enorm.weight"), GGML_TYPE_F32, E, 0);
            tensor(f, T("nextn.hnorm.weight"), GGML_TYPE_F32, E, 0);
            tensor(f, T("nextn.shared_head_norm.weight"), GGML_TYPE_F32, E, 0);
        } else {
            cr_assert_null(gguf_find_tensor(f, T("nextn.eh_proj.weight")));
        }
#undef T
    }
    cr_assert_null(gguf_find_tensor(f, "blk.5.attn_norm.weight"));

    /* value ranges: norms around 1, conv taps small, matrices ~ 1/sqrt(n_in) */
    const float *nw = gguf_find_tensor(f, "blk.0.attn_norm.weight")->data;
    for (int i = 0; i < E; i++) cr_assert(nw[i] >= 0.9f && nw[i] <= 1.1f, "norm %g", nw[i]);
    const float *cv = gguf_find_tensor(f, "blk.1.ssm_conv1d.weight")->data;
    for (int i = 0; i < Kc * Cc; i++) cr_assert(fabsf(cv[i]) <= 0.5f * sqrtf(3.0f / Kc) + 1e-6f);
    const struct gguf_tensor *fd = gguf_find_tensor(f, "blk.2.ffn_down.weight");
    double ss = 0;
    float row[128];
    for (int r = 0; r < E; r++) {
        quant_dequantize_row_ref(fd->type, (const uint8_t *)fd->data + r * ggml_row_size(fd->type, F), row, F);
        for (int i = 0; i < F; i++) ss += (double)row[i] * row[i];
    }
    double std = sqrt(ss / (double)(E * F));
    cr_assert(fabs(std * sqrt((double)F) - 1.0) < 0.1, "ffn_down std %g, expected ~1/sqrt(%lld)", std, (long long)F);
    gguf_close(f);
    unlink(path);
}

Test(gguf, mkmodel_deterministic) {
    char a[128], b[128], c[128], d[128];
    tmp_path(a, sizeof a, "s1");
    tmp_path(b, sizeof b, "s1again");
    tmp_path(c, sizeof c, "s2");
    tmp_path(d, sizeof d, "s1t1");
    /* default vocabulary (16384): token_embd is large enough to be generated on threads */
    cr_assert_eq(run_mk(a, "--seed", "1", "--threads", "3", NULL), 0);
    cr_assert_eq(run_mk(b, "--seed", "1", "--threads", "3", NULL), 0);
    cr_assert_eq(run_mk(c, "--seed", "2", "--threads", "3", NULL), 0);
    cr_assert_eq(run_mk(d, "--seed", "1", "--threads", "1", NULL), 0);
    cr_assert(files_equal(a, b), "same seed, different bytes");
    cr_assert(files_equal(a, d), "thread count changed the bytes");
    cr_assert_not(files_equal(a, c), "different seeds, same bytes");
    /* different seeds change every tensor, not just some */
    struct gguf_file *fa = open_ok(a), *fc = open_ok(c);
    cr_assert_eq(fa->n_tensors, fc->n_tensors);
    for (uint64_t i = 0; i < fa->n_tensors; i++)
        cr_assert_neq(memcmp(fa->tensors[i].data, fc->tensors[i].data, fa->tensors[i].size_bytes), 0,
                      "%s identical across seeds", fa->tensors[i].name);
    gguf_close(fa);
    gguf_close(fc);
    unlink(a);
    unlink(b);
    unlink(c);
    unlink(d);
}

/* A tensor's values depend on (seed, name) only: adding layers does not change layer 0. */
Test(gguf, mkmodel_order_independent) {
    char a[128], b[128];
    tmp_path(a, sizeof a, "l4");
    tmp_path(b, sizeof b, "l8");
    cr_assert_eq(run_mk(a, "--n-vocab", "512", "--n-layer", "4", "--type", "f32", NULL), 0);
    cr_assert_eq(run_mk(b, "--n-vocab", "512", "--n-layer", "8", "--nextn", "0", "--type", "f32", NULL), 0);
    struct gguf_file *fa = open_ok(a), *fb = open_ok(b);
    const char *names[] = {"token_embd.weight", "blk.0.attn_qkv.weight", "blk.3.attn_q.weight", "blk.2.ssm_a"};
    for (size_t i = 0; i < COTI_ARRAY_LEN(names); i++) {
        const struct gguf_tensor *ta = gguf_find_tensor(fa, names[i]), *tb = gguf_find_tensor(fb, names[i]);
        cr_assert(ta && tb && ta->size_bytes == tb->size_bytes);
        cr_assert_eq(memcmp(ta->data, tb->data, ta->size_bytes), 0, "%s differs", names[i]);
    }
    cr_assert_eq(get_u32(fb, "qwen35.block_count"), 8);
    cr_assert_null(gguf_find_kv(fb, "qwen35.nextn_predict_layers"));
    cr_assert_null(gguf_find_tensor(fb, "blk.7.nextn.eh_proj.weight"));
    tensor(fb, "blk.7.attn_q.weight", GGML_TYPE_F32, 64, 128);   /* (7+1) % 4 == 0: full attention */
    gguf_close(fa);
    gguf_close(fb);
    unlink(a);
    unlink(b);
}

/* --type with llama-quantize's fallback: rows that are not whole blocks use q8_0, then f16. */
Test(gguf, mkmodel_types_and_untied) {
    char p[128];
    tmp_path(p, sizeof p, "q4k");
    cr_assert_eq(run_mk(p, "--n-vocab", "512", "--n-embd", "256", "--n-ff", "512", "--type", "q4_K", "--untied", NULL), 0);
    struct gguf_file *f = open_ok(p);
    tensor(f, "token_embd.weight", GGML_TYPE_Q4_K, 256, 512);
    tensor(f, "output.weight", GGML_TYPE_Q4_K, 256, 512);
    tensor(f, "blk.0.ffn_up.weight", GGML_TYPE_Q4_K, 256, 512);
    tensor(f, "blk.0.ffn_down.weight", GGML_TYPE_Q4_K, 512, 256);
    tensor(f, "blk.0.ssm_out.weight", GGML_TYPE_Q8_0, 64, 256);       /* 64 % 256 != 0 */
    tensor(f, "blk.3.attn_output.weight", GGML_TYPE_Q8_0, 64, 256);
    tensor(f, "blk.0.ssm_conv1d.weight", GGML_TYPE_F32, 4, 128);       /* always F32 */
    cr_assert_eq(get_u32(f, "general.file_type"), 15);
    gguf_close(f);
    unlink(p);

    tmp_path(p, sizeof p, "f16fallback");
    cr_assert_eq(run_mk(p, "--n-vocab", "512", "--n-embd", "48", "--type", "q4_0", NULL), 0);
    f = open_ok(p);
    tensor(f, "token_embd.weight", GGML_TYPE_F16, 48, 512);           /* 48 % 32 != 0 */
    tensor(f, "blk.0.ffn_down.weight", GGML_TYPE_Q4_0, 128, 48);
    gguf_close(f);
    unlink(p);

    static const char *const types[] = {"f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0",
                                        "q2_K", "q3_K", "q5_K", "q6_K"};
    for (size_t i = 0; i < COTI_ARRAY_LEN(types); i++) {
        tmp_path(p, sizeof p, types[i]);
        cr_assert_eq(run_mk(p, "--n-vocab", "512", "--n-embd", "256", "--n-layer", "1", "--type", types[i], NULL), 0,
                     "--type %s", types[i]);
        f = open_ok(p);
        cr_assert_eq(gguf_find_tensor(f, "blk.0.ffn_gate.weight")->type, ggml_type_from_name(types[i]), "%s", types[i]);
        gguf_close(f);
        unlink(p);
    }
}

Test(gguf, mkmodel_vocab_synthetic_and_padded) {
    char p[128];
    tmp_path(p, sizeof p, "synth");
    cr_assert_eq(run_mk(p, "--vocab-from", "none", "--n-vocab", "300", NULL), 0);
    struct gguf_file *f = open_ok(p);
    const struct gguf_kv *tok = gguf_find_kv(f, "tokenizer.ggml.tokens");
    cr_assert(tok && tok->n == 300);
    cr_assert_str_eq(tok->arr_str[0], "<|endoftext|>");
    cr_assert_str_eq(tok->arr_str[2], "<|im_end|>");
    cr_assert_str_eq(tok->arr_str[3 + 'A'], "A");
    cr_assert_str_eq(tok->arr_str[3 + ' '], "\xc4\xa0");   /* GPT-2's 'Ġ' stands for the space byte */
    cr_assert_str_eq(tok->arr_str[3 + '\n'], "\xc4\x8a");  /* 'Ċ' for newline */
    cr_assert_str_eq(tok->arr_str[3 + 0xff], "\xc3\xbf");  /* printable Latin-1 maps to itself */
    cr_assert_str_eq(tok->arr_str[299], "<t299>");
    cr_assert_eq(gguf_find_kv(f, "tokenizer.ggml.merges")->n, 0);
    cr_assert_eq(gguf_find_kv(f, "tokenizer.ggml.token_type")->n, 300);
    cr_assert_str_eq(gguf_find_kv(f, "tokenizer.ggml.model")->str, "gpt2");
    tensor(f, "token_embd.weight", GGML_TYPE_Q8_0, 64, 300);
    gguf_close(f);
    unlink(p);

    tmp_path(p, sizeof p, "padded");
    cr_assert_eq(run_mk(p, "--n-vocab", "16400", "--n-layer", "1", NULL), 0);
    f = open_ok(p);
    tok = gguf_find_kv(f, "tokenizer.ggml.tokens");
    cr_assert(tok && tok->n == 16400);
    cr_assert_str_eq(tok->arr_str[16399], "<t16399>");
    int32_t *types = malloc(16400 * sizeof *types);
    size_t n;
    char err[256];
    cr_assert_eq(gguf_get_arr_i32(f, "tokenizer.ggml.token_type", types, 16400, &n, err, sizeof err), 0, "%s", err);
    cr_assert(n == 16400 && types[0] == 3 && types[16399] == 1);
    free(types);
    cr_assert_eq(gguf_find_kv(f, "tokenizer.ggml.merges")->n, 16125);
    gguf_close(f);
    unlink(p);

    /* default n_vocab = the copied vocabulary's size, copied verbatim */
    tmp_path(p, sizeof p, "copied");
    cr_assert_eq(run_mk(p, "--n-layer", "1", NULL), 0);
    f = open_ok(p);
    struct gguf_file *src = open_ok("models/coti-tiny-qwen35-mtp-q8_0.gguf");
    for (uint64_t i = 0; i < src->n_kv; i++) {
        const struct gguf_kv *a = &src->kv[i];
        if (strncmp(a->key, "tokenizer.", 10)) continue;
        const struct gguf_kv *b = gguf_find_kv(f, a->key);
        cr_assert(b && b->type == a->type && b->arr_type == a->arr_type && b->n == a->n, "%s", a->key);
    }
    tensor(f, "token_embd.weight", GGML_TYPE_Q8_0, 64, 16384);
    gguf_close(src);
    gguf_close(f);
    unlink(p);
}

Test(gguf, mkmodel_bad_options) {
    char p[128];
    tmp_path(p, sizeof p, "bad");
    cr_assert_eq(run_mk(NULL, NULL), 1);                                    /* no -o */
    cr_assert_eq(run_mk(p, "--n-head", "3", NULL), 1);                      /* 3 % 2 */
    cr_assert_eq(run_mk(p, "--ssm-dt-rank", "3", NULL), 1);                 /* 3 % 2 */
    cr_assert_eq(run_mk(p, "--type", "q8_K", NULL), 1);
    cr_assert_eq(run_mk(p, "--type", "iq2_xxs", NULL), 1);
    cr_assert_eq(run_mk(p, "--shape", "70b", NULL), 1);
    cr_assert_eq(run_mk(p, "--n-embd", "0", NULL), 1);
    cr_assert_eq(run_mk(p, "--n-embd", "12x", NULL), 1);
    cr_assert_eq(run_mk(p, "--nextn", "2", NULL), 1);
    cr_assert_eq(run_mk(p, "--rope-dims", "18", NULL), 1);                  /* > head_dim 16 */
    cr_assert_eq(run_mk(p, "--vocab-from", "/nonexistent.gguf", NULL), 1);
    cr_assert_eq(run_mk(p, "--vocab-from", "none", "--n-vocab", "100", NULL), 1);
    cr_assert_eq(run_mk(p, "--bogus", NULL), 1);
    char *argv[] = {"mkmodel", "--arch", "llama", "-o", p, NULL};
    cr_assert_eq(tool_mkmodel_main(5, argv), 1);
    cr_assert_eq(access(p, F_OK), -1, "a failed run left a file");
}

/* --shape coti-tiny reproduces the shipped model's layout exactly (that file loads in
 * llama.cpp): every key with its type and value (but general.name), every tensor with its
 * name, type, shape and offset, in the same order. */
Test(gguf, mkmodel_matches_shipped_layout) {
    char p[128];
    tmp_path(p, sizeof p, "cotitiny");
    cr_assert_eq(run_mk(p, "--shape", "coti-tiny", NULL), 0);
    struct gguf_file *f = open_ok(p), *ref = open_ok("models/coti-tiny-qwen35-mtp-q8_0.gguf");
    cr_assert_eq(f->n_kv, ref->n_kv);
    for (uint64_t i = 0; i < ref->n_kv; i++) {
        const struct gguf_kv *a = &ref->kv[i], *b = &f->kv[i];
        cr_assert_str_eq(b->key, a->key, "kv %llu", (unsigned long long)i);
        cr_assert(b->type == a->type && b->arr_type == a->arr_type && b->n == a->n, "%s", a->key);
        if (!strcmp(a->key, "general.name")) continue;
        if (a->type == GGUF_TYPE_STRING) cr_assert_str_eq(b->str, a->str, "%s", a->key);
        else if (a->type == GGUF_TYPE_ARRAY && a->arr_type == GGUF_TYPE_STRING)
            for (uint64_t k = 0; k < a->n; k++) cr_assert_str_eq(b->arr_str[k], a->arr_str[k], "%s", a->key);
        else if (a->type == GGUF_TYPE_ARRAY) cr_assert_eq(memcmp(b->arr, a->arr, a->n * 4), 0, "%s", a->key);
        else cr_assert_eq(memcmp(&b->v, &a->v, sizeof a->v), 0, "%s", a->key);
    }
    cr_assert_eq(f->n_tensors, ref->n_tensors);
    for (uint64_t i = 0; i < ref->n_tensors; i++) {
        const struct gguf_tensor *a = &ref->tensors[i], *b = &f->tensors[i];
        cr_assert_str_eq(b->name, a->name);
        cr_assert(b->type == a->type && b->n_dims == a->n_dims && b->offset == a->offset, "%s", a->name);
        for (int d = 0; d < 4; d++) cr_assert_eq(b->ne[d], a->ne[d], "%s", a->name);
    }
    gguf_close(ref);
    gguf_close(f);
    unlink(p);
}

/* The 9b preset's layout, checked without generating its ~10 GB of data. */
Test(gguf, mkmodel_9b_layout) {
    struct mk_model m = {.wtype = GGML_TYPE_Q8_0, .seed = 1};
    cr_assert_eq(hp_preset(&m.hp, "9b", MK_QWEN35), 0);
    cr_assert_eq(check_hparams(&m.hp), 0);
    cr_assert_eq(build_tensor_list(&m), 0);
    cr_assert_eq(m.n_t, 3 + 24 * 14 + 8 * 11 + 15);
    uint64_t n_params = 0, bytes = 0;
    const struct mk_tensor *q = NULL, *qkv = NULL, *conv = NULL, *eh = NULL, *out = NULL;
    for (size_t i = 0; i < m.n_t; i++) {
        const struct mk_tensor *t = &m.t[i];
        n_params += (uint64_t)t->ne[0] * (uint64_t)t->ne[1];
        bytes += ggml_row_size(t->type, t->ne[0]) * (uint64_t)t->ne[1];
        if (!strcmp(t->name, "blk.31.attn_q.weight")) q = t;
        if (!strcmp(t->name, "blk.0.attn_qkv.weight")) qkv = t;
        if (!strcmp(t->name, "blk.30.ssm_conv1d.weight")) conv = t;
        if (!strcmp(t->name, "blk.32.nextn.eh_proj.weight")) eh = t;
        if (!strcmp(t->name, "output.weight")) out = t;
    }
    cr_assert(q && q->ne[0] == 4096 && q->ne[1] == 2 * 16 * 256);
    cr_assert(qkv && qkv->ne[0] == 4096 && qkv->ne[1] == 2 * 16 * 128 + 32 * 128);
    cr_assert(conv && conv->ne[0] == 4 && conv->ne[1] == 8192 && conv->type == GGML_TYPE_F32);
    cr_assert(eh && eh->ne[0] == 8192 && eh->ne[1] == 4096);
    cr_assert(out && out->ne[0] == 4096 && out->ne[1] == 248320);
    /* ~9.6 B parameters (HF 9B + the MTP block), ~10 GB at q8_0 */
    cr_assert(n_params > 9000000000ull && n_params < 10500000000ull, "%llu params", (unsigned long long)n_params);
    cr_assert(bytes > 9500000000ull && bytes < 11500000000ull, "%llu bytes", (unsigned long long)bytes);
    free(m.t);
}

/* qwen35moe: the 35b-a3b preset is Qwen3.6-35B-A3B's layout (checked without its data): every
 * block's FFN is 256 stacked experts of 512 (3-D tensors), a router, a shared expert and its
 * 1-D F32 gate; the NextN block's too. */
Test(gguf, mkmodel_qwen35moe_35b_a3b_layout) {
    struct mk_model m = {.wtype = GGML_TYPE_Q4_K, .seed = 1};
    cr_assert_eq(hp_preset(&m.hp, "35b-a3b", MK_QWEN35MOE), 0);
    cr_assert_eq(check_hparams(&m.hp), 0);
    cr_assert_eq(build_tensor_list(&m), 0);
    /* globals 3; delta blocks 30 x (9 + 2 norms + 8 FFN); attention 10 x (6 + 2 + 8); NextN 6 + 2 + 8 + 4 */
    cr_assert_eq(m.n_t, 3 + 30 * 19 + 10 * 16 + 20, "%zu tensors", m.n_t);
    uint64_t n_params = 0;
    const struct mk_tensor *gate = NULL, *down = NULL, *shg = NULL, *inp = NULL, *nx = NULL;
    for (size_t i = 0; i < m.n_t; i++) {
        const struct mk_tensor *t = &m.t[i];
        n_params += (uint64_t)t->ne[0] * (uint64_t)t->ne[1] * (uint64_t)t->ne[2];
        cr_assert(strstr(t->name, "ffn_gate.") == NULL && strstr(t->name, "ffn_gate_up_exps") == NULL, "%s", t->name);
        if (!strcmp(t->name, "blk.0.ffn_gate_exps.weight")) gate = t;
        if (!strcmp(t->name, "blk.39.ffn_down_exps.weight")) down = t;
        if (!strcmp(t->name, "blk.3.ffn_gate_inp_shexp.weight")) shg = t;
        if (!strcmp(t->name, "blk.5.ffn_gate_inp.weight")) inp = t;
        if (!strcmp(t->name, "blk.40.ffn_up_exps.weight")) nx = t;
    }
    cr_assert(gate && gate->n_dims == 3 && gate->ne[0] == 2048 && gate->ne[1] == 512 && gate->ne[2] == 256 &&
              gate->type == GGML_TYPE_Q4_K);
    cr_assert(down && down->n_dims == 3 && down->ne[0] == 512 && down->ne[1] == 2048 && down->ne[2] == 256);
    cr_assert(shg && shg->n_dims == 1 && shg->ne[0] == 2048 && shg->type == GGML_TYPE_F32);
    cr_assert(inp && inp->n_dims == 2 && inp->ne[0] == 2048 && inp->ne[1] == 256 && inp->type == GGML_TYPE_F32,
              "the router stays F32, as llama-quantize leaves it");
    cr_assert(nx && nx->ne[2] == 256, "the NextN block is MoE too");
    /* ~35 B parameters: 34.7 B in the trunk and head, ~0.85 B in the NextN block */
    cr_assert(n_params > 34500000000ull && n_params < 36000000000ull, "%llu params", (unsigned long long)n_params);
    free(m.t);
}

/* gemma4's coti-tiny preset lists exactly the shipped trained file's tensors: names, order,
 * dimensions and types (the converter's layout, from gemma4's table). */
Test(gguf, mkmodel_gemma4_layout_is_the_shipped_files) {
    struct mk_model m = {.wtype = GGML_TYPE_Q8_0, .seed = 1};
    cr_assert_eq(hp_preset(&m.hp, "coti-tiny", MK_GEMMA4), 0);
    m.hp.n_vocab = 16384;
    cr_assert_eq(build_tensor_list(&m), 0);
    struct gguf_file *ref = NULL;
    char err[256];
    cr_assert_eq(gguf_open(&ref, "models/coti-tiny-gemma4-q8_0.gguf", err, sizeof err), 0, "%s", err);
    cr_assert_eq(m.n_t, ref->n_tensors);
    for (size_t i = 0; i < m.n_t; i++) {
        const struct gguf_tensor *a = &ref->tensors[i];
        const struct mk_tensor *b = &m.t[i];
        cr_assert_str_eq(b->name, a->name, "tensor %zu", i);
        cr_assert(b->type == a->type && b->n_dims == a->n_dims && b->ne[0] == a->ne[0] && b->ne[1] == a->ne[1], "%s", a->name);
    }
    gguf_close(ref);
    free(m.t);
}

/* --shape e2b-tiny: E2B's layout in llama.cpp's names and shapes (arch-gemma4.md §2): the PLE
 * globals ({P·L, V}, {E, P·L}, {P}) and per layer inp_gate {E, P}, proj {P, E}, post_norm {E};
 * the 5 shared-KV layers without attn_k / attn_k_norm and with a 2x FFN (the per-layer
 * feed_forward_length array); a model without --n-embd-per-layer has none of it. */
Test(gguf, mkmodel_gemma4_e2b_tiny_layout) {
    char p[256], q[256], err[256];
    tmp_path(p, sizeof p, "e2b");
    char *argv[] = {"mkmodel", "--arch", "gemma4", "--shape", "e2b-tiny", "--n-vocab", "300", "--vocab-from", "none",
                    "-o", p, NULL};
    cr_assert_eq(tool_mkmodel_main(11, argv), 0);
    struct gguf_file *f = open_ok(p);
    const enum ggml_type Q8 = GGML_TYPE_Q8_0, F32 = GGML_TYPE_F32;
    cr_assert_eq(get_u32(f, "gemma4.embedding_length_per_layer_input"), 64);
    cr_assert_eq(get_u32(f, "gemma4.attention.shared_kv_layers"), 5);
    int32_t ff[16];
    size_t n_ff = 0;
    cr_assert_eq(gguf_get_arr_i32(f, "gemma4.feed_forward_length", ff, 16, &n_ff, err, sizeof err), 0, "%s", err);
    cr_assert_eq(n_ff, 10);
    for (int il = 0; il < 10; il++) cr_assert_eq(ff[il], il < 5 ? 640 : 1280, "layer %d", il);
    tensor(f, "per_layer_token_embd.weight", Q8, 640, 300);
    tensor(f, "per_layer_model_proj.weight", Q8, 256, 640);
    tensor(f, "per_layer_proj_norm.weight", F32, 64, 0);
    char name[64];
    for (int il = 0; il < 10; il++) {
        snprintf(name, sizeof name, "blk.%d.inp_gate.weight", il);
        tensor(f, name, Q8, 256, 64);
        snprintf(name, sizeof name, "blk.%d.proj.weight", il);
        tensor(f, name, Q8, 64, 256);
        snprintf(name, sizeof name, "blk.%d.post_norm.weight", il);
        tensor(f, name, F32, 256, 0);
        snprintf(name, sizeof name, "blk.%d.attn_k.weight", il);
        cr_assert_eq(gguf_find_tensor(f, name) != NULL, il < 5, "%s", name);
        snprintf(name, sizeof name, "blk.%d.ffn_up.weight", il);
        tensor(f, name, Q8, 256, il < 5 ? 640 : 1280);
    }
    gguf_close(f);
    unlink(p);
    tmp_path(q, sizeof q, "g4");
    char *argv2[] = {"mkmodel", "--arch", "gemma4", "--n-vocab", "300", "--vocab-from", "none", "-o", q, NULL};
    cr_assert_eq(tool_mkmodel_main(9, argv2), 0);
    f = open_ok(q);
    cr_assert_eq(get_u32(f, "gemma4.embedding_length_per_layer_input"), 0);
    for (uint64_t i = 0; i < f->n_tensors; i++)
        cr_assert(!strstr(f->tensors[i].name, "per_layer") && !strstr(f->tensors[i].name, "inp_gate"), "%s",
                  f->tensors[i].name);
    gguf_close(f);
    unlink(q);
    /* more layers than gemma4 holds: refused, not written past its arrays */
    char *argv3[] = {"mkmodel", "--arch", "gemma4", "--n-layer", "300", "--vocab-from", "none", "-o", q, NULL};
    cr_assert_eq(tool_mkmodel_main(9, argv3), 1);
    /* shared-KV layers whose sources llama.cpp would not find (layer 5 is sliding): refused */
    char *argv4[] = {"mkmodel", "--arch", "gemma4", "--shape", "e2b-tiny", "--kv-shared", "4", "--vocab-from", "none",
                     "-o", q, NULL};
    cr_assert_eq(tool_mkmodel_main(11, argv4), 1);
}
