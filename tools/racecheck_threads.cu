/*
 * racecheck_threads - a stand-alone program that launches small kernels from several host
 * threads at once, each thread on its own non-blocking stream, the way `check`'s stress cases
 * drive the `cuda` backend. It holds no fp4doctor code.
 *
 * Why: under `compute-sanitizer --tool racecheck`, fp4doctor's stress cases (several backend
 * instances, one host thread each) hang in some runs, while every single-threaded case
 * finishes. This program tells which host calls the hang needs, without fp4doctor's kernels.
 *
 * Build: cmake --build BUILD --target racecheck_threads   (or: nvcc -O2 -arch=sm_90
 *        -o racecheck_threads tools/racecheck_threads.cu -lpthread)
 * Run:   compute-sanitizer --tool racecheck ./racecheck_threads [threads] [rounds] [mode]
 *        mode, a sum of: 0 copies and launches only; and each round before the copies,
 *          1 cudaDeviceSynchronize;
 *          2 cudaFuncSetAttribute, then a kernel with dynamic shared memory (as fp4doctor's
 *            wgmma launches);
 *          4 cudaFree and cudaMalloc of a buffer that grows (as fp4doctor's scratch buffers);
 *          8 cudaMemset of that buffer on the legacy stream;
 *         16 cudaFreeAsync and cudaMallocAsync of it in the thread's own stream instead of 4.
 * Prints "done" and exits 0 when every thread finished and every result was right.
 *
 * Measured on an H100 (compute-sanitizer 2025.3.1, 4 threads x 30 rounds, killed after 20-40
 * s): every run whose loop called cudaDeviceSynchronize hung (mode 1: 3 of 3; an earlier
 * version that called it around cudaFree, cudaMalloc and cudaMemset: 6 of 6); without it, 1 of 21 runs hung (mode
 * 12, cudaFree with a legacy-stream cudaMemset; modes 0, 2, 4, 8, 16 and 24 none of 3 each);
 * one thread, 0 of 2. Without the tool every mode finishes in about a second. So device-wide
 * waits from several host threads are enough to hang the tool.
 */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

enum { BLOCK = 256, N = 1 << 16 };

/* each block sums its 256 inputs through shared memory s (racecheck tracks its accesses) */
__device__ void sum_block(float *s, const float *in, float *out)
{
    s[threadIdx.x] = in[blockIdx.x * BLOCK + threadIdx.x];
    __syncthreads();
    for (int w = BLOCK / 2; w > 0; w /= 2) {
        if (threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = s[0];
}

__global__ void block_sums(const float *in, float *out)
{
    __shared__ float s[BLOCK];
    sum_block(s, in, out);
}

/* the same with its shared memory dynamic */
__global__ void block_sums_dynamic(const float *in, float *out)
{
    extern __shared__ float d[];
    sum_block(d, in, out);
}

struct worker {
    int id, rounds, mode, failures;
};

static void *run_worker(void *arg)
{
    worker *w = (worker *)arg;
    cudaStream_t s;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
        w->failures++;
        return NULL;
    }
    float *host_in = (float *)malloc(N * sizeof(float)), *host_out = (float *)malloc(N / BLOCK * sizeof(float));
    float *in = NULL, *out = NULL, *grown = NULL;
    cudaMalloc(&in, N * sizeof(float));
    cudaMalloc(&out, N / BLOCK * sizeof(float));
    for (int r = 0; r < w->rounds; r++) {
        for (int i = 0; i < N; i++) host_in[i] = (float)((i + r + w->id) % 7);
        const size_t grown_bytes = (size_t)(r + 1) << 16;
        if (w->mode & 1) cudaDeviceSynchronize();
        if (w->mode & 16) {
            cudaFreeAsync(grown, s);
            cudaMallocAsync(&grown, grown_bytes, s);
        } else if ((w->mode & 4) || !grown) {
            cudaFree(grown);
            cudaMalloc(&grown, grown_bytes);
        }
        if (w->mode & 8) cudaMemset(grown, 0, 4096);
        cudaMemcpyAsync(in, host_in, N * sizeof(float), cudaMemcpyHostToDevice, s);
        if (w->mode & 2) {
            const int smem = 64 << 10; /* more than the default 48 KiB: needs the attribute */
            cudaFuncSetAttribute(block_sums_dynamic, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
            block_sums_dynamic<<<N / BLOCK, BLOCK, smem, s>>>(in, out);
        } else {
            block_sums<<<N / BLOCK, BLOCK, 0, s>>>(in, out);
        }
        cudaMemcpyAsync(host_out, out, N / BLOCK * sizeof(float), cudaMemcpyDeviceToHost, s);
        if (cudaStreamSynchronize(s) != cudaSuccess) {
            w->failures++;
            break;
        }
        for (int b = 0; b < N / BLOCK; b++) {
            float want = 0.0f;
            for (int i = 0; i < BLOCK; i++) want += host_in[b * BLOCK + i];
            if (host_out[b] != want) {
                w->failures++;
                break;
            }
        }
    }
    cudaStreamSynchronize(s);
    cudaFree(grown);
    cudaFree(in);
    cudaFree(out);
    cudaStreamDestroy(s);
    free(host_in);
    free(host_out);
    return NULL;
}

int main(int argc, char **argv)
{
    const int threads = argc > 1 ? atoi(argv[1]) : 4, rounds = argc > 2 ? atoi(argv[2]) : 20,
              mode = argc > 3 ? atoi(argv[3]) : 0;
    if (threads < 1 || threads > 64 || rounds < 1 || mode < 0 || mode > 31) {
        fprintf(stderr, "usage: racecheck_threads [threads 1..64] [rounds >= 1] [mode 0..31]\n");
        return 2;
    }
    if (cudaFree(0) != cudaSuccess) {
        fprintf(stderr, "racecheck_threads: no usable GPU\n");
        return 1;
    }
    pthread_t tid[64];
    worker w[64];
    for (int i = 0; i < threads; i++) {
        w[i] = worker{i, rounds, mode, 0};
        pthread_create(&tid[i], NULL, run_worker, &w[i]);
    }
    int failures = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(tid[i], NULL);
        failures += w[i].failures;
    }
    printf("%s: %d threads x %d rounds, mode %d, %d failures\n", failures ? "FAILED" : "done", threads, rounds, mode,
           failures);
    return failures ? 1 : 0;
}
