/* test_drafters.c — the drafter registry: every kind's spellings parse back to it, today's
 * spellings keep their meaning, anything else is refused, the listed choices match what
 * parses, and which drafters an engine has follows its model (mtp only with a NextN head). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "spec.h"

Test(drafters, every_name_and_alias_parses_back_to_its_kind) {
    cr_assert_gt(n_drafter_kinds, 0);
    for (int i = 0; i < n_drafter_kinds; i++) {
        const struct drafter_kind *k = drafter_kinds[i], *got = NULL;
        cr_assert(k->name && k->llama_name && k->available && k->init, "kind %d is incomplete", i);
        cr_assert_str_eq(drafter_kind_name(k), k->name);
        cr_assert_str_eq(drafter_kind_llama_name(k), k->llama_name);
        /* a spelling taken by an earlier kind (or by off) would parse to that one instead */
        cr_assert_eq(drafter_kind_parse(k->name, &got), 0, "%s", k->name);
        cr_assert_eq(got, k, "'%s' parses to another kind", k->name);
        for (size_t a = 0; a < COTI_ARRAY_LEN(k->aliases) && k->aliases[a]; a++) {
            got = NULL;
            cr_assert_eq(drafter_kind_parse(k->aliases[a], &got), 0, "%s", k->aliases[a]);
            cr_assert_eq(got, k, "alias '%s' of %s parses to another kind", k->aliases[a], k->name);
        }
    }
    cr_assert_str_eq(drafter_kind_name(NULL), "off");
    cr_assert_str_eq(drafter_kind_llama_name(NULL), "none");
}

/* What --spec and "speculative.type" accepted before the registry, and what /props reported. */
Test(drafters, todays_spellings_keep_their_meaning) {
    const struct { const char *s; const struct drafter_kind *k; } cases[] = {
        {"off", NULL}, {"none", NULL}, {"mtp", &drafter_kind_mtp}, {"draft-mtp", &drafter_kind_mtp}, {"ngram", &drafter_kind_ngram},
        {"ngram-simple", &drafter_kind_ngram}, /* llama-server's name of the same prompt-lookup drafting */
    };
    for (size_t i = 0; i < COTI_ARRAY_LEN(cases); i++) {
        const struct drafter_kind *got = cases[i].k ? NULL : &drafter_kind_mtp; /* anything but the answer */
        cr_assert_eq(drafter_kind_parse(cases[i].s, &got), 0, "%s", cases[i].s);
        cr_assert_eq(got, cases[i].k, "'%s' parses to %s", cases[i].s, drafter_kind_name(got));
    }
    cr_assert_str_eq(drafter_kind_llama_name(&drafter_kind_mtp), "draft-mtp");
    cr_assert_str_eq(drafter_kind_llama_name(&drafter_kind_ngram), "ngram-simple");
}

Test(drafters, unknown_names_are_refused) {
    const char *bad[] = {"", "MTP", "mtp ", " off", "of", "ngram-simple ", "assistent", "draft", "mtp:2"};
    for (size_t i = 0; i < COTI_ARRAY_LEN(bad); i++) {
        const struct drafter_kind *got = &drafter_kind_mtp;
        cr_assert_eq(drafter_kind_parse(bad[i], &got), COTI_E_ARG, "'%s' was accepted", bad[i]);
        cr_assert_eq(got, &drafter_kind_mtp, "a refused name changed the result");
    }
}

Test(drafters, choices_list_what_parses) {
    char buf[128];
    cr_assert_str_eq(drafter_kind_choices(buf, sizeof buf, true, "\""), "\"off\", \"mtp\", \"ngram\" or \"assistant\"");
    cr_assert_str_eq(drafter_kind_choices(buf, sizeof buf, false, ""), "mtp, ngram or assistant");
    cr_assert_str_eq(drafter_kind_choices(buf, 6, true, ""), "off, ", "truncated to the buffer");
}

/* A random qwen35 model with or without its NextN layer. */
static void open_model(int nextn, const char *path, struct backend **be, struct model **m) {
    char cmd[512], err[512];
    snprintf(cmd, sizeof cmd, "./coti mkmodel --arch qwen35 -o %s --type f32 --nextn %d --vocab-from none --n-vocab 300 --seed 9 > /dev/null 2>&1",
             path, nextn);
    cr_assert_eq(system(cmd), 0, "mkmodel failed: %s", cmd);
    *be = backend_cpu_init(1, quant_cpu_level_detect());
    struct model_params p = {1, 64, 16, SPEC_MAX_DRAFT + 1, NULL, GGML_TYPE_F16, GGML_TYPE_F16, 0, 0};
    cr_assert_eq(model_load(m, path, *be, &p, err, sizeof err), 0, "%s", err);
}

Test(drafters, mtp_is_available_only_with_a_nextn_head, .timeout = 60) {
    for (int nextn = 0; nextn <= 1; nextn++) {
        char path[128], err[512];
        snprintf(path, sizeof path, "/tmp/coti-test-drafters-%d-%d.gguf", (int)getpid(), nextn);
        struct backend *be;
        struct model *m;
        open_model(nextn, path, &be, &m);
        const struct drafter_config dc = {.m = m, .n_seq = m->n_seq};
        cr_assert_eq(drafter_kind_mtp.available(&dc), nextn == 1, "mtp availability with nextn %d", nextn);
        cr_assert(drafter_kind_ngram.available(&dc), "ngram needs nothing of the model");
        struct spec_engine *e;
        cr_assert_eq(spec_engine_init(&e, m, NULL, err, sizeof err), 0, "%s", err);
        cr_assert(spec_engine_supports(e, NULL), "off is always supported");
        for (int i = 0; i < n_drafter_kinds; i++)
            cr_assert_eq(spec_engine_supports(e, drafter_kinds[i]), drafter_kinds[i]->available(&dc), "%s, nextn %d",
                         drafter_kinds[i]->name, nextn);
        /* a request for a drafter the engine lacks is refused, not run without it */
        const int32_t prompt[4] = {260, 261, 262, 263};
        const struct sampler_params sp = sampler_params_basic(0.0f, 0, 1.0f, 0.0f, 1);
        struct spec_params p = spec_params_default();
        p.drafter = &drafter_kind_mtp;
        int32_t first;
        int rc = spec_seq_begin(e, 0, prompt, 4, &sp, &p, &first, err, sizeof err);
        cr_assert_eq(rc, nextn ? 0 : COTI_E_UNSUPPORTED, "nextn %d: %s", nextn, err);
        spec_engine_free(e);
        model_free(m);
        backend_free(be);
        remove(path);
    }
}
