/* bench_quant.c — gemm kernel benchmark per type, CPU level and shape (style.md §6).
 *
 * Build and run (from the repository root, after `make build/libcoti.a`):
 *   cc -std=c11 -O2 -D_GNU_SOURCE -Isrc bench/bench_quant.c build/libcoti.a -lm -pthread \
 *      -o build/bench_quant && build/bench_quant [filter]
 * `filter` (optional) keeps only the types whose name contains it, e.g. `q8_0`.
 *
 * Times the very kernels the engine ships (quant_kernels_get), one thread, on activations
 * already converted to vec_dot_type.
 * Every (type, level, shape) is first checked against the reference dot on a sample of
 * outputs; a wrong kernel is reported and not timed. Each configuration runs twice:
 *   hot  — the same weight buffer every run (it stays in L2/L3 when it fits, as a small
 *          model's weights do in this machine's 300 MB L3);
 *   cold — runs rotate through copies of the weights spanning more than 1 GiB, so each run
 *          reads its weights from DRAM.
 * Reported: median and 10th/90th percentile of the run time in µs, and GB/s of weight bytes
 * at the median and at the 10th percentile (the better guide on a machine shared with other
 * work); a memcpy measured in the same run (from DRAM, L3 and L2) gives the scale.
 * Where the level has a packed layout (packed.c; what the CPU backend runs), it is timed
 * too, as level "+pk". Shapes are n_in x n_out; a shape whose n_in is not a
 * multiple of the type's block is skipped (K-quants need n_in % 256 == 0). */
#include "quant/quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define POOL_BYTES (1100u << 20)   /* > 3x the 300 MB L3 of the machine measured */
#define MIN_RUNS 7
#define MAX_RUNS 400
#define MIN_TIME_US 100000         /* per configuration */
#define REF_MAX_MACS 2e7           /* the scalar reference is skipped above this much work */

/* CPU time of this thread in µs (ns resolution). Not wall time: this bench runs on machines
 * shared with other work (the 2-vCPU development VM runs at load 4-6), where wall time mostly
 * measures how long the thread waited for a CPU. Cache and memory-bandwidth interference
 * from the other tenants still shows, hence the p10 column. */
