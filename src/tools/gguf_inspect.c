/* gguf_inspect.c — `coti gguf MODEL.gguf`: prints a GGUF file's version, metadata and tensor
 * table. Owns only presentation: arrays are abbreviated (type, count, first values), long
 * strings are truncated and escaped so a hostile file cannot drive the terminal. Parsing and
 * validation are gguf.c's; a file it rejects is reported with its message and exit code 1. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "gguf.h"
#include "tools.h"

/* How much of a value is shown; --full lifts both limits. */
#define INSPECT_MAX_STR 80        /* characters of a string value */
#define INSPECT_MAX_ARR 8         /* leading elements of an array */

struct inspect_opts { size_t max_str, max_arr; bool no_tensors; };

/* Length of a valid UTF-8 sequence starting at s (at most n bytes), or 0 if invalid. Valid
 * multi-byte text is shown as is; anything else is escaped. */
static size_t utf8_len(const unsigned char *s, size_t n) {
    size_t len;
    uint32_t cp;
    if (s[0] < 0x80) return 1;
    if ((s[0] & 0xE0) == 0xC0) { len = 2; cp = s[0] & 0x1F; }
    else if ((s[0] & 0xF0) == 0xE0) { len = 3; cp = s[0] & 0x0F; }
    else if ((s[0] & 0xF8) == 0xF0) { len = 4; cp = s[0] & 0x07; }
    else return 0;
    if (len > n) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};   /* reject overlong forms */
    if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    if (cp >= 0x80 && cp < 0xA0) return 0;   /* C1 controls */
    return len;
}

/* Prints s[0..n) (quoted if asked), escaping control bytes and invalid UTF-8, at most
 * max_chars characters. */
static void print_str(FILE *out, const char *s, size_t n, size_t max_chars, bool quote) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, chars = 0;
    if (quote) fputc('"', out);
    while (i < n && chars < max_chars) {
        unsigned char c = p[i];
        size_t len = utf8_len(p + i, n - i);
        if (c == '\n') fputs("\\n", out);
        else if (c == '\t') fputs("\\t", out);
        else if (quote && (c == '"' || c == '\\')) fprintf(out, "\\%c", c);
        else if (len == 1 && c >= 0x20 && c < 0x7F) fputc(c, out);
        else if (len > 1) { fwrite(p + i, 1, len, out); i += len; chars++; continue; }
        else fprintf(out, "\\x%02x", c);
        i++;
        chars++;
    }
    if (quote) fputc('"', out);
    if (i < n) fprintf(out, "... (%zu bytes)", n);
}

static void print_elem(FILE *out, enum gguf_type t, const uint8_t *p) {
    uint64_t raw = 0;
    size_t size = t == GGUF_TYPE_UINT8 || t == GGUF_TYPE_INT8 || t == GGUF_TYPE_BOOL ? 1
                : t == GGUF_TYPE_UINT16 || t == GGUF_TYPE_INT16 ? 2
                : t == GGUF_TYPE_UINT64 || t == GGUF_TYPE_INT64 || t == GGUF_TYPE_FLOAT64 ? 8 : 4;
    for (size_t i = size; i-- > 0;) raw = raw << 8 | p[i];
    switch (t) {
    case GGUF_TYPE_INT8: fprintf(out, "%d", (int8_t)(uint8_t)raw); break;
    case GGUF_TYPE_INT16: fprintf(out, "%d", (int16_t)(uint16_t)raw); break;
    case GGUF_TYPE_INT32: fprintf(out, "%" PRId32, (int32_t)(uint32_t)raw); break;
    case GGUF_TYPE_INT64: fprintf(out, "%" PRId64, (int64_t)raw); break;
    case GGUF_TYPE_BOOL: fputs(raw ? "true" : "false", out); break;
    case GGUF_TYPE_FLOAT32: { uint32_t b = (uint32_t)raw; float f; memcpy(&f, &b, 4); fprintf(out, "%g", f); break; }
    case GGUF_TYPE_FLOAT64: { double d; memcpy(&d, &raw, 8); fprintf(out, "%g", d); break; }
    default: fprintf(out, "%" PRIu64, raw);
    }
}

static size_t elem_size(enum gguf_type t) {
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
    default: return 4;
    }
}

static void print_kv(FILE *out, const struct gguf_kv *kv, const struct inspect_opts *o) {
    fputs("  ", out);
    print_str(out, kv->key, strlen(kv->key), o->max_str, false);
    fputs(": ", out);
    switch (kv->type) {
    case GGUF_TYPE_STRING:
        fputs("string ", out);
        print_str(out, kv->str, (size_t)kv->str_len, o->max_str, true);
        break;
    case GGUF_TYPE_ARRAY:
        fprintf(out, "array[%s] count %" PRIu64 " [", gguf_type_name(kv->arr_type), kv->n);
        for (uint64_t i = 0; i < kv->n && i < o->max_arr; i++) {
            if (i) fputs(", ", out);
            if (kv->arr_type == GGUF_TYPE_STRING)
                print_str(out, kv->arr_str[i], strlen(kv->arr_str[i]), o->max_str, true);
            else
                print_elem(out, kv->arr_type, (const uint8_t *)kv->arr + i * elem_size(kv->arr_type));
        }
        fputs(kv->n > o->max_arr ? ", ...]" : "]", out);
        break;
    case GGUF_TYPE_FLOAT32: case GGUF_TYPE_FLOAT64:
        fprintf(out, "%s %.9g", gguf_type_name(kv->type), kv->v.f64);
        break;
    case GGUF_TYPE_BOOL:
        fprintf(out, "bool %s", kv->v.b ? "true" : "false");
        break;
    case GGUF_TYPE_INT8: case GGUF_TYPE_INT16: case GGUF_TYPE_INT32: case GGUF_TYPE_INT64:
        fprintf(out, "%s %" PRId64, gguf_type_name(kv->type), kv->v.i64);
        break;
    default:
        fprintf(out, "%s %" PRIu64, gguf_type_name(kv->type), kv->v.u64);
    }
    fputc('\n', out);
}

