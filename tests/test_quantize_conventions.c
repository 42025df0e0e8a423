/*
 * NVFP4 / MXFP4 quantize and dequantize under every convention (spec §3.4, §4):
 * - every row of the edge-case table §4.8 for every convention it names;
 * - the default conventions against an independent transcription of the spec formulas
 *   (scalar codecs replaced by nearest-value searches, layouts by linear indexing) on
 *   random, heavy-tailed, tie-point, saturating and underflowing inputs;
 * - traits, names, argument checking, layouts and source types.
 */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "fp4doctor/formats.h"

#define RCP6_F (1.0f / 6.0f)

static uint64_t rng_state = 0x853C49E6748FEA9Bull;
static uint64_t rng_next(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}
static double rng_unit(void) { return (double)(rng_next() >> 11) * 0x1p-53; }
static double rng_normal(void)
{
    double u = rng_unit() + 0x1p-60, v = rng_unit();
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* ---- independent scalar references (nearest-value search) ---------------------------- */

static double e4m3_value_ref(unsigned b)
{
    unsigned e = (b >> 3) & 0xF, m = b & 7;
    return e == 0 ? m * ldexp(1.0, -9) : (8 + m) * ldexp(1.0, (int)e - 10);
}

/* e4m3 SATFINITE of a non-negative float or NaN. */
static uint8_t ref_scale_e4m3(float v)
{
    if (isnan(v)) return 0x7F;
    if (v > 464.0f) return 0x7E; /* saturate (distances lose precision for huge v) */
    int best = 0;
    for (int c = 1; c <= 0x7F; c++) {
        double val = c == 0x7F ? 480.0 : e4m3_value_ref((unsigned)c);
        double d = fabs(val - v), db = fabs(e4m3_value_ref((unsigned)best) - v);
        if (d < db || (d == db && (c & 1) == 0)) best = c;
    }
    return (uint8_t)(best == 0x7F ? 0x7E : best);
}

static uint8_t ref_e2m1(float v)
{
    static const double mags[8] = { 0, 0.5, 1, 1.5, 2, 3, 4, 6 };
    if (isnan(v)) return 0x7;
    double a = fabs((double)v);
    if (a > 6.0) return (uint8_t)((signbit(v) ? 8 : 0) | 7); /* saturate (distances lose precision) */
    int best = 0;
    for (int c = 1; c < 8; c++) {
        double d = fabs(mags[c] - a), db = fabs(mags[best] - a);
        if (d < db || (d == db && (c & 1) == 0)) best = c;
    }
    return (uint8_t)((signbit(v) ? 8 : 0) | best);
}

static uint8_t nibble(const uint8_t *codes, int64_t cols, int64_t r, int64_t k)
{
    uint8_t b = codes[r * (cols / 2) + k / 2];
    return (k & 1) ? (uint8_t)(b >> 4) : (uint8_t)(b & 0xF);
}

/* ---- reference quantizers written from the spec text ------------------------------- */

/* §4.2 FlashInfer exact path; §4.0 gs = 2688 / amax(nan_to_num). Linear scales. */
static void ref_nvfp4_flashinfer_exact(const float *x, int64_t rows, int64_t cols, float gs_given,
                                       uint8_t *q, uint8_t *sf, float *gs_out)
{
    float gs = gs_given;
    if (gs == 0.0f) {
        float amax = 0.0f;
        for (int64_t i = 0; i < rows * cols; i++) {
            float a = fabsf(x[i]);
            if (isnan(a)) continue;
            if (isinf(a)) a = FLT_MAX;
            amax = fmaxf(amax, a);
        }
        gs = 2688.0f / amax;
    }
    *gs_out = gs;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t b = 0; b < cols / 16; b++) {
            const float *blk = x + r * cols + b * 16;
            float vmax = 0.0f;
            int nans = 0;
            for (int i = 0; i < 16; i++) {
                if (isnan(blk[i])) nans++;
                else vmax = fmaxf(vmax, fabsf(blk[i]));
            }
            if (nans == 16) vmax = NAN;
            float s = vmax != 0.0f ? vmax * (gs * RCP6_F) : 0.0f;
            uint8_t byte = ref_scale_e4m3(s);
            float sq = byte == 0x7F ? NAN : (float)e4m3_value_ref(byte);
            float out = 0.0f;
            if (vmax != 0.0f) {
                out = 1.0f / (sq * (1.0f / gs));
                if (!(out <= FLT_MAX)) out = FLT_MAX; /* fminf: NaN and inf become FLT_MAX */
            }
            sf[r * (cols / 16) + b] = byte;
            for (int i = 0; i < 16; i++) q[r * cols + b * 16 + i] = ref_e2m1(blk[i] * out);
        }
    }
}

