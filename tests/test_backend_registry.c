/*
 * The registry and instances (backend.h): registration order, iface checks, lookup,
 * open/close, supports with a reason, validating wrappers, and `auto` (forcing, scores,
 * validation against the reference, the verdict cache, FP4DOCTOR_DEBUG).
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "backend/verdict_cache.h"
#include "internal.h"
#include "test_backend_util.h"

/* ---- a configurable test backend ---------------------------------------------------------- */

typedef struct toy_conf {
    int         score;
    bool        wrong;      /* gemm writes garbage */
    bool        init_fails;
    const char *fail_reason; /* init's reason when it fails; NULL: a plain one */
} toy_conf;

static fp4d_status toy_init(void *user_data, int device, void **ctx, fp4d_reason *why)
{
    toy_conf *c = user_data;
    (void)device;
    if (c->init_fails) {
        snprintf(why->text, sizeof why->text, "%s", c->fail_reason ? c->fail_reason : "toy device is switched off");
        return FP4D_STATUS_DEVICE;
    }
    *ctx = c;
    return FP4D_STATUS_OK;
}
static void toy_free(void *ctx) { (void)ctx; }
static bool toy_supports(void *ctx, const fp4d_gemm_desc *d, fp4d_reason *why)
{
    (void)ctx;
    if (d->b_type != FP4D_DTYPE_NVFP4 && d->b_type != FP4D_DTYPE_MXFP4) {
        snprintf(why->text, sizeof why->text, "toy needs FP4 weights");
        return false;
    }
    if (d->out_type != FP4D_DTYPE_F32) {
        snprintf(why->text, sizeof why->text, "toy writes f32 only");
        return false;
    }
    return true;
}
static fp4d_status toy_gemm(void *ctx, const fp4d_gemm_problem *p)
{
    toy_conf *c = ctx;
    if (!c->wrong) return fp4d_ref_gemm(p);
    for (int64_t i = 0; i < p->a.rows * p->b.rows; i++) ((float *)p->out)[i] = 1.0f;
    return FP4D_STATUS_OK;
}
static int toy_score(void *ctx, const fp4d_gemm_desc *d)
{
    (void)d;
    return ((toy_conf *)ctx)->score;
}

static fp4d_backend_iface toy_iface(const char *name, toy_conf *conf)
{
    fp4d_backend_iface f = {
        .api_version = FP4D_BACKEND_API_VERSION, .struct_size = sizeof(fp4d_backend_iface), .name = name,
        .description = "test backend", .kind = FP4D_BACKEND_KIND_GPU, .caps = FP4D_CAP_GEMM, .user_data = conf,
        .init = toy_init, .free = toy_free, .supports = toy_supports, .gemm = toy_gemm, .score = toy_score,
    };
    return f;
}

static char cache_dir[] = "/tmp/fp4d_test_registry_XXXXXX";

