/*
 * The `cpu` backend against the exact reference: every format pair of DESIGN.md §3, every
 * output type, linear and swizzled scales, every kernel flavour this CPU can run (generic,
 * AVX2, AVX-512), both strategies (small M and packed), several thread counts, grouped MoE
 * with experts that get no tokens, and quantize bit-identical to fp4d_quantize.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include <cmocka.h>

#include "backend/backend_internal.h"
#include "backend/cpu/cpu_internal.h"
#include "internal.h"
#include "test_backend_util.h"

static const fp4d_dtype a_types[] = {FP4D_DTYPE_NVFP4, FP4D_DTYPE_MXFP4, FP4D_DTYPE_BF16, FP4D_DTYPE_F16,
                                     FP4D_DTYPE_F32};
static const fp4d_dtype b_types[] = {FP4D_DTYPE_NVFP4, FP4D_DTYPE_MXFP4};
static const fp4d_dtype out_types[] = {FP4D_DTYPE_F32, FP4D_DTYPE_BF16, FP4D_DTYPE_F16};

/* Fills out with a NaN pattern so that unwritten elements fail the bound. */
static void poison(void *out, size_t bytes) { memset(out, 0xFF, bytes); }

/* Runs one problem on the engine with isa/threads and checks every element against the
 * reference's exact value. Returns the worst error / bound ratio. */
static double check_case(fp4d_dtype at, fp4d_dtype bt, fp4d_dtype ot, fp4d_scale_layout al, fp4d_scale_layout bl,
                         int64_t m, int64_t n, int64_t k, fp4d_cpu_isa isa, int threads, uint64_t seed)
{
    tb_rng     rng = {seed};
    tb_operand a, b;
    tb_operand_make(&a, at, al, m, k, &rng);
    tb_operand_make(&b, bt, bl, n, k, &rng);
    size_t esz = fp4d_out_elem_size(ot);
    void  *out = malloc((size_t)(m * n) * esz);
    poison(out, (size_t)(m * n) * esz);
    fp4d_gemm_problem p = {a.m, b.m, -0.8125f, ot, out};
    assert_int_equal(fp4d_cpu_run_problem(&p, isa, threads), FP4D_STATUS_OK);
    double worst = 0.0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double   exact, dot, abs_sum, ratio;
            uint32_t elem;
            assert_int_equal(fp4d_ref_gemm_element(&p, i, j, &elem, &exact), FP4D_STATUS_OK);
            tb_dot(a.exact + i * k, b.exact + j * k, k, &dot, &abs_sum);
            /* The reference and an independent double computation agree. */
            assert_true(fabs(exact - dot * p.alpha) <= 1e-12 * abs_sum + 1e-300);
            double got = tb_out_get(ot, out, i * n + j);
            if (!tb_within_bound(ot, got, exact, abs_sum, p.alpha, k, &ratio)) {
                print_error("%s x %s -> %s, layouts %d/%d, %lldx%lldx%lld, isa %s, %d threads: [%lld,%lld] got %.9g "
                            "exact %.9g (%.2f x bound)\n",
                            fp4d_dtype_get(at)->name, fp4d_dtype_get(bt)->name, fp4d_dtype_get(ot)->name, (int)al,
                            (int)bl, (long long)m, (long long)n, (long long)k, fp4d_cpu_isa_name(isa), threads,
                            (long long)i, (long long)j, got, exact, ratio);
                fail();
            }
            if (ratio > worst) worst = ratio;
        }
    free(out);
    tb_operand_free(&a);
    tb_operand_free(&b);
    return worst;
}

/* Every format pair x output type x layout, on a shape with edge tiles, best ISA. */
static void test_every_format_pair(void **state)
{
    (void)state;
    fp4d_cpu_isa isa  = fp4d_cpu_isa_detect();
    uint64_t     seed = 1;
    for (size_t ia = 0; ia < FP4D_ARRAY_LEN(a_types); ia++)
        for (size_t ib = 0; ib < FP4D_ARRAY_LEN(b_types); ib++)
            for (size_t io = 0; io < FP4D_ARRAY_LEN(out_types); io++)
                for (int lay = 0; lay < 2; lay++) {
                    fp4d_scale_layout l = lay ? FP4D_LAYOUT_SWIZZLED_128X4 : FP4D_LAYOUT_LINEAR;
                    /* small-M path and packed path */
                    check_case(a_types[ia], b_types[ib], out_types[io], l, l, 3, 37, 96, isa, 2, seed++);
                    check_case(a_types[ia], b_types[ib], out_types[io], l, l, 23, 37, 96, isa, 2, seed++);
                }
}

