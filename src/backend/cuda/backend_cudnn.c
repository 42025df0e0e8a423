/*
 * backend_cudnn.c - `cudnn`: native FP4 through cuDNN's graph (backend) API, the path
 * under SGLang's flashinfer_cudnn: two BLOCK_SCALE_DEQUANTIZE operations (e2m1 codes with
 * e4m3 / e8m0 block scales in the F8_128x4 reordering) feeding one MATMUL with f32
 * compute. Whether cuDNN can run it is cuDNN's answer: supports() builds the operation
 * graph and asks the engine heuristics; an error status or zero engine configurations is
 * the reason we report (GPUs before compute capability 10.0 have no such engine).
 *
 * libcudnn is loaded with dlopen at first use (FP4DOCTOR_CUDNN_LIB overrides the name), so
 * fp4doctor starts on machines without cuDNN and reports "cuDNN not found" instead.
 * Descriptor types and attribute numbers come from cudnn_graph.h at build time.
 *
 * The matmul writes f32; alpha and the cast to the output type are applied by our own
 * convert kernel (one rounding, as the other backends do).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cudnn_graph.h>

#include "cuda_internal.h"
#include "internal.h"

/* ---- the library, loaded at run time -------------------------------------------------- */

typedef struct cudnn_api {
    void *lib;
    char  error[200];
    size_t (*GetVersion)(void);
    const char *(*GetErrorString)(cudnnStatus_t);
    cudnnStatus_t (*Create)(cudnnHandle_t *);
    cudnnStatus_t (*Destroy)(cudnnHandle_t);
    cudnnStatus_t (*SetStream)(cudnnHandle_t, cudaStream_t);
    cudnnStatus_t (*BackendCreateDescriptor)(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t *);
    cudnnStatus_t (*BackendDestroyDescriptor)(cudnnBackendDescriptor_t);
    cudnnStatus_t (*BackendFinalize)(cudnnBackendDescriptor_t);
    cudnnStatus_t (*BackendSetAttribute)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t,
                                         cudnnBackendAttributeType_t, int64_t, const void *);
    cudnnStatus_t (*BackendGetAttribute)(cudnnBackendDescriptor_t const, cudnnBackendAttributeName_t,
                                         cudnnBackendAttributeType_t, int64_t, int64_t *, void *);
    cudnnStatus_t (*BackendExecute)(cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t);
} cudnn_api;

static cudnn_api api;
static pthread_once_t api_once = PTHREAD_ONCE_INIT;

static void load_api(void)
{
    const char *names[] = {getenv("FP4DOCTOR_CUDNN_LIB"), "libcudnn.so.9", "libcudnn.so"};
    for (size_t i = 0; i < FP4D_ARRAY_LEN(names) && !api.lib; i++)
        if (names[i] && *names[i]) api.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!api.lib) {
        snprintf(api.error, sizeof api.error, "cuDNN not found (%s)", dlerror());
        return;
    }
#define LOAD(field, sym)                                                             \
    do {                                                                             \
        *(void **)&api.field = dlsym(api.lib, sym);                                  \
        if (!api.field) {                                                            \
            snprintf(api.error, sizeof api.error, "cuDNN library lacks %s", sym);    \
            dlclose(api.lib);                                                        \
            api.lib = NULL;                                                          \
            return;                                                                  \
        }                                                                            \
    } while (0)
    LOAD(GetVersion, "cudnnGetVersion");
    LOAD(GetErrorString, "cudnnGetErrorString");
    LOAD(Create, "cudnnCreate");
    LOAD(Destroy, "cudnnDestroy");
    LOAD(SetStream, "cudnnSetStream");
    LOAD(BackendCreateDescriptor, "cudnnBackendCreateDescriptor");
    LOAD(BackendDestroyDescriptor, "cudnnBackendDestroyDescriptor");
    LOAD(BackendFinalize, "cudnnBackendFinalize");
    LOAD(BackendSetAttribute, "cudnnBackendSetAttribute");
    LOAD(BackendGetAttribute, "cudnnBackendGetAttribute");
    LOAD(BackendExecute, "cudnnBackendExecute");
#undef LOAD
}

static bool api_ready(void)
{
    pthread_once(&api_once, load_api);
    return api.lib != NULL;
}

int fp4d_cudnn_runtime_version(void)
{
    return api_ready() ? (int)api.GetVersion() : 0;
}

/* ---- graph building ---------------------------------------------------------------------- */

enum { UID_A = 1, UID_A_SCALE, UID_A_DEQ, UID_B, UID_B_SCALE, UID_B_DEQ, UID_C };
enum { MAX_DESCS = 24 };

