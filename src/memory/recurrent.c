/* recurrent.c — allocation of recurrent-layer state and its snapshots, and the copy regions
 * that restore or copy a sequence's state on the device. */
#include "memory/recurrent.h"
#include "memory/memory.h"

#include <stdlib.h>

/* a * b * c floats in bytes, or SIZE_MAX (which no allocator grants) when it overflows */
static size_t float_bytes(size_t a, size_t b, size_t c) {
    size_t ab, abc, bytes;
    if (__builtin_mul_overflow(a, b, &ab) || __builtin_mul_overflow(ab, c, &abc) ||
        __builtin_mul_overflow(abc, sizeof(float), &bytes))
        return SIZE_MAX;
    return bytes;
}

int rec_state_init(struct rec_state *r, struct backend *be, int n_layer, int n_seq, int n_keep, int n_ck,
                   size_t conv_elems, struct rec_rule rule) {
    const size_t ssm_elems = (size_t)rule.nv * (size_t)rule.dk * (size_t)rule.dv;
    *r = (struct rec_state){.be = be, .n_layer = n_layer, .n_seq = n_seq, .n_keep = n_keep, .n_slots = COTI_MAX(n_keep, 1),
                            .n_ck = COTI_MAX(n_ck, 1), .conv_elems = conv_elems, .ssm_elems = ssm_elems,
                            .pend_elems = gdn_pend_floats(rule.nv, rule.dk, rule.dv), .rule = rule,
                            .pending = be->gdn_pending};
    if (!n_layer) return 0;
    r->layers = calloc((size_t)n_layer, sizeof *r->layers);
    r->zero = be->alloc(be, sizeof(float) * (size_t)COTI_MAX(rule.nv, 1));
    r->seq_ids = be->alloc(be, sizeof(int32_t) * (size_t)COTI_MAX(n_seq, 1));
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)COTI_MAX(n_seq, 1));
    if (!r->layers || !r->zero || !r->seq_ids || !ids) {
        free(ids);
        return COTI_E_NOMEM;
    }
    for (int s = 0; s < n_seq; s++) ids[s] = s;
    be->upload(be, r->seq_ids, ids, sizeof(int32_t) * (size_t)n_seq); /* one copy, not one per sequence */
    free(ids);
    const size_t ns = (size_t)n_seq, keep = (size_t)r->n_slots, nck = (size_t)r->n_ck;
    const size_t conv = float_bytes(ns, 1, conv_elems), conv_snap = float_bytes(ns, keep, conv_elems);
    const size_t ssm = float_bytes(ns, 1, ssm_elems), ssm_snap = float_bytes(ns, keep, ssm_elems);
    const size_t conv_ck = float_bytes(ns, nck, conv_elems), ssm_ck = float_bytes(ns, nck, ssm_elems);
    const size_t pend = float_bytes(ns, 1, r->pend_elems), pend_ck = float_bytes(ns, nck, r->pend_elems);
    if (conv == SIZE_MAX || conv_snap == SIZE_MAX || ssm == SIZE_MAX || ssm_snap == SIZE_MAX || conv_ck == SIZE_MAX ||
        ssm_ck == SIZE_MAX || pend == SIZE_MAX || pend_ck == SIZE_MAX)
        return COTI_E_NOMEM;
    for (int il = 0; il < n_layer; il++) {
        struct rec_layer *ly = &r->layers[il];
        /* the conv buffers get one float more: the backends' conv kernels may read a vector
         * past the last state row */
        ly->conv = be->alloc(be, conv + 4);
        ly->ssm = be->alloc(be, ssm);
        ly->pend = be->alloc(be, pend);
        ly->conv_snap = be->alloc(be, conv_snap + 4);
        ly->ssm_snap = be->alloc(be, ssm_snap);
        ly->conv_ck = be->alloc(be, conv_ck);
        ly->ssm_ck = be->alloc(be, ssm_ck);
        ly->pend_ck = be->alloc(be, pend_ck);
        if (!ly->conv || !ly->ssm || !ly->pend || !ly->conv_snap || !ly->ssm_snap || !ly->conv_ck || !ly->ssm_ck ||
            !ly->pend_ck)
            return COTI_E_NOMEM;
    }
    return 0;
}

void rec_state_free(struct rec_state *r) {
    for (int il = 0; r->layers && il < r->n_layer; il++) {
        float *p[] = {r->layers[il].conv,    r->layers[il].ssm,    r->layers[il].pend,
                      r->layers[il].conv_snap, r->layers[il].ssm_snap, r->layers[il].conv_ck,
                      r->layers[il].ssm_ck,  r->layers[il].pend_ck};
        for (size_t i = 0; i < COTI_ARRAY_LEN(p); i++) if (p[i]) r->be->free(r->be, p[i]);
    }
    if (r->zero) r->be->free(r->be, r->zero);
    if (r->seq_ids) r->be->free(r->be, r->seq_ids);
    free(r->layers);
    *r = (struct rec_state){0};
}

void rec_seq_zero(struct rec_state *r, int s) {
    if (!r->n_layer) return;
    /* through a host buffer: a reset is rare (once per request) */
    const size_t n = COTI_MAX(COTI_MAX(r->conv_elems, r->ssm_elems), r->pend_elems);
    float *z = calloc(n ? n : 1, sizeof(float));
    if (!z) return;
    for (int il = 0; il < r->n_layer; il++) {
        r->be->upload(r->be, rec_conv(r, il, s), z, sizeof(float) * r->conv_elems);
        r->be->upload(r->be, rec_ssm(r, il, s), z, sizeof(float) * r->ssm_elems);
        r->be->upload(r->be, rec_pend(r, il, s), z, sizeof(float) * r->pend_elems);
    }
    r->be->sync(r->be);
    free(z);
}

