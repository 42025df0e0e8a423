/*
 * Judging one case on one backend, in this process (doctor.h: fp4d_doctor_run_case).
 *
 * GEMM: the output buffer is filled with a NaN of a distinctive payload (a backend that
 * writes a real NaN writes a different one) and framed by sentinel bytes; the backend runs
 * twice on identical inputs; then, on the first output: sentinels (OOB_WRITE), poison left
 * (UNWRITTEN), NaN/Inf, all zeros, the exact reference on a random sample of elements (all
 * of them for small outputs) and a projection check of the whole output (C·t against
 * alpha·A·(B·t) in double). docs/tolerance.md has the error model.
 * Quantize: bit-exact comparison against the library's quantizer under the same
 * convention, with codes one step away counted separately.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "doctor_internal.h"
#include "fp4doctor/ref.h"
#include "clock.h"
#include "internal.h"
#include "out_elem.h"

#define GUARD_BYTES 4096
/* Sentinels cover at least a whole extra copy of the buffer (up to 16 MiB): the common
 * overrun is one row too many (an off-by-one tile bound), and on LLM shapes one bf16 row
 * is 8..36 KB; a 4 KB guard let such a write corrupt the heap, which showed up as CRASH
 * (glibc abort) instead of OOB_WRITE. */
#define GUARD_EXTRA_MAX ((size_t)16 << 20)
#define SAMPLE_ALL_BELOW 4096  /* outputs up to this many elements are checked in full */
#define SAMPLE_COUNT 1024
#define CAUSE_SAMPLES 160
#define RERUN_REF_MAX_MACS 16e6

/* Poison: quiet NaNs with payloads no arithmetic produces (hardware and libm return the
 * canonical 0x7FC00000 / 0xFFC00000 or propagate an input's payload). */
static const uint32_t POISON_F32 = 0x7FC0DEADu;
static const uint16_t POISON_16 = 0x7FDBu; /* bf16: quiet NaN, payload 0x5B; f16: also NaN */

static fp4d_call_hook call_hook;
static void *call_hook_user;

void fp4d_doctor_set_call_hook(fp4d_call_hook hook, void *user)
{
    call_hook = hook;
    call_hook_user = user;
}

void fp4d_doctor_call_hook_fire(void)
{
    if (call_hook) call_hook(call_hook_user);
}

static uint8_t guard_byte(size_t i) { return (uint8_t)(0xA5u ^ (i * 29u)); }

/* Bytes of sentinel on each side of a buffer of `bytes`. */
size_t fp4d_guard_size(size_t bytes) { return GUARD_BYTES + (bytes < GUARD_EXTRA_MAX ? bytes : GUARD_EXTRA_MAX); }

/* A buffer of `bytes` framed by fp4d_guard_size(bytes) of sentinel on both sides; the buffer
 * itself starts at raw + fp4d_guard_size(bytes). */
uint8_t *fp4d_guarded_alloc(size_t bytes)
{
    size_t g = fp4d_guard_size(bytes);
    uint8_t *raw = malloc(bytes + 2 * g);
    if (!raw) return NULL;
    for (size_t i = 0; i < g; i++) {
        raw[i] = guard_byte(i);
        raw[g + bytes + i] = guard_byte(i + 7);
    }
    return raw;
}

/* Returns the number of changed sentinel bytes; *first_after is the offset past the end of
 * the first changed byte after the buffer (or -1), *before the count before it. */
int64_t fp4d_guard_check(const uint8_t *raw, size_t bytes, int64_t *first_after, int64_t *before)
{
    int64_t changed = 0;
    size_t g = fp4d_guard_size(bytes);
    *first_after = -1;
    *before = 0;
    for (size_t i = 0; i < g; i++) {
        if (raw[i] != guard_byte(i)) changed++, (*before)++;
        if (raw[g + bytes + i] != guard_byte(i + 7)) {
            changed++;
            if (*first_after < 0) *first_after = (int64_t)i;
        }
    }
    return changed;
}

void fp4d_poison_fill(fp4d_dtype out_type, uint8_t *out, int64_t count)
{
    if (out_type == FP4D_DTYPE_F32) {
        for (int64_t i = 0; i < count; i++) memcpy(out + 4 * i, &POISON_F32, 4);
    } else {
        for (int64_t i = 0; i < count; i++) memcpy(out + 2 * i, &POISON_16, 2);
    }
}

bool fp4d_is_poison(fp4d_dtype out_type, const uint8_t *out, int64_t i)
{
    if (out_type == FP4D_DTYPE_F32) {
        uint32_t v;
        memcpy(&v, out + 4 * i, 4);
        return v == POISON_F32;
    }
    uint16_t v;
    memcpy(&v, out + 2 * i, 2);
    return v == POISON_16;
}

static void result_set(fp4d_case_result *r, fp4d_verdict v, fp4d_cause c, const char *fmt, ...)
    FP4D_PRINTF(4, 5);
static void result_set(fp4d_case_result *r, fp4d_verdict v, fp4d_cause c, const char *fmt, ...)
{
    va_list ap;
    r->verdict = v;
    r->cause = c;
    va_start(ap, fmt);
    vsnprintf(r->detail, sizeof r->detail, fmt, ap);
    va_end(ap);
}

/* ---------------------------------------------------------------------------------------
 * GEMM output analysis
 * ------------------------------------------------------------------------------------- */

typedef struct out_scan {
    int64_t poison, nan, inf, nonzero;
    int64_t nan_r0, nan_r1, nan_c0, nan_c1; /* bounding box of real NaN/Inf */
    int64_t first_bad_m, first_bad_n;
    int64_t *poison_per_row;                /* m entries */
    int64_t *nonzero_per_row;               /* m entries */
} out_scan;

