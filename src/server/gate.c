/* gate.c — the wait for a connection's first request head (see gate.h).
 *
 * Why it exists: libmicrohttpd 0.9.75 answers the heads it refuses (malformed lines, HTTP
 * versions, heads over its memory) with compiled-in HTML before any callback of ours runs,
 * and has no option to replace them. So a new connection stays here until head.c has seen its
 * whole first head, which the kernel keeps queued (we only peek), and MHD gets the socket
 * with those bytes still unread, or never gets it.
 *
 * One thread and one epoll set for every waiting connection: idle and trickling clients cost
 * a descriptor each, never a thread. Connections are edge-triggered (peeking leaves the bytes
 * queued, so a level-triggered socket would stay ready); each new edge is a look at the head,
 * except that a head over GATE_SMALL_HEAD bytes is looked at again only when it grew by an
 * eighth or a tick passed, so a client trickling a byte at a time cannot make the gate copy
 * its whole head for every byte. Deadlines are the server's (its watchdog shuts a late socket
 * down; the gate sees the hang-up and closes it).
 *
 * A refused head gets its answer here, then the gate stops writing (shutdown SHUT_WR) and
 * reads and drops what the client still sends for up to GATE_LINGER_MS, so that closing with
 * unread bytes does not reset the connection before the client has read the answer. */
#include "server/gate.h"

#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "server/openai.h"

/* Period of the deadline and deferred-look scan. */
#define GATE_TICK_MS 100
/* Heads up to this size are looked at on every new edge; beyond, see the file comment. */
#define GATE_SMALL_HEAD 1024
/* After a refusal: how long, and how many bytes, the gate reads and drops before closing. */
#define GATE_LINGER_MS 2000
#define GATE_LINGER_BYTES ((size_t)1 << 20)
/* When accept fails for want of descriptors, accepting pauses this long (the listening socket
 * stays readable, so it would spin otherwise). */
#define GATE_ACCEPT_PAUSE_MS 100

struct gate_conn {
    struct gate_conn *prev, *next;
    int fd;
    void *owner;                 /* the server's handle */
    struct sockaddr_storage addr;
    socklen_t addr_len;
    bool eof;                    /* the client half-closed */
    size_t n_seen;               /* bytes queued at the last look */
    int64_t t_look_us;
    bool look_due;               /* bytes arrived that were not looked at yet */
    char *out;                   /* the refusal being written */
    size_t n_out, off_out;
    bool lingering;              /* answer written: dropping input until EOF or the deadline */
    int64_t t_linger_us;
    size_t n_dropped;
};

struct gate {
    int listen_fd, epoll_fd, wake_fd, port;
    struct head_limits lim;
    struct gate_hooks hooks;
    struct gate_conn *conns;
    char *peek;                  /* lim.max_head + 1 bytes */
    atomic_bool quiesce, stop;
    int64_t t_accept_resume_us;  /* 0: accepting; else paused until then */
    pthread_t thread;
};

static void conn_unlink(struct gate *g, struct gate_conn *c) {
    if (c->prev) c->prev->next = c->next;
    else g->conns = c->next;
    if (c->next) c->next->prev = c->prev;
}

static void conn_close(struct gate *g, struct gate_conn *c) {
    /* the server forgets it first: its watchdog must not shut down a reused descriptor */
    g->hooks.drop(g->hooks.cls, c->owner);
    close(c->fd);
    conn_unlink(g, c);
    free(c->out);
    free(c);
}

/* Read and drop what the client sends after its answer; close at EOF, on error, or past
 * GATE_LINGER_BYTES. */
static void conn_drain(struct gate *g, struct gate_conn *c) {
    char tmp[16384];
    for (;;) {
        ssize_t k = recv(c->fd, tmp, sizeof tmp, MSG_DONTWAIT);
        if (k > 0 && (c->n_dropped += (size_t)k) <= GATE_LINGER_BYTES) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (k < 0 && errno == EINTR) continue;
        conn_close(g, c);
        return;
    }
}

/* Write what is left of the answer; once it is out, stop writing and linger. */
static void conn_write(struct gate *g, struct gate_conn *c) {
    while (c->off_out < c->n_out) {
        ssize_t k = send(c->fd, c->out + c->off_out, c->n_out - c->off_out, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
            c->off_out += (size_t)k;
        } else if (k < 0 && errno == EINTR) {
            continue;
        } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, .data.ptr = c};
            if (epoll_ctl(g->epoll_fd, EPOLL_CTL_MOD, c->fd, &ev)) conn_close(g, c);
            return;
        } else {
            conn_close(g, c);
            return;
        }
    }
    shutdown(c->fd, SHUT_WR);
    c->lingering = true;
    c->t_linger_us = coti_time_us();
    conn_drain(g, c);
}

