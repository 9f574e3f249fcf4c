/* fuzz_http.c — libFuzzer target for what the server does with an untrusted request body:
 * cJSON's parse, then src/server/openai.c's field checks, chat template rendering (with tools
 * when the first byte's bit 2 picks a template that defines them) and prompt tokenization (openai_parse_request for the three completion endpoints, openai_tokenize_prompt
 * for /tokenize), and the answer formatters on the accepted request (with the body's own bytes as
 * the generated text, parsed for tool calls where the request has tools). The first input byte
 * picks the endpoint (and the template), the rest is the body. A refusal must carry an HTTP status of 400..599 and
 * a message; nothing may crash or leak. The sockets layer (libmicrohttpd) is not ours and not
 * fuzzed here. Needs the shipped model (its tokenizer, template and NextN head); run from the
 * repository root. Built by `make fuzz` into build-fuzz/; seeds in fuzz/corpus/http/. */
#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "model.h"
#include "server/openai.h"
#include "spec.h"
#include "tokenizer.h"

#define FUZZ_HTTP_MODEL "models/coti-tiny-qwen35-mtp-q8_0.gguf"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct openai_ctx fuzz_oc;

/* The server's facts as `coti serve` sets them up (server.c), on the shipped model. */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    char err[512];
    struct backend *be = backend_cpu_init(1, quant_cpu_level_detect());
    struct model_params p = {.n_seq = 1, .n_ctx = 4096, .n_batch = 16, .n_keep_states = SPEC_MAX_DRAFT + 1,
                              .cache_type_k = GGML_TYPE_F16, .cache_type_v = GGML_TYPE_F16};
    struct model *m = NULL;
    struct tokenizer *tok = NULL;
    struct spec_engine *eng = NULL;
    if (!be || model_load(&m, FUZZ_HTTP_MODEL, be, &p, err, sizeof err) || tokenizer_init(&tok, m->gguf, err, sizeof err) ||
        spec_engine_init(&eng, m, NULL, err, sizeof err)) {
        fprintf(stderr, "fuzz_http: cannot set up on %s: %s\n", FUZZ_HTTP_MODEL, err);
        abort();
    }
    const char *tmpl = NULL;
    if (gguf_get_str(m->gguf, "tokenizer.chat_template", &tmpl, NULL, 0)) tmpl = NULL;
    fuzz_oc = (struct openai_ctx){.tok = tok, .eng = eng, .chat_template = tmpl, .model_name = "fuzz", .n_ctx = m->n_ctx,
                                  .n_vocab = m->info.n_vocab, .n_parallel = 1, .n_predict = -1,
                                  .sampling = sampler_params_default(1), .seed_fixed = true, .spec = spec_params_default()};
    return 0; /* model, tokenizer and engine live for the whole run */
}

static void check_refusal(int status, const struct openai_error *e) {
    if (status < 400 || status > 599 || !e->message[0]) __builtin_trap();
    free(openai_error_render(e));
}

/* The answers a generation on r would produce, with text = the body's own bytes (any bytes:
 * the formatters must repair invalid UTF-8 and NULs). */
static void render_answers(const struct openai_request *r, const char *text, size_t len) {
    struct task_result res = {.n_prompt = r->n_prompt, .prompt_n = r->n_prompt, .predicted_n = 1};
    struct spec_token_prob pr = {.logprob = -1.0f, .n_top = 2, .top_id = {0, 1}, .top_logprob = {-0.5f, -INFINITY}};
    const int32_t pid = 0;
    const struct token_probs tp = {&pid, &pr, 1};
    const struct openai_choice ch[2] = {{text, len, r->prompt, (size_t)r->n_prompt, &tp, &res},
                                        {text, len / 2, r->prompt, (size_t)r->n_prompt / 2, NULL, &res}};
    free(openai_render_final(&fuzz_oc, r, ch, 1 + (r->n_choices > 1)));
    if (!r->stream) return;
    for (int i = 0; i < 2; i++) {
        free(openai_render_chunk_role(&fuzz_oc, r, i));
        free(openai_render_chunk(&fuzz_oc, r, i, text, len, 0, 0, 1, &res, &tp));
    }
    struct tool_calls_out calls;
    bool called = false;
    if (r->tools.active && tools_parse_output(text, len, &calls)) {
        if (tools_content_end(text, len) > len) __builtin_trap();
        free(openai_render_chunk_tool_calls(&fuzz_oc, r, 0, &calls));
        called = calls.n > 0;
        tool_calls_out_free(&calls);
    }
    free(openai_render_chunk_end(&fuzz_oc, r, 0, &res, called));
    const struct task_result *all[2] = {&res, &res};
    free(openai_render_chunk_usage(&fuzz_oc, r, all, 2));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const int endpoint = data[0] % 4;
    /* bit 2: a template that defines tools (tools.c's paths), else the model's */
    static const char *model_template;
    if (!model_template) model_template = fuzz_oc.chat_template ? fuzz_oc.chat_template : "chatml";
    fuzz_oc.chat_template = (data[0] & 4) ? "<|im_start|> <tool_call>" : model_template;
    const char *text = (const char *)data + 1;
    const size_t len = size - 1;
    cJSON *body = cJSON_ParseWithLength(text, len);
    if (!body) return 0; /* the server answers 400 before our code sees it */
    struct openai_error e = {0};
    if (endpoint == 3) { /* /tokenize */
        int32_t *ids = NULL;
        int n = 0;
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(body, "content");
        int st = openai_tokenize_prompt(&fuzz_oc, content, "content", cJSON_IsTrue(cJSON_GetObjectItem(body, "add_special")),
                                        cJSON_IsTrue(cJSON_GetObjectItem(body, "parse_special")), fuzz_oc.n_ctx, &ids, &n, &e);
        if (st) check_refusal(st, &e);
        free(ids);
    } else {
        static const enum openai_api apis[3] = {OPENAI_API_CHAT, OPENAI_API_COMPLETIONS, OPENAI_API_NATIVE};
        struct openai_request r = {0};
        int st = openai_parse_request(&fuzz_oc, apis[endpoint], body, &r, &e);
        if (st) {
            check_refusal(st, &e);
        } else {
            if (r.n_prompt < 1 || r.n_prompt > fuzz_oc.n_ctx) __builtin_trap();
            for (int i = 0; i < r.n_prompt; i++)
                if (r.prompt[i] < 0 || r.prompt[i] >= fuzz_oc.n_vocab) __builtin_trap();
            render_answers(&r, text, len);
            openai_request_free(&r);
        }
    }
    cJSON_Delete(body);
    return 0;
}