static void scan_output(const fp4d_case *c, const uint8_t *out, out_scan *s)
{
    int64_t M = c->m, N = c->n;
    memset(s->poison_per_row, 0, (size_t)M * sizeof *s->poison_per_row);
    memset(s->nonzero_per_row, 0, (size_t)M * sizeof *s->nonzero_per_row);
    s->poison = s->nan = s->inf = s->nonzero = 0;
    s->nan_r0 = s->nan_c0 = INT64_MAX;
    s->nan_r1 = s->nan_c1 = -1;
    s->first_bad_m = s->first_bad_n = -1;
    for (int64_t m = 0; m < M; m++) {
        for (int64_t n = 0; n < N; n++) {
            int64_t i = m * N + n;
            if (fp4d_is_poison(c->out_type, out, i)) {
                s->poison++;
                s->poison_per_row[m]++;
                continue;
            }
            double y = fp4d_out_elem_get(c->out_type, out, i);
            if (y != 0.0) s->nonzero++, s->nonzero_per_row[m]++;
            if (isfinite(y)) continue;
            if (isnan(y)) s->nan++;
            else s->inf++;
            if (s->first_bad_m < 0) s->first_bad_m = m, s->first_bad_n = n;
            if (m < s->nan_r0) s->nan_r0 = m;
            if (m > s->nan_r1) s->nan_r1 = m;
            if (n < s->nan_c0) s->nan_c0 = n;
            if (n > s->nan_c1) s->nan_c1 = n;
        }
    }
}

typedef struct judge_ctx {
    const fp4d_case      *c;
    const fp4d_case_data *d;
    fp4d_tolerance        tol;
    fp4d_sample          *samples;
    size_t                num_samples;
    double               *row_a, *row_b;
    uint8_t              *row_flags;    /* m entries, scratch for the projection */
} judge_ctx;

/* S = |alpha| * sum |a||b| for element (m, n). */
static double element_s(judge_ctx *j, int64_t m, int64_t n)
{
    int32_t e = fp4d_case_expert_of_row(j->d, m);
    fp4d_operand_decode_row(&j->d->a, m, NULL, j->row_a);
    fp4d_operand_decode_row(&j->d->b[e], n, NULL, j->row_b);
    double s = 0.0;
    for (int64_t k = 0; k < j->c->k; k++) s += fabs(j->row_a[k] * j->row_b[k]);
    return s * fabs((double)j->d->alpha[e]);
}

/* The exact value of element (m, n) via the reference (rounded, and as double). */
static fp4d_status exact_element(judge_ctx *j, int64_t m, int64_t n, double *rounded, double *exact)
{
    int32_t e = fp4d_case_expert_of_row(j->d, m);
    fp4d_gemm_problem p;
    int64_t row0, rows;
    fp4d_case_canon_problem(j->d, e, &p, &row0, &rows);
    uint8_t elem[8] = {0};
    FP4D_FORWARD_IF_ERROR(fp4d_ref_gemm_element(&p, m - row0, n, elem, exact));
    *rounded = fp4d_out_elem_get(j->c->out_type, elem, 0);
    return FP4D_STATUS_OK;
}

/* Picks the elements checked exactly: all of a small output, else a random sample plus the
 * corners and the first/last row of every 64-row band (tile edges are where kernels go
 * wrong). */
static fp4d_status choose_samples(judge_ctx *j, uint64_t seed)
{
    int64_t M = j->c->m, N = j->c->n, total = M * N;
    size_t cap = total <= SAMPLE_ALL_BELOW ? (size_t)total : SAMPLE_COUNT + 2 * (size_t)(M / 64 + 2) + 4;
    j->samples = calloc(cap ? cap : 1, sizeof *j->samples);
    FP4D_RETURN_ERROR_IF(!j->samples, NOMEM, "out of memory for samples");
    size_t n = 0;
    if (total <= SAMPLE_ALL_BELOW) {
        for (int64_t i = 0; i < total; i++) j->samples[n].m = i / N, j->samples[n].n = i % N, n++;
    } else {
        fp4d_rng r = fp4d_rng_for(seed, j->c->name, 7);
        j->samples[n].m = 0, j->samples[n++].n = 0;
        j->samples[n].m = M - 1, j->samples[n++].n = N - 1;
        for (int64_t band = 0; band < M; band += 64) {
            j->samples[n].m = band, j->samples[n++].n = (int64_t)(fp4d_rng_next(&r) % (uint64_t)N);
            int64_t last = band + 63 < M ? band + 63 : M - 1;
            j->samples[n].m = last, j->samples[n++].n = (int64_t)(fp4d_rng_next(&r) % (uint64_t)N);
        }
        while (n < cap) {
            uint64_t i = fp4d_rng_next(&r) % (uint64_t)total;
            j->samples[n].m = (int64_t)(i / (uint64_t)N), j->samples[n++].n = (int64_t)(i % (uint64_t)N);
        }
    }
    j->num_samples = n;
    return FP4D_STATUS_OK;
}

typedef struct accuracy {
    int64_t checked, beyond_fp32, beyond_practical;
    double  max_ratio, max_abs;
    int64_t worst_m, worst_n;
    double  worst_y, worst_v;
    bool    ref_nonzero;
    /* projection */
    bool    proj_fp32_fail, proj_practical_fail;
    double  proj_max_ratio;
    int64_t proj_worst_row;
    int64_t proj_rows[4];   /* rows beyond the f32 bound, worst first (-1: none) */
    uint8_t *row_ref_nonzero; /* per row: the exact row is not all zero (projection) */
    double  proj_ratios[4];
} accuracy;

static fp4d_status check_samples(judge_ctx *j, const uint8_t *out, accuracy *acc)
{
    for (size_t i = 0; i < j->num_samples; i++) {
        fp4d_sample *s = &j->samples[i];
        double rounded, exact;
        FP4D_FORWARD_IF_ERROR(exact_element(j, s->m, s->n, &rounded, &exact));
        s->exact = exact;
        s->y = fp4d_out_elem_get(j->c->out_type, out, s->m * j->c->n + s->n);
        s->s = element_s(j, s->m, s->n);
        if (rounded != 0.0) acc->ref_nonzero = true;
        if (!isfinite(s->y) || !isfinite(exact)) continue;
        acc->checked++;
        double err = fabs(s->y - exact);
        double b1 = fp4d_bound_fp32(&j->tol, exact, s->s);
        double b2 = fp4d_bound_practical(&j->tol, exact, s->s);
        double ratio = err / b1;
        if (err > b1) acc->beyond_fp32++;
        if (err > b2) acc->beyond_practical++;
        if (err > acc->max_abs) acc->max_abs = err;
        if (ratio > acc->max_ratio) {
            acc->max_ratio = ratio;
            acc->worst_m = s->m, acc->worst_n = s->n, acc->worst_y = s->y, acc->worst_v = exact;
        }
    }
    return FP4D_STATUS_OK;
}

