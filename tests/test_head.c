/* test_head.c — server/head.c: which request heads pass on to libmicrohttpd, which wait for more
 * bytes, and the status each refused kind gets (the server tests check the answers on the wire). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/head.h"

static const struct head_limits lim = {.max_head = 1024, .max_target = 256, .max_fields = 8, .max_body = 1000};

static enum head_verdict check_eof(const char *s, bool eof, size_t *n_head, struct head_refusal *why) {
    return head_check(s, strlen(s), eof, &lim, n_head, why);
}

/* The status a head is refused with (0: accepted, -1: incomplete). */
static int status_of(const char *s) {
    size_t n_head = 0;
    struct head_refusal why = {0};
    switch (check_eof(s, false, &n_head, &why)) {
    case HEAD_ACCEPTED: return 0;
    case HEAD_INCOMPLETE: return -1;
    case HEAD_REFUSED:
        cr_assert(why.message[0], "a refusal without a message for %s", s);
        cr_assert_not_null(why.type);
        return why.status;
    }
    return -2;
}

Test(head, accepts_well_formed_heads_and_reports_their_length) {
    const char *get = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    size_t n_head = 0;
    struct head_refusal why;
    char buf[256];
    snprintf(buf, sizeof buf, "%s{\"body\":1}", get);
    cr_assert_eq(check_eof(buf, false, &n_head, &why), HEAD_ACCEPTED);
    cr_assert_eq(n_head, strlen(get), "the head ends after its empty line, before the body");
    /* LF alone ends lines; empty lines before the request line are skipped */
    cr_assert_eq(check_eof("\r\n\nPOST /v1/completions HTTP/1.0\nContent-Length: 0\n\n", false, &n_head, &why), HEAD_ACCEPTED);
    cr_assert_eq(status_of("GET / HTTP/1.1\r\nX-Empty:\r\nX-Tab:\tv\t\r\nX-Utf8: \xc3\xa9\r\n\r\n"), 0);
    cr_assert_eq(status_of("GET /a?b=1&c HTTP/1.1\r\n\r\n"), 0);
    cr_assert_eq(status_of("M-SEARCH * HTTP/1.1\r\n\r\n"), 0, "any token is a method; the routes answer 405");
    cr_assert_eq(status_of("GET / HTTP/1.2\r\n\r\n"), 0, "HTTP/1.x is served as HTTP/1.1 (RFC 9110 §6.2)");
    cr_assert_eq(status_of("POST / HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n"), 0);
    cr_assert_eq(status_of("POST / HTTP/1.1\r\nContent-Length: 5\r\ncontent-length: 005\r\n\r\n"), 0, "equal values may repeat");
}

Test(head, waits_for_the_rest_of_a_head) {
    cr_assert_eq(status_of(""), -1);
    cr_assert_eq(status_of("\r\n"), -1);
    cr_assert_eq(status_of("GE"), -1);
    cr_assert_eq(status_of("GET /heal"), -1);
    cr_assert_eq(status_of("GET /health HTTP/1."), -1);
    cr_assert_eq(status_of("GET /health HTTP/1.1\r"), -1);
    cr_assert_eq(status_of("GET /health HTTP/1.1\r\nHost: x\r\n"), -1);
    cr_assert_eq(status_of("GET /health HTTP/1.1\r\nHost: x\r\n\r"), -1);
}

Test(head, refuses_malformed_request_lines) {
    cr_assert_eq(status_of("GARBAGE\r\n\r\n"), 400, "no space: MHD drops it without an answer");
    cr_assert_eq(status_of(" GET / HTTP/1.1\r\n\r\n"), 400, "empty method");
    cr_assert_eq(status_of("GET /\r\n\r\n"), 400, "HTTP/0.9 form, no version");
    cr_assert_eq(status_of("GET  / HTTP/1.1\r\n\r\n"), 400);
    cr_assert_eq(status_of("GET / HTTP/1.1 \r\n\r\n"), 400);
    cr_assert_eq(status_of("GET /a b HTTP/1.1\r\n\r\n"), 400, "a space in the target");
    cr_assert_eq(status_of("GET /a\tb HTTP/1.1\r\n\r\n"), 400);
    cr_assert_eq(status_of("G(T / HTTP/1.1\r\n\r\n"), 400, "not a token");
    cr_assert_eq(status_of("GET / http/1.1\r\n\r\n"), 400, "the version is case-sensitive");
    cr_assert_eq(status_of("GET / HTTP/1.10\r\n\r\n"), 400);
    cr_assert_eq(status_of("GET / HTTP/2\r\n\r\n"), 400);
    cr_assert_eq(status_of("GET / HTTP/1.1\r\r\n\r\n"), 400, "a CR that ends no line");
    char nul[] = "GET /a_b HTTP/1.1\r\n\r\n";
    nul[6] = 0;
    size_t n_head;
    struct head_refusal why;
    cr_assert_eq(head_check(nul, sizeof nul - 1, false, &lim, &n_head, &why), HEAD_REFUSED);
    cr_assert_eq(why.status, 400, "NUL in the target");
}

