/* gguf.c — GGUF v2/v3 reader and v3 writer.
 *
 * Owns: parsing and complete validation of untrusted GGUF bytes (header, metadata, tensor
 * directory, data-section bounds), the read-only mmap behind gguf_open, typed metadata
 * getters, and the writer (in-memory or streamed to a file). Knows nothing of models.
 * Reference: ../shared/docs/gguf-format.md. Every length read from a file is checked against
 * the bytes that remain before anything is read or allocated; size arithmetic is overflow
 * checked; errors name the record, the value and the allowed range (style.md §8). */
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------
 * Limits. Each one bounds what an untrusted file can make us do.
 * ------------------------------------------------------------------------------------- */

/* magic + version + n_tensors + n_kv. */
#define GGUF_HEADER_BYTES 24
/* The format's default when general.alignment is absent. */
#define GGUF_DEFAULT_ALIGNMENT 32
/* llama.cpp refuses longer strings; the longest legitimate ones (chat templates) are ~100 KB. */
#define GGUF_MAX_STRING_LEN (1ull << 30)
/* llama.cpp's limit; the largest real arrays (vocab, merges) hold a few 100 000 entries. */
#define GGUF_MAX_ARRAY_LEN (1ull << 30)
/* Keys are short dotted identifiers; anything longer is corrupt, and it keeps messages short. */
#define GGUF_MAX_KEY_LEN 1024
/* ggml's GGML_MAX_NAME is 64 bytes including the NUL: llama.cpp cannot load longer names. */
#define GGUF_MAX_TENSOR_NAME_LEN 63
/* ggml tensors have at most 4 dimensions (GGML_MAX_DIMS); gguf_tensor.ne has 4 slots. */
#define GGUF_MAX_DIMS 4
/* Smallest possible encodings of one record; counts claimed by the header are bounded by
 * (bytes left) / (smallest record) before anything is allocated for them. */
#define GGUF_MIN_KV_BYTES (8 + 1 + 4 + 1)                /* key len, 1-byte key, type, u8 */
#define GGUF_MIN_TENSOR_INFO_BYTES (8 + 1 + 4 + 8 + 4 + 8) /* name, n_dims, ne[0], type, offset */
/* How many characters of a file-provided name an error message quotes. */
#define GGUF_ERR_NAME_CHARS 80

/* Private view: the public struct first, plus sorted indices for lookups. */
struct gguf_file_priv {
    struct gguf_file pub;
    size_t *kv_sorted;      /* kv indices sorted by key */
    size_t *tensor_sorted;  /* tensor indices sorted by name */
};

static struct gguf_file_priv *priv_of(const struct gguf_file *f) {
    return (struct gguf_file_priv *)(uintptr_t)f;   /* pub is the first member */
}

const char *gguf_type_name(enum gguf_type t) {
    static const char *const names[] = {
        "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool",
        "string", "array", "uint64", "int64", "float64",
    };
    if ((int)t < 0 || (size_t)t >= COTI_ARRAY_LEN(names)) return "?";
    return names[t];
}

static bool gguf_type_valid(int32_t t) { return t >= 0 && t <= GGUF_TYPE_FLOAT64; }

/* Bytes of one element of a fixed-size type; 0 for STRING and ARRAY. */
static size_t gguf_type_size(enum gguf_type t) {
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

static bool gguf_type_is_int(enum gguf_type t) {
    return t == GGUF_TYPE_UINT8 || t == GGUF_TYPE_INT8 || t == GGUF_TYPE_UINT16 ||
           t == GGUF_TYPE_INT16 || t == GGUF_TYPE_UINT32 || t == GGUF_TYPE_INT32 ||
           t == GGUF_TYPE_UINT64 || t == GGUF_TYPE_INT64;
}

static bool gguf_type_is_signed(enum gguf_type t) {
    return t == GGUF_TYPE_INT8 || t == GGUF_TYPE_INT16 || t == GGUF_TYPE_INT32 ||
           t == GGUF_TYPE_INT64;
}

/* Little-endian loads that do not depend on host byte order or alignment. */
static uint64_t load_le(const uint8_t *p, size_t n) {
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;) v = v << 8 | p[i];
    return v;
}