/* C·t against alpha·A·(B·t), per expert, in double. Catches wrong elements the sample
 * missed. Skipped when the output holds non-finite values (already a verdict). */
static fp4d_status check_projection(judge_ctx *j, const uint8_t *out, uint64_t seed, accuracy *acc)
{
    const fp4d_case *c = j->c;
    int64_t N = c->n, K = c->k;
    double *t = malloc((size_t)N * sizeof *t);
    double *w = calloc((size_t)K, sizeof *w);
    double *wabs = calloc((size_t)K, sizeof *wabs);
    double *row = malloc((size_t)K * sizeof *row);
    if (!t || !w || !wabs || !row) {
        free(t), free(w), free(wabs), free(row);
        return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory for the projection check");
    }
    fp4d_rng r = fp4d_rng_for(seed, c->name, 9);
    for (int64_t n = 0; n < N; n++) {
        double v = 0.5 + fp4d_rng_uniform(&r);
        t[n] = (fp4d_rng_next(&r) & 1) ? v : -v;
    }
    for (int32_t e = 0; e < j->d->num_b; e++) {
        int64_t r0 = j->d->offsets[e], r1 = j->d->offsets[e + 1];
        if (r1 <= r0) continue;
        memset(w, 0, (size_t)K * sizeof *w);
        memset(wabs, 0, (size_t)K * sizeof *wabs);
        for (int64_t n = 0; n < N; n++) {
            fp4d_operand_decode_row(&j->d->b[e], n, NULL, row);
            for (int64_t k = 0; k < K; k++) {
                w[k] += row[k] * t[n];
                wabs[k] += fabs(row[k] * t[n]);
            }
        }
        double alpha = j->d->alpha[e];
        for (int64_t m = r0; m < r1; m++) {
            fp4d_operand_decode_row(&j->d->a, m, NULL, row);
            double ex = 0.0, p = 0.0, got = 0.0;
            for (int64_t k = 0; k < K; k++) ex += row[k] * w[k], p += fabs(row[k]) * wabs[k];
            ex *= alpha;
            p *= fabs(alpha);
            for (int64_t n = 0; n < N; n++) got += fp4d_out_elem_get(c->out_type, out, m * N + n) * t[n];
            double err = fabs(got - ex);
            /* Each element's bound, summed with |t_n| weights, is at most this; 1e-12*p
             * covers the rounding of this double computation itself. */
            double b1 = (j->tol.gamma + j->tol.u_out * (1.0 + j->tol.gamma)) * p +
                        (double)N * 1.5 * j->tol.tiny_out + 1e-12 * p;
            double b2 = (j->tol.practical + 2.0 * j->tol.u_out) * p + (double)N * 1.5 * j->tol.tiny_out;
            if (fabs(ex) > b1) {
                acc->ref_nonzero = true;
                if (acc->row_ref_nonzero) acc->row_ref_nonzero[m] = 1;
            }
            if (err > b1) acc->proj_fp32_fail = true;
            if (err > b2) acc->proj_practical_fail = true;
            if (b1 > 0 && err / b1 > acc->proj_max_ratio) {
                acc->proj_max_ratio = err / b1;
                acc->proj_worst_row = m;
            }
            if (err > b1) { /* keep the 4 worst rows for an exact re-check */
                double ratio = err / b1;
                for (int s = 0; s < 4; s++) {
                    if (acc->proj_rows[s] >= 0 && acc->proj_ratios[s] >= ratio) continue;
                    for (int u = 3; u > s; u--) acc->proj_rows[u] = acc->proj_rows[u - 1], acc->proj_ratios[u] = acc->proj_ratios[u - 1];
                    acc->proj_rows[s] = m, acc->proj_ratios[s] = ratio;
                    break;
                }
            }
        }
    }
    free(t), free(w), free(wabs), free(row);
    return FP4D_STATUS_OK;
}

/* Whole rows written as zeros where the exact rows are not (a kernel whose row-tile
 * bound is wrong, writing zeros instead of leaving the rows alone, as in flashinfer PR
 * #3533): every element beyond the practical tolerance lies in such a row. */
static fp4d_cause match_zero_rows(judge_ctx *j, const out_scan *sc, const accuracy *acc, char *why, size_t size)
{
    const fp4d_case *c = j->c;
    if (!acc->row_ref_nonzero) return FP4D_CAUSE_UNKNOWN;
    int64_t zero_rows = 0;
    for (int64_t m = 0; m < c->m; m++) zero_rows += sc->nonzero_per_row[m] == 0 && acc->row_ref_nonzero[m];
    if (zero_rows == 0 || zero_rows == c->m) return FP4D_CAUSE_UNKNOWN;
    for (size_t i = 0; i < j->num_samples; i++) {
        const fp4d_sample *s = &j->samples[i];
        if (!isfinite(s->y)) return FP4D_CAUSE_UNKNOWN;
        bool bad = fabs(s->y - s->exact) > fp4d_bound_practical(&j->tol, s->exact, s->s);
        if (bad && sc->nonzero_per_row[s->m] != 0) return FP4D_CAUSE_UNKNOWN;
    }
    uint8_t *flag = malloc((size_t)c->m);
    if (!flag) return FP4D_CAUSE_UNKNOWN;
    for (int64_t m = 0; m < c->m; m++) flag[m] = sc->nonzero_per_row[m] == 0 && acc->row_ref_nonzero[m];
    char rows[FP4D_DETAIL_MAX / 2]; /* half the detail: the advice must fit after it */
    bool grouped = c->op == FP4D_CASE_GROUPED && j->d->num_b > 1;
    fp4d_describe_rows(flag, c->m, j->d->offsets, grouped ? j->d->num_b : 0, rows, sizeof rows);
    free(flag);
    if (grouped)
        snprintf(why, size, "whole rows, numbered within each expert, %s are zero, the exact rows are not: %s", rows,
                 fp4d_cause_advice(FP4D_CAUSE_TILE_ROWS_MISSING));
    else
        snprintf(why, size, "whole rows %s (of %lld) are zero, the exact rows are not: %s", rows, (long long)c->m,
                 fp4d_cause_advice(FP4D_CAUSE_TILE_ROWS_MISSING));
    return FP4D_CAUSE_TILE_ROWS_MISSING;
}

