/* main.c — the coti command: dispatches to one subcommand per file in src/tools/; --help and
 * --version. */
#include <stdio.h>
#include <string.h>

#include "quant/quant.h"
#include "tools.h"
#include "tools/cli.h"

#define COTI_VERSION "0.1.0"
/* the commit, from the Makefile (git describe); a tree without git builds as "unknown" */
#ifndef COTI_GIT
#define COTI_GIT "unknown"
#endif

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
    {"quantize", tool_quantize_main, "rewrite a GGUF with its weight matrices in another type"},
};

static void usage(FILE *out) {
    fprintf(out, "usage: coti <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(out, "\n`coti <command> --help` lists a command's options; `coti --version` says what this build is.\n");
}

static void version(void) {
#ifdef COTI_CUDA
    const char *cuda = "compiled in";
#else
    const char *cuda = "not compiled in (make CUDA=1)";
#endif
    printf("coti %s (git %s)\ncpu: %s kernels (the best this CPU has)\ncuda: %s\n", COTI_VERSION, COTI_GIT,
           cli_cpu_level_name(quant_cpu_level_detect()), cuda);
}

int main(int argc, char **argv) {
    if (argc < 2) { usage(stderr); return 1; }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) { usage(stdout); return 0; }
    if (!strcmp(argv[1], "-V") || !strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) { version(); return 0; }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].main(argc - 1, argv + 1);
    fprintf(stderr, "coti: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 1;
}
