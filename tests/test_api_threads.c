/*
 * What embedders rely on beyond argument checks: fp4d_last_error() is per thread, set by
 * every failing call (a backend's included) and left alone by successful ones; the registry
 * initialises itself correctly on first use, from several threads at once too; and the
 * backends, the reference, the quantizer, the safetensors reader and the scanner give the
 * same answers when called from several threads at once as from one.
 *
 * The registry is process-wide and only grows, so the tests that need it empty run in a
 * forked child.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "fp4doctor/backend.h"
#include "fp4doctor/io.h"
#include "fp4doctor/ref.h"
#include "fp4doctor/scan.h"
#include "internal.h"
#include "test_backend_util.h"

enum { NTHREADS = 4 };

/* Runs fn in a child process, where the registry is still empty; true when it returned 0. */
static bool in_fresh_process(int (*fn)(void))
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) _exit(fn());
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) return false;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* A failure of our own with a message nobody else writes. */
static void set_sentinel(const char *text)
{
    fp4d_backend_t b;
    assert_int_equal(fp4d_backend_open(text, -1, &b, NULL), FP4D_STATUS_NOT_FOUND);
    assert_non_null(strstr(fp4d_last_error(), text));
}

/* ---- a backend that fails, or succeeds after a failure of its own ------------------------ */

typedef struct mute_conf {
    fp4d_status gemm_status;   /* what gemm/grouped_gemm/quantize return, without a message */
    bool        init_fails;    /* init: DEVICE */
    bool        noisy_success; /* sets the last error, then succeeds (a recovered failure) */
} mute_conf;

static fp4d_status mute_init(void *user_data, int device, void **ctx, fp4d_reason *why)
{
    mute_conf *c = user_data;
    (void)device;
    if (c->init_fails) {
        snprintf(why->text, sizeof why->text, "switched off");
        return FP4D_STATUS_DEVICE;
    }
    *ctx = c;
    return FP4D_STATUS_OK;
}
static void mute_free(void *ctx) { (void)ctx; }
static bool mute_supports(void *ctx, const fp4d_gemm_desc *d, fp4d_reason *why)
{
    (void)ctx, (void)d, (void)why;
    return true;
}
static fp4d_status mute_result(mute_conf *c)
{
    if (c->noisy_success) {
        (void)fp4d_set_error(FP4D_STATUS_DEVICE, "first try failed, the second worked");
        return FP4D_STATUS_OK;
    }
    return c->gemm_status; /* as a plugin, which cannot set fp4d_last_error() */
}
static fp4d_status mute_gemm(void *ctx, const fp4d_gemm_problem *p)
{
    if (((mute_conf *)ctx)->noisy_success) return mute_result(ctx) == FP4D_STATUS_OK ? fp4d_ref_gemm(p) : 1;
    return mute_result(ctx);
}
static fp4d_status mute_grouped(void *ctx, const fp4d_grouped_gemm_problem *p)
{
    (void)p;
    return mute_result(ctx);
}
static fp4d_status mute_quantize(void *ctx, fp4d_quantize_problem *q)
{
    (void)q;
    return mute_result(ctx);
}
static int mute_score(void *ctx, const fp4d_gemm_desc *d)
{
    (void)ctx, (void)d;
    return 1000; /* asked first by `auto`, so that its failure happens before the choice */
}

static fp4d_backend_iface mute_iface(const char *name, mute_conf *conf)
{
    fp4d_backend_iface f = {
        .api_version = FP4D_BACKEND_API_VERSION, .struct_size = sizeof(fp4d_backend_iface), .name = name,
        .kind = FP4D_BACKEND_KIND_GPU, .caps = FP4D_CAP_GEMM | FP4D_CAP_GROUPED_GEMM | FP4D_CAP_QUANTIZE,
        .user_data = conf, .init = mute_init, .free = mute_free, .supports = mute_supports, .gemm = mute_gemm,
        .grouped_gemm = mute_grouped, .quantize = mute_quantize, .score = mute_score,
    };
    return f;
}

/* A small valid NVFP4 x NVFP4 problem and a quantize problem over f32 data. */
typedef struct small_problem {
    tb_operand           a, b;
    float                out[8 * 16];
    fp4d_gemm_problem    p;
    float                src[8 * 64];
    uint8_t              codes[8 * 32], scales[8 * 4];
    fp4d_quantize_problem q;
} small_problem;

