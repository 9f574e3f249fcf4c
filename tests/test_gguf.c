/* test_gguf.c — GGUF reader/writer: round trips of every kv type and several tensors, a corpus
 * of hand-broken files (one per failure kind, built byte by byte here, independently of the
 * writer), every truncation of a small file, random byte mutations, and facts of the shipped
 * model models/coti-tiny-qwen35-mtp-q8_0.gguf (tests run from the repo root). */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf.h"

#define SHIPPED_MODEL "models/coti-tiny-qwen35-mtp-q8_0.gguf"

/* ---------------------------------------------------------------------------------------
 * A tiny little-endian byte builder (independent of gguf.c's writer).
 * ------------------------------------------------------------------------------------- */

struct buf { uint8_t *p; size_t n, cap; };

static void put(struct buf *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        cr_assert(b->p);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void put_le(struct buf *b, uint64_t v, int n) {
    uint8_t t[8];
    for (int i = 0; i < n; i++) t[i] = (uint8_t)(v >> (8 * i));
    put(b, t, (size_t)n);
}
static void put_u32(struct buf *b, uint32_t v) { put_le(b, v, 4); }
static void put_u64(struct buf *b, uint64_t v) { put_le(b, v, 8); }
static void put_str(struct buf *b, const char *s) { put_u64(b, strlen(s)); put(b, s, strlen(s)); }
static void put_zero(struct buf *b, size_t n) { while (n--) put_le(b, 0, 1); }

/* The valid baseline and its knobs: each malformed case changes one of them. */
struct tinfo { const char *name; uint32_t n_dims; int64_t ne[5]; int32_t type; uint64_t offset; };
struct variant {
    char magic[5];
    uint32_t version;
    bool counts_override;
    uint64_t n_tensors, n_kv;
    const char *arch_key;          /* first kv key */
    int32_t arch_type;             /* its type id (STRING) */
    uint64_t arch_len_override;    /* non-zero: claimed string length */
    bool has_alignment;
    int32_t align_type;
    uint32_t alignment;
    bool dup_key;
    int32_t arr_elem_type;         /* test.arr element type (INT32) */
    uint64_t arr_count;            /* claimed element count (3) */
    int n_t;
    struct tinfo t[4];
    size_t data_bytes;             /* bytes of data after the aligned header */
};

static struct variant base_variant(void) {
    struct variant v = {
        .magic = "GGUF", .version = 3, .arch_key = "general.architecture",
        .arch_type = GGUF_TYPE_STRING, .has_alignment = true, .align_type = GGUF_TYPE_UINT32,
        .alignment = 32, .arr_elem_type = GGUF_TYPE_INT32, .arr_count = 3, .n_t = 3,
        .t = {
            {"a", 1, {8}, GGML_TYPE_F32, 0},                /* 32 bytes */
            {"b", 2, {4, 2}, GGML_TYPE_F32, 32},            /* 32 bytes */
            {"c", 2, {32, 2}, GGML_TYPE_Q8_0, 64},          /* 68 bytes, no trailing pad */
        },
        .data_bytes = 64 + 68,
    };
    return v;
}

static uint8_t *build(const struct variant *v, size_t *size) {
    struct buf b = {0};
    uint64_t n_kv = 2 + v->has_alignment + v->dup_key;
    put(&b, v->magic, 4);
    put_u32(&b, v->version);
    put_u64(&b, v->counts_override ? v->n_tensors : (uint64_t)v->n_t);
    put_u64(&b, v->counts_override ? v->n_kv : n_kv);
    /* kv 0: architecture */
    put_str(&b, v->arch_key);
    put_u32(&b, (uint32_t)v->arch_type);
    if (v->arch_len_override) { put_u64(&b, v->arch_len_override); put(&b, "test", 4); }
    else put_str(&b, "test");
    /* kv 1: alignment */
    if (v->has_alignment) {
        put_str(&b, "general.alignment");
        put_u32(&b, (uint32_t)v->align_type);
        put_u32(&b, v->alignment);
    }
    /* kv 2: an int array */
    put_str(&b, "test.arr");
    put_u32(&b, GGUF_TYPE_ARRAY);
    put_u32(&b, (uint32_t)v->arr_elem_type);
    put_u64(&b, v->arr_count);
    for (int i = 0; i < 3; i++) put_u32(&b, (uint32_t)(i + 1));
    if (v->dup_key) { put_str(&b, "test.arr"); put_u32(&b, GGUF_TYPE_UINT8); put_le(&b, 7, 1); }
    for (int i = 0; i < v->n_t; i++) {
        const struct tinfo *t = &v->t[i];
        put_str(&b, t->name);
        put_u32(&b, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims && d < 5; d++) put_u64(&b, (uint64_t)t->ne[d]);
        put_u32(&b, (uint32_t)t->type);
        put_u64(&b, t->offset);
    }
    size_t al = v->alignment && !(v->alignment & (v->alignment - 1)) ? v->alignment : 32;
    put_zero(&b, (al - b.n % al) % al);
    for (size_t i = 0; i < v->data_bytes; i++) put_le(&b, (uint8_t)(i * 7 + 1), 1);
    *size = b.n;
    return b.p;
}

/* Opens a variant from memory; returns rc and leaves the message in err. */
static int open_variant(const struct variant *v, char *err, size_t err_size) {
    size_t size;
    uint8_t *p = build(v, &size);
    struct gguf_file *f = NULL;
    err[0] = '\0';
    int rc = gguf_open_memory(&f, p, size, err, err_size);
    if (rc == 0) gguf_close(f);
    else cr_assert_null(f);
    free(p);
    return rc;
}

static void expect_fail(const struct variant *v, const char *what, const char *needle) {
    char err[512];
    int rc = open_variant(v, err, sizeof err);
    cr_assert(rc < 0, "%s: expected failure, got rc %d", what, rc);
    cr_assert(strstr(err, needle), "%s: message '%s' does not contain '%s'", what, err, needle);
}

/* ---------------------------------------------------------------------------------------
 * The baseline itself
 * ------------------------------------------------------------------------------------- */

Test(gguf, baseline_valid) {
    struct variant v = base_variant();
    size_t size;
    uint8_t *p = build(&v, &size);
    struct gguf_file *f;
    char err[256];
    cr_assert_eq(gguf_open_memory(&f, p, size, err, sizeof err), 0, "%s", err);
    cr_assert_eq(f->version, 3);
    cr_assert_eq(f->n_kv, 3);
    cr_assert_eq(f->n_tensors, 3);
    cr_assert_eq(f->alignment, 32);
    cr_assert_eq(f->data_offset % 32, 0);
    const struct gguf_tensor *c = gguf_find_tensor(f, "c");
    cr_assert(c);
    cr_assert_eq(c->size_bytes, 68);
    cr_assert_eq(c->offset, 64);
    cr_assert_eq((const uint8_t *)c->data, p + f->data_offset + 64);
    cr_assert_eq(f->data_offset + 64 + 68, size);
    cr_assert_null(gguf_find_tensor(f, "d"));
    int32_t arr[3];
    size_t n;
    cr_assert_eq(gguf_get_arr_i32(f, "test.arr", arr, 3, &n, err, sizeof err), 0);
    cr_assert(n == 3 && arr[0] == 1 && arr[2] == 3);
    gguf_close(f);
    free(p);
}

Test(gguf, version2_accepted) {
    struct variant v = base_variant();
    char err[256];
    v.version = 2;
    cr_assert_eq(open_variant(&v, err, sizeof err), 0, "%s", err);
}

/* ---------------------------------------------------------------------------------------
 * Malformed corpus: one case per failure kind
 * ------------------------------------------------------------------------------------- */

Test(gguf, bad_magic) {
    struct variant v = base_variant();
    memcpy(v.magic, "GGUG", 4);
    expect_fail(&v, "bad magic", "magic");
}

Test(gguf, bad_version) {
    struct variant v = base_variant();
    v.version = 1;
    expect_fail(&v, "version 1", "version 1");
    v.version = 99;
    expect_fail(&v, "version 99", "99");
    v.version = 0;
    expect_fail(&v, "version 0", "version");
    v.version = 0x03000000;   /* a v3 file written big-endian */
    expect_fail(&v, "byte-swapped", "big-endian");
}

Test(gguf, huge_counts) {
    struct variant v = base_variant();
    v.counts_override = true;
    v.n_kv = 3;
    v.n_tensors = (uint64_t)1 << 40;
    expect_fail(&v, "huge n_tensors", "n_tensors");
    v.n_tensors = UINT64_MAX;   /* -1 as i64 */
    expect_fail(&v, "negative n_tensors", "n_tensors is -1");
    v.n_tensors = 3;
    v.n_kv = (uint64_t)1 << 62;
    expect_fail(&v, "huge n_kv", "n_kv");
    v.n_kv = 4;   /* plausible: the first tensor record is misread as a kv, then garbage */
    expect_fail(&v, "n_kv one too many", "tensor");
    v.n_kv = 3;
    v.n_tensors = 4;
    expect_fail(&v, "n_tensors one too many", "");
}

Test(gguf, huge_string_length) {
    struct variant v = base_variant();
    v.arch_len_override = (uint64_t)1 << 40;
    expect_fail(&v, "string over the limit", "exceeds the limit");
    v.arch_len_override = 100000;   /* below the limit, but past the end of the file */
    expect_fail(&v, "string past the end", "bytes left");
    v.arch_len_override = UINT64_MAX;
    expect_fail(&v, "string length 2^64-1", "length");
}

Test(gguf, bad_keys) {
    struct variant v = base_variant();
    v.dup_key = true;
    expect_fail(&v, "duplicate key", "duplicate key 'test.arr'");
    v = base_variant();
    v.arch_key = "";
    expect_fail(&v, "empty key", "empty key");
}

Test(gguf, bad_kv_types) {
    struct variant v = base_variant();
    v.arch_type = 13;
    expect_fail(&v, "kv type 13", "value type 13");
    v.arch_type = -1;
    expect_fail(&v, "kv type -1", "value type -1");
    v = base_variant();
    v.arr_elem_type = 42;
    expect_fail(&v, "array element type 42", "element type 42");
    v.arr_elem_type = GGUF_TYPE_ARRAY;
    expect_fail(&v, "nested array", "arrays of arrays");
    v = base_variant();
    v.arr_count = (uint64_t)1 << 50;
    expect_fail(&v, "huge array count", "array length");
    v.arr_count = 1000;   /* under the limit, past the end */
    expect_fail(&v, "array past the end", "remain");
}

Test(gguf, bad_alignment) {
    struct variant v = base_variant();
    v.alignment = 0;
    expect_fail(&v, "alignment 0", "general.alignment is 0 but must be a non-zero power of 2");
    v.alignment = 3;
    expect_fail(&v, "alignment 3", "general.alignment is 3");
    v.alignment = 24;
    expect_fail(&v, "alignment 24", "power of 2");
    v.alignment = 32;
    v.align_type = GGUF_TYPE_INT32;
    expect_fail(&v, "alignment int32", "uint32");
}

Test(gguf, alignment_64_and_default) {
    char err[256];
    struct variant v = base_variant();
    v.alignment = 64;
    v.t[1].offset = 64;   /* a: 32 bytes padded to 64 */
    v.t[2].offset = 128;
    v.data_bytes = 128 + 68;
    cr_assert_eq(open_variant(&v, err, sizeof err), 0, "%s", err);
    v = base_variant();
    v.has_alignment = false;   /* default 32 */
    cr_assert_eq(open_variant(&v, err, sizeof err), 0, "%s", err);
}

Test(gguf, bad_tensor_type) {
    struct variant v = base_variant();
    v.t[1].type = 99;
    expect_fail(&v, "type 99", "type id 99");
    v.t[1].type = -1;
    expect_fail(&v, "type -1", "type id -1");
    v.t[1].type = 4;   /* retired id */
    expect_fail(&v, "type 4", "type id 4");
    v.t[1].type = 16;   /* iq2_xxs: known to ggml, not computed by coti */
    expect_fail(&v, "type iq2_xxs", "not supported");
    v.t[1].type = GGML_TYPE_COUNT;
    expect_fail(&v, "type COUNT", "tensor 'b'");
}

Test(gguf, bad_n_dims) {
    struct variant v = base_variant();
    v.t[0].n_dims = 0;
    expect_fail(&v, "n_dims 0", "n_dims is 0 but must be in [1, 4]");
    v = base_variant();
    v.t[0] = (struct tinfo){"a", 5, {2, 2, 2, 1, 1}, GGML_TYPE_F32, 0};
    expect_fail(&v, "n_dims 5", "n_dims is 5");
}

Test(gguf, bad_ne) {
    struct variant v = base_variant();
    v.t[1].ne[1] = 0;
    expect_fail(&v, "ne 0", "tensor 'b': ne[1] is 0");
    v.t[1].ne[1] = -4;
    expect_fail(&v, "ne negative", "ne[1] is -4");
    v = base_variant();
    v.t[2].ne[0] = 16;   /* q8_0 blocks hold 32 */
    expect_fail(&v, "ne[0] not a block multiple", "block size 32");
    v = base_variant();
    v.t[0] = (struct tinfo){"a", 3, {(int64_t)1 << 32, (int64_t)1 << 32, (int64_t)1 << 32}, GGML_TYPE_F32, 0};
    expect_fail(&v, "element count overflow", "overflow");
    v.t[0] = (struct tinfo){"a", 2, {(int64_t)1 << 40, (int64_t)1 << 22}, GGML_TYPE_F32, 0};
    expect_fail(&v, "byte size overflow", "overflow");
}

Test(gguf, bad_offsets) {
    struct variant v = base_variant();
    v.t[1].offset = 48;
    expect_fail(&v, "misaligned", "offset 48 is not a multiple of the alignment 32");
    v = base_variant();
    v.t[2].offset = 4096;
    expect_fail(&v, "past the end", "tensor 'c' offset 4096 + size 68 exceeds the data section");
    v.t[2].offset = UINT64_MAX - 31;
    expect_fail(&v, "offset near 2^64", "exceeds the data section");
    v = base_variant();
    v.t[1].offset = 0;
    expect_fail(&v, "overlap", "overlap");
    v = base_variant();
    v.t[2].offset = 32;   /* c [32,100) overlaps b [32,64) */
    v.t[1].offset = 96;
    expect_fail(&v, "overlap 2", "overlap");
}

Test(gguf, bad_tensor_names) {
    struct variant v = base_variant();
    v.t[2].name = "a";
    expect_fail(&v, "duplicate name", "duplicate tensor name 'a'");
    v = base_variant();
    v.t[0].name = "0123456789012345678901234567890123456789012345678901234567890123";   /* 64 */
    expect_fail(&v, "64-byte name", "name length 64 exceeds the limit of 63");
    v = base_variant();
    v.t[0].name = "";
    expect_fail(&v, "empty name", "empty tensor name");
}

Test(gguf, short_and_empty_buffers) {
    struct gguf_file *f = (struct gguf_file *)1;
    char err[256] = "";
    cr_assert_lt(gguf_open_memory(&f, NULL, 0, err, sizeof err), 0);
    cr_assert_null(f);
    cr_assert(strstr(err, "header"), "%s", err);
    cr_assert_lt(gguf_open_memory(&f, "GGUF", 4, err, sizeof err), 0);
}

/* Every proper prefix of a valid file must be rejected with a message, never crash. The
 * baseline's last tensor ends exactly at the end of the file, so every prefix is short. */
Test(gguf, truncated_everywhere) {
    struct variant v = base_variant();
    size_t size;
    uint8_t *p = build(&v, &size);
    for (size_t len = 0; len < size; len++) {
        uint8_t *q = malloc(len ? len : 1);   /* exact size, so ASan catches any over-read */
        memcpy(q, p, len);
        struct gguf_file *f = NULL;
        char err[512] = "";
        int rc = gguf_open_memory(&f, q, len, err, sizeof err);
        cr_assert(rc < 0, "prefix of %zu/%zu bytes was accepted", len, size);
        cr_assert(err[0], "prefix of %zu bytes: empty message", len);
        free(q);
    }
    free(p);
}

/* The same over a writer-made file with string arrays: prefixes that cut into the metadata
 * or the tensor bytes fail; only the last tensor's trailing padding may be missing. */
Test(gguf, truncated_writer_file) {
    struct gguf_writer *w = gguf_writer_init();
    const char *toks[] = {"<s>", "", "hello", "w\xc3\xb6rld"};
    gguf_writer_set_str(w, "general.architecture", "x");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 4);
    gguf_writer_set_f32(w, "x.eps", 1e-6f);
    float d[5] = {1, 2, 3, 4, 5};
    int64_t ne[1] = {5};
    cr_assert_eq(gguf_writer_add_tensor(w, "t", GGML_TYPE_F32, 1, ne, d, sizeof d), 0);
    void *buf;
    size_t size;
    char err[512];
    cr_assert_eq(gguf_writer_to_buffer(w, &buf, &size, err, sizeof err), 0, "%s", err);
    gguf_writer_free(w);
    struct gguf_file *f;
    cr_assert_eq(gguf_open_memory(&f, buf, size, err, sizeof err), 0, "%s", err);
    size_t data_end = f->data_offset + 20;
    gguf_close(f);
    for (size_t len = 0; len <= size; len++) {
        uint8_t *q = malloc(len ? len : 1);
        memcpy(q, buf, len);
        int rc = gguf_open_memory(&f, q, len, err, sizeof err);
        if (len < data_end) cr_assert(rc < 0 && err[0], "prefix %zu accepted", len);
        else { cr_assert_eq(rc, 0, "prefix %zu: %s", len, err); gguf_close(f); }
        free(q);
    }
    free(buf);
}

