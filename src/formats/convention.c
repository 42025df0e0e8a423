/*
 * Quantizer conventions (spec §3.4 and §4): how each producer of NVFP4/MXFP4 data picks the
 * per-tensor scale, the block scale and the element codes. Each convention is a pair
 * (tensor-level context, per-block quantizer); fp4d_quantize (quantize.c) drives them.
 *
 * Every arithmetic step below is one IEEE binary32 operation, written in the order and
 * association of the source it reproduces, evaluated with the default rounding mode
 * (round to nearest even) and with subnormals (the library is never built with
 * -ffast-math). Where a GPU source flushes subnormals or uses approximate instructions,
 * the comment says how that is modelled. docs/formats.md collects the choices.
 */
#include <float.h>
#include <math.h>
#include <string.h>
#include <strings.h>

#include "fp4doctor/formats.h"
#include "formats/formats_internal.h"

/* 1.0f/6.0f rounded to nearest: 0x3E2AAAAB. rcp.approx.ftz.f32(6.0f) returns this same
 * value on sm_90 (spec M2b), so the fast and exact CUDA paths share the constant. */
#define RCP6 (1.0f / 6.0f)

/* E2M1_MAX * E4M3_MAX: the amax that maps to the largest block scale (§4.0). */
#define NVFP4_AMAX_TO_SCALE 2688.0f

static const char *const convention_names[FP4D_CONV_COUNT] = {
    [FP4D_CONV_FLASHINFER_EXACT]   = "flashinfer-exact",
    [FP4D_CONV_TRTLLM]             = "trtllm",
    [FP4D_CONV_MODELOPT]           = "modelopt",
    [FP4D_CONV_TORCHAO]            = "torchao",
    [FP4D_CONV_COMPRESSED_TENSORS] = "compressed-tensors",
    [FP4D_CONV_OCP]                = "ocp",
};

const char *fp4d_convention_name(fp4d_convention c)
{
    if ((unsigned)c >= FP4D_CONV_COUNT) return "unknown";
    return convention_names[c];
}

bool fp4d_convention_from_name(const char *name, fp4d_convention *out)
{
    static const struct { const char *alias; fp4d_convention c; } aliases[] = {
        { "flashinfer", FP4D_CONV_FLASHINFER_EXACT }, { "fi-exact", FP4D_CONV_FLASHINFER_EXACT },
        { "tensorrt-llm", FP4D_CONV_TRTLLM }, { "trt-llm", FP4D_CONV_TRTLLM },
        { "ao", FP4D_CONV_TORCHAO }, { "ct", FP4D_CONV_COMPRESSED_TENSORS },
        { "llm-compressor", FP4D_CONV_COMPRESSED_TENSORS },
    };
    if (!name) return false;
    for (unsigned i = 0; i < FP4D_CONV_COUNT; i++) {
        if (strcasecmp(name, convention_names[i]) == 0) {
            if (out) *out = (fp4d_convention)i;
            return true;
        }
    }
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++) {
        if (strcasecmp(name, aliases[i].alias) == 0) {
            if (out) *out = aliases[i].c;
            return true;
        }
    }
    return false;
}

bool fp4d_convention_supports(fp4d_convention c, fp4d_dtype format)
{
    if (format == FP4D_DTYPE_NVFP4) {
        return c == FP4D_CONV_FLASHINFER_EXACT || c == FP4D_CONV_TRTLLM || c == FP4D_CONV_MODELOPT
            || c == FP4D_CONV_TORCHAO || c == FP4D_CONV_COMPRESSED_TENSORS;
    }
    if (format == FP4D_DTYPE_MXFP4) {
        return c == FP4D_CONV_FLASHINFER_EXACT || c == FP4D_CONV_TRTLLM || c == FP4D_CONV_OCP;
    }
    return false;
}

/* ---- small helpers ------------------------------------------------------------------- */

static inline bool is_nan(float v) { return v != v; }

/* Block amax the way CUDA kernels take it with __habs2/__hmax2/__hmax: a NaN operand is
 * ignored, so NaN comes out only when every element is NaN (§4.1 step 1). */
