/*
 * The CPU GEMM engine: operand decoding, threading and the GEMM strategies.
 *
 *   small M (decode-bound, e.g. M = 1 decode steps): every thread takes a range of weight
 *     rows and streams their packed FP4 bytes once per group of up to four activation rows,
 *     decoding them in registers and FMA-ing them against the activations. The weights are
 *     read as packed nibbles, 7x fewer bytes than f32.
 *   large M (compute-bound), SIMD: weight rows are decoded to f32 once per L2-sized block;
 *     tiles of dot products run along K over activation and weight rows in place (both
 *     operands are K-contiguous, so nothing needs transposing).
 *   large M, portable: BLIS-style packed panels and a register-blocked micro-kernel.
 *
 * All f32 inputs of the FMAs are exact decoded values, so every output element is an f32
 * dot product: |error| <= gamma_K * sum|a_k b_k| before the final alpha and output rounding.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cpu/cpu_internal.h"
#include "internal.h"
#include "out_elem.h"

/* ---- ISA selection -------------------------------------------------------------------- */

const char *fp4d_cpu_isa_name(fp4d_cpu_isa isa)
{
    switch (isa) {
    case FP4D_CPU_ISA_GENERIC: return "generic";
    case FP4D_CPU_ISA_AVX2: return "avx2";
    case FP4D_CPU_ISA_AVX512: return "avx512";
    default: return "unknown";
    }
}

bool fp4d_cpu_isa_available(fp4d_cpu_isa isa)
{
    if (isa == FP4D_CPU_ISA_GENERIC) return true;
    if (!fp4d_cpu_kernels_for(isa)) return false;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (isa == FP4D_CPU_ISA_AVX2) return avx2;
    if (isa == FP4D_CPU_ISA_AVX512)
        return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
#endif
    return false;
}

fp4d_cpu_isa fp4d_cpu_isa_detect(void)
{
    fp4d_cpu_isa best = FP4D_CPU_ISA_GENERIC;
    for (int i = FP4D_CPU_ISA_COUNT - 1; i > 0; i--)
        if (fp4d_cpu_isa_available((fp4d_cpu_isa)i)) {
            best = (fp4d_cpu_isa)i;
            break;
        }
    /* FP4DOCTOR_CPU_ISA can only lower the choice: asking for more than the CPU has
     * would crash with SIGILL. */
    const char *want = getenv("FP4DOCTOR_CPU_ISA");
    bool known = !want || !*want;
    for (int i = 0; !known && i < FP4D_CPU_ISA_COUNT; i++)
        if (!strcmp(want, fp4d_cpu_isa_name((fp4d_cpu_isa)i))) {
            known = true;
            if (i < (int)best) best = (fp4d_cpu_isa)i;
        }
    /* a typo ran the best kernels in silence, as if the variable were unset: said once */
    static atomic_flag warned = ATOMIC_FLAG_INIT;
    if (!known && !atomic_flag_test_and_set(&warned))
        fprintf(stderr, "fp4doctor: ignoring FP4DOCTOR_CPU_ISA=%.40s (expected generic, avx2 or avx512); using %s\n",
                want, fp4d_cpu_isa_name(best));
    return best;
}

const fp4d_cpu_kernels *fp4d_cpu_kernels_for(fp4d_cpu_isa isa)
{
    switch (isa) {
    case FP4D_CPU_ISA_AVX2: return fp4d_cpu_kernels_avx2();
    case FP4D_CPU_ISA_AVX512: return fp4d_cpu_kernels_avx512();
    default: return fp4d_cpu_kernels_generic();
    }
}

int fp4d_cpu_default_threads(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    n = n >= 1 ? (n > 1024 ? 1024 : n) : 1;
    return (int)fp4d_env_knob("FP4DOCTOR_THREADS", 1, 1024, n);
}

/* ---- operands ------------------------------------------------------------------------- */

