/*
 * backend_cuda.c - the `cuda` backend: fp4doctor's own kernels (kernels.cu).
 *
 * Paths, chosen per problem:
 *  - gemv: one weight matrix, M = 1 where the skinny path's stream kernel does not apply
 *    (up to M = 4 and any K with FP4DOCTOR_CUDA_GEMV_MAX_M), K % 32 == 0, activations bf16,
 *    f16 or FP4: CUDA-core kernel that streams the packed weights with exact f32 products;
 *  - skinny: M (or an expert's rows) small and K % 32 == 0, activations bf16, f16 (with
 *    NVFP4 weights) or FP4: packed weights streamed once through tensor cores (memory-bound
 *    decode shapes and the grouped MoE GEMM; items of <= 16 rows with K % 256 == 0 take the
 *    weight-streaming kernel, see kernels.cu);
 *  - fused: NVFP4 weights, K % 64 == 0, activations bf16/f16 (FP4 activations dequantized
 *    to bf16 first), M >= FP4DOCTOR_CUDA_FUSED_MIN_M (default 32; 0 turns it off) for a
 *    plain GEMM, or experts of more than the skinny limit's rows: tensor-core GEMM that
 *    dequantizes the packed weights on chip (no dense weight copy); on sm_90a a wgmma kernel,
 *    and from FP4DOCTOR_CUDA_WG_DENSE_MIN_M rows (default 512) the weights are dequantized
 *    once into a dense copy for a TMA-fed wgmma GEMM;
 *  - tiled: weights dequantized into a dense bf16/f16 buffer, then a tensor-core GEMM
 *    (large M with MXFP4 weights or K % 64 != 0);
 *  - simt: f32 CUDA-core GEMM on f32-dequantized operands, for f32 activations and for
 *    MXFP4 weights with f16 activations (whose dequantized values may not fit in f16).
 * gemm() takes host pointers (gemm.h): it uploads the operands and the caller's output
 * buffer (so elements a kernel failed to write stay visibly poisoned), runs, and downloads.
 */
#include <math.h>
#include <float.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backends.h"
#include "cuda_internal.h"
#include "internal.h"

#define FP4D_CUDA_SKINNY_MAX_M_DEFAULT 256
/* rows per expert up to which grouped GEMMs take the skinny path where the register-decode
 * wgmma kernel runs (sm_90a): each 16-row item streams its expert's weights once, so above
 * this the grouped wgmma launch wins (bench, 128 experts of 2048 x 7168, top 8: 32 rows per
 * expert 1.77 ms on the skinny path against 0.80 ms for the wgmma launch at 64 rows; 16 rows:
 * skinny 0.52 ms) */
#define FP4D_CUDA_GROUPED_SKINNY_MAX_M_WGMMA 16
#define FP4D_CUDA_FUSED_MIN_M_DEFAULT 32
/* rows of one expert from which, on sm_90a, the weights are dequantized once into a bf16/f16
 * copy and the plain wgmma GEMM runs (FP4DOCTOR_CUDA_WG_DENSE_MIN_M; 0 = never) */
#define FP4D_CUDA_WG_DENSE_MIN_M_DEFAULT 512
/* the largest row count the path thresholds above take from the environment */
#define KNOB_ROWS_MAX (1L << 30)
/* rows one call may have: 65535 (the grid's y limit) row tiles - 32 rows on the simt path
 * (fp4d_cuda_simt_gemm), 128 on the tiled one (the first of the others to reach its limit) */
#define CUDA_MAX_ROWS_SIMT (INT64_C(65535) * 32)
#define CUDA_MAX_ROWS (INT64_C(65535) * 128)

typedef struct cuda_ctx {
    int          device, sm_count, cc;
    size_t       l2_bytes;
    cudaStream_t stream;
    int64_t      skinny_max_m;
    int64_t      grouped_skinny_max_m;   /* the same for grouped GEMMs */
    int64_t      fused_min_m;            /* 0: fused path off */
    int64_t      wg_dense_min_m;         /* rows from which sm_90 dequantizes W first (wgmma) */
    fp4d_devbuf  a, a_sc, b, b_sc, out;  /* uploaded operands */
    fp4d_devbuf  wa, wb;                 /* dense working copies */
    fp4d_devbuf  bstream;                /* weights (codes, scales) in the stream layout (skinny path) */
    fp4d_devbuf  params;                 /* skinny work items, pointer tables, alphas */
    fp4d_devbuf  partials, counters;     /* split-K scratch (counters stay zero between launches) */
    fp4d_devbuf  aperm;                  /* k-permuted activations of the register-decode wgmma kernel */
    fp4d_devbuf  gparams;                /* work items and tables of its grouped launches */
    fp4d_devbuf  amax;
} cuda_ctx;

/* A GEMM whose operands are on the device; per-expert tables live on the host. */
typedef struct dev_gemm {
    fp4d_dtype        a_type;
    const void       *a;
    const uint8_t    *a_scales;
    fp4d_scale_layout a_layout;
    int64_t           a_rows;
    fp4d_dtype        b_format;
    fp4d_scale_layout b_layout;
    int32_t           num_experts;
    const uint8_t   **b_codes;   /* host array of device pointers */
    const uint8_t   **b_scales;
    const float      *alpha;     /* host array */
    const int64_t    *offsets;   /* host array, num_experts + 1 */
    bool              b_stream;  /* b_codes and b_scales are in the stream layout (kernels.h) */
    bool              b_settled; /* no work still queued on the device writes the weights (kernels.h) */
    int64_t           n, k;
    fp4d_dtype        out_type;
    void             *out;
} dev_gemm;

typedef enum { PATH_GEMV, PATH_SKINNY, PATH_FUSED, PATH_TILED, PATH_SIMT } gemm_path;

static bool is_fp4(fp4d_dtype t) { return t == FP4D_DTYPE_NVFP4 || t == FP4D_DTYPE_MXFP4; }

/* The dense operand type of the tiled/simt paths: one that holds the activations and the
 * dequantized weights exactly. */
static fp4d_dtype dense_type(fp4d_dtype a, fp4d_dtype b)
{
    if (a == FP4D_DTYPE_F32) return FP4D_DTYPE_F32;
    if (a == FP4D_DTYPE_F16) return b == FP4D_DTYPE_NVFP4 ? FP4D_DTYPE_F16 : FP4D_DTYPE_F32;
    return FP4D_DTYPE_BF16; /* bf16 and FP4 activations (e2m1 x scale is exact in bf16) */
}

static gemm_path choose_path(const cuda_ctx *c, fp4d_dtype a, fp4d_dtype b, int64_t k, int64_t max_rows_per_expert,
                             bool grouped)
{
    const fp4d_dtype d = dense_type(a, b);
    const char *force = getenv("FP4DOCTOR_CUDA_PATH"); /* skinny|fused|tiled|simt, for benchmarking */
    const bool skinny_ok = k % 32 == 0 && d != FP4D_DTYPE_F32;
    /* the fused kernel reads each weight row's four NVFP4 scales of a 64-k tile as one word,
     * and indexes its activation chunks with 32-bit offsets (K < 2^24) */
    const bool fused_ok = c->fused_min_m > 0 && b == FP4D_DTYPE_NVFP4 && k % 64 == 0 && k < (INT64_C(1) << 24) &&
                          (d == FP4D_DTYPE_BF16 || d == FP4D_DTYPE_F16);
    if (force) {
        if (!strcmp(force, "skinny") && skinny_ok) return PATH_SKINNY;
        if (!strcmp(force, "fused") && fused_ok) return PATH_FUSED;
        if (!strcmp(force, "tiled") && d != FP4D_DTYPE_F32) return PATH_TILED;
        if (!strcmp(force, "simt")) return PATH_SIMT;
    }
    if (d == FP4D_DTYPE_F32) return PATH_SIMT;
    /* grouped GEMMs keep the one-launch skinny path up to their limit (per-expert launches of
     * the fused kernel are many small grids) */
    if (fused_ok && !grouped && max_rows_per_expert >= c->fused_min_m) return PATH_FUSED;
    if (skinny_ok && max_rows_per_expert <= (grouped && fused_ok ? c->grouped_skinny_max_m : c->skinny_max_m))
        return PATH_SKINNY;
    if (fused_ok) return PATH_FUSED;
    return PATH_TILED;
}

