/* http.c — libmicrohttpd glue (see http.h).
 *
 * Connections live in MHD's epoll loops (HTTP_POOL_THREADS threads), which must never wait:
 * an idle or trickling connection then costs a descriptor, not a thread. A complete request
 * is handed to a worker thread of its own while its connection is suspended; the worker runs
 * routes_handle (which may block on the engine), queues the answer (MHD allows that on a
 * suspended connection) and resumes the connection. A streamed answer keeps its worker as
 * the producer ("pump"): it calls the route's blocking reader and buffers the bytes, and
 * MHD's side of the stream takes them, suspending the connection while the buffer is empty.
 *
 * Deadlines that bytes do not extend (header, body) are enforced by a watchdog thread that
 * shuts down late sockets (shutdown(2), never close: MHD owns the descriptor and closes it).
 * Caps (total, per client address, workers, draining) are answered 503 + Retry-After in JSON
 * so a client meets a clear answer, not a reset.
 *
 * MHD does not listen: the gate (gate.c) accepts, holds each new connection until its first
 * request head is complete, answers in JSON what MHD would refuse with its own HTML (head.c)
 * and passes the rest on with MHD_add_connection. A waiting connection is in our list as
 * well (gate_admit), so the caps and the header deadline count it. Only the first head of a
 * connection passes the gate: a later request on a keep-alive connection is read by MHD
 * alone, and a malformed one still gets MHD's HTML. Closing that gap would need the
 * connection back from MHD between requests, which 0.9.75 cannot do (it may even hold the
 * next request's bytes in its buffer already); answer_early repeats the size checks for
 * those requests. */
#include "server/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "server/gate.h"
#include "server/openai.h"
#include "server/routes.h"

/* Where a connection is in its current request, for the deadlines and the drain. */
enum conn_phase {
    PHASE_HEADERS, /* waiting for a request's headers (also idle keep-alive) */
    PHASE_BODY,    /* headers in, body being read */
    PHASE_BUSY,    /* request complete: being handled or answered */
};

struct http_conn {
    struct http_conn *prev, *next;
    int fd;
    int family;
    unsigned char addr[16];     /* the client's IP (port ignored): the per-client cap */
    enum conn_phase phase;      /* under the server's mutex */
    int64_t t_phase_us;
    bool cut;                   /* shut down by the watchdog */
    /* set before a worker starts, read by it (thread creation orders them) */
    bool http11;
    bool probed;                /* the 102 probe was sent for this request */
    bool streaming;             /* the answer's headers are out */
    atomic_bool released;       /* MHD is closing the connection: waiting code must give up */
};

struct http_server {
    struct MHD_Daemon *d;
    struct routes *r;
    size_t max_body;
    const char *cors_origin;
    atomic_long next_id;
    pthread_mutex_t mu;
    pthread_cond_t cv;          /* connection, phase or worker counts changed; watchdog ticks */
    struct http_conn *conns;
    int n_conns, n_workers;
    bool draining, stopping;
    pthread_t watchdog;
    bool watchdog_started;
    struct gate *gate;          /* the listening socket; new connections until their first head */
};

/* A streamed answer between its producer (the worker) and MHD (see the file comment). */
struct http_pump {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct MHD_Connection *conn;
    struct http_conn *hc;
    MHD_ContentReaderCallback reader;
    void *cls;
    MHD_ContentReaderFreeCallback free_cb;
    char *buf;
    size_t n, off, cap;
    uint64_t pos;
    ssize_t end;                /* 0 while producing, else the reader's end code */
    bool waiting;               /* MHD's side suspended the connection for want of bytes */
    bool released;              /* MHD is done with the response */
    bool exited;                /* the producer no longer touches the pump or the connection */
};

static const char json_type[] = "application/json; charset=utf-8";

/* ------------------------------------------------------------------------------------------
 * Answers */

static void add_common_headers(const struct http_server *h, struct MHD_Response *resp, const char *content_type) {
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    /* a browser page may read our answers only when --cors named its origin */
    if (h->cors_origin) {
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ACCESS_CONTROL_ALLOW_ORIGIN, h->cors_origin);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_VARY, "Origin");
    }
}

