/* Tensor-parallel shards (issue 25, step 1: docs/notes/2026-12-05-tensor-parallel.md): which
 * rows and columns each rank holds, and the loader's gathering of them. */
#include <criterion/criterion.h>

#include "backend.h"
#include "engine/weights.h"
#include "gguf.h"
#include "model.h"
#include "models/qwen35.h"
#include "quant/quant.h"
#include "engine/ranks.h"
#include "tp.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* The host sum of 3 ranks on 3 threads: every rank gets the rank-order sum, bit for bit, over
 * several calls of different lengths. */
struct sum_arg { struct tp_comm *c; int rank; float *x[3]; int64_t n[3]; };
static void *sum_thread(void *p) {
    struct sum_arg *a = p;
    for (int k = 0; k < 3; k++) tp_comm_sum_host(a->c, a->rank, a->x[k], a->n[k]);
    return NULL;
}
Test(shard, host_sum_is_the_rank_order_sum_on_every_rank) {
    struct tp_comm *c = tp_comm_new(3);
    cr_assert_not_null(c);
    cr_assert_null(tp_comm_new(1));
    cr_assert_null(tp_comm_new(TP_MAX_RANKS + 1));
    static const int64_t lens[3] = {5, 4099, 1};
    struct sum_arg a[3];
    float *want[3];
    for (int k = 0; k < 3; k++) want[k] = calloc((size_t)lens[k], sizeof(float));
    unsigned seed = 7;
    for (int r = 0; r < 3; r++) {
        a[r] = (struct sum_arg){c, r, {NULL}, {0}};
        for (int k = 0; k < 3; k++) {
            a[r].n[k] = lens[k];
            a[r].x[k] = malloc(sizeof(float) * (size_t)lens[k]);
            for (int64_t i = 0; i < lens[k]; i++) {
                seed = seed * 1103515245u + 12345u;
                a[r].x[k][i] = ((float)(seed >> 8) / 16777216.0f - 0.5f) * (float)(1 << (r * 9)); /* scales apart: order shows */
                want[k][i] = r ? want[k][i] + a[r].x[k][i] : a[r].x[k][i];
            }
        }
    }
    pthread_t t[2];
    for (int r = 1; r < 3; r++) cr_assert_eq(pthread_create(&t[r - 1], NULL, sum_thread, &a[r]), 0);
    sum_thread(&a[0]);
    for (int r = 1; r < 3; r++) pthread_join(t[r - 1], NULL);
    for (int r = 0; r < 3; r++)
        for (int k = 0; k < 3; k++) {
            cr_assert_eq(memcmp(a[r].x[k], want[k], sizeof(float) * (size_t)lens[k]), 0, "rank %d, call %d", r, k);
            free(a[r].x[k]);
        }
    for (int k = 0; k < 3; k++) free(want[k]);
    tp_comm_free(c);
}

/* A rank's rows (attn_qkv: three kinds of runs) and columns (ssm_out: the v-heads' runs) of the
 * default model's Q8_0 tensors equal the file's, and a column run off the blocks is refused. */