/* The GEMV kernel: plain (one-matrix) problems of small M only, unless another path is forced. */
static bool gemv_ok(const dev_gemm *g)
{
    const char *force = getenv("FP4DOCTOR_CUDA_PATH");
    if (force && strcmp(force, "gemv") != 0) return false;
    return !g->offsets && g->num_experts == 1 && fp4d_cuda_gemv_applies(g->a_type, g->b_format, g->a_rows, g->k);
}

static int64_t max_rows_per_expert(const dev_gemm *g)
{
    if (!g->offsets) return g->a_rows;
    int64_t mx = 0;
    for (int32_t e = 0; e < g->num_experts; e++)
        if (g->offsets[e + 1] - g->offsets[e] > mx) mx = g->offsets[e + 1] - g->offsets[e];
    return mx;
}

/* ---- skinny path --------------------------------------------------------------------- */

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* Device tables of a grouped launch: work items covering each expert's rows in pieces of at
 * most `piece` rows (expert order), and the experts' weight, scale and alpha tables. */
typedef struct expert_tables {
    const fp4d_skinny_item *items;
    const uint8_t *const   *codes;
    const uint8_t *const   *scales;
    const float            *alpha;
    int64_t                 n_items;
    int32_t                 max_item_rows;
    fp4d_skinny_item        first_item; /* the host's copy of items[0] (zero when there is none) */
} expert_tables;

/* Builds the tables into `params`, copied in c's stream: the launches that read them follow in
 * that stream, and the kernels still reading the previous tables come before the copy. (A synchronous cudaMemcpy was used for
 * callers that plan ahead of their launches. From pageable memory it returns once the bytes are
 * staged, not landed, and it runs on the legacy stream, which c's non-blocking stream does not
 * wait for: under several host threads, whose copies queue on that one legacy stream, a skinny
 * kernel read its item and pointer tables before they arrived and faulted - misaligned address,
 * invalid address space - in the MoE stress case. Plain GEMMs pass their one item by value and
 * never showed it.) */
static fp4d_status upload_expert_tables(cuda_ctx *c, const dev_gemm *g, int64_t piece, fp4d_devbuf *params,
                                        expert_tables *t)
{
    int64_t items = 0;
    for (int32_t e = 0; e < g->num_experts; e++) {
        const int64_t r0 = g->offsets ? g->offsets[e] : 0, r1 = g->offsets ? g->offsets[e + 1] : g->a_rows;
        items += (r1 - r0 + piece - 1) / piece;
    }
    FP4D_RETURN_ERROR_IF(items > 65535, UNSUPPORTED, "cuda: %lld work items exceed one launch", (long long)items);
    const size_t items_bytes = align_up((size_t)(items ? items : 1) * sizeof(fp4d_skinny_item), 16);
    const size_t ptr_bytes = align_up((size_t)g->num_experts * sizeof(void *), 16);
    const size_t alpha_bytes = align_up((size_t)g->num_experts * sizeof(float), 16);
    const size_t total = items_bytes + 2 * ptr_bytes + alpha_bytes;
    uint8_t *host = calloc(1, total);
    FP4D_RETURN_ERROR_IF(!host, NOMEM, "cuda: out of host memory");
    fp4d_skinny_item *it = (fp4d_skinny_item *)host;
    int64_t n_items = 0;
    int32_t max_item_rows = 1;
    for (int32_t e = 0; e < g->num_experts; e++) {
        const int64_t r0 = g->offsets ? g->offsets[e] : 0, r1 = g->offsets ? g->offsets[e + 1] : g->a_rows;
        for (int64_t r = r0; r < r1; r += piece) {
            it[n_items].row0 = (int32_t)r;
            it[n_items].rows = (int32_t)(r1 - r < piece ? r1 - r : piece);
            it[n_items].expert = e;
            if (it[n_items].rows > max_item_rows) max_item_rows = it[n_items].rows;
            n_items++;
        }
    }
    memcpy(host + items_bytes, g->b_codes, (size_t)g->num_experts * sizeof(void *));
    memcpy(host + items_bytes + ptr_bytes, g->b_scales, (size_t)g->num_experts * sizeof(void *));
    memcpy(host + items_bytes + 2 * ptr_bytes, g->alpha, (size_t)g->num_experts * sizeof(float));
    fp4d_status st = fp4d_devbuf_reserve(params, total, false, c->stream);
    if (st == FP4D_STATUS_OK) {
        /* from pageable memory the call returns once the bytes are staged: host can be freed */
        cudaError_t e = cudaMemcpyAsync(params->ptr, host, total, cudaMemcpyHostToDevice, c->stream);
        if (e != cudaSuccess) st = fp4d_cuda_status(e, "cuda: upload work items");
    }
    t->first_item = it[0];
    free(host);
    FP4D_FORWARD_IF_ERROR(st);
    t->items = (const fp4d_skinny_item *)params->ptr;
    t->codes = (const uint8_t *const *)((uint8_t *)params->ptr + items_bytes);
    t->scales = (const uint8_t *const *)((uint8_t *)params->ptr + items_bytes + ptr_bytes);
    t->alpha = (const float *)((uint8_t *)params->ptr + items_bytes + 2 * ptr_bytes);
    t->n_items = n_items;
    t->max_item_rows = max_item_rows;
    return FP4D_STATUS_OK;
}

/*
 * Builds the work items and tables of a skinny launch into `params` (device) and fills
 * args. Items cover each expert's rows in pieces of 16 (when no expert has more than 16
 * rows) or 32.
 */
static fp4d_status plan_skinny(cuda_ctx *c, const dev_gemm *g, fp4d_devbuf *params, fp4d_skinny_args *args)
{
    const int64_t mx = max_rows_per_expert(g);
    expert_tables t;
    FP4D_FORWARD_IF_ERROR(upload_expert_tables(c, g, mx <= 16 ? 16 : 32, params, &t));
    const int64_t n_items = t.n_items;
    const int32_t max_item_rows = t.max_item_rows;

    memset(args, 0, sizeof *args);
    args->a_type = g->a_type;
    args->a = g->a;
    args->a_scales = g->a_scales;
    args->a_layout = g->a_layout;
    args->a_rows_total = g->a_rows;
    args->b_format = g->b_format;
    args->b_layout = g->b_layout;
    args->b_stream_codes = g->b_stream;
    args->b_settled = g->b_settled;
    args->b_codes = t.codes;
    args->b_scales = t.scales;
    args->alpha = t.alpha;
    args->n = g->n;
    args->k = g->k;
    args->items = t.items;
    args->num_items = (int32_t)n_items;
    args->max_rows = max_item_rows;
    args->out_type = g->out_type;
    args->out = g->out;
    if (n_items == 1 && g->num_experts == 1) {
        args->single = 1;
        args->single_item = t.first_item;
        args->single_codes = g->b_codes[0];
        args->single_scales = g->b_scales[0];
        args->single_alpha = g->alpha[0];
    }
    args->splits = n_items ? fp4d_cuda_skinny_pick_splits(args, c->sm_count) : 1;
    if (args->splits > 1) {
        size_t pb = 0, cc = 0;
        fp4d_cuda_skinny_scratch(g->n, (int32_t)n_items, args->splits, max_item_rows, &pb, &cc);
        FP4D_FORWARD_IF_ERROR(fp4d_devbuf_reserve(&c->partials, pb, false, c->stream));
        FP4D_FORWARD_IF_ERROR(fp4d_devbuf_reserve(&c->counters, cc * sizeof(uint32_t), true, c->stream));
        args->partials = c->partials.ptr;
        args->counters = c->counters.ptr;
    }
    return FP4D_STATUS_OK;
}