/* Queue text (malloc'ed, or NULL = out of memory -> 500) with up to two extra headers. */
static enum MHD_Result send_response(struct http_exchange *x, int status, const char *content_type, char *text,
                                     const char *hdr, const char *value, const char *hdr2, const char *value2) {
    struct MHD_Response *resp;
    if (!text) {
        static const char oom[] = "{\"error\":{\"code\":500,\"message\":\"out of memory\",\"type\":\"server_error\"}}";
        status = 500;
        content_type = json_type;
        hdr = hdr2 = NULL;
        resp = MHD_create_response_from_buffer(sizeof oom - 1, (void *)oom, MHD_RESPMEM_PERSISTENT);
    } else {
        resp = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
        if (!resp) free(text);
    }
    if (!resp) return MHD_NO;
    add_common_headers(x->server, resp, content_type);
    if (hdr) MHD_add_response_header(resp, hdr, value);
    if (hdr2) MHD_add_response_header(resp, hdr2, value2);
    enum MHD_Result rc = MHD_queue_response(x->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    x->status = status;
    return rc;
}

enum MHD_Result http_send_text(struct http_exchange *x, int status, const char *content_type, char *text) {
    return send_response(x, status, content_type, text, NULL, NULL, NULL, NULL);
}

enum MHD_Result http_send_json(struct http_exchange *x, int status, char *json) {
    return send_response(x, status, json_type, json, NULL, NULL, NULL, NULL);
}

/* Excerpt of untrusted text for the log, at most max bytes of it, escaped as the inside of a
 * JSON string (common.h): printable, and a quoted field stays one field. */
static void log_excerpt(char *dst, size_t dst_size, const char *s, size_t max) {
    coti_log_escape(dst, dst_size, s, max);
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
    return send_response(x, e->status, json_type, openai_error_render(e), MHD_HTTP_HEADER_ALLOW, allow, NULL, NULL);
}

/* 503 for load or shutdown: Retry-After, and the connection closes (it frees a place). */
static enum MHD_Result send_unavailable(struct http_exchange *x, const char *why) {
    struct openai_error e;
    openai_error_set(&e, 503, "unavailable_error", "%s, retry later", why);
    note_error(x, &e);
    char retry[16];
    snprintf(retry, sizeof retry, "%d", HTTP_RETRY_AFTER_S);
    return send_response(x, 503, json_type, openai_error_render(&e), MHD_HTTP_HEADER_RETRY_AFTER, retry,
                         MHD_HTTP_HEADER_CONNECTION, "close");
}

enum MHD_Result http_send_preflight(struct http_exchange *x, const char *allow) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!resp) return MHD_NO;
    const char *origin = x->server->cors_origin;
    if (origin) {
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_VARY, "Origin");
        MHD_add_response_header(resp, "Access-Control-Allow-Methods", allow);
        MHD_add_response_header(resp, "Access-Control-Allow-Headers", "Content-Type, Authorization");
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allow);
    enum MHD_Result rc = MHD_queue_response(x->conn, 204, resp);
    MHD_destroy_response(resp);
    x->status = 204;
    return rc;
}

/* MHD's side of a stream (pool thread): hand out buffered bytes, or suspend until the
 * producer resumes the connection. */
static ssize_t pump_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    struct http_pump *pm = cls;
    pthread_mutex_lock(&pm->mu);
    ssize_t rc;
    if (pm->off < pm->n) {
        size_t k = COTI_MIN(max, pm->n - pm->off);
        memcpy(buf, pm->buf + pm->off, k);
        pm->off += k;
        if (pm->off == pm->n) pm->off = pm->n = 0;
        pthread_cond_broadcast(&pm->cv);
        rc = (ssize_t)k;
    } else if (pm->end) {
        rc = pm->end;
    } else {
        pm->waiting = true;
        MHD_suspend_connection(pm->conn);
        rc = 0;
    }
    pthread_mutex_unlock(&pm->mu);
    return rc;
}

/* MHD is done with the stream (pool thread): make the producer give up (http_client_gone
 * says gone), wait until it no longer touches the connection, then free. The wait is short:
 * the route's reader checks for its client every HTTP_POLL_MS. */
