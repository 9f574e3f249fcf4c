/* slots.c — the engine thread, the request queue and the per-task channels (see slots.h).
 * Only the engine thread touches the model, the backend and the speculative driver. Locks:
 * slots.mu guards the queue, the slot table's task pointers and the /slots views; each
 * task.mu guards that task's channel. The engine never holds both at once, so the order
 * between them cannot deadlock; a task.mu may be held while taking its bell's mutex (never
 * the other way round). Reference for the output rules (stop strings held back while
 * they may still match, incomplete UTF-8 held back, EOG never rendered): llama.cpp
 * tools/server/server-context.cpp process_token / find_stopping_strings. */
#include "server/slots.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine.h"
#include "server/metrics.h"

/* Rows of a prompt processed per engine cycle while other slots decode: at least this many,
 * or a quarter of n_batch. */
#define SLOTS_PREFILL_CHUNK_MIN 32

/* ------------------------------------------------------------------------------------------
 * Tasks and their channels */

struct task {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_int refs;
    atomic_bool cancel;
    long id;
    int32_t *prompt;
    int n_prompt;
    struct gen_params g;
    struct task_chunk out;       /* produced, not yet taken (guarded by mu) */
    struct task *next;           /* queue link (guarded by slots.mu) */
    struct task *after;          /* stays queued until this one has begun (task_after) */
    atomic_bool begun;           /* its prompt processing has started */
    struct task_bell *bell;      /* rung with cv when not NULL (guarded by mu) */
};

void gen_params_free(struct gen_params *g) {
    for (int i = 0; i < g->n_stop; i++) free(g->stop[i]);
    free(g->stop);
    g->stop = NULL;
    g->n_stop = 0;
    free((void *)g->sp.bias);
    g->sp.bias = NULL;
    g->sp.n_bias = 0;
    grammar_free(g->grammar);
    free(g->grammar_text);
    g->grammar = NULL;
    g->grammar_text = NULL;
    g->spec.grammar = NULL;
}

const char *stop_type_name(enum stop_type t) {
    return t == STOP_TYPE_EOS ? "eos" : t == STOP_TYPE_LIMIT ? "limit" : t == STOP_TYPE_WORD ? "word" : "none";
}

void task_chunk_clear(struct task_chunk *c) {
    c->n_text = 0;
    c->n_pieces = 0;
    c->n_probs = 0;
}

void task_chunk_free(struct task_chunk *c) {
    free(c->text);
    free(c->pieces);
    free(c->probs);
    memset(c, 0, sizeof *c);
}

/* Append len bytes as one piece of token id. Returns false when out of memory. */
static bool chunk_append(struct task_chunk *c, int32_t id, const char *text, size_t len, const struct spec_token_prob *prob) {
    if (!coti_grow(&c->text, &c->cap_text, c->n_text + len + 1, 1, 256) ||
        !coti_grow(&c->pieces, &c->cap_pieces, c->n_pieces + 1, sizeof *c->pieces, 16) ||
        (prob && !coti_grow(&c->probs, &c->cap_probs, c->n_probs + 1, sizeof *c->probs, 16)))
        return false;
    if (len) memcpy(c->text + c->n_text, text, len); /* text may be NULL when len == 0 */
    if (prob) c->probs[c->n_probs++] = *prob;
    c->pieces[c->n_pieces++] = (struct task_piece){id, c->n_text, len, prob ? (int)c->n_probs - 1 : -1};
    c->n_text += len;
    c->text[c->n_text] = 0;
    return true;
}

/* Deadline timeout_ms from now on CLOCK_MONOTONIC (the clock of the condition variables). */
static struct timespec deadline_in(int timeout_ms) {
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) { dl.tv_sec++; dl.tv_nsec -= 1000000000L; }
    return dl;
}

static void cond_init_monotonic(pthread_cond_t *cv) {
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
}

