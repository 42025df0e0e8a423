/* Loading ModelOpt-named quantized tensors (X, X_scale, X_scale_2) as GEMM operands. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "cli_fp4_tensor.h"

fp4d_st_dtype cli_st_dtype_of(fp4d_dtype t)
{
    return t == FP4D_DTYPE_BF16 ? FP4D_ST_BF16 : t == FP4D_DTYPE_F16 ? FP4D_ST_F16 : FP4D_ST_F32;
}

bool cli_plain_dtype_of(fp4d_st_dtype t, fp4d_dtype *out)
{
    switch (t) {
    case FP4D_ST_F32: *out = FP4D_DTYPE_F32; return true;
    case FP4D_ST_BF16: *out = FP4D_DTYPE_BF16; return true;
    case FP4D_ST_F16: *out = FP4D_DTYPE_F16; return true;
    default: return false;
    }
}

/* (Fixed buffers here cut names of 1016+ bytes, and a cut name found no companion: the
 * per-tensor scale went unapplied, or the tensor was copied as if not quantized, exit 0.) */
static const fp4d_st_tensor *find_suffixed(const fp4d_st_file *f, const char *name, const char *suffix)
{
    char *full = cli_joined(name, suffix);
    const fp4d_st_tensor *t = full ? fp4d_st_find(f, full) : NULL;
    free(full);
    return t;
}

static const char *meta_for(const fp4d_st_file *f, const char *prefix, const char *name)
{
    char *key = cli_joined(prefix, name);
    const char *v = key ? fp4d_st_metadata(f, key) : NULL;
    free(key);
    return v;
}

bool cli_is_quantized(const fp4d_st_file *f, const char *name)
{
    const fp4d_st_tensor *t = fp4d_st_find(f, name);
    return t && t->dtype == FP4D_ST_U8 && find_suffixed(f, name, "_scale") != NULL;
}

bool cli_same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    if (stat(a, &sa) != 0 || stat(b, &sb) != 0) return false;
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

#define FAIL(...)                                   \
    do {                                            \
        snprintf(msg, msg_len, __VA_ARGS__);        \
        cli_operand_free(op);                       \
        return false;                               \
    } while (0)

static bool load_plain(const fp4d_st_tensor *t, fp4d_dtype dt, cli_operand *op, char *msg, size_t msg_len)
{
    if (t->ndim != 2 || t->shape[0] < 1 || t->shape[1] < 1)
        FAIL("tensor '%s' is %s with %d dimensions; a GEMM operand must be 2-D and non-empty", t->name,
             fp4d_st_dtype_name(t->dtype), (int)t->ndim);
    /* The mapping gives no alignment guarantee for an arbitrary file: copy. */
    op->owned_data = malloc(t->nbytes ? t->nbytes : 1);
    if (!op->owned_data) FAIL("out of memory loading '%s'", t->name);
    memcpy(op->owned_data, t->data, t->nbytes);
    op->m = (fp4d_matrix){dt, t->shape[0], t->shape[1], op->owned_data, NULL, FP4D_LAYOUT_LINEAR};
    op->scale_2 = 1.0f;
    return true;
}

