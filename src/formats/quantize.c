/*
 * fp4d_quantize / fp4d_dequantize: the drivers around the per-convention block quantizers
 * of convention.c. Two passes over the input (tensor amax, then blocks), one row of
 * widened f32 at a time so that bf16/f16 inputs of any size need O(cols) scratch only.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fp4doctor/formats.h"
#include "formats/formats_internal.h"
#include "internal.h"

#define MAX_BLOCK 32

static bool is_plain_source(fp4d_dtype t)
{
    return t == FP4D_DTYPE_F32 || t == FP4D_DTYPE_BF16 || t == FP4D_DTYPE_F16;
}

/* Row r of the source as f32: the source itself for f32, else widened into scratch. */
static const float *source_row(fp4d_dtype t, const void *src, int64_t r, int64_t cols, float *scratch)
{
    if (t == FP4D_DTYPE_F32) return (const float *)src + r * cols;
    const uint16_t *h = (const uint16_t *)src + r * cols;
    fp4d_to_f32(t, h, (size_t)cols, scratch);
    return scratch;
}

static void tensor_stats(fp4d_dtype t, const void *src, int64_t rows, int64_t cols, float *scratch,
                         fp4d_tensor_stats *st)
{
    float amax = 0.0f; /* NaN ignored; inf kept here, mapped below */
    bool any_nan = false;
    for (int64_t r = 0; r < rows; r++) {
        const float *x = source_row(t, src, r, cols, scratch);
        for (int64_t i = 0; i < cols; i++) {
            float a = fabsf(x[i]);
            if (a != a) any_nan = true;
            else if (a > amax) amax = a;
        }
    }
    st->amax_finite_nan_ignored = isinf(amax) ? FLT_MAX : amax; /* nan_to_num */
    st->amax_torch = any_nan ? NAN : amax;
}

/* The argument checks of fp4d_quantize, also run by fp4d_backend_quantize before any backend
 * sees the problem (internal.h): a GPU quantizer given cols = -16 passed its own
 * `cols % 16` check and read far past a buffer. */
fp4d_status fp4d_quantize_check(const fp4d_quantize_params *p, fp4d_dtype src_type, const void *src, int64_t rows,
                                int64_t cols, const uint8_t *codes, const uint8_t *scales)
{
    FP4D_RETURN_ERROR_IF(!p, INVALID_ARG, "quantize: no parameters");
    FP4D_RETURN_ERROR_IF(p->format != FP4D_DTYPE_NVFP4 && p->format != FP4D_DTYPE_MXFP4, INVALID_ARG,
                         "quantize: target format must be nvfp4 or mxfp4, not %s",
                         fp4d_dtype_get(p->format) ? fp4d_dtype_get(p->format)->name : "unknown");
    FP4D_RETURN_ERROR_IF((unsigned)p->convention >= FP4D_CONV_COUNT, INVALID_ARG,
                         "quantize: unknown convention %d", (int)p->convention);
    FP4D_RETURN_ERROR_IF(!fp4d_convention_supports(p->convention, p->format), INVALID_ARG,
                         "quantize: convention '%s' is not defined for %s",
                         fp4d_convention_name(p->convention), fp4d_dtype_get(p->format)->name);
    FP4D_RETURN_ERROR_IF((unsigned)p->scale_layout >= FP4D_LAYOUT_COUNT, INVALID_ARG,
                         "quantize: unknown scale layout %d", (int)p->scale_layout);
    FP4D_RETURN_ERROR_IF(!is_plain_source(src_type), INVALID_ARG,
                         "quantize: source must be f32, bf16 or f16");
    FP4D_RETURN_ERROR_IF(rows < 0 || cols < 0, INVALID_ARG,
                         "quantize: negative shape [%lld, %lld]", (long long)rows, (long long)cols);
    FP4D_RETURN_ERROR_IF(rows > FP4D_MAX_DIM || cols > FP4D_MAX_DIM, INVALID_ARG,
                         "quantize: shape [%lld, %lld] beyond %lld rows or columns", (long long)rows,
                         (long long)cols, (long long)FP4D_MAX_DIM);
    const fp4d_dtype_traits *tr = fp4d_dtype_get(p->format);
    const int block = (int)tr->block_size;
    FP4D_RETURN_ERROR_IF(cols % block != 0, INVALID_ARG,
                         "quantize: %s needs the row length to be a multiple of %d, got %lld",
                         tr->name, block, (long long)cols);
    FP4D_RETURN_ERROR_IF(p->format == FP4D_DTYPE_NVFP4 && !(p->encode_scale >= 0.0f && isfinite(p->encode_scale)),
                         INVALID_ARG, "quantize: encode_scale must be finite and > 0 (or 0 to derive it), got %g",
                         (double)p->encode_scale);
    const bool empty = rows == 0 || cols == 0;
    FP4D_RETURN_ERROR_IF(!empty && (!src || !codes || !scales), INVALID_ARG, "quantize: NULL buffer");

    return FP4D_STATUS_OK;
}

