/*
 * ref_exact.h - exact arithmetic for the reference GEMM (internal).
 *
 * A fixed-point "superaccumulator" (Kulisch style): a 640-bit two's-complement integer whose
 * bit 0 weighs 2^-320. Every product the reference can meet is an integer times a power of
 * two between 2^-277 (f32 subnormal 2^-149 times e2m1 0.5 times ue8m0 2^-127) and about
 * 2^262 (f32 max times 6 times 2^127, times 16 for a chunk), so any sum of them up to
 * 2^40 terms, multiplied by a 24-bit alpha significand, stays inside the 639 magnitude bits
 * and is held exactly. Rounding then happens once, directly into the output format.
 */
#ifndef FP4D_REF_EXACT_H
#define FP4D_REF_EXACT_H

#include <stdbool.h>
#include <stdint.h>

#define FP4D_SACC_LIMBS   10
#define FP4D_SACC_LSB_EXP (-320) /* weight of bit 0 is 2^FP4D_SACC_LSB_EXP */

typedef struct fp4d_sacc {
    uint64_t limb[FP4D_SACC_LIMBS]; /* little-endian, two's complement */
} fp4d_sacc;

/* A binary floating-point output format: p significand bits (hidden bit included). */
typedef struct fp4d_float_format {
    int p, emin, emax, width;
} fp4d_float_format;

extern const fp4d_float_format fp4d_format_f32, fp4d_format_bf16, fp4d_format_f16, fp4d_format_f64;

static inline void fp4d_sacc_zero(fp4d_sacc *a)
{
    for (int i = 0; i < FP4D_SACC_LIMBS; i++) a->limb[i] = 0;
}

/*
 * a += v * 2^exp, exactly. The caller guarantees the position is in range (exp between
 * FP4D_SACC_LSB_EXP and FP4D_SACC_LSB_EXP + 575); returns false (and adds nothing) if not,
 * which the callers treat as an internal error.
 */
static inline bool fp4d_sacc_add(fp4d_sacc *a, int64_t v, int exp)
{
    if (v == 0) return true;
    int pos = exp - FP4D_SACC_LSB_EXP;
    if (pos < 0 || pos > 64 * (FP4D_SACC_LIMBS - 1) - 1) return false;
    int i = pos >> 6, r = pos & 63;
    uint64_t mag = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    unsigned __int128 sh = (unsigned __int128)mag << r;
    uint64_t lo = (uint64_t)sh, hi = (uint64_t)(sh >> 64);
    uint64_t *L = a->limb;
    if (v > 0) {
        uint64_t s = L[i] + lo;
        uint64_t c = s < lo;
        L[i] = s;
        uint64_t t = L[i + 1] + hi;
        uint64_t c2 = t < hi;
        t += c;
        c2 |= t < c;
        L[i + 1] = t;
        for (int j = i + 2; c2 && j < FP4D_SACC_LIMBS; j++) c2 = ++L[j] == 0;
    } else {
        uint64_t b = L[i] < lo;
        L[i] -= lo;
        uint64_t t = L[i + 1];
        uint64_t b2 = t < hi;
        t -= hi;
        b2 |= t < b;
        t -= b;
        L[i + 1] = t;
        for (int j = i + 2; b2 && j < FP4D_SACC_LIMBS; j++) b2 = L[j]-- == 0;
    }
    return true;
}

static inline bool fp4d_sacc_is_zero(const fp4d_sacc *a)
{
    uint64_t any = 0;
    for (int i = 0; i < FP4D_SACC_LIMBS; i++) any |= a->limb[i];
    return any == 0;
}

/*
 * Rounds alpha * value(a) once, to nearest-even, into fmt and returns the bit pattern
 * (in the low fmt->width bits). alpha must be finite. An exact zero gives +0; a nonzero
 * value that rounds to zero keeps its sign; overflow gives a signed infinity.
 */
uint64_t fp4d_sacc_round(const fp4d_sacc *a, float alpha, const fp4d_float_format *fmt);

/* Bit patterns of the special values of fmt. */
uint64_t fp4d_format_nan(const fp4d_float_format *fmt);              /* positive quiet NaN */
uint64_t fp4d_format_inf(const fp4d_float_format *fmt, bool negative);

#endif
