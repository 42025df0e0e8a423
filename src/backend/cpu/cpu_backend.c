/*
 * The `cpu` backend: the CPU engine (cpu_engine.c) behind the backend interface, plus a
 * quantizer that is the reference quantizer run on several threads.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_internal.h"
#include "backend/cpu/cpu_internal.h"
#include "internal.h"

typedef struct cpu_ctx {
    fp4d_cpu_isa isa;
    int          threads;
} cpu_ctx;

static fp4d_status cpu_init(void *user_data, int device, void **ctx, fp4d_reason *why)
{
    (void)user_data, (void)device; /* a host backend: the device index does not apply */
    cpu_ctx *c = malloc(sizeof *c);
    if (!c) {
        snprintf(why->text, sizeof why->text, "out of memory");
        return FP4D_STATUS_NOMEM;
    }
    c->isa     = fp4d_cpu_isa_detect();
    c->threads = fp4d_cpu_default_threads();
    *ctx       = c;
    return FP4D_STATUS_OK;
}

static void cpu_free(void *ctx) { free(ctx); }

bool fp4d_host_backend_supports(const fp4d_gemm_desc *d, fp4d_reason *why)
{
    const fp4d_dtype_traits *ta = fp4d_dtype_get(d->a_type), *tb = fp4d_dtype_get(d->b_type);
    if (!ta || !tb || !tb->is_block_fp4) {
        snprintf(why->text, sizeof why->text, "B must be nvfp4 or mxfp4 and A one of f32, bf16, f16, nvfp4, mxfp4");
        return false;
    }
    if (fp4d_out_elem_size(d->out_type) == 0) {
        snprintf(why->text, sizeof why->text, "the output must be f32, bf16 or f16");
        return false;
    }
    if ((ta->is_block_fp4 && (unsigned)d->a_layout >= FP4D_LAYOUT_COUNT) ||
        (unsigned)d->b_layout >= FP4D_LAYOUT_COUNT) {
        snprintf(why->text, sizeof why->text, "unknown scale layout");
        return false;
    }
    if (d->k % tb->block_size != 0 || (ta->is_block_fp4 && d->k % ta->block_size != 0)) {
        snprintf(why->text, sizeof why->text, "K = %lld is not a multiple of the block size", (long long)d->k);
        return false;
    }
    return true;
}

static bool cpu_supports(void *ctx, const fp4d_gemm_desc *d, fp4d_reason *why)
{
    (void)ctx;
    return fp4d_host_backend_supports(d, why);
}

static fp4d_status cpu_gemm(void *ctx, const fp4d_gemm_problem *p)
{
    cpu_ctx *c = ctx;
    return fp4d_cpu_run_problem(p, c->isa, c->threads);
}

static fp4d_status cpu_grouped(void *ctx, const fp4d_grouped_gemm_problem *p)
{
    cpu_ctx *c = ctx;
    return fp4d_cpu_run_grouped(p, c->isa, c->threads);
}

/* ---- quantize ---------------------------------------------------------------------------- */

/* Rows per work item: a multiple of every layout's row tile (128 and 8), so that a chunk
 * starting at row r0 is laid out exactly like rows [r0, r0 + 128) of the whole tensor,
 * padding included. */
enum { QUANT_CHUNK_ROWS = 128, QUANT_MAX_THREADS = 64 };

typedef struct quant_job {
    const fp4d_quantize_problem *q;
    fp4d_quantize_params         params;   /* encode scale fixed when derived up front */
    int                          nthreads;
    fp4d_quantize_result         first;    /* what the chunk at row 0 reported */
    fp4d_status                  status[QUANT_MAX_THREADS];
} quant_job;

typedef struct quant_slice {
    quant_job *job;
    int        tid;
} quant_slice;

static void quant_run_slice(quant_job *j, int tid)
{
    const fp4d_quantize_problem *q     = j->q;
    const fp4d_dtype_traits     *tf    = fp4d_dtype_get(q->params.format);
    const size_t                 esz   = fp4d_dtype_get(q->src_type)->element_bits / 8;
    const int64_t                scols = q->cols / tf->block_size;
    fp4d_status                  st    = FP4D_STATUS_OK;
    for (int64_t r0 = (int64_t)tid * QUANT_CHUNK_ROWS; r0 < q->rows && st == FP4D_STATUS_OK;
         r0 += (int64_t)j->nthreads * QUANT_CHUNK_ROWS) {
        int64_t              rows = q->rows - r0 < QUANT_CHUNK_ROWS ? q->rows - r0 : QUANT_CHUNK_ROWS;
        size_t               soff = fp4d_scale_offset(q->params.scale_layout, q->rows, scols, r0, 0);
        fp4d_quantize_result r;
        st = fp4d_quantize(&j->params, q->src_type, (const uint8_t *)q->src + (size_t)r0 * (size_t)q->cols * esz,
                           rows, q->cols, q->codes + (size_t)r0 * (size_t)q->cols / 2, q->scales + soff, &r);
        if (r0 == 0) j->first = r;
    }
    j->status[tid] = st;
}

static void *quant_worker_thread(void *arg)
{
    quant_slice *s = arg;
    quant_run_slice(s->job, s->tid);
    return NULL;
}

