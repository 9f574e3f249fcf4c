/* common.c — error formatting, logging, clock. */
#include "common.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum coti_log_level coti_log_min_level = COTI_LOG_INFO;

int coti_fail(char *err, size_t err_size, int code, const char *fmt, ...) {
    if (err && err_size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_size, fmt, ap);
        va_end(ap);
    }
    return code;
}

void coti_log(enum coti_log_level level, const char *module, const char *fmt, ...) {
    static const char *names[] = {"debug", "info", "warn", "error"};
    if (level < coti_log_min_level) return;
    fprintf(stderr, "[%s] %s: ", names[level], module);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

int64_t coti_time_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

bool coti_grow(void *ptr_addr, size_t *cap, size_t need, size_t elem, size_t first) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : first, bytes;
    while (c < need) {
        if (c > SIZE_MAX / 2) { c = need; break; }
        c *= 2;
    }
    void *p;
    memcpy(&p, ptr_addr, sizeof p);   /* ptr_addr may point at any object pointer type */
    if (!coti_mul_size(c, elem, &bytes) || !(p = realloc(p, bytes))) return false;
    memcpy(ptr_addr, &p, sizeof p);
    *cap = c;
    return true;
}
