/*
 * test_scan_malformed.c - hand-made broken safetensors files and checkpoint folders: each
 * yields the documented finding (or a clear error), never a crash. Run under `make asan` it
 * also shows no read out of bounds.
 */
#include <errno.h>
#include <ftw.h>
#include <stdbool.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "fp4doctor/scan.h"
#include "scan_test_util.h"

static char *tmpdir;

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

static int setup(void **s)
{
    (void)s;
    char tmpl[] = "/tmp/fp4d-test-malformed-XXXXXX";
    tmpdir = strdup(mkdtemp(tmpl));
    return tmpdir ? 0 : -1;
}

static int teardown(void **s)
{
    (void)s;
    nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    free(tmpdir);
    return 0;
}

/* Writes 8-byte length (header_len_field, or the real length when ~0) + header + data_len
 * bytes of 0x11, then cuts the file to total_len when total_len != ~0. */
static char *write_st(const char *name, const char *header, uint64_t header_len_field, size_t data_len, uint64_t total_len)
{
    static char path[8400];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint64_t n = header_len_field == ~0ull ? strlen(header) : header_len_field;
    for (int i = 0; i < 8; i++) fputc((int)((n >> (8 * i)) & 0xFF), f);
    fwrite(header, 1, strlen(header), f);
    for (size_t i = 0; i < data_len; i++) fputc(0x11, f);
    fclose(f);
    if (total_len != ~0ull) assert_int_equal(truncate(path, (off_t)total_len), 0);
    return path;
}

static fp4d_scan_report *scan_one(const char *path)
{
    fp4d_scan_report *r = NULL;
    fp4d_status st = fp4d_scan_path(path, NULL, &r);
    if (st != FP4D_STATUS_OK) print_message("scan: %s\n", fp4d_last_error());
    assert_int_equal(st, FP4D_STATUS_OK);
    return r;
}

static void assert_single(const fp4d_scan_report *r, fp4d_finding_code code, const char *tensor, uint64_t count)
{
    for (size_t i = 0; i < fp4d_scan_report_count(r); i++) {
        const fp4d_scan_finding *f = fp4d_scan_report_get(r, i);
        print_message("  %s %s count=%llu: %s\n", fp4d_finding_code_name(f->code), f->tensor ? f->tensor : "-",
                      (unsigned long long)f->count, f->message);
    }
    assert_int_equal(fp4d_scan_report_count(r), 1);
    const fp4d_scan_finding *f = fp4d_scan_report_get(r, 0);
    assert_int_equal(f->code, code);
    if (tensor) assert_string_equal(f->tensor, tensor);
    else assert_null(f->tensor);
    assert_int_equal(f->count, count);
    assert_int_equal(f->severity, FP4D_SCAN_ERROR);
}

#define H2(a, b) "{\"a\":{\"dtype\":\"F32\",\"shape\":[2]," a "},\"b\":{\"dtype\":\"F32\",\"shape\":[2]," b "}}"

