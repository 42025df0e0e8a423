/*
 * Helpers of the tests that drive the judge with in-process backends (test_doctor_judge.c,
 * test_judge_variants.c, test_faulty_backends.c). Include after <cmocka.h> and the doctor's headers.
 */
#ifndef FP4D_TEST_JUDGE_UTIL_H
#define FP4D_TEST_JUDGE_UTIL_H

/* One case through the registered backend `name`, as the doctor's child runs it (seed 42). */
static inline fp4d_case_result tj_run_case(const char *name, const fp4d_case *c)
{
    fp4d_backend_t b;
    fp4d_reason why;
    assert_int_equal(fp4d_backend_open(name, -1, &b, &why), FP4D_STATUS_OK);
    fp4d_case_result r;
    assert_int_equal(fp4d_doctor_run_case(b, c, 42, &r), FP4D_STATUS_OK);
    fp4d_backend_close(b);
    return r;
}

/* The quick suite's grouped (MoE) case; *all receives the suite, which the caller frees. */
static inline const fp4d_case *tj_quick_moe_case(fp4d_case **all)
{
    size_t n;
    assert_int_equal(fp4d_suite_cases(FP4D_SUITE_QUICK, all, &n), FP4D_STATUS_OK);
    for (size_t i = 0; i < n; i++)
        if ((*all)[i].op == FP4D_CASE_GROUPED) return &(*all)[i];
    fail_msg("the quick suite has no grouped (MoE) case");
    return NULL;
}

#endif
