/*
 * The exact reference against an independent oracle.
 *
 * The oracle here shares no code or method with src/ref/:
 *   - values are decoded from the bit patterns with frexp/ldexp and a table of doubles;
 *   - the exact sum is kept as two separate magnitudes (positive and negative terms) in
 *     base-2^32 digits, subtracted only at the end;
 *   - the rounding is a search over the output format's bit patterns (which are monotone in
 *     value for positive numbers), comparing exact values: find p with v(p) <= |x| < v(p+1),
 *     then compare 2|x| with v(p) + v(p+1), ties to the even pattern;
 *   - NaN/Inf come from long double products (exact: at most 32 significant bits) summed in
 *     long double, i.e. from the platform's IEEE arithmetic itself.
 * On top of the random comparisons, hand-derived cases pin the properties that matter:
 * cancellation that f32 accumulation gets visibly wrong, midpoints of bf16/f16 (where
 * rounding through f32 first would be wrong), overflow, subnormals, NaN/Inf.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "fp4doctor/ref.h"

/* ---- random numbers ----------------------------------------------------------------------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static uint32_t rnd_below(uint32_t n) { return (uint32_t)(rnd() % n); }

/* ---- oracle bignum: magnitude in base 2^32, bit 0 weighs 2^BIG_LSB ----------------------- */

#define BIG_DIGITS 72 /* 2304 bits */
#define BIG_LSB (-1000)

typedef struct big {
    uint64_t d[BIG_DIGITS]; /* each < 2^32 after normalisation */
} big;

static void big_norm(big *b)
{
    uint64_t carry = 0;
    for (int i = 0; i < BIG_DIGITS; i++) {
        uint64_t v = b->d[i] + carry;
        b->d[i] = v & 0xFFFFFFFFu;
        carry = v >> 32;
    }
    assert_int_equal(carry, 0);
}

/* b += mag * 2^exp, mag < 2^62 */
static void big_add(big *b, uint64_t mag, int exp)
{
    int pos = exp - BIG_LSB;
    assert_true(pos >= 0);
    int digit = pos / 32, shift = pos % 32;
    /* mag << shift spread over three digits, added one 32-bit piece at a time */
    unsigned __int128 v = (unsigned __int128)mag << shift;
    for (int i = 0; v; i++, v >>= 32) {
        assert_true(digit + i < BIG_DIGITS);
        b->d[digit + i] += (uint64_t)(v & 0xFFFFFFFFu);
    }
    big_norm(b);
}

static int big_cmp(const big *a, const big *b)
{
    for (int i = BIG_DIGITS - 1; i >= 0; i--)
        if (a->d[i] != b->d[i]) return a->d[i] < b->d[i] ? -1 : 1;
    return 0;
}

/* r = a - b, a >= b */
static void big_sub(big *r, const big *a, const big *b)
{
    int64_t borrow = 0;
    for (int i = 0; i < BIG_DIGITS; i++) {
        int64_t v = (int64_t)a->d[i] - (int64_t)b->d[i] - borrow;
        borrow = v < 0;
        r->d[i] = (uint64_t)(v + (borrow ? ((int64_t)1 << 32) : 0));
    }
    assert_int_equal(borrow, 0);
}

static bool big_is_zero(const big *b)
{
    for (int i = 0; i < BIG_DIGITS; i++)
        if (b->d[i]) return false;
    return true;
}

static long double big_approx(const big *b)
{
    long double v = 0;
    for (int i = BIG_DIGITS - 1; i >= 0; i--) v = v * 4294967296.0L + (long double)b->d[i];
    return v;
}

/* ---- oracle decoding ------------------------------------------------------------------------ */

/* x = mant * 2^exp with mant an integer (sign separate). */
typedef struct ival {
    int      neg;
    uint64_t mant;
    int      exp;
} ival;

static ival ival_from_double(double x)
{
    ival v = {x < 0 || (x == 0 && signbit(x)), 0, 0};
    if (x == 0) return v;
    int e;
    double f = frexp(fabs(x), &e); /* f in [0.5, 1) */
    v.mant = (uint64_t)ldexp(f, 53);
    v.exp = e - 53;
    return v;
}

static const double e2m1_value[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};

static double oracle_e2m1(uint8_t code) { return (code & 8 ? -1 : 1) * e2m1_value[code & 7]; }

static double oracle_e4m3(uint8_t b) /* NVFP4 scale as the formats module decodes it (ue4m3) */
{
    if ((b & 0x7F) == 0x7F || (b & 0x80)) return NAN;
    int E = (b >> 3) & 15, M = b & 7;
    return E == 0 ? ldexp(M, -9) : ldexp(8 + M, E - 10);
}

static double oracle_ue8m0(uint8_t b) { return b == 0xFF ? NAN : ldexp(1.0, b - 127); }

static double oracle_f16(uint16_t h)
{
    int E = (h >> 10) & 31, F = h & 1023;
    double s = (h & 0x8000) ? -1 : 1;
    if (E == 31) return F ? NAN : s * INFINITY;
    return E == 0 ? s * ldexp(F, -24) : s * ldexp(1024 + F, E - 25);
}

static double oracle_plain(fp4d_dtype t, const void *data, int64_t idx)
{
    if (t == FP4D_DTYPE_F32) return ((const float *)data)[idx];
    uint16_t h = ((const uint16_t *)data)[idx];
    if (t == FP4D_DTYPE_BF16) {
        uint32_t b = (uint32_t)h << 16;
        float f;
        memcpy(&f, &b, 4);
        return f;
    }
    return oracle_f16(h);
}

/* Independent swizzle formula, spec §6. */
static size_t oracle_scale_offset(fp4d_scale_layout l, int64_t rows, int64_t cols, int64_t r, int64_t c)
{
    (void)rows;
    int64_t cp = (cols + 3) / 4 * 4;
    if (l == FP4D_LAYOUT_SWIZZLED_128X4)
        return (size_t)((r / 128) * 128 * cp + (c / 4) * 512 + (r % 32) * 16 + ((r / 32) % 4) * 4 + c % 4);
    if (l == FP4D_LAYOUT_SWIZZLED_8X4) return (size_t)((r / 8) * 8 * cp + (c / 4) * 32 + (r % 8) * 4 + c % 4);
    return (size_t)(r * cols + c);
}

