/* kquants.c — plain-C reference for the 256-element "K" formats Q2_K, Q3_K, Q4_K, Q5_K, Q6_K
 * and the Q8_K activation format (quant-formats.md §4, §5.1, §5.2).
 *
 * Each format has three parts: unpacking a block's integer codes (the bit layout, written once
 * and shared by dequantize and dot), dequantization with llama.cpp's float operation order
 * (dequantize_row_*_K in ggml-quants.c, so results are bit-exact), and a dot product against
 * Q8_K computed as exact integer sums per block, accumulated in f32 in row order.
 *
 * The weight quantizers reproduce the algorithm of llama.cpp's quantize_row_*_K_ref (what
 * llama-quantize runs without an importance matrix): fit a scale (and min) per sub-block by a
 * small weighted least-squares search, quantize the sub-block scales to 4, 6 or 8 bits against
 * a per-block f16 scale, then requantize the values with the rounded scales. Float expressions
 * keep llama.cpp's evaluation order so our files come out the same; that is a convenience (the
 * test-model generator), not a requirement. Q8_K is the activation quantizer and must match. */
#include "quant/quant.h"
#include "quant/internal.h"

#include <math.h>
#include <string.h>

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF   /* a*b+c must round twice, as in llama.cpp's reference */
#endif

/* Sub-blocks whose largest |x| is below this are treated as all zero (llama.cpp's value). */
#define GROUP_MAX_EPS 1e-15f

#define LOAD_BLOCK(b, src, ib) memcpy(&(b), (const uint8_t *)(src) + (ib) * sizeof(b), sizeof(b))
#define STORE_BLOCK(b, dst, ib) memcpy((uint8_t *)(dst) + (ib) * sizeof(b), &(b), sizeof(b))

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Round to nearest, ties to even, by adding 1.5 * 2^23: the sum lands where the f32 spacing is
 * 1, so the FPU's own RNE does the rounding. Exact for |v| < 2^22; larger values (degenerate
 * scales) give some integer, never UB, and every caller clamps the result. */
static inline int nearest_int(float v) {
    float t = v + 12582912.0f;
    uint32_t i;
    memcpy(&i, &t, 4);
    return (int)(i & 0x007FFFFF) - 0x00400000;
}

/* ------------------------------------------------------------------------------------------
 * Scale fitting (llama.cpp: make_qkx2_quants, make_q3_quants, make_qx_quants). */

/* Asymmetric fit for codes 0..nmax: x ≈ scale * L - min_out, with min_out >= 0. Starts from the
 * min/max grid, then tries nstep+1 stretched grids and keeps the one with the lowest weighted
 * error (|.| if use_mad, else squared), solving scale and min by weighted least squares. */
