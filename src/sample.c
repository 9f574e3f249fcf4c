/* sample.c — greedy and the logit bias -> penalties -> top_k -> typical -> top_p -> min_p -> temperature
 * -> dist chain.
 * Owns: the candidate scratch (n_vocab entries, allocated once), the penalties' count and
 * typical_p's key scratch, and a xoshiro256** PRNG seeded through splitmix64, one per sampler
 * object, so two slots never share a stream. The sampler keeps no history of its own: the
 * caller passes the tokens before each row, so a speculative verify row sees exactly the
 * tokens that would have been emitted before it (drafts included) and nothing needs undoing
 * when drafts are rejected.
 * Semantics follow llama.cpp's samplers (src/llama-sampler.cpp) with three deliberate
 * refinements: every sort breaks ties by lower id (llama.cpp's std::sort and
 * std::partial_sort leave them unspecified), non-finite logits have a defined meaning
 * (NaN = -inf; when the best logit is +-inf the mass is shared equally by the candidates
 * equal to it), and typical_p's entropy counts 0 log 0 as 0 (llama.cpp gets NaN from a
 * -inf logit there). */
#include "sample.h"

#include <math.h>
#include <string.h>
#include <stdlib.h>

/* top_p sorts only this many candidates first when the set is large (llama.cpp does the
 * same): with a trained model the nucleus is almost always far smaller than 256. */
#define SAMPLE_TOP_P_PARTIAL 256
#define SAMPLE_TOP_P_FULL_SORT_MAX 1024

struct sampler {
    struct sampler_params params;
    int32_t n_vocab;
    uint64_t rng[4];              /* xoshiro256** state */
    struct sampler_cand *cand;    /* (n_vocab) scratch */
    int32_t *count;               /* (n_vocab) occurrences in the penalty window; all zero
                                     between calls */
    float *key;                   /* (n_vocab) typical_p's sort key by id */
    struct logit_bias *bias;      /* params.bias points here: the sampler's own copy */
    size_t cap_bias;
};

/* ---- PRNG ------------------------------------------------------------------------------ */