/* Random byte flips of the baseline: each result is either a valid file or a clean error. */
Test(gguf, random_mutations) {
    struct variant v = base_variant();
    size_t size;
    uint8_t *p = build(&v, &size);
    uint64_t s = 0x9e3779b97f4a7c15ull;
    int n_ok = 0, n_fail = 0;
    for (int it = 0; it < 5000; it++) {
        uint8_t *q = malloc(size);
        memcpy(q, p, size);
        int flips = 1 + it % 4;
        for (int k = 0; k < flips; k++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            size_t pos = (size_t)(s >> 33) % size;
            uint8_t val = (uint8_t)(s >> 17);
            q[pos] = (it & 1) ? val : (uint8_t)(q[pos] ^ (1u << (s >> 60 & 7)));
        }
        struct gguf_file *f = NULL;
        char err[512] = "";
        if (gguf_open_memory(&f, q, size, err, sizeof err) == 0) {
            /* a valid result must be internally consistent */
            for (uint64_t i = 0; i < f->n_tensors; i++) {
                const struct gguf_tensor *t = &f->tensors[i];
                cr_assert((const uint8_t *)t->data + t->size_bytes <= q + size);
            }
            gguf_close(f);
            n_ok++;
        } else {
            cr_assert(err[0]);
            n_fail++;
        }
        free(q);
    }
    cr_assert(n_fail > 0 && n_ok > 0, "ok %d fail %d", n_ok, n_fail);
    free(p);
}