static float fit_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L,
                           float *min_out, uint8_t *Laux, float rmin, float rdelta, int nstep,
                           bool use_mad) {
    float min = x[0], max = x[0];
    float sum_w = w[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;   /* the min is only ever subtracted: codes start at the row's zero */
    if (max == min) {
        memset(L, 0, (size_t)n);
        *min_out = -min;
        return 0.0f;
    }
    float iscale = nmax / (max - min), scale = 1 / iscale, best_error = 0;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)clampi(nearest_int(iscale * (x[i] - min)), 0, nmax);
        float diff = scale * L[i] + min - x[i];
        best_error += w[i] * (use_mad ? fabsf(diff) : diff * diff);
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = clampi(nearest_int(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = (uint8_t)l;
            sum_l += w[i] * l;
            sum_l2 += w[i] * l * l;
            sum_xl += w[i] * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (!(D > 0)) continue;
        float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
        float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
        if (this_min > 0) {   /* a positive offset is not representable: refit scale alone */
            this_min = 0;
            this_scale = sum_xl / sum_l2;
        }
        float cur_error = 0;
        for (int i = 0; i < n; i++) {
            float diff = this_scale * Laux[i] + this_min - x[i];
            cur_error += w[i] * (use_mad ? fabsf(diff) : diff * diff);
        }
        if (cur_error < best_error) {
            memcpy(L, Laux, (size_t)n);
            best_error = cur_error;
            scale = this_scale;
            min = this_min;
        }
    }
    *min_out = -min;
    return scale;
}

/* Symmetric fit for codes -nmax..nmax-1 (Q3_K), weights x^2. Starts from the grid that puts
 * the signed extreme at -nmax, then greedily moves single codes while the weighted
 * least-squares fit (sumlx^2 / suml2) improves. Returns the scale; L gets codes + nmax. */
static float fit_scale_q3(int n, int nmax, const float *x, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) { amax = fabsf(x[i]); max = x[i]; }
    if (amax < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = -nmax / max, sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)l;
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int n_changed = 0;
        for (int i = 0; i < n; i++) {
            float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (!(slx > 0)) continue;
            float sl2 = suml2 - w * L[i] * L[i];
            int new_l = clampi(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
            if (new_l == L[i]) continue;
            slx += w * x[i] * new_l;
            sl2 += w * new_l * new_l;
            if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                L[i] = (int8_t)new_l;
                sumlx = slx;
                suml2 = sl2;
                n_changed++;
            }
        }
        if (!n_changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* Symmetric fit for codes -nmax..nmax-1 (Q6_K), weights x^2: the extreme-at--nmax grid and 18
 * slightly stretched ones, keeping the best least-squares scale. L gets codes + nmax. */
static float fit_scale_q6(int n, int nmax, const float *x, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) { amax = fabsf(x[i]); max = x[i]; }
    if (amax < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = -nmax / max, sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + nmax);
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f, best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
            float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++)
                L[i] = (int8_t)(nmax + clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Pack 256 2-bit codes the Q2_K/Q3_K way: byte 32h + l holds elements 128h + 32j + l in bits
 * 2j..2j+1 (j = 0..3). */
static void pack_2bit(const uint8_t *L, uint8_t *qs) {
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const uint8_t *c = L + 128 * h + l;
            qs[32 * h + l] = (uint8_t)(c[0] | (c[32] << 2) | (c[64] << 4) | (c[96] << 6));
        }
}

/* 2-bit code of element e from qs (Q2_K, Q3_K low bits). */
static inline int code_2bit(const uint8_t *qs, int e) {
    int h = e / 128, j = (e % 128) / 32, l = e % 32;
    return (qs[32 * h + l] >> (2 * j)) & 3;
}

/* ------------------------------------------------------------------------------------------
 * Q2_K: 16 sub-blocks of 16; 4-bit scale and 4-bit min per sub-block; codes 0..3.
 * y = d*(s & 15)*q - dmin*(s >> 4). */

void quant_dequantize_q2_K_ref(const void *src, float *dst, int64_t n) {
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        struct block_q2_K b;
        LOAD_BLOCK(b, src, ib);
        float d = fp16_to_f32(b.d), dmin = fp16_to_f32(b.dmin);
        float *y = dst + ib * QK_K;
        for (int t = 0; t < 16; t++) {
            float dl = d * (b.scales[t] & 0xF), ml = dmin * (b.scales[t] >> 4);
            for (int e = 16 * t; e < 16 * t + 16; e++) y[e] = dl * code_2bit(b.qs, e) - ml;
        }
    }
}