void fp4d_cpu_operand_init(fp4d_cpu_operand *op, const fp4d_matrix *x, int64_t row_offset, int64_t rows,
                           int64_t scale_rows)
{
    const fp4d_dtype_traits *t = fp4d_dtype_get(x->dtype);
    memset(op, 0, sizeof *op);
    op->dtype = x->dtype;
    op->rows  = rows;
    op->cols  = x->cols;
    op->data  = (const uint8_t *)x->data + (size_t)row_offset * (size_t)x->cols * t->element_bits / 8;
    if (!t->is_block_fp4) return;
    op->scales           = x->scales;
    op->read_layout      = x->scale_layout;
    op->scale_row_offset = row_offset;
    op->scale_rows       = scale_rows;
    op->block_size       = t->block_size;
    op->scale_cols       = x->cols / t->block_size;
    op->scale_bytes      = fp4d_scale_buffer_size(x->scale_layout, scale_rows, op->scale_cols);
    for (int b = 0; b < 256; b++) {
        op->scale_lut[b]      = t->scale_to_f32((uint8_t)b);
        op->scale_half_lut[b] = op->scale_lut[b] * 0.5f; /* exact, down to ue8m0's 2^-128 */
    }
}

/* Where row r's scales live: scale (r, c) at base + (c >> 2 << shift) + (c & 3). Returns
 * whether the whole row lies inside the buffer. */
static bool scale_row_geometry(const fp4d_cpu_operand *op, int64_t r, int64_t *base, int *shift)
{
    const int64_t rr = op->scale_row_offset + r, cols = op->scale_cols;
    switch (op->read_layout) {
    case FP4D_LAYOUT_SWIZZLED_128X4:
        *base  = (int64_t)fp4d_cpu_scale_offset(op->read_layout, op->scale_rows, cols, rr, 0);
        *shift = 9; /* 512-byte 128x4 tiles */
        break;
    case FP4D_LAYOUT_SWIZZLED_8X4:
        *base  = (int64_t)fp4d_cpu_scale_offset(op->read_layout, op->scale_rows, cols, rr, 0);
        *shift = 5; /* 32-byte 8x4 tiles */
        break;
    default:
        *base  = rr * cols;
        *shift = 2;
        break;
    }
    return *base + (((cols - 1) >> 2) << *shift) + ((cols - 1) & 3) < (int64_t)op->scale_bytes;
}

/* Only a twisted read (faulty-linear-scales) can land outside the buffer; it reads the 0x00
 * that padding would hold rather than someone else's memory. */
static inline uint8_t scale_byte_checked(const fp4d_cpu_operand *op, int64_t base, int shift, int64_t c)
{
    int64_t off = base + ((c >> 2) << shift) + (c & 3);
    return off < (int64_t)op->scale_bytes ? op->scales[off] : 0;
}

const uint8_t *fp4d_cpu_scale_row(const fp4d_cpu_operand *op, int64_t r, uint8_t *scratch, int *quad_shift)
{
    int64_t base;
    int     shift;
    if (scale_row_geometry(op, r, &base, &shift)) {
        *quad_shift = shift;
        return op->scales + base;
    }
    for (int64_t c = 0; c < op->scale_cols; c++) scratch[c] = scale_byte_checked(op, base, shift, c);
    *quad_shift = 2;
    return scratch;
}

void fp4d_cpu_gather_scales16(const fp4d_cpu_operand *op, int64_t r, int64_t g0, int64_t g1, float *scale16)
{
    int64_t   base;
    int       qs;
    const int per_shift = op->block_size == 32 ? 1 : 0;
    if (scale_row_geometry(op, r, &base, &qs)) {
        const uint8_t *row = op->scales + base;
        for (int64_t g = g0; g < g1; g++) {
            int64_t c       = g >> per_shift;
            scale16[g - g0] = op->scale_lut[row[((c >> 2) << qs) + (c & 3)]];
        }
        return;
    }
    for (int64_t g = g0; g < g1; g++) scale16[g - g0] = op->scale_lut[scale_byte_checked(op, base, qs, g >> per_shift)];
}

