/*
 * The `ref` backend: the exact reference (ref.h) behind the backend interface. Slow and
 * single-threaded by design: it is the judge, not a contender.
 */
#include <stdio.h>
#include <stdlib.h>

#include "backend/backend_internal.h"
#include "fp4doctor/ref.h"

static int ref_ctx_token;

static fp4d_status ref_init(void *user_data, int device, void **ctx, fp4d_reason *why)
{
    (void)user_data, (void)device, (void)why;
    *ctx = &ref_ctx_token; /* stateless */
    return FP4D_STATUS_OK;
}

static void ref_free(void *ctx) { (void)ctx; }

static bool ref_supports(void *ctx, const fp4d_gemm_desc *d, fp4d_reason *why)
{
    (void)ctx;
    return fp4d_host_backend_supports(d, why);
}

static fp4d_status ref_gemm(void *ctx, const fp4d_gemm_problem *p)
{
    (void)ctx;
    return fp4d_ref_gemm(p);
}

static fp4d_status ref_grouped(void *ctx, const fp4d_grouped_gemm_problem *p)
{
    (void)ctx;
    return fp4d_ref_grouped_gemm(p);
}

static fp4d_status ref_quantize(void *ctx, fp4d_quantize_problem *q)
{
    (void)ctx;
    return fp4d_quantize(&q->params, q->src_type, q->src, q->rows, q->cols, q->codes, q->scales, &q->result);
}

static int ref_score(void *ctx, const fp4d_gemm_desc *d)
{
    (void)ctx, (void)d;
    return 1; /* always correct, always last */
}

static const fp4d_backend_iface ref_iface = {
    .api_version  = FP4D_BACKEND_API_VERSION,
    .struct_size  = sizeof(fp4d_backend_iface),
    .name         = "ref",
    .description  = "exact reference: exact sums of dyadic products, one rounding into the output type",
    .kind         = FP4D_BACKEND_KIND_REFERENCE,
    .caps         = FP4D_CAP_GEMM | FP4D_CAP_GROUPED_GEMM | FP4D_CAP_QUANTIZE,
    .user_data    = NULL,
    .init         = ref_init,
    .free         = ref_free,
    .supports     = ref_supports,
    .gemm         = ref_gemm,
    .grouped_gemm = ref_grouped,
    .quantize     = ref_quantize,
    .score        = ref_score,
    .bench        = NULL,
};

const fp4d_backend_iface *fp4d_ref_backend_iface(void) { return &ref_iface; }
