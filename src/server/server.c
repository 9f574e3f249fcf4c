/* server.c — server_run: wires the model to the slots, the routes and the HTTP daemon, then
 * waits for SIGINT/SIGTERM and shuts down in the order that answers every request in flight:
 * the daemon stops accepting (new requests get 503), the engine stops (its tasks end with
 * 503), the daemon waits for the answers to go out and stops, then the memory. */
#include "server/server.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "chat.h"
#include "server/http.h"
#include "server/metrics.h"
#include "server/routes.h"
#include "server/slots.h"

int server_run(const struct server_params *p, struct model *m, const struct tokenizer *tok,
               struct spec_engine *eng) {
    /* block the stop signals before any thread starts, so they all inherit the mask and
     * only sigwait below receives them */
    sigset_t stop_set, old_set;
    sigemptyset(&stop_set);
    sigaddset(&stop_set, SIGINT);
    sigaddset(&stop_set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_set, &old_set);
    signal(SIGPIPE, SIG_IGN); /* a client gone mid-write is an error return, not a death */

    const char *tmpl = p->chat_template ? p->chat_template : m->info.chat_template;
    const char *chat_template = tmpl;
    if (tmpl && chat_detect_format(tmpl) == CHAT_FORMAT_UNKNOWN) {
        coti_log(COTI_LOG_WARN, "server", "chat template not recognised: using ChatML");
        chat_template = "chatml";
    }
    const char *name = p->model_alias;
    if (!name) {
        const char *slash = strrchr(p->model_path, '/');
        name = slash ? slash + 1 : p->model_path;
    }

    struct metrics mx;
    metrics_init(&mx);
    struct routes r = {
        .oc = {.tok = tok, .eng = eng, .chat_template = chat_template, .model_name = name, .n_ctx = m->n_ctx,
               .n_vocab = m->info.n_vocab, .n_parallel = m->n_seq, .n_predict = p->n_predict, .sampling = p->sampling,
               .seed_fixed = p->seed_fixed, .spec = p->spec},
        .p = p,
        .m = m,
        .mx = &mx,
        .chat_template_text = tmpl ? tmpl : "",
        .model_size_bytes = (long)m->info.n_bytes,
        .n_params = (long)m->info.n_params,
        .t_start_unix = mx.t_start_unix,
    };
    pthread_mutex_init(&r.json_mu, NULL);
    char err[256];
    int rc = 1, bound_port = 0;
    struct http_server *h = NULL;
    /* the vocabulary's pieces for grammar masks, once for every request */
    struct grammar_vocab *gv = NULL;
    if (grammar_vocab_init(&gv, tok, m->info.n_vocab, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        goto done;
    }
    r.oc.spec.grammar_vocab = gv;
    if (slots_init(&r.slots, m, eng, tok, &mx, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        goto done;
    }
    struct http_options ho = {.host = p->host, .port = p->port, .max_body = p->max_body_bytes, .cors_origin = p->cors_origin};
    if (http_start(&h, &ho, &r, &bound_port, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        goto done;
    }
    /* machine-readable: tests started with --port 0 read the port from this line */
    /* an IPv6 address is bracketed in a URL (RFC 3986 §3.2.2) */
    const bool v6 = strchr(p->host, ':') != NULL;
    coti_log(COTI_LOG_INFO, "server", "listening on http://%s%s%s:%d (model %s, %d slots, context %d, spec %s n_max %d)",
             v6 ? "[" : "", p->host, v6 ? "]" : "", bound_port, name, m->n_seq, m->n_ctx, drafter_kind_name(p->spec.drafter), p->spec.n_max);
    int sig = 0;
    sigwait(&stop_set, &sig);
    coti_log(COTI_LOG_INFO, "server", "signal %d: shutting down", sig);
    /* refuse new work first, so every request that got in is answered (503 by the engine's
     * stop at worst) before the daemon closes its connections */
    http_drain(h);
    rc = 0;
done:
    slots_stop(r.slots);
    http_stop(h);
    slots_free(r.slots);
    grammar_vocab_free(gv);
    pthread_mutex_destroy(&r.json_mu);
    metrics_free(&mx);
    pthread_sigmask(SIG_SETMASK, &old_set, NULL);
    return rc;
}
