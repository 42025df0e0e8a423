/*
 * The foundation CLI commands (quantize, dequantize, gemm, verify, and bench on the host
 * backends) run as a user would run them: the built binary ($FP4DOCTOR_BIN, set by ctest) on
 * files generated here, with the results checked against the library called directly and the
 * exit codes of bad input.
 */
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>
#include <jansson.h>

#include "fp4doctor/formats.h"
#include "fp4doctor/io.h"
#include "fp4doctor/ref.h"
#include "test_util.h"

static char dir[256];
static const char *bin;

#define path_of(name) tu_path_in(dir, (name))
/* the CLI with a shell-quoted argument string; stdout/stderr to files in dir; the exit code */
#define run_cli(...) tu_run_cli(bin, dir, "", __VA_ARGS__)
#define output_contains(which, needle) tu_output_contains(dir, (which), (needle))

/* stderr is exactly one line that names the command. */
static void assert_one_line_error(void)
{
    char *s = tu_slurp(path_of("stderr.txt"), NULL);
    assert_non_null(s);
    assert_true(strncmp(s, "fp4doctor ", 10) == 0);
    char *nl = strchr(s, '\n');
    assert_non_null(nl);
    assert_int_equal(nl[1], '\0');
    free(s);
}

static uint64_t rng_state = 0xC0FFEE1234567ull;
static double gauss(void)
{
    double u = 0;
    for (int i = 0; i < 12; i++) {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        u += (double)(rng_state >> 11) / 9007199254740992.0;
    }
    return u - 6.0;
}

/* Input file: act bf16 [5, 64], w f32 [6, 64], heavy f16 [3, 96] (with an outlier), bias f32
 * [6], odd f32 [2, 24] (24 not a multiple of 16, so it is copied). */
enum { AM = 5, WN = 6, KK = 64 };
static uint16_t act_bf16[AM * KK];
static float w_f32[WN * KK], bias[WN], odd[2 * 24];
static uint16_t heavy_f16[3 * 96];

static void make_input(void)
{
    float tmp[AM * KK];
    for (int i = 0; i < AM * KK; i++) tmp[i] = (float)gauss();
    fp4d_from_f32(FP4D_DTYPE_BF16, tmp, AM * KK, act_bf16);
    for (int i = 0; i < WN * KK; i++) w_f32[i] = (float)(gauss() * 0.02);
    for (int i = 0; i < WN; i++) bias[i] = (float)i;
    for (int i = 0; i < 48; i++) odd[i] = (float)i;
    float h[3 * 96];
    for (int i = 0; i < 3 * 96; i++) h[i] = (float)(gauss() * gauss() * gauss());
    h[17] = 6000.0f;
    fp4d_from_f32(FP4D_DTYPE_F16, h, 3 * 96, heavy_f16);

    fp4d_st_writer *w = fp4d_st_writer_new();
    int64_t s_act[2] = {AM, KK}, s_w[2] = {WN, KK}, s_b[1] = {WN}, s_odd[2] = {2, 24}, s_h[2] = {3, 96};
    assert_int_equal(fp4d_st_writer_add(w, "model.act", FP4D_ST_BF16, 2, s_act, act_bf16, sizeof act_bf16), 0);
    assert_int_equal(fp4d_st_writer_add(w, "model.w", FP4D_ST_F32, 2, s_w, w_f32, sizeof w_f32), 0);
    assert_int_equal(fp4d_st_writer_add(w, "model.bias", FP4D_ST_F32, 1, s_b, bias, sizeof bias), 0);
    assert_int_equal(fp4d_st_writer_add(w, "model.odd", FP4D_ST_F32, 2, s_odd, odd, sizeof odd), 0);
    assert_int_equal(fp4d_st_writer_add(w, "model.heavy", FP4D_ST_F16, 2, s_h, heavy_f16, sizeof heavy_f16), 0);
    fp4d_st_writer_set_metadata(w, "format", "pt");
    assert_int_equal(fp4d_st_writer_save(w, path_of("in.safetensors")), 0);
    fp4d_st_writer_free(w);
}

static int setup(void **state)
{
    (void)state;
    bin = tu_cli_binary();
    snprintf(dir, sizeof dir, "/tmp/fp4d_cli_test_XXXXXX");
    if (!mkdtemp(dir)) return -1;
    make_input();
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tu_remove_tree(dir);
    return 0;
}

