/*
 * kernels.cu - the `cuda` backend's own kernels (and the dequantize kernel that
 * cublas-bf16 shares). Entry points and conventions: kernels.h.
 *
 * Numerics. An e2m1 value times an e4m3 or ue8m0 block scale is exact in f32, and for
 * NVFP4 also in bf16 and fp16 (at most 5 significant bits, magnitudes 2^-10 .. 2688), so
 * dequantizing into the tensor-core input type loses nothing; products are accumulated in
 * f32 by mma.sync or wgmma and rounded once into the output type after alpha. This file must be
 * compiled WITHOUT --use_fast_math: the quantize kernel relies on IEEE division and on
 * subnormals not being flushed (spec §4.2).
 *
 * Kernels:
 *  - dequantize / convert: element-wise, memory-bound.
 *  - skinny GEMM (M <= 32 per work item): each lane streams 16 bytes of packed weights
 *    (32 e2m1 codes of one weight row) per step and feeds them to m16n8k16 tensor-core
 *    MMAs without going through shared memory. Because a dot product does not care in
 *    which order k is summed, the k index inside a 128-element chunk is permuted so that
 *    each lane's registers already hold its MMA fragment; activations are loaded in the
 *    same permuted order. Also the grouped MoE GEMM (work items over experts).
 *  - GEMV (M <= 4, one weight matrix): CUDA cores, weights streamed with 16-byte loads,
 *    activations staged in shared memory as exact f32, e2m1 decoded by byte permutes, f32
 *    products and sums (see the section's comment).
 *  - weight-streaming decode kernel (items of <= 16 rows, K % 256 == 0: decode and small
 *    MoE): weights as the MMA A operand streamed into a register ring, activations staged
 *    once per block in B-fragment order (see the section's comment).
 *  - wgmma GEMMs (sm_90a, M >= 32): below the dense route, packed weights decoded straight
 *    into the register A operand (activations k-permuted once per call, TMA ring) - or, as
 *    an A/B switch, dequantized per k tile into swizzled shared memory; from the dense route
 *    on, dense weights fed by TMA from a producer warp (persistent). Split-K reduced in the
 *    kernels by the last split of a tile.
 *  - read floor: a kernel that only streams bytes, the floor `fp4doctor bench` reports.
 *  - fused GEMM (large M, NVFP4 weights, K % 64 == 0): 128x128x64 tiles, 4-stage cp.async
 *    ring of bf16/f16 activations + packed codes + scales, weights dequantized in registers
 *    right before bf16/f16 mma.sync (see the section's comment).
 *  - tiled GEMM (large M fallback): 128x128x32 tiles, 3-stage cp.async pipeline, ldmatrix,
 *    bf16 or f16 mma.sync; weights are dequantized into a dense buffer first.
 *  - simt GEMM: f32 CUDA-core fallback (f32 activations, MXFP4 with f16 activations).
 *  - quantize: flashinfer-exact NVFP4 (spec §4.2), bit-identical to fp4d_quantize; a
 *    device self-check of its e2m1 rounding over all 2^32 f32 patterns (a GPU test).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda.h> /* CUtensorMap (types only: the encoder comes from the runtime's driver entry point) */
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <float.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "env_knob.h"
#include "formats/stream_codes.h"

#include "kernels.h"

#if defined(__CUDACC__) && defined(__FAST_MATH__)
#error "kernels.cu must not be compiled with --use_fast_math (quantize needs IEEE division, no FTZ)"
#endif

namespace {

/* ---------------------------------------------------------------------------------------
 * Scalar decoding and scale addressing (same rules as src/formats, spec §2, §3, §6)
 * ------------------------------------------------------------------------------------- */

__device__ __forceinline__ float nan_f32() { return __int_as_float(0x7fc00000); }

/* ue4m3 block scale: bit 7 set or 0x7F is NaN (formats.h). */
__device__ __forceinline__ float ue4m3_to_f32(uint32_t b)
{
    if ((b & 0x80u) || b == 0x7Fu) return nan_f32();
    const uint32_t e = b >> 3, m = b & 7u;
    if (e == 0) return (float)m * 0x1p-9f;
    return __int_as_float((int)(((e + 120u) << 23) | (m << 20)));
}

/* ue8m0: 2^(b-127), 0 is 2^-127 (an f32 subnormal), 0xFF is NaN. */
__device__ __forceinline__ float ue8m0_to_f32(uint32_t b)
{
    if (b == 0xFFu) return nan_f32();
    if (b == 0) return __int_as_float(0x00400000);
    return __int_as_float((int)(b << 23));
}

__device__ __forceinline__ float scale_to_f32(bool nvfp4, uint32_t b)
{
    return nvfp4 ? ue4m3_to_f32(b) : ue8m0_to_f32(b);
}

/* e2m1 -> f32 without a table: the 3 magnitude bits placed at the top of the f32
 * exponent/mantissa give value * 2^-126 (code 1 lands on a subnormal), and the sign bit
 * moves to bit 31; the multiply by 2^126 is exact (no fast-math, no FTZ). */
__device__ __forceinline__ float e2m1_to_f32(uint32_t code)
{
    const uint32_t bits = ((code & 7u) << 22) | ((code & 8u) << 28);
    return __int_as_float((int)bits) * 0x1p126f;
}

/* Byte offset of logical scale (r, c) of a [rows, C] scale matrix (spec §6). */
__device__ __forceinline__ int64_t scale_offset(int layout, int64_t C, int64_t r, int64_t c)
{
    if (layout == FP4D_LAYOUT_LINEAR) return r * C + c;
    const int64_t Cp = (C + 3) & ~(int64_t)3;
    if (layout == FP4D_LAYOUT_SWIZZLED_128X4)
        return (r >> 7) * (128 * Cp) + (c >> 2) * 512 + (r & 31) * 16 + ((r >> 5) & 3) * 4 + (c & 3);
    return (r >> 3) * (8 * Cp) + (c >> 2) * 32 + (r & 7) * 4 + (c & 3); /* 8x4 */
}

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }

__device__ __forceinline__ void store_out(int out_type, void *out, int64_t idx, float v)
{
    if (out_type == FP4D_DTYPE_F32) ((float *)out)[idx] = v;
    else if (out_type == FP4D_DTYPE_BF16) ((__nv_bfloat16 *)out)[idx] = __float2bfloat16_rn(v);
    else ((__half *)out)[idx] = __float2half_rn(v);
}

__device__ __forceinline__ float load_plain(int type, const void *src, size_t i)
{
    if (type == FP4D_DTYPE_F32) return ((const float *)src)[i];
    if (type == FP4D_DTYPE_BF16) return __bfloat162float(((const __nv_bfloat16 *)src)[i]);
    return __half2float(((const __half *)src)[i]);
}

/* ---------------------------------------------------------------------------------------
 * Dequantize and convert
 * ------------------------------------------------------------------------------------- */

/* One thread per 16 elements (8 code bytes, one NVFP4 block or half an MXFP4 block). */
template <typename T>
__global__ void dequantize_kernel(fp4d_dev_fp4 src, T *dst)
{
    const int64_t groups_per_row = src.cols / 16;
    const int64_t total = src.rows * groups_per_row;
    const bool nvfp4 = src.format == FP4D_DTYPE_NVFP4;
    const int64_t C = src.cols / (nvfp4 ? 16 : 32);
    for (int64_t gi = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; gi < total;
         gi += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = gi / groups_per_row, g = gi % groups_per_row;
        const uint2 w = *(const uint2 *)(src.codes + r * (src.cols / 2) + g * 8);
        const int64_t c = nvfp4 ? g : g / 2;
        const float s = scale_to_f32(nvfp4, src.scales[scale_offset(src.layout, C, r, c)]);
        /* built in registers, then stored as 16-byte vectors (the group's 32 or 64 output
         * bytes are 32-byte aligned: cols % 16 == 0); element-wise 2-byte stores made this
         * pass ~10x slower than its memory traffic */
        __align__(16) T vals[16];
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const uint32_t word = i < 8 ? w.x : w.y;
            const uint32_t code = (word >> (4 * (i & 7))) & 0xFu;
            vals[i] = from_f32<T>(e2m1_to_f32(code) * s);
        }
        uint4 *d = (uint4 *)(dst + r * src.cols + g * 16);
#pragma unroll
        for (int q = 0; q < (int)sizeof(vals) / 16; q++) d[q] = ((const uint4 *)vals)[q];
    }
}

template <typename T>
__global__ void convert_kernel(int src_type, const void *src, T *dst, size_t count)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = from_f32<T>(load_plain(src_type, src, i));
}

__global__ void scale_convert_kernel(const float *src, float alpha, int dst_type, void *dst, size_t count)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
        store_out(dst_type, dst, (int64_t)i, alpha * src[i]);
}

__global__ void fill_random_kernel(uint8_t *p, size_t bytes, uint32_t seed)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < bytes; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 0x9E3779B1u ^ seed;
        h ^= h >> 15; h *= 0x85EBCA77u; h ^= h >> 13; h *= 0xC2B2AE3Du; h ^= h >> 16;
        p[i] = (uint8_t)h;
    }
}

__global__ void probe_kernel(int *p) { if (p) *p = 1; }

/* 1 in the image compiled with sm_90a's features (wgmma), 0 in every other. The loaded image
 * is not told apart by cudaFuncGetAttributes: compute_90 PTX JIT-compiled on a 9.0 GPU
 * (CUDA_FORCE_PTX_JIT=1, or a build without 90a-real) also reports binaryVersion 90, and its
 * wgmma kernels only trap. */
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ const int image_has_wgmma = 1;
#else
__device__ const int image_has_wgmma = 0;
#endif

/* Whether a __device__ int of the loaded image is 1 on the current device. Read on a stream
 * of its own that does not wait for the legacy default stream: cudaMemcpyFromSymbol runs on
 * that stream, so the first GEMM of a process would have waited for whatever the caller had
 * queued on its blocking streams. */
static bool image_constant_is_one(const int &symbol)
{
    cudaStream_t s = nullptr;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return false;
    int value = 0;
    const bool read = cudaMemcpyFromSymbolAsync(&value, symbol, sizeof value, 0, cudaMemcpyDeviceToHost, s) == cudaSuccess &&
                      cudaStreamSynchronize(s) == cudaSuccess;
    cudaStreamDestroy(s);
    return read && value == 1;
}

/* fp4d_cuda_hold_stream: one thread polls the global timer (ns) until `ns` have passed, asleep
 * between reads so that it takes next to no issue slots of its SM */
__global__ void hold_kernel(unsigned long long ns)
{
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t0));
    do {
        __nanosleep(500);
        asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
    } while (t - t0 < ns);
}

/* ---------------------------------------------------------------------------------------
 * Tensor-core helpers
 * ------------------------------------------------------------------------------------- */

template <bool F16>
__device__ __forceinline__ void mma_16816(float c[4], const uint32_t a[4], const uint32_t b[2])
{
    if (F16)
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint4 load_stream_16(const void *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

/*
 * Programmatic dependent launch (sm_90 and newer). A kernel launched with the attribute (see
 * launch_pdl) may start while the kernel before it in the stream is still running, once that
 * kernel's blocks have all called pdl_trigger() (or exited). Before pdl_wait() returns - when
 * the previous grid has completed and its writes are visible - such a kernel must not read
 * anything that grid may have written (activations, split-K scratch and counters, even the
 * weights: a quantize kernel may just have made them) nor write global memory. What it does
 * instead is set up shared memory and prefetch its first weights into L2: the L2 is where
 * every SM's writes land, so a line prefetched there is never older than a write that reached
 * it, and the loads after pdl_wait() see the newest data. The decode kernels thus start
 * streaming while the previous kernel drains. Without the attribute, or below sm_90, both calls
 * are no-ops.
 */
__device__ __forceinline__ void pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
/* the L2 line holding p (a hint: no fault, no data returned) */
__device__ __forceinline__ void prefetch_l2(const void *p) { asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p)); }

__device__ __forceinline__ uint32_t bf16x2_bits(__nv_bfloat162 v) { return *reinterpret_cast<uint32_t *>(&v); }
__device__ __forceinline__ __nv_bfloat162 bits_bf16x2(uint32_t v) { return *reinterpret_cast<__nv_bfloat162 *>(&v); }
__device__ __forceinline__ uint32_t half2_bits(__half2 v) { return *reinterpret_cast<uint32_t *>(&v); }
__device__ __forceinline__ __half2 bits_half2(uint32_t v) { return *reinterpret_cast<__half2 *>(&v); }

/*
 * Decodes two e2m1 codes of a 32-bit word of 8 packed codes - nibbles i and i+4 - into a
 * bf16x2 (F16 = false) or half2 pair, multiplied by a scale pair. The magnitude bits go
 * straight into the exponent/mantissa field, which yields the value times 2^-126 (bf16)
 * or 2^-14 (f16) with code 1 landing exactly on a subnormal; one multiply by the power of
 * two and one by the block scale (both exact) finish it. Pairing nibble i with i+4 needs
 * one shift per pair; the activations are permuted the same way.
 */
template <bool F16>
__device__ __forceinline__ uint32_t e2m1_pair(uint32_t w, int i, uint32_t scale2)
{
    const int mag_shift = F16 ? 9 - 4 * i : 6 - 4 * i;
    const uint32_t mag_mask = F16 ? 0x0E000E00u : 0x01C001C0u;
    const uint32_t mag = (mag_shift >= 0 ? (w << mag_shift) : (w >> -mag_shift)) & mag_mask;
    const uint32_t sign = (w << (12 - 4 * i)) & 0x80008000u;
    const uint32_t bits = mag | sign;
    if (F16) {
        const __half2 pow2 = __halves2half2(__float2half_rn(16384.0f), __float2half_rn(16384.0f));
        return half2_bits(__hmul2(__hmul2(bits_half2(bits), pow2), bits_half2(scale2)));
    } else {
        const __nv_bfloat162 pow2 = __floats2bfloat162_rn(0x1p126f, 0x1p126f);
        return bf16x2_bits(__hmul2(__hmul2(bits_bf16x2(bits), pow2), bits_bf16x2(scale2)));
    }
}

template <bool F16> __device__ __forceinline__ uint32_t scale_pair(float s)
{
    if (F16) return half2_bits(__float2half2_rn(s));
    return bf16x2_bits(__float2bfloat162_rn(s));
}

/* e2m1_pair without the power-of-two multiply: returns value * scale2 * 2^-126 (bf16) or
 * * 2^-14 (f16); the caller folds the power of two into scale2 (see the fused kernel). */
template <bool F16>
__device__ __forceinline__ uint32_t e2m1_pair_folded(uint32_t w, int i, uint32_t scale2)
{
    const int mag_shift = F16 ? 9 - 4 * i : 6 - 4 * i;
    const uint32_t mag_mask = F16 ? 0x0E000E00u : 0x01C001C0u;
    const uint32_t mag = (mag_shift >= 0 ? (w << mag_shift) : (w >> -mag_shift)) & mag_mask;
    const uint32_t bits = mag | ((w << (12 - 4 * i)) & 0x80008000u);
    if (F16) return half2_bits(__hmul2(bits_half2(bits), bits_half2(scale2)));
    return bf16x2_bits(__hmul2(bits_bf16x2(bits), bits_bf16x2(scale2)));
}

/* ---------------------------------------------------------------------------------------
 * Skinny GEMM: up to 32 rows per work item, weights streamed once
 * ------------------------------------------------------------------------------------- */

constexpr int SK_WARPS = 4;   /* warps per block; they split the K chunks */
constexpr int SK_NT    = 4;   /* n8 tiles per block: 32 output columns */
constexpr int SK_BN    = 8 * SK_NT;
constexpr int SK_CHUNK = 128; /* k elements per warp step: 4 lanes x 32 */

/* A kinds of the skinny kernel */
enum { AK_BF16 = 0, AK_F16 = 1, AK_FP4 = 2 };

/* A 16-byte unit of eight 16-bit activations k0..k7 as the pairs (k_i, k_{i+4}), i = 0..3:
 * the k order in which the FP4 decode pairs nibbles i and i+4 of a code word (e2m1_pair). */
__device__ __forceinline__ void act_pairs_i_i4(uint4 v, uint32_t out[4])
{
    out[0] = __byte_perm(v.x, v.z, 0x5410);
    out[1] = __byte_perm(v.x, v.z, 0x7632);
    out[2] = __byte_perm(v.y, v.w, 0x5410);
    out[3] = __byte_perm(v.y, v.w, 0x7632);
}

/* Loads the 16 activation pairs (pair p = 4q + i holds elements 8q+i and 8q+i+4 of the
 * lane's 32) of one row; zero for rows outside the item. */
template <int AK>
__device__ __forceinline__ void load_a_pairs(const fp4d_skinny_args &p, int64_t row, bool valid, int64_t kel,
                                             uint32_t out[16])
{
    if (!valid) {
#pragma unroll
        for (int x = 0; x < 16; x++) out[x] = 0;
        return;
    }
    if (AK == AK_FP4) {
        const bool nv = p.a_type == FP4D_DTYPE_NVFP4;
        const uint4 raw = *(const uint4 *)((const uint8_t *)p.a + row * (p.k / 2) + kel / 2);
        const int64_t C = p.k / (nv ? 16 : 32);
        uint32_t s2[2];
        if (nv) {
            s2[0] = scale_pair<false>(ue4m3_to_f32(p.a_scales[scale_offset(p.a_layout, C, row, kel / 16)]));
            s2[1] = scale_pair<false>(ue4m3_to_f32(p.a_scales[scale_offset(p.a_layout, C, row, kel / 16 + 1)]));
        } else {
            s2[0] = s2[1] = scale_pair<false>(ue8m0_to_f32(p.a_scales[scale_offset(p.a_layout, C, row, kel / 32)]));
        }
        const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int q = 0; q < 4; q++)
#pragma unroll
            for (int i = 0; i < 4; i++) out[4 * q + i] = e2m1_pair<false>(w[q], i, s2[q >> 1]);
    } else {
        const uint4 *src = (const uint4 *)((const uint16_t *)p.a + row * p.k + kel);
#pragma unroll
        for (int q = 0; q < 4; q++) {
            act_pairs_i_i4(__ldg(src + q), out + 4 * q);
        }
    }
}

__device__ __forceinline__ void cp_async_16(uint32_t smem, const void *gmem, bool valid)
{
    const int n = valid ? 16 : 0; /* 0 bytes read: the 16 smem bytes are zero-filled */
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

constexpr int SK_STAGES = 4; /* cp.async ring depth of the ASYNC variant */

__device__ __forceinline__ void cp_async_4(uint32_t smem, const void *gmem, bool valid)
{
    const int n = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem), "l"(gmem), "r"(n));
}

/*
 * ASYNC = false: the next chunk's weights are prefetched into registers (one chunk in
 * flight per warp). ASYNC = true: a cp.async ring of SK_STAGES chunks per warp in shared
 * memory keeps three chunks in flight without spending registers on them; each lane reads
 * back only the 16 bytes it copied, so no barrier is needed inside the loop. Scales travel
 * as the aligned 4-byte word that holds them (scale buffers are allocated in 256-byte
 * multiples, so the word never leaves the allocation).
 */
template <int MT, int AK, bool ASYNC>
__global__ void __launch_bounds__(SK_WARPS * 32) skinny_kernel(const fp4d_skinny_args p)
{
    constexpr bool F16 = AK == AK_F16;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, j = lane & 3;
    const fp4d_skinny_item it = p.items[blockIdx.z];
    const int64_t n0 = (int64_t)blockIdx.x * SK_BN;
    const uint8_t *bcodes = p.b_codes[it.expert];
    const uint8_t *bscales = p.b_scales[it.expert];
    const bool bnv = p.b_format == FP4D_DTYPE_NVFP4;
    const int64_t bC = p.k / (bnv ? 16 : 32);
    const int64_t chunks = (p.k + SK_CHUNK - 1) / SK_CHUNK;
    const int64_t stride = (int64_t)p.splits * SK_WARPS;

    float acc[MT][SK_NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int t = 0; t < SK_NT; t++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mt][t][e] = 0.0f;

    /* weight rows of this lane: n0 + t*8 + g */
    uint4 raw[SK_NT];
    uint32_t sraw[SK_NT];
    auto load_b = [&](int64_t c, uint4 *r, uint32_t *s) {
        const int64_t kel = c * SK_CHUNK + 32 * j;
#pragma unroll
        for (int t = 0; t < SK_NT; t++) {
            const int64_t n = n0 + t * 8 + g;
            if (c < chunks && kel < p.k && n < p.n) {
                r[t] = load_stream_16(bcodes + n * (p.k / 2) + kel / 2);
                if (bnv) {
                    const int64_t off = scale_offset(p.b_layout, bC, n, kel / 16);
                    s[t] = (uint32_t)bscales[off] | ((uint32_t)bscales[off + 1] << 8);
                } else {
                    s[t] = bscales[scale_offset(p.b_layout, bC, n, kel / 32)];
                }
            } else {
                r[t] = make_uint4(0, 0, 0, 0);
                s[t] = 0;
            }
        }
    };

    auto compute = [&](int64_t c) {
        const int64_t kel = c * SK_CHUNK + 32 * j;
        const bool kvalid = kel < p.k;
        uint32_t a[MT][2][16];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = mt * 16 + h * 8 + g;
                load_a_pairs<AK>(p, (int64_t)it.row0 + r, kvalid && r < it.rows, kel, a[mt][h]);
            }

#pragma unroll
        for (int t = 0; t < SK_NT; t++) {
            uint32_t s2[2];
            if (bnv) {
                s2[0] = scale_pair<F16>(ue4m3_to_f32(sraw[t] & 0xFFu));
                s2[1] = scale_pair<F16>(ue4m3_to_f32(sraw[t] >> 8));
            } else {
                s2[0] = s2[1] = scale_pair<F16>(ue8m0_to_f32(sraw[t]));
            }
            const uint32_t w[4] = {raw[t].x, raw[t].y, raw[t].z, raw[t].w};
#pragma unroll
            for (int s = 0; s < 8; s++) {
                /* step s uses pairs 2s and 2s+1: word s/2, nibble pairs (2s)%4 and (2s+1)%4 */
                const int q = s >> 1, i0 = (2 * s) & 3;
                uint32_t b[2];
                b[0] = e2m1_pair<F16>(w[q], i0, s2[q >> 1]);
                b[1] = e2m1_pair<F16>(w[q], i0 + 1, s2[q >> 1]);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    const uint32_t af[4] = {a[mt][0][2 * s], a[mt][1][2 * s], a[mt][0][2 * s + 1], a[mt][1][2 * s + 1]};
                    mma_16816<F16>(acc[mt][t], af, b);
                }
            }
        }
    };

    int64_t c = (int64_t)blockIdx.y * SK_WARPS + warp;
    constexpr int RING = ASYNC ? SK_STAGES : 1;
    __shared__ __align__(16) uint4 ring_codes[RING][SK_WARPS][SK_NT][32];
    __shared__ uint32_t ring_scales[RING][SK_WARPS][SK_NT][32];
    if constexpr (ASYNC) {
        auto scale_off = [&](int64_t cc, int t) -> int64_t {
            const int64_t kel = cc * SK_CHUNK + 32 * j, n = n0 + t * 8 + g;
            return bnv ? scale_offset(p.b_layout, bC, n, kel / 16) : scale_offset(p.b_layout, bC, n, kel / 32);
        };
        auto issue = [&](int64_t cc, int stage) {
            const int64_t kel = cc * SK_CHUNK + 32 * j;
#pragma unroll
            for (int t = 0; t < SK_NT; t++) {
                const int64_t n = n0 + t * 8 + g;
                const bool v = cc < chunks && kel < p.k && n < p.n;
                cp_async_16((uint32_t)__cvta_generic_to_shared(&ring_codes[stage][warp][t][lane]),
                            v ? (const void *)(bcodes + n * (p.k / 2) + kel / 2) : (const void *)bcodes, v);
                const int64_t off = v ? scale_off(cc, t) : 0;
                cp_async_4((uint32_t)__cvta_generic_to_shared(&ring_scales[stage][warp][t][lane]),
                           bscales + (off & ~(int64_t)3), v);
            }
        };
#pragma unroll
        for (int st = 0; st < SK_STAGES - 1; st++) {
            issue(c + st * stride, st);
            cp_async_commit();
        }
        int stage = 0;
        for (; c < chunks; c += stride) {
            cp_async_wait<SK_STAGES - 2>();
            issue(c + (SK_STAGES - 1) * stride, (stage + SK_STAGES - 1) % SK_STAGES);
            cp_async_commit();
#pragma unroll
            for (int t = 0; t < SK_NT; t++) {
                raw[t] = ring_codes[stage][warp][t][lane];
                const uint32_t word = ring_scales[stage][warp][t][lane];
                const int64_t n = n0 + t * 8 + g;
                const int sh = n < p.n ? (int)(scale_off(c, t) & 3) * 8 : 0;
                sraw[t] = (word >> sh) & (bnv ? 0xFFFFu : 0xFFu);
            }
            compute(c);
            stage = (stage + 1) % SK_STAGES;
        }
        cp_async_wait<0>();
    } else {
        load_b(c, raw, sraw);
        for (; c < chunks; c += stride) {
            uint4 nraw[SK_NT];
            uint32_t nsraw[SK_NT];
            load_b(c + stride, nraw, nsraw);
            compute(c);
#pragma unroll
            for (int t = 0; t < SK_NT; t++) {
                raw[t] = nraw[t];
                sraw[t] = nsraw[t];
            }
        }
    }

    /* reduce the warps' partial sums (fixed order: deterministic) */
    constexpr int SLOTS = MT * SK_NT * 4;
    static_assert(sizeof(ring_codes) >= sizeof(float) * (SK_WARPS - 1) * SLOTS * 32 || !ASYNC, "ring too small");
    __shared__ float red_own[ASYNC ? 1 : SK_WARPS - 1][ASYNC ? 1 : SLOTS][32];
    float (*red)[SLOTS][32] = ASYNC ? reinterpret_cast<float (*)[SLOTS][32]>(&ring_codes[0][0][0][0])
                                    : reinterpret_cast<float (*)[SLOTS][32]>(&red_own[0][0][0]);
    if (ASYNC) __syncthreads(); /* every warp is done reading the ring */
    if (warp > 0) {
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int t = 0; t < SK_NT; t++)
#pragma unroll
                for (int e = 0; e < 4; e++) red[warp - 1][(mt * SK_NT + t) * 4 + e][lane] = acc[mt][t][e];
    }
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (int w = 0; w < SK_WARPS - 1; w++)
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int t = 0; t < SK_NT; t++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[mt][t][e] += red[w][(mt * SK_NT + t) * 4 + e][lane];

    if (p.splits > 1) {
        /* split-K: publish this split's sums; the last block to arrive adds all splits in
         * split order and writes the output, then re-arms the counter. */
        const int64_t tile = (int64_t)blockIdx.z * gridDim.x + blockIdx.x;
        float *base = p.partials + tile * (int64_t)p.splits * SLOTS * 32;
        float *mine = base + (int64_t)blockIdx.y * SLOTS * 32;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int t = 0; t < SK_NT; t++)
#pragma unroll
                for (int e = 0; e < 4; e++) __stcg(mine + ((mt * SK_NT + t) * 4 + e) * 32 + lane, acc[mt][t][e]);
        __threadfence();
        uint32_t prev = 0;
        if (lane == 0) prev = atomicAdd(p.counters + tile, 1u);
        prev = __shfl_sync(0xffffffffu, prev, 0);
        if (prev != (uint32_t)p.splits - 1) return;
        __threadfence();
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int t = 0; t < SK_NT; t++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float sum = 0.0f;
                    for (int s = 0; s < p.splits; s++)
                        sum += __ldcg(base + (int64_t)s * SLOTS * 32 + ((mt * SK_NT + t) * 4 + e) * 32 + lane);
                    acc[mt][t][e] = sum;
                }
        if (lane == 0) p.counters[tile] = 0;
    }

    const float alpha = p.alpha[it.expert];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int t = 0; t < SK_NT; t++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = mt * 16 + g + (e >= 2 ? 8 : 0);
                const int64_t col = n0 + t * 8 + 2 * j + (e & 1);
                if (r < it.rows && col < p.n)
                    store_out(p.out_type, p.out, ((int64_t)it.row0 + r) * p.n + col, alpha * acc[mt][t][e]);
            }
}

/* ---------------------------------------------------------------------------------------
 * Decode GEMM: work items of up to 16 rows, K % 64 == 0 (the memory-bound decode shapes
 * and the grouped MoE GEMM at small token counts)
 *
 * Why a second kernel beside skinny_kernel: at M <= 16 the whole cost is streaming the
 * packed weights, so everything here is arranged around keeping many bytes in flight and
 * spending few instructions per byte:
 *  - each block owns 128 weight rows (4 warps x 4 n8 tiles) and one contiguous K range
 *    (split-K across blocks, fixed-order reduction by the last block to arrive); a warp
 *    step covers 256 k: lane (g, j) copies 32 contiguous bytes (64 codes) of row g of each
 *    tile, so the 4 lanes of a row read 128 contiguous bytes, plus the one aligned 4-byte
 *    word holding those 64 codes' four NVFP4 scales (two MXFP4 scales);
 *  - a per-warp cp.async ring of DK_STAGES steps (no registers spent on bytes in flight,
 *    no barrier: each lane reads back only what it copied);
 *  - NVFP4 scales are folded into one multiply per code pair: the e2m1 magnitude bits
 *    placed in a bf16 (f16) give value * 2^-126 (2^-14) exactly, and the block scale is
 *    pre-multiplied by 2^119 (2^7), so the product is value * scale * 2^-7, exact (at
 *    least 2^-17, a normal number); the 2^7 goes back in f32 after accumulation, which
 *    commutes exactly with f32 rounding. MXFP4 scales (powers of two up to 2^127) keep the
 *    two-multiply decode of skinny_kernel.
 * The k order inside a lane's 64 codes is permuted exactly as in skinny_kernel (pairs of
 * nibbles i and i+4 of one word), activations loaded in the same order.
 * ------------------------------------------------------------------------------------- */

constexpr int DK_WARPS = 4, DK_NT = 4, DK_STAGES = 4;
constexpr int DK_BN = DK_WARPS * DK_NT * 8; /* weight rows per block */
constexpr int DK_STEP = 256;                /* k per warp step */
constexpr int DK_SLOTS = DK_WARPS * DK_NT * 4 * 32; /* partial-sum floats per block */

struct dk_stage {
    uint4    codes[DK_NT][2][32];
    uint32_t scales[DK_NT][32];
};
constexpr size_t DK_SMEM = sizeof(dk_stage) * DK_STAGES * DK_WARPS;

/* Raw bits of nibbles i and i+4 of w as a bf16x2 (value * 2^-126) or half2 (value * 2^-14). */
template <bool F16>
__device__ __forceinline__ uint32_t e2m1_pair_raw(uint32_t w, int i)
{
    const int mag_shift = F16 ? 9 - 4 * i : 6 - 4 * i;
    const uint32_t mag_mask = F16 ? 0x0E000E00u : 0x01C001C0u;
    const uint32_t mag = (mag_shift >= 0 ? (w << mag_shift) : (w >> -mag_shift)) & mag_mask;
    const uint32_t sign = (w << (12 - 4 * i)) & 0x80008000u;
    return mag | sign;
}

/* The same pair (bf16x2) from a word in the stream layout (formats/stream_codes.h, whose
 * fp4d_stream_decode_pair is this function's host twin): four shifts and four LOP3s per word
 * of four pairs, instead of two shifts and two or three logic operations per pair. The left
 * shifts go to the FMA pipe (IMAD.SHL), the right shift and the rotation to the ALU. The
 * first stream layout took five shifts per word (four left, one right); against it, on an
 * H200 (two rounds, W4A16): 14336x4096 M = 1 11.68-11.72 -> 11.08-11.42 us, M = 8
 * 12.83-12.99 -> 12.32-12.62, 7168x18432 M = 1 21.81-21.85 -> 21.32-21.40, but 14336x4096 at
 * M = 16 16.44-16.53 -> 16.79-17.00. Shifting right by IMAD.HI (a multiplier the compiler
 * cannot see) to spare the ALU was slower everywhere (M = 1 12.07-12.12). */
__device__ __forceinline__ uint32_t e2m1_pair_stream(uint32_t w, int i)
{
    const uint32_t x = i == 0 ? w : i == 1 ? w << 6 : i == 2 ? __funnelshift_l(w, w, 12) : (w << 2) ^ (w >> 6);
    return x & FP4D_STREAM_PAIR_MASK;
}

template <bool F16> __device__ __forceinline__ uint32_t mul2(uint32_t x, uint32_t y)
{
    if (F16) return half2_bits(__hmul2(bits_half2(x), bits_half2(y)));
    return bf16x2_bits(__hmul2(bits_bf16x2(x), bits_bf16x2(y)));
}

/* Four ue4m3 scales (one per byte) as folded pairs: bf16x2 of s * 2^119 (F16: half2 of
 * s * 2^7). ue4m3 bytes with bit 7 set are NaN (formats.h): they become 0xFF, NaN in e4m3. */
template <bool F16>
__device__ __forceinline__ void nv_scales_folded(uint32_t sw, uint32_t out[4])
{
    const uint32_t m = sw & 0x80808080u;
    sw |= m - (m >> 7);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)((sw >> (16 * h)) & 0xFFFFu), __NV_E4M3);
        const __half2 s2 = *reinterpret_cast<const __half2 *>(&raw);
        if (F16) {
            const __half2 f = __hmul2(s2, __float2half2_rn(128.0f));
            out[2 * h] = half2_bits(__lows2half2(f, f));
            out[2 * h + 1] = half2_bits(__highs2half2(f, f));
        } else {
            const float2 f = __half22float2(s2);
            out[2 * h] = bf16x2_bits(__floats2bfloat162_rn(f.x * 0x1p119f, f.x * 0x1p119f));
            out[2 * h + 1] = bf16x2_bits(__floats2bfloat162_rn(f.y * 0x1p119f, f.y * 0x1p119f));
        }
    }
}

/* A ue8m0 byte as a bf16x2 pair of 2^(b-127), exact (0 is the bf16 subnormal 2^-127). */
__device__ __forceinline__ uint32_t mx_scale_pair(uint32_t b)
{
    const uint32_t h = b == 0xFFu ? 0x7FC0u : b == 0 ? 0x0040u : (b << 7);
    return h | (h << 16);
}

/* Column part of a scale offset (spec §6) for logical column c. */
__device__ __forceinline__ int64_t scale_col_off(int layout, int64_t c)
{
    if (layout == FP4D_LAYOUT_LINEAR) return c;
    return (c >> 2) * (layout == FP4D_LAYOUT_SWIZZLED_128X4 ? 512 : 32) + (c & 3);
}
/* Row part of a scale offset (C logical scale columns). */
__device__ __forceinline__ int64_t scale_row_off(int layout, int64_t C, int64_t r)
{
    if (layout == FP4D_LAYOUT_LINEAR) return r * C;
    const int64_t Cp = (C + 3) & ~(int64_t)3;
    if (layout == FP4D_LAYOUT_SWIZZLED_128X4) return (r >> 7) * (128 * Cp) + (r & 31) * 16 + ((r >> 5) & 3) * 4;
    return (r >> 3) * (8 * Cp) + (r & 7) * 4;
}

