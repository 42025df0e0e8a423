/*
 * quantize, dequantize, gemm and verify on files a user brings: large and many-tensor
 * checkpoints, metadata written by other tools, empty quantized tensors, an empty OUT, an OUT
 * that is the input under another name, a perturbed GEMM output. The built binary
 * ($FP4DOCTOR_BIN, set by ctest) runs as a user would run it; each test names the defect it
 * guards against.
 */
#include <dirent.h>
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

#include "fp4doctor/formats.h"
#include "fp4doctor/io.h"
#include "test_util.h"


static char dir[256];
static const char *bin;

#define path_of(name) tu_path_in(dir, (name))
/* "prefix 'bin' args" through the shell (prefix: e.g. a ulimit); output to files in dir */
#define run_with(prefix, ...) tu_run_cli(bin, dir, (prefix), __VA_ARGS__)
#define run_cli(...) run_with("", __VA_ARGS__)
#define output_contains(which, needle) tu_output_contains(dir, (which), (needle))

static int setup(void **state)
{
    (void)state;
    bin = tu_cli_binary();
    snprintf(dir, sizeof dir, "/tmp/fp4d_cli_files_XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    tu_remove_tree(dir);
    return 0;
}

/* One tensor per call of add(); saved to dir/name. */
static void save_file(fp4d_st_writer *w, const char *name, const char *meta_key, const char *meta_value)
{
    if (meta_key) assert_int_equal(fp4d_st_writer_set_metadata(w, meta_key, meta_value), FP4D_STATUS_OK);
    assert_int_equal(fp4d_st_writer_save(w, path_of(name)), FP4D_STATUS_OK);
    fp4d_st_writer_free(w);
}

/* A 4 x 32 F32 tensor "a" of values (i % period) - period / 2, saved to dir/name: an input
 * quantize takes. */
static void save_f32_input(const char *name, int period)
{
    float v[4 * 32];
    for (int i = 0; i < 4 * 32; i++) v[i] = (float)(i % period - period / 2);
    fp4d_st_writer *w = fp4d_st_writer_new();
    int64_t s[2] = {4, 32};
    assert_int_equal(fp4d_st_writer_add(w, "a", FP4D_ST_F32, 2, s, v, sizeof v), 0);
    save_file(w, name, NULL, NULL);
}

/* The data limit (KiB, `ulimit -d`) under which this fp4doctor starts at all: linked with the
 * CUDA libraries it needs 128-256 MiB for their writable segments before doing anything,
 * without them a few MiB. Found by bisection on `--version`, in 4 MiB steps. */
static long startup_data_kib(void)
{
    long lo = 0, hi = 1L << 21; /* 2 GiB starts on any build */
    while (hi - lo > 4096) {
        const long mid = (lo + hi) / 2;
        char prefix[64];
        snprintf(prefix, sizeof prefix, "ulimit -d %ld;", mid);
        if (run_with(prefix, "--version") == 0) hi = mid;
        else lo = mid;
    }
    return hi;
}

/* quantize kept an aligned copy of every source tensor until the output was saved, so a
 * checkpoint cost its own size again in memory. A 48 MiB F32 tensor with 32 MiB of data room
 * above what the binary needs to start (private writable memory; the read-only mapping of the
 * input does not count) failed with "out of memory" (exit 4); the output is 6.75 MiB. */
static void test_quantize_does_not_copy_the_checkpoint(void **state)
{
    (void)state;
    if (TU_SANITIZED) skip(); /* the sanitizer's shadow memory does not fit any data limit */
    enum { ROWS = 768, COLS = 16384 };
    float *x = malloc((size_t)ROWS * COLS * sizeof *x);
    assert_non_null(x);
    for (size_t i = 0; i < (size_t)ROWS * COLS; i++) x[i] = (float)((int)(i % 13) - 6) * 0.5f;
    fp4d_st_writer *w = fp4d_st_writer_new();
    int64_t shape[2] = {ROWS, COLS};
    assert_int_equal(fp4d_st_writer_add(w, "big.weight", FP4D_ST_F32, 2, shape, x, (uint64_t)ROWS * COLS * 4), 0);
    save_file(w, "big.safetensors", NULL, NULL);

    char limit[64];
    snprintf(limit, sizeof limit, "ulimit -d %ld;", startup_data_kib() + 32768);
    assert_int_equal(run_with(limit, "quantize '%s' '%s'", path_of("big.safetensors"), path_of("big_q.safetensors")), 0);
    fp4d_st_open_result res;
    fp4d_st_file *f = fp4d_st_open(path_of("big_q.safetensors"), &res);
    assert_non_null(f);
    const fp4d_st_tensor *t = fp4d_st_find(f, "big.weight");
    assert_non_null(t);
    assert_int_equal(t->dtype, FP4D_ST_U8);
    /* the codes are those of the library on the same data */
    fp4d_quantize_params qp = {FP4D_DTYPE_NVFP4, FP4D_CONV_FLASHINFER_EXACT, FP4D_LAYOUT_LINEAR, 0.0f};
    uint8_t *codes = malloc((size_t)ROWS * COLS / 2), *scales = malloc((size_t)ROWS * COLS / 16);
    assert_int_equal(fp4d_quantize(&qp, FP4D_DTYPE_F32, x, ROWS, COLS, codes, scales, NULL), FP4D_STATUS_OK);
    assert_memory_equal(t->data, codes, (size_t)ROWS * COLS / 2);
    assert_memory_equal(fp4d_st_find(f, "big.weight_scale")->data, scales, (size_t)ROWS * COLS / 16);
    fp4d_st_close(f);
    free(codes);
    free(scales);
    free(x);
    unlink(path_of("big.safetensors"));
    unlink(path_of("big_q.safetensors"));
}

/* Many tensors through quantize: every one comes out with its scales, and the writer (which
 * now finds names in a hash, where it compared each new name with every earlier one) still
 * refuses a duplicate. Its speed with the count is a benchmark's business
 * (bench/bench_writer.c: 30,000 tensors took 112 s before). */
static void test_quantize_many_tensors(void **state)
{
    (void)state;
    enum { N = 3000 };
    static float v[16];
    for (int i = 0; i < 16; i++) v[i] = (float)(i - 8);
    fp4d_st_writer *w = fp4d_st_writer_new();
    int64_t shape[2] = {1, 16};
    for (int i = 0; i < N; i++) {
        char name[64];
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.w", i / 1000, i % 1000);
        assert_int_equal(fp4d_st_writer_add(w, name, FP4D_ST_F32, 2, shape, v, sizeof v), 0);
    }
    save_file(w, "many.safetensors", "format", "pt");

    assert_int_equal(run_cli("quantize '%s' '%s'", path_of("many.safetensors"), path_of("many_q.safetensors")), 0);
    assert_true(output_contains("stdout.txt", "quantized 3000 tensors"));
    fp4d_st_open_result res;
    fp4d_st_file *f = fp4d_st_open(path_of("many_q.safetensors"), &res);
    assert_non_null(f);
    assert_int_equal(fp4d_st_count(f), 3 * N);
    assert_non_null(fp4d_st_find(f, "model.layers.2.mlp.experts.999.w_scale_2"));
    assert_string_equal(fp4d_st_metadata(f, "format"), "pt");
    fp4d_st_close(f);
    /* the writer still refuses a duplicate name */
    w = fp4d_st_writer_new();
    assert_int_equal(fp4d_st_writer_add(w, "a", FP4D_ST_F32, 2, shape, v, sizeof v), 0);
    assert_int_equal(fp4d_st_writer_add(w, "b", FP4D_ST_F32, 2, shape, v, sizeof v), 0);
    assert_int_equal(fp4d_st_writer_add(w, "a", FP4D_ST_F32, 2, shape, v, sizeof v), FP4D_STATUS_INVALID_ARG);
    fp4d_st_writer_free(w);
    unlink(path_of("many.safetensors"));
    unlink(path_of("many_q.safetensors"));
}

/* Format names compare case-insensitively everywhere (--format NVFP4 works), but U8 block
 * scales with "fp4doctor.format.w": "NVFP4" were taken as MXFP4 unless their shape was the
 * linear [rows, K/16], and then refused as contradicting the metadata (exit 3): so swizzled
 * NVFP4 scales stored as U8 (a padded [128, 4]) could not be read. */
static void test_metadata_format_name_any_case(void **state)
{
    (void)state;
    enum { ROWS = 2, K = 32 };
    uint8_t codes[ROWS * K / 2], scales[128 * 4] = {0};
    for (int i = 0; i < ROWS * K / 2; i++) codes[i] = (uint8_t)(i * 37);
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < K / 16; c++)
            scales[fp4d_scale_offset(FP4D_LAYOUT_SWIZZLED_128X4, ROWS, K / 16, r, c)] = (uint8_t)(0x30 + 2 * r + c);
    fp4d_st_writer *w = fp4d_st_writer_new();
    int64_t sc[2] = {ROWS, K / 2}, ss[2] = {128, 4};
    assert_int_equal(fp4d_st_writer_add(w, "w", FP4D_ST_U8, 2, sc, codes, sizeof codes), 0);
    assert_int_equal(fp4d_st_writer_add(w, "w_scale", FP4D_ST_U8, 2, ss, scales, sizeof scales), 0);
    assert_int_equal(fp4d_st_writer_set_metadata(w, "fp4doctor.scale_layout.w", "swizzled"), 0);
    save_file(w, "upper.safetensors", "fp4doctor.format.w", "NVFP4");

    assert_int_equal(run_cli("dequantize '%s' '%s'", path_of("upper.safetensors"), path_of("upper_d.safetensors")), 0);
    float want[ROWS * K];
    assert_int_equal(fp4d_dequantize(FP4D_DTYPE_NVFP4, FP4D_LAYOUT_SWIZZLED_128X4, codes, scales, 1.0f, ROWS, K, want),
                     FP4D_STATUS_OK);
    fp4d_st_open_result res;
    fp4d_st_file *f = fp4d_st_open(path_of("upper_d.safetensors"), &res);
    assert_non_null(f);
    const fp4d_st_tensor *t = fp4d_st_find(f, "w");
    assert_non_null(t);
    assert_int_equal(t->dtype, FP4D_ST_F32);
    assert_int_equal(t->shape[1], K);
    assert_memory_equal(t->data, want, sizeof want);
    fp4d_st_close(f);
}

