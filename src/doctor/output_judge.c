/*
 * An output made anywhere - an engine's own kernel, dumped to a file - judged against the
 * exact result with the error model check uses (tolerance.c, docs/tolerance.md §2). `verify
 * --tolerance` is built on it: an engine's FP4 GEMM is not bit-identical to the correctly
 * rounded result (it accumulates in f32 in its own order), so the bit-for-bit verify fails
 * every correct kernel; this says whether its errors are those of f32 accumulation.
 *
 * The exact values come from the threaded reference (fp4d_ref_gemm), rounded into the output
 * type; S = |alpha| * sum |a_k b_k| from the decoded rows in double. An element whose error
 * against the rounded value is more than half its bound is measured again against the
 * unrounded exact value (fp4d_ref_gemm_element), so no verdict rests on that rounding.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "doctor_internal.h"
#include "fp4doctor/ref.h"
#include "internal.h"
#include "out_elem.h"

/* Rows of A decoded at once: their doubles are reused for every row of B. */
#define JUDGE_A_BLOCK_BYTES ((size_t)32 << 20)

static void operand_of(const fp4d_matrix *m, fp4d_operand *op)
{
    memset(op, 0, sizeof *op);
    op->mat = *m;
    const fp4d_dtype_traits *t = fp4d_dtype_get(m->dtype);
    if (t->is_block_fp4) op->scales_bytes = fp4d_scale_buffer_size(m->scale_layout, m->rows, m->cols / t->block_size);
    op->decode_scale = 1.0;
}

typedef struct judge_state {
    const fp4d_gemm_problem *p;
    fp4d_tolerance           tol;
    fp4d_output_judgement   *r;
    double                   worst_ratio;
} judge_state;

static fp4d_status judge_element(judge_state *js, int64_t m, int64_t n, double got, double rounded, double s)
{
    fp4d_output_judgement *r = js->r;
    const int64_t i = m * js->p->b.rows + n;
    if (isnan(got) || isnan(rounded)) {
        if (isnan(got) && isnan(rounded)) return FP4D_STATUS_OK;
        r->beyond_fp32++;
        r->beyond_practical++;
        if (r->nan_mismatch++ == 0) {
            r->worst = i;
            r->worst_got = got;
            r->worst_exact = rounded;
            r->worst_bound_fp32 = fp4d_bound_fp32(&js->tol, rounded, s);
            r->worst_bound_practical = fp4d_bound_practical(&js->tol, rounded, s);
        }
        return FP4D_STATUS_OK;
    }
    if (got == rounded) return FP4D_STATUS_OK;
    double exact = rounded, err = fabs(got - rounded), b1 = fp4d_bound_fp32(&js->tol, rounded, s);
    if (!(err <= 0.5 * b1)) { /* near or past the edge, or infinite: the unrounded exact value decides */
        uint8_t elem[8];
        FP4D_FORWARD_IF_ERROR(fp4d_ref_gemm_element(js->p, m, n, elem, &exact));
        err = isinf(got) && !isinf(exact) ? INFINITY : fabs(got - exact);
        b1 = fp4d_bound_fp32(&js->tol, exact, s);
    }
    const double b2 = fp4d_bound_practical(&js->tol, exact, s);
    if (!(err <= b1)) r->beyond_fp32++;
    if (!(err <= b2)) r->beyond_practical++;
    const double ratio = b1 > 0 ? err / b1 : INFINITY;
    if (!r->nan_mismatch && (r->worst < 0 || ratio > js->worst_ratio)) {
        js->worst_ratio = ratio;
        r->worst = i;
        r->worst_got = got;
        r->worst_exact = exact;
        r->worst_bound_fp32 = b1;
        r->worst_bound_practical = b2;
    }
    return FP4D_STATUS_OK;
}

fp4d_status fp4d_judge_gemm_output(const fp4d_gemm_problem *p, const void *got, fp4d_output_judgement *r)
{
    FP4D_RETURN_ERROR_IF(!p || !got || !r, INVALID_ARG, "judge: NULL problem, output or result");
    memset(r, 0, sizeof *r);
    r->worst = -1;
    fp4d_gemm_problem ref = *p;
    ref.out = (void *)got; /* validated as an output buffer; the reference writes elsewhere */
    FP4D_FORWARD_IF_ERROR(fp4d_gemm_validate(&ref));
    const int64_t M = p->a.rows, N = p->b.rows, K = p->a.cols;
    r->elements = M * N;
    if (M == 0 || N == 0) return FP4D_STATUS_OK;

    const size_t esize = fp4d_out_elem_size(p->out_type);
    int64_t block = (int64_t)(JUDGE_A_BLOCK_BYTES / ((size_t)(K ? K : 1) * sizeof(double)));
    if (block < 1) block = 1;
    if (block > M) block = M;
    ref.out = malloc((size_t)(M * N) * esize);
    double *arows = malloc((size_t)(block * (K ? K : 1)) * sizeof(double));
    double *brow = malloc((size_t)(K ? K : 1) * sizeof(double));
    fp4d_status st = FP4D_STATUS_OK;
    if (!ref.out || !arows || !brow) st = fp4d_set_error(FP4D_STATUS_NOMEM, "judge: out of memory");
    if (st == FP4D_STATUS_OK) st = fp4d_ref_gemm(&ref);
    if (st == FP4D_STATUS_OK) {
        fp4d_operand a, b;
        operand_of(&p->a, &a);
        operand_of(&p->b, &b);
        judge_state js = {.p = p, .tol = fp4d_tolerance_for(K, p->out_type), .r = r, .worst_ratio = 0.0};
        const double alpha = fabs((double)p->alpha);
        for (int64_t m0 = 0; m0 < M && st == FP4D_STATUS_OK; m0 += block) {
            const int64_t rows = M - m0 < block ? M - m0 : block;
            for (int64_t m = 0; m < rows; m++) fp4d_operand_decode_row(&a, m0 + m, NULL, arows + m * K);
            for (int64_t n = 0; n < N && st == FP4D_STATUS_OK; n++) {
                fp4d_operand_decode_row(&b, n, NULL, brow);
                for (int64_t m = 0; m < rows && st == FP4D_STATUS_OK; m++) {
                    const double *ar = arows + m * K;
                    double s = 0.0;
                    for (int64_t k = 0; k < K; k++) s += fabs(ar[k] * brow[k]);
                    const int64_t i = (m0 + m) * N + n;
                    st = judge_element(&js, m0 + m, n, fp4d_out_elem_get(p->out_type, got, i),
                                       fp4d_out_elem_get(p->out_type, ref.out, i), s * alpha);
                }
            }
        }
    }
    free(brow);
    free(arows);
    free(ref.out);
    return st;
}
