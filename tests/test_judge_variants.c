/*
 * The doctor's verdicts and causes on simulated kernels: correct ones that sum in another
 * order (split-K, lanes, pairwise) must PASS, and broken ones must be named for what they
 * are. Each synthetic backend decodes A and B to f32 (exact: FP4 values and their block
 * scales have at most 6 significant bits) and computes the GEMM its own way; the doctor
 * judges it against the exact reference, as `fp4doctor check` does.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "doctor/doctor_internal.h"
#include "fp4doctor/doctor.h"
#include "test_judge_util.h"

typedef enum variant {
    V_SPLITK7,       /* correct: 7 K splits summed in f32 */
    V_LANES8,        /* correct: 8 interleaved f32 lanes, then a tree */
    V_PAIRWISE,      /* correct: recursive pairwise f32 sum */
    V_BF16_TILES64,  /* broken: f32 sums of 64-element K tiles added into a bf16 accumulator */
    V_BAD_SCALE,     /* broken: one block scale of B (row N/3, middle block) read as zero */
    V_ROW_1PCT,      /* broken: output row M/2+1 is 1% too large */
    V_ALPHA_AFTER,   /* alpha applied to the bf16 output (torchao's post-multiply) */
    V_COUNT
} variant;

static const char *const names[V_COUNT] = {"v-splitk7", "v-lanes8", "v-pairwise", "v-bf16-tiles64",
                                           "v-bad-scale", "v-row-1pct", "v-alpha-after"};

static fp4d_status v_init(void *ud, int dev, void **ctx, fp4d_reason *why)
{
    (void)dev, (void)why;
    *ctx = ud;
    return FP4D_STATUS_OK;
}
static void v_free(void *ctx) { (void)ctx; }
static bool v_supports(void *ctx, const fp4d_gemm_desc *d, fp4d_reason *why)
{
    (void)ctx, (void)why;
    return d->num_experts == 0;
}

static float *decode(const fp4d_matrix *m)
{
    float *d = malloc((size_t)(m->rows * m->cols) * sizeof *d);
    if (!d) return NULL;
    if (fp4d_dtype_get(m->dtype)->is_block_fp4)
        fp4d_dequantize(m->dtype, m->scale_layout, m->data, m->scales, 1.0f, m->rows, m->cols, d);
    else
        fp4d_to_f32(m->dtype, m->data, (size_t)(m->rows * m->cols), d);
    return d;
}

static float f32_sum(const float *a, const float *b, int64_t k0, int64_t k1)
{
    float acc = 0.0f;
    for (int64_t k = k0; k < k1; k++) acc += a[k] * b[k];
    return acc;
}

static float pairwise(const float *a, const float *b, int64_t k0, int64_t k1)
{
    if (k1 - k0 <= 4) return f32_sum(a, b, k0, k1);
    int64_t mid = k0 + (k1 - k0) / 2;
    return pairwise(a, b, k0, mid) + pairwise(a, b, mid, k1);
}

static float to_out(fp4d_dtype t, float x)
{
    if (t == FP4D_DTYPE_BF16) return fp4d_bf16_to_f32(fp4d_bf16_from_f32(x));
    if (t == FP4D_DTYPE_F16) return fp4d_f16_to_f32(fp4d_f16_from_f32(x));
    return x;
}

