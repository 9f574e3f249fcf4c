/* test_gemma4.c — the gemma4 forward on the shipped trained model: hparams and memory as the
 * file describes them, soft-capped logits, a prompt longer than the sliding window giving the
 * same last-row logits in one batch as token by token (the window's cells and both KV kinds),
 * the SIMD kernels agreeing with the scalar reference, and the assistant drafter leaving the
 * target's cache untouched. The same on a random E-series model (mkmodel --shape e2b-tiny:
 * per-layer embeddings, shared-KV layers, per-layer FFN widths). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "model.h"
#include "models/gemma4_assistant.h"
#include "tools/tools.h" /* tool_mkmodel_main: compiled into the suite by test_mkmodel.c */

#define GEMMA4_PATH "models/coti-tiny-gemma4-q8_0.gguf"
#define N_TOK 200 /* > the window of 128 */

static struct model *open_model(struct backend *be, const char *path, int n_batch) {
    char err[512];
    struct model *m = NULL;
    const struct model_params p = {1, 512, n_batch, 4, NULL, GGML_TYPE_F16, GGML_TYPE_F16, 0, 0};
    cr_assert_eq(model_load(&m, path, be, &p, err, sizeof err), 0, "load: %s", err);
    return m;
}

static struct model *open_gemma4(struct backend *be) { return open_model(be, GEMMA4_PATH, 256); }

/* A random E2B-shaped model at path, window 8 (every prompt here is longer) or as given; the
 * shipped model's vocabulary and widths, so the shipped assistant fits it. Opened with 16 rows
 * per forward, its sliding layers hold rings of 8 - 1 + 16 positions (memory/kv.h), which the
 * prompts here wrap around many times. */
#define E2B_BATCH 16
static void make_e2b_tiny(char *path, size_t size, const char *window) {
    snprintf(path, size, "/tmp/coti_test_gemma4_%ld_e2b.gguf", (long)getpid());
    char *argv[] = {"mkmodel", "--arch", "gemma4", "--shape", "e2b-tiny", "--window", (char *)window, "--vocab-from",
                    GEMMA4_PATH, "-o", path, NULL};
    cr_assert_eq(tool_mkmodel_main(11, argv), 0);
}

static void tokens(int32_t *t, int n, int V) {
    uint32_t s = 12345;
    for (int i = 0; i < n; i++) { s = s * 1664525u + 1013904223u; t[i] = (int32_t)((s >> 8) % (uint32_t)V); }
}

/* Feed t[p0, p0 + n) and return the last row's logits in out. */
static void feed(struct model *m, const int32_t *t, int p0, int n, float *out) {
    int32_t pos[N_TOK];
    char err[256];
    for (int i = 0; i < n; i++) pos[i] = p0 + i;
    const struct model_batch b = {.n = n, .tokens = t + p0, .pos = pos};
    struct model_output o;
    cr_assert_eq(model_forward(m, &b, &o, err, sizeof err), 0, "forward: %s", err);
    m->be->download(m->be, out, o.logits, sizeof(float) * (size_t)m->info.n_vocab);
}

Test(gemma4, loads_what_the_file_describes) {
    struct backend *be = backend_cpu_init(2, quant_cpu_level_detect());
    struct model *m = open_gemma4(be);
    cr_assert_str_eq(m->info.arch, "gemma4");
    cr_assert_eq(m->info.n_layer, 8);
    cr_assert_eq(m->info.n_vocab, 16384);
    cr_assert(!model_nextn(m) && !m->info.has_recurrent);
    const struct kv_cache *kv = &m->engine->mem.kv;
    cr_assert_eq(kv->n_layer, 8);
    cr_assert_eq(kv->layers[0].head_dim, 64, "sliding layers: 2 heads of 64");
    cr_assert_eq(kv->layers[0].n_head_kv, 2);
    cr_assert_eq(kv->layers[3].head_dim, 128, "full layers: 1 head of 128");
    cr_assert_eq(kv->layers[3].n_head_kv, 1);
    cr_assert_eq(m->engine->window, 128);
    cr_assert_float_eq(m->engine->softcap, 30.0f, 0.0f);
    model_free(m);
    backend_free(be);
}

/* The last row's logits of N_TOK tokens in one batch and token by token: the same math in
 * another row grouping, so f32 rounding only; both soft-capped. */