/* §3.4 TRT-LLM/FI UE8M0 rule: ceil-pow2 of amax*RCP6 (RP, SATFINITE), exp2f_rcp quirk. */
static void ref_mxfp4_ceil(const float *x, int64_t rows, int64_t cols, uint8_t *q, uint8_t *sf)
{
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t b = 0; b < cols / 32; b++) {
            const float *blk = x + r * cols + b * 32;
            float vmax = 0.0f;
            int nans = 0;
            for (int i = 0; i < 32; i++) {
                if (isnan(blk[i])) nans++;
                else vmax = fmaxf(vmax, fabsf(blk[i]));
            }
            if (nans == 32) vmax = NAN;
            float v = vmax * RCP6_F;
            int s;
            if (isnan(v)) s = 255;
            else if (v == 0.0f) s = 0;
            else if (isinf(v)) s = 254;
            else {
                int e;
                double m = frexp((double)v, &e);
                int ceil_log2 = m == 0.5 ? e - 1 : e;
                s = ceil_log2 + 127;
                if (s < 0) s = 0;
                if (s > 254) s = 254;
            }
            float out = vmax != 0.0f ? (s == 0 ? 1.0f : ldexpf(1.0f, 127 - s)) : 0.0f;
            sf[r * (cols / 32) + b] = (uint8_t)s;
            for (int i = 0; i < 32; i++) q[r * cols + b * 32 + i] = ref_e2m1(blk[i] * out);
        }
    }
}

/* ---- helpers --------------------------------------------------------------------------- */

typedef struct {
    uint8_t *codes, *scales;
    fp4d_quantize_result res;
    fp4d_status status;
} qout;

static qout run(fp4d_dtype fmt, fp4d_convention conv, fp4d_scale_layout layout, float encode_scale,
                const float *x, int64_t rows, int64_t cols)
{
    qout o;
    const int64_t block = fp4d_dtype_get(fmt)->block_size;
    o.codes = malloc((size_t)(rows * cols / 2) + 1);
    o.scales = malloc(fp4d_scale_buffer_size(layout, rows, cols / block) + 1);
    assert_non_null(o.codes);
    assert_non_null(o.scales);
    fp4d_quantize_params p = { .format = fmt, .convention = conv, .scale_layout = layout, .encode_scale = encode_scale };
    o.status = fp4d_quantize(&p, FP4D_DTYPE_F32, x, rows, cols, o.codes, o.scales, &o.res);
    return o;
}

static void qfree(qout *o)
{
    free(o->codes);
    free(o->scales);
}

/* Runs one 1x(16*blocks) NVFP4 tensor and checks the first block's scale byte and codes. */
static void expect_block(fp4d_convention conv, float encode_scale, const float *x, int blocks,
                         uint8_t want_sf, const uint8_t *want_codes /* 16 or NULL */)
{
    qout o = run(FP4D_DTYPE_NVFP4, conv, FP4D_LAYOUT_LINEAR, encode_scale, x, 1, 16 * blocks);
    assert_int_equal(o.status, FP4D_STATUS_OK);
    if (o.scales[0] != want_sf)
        fail_msg("%s: scale byte 0x%02X, want 0x%02X", fp4d_convention_name(conv), o.scales[0], want_sf);
    for (int i = 0; want_codes && i < 16; i++) {
        if (nibble(o.codes, 16 * blocks, 0, i) != want_codes[i])
            fail_msg("%s: code[%d] = 0x%X, want 0x%X", fp4d_convention_name(conv), i,
                     nibble(o.codes, 16 * blocks, 0, i), want_codes[i]);
    }
    qfree(&o);
}

static const fp4d_convention nvfp4_conventions[] = {
    FP4D_CONV_FLASHINFER_EXACT, FP4D_CONV_TRTLLM, FP4D_CONV_MODELOPT, FP4D_CONV_TORCHAO,
    FP4D_CONV_COMPRESSED_TENSORS,
};

/* ---- §4.8 edge-case table ------------------------------------------------------------ */

static void test_edge_all_zero_block(void **state)
{
    (void)state;
    float x[32] = { 0 };
    x[16] = 6.0f; /* a second block keeps the tensor amax (and gs) finite */
    x[17] = -1.0f;
    const uint8_t zeros[16] = { 0 };
    const uint8_t want[] = { 0x00, 0x00, 0x38, 0x08, 0x30 }; /* FI, TRT-LLM, MO, AO, CT */
    for (size_t c = 0; c < 5; c++) expect_block(nvfp4_conventions[c], 0.0f, x, 2, want[c], zeros);
}

static void test_edge_tensor_amax_zero(void **state)
{
    (void)state;
    float x[32] = { 0 };
    x[3] = -0.0f;
    uint8_t zeros[16] = { 0 }, sevens[16], threes[16];
    zeros[3] = 0x8; /* -0.0 keeps its sign where the element is simply scaled */
    memset(sevens, 0x7, 16);
    memset(threes, 0x3, 16);
    threes[3] = 0xB;
    uint8_t ct[16] = { 0 };
    ct[3] = 0x8;
    expect_block(FP4D_CONV_FLASHINFER_EXACT, 0.0f, x, 2, 0x00, zeros); /* SF guarded */
    expect_block(FP4D_CONV_TRTLLM, 0.0f, x, 2, 0x7F, zeros);           /* inf*0 = NaN, outScale 0 */
    expect_block(FP4D_CONV_MODELOPT, 0.0f, x, 2, 0x7F, sevens);        /* 0/0 */
    expect_block(FP4D_CONV_TORCHAO, 0.0f, x, 2, 0x7F, threes);         /* NaN -> 0x3 */
    expect_block(FP4D_CONV_COMPRESSED_TENSORS, 0.0f, x, 2, 0x30, ct);  /* gs inf -> 1 */

    qout o = run(FP4D_DTYPE_NVFP4, FP4D_CONV_FLASHINFER_EXACT, FP4D_LAYOUT_LINEAR, 0.0f, x, 1, 32);
    assert_true(isinf(o.res.encode_scale) && o.res.encode_scale > 0);
    assert_true(o.res.decode_scale == 0.0f);
    qfree(&o);
    o = run(FP4D_DTYPE_NVFP4, FP4D_CONV_COMPRESSED_TENSORS, FP4D_LAYOUT_LINEAR, 0.0f, x, 1, 32);
    assert_true(o.res.encode_scale == 1.0f);
    qfree(&o);
}