/*
 * The 64 activations of one row at k0 .. k0+63 as 32 bf16x2 / half2 pairs in the lane's
 * permuted order: out[4q + i] = (x[8q + i], x[8q + i + 4]). FP4 activations are decoded
 * exactly (NVFP4 folded like the weights: value * 2^-7; MXFP4 exact value).
 */
template <int AK>
__device__ __forceinline__ void dk_load_a_word(const fp4d_skinny_args &p, const uint8_t *arow, const uint4 *acodes,
                                               const uint32_t *ascale2, bool valid, int q, uint32_t out[4])
{
    if (!valid) {
#pragma unroll
        for (int i = 0; i < 4; i++) out[i] = 0;
        return;
    }
    if (AK == AK_FP4) {
        const uint4 v = acodes[q >> 2];
        const uint32_t w = (q & 3) == 0 ? v.x : (q & 3) == 1 ? v.y : (q & 3) == 2 ? v.z : v.w;
        if (p.a_type == FP4D_DTYPE_NVFP4) {
#pragma unroll
            for (int i = 0; i < 4; i++) out[i] = mul2<false>(e2m1_pair_raw<false>(w, i), ascale2[q >> 1]);
        } else {
            const uint32_t pow2 = bf16x2_bits(__floats2bfloat162_rn(0x1p126f, 0x1p126f));
#pragma unroll
            for (int i = 0; i < 4; i++)
                out[i] = mul2<false>(mul2<false>(e2m1_pair_raw<false>(w, i), pow2), ascale2[q >> 2]);
        }
    } else {
        (void)acodes;
        (void)ascale2;
        act_pairs_i_i4(__ldg((const uint4 *)arow + q), out);
    }
}

/* FP4 activations of one row for one step: 32 code bytes and the decoded scale pairs. */
__device__ __forceinline__ void dk_load_a_fp4(const fp4d_skinny_args &p, int64_t row, int64_t k0, bool valid,
                                              uint4 codes[2], uint32_t scale2[4])
{
    if (!valid) {
        codes[0] = codes[1] = make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int i = 0; i < 4; i++) scale2[i] = 0;
        return;
    }
    const uint4 *src = (const uint4 *)((const uint8_t *)p.a + row * (p.k / 2) + k0 / 2);
    codes[0] = __ldg(src);
    codes[1] = __ldg(src + 1);
    if (p.a_type == FP4D_DTYPE_NVFP4) {
        const int64_t C = p.k / 16;
        const int64_t off = scale_row_off(p.a_layout, C, row) + scale_col_off(p.a_layout, k0 / 16);
        nv_scales_folded<false>(__ldg((const uint32_t *)(p.a_scales + off)), scale2);
    } else {
        const int64_t C = p.k / 32;
        const int64_t off = scale_row_off(p.a_layout, C, row) + scale_col_off(p.a_layout, k0 / 32);
        const uint32_t two = __ldg((const uint16_t *)(p.a_scales + off)); /* c even: 2-byte aligned */
        scale2[0] = mx_scale_pair(two & 0xFFu);
        scale2[1] = mx_scale_pair(two >> 8);
        scale2[2] = scale2[3] = 0;
    }
}

/*
 * Split-K exchange of a block whose warps each hold NT m16n8 accumulators: publishes this
 * split's sums (elements for which ok(t, e) holds) in the partials of `tile`, and returns
 * true only in the block that arrives last, whose acc then holds the sums over all splits
 * added in split order (deterministic); that block re-arms the tile's counter.
 */
constexpr int SPLITK_BATCH = 4; /* splits whose partial sums one thread loads at once */

template <int NT, int BATCH, typename Ok>
__device__ __forceinline__ bool splitk_last_block(const fp4d_skinny_args &p, int64_t tile, int slots, int warp,
                                                  int lane, float (&acc)[NT][4], Ok ok)
{
    float *base = p.partials + tile * (int64_t)p.splits * slots;
    float *mine = base + (int64_t)blockIdx.y * slots;
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            if (ok(t, e)) __stcg(mine + ((warp * NT + t) * 4 + e) * 32 + lane, acc[t][e]);
    __threadfence();
    __syncthreads();
    __shared__ uint32_t prev;
    if (threadIdx.x == 0) prev = atomicAdd(p.counters + tile, 1u);
    __syncthreads();
    if (prev != (uint32_t)p.splits - 1) return false;
    __threadfence();
    /* the loads of BATCH splits at a time are all issued before their sums: one L2
     * round trip per batch, where a load-then-add per split and element was one each (on an
     * H200, 4096x14336 at M = 4 14.1 -> 13.4 us, M = 16 18.9 -> 17.6) */
    float sum[NT][4] = {};
    for (int sp0 = 0; sp0 < p.splits; sp0 += BATCH) {
        float v[BATCH][NT][4];
#pragma unroll
        for (int i = 0; i < BATCH; i++)
#pragma unroll
            for (int t = 0; t < NT; t++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    v[i][t][e] = sp0 + i < p.splits && ok(t, e)
                                     ? __ldcg(base + (int64_t)(sp0 + i) * slots + ((warp * NT + t) * 4 + e) * 32 + lane)
                                     : 0.0f;
#pragma unroll
        for (int i = 0; i < BATCH; i++)
            if (sp0 + i < p.splits)
#pragma unroll
                for (int t = 0; t < NT; t++)
#pragma unroll
                    for (int e = 0; e < 4; e++) sum[t][e] += v[i][t][e];
    }
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            if (ok(t, e)) acc[t][e] = sum[t][e];
    if (threadIdx.x == 0) p.counters[tile] = 0;
    return true;
}

/*
 * Thread block clusters (sm_90 and newer). A grid launched in clusters (launch_pdl's
 * cluster_y) has its blocks' shared memory mapped into one window: mapa turns the address of
 * a shared variable into the generic address of the same variable in another block of the
 * cluster, which ordinary loads then read. Compiled for older GPUs, cluster_blocks() is 1 and
 * the split-K kernels take their global-memory exchange.
 */
__device__ __forceinline__ uint32_t cluster_blocks()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    uint32_t n;
    asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(n));
    return n;
#else
    return 1;
#endif
}
/* every thread of every block of the cluster: writes before it are seen by reads after it */
__device__ __forceinline__ void cluster_barrier()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ const float *cluster_peer(const float *local, uint32_t rank)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    uint64_t out;
    asm volatile("mapa.u64 %0, %1, %2;\n" : "=l"(out) : "l"(local), "r"(rank));
    return reinterpret_cast<const float *>(out);
#else
    (void)rank;
    return local;
#endif
}

constexpr int SPLITK_CLUSTER_MAX = 16; /* the largest cluster sm_90 allows (8 portably) */

/*
 * Split-K exchange through the cluster's shared memory, for a grid launched in clusters of
 * p.splits blocks along y (one cluster = every split of one tile, cluster rank = blockIdx.y):
 * every block leaves its sums in its own shared memory `xch` (`slots` floats, written where
 * `writer`), and after a cluster barrier adds up its 1/splits share of the tile's slots over
 * all the blocks of the cluster in split order - the order, hence the bits, of
 * splitk_last_block - and hands each total to store(slot, sum). A second barrier keeps each
 * block's shared memory alive until the others have read it. No global partials, fences or
 * counters: the global exchange's last block waits out three L2 round trips (its partials
 * written and fenced, the counter, the other splits' partials), which on an H200 cost
 * 4096x14336 at M = 4 about 2 us of 13.4 even with its loads batched (a build whose split
 * blocks skipped the exchange: 11.4 us). Where launch_wa can use clusters (7168x18432 at
 * M = 2..8: 56 clusters of 4) the kernel is 0-2% faster than with the global exchange.
 */
template <int NT, typename Store>
__device__ __forceinline__ void splitk_cluster(const fp4d_skinny_args &p, float *xch, int slots, int warp, int lane,
                                               bool writer, const float (&acc)[NT][4], Store store)
{
    if (writer)
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int e = 0; e < 4; e++) xch[((warp * NT + t) * 4 + e) * 32 + lane] = acc[t][e];
    cluster_barrier();
    const int splits = p.splits, r = blockIdx.y;
    const int hi = (int)((int64_t)slots * (r + 1) / splits);
    for (int j = (int)((int64_t)slots * r / splits) + threadIdx.x; j < hi; j += blockDim.x) {
        float part[SPLITK_CLUSTER_MAX];
#pragma unroll
        for (int sp = 0; sp < SPLITK_CLUSTER_MAX; sp++) part[sp] = sp < splits ? *cluster_peer(xch + j, sp) : 0.0f;
        float sum = 0.0f;
#pragma unroll
        for (int sp = 0; sp < SPLITK_CLUSTER_MAX; sp++)
            if (sp < splits) sum += part[sp];
        store(j, sum);
    }
    cluster_barrier();
}

/* The factor that undoes the 2^-7 of each folded NVFP4 operand (exact); alpha comes after it,
 * so the output is rounded once. */
template <int AK, bool BNV> __device__ __forceinline__ float skinny_unfold(const fp4d_skinny_args &p)
{
    return (BNV ? 128.0f : 1.0f) * (AK == AK_FP4 && p.a_type == FP4D_DTYPE_NVFP4 ? 128.0f : 1.0f);
}

template <int AK, bool BNV, bool ROWS16>
__global__ void __launch_bounds__(DK_WARPS * 32, 3) decode_kernel(const fp4d_skinny_args p)
{
    constexpr bool F16 = AK == AK_F16;
    static_assert(BNV || !F16, "f16 activations with MXFP4 weights take the simt path");
    extern __shared__ __align__(16) uint8_t dk_smem_raw[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, j = lane & 3;
    dk_stage *ring = reinterpret_cast<dk_stage *>(dk_smem_raw) + warp * DK_STAGES;

    const fp4d_skinny_item it = p.items[blockIdx.z];
    const uint8_t *bcodes = p.b_codes[it.expert];
    const uint8_t *bscales = p.b_scales[it.expert];
    const int64_t K = p.k, steps = (K + DK_STEP - 1) / DK_STEP;
    const int64_t s_begin = steps * blockIdx.y / p.splits, s_end = steps * (blockIdx.y + 1) / p.splits;
    const int64_t bC = K / (BNV ? 16 : 32);
    const int64_t n_warp = (int64_t)blockIdx.x * DK_BN + warp * DK_NT * 8;

    /* per tile: this lane's weight row and the row part of its scale offsets */
    const uint8_t *brow[DK_NT];
    int64_t srow[DK_NT];
    bool nvalid[DK_NT];
#pragma unroll
    for (int t = 0; t < DK_NT; t++) {
        const int64_t n = n_warp + t * 8 + g;
        nvalid[t] = n < p.n;
        brow[t] = bcodes + (nvalid[t] ? n : 0) * (K / 2) + 32 * j;
        srow[t] = scale_row_off(p.b_layout, bC, nvalid[t] ? n : 0);
    }

    auto issue = [&](int64_t s, int stage) {
        const bool kv = s < s_end && s * DK_STEP + 64 * j < K;
        const int64_t c = BNV ? (s * DK_STEP + 64 * j) / 16 : (s * DK_STEP + 64 * j) / 32;
        const int64_t coff = kv ? scale_col_off(p.b_layout, c) : 0;
#pragma unroll
        for (int t = 0; t < DK_NT; t++) {
            const bool v = kv && nvalid[t];
            const uint8_t *src = v ? brow[t] + s * (DK_STEP / 2) : bcodes;
            cp_async_16((uint32_t)__cvta_generic_to_shared(&ring[stage].codes[t][0][lane]), src, v);
            cp_async_16((uint32_t)__cvta_generic_to_shared(&ring[stage].codes[t][1][lane]), src + (v ? 16 : 0), v);
            const int64_t off = srow[t] + coff;
            /* NVFP4: the 4 scales are one aligned word. MXFP4: 2 scales at an even offset;
             * copy only bytes that exist (the word's upper half is zero-filled) */
            const uint8_t *ssrc = v ? bscales + (off & ~(int64_t)3) : bscales;
            const int bytes = !v ? 0 : BNV ? 4 : (off & 3) ? 4 : 2;
            asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(
                             (uint32_t)__cvta_generic_to_shared(&ring[stage].scales[t][lane])),
                         "l"(ssrc), "r"(bytes));
        }
    };

    float acc[DK_NT][4];
#pragma unroll
    for (int t = 0; t < DK_NT; t++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[t][e] = 0.0f;

    const int64_t row_lo = (int64_t)it.row0 + g, row_hi = row_lo + 8;
    const bool lo_valid = g < it.rows, hi_valid = ROWS16 && g + 8 < it.rows;

#pragma unroll
    for (int st = 0; st < DK_STAGES - 1; st++) {
        issue(s_begin + st, st);
        cp_async_commit();
    }
    int stage = 0;
    for (int64_t s = s_begin; s < s_end; s++) {
        cp_async_wait<DK_STAGES - 2>();
        uint4 w[DK_NT][2];
        uint32_t sw[DK_NT];
#pragma unroll
        for (int t = 0; t < DK_NT; t++) {
            w[t][0] = ring[stage].codes[t][0][lane];
            w[t][1] = ring[stage].codes[t][1][lane];
            sw[t] = ring[stage].scales[t][lane];
        }
        issue(s + DK_STAGES - 1, stage == 0 ? DK_STAGES - 1 : stage - 1);
        cp_async_commit();
        stage = stage == DK_STAGES - 1 ? 0 : stage + 1;

        const int64_t k0 = s * DK_STEP + 64 * j;
        const bool kv = k0 < K;
        /* weight scale pairs: NVFP4 folded (index q>>1), MXFP4 plain (index q>>2) */
        uint32_t bs2[DK_NT][4];
#pragma unroll
        for (int t = 0; t < DK_NT; t++) {
            if (BNV) {
                nv_scales_folded<F16>(sw[t], bs2[t]);
            } else {
                /* the two scales sit at byte (off & 3) of the copied word (0 or 2) */
                const int64_t off = srow[t] + scale_col_off(p.b_layout, (s * DK_STEP + 64 * j) / 32);
                const uint32_t two = sw[t] >> ((off & 3) * 8);
                bs2[t][0] = mx_scale_pair(two & 0xFFu);
                bs2[t][1] = mx_scale_pair((two >> 8) & 0xFFu);
                bs2[t][2] = bs2[t][3] = 0;
            }
        }
        const uint16_t *plain = (const uint16_t *)p.a;
        const uint8_t *arow_lo = (const uint8_t *)(plain + (lo_valid ? row_lo : 0) * K + k0);
        const uint8_t *arow_hi = (const uint8_t *)(plain + (hi_valid ? row_hi : 0) * K + k0);
        uint4 acodes_lo[2], acodes_hi[2];
        uint32_t as2_lo[4], as2_hi[4];
        if (AK == AK_FP4) {
            dk_load_a_fp4(p, row_lo, k0, kv && lo_valid, acodes_lo, as2_lo);
            if (ROWS16) dk_load_a_fp4(p, row_hi, k0, kv && hi_valid, acodes_hi, as2_hi);
        }
#pragma unroll
        for (int q = 0; q < 8; q++) {
            uint32_t alo[4], ahi[4] = {0, 0, 0, 0};
            dk_load_a_word<AK>(p, arow_lo, acodes_lo, as2_lo, kv && lo_valid, q, alo);
            if (ROWS16) dk_load_a_word<AK>(p, arow_hi, acodes_hi, as2_hi, kv && hi_valid, q, ahi);
#pragma unroll
            for (int t = 0; t < DK_NT; t++) {
                const uint4 v = w[t][q >> 2];
                const uint32_t word = (q & 3) == 0 ? v.x : (q & 3) == 1 ? v.y : (q & 3) == 2 ? v.z : v.w;
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    uint32_t b[2];
#pragma unroll
                    for (int x = 0; x < 2; x++) {
                        const uint32_t raw = e2m1_pair_raw<F16>(word, 2 * h + x);
                        if (BNV) {
                            b[x] = mul2<F16>(raw, bs2[t][q >> 1]);
                        } else {
                            const uint32_t pow2 = bf16x2_bits(__floats2bfloat162_rn(0x1p126f, 0x1p126f));
                            b[x] = mul2<false>(mul2<false>(raw, pow2), bs2[t][q >> 2]);
                        }
                    }
                    const uint32_t af[4] = {alo[2 * h], ahi[2 * h], alo[2 * h + 1], ahi[2 * h + 1]};
                    mma_16816<F16>(acc[t], af, b);
                }
            }
        }
    }
    cp_async_wait<0>();

    /* rows of each accumulator element: e < 2 row g, e >= 2 row g + 8 */
    auto row_ok = [&](int e) { return e < 2 ? lo_valid : hi_valid; };
    if (p.splits > 1 &&
        !splitk_last_block<DK_NT, SPLITK_BATCH>(p, (int64_t)blockIdx.z * gridDim.x + blockIdx.x, DK_SLOTS, warp, lane,
                                                acc, [&](int, int e) { return row_ok(e); }))
        return;

    const float unfold = skinny_unfold<AK, BNV>(p), alpha = p.alpha[it.expert];
#pragma unroll
    for (int t = 0; t < DK_NT; t++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int64_t col = n_warp + t * 8 + 2 * j + (e & 1);
            if (row_ok(e) && col < p.n)
                store_out(p.out_type, p.out, ((e < 2 ? row_lo : row_hi)) * p.n + col, alpha * (acc[t][e] * unfold));
        }
}

/* ---------------------------------------------------------------------------------------
 * Weight-streaming decode kernel (items of <= 16 rows, K % 256 == 0)
 *
 * The weights are the 16-row A operand of m16n8k16 (one warp = 16 weight rows) and the
 * tokens the 8-column B operand, so no MMA row is wasted at M <= 8 and each decoded weight
 * feeds one MMA per 8 tokens. Each lane streams its own 16-byte pieces of two weight rows
 * straight into registers, WA_DEPTH - 1 phases of 256 k ahead of the one it computes; the
 * activations of the block's K range are staged once in shared memory, already in the
 * order of the B fragments (one conflict-free 16-byte load per lane feeds two MMAs, at a
 * fixed offset from one of two lane bases; lanes of tokens past the item read a live token,
 * so the loop has no branches). The warps of a
 * block take consecutive row tiles over the same K range and share the staging. K beyond
 * one block's range goes to other blocks (split-K), reduced in a fixed order by the last
 * block of each tile (deterministic). Block scales are turned into folded bf16x2 / half2
 * pairs through a 256-entry table in shared memory (one load per scale byte).
 *
 * K order inside one 8-k group: nibble i of a code word pairs with nibble i + 4 (one
 * shift decodes a pair, see e2m1_pair_raw); the staged activations use the same pairing.
 *
 * With bf16 or FP4 activations the weight codes come in the stream layout
 * (formats/stream_codes.h, fp4d_cuda_stream_codes), so a word of four pairs decodes in four
 * LOP3s and four shifts: the natural layout's decode took 2.5 ALU operations per pair and
 * made the loop issue-bound (measured: 14336x4096 at M = 1 took 13.0 us with the weights
 * served from L1, 10.3 with a one-LOP3 stand-in decode). With this decode the M = 1 loop no
 * longer is: 8% fewer instructions per phase (scale pairs of two blocks, sixteenth session,
 * docs/performance.md) ran no faster. f16 activations keep natural codes.
 *
 * Where a grid has at most one block per SM (fp4d_cuda_wa_warps_per_row_group), blocks have
 * two warps per 16-row group (KH = 2, 16 warps), each over half of the block's phases, their
 * sums added through shared memory: twice the warps per scheduler at the same registers.
 * Blocks hold RG 16-row groups (WA_WARPS, except K slices: one or two groups of KH = 8 warps
 * in place of a split grid's eight K splits, see fp4d_cuda_wa_kslices).
 * ------------------------------------------------------------------------------------- */

constexpr int WA_WARPS = 8;
constexpr int WA_ROWS = WA_WARPS * 16;  /* weight rows per block */
constexpr int WA_WIDE_RG = 16;         /* row groups per block of the wide grid (wa_wide_splits) */
constexpr int WA_WIDE_ROWS = WA_WIDE_RG * 16;
constexpr int WA_PHASE = 256;           /* k per phase: 128 bytes of each weight row */
/* register buffers: phases in flight + 1. ptxas gives every global load of this kernel one
 * dependency barrier, so the wait for a phase's loads also waits for every phase issued after
 * it: a deeper ring hides no more and costs registers. Against three buffers (two phases
 * ahead), two - one phase ahead - freed 18-21 registers and were faster on an H200 (four
 * order-balanced rounds, W4A16 us: 14336x4096 M = 1 10.88-10.97 -> 10.42-10.62, M = 16
 * 14.40-14.47 -> 13.66-13.93; 4096x14336 M = 4 12.08-12.16 -> 11.65-11.95; 7168x18432 M = 16
 * 31.38-31.49 -> 30.72-31.07; M = 1 there even). Rings in shared memory that wait for one
 * phase alone (cp.async, 3-4 stages) were slower: the copies read their address registers
 * late and ptxas makes later instructions wait for those reads (docs/performance.md,
 * seventeenth session). */
constexpr int WA_DEPTH = 2;
constexpr int WA_SMEM_MAX = 96 * 1024;  /* staged activations per block (two blocks per SM) */
constexpr int WA_MIN_BLOCKS = 16 / WA_WARPS; /* resident blocks per SM the registers must allow */
/* splits' partials the last block of a tile loads at once, by token tiles: eight (one round
 * trip for up to 8 splits) where each thread holds 4 sums; with 8 sums per thread (M > 8) that
 * was slower on an H200 (4096x14336 M = 16 17.8-18.0 -> 18.3-18.7 us, 7168x18432 34.3-34.6 ->
 * 36.3-36.5), so four there. Eight at M <= 8: 4096x14336 M = 1 12.9-13.0 -> 12.5 us in two of
 * three rounds, M = 4 13.4-13.5 -> 13.0-13.2, M = 8 13.8-13.9 -> 13.4-13.7. */
template <int MT> constexpr int wa_splitk_batch() { return MT == 1 ? 8 : SPLITK_BATCH; }
constexpr int WA_STAGE_BATCH = 8;       /* activation loads in flight per thread while staging */
constexpr int WA_STAGE_CHUNK = 2;       /* phases per chunk of 16-bit staging (stage_chunk) */

/* One thread's share of the staging's (item, token) pairs - items u_lo .. u_hi - 1 of each of
 * the tokens 0 .. mp - 1, token-major - as every threads-th pair from the thread's index: all
 * threads get as many pairs (to one), and consecutive threads take consecutive items of a
 * token (coalesced loads). Before, thread x took items x, x + threads, ... and every token of
 * each: where a block's K range holds fewer items than threads, threads idled while others
 * made more round trips. For FP4 pieces on an H200, W4A4 at M = 16: 14336x4096 16.3-16.6 ->
 * 15.6-15.9 us, 4096x14336 18.5-18.9 -> 17.9; bf16 units keep their running offsets (below). */
struct wa_stage_walk {
    int u, tok, du, dtok, items, u_hi, mp;
    __device__ wa_stage_walk(int u_lo, int u_hi_, int gtid, int threads, int mp_)
        : items(u_hi_ - u_lo), u_hi(u_hi_), mp(mp_)
    {
        if (items <= 0) {
            items = 1;
            tok = mp; /* nothing to stage */
        } else
            tok = gtid / items;
        u = u_lo + gtid % items;
        du = threads % items;
        dtok = threads / items;
    }
    __device__ bool live() const { return tok < mp; }
    __device__ void next()
    {
        u += du;
        tok += dtok;
        if (u >= u_hi) {
            u -= items;
            tok++;
        }
    }
};

/* Stream layout of the codes (fp4d_cuda_stream_codes): the 16 rows x 128 bytes that one warp
 * loads per phase form one contiguous chunk - piece (c, r) of lane l (row g + 8r, bytes
 * 64c + 16t..+15 of the phase, l = 4g + t) at (2c + r) * 512 + 16l - chunks in the order of
 * wa_chunk_index; each of the warp's four loads per phase reads 512 contiguous bytes. */
constexpr int WA_STREAM_CHUNK = 16 * WA_PHASE / 2;
/* ... and of the scales: per 16-row group and phase, lane l's two scale words (rows g, g + 8;
 * NVFP4 blocks 2t, 2t + 1, 8 + 2t, 9 + 2t of the phase, MXFP4 blocks t, 4 + t and two zero
 * bytes) as 8 bytes at 8l: one 8-byte load per lane and phase instead of four 1-2 byte ones. */
constexpr int WA_STREAM_SCALE_CHUNK = 32 * 8;
/* The chunks (codes and scales alike) are phase-major: every 16-row group's chunk of phase
 * 0, then of phase 1, ... The blocks run their phases nearly in step, so at any moment the
 * whole grid reads one narrow window of the weights, as a plain copy does. Group-major order
 * (each group's phases in a row, so that a warp streams its own region) was 1-4% slower at
 * M = 1..4 on an H200 (14336x4096 M = 1: 12.18-12.44 against 11.83-11.90 us). */
__host__ __device__ __forceinline__ int64_t wa_chunk_index(int64_t group, int64_t ph, int64_t groups)
{
    return ph * groups + group;
}

/* 16-byte unit of staged activations holding token m's 8-k group g8 (relative to the
 * block's first k; g8 = 32 ph + 16 c + 4 t + q): per phase and token 8 x 4 units, the
 * B-fragment piece j = 4c + q of lane t at 4 (j ^ (m & 1)) + t. So a lane's eight pieces of
 * a phase sit at fixed offsets from two lane bases (even and odd j; no per-load address
 * arithmetic), and the two tokens of a quarter warp (g = 2i, 2i + 1) read different bank
 * groups (bit 2 of the unit: j ^ (m & 1)). Token m's unit for g8 + 1 within a pair (q even) is
 * the unit for g8 with bit 2 flipped. */
__device__ __forceinline__ int wa_unit(int g8, int m, int mp)
{
    const int ph = g8 >> 5, r = g8 & 31, t = (r >> 2) & 3, j = ((r >> 4) << 2) | (r & 3);
    return (((ph * mp + m) * 8 + (j ^ (m & 1))) << 2) + t;
}

/* One folded NVFP4 scale byte as a bf16x2 / half2 pair (see nv_scales_folded). */
template <bool F16> __device__ __forceinline__ uint32_t nv_scale_folded1(uint32_t b)
{
    uint32_t out[4];
    nv_scales_folded<F16>(b & 0xFFu, out);
    return out[0];
}

__device__ __forceinline__ uint4 lds128(uint32_t addr)
{
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
    return v;
}
__device__ __forceinline__ uint32_t lds32(uint32_t addr)
{
    uint32_t v;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr));
    return v;
}

/* blocks of WA_WARPS warps (eight row groups, or K slices) must fit WA_MIN_BLOCKS per SM;
 * those of two warps per row group, or of WA_WIDE_RG row groups, run one per SM */
template <int AK, bool BNV, int MT, int KH = 1, int RG = WA_WARPS>
__global__ void __launch_bounds__(RG * 32 * KH, RG * KH == WA_WARPS ? WA_MIN_BLOCKS : 1) wa_kernel(const fp4d_skinny_args p)
{
    constexpr bool F16 = AK == AK_F16;
    static_assert(BNV || !F16, "f16 activations with MXFP4 weights take the simt path");
    extern __shared__ __align__(16) uint4 wa_act[];
    __shared__ uint32_t wa_stab[256]; /* scale byte -> folded pair */
    /* KH > 1: KH warps per row group, each over its share of the block's phases (more warps
     * per SM at the same registers), summed through shared memory at the end */
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) % RG, kh = KH > 1 ? (threadIdx.x >> 5) / RG : 0;
    const int g = lane >> 2, t = lane & 3;

    const fp4d_skinny_item it = p.single ? p.single_item : p.items[blockIdx.z];
    const uint8_t *bcodes = p.single ? p.single_codes : p.b_codes[it.expert];
    const uint8_t *bscales = p.single ? p.single_scales : p.b_scales[it.expert];
    const int64_t K = p.k, N = p.n, phases = K / WA_PHASE;
    const int64_t ph0 = phases * blockIdx.y / p.splits;
    const int nph_block = (int)(phases * (blockIdx.y + 1) / p.splits - ph0);
    const int hph0 = nph_block * kh / KH; /* this warp's first phase, relative to ph0 */
    const int nph = nph_block * (kh + 1) / KH - hph0;
    const int mp = it.rows;
    const int64_t bC = K / (BNV ? 16 : 32);

    /* this lane's two weight rows (clamped: rows >= N are computed but never stored), as
     * running pointers to the next phase to load: codes at +0 / +64 (chunks c = 0, 1: k +
     * 128c + 32t .. +31), scales at +0 / +sc_chunk (NVFP4: the u16 of blocks 8c + 2t and
     * 8c + 2t + 1; MXFP4: the byte of block 4c + t), advancing by sc_phase per phase */
    const int64_t n_lo = (int64_t)blockIdx.x * (RG * 16) + warp * 16 + g, n_hi = n_lo + 8;
    const int64_t r_lo = min(n_lo, N - 1), r_hi = min(n_hi, N - 1);
    /* natural codes (f16 activations): rows of K / 2 bytes; the stream layout: this warp's
     * 2 KB per phase, in the order of its lanes' loads (warps past the last row group read
     * the last one, like the clamped rows) */
    const int64_t groups = (N + 15) / 16, group = min((int64_t)blockIdx.x * RG + warp, groups - 1);
    const int64_t chunk0 = wa_chunk_index(group, ph0 + hph0, groups);
    const int64_t wstep = F16 ? WA_PHASE / 2 : groups * WA_STREAM_CHUNK; /* per phase */
    const uint8_t *wp[2] = {F16 ? bcodes + r_lo * (K / 2) + (ph0 + hph0) * (WA_PHASE / 2) + 16 * t
                                : bcodes + chunk0 * WA_STREAM_CHUNK + 16 * lane,
                            F16 ? bcodes + r_hi * (K / 2) + (ph0 + hph0) * (WA_PHASE / 2) + 16 * t
                                : bcodes + chunk0 * WA_STREAM_CHUNK + 16 * lane + WA_STREAM_CHUNK / 4};
    constexpr int cols_phase = WA_PHASE / (BNV ? 16 : 32), cols_chunk = cols_phase / 2;
    const int64_t sc_col0 = scale_col_off(p.b_layout, (ph0 + hph0) * cols_phase + (BNV ? 2 * t : t));
    const int sc_chunk = (int)scale_col_off(p.b_layout, cols_chunk), sc_phase = (int)scale_col_off(p.b_layout, cols_phase);
    const int64_t sstep = F16 ? sc_phase : groups * WA_STREAM_SCALE_CHUNK;
    const uint8_t *sp_[2] = {F16 ? bscales + scale_row_off(p.b_layout, bC, r_lo) + sc_col0
                                 : bscales + chunk0 * WA_STREAM_SCALE_CHUNK + 8 * lane,
                             bscales + scale_row_off(p.b_layout, bC, r_hi) + sc_col0};

    auto issue = [&](int ph, uint4 w[2][2], uint32_t s[2]) {
        if (ph < nph) {
#pragma unroll
            for (int r = 0; r < 2; r++) {
                /* the stream layout: row r's pieces a fixed offset into the warp's chunk (one
                 * running pointer instead of two) */
                const uint8_t *src = F16 ? wp[r] : wp[0] + r * (WA_STREAM_CHUNK / 4);
                w[0][r] = load_stream_16(src);
                w[1][r] = load_stream_16(src + (F16 ? 64 : WA_STREAM_CHUNK / 2));
                if (!F16) {
                    if (r == 0) {
                        const uint2 v = __ldg((const uint2 *)sp_[0]);
                        s[0] = v.x;
                        s[1] = v.y;
                    }
                } else if (BNV)
                    s[r] = __ldg((const unsigned short *)sp_[r]) | ((uint32_t)__ldg((const unsigned short *)(sp_[r] + sc_chunk)) << 16);
                else
                    s[r] = __ldg(sp_[r]) | ((uint32_t)__ldg(sp_[r] + sc_chunk) << 8);
            }
        }
#pragma unroll
        for (int r = 0; r < (F16 ? 2 : 1); r++) {
            wp[r] += wstep;
            sp_[r] += sstep;
        }
    };

    /* while the previous kernel may still run: the first phase's weights into the register
     * ring and the scale table (the item and pointer tables read above come
     * from the host). launch_wa lets this kernel start early (programmatic dependent launch)
     * only where the weights are settled (b_settled: nothing still running writes them), so
     * these loads cannot see weights that are being written; everything else waits for
     * pdl_wait. The next kernel may launch at once: its blocks take SMs as this kernel's
     * blocks leave them (a grid of at most one block per SM is kept from doubling up by its
     * shared memory, see pdl_one_per_sm_smem). Triggered after the main loop instead, M =
     * 1..16 was 2-6% slower (14336x4096 M = 1: 16.2-16.3 against 15.3-15.4 us). Issuing the
     * first loads here rather than after pdl_wait (which left only an L2 prefetch of the
     * first ~1.2 KB here) took, on an H200 in the bench's chain, 4096x14336 at M = 1 from
     * 13.23-13.32 to 12.58-12.87 us; prefetching two or six further phases' whole chunks
     * into L2 here as well was 5% / 16% slower (docs/performance.md). */
    pdl_trigger();
    uint4 cw[WA_DEPTH][2][2];
    uint32_t cs[WA_DEPTH][2];
