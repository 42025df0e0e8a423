/*
 * kernels.h - C entry points of the CUDA kernels in kernels.cu (internal).
 *
 * Every pointer here is a DEVICE pointer unless its name says host_. Launchers enqueue
 * work on `stream` and return a cudaError_t as int (0 = success) so that this header
 * needs no CUDA include; the host glue turns errors into fp4d_status with a message.
 *
 * Conventions shared with the host glue:
 *  - An FP4 operand is packed e2m1 codes [rows, cols/2] (low nibble = even element) plus
 *    block scales [rows, cols/block] in one of the fp4d_scale_layout layouts; block scales
 *    decode exactly as the library's codecs do (ue4m3: a byte with bit 7 set or 0x7F is
 *    NaN; ue8m0: 0xFF is NaN, 0 is 2^-127).
 *  - "Plain" element types are fp4d_dtype values F32, BF16, F16.
 */
#ifndef FP4D_CUDA_KERNELS_H
#define FP4D_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "fp4doctor/formats.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fp4d_dev_fp4 {
    const uint8_t *codes;
    const uint8_t *scales;
    int64_t        rows, cols;
    int32_t        format;  /* FP4D_DTYPE_NVFP4 or FP4D_DTYPE_MXFP4 */
    int32_t        layout;  /* fp4d_scale_layout */
} fp4d_dev_fp4;

/* Dequantizes src into a dense row-major [rows, cols] matrix of dst_type (F32, BF16 or
 * F16). e2m1 x block scale is computed exactly in f32 and then rounded to dst_type, which
 * is exact for NVFP4 in all three types and for MXFP4 in f32/bf16. */
int fp4d_cuda_dequantize(const fp4d_dev_fp4 *src, int dst_type, void *dst, void *stream);

/* Element-wise conversion between plain types (RNE when narrowing). */
int fp4d_cuda_convert(int src_type, const void *src, int dst_type, void *dst, size_t count, void *stream);

/* out[i] = RN_out_type(alpha * src[i]) for an f32 source. */
int fp4d_cuda_scale_convert(const float *src, float alpha, int dst_type, void *dst, size_t count, void *stream);

/* Fills count bytes of device memory with a byte pattern (used by tests and bench). */
int fp4d_cuda_fill_random_fp4(uint8_t *codes, size_t bytes, uint32_t seed, void *stream);
/* Holds `stream` for `ns` nanoseconds (one thread of one block waiting on the global timer), so
 * that work the host enqueues behind it meanwhile starts back to back once it ends. */
int fp4d_cuda_hold_stream(uint64_t ns, void *stream);

/* ---- tensor-core GEMM on dense operands (large M) ----------------------------------
 * out[m, n] = alpha * sum_k A[m, k] * B[n, k], A [M, K] and B [N, K] both row-major of
 * op_type (BF16 or F16), f32 accumulation, output F32/BF16/F16. K must be a multiple of 8
 * and the pointers 16-byte aligned. */
int fp4d_cuda_tiled_gemm(int op_type, const void *a, const void *b, int64_t m, int64_t n, int64_t k,
                         float alpha, int out_type, void *out, void *stream);

/* ---- fused GEMM (large M): packed NVFP4 weights dequantized in registers --------------
 * out[m, n] = alpha * sum_k A[m, k] * B[n, k]; A [M, K] row-major of op_type (BF16 or F16),
 * B NVFP4 codes [N, K/2] + block scales in `layout`; K % 64 == 0, pointers 16-byte aligned
 * (scales 4-byte aligned). f32 accumulation, output F32/BF16/F16 rounded once after alpha.
 * a_scratch: M x K 16-bit elements (16-byte aligned) for the k-permuted activations of the
 * sm_90a kernel that decodes the weights into registers; NULL takes the other kernels.
 * splits > 1 (from fp4d_cuda_fused_splits) needs the scratch fp4d_cuda_fused_scratch sizes:
 * partials, and counters that are zero before the launch (the kernels leave them zero);
 * splits are reduced in a fixed order (deterministic). */
