/*
 * device.h — what the layer loop (runner.c) needs from a GPU: memory,
 * copies and kernel launches, as a small table of functions. Two
 * implementations: the CUDA one (cuda/device.cu, run on the H200) and the
 * emulator's (gpu/emul/device_emul.c: "device" memory is host memory and a
 * launch is emul_launch, every access checked), so the whole layer loop
 * runs in CI exactly as the GPU runs it, kernel by kernel. A Metal one
 * (metal/, Objective-C) is the same table over MTLBuffers.
 *
 * Device pointers are opaque to the runner except for byte offsets inside
 * an allocation ((char *)p + off), which CUDA, Metal (buffer + offset at
 * bind time) and the emulator all allow. Launches are ordered (one stream
 * / command queue); sync() waits for all of them and reports the first
 * failure. Every entry returns 0 or -1 with the reason in err.
 */
#ifndef K_DEVICE_H
#define K_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "bind.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct k_device k_device;
struct k_device {
    const char *name; /* "cuda", "emul", "metal" */
    void *(*alloc)(k_device *d, size_t bytes); /* zero-filled; NULL on failure (err set) */
    void (*release)(k_device *d, void *p);
    int (*upload)(k_device *d, void *dst, const void *src, size_t bytes);
    int (*download)(k_device *d, void *dst, const void *src, size_t bytes);
    int (*copy)(k_device *d, void *dst, const void *src, size_t bytes); /* device to device, ordered */
    int (*launch)(k_device *d, int id, const uint32_t grid[3], uint32_t tg, const k_binding *b, int nb);
    int (*sync)(k_device *d);
    void (*close)(k_device *d);
    /* Optional (NULL: not offered): the launches and device copies between
     * step_begin and step_end form one step that the device may replay as
     * a whole (CUDA: captured into a graph, updated in place from the last
     * step's and launched once -- no launch gap between small kernels).
     * No upload, download or sync in between; a failure inside a step
     * makes step_end fail. */
    int (*step_begin)(k_device *d);
    int (*step_end)(k_device *d);
    char err[512];
    void *impl;
};

/* The emulator's device (gpu/emul/device_emul.c): schedule EMUL_FORWARD. */
k_device *k_device_emul_open(void);
/* The CUDA device (cuda/device.cu): GPU 0, one stream. NULL if none; the
 * reason in err (cap bytes). */
k_device *k_device_cuda_open(char *err, size_t cap);
/* Which kernels the CUDA host starts early (cuda/host.cu K_CUDA_PDL), in
 * words; call with the device open. */
const char *k_cuda_launch_note(void);
/* With K_CUDA_PROFILE=1 in the environment: print GPU time per kernel
 * (event pairs around each launch) since the last call, then reset. */
void k_cuda_profile_print(const char *label);
/* With K_CUDA_GRAPH=1: print how many steps ran as graphs, and how many of
 * them updated the previous executable graph instead of instantiating one. */
void k_cuda_graph_stats(const char *label);
/* Start (1) or stop (0) the profiler's range: what `ncu --profile-from-start
 * off` profiles (test_gpu_model --bench: the timed decode steps). */
void k_cuda_profiler_range(int on);

#ifdef __cplusplus
}
#endif

#endif