static void store_le(uint8_t *p, uint64_t v, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Writes a quoted, printable excerpt of file-provided bytes into buf (for messages). */
static const char *printable(const char *s, size_t n, char *buf, size_t buf_size) {
    size_t o = 0;
    for (size_t i = 0; i < n && o + 5 < buf_size; i++) {
        unsigned char c = (unsigned char)s[i];
        if (i == GGUF_ERR_NAME_CHARS) { memcpy(buf + o, "...", 3); o += 3; break; }
        if (c >= 0x20 && c < 0x7f && c != '\\') buf[o++] = (char)c;
        else o += (size_t)snprintf(buf + o, buf_size - o, "\\x%02x", c);
    }
    buf[o < buf_size ? o : buf_size - 1] = '\0';
    return buf;
}

/* x rounded up to a multiple of a (a power of two); false on overflow. */
static bool pad_size(size_t x, size_t a, size_t *out) {
    size_t t;
    if (!coti_add_size(x, a - 1, &t)) return false;
    *out = t & ~(a - 1);
    return true;
}

/* ---------------------------------------------------------------------------------------
 * Reader: a cursor over untrusted bytes. ctx names the record being parsed for messages.
 * ------------------------------------------------------------------------------------- */

struct rd {
    const uint8_t *p;
    size_t size, pos;
    char *err;
    size_t err_size;
    char ctx[160];
};

static size_t rd_left(const struct rd *r) { return r->size - r->pos; }

static int rd_take(struct rd *r, size_t n, const uint8_t **out, const char *what) {
    if (n > rd_left(r))
        return coti_fail(r->err, r->err_size, COTI_E_FORMAT,
                         "%s: truncated file: %s needs %zu bytes at offset %zu but %zu remain",
                         r->ctx, what, n, r->pos, rd_left(r));
    *out = r->p + r->pos;
    r->pos += n;
    return 0;
}

static int rd_uint(struct rd *r, size_t n, uint64_t *v, const char *what) {
    const uint8_t *q = NULL;
    *v = 0;
    int rc = rd_take(r, n, &q, what);
    if (rc) return rc;
    *v = load_le(q, n);
    return 0;
}

static int rd_u32(struct rd *r, uint32_t *v, const char *what) {
    uint64_t t = 0;
    int rc = rd_uint(r, 4, &t, what);
    *v = (uint32_t)t;
    return rc;
}

static int rd_i32(struct rd *r, int32_t *v, const char *what) {
    uint64_t t = 0;
    int rc = rd_uint(r, 4, &t, what);
    *v = (int32_t)(uint32_t)t;   /* two's complement reinterpretation, defined for uint32 */
    return rc;
}

static int rd_u64(struct rd *r, uint64_t *v, const char *what) { return rd_uint(r, 8, v, what); }

/* A GGUF string: u64 length + bytes. Checks the length against max_len and the bytes left. */
static int rd_str(struct rd *r, uint64_t max_len, const char **s, size_t *len, const char *what) {
    uint64_t n;
    int rc = rd_u64(r, &n, what);
    if (rc) return rc;
    if (n > max_len)
        return coti_fail(r->err, r->err_size, COTI_E_FORMAT,
                         "%s: %s length %llu exceeds the limit of %llu bytes", r->ctx, what,
                         (unsigned long long)n, (unsigned long long)max_len);
    if (n > rd_left(r))
        return coti_fail(r->err, r->err_size, COTI_E_FORMAT,
                         "%s: %s length %llu exceeds the %zu bytes left in the file at offset %zu",
                         r->ctx, what, (unsigned long long)n, rd_left(r), r->pos);
    *s = (const char *)(r->p + r->pos);
    *len = (size_t)n;
    r->pos += (size_t)n;
    return 0;
}

static char *dup_bytes(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (!d) return NULL;
    if (n) memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

/* Reads an array of n strings into one allocation: n pointers followed by the NUL-terminated
 * copies. Lengths are validated in a first pass so the allocation is exactly what the file
 * actually holds. */
static int rd_str_array(struct rd *r, uint64_t n, char ***out) {
    size_t start = r->pos, total = 0;
    if (n > rd_left(r) / 8)   /* each element needs at least its 8-byte length */
        return coti_fail(r->err, r->err_size, COTI_E_FORMAT,
                         "%s: string array of %llu elements cannot fit in the %zu bytes left",
                         r->ctx, (unsigned long long)n, rd_left(r));
    for (uint64_t i = 0; i < n; i++) {
        const char *s;
        size_t len;
        int rc = rd_str(r, GGUF_MAX_STRING_LEN, &s, &len, "array element");
        if (rc) return rc;
        if (!coti_add_size(total, len + 1, &total))
            return coti_fail(r->err, r->err_size, COTI_E_FORMAT, "%s: string array too large", r->ctx);
    }
    size_t ptr_bytes, all;
    if (!coti_mul_size((size_t)n, sizeof(char *), &ptr_bytes) ||
        !coti_add_size(ptr_bytes, total, &all))
        return coti_fail(r->err, r->err_size, COTI_E_FORMAT, "%s: string array too large", r->ctx);
    char **arr = malloc(all ? all : 1);
    if (!arr)
        return coti_fail(r->err, r->err_size, COTI_E_NOMEM, "%s: out of memory (%zu bytes)", r->ctx, all);
    char *dst = (char *)arr + ptr_bytes;
    r->pos = start;
    for (uint64_t i = 0; i < n; i++) {   /* second pass cannot fail: lengths were checked */
        size_t len = (size_t)load_le(r->p + r->pos, 8);
        r->pos += 8;
        memcpy(dst, r->p + r->pos, len);
        dst[len] = '\0';
        arr[i] = dst;
        dst += len + 1;
        r->pos += len;
    }
    *out = arr;
    return 0;
}

static void set_scalar(struct gguf_kv *kv, enum gguf_type t, uint64_t raw) {
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_UINT32: case GGUF_TYPE_UINT64:
        kv->v.u64 = raw; break;
    case GGUF_TYPE_INT8: kv->v.i64 = (int8_t)(uint8_t)raw; break;
    case GGUF_TYPE_INT16: kv->v.i64 = (int16_t)(uint16_t)raw; break;
    case GGUF_TYPE_INT32: kv->v.i64 = (int32_t)(uint32_t)raw; break;
    case GGUF_TYPE_INT64: kv->v.i64 = (int64_t)raw; break;
    case GGUF_TYPE_FLOAT32: { uint32_t b = (uint32_t)raw; float x; memcpy(&x, &b, 4); kv->v.f64 = x; break; }
    case GGUF_TYPE_FLOAT64: { double x; memcpy(&x, &raw, 8); kv->v.f64 = x; break; }
    case GGUF_TYPE_BOOL: kv->v.b = raw != 0; break;   /* any non-zero byte is true */
    default: break;
    }
}

static int parse_kv(struct rd *r, uint64_t idx, struct gguf_kv *kv) {
    char nb[GGUF_ERR_NAME_CHARS * 4 + 8];
    const char *key;
    size_t key_len;
    snprintf(r->ctx, sizeof r->ctx, "kv %llu", (unsigned long long)idx);
    int rc = rd_str(r, GGUF_MAX_KEY_LEN, &key, &key_len, "key");
    if (rc) return rc;
    if (key_len == 0)
        return coti_fail(r->err, r->err_size, COTI_E_FORMAT, "%s: empty key", r->ctx);
    if (memchr(key, '\0', key_len))
        return coti_fail(r->err, r->err_size, COTI_E_FORMAT, "%s: key '%s' contains a NUL byte",
                         r->ctx, printable(key, key_len, nb, sizeof nb));
    if (!(kv->key = dup_bytes(key, key_len)))
        return coti_fail(r->err, r->err_size, COTI_E_NOMEM, "%s: out of memory", r->ctx);
    snprintf(r->ctx, sizeof r->ctx, "kv %llu '%s'", (unsigned long long)idx,
             printable(key, key_len, nb, sizeof nb));

    int32_t t;
    if ((rc = rd_i32(r, &t, "value type"))) return rc;
    if (!gguf_type_valid(t))
        return coti_fail(r->err, r->err_size, COTI_E_FORMAT,
                         "%s: value type %d is not a GGUF type (must be in [0, %d])", r->ctx, t,
                         GGUF_TYPE_FLOAT64);
    kv->type = (enum gguf_type)t;
    kv->n = 1;

    if (kv->type == GGUF_TYPE_STRING) {
        const char *s;
        size_t len;
        if ((rc = rd_str(r, GGUF_MAX_STRING_LEN, &s, &len, "string value"))) return rc;
        if (!(kv->str = dup_bytes(s, len)))
            return coti_fail(r->err, r->err_size, COTI_E_NOMEM, "%s: out of memory (%zu bytes)", r->ctx, len);
        kv->str_len = len;
        return 0;
    }
    if (kv->type != GGUF_TYPE_ARRAY) {
        uint64_t raw;
        if ((rc = rd_uint(r, gguf_type_size(kv->type), &raw, "value"))) return rc;
        set_scalar(kv, kv->type, raw);
        return 0;
    }

    int32_t et;
    uint64_t n;
    if ((rc = rd_i32(r, &et, "array element type"))) return rc;
    if (!gguf_type_valid(et))
        return coti_fail(r->err, r->err_size, COTI_E_FORMAT,
                         "%s: array element type %d is not a GGUF type (must be in [0, %d])",
                         r->ctx, et, GGUF_TYPE_FLOAT64);
    if (et == GGUF_TYPE_ARRAY)
        return coti_fail(r->err, r->err_size, COTI_E_UNSUPPORTED,
                         "%s: arrays of arrays are not supported", r->ctx);
    kv->arr_type = (enum gguf_type)et;
    if ((rc = rd_u64(r, &n, "array length"))) return rc;
    if (n > GGUF_MAX_ARRAY_LEN)
        return coti_fail(r->err, r->err_size, COTI_E_FORMAT,
                         "%s: array length %llu exceeds the limit of %llu", r->ctx,
                         (unsigned long long)n, (unsigned long long)GGUF_MAX_ARRAY_LEN);
    kv->n = n;
    if (kv->arr_type == GGUF_TYPE_STRING) return rd_str_array(r, n, &kv->arr_str);

    size_t esz = gguf_type_size(kv->arr_type), bytes;
    if (!coti_mul_size((size_t)n, esz, &bytes) || bytes > rd_left(r))
        return coti_fail(r->err, r->err_size, COTI_E_FORMAT,
                         "%s: array of %llu %s elements needs %llu bytes but %zu remain", r->ctx,
                         (unsigned long long)n, gguf_type_name(kv->arr_type),
                         (unsigned long long)n * esz, rd_left(r));
    kv->arr = r->p + r->pos;   /* numeric arrays stay in the file (packed little-endian) */
    r->pos += bytes;
    return 0;
}

static int parse_tensor_info(struct rd *r, uint64_t idx, size_t alignment, struct gguf_tensor *t) {
    char nb[GGUF_ERR_NAME_CHARS * 4 + 8];
    const char *name;
    size_t name_len;
    snprintf(r->ctx, sizeof r->ctx, "tensor %llu", (unsigned long long)idx);
    int rc = rd_str(r, GGUF_MAX_TENSOR_NAME_LEN, &name, &name_len, "name");
    if (rc) return rc;
    if (name_len == 0)
        return coti_fail(r->err, r->err_size, COTI_E_FORMAT, "%s: empty tensor name", r->ctx);
    if (memchr(name, '\0', name_len))
        return coti_fail(r->err, r->err_size, COTI_E_FORMAT, "%s: name '%s' contains a NUL byte",
                         r->ctx, printable(name, name_len, nb, sizeof nb));
    if (!(t->name = dup_bytes(name, name_len)))
        return coti_fail(r->err, r->err_size, COTI_E_NOMEM, "%s: out of memory", r->ctx);
    snprintf(r->ctx, sizeof r->ctx, "tensor '%s'", printable(name, name_len, nb, sizeof nb));

    if ((rc = rd_u32(r, &t->n_dims, "n_dims"))) return rc;
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
        return coti_fail(r->err, r->err_size, COTI_E_FORMAT, "%s: n_dims is %u but must be in [1, %d]",
                         r->ctx, t->n_dims, GGUF_MAX_DIMS);
    for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    int64_t n_elem = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t v;
        if ((rc = rd_u64(r, &v, "ne"))) return rc;
        if (v < 1 || v > (uint64_t)INT64_MAX)
            return coti_fail(r->err, r->err_size, COTI_E_FORMAT,
                             "%s: ne[%u] is %lld but must be in [1, %lld]", r->ctx, d,
                             (long long)(int64_t)v, (long long)INT64_MAX);
        t->ne[d] = (int64_t)v;
        if (__builtin_mul_overflow(n_elem, t->ne[d], &n_elem))
            return coti_fail(r->err, r->err_size, COTI_E_FORMAT,
                             "%s: element count overflows int64 at ne[%u] = %lld", r->ctx, d,
                             (long long)t->ne[d]);
    }

    int32_t type;
    if ((rc = rd_i32(r, &type, "type"))) return rc;
    const struct ggml_type_traits *tr =
        (type >= 0 && type < GGML_TYPE_COUNT) ? ggml_type_traits_get((enum ggml_type)type) : NULL;
    if (!tr)
        return coti_fail(r->err, r->err_size, COTI_E_FORMAT,
                         "%s: type id %d is not a known ggml type", r->ctx, type);
    if (tr->block_elems <= 0 || tr->block_bytes <= 0)
        return coti_fail(r->err, r->err_size, COTI_E_UNSUPPORTED,
                         "%s: type id %d (%s) is not supported", r->ctx, type,
                         tr->name ? tr->name : "?");
    t->type = (enum ggml_type)type;
    if (t->ne[0] % tr->block_elems != 0)
        return coti_fail(r->err, r->err_size, COTI_E_FORMAT,
                         "%s: ne[0] = %lld is not a multiple of the %s block size %d", r->ctx,
                         (long long)t->ne[0], tr->name, tr->block_elems);
    size_t size = (size_t)tr->block_bytes;
    bool ok = coti_mul_size(size, (size_t)(t->ne[0] / tr->block_elems), &size);
    for (int d = 1; d < GGUF_MAX_DIMS && ok; d++) ok = coti_mul_size(size, (size_t)t->ne[d], &size);
    if (!ok)
        return coti_fail(r->err, r->err_size, COTI_E_FORMAT, "%s: byte size overflows size_t", r->ctx);
    t->size_bytes = size;

    if ((rc = rd_u64(r, &t->offset, "offset"))) return rc;
    if (t->offset % alignment != 0)
        return coti_fail(r->err, r->err_size, COTI_E_FORMAT,
                         "%s: offset %llu is not a multiple of the alignment %zu", r->ctx,
                         (unsigned long long)t->offset, alignment);
    return 0;
}

