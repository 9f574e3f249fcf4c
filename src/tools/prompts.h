/* prompts.h — prompt files for bench and equiv: a JSON array of strings, or of objects with a
 * "prompt" string field; "-" is standard input. */
#ifndef COTI_PROMPTS_H
#define COTI_PROMPTS_H

#include <stddef.h>

struct prompt_list {
    char **items;
    size_t n;
};

/* 0 on success; on error prints a message naming the file and the problem. */
int prompts_load(const char *path, struct prompt_list *out);
void prompts_free(struct prompt_list *p);

#endif
