/* fuzz_tokenize.c — libFuzzer target for the tokenizer on untrusted text, with the shipped
 * models' vocabularies (qwen35's byte-level BPE, gemma4's): tokenizer_encode_opts with the
 * options a request can set (special tokens parsed or not, literal spans of message text, a
 * token limit), then tokenizer_detokenize. Invariants checked: a limit of n gives at most
 * n + 1 tokens, and they are a prefix of the unlimited result; every id is in the vocabulary;
 * for valid UTF-8 encoded without special-token parsing, detokenizing gives the text back
 * (qwen35: byte-level BPE loses nothing). The first input byte picks the vocabulary and the
 * options, the next two the literal span and the limit, the rest is the text. Run from the
 * repository root (it reads models/). Built by `make fuzz`; seeds in fuzz/corpus/tokenize/. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "tokenizer.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const fuzz_models[] = {"models/coti-tiny-qwen35-mtp-q8_0.gguf", "models/coti-tiny-gemma4-q8_0.gguf"};
#define N_FUZZ_TOK 2
static struct gguf_file *fuzz_gguf[N_FUZZ_TOK]; /* open for the run: a tokenizer may point into it */
static struct tokenizer *fuzz_tok[N_FUZZ_TOK];
static size_t fuzz_n_vocab[N_FUZZ_TOK];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    for (int i = 0; i < N_FUZZ_TOK; i++) {
        char err[512] = "";
        if (gguf_open(&fuzz_gguf[i], fuzz_models[i], err, sizeof err) ||
            tokenizer_init(&fuzz_tok[i], fuzz_gguf[i], err, sizeof err)) {
            fprintf(stderr, "fuzz_tokenize: cannot set up on %s: %s\n", fuzz_models[i], err);
            abort();
        }
        fuzz_n_vocab[i] = (size_t)tokenizer_n_vocab(fuzz_tok[i]);
    }
    return 0;
}

/* Whether s[0, n) is UTF-8 that decodes without a replacement: shortest forms, no surrogates,
 * at most U+10FFFF. */
static bool utf8_valid(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint32_t c = s[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!k || i + k > n) return false;
        if (k > 1) c &= 0x3Fu >> (k - 1);
        for (size_t j = 1; j < k; j++) {
            if ((s[i + j] & 0xC0) != 0x80) return false;
            c = (c << 6) | (s[i + j] & 0x3F);
        }
        static const uint32_t min_of[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (c < min_of[k] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return false;
        i += k;
    }
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 3) return 0;
    const int which = data[0] & 1;
    const struct tokenizer *t = fuzz_tok[which];
    const char *text = (const char *)data + 3;
    const size_t len = size - 3;
    struct tokenizer_span span = {len ? data[1] % (len + 1) : 0, 0};
    span.len = len - span.off ? data[2] % (len - span.off + 1) : 0;
    struct tokenizer_opts o = {.add_special = data[0] & 2, .parse_special = data[0] & 4,
                               .literal = &span, .n_literal = (data[0] & 8) ? 1 : 0};
    char err[512] = "";
    int32_t *ids = NULL;
    size_t n = 0;
    if (tokenizer_encode_opts(t, text, len, &o, &ids, &n, err, sizeof err) != 0) {
        if (ids || !err[0]) __builtin_trap();
        return 0;
    }
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (size_t)ids[i] >= fuzz_n_vocab[which]) __builtin_trap();
    /* a limit cuts the same encoding short */
    if (n > 1) {
        struct tokenizer_opts lim = o;
        lim.max_tokens = (data[2] % n) + 1;
        int32_t *cut = NULL;
        size_t n_cut = 0;
        if (tokenizer_encode_opts(t, text, len, &lim, &cut, &n_cut, err, sizeof err) != 0) __builtin_trap();
        if (n_cut > lim.max_tokens + 1 || n_cut > n || memcmp(cut, ids, sizeof(int32_t) * n_cut) != 0) __builtin_trap();
        free(cut);
    }
    char *back = NULL;
    size_t n_back = 0;
    if (tokenizer_detokenize(t, ids, n, false, &back, &n_back, err, sizeof err) != 0) __builtin_trap();
    if (which == 0 && !o.add_special && !o.parse_special && utf8_valid((const uint8_t *)text, len) &&
        (n_back != len || memcmp(back, text, len) != 0))
        __builtin_trap();
    free(back);
    free(ids);
    return 0;
}