int32_t fp4d_cuda_fused_splits(int64_t m, int64_t n, int64_t k, int sm_count);
void fp4d_cuda_fused_scratch(int64_t m, int64_t n, int32_t splits, size_t *partial_floats, size_t *counter_count);
/* Non-zero when the device lets a block have the fused kernel's ~85 KB of shared memory. */
int fp4d_cuda_fused_available(int device);
int fp4d_cuda_fused_gemm(int op_type, const void *a, const uint8_t *codes, const uint8_t *scales, int layout,
                         int64_t m, int64_t n, int64_t k, float alpha, int out_type, void *out, int32_t splits,
                         float *partials, uint32_t *counters, void *a_scratch, void *stream);

/* Grouped form of the fused GEMM (sm_90a register-decode wgmma kernel; available non-zero):
 * one launch for all experts. items (device array): row ranges of A / out of at most
 * fp4d_cuda_fused_grouped_tok(max_item_rows) rows each - the token tile - with their expert's
 * index into codes / scales / alpha (device arrays of num_experts entries); A is
 * [rows_total, K] of op_type, a_scratch rows_total x K 16-bit elements; splits and scratch
 * from fp4d_cuda_fused_grouped_plan (counters zero before the launch; left zero). */
int fp4d_cuda_fused_grouped_available(void);
int fp4d_cuda_fused_grouped_tok(int64_t max_item_rows);
/* Split count of a grouped launch, and the scratch it needs (zero: none). */
int32_t fp4d_cuda_fused_grouped_plan(int64_t num_items, int64_t max_item_rows, int64_t n, int64_t k, int sm_count,
                                     size_t *partial_floats, size_t *counter_count);
struct fp4d_skinny_item;
int fp4d_cuda_fused_gemm_grouped(int op_type, const void *a, int64_t rows_total, const struct fp4d_skinny_item *items,
                                 int32_t num_items, int32_t max_item_rows, const uint8_t *const *codes,
                                 const uint8_t *const *scales, const float *alpha, int layout, int64_t n, int64_t k,
                                 int out_type, void *out, int32_t splits, float *partials, uint32_t *counters,
                                 void *a_scratch, void *stream);

/* ---- wgmma GEMM on dequantized weights (sm_90a, large M) ------------------------------
 * out[m, n] = alpha * sum_k A[m, k] * W[n, k], A [M, K] and W [N, K] row-major of op_type
 * (BF16 or F16), K % 64 == 0, 16-byte aligned; splits (from fp4d_cuda_fused_splits) as for
 * the fused GEMM. Available (non-zero) only on compute capability 9.0 with the sm_90a code
 * built in and FP4DOCTOR_CUDA_WGMMA not 0; the fused GEMM then runs its wgmma kernel too. */
int fp4d_cuda_dense_wgmma_available(void);
int fp4d_cuda_dense_wgmma(int op_type, const void *a, const void *w, int64_t m, int64_t n, int64_t k, float alpha,
                          int out_type, void *out, int32_t splits, float *partials, uint32_t *counters,
                          void *stream);
/* Scratch for fp4d_cuda_dense_wgmma on the current device: the split-K scratch of `splits`,
 * or with splits == 1 what the last partial round of the persistent kernel needs to run its
 * tiles in K parts (0 when it does not). Given partials and counters of these sizes, the
 * kernel splits that round; with NULL it runs it whole. */
void fp4d_cuda_dense_wgmma_scratch(int64_t m, int64_t n, int64_t k, int32_t splits, size_t *partial_floats,
                                   size_t *counter_count);

/* ---- CUDA-core f32 GEMM (fallback for f32 activations and odd shapes) ---------------- */
int fp4d_cuda_simt_gemm(const float *a, const float *b, int64_t m, int64_t n, int64_t k,
                        float alpha, int out_type, void *out, void *stream);