/* Comparators over index arrays (glibc qsort_r passes the file as the third argument). */
static int cmp_kv_idx(const void *a, const void *b, void *ctx) {
    const struct gguf_file *f = ctx;
    return strcmp(f->kv[*(const size_t *)a].key, f->kv[*(const size_t *)b].key);
}

static int cmp_tensor_name_idx(const void *a, const void *b, void *ctx) {
    const struct gguf_file *f = ctx;
    return strcmp(f->tensors[*(const size_t *)a].name, f->tensors[*(const size_t *)b].name);
}

static int cmp_tensor_off_idx(const void *a, const void *b, void *ctx) {
    const struct gguf_file *f = ctx;
    uint64_t x = f->tensors[*(const size_t *)a].offset, y = f->tensors[*(const size_t *)b].offset;
    return x < y ? -1 : x > y;
}

/* Indices 0..n-1 sorted by cmp; NULL when out of memory. */
static size_t *sorted_index(const struct gguf_file *f, size_t n,
                            int (*cmp)(const void *, const void *, void *)) {
    size_t *idx = malloc((n ? n : 1) * sizeof *idx);
    if (!idx) return NULL;
    for (size_t i = 0; i < n; i++) idx[i] = i;
    qsort_r(idx, n, sizeof *idx, cmp, (void *)(uintptr_t)f);
    return idx;
}

