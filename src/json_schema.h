/* json_schema.h — JSON schema to GBNF (grammar.h), for the subset clients send as
 * response_format / json_schema: type (object, array, string, number, integer, boolean, null,
 * or a list of them), properties, required, additionalProperties (false, true or a schema;
 * absent counts as false when properties are given), items, minItems, maxItems, minLength,
 * maxLength, enum, const, anyOf, oneOf, and local $ref into #/$defs or #/definitions.
 * Annotations (title, description, default, examples, $schema, $id, $comment, ...) are ignored;
 * any other keyword is refused, naming it, rather than silently not enforced.
 * Objects are generated with their properties in the schema's order. */
#ifndef COTI_JSON_SCHEMA_H
#define COTI_JSON_SCHEMA_H

#include <cjson/cJSON.h>

#include "common.h"

/* GBNF text for schema (a malloc'ed NUL-terminated string in *out). Returns 0,
 * COTI_E_UNSUPPORTED (a keyword or value outside the subset; err names it), COTI_E_FORMAT (the
 * schema is not a schema: a non-object, a bad $ref, nesting too deep), COTI_E_NOMEM. */
int json_schema_to_grammar(const cJSON *schema, char **out, char *err, size_t err_size);

/* The same with the schema's rule named rule instead of root, for a caller that writes its own
 * root around it (a forced tool call). rule must not be one of the generated names (s<N>, ws,
 * char, string, integer, number, boolean, null, value, object, array). */
int json_schema_to_rule(const cJSON *schema, const char *rule, char **out, char *err, size_t err_size);

/* GBNF for any JSON object (response_format json_object); malloc'ed, NULL when out of memory. */
char *json_schema_object_grammar(void);

#endif
