/*
 * GPU backends against the exact reference: `cuda` (own kernels, every path: gemv, decode,
 * skinny, fused, tiled, simt, grouped, quantize), `cublas-bf16`, and `cublaslt` / `cudnn` where their
 * libraries say they run. Fresh random operands every case, NaN-poisoned outputs (an
 * element left unwritten shows up as NaN), all activation types, scale layouts, output
 * types and odd M/N/K. Every test skips itself on a machine without a usable GPU.
 *
 * Tolerance: the backends accumulate in f32 (tensor cores or FMA), so an element may
 * differ from the exactly rounded reference by the f32 accumulation bound
 * K * 2^-23 * sum_k |a_k b_k| * |alpha|, plus one unit in the last place of the output
 * type (the f32 result is rounded once more).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fp4doctor/backend.h"
#include "fp4doctor/doctor.h"
#include "fp4doctor/formats.h"
#include "fp4doctor/gemm.h"
#include "fp4doctor/ref.h"
#ifdef FP4D_TEST_CUDA_KERNELS
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/kernels.h"
#include "backend/gpu_info.h"
#include "common/env_knob.h"
#endif

/* ---- random operands ------------------------------------------------------------------ */

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}
static float rnd_unit(void) { return (float)(rnd() % 2000001u) / 1000000.0f - 1.0f; } /* [-1, 1] */

typedef struct operand {
    fp4d_matrix m;
    void       *data;
    uint8_t    *scales;
} operand;

/* Random FP4 codes with moderate, valid block scales. */
static void make_fp4(operand *o, fp4d_dtype t, fp4d_scale_layout layout, int64_t rows, int64_t cols)
{
    const fp4d_dtype_traits *tr = fp4d_dtype_get(t);
    const int64_t sc = cols / tr->block_size;
    o->data = malloc((size_t)(rows * cols / 2) + 1);
    const size_t sb = fp4d_scale_buffer_size(layout, rows, sc);
    o->scales = calloc(sb + 1, 1);
    assert_non_null(o->data);
    assert_non_null(o->scales);
    for (int64_t i = 0; i < rows * cols / 2; i++) ((uint8_t *)o->data)[i] = (uint8_t)rnd();
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < sc; c++) {
            /* NVFP4: e4m3 bytes 0x01..0x57 (subnormal 2^-9 up to 16); MXFP4: 2^-6 .. 2^5 */
            const uint8_t b = t == FP4D_DTYPE_NVFP4 ? (uint8_t)(1 + rnd() % 0x57) : (uint8_t)(121 + rnd() % 12);
            o->scales[fp4d_scale_offset(layout, rows, sc, r, c)] = b;
        }
    o->m = (fp4d_matrix){t, rows, cols, o->data, o->scales, layout};
}

static void make_plain(operand *o, fp4d_dtype t, int64_t rows, int64_t cols)
{
    const size_t n = (size_t)(rows * cols);
    float *f = malloc(n * sizeof *f);
    assert_non_null(f);
    for (size_t i = 0; i < n; i++) f[i] = rnd_unit() * 3.0f;
    o->data = malloc(n * 4);
    assert_non_null(o->data);
    fp4d_from_f32(t, f, n, o->data);
    free(f);
    o->scales = NULL;
    o->m = (fp4d_matrix){t, rows, cols, o->data, NULL, FP4D_LAYOUT_LINEAR};
}

static void make_operand(operand *o, fp4d_dtype t, fp4d_scale_layout layout, int64_t rows, int64_t cols)
{
    if (t == FP4D_DTYPE_NVFP4 || t == FP4D_DTYPE_MXFP4) make_fp4(o, t, layout, rows, cols);
    else make_plain(o, t, rows, cols);
}

static void free_operand(operand *o)
{
    free(o->data);
    free(o->scales);
}

/* Dequantized f32 copy of an operand (for the error bound). */
static float *to_f32(const fp4d_matrix *m)
{
    float *f = malloc((size_t)(m->rows * m->cols) * sizeof *f + 4);
    assert_non_null(f);
    if (m->dtype == FP4D_DTYPE_NVFP4 || m->dtype == FP4D_DTYPE_MXFP4)
        assert_int_equal(fp4d_dequantize(m->dtype, m->scale_layout, m->data, m->scales, 1.0f, m->rows, m->cols, f),
                         FP4D_STATUS_OK);
    else
        fp4d_to_f32(m->dtype, m->data, (size_t)(m->rows * m->cols), f);
    return f;
}

static float out_value(fp4d_dtype t, const void *out, size_t i)
{
    float v;
    fp4d_to_f32(t, (const uint8_t *)out + i * fp4d_out_elem_size(t), 1, &v);
    return v;
}

static void poison(fp4d_dtype t, void *out, size_t count)
{
    /* quiet NaN in every output type: 0xFFFF is NaN in bf16 and f16, 0xFFFFFFFF in f32 */
    memset(out, 0xFF, count * fp4d_out_elem_size(t));
}

/* Compares got with the exact reference; returns the number of bad elements. */
static int compare(const char *label, const fp4d_gemm_problem *p, const void *got, const void *ref,
                   const float *af, const float *bf, int64_t row_base)
{
    const int64_t M = p->a.rows, N = p->b.rows, K = p->a.cols;
    const double ulp = p->out_type == FP4D_DTYPE_F32 ? 0x1p-23 : p->out_type == FP4D_DTYPE_BF16 ? 0x1p-7 : 0x1p-10;
    int bad = 0;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            const size_t i = (size_t)(m * N + n);
            const float g = out_value(p->out_type, got, i), r = out_value(p->out_type, ref, i);
            double mag = 0.0;
            for (int64_t k = 0; k < K; k++) mag += fabs((double)af[(row_base + m) * K + k] * (double)bf[n * K + k]);
            const double tol = (double)K * 0x1p-23 * mag * fabs((double)p->alpha) + 2.0 * ulp * fabs((double)r) + 1e-30;
            /* an overflow to +-inf in the output type must match exactly */
            const bool ok = isnan(r) ? isnan(g) : isinf(r) ? g == r : (!isnan(g) && fabs((double)g - (double)r) <= tol);
            if (!ok && bad++ < 5)
                fprintf(stderr, "  %s: out[%lld,%lld] = %.9g, reference %.9g (tolerance %.3g)\n", label, (long long)m,
                        (long long)n, (double)g, (double)r, tol);
        }
    return bad;
}

/* ---- fixtures -------------------------------------------------------------------------- */

static fp4d_backend_t open_or_skip(const char *name)
{
    fp4d_backend_t b = NULL;
    fp4d_reason why;
    fp4d_status st = fp4d_backend_open(name, 0, &b, &why);
    if (st != FP4D_STATUS_OK) {
        fprintf(stderr, "  %s unavailable: %s\n", name, why.text);
        return NULL;
    }
    return b;
}

/* When >= 0: weight row whose second scale block is set to a NaN scale byte (the output
 * column must be NaN, as in the reference). */
static int64_t nan_scale_row = -1;

/* One GEMM case on backend b; returns bad element count (0 = pass). -1 = unsupported. */
static int run_case(fp4d_backend_t b, fp4d_dtype at, fp4d_dtype bt, fp4d_scale_layout al, fp4d_scale_layout bl,
                    fp4d_dtype ot, int64_t M, int64_t N, int64_t K)
{
    operand A, B;
    make_operand(&A, at, al, M, K);
    make_operand(&B, bt, bl, N, K);
    if (nan_scale_row >= 0 && nan_scale_row < N && K / fp4d_dtype_get(bt)->block_size > 1)
        B.scales[fp4d_scale_offset(bl, N, K / fp4d_dtype_get(bt)->block_size, nan_scale_row, 1)] =
            bt == FP4D_DTYPE_NVFP4 ? 0x80 : 0xFF;
    const size_t count = (size_t)(M * N);
    void *got = malloc(count * 4), *ref = malloc(count * 4);
    assert_non_null(got);
    assert_non_null(ref);
    fp4d_gemm_problem p = {A.m, B.m, 0.75f, ot, got};
    poison(ot, got, count);
    fp4d_reason why = {{0}};
    fp4d_status st = fp4d_backend_gemm(b, &p, &why);
    int bad;
    char label[160];
    snprintf(label, sizeof label, "%s x %s %s/%s -> %s M=%lld N=%lld K=%lld", fp4d_dtype_get(at)->name,
             fp4d_dtype_get(bt)->name, fp4d_scale_layout_name(al), fp4d_scale_layout_name(bl), fp4d_dtype_get(ot)->name,
             (long long)M, (long long)N, (long long)K);
    if (st == FP4D_STATUS_UNSUPPORTED) {
        bad = -1;
    } else {
        if (st != FP4D_STATUS_OK) fprintf(stderr, "  %s: %s (%s)\n", label, fp4d_status_name(st), fp4d_last_error());
        assert_int_equal(st, FP4D_STATUS_OK);
        p.out = ref;
        assert_int_equal(fp4d_ref_gemm(&p), FP4D_STATUS_OK);
        p.out = got;
        float *af = to_f32(&A.m), *bf = to_f32(&B.m);
        bad = compare(label, &p, got, ref, af, bf, 0);
        free(af);
        free(bf);
    }
    free(got);
    free(ref);
    free_operand(&A);
    free_operand(&B);
    return bad;
}

static const fp4d_dtype a_types[] = {FP4D_DTYPE_BF16, FP4D_DTYPE_F16, FP4D_DTYPE_F32, FP4D_DTYPE_NVFP4, FP4D_DTYPE_MXFP4};
static const fp4d_dtype b_types[] = {FP4D_DTYPE_NVFP4, FP4D_DTYPE_MXFP4};
static const fp4d_dtype out_types[] = {FP4D_DTYPE_F32, FP4D_DTYPE_BF16, FP4D_DTYPE_F16};
static const fp4d_scale_layout layouts[] = {FP4D_LAYOUT_LINEAR, FP4D_LAYOUT_SWIZZLED_128X4, FP4D_LAYOUT_SWIZZLED_8X4};

/* Every type/layout/output combination on shapes that exercise each path. */
static void sweep(fp4d_backend_t b, const char *name, bool large)
{
    /* (M, N, K): skinny with 1..16 rows and 17..32-row pieces, split-K, odd N tails, K not a
     * multiple of 32 (dense paths), and large M (tiled path) */
    static const int64_t shapes[][3] = {
        {1, 40, 64}, {3, 129, 256}, {16, 8, 96}, {17, 33, 160}, {45, 70, 32}, {7, 64, 2048}, {300, 72, 128},
        {5, 24, 48}, {16, 136, 1088}, {8, 300, 4096}, {2, 520, 8192},
    };
    /* FP4D_GPU_TEST_QUICK=1 (used under compute-sanitizer): one output type per pair */
    const bool quick = getenv("FP4D_GPU_TEST_QUICK") != NULL;
    int failures = 0, cases = 0;
    for (size_t ai = 0; ai < sizeof a_types / sizeof a_types[0]; ai++)
        for (size_t bi = 0; bi < 2; bi++)
            for (size_t oi = 0; oi < 3; oi++)
                for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
                    if (quick && (oi != (ai + bi) % 3 || shapes[si][0] > 64)) continue;
                    const fp4d_dtype at = a_types[ai], bt = b_types[bi];
                    const int64_t blk = (at == FP4D_DTYPE_MXFP4 || bt == FP4D_DTYPE_MXFP4) ? 32 : 16;
                    if (shapes[si][2] % blk) continue;
                    if (!large && shapes[si][0] > 64) continue;
                    const fp4d_scale_layout al = layouts[(ai + si) % 3], bl = layouts[(bi + oi + si) % 3];
                    int bad = run_case(b, at, bt, al, bl, out_types[oi], shapes[si][0], shapes[si][1], shapes[si][2]);
                    if (bad < 0) continue;
                    cases++;
                    if (bad) failures++;
                }
    fprintf(stderr, "  %s: %d cases, %d failed\n", name, cases, failures);
    assert_true(cases > 0);
    assert_int_equal(failures, 0);
}

static void test_cuda_gemm_sweep(void **state)
{
    (void)state;
    fp4d_backend_t b = open_or_skip("cuda");
    if (!b) skip();
    sweep(b, "cuda", true);
    fp4d_backend_close(b);
}

static void test_cublas_bf16_gemm_sweep(void **state)
{
    (void)state;
    fp4d_backend_t b = open_or_skip("cublas-bf16");
    if (!b) skip();
    sweep(b, "cublas-bf16", true);
    fp4d_backend_close(b);
}

