/* json_schema.c — JSON schema to GBNF (see json_schema.h). */
#include "json_schema.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Nesting of schemas inside schemas (a $ref is a rule, so recursion through it is free). */
#define SCHEMA_MAX_DEPTH 64

/* The JSON building blocks every generated grammar starts with. Whitespace is one space or a
 * newline and an indent, so a model cannot spin in it forever. */
static const char json_base[] =
    "ws ::= (\" \" | \"\\n\" [ ]{0,16})?\n"
    "char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"
    "string ::= \"\\\"\" char* \"\\\"\" ws\n"
    "integer ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15}) ws\n"
    "number ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15}) (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})? ws\n"
    "boolean ::= (\"true\" | \"false\") ws\n"
    "null ::= \"null\" ws\n"
    "value ::= object | array | string | number | boolean | null\n"
    "object ::= \"{\" ws (string \":\" ws value (\",\" ws string \":\" ws value)*)? \"}\" ws\n"
    "array ::= \"[\" ws (value (\",\" ws value)*)? \"]\" ws\n";

struct sbuf {
    char *s;
    size_t n, cap;
    bool oom;
};

static void sb_add(struct sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (k < 0) { b->oom = true; return; }
    if (b->n + (size_t)k + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + (size_t)k + 1) c *= 2;
        char *s = realloc(b->s, c);
        if (!s) { b->oom = true; return; }
        b->s = s;
        b->cap = c;
    }
    va_start(ap, fmt);
    vsnprintf(b->s + b->n, (size_t)k + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)k;
}

/* Whether s[0..n) is UTF-8 (a grammar literal is text: raw bytes cannot be spelled in one). */
static bool utf8_valid(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        int k = p[i] < 0x80 ? 1 : (p[i] >> 5) == 6 ? 2 : (p[i] >> 4) == 14 ? 3 : (p[i] >> 3) == 30 ? 4 : 0;
        if (!k || i + (size_t)k > n) return false;
        for (int j = 1; j < k; j++) if ((p[i + j] & 0xC0) != 0x80) return false;
        i += (size_t)k;
    }
    return true;
}

/* A GBNF string literal of bytes s[0..n). */
static void sb_literal(struct sbuf *b, const char *s, size_t n) {
    sb_add(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') sb_add(b, "\\%c", c);
        else if (c == '\n') sb_add(b, "\\n");
        else if (c == '\r') sb_add(b, "\\r");
        else if (c == '\t') sb_add(b, "\\t");
        else if (c < 0x20 || c == 0x7F) sb_add(b, "\\x%02X", c);
        else sb_add(b, "%c", c);
    }
    sb_add(b, "\"");
}

struct conv {
    const cJSON *root;
    struct sbuf out;       /* the rules so far */
    int n_rules;
    const char **ref_name; /* $refs converted or being converted, and their rule numbers */
    int *ref_rule;
    int n_refs, cap_refs;
    char *err;
    size_t err_size;
    int rc;
};

static int conv_fail(struct conv *c, int code, const char *fmt, const char *what) {
    if (!c->rc) c->rc = coti_fail(c->err, c->err_size, code, fmt, what);
    return -1;
}

static int convert(struct conv *c, const cJSON *s, int depth);

/* A literal for JSON value v (as compact JSON text), then ws. */
static int literal_of(struct conv *c, struct sbuf *b, const cJSON *v) {
    char *text = cJSON_PrintUnformatted(v);
    if (!text) return conv_fail(c, COTI_E_NOMEM, "%s", "out of memory");
    if (!utf8_valid(text, strlen(text))) { free(text); return conv_fail(c, COTI_E_FORMAT, "json schema: %s", "a value is not UTF-8"); }
    sb_literal(b, text, strlen(text));
    sb_add(b, " ws");
    free(text);
    return 0;
}

static bool is_annotation(const char *k) {
    static const char *const names[] = {"title", "description", "default", "examples", "$schema", "$id", "$comment",
                                        "deprecated", "readOnly", "writeOnly", "$defs", "definitions", NULL};
    for (int i = 0; names[i]; i++) if (!strcmp(k, names[i])) return true;
    return false;
}

static bool keyword_in(const char *k, const char *const *list) {
    for (int i = 0; list[i]; i++) if (!strcmp(k, list[i])) return true;
    return false;
}

static int new_rule(struct conv *c) { return c->n_rules++; }

static int emit_rule(struct conv *c, int r, struct sbuf *body) {
    if (body->oom) { free(body->s); return conv_fail(c, COTI_E_NOMEM, "%s", "out of memory"); }
    sb_add(&c->out, "s%d ::= %s\n", r, body->s ? body->s : "\"\"");
    free(body->s);
    return c->out.oom ? conv_fail(c, COTI_E_NOMEM, "%s", "out of memory") : 0;
}

