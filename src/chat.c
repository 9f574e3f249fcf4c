/* chat.c — chat formats rendered by hand: ChatML and Gemma 4.
 * Owns: template recognition and rendering of plain-text messages and of Qwen's tool blocks,
 * and the record of which rendered bytes came from the messages (spans). Knows nothing of the
 * tokenizer (the caller parses special-token text outside the spans only), of JSON (the server
 * writes the declarations), images or output parsing.
 * References: llama.cpp src/llama-chat.cpp (llm_chat_detect_template, the chatml branch of
 * llm_chat_apply_template); models/templates/google-gemma-4-31B-it.jinja in the llama.cpp
 * tree, whose text-only path is reproduced here, with Jinja's trim = strip of C isspace
 * characters as llama.cpp's Jinja engine does it. */
#include "chat.h"

#include <stdlib.h>
#include <string.h>

struct sbuf {
    char *p;
    size_t n, cap;
    bool oom;
    struct chat_span *spans;     /* message text written so far (NULL-able: not recorded) */
    size_t n_spans, cap_spans;
    bool record;
};

static void sb_put(struct sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    size_t need;
    if (!coti_add_size(b->n, n, &need) || !coti_add_size(need, 1, &need)) {
        b->oom = true;
        return;
    }
    if (!coti_grow(&b->p, &b->cap, need, 1, 256)) {
        b->oom = true;
        return;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void sb_str(struct sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

/* Write message text: like sb_put, and remembered as a span (adjacent ones merge). */
static void sb_msg(struct sbuf *b, const char *s, size_t n) {
    const size_t at = b->n;
    sb_put(b, s, n);
    if (b->oom || !b->record || n == 0) return;
    if (b->n_spans && b->spans[b->n_spans - 1].off + b->spans[b->n_spans - 1].len == at) {
        b->spans[b->n_spans - 1].len += n;
        return;
    }
    if (!coti_grow(&b->spans, &b->cap_spans, b->n_spans + 1, sizeof *b->spans, 16)) {
        b->oom = true;
        return;
    }
    b->spans[b->n_spans++] = (struct chat_span){at, n};
}

static void sb_msg_str(struct sbuf *b, const char *s) { sb_msg(b, s, strlen(s)); }

/* ---- recognition ----------------------------------------------------------------------- */

enum chat_format chat_detect_format(const char *tmpl) {
    if (!tmpl) return CHAT_FORMAT_CHATML;
    if (!strcmp(tmpl, "chatml")) return CHAT_FORMAT_CHATML;
    if (!strcmp(tmpl, "gemma4")) return CHAT_FORMAT_GEMMA4;
    if (strstr(tmpl, "<|tool_call>call:")) return CHAT_FORMAT_GEMMA4;
    /* llama.cpp: <|im_start|> is ChatML unless Phi-4's <|im_sep|> or SmolVLM's
     * <end_of_utterance> say it is a look-alike */
    if (strstr(tmpl, "<|im_start|>") && !strstr(tmpl, "<|im_sep|>") && !strstr(tmpl, "<end_of_utterance>"))
        return CHAT_FORMAT_CHATML;
    return CHAT_FORMAT_UNKNOWN;
}

const char *chat_format_name(enum chat_format f) {
    switch (f) {
    case CHAT_FORMAT_CHATML: return "chatml";
    case CHAT_FORMAT_GEMMA4: return "gemma4";
    default: return "unknown";
    }
}

/* ---- ChatML ---------------------------------------------------------------------------- */

/* llama.cpp maps "developer" to "system" before rendering (except for GPT-OSS templates). */
static const char *role_of(const struct chat_message *m) {
    return strcmp(m->role, "developer") ? m->role : "system";
}

/* Qwen3's template with tools: the "# Tools" system block (after the system message's text,
 * when the first message is one), an assistant's calls after its text, and each run of tool
 * results as one user turn. */
static void render_chatml_tools(struct sbuf *b, const struct chat_message *msgs, size_t n, const struct chat_tools *t,
                                bool add_gen) {
    size_t first = 0;
    const bool has_system = n > 0 && !strcmp(role_of(&msgs[0]), "system");
    if (t && t->n) {
        sb_str(b, "<|im_start|>system\n");
        if (has_system) {
            sb_msg_str(b, msgs[0].content ? msgs[0].content : "");
            sb_str(b, "\n\n");
            first = 1;
        }
        sb_str(b, "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                  "You are provided with function signatures within <tools></tools> XML tags:\n<tools>");
        for (size_t i = 0; i < t->n; i++) {
            sb_str(b, "\n");
            sb_msg_str(b, t->decls[i]);
        }
        sb_str(b, "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
                  "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
                  "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n");
    }
    for (size_t i = first; i < n; i++) {
        const struct chat_message *m = &msgs[i];
        const char *c = m->content ? m->content : "";
        const size_t n_calls = t && t->calls ? t->n_calls[i] : 0;
        if (!strcmp(m->role, "tool")) {
            if (i == 0 || strcmp(msgs[i - 1].role, "tool")) sb_str(b, "<|im_start|>user");
            sb_str(b, "\n<tool_response>\n");
            sb_msg_str(b, c);
            sb_str(b, "\n</tool_response>");
            if (i + 1 == n || strcmp(msgs[i + 1].role, "tool")) sb_str(b, "<|im_end|>\n");
            continue;
        }
        sb_str(b, "<|im_start|>");
        sb_msg_str(b, role_of(m));
        sb_str(b, "\n");
        sb_msg_str(b, c);
        for (size_t k = 0; k < n_calls; k++) {
            if (k > 0 || *c) sb_str(b, "\n");
            sb_str(b, "<tool_call>\n{\"name\": \"");
            sb_msg_str(b, t->calls[i][k].name);
            sb_str(b, "\", \"arguments\": ");
            sb_msg_str(b, t->calls[i][k].arguments);
            sb_str(b, "}\n</tool_call>");
        }
        sb_str(b, "<|im_end|>\n");
    }
    if (add_gen) sb_str(b, "<|im_start|>assistant\n");
}

static void render_chatml(struct sbuf *b, const struct chat_message *msgs, size_t n, bool add_gen) {
    for (size_t i = 0; i < n; i++) {
        sb_str(b, "<|im_start|>");
        sb_msg_str(b, role_of(&msgs[i]));
        sb_str(b, "\n");
        sb_msg_str(b, msgs[i].content ? msgs[i].content : "");
        sb_str(b, "<|im_end|>\n");
    }
    if (add_gen) sb_str(b, "<|im_start|>assistant\n");
}

/* ---- Gemma 4 --------------------------------------------------------------------------- */

static bool is_space_c(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

/* Message text with Jinja "| trim" as llama.cpp implements it: strip C isspace characters at both ends. */
static void sb_trimmed(struct sbuf *b, const char *s, size_t n) {
    while (n && is_space_c(*s)) { s++; n--; }
    while (n && is_space_c(s[n - 1])) n--;
    sb_msg(b, s, n);
}

/* The template's strip_thinking macro: split on "<channel|>", keep each part up to any
 * "<|channel>" in it, join, trim. */
static void sb_strip_thinking(struct sbuf *b, const char *s) {
    static const char open[] = "<|channel>", close[] = "<channel|>";
    struct sbuf kept = {0};      /* scratch: its bytes are recorded when copied into b */
    for (;;) {
        const char *end = strstr(s, close);
        const size_t part = end ? (size_t)(end - s) : strlen(s);
        const char *ch = memmem(s, part, open, sizeof open - 1);
        sb_put(&kept, s, ch ? (size_t)(ch - s) : part);
        if (!end) break;
        s = end + sizeof close - 1;
    }
    if (kept.oom) b->oom = true;
    else sb_trimmed(b, kept.p ? kept.p : "", kept.n);
    free(kept.p);
}

/* merge_turns: the shipped template (with its continue_same_model_turn logic) writes
 * consecutive assistant messages into one model turn; the older "interleaved" variant opens
 * a turn for each. */
static int render_gemma4(struct sbuf *b, const struct chat_message *msgs, size_t n, bool add_gen, bool thinking,
                         bool merge_turns, char *err, size_t err_size) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(msgs[i].role, "tool"))
            return coti_fail(err, err_size, COTI_E_UNSUPPORTED,
                             "chat: message %zu has role 'tool'; Gemma 4 tool results need tool calls, which are not supported",
                             i);
    size_t first = 0;
    const bool has_system = n > 0 && !strcmp(role_of(&msgs[0]), "system");
    if (thinking || has_system) {
        sb_str(b, "<|turn>system\n");
        if (thinking) sb_str(b, "<|think|>\n");
        if (has_system) {
            const char *c = msgs[0].content ? msgs[0].content : "";
            sb_trimmed(b, c, strlen(c));
            first = 1;
        }
        sb_str(b, "<turn|>\n");
    }
    for (size_t i = first; i < n; i++) {
        const bool model = !strcmp(msgs[i].role, "assistant");
        /* consecutive assistant messages continue one model turn */
        const bool cont = merge_turns && model && i > first && !strcmp(msgs[i - 1].role, "assistant");
        if (!cont) {
            sb_str(b, "<|turn>");
            if (model) sb_str(b, "model");
            else sb_msg_str(b, role_of(&msgs[i]));
            sb_str(b, "\n");
        }
        const char *c = msgs[i].content ? msgs[i].content : "";
        if (model) sb_strip_thinking(b, c);
        else sb_trimmed(b, c, strlen(c));
        sb_str(b, "<turn|>\n");
    }
    if (add_gen) {
        sb_str(b, "<|turn>model\n");
        if (!thinking) sb_str(b, "<|channel>thought\n<channel|>");
    }
    return COTI_OK;
}

/* ---- entry point ----------------------------------------------------------------------- */

void chat_prompt_free(struct chat_prompt *p) {
    free(p->text);
    free(p->spans);
    memset(p, 0, sizeof *p);
}

bool chat_defines_tools(const char *tmpl) {
    return tmpl && chat_detect_format(tmpl) == CHAT_FORMAT_CHATML && strstr(tmpl, "<tool_call>");
}

static int render(const char *template_str, const struct chat_message *msgs, size_t n, const struct chat_tools *tools,
                  bool add_generation_prompt, bool enable_thinking, bool record, struct chat_prompt *out, char *err,
                  size_t err_size) {
    memset(out, 0, sizeof *out);
    if (n && !msgs) return coti_fail(err, err_size, COTI_E_ARG, "chat: msgs is NULL");
    bool calls = false;
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].role) return coti_fail(err, err_size, COTI_E_ARG, "chat: message %zu has no role", i);
        const size_t n_calls = tools && tools->calls ? tools->n_calls[i] : 0;
        for (size_t k = 0; k < n_calls; k++)
            if (!tools->calls[i][k].name || !tools->calls[i][k].arguments)
                return coti_fail(err, err_size, COTI_E_ARG, "chat: tool call %zu of message %zu is incomplete", k, i);
        calls = calls || n_calls;
    }
    const bool with_tools = chat_defines_tools(template_str);
    if (!with_tools && ((tools && tools->n) || calls))
        return coti_fail(err, err_size, COTI_E_UNSUPPORTED,
                         "chat: the model's chat template does not define tool calls (a ChatML template with <tool_call>, "
                         "such as Qwen's, does)");
    const enum chat_format f = chat_detect_format(template_str);
    struct sbuf b = {.record = record};
    sb_put(&b, "", 0);           /* an empty conversation still yields "" */
    int rc = COTI_OK;
    switch (f) {
    case CHAT_FORMAT_CHATML:
        if (with_tools) render_chatml_tools(&b, msgs, n, tools, add_generation_prompt);
        else render_chatml(&b, msgs, n, add_generation_prompt);
        break;
    case CHAT_FORMAT_GEMMA4:
        rc = render_gemma4(&b, msgs, n, add_generation_prompt, enable_thinking,
                           !strcmp(template_str, "gemma4") || strstr(template_str, "continue_same_model_turn"), err,
                           err_size);
        break;
    default: {
        /* the template comes from the model file: quote a short, printable excerpt */
        char quote[64];
        size_t q = 0;
        for (const char *c = template_str; *c && q < sizeof quote - 1; c++)
            quote[q++] = *c >= 0x20 && *c < 0x7F ? *c : '?';
        quote[q] = '\0';
        rc = coti_fail(err, err_size, COTI_E_UNSUPPORTED,
                       "chat: unrecognised chat template \"%s%s\"; supported: ChatML (<|im_start|>), Gemma 4", quote,
                       template_str[q] ? "..." : "");
    }
    }
    if (!rc && b.oom) rc = coti_fail(err, err_size, COTI_E_NOMEM, "chat: out of memory rendering %zu messages", n);
    if (rc) {
        free(b.p);
        free(b.spans);
        return rc;
    }
    *out = (struct chat_prompt){b.p, b.n, b.spans, b.n_spans};
    return COTI_OK;
}

int chat_render(const char *template_str, const struct chat_message *msgs, size_t n, bool add_generation_prompt,
                bool enable_thinking, struct chat_prompt *out, char *err, size_t err_size) {
    return render(template_str, msgs, n, NULL, add_generation_prompt, enable_thinking, true, out, err, err_size);
}

int chat_render_tools(const char *template_str, const struct chat_message *msgs, size_t n, const struct chat_tools *tools,
                      bool add_generation_prompt, bool enable_thinking, struct chat_prompt *out, char *err,
                      size_t err_size) {
    if (tools && ((tools->n && !tools->decls) || (tools->calls && !tools->n_calls)))
        return coti_fail(err, err_size, COTI_E_ARG, "chat: tool declarations or call counts are NULL");
    return render(template_str, msgs, n, tools, add_generation_prompt, enable_thinking, true, out, err, err_size);
}

int chat_apply(const char *template_str, const struct chat_message *msgs, size_t n, bool add_generation_prompt,
               bool enable_thinking, char **out, char *err, size_t err_size) {
    struct chat_prompt p;
    int rc = render(template_str, msgs, n, NULL, add_generation_prompt, enable_thinking, false, &p, err, err_size);
    *out = p.text;
    return rc;
}
