/* Adds the GPU backends to the registry (cuda_backends.h). Touches no GPU. */
#include "cuda_backends.h"
#include "cuda_internal.h"

void fp4d_cuda_register_backends(void)
{
    /* Registration order is the order `fp4doctor backends` lists them. A duplicate
     * (a second fp4d_registry_init) is rejected by the registry and harmless here. */
    (void)fp4d_registry_add(fp4d_cuda_own_backend_iface());
    (void)fp4d_registry_add(fp4d_cublaslt_backend_iface());
#ifdef FP4D_USE_CUDNN
    (void)fp4d_registry_add(fp4d_cudnn_backend_iface());
#endif
    (void)fp4d_registry_add(fp4d_cublas_bf16_backend_iface());
}
