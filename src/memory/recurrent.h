/* recurrent.h — the state of recurrent layers (a causal conv's last k-1 inputs and a
 * delta-net's matrix state) per sequence, and per-token snapshots of it that make a verify
 * batch's rejected tokens undoable: after a kept run of r tokens, the state after token
 * i < min(r-1, n_keep) is in the snapshot slots, the state after the last token is live.
 * A rollback copies a snapshot back into the live state, on the device. On a backend with
 * gdn_pending the delta rule's last row of a kept run stays pending (backend.h state_run) in a
 * small record per sequence and layer: its live state is then the state after token r-2, the
 * snapshots cover i < min(r-2, n_keep), and a rollback of the last row only drops the record. */
#ifndef COTI_RECURRENT_H
#define COTI_RECURRENT_H

#include "backend.h"

struct rec_layer {
    float *conv, *ssm, *pend;    /* live: [n_seq][conv_elems], [n_seq][ssm_elems], [n_seq][pend_elems] */
    float *conv_snap, *ssm_snap; /* [n_seq][n_slots][...] */
    float *conv_ck, *ssm_ck, *pend_ck; /* checkpoints (memory.h): [n_seq][n_ck][...] */
};

/* The delta rule's heads and sizes (a pending row's record, and what applying it needs). */
struct rec_rule { int nv, dk, dv; };

struct rec_state {
    struct backend *be;
    int n_layer, n_seq;
    int n_keep;                  /* longest run whose per-token states a forward may keep */
    int n_slots;                 /* snapshot slots per sequence: max(n_keep, 1) */
    int n_ck;                    /* checkpoint slots per sequence */
    size_t conv_elems, ssm_elems, pend_elems; /* per sequence and layer */
    struct rec_rule rule;
    bool pending;                /* the backend leaves kept runs' last rows pending (gdn_pending) */
    float *zero;                 /* a float 0 on the backend: what drops a pending row */
    int32_t *seq_ids;            /* 0 .. n_seq-1 on the backend: state_set.seq of one sequence's run */
    struct rec_layer *layers;
};

/* ssm_elems is rule.nv · rule.dk · rule.dv. */
int rec_state_init(struct rec_state *r, struct backend *be, int n_layer, int n_seq, int n_keep, int n_ck,
                   size_t conv_elems, struct rec_rule rule);
void rec_state_free(struct rec_state *r);

static inline float *rec_conv(const struct rec_state *r, int il, int s) {
    return r->layers[il].conv + (size_t)s * r->conv_elems;
}
static inline float *rec_ssm(const struct rec_state *r, int il, int s) {
    return r->layers[il].ssm + (size_t)s * r->ssm_elems;
}
static inline float *rec_pend(const struct rec_state *r, int il, int s) {
    return r->layers[il].pend + (size_t)s * r->pend_elems;
}
/* Where the snapshots of sequence s start (slot i is i·elems further). */
static inline float *rec_conv_snap(const struct rec_state *r, int il, int s) {
    return r->layers[il].conv_snap + (size_t)s * r->n_slots * r->conv_elems;
}
static inline float *rec_ssm_snap(const struct rec_state *r, int il, int s) {
    return r->layers[il].ssm_snap + (size_t)s * r->n_slots * r->ssm_elems;
}

/* Layer il's conv or delta-rule states of every sequence (backend.h struct state_set), the
 * runs' sequences at seq; the rule's pending-row records where the backend keeps them. */
static inline struct state_set rec_conv_set(const struct rec_state *r, int il, const int32_t *seq) {
    return (struct state_set){r->layers[il].conv, r->layers[il].conv_snap, NULL, r->conv_elems,
                              (size_t)r->n_slots * r->conv_elems, 0, seq};
}
static inline struct state_set rec_ssm_set(const struct rec_state *r, int il, const int32_t *seq) {
    return (struct state_set){r->layers[il].ssm, r->layers[il].ssm_snap, r->pending ? r->layers[il].pend : NULL,
                              r->ssm_elems, (size_t)r->n_slots * r->ssm_elems, r->pend_elems, seq};
}

/* Zero sequence s's live state (a new sequence starts from zeros). Waits for the device. */
void rec_seq_zero(struct rec_state *r, int s);

struct mem_regions;
/* Regions live <- snapshot slot 0 of sequence s, with step[i] the bytes from one slot to the
 * next: a restore to slot k adds k·step[i] to every source. conv: the conv states (and, with
 * pending rows, the regions that drop them: step 0); rule: the delta-rule states. A kept run of
 * r rows restores slot k < r - 1 of the conv part and, with pending rows, k < r - 2 of the rule
 * part (the state after row r - 2 is live then), else k < r - 1 of both. */
void rec_restore_regions(const struct rec_state *r, int s, bool conv, bool rule, struct mem_regions *g);
/* Regions that copy sequence src's live state onto dst. */
void rec_copy_regions(const struct rec_state *r, int dst, int src, struct mem_regions *g);
/* Checkpoint slot k of sequence s: its conv and delta state of layer il. */
static inline float *rec_conv_ck(const struct rec_state *r, int il, int s, int k) {
    return r->layers[il].conv_ck + ((size_t)s * r->n_ck + (size_t)k) * r->conv_elems;
}
static inline float *rec_ssm_ck(const struct rec_state *r, int il, int s, int k) {
    return r->layers[il].ssm_ck + ((size_t)s * r->n_ck + (size_t)k) * r->ssm_elems;
}
/* Regions live state of s -> its checkpoint slot k (save), or the reverse (load), or checkpoint
 * slot k of src -> live state of dst and its slot kd (load_to). */
void rec_ck_save_regions(const struct rec_state *r, int s, int k, struct mem_regions *g);
void rec_ck_load_regions(const struct rec_state *r, int dst, int src, int k, int kd, struct mem_regions *g);
/* Sequence s's live state, layer by layer (conv then delta state, a pending row applied
 * first), to host dst of n floats; returns the floats it needs (n = 0 asks) or COTI_E_ARG. */
long rec_state_read(struct rec_state *r, int s, float *dst, size_t n);

#endif