/* An empty quantized tensor was reported as "must be 2-D ... has 2 dimensions". */
static void test_empty_quantized_tensor_message(void **state)
{
    (void)state;
    fp4d_st_writer *w = fp4d_st_writer_new();
    int64_t sc[2] = {0, 8}, ss[2] = {0, 1};
    assert_int_equal(fp4d_st_writer_add(w, "w", FP4D_ST_U8, 2, sc, NULL, 0), 0);
    assert_int_equal(fp4d_st_writer_add(w, "w_scale", FP4D_ST_F8_E4M3, 2, ss, NULL, 0), 0);
    save_file(w, "empty_q.safetensors", NULL, NULL);
    assert_int_equal(run_cli("dequantize '%s' '%s'", path_of("empty_q.safetensors"), path_of("x.safetensors")), 3);
    assert_true(output_contains("stderr.txt", "'w' is empty ([0, 8])"));
    assert_int_equal(access(path_of("x.safetensors"), F_OK), -1);
}

/* An empty OUT is a usage error (exit 2) with a message saying so, not the writer's
 * "NULL writer or empty path" and exit 3. */
static void test_empty_out_is_usage_error(void **state)
{
    (void)state;
    save_f32_input("e_in.safetensors", 7);
    assert_int_equal(run_cli("quantize '%s' '%s'", path_of("e_in.safetensors"), path_of("e_q.safetensors")), 0);

    assert_int_equal(run_cli("quantize '%s' ''", path_of("e_in.safetensors")), 2);
    assert_true(output_contains("stderr.txt", "OUT is an empty path"));
    assert_int_equal(run_cli("dequantize '%s' ''", path_of("e_q.safetensors")), 2);
    assert_true(output_contains("stderr.txt", "OUT is an empty path"));
    assert_int_equal(run_cli("gemm '%s:a' '%s:a' ''", path_of("e_in.safetensors"), path_of("e_q.safetensors")), 2);
    assert_true(output_contains("stderr.txt", "OUT is an empty path"));
}

