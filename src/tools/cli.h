/* cli.h — the command line shared by the subcommands: one getopt_long_only parser for the
 * common options (model, threads, context, sampling, speculation) and a tool's own, the
 * --help text generated from the defaults the parser starts from, the default model's
 * location, the model load with its summary line, and a progress line for terminals. */
#ifndef COTI_CLI_H
#define COTI_CLI_H

#include <getopt.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "backend.h"
#include "model.h"
#include "spec.h"
#include "tokenizer.h"

#define CLI_DEFAULT_MODEL "coti-tiny-qwen35-mtp-q8_0.gguf"
#define CLI_MAX_THREADS 256

struct cli_common {
    const char *model_path;      /* NULL until cli_parse: -m, else the default model found */
    int n_threads;
    int n_ctx;
    int n_batch;
    enum ggml_type cache_type_k, cache_type_v; /* -ctk / -ctv */
    enum quant_cpu_level cpu_level;
    bool cuda;                   /* --device cuda */
    int tp_n;                    /* --tensor-parallel-size / -tp: ranks the model is split into (1: whole) */
    /* sampling */
    float temperature;
    int top_k;
    float top_p;
    float min_p;
    uint64_t seed;
    bool seed_given;             /* --seed was on the command line */
    bool seed_random;            /* without --seed each request draws one (serve; help says so) */
    /* speculation */
    struct spec_params spec;
    const char *draft_path;      /* --spec-draft / -md: a drafter model's file */
    /* constrained decoding: --grammar, --grammar-file or --json-schema's GBNF (malloc'ed; NULL:
     * none), compiled by cli_grammar_open into spec.grammar / spec.grammar_vocab */
    char *grammar_text;
    struct grammar *grammar;
    struct grammar_vocab *grammar_vocab;
    char model_buf[PATH_MAX];    /* the default model's path, once found */
};

/* A subcommand's own options, parsed together with the common ones. */
struct cli_tool {
    const char *name;            /* "run": messages say `coti run` */
    /* the tool's part of --help (usage line and its own options), written to out */
    void (*help)(FILE *out, const struct cli_common *defaults);
    const char *short_opts;      /* getopt's letters of the tool, e.g. "p:f:n:" */
    const struct option *opts;   /* getopt_long's table ending in {0}; `val` is a letter or a code
                                    >= CLI_TOOL_CODE; a name here hides a common option's */
    /* One of the tool's options (its code, the spelling used, the value or NULL): 0, or -1
     * after printing a message. */
    int (*on_option)(void *state, int code, const char *name, const char *arg);
    void *state;
    bool no_common;              /* no model and sampling options (gguf, mkmodel) */
    int max_positional;          /* arguments that are not options (gguf: its file) */
    const char **positional;     /* [max_positional], filled in order */
};
#define CLI_TOOL_CODE 2000

enum cli_parse_result { CLI_PARSE_OK = 0, CLI_PARSE_EXIT = 1, CLI_PARSE_ERROR = -1 };

void cli_common_defaults(struct cli_common *c);
/* Parse argv (argv[0] is the subcommand). CLI_PARSE_EXIT: --help was printed to stdout (exit
 * 0); CLI_PARSE_ERROR: a message went to stderr (exit non-zero). Accepts --opt value,
 * --opt=value and llama.cpp's single-dash long spellings (-np, -md, -ngl). */
int cli_parse(struct cli_common *c, const struct cli_tool *t, int argc, char **argv);
/* The common options' help, their defaults taken from d. */
void cli_common_help(FILE *out, const struct cli_common *d);

/* Parse helpers: 0 on success, -1 with a message naming the option and the allowed range. */
int cli_parse_int(const char *opt, const char *s, long lo, long hi, long *out);
int cli_parse_float(const char *opt, const char *s, double lo, double hi, double *out);
int cli_parse_u64(const char *opt, const char *s, uint64_t *out);

/* The default model's path into buf (next to the binary, PREFIX/share/coti/models for an
 * installed one, ./models), or NULL when none of them has it. */
const char *cli_find_default_model(char *buf, size_t size);
const char *cli_cpu_level_name(enum quant_cpu_level level);

/* Backend + model from the common options; prints the error and returns non-zero on failure.
 * A progress line while loading when stderr is a terminal, then always one summary line. */
int cli_open_model(const struct cli_common *c, int n_seq, int n_keep_states, struct backend **be,
                   struct model **m);
/* The same, with the backend passed through wrap (which takes it over) before the model loads. */
int cli_open_model_wrapped(const struct cli_common *c, int n_seq, int n_keep_states,
                           struct backend *(*wrap)(struct backend *inner), struct backend **be, struct model **m);

/* With a grammar given: compile it and the vocabulary of tok for n_vocab logits into c->spec
 * (0; -1 after printing the error). Without one: 0, nothing done. */
int cli_grammar_open(struct cli_common *c, const struct tokenizer *tok, int32_t n_vocab);
/* What the options and cli_grammar_open allocated. */
void cli_common_free(struct cli_common *c);

/* A progress line on stderr, rewritten in place; only when stderr is a terminal, so logs and
 * pipes never see it. cli_progress_end clears it. */
void cli_progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void cli_progress_end(void);

/* Rows [0, n_rows) in nth (<= CLI_MAX_THREADS) contiguous ranges, fn(ctx, r0, r1) for each on a
 * thread of its own (the caller takes the first; a range whose thread cannot start runs on the
 * caller too). Returns the first nonzero result in range order. For the tools that write a
 * tensor's rows (mkmodel, quantize). */
int cli_parallel_rows(int64_t n_rows, int nth, int (*fn)(void *ctx, int64_t r0, int64_t r1), void *ctx);

#endif