static fp4d_status plan_gemv(cuda_ctx *c, const dev_gemm *g, fp4d_gemv_args *args)
{
    *args = (fp4d_gemv_args){
        .a_type = g->a_type, .a = g->a, .a_scales = g->a_scales, .a_layout = g->a_layout, .m = (int32_t)g->a_rows,
        .b_format = g->b_format, .b_layout = g->b_layout, .b_codes = g->b_codes[0], .b_scales = g->b_scales[0],
        .alpha = g->alpha[0], .n = g->n, .k = g->k, .out_type = g->out_type, .out = g->out,
    };
    size_t pb = 0, cc = 0;
    FP4D_CUDA_TRY(fp4d_cuda_gemv_plan(args, c->sm_count, &pb, &cc), "cuda: GEMV plan");
    if (args->splits > 1) {
        FP4D_FORWARD_IF_ERROR(fp4d_devbuf_reserve(&c->partials, pb, false, c->stream));
        FP4D_FORWARD_IF_ERROR(fp4d_devbuf_reserve(&c->counters, cc * sizeof(uint32_t), true, c->stream));
        args->partials = c->partials.ptr;
        args->counters = c->counters.ptr;
    }
    return FP4D_STATUS_OK;
}

static fp4d_status launch_gemv(const cuda_ctx *c, const fp4d_gemv_args *args)
{
    FP4D_CUDA_TRY(fp4d_cuda_gemv(args, c->stream), "cuda: GEMV launch");
    return FP4D_STATUS_OK;
}

/* Whether the skinny launch of g wants its weights in the stream layout (without it the
 * decode kernel takes these items: FP4DOCTOR_CUDA_STREAM_LAYOUT=0, for A/B timing, or no
 * device memory for the copy). */
static bool wants_stream_codes(const dev_gemm *g)
{
    if (!fp4d_env_switch("FP4DOCTOR_CUDA_STREAM_LAYOUT")) return false;
    return !g->b_stream && fp4d_cuda_stream_codes_wanted(g->a_type, g->b_format, g->k, max_rows_per_expert(g));
}

/* The stream layout of one expert's weights (codes, then scales, at dst). */
static int stream_layout_of(const dev_gemm *g, int32_t e, uint8_t *dst, size_t scales_at, cudaStream_t s)
{
    const int err = fp4d_cuda_stream_codes(g->b_codes[e], dst, g->n, g->k, s);
    return err ? err : fp4d_cuda_stream_scales(g->b_scales[e], g->b_layout, g->b_format, dst + scales_at, g->n, g->k, s);
}

static size_t stream_codes_room(const dev_gemm *g) { return align_up(fp4d_cuda_stream_codes_bytes(g->n, g->k), 256); }
static size_t stream_room(const dev_gemm *g)
{
    return stream_codes_room(g) + align_up(fp4d_cuda_stream_scales_bytes(g->n, g->k), 256);
}

/* Every expert's weights in the stream layout in c->bstream; *tables (a host array of 2 x
 * num_experts pointers, codes then scales, that the caller frees) points at them. */
static fp4d_status stream_layout_copy(cuda_ctx *c, const dev_gemm *g, const uint8_t ***tables)
{
    const size_t stride = stream_room(g);
    FP4D_FORWARD_IF_ERROR(fp4d_devbuf_reserve(&c->bstream, stride * (size_t)g->num_experts, false, c->stream));
    const uint8_t **p = calloc((size_t)g->num_experts * 2, sizeof *p);
    FP4D_RETURN_ERROR_IF(!p, NOMEM, "cuda: out of host memory");
    for (int32_t e = 0; e < g->num_experts; e++) {
        uint8_t *dst = (uint8_t *)c->bstream.ptr + (size_t)e * stride;
        if (g->offsets && g->offsets[e + 1] == g->offsets[e]) { /* no rows: never read */
            p[e] = g->b_codes[e];
            p[g->num_experts + e] = g->b_scales[e];
            continue;
        }
        const int err = stream_layout_of(g, e, dst, stream_codes_room(g), c->stream);
        if (err) {
            free(p);
            return fp4d_cuda_status(err, "cuda: stream layout of the weights");
        }
        p[e] = dst;
        p[g->num_experts + e] = dst + stream_codes_room(g);
    }
    *tables = p;
    return FP4D_STATUS_OK;
}

static fp4d_status launch_skinny(const cuda_ctx *c, const fp4d_skinny_args *args)
{
    if (args->num_items == 0) return FP4D_STATUS_OK;
    FP4D_CUDA_TRY(fp4d_cuda_skinny_gemm(args, c->stream), "cuda: skinny GEMM launch");
    return FP4D_STATUS_OK;
}

/* The activations in the dense type d (element size esz): g->a itself, or all of A dequantized
 * (FP4) or converted into c->wa (row slices of a dense matrix are trivial, unlike those of
 * swizzled scales). */
static fp4d_status activations_as(cuda_ctx *c, const dev_gemm *g, fp4d_dtype d, size_t esz, const void **a)
{
    *a = g->a;
    if (g->a_type == d) return FP4D_STATUS_OK;
    FP4D_FORWARD_IF_ERROR(fp4d_devbuf_reserve(&c->wa, (size_t)g->a_rows * (size_t)g->k * esz, false, c->stream));
    if (is_fp4(g->a_type)) {
        fp4d_dev_fp4 src = {g->a, g->a_scales, g->a_rows, g->k, g->a_type, g->a_layout};
        FP4D_CUDA_TRY(fp4d_cuda_dequantize(&src, d, c->wa.ptr, c->stream), "cuda: dequantize A");
    } else {
        FP4D_CUDA_TRY(fp4d_cuda_convert(g->a_type, g->a, d, c->wa.ptr, (size_t)(g->a_rows * g->k), c->stream),
                      "cuda: convert A");
    }
    *a = c->wa.ptr;
    return FP4D_STATUS_OK;
}

/* ---- dense paths --------------------------------------------------------------------- */

static fp4d_status run_dense(cuda_ctx *c, const dev_gemm *g, gemm_path path)
{
    const fp4d_dtype d = path == PATH_SIMT ? FP4D_DTYPE_F32 : dense_type(g->a_type, g->b_format);
    const size_t esz = fp4d_dtype_get(d)->element_bits / 8;
    const size_t osz = fp4d_out_elem_size(g->out_type);
    const void *a = NULL;
    FP4D_FORWARD_IF_ERROR(activations_as(c, g, d, esz, &a));
    FP4D_FORWARD_IF_ERROR(fp4d_devbuf_reserve(&c->wb, (size_t)g->n * (size_t)g->k * esz, false, c->stream));
    for (int32_t e = 0; e < g->num_experts; e++) {
        const int64_t r0 = g->offsets ? g->offsets[e] : 0, r1 = g->offsets ? g->offsets[e + 1] : g->a_rows;
        if (r1 == r0) continue;
        fp4d_dev_fp4 w = {g->b_codes[e], g->b_scales[e], g->n, g->k, g->b_format, g->b_layout};
        FP4D_CUDA_TRY(fp4d_cuda_dequantize(&w, d, c->wb.ptr, c->stream), "cuda: dequantize B");
        const void *a_rows = (const uint8_t *)a + (size_t)r0 * (size_t)g->k * esz;
        void *o = (uint8_t *)g->out + (size_t)r0 * (size_t)g->n * osz;
        if (path == PATH_SIMT)
            FP4D_CUDA_TRY(fp4d_cuda_simt_gemm(a_rows, c->wb.ptr, r1 - r0, g->n, g->k, g->alpha[e], g->out_type, o,
                                              c->stream),
                          "cuda: simt GEMM");
        else
            FP4D_CUDA_TRY(fp4d_cuda_tiled_gemm(d, a_rows, c->wb.ptr, r1 - r0, g->n, g->k, g->alpha[e], g->out_type,
                                               o, c->stream),
                          "cuda: tiled GEMM");
    }
    return FP4D_STATUS_OK;
}

/* A grouped GEMM as one launch of the register-decode wgmma kernel (sm_90a): an item per
 * token tile of each expert. 128 per-expert launches, each a small grid with split-K, had run
 * the bench's 128-expert MoE at 4096 tokens at half the per-expert cuBLAS loop's speed. */
