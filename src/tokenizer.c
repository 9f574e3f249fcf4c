/* tokenizer.c — byte-level BPE (GGUF "gpt2" vocabularies, qwen2/qwen35 pre-tokenizers).
 *
 * Owns: the vocabulary copied out of the GGUF (texts, attributes, special ids, the
 * end-of-generation set), the text->id and merge->rank hash tables, the compiled
 * pre-tokenizer regex and the id->piece cache. Knows nothing of models or chat formats.
 * Behaviour is llama.cpp's (src/llama-vocab.cpp: load, tokenize, tokenizer_st_partition,
 * llm_tokenizer_bpe_session, token_to_piece; src/unicode.cpp: qwen2/qwen35 splitters, the
 * byte table, UTF-8 decoding) as written up in ../shared/docs/tokenizer.md. llama.cpp splits
 * with a hand-written scanner; we run the equivalent regex in PCRE2 with \s spelled out as
 * llama.cpp's whitespace set (PCRE2's \s also matches U+180E). Letter/number classes come
 * from PCRE2's Unicode tables (14.0 for Debian's 10.42), so code points assigned after that
 * may split differently from llama.cpp's newer tables.
 * Thread safety: nothing is written after tokenizer_init; encode allocates its own work
 * buffers and PCRE2 match data per call. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer.h"

#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Ids are int32 and every table index is 32-bit; real vocabularies hold at most ~1M tokens. */
#define TOKENIZER_MAX_VOCAB (1u << 24)
/* Inputs longer than this are refused: 256 MiB is ~60M tokens, far beyond any context,
 * and it keeps every offset into the byte-encoded text (<= 6 bytes per input byte) in 32 bits. */
#define TOKENIZER_MAX_TEXT_BYTES ((size_t)1 << 28)
/* llama.cpp's default BOS/EOS for "gpt2" vocabularies without the keys (tokenizer.md §1). */
#define TOKENIZER_GPT2_DEFAULT_BOS_EOS 11

enum pre_type { PRE_QWEN2, PRE_QWEN35 };

struct merge_rec {           /* one merge "L R": the bytes L||R in merge_blob */
    uint32_t off;
    uint32_t len;            /* |L| + |R| */
    uint32_t split;          /* |L|; 0 marks a line without a usable split (never matches) */
};

struct tokenizer {
    int32_t n_vocab;
    enum pre_type pre;

    char *text_blob;         /* token texts back to back (as stored, with [EMPTY_i] fix) */
    uint32_t *text_off;      /* (n_vocab + 1) */
    uint8_t *attr;           /* (n_vocab) enum tokenizer_attr bits */
    uint8_t *eog;            /* (n_vocab) 1 = end of generation */

    char *piece_blob;        /* token_to_piece(id, special = true) back to back */
    uint32_t *piece_off;     /* (n_vocab + 1) */

    int32_t *text_map;       /* open addressing over text -> id, -1 empty; (text_map_cap) */
    uint32_t text_map_cap;

    char *merge_blob;
    struct merge_rec *merges;    /* (n_merges), index = rank */
    uint32_t n_merges;
    int32_t *merge_map;      /* open addressing over (L, R) -> rank, -1 empty */
    uint32_t merge_map_cap;

    int32_t *special;        /* CONTROL | USER_DEFINED | UNKNOWN ids, longest text first */
    uint32_t n_special;

    int32_t bos, eos, eot, eom, unk, sep, pad, mask;
    int32_t fim_pre, fim_suf, fim_mid, fim_pad, fim_rep, fim_sep;
    bool add_bos, add_eos;

    char byte_enc[256][2];   /* UTF-8 of each byte's GPT-2 stand-in code point */
    uint8_t byte_enc_len[256];
    int16_t cp_to_byte[0x144];   /* inverse for code points below U+0144, -1 if none */

    pcre2_code *re;
    size_t max_input_per_token;  /* 0: the vocabulary gives no bound (tokenizer.h) */
};

/* =======================================================================================
 * Small helpers: hashing, UTF-8 as llama.cpp reads and writes it, the GPT-2 byte table.
 * ===================================================================================== */

static uint64_t hash_bytes(const void *p, size_t n, uint64_t h) {
    const uint8_t *s = p;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 0x100000001b3ull;   /* FNV-1a */
    }
    return h;
}

