/* routes.h — the endpoints: one handler per path (server-api.md §2), each parsing its body,
 * submitting work to the slots and formatting the answer. */
#ifndef COTI_SERVER_ROUTES_H
#define COTI_SERVER_ROUTES_H

#include <microhttpd.h>
#include <pthread.h>

#include "server/metrics.h"
#include "server/openai.h"
#include "server/server.h"
#include "server/slots.h"

struct http_exchange;

struct routes {
    struct openai_ctx oc;
    const struct server_params *p;
    struct model *m;
    struct slots *slots;
    struct metrics *mx;
    const char *chat_template_text;  /* as in the GGUF ("" when absent), for /props */
    long model_size_bytes, n_params;
    int64_t t_start_unix;
    pthread_mutex_t json_mu;         /* cJSON's parser writes a process-global error record */
};

/* Answer the complete request x (body read). Returns the MHD_Result of the access handler. */
enum MHD_Result routes_handle(struct routes *r, struct http_exchange *x);
/* Count one answered HTTP request (r may be NULL). */
void routes_count_http(struct routes *r, int status);

#endif
