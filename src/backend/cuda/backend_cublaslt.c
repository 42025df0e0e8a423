/*
 * backend_cublaslt.c - `cublaslt`: native block-scaled FP4 GEMM through cuBLASLt
 * (CUDA_R_4F_E2M1 operands, CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3 block scales for
 * NVFP4, VEC32_UE8M0 for MXFP4, scales in the 128x4 swizzled layout).
 *
 * Whether it runs is cuBLASLt's answer, not ours: supports() describes the problem to
 * cuBLASLt and asks cublasLtMatmulAlgoGetHeuristic for an algorithm; on GPUs without FP4
 * tensor cores (compute capability below 10.0) cuBLASLt has none, and its status is the
 * reason we report.
 *
 * cuBLASLt is column-major. Our row-major out[M, N] = A[M, K] . B[N, K]^T is the
 * column-major out^T[N, M] = op(B)[N, K] . A^T[K, M] with B and A both stored K-major,
 * i.e. the "TN" form (transa = T, transb = N) that cuBLASLt requires for FP4. So
 * cuBLASLt's A is our B (and its scale tensor covers our N rows) and cuBLASLt's B is our A.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>

#include "cuda_internal.h"
#include "internal.h"

#define LT_WORKSPACE_BYTES (32u << 20)

typedef struct lt_ctx {
    int              device, sm_count, cc;
    size_t           l2_bytes;
    cudaStream_t     stream;
    cublasLtHandle_t handle;
    fp4d_devbuf      a, a_sc, b, b_sc, out, workspace;
    /* the last supports() question and its answer */
    bool             have_answer, answer;
    fp4d_gemm_desc   asked;
    fp4d_reason      answer_why;
} lt_ctx;

static const char *lt_status_name(cublasStatus_t s)
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

static cudaDataType_t out_cuda_type(fp4d_dtype t)
{
    return t == FP4D_DTYPE_F32 ? CUDA_R_32F : t == FP4D_DTYPE_F16 ? CUDA_R_16F : CUDA_R_16BF;
}

/* Everything cuBLASLt needs to describe one problem. */
typedef struct lt_problem {
    cublasLtMatmulDesc_t   op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulHeuristicResult_t heur;
    int                    found;
} lt_problem;

static void lt_problem_free(lt_problem *p)
{
    if (p->pref) cublasLtMatmulPreferenceDestroy(p->pref);
    if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    memset(p, 0, sizeof *p);
}

/* Describes desc to cuBLASLt and asks for one algorithm. Returns the first failing
 * status (with `step` naming the call), or CUBLAS_STATUS_NOT_SUPPORTED when the heuristic
 * returned no algorithm. Scale pointers are set when given (execution); the heuristic
 * query does not need them. */
static cublasStatus_t lt_describe(lt_ctx *c, const fp4d_gemm_desc *d, const void *a_scales, const void *b_scales,
                                  lt_problem *p, const char **step)
{
    memset(p, 0, sizeof *p);
    const cublasLtMatmulMatrixScale_t mode = d->b_type == FP4D_DTYPE_NVFP4 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3
                                                                          : CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0;
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasStatus_t s;
#define LT_STEP(call, name)                 \
    do {                                    \
        s = (call);                         \
        if (s != CUBLAS_STATUS_SUCCESS) {   \
            *step = (name);                 \
            return s;                       \
        }                                   \
    } while (0)
    LT_STEP(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    LT_STEP(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "set TRANSA");
    LT_STEP(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "set TRANSB");
    LT_STEP(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode), "set A_SCALE_MODE");
    LT_STEP(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode), "set B_SCALE_MODE");
    if (a_scales) /* cuBLASLt's A is our B */
        LT_STEP(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scales, sizeof b_scales),
                "set A_SCALE_POINTER");
    if (b_scales)
        LT_STEP(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scales, sizeof a_scales),
                "set B_SCALE_POINTER");
    LT_STEP(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_4F_E2M1, (uint64_t)d->k, (uint64_t)d->n, d->k), "layout A");
    LT_STEP(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_4F_E2M1, (uint64_t)d->k, (uint64_t)d->m, d->k), "layout B");
    LT_STEP(cublasLtMatrixLayoutCreate(&p->lc, out_cuda_type(d->out_type), (uint64_t)d->n, (uint64_t)d->m, d->n),
            "layout C/D");
    LT_STEP(cublasLtMatmulPreferenceCreate(&p->pref), "cublasLtMatmulPreferenceCreate");
    const size_t ws = LT_WORKSPACE_BYTES;
    LT_STEP(cublasLtMatmulPreferenceSetAttribute(p->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
            "set MAX_WORKSPACE_BYTES");
    LT_STEP(cublasLtMatmulAlgoGetHeuristic(c->handle, p->op, p->la, p->lb, p->lc, p->lc, p->pref, 1, &p->heur, &p->found),
            "cublasLtMatmulAlgoGetHeuristic");
#undef LT_STEP
    if (p->found < 1) {
        *step = "cublasLtMatmulAlgoGetHeuristic (0 algorithms)";
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    return CUBLAS_STATUS_SUCCESS;
}

static fp4d_status lt_init(void *user_data, int device, void **out, fp4d_reason *why)
{
    (void)user_data;
    *out = NULL;
    lt_ctx *c = calloc(1, sizeof *c);
    FP4D_RETURN_ERROR_IF(!c, NOMEM, "cublaslt: out of memory");
    fp4d_status st = fp4d_cuda_open_device(device, &c->device, &c->sm_count, &c->l2_bytes, &c->cc, why);
    if (st != FP4D_STATUS_OK) {
        free(c);
        return st;
    }
    cublasStatus_t s = cublasLtCreate(&c->handle);
    if (s != CUBLAS_STATUS_SUCCESS) {
        fp4d_cuda_reason(why, "cublasLtCreate failed: %s", lt_status_name(s));
        free(c);
        return fp4d_set_error(FP4D_STATUS_UNSUPPORTED, "cublasLtCreate failed: %s", lt_status_name(s));
    }
    if (cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking) != cudaSuccess) {
        cublasLtDestroy(c->handle);
        free(c);
        fp4d_cuda_reason(why, "cannot create a CUDA stream");
        return fp4d_set_error(FP4D_STATUS_DEVICE, "cannot create a CUDA stream");
    }
    *out = c;
    return FP4D_STATUS_OK;
}

