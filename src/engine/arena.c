/* arena.c — one backend allocation cut into 64-byte aligned slots. */
#include "engine/arena.h"

static size_t round64(size_t n) { return (n + 63) & ~(size_t)63; }

void *arena_alloc(struct backend *be, const struct arena_slot *slots, int n) {
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        if (slots[i].bytes > SIZE_MAX / 2 || total > SIZE_MAX / 2) return NULL;
        total += round64(slots[i].bytes);
    }
    uint8_t *blk = be->alloc(be, total ? total : 64);
    if (!blk) return NULL;
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        *slots[i].p = blk + off;
        off += round64(slots[i].bytes);
    }
    return blk;
}
