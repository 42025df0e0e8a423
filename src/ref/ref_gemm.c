/*
 * ref_gemm.c - the exact reference GEMM (ref.h, DESIGN.md §4, docs/reference.md).
 *
 * out[m,n] = RN(alpha * sum_k A^[m,k] * B^[n,k]), computed exactly and rounded once.
 *
 * How it stays exact and still runs 256x256x4096 in well under a second:
 *   - Every decoded value is an integer times a power of two. B's elements are e2m1 codes
 *     times 2 (integers in [-12, 12]) times the block scale's significand (an integer of at
 *     most 4 bits) times 2^e. The K axis is cut into chunks of 16 elements (the NVFP4 block;
 *     an MXFP4 block is two chunks), inside which B's scale is one number.
 *   - A's chunk is turned into int64 integers on a common exponent: for FP4 A that is the
 *     same code*scale form; for f32/bf16/f16 A each value's significand is shifted onto the
 *     chunk's exponent, chosen so every integer stays below 2^51. An element whose lowest
 *     set bit lies more than 51 bits below the chunk's largest value ("spill", rare: it needs
 *     a dynamic range above 2^27 inside 16 neighbours) is added on its own instead.
 *   - One chunk's dot product is then an int64 sum that cannot overflow
 *     (16 * 2^51 * 12 * 15 < 2^63), and only that sum goes into the wide superaccumulator
 *     (ref_exact.h), once per 16 products.
 * NaN and Inf never enter the integer path: a chunk holding a non-finite element or a NaN
 * scale is classified the IEEE way (NaN * x = NaN, Inf * 0 = NaN, Inf * x = signed Inf,
 * +Inf + -Inf = NaN), which decides the element on its own.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fp4doctor/ref.h"
#include "internal.h"
#include "ref_exact.h"

#define CHUNK 16
/* Integers of plain-A chunks stay below 2^A_INT_BITS (see the bound above). */
#define A_INT_BITS 51

/* Class of a decoded value, for the IEEE classification of chunks with non-finite values. */
enum { E_ZERO = 0, E_POS = 1, E_NEG = 2, E_NAN = 3, E_PINF = 4, E_NINF = 5 };
#define E_FINITE(c) ((c) < E_NAN)
#define E_INF(c) ((c) == E_PINF || (c) == E_NINF)
#define E_NEGATIVE(c) ((c) == E_NEG || (c) == E_NINF)

/* e2m1 code -> value * 2 (spec §1.1), so every code is an integer. */
static const int8_t e2m1_x2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* ---- decoding ------------------------------------------------------------------------------- */

/* A float as odd significand * 2^exp (sig = 0 for zero and for non-finite values). */
typedef struct exact_value {
    int64_t sig; /* signed */
    int     exp;
    uint8_t cls;
} exact_value;

/* An IEEE binary format with exp_bits exponent and man_bits mantissa bits (f32: 8/23,
 * f16: 5/10), given as its bit pattern, split into odd significand * 2^exp. */
static exact_value exact_from_ieee(uint32_t bits, int exp_bits, int man_bits)
{
    const uint32_t exp_max = (1u << exp_bits) - 1u, man_mask = (1u << man_bits) - 1u;
    const int      bias    = (1 << (exp_bits - 1)) - 1;
    uint32_t E = (bits >> man_bits) & exp_max, F = bits & man_mask;
    bool neg = (bits >> (exp_bits + man_bits)) & 1u;
    exact_value v = {0, 0, E_ZERO};
    if (E == exp_max) {
        v.cls = F ? E_NAN : neg ? E_NINF : E_PINF;
        return v;
    }
    uint64_t m = E ? (F | (1u << man_bits)) : F;
    int e = (E ? (int)E : 1) - bias - man_bits; /* subnormals share the smallest exponent */
    if (m) {
        int tz = __builtin_ctzll(m);
        m >>= tz;
        e += tz;
    }
    v.sig = neg ? -(int64_t)m : (int64_t)m;
    v.exp = e;
    v.cls = m == 0 ? E_ZERO : neg ? E_NEG : E_POS;
    return v;
}