static void small_problem_make(small_problem *s)
{
    tb_rng r = {42};
    memset(s, 0, sizeof *s);
    tb_operand_make(&s->a, FP4D_DTYPE_NVFP4, FP4D_LAYOUT_LINEAR, 8, 64, &r);
    tb_operand_make(&s->b, FP4D_DTYPE_NVFP4, FP4D_LAYOUT_LINEAR, 16, 64, &r);
    s->p = (fp4d_gemm_problem){s->a.m, s->b.m, 1.0f, FP4D_DTYPE_F32, s->out};
    for (int i = 0; i < 8 * 64; i++) s->src[i] = tb_uniform(&r);
    s->q = (fp4d_quantize_problem){{FP4D_DTYPE_NVFP4, FP4D_CONV_FLASHINFER_EXACT, FP4D_LAYOUT_LINEAR, 0.0f},
                                   FP4D_DTYPE_F32, s->src, 8, 64, s->codes, s->scales, {0, 0}};
}

static void small_problem_free(small_problem *s) { tb_operand_free(&s->a), tb_operand_free(&s->b); }

/* A backend that fails without a message (a plugin cannot set one) left the caller reading
 * whatever an earlier, unrelated failure had said, and an empty reason; a status that is no
 * fp4d_status went through as it was. */
static void test_backend_failure_always_has_a_message(void **state)
{
    (void)state;
    assert_int_equal(fp4d_registry_init(NULL), FP4D_STATUS_OK);
    static mute_conf         dev = {FP4D_STATUS_DEVICE, false, false}, junk = {(fp4d_status)-7, false, false};
    static fp4d_backend_iface fdev, fjunk;
    fdev  = mute_iface("api-mute-device", &dev);
    fjunk = mute_iface("api-mute-junk", &junk);
    assert_int_equal(fp4d_registry_add(&fdev), FP4D_STATUS_OK);
    assert_int_equal(fp4d_registry_add(&fjunk), FP4D_STATUS_OK);
    small_problem s;
    small_problem_make(&s);
    fp4d_backend_t b, j;
    assert_int_equal(fp4d_backend_open("api-mute-device", -1, &b, NULL), FP4D_STATUS_OK);
    assert_int_equal(fp4d_backend_open("api-mute-junk", -1, &j, NULL), FP4D_STATUS_OK);

    fp4d_reason why;
    set_sentinel("api-stale-message");
    assert_int_equal(fp4d_backend_gemm(b, &s.p, &why), FP4D_STATUS_DEVICE);
    assert_non_null(strstr(fp4d_last_error(), "api-mute-device: gemm() failed: device error"));
    assert_string_equal(why.text, fp4d_last_error());

    set_sentinel("api-stale-message");
    assert_int_equal(fp4d_backend_quantize(b, &s.q, &why), FP4D_STATUS_DEVICE);
    assert_non_null(strstr(fp4d_last_error(), "api-mute-device: quantize() failed"));
    assert_null(strstr(why.text, "api-stale-message"));

    int64_t                   offsets[2] = {0, 8};
    float                     alpha      = 1.0f;
    fp4d_grouped_gemm_problem g = {1, offsets, s.a.m, &s.b.m, &alpha, FP4D_DTYPE_F32, s.out};
    set_sentinel("api-stale-message");
    assert_int_equal(fp4d_backend_grouped_gemm(b, &g, &why), FP4D_STATUS_DEVICE);
    assert_non_null(strstr(fp4d_last_error(), "api-mute-device: grouped_gemm() failed"));

    assert_int_equal(fp4d_backend_gemm(j, &s.p, &why), FP4D_STATUS_INTERNAL);
    assert_non_null(strstr(fp4d_last_error(), "returned -7, which is no fp4d_status"));

    fp4d_backend_close(b);
    fp4d_backend_close(j);
    small_problem_free(&s);
}

/* Successful calls leave the last error alone (fp4doctor.h), even where they fail inside:
 * `auto` skipping a backend that cannot open here, or a backend that recovered. */
