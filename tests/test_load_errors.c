/* test_load_errors.c — a model file that parses as GGUF but is not a loadable qwen35 (a
 * missing tensor, a tensor of the wrong shape or type, absurd hparams, a KV cache that cannot
 * be allocated) is refused by model_load with the reason, and nothing is freed twice (the
 * ASan run of the suite catches that). The files are made by `coti mkmodel` and edited in
 * place: renaming a tensor, shrinking a dimension or retyping a tensor only shortens the data
 * the header describes, so the GGUF reader still accepts the file and the loader must judge. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model.h"

struct blob {
    uint8_t *p;
    size_t n;
};

static struct blob read_all(const char *path) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "open %s", path);
    fseek(f, 0, SEEK_END);
    struct blob b = {NULL, (size_t)ftell(f)};
    fseek(f, 0, SEEK_SET);
    b.p = malloc(b.n);
    cr_assert_not_null(b.p);
    cr_assert_eq(fread(b.p, 1, b.n, f), b.n);
    fclose(f);
    return b;
}

static void write_all(const char *path, struct blob b) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(b.p, 1, b.n, f), b.n);
    fclose(f);
}

/* A small random qwen35 (one delta-net layer, a NextN layer), written once per test. */
static struct blob make_model_with(const char *path, const char *more) {
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "./coti mkmodel --arch qwen35 -o %s --vocab-from none --n-vocab 300 --n-embd 64 --n-layer 1 "
             "--n-ff 128 --nextn 1 --seed 7 %s > /dev/null 2>&1", path, more);
    cr_assert_eq(system(cmd), 0, "mkmodel failed");
    return read_all(path);
}
static struct blob make_model(const char *path) { return make_model_with(path, ""); }

/* Where a GGUF string (u64 length, then bytes) with this text starts its bytes. */
static uint8_t *find_gguf_string(struct blob b, const char *text) {
    const size_t n = strlen(text);
    for (uint8_t *at = b.p + 8; (at = memmem(at, b.n - (size_t)(at - b.p), text, n)) != NULL; at++) {
        uint64_t len;
        memcpy(&len, at - 8, 8);
        if (len == n) return at;
    }
    cr_assert_fail("string %s not found in the model", text);
    return NULL;
}

/* A tensor's info: its name, then n_dims (u32), ne[n_dims] (u64), type (u32). */
static uint8_t *tensor_ne(struct blob b, const char *name) { return find_gguf_string(b, name) + strlen(name) + 4; }
static uint8_t *tensor_type(struct blob b, const char *name) {
    uint32_t n_dims;
    memcpy(&n_dims, find_gguf_string(b, name) + strlen(name), 4);
    return tensor_ne(b, name) + 8 * n_dims;
}

/* Load the edited file with params p; it must fail with a message containing want. */
static void expect_refused_with(const char *path, struct blob b, const char *want, const struct model_params *p) {
    write_all(path, b);
    struct backend *be = backend_cpu_init(1, QUANT_CPU_REF);
    cr_assert_not_null(be);
    struct model *m = (struct model *)p; /* must be cleared by a failing load */
    char err[512] = "";
    int rc = model_load(&m, path, be, p, err, sizeof err);
    cr_assert_neq(rc, 0, "the edited model loaded");
    cr_assert_null(m, "a failed load left a model behind");
    cr_expect_not_null(strstr(err, want), "error '%s' does not say '%s'", err, want);
    backend_free(be);
    unlink(path);
}
static void expect_refused(const char *path, struct blob b, const char *want, int n_seq, int n_ctx) {
    const struct model_params p = {n_seq, n_ctx, 16, 4, NULL, GGML_TYPE_F16, GGML_TYPE_F16, 0, 0};
    expect_refused_with(path, b, want, &p);
}

#define SCRATCH "/tmp/coti-test-load-errors"

static char *scratch(const char *what) {
    static char path[128];
    snprintf(path, sizeof path, SCRATCH "-%d-%s.gguf", (int)getpid(), what);
    return path;
}

Test(load_errors, the_unedited_model_loads) {
    char *path = scratch("ok");
    struct blob b = make_model(path);
    struct backend *be = backend_cpu_init(1, QUANT_CPU_REF);
    struct model_params p = {1, 64, 16, 4, NULL, GGML_TYPE_F16, GGML_TYPE_F16, 0, 0};
    struct model *m = NULL;
    char err[512];
    cr_assert_eq(model_load(&m, path, be, &p, err, sizeof err), 0, "%s", err);
    model_free(m);
    backend_free(be);
    free(b.p);
    unlink(path);
}

