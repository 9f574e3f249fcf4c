/* metrics.h — server counters shared by the engine thread (writer) and HTTP threads
 * (readers), and their Prometheus text exposition (server-api.md §2.5). */
#ifndef COTI_SERVER_METRICS_H
#define COTI_SERVER_METRICS_H

#include <pthread.h>
#include <stdint.h>

#include "drafters/drafter.h"
#include "engine/graphs.h"

struct metrics {
    pthread_mutex_t mu;
    int64_t t_start_unix;
    /* HTTP side */
    long http_requests_total, http_errors_total;
    /* generation (counted when a task finishes) */
    long requests_total, requests_cancelled_total, requests_failed_total;
    long prompt_tokens_total, tokens_predicted_total, cache_tokens_total;
    double prompt_seconds_total, tokens_predicted_seconds_total;
    long n_decode_total, n_busy_slots_total, n_tokens_max;
    long batched_cycles_total, batched_sequences_total; /* cycles verifying several slots in one forward */
    struct graph_stats graphs;   /* the target's forwards so far: replayed, recorded, eager */
    long spec_drafts_total, spec_draft_tokens_total, spec_accepted_tokens_total;
    long spec_accepted_at[SPEC_MAX_DRAFT];
    /* the current bucket of the rate gauges: reset at each exposition, as llama.cpp does */
    long bucket_prompt_tokens, bucket_predicted_tokens;
    double bucket_prompt_seconds, bucket_predicted_seconds;
    /* gauges set by the engine */
    int requests_processing, requests_deferred;
};

void metrics_init(struct metrics *mx);
void metrics_free(struct metrics *mx);
void metrics_count_http(struct metrics *mx, int status);
/* One engine cycle over n_busy slots; gs: the target's graph counts after it. */
void metrics_count_decode(struct metrics *mx, int n_busy, const struct graph_stats *gs);
/* One cycle that stepped n_seqs slots with a single batched verify (spec_step_batch). */
void metrics_count_batch(struct metrics *mx, int n_seqs);
void metrics_set_load(struct metrics *mx, int processing, int deferred);

struct metrics_task {
    bool cancelled, failed;
    int prompt_n, cache_n, predicted_n, n_ctx_used;
    double prompt_s, predicted_s;
    long drafts, draft_n, accepted, accepted_at[SPEC_MAX_DRAFT];
};
void metrics_count_task(struct metrics *mx, const struct metrics_task *t);

/* Prometheus text into a malloc'ed string (caller frees); NULL when out of memory.
 * Resets the rate-gauge bucket. */
char *metrics_render(struct metrics *mx);

#endif
