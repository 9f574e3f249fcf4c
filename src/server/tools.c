/* tools.c — tool calling in the Hermes / Qwen3 format (tools.h). */
#include "server/tools.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "json_schema.h"
#include "server/openai.h"

static const char CALL_OPEN[] = "<tool_call>", CALL_CLOSE[] = "</tool_call>";

void tool_set_free(struct tool_set *t) {
    for (int i = 0; i < t->n; i++) free(t->decls[i]);
    free(t->decls);
    free(t->forced_grammar);
    memset(t, 0, sizeof *t);
}

/* ---- Python-style JSON ------------------------------------------------------------------ */

struct jbuf {
    char *p;
    size_t n, cap;
    bool oom;
};

static void jput(struct jbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (!coti_grow(&b->p, &b->cap, b->n + n + 1, 1, 256)) { b->oom = true; return; }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void jstr(struct jbuf *b, const char *s) {
    jput(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char esc[8];
        switch (c) {
        case '"': jput(b, "\\\"", 2); break;
        case '\\': jput(b, "\\\\", 2); break;
        case '\n': jput(b, "\\n", 2); break;
        case '\r': jput(b, "\\r", 2); break;
        case '\t': jput(b, "\\t", 2); break;
        case '\b': jput(b, "\\b", 2); break;
        case '\f': jput(b, "\\f", 2); break;
        default:
            if (c < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", c);
                jput(b, esc, 6);
            } else {
                jput(b, s, 1); /* UTF-8 stays as it is (ensure_ascii off) */
            }
        }
    }
    jput(b, "\"", 1);
}

static void jvalue(struct jbuf *b, const cJSON *v, int depth) {
    if (depth > 64) { b->oom = true; return; } /* cJSON itself refuses deeper nesting */
    if (cJSON_IsObject(v) || cJSON_IsArray(v)) {
        const bool obj = cJSON_IsObject(v);
        jput(b, obj ? "{" : "[", 1);
        for (const cJSON *c = v->child; c; c = c->next) {
            if (c != v->child) jput(b, ", ", 2);
            if (obj) {
                jstr(b, c->string ? c->string : "");
                jput(b, ": ", 2);
            }
            jvalue(b, c, depth + 1);
        }
        jput(b, obj ? "}" : "]", 1);
    } else if (cJSON_IsString(v)) {
        jstr(b, v->valuestring);
    } else {
        char *s = cJSON_PrintUnformatted(v); /* numbers, true, false, null */
        if (!s) { b->oom = true; return; }
        jput(b, s, strlen(s));
        free(s);
    }
}

char *tools_json_dumps(const cJSON *v) {
    struct jbuf b = {0};
    jvalue(&b, v, 0);
    if (b.oom) { free(b.p); return NULL; }
    return b.p;
}

/* ---- the request ------------------------------------------------------------------------ */

/* The schema of one block's JSON for tool d: {"name": <its name>, "arguments": <its parameters>}. */
static cJSON *call_schema(const cJSON *d) {
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(d, "function");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
    cJSON *s = cJSON_CreateObject(), *props = cJSON_CreateObject(), *nm = cJSON_CreateObject();
    cJSON *args = params ? cJSON_Duplicate(params, true) : cJSON_CreateObject();
    cJSON *req = cJSON_CreateArray(), *r0 = cJSON_CreateString("name"), *r1 = cJSON_CreateString("arguments");
    bool ok = s && props && nm && args && req && r0 && r1 && cJSON_AddStringToObject(s, "type", "object") &&
              cJSON_AddStringToObject(nm, "const", name->valuestring);
    if (ok && !params) ok = cJSON_AddStringToObject(args, "type", "object") != NULL;
    if (ok) {
        cJSON_AddItemToObject(props, "name", nm);
        cJSON_AddItemToObject(props, "arguments", args);
        cJSON_AddItemToObject(s, "properties", props);
        cJSON_AddItemToArray(req, r0);
        cJSON_AddItemToArray(req, r1);
        cJSON_AddItemToObject(s, "required", req);
        return s;
    }
    cJSON_Delete(s); cJSON_Delete(props); cJSON_Delete(nm); cJSON_Delete(args); cJSON_Delete(req);
    cJSON_Delete(r0); cJSON_Delete(r1);
    return NULL;
}

/* t->forced_grammar for the tools of `tools` (only the one named `only` when not NULL). The
 * blocks are written as the template writes a history's calls: <tool_call>, a newline, the
 * JSON, a newline, </tool_call>; several are separated by a newline. */
static int forced_grammar(const cJSON *tools, const char *only, bool many, struct tool_set *t, struct openai_error *e) {
    cJSON *any = cJSON_CreateObject(), *alts = cJSON_CreateArray();
    bool ok = any && alts;
    for (const cJSON *d = tools->child; ok && d; d = d->next) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(d, "function"), "name");
        if (only && strcmp(name->valuestring, only)) continue;
        cJSON *cs = call_schema(d);
        ok = cs != NULL;
        if (ok) cJSON_AddItemToArray(alts, cs);
    }
    if (ok) { cJSON_AddItemToObject(any, "anyOf", alts); alts = NULL; }
    char *rules = NULL, err[300];
    int rc = ok ? json_schema_to_rule(any, "call", &rules, err, sizeof err) : COTI_E_NOMEM;
    cJSON_Delete(any);
    cJSON_Delete(alts);
    if (rc == COTI_E_NOMEM) return openai_error_set(e, 500, "server_error", "out of memory");
    if (rc) return openai_error_set(e, 400, "invalid_request_error", "Field 'tools': %s (tool_choice forces a call, "
                                    "which needs the parameters as a grammar)", err);
    static const char block[] = "\"<tool_call>\\n\" call \"\\n</tool_call>\"";
    const size_t n = strlen(rules) + 2 * sizeof block + 64;
    if (!(t->forced_grammar = malloc(n))) { free(rules); return openai_error_set(e, 500, "server_error", "out of memory"); }
    snprintf(t->forced_grammar, n, "%sroot ::= %s%s%s%s\n", rules, block, many ? " (\"\\n\" " : "", many ? block : "",
             many ? ")*" : "");
    free(rules);
    return 0;
}