/* An accumulation problem touches every row and every column of the output; a bad block
 * scale of B (one output column), a bad row of A or an epilogue bug on one row does not. When
 * at least 3 errors beyond the f32 bound all lie in one row (one column) while the checked
 * elements span several rows (columns), the error is local: say where instead of blaming
 * the accumulator. Measured: one zeroed B block scale at K = 4096 (10 columns' worth of
 * errors) and one row scaled by 1.01 were both named low_precision_accumulation. */
static bool match_confined(const judge_ctx *j, char *why, size_t size)
{
    int64_t bad = 0, row = -1, col = -1, other_row = -1, other_col = -1;
    bool one_row = true, one_col = true;
    for (size_t i = 0; i < j->num_samples; i++) {
        const fp4d_sample *s = &j->samples[i];
        if (!isfinite(s->y) || !isfinite(s->exact)) continue;
        if (fabs(s->y - s->exact) <= fp4d_bound_fp32(&j->tol, s->exact, s->s)) continue;
        if (bad++ == 0) row = s->m, col = s->n;
        one_row &= s->m == row;
        one_col &= s->n == col;
    }
    if (bad < 3 || (!one_row && !one_col)) return false;
    /* The checked elements must reach beyond that row (column), or locality means nothing
     * (a GEMV has one row). */
    for (size_t i = 0; i < j->num_samples; i++) {
        if (j->samples[i].m != row) other_row = j->samples[i].m;
        if (j->samples[i].n != col) other_col = j->samples[i].n;
    }
    if (one_row && other_row >= 0)
        snprintf(why, size,
                 "every error beyond the f32 bound (%lld checked elements) lies in output row %lld: a "
                 "defect local to that row (its A row or block scales, or the epilogue of its tile), "
                 "not the accumulation, which would touch every row",
                 (long long)bad, (long long)row);
    else if (one_col && other_col >= 0)
        snprintf(why, size,
                 "every error beyond the f32 bound (%lld checked elements) lies in output column %lld: a "
                 "defect local to row %lld of B (its codes or one of its block scales), not the "
                 "accumulation, which would touch every column",
                 (long long)bad, (long long)col, (long long)col);
    else
        return false;
    return true;
}

/* An INACCURATE output whose every error beyond the f32 bound is under one unit in the last
 * place of the output type is a rounding problem of the output conversion (e.g. bf16 by
 * truncation, as a hand-written `bits >> 16` does), not an accumulation problem: say so
 * instead of blaming the accumulator. Returns false when the errors are larger. */
static bool match_output_rounding(const judge_ctx *j, char *why, size_t size)
{
    int64_t bad = 0, toward_zero = 0;
    for (size_t i = 0; i < j->num_samples; i++) {
        const fp4d_sample *s = &j->samples[i];
        if (!isfinite(s->y) || !isfinite(s->exact)) continue;
        double err = fabs(s->y - s->exact), b1 = fp4d_bound_fp32(&j->tol, s->exact, s->s);
        if (err <= b1) continue;
        /* One ulp of the output type is at most 2*u_out*|x|; b1 covers the accumulation. */
        if (err > 2.0 * j->tol.u_out * fabs(s->exact) + b1) return false;
        bad++;
        if (fabs(s->y) < fabs(s->exact)) toward_zero++;
    }
    if (bad == 0) return false;
    const fp4d_dtype_traits *t = fp4d_dtype_get(j->c->out_type);
    if (toward_zero != bad) {
        /* Errors of both signs under one ulp are two roundings into the output type, not a
         * conversion that truncates: e.g. alpha applied to the bf16 output (torchao's
         * post-multiply), which the old message called "does not round to nearest even". */
        snprintf(why, size,
                 "every error is below one unit in the last place of %s, in both directions: the "
                 "result is rounded into %s twice (e.g. alpha applied after the conversion instead "
                 "of to the f32 sum) or the conversion does not round to nearest even "
                 "(accumulation is not the problem)",
                 t ? t->name : "the output type", t ? t->name : "the output type");
        return true;
    }
    snprintf(why, size,
             "every error is below one unit in the last place of %s and toward zero (truncation): the "
             "conversion of the f32 result into %s does not round to nearest even (accumulation is "
             "not the problem)",
             t ? t->name : "the output type", t ? t->name : "the output type");
    return true;
}

