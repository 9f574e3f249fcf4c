/* fuzz_head.c — libFuzzer target for the request-head check (src/server/head.c) that stands
 * before libmicrohttpd: any bytes, either end of stream. Besides crashes and sanitizer reports
 * it checks what the gate relies on: an accepted head ends with its LF inside the bytes and the
 * limit, and is accepted alike without the bytes after it (the body); a refusal has a status
 * the gate can send and a message, and is final (the same for any longer input). The limits
 * are small so that libFuzzer's inputs reach them. Built by `make fuzz` into build-fuzz/; seeds
 * in fuzz/corpus/head/. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/head.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const struct head_limits lim = {.max_head = 512, .max_target = 128, .max_fields = 8, .max_body = 1000};

static bool sendable(int status) {
    return status == 400 || status == 413 || status == 414 || status == 431 || status == 501 || status == 505;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    bool eof = data[0] & 1;
    size_t split = data[0] >> 1; /* a shorter prefix, as the gate sees before the rest arrives */
    const char *buf = (const char *)data + 1;
    size_t n = size - 1;
    size_t n_head = 0;
    struct head_refusal why = {0};
    enum head_verdict v = head_check(buf, n, eof, &lim, &n_head, &why);
    if (v == HEAD_ACCEPTED) {
        if (n_head == 0 || n_head > n || n_head > lim.max_head || buf[n_head - 1] != '\n') abort();
        size_t n2 = 0;
        struct head_refusal why2;
        if (head_check(buf, n_head, false, &lim, &n2, &why2) != HEAD_ACCEPTED || n2 != n_head) abort();
    } else if (v == HEAD_REFUSED) {
        if (!sendable(why.status) || !why.message[0] || !why.type) abort();
    }
    if (split < n) {
        struct head_refusal why_prefix = {0};
        size_t n3 = 0;
        if (head_check(buf, split, false, &lim, &n3, &why_prefix) == HEAD_REFUSED &&
            (head_check(buf, n, false, &lim, &n3, &why) != HEAD_REFUSED || why.status != why_prefix.status))
            abort();
    }
    return 0;
}
