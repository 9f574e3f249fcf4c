/* quantize.c — `coti quantize IN.gguf OUT.gguf TYPE`: the file rewritten with its weight
 * matrices in TYPE, llama-quantize's uniform case (no per-tensor mixes, no importance matrix).
 *
 * The matrices are the tensors llama.cpp's converter gives the file's weight type: those of two
 * or more dimensions (stacked experts have three) but the MoE routers (`ffn_gate_inp*`, left F32
 * by llama-quantize) and `ssm_conv1d` (F32 in every file). Each row goes through f32 by the
 * reference codecs of quant.h into TYPE, or into q8_0 / f16 where the rows are not whole blocks
 * of TYPE (ggml_type_for_rows). Every other tensor, and every metadata record but
 * general.file_type, is copied as it is. One tensor is held at a time (gguf_writer_write_fill),
 * its rows split over threads.
 *
 * Dequantizing (TYPE f32) makes the exact reference of a quantized file: the same weights with
 * no activation rounding (the CPU's quantized matmuls round activations to Q8 codes, CUDA's f16
 * prompt tiles to f16; scripts/gpu-check.sh holds both to such a copy). Quantizing an already
 * quantized matrix into another quantized type compounds two roundings: it takes
 * --allow-requantize, as llama-quantize does. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "gguf.h"
#include "tools.h"

#define QZ_PARALLEL_MIN_ELEMS (1 << 16) /* smaller tensors convert on the calling thread */

struct qz_tensor {
    const struct gguf_tensor *src;
    enum ggml_type type;   /* the output's */
};

struct qz_ctx {
    const struct gguf_file *in;
    struct qz_tensor *t;   /* [in->n_tensors], in file order: the writer's order too */
    int n_threads;
};

/* Whether llama.cpp gives this tensor the file's weight type (see the header). */
static bool is_weight_matrix(const struct gguf_tensor *t) {
    return t->n_dims >= 2 && !strstr(t->name, "ffn_gate_inp") && !strstr(t->name, "ssm_conv1d");
}

static bool is_quantized(enum ggml_type t) { return ggml_type_traits_get(t)->block_elems > 1; }

struct qz_job {
    const struct qz_tensor *t;
    uint8_t *dst;
};

static int convert_rows(void *arg, int64_t r0, int64_t r1) {
    const struct qz_job *j = arg;
    const struct gguf_tensor *s = j->t->src;
    const int64_t n = s->ne[0];
    const size_t src_rb = ggml_row_size(s->type, n), dst_rb = ggml_row_size(j->t->type, n);
    float *row = malloc(sizeof(float) * (size_t)n);
    if (!row) return COTI_E_NOMEM;
    for (int64_t r = r0; r < r1; r++) {
        quant_dequantize_row_ref(s->type, (const uint8_t *)s->data + (size_t)r * src_rb, row, n);
        quant_quantize_row_ref(j->t->type, row, j->dst + (size_t)r * dst_rb, n);
    }
    free(row);
    return 0;
}

static int fill_tensor(void *ctx, size_t index, const char *name, void *dst, size_t size, char *err, size_t err_size) {
    const struct qz_ctx *q = ctx;
    if (index >= q->in->n_tensors || strcmp(q->t[index].src->name, name))
        return coti_fail(err, err_size, COTI_E_ARG, "quantize: unknown tensor '%s'", name);
    const struct qz_tensor *t = &q->t[index];
    cli_progress("quantize: tensor %zu/%llu %s", index + 1, (unsigned long long)q->in->n_tensors, name);
    const struct gguf_tensor *s = t->src;
    if (t->type == s->type) { /* copied: the same bytes */
        if (size != s->size_bytes) return coti_fail(err, err_size, COTI_E_ARG, "quantize: tensor '%s' size mismatch", name);
        memcpy(dst, s->data, size);
        return 0;
    }
    const int64_t n_rows = s->ne[1] * s->ne[2] * s->ne[3];
    if (ggml_row_size(t->type, s->ne[0]) * (size_t)n_rows != size)
        return coti_fail(err, err_size, COTI_E_ARG, "quantize: tensor '%s' size mismatch", name);
    const int nth = (uint64_t)s->ne[0] * (uint64_t)n_rows >= QZ_PARALLEL_MIN_ELEMS ? q->n_threads : 1;
    struct qz_job j = {t, dst};
    const int rc = cli_parallel_rows(n_rows, nth, convert_rows, &j);
    return rc ? coti_fail(err, err_size, rc, "quantize: out of memory converting '%s'", name) : 0;
}

static void help(FILE *out, const struct cli_common *d) {
    (void)d;
    fprintf(out, "usage: coti quantize [options] IN.gguf OUT.gguf TYPE\n"
                 "Rewrite a GGUF with its weight matrices in TYPE (one type for all: llama-quantize's\n"
                 "uniform case). TYPE: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q2_K q3_K q4_K q5_K q6_K.\n"
                 "Norms, biases, MoE routers and ssm_conv1d stay as they are; rows that are not whole\n"
                 "blocks of TYPE take q8_0, then f16. f32 dequantizes: the exact reference of a file.\n"
                 "  -t, --threads N        conversion threads (default: all CPUs)\n"
                 "  --allow-requantize     convert quantized matrices into another quantized type\n"
                 "  -h, --help             this text\n");
}

struct qz_opts {
    long n_threads;
    bool allow_requantize;
    const char *pos[3];
};

enum { OPT_QZ_THREADS = CLI_TOOL_CODE, OPT_ALLOW_REQUANTIZE };