bool cli_load_operand(const fp4d_st_file *f, const char *name, bool allow_plain, cli_operand *op, char *msg,
                      size_t msg_len)
{
    memset(op, 0, sizeof *op);
    op->scale_2 = 1.0f;
    const fp4d_st_tensor *t = fp4d_st_find(f, name);
    if (!t) FAIL("no tensor named '%s' in the file", name);
    fp4d_dtype plain;
    if (cli_plain_dtype_of(t->dtype, &plain)) {
        if (!allow_plain)
            FAIL("tensor '%s' is %s, but this operand must be quantized (U8 codes with '%s_scale')", name,
                 fp4d_st_dtype_name(t->dtype), name);
        return load_plain(t, plain, op, msg, msg_len);
    }
    if (t->dtype != FP4D_ST_U8)
        FAIL("tensor '%s' is %s: expected U8 packed FP4 codes%s", name, fp4d_st_dtype_name(t->dtype),
             allow_plain ? " or an F32/BF16/F16 matrix" : "");
    if (t->ndim != 2)
        FAIL("quantized tensor '%s' must be 2-D [rows, K/2], has %d dimensions", name, (int)t->ndim);
    if (t->shape[0] < 1 || t->shape[1] < 1)
        FAIL("quantized tensor '%s' is empty ([%lld, %lld]); it must have at least one row and one code byte", name,
             (long long)t->shape[0], (long long)t->shape[1]);
    const fp4d_st_tensor *s = find_suffixed(f, name, "_scale");
    if (!s) FAIL("tensor '%s' is U8 but has no '%s_scale' block scales", name, name);
    int64_t rows = t->shape[0], K = 2 * t->shape[1];

    /* Format: the scale dtype says it (F8_E4M3 = NVFP4, F8_E8M0 = MXFP4); U8 scales are
     * MXFP4 (ModelOpt/gpt-oss) unless metadata or the K/16 shape says NVFP4. */
    const char *meta_fmt = meta_for(f, CLI_META_FORMAT, name);
    fp4d_dtype fmt;
    if (s->dtype == FP4D_ST_F8_E4M3) fmt = FP4D_DTYPE_NVFP4;
    else if (s->dtype == FP4D_ST_F8_E8M0) fmt = FP4D_DTYPE_MXFP4;
    else if (s->dtype == FP4D_ST_U8) {
        /* names compare as everywhere else (case-insensitive): "NVFP4" on U8 scales was
         * refused as contradicting them */
        fp4d_dtype named;
        const bool has_named = meta_fmt && fp4d_dtype_from_name(meta_fmt, &named);
        if (has_named && named == FP4D_DTYPE_NVFP4) fmt = FP4D_DTYPE_NVFP4;
        else if (has_named && named == FP4D_DTYPE_MXFP4) fmt = FP4D_DTYPE_MXFP4;
        else if (s->ndim == 2 && s->shape[0] == rows && s->shape[1] == K / 16) fmt = FP4D_DTYPE_NVFP4;
        else fmt = FP4D_DTYPE_MXFP4;
    } else {
        FAIL("block scales '%s_scale' are %s: expected F8_E4M3 (NVFP4) or U8/F8_E8M0 (MXFP4)", name,
             fp4d_st_dtype_name(s->dtype));
    }
    if (meta_fmt) {
        fp4d_dtype declared;
        if (!fp4d_dtype_from_name(meta_fmt, &declared) || declared != fmt)
            FAIL("metadata says '%s' is %s but its scales '%s_scale' are %s", name, meta_fmt, name,
                 fp4d_st_dtype_name(s->dtype));
    }
    const fp4d_dtype_traits *tr = fp4d_dtype_get(fmt);
    if (K % tr->block_size != 0)
        FAIL("tensor '%s' has K = %lld, not a multiple of the %s block size %u", name, (long long)K, tr->name,
             tr->block_size);

    fp4d_scale_layout layout = FP4D_LAYOUT_LINEAR;
    const char *meta_layout = meta_for(f, CLI_META_SCALE_LAYOUT, name);
    if (meta_layout && !fp4d_scale_layout_from_name(meta_layout, &layout))
        FAIL("metadata gives '%s' an unknown scale layout '%s'", name, meta_layout);
    int64_t scale_cols = K / tr->block_size;
    size_t want = fp4d_scale_buffer_size(layout, rows, scale_cols);
    if (layout == FP4D_LAYOUT_LINEAR &&
        (s->ndim != 2 || s->shape[0] != rows || s->shape[1] != scale_cols))
        FAIL("block scales '%s_scale' should be [%lld, %lld] for %s [%lld, %lld] codes (K = %lld)", name,
             (long long)rows, (long long)scale_cols, tr->name, (long long)rows, (long long)(K / 2), (long long)K);
    if (s->nbytes != want)
        FAIL("block scales '%s_scale' hold %llu bytes; %s layout of [%lld, %lld] scales needs %zu", name,
             (unsigned long long)s->nbytes, fp4d_scale_layout_name(layout), (long long)rows, (long long)scale_cols,
             want);

    const fp4d_st_tensor *s2 = find_suffixed(f, name, "_scale_2");
    if (s2) {
        if (s2->dtype != FP4D_ST_F32 || fp4d_st_element_count(s2) != 1)
            FAIL("'%s_scale_2' must be one F32 value ([] or [1]), is %s with %llu elements", name,
                 fp4d_st_dtype_name(s2->dtype), (unsigned long long)fp4d_st_element_count(s2));
        memcpy(&op->scale_2, s2->data, 4);
        op->has_scale_2 = true;
    }
    op->m = (fp4d_matrix){fmt, rows, K, t->data, s->data, layout};
    return true;
}

void cli_operand_free(cli_operand *op)
{
    if (!op) return;
    free(op->owned_data);
    op->owned_data = NULL;
}
