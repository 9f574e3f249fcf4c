/* grammar.c — GBNF parser, pushdown matcher, vocabulary masks (see grammar.h). */
#include "grammar.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sample.h"

/* ---- compiled form ----
 * Every rule is a list of alternatives; every alternative a run of symbols in one flat array,
 * closed by G_END. A position is an index into that array; a stack is the positions still to
 * match, innermost (next) on top. */
enum { G_END, G_ALT /* parse only */, G_REF, G_CHAR, G_CLASS, G_ANY };

struct gsym {
    uint8_t kind;
    uint8_t neg;    /* G_CLASS: [^...] */
    uint32_t a, b;  /* G_REF: rule; G_CHAR: code point; G_CLASS: ranges[a .. a + b) */
};

struct grammar {
    struct gsym *sym;
    int32_t n_sym;
    uint32_t *ranges;  /* pairs lo, hi (inclusive) */
    int32_t *alt;      /* alternatives' first positions, rule by rule */
    int32_t *rule_alt0, *rule_n_alt;
    int32_t n_rules, root;
};

void grammar_free(struct grammar *g) {
    if (!g) return;
    free(g->sym); free(g->ranges); free(g->alt); free(g->rule_alt0); free(g->rule_n_alt);
    free(g);
}

/* ---- parser ---- */

struct prule {
    char *name;          /* NULL: made by the parser (group, repetition) */
    struct gsym *body;   /* alternatives separated by G_ALT */
    int32_t n, cap;
    bool defined;
    int line, col;       /* first reference, for "undefined rule" */
};

struct parser {
    const char *s, *end, *p;
    struct prule *rules;
    int32_t n_rules, cap_rules;
    uint32_t *ranges;
    int32_t n_ranges, cap_ranges; /* in pairs */
    long n_sym_total;
    char *err;
    size_t err_size;
    int rc;
};

static void where(const struct parser *ps, const char *at, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (const char *c = ps->s; c < at; c++) {
        if (*c == '\n') { (*line)++; *col = 1; }
        else if (((unsigned char)*c & 0xC0) != 0x80) (*col)++;
    }
}

/* Record the first error at `at`; returns -1 so parse functions can `return fail(...)`. */
static int fail(struct parser *ps, const char *at, int code, const char *what) {
    if (ps->rc) return -1;
    int line, col;
    where(ps, at, &line, &col);
    ps->rc = coti_fail(ps->err, ps->err_size, code, "grammar %d:%d: %s", line, col, what);
    return -1;
}

static bool grow(void **v, int32_t *cap, int32_t need, size_t elem) {
    if (need <= *cap) return true;
    int32_t c = *cap ? *cap : 8;
    while (c < need) c *= 2;
    void *n = realloc(*v, (size_t)c * elem);
    if (!n) return false;
    *v = n;
    *cap = c;
    return true;
}

static int emit(struct parser *ps, int32_t r, struct gsym y) {
    struct prule *pr = &ps->rules[r];
    if (++ps->n_sym_total > GRAMMAR_MAX_SYMBOLS) return fail(ps, ps->p, COTI_E_RANGE, "grammar too large");
    if (!grow((void **)&pr->body, &pr->cap, pr->n + 1, sizeof *pr->body)) return fail(ps, ps->p, COTI_E_NOMEM, "out of memory");
    pr->body[pr->n++] = y;
    return 0;
}

static int32_t new_rule(struct parser *ps, const char *name, size_t len) {
    if (ps->n_rules >= GRAMMAR_MAX_RULES) return fail(ps, ps->p, COTI_E_RANGE, "too many rules");
    if (!grow((void **)&ps->rules, &ps->cap_rules, ps->n_rules + 1, sizeof *ps->rules))
        return fail(ps, ps->p, COTI_E_NOMEM, "out of memory");
    struct prule *pr = &ps->rules[ps->n_rules];
    memset(pr, 0, sizeof *pr);
    if (name) {
        if (!(pr->name = malloc(len + 1))) return fail(ps, ps->p, COTI_E_NOMEM, "out of memory");
        memcpy(pr->name, name, len);
        pr->name[len] = 0;
    }
    return ps->n_rules++;
}

static int32_t rule_named(struct parser *ps, const char *name, size_t len) {
    for (int32_t i = 0; i < ps->n_rules; i++)
        if (ps->rules[i].name && strlen(ps->rules[i].name) == len && !memcmp(ps->rules[i].name, name, len)) return i;
    int32_t r = new_rule(ps, name, len);
    if (r >= 0) where(ps, name, &ps->rules[r].line, &ps->rules[r].col);
    return r;
}

static bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

static void skip_space(struct parser *ps) {
    while (ps->p < ps->end) {
        char c = *ps->p;
        if (c == '#') {
            while (ps->p < ps->end && *ps->p != '\n') ps->p++;
        } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            ps->p++;
        } else {
            break;
        }
    }
}

static size_t name_len(const char *p, const char *end) {
    size_t n = 0;
    while (p + n < end && is_name_char(p[n])) n++;
    return n;
}

/* Whether a rule definition `name ::=` starts at p. */
static bool at_definition(const struct parser *ps, const char *p) {
    size_t n = name_len(p, ps->end);
    if (!n) return false;
    p += n;
    while (p < ps->end && (*p == ' ' || *p == '\t')) p++;
    return ps->end - p >= 3 && !memcmp(p, "::=", 3);
}