static uint64_t hash_final(uint64_t h) {
    h ^= h >> 33;                /* FNV's low bits are weak; table indices use them */
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

#define HASH_SEED 0xcbf29ce484222325ull

static uint32_t pow2_at_least(uint64_t n) {
    uint32_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

/* llama.cpp's unicode_cpt_from_utf8 + the U+FFFD fallback of unicode_cpts_from_utf8: a lead
 * byte followed by enough continuation bytes decodes whatever it spells (over-long forms and
 * surrogates included, up to 0x1FFFFF); anything else is one byte of U+FFFD. */
static uint32_t utf8_decode_lenient(const uint8_t *s, size_t n, size_t *adv) {
    const uint8_t b = s[0];
    *adv = 1;
    if (b < 0x80) return b;
    if (!(b & 0x40)) return 0xFFFD;
    if (!(b & 0x20)) {
        if (n < 2 || (s[1] & 0xC0) != 0x80) return 0xFFFD;
        *adv = 2;
        return ((uint32_t)(b & 0x1F) << 6) | (s[1] & 0x3F);
    }
    if (!(b & 0x10)) {
        if (n < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80) return 0xFFFD;
        *adv = 3;
        return ((uint32_t)(b & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    }
    if (!(b & 0x08)) {
        if (n < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80) return 0xFFFD;
        *adv = 4;
        return ((uint32_t)(b & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
               ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
    }
    return 0xFFFD;
}

/* Shortest UTF-8 form of cp <= 0x10FFFF (surrogates encoded like any other BMP code point,
 * as llama.cpp's unicode_cpt_to_utf8 does). Returns the byte count. */
static size_t utf8_encode(uint32_t cp, uint8_t *o) {
    if (cp <= 0x7F) { o[0] = (uint8_t)cp; return 1; }
    if (cp <= 0x7FF) {
        o[0] = (uint8_t)(0xC0 | (cp >> 6));
        o[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp <= 0xFFFF) {
        o[0] = (uint8_t)(0xE0 | (cp >> 12));
        o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | (cp >> 18));
    o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* GPT-2 bytes_to_unicode (tokenizer.md §5): printable Latin-1 bytes stand for themselves,
 * the other 68 take U+0100.. in byte order. */
static void byte_table_build(struct tokenizer *t) {
    uint32_t next = 0x100;
    for (int i = 0; i < 0x144; i++) t->cp_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        const uint32_t cp = printable ? (uint32_t)b : next++;
        uint8_t u[4];
        t->byte_enc_len[b] = (uint8_t)utf8_encode(cp, u);
        memcpy(t->byte_enc[b], u, t->byte_enc_len[b]);
        t->cp_to_byte[cp] = (int16_t)b;
    }
}

/* A growable byte buffer for building pieces at init. */
struct buf {
    char *p;
    size_t n, cap;
};

static bool buf_put(struct buf *b, const void *src, size_t n) {
    if (n > SIZE_MAX - b->n) return false;
    if (!coti_grow(&b->p, &b->cap, b->n + n, 1, 4096)) return false;
    if (n) memcpy(b->p + b->n, src, n);
    b->n += n;
    return true;
}

/* =======================================================================================
 * Vocabulary tables.
 * ===================================================================================== */

static inline const char *tok_text(const struct tokenizer *t, int32_t id, size_t *len) {
    *len = t->text_off[id + 1] - t->text_off[id];
    return t->text_blob + t->text_off[id];
}

int32_t tokenizer_find_token(const struct tokenizer *t, const char *text, size_t len) {
    const uint32_t mask = t->text_map_cap - 1;
    for (uint32_t i = (uint32_t)hash_final(hash_bytes(text, len, HASH_SEED)) & mask;; i = (i + 1) & mask) {
        const int32_t id = t->text_map[i];
        if (id < 0) return -1;
        size_t n;
        const char *s = tok_text(t, id, &n);
        if (n == len && memcmp(s, text, len) == 0) return id;
    }
}

/* Later ids overwrite earlier ones with the same text, as llama.cpp's token_to_id[word] = i. */
static void text_map_insert(struct tokenizer *t, int32_t id) {
    size_t len;
    const char *text = tok_text(t, id, &len);
    const uint32_t mask = t->text_map_cap - 1;
    for (uint32_t i = (uint32_t)hash_final(hash_bytes(text, len, HASH_SEED)) & mask;; i = (i + 1) & mask) {
        const int32_t cur = t->text_map[i];
        if (cur < 0) { t->text_map[i] = id; return; }
        size_t n;
        const char *s = tok_text(t, cur, &n);
        if (n == len && memcmp(s, text, len) == 0) { t->text_map[i] = id; return; }
    }
}

static int32_t find_cstr(const struct tokenizer *t, const char *s) {
    return tokenizer_find_token(t, s, strlen(s));
}

/* Rank of merging the adjacent symbols s[0..split) and s[split..len), or -1. */
static int32_t merge_rank(const struct tokenizer *t, const char *s, uint32_t split, uint32_t len) {
    const uint32_t mask = t->merge_map_cap - 1;
    const uint64_t h = hash_final(hash_bytes(s, len, HASH_SEED) ^ split);
    for (uint32_t i = (uint32_t)h & mask;; i = (i + 1) & mask) {
        const int32_t r = t->merge_map[i];
        if (r < 0) return -1;
        const struct merge_rec *m = &t->merges[r];
        if (m->len == len && m->split == split && memcmp(t->merge_blob + m->off, s, len) == 0) return r;
    }
}

/* The first (lowest) rank of a duplicated pair wins, as with llama.cpp's bpe_ranks.emplace. */
static void merge_map_insert(struct tokenizer *t, int32_t rank) {
    const struct merge_rec *m = &t->merges[rank];
    const char *s = t->merge_blob + m->off;
    const uint32_t mask = t->merge_map_cap - 1;
    const uint64_t h = hash_final(hash_bytes(s, m->len, HASH_SEED) ^ m->split);
    for (uint32_t i = (uint32_t)h & mask;; i = (i + 1) & mask) {
        const int32_t r = t->merge_map[i];
        if (r < 0) { t->merge_map[i] = rank; return; }
        const struct merge_rec *o = &t->merges[r];
        if (o->len == m->len && o->split == m->split && memcmp(t->merge_blob + o->off, s, m->len) == 0) return;
    }
}

/* =======================================================================================
 * Loading.
 * ===================================================================================== */

static const struct gguf_kv *find_str_array(const struct gguf_file *g, const char *key, bool required,
                                            int *rc, char *err, size_t err_size) {
    const struct gguf_kv *kv = gguf_find_kv(g, key);
    *rc = 0;
    if (!kv) {
        if (required) *rc = coti_fail(err, err_size, COTI_E_FORMAT, "tokenizer: key '%s' is missing", key);
        return NULL;
    }
    if (kv->type != GGUF_TYPE_ARRAY || kv->arr_type != GGUF_TYPE_STRING) {
        *rc = coti_fail(err, err_size, COTI_E_FORMAT, "tokenizer: key '%s' must be an array of strings", key);
        return NULL;
    }
    return kv;
}

static int load_tokens(struct tokenizer *t, const struct gguf_file *g, char *err, size_t err_size) {
    int rc;
    const struct gguf_kv *kv = find_str_array(g, "tokenizer.ggml.tokens", true, &rc, err, err_size);
    if (!kv) return rc;
    if (kv->n == 0 || kv->n > TOKENIZER_MAX_VOCAB)
        return coti_fail(err, err_size, COTI_E_FORMAT, "tokenizer: %llu tokens, must be in [1, %u]",
                         (unsigned long long)kv->n, TOKENIZER_MAX_VOCAB);
    t->n_vocab = (int32_t)kv->n;
    const uint32_t n = (uint32_t)kv->n;

    t->text_off = malloc(((size_t)n + 1) * sizeof(*t->text_off));
    t->attr = calloc(n, 1);
    t->eog = calloc(n, 1);
    if (!t->text_off || !t->attr || !t->eog) return coti_fail(err, err_size, COTI_E_NOMEM, "tokenizer: out of memory");

    /* Texts are read up to their first NUL, as llama.cpp's gguf_get_arr_str; an empty one
     * becomes "[EMPTY_<id>]". */
    struct buf b = {0};
    for (uint32_t i = 0; i < n; i++) {
        t->text_off[i] = (uint32_t)b.n;
        const char *s = kv->arr_str[i];
        size_t len = strlen(s);
        char tmp[32];
        if (len == 0) {
            len = (size_t)snprintf(tmp, sizeof tmp, "[EMPTY_%u]", i);
            s = tmp;
        }
        if (!buf_put(&b, s, len) || b.n > UINT32_MAX) {
            free(b.p);
            return coti_fail(err, err_size, COTI_E_NOMEM, "tokenizer: token texts too large");
        }
    }
    t->text_off[n] = (uint32_t)b.n;
    t->text_blob = b.p ? b.p : malloc(1);
    if (!t->text_blob) return coti_fail(err, err_size, COTI_E_NOMEM, "tokenizer: out of memory");

    t->text_map_cap = pow2_at_least(2ull * n);
    t->text_map = malloc((size_t)t->text_map_cap * sizeof(*t->text_map));
    if (!t->text_map) return coti_fail(err, err_size, COTI_E_NOMEM, "tokenizer: out of memory");
    memset(t->text_map, 0xFF, (size_t)t->text_map_cap * sizeof(*t->text_map));
    for (uint32_t i = 0; i < n; i++) text_map_insert(t, (int32_t)i);

    /* token_type: 1 NORMAL 2 UNKNOWN 3 CONTROL 4 USER_DEFINED 5 UNUSED 6 BYTE; missing -> NORMAL */
    size_t n_types = 0;
    rc = gguf_get_arr_i32(g, "tokenizer.ggml.token_type", NULL, 0, &n_types, err, err_size);
    if (rc == COTI_E_ARG) {
        memset(t->attr, TOKENIZER_ATTR_NORMAL, n);
        return COTI_OK;
    }
    if (rc) return rc;
    if (n_types < n)
        return coti_fail(err, err_size, COTI_E_FORMAT, "tokenizer: token_type has %zu entries for %u tokens",
                         n_types, n);
    int32_t *types = malloc(n_types * sizeof(*types));
    if (!types) return coti_fail(err, err_size, COTI_E_NOMEM, "tokenizer: out of memory");
    rc = gguf_get_arr_i32(g, "tokenizer.ggml.token_type", types, n_types, &n_types, err, err_size);
    if (rc) {
        free(types);
        return rc;
    }
    static const uint8_t type_attr[7] = {
        TOKENIZER_ATTR_UNDEFINED, TOKENIZER_ATTR_NORMAL, TOKENIZER_ATTR_UNKNOWN, TOKENIZER_ATTR_CONTROL,
        TOKENIZER_ATTR_USER_DEFINED, TOKENIZER_ATTR_UNUSED, TOKENIZER_ATTR_BYTE,
    };
    for (uint32_t i = 0; i < n; i++)
        t->attr[i] = types[i] >= 0 && types[i] <= 6 ? type_attr[types[i]] : TOKENIZER_ATTR_UNDEFINED;
    free(types);
    return COTI_OK;
}

static int load_merges(struct tokenizer *t, const struct gguf_file *g, char *err, size_t err_size) {
    int rc;
    const struct gguf_kv *kv = find_str_array(g, "tokenizer.ggml.merges", true, &rc, err, err_size);
    if (!kv) return rc;
    if (kv->n > INT32_MAX)
        return coti_fail(err, err_size, COTI_E_FORMAT, "tokenizer: %llu merges, at most %d allowed",
                         (unsigned long long)kv->n, INT32_MAX);
    const uint32_t n = (uint32_t)kv->n;
    t->n_merges = n;
    t->merges = calloc(n ? n : 1, sizeof(*t->merges));
    if (!t->merges) return coti_fail(err, err_size, COTI_E_NOMEM, "tokenizer: out of memory");
    struct buf b = {0};
    for (uint32_t i = 0; i < n; i++) {
        const char *s = kv->arr_str[i];
        const size_t len = strlen(s);
        /* split at the first space at index >= 1 (llama.cpp: word.find(' ', 1)) */
        const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
        struct merge_rec *m = &t->merges[i];
        m->off = (uint32_t)b.n;
        if (!sp) continue;       /* llama.cpp stores ("", "") here, which no symbol pair equals */
        const size_t split = (size_t)(sp - s);
        if (!buf_put(&b, s, split) || !buf_put(&b, sp + 1, len - split - 1) || b.n > UINT32_MAX) {
            free(b.p);
            return coti_fail(err, err_size, COTI_E_NOMEM, "tokenizer: merges too large");
        }
        m->split = (uint32_t)split;
        m->len = (uint32_t)(len - 1);
    }
    t->merge_blob = b.p ? b.p : malloc(1);
    if (!t->merge_blob) return coti_fail(err, err_size, COTI_E_NOMEM, "tokenizer: out of memory");

    t->merge_map_cap = pow2_at_least(2ull * n);
    t->merge_map = malloc((size_t)t->merge_map_cap * sizeof(*t->merge_map));
    if (!t->merge_map) return coti_fail(err, err_size, COTI_E_NOMEM, "tokenizer: out of memory");
    memset(t->merge_map, 0xFF, (size_t)t->merge_map_cap * sizeof(*t->merge_map));
    for (uint32_t i = 0; i < n; i++)
        if (t->merges[i].split) merge_map_insert(t, (int32_t)i);
    return COTI_OK;
}

/* Special ids from metadata; an id >= n_vocab is ignored (the default stays), as llama.cpp. */
static int load_special_ids(struct tokenizer *t, const struct gguf_file *g, char *err, size_t err_size) {
    const struct { const char *key; int32_t *id; } keys[] = {
        {"tokenizer.ggml.bos_token_id", &t->bos},       {"tokenizer.ggml.eos_token_id", &t->eos},
        {"tokenizer.ggml.eot_token_id", &t->eot},       {"tokenizer.ggml.eom_token_id", &t->eom},
        {"tokenizer.ggml.unknown_token_id", &t->unk},   {"tokenizer.ggml.seperator_token_id", &t->sep},
        {"tokenizer.ggml.padding_token_id", &t->pad},   {"tokenizer.ggml.mask_token_id", &t->mask},
        {"tokenizer.ggml.fim_pre_token_id", &t->fim_pre}, {"tokenizer.ggml.fim_suf_token_id", &t->fim_suf},
        {"tokenizer.ggml.fim_mid_token_id", &t->fim_mid}, {"tokenizer.ggml.fim_pad_token_id", &t->fim_pad},
        {"tokenizer.ggml.fim_rep_token_id", &t->fim_rep}, {"tokenizer.ggml.fim_sep_token_id", &t->fim_sep},
        {"tokenizer.ggml.prefix_token_id", &t->fim_pre}, {"tokenizer.ggml.suffix_token_id", &t->fim_suf},
        {"tokenizer.ggml.middle_token_id", &t->fim_mid},
    };
    t->bos = t->eos = TOKENIZER_GPT2_DEFAULT_BOS_EOS;
    t->eot = t->eom = t->unk = t->sep = t->pad = t->mask = -1;
    t->fim_pre = t->fim_suf = t->fim_mid = t->fim_pad = t->fim_rep = t->fim_sep = -1;
    for (size_t i = 0; i < COTI_ARRAY_LEN(keys); i++) {
        if (*keys[i].id >= t->n_vocab) *keys[i].id = -1;
        uint32_t v;
        int rc = gguf_get_u32(g, keys[i].key, &v, err, err_size);
        if (rc == COTI_E_ARG) continue;
        if (rc) return rc;
        if (v >= (uint32_t)t->n_vocab)
            coti_log(COTI_LOG_WARN, "tokenizer", "%s = %u is outside the vocabulary of %d, ignored",
                     keys[i].key, v, (int)t->n_vocab);
        else
            *keys[i].id = (int32_t)v;
    }
    const struct { const char *key; bool *v; } flags[] = {
        {"tokenizer.ggml.add_bos_token", &t->add_bos}, {"tokenizer.ggml.add_eos_token", &t->add_eos},
    };
    for (size_t i = 0; i < COTI_ARRAY_LEN(flags); i++) {
        int rc = gguf_get_bool(g, flags[i].key, flags[i].v, err, err_size);
        if (rc && rc != COTI_E_ARG) return rc;
    }
    if (t->add_bos && t->bos < 0)
        return coti_fail(err, err_size, COTI_E_FORMAT, "tokenizer: add_bos_token is set but there is no BOS id");
    if (t->add_eos && t->eos < 0)
        return coti_fail(err, err_size, COTI_E_FORMAT, "tokenizer: add_eos_token is set but there is no EOS id");
    return COTI_OK;
}

/* llama.cpp's text-based fix-ups (tokenizer.md §2): detect EOT/EOM/FIM ids by name when
 * metadata gave none (forcing them CONTROL), mark CONTROL "unused" tokens UNUSED, and build
 * the end-of-generation set. llama.cpp scans an unordered_map, so when several names match
 * its choice is unspecified; we take the first name in its list that exists. Only the id a
 * text maps to (the last one with that text) is considered, as in llama.cpp. */
static void detect_special_tokens(struct tokenizer *t) {
    static const char *const eot_names[] = {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
        "<EOT>", "_<EOT>", "[EOT]", "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>",
        "<end_of_utterance>", NULL};
    static const char *const eom_names[] = {"<|eom_id|>", NULL};
    static const char *const fim_pre_names[] = {
        "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>",
        "<PRE>", "\xe2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>", NULL};
    static const char *const fim_suf_names[] = {
        "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "hole\xef\xbd\x9c>",
        "<SUF>", "\xe2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>", NULL};
    static const char *const fim_mid_names[] = {
        "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>",
        "<MID>", "\xe2\x96\x81<MID>", "<|code_middle|>", "<|middle|>", NULL};
    static const char *const fim_pad_names[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL};
    static const char *const fim_rep_names[] = {
        "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", NULL};
    static const char *const fim_sep_names[] = {"<|file_sep|>", NULL};
    static const char *const eog_names[] = {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
        "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
        "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
        "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>", "[e~[", NULL};
    const struct { int32_t *id; const char *const *names; } detect[] = {
        {&t->eot, eot_names}, {&t->eom, eom_names}, {&t->fim_pre, fim_pre_names}, {&t->fim_suf, fim_suf_names},
        {&t->fim_mid, fim_mid_names}, {&t->fim_pad, fim_pad_names}, {&t->fim_rep, fim_rep_names},
        {&t->fim_sep, fim_sep_names},
    };
    for (size_t d = 0; d < COTI_ARRAY_LEN(detect); d++) {
        if (*detect[d].id >= 0) continue;
        for (const char *const *nm = detect[d].names; *nm; nm++) {
            const int32_t id = find_cstr(t, *nm);
            if (id >= 0) {
                *detect[d].id = id;
                t->attr[id] |= TOKENIZER_ATTR_CONTROL;
                break;
            }
        }
    }

    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (!(t->attr[id] & TOKENIZER_ATTR_CONTROL)) continue;
        size_t len;
        const char *s = tok_text(t, id, &len);
        if (tokenizer_find_token(t, s, len) != id) continue;
        if (memmem(s, len, "unused", 6)) t->attr[id] |= TOKENIZER_ATTR_UNUSED;
    }

    if (t->fim_pad >= 0) t->eog[t->fim_pad] = 1;
    if (t->fim_rep >= 0) t->eog[t->fim_rep] = 1;
    if (t->fim_sep >= 0) t->eog[t->fim_sep] = 1;
    for (const char *const *nm = eog_names; *nm; nm++) {
        const int32_t id = find_cstr(t, *nm);
        if (id < 0) continue;
        t->eog[id] = 1;
        t->attr[id] |= TOKENIZER_ATTR_CONTROL;
    }
    /* gpt-oss: these markers always render */
    static const char *const user_defined_names[] = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", NULL};
    for (const char *const *nm = user_defined_names; *nm; nm++) {
        const int32_t id = find_cstr(t, *nm);
        if (id >= 0) t->attr[id] = TOKENIZER_ATTR_USER_DEFINED;
    }
    if (t->eos >= 0) t->eog[t->eos] = 1;
    if (t->eot >= 0) t->eog[t->eot] = 1;
    if (t->eom >= 0) t->eog[t->eom] = 1;

    /* o200k_harmony / solar-open: <|end|> is not an end of generation there */
    const int32_t end_id = find_cstr(t, "<|end|>"), ret_id = find_cstr(t, "<|return|>");
    const int32_t call_id = find_cstr(t, "<|call|>"), calls_id = find_cstr(t, "<|calls|>");
    const int32_t flush_id = find_cstr(t, "<|flush|>");
    const bool has_end = end_id >= 0 && t->eog[end_id];
    const bool has_return = ret_id >= 0 && t->eog[ret_id];
    const bool has_call = (call_id >= 0 && t->eog[call_id]) || (calls_id >= 0 && t->eog[calls_id]);
    const bool has_flush = flush_id >= 0 && t->eog[flush_id];
    if ((has_return && has_call && has_end) || (has_call && has_flush && has_end)) {
        t->eog[end_id] = 0;
        t->attr[end_id] = TOKENIZER_ATTR_USER_DEFINED;
    }
    /* gemma4 / paddleocr: </s> is not an end of generation when <|tool_response> is */
    const int32_t tr_id = find_cstr(t, "<|tool_response>"), s_id = find_cstr(t, "</s>");
    if (tr_id >= 0 && t->eog[tr_id] && s_id >= 0 && t->eog[s_id]) {
        t->eog[s_id] = 0;
        t->attr[s_id] = TOKENIZER_ATTR_NORMAL;
    }
}

static int special_cmp(const void *a, const void *b, void *ctx) {
    const struct tokenizer *t = ctx;
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    const uint32_t lx = t->text_off[x + 1] - t->text_off[x], ly = t->text_off[y + 1] - t->text_off[y];
    if (lx != ly) return lx > ly ? -1 : 1;
    return (x > y) - (x < y);    /* llama.cpp leaves equal lengths unordered; we pick id order */
}

static int build_special_list(struct tokenizer *t, char *err, size_t err_size) {
    uint32_t n = 0;
    for (int32_t id = 0; id < t->n_vocab; id++)
        n += (t->attr[id] & (TOKENIZER_ATTR_CONTROL | TOKENIZER_ATTR_USER_DEFINED | TOKENIZER_ATTR_UNKNOWN)) != 0;
    t->special = malloc((n ? n : 1) * sizeof(*t->special));
    if (!t->special) return coti_fail(err, err_size, COTI_E_NOMEM, "tokenizer: out of memory");
    t->n_special = 0;
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (t->attr[id] & (TOKENIZER_ATTR_CONTROL | TOKENIZER_ATTR_USER_DEFINED | TOKENIZER_ATTR_UNKNOWN))
            t->special[t->n_special++] = id;
    qsort_r(t->special, t->n_special, sizeof(*t->special), special_cmp, t);
    return COTI_OK;
}

/* Text of one token for token_to_piece(special = true) (tokenizer.md §7), appended to b. */
static int piece_build(const struct tokenizer *t, int32_t id, struct buf *b, char *err, size_t err_size) {
    size_t len;
    const char *s = tok_text(t, id, &len);
    const unsigned a = t->attr[id];
    if (a & (TOKENIZER_ATTR_UNKNOWN | TOKENIZER_ATTR_CONTROL | TOKENIZER_ATTR_USER_DEFINED))
        return buf_put(b, s, len) ? COTI_OK : COTI_E_NOMEM;
    if (a & TOKENIZER_ATTR_NORMAL) {
        /* each code point of the stored text is one byte's stand-in */
        const uint8_t *u = (const uint8_t *)s;
        for (size_t i = 0; i < len;) {
            size_t adv;
            const uint32_t cp = utf8_decode_lenient(u + i, len - i, &adv);
            i += adv;
            if (cp > 0x10FFFF)   /* llama.cpp throws while building its cache: load fails */
                return coti_fail(err, err_size, COTI_E_FORMAT,
                                 "tokenizer: token %d text holds a code point above U+10FFFF", (int)id);
            if (cp < 0x144 && t->cp_to_byte[cp] >= 0) {
                const char c = (char)t->cp_to_byte[cp];
                if (!buf_put(b, &c, 1)) return COTI_E_NOMEM;
                continue;
            }
            /* llama_decode_text's marker: "[UNK_BYTE_0x" + hex of the code point's UTF-8
             * + the whole token text + "]" */
            uint8_t e[4];
            const size_t ne = utf8_encode(cp, e);
            char hex[32];
            int nh = snprintf(hex, sizeof hex, "[UNK_BYTE_0x");
            for (size_t k = 0; k < ne; k++) nh += snprintf(hex + nh, sizeof hex - (size_t)nh, "%02x", e[k]);
            if (!buf_put(b, hex, (size_t)nh) || !buf_put(b, s, len) || !buf_put(b, "]", 1)) return COTI_E_NOMEM;
        }
        return COTI_OK;
    }
    if (a & TOKENIZER_ATTR_BYTE) {
        /* llama.cpp: strtol(text.substr(3, 2), 16) */
        if (len < 3)
            return coti_fail(err, err_size, COTI_E_FORMAT, "tokenizer: BYTE token %d text is shorter than \"<0x\"",
                             (int)id);
        char hex[3] = {0};
        memcpy(hex, s + 3, len - 3 < 2 ? len - 3 : 2);
        const char c = (char)strtol(hex, NULL, 16);
        return buf_put(b, &c, 1) ? COTI_OK : COTI_E_NOMEM;
    }
    return COTI_OK;              /* UNUSED / UNDEFINED: empty */
}

static int build_pieces(struct tokenizer *t, char *err, size_t err_size) {
    t->piece_off = malloc(((size_t)t->n_vocab + 1) * sizeof(*t->piece_off));
    if (!t->piece_off) return coti_fail(err, err_size, COTI_E_NOMEM, "tokenizer: out of memory");
    struct buf b = {0};
    for (int32_t id = 0; id < t->n_vocab; id++) {
        t->piece_off[id] = (uint32_t)b.n;
        int rc = piece_build(t, id, &b, err, err_size);
        if (rc == COTI_OK && b.n > UINT32_MAX) rc = COTI_E_NOMEM;
        if (rc) {
            free(b.p);
            return rc == COTI_E_NOMEM ? coti_fail(err, err_size, rc, "tokenizer: out of memory for pieces") : rc;
        }
    }
    t->piece_off[t->n_vocab] = (uint32_t)b.n;
    t->piece_blob = b.p ? b.p : malloc(1);
    if (!t->piece_blob) return coti_fail(err, err_size, COTI_E_NOMEM, "tokenizer: out of memory");
    return COTI_OK;
}

/* The pre-tokenizer regexes of tokenizer.md §4 with \s / \S written as llama.cpp's
 * whitespace set and (?i:...) expanded to case pairs, as llama.cpp does. */
#define WS "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
#define CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define WS_TAIL "|[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+"
static const char RE_QWEN2[] =
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*" WS_TAIL;
static const char RE_QWEN35[] =
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^" WS "\\p{L}\\p{M}\\p{N}]+[\\r\\n]*" WS_TAIL;

static int compile_regex(struct tokenizer *t, char *err, size_t err_size) {
    const char *pat = t->pre == PRE_QWEN35 ? RE_QWEN35 : RE_QWEN2;
    int ec;
    PCRE2_SIZE eo;
    /* anchored at compile time: JIT ignores PCRE2_ANCHORED given at match time */
    t->re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &ec,
                          &eo, NULL);
    if (!t->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return coti_fail(err, err_size, COTI_E_UNSUPPORTED, "tokenizer: regex compile failed at %zu: %s",
                         (size_t)eo, (const char *)msg);
    }
    /* JIT is an optimization only: the interpreter gives the same matches */
    (void)pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE);
    return COTI_OK;
}

void tokenizer_free(struct tokenizer *t) {
    if (!t) return;
    free(t->text_blob);
    free(t->text_off);
    free(t->attr);
    free(t->eog);
    free(t->piece_blob);
    free(t->piece_off);
    free(t->text_map);
    free(t->merge_blob);
    free(t->merges);
    free(t->merge_map);
    free(t->special);
    if (t->re) pcre2_code_free(t->re);
    free(t);
}

/* Most input bytes one token can stand for. Special tokens stand for their text. A BPE
 * token stands for a symbol whose bytes are its stored text; each of those is at least one
 * stand-in (1-2 bytes) per re-encoded byte, and a re-encoded code point of >= 1 byte comes
 * from at most 4 input bytes (over-long forms), so 4 x the longest stored text bounds
 * every token. That holds only if no input byte can vanish: every byte's stand-in and every
 * merge's result must be a token (else llama.cpp's fallback drops bytes); 0 otherwise. */
static size_t input_bound(const struct tokenizer *t) {
    for (int b = 0; b < 256; b++)
        if (tokenizer_find_token(t, t->byte_enc[b], t->byte_enc_len[b]) < 0) return 0;
    for (uint32_t i = 0; i < t->n_merges; i++) {
        const struct merge_rec *m = &t->merges[i];
        if (m->split && tokenizer_find_token(t, t->merge_blob + m->off, m->len) < 0) return 0;
    }
    size_t longest = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) longest = COTI_MAX(longest, (size_t)(t->text_off[id + 1] - t->text_off[id]));
    return 4 * longest;
}

size_t tokenizer_max_input_per_token(const struct tokenizer *t) { return t->max_input_per_token; }

int tokenizer_init(struct tokenizer **out, const struct gguf_file *g, char *err, size_t err_size) {
    *out = NULL;
    const char *model = NULL, *pre = NULL;
    int rc = gguf_get_str(g, "tokenizer.ggml.model", &model, err, err_size);
    if (rc == COTI_E_ARG) return coti_fail(err, err_size, COTI_E_FORMAT, "tokenizer: key 'tokenizer.ggml.model' is missing");
    if (rc) return rc;
    if (strcmp(model, "gpt2") != 0)
        return coti_fail(err, err_size, COTI_E_UNSUPPORTED, "tokenizer: model '%.64s' is not supported (only \"gpt2\")", model);
    rc = gguf_get_str(g, "tokenizer.ggml.pre", &pre, err, err_size);
    if (rc == COTI_E_ARG)
        return coti_fail(err, err_size, COTI_E_UNSUPPORTED, "tokenizer: no tokenizer.ggml.pre; only the qwen2/qwen35 pre-tokenizers are supported");
    if (rc) return rc;
    enum pre_type pt;
    if (!strcmp(pre, "qwen35"))
        pt = PRE_QWEN35;
    else if (!strcmp(pre, "qwen2") || !strcmp(pre, "deepseek-r1-qwen") || !strcmp(pre, "kormo") ||
             !strcmp(pre, "f2llmv2") || !strcmp(pre, "megrez"))
        pt = PRE_QWEN2;
    else
        return coti_fail(err, err_size, COTI_E_UNSUPPORTED,
                         "tokenizer: pre-tokenizer '%.64s' is not supported (qwen2 family or qwen35)", pre);

    struct tokenizer *t = calloc(1, sizeof(*t));
    if (!t) return coti_fail(err, err_size, COTI_E_NOMEM, "tokenizer: out of memory");
    t->pre = pt;
    byte_table_build(t);
    if ((rc = load_tokens(t, g, err, err_size)) || (rc = load_merges(t, g, err, err_size)) ||
        (rc = load_special_ids(t, g, err, err_size))) {
        tokenizer_free(t);
        return rc;
    }
    detect_special_tokens(t);
    if ((rc = build_special_list(t, err, err_size)) || (rc = build_pieces(t, err, err_size)) ||
        (rc = compile_regex(t, err, err_size))) {
        tokenizer_free(t);
        return rc;
    }
    t->max_input_per_token = input_bound(t);
    *out = t;
    return COTI_OK;
}

/* =======================================================================================
 * Encoding.
 * ===================================================================================== */

struct ids {
    int32_t *p;
    size_t n, cap;
};

static bool ids_push(struct ids *v, int32_t id) {
    if (!coti_grow(&v->p, &v->cap, v->n + 1, sizeof(*v->p), 64)) return false;
    v->p[v->n++] = id;
    return true;
}

/* A fragment of the input: raw text [off, off+len) when id < 0, else a special token. */
struct frag {
    int32_t id;
    size_t off, len;
};

struct frags {
    struct frag *p;
    size_t n, cap;
};

static bool frags_push(struct frags *v, int32_t id, size_t off, size_t len) {
    if (!coti_grow(&v->p, &v->cap, v->n + 1, sizeof(*v->p), 16)) return false;
    v->p[v->n++] = (struct frag){id, off, len};
    return true;
}

/* BPE work space, grown as pieces need it and reused across the pieces of one call. */
struct bpe_sym {
    uint32_t start, n;           /* bytes of the byte-encoded piece; n == 0: merged away */
    int32_t prev, next;
};

struct bpe_pair {
    int32_t rank, left, right;
    uint32_t size;               /* n(left) + n(right) when pushed: detects stale entries */
};

struct work {
    uint32_t *cps;               /* code points of the fragment */
    uint32_t *soff;              /* byte offset of each code point in subj, plus the end */
    uint8_t *subj;               /* the fragment as valid UTF-8 for PCRE2 */
    char *enc;                   /* byte-level encoding of the current piece */
    size_t enc_cap;
    struct bpe_sym *sym;
    size_t sym_cap;
    struct bpe_pair *heap;
    size_t heap_n, heap_cap;
    pcre2_match_data *md;
};


static inline bool pair_before(const struct bpe_pair *a, const struct bpe_pair *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static bool heap_push(struct work *w, struct bpe_pair p) {
    if (!coti_grow(&w->heap, &w->heap_cap, w->heap_n + 1, sizeof(*w->heap), 64)) return false;
    size_t i = w->heap_n++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!pair_before(&p, &w->heap[up])) break;
        w->heap[i] = w->heap[up];
        i = up;
    }
    w->heap[i] = p;
    return true;
}

static struct bpe_pair heap_pop(struct work *w) {
    struct bpe_pair top = w->heap[0];
    struct bpe_pair last = w->heap[--w->heap_n];
    size_t i = 0, n = w->heap_n;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const struct bpe_pair *best = &last;
        if (l < n && pair_before(&w->heap[l], best)) { m = l; best = &w->heap[l]; }
        if (r < n && pair_before(&w->heap[r], best)) { m = r; }
        if (m == i) break;
        w->heap[i] = w->heap[m];
        i = m;
    }
    if (n) w->heap[i] = last;
    return top;
}

