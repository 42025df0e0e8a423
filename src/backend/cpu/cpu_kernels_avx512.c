/*
 * AVX-512 (F) kernels of the CPU engine: the 4 x 4 dot-product tile for large M (16-lane
 * FMAs), and the small-M kernel, where 16-entry table lookups (vpermps) decode FP4 in
 * about a third of the AVX2 instructions. Row decoding reuses the AVX2 code. Runtime
 * dispatch as for AVX2.
 */
#include "backend/cpu/cpu_internal.h"

#if defined(__x86_64__) && defined(__GNUC__)

#include <immintrin.h>
#include <stdlib.h>

#define FP4D_AVX512 __attribute__((target("avx512f,avx512bw,avx2,fma")))

/*
 * Small M. AVX-512 has a 16-entry f32 table lookup (vpermps) and a 32-entry two-table one
 * (vpermt2ps): the block's 16 e2m1 values times its scale form the table, and the FP4
 * codes, widened to one byte per lane, index it directly: the low nibble (even element)
 * through the low 4 bits, the high nibble (odd element) after a 4-bit shift. Even and
 * odd elements land in separate vectors, so the activations are de-interleaved once per
 * call to match. Two NVFP4 blocks share a vector: lanes 8..15 take the second table.
 * Every table entry is e2m1 * scale, exact in f32, so the sums stay plain f32 dot products.
 */
FP4D_AVX512 static inline __attribute__((always_inline)) void
smallm512_row(const float *ad, const int mrows, int64_t k, const uint8_t *row, const uint8_t *srow, int qs,
              const bool mx, const float *scale_lut, const bool swap, float *out, int64_t ld)
{
    static const float e2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    const __m512   lut   = _mm512_loadu_ps(e2m1);
    const __m512i  hi16  = _mm512_set_epi32(16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i  nib   = _mm512_set1_epi32(0xF);
    const int64_t  nch   = k / 32, stride = (nch + (k % 32 != 0)) * 32;
    __m512         acc[4][2];
    for (int i = 0; i < 4; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (int64_t c = 0; c < nch; c++) {
        const __m512i x  = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(row + c * 16)));
        const __m512i xl = x, xh = _mm512_srli_epi32(x, 4);
        __m512        we, wo;
        if (mx) {
            const __m512 t = _mm512_mul_ps(lut, _mm512_set1_ps(scale_lut[srow[((c >> 2) << qs) + (c & 3)]]));
            we             = _mm512_permutexvar_ps(swap ? xh : xl, t);
            wo             = _mm512_permutexvar_ps(swap ? xl : xh, t);
        } else {
            const int64_t  g  = 2 * c; /* even: both scales in one quad */
            const uint8_t *sp = srow + ((g >> 2) << qs) + (g & 3);
            const __m512   t0 = _mm512_mul_ps(lut, _mm512_set1_ps(scale_lut[sp[0]]));
            const __m512   t1 = _mm512_mul_ps(lut, _mm512_set1_ps(scale_lut[sp[1]]));
            /* (x & 0xF) | hi16 in one ternary-logic op; x >> 4 is already < 16. */
            const __m512i il = _mm512_ternarylogic_epi32(xl, nib, hi16, 0xEA);
            const __m512i ih = _mm512_or_si512(xh, hi16);
            we               = _mm512_permutex2var_ps(t0, swap ? ih : il, t1);
            wo               = _mm512_permutex2var_ps(t0, swap ? il : ih, t1);
        }
        for (int i = 0; i < mrows; i++) {
            const float *ai = ad + i * stride + c * 32;
            acc[i][0]       = _mm512_fmadd_ps(_mm512_load_ps(ai), we, acc[i][0]);
            acc[i][1]       = _mm512_fmadd_ps(_mm512_load_ps(ai + 16), wo, acc[i][1]);
        }
    }
    if (k % 32 != 0) { /* NVFP4 with K = 16 mod 32: one last block in lanes 0..7 */
        const int64_t  c  = nch, g = 2 * c;
        const __m512i  x  = _mm512_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(row + c * 16)));
        const __m512i  xh = _mm512_srli_epi32(x, 4);
        const __m512   t0 = _mm512_mul_ps(lut, _mm512_set1_ps(scale_lut[srow[((g >> 2) << qs) + (g & 3)]]));
        const __m512   we = _mm512_permutexvar_ps(swap ? xh : x, t0), wo = _mm512_permutexvar_ps(swap ? x : xh, t0);
        const __mmask16 m = 0x00FF; /* lanes 8..15 hold no element: keep them out of the sum */
        for (int i = 0; i < mrows; i++) {
            const float *ai = ad + i * stride + c * 32;
            acc[i][0]       = _mm512_mask3_fmadd_ps(_mm512_load_ps(ai), we, acc[i][0], m);
            acc[i][1]       = _mm512_mask3_fmadd_ps(_mm512_load_ps(ai + 16), wo, acc[i][1], m);
        }
    }
    for (int i = 0; i < mrows; i++) out[i * ld] = _mm512_reduce_add_ps(_mm512_add_ps(acc[i][0], acc[i][1]));
}

