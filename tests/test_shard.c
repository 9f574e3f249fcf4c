/* Tensor-parallel shards (issue 25, step 1: docs/notes/2026-12-05-tensor-parallel.md): which
 * rows and columns each rank holds, and the loader's gathering of them. */
#include <criterion/criterion.h>

#include "backend.h"
#include "engine/weights.h"
#include "gguf.h"
#include "model.h"
#include "models/qwen35.h"
#include "quant/quant.h"

#include <stdlib.h>
#include <string.h>

#define MODEL_PATH "models/coti-tiny-qwen35-mtp-q8_0.gguf"

/* The default model's shape, and the 9B's (heads 16/4 of 256, delta net 16 k / 32 v heads of 128). */
static struct qwen35_hparams tiny_hparams(void) {
    struct qwen35_hparams hp = {.n_embd = 384, .n_ff = 1152, .n_head = 6, .n_head_kv = 2, .head_dim = 64, .n_rot = 16,
                                .ssm_k = 4, .ssm_dk = 64, .ssm_dv = 64, .ssm_nk = 4, .ssm_nv = 8, .interval = 4};
    hp.ssm_ch = 2 * hp.ssm_nk * hp.ssm_dk + hp.ssm_nv * hp.ssm_dv;
    return hp;
}
static struct qwen35_hparams big_hparams(void) {
    struct qwen35_hparams hp = {.n_embd = 4096, .n_ff = 12288, .n_head = 16, .n_head_kv = 4, .head_dim = 256,
                                .n_rot = 64, .ssm_k = 4, .ssm_dk = 128, .ssm_dv = 128, .ssm_nk = 16, .ssm_nv = 32,
                                .interval = 4};
    hp.ssm_ch = 2 * hp.ssm_nk * hp.ssm_dk + hp.ssm_nv * hp.ssm_dv;
    return hp;
}

/* Every split width: the ranks' runs cover [0, width) once, in increasing order, and add up to
 * the width of the rank's hparams; the delta net's v-heads keep the k-head rule locally. */
static void check_partition(const struct qwen35_hparams *hp, int n) {
    char err[256];
    int64_t whole[QWEN35_N_WIDTHS];
    qwen35_widths(hp, whole);
    static struct weight_shard_runs runs[8][QWEN35_N_WIDTHS];
    struct qwen35_hparams local[8];
    for (int r = 0; r < n; r++)
        cr_assert_eq(qwen35_shard(hp, r, n, &local[r], runs[r], err, sizeof err), 0, "%s", err);
    int n_split = 0;
    for (int w = 0; w < QWEN35_N_WIDTHS; w++) {
        if (!runs[0][w].n) continue;
        n_split++;
        char *seen = calloc((size_t)whole[w], 1);
        for (int r = 0; r < n; r++) {
            int64_t lw[QWEN35_N_WIDTHS], total = 0, prev_end = -1;
            qwen35_widths(&local[r], lw);
            cr_assert(runs[r][w].n >= 1, "width %d split for rank 0 only", w);
            for (int i = 0; i < runs[r][w].n; i++) {
                const int64_t s = runs[r][w].start[i], len = runs[r][w].len[i];
                cr_assert(s > prev_end && len >= 1 && s + len <= whole[w], "width %d rank %d run %d", w, r, i);
                for (int64_t k = s; k < s + len; k++) seen[k]++;
                prev_end = s + len;
                total += len;
            }
            cr_assert_eq(total, lw[w], "width %d rank %d: %lld indices, its hparams say %lld", w, r, (long long)total,
                         (long long)lw[w]);
        }
        for (int64_t k = 0; k < whole[w]; k++) cr_assert_eq(seen[k], 1, "width %d index %lld held %d times", w, (long long)k, seen[k]);
        free(seen);
    }
    cr_assert_eq(n_split, 7, "QG, HD, KV, FF, SSM_CH, SSM_NVD, SSM_NV");
    for (int r = 0; r < n; r++) {
        const struct weight_shard_runs *nv = &runs[r][QWEN35_W_SSM_NV];
        const int nkr = local[r].ssm_nk, k0 = r * nkr;
        int h_local = 0;
        for (int i = 0; i < nv->n; i++)
            for (int64_t h = nv->start[i]; h < nv->start[i] + nv->len[i]; h++, h_local++)
                cr_assert_eq((int)(h % hp->ssm_nk) - k0, h_local % nkr, "rank %d: v-head %lld", r, (long long)h);
        cr_assert_eq(h_local, local[r].ssm_nv);
        cr_assert_eq(local[r].n_head / local[r].n_head_kv, hp->n_head / hp->n_head_kv, "GQA groups stay whole");
    }
}

Test(shard, ranks_partition_every_split_width) {
    const struct qwen35_hparams tiny = tiny_hparams(), big = big_hparams();
    check_partition(&tiny, 2);
    check_partition(&big, 2);
    check_partition(&big, 4);
    char err[256];
    struct qwen35_hparams local;
    struct weight_shard_runs runs[QWEN35_N_WIDTHS];
    cr_assert_eq(qwen35_shard(&tiny, 0, 1, &local, runs, err, sizeof err), 0);
    for (int w = 0; w < QWEN35_N_WIDTHS; w++) cr_assert_eq(runs[w].n, 0, "one rank splits nothing");
    cr_assert_neq(qwen35_shard(&tiny, 0, 4, &local, runs, err, sizeof err), 0, "4 ranks of 2 KV heads");
    cr_assert(strstr(err, "do not divide"), "%s", err);
    cr_assert_neq(qwen35_shard(&big, 2, 2, &local, runs, err, sizeof err), 0, "rank out of range");
}

