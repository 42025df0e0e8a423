/*
 * Stress cases (stress.c): the batch of mixed M on several instances at once. A backend
 * right alone and wrong beside others is blamed on concurrency, with the rows it got
 * wrong; one wrong alone is not (its own cause stands); nondeterminism and failed calls
 * under concurrency are told apart. Synthetic backends registered here compute the exact
 * reference and misbehave only while another of their calls is in flight; each call
 * sleeps a millisecond so that the threads' calls do overlap.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "doctor/doctor_internal.h"
#include "fp4doctor/doctor.h"
#include "fp4doctor/ref.h"
#include "out_elem.h"

typedef enum synth_kind {
    S_EXACT,        /* the reference: PASS */
    S_OVERLAP_ULP,  /* one element one f32 ulp up while another call runs: NONDETERMINISTIC */
    S_OVERLAP_FAIL, /* returns DEVICE while another call runs: ERROR */
    S_SINGLETON,    /* a second instance at once cannot be opened: ERROR */
    S_COUNT
} synth_kind;

static const char *const synth_names[S_COUNT] = {"t-exact", "t-overlap-ulp", "t-overlap-fail", "t-singleton"};

static atomic_int in_flight[S_COUNT], open_instances[S_COUNT];

static fp4d_status s_init(void *ud, int dev, void **ctx, fp4d_reason *why)
{
    (void)dev;
    synth_kind k = (synth_kind)(intptr_t)ud;
    if (atomic_fetch_add(&open_instances[k], 1) > 0 && k == S_SINGLETON) {
        atomic_fetch_sub(&open_instances[k], 1);
        snprintf(why->text, sizeof why->text, "one instance per process");
        return FP4D_STATUS_UNSUPPORTED;
    }
    *ctx = ud;
    return FP4D_STATUS_OK;
}

static void s_free(void *ctx) { atomic_fetch_sub(&open_instances[(intptr_t)ctx], 1); }

static bool s_supports(void *ctx, const fp4d_gemm_desc *d, fp4d_reason *why)
{
    (void)ctx, (void)why;
    return d->num_experts == 0;
}

static fp4d_status s_gemm(void *ctx, const fp4d_gemm_problem *p)
{
    synth_kind k = (synth_kind)(intptr_t)ctx;
    bool overlapped = atomic_fetch_add(&in_flight[k], 1) > 0;
    struct timespec ts = {0, 1000 * 1000};
    nanosleep(&ts, NULL);
    overlapped = overlapped || atomic_load(&in_flight[k]) > 1;
    fp4d_status st = fp4d_ref_gemm(p);
    atomic_fetch_sub(&in_flight[k], 1);
    if (st != FP4D_STATUS_OK || !overlapped) return st;
    if (k == S_OVERLAP_FAIL) return FP4D_STATUS_DEVICE;
    if (k == S_OVERLAP_ULP && p->out_type == FP4D_DTYPE_F32 && p->a.rows > 0 && p->b.rows > 0) {
        float v = fp4d_out_elem_get(p->out_type, p->out, 0);
        fp4d_out_elem_set(p->out_type, p->out, 0, nextafterf(v, INFINITY));
    }
    return FP4D_STATUS_OK;
}

static fp4d_backend_iface ifaces[S_COUNT];

static int setup(void **state)
{
    (void)state;
    fp4d_registry_options o = {true, NULL, 0};
    if (fp4d_registry_init(&o) != FP4D_STATUS_OK) return -1;
    for (int k = 0; k < S_COUNT; k++) {
        ifaces[k] = (fp4d_backend_iface){
            .api_version = FP4D_BACKEND_API_VERSION, .struct_size = sizeof(fp4d_backend_iface),
            .name = synth_names[k], .description = "stress test backend", .kind = FP4D_BACKEND_KIND_PLUGIN,
            .caps = FP4D_CAP_GEMM, .user_data = (void *)(intptr_t)k, .init = s_init, .free = s_free,
            .supports = s_supports, .gemm = s_gemm};
        if (fp4d_registry_add(&ifaces[k]) != FP4D_STATUS_OK) return -1;
    }
    return 0;
}