Test(shard, gathered_rows_and_columns_are_the_files) {
    char err[256];
    struct gguf_file *g;
    cr_assert_eq(gguf_open(&g, MODEL_PATH, err, sizeof err), 0, "%s", err);
    const struct weight_loader L = {g, NULL, "qwen35", err, sizeof err, NULL, NULL, NULL};
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

/* Two ranks, each on its own CPU backend and thread, summing through one communicator, against
 * the whole model, teacher-forced on the whole model's greedy tokens: the ranks' logits are the
 * same bits on both, within float rounding of the whole model's (only the three all-reduced
 * matmuls add in another order: each rank's part of the row, then the ranks), and the same
 * argmax wherever the whole model's top two are apart. */
enum { N_PROMPT = 8, N_GEN = 16 };

struct rank_run {
    struct model *m;
    int32_t toks[N_PROMPT + N_GEN];
    bool forced;                 /* toks are given: no picks */
    float *logits;               /* [N_GEN + 1][n_vocab]: the wanted row of each forward */
    int rc;
    char err[256];
};

/* The prompt (the last row's logits) then N_GEN tokens (greedy, or forced), one forward each. */
static void *generate(void *arg) {
    struct rank_run *r = arg;
    const int V = r->m->info.n_vocab;
    int n = N_PROMPT;
    for (int step = 0; step <= N_GEN && !r->rc; step++) {
        int32_t pos[N_PROMPT], seq[N_PROMPT] = {0};
        bool want[N_PROMPT];
        const int p0 = step ? n - 1 : 0, k = step ? 1 : N_PROMPT;
        for (int i = 0; i < k; i++) { pos[i] = p0 + i; want[i] = i == k - 1; }
        struct model_batch b = {.n = k, .tokens = r->toks + p0, .pos = pos, .seq = seq, .want_logits = want};
        struct model_output o;
        if ((r->rc = model_forward(r->m, &b, &o, r->err, sizeof r->err))) break;
        float *row = r->logits + (size_t)step * V;
        r->m->be->download(r->m->be, row, o.logits, sizeof(float) * (size_t)V);
        if (step == N_GEN) break;
        int best = 0;
        for (int v = 1; v < V; v++) if (row[v] > row[best]) best = v;
        if (!r->forced) r->toks[n] = best;
        n++;
    }
    return NULL;
}

static void check_two_ranks(const char *path, double tol) {
    char err[512];
    static const int32_t prompt[N_PROMPT] = {11, 22, 150, 42, 90, 17, 5, 66};
    struct backend *be[3];
    struct rank_run run[3];
    struct tp_comm *comm = tp_comm_new(2);
    cr_assert_not_null(comm);
    for (int r = 0; r < 3; r++) { /* the whole model, then ranks 0 and 1 */
        be[r] = backend_cpu_init(1, quant_cpu_level_detect());
        if (r) cr_assert_eq(tp_attach(be[r], comm, r - 1, err, sizeof err), 0, "%s", err);
        struct model_params p = {1, 64, 16, 4, NULL, GGML_TYPE_F16, GGML_TYPE_F16, r ? r - 1 : 0, r ? 2 : 1};
        memset(&run[r], 0, sizeof run[r]);
        cr_assert_eq(model_load(&run[r].m, path, be[r], &p, err, sizeof err), 0, "%s", err);
        memcpy(run[r].toks, prompt, sizeof prompt);
        run[r].forced = r > 0;
        run[r].logits = malloc(sizeof(float) * (size_t)(N_GEN + 1) * run[r].m->info.n_vocab);
    }
    cr_assert_eq(2 * run[1].m->info.state_bytes_per_seq, run[0].m->info.state_bytes_per_seq, "a rank holds half the state");
    generate(&run[0]);
    for (int r = 1; r < 3; r++) memcpy(run[r].toks, run[0].toks, sizeof run[0].toks);
    pthread_t t2;
    cr_assert_eq(pthread_create(&t2, NULL, generate, &run[2]), 0);
    generate(&run[1]);
    pthread_join(t2, NULL);
    for (int r = 0; r < 3; r++) cr_assert_eq(run[r].rc, 0, "%d: %s", r, run[r].err);
    const size_t V = (size_t)run[0].m->info.n_vocab, nl = (size_t)(N_GEN + 1) * V;
    cr_assert_eq(memcmp(run[1].logits, run[2].logits, sizeof(float) * nl), 0, "the ranks' logits differ");
    double max_d = 0, max_l = 0;
    long n_equal = 0;
    for (size_t i = 0; i < nl; i++) {
        max_d = fmax(max_d, fabs((double)run[1].logits[i] - run[0].logits[i]));
        max_l = fmax(max_l, fabs((double)run[0].logits[i]));
        n_equal += run[1].logits[i] == run[0].logits[i];
    }
    printf("%s: two ranks vs whole: max |dlogit| %.3g, largest logit %.3g, %ld of %zu equal\n", path, max_d, max_l,
           n_equal, nl);
    cr_assert_lt(max_d, tol * max_l, "largest logit difference %g (largest logit %g)", max_d, max_l);
    for (int step = 0; step <= N_GEN; step++) {
        const float *w = run[0].logits + (size_t)step * V, *g = run[1].logits + (size_t)step * V;
        size_t bw = 0, bg = 0, second = V > 1 ? 1 : 0;
        for (size_t v = 1; v < V; v++) { if (w[v] > w[bw]) bw = v; if (g[v] > g[bg]) bg = v; }
        for (size_t v = 0; v < V; v++) if (v != bw && (second == bw || w[v] > w[second])) second = v;
        if (w[bw] - w[second] > 10 * max_d) cr_assert_eq(bg, bw, "step %d: the ranks pick %zu, the whole model %zu", step, bg, bw);
    }
    for (int r = 0; r < 3; r++) { model_free(run[r].m); free(run[r].logits); backend_free(be[r]); }
    tp_comm_free(comm);
}

/* The default model and a random F32 one, then the refusals. Tolerances: F32, sums of a few
 * hundred terms in another order (~1e-7 relative per matmul, grown through the blocks); Q8_0,
 * whose matmuls quantize their inputs, the same last-bit differences now and then move an
 * activation code by one step (the logits then move like Q8_0's own rounding, docs/conformance.md:
 * ~0.07 against llama.cpp). A wrong split or a missing all-reduce is O(1) either way. */
Test(shard, two_ranks_give_the_whole_models_logits, .timeout = 120) {
    char path[128], cmd[512], err[512];
    check_two_ranks(MODEL_PATH, 0.02);
    snprintf(path, sizeof path, "/tmp/coti-test-shard-%d-f32.gguf", (int)getpid());
    snprintf(cmd, sizeof cmd, "./coti mkmodel --arch qwen35 -o %s --type f32 --seed 5 > /dev/null 2>&1", path);
    cr_assert_eq(system(cmd), 0, "mkmodel failed: %s", cmd);
    check_two_ranks(path, 1e-4);
    unlink(path);
    struct backend *b1 = backend_cpu_init(1, quant_cpu_level_detect());
    struct model_params p = {1, 64, 16, 4, NULL, GGML_TYPE_F16, GGML_TYPE_F16, 0, 4};
    struct model *m;
    cr_assert_neq(model_load(&m, MODEL_PATH, b1, &p, err, sizeof err), 0);
    cr_assert(strstr(err, "do not divide"), "%s", err);
    backend_free(b1);
}

/* Ranks behind one model (engine/ranks.h): a refused batch is refused by every rank alike (no rank
 * left waiting in an all-reduce), leaves the memory as it was, and the next batch runs; rank 0 is
 * the model the caller holds, and model_free releases the others. */
Test(shard, ranks_behind_one_model_refuse_alike, .timeout = 60) {
    char err[512];
    struct backend *bes[2] = {backend_cpu_init(1, quant_cpu_level_detect()), backend_cpu_init(1, quant_cpu_level_detect())};
    const struct model_params p = {1, 64, 16, 4, NULL, GGML_TYPE_F16, GGML_TYPE_F16, 0, 0};
    struct model *m;
    cr_assert_eq(engine_ranks_load(&m, MODEL_PATH, bes, 2, &p, err, sizeof err), 0, "%s", err);
    cr_assert_eq(m->be, bes[0]);
    int32_t toks[3] = {11, 220, 1500}, pos[3] = {0, 1, 5}, seq[3] = {0, 0, 0};
    struct model_batch b = {.n = 3, .tokens = toks, .pos = pos, .seq = seq};
    struct model_output o;
    cr_assert_neq(model_forward(m, &b, &o, err, sizeof err), 0, "a gap in the positions");
    cr_assert_eq(model_seq_len(m, 0), 0);
    pos[2] = 2;
    cr_assert_eq(model_forward(m, &b, &o, err, sizeof err), 0, "%s", err);
    cr_assert_eq(model_seq_len(m, 0), 3);
    model_seq_reset(m, 0);
    cr_assert_eq(model_seq_len(m, 0), 0);
    cr_assert_eq(model_forward(m, &b, &o, err, sizeof err), 0, "%s", err);
    model_free(m);
    backend_free(bes[0]);
    /* a split that does not divide: nothing kept, both backends still the caller's */
    bes[0] = backend_cpu_init(1, quant_cpu_level_detect());
    bes[1] = backend_cpu_init(1, quant_cpu_level_detect());
    struct backend *four[4] = {bes[0], bes[1], backend_cpu_init(1, quant_cpu_level_detect()),
                               backend_cpu_init(1, quant_cpu_level_detect())};
    cr_assert_neq(engine_ranks_load(&m, MODEL_PATH, four, 4, &p, err, sizeof err), 0);
    cr_assert_null(m);
    for (int r = 0; r < 4; r++) { cr_assert_null(four[r]->comm); backend_free(four[r]); }
}
