/* test_memory.c — the memory layer on the CPU backend: KV layers with shared storage, a
 * sequence copy moving exactly the cells and state the source holds, a rollback restoring the
 * snapshot of the last accepted token, and the rules that refuse a rollback it cannot do. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "memory/memory.h"

#define N_SEQ 3
#define N_CTX 8
#define CONV 5
#define SSM 7
#define KEEP 4

static const struct kv_layer_spec kv_specs[3] = {{2, 4, -1, 0}, {1, 8, -1, 0}, {2, 4, 0, 0}}; /* layer 2 reads layer 0 */
static const struct kv_layer_spec head_spec = {2, 4, -1, 0};

static void mem_make(struct memory *mem, struct backend *be) {
    const struct memory_params p = {.n_seq = N_SEQ, .n_ctx = N_CTX, .n_keep = KEEP, .kv = kv_specs, .n_kv = 3,
                                    .k_type = GGML_TYPE_F16, .v_type = GGML_TYPE_F16, .n_rec = 2, .conv_elems = CONV, .rule = {SSM, 1, 1}, .head_kv = &head_spec,
                                    .n_head_kv = 1};
    cr_assert_eq(memory_init(mem, be, &p), 0);
}

/* Fill n floats at dst (backend memory) with values that say where they are. */
static void fill(struct backend *be, void *dst, size_t n, float tag) {
    float *h = malloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++) h[i] = tag + (float)i * 0.001f;
    be->upload(be, dst, h, n * sizeof *h);
    free(h);
}

static float at(struct backend *be, const void *src, size_t i) {
    float v;
    be->download(be, &v, (const float *)src + i, sizeof v);
    return v;
}

Test(memory, shared_layers_have_no_storage_of_their_own) {
    struct backend *be = backend_cpu_init(1, QUANT_CPU_REF);
    struct memory mem;
    mem_make(&mem, be);
    cr_assert(mem.kv.owns[0] && mem.kv.owns[1] && !mem.kv.owns[2]);
    cr_assert_eq(mem.kv.layers[2].k, mem.kv.layers[0].k);
    cr_assert_eq(mem.kv.layers[1].k_row_bytes, 8 * sizeof(uint16_t));
    struct kv_view ro = kv_view_read_only(&mem.kv, 1);
    cr_assert(ro.read_only && !mem.kv.layers[1].read_only && ro.k == mem.kv.layers[1].k);
    memory_free(&mem);
    backend_free(be);
}

Test(memory, copy_moves_the_cells_the_source_holds) {
    struct backend *be = backend_cpu_init(1, QUANT_CPU_REF);
    struct memory mem;
    mem_make(&mem, be);
    const struct kv_view *l1 = &mem.kv.layers[1];
    const size_t row = l1->k_row_bytes / sizeof(float); /* f16 rows seen as floats: any bytes do */
    fill(be, l1->k, N_SEQ * N_CTX * row, 1.0f);
    fill(be, rec_ssm(&mem.rec, 1, 0), SSM, 2.0f);
    fill(be, rec_ssm(&mem.rec, 1, 2), SSM, 3.0f);
    memory_note_run(&mem, 0, 5, false, false);
    mem.head_len[0] = 4;
    cr_assert_eq(memory_seq_copy(&mem, 2, 0), 0);
    cr_assert_eq(mem.seq_len[2], 5);
    cr_assert_eq(mem.head_len[2], 4);
    const size_t d0 = (size_t)kv_cells_at(&mem.kv.full, 2, 0) * row, s0 = (size_t)kv_cells_at(&mem.kv.full, 0, 0) * row;
    cr_assert_eq(at(be, l1->k, d0 + 5 * row - 1), at(be, l1->k, s0 + 5 * row - 1), "the last held cell is copied");
    cr_assert_neq(at(be, l1->k, d0 + 5 * row), at(be, l1->k, s0 + 5 * row), "cells past the source's length are not");
    for (size_t i = 0; i < SSM; i++) cr_assert_eq(at(be, rec_ssm(&mem.rec, 1, 2), i), at(be, rec_ssm(&mem.rec, 1, 0), i));
    cr_assert_eq(memory_seq_copy(&mem, 2, N_SEQ), COTI_E_ARG);
    memory_free(&mem);
    backend_free(be);
}