/* Row r of op (cols [0, K)) as f32. scale16: K/16 floats of scratch. */
static void operand_row_to_f32(const fp4d_cpu_kernels *kern, const fp4d_cpu_operand *op, int64_t r,
                               float *scale16, float *dst)
{
    const int64_t k = op->cols;
    switch (op->dtype) {
    case FP4D_DTYPE_NVFP4:
    case FP4D_DTYPE_MXFP4:
        fp4d_cpu_gather_scales16(op, r, 0, k / 16, scale16);
        kern->decode((const uint8_t *)op->data + r * (k / 2), scale16, k / 16, op->nibble_swap, dst);
        break;
    case FP4D_DTYPE_F32: memcpy(dst, (const float *)op->data + r * k, (size_t)k * sizeof(float)); break;
    default:
        fp4d_to_f32(op->dtype, (const uint16_t *)op->data + r * k, (size_t)k, dst);
        break;
    }
}

/* ---- threads -------------------------------------------------------------------------- */

typedef void (*par_fn)(void *ctx, int tid, int nthreads);

typedef struct par_job {
    par_fn fn;
    void  *ctx;
    int    tid, nthreads;
} par_job;

static void *par_trampoline(void *arg)
{
    par_job *j = arg;
    j->fn(j->ctx, j->tid, j->nthreads);
    return NULL;
}

/* Runs fn(ctx, tid, nthreads) for every tid, tid 0 on the calling thread. A thread that
 * cannot be created has its share run by the caller, so the work always completes. */
static void run_parallel(int nthreads, par_fn fn, void *ctx)
{
    if (nthreads <= 1) {
        fn(ctx, 0, 1);
        return;
    }
    pthread_t *th      = calloc((size_t)nthreads, sizeof *th);
    par_job   *jobs    = calloc((size_t)nthreads, sizeof *jobs);
    bool      *started = calloc((size_t)nthreads, sizeof *started);
    if (!th || !jobs || !started) {
        for (int t = 0; t < nthreads; t++) fn(ctx, t, nthreads);
        free(th), free(jobs), free(started);
        return;
    }
    for (int t = 1; t < nthreads; t++) {
        jobs[t]    = (par_job){fn, ctx, t, nthreads};
        started[t] = pthread_create(&th[t], NULL, par_trampoline, &jobs[t]) == 0;
    }
    fn(ctx, 0, nthreads);
    for (int t = 1; t < nthreads; t++) {
        if (started[t]) pthread_join(th[t], NULL);
        else fn(ctx, t, nthreads);
    }
    free(th), free(jobs), free(started);
}

static void split_range(int64_t total, int64_t align, int tid, int nthreads, int64_t *lo, int64_t *hi)
{
    int64_t units = (total + align - 1) / align;
    int64_t per = units / nthreads, extra = units % nthreads;
    int64_t u0 = tid * per + (tid < extra ? tid : extra);
    int64_t u1 = u0 + per + (tid < extra ? 1 : 0);
    *lo = u0 * align < total ? u0 * align : total;
    *hi = u1 * align < total ? u1 * align : total;
}

/* ---- A to f32 ------------------------------------------------------------------------- */

typedef struct a_job {
    const fp4d_cpu_kernels *kern;
    const fp4d_cpu_operand *a;
    float                  *dst;
    float                 **scratch; /* per thread, K/16 floats */
} a_job;

static void a_to_f32_worker(void *ctx, int tid, int nt)
{
    a_job  *j = ctx;
    int64_t lo, hi;
    split_range(j->a->rows, 1, tid, nt, &lo, &hi);
    for (int64_t r = lo; r < hi; r++)
        operand_row_to_f32(j->kern, j->a, r, j->scratch[tid], j->dst + r * j->a->cols);
}

/* ---- small M -------------------------------------------------------------------------- */

enum { SMALLM_NCHUNK = 256, SMALLM_ROWS = 4 };

typedef struct smallm_job {
    const fp4d_cpu_gemm    *g;
    const fp4d_cpu_kernels *kern;
    const float            *af;
    float                 **scale16; /* per thread */
    float                 **acc;     /* per thread, SMALLM_ROWS * SMALLM_NCHUNK */
} smallm_job;

