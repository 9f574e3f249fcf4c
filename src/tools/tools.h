/* tools.h — the coti subcommands. Each lives in its own file as tool_<name>_main(argc, argv)
 * (argv[0] is the subcommand name) and returns the process exit code. */
#ifndef COTI_TOOLS_H
#define COTI_TOOLS_H

int tool_run_main(int argc, char **argv);
int tool_logits_main(int argc, char **argv);
int tool_gguf_main(int argc, char **argv);
int tool_mkmodel_main(int argc, char **argv);
int tool_quantize_main(int argc, char **argv);
int tool_bench_main(int argc, char **argv);
int tool_equiv_main(int argc, char **argv);
int tool_serve_main(int argc, char **argv);

#endif