/* A decode-sized shape through the skinny path's split-K reduction, twice: the second run
 * must be bit-identical (split-K sums in a fixed order). */
static void test_cuda_deterministic_split_k(void **state)
{
    (void)state;
    fp4d_backend_t b = open_or_skip("cuda");
    if (!b) skip();
    operand A, B;
    make_operand(&A, FP4D_DTYPE_BF16, FP4D_LAYOUT_LINEAR, 4, 4096);
    make_operand(&B, FP4D_DTYPE_NVFP4, FP4D_LAYOUT_SWIZZLED_128X4, 256, 4096);
    float *o1 = malloc(4 * 256 * 4), *o2 = malloc(4 * 256 * 4), *ref = malloc(4 * 256 * 4);
    fp4d_gemm_problem p = {A.m, B.m, 1.0f, FP4D_DTYPE_F32, o1};
    fp4d_reason why;
    poison(FP4D_DTYPE_F32, o1, 1024);
    assert_int_equal(fp4d_backend_gemm(b, &p, &why), FP4D_STATUS_OK);
    p.out = o2;
    poison(FP4D_DTYPE_F32, o2, 1024);
    assert_int_equal(fp4d_backend_gemm(b, &p, &why), FP4D_STATUS_OK);
    assert_memory_equal(o1, o2, 4 * 256 * 4);
    p.out = ref;
    assert_int_equal(fp4d_ref_gemm(&p), FP4D_STATUS_OK);
    float *af = to_f32(&A.m), *bf = to_f32(&B.m);
    p.out = o1;
    assert_int_equal(compare("split-K", &p, o1, ref, af, bf, 0), 0);
    free(af);
    free(bf);
    free(o1);
    free(o2);
    free(ref);
    free_operand(&A);
    free_operand(&B);
    fp4d_backend_close(b);
}

/* Small-M sweep on the cuda backend with FP4DOCTOR_CUDA_GEMV_MAX_M set to gemv_max_m: every
 * activation type x weight format per shape, scale layouts and output types rotated, a NaN
 * block scale in the last or the middle weight row of some cases. */
static void small_m_sweep(const char *label, const int64_t (*shapes)[3], size_t count, const char *gemv_max_m)
{
    fp4d_backend_t b = open_or_skip("cuda");
    if (!b) skip();
    setenv("FP4DOCTOR_CUDA_GEMV_MAX_M", gemv_max_m, 1);
    const bool quick = getenv("FP4D_GPU_TEST_QUICK") != NULL;
    int cases = 0, failures = 0;
    for (size_t si = 0; si < count; si++)
        for (size_t ai = 0; ai < sizeof a_types / sizeof a_types[0]; ai++)
            for (size_t bi = 0; bi < 2; bi++) {
                if (quick && (si + ai + bi) % 3) continue;
                const fp4d_dtype at = a_types[ai], bt = b_types[bi];
                const fp4d_scale_layout al = layouts[(si + bi) % 3], bl = layouts[(si + ai + bi) % 3];
                const size_t pick = (si + ai) % 4;
                nan_scale_row = pick == 0 ? shapes[si][1] - 1 : pick == 2 ? shapes[si][1] / 2 : -1;
                const int bad = run_case(b, at, bt, al, bl, out_types[(si + ai + bi) % 3], shapes[si][0], shapes[si][1],
                                         shapes[si][2]);
                nan_scale_row = -1;
                if (bad < 0) continue;
                cases++;
                if (bad) failures++;
            }
    unsetenv("FP4DOCTOR_CUDA_GEMV_MAX_M");
    fprintf(stderr, "  cuda %s: %d cases, %d failed\n", label, cases, failures);
    assert_true(cases > 0);
    assert_int_equal(failures, 0);
    fp4d_backend_close(b);
}

/* The M <= 4 GEMV kernel: M = 1..4, K % 32 == 0 but not % 64, K ranges split across
 * blocks with a short last range, odd N (row groups of 4 cut short), every activation
 * type, both scale layouts on both sides, every output type, a NaN block scale, and the
 * decode shapes' N x K at small sizes. */
static void test_cuda_gemv(void **state)
{
    (void)state;
    static const int64_t shapes[][3] = {
        {1, 1, 32}, {1, 7, 96}, {2, 129, 1056}, {3, 517, 3104}, {4, 33, 3104}, {4, 260, 6176},
        {1, 300, 12320}, {2, 5, 32}, {3, 64, 2080}, {4, 1031, 160}, {1, 96, 4096},
    };
    /* M = 2..4 too, and M = 1 at any K */
    small_m_sweep("gemv", shapes, sizeof shapes / sizeof shapes[0], "4");
}

/* The weight-streaming kernel (items of <= 16 rows, K % 256 == 0), with the GEMV kernel off
 * so that M = 1 reaches it too: M = 1..16 (one and two 8-token MMA columns, tokens short of
 * a column), N below, at and past the 128-row block (rows clamped, never stored), K of one
 * phase up to K split over many blocks, every activation type, both weight formats, all
 * three scale layouts on both sides, every output type and a NaN block scale. */
static void test_cuda_wa(void **state)
{
    (void)state;
    static const int64_t shapes[][3] = {
        {1, 40, 256}, {1, 300, 4096}, {2, 128, 512}, {5, 129, 1536}, {8, 16, 7168},
        {9, 200, 1024}, {12, 33, 256}, {16, 1000, 2304}, {16, 257, 8192}, {3, 7, 768},
    };
    small_m_sweep("wa", shapes, sizeof shapes / sizeof shapes[0], "0");
}

/* small_m_sweep with the environment variable `var` set to `value` for its duration. */
static void small_m_sweep_with(const char *var, const char *value, const char *label, const int64_t (*shapes)[3],
                               size_t count)
{
    setenv(var, value, 1);
    small_m_sweep(label, shapes, count, "0");
    unsetenv(var);
}

/* 16-bit activations staged all before the main loop (as blocks of eight row groups, FP4
 * activations and K slices with more than two units per thread and phase or one batch of
 * loads in all always do), and K slices' in chunks of three phases inside it (the default
 * chunk is covered by every other test): every split, slice and warp arrangement the planner
 * picks for these shapes. */
static void test_cuda_wa_staging_placement(void **state)
{
    (void)state;
    static const int64_t shapes[][3] = {
        {1, 300, 4096}, {2, 128, 512}, {4, 33, 14336}, {5, 129, 1536}, {8, 16, 7168}, {16, 257, 8192}, {3, 7, 768},
    };
    small_m_sweep_with("FP4DOCTOR_CUDA_WA_STAGE", "upfront", "wa, staging up front", shapes,
                       sizeof shapes / sizeof shapes[0]);
    small_m_sweep_with("FP4DOCTOR_CUDA_WA_STAGE", "3", "wa, staging in chunks of 3 phases", shapes,
                       sizeof shapes / sizeof shapes[0]);
}

/* The same items with the stream layout off (as where the device has no room for it): the
 * decode kernel takes them on the natural layout. */
static void test_cuda_wa_natural_layout(void **state)
{
    (void)state;
    static const int64_t shapes[][3] = {
        {1, 300, 4096}, {5, 129, 1536}, {8, 16, 7168}, {16, 257, 2560}, {3, 7, 768},
    };
    small_m_sweep_with("FP4DOCTOR_CUDA_STREAM_LAYOUT", "0", "wa items, natural layout", shapes,
                       sizeof shapes / sizeof shapes[0]);
}

/* The stream kernel with 3 splits forced (the planner picks 1, 2, 4 or 8 on most shapes):
 * uneven K ranges per split, staged activations of 1..16 tokens, the fixed-order exchange. */
static void test_cuda_wa_three_splits(void **state)
{
    (void)state;
    static const int64_t shapes[][3] = {
        {1, 300, 4096}, {5, 129, 1536}, {8, 16, 7168}, {9, 200, 1024}, {16, 257, 2560}, {3, 7, 768},
    };
    setenv("FP4DOCTOR_CUDA_WA_KSLICES", "0", 1); /* M <= 2 as splits too */
    small_m_sweep_with("FP4DOCTOR_CUDA_WA_SPLITS", "3", "wa (3 splits)", shapes, sizeof shapes / sizeof shapes[0]);
    unsetenv("FP4DOCTOR_CUDA_WA_KSLICES");
}

#ifdef FP4D_TEST_CUDA_KERNELS
/* Stream-kernel arguments of bf16 x NVFP4 14336x4096 at max_rows tokens (the planner's rules). */
static fp4d_skinny_args args_14336x4096(int32_t max_rows)
{
    fp4d_skinny_args a = {0};
    a.a_type = FP4D_DTYPE_BF16;
    a.b_format = FP4D_DTYPE_NVFP4;
    a.num_items = 1;
    a.max_rows = max_rows;
    a.n = 14336;
    a.k = 4096;
    return a;
}
#endif

/* The stream kernel with two warps per 16-row group forced (the backend picks them only for
 * grids of at most one block per SM with 16+ phases per block, as 14336x4096 at M <= 8): each
 * warp of a pair over its share of the block's phases, summed through shared memory before
 * the split-K exchange and the store. Once with the planner's splits (one phase per block on
 * these shapes: the first warp of each pair has none), once with one split where the staged
 * activations allow it - 8 and 8 of 16 phases (K = 4096), 3 and 3 of 6, 5 and 5 of 10, 1 and
 * 2 of 3 (K = 768), none and 1 of 1 (K = 256) - so that the second warp starts mid-block. */
static void test_cuda_wa_two_warps_per_row_group(void **state)
{
    (void)state;
    static const int64_t shapes[][3] = {
        {1, 300, 4096}, {5, 129, 1536}, {8, 16, 7168}, {16, 257, 2560}, {3, 7, 768}, {2, 40, 256},
    };
    const size_t count = sizeof shapes / sizeof shapes[0];
    setenv("FP4DOCTOR_CUDA_WA_KSLICES", "0", 1); /* M <= 2 in row groups too */
    setenv("FP4DOCTOR_CUDA_WA_RG", "8", 1);      /* eight row groups (8x7168 in one split would take 16) */
    small_m_sweep_with("FP4DOCTOR_CUDA_WA_HALVES", "2", "wa, two warps per row group", shapes, count);
    setenv("FP4DOCTOR_CUDA_WA_SPLITS", "1", 1);
    small_m_sweep_with("FP4DOCTOR_CUDA_WA_HALVES", "2", "wa, two warps per row group, one split", shapes, count);
    unsetenv("FP4DOCTOR_CUDA_WA_SPLITS");
    unsetenv("FP4DOCTOR_CUDA_WA_RG");
    unsetenv("FP4DOCTOR_CUDA_WA_KSLICES");
#ifdef FP4D_TEST_CUDA_KERNELS
    /* the rule itself, on 132 SMs: 14336x4096 at M = 1 or 16 in one split (112 blocks of 16
     * phases) and 4096x4096 in one split (32 blocks of 16) take two; two splits of 14336x4096
     * (224 blocks) and four of 4096x4096 (128 blocks of 4 phases) take one */
    fp4d_skinny_args a = args_14336x4096(1);
    a.splits = 1;
    assert_int_equal(fp4d_cuda_wa_warps_per_row_group(&a, 132), 2);
    a.max_rows = 16;
    assert_int_equal(fp4d_cuda_wa_warps_per_row_group(&a, 132), 2);
    a.splits = 2;
    assert_int_equal(fp4d_cuda_wa_warps_per_row_group(&a, 132), 1);
    a.max_rows = 1;
    assert_int_equal(fp4d_cuda_wa_warps_per_row_group(&a, 132), 1);
    a.n = 4096;
    a.splits = 4;
    assert_int_equal(fp4d_cuda_wa_warps_per_row_group(&a, 132), 1);
    a.splits = 1;
    assert_int_equal(fp4d_cuda_wa_warps_per_row_group(&a, 132), 2);
    setenv("FP4DOCTOR_CUDA_WA_HALVES", "1", 1);
    assert_int_equal(fp4d_cuda_wa_warps_per_row_group(&a, 132), 1);
    unsetenv("FP4DOCTOR_CUDA_WA_HALVES");
#endif
}

/* Wide staging: a stream grid of at most one block per SM may stage more activations than
 * the two-blocks-per-SM budget (96 KB) - 9..16 tokens over K = 4096..6144 in one split, 96 to
 * 192 KB per block - with one and two warps per row group. Each case is past that budget, so
 * without wide staging the forced single split would be refused and the planner's split run. */