/* Checks that quantized tensor name in file f equals fp4d_quantize on the original. */
static void check_quantized(const fp4d_st_file *f, const char *name, fp4d_dtype src_type, const void *src,
                            int64_t rows, int64_t cols, const fp4d_quantize_params *qp)
{
    const fp4d_dtype_traits *tr = fp4d_dtype_get(qp->format);
    int64_t sc = cols / tr->block_size;
    size_t sbytes = fp4d_scale_buffer_size(qp->scale_layout, rows, sc);
    uint8_t *codes = malloc((size_t)(rows * cols / 2)), *scales = malloc(sbytes);
    fp4d_quantize_result res;
    assert_int_equal(fp4d_quantize(qp, src_type, src, rows, cols, codes, scales, &res), FP4D_STATUS_OK);

    char sname[256], s2name[256], key[300];
    snprintf(sname, sizeof sname, "%s_scale", name);
    snprintf(s2name, sizeof s2name, "%s_scale_2", name);
    const fp4d_st_tensor *t = fp4d_st_find(f, name), *s = fp4d_st_find(f, sname), *s2 = fp4d_st_find(f, s2name);
    assert_non_null(t);
    assert_non_null(s);
    assert_int_equal(t->dtype, FP4D_ST_U8);
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[0], rows);
    assert_int_equal(t->shape[1], cols / 2);
    assert_memory_equal(t->data, codes, (size_t)(rows * cols / 2));
    assert_int_equal(s->dtype, qp->format == FP4D_DTYPE_NVFP4 ? FP4D_ST_F8_E4M3 : FP4D_ST_U8);
    assert_int_equal(s->nbytes, sbytes);
    if (qp->scale_layout == FP4D_LAYOUT_LINEAR) {
        assert_int_equal(s->shape[0], rows);
        assert_int_equal(s->shape[1], sc);
    }
    assert_memory_equal(s->data, scales, sbytes);
    if (qp->format == FP4D_DTYPE_NVFP4) {
        assert_non_null(s2);
        assert_int_equal(s2->dtype, FP4D_ST_F32);
        assert_int_equal(s2->ndim, 0);
        float v;
        memcpy(&v, s2->data, 4);
        assert_true(v == res.decode_scale);
    } else {
        assert_null(s2);
    }
    snprintf(key, sizeof key, "fp4doctor.scale_layout.%s", name);
    assert_string_equal(fp4d_st_metadata(f, key), fp4d_scale_layout_name(qp->scale_layout));
    free(codes);
    free(scales);
}

static void test_quantize_nvfp4_default(void **state)
{
    (void)state;
    struct stat before, after;
    assert_int_equal(stat(path_of("in.safetensors"), &before), 0);
    size_t in_len;
    char *in_bytes = tu_slurp(path_of("in.safetensors"), &in_len);

    assert_int_equal(run_cli("quantize --format nvfp4 '%s' '%s'", path_of("in.safetensors"), path_of("q.safetensors")), 0);
    fp4d_st_open_result res;
    fp4d_st_file *f = fp4d_st_open(path_of("q.safetensors"), &res);
    assert_non_null(f);
    fp4d_quantize_params qp = {FP4D_DTYPE_NVFP4, FP4D_CONV_FLASHINFER_EXACT, FP4D_LAYOUT_LINEAR, 0.0f};
    check_quantized(f, "model.act", FP4D_DTYPE_BF16, act_bf16, AM, KK, &qp);
    check_quantized(f, "model.w", FP4D_DTYPE_F32, w_f32, WN, KK, &qp);
    check_quantized(f, "model.heavy", FP4D_DTYPE_F16, heavy_f16, 3, 96, &qp);
    /* Not quantizable: copied unchanged, with the input's metadata. */
    const fp4d_st_tensor *b = fp4d_st_find(f, "model.bias"), *o = fp4d_st_find(f, "model.odd");
    assert_non_null(b);
    assert_int_equal(b->dtype, FP4D_ST_F32);
    assert_memory_equal(b->data, bias, sizeof bias);
    assert_non_null(o);
    assert_memory_equal(o->data, odd, sizeof odd);
    assert_null(fp4d_st_find(f, "model.odd_scale"));
    assert_string_equal(fp4d_st_metadata(f, "format"), "pt");
    assert_int_equal(fp4d_st_count(f), 2 + 3 * 3);
    fp4d_st_close(f);

    /* The input is untouched. */
    assert_int_equal(stat(path_of("in.safetensors"), &after), 0);
    assert_int_equal(before.st_mtime, after.st_mtime);
    size_t len2;
    char *again = tu_slurp(path_of("in.safetensors"), &len2);
    assert_int_equal(len2, in_len);
    assert_memory_equal(again, in_bytes, in_len);
    free(again);
    free(in_bytes);
}

static void test_quantize_options(void **state)
{
    (void)state;
    /* Only the named tensor, MXFP4, swizzled scales, a named convention. */
    assert_int_equal(run_cli("quantize --format=mxfp4 --convention ocp --scale-layout swizzled --tensor model.w '%s' '%s'",
                             path_of("in.safetensors"), path_of("qm.safetensors")),
                     0);
    fp4d_st_file *f = fp4d_st_open(path_of("qm.safetensors"), NULL);
    assert_non_null(f);
    fp4d_quantize_params qp = {FP4D_DTYPE_MXFP4, FP4D_CONV_OCP, FP4D_LAYOUT_SWIZZLED_128X4, 0.0f};
    check_quantized(f, "model.w", FP4D_DTYPE_F32, w_f32, WN, KK, &qp);
    const fp4d_st_tensor *s = fp4d_st_find(f, "model.w_scale");
    assert_int_equal(s->shape[0], 128); /* the padded buffer's shape */
    assert_int_equal(s->shape[1], 4);
    assert_int_equal(fp4d_st_find(f, "model.act")->dtype, FP4D_ST_BF16); /* not named: copied */
    fp4d_st_close(f);
}