/* ---------------------------------------------------------------------------------------
 * Writer -> reader round trip
 * ------------------------------------------------------------------------------------- */

static void fill_pattern(uint8_t *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(i * 31 + seed * 17 + (i >> 8));
}

static struct gguf_writer *roundtrip_writer(uint8_t **tdata, size_t *tsize) {
    struct gguf_writer *w = gguf_writer_init();
    cr_assert(w);
    cr_assert_eq(gguf_writer_set_str(w, "general.architecture", "roundtrip"), 0);
    cr_assert_eq(gguf_writer_set_u8(w, "k.u8", 250), 0);
    cr_assert_eq(gguf_writer_set_i8(w, "k.i8", -100), 0);
    cr_assert_eq(gguf_writer_set_u16(w, "k.u16", 65000), 0);
    cr_assert_eq(gguf_writer_set_i16(w, "k.i16", -32000), 0);
    cr_assert_eq(gguf_writer_set_u32(w, "k.u32", 4000000000u), 0);
    cr_assert_eq(gguf_writer_set_i32(w, "k.i32", -2000000000), 0);
    cr_assert_eq(gguf_writer_set_f32(w, "k.f32", 1.5e-6f), 0);
    cr_assert_eq(gguf_writer_set_bool(w, "k.bool", true), 0);
    cr_assert_eq(gguf_writer_set_str(w, "k.str", "h\xc3\xa9llo"), 0);
    cr_assert_eq(gguf_writer_set_str(w, "k.empty", ""), 0);
    cr_assert_eq(gguf_writer_set_u64(w, "k.u64", 0xfedcba9876543210ull), 0);
    cr_assert_eq(gguf_writer_set_i64(w, "k.i64", INT64_MIN + 5), 0);
    cr_assert_eq(gguf_writer_set_f64(w, "k.f64", 3.141592653589793), 0);
    int32_t ai[4] = {-1, 0, 7, INT32_MAX};
    float af[3] = {0.5f, -2.0f, 1e30f};
    const char *as[3] = {"alpha", "", "g\xc4\x9f"};
    uint8_t au8[5] = {0, 1, 2, 254, 255};
    int16_t ai16[2] = {-300, 300};
    uint64_t au64[2] = {1, UINT64_MAX};
    uint8_t abool[3] = {1, 0, 1};
    double af64[2] = {-0.25, 1e300};
    cr_assert_eq(gguf_writer_set_arr_i32(w, "a.i32", ai, 4), 0);
    cr_assert_eq(gguf_writer_set_arr_f32(w, "a.f32", af, 3), 0);
    cr_assert_eq(gguf_writer_set_arr_str(w, "a.str", as, 3), 0);
    cr_assert_eq(gguf_writer_set_arr(w, "a.u8", GGUF_TYPE_UINT8, au8, 5), 0);
    cr_assert_eq(gguf_writer_set_arr(w, "a.i16", GGUF_TYPE_INT16, ai16, 2), 0);
    cr_assert_eq(gguf_writer_set_arr(w, "a.u64", GGUF_TYPE_UINT64, au64, 2), 0);
    cr_assert_eq(gguf_writer_set_arr(w, "a.bool", GGUF_TYPE_BOOL, abool, 3), 0);
    cr_assert_eq(gguf_writer_set_arr(w, "a.f64", GGUF_TYPE_FLOAT64, af64, 2), 0);
    cr_assert_eq(gguf_writer_set_arr_i32(w, "a.empty", NULL, 0), 0);
    cr_assert_eq(gguf_writer_set_u32(w, "k.replaced", 1), 0);
    cr_assert_eq(gguf_writer_set_u32(w, "k.replaced", 2), 0);   /* replaces, keeps position */

