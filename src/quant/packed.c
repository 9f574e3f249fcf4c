/* packed.c — the packed Q8_0 and Q4_0 weight layouts (the scalar half: size, pack, row
 * lookup).
 *
 * Why: in a row-major Q8_0 matrix one output is one row, so a SIMD dot product ends in a
 * horizontal sum per output and every extra activation row (a verify batch) repeats the whole
 * weight-side work. Packed, one 64-byte load carries 4 consecutive codes of 16 output rows:
 * vpdpbusd against 4 activation bytes broadcast to all lanes advances 16 outputs at once,
 * there is no horizontal sum, and each further activation row costs only its own dpbusds.
 *
 * Layout: outputs in groups of QUANT_PACK_ROWS = 16; a group is nb = n/32 packed blocks in
 * column order, each QUANT_PACKED_BLOCK = 544 bytes (the 16 rows' 34-byte blocks, rearranged):
 *     [0, 32)     the 16 rows' f16 scales d, row-major
 *     [32, 544)   codes: byte 32 + 64*(k/4) + 4*r + k%4 is element k (0..31) of row r,
 *                 stored as code + 128 (vpdpbusd multiplies unsigned by signed bytes; the
 *                 kernel subtracts 128 * Σ activation codes per block)
 * so group g starts at g * nb * 544 and rows [16g, 16g+16) can be handed out by group.
 *
 * Q4_0 packs the same way with nibbles, QUANT_PACKED_BLOCK_Q4 = 288 bytes per block of 16 rows:
 *     [0, 32)     the 16 rows' f16 scales
 *     [32, 288)   four 64-byte vectors; vector m holds, in byte 4*r + i, element 4m + i of row
 *                 r in the low nibble and element 4(m+4) + i in the high nibble, as the raw
 *                 code (0..15, meaning code - 8; the kernel subtracts 8 * Σ activation codes)
 * so masking and shifting one load gives the byte vectors of two groups of 4 elements. */
#include "quant/internal.h"

size_t quant_q8_0_packed_size(int64_t n, int64_t n_out) {
    if (n <= 0 || n % QK8_0 || n > QUANT_PACKED_MAX_N || n_out <= 0 || n_out % QUANT_PACK_ROWS)
        return 0;
    return (size_t)(n / QK8_0) * QUANT_PACKED_BLOCK * (size_t)(n_out / QUANT_PACK_ROWS);
}

void quant_q8_0_pack(const void *w, size_t row_bytes, int64_t n, int64_t n_out, void *wp) {
    const uint8_t *src = w;
    uint8_t *dst = wp;
    const int64_t nb = n / QK8_0;
    for (int64_t g = 0; g < n_out / QUANT_PACK_ROWS; g++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *blk = dst + (g * nb + b) * QUANT_PACKED_BLOCK;
            for (int r = 0; r < QUANT_PACK_ROWS; r++) {
                const uint8_t *s = src + (size_t)(g * QUANT_PACK_ROWS + r) * row_bytes + (size_t)b * 34;
                memcpy(blk + 2 * r, s, 2);
                for (int k = 0; k < QK8_0; k++)
                    blk[32 + 64 * (k / 4) + 4 * r + k % 4] = (uint8_t)(s[2 + k] ^ 0x80);
            }
        }
}

void quant_q8_0_packed_row(const void *wp, int64_t n, int64_t o, float *dst) {
    const int64_t nb = n / QK8_0, r = o % QUANT_PACK_ROWS;
    const uint8_t *grp = (const uint8_t *)wp + (o / QUANT_PACK_ROWS) * nb * QUANT_PACKED_BLOCK;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = grp + b * QUANT_PACKED_BLOCK;
        float d = fp16_to_f32(quant_rd_u16(blk + 2 * r));
        for (int k = 0; k < QK8_0; k++)
            dst[b * QK8_0 + k] = (float)((int)blk[32 + 64 * (k / 4) + 4 * r + k % 4] - 128) * d;
    }
}

size_t quant_q4_0_packed_size(int64_t n, int64_t n_out) {
    if (!quant_q8_0_packed_size(n, n_out)) return 0;   /* the same shape rules */
    return (size_t)(n / QK4_0) * QUANT_PACKED_BLOCK_Q4 * (size_t)(n_out / QUANT_PACK_ROWS);
}

static int q4_0_code(const uint8_t *qs, int k) { return k < 16 ? qs[k] & 0xF : qs[k - 16] >> 4; }

void quant_q4_0_pack(const void *w, size_t row_bytes, int64_t n, int64_t n_out, void *wp) {
    const uint8_t *src = w;
    uint8_t *dst = wp;
    const int64_t nb = n / QK4_0;
    for (int64_t g = 0; g < n_out / QUANT_PACK_ROWS; g++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *blk = dst + (g * nb + b) * QUANT_PACKED_BLOCK_Q4;
            for (int r = 0; r < QUANT_PACK_ROWS; r++) {
                const uint8_t *s = src + (size_t)(g * QUANT_PACK_ROWS + r) * row_bytes + (size_t)b * 18;
                memcpy(blk + 2 * r, s, 2);
                for (int m = 0; m < 4; m++)
                    for (int i = 0; i < 4; i++)
                        blk[32 + 64 * m + 4 * r + i] =
                            (uint8_t)(q4_0_code(s + 2, 4 * m + i) | q4_0_code(s + 2, 4 * (m + 4) + i) << 4);
            }
        }
}

void quant_q4_0_packed_row(const void *wp, int64_t n, int64_t o, float *dst) {
    const int64_t nb = n / QK4_0, r = o % QUANT_PACK_ROWS;
    const uint8_t *grp = (const uint8_t *)wp + (o / QUANT_PACK_ROWS) * nb * QUANT_PACKED_BLOCK_Q4;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = grp + b * QUANT_PACKED_BLOCK_Q4;
        float d = fp16_to_f32(quant_rd_u16(blk + 2 * r));
        for (int k = 0; k < QK4_0; k++) {
            uint8_t byte = blk[32 + 64 * (k / 4 % 4) + 4 * r + k % 4];
            int code = k < 16 ? byte & 0xF : byte >> 4;
            dst[b * QK4_0 + k] = (float)(code - 8) * d;
        }
    }
}
