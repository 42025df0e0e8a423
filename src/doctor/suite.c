/*
 * The suites: which cases the doctor runs (docs/tolerance.md explains the choices).
 *
 * quick   - seconds on a 2-core CPU with the exact reference included, and still catches
 *           every failure class the faulty backends reproduce: an M sweep on one shape
 *           (M 1..257: in and out of the 32..1536 window, below and above 64 and 128 rows),
 *           N = 256 with M > 1, K = 4096, linear and swizzled scales, all three format pairs,
 *           the edge-case inputs, a grouped MoE GEMM with an empty expert and experts of
 *           64, 85 and 151 rows, quantize cases, and two stress cases (four instances at
 *           once): a batch of plain GEMMs of mixed M, and one of grouped MoE GEMMs.
 * default - quick plus the full M sweep 1..4096 on a narrow shape, the real LLM projections
 *           (4096x4096, 14336x4096, 4096x14336, 7168x18432) at small M, more MoE and quantize.
 * full    - default plus larger M on the LLM shapes and the sweep under every format pair.
 * Cases are appended in a fixed order; a case's index is its position.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "doctor_internal.h"
#include "internal.h"

typedef struct case_list {
    fp4d_case *v;
    size_t     n, cap;
    bool       failed;
} case_list;

static const char *short_dtype(fp4d_dtype t)
{
    const fp4d_dtype_traits *tr = fp4d_dtype_get(t);
    return tr ? tr->name : "?";
}

static fp4d_case *push(case_list *l)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        fp4d_case *v = realloc(l->v, cap * sizeof *v);
        if (!v) {
            l->failed = true;
            return NULL;
        }
        l->v = v;
        l->cap = cap;
    }
    fp4d_case *c = &l->v[l->n];
    memset(c, 0, sizeof *c);
    c->index = (int32_t)l->n;
    l->n++;
    return c;
}

static const char *layout_tag(fp4d_scale_layout l) { return l == FP4D_LAYOUT_LINEAR ? "lin" : "swz"; }

/* A plain GEMM. a_type may be a plain type (bf16 activations, W4A16). */
static void add_gemm(case_list *l, const char *group, fp4d_dtype a_type, fp4d_dtype b_type,
                     fp4d_scale_layout layout, fp4d_input_kind input, fp4d_dtype out_type,
                     int64_t m, int64_t n, int64_t k)
{
    fp4d_case *c = push(l);
    if (!c) return;
    snprintf(c->group, sizeof c->group, "%s", group);
    c->op = FP4D_CASE_GEMM;
    c->m = m, c->n = n, c->k = k;
    c->a_type = a_type, c->b_type = b_type, c->out_type = out_type;
    c->a_layout = c->b_layout = layout;
    c->input = input;
    snprintf(c->name, sizeof c->name, "%s.%sx%s.%s.%s.%s.m%lld.n%lld.k%lld", group,
             short_dtype(a_type), short_dtype(b_type), layout_tag(layout),
             fp4d_input_kind_name(input), short_dtype(out_type), (long long)m, (long long)n,
             (long long)k);
}

static void add_moe(case_list *l, fp4d_dtype fmt, fp4d_scale_layout layout, fp4d_input_kind input,
                    int32_t experts, int64_t total_rows, int64_t n, int64_t k)
{
    fp4d_case *c = push(l);
    if (!c) return;
    snprintf(c->group, sizeof c->group, "moe");
    c->op = FP4D_CASE_GROUPED;
    c->m = total_rows, c->n = n, c->k = k;
    c->a_type = c->b_type = fmt;
    c->out_type = FP4D_DTYPE_BF16;
    c->a_layout = c->b_layout = layout;
    c->input = input;
    c->num_experts = experts;
    snprintf(c->name, sizeof c->name, "moe.%s.%s.%s.e%d.m%lld.n%lld.k%lld", short_dtype(fmt),
             layout_tag(layout), fp4d_input_kind_name(input), experts, (long long)total_rows,
             (long long)n, (long long)k);
}