/* ---- fused skinny GEMM: streams packed FP4 weights, tensor cores on up to 32 rows -------
 * One work item = up to 32 consecutive rows of A/out that share one weight matrix (one
 * expert). A plain GEMM is items over M; a grouped MoE GEMM is items over each expert's
 * rows. Requires K % 32 == 0. Items of at most 16 rows with K % 64 == 0 run the decode
 * kernel (128 weight rows per block, deep cp.async ring); others the 32-row skinny kernel. */
typedef struct fp4d_skinny_item {
    int32_t row0;    /* first row of A and out */
    int32_t rows;    /* 1..32 (skinny); up to the token tile (grouped fused GEMM) */
    int32_t expert;  /* index into the weight/alpha tables */
    int32_t pad_;
} fp4d_skinny_item;

typedef struct fp4d_skinny_args {
    /* activations: plain [rows_total, K] of a_type, or FP4 codes+scales */
    int32_t        a_type;        /* BF16, F16, NVFP4, MXFP4 */
    const void    *a;
    const uint8_t *a_scales;
    int32_t        a_layout;
    int64_t        a_rows_total;
    /* weights: one [N, K] FP4 matrix per expert */
    int32_t               b_format;   /* NVFP4 or MXFP4 */
    int32_t               b_layout;
    int32_t               b_stream_codes; /* 1: b_codes and b_scales are in the stream layout
                                             (fp4d_cuda_stream_codes / _scales), which only the
                                             weight-streaming kernel reads: a launch it does not
                                             take fails */
    const uint8_t *const *b_codes;    /* device array of num_experts device pointers */
    const uint8_t *const *b_scales;
    const float          *alpha;      /* device array, one per expert */
    int64_t               n, k;
    const fp4d_skinny_item *items;    /* device array */
    int32_t                 num_items;
    int32_t                 max_rows; /* max rows of any item (1..32): picks the kernel */
    int32_t                 out_type;
    void                   *out;      /* [rows_total, N] */
    /* split-K scratch: splits > 1 needs partials and counters from fp4d_cuda_skinny_scratch */
    int32_t  splits;
    float   *partials;
    uint32_t *counters;               /* zeroed once; the kernel leaves them zero */
    /* 1: nothing that may still run on the device writes the weights (they were made before
     * the host last waited for the device, as a server's are at load time), so the
     * weight-streaming kernel loads its first ones before it waits for the kernel before it
     * (programmatic dependent launch); 0: only after */
    int32_t  b_settled;
    /* 1: the launch has one work item (a dense GEMM), passed here by value with its expert's
     * tables, so that the weight-streaming kernel issues its first weight loads without first
     * reading items, b_codes, b_scales and alpha from device memory (two dependent round
     * trips); the device tables stay valid either way */
    int32_t               single;
    fp4d_skinny_item      single_item;
    const uint8_t        *single_codes;
    const uint8_t        *single_scales;
    float                 single_alpha;
    /* > 0: where the weight-streaming kernel runs K slices with 16-bit activations (and staging
     * them up front would take more than one batch of loads), it stages the first stage_chunk
     * phases of a warp's activations before its main loop and the rest inside it, meeting the
     * other warps of its K range once every stage_chunk phases; 0: all before the loop, as
     * blocks of eight row groups and FP4 activations always do (launch_wa sets it from
     * WA_STAGE_CHUNK; FP4DOCTOR_CUDA_WA_STAGE=upfront or =N overrides it: A/B timing, tests) */
    int32_t               stage_chunk;
} fp4d_skinny_args;

/* Scratch sizes for a launch (partials in bytes, counters in uint32 elements). */
void fp4d_cuda_skinny_scratch(int64_t n, int32_t num_items, int32_t splits, int32_t max_rows,
                              size_t *partial_bytes, size_t *counter_count);
