/* routes.c — the endpoints (see routes.h). A completion request goes: JSON body -> openai.c
 * parses it into a task -> slots.c queues and runs it -> the handler waits on the task's
 * channel (checking that the client is still there) -> openai.c shapes the answer. A
 * streamed answer is an SSE reader that blocks on the channel and writes one event per
 * token's text. Everything a bad request causes stays in its own handler: it gets a 4xx in
 * OpenAI's error shape and never reaches the engine. */
#include "server/routes.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "server/http.h"

/* ------------------------------------------------------------------------------------------
 * Helpers */

void routes_count_http(struct routes *r, int status) {
    if (r) metrics_count_http(r->mx, status);
}

/* Parse x's body as one JSON value; NULL with e filled (400) when it is not JSON. */
static cJSON *parse_body(struct routes *r, struct http_exchange *x, struct openai_error *e) {
    if (strlen(x->body) != x->n_body) {
        openai_error_set(e, 400, "invalid_request_error", "malformed JSON: the body contains a NUL byte");
        return NULL;
    }
    /* cJSON keeps strings NUL-terminated, without their length: "\u0000" would cut a string
     * short without a word, so it is refused (a backslash outside a string is malformed
     * JSON anyway, and skipping each escape's second byte keeps "\\u0000" legal) */
    for (size_t i = 0; i + 1 < x->n_body; i++) {
        if (x->body[i] != '\\') continue;
        if (x->body[i + 1] == 'u' && x->n_body - i >= 6 && !memcmp(x->body + i + 2, "0000", 4)) {
            openai_error_set(e, 400, "invalid_request_error",
                             "the request body has a \"\\u0000\" escape at byte %zu: NUL characters in strings are not supported", i);
            return NULL;
        }
        i++;
    }
    const char *end = NULL;
    pthread_mutex_lock(&r->json_mu);
    /* length + 1 takes in the NUL terminator: cJSON then rejects trailing garbage */
    cJSON *j = cJSON_ParseWithLengthOpts(x->body, x->n_body + 1, &end, true);
    pthread_mutex_unlock(&r->json_mu);
    if (!j) {
        size_t at = end && end >= x->body && end <= x->body + x->n_body ? (size_t)(end - x->body) : 0;
        openai_error_set(e, 400, "invalid_request_error", "malformed JSON in the request body near byte %zu", at);
    }
    return j;
}

static cJSON *parse_object_body(struct routes *r, struct http_exchange *x, struct openai_error *e) {
    cJSON *j = parse_body(r, x, e);
    if (j && !cJSON_IsObject(j)) {
        cJSON_Delete(j);
        openai_error_set(e, 400, "invalid_request_error", "the request body must be a JSON object");
        return NULL;
    }
    return j;
}

static enum MHD_Result send_cjson(struct http_exchange *x, int status, cJSON *o) {
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return http_send_json(x, status, s);
}

/* The short `params` object of /props and /slots (server-api.md §3.4, the fields coti has). */
static cJSON *params_json(const struct sampler_params *sp, const struct spec_params *spec, int n_predict, bool ignore_eos) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddNumberToObject(o, "seed", (double)sp->seed);
    cJSON_AddNumberToObject(o, "temperature", sp->temperature);
    cJSON_AddNumberToObject(o, "top_k", sp->top_k);
    cJSON_AddNumberToObject(o, "top_p", sp->top_p);
    cJSON_AddNumberToObject(o, "min_p", sp->min_p);
    cJSON_AddNumberToObject(o, "min_keep", sp->min_keep);
    cJSON_AddNumberToObject(o, "typical_p", sp->typical_p);
    cJSON_AddNumberToObject(o, "repeat_last_n", sp->repeat_last_n);
    cJSON_AddNumberToObject(o, "repeat_penalty", sp->repeat_penalty);
    cJSON_AddNumberToObject(o, "presence_penalty", sp->presence_penalty);
    cJSON_AddNumberToObject(o, "frequency_penalty", sp->frequency_penalty);
    cJSON_AddNumberToObject(o, "max_tokens", n_predict);
    cJSON_AddNumberToObject(o, "n_predict", n_predict);
    cJSON_AddBoolToObject(o, "ignore_eos", ignore_eos);
    cJSON *s = cJSON_AddArrayToObject(o, "samplers");
    static const char *chain[] = {"penalties", "top_k", "typ_p", "top_p", "min_p", "temperature"};
    for (size_t i = 0; s && i < COTI_ARRAY_LEN(chain); i++) cJSON_AddItemToArray(s, cJSON_CreateString(chain[i]));
    cJSON_AddStringToObject(o, "speculative.types", drafter_kind_llama_name(spec->drafter));
    cJSON_AddNumberToObject(o, "speculative.n_max", spec->n_max);
    cJSON_AddNumberToObject(o, "speculative.n_min", spec->n_min);
    cJSON_AddNumberToObject(o, "speculative.p_min", spec->p_min);
    return o;
}

/* ------------------------------------------------------------------------------------------
 * Simple endpoints */

static enum MHD_Result route_health(struct routes *r, struct http_exchange *x) {
    return http_send_json(x, 200, strdup("{\"status\":\"ok\"}"));
}