static void test_cuda_wa_wide_staging(void **state)
{
    (void)state;
    static const int64_t shapes[][3] = {
        {16, 257, 4096}, {12, 300, 6144}, {9, 129, 5632}, {16, 40, 3328},
    };
    const size_t count = sizeof shapes / sizeof shapes[0];
    setenv("FP4DOCTOR_CUDA_WA_SPLITS", "1", 1);
    setenv("FP4DOCTOR_CUDA_WA_RG", "8", 1); /* 16x257x4096 in one split would take 16 row groups */
    small_m_sweep_with("FP4DOCTOR_CUDA_WA_HALVES", "1", "wa, wide staging", shapes, count);
    small_m_sweep_with("FP4DOCTOR_CUDA_WA_HALVES", "2", "wa, wide staging, two warps per row group", shapes, count);
    unsetenv("FP4DOCTOR_CUDA_WA_RG");
    unsetenv("FP4DOCTOR_CUDA_WA_SPLITS");
#ifdef FP4D_TEST_CUDA_KERNELS
    /* the planner, on this GPU: 14336x4096 at M = 16 in one split when wide staging fits (a
     * block of 16 phases x 16 tokens stages 128 KB), two without it */
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) == cudaSuccess && sms >= 112) {
        int optin = 0;
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0);
        fp4d_skinny_args a = args_14336x4096(16);
        a.b_stream_codes = 1;
        if (optin >= 160 * 1024) assert_int_equal(fp4d_cuda_skinny_pick_splits(&a, sms), 1);
        setenv("FP4DOCTOR_CUDA_WA_WIDE", "0", 1);
        assert_int_equal(fp4d_cuda_skinny_pick_splits(&a, sms), 2);
        unsetenv("FP4DOCTOR_CUDA_WA_WIDE");
    }
#endif
}

/* Runs A x B (alpha 0.75) on backend b into a fresh, NaN-poisoned buffer of type ot. */
static void *gemm_into_new(fp4d_backend_t b, const operand *A, const operand *B, fp4d_dtype ot)
{
    const size_t count = (size_t)(A->m.rows * B->m.rows);
    void *out = malloc(count * 4);
    assert_non_null(out);
    poison(ot, out, count);
    fp4d_gemm_problem p = {A->m, B->m, 0.75f, ot, out};
    fp4d_reason why = {{0}};
    const fp4d_status st = fp4d_backend_gemm(b, &p, &why);
    if (st != FP4D_STATUS_OK) fprintf(stderr, "  %s (%s)\n", fp4d_status_name(st), fp4d_last_error());
    assert_int_equal(st, FP4D_STATUS_OK);
    return out;
}

/* The activation types the bit-identity sweeps below rotate through. */
static const fp4d_dtype same_bits_acts[] = {FP4D_DTYPE_BF16, FP4D_DTYPE_NVFP4, FP4D_DTYPE_F16, FP4D_DTYPE_MXFP4};

/* One case of those sweeps: M x K activations of type at against N x K weights of format bt,
 * scale layouts and output type rotated by rot, and a label naming it. */
typedef struct {
    int64_t m, n, k;
    fp4d_dtype ot;
    operand a, b;
    char label[160];
} same_bits_case;

static void same_bits_case_make(same_bits_case *c, int64_t m, int64_t n, int64_t k, fp4d_dtype at, fp4d_dtype bt,
                                size_t rot, const char *suffix)
{
    c->m = m;
    c->n = n;
    c->k = k;
    c->ot = out_types[rot % 3];
    make_operand(&c->a, at, layouts[rot % 3], m, k);
    make_operand(&c->b, bt, layouts[(rot + 1) % 3], n, k);
    snprintf(c->label, sizeof c->label, "%s x %s -> %s M=%lld N=%lld K=%lld%s", fp4d_dtype_get(at)->name,
             fp4d_dtype_get(bt)->name, fp4d_dtype_get(c->ot)->name, (long long)m, (long long)n, (long long)k, suffix);
}

/* ... with activations same_bits_acts[ai] and NVFP4 weights, MXFP4 where rot is even (f16
 * activations take NVFP4 weights only) */
static void same_bits_case_rotated(same_bits_case *c, const int64_t mnk[3], size_t ai, size_t rot, const char *suffix)
{
    const fp4d_dtype at = same_bits_acts[ai % 4];
    const fp4d_dtype bt = at == FP4D_DTYPE_F16 || rot % 2 ? FP4D_DTYPE_NVFP4 : FP4D_DTYPE_MXFP4;
    same_bits_case_make(c, mnk[0], mnk[1], mnk[2], at, bt, rot, suffix);
}

static void same_bits_case_free(same_bits_case *c)
{
    free_operand(&c->a);
    free_operand(&c->b);
}

/* Runs the case with the environment variable `var` set to `first`, then to `second` (unset
 * afterwards). Returns the first output where the two are bit-identical, else NULL, having
 * said so. */
static void *same_bits_under(fp4d_backend_t b, const same_bits_case *c, const char *var, const char *first,
                             const char *second)
{
    setenv(var, first, 1);
    void *one = gemm_into_new(b, &c->a, &c->b, c->ot);
    setenv(var, second, 1);
    void *two = gemm_into_new(b, &c->a, &c->b, c->ot);
    unsetenv(var);
    const bool same = memcmp(one, two, (size_t)(c->m * c->n) * (c->ot == FP4D_DTYPE_F32 ? 4 : 2)) == 0;
    free(two);
    if (same) return one;
    fprintf(stderr, "  %s: %s=%s and %s=%s differ\n", c->label, var, first, var, second);
    free(one);
    return NULL;
}

/* Whether `out` (the case's output) is within the reference's tolerance. */
static bool same_bits_case_passes(const same_bits_case *c, const void *out)
{
    void *ref = malloc((size_t)(c->m * c->n) * 4);
    assert_non_null(ref);
    fp4d_gemm_problem p = {c->a.m, c->b.m, 0.75f, c->ot, ref};
    assert_int_equal(fp4d_ref_gemm(&p), FP4D_STATUS_OK);
    float *af = to_f32(&c->a.m), *bf = to_f32(&c->b.m);
    const bool ok = compare(c->label, &p, out, ref, af, bf, 0) == 0;
    free(af);
    free(bf);
    free(ref);
    return ok;
}

/*
 * The stream kernel's split-K exchange through the shared memory of a thread block cluster
 * (compute capability 9.0+: the splits of a tile run as one cluster) against the exchange
 * through global memory (FP4DOCTOR_CUDA_WA_CLUSTER=0): 2, 3, 8 (the portable cluster limit),
 * 9 and 16 splits forced, 1..16 tokens, one and two warps per row group, every activation
 * type, both weight formats, every output type. Both add the splits in split order, so the
 * outputs must be bit-identical, and within the reference's tolerance. On compute capability
 * 9.0 the first part checks that the cluster exchange is the one these launches take.
 */
