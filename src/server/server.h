/* server.h — `coti serve`: an OpenAI- and llama.cpp-compatible HTTP server over one loaded
 * model. Layout (one file per concept):
 *   http.c     transport: libmicrohttpd daemon, bodies and their limit, routing, JSON and SSE
 *              responses, client-disconnect detection
 *   routes.c   one handler per endpoint (parse -> submit -> wait -> format)
 *   openai.c   the JSON shapes: request fields, responses, stream chunks, errors, timings
 *   slots.c    the engine thread that owns the model, the request queue, per-request channels
 *   metrics.c  counters and the Prometheus text
 * Reference: ../shared/docs/server-api.md. Knows nothing of kernels or backends. */
#ifndef COTI_SERVER_H
#define COTI_SERVER_H

#include <stddef.h>

#include "model.h"
#include "sample.h"
#include "spec.h"
#include "tokenizer.h"

/* Largest request body accepted by default (413 beyond). 8 MiB holds the longest prompt that
 * can fit any context we serve (a full 1M-position context of token ids as JSON is ~7 MiB)
 * while bounding what one client can make us buffer; --max-body changes it. */
#define SERVER_MAX_BODY_DEFAULT ((size_t)8 << 20)

struct server_params {
    const char *host;            /* numeric IPv4/IPv6 address to bind (default 127.0.0.1) */
    int port;
    int n_parallel;              /* slots = model sequences */
    size_t max_body_bytes;
    const char *model_path;
    const char *model_alias;     /* name reported in /v1/models and responses (default: file name) */
    int n_ctx;                   /* positions per slot */
    int n_threads;
    int n_predict;               /* default n_predict of a request (-1 = until EOG / context) */
    struct sampler_params sampling; /* request defaults */
    bool seed_fixed;             /* --seed given: requests without a seed use it, else random */
    struct spec_params spec;     /* default speculation of every slot */
    const char *cors_origin;     /* --cors: the one browser origin allowed (NULL: no CORS headers) */
    const char *api_key;         /* --api-key: "Authorization: Bearer <key>" required (NULL: open) */
    const char *chat_template;   /* --chat-template(-file): the template text or name used instead
                                    of the model's (NULL: the model's) */
};

/* Serve until SIGINT or SIGTERM. m must have n_seq == p->n_parallel; tok and eng belong to m.
 * Returns 0 after a clean shutdown, or 1 (message printed) when the server cannot start. */
int server_run(const struct server_params *p, struct model *m, const struct tokenizer *tok,
               struct spec_engine *eng);

#endif
