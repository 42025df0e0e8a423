/*
 * A plugin's backends enter the registry only once its init has succeeded. They used to be
 * registered one by one and removed again when a later one was refused: meanwhile another
 * thread could find one, open it (its code about to be dlclose'd) and keep a pointer whose
 * name was then freed, and entries registered by other threads moved under their pointers.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fp4doctor/backend.h"

/* Written by the plugin from inside its init: -1 = not asked, 0 = hidden, 1 = visible. */
int api_seen_during_init = -1;

static void test_refused_plugin_was_never_visible(void **state)
{
    (void)state;
    setenv("FP4DOCTOR_PLUGIN_TRIAL", "0", 1); /* the answer must come from this process */
    unsetenv("FP4DOCTOR_PLUGINS");
    assert_int_equal(fp4d_registry_init(NULL), FP4D_STATUS_OK);
    size_t                    before = fp4d_registry_count();
    const fp4d_backend_iface *last   = fp4d_registry_get(before - 1);
    const char               *paths[] = {FP4D_API_PLUGIN};
    fp4d_registry_options     opt     = {.plugin_paths = paths, .num_plugins = 1};
    assert_int_equal(fp4d_registry_init(&opt), FP4D_STATUS_INVALID_ARG);
    assert_non_null(strstr(fp4d_last_error(), "api-no-gemm"));
    assert_int_equal(api_seen_during_init, 0);
    assert_null(fp4d_registry_find("plugin:api-transient"));
    assert_int_equal(fp4d_registry_count(), before);
    assert_ptr_equal(fp4d_registry_get(before - 1), last); /* nothing moved */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refused_plugin_was_never_visible),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
