/*
 * kernels.cu - the `cuda` backend's own kernels (and the dequantize kernel that
 * cublas-bf16 shares). Entry points and conventions: kernels.h.
 *
 * Numerics. An e2m1 value times an e4m3 or ue8m0 block scale is exact in f32, and for
 * NVFP4 also in bf16 and fp16 (at most 5 significant bits, magnitudes 2^-10 .. 2688), so
 * dequantizing into the tensor-core input type loses nothing; products are accumulated in
 * f32 by mma.sync and rounded once into the output type after alpha. This file must be
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
 *  - tiled GEMM (large M): 128x128x32 tiles, 3-stage cp.async pipeline, ldmatrix, bf16 or
 *    f16 mma.sync; weights are dequantized into a dense buffer first.
 *  - simt GEMM: f32 CUDA-core fallback (f32 activations, MXFP4 with f16 activations).
 *  - quantize: flashinfer-exact NVFP4 (spec §4.2), bit-identical to fp4d_quantize.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <float.h>
#include <stdint.h>
#include <stdlib.h>

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
        T *d = dst + r * src.cols + g * 16;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const uint32_t word = i < 8 ? w.x : w.y;
            const uint32_t code = (word >> (4 * (i & 7))) & 0xFu;
            d[i] = from_f32<T>(e2m1_to_f32(code) * s);
        }
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

/* ---------------------------------------------------------------------------------------
 * Skinny GEMM: up to 32 rows per work item, weights streamed once
 * ------------------------------------------------------------------------------------- */

constexpr int SK_WARPS = 4;   /* warps per block; they split the K chunks */
constexpr int SK_NT    = 4;   /* n8 tiles per block: 32 output columns */
constexpr int SK_BN    = 8 * SK_NT;
constexpr int SK_CHUNK = 128; /* k elements per warp step: 4 lanes x 32 */

/* A kinds of the skinny kernel */
enum { AK_BF16 = 0, AK_F16 = 1, AK_FP4 = 2 };

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
            const uint4 v = __ldg(src + q);
            out[4 * q + 0] = __byte_perm(v.x, v.z, 0x5410);
            out[4 * q + 1] = __byte_perm(v.x, v.z, 0x7632);
            out[4 * q + 2] = __byte_perm(v.y, v.w, 0x5410);
            out[4 * q + 3] = __byte_perm(v.y, v.w, 0x7632);
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

extern "C" int fp4d_cuda_simt_gemm(const float *a, const float *b, int64_t m, int64_t n, int64_t k, float alpha,
                                   int out_type, void *out, void *stream)
{
    const dim3 grid((unsigned)((n + SG_T - 1) / SG_T), (unsigned)((m + SG_T - 1) / SG_T));
    if (grid.y > 65535) return (int)cudaErrorInvalidConfiguration;
    simt_kernel<<<grid, dim3(32, 8), 0, (cudaStream_t)stream>>>(a, b, m, n, k, alpha, out_type, out);
    return (int)cudaGetLastError();
}

extern "C" void fp4d_cuda_skinny_scratch(int64_t n, int32_t num_items, int32_t splits, int32_t max_rows,
                                         size_t *partial_bytes, size_t *counter_count)
{
    const int64_t tiles = (n + SK_BN - 1) / SK_BN * num_items;
    const int mt = max_rows > 16 ? 2 : 1;
    *partial_bytes = splits > 1 ? (size_t)tiles * splits * (mt * SK_NT * 4) * 32 * sizeof(float) : 0;
    *counter_count = splits > 1 ? (size_t)tiles : 0;
}

extern "C" int32_t fp4d_cuda_skinny_pick_splits(int64_t n, int64_t k, int32_t num_items, int sm_count)
{
    const int64_t blocks = (n + SK_BN - 1) / SK_BN * num_items;
    const int64_t chunks = (k + SK_CHUNK - 1) / SK_CHUNK;
    const int64_t want = (int64_t)(sm_count > 0 ? sm_count : 132) * 8; /* 2 waves of 4-warp blocks at 12-16 warps/SM */
    int64_t splits = (want + blocks - 1) / blocks;
    const int64_t max_by_k = chunks / (SK_WARPS * 2); /* keep >= 2 chunks per warp */
    if (splits > max_by_k) splits = max_by_k;
    if (splits > 16) splits = 16;
    if (splits < 1) splits = 1;
    return (int32_t)splits;
}

extern "C" int fp4d_cuda_skinny_gemm(const fp4d_skinny_args *args, void *stream)
{
    if (args->k % 32 != 0 || args->num_items <= 0 || args->num_items > 65535 || args->splits < 1 ||
        args->splits > 65535)
        return (int)cudaErrorInvalidValue;
    const dim3 grid((unsigned)((args->n + SK_BN - 1) / SK_BN), (unsigned)args->splits, (unsigned)args->num_items);
    cudaStream_t s = (cudaStream_t)stream;
    const bool two = args->max_rows > 16;
    const bool fp4a = args->a_type == FP4D_DTYPE_NVFP4 || args->a_type == FP4D_DTYPE_MXFP4;
    const char *env = getenv("FP4DOCTOR_CUDA_SKINNY_ASYNC"); /* 0 = register prefetch variant */
    const bool async = !(env && env[0] == '0');
    const int ak = fp4a ? AK_FP4 : args->a_type == FP4D_DTYPE_F16 ? AK_F16 : AK_BF16;
#define FP4D_SKINNY_LAUNCH(MT_, AK_)                                                                   \
    do {                                                                                               \
        if (async) skinny_kernel<MT_, AK_, true><<<grid, SK_WARPS * 32, 0, s>>>(*args);              \
        else skinny_kernel<MT_, AK_, false><<<grid, SK_WARPS * 32, 0, s>>>(*args);                   \
    } while (0)
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

extern "C" int fp4d_cuda_quantize_nvfp4(int src_type, const void *src, int64_t rows, int64_t cols, float encode_scale,
                                        int layout, uint8_t *codes, uint8_t *scales, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    const int64_t work = rows * (cols / 16);
    if (work == 0) return cudaSuccess;
    const int grid = grid_for(work, 256);
    if (src_type == FP4D_DTYPE_F32)
        quantize_nvfp4_kernel<float><<<grid, 256, 0, s>>>((const float *)src, rows, cols, encode_scale, layout, codes, scales);
    else if (src_type == FP4D_DTYPE_BF16)
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