static void test_header_rules(void **s)
{
    (void)s;
    fp4d_scan_report *r;
    const char *good = H2("\"data_offsets\":[0,8]", "\"data_offsets\":[8,16]");
    r = scan_one(write_st("good.safetensors", good, ~0ull, 16, ~0ull));
    assert_int_equal(fp4d_scan_report_count(r), 0);
    fp4d_scan_report_free(r);

    /* Shorter than the length field: truncated. */
    r = scan_one(write_st("tiny.safetensors", "", ~0ull, 0, 3));
    assert_single(r, FP4D_FINDING_FILE_TRUNCATED, NULL, 0);
    fp4d_scan_report_free(r);
    /* Header over the library's 100 MB limit. */
    r = scan_one(write_st("huge.safetensors", good, 100000001ull, 16, ~0ull));
    assert_single(r, FP4D_FINDING_HEADER_INVALID, NULL, 1);
    fp4d_scan_report_free(r);
    /* Length field past the end, the whole header present: a wrong length, not a cut file. */
    r = scan_one(write_st("pastend.safetensors", good, 4096, 16, ~0ull));
    assert_single(r, FP4D_FINDING_HEADER_INVALID, NULL, 1);
    fp4d_scan_report_free(r);
    /* File cut inside the header. */
    r = scan_one(write_st("cuthdr.safetensors", good, ~0ull, 16, 8 + 20));
    assert_single(r, FP4D_FINDING_FILE_TRUNCATED, NULL, 0);
    fp4d_scan_report_free(r);
    /* File cut inside tensor b's data: b is lost, a is fine. */
    r = scan_one(write_st("cutdata.safetensors", good, ~0ull, 16, 8 + strlen(good) + 12));
    assert_single(r, FP4D_FINDING_FILE_TRUNCATED, "b", 1);
    fp4d_scan_report_free(r);
    /* Trailing bytes. */
    r = scan_one(write_st("trailing.safetensors", good, ~0ull, 17, ~0ull));
    assert_single(r, FP4D_FINDING_HEADER_INVALID, NULL, 1);
    fp4d_scan_report_free(r);
    /* Overlapping and gapped offsets name the tensor where the walk breaks. */
    r = scan_one(write_st("overlap.safetensors", H2("\"data_offsets\":[0,8]", "\"data_offsets\":[4,12]"), ~0ull, 12, ~0ull));
    assert_single(r, FP4D_FINDING_HEADER_INVALID, "b", 1);
    fp4d_scan_report_free(r);
    r = scan_one(write_st("gap.safetensors", H2("\"data_offsets\":[0,8]", "\"data_offsets\":[12,20]"), ~0ull, 20, ~0ull));
    assert_single(r, FP4D_FINDING_HEADER_INVALID, "b", 1);
    fp4d_scan_report_free(r);
    /* A shape whose product overflows 64 bits. */
    const char *ovf = "{\"a\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,0]}}";
    r = scan_one(write_st("overflow.safetensors", ovf, ~0ull, 0, ~0ull));
    assert_single(r, FP4D_FINDING_HEADER_INVALID, "a", 1);
    fp4d_scan_report_free(r);
    /* A dtype the library does not know (there is no F8_E4M3FN string). */
    const char *dt = "{\"w\":{\"dtype\":\"F8_E4M3FN\",\"shape\":[4],\"data_offsets\":[0,4]}}";
    r = scan_one(write_st("dtype.safetensors", dt, ~0ull, 4, ~0ull));
    assert_single(r, FP4D_FINDING_HEADER_INVALID, "w", 1);
    fp4d_scan_report_free(r);
    /* Invalid UTF-8. */
    const char *utf = "{\"\xff\xfe\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}";
    r = scan_one(write_st("utf8.safetensors", utf, ~0ull, 4, ~0ull));
    assert_single(r, FP4D_FINDING_HEADER_INVALID, NULL, 1);
    fp4d_scan_report_free(r);
    /* A duplicate key: the library keeps one of them silently. */
    const char *dup = "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                      "\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,8]}}";
    r = scan_one(write_st("dup.safetensors", dup, ~0ull, 8, ~0ull));
    assert_single(r, FP4D_FINDING_DUPLICATE_TENSOR, "a", 2);
    fp4d_scan_report_free(r);
    /* NaN/Inf in an f32 tensor of an otherwise valid file. */
    const char *nan = "{\"n\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}";
    char *p = write_st("nan.safetensors", nan, ~0ull, 0, ~0ull);
    FILE *f = fopen(p, "ab");
    float v[4] = {1.0f, 0.0f / 0.0f, 2.0f, 1.0f / 0.0f};
    fwrite(v, 4, 4, f);
    fclose(f);
    r = scan_one(p);
    assert_single(r, FP4D_FINDING_NONFINITE_VALUES, "n", 2);
    fp4d_scan_report_free(r);
}

/* Packed codes typed F4 hold half the bytes of the U8 [rows, K/2] they stand for: a
 * DTYPE_MISMATCH finding, and their values are not read (they were read past the tensor - here
 * the file's - end, and the scan failed with a read error). */
static void test_codes_typed_f4(void **s)
{
    (void)s;
    const char *h = "{\"m.weight_scale\":{\"dtype\":\"F8_E4M3\",\"shape\":[4,2],\"data_offsets\":[0,8]},"
                    "\"m.weight_scale_2\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[8,12]},"
                    "\"m.weight\":{\"dtype\":\"F4\",\"shape\":[4,16],\"data_offsets\":[12,44]}}";
    fp4d_scan_report *r = scan_one(write_st("f4codes.safetensors", h, ~0ull, 44, ~0ull));
    bool mismatch = false;
    for (size_t i = 0; i < fp4d_scan_report_count(r); i++) {
        const fp4d_scan_finding *f = fp4d_scan_report_get(r, i);
        mismatch |= f->code == FP4D_FINDING_DTYPE_MISMATCH && f->tensor && !strcmp(f->tensor, "m.weight");
    }
    assert_true(mismatch);
    fp4d_scan_report_free(r);
}

/* True when s is well-formed UTF-8 with no C0/C1 control characters or DEL. */
static bool printable_utf8(const char *s)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; u[i];) {
        size_t k = u[i] < 0x80 ? 1 : (u[i] & 0xE0) == 0xC0 ? 2 : (u[i] & 0xF0) == 0xE0 ? 3 : (u[i] & 0xF8) == 0xF0 ? 4 : 0;
        if (!k || u[i] < 0x20 || u[i] == 0x7F || (u[i] == 0xC2 && u[i + 1] <= 0x9F)) return false;
        for (size_t j = 1; j < k; j++)
            if ((u[i + j] & 0xC0) != 0x80) return false;
        i += k;
    }
    return true;
}

/* Finding messages quote the checkpoint's names: a name carrying a terminal escape sequence
 * must not reach the terminal as one, and a message cut at its 1 KB limit must not end inside
 * a UTF-8 character (the JSON writer then dropped the whole message). */
static void test_hostile_names_in_messages(void **s)
{
    (void)s;
    char header[8192];
    char longname[1400] = "";
    for (int i = 0; i < 600; i++) strcat(longname, "\xc3\xa9"); /* é x 600: 1200 bytes */
    snprintf(header, sizeof header,
             "{\"x\\u001b]0;pwned\\u0007\\u001b[2J.weight_scale_2\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
             "\"%s.weight_scale_2\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[4,8]}}",
             longname);
    fp4d_scan_report *r = scan_one(write_st("hostile.safetensors", header, ~0ull, 8, ~0ull));
    assert_true(fp4d_scan_report_count(r) >= 2);
    for (size_t i = 0; i < fp4d_scan_report_count(r); i++) {
        const fp4d_scan_finding *f = fp4d_scan_report_get(r, i);
        if (!printable_utf8(f->message)) fail_msg("finding %zu message not printable UTF-8: %s", i, f->message);
    }
    fp4d_scan_report_free(r);
}