static float block_amax_nan_ignored(const float *x, int n)
{
    float m = 0.0f;
    int nans = 0;
    for (int i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (is_nan(a)) nans++;
        else if (a > m) m = a;
    }
    return nans == n ? NAN : m;
}

/* torch.amax(abs(x)): NaN propagates, inf is kept. */
static float block_amax_torch(const float *x, int n)
{
    float m = 0.0f;
    for (int i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (is_nan(a)) return NAN;
        if (a > m) m = a;
    }
    return m;
}

static inline bool is_f32_subnormal_or_zero(float v)
{
    return (fp4d_f32_bits(v) & 0x7F800000u) == 0;
}

/* rcp.approx.ftz.f32 modelled as the correctly rounded reciprocal with flush-to-zero of
 * subnormal inputs and results. The hardware instruction is not correctly rounded
 * (spec M2b: 13.2% of mantissas differ by 1 ulp on sm_90; Blackwell UNVERIFIED) and its
 * table is not public, so this BOUNDS the GPU rather than reproducing it: a scale or code
 * computed through it can differ from the kernel's by one step on rare inputs. */
static float rcp_approx_ftz(float v)
{
    if (is_f32_subnormal_or_zero(v)) return signbit(v) ? -INFINITY : INFINITY;
    float r = 1.0f / v;
    if (is_f32_subnormal_or_zero(r)) return signbit(r) ? -0.0f : 0.0f;
    return r;
}

/* e2m1 magnitude code by RNE, NaN excluded by the callers. */
static inline uint8_t e2m1_magnitude(float v) { return (uint8_t)(fp4d_e2m1_from_f32(fabsf(v)) & 0x7); }

static inline float clamp_pm6_nan_kept(float v)
{
    /* torch.clamp keeps NaN. */
    if (v > 6.0f) return 6.0f;
    if (v < -6.0f) return -6.0f;
    return v;
}

/* 2^k for integer k in [-149, 127], exactly (subnormals included). */
static float exact_pow2(int k)
{
    if (k >= -126) return fp4d_f32_from_bits((uint32_t)(k + 127) << 23);
    return fp4d_f32_from_bits(1u << (k + 149));
}

/* ---- tensor-level context ------------------------------------------------------------ */

void fp4d_convention_tensor_ctx(fp4d_convention c, fp4d_dtype format, const fp4d_tensor_stats *st,
                                float encode_scale, fp4d_tensor_ctx *ctx,
                                float *report_decode, float *report_encode)
{
    memset(ctx, 0, sizeof *ctx);
    if (format != FP4D_DTYPE_NVFP4) { /* MXFP4 has no tensor scale */
        ctx->gs = ctx->gd = 1.0f;
        *report_decode = *report_encode = 1.0f;
        return;
    }
    const bool given = encode_scale > 0.0f;
    switch (c) {
    case FP4D_CONV_MODELOPT:
    case FP4D_CONV_TORCHAO: {
        /* The decode scale is primary: ModelOpt weight_scale_2 = amax/(6*448) (§4.5),
         * torchao per_tensor_scale = amax/(448*6) (§4.6), amax by torch (NaN propagates).
         * A given encode scale becomes its correctly rounded reciprocal. */
        float gd = given ? 1.0f / encode_scale : st->amax_torch / NVFP4_AMAX_TO_SCALE;
        ctx->gd = gd;
        ctx->gs = 1.0f / gd;
        *report_decode = gd;
        *report_encode = ctx->gs;
        return;
    }
    case FP4D_CONV_COMPRESSED_TENSORS: {
        /* generate_gparam (§4.7): 448*6 / max(A, f32 tiny); NaN or inf -> 1.0. */
        float gs = encode_scale;
        if (!given) {
            float a = st->amax_torch;
            if (!is_nan(a) && a < FLT_MIN) a = FLT_MIN;
            gs = NVFP4_AMAX_TO_SCALE / a;
            if (is_nan(gs) || isinf(gs)) gs = 1.0f;
        }
        ctx->gs = gs;
        ctx->gd = 1.0f / gs;
        /* CT stores the encode scale; the equivalent ModelOpt scale_2 is its reciprocal
         * (CT's ModelOpt converter and vLLM's loader both use 1/gs). */
        *report_decode = ctx->gd;
        *report_encode = gs;
        return;
    }
    case FP4D_CONV_FLASHINFER_EXACT:
    case FP4D_CONV_TRTLLM:
    default: {
        /* FI/TRT-LLM take the encode scale gs = 2688/amax with
         * amax = x.abs().nan_to_num().max() (NaN ignored, inf -> FLT_MAX), §4.0. The
         * decode scale we report is RN(amax/2688), what ModelOpt stores as scale_2; it is
         * within one ulp of 1/gs. With a given gs (static scale) it is RN(1/gs). */
        float amax = st->amax_finite_nan_ignored;
        float gs = given ? encode_scale : NVFP4_AMAX_TO_SCALE / amax; /* amax 0 -> +inf */
        ctx->gs = gs;
        ctx->gd = 1.0f / gs;
        *report_encode = gs;
        *report_decode = given ? 1.0f / gs : amax / NVFP4_AMAX_TO_SCALE;
        return;
    }
    }
}