static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static uint64_t rng = 1;
static float frand(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((int64_t)(rng >> 11) - (1ll << 52)) * 0x1p-52f;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

struct stats { double med, p10, p90; };

static struct stats summarize(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return (struct stats){t[n / 2], t[n / 10], t[(n * 9) / 10]};
}

/* memcpy bandwidth, counting the bytes read (as the gemm lines count weight bytes). The
 * destination is read back so the copy cannot be optimised away. */
static double copy_gbps(const uint8_t *pool, size_t pool_bytes, size_t bytes, bool cold) {
    uint8_t *dst = malloc(bytes);
    size_t copies = cold ? pool_bytes / bytes : 1;
    double t[32];
    unsigned sink = 0;
    for (int i = 0; i < 32; i++) {
        const uint8_t *src = pool + (size_t)i % copies * bytes;
        double t0 = now_us();
        memcpy(dst, src, bytes);
        t[i] = now_us() - t0;
        sink += dst[(size_t)i * 4099 % bytes];
    }
    free(dst);
    struct stats s = summarize(t, 32);
    if (sink == 0xFFFFFFFFu) printf("#\n");
    return (double)bytes / s.med / 1e3;
}

/* Spot-check the kernel against the reference dot: returns false if any sampled output is
 * off by more than the f32-summation bound (as in tests/test_quant.c, with Σ|terms|
 * estimated from the dequantized rows). */
static bool validate(enum ggml_type t, const struct quant_kernels *k, int64_t n, const uint8_t *w,
                     size_t rb, int64_t n_out, const uint8_t *x, size_t xrb, int64_t n_tok, float *y) {
    const struct ggml_type_traits *tr = ggml_type_traits_get(t);
    k->gemm(n, w, rb, n_out, x, xrb, n_tok, y, n_out);
    float *wf = malloc((size_t)n * 4), *xf = malloc((size_t)n * 4);
    bool ok = true;
    for (int s = 0; s < 24 && ok; s++) {
        int64_t o = (int64_t)((uint64_t)(s * 7919) % (uint64_t)n_out), tt = s % n_tok;
        float want = quant_vec_dot_ref(t, w + o * rb, x + tt * xrb, n);
        quant_dequantize_row_ref(t, w + o * rb, wf, n);
        quant_dequantize_row_ref(tr->vec_dot_type, x + tt * xrb, xf, n);
        double scale = 0;
        for (int64_t i = 0; i < n; i++) scale += fabs((double)wf[i] * xf[i]);
        /* 4x the summation bound: Σ|w x| underestimates Σ|terms| for the formats with mins */
        double tol = 8.0 * (double)(n / tr->block_elems + 16) * 0x1p-24 * scale + 1e-30;
        if (fabs((double)y[tt * n_out + o] - want) > tol) {
            printf("  WRONG %s: y[%ld][%ld] = %.9g, ref %.9g\n", tr->name, (long)tt, (long)o,
                   y[tt * n_out + o], want);
            ok = false;
        }
    }
    free(wf);
    free(xf);
    return ok;
}

/* rb == 0: the pool holds packed copies (k->packed_gemm) */
static void run_gemm(const struct quant_kernels *k, int64_t n, const uint8_t *w, size_t rb, int64_t n_out,
                     const uint8_t *x, size_t xrb, int64_t n_tok, float *y) {
    if (rb) k->gemm(n, w, rb, n_out, x, xrb, n_tok, y, n_out);
    else k->packed_gemm(n, w, n_out, x, xrb, n_tok, y, n_out);
}

static struct stats time_gemm(const struct quant_kernels *k, int64_t n, const uint8_t *pool,
                              size_t wbytes, size_t copies, size_t rb, int64_t n_out,
                              const uint8_t *x, size_t xrb, int64_t n_tok, float *y) {
    double t[MAX_RUNS], total = 0;
    int runs = 0;
    for (int i = 0; i < 2; i++) run_gemm(k, n, pool, rb, n_out, x, xrb, n_tok, y);   /* warm-up */
    while (runs < MAX_RUNS && (runs < MIN_RUNS || total < MIN_TIME_US)) {
        const uint8_t *w = pool + (size_t)runs % copies * wbytes;
        double t0 = now_us();
        run_gemm(k, n, w, rb, n_out, x, xrb, n_tok, y);
        double dt = now_us() - t0;
        total += dt;
        t[runs++] = dt;
    }
    return summarize(t, runs);
}

int main(int argc, char **argv) {
    const char *filter = argc > 1 ? argv[1] : NULL;
    static const enum ggml_type types[] = {
        GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_Q5_0, GGML_TYPE_F16,
        GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_1, GGML_TYPE_Q5_K, GGML_TYPE_BF16,
        GGML_TYPE_F32, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K,
    };
    static const int64_t shapes[][2] = {{384, 1152}, {1152, 384}, {384, 16384}, {4096, 4096}};
    static const int64_t toks[] = {1, 4, 64};
    static const char *lvl[] = {"ref", "avx2", "avx512"};
    enum quant_cpu_level top = quant_cpu_level_detect();

    uint8_t *pool = malloc(POOL_BYTES);
    if (!pool) { fprintf(stderr, "no memory for the pool\n"); return 1; }
    for (size_t i = 0; i < POOL_BYTES; i += 4096) pool[i] = (uint8_t)i;   /* fault it in */
    printf("# bench_quant: level %s, single thread, thread CPU time, median [p10 p90] of >= %d runs / %d ms\n",
           lvl[top], MIN_RUNS, MIN_TIME_US / 1000);
    printf("# memcpy: cold %.1f GB/s (64 MiB blocks of a 1.1 GiB pool), L3 %.1f GB/s (16 MiB), "
           "L2 %.1f GB/s (1 MiB)\n",
           copy_gbps(pool, POOL_BYTES, 64u << 20, true), copy_gbps(pool, POOL_BYTES, 16u << 20, false),
           copy_gbps(pool, POOL_BYTES, 1u << 20, false));
    printf("%-6s %-9s %-11s %4s | %9s %19s %6s %6s | %9s %19s %6s %6s\n", "type", "level", "shape",
           "tok", "hot us", "[p10 p90]", "GB/s", "@p10", "cold us", "[p10 p90]", "GB/s", "@p10");

    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        enum ggml_type t = types[ti];
        const struct ggml_type_traits *tr = ggml_type_traits_get(t);
        if (filter && !strstr(tr->name, filter)) continue;
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            int64_t n = shapes[si][0], n_out = shapes[si][1];
            size_t rb = ggml_row_size(t, n), xrb = ggml_row_size(tr->vec_dot_type, n);
            if (!rb) continue;
            size_t wbytes = rb * (size_t)n_out, copies = POOL_BYTES / wbytes;
            /* one quantized matrix, copied through the pool */
            float *src = malloc((size_t)n * 4);
            for (int64_t o = 0; o < n_out; o++) {
                for (int64_t i = 0; i < n; i++) src[i] = frand() * 0.05f;
                quant_quantize_row_ref(t, src, pool + o * rb, n);
            }
            for (size_t c = 1; c < copies; c++) memcpy(pool + c * wbytes, pool, wbytes);
            int64_t tmax = toks[sizeof toks / sizeof toks[0] - 1];
            float *xf = malloc((size_t)(n * tmax) * 4);
            uint8_t *x = malloc(xrb * (size_t)tmax);
            float *y = malloc((size_t)(n_out * tmax) * 4);
            for (int64_t i = 0; i < n * tmax; i++) xf[i] = frand() * 2.0f;
            for (int level = 0; level <= (int)top; level++) {
                struct quant_kernels k;
                quant_kernels_get(t, (enum quant_cpu_level)level, &k);
                if (level > 0) {   /* a level without its own kernel repeats the one below */
                    struct quant_kernels kb;
                    quant_kernels_get(t, (enum quant_cpu_level)(level - 1), &kb);
                    if (kb.gemm == k.gemm) continue;
                }
                for (int64_t tk = 0; tk < tmax; tk++) k.from_float(xf + tk * n, x + tk * xrb, n);
                if (!validate(t, &k, n, pool, rb, n_out, x, xrb, 4, y)) continue;
                /* the row-major kernel, then (where this level has one) the packed layout the
                 * CPU backend uses, packed copies filling the same pool */
                size_t psize = k.packed_size && level == (int)top ? k.packed_size(n, n_out) : 0;   /* last: it overwrites the pool */
                for (int packed = 0; packed <= (psize > 0); packed++) {
                    if (packed) {
                        uint8_t *one = malloc(psize);
                        k.pack(pool, rb, n, n_out, one);
                        for (size_t c = 0; c < POOL_BYTES / psize; c++) memcpy(pool + c * psize, one, psize);
                        free(one);
                    }
                    size_t bytes = packed ? psize : wbytes, n_copies = POOL_BYTES / bytes, stride = packed ? 0 : rb;
                    for (size_t j = 0; j < sizeof toks / sizeof toks[0]; j++) {
                        int64_t n_tok = toks[j];
                        if (level == 0 && (double)n * n_out * n_tok > REF_MAX_MACS) continue;
                        struct stats hot = time_gemm(&k, n, pool, bytes, 1, stride, n_out, x, xrb, n_tok, y);
                        struct stats cold = time_gemm(&k, n, pool, bytes, n_copies, stride, n_out, x, xrb, n_tok, y);
                        char shape[32], name[16];
                        snprintf(shape, sizeof shape, "%ldx%ld", (long)n, (long)n_out);
                        snprintf(name, sizeof name, "%s%s", lvl[level], packed ? "+pk" : "");
                        printf("%-6s %-9s %-11s %4ld | %9.1f [%8.1f %8.1f] %6.1f %6.1f | %9.1f [%8.1f %8.1f] %6.1f %6.1f\n",
                               tr->name, name, shape, (long)n_tok, hot.med, hot.p10, hot.p90,
                               (double)wbytes / hot.med / 1e3, (double)wbytes / hot.p10 / 1e3, cold.med,
                               cold.p10, cold.p90, (double)wbytes / cold.med / 1e3,
                               (double)wbytes / cold.p10 / 1e3);
                        fflush(stdout);
                    }
                }
            }
            free(src);
            free(xf);
            free(x);
            free(y);
        }
    }
    free(pool);
    return 0;
}
