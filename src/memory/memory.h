/* memory.h — a model's per-sequence memory and its policy: how many positions each sequence
 * holds, the trunk's KV cache and recurrent state, a draft head's own KV cache (NextN), and the
 * operations a server and the speculative driver need on a sequence: reset, roll back the last
 * forward's rejected tokens, copy onto another sequence. Architectures describe their layers;
 * the rules live here once. */
#ifndef COTI_MEMORY_H
#define COTI_MEMORY_H

#include "memory/kv.h"
#include "memory/recurrent.h"

/* A list of device-to-device copies done in one backend copy_n (or copy_n_at). */
struct mem_regions {
    void **dst;
    const void **src;
    size_t *step, *bytes;
    int n, cap;
};

void mem_regions_add(struct mem_regions *g, void *dst, const void *src, size_t bytes, size_t step);

struct memory_params {
    int n_seq, n_ctx;
    int n_keep;                  /* longest run whose per-token states a forward may keep */
    int n_batch;                 /* most rows one forward writes (sliding-window rings: kv.h) */
    const struct kv_layer_spec *kv;      /* trunk attention layers */
    int n_kv;
    int n_rec;                   /* trunk recurrent layers */
    size_t conv_elems, ssm_elems;
    const struct kv_layer_spec *head_kv; /* a draft head's own attention layers, or NULL */
    int n_head_kv;
    enum ggml_type k_type, v_type;       /* the KV caches' element types (kv_type_ok) */
};

struct memory {
    struct backend *be;
    int n_seq, n_ctx;
    int n_rows;                  /* a rollback drops at most this many (sliding-window rings) */
    int32_t *seq_len;            /* host: positions the trunk holds per sequence */
    struct kv_cache kv;
    struct rec_state rec;
    struct kv_cache head;        /* the draft head's cache (n_layer 0 when none) */
    int32_t *head_len;           /* host: positions it holds per sequence, never beyond seq_len */
    /* per sequence, about its run in the last forward: tokens, whether their states were kept,
     * whether a greedy verify already restored the accepted prefix on the device */
    int32_t *last_run_len;
    bool *last_run_kept, *last_run_restored;
    struct mem_regions rg;       /* scratch for one sequence's regions */
};

int memory_init(struct memory *mem, struct backend *be, const struct memory_params *p);
void memory_free(struct memory *mem);
/* Device bytes one sequence holds: its KV cells (trunk and draft head, shared layers once) and
 * its recurrent state with the per-token snapshots. */
size_t memory_bytes_per_seq(const struct memory *mem);
/* The K and V parts of it (trunk and draft head caches), for the load summary. */
void memory_kv_bytes_per_seq(const struct memory *mem, size_t *k_bytes, size_t *v_bytes);

/* The trunk ran `len` tokens of sequence s (kept: with per-token states; restored: a greedy
 * verify whose accepted prefix the device already made live). */
void memory_note_run(struct memory *mem, int s, int len, bool kept, bool restored);
/* Restore regions of sequence s (rec_restore_regions) in mem->rg, for the device-side restore
 * of a greedy verify: returns their count. */
int memory_restore_regions(struct memory *mem, int s);

void memory_seq_reset(struct memory *mem, int s);
int memory_seq_rollback(struct memory *mem, int s, int n_drop);
int memory_seq_copy(struct memory *mem, int dst, int src);
void memory_head_truncate(struct memory *mem, int s, int n);

#endif
