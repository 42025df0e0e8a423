/*
 * fp4doctor quantize / dequantize (docs/cli.md): safetensors files in and out, ModelOpt
 * naming. The input is only ever mapped read-only; the output is written to a temporary
 * file and renamed, and may not be the input.
 */
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_fp4_tensor.h"
#include "fp4doctor/formats.h"
#include "fp4doctor/io.h"

/* ---- shared bits ------------------------------------------------------------------------- */

/* Buffers that must live until the writer has saved. */
typedef struct owned_list {
    void  **ptrs;
    size_t  count, cap;
} owned_list;

static void *owned_alloc(owned_list *l, size_t bytes)
{
    if (l->count == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        void **p = realloc(l->ptrs, cap * sizeof *p);
        if (!p) return NULL;
        l->ptrs = p;
        l->cap = cap;
    }
    void *b = malloc(bytes ? bytes : 1);
    if (b) l->ptrs[l->count++] = b;
    return b;
}

static void owned_free_all(owned_list *l)
{
    for (size_t i = 0; i < l->count; i++) free(l->ptrs[i]);
    free(l->ptrs);
    memset(l, 0, sizeof *l);
}

static size_t tensor_index(const fp4d_st_file *f, const fp4d_st_tensor *t) { return (size_t)(t - fp4d_st_get(f, 0)); }

/* Copies the input's __metadata__, leaving out fp4doctor's own keys for the tensors in
 * drop (NULL-terminated by count) so stale layout notes do not survive a conversion. */
static int copy_metadata(const char *cmd, const fp4d_st_file *in, fp4d_st_writer *w, const bool *drop_tensor)
{
    for (size_t i = 0; i < fp4d_st_metadata_count(in); i++) {
        const char *key = fp4d_st_metadata_key(in, i);
        bool ours = false;
        const char *prefixes[] = {CLI_META_FORMAT, CLI_META_SCALE_LAYOUT, CLI_META_CONVENTION};
        for (size_t p = 0; p < 3 && drop_tensor; p++) {
            size_t n = strlen(prefixes[p]);
            if (strncmp(key, prefixes[p], n)) continue;
            const fp4d_st_tensor *t = fp4d_st_find(in, key + n);
            if (t && drop_tensor[tensor_index(in, t)]) ours = true;
        }
        if (ours) continue;
        if (fp4d_st_writer_set_metadata(w, key, fp4d_st_metadata(in, key)) != FP4D_STATUS_OK)
            return cli_fail(FP4D_EXIT_INTERNAL, cmd, "%s", fp4d_last_error());
    }
    return FP4D_EXIT_OK;
}

static int set_meta_for(const char *cmd, fp4d_st_writer *w, const char *prefix, const char *name, const char *value)
{
    char *key = cli_joined(prefix, name);
    if (!key) return cli_fail(FP4D_EXIT_INTERNAL, cmd, "out of memory");
    fp4d_status s = fp4d_st_writer_set_metadata(w, key, value);
    free(key);
    if (s != FP4D_STATUS_OK) return cli_fail(FP4D_EXIT_INTERNAL, cmd, "%s", fp4d_last_error());
    return FP4D_EXIT_OK;
}

static int save_or_fail(const char *cmd, fp4d_st_writer *w, const char *path)
{
    if (fp4d_st_writer_save(w, path) != FP4D_STATUS_OK)
        return cli_fail(FP4D_EXIT_INPUT, cmd, "%s", fp4d_last_error());
    return FP4D_EXIT_OK;
}

/* ---- quantize ------------------------------------------------------------------------------ */

static void quantize_usage(FILE *f)
{
    fprintf(f,
            "usage: fp4doctor quantize [--format nvfp4|mxfp4] [--convention NAME]\n"
            "                          [--scale-layout linear|swizzled|swizzled8x4] [--tensor NAME]... IN.safetensors OUT.safetensors\n\n"
            "Quantizes every F32/BF16/F16 2-D tensor of IN whose row length is a multiple of the block\n"
            "size (or only the --tensor ones) and writes OUT with ModelOpt naming:\n"
            "  X          U8       [rows, K/2]   packed e2m1 codes, even element in the low nibble\n"
            "  X_scale    F8_E4M3  [rows, K/16]  NVFP4 block scales  (U8 [rows, K/32] E8M0 for MXFP4)\n"
            "  X_scale_2  F32      []            NVFP4 decode scale amax/2688 (not written for MXFP4)\n"
            "Every other tensor is copied unchanged. With --scale-layout swizzled, X_scale holds the padded\n"
            "128x4 buffer [ceil(rows/128)*128, ceil(K/16/4)*4] and __metadata__ records\n"
            "\"fp4doctor.scale_layout.X\": \"swizzled\".\n\n"
            "options:\n"
            "  --format F          nvfp4 (default) or mxfp4\n"
            "  --convention NAME   flashinfer-exact (default), trtllm, modelopt, torchao, compressed-tensors,\n"
            "                      ocp (mxfp4 only)\n"
            "  --scale-layout L    linear (default), swizzled (128x4) or swizzled8x4\n"
            "  --tensor NAME       quantize only this tensor (repeatable)\n\n"
            "exit codes: 0 written, 2 usage error, 3 unreadable input or a tensor that cannot be quantized,\n"
            "            4 out of memory or file descriptors\n");
}