/* Judges one output. Fills r (verdict, cause, detail, errors). */
static fp4d_status judge_gemm_output(judge_ctx *j, const uint8_t *out, out_scan *sc, uint64_t seed,
                                     fp4d_case_result *r, bool want_cause)
{
    const fp4d_case *c = j->c;
    scan_output(c, out, sc);
    if (sc->poison > 0) {
        char why[FP4D_DETAIL_MAX] = "";
        fp4d_cause cause = FP4D_CAUSE_UNKNOWN;
        bool grouped = c->op == FP4D_CASE_GROUPED && j->d->num_b > 1;
        cause = fp4d_match_unwritten(sc->poison_per_row, c->m, c->n, j->d->offsets, grouped ? j->d->num_b : 0, why,
                                     sizeof why);
        result_set(r, FP4D_VERDICT_UNWRITTEN, cause, "%lld of %lld output elements never written%s%s",
                   (long long)sc->poison, (long long)(c->m * c->n), why[0] ? ": " : "", why);
        return FP4D_STATUS_OK;
    }
    if (sc->nan > 0 || sc->inf > 0) {
        double rounded, exact;
        FP4D_FORWARD_IF_ERROR(exact_element(j, sc->first_bad_m, sc->first_bad_n, &rounded, &exact));
        double y = fp4d_out_elem_get(c->out_type, out, sc->first_bad_m * c->n + sc->first_bad_n);
        bool legit = (isnan(y) && isnan(rounded)) || (isinf(y) && rounded == y);
        if (!legit) {
            bool nan = sc->nan > 0;
            char why[FP4D_DETAIL_MAX] = "";
            fp4d_cause cause = FP4D_CAUSE_UNKNOWN;
            if (want_cause) {
                /* Some mistakes make non-finite values (fp16 accumulation overflows). */
                accuracy tmp = {0};
                for (int s = 0; s < 4; s++) tmp.proj_rows[s] = -1;
                FP4D_FORWARD_IF_ERROR(check_samples(j, out, &tmp));
                size_t cap = j->num_samples < CAUSE_SAMPLES ? j->num_samples : CAUSE_SAMPLES;
                cause = fp4d_match_cause(j->d, j->samples, cap, why, sizeof why);
            }
            result_set(r, nan ? FP4D_VERDICT_NAN : FP4D_VERDICT_INF, cause,
                       "%lld %s elements where the exact result is finite (first at [%lld, %lld], "
                       "exact %.6g), within rows %lld..%lld x cols %lld..%lld%s%s",
                       (long long)(nan ? sc->nan : sc->inf), nan ? "NaN" : "Inf",
                       (long long)sc->first_bad_m, (long long)sc->first_bad_n, exact,
                       (long long)sc->nan_r0, (long long)sc->nan_r1, (long long)sc->nan_c0,
                       (long long)sc->nan_c1, why[0] ? "; " : "", why);
            return FP4D_STATUS_OK;
        }
    }
    accuracy acc = {0};
    for (int s = 0; s < 4; s++) acc.proj_rows[s] = -1;
    acc.row_ref_nonzero = j->row_flags;
    if (acc.row_ref_nonzero) memset(acc.row_ref_nonzero, 0, (size_t)c->m);
    FP4D_FORWARD_IF_ERROR(check_samples(j, out, &acc));
    if (sc->nan == 0 && sc->inf == 0) FP4D_FORWARD_IF_ERROR(check_projection(j, out, seed, &acc));
    if (acc.proj_rows[0] >= 0 && (int64_t)j->num_samples < c->m * c->n) {
        /* The projection saw an error the sample missed: check those rows exactly, element
         * by element, so the verdict and the cause rest on real elements. */
        /* At most ~32M exact multiply-adds: evenly spaced columns on very wide rows. */
        int nrows = 0;
        for (int s = 0; s < 4; s++) nrows += acc.proj_rows[s] >= 0;
        int64_t per_row = (int64_t)(32e6 / (double)c->k) / nrows;
        if (per_row > c->n) per_row = c->n;
        if (per_row < 1) per_row = 1;
        size_t extra = (size_t)(per_row * nrows);
        fp4d_sample *grown = realloc(j->samples, (j->num_samples + extra) * sizeof *grown);
        FP4D_RETURN_ERROR_IF(!grown, NOMEM, "out of memory for samples");
        j->samples = grown;
        size_t base = j->num_samples, n = 0;
        for (int s = 0; s < 4; s++)
            for (int64_t t = 0; acc.proj_rows[s] >= 0 && t < per_row && n < extra; t++)
                grown[base + n].m = acc.proj_rows[s], grown[base + n++].n = t * c->n / per_row;
        judge_ctx sub = *j;
        sub.samples = grown + base;
        sub.num_samples = n;
        FP4D_FORWARD_IF_ERROR(check_samples(&sub, out, &acc));
        j->num_samples = base + n;
    }
    r->elements_checked = acc.checked;
    r->bad_elements = acc.beyond_practical;
    r->max_abs_err = acc.max_abs;
    r->max_err_ratio = acc.max_ratio > acc.proj_max_ratio ? acc.max_ratio : acc.proj_max_ratio;
    if (sc->nonzero == 0 && acc.ref_nonzero) {
        result_set(r, FP4D_VERDICT_ZEROS, FP4D_CAUSE_UNKNOWN,
                   "the whole %lldx%lld output is zero; the exact result is not", (long long)c->m,
                   (long long)c->n);
        return FP4D_STATUS_OK;
    }
    fp4d_verdict v = FP4D_VERDICT_PASS;
    if (acc.beyond_practical > 0 || acc.proj_practical_fail) v = FP4D_VERDICT_WRONG;
    else if (acc.beyond_fp32 > 0 || acc.proj_fp32_fail) v = FP4D_VERDICT_INACCURATE;
    if (v == FP4D_VERDICT_PASS) {
        result_set(r, v, FP4D_CAUSE_NONE, "%s", "");
        return FP4D_STATUS_OK;
    }
    char where[200];
    if (acc.beyond_fp32 > 0)
        snprintf(where, sizeof where,
                 "%lld of %lld checked elements beyond the %s bound (worst [%lld, %lld]: %.6g, exact %.6g, %.3gx the bound)",
                 (long long)(v == FP4D_VERDICT_WRONG ? acc.beyond_practical : acc.beyond_fp32),
                 (long long)acc.checked, v == FP4D_VERDICT_WRONG ? "practical" : "f32-accumulation",
                 (long long)acc.worst_m, (long long)acc.worst_n, acc.worst_y, acc.worst_v, acc.max_ratio);
    else
        snprintf(where, sizeof where,
                 "sampled elements agree, but the projection check of row %lld is %.3gx its f32 bound",
                 (long long)acc.proj_worst_row, acc.proj_max_ratio);
    fp4d_cause cause = FP4D_CAUSE_UNKNOWN;
    char why[FP4D_DETAIL_MAX] = "";
    if (want_cause) {
        /* The failing samples first, then the others, up to CAUSE_SAMPLES. */
        size_t cap = j->num_samples < CAUSE_SAMPLES ? j->num_samples : CAUSE_SAMPLES;
        fp4d_sample *cs = malloc((cap ? cap : 1) * sizeof *cs);
        FP4D_RETURN_ERROR_IF(!cs, NOMEM, "out of memory");
        size_t n = 0;
        for (int pass = 0; pass < 2 && n < cap; pass++) {
            for (size_t i = 0; i < j->num_samples && n < cap; i++) {
                const fp4d_sample *s = &j->samples[i];
                if (!isfinite(s->y)) continue;
                bool bad = fabs(s->y - s->exact) > fp4d_bound_fp32(&j->tol, s->exact, s->s);
                if (bad == (pass == 0)) cs[n++] = *s;
            }
        }
        cause = fp4d_match_cause(j->d, cs, n, why, sizeof why);
        free(cs);
        if (cause == FP4D_CAUSE_UNKNOWN) cause = match_zero_rows(j, sc, &acc, why, sizeof why);
        if (cause == FP4D_CAUSE_UNKNOWN && v == FP4D_VERDICT_INACCURATE && !match_confined(j, why, sizeof why) &&
            !match_output_rounding(j, why, sizeof why)) {
            cause = FP4D_CAUSE_LOW_PRECISION_ACCUMULATION;
            snprintf(why, sizeof why, "%s",
                     "errors exceed what f32 accumulation allows but stay small relative to the "
                     "sum of |products|: the kernel accumulates (or stores partial sums) in lower "
                     "precision");
        }
    }
    result_set(r, v, cause, "%s%s%s", where, why[0] ? "; " : "", why);
    return FP4D_STATUS_OK;
}