FP4D_AVX512 static void smallm512_rows(const float *ad, int mrows, int64_t k, const uint8_t *row, const uint8_t *srow,
                                       int qs, bool mx, const float *scale_lut, bool swap, float *out, int64_t ld)
{
#define SM512(R, MX, SW) smallm512_row(ad, R, k, row, srow, qs, MX, scale_lut, SW, out, ld)
#define SM512_ROWS(MX, SW)                                                                             switch (mrows) {                                                                                   case 1: SM512(1, MX, SW); break;                                                                   case 2: SM512(2, MX, SW); break;                                                                   case 3: SM512(3, MX, SW); break;                                                                   default: SM512(4, MX, SW); break;                                                                  }
    if (mx) {
        if (swap) SM512_ROWS(true, true) else SM512_ROWS(true, false)
    } else {
        if (swap) SM512_ROWS(false, true) else SM512_ROWS(false, false)
    }
#undef SM512_ROWS
#undef SM512
}

FP4D_AVX512 static void smallm_avx512(const float *a, int mrows, int64_t k, const fp4d_cpu_operand *b, int64_t n0,
                                      int64_t n1, float *scratch, float *acc, int64_t ld)
{
    /* De-interleave the activations per 32-element chunk: [even 16 | odd 16]. */
    const int64_t nch = (k + 31) / 32, stride = nch * 32;
    float        *ad  = NULL;
    if (posix_memalign((void **)&ad, 64, (size_t)(mrows * stride) * sizeof(float)) != 0) {
        fp4d_cpu_smallm_avx2(a, mrows, k, b, n0, n1, scratch, acc, ld); /* no memory: the AVX2 way */
        return;
    }
    for (int i = 0; i < mrows; i++)
        for (int64_t c = 0; c < nch; c++)
            for (int j = 0; j < 16; j++) {
                int64_t e = c * 32 + 2 * j;
                ad[i * stride + c * 32 + j]      = e < k ? a[i * k + e] : 0.0f;
                ad[i * stride + c * 32 + 16 + j] = e + 1 < k ? a[i * k + e + 1] : 0.0f;
            }
    const uint8_t *codes = b->data;
    for (int64_t n = n0; n < n1; n++) {
        int            qs;
        const uint8_t *srow = fp4d_cpu_scale_row(b, n, (uint8_t *)scratch, &qs);
        smallm512_rows(ad, mrows, k, codes + n * (k / 2), srow, qs, b->block_size == 32, b->scale_lut, b->nibble_swap,
                       acc + (n - n0), ld);
    }
    free(ad);
}

/* The 4 x 4 tile's 16 accumulators reduced to one vector with lane 4i + j = sum of
 * acc[i][j]: 512 -> 128 bits per accumulator (blocks), then across rows within blocks,
 * then one permute; about 45 shuffles and adds for the 16 sums. */
