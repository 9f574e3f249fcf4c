/* head.c — the request-head check (see head.h).
 *
 * What libmicrohttpd 0.9.75 does with a head, read from its connection.c, and what we do:
 * - Lines end at LF, CRLF or LF alone; empty lines before the request line are skipped. Same
 *   here; a CR anywhere else is refused (it ends no line in MHD, and RFC 9112 forbids it).
 * - Request line: MHD takes the method up to the first space and drops the connection without
 *   an answer when it is empty or there is no space; the version must be "HTTP/d.d" (else 400),
 *   major 0 or 2..9 is 505, 1.x is served as 1.1. Here: METHOD SP TARGET SP HTTP/d.d exactly,
 *   the method a token, the target visible bytes (MHD also takes spaces and control bytes).
 * - Header lines: MHD refuses a line without a colon (400), takes whitespace before the colon
 *   and an empty name, and joins a line starting with SP/HT to the previous one (as a header
 *   named " x" when it is the first). Here all of these are 400, as RFC 9112 §5 asks.
 * - Content-Length (the first one is used): digits only, no trailing space (else 400),
 *   beyond 2^64-1 it is 413. Here every one is checked, values that differ are 400 (request
 *   smuggling) and a value over the body limit is 413 at once.
 * - Transfer-Encoding other than exactly "chunked": MHD reads the body until the client closes
 *   (it never ends); here 501. With Content-Length as well: 400.
 * - Memory: MHD keeps the head in a pool of HTTP_CONNECTION_MEMORY bytes, half of it the read
 *   buffer, and adds a 64-byte record per header field, per query argument ('&'-separated)
 *   and per cookie, plus a copy of the Cookie header. Over the pool: 431 (or a hang, for query
 *   arguments). The field count bound keeps records + cookie copy within the other half. */
#include "server/head.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

struct head_scan {
    const struct head_limits *lim;
    struct head_refusal *why;
    size_t n_fields;             /* header fields + query arguments + cookies (MHD's records) */
    bool have_length, have_encoding;
    uint64_t length;
};

/* Fill the refusal; returns false for the callers' `return refuse(...)`. */
__attribute__((format(printf, 4, 5))) static bool refuse(struct head_scan *st, int status, const char *type,
                                                         const char *fmt, ...) {
    struct head_refusal *why = st->why;
    why->status = status;
    why->type = type;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why->message, sizeof why->message, fmt, ap);
    va_end(ap);
    return false;
}

static bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