static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One UTF-8 code point from the grammar text (the text itself is UTF-8). */
static int read_utf8(struct parser *ps, uint32_t *cp) {
    const unsigned char *p = (const unsigned char *)ps->p;
    size_t avail = (size_t)(ps->end - ps->p);
    int n = p[0] < 0x80 ? 1 : (p[0] >> 5) == 6 ? 2 : (p[0] >> 4) == 14 ? 3 : (p[0] >> 3) == 30 ? 4 : 0;
    if (!n || (size_t)n > avail) return fail(ps, ps->p, COTI_E_FORMAT, "invalid UTF-8");
    uint32_t v = n == 1 ? p[0] : (uint32_t)(p[0] & (0x7F >> n));
    for (int i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80) return fail(ps, ps->p, COTI_E_FORMAT, "invalid UTF-8");
        v = (v << 6) | (p[i] & 0x3F);
    }
    ps->p += n;
    *cp = v;
    return 0;
}

/* A character of a literal or class: plain or escaped. */
static int read_char(struct parser *ps, uint32_t *cp) {
    if (ps->p >= ps->end) return fail(ps, ps->p, COTI_E_FORMAT, "unexpected end of grammar");
    if (*ps->p != '\\') return read_utf8(ps, cp);
    const char *at = ps->p++;
    if (ps->p >= ps->end) return fail(ps, at, COTI_E_FORMAT, "unfinished escape");
    char c = *ps->p++;
    int digits = 0;
    switch (c) {
    case 'n': *cp = '\n'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 't': *cp = '\t'; return 0;
    case '\\': case '"': case '[': case ']': case '-': case '\'': case '/': case '^': *cp = (uint32_t)c; return 0;
    case 'x': digits = 2; break;
    case 'u': digits = 4; break;
    case 'U': digits = 8; break;
    default: return fail(ps, at, COTI_E_FORMAT, "unknown escape");
    }
    uint32_t v = 0;
    for (int i = 0; i < digits; i++) {
        int h = ps->p < ps->end ? hex_value(*ps->p) : -1;
        if (h < 0) return fail(ps, at, COTI_E_FORMAT, "bad hex escape");
        v = v * 16 + (uint32_t)h;
        ps->p++;
    }
    if (v > 0x10FFFF) return fail(ps, at, COTI_E_FORMAT, "code point above U+10FFFF");
    *cp = v;
    return 0;
}

static int parse_alternates(struct parser *ps, int32_t r, bool nested);

/* Items x[0..n) repeated min..max times (max < 0: unbounded), appended to rule r. */
static int emit_repeat(struct parser *ps, int32_t r, const struct gsym *x, int32_t n, long min, long max) {
    for (long i = 0; i < min; i++)
        for (int32_t j = 0; j < n; j++)
            if (emit(ps, r, x[j])) return -1;
    if (max >= 0 && max == min) return 0;
    int32_t tail = -1;
    if (max < 0) { /* star ::= x star | ε */
        if ((tail = new_rule(ps, NULL, 0)) < 0) return -1;
        for (int32_t j = 0; j < n; j++) if (emit(ps, tail, x[j])) return -1;
        if (emit(ps, tail, (struct gsym){G_REF, 0, (uint32_t)tail, 0}) || emit(ps, tail, (struct gsym){G_ALT, 0, 0, 0})) return -1;
    } else { /* opt_k ::= x opt_(k-1) | ε, up to max - min more */
        for (long k = 0; k < max - min; k++) {
            int32_t o = new_rule(ps, NULL, 0);
            if (o < 0) return -1;
            for (int32_t j = 0; j < n; j++) if (emit(ps, o, x[j])) return -1;
            if (tail >= 0 && emit(ps, o, (struct gsym){G_REF, 0, (uint32_t)tail, 0})) return -1;
            if (emit(ps, o, (struct gsym){G_ALT, 0, 0, 0})) return -1;
            tail = o;
        }
    }
    return emit(ps, r, (struct gsym){G_REF, 0, (uint32_t)tail, 0});
}

static int parse_bound(struct parser *ps, long *v) {
    const char *at = ps->p;
    long n = 0;
    if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return fail(ps, at, COTI_E_FORMAT, "expected a number");
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
        n = n * 10 + (*ps->p++ - '0');
        if (n > 100000) return fail(ps, at, COTI_E_RANGE, "repetition bound too large");
    }
    *v = n;
    return 0;
}

/* A repetition operator at ps->p applied to rule r's items from `last` on. */
static int parse_repeat(struct parser *ps, int32_t r, int32_t last) {
    const char *at = ps->p;
    if (last < 0) return fail(ps, at, COTI_E_FORMAT, "repetition without anything to repeat");
    long min = 0, max = -1;
    char c = *ps->p++;
    if (c == '+') min = 1;
    else if (c == '?') max = 1;
    else if (c == '{') {
        skip_space(ps);
        if (parse_bound(ps, &min)) return -1;
        skip_space(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            skip_space(ps);
            if (ps->p < ps->end && *ps->p != '}' && parse_bound(ps, &max)) return -1;
            skip_space(ps);
        } else {
            max = min;
        }
        if (ps->p >= ps->end || *ps->p != '}') return fail(ps, ps->p, COTI_E_FORMAT, "expected '}'");
        ps->p++;
        if (max >= 0 && max < min) return fail(ps, at, COTI_E_FORMAT, "repetition {m,n} with n < m");
    }
    int32_t n = ps->rules[r].n - last;
    struct gsym *x = malloc(sizeof *x * (size_t)n);
    if (!x) return fail(ps, at, COTI_E_NOMEM, "out of memory");
    memcpy(x, ps->rules[r].body + last, sizeof *x * (size_t)n);
    ps->rules[r].n = last;
    ps->n_sym_total -= n;
    int rc = emit_repeat(ps, r, x, n, min, max);
    free(x);
    return rc;
}