FP4D_AVX512 static inline __attribute__((always_inline)) __m512 reduce16(__m512 v[4][4])
{
    __m512 q[4];
    for (int i = 0; i < 4; i++) {
        /* blocks 0,1: halves of v[i][0] (blocks 2,3: of v[i][1]) summed; same for 2 and 3 */
        __m512 p01 = _mm512_add_ps(_mm512_shuffle_f32x4(v[i][0], v[i][1], 0x44),
                                   _mm512_shuffle_f32x4(v[i][0], v[i][1], 0xEE));
        __m512 p23 = _mm512_add_ps(_mm512_shuffle_f32x4(v[i][2], v[i][3], 0x44),
                                   _mm512_shuffle_f32x4(v[i][2], v[i][3], 0xEE));
        /* block j of q[i]: four partial sums of v[i][j] */
        q[i] = _mm512_add_ps(_mm512_shuffle_f32x4(p01, p23, 0x88), _mm512_shuffle_f32x4(p01, p23, 0xDD));
    }
    __m512 r01 = _mm512_add_ps(_mm512_shuffle_ps(q[0], q[1], 0x44), _mm512_shuffle_ps(q[0], q[1], 0xEE));
    __m512 r23 = _mm512_add_ps(_mm512_shuffle_ps(q[2], q[3], 0x44), _mm512_shuffle_ps(q[2], q[3], 0xEE));
    /* lane 4j + i = sum of v[i][j] */
    __m512 f = _mm512_add_ps(_mm512_shuffle_ps(r01, r23, 0x88), _mm512_shuffle_ps(r01, r23, 0xDD));
    static const int32_t transpose[16] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};
    return _mm512_permutexvar_ps(_mm512_loadu_si512(transpose), f);
}

/* 4 x 4 dot products, 16 accumulators of 16 lanes: 16 FMAs per 8 loads. */
FP4D_AVX512 static void dot4x4_avx512(const float *const a[4], const float *const b[4], int64_t kc, float *c,
                                      int64_t ldc, bool accumulate, int mr, int nr)
{
    __m512 acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = _mm512_setzero_ps();
    const float *a0 = a[0], *a1 = a[1], *a2 = a[2], *a3 = a[3];
    const float *b0 = b[0], *b1 = b[1], *b2 = b[2], *b3 = b[3];
    for (int64_t kk = 0; kk < kc; kk += 16) {
        const __m512 x0 = _mm512_loadu_ps(a0 + kk), x1 = _mm512_loadu_ps(a1 + kk), x2 = _mm512_loadu_ps(a2 + kk),
                     x3 = _mm512_loadu_ps(a3 + kk);
        const __m512 y0 = _mm512_loadu_ps(b0 + kk), y1 = _mm512_loadu_ps(b1 + kk), y2 = _mm512_loadu_ps(b2 + kk),
                     y3 = _mm512_loadu_ps(b3 + kk);
#define DOT_ROW(i, x)                                                                              \
    acc[i][0] = _mm512_fmadd_ps(x, y0, acc[i][0]);                                                 \
    acc[i][1] = _mm512_fmadd_ps(x, y1, acc[i][1]);                                                 \
    acc[i][2] = _mm512_fmadd_ps(x, y2, acc[i][2]);                                                 \
    acc[i][3] = _mm512_fmadd_ps(x, y3, acc[i][3])
        DOT_ROW(0, x0);
        DOT_ROW(1, x1);
        DOT_ROW(2, x2);
        DOT_ROW(3, x3);
#undef DOT_ROW
    }
    const __m512 r = reduce16(acc);
    if (mr == 4 && nr == 4) {
        __m128 row[4] = {_mm512_castps512_ps128(r), _mm512_extractf32x4_ps(r, 1), _mm512_extractf32x4_ps(r, 2),
                         _mm512_extractf32x4_ps(r, 3)};
        for (int i = 0; i < 4; i++) {
            if (accumulate) row[i] = _mm_add_ps(row[i], _mm_loadu_ps(c + i * ldc));
            _mm_storeu_ps(c + i * ldc, row[i]);
        }
        return;
    }
    float sums[16];
    _mm512_storeu_ps(sums, r);
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) c[i * ldc + j] = accumulate ? c[i * ldc + j] + sums[4 * i + j] : sums[4 * i + j];
}

static const fp4d_cpu_kernels avx512_kernels = {
    .isa     = FP4D_CPU_ISA_AVX512,
    .decode  = fp4d_cpu_decode_avx2,
    .smallm  = smallm_avx512,
    .ukernel = NULL, /* large M runs on the dot-product tiles */
    .dot4x4  = dot4x4_avx512,
    .dot_mr  = 4,
    .dot_nr  = 4,
    .dot_kc  = 1024,
    .dot_nc  = 128,
};

const fp4d_cpu_kernels *fp4d_cpu_kernels_avx512(void) { return &avx512_kernels; }

#else

const fp4d_cpu_kernels *fp4d_cpu_kernels_avx512(void) { return 0; }

#endif