static int parse(struct gguf_file_priv *fp, char *err, size_t err_size) {
    struct gguf_file *f = &fp->pub;
    struct rd r = {.p = f->base, .size = f->size, .err = err, .err_size = err_size};
    char nb[GGUF_ERR_NAME_CHARS * 4 + 8];
    int rc;
    snprintf(r.ctx, sizeof r.ctx, "header");

    if (f->size < GGUF_HEADER_BYTES)
        return coti_fail(err, err_size, COTI_E_FORMAT,
                         "file is %zu bytes, smaller than the %d-byte GGUF header", f->size,
                         GGUF_HEADER_BYTES);
    if (memcmp(f->base, "GGUF", 4) != 0)
        return coti_fail(err, err_size, COTI_E_FORMAT,
                         "bad magic %02x %02x %02x %02x (expected 'GGUF' = 47 47 55 46)",
                         f->base[0], f->base[1], f->base[2], f->base[3]);
    r.pos = 4;
    uint64_t n_tensors = 0, n_kv = 0;
    rd_u32(&r, &f->version, "version");
    rd_u64(&r, &n_tensors, "n_tensors");
    rd_u64(&r, &n_kv, "n_kv");
    if (f->version == 1)
        return coti_fail(err, err_size, COTI_E_UNSUPPORTED,
                         "GGUF version 1 is obsolete and not supported (supported: 2, 3)");
    if ((f->version & 0xFFFFu) == 0)
        return coti_fail(err, err_size, COTI_E_UNSUPPORTED,
                         "GGUF version 0x%08x looks byte-swapped: big-endian files are not supported",
                         f->version);
    if (f->version != 2 && f->version != 3)
        return coti_fail(err, err_size, COTI_E_UNSUPPORTED,
                         "GGUF version %u is not supported (supported: 2, 3)", f->version);
    size_t max_kv = rd_left(&r) / GGUF_MIN_KV_BYTES;
    if (n_kv > max_kv)
        return coti_fail(err, err_size, COTI_E_FORMAT,
                         "n_kv is %lld but must be in [0, %zu]: the %zu bytes after the header cannot "
                         "hold more records (truncated or corrupt file?)",
                         (long long)(int64_t)n_kv, max_kv, rd_left(&r));
    if (n_tensors > rd_left(&r) / GGUF_MIN_TENSOR_INFO_BYTES)
        return coti_fail(err, err_size, COTI_E_FORMAT,
                         "n_tensors is %lld but must be in [0, %zu]: the %zu bytes after the header cannot "
                         "hold more records (truncated or corrupt file?)",
                         (long long)(int64_t)n_tensors, rd_left(&r) / GGUF_MIN_TENSOR_INFO_BYTES,
                         rd_left(&r));

    /* metadata */
    if (!(f->kv = calloc(n_kv ? (size_t)n_kv : 1, sizeof *f->kv)))
        return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory for %llu kv records",
                         (unsigned long long)n_kv);
    for (uint64_t i = 0; i < n_kv; i++) {
        f->n_kv = i + 1;   /* so gguf_close frees the partially parsed record */
        if ((rc = parse_kv(&r, i, &f->kv[i]))) return rc;
    }
    if (!(fp->kv_sorted = sorted_index(f, (size_t)f->n_kv, cmp_kv_idx)))
        return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory");
    for (size_t i = 1; i < f->n_kv; i++) {
        const char *a = f->kv[fp->kv_sorted[i - 1]].key, *b = f->kv[fp->kv_sorted[i]].key;
        if (strcmp(a, b) == 0)
            return coti_fail(err, err_size, COTI_E_FORMAT, "duplicate key '%s'",
                             printable(a, strlen(a), nb, sizeof nb));
    }

    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    const struct gguf_kv *al = gguf_find_kv(f, "general.alignment");
    if (al) {
        if (al->type != GGUF_TYPE_UINT32)
            return coti_fail(err, err_size, COTI_E_FORMAT,
                             "general.alignment has type %s but must be uint32", gguf_type_name(al->type));
        if (al->v.u64 == 0 || (al->v.u64 & (al->v.u64 - 1)) != 0)
            return coti_fail(err, err_size, COTI_E_FORMAT,
                             "general.alignment is %llu but must be a non-zero power of 2",
                             (unsigned long long)al->v.u64);
        f->alignment = (size_t)al->v.u64;
    }

    /* tensor directory */
    if (n_tensors > rd_left(&r) / GGUF_MIN_TENSOR_INFO_BYTES)
        return coti_fail(err, err_size, COTI_E_FORMAT,
                         "n_tensors is %llu but must be in [0, %zu]: the %zu bytes after the metadata "
                         "cannot hold more records (truncated or corrupt file?)",
                         (unsigned long long)n_tensors, rd_left(&r) / GGUF_MIN_TENSOR_INFO_BYTES,
                         rd_left(&r));
    if (!(f->tensors = calloc(n_tensors ? (size_t)n_tensors : 1, sizeof *f->tensors)))
        return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory for %llu tensors",
                         (unsigned long long)n_tensors);
    for (uint64_t i = 0; i < n_tensors; i++) {
        f->n_tensors = i + 1;
        if ((rc = parse_tensor_info(&r, i, f->alignment, &f->tensors[i]))) return rc;
    }
    if (!(fp->tensor_sorted = sorted_index(f, (size_t)f->n_tensors, cmp_tensor_name_idx)))
        return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory");
    for (size_t i = 1; i < f->n_tensors; i++) {
        const char *a = f->tensors[fp->tensor_sorted[i - 1]].name;
        if (strcmp(a, f->tensors[fp->tensor_sorted[i]].name) == 0)
            return coti_fail(err, err_size, COTI_E_FORMAT, "duplicate tensor name '%s'",
                             printable(a, strlen(a), nb, sizeof nb));
    }

    /* data section: starts at the next alignment boundary (no blob without tensors) */
    f->data_offset = r.pos;
    if (f->n_tensors == 0) return 0;
    if (!pad_size(r.pos, f->alignment, &f->data_offset) || f->data_offset > f->size)
        return coti_fail(err, err_size, COTI_E_FORMAT,
                         "truncated file: the data section would start at offset %zu (alignment %zu) "
                         "but the file is %zu bytes", r.pos, f->alignment, f->size);
    size_t data_size = f->size - f->data_offset;
    for (size_t i = 0; i < f->n_tensors; i++) {
        struct gguf_tensor *t = &f->tensors[i];
        if (t->offset > data_size || t->size_bytes > data_size - t->offset)
            return coti_fail(err, err_size, COTI_E_FORMAT,
                             "tensor '%s' offset %llu + size %zu exceeds the data section of %zu bytes",
                             printable(t->name, strlen(t->name), nb, sizeof nb),
                             (unsigned long long)t->offset, t->size_bytes, data_size);
        t->data = f->base + f->data_offset + t->offset;
    }
    size_t *by_off = sorted_index(f, (size_t)f->n_tensors, cmp_tensor_off_idx);
    if (!by_off) return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory");
    rc = 0;
    for (size_t i = 1; i < f->n_tensors && !rc; i++) {
        const struct gguf_tensor *a = &f->tensors[by_off[i - 1]], *b = &f->tensors[by_off[i]];
        if (a->offset + a->size_bytes > b->offset) {   /* no overflow: both are inside the file */
            char nb2[sizeof nb];
            rc = coti_fail(err, err_size, COTI_E_FORMAT,
                           "tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap",
                           printable(a->name, strlen(a->name), nb, sizeof nb),
                           (unsigned long long)a->offset, (unsigned long long)(a->offset + a->size_bytes),
                           printable(b->name, strlen(b->name), nb2, sizeof nb2),
                           (unsigned long long)b->offset, (unsigned long long)(b->offset + b->size_bytes));
        }
    }
    free(by_off);
    return rc;
}

int gguf_open_memory(struct gguf_file **out, const void *buf, size_t size, char *err, size_t err_size) {
    if (!out || (!buf && size))
        return coti_fail(err, err_size, COTI_E_ARG, "gguf_open_memory: NULL argument");
    *out = NULL;
    struct gguf_file_priv *fp = calloc(1, sizeof *fp);
    if (!fp) return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory");
    static const uint8_t empty[1];
    fp->pub.base = buf ? buf : empty;
    fp->pub.size = size;
    int rc = parse(fp, err, err_size);
    if (rc) {
        gguf_close(&fp->pub);
        return rc;
    }
    *out = &fp->pub;
    return 0;
}

int gguf_open(struct gguf_file **out, const char *path, char *err, size_t err_size) {
    if (!out || !path) return coti_fail(err, err_size, COTI_E_ARG, "gguf_open: NULL argument");
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return coti_fail(err, err_size, COTI_E_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return coti_fail(err, err_size, COTI_E_IO, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return coti_fail(err, err_size, COTI_E_IO, "%s: not a regular file", path);
    }
    if (st.st_size < GGUF_HEADER_BYTES) {
        close(fd);
        return coti_fail(err, err_size, COTI_E_FORMAT,
                         "%s: file is %lld bytes, smaller than the %d-byte GGUF header", path,
                         (long long)st.st_size, GGUF_HEADER_BYTES);
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        return coti_fail(err, err_size, COTI_E_IO, "%s: file too large to map", path);
    }
    size_t size = (size_t)st.st_size;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);   /* the mapping keeps the file alive */
    if (map == MAP_FAILED) return coti_fail(err, err_size, COTI_E_IO, "%s: mmap: %s", path, strerror(e));

    struct gguf_file_priv *fp = calloc(1, sizeof *fp);
    if (!fp) {
        munmap(map, size);
        return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory");
    }
    fp->pub.base = map;
    fp->pub.size = size;
    fp->pub.mapped = true;
    char msg[512] = "";
    int rc = parse(fp, msg, sizeof msg);
    if (rc) {
        gguf_close(&fp->pub);
        return coti_fail(err, err_size, rc, "%s: %s", path, msg);
    }
    *out = &fp->pub;
    return 0;
}