static int parse_class(struct parser *ps, int32_t r) {
    const char *at = ps->p++;
    struct gsym y = {G_CLASS, 0, (uint32_t)ps->n_ranges, 0};
    if (ps->p < ps->end && *ps->p == '^') { y.neg = 1; ps->p++; }
    while (ps->p < ps->end && *ps->p != ']') {
        uint32_t lo, hi;
        if (read_char(ps, &lo)) return -1;
        hi = lo;
        if (ps->end - ps->p >= 2 && ps->p[0] == '-' && ps->p[1] != ']') {
            ps->p++;
            if (read_char(ps, &hi)) return -1;
            if (hi < lo) return fail(ps, at, COTI_E_FORMAT, "character range out of order");
        }
        if (!grow((void **)&ps->ranges, &ps->cap_ranges, 2 * (ps->n_ranges + 1), sizeof *ps->ranges))
            return fail(ps, at, COTI_E_NOMEM, "out of memory");
        ps->ranges[2 * ps->n_ranges] = lo;
        ps->ranges[2 * ps->n_ranges + 1] = hi;
        ps->n_ranges++;
        y.b++;
    }
    if (ps->p >= ps->end) return fail(ps, at, COTI_E_FORMAT, "unterminated character class");
    ps->p++;
    return emit(ps, r, y);
}

static int parse_sequence(struct parser *ps, int32_t r, bool nested) {
    int32_t last = -1; /* first symbol of the last item, for a repetition */
    for (;;) {
        skip_space(ps);
        if (ps->p >= ps->end) return 0;
        char c = *ps->p;
        const char *at = ps->p;
        if (c == '|') return 0;
        if (c == ')') return nested ? 0 : fail(ps, at, COTI_E_FORMAT, "unexpected ')'");
        if (is_name_char(c)) {
            if (at_definition(ps, at)) return nested ? fail(ps, at, COTI_E_FORMAT, "rule definition inside a group") : 0;
            size_t n = name_len(at, ps->end);
            int32_t ref = rule_named(ps, at, n);
            if (ref < 0) return -1;
            ps->p += n;
            last = ps->rules[r].n;
            if (emit(ps, r, (struct gsym){G_REF, 0, (uint32_t)ref, 0})) return -1;
        } else if (c == '"') {
            ps->p++;
            last = ps->rules[r].n;
            while (ps->p < ps->end && *ps->p != '"') {
                uint32_t cp;
                if (read_char(ps, &cp) || emit(ps, r, (struct gsym){G_CHAR, 0, cp, 0})) return -1;
            }
            if (ps->p >= ps->end) return fail(ps, at, COTI_E_FORMAT, "unterminated string literal");
            ps->p++;
            if (ps->rules[r].n == last) last = -1; /* "" is nothing to repeat */
        } else if (c == '[') {
            last = ps->rules[r].n;
            if (parse_class(ps, r)) return -1;
        } else if (c == '.') {
            ps->p++;
            last = ps->rules[r].n;
            if (emit(ps, r, (struct gsym){G_ANY, 0, 0, 0})) return -1;
        } else if (c == '(') {
            ps->p++;
            int32_t g = new_rule(ps, NULL, 0);
            if (g < 0 || parse_alternates(ps, g, true)) return -1;
            skip_space(ps);
            if (ps->p >= ps->end || *ps->p != ')') return fail(ps, at, COTI_E_FORMAT, "unclosed '('");
            ps->p++;
            last = ps->rules[r].n;
            if (emit(ps, r, (struct gsym){G_REF, 0, (uint32_t)g, 0})) return -1;
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (parse_repeat(ps, r, last)) return -1;
            last = -1;
        } else {
            return fail(ps, at, COTI_E_FORMAT, "unexpected character");
        }
    }
}

static int parse_alternates(struct parser *ps, int32_t r, bool nested) {
    if (parse_sequence(ps, r, nested)) return -1;
    while (ps->p < ps->end && *ps->p == '|') {
        ps->p++;
        if (emit(ps, r, (struct gsym){G_ALT, 0, 0, 0}) || parse_sequence(ps, r, nested)) return -1;
    }
    return 0;
}

static int parse_rules(struct parser *ps) {
    for (;;) {
        skip_space(ps);
        if (ps->p >= ps->end) return 0;
        const char *at = ps->p;
        size_t n = name_len(at, ps->end);
        if (!n || !at_definition(ps, at)) return fail(ps, at, COTI_E_FORMAT, "expected a rule definition 'name ::= ...'");
        int32_t r = rule_named(ps, at, n);
        if (r < 0) return -1;
        if (ps->rules[r].defined) return fail(ps, at, COTI_E_FORMAT, "rule defined twice");
        ps->rules[r].defined = true;
        ps->p = at + n;
        while (*ps->p != ':') ps->p++; /* at_definition saw the "::=" */
        ps->p += 3;
        if (parse_alternates(ps, r, false)) return -1;
    }
}

/* ---- compile: flatten, then refuse left recursion ---- */