struct task *task_new(const int32_t *prompt, int n_prompt, const struct gen_params *g) {
    struct task *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->prompt = malloc(sizeof(int32_t) * (size_t)(n_prompt > 0 ? n_prompt : 1));
    t->g = *g;
    t->g.stop = calloc((size_t)(g->n_stop > 0 ? g->n_stop : 1), sizeof *t->g.stop);
    t->g.n_stop = 0;
    struct logit_bias *bias = g->sp.n_bias > 0 ? malloc(sizeof *bias * (size_t)g->sp.n_bias) : NULL;
    if (bias) memcpy(bias, g->sp.bias, sizeof *bias * (size_t)g->sp.n_bias);
    t->g.sp.bias = bias;
    t->g.sp.n_bias = bias ? g->sp.n_bias : 0;
    bool ok = t->prompt && t->g.stop && (g->sp.n_bias <= 0 || bias);
    for (int i = 0; ok && i < g->n_stop; i++) ok = (t->g.stop[t->g.n_stop++] = strdup(g->stop[i])) != NULL;
    /* the task compiles its own copy of the grammar (the request's goes with the request) */
    t->g.grammar_text = NULL;
    t->g.grammar = NULL;
    t->g.spec.grammar = NULL;
    if (ok && g->grammar_text) {
        ok = (t->g.grammar_text = strdup(g->grammar_text)) != NULL &&
             grammar_parse(&t->g.grammar, t->g.grammar_text, strlen(t->g.grammar_text), NULL, 0) == 0;
        t->g.spec.grammar = t->g.grammar;
    }
    if (!ok) {
        gen_params_free(&t->g);
        free(t->prompt);
        free(t);
        return NULL;
    }
    if (n_prompt > 0) memcpy(t->prompt, prompt, sizeof(int32_t) * (size_t)n_prompt);
    t->n_prompt = n_prompt;
    pthread_mutex_init(&t->mu, NULL);
    cond_init_monotonic(&t->cv);
    atomic_init(&t->refs, 1);
    atomic_init(&t->cancel, false);
    atomic_init(&t->begun, false);
    t->id = -1;
    return t;
}

static void task_ref(struct task *t) { atomic_fetch_add(&t->refs, 1); }

void task_after(struct task *t, struct task *first) {
    task_ref(first);
    t->after = first;
}

/* Whether t may take a slot: what it waits for has begun (or will never). */
static bool task_ready(const struct task *t) {
    return !t->after || atomic_load(&t->after->begun) || atomic_load(&t->after->cancel);
}

void task_unref(struct task *t) {
    if (!t || atomic_fetch_sub(&t->refs, 1) != 1) return;
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    task_unref(t->after);
    free(t->prompt);
    gen_params_free(&t->g);
    task_chunk_free(&t->out);
    free(t);
}

void task_cancel(struct task *t) { atomic_store(&t->cancel, true); }
long task_id(const struct task *t) { return t->id; }
const struct gen_params *task_params(const struct task *t) { return &t->g; }

bool task_take(struct task *t, int timeout_ms, struct task_chunk *c) {
    const struct timespec dl = deadline_in(timeout_ms);
    pthread_mutex_lock(&t->mu);
    while (t->out.n_pieces == 0 && !t->out.done && t->out.started == c->started) {
        if (pthread_cond_timedwait(&t->cv, &t->mu, &dl) == ETIMEDOUT) break;
    }
    bool news = t->out.n_pieces > 0 || t->out.done || t->out.started != c->started;
    bool ok = true;
    for (size_t i = 0; i < t->out.n_pieces && ok; i++) {
        const struct task_piece *p = &t->out.pieces[i];
        ok = chunk_append(c, p->id, t->out.text + p->off, p->len, p->prob >= 0 ? &t->out.probs[p->prob] : NULL);
    }
    task_chunk_clear(&t->out);
    c->started = t->out.started;
    c->id_slot = t->out.id_slot;
    c->done = t->out.done;
    c->result = t->out.result;
    c->progress = t->out.progress;
    pthread_mutex_unlock(&t->mu);
    if (!ok && !c->done) {
        /* the taker ran out of memory: end the task rather than lose text silently */
        task_cancel(t);
        c->done = true;
        c->result.status = 500;
        snprintf(c->result.message, sizeof c->result.message, "out of memory");
    }
    return news;
}

void task_bell_init(struct task_bell *b) {
    pthread_mutex_init(&b->mu, NULL);
    cond_init_monotonic(&b->cv);
    b->rings = 0;
}

void task_bell_destroy(struct task_bell *b) {
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
}

unsigned long task_bell_rings(struct task_bell *b) {
    pthread_mutex_lock(&b->mu);
    unsigned long n = b->rings;
    pthread_mutex_unlock(&b->mu);
    return n;
}

bool task_bell_wait(struct task_bell *b, unsigned long seen, int timeout_ms) {
    const struct timespec dl = deadline_in(timeout_ms);
    pthread_mutex_lock(&b->mu);
    while (b->rings == seen)
        if (pthread_cond_timedwait(&b->cv, &b->mu, &dl) == ETIMEDOUT) break;
    const bool rung = b->rings != seen;
    pthread_mutex_unlock(&b->mu);
    return rung;
}

