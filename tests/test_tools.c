/* test_tools.c — tool calling in the Hermes / Qwen3 format: the chat layer's rendering of tool
 * declarations, calls and results (as Qwen3's template writes them), the server's Python-style
 * JSON of declarations, and the parsing of an answer's <tool_call> blocks. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "server/openai.h"
#include "server/tools.h"

/* what makes a template one that defines tools: ChatML markers and <tool_call> */
static const char k_qwen3_like[] = "{{- '<|im_start|>' + message.role }} ... {{- '<tool_call>\\n{\"name\": \"' }}";

static char *render_ok(const struct chat_message *m, size_t n, const struct chat_tools *t, bool gen) {
    struct chat_prompt p;
    char err[256] = "";
    cr_assert_eq(chat_render_tools(k_qwen3_like, m, n, t, gen, true, &p, err, sizeof err), 0, "%s", err);
    char *s = strdup(p.text);
    chat_prompt_free(&p);
    return s;
}

Test(tools, template_recognition) {
    cr_assert(chat_defines_tools(k_qwen3_like));
    cr_assert_not(chat_defines_tools("chatml"));
    cr_assert_not(chat_defines_tools(NULL));
    cr_assert_not(chat_defines_tools("<|tool_call>call: gemma's markers are not Qwen's"));
}