static int flatten(struct parser *ps, struct grammar *g) {
    int32_t n_alt = 0, n_sym = 0;
    for (int32_t r = 0; r < ps->n_rules; r++) {
        n_alt++;
        for (int32_t i = 0; i < ps->rules[r].n; i++) n_alt += ps->rules[r].body[i].kind == G_ALT;
        n_sym += ps->rules[r].n + 1; /* each G_ALT becomes a G_END, plus the last one */
    }
    g->n_rules = ps->n_rules;
    g->n_sym = n_sym;
    g->sym = malloc(sizeof *g->sym * (size_t)n_sym);
    g->alt = malloc(sizeof *g->alt * (size_t)n_alt);
    g->rule_alt0 = malloc(sizeof *g->rule_alt0 * (size_t)ps->n_rules);
    g->rule_n_alt = malloc(sizeof *g->rule_n_alt * (size_t)ps->n_rules);
    g->ranges = malloc(sizeof *g->ranges * (size_t)(2 * ps->n_ranges + 1));
    if (!g->sym || !g->alt || !g->rule_alt0 || !g->rule_n_alt || !g->ranges)
        return fail(ps, ps->p, COTI_E_NOMEM, "out of memory");
    if (ps->n_ranges) memcpy(g->ranges, ps->ranges, sizeof *g->ranges * (size_t)(2 * ps->n_ranges));
    int32_t k = 0, a = 0;
    for (int32_t r = 0; r < ps->n_rules; r++) {
        g->rule_alt0[r] = a;
        g->alt[a++] = k;
        for (int32_t i = 0; i < ps->rules[r].n; i++) {
            struct gsym y = ps->rules[r].body[i];
            if (y.kind == G_ALT) {
                g->sym[k++] = (struct gsym){G_END, 0, 0, 0};
                g->alt[a++] = k;
            } else {
                g->sym[k++] = y;
            }
        }
        g->sym[k++] = (struct gsym){G_END, 0, 0, 0};
        g->rule_n_alt[r] = a - g->rule_alt0[r];
    }
    return 0;
}

/* Left recursion (a rule reaching itself before any character is matched) would make the
 * matcher loop: find it as a cycle among "may start with" edges r -> s, by peeling off rules
 * all of whose starters are peeled (Kahn); what is left holds a cycle. */
static int check_left_recursion(struct parser *ps, const struct grammar *g) {
    const int32_t R = g->n_rules;
    bool *nullable = calloc((size_t)R, sizeof *nullable);
    int32_t *n_out = calloc((size_t)R, sizeof *n_out), *in0 = calloc((size_t)R + 1, sizeof *in0);
    int32_t *queue = malloc(sizeof *queue * (size_t)R), *from = NULL;
    int rc = 0;
    if (!nullable || !n_out || !in0 || !queue) { rc = fail(ps, ps->p, COTI_E_NOMEM, "out of memory"); goto done; }
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t r = 0; r < R; r++) {
            for (int32_t j = 0; j < g->rule_n_alt[r] && !nullable[r]; j++) {
                int32_t i = g->alt[g->rule_alt0[r] + j];
                while (g->sym[i].kind == G_REF && nullable[g->sym[i].a]) i++;
                if (g->sym[i].kind == G_END) nullable[r] = changed = true;
            }
        }
    }
    /* the edges, bucketed by their starter s: from[in0[s] .. in0[s + 1]) */
    for (int pass = 0; pass < 2; pass++) {
        for (int32_t r = 0; r < R; r++)
            for (int32_t j = 0; j < g->rule_n_alt[r]; j++)
                for (int32_t i = g->alt[g->rule_alt0[r] + j]; g->sym[i].kind == G_REF; i++) {
                    int32_t s = (int32_t)g->sym[i].a;
                    if (pass == 0) { n_out[r]++; in0[s + 1]++; }
                    else from[queue[s]++] = r;
                    if (!nullable[s]) break;
                }
        if (pass == 0) {
            for (int32_t s = 0; s < R; s++) in0[s + 1] += in0[s];
            if (!(from = malloc(sizeof *from * (size_t)(in0[R] + 1)))) { rc = fail(ps, ps->p, COTI_E_NOMEM, "out of memory"); goto done; }
            memcpy(queue, in0, sizeof *queue * (size_t)R); /* fill cursors */
        }
    }
    int32_t head = 0, tail = 0;
    for (int32_t r = 0; r < R; r++) if (!n_out[r]) queue[tail++] = r;
    while (head < tail) {
        int32_t s = queue[head++];
        for (int32_t e = in0[s]; e < in0[s + 1]; e++)
            if (--n_out[from[e]] == 0) queue[tail++] = from[e];
    }
    if (tail < R) {
        int32_t bad = -1;
        for (int32_t r = 0; r < R && bad < 0; r++) if (n_out[r] && ps->rules[r].name) bad = r;
        char what[200];
        snprintf(what, sizeof what, "left recursion (through rule '%.120s')", bad >= 0 ? ps->rules[bad].name : "(group)");
        int line = bad >= 0 ? ps->rules[bad].line : 1, col = bad >= 0 ? ps->rules[bad].col : 1;
        rc = ps->rc = coti_fail(ps->err, ps->err_size, COTI_E_FORMAT, "grammar %d:%d: %s", line, col, what);
    }
done:
    free(nullable); free(n_out); free(in0); free(queue); free(from);
    return rc;
}

