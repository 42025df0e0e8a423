/*
 * formats.h - scalar codecs (e2m1, e4m3, ue4m3, ue8m0, bf16, fp16), the NVFP4 and MXFP4
 * block formats, the named quantizer conventions and the block-scale layouts.
 *
 * Numerics follow shared/spec/nvfp4-spec.md; section numbers below (§) refer to it.
 * Every encoder is a pure function of its input bits (no global rounding-mode state).
 */
#ifndef FP4DOCTOR_FORMATS_H
#define FP4DOCTOR_FORMATS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fp4doctor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------
 * Scalar codecs
 * ------------------------------------------------------------------------------------- */

typedef enum fp4d_saturation {
    FP4D_SATFINITE = 0, /* out-of-range values clamp to the largest finite value */
    FP4D_NOSAT     = 1  /* out-of-range values become NaN (e4m3) / 0xFF (ue8m0) */
} fp4d_saturation;

typedef enum fp4d_rounding {
    FP4D_ROUND_NEAREST_EVEN = 0,
    FP4D_ROUND_TOWARD_ZERO  = 1,
    FP4D_ROUND_UP           = 2 /* toward +infinity on the magnitude (ue8m0 "RP") */
} fp4d_rounding;

/* e2m1 (§1): code in the low 4 bits. RNE, saturating to +-6, NaN -> 0x7 (+6), sign of -0 kept. */
uint8_t fp4d_e2m1_from_f32(float x);
/* Round toward zero variant (CUDA cudaRoundZero): NaN -> 0x7, overflow -> +-6. */
uint8_t fp4d_e2m1_from_f32_rz(float x);
/* Decodes the low 4 bits; 0x8 decodes to -0.0. */
float   fp4d_e2m1_to_f32(uint8_t code);

/* e4m3fn (§2): RNE. NaN -> 0x7F (either sign). SATFINITE clamps to +-448, NOSAT gives NaN. */
uint8_t fp4d_e4m3_from_f32(float x, fp4d_saturation sat);
/* All 256 bytes decode; 0x7F and 0xFF are NaN, 0x80 is -0.0. */
float   fp4d_e4m3_to_f32(uint8_t b);

/* ue4m3 (§2.5): unsigned e4m3 as used for NVFP4 block scales (cuBLASLt VEC16_UE4M3).
 * Encode: as e4m3 SATFINITE of |x| with the sign dropped; NaN -> 0x7F.
 * Decode: the sign bit is not part of the format; bytes with bit 7 set are invalid and
 * decode as NaN (how hardware treats them is UNVERIFIED, so the doctor flags them). */
uint8_t fp4d_ue4m3_from_f32(float x);
float   fp4d_ue4m3_to_f32(uint8_t b);

/* ue8m0 (§3): value 2^(b-127); 0xFF is NaN. rounding is FP4D_ROUND_TOWARD_ZERO or
 * FP4D_ROUND_UP (as CUDA's __nv_cvt_float_to_e8m0); sign ignored; NaN -> 0xFF. */
uint8_t fp4d_ue8m0_from_f32(float x, fp4d_rounding rounding, fp4d_saturation sat);
float   fp4d_ue8m0_to_f32(uint8_t b); /* 0 -> 2^-127, 0xFF -> NaN */

/* bf16 and fp16 <-> f32, round to nearest even (as CUDA's __float2bfloat16_rn / __float2half_rn). */
uint16_t fp4d_bf16_from_f32(float x);
float    fp4d_bf16_to_f32(uint16_t h);
uint16_t fp4d_f16_from_f32(float x);
float    fp4d_f16_to_f32(uint16_t h);

/* ---------------------------------------------------------------------------------------
 * Element types and block formats (a traits table indexed by fp4d_dtype)
 * ------------------------------------------------------------------------------------- */

