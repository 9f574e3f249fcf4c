/* gemma4_assistant.h — the `gemma4-assistant` drafter model: a small Gemma-4-style stack with
 * query-only attention over its TARGET's KV cache (read-only views), fed the target's scaled
 * embedding of a token and a target-width hidden row, giving logits and the next hidden row.
 * It runs only beside a loaded gemma4 target; drafters/assistant.c drives it. */
#ifndef COTI_GEMMA4_ASSISTANT_H
#define COTI_GEMMA4_ASSISTANT_H

#include "model.h"

struct gemma4_assistant;

/* Load the drafter file at path for target (a gemma4 model): refused, with the reason, when its
 * vocabulary, width or KV layout does not fit the target. */
int gemma4_assistant_load(struct gemma4_assistant **out, const char *path, struct model *target, char *err,
                          size_t err_size);
void gemma4_assistant_free(struct gemma4_assistant *a);

/* Set the query position of sequence s's next steps: every draft step of a round reads the
 * target's committed cells [0, pos) (a sliding layer the window's last of them). The round's
 * first token goes up in the same copy: the return value is where it is (backend memory). */
const int32_t *gemma4_assistant_at(struct gemma4_assistant *a, int s, int pos, int32_t token);
/* One step at that position: token *tok_dev (backend memory), hidden h_in (backend, target
 * width). Leaves the logits and the next hidden row in backend memory (valid until the next
 * step; h_in may be the previous step's *h_out) and, when argmax_out is not NULL, the logits'
 * argmax there. */
void gemma4_assistant_step(struct gemma4_assistant *a, const int32_t *tok_dev, const float *h_in, int32_t *argmax_out,
                           const float **logits, const float **h_out);
int gemma4_assistant_n_vocab(const struct gemma4_assistant *a);

#endif
