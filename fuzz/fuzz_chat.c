/* fuzz_chat.c — libFuzzer target for the chat template renderer on untrusted input: the
 * template text comes from a GGUF file, roles and contents from requests. The input is the
 * template, a NUL, then messages as role 0x01 content, separated by 0x02; the first byte
 * sets add_generation_prompt and enable_thinking. Invariants checked: a refusal has a message
 * and no output; an accepted render is NUL-terminated at n_text, its spans are in order,
 * disjoint and inside the text, each span's bytes come from the role or the content of a message
 * (the bytes the server must tokenize as text), and chat_apply renders the same text. Built by
 * `make fuzz`; seeds in fuzz/corpus/chat/. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHAT_MAX_MSG 16

/* Whether p[0, n) is a subsequence of s (its bytes in order, maybe with others between). */
static bool is_subsequence(const char *p, size_t n, const char *s) {
    size_t i = 0;
    for (; *s && i < n; s++)
        if (*s == p[i]) i++;
    return i == n;
}

/* Whether span bytes p[0, n) come from one message's role or content: in order, as a format
 * may trim a content (Gemma 4 does) or drop its thought blocks (Gemma 4's strip_thinking of an
 * assistant turn); "developer" is rendered as "system". */
static bool is_message_text(const char *p, size_t n, const struct chat_message *msgs, size_t n_msg) {
    for (size_t i = 0; i < n_msg; i++) {
        if (!strcmp(msgs[i].role, "developer") && n == 6 && !memcmp(p, "system", 6)) return true;
        if (is_subsequence(p, n, msgs[i].role) || is_subsequence(p, n, msgs[i].content ? msgs[i].content : "")) return true;
    }
    return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const bool add_gen = data[0] & 1, thinking = data[0] & 2;
    char *buf = malloc(size); /* the rest, NUL-terminated, cut into strings in place */
    if (!buf) return 0;
    memcpy(buf, data + 1, size - 1);
    buf[size - 1] = '\0';
    const char *tmpl = buf;
    const bool no_template = data[0] & 4;
    char *p = buf + strlen(buf) + 1;
    char *end = buf + size - 1;
    struct chat_message msgs[FUZZ_CHAT_MAX_MSG];
    size_t n_msg = 0;
    while (p < end && n_msg < FUZZ_CHAT_MAX_MSG) {
        char *rec_end = memchr(p, 0x02, (size_t)(end - p));
        if (!rec_end) rec_end = end;
        *rec_end = '\0';
        char *sep = strchr(p, 0x01);
        if (sep) *sep = '\0';
        msgs[n_msg++] = (struct chat_message){p, sep ? sep + 1 : NULL};
        p = rec_end + 1;
    }
    struct chat_prompt pr;
    char err[256] = "";
    int rc = chat_render(no_template ? NULL : tmpl, msgs, n_msg, add_gen, thinking, &pr, err, sizeof err);
    if (rc) {
        if (pr.text || pr.spans || !err[0]) __builtin_trap();
        free(buf);
        return 0;
    }
    if (!pr.text || pr.text[pr.n_text] != '\0') __builtin_trap();
    size_t at = 0;
    for (size_t i = 0; i < pr.n_spans; i++) {
        const struct chat_span *s = &pr.spans[i];
        if (s->off < at || s->off > pr.n_text || s->len > pr.n_text - s->off) __builtin_trap();
        if (!is_message_text(pr.text + s->off, s->len, msgs, n_msg)) __builtin_trap();
        at = s->off + s->len;
    }
    char *flat = NULL;
    if (chat_apply(no_template ? NULL : tmpl, msgs, n_msg, add_gen, thinking, &flat, err, sizeof err) || strlen(flat) != pr.n_text ||
        memcmp(flat, pr.text, pr.n_text) != 0)
        __builtin_trap();
    free(flat);
    chat_prompt_free(&pr);
    free(buf);
    return 0;
}