void task_set_bell(struct task *t, struct task_bell *b) {
    pthread_mutex_lock(&t->mu);
    t->bell = b;
    pthread_mutex_unlock(&t->mu);
}

/* Wake t's taker; called with t->mu held (lock order: task.mu, then bell.mu). */
static void task_notify_locked(struct task *t) {
    pthread_cond_broadcast(&t->cv);
    if (!t->bell) return;
    pthread_mutex_lock(&t->bell->mu);
    t->bell->rings++;
    pthread_cond_broadcast(&t->bell->cv);
    pthread_mutex_unlock(&t->bell->mu);
}

/* Engine side of the channel. A piece is appended without waking the taker: a step emits up to
 * 1 + n_max tokens and wakes it once (task_wake), so the taker takes a step's pieces together
 * instead of a futex wake-up and a turn on the mutex per token. */
static bool task_emit(struct task *t, int32_t id, const char *text, size_t len, const struct spec_token_prob *prob,
                      const struct task_result *progress) {
    pthread_mutex_lock(&t->mu);
    bool ok = chunk_append(&t->out, id, text, len, prob);
    t->out.progress = *progress; /* with the piece: a taker never sees one without the other */
    pthread_mutex_unlock(&t->mu);
    return ok;
}

static void task_wake(struct task *t) {
    pthread_mutex_lock(&t->mu);
    task_notify_locked(t);
    pthread_mutex_unlock(&t->mu);
}

static void task_set_started(struct task *t, int id_slot) {
    pthread_mutex_lock(&t->mu);
    t->out.started = true;
    t->out.id_slot = id_slot;
    task_notify_locked(t);
    pthread_mutex_unlock(&t->mu);
}

static void task_set_done(struct task *t, const struct task_result *r) {
    pthread_mutex_lock(&t->mu);
    t->out.result = *r;
    if (!t->out.started) t->out.id_slot = r->id_slot;
    t->out.started = true;
    t->out.done = true;
    task_notify_locked(t);
    pthread_mutex_unlock(&t->mu);
}

/* ------------------------------------------------------------------------------------------
 * Slots */

struct slot {
    int id;
    struct task *t;              /* NULL when idle (written under slots.mu, read by the engine) */
    bool begun;                  /* the prompt has been processed */
    bool prefilling;             /* set up, its prompt being processed in steps (slot_prefill) */
    int64_t t_begin_us;          /* when its prompt processing started */
    /* generated text so far: stop strings are searched in it, [n_sent, n_text) is held back */
    char *text;
    size_t n_text, cap_text, n_sent;
    int n_decoded;               /* tokens taken (predicted_n) */
    int cache_n;
    int64_t t_first_us, t_last_us;
    double prompt_ms;
    bool state_ok;               /* the last driver call on this sequence succeeded, so its
                                    state matches spec_seq_tokens (prompt-cache reuse) */
    uint64_t last_used;          /* LRU among idle slots */
    int reuse_src, reuse_n;      /* picked for the task: take reuse_n prompt tokens from slot
                                    reuse_src's state (spec_seq_begin_reuse) */
};

struct slots {
    struct model *m;
    struct spec_engine *e;
    const struct tokenizer *tok;
    struct metrics *mx;
    int n;
    struct slot *slot;
    struct slot **stepping;      /* [n]: the engine thread's list of slots decoding this cycle */
    struct slot **prefilling;    /* [n]: ... and of those processing their prompts */
    struct slot_view *views;     /* guarded by mu */
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct task *q_head, *q_tail;
    int q_len, n_busy;
    bool shutdown;
    long next_id;
    uint64_t tick;
};

int slots_count(const struct slots *s) { return s->n; }

void slots_view(struct slots *s, struct slot_view *out) {
    pthread_mutex_lock(&s->mu);
    memcpy(out, s->views, sizeof *out * (size_t)s->n);
    pthread_mutex_unlock(&s->mu);
}