#pragma unroll
    for (int d = 0; d < WA_DEPTH - 1; d++) issue(d, cw[d], cs[d]);
    for (int b = threadIdx.x; b < 256; b += blockDim.x) wa_stab[b] = BNV ? nv_scale_folded1<F16>((uint32_t)b) : mx_scale_pair((uint32_t)b);
    __syncthreads(); /* the table, for the staging and the loop */
    pdl_wait();

    const uint32_t pow2_126 = bf16x2_bits(__floats2bfloat162_rn(0x1p126f, 0x1p126f));
    const uint32_t stab = (uint32_t)__cvta_generic_to_shared(wa_stab);
    const int64_t kbase = ph0 * WA_PHASE;
    const int row_units = (int)(K / 8); /* 16-byte units per bf16/f16 token row */
    const uint4 *units = (const uint4 *)((const uint16_t *)p.a + (int64_t)it.row0 * K + kbase);

    /* K slices (RG <= 2) with 16-bit activations: the first `chunk` phases of the warp's K
     * share staged before the main loop, each later phase inside it - its loads issued with
     * the weights of the phase after the one computed, `chunk` phases ahead of its own
     * compute, and stored once the warp waits for those weights anyway - with the RG warps of
     * the K share meeting at a barrier every `chunk` phases. Thread (warp w of the RG, lane l)
     * copies unit l of tokens w, w + RG, ... of a phase: in the loop only where that is at
     * most WA_LOOP_UNITS units (M <= 2 in one row group, M <= 4 in two) and staging up front
     * would take more than one batch of loads. Up front, M = 4 took each thread 14 units in
     * two round trips before the first phase of 4096x14336 (H200, four order-balanced rounds,
     * W4A16 us: M = 2 11.59-11.82 -> 11.02-11.08, M = 4 11.80-11.94 -> 11.39-11.47; at M = 1,
     * one batch, and on 4096x4096 even or 0.1-0.2 slower, hence the batch rule). Blocks of
     * eight row groups stage up front: with a barrier per phase their warps lost more in
     * lockstep than the staging costs (14336x4096 M = 1 10.7 -> 12.0 us, M = 16 14.2 -> 14.5;
     * with a barrier every 2 or 4 phases still 0.5-2 us slower at M = 1). FP4 activations
     * stage up front too: decoded in the loop they were slower (4096x14336 W4A4 M = 1
     * 12.43-12.68 -> 13.00-13.24, M = 4 13.46-13.65 -> 14.16-14.31). docs/performance.md,
     * eighteenth session */
    constexpr int WA_LOOP_UNITS = 2;
    const int chunk = AK != AK_FP4 && RG <= 2 && p.stage_chunk > 0 && p.stage_chunk < nph && mp <= RG * WA_LOOP_UNITS &&
                              nph * mp > RG * WA_STAGE_BATCH
                          ? p.stage_chunk : nph;
    const bool stage_in_loop = chunk < nph;
    const uint4 *ls_src = units + (int64_t)warp * row_units + (hph0 + chunk) * 32 + lane; /* next phase to load */
    int ls_dst = wa_unit((hph0 + chunk) * 32 + lane, 0, mp) + warp * 32;                  /* ... and to store */
    uint4 ls_v[WA_LOOP_UNITS];
    auto loop_stage_load = [&]() {
#pragma unroll
        for (int i = 0; i < WA_LOOP_UNITS; i++)
            if (warp + i * RG < mp) ls_v[i] = __ldg(ls_src + (int64_t)i * RG * row_units);
        ls_src += 32;
    };
    auto loop_stage_store = [&]() {
#pragma unroll
        for (int i = 0; i < WA_LOOP_UNITS; i++) {
            const int m = warp + i * RG;
            if (m < mp) {
                uint32_t o[4];
                act_pairs_i_i4(ls_v[i], o);
                wa_act[(ls_dst + i * RG * 32) ^ ((m & 1) << 2)] = make_uint4(o[0], o[1], o[2], o[3]);
            }
        }
        ls_dst += mp * 32;
    };

    /* the activations of tokens 0..mp-1 over this K range */
    {
        /* units of (token m, 8-k group g8): thread x takes g8 = x, x + blockDim.x, ... and
         * every token of each, walked with running offsets (source unit, destination unit)
         * instead of a division and a 64-bit row address per unit, with WA_STAGE_BATCH loads
         * in flight before the first is used (one at a time, the staging was a chain of L2
         * latencies; with the per-unit address arithmetic it was 47% of the stall samples
         * at M = 16) */
        /* each warp's own phases only: with KH > 1 the RG warps of one K share stage it and
         * wait for each other alone (a named barrier; a single warp, none), so that no warp
         * waits for the staging of phases it does not compute. On an H200 against one
         * block-wide barrier, two rounds: K slices on 4096x14336 at M = 1 11.26-11.33 ->
         * 11.06-11.21 us, M = 2 13.05-13.13 -> 12.78-12.92; 14336x4096 (KH = 2) even */
        const int gthreads = RG * 32, gtid = threadIdx.x % gthreads;
        const int g8_lo = hph0 * (WA_PHASE / 8), g8_hi = (hph0 + chunk) * (WA_PHASE / 8);
        const bool nva = p.a_type == FP4D_DTYPE_NVFP4;
        const int64_t aC = K / (nva ? 16 : 32), col0 = kbase / (nva ? 16 : 32);
        const uint32_t *codes = (const uint32_t *)((const uint8_t *)p.a + (int64_t)it.row0 * (K / 2) + kbase / 2);
        if (AK == AK_FP4) {
            /* FP4: units in pairs, one 16-k piece (8 code bytes, one scale byte) per load
             * pair - half the loads and address arithmetic per unit, and twice the units per
             * batch in flight; the scale pair from the shared table where the activations'
             * format is the weights' (filled by all threads before the barrier ahead of
             * pdl_wait). On an H200 the per-unit staging made FP4 activations
             * 1.3 us dearer than bf16 ones on 14336x4096 at M = 2..4, 6 us on 7168x18432 at
             * M = 8; in pieces, same run: 14336x4096 W4A4 M = 4 13.2-13.4 -> 12.8 us, M = 16
             * 18.1 -> 17.0-17.1, 7168x18432 M = 8 27.3-27.5 -> 25.1-25.4, M = 16 38.3-39.2 ->
             * 36.2. */
            const int row_pieces = (int)(K / 16);
            const uint2 *codes2 = reinterpret_cast<const uint2 *>(codes);
            wa_stage_walk wk(g8_lo / 2, g8_hi / 2, gtid, gthreads, mp);
            while (wk.live()) {
                uint2 w[WA_STAGE_BATCH];
                uint32_t sb[WA_STAGE_BATCH];
                int iu[WA_STAGE_BATCH], itok[WA_STAGE_BATCH];
#pragma unroll
                for (int i = 0; i < WA_STAGE_BATCH; i++) {
                    const int g16 = wk.u, tok = wk.tok;
                    iu[i] = wk.live() ? g16 : -1;
                    itok[i] = tok;
                    if (wk.live()) {
                        w[i] = __ldg(codes2 + g16 + tok * row_pieces);
                        sb[i] = __ldg(p.a_scales + scale_row_off(p.a_layout, aC, (int64_t)it.row0 + tok) +
                                      scale_col_off(p.a_layout, col0 + (nva ? g16 : g16 >> 1)));
                    }
                    wk.next();
                }
#pragma unroll
                for (int i = 0; i < WA_STAGE_BATCH; i++) {
                    if (iu[i] < 0) break;
                    const int to = wa_unit(2 * iu[i], itok[i], mp); /* the destinations after the loads */
                    const uint32_t s2 = nva == BNV ? lds32(stab + 4 * sb[i]) : nva ? nv_scale_folded1<false>(sb[i]) : mx_scale_pair(sb[i]);
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        /* the piece's second 8-k group: bit 2 of the unit flipped (wa_unit) */
                        const uint32_t word = h ? w[i].y : w[i].x;
                        uint32_t o[4];
#pragma unroll
                        for (int jj = 0; jj < 4; jj++) {
                            const uint32_t pr = e2m1_pair_raw<false>(word, jj);
                            o[jj] = mul2<false>(nva ? pr : mul2<false>(pr, pow2_126), s2);
                        }
                        wa_act[to ^ (h << 2)] = make_uint4(o[0], o[1], o[2], o[3]);
                    }
                }
            }
        } else {
            /* 16-bit: thread x of the K share takes g8 = x, x + its threads, ... and every token
             * of each with running offsets (no per-unit wa_unit). The FP4 walk above, tried here
             * too, was slower:
             * its per-unit address arithmetic sits in front of the batch's loads, and bf16
             * units cost no decode to hide it (H200: 7168x18432 at M = 16 31.7-32.0 -> 32.8 us,
             * 4096x14336 16.3-16.4 -> 16.9-17.5; M = 1 even) */
            int m = 0, g8 = g8_lo + gtid, src = g8, dst = wa_unit(g8, 0, mp); /* token 0's */
            while (g8 < g8_hi) {
                int to[WA_STAGE_BATCH];
                uint4 v[WA_STAGE_BATCH];
#pragma unroll
                for (int i = 0; i < WA_STAGE_BATCH; i++) {
                    to[i] = g8 < g8_hi ? dst ^ ((m & 1) << 2) : -1;
                    if (g8 < g8_hi) v[i] = __ldg(units + src);
                    if (++m == mp) {
                        m = 0;
                        g8 += gthreads;
                        src = g8;
                        dst = wa_unit(g8, 0, mp);
                    } else {
                        src += row_units;
                        dst += 32;
                    }
                }
#pragma unroll
                for (int i = 0; i < WA_STAGE_BATCH; i++) {
                    if (to[i] < 0) break;
                    uint32_t o[4];
                    act_pairs_i_i4(v[i], o);
                    wa_act[to[i]] = make_uint4(o[0], o[1], o[2], o[3]);
                }
            }
        }
    }
    /* the RG warps sharing this K range (a single warp: none but itself) */
    auto staging_barrier = [&]() {
        if (RG == 1) __syncwarp();
        else asm volatile("bar.sync %0, %1;\n" ::"r"(1 + kh), "r"(RG * 32) : "memory");
    };
    if (KH == 1) __syncthreads();
    else staging_barrier();

    /* two accumulator sets, one per k-step of a pair, so that consecutive MMAs do not wait
     * on each other; summed once at the end */
    float acc[MT][4], acc2[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[mt][e] = acc2[mt][e] = 0.0f;

    /* B fragments (wa_unit): piece j of phase ph at unit (ph mp + m) 32 + 4 (j ^ (m & 1)) + t,
     * i.e. at byte 64 j from the lane's base for even or odd j in phase 0, plus ph x bph_step.
     * Lanes of tokens >= mp read a live token of their column tile instead (an MMA's output
     * column depends on its B column only, and those columns are never stored; the same
     * address as that token's lane, so no bank conflict) */
    uint32_t bbase[MT][2];
    const uint32_t bph_step = 512u * (uint32_t)mp;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        const int m0 = mt * 8 + g, m = m0 < mp ? m0 : mt * 8 + (m0 - mt * 8) % (mp - mt * 8);
        const uint32_t lane0 = (uint32_t)__cvta_generic_to_shared(&wa_act[m * 32 + t]);
        bbase[mt][0] = lane0 + (uint32_t)(m & 1) * 64u;  /* even j: unit 4 (j + 1) + t when m is odd */
        bbase[mt][1] = lane0 - (uint32_t)(m & 1) * 64u;  /* odd j: unit 4 (j - 1) + t */
    }

    auto compute = [&](int ph, const uint4 w[2][2], const uint32_t s[2]) {
        /* scale pairs per row: index 2c + (q >> 1) (NVFP4) or c (MXFP4) */
        uint32_t sp[2][4];
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int j = 0; j < (BNV ? 4 : 2); j++) sp[r][j] = lds32(stab + 4 * ((s[r] >> (8 * j)) & 0xFFu));
        uint32_t bph[MT][2];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            bph[mt][0] = bbase[mt][0] + (uint32_t)ph * bph_step;
            bph[mt][1] = bbase[mt][1] + (uint32_t)ph * bph_step;
        }
#pragma unroll
        for (int c = 0; c < 2; c++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const uint32_t wl = q == 0 ? w[c][0].x : q == 1 ? w[c][0].y : q == 2 ? w[c][0].z : w[c][0].w;
                const uint32_t wh = q == 0 ? w[c][1].x : q == 1 ? w[c][1].y : q == 2 ? w[c][1].z : w[c][1].w;
                uint4 b[MT];
#pragma unroll
                for (int mt = 0; mt < MT; mt++) b[mt] = lds128(bph[mt][q & 1] + 64u * (4 * c + q)); /* [R + imm] */
                const uint32_t sl = BNV ? sp[0][2 * c + (q >> 1)] : sp[0][c];
                const uint32_t sh = BNV ? sp[1][2 * c + (q >> 1)] : sp[1][c];
#pragma unroll
                for (int st = 0; st < 2; st++) {
                    uint32_t a[4];
                    const auto pair = [](uint32_t word, int i) {
                        return F16 ? e2m1_pair_raw<true>(word, i) : e2m1_pair_stream(word, i);
                    };
                    const uint32_t r0 = pair(wl, 2 * st), r1 = pair(wh, 2 * st);
                    const uint32_t r2 = pair(wl, 2 * st + 1), r3 = pair(wh, 2 * st + 1);
                    if (BNV) {
                        a[0] = mul2<F16>(r0, sl);
                        a[1] = mul2<F16>(r1, sh);
                        a[2] = mul2<F16>(r2, sl);
                        a[3] = mul2<F16>(r3, sh);
                    } else {
                        a[0] = mul2<false>(mul2<false>(r0, pow2_126), sl);
                        a[1] = mul2<false>(mul2<false>(r1, pow2_126), sh);
                        a[2] = mul2<false>(mul2<false>(r2, pow2_126), sl);
                        a[3] = mul2<false>(mul2<false>(r3, pow2_126), sh);
                    }
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        const uint32_t bb[2] = {st == 0 ? b[mt].x : b[mt].z, st == 0 ? b[mt].y : b[mt].w};
                        mma_16816<F16>(st == 0 ? acc[mt] : acc2[mt], a, bb);
                    }
                }
            }
    };

    int to_barrier = chunk; /* phases until the next staging barrier (stage_in_loop) */
    for (int p0 = 0; p0 < nph; p0 += WA_DEPTH) {
#pragma unroll
        for (int d = 0; d < WA_DEPTH; d++) {
            const int ph = p0 + d;
            if (ph < nph) {
                if (stage_in_loop) {
                    if (ph > 0) {
                        if (ph + chunk - 1 < nph) loop_stage_store(); /* phase ph + chunk - 1 */
                        if (--to_barrier == 0) {
                            staging_barrier(); /* phases ph .. ph + chunk - 1 */
                            to_barrier = chunk;
                        }
                    }
                    if (ph + chunk < nph) loop_stage_load();
                }
                issue(ph + WA_DEPTH - 1, cw[(d + WA_DEPTH - 1) % WA_DEPTH], cs[(d + WA_DEPTH - 1) % WA_DEPTH]);
                compute(hph0 + ph, cw[d], cs[d]);
            }
        }
    }

#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[mt][e] += acc2[mt][e];
    if (KH > 1) {
        /* the other warps' sums of this row group, added in warp order (deterministic) */
        __shared__ float wa_xsum[KH > 1 ? (KH - 1) * RG * 32 * MT * 4 : 1];
        if (kh > 0)
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int e = 0; e < 4; e++) wa_xsum[((((kh - 1) * RG + warp) * MT + mt) * 4 + e) * 32 + lane] = acc[mt][e];
        __syncthreads();
        if (kh == 0)
            for (int h = 1; h < KH; h++)
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) acc[mt][e] += wa_xsum[((((h - 1) * RG + warp) * MT + mt) * 4 + e) * 32 + lane];
    }

    /* accumulator element e: weight row g (e < 2) or g + 8, token mt*8 + 2t + (e & 1); only
     * the first warp of a row group stores */
    auto ok = [&](int mt, int e) {
        const int64_t n = e < 2 ? n_lo : n_hi;
        return kh == 0 && n < N && mt * 8 + 2 * t + (e & 1) < mp;
    };
    constexpr int SLOTS = RG * MT * 4 * 32;
    const float unfold = skinny_unfold<AK, BNV>(p), alpha = p.single ? p.single_alpha : p.alpha[it.expert];
    if (p.splits > 1 && cluster_blocks() == (uint32_t)p.splits) {
        /* the splits of this tile are this cluster (launch_wa): slot j is accumulator e of
         * column mt of lane l of warp w, j = ((w * MT + mt) * 4 + e) * 32 + l */
        if (KH == 1) __syncthreads(); /* every warp is done with the staged activations */
        splitk_cluster<MT>(p, reinterpret_cast<float *>(wa_act), SLOTS, warp, lane, kh == 0, acc, [&](int j, float sum) {
            const int l = j & 31, e = (j >> 5) & 3, mt = (j >> 7) % MT, w = (j >> 7) / MT;
            const int64_t n = (int64_t)blockIdx.x * (RG * 16) + w * 16 + (l >> 2) + (e < 2 ? 0 : 8);
            const int tok = mt * 8 + 2 * (l & 3) + (e & 1);
            if (n < N && tok < mp) store_out(p.out_type, p.out, ((int64_t)it.row0 + tok) * N + n, alpha * (sum * unfold));
        });
        return;
    }
    if (p.splits > 1 &&
        !splitk_last_block<MT, wa_splitk_batch<MT>()>(p, (int64_t)blockIdx.z * gridDim.x + blockIdx.x, SLOTS, warp,
                                                      lane, acc, ok))
        return;

#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            if (ok(mt, e)) {
                const int64_t tok = (int64_t)it.row0 + mt * 8 + 2 * t + (e & 1);
                store_out(p.out_type, p.out, tok * N + (e < 2 ? n_lo : n_hi), alpha * (acc[mt][e] * unfold));
            }
}

/* ---------------------------------------------------------------------------------------
 * Tiled GEMM (dense bf16/f16 operands)
 * ------------------------------------------------------------------------------------- */

constexpr int TG_BM = 128, TG_BN = 128, TG_BK = 32, TG_STAGES = 3, TG_THREADS = 256;

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], uint32_t smem)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem));
}

/* A tile row holds 32 elements = four 16-byte chunks; chunk c of row r is stored at
 * c ^ ((r >> 1) & 3), which makes every ldmatrix phase hit 8 distinct bank groups. */
__device__ __forceinline__ int tg_swz(int r, int c) { return r * 4 + (c ^ ((r >> 1) & 3)); }

template <bool F16>
__global__ void __launch_bounds__(TG_THREADS) tiled_kernel(const uint16_t *__restrict__ A, const uint16_t *__restrict__ B,
                                                           int64_t M, int64_t N, int64_t K, float alpha, int out_type,
                                                           void *out)
{
    __shared__ __align__(128) uint4 sA[TG_STAGES][TG_BM * 4];
    __shared__ __align__(128) uint4 sB[TG_STAGES][TG_BN * 4];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp >> 2, wn = warp & 3; /* 2 x 4 warps, warp tile 64 x 32 */
    const int64_t m0 = (int64_t)blockIdx.y * TG_BM, n0 = (int64_t)blockIdx.x * TG_BN;
    const int64_t ktiles = (K + TG_BK - 1) / TG_BK;

    auto load_stage = [&](int stage, int64_t kt) {
#pragma unroll
        for (int x = 0; x < 2; x++) {
            const int idx = tid + x * TG_THREADS; /* 0..511: row idx/4, chunk idx%4 */
            const int r = idx >> 2, ch = idx & 3;
            const int64_t k = kt * TG_BK + ch * 8;
            const int64_t ga = m0 + r, gb = n0 + r;
            const bool kin = kt < ktiles && k < K;
            cp_async_16((uint32_t)__cvta_generic_to_shared(&sA[stage][tg_swz(r, ch)]),
                        A + (kin && ga < M ? ga * K + k : 0), kin && ga < M);
            cp_async_16((uint32_t)__cvta_generic_to_shared(&sB[stage][tg_swz(r, ch)]),
                        B + (kin && gb < N ? gb * K + k : 0), kin && gb < N);
        }
    };

    float acc[4][4][4];
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int b = 0; b < 4; b++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[a][b][e] = 0.0f;

#pragma unroll
    for (int s = 0; s < TG_STAGES - 1; s++) {
        load_stage(s, s);
        cp_async_commit();
    }
    for (int64_t kt = 0; kt < ktiles; kt++) {
        cp_async_wait<TG_STAGES - 2>();
        __syncthreads();
        load_stage((int)((kt + TG_STAGES - 1) % TG_STAGES), kt + TG_STAGES - 1);
        cp_async_commit();
        const int st = (int)(kt % TG_STAGES);
#pragma unroll
        for (int kk = 0; kk < 2; kk++) { /* two k16 steps per 32-wide tile */
            uint32_t af[4][4], bfr[4][2];
#pragma unroll
            for (int mi = 0; mi < 4; mi++) {
                const int r = wm * 64 + mi * 16 + (lane & 15);
                const int ch = kk * 2 + (lane >> 4);
                ldmatrix_x4(af[mi], (uint32_t)__cvta_generic_to_shared(&sA[st][tg_swz(r, ch)]));
            }
#pragma unroll
            for (int nb = 0; nb < 2; nb++) {
                const int r = wn * 32 + nb * 16 + (lane & 7) + ((lane >> 4) << 3);
                const int ch = kk * 2 + ((lane >> 3) & 1);
                uint32_t t4[4];
                ldmatrix_x4(t4, (uint32_t)__cvta_generic_to_shared(&sB[st][tg_swz(r, ch)]));
                bfr[nb * 2][0] = t4[0];
                bfr[nb * 2][1] = t4[1];
                bfr[nb * 2 + 1][0] = t4[2];
                bfr[nb * 2 + 1][1] = t4[3];
            }
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++) mma_16816<F16>(acc[mi][ni], af[mi], bfr[ni]);
        }
    }
    cp_async_wait<0>();

    const int g = lane >> 2, j = lane & 3;
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int64_t r = m0 + wm * 64 + mi * 16 + g + (e >= 2 ? 8 : 0);
                const int64_t col = n0 + wn * 32 + ni * 8 + 2 * j + (e & 1);
                if (r < M && col < N) store_out(out_type, out, r * N + col, alpha * acc[mi][ni][e]);
            }
}

/* ---------------------------------------------------------------------------------------
 * Fused GEMM (large M): packed NVFP4 weights dequantized in registers
 *
 * CTA tile 128 (M) x 128 (N) x 64 (K), 8 warps as 2 x 4 with 64 x 32 warp tiles, a
 * 4-stage cp.async ring per CTA holding the stage's activations (128 rows x 128 bytes of
 * bf16/f16), packed weight codes (128 rows x 32 bytes) and the weights' block scales (one
 * aligned 4-byte word per row: the four NVFP4 scales of the 64-k slice, which is where
 * every layout of spec §6 keeps them when K % 64 == 0).
 *
 * k order. A dot product may be summed in any k order as long as both operands use the
 * same one, so inside a 64-k tile lane (g, j) of the m16n8k16 fragment takes the physical
 * k range [16j, 16j + 16): exactly one NVFP4 block of its weight row, i.e. 8 bytes of codes
 * and ONE scale byte. Its two 32-bit code words give 8 (nibble i, nibble i+4) pairs, which
 * e2m1_pair decodes into the 8 B-fragment registers of the tile's 4 k16 steps (step s
 * uses pairs 2s, 2s+1). The activations follow the same order: one 16-byte shared-memory
 * load of 8 consecutive k per row, regrouped into (i, i+4) pairs by byte permutes.
 *
 * Exactness: e2m1 x e4m3 is exact in bf16 and f16 (at most 5 significant bits, 2^-10 ..
 * 2688), products are accumulated in f32 by the tensor cores, alpha is applied in f32 and
 * the result rounded once (or, with split-K, partial f32 sums reduced in a fixed order by
 * fused_reduce_kernel, so runs are bit-identical). The decode is ONE multiply per pair:
 * the code bits placed in the exponent/mantissa field are value * 2^-126 (bf16; 2^-14 for
 * f16), and they are multiplied by a pair from a 256-entry shared table holding
 * scale * 2^118 (f16: scale * 2^7), exact and finite for every e4m3 byte (NaN bytes give
 * NaN). The weights thus enter the MMA as value * scale * 2^-8 (f16: 2^-7), still exact
 * (the smallest, 2^-18 / 2^-17, is representable), and the f32 sums are multiplied back by
 * the power of two in the epilogue, which is exact.
 *
 * Shared memory: activation rows are 8 chunks of 16 bytes, chunk c of row r stored at
 * c ^ (r & 1), so the 8 lanes of a 16-byte load phase (rows g, g+1, chunks 2j + w) hit 8
 * distinct 4-bank groups; code rows are 32 bytes, and a half-warp's 8-byte loads cover 4
 * consecutive rows (conflict-free without a swizzle).
 * ------------------------------------------------------------------------------------- */

constexpr int FG_BM = 128, FG_BN = 128, FG_BK = 64, FG_STAGES = 4, FG_THREADS = 256;
constexpr int FG_A_BYTES = FG_BM * FG_BK * 2;      /* 16 KB */
constexpr int FG_B_BYTES = FG_BN * FG_BK / 2;      /* 4 KB */
constexpr int FG_S_BYTES = FG_BN * 4;              /* 512 B */
constexpr int FG_STAGE_BYTES = FG_A_BYTES + FG_B_BYTES + FG_S_BYTES;
constexpr int FG_LUT_OFFSET = FG_STAGES * FG_STAGE_BYTES;
constexpr int FG_SMEM = FG_LUT_OFFSET + 256 * 4;   /* 83 KB: two CTAs per SM */
constexpr int FG_GROUP_M = 8;                      /* M tiles per raster group (L2 reuse) */

struct fused_args {
    const uint16_t *a;      /* [M, K] bf16 or f16 */
    const uint8_t  *codes;  /* [N, K/2] */
    const uint8_t  *scales; /* NVFP4 block scales, layout */
    int32_t         layout;
    int64_t         m, n, k;
    float           alpha;
    int32_t         out_type;
    void           *out;
    int32_t         splits, ktiles_per_split;
    float          *partials; /* splits > 1: [splits, M, N] (mma.sync kernel) or per tile (wgmma kernels) */
    uint32_t       *counters; /* wgmma kernels, splits > 1: one per tile, zero between launches */
    /* wgr_kernel, grouped (items != NULL): blockIdx.z takes items[z] - rows row0 .. row0 + rows
     * (at most one token tile) of A and out, with expert `expert`'s weights, scales and alpha
     * from the device tables; codes, scales, alpha above are then unused, m is all rows */
    const fp4d_skinny_item *items;
    int64_t                 num_items;  /* grouped: items (the launch's grid z) */
    const uint8_t *const   *g_codes;
    const uint8_t *const   *g_scales;
    const float            *g_alpha;
    /* wgt_kernel with splits == 1: the last tail_tiles tiles (the grid's last, partial round)
     * run as tail_splits K parts each, reduced like split-K (dense_tail_plan); 0: none */
    int32_t tail_tiles, tail_splits;
};

__device__ __forceinline__ void store_out2(int out_type, void *out, int64_t idx, float v0, float v1, bool both,
                                           bool paired)
{
    if (paired && both) {
        if (out_type == FP4D_DTYPE_F32) *(float2 *)((float *)out + idx) = make_float2(v0, v1);
        else if (out_type == FP4D_DTYPE_BF16) *(__nv_bfloat162 *)((__nv_bfloat16 *)out + idx) = __floats2bfloat162_rn(v0, v1);
        else *(__half2 *)((__half *)out + idx) = __floats2half2_rn(v0, v1);
        return;
    }
    store_out(out_type, out, idx, v0);
    if (both) store_out(out_type, out, idx + 1, v1);
}

/* MINB = resident CTAs per SM the register budget is sized for: 2 (128 registers, a few
 * spills) or 1 (about 156 registers, no spills; FP4DOCTOR_CUDA_FUSED_MINB=1, bf16 only). */
template <bool F16, int MINB>
__global__ void __launch_bounds__(FG_THREADS, MINB) fused_kernel(const fused_args p)
{
    extern __shared__ __align__(128) uint8_t fg_smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp >> 2, wn = warp & 3;
    const int g = lane >> 2, j = lane & 3;
    constexpr float fold = F16 ? 0x1p7f : 0x1p118f, unfold = F16 ? 0x1p7f : 0x1p8f;
    uint32_t *scale_lut = (uint32_t *)(fg_smem + FG_LUT_OFFSET); /* read after the loop's first barrier */
    scale_lut[tid] = scale_pair<F16>(ue4m3_to_f32((uint32_t)tid) * fold);

    /* raster: groups of FG_GROUP_M M tiles sweep all N tiles, M fastest, so the CTAs
     * resident at one time share both their activation rows and their weight rows in L2 */
    const int64_t mt_count = (p.m + FG_BM - 1) / FG_BM, nt_count = (p.n + FG_BN - 1) / FG_BN;
    const int64_t tiles = mt_count * nt_count;
    const int64_t bid = blockIdx.x;
    const int split = (int)(bid / tiles);
    const int64_t t = bid % tiles;
    const int64_t group = t / (FG_GROUP_M * nt_count);
    const int64_t first_m = group * FG_GROUP_M;
    const int64_t gsize = mt_count - first_m < FG_GROUP_M ? mt_count - first_m : FG_GROUP_M;
    const int64_t in_group = t % (FG_GROUP_M * nt_count);
    const int64_t m0 = (first_m + in_group % gsize) * FG_BM, n0 = (in_group / gsize) * FG_BN;

    const int64_t ktiles_total = p.k / FG_BK;
    const int64_t kt0 = (int64_t)split * p.ktiles_per_split;
    int64_t kt1 = kt0 + p.ktiles_per_split;
    if (kt1 > ktiles_total) kt1 = ktiles_total;
    const int nkt = kt1 > kt0 ? (int)(kt1 - kt0) : 0;
    const uint32_t smem_base = (uint32_t)__cvta_generic_to_shared(fg_smem);
    /* per-thread copy sources, advanced by one k tile per stage: activation chunk
     * (row tid/8 + 32x, 16-byte chunk tid%8), code half-row tid%2 of row tid/2, and the
     * scale word of row tid (tid < 128), whose k-tile stride depends on the layout */
    const int a_r = tid >> 3, a_ch = tid & 7;
    const uint16_t *a_src = p.a + (m0 + a_r) * p.k + kt0 * FG_BK + a_ch * 8;
    const int64_t a_rows_left = p.m - m0 - a_r; /* chunk x valid when 32x < a_rows_left */
    const int b_r = tid >> 1, b_h = tid & 1;
    const bool b_ok = n0 + b_r < p.n;
    const uint8_t *b_src = p.codes + (b_ok ? (n0 + b_r) * (p.k / 2) + kt0 * 32 + b_h * 16 : 0);
    const bool s_ok = tid < FG_BN && n0 + tid < p.n;
    const int s_step = p.layout == FP4D_LAYOUT_LINEAR ? 4 : p.layout == FP4D_LAYOUT_SWIZZLED_128X4 ? 512 : 32;
    const uint8_t *s_src = p.scales + (s_ok ? scale_offset(p.layout, p.k / 16, n0 + tid, kt0 * 4) : 0);
    const uint32_t a_dst = smem_base + a_r * 128 + ((a_ch ^ (a_r & 1)) << 4); /* a_r + 32x has the same parity */
    const uint32_t b_dst = smem_base + FG_A_BYTES + b_r * 32 + b_h * 16;
    const uint32_t s_dst = smem_base + FG_A_BYTES + FG_B_BYTES + tid * 4;

    const int a_x_stride = 32 * (int)p.k; /* elements between a thread's 4 chunks (K < 2^24) */
    auto load_stage = [&](int stage, int i) {
        const bool live = i < nkt;
        const uint32_t so = stage * FG_STAGE_BYTES;
#pragma unroll
        for (int x = 0; x < 4; x++) {
            const bool ok = live && 32 * x < a_rows_left;
            cp_async_16(a_dst + so + x * 32 * 128, ok ? a_src + (x * a_x_stride + i * FG_BK) : p.a, ok);
        }
        cp_async_16(b_dst + so, live && b_ok ? b_src + i * 32 : p.codes, live && b_ok);
        if (tid < FG_BN) cp_async_4(s_dst + so, live && s_ok ? s_src + i * s_step : p.scales, live && s_ok);
    };

    float acc[4][4][4];
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int b = 0; b < 4; b++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[a][b][e] = 0.0f;

#pragma unroll
    for (int s = 0; s < FG_STAGES - 1; s++) {
        load_stage(s, s);
        cp_async_commit();
    }
    for (int i = 0; i < nkt; i++) {
        cp_async_wait<FG_STAGES - 2>();
        __syncthreads();
        load_stage((i + FG_STAGES - 1) % FG_STAGES, i + FG_STAGES - 1);
        cp_async_commit();
        const int st = i % FG_STAGES;
        const uint8_t *sbase = fg_smem + st * FG_STAGE_BYTES;
        /* this lane's weights: 8 code bytes and one scale byte per n8 tile */
        uint2 bw[4];
        uint32_t bs[4];
#pragma unroll
        for (int ni = 0; ni < 4; ni++) {
            const int r = wn * 32 + ni * 8 + g;
            bw[ni] = *(const uint2 *)(sbase + FG_A_BYTES + r * 32 + j * 8);
            bs[ni] = scale_lut[sbase[FG_A_BYTES + FG_B_BYTES + r * 4 + j]];
        }
#pragma unroll
        for (int w = 0; w < 2; w++) { /* code word w: k16 steps 2w, 2w + 1 */
            uint32_t bf[4][4];
#pragma unroll
            for (int ni = 0; ni < 4; ni++) {
                const uint32_t word = w ? bw[ni].y : bw[ni].x;
#pragma unroll
                for (int q = 0; q < 4; q++) bf[ni][q] = e2m1_pair_folded<F16>(word, q, bs[ni]);
            }
#pragma unroll
            for (int mi = 0; mi < 4; mi++) {
                uint32_t af[2][4]; /* rows g and g + 8: (i, i+4) pairs of 8 consecutive k */
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int r = wm * 64 + mi * 16 + g + h * 8;
                    const int ch = 2 * j + w;
                    act_pairs_i_i4(*(const uint4 *)(sbase + r * 128 + ((ch ^ (r & 1)) << 4)), af[h]);
                }
#pragma unroll
                for (int s = 0; s < 2; s++) {
                    const uint32_t a4[4] = {af[0][2 * s], af[1][2 * s], af[0][2 * s + 1], af[1][2 * s + 1]};
#pragma unroll
                    for (int ni = 0; ni < 4; ni++) {
                        const uint32_t b2[2] = {bf[ni][2 * s], bf[ni][2 * s + 1]};
                        mma_16816<F16>(acc[mi][ni], a4, b2);
                    }
                }
            }
        }
    }
    cp_async_wait<0>();

    const bool to_partials = p.splits > 1;
    const int out_type = to_partials ? (int)FP4D_DTYPE_F32 : p.out_type;
    void *out = to_partials ? (void *)(p.partials + (int64_t)split * p.m * p.n) : p.out;
    const float alpha = to_partials ? 1.0f : p.alpha;
    const bool paired = (p.n & 1) == 0;
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int64_t r = m0 + wm * 64 + mi * 16 + g + h * 8;
                const int64_t col = n0 + wn * 32 + ni * 8 + 2 * j;
                if (r < p.m && col < p.n)
                    store_out2(out_type, out, r * p.n + col, alpha * (acc[mi][ni][2 * h] * unfold),
                               alpha * (acc[mi][ni][2 * h + 1] * unfold), col + 1 < p.n, paired);
            }
}

/* out = RN(alpha * sum over splits of partials), splits summed in order 0, 1, ... */
/* ---------------------------------------------------------------------------------------
 * wgmma GEMM (sm_90a, large M): NVFP4 weights dequantized into shared memory per k tile
 *
 * out[m, n] = alpha * sum_k A[m, k] W[n, k]. CTA tile 128 (M) x 256 (N) x 64 (K); two
 * warpgroups, each one m64n256k16 wgmma chain over 64 rows of the M tile, both operands
 * K-major in shared memory with the 128-byte swizzle (8-row atoms of 1024 bytes). A 4-stage
 * cp.async ring brings the bf16/f16 activations (already swizzled on the way in), the packed
 * codes and the scale words; each of the 256 threads then dequantizes one weight row of the
 * k tile (64 codes: four NVFP4 blocks) into a double-buffered bf16/f16 tile - exactly, by the
 * folded-scale decode of the other kernels - while the previous k tile's wgmmas run.
 * Accumulation in f32 by the tensor cores, alpha after the 2^7 unfold, one rounding.
 * Only compiled for sm_90a (wgmma); elsewhere the fused mma.sync kernel runs.
 * ------------------------------------------------------------------------------------- */

