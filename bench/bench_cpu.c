/*
 * bench_cpu: the `cpu` backend against OpenBLAS on the same weights, in the same run.
 *
 * The anchor is what a user without FP4 kernels would do: dequantize the NVFP4 weights to
 * f32 once and call cblas_sgemv (M = 1) or cblas_sgemm. Both sides get the same number of
 * threads and f32 activations. Targets (issue 3): M = 1 at least 2x faster than sgemv
 * (FP4 moves 7x fewer bytes); M >= 256 at least 0.7x sgemm's throughput.
 *
 * usage: fp4d_bench_cpu [--quick] [--repeats N]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/cpu_internal.h"
#include "fp4doctor/backend.h"
#include "fp4doctor/formats.h"

#ifdef FP4D_HAVE_OPENBLAS
#include <cblas.h>
#endif

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint64_t rng_state = 0x1234567887654321ULL;
static uint64_t rng(void)
{
    rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1DULL;
}

typedef struct bench_shape {
    int64_t     m, n, k;
    fp4d_dtype  a_type;
    double      target;     /* required ratio anchor_time / cpu_time; 0 = informational */
    const char *note;
} bench_shape;

typedef void (*timed_fn)(void *ctx);

typedef struct timing {
    double median_us, min_us;
} timing;

/* Times fn_a and fn_b alternately (so that both see the same machine load), after one
 * warm-up call each (page faults, thread start-up, caches). fn_b may be NULL. */
static void time_pair(timed_fn fn_a, void *ctx_a, timed_fn fn_b, void *ctx_b, int repeats, timing *ta, timing *tb)
{
    double *a = malloc((size_t)repeats * sizeof *a), *b = malloc((size_t)repeats * sizeof *b);
    fn_a(ctx_a);
    if (fn_b) fn_b(ctx_b);
    for (int r = 0; r < repeats; r++) {
        double t0 = now_us();
        fn_a(ctx_a);
        a[r] = now_us() - t0;
        if (fn_b) {
            t0 = now_us();
            fn_b(ctx_b);
            b[r] = now_us() - t0;
        }
    }
    qsort(a, (size_t)repeats, sizeof *a, cmp_double);
    *ta = (timing){a[repeats / 2], a[0]};
    if (fn_b) {
        qsort(b, (size_t)repeats, sizeof *b, cmp_double);
        *tb = (timing){b[repeats / 2], b[0]};
    }
    free(a), free(b);
}

typedef struct cpu_call {
    fp4d_backend_t     b;
    fp4d_gemm_problem *p;
} cpu_call;

static void run_cpu(void *ctx)
{
    cpu_call   *c = ctx;
    fp4d_reason why;
    if (fp4d_backend_gemm(c->b, c->p, &why) != FP4D_STATUS_OK) {
        fprintf(stderr, "bench_cpu: gemm failed: %s\n", why.text);
        exit(1);
    }
}

#ifdef FP4D_HAVE_OPENBLAS
typedef struct blas_call {
    int64_t      m, n, k;
    const float *a, *w;
    float       *c;
} blas_call;

static void run_blas(void *ctx)
{
    blas_call *c = ctx;
    if (c->m == 1)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)c->n, (int)c->k, 1.0f, c->w, (int)c->k, c->a, 1, 0.0f, c->c, 1);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)c->m, (int)c->n, (int)c->k, 1.0f, c->a, (int)c->k,
                    c->w, (int)c->k, 0.0f, c->c, (int)c->n);
}
#endif

