/* serve.c — `coti serve`: the OpenAI-compatible HTTP server (src/server/). Parses the
 * options, loads the model with one sequence per slot and hands over to server_run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "server/server.h"
#include "tools.h"

#define SERVE_HOST_DEFAULT "127.0.0.1"
#define SERVE_PORT_DEFAULT 8080
#define SERVE_PARALLEL_DEFAULT 4
#define SERVE_N_PREDICT_DEFAULT (-1)

static void help(FILE *out, const struct cli_common *d) {
    fprintf(out, "usage: coti serve [-m MODEL] [--host H] [--port P] [--parallel N] [options]\n"
                 "An OpenAI-compatible HTTP server (docs/server.md). The sampling options below are the\n"
                 "defaults of requests that do not set them.\n"
                 "  --host H             address to listen on (default %s; [::1] or ::1 for IPv6)\n"
                 "  --port P             TCP port (default %d; 0 = any free port, printed at start)\n"
                 "  -np, --parallel N    slots: requests decoded at once, each its own sequence (default %d)\n"
                 "  -n, --n-predict N    default max tokens of a request (default %d = until EOG / context)\n"
                 "  -a, --alias NAME     model name in /v1/models and answers (default: the file name)\n"
                 "  --max-body BYTES     largest request body (default %zu; 413 beyond)\n"
                 "  --api-key KEY        require \"Authorization: Bearer KEY\" on every endpoint but /health\n"
                 "                       (default: $COTI_API_KEY when set, else no key)\n"
                 "  --cors ORIGIN        let pages of this browser origin (e.g. http://localhost:3000)\n"
                 "                       call the server (default: no CORS headers, browsers refuse)\n"
                 "  --no-warmup          skip recording every slot's decode and speculative steps at\n"
                 "                       start (a device with graphs; else the first request per slot pays)\n"
                 "  --chat-template NAME|TEXT  the chat template instead of the model's: chatml, gemma4 or\n"
                 "                       template text (recognised by its markers, not run as Jinja)\n"
                 "  --chat-template-file FILE  the same, read from a file\n"
                 "  --metrics, --slots   llama-server's switches for /metrics and /slots: accepted, both\n"
                 "                       are always on here\n",
            SERVE_HOST_DEFAULT, SERVE_PORT_DEFAULT, SERVE_PARALLEL_DEFAULT, SERVE_N_PREDICT_DEFAULT,
            (size_t)SERVER_MAX_BODY_DEFAULT);
}

struct serve_opts {
    struct server_params p;
    bool warmup;
    char host[256];              /* --host [v6] without its brackets */
    char *template_text;         /* --chat-template-file's contents (owned) */
};

/* A chat template file larger than this is not one (the longest shipped ones are ~20 KiB). */
#define CHAT_TEMPLATE_MAX_BYTES ((size_t)1 << 20)

enum { OPT_HOST = CLI_TOOL_CODE, OPT_PORT, OPT_PARALLEL, OPT_API_KEY, OPT_CORS, OPT_MAX_BODY, OPT_NO_WARMUP, OPT_ALWAYS_ON, OPT_CHAT_TEMPLATE,
       OPT_CHAT_TEMPLATE_FILE };

