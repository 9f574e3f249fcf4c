/* cli.c — see cli.h. */
#include "cli.h"
#ifdef COTI_CUDA
#include "cuda/backend_cuda.h"
#endif

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/ranks.h"
#include "json_schema.h"

/* codes of the common options that have no letter */
enum {
    OPT_CPU = 1000, OPT_DEVICE, OPT_NGL, OPT_TEMP, OPT_TOP_K, OPT_TOP_P, OPT_MIN_P, OPT_SEED, OPT_SPEC,
    OPT_SPEC_DRAFT, OPT_SPEC_N_MAX, OPT_SPEC_N_MIN, OPT_SPEC_P_MIN, OPT_SPEC_SAMPLE_DRAFTS, OPT_CACHE_TYPE_K,
    OPT_CACHE_TYPE_V, OPT_GRAMMAR, OPT_GRAMMAR_FILE, OPT_JSON_SCHEMA, OPT_TP,
};

/* Every spelling of the common options, llama.cpp's included (-ngl, -md, --spec-type). */
static const struct option common_opts[] = {
    {"model", required_argument, NULL, 'm'},
    {"threads", required_argument, NULL, 't'},
    {"ctx-size", required_argument, NULL, 'c'},
    {"batch-size", required_argument, NULL, 'b'},
    {"cache-type-k", required_argument, NULL, OPT_CACHE_TYPE_K},
    {"ctk", required_argument, NULL, OPT_CACHE_TYPE_K},
    {"cache-type-v", required_argument, NULL, OPT_CACHE_TYPE_V},
    {"ctv", required_argument, NULL, OPT_CACHE_TYPE_V},
    {"help", no_argument, NULL, 'h'},
    {"cpu", required_argument, NULL, OPT_CPU},
    {"device", required_argument, NULL, OPT_DEVICE},
    {"n-gpu-layers", required_argument, NULL, OPT_NGL},
    {"ngl", required_argument, NULL, OPT_NGL},
    {"tensor-parallel-size", required_argument, NULL, OPT_TP},
    {"tp", required_argument, NULL, OPT_TP},
    {"temp", required_argument, NULL, OPT_TEMP},
    {"top-k", required_argument, NULL, OPT_TOP_K},
    {"top-p", required_argument, NULL, OPT_TOP_P},
    {"min-p", required_argument, NULL, OPT_MIN_P},
    {"seed", required_argument, NULL, OPT_SEED},
    {"spec", required_argument, NULL, OPT_SPEC},
    {"spec-type", required_argument, NULL, OPT_SPEC},
    {"spec-draft", required_argument, NULL, OPT_SPEC_DRAFT},
    {"model-draft", required_argument, NULL, OPT_SPEC_DRAFT},
    {"md", required_argument, NULL, OPT_SPEC_DRAFT},
    {"spec-n-max", required_argument, NULL, OPT_SPEC_N_MAX},
    {"spec-draft-n-max", required_argument, NULL, OPT_SPEC_N_MAX},
    {"spec-n-min", required_argument, NULL, OPT_SPEC_N_MIN},
    {"spec-draft-n-min", required_argument, NULL, OPT_SPEC_N_MIN},
    {"spec-p-min", required_argument, NULL, OPT_SPEC_P_MIN},
    {"spec-draft-p-min", required_argument, NULL, OPT_SPEC_P_MIN},
    {"spec-sample-drafts", no_argument, NULL, OPT_SPEC_SAMPLE_DRAFTS},
    {"grammar", required_argument, NULL, OPT_GRAMMAR},
    {"grammar-file", required_argument, NULL, OPT_GRAMMAR_FILE},
    {"json-schema", required_argument, NULL, OPT_JSON_SCHEMA},
    {"j", required_argument, NULL, OPT_JSON_SCHEMA},
};
#define COMMON_SHORT "m:t:c:b:h"

