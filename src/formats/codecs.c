/*
 * Scalar codecs: e2m1, e4m3fn, ue4m3, ue8m0, bf16 and fp16 <-> f32 (spec §1-§3).
 *
 * Every encoder works on the bit pattern of its input with integer arithmetic only, so
 * the result depends neither on the rounding mode nor on FTZ/DAZ flags of the FP
 * environment, and subnormal inputs are rounded exactly. Each one is checked bit for bit
 * against CUDA 13's host-side conversions over all 2^32 floats (tests/exhaustive/).
 */
#include <string.h>

#include "fp4doctor/formats.h"
#include "formats/formats_internal.h"

/* Rounds a finite, nonzero magnitude (abs bits of an f32) to nearest-even in a small
 * binary float format with `mant_bits` explicit mantissa bits, smallest normal exponent
 * `min_exp` (unbiased) and exponent bias `bias`. Returns the magnitude code
 * (biased_exponent << mant_bits | mantissa), which may exceed the format's largest code:
 * the caller decides what overflow means (saturate, NaN or infinity).
 *
 * The code formula works because codes of one format are monotonic in value: once the
 * significand is rounded at the quantum of the input's binade, adding it to the binade's
 * base code carries into the exponent field exactly when rounding crosses a power of two,
 * and in the subnormal binade (base code 1 << mant_bits, quantum of min_exp) it yields
 * the subnormal code itself. */
static uint32_t round_magnitude_rne(uint32_t abs_bits, int mant_bits, int min_exp, int bias)
{
    int biased = (int)(abs_bits >> 23);
    uint32_t significand = abs_bits & 0x7FFFFFu;
    int sig_exp; /* value = significand * 2^sig_exp */
    int value_exp;
    if (biased == 0) {          /* f32 subnormal: below every target's normal range */
        sig_exp = -149;
        value_exp = -127;
    } else {
        significand |= 0x800000u;
        sig_exp = biased - 150;
        value_exp = biased - 127;
    }
    int binade_exp = value_exp > min_exp ? value_exp : min_exp;
    int shift = (binade_exp - mant_bits) - sig_exp; /* > 0 for every format used here */
    uint32_t q;
    if (shift >= 26) {
        /* significand < 2^24 <= 2^(shift-2): below a quarter quantum, rounds to zero. */
        q = 0;
    } else {
        q = significand >> shift;
        uint32_t rem = significand & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u))) q++;
    }
    return ((uint32_t)(binade_exp + bias) << mant_bits) + q - (1u << mant_bits);
}

static inline uint32_t f32_bits(float x)
{
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}

static inline float f32_from_bits(uint32_t b)
{
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
}

uint32_t fp4d_f32_bits(float x) { return f32_bits(x); }
float    fp4d_f32_from_bits(uint32_t b) { return f32_from_bits(b); }

/* ---- e2m1 (§1) ----------------------------------------------------------------------- */

/* Decision boundaries of RNE (§1.2 table) as f32 bit patterns: positive floats order like
 * their bits. Ties at 0.25, 1.25 and 5.0 go down (to even 0, 1.0, 4.0); ties at 0.75,
 * 1.75 and 3.5 go up (to even 1.0, 2.0, 4.0), hence <= versus < below. */
#define E2M1_B_0_25 0x3E800000u
#define E2M1_B_0_75 0x3F400000u
#define E2M1_B_1_25 0x3FA00000u
#define E2M1_B_1_75 0x3FE00000u
#define E2M1_B_2_5  0x40200000u
#define E2M1_B_3_5  0x40600000u
#define E2M1_B_5_0  0x40A00000u
#define F32_INF_BITS 0x7F800000u

uint8_t fp4d_e2m1_from_f32(float x)
{
    uint32_t b = f32_bits(x);
    uint32_t a = b & 0x7FFFFFFFu;
    if (a > F32_INF_BITS) return 0x7; /* NaN -> +6, sign dropped (cuda_fp4.h) */
    uint8_t sign = (uint8_t)((b >> 31) << 3);
    uint8_t c = a <= E2M1_B_0_25 ? 0 : a < E2M1_B_0_75 ? 1 : a <= E2M1_B_1_25 ? 2
              : a < E2M1_B_1_75 ? 3 : a <= E2M1_B_2_5 ? 4 : a < E2M1_B_3_5 ? 5
              : a <= E2M1_B_5_0 ? 6 : 7;
    return (uint8_t)(sign | c);
}

uint8_t fp4d_e2m1_from_f32_rz(float x)
{
    uint32_t b = f32_bits(x);
    uint32_t a = b & 0x7FFFFFFFu;
    if (a > F32_INF_BITS) return 0x7;
    uint8_t sign = (uint8_t)((b >> 31) << 3);
    /* Truncation: each code covers [value, next value). Above 6 saturates (CUDA clamps
     * anything > 6, including inf, to MAXNORM in both rounding modes). */
    uint8_t c = a < 0x3F000000u ? 0 : a < 0x3F800000u ? 1 : a < 0x3FC00000u ? 2
              : a < 0x40000000u ? 3 : a < 0x40400000u ? 4 : a < 0x40800000u ? 5
              : a < 0x40C00000u ? 6 : 7;
    return (uint8_t)(sign | c);
}

static const float e2m1_values[16] = {
    0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f,
};

float fp4d_e2m1_to_f32(uint8_t code) { return e2m1_values[code & 0xF]; }

/* ---- e4m3fn (§2) --------------------------------------------------------------------- */

