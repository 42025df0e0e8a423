/*
 * Block-scale layouts (spec §6): linear, cuBLAS/CUTLASS 128x4 swizzle, TRT-LLM-gen 8x4.
 *
 * A swizzled buffer is a row-major array of tiles: [Rp/T][Cp/4][...] where T is the tile
 * height (128 or 8) and Cp the scale columns rounded up to 4. Inside a 128x4 tile
 * (512 bytes) row r sits at (r%32)*16 + ((r/32)%4)*4, so the four 32-row groups of one
 * scale column are interleaved; the 8x4 tile (32 bytes) is plain row-major.
 */
#include <string.h>
#include <strings.h>

#include "fp4doctor/formats.h"

static const char *const layout_names[FP4D_LAYOUT_COUNT] = {
    [FP4D_LAYOUT_LINEAR]         = "linear",
    [FP4D_LAYOUT_SWIZZLED_128X4] = "swizzled",
    [FP4D_LAYOUT_SWIZZLED_8X4]   = "swizzled8x4",
};

const char *fp4d_scale_layout_name(fp4d_scale_layout l)
{
    if ((unsigned)l >= FP4D_LAYOUT_COUNT) return "unknown";
    return layout_names[l];
}

bool fp4d_scale_layout_from_name(const char *name, fp4d_scale_layout *out)
{
    static const struct { const char *name; fp4d_scale_layout l; } names[] = {
        { "linear", FP4D_LAYOUT_LINEAR },
        { "swizzled", FP4D_LAYOUT_SWIZZLED_128X4 },   { "128x4", FP4D_LAYOUT_SWIZZLED_128X4 },
        { "swizzled128x4", FP4D_LAYOUT_SWIZZLED_128X4 },
        { "swizzled8x4", FP4D_LAYOUT_SWIZZLED_8X4 },  { "8x4", FP4D_LAYOUT_SWIZZLED_8X4 },
    };
    if (!name) return false;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strcasecmp(name, names[i].name) == 0) {
            if (out) *out = names[i].l;
            return true;
        }
    }
    return false;
}

static int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

size_t fp4d_scale_buffer_size(fp4d_scale_layout l, int64_t rows, int64_t scale_cols)
{
    /* within FP4D_MAX_DIM both products below stay far inside int64_t */
    if (rows < 0 || scale_cols < 0 || rows > FP4D_MAX_DIM || scale_cols > FP4D_MAX_DIM) return 0;
    switch (l) {
    case FP4D_LAYOUT_LINEAR:
        return (size_t)(rows * scale_cols);
    case FP4D_LAYOUT_SWIZZLED_128X4:
        return (size_t)(round_up(rows, 128) * round_up(scale_cols, 4));
    case FP4D_LAYOUT_SWIZZLED_8X4:
        return (size_t)(round_up(rows, 8) * round_up(scale_cols, 4));
    default:
        return 0;
    }
}

size_t fp4d_scale_offset(fp4d_scale_layout l, int64_t rows, int64_t scale_cols, int64_t r, int64_t c)
{
    (void)rows;
    int64_t cp = round_up(scale_cols, 4);
    switch (l) {
    case FP4D_LAYOUT_SWIZZLED_128X4:
        return (size_t)((r / 128) * (128 * cp) + (c / 4) * 512 + (r % 32) * 16 + ((r / 32) % 4) * 4 + (c % 4));
    case FP4D_LAYOUT_SWIZZLED_8X4:
        return (size_t)((r / 8) * (8 * cp) + (c / 4) * 32 + (r % 8) * 4 + (c % 4));
    case FP4D_LAYOUT_LINEAR:
    default:
        return (size_t)(r * scale_cols + c);
    }
}

void fp4d_scales_convert(fp4d_scale_layout src_layout, const uint8_t *src,
                         fp4d_scale_layout dst_layout, uint8_t *dst,
                         int64_t rows, int64_t scale_cols)
{
    size_t dst_size = fp4d_scale_buffer_size(dst_layout, rows, scale_cols);
    if (dst_size == 0 || (unsigned)src_layout >= FP4D_LAYOUT_COUNT) return;
    if (dst_layout != FP4D_LAYOUT_LINEAR) memset(dst, 0, dst_size); /* padding = 0x00 */
    if (src_layout == dst_layout) {
        /* Same layout: copy the logical bytes only, so src padding never leaks into dst. */
        if (src_layout == FP4D_LAYOUT_LINEAR) {
            memcpy(dst, src, dst_size);
            return;
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < scale_cols; c++) {
            dst[fp4d_scale_offset(dst_layout, rows, scale_cols, r, c)] =
                src[fp4d_scale_offset(src_layout, rows, scale_cols, r, c)];
        }
    }
}
