/* cli.c — see cli.h. */
#include "cli.h"
#ifdef COTI_CUDA
#include "cuda/backend_cuda.h"
#endif

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cli_common_defaults(struct cli_common *c) {
    memset(c, 0, sizeof *c);
    c->model_path = "models/coti-tiny-qwen35-mtp-q8_0.gguf";
    c->n_threads = 2;
    c->n_ctx = 4096;
    c->n_batch = 512;
    c->cpu_level = quant_cpu_level_detect();
    c->temperature = 0.0f;
    c->top_k = 40;
    c->top_p = 0.95f;
    c->min_p = 0.05f;
    c->seed = 0;
    c->spec = spec_params_default();
}

const char *cli_common_help(void) {
    return "  -m, --model FILE     GGUF model (default models/coti-tiny-qwen35-mtp-q8_0.gguf)\n"
           "  -t, --threads N      CPU threads (default 2)\n"
           "  -c, --ctx-size N     context positions per sequence (default 4096)\n"
           "  -b, --batch-size N   rows per forward step (default 512)\n"
           "  --cpu ref|avx2|avx512  cap the CPU kernels (default: best found)\n"
           "  --device cpu|cuda    compute backend (cuda needs a `make CUDA=1` build)\n"
           "  --temp F             temperature, 0 = greedy (default 0)\n"
           "  --top-k N --top-p F --min-p F   sampling chain (defaults 40, 0.95, 0.05)\n"
           "  --seed N             sampling seed (default 0)\n"
           "  --spec off|mtp|ngram speculative decoding (default off)\n"
           "  --spec-n-max N       draft tokens per cycle (default 3, at most 8)\n"
           "  --spec-n-min N       minimum drafts (default 0)\n"
           "  --spec-p-min F       stop drafting under this probability (default 0)\n"
           "  --spec-sample-drafts sample drafts from the drafter (rejection sampling) at temp > 0\n";
}