static fp4d_status run_fused_grouped(cuda_ctx *c, const dev_gemm *g, const void *a, fp4d_dtype d, int64_t max_rows)
{
    const size_t esz = 2;
    const int tile = fp4d_cuda_fused_grouped_tok(max_rows);
    expert_tables t;
    FP4D_FORWARD_IF_ERROR(upload_expert_tables(c, g, tile, &c->gparams, &t));
    if (t.n_items == 0) return FP4D_STATUS_OK;
    size_t partial_floats = 0, counter_count = 0;
    const int32_t splits = fp4d_cuda_fused_grouped_plan(t.n_items, t.max_item_rows, g->n, g->k, c->sm_count,
                                                        &partial_floats, &counter_count);
    if (splits > 1) {
        FP4D_FORWARD_IF_ERROR(fp4d_devbuf_reserve(&c->partials, partial_floats * sizeof(float), false, c->stream));
        FP4D_FORWARD_IF_ERROR(fp4d_devbuf_reserve(&c->counters, counter_count * sizeof(uint32_t), true, c->stream));
    }
    FP4D_FORWARD_IF_ERROR(fp4d_devbuf_reserve(&c->aperm, (size_t)g->a_rows * (size_t)g->k * esz, false, c->stream));
    FP4D_CUDA_TRY(fp4d_cuda_fused_gemm_grouped(d, a, g->a_rows, t.items, (int32_t)t.n_items, t.max_item_rows, t.codes,
                                               t.scales, t.alpha, g->b_layout, g->n, g->k, g->out_type, g->out, splits,
                                               splits > 1 ? c->partials.ptr : NULL, splits > 1 ? c->counters.ptr : NULL,
                                               c->aperm.ptr, c->stream),
                  "cuda: grouped wgmma GEMM");
    return FP4D_STATUS_OK;
}

/* Fused path: activations in the MMA type (FP4 activations dequantized to bf16 first, exact),
 * then one fused launch per non-empty expert (one for a plain GEMM; on sm_90a one for all
 * experts of a grouped GEMM below the dense route's rows, FP4DOCTOR_CUDA_GROUPED_LAUNCH=0: per
 * expert, for A/B timing). */
static fp4d_status run_fused(cuda_ctx *c, const dev_gemm *g)
{
    const fp4d_dtype d = dense_type(g->a_type, g->b_format);
    const size_t esz = 2;
    const size_t osz = fp4d_out_elem_size(g->out_type);
    const void *a = NULL;
    FP4D_FORWARD_IF_ERROR(activations_as(c, g, d, esz, &a));
    if (g->offsets && fp4d_env_switch("FP4DOCTOR_CUDA_GROUPED_LAUNCH") && fp4d_cuda_fused_grouped_available()) {
        const int64_t max_rows = max_rows_per_expert(g);
        if (max_rows < c->wg_dense_min_m) return run_fused_grouped(c, g, a, d, max_rows);
    }
    for (int32_t e = 0; e < g->num_experts; e++) {
        const int64_t r0 = g->offsets ? g->offsets[e] : 0, r1 = g->offsets ? g->offsets[e + 1] : g->a_rows;
        if (r1 == r0) continue;
        const int32_t splits = fp4d_cuda_fused_splits(r1 - r0, g->n, g->k, c->sm_count);
        if (splits > 1) {
            size_t partial_floats = 0, counter_count = 0;
            fp4d_cuda_fused_scratch(r1 - r0, g->n, splits, &partial_floats, &counter_count);
            FP4D_FORWARD_IF_ERROR(fp4d_devbuf_reserve(&c->partials, partial_floats * sizeof(float), false, c->stream));
            FP4D_FORWARD_IF_ERROR(fp4d_devbuf_reserve(&c->counters, counter_count * sizeof(uint32_t), true, c->stream));
        }
        const void *a_rows = (const uint8_t *)a + (size_t)r0 * (size_t)g->k * esz;
        void *o = (uint8_t *)g->out + (size_t)r0 * (size_t)g->n * osz;
        /* many rows: dequantize the weights once (exact) and run the plain wgmma GEMM, whose
         * loop then only feeds the tensor cores; without room for the dense copy the
         * packed-weight kernel below runs instead */
        if (r1 - r0 >= c->wg_dense_min_m && fp4d_cuda_dense_wgmma_available() &&
            fp4d_devbuf_reserve(&c->wb, (size_t)g->n * (size_t)g->k * esz, false, c->stream) == FP4D_STATUS_OK) {
            fp4d_dev_fp4 w = {g->b_codes[e], g->b_scales[e], g->n, g->k, g->b_format, g->b_layout};
            FP4D_CUDA_TRY(fp4d_cuda_dequantize(&w, d, c->wb.ptr, c->stream), "cuda: dequantize B");
            /* its scratch also covers the K parts of the persistent kernel's last round: only a
             * speed-up, so without memory for it (splits == 1) the round runs whole */
            size_t dense_floats = 0, dense_counters = 0;
            fp4d_cuda_dense_wgmma_scratch(r1 - r0, g->n, g->k, splits, &dense_floats, &dense_counters);
            if (dense_floats &&
                (fp4d_devbuf_reserve(&c->partials, dense_floats * sizeof(float), false, c->stream) != FP4D_STATUS_OK ||
                 fp4d_devbuf_reserve(&c->counters, dense_counters * sizeof(uint32_t), true, c->stream) != FP4D_STATUS_OK)) {
                FP4D_RETURN_ERROR_IF(splits > 1, NOMEM, "cuda: split-K scratch: %s", fp4d_last_error());
                dense_floats = 0;
            }
            FP4D_CUDA_TRY(fp4d_cuda_dense_wgmma(d, a_rows, c->wb.ptr, r1 - r0, g->n, g->k, g->alpha[e], g->out_type, o,
                                                splits, dense_floats ? c->partials.ptr : NULL,
                                                dense_floats ? c->counters.ptr : NULL, c->stream),
                          "cuda: wgmma GEMM");
            continue;
        }
        /* room for the k-permuted activations of the register-decode wgmma kernel (without it
         * the other kernels run) */
        void *scratch =
            fp4d_devbuf_reserve(&c->aperm, (size_t)(r1 - r0) * (size_t)g->k * esz, false, c->stream) == FP4D_STATUS_OK
                ? c->aperm.ptr
                : NULL;
        FP4D_CUDA_TRY(fp4d_cuda_fused_gemm(d, a_rows, g->b_codes[e], g->b_scales[e], g->b_layout, r1 - r0, g->n, g->k,
                                           g->alpha[e], g->out_type, o, splits, splits > 1 ? c->partials.ptr : NULL,
                                           splits > 1 ? c->counters.ptr : NULL, scratch, c->stream),
                      "cuda: fused GEMM");
    }
    return FP4D_STATUS_OK;
}

static fp4d_status run_dev_gemm(cuda_ctx *c, const dev_gemm *g)
{
    if (gemv_ok(g)) {
        fp4d_gemv_args args;
        FP4D_FORWARD_IF_ERROR(plan_gemv(c, g, &args));
        return launch_gemv(c, &args);
    }
    const gemm_path path = choose_path(c, g->a_type, g->b_format, g->k, max_rows_per_expert(g), g->offsets != NULL);
    if (path == PATH_FUSED) return run_fused(c, g);
    if (path != PATH_SKINNY) return run_dense(c, g, path);
    /* the weight-streaming kernel reads re-encoded codes: made here per call (bench() makes
     * them once, as a server would at load time) */
    dev_gemm gs = *g;
    const uint8_t **stream = NULL;
    if (wants_stream_codes(g)) {
        const fp4d_status st = stream_layout_copy(c, g, &stream);
        if (st != FP4D_STATUS_OK && st != FP4D_STATUS_NOMEM) return st;
        if (st == FP4D_STATUS_OK) {
            gs.b_codes = stream;
            gs.b_scales = stream + g->num_experts;
            gs.b_stream = true;
        } else {
            fp4d_clear_error(); /* no room for the copy: the natural layout, which the decode kernel takes */
        }
    }
    fp4d_skinny_args args;
    const fp4d_status st = plan_skinny(c, &gs, &c->params, &args); /* tables copied in c's stream */
    free(stream);
    FP4D_FORWARD_IF_ERROR(st);
    return launch_skinny(c, &args);
}

/* ---- the iface ----------------------------------------------------------------------- */

