/* bench.c — `coti bench`: decode speed of several speculative configurations in one run,
 * same model, same prompts, interleaved (every repeat runs each configuration on each prompt
 * in turn, so machine noise hits them alike). Every request is fresh (the sequence is reset
 * and the prompt prefilled), greedy unless --temp is given, and runs to -n tokens ignoring
 * end-of-generation.
 * Prints per configuration the median over repeats of decode tok/s (tokens after the first
 * / time after the first), the ratio to the first configuration (normally `off`),
 * acceptance = accepted/drafted over the same requests, tokens per verify, the split of time
 * into draft / verify / glue, and whether the output equals the first configuration's.
 * --op-cost: one configuration, timed with each family of backend ops left out in turn
 * (opcost.h); the time a family's absence saves is its cost per token. With --prefill (one
 * size): the same for a prompt's prefill.
 * --prefill N[,N...]: prompt processing of N random tokens (as llama-bench's ppN): the first run
 * of each size after the model is loaded (cold: new shapes, scratch growth) and the median of
 * --repeat runs after it (warm); every run starts a fresh sequence; the context grows to hold the
 * largest N.
 * --parallel P[,P...]: every configuration also with P sequences decoding together (one
 * batched cycle of all of them, spec_step_batch, as `coti serve` steps its busy slots): the
 * prompts go in groups of P and tok/s is the aggregate of the group (issue 24).
 * --depth N: each prompt comes after N random tokens (the same for every configuration, as
 * llama-bench's -d), so decode runs at context positions N and up; the prefill stays untimed.
 * --verify-cost K: the target's forward of 1 .. K rows (a decode step, then verifies of 1 ..
 * K-1 drafts), timed as the speculative cycle runs it (recorded graphs where the backend has
 * them), beside the weight bytes it reads (opcost.h: each routed expert once per call) and
 * what those bytes take at the decode step's bandwidth: on a mixture of experts a verify reads
 * the union of its rows' experts (issue 22). With --op-cost: then the op cost of a 1-row and a
 * K-row forward, which says what each family of ops adds per verify row. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "engine/engine.h"
#include "opcost.h"
#include "prompts.h"
#include "spec.h"
#include "tokenizer.h"
#include "tools.h"

#define BENCH_MAX_CONFIGS 16
#define BENCH_SPEC_DEFAULT "off,mtp"
#define BENCH_N_GEN_DEFAULT 128
#define BENCH_REPEAT_DEFAULT 3

static void help(FILE *out, const struct cli_common *d) {
    fprintf(out, "usage: coti bench [-m MODEL] --spec off,mtp,ngram[,mtp:N ...] --prompts FILE [-n N] [--repeat R] [--json PATH]\n"
                 "       coti bench [-m MODEL] --op-cost [--spec CONFIG] --prompts FILE [-n N] [--repeat R]\n"
                 "       coti bench [-m MODEL] --op-cost --prefill N [--repeat R]\n"
                 "       coti bench [-m MODEL] --verify-cost K [--op-cost] [--repeat R]\n"
                 "  --spec LIST          configurations, comma-separated (default %s); a configuration is\n"
                 "                       TYPE, TYPE:N_MAX or TYPE:N_MAX:P_MIN (defaults: --spec-n-max, --spec-p-min)\n"
                 "  --prompts FILE       a JSON array of prompts ('-': standard input)\n"
                 "  -n N                 tokens per request (default %d)\n"
                 "  --repeat R           passes over the prompts (default %d)\n"
                 "  --json PATH          the results as JSON too ('-': to stdout, the table then goes to stderr)\n"
                 "  --op-cost            decode time with each family of ops left out in turn (outputs are garbage then)\n"
                 "  --prefill N[,N...]   prompt processing of N random tokens instead (tok/s, cold and warm; no --prompts)\n"
                 "  --depth N            decode after N random tokens in front of each prompt (default 0; -c must hold them)\n"
                 "  --parallel P[,P...]  also with P sequences decoding together, batched (aggregate tok/s; default 1)\n"
                 "  --verify-cost K      instead: time and weight bytes of a forward of 1 .. K rows (decode, verifies);\n"
                 "                       with --op-cost also the op cost of a 1-row and a K-row forward\n",
            BENCH_SPEC_DEFAULT, BENCH_N_GEN_DEFAULT, BENCH_REPEAT_DEFAULT);
}

struct config {
    struct spec_params sp;
    int par;                     /* sequences decoding together */
    char name[32];
    double *tps;                 /* per repeat */
    long drafted, accepted, verifies, tokens;
    int64_t t_draft, t_verify, t_glue, t_total;
    bool same_as_first;
};

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The prompts and buffers every pass over them shares. */
struct bench_io {
    struct spec_engine *eng;
    struct sampler_params sampling;
    size_t n_prompts;
    int32_t **ptoks;
    size_t *np;
    long n_gen;
    int32_t *gen;
    int32_t **ref;               /* the first pass's outputs */
    bool have_ref;
    const struct tokenizer *tok;
};

/* Prompt p's output gen (n_gen tokens) against the first pass's, and its sequence's statistics
 * into k. */
