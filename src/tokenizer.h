/* tokenizer.h — byte-level BPE tokenizer built from a GGUF vocabulary
 * (tokenizer.ggml.model = "gpt2" with the qwen2 / qwen35 pre-tokenizers), reproducing
 * llama.cpp's tokenize / token_to_piece. Reference: ../shared/docs/tokenizer.md.
 * A tokenizer is immutable after tokenizer_init: every function below may be called from
 * any number of threads at once. It copies what it needs, so the gguf_file may be closed. */
#ifndef COTI_TOKENIZER_H
#define COTI_TOKENIZER_H

#include "common.h"
#include "gguf.h"

/* Token attributes (llama.cpp's llama_token_attr subset), derived from token_type and
 * the load-time fix-ups of tokenizer.md §2. */
enum tokenizer_attr {
    TOKENIZER_ATTR_UNDEFINED = 0,
    TOKENIZER_ATTR_UNKNOWN = 1 << 0,
    TOKENIZER_ATTR_UNUSED = 1 << 1,
    TOKENIZER_ATTR_NORMAL = 1 << 2,
    TOKENIZER_ATTR_CONTROL = 1 << 3,
    TOKENIZER_ATTR_USER_DEFINED = 1 << 4,
    TOKENIZER_ATTR_BYTE = 1 << 5,
};

struct tokenizer;

/* Build a tokenizer from g's tokenizer.* keys. Returns 0 and *out, or COTI_E_FORMAT
 * (missing/ill-typed keys, token_type shorter than tokens, ...), COTI_E_UNSUPPORTED (a model
 * other than "gpt2", a pre-tokenizer other than the qwen2/qwen35 family), COTI_E_NOMEM. */
int tokenizer_init(struct tokenizer **out, const struct gguf_file *g, char *err, size_t err_size);
void tokenizer_free(struct tokenizer *t);

/* Tokenize text[0..len) (any bytes; NUL is an ordinary byte). add_special: prepend BOS /
 * append EOS where the vocabulary asks for it (add_bos_token / add_eos_token; never for Qwen).
 * parse_special: CONTROL/UNKNOWN token texts in the input become their ids (USER_DEFINED
 * ones always do). Invalid UTF-8 is handled as llama.cpp does: each bad byte becomes U+FFFD
 * (its three bytes are what gets encoded), and over-long or surrogate sequences are taken as
 * the code point they spell. On success *out_tokens is malloc'ed (caller frees; NULL when
 * *n_out == 0). Returns 0, COTI_E_FORMAT for a 4-byte sequence above U+10FFFF (llama.cpp
 * throws there), COTI_E_NOMEM. */
int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, bool add_special,
                     bool parse_special, int32_t **out_tokens, size_t *n_out, char *err, size_t err_size);

/* A range of the input text [off, off + len) (tokenizer_opts.literal). */
struct tokenizer_span {
    size_t off, len;
};

struct tokenizer_opts {
    bool add_special, parse_special;   /* as for tokenizer_encode */
    /* with parse_special: ranges, sorted and disjoint, in which CONTROL/UNKNOWN token texts
     * stay text (a chat message inside a rendered template); a marker overlapping one is
     * text too. USER_DEFINED tokens are found everywhere, as with parse_special off. */
    const struct tokenizer_span *literal;
    size_t n_literal;
    /* 0: no limit. Else encoding stops once more than max_tokens tokens are out: *n_out is
     * then max_tokens + 1 (a prefix of the full result), so the caller sees "too long"
     * without paying for the whole text's tokens. */
    size_t max_tokens;
};

/* tokenizer_encode with the options above; the same results and errors, and COTI_E_ARG for
 * literal spans out of order or outside text[0..len). */
int tokenizer_encode_opts(const struct tokenizer *t, const char *text, size_t len, const struct tokenizer_opts *o,
                          int32_t **out_tokens, size_t *n_out, char *err, size_t err_size);

/* Most input bytes a single token of t can stand for, or 0 when the vocabulary gives no such
 * bound (a byte or a merge result without a token of its own, which tokenize drops). A text of
 * len bytes then yields at least ceil(len / this) tokens: a prompt can be refused as too long
 * for a context before it is tokenized. */
size_t tokenizer_max_input_per_token(const struct tokenizer *t);

/* The bytes of one token, borrowed from t (no NUL terminator; may be partial UTF-8).
 * CONTROL/UNKNOWN tokens give their text only when render_special, otherwise "" (length 0);
 * USER_DEFINED gives its text; NORMAL the byte-decoded text; BYTE its byte; others "".
 * Returns 0, or COTI_E_RANGE for an id outside [0, n_vocab) (then *piece = "", *len = 0). */
int tokenizer_token_to_piece(const struct tokenizer *t, int32_t id, bool render_special,
                             const char **piece, size_t *len);

/* Concatenated pieces of ids[0..n) into a malloc'ed, NUL-terminated *out (length *out_len,
 * which excludes the NUL). Returns 0, COTI_E_RANGE naming the first bad id, COTI_E_NOMEM. */
int tokenizer_detokenize(const struct tokenizer *t, const int32_t *ids, size_t n, bool render_special,
                         char **out, size_t *out_len, char *err, size_t err_size);

int32_t tokenizer_n_vocab(const struct tokenizer *t);
/* Special ids, or -1 when the vocabulary has none. */
int32_t tokenizer_bos(const struct tokenizer *t);
int32_t tokenizer_eos(const struct tokenizer *t);
int32_t tokenizer_eot(const struct tokenizer *t);
bool tokenizer_add_bos(const struct tokenizer *t);
/* End of generation: EOS, EOT, EOM and every token named like one (<|im_end|>,
 * <|endoftext|>, <turn|>, ...), as llama.cpp's special_eog_ids. False for bad ids. */
bool tokenizer_is_eog(const struct tokenizer *t, int32_t id);
/* enum tokenizer_attr bits of id (0 for bad ids). */
unsigned tokenizer_token_attr(const struct tokenizer *t, int32_t id);
/* Id whose stored text is exactly text[0..len) (the last one if several), or -1. */
int32_t tokenizer_find_token(const struct tokenizer *t, const char *text, size_t len);

#endif
