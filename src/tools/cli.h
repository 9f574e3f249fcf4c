/* cli.h — option parsing shared by the subcommands (model, threads, context, sampling). */
#ifndef COTI_CLI_H
#define COTI_CLI_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "model.h"
#include "spec.h"

struct cli_common {
    const char *model_path;
    int n_threads;
    int n_ctx;
    int n_batch;
    enum quant_cpu_level cpu_level;
    bool cuda;                   /* --device cuda */
    /* sampling */
    float temperature;
    int top_k;
    float top_p;
    float min_p;
    uint64_t seed;
    /* speculation */
    struct spec_params spec;
    const char *draft_path;      /* --spec-draft / -md: a drafter model's file */
};

void cli_common_defaults(struct cli_common *c);
/* If argv[*i] is a common option, consume it (and its value), advance *i and return 1;
 * return 0 if not a common option; -1 (message printed) on a bad value. */
int cli_parse_common(struct cli_common *c, int argc, char **argv, int *i);
const char *cli_common_help(void);

/* Parse helpers: 0 on success, -1 with a message naming the option and the allowed range. */
int cli_parse_int(const char *opt, const char *s, long lo, long hi, long *out);
int cli_parse_float(const char *opt, const char *s, double lo, double hi, double *out);

/* Backend + model from the common options; prints the error and returns non-zero on failure. */
int cli_open_model(const struct cli_common *c, int n_seq, int n_keep_states, struct backend **be,
                   struct model **m);
/* The same, with the backend passed through wrap (which takes it over) before the model loads. */
int cli_open_model_wrapped(const struct cli_common *c, int n_seq, int n_keep_states,
                           struct backend *(*wrap)(struct backend *inner), struct backend **be, struct model **m);

#endif