constexpr int WG_BM = 128, WG_BN = 256, WG_BK = 64, WG_STAGES = 4, WG_THREADS = 256;
constexpr int WG_A_BYTES = WG_BM * WG_BK * 2;   /* 16 KB */
constexpr int WG_C_BYTES = WG_BN * WG_BK / 2;   /* 8 KB of codes */
constexpr int WG_S_BYTES = WG_BN * 4;           /* 1 KB of scale words */
constexpr int WG_STAGE_BYTES = WG_A_BYTES + WG_C_BYTES + WG_S_BYTES;
constexpr int WG_B_BYTES = WG_BN * WG_BK * 2;   /* 32 KB dequantized tile */
constexpr int WG_B_OFFSET = ((WG_STAGES * WG_STAGE_BYTES + 1023) / 1024) * 1024;
constexpr int WG_LUT_OFFSET = WG_B_OFFSET + 2 * WG_B_BYTES;
constexpr int WG_SMEM = WG_LUT_OFFSET + 256 * 4 + 1024; /* + 1 KB to align the base to 1024 */
/* DENSE variant (weights already dequantized to bf16/f16 in global memory, large M): the
 * stage holds the A tile and the swizzled W tile, no dequantization in the loop */
constexpr int WGD_STAGE_BYTES = WG_A_BYTES + WG_B_BYTES; /* 48 KB */
constexpr int WGD_SMEM = WG_STAGES * WGD_STAGE_BYTES + 1024;

/* wgmma helpers exist only where wgmma does (sm_90a device code) */
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* The wgmma wrappers differ only in N, the operand type and where A comes from, so they are
 * made by two macros from shared operand lists: the NACC f32 accumulators d[0 .. NACC) are
 * operands %0 .. %NACC-1 ("+f"), the A / B operands and the scale-d predicate follow. */
#define WG_ACC4(i) "+f"(d[i]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3])
#define WG_ACC16(i) WG_ACC4(i), WG_ACC4((i) + 4), WG_ACC4((i) + 8), WG_ACC4((i) + 12)
#define WG_ACC32 WG_ACC16(0), WG_ACC16(16)
#define WG_ACC64 WG_ACC32, WG_ACC16(32), WG_ACC16(48)
#define WG_ACC128 WG_ACC64, WG_ACC16(64), WG_ACC16(80), WG_ACC16(96), WG_ACC16(112)
#define WG_REG32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WG_REG64 WG_REG32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define WG_REG128 WG_REG64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"

/* A and B from shared-memory descriptors (SS): operands NACC, NACC + 1; predicate NACC + 2 */
#define WGMMA_SS(N, NACC, TY, REGS, A_B, PRED)                                                                   \
    __device__ __forceinline__ void wgmma_m64n##N##k16_##TY(float(&d)[NACC], uint64_t da, uint64_t db)          \
    {                                                                                                            \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " PRED ", 0;\n"                                           \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #TY "." #TY " "                           \
                     "{" REGS "}, " A_B ", p, 1, 1, 0, 0;\n}\n"                                                    \
                     : WG_ACC##NACC                                                                              \
                     : "l"(da), "l"(db), "r"(1));                                                               \
    }
/* A from registers (RS): a[0..3] are operands NACC .. NACC + 3, B's descriptor NACC + 4,
 * predicate NACC + 5 */
#define WGMMA_RS(N, NACC, TY, REGS, A_B, PRED)                                                                   \
    __device__ __forceinline__ void wgmma_rs_m64n##N##k16_##TY(float(&d)[NACC], const uint32_t(&a)[4],          \
                                                               uint64_t db)                                      \
    {                                                                                                            \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " PRED ", 0;\n"                                           \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #TY "." #TY " "                           \
                     "{" REGS "}, " A_B ", p, 1, 1, 0;\n}\n"                                                       \
                     : WG_ACC##NACC                                                                              \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));                             \
    }

WGMMA_SS(256, 128, bf16, WG_REG128, "%128, %129", "%130")
WGMMA_SS(256, 128, f16, WG_REG128, "%128, %129", "%130")
WGMMA_RS(64, 32, bf16, WG_REG32, "{%32, %33, %34, %35}, %36", "%37")
WGMMA_RS(64, 32, f16, WG_REG32, "{%32, %33, %34, %35}, %36", "%37")
WGMMA_RS(128, 64, bf16, WG_REG64, "{%64, %65, %66, %67}, %68", "%69")
WGMMA_RS(128, 64, f16, WG_REG64, "{%64, %65, %66, %67}, %68", "%69")
WGMMA_RS(256, 128, bf16, WG_REG128, "{%128, %129, %130, %131}, %132", "%133")
WGMMA_RS(256, 128, f16, WG_REG128, "{%128, %129, %130, %131}, %132", "%133")

template <bool F16, int TOK>
__device__ __forceinline__ void wgmma_rs(float (&d)[TOK / 2], const uint32_t (&a)[4], uint64_t db)
{
    if constexpr (TOK == 64) {
        if (F16) wgmma_rs_m64n64k16_f16(d, a, db);
        else wgmma_rs_m64n64k16_bf16(d, a, db);
    } else if constexpr (TOK == 128) {
        if (F16) wgmma_rs_m64n128k16_f16(d, a, db);
        else wgmma_rs_m64n128k16_bf16(d, a, db);
    } else {
        if (F16) wgmma_rs_m64n256k16_f16(d, a, db);
        else wgmma_rs_m64n256k16_bf16(d, a, db);
    }
}
/* keeps registers the async wgmmas read (or write) allocated up to this point */
template <int N> __device__ __forceinline__ void wg_fence_regs(uint32_t (&r)[N])
{
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+r"(r[i])::"memory");
}
template <int N> __device__ __forceinline__ void wg_fence_regs(float (&r)[N])
{
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}

/* K-major, 128-byte-swizzled operand at a 1024-aligned shared address: stride 1024 bytes
 * between 8-row groups, leading offset unused (1), swizzle mode 1 (128 B) */
__device__ __forceinline__ uint64_t wg_desc(uint32_t saddr)
{
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
/* The four k16 wgmmas of one 64-k tile on the K-major 128-byte-swizzled tiles at shared
 * addresses sa (A) and sb (B), fenced and committed as one group. */
template <bool F16> __device__ __forceinline__ void wg_ktile(float (&acc)[128], uint32_t sa, uint32_t sb)
{
    wg_fence();
#pragma unroll
    for (int k = 0; k < 4; k++) {
        if (F16) wgmma_m64n256k16_f16(acc, wg_desc(sa + 32 * k), wg_desc(sb + 32 * k));
        else wgmma_m64n256k16_bf16(acc, wg_desc(sa + 32 * k), wg_desc(sb + 32 * k));
    }
    wg_commit();
}

__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
/* byte offset of 16-byte chunk c (0..7) of row r in a 128-byte-swizzled tile */
__device__ __forceinline__ uint32_t wg_swz(int r, int c) { return (uint32_t)(r * 128 + ((c ^ (r & 7)) << 4)); }

/* Origin of CTA tile `tile` in the grouped raster: groups of 8 M tiles sweep the N tiles, so
 * the CTAs that run together share their activation and weight tiles in L2. */
__device__ __forceinline__ void wg_tile_origin(int64_t tile, int64_t mt_count, int64_t nt_count, int64_t &m0, int64_t &n0)
{
    const int64_t gsize_full = 8, group = tile / (gsize_full * nt_count), first_m = group * gsize_full;
    const int64_t gsize = min(gsize_full, mt_count - first_m), in_group = tile - group * gsize_full * nt_count;
    m0 = (first_m + in_group % gsize) * WG_BM;
    n0 = (in_group / gsize) * WG_BN;
}

/* a * scale, b * scale rounded to a packed f16 / bf16 pair (the wgmma epilogues' one rounding) */
template <bool F16> __device__ __forceinline__ uint32_t pack_scaled2(float a, float b, float scale)
{
    return F16 ? half2_bits(__floats2half2_rn(a * scale, b * scale)) : bf16x2_bits(__floats2bfloat162_rn(a * scale, b * scale));
}

/* Stores one warpgroup's m64n256 accumulators (rows row0.., columns n0..) times `scale`:
 * accumulator i of thread t belongs to n8 block i / 4, row 16 * warp + lane / 4 (+8 when
 * i % 4 >= 2), column 8 (i / 4) + 2 (lane % 4) (+1 for odd i). */
template <bool F16>
__device__ __forceinline__ void wg_store_acc_pairs(uint32_t *lo, uint32_t *hi, const float (&acc)[128], float scale)
{
#pragma unroll
    for (int j = 0; j < 32; j++) {
        lo[4 * j] = pack_scaled2<F16>(acc[4 * j], acc[4 * j + 1], scale);
        hi[4 * j] = pack_scaled2<F16>(acc[4 * j + 2], acc[4 * j + 3], scale);
    }
}

__device__ __forceinline__ void wg_store_acc(const fused_args &p, const float (&acc)[128], int64_t row0, int64_t n0,
                                             float scale)
{
    const int lane = threadIdx.x & 31, warp_in_wg = (threadIdx.x >> 5) & 3;
    const bool paired = (p.n & 1) == 0;
    /* The common case - the warpgroup's 64 x 256 block lies inside the output, 16-bit output,
     * even N - as 64 plain 4-byte stores at fixed offsets from two row pointers. The general
     * loop below is ~10k instructions of bounds checks and output-type branches; run once per
     * unit, its instruction-cache misses cost the persistent kernel a third of its time on
     * K = 4096 (ncu source view, stall "no instruction"). */
    if (paired && row0 + 64 <= p.m && n0 + WG_BN <= p.n &&
        (p.out_type == FP4D_DTYPE_BF16 || p.out_type == FP4D_DTYPE_F16)) {
        const int64_t row = row0 + warp_in_wg * 16 + (lane >> 2), col = n0 + 2 * (lane & 3);
        uint32_t *lo = (uint32_t *)((uint16_t *)p.out + row * p.n + col), *hi = lo + 4 * p.n; /* + 8 rows */
        if (p.out_type == FP4D_DTYPE_F16) wg_store_acc_pairs<true>(lo, hi, acc, scale);
        else wg_store_acc_pairs<false>(lo, hi, acc, scale);
        return;
    }
#pragma unroll
    for (int j = 0; j < 32; j++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int64_t row = row0 + warp_in_wg * 16 + (lane >> 2) + 8 * h;
            const int64_t col = n0 + 8 * j + 2 * (lane & 3);
            if (row >= p.m || col >= p.n) continue;
            const bool both = col + 1 < p.n;
            store_out2(p.out_type, p.out, row * p.n + col, acc[4 * j + 2 * h] * scale, acc[4 * j + 2 * h + 1] * scale,
                       both, paired);
        }
}

__device__ __forceinline__ void consumer_bar_sync() { asm volatile("bar.sync 1, 256;\n" ::: "memory"); }

/* Split-K of the wgmma kernels, reduced in the kernel: every split of a tile stores its
 * accumulators (element i of consumer thread t at i * 256 + t: coalesced), and the split that
 * arrives last at the tile's counter sums all of them in split order 0, 1, ... - the same
 * sum whichever split is last, so the result is deterministic - and goes on to store the
 * output; it also resets the counter. Returns false for the splits that only stored. Called
 * by the 256 consumer threads (named barrier 1), `flag` in shared memory. */
template <int NACC>
__device__ __forceinline__ bool wg_splitk_last(const fused_args &p, float (&acc)[NACC], int64_t tile, int split,
                                               int splits, uint32_t *flag)
{
    const int tid = threadIdx.x;
    float *base = p.partials + tile * (int64_t)splits * (NACC * 256);
    float *mine = base + (int64_t)split * (NACC * 256);
#pragma unroll
    for (int i = 0; i < NACC; i++) __stcg(mine + i * 256 + tid, acc[i]);
    __threadfence();
    consumer_bar_sync();
    if (tid == 0) *flag = atomicAdd(p.counters + tile, 1u);
    consumer_bar_sync();
    const bool last = *flag == (uint32_t)splits - 1;
    consumer_bar_sync(); /* flag is read before any thread can reuse it */
    if (!last) return false;
    __threadfence();
#pragma unroll
    for (int i = 0; i < NACC; i++) acc[i] = __ldcg(base + i * 256 + tid);
    for (int sp = 1; sp < splits; sp++) {
        const float *src = base + (int64_t)sp * (NACC * 256);
#pragma unroll
        for (int i = 0; i < NACC; i++) acc[i] += __ldcg(src + i * 256 + tid);
    }
    if (tid == 0) p.counters[tile] = 0;
    return true;
}
#endif

/* DENSE: p.codes points at the dequantized [N, K] bf16/f16 weights instead of packed codes */
template <bool F16, bool DENSE>
__global__ void __launch_bounds__(WG_THREADS, 1) wg_kernel(const fused_args p)
{
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(16) uint8_t wg_smem_raw[];
    /* 1024-aligned base for the swizzle atoms */
    const uint32_t raw_s = (uint32_t)__cvta_generic_to_shared(wg_smem_raw);
    const uint32_t base_s = (raw_s + 1023u) & ~1023u;
    uint8_t *base = wg_smem_raw + (base_s - raw_s);
    uint32_t *lut = (uint32_t *)(base + WG_LUT_OFFSET);
    const int tid = threadIdx.x, wgi = tid >> 7;

    int64_t m0, n0;
    wg_tile_origin(blockIdx.x, (p.m + WG_BM - 1) / WG_BM, (p.n + WG_BN - 1) / WG_BN, m0, n0);
    const int64_t ktiles = p.k / WG_BK;
    const int64_t kt0 = (int64_t)blockIdx.y * p.ktiles_per_split;
    const int nkt = (int)max((int64_t)0, min((int64_t)p.ktiles_per_split, ktiles - kt0));
    const int64_t C = p.k / 16;

    constexpr int STAGE_BYTES = DENSE ? WGD_STAGE_BYTES : WG_STAGE_BYTES;
    if (!DENSE)
        for (int b = tid; b < 256; b += WG_THREADS) lut[b] = nv_scale_folded1<F16>((uint32_t)b);

    /* loads of k tile kt into stage st: A 128 rows x 8 chunks (4 per thread), codes 256 rows
     * x 2 chunks (2 per thread), one scale word per weight row. Each thread's source pointers
     * at the split's first k tile are made once (rows past the end point at the matrix start
     * and copy nothing); a k tile then only adds kt times a fixed step. */
    const uint16_t *a_src[4];
    const uint8_t *w_src[DENSE ? 8 : 2];
    bool a_ok[4], w_ok[DENSE ? 8 : 2];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int u = tid + i * WG_THREADS, r = u >> 3, c = u & 7;
        a_ok[i] = m0 + r < p.m;
        a_src[i] = p.a + (a_ok[i] ? (m0 + r) * p.k + kt0 * WG_BK + 8 * c : 0);
    }
#pragma unroll
    for (int i = 0; i < (DENSE ? 8 : 2); i++) {
        const int u = tid + i * WG_THREADS, r = DENSE ? u >> 3 : u >> 1, c = DENSE ? u & 7 : u & 1;
        w_ok[i] = n0 + r < p.n;
        w_src[i] = DENSE ? (const uint8_t *)((const uint16_t *)p.codes + (w_ok[i] ? (n0 + r) * p.k + kt0 * WG_BK + 8 * c : 0))
                         : p.codes + (w_ok[i] ? (n0 + r) * (p.k / 2) + kt0 * (WG_BK / 2) + 16 * c : 0);
    }
    const bool s_ok = !DENSE && n0 + tid < p.n;
    const uint8_t *s_src = p.scales + (s_ok ? scale_row_off(p.layout, C, n0 + tid) + scale_col_off(p.layout, kt0 * (WG_BK / 16)) : 0);
    const int64_t s_step = scale_col_off(p.layout, WG_BK / 16); /* 4 blocks: whole scale words in every layout */
    auto issue = [&](int kt, int st) {
        if (kt >= nkt) return;
        const uint32_t sa = base_s + st * STAGE_BYTES, sc = sa + WG_A_BYTES, ss = sc + WG_C_BYTES;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int u = tid + i * WG_THREADS;
            cp_async_16(sa + wg_swz(u >> 3, u & 7), a_src[i] + (a_ok[i] ? kt * WG_BK : 0), a_ok[i]);
        }
        if (DENSE) {
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const int u = tid + i * WG_THREADS;
                cp_async_16(sc + wg_swz(u >> 3, u & 7), w_src[i] + (w_ok[i] ? kt * WG_BK * 2 : 0), w_ok[i]);
            }
        } else {
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int u = tid + i * WG_THREADS;
                cp_async_16(sc + (u >> 1) * 32 + (u & 1) * 16, w_src[i] + (w_ok[i] ? kt * (WG_BK / 2) : 0), w_ok[i]);
            }
            cp_async_4(ss + tid * 4, s_src + (s_ok ? kt * s_step : 0), s_ok);
        }
    };

    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; i++) acc[i] = 0.0f;

#pragma unroll
    for (int st = 0; st < WG_STAGES - 1; st++) {
        issue(st, st);
        cp_async_commit();
    }
    __syncthreads(); /* lut */

    for (int kt = 0; kt < nkt; kt++) {
        const int st = kt % WG_STAGES, bb = kt & 1;
        cp_async_wait<WG_STAGES - 2>();
        /* every thread's copies of this stage have landed (the dequantization reads codes
         * other threads copied; DENSE needs only the barrier before the wgmmas) */
        if (!DENSE) __syncthreads();
        /* dequantize weight row tid of this k tile into the bf16/f16 tile bb */
        if (!DENSE) {
            const uint8_t *stage = base + st * WG_STAGE_BYTES;
            const uint4 c0 = *(const uint4 *)(stage + WG_A_BYTES + tid * 32);
            const uint4 c1 = *(const uint4 *)(stage + WG_A_BYTES + tid * 32 + 16);
            const uint32_t sw = *(const uint32_t *)(stage + WG_A_BYTES + WG_C_BYTES + tid * 4);
            const uint32_t words[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
            uint8_t *brow = base + WG_B_OFFSET + bb * WG_B_BYTES;
#pragma unroll
            for (int q = 0; q < 8; q++) {
                const uint32_t s2 = lut[(sw >> (8 * (q >> 1))) & 0xFFu];
                uint32_t pr[4];
#pragma unroll
                for (int i = 0; i < 4; i++) pr[i] = mul2<F16>(e2m1_pair_raw<F16>(words[q], i), s2);
                /* pairs (k, k+4) -> (k, k+1) */
                const uint4 out = make_uint4(__byte_perm(pr[0], pr[1], 0x5410), __byte_perm(pr[2], pr[3], 0x5410),
                                             __byte_perm(pr[0], pr[1], 0x7632), __byte_perm(pr[2], pr[3], 0x7632));
                *(uint4 *)(brow + wg_swz(tid, q)) = out;
            }
        }
        fence_proxy_async();
        __syncthreads();
        /* 4 wgmma k16 steps on stage st (A) and tile bb (W) */
        {
            const uint32_t sa = base_s + st * STAGE_BYTES + wgi * 64 * 128;
            const uint32_t sb = DENSE ? base_s + st * STAGE_BYTES + WG_A_BYTES : base_s + WG_B_OFFSET + bb * WG_B_BYTES;
            wg_ktile<F16>(acc, sa, sb);
        }
        /* the previous k tile's wgmmas are done once at most this one is pending: its A stage
         * and W tile may be overwritten after every warpgroup got here */
        wg_wait<1>();
        __syncthreads();
        issue(kt + WG_STAGES - 1, (kt + WG_STAGES - 1) % WG_STAGES);
        cp_async_commit();
    }
    wg_wait<0>();
    cp_async_wait<0>();

    __shared__ uint32_t splitk_flag;
    if (p.splits > 1 && !wg_splitk_last(p, acc, blockIdx.x, blockIdx.y, p.splits, &splitk_flag)) return;
    wg_store_acc(p, acc, m0 + wgi * 64, n0, p.alpha * (DENSE ? 1.0f : 128.0f));
#else
    (void)p;
    __trap();
#endif
}

/* ---------------------------------------------------------------------------------------
 * wgmma GEMM on dense weights with TMA and a producer warp (sm_90a, large M)
 *
 * Same tile and operand layout as wg_kernel<.., true>, but the two operand tiles of each
 * stage are brought by the tensor-memory accelerator (one thread issues two box copies that
 * land already 128-byte-swizzled and complete on the stage's "full" mbarrier), and that
 * thread lives in a ninth warp of its own: the two consumer warpgroups never stop at a block
 * barrier, they wait on "full", issue their four wgmmas, and once the previous stage's
 * wgmmas have retired hand that stage back through its "empty" mbarrier.
 * ------------------------------------------------------------------------------------- */

constexpr int WGT_THREADS = 288; /* 2 consumer warpgroups + 1 producer warp */
constexpr int WGT_STAGES = 4;
/* output staging for the TMA-store epilogue: per consumer warpgroup two 64 x 64 16-bit boxes */
constexpr int WGT_OUT_BOX = 64 * 64 * 2, WGT_OUT_BYTES = 2 * 2 * WGT_OUT_BOX; /* 32 KB */
/* stages, then the mbarriers (in a 1 KB slot, keeping the staging 1024-aligned), then the
 * output staging (only with the TMA-store epilogue); + 1 KB to align the base */
constexpr int WGT_SMEM = WGT_STAGES * WGD_STAGE_BYTES + 1024 + 1024;
constexpr int WGT_SMEM_OUT = WGT_SMEM + WGT_OUT_BYTES;
static_assert(2 * WGT_STAGES * 8 <= 1024, "the mbarriers fit their slot");

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void mbar_init(uint32_t bar, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity)
{
    asm volatile("{\n.reg .pred p;\nWAIT_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra WAIT_%=;\n}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
                 "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}
/* TMA store of one box from shared memory (elements past the tensor's edges are not written),
 * in the issuing thread's bulk group */
__device__ __forceinline__ void tma_store_2d(const CUtensorMap *map, uint32_t src, int c0, int c1)
{
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"((uint64_t)map),
                 "r"(src), "r"(c0), "r"(c1)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
/* the issuing thread's bulk groups but the newest N have read their shared memory */
template <int N> __device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory"); }
/* ... and have completed */
template <int N> __device__ __forceinline__ void bulk_wait() { asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory"); }
__device__ __forceinline__ void sts32(uint32_t addr, uint32_t v) { asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory"); }
/* named barrier of one consumer warpgroup (ids 2, 3; id 1 is both consumer warpgroups') */
__device__ __forceinline__ void wg_bar_sync(int wgi)
{
    /* immediate ids: a barrier id in a register makes ptxas reserve all 16 for the block */
    if (wgi == 0) asm volatile("bar.sync 2, 128;\n" ::: "memory");
    else asm volatile("bar.sync 3, 128;\n" ::: "memory");
}

/* Stores one warpgroup's m64n256 accumulators times `scale` as 16-bit output through shared
 * memory and TMA: ncu showed the register epilogue (64 four-byte stores per thread, each warp
 * store touching 8 rows) as 11% of the persistent kernel's consumer time at K = 4096, during
 * which the tensor cores idle. Here each 64 x 64 box is written conflict-free into a
 * 128-byte-swizzled staging buffer (row r's 16-byte chunk c at c ^ (r & 7), the layout the
 * output tensor map's swizzle undoes) and handed to the TMA engine, which writes it out while
 * the warpgroup goes on; two buffers alternate, and a buffer is rewritten only after the store
 * issued from it two boxes earlier has read it. The values are those of wg_store_acc (the same
 * products and roundings). Called by all 128 threads of warpgroup wgi; `stage` is its 16 KB. */
template <bool F16>
__device__ __forceinline__ void wg_store_acc_tma(const CUtensorMap *map, const float (&acc)[128], int64_t row0,
                                                 int64_t n0, float scale, uint32_t stage, int wgi)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const uint32_t r = ((threadIdx.x >> 5) & 3) * 16 + g; /* and r + 8: the same swizzle row (r & 7 == g) */
    const bool issuer = (threadIdx.x & 127) == 0;
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const uint32_t box = stage + (q & 1) * WGT_OUT_BOX;
        if (issuer) bulk_wait_read<1>();
        wg_bar_sync(wgi);
#pragma unroll
        for (int c = 0; c < 8; c++) {
            const int j = 8 * q + c;
            const uint32_t off = (uint32_t)((c ^ g) << 4) + 4 * t;
            sts32(box + r * 128 + off, pack_scaled2<F16>(acc[4 * j], acc[4 * j + 1], scale));
            sts32(box + (r + 8) * 128 + off, pack_scaled2<F16>(acc[4 * j + 2], acc[4 * j + 3], scale));
        }
        fence_proxy_async(); /* the generic-proxy writes, visible to the TMA engine */
        wg_bar_sync(wgi);
        if (issuer) {
            tma_store_2d(map, box, (int)(n0 + 64 * q), (int)row0);
            bulk_commit();
        }
    }
}
#endif

/* out_tma: map_out describes the 16-bit output (64 x 64 boxes, 128-byte swizzle) and the
 * epilogue stores through it; otherwise from registers */
template <bool F16>
__global__ void __launch_bounds__(WGT_THREADS, 1)
    wgt_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_w,
               const __grid_constant__ CUtensorMap map_out, int out_tma, const fused_args p)
{
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(16) uint8_t wgt_smem_raw[];
    const uint32_t raw_s = (uint32_t)__cvta_generic_to_shared(wgt_smem_raw);
    const uint32_t base_s = (raw_s + 1023u) & ~1023u;
    const uint32_t bars = base_s + WGT_STAGES * WGD_STAGE_BYTES; /* full[s], then empty[s] */
    const uint32_t out_stage = bars + 1024;                      /* 16 KB per consumer warpgroup */
    const int tid = threadIdx.x, warp = tid >> 5;

    /* persistent: CTA b takes work units b, b + grid, ... (unit = tile x split, tiles in the
     * grouped raster); the stage ring runs on across units, so the producer loads the next
     * unit's first stages while the consumers write the previous unit's outputs. With a tail
     * plan, units are the whole tiles but the last tail_tiles, then those tiles' K parts:
     * every CTA takes the same number of whole tiles and at most one part (slot: the split-K
     * slot of a part's tile, numbered from the first tail tile). */
    const int64_t mt_count = (p.m + WG_BM - 1) / WG_BM, nt_count = (p.n + WG_BN - 1) / WG_BN;
    const int64_t tiles = mt_count * nt_count, ktiles = p.k / WG_BK;
    const bool tail = p.tail_splits > 1;
    const int64_t whole = tail ? tiles - p.tail_tiles : 0;
    const int64_t units = tail ? whole + (int64_t)p.tail_tiles * p.tail_splits : tiles * p.splits;
    const int64_t tail_kpp = tail ? (ktiles + p.tail_splits - 1) / p.tail_splits : 0;
    auto unit_coords = [&](int64_t u, int64_t &m0, int64_t &n0, int64_t &kt0, int &nkt, int &split, int &nsplit,
                           int64_t &slot) {
        int64_t tile, kpp;
        if (tail && u < whole) {
            tile = u, split = 0, nsplit = 1, kpp = ktiles, slot = 0;
        } else if (tail) {
            /* part-major: the CTAs that run at the same time take the same K part of
             * neighbouring tiles, and share the panels they read in L2 as whole tiles do (tile
             * major, a tile's parts ran side by side at different K and 7168x18432 at M = 1024
             * took 826 instead of 466 us) */
            tile = whole + (u - whole) % p.tail_tiles, split = (int)((u - whole) / p.tail_tiles);
            nsplit = p.tail_splits, kpp = tail_kpp, slot = tile - whole;
        } else {
            tile = u % tiles, split = (int)(u / tiles), nsplit = p.splits, kpp = p.ktiles_per_split, slot = tile;
        }
        wg_tile_origin(tile, mt_count, nt_count, m0, n0);
        kt0 = (int64_t)split * kpp;
        nkt = (int)max((int64_t)0, min(kpp, ktiles - kt0));
    };

    if (tid == 0) {
        for (int s = 0; s < WGT_STAGES; s++) {
            mbar_init(bars + 8 * s, 1);                /* full: the producer's expect_tx */
            mbar_init(bars + 8 * (WGT_STAGES + s), 2); /* empty: one arrive per consumer warpgroup */
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (warp == 8) {
        /* producer: one thread issues both box copies of each stage */
        if ((tid & 31) == 0) {
            uint32_t g = 0; /* stages issued so far (ring position and phase) */
            for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
                int64_t m0, n0, kt0, slot;
                int nkt, split, nsplit;
                unit_coords(u, m0, n0, kt0, nkt, split, nsplit, slot);
                for (int kt = 0; kt < nkt; kt++, g++) {
                    const uint32_t s = g % WGT_STAGES;
                    if (g >= WGT_STAGES) mbar_wait(bars + 8 * (WGT_STAGES + s), (g / WGT_STAGES - 1) & 1);
                    const uint32_t full = bars + 8 * s, sa = base_s + s * WGD_STAGE_BYTES;
                    mbar_expect_tx(full, (uint32_t)WGD_STAGE_BYTES);
                    const int k0 = (int)((kt0 + kt) * WG_BK);
                    tma_load_2d(sa, &map_a, k0, (int)m0, full);
                    tma_load_2d(sa + WG_A_BYTES, &map_w, k0, (int)n0, full);
                }
            }
        }
        return;
    }

    const int wgi = warp >> 2; /* consumer warpgroup: rows 64 wgi .. of the M tile */
    __shared__ uint32_t splitk_flag;
    uint32_t g = 0; /* stages consumed so far */
    for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
        int64_t m0, n0, kt0, slot;
        int nkt, split, nsplit;
        unit_coords(u, m0, n0, kt0, nkt, split, nsplit, slot);
        float acc[128];
#pragma unroll
        for (int i = 0; i < 128; i++) acc[i] = 0.0f;
        for (int kt = 0; kt < nkt; kt++, g++) {
            const uint32_t s = g % WGT_STAGES;
            mbar_wait(bars + 8 * s, (g / WGT_STAGES) & 1);
            const uint32_t sa = base_s + s * WGD_STAGE_BYTES + wgi * 64 * 128, sb = base_s + s * WGD_STAGE_BYTES + WG_A_BYTES;
            wg_ktile<F16>(acc, sa, sb);
            wg_wait<1>(); /* the previous stage's wgmmas have retired: hand it back */
            if (kt > 0 && (tid & 127) == 0) mbar_arrive(bars + 8 * (WGT_STAGES + (g - 1) % WGT_STAGES));
        }
        wg_wait<0>();
        if (nkt > 0 && (tid & 127) == 0) mbar_arrive(bars + 8 * (WGT_STAGES + (g - 1) % WGT_STAGES));
        if (nsplit > 1 && !wg_splitk_last(p, acc, slot, split, nsplit, &splitk_flag)) continue;
        const int64_t row0 = m0 + wgi * 64;
        const uint32_t stage = out_stage + wgi * (WGT_OUT_BYTES / 2);
        if (!out_tma) wg_store_acc(p, acc, row0, n0, p.alpha);
        else if (p.out_type == FP4D_DTYPE_F16) wg_store_acc_tma<true>(&map_out, acc, row0, n0, p.alpha, stage, wgi);
        else wg_store_acc_tma<false>(&map_out, acc, row0, n0, p.alpha, stage, wgi);
    }
    /* the last boxes' stores have finished before the block (and its shared memory) ends */
    if (out_tma && (tid & 127) == 0) bulk_wait<0>();
#else
    (void)map_a;
    (void)map_w;
    (void)map_out;
    (void)out_tma;
    (void)p;
    __trap();
#endif
}

/* ---------------------------------------------------------------------------------------
 * wgmma GEMM with the weights decoded straight into registers (sm_90a, M below the dense route)
 *
 * wg_kernel<.., false> dequantizes each k tile of weights into a shared-memory bf16 tile that
 * both warpgroups' wgmmas then read: the dequantization's ALU work, its stores and the wgmma
 * reads of that tile left ~3000 cycles per k tile against ~1000 of tensor work at M = 128.
 * Here the weights are the wgmma A operand in registers (the RS form): each warp streams the
 * codes of its weight rows with cp.async into its own small shared-memory ring, 3 k tiles
 * ahead (16 bytes per row and k tile for a lane pair t, t ^ 1), each thread decodes its A
 * fragments with the single-shift pair decode and the folded scale, and only the activations
 * (the B operand, tokens x k) sit in shared memory, brought by TMA in a ring of stages with
 * full/empty mbarriers (thread 0 refills a stage once both warpgroups released it). The
 * activations are k-permuted once per call (wgr_permute_kernel) so that the k positions of a
 * thread's A fragment are exactly the code pairs it decodes: in k16 step s of a 64-k tile,
 * lane t takes code word s + 4 (t >> 1) of its rows and from it pairs 2 (t & 1) (fragment k
 * 2t, 2t+1) and 2 (t & 1) + 1 (k 2t+8, 2t+9). CTA: 128 weight rows (64 per warpgroup) x TOK
 * tokens; accumulators are weight rows x tokens, so the output is stored transposed. Split-K
 * as in the other wgmma kernels.
 * ------------------------------------------------------------------------------------- */

constexpr int WGR_ROWS = 128, WGR_THREADS = 256, WGR_STAGES = 4;

/* k position q (0..63) of a k tile in the permuted activations holds activation k wgr_kmap(q) */
__host__ __device__ constexpr int wgr_kmap(int q)
{
    return 8 * ((q >> 4) + 4 * (((q & 7) >> 1) >> 1)) + 2 * (((q & 7) >> 1) & 1) + ((q & 15) >= 8 ? 1 : 0) + 4 * (q & 1);
}

constexpr bool wgr_kmap_is_permutation()
{
    bool seen[64] = {};
    for (int q = 0; q < 64; q++) {
        const int k = wgr_kmap(q);
        if (k < 0 || k >= 64 || seen[k]) return false;
        seen[k] = true;
    }
    return true;
}
static_assert(wgr_kmap_is_permutation(), "the activation k permutation must reorder a 64-k tile, not lose k");
static_assert(wgr_kmap(0) == 0 && wgr_kmap(1) == 4 && wgr_kmap(2) == 2 && wgr_kmap(8) == 1 && wgr_kmap(4) == 32 &&
                  wgr_kmap(16) == 8,
              "lane t's fragment positions 2t, 2t+1 | 2t+8, 2t+9 are pairs 2 (t & 1) | 2 (t & 1) + 1 of word s + 4 (t >> 1)");

template <typename T>
__global__ void wgr_permute_kernel(const T *__restrict__ src, T *__restrict__ dst, int64_t rows, int64_t k)
{
    /* one thread per 8 outputs: one 16-byte store; launched with programmatic dependent
     * launch so that the GEMM after it can start early, it waits for the kernel before it */
    pdl_trigger();
    pdl_wait();
    const int64_t groups = rows * (k / 8);
    for (int64_t gi = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; gi < groups; gi += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = gi / (k / 8), q0 = (gi % (k / 8)) * 8, tile = q0 / 64 * 64;
        const T *in = src + row * k + tile;
        T v[8];
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = in[wgr_kmap((int)(q0 - tile) + i)];
        *(uint4 *)(dst + row * k + q0) = *(const uint4 *)v;
    }
}

/* 256 threads, no producer warp: thread 0 issues the activation TMA. A ninth warp would make
 * the block allocate registers for 12 warps (they go by 4), capping a thread at 168 - too few
 * for 64-128 accumulators, two A fragment sets and the weight ring. */
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* four 8 x 8 16-bit matrices from mma fragment registers (lane l: row l / 4, columns
 * 2 (l % 4), +1), stored transposed: lane l gives the address of stored row l % 8 of matrix
 * l / 8 (16 bytes) */
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3)
{
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0),
                 "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}

/* wgr_kernel's output tile (TOK tokens x 128 weight rows) as 16-bit output through shared
 * memory and TMA: out[token, row] is the transpose of the accumulators (weight rows x
 * tokens), which the scalar stores wrote 2 bytes at a time, 4 output rows per warp store.
 * stmatrix .trans writes each 8 x 8 fragment block transposed - token rows of 16 bytes - into
 * 64 x 64 boxes (tokens x weight rows, 128-byte swizzle: token row q's 16-byte chunk c at
 * c ^ (q & 7), conflict-free), warpgroup wgi's 64 rows in its own boxes, which one thread
 * then stores by TMA (rows and tokens past the output's edges are not written). Same values
 * as the scalar path (one rounding of acc * scale). `stage`: TOK x 128 x 2 bytes, 1024-aligned. */
template <bool OUT_F16, int NACC>
__device__ __forceinline__ void wgr_store_acc_tma(const CUtensorMap *map, const float (&acc)[NACC], float scale,
                                                  uint32_t stage, int64_t tok0, int64_t n0)
{
    constexpr int TOK = 2 * NACC;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wgi = warp >> 2;
    const int mat = lane >> 3, q = lane & 7;
    const uint32_t chunk = 2 * (warp & 3) + (mat & 1); /* matrices 0, 2: rows r_lo; 1, 3: r_hi = r_lo + 8 */
    auto pack = [&](float a, float b) { return pack_scaled2<OUT_F16>(a, b, scale); };
#pragma unroll
    for (int j = 0; j < TOK / 8; j += 2) {
        const int tok = 8 * (j + (mat >> 1)) + q; /* matrices 2, 3: the next token block */
        const uint32_t box = stage + (uint32_t)((tok >> 6) * 2 + wgi) * WGT_OUT_BOX;
        const uint32_t addr = box + (uint32_t)(tok & 63) * 128 + ((chunk ^ (uint32_t)q) << 4);
        stmatrix_x4_trans(addr, pack(acc[4 * j], acc[4 * j + 1]), pack(acc[4 * j + 2], acc[4 * j + 3]),
                          pack(acc[4 * j + 4], acc[4 * j + 5]), pack(acc[4 * j + 6], acc[4 * j + 7]));
    }
    fence_proxy_async();
    wg_bar_sync(wgi);
    if ((threadIdx.x & 127) == 0) {
#pragma unroll
        for (int tb = 0; tb < TOK / 64; tb++)
            tma_store_2d(map, stage + (uint32_t)(tb * 2 + wgi) * WGT_OUT_BOX, (int)(n0 + 64 * wgi), (int)(tok0 + 64 * tb));
        bulk_commit();
        bulk_wait<0>(); /* done before the block (and its shared memory) ends */
    }
}
#endif

/* out_tma: map_out describes the 16-bit output (64 x 64 boxes, 128-byte swizzle) and the
 * epilogue stores through it (wgr_store_acc_tma); otherwise scalar stores */
template <bool F16, int TOK>
__global__ void __launch_bounds__(WGR_THREADS, TOK == 64 ? 2 : 1)
    wgr_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_out, int out_tma,
               const fused_args p)
{
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int NACC = TOK / 2, STAGE_BYTES = TOK * WG_BK * 2;
    extern __shared__ __align__(16) uint8_t wgr_smem_raw[];
    const uint32_t raw_s = (uint32_t)__cvta_generic_to_shared(wgr_smem_raw);
    const uint32_t base_s = (raw_s + 1023u) & ~1023u;
    uint32_t *lut = (uint32_t *)(wgr_smem_raw + (base_s - raw_s) + WGR_STAGES * STAGE_BYTES);
    const uint32_t lut_s = base_s + WGR_STAGES * STAGE_BYTES;
    const uint32_t bars = lut_s + 256 * 4; /* full[s], then empty[s] */
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

    /* this CTA's tokens tok0 .. m_end - 1 and its weights: a token tile of the plain GEMM, or
     * (grouped) one expert's item */
    const int64_t n0 = (int64_t)blockIdx.x * WGR_ROWS;
    int64_t tok0 = (int64_t)blockIdx.z * TOK, m_end = p.m;
    const uint8_t *codes = p.codes, *scales = p.scales;
    float alpha = p.alpha;
    if (p.items) {
        const fp4d_skinny_item it = p.items[blockIdx.z];
        tok0 = it.row0;
        m_end = (int64_t)it.row0 + it.rows;
        codes = p.g_codes[it.expert];
        scales = p.g_scales[it.expert];
        alpha = p.g_alpha[it.expert];
    }
    const int64_t ktiles = p.k / WG_BK;
    const int64_t kt0 = (int64_t)blockIdx.y * p.ktiles_per_split;
    const int nkt = (int)max((int64_t)0, min((int64_t)p.ktiles_per_split, ktiles - kt0));

    lut[tid] = nv_scale_folded1<F16>((uint32_t)tid);
    /* activation tile of k tile kt into its stage (thread 0) */
    auto load_stage = [&](int kt) {
        const int st = kt % WGR_STAGES;
        mbar_expect_tx(bars + 8 * st, (uint32_t)STAGE_BYTES);
        tma_load_2d(base_s + st * STAGE_BYTES, &map_a, (int)((kt0 + kt) * WG_BK), (int)tok0, bars + 8 * st);
    };
    if (tid == 0) {
        for (int st = 0; st < WGR_STAGES; st++) {
            mbar_init(bars + 8 * st, 1);                 /* full: thread 0's expect_tx */
            mbar_init(bars + 8 * (WGR_STAGES + st), 2);  /* empty: one arrival per warpgroup */
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }

    /* consumer: weight rows r_lo = n0 + 16 warp + g and r_lo + 8 (warp 0..7 over both
     * warpgroups: rows 64 wgi + 16 (warp % 4) + ..), lane t = lane % 4 */
    const int g = lane >> 2, t = lane & 3;
    const int64_t C = p.k / 16;
    const int64_t r_lo = n0 + 16 * warp + g, r_hi = r_lo + 8;
    const int64_t rc_lo = min(r_lo, p.n - 1), rc_hi = min(r_hi, p.n - 1); /* clamped: computed, never stored */
    const uint8_t *w_src[2] = {codes + rc_lo * (p.k / 2) + kt0 * (WG_BK / 2) + 16 * (t >> 1),
                               codes + rc_hi * (p.k / 2) + kt0 * (WG_BK / 2) + 16 * (t >> 1)};
    const uint8_t *s_src[2] = {scales + scale_row_off(p.layout, C, rc_lo) + scale_col_off(p.layout, kt0 * (WG_BK / 16)),
                               scales + scale_row_off(p.layout, C, rc_hi) + scale_col_off(p.layout, kt0 * (WG_BK / 16))};
    const int64_t s_step = scale_col_off(p.layout, WG_BK / 16);
    const int shift = 8 * (t & 1);        /* pairs 2 (t & 1), +1 of a word = pairs 0, 1 of word >> shift */
    const int sbyte = 8 * (2 * (t >> 1)); /* scale byte of k16 steps 0, 1 (+8 bits for steps 2, 3) */

    /* ring of k tiles in flight + 1 for this warp's weights, in shared memory: a wgmma fence
     * waits for every register write in flight, so loads straight into registers would make
     * each k tile wait out the DRAM latency of the prefetch issued just before it. cp.async
     * does not: per stage and row group g, lane t copies the 16-byte chunk t >> 1 of row
     * r_lo / r_hi (t & 1) - the chunk its partner lane t ^ 1 also decodes - and lanes t < 2 the
     * scale word of that row. */
    constexpr int DEPTH = 4, WSTAGE = 8 * 64 + 8 * 8; /* bytes per warp and stage: codes, scales */
    const uint32_t wring = base_s + WGR_STAGES * STAGE_BYTES + 256 * 4 + 2 * WGR_STAGES * 8 + warp * DEPTH * WSTAGE;
    auto issue = [&](int kt, int d) {
        __syncwarp(); /* every lane of the warp has read the stage this overwrites */
        if (kt < nkt) {
            const uint32_t st = wring + d * WSTAGE;
            const int rs = t & 1;
            const uint8_t *wsrc = rs ? w_src[1] : w_src[0], *ssrc = rs ? s_src[1] : s_src[0]; /* no local array */
            cp_async_16(st + g * 64 + rs * 32 + (t >> 1) * 16, wsrc + (int64_t)kt * (WG_BK / 2), true);
            if (t < 2) cp_async_4(st + 512 + g * 8 + rs * 4, ssrc + kt * s_step, true);
        }
        cp_async_commit(); /* one group per k tile, empty past the end: the wait count stays fixed */
    };
    /* the k tiles copied first into L2 while the previous kernel (the activations' permute)
     * may still run; then its activations */
    for (int kt = 0; kt < DEPTH - 1 && kt < nkt; kt++) {
        prefetch_l2((t & 1 ? w_src[1] : w_src[0]) + (int64_t)kt * (WG_BK / 2));
        if (t < 2) prefetch_l2((t & 1 ? s_src[1] : s_src[0]) + kt * s_step);
    }
    pdl_wait();
    if (tid == 0)
        for (int kt = 0; kt < WGR_STAGES - 1 && kt < nkt; kt++) load_stage(kt);
    __syncthreads();
#pragma unroll
    for (int d = 0; d < DEPTH - 1; d++) issue(d, d);

    float acc[NACC];
#pragma unroll
    for (int i = 0; i < NACC; i++) acc[i] = 0.0f;
    uint32_t af[2][4][4]; /* A fragments of 4 k16 steps, double-buffered across k tiles */

    /* one k tile into fragment set `a` (a compile-time choice of the caller), ring slot `slot` */
    auto step = [&](int kt, int slot, uint32_t (&a)[4][4]) {
        cp_async_wait<DEPTH - 1>(); /* this lane's copies of k tile kt have landed */
        __syncwarp();               /* and its partner's */
        const uint32_t ws = wring + slot * WSTAGE;
        const uint4 cl = lds128(ws + g * 64 + (t >> 1) * 16), ch = lds128(ws + g * 64 + 32 + (t >> 1) * 16);
        const uint32_t sc[2] = {lds32(ws + 512 + g * 8), lds32(ws + 512 + g * 8 + 4)};
        uint32_t s2[2][2];
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int h = 0; h < 2; h++) s2[r][h] = lut[(sc[r] >> (sbyte + 8 * h)) & 0xFFu];
#pragma unroll
        for (int s = 0; s < 4; s++) {
            const uint32_t wl = (s == 0 ? cl.x : s == 1 ? cl.y : s == 2 ? cl.z : cl.w) >> shift;
            const uint32_t wh = (s == 0 ? ch.x : s == 1 ? ch.y : s == 2 ? ch.z : ch.w) >> shift;
            a[s][0] = mul2<F16>(e2m1_pair_raw<F16>(wl, 0), s2[0][s >> 1]);
            a[s][1] = mul2<F16>(e2m1_pair_raw<F16>(wh, 0), s2[1][s >> 1]);
            a[s][2] = mul2<F16>(e2m1_pair_raw<F16>(wl, 1), s2[0][s >> 1]);
            a[s][3] = mul2<F16>(e2m1_pair_raw<F16>(wh, 1), s2[1][s >> 1]);
        }
        const int st = kt % WGR_STAGES;
        mbar_wait(bars + 8 * st, (kt / WGR_STAGES) & 1);
        const uint32_t sb = base_s + st * STAGE_BYTES;
        wg_fence();
#pragma unroll
        for (int s = 0; s < 4; s++) wgmma_rs<F16, TOK>(acc, a[s], wg_desc(sb + 32 * s));
        wg_commit();
    };

    /* unrolled by the ring depth (even), so that ring slots and fragment sets are registers */
    for (int kt = 0; kt < nkt; kt += DEPTH) {
#pragma unroll
        for (int h = 0; h < DEPTH; h++) {
            const int k = kt + h;
            if (k < nkt) {
                issue(k + DEPTH - 1, (h + DEPTH - 1) % DEPTH);
                step(k, h, af[h & 1]);
                wg_wait<1>(); /* k - 1's wgmmas are done: its fragments and stage are free */
#pragma unroll
                for (int s = 0; s < 4; s++) wg_fence_regs(af[(h & 1) ^ 1][s]);
                if (k > 0 && (tid & 127) == 0) mbar_arrive(bars + 8 * (WGR_STAGES + (k - 1) % WGR_STAGES));
                /* refill k - 1's stage with k tile k + STAGES - 1 once both warpgroups let it go */
                if (tid == 0 && k + WGR_STAGES - 1 < nkt) {
                    if (k > 0) mbar_wait(bars + 8 * (WGR_STAGES + (k - 1) % WGR_STAGES), ((k - 1) / WGR_STAGES) & 1);
                    load_stage(k + WGR_STAGES - 1);
                }
            }
        }
    }
    wg_wait<0>();
#pragma unroll
    for (int s = 0; s < 4; s++) {
        wg_fence_regs(af[0][s]);
        wg_fence_regs(af[1][s]);
    }
    wg_fence_regs(acc);
    /* the next kernel (the next call's permute) may launch now; triggered at the start, its
     * blocks waited beside this kernel's CTAs and M = 32 was 1-2% slower */
    pdl_trigger();

    __shared__ uint32_t splitk_flag;
    if (p.splits > 1 &&
        !wg_splitk_last(p, acc, (int64_t)blockIdx.z * gridDim.x + blockIdx.x, blockIdx.y, p.splits, &splitk_flag))
        return;
    /* accumulator i: token block i / 4, weight row r_lo (+8 when i % 4 >= 2), token
     * 8 (i / 4) + 2t (+1 for odd i): out[token, row], stored transposed */
    const float scale = alpha * 128.0f;
    static_assert(TOK * WGR_ROWS * 2 <= WGR_STAGES * STAGE_BYTES, "the output tile fits the activation stages");
    /* TMA clips at the output's edges only: a grouped item's short tile inside the output
     * (the next expert's rows follow) takes the bounded stores */
    if (out_tma && (m_end - tok0 >= TOK || m_end == p.m)) {
        /* through the activation stages, free once both warpgroups' wgmmas have read them */
        consumer_bar_sync();
        if (p.out_type == FP4D_DTYPE_F16) wgr_store_acc_tma<true>(&map_out, acc, scale, base_s, tok0, n0);
        else wgr_store_acc_tma<false>(&map_out, acc, scale, base_s, tok0, n0);
        return;
    }
#pragma unroll
    for (int i = 0; i < NACC; i++) {
        const int64_t row = (i & 2) ? r_hi : r_lo, tok = tok0 + 8 * (i >> 2) + 2 * t + (i & 1);
        if (row < p.n && tok < m_end) store_out(p.out_type, p.out, tok * p.n + row, acc[i] * scale);
    }
#else
    (void)map_a;
    (void)map_out;
    (void)out_tma;
    (void)p;
    __trap();
#endif
}