uint8_t fp4d_e4m3_from_f32(float x, fp4d_saturation sat)
{
    uint32_t b = f32_bits(x);
    uint32_t a = b & 0x7FFFFFFFu;
    if (a > F32_INF_BITS) return 0x7F; /* NaN, either sign (CUDA float API) */
    uint8_t sign = (uint8_t)((b >> 31) << 7);
    if (a == 0) return sign;
    /* inf and anything rounding past 448 (i.e. > 464, §2.2) overflows. */
    uint32_t code = a == F32_INF_BITS ? 0x7Fu : round_magnitude_rne(a, 3, -6, 7);
    if (code > 0x7Eu) return (uint8_t)(sign | (sat == FP4D_SATFINITE ? 0x7E : 0x7F));
    return (uint8_t)(sign | code);
}

/* Decoded straight from the bit fields (0x7F/0xFF NaN, 0x80 -0.0). */
static float e4m3_decode_fields(uint8_t v)
{
    uint32_t sign = (uint32_t)(v >> 7) << 31;
    uint32_t e = (v >> 3) & 0xF;
    uint32_t m = v & 0x7;
    if (e == 0xF && m == 0x7) return f32_from_bits(sign | 0x7FC00000u); /* NaN */
    if (e == 0) {
        /* m * 2^-9: exact (a small integer times a power of two that is a normal f32). */
        float mag = (float)m * 0x1p-9f;
        return f32_from_bits(sign | f32_bits(mag));
    }
    return f32_from_bits(sign | ((e - 7 + 127) << 23) | (m << 20));
}

float fp4d_e4m3_to_f32(uint8_t b) { return e4m3_decode_fields(b); }

/* ---- ue4m3 (§2.5) -------------------------------------------------------------------- */

uint8_t fp4d_ue4m3_from_f32(float x)
{
    uint32_t a = f32_bits(x) & 0x7FFFFFFFu;
    return fp4d_e4m3_from_f32(f32_from_bits(a), FP4D_SATFINITE); /* NaN -> 0x7F too */
}

float fp4d_ue4m3_to_f32(uint8_t b)
{
    if (b & 0x80) return f32_from_bits(0x7FC00000u); /* not a ue4m3 value */
    return e4m3_decode_fields(b);
}

/* ---- ue8m0 (§3) ---------------------------------------------------------------------- */

uint8_t fp4d_ue8m0_from_f32(float x, fp4d_rounding rounding, fp4d_saturation sat)
{
    uint32_t a = f32_bits(x) & 0x7FFFFFFFu; /* sign ignored */
    if (a > F32_INF_BITS) return 0xFF;
    if (a == F32_INF_BITS) return sat == FP4D_SATFINITE ? 0xFE : 0xFF;
    uint32_t biased = a >> 23;
    if (rounding == FP4D_ROUND_UP) {
        if (biased == 0) {
            /* Results below 2^-127 clip to 2^-127 (code 0); (2^-127, 2^-126] -> 2^-126. */
            return a > 0x00400000u ? 0x01 : 0x00;
        }
        uint32_t code = biased + ((a & 0x7FFFFFu) != 0);
        if (code == 0xFF) return sat == FP4D_SATFINITE ? 0xFE : 0xFF;
        return (uint8_t)code;
    }
    /* Toward zero (RNE is not offered by CUDA for ue8m0; treated as toward zero).
     * f32 subnormals and zero clip to 2^-127; finite floats never exceed 2^127. */
    return (uint8_t)biased;
}

float fp4d_ue8m0_to_f32(uint8_t b)
{
    if (b == 0xFF) return f32_from_bits(0x7FC00000u);
    if (b == 0) return f32_from_bits(0x00400000u); /* 2^-127, an f32 subnormal */
    return f32_from_bits((uint32_t)b << 23);
}

/* ---- bf16 / fp16 --------------------------------------------------------------------- */

/* NaN -> 0x7FFF for both, as CUDA's host paths (__float2bfloat16_rn, __float2half_rn)
 * produce: the sign and payload of a NaN are not kept. */

uint16_t fp4d_bf16_from_f32(float x)
{
    uint32_t b = f32_bits(x);
    uint32_t a = b & 0x7FFFFFFFu;
    if (a > F32_INF_BITS) return 0x7FFF;
    uint16_t sign = (uint16_t)((b >> 16) & 0x8000u);
    if (a == F32_INF_BITS || a == 0) return (uint16_t)(sign | (a >> 16));
    uint32_t code = round_magnitude_rne(a, 7, -126, 127);
    if (code >= 0x7F80u) code = 0x7F80u; /* RNE overflow is infinity */
    return (uint16_t)(sign | code);
}

float fp4d_bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

uint16_t fp4d_f16_from_f32(float x)
{
    uint32_t b = f32_bits(x);
    uint32_t a = b & 0x7FFFFFFFu;
    if (a > F32_INF_BITS) return 0x7FFF;
    uint16_t sign = (uint16_t)((b >> 16) & 0x8000u);
    if (a == F32_INF_BITS) return (uint16_t)(sign | 0x7C00u);
    if (a == 0) return sign;
    uint32_t code = round_magnitude_rne(a, 10, -14, 15);
    if (code >= 0x7C00u) code = 0x7C00u;
    return (uint16_t)(sign | code);
}

float fp4d_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1F;
    uint32_t m = h & 0x3FFu;
    if (e == 0x1F) return f32_from_bits(sign | 0x7F800000u | (m << 13)); /* inf, NaN payload kept */
    if (e == 0) {
        float mag = (float)m * 0x1p-24f; /* exact: m < 2^10 and 2^-24 is a normal f32 */
        return f32_from_bits(sign | f32_bits(mag));
    }
    return f32_from_bits(sign | ((e - 15 + 127) << 23) | (m << 13));
}