static void pump_release(void *cls) {
    struct http_pump *pm = cls;
    atomic_store(&pm->hc->released, true);
    pthread_mutex_lock(&pm->mu);
    pm->released = true;
    pthread_cond_broadcast(&pm->cv);
    while (!pm->exited) pthread_cond_wait(&pm->cv, &pm->mu);
    pthread_mutex_unlock(&pm->mu);
    pm->free_cb(pm->cls);
    pthread_mutex_destroy(&pm->mu);
    pthread_cond_destroy(&pm->cv);
    free(pm->buf);
    free(pm);
}

/* The producer (the request's worker thread, after its connection was resumed). */
static void pump_run(struct http_pump *pm) {
    char tmp[4096];
    for (;;) {
        pthread_mutex_lock(&pm->mu);
        while (!pm->released && pm->n - pm->off >= HTTP_STREAM_BUFFER_BYTES) pthread_cond_wait(&pm->cv, &pm->mu);
        bool stop = pm->released;
        pthread_mutex_unlock(&pm->mu);
        if (stop) break;
        ssize_t k = pm->reader(pm->cls, pm->pos, tmp, sizeof tmp);
        pthread_mutex_lock(&pm->mu);
        if (k > 0) {
            if (coti_grow(&pm->buf, &pm->cap, pm->n + (size_t)k, 1, 4096)) {
                memcpy(pm->buf + pm->n, tmp, (size_t)k);
                pm->n += (size_t)k;
                pm->pos += (uint64_t)k;
            } else {
                pm->end = MHD_CONTENT_READER_END_WITH_ERROR;
            }
        } else if (k < 0) {
            pm->end = k;
        }
        /* the connection is valid until released (pump_release waits for us) */
        if (pm->waiting && !pm->released && (pm->off < pm->n || pm->end)) {
            pm->waiting = false;
            MHD_resume_connection(pm->conn);
        }
        stop = pm->end || pm->released;
        pthread_mutex_unlock(&pm->mu);
        if (stop) break;
    }
    pthread_mutex_lock(&pm->mu);
    pm->exited = true;
    pthread_cond_broadcast(&pm->cv);
    pthread_mutex_unlock(&pm->mu);
}

enum MHD_Result http_send_stream(struct http_exchange *x, MHD_ContentReaderCallback reader, void *cls,
                                 MHD_ContentReaderFreeCallback free_cb) {
    struct http_pump *pm = calloc(1, sizeof *pm);
    if (!pm) {
        free_cb(cls);
        return MHD_NO;
    }
    pthread_mutex_init(&pm->mu, NULL);
    pthread_cond_init(&pm->cv, NULL);
    pm->conn = x->conn;
    pm->hc = x->hc;
    pm->reader = reader;
    pm->cls = cls;
    pm->free_cb = free_cb;
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, pump_read, pm, pump_release);
    if (!resp) {
        free_cb(cls);
        pthread_mutex_destroy(&pm->mu);
        pthread_cond_destroy(&pm->cv);
        free(pm);
        return MHD_NO;
    }
    add_common_headers(x->server, resp, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result rc = MHD_queue_response(x->conn, MHD_HTTP_OK, resp);
    if (rc == MHD_YES) {
        x->pump = pm;
    } else {
        /* refused: destroying the response frees the pump at once, with no producer */
        pthread_mutex_lock(&pm->mu);
        pm->exited = true;
        pthread_mutex_unlock(&pm->mu);
    }
    MHD_destroy_response(resp);
    x->status = 200;
    x->log_by_stream = true;
    x->hc->streaming = true;
    return rc;
}

