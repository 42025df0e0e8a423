/*
 * backend.h - the backend interface and registry.
 *
 * A backend is a versioned table of function pointers (fp4d_backend_iface) plus a context
 * that its init() creates. Built-in backends (ref, cpu, cuda, cublaslt, cudnn, cublas-bf16,
 * faulty-*) and plugins (plugin.h) register the same table. Slots marked (optional) may be
 * NULL. New slots are only ever appended, and api_version says which slots exist, in the
 * way SQLite's sqlite3_vfs.iVersion does. Never modify an iface after registering it.
 *
 * Growing this ABI without breaking built plugins:
 * - A new iface slot goes at the end with FP4D_BACKEND_API_VERSION + 1 (and its end in
 *   registry.c's iface_size_of_version()). The registry reads an iface only up to the
 *   smaller of its struct_size and the size its api_version defines; slots past that are
 *   NULL in the registry's copy. An older plugin keeps working unchanged; a newer one that
 *   wants to load into an older fp4doctor sets api_version to host->api_version when that
 *   is lower (plugin.h), as an api_version newer than the host's is refused.
 * - The structs a backend is handed or fills (fp4d_matrix, fp4d_gemm_desc,
 *   fp4d_gemm_problem, fp4d_grouped_gemm_problem - whose b is an ARRAY of fp4d_matrix -,
 *   fp4d_quantize_params/result/problem, fp4d_reason, fp4d_bench_result) have no size
 *   field: their layouts are frozen for an API version. Changing one means a new API
 *   version, with the old layout still passed to backends of the old version.
 * - Enums (fp4d_dtype, fp4d_scale_layout, fp4d_convention, fp4d_backend_kind, FP4D_CAP_*)
 *   only gain values, appended. A backend must answer supports() "no" for any value it does
 *   not know (compare with the values it handles, never index a table with an unchecked
 *   value); the *_COUNT constants are those of the header it was built with.
 * - fp4d_status only gains codes; a status from a backend that is no fp4d_status reaches
 *   callers as INTERNAL.
 *
 * Threads: the registry functions, fp4d_backend_open/close and the wrappers may be called
 * from any thread; a backend instance (fp4d_backend_t) is used by one thread at a time
 * unless its backend says otherwise.
 */
#ifndef FP4DOCTOR_BACKEND_H
#define FP4DOCTOR_BACKEND_H

#include <stdbool.h>

#include "gemm.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FP4D_BACKEND_API_VERSION 1

typedef enum fp4d_backend_kind {
    FP4D_BACKEND_KIND_REFERENCE = 0, /* exact: the judge */
    FP4D_BACKEND_KIND_CPU       = 1,
    FP4D_BACKEND_KIND_GPU       = 2,
    FP4D_BACKEND_KIND_FAULTY    = 3, /* deliberately broken, reproduces a published failure */
    FP4D_BACKEND_KIND_PLUGIN    = 4
} fp4d_backend_kind;

const char *fp4d_backend_kind_name(fp4d_backend_kind k); /* "reference", "cpu", ... */

/* Capability flags (fp4d_backend_iface.caps). */
enum {
    FP4D_CAP_GEMM          = 1u << 0,
    FP4D_CAP_GROUPED_GEMM  = 1u << 1,
    FP4D_CAP_QUANTIZE      = 1u << 2,
    FP4D_CAP_DEVICE_TIMING = 1u << 3, /* bench() times on the device itself */
    FP4D_CAP_NEEDS_DEVICE  = 1u << 4  /* runs on a GPU; init() takes a device index */
};

/* Why a backend cannot do something: a short human sentence, always NUL-terminated. */
#define FP4D_REASON_MAX 256
typedef struct fp4d_reason {
    char text[FP4D_REASON_MAX];
} fp4d_reason;

/* A quantize request for a backend that implements one (f32/bf16/f16 -> NVFP4/MXFP4). */
typedef struct fp4d_quantize_problem {
    fp4d_quantize_params params;
    fp4d_dtype           src_type;
    const void          *src;        /* row-major [rows, cols] */
    int64_t              rows, cols;
    uint8_t             *codes;      /* rows*cols/2 */
    uint8_t             *scales;     /* fp4d_scale_buffer_size(layout, rows, cols/block) */
    fp4d_quantize_result result;     /* out */
} fp4d_quantize_problem;

/* Timing of one benchmark configuration, filled by bench(). */
typedef struct fp4d_bench_result {
    double median_us;      /* median of repeated timings of one call */
    double min_us;
    int    repeats;
} fp4d_bench_result;