/* A block with one NaN quantizes exactly like the same block with that element zeroed,
 * except the NaN element itself (-> +6) under the CUDA conventions, which ignore NaN in
 * amax; the torch-based ones turn the whole block into a NaN scale. */
static void test_edge_one_nan_in_block(void **state)
{
    (void)state;
    float x[32], clean[32];
    for (int i = 0; i < 32; i++) x[i] = (float)(0.37 * (i - 9)) * (i % 3 ? 1.0f : -1.0f);
    x[16] = 9.0f;
    memcpy(clean, x, sizeof x);
    x[5] = NAN;
    clean[5] = 0.0f;
    const fp4d_convention cuda[] = { FP4D_CONV_FLASHINFER_EXACT, FP4D_CONV_TRTLLM };
    for (size_t c = 0; c < 2; c++) {
        qout a = run(FP4D_DTYPE_NVFP4, cuda[c], FP4D_LAYOUT_LINEAR, 0.0f, x, 1, 32);
        qout b = run(FP4D_DTYPE_NVFP4, cuda[c], FP4D_LAYOUT_LINEAR, 0.0f, clean, 1, 32);
        assert_int_equal(a.scales[0], b.scales[0]);
        assert_int_not_equal(a.scales[0], 0x7F);
        for (int i = 0; i < 16; i++)
            assert_int_equal(nibble(a.codes, 32, 0, i), i == 5 ? 0x7 : nibble(b.codes, 32, 0, i));
        qfree(&a);
        qfree(&b);
    }
    uint8_t mo[16], ao[16], ct[16];
    for (int i = 0; i < 16; i++) {
        mo[i] = 0x7;
        ao[i] = signbit(x[i]) ? 0xB : 0x3;
        ct[i] = signbit(x[i]) ? 0x8 : 0x0;
    }
    expect_block(FP4D_CONV_MODELOPT, 0.0f, x, 2, 0x7F, mo);
    expect_block(FP4D_CONV_TORCHAO, 0.0f, x, 2, 0x7F, ao);
    expect_block(FP4D_CONV_COMPRESSED_TENSORS, 0.0f, x, 2, 0x7F, ct);
}

static void test_edge_all_nan_block(void **state)
{
    (void)state;
    float x[32];
    for (int i = 0; i < 16; i++) x[i] = NAN;
    for (int i = 16; i < 32; i++) x[i] = (float)i;
    uint8_t sevens[16], threes[16];
    memset(sevens, 0x7, 16);
    memset(threes, 0x3, 16);
    expect_block(FP4D_CONV_FLASHINFER_EXACT, 0.0f, x, 2, 0x7F, sevens);
    expect_block(FP4D_CONV_TRTLLM, 0.0f, x, 2, 0x7F, sevens);
    expect_block(FP4D_CONV_MODELOPT, 0.0f, x, 2, 0x7F, sevens);
    expect_block(FP4D_CONV_TORCHAO, 0.0f, x, 2, 0x7F, threes);
}

static void test_edge_inf_element(void **state)
{
    (void)state;
    /* finite static gs = 1: SF = inf saturates to 448; others scaled by 1/448 */
    float x[16] = { INFINITY, 1344.0f, -448.0f, 0.0f, -INFINITY, 100.0f };
    const uint8_t want[16] = { 0x7, 0x5, 0xA, 0x0, 0xF, 0x0 };
    expect_block(FP4D_CONV_FLASHINFER_EXACT, 1.0f, x, 1, 0x7E, want);
    expect_block(FP4D_CONV_TRTLLM, 1.0f, x, 1, 0x7E, want);
    expect_block(FP4D_CONV_TORCHAO, 1.0f, x, 1, 0x7E, want);
    expect_block(FP4D_CONV_COMPRESSED_TENSORS, 1.0f, x, 1, 0x7E, want);
    expect_block(FP4D_CONV_MODELOPT, 1.0f, x, 1, 0x7F, NULL); /* torch cast of inf: NaN */

    /* derived gs: amax inf -> FLT_MAX for FI (nan_to_num) */
    qout o = run(FP4D_DTYPE_NVFP4, FP4D_CONV_FLASHINFER_EXACT, FP4D_LAYOUT_LINEAR, 0.0f, x, 1, 16);
    assert_true(o.res.encode_scale == 2688.0f / FLT_MAX);
    assert_true(o.res.decode_scale == FLT_MAX / 2688.0f);
    assert_int_equal(o.scales[0], 0x7E);
    qfree(&o);
}

static void test_edge_scale_saturates(void **state)
{
    (void)state;
    float x[16] = { 6000.0f, -3000.0f, 100.0f, 448.0f };
    const uint8_t want[16] = { 0x7, 0xF, 0x0, 0x2 };
    expect_block(FP4D_CONV_FLASHINFER_EXACT, 1.0f, x, 1, 0x7E, want);
    expect_block(FP4D_CONV_TRTLLM, 1.0f, x, 1, 0x7E, want);
    expect_block(FP4D_CONV_TORCHAO, 1.0f, x, 1, 0x7E, want);
    expect_block(FP4D_CONV_COMPRESSED_TENSORS, 1.0f, x, 1, 0x7E, want);
    expect_block(FP4D_CONV_MODELOPT, 1.0f, x, 1, 0x7F, NULL); /* SF 1000 > 464: torch NaN */
}

