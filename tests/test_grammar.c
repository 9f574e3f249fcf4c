/* test_grammar.c — GBNF grammars: the parser on good and bad grammars (errors with line:col),
 * the matcher on strings it must accept or reject, its limits against hostile grammars, and
 * token masks on the shipped tokenizer against a brute-force reference (every token's piece
 * run through the matcher alone). Tests run from the repo root. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"
#include "gguf.h"
#include "json_schema.h"
#include "tokenizer.h"

#define SHIPPED_MODEL "models/coti-tiny-qwen35-mtp-q8_0.gguf"

static struct grammar *compile(const char *text) {
    struct grammar *g;
    char err[256] = "";
    cr_assert_eq(grammar_parse(&g, text, strlen(text), err, sizeof err), 0, "%s: %s", text, err);
    return g;
}

/* Whether the whole of s is a sentence of g (accepted and complete). */
static bool matches(const struct grammar *g, const char *s) {
    struct grammar_state *st;
    char err[256];
    cr_assert_eq(grammar_state_init(&st, g, err, sizeof err), 0, "%s", err);
    bool ok = grammar_accept_bytes(st, s, strlen(s)) == 0 && grammar_can_end(st);
    grammar_state_free(st);
    return ok;
}

/* Whether s is a prefix of some sentence of g. */
static bool prefix_ok(const struct grammar *g, const char *s) {
    struct grammar_state *st;
    char err[256];
    cr_assert_eq(grammar_state_init(&st, g, err, sizeof err), 0, "%s", err);
    bool ok = grammar_accept_bytes(st, s, strlen(s)) == 0;
    grammar_state_free(st);
    return ok;
}

static void expect_error(const char *text, const char *want) {
    struct grammar *g = NULL;
    char err[256] = "";
    cr_assert_neq(grammar_parse(&g, text, strlen(text), err, sizeof err), 0, "accepted: %s", text);
    cr_assert_null(g);
    cr_assert(strstr(err, want), "'%s': error '%s' does not say '%s'", text, err, want);
}

Test(grammar, literals_classes_and_repetition) {
    struct grammar *g = compile("root ::= \"a\" [b-d]+ x? \"\\n\" # comment\nx ::= [^0-9] | \"\\x41\\u00e9\"\n");
    cr_assert(matches(g, "ab\n"));
    cr_assert(matches(g, "abcdbz\n"));
    cr_assert(matches(g, "abAé\n"));
    cr_assert(matches(g, "abé\n"), "a 2-byte code point matches [^0-9]");
    cr_assert(!matches(g, "a\n"), "+ needs one");
    cr_assert(!matches(g, "ab5\n"));
    cr_assert(!matches(g, "ab"), "not complete");
    cr_assert(prefix_ok(g, "ab"));
    cr_assert(!prefix_ok(g, "b"));
    grammar_free(g);

    g = compile("root ::= (\"ab\" | \"c\"){2,3} \"-\"{2} [0-9]{1,} .\n");
    cr_assert(matches(g, "abc--1x"));
    cr_assert(matches(g, "ccab--123!"));
    cr_assert(!matches(g, "c--1x"), "{2,3} needs two");
    cr_assert(!matches(g, "abababab--1x"), "{2,3} allows three");
    cr_assert(!matches(g, "cc-1x"));
    cr_assert(!matches(g, "cc--x"));
    grammar_free(g);

    /* a rule spans lines; the next definition ends it */
    g = compile("root ::=\n  item\n  (\",\" item)*\nitem ::= [a-z]+\n");
    cr_assert(matches(g, "ab,c,def"));
    cr_assert(!matches(g, "ab,"));
    grammar_free(g);
}

/* Only well-formed UTF-8 matches: a byte-level token spelling a newline as the overlong C0 8A
 * satisfied "\n" while the text that went out was two invalid bytes. */