int slots_submit(struct slots *s, struct task *t) {
    pthread_mutex_lock(&s->mu);
    if (s->shutdown || s->q_len >= SLOTS_MAX_QUEUED) {
        pthread_mutex_unlock(&s->mu);
        return COTI_E_RANGE;
    }
    task_ref(t);
    t->id = s->next_id++;
    t->next = NULL;
    if (s->q_tail) s->q_tail->next = t;
    else s->q_head = t;
    s->q_tail = t;
    s->q_len++;
    metrics_set_load(s->mx, s->n_busy, s->q_len);
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

/* The idle slot for t (engine thread, under mu), and what it reuses: the prompt tokens any
 * slot's state (busy or idle, its last driver call good) can give (spec_seq_reusable: its own
 * continuation, a checkpoint, another slot's prefix), the most of them, taken by the idle slot
 * that holds them itself, else by the least recently used. NULL when every slot is busy. */
static struct slot *slots_pick(struct slots *s, const struct task *t) {
    struct slot *best = NULL;
    int best_n = -1, best_src = -1;
    for (int i = 0; i < s->n; i++) {
        struct slot *sl = &s->slot[i];
        if (sl->t) continue;
        int n = t->g.cache_prompt && sl->state_ok ? spec_seq_reusable(s->e, sl->id, sl->id, t->prompt, t->n_prompt, t->g.spec.drafter) : 0;
        if (!best || n > best_n || (n == best_n && sl->last_used < best->last_used)) {
            best = sl;
            best_n = n;
            best_src = sl->id;
        }
    }
    if (!best) return NULL;
    for (int j = 0; t->g.cache_prompt && j < s->n; j++) {
        const struct slot *src = &s->slot[j];
        if (src == best || !src->state_ok) continue;
        const int n = spec_seq_reusable(s->e, best->id, src->id, t->prompt, t->n_prompt, t->g.spec.drafter);
        if (n > best_n) {
            best_n = n;
            best_src = src->id;
        }
    }
    best->reuse_src = best_src;
    best->reuse_n = COTI_MAX(best_n, 0);
    return best;
}

static void slot_view_update(struct slots *s, struct slot *sl) {
    pthread_mutex_lock(&s->mu);
    struct slot_view *v = &s->views[sl->id];
    v->processing = sl->t != NULL;
    if (sl->t) {
        v->id_task = sl->t->id;
        v->n_prompt = sl->t->n_prompt;
        v->n_cache = sl->cache_n;
        v->n_prompt_processed = sl->begun ? sl->t->n_prompt - sl->cache_n : 0;
        v->n_decoded = sl->n_decoded;
        v->n_predict = sl->t->g.n_predict;
        /* sl->text is NULL until the first token's text: nothing generated yet */
        v->has_new_line = sl->n_text && memchr(sl->text, '\n', sl->n_text) != NULL;
        v->sp = sl->t->g.sp;
        v->spec = sl->t->g.spec;
        v->ignore_eos = sl->t->g.ignore_eos;
    }
    pthread_mutex_unlock(&s->mu);
}

/* The numbers of sl's task so far into r (ids, token counts, timings). */
static void slot_numbers(struct slots *s, struct slot *sl, struct task_result *r) {
    struct task *t = sl->t;
    const struct spec_stats *st = spec_seq_stats(s->e, sl->id);
    int n_hist = 0;
    spec_seq_tokens(s->e, sl->id, &n_hist);
    r->id_slot = sl->id;
    r->n_prompt = t->n_prompt;
    r->cache_n = sl->begun ? sl->cache_n : 0;
    r->prompt_n = sl->begun ? t->n_prompt - sl->cache_n : 0;
    r->predicted_n = sl->n_decoded;
    r->draft_n = sl->begun ? st->n_drafted : 0;
    r->draft_n_accepted = sl->begun ? st->n_accepted : 0;
    r->prompt_ms = sl->begun ? sl->prompt_ms : 0.0;
    /* llama.cpp keeps predicted_ms >= 1 us so the per-token rates stay finite */
    r->predicted_ms = sl->begun ? COTI_MAX((sl->t_last_us - sl->t_first_us) / 1e3, 1e-3) : 0.0;
    r->tokens_cached = sl->begun && sl->state_ok ? n_hist - 1 : 0;
}

/* End sl's task with r (status 0 = generated): fill the numbers, hand the result over, free
 * the slot and count it. */
static void slot_finish(struct slots *s, struct slot *sl, struct task_result *r) {
    struct task *t = sl->t;
    const struct spec_stats *st = spec_seq_stats(s->e, sl->id);
    int n_hist = 0;
    spec_seq_tokens(s->e, sl->id, &n_hist);
    slot_numbers(s, sl, r);
    struct metrics_task mt = {.cancelled = r->cancelled, .failed = r->status >= 500, .prompt_n = r->prompt_n,
                              .cache_n = r->cache_n, .predicted_n = r->predicted_n, .n_ctx_used = sl->begun ? n_hist : 0,
                              .prompt_s = r->prompt_ms / 1e3, .predicted_s = r->predicted_n ? r->predicted_ms / 1e3 : 0.0};
    if (sl->begun) {
        mt.drafts = st->n_verify;
        mt.draft_n = st->n_drafted;
        mt.accepted = st->n_accepted;
        for (int i = 0; i < SPEC_MAX_DRAFT; i++) mt.accepted_at[i] = st->accepted_at[i];
    }
    metrics_count_task(s->mx, &mt);
    task_set_done(t, r);
    sl->last_used = ++s->tick;
    slot_view_update(s, sl);
    pthread_mutex_lock(&s->mu);
    sl->t = NULL;
    s->views[sl->id].processing = false;
    s->n_busy--;
    metrics_set_load(s->mx, s->n_busy, s->q_len);
    pthread_mutex_unlock(&s->mu);
    task_unref(t);
}

static void slot_fail(struct slots *s, struct slot *sl, int status, const char *msg) {
    struct task_result r = {.status = status};
    snprintf(r.message, sizeof r.message, "%s", msg);
    slot_finish(s, sl, &r);
}

/* Release generated text [n_sent, upto) as the piece of token id, with the numbers so far
 * (timings_per_token reads them). */
static bool slot_release(struct slots *s, struct slot *sl, int32_t id, size_t upto, const struct spec_token_prob *prob) {
    struct task_result now = {.stop_type = STOP_TYPE_NONE, .stop_index = -1};
    slot_numbers(s, sl, &now);
    /* no pointer arithmetic on a NULL text (nothing generated yet) */
    bool ok = task_emit(sl->t, id, upto > sl->n_sent ? sl->text + sl->n_sent : "", upto - sl->n_sent, prob, &now);
    sl->n_sent = upto;
    return ok;
}

/* Length of the longest suffix of text[from, n) that is a proper prefix of a stop string:
 * that much must be held back, since the next token may complete the stop string. */
static size_t stop_partial_len(const struct gen_params *g, const char *text, size_t from, size_t n) {
    size_t best = 0;
    for (int i = 0; i < g->n_stop; i++) {
        size_t ls = strlen(g->stop[i]);
        for (size_t k = COTI_MIN(ls - 1, n - from); k > best; k--) {
            if (memcmp(text + n - k, g->stop[i], k) == 0) {
                best = k;
                break;
            }
        }
    }
    return best;
}

/* End of the longest prefix of text[0, n) that does not end inside a UTF-8 sequence whose
 * continuation bytes have not arrived yet (a token may carry half a character). */
static size_t utf8_complete_end(const char *text, size_t n) {
    for (size_t back = 1; back <= 4 && back <= n; back++) {
        unsigned char c = (unsigned char)text[n - back];
        if ((c & 0xC0) == 0x80) continue;           /* continuation: look further back */
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > back ? n - back : n;
    }
    return n;
}

static bool text_reserve(struct slot *sl, size_t add) {
    return coti_grow(&sl->text, &sl->cap_text, sl->n_text + add + 1, 1, 1024);
}

/* Take one generated token: render it, look for stop strings and release what is safe.
 * Returns true when the task has ended (slot_finish has run). */
static bool slot_take_token(struct slots *s, struct slot *sl, int32_t id, const struct spec_token_prob *prob) {
    const struct gen_params *g = &sl->t->g;
    sl->n_decoded++;
    sl->t_last_us = coti_time_us();
    struct task_result r = {.stop_type = STOP_TYPE_NONE, .stop_index = -1};
    if ((!g->ignore_eos || g->grammar) && tokenizer_is_eog(s->tok, id)) {
        r.stop_type = STOP_TYPE_EOS;
        if (!slot_release(s, sl, id, sl->n_text, prob)) goto oom;
        slot_finish(s, sl, &r);
        return true;
    }
    const char *piece = "";
    size_t len = 0;
    tokenizer_token_to_piece(s->tok, id, false, &piece, &len);
    if (!text_reserve(sl, len)) goto oom;
    memcpy(sl->text + sl->n_text, piece, len);
    sl->n_text += len;
    sl->text[sl->n_text] = 0;

    /* the earliest complete stop string ends the text where it starts */
    size_t stop_at = SIZE_MAX;
    for (int i = 0; i < g->n_stop; i++) {
        size_t ls = strlen(g->stop[i]);
        const char *p = memmem(sl->text + sl->n_sent, sl->n_text - sl->n_sent, g->stop[i], ls);
        if (p && (size_t)(p - sl->text) < stop_at) {
            stop_at = (size_t)(p - sl->text);
            r.stop_index = i;
        }
    }
    if (stop_at != SIZE_MAX) {
        sl->n_text = stop_at;
        r.stop_type = STOP_TYPE_WORD;
        if (!slot_release(s, sl, id, stop_at, prob)) goto oom;
        slot_finish(s, sl, &r);
        return true;
    }
    if (g->n_predict >= 0 && sl->n_decoded >= g->n_predict) {
        r.stop_type = STOP_TYPE_LIMIT;
        if (!slot_release(s, sl, id, sl->n_text, prob)) goto oom;
        slot_finish(s, sl, &r);
        return true;
    }
    size_t safe = sl->n_text - stop_partial_len(g, sl->text, sl->n_sent, sl->n_text);
    safe = COTI_MAX(utf8_complete_end(sl->text, safe), sl->n_sent);
    if (!slot_release(s, sl, id, safe, prob)) goto oom;
    return false;
oom:
    slot_fail(s, sl, 500, "out of memory");
    return true;
}

/* Room left in the context for generated tokens (the driver's history must stay < n_ctx). */
static int slot_room(struct slots *s, struct slot *sl) {
    return s->m->n_ctx - (sl->t->n_prompt + sl->n_decoded);
}

/* Slot sl's prompt could not be processed (rc, err). Parameters and sizes were checked by the
 * HTTP side: what is left is the engine's. */
static void slot_prompt_failed(struct slots *s, struct slot *sl, int rc, const char *err) {
    coti_log(COTI_LOG_ERROR, "server", "task %ld: slot %d: prompt processing failed: %s", sl->t->id, sl->id, err);
    slot_fail(s, sl, rc == COTI_E_RANGE || rc == COTI_E_ARG || rc == COTI_E_UNSUPPORTED ? 400 : 500, err);
}

/* A slot's new task: its sequence set up, taking what slots_pick chose to reuse; the prompt
 * itself is processed by slot_prefill. */
static void slot_begin(struct slots *s, struct slot *sl) {
    struct task *t = sl->t;
    atomic_store(&t->begun, true);
    char err[256];
    sl->n_text = sl->n_sent = 0;
    sl->n_decoded = 0;
    sl->cache_n = 0;
    sl->t_begin_us = coti_time_us();
    /* what slots_pick chose to reuse (only states the driver left consistent); the prefill
     * leaves checkpoints for later requests */
    const int n_mark = t->g.reuse_mark > 0 && t->g.reuse_mark < t->n_prompt ? 1 : 0;
    spec_seq_want_probs(s->e, sl->id, t->g.n_probs);
    int rc = spec_seq_start_reuse(s->e, sl->id, sl->reuse_src, sl->reuse_n, t->prompt, t->n_prompt, &t->g.reuse_mark,
                                  n_mark, &t->g.sp, &t->g.spec, &sl->cache_n, err, sizeof err);
    sl->state_ok = rc == 0;
    sl->prefilling = rc == 0;
    if (rc) slot_prompt_failed(s, sl, rc, err);
}

/* Slot sl's prefill went (rc, done, first): at its prompt's end the first token goes out. */
static void slot_prefilled(struct slots *s, struct slot *sl, int rc, bool done, int32_t first, const char *err) {
    struct task *t = sl->t;
    sl->state_ok = rc == 0;
    if (rc) {
        slot_prompt_failed(s, sl, rc, err);
        return;
    }
    if (!done) return;
    sl->prefilling = false;
    sl->t_first_us = sl->t_last_us = coti_time_us();
    sl->prompt_ms = (sl->t_first_us - sl->t_begin_us) / 1e3;
    sl->begun = true;
    task_set_started(t, sl->id);
    if (t->g.n_predict == 0) {
        /* evaluate the prompt only: the sampled token is not part of the answer */
        struct task_result r = {.stop_type = STOP_TYPE_LIMIT, .stop_index = -1};
        slot_finish(s, sl, &r);
        return;
    }
    const struct spec_token_prob *probs = spec_seq_probs(s->e, sl->id);
    if (slot_take_token(s, sl, first, probs ? &probs[0] : NULL)) return;
    task_wake(t);
    slot_view_update(s, sl);
}

/* Up to max_rows more of the prompt of each slot in sl[0, n): together, in shared forwards
 * (prompts that arrive together are computed together). */
static void slots_prefill(struct slots *s, struct slot **sl, int n, int max_rows) {
    for (int i0 = 0; i0 < n; i0 += SPEC_MAX_BATCH) {
        const int m = COTI_MIN(n - i0, SPEC_MAX_BATCH);
        int seqs[SPEC_MAX_BATCH], rc[SPEC_MAX_BATCH];
        int32_t first[SPEC_MAX_BATCH];
        bool done[SPEC_MAX_BATCH];
        char err[256];
        for (int i = 0; i < m; i++) seqs[i] = sl[i0 + i]->id;
        if (spec_seqs_prefill(s->e, m, seqs, max_rows, first, done, rc, err, sizeof err))
            for (int i = 0; i < m; i++) rc[i] = COTI_E_ARG, done[i] = false;
        for (int i = 0; i < m; i++) slot_prefilled(s, sl[i0 + i], rc[i], done[i], first[i], err);
    }
}

/* How many tokens slot sl's next step may emit; 0 when its context is full, which ends it as if
 * n_predict were reached (server-api.md §6 "Stops"). */
static int slot_max_new(struct slots *s, struct slot *sl) {
    int room = slot_room(s, sl);
    if (room <= 0) {
        struct task_result r = {.stop_type = STOP_TYPE_LIMIT, .stop_index = -1};
        slot_release(s, sl, -1, sl->n_text, NULL);
        slot_finish(s, sl, &r);
        return 0;
    }
    return sl->t->g.n_predict < 0 ? room : COTI_MIN(room, sl->t->g.n_predict - sl->n_decoded);
}

/* A step's outcome for slot sl: rc, and the n_out tokens in out. */
static void slot_took_step(struct slots *s, struct slot *sl, int rc, const int32_t *out, int n_out, const char *err) {
    struct task *t = sl->t;
    sl->state_ok = rc == 0;
    if (rc) {
        coti_log(COTI_LOG_ERROR, "server", "task %ld: slot %d: decoding failed: %s", t->id, sl->id, err);
        slot_fail(s, sl, 500, err);
        return;
    }
    const struct spec_token_prob *probs = spec_seq_probs(s->e, sl->id);
    for (int i = 0; i < n_out; i++)
        if (slot_take_token(s, sl, out[i], probs ? &probs[i] : NULL)) return;
    task_wake(t);
    slot_view_update(s, sl);
}

/* One step of every slot in busy[0, n) (begun, not cancelled; n <= SPEC_MAX_BATCH): a single
 * batched cycle, each weight read once for all of them. */
static void slots_step_group(struct slots *s, struct slot **busy, int n) {
    int seqs[SPEC_MAX_BATCH], max_new[SPEC_MAX_BATCH], n_out[SPEC_MAX_BATCH], rc[SPEC_MAX_BATCH];
    int32_t out[SPEC_MAX_BATCH][SPEC_MAX_DRAFT + 1];
    struct slot *go[SPEC_MAX_BATCH];
    int m = 0;
    for (int i = 0; i < n; i++) {
        const int k = slot_max_new(s, busy[i]);
        if (k < 1) continue;
        go[m] = busy[i];
        seqs[m] = busy[i]->id;
        max_new[m++] = k;
    }
    char err[256];
    if (m > 1) {
        if (spec_step_batch(s->e, m, seqs, max_new, out, n_out, rc, NULL, err, sizeof err))
            for (int i = 0; i < m; i++) rc[i] = COTI_E_ARG;
        metrics_count_batch(s->mx, m);
        for (int i = 0; i < m; i++) slot_took_step(s, go[i], rc[i], out[i], n_out[i], err);
        return;
    }
    if (m == 1) {
        rc[0] = spec_seq_step(s->e, seqs[0], max_new[0], out[0], &n_out[0], NULL, err, sizeof err);
        slot_took_step(s, go[0], rc[0], out[0], n_out[0], err);
    }
}

/* One step of every slot in busy[0, n): in groups of at most SPEC_MAX_BATCH (slots_step_group). */
static void slots_step(struct slots *s, struct slot **busy, int n) {
    for (int i0 = 0; i0 < n; i0 += SPEC_MAX_BATCH) slots_step_group(s, busy + i0, COTI_MIN(n - i0, SPEC_MAX_BATCH));
}

/* Fail every queued task and every running one: the server is going away. */
static void slots_drain(struct slots *s) {
    for (int i = 0; i < s->n; i++)
        if (s->slot[i].t) slot_fail(s, &s->slot[i], 503, "the server is shutting down");
    pthread_mutex_lock(&s->mu);
    struct task *t = s->q_head;
    s->q_head = s->q_tail = NULL;
    s->q_len = 0;
    pthread_mutex_unlock(&s->mu);
    while (t) {
        struct task *next = t->next;
        struct task_result r = {.status = 503, .stop_index = -1, .id_slot = -1};
        snprintf(r.message, sizeof r.message, "the server is shutting down");
        task_set_done(t, &r);
        task_unref(t);
        t = next;
    }
}

static void *slots_engine_main(void *arg) {
    struct slots *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->shutdown && s->n_busy == 0 && !s->q_head) pthread_cond_wait(&s->cv, &s->mu);
        if (s->shutdown) {
            pthread_mutex_unlock(&s->mu);
            break;
        }
        /* hand queued tasks to idle slots, oldest first */
        struct slot *sl;
        while (s->q_head && task_ready(s->q_head) && (sl = slots_pick(s, s->q_head))) {
            struct task *t = s->q_head;
            s->q_head = t->next;
            if (!s->q_head) s->q_tail = NULL;
            s->q_len--;
            sl->t = t;
            sl->begun = false;
            sl->prefilling = false;
            s->n_busy++;
        }
        metrics_set_load(s->mx, s->n_busy, s->q_len);
        pthread_mutex_unlock(&s->mu);

        /* one cycle of every busy slot (those decoding together); sl->t is only cleared by
         * this thread */
        int n_busy = 0, n_step = 0, n_prefill = 0;
        for (int i = 0; i < s->n; i++) {
            sl = &s->slot[i];
            if (!sl->t) continue;
            n_busy++;
            if (atomic_load(&sl->t->cancel)) {
                struct task_result r = {.cancelled = true, .stop_index = -1};
                slot_finish(s, sl, &r);
            } else if (!sl->begun) {
                if (!sl->prefilling) slot_begin(s, sl);
                if (sl->prefilling) s->prefilling[n_prefill++] = sl;
            } else {
                s->stepping[n_step++] = sl;
            }
        }
        slots_step(s, s->stepping, n_step);
        /* prompts after the decoding slots' step, in chunks while any slot decodes (a long
         * prompt then delays the others by a chunk per cycle, not by all of it), whole when
         * none does */
        const int chunk = n_step ? COTI_MAX(SLOTS_PREFILL_CHUNK_MIN, s->m->n_batch / 4) : INT_MAX;
        slots_prefill(s, s->prefilling, n_prefill, chunk);
        if (n_busy) {
            const struct graph_stats gs = engine_graph_stats(s->m);
            metrics_count_decode(s->mx, n_busy, &gs);
        }
    }
    slots_drain(s);
    return NULL;
}

