/*
 * adv_abuse_plugin.c - plugins that misuse plugin.h. ADV_ABUSE selects the misuse; the
 * doctor must refuse each with a clear one-line error and a non-zero exit, never crash.
 *   1 api99        registers an iface with api_version 99
 *   2 null_gemm    leaves the mandatory gemm slot NULL
 *   3 empty_name   name ""
 *   4 space_name   name "my kernel"
 *   5 dup_name     registers the same name twice
 *   6 init_refuses fp4d_plugin_init logs a reason and returns 3, registering nothing
 *   7 clash        registers "adv-correct", the name of another test plugin
 *   8 unavailable  loads fine, but its backend's init() says UNSUPPORTED with a reason
 *   9 null_name    name NULL, and host->log(NULL) first
 *  10 api0         api_version 0 (an iface left zeroed)
 *  11 null_iface   register_backend(host, NULL)
 *  12 prefixed     name "plugin:adv-prefixed" (the prefix spelled by the plugin): loads
 */
#include <stdio.h>
#include <string.h>

#include "fp4doctor/plugin.h"

static fp4d_status ab_init(void *u, int d, void **ctx, fp4d_reason *why)
{
    (void)u, (void)d;
    *ctx = NULL;
#if ADV_ABUSE == 8
    snprintf(why->text, sizeof why->text, "adv-unavailable needs an SM120 GPU and found none");
    return FP4D_STATUS_UNSUPPORTED;
#else
    (void)why;
    return FP4D_STATUS_OK;
#endif
}
static void ab_free(void *ctx) { (void)ctx; }
static bool ab_supports(void *ctx, const fp4d_gemm_desc *d, fp4d_reason *why)
{
    (void)ctx, (void)d;
    snprintf(why->text, sizeof why->text, "abuse plugin: supports nothing");
    return false;
}
static fp4d_status ab_gemm(void *ctx, const fp4d_gemm_problem *p)
{
    (void)ctx, (void)p;
    return FP4D_STATUS_UNSUPPORTED;
}

static fp4d_backend_iface iface = {
    .api_version = FP4D_BACKEND_API_VERSION,
    .struct_size = sizeof(fp4d_backend_iface),
    .name        = "adv-abuse",
    .description = "abuse test plugin",
    .kind        = FP4D_BACKEND_KIND_PLUGIN,
    .caps        = FP4D_CAP_GEMM,
    .init        = ab_init,
    .free        = ab_free,
    .supports    = ab_supports,
    .gemm        = ab_gemm,
};

__attribute__((visibility("default"))) int fp4d_plugin_init(const fp4d_plugin_host *host)
{
#if ADV_ABUSE == 1
    iface.api_version = 99;
#elif ADV_ABUSE == 2
    iface.gemm = NULL;
#elif ADV_ABUSE == 3
    iface.name = "";
#elif ADV_ABUSE == 4
    iface.name = "my kernel";
#elif ADV_ABUSE == 5
    iface.name = "adv-dup";
    if (host->register_backend(host, &iface) != 0) return 1;
#elif ADV_ABUSE == 6
    host->log(host, "adv-refuses: this plugin needs libfoo.so.3, refusing to load");
    return 3;
#elif ADV_ABUSE == 7
    iface.name = "adv-correct";
#elif ADV_ABUSE == 8
    iface.name = "adv-unavailable";
#elif ADV_ABUSE == 9
    host->log(host, NULL);
    iface.name = NULL;
#elif ADV_ABUSE == 10
    iface.api_version = 0;
#elif ADV_ABUSE == 11
    return host->register_backend(host, NULL);
#elif ADV_ABUSE == 12
    iface.name = "plugin:adv-prefixed";
#endif
    return host->register_backend(host, &iface);
}