static fp4d_status cuda_init(void *user_data, int device, void **out, fp4d_reason *why)
{
    (void)user_data;
    *out = NULL;
    cuda_ctx *c = calloc(1, sizeof *c);
    FP4D_RETURN_ERROR_IF(!c, NOMEM, "cuda: out of memory");
    fp4d_status st = fp4d_cuda_open_device(device, &c->device, &c->sm_count, &c->l2_bytes, &c->cc, why);
    if (st != FP4D_STATUS_OK) {
        free(c);
        return st;
    }
    int bin = 0, ptx = 0;
    int e = fp4d_cuda_kernel_binary_version(c->device, &bin, &ptx);
    if (e != 0) {
        fp4d_cuda_reason(why, "this fp4doctor has no kernels for compute capability %d.%d (built for %s): %s",
                         c->cc / 10, c->cc % 10, FP4D_CUDA_ARCHS_BUILT, cudaGetErrorString((cudaError_t)e));
        free(c);
        return fp4d_set_error(FP4D_STATUS_UNSUPPORTED, "%s", why ? why->text : "no kernels for this GPU");
    }
    if (cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking) != cudaSuccess) {
        fp4d_cuda_reason(why, "cannot create a CUDA stream on GPU %d", c->device);
        free(c);
        return fp4d_set_error(FP4D_STATUS_DEVICE, "cannot create a CUDA stream");
    }
    c->skinny_max_m = FP4D_CUDA_SKINNY_MAX_M_DEFAULT;
    c->grouped_skinny_max_m = fp4d_cuda_fused_grouped_available() ? FP4D_CUDA_GROUPED_SKINNY_MAX_M_WGMMA : c->skinny_max_m;
    const long skinny_max_m = fp4d_env_knob("FP4DOCTOR_CUDA_SKINNY_MAX_M", 1, KNOB_ROWS_MAX, 0); /* sets both */
    if (skinny_max_m > 0) c->skinny_max_m = c->grouped_skinny_max_m = skinny_max_m;
    c->fused_min_m = fp4d_env_knob("FP4DOCTOR_CUDA_FUSED_MIN_M", 0, KNOB_ROWS_MAX, FP4D_CUDA_FUSED_MIN_M_DEFAULT);
    if (!fp4d_cuda_fused_available(c->device)) c->fused_min_m = 0; /* too little shared memory per block */
    const long dense_min_m = fp4d_env_knob("FP4DOCTOR_CUDA_WG_DENSE_MIN_M", 0, KNOB_ROWS_MAX, FP4D_CUDA_WG_DENSE_MIN_M_DEFAULT);
    c->wg_dense_min_m = dense_min_m > 0 ? dense_min_m : INT64_MAX;
    *out = c;
    return FP4D_STATUS_OK;
}

static void cuda_free(void *ctx)
{
    cuda_ctx *c = ctx;
    if (!c) return;
    cudaSetDevice(c->device);
    if (c->stream) cudaStreamSynchronize(c->stream);
    fp4d_devbuf *bufs[] = {&c->a, &c->a_sc, &c->b, &c->b_sc, &c->out, &c->wa, &c->wb, &c->bstream,
                           &c->params, &c->partials, &c->counters, &c->amax, &c->aperm, &c->gparams};
    for (size_t i = 0; i < FP4D_ARRAY_LEN(bufs); i++) fp4d_devbuf_free(bufs[i]);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c);
}

static bool cuda_supports(void *ctx, const fp4d_gemm_desc *d, fp4d_reason *why)
{
    (void)ctx;
    if (!is_fp4(d->b_type)) {
        fp4d_cuda_reason(why, "weights must be nvfp4 or mxfp4");
        return false;
    }
    if (d->a_type != FP4D_DTYPE_F32 && d->a_type != FP4D_DTYPE_BF16 && d->a_type != FP4D_DTYPE_F16 && !is_fp4(d->a_type)) {
        fp4d_cuda_reason(why, "unsupported activation type");
        return false;
    }
    if (d->out_type != FP4D_DTYPE_F32 && d->out_type != FP4D_DTYPE_BF16 && d->out_type != FP4D_DTYPE_F16) {
        fp4d_cuda_reason(why, "output must be f32, bf16 or f16");
        return false;
    }
    if (d->m > (INT64_C(1) << 31) || d->n > (INT64_C(1) << 31)) {
        fp4d_cuda_reason(why, "M and N above 2^31 are not supported");
        return false;
    }
    /* Row tiles sit on the grid's y or z dimension (at most 65535 blocks): 32-row tiles on the
     * simt path (f32 activations, f16 with MXFP4 weights), 128 and more on the others. Refused
     * here rather than failing at launch, which the doctor would count against the backend.
     * For grouped problems m is the total (conservative: each expert runs on its own). */
    const int64_t max_rows = dense_type(d->a_type, d->b_type) == FP4D_DTYPE_F32 ? CUDA_MAX_ROWS_SIMT : CUDA_MAX_ROWS;
    if (d->m > max_rows) {
        fp4d_cuda_reason(why, "more than %lld rows per call (CUDA grid limit): split the call", (long long)max_rows);
        return false;
    }
    return true;
}

/* What a failed call returns, once nothing it queued still runs: a copy from or to the
 * caller's buffers runs asynchronously where they are pinned, and must not outlive the call
 * that the caller then sees return. The call's own error message stays. */
static fp4d_status settled(cuda_ctx *c, fp4d_status st)
{
    if (st != FP4D_STATUS_OK) {
        (void)cudaStreamSynchronize(c->stream);
        (void)cudaGetLastError();
    }
    return st;
}

static fp4d_status gemm_queued(cuda_ctx *c, const fp4d_gemm_problem *p)
{
    FP4D_FORWARD_IF_ERROR(fp4d_cuda_upload_matrix(&p->a, &c->a, &c->a_sc, c->stream));
    FP4D_FORWARD_IF_ERROR(fp4d_cuda_upload_matrix(&p->b, &c->b, &c->b_sc, c->stream));
    const size_t out_bytes = (size_t)p->a.rows * (size_t)p->b.rows * fp4d_out_elem_size(p->out_type);
    FP4D_FORWARD_IF_ERROR(fp4d_devbuf_reserve(&c->out, out_bytes, false, c->stream));
    FP4D_CUDA_TRY(cudaMemcpyAsync(c->out.ptr, p->out, out_bytes, cudaMemcpyHostToDevice, c->stream), "cuda: upload out");

    const uint8_t *bc = c->b.ptr, *bs = c->b_sc.ptr;
    dev_gemm g = {
        .a_type = p->a.dtype, .a = c->a.ptr, .a_scales = c->a_sc.ptr, .a_layout = p->a.scale_layout,
        .a_rows = p->a.rows, .b_format = p->b.dtype, .b_layout = p->b.scale_layout, .num_experts = 1,
        .b_codes = &bc, .b_scales = &bs, .alpha = &p->alpha, .offsets = NULL, .n = p->b.rows, .k = p->a.cols,
        .out_type = p->out_type, .out = c->out.ptr,
    };
    FP4D_FORWARD_IF_ERROR(run_dev_gemm(c, &g));
    FP4D_CUDA_TRY(cudaMemcpyAsync(p->out, c->out.ptr, out_bytes, cudaMemcpyDeviceToHost, c->stream), "cuda: download out");
    return fp4d_cuda_sync(c->stream, "cuda: GEMM");
}

static fp4d_status cuda_gemm(void *ctx, const fp4d_gemm_problem *p)
{
    cuda_ctx *c = ctx;
    FP4D_CUDA_TRY(cudaSetDevice(c->device), "cuda: cudaSetDevice");
    return settled(c, gemm_queued(c, p));
}