static bool bpe_try_pair(const struct tokenizer *t, struct work *w, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return true;
    const struct bpe_sym *l = &w->sym[left], *r = &w->sym[right];
    const int32_t rank = merge_rank(t, w->enc + l->start, l->n, l->n + r->n);
    if (rank < 0) return true;
    return heap_push(w, (struct bpe_pair){rank, left, right, l->n + r->n});
}

/* BPE over the byte-encoded piece w->enc[0..len) (tokenizer.md §6), ids appended to out. */
static int bpe_piece(const struct tokenizer *t, struct work *w, size_t len, struct ids *out) {
    /* initial symbols: the UTF-8 characters of the encoded piece (one per input byte) */
    if (!coti_grow(&w->sym, &w->sym_cap, len, sizeof(*w->sym), 64)) return COTI_E_NOMEM;
    int32_t n_sym = 0;
    for (size_t off = 0; off < len;) {
        const uint8_t b = (uint8_t)w->enc[off];
        const uint32_t cl = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4; /* stand-ins are 1 or 2 */
        w->sym[n_sym] = (struct bpe_sym){(uint32_t)off, cl, n_sym - 1, -1};
        if (n_sym > 0) w->sym[n_sym - 1].next = n_sym;
        n_sym++;
        off += cl;
    }
    w->heap_n = 0;
    for (int32_t i = 1; i < n_sym; i++)
        if (!bpe_try_pair(t, w, i - 1, i)) return COTI_E_NOMEM;
    while (w->heap_n) {
        const struct bpe_pair p = heap_pop(w);
        struct bpe_sym *l = &w->sym[p.left], *r = &w->sym[p.right];
        /* symbols only grow, so equal sizes mean the pair's text is unchanged */
        if (l->n == 0 || r->n == 0 || l->n + r->n != p.size) continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) w->sym[r->next].prev = p.left;
        if (!bpe_try_pair(t, w, l->prev, p.left) || !bpe_try_pair(t, w, p.left, l->next)) return COTI_E_NOMEM;
    }
    for (int32_t i = 0; i >= 0 && i < n_sym; i = w->sym[i].next) {
        const struct bpe_sym *s = &w->sym[i];
        const int32_t id = tokenizer_find_token(t, w->enc + s->start, s->n);
        if (id >= 0) {
            if (!ids_push(out, id)) return COTI_E_NOMEM;
            continue;
        }
        /* defective vocabulary: each byte of the encoded symbol as a one-byte token text,
         * dropping those that do not exist (llama.cpp's fallback) */
        for (uint32_t k = 0; k < s->n; k++) {
            const int32_t bid = tokenizer_find_token(t, w->enc + s->start + k, 1);
            if (bid >= 0 && !ids_push(out, bid)) return COTI_E_NOMEM;
        }
    }
    return COTI_OK;
}