static void test_success_leaves_last_error_alone(void **state)
{
    (void)state;
    assert_int_equal(fp4d_registry_init(NULL), FP4D_STATUS_OK);
    static mute_conf          off = {FP4D_STATUS_OK, true, false}, noisy = {FP4D_STATUS_OK, false, true};
    static fp4d_backend_iface foff, fnoisy;
    foff   = mute_iface("api-switched-off", &off);
    fnoisy = mute_iface("api-noisy", &noisy);
    fnoisy.score = NULL; /* never chosen by `auto` */
    assert_int_equal(fp4d_registry_add(&foff), FP4D_STATUS_OK);
    assert_int_equal(fp4d_registry_add(&fnoisy), FP4D_STATUS_OK);
    small_problem s;
    small_problem_make(&s);
    fp4d_gemm_desc desc;
    fp4d_gemm_describe(&s.p, &desc);

    set_sentinel("api-keep-me");
    const char *chosen = NULL;
    fp4d_reason why;
    assert_int_equal(fp4d_backend_choose_auto(&desc, &chosen, &why), FP4D_STATUS_OK);
    assert_non_null(chosen);
    assert_non_null(strstr(fp4d_last_error(), "api-keep-me"));

    fp4d_backend_t b;
    assert_int_equal(fp4d_backend_open("api-noisy", -1, &b, &why), FP4D_STATUS_OK);
    assert_int_equal(fp4d_backend_gemm(b, &s.p, &why), FP4D_STATUS_OK);
    assert_int_equal(fp4d_backend_quantize(b, &s.q, &why), FP4D_STATUS_OK);
    fp4d_backend_close(b);
    assert_non_null(strstr(fp4d_last_error(), "api-keep-me"));
    small_problem_free(&s);
}

/* ---- lazy registry initialisation -------------------------------------------------------- */

static fp4d_status ok_gemm(void *ctx, const fp4d_gemm_problem *p)
{
    (void)ctx, (void)p;
    return FP4D_STATUS_OK;
}

static int open_cpu_after_own_backend(void)
{
    static mute_conf          conf = {FP4D_STATUS_OK, false, false};
    static fp4d_backend_iface f;
    f      = mute_iface("api-mine", &conf);
    f.gemm = ok_gemm;
    if (fp4d_registry_add(&f) != FP4D_STATUS_OK) return 1;
    fp4d_backend_t b = NULL;
    if (fp4d_backend_open("cpu", -1, &b, NULL) != FP4D_STATUS_OK) return 2;
    fp4d_backend_close(b);
    return fp4d_registry_find("ref") ? 0 : 3;
}

/* The registry initialised itself when it was empty: a program that registered its own
 * backend first never got the built-ins. */
static void test_own_backend_first_keeps_builtins(void **state)
{
    (void)state;
    assert_true(in_fresh_process(open_cpu_after_own_backend));
}

static pthread_barrier_t open_barrier;

static void *open_one(void *arg)
{
    fp4d_backend_t b = NULL;
    pthread_barrier_wait(&open_barrier);
    fp4d_status st = fp4d_backend_open(arg, -1, &b, NULL);
    fp4d_backend_close(b);
    return (void *)(intptr_t)st;
}

static int open_from_threads(void)
{
    enum { N = 2 * NTHREADS };
    pthread_t t[N];
    int       bad = 0;
    pthread_barrier_init(&open_barrier, NULL, N);
    for (int i = 0; i < N; i++)
        if (pthread_create(&t[i], NULL, open_one, (void *)(i % 2 ? "cpu" : "ref")) != 0) return 9;
    for (int i = 0; i < N; i++) {
        void *st;
        pthread_join(t[i], &st);
        bad += st != (void *)(intptr_t)FP4D_STATUS_OK;
    }
    return bad;
}

/* First use from several threads at once: one thread saw ref registered and cpu not yet
 * (the registry was not empty, so it did not wait) and got NOT_FOUND for cpu, about one
 * round in a hundred on two cores. Many rounds, each in a fresh process. */
static void test_first_use_from_threads(void **state)
{
    (void)state;
    for (int round = 0; round < 200; round++) assert_true(in_fresh_process(open_from_threads));
}

/* ---- everything at once ------------------------------------------------------------------ */