/* More shards than the process may open files: a limit of this process (NOMEM, exit 4), not a
 * HEADER_INVALID finding on every shard past the limit, which blamed the checkpoint. */
static void test_descriptor_limit_is_not_a_finding(void **s)
{
    (void)s;
    char folder[600], name[700], index[8192] = "{\"metadata\":{},\"weight_map\":{";
    snprintf(folder, sizeof folder, "%s/many", tmpdir);
    assert_int_equal(mkdir(folder, 0755), 0);
    for (int i = 0; i < 30; i++) {
        char hdr[200];
        snprintf(hdr, sizeof hdr, "{\"t%d\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", i);
        snprintf(name, sizeof name, "many/model-%05d-of-00030.safetensors", i + 1);
        write_st(name, hdr, ~0ull, 4, ~0ull);
        snprintf(index + strlen(index), sizeof index - strlen(index), "%s\"t%d\":\"model-%05d-of-00030.safetensors\"",
                 i ? "," : "", i, i + 1);
    }
    strcat(index, "}}");
    snprintf(name, sizeof name, "%s/model.safetensors.index.json", folder);
    FILE *f = fopen(name, "w");
    assert_non_null(f);
    fputs(index, f);
    fclose(f);
    fp4d_scan_report *r = scan_one(folder); /* within the limit: scans, no finding */
    assert_int_equal(fp4d_scan_report_count(r), 0);
    fp4d_scan_report_free(r);
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        const struct rlimit lim = {16, 16};
        fp4d_scan_report *rep = NULL;
        if (setrlimit(RLIMIT_NOFILE, &lim) != 0) _exit(3);
        _exit(fp4d_scan_path(folder, NULL, &rep) == FP4D_STATUS_NOMEM ? 0 : 1);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

/* Writes text as DIR/name. */
static char *write_text(const char *name, const char *text)
{
    static char path[8400];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

/* A file that is not a checkpoint at all is unreadable input (exit 3), not a damaged
 * checkpoint: it used to be scanned as one (HEADER_INVALID or FILE_TRUNCATED, exit 1), blaming
 * the user's weights for a wrong path. A .safetensors file that is damaged is still a finding,
 * and a valid safetensors file is scanned whatever its name. */
static void test_not_a_checkpoint_file(void **s)
{
    (void)s;
    static const char readme[] = "# my model\n\nNVFP4 weights, see config.json for details.\n";
    static const char *const not_ckpt[][2] = {
        {"README.md", readme},
        {"config.json", "{\"hidden_size\": 64, \"quantization_config\": {\"quant_method\": \"modelopt\"}}"},
        {"notes.txt", "hi\n"},                   /* shorter than a length field */
        {"model.gguf", "GGUF\x03\x00\x00\x00\x10"}, /* another format's magic */
    };
    for (size_t i = 0; i < sizeof not_ckpt / sizeof not_ckpt[0]; i++) {
        char *p = write_text(not_ckpt[i][0], not_ckpt[i][1]);
        fp4d_scan_report *r = NULL;
        fp4d_status st = fp4d_scan_path(p, NULL, &r);
        if (st == FP4D_STATUS_OK) print_message("%s was scanned as a checkpoint\n", not_ckpt[i][0]);
        assert_int_equal(st, FP4D_STATUS_IO);
        assert_null(r);
        assert_non_null(strstr(fp4d_last_error(), "not a safetensors file"));
    }
    /* The same bytes under a checkpoint's name: a damaged checkpoint file, reported. */
    fp4d_scan_report *r = scan_one(write_text("readme.safetensors", readme));
    assert_single(r, FP4D_FINDING_HEADER_INVALID, NULL, 1);
    fp4d_scan_report_free(r);
    r = scan_one(write_text("short.safetensors", "hi\n"));
    assert_single(r, FP4D_FINDING_FILE_TRUNCATED, NULL, 0);
    fp4d_scan_report_free(r);
    /* A safetensors file under another name, valid or damaged after its first bytes: scanned. */
    const char *good = H2("\"data_offsets\":[0,8]", "\"data_offsets\":[8,16]");
    r = scan_one(write_st("weights.bin", good, ~0ull, 16, ~0ull));
    assert_int_equal(fp4d_scan_report_count(r), 0);
    fp4d_scan_report_free(r);
    r = scan_one(write_st("cut.bin", good, ~0ull, 16, 8 + strlen(good) + 12));
    assert_single(r, FP4D_FINDING_FILE_TRUNCATED, "b", 1);
    fp4d_scan_report_free(r);
    /* And the CLI says so with exit 3. */
    const char *bin = getenv("FP4DOCTOR_BIN");
    if (bin) {
        char cmd[9000];
        snprintf(cmd, sizeof cmd, "%s scan %s/README.md >/dev/null 2>&1", bin, tmpdir);
        int rc = system(cmd);
        assert_true(WIFEXITED(rc));
        assert_int_equal(WEXITSTATUS(rc), 3);
    }
}

/* Scale shapes that disagree with the packed weight: the message names the whole expected
 * shape (it spoke of "N scale columns" also when only the rows differed), and recognises the
 * padded 128x4-swizzled layout (spec §6), which is a kernel's buffer, not a checkpoint's. */
static void test_scale_shape_messages(void **s)
{
    (void)s;
    static const struct {
        const char *scale_shape; /* JSON shape of m.weight_scale */
        unsigned    bytes;
        const char *want;        /* in the message */
    } cases[] = {
        {"[128,4]", 512, "swizzled"},   /* 100 rows padded to 128 */
        {"[512]", 512, "swizzled"},     /* the same buffer, flat */
        {"[100,8]", 800, "implies [100, 4]"},
        {"[50,4]", 200, "implies [100, 4]"},
        {"[100,4,1]", 400, "implies [100, 4]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char h[600], name[64];
        snprintf(h, sizeof h,
                 "{\"m.weight\":{\"dtype\":\"U8\",\"shape\":[100,32],\"data_offsets\":[0,3200]},"
                 "\"m.weight_scale\":{\"dtype\":\"F8_E4M3\",\"shape\":%s,\"data_offsets\":[3200,%u]},"
                 "\"m.weight_scale_2\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[%u,%u]}}",
                 cases[i].scale_shape, 3200 + cases[i].bytes, 3200 + cases[i].bytes, 3204 + cases[i].bytes);
        snprintf(name, sizeof name, "shape%zu.safetensors", i);
        char *p = write_st(name, h, ~0ull, 0, ~0ull);
        /* codes and scales 0x11 (finite), weight_scale_2 = 0.001 */
        FILE *f = fopen(p, "ab");
        assert_non_null(f);
        for (unsigned b = 0; b < 3200 + cases[i].bytes; b++) fputc(0x11, f);
        const float g = 0.001f;
        fwrite(&g, 4, 1, f);
        fclose(f);
        fp4d_scan_report *r = scan_one(p);
        assert_single(r, FP4D_FINDING_SHAPE_MISMATCH, "m.weight_scale", 1);
        const char *msg = fp4d_scan_report_get(r, 0)->message;
        if (!strstr(msg, cases[i].want)) fail_msg("shape %s: '%s' not in: %s", cases[i].scale_shape, cases[i].want, msg);
        if (strcmp(cases[i].want, "swizzled") && strstr(msg, "swizzled")) fail_msg("not swizzled: %s", msg);
        fp4d_scan_report_free(r);
    }
}

static void assert_contains(const char *msg, const char *needle)
{
    if (!strstr(msg, needle)) fail_msg("'%s' not in: %s", needle, msg);
}

static void test_folders(void **s)
{
    (void)s;
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s/ckpt", tmpdir);
    mkdir(dir, 0755);
    fp4d_scan_report *r = NULL;
    /* An empty folder cannot be scanned at all. */
    assert_int_equal(fp4d_scan_path(dir, NULL, &r), FP4D_STATUS_NOT_FOUND);
    assert_null(r);
    assert_int_equal(fp4d_scan_path("/nonexistent/fp4doctor", NULL, &r), FP4D_STATUS_NOT_FOUND);
    /* A file given alone that cannot be opened: IO (exit 3) with the system's reason, whatever
     * its name; it was a HEADER_INVALID finding, or "not a safetensors file". Root opens a
     * mode-000 file, so only other users can see this. */
    if (geteuid() != 0) {
        static const char *const names[] = {"locked.safetensors", "locked.bin"};
        for (size_t i = 0; i < 2; i++) {
            char locked[4200];
            snprintf(locked, sizeof locked, "%s/%s", tmpdir, names[i]);
            FILE *lf = fopen(locked, "w");
            assert_non_null(lf);
            assert_int_equal(fclose(lf), 0);
            assert_int_equal(chmod(locked, 0), 0);
            assert_int_equal(fp4d_scan_path(locked, NULL, &r), FP4D_STATUS_IO);
            assert_null(r);
            assert_contains(fp4d_last_error(), strerror(EACCES));
            assert_int_equal(unlink(locked), 0);
        }
    }
    /* An index that names files that are not there. */
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"metadata\":{},\"weight_map\":{\"x\":\"gone-1.safetensors\",\"y\":\"gone-1.safetensors\","
          "\"z\":\"gone-2.safetensors\"}}", f);
    fclose(f);
    r = scan_one(dir);
    assert_int_equal(fp4d_scan_report_count(r), 2);
    for (size_t i = 0; i < 2; i++) {
        const fp4d_scan_finding *fd = fp4d_scan_report_get(r, i);
        assert_int_equal(fd->code, FP4D_FINDING_INDEX_MISSING_FILE);
        assert_null(fd->tensor);
        assert_int_equal(fd->count, !strcmp(fd->file, "gone-1.safetensors") ? 2 : 1);
    }
    fp4d_scan_report_free(r);
    /* An index pointing outside the folder is refused, not followed; an index that cannot be
     * used says why: where the JSON breaks, or which entry is not a shard file name. */
    static const char *const bad_index[][2] = {
        {"{\"weight_map\":{\"x\":\"../../etc/passwd\"}}",
         "(needs a \"weight_map\" of tensor -> shard file name; \"x\" maps to \"../../etc/passwd\", not a file name"},
        {"{\"weight_map\":{\"a\":\"m.safetensors\",\"y\":7}}", "\"y\" maps to a non-string"},
        {"{\"metadata\":{}}", "it has no \"weight_map\")"},
        {"{\"weight_map\":[]}", "it has a \"weight_map\" that is not an object)"},
        {"{\"weight_map\":\n{\"x\" \"y\"}}", "(not JSON: "},
    };
    char index_path[sizeof path];
    snprintf(index_path, sizeof index_path, "%s", path);
    const char *good = H2("\"data_offsets\":[0,8]", "\"data_offsets\":[8,16]");
    snprintf(path, sizeof path, "ckpt/model.safetensors");
    write_st(path, good, ~0ull, 16, ~0ull);
    for (size_t i = 0; i < sizeof bad_index / sizeof bad_index[0]; i++) {
        f = fopen(index_path, "w");
        assert_non_null(f);
        fputs(bad_index[i][0], f);
        assert_int_equal(fclose(f), 0);
        r = scan_one(dir);
        assert_single(r, FP4D_FINDING_HEADER_INVALID, NULL, 1);
        const char *msg = fp4d_scan_report_get(r, 0)->message;
        assert_contains(msg, "model.safetensors.index.json is not a valid index (");
        assert_contains(msg, bad_index[i][1]);
        if (i == 4) assert_contains(msg, "at line 2, column");
        assert_contains(msg, "); scanning every .safetensors file instead");
        fp4d_scan_report_free(r);
    }
    /* A config that is not JSON is a finding; the shards are still scanned. */
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/config.json", dir);
    f = fopen(path, "w");
    fputs("{\"quantization_config\": [", f);
    fclose(f);
    r = scan_one(dir);
    assert_single(r, FP4D_FINDING_HEADER_INVALID, NULL, 1);
    assert_string_equal(fp4d_scan_report_get(r, 0)->file, "config.json");
    fp4d_scan_report_free(r);
}

/* The one finding of r with this code and file; fails when there is none. */
static const fp4d_scan_finding *finding_for(const fp4d_scan_report *r, fp4d_finding_code code, const char *file)
{
    for (size_t i = 0; i < fp4d_scan_report_count(r); i++) {
        const fp4d_scan_finding *f = fp4d_scan_report_get(r, i);
        if (f->code == code && f->file && !strcmp(f->file, file)) return f;
    }
    for (size_t i = 0; i < fp4d_scan_report_count(r); i++) {
        const fp4d_scan_finding *f = fp4d_scan_report_get(r, i);
        print_message("  %s %s: %s\n", fp4d_finding_code_name(f->code), f->file ? f->file : "-", f->message);
    }
    fail_msg("no %s finding about %s", fp4d_finding_code_name(code), file);
    return NULL;
}

/* An index or config that is there but cannot be read was taken for absent, without a word:
 * with the index unreadable, every .safetensors in the folder was scanned, and a stale copy of
 * a shard made a page of DUPLICATE_TENSOR errors with nothing about the index. Only "no such
 * file" is absent now; anything else is a HEADER_INVALID about that file, like a corrupt one.
 * Tests run as root, where permission bits do not stop a read, so the files are made
 * unreadable by what stops root too: a symbolic-link loop (ELOOP), a link to nothing, a
 * directory; and, when not root, mode 000. */
static void test_unreadable_index_and_configs(void **s)
{
    (void)s;
    static const char index_name[] = "model.safetensors.index.json";
    char dir[4096], path[4200], target[4200];
    snprintf(dir, sizeof dir, "%s/unreadable", tmpdir);
    assert_int_equal(mkdir(dir, 0755), 0);
    const char *good = H2("\"data_offsets\":[0,8]", "\"data_offsets\":[8,16]");
    write_st("unreadable/model-00001-of-00001.safetensors", good, ~0ull, 16, ~0ull);
    write_st("unreadable/stale.safetensors", good, ~0ull, 16, ~0ull); /* an old copy of the shard */
    snprintf(path, sizeof path, "%s/%s", dir, index_name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"weight_map\":{\"a\":\"model-00001-of-00001.safetensors\",\"b\":\"model-00001-of-00001.safetensors\"}}", f);
    fclose(f);
    /* readable: the stale file is not read, nothing to report */
    fp4d_scan_report *r = scan_one(dir);
    assert_int_equal(fp4d_scan_report_count(r), 0);
    fp4d_scan_report_free(r);

    enum { LOOP, DANGLING, DIRECTORY, NO_PERMISSION };
    static const char *const why[] = {NULL, "a symbolic link to a missing file", "not a regular file", NULL};
    for (int k = LOOP; k <= NO_PERMISSION; k++) {
        if (k == NO_PERMISSION && geteuid() == 0) continue; /* root reads a mode-000 file */
        char saved[4300];
        snprintf(saved, sizeof saved, "%s/index.saved", dir);
        assert_int_equal(rename(path, saved), 0);
        if (k == LOOP) assert_int_equal(symlink(index_name, path), 0);
        if (k == DANGLING) {
            snprintf(target, sizeof target, "%s/blobs/0123abcd", dir); /* a hub cache's missing blob */
            assert_int_equal(symlink(target, path), 0);
        }
        if (k == DIRECTORY) assert_int_equal(mkdir(path, 0755), 0);
        if (k == NO_PERMISSION) {
            assert_int_equal(rename(saved, path), 0);
            assert_int_equal(chmod(path, 0), 0);
        }
        r = scan_one(dir);
        const fp4d_scan_finding *fd = finding_for(r, FP4D_FINDING_HEADER_INVALID, index_name);
        assert_null(fd->tensor);
        assert_int_equal(fd->severity, FP4D_SCAN_ERROR);
        assert_int_equal(fd->count, 1);
        assert_contains(fd->message, "cannot read model.safetensors.index.json: ");
        assert_contains(fd->message, k == LOOP ? strerror(ELOOP) : k == NO_PERMISSION ? strerror(EACCES) : why[k]);
        assert_contains(fd->message, "scanning every .safetensors file instead");
        /* Without a usable index the folder is read as if it had none, and then the stale
         * copy's tensors are in two files: which one a loader takes is undefined (vLLM loads
         * every file when the index is not a regular file), and replay refuses such a layer.
         * They stay DUPLICATE_TENSOR errors, each naming both files (docs/scan.md, "Shards"). */
        assert_int_equal(fp4d_scan_report_count(r), 3);
        for (size_t i = 0; i < 3; i++) {
            const fp4d_scan_finding *d = fp4d_scan_report_get(r, i);
            if (d == fd) continue;
            assert_int_equal(d->code, FP4D_FINDING_DUPLICATE_TENSOR);
            assert_true(!strcmp(d->tensor, "a") || !strcmp(d->tensor, "b"));
            assert_int_equal(d->count, 2);
            assert_int_equal(d->severity, FP4D_SCAN_ERROR);
            assert_contains(d->message, "model-00001-of-00001.safetensors");
            assert_contains(d->message, "stale.safetensors");
        }
        fp4d_scan_report_free(r);
        if (k == NO_PERMISSION) {
            assert_int_equal(chmod(path, 0644), 0);
        } else {
            assert_int_equal(k == DIRECTORY ? rmdir(path) : unlink(path), 0);
            assert_int_equal(rename(saved, path), 0);
        }
    }

    /* Configs the same way; the scan goes on without them (the index is readable again). */
    static const char *const configs[] = {"config.json", "hf_quant_config.json"};
    for (size_t i = 0; i < 2; i++) {
        char cfg[4300];
        snprintf(cfg, sizeof cfg, "%s/%s", dir, configs[i]);
        if (i == 0) assert_int_equal(symlink(configs[i], cfg), 0); /* loop */
        else assert_int_equal(symlink("/nonexistent/fp4doctor/hf_quant_config.json", cfg), 0);
        r = scan_one(dir);
        assert_single(r, FP4D_FINDING_HEADER_INVALID, NULL, 1);
        const fp4d_scan_finding *fd = fp4d_scan_report_get(r, 0);
        assert_string_equal(fd->file, configs[i]);
        char want[128];
        snprintf(want, sizeof want, "cannot read %s: %s", configs[i],
                 i == 0 ? strerror(ELOOP) : "a symbolic link to a missing file");
        assert_contains(fd->message, want);
        fp4d_scan_report_free(r);
        assert_int_equal(unlink(cfg), 0);
    }
    /* Really absent files are still no finding. */
    r = scan_one(dir);
    assert_int_equal(fp4d_scan_report_count(r), 0);
    fp4d_scan_report_free(r);
}

/* Writes name in tmpdir: a header for m.weight (wdtype, wshape) and m.weight_scale (sdtype,
 * sshape), then wbytes + sbytes bytes of 0x11 (finite codes and scales). */
static const char *write_pair(const char *name, const char *wdtype, const char *wshape, unsigned wbytes,
                              const char *sdtype, const char *sshape, unsigned sbytes)
{
    char h[600];
    snprintf(h, sizeof h,
             "{\"m.weight\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[0,%u]},"
             "\"m.weight_scale\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%u,%u]}}",
             wdtype, wshape, wbytes, sdtype, sshape, wbytes, wbytes + sbytes);
    return write_st(name, h, ~0ull, wbytes + sbytes, ~0ull);
}

/* A U8 weight with F8_E4M3 block scales and no weight_scale_2 is packed NVFP4 missing its
 * global scale: it was reported as format "unquantized" with an ORPHAN_SCALE saying "the
 * weight is stored unquantized". MXFP4 pairs (U8 ue8m0 scales, no global scale by design)
 * are whole layers; "unquantized" is said only of float weights. */
static void test_packed_weight_without_global_scale(void **s)
{
    (void)s;
    fp4d_scan_report *r = scan_one(write_pair("nv_no_s2.safetensors", "U8", "[100,32]", 3200, "F8_E4M3", "[100,4]", 400));
    assert_single(r, FP4D_FINDING_MISSING_COMPANION, "m.weight", 1);
    assert_contains(fp4d_scan_report_get(r, 0)->message, "m.weight_scale_2");
    assert_string_equal(fp4d_scan_report_format(r), "modelopt-nvfp4");
    fp4d_scan_report_free(r);

    /* MXFP4: one ue8m0 scale per 32 elements (K = 64: 2 per row); nothing is missing. */
    r = scan_one(write_pair("mx.safetensors", "U8", "[100,32]", 3200, "U8", "[100,2]", 200));
    assert_int_equal(fp4d_scan_report_count(r), 0);
    fp4d_scan_report_free(r);
    r = scan_one(write_pair("mx_e8m0.safetensors", "U8", "[100,32]", 3200, "F8_E8M0", "[100,2]", 200));
    assert_int_equal(fp4d_scan_report_count(r), 0);
    fp4d_scan_report_free(r);

    /* A float weight next to block scales: stored unquantized, as the message says. */
    r = scan_one(write_pair("bf16.safetensors", "BF16", "[100,64]", 12800, "F8_E4M3", "[100,4]", 400));
    assert_single(r, FP4D_FINDING_ORPHAN_SCALE, "m.weight_scale", 1);
    assert_contains(fp4d_scan_report_get(r, 0)->message, "stored unquantized");
    fp4d_scan_report_free(r);

    /* U8 next to U8 of no FP4 shape is not taken for FP4, and not called unquantized either. */
    r = scan_one(write_pair("u8u8.safetensors", "U8", "[100,32]", 3200, "U8", "[100,3]", 300));
    assert_single(r, FP4D_FINDING_ORPHAN_SCALE, "m.weight_scale", 1);
    const char *msg = fp4d_scan_report_get(r, 0)->message;
    assert_contains(msg, "the weight is U8");
    if (strstr(msg, "unquantized")) fail_msg("called unquantized: %s", msg);
    assert_string_equal(fp4d_scan_report_format(r), "unquantized");
    fp4d_scan_report_free(r);
}

/* The one MISSING_COMPANION of r, about b.weight, naming `count` companions. */
static const char *missing_for_b(const fp4d_scan_report *r, uint64_t count)
{
    assert_single(r, FP4D_FINDING_MISSING_COMPANION, "b.weight", count);
    const char *msg = fp4d_scan_report_get(r, 0)->message;
    assert_contains(msg, "b.weight has no b.weight_scale");
    return msg;
}

/* A packed U8 b.weight with no scale at all, and no config. It was always taken for NVFP4 and
 * said to lack b.weight_scale_2 as well, in a checkpoint whose other layers are MXFP4 (which
 * has no global scale). The format is what the other layers say: their ue8m0 block scales make
 * it MXFP4 (only the block scale is missing), a weight_scale_2 or e4m3 block scales NVFP4 (both
 * are); where they disagree it cannot be told, and only the block scale, which both formats
 * need, is counted missing. */
static void test_packed_weight_without_any_scale(void **s)
{
    (void)s;
    const char *mx = "{\"a.weight\":{\"dtype\":\"U8\",\"shape\":[100,32],\"data_offsets\":[0,3200]},"
                     "\"a.weight_scale\":{\"dtype\":\"%s\",\"shape\":[100,2],\"data_offsets\":[3200,3400]},"
                     "\"b.weight\":{\"dtype\":\"U8\",\"shape\":[100,32],\"data_offsets\":[3400,6600]}}";
    static const char *const mx_scales[] = {"U8", "F8_E8M0"};
    char h[1024];
    for (size_t i = 0; i < 2; i++) {
        snprintf(h, sizeof h, mx, mx_scales[i]);
        fp4d_scan_report *r = scan_one(write_st("mx_no_scale.safetensors", h, ~0ull, 6600, ~0ull));
        const char *msg = missing_for_b(r, 1);
        if (strstr(msg, "weight_scale_2")) fail_msg("NVFP4's global scale named in an MXFP4 checkpoint: %s", msg);
        fp4d_scan_report_free(r);
    }

    const char *nv = "{\"a.weight\":{\"dtype\":\"U8\",\"shape\":[100,32],\"data_offsets\":[0,3200]},"
                     "\"a.weight_scale\":{\"dtype\":\"F8_E4M3\",\"shape\":[100,4],\"data_offsets\":[3200,3600]},"
                     "\"a.weight_scale_2\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[3600,3604]},"
                     "\"b.weight\":{\"dtype\":\"U8\",\"shape\":[100,32],\"data_offsets\":[3604,6804]}}";
    fp4d_scan_report *r = scan_one(write_st("nv_no_scale.safetensors", nv, ~0ull, 6804, ~0ull));
    assert_contains(missing_for_b(r, 2), "b.weight_scale, b.weight_scale_2: the layer cannot be dequantized");
    fp4d_scan_report_free(r);

    /* one MXFP4 layer, one NVFP4 layer: which b is cannot be told */
    const char *both = "{\"a.weight\":{\"dtype\":\"U8\",\"shape\":[100,32],\"data_offsets\":[0,3200]},"
                       "\"a.weight_scale\":{\"dtype\":\"U8\",\"shape\":[100,2],\"data_offsets\":[3200,3400]},"
                       "\"c.weight\":{\"dtype\":\"U8\",\"shape\":[100,32],\"data_offsets\":[3400,6600]},"
                       "\"c.weight_scale\":{\"dtype\":\"F8_E4M3\",\"shape\":[100,4],\"data_offsets\":[6600,7000]},"
                       "\"c.weight_scale_2\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[7000,7004]},"
                       "\"b.weight\":{\"dtype\":\"U8\",\"shape\":[100,32],\"data_offsets\":[7004,10204]}}";
    r = scan_one(write_st("mixed_no_scale.safetensors", both, ~0ull, 10204, ~0ull));
    const char *msg = missing_for_b(r, 1);
    assert_contains(msg, "has no b.weight_scale: the layer cannot be dequantized");
    assert_contains(msg, "tells NVFP4 from MXFP4; NVFP4 would also need b.weight_scale_2");
    fp4d_scan_report_free(r);
}

static void assert_text_contains(const fp4d_scan_report *r, const char *needle, bool present)
{
    char *text = scan_report_text(r);
    assert_non_null(text);
    if ((strstr(text, needle) != NULL) != present)
        fail_msg("'%s' %s in:\n%s", needle, present ? "not" : "wrongly", text);
    free(text);
}

/* A ModelOpt packed b.weight whose b.weight_scale lies in a shard whose header is rejected (so
 * its dtype is unknown) was NVFP4 whatever the other layers are: in an MXFP4 checkpoint it
 * lacked a b.weight_scale_2 and its decode convention made the writer line claim ModelOpt's
 * global scales. Its format is told as for a weight with no scale (the config, else the other
 * layers); a layer nothing tells claims no convention either. */
static void test_packed_weight_with_unreadable_scale(void **s)
{
    (void)s;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/bad_scale", tmpdir);
    assert_int_equal(mkdir(dir, 0755), 0);
    write_st("bad_scale/model-00002-of-00002.safetensors",
             "{\"b.weight_scale\":{\"dtype\":\"U9\",\"shape\":[100,2],\"data_offsets\":[0,200]}}", ~0ull, 200, ~0ull);
    write_st("bad_scale/model-00001-of-00002.safetensors",
             "{\"a.weight\":{\"dtype\":\"U8\",\"shape\":[100,32],\"data_offsets\":[0,3200]},"
             "\"a.weight_scale\":{\"dtype\":\"U8\",\"shape\":[100,2],\"data_offsets\":[3200,3400]},"
             "\"b.weight\":{\"dtype\":\"U8\",\"shape\":[100,32],\"data_offsets\":[3400,6600]}}",
             ~0ull, 6600, ~0ull);
    fp4d_scan_report *r = scan_one(dir);
    assert_single(r, FP4D_FINDING_HEADER_INVALID, "b.weight_scale", 1);
    assert_string_equal(fp4d_scan_report_format(r), "modelopt-mxfp4");
    assert_text_contains(r, "MXFP4 has no global scale", true);
    assert_text_contains(r, "global scales decode", false);
    fp4d_scan_report_free(r);

    /* the other layer NVFP4: b is too, and its weight_scale_2 is missing, as before */
    write_st("bad_scale/model-00001-of-00002.safetensors",
             "{\"a.weight\":{\"dtype\":\"U8\",\"shape\":[100,32],\"data_offsets\":[0,3200]},"
             "\"a.weight_scale\":{\"dtype\":\"F8_E4M3\",\"shape\":[100,4],\"data_offsets\":[3200,3600]},"
             "\"a.weight_scale_2\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[3600,3604]},"
             "\"b.weight\":{\"dtype\":\"U8\",\"shape\":[100,32],\"data_offsets\":[3604,6804]}}",
             ~0ull, 6804, ~0ull);
    r = scan_one(dir);
    assert_int_equal(fp4d_scan_report_count(r), 2);
    assert_int_equal(fp4d_scan_report_get(r, 0)->code, FP4D_FINDING_HEADER_INVALID);
    const fp4d_scan_finding *f = fp4d_scan_report_get(r, 1);
    assert_int_equal(f->code, FP4D_FINDING_MISSING_COMPANION);
    assert_string_equal(f->tensor, "b.weight");
    assert_int_equal(f->count, 1);
    assert_contains(f->message, "b.weight has no b.weight_scale_2: the layer cannot be dequantized");
    assert_string_equal(fp4d_scan_report_format(r), "modelopt-nvfp4");
    assert_text_contains(r, "global scales decode", true);
    fp4d_scan_report_free(r);

    /* nothing tells what b.weight is (no scale, no other layer; only a stray weight_scale_2):
     * no decode convention, and no ModelOpt writer, is read from it */
    r = scan_one(write_st("untold.safetensors",
                          "{\"b.weight\":{\"dtype\":\"U8\",\"shape\":[100,32],\"data_offsets\":[0,3200]},"
                          "\"x.weight_scale_2\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[3200,3204]}}",
                          ~0ull, 3204, ~0ull));
    assert_int_equal(fp4d_scan_report_count(r), 2);
    assert_contains(fp4d_scan_report_get(r, 0)->message, "no config or other layer tells NVFP4 from MXFP4");
    assert_int_equal(fp4d_scan_report_get(r, 1)->code, FP4D_FINDING_ORPHAN_SCALE);
    assert_string_equal(fp4d_scan_report_writer(r), "unknown");
    assert_text_contains(r, "global scales", false);
    fp4d_scan_report_free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_header_rules),
        cmocka_unit_test(test_folders),
        cmocka_unit_test(test_unreadable_index_and_configs),
        cmocka_unit_test(test_packed_weight_without_global_scale),
        cmocka_unit_test(test_packed_weight_without_any_scale),
        cmocka_unit_test(test_packed_weight_with_unreadable_scale),
        cmocka_unit_test(test_not_a_checkpoint_file),
        cmocka_unit_test(test_scale_shape_messages),
        cmocka_unit_test(test_codes_typed_f4),
        cmocka_unit_test(test_hostile_names_in_messages),
        cmocka_unit_test(test_descriptor_limit_is_not_a_finding),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
