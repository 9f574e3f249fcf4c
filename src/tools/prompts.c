/* prompts.c — see prompts.h. */
#include "prompts.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A prompt file is read whole; this bounds it (hundreds of prompts of a few KB each). */
#define PROMPTS_MAX_FILE_BYTES (64u << 20)

int prompts_load(const char *path, struct prompt_list *out) {
    memset(out, 0, sizeof *out);
    const bool from_stdin = !strcmp(path, "-");
    FILE *f = from_stdin ? stdin : fopen(path, "rb");
    if (!f) { fprintf(stderr, "error: cannot open prompt file %s\n", path); return -1; }
    char *buf = malloc(PROMPTS_MAX_FILE_BYTES + 1);
    size_t n = buf ? fread(buf, 1, PROMPTS_MAX_FILE_BYTES + 1, f) : 0;
    if (!from_stdin) fclose(f);
    if (!buf || n > PROMPTS_MAX_FILE_BYTES) {
        fprintf(stderr, "error: %s: %s\n", path, buf ? "file larger than 64 MiB" : "out of memory");
        free(buf);
        return -1;
    }
    buf[n] = 0;
    cJSON *root = cJSON_ParseWithLength(buf, n);
    free(buf);
    if (!cJSON_IsArray(root) || cJSON_GetArraySize(root) == 0) {
        fprintf(stderr, "error: %s: expected a non-empty JSON array of strings or {\"prompt\": ...} objects\n", path);
        cJSON_Delete(root);
        return -1;
    }
    int count = cJSON_GetArraySize(root);
    out->items = calloc((size_t)count, sizeof(char *));
    if (!out->items) { cJSON_Delete(root); return -1; }
    cJSON *it;
    cJSON_ArrayForEach(it, root) {
        const cJSON *s = cJSON_IsObject(it) ? cJSON_GetObjectItemCaseSensitive(it, "prompt") : it;
        if (!cJSON_IsString(s) || !s->valuestring[0]) {
            fprintf(stderr, "error: %s: item %zu is not a non-empty string or {\"prompt\": string}\n", path, out->n);
            prompts_free(out);
            cJSON_Delete(root);
            return -1;
        }
        out->items[out->n] = strdup(s->valuestring);
        if (!out->items[out->n]) { prompts_free(out); cJSON_Delete(root); return -1; }
        out->n++;
    }
    cJSON_Delete(root);
    return 0;
}

void prompts_free(struct prompt_list *p) {
    for (size_t i = 0; i < p->n; i++) free(p->items[i]);
    free(p->items);
    memset(p, 0, sizeof *p);
}
