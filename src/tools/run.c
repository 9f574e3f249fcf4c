/* run.c — `coti run`: generate from a prompt, streaming tokens to stdout; prompt and decode
 * speed plus a hash of the final logits (to spot nondeterminism) go to stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "sample.h"
#include "tokenizer.h"
#include "tools.h"

static void usage(void) {
    fprintf(stderr, "usage: coti run [-m MODEL] -p PROMPT [-n N] [options]\n"
                    "  -p, --prompt TEXT    prompt (special tokens like <|im_start|> are parsed)\n"
                    "  -f, --file FILE      read the prompt from FILE\n"
                    "  -n, --n-predict N    tokens to generate (default 128)\n"
                    "  --ignore-eos         keep generating past end-of-generation tokens\n%s",
            cli_common_help());
}

/* FNV-1a over the bytes of the last logits row: equal runs print equal hashes. */
static uint64_t hash_floats(const float *x, size_t n) {
    uint64_t h = 1469598103934665603ull;
    const unsigned char *p = (const unsigned char *)x;
    for (size_t i = 0; i < n * sizeof(float); i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

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
    fclose(f);
    if (buf) buf[n] = 0;
    return buf;
}

int tool_run_main(int argc, char **argv) {
    struct cli_common c;
    cli_common_defaults(&c);
    const char *prompt = NULL, *prompt_file = NULL;
    long n_predict = 128;
    bool ignore_eos = false;
    for (int i = 1; i < argc;) {
        int r = cli_parse_common(&c, argc, argv, &i);
        if (r < 0) return 1;
        if (r > 0) continue;
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) { if (!v) { usage(); return 1; } prompt = v; i += 2; }
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) { if (!v) { usage(); return 1; } prompt_file = v; i += 2; }
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) { if (cli_parse_int(a, v, 0, 1 << 20, &n_predict)) return 1; i += 2; }
        else if (!strcmp(a, "--ignore-eos")) { ignore_eos = true; i++; }
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(); return 0; }
        else { fprintf(stderr, "error: unknown option '%s'\n", a); usage(); return 1; }
    }
    char *file_text = NULL;
    if (prompt_file) {
        file_text = read_file(prompt_file);
        if (!file_text) { fprintf(stderr, "error: cannot read %s\n", prompt_file); return 1; }
        prompt = file_text;
    }
    if (!prompt) { fprintf(stderr, "error: no prompt (-p or -f)\n"); usage(); return 1; }

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
    if (tokenizer_encode(tok, prompt, strlen(prompt), true, true, &toks, &n_toks, err, sizeof err)) {
        fprintf(stderr, "error: cannot tokenize the prompt: %s\n", err);
        goto done;
    }
    if (n_toks == 0) { fprintf(stderr, "error: the prompt is empty after tokenization\n"); goto done; }
    if ((long)n_toks + n_predict > c.n_ctx) {
        fprintf(stderr, "error: prompt (%zu tokens) + n_predict (%ld) exceeds the context (%d)\n", n_toks, n_predict, c.n_ctx);
        goto done;
    }
    struct sampler_params sp = {c.temperature, c.top_k, c.top_p, c.min_p, 0, c.seed};
    if (sampler_init(&smp, &sp, m->info.n_vocab, err, sizeof err)) { fprintf(stderr, "error: %s\n", err); goto done; }

    const int V = m->info.n_vocab;
    float *logits = malloc(sizeof(float) * (size_t)V);
    int32_t *pos = malloc(sizeof(int32_t) * n_toks);
    if (!logits || !pos) { free(logits); free(pos); fprintf(stderr, "error: out of memory\n"); goto done; }
    for (size_t i = 0; i < n_toks; i++) pos[i] = (int32_t)i;
    fputs(prompt, stdout);
    fflush(stdout);

    struct model_output out;
    int64_t t0 = coti_time_us();
    struct model_batch b = {.n = (int)n_toks, .tokens = toks, .pos = pos};
    if (model_forward(m, &b, &out, err, sizeof err)) { fprintf(stderr, "\nerror: %s\n", err); free(logits); free(pos); goto done; }
    be->download(be, logits, out.logits, sizeof(float) * (size_t)V);
    int64_t t1 = coti_time_us();
    long n_gen = 0;
    const char *piece;
    size_t piece_len;
    for (; n_gen < n_predict; n_gen++) {
        int32_t id = sampler_sample(smp, logits);
        if (!ignore_eos && tokenizer_is_eog(tok, id)) break;
        if (tokenizer_token_to_piece(tok, id, false, &piece, &piece_len) == 0) fwrite(piece, 1, piece_len, stdout);
        fflush(stdout);
        if (n_gen + 1 == n_predict) { n_gen++; break; }
        int32_t p = (int32_t)(n_toks + n_gen);
        struct model_batch one = {.n = 1, .tokens = &id, .pos = &p};
        if (model_forward(m, &one, &out, err, sizeof err)) { fprintf(stderr, "\nerror: %s\n", err); free(logits); free(pos); goto done; }
        be->download(be, logits, out.logits, sizeof(float) * (size_t)V);
    }
    int64_t t2 = coti_time_us();
    fputc('\n', stdout);
    double pp_s = (t1 - t0) / 1e6, tg_s = (t2 - t1) / 1e6;
    fprintf(stderr, "# prompt %zu tokens %.1f ms %.1f tok/s | decode %ld tokens %.1f ms %.1f tok/s | threads %d | cpu %s | logits hash %016llx\n",
            n_toks, pp_s * 1e3, n_toks / (pp_s > 0 ? pp_s : 1e-9), n_gen, tg_s * 1e3,
            n_gen > 1 ? (n_gen - 1) / (tg_s > 0 ? tg_s : 1e-9) : 0.0, c.n_threads,
            c.cpu_level == QUANT_CPU_AVX512 ? "avx512" : c.cpu_level == QUANT_CPU_AVX2 ? "avx2" : "ref",
            (unsigned long long)hash_floats(logits, (size_t)V));
    free(logits);
    free(pos);
    rc = 0;
done:
    free(toks);
    sampler_free(smp);
    tokenizer_free(tok);
    model_free(m);
    backend_free(be);
    free(file_text);
    return rc;
}