static exact_value exact_from_f32(float x)
{
    uint32_t b;
    memcpy(&b, &x, 4);
    return exact_from_ieee(b, 8, 23);
}

static exact_value exact_from_f16(uint16_t h) { return exact_from_ieee(h, 5, 10); }

static exact_value exact_plain(fp4d_dtype t, const void *data, int64_t idx)
{
    if (t == FP4D_DTYPE_F32) {
        float x;
        memcpy(&x, (const uint8_t *)data + 4 * idx, 4);
        return exact_from_f32(x);
    }
    uint16_t h;
    memcpy(&h, (const uint8_t *)data + 2 * idx, 2);
    if (t == FP4D_DTYPE_BF16) {
        uint32_t b = (uint32_t)h << 16; /* bf16 is the top half of an f32 */
        float x;
        memcpy(&x, &b, 4);
        return exact_from_f32(x);
    }
    return exact_from_f16(h);
}

/* Block scale r, block c of an FP4 matrix, via the formats module's decoder (so the reference
 * and dequantization agree on what each scale byte means), as sig * 2^exp. */
static exact_value exact_scale(const fp4d_matrix *x, const fp4d_dtype_traits *t, int64_t r, int64_t blk)
{
    int64_t scale_cols = x->cols / t->block_size;
    uint8_t byte = x->scales[fp4d_scale_offset(x->scale_layout, x->rows, scale_cols, r, blk)];
    return exact_from_f32(t->scale_to_f32(byte));
}

/* One FP4 operand row in chunk form: value[k] = q[k] * mult[c] * 2^exp[c], c = k / CHUNK. */
typedef struct fp4_row {
    int8_t  *q;    /* [K] e2m1 * 2 */
    int32_t *mult; /* [K/CHUNK] scale significand (odd, |mult| <= 15 for e4m3, 1 for ue8m0) */
    int16_t *exp;  /* [K/CHUNK] */
    uint8_t *cls;  /* [K/CHUNK] class of the scale */
} fp4_row;

/* Decodes row r of FP4 matrix x into dst (arrays of K and K/CHUNK entries). Returns false
 * if a scale is outside what the integer bounds allow (cannot happen with e4m3/ue8m0). */
static bool decode_fp4_row(const fp4d_matrix *x, int64_t r, int8_t *q, int32_t *mult, int16_t *exp,
                           uint8_t *cls)
{
    const fp4d_dtype_traits *t = fp4d_dtype_get(x->dtype);
    int64_t K = x->cols, chunks = K / CHUNK, per_block = t->block_size / CHUNK;
    const uint8_t *row = (const uint8_t *)x->data + r * (K / 2);
    for (int64_t k = 0; k < K; k += 2) {
        uint8_t byte = row[k / 2];
        q[k] = e2m1_x2[byte & 0xF];      /* even element: low nibble (§1.5) */
        q[k + 1] = e2m1_x2[byte >> 4];
    }
    for (int64_t c = 0; c < chunks; c++) {
        if (c % per_block != 0) { /* same block as the previous chunk */
            mult[c] = mult[c - 1];
            exp[c] = exp[c - 1];
            cls[c] = cls[c - 1];
            continue;
        }
        exact_value s = exact_scale(x, t, r, c / per_block);
        if (s.sig > 15 || s.sig < -15) return false;
        mult[c] = (int32_t)s.sig;
        exp[c] = (int16_t)(s.exp - 1); /* q holds 2 * e2m1 */
        cls[c] = s.cls;
    }
    return true;
}

/* One A row: a[k] integers with exponent exp[c] per chunk; spilled elements listed apart;
 * chunks holding a non-finite value are marked, with the class of each element kept. */