void quant_quantize_q2_K_ref(const float *x, void *dst, int64_t n) {
    const float q4scale = 15.0f;
    for (int64_t ib = 0; ib < n / QK_K; ib++, x += QK_K) {
        struct block_q2_K b;
        uint8_t L[QK_K], Laux[16];
        float w[16], mins[16], scales[16], max_scale = 0, max_min = 0;
        for (int j = 0; j < 16; j++) {
            for (int l = 0; l < 16; l++) w[l] = fabsf(x[16 * j + l]);
            scales[j] = fit_scale_min(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], Laux, -0.5f,
                                      0.1f, 15, true);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        memset(b.scales, 0, sizeof b.scales);
        if (max_scale > 0) {
            float iscale = q4scale / max_scale;
            for (int j = 0; j < 16; j++)
                b.scales[j] = (uint8_t)(clampi(nearest_int(iscale * scales[j]), 0, 15));
            b.d = f32_to_fp16(max_scale / q4scale);
        } else {
            b.d = f32_to_fp16(0.0f);
        }
        if (max_min > 0) {
            float iscale = q4scale / max_min;
            for (int j = 0; j < 16; j++)
                b.scales[j] |= (uint8_t)(clampi(nearest_int(iscale * mins[j]), 0, 15) << 4);
            b.dmin = f32_to_fp16(max_min / q4scale);
        } else {
            b.dmin = f32_to_fp16(0.0f);
        }
        /* requantize with the scales as stored */
        for (int j = 0; j < 16; j++) {
            float d = fp16_to_f32(b.d) * (b.scales[j] & 0xF);
            if (!d) continue;
            float dm = fp16_to_f32(b.dmin) * (b.scales[j] >> 4);
            for (int i = 0; i < 16; i++)
                L[16 * j + i] = (uint8_t)clampi(nearest_int((x[16 * j + i] + dm) / d), 0, 3);
        }
        pack_2bit(L, b.qs);
        STORE_BLOCK(b, dst, ib);
    }
}

float quant_dot_q2_K_ref(const void *w, const void *x, int64_t n) {
    float sumf = 0.0f;
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        struct block_q2_K bw;
        struct block_q8_K bx;
        LOAD_BLOCK(bw, w, ib);
        LOAD_BLOCK(bx, x, ib);
        int isum = 0, msum = 0;
        for (int t = 0; t < 16; t++) {
            int s = 0;
            for (int e = 16 * t; e < 16 * t + 16; e++) s += code_2bit(bw.qs, e) * bx.qs[e];
            isum += (bw.scales[t] & 0xF) * s;
            msum += (bw.scales[t] >> 4) * bx.bsums[t];
        }
        float dall = bx.d * fp16_to_f32(bw.d), dmin = bx.d * fp16_to_f32(bw.dmin);
        sumf += dall * (float)isum - dmin * (float)msum;
    }
    return sumf;
}

/* ------------------------------------------------------------------------------------------
 * Q3_K: 16 sub-blocks of 16; signed 6-bit scales; codes -4..3 (2 low bits in qs, the high bit
 * in hmask with "bit clear" meaning -4). y = d*sc*q. */

static inline int q3_code(const struct block_q3_K *b, int e) {
    int h = e / 128, j = (e % 128) / 32, l = e % 32;
    return code_2bit(b->qs, e) - (((b->hmask[l] >> (4 * h + j)) & 1) ? 0 : 4);
}

void quant_dequantize_q3_K_ref(const void *src, float *dst, int64_t n) {
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        struct block_q3_K b;
        LOAD_BLOCK(b, src, ib);
        float d = fp16_to_f32(b.d), *y = dst + ib * QK_K;
        for (int t = 0; t < 16; t++) {
            float dl = d * quant_k3_scale(t, b.scales);
            for (int e = 16 * t; e < 16 * t + 16; e++) y[e] = dl * q3_code(&b, e);
        }
    }
}