/* Every descriptor made for one problem, destroyed together. */
typedef struct graph {
    cudnnBackendDescriptor_t d[MAX_DESCS];
    int                      n;
    cudnnBackendDescriptor_t op_graph, plan;
    int64_t                  workspace;
    const char              *step;   /* the call that failed */
    cudnnStatus_t            status;
} graph;

static void graph_free(graph *g)
{
    for (int i = g->n - 1; i >= 0; i--) api.BackendDestroyDescriptor(g->d[i]);
    g->n = 0;
}

static cudnnBackendDescriptor_t make(graph *g, cudnnBackendDescriptorType_t t, const char *what)
{
    cudnnBackendDescriptor_t d = NULL;
    if (g->status != CUDNN_STATUS_SUCCESS || g->n >= MAX_DESCS) return NULL;
    g->status = api.BackendCreateDescriptor(t, &d);
    if (g->status != CUDNN_STATUS_SUCCESS) {
        g->step = what;
        return NULL;
    }
    g->d[g->n++] = d;
    return d;
}

static void set(graph *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t,
                int64_t n, const void *v, const char *what)
{
    if (g->status != CUDNN_STATUS_SUCCESS) return;
    g->status = api.BackendSetAttribute(d, a, t, n, v);
    if (g->status != CUDNN_STATUS_SUCCESS) g->step = what;
}

static void fin(graph *g, cudnnBackendDescriptor_t d, const char *what)
{
    if (g->status != CUDNN_STATUS_SUCCESS) return;
    g->status = api.BackendFinalize(d);
    if (g->status != CUDNN_STATUS_SUCCESS) g->step = what;
}

static cudnnBackendDescriptor_t tensor(graph *g, int64_t uid, cudnnDataType_t type, const int64_t dims[3],
                                       const int64_t strides[3], bool is_virtual, bool reorder_128x4, const char *what)
{
    cudnnBackendDescriptor_t t = make(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR, what);
    const int64_t align = 16;
    set(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, what);
    set(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 3, dims, what);
    set(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 3, strides, what);
    set(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, what);
    set(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, what);
    set(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, what);
    if (reorder_128x4) {
        cudnnBackendTensorReordering_t r = CUDNN_TENSOR_REORDERING_F8_128x4;
        set(g, t, CUDNN_ATTR_TENSOR_REORDERING_MODE, CUDNN_TYPE_TENSOR_REORDERING_MODE, 1, &r, what);
    }
    fin(g, t, what);
    return t;
}

static cudnnBackendDescriptor_t dequant_op(graph *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t s,
                                           cudnnBackendDescriptor_t y, int32_t block, const char *what)
{
    cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_BLOCK_SCALE_DEQUANTIZE_DESCRIPTOR, what);
    cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    set(g, op, CUDNN_ATTR_OPERATION_BLOCK_SCALE_DEQUANTIZE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, what);
    set(g, op, CUDNN_ATTR_OPERATION_BLOCK_SCALE_DEQUANTIZE_SCALE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &s, what);
    set(g, op, CUDNN_ATTR_OPERATION_BLOCK_SCALE_DEQUANTIZE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, what);
    set(g, op, CUDNN_ATTR_OPERATION_BLOCK_SCALE_DEQUANTIZE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, what);
    set(g, op, CUDNN_ATTR_OPERATION_BLOCK_SCALE_DEQUANTIZE_BLOCK_SIZE, CUDNN_TYPE_INT32, 1, &block, what);
    fin(g, op, what);
    return op;
}

/* Builds dequantize(A), dequantize(B), matmul -> C (f32) and, when plan is wanted, the
 * execution plan of the first engine configuration the heuristics offer. */
