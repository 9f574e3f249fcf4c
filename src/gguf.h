/* gguf.h — GGUF v2/v3 reader (mmap, complete validation of untrusted files) and writer.
 * Knows nothing of models: it hands out metadata and a tensor directory.
 * Reference: ../shared/docs/gguf-format.md. */
#ifndef COTI_GGUF_H
#define COTI_GGUF_H

#include "common.h"
#include "quant/quant.h"

enum gguf_type {
    GGUF_TYPE_UINT8 = 0, GGUF_TYPE_INT8 = 1, GGUF_TYPE_UINT16 = 2, GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4, GGUF_TYPE_INT32 = 5, GGUF_TYPE_FLOAT32 = 6, GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8, GGUF_TYPE_ARRAY = 9, GGUF_TYPE_UINT64 = 10, GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
};

/* One key/value record. Strings are copied out of the file and NUL-terminated
 * (a string containing NUL bytes keeps its length in *_len). */
struct gguf_kv {
    char *key;
    enum gguf_type type;         /* for arrays: GGUF_TYPE_ARRAY */
    enum gguf_type arr_type;     /* element type when type == ARRAY */
    uint64_t n;                  /* number of elements (1 for scalars) */
    union {
        uint64_t u64; int64_t i64; double f64; bool b;
    } v;                         /* scalar value, widened (unsigned types in u64, signed in i64, floats in f64) */
    char *str; uint64_t str_len; /* type == STRING */
    const void *arr;             /* numeric array: points into the file (little-endian, packed) */
    char **arr_str;              /* string array: n NUL-terminated copies */
};

struct gguf_tensor {
    char *name;
    uint32_t n_dims;
    int64_t ne[4];               /* ne[0] innermost; unused dims are 1 */
    enum ggml_type type;
    uint64_t offset;             /* relative to the data section */
    size_t size_bytes;
    const void *data;            /* points into the mapping */
};

struct gguf_file {
    uint32_t version;
    uint64_t n_kv;
    struct gguf_kv *kv;
    uint64_t n_tensors;
    struct gguf_tensor *tensors;
    size_t alignment;
    size_t data_offset;          /* start of the tensor data section in the file */
    const uint8_t *base;         /* whole file (mapping or caller's buffer) */
    size_t size;
    bool mapped;                 /* true: base is an mmap this object owns */
};

/* Open and validate a file completely. Returns 0 and *out, or a negative coti_err with a
 * message naming the offending value (e.g. "tensor 'x' offset 123 + size 456 exceeds data
 * section of 400 bytes"). */
int gguf_open(struct gguf_file **out, const char *path, char *err, size_t err_size);
/* Same over a caller-owned buffer (kept alive by the caller while the file is open). */
int gguf_open_memory(struct gguf_file **out, const void *buf, size_t size, char *err, size_t err_size);
void gguf_close(struct gguf_file *f);

const struct gguf_kv *gguf_find_kv(const struct gguf_file *f, const char *key);
const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name);

/* Typed getters: return 0 on success, COTI_E_FORMAT when the key exists with an incompatible
 * type or a value out of range for the target type, and COTI_E_ARG (no message) when the key
 * is absent, so callers can apply defaults. Integer getters accept any integer kv type whose
 * value fits. */
int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *out, char *err, size_t err_size);
int gguf_get_i32(const struct gguf_file *f, const char *key, int32_t *out, char *err, size_t err_size);
int gguf_get_f32(const struct gguf_file *f, const char *key, float *out, char *err, size_t err_size);
int gguf_get_bool(const struct gguf_file *f, const char *key, bool *out, char *err, size_t err_size);
int gguf_get_str(const struct gguf_file *f, const char *key, const char **out, char *err, size_t err_size);
/* Integer array (any integer or bool element type) into out[0..max); *n gets the count.
 * out == NULL only asks for the count; more than max elements is COTI_E_FORMAT. */