void quant_quantize_q3_K_ref(const float *x, void *dst, int64_t n) {
    for (int64_t ib = 0; ib < n / QK_K; ib++, x += QK_K) {
        struct block_q3_K b;
        int8_t L[QK_K];
        float scales[16], max_scale = 0, amax = 0;
        for (int j = 0; j < 16; j++) {
            scales[j] = fit_scale_q3(16, 4, x + 16 * j, L + 16 * j);
            if (fabsf(scales[j]) > amax) { amax = fabsf(scales[j]); max_scale = scales[j]; }
        }
        memset(b.scales, 0, sizeof b.scales);
        if (max_scale != 0) {
            float iscale = -32.0f / max_scale;   /* signed extreme -> -32 */
            for (int j = 0; j < 16; j++) {
                int l = clampi(nearest_int(iscale * scales[j]), -32, 31) + 32;
                if (j < 8) b.scales[j] = (uint8_t)(l & 0xF);
                else b.scales[j - 8] |= (uint8_t)((l & 0xF) << 4);
                b.scales[8 + j % 4] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
            }
            b.d = f32_to_fp16(1 / iscale);
        } else {
            b.d = f32_to_fp16(0.0f);
        }
        for (int j = 0; j < 16; j++) {
            float d = fp16_to_f32(b.d) * quant_k3_scale(j, b.scales);
            if (!d) continue;
            for (int i = 0; i < 16; i++)
                L[16 * j + i] = (int8_t)(clampi(nearest_int(x[16 * j + i] / d), -4, 3) + 4);
        }
        /* codes 4..7 set the high bit (element e: byte e % 32, bit e / 32) and keep 0..3 */
        uint8_t low[QK_K];
        memset(b.hmask, 0, sizeof b.hmask);
        for (int e = 0; e < QK_K; e++) {
            int c = L[e];
            if (c > 3) {
                b.hmask[e % 32] |= (uint8_t)(1u << (e / 32));
                c -= 4;
            }
            low[e] = (uint8_t)c;
        }
        pack_2bit(low, b.qs);
        STORE_BLOCK(b, dst, ib);
    }
}

float quant_dot_q3_K_ref(const void *w, const void *x, int64_t n) {
    float sumf = 0.0f;
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        struct block_q3_K bw;
        struct block_q8_K bx;
        LOAD_BLOCK(bw, w, ib);
        LOAD_BLOCK(bx, x, ib);
        int isum = 0;
        for (int t = 0; t < 16; t++) {
            int s = 0;
            for (int e = 16 * t; e < 16 * t + 16; e++) s += q3_code(&bw, e) * bx.qs[e];
            isum += quant_k3_scale(t, bw.scales) * s;
        }
        sumf += (fp16_to_f32(bw.d) * bx.d) * (float)isum;
    }
    return sumf;
}

/* ------------------------------------------------------------------------------------------
 * Q4_K / Q5_K: 8 sub-blocks of 32; 6-bit scale and min each; codes 0..15 (Q5_K: 0..31 with
 * the 5th bit of element 32j + l in bit j of qh[l]). y = d*sc*q - dmin*mn. */

/* Nibble of element e: 64-element chunk c = e / 64 uses qs[32c..32c+31], low nibbles first. */
static inline int k4_nibble(const uint8_t *qs, int e) {
    int c = e / 64, l = e % 32;
    return (e % 64) < 32 ? (qs[32 * c + l] & 0xF) : (qs[32 * c + l] >> 4);
}

static inline int q5k_code(const struct block_q5_K *b, int e) {
    return k4_nibble(b->qs, e) + 16 * ((b->qh[e % 32] >> (e / 32)) & 1);
}

void quant_dequantize_q4_K_ref(const void *src, float *dst, int64_t n) {
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        struct block_q4_K b;
        LOAD_BLOCK(b, src, ib);
        float d = fp16_to_f32(b.d), dmin = fp16_to_f32(b.dmin), *y = dst + ib * QK_K;
        for (int j = 0; j < 8; j++) {
            int sc, mn;
            quant_k4_scale_min(j, b.scales, &sc, &mn);
            float d1 = d * sc, m1 = dmin * mn;   /* formed first, as llama.cpp does */
            for (int e = 32 * j; e < 32 * j + 32; e++) y[e] = d1 * k4_nibble(b.qs, e) - m1;
        }
    }
}

void quant_dequantize_q5_K_ref(const void *src, float *dst, int64_t n) {
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        struct block_q5_K b;
        LOAD_BLOCK(b, src, ib);
        float d = fp16_to_f32(b.d), dmin = fp16_to_f32(b.dmin), *y = dst + ib * QK_K;
        for (int j = 0; j < 8; j++) {
            int sc, mn;
            quant_k4_scale_min(j, b.scales, &sc, &mn);
            float d1 = d * sc, m1 = dmin * mn;
            for (int e = 32 * j; e < 32 * j + 32; e++) y[e] = d1 * q5k_code(&b, e) - m1;
        }
    }
}