static int on_option(void *state, int code, const char *name, const char *v) {
    struct serve_opts *o = state;
    struct server_params *p = &o->p;
    long l;
    switch (code) {
    case OPT_HOST: {
        /* a bracketed IPv6 address, as in a URL, is the address inside */
        size_t n = strlen(v);
        if (n > 2 && v[0] == '[' && v[n - 1] == ']') {
            snprintf(o->host, sizeof o->host, "%.*s", (int)(n - 2), v + 1);
            p->host = o->host;
        } else {
            p->host = v;
        }
        return 0;
    }
    case OPT_PORT: if (cli_parse_int(name, v, 0, 65535, &l)) return -1; p->port = (int)l; return 0;
    case OPT_PARALLEL: if (cli_parse_int(name, v, 1, 256, &l)) return -1; p->n_parallel = (int)l; return 0;
    case 'n': if (cli_parse_int(name, v, -1, 1 << 30, &l)) return -1; p->n_predict = (int)l; return 0;
    case 'a': p->model_alias = v; return 0;
    case OPT_API_KEY:
        if (!*v) { fprintf(stderr, "error: --api-key needs a key\n"); return -1; }
        p->api_key = v;
        return 0;
    case OPT_CORS: {
        /* it becomes a response header: no control characters */
        bool ok = *v;
        for (const char *q = v; ok && *q; q++) ok = (unsigned char)*q >= 0x20 && *q != 0x7F;
        if (!ok) { fprintf(stderr, "error: --cors needs an origin such as http://localhost:3000\n"); return -1; }
        p->cors_origin = v;
        return 0;
    }
    case OPT_MAX_BODY: if (cli_parse_int(name, v, 1024, 1L << 30, &l)) return -1; p->max_body_bytes = (size_t)l; return 0;
    case OPT_NO_WARMUP: o->warmup = false; return 0;
    case OPT_ALWAYS_ON: return 0; /* llama-server's opt-ins for endpoints coti always serves */
    case OPT_CHAT_TEMPLATE:
        if (!*v) { fprintf(stderr, "error: --chat-template needs a name or a template\n"); return -1; }
        p->chat_template = v;
        return 0;
    case OPT_CHAT_TEMPLATE_FILE: {
        size_t n = 0;
        char *text = coti_read_file(v, CHAT_TEMPLATE_MAX_BYTES, &n);
        if (!text || !n || memchr(text, 0, n)) {
            fprintf(stderr, "error: --chat-template-file %s: %s\n", v,
                    !text ? "cannot read it (or over 1 MiB)" : "empty or not text");
            free(text);
            return -1;
        }
        free(o->template_text);
        o->template_text = text;
        p->chat_template = text;
        return 0;
    }
    }
    return -1;
}