/* ---- NVFP4 block quantizers ---------------------------------------------------------- */

/* §4.2, FlashInfer with FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH ("match TE"): every
 * operation correctly rounded. FlashInfer's JIT also passes -use_fast_math, which flushes
 * subnormal f32 operands of the multiplies; that only matters when x itself or 1/gs is an
 * f32 subnormal (tensors with amax below ~1e-35) and is not modelled. */
static uint8_t nvfp4_flashinfer_exact(const fp4d_tensor_ctx *ctx, const float *x, int n, uint8_t *q)
{
    const float gs = ctx->gs;
    const float vmax = block_amax_nan_ignored(x, n);
    const float sf = vmax != 0.0f ? vmax * (gs * RCP6) : 0.0f;
    const uint8_t sf_byte = fp4d_e4m3_from_f32(sf, FP4D_SATFINITE);
    const float sfq = fp4d_e4m3_to_f32(sf_byte);
    float out_scale = 0.0f;
    if (vmax != 0.0f) out_scale = fminf(1.0f / (sfq * (1.0f / gs)), FLT_MAX); /* fminf(NaN,M)=M */
    for (int i = 0; i < n; i++) q[i] = fp4d_e2m1_from_f32(x[i] * out_scale);
    return sf_byte;
}

/* §4.1, TRT-LLM / FlashInfer default ("fast math") kernel cvt_warp_fp16_to_fp4: note the
 * association gs * (vmax * RCP6), no guard on the scale, and both reciprocals through
 * rcp.approx.ftz (modelled by rcp_approx_ftz above: a bound, not a bit-exact emulation).
 * An underflowed scale (byte 0x00) gives outScale = +inf: nonzero x -> +-6, zero -> NaN
 * -> 0x7, as the kernel does (§4.8). */
static uint8_t nvfp4_trtllm(const fp4d_tensor_ctx *ctx, const float *x, int n, uint8_t *q)
{
    const float gs = ctx->gs;
    const float vmax = block_amax_nan_ignored(x, n);
    const float sf = gs * (vmax * RCP6);
    const uint8_t sf_byte = fp4d_e4m3_from_f32(sf, FP4D_SATFINITE);
    const float sfq = fp4d_e4m3_to_f32(sf_byte);
    const float out_scale = vmax != 0.0f ? rcp_approx_ftz(sfq * rcp_approx_ftz(gs)) : 0.0f;
    for (int i = 0; i < n; i++) q[i] = fp4d_e2m1_from_f32(x[i] * out_scale);
    return sf_byte;
}

/* torch's .to(float8_e4m3fn) of a non-negative scale: RNE without saturation (> 464 and
 * inf -> NaN, §2.4). A NaN scale is written 0x7F: torch would give 0xFF for a NaN whose
 * sign bit is set (x86's default NaN from 0/0 is negative, CUDA's is positive), and a
 * positive-only scale format has no use for the distinction. */