int main(int argc, char **argv)
{
    int  repeats = 9;
    bool quick   = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = true;
        else if (!strcmp(argv[i], "--repeats") && i + 1 < argc) repeats = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--quick] [--repeats N]\n", argv[0]);
            return 2;
        }
    }
    if (repeats < 1) repeats = 1;
    const bench_shape full[] = {
        {1, 4096, 4096, FP4D_DTYPE_F32, 2.0, "decode, attention-sized"},
        {1, 14336, 4096, FP4D_DTYPE_F32, 2.0, "decode, MLP up"},
        {4, 4096, 4096, FP4D_DTYPE_F32, 0, "small batch"},
        {16, 4096, 4096, FP4D_DTYPE_F32, 0, "small batch"},
        {64, 4096, 4096, FP4D_DTYPE_F32, 0, ""},
        {256, 4096, 4096, FP4D_DTYPE_F32, 0.7, "prefill"},
        {512, 4096, 4096, FP4D_DTYPE_F32, 0.7, "prefill"},
        {256, 14336, 4096, FP4D_DTYPE_F32, 0.7, "prefill, MLP up"},
        {256, 4096, 4096, FP4D_DTYPE_NVFP4, 0, "W4A4 (A decoded too)"},
    };
    const bench_shape quick_shapes[] = {
        {1, 4096, 4096, FP4D_DTYPE_F32, 2.0, "decode"},
        {256, 4096, 4096, FP4D_DTYPE_F32, 0.7, "prefill"},
    };
    const bench_shape *shapes  = quick ? quick_shapes : full;
    size_t             nshapes = quick ? sizeof quick_shapes / sizeof *quick_shapes : sizeof full / sizeof *full;

    if (fp4d_registry_init(NULL) != FP4D_STATUS_OK) {
        fprintf(stderr, "bench_cpu: %s\n", fp4d_last_error());
        return 4;
    }
    fp4d_backend_t cpu;
    fp4d_reason    why;
    if (fp4d_backend_open("cpu", -1, &cpu, &why) != FP4D_STATUS_OK) {
        fprintf(stderr, "bench_cpu: cpu backend unavailable: %s\n", why.text);
        return 4;
    }
    int threads = fp4d_cpu_default_threads();
    double load[3] = {0, 0, 0};
    FILE  *la      = fopen("/proc/loadavg", "r");
    if (la) {
        if (fscanf(la, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) load[0] = load[1] = load[2] = -1;
        fclose(la);
    }
    printf("bench_cpu: cpu backend (%s kernels, %d threads) vs ", fp4d_cpu_isa_name(fp4d_cpu_isa_detect()), threads);
#ifdef FP4D_HAVE_OPENBLAS
    openblas_set_num_threads(threads);
    printf("OpenBLAS %s (%d threads)", openblas_get_config(), openblas_get_num_threads());
#else
    printf("(no OpenBLAS: anchor not measured)");
#endif
    printf("\nNVFP4 weights [N,K] (random codes, e4m3 scales, linear layout), f32 activations unless noted; "
           "%d timed calls each, alternating\ncpu and OpenBLAS; times in us; GFLOP/s and ratio from the fastest call; load average %.2f %.2f %.2f\n\n",
           repeats, load[0], load[1], load[2]);
    printf("%5s %6s %5s %-6s | %9s %9s %7s | %9s %9s %7s | %6s %6s\n", "M", "N", "K", "A", "cpu med", "cpu min",
           "GFLOP/s", "blas med", "blas min", "GFLOP/s", "ratio", "target");

    int misses = 0;
    for (size_t s = 0; s < nshapes; s++) {
        const bench_shape *sh = &shapes[s];
        int64_t            m = sh->m, n = sh->n, k = sh->k;
        uint8_t           *w  = malloc((size_t)(n * k / 2));
        uint8_t           *ws = malloc((size_t)(n * k / 16));
        float             *a  = malloc((size_t)(m * k) * sizeof(float));
        float             *c  = malloc((size_t)(m * n) * sizeof(float));
        if (!w || !ws || !a || !c) {
            fprintf(stderr, "bench_cpu: out of memory\n");
            return 4;
        }
        for (int64_t i = 0; i < n * k / 2; i++) w[i] = (uint8_t)rng();
        for (int64_t i = 0; i < n * k / 16; i++) ws[i] = (uint8_t)(0x30 + rng() % 16);
        for (int64_t i = 0; i < m * k; i++) a[i] = (float)((double)(rng() >> 11) * 0x1p-52 - 0.5);

        fp4d_matrix am = {FP4D_DTYPE_F32, m, k, a, NULL, FP4D_LAYOUT_LINEAR};
        uint8_t    *aq = NULL, *aqs = NULL;
        if (sh->a_type == FP4D_DTYPE_NVFP4) {
            aq  = malloc((size_t)(m * k / 2));
            aqs = malloc((size_t)(m * k / 16));
            fp4d_quantize_params qp = {FP4D_DTYPE_NVFP4, FP4D_CONV_FLASHINFER_EXACT, FP4D_LAYOUT_LINEAR, 0.0f};
            fp4d_quantize_result qr;
            fp4d_quantize(&qp, FP4D_DTYPE_F32, a, m, k, aq, aqs, &qr);
            /* the anchor multiplies the same dequantized activations */
            fp4d_dequantize(FP4D_DTYPE_NVFP4, FP4D_LAYOUT_LINEAR, aq, aqs, 1.0f, m, k, a);
            am = (fp4d_matrix){FP4D_DTYPE_NVFP4, m, k, aq, aqs, FP4D_LAYOUT_LINEAR};
        }
        fp4d_matrix       bm = {FP4D_DTYPE_NVFP4, n, k, w, ws, FP4D_LAYOUT_LINEAR};
        fp4d_gemm_problem p    = {am, bm, 1.0f, FP4D_DTYPE_F32, c};
        cpu_call          cc   = {cpu, &p};
        /* Calls of a few milliseconds get more repeats: on a shared machine the fastest of
         * many is what the code can do; the slow ones measure the neighbours. */
        int reps = m * n * k > (int64_t)1 << 33 ? (repeats + 1) / 2 : m * n * k < (int64_t)1 << 28 ? repeats * 6 : repeats;
        double            flops = 2.0 * (double)m * (double)n * (double)k;
        timing            t_cpu, t_blas = {0, 0};
#ifdef FP4D_HAVE_OPENBLAS
        float *wf = malloc((size_t)(n * k) * sizeof(float));
        float *cb = malloc((size_t)(m * n) * sizeof(float));
        if (!wf || !cb) {
            fprintf(stderr, "bench_cpu: out of memory\n");
            return 4;
        }
        fp4d_dequantize(FP4D_DTYPE_NVFP4, FP4D_LAYOUT_LINEAR, w, ws, 1.0f, n, k, wf);
        blas_call bc = {m, n, k, a, wf, cb};
        time_pair(run_cpu, &cc, run_blas, &bc, reps, &t_cpu, &t_blas);
        /* The two must agree (same exact inputs, both f32 accumulation). */
        double max_diff = 0, max_ref = 0;
        for (int64_t i = 0; i < m * n; i++) {
            max_diff = fmax(max_diff, fabs((double)c[i] - cb[i]));
            max_ref  = fmax(max_ref, fabs((double)cb[i]));
        }
        double ratio = t_blas.min_us / t_cpu.min_us;
        bool   miss  = sh->target > 0 && ratio < sh->target;
        misses += miss;
        printf("%5lld %6lld %5lld %-6s | %9.1f %9.1f %7.1f | %9.1f %9.1f %7.1f | %5.2fx %6s %-4s %s%s\n", (long long)m,
               (long long)n, (long long)k, fp4d_dtype_get(sh->a_type)->name, t_cpu.median_us, t_cpu.min_us,
               flops / t_cpu.min_us * 1e-3, t_blas.median_us, t_blas.min_us, flops / t_blas.min_us * 1e-3, ratio,
               sh->target > 0 ? (sh->target >= 1 ? ">= 2x" : ">=.7x") : "-", sh->target > 0 ? (miss ? "MISS" : "ok") : "",
               sh->note, max_diff > 1e-4 * max_ref ? "  RESULTS DIFFER" : "");
        free(wf), free(cb);
#else
        time_pair(run_cpu, &cc, NULL, NULL, reps, &t_cpu, &t_blas);
        printf("%5lld %6lld %5lld %-6s | %9.1f %9.1f %7.1f | %9s %9s %7s | %6s\n", (long long)m, (long long)n,
               (long long)k, fp4d_dtype_get(sh->a_type)->name, t_cpu.median_us, t_cpu.min_us,
               flops / t_cpu.min_us * 1e-3, "-", "-", "-", "-");
#endif
        free(w), free(ws), free(a), free(c), free(aq), free(aqs);
    }
    printf("\nratio = OpenBLAS min time / cpu min time (higher is better for cpu).\n");
    fp4d_backend_close(cpu);
    if (misses) printf("%d target(s) missed (a loaded machine skews these; rerun when it is quiet).\n", misses);
    return 0;
}