typedef struct shared_work {
    pthread_barrier_t  start;
    tb_operand         a, b;
    fp4d_gemm_problem  p;
    float             *expect;      /* the reference's output, computed on one thread */
    float             *src;         /* [128, 256] f32 to quantize */
    uint8_t           *codes, *scales, *codes_1, *scales_1; /* one-thread quantization */
    char               ckpt[64];
    int                failures[NTHREADS];
    char               first_failure[NTHREADS][160];
} shared_work;

static shared_work work;

enum { WM = 33, WN = 80, WK = 256, QR = 128, QC = 256 };

static void failed(int id, const char *what)
{
    if (!work.failures[id]++)
        snprintf(work.first_failure[id], sizeof work.first_failure[id], "%s: %.120s", what, fp4d_last_error());
}

static void *worker(void *arg)
{
    int id = (int)(intptr_t)arg;
    pthread_barrier_wait(&work.start);
    if (fp4d_registry_init(NULL) != FP4D_STATUS_OK) failed(id, "registry_init");
    float   *out    = malloc(sizeof(float) * WM * WN);
    uint8_t *codes  = malloc(QR * QC / 2);
    uint8_t *scales = malloc(fp4d_scale_buffer_size(FP4D_LAYOUT_SWIZZLED_128X4, QR, QC / 16));
    float   *deq    = malloc(sizeof(float) * QR * QC);
    for (int it = 0; it < 4 && out && codes && scales && deq; it++) {
        const char    *name = (id + it) % 2 ? "cpu" : "ref";
        fp4d_backend_t b    = NULL;
        fp4d_reason    why;
        if (fp4d_backend_open(name, -1, &b, &why) != FP4D_STATUS_OK) {
            failed(id, name);
            continue;
        }
        fp4d_gemm_problem p = work.p;
        p.out               = out;
        memset(out, 0xFF, sizeof(float) * WM * WN);
        if (fp4d_backend_gemm(b, &p, &why) != FP4D_STATUS_OK) failed(id, "gemm");
        for (int i = 0; i < WM * WN; i++) {
            /* ref: bit for bit; cpu: f32 accumulation, far inside this bound for K = 256 */
            double err = fabs((double)out[i] - (double)work.expect[i]);
            if (!strcmp(name, "ref") ? out[i] != work.expect[i] : !(err <= 1e-3 * (1.0 + fabs(work.expect[i])))) {
                failed(id, "gemm result");
                break;
            }
        }
        memset(out, 0xFF, sizeof(float) * WM * WN);
        if (fp4d_ref_gemm(&p) != FP4D_STATUS_OK || memcmp(out, work.expect, sizeof(float) * WM * WN) != 0)
            failed(id, "fp4d_ref_gemm");
        fp4d_quantize_problem q = {{FP4D_DTYPE_NVFP4, FP4D_CONV_FLASHINFER_EXACT, FP4D_LAYOUT_SWIZZLED_128X4, 0.0f},
                                   FP4D_DTYPE_F32, work.src, QR, QC, codes, scales, {0, 0}};
        size_t sbytes = fp4d_scale_buffer_size(FP4D_LAYOUT_SWIZZLED_128X4, QR, QC / 16);
        if (fp4d_backend_quantize(b, &q, &why) != FP4D_STATUS_OK) failed(id, "quantize");
        else if (memcmp(codes, work.codes_1, QR * QC / 2) || memcmp(scales, work.scales_1, sbytes))
            failed(id, "quantize result");
        if (fp4d_dequantize(FP4D_DTYPE_NVFP4, FP4D_LAYOUT_SWIZZLED_128X4, codes, scales, q.result.decode_scale, QR, QC,
                            deq) != FP4D_STATUS_OK)
            failed(id, "dequantize");
        fp4d_backend_close(b);

        fp4d_scan_report *r = NULL;
        if (fp4d_scan_path(work.ckpt, NULL, &r) != FP4D_STATUS_OK) failed(id, "scan");
        else if (fp4d_scan_report_count_at_least(r, FP4D_SCAN_ERROR) != 1) failed(id, "scan findings");
        fp4d_scan_report_free(r);

        char path[128];
        snprintf(path, sizeof path, "%s/model-00001-of-00002.safetensors", work.ckpt);
        fp4d_st_open_result res;
        fp4d_st_file       *f = fp4d_st_open(path, &res);
        if (!f || fp4d_st_count(f) == 0) failed(id, "fp4d_st_open");
        fp4d_st_close(f);

        /* the last error is this thread's own, whatever the others did meanwhile */
        char mine[48];
        snprintf(mine, sizeof mine, "api-thread-%d-%d", id, it);
        if (fp4d_backend_open(mine, -1, &b, NULL) != FP4D_STATUS_NOT_FOUND) failed(id, "open unknown");
        sched_yield();
        if (!strstr(fp4d_last_error(), mine)) failed(id, "last error of another thread");
    }
    free(out), free(codes), free(scales), free(deq);
    return NULL;
}

