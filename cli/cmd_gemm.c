/*
 * fp4doctor gemm / verify (docs/cli.md): one GEMM on tensors from safetensors files, and the
 * comparison of an output with the exact reference.
 *
 * alpha = RN_f32(A_scale_2 * B_scale_2), 1 for an operand without one, as cuBLASLt and
 * flashinfer's mm_fp4 take the two NVFP4 per-tensor decode scales (gemm.h).
 */
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_fp4_tensor.h"
#include "fp4doctor/backend.h"
#include "fp4doctor/doctor.h"
#include "fp4doctor/ref.h"

/* One "file.safetensors:NAME" operand: the open file and the loaded tensor. */
typedef struct spec_operand {
    char         *path, *name;
    fp4d_st_file *file;
    cli_operand   op;
} spec_operand;

static void spec_close(spec_operand *s)
{
    cli_operand_free(&s->op);
    fp4d_st_close(s->file);
    free(s->path);
    free(s->name);
    memset(s, 0, sizeof *s);
}

/* Splits and checks the spec only (usage errors come before any file is opened). */
static int spec_parse(const char *cmd, const char *what, const char *spec, spec_operand *s)
{
    memset(s, 0, sizeof *s);
    if (!cli_split_tensor_spec(spec, &s->path, &s->name) || !s->name) {
        spec_close(s);
        return cli_fail(FP4D_EXIT_USAGE, cmd, "%s must be FILE.safetensors:TENSOR, got '%s'", what, spec);
    }
    return FP4D_EXIT_OK;
}

static int spec_open(const char *cmd, spec_operand *s)
{
    fp4d_st_open_result res;
    s->file = fp4d_st_open(s->path, &res);
    if (!s->file) return cli_open_failed(cmd, &res);
    return FP4D_EXIT_OK;
}

static int spec_load(const char *cmd, spec_operand *s, bool allow_plain)
{
    int rc = spec_open(cmd, s);
    if (rc) return rc;
    char msg[512];
    if (!cli_load_operand(s->file, s->name, allow_plain, &s->op, msg, sizeof msg))
        return cli_fail(FP4D_EXIT_INPUT, cmd, "%s: %s", s->path, msg);
    return FP4D_EXIT_OK;
}

/* Loads A (plain or quantized) and B (quantized), checks K, computes alpha. */
static int load_operands(const char *cmd, spec_operand *a, spec_operand *b, float *alpha)
{
    int rc = spec_load(cmd, a, true);
    if (!rc) rc = spec_load(cmd, b, false);
    if (rc) return rc;
    if (a->op.m.cols != b->op.m.cols)
        return cli_fail(FP4D_EXIT_INPUT, cmd, "K differs: A '%s' is [%lld, %lld], B '%s' is [%lld, %lld] (after unpacking)",
                        a->name, (long long)a->op.m.rows, (long long)a->op.m.cols, b->name, (long long)b->op.m.rows,
                        (long long)b->op.m.cols);
    *alpha = a->op.scale_2 * b->op.scale_2; /* one f32 multiplication: RN_f32 */
    return FP4D_EXIT_OK;
}

/* ---- gemm ---------------------------------------------------------------------------------- */

static void gemm_usage(FILE *f)
{
    fprintf(f,
            "usage: fp4doctor gemm [--backend NAME] [--out-dtype f32|bf16|f16] [--device N]\n"
            "                      A.safetensors:NAME B.safetensors:NAME OUT.safetensors\n\n"
            "Runs out[m, n] = alpha * sum_k A[m, k] * B[n, k] on one backend and writes the tensor 'out'\n"
            "([M, N], F32/BF16/F16) to OUT.\n"
            "  A  an F32/BF16/F16 [M, K] tensor, or a quantized one (NAME with NAME_scale [, NAME_scale_2])\n"
            "  B  a quantized [N, K] tensor: U8 codes [N, K/2] with NAME_scale (F8_E4M3 [N, K/16]: NVFP4;\n"
            "     U8 [N, K/32]: MXFP4) and, for NVFP4, NAME_scale_2\n"
            "  alpha = RN_f32(A's scale_2 * B's scale_2), 1 for an operand without one.\n\n"
            "options:\n"
            "  --backend NAME   ref (default: the exact reference), cpu, cublaslt, ... (fp4doctor backends),\n"
            "                   or auto: the fastest backend the doctor found correct here\n"
            "                   (FP4DOCTOR_BACKEND forces a choice, FP4DOCTOR_DEBUG=1 says why)\n"
            "  --out-dtype T    f32 (default), bf16 or f16\n"
            "  --device N       GPU index for device backends (default: the backend's default)\n\n"
            "exit codes: 0 written, 1 the backend cannot run it or failed, 2 usage error (unknown backend\n"
            "included), 3 unreadable input or operands that do not fit together, 4 internal error\n");
}