static int setup(void **state)
{
    (void)state;
    unsetenv("FP4DOCTOR_INCLUDE_FAULTY");
    unsetenv("FP4DOCTOR_PLUGINS");
    unsetenv("FP4DOCTOR_BACKEND");
    unsetenv("FP4DOCTOR_DEBUG");
    unsetenv("FP4DOCTOR_NO_CACHE");
    /* a private, empty verdict cache */
    if (!mkdtemp(cache_dir)) return -1;
    setenv("XDG_CACHE_HOME", cache_dir, 1);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_builtins_in_order(void **state)
{
    (void)state;
    assert_int_equal(fp4d_registry_init(NULL), FP4D_STATUS_OK);
    assert_true(fp4d_registry_count() >= 2);
    assert_string_equal(fp4d_registry_get(0)->name, "ref");
    assert_string_equal(fp4d_registry_get(1)->name, "cpu");
    assert_int_equal(fp4d_registry_get(0)->kind, FP4D_BACKEND_KIND_REFERENCE);
    assert_int_equal(fp4d_registry_get(1)->kind, FP4D_BACKEND_KIND_CPU);
    assert_null(fp4d_registry_get(fp4d_registry_count()));
    assert_null(fp4d_registry_find("faulty-zeros")); /* not without include_faulty */
    assert_null(fp4d_registry_find("no-such-backend"));
    assert_null(fp4d_registry_find(NULL));
    assert_ptr_equal(fp4d_registry_find("cpu"), fp4d_registry_get(1));
    /* init again: nothing duplicated */
    size_t n = fp4d_registry_count();
    assert_int_equal(fp4d_registry_init(NULL), FP4D_STATUS_OK);
    assert_int_equal(fp4d_registry_count(), n);
    assert_string_equal(fp4d_backend_kind_name(FP4D_BACKEND_KIND_FAULTY), "faulty");
}

/* A backend's reason reaches terminals, JSON and JUnit XML: invalid UTF-8 (which made the
 * doctor's child drop its event, so an UNSUPPORTED plugin showed as ERROR), terminal escapes
 * and U+FFFE come out as '?', byte for byte. */
static void test_reasons_are_cleaned(void **state)
{
    (void)state;
    static toy_conf conf = {1, false, true, "needs \xff hw \x1b]0;x\x07 \xc2\x9b \xef\xbf\xbe caf\xc3\xa9 \xe6\x97"};
    static fp4d_backend_iface f;
    f = toy_iface("toy-hostile", &conf);
    assert_int_equal(fp4d_registry_add(&f), FP4D_STATUS_OK);
    fp4d_backend_t b = NULL;
    fp4d_reason why;
    assert_int_equal(fp4d_backend_open("toy-hostile", -1, &b, &why), FP4D_STATUS_DEVICE);
    assert_string_equal(why.text, "needs ? hw ?]0;x? ?? ??? caf\xc3\xa9 ??");
}

/* Where the cache lives and how its failures read. Run as root with HOME naming a directory
 * that is not there, the cache made that home directory; now it leaves HOME alone and says
 * so. A write that fails (a full disk; here a file size limit) gives the write's own reason,
 * where it said "Input/output error" for every failure. */
static void test_verdict_cache_home_and_write_errors(void **state)
{
    (void)state;
    fp4d_verdict_cache_disable(false);
    const fp4d_cached_verdict pass = {"PASS", "quick", 1.0};
    char home[512], cached[640];
    struct stat sb;
    char *old_home = getenv("HOME") ? strdup(getenv("HOME")) : NULL;
    unsetenv("XDG_CACHE_HOME");

    snprintf(home, sizeof home, "%s/no-such-home", cache_dir);
    setenv("HOME", home, 1);
    assert_int_equal(fp4d_verdict_cache_put("cpu", -1, &pass), FP4D_STATUS_IO);
    assert_non_null(strstr(fp4d_last_error(), "HOME"));
    assert_non_null(strstr(fp4d_last_error(), home));
    assert_int_not_equal(stat(home, &sb), 0); /* not created */

    /* an existing home: .cache and .cache/fp4doctor are made below it */
    assert_int_equal(mkdir(home, 0700), 0);
    assert_int_equal(fp4d_verdict_cache_put("cpu", -1, &pass), FP4D_STATUS_OK);
    snprintf(cached, sizeof cached, "%s/.cache/fp4doctor", home);
    assert_int_equal(stat(cached, &sb), 0);
    assert_true(S_ISDIR(sb.st_mode));
    assert_non_null(strstr(fp4d_verdict_cache_path(), cached));
    fp4d_cached_verdict got;
    assert_true(fp4d_verdict_cache_get("cpu", -1, &got));
    assert_string_equal(got.verdict, "PASS");

    /* a write cut short by RLIMIT_FSIZE (EFBIG, SIGXFSZ ignored), in a child process */
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        const struct rlimit tiny = {16, 16};
        if (setrlimit(RLIMIT_FSIZE, &tiny) != 0) _exit(2);
        const fp4d_cached_verdict more = {"WRONG", "full", 2.0};
        if (fp4d_verdict_cache_put("ref", -1, &more) != FP4D_STATUS_IO) _exit(3);
        _exit(strstr(fp4d_last_error(), strerror(EFBIG)) ? 0 : 4);
    }
    int wst = 0;
    assert_int_equal(waitpid(pid, &wst, 0), pid);
    assert_true(WIFEXITED(wst));
    assert_int_equal(WEXITSTATUS(wst), 0);
    /* the cache as it was */
    assert_true(fp4d_verdict_cache_get("cpu", -1, &got));
    assert_false(fp4d_verdict_cache_get("ref", -1, &got));

    setenv("XDG_CACHE_HOME", cache_dir, 1);
    if (old_home) setenv("HOME", old_home, 1);
    else unsetenv("HOME");
    free(old_home);
}

