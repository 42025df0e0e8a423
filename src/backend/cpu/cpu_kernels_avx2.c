/*
 * AVX2 + FMA kernels of the CPU engine. The file is compiled for the baseline x86-64 ISA
 * with these functions alone targeted at AVX2/FMA; the engine calls them only after
 * fp4d_cpu_isa_available() has seen the CPU flags (runtime dispatch).
 *
 * FP4 decode, 16 codes at a time: split the 8 bytes into low and high nibbles, interleave
 * them back into element order (even element = low nibble, spec §1.5), look up 2*e2m1 as
 * int8 with pshufb, widen to f32 and multiply by scale/2. Every step is exact.
 */
#include "backend/cpu/cpu_internal.h"

#if defined(__x86_64__) && defined(__GNUC__)

#include <immintrin.h>
#include <string.h>

#define FP4D_AVX2 __attribute__((target("avx2,fma")))
#define FP4D_AVX2_INLINE __attribute__((target("avx2,fma"), always_inline)) static inline

/* 2 * e2m1(code) as int8: exact small integers, halved again through the scale. */
FP4D_AVX2_INLINE __m128i e2m1x2_lut(void)
{
    return _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
}

FP4D_AVX2_INLINE void decode16(const uint8_t *p, __m128i lut, bool swap, __m256 half_scale, __m256 *w0,
                               __m256 *w1)
{
    const __m128i low_mask = _mm_set1_epi8(0x0F);
    __m128i       bytes    = _mm_loadl_epi64((const __m128i *)p);
    __m128i       lo       = _mm_and_si128(bytes, low_mask);
    __m128i       hi       = _mm_and_si128(_mm_srli_epi16(bytes, 4), low_mask);
    __m128i       codes    = swap ? _mm_unpacklo_epi8(hi, lo) : _mm_unpacklo_epi8(lo, hi);
    __m128i       v        = _mm_shuffle_epi8(lut, codes);
    *w0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), half_scale);
    *w1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8))), half_scale);
}

FP4D_AVX2 void fp4d_cpu_decode_avx2(const uint8_t *codes, const float *scale16, int64_t nblk16, bool nibble_swap,
                                  float *dst)
{
    const __m128i lut = e2m1x2_lut();
    for (int64_t g = 0; g < nblk16; g++) {
        __m256 w0, w1;
        decode16(codes + g * 8, lut, nibble_swap, _mm256_set1_ps(scale16[g] * 0.5f), &w0, &w1);
        _mm256_storeu_ps(dst + g * 16, w0);
        _mm256_storeu_ps(dst + g * 16 + 8, w1);
    }
}

FP4D_AVX2_INLINE float hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s        = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s        = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 32 codes (16 bytes, two groups of 16) into four vectors; group 0 times h0, group 1 times h1. */
FP4D_AVX2_INLINE void decode32(const uint8_t *p, __m128i lut, const bool swap, __m256 h0, __m256 h1, __m256 w[4])
{
    const __m128i low_mask = _mm_set1_epi8(0x0F);
    __m128i       bytes    = _mm_loadu_si128((const __m128i *)p);
    __m128i       lo       = _mm_and_si128(bytes, low_mask);
    __m128i       hi       = _mm_and_si128(_mm_srli_epi16(bytes, 4), low_mask);
    __m128i       c0       = swap ? _mm_unpacklo_epi8(hi, lo) : _mm_unpacklo_epi8(lo, hi);
    __m128i       c1       = swap ? _mm_unpackhi_epi8(hi, lo) : _mm_unpackhi_epi8(lo, hi);
    __m128i       v0       = _mm_shuffle_epi8(lut, c0), v1 = _mm_shuffle_epi8(lut, c1);
    w[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v0)), h0);
    w[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v0, 8))), h0);
    w[2] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v1)), h1);
    w[3] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v1, 8))), h1);
}

/*
 * One weight row against mrows activation rows, two groups of 16 per step with separate
 * accumulators (hides the FMA latency). Block scales are read straight from the row's
 * scale bytes (scale c at srow[(c >> 2 << qs) + (c & 3)]); mx: 32-element blocks.
 */
