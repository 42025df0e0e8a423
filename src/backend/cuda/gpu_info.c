/*
 * gpu_info.c - what this machine's GPUs are and whether this build carries code for
 * them (gpu_info.h). Never crashes without a GPU or driver: the CUDA runtime's error
 * becomes device_count 0 and a reason.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "backend/arch_list.h"
#include "backend/gpu_info.h"
#include "cuda_internal.h"

#ifdef FP4D_USE_CUDNN
/* cuDNN is loaded at run time (backend_cudnn.c); 0 when it cannot be loaded. */
int fp4d_cudnn_runtime_version(void);
#else
static int fp4d_cudnn_runtime_version(void) { return 0; }
#endif

static fp4d_cuda_info cached;
static pthread_once_t cached_once = PTHREAD_ONCE_INIT;

static void query_once(void)
{
    fp4d_cuda_info *out = &cached;
    memset(out, 0, sizeof *out);
    out->built_with_cuda = true;
    fp4d_arch_list_describe(FP4D_CUDA_ARCHS_BUILT, out->built_archs, sizeof out->built_archs);
    cudaDriverGetVersion(&out->driver_version);
    cudaRuntimeGetVersion(&out->runtime_version);
    out->cublaslt_version = (int)cublasLtGetVersion();
    out->cudnn_version = fp4d_cudnn_runtime_version();

    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(out->error, sizeof out->error, "%s (%s)",
                 out->driver_version == 0 ? "no CUDA driver found" : cudaGetErrorString(e), cudaGetErrorName(e));
        return;
    }
    if (count == 0) {
        snprintf(out->error, sizeof out->error, "no CUDA GPU found");
        return;
    }
    out->device_count = count > FP4D_MAX_GPUS ? FP4D_MAX_GPUS : count;
    for (int d = 0; d < out->device_count; d++) {
        fp4d_gpu_info *g = &out->gpus[d];
        struct cudaDeviceProp p;
        g->index = d;
        if (cudaGetDeviceProperties(&p, d) != cudaSuccess) {
            (void)cudaGetLastError();
            snprintf(g->name, sizeof g->name, "unknown (cudaGetDeviceProperties failed)");
            continue;
        }
        snprintf(g->name, sizeof g->name, "%.127s", p.name);
        g->cc_major = p.major;
        g->cc_minor = p.minor;
        g->total_mem_bytes = p.totalGlobalMem;
        g->sm_count = p.multiProcessorCount;
        g->l2_bytes = (size_t)p.l2CacheSize;
        if (cudaDeviceGetPCIBusId(g->pci_bus_id, (int)sizeof g->pci_bus_id, d) != cudaSuccess) {
            (void)cudaGetLastError();
            g->pci_bus_id[0] = '\0';
        }
        /* Native code = this build carries SASS this architecture runs, not PTX the
         * driver would compile at load time. From the build's list, not by asking the runtime
         * which image it loads (cudaFuncGetAttributes): that creates a context on every GPU
         * (fp4d_cuda_query). The backends' init asks the runtime, in their own process. From
         * the build's own list, not built_archs, which may be cut short for display. */
        const fp4d_arch_code code = fp4d_arch_list_code_for(FP4D_CUDA_ARCHS_BUILT, p.major, p.minor, p.integrated != 0);
        g->has_native_code = code == FP4D_ARCH_CODE_NATIVE;
        g->runs_from_ptx = code == FP4D_ARCH_CODE_PTX;
        g->code_unknown = code == FP4D_ARCH_CODE_UNKNOWN;
    }
}

void fp4d_cuda_query(fp4d_cuda_info *out)
{
    pthread_once(&cached_once, query_once);
    *out = cached;
}

bool fp4d_cuda_context_lost(int device, char *why, size_t size)
{
    if (cudaSetDevice(device) != cudaSuccess) (void)cudaGetLastError();
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess) return false;
    (void)cudaGetLastError(); /* clears a non-sticky error; a sticky one stays */
    e = cudaDeviceSynchronize();
    if (e == cudaSuccess) return false;
    snprintf(why, size, "the CUDA context is lost: %s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
    return true;
}

/* ---- the caller's current context (gpu_info.h) ----------------------------------------- */

/* cuCtxGetCurrent / cuCtxSetCurrent through the runtime's driver entry points: fp4doctor
 * does not link libcuda, so that it starts on machines without a driver. */
typedef int (*ctx_get_fn)(void **ctx);
typedef int (*ctx_set_fn)(void *ctx);
static ctx_get_fn      ctx_get;
static ctx_set_fn      ctx_set;
static pthread_once_t  ctx_fns_once = PTHREAD_ONCE_INIT;

static void find_ctx_fns(void)
{
    void *get = NULL, *set = NULL;
    enum cudaDriverEntryPointQueryResult qg, qs;
    if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &get, 4000, cudaEnableDefault, &qg) == cudaSuccess &&
        qg == cudaDriverEntryPointSuccess &&
        cudaGetDriverEntryPointByVersion("cuCtxSetCurrent", &set, 4000, cudaEnableDefault, &qs) == cudaSuccess &&
        qs == cudaDriverEntryPointSuccess) {
        ctx_get = (ctx_get_fn)get;
        ctx_set = (ctx_set_fn)set;
    } else {
        (void)cudaGetLastError(); /* no driver: nothing to save */
    }
}

void fp4d_cuda_thread_context_save(fp4d_cuda_thread_context *saved)
{
    pthread_once(&ctx_fns_once, find_ctx_fns);
    saved->ctx   = NULL;
    saved->known = ctx_get && ctx_get(&saved->ctx) == 0;
}

void fp4d_cuda_thread_context_restore(const fp4d_cuda_thread_context *saved)
{
    void *now = NULL;
    if (saved->known && ctx_get(&now) == 0 && now != saved->ctx) (void)ctx_set(saved->ctx);
}
