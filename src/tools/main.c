/* main.c — the coti command: dispatches to one subcommand per file in src/tools/. */
#include <stdio.h>
#include <string.h>

#include "tools.h"

static const struct {
    const char *name;
    int (*main)(int, char **);
    const char *help;
} commands[] = {
    {"run", tool_run_main, "generate text from a prompt"},
    {"logits", tool_logits_main, "print top-N next-token logprobs for every position (conformance)"},
    {"bench", tool_bench_main, "decode tok/s of speculative configurations side by side"},
    {"equiv", tool_equiv_main, "the losslessness gate: speculative verify rows vs plain decoding"},
    {"serve", tool_serve_main, "OpenAI-compatible HTTP server with llama.cpp-style timings"},
    {"gguf", tool_gguf_main, "print a GGUF file's metadata and tensors"},
    {"mkmodel", tool_mkmodel_main, "write a tiny random-weight test model"},
};

static void usage(void) {
    fprintf(stderr, "usage: coti <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(stderr, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(stderr, "\n`coti <command> --help` lists a command's options.\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage();
        return argc < 2 ? 1 : 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].main(argc - 1, argv + 1);
    fprintf(stderr, "coti: unknown command '%s'\n", argv[1]);
    usage();
    return 1;
}
