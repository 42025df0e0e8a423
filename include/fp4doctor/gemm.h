/*
 * gemm.h - the operation under test (DESIGN.md §3): a "TN" GEMM on block-scaled FP4.
 *
 *   out[m, n] = alpha * sum_k A^[m, k] * B^[n, k]
 *
 * A is [M, K] (activations), B is [N, K] (weights), both K-contiguous. A^ and B^ are the
 * dequantized values WITHOUT the NVFP4 per-tensor scales: those are folded into alpha
 * (alpha = RN_f32(a_scale_2 * b_scale_2) for two NVFP4 operands), as cuBLASLt and
 * flashinfer's mm_fp4 do.
 */
#ifndef FP4DOCTOR_GEMM_H
#define FP4DOCTOR_GEMM_H

#include "formats.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One operand: a row-major [rows, cols] matrix, cols = K. */
typedef struct fp4d_matrix {
    fp4d_dtype        dtype;        /* A: any; B: NVFP4 or MXFP4 */
    int64_t           rows, cols;
    const void       *data;         /* plain: rows*cols elements; FP4: rows*cols/2 packed bytes */
    const uint8_t    *scales;       /* FP4 only: block scales in scale_layout, else NULL */
    fp4d_scale_layout scale_layout; /* FP4 only */
} fp4d_matrix;

/* Shape and types only: what a backend needs to answer supports() and score(). */
typedef struct fp4d_gemm_desc {
    int64_t           m, n, k;
    fp4d_dtype        a_type, b_type, out_type; /* out: F32, BF16 or F16 */
    fp4d_scale_layout a_layout, b_layout;       /* ignored for plain types */
    int32_t           num_experts;              /* 0 = plain GEMM; >0 = grouped (MoE) */
} fp4d_gemm_desc;

/*
 * A plain GEMM. out is row-major [m, n] of out_type. The caller may fill out with a
 * poison pattern before the call: a backend must write every element and nothing else
 * (a backend that computes on a copy uploads the caller's out first).
 */
typedef struct fp4d_gemm_problem {
    fp4d_matrix a;        /* [m, k] */
    fp4d_matrix b;        /* [n, k] */
    float       alpha;
    fp4d_dtype  out_type;
    void       *out;      /* [m, n] */
} fp4d_gemm_problem;

/*
 * A grouped (mixture-of-experts) GEMM: rows of A are grouped by expert; expert e owns
 * rows [expert_offsets[e], expert_offsets[e+1]) of A and of out and multiplies them by
 * its own weights b[e] with its own alpha[e]. Experts with no rows are allowed.
 * If A is block-scaled, its scales form ONE [total_rows, K/block] scale matrix in
 * a.scale_layout (not per-expert padded).
 */
typedef struct fp4d_grouped_gemm_problem {
    int32_t            num_experts;
    const int64_t     *expert_offsets; /* num_experts + 1 entries, non-decreasing, [0] = 0 */
    fp4d_matrix        a;              /* [expert_offsets[num_experts], k] */
    const fp4d_matrix *b;              /* num_experts matrices, each [n, k], same dtype/layout */
    const float       *alpha;          /* num_experts values */
    fp4d_dtype         out_type;
    void              *out;            /* [total_rows, n] */
} fp4d_grouped_gemm_problem;

/* Fills desc from a problem. */
void fp4d_gemm_describe(const fp4d_gemm_problem *p, fp4d_gemm_desc *desc);
void fp4d_grouped_gemm_describe(const fp4d_grouped_gemm_problem *p, fp4d_gemm_desc *desc);

/*
 * Checks that a problem is well formed (types allowed, K a multiple of the block size,
 * matching K, non-NULL buffers, sane offsets). Returns INVALID_ARG with fp4d_last_error()
 * explaining what is wrong.
 */
fp4d_status fp4d_gemm_validate(const fp4d_gemm_problem *p);
fp4d_status fp4d_grouped_gemm_validate(const fp4d_grouped_gemm_problem *p);

/* Bytes of one output element (4 or 2). */
size_t fp4d_out_elem_size(fp4d_dtype out_type);

#ifdef __cplusplus
}
#endif
#endif
