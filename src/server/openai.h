/* openai.h — the JSON shapes of the completion endpoints: request fields into gen_params and
 * prompt tokens, and the responses, stream chunks, timings, usage and errors of
 * /v1/chat/completions, /v1/completions and llama.cpp's native /completion
 * (../shared/docs/server-api.md §1, §3, §4, §5). Knows nothing of sockets or threads. */
#ifndef COTI_SERVER_OPENAI_H
#define COTI_SERVER_OPENAI_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>

#include "chat.h"
#include "server/slots.h"
#include "server/tools.h"
#include "spec.h"
#include "tokenizer.h"

/* Most stop strings per request, and the longest one: a stop string is searched for after
 * every token, so these bound that cost (llama.cpp has no limit; 64 x 1 KiB is far beyond
 * any real use and keeps the per-token search trivial). */
#define OPENAI_MAX_STOP 64
#define OPENAI_MAX_STOP_BYTES 1024
/* Most answers per request (`n`): each is a task of its own, queued after the first. */
#define OPENAI_MAX_CHOICES 16

enum openai_api {
    OPENAI_API_CHAT,             /* POST /v1/chat/completions */
    OPENAI_API_COMPLETIONS,      /* POST /v1/completions */
    OPENAI_API_NATIVE,           /* POST /completion (llama.cpp) */
};

/* An error answer: HTTP status = code, `type` as in server-api.md §1. */
struct openai_error {
    int status;
    const char *type;            /* "invalid_request_error", "not_found_error", ... */
    char message[512];
    int n_prompt_tokens, n_ctx;  /* exceed_context_size_error only */
};

/* Sets e and returns status (so callers can `return openai_error_set(...)`). */
int openai_error_set(struct openai_error *e, int status, const char *type, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* {"error": {"code", "message", "type"}} as a malloc'ed string (NULL when out of memory). */
char *openai_error_render(const struct openai_error *e);

/* Server-wide facts the parser and the formatters need (read-only, shared by threads). */
struct openai_ctx {
    const struct tokenizer *tok;
    const struct spec_engine *eng;   /* only spec_engine_supports is called: immutable state */
    const char *chat_template;       /* NULL: ChatML */
    const char *model_name;
    int n_ctx, n_vocab, n_parallel;
    int n_predict;                   /* default when the request has none */
    struct sampler_params sampling;  /* defaults */
    bool seed_fixed;                 /* else requests without a seed get a random one */
    struct spec_params spec;         /* defaults */
};

struct openai_request {
    enum openai_api api;
    struct gen_params g;
    int32_t *prompt;
    int n_prompt;
    bool stream;
    bool include_usage;          /* stream_options.include_usage */
    bool return_tokens;          /* native: "tokens" in the answer */
    bool timings_per_token;      /* streamed token events carry the timings so far */
    char id[48];                 /* chatcmpl-<32 alnum> */
    long created;                /* unix seconds */
    struct tool_set tools;       /* chat: the request's tools (tools.active: parse the answer) */
    int n_choices;               /* OpenAI's `n` (n_cmpl): independent answers, each its own task */
};
void openai_request_free(struct openai_request *r);

/* Parse a request body of api into r (tokenizing the prompt or rendering the chat). Returns 0,
 * or the HTTP status with e filled (400 for bad fields, prompt over the context, ...; r is
 * then freed). */
int openai_parse_request(const struct openai_ctx *c, enum openai_api api, const cJSON *body,
                         struct openai_request *r, struct openai_error *e);

/* Render a chat request's messages (and tools) into a prompt (the shared part of
 * /apply-template and /v1/chat/completions); *out owned by the caller (chat_prompt_free), and
 * *tools when not NULL (tool_set_free). Returns 0 or the HTTP status with e filled. */
int openai_render_chat(const struct openai_ctx *c, const cJSON *body, struct chat_prompt *out, struct tool_set *tools,
                       struct openai_error *e);

/* The prompt from /tokenize's `content` (string, or mixed array of strings and ids) or a
 * completion's `prompt`. max_tokens >= 0: more tokens than that is a 400
 * exceed_context_size_error, found without tokenizing the whole prompt; < 0: no limit.
 * Returns 0 or the status with e filled. *out malloc'ed. */
int openai_tokenize_prompt(const struct openai_ctx *c, const cJSON *v, const char *field, bool add_special,
                           bool parse_special, long max_tokens, int32_t **out, int *n_out, struct openai_error *e);

/* Add text[0..len) to obj under key as a JSON string, with invalid UTF-8 and NUL bytes replaced
 * by U+FFFD (what the client would see anyway; cJSON needs valid, NUL-free strings).
 * Returns false when out of memory. */
bool openai_add_text(cJSON *obj, const char *key, const char *text, size_t len);

/* Tokens with their log-probabilities (gen_params.n_probs): written as llama.cpp's entries
 * {id, token, bytes, logprob, top_logprobs: [{id, token, bytes, logprob}]} — in
 * `completion_probabilities` (native) or `choices[].logprobs.content` (chat, completions). */
struct token_probs {
    const int32_t *ids;
    const struct spec_token_prob *probs;
    size_t n;
};

/* The final, non-streamed answer to r: choice i generated x[i] (text, the tokens' ids for the
 * native return_tokens, tp their log-probabilities, NULL: not asked for); usage counts the
 * tokens of all n choices (the prompt once), the timings are choice 0's. The native shape
 * has one choice. A malloc'ed JSON string, NULL when out of memory. */
struct openai_choice {
    const char *text;
    size_t n_text;
    const int32_t *tokens;
    size_t n_tokens;
    const struct token_probs *tp;
    const struct task_result *res;
};
char *openai_render_final(const struct openai_ctx *c, const struct openai_request *r, const struct openai_choice *x,
                          int n);

/* Stream events, each the payload after "data: ", malloc'ed (NULL when out of memory). The
 * OpenAI shapes carry one choice each, of index `index` (n > 1: the choices' chunks
 * interleave as their tokens arrive); the native shape has only index 0. */
/* Text released at token id (n_predicted tokens so far, id_slot for the native shape; now:
 * the numbers so far, written as `timings` when the request asked for timings_per_token, may
 * be NULL; tp: the log-probabilities of the tokens it releases, NULL or empty when none). */
char *openai_render_chunk(const struct openai_ctx *c, const struct openai_request *r, int index, const char *text,
                          size_t len, int32_t id, int id_slot, int n_predicted, const struct task_result *now,
                          const struct token_probs *tp);
/* A chat choice's tool calls (delta.tool_calls). */
char *openai_render_chunk_tool_calls(const struct openai_ctx *c, const struct openai_request *r, int index,
                                     const struct tool_calls_out *calls);
/* A chat choice's first chunk: the assistant role with null content. */
char *openai_render_chunk_role(const struct openai_ctx *c, const struct openai_request *r, int index);
/* A choice's last chunk, with its finish_reason (tools_called: a chat answer that called
 * tools). Without stream_options.include_usage it carries res's timings, and on
 * /v1/completions res's usage too (as llama.cpp does); native: the full answer object with
 * empty content. */
char *openai_render_chunk_end(const struct openai_ctx *c, const struct openai_request *r, int index,
                              const struct task_result *res, bool tools_called);
/* With stream_options.include_usage, after every choice's last chunk: the usage of all the
 * choices res[0..n) (the prompt once) and the first one's timings, with no choices. */
char *openai_render_chunk_usage(const struct openai_ctx *c, const struct openai_request *r,
                                const struct task_result *const *res, int n);

/* llama.cpp's "timings" object (server-api.md §4.1). */
cJSON *openai_timings(const struct task_result *res);

#endif