typedef struct quant_opts {
    fp4d_quantize_params params;
    const char         **names;
    size_t               num_names;
    const char          *in, *out;
} quant_opts;

/* Why tensor t cannot be quantized into fmt, or NULL. */
static const char *not_quantizable(const fp4d_st_tensor *t, fp4d_dtype fmt)
{
    fp4d_dtype plain;
    if (!cli_plain_dtype_of(t->dtype, &plain)) return "not F32, BF16 or F16";
    if (t->ndim != 2) return "not 2-D";
    if (t->shape[0] < 1 || t->shape[1] < 1) return "empty";
    if (t->shape[1] % (int64_t)fp4d_dtype_get(fmt)->block_size != 0)
        return fmt == FP4D_DTYPE_NVFP4 ? "row length not a multiple of 16" : "row length not a multiple of 32";
    return NULL;
}

/* Quantizes t and adds X, X_scale (and X_scale_2) to w. */
static int quantize_one(const char *cmd, const quant_opts *o, const fp4d_st_tensor *t, fp4d_st_writer *w,
                        owned_list *owned)
{
    fp4d_dtype src_type;
    cli_plain_dtype_of(t->dtype, &src_type);
    const fp4d_dtype_traits *tr = fp4d_dtype_get(o->params.format);
    int64_t rows = t->shape[0], cols = t->shape[1], scale_cols = cols / tr->block_size;
    size_t code_bytes = (size_t)(rows * (cols / 2));
    size_t scale_bytes = fp4d_scale_buffer_size(o->params.scale_layout, rows, scale_cols);
    uint8_t *codes = owned_alloc(owned, code_bytes);
    uint8_t *scales = owned_alloc(owned, scale_bytes);
    float *scale_2 = owned_alloc(owned, sizeof(float));
    if (!codes || !scales || !scale_2) return cli_fail(FP4D_EXIT_INTERNAL, cmd, "out of memory for '%s'", t->name);
    /* The source is read in place where the mapping is aligned for its type (it is, in files
     * whose header length is a multiple of 8), else through a copy freed at once: the copies
     * used to live until the file was saved, so a checkpoint took its own size again in
     * memory on top of the mapping and the output. */
    const size_t elem = src_type == FP4D_DTYPE_F32 ? 4 : 2;
    void *copy = NULL;
    const void *src = t->data;
    if ((uintptr_t)t->data % elem != 0) {
        copy = malloc(t->nbytes);
        if (!copy) return cli_fail(FP4D_EXIT_INTERNAL, cmd, "out of memory for '%s'", t->name);
        memcpy(copy, t->data, t->nbytes);
        src = copy;
    }
    fp4d_quantize_result res;
    const fp4d_status qs = fp4d_quantize(&o->params, src_type, src, rows, cols, codes, scales, &res);
    free(copy);
    if (qs != FP4D_STATUS_OK)
        return cli_fail(FP4D_EXIT_INPUT, cmd, "cannot quantize '%s': %s", t->name, fp4d_last_error());
    *scale_2 = res.decode_scale;

    char *scale_name = cli_joined(t->name, "_scale"), *scale2_name = cli_joined(t->name, "_scale_2");
    if (!scale_name || !scale2_name) {
        free(scale_name);
        free(scale2_name);
        return cli_fail(FP4D_EXIT_INTERNAL, cmd, "out of memory");
    }
    int64_t code_shape[2] = {rows, cols / 2};
    int64_t scale_shape[2] = {rows, scale_cols};
    if (o->params.scale_layout != FP4D_LAYOUT_LINEAR) { /* the padded buffer's own shape */
        scale_shape[1] = (scale_cols + 3) / 4 * 4;
        scale_shape[0] = (int64_t)scale_bytes / scale_shape[1];
    }
    fp4d_st_dtype scale_dtype = o->params.format == FP4D_DTYPE_NVFP4 ? FP4D_ST_F8_E4M3 : FP4D_ST_U8;
    fp4d_status s = fp4d_st_writer_add(w, t->name, FP4D_ST_U8, 2, code_shape, codes, code_bytes);
    if (s == FP4D_STATUS_OK) s = fp4d_st_writer_add(w, scale_name, scale_dtype, 2, scale_shape, scales, scale_bytes);
    if (s == FP4D_STATUS_OK && o->params.format == FP4D_DTYPE_NVFP4)
        s = fp4d_st_writer_add(w, scale2_name, FP4D_ST_F32, 0, NULL, scale_2, 4);
    free(scale_name);
    free(scale2_name);
    if (s != FP4D_STATUS_OK) return cli_fail(FP4D_EXIT_INPUT, cmd, "%s", fp4d_last_error());

    int rc = set_meta_for(cmd, w, CLI_META_FORMAT, t->name, tr->name);
    if (!rc) rc = set_meta_for(cmd, w, CLI_META_SCALE_LAYOUT, t->name, fp4d_scale_layout_name(o->params.scale_layout));
    if (!rc) rc = set_meta_for(cmd, w, CLI_META_CONVENTION, t->name, fp4d_convention_name(o->params.convention));
    return rc;
}

