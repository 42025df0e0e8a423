/*
 * A case's operands, made deterministically from (seed, case name): the parent, every
 * child and every rerun see the same bytes without shipping data between processes.
 * Also decoding an operand row, optionally under a known mistake (for cause matching).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "doctor_internal.h"
#include "internal.h"

/* ---- splitmix64 ---- */

uint64_t fp4d_rng_next(fp4d_rng *r)
{
    uint64_t z = (r->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double fp4d_rng_uniform(fp4d_rng *r) { return (double)(fp4d_rng_next(r) >> 11) * 0x1p-53; }

double fp4d_rng_gaussian(fp4d_rng *r)
{
    /* Box-Muller; one value per call keeps the stream position simple. */
    double u1 = fp4d_rng_uniform(r), u2 = fp4d_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

fp4d_rng fp4d_rng_for(uint64_t seed, const char *name, uint64_t stream)
{
    uint64_t h = 0xcbf29ce484222325ull ^ seed;
    for (const char *p = name; p && *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    fp4d_rng r = {h ^ (stream * 0xd1b54a32d192ed03ull)};
    fp4d_rng_next(&r);
    return r;
}

/* ---- input values ---- */

/* Fills dst[rows*cols] with f32 values of the given kind. scale shrinks weights. */
static void fill_values(fp4d_rng *r, fp4d_input_kind kind, float *dst, int64_t rows, int64_t cols,
                        double scale)
{
    const int64_t block = 16;
    for (int64_t i = 0; i < rows; i++) {
        for (int64_t j = 0; j < cols; j++) {
            double g = fp4d_rng_gaussian(r);
            double x = g;
            int64_t blk = (i * cols + j) / block;
            switch (kind) {
            case FP4D_INPUT_HEAVY_TAILED: {
                /* Log-normal magnitudes and rare 100x outliers: the blocks that hold an
                 * outlier get large scales and flush their small neighbours to zero. */
                x = g * exp(0.75 * fp4d_rng_gaussian(r));
                if (fp4d_rng_uniform(r) < 0.004) x *= 100.0;
                break;
            }
            case FP4D_INPUT_ZERO_BLOCKS:
                if (blk % 3 == 1) x = 0.0;
                break;
            case FP4D_INPUT_ALL_ZERO: x = 0.0; break;
            case FP4D_INPUT_UNDERFLOW:
                /* A quarter of the blocks are 1e-6 of the rest: their e4m3 block scale
                 * (amax_b/6 * 2688/amax) falls below 2^-10 and rounds to zero. */
                if (blk % 4 == 2) x *= 1e-6;
                break;
            case FP4D_INPUT_NONFINITE: {
                double u = fp4d_rng_uniform(r);
                if (u < 0.01) x = NAN;
                else if (u < 0.015) x = INFINITY;
                else if (u < 0.02) x = -INFINITY;
                break;
            }
            default: break;
            }
            dst[i * cols + j] = (float)(x * scale);
        }
    }
}

static void operand_free(fp4d_operand *op)
{
    free(op->data);
    free(op->scales);
    free(op->canon_scales);
    memset(op, 0, sizeof *op);
}

/* Allocates the scale buffers of an FP4 operand and fills mat/canon. */
static fp4d_status operand_alloc_fp4(fp4d_operand *op, fp4d_dtype fmt, fp4d_scale_layout layout,
                                     int64_t rows, int64_t cols)
{
    const fp4d_dtype_traits *t = fp4d_dtype_get(fmt);
    int64_t sc = cols / t->block_size;
    op->data_bytes = fp4d_dtype_data_bytes(fmt, rows, cols);
    op->scales_bytes = fp4d_scale_buffer_size(layout, rows, sc);
    size_t canon_bytes = fp4d_scale_buffer_size(FP4D_LAYOUT_LINEAR, rows, sc);
    op->data = malloc(op->data_bytes ? op->data_bytes : 1);
    op->scales = calloc(op->scales_bytes ? op->scales_bytes : 1, 1);
    op->canon_scales = calloc(canon_bytes ? canon_bytes : 1, 1);
    FP4D_RETURN_ERROR_IF(!op->data || !op->scales || !op->canon_scales, NOMEM,
                         "out of memory for a %lldx%lld operand", (long long)rows, (long long)cols);
    fp4d_matrix m = {fmt, rows, cols, op->data, op->scales, layout};
    op->mat = m;
    op->canon = m;
    op->canon.scales = op->canon_scales;
    op->canon.scale_layout = FP4D_LAYOUT_LINEAR;
    op->decode_scale = 1.0;
    return FP4D_STATUS_OK;
}

/* Random codes and block scales: values exactly on the FP4 grid, scales in a range where
 * every decoding mistake (ue8m0, 1/alpha, ...) changes the result visibly but nothing
 * overflows. */
static fp4d_status make_fp4_grid(fp4d_operand *op, fp4d_rng *r, fp4d_dtype fmt,
                                 fp4d_scale_layout layout, int64_t rows, int64_t cols)
{
    FP4D_FORWARD_IF_ERROR(operand_alloc_fp4(op, fmt, layout, rows, cols));
    uint8_t *codes = op->data;
    for (size_t i = 0; i < op->data_bytes; i++) codes[i] = (uint8_t)fp4d_rng_next(r);
    const fp4d_dtype_traits *t = fp4d_dtype_get(fmt);
    int64_t sc = cols / t->block_size;
    for (int64_t i = 0; i < rows * sc; i++) {
        uint64_t u = fp4d_rng_next(r);
        op->canon_scales[i] = fmt == FP4D_DTYPE_NVFP4 ? (uint8_t)(0x50 + u % (0x7E - 0x50 + 1))
                                                      : (uint8_t)(120 + u % 15);
    }
    fp4d_scales_convert(FP4D_LAYOUT_LINEAR, op->canon_scales, layout, op->scales, rows, sc);
    /* A decode scale that is neither 1 nor a power of two: a kernel that drops or inverts
     * it is visibly wrong. */
    op->decode_scale = fmt == FP4D_DTYPE_NVFP4 ? 0x1p-7 * (1.0 + 0.37 * fp4d_rng_uniform(r)) : 1.0;
    return FP4D_STATUS_OK;
}

/* f32 values quantized by the library's reference quantizer (default convention). */
static fp4d_status make_fp4_quantized(fp4d_operand *op, fp4d_rng *r, fp4d_dtype fmt,
                                      fp4d_scale_layout layout, fp4d_input_kind kind, int64_t rows,
                                      int64_t cols, double scale)
{
    FP4D_FORWARD_IF_ERROR(operand_alloc_fp4(op, fmt, layout, rows, cols));
    float *src = malloc((size_t)(rows * cols) * sizeof *src + 1);
    FP4D_RETURN_ERROR_IF(!src, NOMEM, "out of memory for inputs");
    fill_values(r, kind, src, rows, cols, scale);
    fp4d_quantize_params qp = {fmt, FP4D_CONV_FLASHINFER_EXACT, FP4D_LAYOUT_LINEAR, 0.0f};
    if (kind == FP4D_INPUT_SATURATING && fmt == FP4D_DTYPE_NVFP4) {
        /* A static (calibrated) global scale 8x too large: blocks near the tensor's amax
         * want scales up to 8*448 and saturate at 448, their codes clip at +-6. */
        float amax = 0.0f;
        for (int64_t i = 0; i < rows * cols; i++) amax = fmaxf(amax, fabsf(src[i]));
        qp.encode_scale = amax > 0.0f ? 2688.0f / (amax / 8.0f) : 1.0f;
    }
    fp4d_quantize_result res = {0};
    fp4d_status st = fp4d_quantize(&qp, FP4D_DTYPE_F32, src, rows, cols, op->data,
                                   op->canon_scales, &res);
    free(src);
    FP4D_FORWARD_IF_ERROR(st);
    const fp4d_dtype_traits *t = fp4d_dtype_get(fmt);
    fp4d_scales_convert(FP4D_LAYOUT_LINEAR, op->canon_scales, layout, op->scales, rows,
                        cols / t->block_size);
    double gd = fmt == FP4D_DTYPE_NVFP4 ? (double)res.decode_scale : 1.0;
    /* An all-zero tensor has no meaningful per-tensor scale (0 or NaN by convention):
     * use 1 so that alpha stays a finite non-zero number. */
    op->decode_scale = (isfinite(gd) && gd > 0.0) ? gd : 1.0;
    return FP4D_STATUS_OK;
}

/* Plain activations (bf16/f16/f32): on-grid values or distributions, rounded to dtype. */
static fp4d_status make_plain(fp4d_operand *op, fp4d_rng *r, fp4d_dtype dt, fp4d_input_kind kind,
                              int64_t rows, int64_t cols)
{
    size_t n = (size_t)(rows * cols);
    float *src = malloc(n * sizeof *src + 1);
    FP4D_RETURN_ERROR_IF(!src, NOMEM, "out of memory for inputs");
    if (kind == FP4D_INPUT_GRID) {
        for (size_t i = 0; i < n; i++) {
            uint64_t u = fp4d_rng_next(r);
            src[i] = fp4d_e2m1_to_f32((uint8_t)(u & 15)) * ldexpf(1.0f, (int)((u >> 8) % 5) - 2);
        }
    } else {
        fill_values(r, kind, src, rows, cols, 1.0);
    }
    op->data_bytes = fp4d_dtype_data_bytes(dt, rows, cols);
    op->data = malloc(op->data_bytes + 1);
    if (!op->data) {
        free(src);
        return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory for inputs");
    }
    fp4d_from_f32(dt, src, n, op->data);
    free(src);
    fp4d_matrix m = {dt, rows, cols, op->data, NULL, FP4D_LAYOUT_LINEAR};
    op->mat = m;
    op->canon = m;
    op->decode_scale = 1.0;
    return FP4D_STATUS_OK;
}

static fp4d_status make_operand(fp4d_operand *op, uint64_t seed, const fp4d_case *c, uint64_t stream,
                                fp4d_dtype dt, fp4d_scale_layout layout, fp4d_input_kind kind,
                                int64_t rows, int64_t cols, bool is_weight)
{
    fp4d_rng r = fp4d_rng_for(seed, c->name, stream);
    const fp4d_dtype_traits *t = fp4d_dtype_get(dt);
    FP4D_RETURN_ERROR_IF(!t, INVALID_ARG, "case %s: bad dtype", c->name);
    /* Weights never get the activation-only kinds (all-zero A, underflowing activations):
     * one pathological operand per case keeps the failure attributable. Very large
     * operands are made on the grid: quantizing 132M floats would dominate the run. */
    fp4d_input_kind k = kind;
    if (is_weight && (k == FP4D_INPUT_ALL_ZERO || k == FP4D_INPUT_UNDERFLOW || k == FP4D_INPUT_SATURATING))
        k = FP4D_INPUT_GAUSSIAN;
    if (is_weight && rows * cols > (int64_t)1 << 22) k = FP4D_INPUT_GRID;
    if (!t->is_block_fp4) return make_plain(op, &r, dt, k, rows, cols);
    if (k == FP4D_INPUT_GRID) return make_fp4_grid(op, &r, dt, layout, rows, cols);
    return make_fp4_quantized(op, &r, dt, layout, k, rows, cols, is_weight ? 0.02 : 1.0);
}

void fp4d_case_data_free(fp4d_case_data *d)
{
    if (!d) return;
    operand_free(&d->a);
    for (int32_t e = 0; d->b && e < d->num_b; e++) operand_free(&d->b[e]);
    free(d->b);
    free(d->alpha);
    free(d->offsets);
    free(d->src);
    memset(d, 0, sizeof *d);
}

/* Uneven expert loads with empty experts, summing exactly to total. */
static void moe_offsets(int32_t experts, int64_t total, int64_t *off)
{
    int64_t w[1024], sum = 0;
    int32_t heavy = 0;
    for (int32_t e = 0; e < experts && e < 1024; e++) {
        w[e] = (e % 3 == 1) ? 0 : 1 + (int64_t)((e * 7 + 3) % 11);
        sum += w[e];
        if (w[e] > w[heavy]) heavy = e;
    }
    int64_t used = 0;
    for (int32_t e = 0; e < experts; e++) {
        int64_t rows = sum ? total * w[e] / sum : 0;
        off[e] = used;
        used += rows;
    }
    off[experts] = used;
    /* The rounding remainder goes to the heaviest expert. */
    int64_t rest = total - used;
    for (int32_t e = heavy + 1; e <= experts; e++) off[e] += rest;
}

fp4d_status fp4d_case_data_make(const fp4d_case *c, uint64_t seed, fp4d_case_data *d)
{
    memset(d, 0, sizeof *d);
    d->c = c;
    fp4d_status st = FP4D_STATUS_OK;
    if (c->op == FP4D_CASE_QUANTIZE) {
        size_t n = (size_t)(c->m * c->k);
        d->src = malloc(n * sizeof *d->src + 1);
        FP4D_RETURN_ERROR_IF(!d->src, NOMEM, "out of memory for inputs");
        fp4d_rng r = fp4d_rng_for(seed, c->name, 1);
        fill_values(&r, c->input, d->src, c->m, c->k, 1.0);
        if (c->input == FP4D_INPUT_SATURATING && c->b_type == FP4D_DTYPE_NVFP4) {
            float amax = 0.0f;
            for (size_t i = 0; i < n; i++) amax = fmaxf(amax, fabsf(d->src[i]));
            d->static_encode_scale = amax > 0.0f ? 2688.0f / (amax / 8.0f) : 1.0f;
        }
        return FP4D_STATUS_OK;
    }
    int32_t nb = c->op == FP4D_CASE_GROUPED ? c->num_experts : 1;
    d->num_b = nb;
    d->b = calloc((size_t)nb, sizeof *d->b);
    d->alpha = calloc((size_t)nb, sizeof *d->alpha);
    d->offsets = calloc((size_t)nb + 1, sizeof *d->offsets);
    if (!d->b || !d->alpha || !d->offsets) {
        fp4d_case_data_free(d);
        return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory for inputs");
    }
    st = make_operand(&d->a, seed, c, 1, c->a_type, c->a_layout, c->input, c->m, c->k, false);
    for (int32_t e = 0; st == FP4D_STATUS_OK && e < nb; e++)
        st = make_operand(&d->b[e], seed, c, 100 + (uint64_t)e, c->b_type, c->b_layout,
                          c->input, c->n, c->k, true);
    if (st != FP4D_STATUS_OK) {
        fp4d_case_data_free(d);
        return st;
    }
    for (int32_t e = 0; e < nb; e++)
        d->alpha[e] = (float)(d->a.decode_scale * d->b[e].decode_scale);
    if (c->op == FP4D_CASE_GROUPED) moe_offsets(nb, c->m, d->offsets);
    else d->offsets[0] = 0, d->offsets[1] = c->m;
    return FP4D_STATUS_OK;
}

int32_t fp4d_case_expert_of_row(const fp4d_case_data *d, int64_t m)
{
    for (int32_t e = 0; e < d->num_b; e++)
        if (m < d->offsets[e + 1]) return e;
    return d->num_b - 1;
}

fp4d_gemm_problem fp4d_case_gemm_problem(const fp4d_case_data *d)
{
    return (fp4d_gemm_problem){.a = d->a.mat, .b = d->b[0].mat, .alpha = d->alpha[0], .out_type = d->c->out_type};
}

fp4d_grouped_gemm_problem fp4d_case_grouped_problem(const fp4d_case_data *d, fp4d_matrix *experts)
{
    for (int32_t e = 0; e < d->num_b; e++) experts[e] = d->b[e].mat;
    return (fp4d_grouped_gemm_problem){.num_experts = d->num_b, .expert_offsets = d->offsets, .a = d->a.mat,
                                       .b = experts, .alpha = d->alpha, .out_type = d->c->out_type};
}

void fp4d_case_canon_problem(const fp4d_case_data *d, int32_t e, fp4d_gemm_problem *p,
                             int64_t *row0, int64_t *rows)
{
    const fp4d_matrix *a = &d->a.canon;
    int64_t r0 = d->offsets[e], nr = d->offsets[e + 1] - d->offsets[e];
    memset(p, 0, sizeof *p);
    p->a = *a;
    p->a.rows = nr;
    const fp4d_dtype_traits *t = fp4d_dtype_get(a->dtype);
    p->a.data = (const uint8_t *)a->data + fp4d_dtype_data_bytes(a->dtype, r0, a->cols);
    if (t->is_block_fp4) p->a.scales = a->scales + (size_t)(r0 * (a->cols / t->block_size));
    p->b = d->b[e].canon;
    p->alpha = d->alpha[e];
    p->out_type = d->c->out_type;
    *row0 = r0;
    *rows = nr;
}

/* ---- decoding with mistakes ---- */

static double ue8m0_value(uint8_t b) { return b == 0xFF ? NAN : ldexp(1.0, (int)b - 127); }

void fp4d_operand_decode_row(const fp4d_operand *op, int64_t r, const fp4d_mistake *mk, double *dst)
{
    static const fp4d_mistake none = {0};
    if (!mk) mk = &none;
    const fp4d_matrix *x = &op->mat;
    const fp4d_dtype_traits *t = fp4d_dtype_get(x->dtype);
    int64_t rows = x->rows, K = x->cols;
    if (!t->is_block_fp4) {
        float tmp[256];
        for (int64_t k0 = 0; k0 < K; k0 += 256) {
            int64_t nk = K - k0 < 256 ? K - k0 : 256;
            int64_t idx = r * K + k0;
            if (mk->transposed) { /* element (r, k) read from flat position k*rows + r */
                for (int64_t j = 0; j < nk; j++) {
                    float v;
                    fp4d_to_f32(x->dtype, (const uint8_t *)x->data + (size_t)((k0 + j) * rows + r) * (t->element_bits / 8), 1, &v);
                    dst[k0 + j] = v;
                }
                continue;
            }
            fp4d_to_f32(x->dtype, (const uint8_t *)x->data + (size_t)idx * (t->element_bits / 8), (size_t)nk, tmp);
            for (int64_t j = 0; j < nk; j++) dst[k0 + j] = tmp[j];
        }
        return;
    }
    const uint8_t *codes = x->data;
    int64_t bs = t->block_size;
    int64_t sc_true = K / bs;
    bool use32 = mk->block32 && x->dtype == FP4D_DTYPE_NVFP4 && (K % 32 == 0 || mk->block32_stride16);
    int64_t bs_used = use32 ? 32 : bs;
    int64_t sc_used = use32 && mk->block32_stride16 ? sc_true : K / bs_used;
    fp4d_scale_layout lay = x->scale_layout;
    if (mk->misread_layout)
        lay = lay == FP4D_LAYOUT_LINEAR ? FP4D_LAYOUT_SWIZZLED_128X4 : FP4D_LAYOUT_LINEAR;
    size_t buf = op->scales_bytes;
    bool plain = !mk->transposed && !mk->nibble_swap && !mk->ue8m0_scales && !use32 && !mk->misread_layout;
    if (plain) {
        /* The hot path (projection check over all of B): one scale lookup per block. */
        float lut[16];
        for (int i = 0; i < 16; i++) lut[i] = fp4d_e2m1_to_f32((uint8_t)i);
        const uint8_t *rowc = codes + (size_t)(r * K / 2);
        for (int64_t blk = 0; blk < sc_true; blk++) {
            size_t off = fp4d_scale_offset(lay, rows, sc_true, r, blk);
            double s = off < buf ? (double)t->scale_to_f32(x->scales[off]) : 0.0;
            for (int64_t k = blk * bs; k < (blk + 1) * bs; k += 2) {
                uint8_t byte = rowc[k >> 1];
                dst[k] = (double)lut[byte & 15] * s;
                dst[k + 1] = (double)lut[byte >> 4] * s;
            }
        }
        return;
    }
    for (int64_t k = 0; k < K; k++) {
        int64_t idx = mk->transposed ? k * rows + r : r * K + k;
        int64_t rr = idx / K, kk = idx % K;
        uint8_t byte = codes[idx >> 1];
        int odd = (int)(idx & 1);
        if (mk->nibble_swap) odd ^= 1;
        uint8_t code = odd ? (uint8_t)(byte >> 4) : (uint8_t)(byte & 15);
        size_t off = mk->transposed && mk->transposed_codes_only
                         ? fp4d_scale_offset(lay, rows, sc_used, r, k / bs_used)
                         : fp4d_scale_offset(lay, rows, sc_used, rr, kk / bs_used);
        uint8_t sb = off < buf ? x->scales[off] : 0;
        double s = mk->ue8m0_scales ? ue8m0_value(sb) : (double)t->scale_to_f32(sb);
        dst[k] = (double)fp4d_e2m1_to_f32(code) * s;
    }
}
