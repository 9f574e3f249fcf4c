/* tools.h — OpenAI tool calling for a chat template that defines it (chat_defines_tools: the
 * Hermes / Qwen3 format): the request's `tools` and `tool_choice`, the history's tool calls as
 * the chat layer renders them, and the answer's <tool_call> blocks parsed back into OpenAI's
 * `tool_calls` (non-streamed and streamed). JSON shapes: ../shared/docs/server-api.md §3.3, §4.3. */
#ifndef COTI_SERVER_TOOLS_H
#define COTI_SERVER_TOOLS_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>

#include "chat.h"

struct openai_error;

/* The tools of one request. active: declarations were given and tool_choice is not "none" (the
 * prompt lists them and the answer is parsed for calls). */
struct tool_set {
    char **decls;                /* each declaration as the template's `tojson` writes it */
    int n;
    bool active;
    /* tool_choice "required" or a named function: GBNF that admits only <tool_call> blocks
     * calling the allowed tools with arguments valid under their parameter schemas (one block
     * for a named function or parallel_tool_calls false, else one or more); NULL otherwise */
    char *forced_grammar;
};
void tool_set_free(struct tool_set *t);

/* `tools`, `tool_choice` and `parallel_tool_calls` of a chat body into t. template_has_tools:
 * the model's template defines tools (else a non-empty `tools` is a 400). A parameter schema
 * outside json_schema.h's subset is a 400 only when tool_choice forces a call. Returns 0 or
 * the HTTP status with e filled. */
int tools_parse_request(const cJSON *body, bool template_has_tools, struct tool_set *t, struct openai_error *e);

/* The `tool_calls` of message i (an assistant's) as chat calls: *calls malloc'ed (NULL when
 * none), names and arguments pointing into msg or into *owned (malloc'ed strings the caller
 * frees with free(), *n_owned of them). Returns 0 or the status with e filled. */
int tools_message_calls(const cJSON *msg, int i, struct chat_tool_call **calls, size_t *n_calls, char ***owned,
                        size_t *n_owned, struct openai_error *e);

/* Python's json.dumps(v) (", " and ": " separators, non-ASCII kept), which Jinja's tojson
 * writes; malloc'ed, NULL when out of memory. */
char *tools_json_dumps(const cJSON *v);

/* An answer's calls: <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call> blocks. */
struct tool_call_out {
    char *name, *arguments;      /* arguments: compact JSON text */
};
struct tool_calls_out {
    char *content;               /* the text outside the blocks, trimmed; NULL: none */
    size_t n_content;
    struct tool_call_out *calls;
    size_t n;
};
/* Parse text[0, n). No block, an unterminated one or one that is not a JSON object with a string
 * "name" leaves everything as content (n = 0), as a model that did not call a tool wrote it.
 * Returns false when out of memory. */
bool tools_parse_output(const char *text, size_t n, struct tool_calls_out *out);
void tool_calls_out_free(struct tool_calls_out *o);

/* Streaming: how many bytes of text[0, n) may be sent as content now: up to the first
 * "<tool_call>", and short of a trailing piece that may be the start of one. */
size_t tools_content_end(const char *text, size_t n);

/* The `tool_calls` array of a message or a delta (with "index" for a delta); call ids are
 * id_base + "_" + the call's index. NULL when out of memory. */
cJSON *tools_calls_json(const struct tool_calls_out *o, const char *id_base, bool delta);

#endif