static void test_edge_scale_underflow(void **state)
{
    (void)state;
    /* gs = 1, amax 0.003: SF = 0.0005 <= 2^-10 -> byte 0x00 */
    float x[16] = { 0.003f, -0.001f, 0.0f, -0.0f };
    const uint8_t trt[16] = { 0x7, 0xF, 0x7, 0x7, 0x7, 0x7, 0x7, 0x7, 0x7, 0x7, 0x7, 0x7, 0x7, 0x7, 0x7, 0x7 };
    const uint8_t fi[16] = { 0x7, 0xF, 0x0, 0x8 };
    const uint8_t ao[16] = { 0x0, 0x8, 0x0, 0x8 }; /* s clamped to 2^-6 */
    const uint8_t ct[16] = { 0x0, 0x8, 0x0, 0x8 }; /* s replaced by 0.125 */
    expect_block(FP4D_CONV_TRTLLM, 1.0f, x, 1, 0x00, trt);      /* outScale = rcp(0) = inf */
    expect_block(FP4D_CONV_FLASHINFER_EXACT, 1.0f, x, 1, 0x00, fi); /* outScale = FLT_MAX */
    expect_block(FP4D_CONV_TORCHAO, 1.0f, x, 1, 0x08, ao);
    expect_block(FP4D_CONV_COMPRESSED_TENSORS, 1.0f, x, 1, 0x30, ct);
}

/* ---- MXFP4 edges and hand values ------------------------------------------------------ */

static void expect_mx(fp4d_convention conv, const float *x, uint8_t want_sf, const uint8_t *want /* 32 or NULL */)
{
    qout o = run(FP4D_DTYPE_MXFP4, conv, FP4D_LAYOUT_LINEAR, 0.0f, x, 1, 32);
    assert_int_equal(o.status, FP4D_STATUS_OK);
    if (o.scales[0] != want_sf)
        fail_msg("mxfp4 %s: scale 0x%02X, want 0x%02X", fp4d_convention_name(conv), o.scales[0], want_sf);
    for (int i = 0; want && i < 32; i++) assert_int_equal(nibble(o.codes, 32, 0, i), want[i]);
    assert_true(o.res.decode_scale == 1.0f && o.res.encode_scale == 1.0f);
    qfree(&o);
}

static void test_mxfp4_rules(void **state)
{
    (void)state;
    float x[32] = { 0 };
    uint8_t want[32] = { 0 };
    const fp4d_convention ceil_rule[] = { FP4D_CONV_FLASHINFER_EXACT, FP4D_CONV_TRTLLM };
    for (int c = 0; c < 2; c++) {
        memset(x, 0, sizeof x);
        memset(want, 0, sizeof want);
        expect_mx(ceil_rule[c], x, 0x00, want); /* all-zero block */
        x[0] = 6.0f; x[1] = -1.25f; x[2] = 0.25f;
        want[0] = 0x7; want[1] = 0xA; want[2] = 0x0; /* scale 1, ties to even */
        expect_mx(ceil_rule[c], x, 0x7F, want);
        x[0] = 7.0f; x[1] = 3.5f; x[2] = -0.75f; /* ceil(7/6) = 2: x/2 */
        want[0] = 0x6; want[1] = 0x4; want[2] = 0x9; /* ties 3.5 -> 4, 1.75 -> 2; -0.375 -> -0.5 */
        expect_mx(ceil_rule[c], x, 0x80, want);
        x[5] = NAN; want[5] = 0x7;                  /* NaN ignored in amax */
        expect_mx(ceil_rule[c], x, 0x80, want);
        x[5] = INFINITY;                            /* RP SATFINITE of inf = 0xFE; x * 2^-127 */
        uint8_t inf_codes[32] = { 0 };
        inf_codes[2] = 0x8; inf_codes[5] = 0x7;
        expect_mx(ceil_rule[c], x, 0xFE, inf_codes);
        /* exp2f_rcp quirk: S == 0 -> multiplier 1, not 2^127 (so codes stay 0) */
        memset(x, 0, sizeof x);
        memset(want, 0, sizeof want);
        x[0] = 3.0f * 0x1p-126f; x[1] = -3.0f * 0x1p-126f; want[1] = 0x8;
        expect_mx(ceil_rule[c], x, 0x00, want);
        for (int i = 0; i < 32; i++) x[i] = NAN;
        memset(want, 0x7, sizeof want);
        expect_mx(ceil_rule[c], x, 0xFF, want);
    }
    /* OCP floor rule: S = floor(log2 amax) - 2 */
    memset(x, 0, sizeof x);
    memset(want, 0, sizeof want);
    expect_mx(FP4D_CONV_OCP, x, 0x00, want);
    x[0] = 6.0f; want[0] = 0x7;
    expect_mx(FP4D_CONV_OCP, x, 0x7F, want);
    x[0] = 7.9f; x[1] = -5.5f; want[0] = 0x7; want[1] = 0xF; /* above 6 saturates */
    expect_mx(FP4D_CONV_OCP, x, 0x7F, want);
    x[0] = 8.0f; x[1] = -5.0f; want[0] = 0x6; want[1] = 0xC; /* scale 2: 4.0, -2.5 -> -2 */
    expect_mx(FP4D_CONV_OCP, x, 0x80, want);
    x[3] = NAN; /* NaN propagates: scale NaN, elements divided by inf */
    uint8_t nan_codes[32] = { 0 };
    nan_codes[1] = 0x8; nan_codes[3] = 0x7;
    expect_mx(FP4D_CONV_OCP, x, 0xFF, nan_codes);
}