int grammar_parse(struct grammar **out, const char *text, size_t len, char *err, size_t err_size) {
    *out = NULL;
    struct parser ps = {.s = text, .end = text + len, .p = text, .err = err, .err_size = err_size};
    struct grammar *g = calloc(1, sizeof *g);
    if (!g) return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory");
    if (memchr(text, 0, len)) fail(&ps, (const char *)memchr(text, 0, len), COTI_E_FORMAT, "NUL byte in grammar");
    else parse_rules(&ps);
    if (!ps.rc) {
        g->root = -1;
        for (int32_t r = 0; r < ps.n_rules; r++) {
            if (!ps.rules[r].defined && ps.rules[r].name) {
                char what[200];
                snprintf(what, sizeof what, "undefined rule '%.120s'", ps.rules[r].name);
                int line = ps.rules[r].line, col = ps.rules[r].col;
                ps.rc = coti_fail(err, err_size, COTI_E_FORMAT, "grammar %d:%d: %s", line, col, what);
                break;
            }
            if (ps.rules[r].name && !strcmp(ps.rules[r].name, "root")) g->root = r;
        }
        if (!ps.rc && g->root < 0) ps.rc = coti_fail(err, err_size, COTI_E_FORMAT, "grammar: no 'root' rule");
    }
    if (!ps.rc) flatten(&ps, g);
    if (!ps.rc) check_left_recursion(&ps, g);
    for (int32_t r = 0; r < ps.n_rules; r++) { free(ps.rules[r].name); free(ps.rules[r].body); }
    free(ps.rules);
    free(ps.ranges);
    if (ps.rc) { grammar_free(g); return ps.rc; }
    *out = g;
    return 0;
}

/* ---- matcher ---- */

/* A set of stacks: [len, p_0 .. p_len-1] one after another (p_len-1 on top). */
struct gset {
    int32_t *v;
    int32_t n, cap, count;
};

struct grammar_state {
    const struct grammar *g;
    struct gset cur;
    uint32_t pend_cp;    /* a UTF-8 sequence the last bytes started: its bits so far */
    int pend_left;       /* continuation bytes it still needs (0: none pending) */
    bool done;           /* an end-of-generation token was accepted */
    long budget;         /* work left to the current operation (see GRAMMAR_WORK_*) */
    /* scratch */
    struct gset work;    /* stacks to expand: [p_0 .. p_len-1, len] (popped from the end) */
    struct gset *lvl;    /* one set per byte of a token */
    int32_t n_lvl;
    int32_t tmp[GRAMMAR_MAX_DEPTH + 1];
    uint8_t *allowed;
    int32_t n_allowed;
};

static bool gset_room(struct gset *s, int32_t more) { return grow((void **)&s->v, &s->cap, s->n + more, sizeof *s->v); }

static void gset_clear(struct gset *s) { s->n = s->count = 0; }

/* Add stack stk[0..len) to s unless it holds it already. */
static int gset_add(struct gset *s, const int32_t *stk, int32_t len) {
    for (int32_t i = 0; i < s->n; i += 1 + s->v[i])
        if (s->v[i] == len && !memcmp(s->v + i + 1, stk, sizeof *stk * (size_t)len)) return 0;
    if (s->count >= GRAMMAR_MAX_STACKS) return COTI_E_RANGE;
    if (!gset_room(s, len + 1)) return COTI_E_NOMEM;
    s->v[s->n] = len;
    memcpy(s->v + s->n + 1, stk, sizeof *stk * (size_t)len);
    s->n += len + 1;
    s->count++;
    return 0;
}

static int work_push(struct gset *w, const int32_t *stk, int32_t len, int32_t top) {
    if (w->count >= GRAMMAR_MAX_STACKS) return COTI_E_RANGE;
    if (!gset_room(w, len + 2)) return COTI_E_NOMEM;
    if (len) memcpy(w->v + w->n, stk, sizeof *stk * (size_t)len);
    w->v[w->n + len] = top;
    w->v[w->n + len + 1] = len + 1;
    w->n += len + 2;
    w->count++;
    return 0;
}

/* Expand every stack of the work list until its top is a character to match (or it is empty:
 * the grammar may end there) and add it to out. */
static int expand(struct grammar_state *st, struct gset *out) {
    const struct grammar *g = st->g;
    struct gset *w = &st->work;
    int32_t *stk = st->tmp;
    while (w->count) {
        int32_t len = w->v[w->n - 1];
        w->n -= len + 1;
        w->count--;
        memcpy(stk, w->v + w->n, sizeof *stk * (size_t)len);
        for (;;) {
            if (--st->budget < 0) return COTI_E_RANGE;
            if (len == 0 || g->sym[stk[len - 1]].kind >= G_CHAR) {
                st->budget -= out->count; /* the duplicate check */
                int rc = gset_add(out, stk, len);
                if (rc) return rc;
                break;
            }
            const struct gsym *y = &g->sym[stk[len - 1]];
            if (y->kind == G_END) { len--; continue; }
            /* a rule: the caller continues after it (dropped when nothing follows, so a right
             * recursion does not grow the stack); one stack per alternative */
            if (g->sym[stk[len - 1] + 1].kind == G_END) len--;
            else stk[len - 1]++;
            if (len >= GRAMMAR_MAX_DEPTH) return COTI_E_RANGE;
            const int32_t *alt = g->alt + g->rule_alt0[y->a];
            for (int32_t j = 1; j < g->rule_n_alt[y->a]; j++) {
                int rc = work_push(w, stk, len, alt[j]);
                if (rc) return rc;
            }
            stk[len++] = alt[0];
        }
    }
    return 0;
}