int tools_parse_request(const cJSON *body, bool template_has_tools, struct tool_set *t, struct openai_error *e) {
    memset(t, 0, sizeof *t);
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(body, "tools");
    const cJSON *choice = cJSON_GetObjectItemCaseSensitive(body, "tool_choice");
    const cJSON *par = cJSON_GetObjectItemCaseSensitive(body, "parallel_tool_calls");
    if (par && !cJSON_IsBool(par) && !cJSON_IsNull(par))
        return openai_error_set(e, 400, "invalid_request_error", "Field 'parallel_tool_calls': expected a boolean");
    bool none = false, required = false;
    const char *named = NULL;
    if (choice && !cJSON_IsNull(choice)) {
        const cJSON *fn = cJSON_IsObject(choice) ? cJSON_GetObjectItemCaseSensitive(choice, "function") : NULL;
        const cJSON *fname = cJSON_IsObject(fn) ? cJSON_GetObjectItemCaseSensitive(fn, "name") : NULL;
        const cJSON *type = cJSON_IsObject(choice) ? cJSON_GetObjectItemCaseSensitive(choice, "type") : NULL;
        if (cJSON_IsString(choice) && !strcmp(choice->valuestring, "none")) none = true;
        else if (cJSON_IsString(choice) && !strcmp(choice->valuestring, "required")) required = true;
        else if (cJSON_IsString(type) && !strcmp(type->valuestring, "function") && cJSON_IsString(fname)) named = fname->valuestring;
        else if (!(cJSON_IsString(choice) && !strcmp(choice->valuestring, "auto")))
            return openai_error_set(e, 400, "invalid_request_error",
                                    "Field 'tool_choice': expected \"none\", \"auto\", \"required\" or "
                                    "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
    const int n = cJSON_IsArray(tools) ? cJSON_GetArraySize(tools) : 0;
    if ((required || named) && n == 0)
        return openai_error_set(e, 400, "invalid_request_error", "Field 'tool_choice': a forced call needs 'tools'");
    if (!tools || cJSON_IsNull(tools)) return 0;
    if (!cJSON_IsArray(tools)) return openai_error_set(e, 400, "invalid_request_error", "Field 'tools': expected an array");
    if (n == 0) return 0;
    if (!template_has_tools)
        return openai_error_set(e, 400, "invalid_request_error",
                                "Field 'tools': the model's chat template does not define tool calls (a ChatML template "
                                "with <tool_call>, such as Qwen's, does; see --chat-template-file)");
    int i = 0;
    bool named_found = false;
    for (const cJSON *d = tools->child; d; d = d->next, i++) {
        const cJSON *type = cJSON_IsObject(d) ? cJSON_GetObjectItemCaseSensitive(d, "type") : NULL;
        const cJSON *fn = cJSON_IsObject(d) ? cJSON_GetObjectItemCaseSensitive(d, "function") : NULL;
        const cJSON *name = cJSON_IsObject(fn) ? cJSON_GetObjectItemCaseSensitive(fn, "name") : NULL;
        const cJSON *params = cJSON_IsObject(fn) ? cJSON_GetObjectItemCaseSensitive(fn, "parameters") : NULL;
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function"))
            return openai_error_set(e, 400, "invalid_request_error", "Field 'tools[%d].type': expected \"function\"", i);
        if (!cJSON_IsString(name) || !name->valuestring[0])
            return openai_error_set(e, 400, "invalid_request_error", "Field 'tools[%d].function.name': expected a non-empty string", i);
        if (params && !cJSON_IsObject(params))
            return openai_error_set(e, 400, "invalid_request_error", "Field 'tools[%d].function.parameters': expected a JSON schema object", i);
        if (named && !strcmp(named, name->valuestring)) named_found = true;
    }
    if (named && !named_found)
        return openai_error_set(e, 400, "invalid_request_error", "Field 'tool_choice': no tool named '%.64s' in 'tools'", named);
    t->decls = calloc((size_t)n, sizeof *t->decls);
    if (!t->decls) return openai_error_set(e, 500, "server_error", "out of memory");
    for (const cJSON *d = tools->child; d; d = d->next) {
        if (!(t->decls[t->n] = tools_json_dumps(d))) { tool_set_free(t); return openai_error_set(e, 500, "server_error", "out of memory"); }
        t->n++;
    }
    t->active = !none;
    if (required || named) {
        int rc = forced_grammar(tools, named, !named && !cJSON_IsFalse(par), t, e);
        if (rc) { tool_set_free(t); return rc; }
    }
    return 0;
}

int tools_message_calls(const cJSON *msg, int i, struct chat_tool_call **calls, size_t *n_calls, char ***owned,
                        size_t *n_owned, struct openai_error *e) {
    *calls = NULL;
    *n_calls = 0;
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(msg, "tool_calls");
    if (!tc || cJSON_IsNull(tc)) return 0;
    if (!cJSON_IsArray(tc)) return openai_error_set(e, 400, "invalid_request_error", "Field 'messages[%d].tool_calls': expected an array", i);
    const int n = cJSON_GetArraySize(tc);
    if (n == 0) return 0;
    struct chat_tool_call *c = calloc((size_t)n, sizeof *c);
    char **o = realloc(*owned, sizeof(char *) * (*n_owned + (size_t)n));
    if (!c || !o) { free(c); if (o) *owned = o; return openai_error_set(e, 500, "server_error", "out of memory"); }
    *owned = o;
    int k = 0;
    for (const cJSON *x = tc->child; x; x = x->next, k++) {
        const cJSON *fn = cJSON_IsObject(x) ? cJSON_GetObjectItemCaseSensitive(x, "function") : NULL;
        const cJSON *name = cJSON_IsObject(fn) ? cJSON_GetObjectItemCaseSensitive(fn, "name") : NULL;
        const cJSON *args = cJSON_IsObject(fn) ? cJSON_GetObjectItemCaseSensitive(fn, "arguments") : NULL;
        if (!cJSON_IsString(name)) {
            free(c);
            return openai_error_set(e, 400, "invalid_request_error",
                                    "Field 'messages[%d].tool_calls[%d].function.name': expected a string", i, k);
        }
        c[k].name = name->valuestring;
        if (cJSON_IsString(args)) {
            c[k].arguments = args->valuestring; /* the template writes a string as it is */
        } else if (cJSON_IsObject(args)) {
            if (!(o[(*n_owned)++] = tools_json_dumps(args))) { free(c); return openai_error_set(e, 500, "server_error", "out of memory"); }
            c[k].arguments = o[*n_owned - 1];
        } else {
            free(c);
            return openai_error_set(e, 400, "invalid_request_error",
                                    "Field 'messages[%d].tool_calls[%d].function.arguments': expected a JSON string", i, k);
        }
    }
    *calls = c;
    *n_calls = (size_t)n;
    return 0;
}

/* ---- the answer ------------------------------------------------------------------------- */

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

void tool_calls_out_free(struct tool_calls_out *o) {
    for (size_t i = 0; i < o->n; i++) {
        free(o->calls[i].name);
        free(o->calls[i].arguments);
    }
    free(o->calls);
    free(o->content);
    memset(o, 0, sizeof *o);
}

/* One block's inside, s[0, n): a JSON object with a string "name" and "arguments" (object, or a
 * string holding one). False when it is not one (or out of memory: *oom). */
static bool parse_call(const char *s, size_t n, struct tool_call_out *c, bool *oom) {
    cJSON *j = cJSON_ParseWithLength(s, n);
    const cJSON *name = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, "name") : NULL;
    const cJSON *args = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, "arguments") : NULL;
    bool ok = cJSON_IsString(name) && (!args || cJSON_IsObject(args) || cJSON_IsString(args));
    if (ok) {
        c->name = strdup(name->valuestring);
        c->arguments = !args ? strdup("{}") : cJSON_IsString(args) ? strdup(args->valuestring) : cJSON_PrintUnformatted(args);
        if (!c->name || !c->arguments) {
            free(c->name);
            free(c->arguments);
            *oom = true;
            ok = false;
        }
    }
    cJSON_Delete(j);
    return ok;
}

