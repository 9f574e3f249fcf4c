/* metrics.c — counters and the Prometheus exposition. Names follow llama.cpp's
 * (`llamacpp:<name>`, server-api.md §2.5) so existing dashboards work; the few extras coti
 * adds (requests_total, http_*, cache tokens) use the same prefix and say so in their HELP. */
#include "server/metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"

void metrics_init(struct metrics *mx) {
    memset(mx, 0, sizeof *mx);
    pthread_mutex_init(&mx->mu, NULL);
    mx->t_start_unix = (int64_t)time(NULL);
}

void metrics_free(struct metrics *mx) { pthread_mutex_destroy(&mx->mu); }

void metrics_count_http(struct metrics *mx, int status) {
    pthread_mutex_lock(&mx->mu);
    mx->http_requests_total++;
    if (status >= 400) mx->http_errors_total++;
    pthread_mutex_unlock(&mx->mu);
}

void metrics_count_decode(struct metrics *mx, int n_busy, const struct graph_stats *gs) {
    pthread_mutex_lock(&mx->mu);
    mx->n_decode_total++;
    mx->n_busy_slots_total += n_busy;
    mx->graphs = *gs;
    pthread_mutex_unlock(&mx->mu);
}

void metrics_count_batch(struct metrics *mx, int n_seqs) {
    pthread_mutex_lock(&mx->mu);
    mx->batched_cycles_total++;
    mx->batched_sequences_total += n_seqs;
    pthread_mutex_unlock(&mx->mu);
}

void metrics_set_load(struct metrics *mx, int processing, int deferred) {
    pthread_mutex_lock(&mx->mu);
    mx->requests_processing = processing;
    mx->requests_deferred = deferred;
    pthread_mutex_unlock(&mx->mu);
}

void metrics_count_task(struct metrics *mx, const struct metrics_task *t) {
    pthread_mutex_lock(&mx->mu);
    mx->requests_total++;
    if (t->cancelled) mx->requests_cancelled_total++;
    if (t->failed) mx->requests_failed_total++;
    mx->prompt_tokens_total += t->prompt_n;
    mx->cache_tokens_total += t->cache_n;
    mx->prompt_seconds_total += t->prompt_s;
    mx->tokens_predicted_total += t->predicted_n;
    mx->tokens_predicted_seconds_total += t->predicted_s;
    mx->bucket_prompt_tokens += t->prompt_n;
    mx->bucket_prompt_seconds += t->prompt_s;
    mx->bucket_predicted_tokens += t->predicted_n;
    mx->bucket_predicted_seconds += t->predicted_s;
    if (t->n_ctx_used > mx->n_tokens_max) mx->n_tokens_max = t->n_ctx_used;
    mx->spec_drafts_total += t->drafts;
    mx->spec_draft_tokens_total += t->draft_n;
    mx->spec_accepted_tokens_total += t->accepted;
    for (int i = 0; i < SPEC_MAX_DRAFT; i++) mx->spec_accepted_at[i] += t->accepted_at[i];
    pthread_mutex_unlock(&mx->mu);
}

struct mbuf {
    char *p;
    size_t n, cap;
    bool oom;
};

static void mb_printf(struct mbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void mb_printf(struct mbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
        if (k < 0) { b->oom = true; return; }
        if ((size_t)k < b->cap - b->n) { b->n += (size_t)k; return; }
        size_t cap = b->cap * 2 + (size_t)k;
        char *p = realloc(b->p, cap);
        if (!p) { b->oom = true; return; }
        b->p = p;
        b->cap = cap;
    }
}

static void metric(struct mbuf *b, const char *name, const char *type, const char *help, double v) {
    mb_printf(b, "# HELP llamacpp:%s %s\n# TYPE llamacpp:%s %s\nllamacpp:%s %.17g\n", name, help, name, type, name, v);
}

