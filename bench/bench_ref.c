/*
 * bench_ref: how fast the exact reference is (docs/reference.md).
 *
 * The doctor computes small outputs fully with fp4d_ref_gemm and samples large ones with
 * fp4d_ref_gemm_element, so both are timed: the full 256x256x4096 GEMM for each A type
 * (target: well under a second on 2 cores) and one element at K = 16384.
 *
 * usage: fp4d_bench_ref [--quick]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fp4doctor/ref.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Random FP4 codes with plausible scales (e4m3 around 1, ue8m0 around 2^0). */
static fp4d_matrix make_fp4(fp4d_dtype t, int64_t rows, int64_t k)
{
    int bs = t == FP4D_DTYPE_NVFP4 ? 16 : 32;
    size_t nd = (size_t)(rows * k / 2), ns = fp4d_scale_buffer_size(FP4D_LAYOUT_SWIZZLED_128X4, rows, k / bs);
    uint8_t *d = malloc(nd), *s = calloc(ns, 1);
    for (size_t i = 0; i < nd; i++) d[i] = (uint8_t)rng();
    for (size_t i = 0; i < ns; i++) s[i] = t == FP4D_DTYPE_NVFP4 ? (uint8_t)(0x28 + rng() % 32) : (uint8_t)(120 + rng() % 14);
    return (fp4d_matrix){t, rows, k, d, s, FP4D_LAYOUT_SWIZZLED_128X4};
}

static fp4d_matrix make_plain(fp4d_dtype t, int64_t rows, int64_t k)
{
    size_t n = (size_t)(rows * k);
    float *f = malloc(n * sizeof *f);
    for (size_t i = 0; i < n; i++) f[i] = (float)((double)(int32_t)rng() / 2147483648.0);
    void *d = malloc(n * (t == FP4D_DTYPE_F32 ? 4 : 2));
    fp4d_from_f32(t, f, n, d);
    free(f);
    return (fp4d_matrix){t, rows, k, d, NULL, FP4D_LAYOUT_LINEAR};
}

static void free_matrix(fp4d_matrix *m)
{
    free((void *)m->data);
    free((void *)m->scales);
}

int main(int argc, char **argv)
{
    bool quick = argc > 1 && !strcmp(argv[1], "--quick");
    const int64_t M = quick ? 64 : 256, N = quick ? 64 : 256, K = 4096;
    const fp4d_dtype a_types[] = {FP4D_DTYPE_NVFP4, FP4D_DTYPE_MXFP4, FP4D_DTYPE_BF16, FP4D_DTYPE_F32};
    printf("exact reference, %lldx%lldx%lld, f32 output\n", (long long)M, (long long)N, (long long)K);
    float *out = malloc((size_t)(M * N) * 4);
    for (size_t i = 0; i < sizeof a_types / sizeof a_types[0]; i++) {
        fp4d_dtype bt = a_types[i] == FP4D_DTYPE_MXFP4 ? FP4D_DTYPE_MXFP4 : FP4D_DTYPE_NVFP4;
        fp4d_matrix a = (a_types[i] == FP4D_DTYPE_NVFP4 || a_types[i] == FP4D_DTYPE_MXFP4)
                            ? make_fp4(a_types[i], M, K) : make_plain(a_types[i], M, K);
        fp4d_matrix b = make_fp4(bt, N, K);
        fp4d_gemm_problem p = {a, b, 1.0f, FP4D_DTYPE_F32, out};
        double best = 1e9;
        for (int rep = 0; rep < 3; rep++) {
            double t0 = now_s();
            if (fp4d_ref_gemm(&p) != FP4D_STATUS_OK) {
                fprintf(stderr, "ref failed: %s\n", fp4d_last_error());
                return 1;
            }
            double t = now_s() - t0;
            if (t < best) best = t;
        }
        printf("  A=%-6s B=%-6s  %8.3f s   %7.1f M exact products/s\n", fp4d_dtype_get(a_types[i])->name,
               fp4d_dtype_get(bt)->name, best, (double)M * N * K / best / 1e6);
        free_matrix(&a);
        free_matrix(&b);
    }
    free(out);

    /* One element at K = 16384 (the sampling path). */
    const int64_t KL = 16384;
    fp4d_matrix a = make_plain(FP4D_DTYPE_BF16, 8, KL), b = make_fp4(FP4D_DTYPE_NVFP4, 8, KL);
    fp4d_gemm_problem p = {a, b, 1.0f, FP4D_DTYPE_BF16, NULL};
    uint16_t e;
    int reps = quick ? 100 : 1000;
    double t0 = now_s();
    for (int r = 0; r < reps; r++) fp4d_ref_gemm_element(&p, r % 8, (r / 8) % 8, &e, NULL);
    printf("one element, bf16 x nvfp4, K=%lld: %.1f us\n", (long long)KL, (now_s() - t0) / reps * 1e6);
    free_matrix(&a);
    free_matrix(&b);
    return 0;
}