static void test_cuda_wa_cluster_exchange(void **state)
{
    (void)state;
    fp4d_backend_t b = open_or_skip("cuda");
    if (!b) skip();
    static const int32_t splits[] = {2, 3, 8, 9, 16};
#ifdef FP4D_TEST_CUDA_KERNELS
    int major = 0;
    assert_int_equal(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
    fp4d_skinny_args a = args_14336x4096(16);
    a.n = 257; /* 3 tiles of 128 rows: one wave at any of these splits */
    a.b_stream_codes = 1;
    for (size_t i = 0; i < sizeof splits / sizeof splits[0]; i++) {
        a.splits = splits[i];
        const int32_t blocks = fp4d_cuda_wa_cluster_blocks(&a);
        /* compute capability 9.0 (H100, H200: 16-block clusters, 114+ SMs) takes them all;
         * elsewhere cluster sizes past 8 and the wave rule depend on the part */
        if (major <= 9) assert_int_equal(blocks, major == 9 ? splits[i] : 1);
        else assert_true(blocks == splits[i] || blocks == 1);
    }
    a.splits = 1;
    assert_int_equal(fp4d_cuda_wa_cluster_blocks(&a), 1);
    a.splits = 4;
    setenv("FP4DOCTOR_CUDA_WA_CLUSTER", "0", 1);
    assert_int_equal(fp4d_cuda_wa_cluster_blocks(&a), 1);
    unsetenv("FP4DOCTOR_CUDA_WA_CLUSTER");
#endif
    static const int64_t shapes[][3] = {{1, 257, 4096}, {5, 300, 4096}, {9, 129, 8192}, {16, 40, 4096}};
    const bool quick = getenv("FP4D_GPU_TEST_QUICK") != NULL;
    setenv("FP4DOCTOR_CUDA_GEMV_MAX_M", "0", 1); /* M = 1 to the stream kernel too */
    setenv("FP4DOCTOR_CUDA_WA_KSLICES", "0", 1); /* M = 1 in splits too */
    int cases = 0, failures = 0;
    for (size_t si = 0; si < sizeof splits / sizeof splits[0]; si++)
        for (size_t hi = 0; hi < sizeof shapes / sizeof shapes[0]; hi++) {
            const size_t rot = si + hi;
            if (quick && rot % 2) continue;
            const fp4d_dtype at = same_bits_acts[rot % 4];
            const fp4d_dtype bt = at == FP4D_DTYPE_F16 || rot % 3 ? FP4D_DTYPE_NVFP4 : FP4D_DTYPE_MXFP4;
            char count[16], suffix[32];
            snprintf(count, sizeof count, "%d", (int)splits[si]);
            snprintf(suffix, sizeof suffix, ", %s splits", count);
            same_bits_case c;
            same_bits_case_make(&c, shapes[hi][0], shapes[hi][1], shapes[hi][2], at, bt, rot, suffix);
            setenv("FP4DOCTOR_CUDA_WA_SPLITS", count, 1);
            setenv("FP4DOCTOR_CUDA_WA_HALVES", rot % 2 ? "2" : "1", 1);
            void *clustered = same_bits_under(b, &c, "FP4DOCTOR_CUDA_WA_CLUSTER", "1", "0");
            unsetenv("FP4DOCTOR_CUDA_WA_HALVES");
            unsetenv("FP4DOCTOR_CUDA_WA_SPLITS");
            if (!clustered || !same_bits_case_passes(&c, clustered)) failures++;
            cases++;
            free(clustered);
            same_bits_case_free(&c);
        }
    unsetenv("FP4DOCTOR_CUDA_GEMV_MAX_M");
    unsetenv("FP4DOCTOR_CUDA_WA_KSLICES");
    fprintf(stderr, "  cuda wa, cluster exchange: %d cases, %d failed\n", cases, failures);
    assert_int_equal(failures, 0);
    fp4d_backend_close(b);
}

/*
 * Blocks of 16 row groups (fp4d_cuda_wa_row_groups: 256 rows, one block per SM). Forced
 * wherever they fit, with the planner's splits (as many as fit: up to 32 splits of one phase,
 * exchanged through global memory past 16) and with 3 (uneven K ranges, a cluster of 3),
 * against the reference; then against blocks of eight row groups with the same splits forced:
 * the same phases added in the same order, so the outputs must be bit-identical, for every
 * activation type, both weight formats and every output type. On compute capability 9.0 the
 * rule itself, on 132 SMs: 16+ phases per block from M = 3, 8+ from M = 8, never where the
 * eight-group grid runs unsplit (14336x4096, 13824x5120), nor where the staging does not fit
 * (28672x8192 at M = 16: 256 KB).
 */
static void test_cuda_wa_wide_blocks(void **state)
{
    (void)state;
    fp4d_backend_t b = open_or_skip("cuda");
    if (!b) skip();
#ifdef FP4D_TEST_CUDA_KERNELS
    int major = 0;
    assert_int_equal(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
    static const struct {
        int64_t n, k;
        int32_t max_rows;
        const char *env; /* FP4DOCTOR_CUDA_WA_RG, or NULL */
        int row_groups, splits; /* splits: the planner's, with the stream layout */
    } rule[] = {
        {7168, 18432, 16, NULL, 16, 4}, {7168, 18432, 3, NULL, 16, 4}, {7168, 18432, 2, NULL, 8, 0},
        {7168, 18432, 16, "8", 8, 0},   {28672, 8192, 8, NULL, 16, 1}, {28672, 8192, 16, NULL, 8, 0},
        {14336, 4096, 16, NULL, 8, 1},  {4096, 14336, 16, NULL, 8, 0}, {14336, 4096, 16, "16", 16, 2},
        {6144, 16384, 16, NULL, 16, 5}, {6144, 16384, 4, NULL, 8, 0},  {8192, 8192, 8, NULL, 16, 4},
        {13824, 5120, 16, NULL, 8, 0},
    };
    for (size_t i = 0; i < sizeof rule / sizeof rule[0] && major == 9; i++) {
        fp4d_skinny_args a = args_14336x4096(rule[i].max_rows);
        a.n = rule[i].n;
        a.k = rule[i].k;
        a.b_stream_codes = 1;
        if (rule[i].env) setenv("FP4DOCTOR_CUDA_WA_RG", rule[i].env, 1);
        assert_int_equal(fp4d_cuda_wa_row_groups(&a, 132), rule[i].row_groups);
        if (rule[i].splits > 0) assert_int_equal(fp4d_cuda_skinny_pick_splits(&a, 132), rule[i].splits);
        unsetenv("FP4DOCTOR_CUDA_WA_RG");
    }
#endif
    static const int64_t shapes[][3] = {
        {1, 300, 4096}, {3, 7, 768}, {5, 129, 1536}, {8, 16, 7168}, {9, 200, 1024}, {12, 513, 2304}, {16, 257, 8192},
    };
    const size_t count = sizeof shapes / sizeof shapes[0];
    setenv("FP4DOCTOR_CUDA_WA_KSLICES", "0", 1); /* M <= 8 in row groups too */
    small_m_sweep_with("FP4DOCTOR_CUDA_WA_RG", "16", "wa, 16 row groups", shapes, count);
    setenv("FP4DOCTOR_CUDA_WA_SPLITS", "3", 1);
    small_m_sweep_with("FP4DOCTOR_CUDA_WA_RG", "16", "wa, 16 row groups, 3 splits", shapes, count);

    /* M, N, K, splits: within the eight-group blocks' staging budget, so both grids run */
    static const int64_t same[][4] = {
        {16, 300, 4096, 2}, {5, 257, 8192, 4}, {12, 129, 6144, 3}, {3, 513, 4096, 2}, {9, 40, 14336, 4}, {1, 700, 2048, 2},
    };
    setenv("FP4DOCTOR_CUDA_GEMV_MAX_M", "0", 1); /* M = 1 to the stream kernel too */
    setenv("FP4DOCTOR_CUDA_WA_HALVES", "1", 1);
    int cases = 0, failures = 0;
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++)
        for (size_t ai = 0; ai < 4; ai++) {
            char splits[16], suffix[32];
            snprintf(splits, sizeof splits, "%lld", (long long)same[i][3]);
            snprintf(suffix, sizeof suffix, ", %s splits", splits);
            same_bits_case c;
            same_bits_case_rotated(&c, same[i], ai, i + ai, suffix);
            setenv("FP4DOCTOR_CUDA_WA_SPLITS", splits, 1);
            void *wide = same_bits_under(b, &c, "FP4DOCTOR_CUDA_WA_RG", "16", "8");
            if (!wide || ((i + ai) % 4 == 0 && !same_bits_case_passes(&c, wide))) failures++;
            cases++;
            free(wide);
            same_bits_case_free(&c);
        }
    unsetenv("FP4DOCTOR_CUDA_WA_SPLITS");
    unsetenv("FP4DOCTOR_CUDA_WA_HALVES");
    unsetenv("FP4DOCTOR_CUDA_WA_KSLICES");
    unsetenv("FP4DOCTOR_CUDA_GEMV_MAX_M");
    fprintf(stderr, "  cuda wa, 16 against 8 row groups: %d cases, %d differ\n", cases, failures);
    assert_int_equal(failures, 0);
    fp4d_backend_close(b);
}

/*
 * K slices (fp4d_cuda_wa_kslices): a split grid of M <= 2 whose 16-row blocks all fit on the
 * GPU at once (M = 3..8: 32-row blocks, one per SM) runs each tile's K splits as eight warps
 * per row group, summed in shared memory. Forced wherever each block size can run (1..8
 * tokens; 1, 2, 3, 6, 16 and 56 phases: some warps without a phase) against the reference;
 * then, with 8 splits forced, against the split grid: eight slices are the same phases added
 * in the same order, so the outputs must be bit-identical, for every activation type, both
 * weight formats and every output type.
 */
static void test_cuda_wa_kslices(void **state)
{
    (void)state;
    fp4d_backend_t b = open_or_skip("cuda");
    if (!b) skip();
#ifdef FP4D_TEST_CUDA_KERNELS
    /* the rule on 132 SMs: 4096x14336 (256 16-row blocks, two per SM on compute capability
     * 9.0; 128 32-row blocks staging 28 KB per token) and 7168x18432 (448 / 224: more than
     * fit) */
    static const struct {
        int64_t n, k;
        int32_t max_rows, splits;
        const char *env; /* FP4DOCTOR_CUDA_WA_KSLICES, or NULL */
        int want;        /* -1: only known on compute capability 9.0 (shared memory, blocks per
                          * SM), where it is `cc90` */
        int cc90;
    } rule[] = {
        {4096, 14336, 1, 8, NULL, -1, 1}, {4096, 14336, 2, 8, NULL, -1, 1}, {4096, 14336, 3, 8, NULL, -1, 2},
        {4096, 14336, 4, 8, NULL, -1, 2}, {4096, 14336, 5, 8, NULL, 0, 0},  {4096, 14336, 3, 8, "1", 1, 1},
        {4096, 14336, 6, 8, "2", -1, 2},  {4096, 14336, 9, 8, "1", 0, 0},   {4096, 14336, 9, 8, "2", 0, 0},
        {4096, 14336, 1, 1, "1", 0, 0},   {4096, 14336, 1, 8, "0", 0, 0},   {4096, 14336, 3, 8, "0", 0, 0},
        {7168, 18432, 1, 4, NULL, 0, 0},  {7168, 18432, 4, 4, "2", 0, 0},
    };
    /* FP4 activations at M <= 2 take 32-row blocks from K = 8192 (4096x14336), not on 4096x4096 */
    static const struct {
        int64_t n, k;
        int32_t max_rows, a_type;
        int cc90;
    } fp4_rule[] = {
        {4096, 14336, 1, FP4D_DTYPE_NVFP4, 2}, {4096, 14336, 2, FP4D_DTYPE_MXFP4, 2},
        {4096, 4096, 1, FP4D_DTYPE_NVFP4, 1},  {4096, 14336, 1, FP4D_DTYPE_BF16, 1},
    };
    int major = 0;
    assert_int_equal(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
    for (size_t i = 0; i < sizeof rule / sizeof rule[0]; i++) {
        fp4d_skinny_args a = args_14336x4096(rule[i].max_rows);
        a.n = rule[i].n;
        a.k = rule[i].k;
        a.splits = rule[i].splits;
        if (rule[i].env) setenv("FP4DOCTOR_CUDA_WA_KSLICES", rule[i].env, 1);
        const int got = fp4d_cuda_wa_kslices(&a, 132);
        unsetenv("FP4DOCTOR_CUDA_WA_KSLICES");
        if (rule[i].want >= 0 || major == 9) assert_int_equal(got, rule[i].want >= 0 ? rule[i].want : rule[i].cc90);
    }
    for (size_t i = 0; i < sizeof fp4_rule / sizeof fp4_rule[0] && major == 9; i++) {
        fp4d_skinny_args a = args_14336x4096(fp4_rule[i].max_rows);
        a.n = fp4_rule[i].n;
        a.k = fp4_rule[i].k;
        a.a_type = fp4_rule[i].a_type;
        a.splits = 8;
        assert_int_equal(fp4d_cuda_wa_kslices(&a, 132), fp4_rule[i].cc90);
    }
#endif
    static const int64_t shapes[][3] = {
        {1, 300, 4096}, {2, 129, 1536}, {5, 40, 2048}, {8, 16, 768}, {1, 7, 512}, {3, 257, 256}, {2, 33, 14336},
    };
    small_m_sweep_with("FP4DOCTOR_CUDA_WA_KSLICES", "1", "wa, K slices", shapes, sizeof shapes / sizeof shapes[0]);
    small_m_sweep_with("FP4DOCTOR_CUDA_WA_KSLICES", "2", "wa, K slices of two row groups", shapes,
                       sizeof shapes / sizeof shapes[0]);

    /* M, N, K, row groups per block */
    static const int64_t same[][4] = {
        {1, 300, 4096, 1}, {2, 129, 14336, 1}, {1, 40, 2048, 1}, {2, 257, 6144, 1},
        {5, 300, 4096, 2}, {8, 129, 2048, 2},  {3, 257, 14336, 2}, {1, 40, 6144, 2},
    };
    setenv("FP4DOCTOR_CUDA_GEMV_MAX_M", "0", 1); /* M = 1 to the stream kernel too */
    setenv("FP4DOCTOR_CUDA_WA_SPLITS", "8", 1);
    int cases = 0, failures = 0;
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++)
        for (size_t ai = 0; ai < 4; ai++) {
            same_bits_case c;
            same_bits_case_rotated(&c, same[i], ai, i + ai,
                                   same[i][3] == 2 ? ", K slices of two row groups against 8 splits"
                                                   : ", K slices against 8 splits");
            void *sliced = same_bits_under(b, &c, "FP4DOCTOR_CUDA_WA_KSLICES", same[i][3] == 2 ? "2" : "1", "0");
            if (!sliced) failures++;
            cases++;
            free(sliced);
            same_bits_case_free(&c);
        }
    unsetenv("FP4DOCTOR_CUDA_WA_SPLITS");
    unsetenv("FP4DOCTOR_CUDA_GEMV_MAX_M");
    fprintf(stderr, "  cuda wa, K slices against 8 splits: %d cases, %d differ\n", cases, failures);
    assert_int_equal(failures, 0);
    fp4d_backend_close(b);
}

/* The fused large-M kernel (NVFP4 weights, K % 64 == 0, M >= 32 by default): M = 32, 100,
 * 128, 129, 300 (one and several 128-row M tiles, short last tiles), N not a multiple of
 * the 128-column tile (and odd N: unpaired output stores), K = 64 (one k tile) up to 4096
 * (split-K over few tiles, reduced in a fixed order), every activation type (FP4 ones are
 * dequantized to bf16 first; f32 takes the simt path), all three scale layouts on both
 * sides, every output type and a NaN block scale; K % 64 != 0 and MXFP4 weights must fall
 * back to the other paths and pass as well. */
static void fused_sweep(const char *label)
{
    fp4d_backend_t b = open_or_skip("cuda");
    if (!b) skip();
    static const int64_t shapes[][3] = {
        {32, 200, 192}, {100, 130, 256}, {128, 257, 512}, {129, 136, 1088}, {300, 264, 640}, {33, 129, 64},
        {128, 256, 2048}, {64, 131, 2048}, {100, 70, 96}, {40, 1, 128},
    };
    const bool quick = getenv("FP4D_GPU_TEST_QUICK") != NULL;
    int cases = 0, failures = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (size_t ai = 0; ai < sizeof a_types / sizeof a_types[0]; ai++)
            for (size_t bi = 0; bi < 2; bi++)
                for (size_t li = 0; li < 3; li++) {
                    if (quick ? (si + ai + bi + li) % 6 != 0 : (bi == 1 && li != 0)) continue;
                    const fp4d_dtype at = a_types[ai], bt = b_types[bi];
                    const int64_t blk = (at == FP4D_DTYPE_MXFP4 || bt == FP4D_DTYPE_MXFP4) ? 32 : 16;
                    if (shapes[si][2] % blk) continue;
                    const fp4d_scale_layout al = layouts[(si + ai + li) % 3], bl = layouts[li];
                    nan_scale_row = (si + ai + li) % 4 == 0 ? shapes[si][1] / 2 : -1;
                    const int bad = run_case(b, at, bt, al, bl, out_types[(si + ai + li) % 3], shapes[si][0],
                                             shapes[si][1], shapes[si][2]);
                    nan_scale_row = -1;
                    if (bad < 0) continue;
                    cases++;
                    if (bad) failures++;
                }
    fprintf(stderr, "  cuda %s: %d cases, %d failed\n", label, cases, failures);
    assert_true(cases > 0);
    assert_int_equal(failures, 0);
    fp4d_backend_close(b);
}

static void test_cuda_fused(void **state)
{
    (void)state;
    fused_sweep("fused");
}

/* The same shapes through the large-M route of sm_90a (weights dequantized once, then the
 * plain wgmma GEMM), forced down to M = 1 rows; elsewhere the fused path runs again. */
static void test_cuda_fused_dense(void **state)
{
    (void)state;
    setenv("FP4DOCTOR_CUDA_WG_DENSE_MIN_M", "1", 1);
    fused_sweep("fused (dense wgmma route)");
    unsetenv("FP4DOCTOR_CUDA_WG_DENSE_MIN_M");
}

/* On sm_90a the packed-weight route decodes the weights into the wgmma register operand; the
 * same sweep through its predecessor, which dequantizes into shared memory (kept as an A/B
 * switch). Elsewhere: the fused path again. */
static void test_cuda_fused_smem_dequant(void **state)
{
    (void)state;
    setenv("FP4DOCTOR_CUDA_WG_RS", "0", 1);
    fused_sweep("fused (shared-memory dequantization)");
    unsetenv("FP4DOCTOR_CUDA_WG_RS");
}

/* Two runs of bf16 x NVFP4 (swizzled) -> f32 of M x N x K on b give the same bits. */
static void assert_two_runs_identical(fp4d_backend_t b, int64_t M, int64_t N, int64_t K)
{
    operand A, B;
    make_operand(&A, FP4D_DTYPE_BF16, FP4D_LAYOUT_LINEAR, M, K);
    make_operand(&B, FP4D_DTYPE_NVFP4, FP4D_LAYOUT_SWIZZLED_128X4, N, K);
    const size_t bytes = (size_t)(M * N) * 4;
    float *o1 = malloc(bytes), *o2 = malloc(bytes);
    assert_non_null(o1);
    assert_non_null(o2);
    fp4d_gemm_problem p = {A.m, B.m, 1.0f, FP4D_DTYPE_F32, o1};
    fp4d_reason why;
    poison(FP4D_DTYPE_F32, o1, (size_t)(M * N));
    assert_int_equal(fp4d_backend_gemm(b, &p, &why), FP4D_STATUS_OK);
    p.out = o2;
    poison(FP4D_DTYPE_F32, o2, (size_t)(M * N));
    assert_int_equal(fp4d_backend_gemm(b, &p, &why), FP4D_STATUS_OK);
    assert_memory_equal(o1, o2, bytes);
    free(o1);
    free(o2);
    free_operand(&A);
    free_operand(&B);
}

/* Split-K of the fused kernel (M = 128 over 2 N tiles: 16 K splits) is bit-identical run to run. */
static void test_cuda_fused_deterministic(void **state)
{
    (void)state;
    fp4d_backend_t b = open_or_skip("cuda");
    if (!b) skip();
    assert_two_runs_identical(b, 128, 256, 4096);
    fp4d_backend_close(b);
}

/*
 * The persistent dense wgmma kernel (sm_90a, M >= 512) with its last, partial round of tiles
 * run in K parts: 4 x 34 = 136 tiles of 128 x 256 leave 4 tiles after one round on a 132-SM
 * H200, run as 4 parts of 4 k tiles (K = 1024) or of 6, 6, 6 and 4 (K = 1408), reduced like
 * split-K. Against the exact reference (bf16 and NVFP4 activations, f32 and bf16 output) and
 * bit-identical run to run.
 * Elsewhere the same shapes take whichever path runs there.
 */
static void test_cuda_dense_tail(void **state)
{
    (void)state;
    fp4d_backend_t b = open_or_skip("cuda");
    if (!b) skip();
    static const int64_t shapes[][3] = {{512, 8704, 1024}, {512, 8704, 1408}};
    static const fp4d_dtype acts[] = {FP4D_DTYPE_BF16, FP4D_DTYPE_NVFP4}, outs[] = {FP4D_DTYPE_F32, FP4D_DTYPE_BF16};
    const bool quick = getenv("FP4D_GPU_TEST_QUICK") != NULL;
#ifdef FP4D_TEST_CUDA_KERNELS
    int dev = 0, sms = 0;
    assert_int_equal(cudaGetDevice(&dev), cudaSuccess);
    assert_int_equal(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), cudaSuccess);
#endif
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
#ifdef FP4D_TEST_CUDA_KERNELS
        size_t floats = 0, counters = 0;
        if (fp4d_cuda_dense_wgmma_available()) {
            fp4d_cuda_dense_wgmma_scratch(M, N, K, 1, &floats, &counters);
            fprintf(stderr, "  dense %lldx%lldx%lld on %d SMs: last round in K parts: %s (%zu partial floats)\n",
                    (long long)M, (long long)N, (long long)K, sms, floats ? "yes" : "no", floats);
            /* read as the kernels read it, so a value they ignore does not skip the check */
            if (sms == 132 && fp4d_env_switch("FP4DOCTOR_CUDA_WG_TAIL")) assert_true(floats > 0 && counters == 4);
        }
#endif
        for (size_t ai = 0; ai < 2; ai++)
            for (size_t oi = 0; oi < 2; oi++) {
                if (quick && ai + oi != si) continue;
                assert_int_equal(run_case(b, acts[ai], FP4D_DTYPE_NVFP4, FP4D_LAYOUT_SWIZZLED_128X4,
                                          FP4D_LAYOUT_SWIZZLED_128X4, outs[oi], M, N, K),
                                 0);
            }
    }
    /* the parts are summed in a fixed order */
    assert_two_runs_identical(b, shapes[1][0], shapes[1][1], shapes[1][2]);
    fp4d_backend_close(b);
}