Test(grammar, malformed_utf8_never_matches) {
    struct grammar *g = compile("root ::= \"<\\n>\" [^x]*\n");
    cr_assert(matches(g, "<\n>"));
    cr_assert(!prefix_ok(g, "<\xc0\x8a"), "overlong newline");
    cr_assert(!prefix_ok(g, "<\xc1"), "C1 starts only overlong forms");
    /* nor may a lead byte pass whose only way on is an overlong form (a dead end for a mask) */
    cr_assert(!prefix_ok(g, "<\xe0"), "a three-byte form cannot be a newline");
    cr_assert(!prefix_ok(g, "<\xf0"), "a four-byte form cannot be a newline");
    cr_assert(prefix_ok(g, "<\n>\xe0") && prefix_ok(g, "<\n>\xf4"), "but may be another character");
    cr_assert(matches(g, "<\n>\xc2\xa9\xe0\xa0\x80\xed\x9f\xbf\xf0\x90\x80\x80\xf4\x8f\xbf\xbf"),
              "the smallest and largest of each length");
    cr_assert(!prefix_ok(g, "<\n>\xe0\x9f"), "overlong three-byte form");
    cr_assert(!prefix_ok(g, "<\n>\xed\xa0"), "a surrogate");
    cr_assert(!prefix_ok(g, "<\n>\xf0\x8f"), "overlong four-byte form");
    cr_assert(!prefix_ok(g, "<\n>\xf4\x90"), "past U+10FFFF");
    cr_assert(!prefix_ok(g, "<\n>\xf5"), "no code point starts with F5");
    grammar_free(g);
}

Test(grammar, partial_utf8_carries_between_calls) {
    struct grammar *g = compile("root ::= \"\xc3\xa9\" [\xe2\x82\xac]\n"); /* é € */
    struct grammar_state *st;
    char err[256];
    cr_assert_eq(grammar_state_init(&st, g, err, sizeof err), 0);
    cr_assert_eq(grammar_accept_bytes(st, "\xc3", 1), 0);
    cr_assert(!grammar_can_end(st));
    cr_assert_eq(grammar_accept_bytes(st, "\xa9\xe2\x82", 3), 0);
    cr_assert_eq(grammar_accept_bytes(st, "\x81", 1), COTI_E_ARG, "U+2081 is not U+20AC");
    cr_assert_eq(grammar_accept_bytes(st, "\xac", 1), 0);
    cr_assert(grammar_can_end(st));
    grammar_free(g);
    grammar_state_free(st);
    /* a lead byte no code point of the class can start is refused at once */
    g = compile("root ::= [a-z]\n");
    cr_assert(!prefix_ok(g, "\xc3"));
    grammar_free(g);
}

Test(grammar, state_copy_is_independent) {
    struct grammar *g = compile("root ::= \"ab\" | \"ac\"\n");
    struct grammar_state *a, *b;
    char err[256];
    cr_assert_eq(grammar_state_init(&a, g, err, sizeof err), 0);
    cr_assert_eq(grammar_state_init(&b, g, err, sizeof err), 0);
    cr_assert_eq(grammar_accept_bytes(a, "a", 1), 0);
    cr_assert_eq(grammar_state_copy(b, a), 0);
    cr_assert_eq(grammar_accept_bytes(b, "b", 1), 0);
    cr_assert(grammar_can_end(b));
    cr_assert(!grammar_can_end(a));
    cr_assert_eq(grammar_accept_bytes(a, "d", 1), COTI_E_ARG);
    cr_assert_eq(grammar_accept_bytes(a, "c", 1), 0, "a rejected byte leaves the state as it was");
    grammar_state_free(a);
    grammar_state_free(b);
    grammar_free(g);
}

