/* http.h — the transport: a libmicrohttpd daemon (epoll, a small thread pool; a complete
 * request runs on a worker thread of its own, so handlers may block while the engine works)
 * behind a gate that accepts connections and answers malformed first request heads (gate.h),
 * deadlines and connection caps, request bodies up to a limit, JSON / text / SSE responses,
 * CORS, draining at shutdown, and detection of clients that went away. Knows nothing of the endpoints: every
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

/* Connections open at once, at most (closed as accepted beyond); each costs a descriptor and
 * a little memory, no thread. Beyond HTTP_SOFT_CONNECTIONS, a complete request is answered
 * 503 (Retry-After) instead. */
#define HTTP_MAX_CONNECTIONS 4096
#define HTTP_SOFT_CONNECTIONS 3584
/* Connections of one client address: beyond the soft cap its requests get 503; connections
 * beyond twice that are closed as accepted, so one client cannot hold every descriptor. */
#define HTTP_PER_IP_CONNECTIONS 128
/* Threads running MHD's epoll loops; they never wait for the engine (see http.c). */
#define HTTP_POOL_THREADS 4
/* Requests handled at once (one worker thread each, while the engine works); 503 beyond. */
#define HTTP_MAX_WORKERS 1024
/* Pool and worker thread stacks. Handlers are shallow (cJSON's parser recursion is capped at
 * 1000 levels of small frames); 1 MiB leaves room for the sanitizers' larger frames. */
#define HTTP_THREAD_STACK_BYTES ((size_t)1 << 20)
/* Deadlines that incoming bytes do not extend: a connection must deliver a request's headers
 * within HTTP_HEADER_DEADLINE_S of opening (or of its previous answer: keep-alive idling ends
 * there too), and the body within HTTP_BODY_DEADLINE_S of the headers; else it is closed. */
#define HTTP_HEADER_DEADLINE_S 10
#define HTTP_BODY_DEADLINE_S 60
/* A connection whose answer makes no progress this long (a client that stopped reading) is
 * closed by MHD. */
#define HTTP_IDLE_TIMEOUT_S 120
/* Seconds a client is told to wait (Retry-After) when refused for load or shutdown. */
#define HTTP_RETRY_AFTER_S 1
/* Request line plus headers beyond this: 431 (JSON); a URL beyond HTTP_MAX_URL_BYTES: 414.
 * The gate checks them on a connection's first head, answer_early on later ones; MHD's own
 * buffer (HTTP_CONNECTION_MEMORY) is larger so these limits, not MHD's HTML answers, are
 * what clients meet. */
#define HTTP_MAX_HEADER_BYTES ((size_t)16 << 10)
#define HTTP_MAX_URL_BYTES ((size_t)8 << 10)
#define HTTP_CONNECTION_MEMORY ((size_t)64 << 10)
/* Header fields + query arguments + cookies of one request, at most (431 beyond): MHD keeps a
 * 64-byte record for each in the half of HTTP_CONNECTION_MEMORY that its read buffer leaves,
 * along with a copy of the Cookie header; 128 records (8 KiB) + a 16 KiB cookie fit. */
#define HTTP_MAX_FIELDS 128
/* An oversized body announced by Content-Length is refused (413) before it is read; one
 * that turns out oversized (chunked) is read and dropped so the 413 reaches a client still
 * sending; past this many dropped bytes the connection is answered and closed at once. */
#define HTTP_MAX_DISCARD_BYTES ((size_t)64 << 20)
/* Formatted stream bytes a worker may hold ahead of a slow reader before it waits. */
#define HTTP_STREAM_BUFFER_BYTES ((size_t)64 << 10)
/* At shutdown, how long answers in flight get to finish before the daemon stops. */
#define HTTP_DRAIN_DEADLINE_S 10
/* How often a handler waiting on the engine checks whether its client is still there. */
#define HTTP_POLL_MS 100
/* SSE keep-alive comment (":\n\n") after this long without an event (llama.cpp: 30 s). */
#define HTTP_SSE_PING_S 30

struct http_server;
struct http_conn;
struct http_pump;

/* One request in progress (owned by http.c; valid until the request completes). */
struct http_exchange {
    struct MHD_Connection *conn;
    struct http_server *server;
    struct http_conn *hc;        /* the connection's state (deadlines, client address) */
    const char *method, *url, *version;
    char *body;                  /* NUL-terminated, n_body bytes */
    size_t n_body, cap_body, n_dropped;
    bool too_large;
    long id;                     /* request number, for the log */
    int64_t t_start_us;
    int status;                  /* of the answer queued, 0 before */
    bool log_by_stream;          /* a streamed answer writes the log line itself */
    char note[384];              /* what the log line adds after the status */
    /* handing the request to a worker thread (http.c) */
    bool dispatched;
    enum MHD_Result handler_rc;
    struct http_pump *pump;      /* a streamed answer's producer */
};

/* Queue an answer; each takes ownership of the malloc'ed text (NULL = out of memory, which
 * becomes a 500). Return the MHD_Result for the access handler. */
enum MHD_Result http_send_json(struct http_exchange *x, int status, char *json);
enum MHD_Result http_send_text(struct http_exchange *x, int status, const char *content_type, char *text);
enum MHD_Result http_send_error(struct http_exchange *x, const struct openai_error *e);
/* 405 with the Allow header listing the methods the path has. */
enum MHD_Result http_send_error_allow(struct http_exchange *x, const struct openai_error *e, const char *allow);
/* 204 answer to an OPTIONS request for a path allowing these methods; a CORS preflight when
 * --cors names an origin (only Content-Type and Authorization headers allowed). */
enum MHD_Result http_send_preflight(struct http_exchange *x, const char *allow);
/* A streamed answer (text/event-stream, status 200) produced by reader; free_cb runs when
 * the connection is done with it (also when the client went away). */
enum MHD_Result http_send_stream(struct http_exchange *x, MHD_ContentReaderCallback reader, void *cls,
                                 MHD_ContentReaderFreeCallback free_cb);
/* True when the client is gone: the socket errored or was reset, or MHD closed the connection.
 * A read-side EOF alone is a half-close (the client may still read its answer); before the
 * answer starts, an HTTP/1.1 client that half-closed gets one "102 Processing" so that a
 * client that closed entirely answers with a reset (see http.c). */
bool http_client_gone(struct MHD_Connection *conn);
/* Write one log line for a finished request (thread-safe, one line). */
void http_log_request(long id, const char *method, const char *url, int status, int64_t t_start_us,
                      const char *note, bool aborted);

/* What http_start needs besides the routes. */
struct http_options {
    const char *host;            /* numeric address to bind */
    int port;                    /* 0: any free port */
    size_t max_body;             /* bytes; 413 beyond */
    const char *cors_origin;     /* NULL: no CORS headers; else the one origin allowed */
};

/* Listen (*bound_port gets the port). Returns 0 or -1 with err. */
int http_start(struct http_server **out, const struct http_options *o, struct routes *r, int *bound_port, char *err,
               size_t err_size);
/* Stop accepting connections; complete requests that arrive from now on are answered 503.
 * Requests in progress go on. */
void http_drain(struct http_server *h);
/* Wait (up to HTTP_DRAIN_DEADLINE_S) for every request in progress to be answered, then stop
 * the daemon. */
void http_stop(struct http_server *h);

#endif
