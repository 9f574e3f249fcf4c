/* logits.c — `coti logits`: teacher-forced next-token distributions for every position, the
 * interface through which coti's numerics are compared with other engines (llama.cpp, HF).
 * For each row i it prints the token ids[i] and the top-N (id, logprob) of the prediction of
 * ids[i+1]. With --mtp the rows come from the NextN head instead, in llama.cpp's draft-mtp
 * convention: row i is fed the target's post-norm hidden at i-1 (zero for i = 0) and ids[i].
 * With --mtp --spec-draft FILE they come from that gemma4-assistant drafter, in the same
 * convention: row i is its first draft step at position i, the target having committed ids[0..i)
 * (the target runs token by token: a sliding layer's ring holds only the window before i); row 0
 * is left out, as a draft never starts there. --draft-step K: row i+K-1 is instead the K-th step
 * of a draft round: for the assistant the round at position i, fed ids[i..i+K) in turn and its
 * own next-hidden row from step 2 on (a round's steps all sit at position i); for the NextN head
 * the chain from row i (positions i..i+K-1), each row fed the head's own output hidden of the
 * row before, the chained rows dropped from the head's cache afterwards: the rows llama.cpp's
 * driver drafts with (coti drafts NextN rows through a cheaper copy of the LM head; these are
 * the exact head's logits). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "equiv.h"
#include "models/gemma4_assistant.h"
#include "tokenizer.h"
#include "tools.h"

#define LOGITS_TOP_DEFAULT 20

static void help(FILE *out, const struct cli_common *d) {
    fprintf(out, "usage: coti logits [-m MODEL] (-p PROMPT | --tokens 1,2,3) [--top N] [--json] [--mtp [--spec-draft FILE] [--draft-step K]]\n"
                 "Teacher-forced top-N next-token logprobs of every position.\n"
                 "  -p, --prompt TEXT    the text (tokenized with special tokens parsed)\n"
                 "  --tokens LIST        token ids, comma-separated\n"
                 "  --top N              logprobs per row (default %d)\n"
                 "  --json               one JSON object on stdout instead of a line per row\n"
                 "  --mtp                rows of the NextN head (llama.cpp's draft-mtp convention)\n"
                 "  --spec-draft FILE    with --mtp: rows of that gemma4-assistant drafter instead, from position 1\n"
                 "  --draft-step K       with --mtp: the K-th draft step's rows, fed the drafter's own hidden (default 1)\n",
            LOGITS_TOP_DEFAULT);
}

static int parse_tokens(const char *s, int32_t **out, size_t *n) {
    size_t cap = 16, k = 0;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return -1;
    for (const char *p = s; *p;) {
        char *end;
        long x = strtol(p, &end, 10);
        if (end == p || x < 0 || x > INT32_MAX) { free(v); return -1; }
        if (k == cap) {
            int32_t *nv = realloc(v, (cap *= 2) * sizeof *v);
            if (!nv) { free(v); return -1; }
            v = nv;
        }
        v[k++] = (int32_t)x;
        p = end;
        if (*p == ',') p++;
        else if (*p) { free(v); return -1; }
    }
    *out = v;
    *n = k;
    return 0;
}

/* Top-n of one row as (id, logprob) pairs: the gate's own top-k (equiv.h), as JSON. */
static cJSON *row_top(const float *x, int V, int n_top) {
    struct equiv_row r;
    equiv_row_from_logits(x, V, n_top, &r);
    cJSON *arr = cJSON_CreateArray();
    for (int j = 0; j < r.n; j++) {
        cJSON *e = cJSON_CreateArray();
        cJSON_AddItemToArray(e, cJSON_CreateNumber(r.id[j]));
        cJSON_AddItemToArray(e, cJSON_CreateNumber(r.logprob[j]));
        cJSON_AddItemToArray(arr, e);
    }
    return arr;
}