void gguf_close(struct gguf_file *f) {
    if (!f) return;
    struct gguf_file_priv *fp = priv_of(f);
    for (uint64_t i = 0; i < f->n_kv; i++) {
        free(f->kv[i].key);
        free(f->kv[i].str);
        free(f->kv[i].arr_str);   /* one block: pointers + strings */
    }
    free(f->kv);
    for (uint64_t i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    free(fp->kv_sorted);
    free(fp->tensor_sorted);
    if (f->mapped) munmap((void *)(uintptr_t)f->base, f->size);
    free(fp);
}

/* ---------------------------------------------------------------------------------------
 * Lookups and typed getters
 * ------------------------------------------------------------------------------------- */

const struct gguf_kv *gguf_find_kv(const struct gguf_file *f, const char *key) {
    if (!f || !key) return NULL;
    const size_t *idx = priv_of(f)->kv_sorted;
    size_t lo = 0, hi = (size_t)f->n_kv;
    if (!idx) {   /* during parsing, before the index exists */
        for (size_t i = 0; i < f->n_kv; i++)
            if (f->kv[i].key && strcmp(f->kv[i].key, key) == 0) return &f->kv[i];
        return NULL;
    }
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->kv[idx[mid]].key, key);
        if (c == 0) return &f->kv[idx[mid]];
        if (c < 0) lo = mid + 1; else hi = mid;
    }
    return NULL;
}

const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name) {
    if (!f || !name) return NULL;
    const size_t *idx = priv_of(f)->tensor_sorted;
    size_t lo = 0, hi = (size_t)f->n_tensors;
    if (!idx) return NULL;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->tensors[idx[mid]].name, name);
        if (c == 0) return &f->tensors[idx[mid]];
        if (c < 0) lo = mid + 1; else hi = mid;
    }
    return NULL;
}

/* Integer value of a scalar integer kv, range-checked into [lo, hi]. */
static int get_int(const struct gguf_file *f, const char *key, int64_t lo, uint64_t hi,
                   const char *target, uint64_t *u, int64_t *s, char *err, size_t err_size) {
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return COTI_E_ARG;
    if (!gguf_type_is_int(kv->type))
        return coti_fail(err, err_size, COTI_E_FORMAT, "key '%s' has type %s, expected an integer (%s)",
                         key, gguf_type_name(kv->type), target);
    if (gguf_type_is_signed(kv->type)) {
        int64_t v = kv->v.i64;
        if (v < lo || (v >= 0 && (uint64_t)v > hi))
            return coti_fail(err, err_size, COTI_E_FORMAT, "key '%s' is %lld, out of range for %s",
                             key, (long long)v, target);
        *s = v;
        *u = (uint64_t)v;
    } else {
        uint64_t v = kv->v.u64;
        if (v > hi)
            return coti_fail(err, err_size, COTI_E_FORMAT, "key '%s' is %llu, out of range for %s",
                             key, (unsigned long long)v, target);
        *u = v;
        *s = (int64_t)v;
    }
    return 0;
}

int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *out, char *err, size_t err_size) {
    uint64_t u;
    int64_t s;
    int rc = get_int(f, key, 0, UINT32_MAX, "uint32", &u, &s, err, err_size);
    if (!rc) *out = (uint32_t)u;
    return rc;
}

int gguf_get_i32(const struct gguf_file *f, const char *key, int32_t *out, char *err, size_t err_size) {
    uint64_t u;
    int64_t s;
    int rc = get_int(f, key, INT32_MIN, INT32_MAX, "int32", &u, &s, err, err_size);
    if (!rc) *out = (int32_t)s;
    return rc;
}

int gguf_get_f32(const struct gguf_file *f, const char *key, float *out, char *err, size_t err_size) {
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return COTI_E_ARG;
    if (kv->type != GGUF_TYPE_FLOAT32 && kv->type != GGUF_TYPE_FLOAT64)
        return coti_fail(err, err_size, COTI_E_FORMAT, "key '%s' has type %s, expected float32",
                         key, gguf_type_name(kv->type));
    if (isfinite(kv->v.f64) && fabs(kv->v.f64) > FLT_MAX)
        return coti_fail(err, err_size, COTI_E_FORMAT, "key '%s' is %g, out of range for float32",
                         key, kv->v.f64);
    *out = (float)kv->v.f64;
    return 0;
}

int gguf_get_bool(const struct gguf_file *f, const char *key, bool *out, char *err, size_t err_size) {
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return COTI_E_ARG;
    if (kv->type != GGUF_TYPE_BOOL)
        return coti_fail(err, err_size, COTI_E_FORMAT, "key '%s' has type %s, expected bool", key,
                         gguf_type_name(kv->type));
    *out = kv->v.b;
    return 0;
}

int gguf_get_str(const struct gguf_file *f, const char *key, const char **out, char *err, size_t err_size) {
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return COTI_E_ARG;
    if (kv->type != GGUF_TYPE_STRING)
        return coti_fail(err, err_size, COTI_E_FORMAT, "key '%s' has type %s, expected string", key,
                         gguf_type_name(kv->type));
    *out = kv->str;
    return 0;
}

/* out may be NULL (with any max) to ask for the count only. More elements than max is an
 * error (COTI_E_FORMAT) with *n still set to the count. */
