/* equiv.h — the losslessness gate's arithmetic: compare two next-token distributions given
 * as top-k (id, logprob) lists (spec-on verify row vs plain decode row at one position). */
#ifndef COTI_EQUIV_H
#define COTI_EQUIV_H

#include <stdbool.h>
#include <stdint.h>

#define EQUIV_MAX_TOP 64

struct equiv_row {
    int n;
    int32_t id[EQUIV_MAX_TOP];
    float logprob[EQUIV_MAX_TOP];   /* descending */
};

struct equiv_stats {
    long n_rows, n_agree, n_near_tie, n_real;
    double sum_d_top1, max_d_top1;  /* |Δ logprob of the reference top-1 token| */
    long first_real_pos;            /* -1 if none */
};

/* Top-k of a logits row as log-softmax values (f64 normalisation). k <= EQUIV_MAX_TOP. */
void equiv_row_from_logits(const float *logits, int n_vocab, int k, struct equiv_row *out);
/* Add one position: ref is the plain row, got the speculative one. A differing argmax is a
 * near-tie when the two candidates are within tie logprob of each other in either row;
 * otherwise it is a real disagreement. */
void equiv_add(struct equiv_stats *st, long pos, const struct equiv_row *ref, const struct equiv_row *got, float tie);
void equiv_stats_init(struct equiv_stats *st);

#endif