static void batch_and_token_by_token_agree(struct model *m) {
    const int V = m->info.n_vocab;
    int32_t t[N_TOK];
    tokens(t, N_TOK, V);
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
    feed(m, t, 0, N_TOK, a);
    model_seq_reset(m, 0);
    for (int i = 0; i < N_TOK; i++) feed(m, t, i, 1, b);
    double worst = 0;
    int am = 0, bm = 0;
    for (int i = 0; i < V; i++) {
        cr_assert(isfinite(a[i]) && fabsf(a[i]) <= 30.0f, "logit %d = %g is not soft-capped", i, a[i]);
        worst = fmax(worst, fabs((double)a[i] - b[i]));
        if (a[i] > a[am]) am = i;
        if (b[i] > b[bm]) bm = i;
    }
    cr_assert(worst < 2e-3, "max |logit difference| %g", worst);
    cr_assert_eq(am, bm);
    free(a);
    free(b);
}

Test(gemma4, batch_and_token_by_token_agree_past_the_window) {
    struct backend *be = backend_cpu_init(2, quant_cpu_level_detect());
    struct model *m = open_gemma4(be);
    batch_and_token_by_token_agree(m);
    model_free(m);
    backend_free(be);
}

Test(gemma4, simd_kernels_agree_with_the_reference) {
    struct backend *br = backend_cpu_init(1, QUANT_CPU_REF), *bs = backend_cpu_init(2, quant_cpu_level_detect());
    struct model *mr = open_gemma4(br), *ms = open_gemma4(bs);
    const int V = mr->info.n_vocab;
    int32_t t[64];
    tokens(t, 64, V);
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
    feed(mr, t, 0, 64, a);
    feed(ms, t, 0, 64, b);
    double worst = 0;
    for (int i = 0; i < V; i++) worst = fmax(worst, fabs((double)a[i] - b[i]));
    /* every matmul quantizes its input to Q8_0, where the SIMD kernels' f32 summation order can
     * move a code by one step; through 8 layers that reaches the logits (spanning ±30 here) as
     * ~0.2 (measured; top-1 logprob differences 0.09, as qwen35's 0.05). A wrong kernel moves
     * them by units. */
    cr_assert(worst < 0.5, "max |logit difference| %g", worst);
    free(a);
    free(b);
    model_free(mr);
    model_free(ms);
    backend_free(br);
    backend_free(bs);
}

/* The assistant's steps read the target's cache and write none of it: every K/V byte and the
 * lengths are the same before and after a chain of draft steps (arch-gemma4.md §5.9). */
static size_t layer_bytes(const struct kv_cache *kv, int il, size_t row_bytes) {
    return row_bytes * (size_t)kv->n_seq * (size_t)(kv->windowed[il] ? kv->win : kv->full).block;
}

static void *kv_bytes(struct model *m, size_t *n) {
    const struct kv_cache *kv = &m->engine->mem.kv;
    size_t total = 0;
    for (int il = 0; il < kv->n_layer; il++)
        total += layer_bytes(kv, il, kv->layers[il].k_row_bytes) + layer_bytes(kv, il, kv->layers[il].v_row_bytes);
    unsigned char *h = malloc(total), *p = h;
    for (int il = 0; il < kv->n_layer; il++) {
        const size_t bk = layer_bytes(kv, il, kv->layers[il].k_row_bytes), bv = layer_bytes(kv, il, kv->layers[il].v_row_bytes);
        m->be->download(m->be, p, kv->layers[il].k, bk);
        m->be->download(m->be, p + bk, kv->layers[il].v, bv);
        p += bk + bv;
    }
    *n = total;
    return h;
}

/* Feed n_fed tokens to sequence 0 of m, then three assistant steps at that position (the first
 * token from gemma4_assistant_at's upload, the others chained on the device): the target's cache
 * bytes and length must not change, and every draft must be a token id. */