typedef struct a_row {
    int64_t *a;        /* [K] */
    int16_t *exp;      /* [chunks] */
    uint8_t *special;  /* [chunks] the chunk has a NaN/Inf element or a NaN/Inf scale */
    uint8_t *cls;      /* [K] element class (valid in special chunks) */
    int64_t *spill_k;  /* [K] */
    int64_t *spill_sig;
    int16_t *spill_exp;
    int64_t  nspill;
    /* scratch for FP4 A */
    int8_t  *q;
    int32_t *mult;
    uint8_t *scls;
} a_row;

/* Class of the FP4 element q/2 * scale, scale being mult * 2^e of class scls. */
static uint8_t fp4_elem_class(int8_t q, int32_t mult, uint8_t scls)
{
    if (scls == E_NAN) return E_NAN;
    if (E_INF(scls)) return q == 0 ? E_NAN : ((q < 0) != (scls == E_NINF)) ? E_NINF : E_PINF;
    if (q == 0 || mult == 0) return E_ZERO;
    return (q < 0) != (mult < 0) ? E_NEG : E_POS;
}

static bool decode_a_row(const fp4d_matrix *A, int64_t m, a_row *ar)
{
    int64_t K = A->cols, chunks = K / CHUNK;
    ar->nspill = 0;
    const fp4d_dtype_traits *t = fp4d_dtype_get(A->dtype);
    if (t->is_block_fp4) {
        if (!decode_fp4_row(A, m, ar->q, ar->mult, ar->exp, ar->scls)) return false;
        for (int64_t c = 0; c < chunks; c++) {
            ar->special[c] = !E_FINITE(ar->scls[c]);
            for (int64_t k = c * CHUNK; k < (c + 1) * CHUNK; k++) {
                ar->a[k] = ar->special[c] ? 0 : (int64_t)ar->q[k] * ar->mult[c];
                ar->cls[k] = fp4_elem_class(ar->q[k], ar->mult[c], ar->scls[c]);
            }
        }
        return true;
    }
    exact_value v[CHUNK];
    for (int64_t c = 0; c < chunks; c++) {
        int top = INT32_MIN, lowest = INT32_MAX;
        bool special = false;
        for (int j = 0; j < CHUNK; j++) {
            int64_t k = c * CHUNK + j;
            v[j] = exact_plain(A->dtype, A->data, m * K + k);
            ar->cls[k] = v[j].cls;
            if (!E_FINITE(v[j].cls)) {
                special = true;
                continue;
            }
            if (!v[j].sig) continue;
            uint64_t mag = v[j].sig < 0 ? (uint64_t)-v[j].sig : (uint64_t)v[j].sig;
            int t_top = v[j].exp + (64 - __builtin_clzll(mag));
            if (t_top > top) top = t_top;
            if (v[j].exp < lowest) lowest = v[j].exp;
        }
        ar->special[c] = special;
        if (top == INT32_MIN) { /* all zero (or all non-finite) */
            ar->exp[c] = 0;
            for (int j = 0; j < CHUNK; j++) ar->a[c * CHUNK + j] = 0;
            continue;
        }
        int base = top - A_INT_BITS;
        if (base < lowest) base = lowest;
        ar->exp[c] = (int16_t)base;
        for (int j = 0; j < CHUNK; j++) {
            int64_t k = c * CHUNK + j;
            if (!v[j].sig) {
                ar->a[k] = 0;
            } else if (v[j].exp >= base) {
                ar->a[k] = v[j].sig * ((int64_t)1 << (v[j].exp - base));
            } else {
                ar->a[k] = 0;
                ar->spill_k[ar->nspill] = k;
                ar->spill_sig[ar->nspill] = v[j].sig;
                ar->spill_exp[ar->nspill] = (int16_t)v[j].exp;
                ar->nspill++;
            }
        }
    }
    return true;
}

static void a_row_free(a_row *ar)
{
    free(ar->a);
    free(ar->exp);
    free(ar->special);
    free(ar->cls);
    free(ar->spill_k);
    free(ar->spill_sig);
    free(ar->spill_exp);
    free(ar->q);
    free(ar->mult);
    free(ar->scls);
    memset(ar, 0, sizeof *ar);
}

