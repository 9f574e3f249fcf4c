/* http.c — libmicrohttpd glue (see http.h). MHD runs one thread per connection, so a handler
 * that waits for the engine simply blocks, and a streamed answer's reader blocks until the
 * next tokens arrive (MHD forbids a reader returning 0 in this mode). While blocked, MHD
 * cannot see the peer leave, so waiting code asks http_client_gone every HTTP_POLL_MS. */
#include "server/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common.h"
#include "server/openai.h"
#include "server/routes.h"

struct http_server {
    struct MHD_Daemon *d;
    struct routes *r;
    size_t max_body;
    atomic_long next_id;
};

/* ------------------------------------------------------------------------------------------
 * Answers */

static void add_common_headers(struct MHD_Response *resp, const char *content_type) {
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    /* browsers' web UIs on another origin may call us, as they call llama.cpp */
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ACCESS_CONTROL_ALLOW_ORIGIN, "*");
}

enum MHD_Result http_send_text(struct http_exchange *x, int status, const char *content_type, char *text) {
    if (!text) {
        static const char oom[] = "{\"error\":{\"code\":500,\"message\":\"out of memory\",\"type\":\"server_error\"}}";
        status = 500;
        content_type = "application/json; charset=utf-8";
        struct MHD_Response *resp = MHD_create_response_from_buffer(sizeof oom - 1, (void *)oom, MHD_RESPMEM_PERSISTENT);
        if (!resp) return MHD_NO;
        add_common_headers(resp, content_type);
        enum MHD_Result rc = MHD_queue_response(x->conn, (unsigned)status, resp);
        MHD_destroy_response(resp);
        x->status = status;
        return rc;
    }
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(text);
        return MHD_NO;
    }
    add_common_headers(resp, content_type);
    enum MHD_Result rc = MHD_queue_response(x->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    x->status = status;
    return rc;
}

enum MHD_Result http_send_json(struct http_exchange *x, int status, char *json) {
    return http_send_text(x, status, "application/json; charset=utf-8", json);
}

/* Printable excerpt of untrusted text for the log: at most max bytes, quotes, backslashes and
 * bytes outside printable ASCII replaced by '?' (redis setProtocolError). */
static void log_excerpt(char *dst, size_t dst_size, const char *s, size_t max) {
    size_t n = 0;
    for (; s && *s && n + 1 < dst_size && n < max; s++) {
        unsigned char c = (unsigned char)*s;
        dst[n++] = c >= 0x20 && c < 0x7F && c != '"' && c != '\\' ? (char)c : '?';
    }
    if (dst_size) dst[n] = 0;
}

/* Queue text (malloc'ed, or NULL = out of memory -> 500) with one extra header. */
static enum MHD_Result send_with_header(struct http_exchange *x, int status, char *text, const char *hdr, const char *value) {
    if (!text) return http_send_json(x, 500, NULL);
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(text);
        return MHD_NO;
    }
    add_common_headers(resp, "application/json; charset=utf-8");
    if (hdr) MHD_add_response_header(resp, hdr, value);
    enum MHD_Result rc = MHD_queue_response(x->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    x->status = status;
    return rc;
}

static void note_error(struct http_exchange *x, const struct openai_error *e) {
    char msg[128];
    log_excerpt(msg, sizeof msg, e->message, 120);
    snprintf(x->note, sizeof x->note, "error=\"%s\"", msg);
}

enum MHD_Result http_send_error(struct http_exchange *x, const struct openai_error *e) {
    note_error(x, e);
    return http_send_json(x, e->status, openai_error_render(e));
}

enum MHD_Result http_send_error_allow(struct http_exchange *x, const struct openai_error *e, const char *allow) {
    note_error(x, e);
    return send_with_header(x, e->status, openai_error_render(e), MHD_HTTP_HEADER_ALLOW, allow);
}

enum MHD_Result http_send_preflight(struct http_exchange *x, const char *allow) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ACCESS_CONTROL_ALLOW_ORIGIN, "*");
    MHD_add_response_header(resp, "Access-Control-Allow-Methods", allow);
    MHD_add_response_header(resp, "Access-Control-Allow-Headers", "*");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allow);
    enum MHD_Result rc = MHD_queue_response(x->conn, 204, resp);
    MHD_destroy_response(resp);
    x->status = 204;
    return rc;
}