FP4D_AVX2_INLINE void smallm_row(const float *a, const int mrows, int64_t k, const uint8_t *row, const uint8_t *srow,
                                 int qs, const bool mx, const float *half_lut, const bool swap, float *out, int64_t ld)
{
    const __m128i lut = e2m1x2_lut();
    __m256        acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int q = 0; q < 4; q++) acc[i][q] = _mm256_setzero_ps();
    const int64_t ng = k / 16;
    int64_t       g  = 0;
    for (; g + 2 <= ng; g += 2) {
        __m256 h0, h1, w[4];
        if (mx) {
            int64_t c = g >> 1;
            h0 = h1 = _mm256_broadcast_ss(&half_lut[srow[((c >> 2) << qs) + (c & 3)]]);
        } else {
            const uint8_t *sp = srow + ((g >> 2) << qs) + (g & 3); /* g even: both in one quad */
            h0 = _mm256_broadcast_ss(&half_lut[sp[0]]);
            h1 = _mm256_broadcast_ss(&half_lut[sp[1]]);
        }
        decode32(row + g * 8, lut, swap, h0, h1, w);
        for (int i = 0; i < mrows; i++) {
            const float *ai = a + i * k + g * 16;
            acc[i][0] = _mm256_fmadd_ps(_mm256_loadu_ps(ai), w[0], acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(_mm256_loadu_ps(ai + 8), w[1], acc[i][1]);
            acc[i][2] = _mm256_fmadd_ps(_mm256_loadu_ps(ai + 16), w[2], acc[i][2]);
            acc[i][3] = _mm256_fmadd_ps(_mm256_loadu_ps(ai + 24), w[3], acc[i][3]);
        }
    }
    if (g < ng) { /* an odd number of NVFP4 groups: the last one alone */
        __m256 w0, w1;
        decode16(row + g * 8, lut, swap, _mm256_broadcast_ss(&half_lut[srow[((g >> 2) << qs) + (g & 3)]]), &w0, &w1);
        for (int i = 0; i < mrows; i++) {
            const float *ai = a + i * k + g * 16;
            acc[i][0] = _mm256_fmadd_ps(_mm256_loadu_ps(ai), w0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(_mm256_loadu_ps(ai + 8), w1, acc[i][1]);
        }
    }
    for (int i = 0; i < mrows; i++)
        out[i * ld] = hsum256(_mm256_add_ps(_mm256_add_ps(acc[i][0], acc[i][1]), _mm256_add_ps(acc[i][2], acc[i][3])));
}

/* Constant row counts, block sizes and nibble orders let the compiler keep everything in
 * registers and drop the branches: one specialised loop per combination. */
FP4D_AVX2_INLINE void smallm_rows(const float *a, int mrows, int64_t k, const uint8_t *row, const uint8_t *srow,
                                  int qs, const bool mx, const float *half_lut, const bool swap, float *out,
                                  int64_t ld)
{
    switch (mrows) {
    case 1: smallm_row(a, 1, k, row, srow, qs, mx, half_lut, swap, out, ld); break;
    case 2: smallm_row(a, 2, k, row, srow, qs, mx, half_lut, swap, out, ld); break;
    case 3: smallm_row(a, 3, k, row, srow, qs, mx, half_lut, swap, out, ld); break;
    default: smallm_row(a, 4, k, row, srow, qs, mx, half_lut, swap, out, ld); break;
    }
}

FP4D_AVX2 void fp4d_cpu_smallm_avx2(const float *a, int mrows, int64_t k, const fp4d_cpu_operand *b, int64_t n0,
                                    int64_t n1, float *scratch, float *acc, int64_t ld)
{
    const uint8_t *codes = b->data;
    const bool     mx = b->block_size == 32, swap = b->nibble_swap;
    for (int64_t n = n0; n < n1; n++) {
        int            qs;
        const uint8_t *srow = fp4d_cpu_scale_row(b, n, (uint8_t *)scratch, &qs);
        const uint8_t *row  = codes + n * (k / 2);
        float         *o    = acc + (n - n0);
        if (mx) {
            if (swap) smallm_rows(a, mrows, k, row, srow, qs, true, b->scale_half_lut, true, o, ld);
            else smallm_rows(a, mrows, k, row, srow, qs, true, b->scale_half_lut, false, o, ld);
        } else {
            if (swap) smallm_rows(a, mrows, k, row, srow, qs, false, b->scale_half_lut, true, o, ld);
            else smallm_rows(a, mrows, k, row, srow, qs, false, b->scale_half_lut, false, o, ld);
        }
    }
}

/* Sums the 8 lanes of each of four vectors into the four lanes of the result. */
FP4D_AVX2_INLINE __m128 reduce4_256(__m256 v0, __m256 v1, __m256 v2, __m256 v3)
{
    __m256 s01 = _mm256_hadd_ps(v0, v1), s23 = _mm256_hadd_ps(v2, v3);
    __m256 s   = _mm256_hadd_ps(s01, s23); /* per 128-bit half: v0 v1 v2 v3 partials */
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

/* 3 x 4 dot products: 12 accumulators + 3 activation vectors + 1 weight vector = the
 * 16 ymm registers; 12 FMAs per 7 loads. */
FP4D_AVX2 static void dot3x4_avx2(const float *const a[4], const float *const b[4], int64_t kc, float *c, int64_t ldc,
                                  bool accumulate, int mr, int nr)
{
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps(), c02 = _mm256_setzero_ps(), c03 = _mm256_setzero_ps();
    __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps(), c12 = _mm256_setzero_ps(), c13 = _mm256_setzero_ps();
    __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps(), c22 = _mm256_setzero_ps(), c23 = _mm256_setzero_ps();
    const float *a0 = a[0], *a1 = a[1], *a2 = a[2], *b0 = b[0], *b1 = b[1], *b2 = b[2], *b3 = b[3];
    for (int64_t kk = 0; kk < kc; kk += 8) {
        const __m256 x0 = _mm256_loadu_ps(a0 + kk), x1 = _mm256_loadu_ps(a1 + kk), x2 = _mm256_loadu_ps(a2 + kk);
        __m256       y = _mm256_loadu_ps(b0 + kk);
        c00 = _mm256_fmadd_ps(x0, y, c00), c10 = _mm256_fmadd_ps(x1, y, c10), c20 = _mm256_fmadd_ps(x2, y, c20);
        y   = _mm256_loadu_ps(b1 + kk);
        c01 = _mm256_fmadd_ps(x0, y, c01), c11 = _mm256_fmadd_ps(x1, y, c11), c21 = _mm256_fmadd_ps(x2, y, c21);
        y   = _mm256_loadu_ps(b2 + kk);
        c02 = _mm256_fmadd_ps(x0, y, c02), c12 = _mm256_fmadd_ps(x1, y, c12), c22 = _mm256_fmadd_ps(x2, y, c22);
        y   = _mm256_loadu_ps(b3 + kk);
        c03 = _mm256_fmadd_ps(x0, y, c03), c13 = _mm256_fmadd_ps(x1, y, c13), c23 = _mm256_fmadd_ps(x2, y, c23);
    }
    __m128 row[3] = {reduce4_256(c00, c01, c02, c03), reduce4_256(c10, c11, c12, c13), reduce4_256(c20, c21, c22, c23)};
    if (nr == 4) {
        for (int i = 0; i < mr; i++) {
            if (accumulate) row[i] = _mm_add_ps(row[i], _mm_loadu_ps(c + i * ldc));
            _mm_storeu_ps(c + i * ldc, row[i]);
        }
        return;
    }
    for (int i = 0; i < mr; i++) {
        float sums[4];
        _mm_storeu_ps(sums, row[i]);
        for (int j = 0; j < nr; j++) c[i * ldc + j] = accumulate ? c[i * ldc + j] + sums[j] : sums[j];
    }
}

static const fp4d_cpu_kernels avx2_kernels = {
    .isa     = FP4D_CPU_ISA_AVX2,
    .decode  = fp4d_cpu_decode_avx2,
    .smallm  = fp4d_cpu_smallm_avx2,
    .ukernel = NULL, /* large M runs on the dot-product tiles */
    .dot4x4  = dot3x4_avx2,
    .dot_mr  = 3,
    .dot_nr  = 4,
    .dot_kc  = 1024,
    .dot_nc  = 128,
};

const fp4d_cpu_kernels *fp4d_cpu_kernels_avx2(void) { return &avx2_kernels; }

#else

const fp4d_cpu_kernels *fp4d_cpu_kernels_avx2(void) { return 0; }

#endif