int tool_serve_main(int argc, char **argv) {
    struct cli_common c;
    cli_common_defaults(&c);
    c.temperature = 0.8f; /* llama.cpp's server default; --temp overrides */
    c.seed_random = true;
    struct serve_opts o = {
        .p = {.host = SERVE_HOST_DEFAULT, .port = SERVE_PORT_DEFAULT, .n_parallel = SERVE_PARALLEL_DEFAULT,
              .max_body_bytes = SERVER_MAX_BODY_DEFAULT, .n_predict = SERVE_N_PREDICT_DEFAULT},
        .warmup = true,
    };
    static const struct option opts[] = {
        {"host", required_argument, NULL, OPT_HOST},
        {"port", required_argument, NULL, OPT_PORT},
        {"parallel", required_argument, NULL, OPT_PARALLEL},
        {"np", required_argument, NULL, OPT_PARALLEL},
        {"n-predict", required_argument, NULL, 'n'},
        {"alias", required_argument, NULL, 'a'},
        {"api-key", required_argument, NULL, OPT_API_KEY},
        {"cors", required_argument, NULL, OPT_CORS},
        {"max-body", required_argument, NULL, OPT_MAX_BODY},
        {"no-warmup", no_argument, NULL, OPT_NO_WARMUP},
        {"chat-template", required_argument, NULL, OPT_CHAT_TEMPLATE},
        {"chat-template-file", required_argument, NULL, OPT_CHAT_TEMPLATE_FILE},
        {"metrics", no_argument, NULL, OPT_ALWAYS_ON},
        {"slots", no_argument, NULL, OPT_ALWAYS_ON},
        {0},
    };
    const struct cli_tool tool = {.name = "serve", .help = help, .short_opts = "n:a:", .opts = opts,
                                  .on_option = on_option, .state = &o};
    int pr = cli_parse(&c, &tool, argc, argv);
    if (pr != CLI_PARSE_OK) return pr == CLI_PARSE_EXIT ? 0 : 1;
    if (c.grammar_text) {
        fprintf(stderr, "error: --grammar / --grammar-file / --json-schema: a grammar is per request (the `grammar`, `json_schema` or `response_format` field)\n");
        cli_common_free(&c);
        return 1;
    }
    struct server_params p = o.p;
    const bool warmup = o.warmup;
    p.seed_fixed = c.seed_given;
    if (c.spec.n_min > c.spec.n_max) {
        fprintf(stderr, "error: --spec-n-min (%d) exceeds --spec-n-max (%d)\n", c.spec.n_min, c.spec.n_max);
        return 1;
    }
    /* the environment keeps the key out of `ps` */
    const char *env_key = getenv("COTI_API_KEY");
    if (!p.api_key && env_key && *env_key) p.api_key = env_key;
    p.model_path = c.model_path;
    p.n_ctx = c.n_ctx;
    p.n_threads = c.n_threads;
    p.sampling = sampler_params_basic(c.temperature, c.top_k, c.top_p, c.min_p, c.seed);
    p.spec = c.spec;

    struct backend *be;
    struct model *m;
    if (cli_open_model(&c, p.n_parallel, SPEC_MAX_DRAFT + 1, &be, &m)) return 1;
    char err[512];
    struct tokenizer *tok = NULL;
    struct spec_engine *eng = NULL;
    int rc = 1;
    if (tokenizer_init(&tok, m->gguf, err, sizeof err)) { fprintf(stderr, "error: %s\n", err); goto done; }
    if (spec_engine_init(&eng, m, c.draft_path, err, sizeof err)) { fprintf(stderr, "error: %s\n", err); goto done; }
    if (!spec_engine_supports(eng, c.spec.drafter)) {
        fprintf(stderr, "error: --spec %s is not available for this model\n", drafter_kind_name(c.spec.drafter));
        goto done;
    }
    if (warmup && m->be->capture_begin) {
        static const char text[] = "int main(void)\n{\n    return 0;\n}\n";
        int32_t *wt = NULL;
        size_t n_wt = 0;
        int64_t t0 = coti_time_us();
        if (tokenizer_encode(tok, text, sizeof text - 1, false, false, &wt, &n_wt, err, sizeof err) ||
            (n_wt && spec_engine_warmup(eng, wt, (int)n_wt, &p.sampling, &p.spec, 64, err, sizeof err))) {
            fprintf(stderr, "error: warmup: %s\n", err);
            free(wt);
            goto done;
        }
        free(wt);
        coti_log(COTI_LOG_INFO, "serve", "warmup: %d slots recorded in %.0f ms", p.n_parallel,
                 (coti_time_us() - t0) / 1e3);
    }
    if (p.n_parallel > 1) {
        /* busy slots decode in batched cycles, whose draft depths follow what verify rows cost */
        int64_t t0 = coti_time_us();
        if (spec_engine_calibrate(eng, err, sizeof err)) {
            fprintf(stderr, "error: calibration: %s\n", err);
            goto done;
        }
        coti_log(COTI_LOG_INFO, "serve", "verify cost: 1 sequence x 1 row %.0f us, x 2 rows %.0f us; 4 sequences x 1 row %.0f "
                 "us, x 2 rows %.0f us; 16 sequences x 1 row %.0f us (calibrated in %.0f ms)",
                 spec_engine_verify_cost_us(eng, 1, 1), spec_engine_verify_cost_us(eng, 1, 2),
                 spec_engine_verify_cost_us(eng, 4, 1), spec_engine_verify_cost_us(eng, 4, 2),
                 spec_engine_verify_cost_us(eng, 16, 1), (coti_time_us() - t0) / 1e3);
    }
    rc = server_run(&p, m, tok, eng);
done:
    free(o.template_text);
    spec_engine_free(eng);
    tokenizer_free(tok);
    model_free(m);
    backend_free(be);
    return rc;
}