bool tools_parse_output(const char *text, size_t n, struct tool_calls_out *out) {
    memset(out, 0, sizeof *out);
    struct jbuf content = {0};
    size_t at = 0, cap = 0;
    bool oom = false, whole = true;
    while (at < n) {
        const char *open = memmem(text + at, n - at, CALL_OPEN, sizeof CALL_OPEN - 1);
        if (!open) break;
        const size_t body = (size_t)(open - text) + sizeof CALL_OPEN - 1;
        const char *close = memmem(text + body, n - body, CALL_CLOSE, sizeof CALL_CLOSE - 1);
        struct tool_call_out c = {0};
        if (!close || !coti_grow(&out->calls, &cap, out->n + 1, sizeof *out->calls, 4)) {
            whole = close != NULL;
            oom = close != NULL;
            break;
        }
        if (!parse_call(text + body, (size_t)(close - text) - body, &c, &oom)) { whole = false; break; }
        out->calls[out->n++] = c;
        jput(&content, text + at, (size_t)(open - text) - at);
        at = (size_t)(close - text) + sizeof CALL_CLOSE - 1;
    }
    if (oom || content.oom || !whole || out->n == 0) {
        /* not a well-formed answer with calls: all of it is content */
        for (size_t i = 0; i < out->n; i++) { free(out->calls[i].name); free(out->calls[i].arguments); }
        free(out->calls);
        out->calls = NULL;
        out->n = 0;
        free(content.p);
        if (oom || content.oom) return false;
        if (!(out->content = malloc(n + 1))) return false;
        memcpy(out->content, text, n);
        out->content[n] = 0;
        out->n_content = n;
        return true;
    }
    jput(&content, text + at, n - at);
    if (content.oom) { tool_calls_out_free(out); free(content.p); return false; }
    size_t b = 0, e = content.n;
    while (b < e && is_space(content.p[b])) b++;
    while (e > b && is_space(content.p[e - 1])) e--;
    if (e > b) {
        memmove(content.p, content.p + b, e - b);
        content.p[e - b] = 0;
        out->content = content.p;
        out->n_content = e - b;
    } else {
        free(content.p);
    }
    return true;
}