/* Grouped MoE GEMM of six experts with the given rows (N = 72), against the exact reference
 * per expert; by default experts with 0, 1, 3, 16, 17 and 40 rows. */
enum { GROUPED_E = 6 };
static const int64_t grouped_rows_mixed[GROUPED_E] = {3, 0, 16, 1, 40, 17};

static void grouped_case_rows(fp4d_backend_t b, fp4d_dtype at, fp4d_dtype bt, fp4d_scale_layout al, fp4d_dtype ot,
                              int64_t K, const int64_t *rows)
{
    enum { E = GROUPED_E };
    int64_t off[E + 1] = {0};
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + rows[e];
    const int64_t M = off[E], N = 72;
    operand A, B[E];
    fp4d_matrix bm[E];
    float alpha[E];
    make_operand(&A, at, al, M, K);
    for (int e = 0; e < E; e++) {
        make_fp4(&B[e], bt, FP4D_LAYOUT_SWIZZLED_128X4, N, K);
        bm[e] = B[e].m;
        alpha[e] = 0.5f + 0.25f * (float)e;
    }
    float *got = malloc((size_t)(M * N) * 4), *ref = malloc((size_t)(M * N) * 4);
    fp4d_grouped_gemm_problem p = {E, off, A.m, bm, alpha, ot, got};
    poison(ot, got, (size_t)(M * N));
    fp4d_reason why = {{0}};
    fp4d_status st = fp4d_backend_grouped_gemm(b, &p, &why);
    if (st != FP4D_STATUS_OK) fprintf(stderr, "  grouped: %s %s (%s)\n", fp4d_status_name(st), why.text, fp4d_last_error());
    assert_int_equal(st, FP4D_STATUS_OK);
    p.out = ref;
    assert_int_equal(fp4d_ref_grouped_gemm(&p), FP4D_STATUS_OK);
    float *af = to_f32(&A.m);
    int bad = 0;
    for (int e = 0; e < E; e++) {
        if (!rows[e]) continue;
        float *bf = to_f32(&bm[e]);
        const size_t osz = fp4d_out_elem_size(ot);
        fp4d_gemm_problem sub = {{at, rows[e], K, NULL, NULL, al}, bm[e], alpha[e], ot, NULL};
        bad += compare("grouped", &sub, (uint8_t *)got + (size_t)(off[e] * N) * osz,
                       (uint8_t *)ref + (size_t)(off[e] * N) * osz, af, bf, off[e]);
        free(bf);
    }
    assert_int_equal(bad, 0);
    free(af);
    free(got);
    free(ref);
    free_operand(&A);
    for (int e = 0; e < E; e++) free_operand(&B[e]);
}

static void grouped_case(fp4d_backend_t b, fp4d_dtype at, fp4d_dtype bt, fp4d_scale_layout al, fp4d_dtype ot, int64_t K)
{
    grouped_case_rows(b, at, bt, al, ot, K, grouped_rows_mixed);
}

static void test_grouped(void **state, const char *name)
{
    (void)state;
    fp4d_backend_t b = open_or_skip(name);
    if (!b) skip();
    /* above 16 rows per expert, on sm_90a one register-decode wgmma launch for all experts:
     * whole 64-row token tiles inside the output (TMA stores) and short ones (bounded stores),
     * with K splits (K = 2048) and without; 200 rows: 256-row tiles */
    static const int64_t full_tiles[GROUPED_E] = {64, 0, 64, 3, 40, 17}, long_rows[GROUPED_E] = {130, 1, 0, 200, 7, 64};
    /* at most 16 rows per expert: the stream kernel, on every expert's weights in the stream
     * layout (made per call; N = 72 pads the last 16-row group; an expert without rows) */
    static const int64_t few_rows[GROUPED_E] = {3, 0, 16, 1, 8, 5};
    grouped_case_rows(b, FP4D_DTYPE_BF16, FP4D_DTYPE_NVFP4, FP4D_LAYOUT_LINEAR, FP4D_DTYPE_BF16, 512, few_rows);
    grouped_case_rows(b, FP4D_DTYPE_NVFP4, FP4D_DTYPE_NVFP4, FP4D_LAYOUT_SWIZZLED_128X4, FP4D_DTYPE_F32, 768, few_rows);
    grouped_case_rows(b, FP4D_DTYPE_MXFP4, FP4D_DTYPE_MXFP4, FP4D_LAYOUT_LINEAR, FP4D_DTYPE_F16, 512, few_rows);
    grouped_case_rows(b, FP4D_DTYPE_BF16, FP4D_DTYPE_NVFP4, FP4D_LAYOUT_LINEAR, FP4D_DTYPE_BF16, 256, full_tiles);
    grouped_case_rows(b, FP4D_DTYPE_BF16, FP4D_DTYPE_NVFP4, FP4D_LAYOUT_LINEAR, FP4D_DTYPE_F16, 2048, full_tiles);
    grouped_case_rows(b, FP4D_DTYPE_NVFP4, FP4D_DTYPE_NVFP4, FP4D_LAYOUT_SWIZZLED_128X4, FP4D_DTYPE_BF16, 512, long_rows);
    grouped_case_rows(b, FP4D_DTYPE_F16, FP4D_DTYPE_NVFP4, FP4D_LAYOUT_LINEAR, FP4D_DTYPE_F32, 2048, long_rows);
    grouped_case(b, FP4D_DTYPE_BF16, FP4D_DTYPE_NVFP4, FP4D_LAYOUT_LINEAR, FP4D_DTYPE_BF16, 256);
    grouped_case(b, FP4D_DTYPE_NVFP4, FP4D_DTYPE_NVFP4, FP4D_LAYOUT_SWIZZLED_128X4, FP4D_DTYPE_F32, 128);
    grouped_case(b, FP4D_DTYPE_MXFP4, FP4D_DTYPE_MXFP4, FP4D_LAYOUT_LINEAR, FP4D_DTYPE_F16, 64);
    grouped_case(b, FP4D_DTYPE_F32, FP4D_DTYPE_NVFP4, FP4D_LAYOUT_LINEAR, FP4D_DTYPE_F32, 48);
    grouped_case(b, FP4D_DTYPE_F16, FP4D_DTYPE_MXFP4, FP4D_LAYOUT_LINEAR, FP4D_DTYPE_BF16, 96);
    fp4d_backend_close(b);
}
static void test_cuda_grouped(void **state) { test_grouped(state, "cuda"); }

/* Grouped GEMMs from several host threads at once, each on its own instance: the quick suite's
 * MoE stress case with 8 instances, run a few times. The skinny path's item and pointer tables
 * were copied with a synchronous cudaMemcpy, which from pageable memory returns before the
 * bytes land and runs on the legacy stream the instances' streams do not wait for; with other
 * threads' copies queued there, kernels read the tables early and faulted (misaligned
 * address) in about half of such runs. */
static void test_cuda_grouped_concurrent(void **state)
{
    (void)state;
    fp4d_backend_t b = open_or_skip("cuda");
    if (!b) skip();
    fp4d_case *cases = NULL;
    size_t n = 0;
    assert_int_equal(fp4d_suite_cases(FP4D_SUITE_QUICK, &cases, &n), FP4D_STATUS_OK);
    const fp4d_case *moe = NULL;
    for (size_t i = 0; i < n && !moe; i++)
        if (cases[i].op == FP4D_CASE_STRESS && cases[i].num_experts > 0) moe = &cases[i];
    assert_non_null(moe);
    fp4d_case c = *moe;
    c.threads = 8;
    for (int run = 0; run < (getenv("FP4D_GPU_TEST_QUICK") ? 2 : 6); run++) {
        fp4d_case_result r;
        assert_int_equal(fp4d_doctor_run_case(b, &c, 1 + (uint64_t)run, &r), FP4D_STATUS_OK);
        if (r.verdict != FP4D_VERDICT_PASS) fail_msg("run %d: %s: %s", run, fp4d_verdict_name(r.verdict), r.detail);
    }
    free(cases);
    fp4d_backend_close(b);
}
static void test_cublas_bf16_grouped(void **state) { test_grouped(state, "cublas-bf16"); }

