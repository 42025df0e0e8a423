/*
 * safetensors reader and writer: every error code from handcrafted bytes, the accessors,
 * and the writer's layout (order, padding, atomic replace) checked against bytes built
 * independently here.
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

#include "fp4doctor/io.h"

/* ---- helpers ------------------------------------------------------------------------------ */

typedef struct test_buf {
    uint8_t *bytes;
    size_t   len;
} test_buf;

/* 8-byte little-endian header length (declared_len, or the real length when UINT64_MAX),
 * the header text, then data_len bytes of pattern data. */
static test_buf make_file_n(const char *header, uint64_t declared_len, size_t data_len)
{
    size_t hl = strlen(header);
    test_buf b;
    b.len = 8 + hl + data_len;
    b.bytes = malloc(b.len ? b.len : 1);
    assert_non_null(b.bytes);
    uint64_t n = declared_len == UINT64_MAX ? hl : declared_len;
    for (int i = 0; i < 8; i++) b.bytes[i] = (uint8_t)(n >> (8 * i));
    memcpy(b.bytes + 8, header, hl);
    for (size_t i = 0; i < data_len; i++) b.bytes[8 + hl + i] = (uint8_t)(i * 7 + 1);
    return b;
}

static test_buf make_file(const char *header, size_t data_len)
{
    return make_file_n(header, UINT64_MAX, data_len);
}

/* Opens b, expects error e and (if non-NULL) that the message contains needle. */
static void expect_error(test_buf b, fp4d_st_error e, const char *needle)
{
    fp4d_st_open_result res;
    fp4d_st_file *f = fp4d_st_open_memory(b.bytes, b.len, &res);
    if (f || res.error != e) {
        fprintf(stderr, "expected %s, got %s: %s\n", fp4d_st_error_name(e),
                f ? "OK" : fp4d_st_error_name(res.error), res.message);
    }
    assert_null(f);
    assert_int_equal(res.error, e);
    assert_true(res.message[0] != '\0');
    if (needle && !strstr(res.message, needle)) {
        fprintf(stderr, "message '%s' lacks '%s'\n", res.message, needle);
        fail();
    }
    free(b.bytes);
}

static const char *tmp_dir(void)
{
    static char dir[256];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/fp4d_test_st_XXXXXX");
        assert_non_null(mkdtemp(dir));
    }
    return dir;
}

/* ---- reader: valid files ------------------------------------------------------------------- */

static void test_valid_file_and_accessors(void **state)
{
    (void)state;
    /* Header order differs from offset order; the reader sorts by offset. */
    test_buf b = make_file("{\"b\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[8,11]},"
                           "\"__metadata__\":{\"format\":\"pt\",\"k\":\"v\"},"
                           "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}  ",
                           11);
    fp4d_st_open_result res;
    fp4d_st_file *f = fp4d_st_open_memory(b.bytes, b.len, &res);
    assert_non_null(f);
    assert_int_equal(res.error, FP4D_ST_OK);
    assert_int_equal(fp4d_st_count(f), 2);
    const fp4d_st_tensor *t0 = fp4d_st_get(f, 0), *t1 = fp4d_st_get(f, 1);
    assert_string_equal(t0->name, "a");
    assert_string_equal(t1->name, "b");
    assert_null(fp4d_st_get(f, 2));
    assert_int_equal(t0->dtype, FP4D_ST_F32);
    assert_int_equal(t0->ndim, 1);
    assert_int_equal(t0->shape[0], 2);
    assert_int_equal(t0->nbytes, 8);
    assert_int_equal(t1->begin, 8);
    assert_int_equal(t1->end, 11);
    size_t data_start = b.len - 11;
    assert_ptr_equal(t0->data, b.bytes + data_start);
    assert_ptr_equal(t1->data, b.bytes + data_start + 8);
    assert_ptr_equal(fp4d_st_find(f, "b"), t1);
    assert_ptr_equal(fp4d_st_find(f, "a"), t0);
    assert_null(fp4d_st_find(f, "c"));
    assert_null(fp4d_st_find(f, "__metadata__"));
    assert_string_equal(fp4d_st_metadata(f, "format"), "pt");
    assert_string_equal(fp4d_st_metadata(f, "k"), "v");
    assert_null(fp4d_st_metadata(f, "nope"));
    assert_int_equal(fp4d_st_metadata_count(f), 2);
    assert_string_equal(fp4d_st_metadata_key(f, 0), "format");
    assert_string_equal(fp4d_st_metadata_key(f, 1), "k");
    assert_null(fp4d_st_metadata_key(f, 2));
    assert_int_equal(fp4d_st_header_size(f), b.len - 8 - 11);
    assert_int_equal(fp4d_st_file_size(f), b.len);
    assert_int_equal(fp4d_st_element_count(t1), 3);
    fp4d_st_close(f);
    fp4d_st_close(NULL);
    free(b.bytes);
}