/* Pre-tokenize one raw fragment with the regex and BPE each piece. */
static int encode_fragment(const struct tokenizer *t, struct work *w, const uint8_t *s, size_t len,
                           size_t base, size_t max_tokens, struct ids *out, char *err, size_t err_size) {
    /* decode as llama.cpp; build the PCRE2 subject (surrogates cannot be matched as UTF-8,
     * so they stand in as U+E000: both are \p{C}, which is all the regex asks of them) */
    size_t n = 0, sb = 0;
    for (size_t i = 0; i < len;) {
        size_t adv;
        uint32_t cp = utf8_decode_lenient(s + i, len - i, &adv);
        if (cp > 0x10FFFF)
            return coti_fail(err, err_size, COTI_E_FORMAT,
                             "tokenizer: invalid UTF-8 at byte %zu: code point U+%X is above U+10FFFF", base + i,
                             (unsigned)cp);
        i += adv;
        w->cps[n] = cp;
        w->soff[n++] = (uint32_t)sb;
        sb += utf8_encode(cp >= 0xD800 && cp <= 0xDFFF ? 0xE000 : cp, w->subj + sb);
    }
    w->soff[n] = (uint32_t)sb;

    size_t pos = 0;              /* code point index */
    while (pos < n && out->n <= max_tokens) {
        /* the subject is valid UTF-8 by construction; a check would rescan it per piece */
        const uint32_t opts = PCRE2_NO_UTF_CHECK;
        int rc = pcre2_match(t->re, w->subj, sb, w->soff[pos], opts, w->md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(t->re, w->subj, sb, w->soff[pos], opts | PCRE2_NO_JIT, w->md, NULL);
        size_t end = pos + 1;    /* no match: one code point (unreachable for these regexes) */
        if (rc > 0) {
            const PCRE2_SIZE mend = pcre2_get_ovector_pointer(w->md)[1];
            end = pos;
            while (end < n && w->soff[end] < mend) end++;
            if (end == pos) end = pos + 1;
        } else if (rc != PCRE2_ERROR_NOMATCH) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return coti_fail(err, err_size, COTI_E_RANGE, "tokenizer: pre-tokenizer regex failed: %s", (const char *)msg);
        }
        /* byte-level encode the piece's code points (shortest UTF-8, llama.cpp's re-encoding) */
        size_t need = (end - pos) * 8;
        if (!coti_grow(&w->enc, &w->enc_cap, need, 1, 64)) return COTI_E_NOMEM;
        size_t el = 0;
        for (size_t k = pos; k < end; k++) {
            uint8_t u[4];
            const size_t nu = utf8_encode(w->cps[k], u);
            for (size_t j = 0; j < nu; j++) {
                memcpy(w->enc + el, t->byte_enc[u[j]], t->byte_enc_len[u[j]]);
                el += t->byte_enc_len[u[j]];
            }
        }
        rc = bpe_piece(t, w, el, out);
        if (rc) return rc;
        pos = end;
    }
    return COTI_OK;
}