static bool a_row_alloc(a_row *ar, int64_t K)
{
    memset(ar, 0, sizeof *ar);
    size_t k = (size_t)K, c = (size_t)(K / CHUNK) + 1;
    ar->a = malloc(k * sizeof *ar->a);
    ar->exp = malloc(c * sizeof *ar->exp);
    ar->special = malloc(c);
    ar->cls = malloc(k);
    ar->spill_k = malloc(k * sizeof *ar->spill_k);
    ar->spill_sig = malloc(k * sizeof *ar->spill_sig);
    ar->spill_exp = malloc(k * sizeof *ar->spill_exp);
    ar->q = malloc(k);
    ar->mult = malloc(c * sizeof *ar->mult);
    ar->scls = malloc(c);
    if (!ar->a || !ar->exp || !ar->special || !ar->cls || !ar->spill_k || !ar->spill_sig || !ar->spill_exp ||
        !ar->q || !ar->mult || !ar->scls) {
        a_row_free(ar);
        return false;
    }
    return true;
}

/* ---- one element ------------------------------------------------------------------------------ */

typedef struct dot_result {
    uint8_t   cls;  /* E_POS: finite, value in acc; E_NAN, E_PINF, E_NINF otherwise */
    fp4d_sacc acc;
} dot_result;

/* IEEE class of the product of two decoded values; E_POS stands for any finite product,
 * which does not matter once a non-finite product exists. */
static uint8_t product_class(uint8_t ac, uint8_t bc)
{
    if (ac == E_NAN || bc == E_NAN) return E_NAN;
    if (!E_INF(ac) && !E_INF(bc)) return E_POS;
    if (ac == E_ZERO || bc == E_ZERO) return E_NAN; /* Inf * 0 */
    return E_NEGATIVE(ac) != E_NEGATIVE(bc) ? E_NINF : E_PINF;
}

/* The exact dot product of A row (decoded) and B row n (decoded), or its IEEE class. */
static bool dot_exact(const a_row *ar, int64_t K, const int8_t *q, const int32_t *mult, const int16_t *bexp,
                      const uint8_t *bcls, dot_result *res)
{
    int64_t chunks = K / CHUNK;
    bool any_nan = false, pinf = false, ninf = false;
    fp4d_sacc_zero(&res->acc);
    bool ok = true;
    for (int64_t c = 0; c < chunks; c++) {
        if (ar->special[c] || !E_FINITE(bcls[c])) {
            for (int64_t k = c * CHUNK; k < (c + 1) * CHUNK; k++) {
                uint8_t pc = product_class(ar->cls[k], fp4_elem_class(q[k], mult[c], bcls[c]));
                any_nan |= pc == E_NAN;
                pinf |= pc == E_PINF;
                ninf |= pc == E_NINF;
            }
            continue;
        }
        const int64_t *a = ar->a + c * CHUNK;
        const int8_t *qq = q + c * CHUNK;
        int64_t s = 0;
        for (int j = 0; j < CHUNK; j++) s += a[j] * qq[j];
        if (s) ok &= fp4d_sacc_add(&res->acc, s * mult[c], ar->exp[c] + bexp[c]);
    }
    for (int64_t i = 0; i < ar->nspill; i++) {
        int64_t k = ar->spill_k[i], c = k / CHUNK;
        if (ar->special[c] || !E_FINITE(bcls[c])) continue; /* classified above */
        int64_t v = ar->spill_sig[i] * q[k] * mult[c];
        if (v) ok &= fp4d_sacc_add(&res->acc, v, ar->spill_exp[i] + bexp[c]);
    }
    if (any_nan || (pinf && ninf)) res->cls = E_NAN;
    else if (pinf) res->cls = E_PINF;
    else if (ninf) res->cls = E_NINF;
    else res->cls = E_POS;
    return ok;
}