static int quantize_file(const char *cmd, const quant_opts *o, const fp4d_st_file *in)
{
    size_t n = fp4d_st_count(in);
    bool *selected = calloc(n ? n : 1, 1);
    if (!selected) return cli_fail(FP4D_EXIT_INTERNAL, cmd, "out of memory");
    int rc = FP4D_EXIT_OK;
    if (o->num_names) {
        for (size_t i = 0; i < o->num_names && !rc; i++) {
            const fp4d_st_tensor *t = fp4d_st_find(in, o->names[i]);
            const char *why = t ? not_quantizable(t, o->params.format) : NULL;
            if (!t) rc = cli_fail(FP4D_EXIT_INPUT, cmd, "no tensor named '%s' in %s", o->names[i], o->in);
            else if (why) rc = cli_fail(FP4D_EXIT_INPUT, cmd, "tensor '%s' (%s, %d-D) cannot be quantized to %s: %s",
                                        t->name, fp4d_st_dtype_name(t->dtype), (int)t->ndim,
                                        fp4d_dtype_get(o->params.format)->name, why);
            else selected[tensor_index(in, t)] = true;
        }
    } else {
        for (size_t i = 0; i < n; i++) selected[i] = not_quantizable(fp4d_st_get(in, i), o->params.format) == NULL;
    }
    /* The companions must not collide with tensors that are copied through. */
    for (size_t i = 0; i < n && !rc; i++) {
        if (!selected[i]) continue;
        const char *suffixes[2] = {"_scale", "_scale_2"};
        for (int j = 0; j < 2 && !rc; j++) {
            char *c = cli_joined(fp4d_st_get(in, i)->name, suffixes[j]);
            if (c && fp4d_st_find(in, c))
                rc = cli_fail(FP4D_EXIT_INPUT, cmd, "cannot quantize '%s': the input already has a tensor '%s'",
                              fp4d_st_get(in, i)->name, c);
            free(c);
        }
    }

    fp4d_st_writer *w = rc ? NULL : fp4d_st_writer_new();
    owned_list owned = {0};
    size_t quantized = 0, copied = 0;
    if (!rc && !w) rc = cli_fail(FP4D_EXIT_INTERNAL, cmd, "out of memory");
    if (!rc) rc = copy_metadata(cmd, in, w, selected);
    for (size_t i = 0; i < n && !rc; i++) {
        const fp4d_st_tensor *t = fp4d_st_get(in, i);
        if (selected[i]) {
            rc = quantize_one(cmd, o, t, w, &owned);
            quantized++;
        } else {
            if (fp4d_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes) != FP4D_STATUS_OK)
                rc = cli_fail(FP4D_EXIT_INPUT, cmd, "%s", fp4d_last_error());
            copied++;
        }
    }
    if (!rc) rc = save_or_fail(cmd, w, o->out);
    if (!rc)
        printf("quantized %zu tensor%s to %s (%s, %s scales), copied %zu unchanged: %s\n", quantized,
               quantized == 1 ? "" : "s", fp4d_dtype_get(o->params.format)->name,
               fp4d_convention_name(o->params.convention), fp4d_scale_layout_name(o->params.scale_layout), copied,
               o->out);
    fp4d_st_writer_free(w);
    owned_free_all(&owned);
    free(selected);
    return rc;
}

