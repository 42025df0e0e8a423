/*
 * The rules of CUDA binary and PTX compatibility over a build's architecture list
 * (src/backend/arch_list.c), which decide what `fp4doctor env` says of each GPU.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "backend/arch_list.h"

static void test_describe(void **state)
{
    (void)state;
    char out[128];
    fp4d_arch_list_describe("80-real;90a-real;100a-real;120a-real;90-virtual", out, sizeof out);
    assert_string_equal(out, "sm_80,sm_90a,sm_100a,sm_120a,compute_90");
    fp4d_arch_list_describe("80-real,120a-virtual", out, sizeof out); /* the define's commas */
    assert_string_equal(out, "sm_80,compute_120a");
    fp4d_arch_list_describe("90a", out, sizeof out); /* CMake builds SASS and PTX for it */
    assert_string_equal(out, "sm_90a,compute_90a");
    fp4d_arch_list_describe("", out, sizeof out);
    assert_string_equal(out, "");
    /* Too small for the list: whole entries only, never half a name. */
    char small[16];
    fp4d_arch_list_describe("80-real;90a-real;100a-real", small, sizeof small);
    assert_string_equal(small, "sm_80,sm_90a");
}

static const char DEFAULT_BUILD[] = "sm_80,sm_90a,sm_100a,sm_120a,compute_90";

static void test_default_build_per_gpu(void **state)
{
    (void)state;
    /* sm_80 SASS runs on later 8.x minors (A10, L4, RTX 40). */
    assert_int_equal(fp4d_arch_list_code_for(DEFAULT_BUILD, 8, 0), FP4D_ARCH_CODE_NATIVE);
    assert_int_equal(fp4d_arch_list_code_for(DEFAULT_BUILD, 8, 6), FP4D_ARCH_CODE_NATIVE);
    assert_int_equal(fp4d_arch_list_code_for(DEFAULT_BUILD, 8, 9), FP4D_ARCH_CODE_NATIVE);
    assert_int_equal(fp4d_arch_list_code_for(DEFAULT_BUILD, 9, 0), FP4D_ARCH_CODE_NATIVE);
    assert_int_equal(fp4d_arch_list_code_for(DEFAULT_BUILD, 10, 0), FP4D_ARCH_CODE_NATIVE);
    assert_int_equal(fp4d_arch_list_code_for(DEFAULT_BUILD, 12, 0), FP4D_ARCH_CODE_NATIVE);
    /* Arch-specific SASS reaches no other version: B300, Thor and GB10 JIT the PTX. */
    assert_int_equal(fp4d_arch_list_code_for(DEFAULT_BUILD, 10, 3), FP4D_ARCH_CODE_PTX);
    assert_int_equal(fp4d_arch_list_code_for(DEFAULT_BUILD, 11, 0), FP4D_ARCH_CODE_PTX);
    assert_int_equal(fp4d_arch_list_code_for(DEFAULT_BUILD, 12, 1), FP4D_ARCH_CODE_PTX);
    /* Turing and older: below every entry. */
    assert_int_equal(fp4d_arch_list_code_for(DEFAULT_BUILD, 7, 5), FP4D_ARCH_CODE_NONE);
}

static void test_suffix_rules(void **state)
{
    (void)state;
    /* compute_120a JIT-compiles only for 12.0, so it adds nothing beside sm_120a. */
    assert_int_equal(fp4d_arch_list_code_for("compute_120a", 12, 0), FP4D_ARCH_CODE_PTX);
    assert_int_equal(fp4d_arch_list_code_for("compute_120a", 12, 1), FP4D_ARCH_CODE_NONE);
    assert_int_equal(fp4d_arch_list_code_for("sm_90a,compute_120a", 12, 1), FP4D_ARCH_CODE_NONE);
    /* Family-specific code reaches later minors of its major, never the next major. */
    assert_int_equal(fp4d_arch_list_code_for("sm_100f", 10, 3), FP4D_ARCH_CODE_NATIVE);
    assert_int_equal(fp4d_arch_list_code_for("sm_100f", 12, 0), FP4D_ARCH_CODE_NONE);
    assert_int_equal(fp4d_arch_list_code_for("compute_100f", 10, 3), FP4D_ARCH_CODE_PTX);
    assert_int_equal(fp4d_arch_list_code_for("compute_100f", 11, 0), FP4D_ARCH_CODE_NONE);
    /* Plain SASS: not an earlier minor, not the next major. */
    assert_int_equal(fp4d_arch_list_code_for("sm_86", 8, 0), FP4D_ARCH_CODE_NONE);
    assert_int_equal(fp4d_arch_list_code_for("sm_80", 9, 0), FP4D_ARCH_CODE_NONE);
    /* Plain PTX: any later version, not an earlier one. */
    assert_int_equal(fp4d_arch_list_code_for("compute_80", 12, 1), FP4D_ARCH_CODE_PTX);
    assert_int_equal(fp4d_arch_list_code_for("compute_90", 8, 9), FP4D_ARCH_CODE_NONE);
    /* SASS wins over PTX wherever both apply, whatever the order. */
    assert_int_equal(fp4d_arch_list_code_for("compute_80,sm_90a", 9, 0), FP4D_ARCH_CODE_NATIVE);
}

static void test_malformed_entries_ignored(void **state)
{
    (void)state;
    assert_int_equal(fp4d_arch_list_code_for("", 9, 0), FP4D_ARCH_CODE_NONE);
    assert_int_equal(fp4d_arch_list_code_for(NULL, 9, 0), FP4D_ARCH_CODE_NONE);
    assert_int_equal(fp4d_arch_list_code_for("sm_,compute_x,90,sm_9", 9, 0), FP4D_ARCH_CODE_NONE);
    assert_int_equal(fp4d_arch_list_code_for("bogus,,sm_90", 9, 0), FP4D_ARCH_CODE_NATIVE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_describe),
        cmocka_unit_test(test_default_build_per_gpu),
        cmocka_unit_test(test_suffix_rules),
        cmocka_unit_test(test_malformed_entries_ignored),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