/* Picks a split-K factor that fills the GPU (sm_count multiprocessors) for the kernel
 * that the items will run (args: everything but splits and the scratch pointers). */
int32_t fp4d_cuda_skinny_pick_splits(const fp4d_skinny_args *args, int sm_count);
/* Warps per 16-row group (1 or 2) the weight-streaming kernel runs the launch `args` with
 * (splits chosen) on a GPU of sm_count multiprocessors: 2 where the grid holds at most one
 * block per SM and every block has 16+ phases of 256 k; FP4DOCTOR_CUDA_WA_HALVES=1|2 forces
 * it. */
int fp4d_cuda_wa_warps_per_row_group(const fp4d_skinny_args *args, int sm_count);
/* Where the weight-streaming kernel runs the split launch `args` (splits chosen) on a GPU of
 * sm_count multiprocessors as K slices instead - blocks whose eight warps per 16-row group each
 * take an eighth of K, summed in shared memory - the row groups per block: 1 (M <= 2, all
 * blocks resident at once) or 2 (M = 3..8, one block per SM, at most 128 KB of activations
 * staged); else 0. FP4DOCTOR_CUDA_WA_KSLICES=0 turns it off, =1|2 takes that many row groups
 * wherever they can run. */
int fp4d_cuda_wa_kslices(const fp4d_skinny_args *args, int sm_count);
/* Row groups of 16 rows per block of the weight-streaming kernel's split grid for `args` on a
 * GPU of sm_count multiprocessors where K slices do not take it: 16 (one block per SM; the
 * planner's splits are then as many as such tiles fit on the SMs) at M >= 3 where blocks of 8
 * would be split and every block keeps 16+ phases of 256 k (8+ from M = 8), else 8.
 * FP4DOCTOR_CUDA_WA_RG=8|16 forces it (16: wherever the grid fits in one wave). */
int fp4d_cuda_wa_row_groups(const fp4d_skinny_args *args, int sm_count);
/* Blocks per thread block cluster the weight-streaming kernel would launch `args` with on the
 * current device: the splits, where they exchange their sums through the cluster's shared
 * memory (compute capability 9.0+, 2..16 splits, no more waves than plain blocks;
 * FP4DOCTOR_CUDA_WA_CLUSTER=0 turns it off), else 1 (global partials and counters). */
int32_t fp4d_cuda_wa_cluster_blocks(const fp4d_skinny_args *args);
/* Whether the weight-streaming kernel would take items of up to max_rows rows if given the
 * weight codes in the stream layout (without it the slower decode kernel runs), its size for
 * an n x k matrix (n rounded up to 16 rows), and fp4d_cuda_stream_codes, which writes it from
 * natural codes (src 4-byte and dst 16-byte aligned, k % 256 == 0, dst != src): each code
 * word re-encoded (formats/stream_codes.h) and moved into the warp chunks that the kernel
 * reads contiguously (kernels.cu, WA_STREAM_CHUNK). */
int fp4d_cuda_stream_codes_wanted(int a_type, int b_format, int64_t k, int64_t max_rows);
size_t fp4d_cuda_stream_codes_bytes(int64_t n, int64_t k);
int fp4d_cuda_stream_codes(const uint8_t *src, uint8_t *dst, int64_t n, int64_t k, void *stream);
/* The block scales the same way (any scale layout in, the kernel's per-lane order out). */
size_t fp4d_cuda_stream_scales_bytes(int64_t n, int64_t k);
int fp4d_cuda_stream_scales(const uint8_t *src, int layout, int format, uint8_t *dst, int64_t n, int64_t k,
                            void *stream);
int fp4d_cuda_skinny_gemm(const fp4d_skinny_args *args, void *stream);