int cmd_quantize(int argc, char **argv)
{
    const char *cmd = argv[0];
    static const struct option longopts[] = {
        {"format", required_argument, NULL, 'f'},     {"convention", required_argument, NULL, 'c'},
        {"scale-layout", required_argument, NULL, 'l'}, {"tensor", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},             {NULL, 0, NULL, 0},
    };
    quant_opts o = {{FP4D_DTYPE_NVFP4, FP4D_CONV_FLASHINFER_EXACT, FP4D_LAYOUT_LINEAR, 0.0f}, NULL, 0, NULL, NULL};
    const char **names = calloc((size_t)argc + 1, sizeof *names);
    if (!names) return cli_fail(FP4D_EXIT_INTERNAL, cmd, "out of memory");
    o.names = names;
    int rc = -1, c;
    optind = 1;
    opterr = 0;
    while (rc < 0 && (c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 'f':
            if (!fp4d_dtype_from_name(optarg, &o.params.format) ||
                (o.params.format != FP4D_DTYPE_NVFP4 && o.params.format != FP4D_DTYPE_MXFP4))
                rc = cli_fail(FP4D_EXIT_USAGE, cmd, "--format must be nvfp4 or mxfp4, not '%s'", optarg);
            break;
        case 'c':
            if (!fp4d_convention_from_name(optarg, &o.params.convention))
                rc = cli_fail(FP4D_EXIT_USAGE, cmd, "unknown --convention '%s' (see fp4doctor quantize --help)", optarg);
            break;
        case 'l':
            if (!fp4d_scale_layout_from_name(optarg, &o.params.scale_layout))
                rc = cli_fail(FP4D_EXIT_USAGE, cmd, "--scale-layout must be linear, swizzled or swizzled8x4, not '%s'", optarg);
            break;
        case 't': names[o.num_names++] = optarg; break;
        case 'h':
            quantize_usage(stdout);
            rc = FP4D_EXIT_OK;
            break;
        default:
            rc = cli_fail(FP4D_EXIT_USAGE, cmd, "unknown or incomplete option '%s' (see fp4doctor quantize --help)",
                          argv[optind - 1]);
        }
    }
    if (rc < 0 && argc - optind != 2)
        rc = cli_fail(FP4D_EXIT_USAGE, cmd, "expected IN.safetensors OUT.safetensors (see fp4doctor quantize --help)");
    if (rc < 0 && !fp4d_convention_supports(o.params.convention, o.params.format))
        rc = cli_fail(FP4D_EXIT_USAGE, cmd, "convention '%s' is not defined for %s",
                      fp4d_convention_name(o.params.convention), fp4d_dtype_get(o.params.format)->name);
    if (rc < 0) {
        o.in = argv[optind];
        o.out = argv[optind + 1];
        if (!o.out[0]) { /* the writer's own words for it ("empty path") were exit 3 */
            rc = cli_fail(FP4D_EXIT_USAGE, cmd, "OUT is an empty path");
        } else if (cli_same_file(o.in, o.out)) {
            rc = cli_fail(FP4D_EXIT_USAGE, cmd, "OUT is the same file as IN ('%s'): refusing to overwrite the input",
                          o.out);
        } else {
            fp4d_st_open_result res;
            fp4d_st_file *in = fp4d_st_open(o.in, &res);
            if (!in) rc = cli_open_failed(cmd, &res);
            else rc = quantize_file(cmd, &o, in);
            fp4d_st_close(in);
        }
    }
    free(names);
    return rc;
}

/* ---- dequantize ---------------------------------------------------------------------------- */

static void dequantize_usage(FILE *f)
{
    fprintf(f,
            "usage: fp4doctor dequantize IN.safetensors OUT.safetensors\n\n"
            "Turns every quantized tensor X of IN (U8 codes X with block scales X_scale and, for NVFP4,\n"
            "the decode scale X_scale_2) into an F32 tensor X = e2m1 * scale * scale_2, each product rounded\n"
            "to f32. X_scale and X_scale_2 are dropped; every other tensor is copied unchanged.\n"
            "NVFP4 vs MXFP4 comes from the scale dtype (F8_E4M3 vs U8/F8_E8M0) and shape (K/16 vs K/32);\n"
            "the scale layout from \"fp4doctor.scale_layout.X\" in __metadata__ (default linear).\n\n"
            "exit codes: 0 written, 2 usage error, 3 unreadable input or an inconsistent quantized tensor\n");
}

