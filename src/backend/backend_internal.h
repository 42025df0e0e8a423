/*
 * Internal: the built-in backends and helpers shared by them. Not part of the API.
 */
#ifndef FP4D_BACKEND_INTERNAL_H
#define FP4D_BACKEND_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "fp4doctor/backend.h"

/* The built-in ifaces, in registration order. */
const fp4d_backend_iface *fp4d_ref_backend_iface(void);
const fp4d_backend_iface *fp4d_cpu_backend_iface(void);
size_t                    fp4d_faulty_backend_count(void);
const fp4d_backend_iface *fp4d_faulty_backend_iface(size_t index); /* NULL past the end */

/* What the host backends (ref, cpu, faulty-*) accept: every format pair of DESIGN.md §3,
 * every scale layout, f32/bf16/f16 output. false and why otherwise. */
bool fp4d_host_backend_supports(const fp4d_gemm_desc *desc, fp4d_reason *why);

/* fp4d_quantize run over 128-row chunks on several threads, bit-identical to one call
 * (falls back to one call where that cannot be guaranteed). */
fp4d_status fp4d_threaded_quantize(fp4d_quantize_problem *q, int threads);

/* Loads one plugin (plugin.h) and registers its backends. */
fp4d_status fp4d_plugin_load(const char *path);

#endif