/* OUT naming IN through a symbolic link or a second hard link is refused and IN is intact;
 * a perturbed GEMM output fails verify with exit 1 and says where. (Guards, not fixes.) */
static void test_out_is_in_and_perturbed_verify(void **state)
{
    (void)state;
    float a[3 * 32], b[5 * 32];
    for (int i = 0; i < 3 * 32; i++) a[i] = (float)((i * 7) % 11) * 0.25f - 1.0f;
    for (int i = 0; i < 5 * 32; i++) b[i] = (float)((i * 5) % 13) * 0.5f - 3.0f;
    fp4d_st_writer *w = fp4d_st_writer_new();
    int64_t sa[2] = {3, 32}, sb[2] = {5, 32};
    assert_int_equal(fp4d_st_writer_add(w, "a", FP4D_ST_F32, 2, sa, a, sizeof a), 0);
    assert_int_equal(fp4d_st_writer_add(w, "b", FP4D_ST_F32, 2, sb, b, sizeof b), 0);
    save_file(w, "o_in.safetensors", "note", "kept");
    size_t in_len;
    char *before = tu_slurp(path_of("o_in.safetensors"), &in_len);
    assert_int_equal(symlink(path_of("o_in.safetensors"), path_of("o_link.safetensors")), 0);
    assert_int_equal(link(path_of("o_in.safetensors"), path_of("o_hard.safetensors")), 0);
    assert_int_equal(run_cli("quantize '%s' '%s'", path_of("o_in.safetensors"), path_of("o_link.safetensors")), 2);
    assert_int_equal(run_cli("quantize '%s' '%s'", path_of("o_in.safetensors"), path_of("o_hard.safetensors")), 2);
    size_t now_len;
    char *now = tu_slurp(path_of("o_in.safetensors"), &now_len);
    assert_int_equal(now_len, in_len);
    assert_memory_equal(now, before, in_len);
    free(now);
    free(before);

    assert_int_equal(run_cli("quantize --tensor b '%s' '%s'", path_of("o_in.safetensors"), path_of("o_q.safetensors")),
                     0);
    assert_int_equal(run_cli("gemm --out-dtype bf16 '%s:a' '%s:b' '%s'", path_of("o_in.safetensors"),
                             path_of("o_q.safetensors"), path_of("o_out.safetensors")),
                     0);
    assert_int_equal(run_cli("verify '%s:a' '%s:b' '%s:out'", path_of("o_in.safetensors"), path_of("o_q.safetensors"),
                             path_of("o_out.safetensors")),
                     0);
    /* one element one bf16 step up */
    fp4d_st_open_result res;
    fp4d_st_file *f = fp4d_st_open(path_of("o_out.safetensors"), &res);
    assert_non_null(f);
    const fp4d_st_tensor *t = fp4d_st_find(f, "out");
    uint16_t out[15];
    assert_int_equal(t->nbytes, sizeof out);
    memcpy(out, t->data, sizeof out);
    fp4d_st_close(f);
    out[7]++;
    w = fp4d_st_writer_new();
    int64_t so[2] = {3, 5};
    assert_int_equal(fp4d_st_writer_add(w, "out", FP4D_ST_BF16, 2, so, out, sizeof out), 0);
    save_file(w, "o_bad.safetensors", NULL, NULL);
    assert_int_equal(run_cli("verify '%s:a' '%s:b' '%s:out'", path_of("o_in.safetensors"), path_of("o_q.safetensors"),
                             path_of("o_bad.safetensors")),
                     1);
    assert_true(output_contains("stdout.txt", "verify: FAIL: 1 of 15 elements"));
    assert_true(output_contains("stdout.txt", "max error 1 ulps at [1, 2]"));
}