static int dequantize_file(const char *cmd, const char *in_path, const char *out_path, const fp4d_st_file *in)
{
    size_t n = fp4d_st_count(in);
    bool *quant = calloc(n ? n : 1, 1), *consumed = calloc(n ? n : 1, 1);
    fp4d_st_writer *w = fp4d_st_writer_new();
    owned_list owned = {0};
    int rc = FP4D_EXIT_OK;
    if (!quant || !consumed || !w) rc = cli_fail(FP4D_EXIT_INTERNAL, cmd, "out of memory");
    for (size_t i = 0; i < n && !rc; i++) {
        const char *name = fp4d_st_get(in, i)->name;
        if (!cli_is_quantized(in, name)) continue;
        quant[i] = true;
        const char *suffixes[2] = {"_scale", "_scale_2"};
        for (int j = 0; j < 2; j++) {
            char *c = cli_joined(name, suffixes[j]);
            const fp4d_st_tensor *t = c ? fp4d_st_find(in, c) : NULL;
            if (t) consumed[tensor_index(in, t)] = true;
            free(c);
        }
    }
    for (size_t i = 0; i < n && !rc; i++)
        if (quant[i] && consumed[i])
            rc = cli_fail(FP4D_EXIT_INPUT, cmd, "tensor '%s' is both quantized codes and another tensor's scales",
                          fp4d_st_get(in, i)->name);
    if (!rc) rc = copy_metadata(cmd, in, w, quant);
    size_t converted = 0, copied = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        const fp4d_st_tensor *t = fp4d_st_get(in, i);
        if (consumed[i]) continue;
        if (!quant[i]) {
            if (fp4d_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes) != FP4D_STATUS_OK)
                rc = cli_fail(FP4D_EXIT_INPUT, cmd, "%s", fp4d_last_error());
            copied++;
            continue;
        }
        cli_operand op;
        char msg[512];
        if (!cli_load_operand(in, t->name, false, &op, msg, sizeof msg)) {
            rc = cli_fail(FP4D_EXIT_INPUT, cmd, "%s: %s", in_path, msg);
            break;
        }
        int64_t rows = op.m.rows, K = op.m.cols;
        float *dst = owned_alloc(&owned, (size_t)(rows * K) * sizeof(float));
        if (!dst) {
            rc = cli_fail(FP4D_EXIT_INTERNAL, cmd, "out of memory for '%s'", t->name);
            break;
        }
        if (fp4d_dequantize(op.m.dtype, op.m.scale_layout, op.m.data, op.m.scales, op.scale_2, rows, K, dst) !=
            FP4D_STATUS_OK) {
            rc = cli_fail(FP4D_EXIT_INPUT, cmd, "cannot dequantize '%s': %s", t->name, fp4d_last_error());
            break;
        }
        /* MXFP4 has no tensor scale; if a file carries one anyway, honour it as gemm does. */
        if (op.m.dtype == FP4D_DTYPE_MXFP4 && op.has_scale_2)
            for (int64_t j = 0; j < rows * K; j++) dst[j] *= op.scale_2;
        int64_t shape[2] = {rows, K};
        if (fp4d_st_writer_add(w, t->name, FP4D_ST_F32, 2, shape, dst, (uint64_t)(rows * K) * 4) != FP4D_STATUS_OK)
            rc = cli_fail(FP4D_EXIT_INPUT, cmd, "%s", fp4d_last_error());
        converted++;
    }
    if (!rc) rc = save_or_fail(cmd, w, out_path);
    if (!rc)
        printf("dequantized %zu tensor%s to f32, copied %zu unchanged: %s\n", converted, converted == 1 ? "" : "s",
               copied, out_path);
    fp4d_st_writer_free(w);
    owned_free_all(&owned);
    free(quant);
    free(consumed);
    return rc;
}

int cmd_dequantize(int argc, char **argv)
{
    const char *cmd = argv[0];
    int         parse_rc = cli_parse_help_only(argc, argv, dequantize_usage);
    if (parse_rc >= 0) return parse_rc;
    if (argc - optind != 2)
        return cli_fail(FP4D_EXIT_USAGE, cmd, "expected IN.safetensors OUT.safetensors (see fp4doctor dequantize --help)");
    const char *in_path = argv[optind], *out_path = argv[optind + 1];
    if (!out_path[0]) return cli_fail(FP4D_EXIT_USAGE, cmd, "OUT is an empty path");
    if (cli_same_file(in_path, out_path))
        return cli_fail(FP4D_EXIT_USAGE, cmd, "OUT is the same file as IN ('%s'): refusing to overwrite the input",
                        out_path);
    fp4d_st_open_result res;
    fp4d_st_file *in = fp4d_st_open(in_path, &res);
    if (!in) return cli_open_failed(cmd, &res);
    int rc = dequantize_file(cmd, in_path, out_path, in);
    fp4d_st_close(in);
    return rc;
}
