/*
 * backend_cublas_bf16.c - `cublas-bf16`: weights dequantized once (exactly) and cached,
 * then cuBLAS's dense GEMM with f32 accumulation. The correct fallback on every GPU, and
 * the anchor `fp4doctor bench` measures everything else against.
 *
 * The dense type is chosen so that nothing is rounded before the GEMM: bf16 for bf16 and
 * FP4 activations (e2m1 x block scale is exact in bf16), f16 for f16 activations with
 * NVFP4 weights, f32 (CUBLAS_COMPUTE_32F, no TF32) for f32 activations and for f16
 * activations with MXFP4 weights.
 */
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>

#include "cuda_internal.h"
#include "internal.h"

#define CACHE_SLOTS 4

/* One dequantized weight matrix, keyed by what the caller handed over. */
typedef struct weight_slot {
    const void   *host_codes;
    const void   *host_scales;
    int64_t       rows, cols;
    int           format, layout, dense;
    uint64_t      hash;
    fp4d_devbuf   dense_buf;
    uint64_t      last_use;
} weight_slot;

typedef struct cublas_ctx {
    int            device, sm_count, cc;
    size_t         l2_bytes;
    cudaStream_t   stream;
    cublasHandle_t handle;
    fp4d_devbuf    a, a_sc, a_dense, b, b_sc, out, out_f32;
    weight_slot    cache[CACHE_SLOTS];
    uint64_t       clock;
} cublas_ctx;

static bool is_fp4(fp4d_dtype t) { return t == FP4D_DTYPE_NVFP4 || t == FP4D_DTYPE_MXFP4; }

static fp4d_dtype dense_type(fp4d_dtype a, fp4d_dtype b)
{
    if (a == FP4D_DTYPE_F32) return FP4D_DTYPE_F32;
    if (a == FP4D_DTYPE_F16) return b == FP4D_DTYPE_NVFP4 ? FP4D_DTYPE_F16 : FP4D_DTYPE_F32;
    return FP4D_DTYPE_BF16;
}

static cudaDataType_t cuda_type(fp4d_dtype t)
{
    return t == FP4D_DTYPE_F32 ? CUDA_R_32F : t == FP4D_DTYPE_F16 ? CUDA_R_16F : CUDA_R_16BF;
}

static const char *cublas_status_name(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_?";
    }
}

/* FNV-1a over 8-byte words: the cache must notice a caller reusing a buffer with new
 * contents (the doctor does), and hashing is far cheaper than the upload it saves. */
static uint64_t hash_bytes(const void *p, size_t n, uint64_t h)
{
    const uint8_t *b = p;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 0x100000001B3ull;
        h ^= h >> 29;
    }
    for (; i < n; i++) h = (h ^ b[i]) * 0x100000001B3ull;
    return h;
}