/* Each kernel flavour the CPU can run, both strategies, with edges in M, N and K blocks. */
static void test_every_isa(void **state)
{
    (void)state;
    for (int isa = 0; isa < FP4D_CPU_ISA_COUNT; isa++) {
        if (!fp4d_cpu_isa_available((fp4d_cpu_isa)isa)) {
            print_message("isa %s not available here: skipped\n", fp4d_cpu_isa_name((fp4d_cpu_isa)isa));
            continue;
        }
        const int64_t shapes[][3] = {{1, 67, 4096 / 8}, {2, 19, 64}, {4, 8, 32}, {5, 33, 160},
                                     {15, 130, 288}, {16, 40, 32}, {37, 51, 544}, {130, 70, 96}};
        for (size_t s = 0; s < FP4D_ARRAY_LEN(shapes); s++)
            for (int threads = 1; threads <= 3; threads += 2) {
                check_case(FP4D_DTYPE_NVFP4, FP4D_DTYPE_NVFP4, FP4D_DTYPE_F32, FP4D_LAYOUT_SWIZZLED_128X4,
                           FP4D_LAYOUT_SWIZZLED_128X4, shapes[s][0], shapes[s][1], shapes[s][2], (fp4d_cpu_isa)isa,
                           threads, 100 + s);
                check_case(FP4D_DTYPE_BF16, FP4D_DTYPE_MXFP4, FP4D_DTYPE_BF16, FP4D_LAYOUT_LINEAR, FP4D_LAYOUT_LINEAR,
                           shapes[s][0], shapes[s][1], shapes[s][2], (fp4d_cpu_isa)isa, threads, 200 + s);
            }
        /* NVFP4 with K = 16 (mod 32): a lone last block, and nibble-swapped reads */
        const int64_t odd_k[][3] = {{1, 9, 16}, {3, 17, 80}, {2, 5, 208}, {20, 33, 80}};
        for (size_t s = 0; s < FP4D_ARRAY_LEN(odd_k); s++) {
            check_case(FP4D_DTYPE_NVFP4, FP4D_DTYPE_NVFP4, FP4D_DTYPE_F32, FP4D_LAYOUT_LINEAR, FP4D_LAYOUT_SWIZZLED_128X4,
                       odd_k[s][0], odd_k[s][1], odd_k[s][2], (fp4d_cpu_isa)isa, 2, 300 + s);
            check_case(FP4D_DTYPE_F16, FP4D_DTYPE_NVFP4, FP4D_DTYPE_F16, FP4D_LAYOUT_LINEAR, FP4D_LAYOUT_SWIZZLED_8X4,
                       odd_k[s][0], odd_k[s][1], odd_k[s][2], (fp4d_cpu_isa)isa, 1, 400 + s);
        }
    }
}

/* The 8x4 layout and mixed layouts (A swizzled, B linear). */
static void test_other_layouts(void **state)
{
    (void)state;
    fp4d_cpu_isa isa = fp4d_cpu_isa_detect();
    check_case(FP4D_DTYPE_NVFP4, FP4D_DTYPE_NVFP4, FP4D_DTYPE_F32, FP4D_LAYOUT_SWIZZLED_8X4, FP4D_LAYOUT_SWIZZLED_8X4,
               9, 21, 80, isa, 2, 7);
    check_case(FP4D_DTYPE_NVFP4, FP4D_DTYPE_NVFP4, FP4D_DTYPE_F16, FP4D_LAYOUT_SWIZZLED_128X4, FP4D_LAYOUT_LINEAR,
               33, 17, 64, isa, 2, 8);
    check_case(FP4D_DTYPE_MXFP4, FP4D_DTYPE_MXFP4, FP4D_DTYPE_BF16, FP4D_LAYOUT_LINEAR, FP4D_LAYOUT_SWIZZLED_128X4,
               2, 300, 64, isa, 2, 9);
}