/* *backend may be "auto": it is replaced by the backend `auto` chose (backend.h). */
static int run_backend(const char *cmd, const char **backend_io, int device, const fp4d_gemm_problem *p)
{
    /* a plugin that cannot be loaded fails the command, as in check and bench: a GEMM on a
     * built-in backend while FP4DOCTOR_PLUGINS names a broken library hid that mistake */
    fp4d_status s = fp4d_registry_init(NULL);
    if (s != FP4D_STATUS_OK) return cli_registry_failed(cmd, s);
    if (!strcmp(*backend_io, "auto")) {
        fp4d_gemm_desc d;
        fp4d_reason why = {{0}};
        fp4d_gemm_describe(p, &d);
        const fp4d_status chosen = fp4d_backend_choose_auto(&d, backend_io, &why);
        /* FP4DOCTOR_BACKEND naming no backend is a mistake in how fp4doctor was asked, as an
         * unknown --backend is (2); it read as a backend that failed (1) */
        if (chosen != FP4D_STATUS_OK)
            return cli_fail(chosen == FP4D_STATUS_NOT_FOUND ? FP4D_EXIT_USAGE : FP4D_EXIT_FAILED, cmd,
                            "auto found no backend for this GEMM: %s", why.text[0] ? why.text : fp4d_last_error());
    }
    const char *backend = *backend_io;
    if (!fp4d_registry_find(backend)) {
        char names[1024] = "";
        size_t used = 0;
        for (size_t i = 0; i < fp4d_registry_count() && used < sizeof names - 64; i++)
            used += (size_t)snprintf(names + used, sizeof names - used, "%s%s", i ? ", " : "",
                                     fp4d_registry_get(i)->name);
        return cli_fail(FP4D_EXIT_USAGE, cmd, "unknown backend '%s' (known: %s)", backend, names);
    }
    fp4d_backend_t b = NULL;
    fp4d_reason why = {{0}};
    if (fp4d_backend_open(backend, device, &b, &why) != FP4D_STATUS_OK)
        return cli_fail(FP4D_EXIT_FAILED, cmd, "backend '%s' is not available here: %s", backend,
                        why.text[0] ? why.text : fp4d_last_error());
    why.text[0] = '\0';
    s = fp4d_backend_gemm(b, p, &why);
    fp4d_backend_close(b);
    if (s == FP4D_STATUS_UNSUPPORTED)
        return cli_fail(FP4D_EXIT_FAILED, cmd, "backend '%s' does not support this GEMM: %s", backend,
                        why.text[0] ? why.text : fp4d_last_error());
    if (s != FP4D_STATUS_OK)
        return cli_fail(FP4D_EXIT_FAILED, cmd, "backend '%s' failed: %s: %s", backend, fp4d_status_name(s),
                        why.text[0] ? why.text : fp4d_last_error());
    return FP4D_EXIT_OK;
}

