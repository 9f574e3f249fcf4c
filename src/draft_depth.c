/* draft_depth.c — see draft_depth.h. */
#include "draft_depth.h"

#include <string.h>

#include "common.h"

/* A request whose drafter kind has no record yet expects this of its first draft (MTP heads
 * and n-gram matches keep 0.6-0.95 on text they fit): optimistic, so that its first cycles draft
 * and measure. */
#define DEPTH_ACC_PRIOR 0.8
/* A request inherits its kind's record with at most this weight, its own cycles soon outweigh it. */
#define DEPTH_INHERIT_N 2
/* Pause when the best drafting depth's rate is under this share of plain decoding's: within a
 * few percent the machine's noise decides, and a pause costs what drafting could have gained. */
#define DEPTH_PAUSE_BELOW 0.95
#define DEPTH_PAUSE_FIRST 16
#define DEPTH_PAUSE_MAX 256
#define DEPTH_PROBES 4
/* Every this many cycles one draft more than the best is asked for, so that a depth whose
 * cost or acceptance was measured badly once (a cold start, a noisy minute) is measured again. */
#define DEPTH_EXPLORE_EVERY 16
/* Windows of the running means: acceptance over tens of cycles (one rejected draft in a run of
 * accepted ones is not a change of text), costs over fewer (the context grows). */
#define DEPTH_WINDOW_RECORD 32
#define DEPTH_WINDOW_COST 16
/* depth_cost_add: samples passed over per cost; a spike's cap once the mean has that many */
#define DEPTH_COLD_SAMPLES 2
#define DEPTH_COST_SPIKE 1.5
#define DEPTH_SPIKE_AFTER 4
/* A deeper position's measured acceptance counts once it has this many samples; before, the
 * extension from the positions before it does (one early cycle must not fix it for good). */
#define DEPTH_MIN_DEEP_SAMPLES 4
/* depth_drafts_useless: the first draft kept less often than this, over at least that many */
#define DEPTH_USELESS_ACC 0.25
#define DEPTH_USELESS_SAMPLES 2

void depth_mean_add(struct depth_mean *m, double x, int window) {
    if (m->n < window) m->n++; /* (a count that stops at the window: a server runs for weeks) */
    m->v += (x - m->v) / m->n;
}

/* A cost's first samples are passed over (on a GPU a shape's first forward runs op by op and its
 * second records a graph), and one far above the mean counts as DEPTH_COST_SPIKE times it: a
 * 4-row verify measured once at 1314 us against 306 warm, or a mean of 1-row cycles pulled from
 * 300 to 456 us by a few spikes, paused drafting that gained 1.45x (H100, tiny model, mtp:3:
 * 0.75-0.91x off in 2 of 4 runs). */
void depth_cost_add(struct depth_mean *m, double x) {
    if (m->cold < DEPTH_COLD_SAMPLES) {
        m->cold++;
        return;
    }
    if (m->n >= DEPTH_SPIKE_AFTER && x > DEPTH_COST_SPIKE * m->v) x = DEPTH_COST_SPIKE * m->v;
    depth_mean_add(m, x, DEPTH_WINDOW_COST);
}

void depth_seq_start(struct depth_seq *q, const struct depth_record *kind, const struct depth_pause *pause) {
    memset(q, 0, sizeof *q);
    if (pause) q->pause = *pause;
    if (!kind) return;
    q->rec = *kind;
    for (int i = 0; i < SPEC_MAX_DRAFT; i++) {
        q->rec.fill[i].n = COTI_MIN(q->rec.fill[i].n, DEPTH_INHERIT_N);
        q->rec.acc[i].n = COTI_MIN(q->rec.acc[i].n, DEPTH_INHERIT_N);
    }
}

static void record_add(struct depth_record *r, int asked, int drafted, int verified, int accepted) {
    for (int i = 0; i < asked && i < SPEC_MAX_DRAFT; i++) depth_mean_add(&r->fill[i], drafted > i, DEPTH_WINDOW_RECORD);
    for (int i = 0; i < verified && i < SPEC_MAX_DRAFT; i++) depth_mean_add(&r->acc[i], accepted > i, DEPTH_WINDOW_RECORD);
}

void depth_seq_record(struct depth_seq *q, struct depth_record *kind, int asked, int drafted, int verified, int accepted) {
    record_add(&q->rec, asked, drafted, verified, accepted);
    if (kind) record_add(kind, asked, drafted, verified, accepted);
}

