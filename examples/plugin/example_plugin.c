/*
 * example_plugin.c - a complete fp4doctor plugin: a naive NVFP4 x NVFP4 GEMM with f32
 * accumulation, registered as "plugin:example-naive".
 *
 * It shows everything a kernel author needs: one exported entry point, a static iface,
 * a context from init(), supports() that says why not, and a gemm() that honours the
 * contract of gemm.h (write every output element and nothing else). It depends on the
 * fp4doctor headers only, not on libfp4doctor: decoding is done here, by hand.
 *
 * Build out of tree (README.md):  cc -O2 -shared -fPIC -I include example_plugin.c -o example_plugin.so
 * Try it:                         fp4doctor check --plugin ./example_plugin.so --backend plugin:example-naive
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp4doctor/plugin.h"

/* e2m1 code -> value (spec §1.1); the low nibble holds the even element (§1.5). */
static const float e2m1_value[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                     -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* 2^e for a normal f32 exponent, built from its bits (keeps the plugin free of libm). */
static float pow2f(int e)
{
    uint32_t bits = (uint32_t)(e + 127) << 23;
    float    f;
    memcpy(&f, &bits, 4);
    return f;
}

/* ue4m3 block scale -> value (spec §2.1, §2.5): e = bits 6..3 (bias 7), m = bits 2..0;
 * 0x7F is NaN and a set sign bit is invalid (NaN here too). */
static float ue4m3_value(uint8_t b)
{
    if (b & 0x80 || b == 0x7F) return NAN;
    int e = (b >> 3) & 0xF, m = b & 7;
    return e == 0 ? (float)m * pow2f(-9) : (float)(8 + m) * pow2f(e - 10);
}

/* Byte offset of scale (r, c) of a [rows, cols] scale matrix (spec §6). */
static size_t scale_offset(fp4d_scale_layout l, int64_t cols, int64_t r, int64_t c)
{
    int64_t cp = (cols + 3) / 4 * 4;
    if (l == FP4D_LAYOUT_SWIZZLED_128X4)
        return (size_t)((r / 128) * 128 * cp + (c / 4) * 512 + (r % 32) * 16 + ((r / 32) % 4) * 4 + c % 4);
    return (size_t)(r * cols + c);
}

/* Element (r, k) of an NVFP4 matrix, decoded without the per-tensor scale (it is in alpha). */
static float nvfp4_at(const fp4d_matrix *x, int64_t r, int64_t k)
{
    const uint8_t *codes = x->data;
    uint8_t        byte  = codes[(r * x->cols + k) / 2];
    uint8_t        code  = (k % 2 == 0) ? (byte & 0xF) : (byte >> 4);
    float          scale = ue4m3_value(x->scales[scale_offset(x->scale_layout, x->cols / 16, r, k / 16)]);
    return e2m1_value[code] * scale; /* exact in f32 */
}

/* f32 -> bf16, round to nearest even (NaN stays NaN). */
static uint16_t bf16_from_f32(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

typedef struct naive_ctx {
    long calls;
} naive_ctx;

static fp4d_status naive_init(void *user_data, int device, void **ctx, fp4d_reason *why)
{
    (void)user_data, (void)device;
    naive_ctx *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(why->text, sizeof why->text, "out of memory");
        return FP4D_STATUS_NOMEM;
    }
    *ctx = c;
    return FP4D_STATUS_OK;
}

static void naive_free(void *ctx) { free(ctx); }

static bool naive_supports(void *ctx, const fp4d_gemm_desc *d, fp4d_reason *why)
{
    (void)ctx;
    if (d->a_type != FP4D_DTYPE_NVFP4 || d->b_type != FP4D_DTYPE_NVFP4) {
        snprintf(why->text, sizeof why->text, "example-naive multiplies NVFP4 by NVFP4 only");
        return false;
    }
    if (d->out_type != FP4D_DTYPE_F32 && d->out_type != FP4D_DTYPE_BF16) {
        snprintf(why->text, sizeof why->text, "example-naive writes f32 or bf16 only");
        return false;
    }
    if ((d->a_layout != FP4D_LAYOUT_LINEAR && d->a_layout != FP4D_LAYOUT_SWIZZLED_128X4) ||
        (d->b_layout != FP4D_LAYOUT_LINEAR && d->b_layout != FP4D_LAYOUT_SWIZZLED_128X4)) {
        snprintf(why->text, sizeof why->text, "example-naive reads linear or 128x4-swizzled scales only");
        return false;
    }
    if (d->num_experts > 0) {
        snprintf(why->text, sizeof why->text, "example-naive has no grouped GEMM");
        return false;
    }
    return true;
}

static fp4d_status naive_gemm(void *ctx, const fp4d_gemm_problem *p)
{
    naive_ctx *c = ctx;
    c->calls++;
    for (int64_t m = 0; m < p->a.rows; m++)
        for (int64_t n = 0; n < p->b.rows; n++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < p->a.cols; k++) acc += nvfp4_at(&p->a, m, k) * nvfp4_at(&p->b, n, k);
            float v = p->alpha * acc;
            if (p->out_type == FP4D_DTYPE_F32) ((float *)p->out)[m * p->b.rows + n] = v;
            else ((uint16_t *)p->out)[m * p->b.rows + n] = bf16_from_f32(v);
        }
    return FP4D_STATUS_OK;
}

static const fp4d_backend_iface naive_iface = {
    .api_version  = FP4D_BACKEND_API_VERSION,
    .struct_size  = sizeof(fp4d_backend_iface),
    .name         = "example-naive",
    .description  = "example plugin: naive NVFP4 x NVFP4 GEMM, f32 accumulation (examples/plugin)",
    .kind         = FP4D_BACKEND_KIND_PLUGIN,
    .caps         = FP4D_CAP_GEMM,
    .user_data    = NULL,
    .init         = naive_init,
    .free         = naive_free,
    .supports     = naive_supports,
    .gemm         = naive_gemm,
    .grouped_gemm = NULL,
    .quantize     = NULL,
    .score        = NULL, /* never preferred by `auto` over the built-in backends */
    .bench        = NULL,
};

/* The one exported symbol. */
__attribute__((visibility("default"))) int fp4d_plugin_init(const fp4d_plugin_host *host)
{
    if (host->api_version < FP4D_BACKEND_API_VERSION) {
        host->log(host, "this fp4doctor is older than the backend API this plugin was built for");
        return 1;
    }
    return host->register_backend(host, &naive_iface);
}