static void account(struct bench_io *io, struct config *k, size_t p, const int32_t *gen, const struct spec_stats *st) {
    if (!io->have_ref) memcpy(io->ref[p], gen, sizeof(int32_t) * (size_t)io->n_gen);
    else if (memcmp(io->ref[p], gen, sizeof(int32_t) * (size_t)io->n_gen)) k->same_as_first = false;
    k->drafted += st->n_drafted;
    k->accepted += st->n_accepted;
    k->verifies += st->n_verify;
    k->t_draft += st->t_draft_us;
    k->t_verify += st->t_verify_us;
    k->t_glue += st->t_glue_us;
}

/* Prompts [p0, p0 + n) together on sequences 0 .. n-1, every cycle one spec_step_batch: their
 * tokens into gen[i * gen_stride ..], *n_tokens (after the first of each), the time they took. */
static int run_group(struct bench_io *io, struct config *k, size_t p0, int n, int32_t *gen, long gen_stride, long *n_tokens,
                     int64_t *t_us, char *err, size_t err_size) {
    int n_got[SPEC_MAX_BATCH];
    for (int i = 0; i < n; i++) {
        if (spec_seq_begin(io->eng, i, io->ptoks[p0 + i], (int)io->np[p0 + i], &io->sampling, &k->sp, &gen[i * gen_stride], err,
                           err_size))
            return 1;
        n_got[i] = 1;
    }
    const int64_t t0 = coti_time_us();
    for (;;) {
        int seqs[SPEC_MAX_BATCH], max_new[SPEC_MAX_BATCH], n_out[SPEC_MAX_BATCH], rc[SPEC_MAX_BATCH], m = 0;
        int32_t out[SPEC_MAX_BATCH][SPEC_MAX_DRAFT + 1];
        for (int i = 0; i < n; i++)
            if (n_got[i] < io->n_gen && !(k->sp.grammar && tokenizer_is_eog(io->tok, gen[i * gen_stride + n_got[i] - 1]))) {
                seqs[m] = i;
                max_new[m++] = (int)(io->n_gen - n_got[i]);
            }
        if (!m) break;
        if (spec_step_batch(io->eng, m, seqs, max_new, out, n_out, rc, NULL, err, err_size)) return 1;
        for (int j = 0; j < m; j++) {
            if (rc[j]) return 1;
            memcpy(&gen[seqs[j] * gen_stride + n_got[seqs[j]]], out[j], sizeof(int32_t) * (size_t)n_out[j]);
            n_got[seqs[j]] += n_out[j];
        }
    }
    *t_us = coti_time_us() - t0;
    *n_tokens = 0;
    for (int i = 0; i < n; i++) {
        for (long t = n_got[i]; t < io->n_gen; t++) gen[i * gen_stride + t] = -1;
        *n_tokens += n_got[i] - 1;
    }
    return 0;
}

/* Every prompt once with configuration k, fresh: decode tok/s into *tps, statistics added to k. */
static int run_prompts(struct bench_io *io, struct config *k, double *tps, char *err, size_t err_size) {
    long toks = 0;
    int64_t t_dec = 0;
    for (size_t p0 = 0; k->par > 1 && p0 < io->n_prompts; p0 += (size_t)k->par) {
        cli_progress("bench: %s, prompts %zu-%zu/%zu", k->name, p0 + 1, COTI_MIN(p0 + (size_t)k->par, io->n_prompts), io->n_prompts);
        const int n = (int)COTI_MIN((size_t)k->par, io->n_prompts - p0);
        long n_tok;
        int64_t us;
        const long stride = io->n_gen + SPEC_MAX_DRAFT + 1;
        if (run_group(io, k, p0, n, io->gen, stride, &n_tok, &us, err, err_size)) return 1;
        t_dec += us;
        toks += n_tok;
        k->tokens += n_tok;
        k->t_total += us;
        for (int i = 0; i < n; i++) account(io, k, p0 + (size_t)i, io->gen + (size_t)i * (size_t)stride, spec_seq_stats(io->eng, i));
    }
    for (size_t p = 0; k->par == 1 && p < io->n_prompts; p++) {
        cli_progress("bench: %s, prompt %zu/%zu", k->name, p + 1, io->n_prompts);
        int32_t first;
        if (spec_seq_begin(io->eng, 0, io->ptoks[p], (int)io->np[p], &io->sampling, &k->sp, &first, err, err_size))
            return 1;
        int64_t t0 = coti_time_us();
        int n = 1, nb;
        io->gen[0] = first;
        /* under a grammar the output may end (an end-of-generation token) */
        while (n < io->n_gen && !(k->sp.grammar && tokenizer_is_eog(io->tok, io->gen[n - 1]))) {
            if (spec_seq_step(io->eng, 0, (int)(io->n_gen - n), io->gen + n, &nb, NULL, err, err_size)) return 1;
            n += nb;
        }
        for (long i = n; i < io->n_gen; i++) io->gen[i] = -1;
        int64_t t1 = coti_time_us();
        t_dec += t1 - t0;
        toks += n - 1;
        const struct spec_stats *st = spec_seq_stats(io->eng, 0);
        account(io, k, p, io->gen, st);
        k->tokens += n - 1;
        k->t_total += t1 - t0;
    }
    io->have_ref = true;
    *tps = toks / (t_dec / 1e6);
    return 0;
}

static double median(double *v, long n) {
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return v[n / 2];
}