int cmd_gemm(int argc, char **argv)
{
    const char *cmd = argv[0];
    static const struct option longopts[] = {
        {"backend", required_argument, NULL, 'b'}, {"out-dtype", required_argument, NULL, 'o'},
        {"device", required_argument, NULL, 'd'},  {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *backend = "ref";
    fp4d_dtype out_type = FP4D_DTYPE_F32;
    int device = -1, c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 'b': backend = optarg; break;
        case 'o':
            if (!fp4d_dtype_from_name(optarg, &out_type) || fp4d_out_elem_size(out_type) == 0)
                return cli_fail(FP4D_EXIT_USAGE, cmd, "--out-dtype must be f32, bf16 or f16, not '%s'", optarg);
            break;
        case 'd': {
            uint64_t v;
            if (!cli_parse_u64(optarg, &v) || v >= 1024) /* as check and bench: 0..1023 */
                return cli_fail(FP4D_EXIT_USAGE, cmd, "--device must be a GPU index, not '%s'", optarg);
            device = (int)v;
            break;
        }
        case 'h': gemm_usage(stdout); return FP4D_EXIT_OK;
        default:
            return cli_fail(FP4D_EXIT_USAGE, cmd, "unknown or incomplete option '%s' (see fp4doctor gemm --help)",
                            argv[optind - 1]);
        }
    }
    if (argc - optind != 3)
        return cli_fail(FP4D_EXIT_USAGE, cmd,
                        "expected A.safetensors:NAME B.safetensors:NAME OUT.safetensors (see fp4doctor gemm --help)");
    const char *out_path = argv[optind + 2];
    if (!out_path[0]) return cli_fail(FP4D_EXIT_USAGE, cmd, "OUT is an empty path");
    spec_operand a, b;
    int rc = spec_parse(cmd, "A", argv[optind], &a);
    if (rc) return rc;
    rc = spec_parse(cmd, "B", argv[optind + 1], &b);
    if (!rc && (cli_same_file(a.path, out_path) || cli_same_file(b.path, out_path)))
        rc = cli_fail(FP4D_EXIT_USAGE, cmd, "OUT '%s' is one of the input files: refusing to overwrite it", out_path);
    float alpha = 1.0f;
    if (!rc) rc = load_operands(cmd, &a, &b, &alpha);
    void *out = NULL;
    int64_t M = a.op.m.rows, N = b.op.m.rows;
    size_t esize = fp4d_out_elem_size(out_type);
    /* M and N come from two files' shapes: their product can overflow long before malloc fails. */
    if (!rc && M > (int64_t)(SIZE_MAX / esize) / N)
        rc = cli_fail(FP4D_EXIT_INPUT, cmd, "a [%lld, %lld] output is too large", (long long)M, (long long)N);
    if (!rc) {
        out = malloc((size_t)(M * N) * esize);
        if (!out) rc = cli_fail(FP4D_EXIT_INTERNAL, cmd, "out of memory for a [%lld, %lld] output", (long long)M, (long long)N);
    }
    if (!rc) {
        fp4d_gemm_problem p = {a.op.m, b.op.m, alpha, out_type, out};
        rc = run_backend(cmd, &backend, device, &p);
    }
    if (!rc) {
        fp4d_st_writer *w = fp4d_st_writer_new();
        int64_t shape[2] = {M, N};
        char alpha_text[32];
        snprintf(alpha_text, sizeof alpha_text, "%.9g", (double)alpha);
        fp4d_status s = w ? fp4d_st_writer_add(w, "out", cli_st_dtype_of(out_type), 2, shape, out, (uint64_t)(M * N) * esize)
                          : FP4D_STATUS_NOMEM;
        if (s == FP4D_STATUS_OK) s = fp4d_st_writer_set_metadata(w, "fp4doctor.backend", backend);
        if (s == FP4D_STATUS_OK) s = fp4d_st_writer_set_metadata(w, "fp4doctor.alpha", alpha_text);
        if (s == FP4D_STATUS_OK) s = fp4d_st_writer_save(w, out_path);
        if (s != FP4D_STATUS_OK) rc = cli_fail(FP4D_EXIT_INPUT, cmd, "%s", fp4d_last_error());
        fp4d_st_writer_free(w);
        if (!rc)
            printf("out [%lld, %lld] %s = %g * %s(%s) . %s(%s)^T on backend %s: %s\n", (long long)M, (long long)N,
                   fp4d_dtype_get(out_type)->name, (double)alpha, a.name, fp4d_dtype_get(a.op.m.dtype)->name, b.name,
                   fp4d_dtype_get(b.op.m.dtype)->name, backend, out_path);
    }
    free(out);
    spec_close(&a);
    spec_close(&b);
    return rc;
}

/* ---- verify -------------------------------------------------------------------------------- */

static void verify_usage(FILE *f)
{
    fprintf(f,
            "usage: fp4doctor verify [--tolerance] A.safetensors:NAME B.safetensors:NAME OUTPUT.safetensors:NAME\n\n"
            "Computes the correctly rounded exact result of A . B^T (alpha as in `fp4doctor gemm`) in the\n"
            "output tensor's own dtype (F32, BF16 or F16) and compares it with OUTPUT bit for bit.\n"
            "Prints how many elements differ and the largest error in ulps (distance between the two values\n"
            "in representable steps of the output type; NaN where the other is not NaN counts as differing\n"
            "with unbounded error; any NaN matches any NaN; -0 vs +0 differs by 0 ulps but still differs).\n\n"
            "  --tolerance   judge OUTPUT as `fp4doctor check` judges a backend (docs/tolerance.md) instead:\n"
            "                PASS within the bound of f32 accumulation in any order, INACCURATE within the\n"
            "                practical tolerance, WRONG beyond it or NaN on one side only. For outputs of\n"
            "                an engine's own kernels, which are correct without being bit-identical\n\n"
            "exit codes: 0 bit-identical (with --tolerance: PASS), 1 some element differs (INACCURATE or\n"
            "WRONG), 2 usage error, 3 unreadable input or shapes that do not fit together\n");
}

