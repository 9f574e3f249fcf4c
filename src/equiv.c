/* equiv.c — see equiv.h. */
#include "equiv.h"

#include <math.h>
#include <string.h>

void equiv_stats_init(struct equiv_stats *st) {
    memset(st, 0, sizeof *st);
    st->first_real_pos = -1;
}

void equiv_row_from_logits(const float *x, int n_vocab, int k, struct equiv_row *out) {
    if (k > EQUIV_MAX_TOP) k = EQUIV_MAX_TOP;
    if (k > n_vocab) k = n_vocab;
    double mx = -INFINITY;
    for (int i = 0; i < n_vocab; i++) if (x[i] > mx) mx = x[i];
    double sum = 0.0;
    for (int i = 0; i < n_vocab; i++) sum += exp((double)x[i] - mx);
    const double lse = mx + log(sum);
    int n = 0;
    for (int i = 0; i < n_vocab; i++) {
        if (n < k) out->id[n++] = i;
        else if (x[i] > x[out->id[n - 1]]) out->id[n - 1] = i;
        else continue;
        for (int j = n - 1; j > 0 && x[out->id[j]] > x[out->id[j - 1]]; j--) {
            int32_t t = out->id[j]; out->id[j] = out->id[j - 1]; out->id[j - 1] = t;
        }
    }
    out->n = n;
    for (int j = 0; j < n; j++) out->logprob[j] = (float)(x[out->id[j]] - lse);
}

/* logprob of id in row, or -inf when it is not in the row's top-k */
static float lookup(const struct equiv_row *r, int32_t id) {
    for (int j = 0; j < r->n; j++) if (r->id[j] == id) return r->logprob[j];
    return -INFINITY;
}

void equiv_add(struct equiv_stats *st, long pos, const struct equiv_row *ref, const struct equiv_row *got, float tie) {
    st->n_rows++;
    const int32_t a = ref->id[0], b = got->id[0];
    float d = fabsf(ref->logprob[0] - lookup(got, a));
    if (!isfinite(d)) d = INFINITY;
    st->sum_d_top1 += isfinite(d) ? d : 0.0;
    if (d > st->max_d_top1) st->max_d_top1 = d;
    if (a == b) { st->n_agree++; return; }
    const float gap_ref = ref->logprob[0] - lookup(ref, b);
    const float gap_got = got->logprob[0] - lookup(got, a);
    if (fminf(gap_ref, gap_got) < tie) st->n_near_tie++;
    else {
        st->n_real++;
        if (st->first_real_pos < 0) st->first_real_pos = pos;
    }
}