    static const struct { const char *name; enum ggml_type type; uint32_t n_dims; int64_t ne[4]; size_t size; } T[] = {
        {"t.f32", GGML_TYPE_F32, 2, {3, 5}, 60},
        {"t.f16", GGML_TYPE_F16, 1, {33}, 66},
        {"t.q8_0", GGML_TYPE_Q8_0, 3, {64, 2, 3}, 2 * 34 * 6},
        {"t.q4_0", GGML_TYPE_Q4_0, 4, {32, 1, 2, 2}, 18 * 4},
        {"t.q4_k", GGML_TYPE_Q4_K, 2, {256, 3}, 144 * 3},
    };
    for (size_t i = 0; i < COTI_ARRAY_LEN(T); i++) {
        tdata[i] = malloc(T[i].size);
        tsize[i] = T[i].size;
        fill_pattern(tdata[i], T[i].size, (unsigned)i);
        cr_assert_eq(gguf_writer_add_tensor(w, T[i].name, T[i].type, T[i].n_dims, T[i].ne, tdata[i], T[i].size), 0,
                     "%s", T[i].name);
    }
    return w;
}

static void check_roundtrip(const struct gguf_file *f, uint8_t **tdata) {
    char err[256];
    const struct gguf_kv *kv;
    cr_assert_eq(f->version, 3);
    cr_assert_eq(f->n_kv, 24);
    cr_assert_str_eq(f->kv[0].key, "general.architecture");   /* insertion order */
    cr_assert_str_eq(f->kv[f->n_kv - 1].key, "k.replaced");
    kv = gguf_find_kv(f, "k.u8"); cr_assert(kv && kv->type == GGUF_TYPE_UINT8 && kv->v.u64 == 250);
    kv = gguf_find_kv(f, "k.i8"); cr_assert(kv && kv->type == GGUF_TYPE_INT8 && kv->v.i64 == -100);
    kv = gguf_find_kv(f, "k.u16"); cr_assert(kv && kv->type == GGUF_TYPE_UINT16 && kv->v.u64 == 65000);
    kv = gguf_find_kv(f, "k.i16"); cr_assert(kv && kv->type == GGUF_TYPE_INT16 && kv->v.i64 == -32000);
    kv = gguf_find_kv(f, "k.u32"); cr_assert(kv && kv->type == GGUF_TYPE_UINT32 && kv->v.u64 == 4000000000u);
    kv = gguf_find_kv(f, "k.i32"); cr_assert(kv && kv->type == GGUF_TYPE_INT32 && kv->v.i64 == -2000000000);
    kv = gguf_find_kv(f, "k.f32"); cr_assert(kv && kv->type == GGUF_TYPE_FLOAT32 && (float)kv->v.f64 == 1.5e-6f);
    kv = gguf_find_kv(f, "k.bool"); cr_assert(kv && kv->type == GGUF_TYPE_BOOL && kv->v.b);
    kv = gguf_find_kv(f, "k.str");
    cr_assert(kv && kv->type == GGUF_TYPE_STRING && kv->str_len == 6);
    cr_assert_str_eq(kv->str, "h\xc3\xa9llo");
    kv = gguf_find_kv(f, "k.empty"); cr_assert(kv && kv->str_len == 0 && kv->str && kv->str[0] == 0);
    kv = gguf_find_kv(f, "k.u64"); cr_assert(kv && kv->type == GGUF_TYPE_UINT64 && kv->v.u64 == 0xfedcba9876543210ull);
    kv = gguf_find_kv(f, "k.i64"); cr_assert(kv && kv->type == GGUF_TYPE_INT64 && kv->v.i64 == INT64_MIN + 5);
    kv = gguf_find_kv(f, "k.f64"); cr_assert(kv && kv->type == GGUF_TYPE_FLOAT64 && kv->v.f64 == 3.141592653589793);
    kv = gguf_find_kv(f, "k.replaced"); cr_assert(kv && kv->v.u64 == 2);

    kv = gguf_find_kv(f, "a.str");
    cr_assert(kv && kv->type == GGUF_TYPE_ARRAY && kv->arr_type == GGUF_TYPE_STRING && kv->n == 3);
    cr_assert_str_eq(kv->arr_str[0], "alpha");
    cr_assert_str_eq(kv->arr_str[1], "");
    cr_assert_str_eq(kv->arr_str[2], "g\xc4\x9f");
    kv = gguf_find_kv(f, "a.f32");
    cr_assert(kv && kv->arr_type == GGUF_TYPE_FLOAT32 && kv->n == 3);
    float af[3];
    memcpy(af, kv->arr, sizeof af);
    cr_assert(af[0] == 0.5f && af[1] == -2.0f && af[2] == 1e30f);
    kv = gguf_find_kv(f, "a.u64");
    uint64_t au64[2];
    memcpy(au64, kv->arr, sizeof au64);
    cr_assert(kv->arr_type == GGUF_TYPE_UINT64 && au64[1] == UINT64_MAX);
    kv = gguf_find_kv(f, "a.f64");
    double af64[2];
    memcpy(af64, kv->arr, sizeof af64);
    cr_assert(kv->arr_type == GGUF_TYPE_FLOAT64 && af64[0] == -0.25 && af64[1] == 1e300);
    kv = gguf_find_kv(f, "a.empty"); cr_assert(kv && kv->n == 0 && kv->arr_type == GGUF_TYPE_INT32);

    /* getters */
    int32_t ai[8];
    size_t n;
    cr_assert_eq(gguf_get_arr_i32(f, "a.i32", ai, 8, &n, err, sizeof err), 0);
    cr_assert(n == 4 && ai[0] == -1 && ai[3] == INT32_MAX);
    cr_assert_eq(gguf_get_arr_i32(f, "a.u8", ai, 8, &n, err, sizeof err), 0);
    cr_assert(n == 5 && ai[4] == 255);
    cr_assert_eq(gguf_get_arr_i32(f, "a.i16", ai, 8, &n, err, sizeof err), 0);
    cr_assert(n == 2 && ai[0] == -300);
    cr_assert_eq(gguf_get_arr_i32(f, "a.bool", ai, 8, &n, err, sizeof err), 0);
    cr_assert(n == 3 && ai[0] == 1 && ai[1] == 0);
    cr_assert_eq(gguf_get_arr_i32(f, "a.i32", ai, 3, &n, err, sizeof err), COTI_E_FORMAT);
    cr_assert(n == 4 && strstr(err, "4 elements"), "%s", err);
    cr_assert_eq(gguf_get_arr_i32(f, "a.i32", NULL, 0, &n, err, sizeof err), 0);
    cr_assert_eq(n, 4);
    cr_assert_eq(gguf_get_arr_i32(f, "a.u64", ai, 8, &n, err, sizeof err), COTI_E_FORMAT);
    cr_assert_eq(gguf_get_arr_i32(f, "a.f32", ai, 8, &n, err, sizeof err), COTI_E_FORMAT);
    cr_assert_eq(gguf_get_arr_i32(f, "k.i32", ai, 8, &n, err, sizeof err), COTI_E_FORMAT);
    cr_assert_eq(gguf_get_arr_i32(f, "absent", ai, 8, &n, err, sizeof err), COTI_E_ARG);

    uint32_t u32;
    int32_t i32;
    float f32;
    bool b;
    const char *s;
    cr_assert_eq(gguf_get_u32(f, "k.u8", &u32, err, sizeof err), 0); cr_assert_eq(u32, 250);
    cr_assert_eq(gguf_get_u32(f, "k.u32", &u32, err, sizeof err), 0); cr_assert_eq(u32, 4000000000u);
    cr_assert_eq(gguf_get_u32(f, "k.i32", &u32, err, sizeof err), COTI_E_FORMAT);
    cr_assert(strstr(err, "k.i32") && strstr(err, "-2000000000"), "%s", err);
    cr_assert_eq(gguf_get_u32(f, "k.u64", &u32, err, sizeof err), COTI_E_FORMAT);
    cr_assert_eq(gguf_get_u32(f, "k.str", &u32, err, sizeof err), COTI_E_FORMAT);
    cr_assert_eq(gguf_get_u32(f, "k.f32", &u32, err, sizeof err), COTI_E_FORMAT);
    err[0] = 'x';
    cr_assert_eq(gguf_get_u32(f, "no.such.key", &u32, err, sizeof err), COTI_E_ARG);
    cr_assert_eq(err[0], 'x');   /* absent: no message */
    cr_assert_eq(gguf_get_i32(f, "k.i16", &i32, err, sizeof err), 0); cr_assert_eq(i32, -32000);
    cr_assert_eq(gguf_get_i32(f, "k.u32", &i32, err, sizeof err), COTI_E_FORMAT);
    cr_assert_eq(gguf_get_i32(f, "k.i64", &i32, err, sizeof err), COTI_E_FORMAT);
    cr_assert_eq(gguf_get_f32(f, "k.f32", &f32, err, sizeof err), 0); cr_assert_eq(f32, 1.5e-6f);
    cr_assert_eq(gguf_get_f32(f, "k.f64", &f32, err, sizeof err), 0); cr_assert_eq(f32, 3.14159265f);
    cr_assert_eq(gguf_get_f32(f, "k.u32", &f32, err, sizeof err), COTI_E_FORMAT);
    cr_assert_eq(gguf_get_bool(f, "k.bool", &b, err, sizeof err), 0); cr_assert(b);
    cr_assert_eq(gguf_get_bool(f, "k.u8", &b, err, sizeof err), COTI_E_FORMAT);
    cr_assert_eq(gguf_get_str(f, "general.architecture", &s, err, sizeof err), 0);
    cr_assert_str_eq(s, "roundtrip");
    cr_assert_eq(gguf_get_str(f, "k.u8", &s, err, sizeof err), COTI_E_FORMAT);

    /* tensors: insertion order, packed with 32-byte padding, shapes and bytes */
    static const char *names[] = {"t.f32", "t.f16", "t.q8_0", "t.q4_0", "t.q4_k"};
    static const int64_t ne[5][4] = {{3, 5, 1, 1}, {33, 1, 1, 1}, {64, 2, 3, 1}, {32, 1, 2, 2}, {256, 3, 1, 1}};
    static const uint32_t nd[5] = {2, 1, 3, 4, 2};
    static const size_t sizes[5] = {60, 66, 408, 72, 432};
    cr_assert_eq(f->n_tensors, 5);
    cr_assert_eq(f->alignment, 32);
    uint64_t off = 0;
    for (int i = 0; i < 5; i++) {
        const struct gguf_tensor *t = &f->tensors[i];
        cr_assert_str_eq(t->name, names[i]);
        cr_assert_eq(gguf_find_tensor(f, names[i]), t);
        cr_assert_eq(t->n_dims, nd[i]);
        for (int d = 0; d < 4; d++) cr_assert_eq(t->ne[d], ne[i][d], "%s ne[%d]", names[i], d);
        cr_assert_eq(t->size_bytes, sizes[i]);
        cr_assert_eq(t->offset, off);
        cr_assert_eq((f->data_offset + t->offset) % 32, 0);
        cr_assert_eq(memcmp(t->data, tdata[i], sizes[i]), 0, "%s data", names[i]);
        off += (sizes[i] + 31) / 32 * 32;
    }
    cr_assert_eq(f->tensors[0].type, GGML_TYPE_F32);
    cr_assert_eq(f->tensors[4].type, GGML_TYPE_Q4_K);
    cr_assert_eq(f->data_offset + off, f->size);   /* the last tensor's padding is written */
}