static void test_dequantize_round_trip(void **state)
{
    (void)state;
    const char *variants[2][2] = {{"--format nvfp4", "rt_nv"}, {"--format mxfp4 --scale-layout swizzled", "rt_mx"}};
    for (int v = 0; v < 2; v++) {
        char q[64], dq[64];
        snprintf(q, sizeof q, "%s_q.safetensors", variants[v][1]);
        snprintf(dq, sizeof dq, "%s_dq.safetensors", variants[v][1]);
        assert_int_equal(run_cli("quantize %s '%s' '%s'", variants[v][0], path_of("in.safetensors"), path_of(q)), 0);
        assert_int_equal(run_cli("dequantize '%s' '%s'", path_of(q), path_of(dq)), 0);
        fp4d_st_file *fq = fp4d_st_open(path_of(q), NULL), *fd = fp4d_st_open(path_of(dq), NULL);
        assert_non_null(fq);
        assert_non_null(fd);
        /* Same tensor set as the original input; scales gone; values as fp4d_dequantize. */
        assert_int_equal(fp4d_st_count(fd), 5);
        assert_null(fp4d_st_find(fd, "model.w_scale"));
        assert_null(fp4d_st_find(fd, "model.w_scale_2"));
        assert_memory_equal(fp4d_st_find(fd, "model.bias")->data, bias, sizeof bias);
        const fp4d_st_tensor *w = fp4d_st_find(fd, "model.w");
        assert_int_equal(w->dtype, FP4D_ST_F32);
        assert_int_equal(w->shape[0], WN);
        assert_int_equal(w->shape[1], KK);
        fp4d_dtype fmt = v == 0 ? FP4D_DTYPE_NVFP4 : FP4D_DTYPE_MXFP4;
        fp4d_scale_layout lay = v == 0 ? FP4D_LAYOUT_LINEAR : FP4D_LAYOUT_SWIZZLED_128X4;
        float s2 = 1.0f;
        if (v == 0) memcpy(&s2, fp4d_st_find(fq, "model.w_scale_2")->data, 4);
        float expect[WN * KK];
        assert_int_equal(fp4d_dequantize(fmt, lay, fp4d_st_find(fq, "model.w")->data,
                                         fp4d_st_find(fq, "model.w_scale")->data, s2, WN, KK, expect),
                         FP4D_STATUS_OK);
        assert_memory_equal(w->data, expect, sizeof expect);
        /* And the round trip is close to the original: FP4 keeps every value within half a
         * step of the block's grid, i.e. within amax/6 of the block (loose, but fails for a
         * wrong layout, nibble order or scale). */
        const float *got = (const float *)w->data;
        const int bs = v == 0 ? 16 : 32;
        for (int r = 0; r < WN; r++)
            for (int blk = 0; blk < KK / bs; blk++) {
                float amax = 0;
                for (int j = 0; j < bs; j++) amax = fmaxf(amax, fabsf(w_f32[r * KK + blk * bs + j]));
                for (int j = 0; j < bs; j++) {
                    int i = r * KK + blk * bs + j;
                    assert_true(fabsf(got[i] - w_f32[i]) <= amax / 3.0f + 1e-6f);
                }
            }
        fp4d_st_close(fq);
        fp4d_st_close(fd);
    }
}

/* Tensor names past 1 KB: their companions (_scale, _scale_2) and metadata keys were looked
 * up through fixed buffers that cut them, so dequantize left such a tensor as raw codes, or
 * skipped its per-tensor scale (values 27x too large), and exited 0. */
static void test_long_tensor_names(void **state)
{
    (void)state;
    static char name[2101];
    memset(name, 'c', sizeof name - 1);
    name[0] = 'W';
    float x[4 * 32];
    for (int i = 0; i < 4 * 32; i++) x[i] = (float)((i * 37) % 200 - 100) * 0.5f;
    fp4d_st_writer *w = fp4d_st_writer_new();
    const int64_t shape[2] = {4, 32};
    assert_int_equal(fp4d_st_writer_add(w, name, FP4D_ST_F32, 2, shape, x, sizeof x), FP4D_STATUS_OK);
    assert_int_equal(fp4d_st_writer_save(w, path_of("long.safetensors")), FP4D_STATUS_OK);
    fp4d_st_writer_free(w);
    assert_int_equal(run_cli("quantize '%s' '%s'", path_of("long.safetensors"), path_of("long_q.safetensors")), 0);
    assert_int_equal(run_cli("dequantize '%s' '%s'", path_of("long_q.safetensors"), path_of("long_dq.safetensors")), 0);
    fp4d_st_file *f = fp4d_st_open(path_of("long_dq.safetensors"), NULL);
    assert_non_null(f);
    const fp4d_st_tensor *t = fp4d_st_find(f, name);
    assert_non_null(t);
    assert_int_equal(t->dtype, FP4D_ST_F32); /* dequantized, not copied as codes */
    const float *got = (const float *)t->data;
    for (int i = 0; i < 4 * 32; i++) assert_true(fabsf(got[i] - x[i]) <= 50.0f / 3.0f + 1e-6f);
    fp4d_st_close(f);
}

