/*
 * Registers "api-transient", then, still inside its init, asks the loading program's
 * fp4d_registry_find() (found with dlsym: the test exports its symbols) whether the
 * backend can already be seen, and stores the answer in the test's api_seen_during_init.
 * Then it registers an iface without a gemm slot, so the whole plugin is refused.
 */
#include <dlfcn.h>
#include <stdio.h>

#include "fp4doctor/plugin.h"

static fp4d_status t_init(void *u, int d, void **ctx, fp4d_reason *why)
{
    (void)u, (void)d, (void)why;
    *ctx = NULL;
    return FP4D_STATUS_OK;
}
static void t_free(void *ctx) { (void)ctx; }
static bool t_supports(void *ctx, const fp4d_gemm_desc *d, fp4d_reason *why)
{
    (void)ctx, (void)d;
    snprintf(why->text, sizeof why->text, "supports nothing");
    return false;
}
static fp4d_status t_gemm(void *ctx, const fp4d_gemm_problem *p)
{
    (void)ctx, (void)p;
    return FP4D_STATUS_OK;
}

static const fp4d_backend_iface good = {
    .api_version = FP4D_BACKEND_API_VERSION, .struct_size = sizeof(fp4d_backend_iface), .name = "api-transient",
    .kind = FP4D_BACKEND_KIND_PLUGIN, .init = t_init, .free = t_free, .supports = t_supports, .gemm = t_gemm,
};
static const fp4d_backend_iface no_gemm = {
    .api_version = FP4D_BACKEND_API_VERSION, .struct_size = sizeof(fp4d_backend_iface), .name = "api-no-gemm",
    .kind = FP4D_BACKEND_KIND_PLUGIN, .init = t_init, .free = t_free, .supports = t_supports,
};

int fp4d_plugin_init(const fp4d_plugin_host *host)
{
    host->register_backend(host, &good);
    union {
        void *obj;
        const fp4d_backend_iface *(*fn)(const char *);
    } find;
    find.obj  = dlsym(RTLD_DEFAULT, "fp4d_registry_find");
    int *seen = dlsym(RTLD_DEFAULT, "api_seen_during_init");
    if (find.obj && seen) *seen = find.fn("plugin:api-transient") != NULL ? 1 : 0;
    host->register_backend(host, &no_gemm);
    return 0;
}
