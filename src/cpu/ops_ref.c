/* ops_ref.c — the reference (plain C) instance of ops_body.h. */
#include "cpu/ops.h"
#include "quant/quant.h"

#include <math.h>

static inline float vdot(const float *a, const float *b, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}
static inline void vaxpy(float *y, float a, const float *x, int n) { for (int i = 0; i < n; i++) y[i] += a * x[i]; }
static inline void vscale(float *y, float a, int n) { for (int i = 0; i < n; i++) y[i] *= a; }
static inline void vmul(float *y, const float *x, int n) { for (int i = 0; i < n; i++) y[i] *= x[i]; }
/* y = a y + b x */
static inline void vscale_add(float *y, float a, float b, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] = a * y[i] + b * x[i];
}
/* the quant reference's dequantization, row by row */
static inline void cvt_rows_as(enum ggml_type t, float *y, const uint8_t *x, size_t stride, int nb, int n) {
    for (int c = 0; c < nb; c++) quant_dequantize_row_ref(t, x + (size_t)c * stride, y + (size_t)c * n, n);
}
static inline void cvt_rows_f16(float *y, const uint8_t *x, size_t stride, int nb, int n) {
    cvt_rows_as(GGML_TYPE_F16, y, x, stride, nb, n);
}
static inline void cvt_rows_bf16(float *y, const uint8_t *x, size_t stride, int nb, int n) {
    cvt_rows_as(GGML_TYPE_BF16, y, x, stride, nb, n);
}
static inline void cvt_rows_q8_0(float *y, const uint8_t *x, size_t stride, int nb, int n) {
    cvt_rows_as(GGML_TYPE_Q8_0, y, x, stride, nb, n);
}
static inline void cvt_rows_q4_0(float *y, const uint8_t *x, size_t stride, int nb, int n) {
    cvt_rows_as(GGML_TYPE_Q4_0, y, x, stride, nb, n);
}
static inline void vdot_rows(const float *q, const float *k, int nb, int n, float scale, float *out) {
    for (int c = 0; c < nb; c++) out[c] = vdot(q, k + (size_t)c * n, n) * scale;
}
static inline void vdot2_rows(const float *a, const float *b, const float *k, int nb, int n, float *oa, float *ob) {
    vdot_rows(a, k, nb, n, 1.0f, oa);
    vdot_rows(b, k, nb, n, 1.0f, ob);
}
static inline void vaxpy_rows(float *y, const float *a, const float *x, int nb, int n) {
    for (int c = 0; c < nb; c++) vaxpy(y, a[c], x + (size_t)c * n, n);
}
static inline float vmax(const float *x, int n, float init) {
    float m = init;
    for (int i = 0; i < n; i++) if (x[i] > m) m = x[i];
    return m;
}
/* x[i] = e^(x[i] - m); returns the sum */
static inline float vexp_shift(float *x, int n, float m) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += (x[i] = expf(x[i] - m));
    return s;
}
static void silu_ref(const float *x, float *y, int n) { for (int i = 0; i < n; i++) y[i] = x[i] / (1.0f + expf(-x[i])); }
static void sigmoid_ref(const float *x, float *y, int n) { for (int i = 0; i < n; i++) y[i] = 1.0f / (1.0f + expf(-x[i])); }
static void conv4_token_ref(const float *x, int n_ch, const float *w, float *state, float *y) {
    conv4_channels(x, 0, n_ch, w, state, y);
}
static double sum_sq_ref(const float *x, int n) {
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += (double)x[i] * x[i];
    return sum;
}
static void to_f16_ref(const float *x, uint16_t *y, int n) { for (int i = 0; i < n; i++) y[i] = f32_to_fp16(x[i]); }
static double exp_sum_ref(const float *x, int n, float m) {
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += exp((double)x[i] - m);
    return sum;
}
static int argmax_ref(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[best]) best = i;
    return best;
}

#define OPS_NAME(x) x##_ref
#include "cpu/ops_body.h"

const struct cpu_ops cpu_ops_ref = {attn_tokens_ref, gdn_head_ref, gdn_chunked_head_ref,
                                    silu_ref, sigmoid_ref, conv4_token_ref, sum_sq_ref, to_f16_ref,
                                    exp_sum_ref, argmax_ref};
