/* test_common.c — common.h helpers: the buffer growth rule every growable buffer uses, the
 * escaping of untrusted text in log lines, the default thread count. */
#include <criterion/criterion.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
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

/* Log excerpts are JSON string contents: a parser gets the text back; nothing reaches a
 * terminal as a control sequence; the cut never splits an escape. */
Test(common, log_escape_is_json_string_content) {
    char out[128];
    size_t used = coti_log_escape(out, sizeof out, "Field 'stop': \"a\\b\"\n\tx\x1b[2J\x7f", 100);
    cr_assert_str_eq(out, "Field 'stop': \\\"a\\\\b\\\"\\n\\tx\\u001b[2J\\u007f");
    cr_assert_eq(used, strlen("Field 'stop': \"a\\b\"\n\tx\x1b[2J\x7f"));
    coti_log_escape(out, sizeof out, "caf\xc3\xa9 \xff\xc3 \xc2\x9b", 100);   /* é, two bad bytes, C1 CSI */
    cr_assert_str_eq(out, "caf\xc3\xa9 \\ufffd\\ufffd \\u009b");
    used = coti_log_escape(out, 8, "ab\"cdef", 100);   /* room for 7: ab\"cde */
    cr_assert_str_eq(out, "ab\\\"cde");
    cr_assert_eq(used, 6);
    used = coti_log_escape(out, 5, "abc\"", 100);      /* the escape does not fit whole: cut before it */
    cr_assert_str_eq(out, "abc");
    cr_assert_eq(used, 3);
    used = coti_log_escape(out, sizeof out, "abcdef", 4);
    cr_assert_str_eq(out, "abcd");
    coti_log_escape(out, sizeof out, NULL, 4);
    cr_assert_str_eq(out, "");
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s", path);
    fputs(text, f);
    fclose(f);
}

/* A fake sysfs: every CPU this process may use shares its core with one sibling, so the
 * default thread count is half of them (rounded up when the mask splits a pair). */
Test(common, physical_cores_count_each_core_once) {
    cpu_set_t allowed;
    cr_assert_eq(sched_getaffinity(0, sizeof allowed, &allowed), 0);
    char dir[] = "/tmp/coti-test-cpu-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    int n_cpus = 0, pairs = 0, last_pair = -1;
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, &allowed)) continue;
        char path[256], list[32];
        snprintf(path, sizeof path, "%s/cpu%d", dir, c);
        mkdir(path, 0700);
        snprintf(path, sizeof path, "%s/cpu%d/topology", dir, c);
        mkdir(path, 0700);
        snprintf(path, sizeof path, "%s/cpu%d/topology/thread_siblings_list", dir, c);
        snprintf(list, sizeof list, "%d-%d", c / 2 * 2, c / 2 * 2 + 1);
        write_text(path, list);
        n_cpus++;
        if (c / 2 != last_pair) { pairs++; last_pair = c / 2; }
    }
    cr_assert_eq(coti_physical_cores(dir), pairs, "%d CPUs in %d core pairs", n_cpus, pairs);
    /* without topology files: the CPUs of the mask */
    cr_assert_eq(coti_physical_cores("/nonexistent"), n_cpus);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}