static void smallm_worker(void *ctx, int tid, int nt)
{
    smallm_job          *j = ctx;
    const fp4d_cpu_gemm *g = j->g;
    int64_t              lo, hi;
    split_range(g->n, 8, tid, nt, &lo, &hi);
    for (int64_t n0 = lo; n0 < hi; n0 += SMALLM_NCHUNK) {
        int64_t n1 = n0 + SMALLM_NCHUNK < hi ? n0 + SMALLM_NCHUNK : hi;
        for (int64_t i = 0; i < g->m; i += SMALLM_ROWS) {
            int mrows = (int)(g->m - i < SMALLM_ROWS ? g->m - i : SMALLM_ROWS);
            j->kern->smallm(j->af + i * g->k, mrows, g->k, &g->b, n0, n1, j->scale16[tid], j->acc[tid],
                            SMALLM_NCHUNK);
            for (int r = 0; r < mrows; r++)
                for (int64_t n = n0; n < n1; n++)
                    fp4d_out_elem_set(g->out_type, g->out, (i + r) * g->n + n,
                              g->alpha * j->acc[tid][r * SMALLM_NCHUNK + (n - n0)]);
        }
    }
}

/* ---- bf16 accumulation (faulty-bf16-accum only) ---------------------------------------- */

static inline float round_to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return x;
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

typedef struct bf16acc_job {
    const fp4d_cpu_gemm    *g;
    const fp4d_cpu_kernels *kern;
    const float            *af;
    float                 **scale16, **wrow;
} bf16acc_job;

static void bf16acc_worker(void *ctx, int tid, int nt)
{
    bf16acc_job         *j = ctx;
    const fp4d_cpu_gemm *g = j->g;
    int64_t              lo, hi;
    split_range(g->n, 1, tid, nt, &lo, &hi);
    for (int64_t n = lo; n < hi; n++) {
        operand_row_to_f32(j->kern, &g->b, n, j->scale16[tid], j->wrow[tid]);
        for (int64_t i = 0; i < g->m; i++) {
            const float *ai  = j->af + i * g->k;
            float        acc = 0.0f;
            for (int64_t kk = 0; kk < g->k; kk++) acc = round_to_bf16(acc + ai[kk] * j->wrow[tid][kk]);
            fp4d_out_elem_set(g->out_type, g->out, i * g->n + n, g->alpha * acc);
        }
    }
}

/* ---- large M: packed, blocked --------------------------------------------------------- */

typedef struct blocked_job {
    const fp4d_cpu_gemm    *g;
    const fp4d_cpu_kernels *kern;
    const float            *af;
    float                  *c;   /* f32 [m, n]: out itself when out is f32 */
    bool                    split_n;
    float                 **ap, **bp, **tmp, **scale16; /* per thread */
} blocked_job;

/* Decodes weight rows [n0, n0 + ncur) x K [pc, pc + kcur) into NR-wide k-major panels. */
static void pack_b(const blocked_job *j, int tid, int64_t n0, int64_t ncur, int64_t pc, int64_t kcur)
{
    const fp4d_cpu_gemm    *g    = j->g;
    const fp4d_cpu_kernels *kern = j->kern;
    const int               nr   = kern->nr;
    const uint8_t          *codes = g->b.data;
    float                  *tmp = j->tmp[tid], *bp = j->bp[tid];
    for (int64_t p = 0; p < ncur; p += nr) {
        for (int r = 0; r < nr; r++) {
            int64_t n = n0 + p + r;
            if (p + r < ncur) {
                fp4d_cpu_gather_scales16(&g->b, n, pc / 16, (pc + kcur) / 16, j->scale16[tid]);
                kern->decode(codes + n * (g->k / 2) + pc / 2, j->scale16[tid], kcur / 16, g->b.nibble_swap,
                             tmp + r * kcur);
            } else {
                memset(tmp + r * kcur, 0, (size_t)kcur * sizeof(float));
            }
        }
        float *panel = bp + p * kcur;
        for (int64_t kk = 0; kk < kcur; kk++)
            for (int r = 0; r < nr; r++) panel[kk * nr + r] = tmp[r * kcur + kk];
    }
}