/* The quick suite's stress case of plain GEMMs (moe: of grouped ones), with fewer instances
 * and rounds where asked (> 0). */
static fp4d_case quick_stress_case_of(bool moe, int threads, int rounds, fp4d_dtype out_type)
{
    fp4d_case *cases = NULL, found;
    size_t n = 0;
    assert_int_equal(fp4d_suite_cases(FP4D_SUITE_QUICK, &cases, &n), FP4D_STATUS_OK);
    size_t stress = 0, at = 0;
    for (size_t i = 0; i < n; i++)
        if (cases[i].op == FP4D_CASE_STRESS && (cases[i].num_experts > 0) == moe) stress++, at = i;
    assert_int_equal(stress, 1);
    found = cases[at];
    free(cases);
    assert_string_equal(found.group, "stress");
    assert_true(found.threads >= 2 && found.rounds >= 1);
    if (threads > 0) found.threads = threads;
    if (rounds > 0) found.rounds = rounds;
    found.out_type = out_type;
    return found;
}

static fp4d_case quick_stress_case(int threads, int rounds, fp4d_dtype out_type)
{
    return quick_stress_case_of(false, threads, rounds, out_type);
}

static fp4d_case_result run(const char *backend, const fp4d_case *c)
{
    fp4d_backend_t b = NULL;
    fp4d_reason why;
    assert_int_equal(fp4d_backend_open(backend, -1, &b, &why), FP4D_STATUS_OK);
    fp4d_case_result r;
    assert_int_equal(fp4d_doctor_run_case(b, c, 1, &r), FP4D_STATUS_OK);
    fp4d_backend_close(b);
    return r;
}

/* One GEMM (op: plain or grouped) of a stress case's batch, m rows, run alone as a case of its own. */
static fp4d_case_result run_alone(const char *backend, const fp4d_case *stress, fp4d_case_op op, int64_t m)
{
    fp4d_case alone = *stress;
    alone.op = op;
    alone.m = m;
    alone.threads = alone.rounds = 0;
    snprintf(alone.name, sizeof alone.name, "alone.%s.m%lld", op == FP4D_CASE_GROUPED ? "moe" : "gemm", (long long)m);
    return run(backend, &alone);
}

static int64_t sum_rows(const int64_t *rows, size_t count)
{
    int64_t sum = 0;
    for (size_t i = 0; i < count; i++) sum += rows[i];
    return sum;
}

/* the rows of one batch, summed here from the arrays the suite's cases are built from */
static int64_t batch_rows(void) { return sum_rows(fp4d_stress_m, fp4d_stress_m_count); }
static int64_t moe_batch_rows(void) { return sum_rows(fp4d_stress_moe_rows, fp4d_stress_moe_rows_count); }

static void test_batch_crosses_the_tiles(void **state)
{
    (void)state;
    /* the batch must hold M on both sides of 64 and 128 rows and past a second 128-row tile */
    bool below64 = false, at128 = false, past128 = false, past256 = false;
    for (size_t i = 0; i < fp4d_stress_m_count; i++) {
        below64 |= fp4d_stress_m[i] < 64;
        at128 |= fp4d_stress_m[i] == 128;
        past128 |= fp4d_stress_m[i] == 129;
        past256 |= fp4d_stress_m[i] > 256;
    }
    assert_true(below64 && at128 && past128 && past256);
    fp4d_case c = quick_stress_case(0, 0, FP4D_DTYPE_BF16);
    assert_int_equal(c.m, batch_rows());
}

static void test_correct_backends_pass(void **state)
{
    (void)state;
    fp4d_case c = quick_stress_case(0, 0, FP4D_DTYPE_BF16);
    for (const char **name = (const char *[]){"cpu", "ref", "t-exact", NULL}; *name; name++) {
        fp4d_case_result r = run(*name, &c);
        if (r.verdict != FP4D_VERDICT_PASS) fail_msg("%s: %s: %s", *name, fp4d_verdict_name(r.verdict), r.detail);
        /* every output made alone was judged against the exact result */
        assert_int_equal(r.elements_checked, batch_rows() * c.n);
        assert_true(r.time_ms > 0 && r.gflops > 0);
    }
}