enum MHD_Result http_send_stream(struct http_exchange *x, MHD_ContentReaderCallback reader, void *cls,
                                 MHD_ContentReaderFreeCallback free_cb) {
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, reader, cls, free_cb);
    if (!resp) {
        free_cb(cls);
        return MHD_NO;
    }
    add_common_headers(resp, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result rc = MHD_queue_response(x->conn, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    x->status = 200;
    x->log_by_stream = true;
    return rc;
}

bool http_client_gone(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return false;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
    if (p.revents & POLLIN) {
        /* readable: either the next pipelined request (still there) or EOF (gone) */
        char c;
        ssize_t k = recv(ci->connect_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        return k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    }
    return false;
}

void http_log_request(long id, const char *method, const char *url, int status, int64_t t_start_us,
                      const char *note, bool aborted) {
    char path[96];
    log_excerpt(path, sizeof path, url, 80);
    /* one request, one line: keep concurrent lines from interleaving */
    flockfile(stderr);
    coti_log(COTI_LOG_INFO, "server", "request id=%ld %s %s status=%d%s %s ms=%.1f", id, method, path, status,
             aborted ? " aborted" : "", note, (coti_time_us() - t_start_us) / 1e3);
    funlockfile(stderr);
}

/* ------------------------------------------------------------------------------------------
 * The daemon's callbacks */

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
    struct http_server *h = cls;
    struct http_exchange *x = *con_cls;
    if (!x) {
        /* headers only: set up the exchange; refuse an announced oversized body up front
         * (it is still read and dropped, see HTTP_MAX_DISCARD_BYTES) */
        x = calloc(1, sizeof *x);
        if (!x) return MHD_NO;
        x->conn = conn;
        x->method = method;
        x->url = url;
        x->id = atomic_fetch_add(&h->next_id, 1);
        x->t_start_us = coti_time_us();
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl) {
            char *end;
            errno = 0;
            unsigned long long n = strtoull(cl, &end, 10);
            if (errno || *end || n > h->max_body) x->too_large = true;
        }
        *con_cls = x;
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (!x->too_large && x->n_body + n > h->max_body) x->too_large = true;
        if (x->too_large) {
            x->n_dropped += n;
            if (x->n_dropped <= HTTP_MAX_DISCARD_BYTES) return MHD_YES;
        } else {
            if (!coti_grow(&x->body, &x->cap_body, x->n_body + n + 1, 1, 4096)) return MHD_NO;
            memcpy(x->body + x->n_body, upload_data, n);
            x->n_body += n;
            x->body[x->n_body] = 0;
            return MHD_YES;
        }
    }
    if (x->status) return MHD_YES; /* answered already (oversized body cut short) */
    if (x->too_large) {
        struct openai_error e;
        openai_error_set(&e, 413, "invalid_request_error", "the request body exceeds the limit of %zu bytes", h->max_body);
        return http_send_error(x, &e);
    }
    if (!x->body) {
        x->body = calloc(1, 1);
        if (!x->body) return MHD_NO;
    }
    return routes_handle(h->r, x);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe) {
    struct http_exchange *x = *con_cls;
    if (!x) return;
    /* 499: no answer was sent, the client went away first (nginx's "client closed request") */
    int status = x->status ? x->status : 499;
    if (!x->log_by_stream)
        http_log_request(x->id, x->method, x->url, status, x->t_start_us, x->note, toe != MHD_REQUEST_TERMINATED_COMPLETED_OK);
    routes_count_http(cls ? ((struct http_server *)cls)->r : NULL, status);
    free(x->body);
    free(x);
    *con_cls = NULL;
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) msg[--n] = 0;
    /* MHD reports a stream we ended because its client left as an "internal error"; the
     * request's own log line already says "aborted" */
    bool expected = strstr(msg, "Application reported internal error") != NULL;
    coti_log(expected ? COTI_LOG_DEBUG : COTI_LOG_WARN, "http", "%s", msg);
}

int http_start(struct http_server **out, const char *host, int port, size_t max_body, struct routes *r,
               int *bound_port, char *err, size_t err_size) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    char port_s[16];
    snprintf(port_s, sizeof port_s, "%d", port);
    int grc = getaddrinfo(host, port_s, &hints, &ai);
    if (grc) return coti_fail(err, err_size, COTI_E_ARG, "cannot resolve host '%s': %s", host, gai_strerror(grc));
    struct http_server *h = calloc(1, sizeof *h);
    if (!h) {
        freeaddrinfo(ai);
        return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory");
    }
    h->r = r;
    h->max_body = max_body;
    atomic_init(&h->next_id, 1);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    h->d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, h,
                            MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, NULL, /* first, or MHD complains */
                            MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)HTTP_MAX_CONNECTIONS,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)HTTP_IDLE_TIMEOUT_S,
                            MHD_OPTION_THREAD_STACK_SIZE, HTTP_THREAD_STACK_BYTES,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
                            MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!h->d) {
        free(h);
        return coti_fail(err, err_size, COTI_E_IO, "cannot listen on %s:%d (in use, or not an address of this machine?)", host, port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    *bound_port = di ? di->port : port;
    *out = h;
    return 0;
}

void http_stop(struct http_server *h) {
    if (!h) return;
    MHD_stop_daemon(h->d);
    free(h);
}
