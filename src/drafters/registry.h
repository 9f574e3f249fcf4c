/* registry.h — every kind of drafter coti has, and the speculation choices a user names: "off"
 * (plain decoding, no drafter: a NULL kind) or one of the kinds. Parsing, printing and listing
 * them all come from the one table in registry.c, so adding a drafter is its own file and one
 * line there. */
#ifndef COTI_DRAFTER_REGISTRY_H
#define COTI_DRAFTER_REGISTRY_H

#include "drafters/drafter.h"

extern const struct drafter_kind *const drafter_kinds[]; /* in the order coti lists them */
extern const int n_drafter_kinds;

/* coti's name of the choice: "off" for NULL. */
const char *drafter_kind_name(const struct drafter_kind *k);
/* llama-server's name of the choice: "none" for NULL. */
const char *drafter_kind_llama_name(const struct drafter_kind *k);
/* A kind's name or alias into *out; "off" and "none" give NULL. COTI_E_ARG (and *out left as
 * it was) for anything else. */
int drafter_kind_parse(const char *s, const struct drafter_kind **out);
/* The choices' names as a sentence, each in quote ("" for none): `off, mtp or ngram` (without
 * off when with_off is false), for help and error texts. Returns buf (truncated to size). */
const char *drafter_kind_choices(char *buf, size_t size, bool with_off, const char *quote);
#endif
