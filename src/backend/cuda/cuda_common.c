/* Helpers shared by the GPU backends' host code: see cuda_internal.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"
#include "internal.h"

void fp4d_cuda_reason(fp4d_reason *why, const char *fmt, ...)
{
    if (!why) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why->text, sizeof why->text, fmt, ap);
    va_end(ap);
}

fp4d_status fp4d_cuda_status(int cuda_error, const char *what)
{
    /* Reported once: left pending, a non-sticky error (a refused attribute, a failed
     * allocation) was returned again by the cudaGetLastError of a later, successful call
     * (fp4d_cuda_sync). A sticky one stays whatever is cleared. */
    (void)cudaGetLastError();
    return fp4d_set_error(FP4D_STATUS_DEVICE, "%s: %s (%s)", what, cudaGetErrorString((cudaError_t)cuda_error),
                          cudaGetErrorName((cudaError_t)cuda_error));
}

fp4d_status fp4d_cuda_sync(cudaStream_t s, const char *what)
{
    cudaError_t e = cudaStreamSynchronize(s);
    if (e == cudaSuccess) e = cudaGetLastError();
    return e == cudaSuccess ? FP4D_STATUS_OK : fp4d_cuda_status(e, what);
}

fp4d_status fp4d_cuda_open_device(int device, int *resolved, int *sm_count, size_t *l2_bytes, int *cc,
                                  fp4d_reason *why)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        int driver = 0;
        cudaDriverGetVersion(&driver);
        const char *what = driver == 0 ? "no CUDA driver found" : cudaGetErrorString(e);
        fp4d_cuda_reason(why, "no usable CUDA GPU: %s (%s)", what, cudaGetErrorName(e));
        return fp4d_set_error(FP4D_STATUS_UNSUPPORTED, "no usable CUDA GPU: %s (%s)", what, cudaGetErrorName(e));
    }
    if (count == 0) {
        fp4d_cuda_reason(why, "no CUDA GPU found");
        return fp4d_set_error(FP4D_STATUS_UNSUPPORTED, "no CUDA GPU found");
    }
    const int d = device < 0 ? 0 : device;
    if (d >= count) {
        fp4d_cuda_reason(why, "GPU %d does not exist (this machine has %d)", d, count);
        return fp4d_set_error(FP4D_STATUS_UNSUPPORTED, "GPU %d does not exist (this machine has %d)", d, count);
    }
    e = cudaSetDevice(d);
    if (e != cudaSuccess) {
        fp4d_cuda_reason(why, "cannot use GPU %d: %s", d, cudaGetErrorString(e));
        return fp4d_set_error(FP4D_STATUS_DEVICE, "cannot use GPU %d: %s", d, cudaGetErrorString(e));
    }
    struct cudaDeviceProp prop;
    e = cudaGetDeviceProperties(&prop, d);
    if (e != cudaSuccess) {
        fp4d_cuda_reason(why, "cannot query GPU %d: %s", d, cudaGetErrorString(e));
        return fp4d_set_error(FP4D_STATUS_DEVICE, "cannot query GPU %d: %s", d, cudaGetErrorString(e));
    }
    if (prop.major < 8) {
        fp4d_cuda_reason(why, "%s is compute capability %d.%d; the CUDA backends need 8.0 or newer", prop.name,
                         prop.major, prop.minor);
        return fp4d_set_error(FP4D_STATUS_UNSUPPORTED, "%s", why ? why->text : "compute capability below 8.0");
    }
    if (resolved) *resolved = d;
    if (sm_count) *sm_count = prop.multiProcessorCount;
    if (l2_bytes) *l2_bytes = (size_t)prop.l2CacheSize;
    if (cc) *cc = prop.major * 10 + prop.minor;
    return FP4D_STATUS_OK;
}

/* Whether the current device has stream-ordered allocation (cudaMallocAsync). */
static bool device_has_memory_pools(void)
{
    int dev = 0, pools = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return pools != 0;
}

