/* The operation under test: describing and validating GEMM problems (gemm.h). */
#include <stdint.h>
#include <stdio.h>

#include "fp4doctor/gemm.h"
#include "internal.h"

size_t fp4d_out_elem_size(fp4d_dtype out_type)
{
    switch (out_type) {
    case FP4D_DTYPE_F32: return 4;
    case FP4D_DTYPE_BF16:
    case FP4D_DTYPE_F16: return 2;
    default: return 0;
    }
}

void fp4d_gemm_describe(const fp4d_gemm_problem *p, fp4d_gemm_desc *d)
{
    d->m = p->a.rows;
    d->n = p->b.rows;
    d->k = p->a.cols;
    d->a_type = p->a.dtype;
    d->b_type = p->b.dtype;
    d->out_type = p->out_type;
    d->a_layout = p->a.scale_layout;
    d->b_layout = p->b.scale_layout;
    d->num_experts = 0;
}

void fp4d_grouped_gemm_describe(const fp4d_grouped_gemm_problem *p, fp4d_gemm_desc *d)
{
    d->m = p->a.rows;
    d->n = p->num_experts > 0 && p->b ? p->b[0].rows : 0;
    d->k = p->a.cols;
    d->a_type = p->a.dtype;
    d->b_type = p->num_experts > 0 && p->b ? p->b[0].dtype : FP4D_DTYPE_NVFP4;
    d->out_type = p->out_type;
    d->a_layout = p->a.scale_layout;
    d->b_layout = p->num_experts > 0 && p->b ? p->b[0].scale_layout : FP4D_LAYOUT_LINEAR;
    d->num_experts = p->num_experts;
}

/* Checks one operand; role is "A" or "B[3]" for messages. */
static fp4d_status validate_matrix(const fp4d_matrix *x, const char *role, bool must_be_fp4)
{
    const fp4d_dtype_traits *t = fp4d_dtype_get(x->dtype);
    FP4D_RETURN_ERROR_IF(!t, INVALID_ARG, "%s: unknown dtype %d", role, (int)x->dtype);
    FP4D_RETURN_ERROR_IF(must_be_fp4 && !t->is_block_fp4, INVALID_ARG,
                         "%s must be nvfp4 or mxfp4, got %s", role, t->name);
    FP4D_RETURN_ERROR_IF(x->rows < 0 || x->cols <= 0, INVALID_ARG,
                         "%s: bad shape [%lld, %lld]", role, (long long)x->rows, (long long)x->cols);
    /* Bound the shape so that every byte count below fits comfortably in 64 bits. */
    FP4D_RETURN_ERROR_IF(x->rows > FP4D_MAX_DIM || x->cols > FP4D_MAX_DIM, INVALID_ARG,
                         "%s: shape [%lld, %lld] too large", role, (long long)x->rows, (long long)x->cols);
    FP4D_RETURN_ERROR_IF(x->rows > 0 && !x->data, INVALID_ARG, "%s: data is NULL", role);
    if (t->is_block_fp4) {
        FP4D_RETURN_ERROR_IF(x->cols % t->block_size != 0, INVALID_ARG,
                             "%s: K = %lld is not a multiple of the %s block size %u", role,
                             (long long)x->cols, t->name, t->block_size);
        FP4D_RETURN_ERROR_IF(x->rows > 0 && !x->scales, INVALID_ARG, "%s: block scales are NULL", role);
        FP4D_RETURN_ERROR_IF((unsigned)x->scale_layout >= FP4D_LAYOUT_COUNT, INVALID_ARG,
                             "%s: unknown scale layout %d", role, (int)x->scale_layout);
    }
    return FP4D_STATUS_OK;
}

static fp4d_status validate_out(fp4d_dtype out_type, const void *out)
{
    FP4D_RETURN_ERROR_IF(fp4d_out_elem_size(out_type) == 0, INVALID_ARG,
                         "output type must be f32, bf16 or f16");
    FP4D_RETURN_ERROR_IF(!out, INVALID_ARG, "output buffer is NULL");
    return FP4D_STATUS_OK;
}

fp4d_status fp4d_gemm_validate(const fp4d_gemm_problem *p)
{
    FP4D_RETURN_ERROR_IF(!p, INVALID_ARG, "problem is NULL");
    FP4D_FORWARD_IF_ERROR(validate_matrix(&p->a, "A", false));
    FP4D_FORWARD_IF_ERROR(validate_matrix(&p->b, "B", true));
    FP4D_RETURN_ERROR_IF(p->a.cols != p->b.cols, INVALID_ARG, "K differs: A has %lld, B has %lld",
                         (long long)p->a.cols, (long long)p->b.cols);
    FP4D_RETURN_ERROR_IF(p->a.rows == 0 || p->b.rows == 0, INVALID_ARG, "M and N must be at least 1");
    return validate_out(p->out_type, p->out);
}

fp4d_status fp4d_grouped_gemm_validate(const fp4d_grouped_gemm_problem *p)
{
    FP4D_RETURN_ERROR_IF(!p, INVALID_ARG, "problem is NULL");
    FP4D_RETURN_ERROR_IF(p->num_experts <= 0, INVALID_ARG, "num_experts must be at least 1");
    FP4D_RETURN_ERROR_IF(!p->expert_offsets || !p->b || !p->alpha, INVALID_ARG,
                         "expert offsets, weights and alphas must not be NULL");
    FP4D_RETURN_ERROR_IF(p->expert_offsets[0] != 0, INVALID_ARG, "expert_offsets[0] must be 0");
    for (int32_t e = 0; e < p->num_experts; e++)
        FP4D_RETURN_ERROR_IF(p->expert_offsets[e + 1] < p->expert_offsets[e], INVALID_ARG,
                             "expert_offsets decrease at expert %d", (int)e);
    FP4D_RETURN_ERROR_IF(p->expert_offsets[p->num_experts] != p->a.rows, INVALID_ARG,
                         "expert_offsets end at %lld but A has %lld rows",
                         (long long)p->expert_offsets[p->num_experts], (long long)p->a.rows);
    FP4D_FORWARD_IF_ERROR(validate_matrix(&p->a, "A", false));
    char role[32];
    for (int32_t e = 0; e < p->num_experts; e++) {
        snprintf(role, sizeof role, "B[%d]", (int)e);
        FP4D_FORWARD_IF_ERROR(validate_matrix(&p->b[e], role, true));
        FP4D_RETURN_ERROR_IF(p->b[e].cols != p->a.cols, INVALID_ARG, "K differs: A has %lld, %s has %lld",
                             (long long)p->a.cols, role, (long long)p->b[e].cols);
        FP4D_RETURN_ERROR_IF(p->b[e].rows != p->b[0].rows || p->b[e].dtype != p->b[0].dtype ||
                                 p->b[e].scale_layout != p->b[0].scale_layout,
                             INVALID_ARG, "%s differs from B[0] in N, dtype or scale layout", role);
        FP4D_RETURN_ERROR_IF(p->b[e].rows == 0, INVALID_ARG, "N must be at least 1");
    }
    return validate_out(p->out_type, p->out);
}