static enum MHD_Result route_models(struct routes *r, struct http_exchange *x) {
    const char *name = r->oc.model_name;
    const struct ggml_type_traits *tt = ggml_type_traits_get(r->m->info.weight_type);
    char ftype[16] = "";
    for (size_t i = 0; tt && tt->name[i] && i + 1 < sizeof ftype; i++) ftype[i] = (char)toupper((unsigned char)tt->name[i]);
    cJSON *o = cJSON_CreateObject();
    cJSON *models = cJSON_AddArrayToObject(o, "models");
    cJSON *m = cJSON_CreateObject();
    if (models && m) {
        cJSON_AddItemToArray(models, m);
        cJSON_AddStringToObject(m, "name", name);
        cJSON_AddStringToObject(m, "model", name);
        cJSON_AddStringToObject(m, "modified_at", "");
        cJSON_AddStringToObject(m, "size", "");
        cJSON_AddStringToObject(m, "digest", "");
        cJSON_AddStringToObject(m, "type", "model");
        cJSON_AddStringToObject(m, "description", "");
        cJSON *tags = cJSON_AddArrayToObject(m, "tags");
        if (tags) cJSON_AddItemToArray(tags, cJSON_CreateString(""));
        cJSON *caps = cJSON_AddArrayToObject(m, "capabilities");
        if (caps) cJSON_AddItemToArray(caps, cJSON_CreateString("completion"));
        cJSON_AddStringToObject(m, "parameters", "");
        cJSON *d = cJSON_AddObjectToObject(m, "details");
        if (d) {
            cJSON_AddStringToObject(d, "parent_model", "");
            cJSON_AddStringToObject(d, "format", "gguf");
            cJSON_AddStringToObject(d, "family", r->m->info.arch);
            cJSON *fam = cJSON_AddArrayToObject(d, "families");
            if (fam) cJSON_AddItemToArray(fam, cJSON_CreateString(r->m->info.arch));
            cJSON_AddStringToObject(d, "parameter_size", "");
            cJSON_AddStringToObject(d, "quantization_level", ftype);
        }
    } else {
        cJSON_Delete(m);
    }
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    cJSON *dm = cJSON_CreateObject();
    if (data && dm) {
        cJSON_AddItemToArray(data, dm);
        cJSON_AddStringToObject(dm, "id", name);
        cJSON_AddArrayToObject(dm, "aliases");
        cJSON_AddArrayToObject(dm, "tags");
        cJSON_AddStringToObject(dm, "object", "model");
        cJSON_AddNumberToObject(dm, "created", (double)r->t_start_unix);
        cJSON_AddStringToObject(dm, "owned_by", "llamacpp");
        cJSON *meta = cJSON_AddObjectToObject(dm, "meta");
        if (meta) {
            cJSON_AddNumberToObject(meta, "vocab_type", 2); /* llama.cpp's LLAMA_VOCAB_TYPE_BPE */
            cJSON_AddNumberToObject(meta, "n_vocab", r->m->info.n_vocab);
            cJSON_AddNumberToObject(meta, "n_ctx", r->m->n_ctx);
            cJSON_AddNumberToObject(meta, "n_ctx_train", r->m->info.n_ctx_train);
            cJSON_AddNumberToObject(meta, "n_embd", r->m->info.n_embd);
            cJSON_AddNumberToObject(meta, "n_params", (double)r->n_params);
            cJSON_AddNumberToObject(meta, "size", (double)r->model_size_bytes);
            cJSON_AddStringToObject(meta, "ftype", ftype);
        }
    } else {
        cJSON_Delete(dm);
    }
    return send_cjson(x, 200, o);
}

static void add_token_text(cJSON *o, const char *key, const struct tokenizer *tok, int32_t id) {
    const char *p = "";
    size_t n = 0;
    if (id >= 0) tokenizer_token_to_piece(tok, id, true, &p, &n);
    openai_add_text(o, key, p, n);
}

static enum MHD_Result route_props(struct routes *r, struct http_exchange *x) {
    const struct openai_ctx *c = &r->oc;
    cJSON *o = cJSON_CreateObject();
    cJSON *dgs = cJSON_AddObjectToObject(o, "default_generation_settings");
    if (dgs) {
        cJSON *pj = params_json(&c->sampling, &c->spec, c->n_predict, false);
        if (pj) cJSON_AddItemToObject(dgs, "params", pj);
        cJSON_AddNumberToObject(dgs, "n_ctx", c->n_ctx);
    }
    cJSON_AddNumberToObject(o, "total_slots", slots_count(r->slots));
    cJSON_AddStringToObject(o, "model_alias", c->model_name);
    const struct ggml_type_traits *tt = ggml_type_traits_get(r->m->info.weight_type);
    cJSON_AddStringToObject(o, "model_ftype", tt ? tt->name : "");
    /* the file name only: the server's directory layout is none of the client's business */
    const char *slash = strrchr(r->p->model_path, '/');
    cJSON_AddStringToObject(o, "model_path", slash ? slash + 1 : r->p->model_path);
    cJSON *mod = cJSON_AddObjectToObject(o, "modalities");
    if (mod) {
        cJSON_AddBoolToObject(mod, "vision", false);
        cJSON_AddBoolToObject(mod, "video", false);
        cJSON_AddBoolToObject(mod, "audio", false);
    }
    cJSON_AddBoolToObject(o, "endpoint_slots", true);
    cJSON_AddBoolToObject(o, "endpoint_props", false);
    cJSON_AddBoolToObject(o, "endpoint_metrics", true);
    cJSON_AddBoolToObject(o, "ui", false);
    openai_add_text(o, "chat_template", r->chat_template_text, strlen(r->chat_template_text));
    cJSON_AddObjectToObject(o, "chat_template_caps");
    add_token_text(o, "bos_token", c->tok, tokenizer_bos(c->tok));
    add_token_text(o, "eos_token", c->tok, tokenizer_eos(c->tok));
    cJSON_AddStringToObject(o, "build_info", "coti");
    cJSON_AddBoolToObject(o, "is_sleeping", false);
    cJSON_AddBoolToObject(o, "cors_proxy_enabled", false);
    cJSON *spec = cJSON_AddObjectToObject(o, "speculative");
    if (spec) {
        /* coti extra: what a request may ask for in its speculative fields */
        cJSON_AddStringToObject(spec, "type", drafter_kind_name(c->spec.drafter));
        for (int i = 0; i < n_drafter_kinds; i++)
            cJSON_AddBoolToObject(spec, drafter_kinds[i]->name, spec_engine_supports(c->eng, drafter_kinds[i]));
        cJSON_AddNumberToObject(spec, "n_max_limit", SPEC_MAX_DRAFT);
    }
    cJSON *kv = cJSON_AddObjectToObject(o, "kv_cache");
    if (kv) {
        /* coti extra (llama-server reports no cache types): -ctk / -ctv and what a slot holds */
        const struct model_info *in = &r->m->info;
        cJSON_AddStringToObject(kv, "type_k", ggml_type_traits_get(in->cache_type_k)->name);
        cJSON_AddStringToObject(kv, "type_v", ggml_type_traits_get(in->cache_type_v)->name);
        cJSON_AddNumberToObject(kv, "k_bytes_per_slot", (double)in->k_bytes_per_seq);
        cJSON_AddNumberToObject(kv, "v_bytes_per_slot", (double)in->v_bytes_per_seq);
    }
    return send_cjson(x, 200, o);
}