int slots_init(struct slots **out, struct model *m, struct spec_engine *e, const struct tokenizer *tok,
               struct metrics *mx, char *err, size_t err_size) {
    struct slots *s = calloc(1, sizeof *s);
    if (!s) return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory");
    s->m = m;
    s->e = e;
    s->tok = tok;
    s->mx = mx;
    s->n = m->n_seq;
    s->slot = calloc((size_t)s->n, sizeof *s->slot);
    s->views = calloc((size_t)s->n, sizeof *s->views);
    s->stepping = calloc((size_t)s->n, sizeof *s->stepping);
    s->prefilling = calloc((size_t)s->n, sizeof *s->prefilling);
    if (!s->slot || !s->views || !s->stepping || !s->prefilling) {
        free(s->slot);
        free(s->views);
        free(s->stepping);
        free(s->prefilling);
        free(s);
        return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory");
    }
    for (int i = 0; i < s->n; i++) {
        s->slot[i].id = i;
        s->views[i].id = i;
        s->views[i].id_task = -1;
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    int rc = pthread_create(&s->thread, NULL, slots_engine_main, s);
    if (rc) {
        slots_free(s);
        return coti_fail(err, err_size, COTI_E_NOMEM, "cannot start the engine thread: %s", strerror(rc));
    }
    s->thread_started = true;
    *out = s;
    return 0;
}

void slots_stop(struct slots *s) {
    if (!s || !s->thread_started) return;
    pthread_mutex_lock(&s->mu);
    s->shutdown = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    s->thread_started = false;
}

void slots_free(struct slots *s) {
    if (!s) return;
    slots_stop(s);
    for (int i = 0; i < s->n; i++) free(s->slot[i].text);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->slot);
    free(s->views);
    free(s->stepping);
    free(s->prefilling);
    free(s);
}
