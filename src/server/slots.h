/* slots.h — the engine side of the server. One engine thread owns the model, the backend
 * and the speculative driver (none of them is thread-safe) and runs every slot: a slot is one
 * model sequence, and the engine round-robins one speculative cycle per busy slot. HTTP
 * threads hand it tasks through a FIFO queue (mutex + condvar); each task carries its own
 * channel (mutex + condvar) through which the engine streams text pieces back and finally
 * the result. Requests beyond the number of slots wait in the queue. Cancelling a task (the
 * client went away) frees its slot before the next cycle. Stop strings and end-of-generation
 * tokens are detected here, on the engine side, so a stopped request stops costing cycles. */
#ifndef COTI_SERVER_SLOTS_H
#define COTI_SERVER_SLOTS_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "sample.h"
#include "spec.h"
#include "tokenizer.h"

struct metrics;

/* Tasks waiting for a slot, at most (503 beyond). The HTTP daemon's connection limit keeps
 * the real queue far below this; the cap only bounds memory if that limit is raised. */
#define SLOTS_MAX_QUEUED 4096

/* What the engine needs to run one request. */
struct gen_params {
    struct sampler_params sp;    /* its bias list is owned (gen_params_free) */
    struct spec_params spec;
    int n_predict;               /* -1: until end of generation or a full context */
    bool ignore_eos;             /* end-of-generation tokens do not stop (they render as "") */
    bool cache_prompt;           /* reuse the slot's state when it is a prefix of the prompt */
    char **stop;                 /* owned; matched across token boundaries, never emitted */
    int n_stop;
    int n_probs;                 /* log-probabilities with this many alternatives per token
                                    (0..SPEC_MAX_TOP_LOGPROBS); < 0: none */
    int reuse_mark;              /* a prompt position later requests may share up to (a chat's
                                    last message starts there): the prefill checkpoints it; 0: none */
    /* constrained decoding (grammar, json_schema, response_format): the GBNF and its compiled
     * form, both owned (NULL: none); spec.grammar points at it. End-of-generation tokens end
     * a constrained output even with ignore_eos (the grammar accepts nothing after one). */
    char *grammar_text;
    struct grammar *grammar;
};
void gen_params_free(struct gen_params *g);

enum stop_type { STOP_TYPE_NONE = 0, STOP_TYPE_EOS, STOP_TYPE_LIMIT, STOP_TYPE_WORD };
const char *stop_type_name(enum stop_type t);  /* "none" "eos" "limit" "word" */

struct task_result {
    int status;                  /* 0: generated; else the HTTP status of the failure */
    char message[256];
    enum stop_type stop_type;
    int stop_index;              /* STOP_TYPE_WORD: index into gen_params.stop */
    bool cancelled;
    int id_slot;
    int n_prompt;                /* prompt tokens = cache_n + prompt_n */
    int cache_n, prompt_n, predicted_n;
    long draft_n, draft_n_accepted;
    double prompt_ms, predicted_ms;
    int tokens_cached;           /* tokens held by the slot afterwards */
};

/* Text released at one generated token: text bytes [off, off + len) of the chunk's text.
 * Every generated token yields one piece (possibly empty while a stop string or a UTF-8
 * sequence is held back); id -1 marks text released without a token. */
struct task_piece {
    int32_t id;
    size_t off, len;
    int prob;                    /* index into the chunk's probs, -1: none (gen_params.n_probs) */
};

/* What the HTTP side takes from a task's channel; task_take appends to it. */
struct task_chunk {
    char *text;
    size_t n_text, cap_text;
    struct task_piece *pieces;
    size_t n_pieces, cap_pieces;
    struct spec_token_prob *probs; /* the pieces' tokens' log-probabilities, when asked for */
    size_t n_probs, cap_probs;
    bool started;                /* the prompt has been processed (or the task failed) */
    int id_slot;                 /* with started: the slot running the task */
    bool done;                   /* result is valid; nothing more will come */
    struct task_result result;
    struct task_result progress; /* the numbers as of the latest pieces (timings_per_token) */
};
void task_chunk_clear(struct task_chunk *c); /* forget text and pieces, keep the buffers */
void task_chunk_free(struct task_chunk *c);

struct task;

/* A task over a copy of prompt[0..n_prompt) and of g (the task may outlive the request
 * that made it: a cancelled task ends at the engine's next cycle). Returns NULL when out of
 * memory. One reference is the caller's. */
struct task *task_new(const int32_t *prompt, int n_prompt, const struct gen_params *g);
void task_unref(struct task *t);
/* Ask the engine to stop the task at its next cycle (the client went away). */
void task_cancel(struct task *t);
long task_id(const struct task *t);
const struct gen_params *task_params(const struct task *t);
/* Wait up to timeout_ms for output; append what arrived to c and copy the flags (and the
 * result when done). Returns true if anything new arrived or the task is done. */
bool task_take(struct task *t, int timeout_ms, struct task_chunk *c);

/* A bell rung whenever any task hung on it has news (pieces, started, done): one taker of
 * several tasks (OpenAI's streamed n > 1) waits on it instead of on one task's channel. */
struct task_bell {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned long rings;
};
void task_bell_init(struct task_bell *b);
void task_bell_destroy(struct task_bell *b);
unsigned long task_bell_rings(struct task_bell *b);
/* Wait up to timeout_ms until b has rung more than `seen` times; true if it has. */
bool task_bell_wait(struct task_bell *b, unsigned long seen, int timeout_ms);
/* Hang t on b; NULL takes it off, after which t never touches b again (the task may outlive
 * its taker: a cancelled task ends at the engine's next cycle). */
void task_set_bell(struct task *t, struct task_bell *b);

/* What /slots shows of a slot (a snapshot). */
struct slot_view {
    int id;
    bool processing;
    long id_task;                /* -1: never ran a task */
    int n_prompt, n_prompt_processed, n_cache;
    int n_decoded, n_predict;
    bool has_new_line;
    struct sampler_params sp;
    struct spec_params spec;
    bool ignore_eos;
};

struct slots;

/* Start the engine thread over n_slots = m->n_seq sequences. Returns 0, or a negative
 * coti_err with a message. */
int slots_init(struct slots **out, struct model *m, struct spec_engine *e, const struct tokenizer *tok,
               struct metrics *mx, char *err, size_t err_size);
/* Stop the engine thread; tasks still queued or running finish with status 503 and later
 * submissions are refused. HTTP threads may still call in until slots_free. */
void slots_stop(struct slots *s);
/* Stop (if not yet) and free. No other thread may use s any more. */
void slots_free(struct slots *s);
/* Queue t (the slots take their own reference). Returns 0, or COTI_E_RANGE when the queue
 * is full or the server is shutting down (the task is then untouched). */
int slots_submit(struct slots *s, struct task *t);
/* t (not yet submitted) stays queued until first has begun, so that it can take first's
 * prompt from the memory (prefix reuse) instead of prefilling it alongside: OpenAI's n > 1. */
void task_after(struct task *t, struct task *first);
int slots_count(const struct slots *s);
/* Copy the slots' state into out[0..slots_count). */
void slots_view(struct slots *s, struct slot_view *out);

#endif