fp4d_status fp4d_quantize(const fp4d_quantize_params *p, fp4d_dtype src_type, const void *src,
                          int64_t rows, int64_t cols, uint8_t *codes, uint8_t *scales,
                          fp4d_quantize_result *result)
{
    FP4D_FORWARD_IF_ERROR(fp4d_quantize_check(p, src_type, src, rows, cols, codes, scales));
    const int block = (int)fp4d_dtype_get(p->format)->block_size;
    const bool empty = rows == 0 || cols == 0;
    const int64_t scale_cols = cols / block;
    const fp4d_block_quantizer quantize_block = fp4d_convention_block_quantizer(p->convention, p->format);
    float *scratch = NULL;
    if (src_type != FP4D_DTYPE_F32 && cols > 0) {
        scratch = malloc((size_t)cols * sizeof(float));
        FP4D_RETURN_ERROR_IF(!scratch, NOMEM, "quantize: cannot allocate %lld floats", (long long)cols);
    }

    fp4d_tensor_stats st = { 0.0f, 0.0f };
    if (!empty) tensor_stats(src_type, src, rows, cols, scratch, &st);
    fp4d_tensor_ctx ctx;
    float decode_scale, encode_scale;
    fp4d_convention_tensor_ctx(p->convention, p->format, &st, p->encode_scale, &ctx,
                               &decode_scale, &encode_scale);

    if (!empty && p->scale_layout != FP4D_LAYOUT_LINEAR)
        memset(scales, 0, fp4d_scale_buffer_size(p->scale_layout, rows, scale_cols)); /* padding */

    uint8_t q[MAX_BLOCK];
    for (int64_t r = 0; !empty && r < rows; r++) {
        const float *x = source_row(src_type, src, r, cols, scratch);
        uint8_t *row_codes = codes + r * (cols / 2);
        for (int64_t b = 0; b < scale_cols; b++) {
            const uint8_t sf = quantize_block(&ctx, x + b * block, block, q);
            scales[fp4d_scale_offset(p->scale_layout, rows, scale_cols, r, b)] = sf;
            uint8_t *out = row_codes + b * (block / 2);
            for (int j = 0; j < block / 2; j++) /* even element -> low nibble (§1.5) */
                out[j] = (uint8_t)((q[2 * j] & 0xF) | ((q[2 * j + 1] & 0xF) << 4));
        }
    }
    free(scratch);
    if (result) {
        result->decode_scale = decode_scale;
        result->encode_scale = encode_scale;
    }
    return FP4D_STATUS_OK;
}

fp4d_status fp4d_dequantize(fp4d_dtype format, fp4d_scale_layout scale_layout,
                            const uint8_t *codes, const uint8_t *scales, float decode_scale,
                            int64_t rows, int64_t cols, float *dst)
{
    FP4D_RETURN_ERROR_IF(format != FP4D_DTYPE_NVFP4 && format != FP4D_DTYPE_MXFP4, INVALID_ARG,
                         "dequantize: format must be nvfp4 or mxfp4");
    FP4D_RETURN_ERROR_IF((unsigned)scale_layout >= FP4D_LAYOUT_COUNT, INVALID_ARG,
                         "dequantize: unknown scale layout %d", (int)scale_layout);
    FP4D_RETURN_ERROR_IF(rows < 0 || cols < 0, INVALID_ARG, "dequantize: negative shape");
    const fp4d_dtype_traits *tr = fp4d_dtype_get(format);
    const int64_t block = tr->block_size;
    FP4D_RETURN_ERROR_IF(cols % block != 0, INVALID_ARG,
                         "dequantize: %s needs the row length to be a multiple of %lld, got %lld",
                         tr->name, (long long)block, (long long)cols);
    if (rows == 0 || cols == 0) return FP4D_STATUS_OK;
    FP4D_RETURN_ERROR_IF(!codes || !scales || !dst, INVALID_ARG, "dequantize: NULL buffer");

    const int64_t scale_cols = cols / block;
    const bool has_tensor_scale = tr->has_tensor_scale;
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *row_codes = codes + r * (cols / 2);
        float *out = dst + r * cols;
        for (int64_t b = 0; b < scale_cols; b++) {
            const float scale = tr->scale_to_f32(scales[fp4d_scale_offset(scale_layout, rows, scale_cols, r, b)]);
            for (int64_t i = b * block; i < (b + 1) * block; i++) {
                const uint8_t byte = row_codes[i / 2];
                const uint8_t code = (i & 1) ? (uint8_t)(byte >> 4) : (uint8_t)(byte & 0xF);
                float v = fp4d_e2m1_to_f32(code) * scale; /* exact (few significant bits) */
                if (has_tensor_scale) v = v * decode_scale;
                out[i] = v;
            }
        }
    }
    return FP4D_STATUS_OK;
}
