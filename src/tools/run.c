/* run.c — `coti run`: generate from a prompt, streaming tokens to stdout; prompt and decode
 * speed plus a hash of the final logits (to spot nondeterminism) go to stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "sample.h"
#include "spec.h"
#include "tokenizer.h"
#include "tools.h"

#define RUN_N_PREDICT_DEFAULT 128

static void help(FILE *out, const struct cli_common *d) {
    fprintf(out, "usage: coti run [-m MODEL] (-p PROMPT | -f FILE) [-n N] [options]\n"
                 "Generate text from a prompt: the text to stdout, speed and speculation counts to stderr.\n"
                 "  -p, --prompt TEXT    prompt (special tokens like <|im_start|> are parsed)\n"
                 "  -f, --file FILE      read the prompt from FILE ('-': standard input)\n"
                 "  -n, --n-predict N    tokens to generate (default %d)\n"
                 "  --ignore-eos         keep generating past end-of-generation tokens\n",
            RUN_N_PREDICT_DEFAULT);
}

struct run_opts {
    const char *prompt, *prompt_file;
    long n_predict;
    bool ignore_eos;
};

enum { OPT_IGNORE_EOS = CLI_TOOL_CODE };

static int on_option(void *state, int code, const char *name, const char *arg) {
    struct run_opts *o = state;
    switch (code) {
    case 'p': o->prompt = arg; return 0;
    case 'f': o->prompt_file = arg; return 0;
    case 'n': return cli_parse_int(name, arg, 0, 1 << 20, &o->n_predict);
    case OPT_IGNORE_EOS: o->ignore_eos = true; return 0;
    }
    return -1;
}

int tool_run_main(int argc, char **argv) {
    struct cli_common c;
    cli_common_defaults(&c);
    struct run_opts o = {.n_predict = RUN_N_PREDICT_DEFAULT};
    static const struct option opts[] = {
        {"prompt", required_argument, NULL, 'p'},
        {"file", required_argument, NULL, 'f'},
        {"n-predict", required_argument, NULL, 'n'},
        {"ignore-eos", no_argument, NULL, OPT_IGNORE_EOS},
        {0},
    };
    const struct cli_tool tool = {.name = "run", .help = help, .short_opts = "p:f:n:", .opts = opts,
                                  .on_option = on_option, .state = &o};
    int pr = cli_parse(&c, &tool, argc, argv);
    if (pr != CLI_PARSE_OK) return pr == CLI_PARSE_EXIT ? 0 : 1;
    const char *prompt = o.prompt, *prompt_file = o.prompt_file;
    const long n_predict = o.n_predict;
    const bool ignore_eos = o.ignore_eos;
    if (prompt && prompt_file) { fprintf(stderr, "error: give one of -p and -f\n"); return 1; }
    char *file_text = NULL;
    if (prompt_file) {
        file_text = coti_read_file(prompt_file, 0, NULL);
        if (!file_text) { fprintf(stderr, "error: cannot read %s\n", prompt_file); return 1; }
        prompt = file_text;
    }
    if (!prompt) { fprintf(stderr, "error: no prompt (-p or -f; `coti run --help` lists the options)\n"); return 1; }

    struct backend *be;
    struct model *m;
    if (cli_open_model(&c, 1, 0, &be, &m)) { free(file_text); return 1; }
    char err[512];
    struct tokenizer *tok = NULL;
    struct sampler *smp = NULL;
    int32_t *toks = NULL;
    size_t n_toks = 0;
    int rc = 1;
    if (tokenizer_init(&tok, m->gguf, err, sizeof err)) { fprintf(stderr, "error: %s\n", err); goto done; }
    if (cli_grammar_open(&c, tok, m->info.n_vocab)) goto done;
    if (tokenizer_encode(tok, prompt, strlen(prompt), true, true, &toks, &n_toks, err, sizeof err)) {
        fprintf(stderr, "error: cannot tokenize the prompt: %s\n", err);
        goto done;
    }
    if (n_toks == 0) { fprintf(stderr, "error: the prompt is empty after tokenization\n"); goto done; }
    if ((long)n_toks + n_predict > c.n_ctx) {
        fprintf(stderr, "error: prompt (%zu tokens) + n_predict (%ld) exceeds the context (%d)\n", n_toks, n_predict, c.n_ctx);
        goto done;
    }
    struct sampler_params sp = sampler_params_basic(c.temperature, c.top_k, c.top_p, c.min_p, c.seed);
    if (sampler_init(&smp, &sp, m->info.n_vocab, err, sizeof err)) { fprintf(stderr, "error: %s\n", err); goto done; }

    struct spec_engine *eng = NULL;
    if (spec_engine_init(&eng, m, c.draft_path, err, sizeof err)) { fprintf(stderr, "error: %s\n", err); goto done; }
    fputs(prompt, stdout);
    fflush(stdout);
    int32_t first, buf[SPEC_MAX_DRAFT + 1];
    int64_t t0 = coti_time_us();
    if (spec_seq_begin(eng, 0, toks, (int)n_toks, &sp, &c.spec, &first, err, sizeof err)) {
        fprintf(stderr, "\nerror: %s\n", err);
        spec_engine_free(eng);
        goto done;
    }
    int64_t t1 = coti_time_us();
    long n_gen = 0;
    int n_buf = 1;
    buf[0] = first;
    const char *piece;
    size_t piece_len;
    bool stop = false;
    while (!stop) {
        for (int i = 0; i < n_buf && !stop; i++) {
            /* a grammar accepts nothing after the end */
            if ((!ignore_eos || c.spec.grammar) && tokenizer_is_eog(tok, buf[i])) { stop = true; break; }
            if (tokenizer_token_to_piece(tok, buf[i], false, &piece, &piece_len) == 0) fwrite(piece, 1, piece_len, stdout);
            if (++n_gen >= n_predict) stop = true;
        }
        fflush(stdout);
        if (stop) break;
        if (spec_seq_step(eng, 0, (int)(n_predict - n_gen), buf, &n_buf, NULL, err, sizeof err)) {
            fprintf(stderr, "\nerror: %s\n", err);
            spec_engine_free(eng);
            goto done;
        }
    }
    int64_t t2 = coti_time_us();
    fputc('\n', stdout);
    const struct spec_stats *st = spec_seq_stats(eng, 0);
    double pp_s = (t1 - t0) / 1e6, tg_s = (t2 - t1) / 1e6;
    fprintf(stderr, "# prompt %zu tokens %.1f ms %.1f tok/s | decode %ld tokens %.1f ms %.1f tok/s | spec %s n_max %d: drafted %ld accepted %ld (%.3f) | threads %d | cpu %s\n",
            n_toks, pp_s * 1e3, n_toks / (pp_s > 0 ? pp_s : 1e-9), n_gen, tg_s * 1e3,
            n_gen > 1 ? (n_gen - 1) / (tg_s > 0 ? tg_s : 1e-9) : 0.0, drafter_kind_name(c.spec.drafter), c.spec.n_max,
            st->n_drafted, st->n_accepted, st->n_drafted ? (double)st->n_accepted / st->n_drafted : 0.0, c.n_threads,
            cli_cpu_level_name(c.cpu_level));
    spec_engine_free(eng);
    rc = 0;
done:
    free(toks);
    sampler_free(smp);
    tokenizer_free(tok);
    model_free(m);
    backend_free(be);
    free(file_text);
    cli_common_free(&c);
    return rc;
}
