/*
 * The error model (docs/tolerance.md).
 *
 * A correct FP4 GEMM backend computes out = RN_out(alpha * sum_k a_k b_k) with an f32
 * accumulator in SOME order. Every product a_k*b_k of two decoded FP4 values (or of a
 * bf16/f16 activation and a decoded FP4 weight) is exact in f32, so the only errors are
 * the K-1 additions, the alpha multiply and the final rounding into the output type.
 * The classic bound for recursive (any order) summation (Higham, "Accuracy and Stability
 * of Numerical Algorithms", §4.2) gives, with u = 2^-24 and S = |alpha| * sum |a_k b_k|:
 *
 *     |acc*alpha - exact| <= gamma_{K+1} * S,     gamma_n = n*u / (1 - n*u)
 *
 * and the output rounding adds u_out * (|exact| + gamma*S) (u_out = 2^-24, 2^-8, 2^-11 for
 * f32, bf16, f16) plus half a subnormal of the output type. Anything inside is PASS.
 *
 * The practical tolerance (INACCURATE vs WRONG) is 1% of S plus two output ulps: the
 * same scale as TransformerEngine's exact-NVFP4 GEMM test (atol = rtol = 8e-3) and far
 * tighter than flashinfer's fuzzer (which compares against unquantized inputs). Every
 * decoding mistake the doctor knows (scale layout, nibble order, scale codec, global
 * scale) moves elements by O(S) and lands well outside it; bf16 accumulation lands
 * around it (INACCURATE or WRONG, both are accepted for it).
 */
#include <math.h>
#include <stdlib.h>

#include "doctor_internal.h"
#include "env_knob.h"

#define FP4D_PRACTICAL_REL 1e-2

fp4d_tolerance fp4d_tolerance_for(int64_t k, fp4d_dtype out_type)
{
    fp4d_tolerance t;
    const double u = 0x1p-24;
    double n = (double)(k + 1);
    t.gamma = n * u / (1.0 - n * u);
    switch (out_type) {
    case FP4D_DTYPE_BF16: t.u_out = 0x1p-8; t.tiny_out = 0x1p-134; break;
    case FP4D_DTYPE_F16:  t.u_out = 0x1p-11; t.tiny_out = 0x1p-25; break;
    default:              t.u_out = 0x1p-24; t.tiny_out = 0x1p-150; break;
    }
    /* Products that underflow f32 in the accumulator: at most half a subnormal each. */
    t.tiny_out += n * 0x1p-150;
    t.practical = FP4D_PRACTICAL_REL;
    return t;
}

double fp4d_bound_fp32(const fp4d_tolerance *t, double v, double s)
{
    return t->gamma * s + t->u_out * (fabs(v) + t->gamma * s) + t->tiny_out;
}

double fp4d_bound_practical(const fp4d_tolerance *t, double v, double s)
{
    return t->practical * s + 2.0 * t->u_out * fabs(v) + t->tiny_out;
}

double fp4d_out_round(fp4d_dtype out_type, double v)
{
    float f = (float)v;
    if (out_type == FP4D_DTYPE_F32) return f;
    uint16_t h;
    fp4d_from_f32(out_type, &f, 1, &h);
    fp4d_to_f32(out_type, &h, 1, &f);
    return f;
}

double fp4d_timeout_scale(void)
{
    /* "0", "-1", "abc" and "2x" meant 1 (or 2) in silence before; a limit of 10^6 times the
     * default is past any sanitizer's slowdown and keeps deadlines finite */
    return fp4d_env_positive("FP4DOCTOR_TIMEOUT_SCALE", 1e6, 1.0);
}

double fp4d_case_call_timeout(const fp4d_case *c, fp4d_backend_kind kind, bool needs_device,
                              bool first_in_child)
{
    /* Two calls (the run and the rerun) at a pessimistic speed: 20 M multiply-adds per
     * second for the exact reference, 100 M for everything else, with a 4x margin and a
     * floor of one second; a device backend's first case in a child gets 30 s more for
     * context creation and kernel selection. */
    double macs = (double)c->m * (double)(c->n > 0 ? c->n : 16) * (double)c->k;
    /* Plugins get the reference's slow rate too: an outsider's first kernel is often a
     * naive loop (examples/plugin decodes per multiply-add) built without -O2, and a slow
     * but correct kernel called a hang would be a wrong verdict. Measured: the example
     * plugin at -O0 needs ~6 s per call on 1x7168x18432, over the 1e8 limit of 11.6 s for
     * both calls. */
    double rate = kind == FP4D_BACKEND_KIND_REFERENCE || kind == FP4D_BACKEND_KIND_PLUGIN ? 2e7 : 1e8;
    /* A stress case: its batch twice alone, then rounds x threads batches on threads
     * sharing the machine, as if one after another, and each further instance opened (a
     * device backend's context and kernel selection again). */
    double calls = 2.0;
    if (c->op == FP4D_CASE_STRESS) calls += (double)c->threads * (double)c->rounds;
    double t = 1.0 + 4.0 * calls * macs / rate;
    if (needs_device && first_in_child) t += 30.0;
    if (needs_device && c->op == FP4D_CASE_STRESS) t += 30.0 * c->threads;
    return t * fp4d_timeout_scale();
}
