/*
 * emul.c — the threadgroup emulator (emul.h): fibers, barriers, SIMD-group
 * shuffles, and the memory checks behind K_LD / K_ST.
 *
 * One OS thread runs everything: a threadgroup's threads are ucontext
 * fibers that run until they block (barrier, shuffle) or finish; the
 * scheduler then releases a barrier when every live thread waits at the
 * same one. Threadgroups run one after the other. Deterministic, so a
 * failure reproduces, and a missing barrier shows as a check failure (the
 * first thread runs ahead through what should have been a barrier and the
 * race shadow sees the next thread touch the same element in the same
 * barrier interval).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* ucontext */
#endif
/* Fibers switch by _setjmp/_longjmp between stacks (see "Switching"),
 * which glibc's fortified longjmp would refuse as a corrupted stack. */
#undef _FORTIFY_SOURCE
#include "emul.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <setjmp.h>
#include <ucontext.h>

#define STACK_BYTES (64 * 1024)
#define MAX_THREADS 1024
#define MAX_REGIONS 16
#define MAX_TG_ARRAYS 8

enum { RUNNING, WAIT_TG, WAIT_SIMD, DONE };
enum { R_IN = K_IN, R_OUT = K_OUT, R_STATUS = K_STATUS, R_PARAMS = K_PARAMS, R_TG = 100 };

typedef struct {
    ucontext_t uc; /* the fiber's start (entered once, by setcontext) */
    jmp_buf jb;    /* where it resumes after a yield */
    int started;
    int state, site, parity;
    char *stack;
} fiber;

typedef struct {
    const char *name;
    char *base;
    size_t bytes;
    int kind;
    int32_t *w_tid, *w_epoch, *r_tid, *r_epoch; /* per byte: threadgroup arrays */
    int32_t *writer;                            /* per byte: K_OUT buffers */
    int line;                                   /* declaration line of a threadgroup array */
} region;

emul_thread_pos emul_pos;

static struct {
    fiber f[MAX_THREADS];
    int n, cur, epoch;
    jmp_buf sched;
    void (*fn)(void *const *);
    void *const *slots;
    region reg[MAX_REGIONS];
    int n_reg, n_dev_reg;
    float xbuf[2][MAX_THREADS]; /* shuffle exchange, double-buffered by parity */
    uint32_t mbuf[2][MAX_THREADS][7]; /* MMA fragments (a0..a3, b0, b1, k), likewise */
    char err[512];
    int n_err;
    uint64_t scratch[4]; /* target of a refused access */
    uint32_t group_linear;
} E;

static void fail(const char *fmt, ...) {
    E.n_err++;
    if (E.n_err > 1) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(E.err, sizeof E.err, fmt, ap);
    va_end(ap);
}

/* Switching: swapcontext saves and restores the signal mask, a system call
 * per switch, which made a model-sized run (gpu/tests/test_gpu_model.c)
 * spend most of its time in the kernel. A fiber is entered once with
 * setcontext (its own stack) and from then on every switch is a
 * _setjmp/_longjmp pair, which saves registers only. */
static void yield_to_scheduler(void) {
    if (!_setjmp(E.f[E.cur].jb)) _longjmp(E.sched, 1);
}

void emul_barrier(int line) {
    fiber *f = &E.f[E.cur];
    f->state = WAIT_TG;
    f->site = line;
    yield_to_scheduler();
}

/* The rendezvous of every shuffle: this lane posts v, waits for its 31
 * partners at this call, then reads what lane `src` of its SIMD-group
 * posted. */
static float shfl_from(float v, uint32_t src, int line) {
    fiber *f = &E.f[E.cur];
    const uint32_t tid = (uint32_t)E.cur;
    E.xbuf[f->parity][tid] = v;
    f->state = WAIT_SIMD;
    f->site = line;
    yield_to_scheduler();
    const float r = E.xbuf[f->parity][(tid & ~31u) | src];
    f->parity ^= 1;
    return r;
}

float emul_shfl_xor(float v, uint32_t mask, int line) {
    if (mask >= 32u) {
        fail("line %d: shuffle mask %u is not below the SIMD width 32", line, mask);
        return v;
    }
    return shfl_from(v, ((uint32_t)E.cur & 31u) ^ mask, line);
}

/* Integers ride the float exchange as bit patterns (memcpy, no float
 * arithmetic touches them, so every bit survives). */
int emul_shfl_xor_i(int v, uint32_t mask, int line) {
    float f;
    memcpy(&f, &v, sizeof f);
    f = emul_shfl_xor(f, mask, line);
    memcpy(&v, &f, sizeof v);
    return v;
}