static void pack_a(const blocked_job *j, int tid, int64_t m0, int64_t mcur, int64_t pc, int64_t kcur)
{
    const int64_t k  = j->g->k;
    const int     mr = j->kern->mr;
    float        *ap = j->ap[tid];
    for (int64_t p = 0; p < mcur; p += mr) {
        float *panel = ap + p * kcur;
        for (int i = 0; i < mr; i++) {
            if (p + i < mcur) {
                const float *src = j->af + (m0 + p + i) * k + pc;
                for (int64_t kk = 0; kk < kcur; kk++) panel[kk * mr + i] = src[kk];
            } else {
                for (int64_t kk = 0; kk < kcur; kk++) panel[kk * mr + i] = 0.0f;
            }
        }
    }
}

static void blocked_worker(void *ctx, int tid, int nt)
{
    blocked_job            *j = ctx;
    const fp4d_cpu_gemm    *g = j->g;
    const fp4d_cpu_kernels *kern = j->kern;
    int64_t                 m_lo = 0, m_hi = g->m, n_lo = 0, n_hi = g->n;
    if (j->split_n) split_range(g->n, kern->nr, tid, nt, &n_lo, &n_hi);
    else split_range(g->m, kern->mr, tid, nt, &m_lo, &m_hi);
    if (m_lo >= m_hi || n_lo >= n_hi) return;
    const int64_t ldc = g->n;
    for (int64_t jc = n_lo; jc < n_hi; jc += kern->nc) {
        int64_t ncur = n_hi - jc < kern->nc ? n_hi - jc : kern->nc;
        for (int64_t pc = 0; pc < g->k; pc += kern->kc) {
            int64_t kcur = g->k - pc < kern->kc ? g->k - pc : kern->kc;
            pack_b(j, tid, jc, ncur, pc, kcur);
            for (int64_t ic = m_lo; ic < m_hi; ic += kern->mc) {
                int64_t mcur = m_hi - ic < kern->mc ? m_hi - ic : kern->mc;
                pack_a(j, tid, ic, mcur, pc, kcur);
                for (int64_t jr = 0; jr < ncur; jr += kern->nr) {
                    int nr = (int)(ncur - jr < kern->nr ? ncur - jr : kern->nr);
                    for (int64_t ir = 0; ir < mcur; ir += kern->mr) {
                        int mr = (int)(mcur - ir < kern->mr ? mcur - ir : kern->mr);
                        kern->ukernel(kcur, j->ap[tid] + ir * kcur, j->bp[tid] + jr * kcur,
                                      j->c + (ic + ir) * ldc + jc + jr, ldc, pc > 0, mr, nr);
                    }
                }
            }
        }
        /* The block's sums are complete: apply alpha and round into the output type. */
        for (int64_t i = m_lo; i < m_hi; i++)
            for (int64_t n = jc; n < jc + ncur; n++)
                fp4d_out_elem_set(g->out_type, g->out, i * g->n + n, g->alpha * j->c[i * ldc + n]);
    }
}

/* ---- large M: dot-product tiles over decoded weight rows ------------------------------- */

/* Both operands are K-contiguous, so 4 x 4 tiles of dot products need no transposed
 * panels at all: weight rows are decoded to f32 once per (dot_nc x dot_kc) block into an
 * L2-sized buffer, activation rows are read in place. */
typedef struct dot_job {
    const fp4d_cpu_gemm    *g;
    const fp4d_cpu_kernels *kern;
    const float            *af;
    float                  *c;
    bool                    split_n;
    float                 **bf, **scale16; /* per thread */
} dot_job;

/* Row strides of the decoded weight block and the activation tile: kc plus 16 floats, so
 * that the eight rows a tile streams do not all fall into the same L1 sets (4 KiB aliasing). */
static inline int64_t dot_stride(int64_t kc) { return kc + 16; }