static int count_of(struct conv *c, const cJSON *s, const char *key, int dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, key);
    if (!v) return dflt;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 10000 || v->valuedouble != (int)v->valuedouble)
        return conv_fail(c, COTI_E_UNSUPPORTED, "json schema: '%s' must be an integer in [0, 10000]", key), -2;
    return (int)v->valuedouble;
}

/* The rule for one type name under schema s. */
static int type_rule(struct conv *c, const cJSON *s, const char *type, struct sbuf *b, int depth) {
    static const char *const string_kw[] = {"minLength", "maxLength", NULL};
    static const char *const array_kw[] = {"items", "minItems", "maxItems", NULL};
    static const char *const object_kw[] = {"properties", "required", "additionalProperties", NULL};
    const cJSON *k;
    cJSON_ArrayForEach(k, s) {
        const char *key = k->string;
        if (!strcmp(key, "type") || is_annotation(key)) continue;
        bool ok = (!strcmp(type, "string") && keyword_in(key, string_kw)) || (!strcmp(type, "array") && keyword_in(key, array_kw)) ||
                  (!strcmp(type, "object") && keyword_in(key, object_kw));
        if (!ok) return conv_fail(c, COTI_E_UNSUPPORTED, "json schema: unsupported keyword '%s'", key);
    }
    if (!strcmp(type, "string")) {
        int lo = count_of(c, s, "minLength", 0), hi = count_of(c, s, "maxLength", -1);
        if (lo < -1 || hi < -1) return -1;
        if (lo == 0 && hi < 0) { sb_add(b, "string"); return 0; }
        if (hi >= 0 && hi < lo) return conv_fail(c, COTI_E_UNSUPPORTED, "json schema: %s", "maxLength < minLength");
        if (hi >= 0) sb_add(b, "\"\\\"\" char{%d,%d} \"\\\"\" ws", lo, hi);
        else sb_add(b, "\"\\\"\" char{%d,} \"\\\"\" ws", lo);
        return 0;
    }
    if (!strcmp(type, "number") || !strcmp(type, "integer") || !strcmp(type, "boolean") || !strcmp(type, "null")) {
        sb_add(b, "%s", type);
        return 0;
    }
    if (!strcmp(type, "array")) {
        const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
        int lo = count_of(c, s, "minItems", 0), hi = count_of(c, s, "maxItems", -1);
        if (lo < -1 || hi < -1) return -1;
        if (hi >= 0 && hi < lo) return conv_fail(c, COTI_E_UNSUPPORTED, "json schema: %s", "maxItems < minItems");
        char item[24] = "value";
        if (items) {
            int r = convert(c, items, depth + 1);
            if (r < 0) return -1;
            snprintf(item, sizeof item, "s%d", r);
        }
        if (hi == 0) { sb_add(b, "\"[\" ws \"]\" ws"); return 0; }
        sb_add(b, "\"[\" ws ");
        if (lo == 0) sb_add(b, "(");
        sb_add(b, "%s (\",\" ws %s)", item, item);
        int lo1 = lo > 0 ? lo - 1 : 0;
        if (hi < 0) sb_add(b, "{%d,}", lo1);
        else sb_add(b, "{%d,%d}", lo1, hi - 1);
        if (lo == 0) sb_add(b, ")?");
        sb_add(b, " \"]\" ws");
        return 0;
    }
    if (!strcmp(type, "object")) {
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
        const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
        const cJSON *addl = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
        if (props && !cJSON_IsObject(props)) return conv_fail(c, COTI_E_FORMAT, "json schema: %s", "'properties' must be an object");
        if (req && !cJSON_IsArray(req)) return conv_fail(c, COTI_E_FORMAT, "json schema: %s", "'required' must be an array");
        const cJSON *r;
        cJSON_ArrayForEach(r, req) {
            if (!cJSON_IsString(r)) return conv_fail(c, COTI_E_FORMAT, "json schema: %s", "'required' must hold strings");
            if (!cJSON_GetObjectItemCaseSensitive(props, r->valuestring))
                return conv_fail(c, COTI_E_UNSUPPORTED, "json schema: required property '%s' is not in 'properties'", r->valuestring);
        }
        /* extra keys: absent = none when properties are listed, any when none are */
        char extra[24] = "";
        if (addl ? !cJSON_IsFalse(addl) : !props) {
            if (addl && !cJSON_IsTrue(addl)) {
                int ar = convert(c, addl, depth + 1);
                if (ar < 0) return -1;
                snprintf(extra, sizeof extra, "s%d", ar);
            } else {
                snprintf(extra, sizeof extra, "value");
            }
        }
        const int n = cJSON_GetArraySize(props);
        /* first[k]: the properties from k on with none written yet; then[k]: the same after
         * one was written (each starts with a comma) */
        const int base = c->n_rules;
        c->n_rules += 2 * (n + 1);
        int i = 0;
        const cJSON *p;
        cJSON_ArrayForEach(p, props) {
            int vr = convert(c, p, depth + 1);
            if (vr < 0) return -1;
            bool required = false;
            cJSON_ArrayForEach(r, req) required |= !strcmp(r->valuestring, p->string);
            struct sbuf kv = {0};
            cJSON *key = cJSON_CreateString(p->string);
            char *kt = key ? cJSON_PrintUnformatted(key) : NULL;
            cJSON_Delete(key);
            if (!kt) return conv_fail(c, COTI_E_NOMEM, "%s", "out of memory");
            if (!utf8_valid(kt, strlen(kt))) { free(kt); return conv_fail(c, COTI_E_FORMAT, "json schema: %s", "a property name is not UTF-8"); }
            sb_literal(&kv, kt, strlen(kt));
            free(kt);
            sb_add(&kv, " ws \":\" ws s%d", vr);
            if (kv.oom) { free(kv.s); return conv_fail(c, COTI_E_NOMEM, "%s", "out of memory"); }
            struct sbuf f = {0}, t = {0};
            sb_add(&f, "%s s%d", kv.s, base + 2 * (i + 1) + 1);
            sb_add(&t, "\",\" ws %s s%d", kv.s, base + 2 * (i + 1) + 1);
            if (!required) {
                sb_add(&f, " | s%d", base + 2 * (i + 1));
                sb_add(&t, " | s%d", base + 2 * (i + 1) + 1);
            }
            free(kv.s);
            if (emit_rule(c, base + 2 * i, &f) || emit_rule(c, base + 2 * i + 1, &t)) return -1;
            i++;
        }
        struct sbuf f = {0}, t = {0};
        if (extra[0]) {
            sb_add(&f, "(string \":\" ws %s (\",\" ws string \":\" ws %s)*)?", extra, extra);
            sb_add(&t, "(\",\" ws string \":\" ws %s)*", extra);
        }
        if (emit_rule(c, base + 2 * n, &f) || emit_rule(c, base + 2 * n + 1, &t)) return -1;
        sb_add(b, "\"{\" ws s%d \"}\" ws", base);
        return 0;
    }
    return conv_fail(c, COTI_E_UNSUPPORTED, "json schema: unsupported type '%s'", type);
}