Test(memory, rollback_restores_the_snapshot_of_the_last_kept_token) {
    struct backend *be = backend_cpu_init(1, QUANT_CPU_REF);
    struct memory mem;
    mem_make(&mem, be);
    const int s = 1;
    for (int il = 0; il < 2; il++) {
        fill(be, rec_conv(&mem.rec, il, s), CONV, 9.0f);
        for (int k = 0; k < KEEP; k++) fill(be, rec_conv_snap(&mem.rec, il, s) + (size_t)k * CONV, CONV, 10.0f * (float)(k + 1));
        for (int k = 0; k < KEEP; k++) fill(be, rec_ssm_snap(&mem.rec, il, s) + (size_t)k * SSM, SSM, 100.0f * (float)(k + 1));
    }
    memory_note_run(&mem, s, 3, false, false);
    memory_note_run(&mem, s, 4, true, false); /* a verify of 4 rows on top of 3 positions */
    mem.head_len[s] = 7;
    cr_assert_eq(memory_seq_rollback(&mem, s, 2), 0); /* keep rows 0 and 1: the state after row 1 */
    cr_assert_eq(mem.seq_len[s], 5);
    cr_assert_eq(mem.head_len[s], 6, "the head keeps at most the pending token's row past the trunk");
    for (int il = 0; il < 2; il++) {
        cr_assert_eq(at(be, rec_conv(&mem.rec, il, s), 0), 20.0f);
        cr_assert_eq(at(be, rec_ssm(&mem.rec, il, s), SSM - 1), at(be, rec_ssm_snap(&mem.rec, il, s), 2 * SSM - 1));
    }
    cr_assert_eq(memory_seq_rollback(&mem, s, 1), COTI_E_RANGE, "the run's states are spent");
    /* dropping only the last row (the CPU leaves it pending): the conv state after row 2 comes
     * back, the delta state after row 2 is live already and stays, the pending row goes */
    cr_assert(mem.rec.pending);
    for (int il = 0; il < 2; il++) {
        fill(be, rec_ssm(&mem.rec, il, s), SSM, 7.0f);
        fill(be, rec_pend(&mem.rec, il, s), SSM, 1.0f); /* the flags of the SSM heads */
    }
    memory_note_run(&mem, s, 4, true, false);
    cr_assert_eq(memory_seq_rollback(&mem, s, 1), 0);
    for (int il = 0; il < 2; il++) {
        cr_assert_eq(at(be, rec_conv(&mem.rec, il, s), 0), 30.0f);
        cr_assert_eq(at(be, rec_ssm(&mem.rec, il, s), 0), 7.0f);
        for (int h = 0; h < SSM; h++) cr_assert_eq(at(be, rec_pend(&mem.rec, il, s), h), 0.0f);
    }
    memory_note_run(&mem, s, 4, true, false);
    cr_assert_eq(memory_seq_rollback(&mem, s, 4), COTI_E_RANGE, "at least the run's first token stays");
    cr_assert_eq(memory_seq_rollback(&mem, s, 0), 0);
    memory_seq_reset(&mem, s);
    cr_assert_eq(mem.seq_len[s], 0);
    cr_assert_eq(at(be, rec_conv(&mem.rec, 0, s), 0), 0.0f, "a reset sequence starts from zeros");
    memory_free(&mem);
    backend_free(be);
}

/* A sliding-window layer of window 2 with 4 rows per forward and runs of up to 6 kept keeps a
 * ring of 1 + 6 positions (+ 2 cells of second stores) per sequence, in a block rounded up to
 * KV_BLOCK_ALIGN cells; the full layer keeps 64. A rollback deeper than the ring was sized for is
 * refused; a copy moves the whole ring. */
Test(memory, window_ring_bounds_its_cells_and_its_rollbacks) {
    struct backend *be = backend_cpu_init(1, QUANT_CPU_REF);
    const struct kv_layer_spec specs[2] = {{1, 4, -1, 2}, {1, 4, -1, 0}};
    const struct memory_params p = {.n_seq = 2, .n_ctx = 64, .n_keep = 6, .n_batch = 4, .kv = specs, .n_kv = 2, .k_type = GGML_TYPE_F16, .v_type = GGML_TYPE_F16};
    struct memory mem;
    cr_assert_eq(memory_init(&mem, be, &p), 0);
    const struct kv_cells *w = &mem.kv.win;
    cr_assert(w->ring == 7 && w->block == KV_BLOCK_ALIGN && w->window == 2 && mem.kv.full.block == 64 && !mem.kv.full.ring);
    /* position 15 of sequence 1: ring slot 1; only slot 0 (< window - 1) is stored twice */
    const int b = KV_BLOCK_ALIGN;
    cr_assert_eq(kv_cells_at(w, 1, 15), b + 1);
    cr_assert_eq(kv_cells_second(w, 1, 15), b + b - 1, "no second store: the block's last cell");
    cr_assert_eq(kv_cells_second(w, 1, 14), b + 7, "slot 0: stored again past the ring");
    const size_t blk = (size_t)b * mem.kv.layers[0].k_row_bytes / sizeof(float); /* a sequence's block, in floats */
    fill(be, mem.kv.layers[0].k, 2 * blk, 1.0f);
    mem.seq_len[0] = 20;
    cr_assert_eq(memory_seq_copy(&mem, 1, 0), 0);
    cr_assert_eq(at(be, mem.kv.layers[0].k, blk + blk - 1), at(be, mem.kv.layers[0].k, blk - 1), "the ring's last cell is copied");
    mem.seq_len[0] = 27;
    memory_note_run(&mem, 0, 7, true, false);
    cr_assert_eq(memory_seq_rollback(&mem, 0, 6), 0);
    memory_note_run(&mem, 0, 8, true, false);
    cr_assert_eq(memory_seq_rollback(&mem, 0, 7), COTI_E_RANGE, "7 positions: past what the ring keeps");
    memory_free(&mem);
    backend_free(be);
}