size_t tools_content_end(const char *text, size_t n) {
    const char *open = memmem(text, n, CALL_OPEN, sizeof CALL_OPEN - 1);
    if (open) return (size_t)(open - text);
    for (size_t k = COTI_MIN(sizeof CALL_OPEN - 2, n); k > 0; k--)
        if (!memcmp(text + n - k, CALL_OPEN, k)) return n - k;
    return n;
}

cJSON *tools_calls_json(const struct tool_calls_out *o, const char *id_base, bool delta) {
    cJSON *a = cJSON_CreateArray();
    bool ok = a != NULL;
    for (size_t i = 0; ok && i < o->n; i++) {
        cJSON *c = cJSON_CreateObject();
        char id[96];
        snprintf(id, sizeof id, "%s_%zu", id_base, i);
        ok = c && cJSON_AddItemToArray(a, c);
        if (!ok) { cJSON_Delete(c); break; }
        if (delta) cJSON_AddNumberToObject(c, "index", (double)i);
        cJSON_AddStringToObject(c, "id", id);
        cJSON_AddStringToObject(c, "type", "function");
        cJSON *fn = cJSON_AddObjectToObject(c, "function");
        /* the model's bytes, repaired into UTF-8 as every other text of an answer is */
        ok = fn && openai_add_text(fn, "name", o->calls[i].name, strlen(o->calls[i].name)) &&
             openai_add_text(fn, "arguments", o->calls[i].arguments, strlen(o->calls[i].arguments));
    }
    if (!ok) { cJSON_Delete(a); return NULL; }
    return a;
}
