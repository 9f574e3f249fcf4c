/* equiv.c — `coti equiv`: the losslessness gate. For each prompt, greedy plain decoding
 * produces a continuation and, at every position, the plain next-token distribution; then
 * the same token sequence is teacher-forced through the speculative path (real drafts, real
 * multi-row verify batches, real rollbacks) and every verify row is compared with the plain
 * row for the same position (equiv.h). Exits 1 on any real disagreement (argmax differs and
 * it is not a near-tie). --free also reports where free-running greedy texts first differ.
 * --parallel P: the speculative pass of P prompts at a time runs as one batch of sequences
 * (spec_step_batch, as `coti serve` steps its busy slots), each teacher-forced; the plain rows
 * still come from each prompt alone. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "equiv.h"
#include "prompts.h"
#include "spec.h"
#include "tokenizer.h"
#include "tools.h"

#define EQUIV_N_GEN_DEFAULT 64
#define EQUIV_TOP_DEFAULT 10
#define EQUIV_TIE_DEFAULT 0.05

static void help(FILE *out, const struct cli_common *d) {
    fprintf(out, "usage: coti equiv [-m MODEL] --spec mtp|ngram|assistant (--prompts FILE | -p PROMPT) [-n N] [--top K] [--tie F] [--free]\n"
                 "                  [--grammar-file F]  (a grammar applies to both sides; rows are compared masked)\n"
                 "The losslessness gate: exit 0 when speculative verify rows agree with plain decoding, 1 on a\n"
                 "real disagreement, 2 on an error.\n"
                 "  --prompts FILE       a JSON array of prompts ('-': standard input)\n"
                 "  -p, --prompt TEXT    one prompt\n"
                 "  -n N                 tokens per prompt (default %d)\n"
                 "  --top K              compare top-K logprobs (default %d)\n"
                 "  --tie F              argmax flips within F logprob are near-ties (default %g)\n"
                 "  --free               also compare free-running greedy outputs\n"
                 "  --inject-divergence P  swap the top two of the speculative row at position P\n"
                 "                       (shows the gate catches a real divergence)\n"
                 "  --parallel P         the speculative pass of P prompts at once, in batched cycles (default 1)\n",
            EQUIV_N_GEN_DEFAULT, EQUIV_TOP_DEFAULT, EQUIV_TIE_DEFAULT);
}

struct collect {
    struct equiv_row *rows;      /* indexed by position */
    int n_pos;
    int k;
    long inject_pos;
};

static void on_row(void *user, int pos, const float *logits, int n_vocab) {
    struct collect *c = user;
    if (pos < 0 || pos >= c->n_pos) return;
    equiv_row_from_logits(logits, n_vocab, c->k, &c->rows[pos]);
    if (pos == c->inject_pos && c->rows[pos].n >= 2) {
        struct equiv_row *r = &c->rows[pos];
        int32_t t = r->id[0]; r->id[0] = r->id[1]; r->id[1] = t;
        r->logprob[1] = r->logprob[0] - 1.0f; /* a clear, non-tie flip */
    }
}

struct equiv_opts {
    const char *prompts_path, *prompt;
    long n_gen, top, inject, parallel;
    double tie;
    bool free_run;
};

enum { OPT_PROMPTS = CLI_TOOL_CODE, OPT_TOP, OPT_TIE, OPT_INJECT, OPT_FREE, OPT_PARALLEL };

static int on_option(void *state, int code, const char *name, const char *v) {
    struct equiv_opts *o = state;
    switch (code) {
    case OPT_PROMPTS: o->prompts_path = v; return 0;
    case 'p': o->prompt = v; return 0;
    case 'n': return cli_parse_int(name, v, 2, 1 << 16, &o->n_gen);
    case OPT_TOP: return cli_parse_int(name, v, 2, EQUIV_MAX_TOP, &o->top);
    case OPT_TIE: return cli_parse_float(name, v, 0, 10, &o->tie);
    case OPT_INJECT: return cli_parse_int(name, v, 0, 1 << 24, &o->inject);
    case OPT_FREE: o->free_run = true; return 0;
    case OPT_PARALLEL: return cli_parse_int(name, v, 1, SPEC_MAX_BATCH, &o->parallel);
    }
    return -1;
}

