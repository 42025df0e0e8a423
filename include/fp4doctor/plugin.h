/*
 * plugin.h - bring your own FP4 kernel to the doctor.
 *
 * A plugin is a shared library that exports ONE C symbol:
 *
 *     int fp4d_plugin_init(const fp4d_plugin_host *host);
 *
 * fp4doctor loads it (`--plugin PATH`, repeatable, or FP4DOCTOR_PLUGINS=a.so:b.so), checks
 * host->api_version against what the plugin was compiled for, and the plugin calls
 * host->register_backend() once per backend it provides, with a fp4d_backend_iface filled
 * as backend.h describes (api_version = FP4D_BACKEND_API_VERSION, struct_size =
 * sizeof(fp4d_backend_iface), kind = FP4D_BACKEND_KIND_PLUGIN). The iface must stay valid
 * until the process exits (make it static). Return 0 on success, non-zero to refuse to
 * load (host->log() your reason first). Registered names get the prefix "plugin:".
 * The backends become visible to the registry (and to other threads) only when this
 * returns 0 and every registration was accepted; a refused plugin leaves no trace.
 *
 * Versions: fp4d_plugin_host has no struct_size. Slots are only appended, each with a new
 * api_version, so read a slot added after version 1 only when host->api_version says it
 * exists. An iface with an api_version newer than host->api_version is refused: a plugin
 * built against newer headers that wants to run on an older fp4doctor registers with
 * api_version = host->api_version (its struct_size may stay larger; the extra slots are not
 * read). backend.h lists what else is frozen and how enums grow.
 *
 * A plugin cannot set fp4d_last_error(): when a slot returns a failure, fp4doctor reports
 * the backend, the slot and the status (put details in fp4d_reason where a slot has one).
 *
 * The doctor runs every backend's cases in a child process, so a plugin that crashes or
 * hangs costs its own verdicts only. A plugin does not need to link against libfp4doctor.
 * See examples/plugin/ for a complete one.
 */
#ifndef FP4DOCTOR_PLUGIN_H
#define FP4DOCTOR_PLUGIN_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FP4D_PLUGIN_ENTRY_SYMBOL "fp4d_plugin_init"

typedef struct fp4d_plugin_host {
    uint32_t api_version;  /* FP4D_BACKEND_API_VERSION of the loading fp4doctor */
    /* Registers a backend; returns 0, or non-zero when the iface is rejected (the reason
     * is printed by fp4doctor). */
    int  (*register_backend)(const struct fp4d_plugin_host *host, const fp4d_backend_iface *iface);
    /* Prints one line to fp4doctor's stderr, prefixed with the plugin's file name. */
    void (*log)(const struct fp4d_plugin_host *host, const char *message);
    void *host_data;       /* fp4doctor's own */
} fp4d_plugin_host;

typedef int (*fp4d_plugin_init_fn)(const fp4d_plugin_host *host);

#ifdef __cplusplus
}
#endif
#endif