static void add_quant(case_list *l, fp4d_dtype fmt, fp4d_convention conv, fp4d_scale_layout layout,
                      fp4d_input_kind input, int64_t rows, int64_t cols)
{
    fp4d_case *c = push(l);
    if (!c) return;
    snprintf(c->group, sizeof c->group, "quant");
    c->op = FP4D_CASE_QUANTIZE;
    c->m = rows, c->n = 0, c->k = cols;
    c->a_type = FP4D_DTYPE_F32;
    c->b_type = fmt;
    c->out_type = fmt;
    c->a_layout = c->b_layout = layout;
    c->input = input;
    c->convention = conv;
    snprintf(c->name, sizeof c->name, "quant.%s.%s.%s.%s.r%lld.c%lld", short_dtype(fmt),
             fp4d_convention_name(conv), layout_tag(layout), fp4d_input_kind_name(input),
             (long long)rows, (long long)cols);
}

/* A stress case (stress.c): its batch - a GEMM per M of fp4d_stress_m, or with experts > 0 a
 * grouped GEMM per row count of fp4d_stress_moe_rows over that many experts - on `threads`
 * instances at once, `rounds` times each. m is the rows of one batch. */
static fp4d_case *push_stress(case_list *l, fp4d_dtype a_type, fp4d_dtype b_type, fp4d_scale_layout layout,
                              fp4d_dtype out_type, int32_t experts, int32_t threads, int32_t rounds, int64_t n,
                              int64_t k)
{
    fp4d_case *c = push(l);
    if (!c) return NULL;
    snprintf(c->group, sizeof c->group, "stress");
    c->op = FP4D_CASE_STRESS;
    size_t count;
    const int64_t *rows = fp4d_stress_batch(experts, &count);
    c->m = 0;
    for (size_t i = 0; i < count; i++) c->m += rows[i];
    c->n = n, c->k = k;
    c->a_type = a_type, c->b_type = b_type, c->out_type = out_type;
    c->a_layout = c->b_layout = layout;
    c->input = FP4D_INPUT_GAUSSIAN;
    c->num_experts = experts;
    c->threads = threads, c->rounds = rounds;
    return c;
}

static void add_stress(case_list *l, fp4d_dtype a_type, fp4d_dtype b_type, fp4d_scale_layout layout,
                       fp4d_dtype out_type, int32_t threads, int32_t rounds, int64_t n, int64_t k)
{
    fp4d_case *c = push_stress(l, a_type, b_type, layout, out_type, 0, threads, rounds, n, k);
    if (!c) return;
    snprintf(c->name, sizeof c->name, "stress.%sx%s.%s.%s.t%d.r%d.n%lld.k%lld", short_dtype(a_type),
             short_dtype(b_type), layout_tag(layout), short_dtype(out_type), (int)threads, (int)rounds,
             (long long)n, (long long)k);
}

/* The MoE stress case: bf16 output, fmt on both sides. */
static void add_stress_moe(case_list *l, fp4d_dtype fmt, fp4d_scale_layout layout, int32_t experts,
                           int32_t threads, int32_t rounds, int64_t n, int64_t k)
{
    fp4d_case *c = push_stress(l, fmt, fmt, layout, FP4D_DTYPE_BF16, experts, threads, rounds, n, k);
    if (!c) return;
    snprintf(c->name, sizeof c->name, "stress.moe.%s.%s.e%d.t%d.r%d.n%lld.k%lld", short_dtype(fmt),
             layout_tag(layout), (int)experts, (int)threads, (int)rounds, (long long)n, (long long)k);
}

#define NV FP4D_DTYPE_NVFP4
#define MX FP4D_DTYPE_MXFP4
#define BF FP4D_DTYPE_BF16
#define F32 FP4D_DTYPE_F32
#define F16 FP4D_DTYPE_F16
#define SWZ FP4D_LAYOUT_SWIZZLED_128X4
#define LIN FP4D_LAYOUT_LINEAR

