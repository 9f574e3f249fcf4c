/* head.h — the check of a request head before libmicrohttpd reads it (server/gate.c): from
 * the bytes received so far, is the head complete, and may libmicrohttpd 0.9.75 have it? What
 * that version refuses with its own HTML answer (or reads forever, or drops without a word)
 * is refused here with the status it should get and a message for the JSON error. The grammar
 * accepted is RFC 9112's, a subset of what libmicrohttpd accepts, with the field count bounded
 * so that libmicrohttpd's per-connection memory always holds the head. Knows nothing of
 * sockets. */
#ifndef COTI_SERVER_HEAD_H
#define COTI_SERVER_HEAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum head_verdict {
    HEAD_INCOMPLETE,             /* no error so far; the head has not ended yet */
    HEAD_ACCEPTED,               /* complete, and libmicrohttpd will take it as it is */
    HEAD_REFUSED,                /* answer the refusal, then close */
};

struct head_limits {
    size_t max_head;             /* request line, header lines and the empty line: 431 (414) */
    size_t max_target;           /* request target, path and query: 414 */
    size_t max_fields;           /* header fields + query arguments + cookies: 431 */
    uint64_t max_body;           /* an announced Content-Length: 413 */
};

struct head_refusal {
    int status;                  /* 400, 413, 414, 431, 501 or 505 */
    const char *type;            /* OpenAI error type */
    char message[160];
};

/* Check the first n bytes received on a connection (eof: the client sent nothing more and
 * half-closed). HEAD_ACCEPTED sets *n_head to the head's length; HEAD_REFUSED fills *why. An
 * incomplete head at eof is refused (400) unless nothing but empty lines came. Reads at most
 * lim->max_head + 1 bytes of buf. */
enum head_verdict head_check(const char *buf, size_t n, bool eof, const struct head_limits *lim, size_t *n_head,
                             struct head_refusal *why);

#endif