Test(gguf, roundtrip_buffer_and_file) {
    uint8_t *tdata[5];
    size_t tsize[5];
    struct gguf_writer *w = roundtrip_writer(tdata, tsize);
    void *buf;
    size_t size;
    char err[256];
    cr_assert_eq(gguf_writer_to_buffer(w, &buf, &size, err, sizeof err), 0, "%s", err);
    struct gguf_file *f;
    cr_assert_eq(gguf_open_memory(&f, buf, size, err, sizeof err), 0, "%s", err);
    cr_assert_not(f->mapped);
    check_roundtrip(f, tdata);
    gguf_close(f);

    char path[64];
    snprintf(path, sizeof path, "/tmp/coti_test_gguf_%ld.gguf", (long)getpid());
    cr_assert_eq(gguf_writer_write(w, path, err, sizeof err), 0, "%s", err);
    cr_assert_eq(gguf_open(&f, path, err, sizeof err), 0, "%s", err);
    cr_assert(f->mapped);
    check_roundtrip(f, tdata);
    cr_assert_eq(f->size, size);
    cr_assert_eq(memcmp(f->base, buf, size), 0, "file and buffer serializations differ");
    gguf_close(f);
    unlink(path);
    for (int i = 0; i < 5; i++) free(tdata[i]);
    free(buf);
    gguf_writer_free(w);
}