static double oracle_elem(const fp4d_matrix *x, int64_t r, int64_t k)
{
    if (x->dtype != FP4D_DTYPE_NVFP4 && x->dtype != FP4D_DTYPE_MXFP4) return oracle_plain(x->dtype, x->data, r * x->cols + k);
    int bs = x->dtype == FP4D_DTYPE_NVFP4 ? 16 : 32;
    uint8_t byte = ((const uint8_t *)x->data)[r * (x->cols / 2) + k / 2];
    uint8_t code = k % 2 ? byte >> 4 : byte & 15;
    uint8_t sb = x->scales[oracle_scale_offset(x->scale_layout, x->rows, x->cols / bs, r, k / bs)];
    double scale = x->dtype == FP4D_DTYPE_NVFP4 ? oracle_e4m3(sb) : oracle_ue8m0(sb);
    return oracle_e2m1(code) * scale;
}

/* ---- oracle rounding: search over bit patterns -------------------------------------------- */

typedef struct ofmt {
    int      mant_bits, exp_bits, bias;
    uint64_t inf_pattern;
} ofmt;

static const ofmt O_F32 = {23, 8, 127, 0x7F800000u};
static const ofmt O_BF16 = {7, 8, 127, 0x7F80u};
static const ofmt O_F16 = {10, 5, 15, 0x7C00u};

/* Value of a positive pattern as mant * 2^exp; the infinity pattern counts as 2^(emax+1). */
static void pattern_value(const ofmt *f, uint64_t p, uint64_t *mant, int *exp)
{
    uint64_t E = p >> f->mant_bits, F = p & ((1ull << f->mant_bits) - 1);
    if (E == 0) {
        *mant = F;
        *exp = 1 - f->bias - f->mant_bits;
    } else {
        *mant = F | (1ull << f->mant_bits);
        *exp = (int)E - f->bias - f->mant_bits;
    }
}

static void pattern_big(const ofmt *f, uint64_t p, big *out)
{
    memset(out, 0, sizeof *out);
    uint64_t m;
    int e;
    pattern_value(f, p, &m, &e);
    if (m) big_add(out, m, e);
}

static long double pattern_ld(const ofmt *f, uint64_t p)
{
    uint64_t m;
    int e;
    pattern_value(f, p, &m, &e);
    return ldexpl((long double)m, e);
}

/* Correctly rounded |x| (x given as a big magnitude at BIG_LSB) as a positive pattern. */
static uint64_t oracle_round_mag(const ofmt *f, const big *x)
{
    if (big_is_zero(x)) return 0;
    long double approx = ldexpl(big_approx(x), BIG_LSB);
    uint64_t lo = 0, hi = f->inf_pattern; /* v(lo) <= approx < v(hi) */
    if (approx >= pattern_ld(f, hi)) lo = hi;
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (pattern_ld(f, mid) <= approx) lo = mid;
        else hi = mid;
    }
    /* Exact fix-up: v(p) <= x < v(p+1). */
    uint64_t p = lo >= f->inf_pattern ? f->inf_pattern - 1 : lo;
    big v;
    for (;;) {
        pattern_big(f, p, &v);
        if (big_cmp(&v, x) > 0) {
            p--;
            continue;
        }
        big w;
        pattern_big(f, p + 1, &w);
        if (big_cmp(&w, x) <= 0) {
            if (p + 1 == f->inf_pattern) return f->inf_pattern; /* beyond 2^(emax+1) */
            p++;
            continue;
        }
        /* compare 2x with v + w */
        big two_x = *x, sum = v;
        for (int i = 0; i < BIG_DIGITS; i++) two_x.d[i] *= 2, sum.d[i] += w.d[i];
        big_norm(&two_x);
        big_norm(&sum);
        int c = big_cmp(&two_x, &sum);
        if (c < 0) return p;
        if (c > 0) return p + 1;
        return (p & 1) ? p + 1 : p;
    }
}

/* The oracle for one output element; returns the pattern, *is_nan for NaN results. */
static uint64_t oracle_element(const fp4d_gemm_problem *pr, int64_t m, int64_t n, const ofmt *f, bool *is_nan)
{
    /* alpha's significand goes into every term, so the single rounding sees alpha * sum. */
    double alpha = pr->alpha;
    bool alpha_regular = isfinite(alpha) && alpha != 0;
    ival al = ival_from_double(alpha_regular ? alpha : 1.0);
    while (!(al.mant & 1)) al.mant >>= 1, al.exp++;
    big pos, neg;
    memset(&pos, 0, sizeof pos);
    memset(&neg, 0, sizeof neg);
    long double special = 0;
    bool any_special = false;
    for (int64_t k = 0; k < pr->a.cols; k++) {
        double a = oracle_elem(&pr->a, m, k), b = oracle_elem(&pr->b, n, k);
        long double prod = (long double)a * (long double)b;
        if (!isfinite(prod)) {
            special += prod;
            any_special = true;
            continue;
        }
        if (prod == 0) continue;
        ival ia = ival_from_double(a), ib = ival_from_double(b);
        /* a has <= 24 significant bits, b <= 6, alpha <= 24: strip trailing zeros to fit */
        while (!(ia.mant & 1)) ia.mant >>= 1, ia.exp++;
        while (!(ib.mant & 1)) ib.mant >>= 1, ib.exp++;
        big_add((ia.neg != ib.neg) != al.neg ? &neg : &pos, ia.mant * ib.mant * al.mant,
                ia.exp + ib.exp + al.exp);
    }
    *is_nan = false;
    uint64_t sign_bit = 1ull << (f->mant_bits + f->exp_bits);
    if (any_special || isnan(alpha)) {
        long double r = any_special ? (long double)alpha * special : (long double)alpha;
        if (isnan(r)) {
            *is_nan = true;
            return 0;
        }
        return f->inf_pattern | (r < 0 ? sign_bit : 0);
    }
    big mag;
    bool negative = big_cmp(&pos, &neg) < 0;
    if (negative) big_sub(&mag, &neg, &pos);
    else big_sub(&mag, &pos, &neg);
    if (isinf(alpha)) {
        if (big_is_zero(&mag)) {
            *is_nan = true;
            return 0;
        }
        /* the terms carried sign(1.0) = +, so negative is the sum's own sign */
        return f->inf_pattern | ((negative != (alpha < 0)) ? sign_bit : 0);
    }
    if (big_is_zero(&mag) || alpha == 0) return 0; /* exact zero: +0 */
    return oracle_round_mag(f, &mag) | (negative ? sign_bit : 0);
}