/* An int from lane src of this SIMD-group (CUDA __shfl_sync, Metal
 * simd_shuffle), its bits carried as emul_shfl_xor_i carries them. */
int emul_shfl_at_i(int v, uint32_t src, int line) {
    if (src >= 32u) {
        fail("line %d: shuffle source lane %u is not below the SIMD width 32", line, src);
        return v;
    }
    float x;
    memcpy(&x, &v, sizeof x);
    x = shfl_from(x, src, line);
    memcpy(&v, &x, sizeof v);
    return v;
}

/* One warp-wide int8 tensor-core product, D = A B + C on a 16 x 8 tile
 * (mma.sync.aligned.m16n8k{16,32}.row.col.s32.s8.s8.s32): every lane
 * hands in its fragments, waits for its 31 partners at this call (like a
 * shuffle), then computes its own 4 outputs from all 32 lanes' fragments.
 * Fragment layout: PTX ISA 9.7.14.5.9, "Matrix Fragments for mma.m16n8k16
 * with integer type" and "... mma.m16n8k32" (.s8: row groupID for a_i,
 * 0 <= i < 4 || 8 <= i < 12, else groupID + 8; col 4 threadID_in_group +
 * (i & 3), + 16 for i >= 8). Cross-checked with llama.cpp
 * ggml-cuda/mma.cuh: tile<16, 8, int>::get_i/get_j is this C layout,
 * tile<8, 8, int> this B layout (int l*4 + lane%4 of column lane/4), and
 * its A tiles for the int8 mma come from load_ldmatrix's ldmatrix.x4
 * (lane l addresses row l%16, ints 4 (l/16)..: register i = rows g / g + 8
 * alternating, ints c then 4 + c), i.e. this A layout. With g = lane >> 2,
 * c = lane & 3:
 *   A (16 x K, row-major, 4 int8 per register): m16n8k16: a0 = row g,
 *     k 4c..4c+3; a1 = row g + 8, same k. m16n8k32: a0 = row g, k 4c..+3;
 *     a1 = row g + 8, k 4c..+3; a2 = row g, k 16 + 4c..+3; a3 = row g + 8,
 *     k 16 + 4c..+3 (byte b of a register is k + b);
 *   B (K x 8, column-major): b0 = k 4c..4c+3 of column g; m16n8k32 also
 *     b1 = k 16 + 4c..+3;
 *   C, D (16 x 8 int32): d0 = (row g, col 2c), d1 = (g, 2c + 1),
 *     d2 = (g + 8, 2c), d3 = (g + 8, 2c + 1).
 * Integer products and sums: exact (int64 here, wrapped to int32 as the
 * hardware's s32 accumulator does; far from reached by our operands). */
static int8_t mma_byte(uint32_t w, uint32_t b) { return (int8_t)(uint8_t)(w >> (8u * b)); }

void emul_mma_s8(uint32_t k, const uint32_t a[4], const uint32_t b[2], int32_t c[4], int line) {
    fiber *f = &E.f[E.cur];
    const uint32_t tid = (uint32_t)E.cur, base = tid & ~31u, lane = tid & 31u;
    uint32_t *m = E.mbuf[f->parity][tid];
    for (int i = 0; i < 4; i++) m[i] = a[i];
    m[4] = b[0], m[5] = b[1], m[6] = k;
    f->state = WAIT_SIMD;
    f->site = line;
    yield_to_scheduler();
    uint32_t(*M)[7] = E.mbuf[f->parity];
    f->parity ^= 1;
    for (uint32_t l = 0; l < 32; l++)
        if (M[base + l][6] != k) {
            fail("line %d: lanes of one SIMD-group call the MMA with K %u and %u", line, k, M[base + l][6]);
            return;
        }
    if (k != 16u && k != 32u) {
        fail("line %d: MMA with K %u (16 or 32)", line, k);
        return;
    }
    const uint32_t g = lane >> 2, cc = lane & 3u;
    for (uint32_t i = 0; i < 4; i++) {
        const uint32_t row = g + 8u * (i >> 1), col = 2u * cc + (i & 1u);
        int64_t s = c[i];
        for (uint32_t kk = 0; kk < k; kk++) {
            const uint32_t hi = kk >> 4, q = (kk & 15u) >> 2, byte = kk & 3u;
            /* A(row, kk): lane (row mod 8) * 4 + q, register (row >= 8) + 2 hi */
            const uint32_t aw = M[base + (row & 7u) * 4u + q][(row >> 3) + 2u * hi];
            /* B(kk, col): lane col * 4 + q, register hi */
            const uint32_t bw = M[base + col * 4u + q][4u + hi];
            s += (int64_t)mma_byte(aw, byte) * (int64_t)mma_byte(bw, byte);
        }
        c[i] = (int32_t)(uint32_t)(uint64_t)s;
    }
}