void cli_common_defaults(struct cli_common *c) {
    memset(c, 0, sizeof *c);
    c->model_path = NULL;
    c->n_threads = COTI_MIN(coti_physical_cores("/sys/devices/system/cpu"), CLI_MAX_THREADS);
    c->n_ctx = 4096;
    c->n_batch = 512;
    c->cache_type_k = c->cache_type_v = GGML_TYPE_F16;
    c->cpu_level = quant_cpu_level_detect();
    c->tp_n = 1;
    c->temperature = 0.0f;
    c->top_k = 40;
    c->top_p = 0.95f;
    c->min_p = 0.05f;
    c->seed = 0;
    c->spec = spec_params_default();
}

const char *cli_cpu_level_name(enum quant_cpu_level level) {
    return level == QUANT_CPU_AVX512 ? "avx512" : level == QUANT_CPU_AVX2 ? "avx2" : "ref";
}

/* The KV cache types, "f16|bf16|q8_0|q4_0", into buf. */
static const char *cache_type_choices(char *buf, size_t size) {
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; i < KV_N_TYPES && n < size; i++) {
        const int k = snprintf(buf + n, size - n, "%s%s", i ? "|" : "", ggml_type_traits_get(kv_types[i])->name);
        if (k < 0) break;
        n += (size_t)k;
    }
    return buf;
}

static int parse_cache_type(const char *opt, const char *v, enum ggml_type *out) {
    const enum ggml_type t = v ? ggml_type_from_name(v) : GGML_TYPE_COUNT;
    if (!kv_type_ok(t, 32)) { /* one of kv.h's types (each tiles 32) */
        char choices[64];
        fprintf(stderr, "error: %s expects %s, got '%s'\n", opt, cache_type_choices(choices, sizeof choices), v ? v : "");
        return -1;
    }
    *out = t;
    return 0;
}

void cli_common_help(FILE *out, const struct cli_common *d) {
    char choices[128], seed[32], kv_choices[64];
    if (d->seed_random) snprintf(seed, sizeof seed, "random per request");
    else snprintf(seed, sizeof seed, "%llu", (unsigned long long)d->seed);
    fprintf(out,
            "  -m, --model FILE     GGUF model (default %s from models/ next to the binary,\n"
            "                       PREFIX/share/coti/models or ./models)\n"
            "  -t, --threads N      CPU threads (default %d: the physical cores this process may use)\n"
            "  -c, --ctx-size N     context positions per sequence (default %d)\n"
            "  -b, --batch-size N   rows per forward step (default %d)\n"
            "  -ctk, --cache-type-k T  KV cache type of K: %s (default %s)\n"
            "  -ctv, --cache-type-v T  KV cache type of V: the same choices (default %s)\n"
            "  --cpu ref|avx2|avx512  cap the CPU kernels (default %s: the best found)\n"
            "  --device cpu|cuda    compute backend (default %s; cuda needs a `make CUDA=1` build)\n"
            "  -ngl, --n-gpu-layers N  llama.cpp's spelling: 0 = --device cpu, more = --device cuda (all layers)\n"
            "  -tp, --tensor-parallel-size N  split the model's heads and widths into N ranks (default 1;\n"
            "                       CPU ranks share the threads; CUDA ranks are not built yet)\n"
            "  --temp F             temperature, 0 = greedy (default %g)\n"
            "  --top-k N --top-p F --min-p F   sampling chain (defaults %d, %g, %g)\n"
            "  --seed N             sampling seed (default %s)\n"
            "  --spec TYPE          speculative decoding: %s (default %s; also --spec-type)\n"
            "  --spec-draft FILE    the drafter model of --spec assistant (also -md, --model-draft)\n"
            "  --spec-n-max N       draft tokens per cycle (default %d, at most %d; also --spec-draft-n-max)\n"
            "  --spec-n-min N       minimum drafts (default %d; also --spec-draft-n-min)\n"
            "  --spec-p-min F       stop drafting under this probability (default %g; also --spec-draft-p-min)\n"
            "  --spec-sample-drafts sample drafts from the drafter (rejection sampling) at temp > 0 (default %s)\n"
            "  --grammar GBNF       constrain the output to a GBNF grammar (llama.cpp's syntax)\n"
            "  --grammar-file FILE  the same, read from FILE\n"
            "  -j, --json-schema SCHEMA  constrain the output to JSON valid under a JSON schema\n"
            "  -h, --help           this text\n"
            "A value follows its option as the next argument or after '=' (--temp=0.7).\n",
            CLI_DEFAULT_MODEL, d->n_threads, d->n_ctx, d->n_batch, cache_type_choices(kv_choices, sizeof kv_choices),
            ggml_type_traits_get(d->cache_type_k)->name, ggml_type_traits_get(d->cache_type_v)->name,
            cli_cpu_level_name(d->cpu_level),
            d->cuda ? "cuda" : "cpu", d->temperature, d->top_k, d->top_p, d->min_p, seed,
            drafter_kind_choices(choices, sizeof choices, true, ""), drafter_kind_name(d->spec.drafter),
            d->spec.n_max, SPEC_MAX_DRAFT, d->spec.n_min, d->spec.p_min, d->spec.sample_drafts ? "on" : "off");
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

int cli_parse_u64(const char *opt, const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = s ? strtoull(s, &end, 10) : 0;
    if (!s || errno || end == s || *end || s[0] == '-') {
        fprintf(stderr, "error: %s expects a non-negative integer, got '%s'\n", opt, s ? s : "(nothing)");
        return -1;
    }
    *out = v;
    return 0;
}

/* The whole of file path, NUL-terminated (malloc'ed), or NULL. */
static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (size_t r; buf && (r = fread(buf + n, 1, cap - n - 1, f)) > 0;) {
        n += r;
        if (n + 1 == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) { free(buf); buf = NULL; }
            else buf = nb;
        }
    }
    if (buf && ferror(f)) { free(buf); buf = NULL; }
    fclose(f);
    if (buf) buf[n] = 0;
    return buf;
}