static void lt_free(void *ctx)
{
    lt_ctx *c = ctx;
    if (!c) return;
    cudaSetDevice(c->device);
    cudaStreamSynchronize(c->stream);
    fp4d_devbuf *bufs[] = {&c->a, &c->a_sc, &c->b, &c->b_sc, &c->out, &c->workspace};
    for (size_t i = 0; i < FP4D_ARRAY_LEN(bufs); i++) fp4d_devbuf_free(bufs[i]);
    cublasLtDestroy(c->handle);
    cudaStreamDestroy(c->stream);
    free(c);
}

static bool lt_supports(void *ctx, const fp4d_gemm_desc *d, fp4d_reason *why)
{
    lt_ctx *c = ctx;
    if (d->num_experts > 0) {
        fp4d_cuda_reason(why, "no grouped GEMM through cuBLASLt here (use cuda or cublas-bf16)");
        return false;
    }
    if (d->a_type != d->b_type || (d->b_type != FP4D_DTYPE_NVFP4 && d->b_type != FP4D_DTYPE_MXFP4)) {
        fp4d_cuda_reason(why, "cuBLASLt's block-scaled FP4 GEMM takes FP4 x FP4 of one format (nvfp4 or mxfp4), "
                              "not %s x %s",
                         fp4d_dtype_get(d->a_type) ? fp4d_dtype_get(d->a_type)->name : "?",
                         fp4d_dtype_get(d->b_type) ? fp4d_dtype_get(d->b_type)->name : "?");
        return false;
    }
    fp4d_gemm_desc key = *d;
    key.a_layout = key.b_layout = FP4D_LAYOUT_LINEAR; /* we re-layout scales ourselves */
    if (c->have_answer && !memcmp(&key, &c->asked, sizeof key)) {
        if (!c->answer && why) *why = c->answer_why;
        return c->answer;
    }
    cudaSetDevice(c->device);
    lt_problem p;
    const char *step = "";
    cublasStatus_t s = lt_describe(c, d, NULL, NULL, &p, &step);
    lt_problem_free(&p);
    c->have_answer = true;
    c->asked = key;
    c->answer = s == CUBLAS_STATUS_SUCCESS;
    if (!c->answer) {
        fp4d_cuda_reason(&c->answer_why, "cuBLASLt %zu on compute capability %d.%d: %s returned %s for e2m1 x e2m1 with %s block scales",
                         cublasLtGetVersion(), c->cc / 10, c->cc % 10, step, lt_status_name(s),
                         d->b_type == FP4D_DTYPE_NVFP4 ? "VEC16_UE4M3" : "VEC32_UE8M0");
        if (why) *why = c->answer_why;
    }
    return c->answer;
}