/* ---- problem construction ----------------------------------------------------------------- */

typedef struct owned_matrix {
    fp4d_matrix m;
    void       *data;
    uint8_t    *scales;
} owned_matrix;

static size_t scale_buffer_bytes(fp4d_scale_layout l, int64_t rows, int64_t cols)
{
    int64_t cp = (cols + 3) / 4 * 4;
    if (l == FP4D_LAYOUT_SWIZZLED_128X4) return (size_t)((rows + 127) / 128 * 128 * cp);
    if (l == FP4D_LAYOUT_SWIZZLED_8X4) return (size_t)((rows + 7) / 8 * 8 * cp);
    return (size_t)(rows * cols);
}

/* Random FP4 matrix; scale bytes drawn by scale_gen(r, blk). */
static owned_matrix make_fp4(fp4d_dtype t, fp4d_scale_layout l, int64_t rows, int64_t cols,
                             uint8_t (*scale_gen)(fp4d_dtype, int64_t, int64_t))
{
    owned_matrix o;
    int bs = t == FP4D_DTYPE_NVFP4 ? 16 : 32;
    size_t nd = (size_t)(rows * cols / 2), ns = scale_buffer_bytes(l, rows, cols / bs);
    o.data = malloc(nd);
    o.scales = calloc(ns, 1);
    for (size_t i = 0; i < nd; i++) ((uint8_t *)o.data)[i] = (uint8_t)rnd();
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols / bs; c++)
            o.scales[oracle_scale_offset(l, rows, cols / bs, r, c)] = scale_gen(t, r, c);
    o.m = (fp4d_matrix){t, rows, cols, o.data, o.scales, l};
    return o;
}

static uint8_t scale_typical(fp4d_dtype t, int64_t r, int64_t c)
{
    (void)r, (void)c;
    if (t == FP4D_DTYPE_NVFP4) {
        uint8_t b = (uint8_t)rnd_below(0x7F); /* 0x00..0x7E: zero, subnormal and normal */
        return b;
    }
    return (uint8_t)(117 + rnd_below(20)); /* 2^-10 .. 2^9 */
}

static uint8_t scale_wide(fp4d_dtype t, int64_t r, int64_t c)
{
    (void)r, (void)c;
    if (t == FP4D_DTYPE_NVFP4) return (uint8_t)rnd_below(0x7F);
    return (uint8_t)rnd_below(255); /* the whole ue8m0 range 2^-127 .. 2^127 */
}

static float random_f32_any(void)
{
    uint32_t b;
    do b = (uint32_t)rnd();
    while (((b >> 23) & 0xFF) == 0xFF); /* finite only */
    float f;
    memcpy(&f, &b, 4);
    return f;
}

static owned_matrix make_plain(fp4d_dtype t, int64_t rows, int64_t cols, bool wide)
{
    owned_matrix o;
    size_t n = (size_t)(rows * cols);
    o.scales = NULL;
    if (t == FP4D_DTYPE_F32) {
        float *d = malloc(n * 4);
        for (size_t i = 0; i < n; i++)
            d[i] = wide ? random_f32_any() : (float)ldexp((double)(int32_t)rnd() / 2147483648.0, (int)rnd_below(12) - 6);
        o.data = d;
    } else {
        uint16_t *d = malloc(n * 2);
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            do h = (uint16_t)rnd();
            while (t == FP4D_DTYPE_BF16 ? ((h >> 7) & 0xFF) == 0xFF : ((h >> 10) & 31) == 31);
            if (!wide) h = (uint16_t)((h & 0x83FF) | ((t == FP4D_DTYPE_BF16 ? 0x3C00 : 0x3400) + (rnd_below(4) << 10)));
            d[i] = h;
        }
        o.data = d;
    }
    o.m = (fp4d_matrix){t, rows, cols, o.data, NULL, FP4D_LAYOUT_LINEAR};
    return o;
}

static void owned_free(owned_matrix *o)
{
    free(o->data);
    free(o->scales);
}

static const ofmt *ofmt_of(fp4d_dtype t)
{
    return t == FP4D_DTYPE_F32 ? &O_F32 : t == FP4D_DTYPE_BF16 ? &O_BF16 : &O_F16;
}

static uint64_t out_bits(const void *out, fp4d_dtype t, int64_t idx)
{
    if (t == FP4D_DTYPE_F32) return ((const uint32_t *)out)[idx];
    return ((const uint16_t *)out)[idx];
}

static bool pattern_is_nan(const ofmt *f, uint64_t p)
{
    uint64_t mag = p & ((1ull << (f->mant_bits + f->exp_bits)) - 1);
    return mag > f->inf_pattern;
}

/* Runs the reference on pr and compares every element with the oracle; returns mismatches. */
static int check_against_oracle(fp4d_gemm_problem *pr, const char *what)
{
    int64_t M = pr->a.rows, N = pr->b.rows;
    size_t es = pr->out_type == FP4D_DTYPE_F32 ? 4 : 2;
    pr->out = malloc((size_t)(M * N) * es);
    memset(pr->out, 0xA5, (size_t)(M * N) * es); /* poison: every element must be written */
    assert_int_equal(fp4d_ref_gemm(pr), FP4D_STATUS_OK);
    const ofmt *f = ofmt_of(pr->out_type);
    int bad = 0;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            bool nan;
            uint64_t want = oracle_element(pr, m, n, f, &nan);
            uint64_t got = out_bits(pr->out, pr->out_type, m * N + n);
            bool ok = nan ? pattern_is_nan(f, got) : got == want;
            if (!ok && bad++ < 5)
                fprintf(stderr, "%s: [%lld,%lld] got 0x%llx want %s0x%llx\n", what, (long long)m, (long long)n,
                        (unsigned long long)got, nan ? "NaN " : "", (unsigned long long)want);
        }
    free(pr->out);
    pr->out = NULL;
    return bad;
}

