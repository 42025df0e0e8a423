/* Helpers shared by the files of src/formats/. Not part of the API. */
#ifndef FP4D_FORMATS_INTERNAL_H
#define FP4D_FORMATS_INTERNAL_H

#include <stdint.h>

#include "fp4doctor/formats.h"

/* Bit casts between float and its IEEE-754 binary32 pattern. */
uint32_t fp4d_f32_bits(float x);
float    fp4d_f32_from_bits(uint32_t b);

/* Per-block quantizer of one convention: x holds `n` widened input values of one block;
 * writes n unpacked e2m1 codes and returns the scale byte. `ctx` is the tensor-level state
 * computed once per tensor by the convention (see convention.c). */
typedef struct fp4d_tensor_ctx {
    float gs;      /* NVFP4: encode scale (SFScaleVal) as the convention uses it */
    float gd;      /* NVFP4: decode scale as the convention uses it */
} fp4d_tensor_ctx;

typedef uint8_t (*fp4d_block_quantizer)(const fp4d_tensor_ctx *ctx, const float *x, int n, uint8_t *q);

/* Tensor statistics every convention derives its per-tensor scale from. */
typedef struct fp4d_tensor_stats {
    float amax_finite_nan_ignored; /* max |x| ignoring NaN, inf mapped to FLT_MAX (flashinfer) */
    float amax_torch;              /* max |x| with NaN propagating and inf kept (torch.amax) */
} fp4d_tensor_stats;

/* Fills ctx for (convention, format) from the tensor statistics or from a given encode
 * scale (encode_scale > 0), and the decode/encode scales reported to the caller. */
void fp4d_convention_tensor_ctx(fp4d_convention c, fp4d_dtype format, const fp4d_tensor_stats *st,
                                float encode_scale, fp4d_tensor_ctx *ctx,
                                float *report_decode, float *report_encode);
fp4d_block_quantizer fp4d_convention_block_quantizer(fp4d_convention c, fp4d_dtype format);

#endif