/* Copies a tensor name (at most 63 bytes, gguf.c checked) with non-printable bytes as '?',
 * so the table stays aligned and a hostile name cannot emit escape sequences. */
static void sanitize_name(char *dst, size_t dst_size, const char *s) {
    size_t i = 0;
    for (; s[i] && i + 1 < dst_size; i++) dst[i] = (s[i] >= 0x20 && s[i] < 0x7F) ? s[i] : '?';
    dst[i] = '\0';
}

static void print_tensors(FILE *out, const struct gguf_file *f) {
    uint64_t n_elem_total = 0;
    size_t bytes_total = 0;
    fprintf(out, "tensors: %" PRIu64 "\n", f->n_tensors);
    fprintf(out, "  %5s  %-40s %-6s %-28s %12s %12s\n", "#", "name", "type", "shape", "offset", "bytes");
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor *t = &f->tensors[i];
        const struct ggml_type_traits *tr = ggml_type_traits_get(t->type);
        char shape[96], name[64];
        sanitize_name(name, sizeof name, t->name);
        int o = snprintf(shape, sizeof shape, "{");
        uint64_t n_elem = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            o += snprintf(shape + o, sizeof shape - (size_t)o, "%s%" PRId64, d ? ", " : "", t->ne[d]);
            n_elem *= (uint64_t)t->ne[d];   /* cannot overflow: gguf.c checked the product */
        }
        snprintf(shape + o, sizeof shape - (size_t)o, "}");
        fprintf(out, "  %5" PRIu64 "  %-40s %-6s %-28s %12" PRIu64 " %12zu\n", i, t->name,
                tr ? tr->name : "?", shape, t->offset, t->size_bytes);
        n_elem_total += n_elem;
        bytes_total += t->size_bytes;
    }
    fprintf(out, "total: %" PRIu64 " elements, %zu bytes (%.2f MiB, %.3f bits/element)\n", n_elem_total,
            bytes_total, bytes_total / 1048576.0, n_elem_total ? 8.0 * bytes_total / n_elem_total : 0.0);
}

static void help(FILE *out, const struct cli_common *unused) {
    fprintf(out,
            "usage: coti gguf [options] MODEL.gguf\n"
            "Print a GGUF file's header, metadata and tensor table.\n"
            "  --full          show whole strings and arrays\n"
            "  --no-tensors    metadata only\n"
            "  -h, --help      this text\n");
}

enum { OPT_FULL = CLI_TOOL_CODE, OPT_NO_TENSORS };

static int on_option(void *state, int code, const char *name, const char *arg) {
    struct inspect_opts *o = state;
    if (code == OPT_FULL) { o->max_str = SIZE_MAX; o->max_arr = SIZE_MAX; return 0; }
    if (code == OPT_NO_TENSORS) { o->no_tensors = true; return 0; }
    return -1;
}

int tool_gguf_main(int argc, char **argv) {
    struct inspect_opts o = {.max_str = INSPECT_MAX_STR, .max_arr = INSPECT_MAX_ARR};
    const char *path = NULL;
    static const struct option opts[] = {
        {"full", no_argument, NULL, OPT_FULL},
        {"no-tensors", no_argument, NULL, OPT_NO_TENSORS},
        {0},
    };
    const struct cli_tool tool = {.name = "gguf", .help = help, .opts = opts, .on_option = on_option, .state = &o,
                                  .no_common = true, .max_positional = 1, .positional = &path};
    int pr = cli_parse(NULL, &tool, argc, argv);
    if (pr != CLI_PARSE_OK) return pr == CLI_PARSE_EXIT ? 0 : 1;
    if (!path) { fprintf(stderr, "coti gguf: no file given (`coti gguf --help`)\n"); return 1; }

    struct gguf_file *f;
    char err[512];
    if (gguf_open(&f, path, err, sizeof err) != 0) {
        fprintf(stderr, "coti gguf: %s\n", err);
        return 1;
    }
    printf("file: %s\n", path);
    printf("version: %u, size: %zu bytes, alignment: %zu, data offset: %zu\n", f->version, f->size,
           f->alignment, f->data_offset);
    printf("metadata: %" PRIu64 " keys\n", f->n_kv);
    for (uint64_t i = 0; i < f->n_kv; i++) print_kv(stdout, &f->kv[i], &o);
    if (!o.no_tensors) print_tensors(stdout, f);
    gguf_close(f);
    return fflush(stdout) == 0 ? 0 : 1;
}