static void assistant_steps_keep_the_cache(struct model *m, struct gemma4_assistant *a, int n_fed) {
    struct backend *be = m->be;
    int32_t t[N_TOK];
    tokens(t, N_TOK, m->info.n_vocab);
    float *logits = malloc(sizeof(float) * m->info.n_vocab);
    feed(m, t, 0, n_fed, logits);
    size_t n0, n1;
    void *before = kv_bytes(m, &n0);
    int32_t *d_tok = be->alloc(be, sizeof(int32_t) * 3);
    float *h = be->alloc(be, sizeof(float) * m->info.n_embd);
    be->upload(be, h, logits, sizeof(float) * m->info.n_embd); /* any nonzero hidden row */
    const int32_t *tok = gemma4_assistant_at(a, 0, n_fed, t[n_fed]);
    const float *lg, *ho = h;
    for (int k = 0; k < 3; k++) {
        gemma4_assistant_step(a, tok, ho, d_tok + k, &lg, &ho);
        tok = d_tok + k;
    }
    int32_t drafts[3];
    be->download(be, drafts, d_tok, sizeof drafts);
    void *after = kv_bytes(m, &n1);
    cr_assert(n0 == n1 && memcmp(before, after, n0) == 0, "the target's cache changed");
    cr_assert_eq(m->seq_len[0], n_fed);
    for (int k = 0; k < 3; k++) cr_assert(drafts[k] >= 0 && drafts[k] < m->info.n_vocab, "draft %d = %d", k, drafts[k]);
    free(before); free(after); free(logits);
    be->free(be, d_tok); be->free(be, h);
}

Test(gemma4, assistant_steps_leave_the_target_cache_as_it_was) {
    struct backend *be = backend_cpu_init(2, quant_cpu_level_detect());
    struct model *m = open_gemma4(be);
    char err[512];
    struct gemma4_assistant *a = NULL;
    cr_assert_eq(gemma4_assistant_load(&a, "models/coti-tiny-gemma4-assistant-q8_0.gguf", m, err, sizeof err), 0, "%s", err);
    assistant_steps_keep_the_cache(m, a, 150); /* past the window */
    gemma4_assistant_free(a);
    model_free(m);
    backend_free(be);
}

/* E2B's layout: layers 5-9 hold no K/V of their own and read layer 3's (sliding) and layer 4's
 * (full), as llama.cpp assigns them. */
Test(gemma4, e2b_tiny_loads_with_shared_kv_and_per_layer_embeddings) {
    char path[256];
    make_e2b_tiny(path, sizeof path, "8");
    struct backend *be = backend_cpu_init(2, quant_cpu_level_detect());
    struct model *m = open_model(be, path, E2B_BATCH);
    cr_assert_eq(m->info.n_layer, 10);
    const struct kv_cache *kv = &m->engine->mem.kv;
    for (int il = 5; il < 10; il++) {
        const int src = il == 9 ? 4 : 3;
        cr_assert(kv->layers[il].k == kv->layers[src].k && kv->layers[il].v == kv->layers[src].v, "layer %d reads %d", il, src);
    }
    cr_assert(kv->layers[3].k != kv->layers[4].k);
    cr_assert_eq(kv->layers[4].head_dim, 128);
    cr_assert_eq(m->engine->window, 8);
    /* the sliding layers: a ring of 8 - 1 + 16 (the rows of a forward, more than a rollback's
     * 4) positions and its 8 cells of second stores, 31 cells in a block of KV_BLOCK_ALIGN; the
     * full ones hold n_ctx */
    cr_assert(kv->win.ring == 23 && kv->win.block == KV_BLOCK_ALIGN && kv->full.block == 512 && !kv->full.ring);
    cr_assert(kv->windowed[3] && !kv->windowed[4] && kv->windowed[8] && !kv->windowed[9]);
    model_free(m);
    backend_free(be);
    unlink(path);
}

/* A batch forms every token's per-layer inputs side by side and regroups them per layer; one
 * token reads them in place: both give the same logits, past the window and round the ring. */
Test(gemma4, e2b_tiny_batch_and_token_by_token_agree) {
    char path[256];
    make_e2b_tiny(path, sizeof path, "8");
    struct backend *be = backend_cpu_init(2, quant_cpu_level_detect());
    struct model *m = open_model(be, path, E2B_BATCH);
    batch_and_token_by_token_agree(m);
    model_free(m);
    backend_free(be);
    unlink(path);
}

/* Copy row `from` of tensor `name` over row `to`, in the file. */
static void copy_row(const char *path, const char *name, int from, int to) {
    struct gguf_file *g = NULL;
    char err[256];
    cr_assert_eq(gguf_open(&g, path, err, sizeof err), 0, "%s", err);
    const struct gguf_tensor *t = gguf_find_tensor(g, name);
    cr_assert(t);
    const size_t rb = t->size_bytes / (size_t)t->ne[1], off = g->data_offset + t->offset;
    void *row = malloc(rb);
    memcpy(row, (const uint8_t *)t->data + (size_t)from * rb, rb);
    gguf_close(g);
    FILE *f = fopen(path, "r+b");
    cr_assert(f && fseek(f, (long)(off + (size_t)to * rb), SEEK_SET) == 0 && fwrite(row, 1, rb, f) == rb);
    fclose(f);
    free(row);
}

