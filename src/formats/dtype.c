/* The element-type traits table (formats are data) and plain-type conversions. */
#include <string.h>
#include <strings.h>

#include "fp4doctor/formats.h"

static float nvfp4_scale_to_f32(uint8_t b) { return fp4d_ue4m3_to_f32(b); }
static float mxfp4_scale_to_f32(uint8_t b) { return fp4d_ue8m0_to_f32(b); }

static const fp4d_dtype_traits dtype_traits[FP4D_DTYPE_COUNT] = {
    [FP4D_DTYPE_F32] = {
        .name = "f32", .dtype = FP4D_DTYPE_F32, .element_bits = 32, .block_size = 1,
        .scale_kind = FP4D_SCALE_NONE, .has_tensor_scale = false, .is_block_fp4 = false,
        .scale_to_f32 = NULL },
    [FP4D_DTYPE_BF16] = {
        .name = "bf16", .dtype = FP4D_DTYPE_BF16, .element_bits = 16, .block_size = 1,
        .scale_kind = FP4D_SCALE_NONE, .has_tensor_scale = false, .is_block_fp4 = false,
        .scale_to_f32 = NULL },
    [FP4D_DTYPE_F16] = {
        .name = "f16", .dtype = FP4D_DTYPE_F16, .element_bits = 16, .block_size = 1,
        .scale_kind = FP4D_SCALE_NONE, .has_tensor_scale = false, .is_block_fp4 = false,
        .scale_to_f32 = NULL },
    [FP4D_DTYPE_NVFP4] = {
        .name = "nvfp4", .dtype = FP4D_DTYPE_NVFP4, .element_bits = 4, .block_size = 16,
        .scale_kind = FP4D_SCALE_E4M3, .has_tensor_scale = true, .is_block_fp4 = true,
        .scale_to_f32 = nvfp4_scale_to_f32 },
    [FP4D_DTYPE_MXFP4] = {
        .name = "mxfp4", .dtype = FP4D_DTYPE_MXFP4, .element_bits = 4, .block_size = 32,
        .scale_kind = FP4D_SCALE_UE8M0, .has_tensor_scale = false, .is_block_fp4 = true,
        .scale_to_f32 = mxfp4_scale_to_f32 },
};

const fp4d_dtype_traits *fp4d_dtype_get(fp4d_dtype t)
{
    if ((unsigned)t >= FP4D_DTYPE_COUNT) return NULL;
    return &dtype_traits[t];
}

bool fp4d_dtype_from_name(const char *name, fp4d_dtype *out)
{
    if (!name) return false;
    for (unsigned i = 0; i < FP4D_DTYPE_COUNT; i++) {
        if (strcasecmp(name, dtype_traits[i].name) == 0) {
            if (out) *out = (fp4d_dtype)i;
            return true;
        }
    }
    static const struct { const char *alias; fp4d_dtype t; } aliases[] = {
        { "fp16", FP4D_DTYPE_F16 }, { "float16", FP4D_DTYPE_F16 }, { "half", FP4D_DTYPE_F16 },
        { "fp32", FP4D_DTYPE_F32 }, { "float32", FP4D_DTYPE_F32 }, { "float", FP4D_DTYPE_F32 },
        { "bfloat16", FP4D_DTYPE_BF16 },
    };
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++) {
        if (strcasecmp(name, aliases[i].alias) == 0) {
            if (out) *out = aliases[i].t;
            return true;
        }
    }
    return false;
}

size_t fp4d_dtype_data_bytes(fp4d_dtype t, int64_t rows, int64_t cols)
{
    const fp4d_dtype_traits *tr = fp4d_dtype_get(t);
    if (!tr || rows < 0 || cols < 0) return 0;
    /* a size that does not fit is SIZE_MAX (no allocation succeeds), not a wrapped small one */
    uint64_t elems, bits;
    if (__builtin_mul_overflow((uint64_t)rows, (uint64_t)cols, &elems) ||
        __builtin_mul_overflow(elems, (uint64_t)tr->element_bits, &bits) || (bits + 7) / 8 > SIZE_MAX)
        return SIZE_MAX;
    return (size_t)((bits + 7) / 8);
}

void fp4d_to_f32(fp4d_dtype src_type, const void *src, size_t count, float *dst)
{
    switch (src_type) {
    case FP4D_DTYPE_F32:
        if ((const void *)dst != src) memmove(dst, src, count * sizeof(float));
        break;
    case FP4D_DTYPE_BF16: {
        const uint16_t *h = src;
        for (size_t i = 0; i < count; i++) dst[i] = fp4d_bf16_to_f32(h[i]);
        break;
    }
    case FP4D_DTYPE_F16: {
        const uint16_t *h = src;
        for (size_t i = 0; i < count; i++) dst[i] = fp4d_f16_to_f32(h[i]);
        break;
    }
    default:
        break; /* block formats need scales: fp4d_dequantize */
    }
}

void fp4d_from_f32(fp4d_dtype dst_type, const float *src, size_t count, void *dst)
{
    switch (dst_type) {
    case FP4D_DTYPE_F32:
        if ((void *)src != dst) memmove(dst, src, count * sizeof(float));
        break;
    case FP4D_DTYPE_BF16: {
        uint16_t *h = dst;
        for (size_t i = 0; i < count; i++) h[i] = fp4d_bf16_from_f32(src[i]);
        break;
    }
    case FP4D_DTYPE_F16: {
        uint16_t *h = dst;
        for (size_t i = 0; i < count; i++) h[i] = fp4d_f16_from_f32(src[i]);
        break;
    }
    default:
        break; /* block formats: fp4d_quantize */
    }
}