/* One output row: its position, its token and the top-n of its logits. */
static void add_row(cJSON *rows, size_t pos, int32_t token, const float *logits, int V, int n_top) {
    cJSON *row = cJSON_CreateObject();
    cJSON_AddNumberToObject(row, "pos", (double)pos);
    cJSON_AddNumberToObject(row, "token", token);
    cJSON_AddItemToObject(row, "top", row_top(logits, V, n_top));
    cJSON_AddItemToArray(rows, row);
}

struct logits_opts {
    const char *prompt, *tokens;
    long n_top, draft_step;
    bool json, mtp;
};

enum { OPT_TOKENS = CLI_TOOL_CODE, OPT_TOP, OPT_JSON, OPT_MTP, OPT_DRAFT_STEP };

static int on_option(void *state, int code, const char *name, const char *v) {
    struct logits_opts *o = state;
    switch (code) {
    case 'p': o->prompt = v; return 0;
    case OPT_TOKENS: o->tokens = v; return 0;
    case OPT_TOP: return cli_parse_int(name, v, 1, EQUIV_MAX_TOP, &o->n_top);
    case OPT_JSON: o->json = true; return 0;
    case OPT_MTP: o->mtp = true; return 0;
    case OPT_DRAFT_STEP: return cli_parse_int(name, v, 1, SPEC_MAX_DRAFT, &o->draft_step);
    }
    return -1;
}

/* --mtp --spec-draft: the assistant's step-K rows (module comment), appended to rows. The
 * target runs for its hidden rows only: its logits would be read by nobody. */
static int assistant_rows(struct model *m, struct gemma4_assistant *a, const int32_t *toks, size_t n, int K, int n_top,
                          float *logits, cJSON *rows) {
    struct backend *be = m->be;
    const int V = m->info.n_vocab;
    char err[512];
    int32_t *tok_dev = be->alloc(be, sizeof(int32_t)); /* steps 2.. take their token from here */
    if (!tok_dev) { fprintf(stderr, "error: out of memory\n"); return 1; }
    const bool no_logits = false;
    for (size_t i = 1; i + (size_t)K - 1 < n; i++) {
        const int32_t p = (int32_t)i - 1;
        const struct model_batch b = {.n = 1, .tokens = toks + i - 1, .pos = &p, .want_logits = &no_logits};
        struct model_output out;
        if (model_forward(m, &b, &out, err, sizeof err)) {
            fprintf(stderr, "error: %s\n", err);
            be->free(be, tok_dev);
            return 1;
        }
        const float *lg, *h = out.hidden;
        const int32_t *t = gemma4_assistant_at(a, 0, (int)i, toks[i]);
        for (int k = 0; k < K; k++) {
            if (k > 0) {
                be->upload(be, tok_dev, &toks[i + (size_t)k], sizeof(int32_t));
                t = tok_dev;
            }
            gemma4_assistant_step(a, t, h, NULL, &lg, &h);
        }
        be->download(be, logits, lg, sizeof(float) * (size_t)V);
        add_row(rows, i + (size_t)K - 1, toks[i + (size_t)K - 1], logits, V, n_top);
    }
    be->free(be, tok_dev);
    return 0;
}

/* --mtp --draft-step K on the NextN head: the chained rows (module comment), appended to rows.
 * hidden: row i = the target's hidden of position i-1; h_dev: backend memory for one row. */
static int nextn_chain_rows(struct model *m, const int32_t *toks, size_t n, int K, const float *hidden, float *h_dev,
                            int n_top, float *logits, cJSON *rows) {
    const struct model_nextn *head = model_nextn(m);
    struct backend *be = m->be;
    const int V = m->info.n_vocab, E = m->info.n_embd;
    char err[512];
    for (size_t i = 0; i + (size_t)K - 1 < n; i++) {
        struct model_output out;
        const float *h = h_dev;
        be->upload(be, h_dev, hidden + i * (size_t)E, sizeof(float) * (size_t)E);
        for (int k = 0; k < K; k++) {
            const int32_t p = (int32_t)i + k;
            const bool want = k == K - 1; /* only the last row's logits are read */
            const struct model_batch b = {.n = 1, .tokens = toks + i + (size_t)k, .pos = &p, .want_logits = &want};
            if (head->forward(m, &b, h, &out, err, sizeof err)) { fprintf(stderr, "error: %s\n", err); return 1; }
            h = out.hidden; /* read by the next row before it writes its own (drafters/mtp.c) */
        }
        head->seq_truncate(m, 0, (int)i + 1);
        be->download(be, logits, out.logits, sizeof(float) * (size_t)V);
        add_row(rows, i + (size_t)K - 1, toks[i + (size_t)K - 1], logits, V, n_top);
    }
    return 0;
}

