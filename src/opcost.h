/* opcost.h — a backend that forwards every op to another one, except one family of ops it is
 * told to skip, and counts the weight bytes its matmuls read when told to. `coti bench --op-cost` times decode with each family left out in turn: the time
 * saved is that family's cost on the step's critical path. On a GPU, where a small kernel costs
 * mostly its dependent launch on an idle device, this says more than per-kernel timings do.
 * What the model computes while a family is skipped is garbage, by design. */
#ifndef COTI_OPCOST_H
#define COTI_OPCOST_H

#include "backend.h"

enum opcost_family {
    OPCOST_MATMUL_NARROW,   /* matmuls with at most n_in outputs (attention / ssm out, FFN down) */
    OPCOST_MATMUL_WIDE,     /* more: input projections, FFN gate + up */
    OPCOST_MATMUL_HEAD,     /* at least 16 n_in outputs: the LM head */
    OPCOST_NORMS,           /* rmsnorm, rmsnorm_gated, add_rmsnorm */
    OPCOST_ATTENTION,
    OPCOST_ROPE_KV,         /* rope, the KV store, the attention output gate */
    OPCOST_DELTANET,        /* conv, gates, the delta rule */
    OPCOST_ELEMENTWISE,     /* add, swiglu */
    OPCOST_EMBED,           /* get_rows */
    OPCOST_ARGMAX,          /* argmax, greedy acceptance */
    OPCOST_MOE,             /* routing, the routed experts' matmuls and their sum */
    OPCOST_COUNT
};

const char *opcost_family_name(int family);
/* A backend forwarding to inner, which it owns from now on (destroy frees both). */
struct backend *opcost_wrap(struct backend *inner);
/* Skip the ops of `family` from now on (-1: skip nothing). Graphs recorded under another
 * choice are refused as stale, so a model records them again. */
void opcost_skip(struct backend *be, int family);

/* Weight bytes the matmuls read (each routed expert once per matmul_id call, whatever number
 * of slots chose it: what an engine that reads nothing twice must read), the routed experts'
 * calls and distinct experts over them, and each family's op calls (skipped ones too). */
struct opcost_counts {
    double weight_bytes;
    long expert_calls, experts_read;
    long op_calls[OPCOST_COUNT];
};
/* Counting on: the counts start from zero, and no graphs are recorded or replayed (ops run one
 * by one; matmul_id reads its ids back, a wait). Off: graphs again. */
void opcost_count(struct backend *be, bool on);
struct opcost_counts opcost_counted(struct backend *be);

#endif