/* Returns the device pointer of B dequantized to `dense`, from the cache or made now. */
static fp4d_status dense_weights(cublas_ctx *c, const fp4d_matrix *b, fp4d_dtype dense, const void **out)
{
    const size_t cb = fp4d_cuda_matrix_data_bytes(b), sb = fp4d_cuda_matrix_scale_bytes(b);
    const uint64_t h = hash_bytes(b->scales, sb, hash_bytes(b->data, cb, 0xCBF29CE484222325ull));
    weight_slot *victim = &c->cache[0];
    c->clock++;
    for (int i = 0; i < CACHE_SLOTS; i++) {
        weight_slot *w = &c->cache[i];
        if (w->dense_buf.ptr && w->host_codes == b->data && w->host_scales == b->scales && w->rows == b->rows &&
            w->cols == b->cols && w->format == (int)b->dtype && w->layout == (int)b->scale_layout &&
            w->dense == (int)dense && w->hash == h) {
            w->last_use = c->clock;
            *out = w->dense_buf.ptr;
            return FP4D_STATUS_OK;
        }
        if (w->last_use < victim->last_use) victim = w;
    }
    FP4D_FORWARD_IF_ERROR(fp4d_cuda_upload_matrix(b, &c->b, &c->b_sc, c->stream));
    const size_t esz = fp4d_dtype_get(dense)->element_bits / 8;
    victim->host_codes = NULL; /* invalid until filled */
    FP4D_FORWARD_IF_ERROR(
        fp4d_devbuf_reserve(&victim->dense_buf, (size_t)b->rows * (size_t)b->cols * esz, false, c->stream));
    fp4d_dev_fp4 src = {c->b.ptr, c->b_sc.ptr, b->rows, b->cols, b->dtype, b->scale_layout};
    FP4D_CUDA_TRY(fp4d_cuda_dequantize(&src, dense, victim->dense_buf.ptr, c->stream), "cublas-bf16: dequantize B");
    victim->host_codes = b->data;
    victim->host_scales = b->scales;
    victim->rows = b->rows;
    victim->cols = b->cols;
    victim->format = b->dtype;
    victim->layout = b->scale_layout;
    victim->dense = dense;
    victim->hash = h;
    victim->last_use = c->clock;
    *out = victim->dense_buf.ptr;
    return FP4D_STATUS_OK;
}

/* Activations on the device in the dense type (a_dev holds the uploaded operand). */
static fp4d_status dense_activations(cublas_ctx *c, fp4d_dtype a_type, const void *a_dev, const uint8_t *a_scales,
                                     fp4d_scale_layout layout, int64_t m, int64_t k, fp4d_dtype dense, const void **out)
{
    if (a_type == dense) {
        *out = a_dev;
        return FP4D_STATUS_OK;
    }
    const size_t esz = fp4d_dtype_get(dense)->element_bits / 8;
    FP4D_FORWARD_IF_ERROR(fp4d_devbuf_reserve(&c->a_dense, (size_t)m * (size_t)k * esz, false, c->stream));
    if (is_fp4(a_type)) {
        fp4d_dev_fp4 src = {a_dev, a_scales, m, k, a_type, layout};
        FP4D_CUDA_TRY(fp4d_cuda_dequantize(&src, dense, c->a_dense.ptr, c->stream), "cublas-bf16: dequantize A");
    } else {
        FP4D_CUDA_TRY(fp4d_cuda_convert(a_type, a_dev, dense, c->a_dense.ptr, (size_t)(m * k), c->stream),
                      "cublas-bf16: convert A");
    }
    *out = c->a_dense.ptr;
    return FP4D_STATUS_OK;
}

/* out[m, n] (row-major) = alpha * A[m, k] . B[n, k]^T, i.e. column-major out^T = B^T-op . A. */
static fp4d_status dense_gemm(cublas_ctx *c, fp4d_dtype dense, const void *a, const void *b, int64_t m, int64_t n,
                              int64_t k, float alpha, fp4d_dtype out_type, void *out)
{
    FP4D_RETURN_ERROR_IF(m > INT32_MAX || n > INT32_MAX || k > INT32_MAX, UNSUPPORTED, "cublas-bf16: shape too large");
    const float beta = 0.0f;
    /* cuBLAS pairs bf16/f16 inputs with an output of the same type or f32; other output
     * types go through an f32 buffer and one rounding. */
    const bool direct = out_type == FP4D_DTYPE_F32 || out_type == dense;
    void *target = out;
    if (!direct) {
        FP4D_FORWARD_IF_ERROR(fp4d_devbuf_reserve(&c->out_f32, (size_t)m * (size_t)n * sizeof(float), false, c->stream));
        target = c->out_f32.ptr;
    }
    const fp4d_dtype ct = direct ? out_type : FP4D_DTYPE_F32;
    cublasStatus_t s = cublasGemmEx(c->handle, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)m, (int)k, &alpha, b,
                                    cuda_type(dense), (int)k, a, cuda_type(dense), (int)k, &beta, target, cuda_type(ct),
                                    (int)n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    FP4D_RETURN_ERROR_IF(s != CUBLAS_STATUS_SUCCESS, DEVICE, "cublas-bf16: cublasGemmEx failed: %s",
                         cublas_status_name(s));
    if (!direct)
        FP4D_CUDA_TRY(fp4d_cuda_convert(FP4D_DTYPE_F32, target, out_type, out, (size_t)(m * n), c->stream),
                      "cublas-bf16: convert out");
    return FP4D_STATUS_OK;
}