Test(head, refuses_unsupported_versions_with_505) {
    size_t n_head;
    struct head_refusal why;
    cr_assert_eq(check_eof("GET / HTTP/2.0\r\nHost: x\r\n\r\n", false, &n_head, &why), HEAD_REFUSED);
    cr_assert_eq(why.status, 505);
    cr_assert_str_eq(why.message, "HTTP/2.0 is not supported: use HTTP/1.1");
    cr_assert_eq(status_of("GET / HTTP/0.9\r\n\r\n"), 505);
    cr_assert_eq(status_of("GET / HTTP/3.0\r\n\r\n"), 505);
}

Test(head, refuses_a_different_protocol_before_any_line_ends) {
    /* the first bytes of a TLS ClientHello: no line end in sight, refused at once */
    const char tls[] = "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03";
    size_t n_head;
    struct head_refusal why;
    cr_assert_eq(head_check(tls, sizeof tls - 1, false, &lim, &n_head, &why), HEAD_REFUSED);
    cr_assert_eq(why.status, 400);
}

Test(head, refuses_malformed_header_lines) {
    cr_assert_eq(status_of("GET / HTTP/1.1\r\nHost x\r\n\r\n"), 400, "no colon");
    cr_assert_eq(status_of("GET / HTTP/1.1\r\nHost : x\r\n\r\n"), 400, "whitespace before the colon");
    cr_assert_eq(status_of("GET / HTTP/1.1\r\n: x\r\n\r\n"), 400, "empty name");
    cr_assert_eq(status_of("GET / HTTP/1.1\r\nHo(st: x\r\n\r\n"), 400, "not a token");
    cr_assert_eq(status_of("GET / HTTP/1.1\r\nHost: x\r\n y\r\n\r\n"), 400, "obs-fold");
    cr_assert_eq(status_of("GET / HTTP/1.1\r\n\tHost: x\r\n\r\n"), 400, "obs-fold as the first line");
    cr_assert_eq(status_of("GET / HTTP/1.1\r\nHost: x\ry\r\n\r\n"), 400, "a CR inside a value");
    cr_assert_eq(status_of("GET / HTTP/1.1\r\nHost: x\x7fy\r\n\r\n"), 400, "DEL inside a value");
    cr_assert_eq(status_of("GET / HTTP/1.1\r\nHost: x\x01y\r\n\r\n"), 400);
    size_t n_head;
    struct head_refusal why;
    cr_assert_eq(check_eof("GET / HTTP/1.1\r\nHost x\r\n\r\n", false, &n_head, &why), HEAD_REFUSED);
    cr_assert_str_eq(why.message, "malformed header line: no colon");
    cr_assert_eq(check_eof("GET / HTTP/1.1\r\nHost\t: x\r\n\r\n", false, &n_head, &why), HEAD_REFUSED);
    cr_assert_str_eq(why.message, "malformed header line: whitespace before the colon");
}

Test(head, checks_content_length_and_transfer_encoding) {
    cr_assert_eq(status_of("POST / HTTP/1.1\r\nContent-Length: 1000\r\n\r\n"), 0);
    cr_assert_eq(status_of("POST / HTTP/1.1\r\nContent-Length: 1001\r\n\r\n"), 413);
    cr_assert_eq(status_of("POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n"), 413);
    cr_assert_eq(status_of("POST / HTTP/1.1\r\nContent-Length: abc\r\n\r\n"), 400);
    cr_assert_eq(status_of("POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n"), 400);
    cr_assert_eq(status_of("POST / HTTP/1.1\r\nContent-Length: 5 \r\n\r\n"), 400, "MHD refuses a trailing space");
    cr_assert_eq(status_of("POST / HTTP/1.1\r\nContent-Length:\r\n\r\n"), 400);
    cr_assert_eq(status_of("POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n"), 400);
    cr_assert_eq(status_of("POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n"), 501);
    cr_assert_eq(status_of("POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"), 501);
    cr_assert_eq(status_of("POST / HTTP/1.1\r\nTransfer-Encoding: chunked \r\n\r\n"), 501, "MHD would read forever");
    cr_assert_eq(status_of("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"), 501);
    cr_assert_eq(status_of("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n"), 400);
}