static uint8_t scale_byte_torch_cast(float s)
{
    if (is_nan(s)) return 0x7F;
    return fp4d_e4m3_from_f32(s, FP4D_NOSAT);
}

/* §4.5, ModelOpt NVFP4QTensor (weights at export). Element cast _cast_fp4: RNE through
 * searchsorted, NaN -> 0x7, sign bit from x < 0 (so -0.0 -> 0x0, §1.4). */
static uint8_t nvfp4_modelopt(const fp4d_tensor_ctx *ctx, const float *x, int n, uint8_t *q)
{
    const float wsf2 = ctx->gd;
    const float vmax = block_amax_torch(x, n);
    float per_block_scale = vmax / (6.0f * wsf2);
    if (per_block_scale == 0.0f) per_block_scale = 1.0f;
    const uint8_t sf_byte = scale_byte_torch_cast(per_block_scale);
    const float denom = fp4d_e4m3_to_f32(sf_byte) * wsf2;
    for (int i = 0; i < n; i++) {
        const float v = x[i] / denom;
        if (is_nan(v)) q[i] = 0x7;
        else q[i] = (uint8_t)((v < 0.0f ? 0x8 : 0x0) | e2m1_magnitude(v));
    }
    return sf_byte;
}

/* torchao f32_to_f4_unpacked: RNE with saturation, -0.0 -> 0x8. NaN takes its "normal"
 * branch and wraps to 0x3 (spec §1.4, derived from the code, not run); the sign of that
 * NaN depends on the platform in torch, so we take the sign of the input element. */
static inline uint8_t torchao_e2m1(float v, float input)
{
    if (is_nan(v)) return (uint8_t)(signbit(input) ? 0xB : 0x3);
    return fp4d_e2m1_from_f32(v);
}

/* §4.6, torchao nvfp4_quantize with a per-tensor scale (pts = amax/2688): block scale
 * clamped to [2^-6, 448] before the cast (never 0x00..0x07), elements multiplied by
 * (1/pts)/s, clamped to +-6. */
static uint8_t nvfp4_torchao(const fp4d_tensor_ctx *ctx, const float *x, int n, uint8_t *q)
{
    const float pts = ctx->gd;
    const float vmax = block_amax_torch(x, n);
    const float block_scale = vmax / 6.0f;
    float s = block_scale / pts;
    if (s < 0x1p-6f) s = 0x1p-6f;      /* torch.clamp: NaN passes through */
    if (s > 448.0f) s = 448.0f;
    const uint8_t sf_byte = scale_byte_torch_cast(s);
    const float sfq = fp4d_e4m3_to_f32(sf_byte);
    const float mult = (1.0f / pts) / sfq;
    for (int i = 0; i < n; i++) q[i] = torchao_e2m1(clamp_pm6_nan_kept(x[i] * mult), x[i]);
    return sf_byte;
}

/* §4.7, compressed-tensors / llm-compressor: scale = gs * (amax_b/6) clamped to +-448,
 * cast, zero replaced by the fp8 eps 0.125 (byte 0x30); x / (scale/gs) clamped to +-6,
 * RNE (the CPU cast_to_fp4 thresholds; CT's Triton path double-rounds through bf16 and
 * is not modelled), sign from signbit. NaN elements: the packer's argmin over |x - LUT|
 * returns the first index for an all-NaN row, i.e. magnitude 0 (derived, UNVERIFIED). */
static uint8_t nvfp4_compressed_tensors(const fp4d_tensor_ctx *ctx, const float *x, int n, uint8_t *q)
{
    const float gs = ctx->gs;
    const float vmax = block_amax_torch(x, n);
    float scale = gs * (vmax / 6.0f);
    if (scale > 448.0f) scale = 448.0f;
    uint8_t sf_byte = scale_byte_torch_cast(scale);
    float sfq = fp4d_e4m3_to_f32(sf_byte);
    if (sfq == 0.0f) {
        sfq = 0.125f;
        sf_byte = 0x30;
    }
    const float denom = sfq / gs;
    for (int i = 0; i < n; i++) {
        const float v = clamp_pm6_nan_kept(x[i] / denom);
        /* The sign of a NaN quotient is the platform's choice; take the input's. */
        const uint8_t sign = signbit(is_nan(v) ? x[i] : v) ? 0x8 : 0x0;
        q[i] = (uint8_t)(sign | (is_nan(v) ? 0 : e2m1_magnitude(v)));
    }
    return sf_byte;
}

