/* gate.h — the listening socket and the wait for each new connection's first request head,
 * in front of libmicrohttpd: one thread, one epoll set. A connection's bytes are only peeked
 * at (MSG_PEEK) until head.h says the head is complete and acceptable; then the socket is
 * passed on (to MHD_add_connection, which reads the same bytes). A refused head is answered
 * here, in JSON, and the connection closed. Knows nothing of libmicrohttpd or the routes: the
 * server (http.c) decides through the hooks. */
#ifndef COTI_SERVER_GATE_H
#define COTI_SERVER_GATE_H

#include <stddef.h>
#include <sys/socket.h>

#include "server/head.h"

struct gate;

/* What the server decides; called on the gate's thread. */
struct gate_hooks {
    void *cls;
    /* A connection was accepted: its handle, or NULL to refuse it (the gate closes it). */
    void *(*admit)(void *cls, int fd, const struct sockaddr *addr, socklen_t addr_len);
    /* Its first head is complete and accepted: from now on the socket is the callee's. */
    void (*pass)(void *cls, void *conn, int fd, const struct sockaddr *addr, socklen_t addr_len);
    /* The gate refused its head with this JSON answer (for the log and the counters). */
    void (*refused)(void *cls, void *conn, const struct head_refusal *why);
    /* The gate is about to close the socket (refused, gone, or cut by the server's deadline):
     * the handle must be forgotten first. */
    void (*drop)(void *cls, void *conn);
};

/* Listen on addr and start the thread. Returns 0, or -1 with err (address in use, ...). */
int gate_start(struct gate **out, const struct sockaddr *addr, socklen_t addr_len, const struct head_limits *lim,
               const struct gate_hooks *hooks, char *err, size_t err_size);
/* The port listened on. */
int gate_port(const struct gate *g);
/* Close the listening socket (new connections are refused by the kernel); connections already
 * accepted go on. */
void gate_quiesce(struct gate *g);
/* Stop the thread and close every connection still waiting (each dropped first). */
void gate_stop(struct gate *g);

#endif