/* fp4d_backend_quantize checks the problem before a backend sees it, as gemm() problems are
 * validated: the cuda quantizer took cols = -16 (its own `cols % 16` check passed) and read far
 * past its buffers. */
static int toy_quantize_calls;
static fp4d_status toy_quantize(void *ctx, fp4d_quantize_problem *q)
{
    (void)ctx;
    toy_quantize_calls++;
    return fp4d_quantize(&q->params, q->src_type, q->src, q->rows, q->cols, q->codes, q->scales, &q->result);
}

static void test_quantize_problems_are_checked(void **state)
{
    (void)state;
    static toy_conf conf = {0, false, false, NULL};
    static fp4d_backend_iface f;
    f = toy_iface("toy-quant", &conf);
    f.quantize = toy_quantize;
    f.caps |= FP4D_CAP_QUANTIZE;
    assert_int_equal(fp4d_registry_add(&f), FP4D_STATUS_OK);
    fp4d_backend_t b = NULL;
    fp4d_reason why;
    assert_int_equal(fp4d_backend_open("toy-quant", -1, &b, &why), FP4D_STATUS_OK);
    float src[32] = {1.0f, -2.0f, 3.0f};
    uint8_t codes[16], scales[2];
    fp4d_quantize_problem q = {{FP4D_DTYPE_NVFP4, FP4D_CONV_FLASHINFER_EXACT, FP4D_LAYOUT_LINEAR, 0.0f},
                               FP4D_DTYPE_F32, src, 1, -16, codes, scales, {0, 0}};
    toy_quantize_calls = 0;
    assert_int_equal(fp4d_backend_quantize(b, &q, &why), FP4D_STATUS_INVALID_ARG);
    assert_non_null(strstr(why.text, "negative shape"));
    q.cols = 32;
    q.params.scale_layout = (fp4d_scale_layout)7;
    assert_int_equal(fp4d_backend_quantize(b, &q, &why), FP4D_STATUS_INVALID_ARG);
    q.params.scale_layout = FP4D_LAYOUT_LINEAR;
    q.codes = NULL;
    assert_int_equal(fp4d_backend_quantize(b, &q, &why), FP4D_STATUS_INVALID_ARG);
    assert_int_equal(toy_quantize_calls, 0);
    q.codes = codes;
    assert_int_equal(fp4d_backend_quantize(b, &q, &why), FP4D_STATUS_OK);
    assert_int_equal(toy_quantize_calls, 1);
    fp4d_backend_close(b);
}