int cli_parse_int(const char *opt, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "error: %s expects an integer in [%ld, %ld], got '%s'\n", opt, lo, hi, s ? s : "(nothing)");
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_float(const char *opt, const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = s ? strtod(s, &end) : 0;
    if (!s || errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "error: %s expects a number in [%g, %g], got '%s'\n", opt, lo, hi, s ? s : "(nothing)");
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_common(struct cli_common *c, int argc, char **argv, int *i) {
    const char *a = argv[*i];
    const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    long l;
    double d;
#define IS(x) (strcmp(a, x) == 0)
    if (IS("-m") || IS("--model")) {
        if (!v) { fprintf(stderr, "error: %s needs a file\n", a); return -1; }
        c->model_path = v;
    } else if (IS("-t") || IS("--threads")) {
        if (cli_parse_int(a, v, 1, 256, &l)) return -1;
        c->n_threads = (int)l;
    } else if (IS("-c") || IS("--ctx-size")) {
        if (cli_parse_int(a, v, 16, 1 << 20, &l)) return -1;
        c->n_ctx = (int)l;
    } else if (IS("-b") || IS("--batch-size")) {
        if (cli_parse_int(a, v, 1, 8192, &l)) return -1;
        c->n_batch = (int)l;
    } else if (IS("--cpu")) {
        if (v && !strcmp(v, "ref")) c->cpu_level = QUANT_CPU_REF;
        else if (v && !strcmp(v, "avx2")) c->cpu_level = COTI_MIN(QUANT_CPU_AVX2, quant_cpu_level_detect());
        else if (v && !strcmp(v, "avx512")) c->cpu_level = COTI_MIN(QUANT_CPU_AVX512, quant_cpu_level_detect());
        else { fprintf(stderr, "error: --cpu expects ref, avx2 or avx512\n"); return -1; }
    } else if (IS("--device")) {
        if (v && !strcmp(v, "cpu")) c->cuda = false;
        else if (v && !strcmp(v, "cuda")) c->cuda = true;
        else { fprintf(stderr, "error: --device expects cpu or cuda\n"); return -1; }
    } else if (IS("--temp")) {
        if (cli_parse_float(a, v, 0, 100, &d)) return -1;
        c->temperature = (float)d;
    } else if (IS("--top-k")) {
        if (cli_parse_int(a, v, 0, 1 << 24, &l)) return -1;
        c->top_k = (int)l;
    } else if (IS("--top-p")) {
        if (cli_parse_float(a, v, 0, 1, &d)) return -1;
        c->top_p = (float)d;
    } else if (IS("--min-p")) {
        if (cli_parse_float(a, v, 0, 1, &d)) return -1;
        c->min_p = (float)d;
    } else if (IS("--seed")) {
        char *end;
        errno = 0;
        unsigned long long s = v ? strtoull(v, &end, 10) : 0;
        if (!v || errno || *end || v[0] == '-') { fprintf(stderr, "error: --seed expects a non-negative integer\n"); return -1; }
        c->seed = s;
    } else if (IS("--spec") || IS("--spec-type")) {
        if (!v || drafter_kind_parse(v, &c->spec.drafter)) {
            char choices[128];
            fprintf(stderr, "error: %s expects %s\n", a, drafter_kind_choices(choices, sizeof choices, true, ""));
            return -1;
        }
        /* llama.cpp's -md FILE --spec-type draft-mtp: the MTP drafter is the file's */
        if (c->draft_path && c->spec.drafter == &drafter_kind_mtp) c->spec.drafter = &drafter_kind_assistant;
    } else if (IS("--spec-draft") || IS("-md") || IS("--model-draft")) {
        if (!v) { fprintf(stderr, "error: %s expects a file\n", a); return -1; }
        c->draft_path = v;
        if (c->spec.drafter == &drafter_kind_mtp) c->spec.drafter = &drafter_kind_assistant;
    } else if (IS("--spec-n-max") || IS("--spec-draft-n-max")) {
        if (cli_parse_int(a, v, 1, SPEC_MAX_DRAFT, &l)) return -1;
        c->spec.n_max = (int)l;
    } else if (IS("--spec-n-min")) {
        if (cli_parse_int(a, v, 0, SPEC_MAX_DRAFT, &l)) return -1;
        c->spec.n_min = (int)l;
    } else if (IS("--spec-p-min")) {
        if (cli_parse_float(a, v, 0, 1, &d)) return -1;
        c->spec.p_min = (float)d;
    } else if (IS("--spec-sample-drafts")) {
        c->spec.sample_drafts = true;
        *i += 1;
        return 1;
    } else {
        return 0;
    }
#undef IS
    *i += 2;
    return 1;
}

int cli_open_model(const struct cli_common *c, int n_seq, int n_keep_states, struct backend **be,
                   struct model **m) {
    return cli_open_model_wrapped(c, n_seq, n_keep_states, NULL, be, m);
}

int cli_open_model_wrapped(const struct cli_common *c, int n_seq, int n_keep_states,
                           struct backend *(*wrap)(struct backend *inner), struct backend **be, struct model **m) {
    char err[512];
    *m = NULL;
    if (c->cuda) {
#ifdef COTI_CUDA
        *be = backend_cuda_init(0, err, sizeof err);
        if (!*be) { fprintf(stderr, "error: cannot start the CUDA backend: %s\n", err); return 1; }
#else
        fprintf(stderr, "error: this coti was built without CUDA (make CUDA=1)\n");
        return 1;
#endif
    } else {
        *be = backend_cpu_init(c->n_threads, c->cpu_level);
        if (!*be) { fprintf(stderr, "error: cannot start the CPU backend\n"); return 1; }
    }
    if (wrap) {
        struct backend *w = wrap(*be);
        if (!w) { fprintf(stderr, "error: out of memory\n"); backend_free(*be); *be = NULL; return 1; }
        *be = w;
    }
    struct model_params p = {n_seq, c->n_ctx, c->n_batch, COTI_MAX(n_keep_states, SPEC_MAX_DRAFT + 1)};
    int rc = model_load(m, c->model_path, *be, &p, err, sizeof err);
    if (rc) {
        fprintf(stderr, "error: %s\n", err);
        backend_free(*be);
        *be = NULL;
        return 1;
    }
    return 0;
}