int tool_logits_main(int argc, char **argv) {
    struct cli_common c;
    cli_common_defaults(&c);
    struct logits_opts o = {.n_top = LOGITS_TOP_DEFAULT, .draft_step = 1};
    static const struct option opts[] = {
        {"prompt", required_argument, NULL, 'p'},
        {"tokens", required_argument, NULL, OPT_TOKENS},
        {"top", required_argument, NULL, OPT_TOP},
        {"json", no_argument, NULL, OPT_JSON},
        {"mtp", no_argument, NULL, OPT_MTP},
        {"draft-step", required_argument, NULL, OPT_DRAFT_STEP},
        {0},
    };
    const struct cli_tool tool = {.name = "logits", .help = help, .short_opts = "p:", .opts = opts,
                                  .on_option = on_option, .state = &o};
    int pr = cli_parse(&c, &tool, argc, argv);
    if (pr != CLI_PARSE_OK) return pr == CLI_PARSE_EXIT ? 0 : 1;
    if (c.grammar_text) {
        fprintf(stderr, "error: --grammar / --grammar-file / --json-schema: logits are unconstrained: no grammar here\n");
        cli_common_free(&c);
        return 1;
    }
    const char *prompt = o.prompt, *tokens_arg = o.tokens;
    const long n_top = o.n_top;
    const bool json = o.json, mtp = o.mtp;
    if (!prompt == !tokens_arg) { fprintf(stderr, "error: give exactly one of -p and --tokens\n"); return 1; }
    int32_t *toks = NULL;
    size_t n = 0;
    struct backend *be;
    struct model *m;
    if (cli_open_model(&c, 1, 0, &be, &m)) return 1;
    char err[512];
    struct tokenizer *tok = NULL;
    struct gemma4_assistant *assistant = NULL;
    int rc = 1;
    float *logits = NULL, *hidden = NULL, *h_in_dev = NULL;
    int32_t *pos = NULL;
    cJSON *root = NULL;
    const int V = m->info.n_vocab, E = m->info.n_embd;
    if (tokenizer_init(&tok, m->gguf, err, sizeof err)) { fprintf(stderr, "error: %s\n", err); goto done; }
    if (prompt) {
        if (tokenizer_encode(tok, prompt, strlen(prompt), true, true, &toks, &n, err, sizeof err)) { fprintf(stderr, "error: %s\n", err); goto done; }
    } else if (parse_tokens(tokens_arg, &toks, &n)) {
        fprintf(stderr, "error: --tokens expects comma-separated non-negative integers\n");
        goto done;
    }
    if (n == 0 || (long)n > c.n_ctx) { fprintf(stderr, "error: %zu tokens (need 1..%d)\n", n, c.n_ctx); goto done; }
    for (size_t i = 0; i < n; i++)
        if (toks[i] >= V) { fprintf(stderr, "error: token %d out of range [0, %d)\n", toks[i], V); goto done; }
    if (c.draft_path && !mtp) { fprintf(stderr, "error: --spec-draft here gives the drafter's rows: add --mtp\n"); goto done; }
    if (o.draft_step > 1 && !mtp) { fprintf(stderr, "error: --draft-step is for a drafter's rows (--mtp)\n"); goto done; }
    if (c.draft_path && gemma4_assistant_load(&assistant, c.draft_path, m, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        goto done;
    }
    if (mtp && !assistant && !model_nextn(m)) { fprintf(stderr, "error: the model has no NextN head\n"); goto done; }

    const int nb = c.n_batch;
    logits = malloc(sizeof(float) * (size_t)V * nb);
    hidden = calloc((n + 1) * (size_t)E, sizeof(float)); /* row 0 = zero, row i+1 = hn_i */
    pos = malloc(sizeof(int32_t) * n);
    bool *want = malloc(sizeof(bool) * (size_t)nb);
    h_in_dev = be->alloc(be, sizeof(float) * (size_t)E * nb);
    if (!logits || !hidden || !pos || !want || !h_in_dev) { free(want); fprintf(stderr, "error: out of memory\n"); goto done; }
    for (int i = 0; i < nb; i++) want[i] = true;
    for (size_t i = 0; i < n; i++) pos[i] = (int32_t)i;
    root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "model", c.model_path);
    cJSON_AddStringToObject(root, "head", assistant ? "assistant" : mtp ? "mtp" : "main");
    cJSON_AddNumberToObject(root, "n_vocab", V);
    cJSON *jt = cJSON_AddArrayToObject(root, "tokens");
    for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(jt, cJSON_CreateNumber(toks[i]));
    cJSON *rows = cJSON_AddArrayToObject(root, "rows");
    struct model_output out;
    if (assistant && assistant_rows(m, assistant, toks, n, (int)o.draft_step, (int)n_top, logits, rows)) {
        free(want);
        goto done;
    }
    const bool chain = mtp && !assistant && o.draft_step > 1;
    for (int pass = 0; !assistant && pass < (mtp && !chain ? 2 : 1); pass++) {
        for (size_t i0 = 0; i0 < n; i0 += (size_t)nb) {
            int cnt = (int)COTI_MIN((size_t)nb, n - i0);
            struct model_batch b = {.n = cnt, .tokens = toks + i0, .pos = pos + i0, .want_logits = want,
                                    .prompt = model_prompt_family(m, (int)n)};
            int frc;
            if (pass == 0) {
                frc = model_forward(m, &b, &out, err, sizeof err);
            } else {
                be->upload(be, h_in_dev, hidden + i0 * E, sizeof(float) * (size_t)E * cnt);
                frc = model_nextn(m)->forward(m, &b, h_in_dev, &out, err, sizeof err);
            }
            if (frc) { fprintf(stderr, "error: %s\n", err); free(want); goto done; }
            if (pass == 0) be->download(be, hidden + (i0 + 1) * E, out.hidden, sizeof(float) * (size_t)E * cnt);
            if (pass == 0 && mtp) continue;
            be->download(be, logits, out.logits, sizeof(float) * (size_t)V * cnt);
            for (int r = 0; r < cnt; r++) add_row(rows, i0 + (size_t)r, toks[i0 + r], logits + (size_t)r * V, V, (int)n_top);
        }
    }
    free(want);
    if (chain && nextn_chain_rows(m, toks, n, (int)o.draft_step, hidden, h_in_dev, (int)n_top, logits, rows)) goto done;
    if (json) {
        char *s = cJSON_PrintUnformatted(root);
        if (!s) { fprintf(stderr, "error: out of memory\n"); goto done; }
        puts(s);
        free(s);
    } else {
        cJSON *row;
        cJSON_ArrayForEach(row, rows) {
            printf("%4d %6d:", cJSON_GetObjectItem(row, "pos")->valueint, cJSON_GetObjectItem(row, "token")->valueint);
            cJSON *e;
            cJSON_ArrayForEach(e, cJSON_GetObjectItem(row, "top"))
                printf(" %d:%.4f", cJSON_GetArrayItem(e, 0)->valueint, cJSON_GetArrayItem(e, 1)->valuedouble);
            putchar('\n');
        }
    }
    rc = 0;
done:
    cJSON_Delete(root);
    gemma4_assistant_free(assistant);
    if (h_in_dev) be->free(be, h_in_dev);
    free(logits); free(hidden); free(pos); free(toks);
    tokenizer_free(tok);
    model_free(m);
    backend_free(be);
    return rc;
}
