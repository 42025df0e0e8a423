/*
 * ref_exact.c - the one rounding of the exact reference.
 *
 * alpha * exact_sum is formed exactly (the accumulator's magnitude times alpha's 24-bit
 * significand fits in 11 limbs) and then rounded to nearest-even directly into the target
 * format, subnormals and overflow included. Rounding to bf16 or f16 never goes through f32:
 * that would round twice, and a value just above a bf16 midpoint could land on it in f32
 * and then tie to even the wrong way.
 */
#include <string.h>

#include "ref_exact.h"

/*                                             p    emin   emax  width */
const fp4d_float_format fp4d_format_f32  = {24,  -126,   127,   32};
const fp4d_float_format fp4d_format_bf16 = { 8,  -126,   127,   16};
const fp4d_float_format fp4d_format_f16  = {11,   -14,    15,   16};
const fp4d_float_format fp4d_format_f64  = {53, -1022,  1023,   64};

#define MAG_LIMBS (FP4D_SACC_LIMBS + 1)

uint64_t fp4d_format_inf(const fp4d_float_format *f, bool negative)
{
    int exp_bits = f->width - f->p;
    uint64_t e = ((UINT64_C(1) << exp_bits) - 1) << (f->p - 1);
    return ((uint64_t)negative << (f->width - 1)) | e;
}

uint64_t fp4d_format_nan(const fp4d_float_format *f)
{
    return fp4d_format_inf(f, false) | (UINT64_C(1) << (f->p - 2));
}

/* Bits [s, s+64) of mag; bits past the end read as zero. */
static uint64_t mag_window(const uint64_t *mag, int s)
{
    int i = s >> 6, r = s & 63;
    uint64_t lo = i < MAG_LIMBS ? mag[i] >> r : 0;
    if (r && i + 1 < MAG_LIMBS) lo |= mag[i + 1] << (64 - r);
    return lo;
}

static bool mag_bit(const uint64_t *mag, int s) { return (mag[s >> 6] >> (s & 63)) & 1; }

/* Whether any of bits [0, s) is set. */
static bool mag_any_below(const uint64_t *mag, int s)
{
    int full = s >> 6, r = s & 63;
    for (int i = 0; i < full; i++)
        if (mag[i]) return true;
    return r && (mag[full] & ((UINT64_C(1) << r) - 1));
}

uint64_t fp4d_sacc_round(const fp4d_sacc *a, float alpha, const fp4d_float_format *f)
{
    uint64_t mag[MAG_LIMBS];
    bool neg = a->limb[FP4D_SACC_LIMBS - 1] >> 63;
    memcpy(mag, a->limb, sizeof a->limb);
    mag[MAG_LIMBS - 1] = 0;
    if (neg) { /* two's complement negate of the 640-bit value */
        uint64_t carry = 1;
        for (int i = 0; i < FP4D_SACC_LIMBS; i++) {
            uint64_t v = ~mag[i] + carry;
            carry = carry && v == 0;
            mag[i] = v;
        }
    }

    uint32_t ab;
    memcpy(&ab, &alpha, 4);
    uint32_t aexp = (ab >> 23) & 0xFF;
    uint64_t am = ab & 0x7FFFFF;
    int ae;
    if (aexp == 0) {
        ae = -149;
    } else {
        am |= 0x800000;
        ae = (int)aexp - 150;
    }
    neg ^= (ab >> 31) != 0;

    /* mag *= am (exact: < 2^639 * 2^24 fits in 11 limbs). */
    uint64_t carry = 0;
    for (int i = 0; i < MAG_LIMBS; i++) {
        unsigned __int128 pr = (unsigned __int128)mag[i] * am + carry;
        mag[i] = (uint64_t)pr;
        carry = (uint64_t)(pr >> 64);
    }

    int top = MAG_LIMBS - 1;
    while (top >= 0 && mag[top] == 0) top--;
    if (top < 0) return 0; /* an exact zero (or alpha = 0): +0, see docs/reference.md */

    int h = 64 * top + 63 - __builtin_clzll(mag[top]); /* leading bit index */
    int off = ae + FP4D_SACC_LSB_EXP;                  /* value = mag * 2^off */
    int e = h + off;                                   /* exponent of the leading bit */
    int qexp = (e < f->emin ? f->emin : e) - (f->p - 1); /* exponent of one ulp */
    int shift = qexp - off;                            /* low bits of mag that are rounded off */

    uint64_t sig;
    if (shift <= 0) {
        sig = mag[0] << -shift; /* exact: the value has at most p significant bits here */
    } else {
        sig = mag_window(mag, shift);
        bool half = mag_bit(mag, shift - 1);
        bool sticky = mag_any_below(mag, shift - 1);
        if (half && (sticky || (sig & 1))) sig++;
    }
    if (sig == UINT64_C(1) << f->p) { /* rounding carried into a new binade */
        sig >>= 1;
        qexp++;
    }

    uint64_t field;
    if (sig >= UINT64_C(1) << (f->p - 1)) {
        int E = qexp + f->p - 1;
        if (E > f->emax) return fp4d_format_inf(f, neg);
        field = ((uint64_t)(E + f->emax) << (f->p - 1)) | (sig & ((UINT64_C(1) << (f->p - 1)) - 1));
    } else {
        field = sig; /* subnormal: exponent field 0 */
    }
    return ((uint64_t)neg << (f->width - 1)) | field;
}