static enum MHD_Result route_props_post(struct routes *r, struct http_exchange *x) {
    struct openai_error e;
    openai_error_set(&e, 501, "not_supported_error", "This server does not support changing global properties.");
    return http_send_error(x, &e);
}

static enum MHD_Result route_slots(struct routes *r, struct http_exchange *x) {
    int n = slots_count(r->slots);
    struct slot_view *v = calloc((size_t)n, sizeof *v);
    if (!v) return http_send_json(x, 500, NULL);
    slots_view(r->slots, v);
    const char *fail = MHD_lookup_connection_value(x->conn, MHD_GET_ARGUMENT_KIND, "fail_on_no_slot");
    if (fail && strcmp(fail, "0") && strcmp(fail, "false")) {
        bool idle = false;
        for (int i = 0; i < n; i++) idle = idle || !v[i].processing;
        if (!idle) {
            free(v);
            struct openai_error e;
            openai_error_set(&e, 503, "unavailable_error", "no slot available");
            return http_send_error(x, &e);
        }
    }
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++) {
        cJSON *s = cJSON_CreateObject();
        if (!s) break;
        cJSON_AddItemToArray(a, s);
        cJSON_AddNumberToObject(s, "id", v[i].id);
        cJSON_AddNumberToObject(s, "n_ctx", r->m->n_ctx);
        cJSON_AddBoolToObject(s, "speculative", v[i].id_task >= 0 ? v[i].spec.drafter != NULL : r->oc.spec.drafter != NULL);
        cJSON_AddBoolToObject(s, "is_processing", v[i].processing);
        if (v[i].id_task < 0) continue;
        cJSON_AddNumberToObject(s, "id_task", (double)v[i].id_task);
        cJSON_AddNumberToObject(s, "n_prompt_tokens", v[i].n_prompt);
        cJSON_AddNumberToObject(s, "n_prompt_tokens_processed", v[i].n_prompt_processed);
        cJSON_AddNumberToObject(s, "n_prompt_tokens_cache", v[i].n_cache);
        cJSON *pj = params_json(&v[i].sp, &v[i].spec, v[i].n_predict, v[i].ignore_eos);
        if (pj) cJSON_AddItemToObject(s, "params", pj);
        /* a one-element array, as llama.cpp's JSON construction produces (server-api.md §2.4) */
        cJSON *nt = cJSON_AddArrayToObject(s, "next_token");
        cJSON *t = cJSON_CreateObject();
        if (nt && t) {
            cJSON_AddItemToArray(nt, t);
            cJSON_AddBoolToObject(t, "has_next_token", v[i].processing);
            cJSON_AddBoolToObject(t, "has_new_line", v[i].has_new_line);
            cJSON_AddNumberToObject(t, "n_remain", v[i].n_predict < 0 ? -1 : v[i].n_predict - v[i].n_decoded);
            cJSON_AddNumberToObject(t, "n_decoded", v[i].n_decoded);
        } else {
            cJSON_Delete(t);
        }
    }
    free(v);
    return send_cjson(x, 200, a);
}

static enum MHD_Result route_metrics(struct routes *r, struct http_exchange *x) {
    return http_send_text(x, 200, "text/plain; version=0.0.4", metrics_render(r->mx));
}