typedef enum fp4d_dtype {
    FP4D_DTYPE_F32   = 0,
    FP4D_DTYPE_BF16  = 1,
    FP4D_DTYPE_F16   = 2,
    FP4D_DTYPE_NVFP4 = 3, /* e2m1 codes, 16-element blocks, e4m3 block scale, f32 tensor scale */
    FP4D_DTYPE_MXFP4 = 4, /* e2m1 codes, 32-element blocks, ue8m0 block scale */
    FP4D_DTYPE_COUNT
} fp4d_dtype;

typedef enum fp4d_scale_kind {
    FP4D_SCALE_NONE  = 0,
    FP4D_SCALE_E4M3  = 1,
    FP4D_SCALE_UE8M0 = 2
} fp4d_scale_kind;

typedef struct fp4d_dtype_traits {
    const char     *name;             /* "f32", "bf16", "f16", "nvfp4", "mxfp4" */
    fp4d_dtype      dtype;
    uint32_t        element_bits;     /* 32, 16, 16, 4, 4 */
    uint32_t        block_size;       /* elements per block scale along K; 1 for plain types */
    fp4d_scale_kind scale_kind;
    bool            has_tensor_scale; /* NVFP4: an f32 per-tensor decode scale */
    bool            is_block_fp4;
    float         (*scale_to_f32)(uint8_t b); /* NULL for plain types */
} fp4d_dtype_traits;

/* Never NULL for a valid dtype; NULL otherwise. */
const fp4d_dtype_traits *fp4d_dtype_get(fp4d_dtype t);
/* Looks up "f32", "bf16", "f16"/"fp16", "nvfp4", "mxfp4". Returns false if unknown. */
bool fp4d_dtype_from_name(const char *name, fp4d_dtype *out);
/* Bytes of the element data of a [rows, cols] matrix (packed for FP4: rows*cols/2); 0 for a
 * negative shape or unknown dtype, SIZE_MAX where the count does not fit in size_t. */
size_t fp4d_dtype_data_bytes(fp4d_dtype t, int64_t rows, int64_t cols);

/* ---------------------------------------------------------------------------------------
 * Block-scale layouts (§6)
 * ------------------------------------------------------------------------------------- */

typedef enum fp4d_scale_layout {
    FP4D_LAYOUT_LINEAR        = 0, /* offset = r*C + c, no padding (what checkpoints store) */
    FP4D_LAYOUT_SWIZZLED_128X4 = 1, /* cuBLAS/CUTLASS 1D block-scaling layout, padded to 128 x 4 */
    FP4D_LAYOUT_SWIZZLED_8X4   = 2, /* TRT-LLM-gen small-M layout, padded to 8 x 4 */
    FP4D_LAYOUT_COUNT
} fp4d_scale_layout;

const char *fp4d_scale_layout_name(fp4d_scale_layout l); /* "linear", "swizzled", "swizzled8x4" */
bool fp4d_scale_layout_from_name(const char *name, fp4d_scale_layout *out); /* also accepts "128x4", "8x4" */

/* The largest row count or row length the format functions take (as fp4d_gemm_validate):
 * sizes beyond it would overflow 64-bit byte counts. */
#define FP4D_MAX_DIM (INT64_C(1) << 31)

/* Bytes of a scale buffer for a logical [rows, scale_cols] scale matrix, padding included;
 * 0 for a negative or unknown argument, or one beyond FP4D_MAX_DIM. */
size_t fp4d_scale_buffer_size(fp4d_scale_layout l, int64_t rows, int64_t scale_cols);
/* Byte offset of logical scale (r, c). */
size_t fp4d_scale_offset(fp4d_scale_layout l, int64_t rows, int64_t scale_cols, int64_t r, int64_t c);
/* Converts between layouts. dst must hold fp4d_scale_buffer_size(dst_layout, ...) bytes;
 * padding bytes of dst are written as 0x00. src and dst must not overlap. Does nothing where
 * that size is 0 or src_layout is unknown. */
void fp4d_scales_convert(fp4d_scale_layout src_layout, const uint8_t *src,
                         fp4d_scale_layout dst_layout, uint8_t *dst,
                         int64_t rows, int64_t scale_cols);

