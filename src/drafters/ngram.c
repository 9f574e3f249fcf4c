/* ngram.c — prompt-lookup drafting: find the most recent earlier occurrence of the last
 * N tokens (N from NGRAM_MAX down to NGRAM_MIN) in the sequence's own history and propose
 * the tokens that followed it. No weights, no state: it proves the driver is not MTP-shaped,
 * and it is strong on code and on text that quotes its prompt. */
#include <stdlib.h>

#include "drafters/drafter.h"

#define NGRAM_MAX 4
#define NGRAM_MIN 2

struct ngram {
    struct drafter base;
};

static void ngram_free(struct drafter *d) { free(d); }
static void ngram_reset(struct drafter *d, int s) {}
static int ngram_observe(struct drafter *d, int n, const struct draft_observed *seen, char *err, size_t err_size) {
    return 0;
}

static int ngram_draft(struct drafter *d, int s, const struct draft_request *rq, struct draft_result *out,
                       char *err, size_t err_size) {
    const int32_t *h = rq->history;
    const int end = rq->L + 1; /* history length including the pending token */
    out->n = 0;
    for (int n = NGRAM_MAX; n >= NGRAM_MIN && out->n == 0; n--) {
        if (end <= n) continue;
        const int32_t *key = h + end - n;
        for (int start = end - n - 1; start >= 0; start--) {
            int k = 0;
            while (k < n && h[start + k] == key[k]) k++;
            if (k < n) continue;
            for (int j = start + n; j < end && out->n < rq->n_max; j++) out->tokens[out->n++] = h[j];
            break;
        }
    }
    /* n-gram drafts are certain proposals: as a distribution each is one-hot */
    for (int i = 0; i < out->n; i++) { out->q[i] = NULL; out->q_n[i] = 0; }
    return 0;
}

static const struct drafter_vtable ngram_vtable = {
    .free = ngram_free, .reset = ngram_reset, .observe = ngram_observe, .draft = ngram_draft,
};

static bool ngram_available(const struct drafter_config *c) { return true; }

static int ngram_init(struct drafter **out, const struct drafter_config *c, char *err, size_t err_size) {
    struct ngram *g = calloc(1, sizeof *g);
    if (!g) return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory");
    g->base.vt = &ngram_vtable;
    g->base.n_vocab = 0; /* never samples */
    *out = &g->base;
    return 0;
}

const struct drafter_kind drafter_kind_ngram = {
    .name = "ngram", .aliases = {"ngram-simple"}, .llama_name = "ngram-simple", .available = ngram_available, .init = ngram_init,
};
