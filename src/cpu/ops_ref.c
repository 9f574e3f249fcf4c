/* ops_ref.c — the reference (plain C) instance of ops_body.h. */
#include "cpu/ops.h"
#include "quant.h"

static inline float vdot(const float *a, const float *b, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}
static inline float vdot_f16(const float *a, const uint16_t *b, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += a[i] * fp16_to_f32(b[i]);
    return s;
}
static inline void vaxpy(float *y, float a, const float *x, int n) { for (int i = 0; i < n; i++) y[i] += a * x[i]; }
static inline void vaxpy_f16(float *y, float a, const uint16_t *x, int n) { for (int i = 0; i < n; i++) y[i] += a * fp16_to_f32(x[i]); }
static inline void vscale(float *y, float a, int n) { for (int i = 0; i < n; i++) y[i] *= a; }

#define OPS_NAME(x) x##_ref
#include "cpu/ops_body.h"

const struct cpu_ops cpu_ops_ref = {attn_one_ref, gdn_head_ref, gdn_chunked_head_ref};