int gguf_get_arr_i32(const struct gguf_file *f, const char *key, int32_t *out, size_t max, size_t *n,
                     char *err, size_t err_size) {
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return COTI_E_ARG;
    if (kv->type != GGUF_TYPE_ARRAY || !(gguf_type_is_int(kv->arr_type) || kv->arr_type == GGUF_TYPE_BOOL))
        return coti_fail(err, err_size, COTI_E_FORMAT,
                         "key '%s' has type %s%s%s, expected an array of integers", key,
                         gguf_type_name(kv->type), kv->type == GGUF_TYPE_ARRAY ? " of " : "",
                         kv->type == GGUF_TYPE_ARRAY ? gguf_type_name(kv->arr_type) : "");
    if (n) *n = (size_t)kv->n;
    if (!out) return 0;
    if (kv->n > max)
        return coti_fail(err, err_size, COTI_E_FORMAT, "key '%s' has %llu elements, at most %zu allowed",
                         key, (unsigned long long)kv->n, max);
    size_t esz = gguf_type_size(kv->arr_type);
    const uint8_t *p = kv->arr;
    for (size_t i = 0; i < kv->n; i++) {
        uint64_t raw = load_le(p + i * esz, esz);
        int64_t v;
        switch (kv->arr_type) {
        case GGUF_TYPE_INT8: v = (int8_t)(uint8_t)raw; break;
        case GGUF_TYPE_INT16: v = (int16_t)(uint16_t)raw; break;
        case GGUF_TYPE_INT32: v = (int32_t)(uint32_t)raw; break;
        case GGUF_TYPE_INT64: v = (int64_t)raw; break;
        case GGUF_TYPE_BOOL: v = raw != 0; break;
        default:   /* unsigned */
            if (raw > INT32_MAX)
                return coti_fail(err, err_size, COTI_E_FORMAT, "key '%s'[%zu] is %llu, out of range for int32",
                                 key, i, (unsigned long long)raw);
            v = (int64_t)raw;
        }
        if (v < INT32_MIN || v > INT32_MAX)
            return coti_fail(err, err_size, COTI_E_FORMAT, "key '%s'[%zu] is %lld, out of range for int32",
                             key, i, (long long)v);
        out[i] = (int32_t)v;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------
 * Writer. Each kv is kept serialized (type id + encoded value) so writing is a copy and
 * replacing a key keeps its position. The first error is sticky and reported by the write
 * call, so a failed set_* can never silently produce a file missing that key.
 * ------------------------------------------------------------------------------------- */

struct wkv {
    char *key;
    uint8_t *val;          /* i32 type + value, as in the file */
    size_t val_size;
};

struct wtensor {
    char *name;
    enum ggml_type type;
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    size_t size;
    void *data;            /* owned copy; NULL: supplied by the fill callback */
};

struct gguf_writer {
    struct wkv *kv;
    size_t n_kv, cap_kv;
    struct wtensor *t;
    size_t n_t, cap_t;
    int err_code;
    char err[256];
};

static int wfail(struct gguf_writer *w, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int wfail(struct gguf_writer *w, int code, const char *fmt, ...) {
    if (w && w->err_code == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(w->err, sizeof w->err, fmt, ap);
        va_end(ap);
        w->err_code = code;
    }
    return code;
}

struct gguf_writer *gguf_writer_init(void) { return calloc(1, sizeof(struct gguf_writer)); }

void gguf_writer_free(struct gguf_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) { free(w->kv[i].key); free(w->kv[i].val); }
    for (size_t i = 0; i < w->n_t; i++) { free(w->t[i].name); free(w->t[i].data); }
    free(w->kv);
    free(w->t);
    free(w);
}

/* Growable byte buffer; oom is sticky so callers check once at the end. */
struct bb { uint8_t *p; size_t n, cap; bool oom; };

static void bb_put(struct bb *b, const void *src, size_t n) {
    if (b->oom) return;
    size_t need;
    if (!coti_add_size(b->n, n, &need)) { b->oom = true; return; }
    if (need > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < need) {
            if (!coti_mul_size(cap, 2, &cap)) { b->oom = true; return; }
        }
        uint8_t *p = realloc(b->p, cap);
        if (!p) { b->oom = true; return; }
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, src, n);
    b->n = need;
}

static void bb_le(struct bb *b, uint64_t v, size_t n) {
    uint8_t tmp[8];
    store_le(tmp, v, n);
    bb_put(b, tmp, n);
}

static void bb_str(struct bb *b, const char *s, size_t n) {
    bb_le(b, n, 8);
    bb_put(b, s, n);
}

static int check_key(struct gguf_writer *w, const char *key) {
    if (!w) return COTI_E_ARG;
    if (!key || !*key) return wfail(w, COTI_E_ARG, "empty or NULL key");
    if (strlen(key) > GGUF_MAX_KEY_LEN)
        return wfail(w, COTI_E_ARG, "key '%.64s...' is longer than %d bytes", key, GGUF_MAX_KEY_LEN);
    return 0;
}

/* Takes ownership of b's buffer. */
static int writer_set(struct gguf_writer *w, const char *key, struct bb *b) {
    int rc = check_key(w, key);
    if (rc || b->oom) {
        free(b->p);
        return rc ? rc : wfail(w, COTI_E_NOMEM, "out of memory setting key '%s'", key);
    }
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kv[i].key, key) == 0) {   /* replace in place, keep the order */
            free(w->kv[i].val);
            w->kv[i].val = b->p;
            w->kv[i].val_size = b->n;
            return 0;
        }
    }
    if (w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? 2 * w->cap_kv : 16;
        struct wkv *kv = realloc(w->kv, cap * sizeof *kv);
        if (!kv) { free(b->p); return wfail(w, COTI_E_NOMEM, "out of memory"); }
        w->kv = kv;
        w->cap_kv = cap;
    }
    char *k = dup_bytes(key, strlen(key));
    if (!k) { free(b->p); return wfail(w, COTI_E_NOMEM, "out of memory"); }
    w->kv[w->n_kv++] = (struct wkv){.key = k, .val = b->p, .val_size = b->n};
    return 0;
}

static int set_scalar_raw(struct gguf_writer *w, const char *key, enum gguf_type t, uint64_t raw) {
    struct bb b = {0};
    bb_le(&b, (uint32_t)t, 4);
    bb_le(&b, raw, gguf_type_size(t));
    return writer_set(w, key, &b);
}

int gguf_writer_set_u8(struct gguf_writer *w, const char *key, uint8_t v) { return set_scalar_raw(w, key, GGUF_TYPE_UINT8, v); }
int gguf_writer_set_i8(struct gguf_writer *w, const char *key, int8_t v) { return set_scalar_raw(w, key, GGUF_TYPE_INT8, (uint8_t)v); }
int gguf_writer_set_u16(struct gguf_writer *w, const char *key, uint16_t v) { return set_scalar_raw(w, key, GGUF_TYPE_UINT16, v); }
int gguf_writer_set_i16(struct gguf_writer *w, const char *key, int16_t v) { return set_scalar_raw(w, key, GGUF_TYPE_INT16, (uint16_t)v); }
int gguf_writer_set_u32(struct gguf_writer *w, const char *key, uint32_t v) { return set_scalar_raw(w, key, GGUF_TYPE_UINT32, v); }
int gguf_writer_set_i32(struct gguf_writer *w, const char *key, int32_t v) { return set_scalar_raw(w, key, GGUF_TYPE_INT32, (uint32_t)v); }
int gguf_writer_set_u64(struct gguf_writer *w, const char *key, uint64_t v) { return set_scalar_raw(w, key, GGUF_TYPE_UINT64, v); }
int gguf_writer_set_i64(struct gguf_writer *w, const char *key, int64_t v) { return set_scalar_raw(w, key, GGUF_TYPE_INT64, (uint64_t)v); }
int gguf_writer_set_bool(struct gguf_writer *w, const char *key, bool v) { return set_scalar_raw(w, key, GGUF_TYPE_BOOL, v ? 1 : 0); }

int gguf_writer_set_f32(struct gguf_writer *w, const char *key, float v) {
    uint32_t bits;
    memcpy(&bits, &v, 4);
    return set_scalar_raw(w, key, GGUF_TYPE_FLOAT32, bits);
}

int gguf_writer_set_f64(struct gguf_writer *w, const char *key, double v) {
    uint64_t bits;
    memcpy(&bits, &v, 8);
    return set_scalar_raw(w, key, GGUF_TYPE_FLOAT64, bits);
}

static int set_str_n(struct gguf_writer *w, const char *key, const char *v, size_t n) {
    struct bb b = {0};
    bb_le(&b, GGUF_TYPE_STRING, 4);
    bb_str(&b, v, n);
    return writer_set(w, key, &b);
}

int gguf_writer_set_str(struct gguf_writer *w, const char *key, const char *v) {
    if (!v) return check_key(w, key) ? COTI_E_ARG : wfail(w, COTI_E_ARG, "key '%s': NULL string", key);
    return set_str_n(w, key, v, strlen(v));
}