/* Shared by Q4_K (nmax 15) and Q5_K (nmax 31): fit each sub-block, store 6-bit scales/mins
 * and the f16 block scales, then requantize to codes 0..nmax in L. */
static void quantize_k4_scales(const float *x, int nmax, float rmin, int nstep, uint8_t *scales_out,
                               fp16_t *d_out, fp16_t *dmin_out, uint8_t *L) {
    uint8_t Laux[32];
    float w[32], mins[8], scales[8], max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        const float *xs = x + 32 * j;
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += xs[l] * xs[l];
        float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) w[l] = av_x + fabsf(xs[l]);
        scales[j] = fit_scale_min(32, nmax, xs, w, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep,
                                  false);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
    float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    memset(scales_out, 0, K_SCALE_SIZE);
    for (int j = 0; j < 8; j++) {
        /* llama.cpp stores through uint8_t before clamping to 63; keep that wrap */
        uint8_t ls = (uint8_t)nearest_int(inv_scale * scales[j]);
        uint8_t lm = (uint8_t)nearest_int(inv_min * mins[j]);
        if (ls > 63) ls = 63;
        if (lm > 63) lm = 63;
        if (j < 4) {
            scales_out[j] = ls;
            scales_out[j + 4] = lm;
        } else {
            scales_out[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
            scales_out[j - 4] |= (uint8_t)((ls >> 4) << 6);
            scales_out[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    *d_out = f32_to_fp16(max_scale / 63.0f);
    *dmin_out = f32_to_fp16(max_min / 63.0f);
    for (int j = 0; j < 8; j++) {
        int sc, mn;
        quant_k4_scale_min(j, scales_out, &sc, &mn);
        float d = fp16_to_f32(*d_out) * sc;
        if (!d) continue;
        float dm = fp16_to_f32(*dmin_out) * mn;
        for (int i = 0; i < 32; i++)
            L[32 * j + i] = (uint8_t)clampi(nearest_int((x[32 * j + i] + dm) / d), 0, nmax);
    }
}

/* nstep: the scale search's stretched grids (20: the reference; -1: the min/max grid alone) */
static void quantize_q4_K(const float *x, void *dst, int64_t n, int nstep) {
    for (int64_t ib = 0; ib < n / QK_K; ib++, x += QK_K) {
        struct block_q4_K b;
        uint8_t L[QK_K];
        quantize_k4_scales(x, 15, -1.0f, nstep, b.scales, &b.d, &b.dmin, L);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                b.qs[32 * c + l] = (uint8_t)(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
        STORE_BLOCK(b, dst, ib);
    }
}

void quant_quantize_q4_K_ref(const float *x, void *dst, int64_t n) { quantize_q4_K(x, dst, n, 20); }
void quant_quantize_q4_K_grid(const float *x, void *dst, int64_t n) { quantize_q4_K(x, dst, n, -1); }

void quant_quantize_q5_K_ref(const float *x, void *dst, int64_t n) {
    for (int64_t ib = 0; ib < n / QK_K; ib++, x += QK_K) {
        struct block_q5_K b;
        uint8_t L[QK_K];
        quantize_k4_scales(x, 31, -0.5f, 15, b.scales, &b.d, &b.dmin, L);
        memset(b.qh, 0, sizeof b.qh);
        for (int e = 0; e < QK_K; e++)
            if (L[e] > 15) b.qh[e % 32] |= (uint8_t)(1u << (e / 32));
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                b.qs[32 * c + l] = (uint8_t)((L[64 * c + l] & 0xF) | ((L[64 * c + 32 + l] & 0xF) << 4));
        STORE_BLOCK(b, dst, ib);
    }
}

/* Σ_j sc_j Σ_{e in j} code_e q_e and Σ_j mn_j (bsums[2j] + bsums[2j+1]) for Q4_K/Q5_K. */
static void k4_int_sums(const uint8_t *scales, const int *code, const struct block_q8_K *bx,
                        int *isum, int *msum) {
    *isum = *msum = 0;
    for (int j = 0; j < 8; j++) {
        int sc, mn, s = 0;
        quant_k4_scale_min(j, scales, &sc, &mn);
        for (int e = 32 * j; e < 32 * j + 32; e++) s += code[e] * bx->qs[e];
        *isum += sc * s;
        *msum += mn * (bx->bsums[2 * j] + bx->bsums[2 * j + 1]);
    }
}

float quant_dot_q4_K_ref(const void *w, const void *x, int64_t n) {
    float sumf = 0.0f;
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        struct block_q4_K bw;
        struct block_q8_K bx;
        LOAD_BLOCK(bw, w, ib);
        LOAD_BLOCK(bx, x, ib);
        int code[QK_K], isum, msum;
        for (int e = 0; e < QK_K; e++) code[e] = k4_nibble(bw.qs, e);
        k4_int_sums(bw.scales, code, &bx, &isum, &msum);
        float d = fp16_to_f32(bw.d) * bx.d, dmin = fp16_to_f32(bw.dmin) * bx.d;
        sumf += d * (float)isum - dmin * (float)msum;
    }
    return sumf;
}

float quant_dot_q5_K_ref(const void *w, const void *x, int64_t n) {
    float sumf = 0.0f;
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        struct block_q5_K bw;
        struct block_q8_K bx;
        LOAD_BLOCK(bw, w, ib);
        LOAD_BLOCK(bx, x, ib);
        int code[QK_K], isum, msum;
        for (int e = 0; e < QK_K; e++) code[e] = q5k_code(&bw, e);
        k4_int_sums(bw.scales, code, &bx, &isum, &msum);
        float d = fp16_to_f32(bw.d) * bx.d, dmin = fp16_to_f32(bw.dmin) * bx.d;
        sumf += d * (float)isum - dmin * (float)msum;
    }
    return sumf;
}

/* ------------------------------------------------------------------------------------------
 * Q6_K: 16 sub-blocks of 16; int8 scales; codes -32..31 (4 low bits in ql, 2 high in qh).
 * y = d*sc*q. */

static inline int q6_code(const struct block_q6_K *b, int e) {
    int h = e / 128, g = (e % 128) / 32, l = e % 32;
    int lowbyte = b->ql[64 * h + l + 32 * (g & 1)];
    int lo = g < 2 ? (lowbyte & 0xF) : (lowbyte >> 4);
    int hi = (b->qh[32 * h + l] >> (2 * g)) & 3;
    return (lo | (hi << 4)) - 32;
}

void quant_dequantize_q6_K_ref(const void *src, float *dst, int64_t n) {
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        struct block_q6_K b;
        LOAD_BLOCK(b, src, ib);
        float d = fp16_to_f32(b.d), *y = dst + ib * QK_K;
        for (int e = 0; e < QK_K; e++) y[e] = d * b.scales[e / 16] * q6_code(&b, e);
    }
}

void quant_quantize_q6_K_ref(const float *x, void *dst, int64_t n) {
    for (int64_t ib = 0; ib < n / QK_K; ib++, x += QK_K) {
        struct block_q6_K b;
        int8_t L[QK_K];
        float scales[16], max_scale = 0, max_abs_scale = 0;
        for (int j = 0; j < 16; j++) {
            scales[j] = fit_scale_q6(16, 32, x + 16 * j, L + 16 * j);
            if (fabsf(scales[j]) > max_abs_scale) {
                max_abs_scale = fabsf(scales[j]);
                max_scale = scales[j];
            }
        }
        if (max_abs_scale < GROUP_MAX_EPS) {
            memset(&b, 0, sizeof b);
            STORE_BLOCK(b, dst, ib);
            continue;
        }
        float iscale = -128.0f / max_scale;   /* signed extreme -> -128 */
        b.d = f32_to_fp16(1 / iscale);
        for (int j = 0; j < 16; j++)
            b.scales[j] = (int8_t)clampi(nearest_int(iscale * scales[j]), -128, 127);
        for (int j = 0; j < 16; j++) {
            float d = fp16_to_f32(b.d) * b.scales[j];
            if (!d) continue;
            for (int i = 0; i < 16; i++)
                L[16 * j + i] = (int8_t)(clampi(nearest_int(x[16 * j + i] / d), -32, 31) + 32);
        }
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 32; l++) {
                const int8_t *c = L + 128 * h + l;   /* codes + 32, in 0..63 */
                b.ql[64 * h + l] = (uint8_t)((c[0] & 0xF) | ((c[64] & 0xF) << 4));
                b.ql[64 * h + l + 32] = (uint8_t)((c[32] & 0xF) | ((c[96] & 0xF) << 4));
                b.qh[32 * h + l] = (uint8_t)((c[0] >> 4) | ((c[32] >> 4) << 2) |
                                             ((c[64] >> 4) << 4) | ((c[96] >> 4) << 6));
            }
        STORE_BLOCK(b, dst, ib);
    }
}

