/*
 * Block-scale layouts (spec §6): published check values, and every offset against an
 * independent construction of the swizzle as the reshape/permute that vLLM and FlashInfer
 * apply to a padded linear matrix (reshape(Rp/128, 4, 32, Cp/4, 4).permute(0,3,2,1,4)).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "fp4doctor/formats.h"

static int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

static void test_published_check_values(void **state)
{
    (void)state;
    /* nvmath-python docstring, M = K = 128 NVFP4 -> 128 x 8 scales. */
    assert_int_equal(fp4d_scale_offset(FP4D_LAYOUT_SWIZZLED_128X4, 128, 8, 5, 2), 82);
    assert_int_equal(fp4d_scale_offset(FP4D_LAYOUT_SWIZZLED_128X4, 128, 8, 5, 5), 593);
    assert_int_equal(fp4d_scale_offset(FP4D_LAYOUT_LINEAR, 128, 8, 5, 5), 45);
}

static void test_buffer_sizes(void **state)
{
    (void)state;
    assert_int_equal(fp4d_scale_buffer_size(FP4D_LAYOUT_LINEAR, 200, 5), 1000);
    assert_int_equal(fp4d_scale_buffer_size(FP4D_LAYOUT_SWIZZLED_128X4, 200, 5), 256 * 8);
    assert_int_equal(fp4d_scale_buffer_size(FP4D_LAYOUT_SWIZZLED_128X4, 128, 8), 1024);
    assert_int_equal(fp4d_scale_buffer_size(FP4D_LAYOUT_SWIZZLED_128X4, 1, 1), 512);
    assert_int_equal(fp4d_scale_buffer_size(FP4D_LAYOUT_SWIZZLED_8X4, 13, 3), 16 * 4);
    assert_int_equal(fp4d_scale_buffer_size(FP4D_LAYOUT_SWIZZLED_8X4, 0, 3), 0);
    /* Beyond FP4D_MAX_DIM the size is 0 (the products wrapped: 2^62 + 1 rows of a swizzled
     * layout came out as 512 bytes, and the conversion wrote far past them). */
    assert_int_equal(fp4d_scale_buffer_size(FP4D_LAYOUT_LINEAR, INT64_MAX / 2, 4), 0);
    assert_int_equal(fp4d_scale_buffer_size(FP4D_LAYOUT_SWIZZLED_128X4, INT64_MAX - 5, 1), 0);
    assert_int_equal(fp4d_scale_buffer_size(FP4D_LAYOUT_SWIZZLED_128X4, (INT64_C(1) << 62) + 1, 4), 0);
    assert_int_equal(fp4d_scale_buffer_size(FP4D_LAYOUT_LINEAR, FP4D_MAX_DIM, 2), (size_t)FP4D_MAX_DIM * 2);
    uint8_t src[8] = {1, 2, 3, 4, 5, 6, 7, 8}, dst[8] = {0};
    fp4d_scales_convert(FP4D_LAYOUT_LINEAR, src, FP4D_LAYOUT_SWIZZLED_128X4, dst, (INT64_C(1) << 62) + 1, 4);
    fp4d_scales_convert((fp4d_scale_layout)999, src, FP4D_LAYOUT_LINEAR, dst, 2, 4);
    for (int i = 0; i < 8; i++) assert_int_equal(dst[i], 0); /* nothing written */
    /* data sizes that do not fit are SIZE_MAX, not a wrapped small number */
    assert_true(fp4d_dtype_data_bytes(FP4D_DTYPE_F32, INT64_C(1) << 31, INT64_C(1) << 31) == SIZE_MAX);
    assert_true(fp4d_dtype_data_bytes(FP4D_DTYPE_NVFP4, INT64_MAX, INT64_MAX) == SIZE_MAX);
    assert_int_equal(fp4d_dtype_data_bytes(FP4D_DTYPE_NVFP4, 3, 32), 48);
}

/* For each byte of a swizzled buffer, which padded logical (row, col) it holds, computed
 * from the output side of the reshape/permute (the opposite direction from the library). */
