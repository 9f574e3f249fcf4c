/* test_graphs.c — the graph cache over a fake backend that counts what it is asked: a shape is
 * run eagerly the first time, recorded the second and replayed after; every field of the key
 * (runs of several sequences included) tells shapes apart; a stale graph is recorded again;
 * the least recently used slot of a table makes room, and one sequence's shapes never push out
 * another's or the shared table's. */
#include <criterion/criterion.h>

#include "engine/graphs.h"

struct fake {
    struct backend be;
    int eager, captured, launched, freed, next_graph;
    bool capturing, stale;
};

static struct fake *fake_of(struct backend *be) { return (struct fake *)be; }
static void f_capture_begin(struct backend *be) { fake_of(be)->capturing = true; }
static void *f_capture_end(struct backend *be) {
    struct fake *f = fake_of(be);
    f->capturing = false;
    return (void *)(intptr_t)++f->next_graph;
}
static bool f_graph_launch(struct backend *be, void *graph) {
    (void)graph;
    struct fake *f = fake_of(be);
    if (f->stale) { f->stale = false; return false; }
    f->launched++;
    return true;
}
static void f_graph_free(struct backend *be, void *graph) { (void)graph; fake_of(be)->freed++; }

static void ops(void *ctx) {
    struct fake *f = ctx;
    if (f->capturing) f->captured++;
    else f->eager++;
}

static struct fake fake_make(void) {
    return (struct fake){.be = {.capture_begin = f_capture_begin, .capture_end = f_capture_end,
                                .graph_launch = f_graph_launch, .graph_free = f_graph_free}};
}

static struct graph_key one(int seq, int n) { return (struct graph_key){.n = n, .n_runs = 1, .runs = {{seq, n}}}; }

Test(graphs, eager_then_recorded_then_replayed) {
    struct fake f = fake_make();
    struct graph_cache c;
    cr_assert_eq(graph_cache_init(&c, &f.be, 2), 0);
    const struct graph_key k = one(1, 3);
    graph_cache_run(&c, &k, ops, &f);
    cr_assert_eq(f.eager, 1);
    cr_assert_eq(f.captured, 0);
    graph_cache_run(&c, &k, ops, &f);
    cr_assert_eq(f.captured, 1, "recorded at the second sighting");
    cr_assert_eq(f.launched, 1, "and launched once");
    for (int i = 0; i < 5; i++) graph_cache_run(&c, &k, ops, &f);
    cr_assert_eq(f.eager, 1);
    cr_assert_eq(f.captured, 1);
    cr_assert_eq(f.launched, 6);
    cr_assert_eq(c.stats.eager, 1);
    cr_assert_eq(c.stats.recorded, 1);
    cr_assert_eq(c.stats.replayed, 5);
    f.stale = true; /* the backend replaced scratch memory the graph used */
    graph_cache_run(&c, &k, ops, &f);
    cr_assert_eq(f.freed, 1, "the stale graph is freed");
    cr_assert_eq(f.captured, 2, "and recorded again");
    cr_assert_eq(f.launched, 7);
    graph_cache_free(&c);
    cr_assert_eq(f.freed, 2);
}

Test(graphs, every_key_field_tells_shapes_apart) {
    struct fake f = fake_make();
    struct graph_cache c;
    cr_assert_eq(graph_cache_init(&c, &f.be, 4), 0);
    /* two runs of 2 rows each: sequences (0, 1) */
    struct graph_key base = {.n = 4, .n_runs = 2, .runs = {{0, 2}, {1, 2}}, .want = 0xF};
    struct graph_key v[9];
    for (int i = 0; i < 9; i++) v[i] = base;
    v[1].runs[1].seq = 2;                                    /* another sequence */
    v[2].runs[0].len = 1, v[2].runs[1].len = 3;              /* the same rows, split otherwise */
    v[3].runs[0] = (struct graph_run){1, 2}, v[3].runs[1] = (struct graph_run){0, 2}; /* order */
    v[4].want = 0x5;
    v[5].keep = true;
    v[6].prompt = true;
    v[7].pass = 1;
    v[8].ptr[3] = &c;
    for (int round = 0; round < 3; round++)
        for (int i = 0; i < 9; i++) graph_cache_run(&c, &v[i], ops, &f);
    cr_assert_eq(f.eager, 9, "each shape ran eagerly once");
    cr_assert_eq(f.captured, 9, "each was recorded once");
    cr_assert_eq(f.launched, 18);
    /* runs past n_runs are not part of the key */
    struct graph_key w = base;
    w.runs[5] = (struct graph_run){3, 7};
    graph_cache_run(&c, &w, ops, &f);
    cr_assert_eq(f.launched, 19, "the same shape as base");
    graph_cache_free(&c);
}

Test(graphs, tables_replace_their_least_recently_used) {
    struct fake f = fake_make();
    struct graph_cache c;
    cr_assert_eq(graph_cache_init(&c, &f.be, 2), 0);
    const struct graph_key kept = one(0, 1);
    const struct graph_key multi = {.n = 2, .n_runs = 2, .runs = {{0, 1}, {1, 1}}};
    graph_cache_run(&c, &kept, ops, &f);
    graph_cache_run(&c, &kept, ops, &f);
    graph_cache_run(&c, &multi, ops, &f);
    graph_cache_run(&c, &multi, ops, &f);
    cr_assert_eq(f.captured, 2);
    /* sequence 1 sees more one-off shapes than its table holds */
    for (int n = 1; n <= 2 * GRAPHS_PER_SEQ; n++) {
        const struct graph_key k = one(1, n % GRAPH_MAX_ROWS + 1);
        graph_cache_run(&c, &k, ops, &f);
    }
    const int launched = f.launched;
    graph_cache_run(&c, &kept, ops, &f);
    graph_cache_run(&c, &multi, ops, &f);
    cr_assert_eq(f.launched, launched + 2, "sequence 0's shape and the shared one were kept");
    cr_assert_eq(f.captured, 2);
    /* within sequence 0's table: fill it past its size while `kept` is in use all along */
    for (int n = 2; n <= GRAPHS_PER_SEQ + 4; n++) {
        const struct graph_key k = one(0, n);
        graph_cache_run(&c, &k, ops, &f);
        graph_cache_run(&c, &kept, ops, &f);
    }
    cr_assert_eq(f.captured, 2, "the busy shape was never replaced");
    const struct graph_key first_oneoff = one(0, 2);
    const int eager = f.eager;
    graph_cache_run(&c, &first_oneoff, ops, &f);
    cr_assert_eq(f.eager, eager + 1, "the oldest one-off shape made room: seen afresh");
    graph_cache_free(&c);
}