/* One timed pass of what --op-cost measures: its rate (units per second) into *tps. */
typedef int (*opcost_pass)(void *arg, double *tps, char *err, size_t err_size);

/* --op-cost: one pass counting each family's op calls (untimed: it runs without graphs), then
 * the pass with nothing skipped (before and after, to see drift), then with each family
 * skipped; each `repeat` times, medians. what: the pass, for the header; unit: what its rate
 * counts ("token", or "forward" for --verify-cost's). */
static int op_cost(struct backend *be, opcost_pass pass_fn, void *arg, long repeat, const char *what, const char *unit) {
    char err[512];
    double med[OPCOST_COUNT + 2];
    double *tps = malloc(sizeof(double) * (size_t)repeat);
    if (!tps) { fprintf(stderr, "error: out of memory\n"); return 1; }
    opcost_count(be, true);
    int rc = pass_fn(arg, &tps[0], err, sizeof err);
    const struct opcost_counts cnt = opcost_counted(be);
    opcost_count(be, false);
    for (int pass = 0; pass < OPCOST_COUNT + 2 && !rc; pass++) {
        const int family = pass == 0 || pass == OPCOST_COUNT + 1 ? -1 : pass - 1;
        opcost_skip(be, family);
        for (long r = 0; r < repeat && !rc; r++) rc = pass_fn(arg, &tps[r], err, sizeof err);
        med[pass] = median(tps, repeat);
    }
    free(tps);
    opcost_skip(be, -1);
    cli_progress_end();
    if (rc) { fprintf(stderr, "error: %s\n", err); return 1; }
    const double base = 0.5 * (med[0] + med[OPCOST_COUNT + 1]), step_us = 1e6 / base;
    const bool tok = !strcmp(unit, "token");
    char per[32];
    snprintf(per, sizeof per, "us per %s", unit);
    printf("# op cost | %s, %ld repeats | with one family of ops left out (what the model computes\n"
           "# then is garbage): the time saved is the family's cost per %s; calls: its op calls in one pass\n",
           what, repeat, unit);
    printf("%-26s %10s %14s %8s %10s\n", "left out", tok ? "tok/s" : "fwd/s", per, "share", "calls");
    printf("%-26s %10.1f %14.1f %8s %10s   (before %.1f, after %.1f)\n", "nothing", base, step_us, "100%", "-", med[0],
           med[OPCOST_COUNT + 1]);
    for (int f = 0; f < OPCOST_COUNT; f++) {
        const double saved = step_us - 1e6 / med[f + 1];
        printf("%-26s %10.1f %14.1f %7.1f%% %10ld\n", opcost_family_name(f), med[f + 1], saved, 100.0 * saved / step_us,
               cnt.op_calls[f]);
    }
    return 0;
}

struct decode_pass {
    struct bench_io *io;
    struct config *k;
};
static int decode_pass_run(void *arg, double *tps, char *err, size_t err_size) {
    struct decode_pass *d = arg;
    return run_prompts(d->io, d->k, tps, err, err_size);
}

/* n random token ids below n_vocab, the same for the same seed. */
static void random_tokens(int32_t *out, long n, int32_t n_vocab, uint64_t seed) {
    uint64_t x = 0x9E3779B97F4A7C15ull ^ seed;
    for (long i = 0; i < n; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        out[i] = (int32_t)(x % (uint64_t)n_vocab);
    }
}

#define BENCH_MAX_PREFILL_SIZES 32
#define BENCH_MAX_PREFILL ((1 << 20) - 1)

/* --prefill's list into sizes[] (*n of them); 1 (after a message) if one is not a size. */
static int parse_prefill_sizes(const char *list_in, long *sizes, int *n) {
    char list[256];
    snprintf(list, sizeof list, "%s", list_in);
    *n = 0;
    for (char *save = NULL, *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (*n == BENCH_MAX_PREFILL_SIZES) { fprintf(stderr, "error: --prefill takes at most %d sizes\n", BENCH_MAX_PREFILL_SIZES); return 1; }
        if (cli_parse_int("--prefill", t, 1, BENCH_MAX_PREFILL, &sizes[(*n)++])) return 1;
    }
    return 0;
}

/* A prefill of n tokens on a fresh sequence 0: its tok/s into *tps. */
struct prefill_pass {
    struct spec_engine *eng;
    const int32_t *toks;
    long n;
};
static int prefill_pass_run(void *arg, double *tps, char *err, size_t err_size) {
    struct prefill_pass *p = arg;
    const struct sampler_params greedy = sampler_params_basic(0.0f, 1, 1.0f, 0.0f, 0);
    const struct spec_params off = spec_params_default();
    int32_t first;
    if (spec_seq_begin(p->eng, 0, p->toks, (int)p->n, &greedy, &off, &first, err, err_size)) return 1;
    const int64_t us = spec_seq_stats(p->eng, 0)->t_prompt_us;
    *tps = us > 0 ? p->n / (us / 1e6) : 0.0;
    return 0;
}

/* --prefill: each size's cold run and its warm median (module comment); with --op-cost (one
 * size), the warm prefill with each family of ops left out in turn, after the cold run. */