/* The file's row r, columns [c0, c0 + n), as floats. */
static void file_cols(const struct gguf_tensor *t, int64_t r, int64_t c0, int64_t n, float *out) {
    const int64_t n_in = t->ne[0];
    float *row = malloc(sizeof(float) * (size_t)n_in);
    quant_dequantize_row_ref(t->type, (const uint8_t *)t->data + (size_t)r * ggml_row_size(t->type, n_in), row, n_in);
    memcpy(out, row + c0, sizeof(float) * (size_t)n);
    free(row);
}

/* A rank's rows (attn_qkv: three kinds of runs) and columns (ssm_out: the v-heads' runs) of the
 * default model's Q8_0 tensors equal the file's, and a column run off the blocks is refused. */
Test(shard, gathered_rows_and_columns_are_the_files) {
    char err[256];
    struct gguf_file *g;
    cr_assert_eq(gguf_open(&g, MODEL_PATH, err, sizeof err), 0, "%s", err);
    const struct weight_loader L = {g, NULL, "qwen35", err, sizeof err, NULL, NULL};
    const struct qwen35_hparams hp = tiny_hparams();
    for (int r = 0; r < 2; r++) {
        struct qwen35_hparams local;
        struct weight_shard_runs runs[QWEN35_N_WIDTHS];
        cr_assert_eq(qwen35_shard(&hp, r, 2, &local, runs, err, sizeof err), 0, "%s", err);
        const struct gguf_tensor *qkv = gguf_find_tensor(g, "blk.0.attn_qkv.weight"), *out = gguf_find_tensor(g, "blk.0.ssm_out.weight");
        cr_assert(qkv && out && qkv->type == GGML_TYPE_Q8_0 && out->type == GGML_TYPE_Q8_0);
        const struct weight_shard_runs *rows = &runs[QWEN35_W_SSM_CH], *cols = &runs[QWEN35_W_SSM_NVD];
        void *buf;
        int64_t ni, no;
        cr_assert_eq(weights_shard_gather(&L, qkv, qkv->ne[0], qkv->ne[1], rows, NULL, &buf, &ni, &no), 0, "%s", err);
        cr_assert(ni == hp.n_embd && no == local.ssm_ch, "{%lld, %lld}", (long long)ni, (long long)no);
        float got[1024], want[1024];
        int64_t k = 0;
        for (int i = 0; i < rows->n; i++)
            for (int64_t fr = rows->start[i]; fr < rows->start[i] + rows->len[i]; fr++, k++) {
                quant_dequantize_row_ref(GGML_TYPE_Q8_0, (const uint8_t *)buf + (size_t)k * ggml_row_size(GGML_TYPE_Q8_0, ni), got, ni);
                file_cols(qkv, fr, 0, ni, want);
                cr_assert_eq(memcmp(got, want, sizeof(float) * (size_t)ni), 0, "rank %d: row %lld (file row %lld)", r, (long long)k,
                             (long long)fr);
            }
        free(buf);
        cr_assert_eq(weights_shard_gather(&L, out, out->ne[0], out->ne[1], NULL, cols, &buf, &ni, &no), 0, "%s", err);
        cr_assert(ni == (int64_t)local.ssm_nv * local.ssm_dv && no == hp.n_embd);
        for (int64_t fr = 0; fr < no; fr++) {
            quant_dequantize_row_ref(GGML_TYPE_Q8_0, (const uint8_t *)buf + (size_t)fr * ggml_row_size(GGML_TYPE_Q8_0, ni), got, ni);
            int64_t c = 0;
            for (int i = 0; i < cols->n; i++) {
                file_cols(out, fr, cols->start[i], cols->len[i], want + c);
                c += cols->len[i];
            }
            cr_assert_eq(memcmp(got, want, sizeof(float) * (size_t)ni), 0, "rank %d: row %lld", r, (long long)fr);
        }
        free(buf);
    }
    const struct weight_shard_runs off_blocks = {1, {16}, {64}};
    void *buf;
    int64_t ni, no;
    const struct gguf_tensor *out = gguf_find_tensor(g, "blk.0.ssm_out.weight");
    cr_assert_neq(weights_shard_gather(&L, out, out->ne[0], out->ne[1], NULL, &off_blocks, &buf, &ni, &no), 0);
    cr_assert(strstr(err, "blocks"), "%s", err);
    gguf_close(g);
}

/* A rank loads as a model of its own shape: its forward runs (its partial sums are not yet
 * all-reduced: step 1 checks the shapes, not the values), and splits that do not divide are
 * refused with the reason. */
Test(shard, a_rank_loads_and_runs_its_forward, .timeout = 60) {
    char err[512];
    struct backend *be = backend_cpu_init(1, quant_cpu_level_detect());
    for (int r = 0; r < 2; r++) {
        struct model_params p = {1, 64, 16, 4, NULL, GGML_TYPE_F16, GGML_TYPE_F16, r, 2};
        struct model *m;
        cr_assert_eq(model_load(&m, MODEL_PATH, be, &p, err, sizeof err), 0, "%s", err);
        int32_t toks[3] = {11, 220, 1500}, pos[3] = {0, 1, 2}, seq[3] = {0, 0, 0};
        bool want[3] = {false, false, true};
        struct model_batch b = {.n = 3, .tokens = toks, .pos = pos, .seq = seq, .want_logits = want};
        struct model_output o;
        cr_assert_eq(model_forward(m, &b, &o, err, sizeof err), 0, "%s", err);
        cr_assert_eq(o.n_logits, 1);
        model_free(m);
    }
    struct model_params p = {1, 64, 16, 4, NULL, GGML_TYPE_F16, GGML_TYPE_F16, 0, 4};
    struct model *m;
    cr_assert_neq(model_load(&m, MODEL_PATH, be, &p, err, sizeof err), 0);
    cr_assert(strstr(err, "do not divide"), "%s", err);
    backend_free(be);
}