template <int TOK> constexpr int wgr_smem()
{
    return WGR_STAGES * TOK * WG_BK * 2 + 256 * 4 + 2 * WGR_STAGES * 8 + 8 * 4 * (8 * 64 + 8 * 8) + 1024;
}

__global__ void fused_reduce_kernel(const float *__restrict__ partials, int splits, size_t count, float alpha,
                                    int out_type, void *out)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int x = 0; x < splits; x++) s += partials[(size_t)x * count + i];
        store_out(out_type, out, (int64_t)i, alpha * s);
    }
}

/* ---------------------------------------------------------------------------------------
 * SIMT f32 GEMM (fallback)
 * ------------------------------------------------------------------------------------- */

constexpr int SG_T = 32;

__global__ void simt_kernel(const float *__restrict__ A, const float *__restrict__ B, int64_t M, int64_t N, int64_t K,
                            float alpha, int out_type, void *out)
{
    __shared__ float sa[SG_T][SG_T + 1], sb[SG_T][SG_T + 1];
    const int tx = threadIdx.x, ty = threadIdx.y; /* 32 x 8 threads, 4 rows each */
    const int64_t m0 = (int64_t)blockIdx.y * SG_T, n0 = (int64_t)blockIdx.x * SG_T;
    float acc[4] = {0, 0, 0, 0};
    for (int64_t k0 = 0; k0 < K; k0 += SG_T) {
        for (int r = ty; r < SG_T; r += 8) {
            const int64_t k = k0 + tx;
            sa[r][tx] = (m0 + r < M && k < K) ? A[(m0 + r) * K + k] : 0.0f;
            sb[r][tx] = (n0 + r < N && k < K) ? B[(n0 + r) * K + k] : 0.0f;
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < SG_T; kk++) {
            const float bv = sb[tx][kk];
#pragma unroll
            for (int x = 0; x < 4; x++) acc[x] = fmaf(sa[ty + 8 * x][kk], bv, acc[x]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int x = 0; x < 4; x++) {
        const int64_t r = m0 + ty + 8 * x, col = n0 + tx;
        if (r < M && col < N) store_out(out_type, out, r * N + col, alpha * acc[x]);
    }
}

/* ---------------------------------------------------------------------------------------
 * Quantize: flashinfer-exact NVFP4 (spec §4.2)
 * ------------------------------------------------------------------------------------- */

/* e2m1 round-to-nearest-even with saturation; NaN -> +6 (spec §1.3). */
__device__ __forceinline__ uint32_t f32_to_e2m1(float x)
{
    const uint32_t b = (uint32_t)__float_as_int(x);
    if ((b & 0x7fffffffu) > 0x7f800000u) return 0x7u;
    const uint32_t s = (b >> 31) << 3;
    const float a = fabsf(x);
    const uint32_t c = a <= 0.25f ? 0u : a < 0.75f ? 1u : a <= 1.25f ? 2u : a < 1.75f ? 3u
                     : a <= 2.5f  ? 4u : a < 3.5f  ? 5u : a <= 5.0f  ? 6u : 7u;
    return s | c;
}

/* e4m3 RNE with saturation to 448, NaN -> 0x7F (spec §2.3); the input is >= 0 or NaN. */
__device__ __forceinline__ uint32_t f32_to_e4m3_satfinite(float x)
{
    return (uint32_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}

template <typename T>
__global__ void quantize_nvfp4_kernel(const T *__restrict__ src, int64_t rows, int64_t cols, float gs, int layout,
                                      uint8_t *__restrict__ codes, uint8_t *__restrict__ scales)
{
    const int64_t C = cols / 16, total = rows * C;
    const float rcp_gs = __fdiv_rn(1.0f, gs);
    const float gs_div6 = __fmul_rn(gs, __fdiv_rn(1.0f, 6.0f));
    for (int64_t bi = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; bi < total; bi += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = bi / C, c = bi % C;
        float x[16];
        const T *p = src + r * cols + c * 16;
#pragma unroll
        for (int i = 0; i < 16; i++) x[i] = (float)p[i];
        /* vecMax ignores NaN elements (as __hmax does); all NaN gives NaN */
        float vmax = fabsf(x[0]);
#pragma unroll
        for (int i = 1; i < 16; i++) vmax = fmaxf(vmax, fabsf(x[i]));
        const float sf = vmax != 0.0f ? __fmul_rn(vmax, gs_div6) : 0.0f;
        const uint32_t sfbyte = f32_to_e4m3_satfinite(sf);
        const float sfq = ue4m3_to_f32(sfbyte);
        const float out_scale = vmax != 0.0f ? fminf(__fdiv_rn(1.0f, __fmul_rn(sfq, rcp_gs)), FLT_MAX) : 0.0f;
        uint32_t w0 = 0, w1 = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) w0 |= f32_to_e2m1(__fmul_rn(x[i], out_scale)) << (4 * i);
#pragma unroll
        for (int i = 0; i < 8; i++) w1 |= f32_to_e2m1(__fmul_rn(x[8 + i], out_scale)) << (4 * i);
        *(uint2 *)(codes + r * (cols / 2) + c * 8) = make_uint2(w0, w1);
        scales[scale_offset(layout, C, r, c)] = (uint8_t)sfbyte;
    }
}

template <>
__global__ void quantize_nvfp4_kernel<__nv_bfloat16>(const __nv_bfloat16 *__restrict__ src, int64_t rows, int64_t cols,
                                                     float gs, int layout, uint8_t *__restrict__ codes,
                                                     uint8_t *__restrict__ scales)
{
    /* bf16 specialisation: 16 elements = two 16-byte loads */
    const int64_t C = cols / 16, total = rows * C;
    const float rcp_gs = __fdiv_rn(1.0f, gs);
    const float gs_div6 = __fmul_rn(gs, __fdiv_rn(1.0f, 6.0f));
    for (int64_t bi = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; bi < total; bi += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = bi / C, c = bi % C;
        const uint4 *p = (const uint4 *)(src + r * cols + c * 16);
        const uint4 v0 = __ldcs(p), v1 = __ldcs(p + 1);
        const uint32_t wv[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
        float x[16];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            x[2 * i] = __int_as_float((int)(wv[i] << 16));
            x[2 * i + 1] = __int_as_float((int)(wv[i] & 0xFFFF0000u));
        }
        float vmax = fabsf(x[0]);
#pragma unroll
        for (int i = 1; i < 16; i++) vmax = fmaxf(vmax, fabsf(x[i]));
        const float sf = vmax != 0.0f ? __fmul_rn(vmax, gs_div6) : 0.0f;
        const uint32_t sfbyte = f32_to_e4m3_satfinite(sf);
        const float sfq = ue4m3_to_f32(sfbyte);
        const float out_scale = vmax != 0.0f ? fminf(__fdiv_rn(1.0f, __fmul_rn(sfq, rcp_gs)), FLT_MAX) : 0.0f;
        uint32_t w0 = 0, w1 = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) w0 |= f32_to_e2m1(__fmul_rn(x[i], out_scale)) << (4 * i);
#pragma unroll
        for (int i = 0; i < 8; i++) w1 |= f32_to_e2m1(__fmul_rn(x[8 + i], out_scale)) << (4 * i);
        *(uint2 *)(codes + r * (cols / 2) + c * 8) = make_uint2(w0, w1);
        scales[scale_offset(layout, C, r, c)] = (uint8_t)sfbyte;
    }
}

/*
 * e2m1 code of y with the same result as f32_to_e2m1 for every y that an FMUL can produce
 * (fp4d_cuda_e2m1_sweep checks all 2^32 f32 patterns passed through an FMUL on the device;
 * test_gpu_backends runs it). Fewer instructions than the comparison chain:
 *  - |y| clamped to 6 (saturation; fminf returns 6 for NaN, so NaN gets code 6's magnitude),
 *    then rounded to the e2m1 grid by one add/subtract of C = 2^22 * max(1, 2^floor(log2 a)),
 *    whose ulp is the grid step at a (0.5 below 2, 1 in [2, 4), 2 in [4, 6]) - round-to-
 *    nearest-even of the add is e2m1's tie rule;
 *  - r * 2^-126 puts e2m1's 3 magnitude bits at f32 bits 24..22 (code 1 = 0.5 lands on a
 *    subnormal; this file is compiled without flush-to-zero);
 *  - the sign is y's sign bit: a NaN that an FMUL returns is the canonical 0x7FFFFFFF, sign
 *    clear, as f32_to_e2m1 wants (a NaN input with its sign set never reaches here; the
 *    sweep fails if a GPU ever returns one).
 */
__device__ __forceinline__ uint32_t f32_to_e2m1_fast(float y)
{
    const float a = fminf(fabsf(y), 6.0f);
    const uint32_t cb = max(__float_as_uint(a) & 0x7F800000u, 0x3F800000u) + 0x0B000000u;
    const float c = __uint_as_float(cb);
    const float r = __fsub_rn(__fadd_rn(a, c), c);
    return (__float_as_uint(__fmul_rn(r, 0x1p-126f)) >> 22) | ((__float_as_uint(y) >> 28) & 8u);
}

/* Every f32 bit pattern x, as FMUL(x, s) - the values the quantize kernels round - through
 * f32_to_e2m1_fast and f32_to_e2m1; counts the codes that differ and keeps the smallest
 * pattern that does. */
__global__ void e2m1_sweep_kernel(float s, unsigned long long *mismatches, unsigned int *first_bad)
{
    unsigned long long local = 0;
    unsigned int first = 0xFFFFFFFFu;
    const uint64_t step = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (1ull << 32); i += step) {
        const float y = __fmul_rn(__uint_as_float((uint32_t)i), s);
        if (f32_to_e2m1_fast(y) != f32_to_e2m1(y)) {
            local++;
            first = min(first, (unsigned int)i);
        }
    }
    if (local) {
        atomicAdd(mismatches, local);
        atomicMin(first_bad, first);
    }
}

/* Per-CTA setup of the bf16 quantize kernels: the out-scale of each e4m3 scale byte,
 * 1 / (sfq * (1 / gs)) saturated to FLT_MAX - the per-block division of quantize_nvfp4_kernel,
 * done once per CTA for all 256 bytes and then looked up (the same value, so the codes stay
 * bit-identical) - into `tab`; returns gs / 6 as quantize_nvfp4_kernel rounds it. */
__device__ __forceinline__ float quantize_bf16_setup(float gs, float *tab)
{
    const float rcp_gs = __fdiv_rn(1.0f, gs);
    for (int b = threadIdx.x; b < 256; b += blockDim.x)
        tab[b] = fminf(__fdiv_rn(1.0f, __fmul_rn(ue4m3_to_f32((uint32_t)b), rcp_gs)), FLT_MAX);
    __syncthreads();
    return __fmul_rn(gs, __fdiv_rn(1.0f, 6.0f));
}

/*
 * One NVFP4 block of 16 bf16 values (8 words of pairs) under the default convention: the
 * block max on packed bf16 pairs (|x| by masking the sign; the max of bf16 values is exact
 * and ignores NaN like fmaxf), the e4m3 scale byte (returned), and the 16 codes as two
 * words (low nibble = even element). Same arithmetic as quantize_nvfp4_kernel.
 */
__device__ __forceinline__ uint32_t quantize_block16_bf16(const uint32_t wv[8], float gs_div6, const float *out_scale_tab,
                                                          uint32_t out[2])
{
    __nv_bfloat162 m2 = bits_bf16x2(wv[0] & 0x7FFF7FFFu);
#pragma unroll
    for (int e = 1; e < 8; e++) m2 = __hmax2(m2, bits_bf16x2(wv[e] & 0x7FFF7FFFu));
    const float vmax = fmaxf(__low2float(m2), __high2float(m2));
    const float sf = vmax != 0.0f ? __fmul_rn(vmax, gs_div6) : 0.0f;
    const uint32_t sfbyte = f32_to_e4m3_satfinite(sf);
    const float out_scale = vmax != 0.0f ? out_scale_tab[sfbyte] : 0.0f;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        uint32_t word = 0;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const uint32_t w = wv[4 * h + e];
            const float x0 = __uint_as_float(w << 16), x1 = __uint_as_float(w & 0xFFFF0000u);
            word |= f32_to_e2m1_fast(__fmul_rn(x0, out_scale)) << (8 * e);
            word |= f32_to_e2m1_fast(__fmul_rn(x1, out_scale)) << (8 * e + 4);
        }
        out[h] = word;
    }
    return sfbyte;
}

/*
 * bf16 -> NVFP4 when cols % 2048 == 0 (128 blocks of a row per warp step): one block of 16
 * per lane and step, four steps in flight (blocks lane, lane + 32, lane + 64, lane + 96 of
 * the warp's 128). A warp's loads then cover 4 KB contiguously (two 16-byte loads per
 * block, the second half of each 128-byte line served from L1) where one thread per group
 * of 4 blocks touched 32 lines per load instruction; codes go out as 8-byte stores that a
 * warp writes contiguously, scales as bytes (4 consecutive lanes fill one scale word).
 */
__global__ void __launch_bounds__(256) quantize_bf16_b1_kernel(const uint4 *__restrict__ src, int64_t rows, int64_t C,
                                                               float gs, int layout, uint2 *__restrict__ codes,
                                                               uint8_t *__restrict__ scales)
{
    __shared__ float out_scale_tab[256];
    const float gs_div6 = quantize_bf16_setup(gs, out_scale_tab);
    const int lane = threadIdx.x & 31;
    const int64_t chunks_per_row = C / 128, chunks = rows * chunks_per_row;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
    for (int64_t ch = (int64_t)blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5); ch < chunks; ch += warps) {
        const int64_t r = ch / chunks_per_row, c0 = (ch - r * chunks_per_row) * 128;
        const int64_t b0 = ch * 128 + lane;
        uint4 v[8];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            v[2 * i] = __ldg(src + (b0 + 32 * i) * 2);
            v[2 * i + 1] = __ldg(src + (b0 + 32 * i) * 2 + 1);
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t wv[8] = {v[2 * i].x, v[2 * i].y, v[2 * i].z, v[2 * i].w,
                                    v[2 * i + 1].x, v[2 * i + 1].y, v[2 * i + 1].z, v[2 * i + 1].w};
            uint32_t out[2];
            const uint32_t sfbyte = quantize_block16_bf16(wv, gs_div6, out_scale_tab, out);
            __stcs(codes + b0 + 32 * i, make_uint2(out[0], out[1]));
            const int64_t c = c0 + 32 * i + lane;
            int64_t off;
            if (layout == FP4D_LAYOUT_LINEAR) off = r * C + c;
            else if (layout == FP4D_LAYOUT_SWIZZLED_128X4)
                off = (r >> 7) * (128 * C) + (c >> 2) * 512 + (r & 31) * 16 + ((r >> 5) & 3) * 4 + (c & 3);
            else off = (r >> 3) * (8 * C) + (c >> 2) * 32 + (r & 7) * 4 + (c & 3);
            scales[off] = (uint8_t)sfbyte;
        }
    }
}

/*
 * bf16 -> NVFP4 when cols % 64 == 0, one thread per group of 4 blocks (64 elements, one
 * aligned 4-byte word of scales in every layout; it replaced a warp-cooperative kernel,
 * 2 lanes per block with shuffles, that reached 52% of copy bandwidth against 65-68%): eight 16-byte loads issued before any
 * use, no shuffles and no shared memory, codes written as two 16-byte stores and the four
 * scales as one 4-byte store; the block max is taken on packed bf16 pairs (|x| by masking
 * the sign, max of bf16 values is exact and ignores NaN like fmaxf); the group's row and
 * column advance by a fixed grid stride (no division in the loop). Same per-block and
 * per-element arithmetic as quantize_nvfp4_kernel, so bit-identical.
 */
__global__ void __launch_bounds__(256) quantize_bf16_g4_kernel(const uint4 *__restrict__ src, int64_t rows, int64_t C,
                                                               float gs, int layout, uint4 *__restrict__ codes,
                                                               uint8_t *__restrict__ scales)
{
    __shared__ float out_scale_tab[256];
    const float gs_div6 = quantize_bf16_setup(gs, out_scale_tab);
    const int64_t G = C / 4, total = rows * G;
    const int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, step = (int64_t)gridDim.x * blockDim.x;
    const int64_t step_r = step / G, step_c = step % G;
    int64_t r = first / G, cg = first % G;
    for (int64_t j = first; j < total; j += step) {
        uint4 v[8];
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = __ldg(src + j * 8 + i);
        uint32_t sfbytes = 0;
        uint32_t out[8];
#pragma unroll
        for (int b = 0; b < 4; b++) {
            const uint32_t wv[8] = {v[2 * b].x, v[2 * b].y, v[2 * b].z, v[2 * b].w,
                                    v[2 * b + 1].x, v[2 * b + 1].y, v[2 * b + 1].z, v[2 * b + 1].w};
            sfbytes |= quantize_block16_bf16(wv, gs_div6, out_scale_tab, &out[2 * b]) << (8 * b);
        }
        __stcs(codes + j * 2, make_uint4(out[0], out[1], out[2], out[3]));
        __stcs(codes + j * 2 + 1, make_uint4(out[4], out[5], out[6], out[7]));
        int64_t off;
        if (layout == FP4D_LAYOUT_LINEAR) off = r * C + cg * 4;
        else if (layout == FP4D_LAYOUT_SWIZZLED_128X4)
            off = (r >> 7) * (128 * C) + cg * 512 + (r & 31) * 16 + ((r >> 5) & 3) * 4;
        else off = (r >> 3) * (8 * C) + cg * 32 + (r & 7) * 4;
        *(uint32_t *)(scales + off) = sfbytes;
        r += step_r;
        cg += step_c;
        if (cg >= G) {
            cg -= G;
            r++;
        }
    }
}

/* max |x| ignoring NaN; non-negative floats order like their bit patterns */
template <typename T>
__global__ void amax_kernel(const T *__restrict__ src, size_t count, unsigned int *out)
{
    float m = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
        m = fmaxf(m, fabsf((float)src[i]));
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) atomicMax(out, (unsigned int)__float_as_int(m));
}

/* ---------------------------------------------------------------------------------------
 * GEMV: M <= 4 rows of activations, K % 32 == 0, CUDA cores, f32 accumulation
 *
 * At M <= 4 the tensor cores buy nothing: the whole cost is streaming the packed weights,
 * so this kernel spends as few instructions per weight byte as it can:
 *  - a warp task is 8 (M = 1) or 4 consecutive weight rows over one K range; lane l owns
 *    32 contiguous codes (one 16-byte load, two NVFP4 blocks / one MXFP4 block) of each
 *    row per 1024-k step, so a warp load is 512 contiguous bytes per row, and the next
 *    step's loads (and scales) are issued before the current step is computed, across
 *    task boundaries too;
 *  - the block's activations for its K range are staged once in shared memory as f32
 *    (decoded exactly for FP4 activations), in 16-byte units XOR-swizzled so that the
 *    lanes' float4 reads (stride 128 bytes) hit distinct banks;
 *  - e2m1 decoding without float conversion instructions: two byte-permute lookups turn 4
 *    codes into signed bytes 64 + 2v (prmt's sign-replicate mode zeroes the lookup of the
 *    other sign), then one prmt places a byte under the f32 exponent of 2^23 and one FADD
 *    removes 2^23 + 64, leaving 2v exactly; one FFMA per code and activation row;
 *  - 2v * a is exact in f32 (a has at most 11 significant bits: bf16, f16 or decoded FP4),
 *    the products of one scale block are summed in f32 and multiplied once by the block
 *    scale / 2 (one extra f32 rounding per block; accumulation stays f32 throughout);
 *  - split-K across blocks when a K range does not fit 48 KB of staged activations or the
 *    GPU needs more blocks; the last warp to finish a row group adds the partial sums in
 *    split order (deterministic), as decode_kernel does.
 * ------------------------------------------------------------------------------------- */

constexpr int GV_WARPS = 8, GV_STEP = 1024;
/* weight rows per warp task: 8 at M = 1 (8 x 16 bytes in flight per lane, and the next
 * step's 8 more), 4 for M = 2..4, whose accumulators and activations need the registers */
__host__ __device__ constexpr int gv_rows_per_task(int mr) { return mr == 1 ? 8 : 4; }
constexpr int GV_SMEM_FLOATS = 12288; /* 48 KB: no opt-in needed, several blocks per SM */

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel)
{
    uint32_t r;
    asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
}

/* f32 slot of local activation k: 16-byte unit u swapped within its aligned group of 8 by
 * (u / 8) % 8, i.e. by the lane index for a lane's reads */
__device__ __forceinline__ int gv_slot(int k)
{
    const int u = k >> 2;
    return ((u ^ ((u >> 3) & 7)) << 2) | (k & 3);
}

/* Eight e2m1 codes of w (nibble i = element i) as f32 2 * value, exact. Byte tables:
 * positive 64 + 2|v| indexed by the magnitude; negative 64 - 2|v| indexed by 7 - magnitude
 * (the magnitude bits of ~w). A selector nibble with its msb set (the code's sign in w, the
 * inverted sign in ~w) makes prmt replicate the looked-up byte's msb, 0 here, so each
 * lookup yields 0 for codes of the other sign and the two OR together. */