static mode_t mode_of(const char *path)
{
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    return sb.st_mode & 07777;
}

/* quantize's OUT (the safetensors writer's output, as dequantize's and gemm's) gets what a
 * report file gets (cli_open_output): 0666 less the umask when new, its own permissions when it
 * exists, and a read-only OUT is refused (exit 3) and left as it was. Every OUT was 0644: under
 * umask 077 too, an 0600 OUT became world-readable, and a 0444 OUT, even another user's, was
 * replaced with exit 0 (renaming needs only the folder writable). Root may write anything,
 * so as root that last run is made as nobody, with the folder opened to all for the while. */
static void test_out_permissions(void **state)
{
    (void)state;
    save_f32_input("p_in.safetensors", 5);
    assert_int_equal(chmod(path_of("p_in.safetensors"), 0644), 0);
    char in[512], out[512];
    snprintf(in, sizeof in, "%s", path_of("p_in.safetensors"));
    snprintf(out, sizeof out, "%s", path_of("p_out.safetensors"));

    assert_int_equal(run_with("umask 077;", "quantize '%s' '%s'", in, out), 0);
    assert_int_equal(mode_of(out), 0600);
    assert_int_equal(run_with("umask 022;", "quantize '%s' '%s'", in, out), 0);
    assert_int_equal(mode_of(out), 0600);
    assert_int_equal(run_with("umask 022;", "dequantize '%s' '%s'", out, path_of("p_deq.safetensors")), 0);
    assert_int_equal(mode_of(path_of("p_deq.safetensors")), 0644);

    assert_int_equal(chmod(out, 0444), 0);
    size_t before_len = 0, after_len = 0;
    char *before = tu_slurp(out, &before_len);
    assert_non_null(before);
    int rc;
    if (geteuid() != 0) {
        rc = run_cli("quantize '%s' '%s'", in, out);
    } else {
        struct stat ds;
        assert_int_equal(stat(dir, &ds), 0);
        assert_int_equal(chmod(dir, 0777), 0);
        unlink(path_of("stdout.txt")); /* root's: nobody's shell could not redirect into them */
        unlink(path_of("stderr.txt"));
        const pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            if (setgid(65534) != 0 || setuid(65534) != 0) _exit(77);
            _exit(run_cli("quantize '%s' '%s'", in, out));
        }
        int ws = 0;
        assert_int_equal(waitpid(pid, &ws, 0), pid);
        assert_int_equal(chmod(dir, ds.st_mode & 07777), 0);
        assert_true(WIFEXITED(ws));
        rc = WEXITSTATUS(ws);
        if (rc == 77) {
            free(before);
            skip(); /* cannot become another user here */
        }
    }
    assert_int_equal(rc, 3);
    assert_true(output_contains("stderr.txt", "cannot write"));
    char *after = tu_slurp(out, &after_len);
    assert_non_null(after);
    assert_int_equal(after_len, before_len);
    assert_memory_equal(after, before, before_len);
    assert_int_equal(mode_of(out), 0444);
    free(after);
    free(before);
    /* no temporary file left beside it */
    DIR *d = opendir(dir);
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d));)
        if (strstr(e->d_name, ".tmp-")) fail_msg("left behind: %s", e->d_name);
    closedir(d);
}