/* A cache is sized whole before anything is allocated: one that exceeds what the backend says
 * it has free is refused (COTI_E_NOMEM, its size noted) without a single allocation; with room
 * it allocates K and V of each own layer in their types' bytes. */
static size_t room;
static int n_allocs;
static size_t fake_available(struct backend *be) { return room; }
static void *counting_alloc(struct backend *be, size_t bytes) {
    n_allocs++;
    return malloc(bytes ? bytes : 1);
}
static void plain_free(struct backend *be, void *p) { free(p); }

Test(memory, a_cache_that_does_not_fit_is_refused_before_allocating) {
    struct backend *cpu = backend_cpu_init(1, QUANT_CPU_REF);
    struct backend fake = *cpu;
    fake.mem_available = fake_available;
    fake.alloc = counting_alloc;
    fake.free = plain_free;
    /* layers 0 and 1 own storage (2 heads of 32, 1 of 64), layer 2 reads layer 0 */
    static const struct kv_layer_spec specs[3] = {{2, 32, -1, 0}, {1, 64, -1, 0}, {2, 32, 0, 0}};
    const size_t k_bytes = 2 * 64 * (34 + 34 + 34 * 2), v_bytes = 2 * 64 * (18 * 2 + 18 * 2); /* q8_0 K, q4_0 V */
    struct kv_cache kv;
    room = k_bytes + v_bytes - 1;
    n_allocs = 0;
    cr_assert_eq(kv_cache_init(&kv, &fake, specs, 3, 2, 64, 4, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0), COTI_E_NOMEM);
    cr_assert_eq(kv.bytes, k_bytes + v_bytes, "the size it needed: %zu", kv.bytes);
    cr_assert_eq(n_allocs, 0, "nothing was allocated");
    kv_cache_free(&kv);
    room = k_bytes + v_bytes;
    cr_assert_eq(kv_cache_init(&kv, &fake, specs, 3, 2, 64, 4, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0), 0);
    cr_assert_eq(n_allocs, 4, "K and V of the two layers with storage");
    size_t k, v;
    kv_cache_bytes_per_seq(&kv, &k, &v);
    cr_assert_eq(k * 2, k_bytes);
    cr_assert_eq(v * 2, v_bytes);
    cr_assert_eq(kv.layers[2].k, kv.layers[0].k);
    kv_cache_free(&kv);
    backend_free(cpu);
}

/* Every sequence's block starts on a multiple of KV_BLOCK_ALIGN cells, full and window layers
 * alike, whatever n_ctx, the window and the rows per forward (a kernel tiling the cache on a grid
 * counted from cell 0 then splits every sequence alike); what a row may attend stays n_ctx or the
 * window. */
Test(memory, blocks_start_on_the_alignment) {
    struct backend *be = backend_cpu_init(1, QUANT_CPU_REF);
    const struct kv_layer_spec specs[2] = {{1, 4, -1, 128}, {1, 4, -1, 0}};
    struct kv_cache kv;
    /* gemma4's window 128 with 512 rows a forward: 767 cells a ring block before rounding */
    cr_assert_eq(kv_cache_init(&kv, be, specs, 2, 4, 1000, 512, GGML_TYPE_F16, GGML_TYPE_F16), 0);
    cr_assert_eq(kv.win.ring, 127 + 512);
    cr_assert_eq(kv.win.block, 768);
    cr_assert_eq(kv.full.block, 1024);
    for (int s = 0; s < 4; s++) {
        cr_assert_eq(kv_cells_at(&kv.win, s, 0) % KV_BLOCK_ALIGN, 0, "window block of sequence %d", s);
        cr_assert_eq(kv_cells_at(&kv.full, s, 0) % KV_BLOCK_ALIGN, 0, "full block of sequence %d", s);
    }
    cr_assert_eq(kv.layers[0].max_rows, 128);
    cr_assert_eq(kv.layers[1].max_rows, 1000);
    kv_cache_free(&kv);
    backend_free(be);
}