static void test_valid_edge_shapes(void **state)
{
    (void)state;
    /* Empty header object with an empty buffer. */
    test_buf b = make_file("{}", 0);
    fp4d_st_file *f = fp4d_st_open_memory(b.bytes, b.len, NULL);
    assert_non_null(f);
    assert_int_equal(fp4d_st_count(f), 0);
    fp4d_st_close(f);
    free(b.bytes);

    /* Scalar (rank 0) F32 of 4 bytes, a 0-element tensor, and F4 with an even count. */
    b = make_file("{\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
                  "\"z\":{\"dtype\":\"BF16\",\"shape\":[0,5],\"data_offsets\":[4,4]},"
                  "\"q\":{\"dtype\":\"F4\",\"shape\":[2,3],\"data_offsets\":[4,7]}}",
                  7);
    fp4d_st_open_result res;
    f = fp4d_st_open_memory(b.bytes, b.len, &res);
    if (!f) fprintf(stderr, "%s\n", res.message);
    assert_non_null(f);
    const fp4d_st_tensor *s = fp4d_st_find(f, "s");
    assert_int_equal(s->ndim, 0);
    assert_int_equal(fp4d_st_element_count(s), 1);
    assert_int_equal(fp4d_st_find(f, "z")->nbytes, 0);
    assert_int_equal(fp4d_st_find(f, "q")->nbytes, 3);
    fp4d_st_close(f);
    free(b.bytes);
}

static void test_many_tensors_lookup(void **state)
{
    (void)state;
    /* 2000 one-byte tensors, written in reverse name order: find() must locate each. */
    enum { N = 2000 };
    size_t cap = (size_t)N * 96 + 16, used = 0;
    char *hdr = malloc(cap);
    used += (size_t)snprintf(hdr + used, cap - used, "{");
    for (int i = 0; i < N; i++)
        used += (size_t)snprintf(hdr + used, cap - used, "%s\"t%05d\":{\"dtype\":\"U8\",\"shape\":[1],"
                                 "\"data_offsets\":[%d,%d]}", i ? "," : "", N - 1 - i, N - 1 - i, N - i);
    snprintf(hdr + used, cap - used, "}");
    test_buf b = make_file(hdr, N);
    free(hdr);
    fp4d_st_file *f = fp4d_st_open_memory(b.bytes, b.len, NULL);
    assert_non_null(f);
    for (int i = 0; i < N; i++) {
        char name[16];
        snprintf(name, sizeof name, "t%05d", i);
        const fp4d_st_tensor *t = fp4d_st_find(f, name);
        assert_non_null(t);
        assert_int_equal(t->begin, (uint64_t)i);
        assert_ptr_equal(fp4d_st_get(f, (size_t)i), t);
    }
    fp4d_st_close(f);
    free(b.bytes);
}

/* ---- reader: one test per error code ----------------------------------------------------- */

static void test_err_header_too_small(void **state)
{
    (void)state;
    test_buf b = {calloc(1, 7), 7};
    expect_error(b, FP4D_ST_ERR_HEADER_TOO_SMALL, NULL);
    b = (test_buf){calloc(1, 1), 0};
    expect_error(b, FP4D_ST_ERR_HEADER_TOO_SMALL, NULL);
}

static void test_err_header_too_large(void **state)
{
    (void)state;
    expect_error(make_file_n("{}", 100000001ull, 0), FP4D_ST_ERR_HEADER_TOO_LARGE, "100000001");
    expect_error(make_file_n("{}", UINT64_MAX - 1, 0), FP4D_ST_ERR_HEADER_TOO_LARGE, NULL);
}

static test_buf text_file(const char *text)
{
    test_buf b = {(uint8_t *)strdup(text), strlen(text)};
    assert_non_null(b.bytes);
    return b;
}

/* A Git LFS pointer where the shard should be (a clone without git-lfs): said as such, with its
 * digest and size, not as a header length of 2.3e18. Text that only begins like one, or a
 * pointer longer than pointers are, stays what its bytes say. */