/* --grammar, --grammar-file, --json-schema: the GBNF text into c->grammar_text (the last one
 * given wins); -1 after a message. */
static int grammar_option(struct cli_common *c, int code, const char *name, const char *v) {
    char *text = NULL, err[256];
    if (code == OPT_GRAMMAR) {
        text = strdup(v);
    } else if (code == OPT_GRAMMAR_FILE) {
        if (!(text = read_file(v))) { fprintf(stderr, "error: %s: cannot read %s\n", name, v); return -1; }
    } else {
        cJSON *schema = cJSON_Parse(v);
        if (!schema) { fprintf(stderr, "error: %s: not valid JSON\n", name); return -1; }
        int rc = json_schema_to_grammar(schema, &text, err, sizeof err);
        cJSON_Delete(schema);
        if (rc) { fprintf(stderr, "error: %s: %s\n", name, err); return -1; }
    }
    if (!text) { fprintf(stderr, "error: out of memory\n"); return -1; }
    free(c->grammar_text);
    c->grammar_text = text;
    return 0;
}

int cli_grammar_open(struct cli_common *c, const struct tokenizer *tok, int32_t n_vocab) {
    if (!c->grammar_text) return 0;
    char err[512];
    if (grammar_parse(&c->grammar, c->grammar_text, strlen(c->grammar_text), err, sizeof err) ||
        grammar_vocab_init(&c->grammar_vocab, tok, n_vocab, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        return -1;
    }
    c->spec.grammar = c->grammar;
    c->spec.grammar_vocab = c->grammar_vocab;
    return 0;
}

void cli_common_free(struct cli_common *c) {
    grammar_vocab_free(c->grammar_vocab);
    grammar_free(c->grammar);
    free(c->grammar_text);
    c->grammar_vocab = NULL;
    c->grammar = NULL;
    c->grammar_text = NULL;
    c->spec.grammar = NULL;
    c->spec.grammar_vocab = NULL;
}

/* One common option; -1 after a message. */
static int common_option(struct cli_common *c, int code, const char *name, const char *v) {
    long l;
    double d;
    switch (code) {
    case 'm': c->model_path = v; return 0;
    case 't': if (cli_parse_int(name, v, 1, CLI_MAX_THREADS, &l)) return -1; c->n_threads = (int)l; return 0;
    case 'c': if (cli_parse_int(name, v, 16, 1 << 20, &l)) return -1; c->n_ctx = (int)l; return 0;
    case 'b': if (cli_parse_int(name, v, 1, 8192, &l)) return -1; c->n_batch = (int)l; return 0;
    case OPT_CACHE_TYPE_K: return parse_cache_type(name, v, &c->cache_type_k);
    case OPT_CACHE_TYPE_V: return parse_cache_type(name, v, &c->cache_type_v);
    case OPT_CPU:
        if (!strcmp(v, "ref")) c->cpu_level = QUANT_CPU_REF;
        else if (!strcmp(v, "avx2")) c->cpu_level = COTI_MIN(QUANT_CPU_AVX2, quant_cpu_level_detect());
        else if (!strcmp(v, "avx512")) c->cpu_level = COTI_MIN(QUANT_CPU_AVX512, quant_cpu_level_detect());
        else { fprintf(stderr, "error: --cpu expects ref, avx2 or avx512\n"); return -1; }
        return 0;
    case OPT_DEVICE:
        if (!strcmp(v, "cpu")) c->cuda = false;
        else if (!strcmp(v, "cuda")) c->cuda = true;
        else { fprintf(stderr, "error: --device expects cpu or cuda\n"); return -1; }
        return 0;
    case OPT_NGL: /* coti runs the whole model on one device: any layer offloaded means all */
        if (cli_parse_int(name, v, 0, 1 << 20, &l)) return -1;
        c->cuda = l > 0;
        return 0;
    case OPT_TP: if (cli_parse_int(name, v, 1, TP_MAX_RANKS, &l)) return -1; c->tp_n = (int)l; return 0;
    case OPT_TEMP: if (cli_parse_float(name, v, 0, 100, &d)) return -1; c->temperature = (float)d; return 0;
    case OPT_TOP_K: if (cli_parse_int(name, v, 0, 1 << 24, &l)) return -1; c->top_k = (int)l; return 0;
    case OPT_TOP_P: if (cli_parse_float(name, v, 0, 1, &d)) return -1; c->top_p = (float)d; return 0;
    case OPT_MIN_P: if (cli_parse_float(name, v, 0, 1, &d)) return -1; c->min_p = (float)d; return 0;
    case OPT_SEED:
        if (cli_parse_u64(name, v, &c->seed)) return -1;
        c->seed_given = true;
        return 0;
    case OPT_SPEC:
        if (drafter_kind_parse(v, &c->spec.drafter)) {
            char choices[128];
            fprintf(stderr, "error: %s expects %s\n", name, drafter_kind_choices(choices, sizeof choices, true, ""));
            return -1;
        }
        /* llama.cpp's -md FILE --spec-type draft-mtp: the MTP drafter is the file's */
        if (c->draft_path && c->spec.drafter == &drafter_kind_mtp) c->spec.drafter = &drafter_kind_assistant;
        return 0;
    case OPT_SPEC_DRAFT:
        c->draft_path = v;
        if (c->spec.drafter == &drafter_kind_mtp) c->spec.drafter = &drafter_kind_assistant;
        return 0;
    case OPT_SPEC_N_MAX: if (cli_parse_int(name, v, 1, SPEC_MAX_DRAFT, &l)) return -1; c->spec.n_max = (int)l; return 0;
    case OPT_SPEC_N_MIN: if (cli_parse_int(name, v, 0, SPEC_MAX_DRAFT, &l)) return -1; c->spec.n_min = (int)l; return 0;
    case OPT_SPEC_P_MIN: if (cli_parse_float(name, v, 0, 1, &d)) return -1; c->spec.p_min = (float)d; return 0;
    case OPT_SPEC_SAMPLE_DRAFTS: c->spec.sample_drafts = true; return 0;
    case OPT_GRAMMAR: case OPT_GRAMMAR_FILE: case OPT_JSON_SCHEMA: return grammar_option(c, code, name, v);
    }
    return -1;
}

static bool tool_has(const struct cli_tool *t, const char *name) {
    for (const struct option *o = t->opts; o && o->name; o++)
        if (!strcmp(o->name, name)) return true;
    return false;
}

/* The option's name for messages: its long name when it has one, else its letter. */
static void option_name(char *buf, size_t size, const struct option *all, int long_idx, int code) {
    if (long_idx >= 0) snprintf(buf, size, "--%s", all[long_idx].name);
    else snprintf(buf, size, "-%c", code);
}

int cli_parse(struct cli_common *c, const struct cli_tool *t, int argc, char **argv) {
    struct cli_common defaults;              /* what --help shows */
    if (c) defaults = *c;
    else memset(&defaults, 0, sizeof defaults);
    const size_t n_common = t->no_common ? 0 : COTI_ARRAY_LEN(common_opts);
    size_t n_tool = 0;
    while (t->opts && t->opts[n_tool].name) n_tool++;
    struct option *all = calloc(n_tool + n_common + 2, sizeof *all);
    char shorts[128];
    if (!all) { fprintf(stderr, "error: out of memory\n"); return CLI_PARSE_ERROR; }
    size_t n = 0;
    for (size_t i = 0; i < n_tool; i++) all[n++] = t->opts[i];
    for (size_t i = 0; i < n_common; i++)
        if (!tool_has(t, common_opts[i].name)) all[n++] = common_opts[i];
    if (t->no_common && !tool_has(t, "help")) all[n++] = (struct option){"help", no_argument, NULL, 'h'};
    /* ':' first: a missing value is reported as ':' rather than '?' */
    snprintf(shorts, sizeof shorts, ":%s%s", t->no_common ? "h" : COMMON_SHORT, t->short_opts ? t->short_opts : "");

    int rc = CLI_PARSE_OK, n_pos = 0;
    opterr = 0;
    optind = 0;   /* glibc: a full restart of the scan */
    while (rc == CLI_PARSE_OK) {
        int long_idx = -1;
        int code = getopt_long_only(argc, argv, shorts, all, &long_idx);
        if (code == -1) break;
        char name[96];
        if (code == '?' || code == ':') {
            const char *what = argv[COTI_MIN(optind, argc) - 1];
            if (code == ':') fprintf(stderr, "error: %s needs a value\n", what);
            else if (optopt && optopt < 128 && what[0] == '-' && what[1] != '-' && strlen(what) == 2)
                fprintf(stderr, "error: unknown option '-%c'\n", optopt);
            else if (strchr(what, '=')) fprintf(stderr, "error: '%s': an unknown option, or one that takes no value\n", what);
            else fprintf(stderr, "error: unknown or ambiguous option '%s'\n", what);
            fprintf(stderr, "`coti %s --help` lists the options\n", t->name);
            rc = CLI_PARSE_ERROR;
            break;
        }
        option_name(name, sizeof name, all, long_idx, code);
        if (code == 'h') {
            t->help(stdout, &defaults);
            if (!t->no_common) cli_common_help(stdout, &defaults);
            rc = CLI_PARSE_EXIT;
        } else if (!t->no_common && ((code < 128 && strchr(COMMON_SHORT, code)) || (code >= 1000 && code < CLI_TOOL_CODE))) {
            if (common_option(c, code, name, optarg)) rc = CLI_PARSE_ERROR;
        } else if (t->on_option(t->state, code, name, optarg)) {
            rc = CLI_PARSE_ERROR;
        }
    }
    for (int i = optind; rc == CLI_PARSE_OK && i < argc; i++) {
        if (n_pos == t->max_positional) {
            fprintf(stderr, "error: unexpected argument '%s' (`coti %s --help` lists the options)\n", argv[i], t->name);
            rc = CLI_PARSE_ERROR;
        } else {
            t->positional[n_pos++] = argv[i];
        }
    }
    free(all);
    if (rc == CLI_PARSE_OK && !t->no_common && !c->model_path)
        c->model_path = cli_find_default_model(c->model_buf, sizeof c->model_buf);
    if (rc == CLI_PARSE_OK && !t->no_common && !c->model_path) {
        fprintf(stderr, "error: no -m FILE, and the default model %s is neither in models/ next to the binary, nor in "
                        "PREFIX/share/coti/models, nor in ./models\n", CLI_DEFAULT_MODEL);
        rc = CLI_PARSE_ERROR;
    }
    return rc;
}

const char *cli_find_default_model(char *buf, size_t size) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) *slash = 0;
    }
    /* the repository (binary at its root), an install (PREFIX/bin/coti), a build folder of the
     * repository (build/coti), then the working directory */
    static const char *const beside[] = {"/models/", "/../share/coti/models/", "/../models/"};
    char path[PATH_MAX + 64];
    for (size_t i = 0; n > 0 && i < COTI_ARRAY_LEN(beside); i++) {
        snprintf(path, sizeof path, "%s%s%s", exe, beside[i], CLI_DEFAULT_MODEL);
        if (access(path, R_OK) == 0 && realpath(path, buf) && strlen(buf) < size) return buf;
    }
    snprintf(path, sizeof path, "models/%s", CLI_DEFAULT_MODEL);
    if (access(path, R_OK) == 0 && strlen(path) < size) return strcpy(buf, path);
    return NULL;
}