Test(tools, declarations_in_the_system_turn) {
    const char *decls[] = {"{\"type\": \"function\", \"function\": {\"name\": \"f\"}}", "{\"type\": \"function\"}"};
    const struct chat_tools t = {decls, 2, NULL, NULL};
    const struct chat_message m[] = {{"system", "Be brief."}, {"user", "hi"}};
    char *s = render_ok(m, 2, &t, true);
    cr_assert_str_eq(s, "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with "
                        "the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n"
                        "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"f\"}}\n{\"type\": \"function\"}\n"
                        "</tools>\n\nFor each function call, return a json object with function name and arguments "
                        "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
                        "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                        "<|im_start|>assistant\n");
    free(s);
    /* no system message: the tools block alone */
    s = render_ok(m + 1, 1, &t, false);
    cr_assert_eq(strncmp(s, "<|im_start|>system\n# Tools\n\n", 28), 0, "%s", s);
    free(s);
}

Test(tools, calls_and_results) {
    const struct chat_tool_call calls[] = {{"get_weather", "{\"city\": \"Paris\"}"}, {"now", "{}"}};
    const struct chat_message m[] = {
        {"user", "weather?"}, {"assistant", ""}, {"tool", "18C"}, {"tool", "noon"}, {"assistant", "Sunny."},
    };
    const struct chat_tool_call *per_msg[] = {NULL, calls, NULL, NULL, calls};
    const size_t n_per_msg[] = {0, 2, 0, 0, 1};
    const struct chat_tools t = {NULL, 0, per_msg, n_per_msg};
    char *s = render_ok(m, 5, &t, false);
    cr_assert_str_eq(s, "<|im_start|>user\nweather?<|im_end|>\n"
                        "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                        "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>"
                        "<|im_end|>\n"
                        "<|im_start|>user\n<tool_response>\n18C\n</tool_response>\n<tool_response>\nnoon\n"
                        "</tool_response><|im_end|>\n"
                        "<|im_start|>assistant\nSunny.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                        "{\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n");
    free(s);
}

Test(tools, request_text_is_message_text) {
    /* a declaration or an argument that spells a special token must stay text: spans cover them */
    const char *decls[] = {"{\"description\": \"<|im_end|>\"}"};
    const struct chat_tool_call call = {"<|im_start|>", "\"<|endoftext|>\""};
    const struct chat_tool_call *per_msg[] = {NULL, &call};
    const size_t n_per_msg[] = {0, 1};
    const struct chat_tools t = {decls, 1, per_msg, n_per_msg};
    const struct chat_message m[] = {{"user", "x"}, {"assistant", ""}};
    struct chat_prompt p;
    char err[256];
    cr_assert_eq(chat_render_tools(k_qwen3_like, m, 2, &t, false, true, &p, err, sizeof err), 0, "%s", err);
    /* each needle after its unique context */
    const char *needles[] = {decls[0], call.name, call.arguments};
    const char *after[] = {"<tools>\n", "{\"name\": \"", "\"arguments\": "};
    for (size_t k = 0; k < 3; k++) {
        /* the call's context after the assistant turn opens (the tools block has look-alikes) */
        const char *from = k ? strstr(p.text, "<|im_start|>assistant\n") : p.text;
        cr_assert_not_null(from);
        const char *at = strstr(from, after[k]);
        cr_assert_not_null(at);
        at += strlen(after[k]);
        cr_assert_eq(strncmp(at, needles[k], strlen(needles[k])), 0, "%s", at);
        size_t off = (size_t)(at - p.text), len = strlen(needles[k]);
        bool covered = false;
        for (size_t i = 0; i < p.n_spans; i++) covered = covered || (p.spans[i].off <= off && off + len <= p.spans[i].off + p.spans[i].len);
        cr_assert(covered, "'%s' is not marked as message text", needles[k]);
    }
    chat_prompt_free(&p);
}

Test(tools, refused_where_the_template_has_none) {
    const char *decls[] = {"{}"};
    const struct chat_tools t = {decls, 1, NULL, NULL};
    const struct chat_tool_call call = {"f", "{}"};
    const struct chat_tool_call *per_msg[] = {NULL, &call};
    const size_t n_per_msg[] = {0, 1};
    const struct chat_tools with_call = {NULL, 0, per_msg, n_per_msg};
    const struct chat_message m[] = {{"user", "x"}, {"assistant", ""}};
    struct chat_prompt p;
    char err[256] = "";
    cr_assert_eq(chat_render_tools("chatml", m, 1, &t, true, true, &p, err, sizeof err), COTI_E_UNSUPPORTED);
    cr_assert_not_null(strstr(err, "does not define tool calls"), "%s", err);
    cr_assert_eq(chat_render_tools("gemma4", m, 2, &with_call, true, true, &p, err, sizeof err), COTI_E_UNSUPPORTED);
    cr_assert_null(p.text);
}

Test(tools, json_dumps_like_python) {
    cJSON *v = cJSON_Parse("{\"a\":[1,2.5,true,null],\"b\":{\"c\":\"x\\\"y\\n\\u00e9\\u0001\"},\"d\":{}}");
    char *s = tools_json_dumps(v);
    cr_assert_str_eq(s, "{\"a\": [1, 2.5, true, null], \"b\": {\"c\": \"x\\\"y\\n\xc3\xa9\\u0001\"}, \"d\": {}}");
    free(s);
    cJSON_Delete(v);
}

Test(tools, parse_answer_calls) {
    const char text[] = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
                        "</tool_call>\n<tool_call>\n{\"name\": \"now\"}\n</tool_call>\n";
    struct tool_calls_out o;
    cr_assert(tools_parse_output(text, sizeof text - 1, &o));
    cr_assert_eq(o.n, 2);
    cr_assert_str_eq(o.calls[0].name, "get_weather");
    cr_assert_str_eq(o.calls[0].arguments, "{\"city\":\"Paris\"}");
    cr_assert_str_eq(o.calls[1].name, "now");
    cr_assert_str_eq(o.calls[1].arguments, "{}");
    cr_assert_str_eq(o.content, "Let me check.");
    cJSON *a = tools_calls_json(&o, "chatcmpl-x", true);
    char *js = cJSON_PrintUnformatted(a);
    cr_assert_str_eq(js, "[{\"index\":0,\"id\":\"chatcmpl-x_0\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                         "\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}},{\"index\":1,\"id\":\"chatcmpl-x_1\",\"type\":"
                         "\"function\",\"function\":{\"name\":\"now\",\"arguments\":\"{}\"}}]");
    free(js);
    cJSON_Delete(a);
    tool_calls_out_free(&o);
    /* only calls: no content */
    const char only[] = "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}</tool_call>";
    cr_assert(tools_parse_output(only, sizeof only - 1, &o));
    cr_assert_eq(o.n, 1);
    cr_assert_null(o.content);
    cr_assert_str_eq(o.calls[0].arguments, "{\"x\": 1}", "a string of arguments is kept as it is");
    tool_calls_out_free(&o);
}

Test(tools, malformed_answers_are_content) {
    const char *texts[] = {"no calls here", "<tool_call>{\"name\": \"f\"", "<tool_call>not json</tool_call>",
                           "<tool_call>{\"name\": 3}</tool_call>", "<tool_call>{\"name\": \"f\"}</tool_call><tool_call>[]</tool_call>",
                           "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>"};
    for (size_t i = 0; i < COTI_ARRAY_LEN(texts); i++) {
        struct tool_calls_out o;
        cr_assert(tools_parse_output(texts[i], strlen(texts[i]), &o));
        cr_assert_eq(o.n, 0, "'%s' gave calls", texts[i]);
        cr_assert_eq(o.n_content, strlen(texts[i]));
        cr_assert_str_eq(o.content, texts[i]);
        tool_calls_out_free(&o);
    }
}

Test(tools, streaming_holds_back_a_possible_call) {
    cr_assert_eq(tools_content_end("Hello", 5), 5);
    cr_assert_eq(tools_content_end("Hello <tool", 11), 6);
    cr_assert_eq(tools_content_end("Hello <", 7), 6);
    cr_assert_eq(tools_content_end("Hi <tool_call>{...", 18), 3);
    cr_assert_eq(tools_content_end("a < b", 5), 5);
}

/* A call's name and arguments go out as UTF-8 whatever bytes the model wrote (invalid ones
 * become U+FFFD, as in the rest of an answer). */
Test(tools, call_text_goes_out_as_utf8) {
    static const char text[] = "<tool_call>\n{\"name\": \"f\\u00e9\xff\", \"arguments\": {\"x\": \"a\xc0\x8a" "b\"}}\n</tool_call>";
    struct tool_calls_out o;
    cr_assert(tools_parse_output(text, sizeof text - 1, &o));
    cr_assert_eq(o.n, 1);
    cJSON *j = tools_calls_json(&o, "id", false);
    cr_assert_not_null(j);
    char *s = cJSON_PrintUnformatted(j);
    cr_assert_not_null(s);
    cr_assert_null(strstr(s, "\xff"), "%s", s);
    cr_assert_null(strstr(s, "\xc0"), "%s", s);
    cr_assert_not_null(strstr(s, "\"name\":\"f\xc3\xa9\xef\xbf\xbd\""), "%s", s);
    cr_assert_not_null(strstr(s, "a\xef\xbf\xbd\xef\xbf\xbd" "b"), "%s", s);
    free(s);
    cJSON_Delete(j);
    tool_calls_out_free(&o);
}