static void test_err_lfs_pointer(void **state)
{
    (void)state;
    const char *pointer = "version https://git-lfs.github.com/spec/v1\n"
                          "oid sha256:39783080bbd9cc9a0a7e5b6a9a4f0c2e4c9b5f1d8e7a6b5c4d3e2f1a0b9c8d7e\n"
                          "size 4961125376\n";
    expect_error(text_file(pointer), FP4D_ST_ERR_LFS_POINTER, "(sha256 39783080bbd9cc9a..., 4961125376 bytes)");
    expect_error(text_file(pointer), FP4D_ST_ERR_LFS_POINTER, "git lfs pull");
    expect_error(text_file("version https://git-lfs.github.com/spec/v1\n"), FP4D_ST_ERR_LFS_POINTER,
                 "a Git LFS pointer, not the tensor data");
    expect_error(text_file("version 1.0 of something else\n"), FP4D_ST_ERR_HEADER_TOO_LARGE, NULL);
    char big[2048];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    memcpy(big, "version https://git-lfs.github.com/spec/v1\n", 43); /* without its NUL */
    expect_error(text_file(big), FP4D_ST_ERR_HEADER_TOO_LARGE, NULL);
}

static void test_err_header_length(void **state)
{
    (void)state;
    expect_error(make_file_n("{}", 3, 0), FP4D_ST_ERR_HEADER_LENGTH, NULL);
    expect_error(make_file_n("{}", 100000000ull, 0), FP4D_ST_ERR_HEADER_LENGTH, NULL);
}

static void test_err_header_not_object(void **state)
{
    (void)state;
    expect_error(make_file(" {}", 0), FP4D_ST_ERR_HEADER_NOT_OBJECT, NULL);
    expect_error(make_file("[]", 0), FP4D_ST_ERR_HEADER_NOT_OBJECT, NULL);
    expect_error(make_file("", 0), FP4D_ST_ERR_HEADER_NOT_OBJECT, NULL);
}