/* ---------------------------------------------------------------------------------------
 * Quantizer conventions (§4) and quantize / dequantize
 * ------------------------------------------------------------------------------------- */

typedef enum fp4d_convention {
    FP4D_CONV_FLASHINFER_EXACT   = 0, /* §4.2, the default; MXFP4: ceil-pow2 with exact 1/6 */
    FP4D_CONV_TRTLLM             = 1, /* §4.1 / §3.4; rcp.approx bounded by a correctly rounded reciprocal (docs/formats.md) */
    FP4D_CONV_MODELOPT           = 2, /* §4.5 */
    FP4D_CONV_TORCHAO            = 3, /* §4.6 */
    FP4D_CONV_COMPRESSED_TENSORS = 4, /* §4.7 */
    FP4D_CONV_OCP                = 5, /* MXFP4 only: OCP floor rule (§3.4, torchao FLOOR) */
    FP4D_CONV_COUNT
} fp4d_convention;

const char *fp4d_convention_name(fp4d_convention c); /* "flashinfer-exact", "trtllm", ... */
bool fp4d_convention_from_name(const char *name, fp4d_convention *out);
/* Whether a convention is defined for a block format (e.g. ocp is MXFP4-only). */
bool fp4d_convention_supports(fp4d_convention c, fp4d_dtype format);

/*
 * Quantization of a row-major [rows, cols] matrix of f32/bf16/f16 into NVFP4 or MXFP4.
 *
 * The NVFP4 per-tensor scale: the encode scale gs (2688/amax, §4.0) drives the block
 * scales; the decode scale (scale_2 = amax/2688, ModelOpt's weight_scale_2) multiplies at
 * dequantization. If encode_scale is 0 the quantizer derives it from the tensor's own amax
 * the way the convention does; otherwise it is used as given (static activation scales).
 */
typedef struct fp4d_quantize_params {
    fp4d_dtype        format;       /* FP4D_DTYPE_NVFP4 or FP4D_DTYPE_MXFP4 */
    fp4d_convention   convention;
    fp4d_scale_layout scale_layout;
    float             encode_scale; /* NVFP4 only; 0 = derive from the tensor */
} fp4d_quantize_params;

typedef struct fp4d_quantize_result {
    float decode_scale;  /* NVFP4: the scale_2 to store (amax/2688 convention); MXFP4: 1 */
    float encode_scale;  /* NVFP4: the gs actually used; MXFP4: 1 */
} fp4d_quantize_result;

/*
 * codes: rows*cols/2 bytes (low nibble = even element, §1.5).
 * scales: fp4d_scale_buffer_size(scale_layout, rows, cols/block_size) bytes.
 * cols must be a multiple of the block size. Returns INVALID_ARG otherwise.
 */
fp4d_status fp4d_quantize(const fp4d_quantize_params *p, fp4d_dtype src_type, const void *src,
                          int64_t rows, int64_t cols, uint8_t *codes, uint8_t *scales,
                          fp4d_quantize_result *result);

/*
 * Dequantizes to f32: x = (e2m1(q) * scale(sf)) * decode_scale, each product rounded to f32
 * (the first product is exact). decode_scale is ignored (1) for MXFP4.
 */
fp4d_status fp4d_dequantize(fp4d_dtype format, fp4d_scale_layout scale_layout,
                            const uint8_t *codes, const uint8_t *scales, float decode_scale,
                            int64_t rows, int64_t cols, float *dst);

/* Converts a row-major array of f32/bf16/f16 to f32 (exact widening). */
void fp4d_to_f32(fp4d_dtype src_type, const void *src, size_t count, float *dst);
/* Rounds f32 to f32/bf16/f16 (RNE). */
void fp4d_from_f32(fp4d_dtype dst_type, const float *src, size_t count, void *dst);

#ifdef __cplusplus
}
#endif
#endif