int gguf_writer_set_arr(struct gguf_writer *w, const char *key, enum gguf_type elem_type,
                        const void *v, size_t n) {
    size_t esz = gguf_type_size(elem_type), bytes;
    if (check_key(w, key)) return COTI_E_ARG;
    if (esz == 0)
        return wfail(w, COTI_E_ARG, "key '%s': array element type %d must be a fixed-size type",
                     key, (int)elem_type);
    if ((!v && n) || !coti_mul_size(n, esz, &bytes))
        return wfail(w, COTI_E_ARG, "key '%s': bad array data", key);
    struct bb b = {0};
    bb_le(&b, GGUF_TYPE_ARRAY, 4);
    bb_le(&b, (uint32_t)elem_type, 4);
    bb_le(&b, n, 8);
    /* elements are given little-endian already; for a big-endian host callers would
     * have to swap, which coti (x86-64 only) never needs */
    bb_put(&b, v, bytes);
    return writer_set(w, key, &b);
}

int gguf_writer_set_arr_i32(struct gguf_writer *w, const char *key, const int32_t *v, size_t n) {
    return gguf_writer_set_arr(w, key, GGUF_TYPE_INT32, v, n);
}

int gguf_writer_set_arr_f32(struct gguf_writer *w, const char *key, const float *v, size_t n) {
    return gguf_writer_set_arr(w, key, GGUF_TYPE_FLOAT32, v, n);
}

int gguf_writer_set_arr_str(struct gguf_writer *w, const char *key, const char *const *v, size_t n) {
    if (check_key(w, key)) return COTI_E_ARG;
    if (!v && n) return wfail(w, COTI_E_ARG, "key '%s': NULL string array", key);
    struct bb b = {0};
    bb_le(&b, GGUF_TYPE_ARRAY, 4);
    bb_le(&b, GGUF_TYPE_STRING, 4);
    bb_le(&b, n, 8);
    for (size_t i = 0; i < n; i++) {
        if (!v[i]) { free(b.p); return wfail(w, COTI_E_ARG, "key '%s': element %zu is NULL", key, i); }
        bb_str(&b, v[i], strlen(v[i]));
    }
    return writer_set(w, key, &b);
}

int gguf_writer_set_kv(struct gguf_writer *w, const struct gguf_kv *kv) {
    if (!w) return COTI_E_ARG;
    if (!kv) return wfail(w, COTI_E_ARG, "gguf_writer_set_kv: NULL record");
    switch (kv->type) {
    case GGUF_TYPE_STRING: return set_str_n(w, kv->key, kv->str ? kv->str : "", (size_t)kv->str_len);
    case GGUF_TYPE_ARRAY:
        if (kv->arr_type == GGUF_TYPE_STRING)
            return gguf_writer_set_arr_str(w, kv->key, (const char *const *)kv->arr_str, (size_t)kv->n);
        return gguf_writer_set_arr(w, kv->key, kv->arr_type, kv->arr, (size_t)kv->n);
    case GGUF_TYPE_FLOAT32: return gguf_writer_set_f32(w, kv->key, (float)kv->v.f64);
    case GGUF_TYPE_FLOAT64: return gguf_writer_set_f64(w, kv->key, kv->v.f64);
    case GGUF_TYPE_BOOL: return gguf_writer_set_bool(w, kv->key, kv->v.b);
    default:
        if (!gguf_type_is_int(kv->type))
            return wfail(w, COTI_E_ARG, "key '%s': bad type %d", kv->key ? kv->key : "?", (int)kv->type);
        return set_scalar_raw(w, kv->key, kv->type, gguf_type_is_signed(kv->type) ? (uint64_t)kv->v.i64 : kv->v.u64);
    }
}

/* Validates a tensor declaration and appends it (data not yet attached). */
static int writer_add(struct gguf_writer *w, const char *name, enum ggml_type type, uint32_t n_dims,
                      const int64_t *ne, struct wtensor **out) {
    if (!w) return COTI_E_ARG;
    if (!name || !*name || strlen(name) > GGUF_MAX_TENSOR_NAME_LEN)
        return wfail(w, COTI_E_ARG, "tensor name '%.80s' must be 1..%d bytes", name ? name : "(null)",
                     GGUF_MAX_TENSOR_NAME_LEN);
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS || !ne)
        return wfail(w, COTI_E_ARG, "tensor '%s': n_dims is %u but must be in [1, %d]", name, n_dims, GGUF_MAX_DIMS);
    const struct ggml_type_traits *tr =
        ((int)type >= 0 && type < GGML_TYPE_COUNT) ? ggml_type_traits_get(type) : NULL;
    if (!tr || tr->block_elems <= 0)
        return wfail(w, COTI_E_ARG, "tensor '%s': type id %d is not supported", name, (int)type);
    for (size_t i = 0; i < w->n_t; i++)
        if (strcmp(w->t[i].name, name) == 0) return wfail(w, COTI_E_ARG, "duplicate tensor name '%s'", name);
    struct wtensor t = {.type = type, .n_dims = n_dims};
    size_t size = (size_t)tr->block_bytes;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) {
        t.ne[d] = (uint32_t)d < n_dims ? ne[d] : 1;
        if (t.ne[d] < 1) return wfail(w, COTI_E_ARG, "tensor '%s': ne[%d] is %lld but must be >= 1", name, d, (long long)t.ne[d]);
    }
    if (t.ne[0] % tr->block_elems)
        return wfail(w, COTI_E_ARG, "tensor '%s': ne[0] = %lld is not a multiple of the %s block size %d",
                     name, (long long)t.ne[0], tr->name, tr->block_elems);
    bool ok = coti_mul_size(size, (size_t)(t.ne[0] / tr->block_elems), &size);
    for (int d = 1; d < GGUF_MAX_DIMS && ok; d++) ok = coti_mul_size(size, (size_t)t.ne[d], &size);
    if (!ok) return wfail(w, COTI_E_ARG, "tensor '%s': byte size overflows", name);
    t.size = size;
    if (w->n_t == w->cap_t) {
        size_t cap = w->cap_t ? 2 * w->cap_t : 64;
        struct wtensor *nt = realloc(w->t, cap * sizeof *nt);
        if (!nt) return wfail(w, COTI_E_NOMEM, "out of memory");
        w->t = nt;
        w->cap_t = cap;
    }
    if (!(t.name = dup_bytes(name, strlen(name)))) return wfail(w, COTI_E_NOMEM, "out of memory");
    w->t[w->n_t] = t;
    *out = &w->t[w->n_t++];
    return 0;
}

int gguf_writer_add_tensor(struct gguf_writer *w, const char *name, enum ggml_type type,
                           uint32_t n_dims, const int64_t *ne, const void *data, size_t size) {
    struct wtensor *t;
    int rc = writer_add(w, name, type, n_dims, ne, &t);
    if (rc) return rc;
    if (size != t->size || !data) {
        size_t expect = t->size;
        free(t->name);
        w->n_t--;
        return wfail(w, COTI_E_ARG, "tensor '%s': data size %zu but its type and shape need %zu bytes",
                     name, size, expect);
    }
    if (!(t->data = malloc(size ? size : 1))) {
        free(t->name);
        w->n_t--;
        return wfail(w, COTI_E_NOMEM, "tensor '%s': out of memory (%zu bytes)", name, size);
    }
    memcpy(t->data, data, size);
    return 0;
}

int gguf_writer_add_tensor_info(struct gguf_writer *w, const char *name, enum ggml_type type,
                                uint32_t n_dims, const int64_t *ne) {
    struct wtensor *t;
    return writer_add(w, name, type, n_dims, ne, &t);
}

