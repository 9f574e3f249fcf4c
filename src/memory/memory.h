/* memory.h — a model's per-sequence memory and its policy: how many positions each sequence
 * holds, the trunk's KV cache and recurrent state, a draft head's own KV cache (NextN), and the
 * operations a server and the speculative driver need on a sequence: reset, roll back the last
 * forward's rejected tokens, copy onto another sequence, checkpoints to resume a prefix from
 * (prompt reuse across requests and slots). Architectures describe their layers;
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

/* Checkpoints per sequence: positions a sequence can be resumed from later (by itself or by
 * another sequence whose prompt starts the same way), each with the recurrent state there and
 * the post-norm hidden row of the position before it (what a drafter resumes from). */
#define MEM_N_CHECKPOINTS 4

struct memory_params {
    int n_seq, n_ctx;
    int n_embd;                  /* a checkpoint's hidden row (set by the engine) */
    int n_keep;                  /* longest run whose per-token states a forward may keep */
    int n_batch;                 /* most rows one forward writes (sliding-window rings: kv.h) */
    const struct kv_layer_spec *kv;      /* trunk attention layers */
    int n_kv;
    int n_rec;                   /* trunk recurrent layers */
    size_t conv_elems;
    struct rec_rule rule;        /* their delta rule's heads and sizes */
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
    int32_t *head_len;           /* host: positions it holds per sequence: up to the pending token's
                                    row (seq_len + 1), more only during a drafter's chain */
    /* per sequence, about its run in the last forward: tokens, whether their states were kept,
     * whether a greedy verify already restored the accepted prefix on the device */
    int32_t *last_run_len;
    bool *last_run_kept, *last_run_restored;
    struct mem_regions rg;       /* scratch for one sequence's regions */
    /* checkpoints, [n_seq][MEM_N_CHECKPOINTS] each: the position (-1: empty), an age for
     * replacement, whether the hidden row is known; the hidden rows on the backend */
    int n_embd;
    int32_t *ck_pos;
    uint64_t *ck_age, ck_clock;
    bool *ck_has_hidden;
    float *ck_hidden;
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
/* The device-side rollback of a greedy verify of n rows of sequence s, queued on the backend:
 * with a = *accepted (backend memory) the state after row a becomes live (nothing to do when
 * a = n - 1), so the host need not read the count first. */
void memory_restore_at(struct memory *mem, int s, const int32_t *accepted, int n);

void memory_seq_reset(struct memory *mem, int s);
int memory_seq_rollback(struct memory *mem, int s, int n_drop);
int memory_seq_copy(struct memory *mem, int dst, int src);
void memory_head_truncate(struct memory *mem, int s, int n);
/* The draft head of s takes positions [head_len, n) as held without computing them (n <=
 * seq_len): their cells keep whatever they hold, which the head then attends to. A drafter may
 * do this to stop following a sequence it does not draft for; its drafts are proposals, so
 * stale cells cost acceptance, never correctness. */
void memory_head_skip(struct memory *mem, int s, int n);

/* Remember sequence s's state at its current length (a checkpoint there replaces an older one at
 * the same length, else the oldest goes); hidden: backend memory of the post-norm hidden row of
 * its last position, or NULL when not known. */
void memory_checkpoint(struct memory *mem, int s, const float *hidden);
/* A position q <= p that another sequence (or src itself) can resume src's first q positions
 * from: src's length when it is <= p, else one of its checkpoints. Writes the candidates, longest
 * first, into q[0, max) and their hidden rows (backend memory, or NULL when not known) into
 * hidden[]; returns their count. A sliding-window ring must still hold the window before q. */
int memory_resume_points(const struct memory *mem, int src, int p, int *q, const float **hidden, int max);
/* Make dst hold the first q positions of src, q one of its resume points: the KV cells (trunk and
 * draft head; the head keeps what src's head held of them), the recurrent state of the
 * checkpoint at q (or src's live state when q is its length); dst keeps that one checkpoint.
 * dst == src goes back to the checkpoint. Returns 0 or COTI_E_ARG / COTI_E_RANGE. */
int memory_seq_resume(struct memory *mem, int dst, int src, int q);

#endif