static enum MHD_Result route_tokenize(struct routes *r, struct http_exchange *x) {
    struct openai_error e;
    cJSON *b = parse_object_body(r, x, &e);
    if (!b) return http_send_error(x, &e);
    bool add_special = false, parse_special = true, with_pieces = false;
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(b, "content");
    const char *bad = NULL;
    const char *names[] = {"add_special", "parse_special", "with_pieces"};
    bool *vals[] = {&add_special, &parse_special, &with_pieces};
    for (int i = 0; i < 3; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(b, names[i]);
        if (!v || cJSON_IsNull(v)) continue;
        if (!cJSON_IsBool(v)) bad = names[i];
        else *vals[i] = cJSON_IsTrue(v);
    }
    int32_t *ids = NULL;
    int n = 0;
    int rc = 0;
    if (bad) rc = openai_error_set(&e, 400, "invalid_request_error", "Field '%s': expected a boolean", bad);
    else if (!content || cJSON_IsNull(content)) rc = openai_error_set(&e, 400, "invalid_request_error", "'content' is required");
    else rc = openai_tokenize_prompt(&r->oc, content, "content", add_special, parse_special, -1, &ids, &n, &e);
    cJSON_Delete(b);
    if (rc) return http_send_error(x, &e);
    cJSON *o = cJSON_CreateObject();
    cJSON *a = cJSON_AddArrayToObject(o, "tokens");
    for (int i = 0; a && i < n; i++) {
        if (!with_pieces) {
            cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
            continue;
        }
        cJSON *t = cJSON_CreateObject();
        if (!t) break;
        cJSON_AddItemToArray(a, t);
        cJSON_AddNumberToObject(t, "id", ids[i]);
        const char *p = "";
        size_t len = 0;
        tokenizer_token_to_piece(r->oc.tok, ids[i], true, &p, &len);
        bool valid = true;
        for (size_t k = 0; k < len && valid;) {
            /* a piece that is not valid UTF-8 on its own (half a character) goes as bytes */
            unsigned char ch = (unsigned char)p[k];
            size_t need = ch < 0x80 ? 1 : ch >= 0xF0 && ch <= 0xF4 ? 4 : ch >= 0xE0 ? 3 : ch >= 0xC2 && ch < 0xE0 ? 2 : 0;
            if (need == 0 || k + need > len || !ch) valid = false;
            for (size_t j = 1; valid && j < need; j++) valid = ((unsigned char)p[k + j] & 0xC0) == 0x80;
            k += need ? need : 1;
        }
        if (valid) {
            openai_add_text(t, "piece", p, len);
        } else {
            cJSON *bytes = cJSON_AddArrayToObject(t, "piece");
            for (size_t k = 0; bytes && k < len; k++) cJSON_AddItemToArray(bytes, cJSON_CreateNumber((unsigned char)p[k]));
        }
    }
    free(ids);
    return send_cjson(x, 200, o);
}

static enum MHD_Result route_detokenize(struct routes *r, struct http_exchange *x) {
    struct openai_error e;
    cJSON *b = parse_object_body(r, x, &e);
    if (!b) return http_send_error(x, &e);
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(b, "tokens");
    int rc = 0;
    int32_t *ids = NULL;
    int n = 0;
    if (!toks || cJSON_IsNull(toks)) {
        rc = openai_error_set(&e, 400, "invalid_request_error", "'tokens' is required");
    } else if (!cJSON_IsArray(toks)) {
        rc = openai_error_set(&e, 400, "invalid_request_error", "Field 'tokens': expected an array of token ids");
    } else {
        n = cJSON_GetArraySize(toks);
        ids = malloc(sizeof *ids * (size_t)(n ? n : 1));
        if (!ids) rc = openai_error_set(&e, 500, "server_error", "out of memory");
        int i = 0;
        for (const cJSON *t = toks->child; t && !rc; t = t->next, i++) {
            if (!cJSON_IsNumber(t) || t->valuedouble != (double)(int32_t)t->valuedouble || t->valuedouble < 0 ||
                t->valuedouble >= r->oc.n_vocab)
                rc = openai_error_set(&e, 400, "invalid_request_error", "Field 'tokens': element %d is not a token id in [0, %d)", i,
                                      r->oc.n_vocab);
            else ids[i] = (int32_t)t->valuedouble;
        }
    }
    cJSON_Delete(b);
    char *text = NULL;
    size_t len = 0;
    if (!rc && tokenizer_detokenize(r->oc.tok, ids, (size_t)n, true, &text, &len, e.message, sizeof e.message))
        rc = openai_error_set(&e, 500, "server_error", "cannot detokenize");
    free(ids);
    if (rc) return http_send_error(x, &e);
    cJSON *o = cJSON_CreateObject();
    bool ok = o && openai_add_text(o, "content", text, len);
    free(text);
    if (!ok) { cJSON_Delete(o); o = NULL; }
    return send_cjson(x, 200, o);
}

static enum MHD_Result route_apply_template(struct routes *r, struct http_exchange *x) {
    struct openai_error e;
    cJSON *b = parse_object_body(r, x, &e);
    if (!b) return http_send_error(x, &e);
    struct chat_prompt prompt;
    int rc = openai_render_chat(&r->oc, b, &prompt, NULL, &e);
    cJSON_Delete(b);
    if (rc) return http_send_error(x, &e);
    cJSON *o = cJSON_CreateObject();
    bool ok = o && openai_add_text(o, "prompt", prompt.text, prompt.n_text);
    chat_prompt_free(&prompt);
    if (!ok) { cJSON_Delete(o); o = NULL; }
    return send_cjson(x, 200, o);
}

/* ------------------------------------------------------------------------------------------
 * Generation */

static void note_result(char *note, size_t size, const struct task *t, const struct task_result *res) {
    snprintf(note, size, "task=%ld slot=%d prompt=%d cache=%d gen=%d draft_n=%ld accepted=%ld prompt_ms=%.1f gen_ms=%.1f stop=%s%s",
             task_id(t), res->id_slot, res->n_prompt, res->cache_n, res->predicted_n, res->draft_n, res->draft_n_accepted,
             res->prompt_ms, res->predicted_ms, stop_type_name(res->stop_type), res->cancelled ? " cancelled" : "");
}

/* The HTTP error of a task that failed (its result's status and message) into e. */
static int task_error(const struct task_result *res, struct openai_error *e) {
    const char *type = res->status == 503 ? "unavailable_error" : res->status < 500 ? "invalid_request_error" : "server_error";
    return openai_error_set(e, res->status, type, "%s", res->message);
}

/* One answer of a streamed request (OpenAI's n: several, each its own task): what its channel
 * handed over and what it holds back. */