/* ---- default conventions against the spec transcription ------------------------------ */

static float random_value(int kind, float block_scale)
{
    static const float ties[] = { 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f, 0.5f, 3.0f };
    switch (kind) {
    case 0: return (float)rng_normal();
    case 1: return (float)(rng_normal() * exp(4.0 * rng_normal())); /* heavy tail */
    case 2: return ties[rng_next() % 10] * block_scale * ((rng_next() & 1) ? -1.0f : 1.0f);
    case 3: return (rng_next() % 4) ? 0.0f : (float)rng_normal() * 1e-6f;
    default: return (float)(rng_normal() * 1e30);
    }
}

static void fill_random(float *x, int64_t rows, int64_t cols, int block)
{
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t b = 0; b < cols / block; b++) {
            int kind = (int)(rng_next() % 5);
            float s = ldexpf(1.0f, (int)(rng_next() % 20) - 10);
            for (int i = 0; i < block; i++) x[r * cols + b * block + i] = random_value(kind, s);
            if (rng_next() % 7 == 0) x[r * cols + b * block] = 6.0f * s; /* amax at a grid point */
        }
    }
}

static void compare_with_reference(fp4d_dtype fmt, const float *x, int64_t rows, int64_t cols, float gs)
{
    const int block = (int)fp4d_dtype_get(fmt)->block_size;
    const int64_t sc = cols / block;
    uint8_t *q = malloc((size_t)(rows * cols)), *sf = malloc((size_t)(rows * sc));
    assert_non_null(q);
    assert_non_null(sf);
    float gs_ref = 1.0f;
    if (fmt == FP4D_DTYPE_NVFP4) ref_nvfp4_flashinfer_exact(x, rows, cols, gs, q, sf, &gs_ref);
    else ref_mxfp4_ceil(x, rows, cols, q, sf);

    const fp4d_scale_layout layouts[] = { FP4D_LAYOUT_LINEAR, FP4D_LAYOUT_SWIZZLED_128X4, FP4D_LAYOUT_SWIZZLED_8X4 };
    for (size_t l = 0; l < 3; l++) {
        qout o = run(fmt, FP4D_CONV_FLASHINFER_EXACT, layouts[l], gs, x, rows, cols);
        assert_int_equal(o.status, FP4D_STATUS_OK);
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t b = 0; b < sc; b++) {
                uint8_t got = o.scales[fp4d_scale_offset(layouts[l], rows, sc, r, b)];
                if (got != sf[r * sc + b])
                    fail_msg("%s [%lld,%lld] %s: scale 0x%02X, reference 0x%02X", fp4d_dtype_get(fmt)->name,
                             (long long)r, (long long)b, fp4d_scale_layout_name(layouts[l]), got, sf[r * sc + b]);
            }
            for (int64_t k = 0; k < cols; k++) {
                if (nibble(o.codes, cols, r, k) != q[r * cols + k])
                    fail_msg("%s [%lld,%lld]: code 0x%X, reference 0x%X (x = %a, gs %a, scale 0x%02X)",
                             fp4d_dtype_get(fmt)->name, (long long)r, (long long)k, nibble(o.codes, cols, r, k),
                             q[r * cols + k], (double)x[r * cols + k], (double)gs_ref, sf[r * sc + k / block]);
            }
        }
        if (fmt == FP4D_DTYPE_NVFP4) {
            assert_true(o.res.encode_scale == gs_ref);
            if (gs == 0.0f) { /* derived: decode = RN(amax/2688), within an ulp of 1/gs */
                float inv = 1.0f / gs_ref;
                assert_true(fabsf(o.res.decode_scale - inv) <= fabsf(nextafterf(inv, INFINITY) - inv));
            } else {
                assert_true(o.res.decode_scale == 1.0f / gs);
            }
        }
        /* swizzled padding bytes are 0x00 */
        if (layouts[l] != FP4D_LAYOUT_LINEAR) {
            size_t sz = fp4d_scale_buffer_size(layouts[l], rows, sc), logical = 0;
            for (size_t i = 0; i < sz; i++) logical += o.scales[i] != 0;
            size_t nonzero_ref = 0;
            for (int64_t i = 0; i < rows * sc; i++) nonzero_ref += sf[i] != 0;
            assert_int_equal(logical, nonzero_ref);
        }
        qfree(&o);
    }
    free(q);
    free(sf);
}

static void test_flashinfer_exact_nvfp4_matches_spec(void **state)
{
    (void)state;
    const int64_t shapes[][2] = { { 1, 16 }, { 3, 48 }, { 130, 80 }, { 17, 256 } };
    const float gss[] = { 0.0f, 1.0f, 448.0f / 6.0f, 1e-3f, 1e6f, 3.7f };
    for (size_t s = 0; s < 4; s++) {
        for (size_t g = 0; g < 6; g++) {
            int64_t rows = shapes[s][0], cols = shapes[s][1];
            float *x = malloc(sizeof(float) * (size_t)(rows * cols));
            assert_non_null(x);
            fill_random(x, rows, cols, 16);
            if (g == 0 && s == 2) x[5] = NAN;
            compare_with_reference(FP4D_DTYPE_NVFP4, x, rows, cols, gss[g]);
            free(x);
        }
    }
}

