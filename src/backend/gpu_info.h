/*
 * Internal: what the CUDA side of the build can tell about this machine. Implemented in
 * src/backend/cuda/gpu_info.c when CUDA is built, and by gpu_info_none.c otherwise.
 * Used by `fp4doctor env`, the verdict-cache fingerprint and --device all.
 */
#ifndef FP4D_GPU_INFO_H
#define FP4D_GPU_INFO_H

#include <stdbool.h>
#include <stddef.h>

#define FP4D_MAX_GPUS 16

typedef struct fp4d_gpu_info {
    int    index;
    char   name[128];
    int    cc_major, cc_minor;
    size_t total_mem_bytes;
    int    sm_count;
    size_t l2_bytes;
    char   pci_bus_id[32];
    bool   has_native_code;  /* this build carries SASS for its architecture */
    bool   runs_from_ptx;    /* no SASS, but PTX the driver JIT-compiles for it at first use */
    bool   code_unknown;     /* neither, but the build's list holds CMake's "native" or "all" */
} fp4d_gpu_info;

typedef struct fp4d_cuda_info {
    bool built_with_cuda;      /* the CUDA backends are compiled in */
    char built_archs[256];     /* e.g. "sm_80,sm_90a,sm_100a,sm_120a,compute_90" */
    int  driver_version;       /* cudaDriverGetVersion, e.g. 13000; 0 = no driver */
    int  runtime_version;      /* cudaRuntimeGetVersion */
    int  cublaslt_version;     /* cublasLtGetVersion; 0 if unknown */
    int  cudnn_version;        /* cudnnGetVersion; 0 if not built with cuDNN */
    int  device_count;
    char error[256];           /* why there are no devices ("no CUDA driver", ...), else "" */
    fp4d_gpu_info gpus[FP4D_MAX_GPUS];
} fp4d_cuda_info;

/* Fills *out; never crashes on a machine without a GPU or driver. Cheap after the first call.
 * Creates no CUDA context: a parent that holds one on every GPU keeps its children from using
 * a GPU in EXCLUSIVE_PROCESS compute mode, and holds hundreds of MB of each GPU's memory. */
void fp4d_cuda_query(fp4d_cuda_info *out);

/* Whether this process's CUDA context on `device` is broken for good: a sticky error (an
 * illegal address, a kernel trap or launch failure) that every later call would return
 * again. A non-sticky error left pending is cleared. On true, why gets the error's name.
 * False without CUDA. */
bool fp4d_cuda_context_lost(int device, char *why, size_t size);

/* The calling thread's current CUDA context. A GPU backend selects its device on every call
 * (cudaSetDevice), which makes that device's primary context current in the caller's thread;
 * the registry saves the caller's context before such a call and makes it current again
 * after, so that a program that uses CUDA itself finds its thread as it left it (its device,
 * or its own context, or none). `known` is false without CUDA or a driver: nothing to restore. */
typedef struct fp4d_cuda_thread_context {
    void *ctx;
    bool  known;
} fp4d_cuda_thread_context;

void fp4d_cuda_thread_context_save(fp4d_cuda_thread_context *saved);
void fp4d_cuda_thread_context_restore(const fp4d_cuda_thread_context *saved);

#endif