Test(gguf, writer_alignment_and_errors) {
    char err[256];
    struct gguf_writer *w = gguf_writer_init();
    gguf_writer_set_u32(w, "general.alignment", 64);
    float d[3] = {1, 2, 3};
    int64_t ne[1] = {3};
    gguf_writer_add_tensor(w, "x", GGML_TYPE_F32, 1, ne, d, sizeof d);
    gguf_writer_add_tensor(w, "y", GGML_TYPE_F32, 1, ne, d, sizeof d);
    void *buf;
    size_t size;
    cr_assert_eq(gguf_writer_to_buffer(w, &buf, &size, err, sizeof err), 0, "%s", err);
    struct gguf_file *f;
    cr_assert_eq(gguf_open_memory(&f, buf, size, err, sizeof err), 0, "%s", err);
    cr_assert_eq(f->alignment, 64);
    cr_assert_eq(f->data_offset % 64, 0);
    cr_assert_eq(gguf_find_tensor(f, "y")->offset, 64);
    gguf_close(f);
    free(buf);

    /* a bad tensor is refused, and the sticky error fails the write */
    cr_assert_eq(gguf_writer_add_tensor(w, "x", GGML_TYPE_F32, 1, ne, d, sizeof d), COTI_E_ARG);
    cr_assert_lt(gguf_writer_to_buffer(w, &buf, &size, err, sizeof err), 0);
    cr_assert(strstr(err, "duplicate tensor name 'x'"), "%s", err);
    gguf_writer_free(w);

    w = gguf_writer_init();
    cr_assert_eq(gguf_writer_add_tensor(w, "q", GGML_TYPE_Q8_0, 1, (int64_t[]){48}, d, 51), COTI_E_ARG);
    gguf_writer_free(w);
    w = gguf_writer_init();
    cr_assert_eq(gguf_writer_add_tensor(w, "f", GGML_TYPE_F32, 1, ne, d, 8), COTI_E_ARG);
    gguf_writer_free(w);
    w = gguf_writer_init();
    gguf_writer_set_u32(w, "general.alignment", 24);
    cr_assert_lt(gguf_writer_to_buffer(w, &buf, &size, err, sizeof err), 0);
    cr_assert(strstr(err, "power of 2"), "%s", err);
    gguf_writer_free(w);
    w = gguf_writer_init();
    cr_assert_eq(gguf_writer_set_arr(w, "k", GGUF_TYPE_STRING, d, 1), COTI_E_ARG);
    gguf_writer_free(w);
}

/* Streaming: tensors declared without data, filled at write time, in insertion order. */
static int fill_cb(void *ctx, size_t index, const char *name, void *dst, size_t size, char *err, size_t err_size) {
    int *calls = ctx;
    cr_assert_eq(index, (size_t)*calls, "tensor '%s' filled as number %zu, %d before it", name, index, *calls);
    (*calls)++;
    fill_pattern(dst, size, (unsigned)name[0]);
    return 0;
}

