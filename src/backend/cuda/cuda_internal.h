/*
 * cuda_internal.h - helpers shared by the GPU backends' host code (internal).
 *
 * Device buffers that grow on demand and are kept in a backend's context, CUDA error to
 * fp4d_status conversion, uploading a host GEMM problem, and the timing loop of bench().
 */
#ifndef FP4D_CUDA_INTERNAL_H
#define FP4D_CUDA_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "fp4doctor/backend.h"
#include "kernels.h"

/* Sets why->text (printf style); why may be NULL. */
void fp4d_cuda_reason(fp4d_reason *why, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* A CUDA runtime error as a DEVICE status with fp4d_last_error() = "<what>: <cuda message>". */
fp4d_status fp4d_cuda_status(int cuda_error, const char *what);
/* Waits for the stream, then reports any error it or an earlier launch left (launch
 * errors surface on the synchronisation or in cudaGetLastError). */
fp4d_status fp4d_cuda_sync(cudaStream_t s, const char *what);
#define FP4D_CUDA_TRY(expr, what)                                              \
    do {                                                                       \
        int fp4d_cuda_e_ = (int)(expr);                                        \
        if (fp4d_cuda_e_ != 0) return fp4d_cuda_status(fp4d_cuda_e_, (what));  \
    } while (0)

/* The device for init(): -1 means device 0. Fills why and returns UNSUPPORTED when there
 * is no driver or no such device; also reports the multiprocessor count, L2 size and
 * compute capability. */
fp4d_status fp4d_cuda_open_device(int device, int *resolved, int *sm_count, size_t *l2_bytes, int *cc,
                                  fp4d_reason *why);

/* A device allocation that only grows, used by one stream: it grows in that stream's order
 * (stream-ordered allocation where the device has memory pools). zero_new: newly allocated
 * bytes are zeroed in that stream. */
typedef struct fp4d_devbuf {
    void  *ptr;
    size_t cap;
    bool   pooled; /* from cudaMallocAsync */
} fp4d_devbuf;

fp4d_status fp4d_devbuf_reserve(fp4d_devbuf *b, size_t bytes, bool zero_new, cudaStream_t stream);
void        fp4d_devbuf_free(fp4d_devbuf *b);

/* Bytes of an operand's element data / scale buffer as the host hands them over. */
size_t fp4d_cuda_matrix_data_bytes(const fp4d_matrix *x);
size_t fp4d_cuda_matrix_scale_bytes(const fp4d_matrix *x);

/* Copies an operand to the device (data and scales into two buffers). */
fp4d_status fp4d_cuda_upload_matrix(const fp4d_matrix *x, fp4d_devbuf *data, fp4d_devbuf *scales,
                                    cudaStream_t s);

/* ---- bench support ----------------------------------------------------------------- */

/* One timed call of a benchmark on weight copy `copy`. */
typedef fp4d_status (*fp4d_cuda_bench_fn)(void *state, int copy);

/*
 * Times fn with CUDA events: a warm-up, then `repeats` batches of `copies` calls (one per
 * weight copy, so that every call reads weights that are not in L2); each batch gives the
 * mean time of one call, and the result is the median and minimum over batches.
 */
fp4d_status fp4d_cuda_time(cudaStream_t s, fp4d_cuda_bench_fn fn, void *state, int copies, int repeats,
                           fp4d_bench_result *out);

/* How many copies of `bytes` of weights to rotate through so that they do not fit in L2,
 * bounded by the free device memory. At least 1. */
int fp4d_cuda_rotation_copies(size_t bytes, size_t l2_bytes);

/* Synthetic benchmark operands on the device: FP4 codes are pseudo-random, block scales a
 * constant valid byte (1.0 for NVFP4, 2^0 for MXFP4); plain activations are dequantized
 * from such codes so that their values are small and finite. */
fp4d_status fp4d_cuda_make_bench_fp4(fp4d_dtype format, int64_t rows, int64_t cols, fp4d_scale_layout layout,
                                     uint32_t seed, fp4d_devbuf *codes, fp4d_devbuf *scales, cudaStream_t s);
fp4d_status fp4d_cuda_make_bench_plain(fp4d_dtype type, int64_t rows, int64_t cols, uint32_t seed,
                                       fp4d_devbuf *data, cudaStream_t s);

/* Deterministic MoE routing for benchmarks: `tokens` tokens each pick `top_k` distinct
 * experts out of num_experts; offsets (num_experts + 1) receive the row ranges of a
 * [tokens * top_k, K] activation matrix grouped by expert. rotate shifts expert ids. */
void fp4d_cuda_bench_routing(int64_t tokens, int top_k, int num_experts, int rotate, int64_t *offsets);

/* The backends' ifaces (register.c adds them to the registry). */
const fp4d_backend_iface *fp4d_cuda_own_backend_iface(void);
const fp4d_backend_iface *fp4d_cublas_bf16_backend_iface(void);
const fp4d_backend_iface *fp4d_cublaslt_backend_iface(void);
const fp4d_backend_iface *fp4d_cudnn_backend_iface(void);

#endif