static void add_quick(case_list *l)
{
    /* The M sweep on one shape: real failures are non-monotonic in M. N = 192 (not a
     * multiple of 256), K = 256. */
    static const int64_t quick_m[] = {1, 7, 17, 48, 64, 127, 129, 257};
    for (size_t i = 0; i < FP4D_ARRAY_LEN(quick_m); i++)
        add_gemm(l, "nvfp4", NV, NV, SWZ, FP4D_INPUT_GRID, F32, quick_m[i], 192, 256);
    /* N a multiple of 256 with M > 1, and K = 4096: shapes that select other tiles. */
    add_gemm(l, "nvfp4", NV, NV, SWZ, FP4D_INPUT_GRID, F32, 2, 256, 128);
    add_gemm(l, "nvfp4", NV, NV, SWZ, FP4D_INPUT_GAUSSIAN, BF, 1, 64, 4096);
    /* Linear scales; K = 272 = 17 blocks (a multiple of 16, not of 32/64/128: padding). */
    add_gemm(l, "nvfp4", NV, NV, LIN, FP4D_INPUT_GAUSSIAN, BF, 16, 160, 272);
    add_gemm(l, "mxfp4", MX, MX, SWZ, FP4D_INPUT_GAUSSIAN, F32, 17, 128, 320);
    add_gemm(l, "mxfp4", MX, MX, LIN, FP4D_INPUT_GRID, BF, 8, 64, 256);
    add_gemm(l, "w4a16", BF, NV, SWZ, FP4D_INPUT_HEAVY_TAILED, BF, 8, 96, 256);
    add_gemm(l, "edge", NV, NV, SWZ, FP4D_INPUT_SATURATING, F32, 4, 128, 128);
    add_gemm(l, "edge", NV, NV, SWZ, FP4D_INPUT_ALL_ZERO, F32, 3, 64, 64);
    add_gemm(l, "edge", NV, NV, LIN, FP4D_INPUT_UNDERFLOW, F32, 5, 64, 192);
    add_gemm(l, "edge", NV, NV, SWZ, FP4D_INPUT_ZERO_BLOCKS, BF, 9, 80, 160);
    /* MoE: 300 rows over 4 experts give 85, 0, 151 and 64 rows (moe_offsets), so an
     * expert's second 64-row half-tile and second 128-row tile are both exercised (FI PR
     * #3533: rows 64..127 of an expert with > 64 rows came back zero). With 24 rows no
     * expert reached 64 and such a kernel passed. */
    add_moe(l, NV, SWZ, FP4D_INPUT_GAUSSIAN, 4, 300, 128, 256);
    add_quant(l, NV, FP4D_CONV_FLASHINFER_EXACT, SWZ, FP4D_INPUT_GAUSSIAN, 64, 256);
    add_quant(l, NV, FP4D_CONV_FLASHINFER_EXACT, LIN, FP4D_INPUT_NONFINITE, 32, 128);
    add_quant(l, MX, FP4D_CONV_FLASHINFER_EXACT, SWZ, FP4D_INPUT_GAUSSIAN, 32, 256);
    /* Four instances at once, the batch three times each: races that only show under
     * concurrency (FI #2708, SGLang #20047). */
    add_stress(l, NV, NV, SWZ, BF, 4, 3, 128, 256);
    /* The same for the grouped MoE GEMM, whose experts each take their own tiles. */
    add_stress_moe(l, NV, SWZ, 8, 4, 3, 128, 256);
}

