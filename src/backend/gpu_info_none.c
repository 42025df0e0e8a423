/* gpu_info for builds without CUDA: no devices, and says why. */
#include <string.h>

#include "backend/gpu_info.h"

#ifndef FP4D_USE_CUDA
void fp4d_cuda_query(fp4d_cuda_info *out)
{
    memset(out, 0, sizeof *out);
    strcpy(out->error, "this fp4doctor was built without CUDA (no toolkit found at build time)");
}

bool fp4d_cuda_context_lost(int device, char *why, size_t size)
{
    (void)device, (void)why, (void)size;
    return false;
}

void fp4d_cuda_thread_context_save(fp4d_cuda_thread_context *saved)
{
    saved->ctx   = NULL;
    saved->known = false;
}

void fp4d_cuda_thread_context_restore(const fp4d_cuda_thread_context *saved) { (void)saved; }
#else
/* The CUDA build provides fp4d_cuda_query in src/backend/cuda/gpu_info.c. */
typedef int fp4d_gpu_info_none_unused;
#endif