__device__ __forceinline__ void gv_decode8(uint32_t w, float f[8])
{
    constexpr uint32_t POS_LO = 0x43424140u, POS_HI = 0x4C484644u; /* 64 + {0,1,2,3,4,6,8,12} */
    constexpr uint32_t NEG_LO = 0x3C3A3834u, NEG_HI = 0x403F3E3Du; /* 64 - {12,8,6,4,3,2,1,0} */
    const uint32_t nw = ~w;
    const uint32_t lo = prmt(POS_LO, POS_HI, w) | prmt(NEG_LO, NEG_HI, nw);
    const uint32_t hi = prmt(POS_LO, POS_HI, w >> 16) | prmt(NEG_LO, NEG_HI, nw >> 16);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[i] = __fsub_rn(__uint_as_float(prmt(lo, 0x4B000000u, 0x7540u + i)), 8388672.0f);
        f[4 + i] = __fsub_rn(__uint_as_float(prmt(hi, 0x4B000000u, 0x7540u + i)), 8388672.0f);
    }
}

template <int MR, bool BNV>
__global__ void __launch_bounds__(GV_WARPS * 32, 2) gemv_kernel(const fp4d_gemv_args p)
{
    constexpr int R = gv_rows_per_task(MR);
    extern __shared__ __align__(16) float gv_act[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t K = p.k, N = p.n;
    const int split = blockIdx.y;
    const int64_t k0 = (int64_t)split * p.k_split;
    const int klen = (int)min((int64_t)p.k_split, K - k0);
    const int ksp = (int)p.k_split; /* row stride of the staged activations */
    const int nsteps = (klen + GV_STEP - 1) / GV_STEP;
    const int tpw = p.tasks_per_warp;
    const int64_t groups = (N + R - 1) / R;
    const int64_t g_first = ((int64_t)blockIdx.x * GV_WARPS + warp) * tpw;
    const int64_t bC = K / (BNV ? 16 : 32);
    const int total = tpw * nsteps;

    uint4 cur[R] = {}, nxt[R] = {};
    uint32_t cs[R] = {}, ns[R] = {};
    /* this lane's 16 code bytes of row r in task t, step st, and their scale(s); false past
     * the block's range */
    auto piece = [&](int t, int st, int r, const uint8_t **code, const uint8_t **scale) {
        const int64_t g = g_first + t;
        const int kl = st * GV_STEP + 32 * lane;
        if (g >= groups || kl >= klen) return false;
        const int64_t kg = k0 + kl, n = min(g * R + r, N - 1);
        *code = p.b_codes + n * (K / 2) + kg / 2;
        *scale = p.b_scales + scale_offset(p.b_layout, bC, n, kg / (BNV ? 16 : 32));
        return true;
    };
    /* weight loads of task t, step st */
    auto load = [&](int t, int st, uint4 w[R], uint32_t s[R]) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            const uint8_t *code, *scale;
            if (!piece(t, st, r, &code, &scale)) return;
            w[r] = load_stream_16(code);
            s[r] = BNV ? (uint32_t)__ldg((const unsigned short *)scale) : (uint32_t)__ldg(scale);
        }
    };
    /* the first two steps into L2 while the previous kernel may still run (the next one may
     * launch at once: see wa_kernel) */
    pdl_trigger();
    for (int i = 0; i < 2 && i < total; i++)
#pragma unroll
        for (int r = 0; r < R; r++) {
            const uint8_t *code, *scale;
            if (piece(i / nsteps, i % nsteps, r, &code, &scale)) {
                prefetch_l2(code);
                prefetch_l2(scale);
            }
        }
    pdl_wait();
    if (total > 0) load(0, 0, cur, cs);

    /* stage the activations of this block's K range (rows >= M are zero); bf16/f16 as
     * 16-byte loads, four in flight per thread */
    if (p.a_type == FP4D_DTYPE_BF16 || p.a_type == FP4D_DTYPE_F16) {
        const int per_row = klen / 8, units = MR * per_row;
        for (int u0 = threadIdx.x; u0 < units; u0 += 4 * blockDim.x) {
            uint4 v[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int u = u0 + i * blockDim.x, m = u / per_row, kk = (u - m * per_row) * 8;
                v[i] = u < units && m < p.m ? __ldg((const uint4 *)((const uint16_t *)p.a + m * K + k0 + kk))
                                            : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int u = u0 + i * blockDim.x, m = u / per_row, kk = (u - m * per_row) * 8;
                if (u >= units) break;
                const uint32_t w[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
                float f[8];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    if (p.a_type == FP4D_DTYPE_BF16) {
                        f[2 * e] = __uint_as_float(w[e] << 16);
                        f[2 * e + 1] = __uint_as_float(w[e] & 0xFFFF0000u);
                    } else {
                        const float2 h = __half22float2(bits_half2(w[e]));
                        f[2 * e] = h.x;
                        f[2 * e + 1] = h.y;
                    }
                }
                *reinterpret_cast<float4 *>(gv_act + m * ksp + gv_slot(kk)) = make_float4(f[0], f[1], f[2], f[3]);
                *reinterpret_cast<float4 *>(gv_act + m * ksp + gv_slot(kk + 4)) = make_float4(f[4], f[5], f[6], f[7]);
            }
        }
    } else {
        /* FP4: 16 bytes of codes (32 elements: two NVFP4 blocks, one MXFP4 block) and their
         * scales per unit, four units in flight per thread */
        const bool nv = p.a_type == FP4D_DTYPE_NVFP4;
        const int64_t aC = K / (nv ? 16 : 32);
        const int per_row = klen / 32, units = MR * per_row;
        for (int u0 = threadIdx.x; u0 < units; u0 += 4 * blockDim.x) {
            uint4 v[4];
            uint32_t sb[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int u = u0 + i * blockDim.x, m = u / per_row;
                const int64_t kg = k0 + (int64_t)(u - m * per_row) * 32;
                v[i] = make_uint4(0, 0, 0, 0);
                sb[i] = 0;
                if (u < units && m < p.m) {
                    v[i] = __ldg((const uint4 *)((const uint8_t *)p.a + m * (K / 2) + kg / 2));
                    if (nv) sb[i] = __ldg((const unsigned short *)(p.a_scales + scale_offset(p.a_layout, aC, m, kg / 16)));
                    else sb[i] = __ldg(p.a_scales + scale_offset(p.a_layout, aC, m, kg / 32));
                }
            }
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int u = u0 + i * blockDim.x, m = u / per_row, kk = (u - m * per_row) * 32;
                if (u >= units) break;
                const bool live = m < p.m;
                const float s0 = live ? scale_to_f32(nv, sb[i] & 0xFFu) : 0.0f;
                const float s1 = live ? (nv ? ue4m3_to_f32(sb[i] >> 8) : s0) : 0.0f;
                const uint32_t w[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const float sc = q < 2 ? s0 : s1;
                    float f[8];
#pragma unroll
                    for (int e = 0; e < 8; e++) f[e] = e2m1_to_f32((w[q] >> (4 * e)) & 0xFu) * sc;
                    *reinterpret_cast<float4 *>(gv_act + m * ksp + gv_slot(kk + 8 * q)) = make_float4(f[0], f[1], f[2], f[3]);
                    *reinterpret_cast<float4 *>(gv_act + m * ksp + gv_slot(kk + 8 * q + 4)) =
                        make_float4(f[4], f[5], f[6], f[7]);
                }
            }
        }
    }
    __syncthreads();

    float acc[R][MR];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < MR; m++) acc[r][m] = 0.0f;

    for (int it = 0, t = 0, st = 0; it < total; it++) {
        const int nt = st + 1 == nsteps ? t + 1 : t, nst = st + 1 == nsteps ? 0 : st + 1;
        if (it + 1 < total) load(nt, nst, nxt, ns);
        const int64_t g = g_first + t;
        const int kl = st * GV_STEP + 32 * lane;
        if (g < groups && kl < klen) {
            /* block scales / 2 (the decoded codes are 2v) */
            float sc[R][2];
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (BNV) {
                    uint32_t sw = cs[r] & 0xFFFFu;
                    const uint32_t hm = sw & 0x8080u;
                    sw |= hm - (hm >> 7); /* bit 7 set -> 0xFF, NaN in e4m3 (0x7F already is) */
                    const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)sw, __NV_E4M3);
                    const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&raw));
                    sc[r][0] = f.x * 0.5f;
                    sc[r][1] = f.y * 0.5f;
                } else {
                    sc[r][0] = sc[r][1] = ue8m0_to_f32(cs[r] & 0xFFu) * 0.5f;
                }
            }
            float bsum[R][MR];
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int m = 0; m < MR; m++) bsum[r][m] = 0.0f;
            const int ubase = (st * GV_STEP) / 4 + 8 * lane; /* first 16-byte unit of this lane */
#pragma unroll
            for (int q = 0; q < 4; q++) {
                float a[MR][8];
#pragma unroll
                for (int m = 0; m < MR; m++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int u = ubase + 2 * q + h;
                        const float4 v = *reinterpret_cast<const float4 *>(gv_act + m * ksp + ((u ^ (lane & 7)) << 2));
                        a[m][4 * h + 0] = v.x;
                        a[m][4 * h + 1] = v.y;
                        a[m][4 * h + 2] = v.z;
                        a[m][4 * h + 3] = v.w;
                    }
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const uint32_t w = q == 0 ? cur[r].x : q == 1 ? cur[r].y : q == 2 ? cur[r].z : cur[r].w;
                    float f[8];
                    gv_decode8(w, f);
#pragma unroll
                    for (int m = 0; m < MR; m++)
#pragma unroll
                        for (int i = 0; i < 8; i++) bsum[r][m] = fmaf(f[i], a[m][i], bsum[r][m]);
                }
                if ((BNV && q == 1) || q == 3) {
#pragma unroll
                    for (int r = 0; r < R; r++)
#pragma unroll
                        for (int m = 0; m < MR; m++) {
                            acc[r][m] = fmaf(bsum[r][m], sc[r][q == 1 ? 0 : 1], acc[r][m]);
                            bsum[r][m] = 0.0f;
                        }
                }
            }
        }
        if (st == nsteps - 1) {
            /* task done: reduce over lanes, then store or combine splits */
            float mine = 0.0f;
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int m = 0; m < MR; m++) {
                    float v = acc[r][m];
#pragma unroll
                    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
                    if (lane == r * MR + m) mine = v;
                    acc[r][m] = 0.0f;
                }
            const int r = lane / MR, m = lane % MR;
            const int64_t n = g * R + r;
            const bool ok = g < groups && lane < R * MR && m < p.m && n < N;
            if (p.splits == 1) {
                if (ok) store_out(p.out_type, p.out, m * N + n, p.alpha * mine);
            } else if (g < groups) {
                if (ok) __stcg(p.partials + ((int64_t)split * MR + m) * N + n, mine);
                __threadfence();
                __syncwarp();
                uint32_t prev = 0;
                if (lane == 0) prev = atomicAdd(p.counters + g, 1u);
                prev = __shfl_sync(0xffffffffu, prev, 0);
                if (prev == (uint32_t)p.splits - 1) {
                    __threadfence();
                    if (ok) {
                        /* in split order, SPLITK_BATCH loads in flight (see splitk_last_block) */
                        float sum = 0.0f;
                        for (int sp0 = 0; sp0 < p.splits; sp0 += SPLITK_BATCH) {
                            float v[SPLITK_BATCH];
#pragma unroll
                            for (int i = 0; i < SPLITK_BATCH; i++)
                                v[i] = sp0 + i < p.splits ? __ldcg(p.partials + ((int64_t)(sp0 + i) * MR + m) * N + n) : 0.0f;
#pragma unroll
                            for (int i = 0; i < SPLITK_BATCH; i++)
                                if (sp0 + i < p.splits) sum += v[i];
                        }
                        store_out(p.out_type, p.out, m * N + n, p.alpha * sum);
                    }
                    if (lane == 0) p.counters[g] = 0;
                }
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            cur[r] = nxt[r];
            cs[r] = ns[r];
        }
        t = nt;
        st = nst;
    }
}

int grid_for(int64_t work, int threads)
{
    int64_t blocks = (work + threads - 1) / threads;
    if (blocks < 1) blocks = 1;
    if (blocks > 65536 * 8) blocks = 65536 * 8;
    return (int)blocks;
}

} /* namespace */

/* ---------------------------------------------------------------------------------------
 * Launchers
 * ------------------------------------------------------------------------------------- */

extern "C" int fp4d_cuda_dequantize(const fp4d_dev_fp4 *src, int dst_type, void *dst, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    const int64_t work = src->rows * (src->cols / 16);
    if (work == 0) return cudaSuccess;
    const int grid = grid_for(work, 256);
    if (dst_type == FP4D_DTYPE_F32) dequantize_kernel<float><<<grid, 256, 0, s>>>(*src, (float *)dst);
    else if (dst_type == FP4D_DTYPE_BF16) dequantize_kernel<__nv_bfloat16><<<grid, 256, 0, s>>>(*src, (__nv_bfloat16 *)dst);
    else dequantize_kernel<__half><<<grid, 256, 0, s>>>(*src, (__half *)dst);
    return (int)cudaGetLastError();
}

extern "C" int fp4d_cuda_convert(int src_type, const void *src, int dst_type, void *dst, size_t count, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    if (count == 0) return cudaSuccess;
    const int grid = grid_for((int64_t)count, 256);
    if (dst_type == FP4D_DTYPE_F32) convert_kernel<float><<<grid, 256, 0, s>>>(src_type, src, (float *)dst, count);
    else if (dst_type == FP4D_DTYPE_BF16) convert_kernel<__nv_bfloat16><<<grid, 256, 0, s>>>(src_type, src, (__nv_bfloat16 *)dst, count);
    else convert_kernel<__half><<<grid, 256, 0, s>>>(src_type, src, (__half *)dst, count);
    return (int)cudaGetLastError();
}

extern "C" int fp4d_cuda_scale_convert(const float *src, float alpha, int dst_type, void *dst, size_t count,
                                       void *stream)
{
    if (count == 0) return cudaSuccess;
    scale_convert_kernel<<<grid_for((int64_t)count, 256), 256, 0, (cudaStream_t)stream>>>(src, alpha, dst_type, dst, count);
    return (int)cudaGetLastError();
}

extern "C" int fp4d_cuda_fill_random_fp4(uint8_t *codes, size_t bytes, uint32_t seed, void *stream)
{
    if (bytes == 0) return cudaSuccess;
    fill_random_kernel<<<grid_for((int64_t)bytes, 256), 256, 0, (cudaStream_t)stream>>>(codes, bytes, seed);
    return (int)cudaGetLastError();
}

extern "C" int fp4d_cuda_hold_stream(uint64_t ns, void *stream)
{
    hold_kernel<<<1, 1, 0, (cudaStream_t)stream>>>((unsigned long long)ns);
    return (int)cudaGetLastError();
}

extern "C" int fp4d_cuda_tiled_gemm(int op_type, const void *a, const void *b, int64_t m, int64_t n, int64_t k,
                                    float alpha, int out_type, void *out, void *stream)
{
    const dim3 grid((unsigned)((n + TG_BN - 1) / TG_BN), (unsigned)((m + TG_BM - 1) / TG_BM));
    if (grid.y > 65535) return (int)cudaErrorInvalidConfiguration;
    if (op_type == FP4D_DTYPE_F16)
        tiled_kernel<true><<<grid, TG_THREADS, 0, (cudaStream_t)stream>>>((const uint16_t *)a, (const uint16_t *)b, m, n,
                                                                          k, alpha, out_type, out);
    else
        tiled_kernel<false><<<grid, TG_THREADS, 0, (cudaStream_t)stream>>>((const uint16_t *)a, (const uint16_t *)b, m,
                                                                           n, k, alpha, out_type, out);
    return (int)cudaGetLastError();
}

extern "C" int fp4d_cuda_fused_available(int device)
{
    int optin = 0;
    if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) return 0;
    return optin >= FG_SMEM;
}

/* The current device as an index into the per-device caches below (-1: the runtime cannot
 * say, or more devices than the caches hold). */
static int cached_device_index(void)
{
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
        (void)cudaGetLastError();
        return -1;
    }
    return dev;
}

/* One fact per device (an attribute, a yes or no), asked of the runtime on first use; 0 means
 * "not asked yet", so an answer must be stored as something else. Threads may ask together:
 * the loads and stores are atomic (relaxed), so each sees 0 or a whole answer, and two first
 * callers ask twice and store the same value. Two facts that must be read together are
 * stored as one value (pdl_padded_smem). */
template <typename T> struct device_facts {
    T slot[64];
    T get(int dev) const { return __atomic_load_n(&slot[dev], __ATOMIC_RELAXED); }
    void set(int dev, T v) { __atomic_store_n(&slot[dev], v, __ATOMIC_RELAXED); }
};

/* FP4DOCTOR_CUDA_PDL=0 launches the decode kernels without programmatic dependent launch
 * (A/B timing). It is on only where the code that runs was compiled for sm_90 or newer: a
 * kernel JIT-compiled from older PTX (a custom FP4D_CUDA_ARCHS) has no griddepcontrol.wait,
 * and launching it early would race. */
static bool pdl_enabled(void)
{
    enum { UNKNOWN = 0, ON, OFF };
    static device_facts<int> state;
    const int dev = cached_device_index();
    if (dev < 0) return false;
    if (state.get(dev) == UNKNOWN) {
        cudaFuncAttributes attr;
        const bool compiled_for_90 = cudaFuncGetAttributes(&attr, probe_kernel) == cudaSuccess && attr.ptxVersion >= 90;
        if (!compiled_for_90) (void)cudaGetLastError();
        state.set(dev, compiled_for_90 && fp4d_env_switch("FP4DOCTOR_CUDA_PDL") ? ON : OFF);
    }
    return state.get(dev) == ON;
}

extern "C" int fp4d_cuda_pdl_active(void) { return pdl_enabled() ? 1 : 0; }

/* kernel<<<grid, block, smem, s>>>(args...), with programmatic dependent launch where `early`
 * and enabled (only for kernels that call pdl_wait() before their first dependent access, see
 * pdl_wait), in clusters of cluster_y blocks along y where cluster_y > 1 */
template <typename... Params, typename... Args>
static cudaError_t launch_pdl_clusters(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                                       unsigned cluster_y, bool early, Args... args)
{
    cudaLaunchAttribute attrs[2] = {};
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cfg.attrs = attrs;
    if (early && pdl_enabled()) {
        attrs[cfg.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attrs[cfg.numAttrs++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster_y > 1) {
        attrs[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
        attrs[cfg.numAttrs++].val.clusterDim = {1, cluster_y, 1};
    }
    const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, args...);
    if (e != cudaSuccess) (void)cudaGetLastError(); /* returned here; not left for a later check */
    return e;
}

template <typename... Params, typename... Args>
static cudaError_t launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                              Args... args)
{
    return launch_pdl_clusters(kernel, grid, block, smem, s, 1u, true, args...);
}

/* The wgmma kernel runs on compute capability 9.0 when its sm_90a code is the image loaded;
 * FP4DOCTOR_CUDA_WGMMA=0 keeps the mma.sync fused kernel (A/B timing). */
static bool wg_active(void)
{
    if (!fp4d_env_switch("FP4DOCTOR_CUDA_WGMMA")) return false;
    const int dev = cached_device_index();
    if (dev < 0) return false;
    static device_facts<signed char> cached; /* 1 yes, -1 no */
    if (cached.get(dev) == 0) {
        int major = 0, minor = 0, optin = 0;
        cudaFuncAttributes attr;
        bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
                  cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess &&
                  major == 9 && minor == 0 && optin >= WG_SMEM &&
                  cudaFuncGetAttributes(&attr, wg_kernel<false, false>) == cudaSuccess && attr.binaryVersion == 90;
        ok = ok && image_constant_is_one(image_has_wgmma);
        if (!ok) (void)cudaGetLastError();
        cached.set(dev, ok ? 1 : -1);
    }
    return cached.get(dev) == 1;
}

/* split count for tiles of tm x tn run `per_sm` at a time per SM (see fp4d_cuda_fused_splits) */
static int32_t fused_splits_model(int64_t m, int64_t n, int64_t k, int sm_count, int64_t tm, int64_t tn, int64_t per_sm)
{
    const int64_t slots = per_sm * (sm_count > 0 ? sm_count : 132);
    const int64_t tiles = ((m + tm - 1) / tm) * ((n + tn - 1) / tn);
    const int64_t ktiles = k / FG_BK;
    if (tiles * 2 >= slots || ktiles < 8) return 1;
    int64_t best = 1;
    double best_cost = 1e300;
    for (int64_t sp = 1; sp <= 16 && sp <= ktiles / 4; sp++) {
        const int64_t per = (ktiles + sp - 1) / sp;
        if ((ktiles + per - 1) / per != sp) continue; /* would leave a split empty */
        const int64_t waves = (tiles * sp + slots - 1) / slots;
        const double cost = (double)(waves * per) + 0.5 * (double)sp;
        if (cost < best_cost) {
            best_cost = cost;
            best = sp;
        }
    }
    return (int32_t)best;
}

/* Packed-weight wgmma route: weights decoded into the register A operand (wgr_kernel) unless
 * FP4DOCTOR_CUDA_WG_RS=0 (the shared-memory dequantizing wg_kernel, for A/B timing). */
static bool wgr_enabled(void)
{
    return fp4d_env_switch("FP4DOCTOR_CUDA_WG_RS");
}
/* tokens per wgr_kernel CTA: the smallest of 64, 128, 256 that holds M (larger M: 256-token
 * tiles); 64-token CTAs fit two per SM. Measured at M = 128: one 128-token CTA per weight
 * tile beat two 64-token ones (which stream the weights twice) by 1.3x. */
static int wgr_tok(int64_t m) { return m <= 64 ? 64 : m <= 128 ? 128 : 256; }

extern "C" int32_t fp4d_cuda_fused_splits(int64_t m, int64_t n, int64_t k, int sm_count)
{
    if (wg_active())
        return wgr_enabled() ? fused_splits_model(m, n, k, sm_count, wgr_tok(m), WGR_ROWS, wgr_tok(m) == 64 ? 2 : 1)
                             : fused_splits_model(m, n, k, sm_count, WG_BM, WG_BN, 1);
    /* time model in k tiles: waves * (k tiles per split), plus half a k tile per split for
     * writing and reducing its partial sums; at least 4 k tiles (256 k) per split. A wave
     * cut short costs a whole wave (M=128, N=14336 on 132 SMs: 2 splits = 224 CTAs in one
     * wave beat 3 splits = 336 CTAs in two). Two resident mma.sync CTAs per SM. */
    return fused_splits_model(m, n, k, sm_count, FG_BM, FG_BN, 2);
}

extern "C" int fp4d_cuda_dense_wgmma_available(void) { return wg_active() ? 1 : 0; }

/* The driver's tensor-map encoder, through the runtime (no link against libcuda). */
static PFN_cuTensorMapEncodeTiled_v12000 lookup_tensor_map_encoder(void)
{
    void *ptr = NULL;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
        return (PFN_cuTensorMapEncodeTiled_v12000)ptr;
    (void)cudaGetLastError();
    return NULL;
}

static PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder(void)
{
    /* A function-local static is initialised once, and other threads wait for it. (A flag set
     * before the lookup let a second thread see "tried" with no encoder yet, and fall back to
     * the slower paths for that call.) */
    static const PFN_cuTensorMapEncodeTiled_v12000 fn = lookup_tensor_map_encoder();
    return fn;
}

/* 2-D K-major tile map of a [rows, K] bf16/f16 matrix: boxes of 64 k x box_rows rows, 128-byte
 * swizzle (the layout wg_desc describes), rows past the end read as zeros. */
static bool encode_kmajor_map(CUtensorMap *map, const void *base, int64_t rows, int64_t k, uint32_t box_rows, bool f16)
{
    PFN_cuTensorMapEncodeTiled_v12000 enc = tensor_map_encoder();
    if (!enc) return false;
    const cuuint64_t dims[2] = {(cuuint64_t)k, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)k * 2};
    const cuuint32_t box[2] = {(cuuint32_t)WG_BK, box_rows};
    const cuuint32_t estr[2] = {1, 1};
    return enc(map, f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)base, dims,
               strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* 2-D map of a row-major [rows, n] 16-bit output for the TMA-store epilogue: 64 x 64 boxes,
 * 128-byte swizzle (wg_store_acc_tma's staging layout). False where TMA cannot address it. */
static bool encode_out_map(CUtensorMap *map, void *base, int64_t rows, int64_t n, int out_type);

/* The wgmma kernels' out_tma argument and its map: 1 where 16-bit output can leave through TMA
 * stores (FP4DOCTOR_CUDA_WG_TMA_STORE=0: never - the register epilogues, for A/B timing); the
 * map is zeroed otherwise (passed all the same). */
static int out_tma_map(CUtensorMap *map, void *out, int64_t rows, int64_t n, int out_type)
{
    memset(map, 0, sizeof *map);
    return fp4d_env_switch("FP4DOCTOR_CUDA_WG_TMA_STORE") && encode_out_map(map, out, rows, n, out_type) ? 1 : 0;
}

static bool encode_out_map(CUtensorMap *map, void *base, int64_t rows, int64_t n, int out_type)
{
    if ((out_type != FP4D_DTYPE_BF16 && out_type != FP4D_DTYPE_F16) || n % 8 != 0 || (uintptr_t)base % 16 != 0 ||
        rows >= INT32_MAX || n >= INT32_MAX)
        return false;
    PFN_cuTensorMapEncodeTiled_v12000 enc = tensor_map_encoder();
    if (!enc) return false;
    const cuuint64_t dims[2] = {(cuuint64_t)n, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)n * 2};
    const cuuint32_t box[2] = {64, 64};
    const cuuint32_t estr[2] = {1, 1};
    return enc(map, out_type == FP4D_DTYPE_F16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2,
               base, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

extern "C" void fp4d_cuda_fused_scratch(int64_t m, int64_t n, int32_t splits, size_t *partial_floats,
                                        size_t *counter_count)
{
    /* mma.sync kernel: [splits, M, N]; wg_kernel / wgt_kernel: splits x 128 x 256 per output
     * tile; wgr_kernel: splits x 128 x TOK per (weight rows, tokens) tile - room for any */
    const size_t tiles = (size_t)((m + WG_BM - 1) / WG_BM) * (size_t)((n + WG_BN - 1) / WG_BN);
    const size_t tok = (size_t)wgr_tok(m), tiles_r = (size_t)((n + WGR_ROWS - 1) / WGR_ROWS) * (((size_t)m + tok - 1) / tok);
    const size_t flat = (size_t)splits * (size_t)m * (size_t)n, tiled = tiles * (size_t)splits * WG_BM * WG_BN,
                 tiled_r = tiles_r * (size_t)splits * WGR_ROWS * tok;
    size_t most = flat > tiled ? flat : tiled;
    if (tiled_r > most) most = tiled_r;
    *partial_floats = splits > 1 ? most : 0;
    *counter_count = splits > 1 ? (tiles > tiles_r ? tiles : tiles_r) : 0;
}

/*
 * The persistent dense kernel's last, partial round: `tiles` tiles on `grid` CTAs leave
 * R = tiles % grid tiles for a round in which the other CTAs idle (14336x4096 at M = 8192:
 * 3584 tiles, 27 rounds and 20 tiles, 3% of the time). Those R tiles can run as S K parts
 * each, reduced like split-K, one part per CTA (R S <= grid), so that the round takes
 * ceil(ktiles / S) k tiles plus ~2 for writing the 128 KB partial tile and ~1.5 per part for
 * the CTA that sums them. Returns the S of least modelled time (1: no split; at most 16 parts
 * of at least 4 k tiles each, and only where it saves 5% of the round), and the tail's tiles.
 * Measured on an H200 (same-run A/B): 14336x4096 M = 1024 4-5% and M = 8192 1% faster; where
 * CTAs had to take several parts (4096x14336 and 7168x18432 at M = 8192, R S up to 500) the
 * model's gain did not show (0 to -3%), hence one part per CTA. FP4DOCTOR_CUDA_WG_TAIL=0: none.
 */
static int32_t dense_tail_plan(int64_t tiles, int64_t ktiles, int64_t grid, int64_t *tail_tiles)
{
    *tail_tiles = 0;
    if (!fp4d_env_switch("FP4DOCTOR_CUDA_WG_TAIL") || grid < 2 || tiles <= grid || tiles % grid == 0) return 1;
    const int64_t r = tiles % grid;
    int64_t best_s = 1;
    double best = (double)ktiles;
    for (int64_t s = 2; s <= 16 && ktiles / s >= 4 && r * s <= grid; s++) {
        const double t = (double)((ktiles + s - 1) / s + 2) + 1.5 * (double)s;
        if (t < best) best = t, best_s = s;
    }
    if (best > 0.95 * (double)ktiles) return 1;
    *tail_tiles = r;
    return (int32_t)best_s;
}

/* SMs of the current device (the persistent grid, the stream kernel's warps per row group),
 * 0 when the runtime cannot say; cached per device like the other launch facts, since the
 * stream kernel asks on every launch */
static int64_t current_sm_count(void)
{
    static device_facts<int> cached;
    const int dev = cached_device_index();
    if (dev < 0) return 0;
    if (cached.get(dev) == 0) {
        int sms = 0;
        if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
            (void)cudaGetLastError();
            return 0;
        }
        cached.set(dev, sms);
    }
    return cached.get(dev);
}

extern "C" void fp4d_cuda_dense_wgmma_scratch(int64_t m, int64_t n, int64_t k, int32_t splits, size_t *partial_floats,
                                              size_t *counter_count)
{
    fp4d_cuda_fused_scratch(m, n, splits, partial_floats, counter_count);
    int64_t tail_tiles = 0;
    const int64_t tiles = ((m + WG_BM - 1) / WG_BM) * ((n + WG_BN - 1) / WG_BN);
    const int32_t s = splits == 1 ? dense_tail_plan(tiles, k / WG_BK, current_sm_count(), &tail_tiles) : 1;
    if (s > 1) {
        const size_t pf = (size_t)tail_tiles * (size_t)s * WG_BM * WG_BN;
        if (pf > *partial_floats) *partial_floats = pf;
        if ((size_t)tail_tiles > *counter_count) *counter_count = (size_t)tail_tiles;
    }
}

extern "C" int fp4d_cuda_dense_wgmma(int op_type, const void *a, const void *w, int64_t m, int64_t n, int64_t k,
                                     float alpha, int out_type, void *out, int32_t splits, float *partials,
                                     uint32_t *counters, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    if (m == 0 || n == 0) return cudaSuccess;
    if (!wg_active() || k % WG_BK != 0 || splits < 1 || (splits > 1 && (!partials || !counters)))
        return (int)cudaErrorInvalidValue;
    const bool f16 = op_type == FP4D_DTYPE_F16;
    const int64_t ktiles = k / WG_BK;
    fused_args p = {(const uint16_t *)a, (const uint8_t *)w, NULL, 0, m, n, k, alpha, out_type, out,
                    splits, (int32_t)((ktiles + splits - 1) / splits), partials, counters, NULL, 0, NULL, NULL, NULL, 0, 0};
    const int64_t tiles = ((m + WG_BM - 1) / WG_BM) * ((n + WG_BN - 1) / WG_BN);
    if (tiles > INT32_MAX || splits > 65535) return (int)cudaErrorInvalidConfiguration;
    /* TMA + producer warp when the tensor maps can be made (FP4DOCTOR_CUDA_WG_TMA=0: the
     * cp.async variant); TMA coordinates are 32-bit */
    CUtensorMap map_a, map_w;
    if (fp4d_env_switch("FP4DOCTOR_CUDA_WG_TMA") && k < INT32_MAX && m < INT32_MAX && n < INT32_MAX &&
        encode_kmajor_map(&map_a, a, m, k, WG_BM, f16) && encode_kmajor_map(&map_w, w, n, k, WG_BN, f16)) {
        void (*tk)(const CUtensorMap, const CUtensorMap, const CUtensorMap, int, const fused_args) =
            f16 ? wgt_kernel<true> : wgt_kernel<false>;
        int dev = 0, sms = 0, optin = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
            return (int)cudaGetLastError();
        /* one CTA per SM walking the units, or (FP4DOCTOR_CUDA_WG_PERSISTENT=0) one CTA per unit;
         * persistent with scratch, the last partial round's tiles may run in K parts */
        const int64_t units = tiles * splits;
        const bool persistent = fp4d_env_switch("FP4DOCTOR_CUDA_WG_PERSISTENT");
        const int64_t grid = !persistent ? units : (units < sms ? units : sms);
        int64_t tail_tiles = 0;
        const int32_t tail_splits =
            persistent && splits == 1 && partials && counters ? dense_tail_plan(tiles, ktiles, grid, &tail_tiles) : 1;
        if (tail_splits > 1) {
            p.tail_tiles = (int32_t)tail_tiles;
            p.tail_splits = tail_splits;
        }
        if (grid > INT32_MAX) return (int)cudaErrorInvalidConfiguration;
        /* 16-bit output through TMA stores where a tensor map can describe it (rows of a
         * multiple of 16 bytes from a 16-byte aligned base) and the staging fits */
        CUtensorMap map_out;
        const int out_tma = out_tma_map(&map_out, out, m, n, out_type) && optin >= WGT_SMEM_OUT ? 1 : 0;
        const int smem = out_tma ? WGT_SMEM_OUT : WGT_SMEM;
        const cudaError_t te = cudaFuncSetAttribute(tk, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (te != cudaSuccess) return (int)te;
        tk<<<(unsigned)grid, WGT_THREADS, smem, s>>>(map_a, map_w, map_out, out_tma, p);
    } else {
        void (*wk)(const fused_args) = f16 ? wg_kernel<true, true> : wg_kernel<false, true>;
        const cudaError_t ae = cudaFuncSetAttribute(wk, cudaFuncAttributeMaxDynamicSharedMemorySize, WGD_SMEM);
        if (ae != cudaSuccess) return (int)ae;
        wk<<<dim3((unsigned)tiles, (unsigned)splits), WG_THREADS, WGD_SMEM, s>>>(p);
    }
    return (int)cudaGetLastError(); /* split-K is reduced inside the kernels */
}

template <bool F16, int TOK>
static int launch_wgr(const CUtensorMap &map, const fused_args &p, int64_t m, cudaStream_t s)
{
    void (*kern)(const CUtensorMap, const CUtensorMap, int, const fused_args) = wgr_kernel<F16, TOK>;
    const cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, wgr_smem<TOK>());
    if (e != cudaSuccess) return (int)e;
    /* 16-bit output through TMA where a tensor map can describe it */
    CUtensorMap map_out;
    const int out_tma = out_tma_map(&map_out, p.out, m, p.n, p.out_type);
    const int64_t z = p.items ? p.num_items : (m + TOK - 1) / TOK; /* token tiles or grouped items */
    const dim3 grid((unsigned)((p.n + WGR_ROWS - 1) / WGR_ROWS), (unsigned)p.splits, (unsigned)z);
    return (int)launch_pdl(kern, grid, dim3(WGR_THREADS), wgr_smem<TOK>(), s, map, map_out, out_tma, p);
}

/* The register-decode wgmma GEMM of p (plain, or grouped with p.items) with `tok`-token tiles:
 * A (p.m x p.k) k-permuted into a_scratch, a tensor map on it, the launch. -1 when a tensor map
 * cannot describe the scratch (the caller takes another kernel); else a cudaError_t. */
static int run_wgr(bool f16, const void *a, void *a_scratch, const fused_args &p, int tok, cudaStream_t s)
{
    const int64_t m = p.m, k = p.k;
    CUtensorMap map_p;
    if ((uintptr_t)a_scratch % 16 != 0 || m >= INT32_MAX || k >= INT32_MAX ||
        !encode_kmajor_map(&map_p, a_scratch, m, k, (uint32_t)tok, f16))
        return -1;
    const int64_t groups = m * (k / 8);
    const dim3 pgrid((unsigned)grid_for(groups, 256));
    const cudaError_t pe =
        f16 ? launch_pdl(wgr_permute_kernel<__half>, pgrid, dim3(256), 0, s, (const __half *)a, (__half *)a_scratch, m, k)
            : launch_pdl(wgr_permute_kernel<__nv_bfloat16>, pgrid, dim3(256), 0, s, (const __nv_bfloat16 *)a,
                         (__nv_bfloat16 *)a_scratch, m, k);
    if (pe != cudaSuccess) return (int)pe;
    if (tok == 64) return f16 ? launch_wgr<true, 64>(map_p, p, m, s) : launch_wgr<false, 64>(map_p, p, m, s);
    if (tok == 128) return f16 ? launch_wgr<true, 128>(map_p, p, m, s) : launch_wgr<false, 128>(map_p, p, m, s);
    return f16 ? launch_wgr<true, 256>(map_p, p, m, s) : launch_wgr<false, 256>(map_p, p, m, s);
}

extern "C" int fp4d_cuda_fused_grouped_available(void) { return wg_active() && wgr_enabled() ? 1 : 0; }

extern "C" int fp4d_cuda_fused_grouped_tok(int64_t max_item_rows) { return wgr_tok(max_item_rows); }

extern "C" int32_t fp4d_cuda_fused_grouped_plan(int64_t num_items, int64_t max_item_rows, int64_t n, int64_t k,
                                                int sm_count, size_t *partial_floats, size_t *counter_count)
{
    /* the split model of the plain launch, over num_items token tiles of `tok` rows */
    const int tok = wgr_tok(max_item_rows);
    const int32_t splits = fused_splits_model(num_items * tok, n, k, sm_count, tok, WGR_ROWS, tok == 64 ? 2 : 1);
    const size_t tiles = (size_t)num_items * (size_t)((n + WGR_ROWS - 1) / WGR_ROWS);
    *partial_floats = splits > 1 ? tiles * (size_t)splits * WGR_ROWS * (size_t)tok : 0;
    *counter_count = splits > 1 ? tiles : 0;
    return splits;
}

extern "C" int fp4d_cuda_fused_gemm_grouped(int op_type, const void *a, int64_t rows_total, const fp4d_skinny_item *items,
                                            int32_t num_items, int32_t max_item_rows, const uint8_t *const *codes,
                                            const uint8_t *const *scales, const float *alpha, int layout, int64_t n,
                                            int64_t k, int out_type, void *out, int32_t splits, float *partials,
                                            uint32_t *counters, void *a_scratch, void *stream)
{
    if (num_items == 0 || n == 0) return cudaSuccess;
    if (!fp4d_cuda_fused_grouped_available() || k % FG_BK != 0 || k >= (1 << 24) || !a_scratch || num_items > 65535 ||
        max_item_rows < 1 || max_item_rows > wgr_tok(max_item_rows) || splits < 1 || splits > 65535 ||
        (splits > 1 && (!partials || !counters)))
        return (int)cudaErrorInvalidValue;
    const int64_t ktiles = k / WG_BK;
    fused_args p = {(const uint16_t *)a, NULL, NULL, layout, rows_total, n, k, 1.0f, out_type, out,
                    splits, (int32_t)((ktiles + splits - 1) / splits), partials, counters,
                    items, num_items, codes, scales, alpha, 0, 0};
    const int r = run_wgr(op_type == FP4D_DTYPE_F16, a, a_scratch, p, wgr_tok(max_item_rows), (cudaStream_t)stream);
    return r < 0 ? (int)cudaErrorInvalidValue : r;
}

extern "C" int fp4d_cuda_fused_gemm(int op_type, const void *a, const uint8_t *codes, const uint8_t *scales,
                                    int layout, int64_t m, int64_t n, int64_t k, float alpha, int out_type, void *out,
                                    int32_t splits, float *partials, uint32_t *counters, void *a_scratch, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    if (m == 0 || n == 0) return cudaSuccess;
    /* 32-bit activation chunk offsets in the kernel: K < 2^24 */
    if (k % FG_BK != 0 || k >= (1 << 24) || splits < 1 || (splits > 1 && !partials)) return (int)cudaErrorInvalidValue;
    const bool f16 = op_type == FP4D_DTYPE_F16;
    const int64_t ktiles_all = k / FG_BK;
    if (wg_active()) {
        void (*wk)(const fused_args) = f16 ? wg_kernel<true, false> : wg_kernel<false, false>;
        const cudaError_t ae = cudaFuncSetAttribute(wk, cudaFuncAttributeMaxDynamicSharedMemorySize, WG_SMEM);
        if (ae != cudaSuccess) return (int)ae;
        if (splits > 1 && !counters) return (int)cudaErrorInvalidValue;
        fused_args p = {(const uint16_t *)a, codes, scales, layout, m, n, k, alpha, out_type, out,
                        splits, (int32_t)((ktiles_all + splits - 1) / splits), partials, counters, NULL, 0, NULL, NULL, NULL, 0, 0};
        /* weights decoded into registers: activations k-permuted into a_scratch (M x K, 16-bit),
         * brought by TMA from there */
        if (wgr_enabled() && a_scratch) {
            const int r = run_wgr(f16, a, a_scratch, p, wgr_tok(m), s);
            if (r >= 0) return r;
        }
        const int64_t tiles = ((m + WG_BM - 1) / WG_BM) * ((n + WG_BN - 1) / WG_BN);
        if (tiles > INT32_MAX || splits > 65535) return (int)cudaErrorInvalidConfiguration;
        wk<<<dim3((unsigned)tiles, (unsigned)splits), WG_THREADS, WG_SMEM, s>>>(p);
        return (int)cudaGetLastError(); /* split-K is reduced inside the kernel */
    }
    const bool one_block = !f16 && fp4d_env_knob("FP4DOCTOR_CUDA_FUSED_MINB", 1, 2, 2) == 1;
    void (*kernel)(const fused_args) = f16 ? fused_kernel<true, 2> : one_block ? fused_kernel<false, 1> : fused_kernel<false, 2>;
    /* set on every launch: the attribute is per device, and the call is cheap */
    const cudaError_t ae = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, FG_SMEM);
    if (ae != cudaSuccess) return (int)ae;
    const int64_t ktiles = k / FG_BK;
    fused_args p;
    p.a = (const uint16_t *)a;
    p.codes = codes;
    p.scales = scales;
    p.layout = layout;
    p.m = m;
    p.n = n;
    p.k = k;
    p.alpha = alpha;
    p.out_type = out_type;
    p.out = out;
    p.splits = splits;
    p.ktiles_per_split = (int32_t)((ktiles + splits - 1) / splits);
    p.partials = partials;
    p.counters = NULL;
    p.items = NULL;
    const int64_t tiles = ((m + FG_BM - 1) / FG_BM) * ((n + FG_BN - 1) / FG_BN);
    const int64_t blocks = tiles * splits;
    if (blocks > INT32_MAX) return (int)cudaErrorInvalidConfiguration;
    kernel<<<(unsigned)blocks, FG_THREADS, FG_SMEM, s>>>(p);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || splits == 1) return (int)e;
    const size_t count = (size_t)m * (size_t)n;
    fused_reduce_kernel<<<grid_for((int64_t)count, 256), 256, 0, s>>>(partials, splits, count, alpha, out_type, out);
    return (int)cudaGetLastError();
}