fp4d_status fp4d_devbuf_reserve(fp4d_devbuf *b, size_t bytes, bool zero_new, cudaStream_t stream)
{
    if (bytes <= b->cap && b->ptr) return FP4D_STATUS_OK;
    /*
     * Growth is ordered in the buffer's stream: the old allocation is freed after the work
     * queued before it, and the new one is ready for the work queued after it, with no host
     * wait. It used to wait with cudaDeviceSynchronize, then cudaFree and cudaMalloc. That
     * waited for every other instance's work too, and device-wide waits from several host
     * threads at once hang compute-sanitizer's racecheck: tools/racecheck_threads.cu hangs
     * it with cudaDeviceSynchronize (mode 1) and not with cudaFreeAsync / cudaMallocAsync
     * (mode 16), without any fp4doctor code. The MoE stress case grows buffers in four threads
     * at once and hung the same way. Without memory pools: wait for the stream alone, then
     * cudaFree (which may still wait for the device) and cudaMalloc.
     */
    const bool pooled = device_has_memory_pools();
    if (b->ptr) {
        cudaError_t fe;
        if (b->pooled) {
            fe = cudaFreeAsync(b->ptr, stream);
        } else {
            fe = cudaStreamSynchronize(stream);
            if (fe == cudaSuccess) fe = cudaFree(b->ptr);
        }
        if (fe != cudaSuccess) return fp4d_cuda_status(fe, "free a device buffer to grow it");
        b->ptr = NULL;
        b->cap = 0;
    }
    size_t want = bytes < 256 ? 256 : bytes;
    want = (want + 255) & ~(size_t)255;
    cudaError_t e = pooled ? cudaMallocAsync(&b->ptr, want, stream) : cudaMalloc(&b->ptr, want);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        b->ptr = NULL;
        return fp4d_set_error(FP4D_STATUS_NOMEM, "cannot allocate %zu bytes on the GPU: %s", want,
                              cudaGetErrorString(e));
    }
    b->cap = want;
    b->pooled = pooled;
    /* zeroed in the stream that uses the buffer, ahead of any of its work that reads it */
    if (zero_new) FP4D_CUDA_TRY(cudaMemsetAsync(b->ptr, 0, want, stream), "cudaMemsetAsync");
    return FP4D_STATUS_OK;
}

void fp4d_devbuf_free(fp4d_devbuf *b)
{
    if (b->ptr) cudaFree(b->ptr); /* also frees a cudaMallocAsync allocation, after the device's work */
    b->ptr = NULL;
    b->cap = 0;
    b->pooled = false;
}

size_t fp4d_cuda_matrix_data_bytes(const fp4d_matrix *x)
{
    return fp4d_dtype_data_bytes(x->dtype, x->rows, x->cols);
}

size_t fp4d_cuda_matrix_scale_bytes(const fp4d_matrix *x)
{
    const fp4d_dtype_traits *t = fp4d_dtype_get(x->dtype);
    if (!t || !t->is_block_fp4) return 0;
    return fp4d_scale_buffer_size(x->scale_layout, x->rows, x->cols / t->block_size);
}

fp4d_status fp4d_cuda_upload_matrix(const fp4d_matrix *x, fp4d_devbuf *data, fp4d_devbuf *scales, cudaStream_t s)
{
    const size_t db = fp4d_cuda_matrix_data_bytes(x), sb = fp4d_cuda_matrix_scale_bytes(x);
    FP4D_FORWARD_IF_ERROR(fp4d_devbuf_reserve(data, db, false, s));
    if (db) FP4D_CUDA_TRY(cudaMemcpyAsync(data->ptr, x->data, db, cudaMemcpyHostToDevice, s), "upload operand");
    if (sb) {
        FP4D_FORWARD_IF_ERROR(fp4d_devbuf_reserve(scales, sb, false, s));
        FP4D_CUDA_TRY(cudaMemcpyAsync(scales->ptr, x->scales, sb, cudaMemcpyHostToDevice, s), "upload scales");
    }
    return FP4D_STATUS_OK;
}

/* ---- bench support ------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/*
 * How long each timed batch of `calls` launches waits behind a hold of the stream before its
 * start event. Without it the GPU runs the start event at once (the stream is idle after the
 * previous batch) and then waits for the host to make the first launch, and the batch's time
 * included that gap: on the H200 machine about 3 us of host launch path, 0.4 us per call at
 * eight calls per batch, for every backend alike (two rounds each way, twentieth session: cuda
 * at M = 1 on 14336x4096 10.54 / 10.70 -> 10.15 / 10.16 us, cublas-bf16 31.78 / 33.07 ->
 * 31.15 / 32.27). While the stream is held, the host enqueues the start event and the whole
 * batch, which then runs back to back, so the events time GPU work only (NVIDIA's nvbench
 * holds its stream the same way with its "blocking kernel"). The hold allows 10 us of host
 * time per launch, far more than a launch takes; FP4DOCTOR_BENCH_HOLD_US overrides it (0: no
 * hold, for comparisons with earlier runs).
 */