float quant_dot_q6_K_ref(const void *w, const void *x, int64_t n) {
    float sumf = 0.0f;
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        struct block_q6_K bw;
        struct block_q8_K bx;
        LOAD_BLOCK(bw, w, ib);
        LOAD_BLOCK(bx, x, ib);
        int isum = 0;
        for (int t = 0; t < 16; t++) {
            int s = 0;
            for (int e = 16 * t; e < 16 * t + 16; e++) s += q6_code(&bw, e) * bx.qs[e];
            isum += bw.scales[t] * s;
        }
        sumf += (fp16_to_f32(bw.d) * bx.d) * (float)isum;
    }
    return sumf;
}

/* ------------------------------------------------------------------------------------------
 * Q8_K (activations, §5.1): per 256 values, iscale = -127 / (signed value of largest |x|,
 * first on ties); codes = min(127, RNE(iscale * x)); d = 1/iscale stored as f32 (negative when
 * that value is positive: codes carry the opposite sign); bsums = sums of 16 codes. An all-zero
 * block gets d = 0 and zero codes and sums (llama.cpp leaves its bsums unwritten). For finite
 * input |iscale * x| <= 127 up to rounding, so the clamps below only decide the degenerate
 * blocks whose max is so small that iscale overflows (their d is 0, so their codes carry no
 * weight): there ±inf -> ±127 and NaN (0 * inf) -> 0, which the SIMD versions reproduce. */