static const fp4d_dtype out_types[3] = {FP4D_DTYPE_F32, FP4D_DTYPE_BF16, FP4D_DTYPE_F16};

/* ---- tests ---------------------------------------------------------------------------------- */

static void test_oracle_self_check(void **state)
{
    (void)state;
    /* The oracle's rounding on values derived by hand. */
    big x;
    memset(&x, 0, sizeof x);
    big_add(&x, 257, -8); /* 1 + 2^-8: bf16 midpoint between 1 and 1+2^-7 -> even (1.0) */
    assert_int_equal(oracle_round_mag(&O_BF16, &x), 0x3F80);
    memset(&x, 0, sizeof x);
    big_add(&x, 259, -8); /* 1 + 3*2^-8: midpoint between 1+2^-7 (odd) and 1+2^-6 -> 0x3F82 */
    assert_int_equal(oracle_round_mag(&O_BF16, &x), 0x3F82);
    memset(&x, 0, sizeof x);
    big_add(&x, 65520, 0); /* f16 overflow threshold */
    assert_int_equal(oracle_round_mag(&O_F16, &x), 0x7C00);
    memset(&x, 0, sizeof x);
    big_add(&x, 65519, 0);
    assert_int_equal(oracle_round_mag(&O_F16, &x), 0x7BFF);
    memset(&x, 0, sizeof x);
    big_add(&x, 1, -150); /* half the smallest f32 subnormal: tie to even = 0 */
    assert_int_equal(oracle_round_mag(&O_F32, &x), 0);
    big_add(&x, 1, -200); /* just above: rounds up to the smallest subnormal */
    assert_int_equal(oracle_round_mag(&O_F32, &x), 1);
}

static void test_random_all_types_vs_oracle(void **state)
{
    (void)state;
    const fp4d_dtype a_types[5] = {FP4D_DTYPE_NVFP4, FP4D_DTYPE_MXFP4, FP4D_DTYPE_BF16, FP4D_DTYPE_F16, FP4D_DTYPE_F32};
    const fp4d_dtype b_types[2] = {FP4D_DTYPE_NVFP4, FP4D_DTYPE_MXFP4};
    const fp4d_scale_layout layouts[3] = {FP4D_LAYOUT_LINEAR, FP4D_LAYOUT_SWIZZLED_128X4, FP4D_LAYOUT_SWIZZLED_8X4};
    int total_bad = 0;
    for (int ai = 0; ai < 5; ai++)
        for (int bi = 0; bi < 2; bi++)
            for (int oi = 0; oi < 3; oi++)
                for (int wide = 0; wide < 2; wide++) {
                    int64_t M = 1 + rnd_below(9), N = 1 + rnd_below(9), K = 32 * (1 + rnd_below(6));
                    fp4d_scale_layout la = layouts[rnd_below(3)], lb = layouts[rnd_below(3)];
                    uint8_t (*gen)(fp4d_dtype, int64_t, int64_t) = wide ? scale_wide : scale_typical;
                    owned_matrix A = (a_types[ai] == FP4D_DTYPE_NVFP4 || a_types[ai] == FP4D_DTYPE_MXFP4)
                                         ? make_fp4(a_types[ai], la, M, K, gen)
                                         : make_plain(a_types[ai], M, K, wide);
                    owned_matrix B = make_fp4(b_types[bi], lb, N, K, gen);
                    float alphas[3] = {1.0f, (float)ldexp((double)(rnd() >> 40) / 16777216.0, -(int)rnd_below(6)), -0.375f};
                    for (int al = 0; al < 3; al++) {
                        fp4d_gemm_problem pr = {A.m, B.m, alphas[al], out_types[oi], NULL};
                        char what[96];
                        snprintf(what, sizeof what, "A=%d B=%d out=%d wide=%d alpha=%g", (int)a_types[ai],
                                 (int)b_types[bi], (int)out_types[oi], wide, (double)alphas[al]);
                        total_bad += check_against_oracle(&pr, what);
                    }
                    owned_free(&A);
                    owned_free(&B);
                }
    assert_int_equal(total_bad, 0);
}

/* Rows whose terms cancel exactly except for one tiny one, over the whole ue8m0 scale range
 * (products up to ~2^160): the exact result is tiny and nonzero. */