/* Whether [at, at + n) overlaps one of the sorted, disjoint spans lit[0..n_lit). */
static bool overlaps_literal(const struct tokenizer_span *lit, size_t n_lit, size_t at, size_t n) {
    size_t lo = 0, hi = n_lit;   /* first span ending after at */
    while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        if (lit[mid].off + lit[mid].len <= at) lo = mid + 1;
        else hi = mid;
    }
    return lo < n_lit && lit[lo].off < at + n;
}

/* tokenizer_st_partition: for each special token, longest first, cut every raw fragment at
 * each occurrence of its text (tokenizer.md §3.1). A CONTROL/UNKNOWN occurrence counts only
 * with parse_special and outside the literal spans (there the text is parsed as with
 * parse_special off); USER_DEFINED ones count everywhere. */
static int partition_specials(const struct tokenizer *t, const char *text, size_t len, const struct tokenizer_opts *o,
                              struct frags *cur, struct frags *nxt) {
    cur->n = 0;
    if (len && !frags_push(cur, -1, 0, len)) return COTI_E_NOMEM;
    for (uint32_t k = 0; k < t->n_special && cur->n; k++) {
        const int32_t sid = t->special[k];
        const bool control = t->attr[sid] & (TOKENIZER_ATTR_CONTROL | TOKENIZER_ATTR_UNKNOWN);
        if (!o->parse_special && control) continue;
        size_t slen;
        const char *stext = tok_text(t, sid, &slen);
        bool any = false;
        nxt->n = 0;
        for (size_t f = 0; f < cur->n; f++) {
            const struct frag fr = cur->p[f];
            if (fr.id >= 0) {
                if (!frags_push(nxt, fr.id, 0, 0)) return COTI_E_NOMEM;
                continue;
            }
            size_t pos = fr.off, from = fr.off, end = fr.off + fr.len;
            const char *m;
            while (from < end && (m = memmem(text + from, end - from, stext, slen))) {
                const size_t at = (size_t)(m - text);
                if (control && overlaps_literal(o->literal, o->n_literal, at, slen)) {
                    from = at + 1; /* message text: not a marker; a later occurrence may be */
                    continue;
                }
                any = true;
                if (at > pos && !frags_push(nxt, -1, pos, at - pos)) return COTI_E_NOMEM;
                if (!frags_push(nxt, sid, 0, 0)) return COTI_E_NOMEM;
                pos = from = at + slen;
            }
            if (pos < end && !frags_push(nxt, -1, pos, end - pos)) return COTI_E_NOMEM;
        }
        if (any) {
            struct frags tmp = *cur;
            *cur = *nxt;
            *nxt = tmp;
        }
    }
    return COTI_OK;
}

