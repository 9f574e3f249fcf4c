/* arena.h — every activation buffer of a model sliced out of one backend allocation (llm.c's
 * malloc_and_point): one allocation to make and free, each slot 64-byte aligned. */
#ifndef COTI_ARENA_H
#define COTI_ARENA_H

#include "backend.h"

struct arena_slot {
    void **p;                    /* set to the slot's start */
    size_t bytes;
};

/* The block holding every slot (be->free it), or NULL when out of memory or a size overflows. */
void *arena_alloc(struct backend *be, const struct arena_slot *slots, int n);

#endif