static const char *reason_phrase(int status) {
    switch (status) {
    case 400: return "Bad Request";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 431: return "Request Header Fields Too Large";
    case 501: return "Not Implemented";
    case 505: return "HTTP Version Not Supported";
    default: return "Error";
    }
}

/* Answer a refused head (JSON, Connection: close). */
static void conn_refuse(struct gate *g, struct gate_conn *c, const struct head_refusal *why) {
    g->hooks.refused(g->hooks.cls, c->owner, why);
    struct openai_error e;
    openai_error_set(&e, why->status, why->type, "%s", why->message);
    char *body = openai_error_render(&e);
    char date[64];
    time_t now = time(NULL);
    struct tm tm;
    strftime(date, sizeof date, "%a, %d %b %Y %H:%M:%S GMT", gmtime_r(&now, &tm));
    size_t n_body = body ? strlen(body) : 0;
    size_t cap = n_body + 256;
    c->out = body ? malloc(cap) : NULL;
    if (!c->out) {
        free(body);
        conn_close(g, c);
        return;
    }
    int n = snprintf(c->out, cap,
                     "HTTP/1.1 %d %s\r\nDate: %s\r\nContent-Type: application/json; charset=utf-8\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
                     why->status, reason_phrase(why->status), date, n_body, body);
    free(body);
    c->n_out = n > 0 && (size_t)n < cap ? (size_t)n : 0;
    conn_write(g, c);
}

/* Peek at what the client sent and decide: pass on, refuse, or wait for more. */
static void conn_look(struct gate *g, struct gate_conn *c) {
    ssize_t k = recv(c->fd, g->peek, g->lim.max_head + 1, MSG_PEEK | MSG_DONTWAIT);
    if (k < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            conn_close(g, c);
            return;
        }
        k = 0;
    }
    c->n_seen = (size_t)k;
    c->t_look_us = coti_time_us();
    c->look_due = false;
    size_t n_head = 0;
    struct head_refusal why;
    switch (head_check(g->peek, (size_t)k, c->eof, &g->lim, &n_head, &why)) {
    case HEAD_ACCEPTED:
        /* MHD adds the socket to its own epoll set: it must leave ours first */
        epoll_ctl(g->epoll_fd, EPOLL_CTL_DEL, c->fd, NULL);
        conn_unlink(g, c);
        g->hooks.pass(g->hooks.cls, c->owner, c->fd, (const struct sockaddr *)&c->addr, c->addr_len);
        free(c);
        return;
    case HEAD_REFUSED:
        conn_refuse(g, c, &why);
        return;
    case HEAD_INCOMPLETE:
        if (c->eof) conn_close(g, c); /* it sent nothing and left */
        return;
    }
}

static void conn_event(struct gate *g, struct gate_conn *c, uint32_t events) {
    if (c->lingering) {
        conn_drain(g, c);
        return;
    }
    /* a reset, or the server's watchdog shut the socket down at the deadline */
    if (events & (EPOLLERR | EPOLLHUP)) {
        conn_close(g, c);
        return;
    }
    if (c->out) {
        if (events & EPOLLOUT) conn_write(g, c);
        return;
    }
    if (events & EPOLLRDHUP) c->eof = true;
    int queued = 0;
    if (ioctl(c->fd, FIONREAD, &queued)) queued = 0;
    size_t q = queued > 0 ? (size_t)queued : 0;
    if (c->eof || q <= GATE_SMALL_HEAD || q > g->lim.max_head || q >= c->n_seen + c->n_seen / 8 ||
        coti_time_us() - c->t_look_us >= GATE_TICK_MS * 1000)
        conn_look(g, c);
    else
        c->look_due = true;
}

static void accept_all(struct gate *g) {
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
        int fd = accept4(g->listen_fd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                coti_log(COTI_LOG_WARN, "http", "cannot accept a connection: %s", strerror(errno));
                epoll_ctl(g->epoll_fd, EPOLL_CTL_DEL, g->listen_fd, NULL);
                g->t_accept_resume_us = coti_time_us() + GATE_ACCEPT_PAUSE_MS * 1000;
            }
            return;
        }
        void *owner = g->hooks.admit(g->hooks.cls, fd, (struct sockaddr *)&ss, len);
        if (!owner) {
            close(fd);
            continue;
        }
        struct gate_conn *c = calloc(1, sizeof *c);
        if (!c) {
            g->hooks.drop(g->hooks.cls, owner);
            close(fd);
            continue;
        }
        c->fd = fd;
        c->owner = owner;
        memcpy(&c->addr, &ss, len);
        c->addr_len = len;
        c->t_look_us = coti_time_us();
        c->next = g->conns;
        if (g->conns) g->conns->prev = c;
        g->conns = c;
        /* bytes already queued are reported at once */
        struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET, .data.ptr = c};
        if (epoll_ctl(g->epoll_fd, EPOLL_CTL_ADD, fd, &ev)) conn_close(g, c);
    }
}

