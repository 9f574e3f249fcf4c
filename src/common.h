/* common.h — error codes, logging and small helpers shared by every module.
 * Convention (style.md §8): functions return 0 or a negative enum coti_err; a
 * human-readable message goes into a caller-owned buffer (char *err, size_t err_size). */
#ifndef COTI_COMMON_H
#define COTI_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

enum coti_err {
    COTI_OK = 0,
    COTI_E_IO = -1,        /* open/read/mmap/write failed */
    COTI_E_FORMAT = -2,    /* untrusted input is malformed */
    COTI_E_UNSUPPORTED = -3,
    COTI_E_NOMEM = -4,
    COTI_E_ARG = -5,       /* caller passed an invalid parameter */
    COTI_E_RANGE = -6,     /* a value is out of its allowed range (context full, ...) */
};

/* printf into err (may be NULL); always returns code so callers can `return coti_fail(...)`. */
int coti_fail(char *err, size_t err_size, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

enum coti_log_level { COTI_LOG_DEBUG, COTI_LOG_INFO, COTI_LOG_WARN, COTI_LOG_ERROR };
extern enum coti_log_level coti_log_min_level;
/* Diagnostics to stderr, one line each: UTC time (ISO 8601, milliseconds), level, module tag;
 * stdout is for product output only. */
void coti_log(enum coti_log_level level, const char *module, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Untrusted text for a log line, escaped as the inside of a JSON string: quotes, backslashes
 * and control characters as JSON escapes, invalid UTF-8 as \ufffd, valid UTF-8 kept. At most
 * max_in bytes of s are read, and an escape is never cut by dst_size; dst is always
 * terminated. Returns the bytes of s consumed (< strlen(s) when the text was cut). */
size_t coti_log_escape(char *dst, size_t dst_size, const char *s, size_t max_in);

/* The physical cores this process may run on (the default thread count, as llama.cpp's):
 * CPUs of the affinity mask counted once per core, a core being the set of CPUs listed in
 * <cpu_dir>/cpuN/topology/core_cpus_list (or thread_siblings_list on older kernels).
 * cpu_dir is /sys/devices/system/cpu but for tests; without topology files, the CPUs of
 * the mask, else the online CPUs. At least 1. */
int coti_physical_cores(const char *cpu_dir);

/* Monotonic clock in microseconds. */
int64_t coti_time_us(void);

/* Overflow-checked size arithmetic: return false on overflow. */
static inline bool coti_mul_size(size_t a, size_t b, size_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool coti_add_size(size_t a, size_t b, size_t *out) {
    return !__builtin_add_overflow(a, b, out);
}

/* Make the array whose pointer is at ptr_addr (any T **) hold at least need elements of elem
 * bytes: the capacity *cap doubles, starting from first when it is 0, and is need itself when
 * doubling would overflow. Returns false (array and *cap untouched) on overflow or when
 * realloc fails. The one growth rule for the byte and element buffers of the tokenizer, the
 * chat renderer and the server. */
bool coti_grow(void *ptr_addr, size_t *cap, size_t need, size_t elem, size_t first);

/* All of a file (standard input for "-"), NUL-terminated, malloc'ed; its length in *n (NULL-able).
 * NULL when it cannot be read, or when it is longer than max_bytes (0: no limit). */
char *coti_read_file(const char *path, size_t max_bytes, size_t *n);

#define COTI_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define COTI_MIN(a, b) ((a) < (b) ? (a) : (b))
#define COTI_MAX(a, b) ((a) > (b) ? (a) : (b))

#endif
