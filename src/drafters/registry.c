/* registry.c — the table of drafter kinds and the names of the speculation choices (see
 * registry.h). */
#include "drafters/registry.h"

#include <stdio.h>
#include <string.h>

const struct drafter_kind *const drafter_kinds[] = {&drafter_kind_mtp, &drafter_kind_ngram, &drafter_kind_assistant};
const int n_drafter_kinds = (int)COTI_ARRAY_LEN(drafter_kinds);

const char *drafter_kind_name(const struct drafter_kind *k) { return k ? k->name : "off"; }

const char *drafter_kind_llama_name(const struct drafter_kind *k) { return k ? k->llama_name : "none"; }

int drafter_kind_parse(const char *s, const struct drafter_kind **out) {
    if (!strcmp(s, "off") || !strcmp(s, "none")) {
        *out = NULL;
        return 0;
    }
    for (int i = 0; i < n_drafter_kinds; i++) {
        const struct drafter_kind *k = drafter_kinds[i];
        bool match = !strcmp(s, k->name);
        for (size_t a = 0; a < COTI_ARRAY_LEN(k->aliases) && k->aliases[a]; a++) match = match || !strcmp(s, k->aliases[a]);
        if (match) {
            *out = k;
            return 0;
        }
    }
    return COTI_E_ARG;
}

const char *drafter_kind_choices(char *buf, size_t size, bool with_off, const char *quote) {
    const int first = with_off ? -1 : 0; /* -1: off */
    size_t len = 0;
    buf[0] = 0;
    for (int i = first; i < n_drafter_kinds && len < size; i++) {
        const char *sep = i == first ? "" : i + 1 == n_drafter_kinds ? " or " : ", ";
        int n = snprintf(buf + len, size - len, "%s%s%s%s", sep, quote, drafter_kind_name(i < 0 ? NULL : drafter_kinds[i]), quote);
        if (n < 0) break;
        len += (size_t)n;
    }
    return buf;
}
