/*
 * The rules of CUDA binary and PTX compatibility over a build's architecture list
 * (src/backend/arch_list.c), which decide what `fp4doctor env` says of each GPU.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
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
    /* Too small for the list: whole entries, then "...", never half a name. */
    char small[17];
    fp4d_arch_list_describe("80-real;90a-real;100a-real", small, sizeof small);
    assert_string_equal(small, "sm_80,sm_90a,...");
    char tiny[4];
    fp4d_arch_list_describe("100a-real", tiny, sizeof tiny);
    assert_string_equal(tiny, "...");
    /* CMake's special values are shown as they are. */
    fp4d_arch_list_describe("all-major", out, sizeof out);
    assert_string_equal(out, "all-major");
    fp4d_arch_list_describe("native;90-virtual", out, sizeof out);
    assert_string_equal(out, "native,compute_90");
}

static const char DEFAULT_BUILD[] = "sm_80,sm_90a,sm_100a,sm_120a,compute_90";

static void test_default_build_per_gpu(void **state)
{
    (void)state;
    /* sm_80 SASS runs on later 8.x minors (A10, L4, RTX 40). */
    assert_int_equal(fp4d_arch_list_code_for(DEFAULT_BUILD, 8, 0, false), FP4D_ARCH_CODE_NATIVE);
    assert_int_equal(fp4d_arch_list_code_for(DEFAULT_BUILD, 8, 6, false), FP4D_ARCH_CODE_NATIVE);
    assert_int_equal(fp4d_arch_list_code_for(DEFAULT_BUILD, 8, 9, false), FP4D_ARCH_CODE_NATIVE);
    assert_int_equal(fp4d_arch_list_code_for(DEFAULT_BUILD, 9, 0, false), FP4D_ARCH_CODE_NATIVE);
    assert_int_equal(fp4d_arch_list_code_for(DEFAULT_BUILD, 10, 0, false), FP4D_ARCH_CODE_NATIVE);
    assert_int_equal(fp4d_arch_list_code_for(DEFAULT_BUILD, 12, 0, false), FP4D_ARCH_CODE_NATIVE);
    /* Arch-specific SASS reaches no other version: B300, Thor and GB10 JIT the PTX. */
    assert_int_equal(fp4d_arch_list_code_for(DEFAULT_BUILD, 10, 3, false), FP4D_ARCH_CODE_PTX);
    assert_int_equal(fp4d_arch_list_code_for(DEFAULT_BUILD, 11, 0, false), FP4D_ARCH_CODE_PTX);
    assert_int_equal(fp4d_arch_list_code_for(DEFAULT_BUILD, 12, 1, false), FP4D_ARCH_CODE_PTX);
    /* Turing and older: below every entry. */
    assert_int_equal(fp4d_arch_list_code_for(DEFAULT_BUILD, 7, 5, false), FP4D_ARCH_CODE_NONE);
}

static void test_suffix_rules(void **state)
{
    (void)state;
    /* compute_120a JIT-compiles only for 12.0, so it adds nothing beside sm_120a. */
    assert_int_equal(fp4d_arch_list_code_for("compute_120a", 12, 0, false), FP4D_ARCH_CODE_PTX);
    assert_int_equal(fp4d_arch_list_code_for("compute_120a", 12, 1, false), FP4D_ARCH_CODE_NONE);
    assert_int_equal(fp4d_arch_list_code_for("sm_90a,compute_120a", 12, 1, false), FP4D_ARCH_CODE_NONE);
    /* Family-specific code reaches later minors of its major, never the next major. */
    assert_int_equal(fp4d_arch_list_code_for("sm_100f", 10, 3, false), FP4D_ARCH_CODE_NATIVE);
    assert_int_equal(fp4d_arch_list_code_for("sm_100f", 12, 0, false), FP4D_ARCH_CODE_NONE);
    assert_int_equal(fp4d_arch_list_code_for("compute_100f", 10, 3, false), FP4D_ARCH_CODE_PTX);
    assert_int_equal(fp4d_arch_list_code_for("compute_100f", 11, 0, false), FP4D_ARCH_CODE_NONE);
    /* Plain SASS: not an earlier minor, not the next major. */
    assert_int_equal(fp4d_arch_list_code_for("sm_86", 8, 0, false), FP4D_ARCH_CODE_NONE);
    assert_int_equal(fp4d_arch_list_code_for("sm_80", 9, 0, false), FP4D_ARCH_CODE_NONE);
    /* Plain PTX: any later version, not an earlier one. */
    assert_int_equal(fp4d_arch_list_code_for("compute_80", 12, 1, false), FP4D_ARCH_CODE_PTX);
    assert_int_equal(fp4d_arch_list_code_for("compute_90", 8, 9, false), FP4D_ARCH_CODE_NONE);
    /* SASS wins over PTX wherever both apply, whatever the order. */
    assert_int_equal(fp4d_arch_list_code_for("compute_80,sm_90a", 9, 0, false), FP4D_ARCH_CODE_NATIVE);
}