static bool sym_matches(const struct grammar *g, const struct gsym *y, uint32_t lo, uint32_t hi) {
    switch (y->kind) {
    case G_CHAR: return y->a >= lo && y->a <= hi;
    case G_ANY: return true;
    case G_CLASS: {
        const uint32_t *r = g->ranges + 2 * y->a;
        if (!y->neg) {
            for (uint32_t i = 0; i < y->b; i++) if (r[2 * i] <= hi && r[2 * i + 1] >= lo) return true;
            return false;
        }
        /* [^...] over a range of code points (a partial UTF-8 sequence): some code point of it
         * is outside every listed range unless one range covers it all (ranges that only
         * cover it together pass here and fail on the next byte) */
        for (uint32_t i = 0; i < y->b; i++) if (r[2 * i] <= lo && r[2 * i + 1] >= hi) return false;
        return true;
    }
    default: return false;
    }
}

/* out = the stacks of in that match code point cp, advanced past it. */
static int advance(struct grammar_state *st, const struct gset *in, uint32_t cp, struct gset *out) {
    const struct grammar *g = st->g;
    gset_clear(out);
    gset_clear(&st->work);
    if ((st->budget -= in->count) < 0) return COTI_E_RANGE;
    for (int32_t i = 0; i < in->n; i += 1 + in->v[i]) {
        int32_t len = in->v[i];
        if (!len) continue;
        int32_t top = in->v[i + len];
        if (!sym_matches(g, &g->sym[top], cp, cp)) continue;
        int rc = work_push(&st->work, in->v + i + 1, len - 1, top + 1);
        if (!rc) rc = expand(st, out);
        if (rc) { gset_clear(&st->work); return rc; }
    }
    return 0;
}

/* Whether some stack of in could match a code point that starts with the bits pend_cp and has
 * `left` continuation bytes to come. */
static bool partial_viable(const struct grammar *g, const struct gset *in, uint32_t pend_cp, int left) {
    uint32_t lo = pend_cp << (6 * left), hi = lo | ((1u << (6 * left)) - 1);
    /* what utf8_step will let the rest of the form reach: after a three-byte lead U+0800 and
     * up, after a four-byte lead U+10000 to U+10FFFF (later bytes are checked as they come) */
    if (left == 2) lo = COTI_MAX(lo, 0x800u);
    if (left == 3) { lo = COTI_MAX(lo, 0x10000u); hi = COTI_MIN(hi, 0x10FFFFu); }
    if (lo > hi) return false;
    for (int32_t i = 0; i < in->n; i += 1 + in->v[i])
        if (in->v[i] && sym_matches(g, &g->sym[in->v[i + in->v[i]]], lo, hi)) return true;
    return false;
}

/* One byte of UTF-8 into (cp, left). Returns 1 when a code point is complete, 0 when more
 * bytes are needed, -1 for a byte that cannot come here. Only well-formed UTF-8 passes: an
 * overlong form (C0 8A for a newline), a surrogate or a code point past U+10FFFF would let a
 * byte-level token satisfy a literal while the text that goes out is not that character. */
static int utf8_step(uint32_t *cp, int *left, uint8_t b) {
    if (*left == 0) {
        if (b < 0x80) { *cp = b; return 1; }
        if ((b >> 5) == 6 && b >= 0xC2) { *cp = b & 0x1F; *left = 1; return 0; }
        if ((b >> 4) == 14) { *cp = b & 0x0F; *left = 2; return 0; }
        if ((b >> 3) == 30 && b <= 0xF4) { *cp = b & 0x07; *left = 3; return 0; }
        return -1;
    }
    if ((b & 0xC0) != 0x80) return -1;
    *cp = (*cp << 6) | (b & 0x3F);
    --*left;
    /* the first continuation byte decides the range: of a three-byte form (left now 1; also
     * reached by a four-byte form's second, whose bits are >= 0x400 and pass), U+0800 and up
     * but no surrogate; of a four-byte form (left now 2), U+10000 to U+10FFFF */
    if (*left == 1 && (*cp < 0x20 || (*cp >= 0x360 && *cp <= 0x37F))) return -1;
    if (*left == 2 && (*cp < 0x10 || *cp > 0x10F)) return -1;
    return *left == 0;
}

static int ensure_levels(struct grammar_state *st, int32_t n) {
    if (n <= st->n_lvl) return 0;
    struct gset *l = realloc(st->lvl, sizeof *l * (size_t)n);
    if (!l) return COTI_E_NOMEM;
    memset(l + st->n_lvl, 0, sizeof *l * (size_t)(n - st->n_lvl));
    st->lvl = l;
    st->n_lvl = n;
    return 0;
}

int grammar_state_init(struct grammar_state **out, const struct grammar *g, char *err, size_t err_size) {
    *out = NULL;
    struct grammar_state *st = calloc(1, sizeof *st);
    if (!st) return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory");
    st->g = g;
    st->budget = GRAMMAR_WORK_PER_BYTE * 16;
    int rc = work_push(&st->work, NULL, 0, g->alt[g->rule_alt0[g->root]]);
    for (int32_t j = 1; !rc && j < g->rule_n_alt[g->root]; j++) rc = work_push(&st->work, NULL, 0, g->alt[g->rule_alt0[g->root] + j]);
    if (!rc) rc = expand(st, &st->cur);
    if (!rc) rc = ensure_levels(st, 2);
    if (rc) {
        grammar_state_free(st);
        return coti_fail(err, err_size, rc, rc == COTI_E_RANGE ? "grammar: the start state exceeds the matcher's limits" : "out of memory");
    }
    *out = st;
    return 0;
}

