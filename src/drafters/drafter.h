/* drafter.h — what the speculative driver asks of a drafter, and what a drafter declares of
 * itself (struct drafter_kind). A drafter proposes tokens; it never decides what is emitted
 * (the target's verify pass does), so a bad drafter costs speed, never correctness. One file
 * per drafter in src/drafters/, each listed once in registry.c. */
#ifndef COTI_DRAFTER_H
#define COTI_DRAFTER_H

#include "model.h"
#include "sample.h"

/* Upper bound of draft tokens per cycle: sizes per-sequence buffers and the target's kept
 * recurrent states (1 + SPEC_MAX_DRAFT rows per verify). */
#define SPEC_MAX_DRAFT 8
/* Sequences one batched cycle (spec_step_batch, a drafter's draft_batch) takes at once. */
#define SPEC_MAX_BATCH 64

struct draft_request {
    int32_t *history;            /* tokens of the sequence: [0, L) in the target, [L] pending,
                                    room for n_max more: a draft sampled through the chain is
                                    written at [L + 1 + i], so the chain's penalties see it
                                    when draft i + 1 is sampled */
    int L;
    int n_max;                   /* propose at most this many */
    int n_min;                   /* ...and at least this many unless the drafter has nothing */
    float p_min;                 /* stop when the proposed token's probability falls below */
    struct sampler *sampler;     /* non-NULL: sample drafts from the drafter's distribution
                                    (through the request's sampling chain) and report it */
    int32_t *dev_tokens;         /* backend memory for n_max ids: where a drafter that picks
                                    its drafts on the device leaves them (the verify batch reads
                                    them there) */
};

struct draft_result {
    int n;
    /* The drafts. When on_device they are in the request's dev_tokens[0, n) and tokens[] is
     * not filled (reading them would cost a sync per cycle); else in tokens[]. */
    bool on_device;
    int32_t tokens[SPEC_MAX_DRAFT];
    /* with a sampler: the distribution each draft was drawn from (candidates, p normalized);
     * rejection sampling needs q(x) for every x. Points into drafter-owned memory valid until
     * the next draft call. */
    const struct sampler_cand *q[SPEC_MAX_DRAFT];
    size_t q_n[SPEC_MAX_DRAFT];
    /* rows the drafter ran besides the draft's own to catch up with the target (after a prompt:
     * all of it), so that a draft's cost per token can leave them out */
    int catch_up;
};

/* Rows the target accepted: positions [pos0, pos0 + n) of sequence s (history: its tokens),
 * their post-norm hidden rows in backend memory at hidden. prompt: they are a prompt's (a
 * drafter that follows the target catches up now, in the prompt's time, as llama.cpp's
 * drafters do). For observe_ahead, rows the target has computed but not yet accepted, and ids
 * (backend memory): the target's argmax of each row, the token that follows it if it is kept. */
struct draft_observed {
    int s, pos0, n;
    const int32_t *history;
    const float *hidden;
    bool prompt;
    const int32_t *ids;
};

struct drafter;