/* The GPU quantizer is bit-identical to fp4d_quantize (flashinfer-exact). */
static void test_cuda_quantize_bit_identical(void **state)
{
    (void)state;
    fp4d_backend_t b = open_or_skip("cuda");
    if (!b) skip();
    const fp4d_dtype srcs[] = {FP4D_DTYPE_F32, FP4D_DTYPE_BF16, FP4D_DTYPE_F16};
    for (int si = 0; si < 3; si++)
        for (int li = 0; li < 3; li++)
            for (int given = 0; given < 4; given++) {
                /* given & 2: cols % 64 == 0, the bf16 source's vectorized kernel; bf16 with
                 * given == 3: cols % 2048 == 0 and rows past 128 (the one-block-per-lane
                 * kernel, swizzled row groups) */
                const bool wide = si == 1 && given == 3;
                const int64_t rows = wide ? 129 + 128 * li : 37 + li;
                const int64_t cols = wide ? 2048 * (1 + li) : given & 2 ? 64 * (2 + si) : 16 * (5 + si);
                float *f = malloc((size_t)(rows * cols) * sizeof *f);
                for (int64_t i = 0; i < rows * cols; i++) {
                    const float u = rnd_unit();
                    /* magnitudes over many binades, and special values */
                    f[i] = u * ldexpf(1.0f, (int)(rnd() % 24) - 12);
                }
                for (int64_t c = 0; c < 16; c++) f[c] = 0.0f;           /* an all-zero block */
                f[16] = NAN;                                            /* NaN in a block */
                f[17] = -NAN;                                           /* and one with its sign set */
                f[40] = INFINITY;
                f[cols + 3] = -INFINITY;
                for (int64_t c = 32; c < 48 && cols >= 48; c++) f[cols * 2 + c] = 1e-30f; /* scale underflow */
                void *src = malloc((size_t)(rows * cols) * 4);
                fp4d_from_f32(srcs[si], f, (size_t)(rows * cols), src);
                const size_t cb = (size_t)(rows * cols / 2), sb = fp4d_scale_buffer_size(layouts[li], rows, cols / 16);
                uint8_t *c1 = malloc(cb), *c2 = malloc(cb), *s1 = malloc(sb), *s2 = malloc(sb);
                memset(s1, 0xAA, sb);
                memset(s2, 0x55, sb);
                fp4d_quantize_params qp = {FP4D_DTYPE_NVFP4, FP4D_CONV_FLASHINFER_EXACT, layouts[li], given & 1 ? 37.5f : 0.0f};
                fp4d_quantize_result r1;
                assert_int_equal(fp4d_quantize(&qp, srcs[si], src, rows, cols, c1, s1, &r1), FP4D_STATUS_OK);
                fp4d_quantize_problem q = {qp, srcs[si], src, rows, cols, c2, s2, {0, 0}};
                fp4d_reason why;
                fp4d_status st = fp4d_backend_quantize(b, &q, &why);
                if (st != FP4D_STATUS_OK) fprintf(stderr, "  quantize: %s %s\n", why.text, fp4d_last_error());
                assert_int_equal(st, FP4D_STATUS_OK);
                assert_memory_equal(c1, c2, cb);
                assert_memory_equal(s1, s2, sb);
                assert_true(r1.encode_scale == q.result.encode_scale);
                assert_true(r1.decode_scale == q.result.decode_scale);
                free(f);
                free(src);
                free(c1);
                free(c2);
                free(s1);
                free(s2);
            }
    fp4d_backend_close(b);
}

/* The quantize kernels round with f32_to_e2m1_fast: all 2^32 f32 patterns, through an FMUL
 * as in the kernels, give the same code as the comparison chain (f32_to_e2m1). */
static void test_cuda_e2m1_rounding_exhaustive(void **state)
{
    (void)state;
#ifdef FP4D_TEST_CUDA_KERNELS
    fp4d_backend_t b = open_or_skip("cuda");
    if (!b) skip();
    const float scales[] = {1.0f, 0.75f};
    for (int i = 0; i < 2; i++) {
        uint64_t bad = 0;
        uint32_t first = 0;
        assert_int_equal(fp4d_cuda_e2m1_sweep(scales[i], &bad, &first), 0);
        if (bad) fprintf(stderr, "  s = %g: %llu codes differ, first at x = 0x%08x\n", scales[i], (unsigned long long)bad, first);
        assert_int_equal(bad, 0);
        assert_int_equal(first, 0xFFFFFFFFu);
    }
    fp4d_backend_close(b);
#else
    skip();
#endif
}

#ifdef FP4D_TEST_CUDA_KERNELS
/* chained pairs per case, and the split-K scratch every launch of a case shares */
enum { CHAIN_PAIRS = 8 };
static const size_t chain_partial_bytes = 64u << 20, chain_counters = 1u << 20;

/* Device buffers of one chained GEMM pair and the scratch its launches share. */
typedef struct chain_bufs {
    void         *a, *y, *z[CHAIN_PAIRS], *scratch_a;
    uint8_t      *w1, *s1, *w2, *s2;
    uint8_t      *w1s, *s1s, *w2s, *s2s; /* the weights in the stream layout, for the stream kernel */
    float        *partials, *alphas;
    uint32_t     *counters;
    const uint8_t **tables; /* device: w1s, s1 / w2s, s2 pointer pairs for the skinny launches */
    fp4d_skinny_item *item;
} chain_bufs;

static void *dev_copy(const void *host, size_t bytes)
{
    void *d = NULL;
    assert_int_equal(cudaMalloc(&d, bytes ? bytes : 16), cudaSuccess);
    if (host) assert_int_equal(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    return d;
}

/* out = alpha * act (m x k, bf16, device) x W^T (n x k NVFP4, swizzled scales) on stream s
 * through the kernel the backend would pick - the GEMV (M = 1 and K % 256 != 0), the stream
 * kernel (M <= 16) or the wgmma/fused kernel - with out f32 or bf16, no synchronization. */
static void chain_gemm(chain_bufs *cb, int which, const void *act, int64_t m, int64_t n, int64_t k,
                       const float *alpha_dev, float alpha, int out_type, void *out, cudaStream_t s)
{
    const uint8_t *codes = which ? cb->w2 : cb->w1, *scales = which ? cb->s2 : cb->s1;
    int e;
    if (fp4d_cuda_gemv_applies(FP4D_DTYPE_BF16, FP4D_DTYPE_NVFP4, m, k)) {
        fp4d_gemv_args g = {FP4D_DTYPE_BF16, act, NULL, 0, (int32_t)m, FP4D_DTYPE_NVFP4, FP4D_LAYOUT_SWIZZLED_128X4, codes, scales,
                            alpha, n, k, out_type, out, 0, 0, 0, cb->partials, cb->counters};
        size_t pb = 0, cc = 0;
        assert_int_equal(fp4d_cuda_gemv_plan(&g, 132, &pb, &cc), 0);
        assert_true(pb <= chain_partial_bytes && cc <= chain_counters);
        e = fp4d_cuda_gemv(&g, s);
    } else if (m <= 16) {
        fp4d_skinny_args a = {FP4D_DTYPE_BF16, act, NULL, 0, m, FP4D_DTYPE_NVFP4, FP4D_LAYOUT_SWIZZLED_128X4, 1,
                              cb->tables + 2 * which, cb->tables + 2 * which + 1, alpha_dev, n, k, cb->item, 1, (int32_t)m,
                              out_type, out, 1, cb->partials, cb->counters, 1, 0, {0, 0, 0, 0}, NULL, NULL, 0.0f, 0};
        /* single = 0: the kernel reads its item and weights from the device tables (the
         * backend passes a dense GEMM's by value), so that path stays covered.
         * The tables hold {codes, scales} pairs: the scale pointer table starts one entry on,
         * and both are indexed by expert 0 only; the weights are settled (made before the
         * device synchronization that precedes the chain), so the stream kernel launches
         * early and loads its first weights before it waits for the kernel before it */
        a.splits = fp4d_cuda_skinny_pick_splits(&a, 132);
        size_t pb = 0, cc = 0;
        fp4d_cuda_skinny_scratch(n, 1, a.splits, (int32_t)m, &pb, &cc);
        assert_true(pb <= chain_partial_bytes && cc <= chain_counters);
        e = fp4d_cuda_skinny_gemm(&a, s);
    } else {
        const int32_t splits = fp4d_cuda_fused_splits(m, n, k, 132);
        size_t pf = 0, cc = 0;
        fp4d_cuda_fused_scratch(m, n, splits, &pf, &cc);
        assert_true(pf * sizeof(float) <= chain_partial_bytes && cc <= chain_counters);
        e = fp4d_cuda_fused_gemm(FP4D_DTYPE_BF16, act, codes, scales, FP4D_LAYOUT_SWIZZLED_128X4, m, n, k, alpha, out_type,
                                 out, splits, cb->partials, cb->counters, cb->scratch_a, s);
    }
    if (e != 0)
        fprintf(stderr, "  chained GEMM M=%lld N=%lld K=%lld: %s\n", (long long)m, (long long)n, (long long)k,
                cudaGetErrorString((cudaError_t)e));
    assert_int_equal(e, 0);
}

/*
 * Programmatic dependent launch: GEMM kernels start before the kernel ahead of them has
 * finished and must wait for it before touching what it writes. Eight chained pairs are
 * launched back to back with no synchronization: y = 2^i * (a x W1) in bf16, then
 * z_i = y x W2 - the second GEMM reads what the first is still writing (and the next first
 * GEMM overwrites y while the second may still read it). Scaling by 2^i commutes with every
 * rounding here, so z_i must be exactly 2^i * z_0, bit for bit; a read of y too early (the
 * previous pair's y, or the NaN it starts as) breaks that. The last z is also checked
 * against the exact reference. M = 1 (K = 2080: the GEMV, then the stream kernel in K
 * slices), 8 (the stream kernel, split) and 64 (the register-decode wgmma kernel after its
 * permute kernel). Afterwards the split-K counters must be zero again.
 */
static void test_cuda_pdl_chain(void **state)
{
    (void)state;
    fp4d_backend_t b = open_or_skip("cuda");
    if (!b) skip();
    /* without PDL (before sm_90, or FP4DOCTOR_CUDA_PDL=0) the chain is still checked, but
     * only stream order is then exercised */
    fprintf(stderr, "  programmatic dependent launch: %s\n", fp4d_cuda_pdl_active() ? "on" : "off");
    const int64_t N1 = 1536, N2 = 640;
    const int64_t ms[] = {1, 8, 64};
    for (int mi = 0; mi < 3; mi++) {
        const int64_t M = ms[mi], K = M == 1 ? 2080 : 2048;
        operand A, W1, W2;
        make_plain(&A, FP4D_DTYPE_BF16, M, K);
        make_fp4(&W1, FP4D_DTYPE_NVFP4, FP4D_LAYOUT_SWIZZLED_128X4, N1, K);
        make_fp4(&W2, FP4D_DTYPE_NVFP4, FP4D_LAYOUT_SWIZZLED_128X4, N2, N1);
        chain_bufs cb = {0};
        cb.a = dev_copy(A.data, (size_t)(M * K) * 2);
        cb.w1 = dev_copy(W1.data, (size_t)(N1 * K / 2));
        cb.s1 = dev_copy(W1.scales, fp4d_scale_buffer_size(FP4D_LAYOUT_SWIZZLED_128X4, N1, K / 16));
        cb.w2 = dev_copy(W2.data, (size_t)(N2 * N1 / 2));
        cb.s2 = dev_copy(W2.scales, fp4d_scale_buffer_size(FP4D_LAYOUT_SWIZZLED_128X4, N2, N1 / 16));
        cb.y = dev_copy(NULL, (size_t)(M * N1) * 2);
        assert_int_equal(cudaMemset(cb.y, 0xFF, (size_t)(M * N1) * 2), cudaSuccess); /* NaN */
        for (int i = 0; i < CHAIN_PAIRS; i++) cb.z[i] = dev_copy(NULL, (size_t)(M * N2) * 4);
        cb.scratch_a = dev_copy(NULL, (size_t)(M * (K > N1 ? K : N1)) * 2);
        cb.partials = dev_copy(NULL, chain_partial_bytes);
        cb.counters = dev_copy(NULL, chain_counters * sizeof(uint32_t));
        assert_int_equal(cudaMemset(cb.counters, 0, chain_counters * sizeof(uint32_t)), cudaSuccess);
        float alphas[CHAIN_PAIRS + 1]; /* the first GEMM's 2^i / 4, then the second GEMM's */
        for (int i = 0; i < CHAIN_PAIRS; i++) alphas[i] = ldexpf(0.25f, i);
        alphas[CHAIN_PAIRS] = 0.5f;
        cb.alphas = dev_copy(alphas, sizeof alphas);
        cb.w1s = dev_copy(NULL, fp4d_cuda_stream_codes_bytes(N1, K));
        cb.w2s = dev_copy(NULL, fp4d_cuda_stream_codes_bytes(N2, N1));
        cb.s1s = dev_copy(NULL, fp4d_cuda_stream_scales_bytes(N1, K));
        cb.s2s = dev_copy(NULL, fp4d_cuda_stream_scales_bytes(N2, N1));
        if (K % 256 == 0) {
            assert_int_equal(fp4d_cuda_stream_codes(cb.w1, cb.w1s, N1, K, NULL), 0);
            assert_int_equal(fp4d_cuda_stream_scales(cb.s1, FP4D_LAYOUT_SWIZZLED_128X4, FP4D_DTYPE_NVFP4, cb.s1s, N1, K, NULL), 0);
        }
        assert_int_equal(fp4d_cuda_stream_codes(cb.w2, cb.w2s, N2, N1, NULL), 0);
        assert_int_equal(fp4d_cuda_stream_scales(cb.s2, FP4D_LAYOUT_SWIZZLED_128X4, FP4D_DTYPE_NVFP4, cb.s2s, N2, N1, NULL), 0);
        const uint8_t *tables[4] = {cb.w1s, cb.s1s, cb.w2s, cb.s2s};
        cb.tables = dev_copy(tables, sizeof tables);
        const fp4d_skinny_item item = {0, (int32_t)M, 0, 0};
        cb.item = dev_copy(&item, sizeof item);
        cudaStream_t s;
        assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
        /* the uploads and memsets above went to the legacy stream, which s does not wait for */
        assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
        for (int i = 0; i < CHAIN_PAIRS; i++) {
            chain_gemm(&cb, 0, cb.a, M, N1, K, cb.alphas + i, alphas[i], FP4D_DTYPE_BF16, cb.y, s);
            chain_gemm(&cb, 1, cb.y, M, N2, N1, cb.alphas + CHAIN_PAIRS, alphas[CHAIN_PAIRS], FP4D_DTYPE_F32, cb.z[i], s);
        }
        assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
        /* the split-K counters are handed back as they were given: zero */
        uint32_t *counters = malloc(chain_counters * sizeof(uint32_t));
        assert_non_null(counters);
        assert_int_equal(cudaMemcpy(counters, cb.counters, chain_counters * sizeof(uint32_t), cudaMemcpyDeviceToHost),
                         cudaSuccess);
        size_t nonzero = 0;
        for (size_t i = 0; i < chain_counters; i++) nonzero += counters[i] != 0;
        free(counters);
        if (nonzero) fprintf(stderr, "  M = %lld: %zu split-K counters left non-zero\n", (long long)M, nonzero);
        assert_int_equal(nonzero, 0);
        float *z[CHAIN_PAIRS];
        uint16_t *y = malloc((size_t)(M * N1) * 2);
        assert_non_null(y);
        for (int i = 0; i < CHAIN_PAIRS; i++) {
            z[i] = malloc((size_t)(M * N2) * 4);
            assert_non_null(z[i]);
            assert_int_equal(cudaMemcpy(z[i], cb.z[i], (size_t)(M * N2) * 4, cudaMemcpyDeviceToHost), cudaSuccess);
        }
        assert_int_equal(cudaMemcpy(y, cb.y, (size_t)(M * N1) * 2, cudaMemcpyDeviceToHost), cudaSuccess);
        int bad = 0;
        for (int i = 1; i < CHAIN_PAIRS; i++)
            for (int64_t j = 0; j < M * N2; j++)
                if (!(z[i][j] == ldexpf(z[0][j], i)) && bad++ < 5)
                    fprintf(stderr, "  M = %lld: z_%d[%lld] = %.9g, 2^%d z_0 = %.9g\n", (long long)M, i, (long long)j,
                            (double)z[i][j], i, (double)ldexpf(z[0][j], i));
        /* the last pair against the exact reference, from the y it read */
        const fp4d_matrix ym = {FP4D_DTYPE_BF16, M, N1, y, NULL, FP4D_LAYOUT_LINEAR};
        float *ref = malloc((size_t)(M * N2) * 4);
        assert_non_null(ref);
        fp4d_gemm_problem p = {ym, W2.m, alphas[CHAIN_PAIRS], FP4D_DTYPE_F32, ref};
        assert_int_equal(fp4d_ref_gemm(&p), FP4D_STATUS_OK);
        float *af = to_f32(&ym), *bf = to_f32(&W2.m);
        char label[64];
        snprintf(label, sizeof label, "chained GEMM M=%lld", (long long)M);
        bad += compare(label, &p, z[CHAIN_PAIRS - 1], ref, af, bf, 0);
        assert_int_equal(bad, 0);
        free(af);
        free(bf);
        free(ref);
        free(y);
        for (int i = 0; i < CHAIN_PAIRS; i++) {
            free(z[i]);
            cudaFree(cb.z[i]);
        }
        void *bufs[] = {cb.a,   cb.y,   cb.scratch_a, cb.w1,       cb.s1,    cb.w2,           cb.s2,  cb.w1s,
                        cb.s1s, cb.w2s, cb.s2s,       cb.partials, cb.alphas, cb.counters, (void *)cb.tables, cb.item};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) cudaFree(bufs[i]);
        cudaStreamDestroy(s);
        free_operand(&A);
        free_operand(&W1);
        free_operand(&W2);
    }
    fp4d_backend_close(b);
}
#else
static void test_cuda_pdl_chain(void **state)
{
    (void)state;
    skip();
}
#endif

