/*
 * adv_gemm_plugin.c - an "outsider's" fp4doctor plugin: a naive but otherwise correct
 * FP4 GEMM (NVFP4 x NVFP4, MXFP4 x MXFP4, bf16/f16/f32 x NVFP4, plain and grouped MoE),
 * written from include/fp4doctor/plugin.h, backend.h, gemm.h and the number formats of
 * the spec alone. It does not link libfp4doctor: e2m1, e4m3, ue8m0, bf16 and f16 are
 * decoded and encoded here, by hand, and so are the scale layouts.
 *
 * ADV_BUG (a compile definition) plants ONE published-style bug; ADV_NAME names the
 * backend. The test driver (test_adversarial_plugins.c) checks that the doctor gives each
 * the verdict and cause it deserves. ADV_BUG = 0 is the correct control.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp4doctor/plugin.h"

#ifndef ADV_BUG
#define ADV_BUG 0
#endif
#ifndef ADV_NAME
#define ADV_NAME "adv-correct"
#endif
/* Which operand the scale-decoding bugs (layout, ue8m0, block size) hit: 0 both (a shared
 * decode path), 1 A only, 2 B only. */
#ifndef ADV_OPERAND
#define ADV_OPERAND 0
#endif

/* Bug numbers: macros, not an enum, because #if compares them (an enum constant in #if
 * is 0 to the preprocessor). */
#define BUG_NONE               0  /* the correct control */
#define BUG_ALPHA_IGNORED      1  /* alpha (the per-tensor scales) never applied */
#define BUG_PAD_STRIDE         2  /* linear scales read with the row stride padded to 4 columns */
#define BUG_SWZ_PERM           3  /* 128x4 swizzle with the inner [4 row-groups][4 cols] swapped */
#define BUG_M_WINDOW           4  /* all zeros when 129 <= M <= 2048 (a broken tactic) */
#define BUG_NAN_ROWS           5  /* NaN in every row >= 128 (a racy second row tile) */
#define BUG_B_TRANSPOSED       6  /* B read as [K, N] */
#define BUG_BLOCK32            7  /* NVFP4 read with 32-element blocks */
#define BUG_NIBBLE_A           8  /* nibble order swapped for A (activations) only */
#define BUG_UE8M0              9  /* NVFP4 e4m3 block scales decoded as ue8m0 */
#define BUG_FP16_ACC           10 /* accumulation in fp16 */
#define BUG_ZERO_HALF_TILE     11 /* rows 64..127 of each 128-row tile written as zeros (M > 64) */
#define BUG_SKIP_HALF_TILE     12 /* rows 64..127 of each 128-row tile never written (M > 64) */
#define BUG_STALE_K64          13 /* returns without writing when K % 64 != 0 */
#define BUG_OOB_ROW            14 /* writes one row past the end of the output */
#define BUG_GEMM_UNSUPPORTED   15 /* supports() says yes, gemm() says UNSUPPORTED for M > 64 */
#define BUG_NO_MXFP4           16 /* honest: supports() says no to MXFP4, with a reason */
#define BUG_ABORT              17 /* abort() (a failed assert) when K >= 4096 */
#define BUG_ALWAYS_LINEAR      18 /* ignores the layout field: always reads linear scales */
#define BUG_ALWAYS_SWIZZLED    19 /* ignores the layout field: always reads 128x4 scales */
#define BUG_ALPHA_INVERTED     20 /* divides by alpha (encode scales where decode belong) */
#define BUG_RACY               21 /* split-K order flips on every other call (bits differ) */
#define BUG_MOE_EMPTY          22 /* grouped: weights indexed by the count of NON-EMPTY experts */
#define BUG_K_TAIL             23 /* drops the K % 64 tail of the reduction */
#define BUG_BF16_TRUNC         24 /* bf16 output by truncation instead of round-to-nearest-even */
#define BUG_HANG               25 /* never returns when M == 7 */
#define BUG_N_TAIL             26 /* last column written as 0 when N % 128 != 0 */
#define BUG_CLOBBER_INPUT      27 /* uses A's block-scale buffer as scratch (writes its input) */
#define BUG_BLOCK32_STRIDE     28 /* NVFP4 scale column k/32, but the true K/16 row stride */
#define BUG_FREE_CRASH         29 /* free() dies of SIGSEGV (a GPU backend torn down on a lost context) */

