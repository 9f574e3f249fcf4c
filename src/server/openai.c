/* openai.c — request fields and response shapes of the completion endpoints (see openai.h).
 * Field names, aliases, defaults and hard/clamped ranges follow llama.cpp's native schema
 * (server-api.md §3.2); the shapes follow server-task.cpp (§4, §5). Deviations, each chosen
 * so that a client is told rather than silently served something else, are listed in
 * docs/server.md: wrong JSON types and malformed JSON are 400 (llama.cpp: 500 for some),
 * unsupported features (several prompts, samplers such as Mirostat turned on, n > 1 on the
 * native endpoint) are 400, and the per-request `speculative.*` fields are honoured
 * (llama.cpp ignores them). */
#include "server/openai.h"

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "chat.h"
#include "json_schema.h"

/* chat_span and tokenizer_span are the same (off, len) pair: spans pass through as they are */
_Static_assert(sizeof(struct chat_span) == sizeof(struct tokenizer_span) &&
                   offsetof(struct chat_span, len) == offsetof(struct tokenizer_span, len),
               "chat_span and tokenizer_span must match");

/* ------------------------------------------------------------------------------------------
 * Errors */

int openai_error_set(struct openai_error *e, int status, const char *type, const char *fmt, ...) {
    e->status = status;
    e->type = type;
    e->n_prompt_tokens = e->n_ctx = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return status;
}

static int bad_request(struct openai_error *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad_request(struct openai_error *e, const char *fmt, ...) {
    e->status = 400;
    e->type = "invalid_request_error";
    e->n_prompt_tokens = e->n_ctx = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return 400;
}

static int out_of_memory(struct openai_error *e) { return openai_error_set(e, 500, "server_error", "out of memory"); }

char *openai_error_render(const struct openai_error *e) {
    cJSON *root = cJSON_CreateObject();
    cJSON *o = cJSON_AddObjectToObject(root, "error");
    if (o) {
        cJSON_AddNumberToObject(o, "code", e->status);
        openai_add_text(o, "message", e->message, strlen(e->message));
        cJSON_AddStringToObject(o, "type", e->type ? e->type : "server_error");
        if (e->type && !strcmp(e->type, "exceed_context_size_error")) {
            cJSON_AddNumberToObject(o, "n_prompt_tokens", e->n_prompt_tokens);
            cJSON_AddNumberToObject(o, "n_ctx", e->n_ctx);
        }
    }
    char *s = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return s;
}

/* ------------------------------------------------------------------------------------------
 * Text */

/* Length of the valid UTF-8 sequence at s[0..n), or 0 when it is not one (overlong forms,
 * surrogates and code points above U+10FFFF are invalid, as in RFC 3629). */
static size_t utf8_seq_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c >= 0x01 && c < 0x80) return 1;
    size_t len = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (len == 0 || len > n) return 0;
    for (size_t i = 1; i < len; i++) if ((s[i] & 0xC0) != 0x80) return 0;
    if (c == 0xE0 && s[1] < 0xA0) return 0;   /* overlong */
    if (c == 0xED && s[1] >= 0xA0) return 0;  /* surrogate */
    if (c == 0xF0 && s[1] < 0x90) return 0;   /* overlong */
    if (c == 0xF4 && s[1] >= 0x90) return 0;  /* above U+10FFFF */
    return len;
}

bool openai_add_text(cJSON *obj, const char *key, const char *text, size_t len) {
    size_t cap;
    if (!coti_mul_size(len, 3, &cap) || !coti_add_size(cap, 1, &cap)) return false;
    char *buf = malloc(cap);
    if (!buf) return false;
    size_t n = 0;
    const unsigned char *s = (const unsigned char *)text;
    for (size_t i = 0; i < len;) {
        size_t k = utf8_seq_len(s + i, len - i);
        if (k) {
            memcpy(buf + n, s + i, k);
            n += k;
            i += k;
        } else {
            memcpy(buf + n, "\xEF\xBF\xBD", 3);
            n += 3;
            i++;
        }
    }
    buf[n] = 0;
    bool ok = cJSON_AddStringToObject(obj, key, buf) != NULL;
    free(buf);
    return ok;
}

/* ------------------------------------------------------------------------------------------
 * Request fields */