static void test_heavy_cancellation_wide_range(void **state)
{
    (void)state;
    const int64_t M = 3, N = 4, K = 16384;
    for (int oi = 0; oi < 3; oi++) {
        owned_matrix B = make_fp4(FP4D_DTYPE_MXFP4, FP4D_LAYOUT_LINEAR, N, K, scale_wide);
        uint8_t *bq = B.data;
        /* Second half of each B row = first half negated (both nibbles' sign bits), same scales. */
        for (int64_t n = 0; n < N; n++) {
            uint8_t *row = bq + n * (K / 2);
            for (int64_t j = 0; j < K / 4; j++) row[K / 4 + j] = row[j] ^ 0x88;
            for (int64_t c = 0; c < K / 64; c++) B.scales[n * (K / 32) + K / 64 + c] = B.scales[n * (K / 32) + c];
        }
        /* A: second half = first half, so every a_k b_k meets a_k (-b_k). */
        float *a = malloc((size_t)(M * K) * 4);
        for (int64_t m = 0; m < M; m++) {
            for (int64_t k = 0; k < K / 2; k += 2) {
                a[m * K + k] = (float)ldexp(1.0 + (double)rnd_below(1 << 20) / (1 << 20), (int)rnd_below(60) - 30);
                a[m * K + k + 1] = (float)ldexp((double)rnd_below(1 << 10), -40);
            }
            for (int64_t k = 0; k < K / 2; k++) a[m * K + K / 2 + k] = a[m * K + k];
            a[m * K + K / 2 + 1 + 2 * m] += 0x1p-40f; /* breaks one pair by a tiny amount */
        }
        fp4d_matrix Am = {FP4D_DTYPE_F32, M, K, a, NULL, FP4D_LAYOUT_LINEAR};
        fp4d_gemm_problem pr = {Am, B.m, 1.0f, out_types[oi], NULL};
        assert_int_equal(check_against_oracle(&pr, "heavy cancellation"), 0);

        /* Plain f32 accumulation in order gets these wrong: the point of the test. */
        if (oi == 0) {
            pr.out = malloc((size_t)(M * N) * 4);
            assert_int_equal(fp4d_ref_gemm(&pr), FP4D_STATUS_OK);
            int naive_wrong = 0;
            for (int64_t m = 0; m < M; m++)
                for (int64_t n = 0; n < N; n++) {
                    float acc = 0;
                    for (int64_t k = 0; k < K; k++) acc += a[m * K + k] * (float)oracle_elem(&B.m, n, k);
                    if (acc != ((float *)pr.out)[m * N + n]) naive_wrong++;
                }
            assert_true(naive_wrong > 0);
            free(pr.out);
        }
        free(a);
        owned_free(&B);
    }
}

/* NVFP4 x NVFP4 with K = 16384 against the oracle. A row 1 is its first half followed by
 * the negated first half; B row 1 repeats its first half (A[1].B[1] = 0 exactly) and B row 2
 * does too except one byte (a small nonzero result out of large partial sums). */
static void test_nvfp4_long_k(void **state)
{
    (void)state;
    const int64_t M = 4, N = 5, K = 16384;
    owned_matrix A = make_fp4(FP4D_DTYPE_NVFP4, FP4D_LAYOUT_SWIZZLED_128X4, M, K, scale_typical);
    owned_matrix B = make_fp4(FP4D_DTYPE_NVFP4, FP4D_LAYOUT_LINEAR, N, K, scale_typical);
    uint8_t *a = A.data, *b = B.data;
    for (int64_t j = 0; j < K / 4; j++) a[K / 2 + K / 4 + j] = a[K / 2 + j] ^ 0x88;
    for (int64_t c = 0; c < K / 32; c++)
        A.scales[oracle_scale_offset(A.m.scale_layout, M, K / 16, 1, K / 32 + c)] =
            A.scales[oracle_scale_offset(A.m.scale_layout, M, K / 16, 1, c)];
    for (int64_t n = 1; n <= 2; n++) {
        for (int64_t j = 0; j < K / 4; j++) b[n * (K / 2) + K / 4 + j] = b[n * (K / 2) + j];
        for (int64_t c = 0; c < K / 32; c++) B.scales[n * (K / 16) + K / 32 + c] = B.scales[n * (K / 16) + c];
    }
    b[2 * (K / 2) + K / 4 + 5] ^= 0x01;
    for (int oi = 0; oi < 3; oi++) {
        uint8_t out_elem[4];
        fp4d_gemm_problem pr = {A.m, B.m, 0.0123f, out_types[oi], NULL};
        assert_int_equal(check_against_oracle(&pr, "nvfp4 K=16384"), 0);
        assert_int_equal(fp4d_ref_gemm_element(&pr, 1, 1, out_elem, NULL), FP4D_STATUS_OK);
        uint64_t bits = oi == 0 ? *(uint32_t *)out_elem : *(uint16_t *)out_elem;
        assert_int_equal(bits, 0); /* exact zero -> +0 */
    }
    owned_free(&A);
    owned_free(&B);
}

/* B = all ones (e2m1 1.0 = code 2, scale 1.0 = e4m3 0x38): out = alpha * sum of A's row. */
static owned_matrix ones_b(int64_t N, int64_t K)
{
    owned_matrix B;
    B.data = malloc((size_t)(N * K / 2));
    memset(B.data, 0x22, (size_t)(N * K / 2));
    B.scales = malloc((size_t)(N * K / 16));
    memset(B.scales, 0x38, (size_t)(N * K / 16));
    B.m = (fp4d_matrix){FP4D_DTYPE_NVFP4, N, K, B.data, B.scales, FP4D_LAYOUT_LINEAR};
    return B;
}

static uint64_t run_one(const float *arow, int64_t K, float alpha, fp4d_dtype out_type)
{
    owned_matrix B = ones_b(1, K);
    fp4d_matrix A = {FP4D_DTYPE_F32, 1, K, arow, NULL, FP4D_LAYOUT_LINEAR};
    uint32_t out = 0xDEADBEEF;
    fp4d_gemm_problem pr = {A, B.m, alpha, out_type, &out};
    assert_int_equal(fp4d_ref_gemm(&pr), FP4D_STATUS_OK);
    owned_free(&B);
    return out_type == FP4D_DTYPE_F32 ? out : (out & 0xFFFF);
}

static void test_cancellation_f32_visibly_wrong(void **state)
{
    (void)state;
    /* +2^20, then 2^-10 sixteen times... then -2^20: exact sum = 16 * 2^-10 = 2^-6. In f32,
     * 2^20 + 2^-10 = 2^20 (the small terms vanish), so naive accumulation gives 0. */
    float a[32] = {0};
    a[0] = 0x1p20f;
    for (int i = 1; i <= 16; i++) a[i] = 0x1p-10f;
    a[17] = -0x1p20f;
    float naive = 0;
    for (int i = 0; i < 32; i++) naive += a[i];
    assert_true(naive == 0.0f);
    uint64_t got = run_one(a, 32, 1.0f, FP4D_DTYPE_F32);
    float gf;
    uint32_t g32 = (uint32_t)got;
    memcpy(&gf, &g32, 4);
    assert_true(gf == 0x1p-6f);
}

