/*
 * A test plugin for `fp4doctor bench`: backends probe-a and probe-b whose bench() slot times
 * nothing but records each call - "<name> <repeats>" appended to the file named by
 * FP4D_TEST_BENCH_LOG - and answers its n-th call with a median of 10 n us and a minimum of
 * 10 n - 1. FP4D_TEST_BENCH_FAIL=NAME:N makes backend NAME fail its N-th call. So a test can
 * see the order in which bench takes its turns and what it makes of the answers.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp4doctor/plugin.h"

typedef struct probe {
    const char *name;
    int         calls;
} probe;

static probe probes[2] = {{"probe-a", 0}, {"probe-b", 0}};

static fp4d_status p_init(void *user, int device, void **ctx, fp4d_reason *why)
{
    (void)device, (void)why;
    *ctx = user;
    return FP4D_STATUS_OK;
}
static void p_free(void *ctx) { (void)ctx; }
static bool p_supports(void *ctx, const fp4d_gemm_desc *d, fp4d_reason *why)
{
    (void)ctx, (void)d, (void)why;
    return true;
}
static fp4d_status p_gemm(void *ctx, const fp4d_gemm_problem *p)
{
    (void)ctx, (void)p;
    return FP4D_STATUS_INTERNAL; /* never called by bench when bench() exists */
}

static fp4d_status p_bench(void *ctx, const fp4d_gemm_desc *d, int repeats, fp4d_bench_result *out)
{
    (void)d;
    probe *pr = ctx;
    const int n = ++pr->calls;
    const char *log = getenv("FP4D_TEST_BENCH_LOG");
    FILE *f = log ? fopen(log, "a") : NULL;
    if (f) {
        fprintf(f, "%s %d\n", pr->name, repeats);
        fclose(f);
    }
    const char *fail = getenv("FP4D_TEST_BENCH_FAIL");
    const size_t len = strlen(pr->name);
    if (fail && !strncmp(fail, pr->name, len) && fail[len] == ':' && atoi(fail + len + 1) == n) return FP4D_STATUS_DEVICE;
    out->median_us = 10.0 * n;
    out->min_us = 10.0 * n - 1.0;
    out->repeats = repeats;
    return FP4D_STATUS_OK;
}

static fp4d_backend_iface ifaces[2];

int fp4d_plugin_init(const fp4d_plugin_host *host)
{
    for (int i = 0; i < 2; i++) {
        ifaces[i] = (fp4d_backend_iface){
            .api_version = FP4D_BACKEND_API_VERSION,
            .struct_size = sizeof(fp4d_backend_iface),
            .name        = probes[i].name,
            .description = "records bench() calls (test plugin)",
            .kind        = FP4D_BACKEND_KIND_PLUGIN,
            .caps        = FP4D_CAP_GEMM,
            .user_data   = &probes[i],
            .init        = p_init,
            .free        = p_free,
            .supports    = p_supports,
            .gemm        = p_gemm,
            .bench       = p_bench,
        };
        const int rc = host->register_backend(host, &ifaces[i]);
        if (rc) return rc;
    }
    return 0;
}