/* ---- inputs are read-only (gemm.h): a backend that writes into them is caught here ---- */

static uint64_t bytes_hash(const void *p, size_t n)
{
    const uint8_t *b = p;
    uint64_t h = 0xcbf29ce484222325u ^ (uint64_t)n;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 0x100000001b3u;
        h ^= h >> 29;
    }
    for (; i < n; i++) h = (h ^ b[i]) * 0x100000001b3u;
    return h;
}

typedef struct input_hashes {
    uint64_t v[4]; /* A data, A block scales, B data, B block scales (every expert) */
} input_hashes;

static void hash_inputs(const fp4d_case_data *d, input_hashes *h)
{
    memset(h, 0, sizeof *h);
    h->v[0] = bytes_hash(d->a.data, d->a.data_bytes);
    if (d->a.scales) h->v[1] = bytes_hash(d->a.scales, d->a.scales_bytes);
    for (int32_t e = 0; e < d->num_b; e++) {
        h->v[2] = h->v[2] * 31u + bytes_hash(d->b[e].data, d->b[e].data_bytes);
        if (d->b[e].scales) h->v[3] = h->v[3] * 31u + bytes_hash(d->b[e].scales, d->b[e].scales_bytes);
    }
}

/* The first input buffer whose bytes changed, or NULL. */
static const char *input_changed(const input_hashes *before, const input_hashes *after)
{
    static const char *const names[4] = {"A's data", "A's block scales", "B's data", "B's block scales"};
    for (int i = 0; i < 4; i++)
        if (before->v[i] != after->v[i]) return names[i];
    return NULL;
}

static bool want_rerun(fp4d_backend_t b, const fp4d_case *c)
{
    const fp4d_backend_iface *bi = fp4d_backend_iface_of(b);
    double macs = (double)c->m * (double)(c->n ? c->n : 1) * (double)c->k;
    /* The exact reference is deterministic by construction and slow on big shapes. */
    return !(bi && bi->kind == FP4D_BACKEND_KIND_REFERENCE && macs > RERUN_REF_MAX_MACS);
}

static fp4d_status run_gemm_case(fp4d_backend_t b, const fp4d_case *c, const fp4d_case_data *d,
                                 uint64_t seed, fp4d_case_result *r)
{
    int64_t total = c->m * c->n;
    size_t es = fp4d_out_elem_size(c->out_type);
    size_t bytes = (size_t)total * es;
    fp4d_gemm_problem p = {0};
    fp4d_grouped_gemm_problem gp = {0};
    fp4d_matrix *bm = NULL;
    fp4d_gemm_desc desc;
    if (c->op == FP4D_CASE_GEMM) {
        p = fp4d_case_gemm_problem(d);
        fp4d_gemm_describe(&p, &desc);
    } else {
        bm = malloc((size_t)d->num_b * sizeof *bm);
        FP4D_RETURN_ERROR_IF(!bm, NOMEM, "out of memory");
        gp = fp4d_case_grouped_problem(d, bm);
        fp4d_grouped_gemm_describe(&gp, &desc);
    }
    fp4d_reason why = {{0}};
    if (!fp4d_backend_supports(b, &desc, &why)) {
        free(bm);
        result_set(r, FP4D_VERDICT_UNSUPPORTED, FP4D_CAUSE_NONE, "%s",
                   why.text[0] ? why.text : "the backend does not support this case");
        return FP4D_STATUS_OK;
    }
    bool rerun = want_rerun(b, c);
    uint8_t *raw[2] = {fp4d_guarded_alloc(bytes), rerun ? fp4d_guarded_alloc(bytes) : NULL};
    int64_t *ppr = calloc((size_t)(c->m ? c->m : 1), sizeof *ppr);
    int64_t *nzr = calloc((size_t)(c->m ? c->m : 1), sizeof *nzr);
    uint8_t *rowf = calloc((size_t)(c->m ? c->m : 1), 1);
    judge_ctx j = {c, d, fp4d_tolerance_for(c->k, c->out_type), NULL, 0,
                   malloc((size_t)c->k * sizeof(double)), malloc((size_t)c->k * sizeof(double)), rowf};
    fp4d_status st = FP4D_STATUS_OK;
    if (!raw[0] || (rerun && !raw[1]) || !ppr || !nzr || !rowf || !j.row_a || !j.row_b) {
        st = fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory for a %lldx%lld output",
                            (long long)c->m, (long long)c->n);
        goto done;
    }
    int runs = rerun ? 2 : 1;
    const size_t guard = fp4d_guard_size(bytes); /* the output starts at raw[run] + guard */
    input_hashes inputs_before, inputs_after;
    hash_inputs(d, &inputs_before);
    fp4d_doctor_call_hook_fire(); /* "call": the time limit for the backend starts */
    for (int run = 0; run < runs; run++) {
        uint8_t *out = raw[run] + guard;
        fp4d_poison_fill(c->out_type, out, total);
        fp4d_status call;
        fp4d_clear_error();
        double t0 = fp4d_now_s();
        if (c->op == FP4D_CASE_GEMM) {
            p.out = out;
            call = fp4d_backend_gemm(b, &p, &why);
        } else {
            gp.out = out;
            call = fp4d_backend_grouped_gemm(b, &gp, &why);
        }
        double dt = fp4d_now_s() - t0;
        if (run == 0) {
            r->time_ms = dt * 1e3;
            if (dt > 0) r->gflops = 2.0 * (double)c->m * (double)c->n * (double)c->k / dt * 1e-9;
        }
        if (call == FP4D_STATUS_UNSUPPORTED) {
            /* supports() said yes above (backend.h: gemm() only sees problems it accepted),
             * so "unsupported" now is a broken promise, not an honest answer: a server that
             * picked this backend by asking supports() would fail at run time. */
            result_set(r, FP4D_VERDICT_ERROR, FP4D_CAUSE_NONE,
                       "supports() accepted this case, then the %s call returned UNSUPPORTED%s%s%s",
                       c->op == FP4D_CASE_GEMM ? "gemm()" : "grouped_gemm()", run ? " on the rerun" : "",
                       why.text[0] || fp4d_last_error()[0] ? ": " : "",
                       why.text[0] ? why.text : fp4d_last_error());
            goto done;
        }
        if (call != FP4D_STATUS_OK) {
            result_set(r, FP4D_VERDICT_ERROR, FP4D_CAUSE_NONE, "the backend returned %s%s%s%s",
                       fp4d_status_name(call), run ? " on the rerun" : "",
                       fp4d_last_error()[0] || why.text[0] ? ": " : "",
                       fp4d_last_error()[0] ? fp4d_last_error() : why.text);
            goto done;
        }
    }
    fp4d_doctor_call_hook_fire(); /* "called": judging starts */

    for (int run = 0; run < runs; run++) {
        int64_t after, before;
        int64_t changed = fp4d_guard_check(raw[run], bytes, &after, &before);
        if (changed > 0) {
            result_set(r, FP4D_VERDICT_OOB_WRITE, FP4D_CAUSE_NONE,
                       "wrote %lld sentinel bytes outside the %lldx%lld output (%lld before it%s%lld)",
                       (long long)changed, (long long)c->m, (long long)c->n, (long long)before,
                       after >= 0 ? ", first after it at end+" : "", after >= 0 ? (long long)after : 0LL);
            goto done;
        }
    }
    /* Writing into an input is writing outside the output too, and it would make every
     * later judgement (and the rerun) compare against damaged operands. */
    hash_inputs(d, &inputs_after);
    const char *clobbered = input_changed(&inputs_before, &inputs_after);
    if (clobbered) {
        result_set(r, FP4D_VERDICT_OOB_WRITE, FP4D_CAUSE_NONE,
                   "the backend wrote into its input (%s changed during the call): gemm.h inputs are "
                   "read-only, and a caller that reuses them (weights are reused on every call) "
                   "would compute garbage next time",
                   clobbered);
        goto done;
    }
    st = choose_samples(&j, seed);
    if (st != FP4D_STATUS_OK) goto done;
    out_scan sc = {.poison_per_row = ppr, .nonzero_per_row = nzr};
    st = judge_gemm_output(&j, raw[0] + guard, &sc, seed, r, true);
    if (st != FP4D_STATUS_OK || !rerun) goto done;
    /* Determinism: bit-identical outputs on identical inputs. */
    int64_t ndiff = 0, first = -1;
    for (int64_t i = 0; i < (int64_t)bytes; i += (int64_t)es)
        if (memcmp(raw[0] + guard + i, raw[1] + guard + i, es) != 0) {
            if (first < 0) first = i / (int64_t)es;
            ndiff++;
        }
    if (ndiff > 0) {
        fp4d_case_result r2 = *r;
        st = judge_gemm_output(&j, raw[1] + guard, &sc, seed, &r2, false);
        if (st != FP4D_STATUS_OK) goto done;
        /* When one of the two runs is right, the failure is the nondeterminism itself: a
         * kernel that is sometimes wrong. When both are wrong, the worse one stands. */
        fp4d_verdict best = r->verdict > r2.verdict ? r->verdict : r2.verdict;
        if (best >= FP4D_VERDICT_NONDETERMINISTIC) {
            result_set(r, FP4D_VERDICT_NONDETERMINISTIC, FP4D_CAUSE_NONE,
                       "two runs on identical inputs differ in %lld elements (first at [%lld, %lld])",
                       (long long)ndiff, (long long)(first / c->n), (long long)(first % c->n));
        } else if (r2.verdict < r->verdict) {
            *r = r2;
        }
    }