static fp4d_status cb_init(void *user_data, int device, void **out, fp4d_reason *why)
{
    (void)user_data;
    *out = NULL;
    cublas_ctx *c = calloc(1, sizeof *c);
    FP4D_RETURN_ERROR_IF(!c, NOMEM, "cublas-bf16: out of memory");
    fp4d_status st = fp4d_cuda_open_device(device, &c->device, &c->sm_count, &c->l2_bytes, &c->cc, why);
    if (st != FP4D_STATUS_OK) {
        free(c);
        return st;
    }
    int bin = 0, ptx = 0;
    int e = fp4d_cuda_kernel_binary_version(c->device, &bin, &ptx);
    if (e != 0) {
        fp4d_cuda_reason(why, "this fp4doctor has no dequantize kernel for compute capability %d.%d (built for %s)",
                         c->cc / 10, c->cc % 10, FP4D_CUDA_ARCHS_BUILT);
        free(c);
        return fp4d_set_error(FP4D_STATUS_UNSUPPORTED, "%s", why ? why->text : "no kernels");
    }
    cublasStatus_t s = cublasCreate(&c->handle);
    if (s != CUBLAS_STATUS_SUCCESS) {
        fp4d_cuda_reason(why, "cublasCreate failed: %s", cublas_status_name(s));
        free(c);
        return fp4d_set_error(FP4D_STATUS_UNSUPPORTED, "cublasCreate failed: %s", cublas_status_name(s));
    }
    /* cuBLAS may otherwise reduce split-K partial sums in the 16-bit output type; seen on an
     * H200 (bf16 output, M=8 N=300 K=4096): an element off by more than the f32
     * accumulation bound. Reductions stay in the f32 compute type. */
    (void)cublasSetMathMode(c->handle, CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
    if (cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking) != cudaSuccess) {
        cublasDestroy(c->handle);
        free(c);
        fp4d_cuda_reason(why, "cannot create a CUDA stream");
        return fp4d_set_error(FP4D_STATUS_DEVICE, "cannot create a CUDA stream");
    }
    cublasSetStream(c->handle, c->stream);
    *out = c;
    return FP4D_STATUS_OK;
}

static void cb_free(void *ctx)
{
    cublas_ctx *c = ctx;
    if (!c) return;
    cudaSetDevice(c->device);
    cudaStreamSynchronize(c->stream);
    fp4d_devbuf *bufs[] = {&c->a, &c->a_sc, &c->a_dense, &c->b, &c->b_sc, &c->out, &c->out_f32};
    for (size_t i = 0; i < FP4D_ARRAY_LEN(bufs); i++) fp4d_devbuf_free(bufs[i]);
    for (int i = 0; i < CACHE_SLOTS; i++) fp4d_devbuf_free(&c->cache[i].dense_buf);
    cublasDestroy(c->handle);
    cudaStreamDestroy(c->stream);
    free(c);
}

static bool cb_supports(void *ctx, const fp4d_gemm_desc *d, fp4d_reason *why)
{
    (void)ctx;
    if (!is_fp4(d->b_type)) {
        fp4d_cuda_reason(why, "weights must be nvfp4 or mxfp4");
        return false;
    }
    if (d->m > INT32_MAX || d->n > INT32_MAX || d->k > INT32_MAX) {
        fp4d_cuda_reason(why, "cuBLAS takes 32-bit dimensions");
        return false;
    }
    return true;
}