static void dot_worker(void *ctx, int tid, int nt)
{
    dot_job                *j = ctx;
    const fp4d_cpu_gemm    *g = j->g;
    const fp4d_cpu_kernels *kern = j->kern;
    int64_t                 m_lo = 0, m_hi = g->m, n_lo = 0, n_hi = g->n;
    const int               MR = kern->dot_mr, NR = kern->dot_nr;
    if (j->split_n) split_range(g->n, NR, tid, nt, &n_lo, &n_hi);
    else split_range(g->m, MR, tid, nt, &m_lo, &m_hi);
    if (m_lo >= m_hi || n_lo >= n_hi) return;
    const int64_t  k = g->k, ldc = g->n, ld = dot_stride(kern->dot_kc);
    const uint8_t *codes = g->b.data;
    float         *bf = j->bf[tid], *at = j->bf[tid] + kern->dot_nc * ld;
    for (int64_t jc = n_lo; jc < n_hi; jc += kern->dot_nc) {
        int64_t ncur = n_hi - jc < kern->dot_nc ? n_hi - jc : kern->dot_nc;
        for (int64_t pc = 0; pc < k; pc += kern->dot_kc) {
            int64_t kcur = k - pc < kern->dot_kc ? k - pc : kern->dot_kc;
            for (int64_t r = 0; r < ncur; r++) {
                fp4d_cpu_gather_scales16(&g->b, jc + r, pc / 16, (pc + kcur) / 16, j->scale16[tid]);
                kern->decode(codes + (jc + r) * (k / 2) + pc / 2, j->scale16[tid], kcur / 16, g->b.nibble_swap,
                             bf + r * ld);
            }
            for (int64_t i = m_lo; i < m_hi; i += MR) {
                int          mr = (int)(m_hi - i < MR ? m_hi - i : MR);
                const float *a[4] = {NULL, NULL, NULL, NULL};
                /* The activation tile, copied to padded rows; rows past the end repeat the
                 * last one and their sums are not stored. */
                for (int t = 0; t < MR; t++) {
                    if (t < mr) memcpy(at + t * ld, j->af + (i + t) * k + pc, (size_t)kcur * sizeof(float));
                    a[t] = at + (t < mr ? t : mr - 1) * ld;
                }
                for (int64_t jj = 0; jj < ncur; jj += NR) {
                    int          nr = (int)(ncur - jj < NR ? ncur - jj : NR);
                    const float *b[4] = {NULL, NULL, NULL, NULL};
                    for (int u = 0; u < NR; u++) b[u] = bf + (jj + (u < nr ? u : nr - 1)) * ld;
                    kern->dot4x4(a, b, kcur, j->c + i * ldc + jc + jj, ldc, pc > 0, mr, nr);
                }
            }
        }
        for (int64_t i = m_lo; i < m_hi; i++)
            for (int64_t n = jc; n < jc + ncur; n++)
                fp4d_out_elem_set(g->out_type, g->out, i * g->n + n, g->alpha * j->c[i * ldc + n]);
    }
}

/* ---- entry ---------------------------------------------------------------------------- */

/* Below this many activation rows the small-M kernel (decode on the fly) beats packing. */
enum { SMALLM_LIMIT = 16 };

static float **alloc_per_thread(int nt, size_t floats)
{
    float **v = calloc((size_t)nt, sizeof *v);
    if (!v) return NULL;
    for (int t = 0; t < nt; t++) {
        /* 64-byte alignment keeps packed panels on cache lines (and AVX-512 loads aligned). */
        if (posix_memalign((void **)&v[t], 64, (floats ? floats : 1) * sizeof(float)) != 0) {
            for (int u = 0; u < t; u++) free(v[u]);
            free(v);
            return NULL;
        }
    }
    return v;
}

static void free_per_thread(float **v, int nt)
{
    if (!v) return;
    for (int t = 0; t < nt; t++) free(v[t]);
    free(v);
}