static uint64_t splitmix64_next(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro_next(uint64_t s[4]) {
    const uint64_t result = rotl64(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return result;
}

static void rng_seed(uint64_t s[4], uint64_t seed) {
    /* splitmix64 never yields four zero words, which xoshiro would be stuck on */
    for (int i = 0; i < 4; i++) s[i] = splitmix64_next(&seed);
}

double sampler_next_uniform(struct sampler *s) {
    return (double)(xoshiro_next(s->rng) >> 11) * 0x1.0p-53;
}

/* ---- parameters ------------------------------------------------------------------------ */

struct sampler_params sampler_params_default(uint64_t seed) {
    return sampler_params_basic(0.8f, 40, 0.95f, 0.05f, seed);
}

struct sampler_params sampler_params_basic(float temperature, int32_t top_k, float top_p, float min_p, uint64_t seed) {
    return (struct sampler_params){
        .temperature = temperature, .top_k = top_k, .top_p = top_p, .min_p = min_p, .min_keep = 0, .seed = seed,
        .repeat_last_n = 64, .repeat_penalty = 1.0f, .frequency_penalty = 0.0f, .presence_penalty = 0.0f, .typical_p = 1.0f,
    };
}

static bool penalties_on(const struct sampler_params *p) {
    return p->repeat_last_n != 0 && (p->repeat_penalty != 1.0f || p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f);
}

bool sampler_params_plain_argmax(const struct sampler_params *p) {
    return p->temperature <= 0.0f && !penalties_on(p) && !(p->typical_p < 1.0f) && p->n_bias == 0;
}

static int params_check(const struct sampler_params *p, char *err, size_t err_size) {
    if (!p) return coti_fail(err, err_size, COTI_E_ARG, "sampler: params is NULL");
    if (isnan(p->temperature) || isnan(p->top_p) || isnan(p->min_p) || isnan(p->typical_p))
        return coti_fail(err, err_size, COTI_E_ARG, "sampler: temperature/top_p/min_p/typical_p must not be NaN");
    if (!isfinite(p->frequency_penalty) || !isfinite(p->presence_penalty))
        return coti_fail(err, err_size, COTI_E_ARG, "sampler: frequency_penalty and presence_penalty must be finite");
    if (!(p->repeat_penalty > 0.0f && isfinite(p->repeat_penalty)))
        return coti_fail(err, err_size, COTI_E_ARG, "sampler: repeat_penalty is %g but must be finite and > 0",
                         (double)p->repeat_penalty);
    if (p->n_bias < 0 || (p->n_bias > 0 && !p->bias)) return coti_fail(err, err_size, COTI_E_ARG, "sampler: bad bias list");
    for (int32_t i = 0; i < p->n_bias; i++)
        if (isnan(p->bias[i].bias) || p->bias[i].bias == INFINITY)
            return coti_fail(err, err_size, COTI_E_ARG, "sampler: the bias of token %d is not a number", (int)p->bias[i].id);
    return COTI_OK;
}

/* Take params, with a copy of its biases (ids checked against the vocabulary). */
static int take_params(struct sampler *s, const struct sampler_params *p, char *err, size_t err_size) {
    for (int32_t i = 0; i < p->n_bias; i++)
        if (p->bias[i].id < 0 || p->bias[i].id >= s->n_vocab)
            return coti_fail(err, err_size, COTI_E_ARG, "sampler: biased token %d is outside the vocabulary of %d",
                             (int)p->bias[i].id, (int)s->n_vocab);
    if (p->n_bias && !coti_grow(&s->bias, &s->cap_bias, (size_t)p->n_bias, sizeof *s->bias, 16))
        return coti_fail(err, err_size, COTI_E_NOMEM, "sampler: out of memory");
    if (p->n_bias) memcpy(s->bias, p->bias, sizeof *s->bias * (size_t)p->n_bias);
    s->params = *p;
    s->params.bias = s->bias;
    rng_seed(s->rng, p->seed);
    return COTI_OK;
}

int sampler_init(struct sampler **out, const struct sampler_params *params, int32_t n_vocab,
                 char *err, size_t err_size) {
    *out = NULL;
    if (n_vocab <= 0)
        return coti_fail(err, err_size, COTI_E_ARG, "sampler: n_vocab is %d but must be > 0", (int)n_vocab);
    int rc = params_check(params, err, err_size);
    if (rc) return rc;
    struct sampler *s = calloc(1, sizeof(*s));
    if (!s) return coti_fail(err, err_size, COTI_E_NOMEM, "sampler: out of memory");
    s->cand = malloc((size_t)n_vocab * sizeof(*s->cand));
    s->count = calloc((size_t)n_vocab, sizeof(*s->count));
    s->key = malloc((size_t)n_vocab * sizeof(*s->key));
    if (!s->cand || !s->count || !s->key) {
        sampler_free(s);
        return coti_fail(err, err_size, COTI_E_NOMEM, "sampler: out of memory for %d candidates", (int)n_vocab);
    }
    s->n_vocab = n_vocab;
    if ((rc = take_params(s, params, err, err_size))) {
        sampler_free(s);
        return rc;
    }
    *out = s;
    return COTI_OK;
}

void sampler_free(struct sampler *s) {
    if (!s) return;
    free(s->cand);
    free(s->count);
    free(s->key);
    free(s->bias);
    free(s);
}

int sampler_reset(struct sampler *s, const struct sampler_params *params, char *err, size_t err_size) {
    int rc = params_check(params, err, err_size);
    if (rc) return rc;
    return take_params(s, params, err, err_size);
}

/* ---- helpers --------------------------------------------------------------------------- */

int32_t sample_argmax(const float *logits, int n) {
    if (n <= 0) return -1;
    int32_t best = 0;
    float best_v = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (logits[i] > best_v) { /* strict: the lowest id keeps a tie; NaN compares false */
            best_v = logits[i];
            best = i;
        }
    }
    return best;
}

/* Total order of the chain: higher logit first, then lower id. */
static inline bool cand_better(const struct sampler_cand *a, const struct sampler_cand *b, const float *key) {
    (void)key;
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

/* typical_p's order: lower key[id] first, then lower id. */
static inline bool cand_more_typical(const struct sampler_cand *a, const struct sampler_cand *b, const float *key) {
    return key[a->id] < key[b->id] || (key[a->id] == key[b->id] && a->id < b->id);
}

typedef bool (*cand_order)(const struct sampler_cand *a, const struct sampler_cand *b, const float *key);

static inline void cand_swap(struct sampler_cand *a, struct sampler_cand *b) {
    struct sampler_cand t = *a;
    *a = *b;
    *b = t;
}

/* Sift down in a heap whose root is the *worst* element of h[0..n) by `better`. */
static inline void heap_sift_worst(struct sampler_cand *h, size_t n, size_t i, cand_order better, const float *key) {
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && better(&h[w], &h[l], key)) w = l;
        if (r < n && better(&h[w], &h[r], key)) w = r;
        if (w == i) return;
        cand_swap(&h[i], &h[w]);
        i = w;
    }
}