static uint64_t bench_hold_ns(int calls)
{
    const long fallback = 50 + 10 * (calls > 0 ? calls : 1);
    return (uint64_t)fp4d_env_knob("FP4DOCTOR_BENCH_HOLD_US", 0, 1000000, fallback) * 1000u;
}

fp4d_status fp4d_cuda_time(cudaStream_t s, fp4d_cuda_bench_fn fn, void *state, int copies, int repeats,
                           fp4d_bench_result *out)
{
    if (repeats < 1) repeats = 1;
    if (copies < 1) copies = 1;
    /* warm-up: every copy once (first-touch, lazy module loading, cuBLAS heuristics) */
    for (int c = 0; c < copies; c++) FP4D_FORWARD_IF_ERROR(fn(state, c));
    FP4D_CUDA_TRY(cudaStreamSynchronize(s), "bench warm-up");
    cudaEvent_t start, stop;
    FP4D_CUDA_TRY(cudaEventCreate(&start), "cudaEventCreate");
    if (cudaEventCreate(&stop) != cudaSuccess) {
        cudaEventDestroy(start);
        return fp4d_set_error(FP4D_STATUS_DEVICE, "cudaEventCreate failed");
    }
    /* then rounds over the copies until BENCH_WARM_MS of GPU time have passed: the clocks of
     * an idle GPU ramp up over milliseconds (an idle H200 reports 345 MHz), and whatever was
     * measured first in a fresh process (the quantize kernel, when it comes first) lost a few
     * percent to it; every benchmark gets the same warm-up */
    enum { BENCH_WARM_MS = 10, BENCH_WARM_MAX_ROUNDS = 200 };
    fp4d_status st = FP4D_STATUS_OK;
    cudaEventRecord(start, s);
    for (int round = 0; st == FP4D_STATUS_OK && round < BENCH_WARM_MAX_ROUNDS; round++) {
        for (int c = 0; st == FP4D_STATUS_OK && c < copies; c++) st = fn(state, c);
        if (st != FP4D_STATUS_OK) break;
        cudaEventRecord(stop, s);
        const cudaError_t e = cudaEventSynchronize(stop);
        if (e != cudaSuccess) {
            st = fp4d_cuda_status(e, "bench warm-up"); /* a kernel failed: no point in more rounds */
            break;
        }
        float ms = 0.0f;
        if (cudaEventElapsedTime(&ms, start, stop) == cudaSuccess && ms >= (float)BENCH_WARM_MS) break;
    }
    double *t = st == FP4D_STATUS_OK ? calloc((size_t)repeats, sizeof *t) : NULL;
    if (st == FP4D_STATUS_OK && !t) st = fp4d_set_error(FP4D_STATUS_NOMEM, "bench: out of memory");
    /* short calls: batch several rotations so one batch lasts well past event resolution */
    const int per_batch = copies < 8 ? 8 : copies;
    const uint64_t hold_ns = bench_hold_ns(per_batch);
    for (int r = 0; st == FP4D_STATUS_OK && r < repeats; r++) {
        if (hold_ns > 0 && fp4d_cuda_hold_stream(hold_ns, s) != 0) {
            st = fp4d_set_error(FP4D_STATUS_DEVICE, "bench: the stream hold failed");
            break;
        }
        cudaEventRecord(start, s);
        for (int c = 0; st == FP4D_STATUS_OK && c < per_batch; c++) st = fn(state, c % copies);
        cudaEventRecord(stop, s);
        cudaError_t e = cudaEventSynchronize(stop);
        if (st == FP4D_STATUS_OK && e != cudaSuccess) st = fp4d_cuda_status(e, "bench");
        float ms = 0.0f;
        if (st == FP4D_STATUS_OK) cudaEventElapsedTime(&ms, start, stop);
        t[r] = (double)ms * 1000.0 / per_batch;
    }
    if (st == FP4D_STATUS_OK) {
        qsort(t, (size_t)repeats, sizeof *t, cmp_double);
        out->median_us = repeats % 2 ? t[repeats / 2] : 0.5 * (t[repeats / 2 - 1] + t[repeats / 2]);
        out->min_us = t[0];
        out->repeats = repeats;
    }
    free(t);
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return st;
}