/* A field, or NULL when absent or JSON null ("use the default", server-api.md §3.2). */
static const cJSON *field(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* Integer field k into *out (unchanged when absent). Out of [lo, hi]: clamped when clamp,
 * else 400 "Field 'k': Value must be between lo and hi" (llama.cpp's hard-limit wording). */
static int get_int(const cJSON *o, const char *k, double lo, double hi, bool clamp, double *out, struct openai_error *e) {
    const cJSON *v = field(o, k);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
        return bad_request(e, "Field '%s': expected an integer", k);
    double d = v->valuedouble;
    if (d < lo || d > hi) {
        if (!clamp) return bad_request(e, "Field '%s': Value must be between %.0f and %.0f", k, lo, hi);
        d = d < lo ? lo : hi;
    }
    *out = d;
    return 0;
}

static int get_num(const cJSON *o, const char *k, double lo, double hi, bool clamp, double *out, struct openai_error *e) {
    const cJSON *v = field(o, k);
    if (!v) return 0;
    if (!cJSON_IsNumber(v)) return bad_request(e, "Field '%s': expected a number", k);
    double d = v->valuedouble;
    if (!(d >= lo && d <= hi)) {
        if (!clamp) return bad_request(e, "Field '%s': Value must be between %g and %g", k, lo, hi);
        d = d < lo ? lo : hi;
    }
    *out = d;
    return 0;
}

static int get_bool(const cJSON *o, const char *k, bool *out, struct openai_error *e) {
    const cJSON *v = field(o, k);
    if (!v) return 0;
    if (!cJSON_IsBool(v)) return bad_request(e, "Field '%s': expected a boolean", k);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* `stop`: a string or an array of strings. Empty strings are dropped (they would match
 * everywhere). */
static int get_stop(const cJSON *o, struct gen_params *g, struct openai_error *e) {
    const cJSON *v = field(o, "stop");
    if (!v) return 0;
    const cJSON *one = cJSON_IsString(v) ? v : NULL;
    if (!one && !cJSON_IsArray(v)) return bad_request(e, "Field 'stop': expected a string or an array of strings");
    int n = one ? 1 : cJSON_GetArraySize(v);
    if (n > OPENAI_MAX_STOP) return bad_request(e, "Field 'stop': at most %d stop strings, got %d", OPENAI_MAX_STOP, n);
    g->stop = calloc((size_t)(n ? n : 1), sizeof *g->stop);
    if (!g->stop) return out_of_memory(e);
    for (int i = 0; i < n; i++) {
        const cJSON *s = one ? one : cJSON_GetArrayItem(v, i);
        if (!cJSON_IsString(s)) return bad_request(e, "Field 'stop': element %d is not a string", i);
        size_t len = strlen(s->valuestring);
        if (len > OPENAI_MAX_STOP_BYTES)
            return bad_request(e, "Field 'stop': a stop string has %zu bytes, at most %d are allowed", len, OPENAI_MAX_STOP_BYTES);
        if (len == 0) continue;
        if (!(g->stop[g->n_stop] = strdup(s->valuestring))) return out_of_memory(e);
        g->n_stop++;
    }
    return 0;
}

/* Per-request speculation: {"speculative": {"type", "n_max", "n_min", "p_min"}} and the flat
 * llama.cpp names "speculative.type" etc., the flat ones winning when both are given. */
static int get_spec(const struct openai_ctx *c, const cJSON *o, struct spec_params *p, struct openai_error *e) {
    const cJSON *nested = field(o, "speculative");
    if (nested && !cJSON_IsObject(nested)) return bad_request(e, "Field 'speculative': expected an object");
    const cJSON *srcs[2] = {nested, o};
    static const char *names[2][4] = {{"type", "n_max", "n_min", "p_min"},
                                      {"speculative.type", "speculative.n_max", "speculative.n_min", "speculative.p_min"}};
    bool n_min_given = false;
    int rc;
    for (int k = 0; k < 2; k++) {
        if (!srcs[k]) continue;
        const cJSON *t = field(srcs[k], names[k][0]);
        if (t) {
            if (!cJSON_IsString(t) || drafter_kind_parse(t->valuestring, &p->drafter)) {
                char choices[128];
                return bad_request(e, "Field '%s': expected %s", names[k][0], drafter_kind_choices(choices, sizeof choices, true, "\""));
            }
            if (!spec_engine_supports(c->eng, p->drafter))
                return bad_request(e, "Field '%s': speculation '%s' is not available for this model", names[k][0], t->valuestring);
        }
        double d = p->n_max;
        if ((rc = get_int(srcs[k], names[k][1], 1, SPEC_MAX_DRAFT, false, &d, e))) return rc;
        p->n_max = (int)d;
        d = p->n_min;
        if (field(srcs[k], names[k][2])) n_min_given = true;
        if ((rc = get_int(srcs[k], names[k][2], 0, SPEC_MAX_DRAFT, false, &d, e))) return rc;
        p->n_min = (int)d;
        d = p->p_min;
        if ((rc = get_num(srcs[k], names[k][3], 0, 1, false, &d, e))) return rc;
        p->p_min = (float)d;
    }
    if (p->n_min > p->n_max) {
        if (n_min_given) return bad_request(e, "Field 'speculative.n_min': Value must be between 0 and n_max (%d)", p->n_max);
        p->n_min = p->n_max; /* the server default n_min yields to a smaller requested n_max */
    }
    return 0;
}

/* Features llama.cpp has and coti does not: refuse rather than answer as if they were off. */
static int check_unsupported(const cJSON *o, struct openai_error *e) {
    const cJSON *v;
    static const char *absent[] = {"suffix"};
    for (size_t i = 0; i < COTI_ARRAY_LEN(absent); i++)
        if ((v = field(o, absent[i])) && !(cJSON_IsString(v) && !v->valuestring[0]) && !(cJSON_IsArray(v) && !cJSON_GetArraySize(v)) &&
            !(cJSON_IsObject(v) && !v->child))
            return bad_request(e, "Field '%s' is not supported by this server", absent[i]);
    if ((v = field(o, "echo")) && !cJSON_IsFalse(v)) return bad_request(e, "Field 'echo' is not supported");
    if ((v = field(o, "best_of")) && !(cJSON_IsNumber(v) && v->valuedouble == 1))
        return bad_request(e, "Field 'best_of': Value must be between 1 and 1 (one completion per choice)");
    return 0;
}

static uint64_t random_u64(void) {
    uint64_t x = 0;
    if (getrandom(&x, sizeof x, 0) != (ssize_t)sizeof x) x = (uint64_t)coti_time_us() * 0x9E3779B97F4A7C15ull;
    return x;
}

/* A seed for a request that asked for a random one: 32 bits, as llama.cpp draws them, so the
 * value reported in generation_settings is an exact JSON integer that, sent back, replays the
 * request; never 0xFFFFFFFF, which would mean "random" again. */
static uint64_t random_seed(void) {
    uint32_t x;
    do x = (uint32_t)random_u64();
    while (x == 0xFFFFFFFFu);
    return x;
}

/* llama.cpp samplers coti does not have. A request that turns one on is refused naming the
 * field rather than served without it; at its llama.cpp default (or any setting llama.cpp
 * skips it at) it is accepted. Their companion settings only matter while the sampler is on
 * (as in llama.cpp), so they are type-checked and accepted. */
static int check_unsupported_samplers(const cJSON *o, struct openai_error *e) {
    /* llama.cpp's defaults */
    double dry_multiplier = 0, dry_base = 1.75, dry_allowed_length = 2, dry_penalty_last_n = 64;
    double xtc_probability = 0, xtc_threshold = 0.1, top_n_sigma = -1, dynatemp_range = 0, dynatemp_exponent = 1;
    double mirostat = 0, mirostat_tau = 5, mirostat_eta = 0.1;
    int rc;
    if ((rc = get_num(o, "dry_multiplier", -FLT_MAX, FLT_MAX, false, &dry_multiplier, e)) ||
        (rc = get_num(o, "dry_base", -FLT_MAX, FLT_MAX, false, &dry_base, e)) ||
        (rc = get_int(o, "dry_allowed_length", 0, 2147483647.0, false, &dry_allowed_length, e)) ||
        (rc = get_int(o, "dry_penalty_last_n", -1, 2147483647.0, false, &dry_penalty_last_n, e)) ||
        (rc = get_num(o, "xtc_probability", -FLT_MAX, FLT_MAX, false, &xtc_probability, e)) ||
        (rc = get_num(o, "xtc_threshold", -FLT_MAX, FLT_MAX, false, &xtc_threshold, e)) ||
        (rc = get_num(o, "top_n_sigma", -FLT_MAX, FLT_MAX, false, &top_n_sigma, e)) ||
        (rc = get_num(o, "dynatemp_range", -FLT_MAX, FLT_MAX, false, &dynatemp_range, e)) ||
        (rc = get_num(o, "dynatemp_exponent", -FLT_MAX, FLT_MAX, false, &dynatemp_exponent, e)) ||
        (rc = get_int(o, "mirostat", 0, 2, false, &mirostat, e)) ||
        (rc = get_num(o, "mirostat_tau", -FLT_MAX, FLT_MAX, false, &mirostat_tau, e)) ||
        (rc = get_num(o, "mirostat_eta", -FLT_MAX, FLT_MAX, false, &mirostat_eta, e)))
        return rc;
    const cJSON *br = field(o, "dry_sequence_breakers");
    if (br) {
        bool ok = cJSON_IsArray(br);
        for (const cJSON *x = ok ? br->child : NULL; x; x = x->next) ok = ok && cJSON_IsString(x);
        if (!ok) return bad_request(e, "Field 'dry_sequence_breakers': expected an array of strings");
    }
    /* when each is off, as llama-sampler.cpp decides it: DRY with a zero multiplier or window,
     * XTC with a zero probability or a threshold above 0.5, top_n_sigma and dynatemp_range <= 0 */
    if (dry_multiplier != 0 && dry_penalty_last_n != 0)
        return bad_request(e, "Field 'dry_multiplier': DRY sampling is not supported by this server (0 turns it off)");
    if (xtc_probability > 0 && xtc_threshold <= 0.5)
        return bad_request(e, "Field 'xtc_probability': XTC sampling is not supported by this server (0 turns it off)");
    if (top_n_sigma > 0)
        return bad_request(e, "Field 'top_n_sigma': top-n-sigma sampling is not supported by this server (-1 turns it off)");
    if (dynatemp_range > 0)
        return bad_request(e, "Field 'dynatemp_range': dynamic temperature is not supported by this server (0 turns it off)");
    if (mirostat != 0) return bad_request(e, "Field 'mirostat': Mirostat sampling is not supported by this server (0 turns it off)");
    return 0;
}

/* llama.cpp's penalties and typical_p (server-api.md §3.2), with its limits: repeat_penalty
 * must be finite and > 0 (llama.cpp refuses the rest when it builds the sampler),
 * repeat_last_n is -1 (the whole context) or a window of >= 0 tokens (0: off). */
static int get_penalties(const cJSON *o, struct sampler_params *sp, struct openai_error *e) {
    int rc;
    double d = sp->repeat_last_n;
    if ((rc = get_int(o, "repeat_last_n", -1, 2147483647.0, false, &d, e))) return rc;
    sp->repeat_last_n = (int32_t)d;
    d = sp->repeat_penalty;
    if ((rc = get_num(o, "repeat_penalty", -FLT_MAX, FLT_MAX, false, &d, e))) return rc;
    if (!((float)d > 0)) return bad_request(e, "Field 'repeat_penalty': Value must be greater than 0 (1 turns it off)");
    sp->repeat_penalty = (float)d;
    d = sp->frequency_penalty;
    if ((rc = get_num(o, "frequency_penalty", -FLT_MAX, FLT_MAX, false, &d, e))) return rc;
    sp->frequency_penalty = (float)d;
    d = sp->presence_penalty;
    if ((rc = get_num(o, "presence_penalty", -FLT_MAX, FLT_MAX, false, &d, e))) return rc;
    sp->presence_penalty = (float)d;
    d = sp->typical_p;
    if ((rc = get_num(o, "typical_p", 0, 1, true, &d, e))) return rc;
    sp->typical_p = (float)d;
    return 0;
}

/* One logit_bias entry: key an id (a number, or a string of digits as OpenAI's map keys are)
 * or a token's text (every token of it, as llama.cpp does); value a number or false (ban). */
static int add_bias(const struct openai_ctx *c, const cJSON *key_num, const char *key_str, const cJSON *value,
                    struct logit_bias **list, size_t *n, size_t *cap, struct openai_error *e) {
    float b;
    if (cJSON_IsFalse(value)) b = -INFINITY;
    else if (cJSON_IsNumber(value) && isfinite(value->valuedouble)) b = (float)value->valuedouble;
    else return bad_request(e, "Field 'logit_bias': a bias must be a number or false");
    int32_t one;
    int32_t *ids = &one;
    size_t n_ids = 1;
    char *end = NULL;
    if (key_num) {
        if (key_num->valuedouble != floor(key_num->valuedouble)) return bad_request(e, "Field 'logit_bias': a token id must be an integer");
        one = key_num->valuedouble >= 0 && key_num->valuedouble < c->n_vocab ? (int32_t)key_num->valuedouble : -1;
        if (one < 0) return bad_request(e, "Field 'logit_bias': token id %.0f is outside the vocabulary of %d", key_num->valuedouble, c->n_vocab);
    } else if (key_str[0] && (one = (int32_t)strtol(key_str, &end, 10), *end == '\0')) {
        if (one < 0 || one >= c->n_vocab) return bad_request(e, "Field 'logit_bias': token id %s is outside the vocabulary of %d", key_str, c->n_vocab);
    } else {
        char err[128];
        ids = NULL;
        if (tokenizer_encode(c->tok, key_str, strlen(key_str), false, false, &ids, &n_ids, err, sizeof err))
            return bad_request(e, "Field 'logit_bias': cannot tokenize \"%.40s\"", key_str);
    }
    int rc = 0;
    if (!coti_grow(list, cap, *n + n_ids, sizeof **list, 16)) rc = out_of_memory(e);
    for (size_t i = 0; !rc && i < n_ids; i++) (*list)[(*n)++] = (struct logit_bias){ids[i], b};
    if (ids != &one) free(ids);
    return rc;
}

/* logit_bias: OpenAI's {"id": bias} or llama.cpp's [[id or text, bias or false], ...]. */
static int get_logit_bias(const struct openai_ctx *c, const cJSON *o, struct sampler_params *sp, struct openai_error *e) {
    const cJSON *v = field(o, "logit_bias");
    if (!v) return 0;
    struct logit_bias *list = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    if (cJSON_IsObject(v)) {
        for (const cJSON *m = v->child; m && !rc; m = m->next) rc = add_bias(c, NULL, m->string, m, &list, &n, &cap, e);
    } else if (cJSON_IsArray(v)) {
        for (const cJSON *m = v->child; m && !rc; m = m->next) {
            const cJSON *k = cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 ? m->child : NULL;
            if (!k || !(cJSON_IsNumber(k) || cJSON_IsString(k)))
                rc = bad_request(e, "Field 'logit_bias': expected [token id or text, bias] pairs");
            else rc = add_bias(c, cJSON_IsNumber(k) ? k : NULL, cJSON_IsString(k) ? k->valuestring : NULL, k->next, &list, &n, &cap, e);
        }
    } else {
        rc = bad_request(e, "Field 'logit_bias': expected an object or an array");
    }
    if (rc || n == 0) { free(list); return rc; }
    free((void *)sp->bias);
    sp->bias = list;
    sp->n_bias = (int32_t)n;
    return 0;
}

/* Token log-probabilities: chat's `logprobs` (bool) + `top_logprobs` (0..20, OpenAI's rule: only
 * with logprobs), completions' `logprobs` (the number of alternatives), native `n_probs` (> 0
 * asks). Into g->n_probs (< 0: none). */
static int get_probs(const cJSON *o, enum openai_api api, struct gen_params *g, struct openai_error *e) {
    int rc;
    double n = -1;
    const cJSON *lp = field(o, "logprobs"), *top = field(o, "top_logprobs");
    if (api == OPENAI_API_CHAT) {
        bool want = false;
        if ((rc = get_bool(o, "logprobs", &want, e))) return rc;
        if (top && !cJSON_IsNull(top) && !want) return bad_request(e, "Field 'top_logprobs': only with \"logprobs\": true");
        double k = 0;
        if ((rc = get_int(o, "top_logprobs", 0, SPEC_MAX_TOP_LOGPROBS, false, &k, e))) return rc;
        n = want ? k : -1;
    } else if (api == OPENAI_API_COMPLETIONS) {
        if (lp && !cJSON_IsNull(lp) && (rc = get_int(o, "logprobs", 0, SPEC_MAX_TOP_LOGPROBS, false, &n, e))) return rc;
    } else {
        double k = 0;
        if ((rc = get_int(o, "n_probs", 0, SPEC_MAX_TOP_LOGPROBS, false, &k, e))) return rc;
        n = k > 0 ? k : -1;
    }
    g->n_probs = (int)n;
    return 0;
}

/* Compile GBNF text (taken, malloc'ed) as g's constraint; a bad one is a 400 naming field. */
static int set_grammar(struct gen_params *g, char *text, const char *field_name, struct openai_error *e) {
    char err[300];
    int rc = grammar_parse(&g->grammar, text, strlen(text), err, sizeof err);
    if (rc) {
        free(text);
        if (rc == COTI_E_NOMEM) return openai_error_set(e, 500, "server_error", "out of memory");
        return bad_request(e, "Field '%s': %s", field_name, err);
    }
    g->grammar_text = text;
    g->spec.grammar = g->grammar;
    return 0;
}

/* Constrained decoding: llama.cpp's `grammar` (GBNF) and `json_schema`, OpenAI's
 * `response_format` {type: text | json_object | json_schema with json_schema.schema}; at most
 * one of them. The GBNF is compiled here, so a bad one is a 400 naming its field. */
static int get_grammar(const cJSON *o, struct gen_params *g, struct openai_error *e) {
    const cJSON *gr = field(o, "grammar"), *js = field(o, "json_schema"), *rf = field(o, "response_format");
    if (gr && cJSON_IsNull(gr)) gr = NULL;
    if (gr && !cJSON_IsString(gr)) return bad_request(e, "Field 'grammar': expected a string");
    if (gr && !gr->valuestring[0]) gr = NULL;
    if (js && (cJSON_IsNull(js) || (cJSON_IsObject(js) && !js->child))) js = NULL; /* llama.cpp's "none" */
    const char *name = NULL;
    const cJSON *schema = NULL;
    char *text = NULL, err[300];
    if (rf && !cJSON_IsNull(rf)) {
        const cJSON *t = cJSON_IsObject(rf) ? field(rf, "type") : NULL;
        if (!t || !cJSON_IsString(t)) return bad_request(e, "Field 'response_format': expected an object with a string 'type'");
        if (!strcmp(t->valuestring, "json_object")) {
            name = "response_format";
            schema = field(rf, "schema"); /* llama.cpp accepts a schema here too */
            if (!schema && !(text = json_schema_object_grammar())) return openai_error_set(e, 500, "server_error", "out of memory");
        } else if (!strcmp(t->valuestring, "json_schema")) {
            const cJSON *j = field(rf, "json_schema");
            schema = cJSON_IsObject(j) ? field(j, "schema") : NULL;
            if (!schema) return bad_request(e, "Field 'response_format': type json_schema needs json_schema.schema");
            name = "response_format";
        } else if (strcmp(t->valuestring, "text")) {
            return bad_request(e, "Field 'response_format': type must be text, json_object or json_schema");
        }
    }
    if (!!gr + !!js + !!name > 1) {
        free(text);
        return bad_request(e, "Field 'grammar': give only one of grammar, json_schema and response_format");
    }
    if (js) { name = "json_schema"; schema = js; }
    if (schema) {
        if (json_schema_to_grammar(schema, &text, err, sizeof err))
            return bad_request(e, "Field '%s': %s", name, err);
    } else if (gr) {
        name = "grammar";
        if (!(text = strdup(gr->valuestring))) return openai_error_set(e, 500, "server_error", "out of memory");
    }
    return text ? set_grammar(g, text, name, e) : 0;
}

/* Sampling, limits and speculation (server-api.md §3.2). */
static int parse_params(const struct openai_ctx *c, const cJSON *o, struct openai_request *r, struct openai_error *e) {
    struct gen_params *g = &r->g;
    int rc;
    g->sp = c->sampling;
    g->spec = c->spec;
    g->n_predict = c->n_predict;
    g->cache_prompt = true;
    g->n_probs = -1;
    const cJSON *model = field(o, "model");
    if (model && !cJSON_IsString(model)) return bad_request(e, "Field 'model': expected a string");
    if ((rc = check_unsupported(o, e))) return rc;

    /* n_predict and its aliases, in llama.cpp's precedence order */
    static const char *np_names[] = {"n_predict", "max_completion_tokens", "max_tokens"};
    for (size_t i = 0; i < COTI_ARRAY_LEN(np_names); i++) {
        if (!field(o, np_names[i])) continue;
        double d = 0;
        if ((rc = get_int(o, np_names[i], -1, 2147483647.0, false, &d, e))) return rc;
        g->n_predict = (int)d;
        break;
    }
    double d = g->sp.temperature;
    if ((rc = get_num(o, "temperature", 0, 1e9, true, &d, e))) return rc;
    g->sp.temperature = (float)d;
    d = g->sp.top_k;
    if ((rc = get_int(o, "top_k", 0, 2147483647.0, true, &d, e))) return rc;
    g->sp.top_k = (int32_t)d;
    d = g->sp.top_p;
    if ((rc = get_num(o, "top_p", 0, 1, true, &d, e))) return rc;
    g->sp.top_p = (float)d;
    d = g->sp.min_p;
    if ((rc = get_num(o, "min_p", 0, 1, true, &d, e))) return rc;
    g->sp.min_p = (float)d;
    d = g->sp.min_keep;
    if ((rc = get_int(o, "min_keep", 0, 2147483647.0, true, &d, e))) return rc;
    g->sp.min_keep = (int32_t)d;
    if ((rc = get_penalties(o, &g->sp, e))) return rc;
    if ((rc = check_unsupported_samplers(o, e))) return rc;
    /* seed: -1 and 0xFFFFFFFF (llama.cpp's LLAMA_DEFAULT_SEED) mean "random"; any integer up
     * to 2^53 is taken exactly (a JSON number is a double) */
    d = -1;
    if ((rc = get_int(o, "seed", -1, 9007199254740992.0, false, &d, e))) return rc;
    if (d >= 0 && d != 4294967295.0) g->sp.seed = (uint64_t)d;
    else if (d < 0 && c->seed_fixed && !field(o, "seed")) g->sp.seed = c->sampling.seed;
    else g->sp.seed = random_seed();
    if ((rc = get_stop(o, g, e))) return rc;
    if ((rc = get_bool(o, "stream", &r->stream, e))) return rc;
    if ((rc = get_bool(o, "ignore_eos", &g->ignore_eos, e))) return rc;
    if ((rc = get_bool(o, "cache_prompt", &g->cache_prompt, e))) return rc;
    if ((rc = get_probs(o, r->api, g, e))) return rc;
    if ((rc = get_logit_bias(c, o, &g->sp, e))) return rc;
    /* n (OpenAI) / n_cmpl (llama.cpp): independent answers */
    double nc = 1;
    for (size_t i = 0; i < 2; i++)
        if ((rc = get_int(o, i ? "n_cmpl" : "n", 1, OPENAI_MAX_CHOICES, false, &nc, e))) return rc;
    r->n_choices = (int)nc;
    if (r->n_choices > 1 && r->api == OPENAI_API_NATIVE)
        return bad_request(e, "Field 'n': one answer per request on /completion (use /v1/completions)");
    if ((rc = get_bool(o, "return_tokens", &r->return_tokens, e))) return rc;
    if ((rc = get_bool(o, "timings_per_token", &r->timings_per_token, e))) return rc;
    const cJSON *so = field(o, "stream_options");
    if (so && !cJSON_IsObject(so)) return bad_request(e, "Field 'stream_options': expected an object");
    if (so && (rc = get_bool(so, "include_usage", &r->include_usage, e))) return rc;
    if ((rc = get_spec(c, o, &g->spec, e))) return rc;
    return get_grammar(o, g, e);
}

/* ------------------------------------------------------------------------------------------
 * Prompts */

struct tokv {
    int32_t *p;
    size_t n, cap;
    long limit;                  /* most tokens wanted (< 0: any number) */
    bool over;                   /* more than limit: the prompt cannot be served */
    size_t n_least;              /* with over: tokens the prompt has at least */
};

static bool tokv_push(struct tokv *v, const int32_t *ids, size_t n) {
    if (!coti_grow(&v->p, &v->cap, v->n + n, sizeof *v->p, 64)) return false;
    if (n) memcpy(v->p + v->n, ids, n * sizeof *ids);
    v->n += n;
    if (v->limit >= 0 && v->n > (size_t)v->limit && !v->over) {
        v->over = true;
        v->n_least = v->n;
    }
    return true;
}

/* Tokenize s[0..len) onto v; lit[0..n_lit) are message spans (tokenizer_opts.literal). With
 * a limit, a text that must yield more tokens than are left is refused by its length before
 * any work (tokenizer_max_input_per_token), and the tokenizer stops one token past the limit,
 * so a prompt that cannot fit costs neither the time nor the memory of its full tokenization. */
static int encode_text(const struct openai_ctx *c, const char *s, size_t len, const struct tokenizer_span *lit,
                       size_t n_lit, bool add_special, bool parse_special, struct tokv *v, struct openai_error *e) {
    if (v->over) return 0;
    struct tokenizer_opts o = {.add_special = add_special, .parse_special = parse_special, .literal = lit, .n_literal = n_lit};
    if (v->limit >= 0) {
        const size_t per = tokenizer_max_input_per_token(c->tok);
        const size_t least = per ? len / per + (len % per != 0) : 0;
        const size_t left = (size_t)v->limit - v->n;
        if (least > left) {
            v->over = true;
            v->n_least = v->n + least;
            return 0;
        }
        o.max_tokens = left ? left : 1; /* 0 would mean "no limit"; one over is over either way */
    }
    int32_t *ids = NULL;
    size_t n = 0;
    char err[256];
    int rc = tokenizer_encode_opts(c->tok, s, len, &o, &ids, &n, err, sizeof err);
    if (rc == COTI_E_NOMEM) return out_of_memory(e);
    if (rc) return bad_request(e, "cannot tokenize the prompt: %s", err);
    bool ok = tokv_push(v, ids, n);
    free(ids);
    return ok ? 0 : out_of_memory(e);
}

static int too_long(const struct openai_ctx *c, size_t n_least, struct openai_error *e) {
    openai_error_set(e, 400, "exceed_context_size_error",
                     "the request exceeds the available context size (at least %zu tokens in the prompt, %d in the "
                     "context), try increasing it", n_least, c->n_ctx);
    e->n_prompt_tokens = n_least > INT32_MAX ? INT32_MAX : (int)n_least;
    e->n_ctx = c->n_ctx;
    return 400;
}

int openai_tokenize_prompt(const struct openai_ctx *c, const cJSON *v, const char *name, bool add_special,
                           bool parse_special, long max_tokens, int32_t **out, int *n_out, struct openai_error *e) {
    struct tokv tv = {.limit = max_tokens};
    int rc = 0;
    *out = NULL;
    *n_out = 0;
    if (cJSON_IsString(v)) {
        rc = encode_text(c, v->valuestring, strlen(v->valuestring), NULL, 0, add_special, parse_special, &tv, e);
    } else if (cJSON_IsArray(v)) {
        /* one-element batch [[...]] / ["..."] is that prompt; a batch of several is not served */
        int n = cJSON_GetArraySize(v);
        bool all_strings = n > 0;
        for (const cJSON *it = v->child; it; it = it->next) all_strings = all_strings && cJSON_IsString(it);
        if (n == 1 && cJSON_IsArray(v->child))
            return openai_tokenize_prompt(c, v->child, name, add_special, parse_special, max_tokens, out, n_out, e);
        if (all_strings && n > 1 && strcmp(name, "content") != 0)
            return bad_request(e, "Field '%s': several prompts in one request are not supported", name);
        int i = 0;
        for (const cJSON *it = v->child; it && !rc && !tv.over; it = it->next, i++) {
            if (cJSON_IsString(it)) {
                /* BOS only in front, and only when the prompt starts with text (llama.cpp) */
                rc = encode_text(c, it->valuestring, strlen(it->valuestring), NULL, 0, add_special && i == 0, parse_special, &tv, e);
            } else if (cJSON_IsNumber(it)) {
                double d = it->valuedouble;
                if (d != floor(d) || d < 0 || d >= c->n_vocab) {
                    rc = bad_request(e, "Field '%s': invalid token %g at index %d (the vocabulary has %d tokens)", name, d, i, c->n_vocab);
                } else {
                    int32_t id = (int32_t)d;
                    if (!tokv_push(&tv, &id, 1)) rc = out_of_memory(e);
                }
            } else if (cJSON_IsArray(it) || cJSON_IsObject(it)) {
                rc = bad_request(e, "Field '%s': several prompts in one request are not supported", name);
            } else {
                rc = bad_request(e, "Field '%s': element %d must be a string or a token id", name, i);
            }
        }
    } else {
        rc = bad_request(e, "Field '%s': expected a string or an array of tokens", name);
    }
    if (!rc && tv.over) rc = too_long(c, tv.n_least, e);
    if (!rc && tv.n > (size_t)INT32_MAX / 2) rc = bad_request(e, "Field '%s': too many tokens", name);
    if (rc) {
        free(tv.p);
        return rc;
    }
    *out = tv.p;
    *n_out = (int)tv.n;
    return 0;
}

static int render_messages(const struct openai_ctx *c, const cJSON *body, const struct tool_set *ts,
                           struct chat_prompt *out, struct chat_prompt *head, struct openai_error *e);

/* openai_render_chat, and into *head (when not NULL) the messages but the last without a
 * generation prompt (empty when there is one message). */
static int render_chat(const struct openai_ctx *c, const cJSON *body, struct chat_prompt *out, struct chat_prompt *head,
                       struct tool_set *tools, struct openai_error *e) {
    memset(out, 0, sizeof *out);
    if (head) memset(head, 0, sizeof *head);
    struct tool_set local;
    struct tool_set *ts = tools ? tools : &local;
    int rc = tools_parse_request(body, chat_defines_tools(c->chat_template), ts, e);
    if (rc) return rc;
    rc = render_messages(c, body, ts, out, head, e);
    if (rc || !tools) tool_set_free(ts);
    return rc;
}

int openai_render_chat(const struct openai_ctx *c, const cJSON *body, struct chat_prompt *out, struct tool_set *tools,
                       struct openai_error *e) {
    return render_chat(c, body, out, NULL, tools, e);
}

/* openai_render_chat's messages, with the tools ts parsed. */
static int render_messages(const struct openai_ctx *c, const cJSON *body, const struct tool_set *ts,
                           struct chat_prompt *out, struct chat_prompt *head, struct openai_error *e) {
    const cJSON *msgs = field(body, "messages");
    if (!msgs) return bad_request(e, "'messages' is required");
    if (!cJSON_IsArray(msgs)) return bad_request(e, "Field 'messages': expected an array");
    int n = cJSON_GetArraySize(msgs);
    if (n == 0) return bad_request(e, "Field 'messages': expected a non-empty array");
    bool add_gen = true, thinking = true;
    int rc;
    if ((rc = get_bool(body, "add_generation_prompt", &add_gen, e))) return rc;
    char **owned_args = NULL;    /* tool-call arguments the request sent as objects, as text */
    size_t n_owned_args = 0;
    const cJSON *kw = field(body, "chat_template_kwargs");
    if (kw && !cJSON_IsObject(kw)) return bad_request(e, "Field 'chat_template_kwargs': expected an object");
    if (kw && (rc = get_bool(kw, "enable_thinking", &thinking, e))) return rc;
    const cJSON *effort = field(body, "reasoning_effort");
    if (effort && cJSON_IsString(effort) && !strcmp(effort->valuestring, "none")) thinking = false;

    struct chat_message *cm = calloc((size_t)n, sizeof *cm);
    char **owned = calloc((size_t)n, sizeof *owned);
    struct chat_tool_call **calls = calloc((size_t)n, sizeof *calls); /* each message's, NULL: none */
    size_t *n_calls = calloc((size_t)n, sizeof *n_calls);
    if (!cm || !owned || !calls || !n_calls) { free(cm); free(owned); free(calls); free(n_calls); return out_of_memory(e); }
    int i = 0;
    rc = 0;
    for (const cJSON *m = msgs->child; m && !rc; m = m->next, i++) {
        const cJSON *role = cJSON_IsObject(m) ? field(m, "role") : NULL;
        if (!cJSON_IsObject(m)) { rc = bad_request(e, "Field 'messages': element %d is not an object", i); break; }
        if (!role || !cJSON_IsString(role)) { rc = bad_request(e, "Field 'messages[%d].role': expected a string", i); break; }
        cm[i].role = role->valuestring;
        if ((rc = tools_message_calls(m, i, &calls[i], &n_calls[i], &owned_args, &n_owned_args, e))) break;
        const cJSON *content = field(m, "content");
        bool assistant = !strcmp(role->valuestring, "assistant");
        if (!content) {
            /* llama.cpp: only an assistant message (with tool calls) may omit its content */
            if (!assistant) { rc = bad_request(e, "Field 'messages[%d].content' is required", i); break; }
            cm[i].content = "";
        } else if (cJSON_IsNull(content) && assistant) {
            cm[i].content = ""; /* an assistant turn with tool calls only */
        } else if (cJSON_IsString(content)) {
            cm[i].content = content->valuestring;
        } else if (cJSON_IsArray(content)) {
            /* parts: concatenate the text ones; media parts need a vision model we do not have */
            size_t len = 0;
            for (const cJSON *p = content->child; p && !rc; p = p->next) {
                const cJSON *type = cJSON_IsObject(p) ? field(p, "type") : NULL;
                const cJSON *text = cJSON_IsObject(p) ? field(p, "text") : NULL;
                if (!type || !cJSON_IsString(type) || strcmp(type->valuestring, "text") || !text || !cJSON_IsString(text))
                    rc = bad_request(e, "Field 'messages[%d].content': only {\"type\": \"text\", \"text\": ...} parts are supported", i);
                else len += strlen(text->valuestring);
            }
            if (rc) break;
            if (!(owned[i] = malloc(len + 1))) { rc = out_of_memory(e); break; }
            owned[i][0] = 0;
            size_t at = 0;
            for (const cJSON *p = content->child; p; p = p->next) {
                const char *t = field(p, "text")->valuestring;
                size_t k = strlen(t);
                memcpy(owned[i] + at, t, k + 1);
                at += k;
            }
            cm[i].content = owned[i];
        } else {
            rc = bad_request(e, "Field 'messages[%d].content': expected a string, an array of parts or null", i);
        }
    }
    if (!rc) {
        char err[256];
        const struct chat_tools tools = {(const char *const *)ts->decls, ts->active ? (size_t)ts->n : 0,
                                         (const struct chat_tool_call *const *)calls, n_calls};
        int crc = chat_render_tools(c->chat_template, cm, (size_t)n, &tools, add_gen, thinking, out, err, sizeof err);
        if (crc == COTI_E_NOMEM) rc = out_of_memory(e);
        else if (crc) rc = bad_request(e, "cannot apply the chat template: %s", err);
        /* the conversation before its last message: where a follow-up request shares the prompt */
        if (!rc && head && n >= 2 &&
            chat_render_tools(c->chat_template, cm, (size_t)n - 1, &tools, false, thinking, head, err, sizeof err))
            memset(head, 0, sizeof *head);
    }
    for (int k = 0; k < n; k++) free(calls[k]);
    free(calls);
    free(n_calls);
    for (size_t k = 0; k < n_owned_args; k++) free(owned_args[k]);
    free(owned_args);
    for (int k = 0; k < n; k++) free(owned[k]);
    free(owned);
    free(cm);
    return rc;
}

void openai_request_free(struct openai_request *r) {
    gen_params_free(&r->g);
    tool_set_free(&r->tools);
    free(r->prompt);
    r->prompt = NULL;
    r->n_prompt = 0;
}

/* The tokens of a conversation's head (all messages but the last) when they are exactly the
 * first tokens of the full prompt (its text a prefix, tokenized alike): the position a follow-up
 * or a request sharing the system prompt resumes from. 0 when not. */
static int shared_prefix_tokens(const struct openai_ctx *c, const struct chat_prompt *head, const struct chat_prompt *full,
                                const int32_t *prompt, int n_prompt) {
    if (!head->text || head->n_text == 0 || head->n_text >= full->n_text || memcmp(head->text, full->text, head->n_text))
        return 0;
    struct tokv tv = {.limit = n_prompt};
    struct openai_error e;
    int n = 0;
    if (!encode_text(c, head->text, head->n_text, (const struct tokenizer_span *)head->spans, head->n_spans, true, true,
                     &tv, &e) &&
        !tv.over && tv.n > 0 && (int)tv.n < n_prompt && !memcmp(tv.p, prompt, sizeof(int32_t) * tv.n))
        n = (int)tv.n;
    free(tv.p);
    return n;
}

int openai_parse_request(const struct openai_ctx *c, enum openai_api api, const cJSON *body,
                         struct openai_request *r, struct openai_error *e) {
    memset(r, 0, sizeof *r);
    r->api = api;
    r->created = (long)time(NULL);
    static const char alnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    memcpy(r->id, "chatcmpl-", 9);
    for (int i = 0; i < 32; i += 8) {
        uint64_t x = random_u64();
        for (int k = 0; k < 8; k++, x >>= 8) r->id[9 + i + k] = alnum[(x & 0xFF) % 62];
    }
    r->id[41] = 0;
    if (!cJSON_IsObject(body)) return bad_request(e, "the request body must be a JSON object");
    int rc = parse_params(c, body, r, e);
    if (!rc) {
        /* a prompt must leave room for one generated token: n_ctx - 1 tokens at most */
        const long limit = c->n_ctx - 1;
        if (api == OPENAI_API_CHAT) {
            struct chat_prompt cp, head;
            rc = render_chat(c, body, &cp, &head, &r->tools, e);
            /* a forced tool call is a grammar, so it cannot be combined with another one */
            if (!rc && r->tools.forced_grammar && r->g.grammar)
                rc = bad_request(e, "Field 'tool_choice': a forced tool call cannot be combined with grammar, json_schema "
                                 "or response_format");
            char *forced = !rc && r->tools.forced_grammar ? strdup(r->tools.forced_grammar) : NULL;
            if (!rc && r->tools.forced_grammar)
                rc = forced ? set_grammar(&r->g, forced, "tool_choice", e) : openai_error_set(e, 500, "server_error", "out of memory");
            if (!rc) {
                /* the template's markers are special tokens, the messages' text never is
                 * (chat_span); the vocabulary adds BOS where it asks for one */
                struct tokv tv = {.limit = limit};
                rc = encode_text(c, cp.text, cp.n_text, (const struct tokenizer_span *)cp.spans, cp.n_spans, true, true, &tv, e);
                if (!rc && tv.over) rc = too_long(c, tv.n_least, e);
                if (rc) {
                    free(tv.p);
                } else {
                    r->prompt = tv.p;
                    r->n_prompt = (int)tv.n;
                    r->g.reuse_mark = shared_prefix_tokens(c, &head, &cp, r->prompt, r->n_prompt);
                }
            }
            chat_prompt_free(&cp);
            chat_prompt_free(&head);
        } else {
            const cJSON *p = field(body, "prompt");
            const cJSON *t = field(body, "tools");
            if (t && !(cJSON_IsArray(t) && cJSON_GetArraySize(t) == 0) && !cJSON_IsNull(t))
                rc = bad_request(e, "Field 'tools': tool calling is for /v1/chat/completions");
            else if (!p) rc = bad_request(e, "'prompt' is required");
            else rc = openai_tokenize_prompt(c, p, "prompt", tokenizer_add_bos(c->tok), true, limit, &r->prompt, &r->n_prompt, e);
        }
    }
    if (!rc && r->n_prompt == 0) rc = bad_request(e, "the prompt is empty");
    if (rc) openai_request_free(r);
    return rc;
}

/* ------------------------------------------------------------------------------------------
 * Responses */

cJSON *openai_timings(const struct task_result *res) {
    cJSON *t = cJSON_CreateObject();
    if (!t) return NULL;
    /* divisions by zero give NaN/inf, which cJSON prints as null, as llama.cpp's writer does */
    double pn = res->prompt_n, gn = res->predicted_n;
    cJSON_AddNumberToObject(t, "cache_n", res->cache_n);
    cJSON_AddNumberToObject(t, "prompt_n", res->prompt_n);
    cJSON_AddNumberToObject(t, "prompt_ms", res->prompt_ms);
    cJSON_AddNumberToObject(t, "prompt_per_token_ms", res->prompt_ms / pn);
    cJSON_AddNumberToObject(t, "prompt_per_second", 1e3 * pn / res->prompt_ms);
    cJSON_AddNumberToObject(t, "predicted_n", res->predicted_n);
    cJSON_AddNumberToObject(t, "predicted_ms", res->predicted_ms);
    cJSON_AddNumberToObject(t, "predicted_per_token_ms", res->predicted_ms / gn);
    cJSON_AddNumberToObject(t, "predicted_per_second", 1e3 * gn / res->predicted_ms);
    if (res->draft_n > 0) {
        cJSON_AddNumberToObject(t, "draft_n", (double)res->draft_n);
        cJSON_AddNumberToObject(t, "draft_n_accepted", (double)res->draft_n_accepted);
    }
    return t;
}

/* usage of choices that generated n_completion tokens in all from res's prompt */
static cJSON *usage_json(const struct task_result *res, long n_completion) {
    cJSON *u = cJSON_CreateObject();
    if (!u) return NULL;
    cJSON_AddNumberToObject(u, "completion_tokens", (double)n_completion);
    cJSON_AddNumberToObject(u, "prompt_tokens", res->n_prompt);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(res->n_prompt + n_completion));
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    if (d) cJSON_AddNumberToObject(d, "cached_tokens", res->cache_n);
    return u;
}

static const char *finish_reason(const struct task_result *res) {
    return res->stop_type == STOP_TYPE_LIMIT ? "length" : "stop";
}

/* A chat answer that called tools ends with "tool_calls" unless the token limit cut it. */
static const char *chat_finish_reason(const struct task_result *res, bool called) {
    return called && res->stop_type != STOP_TYPE_LIMIT ? "tool_calls" : finish_reason(res);
}

/* The fields every OpenAI-shaped object carries. */
static void add_envelope(cJSON *o, const struct openai_ctx *c, const struct openai_request *r, const char *object) {
    cJSON_AddNumberToObject(o, "created", (double)r->created);
    cJSON_AddStringToObject(o, "model", c->model_name);
    cJSON_AddStringToObject(o, "system_fingerprint", "coti");
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddStringToObject(o, "id", r->id);
}

/* Print o (NULL-safe) and free it. NULL when any step ran out of memory: cJSON's add
 * functions return NULL then, and a missing member would be a silent wrong answer, so the
 * caller answers 500 instead. */
static char *print_free(cJSON *o, bool ok) {
    char *s = o && ok ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

/* One token of an entry: id, its text (repaired to valid UTF-8) and its raw bytes. */
static bool add_token(cJSON *o, const struct openai_ctx *c, int32_t id, float logprob) {
    const char *piece = "";
    size_t len = 0;
    tokenizer_token_to_piece(c->tok, id, false, &piece, &len);
    cJSON_AddNumberToObject(o, "id", id);
    bool ok = openai_add_text(o, "token", piece, len);
    cJSON *bytes = cJSON_AddArrayToObject(o, "bytes");
    for (size_t i = 0; bytes && i < len; i++) cJSON_AddItemToArray(bytes, cJSON_CreateNumber((unsigned char)piece[i]));
    /* JSON has no -inf: llama.cpp writes the most negative float */
    cJSON_AddNumberToObject(o, "logprob", isfinite(logprob) ? logprob : -FLT_MAX);
    return ok && bytes;
}

/* The entries of tp as an array (NULL when out of memory). */
static cJSON *probs_json(const struct openai_ctx *c, const struct token_probs *tp) {
    cJSON *a = cJSON_CreateArray();
    bool ok = a != NULL;
    for (size_t i = 0; ok && i < tp->n; i++) {
        const struct spec_token_prob *p = &tp->probs[i];
        cJSON *en = cJSON_CreateObject();
        ok = en && cJSON_AddItemToArray(a, en) && add_token(en, c, tp->ids[i], p->logprob);
        cJSON *top = ok ? cJSON_AddArrayToObject(en, "top_logprobs") : NULL;
        ok = ok && top;
        for (int k = 0; ok && k < p->n_top; k++) {
            cJSON *t = cJSON_CreateObject();
            ok = t && cJSON_AddItemToArray(top, t) && add_token(t, c, p->top_id[k], p->top_logprob[k]);
        }
    }
    if (!ok) { cJSON_Delete(a); return NULL; }
    return a;
}

/* choices[].logprobs: {"content": [...]} when asked for, else null. */
static bool add_choice_probs(cJSON *ch, const struct openai_ctx *c, const struct openai_request *r, const struct token_probs *tp) {
    if (r->g.n_probs < 0) return cJSON_AddNullToObject(ch, "logprobs") != NULL;
    static const struct token_probs none = {0};
    cJSON *lp = cJSON_AddObjectToObject(ch, "logprobs");
    cJSON *content = probs_json(c, tp ? tp : &none);
    if (lp && content && cJSON_AddItemToObject(lp, "content", content)) return true;
    cJSON_Delete(content);
    return false;
}

static cJSON *native_object(const struct openai_ctx *c, const struct openai_request *r, const char *text, size_t n_text,
                            const int32_t *tokens, size_t n_tokens, const struct task_result *res, bool *ok) {
    cJSON *o = cJSON_CreateObject();
    if (!o) { *ok = false; return NULL; }
    cJSON_AddNumberToObject(o, "index", 0);
    *ok = openai_add_text(o, "content", text, n_text) && *ok;
    cJSON *toks = cJSON_AddArrayToObject(o, "tokens");
    for (size_t i = 0; toks && r->return_tokens && i < n_tokens; i++)
        if (tokens[i] >= 0) cJSON_AddItemToArray(toks, cJSON_CreateNumber(tokens[i]));
    cJSON_AddNumberToObject(o, "id_slot", res->id_slot);
    cJSON_AddBoolToObject(o, "stop", true);
    cJSON_AddStringToObject(o, "model", c->model_name);
    cJSON_AddNumberToObject(o, "tokens_predicted", res->predicted_n);
    cJSON_AddNumberToObject(o, "tokens_evaluated", res->n_prompt);
    cJSON *gs = cJSON_AddObjectToObject(o, "generation_settings");
    if (gs) {
        cJSON_AddNumberToObject(gs, "seed", (double)r->g.sp.seed);
        cJSON_AddNumberToObject(gs, "temperature", r->g.sp.temperature);
        cJSON_AddNumberToObject(gs, "top_k", r->g.sp.top_k);
        cJSON_AddNumberToObject(gs, "top_p", r->g.sp.top_p);
        cJSON_AddNumberToObject(gs, "min_p", r->g.sp.min_p);
        cJSON_AddNumberToObject(gs, "min_keep", r->g.sp.min_keep);
        cJSON_AddNumberToObject(gs, "typical_p", r->g.sp.typical_p);
        cJSON_AddNumberToObject(gs, "repeat_last_n", r->g.sp.repeat_last_n);
        cJSON_AddNumberToObject(gs, "repeat_penalty", r->g.sp.repeat_penalty);
        cJSON_AddNumberToObject(gs, "presence_penalty", r->g.sp.presence_penalty);
        cJSON_AddNumberToObject(gs, "frequency_penalty", r->g.sp.frequency_penalty);
        cJSON_AddBoolToObject(gs, "timings_per_token", r->timings_per_token);
        cJSON_AddNumberToObject(gs, "n_predict", r->g.n_predict);
        cJSON_AddNumberToObject(gs, "max_tokens", r->g.n_predict);
        cJSON_AddBoolToObject(gs, "ignore_eos", r->g.ignore_eos);
        cJSON_AddBoolToObject(gs, "stream", r->stream);
        cJSON *stop = cJSON_AddArrayToObject(gs, "stop");
        for (int i = 0; stop && i < r->g.n_stop; i++) openai_add_text(stop, "", r->g.stop[i], strlen(r->g.stop[i]));
        cJSON_AddStringToObject(gs, "speculative.type", drafter_kind_name(r->g.spec.drafter));
        cJSON_AddNumberToObject(gs, "speculative.n_max", r->g.spec.n_max);
        cJSON_AddNumberToObject(gs, "speculative.n_min", r->g.spec.n_min);
        cJSON_AddNumberToObject(gs, "speculative.p_min", r->g.spec.p_min);
    }
    char *prompt = NULL;
    size_t n_prompt = 0;
    if (tokenizer_detokenize(c->tok, r->prompt, (size_t)r->n_prompt, true, &prompt, &n_prompt, NULL, 0) == 0) {
        *ok = openai_add_text(o, "prompt", prompt, n_prompt) && *ok;
        free(prompt);
    } else {
        *ok = false;
    }
    cJSON_AddBoolToObject(o, "has_new_line", memchr(text, '\n', n_text) != NULL);
    cJSON_AddBoolToObject(o, "truncated", false);
    cJSON_AddStringToObject(o, "stop_type", stop_type_name(res->stop_type));
    const char *word = res->stop_type == STOP_TYPE_WORD && res->stop_index >= 0 ? r->g.stop[res->stop_index] : "";
    *ok = openai_add_text(o, "stopping_word", word, strlen(word)) && *ok;
    cJSON_AddNumberToObject(o, "tokens_cached", res->tokens_cached);
    cJSON *t = openai_timings(res);
    if (t) cJSON_AddItemToObject(o, "timings", t);
    *ok = *ok && toks && gs && t;
    return o;
}

/* One OpenAI choice (chat or completions) of index i onto choices. */
static bool add_choice(cJSON *choices, const struct openai_ctx *c, const struct openai_request *r, int i,
                       const struct openai_choice *x) {
    cJSON *ch = cJSON_CreateObject();
    bool ok = ch && cJSON_AddItemToArray(choices, ch);
    if (!ok) { cJSON_Delete(ch); return false; }
    if (r->api == OPENAI_API_CHAT) {
        struct tool_calls_out calls = {0};
        if (r->tools.active) ok = tools_parse_output(x->text, x->n_text, &calls);
        cJSON_AddStringToObject(ch, "finish_reason", chat_finish_reason(x->res, calls.n > 0));
        cJSON_AddNumberToObject(ch, "index", i);
        cJSON *msg = cJSON_AddObjectToObject(ch, "message");
        ok = ok && msg && cJSON_AddStringToObject(msg, "role", "assistant");
        if (ok && calls.n) {
            ok = calls.content ? openai_add_text(msg, "content", calls.content, calls.n_content)
                               : cJSON_AddNullToObject(msg, "content") != NULL;
            cJSON *tc = ok ? tools_calls_json(&calls, r->id, false) : NULL;
            ok = tc && cJSON_AddItemToObject(msg, "tool_calls", tc);
            if (!ok) cJSON_Delete(tc);
        } else if (ok) {
            ok = openai_add_text(msg, "content", x->text, x->n_text);
        }
        tool_calls_out_free(&calls);
        return ok && (r->g.n_probs < 0 || add_choice_probs(ch, c, r, x->tp));
    }
    ok = openai_add_text(ch, "text", x->text, x->n_text);
    cJSON_AddNumberToObject(ch, "index", i);
    ok = add_choice_probs(ch, c, r, x->tp) && ok;
    cJSON_AddStringToObject(ch, "finish_reason", finish_reason(x->res));
    return ok;
}

char *openai_render_final(const struct openai_ctx *c, const struct openai_request *r, const struct openai_choice *x,
                          int n) {
    bool ok = true;
    if (r->api == OPENAI_API_NATIVE) {
        cJSON *o = native_object(c, r, x->text, x->n_text, x->tokens, x->n_tokens, x->res, &ok);
        if (o && r->g.n_probs >= 0) {
            static const struct token_probs none = {0};
            cJSON *a = probs_json(c, x->tp ? x->tp : &none);
            ok = a && cJSON_AddItemToObject(o, "completion_probabilities", a) && ok;
            if (!ok) cJSON_Delete(a);
        }
        return print_free(o, ok);
    }
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    ok = choices != NULL;
    for (int i = 0; ok && i < n; i++) ok = add_choice(choices, c, r, i, &x[i]);
    add_envelope(o, c, r, r->api == OPENAI_API_CHAT ? "chat.completion" : "text_completion");
    /* usage counts every choice's tokens (the prompt once); the timings are the first's */
    long n_completion = 0;
    for (int i = 0; i < n; i++) n_completion += x[i].res->predicted_n;
    cJSON *u = usage_json(x[0].res, n_completion), *t = openai_timings(x[0].res);
    if (u) cJSON_AddItemToObject(o, "usage", u);
    if (t) cJSON_AddItemToObject(o, "timings", t);
    return print_free(o, ok && u && t);
}

/* A chat stream chunk of choice index with a null finish_reason: its delta object, to be filled
 * (NULL when out of memory; *o is then freed or NULL). */
static cJSON *chat_chunk_delta(cJSON **o, int index) {
    *o = cJSON_CreateObject();
    if (!*o) return NULL;
    cJSON *choices = cJSON_AddArrayToObject(*o, "choices");
    cJSON *ch = cJSON_CreateObject();
    cJSON *d = NULL;
    if (choices && ch && cJSON_AddItemToArray(choices, ch)) {
        cJSON_AddNullToObject(ch, "finish_reason");
        cJSON_AddNumberToObject(ch, "index", index);
        d = cJSON_AddObjectToObject(ch, "delta");
    } else {
        cJSON_Delete(ch);
    }
    if (!d) { cJSON_Delete(*o); *o = NULL; }
    return d;
}

char *openai_render_chunk_tool_calls(const struct openai_ctx *c, const struct openai_request *r, int index,
                                     const struct tool_calls_out *calls) {
    cJSON *o, *d = chat_chunk_delta(&o, index);
    if (!d) return NULL;
    cJSON *tc = tools_calls_json(calls, r->id, true);
    const bool ok = tc && cJSON_AddItemToObject(d, "tool_calls", tc);
    if (!ok) cJSON_Delete(tc);
    add_envelope(o, c, r, "chat.completion.chunk");
    return print_free(o, ok);
}

char *openai_render_chunk_role(const struct openai_ctx *c, const struct openai_request *r, int index) {
    cJSON *o, *d = chat_chunk_delta(&o, index);
    if (!d) return NULL;
    const bool ok = cJSON_AddStringToObject(d, "role", "assistant") && cJSON_AddNullToObject(d, "content");
    add_envelope(o, c, r, "chat.completion.chunk");
    return print_free(o, ok);
}

/* timings_per_token: a token event carries the timings so far (llama.cpp's partial results).
 * Returns false when out of memory. */
static bool add_timings_so_far(cJSON *o, const struct openai_request *r, const struct task_result *now) {
    if (!r->timings_per_token || !now) return true;
    cJSON *t = openai_timings(now);
    if (t) cJSON_AddItemToObject(o, "timings", t);
    return t != NULL;
}

char *openai_render_chunk(const struct openai_ctx *c, const struct openai_request *r, int index, const char *text,
                          size_t len, int32_t id, int id_slot, int n_predicted, const struct task_result *now,
                          const struct token_probs *tp) {
    const bool probs = r->g.n_probs >= 0 && tp && tp->n;
    cJSON *o;
    bool ok = true;
    if (r->api == OPENAI_API_CHAT) {
        cJSON *d = chat_chunk_delta(&o, index);
        if (!d) return NULL;
        cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "choices"), 0);
        ok = openai_add_text(d, "content", text, len) && (!probs || add_choice_probs(ch, c, r, tp));
        add_envelope(o, c, r, "chat.completion.chunk");
        return print_free(o, add_timings_so_far(o, r, now) && ok);
    }
    if (!(o = cJSON_CreateObject())) return NULL;
    if (r->api == OPENAI_API_NATIVE) {
        if (probs) {
            cJSON *a = probs_json(c, tp);
            ok = a && cJSON_AddItemToObject(o, "completion_probabilities", a);
            if (!ok) cJSON_Delete(a);
        }
        cJSON_AddNumberToObject(o, "index", 0);
        ok = openai_add_text(o, "content", text, len);
        cJSON *toks = cJSON_AddArrayToObject(o, "tokens");
        ok = ok && toks;
        if (toks && id >= 0) cJSON_AddItemToArray(toks, cJSON_CreateNumber(id));
        cJSON_AddBoolToObject(o, "stop", false);
        cJSON_AddNumberToObject(o, "id_slot", id_slot);
        cJSON_AddNumberToObject(o, "tokens_predicted", n_predicted);
        cJSON_AddNumberToObject(o, "tokens_evaluated", r->n_prompt);
        return print_free(o, add_timings_so_far(o, r, now) && ok);
    }
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON *ch = cJSON_CreateObject();
    ok = choices && ch && cJSON_AddItemToArray(choices, ch);
    if (!ok) cJSON_Delete(ch);
    if (ok) {
        ok = openai_add_text(ch, "text", text, len);
        cJSON_AddNumberToObject(ch, "index", index);
        ok = (probs ? add_choice_probs(ch, c, r, tp) : cJSON_AddNullToObject(ch, "logprobs") != NULL) && ok;
        cJSON_AddNullToObject(ch, "finish_reason");
    }
    add_envelope(o, c, r, "text_completion");
    return print_free(o, add_timings_so_far(o, r, now) && ok);
}

char *openai_render_chunk_end(const struct openai_ctx *c, const struct openai_request *r, int index,
                              const struct task_result *res, bool tools_called) {
    bool ok = true;
    if (r->api == OPENAI_API_NATIVE) /* the full native object with empty content and no tokens (server-api.md §5) */
        return print_free(native_object(c, r, "", 0, NULL, 0, res, &ok), ok);
    const bool chat = r->api == OPENAI_API_CHAT;
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON *ch = cJSON_CreateObject();
    ok = choices && ch && cJSON_AddItemToArray(choices, ch);
    if (!ok) cJSON_Delete(ch);
    if (ok && chat) {
        cJSON_AddStringToObject(ch, "finish_reason", chat_finish_reason(res, tools_called));
        cJSON_AddNumberToObject(ch, "index", index);
        ok = cJSON_AddObjectToObject(ch, "delta") != NULL;
    } else if (ok) {
        cJSON_AddStringToObject(ch, "text", "");
        cJSON_AddNumberToObject(ch, "index", index);
        cJSON_AddNullToObject(ch, "logprobs");
        cJSON_AddStringToObject(ch, "finish_reason", finish_reason(res));
    }
    add_envelope(o, c, r, chat ? "chat.completion.chunk" : "text_completion");
    /* with stream_options.include_usage the usage comes in a chunk of its own with no choices
     * (OpenAI's shape), to which the timings then move; without it, chat has none and
     * completions keep it in the last chunk, as llama.cpp always does */
    if (!r->include_usage) {
        cJSON *u = chat ? NULL : usage_json(res, res->predicted_n), *t = openai_timings(res);
        ok = ok && (chat || u) && t;
        if (u) cJSON_AddItemToObject(o, "usage", u);
        if (t) cJSON_AddItemToObject(o, "timings", t);
    }
    return print_free(o, ok);
}

char *openai_render_chunk_usage(const struct openai_ctx *c, const struct openai_request *r,
                                const struct task_result *const *res, int n) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    bool ok = cJSON_AddArrayToObject(o, "choices") != NULL;
    add_envelope(o, c, r, r->api == OPENAI_API_CHAT ? "chat.completion.chunk" : "text_completion");
    long n_completion = 0;
    for (int i = 0; i < n; i++) n_completion += res[i]->predicted_n;
    cJSON *u = usage_json(res[0], n_completion), *t = openai_timings(res[0]);
    if (u) cJSON_AddItemToObject(o, "usage", u);
    if (t) cJSON_AddItemToObject(o, "timings", t);
    return print_free(o, ok && u && t);
}