extern "C" int fp4d_cuda_simt_gemm(const float *a, const float *b, int64_t m, int64_t n, int64_t k, float alpha,
                                   int out_type, void *out, void *stream)
{
    const dim3 grid((unsigned)((n + SG_T - 1) / SG_T), (unsigned)((m + SG_T - 1) / SG_T));
    if (grid.y > 65535) return (int)cudaErrorInvalidConfiguration;
    simt_kernel<<<grid, dim3(32, 8), 0, (cudaStream_t)stream>>>(a, b, m, n, k, alpha, out_type, out);
    return (int)cudaGetLastError();
}

/* The padding of pdl_one_per_sm_smem on the current device - half an SM's shared memory - and
 * its SM count; 0 without PDL, or where the padded block would not leave room within the
 * opt-in limit for the kernels' static tables (1-2 KB). */
static size_t pdl_padded_smem(int *sm_count)
{
    /* per device: the SM count in the high 32 bits, the padding (or -1: none) in the low */
    static device_facts<int64_t> cached;
    const int dev = cached_device_index();
    if (!pdl_enabled() || dev < 0) return 0;
    if (cached.get(dev) == 0) {
        int sms = 0, per_sm = 0, optin = 0, half = -1;
        if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
            (void)cudaGetLastError();
            sms = 0;
        } else if (per_sm / 2 <= optin - 16 * 1024) {
            half = per_sm / 2;
        }
        cached.set(dev, (int64_t)sms << 32 | (uint32_t)half);
    }
    const int64_t v = cached.get(dev);
    const int32_t half = (int32_t)(uint32_t)v;
    *sm_count = (int)(v >> 32);
    return half > 0 ? (size_t)half : 0;
}

/*
 * Dynamic shared memory for a programmatic-dependent launch of a stream kernel grid of
 * `blocks` blocks. These kernels are issue-bound per SM, so two blocks sharing an SM take
 * about twice as long as one. Launched plainly into an idle GPU, a grid of at most one block
 * per SM gets one per SM; launched early, its blocks fill the free slots beside the previous
 * kernel's blocks, two on some SMs and none on others (the one-token MoE GEMM, 128 blocks,
 * took 33 instead of 23 us; 14336x4096 at M = 1, 112 blocks, 20.6 instead of 15.4). Such a
 * grid therefore asks for more than half an SM's shared memory, so that no SM can hold two
 * blocks of it (or one of it and one of a padded grid before it). Larger grids, and launches
 * without PDL, keep `smem`.
 */
static size_t pdl_one_per_sm_smem(size_t smem, int64_t blocks)
{
    int sms = 0;
    const size_t half = pdl_padded_smem(&sms);
    return half == 0 || blocks > sms || smem >= half ? smem : half;
}

/* The decode kernel takes work items of up to 16 rows when K % 64 == 0 (its lanes own 64
 * k each and read whole aligned scale words). */
static bool decode_kernel_applies(int64_t k, int32_t max_rows) { return max_rows <= 16 && k % 64 == 0; }

/* The weight-streaming kernel takes items of up to 16 rows when K % 256 == 0 (whole phases),
 * except f16 activations with MXFP4 weights (not exact in f16). Its bf16 and FP4 activation
 * variants read weight codes in the stream layout only (fp4d_cuda_stream_codes); with natural
 * codes those items go to the decode kernel. FP4DOCTOR_CUDA_WA=0 turns it off (the decode
 * kernel then takes these items), for A/B timing. */
static bool wa_kernel_takes(int32_t a_type, int32_t b_format, int64_t k, int32_t max_rows)
{
    if (!fp4d_env_switch("FP4DOCTOR_CUDA_WA")) return false;
    const bool f16 = a_type == FP4D_DTYPE_F16, bnv = b_format == FP4D_DTYPE_NVFP4;
    return max_rows <= 16 && k % WA_PHASE == 0 && k >= WA_PHASE && (bnv || !f16);
}

/* ... given the layout its variant reads: natural for f16 activations, the stream layout else */
static bool wa_kernel_applies(const fp4d_skinny_args *a)
{
    const bool natural = a->a_type == FP4D_DTYPE_F16;
    return wa_kernel_takes(a->a_type, a->b_format, a->k, a->max_rows) && natural != (a->b_stream_codes != 0);
}

extern "C" int fp4d_cuda_stream_codes_wanted(int a_type, int b_format, int64_t k, int64_t max_rows)
{
    return a_type != FP4D_DTYPE_F16 && max_rows >= 1 && max_rows <= 16 &&
           wa_kernel_takes(a_type, b_format, k, (int32_t)max_rows);
}

/* A positive count forcing a planner's choice (splits, row groups, waves: A/B timing and
 * tests), or `fallback` (env_knob.h: anything but digits is ignored with a warning). */
static int64_t env_int(const char *name, int64_t fallback)
{
    return fp4d_env_knob(name, 1, 1 << 24, (long)fallback);
}

/* Dynamic shared memory a stream block may have at all on the current device: the opt-in
 * limit minus the largest static tables of any instance - the two-warps-per-row-group one
 * with 16 tokens, whose partner sums take 8 KB (0 when the runtime cannot say). */
static int64_t wa_smem_room(void)
{
    const int dev = cached_device_index();
    if (dev < 0) return 0;
    static device_facts<int64_t> cached; /* -1: not known */
    if (cached.get(dev) == 0) {
        int optin = 0;
        cudaFuncAttributes attr;
        int64_t room = -1;
        if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess &&
            cudaFuncGetAttributes(&attr, wa_kernel<AK_BF16, true, 2, 2>) == cudaSuccess) {
            room = ((int64_t)optin - (int64_t)attr.sharedSizeBytes) & ~(int64_t)15;
            if (room == 0) room = -1; /* 0 means "not asked" */
        } else {
            (void)cudaGetLastError();
        }
        cached.set(dev, room);
    }
    const int64_t room = cached.get(dev);
    return room > 0 ? room : 0;
}

/* Dynamic shared memory a stream block may stage when two blocks share an SM: WA_SMEM_MAX, or
 * less where the device grants a block less (e.g. 99 KB per block on sm_86/sm_89/sm_120
 * parts); 48 KB when the runtime cannot say. */
static int64_t wa_smem_limit(void)
{
    const int64_t room = wa_smem_room();
    if (room < 48 * 1024) return 48 * 1024; /* every CUDA GPU grants a block 48 KB */
    return room < WA_SMEM_MAX ? room : WA_SMEM_MAX;
}

/* The most a stream block ever stages: all of a block's shared memory, or wa_smem_limit()
 * where the runtime cannot say what that is. */
static int64_t wa_smem_wide(void)
{
    const int64_t room = wa_smem_room(), limit = wa_smem_limit();
    return room > limit ? room : limit;
}

/* Phases of 256 k per block that the staged activations of max_rows tokens allow: within
 * WA_SMEM_MAX (two blocks per SM), or - `wide` - within all the shared memory a block may have
 * (see wa_staging_fits). */
static int64_t wa_max_phases_per_block(int32_t max_rows, bool wide)
{
    return (wide ? wa_smem_wide() : wa_smem_limit()) / ((int64_t)(max_rows > 0 ? max_rows : 1) * WA_PHASE * 2);
}

/*
 * Whether a stream grid of `blocks` blocks of `pps` phases in `splits` K splits may stage
 * max_rows tokens. Within WA_SMEM_MAX always; beyond it ("wide" staging, up to all the shared
 * memory a block may have) only for an unsplit grid of at most one block per SM, where no
 * second block would share the SM anyway. On an H200 that runs 14336x4096 at M = 16 in one
 * split instead of two whose 224 blocks share SMs: 20.1-20.3 -> 15.8-16.1 us (W4A4 22.4 ->
 * 19.7-19.9). Wide staging with splits was slower: 7168x18432 at M = 12 in two splits of 36
 * phases (221 KB per block) against nine narrow ones, W4A4 37.9-38.1 -> 42.4 us - a block
 * stages (and for FP4 activations decodes) its whole K range before its first phase, and that
 * prologue grows with the range. FP4DOCTOR_CUDA_WA_WIDE=0 turns it off (A/B timing).
 */
static bool wa_staging_fits(int64_t pps, int32_t max_rows, int64_t blocks, int64_t splits, int64_t sms, int rg = WA_WARPS)
{
    /* blocks of more row groups run one per SM, any splits (wa_wide_grid_fits) */
    if (rg > WA_WARPS) return blocks <= sms && pps <= wa_max_phases_per_block(max_rows, true);
    if (pps <= wa_max_phases_per_block(max_rows, false)) return true;
    if (!fp4d_env_switch("FP4DOCTOR_CUDA_WA_WIDE")) return false;
    return splits == 1 && blocks <= sms && pps <= wa_max_phases_per_block(max_rows, true);
}

/* Resident blocks per multiprocessor of `kernel` at `threads` threads and `smem` bytes of dynamic
 * shared memory (which it is allowed first); 1 when the runtime cannot say. */
static int resident_blocks(const void *kernel, int threads, size_t smem)
{
    int b = 0;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, threads, smem) != cudaSuccess || b < 1) {
        (void)cudaGetLastError();
        b = 1;
    }
    return b;
}

/* ask() (a count >= 1) for the current device, asked once per device (device_facts) */
template <typename Ask> static int per_device_count(device_facts<int> &cache, Ask ask)
{
    const int dev = cached_device_index();
    if (dev < 0) return ask();
    if (cache.get(dev) == 0) cache.set(dev, ask());
    return cache.get(dev);
}

static int resident_blocks_cached(device_facts<int> &cache, const void *kernel, int threads, size_t smem)
{
    return per_device_count(cache, [&]() { return resident_blocks(kernel, threads, smem); });
}

static int wa_blocks_per_sm(void)
{
    static device_facts<int> cached;
    return resident_blocks_cached(cached, (const void *)wa_kernel<AK_BF16, true, 1>, WA_WARPS * 32, (size_t)wa_smem_limit());
}

/* Tiles of `rows` weight rows over all items: the blocks of one K split of a stream grid. */
static int64_t wa_tiles(int64_t n, int32_t num_items, int rows) { return (n + rows - 1) / rows * num_items; }

extern "C" void fp4d_cuda_skinny_scratch(int64_t n, int32_t num_items, int32_t splits, int32_t max_rows,
                                         size_t *partial_bytes, size_t *counter_count)
{
    /* enough for any of the kernels: skinny_kernel tiles of 32 rows, decode_kernel of 128,
     * wa_kernel of WA_ROWS (two 8-token columns per warp at most) */
    const int64_t tiles = (n + SK_BN - 1) / SK_BN * num_items;
    const int64_t dk_tiles = (n + DK_BN - 1) / DK_BN * num_items;
    const int64_t wa8_tiles = wa_tiles(n, num_items, WA_ROWS);
    const int mt = max_rows > 16 ? 2 : 1;
    const size_t sk = (size_t)tiles * splits * (mt * SK_NT * 4) * 32;
    const size_t dk = (size_t)dk_tiles * splits * DK_SLOTS;
    const int64_t wide_tiles = wa_tiles(n, num_items, WA_WIDE_ROWS);
    const size_t wa8 = (size_t)wa8_tiles * splits * (WA_WARPS * 2 * 4 * 32);
    const size_t wa16 = (size_t)wide_tiles * splits * (WA_WIDE_RG * 2 * 4 * 32);
    const size_t wa = wa8 > wa16 ? wa8 : wa16;
    size_t most = sk > dk ? sk : dk;
    if (wa > most) most = wa;
    *partial_bytes = splits > 1 ? most * sizeof(float) : 0;
    *counter_count = splits > 1 ? (size_t)tiles : 0;
}

/* Resident decode blocks per multiprocessor (shared memory bound: 3 on sm_90). */
static int decode_blocks_per_sm(void)
{
    static device_facts<int> cached;
    return resident_blocks_cached(cached, (const void *)decode_kernel<AK_BF16, true, false>, DK_WARPS * 32, DK_SMEM);
}

/* The K splits of the stream kernel's grid of WA_WARPS-group blocks for args on sms SMs. */
static int64_t wa_eight_group_splits(const fp4d_skinny_args *args, int64_t sms)
{
    const int64_t n = args->n, k = args->k;
    const int32_t num_items = args->num_items, max_rows = args->max_rows;
    /* blocks of WA_ROWS rows x (K / splits). The kernel is issue-bound per SM (ncu: the
     * main loop's stalls are "not selected" and "math"), so the time follows the most
     * phases any SM runs - ceil(blocks / SMs) x phases per block - plus ~6 phases per
     * extra wave of resident blocks (start and drain) and ~1.7 for the split-K exchange.
     * Fitted to the splits sweeps of 14336x4096, 4096x14336 and 7168x18432 at M = 1..16
     * on an H200 (e.g. one split for 14336x4096 at M <= 8: 16.6 us against 18.3 with
     * two); ties go to more splits (more warps in flight). The wave cost was 3 until
     * programmatic dependent launch took the ramp between kernels away: with 3, 7168x18432
     * at M = 1 took 9 splits in two waves, 30.1-30.5 us against 27.8-28.0 with 4 in one
     * (FP4DOCTOR_CUDA_WA_WAVE_COST overrides it, for such sweeps). */
    const int64_t tiles = wa_tiles(n, num_items, WA_ROWS), phases = k / WA_PHASE;
    const int64_t slots = sms * wa_blocks_per_sm();
    const int64_t narrow = wa_max_phases_per_block(max_rows, false), min_splits = (phases + narrow - 1) / narrow;
    const int64_t forced = env_int("FP4DOCTOR_CUDA_WA_SPLITS", 0);
    const double wave_cost = (double)env_int("FP4DOCTOR_CUDA_WA_WAVE_COST", 6);
    const bool forced_fits = forced > 0 && forced <= phases &&
                             wa_staging_fits((phases + forced - 1) / forced, max_rows, tiles * forced, forced, sms);
    int64_t best_s = min_splits;
    double best = -1.0;
    /* below min_splits only one split, where wide staging allows it */
    for (int64_t s = 1; s <= phases && s <= 64; s++) {
        if (forced_fits && s != forced) continue;
        const int64_t blocks = tiles * s, pps = (phases + s - 1) / s;
        if (s < min_splits && !wa_staging_fits(pps, max_rows, blocks, s, sms)) continue;
        const int64_t waves = (blocks + slots - 1) / slots, per_sm = (blocks + sms - 1) / sms;
        const double cost = (double)(per_sm * pps) + wave_cost * (double)(waves - 1) + (s > 1 ? 1.7 : 0.0);
        if (best < 0 || cost <= best) {
            best = cost;
            best_s = s;
        }
    }
    return best_s;
}

/*
 * Blocks of WA_WIDE_RG row groups (256 rows, 16 warps, one block per SM) for split grids: the
 * activations a block stages serve twice the rows of an eight-group block, so the grid takes
 * half as many bytes of them from L2 (a grid of 128-row blocks stages N / 128 x K x M x 2
 * bytes: 33 MB at 7168x18432 and M = 16, half the weights' 66 MB). They run one wave, as many
 * K splits as 256-row tiles fit on the SMs, with the whole shared memory of a block for the
 * staging. Taken at M >= 3 where the eight-group grid would be split (unsplit, it needs no
 * exchange of partial sums: 14336x4096 and 13824x5120 ran 1-1.9 us slower at every M in two
 * splits of 16 groups) and every block keeps WA_WIDE_MIN_PHASES phases, from M = 8 on
 * WA_WIDE_MIN_PHASES_M8. On an H200 (two order-balanced rounds against the eight-group grid,
 * us, W4A16 (W4A4)):
 * 7168x18432 M = 4 21.56-21.90 -> 20.97-21.39, M = 8 22.41-22.77 -> 21.68-21.99, M = 12
 * 30.1-30.4 -> 26.0-26.4, M = 16 30.66-31.17 -> 26.33-27.10 (33.6-34.2 -> 27.1-27.9);
 * 28672x8192 M = 8 40.3-40.7 -> 33.4-33.9, M = 12 48.8-49.5 -> 38.8-39.9; 8192x28672 M = 8
 * 37.1-37.7 -> 34.1-34.2, M = 12 43.7-44.1 -> 38.1-39.1; with 8-12 phases per block at
 * M = 16 6144x16384 25.75-25.96 -> 22.60-22.88 (28.1-28.4 -> 23.9-24.1), 5120x13824 18.9-19.3
 * -> 18.3-18.6, 8192x8192 16.1-16.4 -> 15.9-16.0, 3584x18944 20.2-20.7 -> 19.9-20.3, at M = 8
 * even to 0.3 us faster, but at M = 4 even to 0.2 us slower. With fewer phases it was slower:
 * 4096x14336 (8 splits of 7) at M = 16 W4A16 15.9 -> 16.4 (W4A4 17.5 -> 17.1), 4096x4096 (8
 * of 2) M = 16 10.1 -> 10.5; at M <= 2 (little to stage) even or 0.1-0.3 us slower (7168x18432
 * M = 1 20.76-21.16 -> 20.82-21.13). docs/performance.md, nineteenth session.
 */
constexpr int64_t WA_WIDE_MIN_PHASES = 16;
constexpr int64_t WA_WIDE_MIN_PHASES_M8 = 8;

/* Whether a grid of WA_WIDE_RG-group blocks in `splits` K splits runs at all: one wave (one
 * block per SM), the staging within a block's shared memory. */
static bool wa_wide_grid_fits(const fp4d_skinny_args *args, int64_t splits, int64_t sms)
{
    const int64_t phases = args->k / WA_PHASE;
    return splits >= 1 && splits <= phases &&
           wa_staging_fits((phases + splits - 1) / splits, args->max_rows,
                           wa_tiles(args->n, args->num_items, WA_WIDE_ROWS) * splits, splits, sms, WA_WIDE_RG);
}

/* The K splits of the WA_WIDE_RG-group grid where the stream kernel takes it for args, else 0.
 * FP4DOCTOR_CUDA_WA_RG=8 turns it off, =16 takes it wherever it fits (any M and phases per
 * block; A/B timing, tests); FP4DOCTOR_CUDA_WA_SPLITS sets the splits where they fit. */
static int64_t wa_wide_splits(const fp4d_skinny_args *args, int sm_count)
{
    const int64_t forced = env_int("FP4DOCTOR_CUDA_WA_RG", 0), sms = sm_count > 0 ? sm_count : 132;
    if (forced != 0 && forced != WA_WIDE_RG) return 0;
    const int64_t tiles = wa_tiles(args->n, args->num_items, WA_WIDE_ROWS);
    const int64_t phases = args->k / WA_PHASE, most = min(sms / (tiles > 0 ? tiles : 1), phases);
    const int64_t splits = env_int("FP4DOCTOR_CUDA_WA_SPLITS", most);
    if (!wa_wide_grid_fits(args, splits, sms)) return 0;
    if (forced == WA_WIDE_RG) return splits;
    const int64_t pps = phases / splits, min_pps = args->max_rows >= 8 ? WA_WIDE_MIN_PHASES_M8 : WA_WIDE_MIN_PHASES;
    return args->max_rows >= 3 && pps >= min_pps && wa_eight_group_splits(args, sms) > 1 ? splits : 0;
}

extern "C" int fp4d_cuda_wa_row_groups(const fp4d_skinny_args *args, int sm_count)
{
    return wa_wide_splits(args, sm_count) > 0 ? WA_WIDE_RG : WA_WARPS;
}

extern "C" int32_t fp4d_cuda_skinny_pick_splits(const fp4d_skinny_args *args, int sm_count)
{
    if (wa_kernel_applies(args)) {
        const int64_t wide = wa_wide_splits(args, sm_count);
        return (int32_t)(wide > 0 ? wide : wa_eight_group_splits(args, sm_count > 0 ? sm_count : 132));
    }
    const int64_t n = args->n, k = args->k;
    const int32_t num_items = args->num_items, max_rows = args->max_rows;
    const int64_t sms = sm_count > 0 ? sm_count : 132;
    if (decode_kernel_applies(k, max_rows)) {
        /* one (FP4DOCTOR_CUDA_DECODE_WAVES) wave of resident blocks, each a contiguous K range */
        const int64_t blocks = (n + DK_BN - 1) / DK_BN * num_items;
        const int64_t steps = (k + DK_STEP - 1) / DK_STEP;
        const int64_t want = sms * decode_blocks_per_sm() * env_int("FP4DOCTOR_CUDA_DECODE_WAVES", 1);
        int64_t splits = env_int("FP4DOCTOR_CUDA_DECODE_SPLITS", want / blocks);
        if (splits > steps) splits = steps;
        if (splits > 64) splits = 64;
        if (splits < 1) splits = 1;
        return (int32_t)splits;
    }
    const int64_t blocks = (n + SK_BN - 1) / SK_BN * num_items;
    const int64_t chunks = (k + SK_CHUNK - 1) / SK_CHUNK;
    const int64_t want = sms * 8; /* 2 waves of 4-warp blocks at 12-16 warps/SM */
    int64_t splits = (want + blocks - 1) / blocks;
    const int64_t max_by_k = chunks / (SK_WARPS * 2); /* keep >= 2 chunks per warp */
    if (splits > max_by_k) splits = max_by_k;
    if (splits > 16) splits = 16;
    if (splits < 1) splits = 1;
    return (int32_t)splits;
}

template <int AK, bool BNV, bool ROWS16>
static int launch_decode(const fp4d_skinny_args *args, cudaStream_t s)
{
    /* the dynamic shared memory exceeds the 48 KB default; the attribute belongs to the
     * current device, so it is set on every launch (as the other launchers do): kept in a
     * static flag, a second GPU of the same process failed with "invalid argument" */
    const cudaError_t e = cudaFuncSetAttribute(decode_kernel<AK, BNV, ROWS16>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, (int)DK_SMEM);
    if (e != cudaSuccess) return (int)e;
    const dim3 grid((unsigned)((args->n + DK_BN - 1) / DK_BN), (unsigned)args->splits, (unsigned)args->num_items);
    decode_kernel<AK, BNV, ROWS16><<<grid, DK_WARPS * 32, DK_SMEM, s>>>(*args);
    return (int)cudaGetLastError();
}

template <int AK, bool BNV>
static int launch_decode_rows(const fp4d_skinny_args *args, cudaStream_t s)
{
    return args->max_rows > 8 ? launch_decode<AK, BNV, true>(args, s) : launch_decode<AK, BNV, false>(args, s);
}

/*
 * Whether a stream grid of `splits` K splits should run each tile's splits as one thread block
 * cluster and exchange their sums through its shared memory (splitk_cluster): on devices of
 * compute capability 9.0 and newer, for 2..SPLITK_CLUSTER_MAX splits.
 * FP4DOCTOR_CUDA_WA_CLUSTER=0 keeps the global-memory exchange (A/B timing).
 */
static bool wa_clusters_wanted(int32_t splits)
{
    if (splits < 2 || splits > SPLITK_CLUSTER_MAX) return false;
    if (!fp4d_env_switch("FP4DOCTOR_CUDA_WA_CLUSTER")) return false;
    static device_facts<int> major; /* -1: the runtime cannot say */
    const int dev = cached_device_index();
    if (dev < 0) return false;
    if (major.get(dev) == 0) {
        int m = 0;
        if (cudaDeviceGetAttribute(&m, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess || m <= 0) {
            (void)cudaGetLastError();
            m = -1;
        }
        major.set(dev, m);
    }
    return major.get(dev) >= 9;
}

/*
 * Whether `kernel` should run `grid` in clusters of cluster_y blocks along y, at `threads`
 * threads and `smem` bytes of dynamic shared memory (which the caller has allowed it): only
 * if the clusters take no more waves than the plain blocks. A cluster's blocks must be
 * resident at once on one GPC, so SMs that a GPC cannot fill with whole clusters stay idle:
 * on an H200 the GPCs hold 30 clusters of 8 blocks at two blocks per SM, so 4096x14336 at
 * M = 4 (32 clusters of 8) took 18.6 us in clusters against 14.1 without, while 7168x18432 at
 * M = 4 (56 clusters of 4, 62 fit) gains 0-2%. Clusters of more than 8 blocks need the kernel's non-portable-size
 * attribute. The answers are kept in a small table (the queries cost microseconds, a launch
 * should not); when it is full, the queries run.
 */
static bool cluster_launch_fits(const void *kernel, dim3 grid, int threads, size_t smem, int32_t cluster_y)
{
    struct fit { const void *kernel; int dev, threads, cluster_y; size_t smem; int64_t blocks; bool ok; };
    static fit table[64];
    static int used;
    /* Threads that launch at once (one backend context per GPU, each in its own thread) share
     * the table: two writers of one slot could leave an entry made of both, and a launch in
     * clusters that do not fit. The lock is uncontended in a single-threaded process. */
    static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
    const int dev = cached_device_index();
    const int64_t blocks = (int64_t)grid.x * grid.y * grid.z, sms = current_sm_count();
    if (dev < 0 || sms <= 0 || grid.y % (unsigned)cluster_y != 0) return false;
    pthread_mutex_lock(&table_lock);
    for (int i = 0; i < used; i++)
        if (table[i].kernel == kernel && table[i].dev == dev && table[i].threads == threads &&
            table[i].cluster_y == cluster_y && table[i].smem == smem && table[i].blocks == blocks) {
            const bool known = table[i].ok;
            pthread_mutex_unlock(&table_lock);
            return known;
        }
    pthread_mutex_unlock(&table_lock);
    int per_sm = 0, clusters = 0;
    bool ok = (cluster_y <= 8 ||
               cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess) &&
              cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) == cudaSuccess && per_sm > 0;
    if (ok) {
        cudaLaunchAttribute attr = {};
        attr.id = cudaLaunchAttributeClusterDimension;
        attr.val.clusterDim = {1, (unsigned)cluster_y, 1};
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = grid;
        cfg.blockDim = dim3((unsigned)threads);
        cfg.dynamicSmemBytes = smem;
        cfg.attrs = &attr;
        cfg.numAttrs = 1;
        ok = cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) == cudaSuccess && clusters > 0;
    }
    if (ok) {
        const int64_t plain_waves = (blocks + sms * per_sm - 1) / (sms * per_sm);
        const int64_t cluster_waves = (blocks / cluster_y + clusters - 1) / clusters;
        ok = cluster_waves <= plain_waves;
    }
    if (!ok) (void)cudaGetLastError();
    pthread_mutex_lock(&table_lock);
    if (used < 64) table[used++] = fit{kernel, dev, threads, cluster_y, smem, blocks, ok}; /* a twin entry is harmless */
    pthread_mutex_unlock(&table_lock);
    return ok;
}

/* Warps per 16-row group of a stream launch (wa_kernel's KH). Two where the grid holds at
 * most one block per SM anyway and every block has 16+ phases (8+ per warp): the kernel is
 * bound by issue latency at two warps per scheduler, and the second warp of each row group
 * takes half the phases. Measured on an H200 (same runs): 14336x4096 W4A16 M = 1
 * 11.83-11.87 -> 11.55-11.68 us, W4A4 M = 4 13.70 -> 12.74-12.88, MoE at one token (128
 * blocks of 28 phases) 18.9 -> 16.6; with wide staging (one split) also M = 9..16, W4A4
 * M = 16 19.7-20.0 -> 18.0 (W4A16 even); where blocks share SMs or hold few phases it was
 * slower (4096x4096 M = 1 7.3 -> 8.5-9.3, 14336x4096 at M = 16 in two splits 20.1 -> 25.3),
 * hence the rule. FP4DOCTOR_CUDA_WA_HALVES=1 or 2 forces it (A/B timing, tests). */