Test(load_errors, missing_tensor) {
    char *path = scratch("missing");
    struct blob b = make_model(path);
    find_gguf_string(b, "blk.0.ffn_up.weight")[strlen("blk.0.ffn_up.weight") - 1] = 'X';
    expect_refused(path, b, "blk.0.ffn_up.weight", 1, 64);
    free(b.p);
}

Test(load_errors, tensor_of_wrong_shape) {
    char *path = scratch("shape");
    struct blob b = make_model(path);
    uint64_t ne0;
    uint8_t *at = tensor_ne(b, "blk.0.ffn_down.weight");
    memcpy(&ne0, at, 8);
    ne0 /= 2;
    memcpy(at, &ne0, 8);
    expect_refused(path, b, "blk.0.ffn_down.weight", 1, 64);
    free(b.p);
}

/* A tensor-parallel rank cuts the file's tensors (tests/test_shard.c): a split tensor of the
 * wrong shape is refused there too, also where the rank's part would fit (half of ffn_gate's rows
 * still hold rank 0's); so is a split that would cut the type's blocks. */
Test(load_errors, a_rank_refuses_a_split_tensor_of_wrong_shape) {
    char *path = scratch("rank-shape");
    struct blob b = make_model_with(path, "--ssm-d-state 32"); /* v-heads of 32 columns: Q8_0 blocks */
    uint64_t ne1;
    uint8_t *at = tensor_ne(b, "blk.0.ffn_gate.weight") + 8;
    memcpy(&ne1, at, 8);
    ne1 /= 2;
    memcpy(at, &ne1, 8);
    const struct model_params p = {1, 64, 16, 4, NULL, GGML_TYPE_F16, GGML_TYPE_F16, 0, 2};
    expect_refused_with(path, b, "blk.0.ffn_gate.weight has shape", &p);
    free(b.p);
    /* unedited, with v-heads of 16 columns: a rank's columns would cut Q8_0 blocks */
    b = make_model(path);
    expect_refused_with(path, b, "do not fall on its q8_0 blocks of 32", &p);
    free(b.p);
}

Test(load_errors, norm_of_wrong_type) {
    char *path = scratch("type");
    struct blob b = make_model(path);
    const uint32_t f16 = 1; /* F32 -> F16: half the bytes, still inside the file */
    memcpy(tensor_type(b, "output_norm.weight"), &f16, 4);
    expect_refused(path, b, "output_norm.weight", 1, 64);
    free(b.p);
}

Test(load_errors, hparams_that_disagree_with_tensors) {
    char *path = scratch("disagree");
    struct blob b = make_model(path);
    /* the key's u32 value follows its name and the value type */
    uint8_t *at = find_gguf_string(b, "qwen35.feed_forward_length") + strlen("qwen35.feed_forward_length") + 4;
    const uint32_t n_ff = 96;
    memcpy(at, &n_ff, 4);
    expect_refused(path, b, "ffn_", 1, 64);
    free(b.p);
}

Test(load_errors, absurd_hparams) {
    char *path = scratch("absurd");
    struct blob b = make_model(path);
    /* 2^30 heads: 2 * heads * head_dim overflows an int; the loader must refuse, not wrap */
    uint8_t *at = find_gguf_string(b, "qwen35.attention.head_count") + strlen("qwen35.attention.head_count") + 4;
    const uint32_t heads = 1u << 30;
    memcpy(at, &heads, 4);
    at = find_gguf_string(b, "qwen35.attention.head_count_kv") + strlen("qwen35.attention.head_count_kv") + 4;
    memcpy(at, &heads, 4);
    expect_refused(path, b, "out of range", 1, 64);
    free(b.p);
}

Test(load_errors, kv_cache_that_cannot_be_allocated) {
    char *path = scratch("kv");
    struct blob b = make_model(path);
    /* the file is fine; 1024 sequences of 2^30 positions are not */
    expect_refused(path, b, "out of memory", 1024, 1 << 30);
    expect_refused(path, b, "-ctk / -ctv q8_0", 1024, 1 << 30); /* the message says what needs less */
    free(b.p);
}

/* A small random qwen35moe (two layers, 8 experts of 32, a NextN layer). */
static struct blob make_moe(const char *path) {
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "./coti mkmodel --arch qwen35moe -o %s --vocab-from none --n-vocab 300 --n-layer 2 --n-expert 8 "
             "--n-expert-used 2 --seed 7 > /dev/null 2>&1", path);
    cr_assert_eq(system(cmd), 0, "mkmodel failed");
    return read_all(path);
}

