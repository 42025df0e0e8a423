/*
 * A test plugin whose words are hostile to the report formats (test_report_outputs.c): markup,
 * ampersands, quotes, control characters and multi-byte UTF-8 in its description and in the
 * reasons it gives, and a bench() that answers a median of 0 us.
 *   hostile       writes zeros (ZEROS), declines MXFP4 with a markup-laden reason
 *   hostile-down  init() fails with a markup-laden reason (UNSUPPORTED, unavailable)
 */
#include <stdio.h>
#include <string.h>

#include "fp4doctor/plugin.h"

#define HOSTILE_WORDS "<script>alert(\"x&y\")</script> 'q' \xc3\xa9\xe2\x82\xac \x1b[31m]]></b>"

static fp4d_status h_init(void *user, int device, void **ctx, fp4d_reason *why)
{
    (void)device;
    *ctx = NULL;
    if (user) {
        snprintf(why->text, sizeof why->text, "down: <img src=x onerror=alert(1)> & \"%s\"", HOSTILE_WORDS);
        return FP4D_STATUS_UNSUPPORTED;
    }
    return FP4D_STATUS_OK;
}
static void h_free(void *ctx) { (void)ctx; }
static bool h_supports(void *ctx, const fp4d_gemm_desc *d, fp4d_reason *why)
{
    (void)ctx;
    if (d->b_type == FP4D_DTYPE_MXFP4) {
        snprintf(why->text, sizeof why->text, "no MXFP4: %s", HOSTILE_WORDS);
        return false;
    }
    return true;
}
static fp4d_status h_gemm(void *ctx, const fp4d_gemm_problem *p)
{
    (void)ctx;
    const size_t elem = p->out_type == FP4D_DTYPE_F32 ? 4 : 2;
    memset(p->out, 0, (size_t)(p->a.rows * p->b.rows) * elem);
    return FP4D_STATUS_OK;
}
/* a clock too coarse for the call: 0 us, so TFLOP/s and GB/s come out infinite */
static fp4d_status h_bench(void *ctx, const fp4d_gemm_desc *d, int repeats, fp4d_bench_result *out)
{
    (void)ctx, (void)d;
    out->median_us = 0.0;
    out->min_us = 0.0;
    out->repeats = repeats;
    return FP4D_STATUS_OK;
}

static int down_marker;

static fp4d_backend_iface ifaces[2] = {
    {.api_version = FP4D_BACKEND_API_VERSION, .struct_size = sizeof(fp4d_backend_iface), .name = "hostile",
     .description = "<b>bold</b> & \"quoted\" " HOSTILE_WORDS, .kind = FP4D_BACKEND_KIND_PLUGIN, .caps = FP4D_CAP_GEMM,
     .init = h_init, .free = h_free, .supports = h_supports, .gemm = h_gemm, .bench = h_bench},
    {.api_version = FP4D_BACKEND_API_VERSION, .struct_size = sizeof(fp4d_backend_iface), .name = "hostile-down",
     .description = "never opens", .kind = FP4D_BACKEND_KIND_PLUGIN, .caps = FP4D_CAP_GEMM, .user_data = &down_marker,
     .init = h_init, .free = h_free, .supports = h_supports, .gemm = h_gemm},
};

int fp4d_plugin_init(const fp4d_plugin_host *host)
{
    for (int i = 0; i < 2; i++) {
        const int rc = host->register_backend(host, &ifaces[i]);
        if (rc) return rc;
    }
    return 0;
}