void grammar_state_free(struct grammar_state *st) {
    if (!st) return;
    free(st->cur.v);
    free(st->work.v);
    for (int32_t i = 0; i < st->n_lvl; i++) free(st->lvl[i].v);
    free(st->lvl);
    free(st->allowed);
    free(st);
}

static int gset_copy(struct gset *dst, const struct gset *src) {
    gset_clear(dst);
    if (!gset_room(dst, src->n)) return COTI_E_NOMEM;
    if (src->n) memcpy(dst->v, src->v, sizeof *src->v * (size_t)src->n);
    dst->n = src->n;
    dst->count = src->count;
    return 0;
}

int grammar_state_copy(struct grammar_state *dst, const struct grammar_state *src) {
    int rc = gset_copy(&dst->cur, &src->cur);
    if (rc) return rc;
    dst->pend_cp = src->pend_cp;
    dst->pend_left = src->pend_left;
    dst->done = src->done;
    return 0;
}

bool grammar_done(const struct grammar_state *st) { return st->done; }

bool grammar_can_end(const struct grammar_state *st) {
    if (st->pend_left) return false;
    for (int32_t i = 0; i < st->cur.n; i += 1 + st->cur.v[i])
        if (st->cur.v[i] == 0) return true;
    return false;
}

/* Run bytes b[0..n) from st's position through its two scratch levels. Returns 0 with the
 * resulting set in *res (st->cur when n == 0) and the UTF-8 carry, COTI_E_ARG (rejected),
 * COTI_E_RANGE, COTI_E_NOMEM. */
static int run_bytes(struct grammar_state *st, const uint8_t *b, size_t n, const struct gset **res, uint32_t *cp, int *left) {
    const struct gset *set = &st->cur;
    *cp = st->pend_cp;
    *left = st->pend_left;
    if (st->done) return COTI_E_ARG;
    st->budget = GRAMMAR_WORK_PER_BYTE * (long)(n + 16);
    int flip = 0;
    for (size_t i = 0; i < n; i++) {
        int u = utf8_step(cp, left, b[i]);
        if (u < 0) return COTI_E_ARG;
        if (u == 0) {
            if (!partial_viable(st->g, set, *cp, *left)) return COTI_E_ARG;
            continue;
        }
        struct gset *next = &st->lvl[flip];
        flip ^= 1;
        int rc = advance(st, set, *cp, next);
        if (rc) return rc;
        if (!next->count) return COTI_E_ARG;
        set = next;
    }
    *res = set;
    return 0;
}

int grammar_accept_bytes(struct grammar_state *st, const char *b, size_t n) {
    const struct gset *res;
    uint32_t cp;
    int left;
    int rc = run_bytes(st, (const uint8_t *)b, n, &res, &cp, &left);
    if (rc) return rc;
    if (res != &st->cur && (rc = gset_copy(&st->cur, res))) return rc;
    st->pend_cp = cp;
    st->pend_left = left;
    return 0;
}

/* ---- vocabulary ---- */

struct grammar_vocab {
    int32_t n_vocab;              /* logits the masks cover */
    const struct tokenizer *t;
    /* the trie of the pieces: node 0 is the root */
    int32_t *first_child, *next_sibling, *first_token;
    uint8_t *byte;
    int32_t n_nodes;
    int32_t *next_token;          /* [n_vocab]: the next token ending at the same node, -1 */
    uint8_t *eog;                 /* [n_vocab] */
    int32_t max_len;              /* longest piece, bytes */
};

void grammar_vocab_free(struct grammar_vocab *v) {
    if (!v) return;
    free(v->first_child); free(v->next_sibling); free(v->first_token); free(v->byte); free(v->next_token); free(v->eog);
    free(v);
}

int32_t grammar_vocab_size(const struct grammar_vocab *v) { return v->n_vocab; }

int grammar_vocab_init(struct grammar_vocab **out, const struct tokenizer *t, int32_t n_vocab, char *err, size_t err_size) {
    *out = NULL;
    struct grammar_vocab *v = calloc(1, sizeof *v);
    if (!v) return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory");
    v->n_vocab = n_vocab;
    v->t = t;
    const int32_t n_tok = COTI_MIN(n_vocab, tokenizer_n_vocab(t));
    size_t total = 1;
    for (int32_t id = 0; id < n_tok; id++) {
        const char *piece;
        size_t len;
        tokenizer_token_to_piece(t, id, false, &piece, &len);
        total += len;
        if ((int32_t)len > v->max_len) v->max_len = (int32_t)len;
    }
    if (total > INT32_MAX) { grammar_vocab_free(v); return coti_fail(err, err_size, COTI_E_RANGE, "vocabulary too large"); }
    v->first_child = malloc(sizeof(int32_t) * total);
    v->next_sibling = malloc(sizeof(int32_t) * total);
    v->first_token = malloc(sizeof(int32_t) * total);
    v->byte = malloc(total);
    v->next_token = malloc(sizeof(int32_t) * (size_t)(n_vocab > 0 ? n_vocab : 1));
    v->eog = calloc((size_t)(n_vocab > 0 ? n_vocab : 1), 1);
    int32_t root_child[256];
    if (!v->first_child || !v->next_sibling || !v->first_token || !v->byte || !v->next_token || !v->eog) {
        grammar_vocab_free(v);
        return coti_fail(err, err_size, COTI_E_NOMEM, "out of memory");
    }
    for (int i = 0; i < 256; i++) root_child[i] = -1;
    v->n_nodes = 1;
    v->first_child[0] = v->next_sibling[0] = v->first_token[0] = -1;
    v->byte[0] = 0;
    for (int32_t id = 0; id < n_vocab; id++) v->next_token[id] = -1;
    for (int32_t id = 0; id < n_tok; id++) {
        const char *piece;
        size_t len;
        tokenizer_token_to_piece(t, id, false, &piece, &len);
        v->eog[id] = tokenizer_is_eog(t, id);
        if (!len || v->eog[id]) continue;
        int32_t node = 0;
        for (size_t i = 0; i < len; i++) {
            uint8_t b = (uint8_t)piece[i];
            int32_t c = node == 0 ? root_child[b] : v->first_child[node];
            if (node != 0) while (c >= 0 && v->byte[c] != b) c = v->next_sibling[c];
            if (c < 0) {
                c = v->n_nodes++;
                v->byte[c] = b;
                v->first_child[c] = v->first_token[c] = -1;
                v->next_sibling[c] = v->first_child[node];
                v->first_child[node] = c;
                if (node == 0) root_child[b] = c;
            }
            node = c;
        }
        v->next_token[id] = v->first_token[node];
        v->first_token[node] = id;
    }
    *out = v;
    return 0;
}