/* verify --tolerance: one line with the verdict of fp4d_judge_gemm_output. */
static int verify_by_tolerance(const char *cmd, const fp4d_gemm_problem *p, const fp4d_st_tensor *ot, const char *name)
{
    fp4d_output_judgement j;
    const fp4d_status st = fp4d_judge_gemm_output(p, ot->data, &j);
    if (st != FP4D_STATUS_OK)
        return cli_fail(st == FP4D_STATUS_NOMEM ? FP4D_EXIT_INTERNAL : FP4D_EXIT_INPUT, cmd,
                        "the reference cannot run these operands: %s", fp4d_last_error());
    const int64_t M = p->a.rows, N = p->b.rows;
    const char *tname = fp4d_dtype_get(p->out_type)->name;
    const char *verdict = j.beyond_practical ? "WRONG" : j.beyond_fp32 ? "INACCURATE" : "PASS";
    char worst[200] = "every element exact";
    if (j.worst >= 0)
        snprintf(worst, sizeof worst, "worst at [%lld, %lld]: got %.9g, exact %.9g, f32 bound %.3g, practical %.3g",
                 (long long)(j.worst / N), (long long)(j.worst % N), j.worst_got, j.worst_exact, j.worst_bound_fp32,
                 j.worst_bound_practical);
    if (!j.beyond_fp32)
        printf("verify: PASS: all %lld elements of %s [%lld, %lld] %s are within the f32-accumulation bound of the "
               "exact result; %s\n",
               (long long)j.elements, name, (long long)M, (long long)N, tname, worst);
    else
        printf("verify: %s: %lld of %lld elements of %s [%lld, %lld] %s are outside the f32-accumulation bound, %lld "
               "outside the practical tolerance; NaN mismatches: %lld; %s\n",
               verdict, (long long)j.beyond_fp32, (long long)j.elements, name, (long long)M, (long long)N, tname,
               (long long)j.beyond_practical, (long long)j.nan_mismatch, worst);
    return j.beyond_fp32 ? FP4D_EXIT_FAILED : FP4D_EXIT_OK;
}

static int fmt_width(fp4d_dtype t) { return t == FP4D_DTYPE_F32 ? 32 : 16; }

static uint64_t load_bits(const void *buf, fp4d_dtype t, int64_t i)
{
    if (t == FP4D_DTYPE_F32) {
        uint32_t v;
        memcpy(&v, (const uint8_t *)buf + 4 * i, 4);
        return v;
    }
    uint16_t v;
    memcpy(&v, (const uint8_t *)buf + 2 * i, 2);
    return v;
}

static bool bits_is_nan(uint64_t b, fp4d_dtype t)
{
    if (t == FP4D_DTYPE_F32) return (b & 0x7FFFFFFFu) > 0x7F800000u;
    if (t == FP4D_DTYPE_BF16) return (b & 0x7FFFu) > 0x7F80u;
    return (b & 0x7FFFu) > 0x7C00u;
}

static double bits_value(uint64_t b, fp4d_dtype t)
{
    if (t == FP4D_DTYPE_F32) {
        float f;
        uint32_t v = (uint32_t)b;
        memcpy(&f, &v, 4);
        return f;
    }
    if (t == FP4D_DTYPE_BF16) return fp4d_bf16_to_f32((uint16_t)b);
    return fp4d_f16_to_f32((uint16_t)b);
}

/* Sign-magnitude bit patterns on one integer line: adjacent values differ by 1. */
static int64_t bits_ordinal(uint64_t b, fp4d_dtype t)
{
    int w = fmt_width(t);
    uint64_t mag = b & ((UINT64_C(1) << (w - 1)) - 1);
    return (b >> (w - 1)) & 1 ? -(int64_t)mag : (int64_t)mag;
}