static int on_option(void *state, int code, const char *name, const char *val) {
    struct qz_opts *o = state;
    switch (code) {
    case 't':
    case OPT_QZ_THREADS: return cli_parse_int(name, val, 1, CLI_MAX_THREADS, &o->n_threads);
    case OPT_ALLOW_REQUANTIZE: o->allow_requantize = true; return 0;
    }
    return -1;
}

int tool_quantize_main(int argc, char **argv) {
    long n_cpu = sysconf(_SC_NPROCESSORS_ONLN);
    struct qz_opts o = {.n_threads = n_cpu < 1 ? 1 : COTI_MIN(n_cpu, CLI_MAX_THREADS)};
    static const struct option opts[] = {
        {"threads", required_argument, NULL, OPT_QZ_THREADS},
        {"allow-requantize", no_argument, NULL, OPT_ALLOW_REQUANTIZE},
        {0},
    };
    const struct cli_tool tool = {.name = "quantize", .help = help, .short_opts = "t:", .opts = opts,
                                  .on_option = on_option, .state = &o, .no_common = true,
                                  .max_positional = 3, .positional = o.pos};
    int pr = cli_parse(NULL, &tool, argc, argv);
    if (pr != CLI_PARSE_OK) return pr == CLI_PARSE_EXIT ? 0 : 1;
    if (!o.pos[2]) {
        fprintf(stderr, "coti quantize: give IN.gguf OUT.gguf TYPE (coti quantize --help)\n");
        return 1;
    }
    const enum ggml_type want = ggml_type_from_name(o.pos[2]);
    if (!ggml_type_supported(want) || want == GGML_TYPE_Q8_1 || want == GGML_TYPE_Q8_K) {
        fprintf(stderr, "coti quantize: '%s' is not a weight type coti writes\n", o.pos[2]);
        return 1;
    }
    char err[512];
    struct gguf_file *in = NULL;
    struct gguf_writer *w = NULL;
    struct qz_ctx q = {0};
    int rc = gguf_open(&in, o.pos[0], err, sizeof err);
    if (rc) goto done;
    q = (struct qz_ctx){.in = in, .n_threads = (int)o.n_threads};
    q.t = calloc(in->n_tensors ? in->n_tensors : 1, sizeof *q.t);
    w = gguf_writer_init();
    if (!q.t || !w) { rc = coti_fail(err, sizeof err, COTI_E_NOMEM, "out of memory"); goto done; }
    size_t n_converted = 0;
    int64_t n_elems = 0;
    for (size_t i = 0; i < in->n_tensors; i++) {
        const struct gguf_tensor *s = &in->tensors[i];
        struct qz_tensor *t = &q.t[i];
        t->src = s;
        t->type = is_weight_matrix(s) ? ggml_type_for_rows(want, s->ne[0]) : s->type;
        if (t->type == s->type) continue;
        if (!ggml_type_supported(s->type)) {
            rc = coti_fail(err, sizeof err, COTI_E_UNSUPPORTED, "tensor '%s': coti cannot read its type %s", s->name,
                           ggml_type_traits_get(s->type) ? ggml_type_traits_get(s->type)->name : "?");
            goto done;
        }
        if (is_quantized(s->type) && is_quantized(t->type) && !o.allow_requantize) {
            rc = coti_fail(err, sizeof err, COTI_E_ARG,
                           "tensor '%s' is %s already: quantizing it to %s rounds twice (--allow-requantize)", s->name,
                           ggml_type_traits_get(s->type)->name, ggml_type_traits_get(t->type)->name);
            goto done;
        }
        n_converted++;
        n_elems += s->ne[0] * s->ne[1] * s->ne[2] * s->ne[3];
    }
    /* the records in their order, general.file_type's value replaced where it stands */
    bool typed = false;
    for (uint64_t i = 0; i < in->n_kv; i++) {
        if (strcmp(in->kv[i].key, "general.file_type") != 0) {
            gguf_writer_set_kv(w, &in->kv[i]);
        } else if (!typed) {
            gguf_writer_set_u32(w, "general.file_type", ggml_file_type_of(want));
            typed = true;
        }
    }
    if (!typed) gguf_writer_set_u32(w, "general.file_type", ggml_file_type_of(want));
    /* llama-quantize's files carry the block formats' version (2 since ggml's last change) */
    if (is_quantized(want) && n_converted && !gguf_find_kv(in, "general.quantization_version"))
        gguf_writer_set_u32(w, "general.quantization_version", 2);
    for (size_t i = 0; i < in->n_tensors; i++)
        gguf_writer_add_tensor_info(w, q.t[i].src->name, q.t[i].type, q.t[i].src->n_dims, q.t[i].src->ne);
    const int64_t t0 = coti_time_us();
    rc = gguf_writer_write_fill(w, o.pos[1], fill_tensor, &q, err, sizeof err);
    cli_progress_end();
    if (!rc)
        fprintf(stderr, "coti quantize: wrote %s: %zu of %llu tensors (%.2f M values) to %s, %.1f s\n", o.pos[1],
                n_converted, (unsigned long long)in->n_tensors, (double)n_elems / 1e6, ggml_type_traits_get(want)->name,
                (double)(coti_time_us() - t0) / 1e6);
done:
    if (rc) fprintf(stderr, "coti quantize: %s\n", err);
    gguf_writer_free(w);
    free(q.t);
    gguf_close(in);
    return rc ? 1 : 0;
}