static fp4d_status grouped_queued(cuda_ctx *c, const fp4d_grouped_gemm_problem *p)
{
    const int32_t E = p->num_experts;
    const int64_t n = p->b[0].rows, k = p->a.cols;
    if (p->a.rows > 0) FP4D_FORWARD_IF_ERROR(fp4d_cuda_upload_matrix(&p->a, &c->a, &c->a_sc, c->stream));
    /* all experts' weights into one buffer: codes, then scales */
    const size_t cb = fp4d_cuda_matrix_data_bytes(&p->b[0]), sb = align_up(fp4d_cuda_matrix_scale_bytes(&p->b[0]), 16);
    const size_t cb16 = align_up(cb, 16);
    FP4D_FORWARD_IF_ERROR(fp4d_devbuf_reserve(&c->b, (cb16 + sb) * (size_t)E, false, c->stream));
    const uint8_t **codes = calloc((size_t)E * 2, sizeof *codes);
    FP4D_RETURN_ERROR_IF(!codes, NOMEM, "cuda: out of memory");
    const uint8_t **scales = codes + E;
    fp4d_status st = FP4D_STATUS_OK;
    for (int32_t e = 0; e < E && st == FP4D_STATUS_OK; e++) {
        uint8_t *dc = (uint8_t *)c->b.ptr + (size_t)e * cb16, *ds = (uint8_t *)c->b.ptr + (size_t)E * cb16 + (size_t)e * sb;
        codes[e] = dc;
        scales[e] = ds;
        if (cudaMemcpyAsync(dc, p->b[e].data, cb, cudaMemcpyHostToDevice, c->stream) != cudaSuccess ||
            cudaMemcpyAsync(ds, p->b[e].scales, fp4d_cuda_matrix_scale_bytes(&p->b[e]), cudaMemcpyHostToDevice,
                            c->stream) != cudaSuccess)
            st = fp4d_set_error(FP4D_STATUS_DEVICE, "cuda: upload of expert %d failed", (int)e);
    }
    const size_t out_bytes = (size_t)p->a.rows * (size_t)n * fp4d_out_elem_size(p->out_type);
    if (st == FP4D_STATUS_OK && out_bytes) {
        st = fp4d_devbuf_reserve(&c->out, out_bytes, false, c->stream);
        if (st == FP4D_STATUS_OK &&
            cudaMemcpyAsync(c->out.ptr, p->out, out_bytes, cudaMemcpyHostToDevice, c->stream) != cudaSuccess)
            st = fp4d_set_error(FP4D_STATUS_DEVICE, "cuda: upload out failed");
    }
    if (st == FP4D_STATUS_OK && p->a.rows > 0) {
        dev_gemm g = {
            .a_type = p->a.dtype, .a = c->a.ptr, .a_scales = c->a_sc.ptr, .a_layout = p->a.scale_layout,
            .a_rows = p->a.rows, .b_format = p->b[0].dtype, .b_layout = p->b[0].scale_layout, .num_experts = E,
            .b_codes = codes, .b_scales = scales, .alpha = p->alpha, .offsets = p->expert_offsets, .n = n, .k = k,
            .out_type = p->out_type, .out = c->out.ptr,
        };
        st = run_dev_gemm(c, &g);
        if (st == FP4D_STATUS_OK &&
            cudaMemcpyAsync(p->out, c->out.ptr, out_bytes, cudaMemcpyDeviceToHost, c->stream) != cudaSuccess)
            st = fp4d_set_error(FP4D_STATUS_DEVICE, "cuda: download out failed");
    }
    fp4d_status sync = fp4d_cuda_sync(c->stream, "cuda: grouped GEMM");
    free(codes);
    return st != FP4D_STATUS_OK ? st : sync;
}

static fp4d_status cuda_grouped_gemm(void *ctx, const fp4d_grouped_gemm_problem *p)
{
    cuda_ctx *c = ctx;
    FP4D_CUDA_TRY(cudaSetDevice(c->device), "cuda: cudaSetDevice");
    return settled(c, grouped_queued(c, p));
}

static fp4d_status quantize_queued(cuda_ctx *c, fp4d_quantize_problem *q);

static fp4d_status cuda_quantize(void *ctx, fp4d_quantize_problem *q)
{
    cuda_ctx *c = ctx;
    FP4D_RETURN_ERROR_IF(q->params.format != FP4D_DTYPE_NVFP4 || q->params.convention != FP4D_CONV_FLASHINFER_EXACT,
                         UNSUPPORTED, "cuda: the GPU quantizer implements NVFP4 with the flashinfer-exact convention only");
    FP4D_RETURN_ERROR_IF(q->src_type != FP4D_DTYPE_F32 && q->src_type != FP4D_DTYPE_BF16 && q->src_type != FP4D_DTYPE_F16,
                         INVALID_ARG, "cuda: quantize source must be f32, bf16 or f16");
    FP4D_RETURN_ERROR_IF(q->cols % 16 != 0 || q->rows < 0, INVALID_ARG, "cuda: quantize needs cols %% 16 == 0");
    FP4D_RETURN_ERROR_IF(!(q->params.encode_scale >= 0.0f), INVALID_ARG, "cuda: encode_scale must be >= 0");
    FP4D_CUDA_TRY(cudaSetDevice(c->device), "cuda: cudaSetDevice");
    return settled(c, quantize_queued(c, q));
}

static fp4d_status quantize_queued(cuda_ctx *c, fp4d_quantize_problem *q)
{
    const fp4d_matrix src = {q->src_type, q->rows, q->cols, q->src, NULL, FP4D_LAYOUT_LINEAR};
    const size_t code_bytes = (size_t)q->rows * (size_t)q->cols / 2;
    const size_t scale_bytes = fp4d_scale_buffer_size(q->params.scale_layout, q->rows, q->cols / 16);
    if (q->rows == 0 || q->cols == 0) {
        q->result.encode_scale = q->params.encode_scale > 0 ? q->params.encode_scale : INFINITY;
        q->result.decode_scale = q->params.encode_scale > 0 ? 1.0f / q->params.encode_scale : 0.0f;
        return FP4D_STATUS_OK;
    }
    FP4D_FORWARD_IF_ERROR(fp4d_cuda_upload_matrix(&src, &c->a, &c->a_sc, c->stream));
    float gs = q->params.encode_scale, decode;
    if (gs > 0.0f) {
        decode = 1.0f / gs;
    } else {
        /* gs = 2688 / amax with amax = nan_to_num(|x|).max(): NaN ignored, inf -> FLT_MAX
         * (the same derivation as src/formats/convention.c for flashinfer-exact) */
        FP4D_FORWARD_IF_ERROR(fp4d_devbuf_reserve(&c->amax, sizeof(float), false, c->stream));
        FP4D_CUDA_TRY(fp4d_cuda_amax(q->src_type, c->a.ptr, code_bytes * 2, c->amax.ptr, c->stream), "cuda: amax");
        float amax = 0.0f;
        FP4D_CUDA_TRY(cudaMemcpyAsync(&amax, c->amax.ptr, sizeof amax, cudaMemcpyDeviceToHost, c->stream), "cuda: amax");
        FP4D_CUDA_TRY(cudaStreamSynchronize(c->stream), "cuda: amax");
        if (isinf(amax)) amax = FLT_MAX;
        gs = 2688.0f / amax;
        decode = amax / 2688.0f;
    }
    FP4D_FORWARD_IF_ERROR(fp4d_devbuf_reserve(&c->b, code_bytes, false, c->stream));
    FP4D_FORWARD_IF_ERROR(fp4d_devbuf_reserve(&c->b_sc, scale_bytes, false, c->stream));
    if (q->params.scale_layout != FP4D_LAYOUT_LINEAR)
        FP4D_CUDA_TRY(cudaMemsetAsync(c->b_sc.ptr, 0, scale_bytes, c->stream), "cuda: clear scale padding");
    FP4D_CUDA_TRY(fp4d_cuda_quantize_nvfp4(q->src_type, c->a.ptr, q->rows, q->cols, gs, q->params.scale_layout,
                                           c->b.ptr, c->b_sc.ptr, c->stream),
                  "cuda: quantize launch");
    FP4D_CUDA_TRY(cudaMemcpyAsync(q->codes, c->b.ptr, code_bytes, cudaMemcpyDeviceToHost, c->stream), "cuda: download codes");
    FP4D_CUDA_TRY(cudaMemcpyAsync(q->scales, c->b_sc.ptr, scale_bytes, cudaMemcpyDeviceToHost, c->stream),
                  "cuda: download scales");
    FP4D_FORWARD_IF_ERROR(fp4d_cuda_sync(c->stream, "cuda: quantize"));
    q->result.encode_scale = gs;
    q->result.decode_scale = decode;
    return FP4D_STATUS_OK;
}

static int cuda_score(void *ctx, const fp4d_gemm_desc *d)
{
    (void)ctx;
    (void)d;
    return 50; /* below native vendor paths (cublaslt), above host backends */
}

/* ---- bench --------------------------------------------------------------------------- */

enum { BENCH_MAX_COPIES = 64 };