static int resolve_ref(struct conv *c, const char *ref, int depth) {
    for (int i = 0; i < c->n_refs; i++) if (!strcmp(c->ref_name[i], ref)) return c->ref_rule[i];
    const char *name = NULL;
    const cJSON *defs = NULL;
    if (!strncmp(ref, "#/$defs/", 8)) { defs = cJSON_GetObjectItemCaseSensitive(c->root, "$defs"); name = ref + 8; }
    else if (!strncmp(ref, "#/definitions/", 14)) { defs = cJSON_GetObjectItemCaseSensitive(c->root, "definitions"); name = ref + 14; }
    else if (!strcmp(ref, "#")) defs = NULL;
    else return conv_fail(c, COTI_E_UNSUPPORTED, "json schema: unsupported $ref '%s' (only #/$defs/... and #/definitions/...)", ref);
    const cJSON *target = name ? cJSON_GetObjectItemCaseSensitive(defs, name) : c->root;
    if (!target) return conv_fail(c, COTI_E_FORMAT, "json schema: $ref '%s' points at nothing", ref);
    if (c->n_refs == c->cap_refs) {
        int cap = c->cap_refs ? 2 * c->cap_refs : 8;
        const char **nn = realloc(c->ref_name, sizeof *nn * (size_t)cap);
        if (nn) c->ref_name = nn;
        int *nr = realloc(c->ref_rule, sizeof *nr * (size_t)cap);
        if (nr) c->ref_rule = nr;
        if (!nn || !nr) return conv_fail(c, COTI_E_NOMEM, "%s", "out of memory");
        c->cap_refs = cap;
    }
    /* the rule is named before it is converted: a recursive schema refers to it */
    int r = new_rule(c);
    c->ref_name[c->n_refs] = ref;
    c->ref_rule[c->n_refs++] = r;
    int body = convert(c, target, depth + 1);
    if (body < 0) return -1;
    struct sbuf b = {0};
    sb_add(&b, "s%d", body);
    return emit_rule(c, r, &b) ? -1 : r;
}

