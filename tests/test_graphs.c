/* test_graphs.c — the graph cache over a fake backend that counts what it is asked: a shape is
 * run eagerly the first time, recorded the second and replayed after; every field of the key
 * (runs of several sequences included) tells shapes apart; a stale graph is recorded again, over
 * itself where the backend can rewrite it; the least recently used slot of a table makes room,
 * and one sequence's shapes never push out another's or the shared table's; several
 * sequences' shape is one graph whichever sequences run it, one sequence's is that sequence's. */
#include <criterion/criterion.h>

#include "engine/graphs.h"

struct fake {
    struct backend be;
    int eager, captured, launched, freed, next_graph;
    bool capturing, stale;
    bool rewrites;               /* capture_end rewrites the graph it is offered */
    bool fail;                   /* the next capture fails */
};

static struct fake *fake_of(struct backend *be) { return (struct fake *)be; }
static void f_capture_begin(struct backend *be) { fake_of(be)->capturing = true; }
static void *f_capture_end(struct backend *be, void *reuse) {
    struct fake *f = fake_of(be);
    f->capturing = false;
    if (f->fail) {
        f->fail = false;
        return NULL;
    }
    if (reuse && f->rewrites) return reuse;
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
    f.rewrites = true;
    f.stale = true;
    graph_cache_run(&c, &k, ops, &f);
    cr_assert_eq(f.captured, 3);
    cr_assert_eq(f.freed, 1, "a backend that rewrites it keeps the stale graph");
    cr_assert_eq(c.stats.updated, 1);
    cr_assert_eq(c.stats.recorded, 2);
    graph_cache_run(&c, &k, ops, &f);
    cr_assert_eq(c.stats.replayed, 6, "then replays it");
    graph_cache_free(&c);
    cr_assert_eq(f.freed, 2);
}

Test(graphs, every_key_field_tells_shapes_apart) {
    struct fake f = fake_make();
    struct graph_cache c;
    cr_assert_eq(graph_cache_init(&c, &f.be, 4), 0);
    /* two runs of 2 rows each: sequences (0, 1) */
    struct graph_key base = {.n = 4, .n_runs = 2, .runs = {{0, 2}, {1, 2}}, .want = 0xF};
    struct graph_key v[7];
    for (int i = 0; i < 7; i++) v[i] = base;
    v[1].runs[0].len = 1, v[1].runs[1].len = 3;              /* the same rows, split otherwise */
    v[2].n = 5, v[2].runs[1].len = 3;                        /* a row more */
    v[3].want = 0x5;
    v[4].keep = true;
    v[5].prompt = true;
    v[6].pass = 1;
    struct graph_key p = base;
    p.ptr[3] = &c;
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 7; i++) graph_cache_run(&c, &v[i], ops, &f);
        graph_cache_run(&c, &p, ops, &f);
    }
    cr_assert_eq(f.eager, 8, "each shape ran eagerly once");
    cr_assert_eq(f.captured, 8, "each was recorded once");
    cr_assert_eq(f.launched, 16);
    /* runs past n_runs are not part of the key */
    struct graph_key w = base;
    w.runs[5] = (struct graph_run){3, 7};
    graph_cache_run(&c, &w, ops, &f);
    cr_assert_eq(f.launched, 17, "the same shape as base");
    graph_cache_free(&c);
}

Test(graphs, several_sequences_share_a_graph_one_sequence_keeps_its_own) {
    struct fake f = fake_make();
    struct graph_cache c;
    cr_assert_eq(graph_cache_init(&c, &f.be, 8), 0);
    const struct graph_key a = {.n = 4, .n_runs = 2, .runs = {{0, 2}, {1, 2}}, .want = 0xF};
    struct graph_key b = a, swapped = a, other = a;
    b.runs[0].seq = 4, b.runs[1].seq = 5;                    /* the same shape on other slots */
    swapped.runs[0].seq = 1, swapped.runs[1].seq = 0;        /* the same slots in the other order */
    other.runs[0].len = 1, other.runs[1].len = 3;            /* another shape */
    graph_cache_run(&c, &a, ops, &f);
    graph_cache_run(&c, &b, ops, &f);
    cr_assert_eq(f.eager, 1, "a shape's second sighting is recorded, whichever slots run it");
    cr_assert_eq(f.captured, 1);
    graph_cache_run(&c, &a, ops, &f);
    graph_cache_run(&c, &swapped, ops, &f);
    graph_cache_run(&c, &b, ops, &f);
    cr_assert_eq(f.captured, 1, "and replayed on any slots from then on");
    cr_assert_eq(c.stats.replayed, 3);
    graph_cache_run(&c, &other, ops, &f);
    cr_assert_eq(f.eager, 2, "another shape is new");

    const struct graph_key s2 = one(2, 3), s5 = one(5, 3);
    graph_cache_run(&c, &s2, ops, &f);
    graph_cache_run(&c, &s2, ops, &f);
    cr_assert_eq(f.captured, 2);
    graph_cache_run(&c, &s5, ops, &f);
    cr_assert_eq(f.eager, 4, "one sequence's graph is that sequence's");
    graph_cache_run(&c, &s5, ops, &f);
    cr_assert_eq(f.captured, 3);
    graph_cache_run(&c, &s2, ops, &f);
    cr_assert_eq(c.stats.replayed, 4);
    /* a recording that fails: the ops run op by op, and the next sighting records */
    const struct graph_key s6 = one(6, 2);
    graph_cache_run(&c, &s6, ops, &f);
    f.fail = true;
    graph_cache_run(&c, &s6, ops, &f);
    cr_assert_eq(f.eager, 6);
    graph_cache_run(&c, &s6, ops, &f);
    cr_assert_eq(c.stats.recorded, 4);
    graph_cache_run(&c, &s6, ops, &f);
    cr_assert_eq(c.stats.replayed, 5);
    graph_cache_free(&c);
    cr_assert_eq(f.freed, 4);
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
