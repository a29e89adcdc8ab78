// host.cu — the CUDA host: launches the shared kernels (cuda/kernels.cu)
// through the argument tables (gpu/kernels/table.h). Mirrors metal/host.m
// function for function. Built by `make cuda`; compiled here, RUN ONLY on the
// GPU machine (docs/gpu.md, "What is tested where").
//
// k_cuda_launch_host has emul_launch's signature: host buffers in, results
// copied back, the status word checked. The emulator's test harness
// (gpu/tests/test_gpu_emul.c, built with -DK_TEST_CUDA by `make cuda-test`)
// then runs the same checks on the GPU.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../gpu/dialect/cuda.h"
#include "../gpu/host/bind.h"

#define DECLARE_(id, K) K_KERNEL(K);
K_KERNEL_LIST(DECLARE_)

typedef struct {
    int id;
    const void *fn;
} cuda_kernel;
#define ENTRY_(id, K) {id, (const void *)k_##K},
static const cuda_kernel kernels[] = {K_KERNEL_LIST(ENTRY_)};

static const void *kernel_fn(int id) {
    for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; i++)
        if (kernels[i].id == id) return kernels[i].fn;
    return NULL;
}

// Programmatic dependent launch (sm_90): a kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization may be scheduled as soon
// as every threadgroup of the kernel before it has started (K_CHECK_TAG's
// K_DEP_LAUNCH), so its launch and ramp overlap that kernel's tail; it reads
// and writes nothing a kernel writes before its K_DEP_WAIT (gpu/dialect/
// common.h), which returns once the kernel before has completed and its
// memory is visible. So the bits cannot change: on an H100 (session 24) the
// golden dense and MoE, demo and 0.8B / 27B-like / MoE bench models wrote
// cmp-identical prefill, decode and greedy outputs with modes 0, 1 and 2
// against the build without it. The matvecs go further (K_CHECK_TAG_EARLY):
// their first weight loads are issued before the wait.
//
// K_CUDA_PDL picks the kernels launched early:
//   0  none
//   1  the matvecs (the default): decode +10-11% / +7-8% / +7% on the 0.8B Q8_0 /
//      27B-like / MoE bench shapes (H100, 2-3 repetitions interleaved)
//   2  every kernel: +15-16% / +4-4.5% / +3-3.5% on the same runs (better for the 0.8B's
//      short kernels, worse for the big shapes: cause not measured)
//   3  every kernel but the one right after a matvec (session 25, H100: the same
//      as 1 on the 0.8B Q8_0 and 27B-like shapes, docs/gpu.md section 4; the
//      bits are safe by the argument above)
// Only where the GPU is sm_90 or later AND the kernels were compiled for it
// (a kernel built for an older arch has no K_DEP_WAIT: starting it early
// would race).
#ifndef K_CUDA_PDL_DEFAULT
#define K_CUDA_PDL_DEFAULT 1
#endif
static int pdl_supported(void) {
#ifdef K_CUDA_NO_PDL
    return 0;
#else
    int dev = 0, major = 0;
    cudaFuncAttributes a;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaFuncGetAttributes(&a, kernel_fn(K_ID_matvec_kq1)) != cudaSuccess) {
        cudaGetLastError(); /* a failed query: no early starts, and no sticky error left behind */
        return 0;
    }
    return major >= 9 && a.ptxVersion >= 90 && a.binaryVersion >= 90;
#endif
}

static int pdl_want = -1, pdl_mode = -1; /* K_CUDA_PDL (or the default), and what runs */
static int early_mode(void) {
    if (pdl_mode < 0) {
        const char *e = getenv("K_CUDA_PDL");
        pdl_want = e && *e ? atoi(e) : K_CUDA_PDL_DEFAULT;
        pdl_mode = pdl_want > 0 && pdl_supported() ? pdl_want : 0;
    }
    return pdl_mode;
}

// Which kernels start early, in words (DS4PY_PATHS=1 prints it, so a gate
// that silently turned it off shows): the device must be open.
extern "C" const char *k_cuda_launch_note(void) {
    switch (early_mode()) {
    case 0:
        return pdl_want > 0 ? "no early launches (programmatic dependent launch needs an sm_90+ GPU and kernels built for it)"
                            : "no early launches (K_CUDA_PDL=0)";
    case 1: return "programmatic dependent launch: the matvecs start early (K_CUDA_PDL=1, the default)";
    case 2: return "programmatic dependent launch: every kernel starts early (K_CUDA_PDL=2)";
    case 3: return "programmatic dependent launch: every kernel but the one after a matvec starts early (K_CUDA_PDL=3)";
    default: return "programmatic dependent launch: the matvecs start early (K_CUDA_PDL past 3 acts as 1)";
    }
}