/* gemm --backend ref equals fp4d_ref_gemm with alpha = RN(a_s2 * b_s2); verify agrees. */
static void test_gemm_ref_and_verify(void **state)
{
    (void)state;
    assert_int_equal(run_cli("quantize '%s' '%s'", path_of("in.safetensors"), path_of("g_q.safetensors")), 0);
    fp4d_st_file *fq = fp4d_st_open(path_of("g_q.safetensors"), NULL);
    assert_non_null(fq);
    const char *types[3] = {"f32", "bf16", "f16"};
    const fp4d_dtype dts[3] = {FP4D_DTYPE_F32, FP4D_DTYPE_BF16, FP4D_DTYPE_F16};
    float as2, ws2;
    memcpy(&as2, fp4d_st_find(fq, "model.act_scale_2")->data, 4);
    memcpy(&ws2, fp4d_st_find(fq, "model.w_scale_2")->data, 4);
    fp4d_matrix A = {FP4D_DTYPE_NVFP4, AM, KK, fp4d_st_find(fq, "model.act")->data,
                     fp4d_st_find(fq, "model.act_scale")->data, FP4D_LAYOUT_LINEAR};
    fp4d_matrix Ab = {FP4D_DTYPE_BF16, AM, KK, act_bf16, NULL, FP4D_LAYOUT_LINEAR};
    fp4d_matrix B = {FP4D_DTYPE_NVFP4, WN, KK, fp4d_st_find(fq, "model.w")->data,
                     fp4d_st_find(fq, "model.w_scale")->data, FP4D_LAYOUT_LINEAR};
    for (int t = 0; t < 3; t++) {
        for (int plain = 0; plain < 2; plain++) {
            const char *a_spec = plain ? "in.safetensors" : "g_q.safetensors";
            assert_int_equal(run_cli("gemm --backend ref --out-dtype %s '%s:model.act' '%s:model.w' '%s'", types[t],
                                     path_of(a_spec), path_of("g_q.safetensors"), path_of("g_out.safetensors")),
                             0);
            uint8_t expect[AM * WN * 4];
            fp4d_gemm_problem p = {plain ? Ab : A, B, plain ? ws2 : as2 * ws2, dts[t], expect};
            assert_int_equal(fp4d_ref_gemm(&p), FP4D_STATUS_OK);
            fp4d_st_file *fo = fp4d_st_open(path_of("g_out.safetensors"), NULL);
            assert_non_null(fo);
            const fp4d_st_tensor *o = fp4d_st_find(fo, "out");
            assert_non_null(o);
            assert_int_equal(o->dtype, t == 0 ? FP4D_ST_F32 : t == 1 ? FP4D_ST_BF16 : FP4D_ST_F16);
            assert_int_equal(o->shape[0], AM);
            assert_int_equal(o->shape[1], WN);
            assert_memory_equal(o->data, expect, o->nbytes);
            fp4d_st_close(fo);
            /* verify: identical -> 0 */
            assert_int_equal(run_cli("verify '%s:model.act' '%s:model.w' '%s:out'", path_of(a_spec),
                                     path_of("g_q.safetensors"), path_of("g_out.safetensors")),
                             0);
            assert_true(output_contains("stdout.txt", "0 ulps"));
        }
    }
    /* verify on a corrupted output: one element off by 3 ulps -> exit 1, reported. */
    fp4d_st_file *fo = fp4d_st_open(path_of("g_out.safetensors"), NULL); /* f16, plain A */
    const fp4d_st_tensor *o = fp4d_st_find(fo, "out");
    uint16_t bad[AM * WN];
    memcpy(bad, o->data, sizeof bad);
    fp4d_st_close(fo);
    bad[7] = (uint16_t)(bad[7] + 3);
    fp4d_st_writer *w = fp4d_st_writer_new();
    int64_t shape[2] = {AM, WN};
    fp4d_st_writer_add(w, "out", FP4D_ST_F16, 2, shape, bad, sizeof bad);
    assert_int_equal(fp4d_st_writer_save(w, path_of("bad_out.safetensors")), 0);
    fp4d_st_writer_free(w);
    assert_int_equal(run_cli("verify '%s:model.act' '%s:model.w' '%s:out'", path_of("in.safetensors"),
                             path_of("g_q.safetensors"), path_of("bad_out.safetensors")),
                     1);
    assert_true(output_contains("stdout.txt", "1 of 30 elements"));
    assert_true(output_contains("stdout.txt", "3 ulps at [1, 1]"));
    /* --backend auto: FP4DOCTOR_BACKEND forces the choice, FP4DOCTOR_DEBUG=1 says why, and
     * the file records the backend that ran. */
    assert_int_equal(run_cli("gemm --backend auto '%s:model.act' '%s:model.w' '%s'", path_of("g_q.safetensors"),
                             path_of("g_q.safetensors"), path_of("auto_out.safetensors")),
                     0);
    setenv("FP4DOCTOR_BACKEND", "ref", 1);
    setenv("FP4DOCTOR_DEBUG", "1", 1);
    assert_int_equal(run_cli("gemm --backend auto '%s:model.act' '%s:model.w' '%s'", path_of("g_q.safetensors"),
                             path_of("g_q.safetensors"), path_of("auto_out.safetensors")),
                     0);
    unsetenv("FP4DOCTOR_BACKEND");
    unsetenv("FP4DOCTOR_DEBUG");
    assert_true(output_contains("stderr.txt", "FP4DOCTOR_BACKEND"));
    /* a forced name that is no backend is a usage error, as an unknown --backend is; it was 1,
     * as if a backend had failed */
    setenv("FP4DOCTOR_BACKEND", "no-such-backend", 1);
    assert_int_equal(run_cli("gemm --backend auto '%s:model.act' '%s:model.w' '%s'", path_of("g_q.safetensors"),
                             path_of("g_q.safetensors"), path_of("auto_bad.safetensors")),
                     2);
    unsetenv("FP4DOCTOR_BACKEND");
    assert_true(output_contains("stderr.txt", "FP4DOCTOR_BACKEND=no-such-backend names no registered backend"));
    fo = fp4d_st_open(path_of("auto_out.safetensors"), NULL);
    assert_non_null(fo);
    assert_string_equal(fp4d_st_metadata(fo, "fp4doctor.backend"), "ref");
    fp4d_st_close(fo);
    fp4d_st_close(fq);
}