void emul_raise(uint32_t *status, uint32_t bits) {
    /* status[0] |= bits through the checked path, so a status pointer that
     * is not the status buffer is reported too. */
    uint32_t *s = emul_chk(status, status, 4, 1, 0);
    if (s == (uint32_t *)(void *)E.scratch) return;
    *s |= bits;
}

static region *region_of(const void *p) {
    const char *c = p;
    for (int i = 0; i < E.n_reg; i++)
        if (c >= E.reg[i].base && c < E.reg[i].base + E.reg[i].bytes) return &E.reg[i];
    return NULL;
}

void *emul_tg_array(int line, size_t elem, size_t n) {
    for (int i = E.n_dev_reg; i < E.n_reg; i++)
        if (E.reg[i].line == line) return E.reg[i].base;
    if (E.n_reg == MAX_REGIONS) {
        fail("line %d: more than %d threadgroup arrays", line, MAX_TG_ARRAYS);
        return E.scratch;
    }
    region *r = &E.reg[E.n_reg++];
    memset(r, 0, sizeof *r);
    r->name = "threadgroup array";
    r->bytes = elem * n;
    r->kind = R_TG;
    r->line = line;
    r->base = malloc(r->bytes ? r->bytes : 1);
    r->w_tid = malloc(4 * r->bytes + 4);
    r->w_epoch = malloc(4 * r->bytes + 4);
    r->r_tid = malloc(4 * r->bytes + 4);
    r->r_epoch = malloc(4 * r->bytes + 4);
    /* Poison: a read of an element never written is reported, and would
     * read NaN if it were not. */
    memset(r->base, 0xff, r->bytes);
    for (size_t i = 0; i < r->bytes; i++) r->w_epoch[i] = r->r_epoch[i] = -1;
    return r->base;
}

static void tg_access(region *r, size_t off, size_t size, int write, int line) {
    const int32_t t = E.cur, ep = E.epoch;
    for (size_t b = off; b < off + size; b++) {
        if (write) {
            if (r->w_epoch[b] == ep && r->w_tid[b] != t) {
                fail("line %d: threadgroup array (line %d) byte %zu written by threads %d and %d "
                     "between two barriers (missing barrier?)", line, r->line, b, r->w_tid[b], t);
                return;
            }
            if (r->r_epoch[b] == ep && r->r_tid[b] != t) {
                fail("line %d: thread %d writes threadgroup array (line %d) byte %zu that another "
                     "thread read since the last barrier (missing barrier?)", line, t, r->line, b);
                return;
            }
            r->w_tid[b] = t;
            r->w_epoch[b] = ep;
        } else {
            if (r->w_epoch[b] < 0) {
                fail("line %d: thread %d reads threadgroup array (line %d) byte %zu never written "
                     "in this threadgroup", line, t, r->line, b);
                return;
            }
            if (r->w_epoch[b] == ep && r->w_tid[b] != t) {
                fail("line %d: thread %d reads threadgroup array (line %d) byte %zu written by "
                     "thread %d since the last barrier (missing barrier?)", line, t, r->line, b,
                     r->w_tid[b]);
                return;
            }
            if (r->r_epoch[b] != ep) {
                r->r_epoch[b] = ep;
                r->r_tid[b] = t;
            } else if (r->r_tid[b] != t) {
                r->r_tid[b] = -2; /* several readers */
            }
        }
    }
}