/* Move the k best of c[0..n) by `better` to c[0..k), sorted best first (order of the rest
 * unspecified). O(n log k), in place: no allocation, unlike qsort which may malloc. */
static inline void cand_partial_sort_by(struct sampler_cand *c, size_t n, size_t k, cand_order better, const float *key) {
    if (k > n) k = n;
    if (k == 0) return;
    for (size_t i = k / 2; i-- > 0;) heap_sift_worst(c, k, i, better, key);
    for (size_t i = k; i < n; i++) {
        if (better(&c[i], &c[0], key)) {
            cand_swap(&c[i], &c[0]);
            heap_sift_worst(c, k, 0, better, key);
        }
    }
    /* pop the worst to the back repeatedly: leaves c[0..k) best first */
    for (size_t m = k; m > 1; m--) {
        cand_swap(&c[0], &c[m - 1]);
        heap_sift_worst(c, m - 1, 0, better, key);
    }
}

/* The chain's sort: by logit (cand_better). */
static void cand_partial_sort(struct sampler_cand *c, size_t n, size_t k) { cand_partial_sort_by(c, n, k, cand_better, NULL); }

/* p = softmax(logit) over c[0..n): float exponentials, double sum (as llama.cpp's dist). */
static void cand_softmax(struct sampler_cand *c, size_t n) {
    float max_l = -INFINITY;
    for (size_t i = 0; i < n; i++)
        if (c[i].logit > max_l) max_l = c[i].logit;
    if (!isfinite(max_l)) {
        /* exp(inf - inf) is NaN: share the mass among the candidates equal to the max
         * (all of them when every logit is -inf) */
        size_t cnt = 0;
        for (size_t i = 0; i < n; i++) cnt += c[i].logit == max_l;
        for (size_t i = 0; i < n; i++) c[i].p = c[i].logit == max_l ? 1.0f / (float)cnt : 0.0f;
        return;
    }
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) {
        c[i].p = expf(c[i].logit - max_l);
        sum += c[i].p;
    }
    for (size_t i = 0; i < n; i++) c[i].p = (float)(c[i].p / sum);
}

/* ---- the chain ------------------------------------------------------------------------- */

/* llama.cpp's penalties over the last repeat_last_n of prev. c[id] must still be candidate id
 * (right after the fill). s->count is left all zero again. */
static void chain_penalties(struct sampler *s, const int32_t *prev, int n_prev) {
    const struct sampler_params *p = &s->params;
    if (!penalties_on(p) || n_prev <= 0) return;
    const int n = p->repeat_last_n < 0 ? n_prev : COTI_MIN(n_prev, p->repeat_last_n);
    const int32_t *w = prev + (n_prev - n);
    for (int i = 0; i < n; i++)
        if (w[i] >= 0 && w[i] < s->n_vocab) s->count[w[i]]++;
    for (int i = 0; i < n; i++) {
        const int32_t t = w[i];
        if (t < 0 || t >= s->n_vocab || s->count[t] == 0) continue; /* counted, or done already */
        struct sampler_cand *c = &s->cand[t];
        /* dividing a negative logit would raise it: a penalty > 1 must lower both signs */
        c->logit = c->logit <= 0.0f ? c->logit * p->repeat_penalty : c->logit / p->repeat_penalty;
        c->logit -= (float)s->count[t] * p->frequency_penalty + p->presence_penalty;
        s->count[t] = 0;
    }
}

/* Locally typical sampling: with H the entropy of softmax(c), keep the candidates in order of
 * |-log p - H| (closest to the average surprisal first) until their mass exceeds p, and at
 * least min_keep of them. Leaves c[0..n) in that order, which is not the logit order. */