/* Through the registry, as `fp4doctor gemm --backend cpu` runs it. */
static void test_through_registry(void **state)
{
    (void)state;
    assert_int_equal(fp4d_registry_init(NULL), FP4D_STATUS_OK);
    fp4d_backend_t cpu;
    fp4d_reason    why;
    assert_int_equal(fp4d_backend_open("cpu", -1, &cpu, &why), FP4D_STATUS_OK);
    tb_rng     rng = {42};
    tb_operand a, b;
    tb_operand_make(&a, FP4D_DTYPE_NVFP4, FP4D_LAYOUT_SWIZZLED_128X4, 20, 128, &rng);
    tb_operand_make(&b, FP4D_DTYPE_NVFP4, FP4D_LAYOUT_SWIZZLED_128X4, 48, 128, &rng);
    float             out[20 * 48], ref[20 * 48];
    fp4d_gemm_problem p = {a.m, b.m, 0.001953125f, FP4D_DTYPE_F32, out};
    assert_int_equal(fp4d_backend_gemm(cpu, &p, &why), FP4D_STATUS_OK);
    p.out = ref;
    assert_int_equal(fp4d_ref_gemm(&p), FP4D_STATUS_OK);
    for (int i = 0; i < 20 * 48; i++) {
        double dot, abs_sum;
        tb_dot(a.exact + (i / 48) * 128, b.exact + (i % 48) * 128, 128, &dot, &abs_sum);
        assert_true(tb_within_bound(FP4D_DTYPE_F32, out[i], dot * p.alpha, abs_sum, p.alpha, 128, NULL));
        assert_true(fabs((double)out[i] - ref[i]) <= 1e-4 * abs_sum * p.alpha + 1e-30);
    }
    /* A malformed problem is INVALID_ARG with a reason, not a crash. */
    p.b.cols = 100;
    assert_int_equal(fp4d_backend_gemm(cpu, &p, &why), FP4D_STATUS_INVALID_ARG);
    assert_true(strlen(why.text) > 0);
    fp4d_backend_close(cpu);
    tb_operand_free(&a);
    tb_operand_free(&b);
}

/* NaN in a scale and Inf in the activations propagate as IEEE arithmetic would. */
static void test_nan_propagation(void **state)
{
    (void)state;
    tb_rng     rng = {5};
    tb_operand a, b;
    tb_operand_make(&a, FP4D_DTYPE_F32, FP4D_LAYOUT_LINEAR, 2, 32, &rng);
    tb_operand_make(&b, FP4D_DTYPE_NVFP4, FP4D_LAYOUT_LINEAR, 3, 32, &rng);
    b.scales[1 * 2 + 1] = 0x7F; /* row 1, second block: NaN scale */
    float             out[6];
    fp4d_gemm_problem p = {a.m, b.m, 1.0f, FP4D_DTYPE_F32, out};
    for (int isa = 0; isa < FP4D_CPU_ISA_COUNT; isa++) {
        if (!fp4d_cpu_isa_available((fp4d_cpu_isa)isa)) continue;
        assert_int_equal(fp4d_cpu_run_problem(&p, (fp4d_cpu_isa)isa, 1), FP4D_STATUS_OK);
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 3; j++) assert_true(j == 1 ? isnan(out[i * 3 + j]) : isfinite(out[i * 3 + j]));
    }
    tb_operand_free(&a);
    tb_operand_free(&b);
}