static struct http_conn *conn_state(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

bool http_client_gone(struct MHD_Connection *conn) {
    struct http_conn *hc = conn_state(conn);
    if (!hc) return false;
    if (atomic_load(&hc->released)) return true;
    struct pollfd p = {.fd = hc->fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    /* POLLHUP: both directions are shut (a reset); a FIN alone is only POLLRDHUP */
    if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return true;
    bool eof = (p.revents & POLLRDHUP) != 0;
    if (!eof && (p.revents & POLLIN)) {
        /* readable: either the next pipelined request (still there) or EOF */
        char c;
        ssize_t k = recv(hc->fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
        eof = k == 0;
    }
    if (eof && !hc->probed && !hc->streaming && hc->http11) {
        /* EOF: a half-close (still reading) or a full close. One interim answer tells them
         * apart: a closed socket answers it with a reset, seen at the next check. MHD is not
         * writing: the connection is suspended until the answer is queued. */
        static const char probe[] = "HTTP/1.1 102 Processing\r\n\r\n";
        hc->probed = true;
        ssize_t k = send(hc->fd, probe, sizeof probe - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
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
 * Connections: bookkeeping, caps, deadlines */

static void set_phase(struct http_server *h, struct http_conn *hc, enum conn_phase phase) {
    pthread_mutex_lock(&h->mu);
    hc->phase = phase;
    hc->t_phase_us = coti_time_us();
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

/* A connection's state, from the moment it is accepted (gate) or added to MHD. */
static struct http_conn *conn_new(int fd, const struct sockaddr *sa) {
    struct http_conn *hc = calloc(1, sizeof *hc);
    if (!hc) return NULL;
    hc->fd = fd;
    if (sa) {
        hc->family = sa->sa_family;
        if (sa->sa_family == AF_INET) memcpy(hc->addr, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, 4);
        else if (sa->sa_family == AF_INET6) memcpy(hc->addr, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, 16);
    }
    atomic_init(&hc->released, false);
    hc->phase = PHASE_HEADERS;
    hc->t_phase_us = coti_time_us();
    return hc;
}

/* Connections of hc's client address (h->mu held). */
static int same_client(const struct http_server *h, const struct http_conn *hc) {
    int same = 0;
    for (const struct http_conn *c = h->conns; c; c = c->next)
        same += c->family == hc->family && !memcmp(c->addr, hc->addr, sizeof c->addr);
    return same;
}

static void conn_link(struct http_server *h, struct http_conn *hc) {
    hc->next = h->conns;
    if (h->conns) h->conns->prev = hc;
    h->conns = hc;
    h->n_conns++;
}

/* Forget hc and free it: its descriptor is closed (or passed on) right after, so the watchdog
 * must not see it any more. */
static void conn_forget(struct http_server *h, struct http_conn *hc) {
    pthread_mutex_lock(&h->mu);
    if (hc->prev) hc->prev->next = hc->next;
    else h->conns = hc->next;
    if (hc->next) hc->next->prev = hc->prev;
    h->n_conns--;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    free(hc);
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    struct http_server *h = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *fi = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        const union MHD_ConnectionInfo *ai = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        struct http_conn *hc = conn_new(fi ? fi->connect_fd : -1, ai ? ai->client_addr : NULL);
        if (!hc) return; /* on_request refuses a connection without state */
        pthread_mutex_lock(&h->mu);
        conn_link(h, hc);
        pthread_mutex_unlock(&h->mu);
        *socket_context = hc;
    } else if (*socket_context) {
        conn_forget(h, *socket_context);
        *socket_context = NULL;
    }
}

/* The gate's hooks (gate.h): a connection waiting for its first head is in the list too, so
 * that the caps and the header deadline hold for it as for one in MHD. */

static void *gate_admit(void *cls, int fd, const struct sockaddr *addr, socklen_t addr_len) {
    (void)addr_len;
    struct http_server *h = cls;
    struct http_conn *hc = conn_new(fd, addr);
    if (!hc) return NULL;
    pthread_mutex_lock(&h->mu);
    /* the hard limits, which MHD applied when it accepted: closed without an answer */
    bool full = h->n_conns >= HTTP_MAX_CONNECTIONS || same_client(h, hc) >= 2 * HTTP_PER_IP_CONNECTIONS;
    if (!full) conn_link(h, hc);
    pthread_mutex_unlock(&h->mu);
    if (full) {
        free(hc);
        return NULL;
    }
    return hc;
}

static void gate_pass(void *cls, void *conn, int fd, const struct sockaddr *addr, socklen_t addr_len) {
    struct http_server *h = cls;
    conn_forget(h, conn); /* MHD's notification makes a new entry */
    if (MHD_add_connection(h->d, fd, addr, addr_len) != MHD_YES)
        coti_log(COTI_LOG_WARN, "http", "libmicrohttpd did not take a connection: %s", strerror(errno)); /* it closed it */
}

static void gate_refused(void *cls, void *conn, const struct head_refusal *why) {
    struct http_server *h = cls;
    const struct http_conn *hc = conn;
    char msg[128], note[160];
    log_excerpt(msg, sizeof msg, why->message, 120);
    snprintf(note, sizeof note, "error=\"%s\"", msg);
    http_log_request(atomic_fetch_add(&h->next_id, 1), "-", "-", why->status, hc->t_phase_us, note, false);
    routes_count_http(h->r, why->status);
}

static void gate_drop(void *cls, void *conn) { conn_forget(cls, conn); }

/* Why a new request must be refused for load (NULL: it may go on). */
static const char *over_capacity(struct http_server *h, const struct http_conn *hc) {
    pthread_mutex_lock(&h->mu);
    const char *why = NULL;
    if (h->draining) why = "the server is shutting down";
    else if (h->n_conns > HTTP_SOFT_CONNECTIONS) why = "the server has too many connections";
    else if (h->n_workers >= HTTP_MAX_WORKERS) why = "the server is busy";
    else if (same_client(h, hc) > HTTP_PER_IP_CONNECTIONS) why = "too many connections from this client";
    pthread_mutex_unlock(&h->mu);
    return why;
}

/* Shut down connections past their deadline; MHD then sees the socket end and closes it. */
static void *watchdog_main(void *cls) {
    struct http_server *h = cls;
    pthread_mutex_lock(&h->mu);
    while (!h->stopping) {
        struct timespec dl;
        clock_gettime(CLOCK_MONOTONIC, &dl);
        dl.tv_nsec += 250 * 1000000L;
        if (dl.tv_nsec >= 1000000000L) { dl.tv_sec++; dl.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&h->cv, &h->mu, &dl);
        int64_t now = coti_time_us();
        for (struct http_conn *c = h->conns; c; c = c->next) {
            int64_t limit = c->phase == PHASE_HEADERS ? HTTP_HEADER_DEADLINE_S : c->phase == PHASE_BODY ? HTTP_BODY_DEADLINE_S : 0;
            if (!limit || c->cut || now - c->t_phase_us < limit * 1000000) continue;
            c->cut = true;
            shutdown(c->fd, SHUT_RDWR);
        }
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* ------------------------------------------------------------------------------------------
 * Requests */

static enum MHD_Result count_header_bytes(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    *(size_t *)cls += strlen(key) + (value ? strlen(value) : 0) + 4; /* ": " and CRLF */
    return MHD_YES;
}

/* An answer due as soon as the headers are in (before any body byte is read). */
static enum MHD_Result answer_early(struct http_server *h, struct http_exchange *x) {
    const char *why = over_capacity(h, x->hc);
    if (why) return send_unavailable(x, why);
    struct openai_error e;
    size_t n_url = strlen(x->url);
    if (n_url > HTTP_MAX_URL_BYTES) {
        openai_error_set(&e, 414, "invalid_request_error", "the URL exceeds the limit of %zu bytes", HTTP_MAX_URL_BYTES);
        return http_send_error(x, &e);
    }
    size_t n_head = n_url + strlen(x->method) + 12;
    MHD_get_connection_values(x->conn, MHD_HEADER_KIND, count_header_bytes, &n_head);
    if (n_head > HTTP_MAX_HEADER_BYTES) {
        openai_error_set(&e, 431, "invalid_request_error", "the request headers exceed the limit of %zu bytes",
                         HTTP_MAX_HEADER_BYTES);
        return http_send_error(x, &e);
    }
    const char *cl = MHD_lookup_connection_value(x->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl) {
        char *end;
        errno = 0;
        unsigned long long n = strtoull(cl, &end, 10);
        if (errno || *end || n > h->max_body) {
            x->too_large = true;
            openai_error_set(&e, 413, "invalid_request_error", "the request body exceeds the limit of %zu bytes",
                             h->max_body);
            return http_send_error(x, &e);
        }
    }
    return MHD_YES;
}

static void *worker_main(void *arg) {
    struct http_exchange *x = arg;
    struct http_server *h = x->server;
    struct MHD_Connection *conn = x->conn;
    x->handler_rc = routes_handle(h->r, x);
    struct http_pump *pm = x->pump;
    /* from here x belongs to MHD again (on_completed frees it) */
    MHD_resume_connection(conn);
    if (pm) pump_run(pm);
    pthread_mutex_lock(&h->mu);
    h->n_workers--;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* Run the complete request x on a worker thread; its connection waits suspended. */
static enum MHD_Result dispatch(struct http_server *h, struct http_exchange *x) {
    const char *why = over_capacity(h, x->hc);
    if (why) return send_unavailable(x, why);
    pthread_mutex_lock(&h->mu);
    h->n_workers++;
    pthread_mutex_unlock(&h->mu);
    set_phase(h, x->hc, PHASE_BUSY);
    x->dispatched = true;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, HTTP_THREAD_STACK_BYTES);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    MHD_suspend_connection(x->conn);
    pthread_t t;
    int rc = pthread_create(&t, &attr, worker_main, x);
    pthread_attr_destroy(&attr);
    if (rc == 0) return MHD_YES;
    MHD_resume_connection(x->conn);
    x->dispatched = false;
    pthread_mutex_lock(&h->mu);
    h->n_workers--;
    pthread_mutex_unlock(&h->mu);
    return send_unavailable(x, "the server is busy");
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
    struct http_server *h = cls;
    struct http_exchange *x = *con_cls;
    if (!x) {
        struct http_conn *hc = conn_state(conn);
        if (!hc) return MHD_NO;
        x = calloc(1, sizeof *x);
        if (!x) return MHD_NO;
        x->conn = conn;
        x->server = h;
        x->hc = hc;
        x->method = method;
        x->url = url;
        x->version = version;
        x->id = atomic_fetch_add(&h->next_id, 1);
        x->t_start_us = coti_time_us();
        hc->http11 = !strcmp(version, MHD_HTTP_VERSION_1_1);
        hc->probed = hc->streaming = false;
        atomic_store(&hc->released, false); /* the previous answer's stream set it */
        set_phase(h, hc, PHASE_BODY);
        *con_cls = x;
        return answer_early(h, x);
    }
    /* resumed after its worker: the answer is queued, or the handler gave up (client gone) */
    if (x->dispatched) return x->handler_rc == MHD_YES && x->status ? MHD_YES : MHD_NO;
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (x->status) return MHD_YES; /* answered early: MHD drops the body and closes */
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
    if (x->status) return MHD_YES; /* answered already (early, or an oversized body cut short) */
    if (x->too_large) {
        struct openai_error e;
        openai_error_set(&e, 413, "invalid_request_error", "the request body exceeds the limit of %zu bytes", h->max_body);
        return http_send_error(x, &e);
    }
    if (!x->body) {
        x->body = calloc(1, 1);
        if (!x->body) return MHD_NO;
    }
    return dispatch(h, x);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)conn;
    struct http_server *h = cls;
    struct http_exchange *x = *con_cls;
    if (!x) return;
    /* 499: no answer was sent, the client went away first (nginx's "client closed request") */
    int status = x->status ? x->status : 499;
    if (!x->log_by_stream)
        http_log_request(x->id, x->method, x->url, status, x->t_start_us, x->note, toe != MHD_REQUEST_TERMINATED_COMPLETED_OK);
    routes_count_http(h->r, status);
    /* the next request's header deadline runs from here */
    if (x->hc) set_phase(h, x->hc, PHASE_HEADERS);
    free(x->body);
    free(x);
    *con_cls = NULL;
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) msg[--n] = 0;
    /* MHD reports a stream we ended because its client left as an "internal error"; the
     * request's own log line already says "aborted" */
    bool expected = strstr(msg, "Application reported internal error") != NULL;
    coti_log(expected ? COTI_LOG_DEBUG : COTI_LOG_WARN, "http", "%s", msg);
}

/* Every connection is a descriptor: make room for the most we accept (up to the hard limit
 * the system allows us). */
static void raise_fd_limit(void) {
    struct rlimit rl;
    const rlim_t want = HTTP_MAX_CONNECTIONS + 256;
    if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur >= want) return;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl))
        coti_log(COTI_LOG_WARN, "http", "cannot raise the descriptor limit: %s", strerror(errno));
}

int http_start(struct http_server **out, const struct http_options *o, struct routes *r, int *bound_port, char *err,
               size_t err_size) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    char port_s[16];
    snprintf(port_s, sizeof port_s, "%d", o->port);
    int grc = getaddrinfo(o->host, port_s, &hints, &ai);
    if (grc) return coti_fail(err, err_size, COTI_E_ARG, "cannot resolve host '%s': %s", o->host, gai_strerror(grc));
    struct http_server *h = calloc(1, sizeof *h);
    if (!h) {
        freeaddrinfo(ai);
        return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory");
    }
    h->r = r;
    h->max_body = o->max_body;
    h->cors_origin = o->cors_origin;
    atomic_init(&h->next_id, 1);
    pthread_mutex_init(&h->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&h->cv, &ca);
    pthread_condattr_destroy(&ca);
    raise_fd_limit();
    /* the gate listens and passes each connection on with MHD_add_connection */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG |
                     MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC;
    h->d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, h,
                            MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, NULL, /* first, or MHD complains */
                            MHD_OPTION_THREAD_POOL_SIZE, (unsigned)HTTP_POOL_THREADS,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)HTTP_MAX_CONNECTIONS,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)(2 * HTTP_PER_IP_CONNECTIONS),
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)HTTP_IDLE_TIMEOUT_S,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, HTTP_CONNECTION_MEMORY,
                            MHD_OPTION_THREAD_STACK_SIZE, HTTP_THREAD_STACK_BYTES,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
                            MHD_OPTION_END);
    const struct head_limits lim = {.max_head = HTTP_MAX_HEADER_BYTES, .max_target = HTTP_MAX_URL_BYTES,
                                    .max_fields = HTTP_MAX_FIELDS, .max_body = o->max_body};
    const struct gate_hooks hooks = {.cls = h, .admit = gate_admit, .pass = gate_pass, .refused = gate_refused,
                                     .drop = gate_drop};
    char why[128] = "";
    if (!h->d) snprintf(why, sizeof why, "libmicrohttpd did not start");
    else gate_start(&h->gate, ai->ai_addr, ai->ai_addrlen, &lim, &hooks, why, sizeof why);
    freeaddrinfo(ai);
    if (!h->gate) {
        if (h->d) MHD_stop_daemon(h->d);
        pthread_mutex_destroy(&h->mu);
        pthread_cond_destroy(&h->cv);
        free(h);
        return coti_fail(err, err_size, COTI_E_IO,
                         "cannot listen on %s:%d (%s; in use, or not an address of this machine?)", o->host, o->port, why);
    }
    if (pthread_create(&h->watchdog, NULL, watchdog_main, h) == 0) h->watchdog_started = true;
    else coti_log(COTI_LOG_WARN, "http", "no watchdog thread: header and body deadlines are off");
    *bound_port = gate_port(h->gate);
    *out = h;
    return 0;
}

