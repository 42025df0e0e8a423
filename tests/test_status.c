/* Status codes and version (the numbers are a published contract), and the strict reading of
 * switches from the environment. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "fp4doctor/fp4doctor.h"
#include "internal.h"

/* Test switches in the environment (FP4DOCTOR_FAULTY_DEVICE, FP4DOCTOR_SIMULATE_DEVICES) are
 * digits only: atoi() made "abc" device 0 and "1x" device 1. */
static void test_env_digits_are_strict(void **state)
{
    (void)state;
    assert_int_equal(fp4d_env_digits("0", 10), 0);
    assert_int_equal(fp4d_env_digits("7", 10), 7);
    assert_int_equal(fp4d_env_digits("10", 10), 10);
    assert_int_equal(fp4d_env_digits("11", 10), -1);
    assert_int_equal(fp4d_env_digits("99999999999999999999999", 1000000), -1);
    assert_int_equal(fp4d_env_digits(NULL, 10), -1);
    assert_int_equal(fp4d_env_digits("", 10), -1);
    assert_int_equal(fp4d_env_digits("abc", 10), -1);
    assert_int_equal(fp4d_env_digits("1x", 10), -1);
    assert_int_equal(fp4d_env_digits(" 1", 10), -1);
    assert_int_equal(fp4d_env_digits("-1", 10), -1);
    assert_int_equal(fp4d_env_digits("+1", 10), -1);
    /* one digit above a small max: (max - digit) / 10 rounded up to 0 let these through */
    assert_int_equal(fp4d_env_digits("2", 1), -1);
    assert_int_equal(fp4d_env_digits("9", 1), -1);
    assert_int_equal(fp4d_env_digits("5", 4), -1);
    assert_int_equal(fp4d_env_digits("07", 4), -1);
    assert_int_equal(fp4d_env_digits("1", 0), -1);
    assert_int_equal(fp4d_env_digits("0", 0), 0);
    assert_int_equal(fp4d_env_digits("04", 4), 4);
    for (long max = 0; max <= 12; max++)
        for (long v = 0; v <= 99; v++) {
            char text[4];
            snprintf(text, sizeof text, "%ld", v);
            assert_int_equal(fp4d_env_digits(text, max), v <= max ? v : -1);
        }
}

/* stderr into a temporary file between capture_begin and capture_end, which returns what was
 * printed (at most `cap` - 1 bytes) in `printed` */
typedef struct stderr_capture {
    FILE *file;
    int   saved;
} stderr_capture;

static stderr_capture capture_begin(void)
{
    stderr_capture c = {tmpfile(), -1};
    assert_non_null(c.file);
    fflush(stderr);
    c.saved = dup(2);
    assert_true(c.saved >= 0);
    assert_int_equal(dup2(fileno(c.file), 2), 2);
    return c;
}

static void capture_end(stderr_capture c, char *printed, size_t cap)
{
    fflush(stderr);
    assert_int_equal(dup2(c.saved, 2), 2);
    close(c.saved);
    rewind(c.file);
    const size_t n = fread(printed, 1, cap - 1, c.file);
    printed[n] = '\0';
    fclose(c.file);
}

static void set_or_unset(const char *name, const char *value)
{
    if (value) setenv(name, value, 1);
    else unsetenv(name);
}

/* Reads `name` = `value` through fp4d_env_knob with stderr captured: the value, and what
 * was printed (at most `cap` - 1 bytes) into `printed`. */
static long knob_with_stderr(const char *name, const char *value, long lo, long hi, long fallback, char *printed,
                             size_t cap)
{
    set_or_unset(name, value);
    const stderr_capture c = capture_begin();
    const long v = fp4d_env_knob(name, lo, hi, fallback);
    capture_end(c, printed, cap);
    unsetenv(name);
    return v;
}

/* The same through fp4d_env_positive (at most 100, fallback 1). */
static double positive_with_stderr(const char *name, const char *value, char *printed, size_t cap)
{
    set_or_unset(name, value);
    const stderr_capture c = capture_begin();
    const double v = fp4d_env_positive(name, 100.0, 1.0);
    capture_end(c, printed, cap);
    unsetenv(name);
    return v;
}