/* Writes an f16 [AM, WN] output "out" of the values in v (rounded) to name. */
static void save_f16_out(const char *name, const float *v)
{
    uint16_t h[AM * WN];
    for (int i = 0; i < AM * WN; i++) h[i] = fp4d_f16_from_f32(v[i]);
    fp4d_st_writer *w = fp4d_st_writer_new();
    const int64_t shape[2] = {AM, WN};
    assert_int_equal(fp4d_st_writer_add(w, "out", FP4D_ST_F16, 2, shape, h, sizeof h), FP4D_STATUS_OK);
    assert_int_equal(fp4d_st_writer_save(w, path_of(name)), FP4D_STATUS_OK);
    fp4d_st_writer_free(w);
}

/* verify --tolerance judges as check does: the cpu backend's f32 sums, not bit-identical to the
 * correctly rounded result, PASS; an element a few ulps off is INACCURATE, a NaN or a doubled
 * element WRONG; each verdict names the element and its bounds. */
static void test_verify_tolerance(void **state)
{
    (void)state;
    assert_int_equal(run_cli("quantize '%s' '%s'", path_of("in.safetensors"), path_of("t_q.safetensors")), 0);
    const char *a = path_of("in.safetensors"), *b = path_of("t_q.safetensors");
    char a_spec[600], b_spec[600];
    snprintf(a_spec, sizeof a_spec, "%s:model.act", a);
    snprintf(b_spec, sizeof b_spec, "%s:model.w", b);
    assert_int_equal(run_cli("gemm --backend cpu --out-dtype f16 '%s' '%s' '%s'", a_spec, b_spec,
                             path_of("t_out.safetensors")),
                     0);
    assert_int_equal(run_cli("verify --tolerance '%s' '%s' '%s:out'", a_spec, b_spec, path_of("t_out.safetensors")), 0);
    assert_true(output_contains("stdout.txt", "verify: PASS: all 30 elements of out [5, 6] f16 are within the "
                                              "f32-accumulation bound"));
    /* the exact result itself, and then that result spoiled three ways */
    assert_int_equal(run_cli("gemm --backend ref --out-dtype f16 '%s' '%s' '%s'", a_spec, b_spec,
                             path_of("t_ref.safetensors")),
                     0);
    fp4d_st_file *f = fp4d_st_open(path_of("t_ref.safetensors"), NULL);
    assert_non_null(f);
    float v[AM * WN];
    for (int i = 0; i < AM * WN; i++) v[i] = fp4d_f16_to_f32(((const uint16_t *)fp4d_st_find(f, "out")->data)[i]);
    fp4d_st_close(f);
    save_f16_out("t_same.safetensors", v);
    assert_int_equal(run_cli("verify --tolerance '%s' '%s' '%s:out'", a_spec, b_spec, path_of("t_same.safetensors")), 0);
    assert_true(output_contains("stdout.txt", "every element exact"));
    int worst = 0; /* the largest element: a few ulps there is past the f32 bound, within 1% of S */
    for (int i = 1; i < AM * WN; i++)
        if (fabsf(v[i]) > fabsf(v[worst])) worst = i;
    const float keep = v[worst];
    v[worst] = keep * (1.0f + 4.0f / 1024.0f);
    save_f16_out("t_off.safetensors", v);
    assert_int_equal(run_cli("verify --tolerance '%s' '%s' '%s:out'", a_spec, b_spec, path_of("t_off.safetensors")), 1);
    char where[64];
    snprintf(where, sizeof where, "worst at [%d, %d]", worst / WN, worst % WN);
    assert_true(output_contains("stdout.txt", "verify: INACCURATE: 1 of 30 elements"));
    assert_true(output_contains("stdout.txt", where));
    v[worst] = 2.0f * keep;
    save_f16_out("t_double.safetensors", v);
    assert_int_equal(run_cli("verify --tolerance '%s' '%s' '%s:out'", a_spec, b_spec, path_of("t_double.safetensors")),
                     1);
    assert_true(output_contains("stdout.txt", "verify: WRONG: 1 of 30 elements"));
    assert_true(output_contains("stdout.txt", "1 outside the practical tolerance; NaN mismatches: 0"));
    v[worst] = keep;
    v[3] = NAN;
    save_f16_out("t_nan.safetensors", v);
    assert_int_equal(run_cli("verify --tolerance '%s' '%s' '%s:out'", a_spec, b_spec, path_of("t_nan.safetensors")), 1);
    assert_true(output_contains("stdout.txt", "NaN mismatches: 1; worst at [0, 3]: got nan"));
    assert_int_equal(run_cli("verify --tolerance --bogus '%s' '%s' '%s:out'", a_spec, b_spec,
                             path_of("t_nan.safetensors")),
                     2);
}

