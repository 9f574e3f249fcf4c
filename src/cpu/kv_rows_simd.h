/* kv_rows_simd.h — the SIMD conversions of KV cache rows (bf16, q8_0, q4_0) to packed f32 rows,
 * shared by the AVX2 and AVX-512 instances of ops_body.h (a block of 32 is four 8-lane or two
 * 16-lane vectors; the AVX-512 file's build takes the 16-lane branches). Each element is the quant reference's dequantization: the products d·code are
 * exact in f32, so these give the reference's floats bit for bit. x is `stride` bytes per row. */
#ifndef COTI_CPU_KV_ROWS_SIMD_H
#define COTI_CPU_KV_ROWS_SIMD_H

#include <immintrin.h>
#include <string.h>

static inline void cvt_rows_bf16(float *y, const uint8_t *x, size_t stride, int nb, int n) {
    for (int c = 0; c < nb; c++) {
        const uint8_t *xr = x + (size_t)c * stride;
        float *yr = y + (size_t)c * n;
        int i = 0;
#ifdef __AVX512F__
        for (; i + 16 <= n; i += 16) {
            const __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(xr + 2 * i)));
            _mm512_storeu_ps(yr + i, _mm512_castsi512_ps(_mm512_slli_epi32(h, 16)));
        }
#endif
        for (; i + 8 <= n; i += 8) {
            const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(xr + 2 * i)));
            _mm256_storeu_ps(yr + i, _mm256_castsi256_ps(_mm256_slli_epi32(h, 16)));
        }
        for (; i < n; i++) {
            uint16_t h;
            memcpy(&h, xr + 2 * i, 2);
            yr[i] = bf16_to_f32(h);
        }
    }
}

/* a block's scale: its leading f16 (F16C, exact like fp16_to_f32) */
static inline __m256 kv_block_scale(const uint8_t *b) {
    uint16_t d;
    memcpy(&d, b, 2);
    return _mm256_set1_ps(_cvtsh_ss(d));
}

/* q8_0: 34-byte blocks, d then 32 signed codes (16 lanes at a time where AVX-512 is on) */
static inline void cvt_rows_q8_0(float *y, const uint8_t *x, size_t stride, int nb, int n) {
    for (int c = 0; c < nb; c++) {
        const uint8_t *xr = x + (size_t)c * stride;
        float *yr = y + (size_t)c * n;
        for (int ib = 0; ib < n / 32; ib++) {
            const uint8_t *b = xr + 34 * (size_t)ib;
#ifdef __AVX512F__
            const __m512 d = _mm512_set1_ps(_mm256_cvtss_f32(kv_block_scale(b)));
            for (int k = 0; k < 2; k++) {
                const __m512i q = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 2 + 16 * k)));
                _mm512_storeu_ps(yr + 32 * ib + 16 * k, _mm512_mul_ps(_mm512_cvtepi32_ps(q), d));
            }
#else
            const __m256 d = kv_block_scale(b);
            for (int k = 0; k < 4; k++) {
                const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b + 2 + 8 * k)));
                _mm256_storeu_ps(yr + 32 * ib + 8 * k, _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
            }
#endif
        }
    }
}

/* q4_0: 18-byte blocks, d then 16 bytes whose low nibbles are elements 0..15 and high nibbles
 * 16..31, each minus 8 */
static inline void cvt_rows_q4_0(float *y, const uint8_t *x, size_t stride, int nb, int n) {
    for (int c = 0; c < nb; c++) {
        const uint8_t *xr = x + (size_t)c * stride;
        float *yr = y + (size_t)c * n;
        for (int ib = 0; ib < n / 32; ib++) {
            const uint8_t *b = xr + 18 * (size_t)ib;
#ifdef __AVX512F__
            const __m512 d = _mm512_set1_ps(_mm256_cvtss_f32(kv_block_scale(b)));
            const __m512i eight = _mm512_set1_epi32(8);
            const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + 2)));
            const __m512i lo = _mm512_sub_epi32(_mm512_and_si512(q, _mm512_set1_epi32(0xF)), eight);
            const __m512i hi = _mm512_sub_epi32(_mm512_srli_epi32(q, 4), eight);
            _mm512_storeu_ps(yr + 32 * ib, _mm512_mul_ps(_mm512_cvtepi32_ps(lo), d));
            _mm512_storeu_ps(yr + 32 * ib + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(hi), d));
#else
            const __m256 d = kv_block_scale(b);
            const __m256i eight = _mm256_set1_epi32(8), lo4 = _mm256_set1_epi32(0xF);
            for (int k = 0; k < 2; k++) {
                const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b + 2 + 8 * k)));
                const __m256i lo = _mm256_sub_epi32(_mm256_and_si256(q, lo4), eight);
                const __m256i hi = _mm256_sub_epi32(_mm256_srli_epi32(q, 4), eight);
                _mm256_storeu_ps(yr + 32 * ib + 8 * k, _mm256_mul_ps(_mm256_cvtepi32_ps(lo), d));
                _mm256_storeu_ps(yr + 32 * ib + 16 + 8 * k, _mm256_mul_ps(_mm256_cvtepi32_ps(hi), d));
            }
#endif
        }
    }
}

#endif