int fp4d_cuda_rotation_copies(size_t bytes, size_t l2_bytes)
{
    if (bytes == 0) return 1;
    if (l2_bytes == 0) l2_bytes = 64u << 20;
    size_t want = (4 * l2_bytes + bytes - 1) / bytes; /* 4x the L2 in flight */
    if (want < 2) want = 2;
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess && bytes > 0) {
        const size_t fit = (free_b / 3) / bytes;
        if (want > fit) want = fit;
    }
    if (want < 1) want = 1;
    if (want > 64) want = 64;
    return (int)want;
}

fp4d_status fp4d_cuda_make_bench_fp4(fp4d_dtype format, int64_t rows, int64_t cols, fp4d_scale_layout layout,
                                     uint32_t seed, fp4d_devbuf *codes, fp4d_devbuf *scales, cudaStream_t s)
{
    const fp4d_dtype_traits *t = fp4d_dtype_get(format);
    const size_t cb = (size_t)rows * (size_t)cols / 2;
    const size_t sb = fp4d_scale_buffer_size(layout, rows, cols / t->block_size);
    FP4D_FORWARD_IF_ERROR(fp4d_devbuf_reserve(codes, cb, false, s));
    FP4D_FORWARD_IF_ERROR(fp4d_devbuf_reserve(scales, sb, false, s));
    FP4D_CUDA_TRY(fp4d_cuda_fill_random_fp4(codes->ptr, cb, seed, s), "bench data");
    /* 0x38 = 1.0 in e4m3; 127 = 2^0 in ue8m0 */
    FP4D_CUDA_TRY(cudaMemsetAsync(scales->ptr, format == FP4D_DTYPE_NVFP4 ? 0x38 : 127, sb, s), "bench scales");
    return FP4D_STATUS_OK;
}

fp4d_status fp4d_cuda_make_bench_plain(fp4d_dtype type, int64_t rows, int64_t cols, uint32_t seed,
                                       fp4d_devbuf *data, cudaStream_t s)
{
    fp4d_devbuf codes = {0}, scales = {0};
    fp4d_status st = fp4d_cuda_make_bench_fp4(FP4D_DTYPE_NVFP4, rows, cols, FP4D_LAYOUT_LINEAR, seed, &codes, &scales, s);
    if (st == FP4D_STATUS_OK) st = fp4d_devbuf_reserve(data, fp4d_dtype_data_bytes(type, rows, cols), false, s);
    if (st == FP4D_STATUS_OK) {
        fp4d_dev_fp4 src = {codes.ptr, scales.ptr, rows, cols, FP4D_DTYPE_NVFP4, FP4D_LAYOUT_LINEAR};
        int e = fp4d_cuda_dequantize(&src, type, data->ptr, s);
        if (e == 0) e = cudaStreamSynchronize(s);
        if (e != 0) st = fp4d_cuda_status(e, "bench activations");
    }
    fp4d_devbuf_free(&codes);
    fp4d_devbuf_free(&scales);
    return st;
}

void fp4d_cuda_bench_routing(int64_t tokens, int top_k, int num_experts, int rotate, int64_t *offsets)
{
    /* token t picks experts (37 t + i * E / top_k + rotate * top_k) mod E, i < top_k: distinct
     * per token, spread over tokens, and shifted by `rotate` so that successive calls
     * touch different experts' weights. */
    for (int e = 0; e <= num_experts; e++) offsets[e] = 0;
    const int stride = num_experts / top_k > 0 ? num_experts / top_k : 1;
    for (int64_t t = 0; t < tokens; t++)
        for (int i = 0; i < top_k; i++) {
            const int64_t e = (37 * t + (int64_t)i * stride + (int64_t)rotate * top_k) % num_experts;
            offsets[e + 1]++;
        }
    for (int e = 0; e < num_experts; e++) offsets[e + 1] += offsets[e];
}