/* alpha * dot, rounded once into fmt. */
static uint64_t finish(const dot_result *d, float alpha, const fp4d_float_format *fmt)
{
    uint32_t ab;
    memcpy(&ab, &alpha, 4);
    bool a_nan = (ab & 0x7FFFFFFFu) > 0x7F800000u;
    bool a_inf = (ab & 0x7FFFFFFFu) == 0x7F800000u;
    bool a_zero = (ab & 0x7FFFFFFFu) == 0;
    bool a_neg = ab >> 31;
    if (a_nan || d->cls == E_NAN) return fp4d_format_nan(fmt);
    if (E_INF(d->cls)) {
        if (a_zero) return fp4d_format_nan(fmt); /* Inf * 0 */
        return fp4d_format_inf(fmt, (d->cls == E_NINF) != a_neg);
    }
    if (a_inf) {
        if (fp4d_sacc_is_zero(&d->acc)) return fp4d_format_nan(fmt);
        bool s_neg = d->acc.limb[FP4D_SACC_LIMBS - 1] >> 63;
        return fp4d_format_inf(fmt, s_neg != a_neg);
    }
    return fp4d_sacc_round(&d->acc, alpha, fmt);
}

static const fp4d_float_format *out_format(fp4d_dtype t)
{
    switch (t) {
    case FP4D_DTYPE_F32: return &fp4d_format_f32;
    case FP4D_DTYPE_BF16: return &fp4d_format_bf16;
    case FP4D_DTYPE_F16: return &fp4d_format_f16;
    default: return NULL;
    }
}

static void store_elem(void *out, int64_t idx, fp4d_dtype t, uint64_t bits)
{
    if (t == FP4D_DTYPE_F32) {
        uint32_t v = (uint32_t)bits;
        memcpy((uint8_t *)out + 4 * idx, &v, 4);
    } else {
        uint16_t v = (uint16_t)bits;
        memcpy((uint8_t *)out + 2 * idx, &v, 2);
    }
}

/* ---- the whole output, threaded ------------------------------------------------------------- */

/* B decoded for a panel of rows [n0, n0 + rows). */
typedef struct b_panel {
    int64_t  n0, rows, K;
    int8_t  *q;    /* [rows][K] */
    int32_t *mult; /* [rows][chunks] */
    int16_t *exp;
    uint8_t *cls;
} b_panel;

typedef struct ref_job {
    const fp4d_matrix *a;
    const b_panel     *b;
    float              alpha;
    fp4d_dtype         out_type;
    void              *out;      /* [total rows][out_cols] */
    int64_t            out_cols; /* N */
    int64_t            m0, m1;   /* A rows */
    int64_t            j0, j1;   /* panel rows (relative) */
    fp4d_status        status;
} ref_job;

static void *ref_worker(void *arg)
{
    ref_job *job = arg;
    const b_panel *bp = job->b;
    int64_t K = bp->K, chunks = K / CHUNK;
    const fp4d_float_format *fmt = out_format(job->out_type);
    a_row ar;
    job->status = FP4D_STATUS_OK;
    if (!a_row_alloc(&ar, K)) {
        job->status = FP4D_STATUS_NOMEM;
        return NULL;
    }
    dot_result d;
    for (int64_t m = job->m0; m < job->m1; m++) {
        if (!decode_a_row(job->a, m, &ar)) {
            job->status = FP4D_STATUS_INTERNAL;
            break;
        }
        for (int64_t j = job->j0; j < job->j1; j++) {
            if (!dot_exact(&ar, K, bp->q + j * K, bp->mult + j * chunks, bp->exp + j * chunks,
                           bp->cls + j * chunks, &d)) {
                job->status = FP4D_STATUS_INTERNAL;
                break;
            }
            store_elem(job->out, m * job->out_cols + bp->n0 + j, job->out_type, finish(&d, job->alpha, fmt));
        }
    }
    a_row_free(&ar);
    return NULL;
}