static void add_default_extra(case_list *l)
{
    /* The full M sweep of the issue on a narrow shape (M up to 4096 stays cheap). */
    static const int64_t sweep_m[] = {1, 2, 3, 7, 8, 16, 17, 48, 63, 64, 127, 128, 129,
                                      256, 257, 512, 1024, 3072, 4096};
    for (size_t i = 0; i < FP4D_ARRAY_LEN(sweep_m); i++)
        add_gemm(l, "sweep", NV, NV, SWZ, FP4D_INPUT_GRID, F32, sweep_m[i], 64, 128);
    /* Small N and K, and K multiples of 16 that are not multiples of 32. */
    add_gemm(l, "nvfp4", NV, NV, SWZ, FP4D_INPUT_GAUSSIAN, F32, 7, 16, 16);
    add_gemm(l, "nvfp4", NV, NV, LIN, FP4D_INPUT_HEAVY_TAILED, F16, 33, 40, 48);
    add_gemm(l, "nvfp4", NV, NV, SWZ, FP4D_INPUT_GAUSSIAN, BF, 130, 136, 400);
    add_gemm(l, "mxfp4", MX, MX, SWZ, FP4D_INPUT_HEAVY_TAILED, BF, 129, 96, 224);
    add_gemm(l, "w4a16", BF, NV, LIN, FP4D_INPUT_GAUSSIAN, BF, 17, 128, 272);
    add_gemm(l, "w4a16", F16, NV, SWZ, FP4D_INPUT_GAUSSIAN, F16, 3, 64, 128);
    add_gemm(l, "edge", NV, NV, LIN, FP4D_INPUT_SATURATING, BF, 20, 64, 256);
    add_gemm(l, "edge", MX, MX, SWZ, FP4D_INPUT_ZERO_BLOCKS, F32, 12, 64, 128);
    add_gemm(l, "edge", NV, NV, SWZ, FP4D_INPUT_UNDERFLOW, BF, 65, 64, 128);
    /* Odd N (not a multiple of 8, 16 or 128): kernels without an N-tail path write past
     * or short of the last column tile only here. */
    add_gemm(l, "edge", NV, NV, SWZ, FP4D_INPUT_GAUSSIAN, BF, 5, 131, 256);
    add_gemm(l, "edge", BF, NV, LIN, FP4D_INPUT_GRID, F32, 129, 257, 128);
    /* Real LLM projections at the small M of decoding. */
    add_gemm(l, "llm", NV, NV, SWZ, FP4D_INPUT_GAUSSIAN, BF, 1, 4096, 4096);
    add_gemm(l, "llm", NV, NV, SWZ, FP4D_INPUT_GAUSSIAN, BF, 1, 14336, 4096);
    add_gemm(l, "llm", NV, NV, SWZ, FP4D_INPUT_GAUSSIAN, BF, 1, 4096, 14336);
    add_gemm(l, "llm", NV, NV, SWZ, FP4D_INPUT_GAUSSIAN, BF, 1, 7168, 18432);
    add_gemm(l, "llm", MX, MX, SWZ, FP4D_INPUT_GAUSSIAN, BF, 1, 4096, 4096);
    add_gemm(l, "llm", BF, NV, SWZ, FP4D_INPUT_GAUSSIAN, BF, 2, 4096, 4096);
    add_gemm(l, "llm", NV, NV, SWZ, FP4D_INPUT_GAUSSIAN, BF, 3, 4096, 14336);
    add_gemm(l, "llm", NV, NV, LIN, FP4D_INPUT_GAUSSIAN, BF, 8, 14336, 4096);
    add_gemm(l, "llm", NV, NV, SWZ, FP4D_INPUT_HEAVY_TAILED, F16, 16, 4096, 4096);
    /* MoE with uneven loads and empty experts. */
    add_moe(l, NV, SWZ, FP4D_INPUT_GAUSSIAN, 8, 240, 256, 512);
    add_moe(l, MX, LIN, FP4D_INPUT_HEAVY_TAILED, 5, 70, 64, 256);
    add_quant(l, NV, FP4D_CONV_FLASHINFER_EXACT, SWZ, FP4D_INPUT_SATURATING, 48, 512);
    add_quant(l, NV, FP4D_CONV_FLASHINFER_EXACT, LIN, FP4D_INPUT_UNDERFLOW, 16, 256);
    add_quant(l, NV, FP4D_CONV_FLASHINFER_EXACT, SWZ, FP4D_INPUT_ZERO_BLOCKS, 130, 272);
    add_quant(l, NV, FP4D_CONV_TRTLLM, SWZ, FP4D_INPUT_GAUSSIAN, 64, 512);
    add_quant(l, MX, FP4D_CONV_FLASHINFER_EXACT, LIN, FP4D_INPUT_HEAVY_TAILED, 16, 512);
    add_stress(l, BF, NV, SWZ, BF, 4, 3, 256, 512);
    add_stress(l, MX, MX, LIN, F32, 4, 3, 128, 256);
}