/* F_i and A_i: measured, else extended from the positions before (a fill like the last one's;
 * an acceptance falling by the last measured ratio), never rising with i. */
static void record_estimate(const struct depth_record *r, int d, double *F, double *A) {
    for (int i = 0; i < d; i++) {
        F[i] = r->fill[i].n ? r->fill[i].v : i ? F[i - 1] : 1.0;
        double ext = i == 0 ? DEPTH_ACC_PRIOR : i == 1 || A[i - 2] <= 0.0 ? A[i - 1] * A[0] : A[i - 1] * A[i - 1] / A[i - 2];
        A[i] = r->acc[i].n >= (i ? DEPTH_MIN_DEEP_SAMPLES : 1) ? r->acc[i].v : ext;
        if (i > 0 && A[i] > A[i - 1]) A[i] = A[i - 1];
    }
}

/* V(rows): measured, else between the measured neighbours, else along the last measured slope;
 * with V(1) alone every row is taken as free (the cycle that measures it then runs). */
static double verify_at(const struct depth_costs *c, int rows) {
    const struct depth_mean *v = c->verify;
    if (v[rows - 1].n || rows == 1) return v[rows - 1].v;
    int lo = rows - 1, hi = rows + 1;
    while (lo > 1 && !v[lo - 1].n) lo--;
    while (hi <= SPEC_MAX_DRAFT + 1 && !v[hi - 1].n) hi++;
    const double vlo = v[lo - 1].v;
    if (hi <= SPEC_MAX_DRAFT + 1) return vlo + (v[hi - 1].v - vlo) * (rows - lo) / (hi - lo);
    if (lo == 1) return vlo;
    return vlo + (vlo - v[0].v) * (rows - lo) / (lo - 1);
}

bool depth_drafts_useless(const struct depth_record *r) {
    return r->acc[0].n >= DEPTH_USELESS_SAMPLES && r->acc[0].v < DEPTH_USELESS_ACC;
}

void depth_expected(const struct depth_record *r, int d, double *tokens, double *drafts) {
    double F[SPEC_MAX_DRAFT], A[SPEC_MAX_DRAFT];
    record_estimate(r, d, F, A);
    *tokens = 1.0;
    *drafts = 0.0;
    for (int i = 0; i < d; i++) {
        *tokens += F[i] * A[i];
        *drafts += F[i];
    }
}

double depth_rate(const struct depth_record *r, const struct depth_costs *c, const struct depth_mean *draft_us, int d) {
    double F[SPEC_MAX_DRAFT], A[SPEC_MAX_DRAFT];
    record_estimate(r, d, F, A);
    const double D = draft_us && draft_us->n ? draft_us->v : 0.0;
    double tok = 1.0, t = verify_at(c, 1), prev = t;
    for (int i = 0; i < d; i++) {
        const double vi = verify_at(c, i + 2);
        tok += F[i] * A[i];
        t += F[i] * ((vi > prev ? vi - prev : 0.0) + D);
        prev = vi > prev ? vi : prev;
    }
    return t > 0.0 ? tok / t : 0.0;
}

int depth_next(struct depth_seq *q, const struct depth_costs *c, const struct depth_mean *draft_us, int n_min, int n_max) {
    if (q->pause.left > 0) {
        q->pause.left--;
        return n_min;
    }

    if (!c->verify[0].n && n_min == 0) return 0; /* plain decoding's cost first: the baseline */
    int best = COTI_MAX(n_min, 1);
    double best_rate = 0.0;
    for (int d = best; d <= n_max; d++) {
        const double r = depth_rate(&q->rec, c, draft_us, d);
        if (r > best_rate) { best = d; best_rate = r; }
    }
    if (q->pause.probes > 0) {
        q->pause.probes--;
        return best;
    }
    if (n_min == 0 && best_rate < DEPTH_PAUSE_BELOW * depth_rate(&q->rec, c, draft_us, 0)) {
        q->pause.len = q->pause.len ? COTI_MIN(2 * q->pause.len, DEPTH_PAUSE_MAX) : DEPTH_PAUSE_FIRST;
        q->pause.left = q->pause.len - 1; /* this cycle is the pause's first */
        q->pause.probes = DEPTH_PROBES;
        return 0;
    }
    q->pause.len = 0;
    if (++q->cycles % DEPTH_EXPLORE_EVERY == 0 && best < n_max) best++;
    return best;
}