/* Grouped MoE: uneven loads, experts with zero tokens (first, middle, last). */
static void test_grouped_moe(void **state)
{
    (void)state;
    const int32_t     experts = 6;
    const int64_t     offsets[7] = {0, 0, 5, 5, 40, 41, 41}; /* experts 0, 2, 5 get nothing */
    const int64_t     n = 24, k = 64, rows = offsets[experts];
    const fp4d_dtype  ats[] = {FP4D_DTYPE_NVFP4, FP4D_DTYPE_BF16};
    for (size_t t = 0; t < FP4D_ARRAY_LEN(ats); t++)
        for (int lay = 0; lay < 2; lay++) {
            fp4d_scale_layout l   = lay ? FP4D_LAYOUT_SWIZZLED_128X4 : FP4D_LAYOUT_LINEAR;
            tb_rng            rng = {77 + t * 2 + (uint64_t)lay};
            tb_operand        a, b[6];
            fp4d_matrix       bm[6];
            float             alpha[6];
            tb_operand_make(&a, ats[t], l, rows, k, &rng);
            for (int e = 0; e < experts; e++) {
                tb_operand_make(&b[e], FP4D_DTYPE_NVFP4, l, n, k, &rng);
                bm[e]    = b[e].m;
                alpha[e] = 0.5f + 0.25f * (float)e;
            }
            uint16_t                  out[41 * 24];
            fp4d_grouped_gemm_problem p = {experts, offsets, a.m, bm, alpha, FP4D_DTYPE_BF16, out};
            poison(out, sizeof out);
            fp4d_backend_t cpu;
            fp4d_reason    why;
            assert_int_equal(fp4d_backend_open("cpu", -1, &cpu, &why), FP4D_STATUS_OK);
            assert_int_equal(fp4d_backend_grouped_gemm(cpu, &p, &why), FP4D_STATUS_OK);
            fp4d_backend_close(cpu);
            uint16_t ref[41 * 24];
            assert_int_equal(fp4d_ref_grouped_gemm(&(fp4d_grouped_gemm_problem){experts, offsets, a.m, bm, alpha,
                                                                                 FP4D_DTYPE_BF16, ref}),
                             FP4D_STATUS_OK);
            for (int e = 0; e < experts; e++)
                for (int64_t r = offsets[e]; r < offsets[e + 1]; r++)
                    for (int64_t j = 0; j < n; j++) {
                        double dot, abs_sum;
                        tb_dot(a.exact + r * k, b[e].exact + j * k, k, &dot, &abs_sum);
                        double got = tb_out_get(FP4D_DTYPE_BF16, out, r * n + j);
                        assert_true(tb_within_bound(FP4D_DTYPE_BF16, got, dot * alpha[e], abs_sum, alpha[e], k, NULL));
                        /* and within one bf16 step of the reference's correctly rounded value */
                        double want = tb_out_get(FP4D_DTYPE_BF16, ref, r * n + j);
                        assert_true(fabs(got - want) <= 2 * tb_half_ulp(FP4D_DTYPE_BF16, want));
                    }
            tb_operand_free(&a);
            for (int e = 0; e < experts; e++) tb_operand_free(&b[e]);
        }
}

/* Quantize through the cpu backend is bit-identical to fp4d_quantize. */
static void test_quantize_bit_identical(void **state)
{
    (void)state;
    const int64_t rows = 300, cols = 256; /* three 128-row chunks, the last partial */
    float        *src = malloc((size_t)(rows * cols) * sizeof(float));
    uint16_t     *src16 = malloc((size_t)(rows * cols) * sizeof(uint16_t));
    tb_rng        rng = {9};
    for (int64_t i = 0; i < rows * cols; i++) src[i] = tb_uniform(&rng) * (i % 97 == 0 ? 300.0f : 3.0f);
    fp4d_from_f32(FP4D_DTYPE_BF16, src, (size_t)(rows * cols), src16);
    fp4d_backend_t cpu;
    fp4d_reason    why;
    assert_int_equal(fp4d_backend_open("cpu", -1, &cpu, &why), FP4D_STATUS_OK);
    const fp4d_dtype formats[] = {FP4D_DTYPE_NVFP4, FP4D_DTYPE_MXFP4};
    for (size_t f = 0; f < 2; f++)
        for (int conv = 0; conv < FP4D_CONV_COUNT; conv++)
            for (int lay = 0; lay < FP4D_LAYOUT_COUNT; lay++)
                for (int given = 0; given < 2; given++)
                    for (int src_bf16 = 0; src_bf16 < 2; src_bf16++) {
                        if (!fp4d_convention_supports((fp4d_convention)conv, formats[f])) continue;
                        if (given && formats[f] == FP4D_DTYPE_MXFP4) continue;
                        fp4d_quantize_params qp = {formats[f], (fp4d_convention)conv, (fp4d_scale_layout)lay,
                                                   given ? 21.5f : 0.0f};
                        int64_t  sc = cols / fp4d_dtype_get(formats[f])->block_size;
                        size_t   ssz = fp4d_scale_buffer_size(qp.scale_layout, rows, sc);
                        uint8_t *c1 = malloc((size_t)(rows * cols / 2)), *c2 = malloc((size_t)(rows * cols / 2));
                        uint8_t *s1 = malloc(ssz), *s2 = malloc(ssz);
                        memset(s1, 0xAB, ssz), memset(s2, 0xAB, ssz);
                        fp4d_dtype           st = src_bf16 ? FP4D_DTYPE_BF16 : FP4D_DTYPE_F32;
                        const void          *sp = src_bf16 ? (const void *)src16 : (const void *)src;
                        fp4d_quantize_result r1;
                        assert_int_equal(fp4d_quantize(&qp, st, sp, rows, cols, c1, s1, &r1), FP4D_STATUS_OK);
                        fp4d_quantize_problem q = {qp, st, sp, rows, cols, c2, s2, {0, 0}};
                        assert_int_equal(fp4d_backend_quantize(cpu, &q, &why), FP4D_STATUS_OK);
                        assert_memory_equal(c1, c2, (size_t)(rows * cols / 2));
                        assert_memory_equal(s1, s2, ssz);
                        assert_memory_equal(&r1.decode_scale, &q.result.decode_scale, sizeof(float));
                        assert_memory_equal(&r1.encode_scale, &q.result.encode_scale, sizeof(float));
                        free(c1), free(c2), free(s1), free(s2);
                    }
    fp4d_backend_close(cpu);
    free(src), free(src16);
}

