/* blocks.c — the shared blocks (blocks.h): which backend ops, in which order, on which rows. */
#include "models/blocks.h"

#include <math.h>
#include <stdio.h>

/* Runs at least this long (prompts) use the chunked delta rule; shorter ones (decode,
 * verify) the per-token recurrence, so spec-on and spec-off decode share one path. */
#define DELTA_NET_CHUNKED_MIN_RUN 64

static void block_matmul_n(const struct block_ctx *c, const struct block_in *in, const struct bweight *const *ws,
                           float *const *ys, int n_w, int n) {
    c->be->matmul(c->be, ws, ys, n_w,
                  &(struct matmul_in){.kind = MATMUL_RMSNORM, .x = in->x, .m = in->m, .x_out = in->x_out, .w = in->norm,
                                      .eps = c->eps, .a = c->s->a},
                  n);
}

int block_moe_check_shape(const struct weight_loader *L, const struct moe_shape *sh, int n_embd, int64_t max_width) {
    if (sh->n_expert < 1 || sh->n_expert > BACKEND_MOE_MAX_EXPERTS || sh->n_used < 1 || sh->n_used > sh->n_expert ||
        sh->n_used > BLOCK_MOE_MAX_USED)
        return coti_fail(L->err, L->err_size, COTI_E_FORMAT,
                         "expert_count %d / expert_used_count %d out of range (at most %d / %d)", sh->n_expert,
                         sh->n_used, BACKEND_MOE_MAX_EXPERTS, BLOCK_MOE_MAX_USED);
    const int64_t widths[] = {sh->n_ff_exp, (int64_t)sh->n_expert * sh->n_ff_exp * 2, (int64_t)sh->n_expert * n_embd,
                              (int64_t)sh->n_used * (2 * (int64_t)sh->n_ff_exp + n_embd)};
    for (size_t i = 0; i < COTI_ARRAY_LEN(widths); i++)
        if (widths[i] < 1 || widths[i] > max_width)
            return coti_fail(L->err, L->err_size, COTI_E_FORMAT,
                             "expert hparams out of range: %d experts (%d used) of %d (a width is %lld, the limit %lld)",
                             sh->n_expert, sh->n_used, sh->n_ff_exp, (long long)widths[i], (long long)max_width);
    if (sh->n_ff_exp % BLOCK_MOE_ROW_MULTIPLE || n_embd % BLOCK_MOE_ROW_MULTIPLE)
        return coti_fail(L->err, L->err_size, COTI_E_UNSUPPORTED,
                         "expert widths (embedding %d, expert feed-forward %d) must be multiples of %d", n_embd,
                         sh->n_ff_exp, BLOCK_MOE_ROW_MULTIPLE);
    return 0;
}

int block_moe_finish_load(const struct weight_loader *L, struct moe_ffn_weights *w, const struct moe_shape *sh, int n_embd,
                          int il) {
    const bool apart = w->gate_exps.data && w->up_exps.data;
    if (apart == !!w->gate_up_exps.data || (!apart && (w->gate_exps.data || w->up_exps.data)))
        return coti_fail(L->err, L->err_size, COTI_E_FORMAT,
                         "block %d needs ffn_gate_exps and ffn_up_exps, or ffn_gate_up_exps instead", il);
    /* the stacks' third dimension: every one holds expert_count experts */
    const struct bweight *stacks[4] = {&w->gate_exps, &w->up_exps, &w->gate_up_exps, &w->down_exps};
    const int64_t rows[4] = {sh->n_ff_exp, sh->n_ff_exp, 2 * (int64_t)sh->n_ff_exp, n_embd};
    for (int i = 0; i < 4; i++)
        if (stacks[i]->data && stacks[i]->n_out != rows[i] * sh->n_expert)
            return coti_fail(L->err, L->err_size, COTI_E_FORMAT,
                             "block %d: an expert tensor does not hold expert_count %d experts", il, sh->n_expert);
    if (!apart) return 0;
    char ng[64], nu[64];
    snprintf(ng, sizeof ng, "blk.%d.ffn_gate_exps.weight", il);
    snprintf(nu, sizeof nu, "blk.%d.ffn_up_exps.weight", il);
    return weights_merge_experts(L, &w->gate_exps, ng, &w->up_exps, nu, sh->n_expert, &w->gate_up_exps);
}

void block_moe_experts(struct backend *be, const struct moe_ffn_weights *w, const struct moe_shape *sh,
                       const int32_t *ids, const float *x, int x_stride, int n, enum moe_glu glu, float *gu, float *ye) {
    const int F = sh->n_ff_exp, K = sh->n_used, E = (int)(w->down_exps.n_out / sh->n_expert);
    const struct matmul_id_in in = {.ids = ids, .n_used = K, .n_expert = sh->n_expert, .x = x, .tok_stride = x_stride,
                                    .y_stride = 2 * F};
    if (w->gate_up_exps.data) {
        be->matmul_id(be, &w->gate_up_exps, &in, n, gu);
    } else { /* apart where the backend reads the file in place */
        be->matmul_id(be, &w->gate_exps, &in, n, gu);
        be->matmul_id(be, &w->up_exps, &in, n, gu + F);
    }
    const struct matmul_id_in down = {.ids = ids, .n_used = K, .n_expert = sh->n_expert, .x = gu, .tok_stride = K * 2 * F,
                                      .slot_stride = 2 * F, .glu = glu, .y_stride = E};
    be->matmul_id(be, &w->down_exps, &down, n, ye);
}