static void build(graph *g, cudnnHandle_t handle, const fp4d_gemm_desc *d, bool want_plan)
{
    memset(g, 0, sizeof *g);
    g->status = CUDNN_STATUS_SUCCESS;
    const bool nv = d->b_type == FP4D_DTYPE_NVFP4;
    const int32_t block = nv ? 16 : 32;
    const cudnnDataType_t st = nv ? CUDNN_DATA_FP8_E4M3 : CUDNN_DATA_FP8_E8M0;
    const int64_t M = d->m, N = d->n, K = d->k, KS = d->k / block;
    const int64_t a_dims[3] = {1, M, K}, a_str[3] = {M * K, K, 1};
    const int64_t as_dims[3] = {1, M, KS}, as_str[3] = {M * KS, KS, 1};
    const int64_t b_dims[3] = {1, K, N}, b_str[3] = {N * K, 1, K}; /* our [N, K] row-major is K x N, K-contiguous */
    const int64_t bs_dims[3] = {1, KS, N}, bs_str[3] = {N * KS, 1, KS};
    const int64_t c_dims[3] = {1, M, N}, c_str[3] = {M * N, N, 1};
    cudnnBackendDescriptor_t ta = tensor(g, UID_A, CUDNN_DATA_FP4_E2M1, a_dims, a_str, false, false, "A tensor");
    cudnnBackendDescriptor_t tas = tensor(g, UID_A_SCALE, st, as_dims, as_str, false, true, "A scale tensor");
    cudnnBackendDescriptor_t tad = tensor(g, UID_A_DEQ, CUDNN_DATA_FLOAT, a_dims, a_str, true, false, "A dequant tensor");
    cudnnBackendDescriptor_t tb = tensor(g, UID_B, CUDNN_DATA_FP4_E2M1, b_dims, b_str, false, false, "B tensor");
    cudnnBackendDescriptor_t tbs = tensor(g, UID_B_SCALE, st, bs_dims, bs_str, false, true, "B scale tensor");
    cudnnBackendDescriptor_t tbd = tensor(g, UID_B_DEQ, CUDNN_DATA_FLOAT, b_dims, b_str, true, false, "B dequant tensor");
    cudnnBackendDescriptor_t tc = tensor(g, UID_C, CUDNN_DATA_FLOAT, c_dims, c_str, false, false, "C tensor");
    cudnnBackendDescriptor_t ops[3];
    ops[0] = dequant_op(g, ta, tas, tad, block, "block-scale dequantize A");
    ops[1] = dequant_op(g, tb, tbs, tbd, block, "block-scale dequantize B");
    cudnnBackendDescriptor_t mm = make(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul descriptor");
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    set(g, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "matmul descriptor");
    fin(g, mm, "matmul descriptor");
    ops[2] = make(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul operation");
    set(g, ops[2], CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &tad, "matmul operation");
    set(g, ops[2], CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &tbd, "matmul operation");
    set(g, ops[2], CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &tc, "matmul operation");
    set(g, ops[2], CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm, "matmul operation");
    fin(g, ops[2], "matmul operation");
    g->op_graph = make(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    set(g, g->op_graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 3, ops, "operation graph");
    set(g, g->op_graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "operation graph");
    fin(g, g->op_graph, "operation graph");
    cudnnBackendDescriptor_t heur = make(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "engine heuristics");
    cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    set(g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->op_graph, "engine heuristics");
    set(g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "engine heuristics");
    fin(g, heur, "engine heuristics");
    if (g->status != CUDNN_STATUS_SUCCESS) return;
    cudnnBackendDescriptor_t cfg = make(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config");
    if (g->status != CUDNN_STATUS_SUCCESS) return;
    int64_t count = 0;
    g->status = api.BackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count, &cfg);
    if (g->status != CUDNN_STATUS_SUCCESS) {
        g->step = "engine heuristics results";
        return;
    }
    if (count < 1) {
        g->status = CUDNN_STATUS_NOT_SUPPORTED;
        g->step = "engine heuristics (0 engine configurations)";
        return;
    }
    if (!want_plan) return;
    g->plan = make(g, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "execution plan");
    set(g, g->plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg, "execution plan");
    set(g, g->plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "execution plan");
    fin(g, g->plan, "execution plan");
    if (g->status != CUDNN_STATUS_SUCCESS) return;
    int64_t n = 0;
    g->status = api.BackendGetAttribute(g->plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n,
                                        &g->workspace);
    if (g->status != CUDNN_STATUS_SUCCESS) g->step = "execution plan workspace size";
}

/* ---- the iface ------------------------------------------------------------------------- */

typedef struct dnn_ctx {
    int            device, sm_count, cc;
    size_t         l2_bytes;
    cudaStream_t   stream;
    cudnnHandle_t  handle;
    fp4d_devbuf    a, a_sc, b, b_sc, c32, out, workspace;
    bool           have_answer, answer;
    fp4d_gemm_desc asked;
    fp4d_reason    answer_why;
} dnn_ctx;

static fp4d_status dnn_init(void *user_data, int device, void **out, fp4d_reason *why)
{
    (void)user_data;
    *out = NULL;
    if (!api_ready()) {
        fp4d_cuda_reason(why, "%s", api.error);
        return fp4d_set_error(FP4D_STATUS_UNSUPPORTED, "%s", api.error);
    }
    dnn_ctx *c = calloc(1, sizeof *c);
    FP4D_RETURN_ERROR_IF(!c, NOMEM, "cudnn: out of memory");
    fp4d_status st = fp4d_cuda_open_device(device, &c->device, &c->sm_count, &c->l2_bytes, &c->cc, why);
    if (st != FP4D_STATUS_OK) {
        free(c);
        return st;
    }
    cudnnStatus_t s = api.Create(&c->handle);
    if (s != CUDNN_STATUS_SUCCESS) {
        fp4d_cuda_reason(why, "cudnnCreate failed: %s", api.GetErrorString(s));
        free(c);
        return fp4d_set_error(FP4D_STATUS_UNSUPPORTED, "cudnnCreate failed: %s", api.GetErrorString(s));
    }
    if (cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking) != cudaSuccess) {
        api.Destroy(c->handle);
        free(c);
        fp4d_cuda_reason(why, "cannot create a CUDA stream");
        return fp4d_set_error(FP4D_STATUS_DEVICE, "cannot create a CUDA stream");
    }
    api.SetStream(c->handle, c->stream);
    *out = c;
    return FP4D_STATUS_OK;
}

static void dnn_free(void *ctx)
{
    dnn_ctx *c = ctx;
    if (!c) return;
    cudaSetDevice(c->device);
    cudaStreamSynchronize(c->stream);
    fp4d_devbuf *bufs[] = {&c->a, &c->a_sc, &c->b, &c->b_sc, &c->c32, &c->out, &c->workspace};
    for (size_t i = 0; i < FP4D_ARRAY_LEN(bufs); i++) fp4d_devbuf_free(bufs[i]);
    api.Destroy(c->handle);
    cudaStreamDestroy(c->stream);
    free(c);
}

static bool dnn_supports(void *ctx, const fp4d_gemm_desc *d, fp4d_reason *why)
{
    dnn_ctx *c = ctx;
    if (d->num_experts > 0) {
        fp4d_cuda_reason(why, "no grouped GEMM through cuDNN here (use cuda or cublas-bf16)");
        return false;
    }
    if (d->a_type != d->b_type || (d->b_type != FP4D_DTYPE_NVFP4 && d->b_type != FP4D_DTYPE_MXFP4)) {
        fp4d_cuda_reason(why, "the cuDNN FP4 graph here takes FP4 x FP4 of one format (nvfp4 or mxfp4)");
        return false;
    }
    fp4d_gemm_desc key = *d;
    key.a_layout = key.b_layout = FP4D_LAYOUT_LINEAR;
    key.out_type = FP4D_DTYPE_F32; /* the graph always writes f32 */
    if (c->have_answer && !memcmp(&key, &c->asked, sizeof key)) {
        if (!c->answer && why) *why = c->answer_why;
        return c->answer;
    }
    cudaSetDevice(c->device);
    graph g;
    build(&g, c->handle, d, false);
    c->have_answer = true;
    c->asked = key;
    c->answer = g.status == CUDNN_STATUS_SUCCESS;
    if (!c->answer) {
        fp4d_cuda_reason(&c->answer_why, "cuDNN %zu on compute capability %d.%d: %s: %s", api.GetVersion(), c->cc / 10,
                         c->cc % 10, g.step ? g.step : "?", api.GetErrorString(g.status));
        if (why) *why = c->answer_why;
    }
    graph_free(&g);
    return c->answer;
}

static fp4d_status upload_swizzled(const fp4d_matrix *x, fp4d_devbuf *codes, fp4d_devbuf *scales, cudaStream_t s)
{
    const int64_t sc = x->cols / fp4d_dtype_get(x->dtype)->block_size;
    if (x->scale_layout == FP4D_LAYOUT_SWIZZLED_128X4) return fp4d_cuda_upload_matrix(x, codes, scales, s);
    const size_t sb = fp4d_scale_buffer_size(FP4D_LAYOUT_SWIZZLED_128X4, x->rows, sc);
    uint8_t *tmp = malloc(sb);
    FP4D_RETURN_ERROR_IF(!tmp, NOMEM, "cudnn: out of memory");
    fp4d_scales_convert(x->scale_layout, x->scales, FP4D_LAYOUT_SWIZZLED_128X4, tmp, x->rows, sc);
    fp4d_matrix y = *x;
    y.scales = tmp;
    y.scale_layout = FP4D_LAYOUT_SWIZZLED_128X4;
    fp4d_status st = fp4d_cuda_upload_matrix(&y, codes, scales, s);
    if (st == FP4D_STATUS_OK && cudaStreamSynchronize(s) != cudaSuccess)
        st = fp4d_set_error(FP4D_STATUS_DEVICE, "cudnn: upload failed");
    free(tmp);
    return st;
}

static fp4d_status dnn_gemm(void *ctx, const fp4d_gemm_problem *p)
{
    dnn_ctx *c = ctx;
    FP4D_CUDA_TRY(cudaSetDevice(c->device), "cudnn: cudaSetDevice");
    fp4d_gemm_desc d;
    fp4d_gemm_describe(p, &d);
    FP4D_FORWARD_IF_ERROR(upload_swizzled(&p->a, &c->a, &c->a_sc, c->stream));
    FP4D_FORWARD_IF_ERROR(upload_swizzled(&p->b, &c->b, &c->b_sc, c->stream));
    const size_t mn = (size_t)d.m * (size_t)d.n, ob = mn * fp4d_out_elem_size(p->out_type);
    FP4D_FORWARD_IF_ERROR(fp4d_devbuf_reserve(&c->c32, mn * sizeof(float), false, c->stream));
    FP4D_FORWARD_IF_ERROR(fp4d_devbuf_reserve(&c->out, ob, false, c->stream));
    FP4D_CUDA_TRY(cudaMemcpyAsync(c->out.ptr, p->out, ob, cudaMemcpyHostToDevice, c->stream), "cudnn: upload out");
    graph g;
    build(&g, c->handle, &d, true);
    fp4d_status st = FP4D_STATUS_OK;
    if (g.status == CUDNN_STATUS_SUCCESS && g.workspace > 0)
        st = fp4d_devbuf_reserve(&c->workspace, (size_t)g.workspace, false, c->stream);
    if (st == FP4D_STATUS_OK && g.status == CUDNN_STATUS_SUCCESS) {
        cudnnBackendDescriptor_t vp = make(&g, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "variant pack");
        int64_t uids[5] = {UID_A, UID_A_SCALE, UID_B, UID_B_SCALE, UID_C};
        void *ptrs[5] = {c->a.ptr, c->a_sc.ptr, c->b.ptr, c->b_sc.ptr, c->c32.ptr};
        void *ws = c->workspace.ptr;
        set(&g, vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 5, uids, "variant pack");
        set(&g, vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 5, ptrs, "variant pack");
        set(&g, vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws, "variant pack");
        fin(&g, vp, "variant pack");
        if (g.status == CUDNN_STATUS_SUCCESS) {
            g.status = api.BackendExecute(c->handle, g.plan, vp);
            if (g.status != CUDNN_STATUS_SUCCESS) g.step = "cudnnBackendExecute";
        }
    }
    if (st == FP4D_STATUS_OK && g.status != CUDNN_STATUS_SUCCESS)
        st = fp4d_set_error(FP4D_STATUS_DEVICE, "cudnn: %s: %s", g.step ? g.step : "?", api.GetErrorString(g.status));
    graph_free(&g);
    FP4D_FORWARD_IF_ERROR(st);
    FP4D_CUDA_TRY(fp4d_cuda_scale_convert(c->c32.ptr, p->alpha, p->out_type, c->out.ptr, mn, c->stream),
                  "cudnn: alpha and output cast");
    FP4D_CUDA_TRY(cudaMemcpyAsync(p->out, c->out.ptr, ob, cudaMemcpyDeviceToHost, c->stream), "cudnn: download out");
    cudaError_t e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess) return fp4d_cuda_status(e, "cudnn: GEMM");
    return FP4D_STATUS_OK;
}

static int dnn_score(void *ctx, const fp4d_gemm_desc *d)
{
    (void)ctx;
    (void)d;
    return 70;
}

static const fp4d_backend_iface cudnn_iface = {
    .api_version = FP4D_BACKEND_API_VERSION,
    .struct_size = sizeof(fp4d_backend_iface),
    .name = "cudnn",
    .description = "cuDNN graph: block-scale dequantize (e2m1, F8_128x4 scales) feeding a matmul (Blackwell)",
    .kind = FP4D_BACKEND_KIND_GPU,
    .caps = FP4D_CAP_GEMM | FP4D_CAP_NEEDS_DEVICE,
    .user_data = NULL,
    .init = dnn_init,
    .free = dnn_free,
    .supports = dnn_supports,
    .gemm = dnn_gemm,
    .grouped_gemm = NULL,
    .quantize = NULL,
    .score = dnn_score,
    .bench = NULL,
};

const fp4d_backend_iface *fp4d_cudnn_backend_iface(void) { return &cudnn_iface; }