static void listen_watch(struct gate *g) {
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(g->epoll_fd, EPOLL_CTL_ADD, g->listen_fd, &ev);
}

/* Deferred looks, lingering deadlines, accepting again after a pause. */
static void tick(struct gate *g) {
    int64_t now = coti_time_us();
    if (g->t_accept_resume_us && now >= g->t_accept_resume_us) {
        g->t_accept_resume_us = 0;
        if (g->listen_fd >= 0) listen_watch(g);
    }
    for (struct gate_conn *c = g->conns, *next; c; c = next) {
        next = c->next;
        if (c->lingering && now - c->t_linger_us >= GATE_LINGER_MS * 1000) conn_close(g, c);
        else if (c->look_due && !c->out && now - c->t_look_us >= GATE_TICK_MS * 1000) conn_look(g, c);
    }
}

static void *gate_main(void *arg) {
    struct gate *g = arg;
    struct epoll_event evs[64];
    int64_t t_tick = coti_time_us();
    while (!atomic_load(&g->stop)) {
        int n = epoll_wait(g->epoll_fd, evs, 64, GATE_TICK_MS);
        for (int i = 0; i < n; i++) {
            void *p = evs[i].data.ptr;
            if (!p) {
                accept_all(g);
            } else if (p == &g->wake_fd) {
                uint64_t v;
                if (read(g->wake_fd, &v, sizeof v) < 0) { /* nothing to do: a wake-up is a wake-up */ }
                if (atomic_load(&g->quiesce) && g->listen_fd >= 0) {
                    epoll_ctl(g->epoll_fd, EPOLL_CTL_DEL, g->listen_fd, NULL);
                    close(g->listen_fd);
                    g->listen_fd = -1;
                }
            } else {
                conn_event(g, p, evs[i].events);
            }
        }
        int64_t now = coti_time_us();
        if (now - t_tick >= GATE_TICK_MS * 1000) {
            t_tick = now;
            tick(g);
        }
    }
    while (g->conns) conn_close(g, g->conns);
    return NULL;
}

static void gate_free(struct gate *g) {
    if (g->listen_fd >= 0) close(g->listen_fd);
    if (g->epoll_fd >= 0) close(g->epoll_fd);
    if (g->wake_fd >= 0) close(g->wake_fd);
    free(g->peek);
    free(g);
}

int gate_start(struct gate **out, const struct sockaddr *addr, socklen_t addr_len, const struct head_limits *lim,
               const struct gate_hooks *hooks, char *err, size_t err_size) {
    struct gate *g = calloc(1, sizeof *g);
    if (!g) return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory");
    g->lim = *lim;
    g->hooks = *hooks;
    g->listen_fd = g->epoll_fd = g->wake_fd = -1;
    atomic_init(&g->quiesce, false);
    atomic_init(&g->stop, false);
    g->peek = malloc(lim->max_head + 1);
    g->listen_fd = socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    g->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    g->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (!g->peek || g->listen_fd < 0 || g->epoll_fd < 0 || g->wake_fd < 0) {
        int rc = coti_fail(err, err_size, COTI_E_IO, "cannot set up the listening socket: %s", strerror(errno));
        gate_free(g);
        return rc;
    }
    int one = 1;
    setsockopt(g->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (addr->sa_family == AF_INET6) setsockopt(g->listen_fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (bind(g->listen_fd, addr, addr_len) || listen(g->listen_fd, SOMAXCONN)) {
        int rc = coti_fail(err, err_size, COTI_E_IO, "%s", strerror(errno));
        gate_free(g);
        return rc;
    }
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    getsockname(g->listen_fd, (struct sockaddr *)&ss, &len);
    g->port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                       : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    listen_watch(g);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &g->wake_fd};
    epoll_ctl(g->epoll_fd, EPOLL_CTL_ADD, g->wake_fd, &ev);
    if (pthread_create(&g->thread, NULL, gate_main, g)) {
        int rc = coti_fail(err, err_size, COTI_E_IO, "cannot start the connection thread");
        gate_free(g);
        return rc;
    }
    *out = g;
    return 0;
}

int gate_port(const struct gate *g) { return g->port; }

static void wake(struct gate *g) {
    uint64_t one = 1;
    if (write(g->wake_fd, &one, sizeof one) < 0) { /* the counter is full: a wake-up is pending anyway */ }
}

void gate_quiesce(struct gate *g) {
    if (!g) return;
    atomic_store(&g->quiesce, true);
    wake(g);
}

void gate_stop(struct gate *g) {
    if (!g) return;
    atomic_store(&g->stop, true);
    wake(g);
    pthread_join(g->thread, NULL);
    gate_free(g);
}