int gguf_get_arr_i32(const struct gguf_file *f, const char *key, int32_t *out, size_t max, size_t *n, char *err, size_t err_size);

/* Writer: builds a file in memory order kv..., tensor infos, aligned data. */
struct gguf_writer;
struct gguf_writer *gguf_writer_init(void);
void gguf_writer_free(struct gguf_writer *w);
int gguf_writer_set_u32(struct gguf_writer *w, const char *key, uint32_t v);
int gguf_writer_set_i32(struct gguf_writer *w, const char *key, int32_t v);
int gguf_writer_set_u64(struct gguf_writer *w, const char *key, uint64_t v);
int gguf_writer_set_f32(struct gguf_writer *w, const char *key, float v);
int gguf_writer_set_bool(struct gguf_writer *w, const char *key, bool v);
int gguf_writer_set_str(struct gguf_writer *w, const char *key, const char *v);
int gguf_writer_set_arr_i32(struct gguf_writer *w, const char *key, const int32_t *v, size_t n);
int gguf_writer_set_arr_f32(struct gguf_writer *w, const char *key, const float *v, size_t n);
int gguf_writer_set_arr_str(struct gguf_writer *w, const char *key, const char *const *v, size_t n);
/* Copies data (size must equal the tensor's size for its type and shape). */
int gguf_writer_add_tensor(struct gguf_writer *w, const char *name, enum ggml_type type,
                           uint32_t n_dims, const int64_t *ne, const void *data, size_t size);
int gguf_writer_write(struct gguf_writer *w, const char *path, char *err, size_t err_size);
/* Serialize to a malloc'ed buffer (tests, fuzzing). */
int gguf_writer_to_buffer(struct gguf_writer *w, void **buf, size_t *size, char *err, size_t err_size);

/* --- Additions (backward compatible) ------------------------------------------------------ */

/* "uint32", "string", "array", ...; "?" for an id outside enum gguf_type. */
const char *gguf_type_name(enum gguf_type t);

/* Remaining scalar types, so every GGUF type can be written. */
int gguf_writer_set_u8(struct gguf_writer *w, const char *key, uint8_t v);
int gguf_writer_set_i8(struct gguf_writer *w, const char *key, int8_t v);
int gguf_writer_set_u16(struct gguf_writer *w, const char *key, uint16_t v);
int gguf_writer_set_i16(struct gguf_writer *w, const char *key, int16_t v);
int gguf_writer_set_i64(struct gguf_writer *w, const char *key, int64_t v);
int gguf_writer_set_f64(struct gguf_writer *w, const char *key, double v);
/* Array of any fixed-size element type (not STRING/ARRAY); v holds n packed little-endian
 * elements (for BOOL: one byte each). */
int gguf_writer_set_arr(struct gguf_writer *w, const char *key, enum gguf_type elem_type,
                        const void *v, size_t n);
/* Copy one record read by gguf_open (any type), e.g. the tokenizer.* keys of another model.
 * String-array elements are copied up to their first NUL. */
int gguf_writer_set_kv(struct gguf_writer *w, const struct gguf_kv *kv);

/* Streaming writes (models larger than RAM): declare a tensor without data; at write time
 * fill(ctx, index, name, dst, size) must write exactly size bytes of that tensor into dst
 * (index: its place in insertion order, counting every tensor). Tensors are written in
 * insertion order, one at a time, so only one tensor is held in memory. */
typedef int (*gguf_writer_fill_fn)(void *ctx, size_t index, const char *name, void *dst, size_t size,
                                   char *err, size_t err_size);
int gguf_writer_add_tensor_info(struct gguf_writer *w, const char *name, enum ggml_type type,
                                uint32_t n_dims, const int64_t *ne);
/* Like gguf_writer_write; fill may be NULL when every tensor was given data. */
int gguf_writer_write_fill(struct gguf_writer *w, const char *path, gguf_writer_fill_fn fill,
                           void *ctx, char *err, size_t err_size);

#endif
