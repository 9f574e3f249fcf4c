/* model.c — architecture registry and the generic load entry point. */
#include "model.h"
#include "engine/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *arch;
    int (*load)(struct model **, struct gguf_file *, struct backend *, const struct model_params *,
                char *, size_t);
} model_archs[] = {
    {"qwen35", qwen35_load},
    {"qwen35moe", qwen35moe_load},
    {"gemma4", gemma4_load},
};

const char *model_arch_names(char *buf, size_t size) {
    size_t n = 0;
    if (size) buf[0] = 0;
    for (size_t i = 0; i < COTI_ARRAY_LEN(model_archs) && n < size; i++) {
        int k = snprintf(buf + n, size - n, "%s%s", i ? ", " : "", model_archs[i].arch);
        if (k < 0) break;
        n += (size_t)k;
    }
    return buf;
}

int model_load_gguf(struct model **out, struct gguf_file *g, struct backend *be,
                    const struct model_params *p, char *err, size_t err_size) {
    *out = NULL;
    int rc;
    const char *arch = NULL;
    if (p->n_seq < 1 || p->n_ctx < 1 || p->n_batch < 1 || p->n_keep_states < 0) {
        rc = coti_fail(err, err_size, COTI_E_ARG, "model params out of range (n_seq %d, n_ctx %d, n_batch %d)",
                       p->n_seq, p->n_ctx, p->n_batch);
    } else if (!kv_type_ok(p->cache_type_k, 32) || !kv_type_ok(p->cache_type_v, 32)) { /* kv.h's types */
        const struct ggml_type_traits *tk = ggml_type_traits_get(p->cache_type_k), *tv = ggml_type_traits_get(p->cache_type_v);
        rc = coti_fail(err, err_size, COTI_E_ARG, "KV cache types K %s, V %s: each must be f16, bf16, q8_0 or q4_0",
                       tk ? tk->name : "?", tv ? tv->name : "?");
    } else if (gguf_get_str(g, "general.architecture", &arch, err, err_size) != 0) {
        rc = coti_fail(err, err_size, COTI_E_FORMAT, "missing general.architecture");
    } else {
        char names[128];
        rc = coti_fail(err, err_size, COTI_E_UNSUPPORTED, "architecture '%s' is not supported (supported: %s)", arch,
                       model_arch_names(names, sizeof names));
        if (p->progress) {
            p->progress->done = 0;
            p->progress->total = 0;
            for (uint64_t i = 0; i < g->n_tensors; i++) p->progress->total += g->tensors[i].size_bytes;
        }
        for (size_t i = 0; i < COTI_ARRAY_LEN(model_archs); i++)
            if (strcmp(arch, model_archs[i].arch) == 0) rc = model_archs[i].load(out, g, be, p, err, err_size);
    }
    /* the architecture loader took g only on success */
    if (rc) { gguf_close(g); return rc; }
    struct model_info *in = &(*out)->info;
    const struct gguf_tensor *emb = gguf_find_tensor(g, "token_embd.weight");
    in->weight_type = emb ? emb->type : GGML_TYPE_F32;
    in->n_params = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const struct gguf_tensor *t = &g->tensors[i];
        in->n_params += t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    }
    in->n_bytes = g->size;
    in->state_bytes_per_seq = (*out)->engine ? memory_bytes_per_seq(&(*out)->engine->mem) : 0;
    in->cache_type_k = p->cache_type_k;
    in->cache_type_v = p->cache_type_v;
    if ((*out)->engine) memory_kv_bytes_per_seq(&(*out)->engine->mem, &in->k_bytes_per_seq, &in->v_bytes_per_seq);
    if (gguf_get_str(g, "tokenizer.chat_template", &in->chat_template, NULL, 0)) in->chat_template = NULL;
    return 0;
}

int model_load(struct model **out, const char *path, struct backend *be,
               const struct model_params *p, char *err, size_t err_size) {
    struct gguf_file *g = NULL;
    *out = NULL;
    int rc = gguf_open(&g, path, err, err_size);
    if (rc) return rc;
    rc = model_load_gguf(out, g, be, p, err, err_size);
    if (rc && err && err_size) {
        /* name the file: the loaders' messages are about its contents */
        char reason[512];
        snprintf(reason, sizeof reason, "%s", err);
        snprintf(err, err_size, "%s: %s", path, reason);
    }
    return rc;
}

void model_free(struct model *m) {
    if (m) m->vt->free(m);
}

/* Every architecture runs on the engine, whose memory holds the checkpoints. */
void model_seq_checkpoint(struct model *m, int s, const float *hidden) { engine_seq_checkpoint(m, s, hidden); }
int model_seq_resume_points(const struct model *m, int src, int p, int *q, const float **hidden, int max) {
    return engine_seq_resume_points(m, src, p, q, hidden, max);
}
int model_seq_resume(struct model *m, int dst, int src, int q) { return engine_seq_resume(m, dst, src, q); }