Test(grammar, bad_grammars_say_where) {
    expect_error("", "no 'root' rule");
    expect_error("root ::= foo\n", "1:10: undefined rule 'foo'");
    expect_error("root ::= \"a\"\n  x ::= \"b\"\nroot ::= \"c\"\n", "3:1: rule defined twice");
    expect_error("root ::= \"abc\n", "1:10: unterminated string literal");
    expect_error("root ::= [ab\n", "unterminated character class");
    expect_error("root ::= [z-a]\n", "out of order");
    expect_error("root ::= (\"a\"\n", "1:10: unclosed '('");
    expect_error("root ::= \"a\" )\n", "1:14: unexpected ')'");
    expect_error("root ::= * \"a\"\n", "1:10: repetition without anything");
    expect_error("root ::= \"a\"{3,2}\n", "n < m");
    expect_error("root ::= \"a\"{999999999}\n", "too large");
    expect_error("root ::= \"\\q\"\n", "unknown escape");
    expect_error("root ::= \"\\xZ1\"\n", "bad hex escape");
    expect_error("root = \"a\"\n", "1:1: expected a rule definition");
    expect_error("root ::= \"a\" @\n", "1:14: unexpected character");
    expect_error("root ::= root \"a\" | \"b\"\n", "left recursion (through rule 'root')");
    expect_error("root ::= x\nx ::= y? root \"a\"\ny ::= \"b\"\n", "left recursion");
    expect_error("root ::= (\"\" | \"a\")* root\n", "left recursion");
}

Test(grammar, right_recursion_does_not_grow_and_nesting_is_capped) {
    /* a long list through right recursion: the stack stays flat */
    struct grammar *g = compile("root ::= \"a\" root | \"a\"\n");
    char *s = malloc(100001);
    memset(s, 'a', 100000);
    s[100000] = 0;
    cr_assert(matches(g, s));
    grammar_free(g);
    /* nesting is bounded: deeper than GRAMMAR_MAX_DEPTH is a clear COTI_E_RANGE */
    g = compile("root ::= \"(\" root \")\" | \"x\"\n");
    struct grammar_state *st;
    char err[256];
    cr_assert_eq(grammar_state_init(&st, g, err, sizeof err), 0);
    memset(s, '(', 100000);
    int rc = grammar_accept_bytes(st, s, 100000);
    cr_assert_eq(rc, COTI_E_RANGE);
    grammar_state_free(st);
    grammar_free(g);
    free(s);
    /* an exponentially ambiguous grammar hits the stack-set cap, not the memory */
    g = compile("root ::= x x x x x x x x x x x x x x x x x x x x\nx ::= \"a\"? \"a\"? \"a\"?\n");
    cr_assert_eq(grammar_state_init(&st, g, err, sizeof err), 0, "%s", err);
    rc = 0;
    for (int i = 0; i < 40 && !rc; i++) rc = grammar_accept_bytes(st, "a", 1);
    cr_assert(rc == 0 || rc == COTI_E_RANGE, "rc %d", rc);
    grammar_state_free(st);
    grammar_free(g);
}

/* ---- masks on the shipped tokenizer ---- */

static struct gguf_file *g_file;
static struct tokenizer *g_tok;
static struct grammar_vocab *g_vocab;

