/* grammar.h — constrained decoding: GBNF grammars (llama.cpp's syntax) compiled into a
 * pushdown matcher over Unicode code points, and the masks it puts on logits rows.
 *
 * Syntax: rules `name ::= body`, the start rule `root`; a body is alternatives (|) of
 * sequences of string literals "..." (escapes \n \r \t \\ \" \[ \] \- \xHH \uHHHH
 * \UHHHHHHHH), character classes [a-z_] / [^...] (same escapes), `.` (any code point), rule
 * names, groups ( ... ), each optionally repeated with * + ? {m} {m,} {m,n}; `#` comments.
 * A rule may continue over lines; a line `name ::=` starts the next one.
 *
 * The matcher state is a set of stacks of grammar positions (each stack one way the text so far
 * can be continued). Bounded: left recursion is refused when the grammar is compiled, and a
 * state that would hold more than GRAMMAR_MAX_STACKS stacks, or a stack deeper than
 * GRAMMAR_MAX_DEPTH, fails with COTI_E_RANGE rather than growing.
 *
 * Tokens are matched by their bytes (a grammar_vocab holds every token's piece, as a byte trie,
 * built once per tokenizer); a token may end inside a UTF-8 sequence, which the next one then
 * completes. End-of-generation tokens are accepted only where the grammar can end. */
#ifndef COTI_GRAMMAR_H
#define COTI_GRAMMAR_H

#include "common.h"
#include "tokenizer.h"

/* Nesting a match may reach (rules open at once) — JSON 500 levels deep and more. */
#define GRAMMAR_MAX_DEPTH 1024
/* Ways a text may continue at once; an unambiguous grammar needs a handful. */
#define GRAMMAR_MAX_STACKS 1024
/* Work one operation may do (a unit: one stack expanded or compared), so that an ambiguous
 * grammar costs an error rather than seconds of the engine's time: per node of the vocabulary's
 * trie for a mask (a JSON string's mask, nearly every token allowed, takes ~4 units a node:
 * 386k units, 2.5 ms on the 16k vocabulary), and per byte matched. */
#define GRAMMAR_WORK_PER_NODE 64L
#define GRAMMAR_WORK_PER_BYTE (1L << 14)
/* Compiled size caps against hostile grammars (symbols, rules). */
#define GRAMMAR_MAX_SYMBOLS (1 << 20)
#define GRAMMAR_MAX_RULES 16384

struct grammar;          /* compiled, immutable: shared by any number of states */
struct grammar_state;    /* one matcher position, with its scratch */
struct grammar_vocab;    /* the pieces of a vocabulary as a byte trie, immutable */

/* Compile text[0..len). Returns 0 and *out, COTI_E_FORMAT with "line:col: what" in err (syntax,
 * an undefined rule, no root, left recursion, a repetition bound out of range, ...),
 * COTI_E_RANGE (grammar over the size caps), COTI_E_NOMEM. */
int grammar_parse(struct grammar **out, const char *text, size_t len, char *err, size_t err_size);
void grammar_free(struct grammar *g);

/* A state at the start of g (g must outlive it). Returns 0, COTI_E_RANGE (the start already
 * exceeds the caps), COTI_E_NOMEM. */
int grammar_state_init(struct grammar_state **out, const struct grammar *g, char *err, size_t err_size);
void grammar_state_free(struct grammar_state *s);
/* dst takes src's position (both of the same grammar). Returns 0 or COTI_E_NOMEM. */
int grammar_state_copy(struct grammar_state *dst, const struct grammar_state *src);

/* Advance over bytes b[0..n) (a trailing partial UTF-8 sequence is kept for the next call).
 * Returns 0; COTI_E_ARG when the grammar rejects them (s unchanged); COTI_E_RANGE over the
 * caps (s unchanged); COTI_E_NOMEM. */
int grammar_accept_bytes(struct grammar_state *s, const char *b, size_t n);
/* Whether an end-of-generation token was accepted (nothing more will be). */
bool grammar_done(const struct grammar_state *s);
/* Whether the text so far is a complete sentence of the grammar (no partial UTF-8 pending). */
bool grammar_can_end(const struct grammar_state *s);

/* The vocabulary of t for n_vocab logits (ids >= the tokenizer's vocabulary never match).
 * Tokens with an empty piece (control tokens) match nothing, except end-of-generation tokens,
 * which match where the grammar can end. Returns 0, COTI_E_NOMEM. */
int grammar_vocab_init(struct grammar_vocab **out, const struct tokenizer *t, int32_t n_vocab, char *err,
                       size_t err_size);
void grammar_vocab_free(struct grammar_vocab *v);
int32_t grammar_vocab_size(const struct grammar_vocab *v);

/* Whether token id may come next (s unchanged; its scratch is used). */
bool grammar_token_ok(struct grammar_state *s, const struct grammar_vocab *v, int32_t id);
/* Advance s over token id. Returns 0, COTI_E_ARG (rejected; s unchanged), COTI_E_RANGE, COTI_E_NOMEM.
 * After an end-of-generation token nothing more is accepted. */
int grammar_accept_token(struct grammar_state *s, const struct grammar_vocab *v, int32_t id);
/* Set logits[i] = -INFINITY for every i in [0, n) that may not come next. Returns 0,
 * COTI_E_NOMEM, COTI_E_RANGE (the caps or the work budget: every token they stop counts as
 * rejected, so the row is masked too much: not an answer to sample from). */
int grammar_mask(struct grammar_state *s, const struct grammar_vocab *v, float *logits, int32_t n);
/* Greedy under the grammar: the argmax of logits[0..n) among the tokens that may come next
 * (checks the plain argmax first and masks the row, in place, only when it is rejected).
 * Returns the id, or -1 when no token may come next or the mask hit a cap. */
int32_t grammar_argmax(struct grammar_state *s, const struct grammar_vocab *v, float *logits, int32_t n);

#endif