/* cublaslt / cudnn: either cuBLASLt/cuDNN says no, with its own words, or the result is
 * right. */
static void native_backend(const char *name)
{
    fp4d_backend_t b = open_or_skip(name);
    if (!b) skip();
    const fp4d_dtype fmts[] = {FP4D_DTYPE_NVFP4, FP4D_DTYPE_MXFP4};
    for (int f = 0; f < 2; f++) {
        fp4d_gemm_desc d = {128, 256, 256, fmts[f], fmts[f], FP4D_DTYPE_BF16, FP4D_LAYOUT_SWIZZLED_128X4,
                            FP4D_LAYOUT_SWIZZLED_128X4, 0};
        fp4d_reason why = {{0}};
        if (!fp4d_backend_supports(b, &d, &why)) {
            fprintf(stderr, "  %s %s: UNSUPPORTED: %s\n", name, fp4d_dtype_get(fmts[f])->name, why.text);
            assert_true(strlen(why.text) > 10);
            continue;
        }
        assert_int_equal(run_case(b, fmts[f], fmts[f], FP4D_LAYOUT_SWIZZLED_128X4, FP4D_LAYOUT_LINEAR, FP4D_DTYPE_BF16,
                                  128, 256, 256),
                         0);
    }
    fp4d_backend_close(b);
}

#ifdef FP4D_TEST_CUDA_KERNELS
/* Skips the test unless the cuda backend opens; its context stays current for the test's own
 * CUDA calls. */
static void cuda_context_or_skip(void)
{
    fp4d_backend_t b = open_or_skip("cuda");
    if (!b) skip();
    fp4d_backend_close(b);
}
#endif

/*
 * The bench's stream hold (fp4d_cuda_hold_stream): work enqueued behind it waits until it
 * ends, and it lasts at least as long as asked, so that a timed batch queued meanwhile runs
 * back to back after it.
 */
static void test_cuda_hold_stream(void **state)
{
    (void)state;
#ifndef FP4D_TEST_CUDA_KERNELS
    skip(); /* built without the CUDA kernels */
#else
    cuda_context_or_skip();
    cudaStream_t s;
    cudaEvent_t e0, e1;
    assert_int_equal(cudaStreamCreate(&s), cudaSuccess);
    assert_int_equal(cudaEventCreate(&e0), cudaSuccess);
    assert_int_equal(cudaEventCreate(&e1), cudaSuccess);
    const uint64_t ns[] = {20000000u, 300000u}; /* 20 ms, then a bench-sized 300 us */
    for (int i = 0; i < 2; i++) {
        assert_int_equal(cudaEventRecord(e0, s), cudaSuccess);
        assert_int_equal(fp4d_cuda_hold_stream(ns[i], s), cudaSuccess);
        assert_int_equal(cudaEventRecord(e1, s), cudaSuccess);
        /* the host gets here within microseconds: a 20 ms hold is still running */
        if (i == 0) assert_int_equal(cudaEventQuery(e1), cudaErrorNotReady);
        assert_int_equal(cudaEventSynchronize(e1), cudaSuccess);
        float ms = 0.0f;
        assert_int_equal(cudaEventElapsedTime(&ms, e0, e1), cudaSuccess);
        fprintf(stderr, "  hold of %.3f ms took %.3f ms\n", (double)ns[i] * 1e-6, (double)ms);
        assert_true((double)ms >= (double)ns[i] * 1e-6 * 0.99); /* event resolution ~0.5 us */
        assert_true(ms < 10000.0f);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaStreamDestroy(s);
#endif
}

/* A device buffer grows in the order of its own stream. Another stream is held busy for 2 s;
 * growing a buffer of this stream, with zeroing, must come back while the busy stream is still
 * running (growth called cudaDeviceSynchronize, which waited for every instance's work and
 * hangs compute-sanitizer's racecheck from several threads: tools/racecheck_threads.cu), and
 * the grown buffer must read zero to this stream's later work, though this stream filled the
 * old one just before. */
static void test_cuda_buffer_grows_in_stream_order(void **state)
{
    (void)state;
#ifndef FP4D_TEST_CUDA_KERNELS
    skip(); /* built without the CUDA kernels */
#else
    cuda_context_or_skip();
    int dev = 0, pools = 0;
    assert_int_equal(cudaGetDevice(&dev), cudaSuccess);
    assert_int_equal(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, dev), cudaSuccess);
    if (!pools) {
        fprintf(stderr, "  no memory pools on this device: growth waits for its stream, then cudaFree\n");
        skip();
    }
    cudaStream_t busy, mine;
    assert_int_equal(cudaStreamCreateWithFlags(&busy, cudaStreamNonBlocking), cudaSuccess);
    assert_int_equal(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking), cudaSuccess);
    assert_int_equal(fp4d_cuda_hold_stream(2000000000u, busy), cudaSuccess);
    enum { SMALL = 4096, LARGE = 1 << 20 };
    fp4d_devbuf buf = {0};
    assert_int_equal(fp4d_devbuf_reserve(&buf, SMALL, true, mine), FP4D_STATUS_OK);
    assert_int_equal(cudaMemsetAsync(buf.ptr, 0xAB, SMALL, mine), cudaSuccess);
    assert_int_equal(fp4d_devbuf_reserve(&buf, SMALL / 2, true, mine), FP4D_STATUS_OK); /* fits: kept */
    assert_int_equal(fp4d_devbuf_reserve(&buf, LARGE, true, mine), FP4D_STATUS_OK);
    assert_true(buf.cap >= LARGE);
    assert_int_equal(cudaStreamQuery(busy), cudaErrorNotReady);
    uint8_t *host = malloc(LARGE);
    assert_non_null(host);
    memset(host, 0x5A, LARGE);
    assert_int_equal(cudaMemcpyAsync(host, buf.ptr, LARGE, cudaMemcpyDeviceToHost, mine), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(mine), cudaSuccess);
    size_t nonzero = 0;
    for (size_t i = 0; i < LARGE; i++) nonzero += host[i] != 0;
    assert_int_equal(nonzero, 0);
    free(host);
    assert_int_equal(cudaStreamSynchronize(busy), cudaSuccess);
    fp4d_devbuf_free(&buf);
    assert_null(buf.ptr);
    cudaStreamDestroy(busy);
    cudaStreamDestroy(mine);
