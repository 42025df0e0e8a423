/*
 * ref.h - the exact reference (DESIGN.md §4).
 *
 * Every output element is the exact real value alpha * sum_k A^[m,k] * B^[n,k], rounded
 * ONCE to nearest-even into the output type. Products of e2m1 * e4m3 * e2m1 * e4m3 (and of
 * f32/bf16/f16 activations with e2m1 * scale) are dyadic rationals, so the sum is
 * accumulated exactly (wide fixed point) rather than in floating point. NaN or Inf in a
 * decoded operand propagate as IEEE arithmetic would.
 */
#ifndef FP4DOCTOR_REF_H
#define FP4DOCTOR_REF_H

#include "gemm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The whole output. Validates the problem first. */
fp4d_status fp4d_ref_gemm(const fp4d_gemm_problem *p);
fp4d_status fp4d_ref_grouped_gemm(const fp4d_grouped_gemm_problem *p);

/*
 * One output element, rounded once from the exact value into p->out_type and stored in
 * *out_elem (4 or 2 bytes). Lets the doctor check a random sample of a large output
 * exactly; p->out is not touched. exact_f64 (may be NULL) receives the exact value
 * rounded to double, for error measurement. Does not re-validate the problem.
 */
fp4d_status fp4d_ref_gemm_element(const fp4d_gemm_problem *p, int64_t m, int64_t n,
                                  void *out_elem, double *exact_f64);

#ifdef __cplusplus
}
#endif
#endif