static fp4d_status cb_gemm(void *ctx, const fp4d_gemm_problem *p)
{
    cublas_ctx *c = ctx;
    FP4D_CUDA_TRY(cudaSetDevice(c->device), "cublas-bf16: cudaSetDevice");
    const fp4d_dtype dense = dense_type(p->a.dtype, p->b.dtype);
    const int64_t m = p->a.rows, n = p->b.rows, k = p->a.cols;
    const void *bd = NULL, *ad = NULL;
    FP4D_FORWARD_IF_ERROR(dense_weights(c, &p->b, dense, &bd));
    FP4D_FORWARD_IF_ERROR(fp4d_cuda_upload_matrix(&p->a, &c->a, &c->a_sc, c->stream));
    FP4D_FORWARD_IF_ERROR(dense_activations(c, p->a.dtype, c->a.ptr, c->a_sc.ptr, p->a.scale_layout, m, k, dense, &ad));
    const size_t ob = (size_t)m * (size_t)n * fp4d_out_elem_size(p->out_type);
    FP4D_FORWARD_IF_ERROR(fp4d_devbuf_reserve(&c->out, ob, false, c->stream));
    FP4D_CUDA_TRY(cudaMemcpyAsync(c->out.ptr, p->out, ob, cudaMemcpyHostToDevice, c->stream), "cublas-bf16: upload out");
    FP4D_FORWARD_IF_ERROR(dense_gemm(c, dense, ad, bd, m, n, k, p->alpha, p->out_type, c->out.ptr));
    FP4D_CUDA_TRY(cudaMemcpyAsync(p->out, c->out.ptr, ob, cudaMemcpyDeviceToHost, c->stream), "cublas-bf16: download out");
    return fp4d_cuda_sync(c->stream, "cublas-bf16: GEMM");
}

/* The per-expert loop: one cuBLAS GEMM per expert with rows (what the bench compares the
 * grouped kernel against). */
static fp4d_status cb_grouped_gemm(void *ctx, const fp4d_grouped_gemm_problem *p)
{
    cublas_ctx *c = ctx;
    FP4D_CUDA_TRY(cudaSetDevice(c->device), "cublas-bf16: cudaSetDevice");
    const fp4d_dtype dense = dense_type(p->a.dtype, p->b[0].dtype);
    const int64_t m = p->a.rows, n = p->b[0].rows, k = p->a.cols;
    const size_t osz = fp4d_out_elem_size(p->out_type), esz = fp4d_dtype_get(dense)->element_bits / 8;
    const size_t ob = (size_t)m * (size_t)n * osz;
    if (m == 0) return FP4D_STATUS_OK;
    const void *ad = NULL;
    FP4D_FORWARD_IF_ERROR(fp4d_cuda_upload_matrix(&p->a, &c->a, &c->a_sc, c->stream));
    FP4D_FORWARD_IF_ERROR(dense_activations(c, p->a.dtype, c->a.ptr, c->a_sc.ptr, p->a.scale_layout, m, k, dense, &ad));
    FP4D_FORWARD_IF_ERROR(fp4d_devbuf_reserve(&c->out, ob, false, c->stream));
    FP4D_CUDA_TRY(cudaMemcpyAsync(c->out.ptr, p->out, ob, cudaMemcpyHostToDevice, c->stream), "cublas-bf16: upload out");
    for (int32_t e = 0; e < p->num_experts; e++) {
        const int64_t r0 = p->expert_offsets[e], r1 = p->expert_offsets[e + 1];
        if (r1 == r0) continue;
        const void *bd = NULL;
        FP4D_FORWARD_IF_ERROR(dense_weights(c, &p->b[e], dense, &bd));
        FP4D_FORWARD_IF_ERROR(dense_gemm(c, dense, (const uint8_t *)ad + (size_t)r0 * (size_t)k * esz, bd, r1 - r0, n, k,
                                         p->alpha[e], p->out_type, (uint8_t *)c->out.ptr + (size_t)r0 * (size_t)n * osz));
    }
    FP4D_CUDA_TRY(cudaMemcpyAsync(p->out, c->out.ptr, ob, cudaMemcpyDeviceToHost, c->stream), "cublas-bf16: download out");
    return fp4d_cuda_sync(c->stream, "cublas-bf16: grouped GEMM");
}