void quant_dequantize_q8_K_ref(const void *src, float *dst, int64_t n) {
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        struct block_q8_K b;
        LOAD_BLOCK(b, src, ib);
        for (int e = 0; e < QK_K; e++) dst[ib * QK_K + e] = b.d * b.qs[e];
    }
}

void quant_quantize_q8_K_ref(const float *x, void *dst, int64_t n) {
    for (int64_t ib = 0; ib < n / QK_K; ib++, x += QK_K) {
        struct block_q8_K b;
        float max = 0, amax = 0;
        for (int e = 0; e < QK_K; e++)
            if (fabsf(x[e]) > amax) { amax = fabsf(x[e]); max = x[e]; }
        memset(&b, 0, sizeof b);
        if (amax != 0) {
            float iscale = -127.0f / max;
            for (int e = 0; e < QK_K; e++) {
                float v = iscale * x[e];
                b.qs[e] = (int8_t)(v != v ? 0 : v >= 127 ? 127 : v <= -127 ? -127 : nearest_int(v));
            }
            for (int t = 0; t < 16; t++) {
                int s = 0;
                for (int i = 0; i < 16; i++) s += b.qs[16 * t + i];
                b.bsums[t] = (int16_t)s;
            }
            b.d = 1 / iscale;
        }
        STORE_BLOCK(b, dst, ib);
    }
}

/* Q8_K is an activation format; its self-dot exists so every supported type has one. */
float quant_dot_q8_K_ref(const void *w, const void *x, int64_t n) {
    float sumf = 0.0f;
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        struct block_q8_K bw, bx;
        LOAD_BLOCK(bw, w, ib);
        LOAD_BLOCK(bx, x, ib);
        int isum = 0;
        for (int e = 0; e < QK_K; e++) isum += bw.qs[e] * bx.qs[e];
        sumf += (bw.d * bx.d) * (float)isum;
    }
    return sumf;
}
