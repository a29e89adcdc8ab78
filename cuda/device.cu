// device.cu — the CUDA k_device (gpu/host/device.h): cudaMalloc'd memory,
// launches through k_cuda_launch (host.cu: bindings checked against the
// argument tables) on one blocking stream (ordered with the legacy default
// stream that the synchronous uploads and downloads use, so copies and
// launches are ordered without events).
//
// K_CUDA_GRAPH=1: steps (device.h step_begin/step_end; the runner makes one
// eval chunk a step) are captured into a CUDA graph, which updates the
// previous step's executable graph in place (cudaGraphExecUpdate: same
// kernels, new arguments and grids) or, when the shape changed, is
// instantiated anew, then launched once. On a small model the GPU otherwise
// idles between ~500 short kernels per token waiting for the CPU's launches.
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../gpu/host/device.h"

extern "C" int k_cuda_launch(int id, const uint32_t grid[3], uint32_t tg, const k_binding *b, int nb,
                             cudaStream_t stream, char *err, size_t cap);

static cudaStream_t g_stream;

// CUDA graph mode (K_CUDA_GRAPH=1): the executable graph of the last step
// and how it was obtained (printed by k_cuda_graph_stats)
static struct {
    int capturing;
    cudaGraphExec_t exec;
    long steps, updates, instantiations;
} graph;

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

// Profiling (K_CUDA_PROFILE=1): an event pair around every launch, read at
// sync(); GPU time per kernel id accumulates until k_cuda_profile_print.
// The events add no synchronisation, so the steps run as they would.
#define PROF_MAX 8192
#define PROF_IDS 64
static struct {
    int on, n;
    cudaEvent_t ev[2 * PROF_MAX];
    int id[PROF_MAX];
    double ms[PROF_IDS];
    long count[PROF_IDS];
} prof;

static int cu_copy(k_device *d, void *dst, const void *src, size_t bytes) {
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, g_stream);
    return e == cudaSuccess ? 0 : fail(d, "copy", e);
}

static int cu_launch(k_device *d, int id, const uint32_t grid[3], uint32_t tg, const k_binding *b, int nb) {
    const int p = prof.on && prof.n < PROF_MAX && id < PROF_IDS;
    if (p) cudaEventRecord(prof.ev[2 * prof.n], g_stream);
    const int rc = k_cuda_launch(id, grid, tg, b, nb, g_stream, d->err, sizeof d->err);
    if (p && !rc) {
        cudaEventRecord(prof.ev[2 * prof.n + 1], g_stream);
        prof.id[prof.n++] = id;
    }
    return rc;
}

static int cu_sync(k_device *d) {
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) return fail(d, "kernel", e);
    for (int i = 0; i < prof.n; i++) {
        float ms = 0;
        cudaEventElapsedTime(&ms, prof.ev[2 * i], prof.ev[2 * i + 1]);
        prof.ms[prof.id[i]] += ms;
        prof.count[prof.id[i]]++;
    }
    prof.n = 0;
    return 0;
}

// Per kernel: launches, total GPU ms and mean us since the last reset; then reset.
extern "C" void k_cuda_profile_print(const char *label) {
    if (!prof.on) return;
    double total = 0;
    for (int i = 0; i < PROF_IDS; i++) total += prof.ms[i];
    for (int i = 0; i < PROF_IDS; i++)
        if (prof.count[i]) {
            const k_kernel_desc *kd = k_kernel_desc_of(i);
            printf("PROFILE %s kernel=%s launches=%ld gpu_ms=%.3f mean_us=%.2f share=%.1f%%\n", label,
                   kd ? kd->name : "?", prof.count[i], prof.ms[i], 1e3 * prof.ms[i] / prof.count[i],
                   100.0 * prof.ms[i] / (total > 0 ? total : 1));
            prof.ms[i] = 0;
            prof.count[i] = 0;
        }
}

static int cu_step_begin(k_device *d) {
    if (graph.capturing) {  // a step that failed half way: drop its capture
        cudaGraph_t g = NULL;
        cudaStreamEndCapture(g_stream, &g);
        if (g) cudaGraphDestroy(g);
        cudaGetLastError();
        graph.capturing = 0;
    }
    cudaError_t e = cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) return fail(d, "cudaStreamBeginCapture", e);
    graph.capturing = 1;
    return 0;
}

static int cu_step_end(k_device *d) {
    cudaGraph_t g = NULL;
    graph.capturing = 0;
    cudaError_t e = cudaStreamEndCapture(g_stream, &g);
    if (e != cudaSuccess) return fail(d, "cudaStreamEndCapture", e);
    if (graph.exec) {
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate(graph.exec, g, &info) == cudaSuccess) {
            graph.updates++;
        } else {  // another topology (a chunk of other rows, a new split count)
            cudaGetLastError();
            cudaGraphExecDestroy(graph.exec);
            graph.exec = NULL;
        }
    }
    if (!graph.exec) {
        e = cudaGraphInstantiate(&graph.exec, g, 0);
        if (e != cudaSuccess) {
            graph.exec = NULL;
            cudaGraphDestroy(g);
            return fail(d, "cudaGraphInstantiate", e);
        }
        graph.instantiations++;
    }
    cudaGraphDestroy(g);
    graph.steps++;
    e = cudaGraphLaunch(graph.exec, g_stream);
    return e == cudaSuccess ? 0 : fail(d, "cudaGraphLaunch", e);
}

// With K_CUDA_GRAPH=1: steps replayed as graphs, and how many of them
// updated the previous executable graph rather than instantiating one.
extern "C" void k_cuda_graph_stats(const char *label) {
    if (!graph.steps) return;
    printf("GRAPH %s steps=%ld updates=%ld instantiations=%ld\n", label, graph.steps, graph.updates,
           graph.instantiations);
}

// The timed part of a benchmark, for `ncu --profile-from-start off` (a
// no-op without a profiler attached).
extern "C" void k_cuda_profiler_range(int on) {
    cudaDeviceSynchronize();
    if (on)
        cudaProfilerStart();
    else
        cudaProfilerStop();
}

static void cu_close(k_device *d) {
    if (graph.exec) cudaGraphExecDestroy(graph.exec);
    graph.exec = NULL;
    free(d);
}

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
    if (!g_stream) {
        e = cudaStreamCreate(&g_stream);
        if (e != cudaSuccess) {
            snprintf(err, cap, "cudaStreamCreate: %s", cudaGetErrorString(e));
            free(d);
            return NULL;
        }
    }
    if (getenv("K_CUDA_PROFILE") && !prof.on) {
        for (int i = 0; i < 2 * PROF_MAX; i++) cudaEventCreate(&prof.ev[i]);
        prof.on = 1;
    }
    d->name = "cuda";
    d->alloc = cu_alloc;
    d->release = cu_release;
    d->upload = cu_upload;
    d->download = cu_download;
    d->copy = cu_copy;
    d->launch = cu_launch;
    d->sync = cu_sync;
    d->close = cu_close;
    // graphs and per-launch profiling events do not mix: profiling wins
    const char *gm = getenv("K_CUDA_GRAPH");
    if (gm && gm[0] == '1' && !prof.on) {
        d->step_begin = cu_step_begin;
        d->step_end = cu_step_end;
    }
    return d;
}
