/*
 * Portable reference kernels of the CPU engine: plain C that any compiler vectorizes a
 * little. They define the behaviour the SIMD kernels must match (within the f32 bound),
 * and they are what runs on CPUs without AVX2.
 */
#include <string.h>

#include "backend/cpu/cpu_internal.h"

const float fp4d_cpu_e2m1_values[16] = {
    0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f,
};

static void decode_generic(const uint8_t *codes, const float *scale16, int64_t nblk16, bool nibble_swap,
                           float *dst)
{
    const int even_shift = nibble_swap ? 4 : 0, odd_shift = nibble_swap ? 0 : 4;
    for (int64_t g = 0; g < nblk16; g++) {
        const float s = scale16[g];
        for (int j = 0; j < 8; j++) {
            uint8_t byte = codes[g * 8 + j];
            /* e2m1 * scale has at most 6 significant bits: exact in f32. */
            dst[g * 16 + 2 * j]     = fp4d_cpu_e2m1_values[(byte >> even_shift) & 0xF] * s;
            dst[g * 16 + 2 * j + 1] = fp4d_cpu_e2m1_values[(byte >> odd_shift) & 0xF] * s;
        }
    }
}

static void smallm_generic(const float *a, int mrows, int64_t k, const fp4d_cpu_operand *b, int64_t n0,
                           int64_t n1, float *scale16, float *acc, int64_t ld)
{
    const uint8_t *codes = b->data;
    const int64_t  row_bytes = k / 2;
    float          w[16];
    for (int64_t n = n0; n < n1; n++) {
        fp4d_cpu_gather_scales16(b, n, 0, k / 16, scale16);
        float sum[4] = {0, 0, 0, 0};
        for (int64_t g = 0; g < k / 16; g++) {
            decode_generic(codes + n * row_bytes + g * 8, scale16 + g, 1, b->nibble_swap, w);
            for (int i = 0; i < mrows; i++) {
                const float *ai = a + i * k + g * 16;
                float        part = 0.0f;
                /* Summing a group first and then adding it is still one f32 dot product:
                 * no term passes through more than k roundings. */
                for (int j = 0; j < 16; j++) part += ai[j] * w[j];
                sum[i] += part;
            }
        }
        for (int i = 0; i < mrows; i++) acc[i * ld + (n - n0)] = sum[i];
    }
}

enum { GENERIC_MR = 4, GENERIC_NR = 8 };

static void ukernel_generic(int64_t kc, const float *ap, const float *bp, float *c, int64_t ldc,
                            bool accumulate, int mr, int nr)
{
    float t[GENERIC_MR][GENERIC_NR];
    memset(t, 0, sizeof t);
    for (int64_t kk = 0; kk < kc; kk++) {
        for (int i = 0; i < GENERIC_MR; i++) {
            const float ai = ap[kk * GENERIC_MR + i];
            for (int j = 0; j < GENERIC_NR; j++) t[i][j] += ai * bp[kk * GENERIC_NR + j];
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) c[i * ldc + j] = accumulate ? c[i * ldc + j] + t[i][j] : t[i][j];
}

static const fp4d_cpu_kernels generic_kernels = {
    .isa     = FP4D_CPU_ISA_GENERIC,
    .mr      = GENERIC_MR,
    .nr      = GENERIC_NR,
    .mc      = 64,
    .kc      = 256,
    .nc      = 2048,
    .decode  = decode_generic,
    .smallm  = smallm_generic,
    .ukernel = ukernel_generic,
};

const fp4d_cpu_kernels *fp4d_cpu_kernels_generic(void) { return &generic_kernels; }