void block_glu_ffn(const struct block_ctx *c, const struct glu_ffn_weights *w, const struct block_in *in, int n,
                   float *out) {
    const struct bweight *ws[2] = {&w->gate, &w->up};
    float *ys[2] = {c->s->fg, c->s->fu};
    block_matmul_n(c, in, ws, ys, 2, n);
    backend_matmul(c->be, &w->down, &(struct matmul_in){.kind = MATMUL_SWIGLU, .x = c->s->fg, .m = c->s->fu, .a = c->s->fg},
                   n, out);
    c->be->all_reduce(c->be, out, (int64_t)n * w->down.n_out); /* a rank's FF columns: a partial sum */
}

void block_moe_ffn(const struct block_ctx *c, const struct moe_ffn_weights *w, const struct moe_shape *sh,
                   const struct block_in *in, int n, float *out) {
    struct backend *be = c->be;
    const struct block_scratch *s = c->s;
    const int K = sh->n_used, E = (int)w->down_exps.n_out / sh->n_expert;
    /* The router and the shared gate first, with the norm formed apart into s->a (F32 in every
     * GGUF: no backend fuses a norm into a float matmul); the shared expert then reads s->a on
     * the side queue, beside the routing and the routed experts, which do not depend on it. */
    const struct bweight *wq[2] = {&w->gate_shexp, &w->up_shexp}, *wr[2] = {&w->gate_inp, &w->gate_inp_shexp};
    float *yq[2] = {s->fg, s->fu}, *yr[2] = {s->logits, s->sh_gate};
    block_matmul_n(c, in, wr, yr, 2, n);
    backend_side_begin(be);
    be->matmul(be, wq, yq, 2, &(struct matmul_in){.kind = MATMUL_PLAIN, .x = s->a}, n);
    backend_matmul(be, &w->down_shexp, &(struct matmul_in){.kind = MATMUL_SWIGLU, .x = s->fg, .m = s->fu, .a = s->fg},
                   n, s->sh);
    backend_side_end(be);
    be->moe_route(be, s->logits, n, sh->n_expert, K, s->ids, s->wts);
    block_moe_experts(be, w, sh, s->ids, s->a, E, n, MOE_GLU_SWIGLU, s->gu, s->ye);
    backend_side_join(be);
    be->moe_sum(be, s->ye, s->wts, s->ids, NULL, n, K, E, s->sh, s->sh_gate, out);
}

void block_gated_attn(const struct block_ctx *c, const struct gated_attn_weights *w, const struct attn_shape *sh,
                      const struct kv_view *kv, const struct block_in *in, int n, float *out) {
    struct backend *be = c->be;
    const struct block_scratch *s = c->s;
    const int D = sh->head_dim, H = sh->n_head, KV = sh->n_head_kv * D;
    const struct bweight *ws[3] = {&w->q, &w->k, &w->v};
    float *ys[3] = {s->qg, s->k, s->v};
    block_matmul_n(c, in, ws, ys, 3, n);
    /* q rows hold [q_h ; gate_h] per head: per-head norm over the first D of every 2D */
    const struct attn_prep_in prep = {.q = s->qg, .q_stride = 2 * H * D, .q_head_stride = 2 * D, .q_norm = w->q_norm,
                                      .k = s->k, .k_stride = KV, .k_norm = w->k_norm, .v = s->v, .v_stride = KV,
                                      .eps = c->eps, .n_head = H, .n_rot = sh->n_rot, .rope_base = sh->rope_base};
    be->attn_prep(be, &prep, n, c->meta->pos, c->meta->cells, kv);
    be->attention(be, s->qg, 2 * H * D, 2 * D, kv, c->meta->cell0, c->meta->nctx, n, H, 1.0f / sqrtf((float)D),
                  s->att);
    backend_matmul(be, &w->o,
                   &(struct matmul_in){.kind = MATMUL_SIGMOID_GATE, .x = s->att, .m = s->qg + D, .dim = D,
                                       .gate_stride = 2 * H * D, .gate_head_stride = 2 * D, .a = s->att},
                   n, out);
    be->all_reduce(be, out, (int64_t)n * w->o.n_out); /* a rank's heads: a partial sum */
}