/* Multipliers (FP4DOCTOR_TIMEOUT_SCALE): a positive number, written whole, or the fallback with
 * the one warning. strtod alone read "2x" as 2 and "0", "-1", "nan" became 1 without a word. */
static void test_env_positive_numbers(void **state)
{
    (void)state;
    char out[512];
    assert_true(positive_with_stderr("FP4D_TEST_POS_A", NULL, out, sizeof out) == 1.0);
    assert_string_equal(out, "");
    assert_true(positive_with_stderr("FP4D_TEST_POS_A", "60", out, sizeof out) == 60.0);
    assert_true(positive_with_stderr("FP4D_TEST_POS_A", "0.5", out, sizeof out) == 0.5);
    assert_true(positive_with_stderr("FP4D_TEST_POS_A", ".25", out, sizeof out) == 0.25);
    assert_true(positive_with_stderr("FP4D_TEST_POS_A", "1e2", out, sizeof out) == 100.0);
    assert_string_equal(out, "");
    assert_true(positive_with_stderr("FP4D_TEST_POS_A", "2x", out, sizeof out) == 1.0);
    assert_non_null(strstr(out, "FP4D_TEST_POS_A=2x"));
    assert_non_null(strstr(out, "using 1"));
    const char *refused[] = {"0", "-1", " 2", "+2", "nan", "inf", "1e3", "abc", "0x"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        assert_true(positive_with_stderr("FP4D_TEST_POS_B", refused[i], out, sizeof out) == 1.0);
    /* on/off switches: on unless 0 */
    setenv("FP4D_TEST_SWITCH", "0", 1);
    assert_int_equal(fp4d_env_switch("FP4D_TEST_SWITCH"), 0);
    setenv("FP4D_TEST_SWITCH", "off", 1);
    stderr_capture c = capture_begin();
    assert_int_equal(fp4d_env_switch("FP4D_TEST_SWITCH"), 1);
    capture_end(c, out, sizeof out);
    assert_non_null(strstr(out, "FP4D_TEST_SWITCH=off"));
    unsetenv("FP4D_TEST_SWITCH");
    assert_int_equal(fp4d_env_switch("FP4D_TEST_SWITCH"), 1);
}

/* Tuning switches (FP4DOCTOR_CUDA_*, FP4DOCTOR_THREADS, ...): digits within the range, or the
 * fallback with one warning per variable. atoi() read FP4DOCTOR_CUDA_WA=off as 0, switching
 * the stream kernel off without a word. */
static void test_env_knobs_warn_once_and_fall_back(void **state)
{
    (void)state;
    char out[512];
    assert_int_equal(knob_with_stderr("FP4D_TEST_KNOB_A", NULL, 0, 1, 1, out, sizeof out), 1);
    assert_string_equal(out, "");
    assert_int_equal(knob_with_stderr("FP4D_TEST_KNOB_A", "", 0, 1, 1, out, sizeof out), 1);
    assert_string_equal(out, "");
    assert_int_equal(knob_with_stderr("FP4D_TEST_KNOB_A", "0", 0, 1, 1, out, sizeof out), 0);
    assert_string_equal(out, "");
    assert_int_equal(knob_with_stderr("FP4D_TEST_KNOB_A", "1", 0, 1, 1, out, sizeof out), 1);
    assert_int_equal(knob_with_stderr("FP4D_TEST_KNOB_B", "4", 1, 16, 9, out, sizeof out), 4);
    assert_string_equal(out, "");

    /* "off" is not 0: the fallback, and a warning naming the variable, its text and the range */
    assert_int_equal(knob_with_stderr("FP4D_TEST_KNOB_A", "off", 0, 1, 1, out, sizeof out), 1);
    assert_non_null(strstr(out, "FP4D_TEST_KNOB_A=off"));
    assert_non_null(strstr(out, "from 0 to 1"));
    assert_non_null(strstr(out, "using 1"));
    /* ... once per variable */
    assert_int_equal(knob_with_stderr("FP4D_TEST_KNOB_A", "-1", 0, 1, 1, out, sizeof out), 1);
    assert_string_equal(out, "");

    /* one digit above a one-digit range: the fallback (not the digit) */
    assert_int_equal(knob_with_stderr("FP4D_TEST_KNOB_E", "2", 0, 1, 1, out, sizeof out), 1);
    assert_non_null(strstr(out, "FP4D_TEST_KNOB_E=2"));
    assert_int_equal(knob_with_stderr("FP4D_TEST_KNOB_E", "5", 0, 4, -1, out, sizeof out), -1);
    /* a fallback outside the range is a marker, named "the default" */
    assert_int_equal(knob_with_stderr("FP4D_TEST_KNOB_F", "x", 0, 4, -1, out, sizeof out), -1);
    assert_non_null(strstr(out, "using the default"));

    /* out of range, signs, spaces, trailing text: the fallback */
    assert_int_equal(knob_with_stderr("FP4D_TEST_KNOB_B", "17", 1, 16, 9, out, sizeof out), 9);
    assert_non_null(strstr(out, "FP4D_TEST_KNOB_B=17"));
    assert_int_equal(knob_with_stderr("FP4D_TEST_KNOB_B", "0", 1, 16, 9, out, sizeof out), 9);
    assert_int_equal(knob_with_stderr("FP4D_TEST_KNOB_B", "+4", 1, 16, 9, out, sizeof out), 9);
    assert_int_equal(knob_with_stderr("FP4D_TEST_KNOB_B", " 4", 1, 16, 9, out, sizeof out), 9);
    assert_int_equal(knob_with_stderr("FP4D_TEST_KNOB_B", "4x", 1, 16, 9, out, sizeof out), 9);
    assert_int_equal(knob_with_stderr("FP4D_TEST_KNOB_B", "99999999999999999999999", 1, 16, 9, out, sizeof out), 9);

    /* the user's text is printed cleaned (no terminal escapes) and cut short */
    assert_int_equal(knob_with_stderr("FP4D_TEST_KNOB_C", "\x1b[31mred", 0, 1, 1, out, sizeof out), 1);
    assert_null(strchr(out, '\x1b'));
    assert_non_null(strstr(out, "FP4D_TEST_KNOB_C=?[31mred"));
    char long_text[300];
    memset(long_text, '7', sizeof long_text - 1);
    long_text[sizeof long_text - 1] = '\0';
    assert_int_equal(knob_with_stderr("FP4D_TEST_KNOB_D", long_text, 0, 100, 5, out, sizeof out), 5);
    assert_non_null(strstr(out, "..."));
    assert_true(strlen(out) < 200);
}

static void test_status_numbers_are_stable(void **state)
{
    (void)state;
    assert_int_equal(FP4D_STATUS_OK, 0);
    assert_int_equal(FP4D_STATUS_INVALID_ARG, 1);
    assert_int_equal(FP4D_STATUS_INTERRUPTED, 10);
    assert_string_equal(fp4d_status_name(FP4D_STATUS_PARSE), "PARSE");
    assert_string_equal(fp4d_status_str((fp4d_status)999), "unknown status");
}

static void test_last_error_is_set_by_guards(void **state)
{
    (void)state;
    fp4d_status s = fp4d_set_error(FP4D_STATUS_PARSE, "tensor '%s' is %d bytes short", "w", 3);
    assert_int_equal(s, FP4D_STATUS_PARSE);
    assert_string_equal(fp4d_last_error(), "tensor 'w' is 3 bytes short");
    assert_int_equal(fp4d_version_number(), FP4D_VERSION_NUMBER);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_numbers_are_stable),
        cmocka_unit_test(test_env_digits_are_strict),
        cmocka_unit_test(test_env_knobs_warn_once_and_fall_back),
        cmocka_unit_test(test_env_positive_numbers),
        cmocka_unit_test(test_last_error_is_set_by_guards),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