static fp4d_status v_gemm(void *ctx, const fp4d_gemm_problem *p)
{
    variant v = (variant)(intptr_t)ctx;
    int64_t M = p->a.rows, N = p->b.rows, K = p->a.cols;
    float *A = decode(&p->a), *B = decode(&p->b);
    if (!A || !B) {
        free(A), free(B);
        return FP4D_STATUS_NOMEM;
    }
    if (v == V_BAD_SCALE)
        for (int64_t k = (K / 32) * 16; k < (K / 32) * 16 + 16; k++) B[(N / 3) * K + k] = 0.0f;
    size_t es = fp4d_out_elem_size(p->out_type);
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            const float *a = A + m * K, *b = B + n * K;
            float acc = 0.0f, res;
            if (v == V_SPLITK7) {
                int64_t chunk = ((K / 16 + 6) / 7) * 16;
                for (int64_t k0 = 0; k0 < K; k0 += chunk) acc += f32_sum(a, b, k0, k0 + chunk < K ? k0 + chunk : K);
            } else if (v == V_LANES8) {
                float l[8] = {0};
                for (int64_t k = 0; k < K; k++) l[k % 8] += a[k] * b[k];
                acc = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
            } else if (v == V_PAIRWISE) {
                acc = pairwise(a, b, 0, K);
            } else if (v == V_BF16_TILES64) {
                for (int64_t k0 = 0; k0 < K; k0 += 64)
                    acc = fp4d_bf16_to_f32(fp4d_bf16_from_f32(acc + f32_sum(a, b, k0, k0 + 64 < K ? k0 + 64 : K)));
            } else {
                acc = f32_sum(a, b, 0, K);
            }
            if (v == V_ALPHA_AFTER) res = to_out(p->out_type, p->alpha * to_out(p->out_type, acc));
            else res = to_out(p->out_type, p->alpha * acc);
            if (v == V_ROW_1PCT && m == M / 2 + 1) res = to_out(p->out_type, res * 1.01f);
            fp4d_from_f32(p->out_type, &res, 1, (uint8_t *)p->out + (size_t)(m * N + n) * es);
        }
    free(A);
    free(B);
    return FP4D_STATUS_OK;
}

static fp4d_backend_iface ifaces[V_COUNT];

static int setup(void **state)
{
    (void)state;
    fp4d_registry_options ro = {false, NULL, 0};
    assert_int_equal(fp4d_registry_init(&ro), FP4D_STATUS_OK);
    for (int v = 0; v < V_COUNT; v++) {
        if (fp4d_registry_find(names[v])) continue;
        fp4d_backend_iface *b = &ifaces[v];
        b->api_version = FP4D_BACKEND_API_VERSION;
        b->struct_size = sizeof *b;
        b->name = names[v];
        b->description = "simulated kernel";
        b->kind = FP4D_BACKEND_KIND_PLUGIN;
        b->caps = FP4D_CAP_GEMM;
        b->user_data = (void *)(intptr_t)v;
        b->init = v_init;
        b->free = v_free;
        b->supports = v_supports;
        b->gemm = v_gemm;
        assert_int_equal(fp4d_registry_add(b), FP4D_STATUS_OK);
    }
    return 0;
}

static fp4d_case make_case(fp4d_dtype a, fp4d_input_kind in, fp4d_dtype out, int64_t m, int64_t n, int64_t k)
{
    fp4d_case c;
    memset(&c, 0, sizeof c);
    snprintf(c.name, sizeof c.name, "variant.%d.%d.%d.m%lld.n%lld.k%lld", (int)a, (int)in, (int)out, (long long)m,
             (long long)n, (long long)k);
    snprintf(c.group, sizeof c.group, "test");
    c.op = FP4D_CASE_GEMM;
    c.m = m, c.n = n, c.k = k;
    c.a_type = c.b_type = FP4D_DTYPE_NVFP4;
    if (a == FP4D_DTYPE_BF16) c.a_type = a;
    c.out_type = out;
    c.a_layout = c.b_layout = FP4D_LAYOUT_SWIZZLED_128X4;
    c.input = in;
    return c;
}

static fp4d_case_result run(variant v, const fp4d_case *c) { return tj_run_case(names[v], c); }

static void expect(variant v, const fp4d_case *c, fp4d_verdict verdict, fp4d_cause cause, const char *in_detail,
                   const char *not_in_detail)
{
    fp4d_case_result r = run(v, c);
    if (r.verdict != verdict || r.cause != cause || (in_detail && !strstr(r.detail, in_detail)) ||
        (not_in_detail && strstr(r.detail, not_in_detail)))
        fail_msg("%s on %s: got %s/%s (%s), want %s/%s with \"%s\"", names[v], c->name, fp4d_verdict_name(r.verdict),
                 fp4d_cause_name(r.cause), r.detail, fp4d_verdict_name(verdict), fp4d_cause_name(cause),
                 in_detail ? in_detail : "");
}

