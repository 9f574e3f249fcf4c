/* chat.h — render OpenAI-style (role, content) messages into a prompt string with the
 * model's chat format. We do not run Jinja: the format is recognised from markers in
 * tokenizer.chat_template, like llama.cpp's llm_chat_detect_template, and rendered by
 * hand exactly as the shipped template would for plain-text messages, and for tool
 * declarations, calls and results where a ChatML template defines them (Qwen's).
 * Reference: ../shared/docs/server-api.md §6. */
#ifndef COTI_CHAT_H
#define COTI_CHAT_H

#include "common.h"

/* A tool call of an assistant message: the function's name and its arguments, JSON text as
 * the client sent it (OpenAI's `arguments` string). */
struct chat_tool_call {
    const char *name, *arguments;
};

struct chat_message {
    const char *role;        /* "system", "developer", "user", "assistant", "tool", ... */
    const char *content;     /* NULL renders as "" */
};

/* A request's tools: the declarations, each one JSON text written as the template's `tojson`
 * writes it (the server makes them), and the history's calls: message i (an assistant's) made
 * calls[i][0, n_calls[i]) (calls NULL: none made). */
struct chat_tools {
    const char *const *decls;
    size_t n;
    const struct chat_tool_call *const *calls;
    const size_t *n_calls;
};

enum chat_format {
    CHAT_FORMAT_UNKNOWN = 0,
    CHAT_FORMAT_CHATML,      /* <|im_start|>role\ncontent<|im_end|>\n (Qwen and others) */
    CHAT_FORMAT_GEMMA4,      /* <|turn>role\ncontent<turn|>\n (server-api.md §6.1) */
};

/* Format of a template: a name ("chatml", "gemma4") or Jinja text recognised by its markers
 * ('<|tool_call>call:' for Gemma 4; '<|im_start|>' without the Phi-4 / SmolVLM markers for
 * ChatML). NULL (the model has no template) gives ChatML, llama.cpp's fallback. */
enum chat_format chat_detect_format(const char *template_str);
const char *chat_format_name(enum chat_format f);

/* Render msgs[0..n) with template_str's format into a malloc'ed NUL-terminated *out.
 * Role "developer" is rendered as "system", as llama.cpp does before applying a template.
 * add_generation_prompt appends the opening of an assistant turn. enable_thinking matters
 * for Gemma 4 only (llama.cpp's default is true): it adds <|think|> to a system turn, and when
 * false the generation prompt pre-fills an empty thought block. Gemma 4's BOS is not written:
 * the caller tokenizes with add_special so the vocabulary adds it (server-api.md §6).
 * Returns 0; COTI_E_UNSUPPORTED for an unrecognised template (the caller may fall back to
 * "chatml") or a Gemma 4 "tool" message (tool calls are not modelled here); COTI_E_ARG for a
 * NULL role or msgs; COTI_E_NOMEM. On error *out is NULL. */
int chat_apply(const char *template_str, const struct chat_message *msgs, size_t n, bool add_generation_prompt,
               bool enable_thinking, char **out, char *err, size_t err_size);

/* A range [off, off + len) of a rendered prompt that came from a message (its content or its
 * role), not from the template: the caller tokenizes it with special-token parsing off, so
 * text such as "<|im_start|>system" inside a message stays text (issue 30 item 6). */
struct chat_span {
    size_t off, len;
};

/* A rendered prompt: text[0..n_text) (NUL-terminated) and its message spans, in order and
 * disjoint. */
struct chat_prompt {
    char *text;
    size_t n_text;
    struct chat_span *spans;
    size_t n_spans;
};
void chat_prompt_free(struct chat_prompt *p);

/* chat_apply that also says which bytes came from the messages. Same arguments and errors;
 * on error *out is zeroed. */
int chat_render(const char *template_str, const struct chat_message *msgs, size_t n, bool add_generation_prompt,
                bool enable_thinking, struct chat_prompt *out, char *err, size_t err_size);

/* Whether the template defines tool calls in the Hermes / Qwen3 way: ChatML whose text has
 * <tool_call> (Qwen2.5, Qwen3 and their fine-tunes). Tools then render as that template does:
 * a "# Tools" system block listing the declarations, an assistant's calls as
 * <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>, consecutive tool results as one
 * user turn of <tool_response> blocks. */
bool chat_defines_tools(const char *template_str);

/* chat_render with tools (NULL or n = 0: none). Tools, tool calls or a "tool" message with a
 * template that does not define them: COTI_E_UNSUPPORTED (messages of role "tool" without
 * tools in the template render as any other role, as before). Declarations, call names and
 * arguments are message text (spans): the request wrote them. */
int chat_render_tools(const char *template_str, const struct chat_message *msgs, size_t n, const struct chat_tools *tools,
                      bool add_generation_prompt, bool enable_thinking, struct chat_prompt *out, char *err,
                      size_t err_size);

#endif