typedef struct cuda_bench_state {
    cuda_ctx        *c;
    gemm_path        path;
    int              copies;
    dev_gemm         g[BENCH_MAX_COPIES];
    fp4d_skinny_args args[BENCH_MAX_COPIES];
    fp4d_gemv_args   gargs[BENCH_MAX_COPIES];
    fp4d_devbuf      params[BENCH_MAX_COPIES];
} cuda_bench_state;

static fp4d_status bench_call(void *state, int copy)
{
    cuda_bench_state *s = state;
    if (s->path == PATH_GEMV) return launch_gemv(s->c, &s->gargs[copy]);
    if (s->path == PATH_SKINNY) return launch_skinny(s->c, &s->args[copy]);
    if (s->path == PATH_FUSED) return run_fused(s->c, &s->g[copy]);
    return run_dense(s->c, &s->g[copy], s->path);
}

/* The benchmarks outside the GEMM interface share their frame: a context of their own on
 * `device` (stored in *ctx_slot, a field of `state`), a `prepare` step that puts the operands in
 * it (and may ask for rotated copies), the timed calls, and the context closed again whatever
 * happened. */
typedef fp4d_status (*bench_prepare_fn)(void *state, int *copies);

static fp4d_status bench_in_own_context(int device, cuda_ctx **ctx_slot, void *state, bench_prepare_fn prepare,
                                        fp4d_cuda_bench_fn call, int repeats, fp4d_bench_result *out)
{
    void *ctx = NULL;
    fp4d_reason why;
    FP4D_FORWARD_IF_ERROR(cuda_init(NULL, device, &ctx, &why));
    cuda_ctx *c = ctx;
    *ctx_slot = c;
    int copies = 1;
    fp4d_status st = prepare(state, &copies);
    if (st == FP4D_STATUS_OK) st = fp4d_cuda_time(c->stream, call, state, copies, repeats, out);
    cuda_free(c);
    return st;
}

typedef struct quant_bench_state {
    cuda_ctx  *c;
    fp4d_dtype src_type;
    int64_t    rows, cols;
    int        layout;
} quant_bench_state;

static fp4d_status quant_prepare(void *state, int *copies)
{
    (void)copies; /* the source is larger than L2 for the sizes `fp4doctor bench` uses: no rotation */
    quant_bench_state *s = state;
    fp4d_status st = fp4d_cuda_make_bench_plain(s->src_type, s->rows, s->cols, 7, &s->c->a, s->c->stream);
    if (st == FP4D_STATUS_OK) st = fp4d_devbuf_reserve(&s->c->b, (size_t)(s->rows * s->cols / 2), false, s->c->stream);
    if (st == FP4D_STATUS_OK)
        st = fp4d_devbuf_reserve(&s->c->b_sc, fp4d_scale_buffer_size(s->layout, s->rows, s->cols / 16), false, s->c->stream);
    return st;
}

static fp4d_status quant_call(void *state, int copy)
{
    (void)copy;
    quant_bench_state *s = state;
    FP4D_CUDA_TRY(fp4d_cuda_quantize_nvfp4(s->src_type, s->c->a.ptr, s->rows, s->cols, 1.0f, s->layout, s->c->b.ptr,
                                           s->c->b_sc.ptr, s->c->stream),
                  "cuda: quantize");
    return FP4D_STATUS_OK;
}

/* The quantize kernel with a given (static) encode scale. */
fp4d_status fp4d_cuda_bench_quantize(int device, fp4d_dtype src_type, int64_t rows, int64_t cols,
                                     fp4d_scale_layout layout, int repeats, fp4d_bench_result *out)
{
    quant_bench_state s = {NULL, src_type, rows, cols, layout};
    return bench_in_own_context(device, &s.c, &s, quant_prepare, quant_call, repeats, out);
}

typedef struct copy_bench_state {
    cuda_ctx *c;
    size_t    bytes;
} copy_bench_state;

static fp4d_status copy_prepare(void *state, int *copies)
{
    (void)copies;
    copy_bench_state *s = state;
    fp4d_status st = fp4d_devbuf_reserve(&s->c->a, s->bytes, true, s->c->stream);
    if (st == FP4D_STATUS_OK) st = fp4d_devbuf_reserve(&s->c->b, s->bytes, false, s->c->stream);
    return st;
}

static fp4d_status copy_call(void *state, int copy)
{
    (void)copy;
    copy_bench_state *s = state;
    FP4D_CUDA_TRY(cudaMemcpyAsync(s->c->b.ptr, s->c->a.ptr, s->bytes, cudaMemcpyDeviceToDevice, s->c->stream),
                  "cuda: copy");
    return FP4D_STATUS_OK;
}

fp4d_status fp4d_cuda_bench_copy(int device, size_t bytes, int repeats, fp4d_bench_result *out)
{
    copy_bench_state s = {NULL, bytes};
    return bench_in_own_context(device, &s.c, &s, copy_prepare, copy_call, repeats, out);
}

typedef struct read_bench_state {
    cuda_ctx *c;
    size_t    bytes, stride;
    bool      dependent;
} read_bench_state;

static fp4d_status read_prepare(void *state, int *copies)
{
    read_bench_state *s = state;
    /* rotated like the GEMM benchmark's weight copies, so that L2 serves none of it */
    *copies = fp4d_cuda_rotation_copies(s->stride, s->c->l2_bytes);
    fp4d_status st = fp4d_devbuf_reserve(&s->c->b, s->stride * (size_t)*copies, true, s->c->stream);
    if (st == FP4D_STATUS_OK) st = fp4d_devbuf_reserve(&s->c->counters, sizeof(uint32_t), true, s->c->stream);
    return st;
}

static fp4d_status read_call(void *state, int copy)
{
    read_bench_state *s = state;
    FP4D_CUDA_TRY(fp4d_cuda_read_stream((const uint8_t *)s->c->b.ptr + (size_t)copy * s->stride, s->bytes,
                                        s->dependent, (uint32_t *)s->c->counters.ptr, s->c->sm_count, s->c->stream),
                  "cuda: read");
    return FP4D_STATUS_OK;
}

fp4d_status fp4d_cuda_bench_read(int device, size_t bytes, bool dependent, int repeats, fp4d_bench_result *out)
{
    read_bench_state s = {NULL, bytes & ~(size_t)15, align_up(bytes, 256), dependent};
    return bench_in_own_context(device, &s.c, &s, read_prepare, read_call, repeats, out);
}

