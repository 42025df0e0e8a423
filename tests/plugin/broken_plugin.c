/*
 * Deliberately broken plugins for test_plugin_load.c. BROKEN_KIND selects the defect:
 *   1 no_symbol          exports no fp4d_plugin_init
 *   2 wrong_version      registers an iface with api_version 99
 *   3 init_fails         logs a reason and returns non-zero (after registering one backend)
 *   4 bad_iface          leaves the mandatory gemm slot NULL
 *   5 too_small          struct_size smaller than the v1 iface
 *   6 registers_nothing  returns 0 without registering anything
 *   7 bad_name           a name with characters outside [a-z0-9_-]
 *   8 init_crashes       dereferences NULL inside fp4d_plugin_init
 *   9 init_hangs         never returns from fp4d_plugin_init
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "fp4doctor/plugin.h"

static fp4d_status b_init(void *u, int d, void **ctx, fp4d_reason *why)
{
    (void)u, (void)d, (void)why;
    *ctx = NULL;
    return FP4D_STATUS_OK;
}
static void b_free(void *ctx) { (void)ctx; }
static bool b_supports(void *ctx, const fp4d_gemm_desc *d, fp4d_reason *why)
{
    (void)ctx, (void)d, (void)why;
    return true;
}
static fp4d_status b_gemm(void *ctx, const fp4d_gemm_problem *p)
{
    (void)ctx;
    memset(p->out, 0, (size_t)(p->a.rows * p->b.rows) * (p->out_type == FP4D_DTYPE_F32 ? 4 : 2));
    return FP4D_STATUS_OK;
}

static fp4d_backend_iface iface = {
    .api_version = FP4D_BACKEND_API_VERSION,
    .struct_size = sizeof(fp4d_backend_iface),
    .name        = "broken",
    .description = "a broken test plugin",
    .kind        = FP4D_BACKEND_KIND_PLUGIN,
    .caps        = FP4D_CAP_GEMM,
    .init        = b_init,
    .free        = b_free,
    .supports    = b_supports,
    .gemm        = b_gemm,
};

#if BROKEN_KIND == 1
int fp4d_plugin_init_misspelled(const fp4d_plugin_host *host) { return host->register_backend(host, &iface); }
#else
int fp4d_plugin_init(const fp4d_plugin_host *host)
{
#if BROKEN_KIND == 2
    iface.api_version = 99;
    iface.name        = "broken-version";
#elif BROKEN_KIND == 3
    iface.name = "broken-init";
    host->register_backend(host, &iface);
    host->log(host, "refusing to load: no suitable device");
    return 7;
#elif BROKEN_KIND == 4
    iface.name = "broken-iface";
    iface.gemm = NULL;
#elif BROKEN_KIND == 5
    iface.name        = "broken-small";
    iface.struct_size = 16;
#elif BROKEN_KIND == 6
    (void)host;
    return 0;
#elif BROKEN_KIND == 7
    iface.name = "Broken Name!";
#elif BROKEN_KIND == 8
    volatile int *volatile nowhere = NULL;
    *nowhere = 1;
#elif BROKEN_KIND == 9
    for (;;) pause();
#endif
    return host->register_backend(host, &iface);
}
#endif