struct drafter_vtable {
    void (*free)(struct drafter *d);
    /* Sequence s starts over (new request). */
    void (*reset)(struct drafter *d, int s);
    /* The target accepted rows of n sequences (each sequence once; the hidden rows are valid
     * only during this call): a batched cycle's in one call. Returns 0 or an error for all. */
    int (*observe)(struct drafter *d, int n, const struct draft_observed *seen, char *err, size_t err_size);
    /* Optional. A batched greedy verify of n sequences has been queued, its results not read yet:
     * the drafter may follow all of its rows now (rows[i].ids: the target's argmax of each), in
     * the same queue, as if every draft were kept; observe then says how many were. Only where
     * the backend queues work (the host does not wait for it, so the draft's own forward and
     * its host round trip are saved) and only for sequences whose next drafts are greedy on
     * the device. ran[i]: whether it did for rows[i]. Returns 0 or an error for all. */
    int (*observe_ahead)(struct drafter *d, int n, const struct draft_observed *rows, bool *ran, char *err, size_t err_size);
    int (*draft)(struct drafter *d, int s, const struct draft_request *rq, struct draft_result *out,
                 char *err, size_t err_size);
    /* Where the target may write the post-norm hidden rows of positions [pos0, pos0 + n) of
     * sequence s before observe is given them (backend memory), so that observe need not copy
     * them; NULL (or no function): the target writes them anywhere. */
    float *(*hidden_dest)(struct drafter *d, int s, int pos0, int n);
    /* The target dropped the rejected drafts of sequence s: it now holds positions [0, n_keep).
     * A drafter that keeps state for positions past that drops it; NULL: it keeps none there. */
    void (*rollback)(struct drafter *d, int s, int n_keep);
    /* Prefix reuse: sequence s's target was made to hold [0, q) (model_seq_resume); hidden is
     * the post-norm hidden row of position q-1 (backend memory) or NULL when not known.
     * can_resume says whether the drafter could continue there (src: the sequence the target's
     * state comes from, whose draft-head cells s received); resume makes it so. NULL (both): the
     * drafter keeps no per-sequence state, any point will do. */
    bool (*can_resume)(const struct drafter *d, int src, int q, const float *hidden);
    void (*resume)(struct drafter *d, int s, int q, const float *hidden);
    /* Sequence s will not be drafted for until further notice (the driver's depth is 0): the
     * drafter may drop the work of following it except for its last `keep` positions, which
     * the next draft then catches up from. NULL: following it costs nothing. */
    void (*skip)(struct drafter *d, int s, int keep);
    /* Greedy on-device drafts (no sampler, no p_min) for n distinct sequences seqs[i] at once,
     * rq[i] / out[i] as draft's: each step of their chains in one forward of the drafter, so
     * its weights are read once per step for all of them. Every field of out[i] is written (q[]
     * NULL: no sampler drew the drafts). Returns 0 or an error for all; NULL: the driver drafts
     * sequence by sequence. */
    int (*draft_batch)(struct drafter *d, int n, const int *seqs, const struct draft_request *rq, struct draft_result *out,
                       char *err, size_t err_size);
};

struct drafter {
    const struct drafter_vtable *vt;
    int n_vocab;                 /* size of the distributions it samples from (draft sampler) */
    bool draft_is_pure;          /* a greedy draft writes no state of the drafter's: the driver
                                    may queue it a step early and drop it unread */
};

/* Turning one step's logits (backend memory) into draft i, for a drafter with a model of its
 * own: sampled from the request's chain, its distribution kept as q[i] for rejection sampling; or
 * greedy, the argmax being in dev_tokens[i] already unless p_min asks for its probability, when it
 * is taken here. draft_pick returns false when a greedy draft falls under p_min past n_min (it is
 * not a draft then). */
struct draft_picker {
    struct backend *be;
    int n_vocab;
    float *d_p;                  /* backend: the argmax's probability */
    float *host_logits;          /* [n_vocab]: a sampled draft's logits */
    struct sampler_cand *qbuf[SPEC_MAX_DRAFT];
};
int draft_picker_init(struct draft_picker *p, struct backend *be, int n_vocab);
void draft_picker_free(struct draft_picker *p);
bool draft_pick(struct draft_picker *p, const float *logits, const struct draft_request *rq, int i,
                struct draft_result *out);

/* What a drafter is made for. */
struct drafter_config {
    struct model *m;             /* the target */
    int n_seq;                   /* sequences it drafts for (the target's) */
    const char *draft_path;      /* a model file of the drafter's own, or NULL (a drafter that
                                    loads one; the target's own drafters ignore it) */
};

/* A kind of drafter, as it declares itself; registry.c lists every kind. */
struct drafter_kind {
    const char *name;            /* coti's name: --spec, "speculative.type", /props, stats */
    const char *aliases[2];      /* further spellings parsed as this kind; unused ones NULL */
    const char *llama_name;      /* what llama-server calls it ("speculative.types") */
    /* Whether it can draft for c's target (the engine creates it only then). */
    bool (*available)(const struct drafter_config *c);
    int (*init)(struct drafter **out, const struct drafter_config *c, char *err, size_t err_size);
};

extern const struct drafter_kind drafter_kind_mtp;   /* NextN self-speculation (mtp.c) */
extern const struct drafter_kind drafter_kind_ngram; /* prompt lookup (ngram.c) */
extern const struct drafter_kind drafter_kind_assistant; /* a separate gemma4-assistant model (assistant.c) */

#endif