#endif
}

#ifdef FP4D_TEST_CUDA_KERNELS
/* The few driver-API calls the tests make, through dlopen: linked, libcuda would keep this
 * file from starting on machines without a driver (CI), where its tests must skip. */
typedef struct driver_api {
    void *lib;
    int (*init)(unsigned);
    int (*device_get)(int *, int);
    int (*primary_ctx_state)(int, unsigned *, int *);
    int (*ctx_create)(void **, unsigned, int); /* the CUDA 12 signature, still exported by CUDA 13 drivers */
    int (*ctx_destroy)(void *);
    int (*ctx_get)(void **);
    int (*ctx_set)(void *);
} driver_api;

/* Skips the test (cmocka's skip() leaves from here too) when fp4d_cuda_query, the query that
 * opens no context, finds no GPU. */
static void driver_api_open(driver_api *d, fp4d_cuda_info *ci)
{
    fp4d_cuda_query(ci);
    if (ci->device_count == 0) skip();
    d->lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    assert_non_null(d->lib);
    d->init              = (int (*)(unsigned))dlsym(d->lib, "cuInit");
    d->device_get        = (int (*)(int *, int))dlsym(d->lib, "cuDeviceGet");
    d->primary_ctx_state = (int (*)(int, unsigned *, int *))dlsym(d->lib, "cuDevicePrimaryCtxGetState");
    d->ctx_create        = (int (*)(void **, unsigned, int))dlsym(d->lib, "cuCtxCreate_v2");
    d->ctx_destroy       = (int (*)(void *))dlsym(d->lib, "cuCtxDestroy_v2");
    d->ctx_get           = (int (*)(void **))dlsym(d->lib, "cuCtxGetCurrent");
    d->ctx_set           = (int (*)(void *))dlsym(d->lib, "cuCtxSetCurrent");
    assert_true(d->init && d->device_get && d->primary_ctx_state && d->ctx_create && d->ctx_destroy && d->ctx_get &&
                d->ctx_set);
    assert_int_equal(d->init(0), 0);
}
#endif

/* The query `check`'s parent makes (fp4d_cuda_query) creates no CUDA context: one held by the
 * parent on every GPU kept its children from a GPU in EXCLUSIVE_PROCESS mode. Runs first, in a
 * process that has done nothing on the GPU yet but fp4d_registry_init. */
static void test_query_opens_no_context(void **state)
{
    (void)state;
#ifdef FP4D_TEST_CUDA_KERNELS
    fp4d_cuda_info ci;
    driver_api cu;
    driver_api_open(&cu, &ci);
    for (int d = 0; d < ci.device_count; d++) {
        int dev = -1, active = -1;
        unsigned flags = 0;
        assert_int_equal(cu.device_get(&dev, d), 0);
        assert_int_equal(cu.primary_ctx_state(dev, &flags, &active), 0);
        fprintf(stderr, "  GPU %d (%s): primary context %s after the query\n", d, ci.gpus[d].name,
                active ? "ACTIVE" : "inactive");
        assert_int_equal(active, 0);
    }
    dlclose(cu.lib);
#else
    skip();
#endif
}

#ifdef FP4D_TEST_CUDA_KERNELS
/* In a process of its own (re-executed, argv[1] = "--lose-context"): a pending error that is
 * not sticky is not a lost context; a kernel writing to an address that is not mapped is; and
 * a backend opened before can still be closed then (the doctor's child closes its backend
 * before it retires). */
static int lose_context_child(void)
{
    char why[256] = "";
    void *p = NULL;
    fp4d_backend_t b = NULL;
    fp4d_reason reason;
    if (fp4d_registry_init(NULL) != FP4D_STATUS_OK || fp4d_backend_open("cuda", 0, &b, &reason) != FP4D_STATUS_OK)
        return 9;
    if (cudaSetDevice(0) != cudaSuccess || cudaMalloc(&p, 4096) != cudaSuccess) return 10;
    if (fp4d_cuda_context_lost(0, why, sizeof why)) return 11;
    void *huge = NULL;
    if (cudaMalloc(&huge, (size_t)1 << 62) == cudaSuccess) return 12; /* fails, not sticky */
    if (fp4d_cuda_context_lost(0, why, sizeof why)) return 13;
    if (cudaMemset(p, 0, 4096) != cudaSuccess) return 14; /* the context still works */
    (void)fp4d_cuda_fill_random_fp4((uint8_t *)(uintptr_t)0x10, (size_t)1 << 20, 1, NULL);
    if (!fp4d_cuda_context_lost(0, why, sizeof why)) return 15;
    fprintf(stderr, "  %s\n", why);
    fp4d_backend_close(b);
    return strstr(why, "cudaError") ? 0 : 16;
}
#endif

static void test_cuda_context_lost(void **state)
{
    (void)state;
#ifdef FP4D_TEST_CUDA_KERNELS
    fp4d_cuda_info ci;
    fp4d_cuda_query(&ci);
    if (ci.device_count == 0) skip();
    /* Under compute-sanitizer (which follows child processes and sets NV_SANITIZER_* in
     * them) or another tool attached through CUDA's injection hook, the deliberate illegal
     * writes below are 200,000 reported errors (memcheck on an H200), and a sanitizer run of
     * this file would never be clean. */
    if (getenv("NV_SANITIZER_INJECTION_PORT_BASE") || getenv("CUDA_INJECTION64_PATH")) {
        fprintf(stderr, "  skipped: a CUDA tool is attached (compute-sanitizer or an injection)\n");
        skip();
    }
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execl("/proc/self/exe", "test_gpu_backends", "--lose-context", (char *)NULL);
        _exit(127);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
#else
    skip();
#endif
}

/* The wgmma kernels are chosen only where the image the driver loaded was compiled with
 * sm_90a's features. compute_90 PTX JIT-compiled on a 9.0 GPU reports binary version 90 like
 * the sm_90a SASS, and its wgmma kernels only trap (their #else). ctest runs it also under
 * CUDA_FORCE_PTX_JIT=1 (gpu_backends_ptx_jit), which makes the driver load the PTX: then no
 * wgmma, and the GEMM of 300 rows below (a large-M path) still matches the reference. */
static void test_wgmma_follows_loaded_image(void **state)
{
    (void)state;
#ifdef FP4D_TEST_CUDA_KERNELS
    fp4d_backend_t b = open_or_skip("cuda");
    if (!b) skip();
    fp4d_cuda_info ci;
    fp4d_cuda_query(&ci);
    int bin = 0, ptx = 0;
    assert_int_equal(fp4d_cuda_kernel_binary_version(0, &bin, &ptx), 0);
    const char *force = getenv("CUDA_FORCE_PTX_JIT");
    const bool jit = force && atoi(force) != 0;
    const bool wgmma = fp4d_cuda_dense_wgmma_available() != 0;
    fprintf(stderr, "  GPU 0 sm_%d%d, built %s: image binary version %d, PTX version %d%s; wgmma %s\n",
            ci.gpus[0].cc_major, ci.gpus[0].cc_minor, ci.built_archs, bin, ptx, jit ? " (PTX forced)" : "",
            wgmma ? "used" : "not used");
    const bool on_90 = ci.gpus[0].cc_major == 9 && ci.gpus[0].cc_minor == 0;
    const bool sass_90a = strstr(ci.built_archs, "sm_90a") != NULL, ptx_90a = strstr(ci.built_archs, "compute_90a") != NULL;
    /* Which image the driver takes where compute_90a PTX competes (forced JIT, or no sm_90a
     * SASS) is its choice; everywhere else the answer is known. */
    if (!(on_90 && ptx_90a && (jit || !sass_90a))) assert_int_equal(wgmma, on_90 && sass_90a && !jit);
    assert_int_equal(run_case(b, FP4D_DTYPE_BF16, FP4D_DTYPE_NVFP4, FP4D_LAYOUT_LINEAR, FP4D_LAYOUT_SWIZZLED_128X4,
                              FP4D_DTYPE_BF16, 300, 256, 512), 0);
    fp4d_backend_close(b);
#else
    skip();
#endif
}

/* A program that uses CUDA itself finds its thread as it left it after calls into a GPU
 * backend, which selects its device (cudaSetDevice) and so makes that device's primary context
 * current: a thread with no context gets none left behind, and a program's own context (made
 * with the driver API here) is current again after open, gemm and close. */
static void test_caller_context_kept(void **state)
{
    (void)state;
#ifdef FP4D_TEST_CUDA_KERNELS
    fp4d_cuda_info ci;
    driver_api cu;
    driver_api_open(&cu, &ci);
    int dev = -1;
    assert_int_equal(cu.device_get(&dev, 0), 0);

    void *now = (void *)1;
    assert_int_equal(cu.ctx_set(NULL), 0);
    fp4d_backend_t b = open_or_skip("cuda");
    if (!b) skip();
    assert_int_equal(cu.ctx_get(&now), 0);
    assert_null(now); /* before: GPU 0's primary context */

    void *mine = NULL;
    assert_int_equal(cu.ctx_create(&mine, 0, dev), 0); /* current from here */
    assert_int_equal(run_case(b, FP4D_DTYPE_BF16, FP4D_DTYPE_NVFP4, FP4D_LAYOUT_LINEAR, FP4D_LAYOUT_LINEAR,
                              FP4D_DTYPE_F32, 3, 64, 256), 0);
    assert_int_equal(cu.ctx_get(&now), 0);
    assert_ptr_equal(now, mine);
    fp4d_backend_close(b);
    assert_int_equal(cu.ctx_get(&now), 0);
    assert_ptr_equal(now, mine);
    assert_int_equal(cu.ctx_set(NULL), 0);
    assert_int_equal(cu.ctx_destroy(mine), 0);
    dlclose(cu.lib);
#else
    skip();
#endif
}

static void test_cublaslt(void **state) { (void)state; native_backend("cublaslt"); }
static void test_cudnn(void **state) { (void)state; native_backend("cudnn"); }

int main(int argc, char **argv)
{
#ifdef FP4D_TEST_CUDA_KERNELS
    if (argc > 1 && !strcmp(argv[1], "--lose-context")) return lose_context_child();
#else
    (void)argc, (void)argv;
#endif
    assert_int_equal(fp4d_registry_init(NULL), FP4D_STATUS_OK);
    /* FP4D_GPU_TEST_FILTER=test_cuda* runs a subset (e.g. under compute-sanitizer) */
    if (getenv("FP4D_GPU_TEST_FILTER")) cmocka_set_test_filter(getenv("FP4D_GPU_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_query_opens_no_context), /* first: nothing has touched the GPU yet */
        cmocka_unit_test(test_cuda_context_lost),
        cmocka_unit_test(test_wgmma_follows_loaded_image),
        cmocka_unit_test(test_caller_context_kept),
        cmocka_unit_test(test_cuda_gemm_sweep),
        cmocka_unit_test(test_cuda_deterministic_split_k),
        cmocka_unit_test(test_cuda_gemv),
        cmocka_unit_test(test_cuda_fused),
        cmocka_unit_test(test_cuda_fused_dense),
        cmocka_unit_test(test_cuda_fused_smem_dequant),
        cmocka_unit_test(test_cuda_fused_deterministic),
        cmocka_unit_test(test_cuda_dense_tail),
        cmocka_unit_test(test_cuda_grouped),
        cmocka_unit_test(test_cuda_grouped_concurrent),
        cmocka_unit_test(test_cuda_wa),
        cmocka_unit_test(test_cuda_wa_staging_placement),
        cmocka_unit_test(test_cuda_wa_natural_layout),
        cmocka_unit_test(test_cuda_wa_three_splits),
        cmocka_unit_test(test_cuda_wa_two_warps_per_row_group),
        cmocka_unit_test(test_cuda_wa_wide_staging),
        cmocka_unit_test(test_cuda_wa_cluster_exchange),
        cmocka_unit_test(test_cuda_wa_wide_blocks),
        cmocka_unit_test(test_cuda_wa_kslices),
        cmocka_unit_test(test_cuda_pdl_chain),
        cmocka_unit_test(test_cuda_hold_stream),
        cmocka_unit_test(test_cuda_buffer_grows_in_stream_order),
        cmocka_unit_test(test_cuda_quantize_bit_identical),
        cmocka_unit_test(test_cuda_e2m1_rounding_exhaustive),
        cmocka_unit_test(test_cublas_bf16_gemm_sweep),
        cmocka_unit_test(test_cublas_bf16_grouped),
        cmocka_unit_test(test_cublaslt),
        cmocka_unit_test(test_cudnn),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