static void test_output_ties_direct_rounding(void **state)
{
    (void)state;
    float a[16] = {0};
    /* bf16: 1 + 2^-8 is a midpoint -> ties to even 1.0 (0x3F80). */
    a[0] = 1.0f;
    a[1] = 0x1p-8f;
    assert_int_equal(run_one(a, 16, 1.0f, FP4D_DTYPE_BF16), 0x3F80);
    /* 1 + 2^-8 + 2^-30: just above the midpoint -> 1 + 2^-7 (0x3F81). Rounding through f32
     * first would give 1 + 2^-8 (2^-30 is below f32's ulp at 1) and then the tie -> 0x3F80. */
    a[2] = 0x1p-30f;
    assert_int_equal(run_one(a, 16, 1.0f, FP4D_DTYPE_BF16), 0x3F81);
    /* Just below the midpoint. */
    a[2] = -0x1p-30f;
    assert_int_equal(run_one(a, 16, 1.0f, FP4D_DTYPE_BF16), 0x3F80);
    /* 1 + 3*2^-8: midpoint between 0x3F81 (odd) and 0x3F82 -> 0x3F82. */
    a[1] = 0x1p-7f;
    a[2] = 0x1p-8f;
    assert_int_equal(run_one(a, 16, 1.0f, FP4D_DTYPE_BF16), 0x3F82);
    /* f16: 1 + 2^-11 -> 1.0 (0x3C00); 1 + 3*2^-11 -> 1 + 2^-9 (0x3C02); plus 2^-40 -> 0x3C01. */
    memset(a, 0, sizeof a);
    a[0] = 1.0f;
    a[1] = 0x1p-11f;
    assert_int_equal(run_one(a, 16, 1.0f, FP4D_DTYPE_F16), 0x3C00);
    a[2] = 0x1p-40f;
    assert_int_equal(run_one(a, 16, 1.0f, FP4D_DTYPE_F16), 0x3C01);
    a[1] = 0x1p-10f;
    a[2] = 0x1p-11f;
    assert_int_equal(run_one(a, 16, 1.0f, FP4D_DTYPE_F16), 0x3C02);
    /* f32: 1 + 2^-24 ties to 1.0; 1 + 2^-24 + 2^-60 rounds up. */
    memset(a, 0, sizeof a);
    a[0] = 1.0f;
    a[1] = 0x1p-24f;
    assert_int_equal(run_one(a, 16, 1.0f, FP4D_DTYPE_F32), 0x3F800000);
    a[2] = 0x1p-60f;
    assert_int_equal(run_one(a, 16, 1.0f, FP4D_DTYPE_F32), 0x3F800001);
    /* alpha applied before the single rounding: (1 + 2^-24) * 3 = 3 + 3*2^-24, whose f32 is
     * 3 + 2^-22 (0x40400001); rounding the sum first would give 3.0. */
    a[2] = 0;
    assert_int_equal(run_one(a, 16, 3.0f, FP4D_DTYPE_F32), 0x40400001);
}

static void test_overflow_underflow_zero(void **state)
{
    (void)state;
    float a[16] = {0};
    a[0] = 65519.0f;
    assert_int_equal(run_one(a, 16, 1.0f, FP4D_DTYPE_F16), 0x7BFF);
    a[0] = 65520.0f;
    assert_int_equal(run_one(a, 16, 1.0f, FP4D_DTYPE_F16), 0x7C00);
    a[0] = -65520.0f;
    assert_int_equal(run_one(a, 16, 1.0f, FP4D_DTYPE_F16), 0xFC00);
    /* f32 overflow of the exact sum: two maximal floats. */
    a[0] = 0x1.fffffep127f;
    a[1] = 0x1.fffffep127f;
    assert_int_equal(run_one(a, 16, 1.0f, FP4D_DTYPE_F32), 0x7F800000);
    assert_int_equal(run_one(a, 16, 1.0f, FP4D_DTYPE_BF16), 0x7F80);
    /* ... brought back into range by alpha = 0.25, exactly: no intermediate overflow. */
    assert_int_equal(run_one(a, 16, 0.25f, FP4D_DTYPE_F32), 0x7EFFFFFF);
    /* Subnormal outputs: 2^-140 in f32 is the subnormal 2^9 * 2^-149. */
    memset(a, 0, sizeof a);
    a[0] = 0x1p-70f;
    assert_int_equal(run_one(a, 16, 0x1p-70f, FP4D_DTYPE_F32), 0x200);
    /* f16 subnormal: 3 * 2^-25 = 1.5 * 2^-24 -> tie between 1 and 2 ulps -> 2 (even). */
    a[0] = 3 * 0x1p-25f;
    assert_int_equal(run_one(a, 16, 1.0f, FP4D_DTYPE_F16), 0x0002);
    /* Negative value below half the smallest subnormal: -0. */
    a[0] = -0x1p-30f;
    assert_int_equal(run_one(a, 16, 1.0f, FP4D_DTYPE_F16), 0x8000);
    /* Exact zero from cancellation, with negative alpha: +0 (docs/reference.md). */
    a[0] = 5.0f;
    a[1] = -5.0f;
    assert_int_equal(run_one(a, 16, -2.0f, FP4D_DTYPE_F32), 0);
    assert_int_equal(run_one(a, 16, -2.0f, FP4D_DTYPE_BF16), 0);
    /* All-negative-zero terms: still +0. */
    memset(a, 0, sizeof a);
    for (int i = 0; i < 16; i++) a[i] = -0.0f;
    assert_int_equal(run_one(a, 16, 1.0f, FP4D_DTYPE_F32), 0);
}