/* Binary compatibility across minor versions is for discrete GPUs: on a Jetson Orin (8.7,
 * integrated) sm_80 SASS does not load, and compute_90 PTX is too new. */
static void test_integrated_gpus_need_exact_sass(void **state)
{
    (void)state;
    assert_int_equal(fp4d_arch_list_code_for(DEFAULT_BUILD, 8, 7, true), FP4D_ARCH_CODE_NONE);
    assert_int_equal(fp4d_arch_list_code_for(DEFAULT_BUILD, 8, 7, false), FP4D_ARCH_CODE_NATIVE);
    assert_int_equal(fp4d_arch_list_code_for("sm_87", 8, 7, true), FP4D_ARCH_CODE_NATIVE);
    assert_int_equal(fp4d_arch_list_code_for("sm_100f", 10, 3, true), FP4D_ARCH_CODE_NONE);
    /* PTX still JIT-compiles there. */
    assert_int_equal(fp4d_arch_list_code_for(DEFAULT_BUILD, 11, 0, true), FP4D_ARCH_CODE_PTX);
}

/* The build's own CMake list is read as well as the described form, and whole: a list longer
 * than any display buffer still finds its last entry. */
static void test_cmake_form_and_long_lists(void **state)
{
    (void)state;
    const char *cmake = "80-real;90a-real;100a-real;120a-real;90-virtual";
    assert_int_equal(fp4d_arch_list_code_for(cmake, 9, 0, false), FP4D_ARCH_CODE_NATIVE);
    assert_int_equal(fp4d_arch_list_code_for(cmake, 12, 1, false), FP4D_ARCH_CODE_PTX);
    assert_int_equal(fp4d_arch_list_code_for("90a", 9, 0, false), FP4D_ARCH_CODE_NATIVE);
    assert_int_equal(fp4d_arch_list_code_for("90a-virtual", 12, 1, false), FP4D_ARCH_CODE_NONE);
    char long_list[1024] = "";
    for (int v = 50; v < 120; v++) {
        char e[24];
        snprintf(e, sizeof e, "%s%da-real", long_list[0] ? ";" : "", v);
        strcat(long_list, e);
    }
    strcat(long_list, ";121a-real");
    assert_true(strlen(long_list) > 256);
    assert_int_equal(fp4d_arch_list_code_for(long_list, 12, 1, false), FP4D_ARCH_CODE_NATIVE);
    assert_int_equal(fp4d_arch_list_code_for(long_list, 12, 2, false), FP4D_ARCH_CODE_NONE);
}

/* CMake's "native", "all" and "all-major" cannot be read: no claim either way. */
static void test_special_values_are_unknown(void **state)
{
    (void)state;
    assert_int_equal(fp4d_arch_list_code_for("native", 12, 1, false), FP4D_ARCH_CODE_UNKNOWN);
    assert_int_equal(fp4d_arch_list_code_for("all-major", 9, 0, false), FP4D_ARCH_CODE_UNKNOWN);
    /* what is known still counts */
    assert_int_equal(fp4d_arch_list_code_for("native;90a-real", 9, 0, false), FP4D_ARCH_CODE_NATIVE);
    assert_int_equal(fp4d_arch_list_code_for("all;90-virtual", 12, 1, false), FP4D_ARCH_CODE_PTX);
}

static void test_malformed_entries(void **state)
{
    (void)state;
    assert_int_equal(fp4d_arch_list_code_for("", 9, 0, false), FP4D_ARCH_CODE_NONE);
    assert_int_equal(fp4d_arch_list_code_for(NULL, 9, 0, false), FP4D_ARCH_CODE_NONE);
    /* no architecture among them: "unknown", never "native" */
    assert_int_equal(fp4d_arch_list_code_for("sm_,compute_x,sm_9,90-fake", 9, 0, false), FP4D_ARCH_CODE_UNKNOWN);
    /* a bare "90" is CMake's 90-real;90-virtual */
    assert_int_equal(fp4d_arch_list_code_for("90", 9, 0, false), FP4D_ARCH_CODE_NATIVE);
    assert_int_equal(fp4d_arch_list_code_for("bogus,,sm_90", 9, 0, false), FP4D_ARCH_CODE_NATIVE);
    assert_int_equal(fp4d_arch_list_code_for(",;", 9, 0, false), FP4D_ARCH_CODE_NONE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_describe),
        cmocka_unit_test(test_default_build_per_gpu),
        cmocka_unit_test(test_suffix_rules),
        cmocka_unit_test(test_integrated_gpus_need_exact_sass),
        cmocka_unit_test(test_cmake_form_and_long_lists),
        cmocka_unit_test(test_special_values_are_unknown),
        cmocka_unit_test(test_malformed_entries),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
