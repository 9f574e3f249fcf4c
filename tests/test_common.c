/* test_common.c — common.h helpers: the buffer growth rule every growable buffer uses. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>

#include "common.h"

Test(common, grow_doubles_from_first_and_keeps_contents) {
    int32_t *v = NULL;
    size_t cap = 0;
    cr_assert(coti_grow(&v, &cap, 1, sizeof *v, 16));
    cr_assert_eq(cap, 16);
    for (int i = 0; i < 16; i++) v[i] = i * 7;
    cr_assert(coti_grow(&v, &cap, 16, sizeof *v, 16));   /* fits: unchanged */
    cr_assert_eq(cap, 16);
    cr_assert(coti_grow(&v, &cap, 17, sizeof *v, 16));
    cr_assert_eq(cap, 32);
    cr_assert(coti_grow(&v, &cap, 100, sizeof *v, 16));   /* several doublings at once */
    cr_assert_eq(cap, 128);
    for (int i = 0; i < 16; i++) cr_assert_eq(v[i], i * 7, "element %d lost in a realloc", i);
    free(v);
}

Test(common, grow_refuses_sizes_that_overflow) {
    char *p = malloc(8);
    size_t cap = 8;
    cr_assert_not(coti_grow(&p, &cap, SIZE_MAX / 2 + 2, 4, 8), "need * elem overflows size_t");
    cr_assert_eq(cap, 8, "capacity untouched on failure");
    cr_assert_not_null(p);
    free(p);
}