static void test_err_header_utf8(void **state)
{
    (void)state;
    expect_error(make_file("{\"a\xff\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0),
                 FP4D_ST_ERR_HEADER_UTF8, NULL);
    /* Overlong encoding of '/' */
    expect_error(make_file("{\"__metadata__\":{\"k\":\"\xc0\xaf\"}}", 0), FP4D_ST_ERR_HEADER_UTF8, NULL);
}

static void test_err_header_json(void **state)
{
    (void)state;
    expect_error(make_file("{\"a\":", 0), FP4D_ST_ERR_HEADER_JSON, NULL);
    expect_error(make_file("{} x", 0), FP4D_ST_ERR_HEADER_JSON, NULL);
    expect_error(make_file("{\"w\":[1]}", 0), FP4D_ST_ERR_HEADER_JSON, "'w'");
    expect_error(make_file("{\"w\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1), FP4D_ST_ERR_HEADER_JSON, "data_offsets");
    expect_error(make_file("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":1}}", 1),
                 FP4D_ST_ERR_HEADER_JSON, "unknown field 'x'");
    expect_error(make_file("{\"w\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 1),
                 FP4D_ST_ERR_HEADER_JSON, "'w'");
    expect_error(make_file("{\"w\":{\"dtype\":\"U8\",\"shape\":[1.0],\"data_offsets\":[0,1]}}", 1),
                 FP4D_ST_ERR_HEADER_JSON, "'w'");
    expect_error(make_file("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 1),
                 FP4D_ST_ERR_HEADER_JSON, "'w'");
    expect_error(make_file("{\"w\":{\"dtype\":8,\"shape\":[1],\"data_offsets\":[0,1]}}", 1),
                 FP4D_ST_ERR_HEADER_JSON, "'w'");
    expect_error(make_file("{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1),
                 FP4D_ST_ERR_HEADER_JSON, "'w'");
    /* An embedded NUL in a name cannot become a C string. */
    expect_error(make_file("{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0),
                 FP4D_ST_ERR_HEADER_JSON, NULL);
    /* Integer beyond 64 bits. */
    expect_error(make_file("{\"w\":{\"dtype\":\"U8\",\"shape\":[99999999999999999999],\"data_offsets\":[0,1]}}", 1),
                 FP4D_ST_ERR_HEADER_JSON, NULL);
}

static void test_err_duplicate_key(void **state)
{
    (void)state;
    expect_error(make_file("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                           "\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
                           2),
                 FP4D_ST_ERR_DUPLICATE_KEY, "\"w\"");
    expect_error(make_file("{\"w\":{\"dtype\":\"U8\",\"dtype\":\"I8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1),
                 FP4D_ST_ERR_DUPLICATE_KEY, "dtype");
}

static void test_err_unknown_dtype(void **state)
{
    (void)state;
    expect_error(make_file("{\"layer.w_scale\":{\"dtype\":\"F8_E4M3FN\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1),
                 FP4D_ST_ERR_UNKNOWN_DTYPE, "layer.w_scale");
}

static void test_err_metadata(void **state)
{
    (void)state;
    expect_error(make_file("{\"__metadata__\":{\"k\":1}}", 0), FP4D_ST_ERR_METADATA, "'k'");
    expect_error(make_file("{\"__metadata__\":null}", 0), FP4D_ST_ERR_METADATA, NULL);
    expect_error(make_file("{\"__metadata__\":[\"a\"]}", 0), FP4D_ST_ERR_METADATA, NULL);
}

static void test_err_shape_overflow(void **state)
{
    (void)state;
    expect_error(make_file("{\"big\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}", 0),
                 FP4D_ST_ERR_SHAPE_OVERFLOW, "big");
    /* The element count fits, its size in bits does not: 2^62 F32 elements. */
    expect_error(make_file("{\"big\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,0]}}", 0),
                 FP4D_ST_ERR_SHAPE_OVERFLOW, "big");
    /* A zero dimension makes any product zero: not an overflow. */
    test_buf b = make_file("{\"e\":{\"dtype\":\"U8\",\"shape\":[0,4294967296,4294967296],\"data_offsets\":[0,0]}}", 0);
    fp4d_st_file *f = fp4d_st_open_memory(b.bytes, b.len, NULL);
    assert_non_null(f);
    fp4d_st_close(f);
    free(b.bytes);
}

static void test_err_misaligned(void **state)
{
    (void)state;
    expect_error(make_file("{\"q\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2),
                 FP4D_ST_ERR_MISALIGNED, "'q'");
    expect_error(make_file("{\"q\":{\"dtype\":\"F6_E2M3\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2),
                 FP4D_ST_ERR_MISALIGNED, "'q'");
}

static void test_err_offsets(void **state)
{
    (void)state;
    /* Gap at the start. */
    expect_error(make_file("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2),
                 FP4D_ST_ERR_OFFSETS, "'a'");
    /* Overlap: the later tensor is named. */
    expect_error(make_file("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                           "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[1,3]}}",
                           3),
                 FP4D_ST_ERR_OFFSETS, "'b'");
    /* Gap in the middle. */
    expect_error(make_file("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                           "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[3,5]}}",
                           5),
                 FP4D_ST_ERR_OFFSETS, "'b'");
    /* Reversed range. */
    expect_error(make_file("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                           "\"b\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[2,0]}}", 2),
                 FP4D_ST_ERR_OFFSETS, "'b'");
}

static void test_err_size_mismatch(void **state)
{
    (void)state;
    expect_error(make_file("{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,10]}}", 10),
                 FP4D_ST_ERR_SIZE_MISMATCH, "'w'");
}

static void test_err_truncated_and_trailing(void **state)
{
    (void)state;
    expect_error(make_file("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 15),
                 FP4D_ST_ERR_TRUNCATED, "'w'");
    expect_error(make_file("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 17),
                 FP4D_ST_ERR_TRAILING_BYTES, NULL);
    expect_error(make_file("{}", 1), FP4D_ST_ERR_TRAILING_BYTES, NULL);
}

static void test_err_open(void **state)
{
    (void)state;
    fp4d_st_open_result res;
    assert_null(fp4d_st_open("/nonexistent/fp4d/file.safetensors", &res));
    assert_int_equal(res.error, FP4D_ST_ERR_OPEN);
    assert_non_null(strstr(res.message, "/nonexistent/fp4d/file.safetensors"));
    assert_null(fp4d_st_open(tmp_dir(), &res));
    assert_int_equal(res.error, FP4D_ST_ERR_OPEN);
    assert_null(fp4d_st_open(NULL, NULL));
    /* A FIFO is refused at once: the open must not wait for a writer (it used to hang). */
    char fifo[512];
    snprintf(fifo, sizeof fifo, "%s/in.fifo", tmp_dir());
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_null(fp4d_st_open(fifo, &res));
    assert_int_equal(res.error, FP4D_ST_ERR_OPEN);
    assert_non_null(strstr(res.message, "not a regular file"));
    unlink(fifo);
}

static void test_error_names_are_distinct(void **state)
{
    (void)state;
    for (int i = 0; i < FP4D_ST_ERR_COUNT; i++) {
        assert_string_not_equal(fp4d_st_error_name((fp4d_st_error)i), "UNKNOWN");
        for (int j = 0; j < i; j++)
            assert_string_not_equal(fp4d_st_error_name((fp4d_st_error)i), fp4d_st_error_name((fp4d_st_error)j));
    }
    assert_string_equal(fp4d_st_error_name(FP4D_ST_ERR_COUNT), "UNKNOWN");
    assert_string_equal(fp4d_st_error_name(FP4D_ST_ERR_DUPLICATE_KEY), "DUPLICATE_KEY");
}

static void test_dtype_table(void **state)
{
    (void)state;
    /* §7d.1 bit sizes, in enum order. */
    static const struct { const char *name; uint32_t bits; } expect[FP4D_ST_DTYPE_COUNT] = {
        {"BOOL", 8}, {"F4", 4}, {"F6_E2M3", 6}, {"F6_E3M2", 6}, {"U8", 8}, {"I8", 8}, {"F8_E5M2", 8},
        {"F8_E4M3", 8}, {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8}, {"I16", 16}, {"U16", 16},
        {"F16", 16}, {"BF16", 16}, {"I32", 32}, {"U32", 32}, {"F32", 32}, {"C64", 64}, {"F64", 64},
        {"I64", 64}, {"U64", 64}};
    for (int i = 0; i < FP4D_ST_DTYPE_COUNT; i++) {
        assert_string_equal(fp4d_st_dtype_name((fp4d_st_dtype)i), expect[i].name);
        assert_int_equal(fp4d_st_dtype_bits((fp4d_st_dtype)i), expect[i].bits);
        fp4d_st_dtype t;
        assert_true(fp4d_st_dtype_from_name(expect[i].name, &t));
        assert_int_equal(t, i);
    }
    assert_false(fp4d_st_dtype_from_name("F8_E4M3FN", NULL));
    assert_false(fp4d_st_dtype_from_name("f32", NULL));
}

/* Random corruption of a valid file must give an error or a valid handle, never a crash
 * (the real fuzzing lives in fuzz/; this keeps a cheap version in every test run). */
static void test_corruption_never_crashes(void **state)
{
    (void)state;
    test_buf base = make_file("{\"__metadata__\":{\"format\":\"pt\"},"
                              "\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
                              "\"w_scale\":{\"dtype\":\"F8_E4M3\",\"shape\":[2,1],\"data_offsets\":[12,14]}}",
                              14);
    uint8_t *copy = malloc(base.len);
    uint32_t rng = 12345;
    int accepted = 0;
    for (int iter = 0; iter < 20000; iter++) {
        memcpy(copy, base.bytes, base.len);
        int flips = 1 + iter % 4;
        for (int k = 0; k < flips; k++) {
            rng = rng * 1664525u + 1013904223u;
            size_t pos = (rng >> 8) % base.len;
            rng = rng * 1664525u + 1013904223u;
            copy[pos] = (uint8_t)(rng >> 24);
        }
        size_t len = base.len;
        if (iter % 7 == 0) len = (rng >> 3) % (base.len + 1); /* truncations too */
        fp4d_st_open_result res;
        fp4d_st_file *f = fp4d_st_open_memory(copy, len, &res);
        if (f) {
            accepted++;
            /* A file that opened must describe bytes inside the buffer. */
            for (size_t i = 0; i < fp4d_st_count(f); i++) {
                const fp4d_st_tensor *t = fp4d_st_get(f, i);
                assert_true(t->data >= copy && t->data + t->nbytes <= copy + len);
            }
            fp4d_st_close(f);
        } else {
            assert_true(res.error > FP4D_ST_OK && res.error < FP4D_ST_ERR_COUNT);
        }
    }
    assert_true(accepted > 0); /* flips inside the data section leave the file valid */
    free(copy);
    free(base.bytes);
}

/* ---- writer ------------------------------------------------------------------------------- */

static uint8_t *read_whole(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)n + 1);
    assert_int_equal(fread(buf, 1, (size_t)n, fp), (size_t)n);
    fclose(fp);
    *len = (size_t)n;
    return buf;
}

static void test_writer_layout_is_exact(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/w.safetensors", tmp_dir());
    const uint8_t u8data[3] = {1, 2, 3};
    const float f32data[2] = {1.5f, -2.0f};
    const uint16_t bf16data[1] = {0x3f80};
    const float scalar = 0.25f;

    fp4d_st_writer *w = fp4d_st_writer_new();
    assert_non_null(w);
    int64_t s3[1] = {3}, s2[1] = {2}, s1x1[2] = {1, 1};
    /* Added in an order unrelated to the output order. */
    assert_int_equal(fp4d_st_writer_add(w, "b_u8", FP4D_ST_U8, 1, s3, u8data, 3), FP4D_STATUS_OK);
    assert_int_equal(fp4d_st_writer_add(w, "z_f32", FP4D_ST_F32, 1, s2, f32data, 8), FP4D_STATUS_OK);
    assert_int_equal(fp4d_st_writer_add(w, "c_bf16", FP4D_ST_BF16, 2, s1x1, bf16data, 2), FP4D_STATUS_OK);
    assert_int_equal(fp4d_st_writer_add(w, "a_f32", FP4D_ST_F32, 0, NULL, &scalar, 4), FP4D_STATUS_OK);
    assert_int_equal(fp4d_st_writer_set_metadata(w, "format", "pt"), FP4D_STATUS_OK);
    /* Rejections. */
    assert_int_equal(fp4d_st_writer_add(w, "b_u8", FP4D_ST_U8, 1, s3, u8data, 3), FP4D_STATUS_INVALID_ARG);
    assert_int_equal(fp4d_st_writer_add(w, "bad", FP4D_ST_U8, 1, s3, u8data, 2), FP4D_STATUS_INVALID_ARG);
    assert_int_equal(fp4d_st_writer_add(w, "__metadata__", FP4D_ST_U8, 1, s3, u8data, 3), FP4D_STATUS_INVALID_ARG);
    assert_int_equal(fp4d_st_writer_add(w, "odd", FP4D_ST_F4, 1, s3, u8data, 2), FP4D_STATUS_INVALID_ARG);
    assert_int_equal(fp4d_st_writer_save(w, path), FP4D_STATUS_OK);
    fp4d_st_writer_free(w);
    fp4d_st_writer_free(NULL);

    /* Expected bytes, built by hand: F32 (a_f32, z_f32), then BF16, then U8. */
    const char *json = "{\"__metadata__\":{\"format\":\"pt\"},"
                       "\"a_f32\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
                       "\"z_f32\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]},"
                       "\"c_bf16\":{\"dtype\":\"BF16\",\"shape\":[1,1],\"data_offsets\":[12,14]},"
                       "\"b_u8\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[14,17]}}";
    size_t jl = strlen(json), padded = (jl + 7) / 8 * 8;
    size_t exp_len = 8 + padded + 17;
    uint8_t *exp = malloc(exp_len);
    for (int i = 0; i < 8; i++) exp[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    memcpy(exp + 8, json, jl);
    memset(exp + 8 + jl, ' ', padded - jl);
    uint8_t *d = exp + 8 + padded;
    memcpy(d, &scalar, 4);
    memcpy(d + 4, f32data, 8);
    memcpy(d + 12, bf16data, 2);
    memcpy(d + 14, u8data, 3);

    size_t got_len;
    uint8_t *got = read_whole(path, &got_len);
    assert_int_equal(got_len, exp_len);
    assert_memory_equal(got, exp, exp_len);
    free(got);
    free(exp);

    /* And it reads back. */
    fp4d_st_open_result res;
    fp4d_st_file *f = fp4d_st_open(path, &res);
    assert_non_null(f);
    assert_int_equal(fp4d_st_count(f), 4);
    assert_string_equal(fp4d_st_metadata(f, "format"), "pt");
    assert_memory_equal(fp4d_st_find(f, "z_f32")->data, f32data, 8);
    fp4d_st_close(f);

    /* No temporary file left behind. */
    DIR *dir = opendir(tmp_dir());
    struct dirent *de;
    int files = 0;
    while ((de = readdir(dir)))
        if (de->d_name[0] != '.') files++;
    closedir(dir);
    assert_int_equal(files, 1);
}

static void test_writer_replaces_atomically(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/r.safetensors", tmp_dir());
    uint8_t v1 = 1, v2[2] = {2, 3};
    int64_t one = 1, two = 2;
    fp4d_st_writer *w = fp4d_st_writer_new();
    fp4d_st_writer_add(w, "x", FP4D_ST_U8, 1, &one, &v1, 1);
    assert_int_equal(fp4d_st_writer_save(w, path), FP4D_STATUS_OK);
    fp4d_st_writer_free(w);

    /* A reader holding the old file keeps seeing the old bytes after the replace. */
    fp4d_st_file *old = fp4d_st_open(path, NULL);
    assert_non_null(old);
    w = fp4d_st_writer_new();
    fp4d_st_writer_add(w, "x", FP4D_ST_U8, 1, &two, v2, 2);
    assert_int_equal(fp4d_st_writer_save(w, path), FP4D_STATUS_OK);
    fp4d_st_writer_free(w);
    assert_int_equal(fp4d_st_find(old, "x")->nbytes, 1);
    assert_int_equal(fp4d_st_find(old, "x")->data[0], 1);
    fp4d_st_close(old);
    fp4d_st_file *f = fp4d_st_open(path, NULL);
    assert_int_equal(fp4d_st_find(f, "x")->nbytes, 2);
    fp4d_st_close(f);
    unlink(path);

    /* Unwritable destination: an error, not a crash. */
    w = fp4d_st_writer_new();
    fp4d_st_writer_add(w, "x", FP4D_ST_U8, 1, &one, &v1, 1);
    assert_int_equal(fp4d_st_writer_save(w, "/nonexistent/dir/out.safetensors"), FP4D_STATUS_IO);

    /* What the rename would replace is refused and left as it was: a FIFO (its reader would get
     * nothing), a symbolic link (replaced, not written through), a directory. */
    char fifo[512], link[512], target[512];
    snprintf(fifo, sizeof fifo, "%s/out.fifo", tmp_dir());
    snprintf(link, sizeof link, "%s/out.link", tmp_dir());
    snprintf(target, sizeof target, "%s/target.bin", tmp_dir());
    assert_int_equal(mkfifo(fifo, 0600), 0);
    FILE *t = fopen(target, "w");
    assert_non_null(t);
    fputs("keep", t);
    fclose(t);
    assert_int_equal(symlink(target, link), 0);
    const char *refused[] = {fifo, link, tmp_dir()};
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(fp4d_st_writer_save(w, refused[i]), FP4D_STATUS_IO);
        assert_non_null(strstr(fp4d_last_error(), "not a regular file"));
    }
    fp4d_st_writer_free(w);
    struct stat sb;
    assert_int_equal(lstat(fifo, &sb), 0);
    assert_true(S_ISFIFO(sb.st_mode));
    assert_int_equal(lstat(link, &sb), 0);
    assert_true(S_ISLNK(sb.st_mode));
    assert_int_equal(stat(target, &sb), 0);
    assert_int_equal(sb.st_size, 4);
    unlink(fifo);
    unlink(link);
    unlink(target);
}

/* Saves a one-tensor file to path; the writer's status. */
static fp4d_status save_small(const char *path, uint8_t value)
{
    uint8_t v = value;
    int64_t one = 1;
    fp4d_st_writer *w = fp4d_st_writer_new();
    fp4d_st_writer_add(w, "x", FP4D_ST_U8, 1, &one, &v, 1);
    const fp4d_status s = fp4d_st_writer_save(w, path);
    fp4d_st_writer_free(w);
    return s;
}

static mode_t mode_of(const char *path)
{
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    return sb.st_mode & 07777;
}

/* Files in dir other than . and .. */
static int files_in(const char *d)
{
    DIR *dir = opendir(d);
    assert_non_null(dir);
    struct dirent *de;
    int n = 0;
    while ((de = readdir(dir)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) n++;
    closedir(dir);
    return n;
}

/* Output permissions follow the CLI's report files (cli_open_output): every output was 0644,
 * so umask 077 still gave a world-readable new file, and an existing 0600 file became 0644. */
static void test_writer_output_modes(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/mode.safetensors", tmp_dir());
    const mode_t saved = umask(077);
    assert_int_equal(save_small(path, 1), FP4D_STATUS_OK);
    assert_int_equal(mode_of(path), 0600); /* new: 0666 less the umask */
    umask(022);
    assert_int_equal(save_small(path, 2), FP4D_STATUS_OK);
    assert_int_equal(mode_of(path), 0600); /* existing: its own mode, whatever the umask */
    unlink(path);
    assert_int_equal(save_small(path, 3), FP4D_STATUS_OK);
    assert_int_equal(mode_of(path), 0644);
    assert_int_equal(chmod(path, 0640), 0);
    assert_int_equal(save_small(path, 4), FP4D_STATUS_OK);
    assert_int_equal(mode_of(path), 0640);
    umask(027);
    unlink(path);
    assert_int_equal(save_small(path, 5), FP4D_STATUS_OK);
    assert_int_equal(mode_of(path), 0640);
    umask(saved);
    fp4d_st_file *f = fp4d_st_open(path, NULL);
    assert_non_null(f);
    assert_int_equal(fp4d_st_find(f, "x")->data[0], 5);
    fp4d_st_close(f);
    unlink(path);
}

/* A read-only output is refused and left as it was, as the CLI refuses a read-only report.
 * Renaming over a file needs only its folder to be writable, so an 0444 file - even one of
 * another user, in a folder the caller may write - was replaced with success. Root may write
 * anything (access() says so, as cli_open_output asks it), so as root the save runs in a child
 * that has become nobody, in a folder open to all. */
static void test_writer_refuses_read_only_output(void **state)
{
    (void)state;
    char d[] = "/tmp/fp4d_test_st_ro_XXXXXX", path[512];
    assert_non_null(mkdtemp(d));
    assert_int_equal(chmod(d, 0777), 0);
    snprintf(path, sizeof path, "%s/ro.safetensors", d);
    FILE *t = fopen(path, "w");
    assert_non_null(t);
    fputs("keep", t);
    fclose(t);
    assert_int_equal(chmod(path, 0444), 0);
    int rc;
    if (geteuid() != 0) {
        rc = save_small(path, 1) == FP4D_STATUS_IO && strstr(fp4d_last_error(), "cannot write") ? 0 : 1;
    } else {
        const pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            if (setgid(65534) != 0 || setuid(65534) != 0) _exit(77);
            const fp4d_status s = save_small(path, 1);
            _exit(s == FP4D_STATUS_IO && strstr(fp4d_last_error(), "Permission denied") ? 0 : 1);
        }
        int ws = 0;
        assert_int_equal(waitpid(pid, &ws, 0), pid);
        assert_true(WIFEXITED(ws));
        rc = WEXITSTATUS(ws);
    }
    size_t n = 0;
    char buf[16] = "";
    t = fopen(path, "r");
    assert_non_null(t);
    n = fread(buf, 1, sizeof buf - 1, t);
    fclose(t);
    const mode_t mode = mode_of(path);
    unlink(path);
    const int left = files_in(d); /* no temporary file left behind */
    rmdir(d);
    if (rc == 77) skip(); /* cannot become another user here */
    assert_int_equal(rc, 0);
    assert_int_equal(n, 4);
    assert_string_equal(buf, "keep");
    assert_int_equal(mode, 0444);
    assert_int_equal(left, 0);
}

static int teardown_dir(void **state)
{
    (void)state;
    const char *d = tmp_dir();
    DIR *dir = opendir(d);
    if (dir) {
        struct dirent *de;
        while ((de = readdir(dir))) {
            if (de->d_name[0] == '.') continue;
            char p[600];
            snprintf(p, sizeof p, "%s/%s", d, de->d_name);
            unlink(p);
        }
        closedir(dir);
    }
    rmdir(d);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_file_and_accessors),
        cmocka_unit_test(test_valid_edge_shapes),
        cmocka_unit_test(test_many_tensors_lookup),
        cmocka_unit_test(test_err_header_too_small),
        cmocka_unit_test(test_err_header_too_large),
        cmocka_unit_test(test_err_lfs_pointer),
        cmocka_unit_test(test_err_header_length),
        cmocka_unit_test(test_err_header_not_object),
        cmocka_unit_test(test_err_header_utf8),
        cmocka_unit_test(test_err_header_json),
        cmocka_unit_test(test_err_duplicate_key),
        cmocka_unit_test(test_err_unknown_dtype),
        cmocka_unit_test(test_err_metadata),
        cmocka_unit_test(test_err_shape_overflow),
        cmocka_unit_test(test_err_misaligned),
        cmocka_unit_test(test_err_offsets),
        cmocka_unit_test(test_err_size_mismatch),
        cmocka_unit_test(test_err_truncated_and_trailing),
        cmocka_unit_test(test_err_open),
        cmocka_unit_test(test_error_names_are_distinct),
        cmocka_unit_test(test_dtype_table),
        cmocka_unit_test(test_corruption_never_crashes),
        cmocka_unit_test(test_writer_layout_is_exact),
        cmocka_unit_test(test_writer_replaces_atomically),
        cmocka_unit_test(test_writer_output_modes),
        cmocka_unit_test(test_writer_refuses_read_only_output),
    };
    return cmocka_run_group_tests(tests, NULL, teardown_dir);
}