static bool token_piece(const struct grammar_vocab *v, int32_t id, const uint8_t **p, size_t *len) {
    const char *piece;
    if (id < 0 || id >= v->n_vocab || tokenizer_token_to_piece(v->t, id, false, &piece, len) || !*len) return false;
    *p = (const uint8_t *)piece;
    return true;
}

bool grammar_token_ok(struct grammar_state *st, const struct grammar_vocab *v, int32_t id) {
    if (id < 0 || id >= v->n_vocab) return false;
    if (v->eog[id]) return !st->done && grammar_can_end(st);
    const uint8_t *p;
    size_t len;
    const struct gset *res;
    uint32_t cp;
    int left;
    return token_piece(v, id, &p, &len) && run_bytes(st, p, len, &res, &cp, &left) == 0;
}

int grammar_accept_token(struct grammar_state *st, const struct grammar_vocab *v, int32_t id) {
    if (id < 0 || id >= v->n_vocab) return COTI_E_ARG;
    if (v->eog[id]) {
        if (st->done || !grammar_can_end(st)) return COTI_E_ARG;
        st->done = true;
        return 0;
    }
    const uint8_t *p;
    size_t len;
    if (!token_piece(v, id, &p, &len)) return COTI_E_ARG;
    return grammar_accept_bytes(st, (const char *)p, len);
}

/* Mark every token under trie node `node` that may follow, from set (at byte depth `depth`)
 * with UTF-8 carry (cp, left). */
static int mask_walk(struct grammar_state *st, const struct grammar_vocab *v, int32_t node, int32_t depth,
                     const struct gset *set, uint32_t cp, int left) {
    int rc_any = 0;
    for (int32_t c = v->first_child[node]; c >= 0; c = v->next_sibling[c]) {
        uint32_t cp2 = cp;
        int left2 = left;
        int u = utf8_step(&cp2, &left2, v->byte[c]);
        const struct gset *next = set;
        if (u < 0) continue;
        if (u == 0) {
            if (!partial_viable(st->g, set, cp2, left2)) continue;
        } else {
            struct gset *l = &st->lvl[depth];
            int rc = advance(st, set, cp2, l);
            if (rc == COTI_E_RANGE && st->budget < 0) return rc; /* out of work: the rest stays masked */
            if (rc) { rc_any = rc; continue; }
            if (!l->count) continue;
            next = l;
        }
        for (int32_t id = v->first_token[c]; id >= 0; id = v->next_token[id]) st->allowed[id] = 1;
        if (v->first_child[c] >= 0) {
            int rc = mask_walk(st, v, c, depth + 1, next, cp2, left2);
            if (rc) rc_any = rc;
        }
    }
    return rc_any;
}

int grammar_mask(struct grammar_state *st, const struct grammar_vocab *v, float *logits, int32_t n) {
    if (st->n_allowed < v->n_vocab) {
        uint8_t *a = realloc(st->allowed, (size_t)v->n_vocab);
        if (!a) return COTI_E_NOMEM;
        st->allowed = a;
        st->n_allowed = v->n_vocab;
    }
    int rc = ensure_levels(st, v->max_len + 2);
    if (rc) return rc;
    memset(st->allowed, 0, (size_t)v->n_vocab);
    st->budget = GRAMMAR_WORK_PER_NODE * (long)v->n_nodes + GRAMMAR_WORK_PER_BYTE * 64;
    if (!st->done) {
        rc = mask_walk(st, v, 0, 0, &st->cur, st->pend_cp, st->pend_left);
        if (rc == COTI_E_NOMEM) return rc;
        const bool can_end = grammar_can_end(st);
        for (int32_t id = 0; can_end && id < v->n_vocab; id++) if (v->eog[id]) st->allowed[id] = 1;
    }
    for (int32_t i = 0; i < n; i++)
        if (i >= v->n_vocab || !st->allowed[i]) logits[i] = -INFINITY;
    return rc;
}

int32_t grammar_argmax(struct grammar_state *st, const struct grammar_vocab *v, float *logits, int32_t n) {
    int32_t a = sample_argmax(logits, n);
    if (a >= 0 && logits[a] > -INFINITY && grammar_token_ok(st, v, a)) return a;
    if (grammar_mask(st, v, logits, n)) return -1; /* a partial mask is no answer */
    a = sample_argmax(logits, n);
    return a >= 0 && logits[a] > -INFINITY ? a : -1;
}
