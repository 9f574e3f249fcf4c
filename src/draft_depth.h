/* draft_depth.h — how many drafts a sequence's next cycle asks for (spec_seq_step), chosen from
 * what this request's drafts have been worth and what cycles cost on this engine, both
 * measured as the cycles run. Speculation is lossless at any depth, so this decides speed only:
 * depth d is worth E[tokens | d] / E[time | d], with
 *   E[tokens | d] = 1 + Σ_{i<d} F_i A_i,
 *   E[time | d]   = V(1) + Σ_{i<d} F_i (V(i+2) − V(i+1) + D),
 * F_i the chance the drafter fills position i when asked (n-gram drafts often do not come),
 * A_i the chance the first i+1 drafts are all accepted once drafted, V(r) a verify of r rows,
 * D a drafted token's time. Depth 0 (plain decoding) is a candidate too: a drafter whose drafts
 * do not pay is paused, and probed again after a back-off that doubles while it keeps losing.
 * A request starts from what its drafter kind's drafts were worth over earlier requests. */
#ifndef COTI_DRAFT_DEPTH_H
#define COTI_DRAFT_DEPTH_H

#include <stdbool.h>

#include "drafters/drafter.h"

/* Positions a paused drafter keeps following (drafter.h's skip): a probe's draft catches up
 * from them instead of from stale cells alone. */
#define DEPTH_KEEP_ROWS 4

/* Running means that become moving averages over about their last `window` samples; n counts
 * the samples up to the window (cold: cost samples passed over so far, depth_cost_add). */
struct depth_mean { double v; int n, cold; };

/* What verifies cost on one engine (shared by its sequences): verify[r-1] a single sequence's
 * verify of r rows (host time, draft excluded). A drafted token's cost is its drafter kind's,
 * passed beside it. */
struct depth_costs {
    struct depth_mean verify[SPEC_MAX_DRAFT + 1];
};

/* Per draft position: fill F_i and acceptance A_i (see above). */
struct depth_record {
    struct depth_mean fill[SPEC_MAX_DRAFT], acc[SPEC_MAX_DRAFT];
};

/* A pause: a request takes over where its drafter kind's last cycle left it, so that a drafter
 * that never pays is probed ever more rarely rather than anew in every request. */
struct depth_pause {
    int left;                    /* cycles still without drafts */
    int len;                     /* the last pause's length (0: drafting paid since) */
    int probes;                  /* cycles that draft whatever the record says, after a pause */
};

/* One sequence's policy: its request's record, its pause. */
struct depth_seq {
    struct depth_record rec;
    struct depth_pause pause;
    int cycles;                  /* cycles that chose a depth by the record */
};

void depth_mean_add(struct depth_mean *m, double x, int window);
/* A cost sample; a mean's first is dropped (a shape's first run records a graph or faults
 * its memory in: several times what it costs after). */
void depth_cost_add(struct depth_mean *m, double x);
/* A new request of drafter kind's record `kind` (NULL: none yet). */
void depth_seq_start(struct depth_seq *q, const struct depth_record *kind, const struct depth_pause *pause);
/* A cycle that asked for `asked` drafts, got `drafted`, verified `verified` of them (a grammar
 * may cut some) and accepted `accepted`: into the sequence's record and its kind's. */
void depth_seq_record(struct depth_seq *q, struct depth_record *kind, int asked, int drafted, int verified, int accepted);
/* The next cycle's depth in [n_min, n_max] given the costs so far (draft_us: the drafter
 * kind's; unmeasured costs are taken as free, so the cycles that measure them happen). */
int depth_next(struct depth_seq *q, const struct depth_costs *c, const struct depth_mean *draft_us, int n_min, int n_max);
/* What asking for d drafts is expected to give by the record: tokens emitted (1 + Σ F_i A_i)
 * and drafts made (Σ F_i), for a batched cycle that prices its rows itself. */
void depth_expected(const struct depth_record *r, int d, double *tokens, double *drafts);
/* Whether a record's drafts are all but never accepted (a head that does not fit the text): only
 * then does a paused drafter stop following the sequence (drafter.h's skip). A drafter paused
 * because its drafts barely pay keeps its context, so that its probes measure it as it is. */
bool depth_drafts_useless(const struct depth_record *r);
/* E[tokens | d] / E[time | d] of a record at costs c (exposed for tests). */
double depth_rate(const struct depth_record *r, const struct depth_costs *c, const struct depth_mean *draft_us, int d);

#endif