static int ref_thread_count(double work)
{
    if (work < 1 << 20) return 1; /* not worth a thread */
    long n = fp4d_env_knob("FP4DOCTOR_REF_THREADS", 1, 1 << 20, sysconf(_SC_NPROCESSORS_ONLN));
    if (n < 1) n = 1;
    if (n > 64) n = 64;
    return (int)n;
}

/* Rows [m0, m1) of A (global row indices, also the output rows) times all of B. */
static fp4d_status ref_rows(const fp4d_matrix *A, int64_t m0, int64_t m1, const fp4d_matrix *B, float alpha,
                            fp4d_dtype out_type, void *out)
{
    int64_t M = m1 - m0, N = B->rows, K = A->cols, chunks = K / CHUNK;
    if (M <= 0) return FP4D_STATUS_OK;
    /* B is decoded in panels so the scratch stays bounded (about 16 MiB) for any N * K. */
    int64_t panel_rows = ((int64_t)16 << 20) / (K + 8 * chunks);
    if (panel_rows < 1) panel_rows = 1;
    if (panel_rows > N) panel_rows = N;

    b_panel bp = {0};
    bp.K = K;
    bp.q = malloc((size_t)(panel_rows * K));
    bp.mult = malloc((size_t)(panel_rows * chunks) * sizeof *bp.mult);
    bp.exp = malloc((size_t)(panel_rows * chunks) * sizeof *bp.exp);
    bp.cls = malloc((size_t)(panel_rows * chunks));
    fp4d_status status = FP4D_STATUS_OK;
    if (!bp.q || !bp.mult || !bp.exp || !bp.cls) status = fp4d_set_error(FP4D_STATUS_NOMEM, "ref: out of memory");

    for (int64_t n0 = 0; status == FP4D_STATUS_OK && n0 < N; n0 += panel_rows) {
        bp.n0 = n0;
        bp.rows = N - n0 < panel_rows ? N - n0 : panel_rows;
        for (int64_t j = 0; j < bp.rows; j++)
            if (!decode_fp4_row(B, n0 + j, bp.q + j * K, bp.mult + j * chunks, bp.exp + j * chunks,
                                bp.cls + j * chunks)) {
                status = fp4d_set_error(FP4D_STATUS_INTERNAL, "ref: B scale outside the exact integer range");
                break;
            }
        if (status != FP4D_STATUS_OK) break;

        int nthreads = ref_thread_count((double)M * (double)bp.rows * (double)K);
        ref_job jobs[64];
        pthread_t tids[64];
        bool started[64] = {false};
        bool split_rows = M >= nthreads;
        int64_t span = split_rows ? M : bp.rows;
        if (span < nthreads) nthreads = (int)span;
        for (int t = 0; t < nthreads; t++) {
            int64_t lo = span * t / nthreads, hi = span * (t + 1) / nthreads;
            jobs[t] = (ref_job){A, &bp, alpha, out_type, out, N,
                                split_rows ? m0 + lo : m0, split_rows ? m0 + hi : m1,
                                split_rows ? 0 : lo, split_rows ? bp.rows : hi, FP4D_STATUS_OK};
        }
        for (int t = 1; t < nthreads; t++)
            started[t] = pthread_create(&tids[t], NULL, ref_worker, &jobs[t]) == 0;
        ref_worker(&jobs[0]);
        for (int t = 1; t < nthreads; t++) {
            if (started[t]) pthread_join(tids[t], NULL);
            else ref_worker(&jobs[t]); /* could not start a thread: do its share here */
        }
        for (int t = 0; t < nthreads; t++)
            if (jobs[t].status != FP4D_STATUS_OK && status == FP4D_STATUS_OK)
                status = fp4d_set_error(jobs[t].status, "ref: %s while computing rows %lld..%lld",
                                        fp4d_status_str(jobs[t].status), (long long)jobs[t].m0,
                                        (long long)jobs[t].m1);
    }
    free(bp.q);
    free(bp.mult);
    free(bp.exp);
    free(bp.cls);
    return status;
}

