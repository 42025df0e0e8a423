/*
 * Internal: the doctor's verdict cache (DESIGN.md §7). One JSON file per machine
 * fingerprint (GPU name, compute capability, driver, CUDA runtime, cuBLASLt, cuDNN,
 * fp4doctor version, backend build id) under $XDG_CACHE_HOME/fp4doctor/ (default
 * ~/.cache/fp4doctor/), written atomically (temporary file + rename).
 * The doctor writes it after a check; `auto` (backend.h) reads it.
 */
#ifndef FP4D_VERDICT_CACHE_H
#define FP4D_VERDICT_CACHE_H

#include <stdbool.h>

#include "fp4doctor/fp4doctor.h"

typedef struct fp4d_cached_verdict {
    char   verdict[24];   /* "PASS", "WRONG", ... (the backend's worst verdict over the suite) */
    char   suite[16];     /* which suite produced it */
    double gflops;        /* measured speed on the suite's largest passing case; 0 = unknown */
} fp4d_cached_verdict;

/* Path of this machine's cache file (static storage). */
const char *fp4d_verdict_cache_path(void);
/* true and *out filled when the cache holds a verdict for backend on device (-1 = host). */
bool fp4d_verdict_cache_get(const char *backend, int device, fp4d_cached_verdict *out);
/* Adds or replaces one entry; read-modify-write with an atomic rename. */
fp4d_status fp4d_verdict_cache_put(const char *backend, int device, const fp4d_cached_verdict *v);
/* FP4DOCTOR_NO_CACHE=1 or --no-cache: neither read nor write. */
void fp4d_verdict_cache_disable(bool disabled);

#endif