/* Uploads an FP4 operand with its scales in the 128x4 layout cuBLASLt reads. */
static fp4d_status upload_swizzled(const fp4d_matrix *x, fp4d_devbuf *codes, fp4d_devbuf *scales, cudaStream_t s)
{
    const int64_t sc = x->cols / fp4d_dtype_get(x->dtype)->block_size;
    if (x->scale_layout == FP4D_LAYOUT_SWIZZLED_128X4) return fp4d_cuda_upload_matrix(x, codes, scales, s);
    const size_t sb = fp4d_scale_buffer_size(FP4D_LAYOUT_SWIZZLED_128X4, x->rows, sc);
    uint8_t *tmp = malloc(sb);
    FP4D_RETURN_ERROR_IF(!tmp, NOMEM, "cublaslt: out of memory");
    fp4d_scales_convert(x->scale_layout, x->scales, FP4D_LAYOUT_SWIZZLED_128X4, tmp, x->rows, sc);
    fp4d_matrix y = *x;
    y.scales = tmp;
    y.scale_layout = FP4D_LAYOUT_SWIZZLED_128X4;
    fp4d_status st = fp4d_cuda_upload_matrix(&y, codes, scales, s);
    if (st == FP4D_STATUS_OK && cudaStreamSynchronize(s) != cudaSuccess)
        st = fp4d_set_error(FP4D_STATUS_DEVICE, "cublaslt: upload failed"); /* tmp must outlive the copy */
    free(tmp);
    return st;
}

static fp4d_status lt_gemm(void *ctx, const fp4d_gemm_problem *pr)
{
    lt_ctx *c = ctx;
    FP4D_CUDA_TRY(cudaSetDevice(c->device), "cublaslt: cudaSetDevice");
    fp4d_gemm_desc d;
    fp4d_gemm_describe(pr, &d);
    FP4D_FORWARD_IF_ERROR(upload_swizzled(&pr->a, &c->a, &c->a_sc, c->stream));
    FP4D_FORWARD_IF_ERROR(upload_swizzled(&pr->b, &c->b, &c->b_sc, c->stream));
    const size_t ob = (size_t)d.m * (size_t)d.n * fp4d_out_elem_size(pr->out_type);
    FP4D_FORWARD_IF_ERROR(fp4d_devbuf_reserve(&c->out, ob, false, c->stream));
    FP4D_FORWARD_IF_ERROR(fp4d_devbuf_reserve(&c->workspace, LT_WORKSPACE_BYTES, false, c->stream));
    FP4D_CUDA_TRY(cudaMemcpyAsync(c->out.ptr, pr->out, ob, cudaMemcpyHostToDevice, c->stream), "cublaslt: upload out");
    lt_problem p;
    const char *step = "";
    cublasStatus_t s = lt_describe(c, &d, c->a_sc.ptr, c->b_sc.ptr, &p, &step);
    if (s == CUBLAS_STATUS_SUCCESS) {
        const float beta = 0.0f;
        s = cublasLtMatmul(c->handle, p.op, &pr->alpha, c->b.ptr, p.la, c->a.ptr, p.lb, &beta, c->out.ptr, p.lc,
                           c->out.ptr, p.lc, &p.heur.algo, c->workspace.ptr, LT_WORKSPACE_BYTES, c->stream);
        step = "cublasLtMatmul";
    }
    lt_problem_free(&p);
    FP4D_RETURN_ERROR_IF(s != CUBLAS_STATUS_SUCCESS, DEVICE, "cublaslt: %s failed: %s", step, lt_status_name(s));
    FP4D_CUDA_TRY(cudaMemcpyAsync(pr->out, c->out.ptr, ob, cudaMemcpyDeviceToHost, c->stream), "cublaslt: download out");
    cudaError_t e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess) return fp4d_cuda_status(e, "cublaslt: GEMM");
    return FP4D_STATUS_OK;
}

static int lt_score(void *ctx, const fp4d_gemm_desc *d)
{
    (void)ctx;
    (void)d;
    return 80; /* native tensor-core FP4 where it exists */
}

static const fp4d_backend_iface cublaslt_iface = {
    .api_version = FP4D_BACKEND_API_VERSION,
    .struct_size = sizeof(fp4d_backend_iface),
    .name = "cublaslt",
    .description = "cuBLASLt native block-scaled FP4 (e2m1, VEC16_UE4M3 / VEC32_UE8M0 scales; Blackwell)",
    .kind = FP4D_BACKEND_KIND_GPU,
    .caps = FP4D_CAP_GEMM | FP4D_CAP_NEEDS_DEVICE,
    .user_data = NULL,
    .init = lt_init,
    .free = lt_free,
    .supports = lt_supports,
    .gemm = lt_gemm,
    .grouped_gemm = NULL,
    .quantize = NULL,
    .score = lt_score,
    .bench = NULL,
};

const fp4d_backend_iface *fp4d_cublaslt_backend_iface(void) { return &cublaslt_iface; }