static void test_bad_input_exit_codes(void **state)
{
    (void)state;
    char in[512]; /* path_of() recycles its buffers */
    snprintf(in, sizeof in, "%s", path_of("in.safetensors"));
    /* usage */
    assert_int_equal(run_cli("quantize"), 2);
    assert_one_line_error();
    assert_int_equal(run_cli("quantize --format nvfp5 '%s' '%s'", in, path_of("x.safetensors")), 2);
    assert_one_line_error();
    assert_int_equal(run_cli("quantize --bogus '%s' '%s'", in, path_of("x.safetensors")), 2);
    assert_int_equal(run_cli("quantize --format nvfp4 --convention ocp '%s' '%s'", in, path_of("x.safetensors")), 2);
    assert_int_equal(run_cli("quantize '%s' '%s'", in, in), 2); /* OUT == IN */
    assert_true(output_contains("stderr.txt", "refusing"));
    assert_int_equal(run_cli("dequantize '%s'", in), 2);
    assert_int_equal(run_cli("gemm '%s' '%s:model.w' '%s'", in, in, path_of("x.safetensors")), 2); /* no :NAME */
    assert_int_equal(run_cli("gemm --backend no-such '%s:model.act' '%s:model.w' '%s'", in,
                             path_of("g_q.safetensors"), path_of("x.safetensors")),
                     2);
    assert_true(output_contains("stderr.txt", "no-such"));
    assert_int_equal(run_cli("gemm --out-dtype f64 '%s:a' '%s:b' '%s'", in, in, path_of("x.safetensors")), 2);
    assert_int_equal(run_cli("gemm '%s:model.act' '%s:model.w' '%s'", in, path_of("g_q.safetensors"),
                             path_of("g_q.safetensors")),
                     2); /* OUT is an input */
    assert_int_equal(run_cli("verify '%s:a' '%s:b'", in, in), 2);
    /* numbers are digits only (cli.md): strtol took "+1" and " 8" */
    assert_int_equal(run_cli("scan --threads +1 '%s'", in), 2);
    assert_int_equal(run_cli("scan --threads ' 8' '%s'", in), 2);
    assert_int_equal(run_cli("backends --device ' 1'"), 2);
    assert_int_equal(run_cli("backends --device +0"), 2);
    /* a backend named twice ran (check) or was timed (bench) twice; bench with nothing to time
     * printed an empty table with exit 0 */
    assert_int_equal(run_cli("check --backend ref,cpu,ref --suite quick --no-cache"), 2);
    assert_true(output_contains("stderr.txt", "'ref' twice"));
    assert_int_equal(run_cli("bench --backend cpu,cpu --shapes 64x64 --m 1 --no-moe --no-quantize"), 2);
    assert_int_equal(run_cli("bench --no-dense --no-moe --no-quantize"), 2);

    /* unreadable / invalid input */
    assert_int_equal(run_cli("quantize '%s' '%s'", path_of("missing.safetensors"), path_of("x.safetensors")), 3);
    assert_one_line_error();
    FILE *g = fopen(path_of("garbage.safetensors"), "wb");
    fputs("this is not a safetensors file at all", g);
    fclose(g);
    assert_int_equal(run_cli("quantize '%s' '%s'", path_of("garbage.safetensors"), path_of("x.safetensors")), 3);
    assert_true(output_contains("stderr.txt", "HEADER_TOO_LARGE"));
    assert_int_equal(run_cli("dequantize '%s' '%s'", path_of("garbage.safetensors"), path_of("x.safetensors")), 3);
    assert_int_equal(run_cli("quantize --tensor nope '%s' '%s'", in, path_of("x.safetensors")), 3);
    assert_int_equal(run_cli("quantize --tensor model.odd '%s' '%s'", in, path_of("x.safetensors")), 3);
    assert_true(output_contains("stderr.txt", "model.odd"));
    /* B must be quantized; A's tensor must exist; K must agree. */
    assert_int_equal(run_cli("gemm '%s:model.act' '%s:model.w' '%s'", in, in, path_of("x.safetensors")), 3);
    assert_int_equal(run_cli("gemm '%s:nope' '%s:model.w' '%s'", in, path_of("g_q.safetensors"), path_of("x.safetensors")), 3);
    assert_int_equal(run_cli("gemm '%s:model.heavy' '%s:model.w' '%s'", in, path_of("g_q.safetensors"),
                             path_of("x.safetensors")),
                     3);
    assert_true(output_contains("stderr.txt", "K differs"));
    /* Nothing was written for any failure. */
    assert_int_equal(access(path_of("x.safetensors"), F_OK), -1);

    /* --help: exit 0, usage on stdout */
    const char *cmds[4] = {"quantize", "dequantize", "gemm", "verify"};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(run_cli("%s --help", cmds[i]), 0);
        assert_true(output_contains("stdout.txt", "usage: fp4doctor"));
    }
}