static int cb_score(void *ctx, const fp4d_gemm_desc *d)
{
    (void)ctx;
    (void)d;
    return 30;
}

/* ---- bench: weights dequantized once (outside the timing), rotated copies -------------- */

enum { MAX_COPIES = 64 };

typedef struct cb_bench_state {
    cublas_ctx *c;
    fp4d_dtype  dense, a_type, out_type;
    fp4d_scale_layout a_layout;
    int64_t     m, n, k;
    int32_t     num_experts;
    const void *a_dev;
    const uint8_t *a_scales;
    void       *out;
    const uint8_t *weights; /* copies (plain) or experts (grouped), dense */
    size_t      weight_stride;
    int64_t    *offsets;    /* grouped: copies x (E + 1) */
} cb_bench_state;

static fp4d_status cb_bench_call(void *state, int copy)
{
    cb_bench_state *s = state;
    cublas_ctx *c = s->c;
    const void *ad = NULL;
    /* activations change every call in a real model: convert/dequantize them each time */
    FP4D_FORWARD_IF_ERROR(dense_activations(c, s->a_type, s->a_dev, s->a_scales, s->a_layout, s->m, s->k, s->dense, &ad));
    if (s->num_experts == 0)
        return dense_gemm(c, s->dense, ad, s->weights + (size_t)copy * s->weight_stride, s->m, s->n, s->k, 1.0f,
                          s->out_type, s->out);
    const int64_t *off = s->offsets + (size_t)copy * (size_t)(s->num_experts + 1);
    const size_t esz = fp4d_dtype_get(s->dense)->element_bits / 8, osz = fp4d_out_elem_size(s->out_type);
    for (int32_t e = 0; e < s->num_experts; e++) {
        if (off[e + 1] == off[e]) continue;
        FP4D_FORWARD_IF_ERROR(dense_gemm(c, s->dense, (const uint8_t *)ad + (size_t)off[e] * (size_t)s->k * esz,
                                         s->weights + (size_t)e * s->weight_stride, off[e + 1] - off[e], s->n, s->k,
                                         1.0f, s->out_type, (uint8_t *)s->out + (size_t)off[e] * (size_t)s->n * osz));
    }
    return FP4D_STATUS_OK;
}