/* A replaced output keeps its permission bits (0777) and nothing more: the set-user-ID,
 * set-group-ID and sticky bits are not carried to the file that replaces it. Report files
 * (cli_open_output) kept all of 07777, so a report written over a 06755 file came back
 * set-id, while the safetensors writer (quantize's OUT) kept only 0777: one rule for both. */
static void test_out_set_id_bits_not_kept(void **state)
{
    (void)state;
    save_f32_input("sid_in.safetensors", 7);
    char in[512], report[512], out[512];
    snprintf(in, sizeof in, "%s", path_of("sid_in.safetensors"));
    snprintf(report, sizeof report, "%s", path_of("sid_report.json"));
    snprintf(out, sizeof out, "%s", path_of("sid_out.safetensors"));
    static const mode_t before[] = {06755, 04750, 01777, 02640};
    for (size_t i = 0; i < sizeof before / sizeof *before; i++) {
        FILE *f = fopen(report, "w");
        assert_non_null(f);
        assert_int_equal(fclose(f), 0);
        assert_int_equal(chmod(report, before[i]), 0);
        assert_int_equal(mode_of(report), before[i]);
        assert_int_equal(run_with("umask 077;", "scan '%s' --json '%s'", in, report), 0);
        assert_int_equal(mode_of(report), before[i] & 0777);
        struct stat sb;
        assert_int_equal(stat(report, &sb), 0);
        assert_true(sb.st_size > 0); /* the report was written, not the empty file left */

        assert_int_equal(run_cli("quantize '%s' '%s'", in, out), 0);
        assert_int_equal(chmod(out, before[i]), 0);
        assert_int_equal(run_with("umask 077;", "quantize '%s' '%s'", in, out), 0);
        assert_int_equal(mode_of(out), before[i] & 0777);
        assert_int_equal(unlink(out), 0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantize_does_not_copy_the_checkpoint),
        cmocka_unit_test(test_quantize_many_tensors),
        cmocka_unit_test(test_metadata_format_name_any_case),
        cmocka_unit_test(test_empty_quantized_tensor_message),
        cmocka_unit_test(test_empty_out_is_usage_error),
        cmocka_unit_test(test_out_is_in_and_perturbed_verify),
        cmocka_unit_test(test_out_permissions),
        cmocka_unit_test(test_out_set_id_bits_not_kept),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
