/* http.h — the transport: a libmicrohttpd daemon with one thread per connection (handlers
 * may block while the engine works), request bodies up to a limit, JSON / text / SSE
 * responses, and detection of clients that went away. Knows nothing of the endpoints: every
 * complete request goes to routes_handle (routes.h). */
#ifndef COTI_SERVER_HTTP_H
#define COTI_SERVER_HTTP_H

#include <microhttpd.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct openai_error;
struct routes;

/* Most connections served at once; each holds a thread (stack below) while it is open.
 * 256 is four times the largest load we test (64 clients) and bounds threads and memory. */
#define HTTP_MAX_CONNECTIONS 256
/* Handlers are shallow (cJSON's parser recursion is capped at 1000 levels of small frames);
 * 1 MiB leaves room for the sanitizers' larger frames. */
#define HTTP_THREAD_STACK_BYTES ((size_t)1 << 20)
/* A keep-alive connection idle this long is closed. */
#define HTTP_IDLE_TIMEOUT_S 120
/* An oversized body is read and dropped so the 413 reaches a client that is still sending;
 * past this many dropped bytes the connection is answered and closed at once. */
#define HTTP_MAX_DISCARD_BYTES ((size_t)64 << 20)
/* How often a handler waiting on the engine checks whether its client is still there. */
#define HTTP_POLL_MS 100
/* SSE keep-alive comment (":\n\n") after this long without an event (llama.cpp: 30 s). */
#define HTTP_SSE_PING_S 30

/* One request in progress (owned by http.c; valid until the request completes). */
struct http_exchange {
    struct MHD_Connection *conn;
    const char *method, *url;
    char *body;                  /* NUL-terminated, n_body bytes */
    size_t n_body, cap_body, n_dropped;
    bool too_large;
    long id;                     /* request number, for the log */
    int64_t t_start_us;
    int status;                  /* of the answer queued, 0 before */
    bool log_by_stream;          /* a streamed answer writes the log line itself */
    char note[384];              /* what the log line adds after the status */
};

/* Queue an answer; each takes ownership of the malloc'ed text (NULL = out of memory, which
 * becomes a 500). Return the MHD_Result for the access handler. */
enum MHD_Result http_send_json(struct http_exchange *x, int status, char *json);
enum MHD_Result http_send_text(struct http_exchange *x, int status, const char *content_type, char *text);
enum MHD_Result http_send_error(struct http_exchange *x, const struct openai_error *e);
/* 405 with the Allow header listing the methods the path has. */
enum MHD_Result http_send_error_allow(struct http_exchange *x, const struct openai_error *e, const char *allow);
/* 204 answer to a CORS preflight (OPTIONS) for a path allowing these methods. */
enum MHD_Result http_send_preflight(struct http_exchange *x, const char *allow);
/* A streamed answer (text/event-stream, status 200) produced by reader; free_cb runs when
 * the connection is done with it (also when the client went away). */
enum MHD_Result http_send_stream(struct http_exchange *x, MHD_ContentReaderCallback reader, void *cls,
                                 MHD_ContentReaderFreeCallback free_cb);
/* True when the peer has closed (or reset) the connection: poll + peek, without consuming. */
bool http_client_gone(struct MHD_Connection *conn);
/* Write one log line for a finished request (thread-safe, one line). */
void http_log_request(long id, const char *method, const char *url, int status, int64_t t_start_us,
                      const char *note, bool aborted);

struct http_server;
/* Listen on host:port (port 0: any free port; *bound_port gets it). Returns 0 or -1 with err. */
int http_start(struct http_server **out, const char *host, int port, size_t max_body, struct routes *r,
               int *bound_port, char *err, size_t err_size);
void http_stop(struct http_server *h);

#endif