fp4d_status fp4d_cpu_gemm_run(const fp4d_cpu_gemm *g, fp4d_cpu_isa isa, int threads)
{
    const fp4d_cpu_kernels *kern = fp4d_cpu_kernels_for(isa);
    if (!kern) kern = fp4d_cpu_kernels_generic();
    FP4D_RETURN_ERROR_IF(g->b.dtype != FP4D_DTYPE_NVFP4 && g->b.dtype != FP4D_DTYPE_MXFP4, UNSUPPORTED,
                         "cpu: B must be nvfp4 or mxfp4");
    FP4D_RETURN_ERROR_IF(g->k % 16 != 0, INVALID_ARG, "cpu: K must be a multiple of 16");
    if (g->m == 0 || g->n == 0) return FP4D_STATUS_OK;
    if (threads < 1) threads = 1;

    fp4d_status status = FP4D_STATUS_OK;
    int         nt_a   = threads;
    float     **sc_a   = NULL;
    float      *af_own = NULL;
    const float *af;
    /* Activations become f32 once (an f32 A is used in place). */
    if (g->a.dtype == FP4D_DTYPE_F32) {
        af = g->a.data;
    } else {
        af_own = malloc((size_t)g->m * (size_t)g->k * sizeof(float));
        if (g->m < 64) nt_a = 1;
        sc_a = alloc_per_thread(nt_a, (size_t)g->k / 16 + 1);
        if (!af_own || !sc_a) {
            free(af_own);
            free_per_thread(sc_a, nt_a);
            return fp4d_set_error(FP4D_STATUS_NOMEM, "cpu: out of memory converting A");
        }
        a_job aj = {kern, &g->a, af_own, sc_a};
        run_parallel(nt_a, a_to_f32_worker, &aj);
        free_per_thread(sc_a, nt_a);
        af = af_own;
    }

    if (g->bf16_accumulate) {
        int     nt = g->n < threads ? (int)g->n : threads;
        float **s16 = alloc_per_thread(nt, (size_t)g->k / 16 + 1), **w = alloc_per_thread(nt, (size_t)g->k);
        if (!s16 || !w) {
            status = fp4d_set_error(FP4D_STATUS_NOMEM, "cpu: out of memory");
        } else {
            bf16acc_job j = {g, fp4d_cpu_kernels_generic(), af, s16, w};
            run_parallel(nt, bf16acc_worker, &j);
        }
        free_per_thread(s16, nt);
        free_per_thread(w, nt);
    } else if (g->m < SMALLM_LIMIT) {
        int64_t units = (g->n + 7) / 8;
        int     nt    = units < threads ? (int)units : threads;
        float **s16 = alloc_per_thread(nt, (size_t)g->k / 16 + 1);
        float **acc = alloc_per_thread(nt, SMALLM_ROWS * SMALLM_NCHUNK);
        if (!s16 || !acc) {
            status = fp4d_set_error(FP4D_STATUS_NOMEM, "cpu: out of memory");
        } else {
            smallm_job j = {g, kern, af, s16, acc};
            run_parallel(nt, smallm_worker, &j);
        }
        free_per_thread(s16, nt);
        free_per_thread(acc, nt);
    } else if (kern->dot4x4) {
        bool    split_n = g->n >= (int64_t)threads * 64;
        int64_t units   = split_n ? (g->n + kern->dot_nr - 1) / kern->dot_nr : (g->m + kern->dot_mr - 1) / kern->dot_mr;
        int     nt      = units < threads ? (int)units : threads;
        float  *c_own   = NULL;
        float  *c       = g->out_type == FP4D_DTYPE_F32 ? g->out : NULL;
        if (!c) c = c_own = malloc((size_t)g->m * (size_t)g->n * sizeof(float));
        /* per thread: the decoded weight block and the 4-row activation tile */
        float **bf  = alloc_per_thread(nt, (size_t)((kern->dot_nc + 4) * dot_stride(kern->dot_kc)));
        float **s16 = alloc_per_thread(nt, (size_t)kern->dot_kc / 16 + 1);
        if (!c || !bf || !s16) {
            status = fp4d_set_error(FP4D_STATUS_NOMEM, "cpu: out of memory");
        } else {
            dot_job j = {g, kern, af, c, split_n, bf, s16};
            run_parallel(nt, dot_worker, &j);
        }
        free(c_own);
        free_per_thread(bf, nt);
        free_per_thread(s16, nt);
    } else {
        /* Split the weights between threads when there are enough of them (each thread then
         * decodes only its own panels); otherwise split the activation rows. */
        bool    split_n = g->n >= (int64_t)threads * kern->nr * 4;
        int64_t units   = split_n ? (g->n + kern->nr - 1) / kern->nr : (g->m + kern->mr - 1) / kern->mr;
        int     nt      = units < threads ? (int)units : threads;
        float  *c_own   = NULL;
        float  *c       = g->out_type == FP4D_DTYPE_F32 ? g->out : NULL;
        if (!c) c = c_own = malloc((size_t)g->m * (size_t)g->n * sizeof(float));
        int64_t ncap = kern->nc + kern->nr, mcap = kern->mc + kern->mr;
        float **ap = alloc_per_thread(nt, (size_t)(mcap * kern->kc));
        float **bp = alloc_per_thread(nt, (size_t)(ncap * kern->kc));
        float **tmp = alloc_per_thread(nt, (size_t)(kern->nr * kern->kc));
        float **s16 = alloc_per_thread(nt, (size_t)kern->kc / 16 + 1);
        if (!c || !ap || !bp || !tmp || !s16) {
            status = fp4d_set_error(FP4D_STATUS_NOMEM, "cpu: out of memory");
        } else {
            blocked_job j = {g, kern, af, c, split_n, ap, bp, tmp, s16};
            run_parallel(nt, blocked_worker, &j);
        }
        free(c_own);
        free_per_thread(ap, nt);
        free_per_thread(bp, nt);
        free_per_thread(tmp, nt);
        free_per_thread(s16, nt);
    }
    free(af_own);
    return status;
}