Test(gguf, writer_streaming_and_copy_kv) {
    char err[256];
    char path[64];
    snprintf(path, sizeof path, "/tmp/coti_test_gguf_stream_%ld.gguf", (long)getpid());
    /* copy every record of a round-trip file into a new writer with set_kv */
    uint8_t *tdata[5];
    size_t tsize[5];
    struct gguf_writer *w0 = roundtrip_writer(tdata, tsize);
    void *buf0;
    size_t size0;
    cr_assert_eq(gguf_writer_to_buffer(w0, &buf0, &size0, err, sizeof err), 0, "%s", err);
    gguf_writer_free(w0);
    struct gguf_file *src;
    cr_assert_eq(gguf_open_memory(&src, buf0, size0, err, sizeof err), 0, "%s", err);

    struct gguf_writer *w = gguf_writer_init();
    for (uint64_t i = 0; i < src->n_kv; i++) cr_assert_eq(gguf_writer_set_kv(w, &src->kv[i]), 0);
    for (uint64_t i = 0; i < src->n_tensors; i++) {
        const struct gguf_tensor *t = &src->tensors[i];
        cr_assert_eq(gguf_writer_add_tensor_info(w, t->name, t->type, t->n_dims, t->ne), 0);
    }
    cr_assert_lt(gguf_writer_write(w, path, err, sizeof err), 0);   /* no fill given */
    cr_assert_eq(access(path, F_OK), -1, "a failed write left a file behind");
    int calls = 0;
    cr_assert_eq(gguf_writer_write_fill(w, path, fill_cb, &calls, err, sizeof err), 0, "%s", err);
    cr_assert_eq(calls, 5);
    gguf_writer_free(w);

    struct gguf_file *f;
    cr_assert_eq(gguf_open(&f, path, err, sizeof err), 0, "%s", err);
    /* the metadata part is byte-identical to the source's */
    cr_assert_eq(f->data_offset, src->data_offset);
    cr_assert_eq(memcmp(f->base, src->base, src->data_offset), 0);
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor *t = &f->tensors[i];
        uint8_t *expect = malloc(t->size_bytes);
        fill_pattern(expect, t->size_bytes, (unsigned)t->name[0]);
        cr_assert_eq(memcmp(t->data, expect, t->size_bytes), 0);
        free(expect);
    }
    gguf_close(f);
    gguf_close(src);
    unlink(path);
    free(buf0);
    for (int i = 0; i < 5; i++) free(tdata[i]);
}

Test(gguf, vocab_only_file) {
    struct gguf_writer *w = gguf_writer_init();
    gguf_writer_set_str(w, "general.architecture", "gpt2");
    void *buf;
    size_t size;
    char err[256];
    cr_assert_eq(gguf_writer_to_buffer(w, &buf, &size, err, sizeof err), 0, "%s", err);
    gguf_writer_free(w);
    struct gguf_file *f;
    cr_assert_eq(gguf_open_memory(&f, buf, size, err, sizeof err), 0, "%s", err);
    cr_assert_eq(f->n_tensors, 0);
    cr_assert_eq(f->data_offset, size);   /* no padding without tensors */
    gguf_close(f);
    free(buf);
}

Test(gguf, open_errors) {
    struct gguf_file *f;
    char err[256];
    cr_assert_eq(gguf_open(&f, "/nonexistent/x.gguf", err, sizeof err), COTI_E_IO);
    cr_assert(strstr(err, "/nonexistent/x.gguf"), "%s", err);
    cr_assert_eq(gguf_open(&f, "/tmp", err, sizeof err), COTI_E_IO);
    char path[64];
    snprintf(path, sizeof path, "/tmp/coti_test_gguf_bad_%ld.gguf", (long)getpid());
    FILE *fp = fopen(path, "wb");
    static const char junk[] = "GGUF\x01\0\0\0 not really a GGUF file";
    fwrite(junk, 1, sizeof junk - 1, fp);
    fclose(fp);
    cr_assert_eq(gguf_open(&f, path, err, sizeof err), COTI_E_UNSUPPORTED);
    cr_assert(strstr(err, path) && strstr(err, "version 1"), "%s", err);
    unlink(path);
}

/* ---------------------------------------------------------------------------------------
 * The shipped model (facts from a hand parse with python3 and from MODEL_CARD.md)
 * ------------------------------------------------------------------------------------- */