static void test_concurrent_calls_agree(void **state)
{
    (void)state;
    tb_rng r = {7};
    memset(&work, 0, sizeof work);
    tb_operand_make(&work.a, FP4D_DTYPE_NVFP4, FP4D_LAYOUT_SWIZZLED_128X4, WM, WK, &r);
    tb_operand_make(&work.b, FP4D_DTYPE_NVFP4, FP4D_LAYOUT_SWIZZLED_128X4, WN, WK, &r);
    work.expect = malloc(sizeof(float) * WM * WN);
    work.p      = (fp4d_gemm_problem){work.a.m, work.b.m, 0.75f, FP4D_DTYPE_F32, work.expect};
    assert_int_equal(fp4d_ref_gemm(&work.p), FP4D_STATUS_OK);
    size_t sbytes = fp4d_scale_buffer_size(FP4D_LAYOUT_SWIZZLED_128X4, QR, QC / 16);
    work.src      = malloc(sizeof(float) * QR * QC);
    work.codes_1  = malloc(QR * QC / 2);
    work.scales_1 = malloc(sbytes);
    assert_non_null(work.src), assert_non_null(work.codes_1), assert_non_null(work.scales_1);
    for (int i = 0; i < QR * QC; i++) work.src[i] = 10.0f * tb_uniform(&r);
    fp4d_quantize_params qp = {FP4D_DTYPE_NVFP4, FP4D_CONV_FLASHINFER_EXACT, FP4D_LAYOUT_SWIZZLED_128X4, 0.0f};
    fp4d_quantize_result qr;
    assert_int_equal(fp4d_quantize(&qp, FP4D_DTYPE_F32, work.src, QR, QC, work.codes_1, work.scales_1, &qr),
                     FP4D_STATUS_OK);

    snprintf(work.ckpt, sizeof work.ckpt, "/tmp/fp4d_api_threads_XXXXXX");
    assert_non_null(mkdtemp(work.ckpt));
    fp4d_ckpt_gen_params gp;
    fp4d_ckpt_gen_defaults(&gp, FP4D_CKPT_MODELOPT_NVFP4);
    fp4d_ckpt_plant plant = {FP4D_DEFECT_SCALE_NAN, "model.layers.1.mlp.down_proj.weight_scale", 5};
    gp.plants = &plant, gp.num_plants = 1;
    assert_int_equal(fp4d_ckpt_generate(work.ckpt, &gp), FP4D_STATUS_OK);

    pthread_barrier_init(&work.start, NULL, NTHREADS);
    pthread_t t[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) assert_int_equal(pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i), 0);
    for (int i = 0; i < NTHREADS; i++) pthread_join(t[i], NULL);
    pthread_barrier_destroy(&work.start);
    for (int i = 0; i < NTHREADS; i++) {
        if (work.failures[i]) fprintf(stderr, "thread %d: %d failure(s), first %s\n", i, work.failures[i],
                                      work.first_failure[i]);
        assert_int_equal(work.failures[i], 0);
    }

    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", work.ckpt);
    assert_int_equal(system(cmd), 0);
    tb_operand_free(&work.a), tb_operand_free(&work.b);
    free(work.expect), free(work.src), free(work.codes_1), free(work.scales_1);
}

int main(void)
{
    unsetenv("FP4DOCTOR_PLUGINS");
    unsetenv("FP4DOCTOR_BACKEND");
    setenv("FP4DOCTOR_NO_CACHE", "1", 1); /* `auto` must not read a verdict cache of this machine */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_own_backend_first_keeps_builtins),
        cmocka_unit_test(test_first_use_from_threads),
        cmocka_unit_test(test_backend_failure_always_has_a_message),
        cmocka_unit_test(test_success_leaves_last_error_alone),
        cmocka_unit_test(test_concurrent_calls_agree),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