/* faulty-concurrent: right alone (the plain case of the batch's largest M passes), NaN in
 * the last 128-row tile of every call another overlapped. */
static void test_overlap_fault_is_concurrency(void **state)
{
    (void)state;
    fp4d_case c = quick_stress_case(0, 0, FP4D_DTYPE_BF16);
    fp4d_case_result r = run("faulty-concurrent", &c);
    assert_int_equal(r.verdict, FP4D_VERDICT_NAN);
    assert_int_equal(r.cause, FP4D_CAUSE_CONCURRENCY);
    assert_non_null(strstr(r.detail, "right alone, wrong with 4 instances at once"));
    assert_non_null(strstr(r.detail, "M = 300: rows 256..299; M = 200: rows 128..199"));

    fp4d_case_result a = run_alone("faulty-concurrent", &c, FP4D_CASE_GEMM, 300);
    assert_int_equal(a.verdict, FP4D_VERDICT_PASS);
}

/* Wrong alone: the plain case's cause stands, not concurrency. */
static void test_wrong_alone_keeps_its_cause(void **state)
{
    (void)state;
    fp4d_case c = quick_stress_case(2, 1, FP4D_DTYPE_BF16);
    fp4d_case_result r = run("faulty-linear-scales", &c);
    assert_int_equal(r.verdict, FP4D_VERDICT_WRONG);
    assert_int_equal(r.cause, FP4D_CAUSE_SCALE_LAYOUT_LINEAR);
    assert_non_null(strstr(r.detail, "alone, before any concurrency, M = 1:"));

    r = run("faulty-oob", &c);
    assert_int_equal(r.verdict, FP4D_VERDICT_OOB_WRITE);
    assert_non_null(strstr(r.detail, "sentinel bytes"));

    r = run("faulty-racy", &c);
    assert_int_equal(r.verdict, FP4D_VERDICT_NONDETERMINISTIC);
    assert_int_equal(r.cause, FP4D_CAUSE_NONE);
    assert_non_null(strstr(r.detail, "alone, two runs of M = 1 differ"));
}

static void test_nondeterminism_and_failures_under_concurrency(void **state)
{
    (void)state;
    fp4d_case c = quick_stress_case(3, 1, FP4D_DTYPE_F32);
    /* one ulp is within the practical tolerance: not WRONG, but not the same result either */
    fp4d_case_result r = run("t-overlap-ulp", &c);
    assert_int_equal(r.verdict, FP4D_VERDICT_NONDETERMINISTIC);
    assert_int_equal(r.cause, FP4D_CAUSE_CONCURRENCY);
    assert_non_null(strstr(r.detail, "judged within the practical tolerance"));

    r = run("t-overlap-fail", &c);
    assert_int_equal(r.verdict, FP4D_VERDICT_ERROR);
    assert_int_equal(r.cause, FP4D_CAUSE_CONCURRENCY);
    assert_non_null(strstr(r.detail, "failed a call that passes alone"));
    assert_non_null(strstr(r.detail, "DEVICE"));

    r = run("t-singleton", &c);
    assert_int_equal(r.verdict, FP4D_VERDICT_ERROR);
    assert_non_null(strstr(r.detail, "could not open instance 1 of 3"));
    assert_non_null(strstr(r.detail, "one instance per process"));
    assert_int_equal(atomic_load(&open_instances[S_SINGLETON]), 0); /* all closed again */
}

/* The MoE batch routes its rows over the experts as the MoE cases do: somewhere an empty
 * expert, one of a few rows (the small-M paths), one of 65..127 rows (a second 64-row half
 * tile) and one past a 128-row tile. */
