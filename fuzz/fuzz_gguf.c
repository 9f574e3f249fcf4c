/* fuzz_gguf.c — libFuzzer target for the GGUF reader (gguf_open_memory on arbitrary bytes),
 * then every getter and lookup on whatever it accepted. Built by `make fuzz` into build-fuzz/
 * (`make fuzz-run` runs it); seeds in fuzz/corpus/gguf/ (a small `coti mkmodel` file).
 * fuzz_load.c goes on from the reader to the whole model load. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct gguf_file *f = NULL;
    char err[512];
    if (gguf_open_memory(&f, data, size, err, sizeof err) != 0) {
        /* every failure must leave a message and no object */
        if (f || !err[0]) __builtin_trap();
        return 0;
    }
    /* touch everything the reader promised is valid */
    volatile uint8_t sink = 0;
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const struct gguf_kv *kv = &f->kv[i];
        if (gguf_find_kv(f, kv->key) != kv) __builtin_trap();   /* keys are unique */
        uint32_t u32; int32_t i32; float f32; bool b; const char *s;
        gguf_get_u32(f, kv->key, &u32, err, sizeof err);
        gguf_get_i32(f, kv->key, &i32, err, sizeof err);
        gguf_get_f32(f, kv->key, &f32, err, sizeof err);
        gguf_get_bool(f, kv->key, &b, err, sizeof err);
        if (gguf_get_str(f, kv->key, &s, err, sizeof err) == 0) sink ^= (uint8_t)s[kv->str_len];
        int32_t arr[16];
        size_t n;
        gguf_get_arr_i32(f, kv->key, arr, 16, &n, err, sizeof err);
        if (kv->type == GGUF_TYPE_ARRAY && kv->arr_type == GGUF_TYPE_STRING)
            for (uint64_t k = 0; k < kv->n; k++) sink ^= (uint8_t)kv->arr_str[k][strlen(kv->arr_str[k])];
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor *t = &f->tensors[i];
        if (gguf_find_tensor(f, t->name) != t) __builtin_trap();   /* names are unique */
        const uint8_t *p = t->data;
        if (p < data || p + t->size_bytes > data + size) __builtin_trap();
        sink ^= p[0] ^ p[t->size_bytes - 1];
    }
    (void)sink;
    gguf_close(f);
    return 0;
}