static void test_add_rejects_bad_ifaces(void **state)
{
    (void)state;
    /* plugins counted but no paths: an error, not a NULL dereference */
    const fp4d_registry_options no_paths = {false, NULL, 2};
    assert_int_equal(fp4d_registry_init(&no_paths), FP4D_STATUS_INVALID_ARG);
    static toy_conf    conf = {5, false, false, NULL};
    size_t             n    = fp4d_registry_count();
    fp4d_backend_iface f;

    f = toy_iface("toy-version", &conf), f.api_version = 0;
    assert_int_equal(fp4d_registry_add(&f), FP4D_STATUS_INVALID_ARG);
    assert_non_null(strstr(fp4d_last_error(), "api_version"));
    f = toy_iface("toy-version", &conf), f.api_version = FP4D_BACKEND_API_VERSION + 1;
    assert_int_equal(fp4d_registry_add(&f), FP4D_STATUS_INVALID_ARG);
    f = toy_iface("toy-small", &conf), f.struct_size = offsetof(fp4d_backend_iface, bench);
    assert_int_equal(fp4d_registry_add(&f), FP4D_STATUS_INVALID_ARG);
    assert_non_null(strstr(fp4d_last_error(), "struct_size"));
    f = toy_iface("toy-slots", &conf), f.init = NULL;
    assert_int_equal(fp4d_registry_add(&f), FP4D_STATUS_INVALID_ARG);
    f = toy_iface("toy-slots", &conf), f.free = NULL;
    assert_int_equal(fp4d_registry_add(&f), FP4D_STATUS_INVALID_ARG);
    f = toy_iface("toy-slots", &conf), f.supports = NULL;
    assert_int_equal(fp4d_registry_add(&f), FP4D_STATUS_INVALID_ARG);
    f = toy_iface("toy-slots", &conf), f.gemm = NULL;
    assert_int_equal(fp4d_registry_add(&f), FP4D_STATUS_INVALID_ARG);
    assert_non_null(strstr(fp4d_last_error(), "mandatory"));
    f = toy_iface("Toy Name", &conf);
    assert_int_equal(fp4d_registry_add(&f), FP4D_STATUS_INVALID_ARG);
    f = toy_iface(NULL, &conf);
    assert_int_equal(fp4d_registry_add(&f), FP4D_STATUS_INVALID_ARG);
    f = toy_iface("cpu", &conf); /* duplicate */
    assert_int_equal(fp4d_registry_add(&f), FP4D_STATUS_INVALID_ARG);
    assert_non_null(strstr(fp4d_last_error(), "already registered"));
    assert_int_equal(fp4d_registry_add(NULL), FP4D_STATUS_INVALID_ARG);
    assert_int_equal(fp4d_registry_count(), n);

    /* a good one, then it is found, and capabilities follow the slots */
    f      = toy_iface("toy-good", &conf);
    f.caps = FP4D_CAP_GEMM | FP4D_CAP_GROUPED_GEMM; /* claims grouped, has no slot */
    assert_int_equal(fp4d_registry_add(&f), FP4D_STATUS_OK);
    assert_int_equal(fp4d_registry_count(), n + 1);
    const fp4d_backend_iface *g = fp4d_registry_find("toy-good");
    assert_non_null(g);
    assert_int_equal(g->caps & FP4D_CAP_GROUPED_GEMM, 0);
}

static void test_open_close_supports(void **state)
{
    (void)state;
    static toy_conf    off = {5, false, true, NULL};
    fp4d_backend_iface f   = toy_iface("toy-off", &off);
    assert_int_equal(fp4d_registry_add(&f), FP4D_STATUS_OK);

    fp4d_backend_t b = (fp4d_backend_t)0x1;
    fp4d_reason    why;
    assert_int_equal(fp4d_backend_open("nope", -1, &b, &why), FP4D_STATUS_NOT_FOUND);
    assert_null(b);
    assert_non_null(strstr(why.text, "nope"));
    assert_int_equal(fp4d_backend_open("toy-off", 0, &b, &why), FP4D_STATUS_DEVICE);
    assert_null(b);
    assert_string_equal(why.text, "toy device is switched off");
    fp4d_backend_close(NULL); /* harmless */

    assert_int_equal(fp4d_backend_open("toy-good", -1, &b, &why), FP4D_STATUS_OK);
    assert_string_equal(fp4d_backend_iface_of(b)->name, "toy-good");
    tb_rng     rng = {1};
    tb_operand a, w;
    tb_operand_make(&a, FP4D_DTYPE_NVFP4, FP4D_LAYOUT_LINEAR, 2, 32, &rng);
    tb_operand_make(&w, FP4D_DTYPE_NVFP4, FP4D_LAYOUT_LINEAR, 3, 32, &rng);
    uint16_t          out16[6];
    fp4d_gemm_problem p = {a.m, w.m, 1.0f, FP4D_DTYPE_BF16, out16};
    /* unsupported: UNSUPPORTED with the backend's reason, gemm not called */
    assert_int_equal(fp4d_backend_gemm(b, &p, &why), FP4D_STATUS_UNSUPPORTED);
    assert_string_equal(why.text, "toy writes f32 only");
    /* grouped and quantize slots absent: UNSUPPORTED, not a crash */
    int64_t                   offs[2] = {0, 2};
    float                     al[1]   = {1.0f};
    float                     out[6];
    fp4d_grouped_gemm_problem gp = {1, offs, a.m, &w.m, al, FP4D_DTYPE_F32, out};
    assert_int_equal(fp4d_backend_grouped_gemm(b, &gp, &why), FP4D_STATUS_UNSUPPORTED);
    assert_non_null(strstr(why.text, "grouped"));
    fp4d_quantize_problem q;
    memset(&q, 0, sizeof q);
    assert_int_equal(fp4d_backend_quantize(b, &q, &why), FP4D_STATUS_UNSUPPORTED);
    /* invalid problem: INVALID_ARG before supports() */
    p.out_type = FP4D_DTYPE_F32;
    p.out      = out;
    p.a.cols   = 48;
    assert_int_equal(fp4d_backend_gemm(b, &p, &why), FP4D_STATUS_INVALID_ARG);
    assert_true(strlen(why.text) > 0);
    p.a.cols = 32;
    assert_int_equal(fp4d_backend_gemm(b, &p, &why), FP4D_STATUS_OK);
    fp4d_backend_close(b);
    tb_operand_free(&a);
    tb_operand_free(&w);
}