extern "C" int fp4d_cuda_wa_warps_per_row_group(const fp4d_skinny_args *args, int sm_count)
{
    const int64_t forced = env_int("FP4DOCTOR_CUDA_WA_HALVES", 0);
    if (forced == 1 || forced == 2) return (int)forced;
    const int64_t blocks = wa_tiles(args->n, args->num_items, WA_ROWS) * args->splits;
    const int64_t pps = args->k / WA_PHASE / (args->splits > 0 ? args->splits : 1);
    return blocks <= (sm_count > 0 ? sm_count : 132) && pps >= 16 ? 2 : 1;
}

/* Launches the stream kernel on args - or, where `cluster` is not NULL, only sets it to the
 * blocks per cluster the launch would have (1: the splits exchange through global memory). */
template <int AK, bool BNV, int MT, int KH, int RG = WA_WARPS>
static int launch_wa(const fp4d_skinny_args *args, cudaStream_t s, unsigned *cluster)
{
    const int64_t phases = args->k / WA_PHASE, pps = (phases + args->splits - 1) / args->splits;
    const dim3 grid((unsigned)((args->n + RG * 16 - 1) / (RG * 16)), (unsigned)args->splits, (unsigned)args->num_items);
    const int64_t blocks = (int64_t)grid.x * grid.y * grid.z;
    if (args->splits > phases || !wa_staging_fits(pps, args->max_rows, blocks, args->splits, current_sm_count(), RG))
        return (int)cudaErrorInvalidValue;
    /* the staged activations (or the padding) may exceed the 48 KB default; set on every
     * launch (the attribute is per device, and the call is cheap), always to the same value
     * on a device, so that no thread lowers it under another's launch */
    int sms = 0;
    const size_t padded = pdl_padded_smem(&sms), staged = (size_t)wa_smem_wide();
    const cudaError_t e = cudaFuncSetAttribute(wa_kernel<AK, BNV, MT, KH, RG>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)(padded > staged ? padded : staged));
    if (e != cudaSuccess) return (int)e;
    /* split grids exchange through the cluster's shared memory where that adds no wave: the
     * staging space then also holds the block's sums (RG * MT * 4 * 32 floats) */
    const size_t staging = (size_t)args->max_rows * (size_t)pps * WA_PHASE * 2;
    const size_t sums = (size_t)RG * MT * 4 * 32 * sizeof(float);
    const size_t cluster_smem = pdl_one_per_sm_smem(staging > sums ? staging : sums, blocks);
    const bool clustered = wa_clusters_wanted(args->splits) &&
                           cluster_launch_fits((const void *)wa_kernel<AK, BNV, MT, KH, RG>, grid, RG * 32 * KH,
                                               cluster_smem, args->splits);
    const unsigned cluster_y = clustered ? (unsigned)args->splits : 1u;
    if (cluster) {
        *cluster = cluster_y;
        return cudaSuccess;
    }
    const size_t smem = clustered ? cluster_smem : pdl_one_per_sm_smem(staging, blocks);
    /* FP4DOCTOR_CUDA_WA_STAGE=upfront stages 16-bit activations before the main loop, =N in
     * chunks of N phases (A/B timing, tests) */
    fp4d_skinny_args launched = *args;
    const char *stage = getenv("FP4DOCTOR_CUDA_WA_STAGE");
    launched.stage_chunk = stage && strcmp(stage, "upfront") == 0
                               ? 0 : (int)fp4d_env_knob("FP4DOCTOR_CUDA_WA_STAGE", 0, 1 << 20, WA_STAGE_CHUNK);
    /* early (programmatic dependent launch) only with settled weights: the kernel loads its
     * first weights before pdl_wait */
    return (int)launch_pdl_clusters(wa_kernel<AK, BNV, MT, KH, RG>, grid, dim3(RG * 32 * KH), smem, s, cluster_y,
                                    args->b_settled != 0, launched);
}

/*
 * K slices: where the planner splits K over several blocks per 128-row tile, a grid of 16-row
 * blocks whose eight warps each take an eighth of the block's K range (KH = 8, one row group)
 * sums the slices through shared memory instead - no global partials, fence, counter or last
 * block. Eight slices of a K range split eight ways are the same phases added in the same
 * order as eight splits, so the bits are the same. The price: every block stages the
 * activations of the whole K range, eight times what the split blocks of its tile stage
 * together. On an H200 (bench, four rounds against the split grid in two runs; us):
 *   - 4096x14336 M = 1 (256 blocks, one wave): 12.47-12.61 -> 11.14-11.27, W4A4 13.19-13.56
 *     -> 11.85-12.06;
 *   - M = 2: W4A4 13.58-13.79 -> 12.88-13.04, W4A16 0-1.5% slower (12.75-12.98 -> 12.92-13.00);
 *   - M = 3: W4A4 13.68-13.87 -> 14.24-14.47 (each block stages and decodes the whole K);
 *   - 4096x4096 M = 1: 7.37-7.39 -> 5.58-5.59, M = 2 7.74-7.78 -> 6.05-6.07 (W4A4 8.44-8.46 ->
 *     6.50);
 *   - 7168x18432 M = 1..2 (448 blocks: two waves) 21.5-22.0 -> 25.0-29.1.
 * At M = 3..8 the slices run in 32-row blocks (two row groups, 16 warps, one block per SM),
 * which halves the staging per row against 16-row blocks, where all of them fit on the GPU
 * at once and the whole K range of activations stages in WA_KSLICES2_STAGE: on an H200 (two
 * rounds against the split grid, W4A16) 4096x14336 M = 3 12.85-12.98 -> 12.16-12.36 us, M = 4
 * 12.74-12.90 -> 12.29-12.63 (115 KB staged), but M = 6 (172 KB) 12.87-12.89 -> 13.16-13.47;
 * 4096x4096 (at most 64 KB) M = 3..8 7.68-7.85 -> 6.26-6.76.
 * FP4 activations at M <= 2 with K >= 8192 take the 32-row blocks as well (WA_KSLICES2_FP4_PHASES).
 * Returns the row groups of a K-slice block (1 or 2), 0 for the split grid.
 * FP4DOCTOR_CUDA_WA_KSLICES=0 turns it off; =1 / =2 take 16- / 32-row blocks wherever they can
 * run (16-row: up to 8 tokens whose whole K range stages within WA_SMEM_MAX; 32-row: up to 8
 * tokens, all blocks resident, whole K range within a block's shared memory): A/B timing and
 * tests.
 */
constexpr int WA_KSLICES = 8;
constexpr int64_t WA_KSLICES2_STAGE = 128 * 1024;
/* FP4 activations at M <= 2 take 32-row blocks too from this many phases (K >= 8192): every
 * block decodes the whole K range of activations, and 32-row blocks decode it half as often
 * per SM. On an H200 (eighteenth session, four order-balanced rounds against 16-row blocks,
 * W4A4 us): 4096x14336 M = 1 11.82-12.05 -> 11.26-11.58, M = 2 12.86-13.08 -> 11.82-12.19
 * (W4A16 even, so bf16 keeps 16-row blocks); on 4096x4096 (two phases per warp) M = 1 was
 * 0.6 us slower and M = 2 even. */
constexpr int64_t WA_KSLICES2_FP4_PHASES = 32;

extern "C" int fp4d_cuda_wa_kslices(const fp4d_skinny_args *args, int sm_count)
{
    const int forced = (int)fp4d_env_knob("FP4DOCTOR_CUDA_WA_KSLICES", 0, 2, -1);
    const int64_t phases = args->k / WA_PHASE, sms = sm_count > 0 ? sm_count : 132;
    if (forced == 0 || args->splits <= 1 || args->max_rows > 8) return 0;
    const bool one_fits = phases <= wa_max_phases_per_block(args->max_rows, false);
    const int64_t blocks2 = (args->n + 31) / 32 * args->num_items;
    const int64_t staged = (int64_t)(args->max_rows > 0 ? args->max_rows : 1) * phases * WA_PHASE * 2;
    const bool two_fits = blocks2 <= sms && phases <= wa_max_phases_per_block(args->max_rows, true);
    if (forced == 1) return one_fits ? 1 : 0;
    if (forced == 2) return two_fits ? 2 : 0;
    const int64_t blocks1 = (args->n + 15) / 16 * args->num_items;
    const bool two_wanted = two_fits && staged <= WA_KSLICES2_STAGE;
    const bool fp4_long = (args->a_type == FP4D_DTYPE_NVFP4 || args->a_type == FP4D_DTYPE_MXFP4) &&
                          phases >= WA_KSLICES2_FP4_PHASES;
    if (args->max_rows <= 2 && !(fp4_long && two_wanted)) return one_fits && blocks1 <= sms * wa_blocks_per_sm() ? 1 : 0;
    return two_wanted ? 2 : 0;
}

template <int AK, bool BNV> static int launch_wa_rows(const fp4d_skinny_args *args, cudaStream_t s, unsigned *cluster)
{
    const int slices = fp4d_cuda_wa_kslices(args, (int)current_sm_count());
    if (slices > 0) {
        fp4d_skinny_args one = *args;
        one.splits = 1;
        return slices == 2 ? launch_wa<AK, BNV, 1, WA_KSLICES, 2>(&one, s, cluster)
                           : launch_wa<AK, BNV, 1, WA_KSLICES, 1>(&one, s, cluster);
    }
    /* the planner's splits for the wide grid (launches with other splits, e.g. from tests,
     * take the eight-group grid) */
    if (wa_wide_splits(args, (int)current_sm_count()) == args->splits)
        return args->max_rows > 8 ? launch_wa<AK, BNV, 2, 1, WA_WIDE_RG>(args, s, cluster)
                                  : launch_wa<AK, BNV, 1, 1, WA_WIDE_RG>(args, s, cluster);
    if (fp4d_cuda_wa_warps_per_row_group(args, (int)current_sm_count()) == 2)
        return args->max_rows > 8 ? launch_wa<AK, BNV, 2, 2>(args, s, cluster) : launch_wa<AK, BNV, 1, 2>(args, s, cluster);
    return args->max_rows > 8 ? launch_wa<AK, BNV, 2, 1>(args, s, cluster) : launch_wa<AK, BNV, 1, 1>(args, s, cluster);
}

/* The stream kernel instance for args' activation type and weight format (see launch_wa). */
static int launch_wa_for(const fp4d_skinny_args *args, cudaStream_t s, unsigned *cluster)
{
    const bool bnv = args->b_format == FP4D_DTYPE_NVFP4;
    if (args->a_type == FP4D_DTYPE_NVFP4 || args->a_type == FP4D_DTYPE_MXFP4)
        return bnv ? launch_wa_rows<AK_FP4, true>(args, s, cluster) : launch_wa_rows<AK_FP4, false>(args, s, cluster);
    if (args->a_type == FP4D_DTYPE_F16) return launch_wa_rows<AK_F16, true>(args, s, cluster);
    return bnv ? launch_wa_rows<AK_BF16, true>(args, s, cluster) : launch_wa_rows<AK_BF16, false>(args, s, cluster);
}

extern "C" int32_t fp4d_cuda_wa_cluster_blocks(const fp4d_skinny_args *args)
{
    unsigned cluster = 1;
    if (!wa_kernel_applies(args) || launch_wa_for(args, 0, &cluster) != cudaSuccess) return 1;
    return (int32_t)cluster;
}

extern "C" int fp4d_cuda_skinny_gemm(const fp4d_skinny_args *args, void *stream)
{
    if (args->k % 32 != 0 || args->num_items <= 0 || args->num_items > 65535 || args->splits < 1 ||
        args->splits > 65535)
        return (int)cudaErrorInvalidValue;
    cudaStream_t s = (cudaStream_t)stream;
    const bool fp4a = args->a_type == FP4D_DTYPE_NVFP4 || args->a_type == FP4D_DTYPE_MXFP4;
    const int ak = fp4a ? AK_FP4 : args->a_type == FP4D_DTYPE_F16 ? AK_F16 : AK_BF16;
    const bool bnv = args->b_format == FP4D_DTYPE_NVFP4;
    /* weights in the stream layout are for the weight-streaming kernel only */
    if (args->b_stream_codes && !wa_kernel_applies(args)) return (int)cudaErrorInvalidValue;
    if (wa_kernel_applies(args)) return launch_wa_for(args, s, nullptr);
    if (decode_kernel_applies(args->k, args->max_rows) && (bnv || ak != AK_F16)) {
        if (ak == AK_FP4) return bnv ? launch_decode_rows<AK_FP4, true>(args, s) : launch_decode_rows<AK_FP4, false>(args, s);
        if (ak == AK_F16) return launch_decode_rows<AK_F16, true>(args, s);
        return bnv ? launch_decode_rows<AK_BF16, true>(args, s) : launch_decode_rows<AK_BF16, false>(args, s);
    }
    const dim3 grid((unsigned)((args->n + SK_BN - 1) / SK_BN), (unsigned)args->splits, (unsigned)args->num_items);
    const bool two = args->max_rows > 16;
#define FP4D_SKINNY_LAUNCH(MT_, AK_) skinny_kernel<MT_, AK_, true><<<grid, SK_WARPS * 32, 0, s>>>(*args)
    if (ak == AK_FP4) {
        if (two) FP4D_SKINNY_LAUNCH(2, AK_FP4);
        else FP4D_SKINNY_LAUNCH(1, AK_FP4);
    } else if (ak == AK_F16) {
        if (two) FP4D_SKINNY_LAUNCH(2, AK_F16);
        else FP4D_SKINNY_LAUNCH(1, AK_F16);
    } else {
        if (two) FP4D_SKINNY_LAUNCH(2, AK_BF16);
        else FP4D_SKINNY_LAUNCH(1, AK_BF16);
    }
#undef FP4D_SKINNY_LAUNCH
    return (int)cudaGetLastError();
}

/* ---- GEMV (M <= 4) ------------------------------------------------------------------- */

/* M up to which the GEMV kernel beats the decode kernel on an H200 (docs/performance.md) */
#define FP4D_CUDA_GEMV_MAX_M_DEFAULT 1

static int gv_rows_template(int32_t m) { return m <= 1 ? 1 : m <= 2 ? 2 : 4; }

extern "C" int fp4d_cuda_gemv_applies(int a_type, int b_format, int64_t m, int64_t k)
{
    const bool a_ok = a_type == FP4D_DTYPE_BF16 || a_type == FP4D_DTYPE_F16 || a_type == FP4D_DTYPE_NVFP4 ||
                      a_type == FP4D_DTYPE_MXFP4;
    const bool b_ok = b_format == FP4D_DTYPE_NVFP4 || b_format == FP4D_DTYPE_MXFP4;
    /* FP4DOCTOR_CUDA_GEMV_MAX_M: largest M it takes (0: off, for A/B timing; at most 4).
     * By default it takes M = 1 only where the weight-streaming kernel does not (K % 256
     * != 0, f16 x MXFP4, or that kernel switched off): it is slower where both apply. */
    const int64_t forced_max_m = fp4d_env_knob("FP4DOCTOR_CUDA_GEMV_MAX_M", 0, 4, -1);
    const int64_t max_m = forced_max_m >= 0 ? forced_max_m : FP4D_CUDA_GEMV_MAX_M_DEFAULT;
    if (forced_max_m < 0 && a_ok && b_ok) {
        fp4d_skinny_args probe = {};
        probe.a_type = a_type;
        probe.b_format = b_format;
        /* the backend provides the stream layout where the kernel wants it, unless told not to */
        probe.b_stream_codes = a_type != FP4D_DTYPE_F16 && fp4d_env_switch("FP4DOCTOR_CUDA_STREAM_LAYOUT");
        probe.k = k;
        probe.max_rows = (int32_t)m;
        if (wa_kernel_applies(&probe)) return 0;
    }
    return a_ok && b_ok && m >= 1 && m <= max_m && m <= 4 && k >= 32 && k % 32 == 0;
}

template <int MR, bool BNV> static int gv_blocks_per_sm()
{
    static device_facts<int> cached;
    return per_device_count(cached, []() {
        int b = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, gemv_kernel<MR, BNV>, GV_WARPS * 32,
                                                          GV_SMEM_FLOATS * sizeof(float)) != cudaSuccess ||
            b < 1) {
            (void)cudaGetLastError();
            b = 1;
        }
        return b;
    });
}

static int gv_blocks_per_sm_for(int mr, bool bnv)
{
    if (mr == 1) return bnv ? gv_blocks_per_sm<1, true>() : gv_blocks_per_sm<1, false>();
    if (mr == 2) return bnv ? gv_blocks_per_sm<2, true>() : gv_blocks_per_sm<2, false>();
    return bnv ? gv_blocks_per_sm<4, true>() : gv_blocks_per_sm<4, false>();
}

/*
 * Picks the K range per block (k_split: a multiple of 1024 whose activations fit the 48 KB
 * staging buffer, or all of K) and the row groups per warp (tasks_per_warp). Model: the
 * blocks run in waves of `slots` resident blocks; a block costs its 1024-k steps per warp
 * plus a fixed start (staging the activations, the first load's latency) worth about three
 * steps; so few fat blocks are preferred as long as they fill the GPU.
 */
extern "C" int fp4d_cuda_gemv_plan(fp4d_gemv_args *a, int sm_count, size_t *partial_bytes, size_t *counter_count)
{
    const int mr = gv_rows_template(a->m);
    const int64_t R = gv_rows_per_task(mr);
    const int64_t K = a->k, groups = (a->n + R - 1) / R;
    const int64_t kmax = GV_SMEM_FLOATS / mr; /* 12288, 6144 or 3072: multiples of 1024 */
    const int64_t slots = (int64_t)(sm_count > 0 ? sm_count : 132) *
                          gv_blocks_per_sm_for(mr, a->b_format == FP4D_DTYPE_NVFP4);
    const int64_t forced_ks = env_int("FP4DOCTOR_CUDA_GEMV_KSPLIT", 0), forced_tpw = env_int("FP4DOCTOR_CUDA_GEMV_TPW", 0);
    double best = -1.0;
    for (int64_t tpw = 1; tpw <= 64; tpw++) {
        if (forced_tpw && tpw != forced_tpw) continue;
        const int64_t row_blocks = (groups + GV_WARPS * tpw - 1) / (GV_WARPS * tpw);
        for (int64_t ks = 1024;; ks += 1024) {
            const int64_t ks_eff = ks < K ? ks : K;
            if (ks_eff > kmax) break;
            const int64_t splits = (K + ks_eff - 1) / ks_eff;
            const bool forced_ok = !forced_ks || ks_eff == (forced_ks < K ? forced_ks : K);
            const int64_t blocks = row_blocks * splits;
            if (forced_ok && splits <= 65535 && row_blocks <= INT32_MAX) {
                const int64_t waves = (blocks + slots - 1) / slots;
                const double steps = (double)((ks_eff + GV_STEP - 1) / GV_STEP);
                const double t = (double)waves * ((double)tpw * steps + 3.0) + 0.05 * (double)splits;
                if (best < 0 || t < best) {
                    best = t;
                    a->k_split = ks_eff;
                    a->splits = (int32_t)splits;
                    a->tasks_per_warp = (int32_t)tpw;
                }
            }
            if (ks_eff == K) break;
        }
        if (row_blocks == 1) break;
    }
    if (best < 0) return (int)cudaErrorInvalidValue;
    *partial_bytes = a->splits > 1 ? (size_t)a->splits * 4 * (size_t)a->n * sizeof(float) : 0;
    *counter_count = a->splits > 1 ? (size_t)groups : 0;
    return cudaSuccess;
}

template <int MR, bool BNV> static int launch_gemv(const fp4d_gemv_args *a, cudaStream_t s)
{
    const int64_t groups = (a->n + gv_rows_per_task(MR) - 1) / gv_rows_per_task(MR);
    const int64_t row_blocks = (groups + GV_WARPS * a->tasks_per_warp - 1) / (GV_WARPS * a->tasks_per_warp);
    const dim3 grid((unsigned)row_blocks, (unsigned)a->splits);
    const size_t smem = pdl_one_per_sm_smem((size_t)MR * (size_t)a->k_split * sizeof(float), row_blocks * a->splits);
    if (smem > GV_SMEM_FLOATS * sizeof(float)) { /* padded: above the 48 KB a block gets without opt-in */
        const cudaError_t e = cudaFuncSetAttribute(gemv_kernel<MR, BNV>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return (int)e;
    }
    return (int)launch_pdl(gemv_kernel<MR, BNV>, grid, dim3(GV_WARPS * 32), smem, s, *a);
}

extern "C" int fp4d_cuda_gemv(const fp4d_gemv_args *a, void *stream)
{
    if (!fp4d_cuda_gemv_applies(a->a_type, a->b_format, a->m, a->k) || a->splits < 1 || a->tasks_per_warp < 1 ||
        a->k_split < 32 || a->k_split % 32 != 0 || (int64_t)gv_rows_template(a->m) * a->k_split > GV_SMEM_FLOATS ||
        (a->splits > 1 && (!a->partials || !a->counters)) || a->n < 1)
        return (int)cudaErrorInvalidValue;
    cudaStream_t s = (cudaStream_t)stream;
    const bool bnv = a->b_format == FP4D_DTYPE_NVFP4;
    switch (gv_rows_template(a->m)) {
    case 1: return bnv ? launch_gemv<1, true>(a, s) : launch_gemv<1, false>(a, s);
    case 2: return bnv ? launch_gemv<2, true>(a, s) : launch_gemv<2, false>(a, s);
    default: return bnv ? launch_gemv<4, true>(a, s) : launch_gemv<4, false>(a, s);
    }
}

extern "C" int fp4d_cuda_amax(int src_type, const void *src, size_t count, float *dev_amax, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    cudaError_t e = cudaMemsetAsync(dev_amax, 0, sizeof(float), s);
    if (e != cudaSuccess) return (int)e;
    if (count == 0) return cudaSuccess;
    const int grid = grid_for((int64_t)count, 256) > 4096 ? 4096 : grid_for((int64_t)count, 256);
    unsigned int *o = (unsigned int *)dev_amax;
    if (src_type == FP4D_DTYPE_F32) amax_kernel<float><<<grid, 256, 0, s>>>((const float *)src, count, o);
    else if (src_type == FP4D_DTYPE_BF16) amax_kernel<__nv_bfloat16><<<grid, 256, 0, s>>>((const __nv_bfloat16 *)src, count, o);
    else amax_kernel<__half><<<grid, 256, 0, s>>>((const __half *)src, count, o);
    return (int)cudaGetLastError();
}

/* Reads `n16` 16-byte words once, as the weight-streaming kernels do (non-coherent, no L1
 * allocation), and does nothing with them but a fold that the compiler cannot drop: the
 * least time any kernel that must read those bytes takes, for `fp4doctor bench`.
 * DEPENDENT: the reads wait for the kernel before it (pdl_wait first), as a GEMM's must,
 * since that kernel may have written them; otherwise they start while it drains. */
template <bool DEPENDENT>
__global__ void __launch_bounds__(256) read_stream_kernel(const uint4 *__restrict__ src, int64_t n16,
                                                          uint32_t *__restrict__ sink)
{
    /* with programmatic dependent launch (like the decode kernels) the next read may launch
     * while this one drains; without DEPENDENT it reads at once: the bytes are never written
     * by these kernels */
    pdl_trigger();
    if (DEPENDENT) pdl_wait();
    uint32_t x = 0;
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * step < n16; i += 4 * step) { /* four loads in flight per thread */
        const uint4 a = load_stream_16(src + i), b = load_stream_16(src + i + step);
        const uint4 c = load_stream_16(src + i + 2 * step), d = load_stream_16(src + i + 3 * step);
        x ^= (a.x + a.y + a.z + a.w) ^ (b.x + b.y + b.z + b.w) ^ (c.x + c.y + c.z + c.w) ^ (d.x + d.y + d.z + d.w);
    }
    for (; i < n16; i += step) {
        const uint4 a = load_stream_16(src + i);
        x ^= a.x + a.y + a.z + a.w;
    }
    if (!DEPENDENT) pdl_wait();
    if (x == 0x9E3779B9u) *sink = x; /* practically never: keeps the loads */
}

extern "C" int fp4d_cuda_read_stream(const void *src, size_t bytes, int dependent, uint32_t *sink, int sm_count,
                                     void *stream)
{
    if ((uintptr_t)src % 16 != 0 || bytes % 16 != 0) return (int)cudaErrorInvalidValue;
    const int64_t n16 = (int64_t)(bytes / 16);
    if (n16 == 0) return cudaSuccess;
    int64_t blocks = (int64_t)(sm_count > 0 ? sm_count : 132) * 8, need = (n16 + 255) / 256;
    if (blocks > need) blocks = need;
    return (int)launch_pdl(dependent ? read_stream_kernel<true> : read_stream_kernel<false>, dim3((unsigned)blocks),
                           dim3(256), 0, (cudaStream_t)stream, (const uint4 *)src, n16, sink);
}

/* ---- stream layout of weight codes (formats/stream_codes.h) ---------------------------- */

struct stream_encode_masks {
    uint32_t m[32]; /* fp4d_stream_encode_masks: natural bit q -> stream bits it flips */
};

/* The codes of an n x k matrix (natural, rows of k / 2 bytes) in the stream layout: each
 * 32-bit word re-encoded (formats/stream_codes.h) and moved into its warp chunk (WA_STREAM_CHUNK,
 * above). One thread per word of the rows rounded up to 16: the rows past n, which the kernel
 * reads but never stores, are written as zeros. The encode is linear over GF(2), so a word is
 * the XOR of four table entries, one per byte, built in shared memory from the 32 masks. */
__global__ void __launch_bounds__(256) stream_codes_kernel(const uint32_t *__restrict__ src, uint32_t *__restrict__ dst,
                                                           int64_t n, int64_t k, const stream_encode_masks masks)
{
    __shared__ uint32_t table[4][256];
    for (int e = threadIdx.x; e < 4 * 256; e += blockDim.x) {
        const int byte = e >> 8, v = e & 255;
        uint32_t x = 0;
        for (int b = 0; b < 8; b++)
            if ((v >> b) & 1) x ^= masks.m[8 * byte + b];
        table[byte][v] = x;
    }
    __syncthreads();
    const int64_t row_words = k / 8, groups = (n + 15) / 16, words = groups * 16 * row_words;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = i / row_words, byte = (i % row_words) * 4;
        const int64_t ph = byte / (WA_PHASE / 2);
        const int within = (int)(byte % (WA_PHASE / 2)), c = within / 64, t = (within % 64) / 16, wi = (within % 16) / 4;
        const int gr = (int)(row % 16), g = gr % 8, r = gr / 8;
        const int64_t at = wa_chunk_index(row / 16, ph, groups) * WA_STREAM_CHUNK + (2 * c + r) * 512 +
                           (4 * g + t) * 16 + 4 * wi;
        const uint32_t w = row < n ? src[i] : 0u;
        dst[at / 4] = table[0][w & 255] ^ table[1][(w >> 8) & 255] ^ table[2][(w >> 16) & 255] ^ table[3][w >> 24];
    }
}

extern "C" size_t fp4d_cuda_stream_codes_bytes(int64_t n, int64_t k)
{
    return (size_t)((n + 15) / 16 * 16) * (size_t)(k / 2);
}

extern "C" int fp4d_cuda_stream_codes(const uint8_t *src, uint8_t *dst, int64_t n, int64_t k, void *stream)
{
    if ((uintptr_t)src % 4 != 0 || (uintptr_t)dst % 16 != 0 || n < 0 || k < 0 || k % WA_PHASE != 0 || src == dst)
        return (int)cudaErrorInvalidValue;
    const size_t bytes = fp4d_cuda_stream_codes_bytes(n, k);
    if (bytes == 0) return cudaSuccess;
    stream_encode_masks masks;
    memcpy(masks.m, fp4d_stream_encode_masks(), sizeof masks.m);
    const int64_t words = (int64_t)(bytes / 4);
    int64_t blocks = (words + 255) / 256;
    if (blocks > 132 * 16) blocks = 132 * 16;
    if (blocks == 0) return cudaSuccess;
    stream_codes_kernel<<<(unsigned)blocks, 256, 0, (cudaStream_t)stream>>>((const uint32_t *)src, (uint32_t *)dst, n,
                                                                            k, masks);
    return (int)cudaGetLastError();
}

/* The block scales of an n x k matrix in the stream layout (WA_STREAM_SCALE_CHUNK), from any
 * scale layout; one thread per output word, rows past n zero. */
__global__ void __launch_bounds__(256) stream_scales_kernel(const uint8_t *__restrict__ src, int layout, int nvfp4,
                                                            uint32_t *__restrict__ dst, int64_t n, int64_t k)
{
    const int64_t phases = k / WA_PHASE, C = k / (nvfp4 ? 16 : 32), cols_phase = WA_PHASE / (nvfp4 ? 16 : 32);
    const int64_t words = (n + 15) / 16 * phases * (WA_STREAM_SCALE_CHUNK / 4);
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += (int64_t)gridDim.x * blockDim.x) {
        const int r = (int)(i % 2), lane = (int)((i / 2) % 32);
        const int64_t chunk = i / 64, groups = (n + 15) / 16, ph = chunk / groups, group = chunk % groups; /* wa_chunk_index */
        const int g = lane >> 2, t = lane & 3;
        const int64_t row = group * 16 + g + 8 * r;
        uint32_t w = 0;
        if (row < n) {
            const uint8_t *rs = src + scale_row_off(layout, C, row);
            const int64_t c0 = ph * cols_phase;
            auto at = [&](int64_t c) { return (uint32_t)rs[scale_col_off(layout, c0 + c)]; };
            w = nvfp4 ? at(2 * t) | at(2 * t + 1) << 8 | at(8 + 2 * t) << 16 | at(9 + 2 * t) << 24 : at(t) | at(4 + t) << 8;
        }
        dst[i] = w;
    }
}

extern "C" size_t fp4d_cuda_stream_scales_bytes(int64_t n, int64_t k)
{
    return (size_t)((n + 15) / 16) * (size_t)(k / WA_PHASE) * WA_STREAM_SCALE_CHUNK;
}

extern "C" int fp4d_cuda_stream_scales(const uint8_t *src, int layout, int format, uint8_t *dst, int64_t n, int64_t k,
                                       void *stream)
{
    if ((uintptr_t)dst % 16 != 0 || n < 0 || k < 0 || k % WA_PHASE != 0 ||
        (format != FP4D_DTYPE_NVFP4 && format != FP4D_DTYPE_MXFP4))
        return (int)cudaErrorInvalidValue;
    const int64_t words = (int64_t)(fp4d_cuda_stream_scales_bytes(n, k) / 4);
    if (words == 0) return cudaSuccess;
    int64_t blocks = (words + 255) / 256;
    if (blocks > 132 * 16) blocks = 132 * 16;
    stream_scales_kernel<<<(unsigned)blocks, 256, 0, (cudaStream_t)stream>>>(src, layout, format == FP4D_DTYPE_NVFP4,
                                                                             (uint32_t *)dst, n, k);
    return (int)cudaGetLastError();
}

extern "C" int fp4d_cuda_e2m1_sweep(float s, uint64_t *mismatches, uint32_t *first_bad)
{
    unsigned long long *d_count = NULL;
    unsigned int *d_first = NULL;
    cudaError_t e = cudaMalloc(&d_count, sizeof *d_count);
    if (e == cudaSuccess) e = cudaMalloc(&d_first, sizeof *d_first);
    if (e == cudaSuccess) e = cudaMemset(d_count, 0, sizeof *d_count);
    if (e == cudaSuccess) e = cudaMemset(d_first, 0xFF, sizeof *d_first);
    if (e == cudaSuccess) {
        e2m1_sweep_kernel<<<132 * 16, 256>>>(s, d_count, d_first);
        e = cudaGetLastError();
    }
    unsigned long long count = 0;
    unsigned int first = 0;
    if (e == cudaSuccess) e = cudaMemcpy(&count, d_count, sizeof count, cudaMemcpyDeviceToHost);
    if (e == cudaSuccess) e = cudaMemcpy(&first, d_first, sizeof first, cudaMemcpyDeviceToHost);
    cudaFree(d_count);
    cudaFree(d_first);
    *mismatches = count;
    *first_bad = first;
    return (int)e;
}

/* FP4DOCTOR_CUDA_QUANT_B1=0 keeps bf16 rows of 2048+ columns on the 4-block kernel (A/B timing) */
static bool quantize_b1_enabled(void)
{
    return fp4d_env_switch("FP4DOCTOR_CUDA_QUANT_B1");
}

extern "C" int fp4d_cuda_quantize_nvfp4(int src_type, const void *src, int64_t rows, int64_t cols, float encode_scale,
                                        int layout, uint8_t *codes, uint8_t *scales, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    const int64_t work = rows * (cols / 16);
    if (work == 0) return cudaSuccess;
    const int grid = grid_for(work, 256);
    if (src_type == FP4D_DTYPE_F32)
        quantize_nvfp4_kernel<float><<<grid, 256, 0, s>>>((const float *)src, rows, cols, encode_scale, layout, codes, scales);
    else if (src_type == FP4D_DTYPE_BF16 && cols % 2048 == 0 && quantize_b1_enabled()) {
        /* at most two waves of 8 resident 256-thread CTAs per SM: each CTA first builds its
         * out-scale table, and 8192^2 at 8 waves (one 128-block chunk per warp) reached 76-77%
         * of copy bandwidth against 80% at 2 (16384^2 unchanged at 85%); the grid-stride loop
         * takes the rest. FP4DOCTOR_CUDA_QUANT_BLOCKS overrides the cap. */
        const int64_t warps = work / 128;
        int64_t blocks = (warps + 7) / 8;
        const int64_t sms = current_sm_count();
        const int64_t cap = env_int("FP4DOCTOR_CUDA_QUANT_BLOCKS", (sms > 0 ? sms : 132) * 16);
        if (blocks > cap) blocks = cap;
        quantize_bf16_b1_kernel<<<(unsigned)blocks, 256, 0, s>>>((const uint4 *)src, rows, cols / 16, encode_scale,
                                                                 layout, (uint2 *)codes, scales);
    } else if (src_type == FP4D_DTYPE_BF16 && cols % 64 == 0) {
        /* one group of 4 blocks per thread-iteration; up to 8 waves of 256-thread blocks */
        const int64_t groups = work / 4;
        int64_t blocks = (groups + 255) / 256;
        if (blocks > 132 * 8 * 4) blocks = 132 * 8 * 4;
        quantize_bf16_g4_kernel<<<(unsigned)blocks, 256, 0, s>>>((const uint4 *)src, rows, cols / 16, encode_scale,
                                                                 layout, (uint4 *)codes, scales);
    } else if (src_type == FP4D_DTYPE_BF16)
        quantize_nvfp4_kernel<__nv_bfloat16><<<grid, 256, 0, s>>>((const __nv_bfloat16 *)src, rows, cols, encode_scale,
                                                                   layout, codes, scales);
    else
        quantize_nvfp4_kernel<__half><<<grid, 256, 0, s>>>((const __half *)src, rows, cols, encode_scale, layout, codes,
                                                           scales);
    return (int)cudaGetLastError();
}

extern "C" int fp4d_cuda_kernel_binary_version(int device, int *binary_version, int *ptx_version)
{
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) return (int)e;
    cudaFuncAttributes attr;
    e = cudaFuncGetAttributes(&attr, probe_kernel);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return (int)e;
    }
    *binary_version = attr.binaryVersion;
    *ptx_version = attr.ptxVersion;
    return cudaSuccess;
}
