/* Status codes and version: the numbers are a published contract. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
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
        cmocka_unit_test(test_last_error_is_set_by_guards),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