/* ---- MXFP4 block quantizers ---------------------------------------------------------- */

/* §3.4, TRT-LLM / FlashInfer UE8M0_SF: S = ue8m0_RP_SATFINITE(amax * RCP6) (the ceiling
 * power of two of amax/6; amax 0 -> 0x00, all-NaN -> 0xFF), element multiplier
 * exp2f_rcp(S) = S == 0 ? 1 : 2^(127-S) (the kernel's quirk: not 2^127 for S == 0), 0 for
 * an all-zero block; then RNE e2m1. RCP6 is the same constant on both CUDA paths, so
 * flashinfer-exact and trtllm coincide for MXFP4. */
static uint8_t mxfp4_ceil_pow2(const fp4d_tensor_ctx *ctx, const float *x, int n, uint8_t *q)
{
    (void)ctx;
    const float vmax = block_amax_nan_ignored(x, n);
    const uint8_t s = fp4d_ue8m0_from_f32(vmax * RCP6, FP4D_ROUND_UP, FP4D_SATFINITE);
    float out_scale = 0.0f;
    if (vmax != 0.0f) out_scale = s == 0 ? 1.0f : exact_pow2(127 - (int)s);
    for (int i = 0; i < n; i++) q[i] = fp4d_e2m1_from_f32(x[i] * out_scale);
    return s;
}

/* OCP MX v1.0 floor rule as torchao's to_mx(ScaleCalculationMode.FLOOR) computes it:
 * S = floor(log2(amax)) - 2 + 127 from the exponent field of amax (2 = floor(log2 6)),
 * clamped to [0, 255]; a non-finite amax (NaN propagates, inf) gives 0xFF. Elements are
 * divided by max(2^(S-127), 2^-126) (inf for 0xFF), clamped to +-6, RNE. Values up to
 * 8 * 2^S - the floor rule's headroom gap - saturate to 6. */
static uint8_t mxfp4_ocp_floor(const fp4d_tensor_ctx *ctx, const float *x, int n, uint8_t *q)
{
    (void)ctx;
    const float vmax = block_amax_torch(x, n);
    uint8_t s;
    float scale;
    if (!isfinite(vmax)) {
        s = 0xFF;
        scale = INFINITY;
    } else {
        int unbiased = (int)(fp4d_f32_bits(vmax) >> 23) - 127 - 2;
        if (unbiased < -127) unbiased = -127;
        s = (uint8_t)(unbiased + 127);
        scale = exact_pow2(unbiased < -126 ? -126 : unbiased);
    }
    for (int i = 0; i < n; i++) q[i] = fp4d_e2m1_from_f32(clamp_pm6_nan_kept(x[i] / scale));
    return s;
}

fp4d_block_quantizer fp4d_convention_block_quantizer(fp4d_convention c, fp4d_dtype format)
{
    if (!fp4d_convention_supports(c, format)) return NULL;
    if (format == FP4D_DTYPE_MXFP4) return c == FP4D_CONV_OCP ? mxfp4_ocp_floor : mxfp4_ceil_pow2;
    switch (c) {
    case FP4D_CONV_FLASHINFER_EXACT:   return nvfp4_flashinfer_exact;
    case FP4D_CONV_TRTLLM:             return nvfp4_trtllm;
    case FP4D_CONV_MODELOPT:           return nvfp4_modelopt;
    case FP4D_CONV_TORCHAO:            return nvfp4_torchao;
    case FP4D_CONV_COMPRESSED_TENSORS: return nvfp4_compressed_tensors;
    default:                           return NULL;
    }
}
