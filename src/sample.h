/* sample.h — token samplers over one row of logits: greedy argmax and llama.cpp's default
 * chain penalties -> top_k -> typical -> top_p -> min_p -> temperature -> dist, with a seeded
 * per-object PRNG. Knows nothing of models or tokenizers: it sees n_vocab floats and the ids
 * of the tokens before the row (the penalties' history).
 * Reference: llama.cpp src/llama-sampler.cpp (penalties/top_k/typical/top_p/min_p/temp/dist)
 * and common/sampling.cpp (chain order); ../shared/docs/server-api.md §3.2–3.3. */
#ifndef COTI_SAMPLE_H
#define COTI_SAMPLE_H

#include "common.h"

/* A logit bias (OpenAI's logit_bias): added to token id's logit before the chain;
 * -INFINITY bans it. */
struct logit_bias {
    int32_t id;
    float bias;
};

struct sampler_params {
    float temperature;   /* <= 0: greedy (argmax, lowest id wins ties) */
    int32_t top_k;       /* <= 0: disabled */
    float top_p;         /* >= 1: disabled */
    float min_p;         /* <= 0: disabled */
    int32_t min_keep;    /* top_p/min_p keep at least this many candidates (llama.cpp min_keep) */
    uint64_t seed;       /* the whole draw sequence is a function of this seed */
    /* llama.cpp's penalties, first in the chain, on the tokens among the last repeat_last_n
     * of the history: logit / repeat_penalty when positive (* when not), then
     * - (count * frequency_penalty + presence_penalty). Off when repeat_last_n is 0 or the
     * three are 1, 0, 0. */
    int32_t repeat_last_n;       /* < 0: the whole history */
    float repeat_penalty;        /* > 0 and finite */
    float frequency_penalty;
    float presence_penalty;
    float typical_p;             /* >= 1: off; locally typical sampling after top_k */
    /* biases applied first (llama.cpp's chain starts with them): the sampler keeps its own
     * copy, so these need only live through sampler_init / sampler_reset */
    const struct logit_bias *bias;
    int32_t n_bias;
};

/* One surviving candidate after the chain: p is normalized over the candidate set. */
struct sampler_cand {
    int32_t id;
    float logit;         /* (logit - max) / temperature: the best candidate has 0 */
    float p;
};

struct sampler;

/* llama.cpp server defaults: temp 0.8, top_k 40, top_p 0.95, min_p 0.05, min_keep 0,
 * repeat_last_n 64 with the penalties off (1, 0, 0), typical_p 1. */
struct sampler_params sampler_params_default(uint64_t seed);
/* The four-stage chain only: the given settings, min_keep 0, typical_p off, the penalties off
 * (1, 0, 0) over llama.cpp's default window of 64 tokens. */
struct sampler_params sampler_params_basic(float temperature, int32_t top_k, float top_p, float min_p, uint64_t seed);
/* Whether p's pick is the argmax of the raw logits: greedy, and no stage before the
 * temperature can move the argmax (no bias, penalties off, typical_p off). A device-side argmax
 * can then stand in for the sampler. */
bool sampler_params_plain_argmax(const struct sampler_params *p);

/* Allocate a sampler whose scratch holds n_vocab candidates, so sampling never allocates.
 * Returns 0 and *out, COTI_E_ARG for n_vocab <= 0 or a bad parameter (NaN, a penalty that is
 * not finite, repeat_penalty <= 0, a biased id outside the vocabulary), COTI_E_NOMEM. */
int sampler_init(struct sampler **out, const struct sampler_params *params, int32_t n_vocab,
                 char *err, size_t err_size);
void sampler_free(struct sampler *s);

/* Replace the parameters and restart the PRNG from params->seed (slot reuse without
 * reallocating). Returns 0 or COTI_E_ARG (bad parameter); on error s is unchanged. */
int sampler_reset(struct sampler *s, const struct sampler_params *params, char *err, size_t err_size);

/* Sample one token from logits[0..n_vocab), the row that follows the tokens prev[0..n_prev)
 * (prompt and generated so far: the penalties read the last repeat_last_n of them, ids
 * outside [0, n_vocab) are ignored; prev may be NULL when n_prev is 0). Greedy when
 * temperature <= 0 (no PRNG draw): the argmax of what the chain keeps; otherwise runs the
 * chain and draws once from the PRNG. NaN logits count as -inf. Always returns an id in
 * [0, n_vocab). */
int32_t sampler_sample(struct sampler *s, const float *logits, const int32_t *prev, int n_prev);

/* Run the chain (prev as in sampler_sample) without drawing and expose the final
 * distribution: *cands points to *n candidates in sampler-owned scratch (valid until the next
 * call on s), sorted by descending probability when the chain sorted them (it does whenever
 * top_k, top_p or min_p's fallback ran, and typical_p did not reorder them last); probabilities
 * sum to 1. For greedy this is the argmax with p = 1.
 * This is the distribution sampler_sample draws from, so speculative decoding can do exact
 * rejection sampling. Always *n >= 1. */
void sampler_probs(struct sampler *s, const float *logits, const int32_t *prev, int n_prev,
                   const struct sampler_cand **cands, size_t *n);

/* Draw u uniform in [0, 1) from the sampler's own stream (53-bit resolution). */
double sampler_next_uniform(struct sampler *s);

/* Pick from a distribution given by cands[0..n) (p normalized) with one draw u from s:
 * the first candidate whose cumulative p exceeds u. Returns its id, or -1 if n == 0. */
int32_t sampler_draw(struct sampler *s, const struct sampler_cand *cands, size_t n);

/* Index of the largest logit in [0, n); lowest index on ties; NaN never wins.
 * Returns 0 if every value is NaN or -inf, -1 if n <= 0. */
int32_t sample_argmax(const float *logits, int n);

/* One step of exact speculative rejection sampling: the draft d was drawn from q (qc, qn);
 * p (pc, pn) is the target's distribution at that row. Accepts d with probability
 * min(1, p(d)/q(d)) and returns -1; otherwise returns a token drawn from
 * normalize(max(0, p − q)). qdense is an all-zero scratch of n_vocab floats (left zero),
 * resid scratch of at least pn candidates. Randomness comes from smp's stream. */
int32_t sampler_rejection_step(struct sampler *smp, const struct sampler_cand *pc, size_t pn,
                               const struct sampler_cand *qc, size_t qn, int32_t d, float *qdense,
                               struct sampler_cand *resid);

#endif
