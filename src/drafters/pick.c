/* pick.c — how a drafter with a model of its own (mtp, assistant) turns one step's logits into
 * its draft i (drafter.h, struct draft_picker). */
#include <stdlib.h>
#include <string.h>

#include "drafters/drafter.h"

int draft_picker_init(struct draft_picker *p, struct backend *be, int n_vocab) {
    *p = (struct draft_picker){.be = be, .n_vocab = n_vocab};
    p->host_logits = malloc(sizeof(float) * (size_t)n_vocab);
    p->d_p = be->alloc(be, sizeof(float));
    bool ok = p->host_logits && p->d_p;
    for (int i = 0; ok && i < SPEC_MAX_DRAFT; i++) ok = (p->qbuf[i] = malloc(sizeof(struct sampler_cand) * (size_t)n_vocab)) != NULL;
    return ok ? 0 : COTI_E_NOMEM;
}

void draft_picker_free(struct draft_picker *p) {
    if (p->d_p) p->be->free(p->be, p->d_p);
    for (int i = 0; i < SPEC_MAX_DRAFT; i++) free(p->qbuf[i]);
    free(p->host_logits);
    *p = (struct draft_picker){0};
}

bool draft_pick(struct draft_picker *p, const float *logits, const struct draft_request *rq, int i,
                struct draft_result *out) {
    struct backend *be = p->be;
    if (rq->sampler) {
        const struct sampler_cand *cands;
        size_t nc;
        be->download(be, p->host_logits, logits, sizeof(float) * (size_t)p->n_vocab);
        sampler_probs(rq->sampler, p->host_logits, rq->history, rq->L + 1 + i, &cands, &nc);
        memcpy(p->qbuf[i], cands, nc * sizeof *cands);
        out->tokens[i] = sampler_draw(rq->sampler, p->qbuf[i], nc);
        rq->history[rq->L + 1 + i] = out->tokens[i];
        out->q[i] = p->qbuf[i];
        out->q_n[i] = nc;
        return true;
    }
    out->q[i] = NULL;
    out->q_n[i] = 0;
    if (rq->p_min > 0.0f) {
        float pr;
        be->argmax(be, logits, 1, p->n_vocab, rq->dev_tokens + i, p->d_p);
        be->download(be, &pr, p->d_p, sizeof pr);
        if (pr < rq->p_min && i >= rq->n_min) return false;
    }
    return true;
}