done:
    free(raw[0]);
    free(raw[1]);
    free(ppr);
    free(nzr);
    free(rowf);
    free(j.row_a);
    free(j.row_b);
    free(j.samples);
    free(bm);
    return st;
}

/* ---------------------------------------------------------------------------------------
 * Quantize cases
 * ------------------------------------------------------------------------------------- */

static int e2m1_index(uint8_t code) { return code & 7; }

static fp4d_status run_quantize_case(fp4d_backend_t b, const fp4d_case *c, const fp4d_case_data *d,
                                     fp4d_case_result *r)
{
    const fp4d_dtype_traits *t = fp4d_dtype_get(c->b_type);
    int64_t rows = c->m, cols = c->k, sc = cols / t->block_size;
    size_t code_bytes = (size_t)(rows * cols / 2);
    size_t scale_bytes = fp4d_scale_buffer_size(c->a_layout, rows, sc);
    const size_t cg = fp4d_guard_size(code_bytes), sg = fp4d_guard_size(scale_bytes); /* sentinel sizes */
    fp4d_quantize_params qp = {c->b_type, c->convention, c->a_layout, d->static_encode_scale};
    uint8_t *ref_codes = malloc(code_bytes + 1), *ref_scales = malloc(scale_bytes + 1);
    uint8_t *raw_codes[2] = {fp4d_guarded_alloc(code_bytes), fp4d_guarded_alloc(code_bytes)};
    uint8_t *raw_scales[2] = {fp4d_guarded_alloc(scale_bytes), fp4d_guarded_alloc(scale_bytes)};
    fp4d_status st = FP4D_STATUS_OK;
    fp4d_quantize_result ref_res = {0}, got_res[2];
    if (!ref_codes || !ref_scales || !raw_codes[0] || !raw_codes[1] || !raw_scales[0] || !raw_scales[1]) {
        st = fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory for a quantize case");
        goto done;
    }
    /* 0x7F is a NaN e4m3 scale: padding left unwritten by the backend then shows. */
    memset(ref_scales, 0x7F, scale_bytes);
    fp4d_status rs = fp4d_quantize(&qp, FP4D_DTYPE_F32, d->src, rows, cols, ref_codes, ref_scales, &ref_res);
    if (rs != FP4D_STATUS_OK) {
        result_set(r, FP4D_VERDICT_UNSUPPORTED, FP4D_CAUSE_NONE,
                   "the reference quantizer does not implement this case: %s", fp4d_last_error());
        goto done;
    }
    fp4d_doctor_call_hook_fire();
    for (int run = 0; run < 2; run++) {
        memset(raw_codes[run] + cg, 0x00, code_bytes);
        memset(raw_scales[run] + sg, 0x7F, scale_bytes);
        fp4d_quantize_problem q = {qp, FP4D_DTYPE_F32, d->src, rows, cols,
                                   raw_codes[run] + cg, raw_scales[run] + sg, {0, 0}};
        fp4d_reason why = {{0}};
        fp4d_clear_error();
        double t0 = fp4d_now_s();
        fp4d_status call = fp4d_backend_quantize(b, &q, &why);
        if (run == 0) r->time_ms = (fp4d_now_s() - t0) * 1e3;
        got_res[run] = q.result;
        if (call == FP4D_STATUS_UNSUPPORTED) {
            result_set(r, FP4D_VERDICT_UNSUPPORTED, FP4D_CAUSE_NONE, "%s",
                       why.text[0] ? why.text : "the backend does not quantize");
            goto done;
        }
        if (call != FP4D_STATUS_OK) {
            result_set(r, FP4D_VERDICT_ERROR, FP4D_CAUSE_NONE, "quantize returned %s: %s",
                       fp4d_status_name(call), fp4d_last_error()[0] ? fp4d_last_error() : why.text);
            goto done;
        }
    }
    fp4d_doctor_call_hook_fire();
    for (int run = 0; run < 2; run++) {
        int64_t after, before;
        int64_t changed = fp4d_guard_check(raw_codes[run], code_bytes, &after, &before) +
                          fp4d_guard_check(raw_scales[run], scale_bytes, &after, &before);
        if (changed) {
            result_set(r, FP4D_VERDICT_OOB_WRITE, FP4D_CAUSE_NONE,
                       "quantize wrote %lld bytes outside its code/scale buffers", (long long)changed);
            goto done;
        }
    }
    const uint8_t *codes = raw_codes[0] + cg, *scales = raw_scales[0] + sg;
    int64_t code_off1 = 0, code_bad = 0, scale_off1 = 0, scale_bad = 0, pad_bad = 0;
    int64_t first_bad = -1;
    for (int64_t i = 0; i < rows * cols; i++) {
        uint8_t g = (codes[i >> 1] >> ((i & 1) * 4)) & 15, e = (ref_codes[i >> 1] >> ((i & 1) * 4)) & 15;
        if (g == e) continue;
        /* -0 and +0 are the same value: a sign-of-zero difference is one step, not a bug
         * in the numbers (§9.3 of the spec: conventions disagree there). */
        int diff = abs(e2m1_index(g) - e2m1_index(e));
        bool same_sign = (g & 8) == (e & 8) || e2m1_index(g) == 0 || e2m1_index(e) == 0;
        if (same_sign && diff <= 1) code_off1++;
        else {
            code_bad++;
            if (first_bad < 0) first_bad = i;
        }
    }
    for (int64_t rr = 0; rr < rows; rr++)
        for (int64_t cc = 0; cc < sc; cc++) {
            size_t off = fp4d_scale_offset(c->a_layout, rows, sc, rr, cc);
            if (scales[off] == ref_scales[off]) continue;
            if (abs((int)scales[off] - (int)ref_scales[off]) == 1) scale_off1++;
            else scale_bad++;
        }
    /* Padding of swizzled buffers: compared with what the reference wrote there. */
    if (c->a_layout != FP4D_LAYOUT_LINEAR) {
        int64_t logical = 0;
        for (size_t i = 0; i < scale_bytes; i++)
            if (scales[i] != ref_scales[i]) logical++;
        pad_bad = logical - scale_off1 - scale_bad;
    }
    bool nondet = memcmp(raw_codes[0] + cg, raw_codes[1] + cg, code_bytes) != 0 ||
                  memcmp(raw_scales[0] + sg, raw_scales[1] + sg, scale_bytes) != 0;
    bool scale2_bad = c->b_type == FP4D_DTYPE_NVFP4 &&
                      memcmp(&got_res[0].decode_scale, &ref_res.decode_scale, sizeof(float)) != 0;
    r->elements_checked = rows * cols;
    r->bad_elements = code_bad;
    r->off_by_one_codes = code_off1;
    if (nondet) {
        result_set(r, FP4D_VERDICT_NONDETERMINISTIC, FP4D_CAUSE_NONE,
                   "two quantize calls on identical inputs produced different bytes");
    } else if (code_bad || scale_bad || pad_bad || scale2_bad) {
        result_set(r, FP4D_VERDICT_WRONG, FP4D_CAUSE_UNKNOWN,
                   "differs from the %s convention: %lld codes (first at element %lld), %lld block "
                   "scales, %lld scale padding bytes%s; %lld more codes one step off",
                   fp4d_convention_name(c->convention), (long long)code_bad, (long long)first_bad,
                   (long long)(scale_bad + scale_off1), (long long)pad_bad,
                   scale2_bad ? ", the per-tensor decode scale" : "", (long long)code_off1);
    } else if (code_off1 || scale_off1) {
        result_set(r, FP4D_VERDICT_INACCURATE, FP4D_CAUSE_NONE,
                   "%lld codes and %lld block scales one step from the %s convention (an "
                   "approximate reciprocal, rcp.approx-style, rounds the other way on ties)",
                   (long long)code_off1, (long long)scale_off1, fp4d_convention_name(c->convention));
    } else {
        result_set(r, FP4D_VERDICT_PASS, FP4D_CAUSE_NONE, "%s", "");
    }
done:
    free(ref_codes);
    free(ref_scales);
    for (int i = 0; i < 2; i++) free(raw_codes[i]), free(raw_scales[i]);
    return st;
}

fp4d_status fp4d_doctor_run_case(fp4d_backend_t backend, const fp4d_case *c, uint64_t seed,
                                 fp4d_case_result *r)
{
    FP4D_RETURN_ERROR_IF(!backend || !c || !r, INVALID_ARG, "NULL argument");
    memset(r, 0, sizeof *r);
    r->ran = true;
    r->verdict = FP4D_VERDICT_PASS;
    if (c->op == FP4D_CASE_STRESS) return fp4d_run_stress_case(backend, c, seed, r);
    fp4d_case_data d;
    fp4d_status st = fp4d_case_data_make(c, seed, &d);
    if (st == FP4D_STATUS_NOMEM) return st;
    if (st != FP4D_STATUS_OK) {
        result_set(r, FP4D_VERDICT_ERROR, FP4D_CAUSE_NONE, "could not build the inputs: %s",
                   fp4d_last_error());
        return FP4D_STATUS_OK;
    }
    if (c->op == FP4D_CASE_QUANTIZE) st = run_quantize_case(backend, c, &d, r);
    else st = run_gemm_case(backend, c, &d, seed, r);
    fp4d_case_data_free(&d);
    return st;
}