static fp4d_status cb_bench(void *ctx, const fp4d_gemm_desc *d, int repeats, fp4d_bench_result *out)
{
    cublas_ctx *c = ctx;
    FP4D_CUDA_TRY(cudaSetDevice(c->device), "cublas-bf16: cudaSetDevice");
    const fp4d_dtype dense = dense_type(d->a_type, d->b_type);
    const size_t esz = fp4d_dtype_get(dense)->element_bits / 8;
    const size_t wbytes = ((size_t)(d->n * d->k) * esz + 255) & ~(size_t)255;
    const bool grouped = d->num_experts > 0;
    const int copies = grouped ? 16 : fp4d_cuda_rotation_copies(wbytes, c->l2_bytes);
    const int nc = copies > MAX_COPIES ? MAX_COPIES : copies;
    const int sets = grouped ? d->num_experts : nc;
    const int top_k = grouped && d->m % 8 == 0 ? 8 : 1;
    cb_bench_state s = {c, dense, d->a_type, d->out_type, d->a_layout, d->m, d->n, d->k, grouped ? d->num_experts : 0,
                        NULL, NULL, NULL, NULL, wbytes, NULL};
    fp4d_devbuf w = {0}, codes = {0}, scales = {0}, outb = {0};
    fp4d_status st = fp4d_devbuf_reserve(&w, wbytes * (size_t)sets, false, c->stream);
    /* one dequantized weight matrix, replicated: values do not matter for timing */
    if (st == FP4D_STATUS_OK)
        st = fp4d_cuda_make_bench_fp4(d->b_type, d->n, d->k, FP4D_LAYOUT_LINEAR, 12345, &codes, &scales, c->stream);
    if (st == FP4D_STATUS_OK) {
        fp4d_dev_fp4 src = {codes.ptr, scales.ptr, d->n, d->k, d->b_type, FP4D_LAYOUT_LINEAR};
        int e = fp4d_cuda_dequantize(&src, dense, w.ptr, c->stream);
        for (int i = 1; e == 0 && i < sets; i++)
            e = (int)cudaMemcpyAsync((uint8_t *)w.ptr + (size_t)i * wbytes, w.ptr, wbytes, cudaMemcpyDeviceToDevice,
                                     c->stream);
        if (e) st = fp4d_cuda_status(e, "cublas-bf16: bench weights");
    }
    if (st == FP4D_STATUS_OK) {
        if (is_fp4(d->a_type)) st = fp4d_cuda_make_bench_fp4(d->a_type, d->m, d->k, d->a_layout, 99, &c->a, &c->a_sc, c->stream);
        else st = fp4d_cuda_make_bench_plain(d->a_type, d->m, d->k, 99, &c->a, c->stream);
    }
    if (st == FP4D_STATUS_OK)
        st = fp4d_devbuf_reserve(&outb, (size_t)(d->m * d->n) * fp4d_out_elem_size(d->out_type), false, c->stream);
    if (st == FP4D_STATUS_OK && grouped) {
        s.offsets = calloc((size_t)nc * (size_t)(d->num_experts + 1), sizeof *s.offsets);
        if (!s.offsets) st = fp4d_set_error(FP4D_STATUS_NOMEM, "cublas-bf16: out of memory");
        for (int i = 0; s.offsets && i < nc; i++)
            fp4d_cuda_bench_routing(d->m / top_k, top_k, d->num_experts, i, s.offsets + (size_t)i * (size_t)(d->num_experts + 1));
    }
    if (st == FP4D_STATUS_OK) {
        s.a_dev = c->a.ptr;
        s.a_scales = c->a_sc.ptr;
        s.out = outb.ptr;
        s.weights = w.ptr;
        st = fp4d_cuda_time(c->stream, cb_bench_call, &s, nc, repeats, out);
    }
    cudaStreamSynchronize(c->stream);
    free(s.offsets);
    fp4d_devbuf_free(&w);
    fp4d_devbuf_free(&codes);
    fp4d_devbuf_free(&scales);
    fp4d_devbuf_free(&outb);
    return st;
}

static const fp4d_backend_iface cublas_bf16_iface = {
    .api_version = FP4D_BACKEND_API_VERSION,
    .struct_size = sizeof(fp4d_backend_iface),
    .name = "cublas-bf16",
    .description = "weights dequantized once to bf16 (exact), cuBLAS GEMM with f32 accumulation",
    .kind = FP4D_BACKEND_KIND_GPU,
    .caps = FP4D_CAP_GEMM | FP4D_CAP_GROUPED_GEMM | FP4D_CAP_DEVICE_TIMING | FP4D_CAP_NEEDS_DEVICE,
    .user_data = NULL,
    .init = cb_init,
    .free = cb_free,
    .supports = cb_supports,
    .gemm = cb_gemm,
    .grouped_gemm = cb_grouped_gemm,
    .quantize = NULL,
    .score = cb_score,
    .bench = cb_bench,
};

const fp4d_backend_iface *fp4d_cublas_bf16_backend_iface(void) { return &cublas_bf16_iface; }
