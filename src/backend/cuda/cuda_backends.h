/*
 * cuda_backends.h - registration of the GPU backends built from src/backend/cuda/.
 *
 * Compiled only when CUDA is found (FP4D_USE_CUDA). The registry calls
 * fp4d_cuda_register_backends() once from fp4d_registry_init(); it adds the backends
 * "cuda" (own kernels), "cublaslt" (native block-scaled FP4), "cudnn" (cuDNN graph API,
 * loaded at run time) and "cublas-bf16" (dequantize once, bf16 GEMM). Registration never
 * touches the GPU: a machine without a GPU or driver learns that from init()'s reason.
 */
#ifndef FP4D_CUDA_BACKENDS_H
#define FP4D_CUDA_BACKENDS_H

#include <stddef.h>
#include <stdint.h>

#include "fp4doctor/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

void fp4d_cuda_register_backends(void);

/* Benchmarks outside the GEMM interface, for `fp4doctor bench` (device-resident data,
 * CUDA-event timing, median of `repeats`):
 * the `cuda` quantize kernel (src -> NVFP4 flashinfer-exact with a given encode scale), and a
 * device-to-device copy of `bytes` (the bandwidth the quantize kernel is measured against). */
fp4d_status fp4d_cuda_bench_quantize(int device, fp4d_dtype src_type, int64_t rows, int64_t cols,
                                     fp4d_scale_layout layout, int repeats, fp4d_bench_result *out);
fp4d_status fp4d_cuda_bench_copy(int device, size_t bytes, int repeats, fp4d_bench_result *out);
/* Reading `bytes` once with a kernel that does nothing else (copies rotated past L2): the
 * floor for a GEMM that must stream that many weight bytes. dependent: each read waits for the
 * one before it to complete, as a GEMM's reads wait for the kernel before it (which may have
 * written them); otherwise consecutive reads overlap (programmatic dependent launch). */
fp4d_status fp4d_cuda_bench_read(int device, size_t bytes, bool dependent, int repeats, fp4d_bench_result *out);

#ifdef __cplusplus
}
#endif
#endif