#define NVFP4_BLOCK 16
#define MXFP4_BLOCK 32

/* ---- scalar decoders (spec §1, §2, §3) ---- */

static float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t bits_from_f32(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* 2^e for -149 <= e <= 127, exactly (subnormals included). */
static float exp2i(int e)
{
    if (e >= -126) return f32_from_bits((uint32_t)(e + 127) << 23);
    return f32_from_bits(1u << (e + 149));
}

static float e2m1_decode(uint8_t code)
{
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float v = mag[code & 7];
    return (code & 8) ? -v : v;
}

/* NVFP4 block scale: e4m3 with the sign bit unused (0x7F / 0xFF are NaN). */
__attribute__((unused)) static float e4m3_scale_decode(uint8_t b)
{
    if ((b & 0x7F) == 0x7F) return f32_from_bits(0x7FC00000u);
    int e = (b >> 3) & 15, m = b & 7;
    float v = e == 0 ? (float)m * exp2i(-9) : (float)(8 + m) * exp2i(e - 10);
    return (b & 0x80) ? -v : v;
}

/* MX block scale: 2^(b-127); 0xFF is NaN. 2^-127 is a subnormal float, exact. */
static float ue8m0_decode(uint8_t b)
{
    if (b == 0xFF) return f32_from_bits(0x7FC00000u);
    return exp2i((int)b - 127);
}

static float bf16_decode(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

static float f16_decode(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    float v;
    if (e == 0) v = (float)m * exp2i(-24);
    else if (e == 31) v = m ? f32_from_bits(0x7FC00000u) : f32_from_bits(0x7F800000u);
    else v = (float)(1024 + m) * exp2i(e - 25);
    return s ? -v : v;
}

static uint16_t bf16_encode(float f)
{
    uint32_t u = bits_from_f32(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* f32 -> f16, round to nearest even, overflow to Inf. */
static uint16_t f16_encode(float f)
{
    uint32_t u = bits_from_f32(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (uint16_t)(sign | 0x7E00u);
    if (a >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u); /* >= 65520 rounds to Inf */
    if (a < 0x38800000u) {                                  /* below 2^-14: subnormal */
        /* value / 2^-24, rounded to nearest even, via the float adder: adding 0.5 * 2^0
         * would not do; scale by 2^24 exactly and round by hand. */
        float scaled = f32_from_bits(a) * 16777216.0f; /* exact: a power of two */
        uint32_t q = (uint32_t)scaled;
        float frac = scaled - (float)q;
        if (frac > 0.5f || (frac == 0.5f && (q & 1))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = a + 0x0FFFu + ((a >> 13) & 1u);
    return (uint16_t)(sign | (((r >> 13) - (112u << 10)) & 0xFFFFu));
}

__attribute__((unused)) static float f16_round(float f) { return f16_decode(f16_encode(f)); }

/* ---- operands ---- */

static int64_t ceil_to(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* Bytes of a scale buffer (spec §6), so that a bug never reads past it. */
static size_t scale_bytes(fp4d_scale_layout l, int64_t rows, int64_t cols)
{
    if (l == FP4D_LAYOUT_SWIZZLED_128X4) return (size_t)(ceil_to(rows, 128) * ceil_to(cols, 4));
    return (size_t)(rows * cols);
}

static size_t scale_offset(fp4d_scale_layout l, int64_t cols, int64_t r, int64_t c, int bug_on)
{
    int64_t cp = ceil_to(cols, 4);
    (void)bug_on;
#if ADV_BUG == BUG_ALWAYS_LINEAR
    if (bug_on) l = FP4D_LAYOUT_LINEAR;
#elif ADV_BUG == BUG_ALWAYS_SWIZZLED
    if (bug_on) l = FP4D_LAYOUT_SWIZZLED_128X4;
#endif
    if (l == FP4D_LAYOUT_SWIZZLED_128X4) {
        size_t tile = (size_t)((r / 128) * 128 * cp + (c / 4) * 512);
#if ADV_BUG == BUG_SWZ_PERM
        /* [32][4][4] read as [32][4 cols][4 row groups]. */
        return tile + (size_t)((r % 32) * 16 + (c % 4) * 4 + (r / 32) % 4);
#else
        return tile + (size_t)((r % 32) * 16 + ((r / 32) % 4) * 4 + c % 4);
#endif
    }
#if ADV_BUG == BUG_PAD_STRIDE
    return (size_t)(r * cp + c); /* the padded stride of the swizzled buffers */
#else
    return (size_t)(r * cols + c);
#endif
}

/* Decodes a [rows, K] operand into floats (per-tensor scale excluded: it is in alpha). */
static int decode(const fp4d_matrix *x, int is_a, float *dst)
{
    int64_t rows = x->rows, K = x->cols;
    if (x->dtype == FP4D_DTYPE_F32) {
        memcpy(dst, x->data, (size_t)(rows * K) * sizeof(float));
        return 0;
    }
    if (x->dtype == FP4D_DTYPE_BF16 || x->dtype == FP4D_DTYPE_F16) {
        const uint16_t *h = x->data;
        for (int64_t i = 0; i < rows * K; i++)
            dst[i] = x->dtype == FP4D_DTYPE_BF16 ? bf16_decode(h[i]) : f16_decode(h[i]);
        return 0;
    }
    int nv = x->dtype == FP4D_DTYPE_NVFP4;
    int bug_on = ADV_OPERAND == 0 || (ADV_OPERAND == 1) == (is_a != 0);
    int64_t bs = nv ? NVFP4_BLOCK : MXFP4_BLOCK;
#if ADV_BUG == BUG_BLOCK32
    if (nv && bug_on) bs = 32; /* "FP4 blocks are 32 wide" */
#endif
    int64_t sc = K / bs;
    /* The caller's buffer is sized for the true block count. */
    size_t sbytes = scale_bytes(x->scale_layout, rows, K / (nv ? NVFP4_BLOCK : MXFP4_BLOCK));
    const uint8_t *codes = x->data;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = 0; k < K; k++) {
            int64_t idx = r * K + k;
#if ADV_BUG == BUG_B_TRANSPOSED
            if (!is_a) idx = k * rows + r; /* B taken as [K, N] */
#endif
            int64_t rr = idx / K, kk = idx % K;
            uint8_t byte = codes[idx / 2];
            int high = (int)(idx & 1);
#if ADV_BUG == BUG_NIBBLE_A
            if (is_a) high ^= 1;
#endif
            uint8_t code = high ? (uint8_t)(byte >> 4) : (uint8_t)(byte & 15);
#if ADV_BUG == BUG_BLOCK32_STRIDE
            /* The host passes the right scale stride; the kernel's block constant is 32. */
            size_t off = scale_offset(x->scale_layout, sc, rr, kk / (nv && bug_on ? 32 : bs), bug_on);
#else
            size_t off = scale_offset(x->scale_layout, sc, rr, kk / bs, bug_on);
#endif
            uint8_t sb = off < sbytes ? x->scales[off] : 0; /* past the end reads zeros */
            float s;
            if (nv) {
#if ADV_BUG == BUG_UE8M0
                s = bug_on ? ue8m0_decode(sb) : e4m3_scale_decode(sb);
#else
                s = e4m3_scale_decode(sb);
#endif
            } else {
                s = ue8m0_decode(sb);
            }
            dst[r * K + k] = e2m1_decode(code) * s;
        }
    return 0;
}

static void store(fp4d_dtype t, void *out, int64_t i, float v)
{
    if (t == FP4D_DTYPE_F32) ((float *)out)[i] = v;
#if ADV_BUG == BUG_BF16_TRUNC
    else if (t == FP4D_DTYPE_BF16) ((uint16_t *)out)[i] = (uint16_t)(bits_from_f32(v) >> 16);
#endif
    else if (t == FP4D_DTYPE_BF16) ((uint16_t *)out)[i] = bf16_encode(v);
    else ((uint16_t *)out)[i] = f16_encode(v);
}

/* out rows [0, M) of one (sub-)GEMM: a = decoded rows of A, b = decoded B. */
static fp4d_status gemm_rows(const float *a, const float *b, int64_t M, int64_t N, int64_t K, float alpha,
                             fp4d_dtype out_type, void *out, int64_t out_row0)
{
#if ADV_BUG == BUG_STALE_K64
    if (K % 64 != 0) return FP4D_STATUS_OK; /* "the K-tail kernel is not dispatched" */
#endif
#if ADV_BUG == BUG_ABORT
    if (K >= 4096) abort();
#endif
#if ADV_BUG == BUG_HANG
    if (M == 7)
        for (volatile int spin = 1; spin;) {
        }
#endif
#if ADV_BUG == BUG_RACY
    static long calls; /* split-K partials land in a different order on alternate calls */
    int reverse = (int)(calls++ & 1);
#endif
#if ADV_BUG == BUG_K_TAIL
    int64_t K_used = K - K % 64;
#else
    int64_t K_used = K;
#endif
    for (int64_t m = 0; m < M; m++) {
#if ADV_BUG == BUG_SKIP_HALF_TILE
        if (M > 64 && m % 128 >= 64) continue;
#endif
        for (int64_t n = 0; n < N; n++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < K_used; k++) {
#if ADV_BUG == BUG_FP16_ACC
                acc = f16_round(acc + a[m * K + k] * b[n * K + k]);
#elif ADV_BUG == BUG_RACY
                int64_t kk = reverse ? K - 1 - k : k;
                acc += a[m * K + kk] * b[n * K + kk];
#else
                acc += a[m * K + k] * b[n * K + k];
#endif
            }
#if ADV_BUG == BUG_ALPHA_IGNORED
            float v = acc;
            (void)alpha;
#elif ADV_BUG == BUG_ALPHA_INVERTED
            float v = acc / alpha;
#else
            float v = alpha * acc;
#endif
#if ADV_BUG == BUG_M_WINDOW
            if (M >= 129 && M <= 2048) v = 0.0f;
#endif
#if ADV_BUG == BUG_NAN_ROWS
            if (m >= 128) v = f32_from_bits(0x7FC00000u);
#endif
#if ADV_BUG == BUG_ZERO_HALF_TILE
            if (M > 64 && m % 128 >= 64) v = 0.0f;
#endif
#if ADV_BUG == BUG_N_TAIL
            if (N % 128 != 0 && n == N - 1) v = 0.0f;
#endif
            store(out_type, out, (out_row0 + m) * N + n, v);
        }
    }
#if ADV_BUG == BUG_OOB_ROW
    for (int64_t n = 0; n < N; n++) store(out_type, out, (out_row0 + M) * N + n, 0.0f); /* m <= M */
#endif
    return FP4D_STATUS_OK;
}

/* ---- the iface ---- */

static fp4d_status adv_init(void *user_data, int device, void **ctx, fp4d_reason *why)
{
    (void)user_data, (void)device, (void)why;
    *ctx = NULL;
    return FP4D_STATUS_OK;
}

static void adv_free(void *ctx)
{
    (void)ctx;
#if ADV_BUG == BUG_FREE_CRASH
    raise(SIGSEGV);
#endif
}

static bool adv_supports(void *ctx, const fp4d_gemm_desc *d, fp4d_reason *why)
{
    (void)ctx;
    int a_plain = d->a_type == FP4D_DTYPE_BF16 || d->a_type == FP4D_DTYPE_F16 || d->a_type == FP4D_DTYPE_F32;
    int ok_pair = (d->a_type == FP4D_DTYPE_NVFP4 && d->b_type == FP4D_DTYPE_NVFP4) ||
                  (d->a_type == FP4D_DTYPE_MXFP4 && d->b_type == FP4D_DTYPE_MXFP4) ||
                  (a_plain && d->b_type == FP4D_DTYPE_NVFP4);
    if (!ok_pair) {
        snprintf(why->text, sizeof why->text, ADV_NAME " does not multiply these formats");
        return false;
    }
#if ADV_BUG == BUG_NO_MXFP4
    if (d->a_type == FP4D_DTYPE_MXFP4 || d->b_type == FP4D_DTYPE_MXFP4) {
        snprintf(why->text, sizeof why->text, "adv-no-mxfp4 has no ue8m0 scale path (MXFP4 planned for v2)");
        return false;
    }
#endif
    int lay_ok = 1;
    if (d->a_type == FP4D_DTYPE_NVFP4 || d->a_type == FP4D_DTYPE_MXFP4)
        lay_ok &= d->a_layout == FP4D_LAYOUT_LINEAR || d->a_layout == FP4D_LAYOUT_SWIZZLED_128X4;
    lay_ok &= d->b_layout == FP4D_LAYOUT_LINEAR || d->b_layout == FP4D_LAYOUT_SWIZZLED_128X4;
    if (!lay_ok) {
        snprintf(why->text, sizeof why->text, ADV_NAME " reads linear and 128x4 scales only");
        return false;
    }
    if (d->out_type != FP4D_DTYPE_F32 && d->out_type != FP4D_DTYPE_BF16 && d->out_type != FP4D_DTYPE_F16) {
        snprintf(why->text, sizeof why->text, ADV_NAME " writes f32, bf16 or f16");
        return false;
    }
    return true;
}

static fp4d_status adv_gemm(void *ctx, const fp4d_gemm_problem *p)
{
    (void)ctx;
    int64_t M = p->a.rows, N = p->b.rows, K = p->a.cols;
#if ADV_BUG == BUG_GEMM_UNSUPPORTED
    if (M > 64) return FP4D_STATUS_UNSUPPORTED; /* "no tactic for this M" after saying yes */
#endif
    float *a = malloc((size_t)(M * K + 1) * sizeof *a), *b = malloc((size_t)(N * K + 1) * sizeof *b);
    if (!a || !b) {
        free(a), free(b);
        return FP4D_STATUS_NOMEM;
    }
    decode(&p->a, 1, a);
    decode(&p->b, 0, b);
    fp4d_status st = gemm_rows(a, b, M, N, K, p->alpha, p->out_type, p->out, 0);
#if ADV_BUG == BUG_CLOBBER_INPUT
    if (p->a.scales) { /* "the scales are consumed, the buffer is free": it is not ours */
        int64_t blk = p->a.dtype == FP4D_DTYPE_NVFP4 ? NVFP4_BLOCK : MXFP4_BLOCK;
        memset((void *)p->a.scales, 0, scale_bytes(p->a.scale_layout, M, K / blk));
    }
#endif
    free(a), free(b);
    return st;
}

static fp4d_status adv_grouped(void *ctx, const fp4d_grouped_gemm_problem *p)
{
    (void)ctx;
    int64_t T = p->a.rows, K = p->a.cols;
    float *a = malloc((size_t)(T * K + 1) * sizeof *a);
    if (!a) return FP4D_STATUS_NOMEM;
    decode(&p->a, 1, a); /* one scale matrix for all rows (gemm.h) */
    fp4d_status st = FP4D_STATUS_OK;
    int32_t active = 0; /* experts with rows seen so far */
    for (int32_t e = 0; e < p->num_experts && st == FP4D_STATUS_OK; e++) {
        int64_t r0 = p->expert_offsets[e], r1 = p->expert_offsets[e + 1], N = p->b[e].rows;
        if (r1 <= r0) continue;
#if ADV_BUG == BUG_MOE_EMPTY
        int32_t w = active; /* the compacted index used for the weights too */
#else
        int32_t w = e;
#endif
        active++;
        float *b = malloc((size_t)(N * K + 1) * sizeof *b);
        if (!b) {
            st = FP4D_STATUS_NOMEM;
            break;
        }
        decode(&p->b[w], 0, b);
        st = gemm_rows(a + r0 * K, b, r1 - r0, N, K, p->alpha[w], p->out_type, p->out, r0);
        free(b);
    }
    (void)active;
    free(a);
    return st;
}

static const fp4d_backend_iface adv_iface = {
    .api_version  = FP4D_BACKEND_API_VERSION,
    .struct_size  = sizeof(fp4d_backend_iface),
    .name         = ADV_NAME,
    .description  = "adversarial test plugin (tests/plugins_adversarial)",
    .kind         = FP4D_BACKEND_KIND_PLUGIN,
    .caps         = FP4D_CAP_GEMM | FP4D_CAP_GROUPED_GEMM,
    .init         = adv_init,
    .free         = adv_free,
    .supports     = adv_supports,
    .gemm         = adv_gemm,
    .grouped_gemm = adv_grouped,
};

__attribute__((visibility("default"))) int fp4d_plugin_init(const fp4d_plugin_host *host)
{
    if (host->api_version < FP4D_BACKEND_API_VERSION) return 1;
    return host->register_backend(host, &adv_iface);
}