/* ---- GEMV for M <= 4 (CUDA cores, f32 accumulation) -----------------------------------
 * out[m, n] = alpha * sum_k A[m, k] * B[n, k] for one weight matrix, 1 <= M <= 4, K % 32 == 0,
 * activations bf16, f16, NVFP4 or MXFP4. Each weight row is streamed once with 16-byte loads;
 * the activations are staged in shared memory as exact f32; each e2m1 x activation product
 * is exact in f32, summed in f32 per scale block, then scaled and accumulated in f32.
 * fp4d_cuda_gemv_plan fills splits/k_split/tasks_per_warp and the scratch sizes; splits > 1
 * needs partials (partial_bytes) and counters (counter_count uint32, zeroed once; the
 * kernel leaves them zero). */
typedef struct fp4d_gemv_args {
    int32_t        a_type;   /* BF16, F16, NVFP4, MXFP4 */
    const void    *a;        /* [m, k] */
    const uint8_t *a_scales;
    int32_t        a_layout;
    int32_t        m;        /* 1..4 */
    int32_t        b_format; /* NVFP4 or MXFP4 */
    int32_t        b_layout;
    const uint8_t *b_codes;  /* [n, k/2] */
    const uint8_t *b_scales;
    float          alpha;
    int64_t        n, k;
    int32_t        out_type;
    void          *out;      /* [m, n] */
    /* plan */
    int32_t   splits, tasks_per_warp;
    int64_t   k_split;
    float    *partials;
    uint32_t *counters;
} fp4d_gemv_args;

/* Non-zero when the GEMV kernel takes this problem (FP4DOCTOR_CUDA_GEMV_MAX_M=N limits it to
 * M <= N; 0 turns it off). */
int fp4d_cuda_gemv_applies(int a_type, int b_format, int64_t m, int64_t k);
int fp4d_cuda_gemv_plan(fp4d_gemv_args *args, int sm_count, size_t *partial_bytes, size_t *counter_count);
int fp4d_cuda_gemv(const fp4d_gemv_args *args, void *stream);

/* ---- quantize (flashinfer-exact NVFP4, spec §4.2) ----------------------------------
 * amax: the tensor's max |x| ignoring NaN (fp4d_cuda_amax). encode_scale is gs. */
int fp4d_cuda_amax(int src_type, const void *src, size_t count, float *dev_amax, void *stream);
int fp4d_cuda_quantize_nvfp4(int src_type, const void *src, int64_t rows, int64_t cols, float encode_scale,
                             int layout, uint8_t *codes, uint8_t *scales, void *stream);

/* Reads `bytes` (a multiple of 16, 16-byte aligned) once and discards them: the floor of any
 * kernel that streams that many bytes (fp4doctor bench). `sink` is a device word it may write.
 * dependent: the reads wait for the previous kernel in the stream to complete (as a GEMM's
 * must); otherwise, under programmatic dependent launch, they overlap its drain. */
int fp4d_cuda_read_stream(const void *src, size_t bytes, int dependent, uint32_t *sink, int sm_count, void *stream);

/* Self-check of the quantize kernels' e2m1 rounding: every f32 pattern x, as FMUL(x, s),
 * through the fast rounding and the comparison chain on the device; *mismatches counts the
 * codes that differ, *first_bad is the smallest such x (0xFFFFFFFF when none). */
int fp4d_cuda_e2m1_sweep(float s, uint64_t *mismatches, uint32_t *first_bad);

/* Which architecture the kernels were compiled for on this device (cudaFuncAttributes):
 * binary_version is e.g. 90 when sm_90a SASS runs; returns the CUDA error otherwise
 * (cudaErrorNoKernelImageForDevice when no code matches). */
int fp4d_cuda_kernel_binary_version(int device, int *binary_version, int *ptx_version);

/* Non-zero when the small-M kernels (stream, GEMV, register-decode wgmma) are launched with
 * programmatic dependent launch on the current device: compute capability 9.0+ code and
 * FP4DOCTOR_CUDA_PDL not 0. */
int fp4d_cuda_pdl_active(void);

#ifdef __cplusplus
}
#endif
#endif