static void swizzled_source_of(fp4d_scale_layout l, int64_t cp, int64_t i, int64_t *row, int64_t *col)
{
    if (l == FP4D_LAYOUT_SWIZZLED_128X4) {
        /* output dims (Rp/128, Cp/4, 32, 4, 4) = source dims (a, d, c, b, e) of
         * (Rp/128, 4, 32, Cp/4, 4): row = a*128 + d*32 + c, col = b*4 + e. */
        int64_t e = i % 4, d = (i / 4) % 4, c = (i / 16) % 32, b = (i / 512) % (cp / 4), a = i / (512 * (cp / 4));
        *row = a * 128 + d * 32 + c;
        *col = b * 4 + e;
    } else {
        /* 8x4: (Rp/8, 8, Cp/4, 4).permute(0, 2, 1, 3) -> output dims (Rp/8, Cp/4, 8, 4). */
        int64_t e = i % 4, r8 = (i / 4) % 8, b = (i / 32) % (cp / 4), a = i / (32 * (cp / 4));
        *row = a * 8 + r8;
        *col = b * 4 + e;
    }
}

static void check_layout_shape(fp4d_scale_layout l, int64_t rows, int64_t cols)
{
    const int64_t tile = l == FP4D_LAYOUT_SWIZZLED_128X4 ? 128 : 8;
    const int64_t rp = round_up(rows, tile), cp = round_up(cols, 4);
    const size_t size = fp4d_scale_buffer_size(l, rows, cols);
    assert_int_equal(size, (size_t)(rp * cp));
    for (int64_t i = 0; i < (int64_t)size; i++) {
        int64_t r, c;
        swizzled_source_of(l, cp, i, &r, &c);
        assert_true(r < rp && c < cp);
        if (r < rows && c < cols) assert_int_equal(fp4d_scale_offset(l, rows, cols, r, c), (size_t)i);
    }
}

static void test_offsets_match_reshape_permute(void **state)
{
    (void)state;
    const int64_t shapes[][2] = { { 128, 8 }, { 1, 1 }, { 130, 5 }, { 256, 4 }, { 300, 11 }, { 7, 3 }, { 513, 17 } };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        check_layout_shape(FP4D_LAYOUT_SWIZZLED_128X4, shapes[i][0], shapes[i][1]);
        check_layout_shape(FP4D_LAYOUT_SWIZZLED_8X4, shapes[i][0], shapes[i][1]);
    }
    /* spec §6 8x4 formula, one value by hand: r=9, c=5, C=8 -> 1*64 + 1*32 + 1*4 + 1 */
    assert_int_equal(fp4d_scale_offset(FP4D_LAYOUT_SWIZZLED_8X4, 16, 8, 9, 5), 101);
}

static void round_trip(fp4d_scale_layout l, int64_t rows, int64_t cols)
{
    const size_t n = (size_t)(rows * cols), sz = fp4d_scale_buffer_size(l, rows, cols);
    uint8_t *lin = malloc(n), *sw = malloc(sz), *back = malloc(n), *sw2 = malloc(sz);
    uint8_t *hit = calloc(sz, 1);
    assert_non_null(lin);
    assert_non_null(sw);
    assert_non_null(back);
    assert_non_null(sw2);
    assert_non_null(hit);
    for (size_t i = 0; i < n; i++) lin[i] = (uint8_t)(1 + (i * 37 + 11) % 250); /* never 0x00 */
    memset(sw, 0xAA, sz); /* padding must be overwritten with 0x00 */
    fp4d_scales_convert(FP4D_LAYOUT_LINEAR, lin, l, sw, rows, cols);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            size_t off = fp4d_scale_offset(l, rows, cols, r, c);
            assert_int_equal(sw[off], lin[r * cols + c]);
            hit[off] = 1;
        }
    for (size_t i = 0; i < sz; i++)
        if (!hit[i]) assert_int_equal(sw[i], 0x00);
    memset(back, 0xAA, n);
    fp4d_scales_convert(l, sw, FP4D_LAYOUT_LINEAR, back, rows, cols);
    assert_memory_equal(back, lin, n);
    /* swizzled -> same swizzled with garbage in the source padding: padding comes out 0 */
    for (size_t i = 0; i < sz; i++)
        if (!hit[i]) sw[i] = 0x55;
    fp4d_scales_convert(l, sw, l, sw2, rows, cols);
    for (size_t i = 0; i < sz; i++) assert_int_equal(sw2[i], hit[i] ? sw[i] : 0x00);
    free(lin);
    free(sw);
    free(back);
    free(sw2);
    free(hit);
}