static int prefill_bench(struct spec_engine *eng, struct backend *be, const struct model *m, const char *list,
                         const long *sizes, int n_sizes, long repeat, bool op_costs, const char *model_path, int n_threads) {
    char err[512];
    if (!op_costs) {
        printf("# bench --prefill %s | %s | %ld warm runs, threads %d | fresh sequence each run, random tokens\n", list,
               model_path, repeat, n_threads);
        printf("%-10s %14s %14s   %s\n", "tokens", "cold tok/s", "warm tok/s", "(warm runs)");
    }
    int rc = 0;
    for (int i = 0; i < n_sizes && !rc; i++) {
        const long n = sizes[i];
        int32_t *toks = malloc(sizeof(int32_t) * (size_t)n);
        double *tps = malloc(sizeof(double) * (size_t)(repeat + 1));
        if (!toks || !tps) { free(toks); free(tps); fprintf(stderr, "error: out of memory\n"); return 1; }
        random_tokens(toks, n, m->info.n_vocab, (uint64_t)n);
        struct prefill_pass pp = {eng, toks, n};
        if (op_costs) {
            if ((rc = prefill_pass_run(&pp, &tps[0], err, sizeof err))) fprintf(stderr, "error: %s\n", err);
            char what[512];
            snprintf(what, sizeof what, "prefill of %ld random tokens | %s | threads %d", n, model_path, n_threads);
            if (!rc) rc = op_cost(be, prefill_pass_run, &pp, repeat, what, "token");
        }
        for (long r = 0; r <= repeat && !rc && !op_costs; r++)
            if ((rc = prefill_pass_run(&pp, &tps[r], err, sizeof err))) fprintf(stderr, "error: %s\n", err);
        if (!rc && !op_costs) {
            printf("%-10ld %14.1f", n, tps[0]);
            char runs[512];
            int at = 0;
            for (long r = 1; r <= repeat && at < (int)sizeof runs; r++)
                at += snprintf(runs + at, sizeof runs - (size_t)at, "%s%.1f", r > 1 ? " " : "", tps[r]);
            printf(" %14.1f   (%s)\n", median(tps + 1, repeat), runs); /* median sorts: the runs first */
        }
        free(toks);
        free(tps);
    }
    return rc;
}

/* A forward of n rows on a fresh sequence 0 at position 0, random tokens, every row's logits
 * and argmax (--verify-cost). */
struct forward_pass {
    struct model *m;
    int32_t toks[SPEC_MAX_DRAFT + 1], pos[SPEC_MAX_DRAFT + 1], seq[SPEC_MAX_DRAFT + 1];
    bool want[SPEC_MAX_DRAFT + 1];
    struct model_batch b;
};
static void forward_pass_init(struct forward_pass *f, struct model *m, int n, int32_t *d_ids) {
    f->m = m;
    random_tokens(f->toks, n, m->info.n_vocab, (uint64_t)n);
    for (int i = 0; i < n; i++) { f->pos[i] = i; f->seq[i] = 0; f->want[i] = true; }
    f->b = (struct model_batch){.n = n, .tokens = f->toks, .pos = f->pos, .seq = f->seq, .want_logits = f->want,
                                .keep_states = n > 1, .argmax_out = d_ids};
}
static int forward_pass_time(struct forward_pass *f, double *us, char *err, size_t err_size) {
    struct model_output o;
    model_seq_reset(f->m, 0);
    const int64_t t0 = coti_time_us();
    if (model_forward(f->m, &f->b, &o, err, err_size)) return 1;
    f->m->be->sync(f->m->be);
    *us = (double)(coti_time_us() - t0);
    return 0;
}
/* --verify-cost --op-cost's pass: two forwards (they record the graphs a change of the skipped
 * family left stale), then the timed one. */
static int forward_pass_run(void *arg, double *fps, char *err, size_t err_size) {
    double us = 0;
    for (int r = 0; r < 3; r++)
        if (forward_pass_time(arg, &us, err, err_size)) return 1;
    *fps = us > 0 ? 1e6 / us : 0.0;
    return 0;
}

/* --verify-cost: per row count, a counted forward (bytes, experts), then repeat + 2 timed ones
 * (the first two record the graphs). With op_costs, then the op cost of a 1-row and a
 * max_rows-row forward: what each family adds per row. */
