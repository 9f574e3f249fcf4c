/* fuzz_grammar.c — libFuzzer target for GBNF grammars and JSON schemas from requests. The input
 * is grammar text, a NUL, then a text to match. Invariants checked: a refused grammar has a
 * "grammar" message; an accepted one gives a start state; the text fed whole and fed byte by
 * byte (rejected bytes skipped in both) reaches the same verdicts, the same can_end, and a
 * copied state continues like the original; errors are only COTI_E_ARG (rejected) or
 * COTI_E_RANGE (the matcher's caps). When the grammar text is JSON it is also taken as a
 * schema: every grammar the converter emits must compile. Built by `make fuzz`; seeds in
 * fuzz/corpus/grammar/. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"
#include "json_schema.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_schema(const char *text) {
    cJSON *schema = cJSON_Parse(text);
    if (!schema) return;
    char *gbnf = NULL, err[256] = "";
    if (json_schema_to_grammar(schema, &gbnf, err, sizeof err) == 0) {
        struct grammar *g = NULL;
        if (grammar_parse(&g, gbnf, strlen(gbnf), err, sizeof err)) abort(); /* the converter's output always compiles */
        grammar_free(g);
        free(gbnf);
    } else if (gbnf || !err[0]) {
        abort();
    }
    cJSON_Delete(schema);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    const size_t n_g = nul ? (size_t)(nul - data) : size;
    const char *text = nul ? (const char *)nul + 1 : "";
    const size_t n_t = nul ? size - n_g - 1 : 0;
    char *gtext = malloc(n_g + 1);
    if (!gtext) return 0;
    memcpy(gtext, data, n_g);
    gtext[n_g] = 0;
    check_schema(gtext);

    struct grammar *g = NULL;
    char err[256] = "";
    if (grammar_parse(&g, gtext, n_g, err, sizeof err)) {
        if (g || strncmp(err, "grammar", 7)) abort();
        free(gtext);
        return 0;
    }
    struct grammar_state *whole = NULL, *bytes = NULL, *copy = NULL;
    if (grammar_state_init(&whole, g, err, sizeof err)) goto done;
    if (grammar_state_init(&bytes, g, err, sizeof err) || grammar_state_init(&copy, g, err, sizeof err)) abort();
    int rw = grammar_accept_bytes(whole, text, n_t);
    if (rw != 0 && rw != COTI_E_ARG && rw != COTI_E_RANGE) abort();
    /* the work cap is per call and grows with its bytes, so one call over the whole text may
     * hit it where calls of one byte each do not: no verdict to compare then */
    bool all_ok = true, capped = rw == COTI_E_RANGE;
    for (size_t i = 0; i < n_t; i++) {
        if (i == n_t / 2 && grammar_state_copy(copy, bytes)) abort();
        int r = grammar_accept_bytes(bytes, text + i, 1);
        if (r != 0 && r != COTI_E_ARG && r != COTI_E_RANGE) abort();
        capped |= r == COTI_E_RANGE;
        all_ok &= r == 0;
    }
    if (!capped) {
        if ((rw == 0) != all_ok) abort(); /* whole and byte by byte agree */
        if (rw == 0 && grammar_can_end(whole) != grammar_can_end(bytes)) abort();
    }
    /* the copy taken halfway continues exactly like the original did */
    if (n_t && !capped) {
        bool ok2 = true;
        for (size_t i = n_t / 2; i < n_t; i++) ok2 &= grammar_accept_bytes(copy, text + i, 1) == 0;
        if (all_ok && (!ok2 || grammar_can_end(copy) != grammar_can_end(bytes))) abort();
    }
done:
    grammar_state_free(whole);
    grammar_state_free(bytes);
    grammar_state_free(copy);
    grammar_free(g);
    free(gtext);
    return 0;
}