static void test_round_trips_with_padding(void **state)
{
    (void)state;
    round_trip(FP4D_LAYOUT_SWIZZLED_128X4, 200, 5);   /* rows and cols both padded */
    round_trip(FP4D_LAYOUT_SWIZZLED_128X4, 128, 8);
    round_trip(FP4D_LAYOUT_SWIZZLED_128X4, 3, 2);
    round_trip(FP4D_LAYOUT_SWIZZLED_8X4, 13, 3);
    round_trip(FP4D_LAYOUT_SWIZZLED_8X4, 64, 16);
}

static void test_swizzled_to_swizzled(void **state)
{
    (void)state;
    const int64_t rows = 77, cols = 6;
    uint8_t lin[77 * 6], back[77 * 6];
    uint8_t *a = malloc(fp4d_scale_buffer_size(FP4D_LAYOUT_SWIZZLED_128X4, rows, cols));
    uint8_t *b = malloc(fp4d_scale_buffer_size(FP4D_LAYOUT_SWIZZLED_8X4, rows, cols));
    assert_non_null(a);
    assert_non_null(b);
    for (size_t i = 0; i < sizeof lin; i++) lin[i] = (uint8_t)(i * 13 + 1);
    fp4d_scales_convert(FP4D_LAYOUT_LINEAR, lin, FP4D_LAYOUT_SWIZZLED_128X4, a, rows, cols);
    fp4d_scales_convert(FP4D_LAYOUT_SWIZZLED_128X4, a, FP4D_LAYOUT_SWIZZLED_8X4, b, rows, cols);
    fp4d_scales_convert(FP4D_LAYOUT_SWIZZLED_8X4, b, FP4D_LAYOUT_LINEAR, back, rows, cols);
    assert_memory_equal(back, lin, sizeof lin);
    free(a);
    free(b);
}

static void test_layout_names(void **state)
{
    (void)state;
    fp4d_scale_layout l;
    assert_string_equal(fp4d_scale_layout_name(FP4D_LAYOUT_LINEAR), "linear");
    assert_string_equal(fp4d_scale_layout_name(FP4D_LAYOUT_SWIZZLED_128X4), "swizzled");
    assert_string_equal(fp4d_scale_layout_name(FP4D_LAYOUT_SWIZZLED_8X4), "swizzled8x4");
    for (int i = 0; i < FP4D_LAYOUT_COUNT; i++) {
        assert_true(fp4d_scale_layout_from_name(fp4d_scale_layout_name((fp4d_scale_layout)i), &l));
        assert_int_equal(l, i);
    }
    assert_true(fp4d_scale_layout_from_name("128x4", &l));
    assert_int_equal(l, FP4D_LAYOUT_SWIZZLED_128X4);
    assert_true(fp4d_scale_layout_from_name("8x4", &l));
    assert_int_equal(l, FP4D_LAYOUT_SWIZZLED_8X4);
    assert_false(fp4d_scale_layout_from_name("tiled", &l));
    assert_false(fp4d_scale_layout_from_name(NULL, &l));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_published_check_values),
        cmocka_unit_test(test_buffer_sizes),
        cmocka_unit_test(test_offsets_match_reshape_permute),
        cmocka_unit_test(test_round_trips_with_padding),
        cmocka_unit_test(test_swizzled_to_swizzled),
        cmocka_unit_test(test_layout_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