int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, bool add_special,
                     bool parse_special, int32_t **out_tokens, size_t *n_out, char *err, size_t err_size) {
    const struct tokenizer_opts o = {.add_special = add_special, .parse_special = parse_special};
    return tokenizer_encode_opts(t, text, len, &o, out_tokens, n_out, err, err_size);
}

int tokenizer_encode_opts(const struct tokenizer *t, const char *text, size_t len, const struct tokenizer_opts *o,
                          int32_t **out_tokens, size_t *n_out, char *err, size_t err_size) {
    *out_tokens = NULL;
    *n_out = 0;
    if (len > TOKENIZER_MAX_TEXT_BYTES)
        return coti_fail(err, err_size, COTI_E_RANGE, "tokenizer: text of %zu bytes exceeds the limit of %zu",
                         len, TOKENIZER_MAX_TEXT_BYTES);
    if (len && !text) return coti_fail(err, err_size, COTI_E_ARG, "tokenizer: text is NULL");
    for (size_t i = 0; i < o->n_literal; i++)
        if (o->literal[i].off > len || o->literal[i].len > len - o->literal[i].off ||
            (i && o->literal[i].off < o->literal[i - 1].off + o->literal[i - 1].len))
            return coti_fail(err, err_size, COTI_E_ARG, "tokenizer: literal span %zu is out of order or out of the text", i);
    const bool add_special = o->add_special;
    const size_t max_tokens = o->max_tokens ? o->max_tokens : SIZE_MAX;

    struct ids out = {0};
    struct frags fa = {0}, fb = {0};
    struct work w = {0};
    int rc = partition_specials(t, text, len, o, &fa, &fb);
    if (rc) goto done;

    if (add_special && t->add_bos && !ids_push(&out, t->bos)) { rc = COTI_E_NOMEM; goto done; }

    size_t max_raw = 0;
    for (size_t f = 0; f < fa.n; f++)
        if (fa.p[f].id < 0 && fa.p[f].len > max_raw) max_raw = fa.p[f].len;
    if (max_raw) {
        /* one code point per input byte at most; U+FFFD takes 3 subject bytes for 1 input byte */
        w.cps = malloc(max_raw * sizeof(*w.cps));
        w.soff = malloc((max_raw + 1) * sizeof(*w.soff));
        w.subj = malloc(max_raw * 3 + 4);
        w.md = pcre2_match_data_create_from_pattern(t->re, NULL);
        if (!w.cps || !w.soff || !w.subj || !w.md) { rc = COTI_E_NOMEM; goto done; }
    }
    for (size_t f = 0; f < fa.n && out.n <= max_tokens; f++) {
        const struct frag *fr = &fa.p[f];
        if (fr->id >= 0) {
            if (!ids_push(&out, fr->id)) { rc = COTI_E_NOMEM; goto done; }
            continue;
        }
        rc = encode_fragment(t, &w, (const uint8_t *)text + fr->off, fr->len, fr->off, max_tokens, &out, err, err_size);
        if (rc) goto done;
    }
    if (add_special && t->add_eos && out.n <= max_tokens && !ids_push(&out, t->eos)) { rc = COTI_E_NOMEM; goto done; }
    if (out.n > max_tokens) out.n = max_tokens + 1; /* stopped early: a prefix, one over the limit */

done:
    free(fa.p);
    free(fb.p);
    free(w.cps);
    free(w.soff);
    free(w.subj);
    free(w.enc);
    free(w.sym);
    free(w.heap);
    if (w.md) pcre2_match_data_free(w.md);
    if (rc) {
        free(out.p);
        if (rc == COTI_E_NOMEM) coti_fail(err, err_size, rc, "tokenizer: out of memory encoding %zu bytes", len);
        return rc;
    }
    if (out.n == 0) {
        free(out.p);
        out.p = NULL;
    }
    *out_tokens = out.p;
    *n_out = out.n;
    return COTI_OK;
}