static void test_mxfp4_default_matches_spec(void **state)
{
    (void)state;
    const int64_t shapes[][2] = { { 1, 32 }, { 5, 96 }, { 129, 64 }, { 9, 512 } };
    for (size_t s = 0; s < 4; s++) {
        int64_t rows = shapes[s][0], cols = shapes[s][1];
        float *x = malloc(sizeof(float) * (size_t)(rows * cols));
        assert_non_null(x);
        fill_random(x, rows, cols, 32);
        compare_with_reference(FP4D_DTYPE_MXFP4, x, rows, cols, 0.0f);
        free(x);
    }
}

/* Hand example of §4.1 vs §4.2: both conventions give scale 1.0 and exact codes. */
static void test_trtllm_hand_example(void **state)
{
    (void)state;
    float x[16] = { 6.0f, 3.0f, -1.5f, 0.25f, 0.75f, -5.0f, 2.5f, 1.75f };
    const uint8_t want[16] = { 0x7, 0x5, 0xB, 0x0, 0x2, 0xE, 0x4, 0x4 };
    expect_block(FP4D_CONV_TRTLLM, 1.0f, x, 1, 0x38, want);
    expect_block(FP4D_CONV_FLASHINFER_EXACT, 1.0f, x, 1, 0x38, want);
    /* ModelOpt's -0.0 is +0 (sign from x < 0); everybody else keeps the sign */
    float z[16] = { -0.0f, 6.0f };
    const uint8_t mo[16] = { 0x0, 0x7 }, fi[16] = { 0x8, 0x7 };
    expect_block(FP4D_CONV_MODELOPT, 0.0f, z, 1, 0x7E, mo);
    expect_block(FP4D_CONV_FLASHINFER_EXACT, 0.0f, z, 1, 0x7E, fi);
}

/* ---- sources, dequantize, arguments, names ------------------------------------------- */

static void test_bf16_and_f16_sources(void **state)
{
    (void)state;
    enum { R = 4, C = 64 };
    uint16_t hb[R * C], hh[R * C];
    float wb[R * C], wh[R * C];
    for (int i = 0; i < R * C; i++) {
        float v = (float)(rng_normal() * exp(2.0 * rng_normal()));
        hb[i] = fp4d_bf16_from_f32(v);
        hh[i] = fp4d_f16_from_f32(v);
    }
    fp4d_to_f32(FP4D_DTYPE_BF16, hb, R * C, wb);
    fp4d_to_f32(FP4D_DTYPE_F16, hh, R * C, wh);
    const fp4d_dtype fmts[] = { FP4D_DTYPE_NVFP4, FP4D_DTYPE_MXFP4 };
    for (int f = 0; f < 2; f++) {
        for (int s = 0; s < 2; s++) {
            fp4d_quantize_params p = { .format = fmts[f], .convention = FP4D_CONV_FLASHINFER_EXACT,
                                       .scale_layout = FP4D_LAYOUT_LINEAR, .encode_scale = 0.0f };
            uint8_t c1[R * C / 2], c2[R * C / 2], s1[R * C / 16], s2[R * C / 16];
            fp4d_quantize_result r1, r2;
            assert_int_equal(fp4d_quantize(&p, s ? FP4D_DTYPE_F16 : FP4D_DTYPE_BF16, s ? (void *)hh : (void *)hb,
                                           R, C, c1, s1, &r1), FP4D_STATUS_OK);
            assert_int_equal(fp4d_quantize(&p, FP4D_DTYPE_F32, s ? wh : wb, R, C, c2, s2, &r2), FP4D_STATUS_OK);
            assert_memory_equal(c1, c2, sizeof c1);
            assert_memory_equal(s1, s2, (size_t)(R * C / fp4d_dtype_get(fmts[f])->block_size));
            assert_true(r1.decode_scale == r2.decode_scale);
        }
    }
}