static void test_moe_batch_crosses_the_tiles(void **state)
{
    (void)state;
    fp4d_case c = quick_stress_case_of(true, 0, 0, FP4D_DTYPE_BF16);
    assert_true(c.num_experts > 1);
    assert_int_equal(c.m, moe_batch_rows());
    bool empty = false, few = false, half = false, past128 = false;
    for (size_t i = 0; i < fp4d_stress_moe_rows_count; i++) {
        fp4d_case g = c;
        g.op = FP4D_CASE_GROUPED;
        g.m = fp4d_stress_moe_rows[i];
        g.threads = g.rounds = 0;
        fp4d_case_data d;
        assert_int_equal(fp4d_case_data_make(&g, 1, &d), FP4D_STATUS_OK);
        assert_int_equal(d.num_b, c.num_experts);
        assert_int_equal(d.offsets[d.num_b], g.m);
        for (int32_t e = 0; e < d.num_b; e++) {
            int64_t rows = d.offsets[e + 1] - d.offsets[e];
            empty |= rows == 0;
            few |= rows > 0 && rows <= 16;
            half |= rows > 64 && rows < 128;
            past128 |= rows > 128;
        }
        fp4d_case_data_free(&d);
    }
    assert_true(empty && few && half && past128);
}

/* The grouped batch on correct backends passes, every output judged; on faulty-concurrent the
 * NaN tiles are named per expert and blamed on concurrency, while the same grouped GEMM
 * alone passes; a backend without grouped GEMMs says so. */
static void test_moe_stress(void **state)
{
    (void)state;
    fp4d_case c = quick_stress_case_of(true, 0, 0, FP4D_DTYPE_BF16);
    for (const char **name = (const char *[]){"cpu", "ref", NULL}; *name; name++) {
        fp4d_case_result r = run(*name, &c);
        if (r.verdict != FP4D_VERDICT_PASS) fail_msg("%s: %s: %s", *name, fp4d_verdict_name(r.verdict), r.detail);
        assert_int_equal(r.elements_checked, moe_batch_rows() * c.n);
    }

    fp4d_case_result r = run("faulty-concurrent", &c);
    assert_int_equal(r.verdict, FP4D_VERDICT_NAN);
    assert_int_equal(r.cause, FP4D_CAUSE_CONCURRENCY);
    assert_non_null(strstr(r.detail, "right alone, wrong with 4 instances at once"));
    /* 600 rows over 8 experts: expert 2 has 193 rows, its last tile is rows 128..192 */
    if (!strstr(r.detail, "M = 600 over 8 experts: rows expert 0: 0..108 (of 109); expert 2: 128..192 (of 193)"))
        fail_msg("%s", r.detail);

    fp4d_case_result a = run_alone("faulty-concurrent", &c, FP4D_CASE_GROUPED, 600);
    if (a.verdict != FP4D_VERDICT_PASS) fail_msg("alone: %s: %s", fp4d_verdict_name(a.verdict), a.detail);

    /* wrong alone in one expert's second half tile: that cause stands */
    r = run("faulty-tile-rows", &c);
    assert_int_equal(r.verdict, FP4D_VERDICT_UNWRITTEN);
    assert_int_equal(r.cause, FP4D_CAUSE_TILE_ROWS_MISSING);
    assert_non_null(strstr(r.detail, "alone, before any concurrency, M = 200 over 8 experts:"));

    r = run("t-exact", &c); /* plain GEMMs only */
    assert_int_equal(r.verdict, FP4D_VERDICT_UNSUPPORTED);
    assert_non_null(strstr(r.detail, "M = 1 over 8 experts: "));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_crosses_the_tiles),
        cmocka_unit_test(test_correct_backends_pass),
        cmocka_unit_test(test_overlap_fault_is_concurrency),
        cmocka_unit_test(test_wrong_alone_keeps_its_cause),
        cmocka_unit_test(test_nondeterminism_and_failures_under_concurrency),
        cmocka_unit_test(test_moe_batch_crosses_the_tiles),
        cmocka_unit_test(test_moe_stress),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