static int early_start(int id) {
    const int mode = early_mode();
    static int prev_mv = 0;
    const int mv = id == K_ID_matvec_q8_0 || id == K_ID_matvec_kq1 || id == K_ID_matvec_kq4 || id == K_ID_matvec_kq;
    const int prev = prev_mv;
    prev_mv = mv;
    if (mode == 2) return 1;
    if (mode == 3) return mv || !prev; /* every kernel but one right after a matvec */
    return mode && mv; /* 1, and any other positive value */
}

static int cuda_fail(char *err, size_t cap, const char *what, cudaError_t e) {
    snprintf(err, cap, "%s: %s", what, cudaGetErrorString(e));
    return -1;
}

// Launch kernel `id` with DEVICE pointers in b[].ptr (the params slot holds
// a host pointer to the params struct, passed by value). status_dev is the
// backend's status word (slot 0 must be bound to it).
extern "C" int k_cuda_launch(int id, const uint32_t grid[3], uint32_t tg, const k_binding *b, int nb,
                             cudaStream_t stream, char *err, size_t cap) {
    const k_kernel_desc *d = k_kernel_desc_of(id);
    const void *fn = kernel_fn(id);
    if (!d || !fn) {
        snprintf(err, cap, "no kernel with id %d", id);
        return -1;
    }
    if (k_check_bindings(d, b, nb, err, cap)) return -1;
    if (tg == 0 || tg % 32 || tg > 1024) {
        snprintf(err, cap, "kernel %s: threadgroup size %u", d->name, tg);
        return -1;
    }
    void *ptrs[32];
    void *args[33];
    for (int i = 0; i < nb; i++) {
        ptrs[b[i].slot] = b[i].ptr;
        // params by value: cudaLaunchKernel copies *args[slot]
        args[b[i].slot] = d->args[b[i].slot].kind == K_PARAMS ? b[i].ptr : (void *)&ptrs[b[i].slot];
    }
    int nargs = d->n_args;
    args[d->n_args] = &nargs;
    const dim3 g(grid[0] ? grid[0] : 1, grid[1] ? grid[1] : 1, grid[2] ? grid[2] : 1);
    cudaError_t e;
    if (early_start(id)) {
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = g, cfg.blockDim = dim3(tg), cfg.dynamicSmemBytes = 0, cfg.stream = stream;
        cfg.attrs = at, cfg.numAttrs = 1;
        e = cudaLaunchKernelExC(&cfg, fn, args);
    } else {
        e = cudaLaunchKernel(fn, g, dim3(tg), args, 0, stream);
    }
    if (e != cudaSuccess) return cuda_fail(err, cap, d->name, e);
    return 0;
}

// The emulator's signature over host buffers (tests): copy every buffer to
// the device, launch, copy K_OUT and the status back.
extern "C" int k_cuda_launch_host(int id, const uint32_t grid[3], uint32_t tg, const k_binding *b, int nb,
                                  const void *unused_opt, char *err, size_t cap) {
    const k_kernel_desc *d = k_kernel_desc_of(id);
    if (!d) {
        snprintf(err, cap, "no kernel with id %d", id);
        return -1;
    }
    if (k_check_bindings(d, b, nb, err, cap)) return -1;
    k_binding db[32];
    int rc = 0;
    for (int i = 0; i < nb; i++) {
        db[i] = b[i];
        if (d->args[b[i].slot].kind == K_PARAMS) continue;
        void *p = NULL;
        cudaError_t e = cudaMalloc(&p, b[i].bytes);
        if (e == cudaSuccess) e = cudaMemcpy(p, b[i].ptr, b[i].bytes, cudaMemcpyHostToDevice);
        if (e != cudaSuccess) {
            rc = cuda_fail(err, cap, "upload", e);
            nb = i;
            break;
        }
        db[i].ptr = p;
    }
    if (!rc) rc = k_cuda_launch(id, grid, tg, db, nb, 0, err, cap);
    if (!rc) {
        cudaError_t e = cudaDeviceSynchronize();
        if (e != cudaSuccess) rc = cuda_fail(err, cap, d->name, e);
    }
    for (int i = 0; i < nb; i++) {
        const int kind = d->args[b[i].slot].kind;
        if (kind == K_PARAMS) continue;
        if (!rc && (kind == K_OUT || kind == K_STATUS)) {
            cudaError_t e = cudaMemcpy(b[i].ptr, db[i].ptr, b[i].bytes, cudaMemcpyDeviceToHost);
            if (e != cudaSuccess) rc = cuda_fail(err, cap, "download", e);
        }
        cudaFree(db[i].ptr);
    }
    return rc;
}