Test(head, bounds_head_size_target_and_field_count) {
    char buf[2048];
    /* a target over the limit is refused as soon as it is seen, line end or not */
    snprintf(buf, sizeof buf, "GET /%0300d", 0);
    cr_assert_eq(status_of(buf), 414);
    snprintf(buf, sizeof buf, "GET /%0255d HTTP/1.1\r\n\r\n", 0);
    cr_assert_eq(status_of(buf), 0, "a target of exactly the limit");
    /* headers over max_head: 431; a request line that long: 400 */
    snprintf(buf, sizeof buf, "GET / HTTP/1.1\r\nX: %01100d\r\n\r\n", 0);
    cr_assert_eq(status_of(buf), 431);
    snprintf(buf, sizeof buf, "GET / HTTP/1.1\r\nX: %01100d", 0);
    cr_assert_eq(status_of(buf), 431, "incomplete, and already over the limit");
    snprintf(buf, sizeof buf, "%01100d", 0);
    cr_assert_eq(status_of(buf), 400);
    /* a head of exactly max_head passes */
    size_t n = (size_t)snprintf(buf, sizeof buf, "GET / HTTP/1.1\r\nX: ");
    while (n < lim.max_head - 4) buf[n++] = 'x';
    memcpy(buf + n, "\r\n\r\n", 5);
    cr_assert_eq(strlen(buf), lim.max_head);
    cr_assert_eq(status_of(buf), 0);
    /* fields: headers, query arguments and cookies together */
    cr_assert_eq(status_of("GET / HTTP/1.1\r\na:1\r\nb:2\r\nc:3\r\nd:4\r\ne:5\r\nf:6\r\ng:7\r\nh:8\r\n\r\n"), 0);
    cr_assert_eq(status_of("GET / HTTP/1.1\r\na:1\r\nb:2\r\nc:3\r\nd:4\r\ne:5\r\nf:6\r\ng:7\r\nh:8\r\ni:9\r\n\r\n"), 431);
    cr_assert_eq(status_of("GET /?a&b&c&d HTTP/1.1\r\na:1\r\nb:2\r\nc:3\r\nd:4\r\n\r\n"), 0);
    cr_assert_eq(status_of("GET /?a&b&c&d&e HTTP/1.1\r\na:1\r\nb:2\r\nc:3\r\nd:4\r\n\r\n"), 431);
    /* the Cookie field and its 7 cookies: 8 records */
    cr_assert_eq(status_of("GET / HTTP/1.1\r\nCookie: a=1; b=2; c=3; d=4; e=5; f=6; g=7\r\n\r\n"), 0);
    cr_assert_eq(status_of("GET / HTTP/1.1\r\nCookie: a=1; b=2; c=3; d=4; e=5; f=6; g=7, h=8\r\n\r\n"), 431);
}

Test(head, at_eof_an_incomplete_head_is_refused_unless_nothing_came) {
    size_t n_head;
    struct head_refusal why;
    cr_assert_eq(check_eof("", true, &n_head, &why), HEAD_INCOMPLETE);
    cr_assert_eq(check_eof("\r\n\r\n", true, &n_head, &why), HEAD_INCOMPLETE);
    cr_assert_eq(check_eof("GET / HTTP/1.1\r\nHost: x\r\n", true, &n_head, &why), HEAD_REFUSED);
    cr_assert_eq(why.status, 400);
    cr_assert_eq(check_eof("GET / HT", true, &n_head, &why), HEAD_REFUSED);
    cr_assert_eq(check_eof("GET / HTTP/1.1\r\n\r\n", true, &n_head, &why), HEAD_ACCEPTED, "a complete head, then half-close");
}

Test(head, never_reads_past_max_head_plus_one) {
    /* the gate peeks max_head + 1 bytes: a buffer of exactly that size, no terminator */
    char *buf = malloc(lim.max_head + 1);
    memset(buf, 'a', lim.max_head + 1);
    memcpy(buf, "GET / HTTP/1.1\r\nX: ", 19);
    size_t n_head;
    struct head_refusal why;
    cr_assert_eq(head_check(buf, lim.max_head + 1, false, &lim, &n_head, &why), HEAD_REFUSED);
    cr_assert_eq(why.status, 431);
    free(buf);
}
