/* serve.c — `coti serve`: the OpenAI-compatible HTTP server (src/server/). Parses the
 * options, loads the model with one sequence per slot and hands over to server_run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "server/server.h"
#include "tools.h"

static void usage(void) {
    fprintf(stderr, "usage: coti serve [-m MODEL] [--host H] [--port P] [--parallel N] [options]\n"
                    "  --host H             address to listen on (default 127.0.0.1)\n"
                    "  --port P             TCP port (default 8080; 0 = any free port, printed at start)\n"
                    "  -np, --parallel N    slots: requests decoded at once, each its own sequence (default 4)\n"
                    "  -n, --n-predict N    default max tokens of a request (default -1 = until EOG / context)\n"
                    "  -a, --alias NAME     model name in /v1/models and answers (default: the file name)\n"
                    "  --max-body BYTES     largest request body (default %zu; 413 beyond)\n"
                    "  --api-key KEY        require \"Authorization: Bearer KEY\" on every endpoint but /health\n"
                    "                       (default: $COTI_API_KEY when set, else no key)\n"
                    "  --cors ORIGIN        let pages of this browser origin (e.g. http://localhost:3000)\n"
                    "                       call the server (default: no CORS headers, browsers refuse)\n"
                    "  --no-warmup          skip recording every slot's decode and speculative steps at\n"
                    "                       start (a device with graphs; else the first request per slot pays)\n"
                    "Request defaults come from the sampling options below (temperature 0.8 unless --temp);\n"
                    "requests without a seed get a random one unless --seed is given.\n%s",
            SERVER_MAX_BODY_DEFAULT, cli_common_help());
}

int tool_serve_main(int argc, char **argv) {
    struct cli_common c;
    cli_common_defaults(&c);
    c.temperature = 0.8f; /* llama.cpp's server default; --temp overrides */
    struct server_params p = {.host = "127.0.0.1", .port = 8080, .n_parallel = 4, .max_body_bytes = SERVER_MAX_BODY_DEFAULT,
                              .n_predict = -1};
    long l;
    bool warmup = true;
    for (int i = 1; i < argc;) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--seed")) p.seed_fixed = true;
        if (!strcmp(a, "--no-warmup")) { warmup = false; i++; continue; }
        int r = cli_parse_common(&c, argc, argv, &i);
        if (r < 0) return 1;
        if (r > 0) continue;
        if (!strcmp(a, "--host")) {
            if (!v) { usage(); return 1; }
            p.host = v;
        } else if (!strcmp(a, "--port")) {
            if (cli_parse_int(a, v, 0, 65535, &l)) return 1;
            p.port = (int)l;
        } else if (!strcmp(a, "-np") || !strcmp(a, "--parallel")) {
            if (cli_parse_int(a, v, 1, 256, &l)) return 1;
            p.n_parallel = (int)l;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            if (cli_parse_int(a, v, -1, 1 << 30, &l)) return 1;
            p.n_predict = (int)l;
        } else if (!strcmp(a, "-a") || !strcmp(a, "--alias")) {
            if (!v) { usage(); return 1; }
            p.model_alias = v;
        } else if (!strcmp(a, "--api-key")) {
            if (!v || !*v) { usage(); return 1; }
            p.api_key = v;
        } else if (!strcmp(a, "--cors")) {
            /* it becomes a response header: no control characters */
            bool ok = v && *v;
            for (const char *q = v; ok && *q; q++) ok = (unsigned char)*q >= 0x20 && *q != 0x7F;
            if (!ok) { fprintf(stderr, "error: --cors needs an origin such as http://localhost:3000\n"); return 1; }
            p.cors_origin = v;
        } else if (!strcmp(a, "--max-body")) {
            if (cli_parse_int(a, v, 1024, 1L << 30, &l)) return 1;
            p.max_body_bytes = (size_t)l;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        } else {
            fprintf(stderr, "error: unknown option '%s'\n", a);
            usage();
            return 1;
        }
        i += !strcmp(a, "-h") || !strcmp(a, "--help") ? 1 : 2;
    }
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
    rc = server_run(&p, m, tok, eng);
done:
    spec_engine_free(eng);
    tokenizer_free(tok);
    model_free(m);
    backend_free(be);
    return rc;
}