void block_delta_net(const struct block_ctx *c, const struct delta_net_weights *w, const struct delta_net_shape *sh,
                     const struct rec_state *rec, int il, const struct block_in *in, const struct slice *sl, bool keep,
                     float *out) {
    struct backend *be = c->be;
    const struct block_scratch *s = c->s;
    const int n = sl->n, ch = sh->n_ch;
    const struct bweight *ws[4] = {&w->qkv, &w->gate, &w->beta, &w->alpha};
    float *ys[4] = {s->qkv, s->z, s->bet, s->alp};
    block_matmul_n(c, in, ws, ys, 4, n);
    /* every run's conv in one call, then the delta rule: long runs not kept (prompts) in the
     * chunked form, the others stepwise, each form one call for all its runs */
    struct state_run conv[BATCH_MAX_RUNS], rule[BATCH_MAX_RUNS];
    int n_chunked = 0, n_step = 0;
    const bool pend = be->gdn_pending;
    for (int r = 0; r < sl->n_runs; r++) {
        const struct run *ru = &sl->runs[r];
        /* the state after the run's last token is the live state: snapshot the others only; a
         * kept run's last delta-rule row is left pending where the backend can (state_run) */
        const bool defer = keep && pend;
        const int n_snap = keep ? COTI_MIN(ru->len - 1, rec->n_keep) : 0;
        const int n_snap_rule = keep ? COTI_MIN(ru->len - 1 - defer, rec->n_keep) : 0;
        conv[r] = (struct state_run){ru->start, ru->len, r, n_snap, false};
        const struct state_run g = {ru->start, ru->len, r, COTI_MAX(n_snap_rule, 0), defer};
        /* chunked runs from the front, stepwise ones from the back */
        if (ru->len >= DELTA_NET_CHUNKED_MIN_RUN && !keep) rule[n_chunked++] = g;
        else rule[sl->n_runs - 1 - n_step++] = g;
    }
    /* the states by the runs' sequences as uploaded (batch.h run_seq): a graph of these ops
     * serves any sequences */
    const struct state_set conv_st = rec_conv_set(rec, il, c->meta->run_seq), rule_st = rec_ssm_set(rec, il, c->meta->run_seq);
    be->ssm_conv(be, s->qkv, ch, sh->conv_k, w->conv, s->y, &conv_st, conv, sl->n_runs);
    const struct gdn_gates gates = {s->alp, s->bet, w->dt_bias, w->a, sh->nv, sh->nv};
    if (n_chunked)
        be->gdn_chunked(be, s->y, ch, &gates, sh->nk, sh->nv, sh->dk, sh->dv, c->eps, s->o, &rule_st, rule, n_chunked);
    if (n_step)
        be->gdn(be, s->y, ch, &gates, sh->nk, sh->nv, sh->dk, sh->dv, c->eps, s->o, &rule_st, rule + sl->n_runs - n_step,
                n_step);
    backend_matmul(be, &w->out,
                   &(struct matmul_in){.kind = MATMUL_GATED_NORM, .x = s->o, .m = s->z, .w = w->norm, .dim = sh->dv,
                                       .eps = c->eps, .a = s->og},
                   n, out);
    be->all_reduce(be, out, (int64_t)n * w->out.n_out); /* a rank's v-heads: a partial sum */
}

/* lm_head over the rows of hidden that want logits: straight from hidden when they are
 * consecutive (the last row, a verify batch), else gathered first. In the decode kernels
 * whatever the pass's family: they give a row what it gives in any batch, and a prompt's one
 * row of logits took 3.5 % of the 9B's pp512 in the f16 prompt kernel (H100). */
int block_lm_head(struct engine *e, const struct slice_ops_args *a) {
    struct backend *be = e->m->be;
    const int E = e->n_embd, n = a->sl->n;
    int n_out = 0, first = -1, last = -1;
    for (int i = 0; i < n; i++) {
        if (!row_wants_logits(a->want, a->last_only, n, i)) continue;
        if (first < 0) first = i;
        last = i;
        n_out++;
    }
    if (!n_out) return 0;
    if (a->prompt && be->set_prompt) be->set_prompt(be, 0);
    if (last - first + 1 == n_out) {
        backend_matmul(be, a->head, &(struct matmul_in){.kind = MATMUL_PLAIN, .x = a->hn + (size_t)first * E}, n_out,
                       a->logits);
    } else {
        n_out = 0;
        for (int i = 0; i < n; i++) {
            if (!row_wants_logits(a->want, a->last_only, n, i)) continue;
            be->copy(be, e->lm_in + (size_t)n_out * E, a->hn + (size_t)i * E, sizeof(float) * E);
            n_out++;
        }
        backend_matmul(be, a->head, &(struct matmul_in){.kind = MATMUL_PLAIN, .x = e->lm_in}, n_out, a->logits);
    }
    if (a->prompt && be->set_prompt) be->set_prompt(be, a->prompt);
    if (e->softcap > 0.0f) be->softcap(be, a->logits, (int64_t)n_out * e->n_vocab, e->softcap);
    if (a->argmax_out) {
        be->argmax(be, a->logits, n_out, e->n_vocab, a->argmax_out, NULL);
        if (a->accept_out) be->accept_greedy(be, a->ids + 1, a->argmax_out, n - 1, a->accept_out);
    }
    return n_out;
}