/* A bench row's round medians: `rounds` of them, median_us their median, min_us at most any. */
static void assert_round_medians(const json_t *r, size_t rounds)
{
    const json_t *a = json_object_get(r, "round_median_us");
    assert_true(json_is_array(a));
    assert_int_equal(json_array_size(a), rounds);
    double v[16];
    assert_true(rounds <= 16);
    for (size_t i = 0; i < rounds; i++) {
        v[i] = json_real_value(json_array_get(a, i));
        assert_true(v[i] > 0.0);
        for (size_t j = i; j > 0 && v[j - 1] > v[j]; j--) {
            const double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    }
    const double median = rounds % 2 ? v[rounds / 2] : 0.5 * (v[rounds / 2 - 1] + v[rounds / 2]);
    assert_float_equal(json_real_value(json_object_get(r, "median_us")), median, 1e-9 * median);
    const double min_us = json_real_value(json_object_get(r, "min_us"));
    assert_true(min_us > 0.0 && min_us <= v[0]);
}

/* bench on 64x64 at M = 1 with these repeats and rounds: `rows` rows of `rounds` rounds each. */
static void assert_bench_rounds(const char *backends, int repeats, int rounds, size_t rows, size_t expect_rounds)
{
    assert_int_equal(run_cli("bench --backend %s --shapes 64x64 --m 1 --no-moe --no-quantize --repeats %d --rounds %d "
                             "--json '%s'",
                             backends, repeats, rounds, path_of("bench.json")),
                     0);
    json_error_t err;
    json_t *root = json_load_file(path_of("bench.json"), 0, &err);
    assert_non_null(root);
    json_t *res = json_object_get(root, "results");
    assert_int_equal(json_array_size(res), rows);
    for (size_t j = 0; j < rows; j++) assert_round_medians(json_array_get(res, j), expect_rounds);
    json_decref(root);
}

/* bench times every configuration on all backends in turn (measured_order: the two backends'
 * rows of one configuration are adjacent), and reports the rows one backend after the other,
 * in the order asked for, each backend's rows in configuration order. */
static void test_bench_host_backends(void **state)
{
    (void)state;
    assert_int_equal(run_cli("bench --backend ref,cpu --shapes 64x64,32x128 --m 1,3 --no-moe --no-quantize --repeats 2 "
                             "--json '%s'",
                             path_of("bench.json")),
                     0);
    json_error_t err;
    json_t *root = json_load_file(path_of("bench.json"), 0, &err);
    assert_non_null(root);
    json_t *res = json_object_get(root, "results");
    assert_true(json_is_array(res));
    const char *backends[2] = {"ref", "cpu"};
    const int64_t shapes[2][2] = {{64, 64}, {32, 128}}, ms[2] = {1, 3};
    const char *modes[2] = {"W4A16", "W4A4"};
    assert_int_equal(json_array_size(res), 2 * 2 * 2 * 2);
    size_t i = 0;
    for (int b = 0; b < 2; b++)
        for (int s = 0; s < 2; s++)
            for (int m = 0; m < 2; m++)
                for (int mode = 0; mode < 2; mode++, i++) {
                    const json_t *r = json_array_get(res, i);
                    assert_string_equal(json_string_value(json_object_get(r, "backend")), backends[b]);
                    assert_string_equal(json_string_value(json_object_get(r, "mode")), modes[mode]);
                    assert_int_equal(json_integer_value(json_object_get(r, "n")), shapes[s][0]);
                    assert_int_equal(json_integer_value(json_object_get(r, "k")), shapes[s][1]);
                    assert_int_equal(json_integer_value(json_object_get(r, "m")), ms[m]);
                    assert_string_equal(json_string_value(json_object_get(r, "status")), "OK");
                    assert_true(json_real_value(json_object_get(r, "median_us")) > 0.0);
                    const int64_t config = (s * 2 + m) * 2 + mode;
                    assert_int_equal(json_integer_value(json_object_get(r, "measured_order")), config * 2 + b);
                    /* two repeats: two rounds of one (never more rounds than repeats), the
                     * figure their median, the minimum no larger than either */
                    assert_round_medians(r, 2);
                }
    json_decref(root);
    /* --rounds 1: the whole repeat count at once; --rounds 3 of 7 repeats: three rounds */
    assert_bench_rounds("cpu", 3, 1, 2, 1);
    assert_bench_rounds("ref,cpu", 7, 3, 4, 3);
    assert_int_equal(run_cli("bench --backend ref --shapes 64x64 --m 1 --rounds 0"), 2);
    assert_true(output_contains("stderr.txt", "--rounds"));
    assert_int_equal(run_cli("bench --backend ref --shapes 64x64 --m 1 --rounds 17"), 2);
    assert_int_equal(run_cli("bench --backend ref --shapes 64x64 --m 1 --rounds 2x"), 2);
    /* an unknown backend is a usage error, before anything is timed */
    assert_int_equal(run_cli("bench --backend ref,nope --shapes 64x64 --m 1"), 2);
    assert_true(output_contains("stderr.txt", "nope"));
    /* so are lists with an empty item or more items than it takes (they were dropped or cut
     * short), and a repeat count with trailing junk */
    assert_int_equal(run_cli("bench --backend ref --shapes 64x64 --m 1,,2"), 2);
    assert_true(output_contains("stderr.txt", "--m"));
    assert_one_line_error();
    assert_int_equal(run_cli("bench --backend ref, --shapes 64x64 --m 1"), 2);
    assert_int_equal(run_cli("bench --backend ref --shapes 64x64, --m 1"), 2);
    assert_int_equal(run_cli("bench --backend ref --shapes 64x64 --m 1 --tokens "
                             "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33"),
                     2);
    assert_true(output_contains("stderr.txt", "--tokens"));
    assert_int_equal(run_cli("bench --backend ref --shapes 64x64 --m 1 --repeats 5x"), 2);
    assert_true(output_contains("stderr.txt", "--repeats"));
    /* list items are whole numbers (digits only, 1..2^20; K a multiple of 32), and the
     * message quotes the item it refuses */
    assert_int_equal(run_cli("bench --backend ref --shapes 64x64 --m +4"), 2);
    assert_true(output_contains("stderr.txt", "'+4'"));
    assert_one_line_error();
    assert_int_equal(run_cli("bench --backend ref --shapes 64x64 --m ' 4'"), 2);
    assert_true(output_contains("stderr.txt", "' 4'"));
    assert_int_equal(run_cli("bench --backend ref --shapes 64x64 --m 1,0"), 2);
    assert_true(output_contains("stderr.txt", "'0'"));
    assert_int_equal(run_cli("bench --backend ref --shapes 64x64 --m 1 --tokens 1,2000000"), 2);
    assert_true(output_contains("stderr.txt", "--tokens"));
    assert_true(output_contains("stderr.txt", "'2000000'"));
    assert_int_equal(run_cli("bench --backend ref --shapes '64x 64' --m 1"), 2);
    assert_true(output_contains("stderr.txt", "'64x 64'"));
    assert_int_equal(run_cli("bench --backend ref --shapes +64x64 --m 1"), 2);
    assert_true(output_contains("stderr.txt", "'+64x64'"));
    assert_int_equal(run_cli("bench --backend ref --shapes 64x64x --m 1"), 2);
    assert_int_equal(run_cli("bench --backend ref --shapes 64x48 --m 1"), 2);
    assert_true(output_contains("stderr.txt", "'64x48'"));
}

/* Files in dir whose names start with `prefix` (leftover temporary reports). */
static int files_starting_with(const char *prefix) { return tu_count_prefixed(dir, prefix); }

/* --json reports are written beside the target and renamed over it when complete: a run that
 * fails (scan of a missing checkpoint, probe of an unusable URL) leaves the previous report as
 * it was - before, it was left empty (scan) or deleted (probe) - and a complete one replaces it,
 * with the permissions fopen would give a new file and no temporary file left behind. */
static void test_report_replaced_only_when_complete(void **state)
{
    (void)state;
    static const char old[] = "{\"previous\": \"report\"}\n";
    const char *keep = path_of("keep.json");
    FILE *f = fopen(keep, "w");
    assert_non_null(f);
    fputs(old, f);
    fclose(f);

    assert_int_equal(run_cli("scan '%s' --json '%s'", path_of("no-such-checkpoint.safetensors"), keep), 3);
    char *now = tu_slurp(keep, NULL);
    assert_non_null(now);
    assert_string_equal(now, old);
    free(now);
    assert_int_not_equal(run_cli("probe 'ftp://127.0.0.1:1/v1' --json '%s'", keep), 0);
    now = tu_slurp(keep, NULL);
    assert_non_null(now);
    assert_string_equal(now, old);
    free(now);
    assert_int_equal(files_starting_with("keep.json.tmp-"), 0);

    /* a complete report replaces it */
    assert_int_equal(run_cli("bench --backend ref --shapes 32x64 --m 1 --no-moe --no-quantize --repeats 1 --json '%s'",
                             keep),
                     0);
    json_error_t err;
    json_t *root = json_load_file(keep, 0, &err);
    assert_non_null(root);
    assert_string_equal(json_string_value(json_object_get(root, "command")), "bench");
    json_decref(root);
    assert_int_equal(files_starting_with("keep.json.tmp-"), 0);

    /* a new report gets 0666 less the umask, as fopen would give it */
    const char *fresh = path_of("fresh.json");
    unlink(fresh);
    const mode_t mask = umask(022);
    assert_int_equal(run_cli("bench --backend ref --shapes 32x64 --m 1 --no-moe --no-quantize --repeats 1 --json '%s'",
                             fresh),
                     0);
    umask(mask);
    struct stat st;
    assert_int_equal(stat(fresh, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0644);

    /* a report that cannot be written completely is an error with a message, even on stdout */
    if (access("/dev/full", W_OK) == 0) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd,
                 "'%s' bench --backend ref --shapes 32x64 --m 1 --no-moe --no-quantize --repeats 1 --json - "
                 ">/dev/full 2>'%s'",
                 bin, path_of("stderr.txt"));
        const int rc = system(cmd);
        assert_true(WIFEXITED(rc));
        assert_int_equal(WEXITSTATUS(rc), 3);
        assert_true(output_contains("stderr.txt", "cannot write standard output"));
        /* a run that failed (exit 1) lost its verdicts in silence; said now, once, exit 1 kept */
        snprintf(cmd, sizeof cmd,
                 "'%s' check --include-faulty --backend ref,faulty-zeros --suite quick --case m1.n192 --no-cache "
                 ">/dev/full 2>'%s'",
                 bin, path_of("stderr.txt"));
        const int failed = system(cmd);
        assert_true(WIFEXITED(failed));
        assert_int_equal(WEXITSTATUS(failed), 1);
        char *err = tu_slurp(path_of("stderr.txt"), NULL);
        assert_non_null(err);
        const char *first = strstr(err, "cannot write standard output");
        assert_non_null(first);
        assert_null(strstr(first + 1, "cannot write standard output"));
        free(err);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantize_nvfp4_default),
        cmocka_unit_test(test_quantize_options),
        cmocka_unit_test(test_dequantize_round_trip),
        cmocka_unit_test(test_long_tensor_names),
        cmocka_unit_test(test_gemm_ref_and_verify),
        cmocka_unit_test(test_verify_tolerance),
        cmocka_unit_test(test_bad_input_exit_codes),
        cmocka_unit_test(test_bench_host_backends),
        cmocka_unit_test(test_report_replaced_only_when_complete),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