static void test_dequantize(void **state)
{
    (void)state;
    /* Exactly representable data round-trips: gs = 1 and power-of-two block scales. */
    enum { R = 3, C = 64 };
    float x[R * C], y[R * C];
    static const float mags[8] = { 0, 0.5f, 1, 1.5f, 2, 3, 4, 6 };
    for (int r = 0; r < R; r++)
        for (int b = 0; b < C / 16; b++) {
            float s = ldexpf(1.0f, (int)(rng_next() % 18) - 9);
            for (int i = 0; i < 16; i++) {
                float v = mags[rng_next() % 8] * s;
                x[r * C + b * 16 + i] = (rng_next() & 1) ? -v : v;
            }
            x[r * C + b * 16 + (int)(rng_next() % 16)] = 6.0f * s;
        }
    const fp4d_scale_layout layouts[] = { FP4D_LAYOUT_LINEAR, FP4D_LAYOUT_SWIZZLED_128X4 };
    for (int l = 0; l < 2; l++) {
        qout o = run(FP4D_DTYPE_NVFP4, FP4D_CONV_FLASHINFER_EXACT, layouts[l], 1.0f, x, R, C);
        assert_true(o.res.decode_scale == 1.0f);
        assert_int_equal(fp4d_dequantize(FP4D_DTYPE_NVFP4, layouts[l], o.codes, o.scales, o.res.decode_scale, R, C, y),
                         FP4D_STATUS_OK);
        for (int i = 0; i < R * C; i++) assert_true(y[i] == x[i] || (x[i] == 0 && y[i] == 0));
        qfree(&o);
    }
    /* One rounding at the end: (e2m1 * sf) * decode_scale, against double arithmetic. */
    const uint8_t codes[8] = { 0x71, 0xA3, 0x5F, 0x08, 0x24, 0xE6, 0x9B, 0xC0 };
    const uint8_t scales[1] = { 0x3B }; /* 1.375 */
    const float gd = 0.1f;
    float out[16];
    assert_int_equal(fp4d_dequantize(FP4D_DTYPE_NVFP4, FP4D_LAYOUT_LINEAR, codes, scales, gd, 1, 16, out), FP4D_STATUS_OK);
    for (int k = 0; k < 16; k++) {
        uint8_t c = (k & 1) ? (uint8_t)(codes[k / 2] >> 4) : (uint8_t)(codes[k / 2] & 0xF);
        double e = ((c >> 1) & 3) == 0 ? (c & 1) * 0.5 : (2 + (c & 1)) * ldexp(1.0, ((c >> 1) & 3) - 2);
        if (c & 8) e = -e;
        float want = (float)((double)(float)(e * 1.375) * (double)gd);
        assert_true(out[k] == want);
    }
    /* MXFP4: scale 2^(b-127), decode scale ignored */
    uint8_t mcodes[16] = { 0x27 }, mscale[1] = { 0x7C }; /* 2^-3 */
    float mout[32];
    assert_int_equal(fp4d_dequantize(FP4D_DTYPE_MXFP4, FP4D_LAYOUT_LINEAR, mcodes, mscale, 123.0f, 1, 32, mout), FP4D_STATUS_OK);
    assert_true(mout[0] == 0.75f && mout[1] == 0.125f && mout[2] == 0.0f);
}

static void test_invalid_arguments(void **state)
{
    (void)state;
    float x[32] = { 1.0f };
    uint8_t c[16], s[512];
    fp4d_quantize_params p = { .format = FP4D_DTYPE_NVFP4, .convention = FP4D_CONV_FLASHINFER_EXACT,
                               .scale_layout = FP4D_LAYOUT_LINEAR, .encode_scale = 0.0f };
    assert_int_equal(fp4d_quantize(&p, FP4D_DTYPE_F32, x, 1, 24, c, s, NULL), FP4D_STATUS_INVALID_ARG);
    assert_true(strstr(fp4d_last_error(), "multiple of 16") != NULL);
    assert_int_equal(fp4d_quantize(&p, FP4D_DTYPE_F32, x, 1, 32, c, s, NULL), FP4D_STATUS_OK);
    assert_int_equal(fp4d_quantize(&p, FP4D_DTYPE_NVFP4, x, 1, 32, c, s, NULL), FP4D_STATUS_INVALID_ARG);
    p.encode_scale = -1.0f;
    assert_int_equal(fp4d_quantize(&p, FP4D_DTYPE_F32, x, 1, 32, c, s, NULL), FP4D_STATUS_INVALID_ARG);
    p.encode_scale = NAN;
    assert_int_equal(fp4d_quantize(&p, FP4D_DTYPE_F32, x, 1, 32, c, s, NULL), FP4D_STATUS_INVALID_ARG);
    p.encode_scale = INFINITY; /* decode scale 0: every element would dequantize to 0 */
    assert_int_equal(fp4d_quantize(&p, FP4D_DTYPE_F32, x, 1, 32, c, s, NULL), FP4D_STATUS_INVALID_ARG);
    p.encode_scale = 0.0f;
    /* a row length whose scratch size wrapped (cols * 4 bytes): refused before any allocation */
    assert_int_equal(fp4d_quantize(&p, FP4D_DTYPE_BF16, x, 1, (INT64_C(1) << 62) + 16, c, s, NULL),
                     FP4D_STATUS_INVALID_ARG);
    assert_int_equal(fp4d_quantize(&p, FP4D_DTYPE_F32, x, FP4D_MAX_DIM + 1, 32, c, s, NULL), FP4D_STATUS_INVALID_ARG);
    p.encode_scale = 0.0f;
    p.convention = FP4D_CONV_OCP;
    assert_int_equal(fp4d_quantize(&p, FP4D_DTYPE_F32, x, 1, 32, c, s, NULL), FP4D_STATUS_INVALID_ARG);
    p.format = FP4D_DTYPE_MXFP4;
    assert_int_equal(fp4d_quantize(&p, FP4D_DTYPE_F32, x, 1, 32, c, s, NULL), FP4D_STATUS_OK);
    assert_int_equal(fp4d_quantize(&p, FP4D_DTYPE_F32, x, 1, 16, c, s, NULL), FP4D_STATUS_INVALID_ARG);
    p.format = FP4D_DTYPE_BF16;
    assert_int_equal(fp4d_quantize(&p, FP4D_DTYPE_F32, x, 1, 32, c, s, NULL), FP4D_STATUS_INVALID_ARG);
    assert_int_equal(fp4d_quantize(NULL, FP4D_DTYPE_F32, x, 1, 32, c, s, NULL), FP4D_STATUS_INVALID_ARG);
    assert_int_equal(fp4d_dequantize(FP4D_DTYPE_NVFP4, FP4D_LAYOUT_LINEAR, c, s, 1.0f, 1, 8, (float *)x),
                     FP4D_STATUS_INVALID_ARG);
    assert_int_equal(fp4d_dequantize(FP4D_DTYPE_F32, FP4D_LAYOUT_LINEAR, c, s, 1.0f, 1, 16, (float *)x),
                     FP4D_STATUS_INVALID_ARG);
    /* empty tensors are fine */
    p.format = FP4D_DTYPE_NVFP4;
    p.convention = FP4D_CONV_FLASHINFER_EXACT;
    assert_int_equal(fp4d_quantize(&p, FP4D_DTYPE_F32, NULL, 0, 32, NULL, NULL, NULL), FP4D_STATUS_OK);
}