void rec_restore_regions(const struct rec_state *r, int s, bool conv, bool rule, struct mem_regions *g) {
    const size_t cb = sizeof(float) * r->conv_elems, sb = sizeof(float) * r->ssm_elems;
    for (int il = 0; il < r->n_layer; il++) {
        if (conv) mem_regions_add(g, rec_conv(r, il, s), rec_conv_snap(r, il, s), cb, cb);
        if (conv && r->pending) mem_regions_add(g, rec_pend(r, il, s), r->zero, sizeof(float) * (size_t)r->rule.nv, 0);
        if (rule) mem_regions_add(g, rec_ssm(r, il, s), rec_ssm_snap(r, il, s), sb, sb);
    }
}

void rec_copy_regions(const struct rec_state *r, int dst, int src, struct mem_regions *g) {
    const size_t cb = sizeof(float) * r->conv_elems, sb = sizeof(float) * r->ssm_elems, pb = sizeof(float) * r->pend_elems;
    for (int il = 0; il < r->n_layer; il++) {
        mem_regions_add(g, rec_conv(r, il, dst), rec_conv(r, il, src), cb, cb);
        mem_regions_add(g, rec_ssm(r, il, dst), rec_ssm(r, il, src), sb, sb);
        mem_regions_add(g, rec_pend(r, il, dst), rec_pend(r, il, src), pb, pb);
    }
}

static float *rec_pend_ck(const struct rec_state *r, int il, int s, int k) {
    return r->layers[il].pend_ck + ((size_t)s * r->n_ck + (size_t)k) * r->pend_elems;
}

void rec_ck_save_regions(const struct rec_state *r, int s, int k, struct mem_regions *g) {
    const size_t cb = sizeof(float) * r->conv_elems, sb = sizeof(float) * r->ssm_elems, pb = sizeof(float) * r->pend_elems;
    for (int il = 0; il < r->n_layer; il++) {
        mem_regions_add(g, rec_conv_ck(r, il, s, k), rec_conv(r, il, s), cb, cb);
        mem_regions_add(g, rec_ssm_ck(r, il, s, k), rec_ssm(r, il, s), sb, sb);
        mem_regions_add(g, rec_pend_ck(r, il, s, k), rec_pend(r, il, s), pb, pb);
    }
}

void rec_ck_load_regions(const struct rec_state *r, int dst, int src, int k, int kd, struct mem_regions *g) {
    const size_t cb = sizeof(float) * r->conv_elems, sb = sizeof(float) * r->ssm_elems, pb = sizeof(float) * r->pend_elems;
    for (int il = 0; il < r->n_layer; il++) {
        mem_regions_add(g, rec_conv(r, il, dst), rec_conv_ck(r, il, src, k), cb, cb);
        mem_regions_add(g, rec_ssm(r, il, dst), rec_ssm_ck(r, il, src, k), sb, sb);
        mem_regions_add(g, rec_pend(r, il, dst), rec_pend_ck(r, il, src, k), pb, pb);
        if (dst != src || kd != k) {
            mem_regions_add(g, rec_conv_ck(r, il, dst, kd), rec_conv_ck(r, il, src, k), cb, cb);
            mem_regions_add(g, rec_ssm_ck(r, il, dst, kd), rec_ssm_ck(r, il, src, k), sb, sb);
            mem_regions_add(g, rec_pend_ck(r, il, dst, kd), rec_pend_ck(r, il, src, k), pb, pb);
        }
    }
}

/* Apply sequence s's pending rows to its live state, by the backend's own delta rule (a run
 * of no rows applies whatever its record holds and nothing else), so that the state reads as
 * the one the rule would have left. */
static void rec_flush(struct rec_state *r, int s) {
    if (!r->pending) return;
    struct backend *be = r->be;
    for (int il = 0; il < r->n_layer; il++) {
        /* no rows: the inputs are never read, any valid pointer serves */
        float *any = rec_ssm(r, il, s);
        const struct gdn_gates gates = {any, any, any, any, 0, 0};
        const struct state_set st = rec_ssm_set(r, il, r->seq_ids);
        const struct state_run run = {0, 0, s, 0, false};
        be->gdn(be, any, 0, &gates, r->rule.nv, r->rule.nv, r->rule.dk, r->rule.dv, 1e-6f, any, &st, &run, 1);
    }
    be->sync(be);
}

long rec_state_read(struct rec_state *r, int s, float *dst, size_t n) {
    if (s < 0 || s >= r->n_seq) return COTI_E_ARG;
    const size_t need = (size_t)r->n_layer * (r->conv_elems + r->ssm_elems);
    if (n == 0) return (long)need;
    if (n < need) return COTI_E_ARG;
    rec_flush(r, s);
    for (int il = 0; il < r->n_layer; il++) {
        r->be->download(r->be, dst, rec_conv(r, il, s), sizeof(float) * r->conv_elems);
        dst += r->conv_elems;
        r->be->download(r->be, dst, rec_ssm(r, il, s), sizeof(float) * r->ssm_elems);
        dst += r->ssm_elems;
    }
    return (long)need;
}