/* Max |x| over a float/bf16/f16 matrix; false if a NaN or an infinity is present. */
static bool finite_amax(fp4d_dtype t, const void *src, size_t count, float *amax)
{
    float m = 0.0f, buf[1024];
    for (size_t i = 0; i < count; i += 1024) {
        size_t n = count - i < 1024 ? count - i : 1024;
        if (t == FP4D_DTYPE_F32) memcpy(buf, (const float *)src + i, n * sizeof(float));
        else fp4d_to_f32(t, (const uint16_t *)src + i, n, buf);
        for (size_t j = 0; j < n; j++) {
            if (!isfinite(buf[j])) return false;
            float a = fabsf(buf[j]);
            if (a > m) m = a;
        }
    }
    *amax = m;
    return true;
}

fp4d_status fp4d_threaded_quantize(fp4d_quantize_problem *q, int threads)
{
    const fp4d_dtype_traits *tf = fp4d_dtype_get(q->params.format);
    const fp4d_dtype_traits *ts = fp4d_dtype_get(q->src_type);
    int64_t                  chunks = q->rows > 0 ? (q->rows + QUANT_CHUNK_ROWS - 1) / QUANT_CHUNK_ROWS : 0;
    int                      nt = threads < QUANT_MAX_THREADS ? threads : QUANT_MAX_THREADS;
    if (chunks < nt) nt = (int)chunks;
    /* Bad arguments, small tensors: the reference quantizer as one call (it validates). */
    bool parallel = nt > 1 && tf && tf->is_block_fp4 && ts && !ts->is_block_fp4 && q->cols > 0 &&
                    q->cols % tf->block_size == 0 && q->src && q->codes && q->scales;

    quant_job j;
    memset(&j, 0, sizeof j);
    j.q        = q;
    j.params   = q->params;
    j.nthreads = nt;
    /* Row chunks quantize like the whole tensor where that is provable: MXFP4 blocks are
     * independent, and NVFP4 under the default convention depends on the rest of the
     * tensor only through the encode scale 2688/amax, which we derive from the whole
     * tensor first. Other NVFP4 conventions derive the tensor scale differently (decode
     * scale first, NaN handling), so a derived scale runs as one call there. */
    bool derived = parallel && q->params.format == FP4D_DTYPE_NVFP4 && q->params.encode_scale == 0.0f;
    if (derived) {
        float amax;
        if (q->params.convention != FP4D_CONV_FLASHINFER_EXACT ||
            !finite_amax(q->src_type, q->src, (size_t)q->rows * (size_t)q->cols, &amax)) {
            parallel = false;
        } else {
            /* The convention's encode scale is a function of amax alone: ask it with one
             * block of the same amax, and report what it reports (decode scale included). */
            float                probe[32] = {amax};
            uint8_t              pcodes[16], pscales[4];
            fp4d_quantize_params pp = q->params;
            pp.scale_layout         = FP4D_LAYOUT_LINEAR;
            FP4D_FORWARD_IF_ERROR(
                fp4d_quantize(&pp, FP4D_DTYPE_F32, probe, 1, tf->block_size, pcodes, pscales, &q->result));
            j.params.encode_scale = q->result.encode_scale;
            /* 2688/amax is +inf for an all-zero tensor (or amax below ~8e-36), and a given
             * encode scale must be finite: the chunks would all fail with INVALID_ARG where
             * the one call succeeds. Such a tensor runs as one call. */
            if (!isfinite(j.params.encode_scale)) parallel = false;
        }
    }
    if (!parallel)
        return fp4d_quantize(&q->params, q->src_type, q->src, q->rows, q->cols, q->codes, q->scales, &q->result);

    pthread_t   th[QUANT_MAX_THREADS];
    quant_slice sl[QUANT_MAX_THREADS];
    bool        started[QUANT_MAX_THREADS] = {false};
    for (int t = 1; t < nt; t++) {
        sl[t]      = (quant_slice){&j, t};
        started[t] = pthread_create(&th[t], NULL, quant_worker_thread, &sl[t]) == 0;
    }
    quant_run_slice(&j, 0);
    for (int t = 1; t < nt; t++) {
        if (started[t]) pthread_join(th[t], NULL);
        else quant_run_slice(&j, t);
    }
    for (int t = 0; t < nt; t++) FP4D_FORWARD_IF_ERROR(j.status[t]);
    if (!derived) q->result = j.first; /* MXFP4 or a given encode scale: data-independent */
    return FP4D_STATUS_OK;
}

static fp4d_status cpu_quantize(void *ctx, fp4d_quantize_problem *q)
{
    cpu_ctx *c = ctx;
    return fp4d_threaded_quantize(q, c->threads);
}

static int cpu_score(void *ctx, const fp4d_gemm_desc *d)
{
    (void)d;
    cpu_ctx *c = ctx;
    /* Preferred over the reference, below any GPU backend. */
    return 10 + (int)c->isa;
}

static const fp4d_backend_iface cpu_iface = {
    .api_version  = FP4D_BACKEND_API_VERSION,
    .struct_size  = sizeof(fp4d_backend_iface),
    .name         = "cpu",
    .description  = "multi-threaded CPU kernels (AVX-512 / AVX2+FMA with runtime dispatch, portable fallback), f32 accumulation",
    .kind         = FP4D_BACKEND_KIND_CPU,
    .caps         = FP4D_CAP_GEMM | FP4D_CAP_GROUPED_GEMM | FP4D_CAP_QUANTIZE,
    .user_data    = NULL,
    .init         = cpu_init,
    .free         = cpu_free,
    .supports     = cpu_supports,
    .gemm         = cpu_gemm,
    .grouped_gemm = cpu_grouped,
    .quantize     = cpu_quantize,
    .score        = cpu_score,
    .bench        = NULL,
};

const fp4d_backend_iface *fp4d_cpu_backend_iface(void) { return &cpu_iface; }