static int verify_cost_bench(struct model *m, struct backend *be, long max_rows, long repeat, bool op_costs,
                             const char *model_path) {
    char err[512];
    double *us = malloc(sizeof(double) * (size_t)(repeat + 2));
    int32_t *d_ids = be->alloc(be, sizeof(int32_t) * (SPEC_MAX_DRAFT + 1));
    if (!us || !d_ids) { free(us); if (d_ids) be->free(be, d_ids); fprintf(stderr, "error: out of memory\n"); return 1; }
    printf("# bench --verify-cost %ld | %s | a forward of n rows (n = 1: a decode step; n > 1: a verify of n-1 drafts),\n"
           "# fresh sequence, random tokens, logits and argmax of every row; median of %ld after 2 warm-ups\n",
           max_rows, model_path, repeat);
    printf("%5s %10s %9s %12s %15s %14s %9s\n", "rows", "us", "x decode", "weights MB", "experts/call", "us at dec GB/s", "x that");
    double decode_us = 0, decode_bytes = 0;
    int rc = 0;
    for (int n = 1; n <= max_rows && !rc; n++) {
        struct forward_pass f;
        forward_pass_init(&f, m, n, d_ids);
        struct opcost_counts cnt = {0};
        for (long r = -1; r < repeat + 2 && !rc; r++) {
            double t_us;
            if (r == -1) opcost_count(be, true);
            rc = forward_pass_time(&f, &t_us, err, sizeof err);
            if (r == -1) { cnt = opcost_counted(be); opcost_count(be, false); }
            else us[r] = t_us;
        }
        if (rc) { fprintf(stderr, "error: %s\n", err); break; }
        const double t = median(us + 2, repeat);
        if (n == 1) { decode_us = t; decode_bytes = cnt.weight_bytes; }
        const double at_bw = decode_bytes > 0 ? cnt.weight_bytes / decode_bytes * decode_us : 0;
        char experts[32] = "-";
        if (cnt.expert_calls) snprintf(experts, sizeof experts, "%.2f", (double)cnt.experts_read / (double)cnt.expert_calls);
        printf("%5d %10.1f %9.3f %12.1f %15s %14.1f %9.3f\n", n, t, t / decode_us, cnt.weight_bytes / 1e6, experts, at_bw,
               at_bw > 0 ? t / at_bw : 0.0);
    }
    if (!rc) printf("# decode: %.1f MB of weights in %.1f us = %.1f GB/s\n", decode_bytes / 1e6, decode_us,
                    decode_us > 0 ? decode_bytes / decode_us / 1e3 : 0.0);
    for (int i = 0; i < 2 && op_costs && !rc; i++) {
        const int n = i == 0 ? 1 : (int)max_rows;
        struct forward_pass f;
        forward_pass_init(&f, m, n, d_ids);
        char what[600];
        snprintf(what, sizeof what, "a forward of %d row%s | %s", n, n == 1 ? "" : "s", model_path);
        rc = op_cost(be, forward_pass_run, &f, repeat, what, "forward");
    }
    model_seq_reset(m, 0);
    be->free(be, d_ids);
    free(us);
    return rc;
}

struct bench_opts {
    const char *prompts_path, *json_path, *spec_list, *prefill, *parallel;
    long n_gen, repeat, depth, verify_cost;
    bool op_cost, spec_given;
};

enum { OPT_SPEC_LIST = CLI_TOOL_CODE, OPT_OP_COST, OPT_PROMPTS, OPT_JSON, OPT_REPEAT, OPT_PREFILL, OPT_DEPTH, OPT_PARALLEL,
       OPT_VERIFY_COST };

static int on_option(void *state, int code, const char *name, const char *v) {
    struct bench_opts *o = state;
    switch (code) {
    case OPT_SPEC_LIST: o->spec_list = v; o->spec_given = true; return 0;
    case OPT_OP_COST: o->op_cost = true; return 0;
    case OPT_PROMPTS: o->prompts_path = v; return 0;
    case OPT_JSON: o->json_path = v; return 0;
    case OPT_PREFILL: o->prefill = v; return 0;
    case 'n': return cli_parse_int(name, v, 2, 1 << 16, &o->n_gen);
    case OPT_REPEAT: return cli_parse_int(name, v, 1, 1000, &o->repeat);
    case OPT_DEPTH: return cli_parse_int(name, v, 0, 1 << 24, &o->depth);
    case OPT_PARALLEL: o->parallel = v; return 0;
    case OPT_VERIFY_COST: return cli_parse_int(name, v, 1, SPEC_MAX_DRAFT + 1, &o->verify_cost);
    }
    return -1;
}