fp4d_status fp4d_cpu_run_problem(const fp4d_gemm_problem *p, fp4d_cpu_isa isa, int threads)
{
    fp4d_cpu_gemm g;
    memset(&g, 0, sizeof g);
    fp4d_cpu_operand_init(&g.a, &p->a, 0, p->a.rows, p->a.rows);
    fp4d_cpu_operand_init(&g.b, &p->b, 0, p->b.rows, p->b.rows);
    g.m        = p->a.rows;
    g.n        = p->b.rows;
    g.k        = p->a.cols;
    g.alpha    = p->alpha;
    g.out_type = p->out_type;
    g.out      = p->out;
    return fp4d_cpu_gemm_run(&g, isa, threads);
}

fp4d_status fp4d_cpu_run_grouped(const fp4d_grouped_gemm_problem *p, fp4d_cpu_isa isa, int threads)
{
    const size_t   out_row_bytes = (size_t)p->b[0].rows * fp4d_out_elem_size(p->out_type);
    fp4d_cpu_gemm *g = malloc(sizeof *g);
    FP4D_RETURN_ERROR_IF(!g, NOMEM, "cpu: out of memory");
    fp4d_status status = FP4D_STATUS_OK;
    for (int32_t e = 0; e < p->num_experts && status == FP4D_STATUS_OK; e++) {
        int64_t r0 = p->expert_offsets[e], rows = p->expert_offsets[e + 1] - r0;
        if (rows == 0) continue; /* an expert no token was routed to */
        memset(g, 0, sizeof *g);
        /* A's scales form one matrix over all rows: this expert reads its slice of it. */
        fp4d_cpu_operand_init(&g->a, &p->a, r0, rows, p->a.rows);
        fp4d_cpu_operand_init(&g->b, &p->b[e], 0, p->b[e].rows, p->b[e].rows);
        g->m        = rows;
        g->n        = p->b[e].rows;
        g->k        = p->a.cols;
        g->alpha    = p->alpha[e];
        g->out_type = p->out_type;
        g->out      = (uint8_t *)p->out + (size_t)r0 * out_row_bytes;
        status      = fp4d_cpu_gemm_run(g, isa, threads);
    }
    free(g);
    return status;
}