static void open_vocab(void) {
    char err[512] = "";
    cr_assert_eq(gguf_open(&g_file, SHIPPED_MODEL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(tokenizer_init(&g_tok, g_file, err, sizeof err), 0, "%s", err);
    cr_assert_eq(grammar_vocab_init(&g_vocab, g_tok, tokenizer_n_vocab(g_tok) + 7, err, sizeof err), 0, "%s", err);
}

static void close_vocab(void) {
    grammar_vocab_free(g_vocab);
    tokenizer_free(g_tok);
    gguf_close(g_file);
}

/* After each prefix of text, the mask equals running every token through the matcher alone. */
static void check_masks(const char *grammar_text, const char *text) {
    struct grammar *g = compile(grammar_text);
    struct grammar_state *st, *probe;
    char err[256];
    cr_assert_eq(grammar_state_init(&probe, g, err, sizeof err), 0);
    const int32_t n = grammar_vocab_size(g_vocab), n_tok = tokenizer_n_vocab(g_tok);
    float *row = malloc(sizeof(float) * (size_t)n);
    const size_t len = strlen(text);
    int n_checked = 0;
    for (size_t cut = 0; cut <= len; cut += 1 + cut % 3) {
        cr_assert_eq(grammar_state_init(&st, g, err, sizeof err) == 0 && grammar_accept_bytes(st, text, cut) == 0, true,
                     "prefix %zu of %s", cut, text);
        for (int32_t i = 0; i < n; i++) row[i] = 1.0f;
        grammar_mask(st, g_vocab, row, n);
        int n_allowed = 0;
        for (int32_t id = 0; id < n; id++) {
            bool want;
            const char *piece;
            size_t plen;
            tokenizer_token_to_piece(g_tok, id, false, &piece, &plen);
            if (id >= n_tok) want = false;
            else if (tokenizer_is_eog(g_tok, id)) want = grammar_can_end(st);
            else {
                cr_assert_eq(grammar_state_copy(probe, st), 0);
                want = plen > 0 && grammar_accept_bytes(probe, piece, plen) == 0;
            }
            cr_assert_eq(row[id] == 1.0f, want, "prefix %zu, token %d '%.*s': mask %g, reference %d", cut, id, (int)plen,
                         piece, row[id], want);
            cr_assert_eq(grammar_token_ok(st, g_vocab, id), want, "token_ok disagrees on %d", id);
            n_allowed += want;
        }
        cr_assert(n_allowed > 0, "something may always follow a valid prefix");
        grammar_state_free(st);
        n_checked++;
    }
    cr_assert(n_checked > 3);
    grammar_state_free(probe);
    free(row);
    grammar_free(g);
}

Test(grammar, masks_match_brute_force_on_shipped_vocab, .init = open_vocab, .fini = close_vocab, .timeout = 120) {
    check_masks("root ::= \"The \" [a-z]+ (\" \" [a-z]+){0,3} \".\"\n", "The quick brown fox.");
    check_masks("root ::= [^\\n]* \"\\n\" \"é€\"\n", "naïve café\né€");
    char *json = json_schema_object_grammar();
    cr_assert_not_null(json);
    check_masks(json, "{\"a\": [1, -2.5e3, true, null], \"b\": {\"c\": \"x\\\"y\"}}");
    free(json);
}

Test(grammar, argmax_prefers_the_plain_argmax_and_falls_back_to_the_mask, .init = open_vocab, .fini = close_vocab) {
    struct grammar *g = compile("root ::= \"yes\" | \"no\"\n");
    struct grammar_state *st;
    char err[256];
    cr_assert_eq(grammar_state_init(&st, g, err, sizeof err), 0);
    const int32_t n = grammar_vocab_size(g_vocab);
    float *row = malloc(sizeof(float) * (size_t)n);
    for (int32_t i = 0; i < n; i++) row[i] = (float)(i % 97) * 0.01f;
    int32_t t = grammar_argmax(st, g_vocab, row, n);
    cr_assert_geq(t, 0);
    const char *piece;
    size_t plen;
    tokenizer_token_to_piece(g_tok, t, false, &piece, &plen);
    cr_assert(grammar_token_ok(st, g_vocab, t), "'%.*s'", (int)plen, piece);
    cr_assert(plen <= 3 && (!strncmp(piece, "yes", plen) || !strncmp(piece, "no", plen)), "'%.*s'", (int)plen, piece);
    /* every token that may come is masked out: nothing to pick */
    cr_assert_eq(grammar_accept_bytes(st, "yes", 3), 0);
    for (int32_t i = 0; i < n; i++) row[i] = tokenizer_is_eog(g_tok, i) ? -INFINITY : 0.0f;
    cr_assert_eq(grammar_argmax(st, g_vocab, row, n), -1);
    /* the end: an end-of-generation token, and after it nothing */
    for (int32_t i = 0; i < n; i++) row[i] = 0.0f;
    t = grammar_argmax(st, g_vocab, row, n);
    cr_assert(t >= 0 && tokenizer_is_eog(g_tok, t));
    cr_assert_eq(grammar_accept_token(st, g_vocab, t), 0);
    cr_assert(!grammar_token_ok(st, g_vocab, t));
    free(row);
    grammar_state_free(st);
    grammar_free(g);
}

/* ---- JSON schema -> grammar ---- */

static struct grammar *from_schema(const char *schema_json) {
    cJSON *s = cJSON_Parse(schema_json);
    cr_assert_not_null(s, "%s", schema_json);
    char *text = NULL, err[256] = "";
    cr_assert_eq(json_schema_to_grammar(s, &text, err, sizeof err), 0, "%s: %s", schema_json, err);
    cJSON_Delete(s);
    struct grammar *g = compile(text);
    free(text);
    return g;
}

static void schema_refused(const char *schema_json, const char *want) {
    cJSON *s = cJSON_Parse(schema_json);
    cr_assert_not_null(s);
    char *text = NULL, err[256] = "";
    cr_assert_neq(json_schema_to_grammar(s, &text, err, sizeof err), 0, "accepted %s", schema_json);
    cr_assert_null(text);
    cr_assert(strstr(err, want), "%s: '%s' does not say '%s'", schema_json, err, want);
    cJSON_Delete(s);
}

Test(grammar, json_schema_objects_required_and_optional) {
    struct grammar *g = from_schema("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":5},"
                                    "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\"]},"
                                    "\"minItems\":1,\"maxItems\":2}},\"required\":[\"name\"],\"additionalProperties\":false}");
    cr_assert(matches(g, "{\"name\": \"bob\"}"));
    cr_assert(matches(g, "{\"name\":\"bob\",\"age\":-3}"));
    cr_assert(matches(g, "{\"name\": \"bob\", \"tags\": [\"a\", \"b\"]}"));
    cr_assert(matches(g, "{ \"name\": \"\", \"age\": 0, \"tags\": [\"b\"] }"));
    cr_assert(!matches(g, "{}"), "name is required");
    cr_assert(!matches(g, "{\"age\": 3}"));
    cr_assert(!matches(g, "{\"name\": \"toolong\"}"), "maxLength 5");
    cr_assert(!matches(g, "{\"name\": \"bob\", \"age\": 1.5}"), "integer");
    cr_assert(!matches(g, "{\"name\": \"bob\", \"tags\": []}"), "minItems 1");
    cr_assert(!matches(g, "{\"name\": \"bob\", \"tags\": [\"a\",\"a\",\"a\"]}"), "maxItems 2");
    cr_assert(!matches(g, "{\"name\": \"bob\", \"tags\": [\"c\"]}"), "enum");
    cr_assert(!matches(g, "{\"name\": \"bob\", \"x\": 1}"), "additionalProperties false");
    cr_assert(!matches(g, "{\"name\": \"bob\",}"));
    grammar_free(g);
}

Test(grammar, json_schema_refs_anyof_const_and_any) {
    struct grammar *g = from_schema("{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"number\"},"
                                    "\"next\":{\"anyOf\":[{\"$ref\":\"#/$defs/node\"},{\"type\":\"null\"}]}},"
                                    "\"required\":[\"v\",\"next\"]}},\"$ref\":\"#/$defs/node\"}");
    cr_assert(matches(g, "{\"v\": 1, \"next\": {\"v\": 2.5e-3, \"next\": null}}"));
    cr_assert(!matches(g, "{\"v\": 1, \"next\": {\"v\": true, \"next\": null}}"));
    grammar_free(g);
    g = from_schema("{\"type\":[\"boolean\",\"null\"]}");
    cr_assert(matches(g, "true"));
    cr_assert(matches(g, "null"));
    cr_assert(!matches(g, "1"));
    grammar_free(g);
    g = from_schema("{\"const\":{\"a\":[1,\"x\"]}}");
    cr_assert(matches(g, "{\"a\":[1,\"x\"]}"));
    cr_assert(!matches(g, "{\"a\":[1,\"y\"]}"));
    grammar_free(g);
    g = from_schema("{\"type\":\"object\",\"title\":\"anything\"}");
    cr_assert(matches(g, "{\"k\": [1, {\"z\": \"\\u00e9\"}], \"j\": false}"));
    cr_assert(!matches(g, "[1]"));
    grammar_free(g);
    char *obj = json_schema_object_grammar();
    g = compile(obj);
    free(obj);
    cr_assert(matches(g, "{\"a\": {\"b\": [null, 1e5]}}"));
    cr_assert(!matches(g, "\"just a string\""));
    cr_assert(!matches(g, "{\"a\": 01}"));
    grammar_free(g);
}

Test(grammar, json_schema_refuses_what_it_cannot_enforce) {
    schema_refused("{\"type\":\"string\",\"pattern\":\"^a+$\"}", "unsupported keyword 'pattern'");
    schema_refused("{\"type\":\"integer\",\"minimum\":3}", "unsupported keyword 'minimum'");
    schema_refused("{\"type\":\"date\"}", "unsupported type 'date'");
    schema_refused("{\"$ref\":\"http://x/y\"}", "unsupported $ref");
    schema_refused("{\"$ref\":\"#/$defs/missing\"}", "points at nothing");
    schema_refused("{\"allOf\":[{\"type\":\"string\"}]}", "unsupported keyword 'allOf'");
    schema_refused("{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"b\"]}", "required property 'b'");
    schema_refused("[1]", "must be an object");
    schema_refused("{\"enum\":[\"a\"],\"minLength\":3}", "next to");
    /* found by fuzz_grammar: raw bytes in a value cannot become a grammar literal */
    schema_refused("{\"enum\":[\"a\xff\"]}", "not UTF-8");
    schema_refused("{\"type\":\"object\",\"properties\":{\"\xc3\":{}}}", "not UTF-8");
}

/* An ambiguous grammar (each x may take 0-4 characters in many ways) would make one mask cost
 * seconds: the work budget turns that into COTI_E_RANGE within milliseconds, and greedy then
 * has no answer (-1) rather than one from a partial mask. */
Test(grammar, ambiguous_grammar_mask_is_bounded, .init = open_vocab, .fini = close_vocab, .timeout = 20) {
    struct grammar *g = compile("root ::= x x x x x x x x x x x x x x x x x x x x\nx ::= \"a\"? \"a\"? \"a\"? [a-z]?\n");
    struct grammar_state *st;
    char err[256];
    cr_assert_eq(grammar_state_init(&st, g, err, sizeof err), 0, "%s", err);
    const int32_t n = grammar_vocab_size(g_vocab);
    float *row = malloc(sizeof(float) * (size_t)n);
    for (int32_t i = 0; i < n; i++) row[i] = 0.0f;
    int64_t t0 = coti_time_us();
    cr_assert_eq(grammar_mask(st, g_vocab, row, n), COTI_E_RANGE);
    for (int32_t i = 0; i < n; i++) row[i] = 0.0f;
    row[5] = 1.0f; /* the plain argmax, a token the grammar does not take: the mask runs */
    cr_assert(!grammar_token_ok(st, g_vocab, 5));
    cr_assert_eq(grammar_argmax(st, g_vocab, row, n), -1);
    cr_assert_lt(coti_time_us() - t0, 2000000, "two masks took %ld us", (long)(coti_time_us() - t0));
    free(row);
    grammar_state_free(st);
    grammar_free(g);
}