/* ---- public entry points ------------------------------------------------------------------- */

fp4d_status fp4d_ref_gemm(const fp4d_gemm_problem *p)
{
    FP4D_FORWARD_IF_ERROR(fp4d_gemm_validate(p));
    return ref_rows(&p->a, 0, p->a.rows, &p->b, p->alpha, p->out_type, p->out);
}

fp4d_status fp4d_ref_grouped_gemm(const fp4d_grouped_gemm_problem *p)
{
    FP4D_FORWARD_IF_ERROR(fp4d_grouped_gemm_validate(p));
    for (int32_t e = 0; e < p->num_experts; e++)
        FP4D_FORWARD_IF_ERROR(ref_rows(&p->a, p->expert_offsets[e], p->expert_offsets[e + 1], &p->b[e],
                                       p->alpha[e], p->out_type, p->out));
    return FP4D_STATUS_OK;
}

fp4d_status fp4d_ref_gemm_element(const fp4d_gemm_problem *p, int64_t m, int64_t n, void *out_elem,
                                  double *exact_f64)
{
    FP4D_RETURN_ERROR_IF(!p || !out_elem, INVALID_ARG, "ref element: NULL problem or output");
    FP4D_RETURN_ERROR_IF(m < 0 || m >= p->a.rows || n < 0 || n >= p->b.rows, INVALID_ARG,
                         "ref element: (%lld, %lld) outside the [%lld, %lld] output", (long long)m, (long long)n,
                         (long long)p->a.rows, (long long)p->b.rows);
    const fp4d_float_format *fmt = out_format(p->out_type);
    FP4D_RETURN_ERROR_IF(!fmt, INVALID_ARG, "ref element: output type must be f32, bf16 or f16");
    const fp4d_dtype_traits *bt = fp4d_dtype_get(p->b.dtype);
    FP4D_RETURN_ERROR_IF(!bt || !bt->is_block_fp4 || !fp4d_dtype_get(p->a.dtype), INVALID_ARG,
                         "ref element: B must be nvfp4 or mxfp4");
    FP4D_RETURN_ERROR_IF(p->a.cols != p->b.cols || p->b.cols % (int64_t)bt->block_size != 0, INVALID_ARG,
                         "ref element: K mismatch or not a multiple of the block size");

    int64_t K = p->a.cols, chunks = K / CHUNK;
    a_row ar;
    FP4D_RETURN_ERROR_IF(!a_row_alloc(&ar, K), NOMEM, "ref element: out of memory");
    int8_t *q = malloc((size_t)K);
    int32_t *mult = malloc((size_t)chunks * sizeof *mult);
    int16_t *bexp = malloc((size_t)chunks * sizeof *bexp);
    uint8_t *bcls = malloc((size_t)chunks);
    fp4d_status status = FP4D_STATUS_OK;
    dot_result d;
    if (!q || !mult || !bexp || !bcls) {
        status = fp4d_set_error(FP4D_STATUS_NOMEM, "ref element: out of memory");
    } else if (!decode_a_row(&p->a, m, &ar) || !decode_fp4_row(&p->b, n, q, mult, bexp, bcls) ||
               !dot_exact(&ar, K, q, mult, bexp, bcls, &d)) {
        status = fp4d_set_error(FP4D_STATUS_INTERNAL, "ref element: value outside the exact range");
    } else {
        uint64_t bits = finish(&d, p->alpha, fmt);
        store_elem(out_elem, 0, p->out_type, bits);
        if (exact_f64) {
            uint64_t b64 = finish(&d, p->alpha, &fp4d_format_f64);
            memcpy(exact_f64, &b64, 8);
        }
    }
    free(q);
    free(mult);
    free(bexp);
    free(bcls);
    a_row_free(&ar);
    return status;
}