typedef struct fp4d_backend_iface {
    /* ---- version 1 ---- */
    uint32_t          api_version;  /* set to FP4D_BACKEND_API_VERSION */
    uint32_t          struct_size;  /* sizeof(fp4d_backend_iface) as compiled by the backend */
    const char       *name;         /* unique, [a-z0-9_-]+, e.g. "cpu", "faulty-zeros" */
    const char       *description;  /* one line */
    fp4d_backend_kind kind;
    uint32_t          caps;         /* FP4D_CAP_* */
    void             *user_data;    /* passed back to init(); the backend's own */

    /* Creates the context for one device (device is -1 for host backends). Returns OK, or
     * UNSUPPORTED / DEVICE with the reason why this backend is unavailable here. */
    fp4d_status (*init)(void *user_data, int device, void **ctx, fp4d_reason *why);
    /* Frees the context. free(NULL) is a harmless no-op. */
    void (*free)(void *ctx);
    /* Whether gemm()/grouped_gemm() can run desc. Unsupported is an answer, not a failure:
     * return false and say why. */
    bool (*supports)(void *ctx, const fp4d_gemm_desc *desc, fp4d_reason *why);
    /* Runs a GEMM. Problems have been validated and supports() said yes. */
    fp4d_status (*gemm)(void *ctx, const fp4d_gemm_problem *p);
    /* (optional) grouped MoE GEMM. */
    fp4d_status (*grouped_gemm)(void *ctx, const fp4d_grouped_gemm_problem *p);
    /* (optional) quantize. */
    fp4d_status (*quantize)(void *ctx, fp4d_quantize_problem *q);
    /* (optional) preference for `auto`: higher is preferred, 0 = do not pick. */
    int (*score)(void *ctx, const fp4d_gemm_desc *desc);
    /* (optional) times desc on data the backend makes itself (device-resident for GPUs,
     * weights rotated so they do not sit in cache). Without it, callers time gemm(). */
    fp4d_status (*bench)(void *ctx, const fp4d_gemm_desc *desc, int repeats, fp4d_bench_result *out);
} fp4d_backend_iface;

/* ---- registry ---- */

typedef struct fp4d_registry_options {
    bool         include_faulty;  /* also register faulty-*; FP4DOCTOR_INCLUDE_FAULTY=1 does too */
    const char **plugin_paths;    /* shared libraries to load (plugin.h); FP4DOCTOR_PLUGINS adds more */
    size_t       num_plugins;
} fp4d_registry_options;

/*
 * Registers the built-in backends (and, per options, the faulty ones and plugins). Safe to
 * call again: later calls only add what is new. A plugin that fails to load makes this
 * return the error (with fp4d_last_error() naming the file and the reason); backends
 * registered before it stay registered.
 */
fp4d_status fp4d_registry_init(const fp4d_registry_options *opt);
/* Registers one backend. Rejects a wrong api_version, a too-small struct_size, missing
 * mandatory slots or a duplicate name with INVALID_ARG. The registry keeps its own copy of
 * the struct (only the bytes struct_size and api_version cover) but not of what it points
 * to: the name, description and user_data must live as long as the process. Entries are
 * never removed or moved: pointers from fp4d_registry_get()/find() stay valid. */
fp4d_status fp4d_registry_add(const fp4d_backend_iface *iface);
size_t fp4d_registry_count(void);
const fp4d_backend_iface *fp4d_registry_get(size_t index);  /* NULL if out of range */
const fp4d_backend_iface *fp4d_registry_find(const char *name); /* NULL if unknown */

/* ---- instances ---- */

typedef struct fp4d_backend *fp4d_backend_t;

/* Opens a backend by name on a device (-1 = host/default). On failure *out is NULL and
 * why says why (unknown name, unavailable here). The first call of this or of
 * fp4d_backend_choose_auto() runs fp4d_registry_init(NULL) when no call has registered the
 * built-ins yet (fp4d_registry_add() of your own backend does not count). */
fp4d_status fp4d_backend_open(const char *name, int device, fp4d_backend_t *out, fp4d_reason *why);
void        fp4d_backend_close(fp4d_backend_t b); /* NULL is a no-op */
const fp4d_backend_iface *fp4d_backend_iface_of(fp4d_backend_t b);
/* The device b was opened on (-1: host/default; NULL: -1), so that a caller can open more
 * instances of the same backend on the same device. */
int                       fp4d_backend_device(fp4d_backend_t b);

bool        fp4d_backend_supports(fp4d_backend_t b, const fp4d_gemm_desc *desc, fp4d_reason *why);
/* Validate, check supports(), then run. UNSUPPORTED with why filled when it cannot. When
 * the backend itself fails, why and fp4d_last_error() carry its message, or one naming the
 * backend, the slot and the status where the backend set none (a plugin cannot). On
 * success, fp4d_last_error() is what it was before the call. */
fp4d_status fp4d_backend_gemm(fp4d_backend_t b, const fp4d_gemm_problem *p, fp4d_reason *why);
fp4d_status fp4d_backend_grouped_gemm(fp4d_backend_t b, const fp4d_grouped_gemm_problem *p, fp4d_reason *why);
fp4d_status fp4d_backend_quantize(fp4d_backend_t b, fp4d_quantize_problem *q, fp4d_reason *why);

/*
 * `auto`: FP4DOCTOR_BACKEND=name forces the choice; otherwise the highest-scoring backend
 * that supports desc (faulty backends are never chosen). Where the doctor's verdict cache
 * has entries for this machine, only backends with a cached PASS are eligible
 * (doctor.h documents the hook). FP4DOCTOR_DEBUG=1 prints the reasoning to stderr.
 * Returns the chosen name in *name_out (static storage).
 */
fp4d_status fp4d_backend_choose_auto(const fp4d_gemm_desc *desc, const char **name_out, fp4d_reason *why);

#ifdef __cplusplus
}
#endif
#endif
