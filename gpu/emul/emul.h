/*
 * emul.h — the threadgroup emulator: runs the dialect's kernels compiled as
 * C on the CPU, one threadgroup at a time, its threads as ucontext fibers
 * with real barriers (docs/gpu.md says why fibers).
 *
 * Checks, all reported as a failed launch with a message naming the line:
 *  - every access through K_LD/K_ST lies inside the buffer (or threadgroup
 *    array) its base pointer points into; K_ST never writes a K_IN buffer;
 *  - threadgroup memory: no read of an element never written in this
 *    threadgroup, no two threads touching an element between two barriers
 *    when one of them writes it (a missing barrier);
 *  - device K_OUT buffers: no element written by two threads of a launch;
 *  - barriers: every thread reaches the same K_BARRIER before any passes
 *    (one that exits or waits elsewhere is barrier divergence); SIMD-group
 *    shuffles likewise need all 32 lanes at the same call.
 */
#ifndef K_EMUL_H
#define K_EMUL_H

#include <stddef.h>
#include <stdint.h>

#include "../host/bind.h"

/* Schedules: which thread runs first after each barrier, and which
 * threadgroup first. Results must not depend on it. */
enum { EMUL_FORWARD = 0, EMUL_REVERSE = 1 };

typedef struct {
    int schedule;          /* EMUL_FORWARD / EMUL_REVERSE */
    int skip_host_check;   /* tests only: launch without k_check_bindings, to show
                              the kernels' own tag check */
} emul_options;

/* Run kernel `id` over grid[0] x grid[1] x grid[2] threadgroups of tg_size
 * threads (a multiple of 32, at most 1024), with host buffers as bindings.
 * 0 on success; else -1 and err says what the emulator (or the binding
 * check) found. The status word is the caller's to inspect. */
int emul_launch(int id, const uint32_t grid[3], uint32_t tg_size, const k_binding *b, int nb,
                const emul_options *opt, char *err, size_t cap);

/* ---- used by dialect/emul.h only ---- */
typedef struct {
    uint32_t tid, tg_size;
    uint32_t gid[3], ngroups[3];
} emul_thread_pos;
extern emul_thread_pos emul_pos; /* of the running fiber (one OS thread runs them all) */
void emul_barrier(int line);
float emul_shfl_xor(float v, uint32_t mask, int line);
int emul_shfl_xor_i(int v, uint32_t mask, int line);
int emul_shfl_at_i(int v, uint32_t src, int line);
/* warp-wide int8 MMA, k 16 or 32 (emul.c has the fragment layout); a2, a3
 * and b1 unused at k 16 */
void emul_mma_s8(uint32_t k, const uint32_t a[4], const uint32_t b[2], int32_t c[4], int line);
void *emul_tg_array(int line, size_t elem, size_t n);
void *emul_chk(const void *base, const void *addr, size_t size, int write, int line);
void emul_raise(uint32_t *status, uint32_t bits);

#endif
