/* One element of a GEMM output buffer (f32, bf16 or f16; see fp4d_out_elem_size), read and
 * written as f32. Shared by the backends, the registry's validation and the doctor's judge so
 * that they all agree on what an output element is. Inline: the CPU backend stores every output
 * element through fp4d_out_elem_set. Not part of the API. */
#ifndef FP4D_OUT_ELEM_H
#define FP4D_OUT_ELEM_H

#include <stdint.h>

#include "fp4doctor/formats.h"

/* Element i of out, widened to f32 (exact for every output type). Any type other than f32 and
 * bf16 is read as f16, so callers validate out_type first (fp4d_gemm_validate does). */
static inline float fp4d_out_elem_get(fp4d_dtype out_type, const void *out, int64_t i)
{
    switch (out_type) {
    case FP4D_DTYPE_F32: return ((const float *)out)[i];
    case FP4D_DTYPE_BF16: return fp4d_bf16_to_f32(((const uint16_t *)out)[i]);
    default: return fp4d_f16_to_f32(((const uint16_t *)out)[i]);
    }
}

/* Stores v into element i of out, rounded to nearest-even in out_type. */
static inline void fp4d_out_elem_set(fp4d_dtype out_type, void *out, int64_t i, float v)
{
    switch (out_type) {
    case FP4D_DTYPE_F32: ((float *)out)[i] = v; break;
    case FP4D_DTYPE_BF16: ((uint16_t *)out)[i] = fp4d_bf16_from_f32(v); break;
    default: ((uint16_t *)out)[i] = fp4d_f16_from_f32(v); break;
    }
}

#endif