/* ------------------------------------------------------------------------------------------
 * Progress and the model load */

static bool progress_shown;

void cli_progress(const char *fmt, ...) {
    if (!isatty(STDERR_FILENO)) return;
    va_list ap;
    va_start(ap, fmt);
    fputs("\r\033[K", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fflush(stderr);
    progress_shown = true;
}

void cli_progress_end(void) {
    if (!progress_shown) return;
    fputs("\r\033[K", stderr);
    fflush(stderr);
    progress_shown = false;
}

struct rows_job {
    int (*fn)(void *ctx, int64_t r0, int64_t r1);
    void *ctx;
    int64_t r0, r1;
    int rc;
};

static void *rows_job_run(void *arg) {
    struct rows_job *j = arg;
    j->rc = j->fn(j->ctx, j->r0, j->r1);
    return NULL;
}

int cli_parallel_rows(int64_t n_rows, int nth, int (*fn)(void *ctx, int64_t r0, int64_t r1), void *ctx) {
    nth = (int)COTI_MAX(1, COTI_MIN((int64_t)COTI_MIN(nth, CLI_MAX_THREADS), n_rows));
    struct rows_job jobs[CLI_MAX_THREADS];
    pthread_t tids[CLI_MAX_THREADS];
    bool started[CLI_MAX_THREADS] = {false};
    for (int i = 0; i < nth; i++) {
        jobs[i] = (struct rows_job){fn, ctx, n_rows * i / nth, n_rows * (i + 1) / nth, 0};
        if (i > 0) started[i] = pthread_create(&tids[i], NULL, rows_job_run, &jobs[i]) == 0;
        if (i > 0 && !started[i]) rows_job_run(&jobs[i]);
    }
    rows_job_run(&jobs[0]);
    int rc = jobs[0].rc;
    for (int i = 1; i < nth; i++) {
        if (started[i]) pthread_join(tids[i], NULL);
        if (!rc) rc = jobs[i].rc;
    }
    return rc;
}

struct load_note {
    const char *path;
    int percent;                 /* last shown */
};

static void on_load_progress(void *user, uint64_t done, uint64_t total) {
    struct load_note *ln = user;
    const int pct = total ? (int)(100.0 * (double)done / (double)total) : 100;
    if (pct == ln->percent) return;
    ln->percent = pct;
    cli_progress("loading %s: %d%% of %.1f MiB", ln->path, pct, total / 1048576.0);
}

int cli_open_model(const struct cli_common *c, int n_seq, int n_keep_states, struct backend **be,
                   struct model **m) {
    return cli_open_model_wrapped(c, n_seq, n_keep_states, NULL, be, m);
}

/* -tp N on the CPU: N backends sharing the threads, the model split into ranks behind rank 0
 * (engine/ranks.h); *be is rank 0's, the others belong to the model. */
static int open_ranks(const struct cli_common *c, const struct model_params *p, struct backend **be, struct model **m,
                      char *err, size_t err_size) {
    struct backend *bes[TP_MAX_RANKS] = {NULL};
    int rc = 0;
    if (c->cuda) rc = coti_fail(err, err_size, COTI_E_UNSUPPORTED, "tensor-parallel ranks on CUDA (NCCL) are not built yet");
    for (int r = 0; r < c->tp_n && !rc; r++)
        if (!(bes[r] = backend_cpu_init(COTI_MAX(1, c->n_threads / c->tp_n), c->cpu_level)))
            rc = coti_fail(err, err_size, COTI_E_NOMEM, "cannot start the CPU backend of rank %d", r);
    if (!rc) rc = engine_ranks_load(m, c->model_path, bes, c->tp_n, p, err, err_size);
    if (rc) for (int r = 0; r < c->tp_n; r++) backend_free(bes[r]);
    *be = rc ? NULL : bes[0];
    return rc;
}

int cli_open_model_wrapped(const struct cli_common *c, int n_seq, int n_keep_states,
                           struct backend *(*wrap)(struct backend *inner), struct backend **be, struct model **m) {
    char err[512];
    *m = NULL;
    struct model_params p = {n_seq, c->n_ctx, c->n_batch, COTI_MAX(n_keep_states, SPEC_MAX_DRAFT + 1), NULL,
                             c->cache_type_k, c->cache_type_v, 0, 0};
    if (c->tp_n > 1) {
        const int64_t t0 = coti_time_us();
        if (wrap) { fprintf(stderr, "error: this tool's measurements do not take -tp yet\n"); return 1; }
        if (open_ranks(c, &p, be, m, err, sizeof err)) { fprintf(stderr, "error: %s\n", err); return 1; }
        coti_log(COTI_LOG_INFO, "model", "%s: arch %s split into %d ranks, %.2f MiB KV+state per slot per rank x %d, cpu %s, "
                 "%d threads per rank, loaded in %.2f s", c->model_path, (*m)->info.arch, c->tp_n,
                 (*m)->info.state_bytes_per_seq / 1048576.0, n_seq, cli_cpu_level_name(c->cpu_level),
                 COTI_MAX(1, c->n_threads / c->tp_n), (coti_time_us() - t0) / 1e6);
        return 0;
    }
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
    struct load_note note = {c->model_path, -1};
    struct load_progress progress = {on_load_progress, &note, 0, 0};
    p.progress = &progress;
    const int64_t t0 = coti_time_us();
    int rc = model_load(m, c->model_path, *be, &p, err, sizeof err);
    cli_progress_end();
    if (rc) {
        fprintf(stderr, "error: %s\n", err);
        backend_free(*be);
        *be = NULL;
        return 1;
    }
    const struct model_info *in = &(*m)->info;
    const struct ggml_type_traits *tt = ggml_type_traits_get(in->weight_type);
    char backend_desc[32];
    if (c->cuda) snprintf(backend_desc, sizeof backend_desc, "cuda");
    else snprintf(backend_desc, sizeof backend_desc, "cpu %s", cli_cpu_level_name(c->cpu_level));
    coti_log(COTI_LOG_INFO, "model",
             "%s: arch %s, %.2fM params, weights %s, %.1f MiB, %.2f MiB KV+state per slot x %d "
             "(KV K %s %.2f MiB = %.0f B/token, V %s %.2f MiB = %.0f B/token), %s, %d threads, loaded in %.2f s",
             c->model_path, in->arch, in->n_params / 1e6, tt ? tt->name : "?", in->n_bytes / 1048576.0,
             in->state_bytes_per_seq / 1048576.0, n_seq, ggml_type_traits_get(in->cache_type_k)->name,
             in->k_bytes_per_seq / 1048576.0, (double)in->k_bytes_per_seq / c->n_ctx,
             ggml_type_traits_get(in->cache_type_v)->name, in->v_bytes_per_seq / 1048576.0,
             (double)in->v_bytes_per_seq / c->n_ctx, backend_desc, c->n_threads, (coti_time_us() - t0) / 1e6);
    return 0;
}