/* The body of schema s's rule into b; 0, or -1 with c->rc set. */
static int convert_body(struct conv *c, const cJSON *s, int depth, struct sbuf *bp) {
#define b (*bp)
    if (cJSON_IsTrue(s)) {
        sb_add(&b, "value");
        return 0;
    }
    if (!cJSON_IsObject(s)) return conv_fail(c, COTI_E_FORMAT, "json schema: %s", "a schema must be an object or true");
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    const cJSON *cst = cJSON_GetObjectItemCaseSensitive(s, "const");
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    if (!any) any = cJSON_GetObjectItemCaseSensitive(s, "oneOf");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (ref) {
        if (!cJSON_IsString(ref)) return conv_fail(c, COTI_E_FORMAT, "json schema: %s", "$ref must be a string");
        int t = resolve_ref(c, ref->valuestring, depth);
        if (t < 0) return -1;
        sb_add(&b, "s%d", t);
    } else if (cst) {
        if (literal_of(c, &b, cst)) return -1;
    } else if (en) {
        if (!cJSON_IsArray(en) || cJSON_GetArraySize(en) == 0) return conv_fail(c, COTI_E_FORMAT, "json schema: %s", "'enum' must be a non-empty array");
        const cJSON *v;
        bool first = true;
        cJSON_ArrayForEach(v, en) {
            if (!first) sb_add(&b, " | ");
            first = false;
            if (literal_of(c, &b, v)) return -1;
        }
    } else if (any) {
        if (!cJSON_IsArray(any) || cJSON_GetArraySize(any) == 0)
            return conv_fail(c, COTI_E_FORMAT, "json schema: %s", "'anyOf' / 'oneOf' must be a non-empty array");
        const cJSON *v;
        bool first = true;
        cJSON_ArrayForEach(v, any) {
            int t = convert(c, v, depth + 1);
            if (t < 0) return -1;
            sb_add(&b, first ? "s%d" : " | s%d", t);
            first = false;
        }
    } else if (cJSON_IsArray(type)) {
        const cJSON *v;
        bool first = true;
        cJSON_ArrayForEach(v, type) {
            if (!cJSON_IsString(v)) return conv_fail(c, COTI_E_FORMAT, "json schema: %s", "'type' must hold strings");
            if (!first) sb_add(&b, " | ");
            first = false;
            if (type_rule(c, s, v->valuestring, &b, depth)) return -1;
        }
        if (first) return conv_fail(c, COTI_E_FORMAT, "json schema: %s", "'type' must not be empty");
    } else if (cJSON_IsString(type)) {
        if (type_rule(c, s, type->valuestring, &b, depth)) return -1;
    } else if (type) {
        return conv_fail(c, COTI_E_FORMAT, "json schema: %s", "'type' must be a string or an array");
    } else {
        /* no type: only annotations may be there (the empty schema: any value) */
        const cJSON *k;
        cJSON_ArrayForEach(k, s) if (!is_annotation(k->string)) {
            return conv_fail(c, COTI_E_UNSUPPORTED, "json schema: unsupported keyword '%s' (or 'type' missing)", k->string);
        }
        sb_add(&b, "value");
    }
    if (ref || cst || en || any) {
        /* those stand alone: what else is next to them would be silently ignored */
        const cJSON *k;
        cJSON_ArrayForEach(k, s) {
            const char *key = k->string;
            if (is_annotation(key) || (k == ref) || k == cst || k == en || k == any || !strcmp(key, "type")) continue;
            return conv_fail(c, COTI_E_UNSUPPORTED, "json schema: unsupported keyword '%s' next to $ref/const/enum/anyOf", key);
        }
    }
    return c->rc ? -1 : 0;
#undef b
}

/* Convert schema s into a new rule; returns its number, or -1 with c->rc set. */
static int convert(struct conv *c, const cJSON *s, int depth) {
    if (depth > SCHEMA_MAX_DEPTH) return conv_fail(c, COTI_E_FORMAT, "json schema: %s", "nested too deep");
    struct sbuf b = {0};
    const int r = new_rule(c);
    if (convert_body(c, s, depth, &b)) { free(b.s); return -1; }
    return emit_rule(c, r, &b) ? -1 : r;
}

int json_schema_to_grammar(const cJSON *schema, char **out, char *err, size_t err_size) {
    return json_schema_to_rule(schema, "root", out, err, err_size);
}

int json_schema_to_rule(const cJSON *schema, const char *rule, char **out, char *err, size_t err_size) {
    *out = NULL;
    struct conv c = {.root = schema, .err = err, .err_size = err_size};
    sb_add(&c.out, "%s", json_base);
    int r = convert(&c, schema, 0);
    if (r >= 0) sb_add(&c.out, "%s ::= s%d\n", rule, r);
    free(c.ref_name);
    free(c.ref_rule);
    if (r < 0 || c.out.oom) {
        free(c.out.s);
        return c.rc ? c.rc : coti_fail(err, err_size, COTI_E_NOMEM, "out of memory");
    }
    *out = c.out.s;
    return 0;
}

char *json_schema_object_grammar(void) {
    struct sbuf b = {0};
    sb_add(&b, "%sroot ::= object\n", json_base);
    if (b.oom) { free(b.s); return NULL; }
    return b.s;
}