int tool_bench_main(int argc, char **argv) {
    struct cli_common c;
    cli_common_defaults(&c);
    struct bench_opts o = {.spec_list = BENCH_SPEC_DEFAULT, .n_gen = BENCH_N_GEN_DEFAULT, .repeat = BENCH_REPEAT_DEFAULT};
    static const struct option opts[] = {
        {"spec", required_argument, NULL, OPT_SPEC_LIST},
        {"op-cost", no_argument, NULL, OPT_OP_COST},
        {"prompts", required_argument, NULL, OPT_PROMPTS},
        {"json", required_argument, NULL, OPT_JSON},
        {"repeat", required_argument, NULL, OPT_REPEAT},
        {"prefill", required_argument, NULL, OPT_PREFILL},
        {"depth", required_argument, NULL, OPT_DEPTH},
        {"parallel", required_argument, NULL, OPT_PARALLEL},
        {"verify-cost", required_argument, NULL, OPT_VERIFY_COST},
        {0},
    };
    const struct cli_tool tool = {.name = "bench", .help = help, .short_opts = "n:", .opts = opts,
                                  .on_option = on_option, .state = &o};
    int pr = cli_parse(&c, &tool, argc, argv);
    if (pr != CLI_PARSE_OK) return pr == CLI_PARSE_EXIT ? 0 : 1;
    const char *prompts_path = o.prompts_path, *json_path = o.json_path, *spec_list = o.spec_list;
    const long n_gen = o.n_gen, repeat = o.repeat;
    const bool want_op_cost = o.op_cost, spec_given = o.spec_given;
    if (o.prefill) {
        if (spec_given || prompts_path || json_path || o.depth) {
            fprintf(stderr, "error: --prefill times prompt processing alone (no --spec, --prompts, --depth or --json)\n");
            return 1;
        }
        long sizes[BENCH_MAX_PREFILL_SIZES];
        int n_sizes;
        if (parse_prefill_sizes(o.prefill, sizes, &n_sizes)) return 1;
        if (want_op_cost && n_sizes != 1) { fprintf(stderr, "error: --op-cost times one --prefill size\n"); return 1; }
        /* the context holds the largest prompt (as llama-bench's ppN needs no -c) */
        for (int i = 0; i < n_sizes; i++) c.n_ctx = (int)COTI_MAX((long)c.n_ctx, sizes[i] + 1);
        struct backend *be;
        struct model *m;
        if (cli_open_model_wrapped(&c, 1, SPEC_MAX_DRAFT + 1, want_op_cost ? opcost_wrap : NULL, &be, &m)) return 1;
        char err[512];
        struct spec_engine *eng = NULL;
        int rc = spec_engine_init(&eng, m, NULL, err, sizeof err);
        if (rc) fprintf(stderr, "error: %s\n", err);
        else rc = prefill_bench(eng, be, m, o.prefill, sizes, n_sizes, repeat, want_op_cost, c.model_path, c.n_threads);
        spec_engine_free(eng);
        model_free(m);
        backend_free(be);
        return rc ? 1 : 0;
    }
    if (o.verify_cost) {
        if (spec_given || prompts_path || json_path || o.depth || o.parallel) {
            fprintf(stderr, "error: --verify-cost times forwards alone (no --spec, --prompts, --depth, --parallel or --json)\n");
            return 1;
        }
        if (want_op_cost && o.verify_cost < 2) { fprintf(stderr, "error: --verify-cost with --op-cost needs K >= 2\n"); return 1; }
        struct backend *be;
        struct model *m;
        if (cli_open_model_wrapped(&c, 1, SPEC_MAX_DRAFT + 1, opcost_wrap, &be, &m)) return 1;
        int rc = verify_cost_bench(m, be, o.verify_cost, repeat, want_op_cost, c.model_path);
        model_free(m);
        backend_free(be);
        return rc ? 1 : 0;
    }
    if (!prompts_path) { fprintf(stderr, "error: --prompts FILE is required (`coti bench --help` lists the options)\n"); return 1; }
    if (want_op_cost && !spec_given) spec_list = "off";
    struct config cfg[BENCH_MAX_CONFIGS];
    int n_cfg = 0;
    char list[256];
    snprintf(list, sizeof list, "%s", spec_list);
    for (char *save = NULL, *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (n_cfg == BENCH_MAX_CONFIGS) { fprintf(stderr, "error: at most %d configurations\n", BENCH_MAX_CONFIGS); return 1; }
        struct config *k = &cfg[n_cfg];
        memset(k, 0, sizeof *k);
        k->sp = c.spec;
        char *colon = strchr(t, ':'), *colon2 = colon ? strchr(colon + 1, ':') : NULL;
        long nm = c.spec.n_max;
        double pm = c.spec.p_min;
        if (colon2) { *colon2 = 0; if (cli_parse_float("--spec p_min", colon2 + 1, 0.0, 1.0, &pm)) return 1; }
        if (colon) { *colon = 0; if (cli_parse_int("--spec n_max", colon + 1, 1, SPEC_MAX_DRAFT, &nm)) return 1; }
        if (drafter_kind_parse(t, &k->sp.drafter)) { fprintf(stderr, "error: unknown speculation '%s'\n", t); return 1; }
        k->sp.n_max = (int)nm;
        k->sp.p_min = (float)pm;
        k->par = 1;
        if (!k->sp.drafter) snprintf(k->name, sizeof k->name, "off");
        else if (colon2) snprintf(k->name, sizeof k->name, "%s:%ld:%g", t, nm, pm);
        else snprintf(k->name, sizeof k->name, "%s:%ld", t, nm);
        n_cfg++;
    }
    if (want_op_cost && n_cfg != 1) { fprintf(stderr, "error: --op-cost times one configuration\n"); return 1; }
    /* --parallel: each configuration once per group size, the spec list's order within each */
    int max_par = 1;
    if (o.parallel) {
        if (want_op_cost || o.depth) { fprintf(stderr, "error: --parallel goes with neither --op-cost nor --depth\n"); return 1; }
        const int n_spec = n_cfg;
        n_cfg = 0;
        struct config spec_cfg[BENCH_MAX_CONFIGS];
        memcpy(spec_cfg, cfg, sizeof cfg);
        snprintf(list, sizeof list, "%s", o.parallel);
        for (char *save = NULL, *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            long par;
            if (cli_parse_int("--parallel", t, 1, SPEC_MAX_BATCH, &par)) return 1;
            for (int i = 0; i < n_spec; i++) {
                if (n_cfg == BENCH_MAX_CONFIGS) { fprintf(stderr, "error: at most %d configurations\n", BENCH_MAX_CONFIGS); return 1; }
                cfg[n_cfg] = spec_cfg[i];
                cfg[n_cfg].par = (int)par;
                char nm[32];
                snprintf(nm, sizeof nm, "%s", spec_cfg[i].name);
                snprintf(cfg[n_cfg++].name, sizeof cfg[0].name, "%.24s x%ld", nm, par);
            }
            max_par = COTI_MAX(max_par, (int)par);
        }
    }
    struct prompt_list pl;
    if (prompts_load(prompts_path, &pl)) return 1;
    struct backend *be;
    struct model *m;
    if (cli_open_model_wrapped(&c, max_par, 0, want_op_cost ? opcost_wrap : NULL, &be, &m)) { prompts_free(&pl); return 1; }
    int rc = 1;
    char err[512];
    struct tokenizer *tok = NULL;
    struct spec_engine *eng = NULL;
    int32_t **ptoks = calloc(pl.n, sizeof(int32_t *));
    size_t *np = calloc(pl.n, sizeof(size_t));
    int32_t **ref = calloc(pl.n, sizeof(int32_t *)); /* first configuration's outputs */
    int32_t *gen = malloc(sizeof(int32_t) * ((size_t)n_gen + SPEC_MAX_DRAFT + 1) * (size_t)max_par);
    double *tmp = malloc(sizeof(double) * (size_t)repeat);
    for (int k = 0; k < n_cfg; k++) { cfg[k].tps = calloc((size_t)repeat, sizeof(double)); cfg[k].same_as_first = true; }
    if (!ptoks || !np || !ref || !gen || !tmp) { fprintf(stderr, "error: out of memory\n"); goto done; }
    if (tokenizer_init(&tok, m->gguf, err, sizeof err) || spec_engine_init(&eng, m, c.draft_path, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        goto done;
    }
    if (cli_grammar_open(&c, tok, m->info.n_vocab)) goto done;
    if (max_par > 1 && spec_engine_calibrate(eng, err, sizeof err)) {
        fprintf(stderr, "error: calibration: %s\n", err);
        goto done;
    }
    for (int k = 0; k < n_cfg; k++) {
        cfg[k].sp.grammar = c.spec.grammar;
        cfg[k].sp.grammar_vocab = c.spec.grammar_vocab;
    }
    for (int k = 0; k < n_cfg; k++)
        if (!spec_engine_supports(eng, cfg[k].sp.drafter)) { fprintf(stderr, "error: '%s' is not available for this model\n", cfg[k].name); goto done; }
    for (size_t p = 0; p < pl.n; p++) {
        int32_t *t;
        size_t n;
        if (tokenizer_encode(tok, pl.items[p], strlen(pl.items[p]), true, true, &t, &n, err, sizeof err) || n == 0) {
            fprintf(stderr, "error: prompt %zu: cannot tokenize\n", p);
            goto done;
        }
        np[p] = (size_t)o.depth + n;
        if (o.depth > c.n_ctx || !(ptoks[p] = malloc(sizeof(int32_t) * np[p]))) { free(t); fprintf(stderr, "error: --depth %ld does not fit -c %d\n", o.depth, c.n_ctx); goto done; }
        random_tokens(ptoks[p], o.depth, m->info.n_vocab, p);
        memcpy(ptoks[p] + o.depth, t, sizeof(int32_t) * n);
        free(t);
        if ((long)np[p] + n_gen + SPEC_MAX_DRAFT + 1 > c.n_ctx) { fprintf(stderr, "error: prompt %zu too long for -c %d\n", p, c.n_ctx); goto done; }
        ref[p] = malloc(sizeof(int32_t) * (size_t)n_gen);
        if (!ref[p]) goto done;
    }
    /* greedy unless --temp: at temperature > 0 outputs differ by design (the RNG is used
     * differently), so the `same` column is only meaningful for greedy runs */
    struct bench_io io = {eng, sampler_params_basic(c.temperature, c.top_k, c.top_p, c.min_p, c.seed), pl.n, ptoks, np, n_gen, gen, ref, false, tok};
    if (want_op_cost) {
        char what[512];
        snprintf(what, sizeof what, "decode | %s | config %s, %zu prompts x %ld tokens, threads %d", c.model_path,
                 cfg[0].name, pl.n, n_gen, c.n_threads);
        struct decode_pass d = {&io, &cfg[0]};
        rc = op_cost(be, decode_pass_run, &d, repeat, what, "token");
        goto done;
    }
    for (long r = 0; r < repeat; r++)
        for (int k = 0; k < n_cfg; k++)
            if (run_prompts(&io, &cfg[k], &cfg[k].tps[r], err, sizeof err)) {
                fprintf(stderr, "error: %s\n", err);
                goto done;
            }
    double med[BENCH_MAX_CONFIGS];
    for (int k = 0; k < n_cfg; k++) {
        memcpy(tmp, cfg[k].tps, sizeof(double) * (size_t)repeat);
        med[k] = median(tmp, repeat);
    }
    cli_progress_end();
    /* --json -: stdout is the JSON's alone */
    const bool json_stdout = json_path && !strcmp(json_path, "-");
    FILE *table = json_stdout ? stderr : stdout;
    fprintf(table, "# bench %s | %zu prompts x %ld tokens, %ld repeats, threads %d | first fresh request each time, greedy%s",
           c.model_path, pl.n, n_gen, repeat, c.n_threads, c.spec.grammar ? ", under a grammar (an output may end early)" : "");
    if (max_par > 1)
        fprintf(table, " | groups batched, depth by verify cost (sequences x rows: 1x1 %.0f us, 1x2 %.0f, 4x1 %.0f, 4x2 %.0f, "
                "4x4 %.0f, 16x1 %.0f, 16x2 %.0f)", spec_engine_verify_cost_us(eng, 1, 1), spec_engine_verify_cost_us(eng, 1, 2),
                spec_engine_verify_cost_us(eng, 4, 1), spec_engine_verify_cost_us(eng, 4, 2), spec_engine_verify_cost_us(eng, 4, 4),
                spec_engine_verify_cost_us(eng, 16, 1), spec_engine_verify_cost_us(eng, 16, 2));
    if (o.depth) fprintf(table, " | after %ld random tokens (--depth), KV cache K %s V %s", o.depth,
                         ggml_type_traits_get(c.cache_type_k)->name, ggml_type_traits_get(c.cache_type_v)->name);
    fprintf(table, "\n");
    fprintf(table, "%-10s %10s %8s %12s %10s %8s %8s %8s %6s\n", "config", "tok/s", "ratio", "accept", "tok/verify", "draft%", "verify%", "glue%", "same");
    cJSON *root = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(root, "configs");
    cJSON_AddStringToObject(root, "model", c.model_path);
    cJSON_AddNumberToObject(root, "n_prompts", (double)pl.n);
    cJSON_AddNumberToObject(root, "n_gen", (double)n_gen);
    cJSON_AddNumberToObject(root, "repeat", (double)repeat);
    cJSON_AddNumberToObject(root, "threads", c.n_threads);
    cJSON_AddNumberToObject(root, "depth", (double)o.depth);
    for (int k = 0; k < n_cfg; k++) {
        const struct config *g = &cfg[k];
        double acc = g->drafted ? (double)g->accepted / g->drafted : 0.0;
        double tpv = g->verifies ? (double)(g->accepted + g->verifies) / g->verifies : 1.0;
        /* shares of the decode's time; a group's sequences share their cycles, so there of the
         * sum of every sequence's cycles */
        const double cycles = (double)(g->t_draft + g->t_verify + g->t_glue);
        const double tt = g->par > 1 ? fmax(cycles, 1.0) : g->t_total > 0 ? (double)g->t_total : 1.0;
        char accs[32];
        snprintf(accs, sizeof accs, "%ld/%ld", g->accepted, g->drafted);
        fprintf(table, "%-10s %10.1f %8.3f %12s %10.2f %7.1f%% %7.1f%% %7.1f%% %6s   (acceptance %.3f; repeats:", g->name, med[k], med[k] / med[0],
                    accs, tpv, 100.0 * g->t_draft / tt, 100.0 * g->t_verify / tt, 100.0 * g->t_glue / tt, g->same_as_first ? "yes" : "NO", acc);
        for (long r = 0; r < repeat; r++) fprintf(table, " %.1f", g->tps[r]);
        fprintf(table, ")\n");
        cJSON *jo = cJSON_CreateObject();
        cJSON_AddStringToObject(jo, "config", g->name);
        cJSON_AddNumberToObject(jo, "tok_per_s_median", med[k]);
        cJSON_AddNumberToObject(jo, "ratio_to_first", med[k] / med[0]);
        cJSON_AddNumberToObject(jo, "drafted", (double)g->drafted);
        cJSON_AddNumberToObject(jo, "accepted", (double)g->accepted);
        cJSON_AddNumberToObject(jo, "acceptance", acc);
        cJSON_AddNumberToObject(jo, "tokens_per_verify", tpv);
        cJSON_AddNumberToObject(jo, "draft_share", g->t_draft / tt);
        cJSON_AddBoolToObject(jo, "output_equals_first", g->same_as_first);
        cJSON *reps = cJSON_AddArrayToObject(jo, "tok_per_s");
        for (long r = 0; r < repeat; r++) cJSON_AddItemToArray(reps, cJSON_CreateNumber(g->tps[r]));
        cJSON_AddItemToArray(arr, jo);
    }
    const struct graph_stats gs = engine_graph_stats(m);
    if (gs.replayed + gs.recorded + gs.eager)
        fprintf(table, "forwards: %llu replayed from graphs, %llu recorded, %llu eager\n", (unsigned long long)gs.replayed,
                (unsigned long long)gs.recorded, (unsigned long long)gs.eager);
    bool written = true;
    if (json_path) {
        char *s = cJSON_Print(root);
        FILE *f = json_stdout ? stdout : fopen(json_path, "w");
        if (!s || !f || fputs(s, f) < 0 || fputc('\n', f) < 0 || fflush(f)) {
            fprintf(stderr, "error: cannot write %s\n", json_stdout ? "the JSON to stdout" : json_path);
            written = false;
        }
        if (f && !json_stdout) fclose(f);
        free(s);
    }
    cJSON_Delete(root);
    rc = written ? 0 : 1;
done:
    for (size_t p = 0; p < pl.n; p++) { if (ptoks) free(ptoks[p]); if (ref) free(ref[p]); }
    free(ptoks); free(np); free(ref); free(gen); free(tmp);
    for (int k = 0; k < n_cfg; k++) free(cfg[k].tps);
    spec_engine_free(eng);
    tokenizer_free(tok);
    model_free(m);
    backend_free(be);
    prompts_free(&pl);
    cli_common_free(&c);
    return rc;
}