struct stream_choice {
    struct task *t;
    struct task_chunk chunk;
    bool role_sent, ended, tools_called;
    /* a chat with tools: the whole answer so far, of which [0, n_said) went out as content;
     * the rest waits for the end, when it is either tool calls or more content */
    char *said;
    size_t n_said_text, cap_said, n_said;
    /* log-probabilities of tokens whose text has not gone out yet (held back, or empty) */
    int32_t *pend_ids;
    struct spec_token_prob *pend;
    size_t n_pend, cap_pend_ids, cap_pend;
    int n_predicted;
};

/* A streamed answer in progress: owns its request copy, its choices' task references and a
 * buffer of formatted SSE bytes not yet handed to MHD. The choices' events interleave as
 * their tokens arrive; the stream ends when every choice has, or at the first error. */
struct stream {
    struct routes *r;
    struct MHD_Connection *conn;
    struct openai_request req;
    struct task_bell bell;       /* rung by every choice's task: one wait for all of them */
    int n_choices, n_ended;
    struct stream_choice choice[OPENAI_MAX_CHOICES];
    char *out;
    size_t n_out, off, cap;
    bool ended, failed;
    int64_t t_last_event_us;
    /* for the log line, written when MHD is done with the stream */
    long log_id;
    char method[16], url[96];
    int64_t t_start_us;
};

static bool stream_put(struct stream *s, const char *a, size_t n) {
    if (!coti_grow(&s->out, &s->cap, s->n_out + n, 1, 4096)) return false;
    memcpy(s->out + s->n_out, a, n);
    s->n_out += n;
    return true;
}

/* One SSE event "data: <payload>\n\n"; takes payload (NULL = out of memory). */
static bool stream_event(struct stream *s, char *payload) {
    bool ok = payload && stream_put(s, "data: ", 6) && stream_put(s, payload, strlen(payload)) && stream_put(s, "\n\n", 2);
    free(payload);
    s->t_last_event_us = coti_time_us();
    return ok;
}

static void stream_cancel(struct stream *s) {
    for (int i = 0; i < s->n_choices; i++) task_cancel(s->choice[i].t);
}

/* The end of the stream once every choice has ended: the usage of all of them (when asked
 * for) and [DONE]. */
static bool stream_close(struct stream *s) {
    s->ended = true;
    if (s->req.api == OPENAI_API_NATIVE) return true;
    bool ok = true;
    if (s->req.include_usage) {
        const struct task_result *res[OPENAI_MAX_CHOICES];
        for (int i = 0; i < s->n_choices; i++) res[i] = &s->choice[i].chunk.result;
        ok = stream_event(s, openai_render_chunk_usage(&s->r->oc, &s->req, res, s->n_choices));
    }
    return ok && stream_put(s, "data: [DONE]\n\n", 14);
}