int tool_equiv_main(int argc, char **argv) {
    struct cli_common c;
    cli_common_defaults(&c);
    c.spec.drafter = &drafter_kind_mtp;
    struct equiv_opts o = {.n_gen = EQUIV_N_GEN_DEFAULT, .top = EQUIV_TOP_DEFAULT, .inject = -1, .parallel = 1,
                           .tie = EQUIV_TIE_DEFAULT};
    static const struct option opts[] = {
        {"prompts", required_argument, NULL, OPT_PROMPTS},
        {"prompt", required_argument, NULL, 'p'},
        {"top", required_argument, NULL, OPT_TOP},
        {"tie", required_argument, NULL, OPT_TIE},
        {"inject-divergence", required_argument, NULL, OPT_INJECT},
        {"free", no_argument, NULL, OPT_FREE},
        {"parallel", required_argument, NULL, OPT_PARALLEL},
        {0},
    };
    const struct cli_tool tool = {.name = "equiv", .help = help, .short_opts = "p:n:", .opts = opts,
                                  .on_option = on_option, .state = &o};
    int pr = cli_parse(&c, &tool, argc, argv);
    if (pr != CLI_PARSE_OK) return pr == CLI_PARSE_EXIT ? 0 : 2;
    const char *prompts_path = o.prompts_path, *prompt = o.prompt;
    const long n_gen = o.n_gen, top = o.top, inject = o.inject;
    const double tie = o.tie;
    const bool free_run = o.free_run;
    if (!prompts_path == !prompt) { fprintf(stderr, "error: give one of --prompts and -p\n"); return 2; }
    if (!c.spec.drafter) {
        char choices[128];
        fprintf(stderr, "error: --spec must be %s\n", drafter_kind_choices(choices, sizeof choices, false, ""));
        return 2;
    }
    struct prompt_list pl = {0};
    char *one[1] = {(char *)prompt};
    if (prompts_path) { if (prompts_load(prompts_path, &pl)) return 2; }
    else { pl.items = one; pl.n = 1; }

    const int P = (int)o.parallel;
    struct backend *be;
    struct model *m;
    int rc = 2;
    if (cli_open_model(&c, P, 0, &be, &m)) { if (prompts_path) prompts_free(&pl); return 2; }
    char err[512];
    struct tokenizer *tok = NULL;
    struct spec_engine *eng = NULL;
    /* per sequence of a group: its plain and speculative rows, prompt, forced tokens */
    struct collect plain[SPEC_MAX_BATCH] = {{0}}, spec[SPEC_MAX_BATCH] = {{0}};
    int32_t *seq[SPEC_MAX_BATCH] = {NULL}, *pt[SPEC_MAX_BATCH] = {NULL};
    size_t np[SPEC_MAX_BATCH] = {0};
    int n_tok[SPEC_MAX_BATCH] = {0};
    struct spec_probe sprobe[SPEC_MAX_BATCH];
    if (tokenizer_init(&tok, m->gguf, err, sizeof err) || spec_engine_init(&eng, m, c.draft_path, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        goto done;
    }
    if (cli_grammar_open(&c, tok, m->info.n_vocab)) goto done;
    for (int j = 0; j < P; j++) {
        plain[j].rows = calloc((size_t)c.n_ctx, sizeof(struct equiv_row));
        spec[j].rows = calloc((size_t)c.n_ctx, sizeof(struct equiv_row));
        seq[j] = malloc(sizeof(int32_t) * ((size_t)c.n_ctx + SPEC_MAX_DRAFT + 2));
        if (!plain[j].rows || !spec[j].rows || !seq[j]) { fprintf(stderr, "error: out of memory\n"); goto done; }
        plain[j].n_pos = spec[j].n_pos = c.n_ctx;
        plain[j].k = spec[j].k = (int)top;
        plain[j].inject_pos = -1;
    }
    struct equiv_stats st;
    equiv_stats_init(&st);
    struct sampler_params greedy = sampler_params_basic(0.0f, 0, 1.0f, 0.0f, c.seed);
    struct spec_params off = c.spec;
    off.drafter = NULL;
    long free_diff_prompts = 0;
    int32_t first, buf[SPEC_MAX_DRAFT + 1];
    int nb;
    for (size_t g0 = 0; g0 < pl.n; g0 += (size_t)P) {
        const int gn = (int)COTI_MIN((size_t)P, pl.n - g0);
        /* plain, each prompt alone on sequence 0: prefill, then one-token decode steps; every
         * step's row is the reference */
        for (int j = 0; j < gn; j++) {
            const size_t pi = g0 + (size_t)j;
            if (tokenizer_encode(tok, pl.items[pi], strlen(pl.items[pi]), true, true, &pt[j], &np[j], err, sizeof err) ||
                np[j] == 0) {
                fprintf(stderr, "error: prompt %zu: cannot tokenize (%s)\n", pi, np[j] ? err : "empty");
                goto done;
            }
            if ((long)np[j] + n_gen + SPEC_MAX_DRAFT + 2 > c.n_ctx) { fprintf(stderr, "error: prompt %zu too long for -c %d\n", pi, c.n_ctx); goto done; }
            struct spec_probe pprobe = {NULL, 0, 0, on_row, &plain[j]};
            if (spec_seq_begin(eng, 0, pt[j], (int)np[j], &greedy, &off, &first, err, sizeof err)) { fprintf(stderr, "error: %s\n", err); goto done; }
            memcpy(seq[j], pt[j], sizeof(int32_t) * np[j]);
            n_tok[j] = (int)np[j];
            seq[j][n_tok[j]++] = first;
            /* under a grammar the text ends with an end-of-generation token */
            while (n_tok[j] < (int)np[j] + n_gen && !(c.spec.grammar && tokenizer_is_eog(tok, seq[j][n_tok[j] - 1]))) {
                if (spec_seq_step(eng, 0, 1, buf, &nb, NULL, err, sizeof err)) { fprintf(stderr, "error: %s\n", err); goto done; }
                seq[j][n_tok[j]++] = buf[0];
            }
            /* plain rows: re-run the same path with a probe that forces the same tokens */
            if (spec_seq_begin(eng, 0, pt[j], (int)np[j], &greedy, &off, &first, err, sizeof err)) { fprintf(stderr, "error: %s\n", err); goto done; }
            pprobe.forced = seq[j] + np[j] + 1;
            pprobe.n_forced = n_tok[j] - (int)np[j] - 1;
            while (pprobe.n_used < pprobe.n_forced)
                if (spec_seq_step(eng, 0, pprobe.n_forced - pprobe.n_used, buf, &nb, &pprobe, err, sizeof err)) { fprintf(stderr, "error: %s\n", err); goto done; }
        }
        /* speculative: the same tokens forced through drafts, verify batches and rollbacks, the
         * group's prompts on sequences 0 .. gn-1 (one batch of them per cycle past one) */
        for (int j = 0; j < gn; j++) {
            sprobe[j] = (struct spec_probe){seq[j] + np[j] + 1, n_tok[j] - (int)np[j] - 1, 0, on_row, &spec[j]};
            spec[j].inject_pos = inject >= 0 ? (long)np[j] + inject : -1;
            if (spec_seq_begin(eng, j, pt[j], (int)np[j], &greedy, &c.spec, &first, err, sizeof err)) { fprintf(stderr, "error: %s\n", err); goto done; }
            if (first != seq[j][np[j]]) { fprintf(stderr, "error: prompt %zu: the speculative prefill chose a different first token\n", g0 + (size_t)j); goto done; }
        }
        if (P == 1) { /* the single-sequence cycle (device-side acceptance), which run and bench use */
            while (sprobe[0].n_used < sprobe[0].n_forced)
                if (spec_seq_step(eng, 0, sprobe[0].n_forced - sprobe[0].n_used, buf, &nb, &sprobe[0], err, sizeof err)) { fprintf(stderr, "error: %s\n", err); goto done; }
        } else {
            for (;;) {
                int ids[SPEC_MAX_BATCH], max_new[SPEC_MAX_BATCH], n_out[SPEC_MAX_BATCH], rcs[SPEC_MAX_BATCH], k = 0;
                struct spec_probe *probes[SPEC_MAX_BATCH];
                int32_t out[SPEC_MAX_BATCH][SPEC_MAX_DRAFT + 1];
                for (int j = 0; j < gn; j++)
                    if (sprobe[j].n_used < sprobe[j].n_forced) {
                        ids[k] = j;
                        max_new[k] = sprobe[j].n_forced - sprobe[j].n_used;
                        probes[k++] = &sprobe[j];
                    }
                if (!k) break;
                if (spec_step_batch(eng, k, ids, max_new, out, n_out, rcs, probes, err, sizeof err)) { fprintf(stderr, "error: %s\n", err); goto done; }
                for (int i = 0; i < k; i++)
                    if (rcs[i]) { fprintf(stderr, "error: %s\n", err); goto done; }
            }
        }
        for (int j = 0; j < gn; j++) {
            const size_t pi = g0 + (size_t)j;
            const struct spec_stats *ss = spec_seq_stats(eng, j);
            long before = st.n_real;
            for (int p = (int)np[j]; p < n_tok[j] - 1; p++) equiv_add(&st, p, &plain[j].rows[p], &spec[j].rows[p], (float)tie);
            fprintf(stderr, "prompt %zu: %zu prompt tokens, %d positions, drafted %ld accepted %ld, real disagreements %ld%s\n",
                    pi, np[j], n_tok[j] - 1 - (int)np[j], ss->n_drafted, ss->n_accepted, st.n_real - before,
                    P > 1 ? " (speculative pass batched)" : "");
        }
        if (free_run) {
            for (int j = 0; j < gn; j++) {
                /* free-running greedy with speculation on: where does it first leave the plain text? */
                if (spec_seq_begin(eng, 0, pt[j], (int)np[j], &greedy, &c.spec, &first, err, sizeof err)) { fprintf(stderr, "error: %s\n", err); goto done; }
                int n = 1, diff = first == seq[j][np[j]] ? -1 : 0;
                const int n_ref = n_tok[j] - (int)np[j];
                while (diff < 0 && n < n_ref) {
                    if (spec_seq_step(eng, 0, n_ref - n, buf, &nb, NULL, err, sizeof err)) { fprintf(stderr, "error: %s\n", err); goto done; }
                    for (int i = 0; i < nb && diff < 0; i++, n++) if (buf[i] != seq[j][np[j] + n]) diff = n;
                }
                if (diff >= 0) { free_diff_prompts++; fprintf(stderr, "prompt %zu: free-running greedy text first differs at generated token %d\n", g0 + (size_t)j, diff); }
            }
        }
        for (int j = 0; j < gn; j++) { free(pt[j]); pt[j] = NULL; }
    }
    printf("# equiv spec %s n_max %d: positions %ld, top-1 agreement %ld/%ld (%.4f), near-ties %ld, real disagreements %ld, mean |dlogprob top-1| %.3g, max %.3g",
           drafter_kind_name(c.spec.drafter), c.spec.n_max, st.n_rows, st.n_agree, st.n_rows, st.n_rows ? (double)st.n_agree / st.n_rows : 0.0,
           st.n_near_tie, st.n_real, st.n_rows ? st.sum_d_top1 / st.n_rows : 0.0, st.max_d_top1);
    if (free_run) printf(", free-running texts differing: %ld/%zu", free_diff_prompts, pl.n);
    printf("\n");
    rc = st.n_real ? 1 : 0;
done:
    for (int j = 0; j < SPEC_MAX_BATCH; j++) { free(plain[j].rows); free(spec[j].rows); free(seq[j]); free(pt[j]); }
    spec_engine_free(eng);
    tokenizer_free(tok);
    model_free(m);
    backend_free(be);
    if (prompts_path) prompts_free(&pl);
    cli_common_free(&c);
    return rc;
}