/* f32 accumulation in any order is correct, with heavy tails and up to K = 16384. */
static void test_other_summation_orders_pass(void **state)
{
    (void)state;
    fp4d_case cs[] = {make_case(FP4D_DTYPE_NVFP4, FP4D_INPUT_HEAVY_TAILED, FP4D_DTYPE_BF16, 16, 48, 16384),
                      make_case(FP4D_DTYPE_NVFP4, FP4D_INPUT_HEAVY_TAILED, FP4D_DTYPE_F32, 300, 24, 2048),
                      make_case(FP4D_DTYPE_BF16, FP4D_INPUT_HEAVY_TAILED, FP4D_DTYPE_F16, 40, 64, 4096)};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        for (variant v = V_SPLITK7; v <= V_PAIRWISE; v++) expect(v, &cs[i], FP4D_VERDICT_PASS, FP4D_CAUSE_NONE, NULL, NULL);
}

/* bf16 accumulation of per-K-tile f32 sums (a tiled kernel with a bf16 accumulator) was
 * WRONG with cause "unknown": only per-add and per-16 bf16 rounding were hypotheses. */
static void test_bf16_accumulator_of_tile_sums_is_named(void **state)
{
    (void)state;
    fp4d_case c = make_case(FP4D_DTYPE_NVFP4, FP4D_INPUT_HEAVY_TAILED, FP4D_DTYPE_F32, 300, 48, 2048);
    expect(V_BF16_TILES64, &c, FP4D_VERDICT_WRONG, FP4D_CAUSE_LOW_PRECISION_ACCUMULATION, "64-element K tile", NULL);
}

/* One zeroed block scale of B at K = 4096 moves one output column by less than 1% of S:
 * INACCURATE, and it was blamed on low-precision accumulation. */
static void test_one_bad_block_scale_is_not_accumulation(void **state)
{
    (void)state;
    fp4d_case c = make_case(FP4D_DTYPE_NVFP4, FP4D_INPUT_GAUSSIAN, FP4D_DTYPE_BF16, 128, 64, 4096);
    expect(V_BAD_SCALE, &c, FP4D_VERDICT_INACCURATE, FP4D_CAUSE_UNKNOWN, "lies in output column 21", NULL);
}

/* One row 1% off was blamed on low-precision accumulation too. */
static void test_one_bad_row_is_not_accumulation(void **state)
{
    (void)state;
    fp4d_case c = make_case(FP4D_DTYPE_NVFP4, FP4D_INPUT_ZERO_BLOCKS, FP4D_DTYPE_BF16, 64, 64, 1024);
    expect(V_ROW_1PCT, &c, FP4D_VERDICT_INACCURATE, FP4D_CAUSE_UNKNOWN, "lies in output row 33", NULL);
}

/* alpha applied to the bf16 output rounds twice (errors of both signs, under one ulp): the
 * detail said the conversion "does not round to nearest even", which is not what happens. */
static void test_double_rounding_is_described(void **state)
{
    (void)state;
    fp4d_case c = make_case(FP4D_DTYPE_NVFP4, FP4D_INPUT_GRID, FP4D_DTYPE_BF16, 64, 64, 256);
    expect(V_ALPHA_AFTER, &c, FP4D_VERDICT_INACCURATE, FP4D_CAUSE_UNKNOWN, "rounded into bf16 twice", "truncation");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_other_summation_orders_pass),
        cmocka_unit_test(test_bf16_accumulator_of_tile_sums_is_named),
        cmocka_unit_test(test_one_bad_block_scale_is_not_accumulation),
        cmocka_unit_test(test_one_bad_row_is_not_accumulation),
        cmocka_unit_test(test_double_rounding_is_described),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