/* Position 0's logits of one token (nothing before it to attend to). */
static void first_logits(struct model *m, int32_t tok, float *out) {
    model_seq_reset(m, 0);
    int32_t t[1] = {tok};
    feed(m, t, 0, 1, out);
}

static double max_diff(const float *a, const float *b, int n) {
    double d = 0;
    for (int i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

/* The per-layer table is read per token: two tokens whose main embedding rows are made equal
 * still give different first logits, and the same once their per-layer rows are equal too. */
Test(gemma4, e2b_tiny_per_layer_rows_are_the_tokens_own) {
    char path[256];
    make_e2b_tiny(path, sizeof path, "8");
    copy_row(path, "token_embd.weight", 100, 200);
    struct backend *be = backend_cpu_init(2, quant_cpu_level_detect());
    struct model *m = open_model(be, path, E2B_BATCH);
    const int V = m->info.n_vocab;
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
    first_logits(m, 100, a);
    first_logits(m, 200, b);
    cr_assert(max_diff(a, b, V) > 0.05, "the per-layer rows made no difference: %g", max_diff(a, b, V));
    model_free(m);
    copy_row(path, "per_layer_token_embd.weight", 100, 200);
    m = open_model(be, path, E2B_BATCH);
    first_logits(m, 100, a);
    first_logits(m, 200, b);
    cr_assert(max_diff(a, b, V) == 0, "equal rows, different logits: %g", max_diff(a, b, V));
    free(a);
    free(b);
    model_free(m);
    backend_free(be);
    unlink(path);
}

/* On an E-series target the assistant reads the shared layers' sources and writes nothing; it
 * is refused by a target whose window (and so ring) is narrower than its own. */
Test(gemma4, assistant_on_an_e2b_target_leaves_its_cache_as_it_was) {
    char path[256];
    make_e2b_tiny(path, sizeof path, "8");
    struct backend *be = backend_cpu_init(2, quant_cpu_level_detect());
    struct model *m = open_model(be, path, E2B_BATCH);
    char err[512];
    struct gemma4_assistant *a = NULL;
    cr_assert_eq(gemma4_assistant_load(&a, "models/coti-tiny-gemma4-assistant-q8_0.gguf", m, err, sizeof err),
                 COTI_E_UNSUPPORTED);
    cr_assert(strstr(err, "sliding window (128) is wider than the target's (8)"), "%s", err);
    model_free(m);
    make_e2b_tiny(path, sizeof path, "128");
    m = open_model(be, path, E2B_BATCH); /* ring 143 + 128 cells of 512 */
    cr_assert_eq(gemma4_assistant_load(&a, "models/coti-tiny-gemma4-assistant-q8_0.gguf", m, err, sizeof err), 0, "%s", err);
    assistant_steps_keep_the_cache(m, a, 180); /* round the ring */
    gemma4_assistant_free(a);
    model_free(m);
    backend_free(be);
    unlink(path);
}

/* The ring changes where positions live, not what attention reads: 200 tokens one by one give
 * bit-identical logits with a ring of 23 positions (16 rows per forward) and with every
 * position kept (512 rows per forward: a ring would be no smaller than n_ctx). */
Test(gemma4, e2b_tiny_ring_and_full_cells_agree_exactly) {
    char path[256];
    make_e2b_tiny(path, sizeof path, "8");
    struct backend *be = backend_cpu_init(2, quant_cpu_level_detect());
    struct model *ring = open_model(be, path, E2B_BATCH), *full = open_model(be, path, 512);
    cr_assert(ring->engine->mem.kv.win.ring == 23 && full->engine->mem.kv.win.ring == 0);
    const int V = ring->info.n_vocab;
    int32_t t[N_TOK];
    tokens(t, N_TOK, V);
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
    for (int i = 0; i < N_TOK; i++) {
        feed(ring, t, i, 1, a);
        feed(full, t, i, 1, b);
        if (i % 25 == 24 || i == N_TOK - 1) cr_assert(memcmp(a, b, sizeof(float) * V) == 0, "position %d differs", i);
    }
    free(a);
    free(b);
    model_free(ring);
    model_free(full);
    backend_free(be);
    unlink(path);
}