void http_drain(struct http_server *h) {
    if (!h) return;
    pthread_mutex_lock(&h->mu);
    bool was = h->draining;
    h->draining = true;
    pthread_mutex_unlock(&h->mu);
    if (was) return;
    /* new connections are refused by the kernel from now on */
    gate_quiesce(h->gate);
}

static bool requests_in_progress(const struct http_server *h) {
    for (const struct http_conn *c = h->conns; c; c = c->next)
        if (c->phase != PHASE_HEADERS) return true;
    return false;
}

void http_stop(struct http_server *h) {
    if (!h) return;
    http_drain(h);
    int64_t t_end = coti_time_us() + (int64_t)HTTP_DRAIN_DEADLINE_S * 1000000;
    pthread_mutex_lock(&h->mu);
    /* workers first, without a deadline: MHD must not stop with a connection suspended, and
     * the engine (stopped before us) ends every task */
    while (h->n_workers > 0) pthread_cond_wait(&h->cv, &h->mu);
    /* then let the answers in flight reach their clients */
    while (requests_in_progress(h) && coti_time_us() < t_end) {
        struct timespec dl;
        clock_gettime(CLOCK_MONOTONIC, &dl);
        dl.tv_nsec += 50 * 1000000L;
        if (dl.tv_nsec >= 1000000000L) { dl.tv_sec++; dl.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&h->cv, &h->mu, &dl);
    }
    h->stopping = true;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    if (h->watchdog_started) pthread_join(h->watchdog, NULL);
    gate_stop(h->gate); /* before MHD stops: it passes connections to MHD */
    MHD_stop_daemon(h->d);
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    free(h);
}
