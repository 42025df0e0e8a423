/*
 * bench_writer.c - the safetensors writer's cost per tensor as the tensor count grows:
 * `quantize` writes three tensors per input tensor, and checkpoints have tens of thousands.
 * Writes N tiny tensors (one 1x16 f32 each) for N = 3,000 and 30,000 and reports the time per
 * tensor of each (the best of three runs) and their ratio, the anchor being the 3,000-tensor run
 * of the same process: a
 * writer that stays linear in the count has a ratio near 1 (goal <= 2). Before the writer
 * looked names up in a hash, each add compared the name with every earlier one: 30,000
 * tensors took 112 s in `quantize`, a ratio near 10.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "fp4doctor/io.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Seconds to build and save a file of n tensors; negative on failure. */
static double write_tensors(int n, const char *path)
{
    static float v[16];
    const int64_t shape[2] = {1, 16};
    const double t0 = now_s();
    fp4d_st_writer *w = fp4d_st_writer_new();
    if (!w) return -1.0;
    for (int i = 0; i < n; i++) {
        char name[64];
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.w", i / 1000, i % 1000);
        if (fp4d_st_writer_add(w, name, FP4D_ST_F32, 2, shape, v, sizeof v) != FP4D_STATUS_OK) {
            fp4d_st_writer_free(w);
            return -1.0;
        }
    }
    const fp4d_status st = fp4d_st_writer_save(w, path);
    fp4d_st_writer_free(w);
    unlink(path);
    return st == FP4D_STATUS_OK ? now_s() - t0 : -1.0;
}

int main(void)
{
    char path[] = "/tmp/fp4d-bench-writer-XXXXXX";
    const int fd = mkstemp(path);
    if (fd < 0) return 1;
    close(fd);
    const int small = 3000, large = 30000;
    double ts = 1e30, tl = 1e30; /* the best of three: the file's save (fsync) is noisy */
    for (int r = 0; r < 3; r++) {
        const double a = write_tensors(small, path), b = write_tensors(large, path);
        if (a <= 0 || b <= 0) ts = tl = -1.0;
        if (ts < 0) break;
        if (a < ts) ts = a;
        if (b < tl) tl = b;
    }
    if (ts <= 0 || tl <= 0) {
        fprintf(stderr, "bench_writer: %s\n", fp4d_last_error());
        return 1;
    }
    const double per_s = ts / small * 1e6, per_l = tl / large * 1e6;
    printf("bench_writer: safetensors writer, 1x16 f32 tensors\n");
    printf("  %6d tensors  %7.3f s  %6.2f us per tensor (anchor)\n", small, ts, per_s);
    printf("  %6d tensors  %7.3f s  %6.2f us per tensor  ratio to the anchor %.2f (goal <= 2)\n", large, tl, per_l,
           per_l / per_s);
    return 0;
}
