/* quant/quant.h — tensor element types (ggml ids), block layouts, conversions and dot kernels.
 * Knows nothing of models. Every format has a scalar reference (*_ref, the spec) and fast
 * AVX2 / AVX-512 paths chosen once at run time; tests compare fast paths with the reference.
 * Reference: ../shared/docs/quant-formats.md. */
#ifndef COTI_QUANT_H
#define COTI_QUANT_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

enum ggml_type {
    GGML_TYPE_F32 = 0, GGML_TYPE_F16 = 1, GGML_TYPE_Q4_0 = 2, GGML_TYPE_Q4_1 = 3,
    GGML_TYPE_Q5_0 = 6, GGML_TYPE_Q5_1 = 7, GGML_TYPE_Q8_0 = 8, GGML_TYPE_Q8_1 = 9,
    GGML_TYPE_Q2_K = 10, GGML_TYPE_Q3_K = 11, GGML_TYPE_Q4_K = 12, GGML_TYPE_Q5_K = 13,
    GGML_TYPE_Q6_K = 14, GGML_TYPE_Q8_K = 15, GGML_TYPE_BF16 = 30,
    GGML_TYPE_COUNT = 41,        /* ids below this may appear in files; unknown ones are rejected */
};

/* Size facts of a type. block_elems == 0 means "not supported by coti" (ids ggml defines but
 * coti cannot compute still have their name and block_bytes, for messages). */
struct ggml_type_traits {
    const char *name;            /* "q8_0" */
    int block_elems;             /* elements per block (1, 32 or 256) */
    int block_bytes;             /* bytes per block */
    enum ggml_type vec_dot_type; /* type activations are converted to for dot products */
};
const struct ggml_type_traits *ggml_type_traits_get(enum ggml_type t); /* NULL if unknown id */
bool ggml_type_supported(enum ggml_type t);   /* coti can dequantize and dot it */
/* Bytes of a row of n elements; 0 if n is not a multiple of the block size. */
size_t ggml_row_size(enum ggml_type t, int64_t n);
enum ggml_type ggml_type_from_name(const char *name); /* GGML_TYPE_COUNT if unknown */
/* The type a weight matrix of rows n wide is stored in when `want` is asked for: want, else
 * q8_0, else f16 where the rows are not whole blocks (llama-quantize's fallback), else f32. */
enum ggml_type ggml_type_for_rows(enum ggml_type want, int64_t n);
/* general.file_type (llama.cpp's llama_ftype) of a file whose matrices are mostly t: the K
 * types name their _M mix, the closest llama.cpp has for a uniform file; informational. */
uint32_t ggml_file_type_of(enum ggml_type t);

/* Scalar conversions (IEEE binary16 RNE; bf16 RNE with quiet NaN). */
float fp16_to_f32(uint16_t h);
uint16_t f32_to_fp16(float f);
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);

/* Reference (plain C) row operations; n must be a multiple of the type's block size. */
void quant_dequantize_row_ref(enum ggml_type t, const void *src, float *dst, int64_t n);
/* Quantize f32 -> t with llama.cpp's reference rule (weights and activations alike). */
void quant_quantize_row_ref(enum ggml_type t, const float *src, void *dst, int64_t n);
/* Q4_K with each sub-block's scale and min from its min/max grid, without the reference's
 * search over 21 stretched grids: a valid encoding (a larger error) ~10x faster, for `coti
 * mkmodel`'s random weights at tens of billions of parameters. */
void quant_quantize_q4_K_grid(const float *src, void *dst, int64_t n);
/* Dot of one weight row (type t) with one activation row already in t's vec_dot_type. */
float quant_vec_dot_ref(enum ggml_type t, const void *w, const void *x, int64_t n);

/* CPU instruction levels; quant_cpu_level_detect() returns the best the CPU supports. */
enum quant_cpu_level { QUANT_CPU_REF = 0, QUANT_CPU_AVX2 = 1, QUANT_CPU_AVX512 = 2 };
enum quant_cpu_level quant_cpu_level_detect(void);

/* Kernels for one weight type at one CPU level, filled once at init (no `if` in hot loops).
 *
 * from_float: convert an activation row to vec_dot_type (this is where llama.cpp's
 *   activation quantization happens). Every level writes exactly the bytes of
 *   quant_quantize_row_ref for finite input (the reference rounding of §5.1), so logits do
 *   not depend on the CPU found; non-finite input is converted without UB, bytes unspecified
 *   for the Q8 formats.
 * gemm: y[t*ldy + o] = dot(W row o, X row t) for o < n_out, t < n_tok; W rows are row_bytes
 *   apart, X rows (converted) are x_row_bytes apart. Reads each weight row once for all
 *   n_tok activation rows (verify batches of k+1 rows, prefill). Each output's value does
 *   not depend on n_tok or on how the caller splits the o range across threads (bit-identical,
 *   tested); values differ from quant_vec_dot_ref and between levels by f32 summation order
 *   only. */
struct quant_kernels {
    enum ggml_type type;
    enum ggml_type vec_dot_type;
    void (*from_float)(const float *x, void *y, int64_t n);
    void (*gemm)(int64_t n, const void *w, size_t row_bytes, int64_t n_out,
                 const void *x, size_t x_row_bytes, int64_t n_tok, float *y, int64_t ldy);
    void (*dequantize_row)(const void *src, float *dst, int64_t n);
    /* Optional (NULL where this level has none): a repacked weight layout for a faster gemm,
     * built once at load (packed.c describes it). packed_size is 0 when W cannot be
     * packed (n_out not a multiple of QUANT_PACK_ROWS, rows too long). packed_gemm has gemm's
     * contract with wp the packed bytes of output rows [0, n_out), n_out a multiple of
     * QUANT_PACK_ROWS; packed_row dequantizes row o. */
    size_t (*packed_size)(int64_t n, int64_t n_out);
    void (*pack)(const void *w, size_t row_bytes, int64_t n, int64_t n_out, void *wp);
    void (*packed_gemm)(int64_t n, const void *wp, int64_t n_out, const void *x,
                        size_t x_row_bytes, int64_t n_tok, float *y, int64_t ldy);
    void (*packed_row)(const void *wp, int64_t n, int64_t o, float *dst);
};

/* Output rows per group of a packed weight: callers split packed weights on these bounds. */
#define QUANT_PACK_ROWS 16
/* Returns false if the type is not supported; out is filled with the best kernels <= level
 * (and <= quant_cpu_level_detect(), whatever level asks for). */
bool quant_kernels_get(enum ggml_type t, enum quant_cpu_level level, struct quant_kernels *out);

#endif
