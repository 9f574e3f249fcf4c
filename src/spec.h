/* spec.h — the speculative driver: one cycle shared by every drafter.
 *   draft (drafter proposes d1..dk after the pending token)
 *   verify (one target batch over [pending, d1..dk], logits for every row)
 *   accept (greedy: longest prefix where the target's argmax equals the draft, then the
 *           target's own token; temperature > 0: exact — sample-and-match for greedy drafts,
 *           min(1, p/q) rejection sampling with resampling from (p - q)+ for sampled drafts)
 *   roll back (target KV + recurrent state to the accepted prefix, the drafter's own state
 *              with them (its rollback hook); the drafter catches up).
 * With speculation off the same object runs plain decoding, so callers have one loop.
 * Knows nothing of HTTP or text. */
#ifndef COTI_SPEC_H
#define COTI_SPEC_H

#include "drafters/registry.h"
#include "grammar.h"
#include "model.h"
#include "sample.h"

struct spec_params {
    const struct drafter_kind *drafter; /* NULL: speculation off (plain decoding) */
    int n_max;                   /* drafts per cycle, 1..SPEC_MAX_DRAFT */
    int n_min;
    /* every cycle asks for n_max drafts (tests of each depth; also with sampled drafts at
     * temperature > 0, whose draws would follow the depth); else a sequence's own cycles ask
     * for the depth that pays, n_min to n_max or none (draft_depth.h) */
    bool fixed_depth;
    float p_min;                 /* MTP: stop drafting under this top probability */
    bool sample_drafts;          /* temperature > 0: sample drafts from q and use rejection
                                    sampling (else greedy drafts, sample-and-match) */
    /* Constrained decoding: every token emitted is one the grammar accepts. The first token and
     * each verify row are masked with the grammar's state after the tokens before them (the
     * argmax / the sampler then see only accepted tokens), drafts are cut before the first one
     * it rejects, and drafts are greedy (sample-and-match, exact). NULL: unconstrained. Both
     * outlive the sequence; the vocabulary covers the model's n_vocab logits. */
    const struct grammar *grammar;
    const struct grammar_vocab *grammar_vocab;
};

struct spec_params spec_params_default(void);

struct spec_stats {
    long n_prompt, n_gen;        /* prompt tokens processed, tokens emitted */
    long n_drafted, n_accepted, n_verify;
    long n_ahead;                /* verifies the drafter ran ahead over (drafter.h observe_ahead) */
    long drafted_at[SPEC_MAX_DRAFT], accepted_at[SPEC_MAX_DRAFT]; /* by draft position */
    int64_t t_prompt_us, t_draft_us, t_verify_us, t_glue_us;
};

/* Teacher forcing for the equivalence gate: instead of the target's choice, the cycle
 * accepts exactly forced[] (positions continue the sequence), and reports every verify row's
 * logits (a host copy valid during the call; the row at pos predicts pos+1) before accepting. */
struct spec_probe {
    const int32_t *forced;
    int n_forced;
    int n_used;
    void (*on_row)(void *user, int pos, const float *logits, int n_vocab);
    void *user;
};

/* Token log-probabilities (OpenAI's logprobs, llama.cpp's n_probs): of an emitted token under
 * the target's distribution at its position (log-softmax of the raw logits row: before any
 * sampler transform), and the n_top most likely tokens there, most likely first (lower id on
 * ties). The verify row of a token accepted from a draft is the row plain decoding computes, so
 * these values do not depend on speculation. */
#define SPEC_MAX_TOP_LOGPROBS 20
struct spec_token_prob {
    float logprob;
    int n_top;
    int32_t top_id[SPEC_MAX_TOP_LOGPROBS];
    float top_logprob[SPEC_MAX_TOP_LOGPROBS];
};

/* The log-probabilities of a logits row (n floats, host) for token id: fills p with n_top best. */
void spec_token_prob_of_row(const float *row, int n, int32_t id, int n_top, struct spec_token_prob *p);

struct spec_engine;

/* Engine over a loaded model: owns one drafter of every registered kind available for it
 * (draft_path: a drafter's own model file, or NULL). */
int spec_engine_init(struct spec_engine **out, struct model *m, const char *draft_path, char *err, size_t err_size);
void spec_engine_free(struct spec_engine *e);
/* Whether sequences may use drafter kind k (NULL, off, always). */
bool spec_engine_supports(const struct spec_engine *e, const struct drafter_kind *k);

/* Start sequence s on a prompt (resets it, prefills, samples the first token into *first).
 * Returns 0 or a negative coti_err (bad params, prompt too long for the context). */
int spec_seq_begin(struct spec_engine *e, int s, const int32_t *prompt, int n_prompt,
                   const struct sampler_params *sp, const struct spec_params *p, int32_t *first,
                   char *err, size_t err_size);
/* Prefix reuse across requests and sequences. spec_seq_reusable: how many leading prompt tokens
 * sequence s can take from sequence src's state (src == s: its own) for drafter kind k — src's
 * whole held state when s continues itself, else one of src's checkpoints or its length (memory.h)
 * that the drafter can resume from; at most n_prompt - 1, 0 when nothing. spec_seq_begin_reuse:
 * spec_seq_begin with those n_reuse tokens taken from src (0: none; a value reusable no longer
 * falls back to a full prefill), *n_cached = what was taken; the prefill leaves checkpoints at
 * ck_at[0, n_ck_at) and at n_prompt - 1 for later requests. Same results as spec_seq_begin up to
 * the floating-point reduction order of the split prefill. */
