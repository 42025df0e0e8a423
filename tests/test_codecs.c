/*
 * Scalar codecs against hand-checked values from spec §1.2, §2.2 and §3.2 and against
 * independent slow references (nearest-value search over every code in double precision;
 * the compiler's own _Float16 conversion). The exhaustive 2^32 comparison with CUDA lives
 * in tests/exhaustive/.
 */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "fp4doctor/formats.h"

static float from_bits(uint32_t b)
{
    float f;
    memcpy(&f, &b, 4);
    return f;
}

static uint32_t bits(float f)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    return b;
}

/* xorshift64*: deterministic inputs, no libc rand() state shared with anyone. */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rng_next(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}

/* ---- e2m1 ----------------------------------------------------------------------------- */

static void test_e2m1_rne_decision_table(void **state)
{
    (void)state;
    /* §1.2 table: boundaries on both sides, ties to even. */
    const struct { float x; uint8_t code; } cases[] = {
        { 0.0f, 0x0 },       { 0.25f, 0x0 },  { nextafterf(0.25f, 1.0f), 0x1 }, { 0.5f, 0x1 },
        { nextafterf(0.75f, 0.0f), 0x1 },     { 0.75f, 0x2 },  { 1.0f, 0x2 },    { 1.25f, 0x2 },
        { nextafterf(1.25f, 2.0f), 0x3 },     { 1.5f, 0x3 },   { nextafterf(1.75f, 0.0f), 0x3 },
        { 1.75f, 0x4 },      { 2.5f, 0x4 },   { nextafterf(2.5f, 3.0f), 0x5 },   { 3.0f, 0x5 },
        { nextafterf(3.5f, 0.0f), 0x5 },      { 3.5f, 0x6 },   { 5.0f, 0x6 },
        { nextafterf(5.0f, 6.0f), 0x7 },      { 6.0f, 0x7 },   { 1e30f, 0x7 },   { INFINITY, 0x7 },
        { -0.0f, 0x8 },      { -0.1f, 0x8 },  { -0.3f, 0x9 },  { -1.0f, 0xA },   { -5.0f, 0xE },
        { -6.5f, 0xF },      { -INFINITY, 0xF }, { 1e-45f, 0x0 }, { -1e-45f, 0x8 },
        { FLT_MAX, 0x7 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (fp4d_e2m1_from_f32(cases[i].x) != cases[i].code)
            fail_msg("e2m1(%a) = 0x%X, want 0x%X", (double)cases[i].x,
                     fp4d_e2m1_from_f32(cases[i].x), cases[i].code);
    }
    /* NaN of either sign -> +6 (sign dropped). */
    assert_int_equal(fp4d_e2m1_from_f32(from_bits(0x7FC00000u)), 0x7);
    assert_int_equal(fp4d_e2m1_from_f32(from_bits(0xFFC00000u)), 0x7);
    assert_int_equal(fp4d_e2m1_from_f32(from_bits(0xFF800001u)), 0x7);
}

static void test_e2m1_rz(void **state)
{
    (void)state;
    const struct { float x; uint8_t code; } cases[] = {
        { 0.49f, 0x0 }, { 0.5f, 0x1 }, { 0.99f, 0x1 }, { 1.0f, 0x2 }, { 1.49f, 0x2 },
        { 1.99f, 0x3 }, { 2.99f, 0x4 }, { 3.99f, 0x5 }, { 5.99f, 0x6 }, { 6.0f, 0x7 },
        { 7.0f, 0x7 },  { INFINITY, 0x7 }, { -1.4f, 0xA }, { -0.0f, 0x8 }, { -0.3f, 0x8 },
        { -INFINITY, 0xF },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        assert_int_equal(fp4d_e2m1_from_f32_rz(cases[i].x), cases[i].code);
    assert_int_equal(fp4d_e2m1_from_f32_rz(from_bits(0xFFC00000u)), 0x7);
}

static void test_e2m1_decode_table(void **state)
{
    (void)state;
    /* §1.1: E==0 -> M*0.5, else (2+M)*2^(E-2); sign on every code. */
    for (unsigned c = 0; c < 16; c++) {
        unsigned e = (c >> 1) & 3, m = c & 1;
        double v = e == 0 ? m * 0.5 : (2 + m) * ldexp(1.0, (int)e - 2);
        if (c & 8) v = -v;
        float got = fp4d_e2m1_to_f32((uint8_t)c);
        assert_true((double)got == v);
        assert_int_equal(signbit(got) != 0, (c & 8) != 0); /* 0x8 is -0.0 */
        /* and every code is reproduced by the encoder (round trip) */
        assert_int_equal(fp4d_e2m1_from_f32(got), c);
    }
}

static uint8_t ref_e2m1_nearest(double v) /* v finite; nearest value, ties to the even code */
{
    const double mags[8] = { 0, 0.5, 1, 1.5, 2, 3, 4, 6 };
    double a = fabs(v);
    int best = 0;
    for (int c = 1; c < 8; c++) {
        double d = fabs(mags[c] - a), db = fabs(mags[best] - a);
        if (d < db || (d == db && (c & 1) == 0)) best = c;
    }
    return (uint8_t)((signbit(v) ? 8 : 0) | best);
}

static void test_e2m1_matches_nearest_search(void **state)
{
    (void)state;
    for (int i = 0; i < 200000; i++) {
        /* magnitudes around 2^-4 .. 2^4, including exact grid points and midpoints */
        float x = (float)((double)(int64_t)(rng_next() % 2000001 - 1000000) / 125000.0);
        if (i % 4 == 0) x = (float)((double)(int64_t)(rng_next() % 57 - 28) * 0.25);
        assert_int_equal(fp4d_e2m1_from_f32(x), ref_e2m1_nearest(x));
    }
}

/* ---- e4m3 ----------------------------------------------------------------------------- */

static double ref_e4m3_value(unsigned b) /* spec §2.1 formula */
{
    unsigned e = (b >> 3) & 0xF, m = b & 7;
    double v = e == 0 ? m * ldexp(1.0, -9) : (8 + m) * ldexp(1.0, (int)e - 10);
    return (b & 0x80) ? -v : v;
}

static void test_e4m3_table(void **state)
{
    (void)state;
    const float tiny = 0x1p-10f; /* MINDENORM/2 */
    struct { float x; uint8_t sat, nosat; } cases[] = {
        { 0.0f, 0x00, 0x00 },           { -0.0f, 0x80, 0x80 },
        { tiny, 0x00, 0x00 },           { nextafterf(tiny, 1.0f), 0x01, 0x01 },
        { 0x1p-9f, 0x01, 0x01 },        { 1.5f * 0x1p-9f, 0x02, 0x02 },
        { 2.5f * 0x1p-9f, 0x02, 0x02 }, { 7.0f * 0x1p-9f, 0x07, 0x07 },
        { 7.5f * 0x1p-9f, 0x08, 0x08 }, { 0x1p-6f, 0x08, 0x08 },
        { 0.5f, 0x30, 0x30 },           { 1.0f, 0x38, 0x38 },
        { 1.0625f, 0x38, 0x38 },        { 1.1875f, 0x3A, 0x3A }, /* ties: even mantissa */
        { 448.0f, 0x7E, 0x7E },         { 464.0f, 0x7E, 0x7E },
        { nextafterf(464.0f, 1e9f), 0x7E, 0x7F },
        { 479.0f, 0x7E, 0x7F },         { 1e9f, 0x7E, 0x7F },
        { INFINITY, 0x7E, 0x7F },       { -INFINITY, 0xFE, 0xFF },
        { -500.0f, 0xFE, 0xFF },        { -1.0f, 0xB8, 0xB8 },
        { 1e-40f, 0x00, 0x00 },         { -1e-40f, 0x80, 0x80 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t s = fp4d_e4m3_from_f32(cases[i].x, FP4D_SATFINITE);
        uint8_t n = fp4d_e4m3_from_f32(cases[i].x, FP4D_NOSAT);
        if (s != cases[i].sat || n != cases[i].nosat)
            fail_msg("e4m3(%a) = 0x%02X/0x%02X, want 0x%02X/0x%02X", (double)cases[i].x, s, n,
                     cases[i].sat, cases[i].nosat);
    }
    assert_int_equal(fp4d_e4m3_from_f32(from_bits(0x7FC00000u), FP4D_SATFINITE), 0x7F);
    assert_int_equal(fp4d_e4m3_from_f32(from_bits(0xFFC00000u), FP4D_SATFINITE), 0x7F);
    assert_int_equal(fp4d_e4m3_from_f32(from_bits(0xFFC00000u), FP4D_NOSAT), 0x7F);
}

static void test_e4m3_decode_all_256(void **state)
{
    (void)state;
    for (unsigned b = 0; b < 256; b++) {
        float v = fp4d_e4m3_to_f32((uint8_t)b);
        if ((b & 0x7F) == 0x7F) {
            assert_true(isnan(v));
            continue;
        }
        assert_true((double)v == ref_e4m3_value(b));
        assert_int_equal(signbit(v) != 0, (b & 0x80) != 0);
        assert_int_equal(fp4d_e4m3_from_f32(v, FP4D_SATFINITE), b); /* round trip */
    }
    assert_true(fp4d_e4m3_to_f32(0x7E) == 448.0f);
    assert_true(fp4d_e4m3_to_f32(0x01) == 0x1p-9f);
}

static uint8_t ref_e4m3_nearest_sat(double v) /* finite v */
{
    double a = fabs(v);
    int best = 0;
    for (int c = 1; c <= 0x7F; c++) { /* 0x7F stands for the overflow value 480 */
        double val = c == 0x7F ? 480.0 : ref_e4m3_value((unsigned)c);
        double d = fabs(val - a), db = fabs(ref_e4m3_value((unsigned)best) - a);
        if (d < db || (d == db && (c & 1) == 0)) best = c;
    }
    if (best == 0x7F) best = 0x7E;
    return (uint8_t)((signbit(v) ? 0x80 : 0) | best);
}

static void test_e4m3_matches_nearest_search(void **state)
{
    (void)state;
    for (int i = 0; i < 100000; i++) {
        /* random exponent in [-14, 10], random mantissa bits: subnormals, ties, overflow */
        int e = (int)(rng_next() % 25) - 14;
        uint32_t mant = (uint32_t)(rng_next() & 0x7FFFFF);
        if (i & 1) mant &= 0x7F0000u; /* lots of exact ties */
        float x = from_bits(((uint32_t)(e + 127) << 23) | mant);
        if (rng_next() & 1) x = -x;
        uint8_t want = ref_e4m3_nearest_sat(x);
        uint8_t got = fp4d_e4m3_from_f32(x, FP4D_SATFINITE);
        if (got != want) fail_msg("e4m3(%a) = 0x%02X, nearest search says 0x%02X", (double)x, got, want);
    }
}

static void test_ue4m3(void **state)
{
    (void)state;
    assert_int_equal(fp4d_ue4m3_from_f32(-1.0f), 0x38); /* sign dropped */
    assert_int_equal(fp4d_ue4m3_from_f32(1000.0f), 0x7E);
    assert_int_equal(fp4d_ue4m3_from_f32(-INFINITY), 0x7E);
    assert_int_equal(fp4d_ue4m3_from_f32(NAN), 0x7F);
    assert_true(fp4d_ue4m3_to_f32(0x38) == 1.0f);
    assert_true(isnan(fp4d_ue4m3_to_f32(0x7F)));
    assert_true(isnan(fp4d_ue4m3_to_f32(0xB8))); /* bit 7 set: not a ue4m3 value */
    assert_true(isnan(fp4d_ue4m3_to_f32(0x80)));
}

/* ---- ue8m0 ---------------------------------------------------------------------------- */

static void test_ue8m0_table(void **state)
{
    (void)state;
    /* §3.2 table: x, RP SAT, RP NOSAT, RZ SAT */
    const float p127 = 0x1p127f;
    struct { float x; uint8_t rp_sat, rp_nosat, rz_sat; } cases[] = {
        { 0.0f, 0x00, 0x00, 0x00 },          { 0.75f, 0x7F, 0x7F, 0x7E },
        { 1.0f, 0x7F, 0x7F, 0x7F },          { -1.0f, 0x7F, 0x7F, 0x7F },
        { 1.5f, 0x80, 0x80, 0x7F },          { 3.0f, 0x81, 0x81, 0x80 },
        { -3.0f, 0x81, 0x81, 0x80 },         { 1.5f * 0x1p-127f, 0x01, 0x01, 0x00 },
        { 1.5f * p127, 0xFE, 0xFF, 0xFE },   { 3e38f, 0xFE, 0xFF, 0xFE },
        { INFINITY, 0xFE, 0xFF, 0xFE },      { p127, 0xFE, 0xFE, 0xFE },
        { 0x1p-127f, 0x00, 0x00, 0x00 },     { 0x1p-149f, 0x00, 0x00, 0x00 },
        { 0x1p-126f, 0x01, 0x01, 0x01 },     { nextafterf(0x1p-126f, 1.0f), 0x02, 0x02, 0x01 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        float x = cases[i].x;
        assert_int_equal(fp4d_ue8m0_from_f32(x, FP4D_ROUND_UP, FP4D_SATFINITE), cases[i].rp_sat);
        assert_int_equal(fp4d_ue8m0_from_f32(x, FP4D_ROUND_UP, FP4D_NOSAT), cases[i].rp_nosat);
        assert_int_equal(fp4d_ue8m0_from_f32(x, FP4D_ROUND_TOWARD_ZERO, FP4D_SATFINITE), cases[i].rz_sat);
    }
    assert_int_equal(fp4d_ue8m0_from_f32(NAN, FP4D_ROUND_UP, FP4D_SATFINITE), 0xFF);
    assert_int_equal(fp4d_ue8m0_from_f32(-NAN, FP4D_ROUND_TOWARD_ZERO, FP4D_SATFINITE), 0xFF);
    assert_int_equal(fp4d_ue8m0_from_f32(INFINITY, FP4D_ROUND_TOWARD_ZERO, FP4D_NOSAT), 0xFF);
    /* ceil / floor of log2 against libm for random normal magnitudes */
    for (int i = 0; i < 100000; i++) {
        float x = from_bits((uint32_t)(rng_next() % 0x7F000000u) + 0x00800000u);
        int e;
        double m = frexp(x, &e); /* x = m * 2^e, m in [0.5, 1) */
        int floor_log2 = e - 1;
        int ceil_log2 = m == 0.5 ? e - 1 : e;
        int rz = floor_log2 + 127, rp = ceil_log2 + 127;
        assert_int_equal(fp4d_ue8m0_from_f32(x, FP4D_ROUND_TOWARD_ZERO, FP4D_NOSAT), rz);
        assert_int_equal(fp4d_ue8m0_from_f32(x, FP4D_ROUND_UP, FP4D_SATFINITE), rp > 254 ? 254 : rp);
    }
}

static void test_ue8m0_decode(void **state)
{
    (void)state;
    assert_true(fp4d_ue8m0_to_f32(0) == ldexpf(1.0f, -127)); /* subnormal, not flushed */
    assert_int_equal(bits(fp4d_ue8m0_to_f32(0)), 0x00400000u);
    assert_true(fp4d_ue8m0_to_f32(127) == 1.0f);
    assert_true(fp4d_ue8m0_to_f32(254) == 0x1p127f);
    assert_true(isnan(fp4d_ue8m0_to_f32(255)));
    for (unsigned b = 1; b < 255; b++) assert_true((double)fp4d_ue8m0_to_f32((uint8_t)b) == ldexp(1.0, (int)b - 127));
}

/* ---- bf16 / fp16 ---------------------------------------------------------------------- */

static uint16_t ref_bf16_rne(float x) /* finite x: the nearer of the two neighbours */
{
    uint32_t b = bits(x);
    uint16_t lo = (uint16_t)(b >> 16), hi = (uint16_t)(lo + 1);
    double v = x, dl = fabs(v - (double)from_bits((uint32_t)lo << 16));
    double vh = (hi & 0x7F80) == 0x7F80 ? (signbit(x) ? -1.0 : 1.0) * 0x1p128 : (double)from_bits((uint32_t)hi << 16);
    double dh = fabs(vh - v);
    if (dl < dh || (dl == dh && (lo & 1) == 0)) return lo;
    return hi;
}

static void test_bf16(void **state)
{
    (void)state;
    assert_int_equal(fp4d_bf16_from_f32(1.0f), 0x3F80);
    assert_int_equal(fp4d_bf16_from_f32(1.0f + 0x1p-8f), 0x3F80);        /* tie -> even */
    assert_int_equal(fp4d_bf16_from_f32(1.0f + 3 * 0x1p-8f), 0x3F82);    /* tie -> even (up) */
    assert_int_equal(fp4d_bf16_from_f32(FLT_MAX), 0x7F80);               /* rounds to inf */
    assert_int_equal(fp4d_bf16_from_f32(-INFINITY), 0xFF80);
    assert_int_equal(fp4d_bf16_from_f32(-0.0f), 0x8000);
    assert_int_equal(fp4d_bf16_from_f32(from_bits(0x00008000u)), 0x0000); /* subnormal tie -> even */
    assert_int_equal(fp4d_bf16_from_f32(from_bits(0x00018000u)), 0x0002);
    assert_int_equal(fp4d_bf16_from_f32(NAN), 0x7FFF);
    assert_int_equal(fp4d_bf16_from_f32(from_bits(0xFF800001u)), 0x7FFF);
    for (int i = 0; i < 200000; i++) {
        uint32_t b = (uint32_t)rng_next();
        if ((b & 0x7F800000u) == 0x7F800000u) continue;
        if (i & 1) b = (b & 0xFFFF0000u) | 0x8000u; /* exact ties */
        float x = from_bits(b);
        assert_int_equal(fp4d_bf16_from_f32(x), ref_bf16_rne(x));
        assert_true(fp4d_bf16_to_f32((uint16_t)(b >> 16)) == from_bits(b & 0xFFFF0000u));
    }
}

static void test_f16(void **state)
{
    (void)state;
    assert_int_equal(fp4d_f16_from_f32(65504.0f), 0x7BFF);
    assert_int_equal(fp4d_f16_from_f32(65519.99f), 0x7BFF);
    assert_int_equal(fp4d_f16_from_f32(65520.0f), 0x7C00); /* tie between max and 2^16 -> inf */
    assert_int_equal(fp4d_f16_from_f32(0x1p-24f), 0x0001);
    assert_int_equal(fp4d_f16_from_f32(0x1p-25f), 0x0000); /* tie -> even */
    assert_int_equal(fp4d_f16_from_f32(1.5f * 0x1p-25f), 0x0001);
    assert_int_equal(fp4d_f16_from_f32(3.0f * 0x1p-25f), 0x0002);
    assert_int_equal(fp4d_f16_from_f32(-0.0f), 0x8000);
    assert_int_equal(fp4d_f16_from_f32(-INFINITY), 0xFC00);
    assert_int_equal(fp4d_f16_from_f32(NAN), 0x7FFF);
    assert_true(fp4d_f16_to_f32(0x0001) == 0x1p-24f);
    assert_true(fp4d_f16_to_f32(0x3C00) == 1.0f);
    assert_true(isnan(fp4d_f16_to_f32(0x7E00)));
#if defined(__FLT16_MAX__)
    /* The compiler's _Float16 conversion (libgcc soft-float on x86) as the reference. */
    for (int i = 0; i < 300000; i++) {
        uint32_t b = (uint32_t)rng_next();
        if (i % 3 == 0) b = (b & 0x87FFFFFFu) | 0x30000000u; /* bias toward the f16 range */
        if ((b & 0x7F800000u) == 0x7F800000u) continue;
        float x = from_bits(b);
        _Float16 h = (_Float16)x;
        uint16_t hb;
        memcpy(&hb, &h, 2);
        if (fp4d_f16_from_f32(x) != hb) fail_msg("f16(%a) = 0x%04X, _Float16 says 0x%04X", (double)x, fp4d_f16_from_f32(x), hb);
    }
    for (unsigned hb = 0; hb < 65536; hb++) {
        if ((hb & 0x7C00) == 0x7C00 && (hb & 0x3FF)) continue;
        _Float16 h;
        uint16_t hb16 = (uint16_t)hb;
        memcpy(&h, &hb16, 2);
        assert_true(fp4d_f16_to_f32(hb16) == (float)h);
        assert_int_equal(fp4d_f16_from_f32(fp4d_f16_to_f32(hb16)), hb16);
    }
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_e2m1_rne_decision_table),
        cmocka_unit_test(test_e2m1_rz),
        cmocka_unit_test(test_e2m1_decode_table),
        cmocka_unit_test(test_e2m1_matches_nearest_search),
        cmocka_unit_test(test_e4m3_table),
        cmocka_unit_test(test_e4m3_decode_all_256),
        cmocka_unit_test(test_e4m3_matches_nearest_search),
        cmocka_unit_test(test_ue4m3),
        cmocka_unit_test(test_ue8m0_table),
        cmocka_unit_test(test_ue8m0_decode),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_f16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
