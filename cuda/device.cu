// device.cu — the CUDA k_device (gpu/host/device.h): cudaMalloc'd memory,
// launches through k_cuda_launch (host.cu: bindings checked against the
// argument tables) on the legacy default stream, so copies and launches are
// ordered without events. CUDA graphs (one capture per decode step) are the
// next step for small models, where launch latency dominates (docs/gpu.md).
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../gpu/host/device.h"

extern "C" int k_cuda_launch(int id, const uint32_t grid[3], uint32_t tg, const k_binding *b, int nb,
                             cudaStream_t stream, char *err, size_t cap);

static int fail(k_device *d, const char *what, cudaError_t e) {
    snprintf(d->err, sizeof d->err, "%s: %s", what, cudaGetErrorString(e));
    return -1;
}

static void *cu_alloc(k_device *d, size_t bytes) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e == cudaSuccess) e = cudaMemset(p, 0, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        fail(d, "cudaMalloc", e);
        return NULL;
    }
    return p;
}

static void cu_release(k_device *d, void *p) { cudaFree(p); }

static int cu_upload(k_device *d, void *dst, const void *src, size_t bytes) {
    cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
    return e == cudaSuccess ? 0 : fail(d, "upload", e);
}

static int cu_download(k_device *d, void *dst, const void *src, size_t bytes) {
    cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
    return e == cudaSuccess ? 0 : fail(d, "download", e);
}

static int cu_launch(k_device *d, int id, const uint32_t grid[3], uint32_t tg, const k_binding *b, int nb) {
    return k_cuda_launch(id, grid, tg, b, nb, 0, d->err, sizeof d->err);
}

static int cu_sync(k_device *d) {
    cudaError_t e = cudaDeviceSynchronize();
    return e == cudaSuccess ? 0 : fail(d, "kernel", e);
}

static void cu_close(k_device *d) { free(d); }

extern "C" k_device *k_device_cuda_open(char *err, size_t cap) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        snprintf(err, cap, "no CUDA device: %s", e != cudaSuccess ? cudaGetErrorString(e) : "count 0");
        return NULL;
    }
    k_device *d = (k_device *)calloc(1, sizeof *d);
    if (!d) {
        snprintf(err, cap, "out of memory");
        return NULL;
    }
    d->name = "cuda";
    d->alloc = cu_alloc;
    d->release = cu_release;
    d->upload = cu_upload;
    d->download = cu_download;
    d->launch = cu_launch;
    d->sync = cu_sync;
    d->close = cu_close;
    return d;
}