static fp4d_status cuda_bench(void *ctx, const fp4d_gemm_desc *d, int repeats, fp4d_bench_result *out)
{
    cuda_ctx *c = ctx;
    FP4D_CUDA_TRY(cudaSetDevice(c->device), "cuda: cudaSetDevice");
    cuda_bench_state *s = calloc(1, sizeof *s);
    FP4D_RETURN_ERROR_IF(!s, NOMEM, "cuda: out of memory");
    const bool grouped = d->num_experts > 0;
    const int32_t E = grouped ? d->num_experts : 1;
    const int top_k = grouped && d->m % 8 == 0 ? 8 : 1;
    const fp4d_dtype_traits *bt = fp4d_dtype_get(d->b_type);
    const size_t cb = align_up((size_t)(d->n * d->k / 2), 256);
    const size_t sb = align_up(fp4d_scale_buffer_size(d->b_layout, d->n, d->k / bt->block_size), 256);
    /* plain: rotate whole weight copies; grouped: all experts once, and rotate which
     * experts the routing picks */
    const int copies = grouped ? 16 : fp4d_cuda_rotation_copies(cb + sb, c->l2_bytes);
    const int weight_sets = grouped ? E : (copies < BENCH_MAX_COPIES ? copies : BENCH_MAX_COPIES);
    s->c = c;
    s->copies = copies < BENCH_MAX_COPIES ? copies : BENCH_MAX_COPIES;

    fp4d_devbuf wcodes = {0}, wscales = {0}, outb = {0}, wstream = {0};
    const uint8_t **ptrs = calloc((size_t)weight_sets * 2, sizeof *ptrs);
    int64_t *offsets = calloc((size_t)s->copies * (size_t)(E + 1), sizeof *offsets);
    float *alphas = calloc((size_t)E, sizeof *alphas);
    fp4d_status st = ptrs && offsets && alphas ? FP4D_STATUS_OK : fp4d_set_error(FP4D_STATUS_NOMEM, "cuda: out of memory");
    for (int32_t e = 0; e < E && alphas; e++) alphas[e] = 1.0f;
    if (st == FP4D_STATUS_OK) st = fp4d_devbuf_reserve(&wcodes, cb * (size_t)weight_sets, false, c->stream);
    if (st == FP4D_STATUS_OK) st = fp4d_devbuf_reserve(&wscales, sb * (size_t)weight_sets, false, c->stream);
    if (st == FP4D_STATUS_OK) {
        int e1 = fp4d_cuda_fill_random_fp4(wcodes.ptr, cb * (size_t)weight_sets, 12345, c->stream);
        int e2 = (int)cudaMemsetAsync(wscales.ptr, d->b_type == FP4D_DTYPE_NVFP4 ? 0x38 : 127, sb * (size_t)weight_sets,
                                      c->stream);
        if (e1 || e2) st = fp4d_cuda_status(e1 ? e1 : e2, "cuda: bench weights");
        for (int w = 0; w < weight_sets; w++) {
            ptrs[w] = (const uint8_t *)wcodes.ptr + (size_t)w * cb;
            ptrs[weight_sets + w] = (const uint8_t *)wscales.ptr + (size_t)w * sb;
        }
    }
    if (st == FP4D_STATUS_OK) {
        if (is_fp4(d->a_type)) st = fp4d_cuda_make_bench_fp4(d->a_type, d->m, d->k, d->a_layout, 99, &c->a, &c->a_sc, c->stream);
        else st = fp4d_cuda_make_bench_plain(d->a_type, d->m, d->k, 99, &c->a, c->stream);
    }
    if (st == FP4D_STATUS_OK)
        st = fp4d_devbuf_reserve(&outb, (size_t)(d->m * d->n) * fp4d_out_elem_size(d->out_type), false, c->stream);
    int64_t max_rows = 0;
    for (int i = 0; st == FP4D_STATUS_OK && i < s->copies; i++) {
        int64_t *off = offsets + (size_t)i * (size_t)(E + 1);
        if (grouped) fp4d_cuda_bench_routing(d->m / top_k, top_k, E, i, off);
        dev_gemm *g = &s->g[i];
        *g = (dev_gemm){
            .a_type = d->a_type, .a = c->a.ptr, .a_scales = c->a_sc.ptr, .a_layout = d->a_layout, .a_rows = d->m,
            .b_format = d->b_type, .b_layout = d->b_layout, .num_experts = E,
            .b_codes = grouped ? ptrs : ptrs + i, .b_scales = grouped ? ptrs + weight_sets : ptrs + weight_sets + i,
            .alpha = alphas, .offsets = grouped ? off : NULL, .n = d->n, .k = d->k, .out_type = d->out_type,
            .out = outb.ptr,
        };
        const int64_t mr = max_rows_per_expert(g);
        if (mr > max_rows) max_rows = mr;
    }
    if (st == FP4D_STATUS_OK) {
        s->path = gemv_ok(&s->g[0]) ? PATH_GEMV : choose_path(c, d->a_type, d->b_type, d->k, max_rows, grouped);
        for (int i = 0; st == FP4D_STATUS_OK && s->path == PATH_GEMV && i < s->copies; i++)
            st = plan_gemv(c, &s->g[i], &s->gargs[i]);
        /* the weights in the stream layout where the skinny kernel wants it: made once, outside
         * the timing, as a server would at load time and as cublas-bf16's bench dequantizes
         * its weights once */
        if (st == FP4D_STATUS_OK && s->path == PATH_SKINNY && wants_stream_codes(&s->g[0])) {
            const size_t stride = stream_room(&s->g[0]);
            /* without room for it the decode kernel runs on the natural layout (as in gemm()) */
            const bool room =
                fp4d_devbuf_reserve(&wstream, stride * (size_t)weight_sets, false, c->stream) == FP4D_STATUS_OK;
            if (!room) fp4d_clear_error();
            for (int w = 0; room && st == FP4D_STATUS_OK && w < weight_sets; w++) {
                /* weight set w is expert w of a grouped GEMM, or copy w of a plain one */
                const dev_gemm one = {.b_format = d->b_type, .b_layout = d->b_layout, .b_codes = ptrs + w,
                                      .b_scales = ptrs + weight_sets + w, .n = d->n, .k = d->k};
                uint8_t *dst = (uint8_t *)wstream.ptr + (size_t)w * stride;
                const int e = stream_layout_of(&one, 0, dst, stream_codes_room(&one), c->stream);
                if (e) st = fp4d_cuda_status(e, "cuda: bench weights in the stream layout");
                ptrs[w] = dst;
                ptrs[weight_sets + w] = dst + stream_codes_room(&one);
            }
            for (int i = 0; room && i < s->copies; i++) s->g[i].b_stream = true;
        }
        /* the weights are final once the device has made them: the timed calls may start and
         * load them before the kernel before them has finished, as a server's layers can
         * (FP4DOCTOR_CUDA_BENCH_SETTLED=0: timed as unsettled weights, which the stream
         * kernel reads only once everything before it is done; A/B timing) */
        if (st == FP4D_STATUS_OK && fp4d_env_switch("FP4DOCTOR_CUDA_BENCH_SETTLED") && cudaStreamSynchronize(c->stream) == cudaSuccess)
            for (int i = 0; i < s->copies; i++) s->g[i].b_settled = true;
        (void)cudaGetLastError();
        for (int i = 0; st == FP4D_STATUS_OK && s->path == PATH_SKINNY && i < s->copies; i++)
            st = plan_skinny(c, &s->g[i], &s->params[i], &s->args[i]);
        /* the plans' tables are copied in the stream: landed before anything is timed */
        if (st == FP4D_STATUS_OK && s->path == PATH_SKINNY) {
            const cudaError_t landed = cudaStreamSynchronize(c->stream);
            if (landed != cudaSuccess) st = fp4d_cuda_status((int)landed, "cuda: bench work-item tables");
        }
        /* Each plan points to the split-K scratch as it was when it was made. A later copy that
         * needs more (another routing: more items, longer ones) makes it anew and frees the old
         * one, which an earlier plan would then still use: every plan takes the final buffers,
         * which only ever grow, so they are large enough for each. */
        for (int i = 0; st == FP4D_STATUS_OK && i < s->copies; i++) {
            if (s->path == PATH_GEMV && s->gargs[i].splits > 1) {
                s->gargs[i].partials = c->partials.ptr;
                s->gargs[i].counters = c->counters.ptr;
            }
            if (s->path == PATH_SKINNY && s->args[i].splits > 1) {
                s->args[i].partials = c->partials.ptr;
                s->args[i].counters = c->counters.ptr;
            }
        }
    }
    if (st == FP4D_STATUS_OK) st = fp4d_cuda_time(c->stream, bench_call, s, s->copies, repeats, out);
    cudaStreamSynchronize(c->stream);
    for (int i = 0; i < BENCH_MAX_COPIES; i++) fp4d_devbuf_free(&s->params[i]);
    fp4d_devbuf_free(&wcodes);
    fp4d_devbuf_free(&wstream);
    fp4d_devbuf_free(&wscales);
    fp4d_devbuf_free(&outb);
    free(ptrs);
    free(offsets);
    free(alphas);
    free(s);
    return st;
}

static const fp4d_backend_iface cuda_iface = {
    .api_version = FP4D_BACKEND_API_VERSION,
    .struct_size = sizeof(fp4d_backend_iface),
    .name = "cuda",
    .description = "fp4doctor's own CUDA kernels: streamed FP4 weights + mma.sync (sm_80+)",
    .kind = FP4D_BACKEND_KIND_GPU,
    .caps = FP4D_CAP_GEMM | FP4D_CAP_GROUPED_GEMM | FP4D_CAP_QUANTIZE | FP4D_CAP_DEVICE_TIMING | FP4D_CAP_NEEDS_DEVICE,
    .user_data = NULL,
    .init = cuda_init,
    .free = cuda_free,
    .supports = cuda_supports,
    .gemm = cuda_gemm,
    .grouped_gemm = cuda_grouped_gemm,
    .quantize = cuda_quantize,
    .score = cuda_score,
    .bench = cuda_bench,
};

const fp4d_backend_iface *fp4d_cuda_own_backend_iface(void) { return &cuda_iface; }