static void test_nan_inf_propagation(void **state)
{
    (void)state;
    float a[32] = {0};
    a[0] = 1.0f;
    a[3] = INFINITY;
    assert_int_equal(run_one(a, 32, 1.0f, FP4D_DTYPE_F32), 0x7F800000);
    assert_int_equal(run_one(a, 32, -1.0f, FP4D_DTYPE_F32), 0xFF800000);
    assert_int_equal(run_one(a, 32, 1.0f, FP4D_DTYPE_F16), 0x7C00);
    assert_int_equal(run_one(a, 32, 0.0f, FP4D_DTYPE_F32), 0x7FC00000); /* Inf * 0 */
    a[20] = -INFINITY; /* +Inf + -Inf */
    assert_int_equal(run_one(a, 32, 1.0f, FP4D_DTYPE_F32), 0x7FC00000);
    a[20] = 0;
    a[5] = NAN;
    assert_int_equal(run_one(a, 32, 1.0f, FP4D_DTYPE_BF16), 0x7FC0);
    assert_int_equal(run_one(a, 32, 1.0f, FP4D_DTYPE_F16), 0x7E00);
    /* alpha: NaN, or Inf times an exact zero. */
    memset(a, 0, sizeof a);
    a[0] = 2.0f;
    assert_int_equal(run_one(a, 32, NAN, FP4D_DTYPE_F32), 0x7FC00000);
    assert_int_equal(run_one(a, 32, -INFINITY, FP4D_DTYPE_F32), 0xFF800000);
    a[0] = 0;
    assert_int_equal(run_one(a, 32, INFINITY, FP4D_DTYPE_F32), 0x7FC00000);

    /* Inf in A times a zero code of B: NaN. */
    owned_matrix B = ones_b(2, 32);
    ((uint8_t *)B.data)[16 + 1] = 0x20; /* row 1, element 2 -> code 0 (+0) */
    ((uint8_t *)B.data)[0] = 0x82;      /* row 0, element 1 -> code 8 (-0) */
    memset(a, 0, sizeof a);
    a[2] = INFINITY;
    fp4d_matrix A = {FP4D_DTYPE_F32, 1, 32, a, NULL, FP4D_LAYOUT_LINEAR};
    uint32_t out[2];
    fp4d_gemm_problem pr = {A, B.m, 1.0f, FP4D_DTYPE_F32, out};
    assert_int_equal(fp4d_ref_gemm(&pr), FP4D_STATUS_OK);
    assert_int_equal(out[0], 0x7F800000);
    assert_int_equal(out[1], 0x7FC00000);
    /* NaN block scale (e4m3 0x7F) poisons only the rows of B that use it. */
    a[2] = 1.0f;
    B.scales[2 * 1 + 1] = 0x7F; /* row 1, block 1 */
    assert_int_equal(fp4d_ref_gemm(&pr), FP4D_STATUS_OK);
    assert_int_equal(out[0], 0x3F800000);
    assert_int_equal(out[1], 0x7FC00000);
    owned_free(&B);

    /* MXFP4: scale 0xFF is NaN; 0xFE = 2^127 is finite and large. */
    owned_matrix X = make_fp4(FP4D_DTYPE_MXFP4, FP4D_LAYOUT_LINEAR, 1, 64, scale_typical);
    owned_matrix Y = make_fp4(FP4D_DTYPE_MXFP4, FP4D_LAYOUT_LINEAR, 2, 64, scale_typical);
    Y.scales[2 + 0] = 0xFF;
    uint16_t o16[2];
    fp4d_gemm_problem px = {X.m, Y.m, 1.0f, FP4D_DTYPE_BF16, o16};
    assert_int_equal(fp4d_ref_gemm(&px), FP4D_STATUS_OK);
    assert_int_equal(o16[1], 0x7FC0);
    assert_int_equal(check_against_oracle(&px, "mxfp4 nan scale"), 0);
    owned_free(&X);
    owned_free(&Y);

    /* Random A with sprinkled Inf/NaN, against the oracle. */
    owned_matrix P = make_plain(FP4D_DTYPE_BF16, 6, 64, false);
    owned_matrix Q = make_fp4(FP4D_DTYPE_NVFP4, FP4D_LAYOUT_LINEAR, 7, 64, scale_typical);
    uint16_t *pd = P.data;
    pd[3] = 0x7F80;
    pd[64 + 10] = 0xFF80;
    pd[128 + 5] = 0x7F80;
    pd[128 + 40] = 0xFF80;
    pd[192 + 63] = 0x7FC1;
    fp4d_gemm_problem pp = {P.m, Q.m, 0.5f, FP4D_DTYPE_F32, NULL};
    assert_int_equal(check_against_oracle(&pp, "sprinkled inf/nan"), 0);
    owned_free(&P);
    owned_free(&Q);
}

static void test_swizzled_equals_linear(void **state)
{
    (void)state;
    const int64_t M = 130, N = 9, K = 96;
    owned_matrix A = make_fp4(FP4D_DTYPE_NVFP4, FP4D_LAYOUT_LINEAR, M, K, scale_typical);
    owned_matrix B = make_fp4(FP4D_DTYPE_NVFP4, FP4D_LAYOUT_LINEAR, N, K, scale_typical);
    float *o1 = malloc((size_t)(M * N) * 4), *o2 = malloc((size_t)(M * N) * 4);
    fp4d_gemm_problem pr = {A.m, B.m, 1.0f, FP4D_DTYPE_F32, o1};
    assert_int_equal(fp4d_ref_gemm(&pr), FP4D_STATUS_OK);
    const fp4d_scale_layout sw[2] = {FP4D_LAYOUT_SWIZZLED_128X4, FP4D_LAYOUT_SWIZZLED_8X4};
    for (int i = 0; i < 2; i++) {
        uint8_t *as = calloc(scale_buffer_bytes(sw[i], M, K / 16), 1);
        uint8_t *bs = calloc(scale_buffer_bytes(sw[i], N, K / 16), 1);
        for (int64_t r = 0; r < M; r++)
            for (int64_t c = 0; c < K / 16; c++)
                as[oracle_scale_offset(sw[i], M, K / 16, r, c)] = A.scales[r * (K / 16) + c];
        for (int64_t r = 0; r < N; r++)
            for (int64_t c = 0; c < K / 16; c++)
                bs[oracle_scale_offset(sw[i], N, K / 16, r, c)] = B.scales[r * (K / 16) + c];
        fp4d_gemm_problem ps = {{FP4D_DTYPE_NVFP4, M, K, A.data, as, sw[i]},
                                {FP4D_DTYPE_NVFP4, N, K, B.data, bs, sw[i]}, 1.0f, FP4D_DTYPE_F32, o2};
        assert_int_equal(fp4d_ref_gemm(&ps), FP4D_STATUS_OK);
        assert_memory_equal(o1, o2, (size_t)(M * N) * 4);
        free(as);
        free(bs);
    }
    free(o1);
    free(o2);
    owned_free(&A);
    owned_free(&B);
}

