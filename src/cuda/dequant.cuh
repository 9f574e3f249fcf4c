/* dequant.cuh — exact dequantization of one element of a weight row, in the reference's float
 * order, for every weight type the matmul computes (get_rows, the routed experts' matmul). */
#ifndef COTI_CUDA_DEQUANT_CUH
#define COTI_CUDA_DEQUANT_CUH

#include "cuda_internal.cuh"

__device__ __forceinline__ uint32_t ldg_u16(const uint8_t *p) { return (uint32_t)p[0] | ((uint32_t)p[1] << 8); }
__device__ __forceinline__ uint32_t ldg_u32(const uint8_t *p) { return ldg_u16(p) | (ldg_u16(p + 2) << 16); }
__device__ __forceinline__ float ldg_h2f(const uint8_t *p) { return cuda_h2f((uint16_t)ldg_u16(p)); }

/* scale and min of sub-block j of a Q4_K/Q5_K scales field (bytes) */
__device__ __forceinline__ void k4_scale_min_bytes(int j, const uint8_t *s, int &sc, int &mn) {
    if (j < 4) {
        sc = s[j] & 63;
        mn = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

template <int T> __device__ __forceinline__ float deq(const uint8_t *row, int e) {
    if constexpr (T == GGML_TYPE_F32) return __uint_as_float(ldg_u32(row + 4 * (size_t)e));
    else if constexpr (T == GGML_TYPE_F16) return ldg_h2f(row + 2 * (size_t)e);
    else if constexpr (T == GGML_TYPE_BF16) return cuda_bf2f((uint16_t)ldg_u16(row + 2 * (size_t)e));
    else if constexpr (T == GGML_TYPE_Q8_0) {
        const uint8_t *b = row + (size_t)(e / 32) * 34;
        return (float)(int8_t)b[2 + e % 32] * ldg_h2f(b);
    } else if constexpr (T == GGML_TYPE_Q4_0 || T == GGML_TYPE_Q4_1) {
        const int j = e % 32, hdr = T == GGML_TYPE_Q4_0 ? 2 : 4;
        const uint8_t *b = row + (size_t)(e / 32) * (T == GGML_TYPE_Q4_0 ? 18 : 20);
        const int byte = b[hdr + j % 16], nib = j < 16 ? byte & 0xF : byte >> 4;
        if constexpr (T == GGML_TYPE_Q4_0) return (float)(nib - 8) * ldg_h2f(b);
        else return __fadd_rn(__fmul_rn((float)nib, ldg_h2f(b)), ldg_h2f(b + 2));
    } else if constexpr (T == GGML_TYPE_Q5_0 || T == GGML_TYPE_Q5_1) {
        const int j = e % 32, hdr = T == GGML_TYPE_Q5_0 ? 2 : 4;
        const uint8_t *b = row + (size_t)(e / 32) * (T == GGML_TYPE_Q5_0 ? 22 : 24);
        const uint32_t qh = ldg_u32(b + hdr);
        const int byte = b[hdr + 4 + j % 16], nib = j < 16 ? byte & 0xF : byte >> 4;
        const int code = nib | (int)(((qh >> j) & 1u) << 4);
        if constexpr (T == GGML_TYPE_Q5_0) return (float)(code - 16) * ldg_h2f(b);
        else return __fadd_rn(__fmul_rn((float)code, ldg_h2f(b)), ldg_h2f(b + 2));
    } else if constexpr (T == GGML_TYPE_Q4_K || T == GGML_TYPE_Q5_K) {
        const uint8_t *b = row + (size_t)(e / 256) * (T == GGML_TYPE_Q4_K ? 144 : 176);
        const int ee = e % 256, j = ee / 32, l = ee % 32, ch = ee / 64;
        int sc, mn;
        k4_scale_min_bytes(j, b + 4, sc, mn);
        const float d1 = __fmul_rn(ldg_h2f(b), (float)sc), m1 = __fmul_rn(ldg_h2f(b + 2), (float)mn);
        const int qs = T == GGML_TYPE_Q4_K ? 16 : 48;
        const int byte = b[qs + 32 * ch + l];
        int code = (ee % 64) < 32 ? byte & 0xF : byte >> 4;
        if constexpr (T == GGML_TYPE_Q5_K) code += 16 * ((b[16 + l] >> j) & 1);
        return __fsub_rn(__fmul_rn(d1, (float)code), m1);
    } else { /* Q6_K */
        const uint8_t *b = row + (size_t)(e / 256) * 210;
        const int ee = e % 256, h = ee / 128, g = (ee % 128) / 32, l = ee % 32;
        const int lowbyte = b[64 * h + l + 32 * (g & 1)];
        const int lo = g < 2 ? lowbyte & 0xF : lowbyte >> 4;
        const int hi = (b[128 + 32 * h + l] >> (2 * g)) & 3;
        const int q = (lo | (hi << 4)) - 32;
        return __fmul_rn(__fmul_rn(ldg_h2f(b + 208), (float)(int8_t)b[192 + ee / 16]), (float)q);
    }
}

#endif