static size_t chain_typical(struct sampler *s, struct sampler_cand *c, size_t n, float p, size_t min_keep, bool *sorted) {
    if (p >= 1.0f || n == 0) return n;
    cand_softmax(c, n);
    float entropy = 0.0f;
    for (size_t i = 0; i < n; i++)
        if (c[i].p > 0.0f) entropy -= c[i].p * logf(c[i].p);
    for (size_t i = 0; i < n; i++) s->key[c[i].id] = fabsf(-logf(c[i].p) - entropy); /* p = 0: +inf, last */
    cand_partial_sort_by(c, n, n, cand_more_typical, s->key);
    float cum = 0.0f;
    for (size_t i = 0; i < n; i++) {
        cum += c[i].p;
        if (cum > p && i + 1 >= min_keep) {
            n = i + 1;
            break;
        }
    }
    *sorted = false;
    return n;
}

static size_t chain_top_k(struct sampler_cand *c, size_t n, int32_t k, bool *sorted) {
    if (k <= 0) return n;
    size_t kk = (size_t)k < n ? (size_t)k : n;
    if (!*sorted) cand_partial_sort(c, n, kk);
    *sorted = true;
    return kk;
}

/* Smallest sorted prefix whose probability (softmax of the current logits) reaches p,
 * and at least min_keep long. */
static size_t chain_top_p(struct sampler_cand *c, size_t n, float p, size_t min_keep, bool *sorted) {
    if (p >= 1.0f) return n;
    cand_softmax(c, n);
    size_t n_sorted = n;
    if (!*sorted) {
        n_sorted = n > SAMPLE_TOP_P_FULL_SORT_MAX ? SAMPLE_TOP_P_PARTIAL : n;
        cand_partial_sort(c, n, n_sorted);
    }
    float cum = 0.0f;
    for (size_t i = 0; i < n; i++) {
        if (i == n_sorted) {
            /* nucleus wider than the partial sort: sort everything; with a total order the
             * first n_sorted stay where they are */
            cand_partial_sort(c, n, n);
            n_sorted = n;
        }
        cum += c[i].p;
        if (cum >= p && i + 1 >= min_keep) {
            n = i + 1;
            break;
        }
    }
    if (n_sorted < n) cand_partial_sort(c, n, n);
    *sorted = true;
    return n;
}

/* Keep candidates whose probability is at least p times the best one's. */
static size_t chain_min_p(struct sampler_cand *c, size_t n, float p, size_t min_keep, bool *sorted) {
    if (p <= 0.0f || n == 0) return n;
    if (!*sorted) {
        float max_l = -INFINITY;
        for (size_t i = 0; i < n; i++)
            if (c[i].logit > max_l) max_l = c[i].logit;
        const float min_l = max_l + logf(p);
        size_t cnt = 0;
        for (size_t i = 0; i < n; i++) cnt += c[i].logit >= min_l;
        if (cnt > 0 && cnt >= min_keep) {
            size_t j = 0; /* stable compaction: keeps llama.cpp's candidate order */
            for (size_t i = 0; i < n; i++)
                if (c[i].logit >= min_l) c[j++] = c[i];
            return j;
        }
        cand_partial_sort(c, n, n);
        *sorted = true;
    }
    const float min_l = c[0].logit + logf(p);
    size_t i = 1; /* the best candidate always stays */
    for (; i < n; i++)
        if (c[i].logit < min_l && i >= min_keep) break;
    return i;
}

/* logit <- (logit - max) / temp. Subtracting the max first (softmax does not change) keeps
 * a tiny temperature from overflowing every large logit to +inf, so the limit temp -> 0 is
 * the argmax, as it should be. A +inf logit stays the only mass (0, the rest -inf). */
static void chain_temperature(struct sampler_cand *c, size_t n, float temp) {
    float max_l = -INFINITY;
    for (size_t i = 0; i < n; i++)
        if (c[i].logit > max_l) max_l = c[i].logit;
    if (max_l == -INFINITY) return;
    if (max_l == INFINITY) {
        for (size_t i = 0; i < n; i++) c[i].logit = c[i].logit == INFINITY ? 0.0f : -INFINITY;
        return;
    }
    for (size_t i = 0; i < n; i++) c[i].logit = (c[i].logit - max_l) / temp;
}