int cmd_verify(int argc, char **argv)
{
    const char *cmd = argv[0];
    static const struct option longopts[] = {{"tolerance", no_argument, NULL, 't'}, {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    bool by_tolerance = false;
    int  c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        if (c == 'h') {
            verify_usage(stdout);
            return FP4D_EXIT_OK;
        }
        if (c == 't') {
            by_tolerance = true;
            continue;
        }
        return cli_fail(FP4D_EXIT_USAGE, cmd, "unknown option '%s' (see fp4doctor verify --help)", argv[optind - 1]);
    }
    if (argc - optind != 3)
        return cli_fail(FP4D_EXIT_USAGE, cmd,
                        "expected A.safetensors:NAME B.safetensors:NAME OUTPUT.safetensors:NAME (see fp4doctor verify --help)");
    spec_operand a, b, o;
    memset(&b, 0, sizeof b);
    memset(&o, 0, sizeof o);
    int rc = spec_parse(cmd, "A", argv[optind], &a);
    if (!rc) rc = spec_parse(cmd, "B", argv[optind + 1], &b);
    if (!rc) rc = spec_parse(cmd, "OUTPUT", argv[optind + 2], &o);
    float alpha = 1.0f;
    if (!rc) rc = load_operands(cmd, &a, &b, &alpha);
    if (!rc) rc = spec_open(cmd, &o);
    const fp4d_st_tensor *ot = NULL;
    fp4d_dtype out_type = FP4D_DTYPE_F32;
    int64_t M = a.op.m.rows, N = b.op.m.rows;
    if (!rc) {
        ot = fp4d_st_find(o.file, o.name);
        if (!ot) rc = cli_fail(FP4D_EXIT_INPUT, cmd, "%s: no tensor named '%s'", o.path, o.name);
        else if (!cli_plain_dtype_of(ot->dtype, &out_type))
            rc = cli_fail(FP4D_EXIT_INPUT, cmd, "%s: output '%s' is %s; expected F32, BF16 or F16", o.path, o.name,
                          fp4d_st_dtype_name(ot->dtype));
        else if (ot->ndim != 2 || ot->shape[0] != M || ot->shape[1] != N)
            rc = cli_fail(FP4D_EXIT_INPUT, cmd, "%s: output '%s' should be [%lld, %lld] for these operands", o.path,
                          o.name, (long long)M, (long long)N);
    }
    void *want = NULL;
    if (!rc && by_tolerance) {
        fp4d_gemm_problem p = {a.op.m, b.op.m, alpha, out_type, NULL};
        rc = verify_by_tolerance(cmd, &p, ot, o.name);
    } else if (!rc) {
        want = malloc((size_t)(M * N) * fp4d_out_elem_size(out_type));
        fp4d_gemm_problem p = {a.op.m, b.op.m, alpha, out_type, want};
        if (!want) rc = cli_fail(FP4D_EXIT_INTERNAL, cmd, "out of memory");
        else if (fp4d_ref_gemm(&p) != FP4D_STATUS_OK)
            rc = cli_fail(FP4D_EXIT_INPUT, cmd, "the reference cannot run these operands: %s", fp4d_last_error());
        if (rc) goto done;
        int64_t differ = 0, nan_mismatch = 0, first_nan = -1, worst = -1, worst_ulps = 0;
        for (int64_t i = 0; i < M * N; i++) {
            uint64_t g = load_bits(ot->data, out_type, i), r = load_bits(want, out_type, i);
            bool gn = bits_is_nan(g, out_type), rn = bits_is_nan(r, out_type);
            if ((gn && rn) || g == r) continue;
            differ++;
            if (gn != rn) {
                if (nan_mismatch++ == 0) first_nan = i;
                continue;
            }
            int64_t d = llabs(bits_ordinal(g, out_type) - bits_ordinal(r, out_type));
            if (worst < 0 || d > worst_ulps) {
                worst_ulps = d;
                worst = i;
            }
        }
        if (nan_mismatch) worst = first_nan; /* a NaN where there should be none is the worst */
        const char *tname = fp4d_dtype_get(out_type)->name;
        if (differ == 0) {
            printf("verify: PASS: all %lld elements of %s [%lld, %lld] %s are bit-identical to the correctly "
                   "rounded exact result (max error 0 ulps)\n",
                   (long long)(M * N), o.name, (long long)M, (long long)N, tname);
            rc = FP4D_EXIT_OK;
        } else {
            char ulps[32];
            if (nan_mismatch) snprintf(ulps, sizeof ulps, "unbounded (NaN)");
            else snprintf(ulps, sizeof ulps, "%lld ulps", (long long)worst_ulps);
            uint64_t g = load_bits(ot->data, out_type, worst), r = load_bits(want, out_type, worst);
            printf("verify: FAIL: %lld of %lld elements of %s [%lld, %lld] %s differ from the correctly rounded "
                   "exact result; max error %s at [%lld, %lld]: got %.9g (0x%0*llx), exact %.9g (0x%0*llx); "
                   "NaN mismatches: %lld\n",
                   (long long)differ, (long long)(M * N), o.name, (long long)M, (long long)N, tname, ulps,
                   (long long)(worst / N), (long long)(worst % N), bits_value(g, out_type), fmt_width(out_type) / 4,
                   (unsigned long long)g, bits_value(r, out_type), fmt_width(out_type) / 4, (unsigned long long)r,
                   (long long)nan_mismatch);
            rc = FP4D_EXIT_FAILED;
        }
    }
done:
    free(want);
    spec_close(&a);
    spec_close(&b);
    spec_close(&o);
    return rc;
}