int spec_seq_reusable(const struct spec_engine *e, int s, int src, const int32_t *prompt, int n_prompt,
                      const struct drafter_kind *k);
int spec_seq_begin_reuse(struct spec_engine *e, int s, int src, int n_reuse, const int32_t *prompt, int n_prompt,
                         const int *ck_at, int n_ck_at, const struct sampler_params *sp, const struct spec_params *p,
                         int32_t *first, int *n_cached, char *err, size_t err_size);
/* spec_seq_begin_reuse in steps, so that a long prompt does not stall other sequences: start
 * sets sequence s up (and takes what it reuses) without processing the prompt; each prefill
 * call processes up to max_rows more of the prompt of each of n distinct started sequences
 * seqs[i], all of them together in forwards of at most n_batch rows (prompts that arrive
 * together are computed together), and the call that reaches a prompt's end picks its first
 * token into first[i] and sets done[i]; rc[i] is that sequence's status. Returns 0, or an error
 * for the call (a sequence out of range or twice). The same results as spec_seq_begin_reuse
 * whatever the steps and companions, up to where a prompt's forwards split (on a backend whose
 * prompt kernels depend on the batch, set_prompt, their rounding). */
int spec_seq_start_reuse(struct spec_engine *e, int s, int src, int n_reuse, const int32_t *prompt, int n_prompt,
                         const int *ck_at, int n_ck_at, const struct sampler_params *sp, const struct spec_params *p,
                         int *n_cached, char *err, size_t err_size);
int spec_seqs_prefill(struct spec_engine *e, int n, const int *seqs, int max_rows, int32_t *first, bool *done, int *rc,
                      char *err, size_t err_size);
/* One cycle: emits 1..n_max+1 tokens into out (at most max_new), *n_out set. The last one is
 * pending (not yet in the target). probe may be NULL. */
int spec_seq_step(struct spec_engine *e, int s, int max_new, int32_t *out, int *n_out,
                  struct spec_probe *probe, char *err, size_t err_size);
/* One cycle of each of n distinct sequences seqs[i] with a single verify forward for all of them
 * (split where their rows exceed n_batch, never inside a sequence), so each weight is read once
 * per cycle for every sequence: drafts per sequence first, then every verify row together, the
 * acceptance on the host. The same tokens as n calls of spec_seq_step (a row does not depend on
 * the rows beside it; after spec_engine_calibrate the batch drafts as deep as pays off for the
 * whole of it). out[i] gets sequence seqs[i]'s 1..n_max+1 tokens (at most max_new[i]),
 * n_out[i] their count, rc[i] its own status (0, or what spec_seq_step would return; err holds
 * the last failure's message). probes: NULL, or per entry spec_seq_step's teacher forcing (or
 * NULL), for the gate over a batch. Returns 0, or COTI_E_ARG for more than SPEC_MAX_BATCH. */
int spec_step_batch(struct spec_engine *e, int n, const int *seqs, const int *max_new, int32_t (*out)[SPEC_MAX_DRAFT + 1],
                    int *n_out, int *rc, struct spec_probe *const *probes, char *err, size_t err_size);
/* Time verify forwards of 1, 2, 4, ... sequences (up to what a batched cycle may have) with 1 ..
 * 5 rows each, on sequences from 0, which it leaves empty, so that batched cycles choose their
 * draft depth from what rows cost (spec_step_batch: the depth whose tokens per second are the
 * most; uncalibrated, each sequence drafts its n_max). Call it while no sequence is in use.
 * spec_engine_verify_cost_us: the calibrated time of a verify of n_seqs sequences with `rows`
 * rows each (0: not calibrated). */
int spec_engine_calibrate(struct spec_engine *e, char *err, size_t err_size);
/* Whether the engine takes its backend for one that queues work (by default: CUDA yes, CPU no):
 * then drafters run ahead over batched greedy verifies (drafter.h observe_ahead) and none stops
 * following a sequence whose drafting pauses. Tests turn it on for the CPU to run those paths. */
void spec_engine_set_queued(struct spec_engine *e, bool on);
double spec_engine_verify_cost_us(const struct spec_engine *e, int n_seqs, int rows);
/* Decode up to n_gen tokens of prompt on every sequence, greedy and sampled (temperature sp's,
 * or 0.8 when that is 0), with speculation p, then forget them (every sequence empty): a
 * backend that records the small steps as graphs has then recorded each sequence's decode and
 * draft / verify shapes, which a request would otherwise pay for (an eager run and a recording
 * per shape, milliseconds). Nothing to gain where the backend records nothing. */
int spec_engine_warmup(struct spec_engine *e, const int32_t *prompt, int n_prompt, const struct sampler_params *sp,
                       const struct spec_params *p, int n_gen, char *err, size_t err_size);
const struct spec_stats *spec_seq_stats(const struct spec_engine *e, int s);
/* Sequence s's next begins and steps also report their tokens' log-probabilities with n_top
 * alternatives each (0..SPEC_MAX_TOP_LOGPROBS; < 0: none, the default: the rows then stay on
 * the device). spec_seq_probs: those of the tokens the last begin (1) or step (*n_out) emitted,
 * in order; NULL when not asked for. Valid until the next call on s. */
void spec_seq_want_probs(struct spec_engine *e, int s, int n_top);
const struct spec_token_prob *spec_seq_probs(const struct spec_engine *e, int s);
/* Tokens of the sequence so far (prompt + emitted); *n set. */
const int32_t *spec_seq_tokens(const struct spec_engine *e, int s, int *n);

#endif