/* Fill the scratch from logits and run the chain; returns the candidate count (>= 1). */
static size_t chain_run(struct sampler *s, const float *logits, const int32_t *prev, int n_prev) {
    const struct sampler_params *pp = &s->params;
    struct sampler_cand *c = s->cand;
    const size_t n_vocab = (size_t)s->n_vocab;

    if (sampler_params_plain_argmax(pp)) {
        c[0].id = sample_argmax(logits, s->n_vocab);
        c[0].logit = 0.0f;
        c[0].p = 1.0f;
        return 1;
    }

    for (size_t i = 0; i < n_vocab; i++) {
        c[i].id = (int32_t)i;
        c[i].logit = isnan(logits[i]) ? -INFINITY : logits[i];
        c[i].p = 0.0f;
    }
    const size_t min_keep = pp->min_keep > 0 ? (size_t)pp->min_keep : 0;
    bool sorted = false;
    size_t n = n_vocab;
    for (int32_t i = 0; i < pp->n_bias; i++) c[pp->bias[i].id].logit += pp->bias[i].bias;
    chain_penalties(s, prev, n_prev);
    /* greedy keeps only the best survivor (llama.cpp's temperature <= 0); top_k, top_p and
     * min_p always keep the best logit, so only typical_p can change the greedy pick */
    if (pp->temperature > 0.0f || pp->typical_p < 1.0f) {
        n = chain_top_k(c, n, pp->top_k, &sorted);
        n = chain_typical(s, c, n, pp->typical_p, min_keep, &sorted);
        n = chain_top_p(c, n, pp->top_p, min_keep, &sorted);
        n = chain_min_p(c, n, pp->min_p, min_keep, &sorted);
    }
    if (pp->temperature <= 0.0f) {
        size_t best = 0;
        for (size_t i = 1; i < n; i++)
            if (cand_better(&c[i], &c[best], NULL)) best = i;
        c[0] = (struct sampler_cand){c[best].id, 0.0f, 1.0f};
        return 1;
    }
    chain_temperature(c, n, pp->temperature);
    cand_softmax(c, n);
    return n;
}

void sampler_probs(struct sampler *s, const float *logits, const int32_t *prev, int n_prev,
                   const struct sampler_cand **cands, size_t *n) {
    *n = chain_run(s, logits, prev, n_prev);
    *cands = s->cand;
}

int32_t sampler_draw(struct sampler *s, const struct sampler_cand *cands, size_t n) {
    if (n == 0) return -1;
    const double u = sampler_next_uniform(s);
    double cum = 0.0;
    for (size_t i = 0; i < n; i++) {
        cum += cands[i].p;
        if (cum > u) return cands[i].id;
    }
    /* rounding left the total a hair below u: take the last candidate with mass */
    for (size_t i = n; i-- > 0;)
        if (cands[i].p > 0.0f) return cands[i].id;
    return cands[0].id;
}

int32_t sampler_sample(struct sampler *s, const float *logits, const int32_t *prev, int n_prev) {
    if (sampler_params_plain_argmax(&s->params)) return sample_argmax(logits, s->n_vocab);
    size_t n = chain_run(s, logits, prev, n_prev);
    if (s->params.temperature <= 0.0f) return s->cand[0].id; /* no draw: greedy uses no randomness */
    return sampler_draw(s, s->cand, n);
}

int32_t sampler_rejection_step(struct sampler *smp, const struct sampler_cand *pc, size_t pn,
                               const struct sampler_cand *qc, size_t qn, int32_t d, float *qdense,
                               struct sampler_cand *resid) {
    for (size_t i = 0; i < qn; i++) qdense[qc[i].id] = qc[i].p;
    double pd = 0.0;
    for (size_t i = 0; i < pn; i++) if (pc[i].id == d) pd = pc[i].p;
    const double qd = qdense[d];
    const double u = sampler_next_uniform(smp);
    int32_t out = -1;
    if (!(qd > 0.0 && u < pd / qd)) {
        size_t rn = 0;
        double sum = 0.0;
        for (size_t i = 0; i < pn; i++) {
            double r = pc[i].p - qdense[pc[i].id];
            if (r > 0.0) { resid[rn] = (struct sampler_cand){pc[i].id, 0.0f, (float)r}; sum += r; rn++; }
        }
        if (rn == 0 || sum <= 0.0) out = sampler_draw(smp, pc, pn); /* p == q on the support */
        else {
            for (size_t i = 0; i < rn; i++) resid[i].p = (float)(resid[i].p / sum);
            out = sampler_draw(smp, resid, rn);
        }
    }
    for (size_t i = 0; i < qn; i++) qdense[qc[i].id] = 0.0f;
    return out;
}