static void add_full_extra(case_list *l)
{
    static const int64_t sweep_m[] = {1, 2, 3, 7, 8, 16, 17, 48, 63, 64, 127, 128, 129,
                                      256, 257, 512, 1024, 3072, 4096};
    for (size_t i = 0; i < FP4D_ARRAY_LEN(sweep_m); i++) {
        add_gemm(l, "sweep", NV, NV, LIN, FP4D_INPUT_GAUSSIAN, BF, sweep_m[i], 128, 256);
        add_gemm(l, "sweep", MX, MX, SWZ, FP4D_INPUT_GAUSSIAN, BF, sweep_m[i], 128, 256);
        add_gemm(l, "sweep", BF, NV, SWZ, FP4D_INPUT_GAUSSIAN, BF, sweep_m[i], 128, 256);
    }
    static const int64_t llm[][2] = {{4096, 4096}, {14336, 4096}, {4096, 14336}, {7168, 18432}};
    static const int64_t llm_m[] = {16, 128};
    for (size_t s = 0; s < FP4D_ARRAY_LEN(llm); s++)
        for (size_t i = 0; i < FP4D_ARRAY_LEN(llm_m); i++)
            add_gemm(l, "llm", NV, NV, SWZ, FP4D_INPUT_GAUSSIAN, BF, llm_m[i], llm[s][0], llm[s][1]);
    add_gemm(l, "llm", MX, MX, SWZ, FP4D_INPUT_HEAVY_TAILED, BF, 16, 4096, 4096);
    add_gemm(l, "llm", BF, NV, SWZ, FP4D_INPUT_GAUSSIAN, BF, 16, 4096, 4096);
    add_moe(l, NV, SWZ, FP4D_INPUT_HEAVY_TAILED, 16, 600, 512, 1024);
    add_moe(l, NV, LIN, FP4D_INPUT_ZERO_BLOCKS, 3, 1, 128, 256);
    for (int conv = 0; conv < FP4D_CONV_COUNT; conv++) {
        if (fp4d_convention_supports((fp4d_convention)conv, FP4D_DTYPE_NVFP4))
            add_quant(l, NV, (fp4d_convention)conv, SWZ, FP4D_INPUT_HEAVY_TAILED, 64, 1024);
        if (fp4d_convention_supports((fp4d_convention)conv, FP4D_DTYPE_MXFP4))
            add_quant(l, MX, (fp4d_convention)conv, SWZ, FP4D_INPUT_NONFINITE, 64, 1024);
    }
    add_stress(l, NV, NV, SWZ, BF, 8, 6, 512, 1024);
    add_stress_moe(l, NV, SWZ, 8, 8, 4, 256, 1024);
}

fp4d_status fp4d_suite_cases(fp4d_suite suite, fp4d_case **cases, size_t *count)
{
    FP4D_RETURN_ERROR_IF(!cases || !count, INVALID_ARG, "NULL argument");
    FP4D_RETURN_ERROR_IF((unsigned)suite >= FP4D_SUITE_COUNT, INVALID_ARG, "unknown suite %d", (int)suite);
    case_list l = {0};
    add_quick(&l);
    if (suite >= FP4D_SUITE_DEFAULT) add_default_extra(&l);
    if (suite >= FP4D_SUITE_FULL) add_full_extra(&l);
    if (l.failed) {
        free(l.v);
        return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory building the suite");
    }
    *cases = l.v;
    *count = l.n;
    return FP4D_STATUS_OK;
}

void fp4d_case_shape_key(const fp4d_case *c, char *key, size_t size)
{
    snprintf(key, size, "%d|%lld|%lld|%d|%d|%d|%d|%d|%d|%d", (int)c->op, (long long)c->n,
             (long long)c->k, (int)c->a_type, (int)c->b_type, (int)c->out_type, (int)c->a_layout,
             (int)c->b_layout, (int)c->input, (int)c->num_experts);
}