static void test_element_and_grouped_match_full(void **state)
{
    (void)state;
    const int64_t M = 11, N = 7, K = 128;
    owned_matrix A = make_plain(FP4D_DTYPE_F32, M, K, true);
    owned_matrix B0 = make_fp4(FP4D_DTYPE_MXFP4, FP4D_LAYOUT_SWIZZLED_128X4, N, K, scale_wide);
    owned_matrix B1 = make_fp4(FP4D_DTYPE_MXFP4, FP4D_LAYOUT_SWIZZLED_128X4, N, K, scale_wide);
    for (int oi = 0; oi < 3; oi++) {
        size_t es = oi == 0 ? 4 : 2;
        uint8_t *full = malloc((size_t)(M * N) * es);
        fp4d_gemm_problem pr = {A.m, B0.m, 1.5f, out_types[oi], full};
        assert_int_equal(fp4d_ref_gemm(&pr), FP4D_STATUS_OK);
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                uint8_t e[4];
                double ex;
                assert_int_equal(fp4d_ref_gemm_element(&pr, m, n, e, &ex), FP4D_STATUS_OK);
                assert_memory_equal(e, full + (m * N + n) * (int64_t)es, es);
                /* exact_f64 agrees with the output to the output's precision */
                double o = oi == 0 ? (double)*(float *)e : 0;
                if (oi == 0 && isfinite(o) && isfinite(ex)) assert_true(fabs(o - ex) <= fabs(ex) * 0x1p-23 + 0x1p-149);
            }
        uint8_t e[4];
        assert_int_equal(fp4d_ref_gemm_element(&pr, M, 0, e, NULL), FP4D_STATUS_INVALID_ARG);

        /* Grouped: rows 0..4 use B0, rows 4..11 use B1 with its own alpha. */
        int64_t offs[3] = {0, 4, M};
        fp4d_matrix bs[2] = {B0.m, B1.m};
        float alphas[2] = {1.5f, -0.75f};
        uint8_t *grouped = malloc((size_t)(M * N) * es), *part = malloc((size_t)(M * N) * es);
        fp4d_grouped_gemm_problem g = {2, offs, A.m, bs, alphas, out_types[oi], grouped};
        assert_int_equal(fp4d_ref_grouped_gemm(&g), FP4D_STATUS_OK);
        fp4d_gemm_problem p1 = {A.m, B1.m, -0.75f, out_types[oi], part};
        assert_int_equal(fp4d_ref_gemm(&p1), FP4D_STATUS_OK);
        assert_memory_equal(grouped, full, (size_t)(4 * N) * es);
        assert_memory_equal(grouped + 4 * N * (int64_t)es, part + 4 * N * (int64_t)es, (size_t)((M - 4) * N) * es);
        free(full);
        free(grouped);
        free(part);
    }
    owned_free(&A);
    owned_free(&B0);
    owned_free(&B1);
}

static void test_threaded_matches_oracle(void **state)
{
    (void)state;
    /* Big enough to take the threaded path (M*N*K >= 2^20), checked on a sample. */
    const int64_t M = 64, N = 48, K = 512;
    owned_matrix A = make_plain(FP4D_DTYPE_BF16, M, K, false);
    owned_matrix B = make_fp4(FP4D_DTYPE_NVFP4, FP4D_LAYOUT_SWIZZLED_128X4, N, K, scale_typical);
    uint16_t *out = malloc((size_t)(M * N) * 2);
    fp4d_gemm_problem pr = {A.m, B.m, 0.3f, FP4D_DTYPE_BF16, out};
    assert_int_equal(fp4d_ref_gemm(&pr), FP4D_STATUS_OK);
    for (int i = 0; i < 200; i++) {
        int64_t m = rnd_below((uint32_t)M), n = rnd_below((uint32_t)N);
        bool nan;
        uint64_t want = oracle_element(&pr, m, n, &O_BF16, &nan);
        assert_false(nan);
        assert_int_equal(out[m * N + n], want);
    }
    free(out);
    owned_free(&A);
    owned_free(&B);
}

static void test_invalid_problems(void **state)
{
    (void)state;
    owned_matrix B = ones_b(2, 32);
    float a[32] = {0}, out[2];
    fp4d_gemm_problem pr = {{FP4D_DTYPE_F32, 1, 32, a, NULL, FP4D_LAYOUT_LINEAR}, B.m, 1.0f, FP4D_DTYPE_F32, out};
    pr.b.dtype = FP4D_DTYPE_F32;
    assert_int_equal(fp4d_ref_gemm(&pr), FP4D_STATUS_INVALID_ARG);
    pr.b = B.m;
    pr.a.cols = 16;
    assert_int_equal(fp4d_ref_gemm(&pr), FP4D_STATUS_INVALID_ARG);
    pr.a.cols = 32;
    pr.out_type = FP4D_DTYPE_NVFP4;
    assert_int_equal(fp4d_ref_gemm(&pr), FP4D_STATUS_INVALID_ARG);
    owned_free(&B);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_oracle_self_check),
        cmocka_unit_test(test_random_all_types_vs_oracle),
        cmocka_unit_test(test_heavy_cancellation_wide_range),
        cmocka_unit_test(test_nvfp4_long_k),
        cmocka_unit_test(test_cancellation_f32_visibly_wrong),
        cmocka_unit_test(test_output_ties_direct_rounding),
        cmocka_unit_test(test_overflow_underflow_zero),
        cmocka_unit_test(test_nan_inf_propagation),
        cmocka_unit_test(test_swizzled_equals_linear),
        cmocka_unit_test(test_element_and_grouped_match_full),
        cmocka_unit_test(test_threaded_matches_oracle),
        cmocka_unit_test(test_invalid_problems),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