/* NVFP4 under the default convention derives 2688/amax, which is +inf for an all-zero tensor
 * (and for amax below ~8e-36): the threaded quantizer must still give what one call gives,
 * not INVALID_ARG from chunks handed a non-finite encode scale. Called with 3 threads
 * directly so that it splits on any machine. */
static void test_quantize_zero_amax_threaded(void **state)
{
    (void)state;
    const int64_t rows = 300, cols = 64;
    float        *src = calloc((size_t)(rows * cols), sizeof(float));
    for (int tiny = 0; tiny < 3; tiny++) {
        for (int64_t i = 0; i < rows * cols; i++)
            src[i] = tiny == 0 ? 0.0f : tiny == 1 ? -0.0f : (i % 7 == 0 ? 1e-37f : -3e-38f);
        for (int lay = 0; lay < FP4D_LAYOUT_COUNT; lay++) {
            fp4d_quantize_params qp  = {FP4D_DTYPE_NVFP4, FP4D_CONV_FLASHINFER_EXACT, (fp4d_scale_layout)lay, 0.0f};
            size_t               ssz = fp4d_scale_buffer_size(qp.scale_layout, rows, cols / 16);
            uint8_t *c1 = malloc((size_t)(rows * cols / 2)), *c2 = malloc((size_t)(rows * cols / 2));
            uint8_t *s1 = malloc(ssz), *s2 = malloc(ssz);
            memset(c2, 0xAB, (size_t)(rows * cols / 2)), memset(s2, 0xAB, ssz);
            fp4d_quantize_result r1;
            assert_int_equal(fp4d_quantize(&qp, FP4D_DTYPE_F32, src, rows, cols, c1, s1, &r1), FP4D_STATUS_OK);
            fp4d_quantize_problem q = {qp, FP4D_DTYPE_F32, src, rows, cols, c2, s2, {0, 0}};
            assert_int_equal(fp4d_threaded_quantize(&q, 3), FP4D_STATUS_OK);
            assert_memory_equal(c1, c2, (size_t)(rows * cols / 2));
            assert_memory_equal(s1, s2, ssz);
            assert_memory_equal(&r1, &q.result, sizeof r1);
            free(c1), free(c2), free(s1), free(s2);
        }
    }
    free(src);
}

/* Internal scale offsets agree with the formats module for every layout. */
static void test_scale_offsets(void **state)
{
    (void)state;
    for (int l = 0; l < FP4D_LAYOUT_COUNT; l++)
        for (int64_t rows = 1; rows < 300; rows += 37)
            for (int64_t cols = 1; cols < 20; cols += 3)
                for (int64_t r = 0; r < rows; r += 5)
                    for (int64_t c = 0; c < cols; c++)
                        assert_int_equal(fp4d_cpu_scale_offset((fp4d_scale_layout)l, rows, cols, r, c),
                                         fp4d_scale_offset((fp4d_scale_layout)l, rows, cols, r, c));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scale_offsets),
        cmocka_unit_test(test_every_format_pair),
        cmocka_unit_test(test_every_isa),
        cmocka_unit_test(test_other_layouts),
        cmocka_unit_test(test_through_registry),
        cmocka_unit_test(test_nan_propagation),
        cmocka_unit_test(test_grouped_moe),
        cmocka_unit_test(test_quantize_bit_identical),
        cmocka_unit_test(test_quantize_zero_amax_threaded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