/* RFC 9110 §5.6.2 token characters. */
static bool is_tchar(unsigned char c) {
    return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* Visible ASCII and bytes >= 0x80 (which MHD passes on; clients percent-encode them). */
static bool is_target_char(unsigned char c) { return c > ' ' && c != 0x7F; }

/* RFC 9110 §5.5 field-value bytes: visible, obs-text, space and tab. */
static bool is_value_char(unsigned char c) { return c == '\t' || (c >= ' ' && c != 0x7F); }

/* The request line s[0..len); complete: its LF was seen, else the bytes so far are checked as
 * far as they go (so a TLS handshake or a target over the limit is refused at once). */
static bool check_request_line(struct head_scan *st, const char *s, size_t len, bool complete) {
    static const char malformed[] = "malformed request line: expected METHOD TARGET HTTP/1.1";
    size_t i = 0;
    while (i < len && is_tchar((unsigned char)s[i])) i++;
    if (i < len && (i == 0 || s[i] != ' ')) return refuse(st, 400, "invalid_request_error", malformed);
    if (i == len) return complete ? refuse(st, 400, "invalid_request_error", malformed) : true;
    size_t t = ++i;
    while (i < len && is_target_char((unsigned char)s[i])) i++;
    if (i - t > st->lim->max_target)
        return refuse(st, 414, "invalid_request_error", "the URL exceeds the limit of %zu bytes", st->lim->max_target);
    if (i == len) return complete ? refuse(st, 400, "invalid_request_error", malformed) : true;
    if (s[i] != ' ' || i == t) return refuse(st, 400, "invalid_request_error", malformed);
    if (!complete) return true;
    const char *v = s + i + 1;
    if (len - i - 1 != 8 || memcmp(v, "HTTP/", 5) || !is_digit((unsigned char)v[5]) || v[6] != '.' ||
        !is_digit((unsigned char)v[7]))
        return refuse(st, 400, "invalid_request_error", malformed);
    if (v[5] != '1')
        return refuse(st, 505, "not_supported_error", "HTTP/%c.%c is not supported: use HTTP/1.1", v[5], v[7]);
    const char *q = memchr(s + t, '?', i - t);
    if (q) {
        st->n_fields++;
        for (; q < s + i; q++) st->n_fields += *q == '&';
    }
    return true;
}

static bool name_is(const char *s, size_t n, const char *name) { return n == strlen(name) && !strncasecmp(s, name, n); }

static bool check_content_length(struct head_scan *st, const char *v, size_t n) {
    if (n == 0) return refuse(st, 400, "invalid_request_error", "invalid Content-Length header");
    uint64_t x = 0;
    bool huge = false;
    for (size_t k = 0; k < n; k++) {
        if (!is_digit((unsigned char)v[k])) return refuse(st, 400, "invalid_request_error", "invalid Content-Length header");
        unsigned d = (unsigned)(v[k] - '0');
        if (x > (UINT64_MAX - d) / 10) huge = true;
        else x = x * 10 + d;
    }
    if (st->have_length && (huge || x != st->length))
        return refuse(st, 400, "invalid_request_error", "conflicting Content-Length headers");
    st->have_length = true;
    st->length = x;
    if (huge || x > st->lim->max_body)
        return refuse(st, 413, "invalid_request_error", "the request body exceeds the limit of %llu bytes",
                      (unsigned long long)st->lim->max_body);
    return true;
}

/* One header line s[0..len), len > 0. */
static bool check_field_line(struct head_scan *st, const char *s, size_t len) {
    if (s[0] == ' ' || s[0] == '\t')
        return refuse(st, 400, "invalid_request_error", "malformed header line: obsolete line folding is not accepted");
    size_t i = 0;
    while (i < len && is_tchar((unsigned char)s[i])) i++;
    if (i == len) return refuse(st, 400, "invalid_request_error", "malformed header line: no colon");
    if (s[i] != ':') {
        bool space = s[i] == ' ' || s[i] == '\t';
        return refuse(st, 400, "invalid_request_error", "malformed header line: %s",
                      !memchr(s + i, ':', len - i) ? "no colon"
                      : space                      ? "whitespace before the colon"
                                                   : "invalid character in the field name");
    }
    if (i == 0) return refuse(st, 400, "invalid_request_error", "malformed header line: empty field name");
    size_t v = i + 1;
    while (v < len && (s[v] == ' ' || s[v] == '\t')) v++;
    for (size_t k = v; k < len; k++)
        if (!is_value_char((unsigned char)s[k]))
            return refuse(st, 400, "invalid_request_error", "malformed header line: control character in the value of %.*s",
                          (int)(i < 64 ? i : 64), s);
    st->n_fields++;
    if (name_is(s, i, "Content-Length")) return check_content_length(st, s + v, len - v);
    if (name_is(s, i, "Transfer-Encoding")) {
        if (st->have_encoding || !name_is(s + v, len - v, "chunked"))
            return refuse(st, 501, "not_supported_error", "only the chunked transfer coding is supported");
        st->have_encoding = true;
    } else if (name_is(s, i, "Cookie")) {
        st->n_fields++;
        for (size_t k = v; k < len; k++) st->n_fields += s[k] == ';' || s[k] == ',';
    }
    return true;
}

enum head_verdict head_check(const char *buf, size_t n, bool eof, const struct head_limits *lim, size_t *n_head,
                             struct head_refusal *why) {
    struct head_scan st = {.lim = lim, .why = why};
    const size_t window = n < lim->max_head ? n : lim->max_head;
    size_t pos = 0;
    bool have_request_line = false;
    for (;;) {
        const char *lf = memchr(buf + pos, '\n', window - pos);
        if (!lf) break;
        const char *s = buf + pos;
        size_t len = (size_t)(lf - s);
        if (len && s[len - 1] == '\r') len--;
        pos = (size_t)(lf - buf) + 1;
        if (!have_request_line) {
            if (len == 0) continue; /* RFC 9112 §2.2: empty lines before the request line are ignored */
            if (!check_request_line(&st, s, len, true)) return HEAD_REFUSED;
            have_request_line = true;
        } else if (len == 0) {
            if (st.have_length && st.have_encoding) {
                refuse(&st, 400, "invalid_request_error", "Content-Length and Transfer-Encoding together");
                return HEAD_REFUSED;
            }
            *n_head = pos;
            return HEAD_ACCEPTED;
        } else if (!check_field_line(&st, s, len)) {
            return HEAD_REFUSED;
        }
        if (st.n_fields > lim->max_fields) {
            refuse(&st, 431, "invalid_request_error",
                   "the request has more than %zu header fields, query arguments and cookies", lim->max_fields);
            return HEAD_REFUSED;
        }
    }
    /* no end of head within the window */
    size_t rest = window - pos;
    if (!have_request_line) {
        size_t len = rest && buf[window - 1] == '\r' ? rest - 1 : rest;
        if (!check_request_line(&st, buf + pos, len, false)) return HEAD_REFUSED;
    }
    if (n > lim->max_head) {
        if (have_request_line)
            refuse(&st, 431, "invalid_request_error", "the request headers exceed the limit of %zu bytes", lim->max_head);
        else
            refuse(&st, 400, "invalid_request_error", "malformed request line: longer than %zu bytes", lim->max_head);
        return HEAD_REFUSED;
    }
    if (eof && (have_request_line || rest)) {
        refuse(&st, 400, "invalid_request_error", "incomplete request head: the client stopped sending before its end");
        return HEAD_REFUSED;
    }
    return HEAD_INCOMPLETE;
}