static fp4d_gemm_desc nvfp4_desc(void)
{
    fp4d_gemm_desc d = {16, 64, 128, FP4D_DTYPE_NVFP4, FP4D_DTYPE_NVFP4, FP4D_DTYPE_F32,
                        FP4D_LAYOUT_SWIZZLED_128X4, FP4D_LAYOUT_SWIZZLED_128X4, 0};
    return d;
}

/* Captures what fp4d_backend_choose_auto prints on stderr. */
static const char *choose_with_stderr(const fp4d_gemm_desc *d, fp4d_status *st, char *log, size_t log_len)
{
    char path[] = "/tmp/fp4d_test_auto_XXXXXX";
    int  fd     = mkstemp(path);
    assert_true(fd >= 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    const char *name = NULL;
    fp4d_reason why;
    *st = fp4d_backend_choose_auto(d, &name, &why);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    lseek(fd, 0, SEEK_SET);
    ssize_t n = read(fd, log, log_len - 1);
    log[n > 0 ? n : 0] = '\0';
    close(fd);
    unlink(path);
    return name;
}

static void test_auto(void **state)
{
    (void)state;
    fp4d_gemm_desc d = nvfp4_desc();
    const char    *name;
    fp4d_reason    why;
    char           log[8192];
    fp4d_status    st;

    /* toy-good (score 5, correct, supports f32) is registered; cpu scores 10+: cpu wins */
    assert_int_equal(fp4d_backend_choose_auto(&d, &name, &why), FP4D_STATUS_OK);
    assert_string_equal(name, "cpu");
    /* a shape that is no GEMM is refused, not handed to a backend (m = n = -4 chose cpu) */
    fp4d_gemm_desc bad = d;
    bad.m = bad.n = -4;
    assert_int_equal(fp4d_backend_choose_auto(&bad, &name, &why), FP4D_STATUS_INVALID_ARG);
    bad = d;
    bad.k = FP4D_MAX_DIM * 2;
    assert_int_equal(fp4d_backend_choose_auto(&bad, &name, &why), FP4D_STATUS_INVALID_ARG);

    /* A liar with the highest score: validated against the reference and passed over. */
    static toy_conf    liar = {1000, true, false, NULL};
    fp4d_backend_iface f    = toy_iface("toy-liar", &liar);
    assert_int_equal(fp4d_registry_add(&f), FP4D_STATUS_OK);
    setenv("FP4DOCTOR_DEBUG", "1", 1);
    name = choose_with_stderr(&d, &st, log, sizeof log);
    unsetenv("FP4DOCTOR_DEBUG");
    assert_int_equal(st, FP4D_STATUS_OK);
    assert_string_equal(name, "cpu");
    assert_non_null(strstr(log, "toy-liar"));
    assert_non_null(strstr(log, "disagrees"));
    assert_non_null(strstr(log, "chose cpu"));
    assert_non_null(strstr(log, "toy-off: unavailable"));

    /* Faulty backends are never chosen, whatever they claim. */
    fp4d_registry_options o = {true, NULL, 0};
    assert_int_equal(fp4d_registry_init(&o), FP4D_STATUS_OK);
    assert_int_equal(fp4d_backend_choose_auto(&d, &name, &why), FP4D_STATUS_OK);
    assert_string_equal(name, "cpu");

    /* A correct backend with a higher score than cpu, no cached verdict: validated, chosen. */
    static toy_conf fast = {500, false, false, NULL};
    f                    = toy_iface("toy-fast", &fast);
    assert_int_equal(fp4d_registry_add(&f), FP4D_STATUS_OK);
    assert_int_equal(fp4d_backend_choose_auto(&d, &name, &why), FP4D_STATUS_OK);
    assert_string_equal(name, "toy-fast");
    assert_non_null(strstr(why.text, "agrees with the reference"));

    /* The verdict cache: a cached failure excludes, a cached PASS is preferred, the faster first. */
    fp4d_verdict_cache_disable(false);
    fp4d_cached_verdict wrong = {"WRONG", "quick", 0.0}, pass_slow = {"PASS", "quick", 10.0},
                        pass_fast = {"PASS", "quick", 99.0};
    assert_int_equal(fp4d_verdict_cache_put("toy-fast", -1, &wrong), FP4D_STATUS_OK);
    assert_int_equal(fp4d_backend_choose_auto(&d, &name, &why), FP4D_STATUS_OK);
    assert_string_equal(name, "cpu");
    assert_int_equal(fp4d_verdict_cache_put("toy-good", -1, &pass_fast), FP4D_STATUS_OK);
    assert_int_equal(fp4d_verdict_cache_put("cpu", -1, &pass_slow), FP4D_STATUS_OK);
    assert_int_equal(fp4d_backend_choose_auto(&d, &name, &why), FP4D_STATUS_OK);
    assert_string_equal(name, "toy-good"); /* cached PASS, faster than cpu's cached PASS */

    /* bf16 output: toy-good does not support it, so cpu */
    d.out_type = FP4D_DTYPE_BF16;
    assert_int_equal(fp4d_backend_choose_auto(&d, &name, &why), FP4D_STATUS_OK);
    assert_string_equal(name, "cpu");
    d.out_type = FP4D_DTYPE_F32;

    /* FP4DOCTOR_BACKEND forces, even a backend `auto` would never pick */
    setenv("FP4DOCTOR_BACKEND", "ref", 1);
    assert_int_equal(fp4d_backend_choose_auto(&d, &name, &why), FP4D_STATUS_OK);
    assert_string_equal(name, "ref");
    setenv("FP4DOCTOR_BACKEND", "no-such-backend", 1);
    assert_int_equal(fp4d_backend_choose_auto(&d, &name, &why), FP4D_STATUS_NOT_FOUND);
    assert_non_null(strstr(why.text, "no-such-backend"));
    unsetenv("FP4DOCTOR_BACKEND");

    /* Nothing supports the problem: UNSUPPORTED with a reason */
    d.b_type = FP4D_DTYPE_BF16;
    assert_int_equal(fp4d_backend_choose_auto(&d, &name, &why), FP4D_STATUS_UNSUPPORTED);
    assert_null(name);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_builtins_in_order),
        cmocka_unit_test(test_add_rejects_bad_ifaces),
        cmocka_unit_test(test_reasons_are_cleaned),
        cmocka_unit_test(test_verdict_cache_home_and_write_errors),
        cmocka_unit_test(test_quantize_problems_are_checked),
        cmocka_unit_test(test_open_close_supports),
        cmocka_unit_test(test_auto),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