void *emul_chk(const void *base, const void *addr, size_t size, int write, int line) {
    region *r = region_of(base);
    if (!r) {
        fail("line %d: access through a pointer into no bound buffer or threadgroup array", line);
        return E.scratch;
    }
    const char *a = addr;
    if (a < r->base || a + size > r->base + r->bytes) {
        fail("line %d: out of bounds: byte offset %td of %s '%s' (%zu bytes)", line, a - r->base,
             r->kind == R_TG ? "threadgroup array" : "buffer", r->name, r->bytes);
        return E.scratch;
    }
    /* GPUs fault (CUDA) or misbehave on a word access that is not aligned
     * to its size; x86 would not notice, so the emulator does */
    if ((size & (size - 1)) == 0 && (uintptr_t)a % size) {
        fail("line %d: misaligned %zu-byte access at byte offset %td of %s '%s'", line, size, a - r->base,
             r->kind == R_TG ? "threadgroup array" : "buffer", r->name);
        return E.scratch;
    }
    const size_t off = (size_t)(a - r->base);
    if (write && (r->kind == R_IN || r->kind == R_PARAMS)) {
        fail("line %d: write to read-only argument '%s'", line, r->name);
        return E.scratch;
    }
    if (r->kind == R_TG) tg_access(r, off, size, write, line);
    if (write && r->kind == R_OUT) {
        const int32_t who = (int32_t)(E.group_linear * (uint32_t)E.n + (uint32_t)E.cur);
        for (size_t b = off; b < off + size; b++) {
            if (r->writer[b] >= 0 && r->writer[b] != who) {
                fail("line %d: byte %zu of output '%s' written by two threads (global %d and %d)",
                     line, b, r->name, r->writer[b], who);
                return E.scratch;
            }
            r->writer[b] = who;
        }
    }
    return (void *)a;
}

static void trampoline(void) {
    E.fn(E.slots);
    E.f[E.cur].state = DONE;
    _longjmp(E.sched, 1); /* never returns: the fiber's stack is abandoned */
}

static void free_tg_regions(void) {
    for (int i = E.n_dev_reg; i < E.n_reg; i++) {
        free(E.reg[i].base);
        free(E.reg[i].w_tid);
        free(E.reg[i].w_epoch);
        free(E.reg[i].r_tid);
        free(E.reg[i].r_epoch);
    }
    E.n_reg = E.n_dev_reg;
}

/* Run fiber i until it yields or finishes. A function of its own so that
 * nothing of the caller's frame lives across the _setjmp (no clobbering). */
static __attribute__((noinline)) void resume(int i) {
    if (!_setjmp(E.sched)) {
        if (!E.f[i].started) {
            E.f[i].started = 1;
            setcontext(&E.f[i].uc);
        }
        _longjmp(E.f[i].jb, 1);
    }
}

/* Run one threadgroup to completion; 0 or -1 (E.err set). */
static int run_group(int schedule) {
    E.epoch = 0;
    for (int i = 0; i < E.n; i++) {
        fiber *f = &E.f[i];
        getcontext(&f->uc);
        f->uc.uc_stack.ss_sp = f->stack;
        f->uc.uc_stack.ss_size = STACK_BYTES;
        f->uc.uc_link = NULL;
        makecontext(&f->uc, trampoline, 0);
        f->started = 0;
        f->state = RUNNING;
        f->parity = 0;
        f->site = 0;
    }
    for (;;) {
        for (int k = 0; k < E.n; k++) {
            const int i = schedule == EMUL_REVERSE ? E.n - 1 - k : k;
            while (E.f[i].state == RUNNING) {
                E.cur = i;
                emul_pos.tid = (uint32_t)i;
                resume(i);
                if (E.n_err) return -1;
            }
        }
        /* Everyone is blocked or done: release SIMD-groups whose 32 lanes
         * all wait at the same shuffle, else a threadgroup barrier. */
        int released = 0, n_done = 0, n_tg = 0, n_simd = 0, tg_site = -1;
        for (int s = 0; s < E.n / 32; s++) {
            int all = 1;
            for (int l = 0; l < 32; l++) {
                const fiber *f = &E.f[s * 32 + l];
                if (f->state != WAIT_SIMD || f->site != E.f[s * 32].site) all = 0;
            }
            if (all) {
                for (int l = 0; l < 32; l++) E.f[s * 32 + l].state = RUNNING;
                released = 1;
            }
        }
        if (released) continue;
        for (int i = 0; i < E.n; i++) {
            const fiber *f = &E.f[i];
            if (f->state == DONE) n_done++;
            if (f->state == WAIT_SIMD) n_simd++;
            if (f->state == WAIT_TG) {
                if (tg_site >= 0 && f->site != tg_site) {
                    fail("barrier divergence: threads wait at barriers on lines %d and %d",
                         tg_site, f->site);
                    return -1;
                }
                tg_site = f->site, n_tg++;
            }
        }
        if (n_done == E.n) return 0;
        if (n_simd) {
            for (int i = 0; i < E.n; i++)
                if (E.f[i].state == WAIT_SIMD) {
                    fail("SIMD divergence: lane %d of SIMD-group %d waits at the shuffle on line %d "
                         "while other lanes of its group are elsewhere or done", i % 32, i / 32,
                         E.f[i].site);
                    break;
                }
            return -1;
        }
        if (n_done) {
            fail("barrier divergence: %d threads wait at the barrier on line %d, %d have exited",
                 n_tg, tg_site, n_done);
            return -1;
        }
        for (int i = 0; i < E.n; i++) E.f[i].state = RUNNING;
        E.epoch++;
    }
}