/* Output: a FILE or a preallocated buffer. */
struct sink { FILE *fp; uint8_t *buf; size_t pos, cap; };

static int sink_put(struct sink *s, const void *p, size_t n) {
    if (s->fp) return fwrite(p, 1, n, s->fp) == n ? 0 : -1;
    if (n > s->cap - s->pos) return -1;
    memcpy(s->buf + s->pos, p, n);
    s->pos += n;
    return 0;
}

static int sink_zero(struct sink *s, size_t n) {
    static const uint8_t zeros[256];
    while (n) {
        size_t k = COTI_MIN(n, sizeof zeros);
        if (sink_put(s, zeros, k)) return -1;
        n -= k;
    }
    return 0;
}

/* Serializes header + kv + tensor infos (unpadded) into b; sets *alignment. */
static int writer_header(struct gguf_writer *w, struct bb *b, size_t *alignment, size_t *data_size,
                         char *err, size_t err_size) {
    if (w->err_code)
        return coti_fail(err, err_size, w->err_code, "an earlier gguf_writer call failed: %s", w->err);
    *alignment = GGUF_DEFAULT_ALIGNMENT;
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kv[i].key, "general.alignment") != 0) continue;
        const uint8_t *v = w->kv[i].val;
        if (load_le(v, 4) != GGUF_TYPE_UINT32)
            return coti_fail(err, err_size, COTI_E_ARG, "general.alignment must be set as uint32");
        uint64_t a = load_le(v + 4, 4);
        if (a == 0 || (a & (a - 1)))
            return coti_fail(err, err_size, COTI_E_ARG,
                             "general.alignment is %llu but must be a non-zero power of 2", (unsigned long long)a);
        *alignment = (size_t)a;
    }
    bb_put(b, "GGUF", 4);
    bb_le(b, 3, 4);
    bb_le(b, w->n_t, 8);
    bb_le(b, w->n_kv, 8);
    for (size_t i = 0; i < w->n_kv; i++) {
        bb_str(b, w->kv[i].key, strlen(w->kv[i].key));
        bb_put(b, w->kv[i].val, w->kv[i].val_size);
    }
    size_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {   /* insertion order, packed, each padded */
        const struct wtensor *t = &w->t[i];
        bb_str(b, t->name, strlen(t->name));
        bb_le(b, t->n_dims, 4);
        for (uint32_t d = 0; d < t->n_dims; d++) bb_le(b, (uint64_t)t->ne[d], 8);
        bb_le(b, (uint32_t)t->type, 4);
        bb_le(b, off, 8);
        size_t padded;
        if (!pad_size(t->size, *alignment, &padded) || !coti_add_size(off, padded, &off))
            return coti_fail(err, err_size, COTI_E_ARG, "total tensor size overflows");
    }
    *data_size = off;
    if (b->oom) return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory serializing the header");
    return 0;
}

static int writer_emit(struct gguf_writer *w, struct sink *s, const struct bb *hdr, size_t alignment,
                       gguf_writer_fill_fn fill, void *ctx, char *err, size_t err_size) {
    size_t hdr_padded;
    if (!pad_size(hdr->n, alignment, &hdr_padded))
        return coti_fail(err, err_size, COTI_E_ARG, "header size overflows");
    if (sink_put(s, hdr->p, hdr->n) || (w->n_t && sink_zero(s, hdr_padded - hdr->n)))
        return coti_fail(err, err_size, COTI_E_IO, "write failed: %s", strerror(errno));
    size_t scratch_size = 0;
    for (size_t i = 0; i < w->n_t; i++)
        if (!w->t[i].data) scratch_size = COTI_MAX(scratch_size, w->t[i].size);
    if (scratch_size && !fill)
        return coti_fail(err, err_size, COTI_E_ARG, "tensor data missing and no fill callback given");
    uint8_t *scratch = NULL;
    if (scratch_size && !(scratch = malloc(scratch_size)))
        return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory (%zu bytes for one tensor)", scratch_size);
    int rc = 0;
    for (size_t i = 0; i < w->n_t && !rc; i++) {
        const struct wtensor *t = &w->t[i];
        const void *data = t->data;
        if (!data) {
            if ((rc = fill(ctx, i, t->name, scratch, t->size, err, err_size))) break;
            data = scratch;
        }
        size_t padded = t->size;
        pad_size(t->size, alignment, &padded);   /* checked in writer_header */
        if (sink_put(s, data, t->size) || sink_zero(s, padded - t->size))
            rc = coti_fail(err, err_size, COTI_E_IO, "write of tensor '%s' failed: %s", t->name, strerror(errno));
    }
    free(scratch);
    return rc;
}

int gguf_writer_write_fill(struct gguf_writer *w, const char *path, gguf_writer_fill_fn fill,
                           void *ctx, char *err, size_t err_size) {
    if (!w || !path) return coti_fail(err, err_size, COTI_E_ARG, "gguf_writer_write: NULL argument");
    struct bb hdr = {0};
    size_t alignment, data_size;
    int rc = writer_header(w, &hdr, &alignment, &data_size, err, err_size);
    if (rc) { free(hdr.p); return rc; }
    /* write to a temporary name and rename, so a failure never leaves a half file at path */
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 32);
    if (!tmp) { free(hdr.p); return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory"); }
    snprintf(tmp, plen + 32, "%s.tmp%ld", path, (long)getpid());
    FILE *fp = fopen(tmp, "wb");
    if (!fp) {
        rc = coti_fail(err, err_size, COTI_E_IO, "%s: %s", tmp, strerror(errno));
        free(tmp);
        free(hdr.p);
        return rc;
    }
    struct sink s = {.fp = fp};
    rc = writer_emit(w, &s, &hdr, alignment, fill, ctx, err, err_size);
    free(hdr.p);
    if (fclose(fp) != 0 && !rc) rc = coti_fail(err, err_size, COTI_E_IO, "%s: %s", tmp, strerror(errno));
    if (!rc && rename(tmp, path) != 0)
        rc = coti_fail(err, err_size, COTI_E_IO, "rename %s -> %s: %s", tmp, path, strerror(errno));
    if (rc) unlink(tmp);
    free(tmp);
    return rc;
}

int gguf_writer_write(struct gguf_writer *w, const char *path, char *err, size_t err_size) {
    return gguf_writer_write_fill(w, path, NULL, NULL, err, err_size);
}

int gguf_writer_to_buffer(struct gguf_writer *w, void **buf, size_t *size, char *err, size_t err_size) {
    if (!w || !buf || !size) return coti_fail(err, err_size, COTI_E_ARG, "gguf_writer_to_buffer: NULL argument");
    *buf = NULL;
    *size = 0;
    struct bb hdr = {0};
    size_t alignment, data_size, total;
    int rc = writer_header(w, &hdr, &alignment, &data_size, err, err_size);
    if (rc) { free(hdr.p); return rc; }
    if (w->n_t == 0) total = hdr.n;
    else if (!pad_size(hdr.n, alignment, &total) || !coti_add_size(total, data_size, &total)) {
        free(hdr.p);
        return coti_fail(err, err_size, COTI_E_ARG, "file size overflows");
    }
    struct sink s = {.buf = malloc(total ? total : 1), .cap = total};
    if (!s.buf) { free(hdr.p); return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory (%zu bytes)", total); }
    rc = writer_emit(w, &s, &hdr, alignment, NULL, NULL, err, err_size);
    free(hdr.p);
    if (rc) { free(s.buf); return rc; }
    *buf = s.buf;
    *size = s.pos;
    return 0;
}