Test(load_errors, moe_unedited_loads_and_gate_up_half_missing) {
    char *path = scratch("moe");
    struct blob b = make_moe(path);
    write_all(path, b);
    struct backend *be = backend_cpu_init(1, QUANT_CPU_REF);
    struct model_params p = {1, 64, 16, 4, NULL, GGML_TYPE_F16, GGML_TYPE_F16, 0, 0};
    struct model *m = NULL;
    char err[512];
    cr_assert_eq(model_load(&m, path, be, &p, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(m->info.arch, "qwen35moe");
    model_free(m);
    backend_free(be);
    /* gate without up (and no merged gate_up): refused with what a block needs */
    find_gguf_string(b, "blk.1.ffn_up_exps.weight")[strlen("blk.1.ffn_up_exps.weight") - 1] = 'X';
    expect_refused(path, b, "ffn_gate_up_exps", 1, 64);
    free(b.p);
}

Test(load_errors, moe_expert_stack_and_counts_that_disagree) {
    char *path = scratch("moe-stack");
    struct blob b = make_moe(path);
    /* a stack of 4 experts where expert_count says 8 (half the bytes: still inside the file) */
    uint64_t ne2 = 4;
    memcpy(tensor_ne(b, "blk.0.ffn_down_exps.weight") + 16, &ne2, 8);
    expect_refused(path, b, "expert_count 8", 1, 64);
    free(b.p);
    b = make_moe(path);
    uint8_t *at = find_gguf_string(b, "qwen35moe.expert_used_count") + strlen("qwen35moe.expert_used_count") + 4;
    const uint32_t k = 9; /* more than the 8 experts */
    memcpy(at, &k, 4);
    expect_refused(path, b, "out of range", 1, 64);
    free(b.p);
    b = make_moe(path);
    at = find_gguf_string(b, "qwen35moe.expert_feed_forward_length") + strlen("qwen35moe.expert_feed_forward_length") + 4;
    const uint32_t ff = 24; /* not whole pack groups */
    memcpy(at, &ff, 4);
    expect_refused(path, b, "multiples of 16", 1, 64);
    free(b.p);
}

/* -ctk / -ctv: the K and V caches take their type's bytes (a q8_0 row of 32 elements is 34
 * bytes where f16's is 64, q4_0's 18), each independently; a type coti has no cache of is
 * refused by name, a block type for heads it does not tile with the reason. */
Test(load_errors, cache_types_size_the_kv_and_unknown_ones_are_refused) {
    char *path = scratch("ctk");
    struct blob b = make_model(path); /* heads of 16 */
    {
        write_all(path, b);
        struct backend *be = backend_cpu_init(1, QUANT_CPU_REF);
        struct model_params p = {1, 64, 16, 4, NULL, GGML_TYPE_BF16, GGML_TYPE_Q8_0, 0, 0};
        struct model *m = NULL;
        char err[512] = "";
        cr_assert_neq(model_load(&m, path, be, &p, err, sizeof err), 0);
        cr_assert_not_null(strstr(err, "multiples of 32"), "%s", err);
        backend_free(be);
        free(b.p);
    }
    b = make_model_with(path, "--head-dim 32");
    write_all(path, b);
    struct backend *be = backend_cpu_init(1, QUANT_CPU_REF);
    const enum ggml_type types[][2] = {{GGML_TYPE_F16, GGML_TYPE_F16}, {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0},
                                       {GGML_TYPE_BF16, GGML_TYPE_Q8_0}};
    size_t k[3], v[3], rec[3];
    for (int i = 0; i < 3; i++) {
        struct model_params p = {1, 64, 16, 4, NULL, types[i][0], types[i][1], 0, 0};
        struct model *m = NULL;
        char err[512];
        cr_assert_eq(model_load(&m, path, be, &p, err, sizeof err), 0, "%s", err);
        cr_assert_eq(m->info.cache_type_k, types[i][0]);
        cr_assert_eq(m->info.cache_type_v, types[i][1]);
        k[i] = m->info.k_bytes_per_seq;
        v[i] = m->info.v_bytes_per_seq;
        rec[i] = m->info.state_bytes_per_seq - k[i] - v[i];
        cr_assert_eq(rec[i], rec[0], "the recurrent state does not depend on the cache types");
        model_free(m);
    }
    cr_assert_gt(k[0], 0);
    cr_assert_eq(k[1] * 64, k[0] * 34, "q8_0 K: 34 bytes per 32 elements");
    cr_assert_eq(v[1] * 64, v[0] * 18, "q4_0 V: 18 bytes per 32 elements");
    cr_assert_eq(k[2], k[0], "bf16 K: 2 bytes per element");
    cr_assert_eq(v[2], k[1], "q8_0 V as q8_0 K");
    const enum ggml_type bad[] = {GGML_TYPE_F32, GGML_TYPE_Q5_0, GGML_TYPE_Q4_K};
    for (int i = 0; i < 3; i++) {
        struct model_params p = {1, 64, 16, 4, NULL, GGML_TYPE_F16, bad[i], 0, 0};
        struct model *m = NULL;
        char err[512] = "";
        cr_assert_neq(model_load(&m, path, be, &p, err, sizeof err), 0);
        cr_assert_null(m);
        cr_assert_not_null(strstr(err, "must be f16, bf16, q8_0 or q4_0"), "%s", err);
    }
    backend_free(be);
    free(b.p);
    unlink(path);
}

/* gemma4 E-series files: the per-layer embedding tables are required once the metadata gives
 * P > 0, and P · n_layer is bounded. */
static struct blob make_e2b(const char *path) {
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "./coti mkmodel --arch gemma4 --shape e2b-tiny -o %s --vocab-from none --n-vocab 300 --n-embd 64 "
             "--n-ff 64 --seed 7 > /dev/null 2>&1", path);
    cr_assert_eq(system(cmd), 0, "mkmodel failed");
    return read_all(path);
}

Test(load_errors, gemma4_per_layer_table_missing) {
    char *path = scratch("ple-missing");
    struct blob b = make_e2b(path);
    find_gguf_string(b, "per_layer_model_proj.weight")[0] = 'X';
    expect_refused(path, b, "per_layer_model_proj", 1, 64);
    free(b.p);
}

Test(load_errors, gemma4_per_layer_width_absurd) {
    char *path = scratch("ple-absurd");
    struct blob b = make_e2b(path);
    const char *key = "gemma4.embedding_length_per_layer_input";
    const uint32_t p = 1u << 28; /* x 10 layers: past every width bound */
    memcpy(find_gguf_string(b, key) + strlen(key) + 4, &p, 4);
    expect_refused(path, b, "embedding_length_per_layer_input", 1, 64);
    free(b.p);
}

/* With 4 shared-KV layers of 10, llama.cpp reads layer 4 (full) for the sliding layer 6:
 * refused before any tensor is read. */
Test(load_errors, gemma4_shared_kv_source_of_the_wrong_kind) {
    char *path = scratch("kv-src");
    struct blob b = make_e2b(path);
    const char *key = "gemma4.attention.shared_kv_layers";
    const uint32_t n = 4;
    memcpy(find_gguf_string(b, key) + strlen(key) + 4, &n, 4);
    expect_refused(path, b, "shared-KV layer 6 reads layer 4, which must be a sliding layer", 1, 64);
    free(b.p);
}

Test(load_errors, unknown_architecture_lists_the_supported_ones) {
    char *path = scratch("arch");
    struct blob b = make_model(path);
    memcpy(find_gguf_string(b, "qwen35"), "qwen99", 6);   /* general.architecture's value */
    expect_refused(path, b, "architecture 'qwen99' is not supported (supported: qwen35, qwen35moe, gemma4)", 1, 64);
    free(b.p);
}

struct progress_seen {
    int calls;
    uint64_t last_done, total;
    bool monotone;
};

static void on_progress(void *user, uint64_t done, uint64_t total) {
    struct progress_seen *s = user;
    s->monotone = s->monotone && done >= s->last_done && done <= total;
    s->calls++;
    s->last_done = done;
    s->total = total;
}

/* The load reports its progress up to every tensor byte, and the per-slot memory it reports
 * grows with the context by the KV cells only (the recurrent state does not). */
Test(load_errors, load_reports_progress_and_slot_memory) {
    char *path = scratch("progress");
    struct blob b = make_model(path);
    struct backend *be = backend_cpu_init(1, QUANT_CPU_REF);
    size_t slot_bytes[2];
    for (int i = 0; i < 2; i++) {
        struct progress_seen seen = {.monotone = true};
        struct load_progress lp = {on_progress, &seen, 0, 0};
        struct model_params p = {2, 64 << i, 16, 4, &lp, GGML_TYPE_F16, GGML_TYPE_F16, 0, 0};
        struct model *m = NULL;
        char err[512];
        cr_assert_eq(model_load(&m, path, be, &p, err, sizeof err), 0, "%s", err);
        cr_assert_gt(seen.calls, 10, "one report per tensor bound");
        cr_assert(seen.monotone);
        cr_assert_gt(seen.total, 0);
        cr_assert_eq(seen.last_done, seen.total, "the last report is the whole: %llu of %llu",
                     (unsigned long long)seen.last_done, (unsigned long long)seen.total);
        slot_bytes[i] = m->info.state_bytes_per_seq;
        model_free(m);
    }
    const size_t kv_64 = slot_bytes[1] - slot_bytes[0];   /* 64 more positions' KV */
    cr_assert_gt(slot_bytes[0], 0);
    cr_assert_gt(kv_64, 0, "the NextN head's attention keeps KV per position");
    cr_assert_gt(slot_bytes[0], kv_64, "the delta-net state comes on top of the KV cells");
    backend_free(be);
    free(b.p);
    unlink(path);
}