char *metrics_render(struct metrics *mx) {
    struct mbuf b = {malloc(4096), 0, 4096, false};
    if (!b.p) return NULL;
    b.p[0] = 0;
    pthread_mutex_lock(&mx->mu);
    metric(&b, "prompt_tokens_total", "counter", "Number of prompt tokens processed.", (double)mx->prompt_tokens_total);
    metric(&b, "prompt_seconds_total", "counter", "Prompt process time", mx->prompt_seconds_total);
    metric(&b, "tokens_predicted_total", "counter", "Number of generation tokens processed.", (double)mx->tokens_predicted_total);
    metric(&b, "tokens_predicted_seconds_total", "counter", "Predict process time", mx->tokens_predicted_seconds_total);
    metric(&b, "n_decode_total", "counter", "Total number of engine cycles (one speculative step per busy slot).", (double)mx->n_decode_total);
    metric(&b, "batched_cycles_total", "counter", "Engine cycles that verified several slots in one forward.",
           (double)mx->batched_cycles_total);
    metric(&b, "batched_sequences_total", "counter", "Slot steps taken in those batched cycles.",
           (double)mx->batched_sequences_total);
    metric(&b, "graph_replays_total", "counter", "(coti) Target forwards replayed from a recorded graph.", (double)mx->graphs.replayed);
    metric(&b, "graph_recordings_total", "counter", "(coti) Target forwards recorded as a graph (a shape's second sighting).",
           (double)mx->graphs.recorded);
    metric(&b, "graph_updates_total", "counter",
           "(coti) Target forwards recorded again over their stale graph, rewritten in place.",
           (double)mx->graphs.updated);
    metric(&b, "graph_eager_total", "counter", "(coti) Target forwards run op by op (a shape's first sighting, or no graphs).",
           (double)mx->graphs.eager);
    metric(&b, "n_tokens_max", "counter", "Largest observed n_tokens.", (double)mx->n_tokens_max);
    metric(&b, "spec_decode_num_drafts_total", "counter", "Number of speculative drafts (verify passes with drafts).", (double)mx->spec_drafts_total);
    metric(&b, "spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens proposed.", (double)mx->spec_draft_tokens_total);
    metric(&b, "spec_decode_num_accepted_tokens_total", "counter", "Number of draft tokens accepted.", (double)mx->spec_accepted_tokens_total);
    mb_printf(&b, "# HELP llamacpp:spec_decode_num_accepted_tokens_per_pos_total Number of draft tokens accepted at each draft position.\n"
                  "# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter\n");
    for (int i = 0; i < SPEC_MAX_DRAFT; i++)
        mb_printf(&b, "llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position=\"%d\"} %ld\n", i, mx->spec_accepted_at[i]);
    metric(&b, "requests_total", "counter", "(coti) Generation requests finished, including cancelled and failed ones.", (double)mx->requests_total);
    metric(&b, "requests_cancelled_total", "counter", "(coti) Generation requests whose client went away before the end.", (double)mx->requests_cancelled_total);
    metric(&b, "requests_failed_total", "counter", "(coti) Generation requests that failed inside the engine.", (double)mx->requests_failed_total);
    metric(&b, "prompt_tokens_cached_total", "counter", "(coti) Prompt tokens reused from a slot's cache.", (double)mx->cache_tokens_total);
    metric(&b, "http_requests_total", "counter", "(coti) HTTP requests answered.", (double)mx->http_requests_total);
    metric(&b, "http_errors_total", "counter", "(coti) HTTP requests answered with a 4xx or 5xx status.", (double)mx->http_errors_total);
    metric(&b, "prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s since the last scrape.",
           mx->bucket_prompt_seconds > 0 ? mx->bucket_prompt_tokens / mx->bucket_prompt_seconds : 0.0);
    metric(&b, "predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s since the last scrape.",
           mx->bucket_predicted_seconds > 0 ? mx->bucket_predicted_tokens / mx->bucket_predicted_seconds : 0.0);
    metric(&b, "requests_processing", "gauge", "Number of requests processing (busy slots).", mx->requests_processing);
    metric(&b, "requests_deferred", "gauge", "Number of requests deferred (queue depth).", mx->requests_deferred);
    metric(&b, "n_busy_slots_per_decode", "gauge", "Average number of busy slots per engine cycle.",
           mx->n_decode_total ? (double)mx->n_busy_slots_total / (double)mx->n_decode_total : 0.0);
    mx->bucket_prompt_tokens = mx->bucket_predicted_tokens = 0;
    mx->bucket_prompt_seconds = mx->bucket_predicted_seconds = 0.0;
    pthread_mutex_unlock(&mx->mu);
    if (b.oom) { free(b.p); return NULL; }
    return b.p;
}