typedef struct {
    int id;
    void (*fn)(void *const *);
} kernel_entry;

#define DECL_(id, K) void k_emul_##K(void *const *);
K_KERNEL_LIST(DECL_)
#define ENTRY_(id, K) {id, k_emul_##K},
static const kernel_entry kernels[] = {K_KERNEL_LIST(ENTRY_)};

int emul_launch(int id, const uint32_t grid[3], uint32_t tg_size, const k_binding *b, int nb,
                const emul_options *opt, char *err, size_t cap) {
    static const emul_options defaults = {EMUL_FORWARD, 0};
    if (!opt) opt = &defaults;
    const k_kernel_desc *d = k_kernel_desc_of(id);
    void (*fn)(void *const *) = NULL;
    for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; i++)
        if (kernels[i].id == id) fn = kernels[i].fn;
    if (!d || !fn) {
        snprintf(err, cap, "no kernel with id %d", id);
        return -1;
    }
    if (tg_size == 0 || tg_size % 32 || tg_size > MAX_THREADS) {
        snprintf(err, cap, "kernel %s: threadgroup size %u is not a multiple of 32 in 32..%d",
                 d->name, tg_size, MAX_THREADS);
        return -1;
    }
    if (!opt->skip_host_check && k_check_bindings(d, b, nb, err, cap)) return -1;
    void *slots[32] = {0};
    memset(&E.reg, 0, sizeof E.reg);
    E.n_reg = 0;
    for (int i = 0; i < nb && i < 32; i++) {
        if (b[i].slot < 0 || b[i].slot >= d->n_args || E.n_reg == MAX_REGIONS - MAX_TG_ARRAYS)
            continue;
        slots[b[i].slot] = b[i].ptr;
        region *r = &E.reg[E.n_reg++];
        r->name = d->args[b[i].slot].name;
        r->base = b[i].ptr;
        r->bytes = b[i].bytes;
        r->kind = d->args[b[i].slot].kind;
        if (r->kind == R_OUT) {
            r->writer = malloc(4 * r->bytes + 4);
            for (size_t k = 0; k < r->bytes; k++) r->writer[k] = -1;
        }
    }
    for (int s = 0; s < d->n_args; s++)
        if (!slots[s]) {
            snprintf(err, cap, "kernel %s: slot %d (%s) not bound", d->name, s, d->args[s].name);
            for (int i = 0; i < E.n_reg; i++) free(E.reg[i].writer);
            return -1;
        }
    E.n_dev_reg = E.n_reg;
    E.n = (int)tg_size;
    E.fn = fn;
    E.slots = slots;
    E.n_err = 0;
    E.err[0] = 0;
    for (int i = 0; i < E.n; i++)
        if (!E.f[i].stack) E.f[i].stack = malloc(STACK_BYTES);
    emul_pos.tg_size = tg_size;
    for (int a = 0; a < 3; a++) emul_pos.ngroups[a] = grid[a] ? grid[a] : 1;
    const uint64_t n_groups = (uint64_t)emul_pos.ngroups[0] * emul_pos.ngroups[1] * emul_pos.ngroups[2];
    int rc = 0;
    for (uint64_t k = 0; k < n_groups && !rc; k++) {
        const uint64_t g = opt->schedule == EMUL_REVERSE ? n_groups - 1 - k : k;
        emul_pos.gid[0] = (uint32_t)(g % emul_pos.ngroups[0]);
        emul_pos.gid[1] = (uint32_t)(g / emul_pos.ngroups[0] % emul_pos.ngroups[1]);
        emul_pos.gid[2] = (uint32_t)(g / emul_pos.ngroups[0] / emul_pos.ngroups[1]);
        E.group_linear = (uint32_t)g;
        rc = run_group(opt->schedule);
        free_tg_regions();
        if (rc) snprintf(err, cap, "kernel %s, threadgroup (%u,%u,%u): %s", d->name,
                         emul_pos.gid[0], emul_pos.gid[1], emul_pos.gid[2], E.err);
    }
    for (int i = 0; i < E.n_dev_reg; i++) free(E.reg[i].writer);
    E.n_reg = E.n_dev_reg = 0;
    return rc;
}
