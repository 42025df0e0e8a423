/*
 * Helpers shared by the backend tests: random operands built from random codes and scale
 * bytes (independent of the quantizer), their exact dequantized values, and the
 * f32-accumulation error bound that an honest backend must meet.
 */
#ifndef FP4D_TEST_BACKEND_UTIL_H
#define FP4D_TEST_BACKEND_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fp4doctor/backend.h"
#include "fp4doctor/formats.h"
#include "fp4doctor/ref.h"

typedef struct tb_rng {
    uint64_t s;
} tb_rng;

static inline uint64_t tb_next(tb_rng *r)
{
    r->s ^= r->s >> 12, r->s ^= r->s << 25, r->s ^= r->s >> 27;
    return r->s * 0x2545F4914F6CDD1DULL;
}

/* Uniform in [-1, 1) with full f32 precision. */
static inline float tb_uniform(tb_rng *r) { return (float)((double)(tb_next(r) >> 11) * 0x1p-52 - 1.0); }

typedef struct tb_operand {
    fp4d_matrix m;
    void       *data;
    uint8_t    *scales;
    double     *exact; /* [rows, k]: the decoded value of every element (no tensor scale) */
} tb_operand;

static inline void tb_operand_free(tb_operand *o)
{
    free(o->data), free(o->scales), free(o->exact);
    memset(o, 0, sizeof *o);
}

/*
 * A random operand. FP4: random codes, block-scale bytes drawn from a moderate range
 * (e4m3 0x28..0x47 = 0.25..3.5, ue8m0 2^-3..2^3) and placed with fp4d_scale_offset so
 * that every layout holds the same logical scales. Plain types: random values rounded
 * into the type.
 */
static inline void tb_operand_make(tb_operand *o, fp4d_dtype t, fp4d_scale_layout l, int64_t rows, int64_t k,
                                   tb_rng *rng)
{
    const fp4d_dtype_traits *tr = fp4d_dtype_get(t);
    memset(o, 0, sizeof *o);
    o->m.dtype        = t;
    o->m.rows         = rows;
    o->m.cols         = k;
    o->m.scale_layout = l;
    o->data           = malloc(fp4d_dtype_data_bytes(t, rows, k) + 1);
    o->exact          = malloc((size_t)(rows * k) * sizeof(double) + 1);
    if (tr->is_block_fp4) {
        int64_t  sc    = k / tr->block_size;
        size_t   sz    = fp4d_scale_buffer_size(l, rows, sc);
        uint8_t *codes = o->data;
        o->scales      = calloc(sz + 1, 1);
        for (int64_t i = 0; i < rows * k / 2; i++) codes[i] = (uint8_t)tb_next(rng);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < sc; c++) {
                uint8_t b = t == FP4D_DTYPE_NVFP4 ? (uint8_t)(0x28 + tb_next(rng) % 32)
                                                  : (uint8_t)(124 + tb_next(rng) % 7);
                o->scales[fp4d_scale_offset(l, rows, sc, r, c)] = b;
            }
        static const double e2m1[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};
        for (int64_t r = 0; r < rows; r++)
            for (int64_t kk = 0; kk < k; kk++) {
                uint8_t byte = codes[(r * k + kk) / 2];
                uint8_t code = (kk % 2 == 0) ? (byte & 0xF) : (byte >> 4);
                uint8_t sb   = o->scales[fp4d_scale_offset(l, rows, sc, r, kk / tr->block_size)];
                double  s    = t == FP4D_DTYPE_NVFP4 ? (double)fp4d_e4m3_to_f32(sb) : ldexp(1.0, (int)sb - 127);
                o->exact[r * k + kk] = e2m1[code] * s;
            }
        o->m.scales = o->scales;
    } else {
        float *tmp = malloc((size_t)(rows * k) * sizeof(float));
        for (int64_t i = 0; i < rows * k; i++) tmp[i] = 4.0f * tb_uniform(rng);
        fp4d_from_f32(t, tmp, (size_t)(rows * k), o->data);
        fp4d_to_f32(t, o->data, (size_t)(rows * k), tmp);
        for (int64_t i = 0; i < rows * k; i++) o->exact[i] = tmp[i];
        free(tmp);
    }
    o->m.data = o->data;
}

static inline double tb_out_get(fp4d_dtype t, const void *out, int64_t i)
{
    switch (t) {
    case FP4D_DTYPE_F32: return ((const float *)out)[i];
    case FP4D_DTYPE_BF16: return fp4d_bf16_to_f32(((const uint16_t *)out)[i]);
    default: return fp4d_f16_to_f32(((const uint16_t *)out)[i]);
    }
}

/* Half a unit in the last place of x in type t (subnormal spacing at the bottom). */
static inline double tb_half_ulp(fp4d_dtype t, double x)
{
    int    mant = t == FP4D_DTYPE_F32 ? 24 : t == FP4D_DTYPE_BF16 ? 8 : 11;
    int    emin = t == FP4D_DTYPE_F16 ? -14 : -126;
    int    e;
    double ax = fabs(x);
    frexp(ax, &e);
    if (ax == 0.0 || e - 1 < emin) e = emin + 1;
    return ldexp(1.0, e - mant) * 0.5;
}

/*
 * The f32-accumulation bound for one output element:
 *   |got - exact| <= gamma_K * sum_k |a_k b_k| * |alpha| + half-ulp_f32 + half-ulp_out
 * (the f32 half-ulp covers rounding alpha * sum in f32 before the narrowing to out).
 * Returns true when got is within it; *excess gets |err| / bound.
 */
static inline bool tb_within_bound(fp4d_dtype out_type, double got, double exact, double abs_sum, double alpha,
                                   int64_t k, double *ratio)
{
    const double u     = ldexp(1.0, -24);
    const double gamma = (double)k * u / (1.0 - (double)k * u);
    double       big   = fmax(fabs(exact), fabs(got));
    double       bound = gamma * abs_sum * fabs(alpha) + tb_half_ulp(FP4D_DTYPE_F32, big) + tb_half_ulp(out_type, big);
    double       err   = fabs(got - exact);
    if (ratio) *ratio = bound > 0 ? err / bound : (err > 0 ? INFINITY : 0);
    return err <= bound;
}

/* exact dot product (double; the error of double is far below the f32 bound) and sum|ab| */
static inline void tb_dot(const double *a, const double *b, int64_t k, double *dot, double *abs_sum)
{
    double d = 0, s = 0;
    for (int64_t i = 0; i < k; i++) {
        d += a[i] * b[i];
        s += fabs(a[i] * b[i]);
    }
    *dot = d, *abs_sum = s;
}

#endif
