/* common.c — error formatting, logging (with the escaping of untrusted text), clock, the
 * default thread count. */
#include "common.h"

#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
    fprintf(stderr, "%s.%03ldZ [%s] %s: ", stamp, ts.tv_nsec / 1000000, names[level], module);
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

/* Length of the valid UTF-8 sequence at s (at most n bytes), or 0: overlong forms, surrogates
 * and code points past U+10FFFF are invalid. *cp gets the code point. */
static size_t utf8_seq(const unsigned char *s, size_t n, uint32_t *cp) {
    size_t len;
    if (s[0] < 0x80) { *cp = s[0]; return 1; }
    if ((s[0] & 0xE0) == 0xC0) { len = 2; *cp = s[0] & 0x1F; }
    else if ((s[0] & 0xF0) == 0xE0) { len = 3; *cp = s[0] & 0x0F; }
    else if ((s[0] & 0xF8) == 0xF0) { len = 4; *cp = s[0] & 0x07; }
    else return 0;
    if (len > n) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        *cp = *cp << 6 | (s[i] & 0x3F);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (*cp < min_cp[len] || *cp > 0x10FFFF || (*cp >= 0xD800 && *cp <= 0xDFFF)) return 0;
    return len;
}

size_t coti_log_escape(char *dst, size_t dst_size, const char *s, size_t max_in) {
    size_t o = 0, i = 0;
    if (!dst_size) return 0;
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    size_t n = strnlen((const char *)p, max_in);
    while (i < n) {
        char esc[8];
        const char *out = esc;
        size_t out_len, in_len = 1;
        uint32_t cp;
        const unsigned char c = p[i];
        if (c == '"' || c == '\\') { esc[0] = '\\'; esc[1] = (char)c; out_len = 2; }
        else if (c == '\n') { memcpy(esc, "\\n", 2); out_len = 2; }
        else if (c == '\t') { memcpy(esc, "\\t", 2); out_len = 2; }
        else if (c == '\r') { memcpy(esc, "\\r", 2); out_len = 2; }
        else if ((in_len = utf8_seq(p + i, n - i, &cp)) == 0) { out = "\\ufffd"; out_len = 6; in_len = 1; }
        /* C0 and C1 controls and DEL would reach a terminal as commands */
        else if (cp < 0x20 || (cp >= 0x7F && cp < 0xA0)) { snprintf(esc, sizeof esc, "\\u%04x", (unsigned)cp); out_len = 6; }
        else { out = (const char *)p + i; out_len = in_len; }
        if (o + out_len + 1 > dst_size) break;
        memcpy(dst + o, out, out_len);
        o += out_len;
        i += in_len;
    }
    dst[o] = 0;
    return i;
}

/* The CPU list file of cpu's core, read into buf; false when there is none. */
static bool core_cpus(const char *cpu_dir, int cpu, char *buf, size_t size) {
    static const char *const names[] = {"core_cpus_list", "thread_siblings_list"};
    for (size_t k = 0; k < COTI_ARRAY_LEN(names); k++) {
        char path[512];
        snprintf(path, sizeof path, "%s/cpu%d/topology/%s", cpu_dir, cpu, names[k]);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        bool ok = fgets(buf, (int)size, f) != NULL;
        fclose(f);
        if (ok) { buf[strcspn(buf, "\n")] = 0; return true; }
    }
    return false;
}

int coti_physical_cores(const char *cpu_dir) {
    cpu_set_t allowed;
    int n_allowed = 0;
    if (sched_getaffinity(0, sizeof allowed, &allowed) == 0) n_allowed = CPU_COUNT(&allowed);
    else {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        CPU_ZERO(&allowed);
        for (long c = 0; c < n && c < CPU_SETSIZE; c++) CPU_SET((int)c, &allowed);
        n_allowed = n > 0 ? (int)COTI_MIN(n, CPU_SETSIZE) : 1;
    }
    /* a core counts once: at the first allowed CPU whose core's list is new */
    char (*seen)[64] = calloc(CPU_SETSIZE, sizeof *seen);
    int n_cores = 0;
    bool topology = seen != NULL;
    for (int c = 0; c < CPU_SETSIZE && topology; c++) {
        if (!CPU_ISSET(c, &allowed)) continue;
        char list[64];
        if (!core_cpus(cpu_dir, c, list, sizeof list)) { topology = false; break; }
        bool known = false;
        for (int k = 0; k < n_cores && !known; k++) known = !strcmp(seen[k], list);
        if (!known) snprintf(seen[n_cores++], sizeof seen[0], "%s", list);
    }
    free(seen);
    if (!topology || n_cores == 0) n_cores = n_allowed;
    return COTI_MAX(n_cores, 1);
}

char *coti_read_file(const char *path, size_t max_bytes, size_t *n_out) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) return NULL;
    size_t cap = 0, n = 0;
    char *buf = NULL;
    bool ok = true;
    for (;;) {
        if (!coti_grow(&buf, &cap, n + 4097, 1, 4097)) { ok = false; break; }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (max_bytes && n > max_bytes) { ok = false; break; }
        if (r == 0) break;
    }
    if (ok && ferror(f)) ok = false;
    if (f != stdin) fclose(f);
    if (!ok) { free(buf); return NULL; }
    buf[n] = 0;
    if (n_out) *n_out = n;
    return buf;
}