/* Format what choice i's channel holds into SSE events. Returns false when out of memory. */
static bool stream_format(struct stream *s, int i) {
    const struct openai_ctx *c = &s->r->oc;
    struct stream_choice *ch = &s->choice[i];
    struct task_chunk *k = &ch->chunk;
    bool ok = true;
    if (s->req.api == OPENAI_API_CHAT && !ch->role_sent && (k->n_pieces || (k->done && !k->result.status))) {
        ok = stream_event(s, openai_render_chunk_role(c, &s->req, i));
        ch->role_sent = true;
    }
    const bool tools = s->req.api == OPENAI_API_CHAT && s->req.tools.active;
    for (size_t j = 0; j < k->n_pieces && ok; j++) {
        const struct task_piece *p = &k->pieces[j];
        if (p->id >= 0) ch->n_predicted++;
        if (p->prob >= 0) { /* travels with the next text that goes out */
            if (!coti_grow(&ch->pend_ids, &ch->cap_pend_ids, ch->n_pend + 1, sizeof *ch->pend_ids, 16) ||
                !coti_grow(&ch->pend, &ch->cap_pend, ch->n_pend + 1, sizeof *ch->pend, 16)) { ok = false; break; }
            ch->pend_ids[ch->n_pend] = p->id;
            ch->pend[ch->n_pend++] = k->probs[p->prob];
        }
        const struct token_probs tp = {ch->pend_ids, ch->pend, ch->n_pend};
        /* OpenAI chunks carry text; a token whose text is held back (or empty) makes none */
        if (s->req.api != OPENAI_API_NATIVE && p->len == 0) continue;
        if (tools) {
            /* content goes out up to where a tool call may begin */
            if (!coti_grow(&ch->said, &ch->cap_said, ch->n_said_text + p->len + 1, 1, 1024)) { ok = false; break; }
            memcpy(ch->said + ch->n_said_text, k->text + p->off, p->len);
            ch->n_said_text += p->len;
            size_t upto = tools_content_end(ch->said, ch->n_said_text);
            if (upto > ch->n_said) {
                ok = stream_event(s, openai_render_chunk(c, &s->req, i, ch->said + ch->n_said, upto - ch->n_said, p->id, k->id_slot,
                                                         ch->n_predicted, &k->progress, &tp));
                ch->n_said = upto;
                ch->n_pend = 0;
            }
            continue;
        }
        ok = stream_event(s, openai_render_chunk(c, &s->req, i, k->text + p->off, p->len, p->id, k->id_slot, ch->n_predicted,
                                                 &k->progress, &tp));
        ch->n_pend = 0;
    }
    task_chunk_clear(k);
    if (ok && k->done && tools && !k->result.status) {
        /* the held-back rest: the answer's tool calls, or content after all */
        struct tool_calls_out calls;
        const bool parsed = tools_parse_output(ch->said ? ch->said : "", ch->n_said_text, &calls);
        ok = parsed;
        if (ok && calls.n) ok = stream_event(s, openai_render_chunk_tool_calls(c, &s->req, i, &calls));
        else if (ok && ch->n_said_text > ch->n_said)
            ok = stream_event(s, openai_render_chunk(c, &s->req, i, ch->said + ch->n_said, ch->n_said_text - ch->n_said, -1,
                                                     k->id_slot, ch->n_predicted, &k->progress,
                                                     &(struct token_probs){ch->pend_ids, ch->pend, ch->n_pend}));
        if (ok && !calls.n) ch->n_pend = 0;
        ch->tools_called = parsed && calls.n > 0;
        if (parsed) tool_calls_out_free(&calls);
    }
    if (ok && k->done && !k->result.status && ch->n_pend && s->req.api != OPENAI_API_NATIVE) {
        /* tokens whose text never went out (held back at a stop, an end-of-generation token):
         * their log-probabilities in a chunk without text */
        ok = stream_event(s, openai_render_chunk(c, &s->req, i, "", 0, -1, k->id_slot, ch->n_predicted, &k->progress,
                                                 &(struct token_probs){ch->pend_ids, ch->pend, ch->n_pend}));
        ch->n_pend = 0;
    }
    if (ok && k->done) {
        ch->ended = true;
        s->n_ended++;
        if (k->result.status) {
            /* an error after the stream began: one error event, and the stream ends (the
             * other choices with it) */
            struct openai_error e;
            task_error(&k->result, &e);
            ok = stream_event(s, openai_error_render(&e));
            stream_cancel(s);
            s->ended = true;
        } else {
            ok = stream_event(s, openai_render_chunk_end(c, &s->req, i, &k->result, ch->tools_called));
            if (ok && s->n_ended == s->n_choices) ok = stream_close(s);
        }
    }
    return ok;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    struct stream *s = cls;
    int64_t t_check = coti_time_us();
    for (;;) {
        if (s->off < s->n_out) {
            size_t n = COTI_MIN(max, s->n_out - s->off);
            memcpy(buf, s->out + s->off, n);
            s->off += n;
            return (ssize_t)n;
        }
        s->off = s->n_out = 0;
        if (s->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        /* counted before the takes: news that comes after them rings past `seen` */
        const unsigned long seen = task_bell_rings(&s->bell);
        for (int i = 0; i < s->n_choices && !s->ended; i++) {
            struct stream_choice *ch = &s->choice[i];
            if (ch->ended) continue;
            task_take(ch->t, 0, &ch->chunk);
            if ((ch->chunk.n_pieces || ch->chunk.done) && !stream_format(s, i)) {
                s->failed = true;
                stream_cancel(s);
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
        }
        if (s->n_out || s->ended) continue;
        bool news = task_bell_wait(&s->bell, seen, HTTP_POLL_MS);
        int64_t now = coti_time_us();
        if (!news || now - t_check > HTTP_POLL_MS * 1000) {
            t_check = now;
            if (http_client_gone(s->conn)) {
                stream_cancel(s);
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
        }
        if (!news && now - s->t_last_event_us > (int64_t)HTTP_SSE_PING_S * 1000000) {
            s->t_last_event_us = now;
            if (!stream_put(s, ":\n\n", 3)) return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static void stream_free(void *cls) {
    struct stream *s = cls;
    /* the tasks may still run (client gone): stop them; a no-op for those that have finished */
    stream_cancel(s);
    const struct stream_choice *first = &s->choice[0];
    char note[384];
    if (first->chunk.done && !first->chunk.result.status) note_result(note, sizeof note, first->t, &first->chunk.result);
    else if (first->chunk.done)
        snprintf(note, sizeof note, "task=%ld stream error=%d", task_id(first->t), first->chunk.result.status);
    else snprintf(note, sizeof note, "task=%ld stream gen=%d", task_id(first->t), first->n_predicted);
    if (s->n_choices > 1) snprintf(note + strlen(note), sizeof note - strlen(note), " choices=%d", s->n_choices);
    http_log_request(s->log_id, s->method, s->url, 200, s->t_start_us, note, !s->ended || s->failed);
    for (int i = 0; i < s->n_choices; i++) {
        struct stream_choice *ch = &s->choice[i];
        task_set_bell(ch->t, NULL); /* the task may outlive the stream and its bell */
        task_unref(ch->t);
        task_chunk_free(&ch->chunk);
        free(ch->said);
        free(ch->pend_ids);
        free(ch->pend);
    }
    task_bell_destroy(&s->bell);
    openai_request_free(&s->req);
    free(s->out);
    free(s);
}

/* Wait until the task has started (stream) or finished. Returns false when the client went
 * away (the task is cancelled then). */
static bool wait_task(struct task *t, struct MHD_Connection *conn, struct task_chunk *c, bool until_started) {
    int64_t t_check = coti_time_us();
    while (!c->done && !(until_started && c->started)) {
        bool news = task_take(t, HTTP_POLL_MS, c);
        int64_t now = coti_time_us();
        if (!news || now - t_check > HTTP_POLL_MS * 1000) {
            t_check = now;
            if (http_client_gone(conn)) {
                task_cancel(t);
                return false;
            }
        }
    }
    return true;
}

/* A chunk's generated token ids (*ids) and those with log-probabilities (*prob_ids), as the
 * final answer wants them; false when out of memory. */
static bool chunk_ids(const struct task_chunk *chunk, int32_t **ids, size_t *n_ids, int32_t **prob_ids, size_t *n_prob) {
    *ids = malloc(sizeof **ids * (chunk->n_pieces ? chunk->n_pieces : 1));
    *prob_ids = malloc(sizeof **prob_ids * (chunk->n_pieces ? chunk->n_pieces : 1));
    *n_ids = *n_prob = 0;
    for (size_t i = 0; *ids && *prob_ids && i < chunk->n_pieces; i++) {
        if (chunk->pieces[i].id >= 0) (*ids)[(*n_ids)++] = chunk->pieces[i].id;
        if (chunk->pieces[i].prob >= 0) (*prob_ids)[(*n_prob)++] = chunk->pieces[i].id;
    }
    return *ids && *prob_ids;
}

/* The request's tasks into t[0..n_choices), submitted: one per choice (OpenAI's n), those
 * after the first queued behind it so that they take its prompt from the memory, each with
 * its own seed (the request's + its index). Returns 0, or 500 / 503 (the tasks made so far
 * are in t, to cancel and unref). */
static int submit_choices(struct routes *r, const struct openai_request *req, struct task **t) {
    for (int i = 0; i < req->n_choices; i++) {
        struct gen_params g = req->g;
        g.sp.seed = req->g.sp.seed + (uint64_t)i;
        if (!(t[i] = task_new(req->prompt, req->n_prompt, &g))) return 500;
        if (i) task_after(t[i], t[0]);
    }
    for (int i = 0; i < req->n_choices; i++)
        if (slots_submit(r->slots, t[i])) return 503;
    return 0;
}

/* A stream that takes over the request, its tasks and what their channels gave so far; NULL
 * when out of memory (then nothing is taken). */
static struct stream *stream_new(struct routes *r, struct http_exchange *x, const struct openai_request *req, struct task **t,
                                 const struct task_chunk *chunk) {
    struct stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->r = r;
    s->conn = x->conn;
    s->req = *req;
    task_bell_init(&s->bell);
    s->n_choices = req->n_choices;
    for (int i = 0; i < s->n_choices; i++) {
        s->choice[i].t = t[i];
        s->choice[i].chunk = chunk[i];
        task_set_bell(t[i], &s->bell);
    }
    s->t_last_event_us = coti_time_us();
    s->log_id = x->id;
    snprintf(s->method, sizeof s->method, "%s", x->method);
    snprintf(s->url, sizeof s->url, "%s", x->url);
    s->t_start_us = x->t_start_us;
    return s;
}

/* The final, non-streamed answer of the finished choices (NULL when out of memory). */
static char *render_final(struct routes *r, const struct openai_request *req, const struct task_chunk *chunk) {
    const int n = req->n_choices;
    int32_t *ids[OPENAI_MAX_CHOICES] = {0}, *prob_ids[OPENAI_MAX_CHOICES] = {0};
    struct token_probs tp[OPENAI_MAX_CHOICES];
    struct openai_choice ch[OPENAI_MAX_CHOICES];
    bool ok = true;
    for (int i = 0; ok && i < n; i++) {
        /* the ids of the generated tokens (native return_tokens), and those with
         * log-probabilities: pieces carry them in order, probs[j] is the j-th such piece's */
        size_t n_ids, n_prob;
        ok = chunk_ids(&chunk[i], &ids[i], &n_ids, &prob_ids[i], &n_prob);
        tp[i] = (struct token_probs){prob_ids[i], chunk[i].probs, COTI_MIN(n_prob, chunk[i].n_probs)};
        ch[i] = (struct openai_choice){chunk[i].text ? chunk[i].text : "", chunk[i].n_text, ids[i], n_ids, &tp[i], &chunk[i].result};
    }
    char *json = ok ? openai_render_final(&r->oc, req, ch, n) : NULL;
    for (int i = 0; i < n; i++) {
        free(ids[i]);
        free(prob_ids[i]);
    }
    return json;
}

static enum MHD_Result route_generate(struct routes *r, struct http_exchange *x, enum openai_api api) {
    struct openai_error e = {0};
    cJSON *b = parse_body(r, x, &e);
    if (!b) return http_send_error(x, &e);
    struct openai_request req;
    int status = openai_parse_request(&r->oc, api, b, &req, &e);
    cJSON_Delete(b);
    if (status) return http_send_error(x, &e);
    const int n = req.n_choices;
    struct task *t[OPENAI_MAX_CHOICES] = {0};
    struct task_chunk chunk[OPENAI_MAX_CHOICES] = {0};
    status = submit_choices(r, &req, t);
    /* a stream's headers go out once the first choice's prompt is processed, so an early
     * failure is a plain error; the other choices follow it, and fail in the stream */
    bool gone = false;
    for (int i = 0; !status && !gone && i < (req.stream ? 1 : n); i++) gone = !wait_task(t[i], x->conn, &chunk[i], req.stream);
    for (int i = 0; !status && !gone && i < n; i++)
        if (chunk[i].done && chunk[i].result.status) status = task_error(&chunk[i].result, &e);
    if (!status && !gone && req.stream) {
        struct stream *s = stream_new(r, x, &req, t, chunk);
        if (s) return http_send_stream(x, stream_read, s, stream_free);
        status = 500;
    }
    char *json = NULL;
    if (!status && !gone) {
        json = render_final(r, &req, chunk);
        note_result(x->note, sizeof x->note, t[0], &chunk[0].result);
    }
    if (gone) snprintf(x->note, sizeof x->note, "task=%ld cancelled: client gone", task_id(t[0]));
    for (int i = 0; i < n; i++) {
        if (t[i] && (gone || status)) task_cancel(t[i]);
        task_unref(t[i]);
        task_chunk_free(&chunk[i]);
    }
    openai_request_free(&req);
    if (gone) return MHD_NO;
    if (status == 500 && !e.message[0]) openai_error_set(&e, 500, "server_error", "out of memory");
    if (status == 503 && !e.message[0]) openai_error_set(&e, 503, "unavailable_error", "the server is busy or shutting down, retry later");
    if (status) return http_send_error(x, &e);
    return http_send_json(x, 200, json);
}

static enum MHD_Result route_chat(struct routes *r, struct http_exchange *x) { return route_generate(r, x, OPENAI_API_CHAT); }
static enum MHD_Result route_completions(struct routes *r, struct http_exchange *x) {
    return route_generate(r, x, OPENAI_API_COMPLETIONS);
}
static enum MHD_Result route_native(struct routes *r, struct http_exchange *x) { return route_generate(r, x, OPENAI_API_NATIVE); }

/* ------------------------------------------------------------------------------------------
 * Routing */

typedef enum MHD_Result (*route_fn)(struct routes *r, struct http_exchange *x);

enum route_flags {
    ROUTE_OPEN = 1 << 0,         /* answered without the API key (health checks) */
    ROUTE_JSON = 1 << 1,         /* takes a JSON body: Content-Type application/json required */
};

static const struct route {
    const char *path;
    const char *method;
    route_fn fn;
    unsigned flags;
} route_table[] = {
    {"/health", "GET", route_health, ROUTE_OPEN},
    {"/v1/health", "GET", route_health, ROUTE_OPEN},
    {"/models", "GET", route_models, 0},
    {"/v1/models", "GET", route_models, 0},
    {"/props", "GET", route_props, 0},
    {"/props", "POST", route_props_post, 0},
    {"/slots", "GET", route_slots, 0},
    {"/metrics", "GET", route_metrics, 0},
    {"/tokenize", "POST", route_tokenize, ROUTE_JSON},
    {"/detokenize", "POST", route_detokenize, ROUTE_JSON},
    {"/apply-template", "POST", route_apply_template, ROUTE_JSON},
    {"/completion", "POST", route_native, ROUTE_JSON},
    {"/completions", "POST", route_native, ROUTE_JSON},
    {"/v1/completions", "POST", route_completions, ROUTE_JSON},
    {"/chat/completions", "POST", route_chat, ROUTE_JSON},
    {"/v1/chat/completions", "POST", route_chat, ROUTE_JSON},
};

/* a == b in time that depends on their lengths only, not on where they differ */
static bool equal_const_time(const char *a, const char *b) {
    const size_t na = strlen(a), nb = strlen(b);
    unsigned char diff = na != nb;
    for (size_t i = 0; i < nb; i++) diff |= (unsigned char)((i < na ? a[i] : 0) ^ b[i]);
    return diff == 0;
}

/* "Authorization: Bearer <key>" with the server's key (the scheme is case-insensitive,
 * RFC 9110 §11.1). */
static bool authorized(const struct routes *r, struct http_exchange *x) {
    const char *h = MHD_lookup_connection_value(x->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7)) return false;
    h += 7;
    while (*h == ' ') h++;
    return equal_const_time(h, r->p->api_key);
}

/* The media type is application/json (any case), with parameters allowed after ';' as long
 * as a charset, if given, is UTF-8 (RFC 8259 §8.1: JSON is UTF-8). A page in a browser can
 * send text/plain across origins without a preflight; it cannot send this. */
static bool json_content_type(struct http_exchange *x) {
    const char *ct = MHD_lookup_connection_value(x->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
    if (!ct) return false;
    while (*ct == ' ' || *ct == '\t') ct++;
    static const char want[] = "application/json";
    if (strncasecmp(ct, want, sizeof want - 1)) return false;
    const char *p = ct + sizeof want - 1;
    while (*p == ' ' || *p == '\t') p++;
    if (!*p) return true;
    if (*p != ';') return false;
    for (const char *cs = p; (cs = strchr(cs, ';'));) {
        cs++;
        while (*cs == ' ' || *cs == '\t') cs++;
        if (strncasecmp(cs, "charset=", 8)) continue;
        cs += 8;
        const bool quoted = *cs == '"';
        cs += quoted;
        if (strncasecmp(cs, "utf-8", 5)) return false;
        cs += 5;
        cs += quoted && *cs == '"';
        while (*cs == ' ' || *cs == '\t') cs++;
        if (*cs && *cs != ';') return false;
    }
    return true;
}

enum MHD_Result routes_handle(struct routes *r, struct http_exchange *x) {
    const char *method = !strcmp(x->method, "HEAD") ? "GET" : x->method;
    char allow[64] = "";
    for (size_t i = 0; i < COTI_ARRAY_LEN(route_table); i++) {
        const struct route *rt = &route_table[i];
        if (strcmp(rt->path, x->url)) continue;
        if (!strcmp(rt->method, method)) {
            struct openai_error e;
            /* OpenAI's answer to a missing or wrong key (browsers send preflights without one) */
            if (r->p->api_key && !(rt->flags & ROUTE_OPEN) && !authorized(r, x)) {
                openai_error_set(&e, 401, "authentication_error", "Invalid API Key");
                return http_send_error(x, &e);
            }
            if ((rt->flags & ROUTE_JSON) && !json_content_type(x)) {
                openai_error_set(&e, 415, "invalid_request_error", "the request body must be sent as Content-Type: application/json");
                return http_send_error(x, &e);
            }
            return rt->fn(r, x);
        }
        size_t n = strlen(allow);
        snprintf(allow + n, sizeof allow - n, "%s%s", n ? ", " : "", rt->method);
    }
    struct openai_error e;
    if (!allow[0]) {
        openai_error_set(&e, 404, "not_found_error", "File Not Found");
        return http_send_error(x, &e);
    }
    if (!strcmp(method, "OPTIONS")) return http_send_preflight(x, allow);
    openai_error_set(&e, 405, "invalid_request_error", "method %s is not allowed on %s (allowed: %s)",
                     strlen(x->method) < 16 ? x->method : "?", x->url, allow);
    return http_send_error_allow(x, &e, allow);
}