static void test_traits_and_names(void **state)
{
    (void)state;
    const fp4d_dtype_traits *t = fp4d_dtype_get(FP4D_DTYPE_NVFP4);
    assert_non_null(t);
    assert_string_equal(t->name, "nvfp4");
    assert_int_equal(t->block_size, 16);
    assert_int_equal(t->scale_kind, FP4D_SCALE_E4M3);
    assert_true(t->has_tensor_scale && t->is_block_fp4);
    assert_true(t->scale_to_f32(0x38) == 1.0f);
    t = fp4d_dtype_get(FP4D_DTYPE_MXFP4);
    assert_int_equal(t->block_size, 32);
    assert_int_equal(t->scale_kind, FP4D_SCALE_UE8M0);
    assert_false(t->has_tensor_scale);
    assert_true(t->scale_to_f32(0x80) == 2.0f);
    assert_null(fp4d_dtype_get(FP4D_DTYPE_COUNT));
    assert_null(fp4d_dtype_get(FP4D_DTYPE_F32)->scale_to_f32);
    for (int i = 0; i < FP4D_DTYPE_COUNT; i++) {
        fp4d_dtype d;
        assert_int_equal(fp4d_dtype_get((fp4d_dtype)i)->dtype, i);
        assert_true(fp4d_dtype_from_name(fp4d_dtype_get((fp4d_dtype)i)->name, &d));
        assert_int_equal(d, i);
    }
    fp4d_dtype d;
    assert_true(fp4d_dtype_from_name("fp16", &d));
    assert_int_equal(d, FP4D_DTYPE_F16);
    assert_false(fp4d_dtype_from_name("int4", &d));
    assert_int_equal(fp4d_dtype_data_bytes(FP4D_DTYPE_NVFP4, 128, 64), 128 * 32);
    assert_int_equal(fp4d_dtype_data_bytes(FP4D_DTYPE_BF16, 3, 5), 30);
    assert_int_equal(fp4d_dtype_data_bytes(FP4D_DTYPE_F32, 3, 5), 60);

    const char *names[] = { "flashinfer-exact", "trtllm", "modelopt", "torchao", "compressed-tensors", "ocp" };
    for (int i = 0; i < FP4D_CONV_COUNT; i++) {
        fp4d_convention c;
        assert_string_equal(fp4d_convention_name((fp4d_convention)i), names[i]);
        assert_true(fp4d_convention_from_name(names[i], &c));
        assert_int_equal(c, i);
    }
    fp4d_convention c;
    assert_false(fp4d_convention_from_name("bogus", &c));
    assert_true(fp4d_convention_supports(FP4D_CONV_MODELOPT, FP4D_DTYPE_NVFP4));
    assert_false(fp4d_convention_supports(FP4D_CONV_OCP, FP4D_DTYPE_NVFP4));
    assert_true(fp4d_convention_supports(FP4D_CONV_OCP, FP4D_DTYPE_MXFP4));
    assert_true(fp4d_convention_supports(FP4D_CONV_TRTLLM, FP4D_DTYPE_MXFP4));
    assert_false(fp4d_convention_supports(FP4D_CONV_TRTLLM, FP4D_DTYPE_F32));
}

static void test_to_from_f32(void **state)
{
    (void)state;
    const float v[4] = { 1.0f, -2.5f, 65520.0f, 1e-8f };
    uint16_t h[4];
    float back[4];
    fp4d_from_f32(FP4D_DTYPE_F16, v, 4, h);
    assert_int_equal(h[2], 0x7C00);
    fp4d_to_f32(FP4D_DTYPE_F16, h, 4, back);
    assert_true(back[0] == 1.0f && back[1] == -2.5f && isinf(back[2]));
    fp4d_from_f32(FP4D_DTYPE_BF16, v, 4, h);
    assert_int_equal(h[0], 0x3F80);
    float f[4];
    fp4d_from_f32(FP4D_DTYPE_F32, v, 4, f);
    assert_memory_equal(f, v, sizeof v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_edge_all_zero_block),
        cmocka_unit_test(test_edge_tensor_amax_zero),
        cmocka_unit_test(test_edge_one_nan_in_block),
        cmocka_unit_test(test_edge_all_nan_block),
        cmocka_unit_test(test_edge_inf_element),
        cmocka_unit_test(test_edge_scale_saturates),
        cmocka_unit_test(test_edge_scale_underflow),
        cmocka_unit_test(test_mxfp4_rules),
        cmocka_unit_test(test_flashinfer_exact_nvfp4_matches_spec),
        cmocka_unit_test(test_mxfp4_default_matches_spec),
        cmocka_unit_test(test_trtllm_hand_example),
        cmocka_unit_test(test_bf16_and_f16_sources),
        cmocka_unit_test(test_dequantize),
        cmocka_unit_test(test_invalid_arguments),
        cmocka_unit_test(test_traits_and_names),
        cmocka_unit_test(test_to_from_f32),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