Test(gguf, shipped_model) {
    struct gguf_file *f;
    char err[256];
    cr_assert_eq(gguf_open(&f, SHIPPED_MODEL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(f->version, 3);
    cr_assert_eq(f->size, 27133760);
    cr_assert_eq(f->n_kv, 34);
    cr_assert_eq(f->n_tensors, 123);
    cr_assert_eq(f->alignment, 32);
    cr_assert_eq(f->data_offset, 533696);
    const char *s;
    cr_assert_eq(gguf_get_str(f, "general.architecture", &s, err, sizeof err), 0);
    cr_assert_str_eq(s, "qwen35");
    uint32_t u;
    cr_assert_eq(gguf_get_u32(f, "qwen35.block_count", &u, err, sizeof err), 0); cr_assert_eq(u, 9);
    cr_assert_eq(gguf_get_u32(f, "qwen35.embedding_length", &u, err, sizeof err), 0); cr_assert_eq(u, 384);
    cr_assert_eq(gguf_get_u32(f, "qwen35.nextn_predict_layers", &u, err, sizeof err), 0); cr_assert_eq(u, 1);
    cr_assert_eq(gguf_get_u32(f, "qwen35.ssm.inner_size", &u, err, sizeof err), 0); cr_assert_eq(u, 512);
    float eps;
    cr_assert_eq(gguf_get_f32(f, "qwen35.attention.layer_norm_rms_epsilon", &eps, err, sizeof err), 0);
    cr_assert_float_eq(eps, 1e-6f, 1e-12);
    int32_t sec[4];
    size_t n;
    cr_assert_eq(gguf_get_arr_i32(f, "qwen35.rope.dimension_sections", sec, 4, &n, err, sizeof err), 0);
    cr_assert(n == 4 && sec[0] == 3 && sec[1] == 3 && sec[2] == 2 && sec[3] == 0);
    bool b = true;
    cr_assert_eq(gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &b, err, sizeof err), 0);
    cr_assert_not(b);
    const struct gguf_kv *tok = gguf_find_kv(f, "tokenizer.ggml.tokens");
    cr_assert(tok && tok->type == GGUF_TYPE_ARRAY && tok->arr_type == GGUF_TYPE_STRING);
    cr_assert_eq(tok->n, 16384);
    cr_assert_str_eq(tok->arr_str[0], "<|endoftext|>");
    cr_assert_str_eq(tok->arr_str[2], "<|im_end|>");
    const struct gguf_kv *merges = gguf_find_kv(f, "tokenizer.ggml.merges");
    cr_assert(merges && merges->n == 16125);
    cr_assert_str_eq(merges->arr_str[0], "\xc4\xa0 \xc4\xa0");   /* "Ġ Ġ" */

    const struct gguf_tensor *t = gguf_find_tensor(f, "token_embd.weight");
    cr_assert(t && t->type == GGML_TYPE_Q8_0 && t->n_dims == 2 && t->ne[0] == 384 && t->ne[1] == 16384);
    cr_assert_eq(t->offset, 0);
    cr_assert_eq(t->size_bytes, (size_t)16384 * 12 * 34);
    cr_assert_null(gguf_find_tensor(f, "output.weight"));   /* tied */
    t = gguf_find_tensor(f, "blk.0.ssm_conv1d.weight");
    cr_assert(t && t->type == GGML_TYPE_F32 && t->ne[0] == 4 && t->ne[1] == 1024 && t->offset == 7314432);
    t = gguf_find_tensor(f, "blk.3.attn_q.weight");
    cr_assert(t && t->ne[0] == 384 && t->ne[1] == 768);
    t = gguf_find_tensor(f, "blk.8.nextn.eh_proj.weight");
    cr_assert(t && t->ne[0] == 768 && t->ne[1] == 384);
    t = gguf_find_tensor(f, "blk.8.nextn.shared_head_norm.weight");
    cr_assert(t && t->type == GGML_TYPE_F32 && t->offset == 26598528);
    cr_assert_eq(f->data_offset + t->offset + t->size_bytes, f->size);
    /* ssm_a is -exp(A_log): strictly negative */
    t = gguf_find_tensor(f, "blk.0.ssm_a");
    cr_assert(t && t->ne[0] == 8);
    for (int i = 0; i < 8; i++) {
        float a;
        memcpy(&a, (const uint8_t *)t->data + 4 * i, 4);
        cr_assert_lt(a, 0.0f);
    }
    gguf_close(f);
}

/* ---------------------------------------------------------------------------------------
 * `coti gguf` (src/tools/ is not in libcoti.a, so the inspector is compiled in here)
 * ------------------------------------------------------------------------------------- */

#include "../src/tools/gguf_inspect.c"

/* Runs tool_gguf_main with stdout captured into a malloc'ed string. */
static int run_inspect(char **out, int argc, char **argv) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/coti_test_gguf_inspect_%ld.txt", (long)getpid());
    fflush(stdout);
    int saved = dup(1);
    FILE *fp = fopen(path, "w+");
    cr_assert(fp && saved >= 0);
    dup2(fileno(fp), 1);
    int rc = tool_gguf_main(argc, argv);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    fseek(fp, 0, SEEK_END);   /* the output went through fd 1, not through fp */
    long n = ftell(fp);
    cr_assert_geq(n, 0);
    rewind(fp);
    *out = calloc((size_t)n + 1, 1);
    cr_assert_eq(fread(*out, 1, (size_t)n, fp), (size_t)n);
    fclose(fp);
    unlink(path);
    return rc;
}

Test(gguf, inspect_shipped_model) {
    char *out;
    char *argv[] = {"gguf", SHIPPED_MODEL, NULL};
    cr_assert_eq(run_inspect(&out, 2, argv), 0);
    cr_assert(strstr(out, "version: 3"), "%s", out);
    cr_assert(strstr(out, "general.architecture: string \"qwen35\""));
    cr_assert(strstr(out, "qwen35.block_count: uint32 9"));
    cr_assert(strstr(out, "qwen35.rope.dimension_sections: array[int32] count 4 [3, 3, 2, 0]"));
    cr_assert(strstr(out, "tokenizer.ggml.tokens: array[string] count 16384 [\"<|endoftext|>\", "));
    cr_assert(strstr(out, ", ...]"));                      /* abbreviated */
    cr_assert(strstr(out, "... (196 bytes)"));            /* chat template truncated */
    cr_assert(strstr(out, "tensors: 123"));
    cr_assert(strstr(out, "token_embd.weight"));
    cr_assert(strstr(out, "{384, 16384}"));
    cr_assert(strstr(out, "total: 24941664 elements"));  /* MODEL_CARD.md: 24,941,664 parameters */
    free(out);
}

Test(gguf, inspect_hostile_strings_and_bad_files) {
    /* control characters and invalid UTF-8 must come out escaped */
    struct gguf_writer *w = gguf_writer_init();
    gguf_writer_set_str(w, "evil\x1b[2Jkey", "a\x1b]0;title\x07 \xff\xfe ok \xc3\xa9");
    const char *toks[] = {"\x1b[31mred"};
    gguf_writer_set_arr_str(w, "toks", toks, 1);
    char path[64], err[256];
    snprintf(path, sizeof path, "/tmp/coti_test_gguf_evil_%ld.gguf", (long)getpid());
    cr_assert_eq(gguf_writer_write(w, path, err, sizeof err), 0, "%s", err);
    gguf_writer_free(w);
    char *out;
    char *argv[] = {"gguf", path, NULL};
    cr_assert_eq(run_inspect(&out, 2, argv), 0);
    cr_assert_null(strchr(out, '\x1b'), "raw ESC in output: %s", out);
    cr_assert_null(strchr(out, '\x07'));
    cr_assert(strstr(out, "evil\\x1b[2Jkey: string \"a\\x1b]0;title\\x07 \\xff\\xfe ok \xc3\xa9\""), "%s", out);
    cr_assert(strstr(out, "[\"\\x1b[31mred\"]"), "%s", out);
    free(out);
    unlink(path);

    /* a bad file: exit code 1, the message on stderr */
    FILE *fp = fopen(path, "wb");
    fwrite("GGUF\x63\0\0\0", 1, 8, fp);
    fwrite(&(uint64_t){0}, 8, 1, fp);
    fwrite(&(uint64_t){0}, 8, 1, fp);
    fclose(fp);
    cr_assert_eq(run_inspect(&out, 2, argv), 1);
    free(out);
    unlink(path);
    char *argv2[] = {"gguf", NULL};
    cr_assert_eq(run_inspect(&out, 1, argv2), 1);
    free(out);
}
