// bench_bw.cu — the GPU's streaming read bandwidth, the denominator of the
// HBM bounds in docs/gpu.md (bytes a decode step touches ÷ this): one kernel
// reads a 4 GiB buffer in 16-byte streaming loads (ld.global.cs, as the
// matvecs read weights), 8 threadgroups of 512 threads per SM; prints the
// best of 20 launches. make cuda-bench builds it; run build/cuda/bench_bw.
// (An H100 80GB HBM3, session 24: 3099 GB/s; its datasheet says 3.35 TB/s.)
#include <cuda_runtime.h>
#include <stdio.h>

static __global__ void read_all(const int4 *p, size_t n, int *sink) {
    int acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const int4 v = __ldcs(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678) *sink = acc; /* keeps the loads: the buffer is never this */
}

#define CK(x)                                                                  \
    do {                                                                       \
        cudaError_t e_ = (x);                                                  \
        if (e_ != cudaSuccess) {                                               \
            fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));            \
            return 1;                                                          \
        }                                                                      \
    } while (0)

int main(void) {
    const size_t bytes = (size_t)4 << 30, n = bytes / 16;
    int4 *p;
    int *sink;
    cudaDeviceProp pr;
    CK(cudaGetDeviceProperties(&pr, 0));
    CK(cudaMalloc(&p, bytes));
    CK(cudaMalloc(&sink, 4));
    CK(cudaMemset(p, 1, bytes));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    float best = 1e30f;
    for (int r = 0; r < 20; r++) {
        CK(cudaEventRecord(a));
        read_all<<<pr.multiProcessorCount * 8, 512>>>(p, n, sink);
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (ms < best) best = ms;
    }
    printf("BW %s: read %.0f GB/s (best of 20 reads of 4 GiB)\n", pr.name, bytes / best / 1e6);
    return 0;
}
