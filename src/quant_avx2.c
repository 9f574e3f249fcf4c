/* quant_avx2.c — AVX2 + FMA + F16C kernels. For now every type keeps the reference kernels at
 * this level (quant_kernels_get falls back to them); the AVX2 paths follow. */
#include "quant_internal.h"

void quant_kernels_fill_avx2(enum ggml_type t, struct quant_kernels *k) {
    (void)t;
    (void)k;
}