/* =======================================================================================
 * Decoding and accessors.
 * ===================================================================================== */

int tokenizer_token_to_piece(const struct tokenizer *t, int32_t id, bool render_special,
                             const char **piece, size_t *len) {
    *piece = "";
    *len = 0;
    if (id < 0 || id >= t->n_vocab) return COTI_E_RANGE;
    if (!render_special && (t->attr[id] & (TOKENIZER_ATTR_CONTROL | TOKENIZER_ATTR_UNKNOWN))) return COTI_OK;
    *piece = t->piece_blob + t->piece_off[id];
    *len = t->piece_off[id + 1] - t->piece_off[id];
    return COTI_OK;
}

int tokenizer_detokenize(const struct tokenizer *t, const int32_t *ids, size_t n, bool render_special,
                         char **out, size_t *out_len, char *err, size_t err_size) {
    *out = NULL;
    *out_len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const char *p;
        size_t l;
        if (tokenizer_token_to_piece(t, ids[i], render_special, &p, &l))
            return coti_fail(err, err_size, COTI_E_RANGE, "tokenizer: token %zu is %d, outside [0, %d)", i,
                             (int)ids[i], (int)t->n_vocab);
        if (!coti_add_size(total, l, &total))
            return coti_fail(err, err_size, COTI_E_RANGE, "tokenizer: detokenized text too large");
    }
    char *s = malloc(total + 1);
    if (!s) return coti_fail(err, err_size, COTI_E_NOMEM, "tokenizer: out of memory for %zu bytes", total);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        const char *p;
        size_t l;
        tokenizer_token_to_piece(t, ids[i], render_special, &p, &l);
        memcpy(s + o, p, l);
        o += l;
    }
    s[o] = '\0';
    *out = s;
    *out_len = o;
    return COTI_OK;
}

int32_t tokenizer_n_vocab(const struct tokenizer *t) { return t->n_vocab; }
int32_t tokenizer_bos(const struct tokenizer *t) { return t->bos; }
int32_t tokenizer_eos(const struct tokenizer *t) { return t->eos; }
int32_t tokenizer_eot(const struct tokenizer *t) { return t->eot; }
bool tokenizer_add_bos(const struct tokenizer *t) { return t->add_bos; }

bool tokenizer_is_eog(const struct tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && t->eog[id];
}

unsigned tokenizer_token_attr(const struct tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab ? t->attr[id] : 0;
}
