/*
 * membw.c — this machine's memory bandwidth, measured with the forward
 * pass's own thread pool: the yardstick the CPU benchmark (bench/bench_cpu.py)
 * divides bytes per token by. STREAM-like (McCalpin's kernels): "read" streams
 * one array (an XOR reduction), "triad" is a[i] = b[i] + s*c[i]; each thread works on its own
 * contiguous slice, the buffers are touched once before timing (page faults
 * are not bandwidth) and the best of `reps` passes is reported, as STREAM
 * does.
 */
#include "ds4.h"
#include "error.h"
#include "pool.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

typedef struct {
    float *a, *b, *c;
    int64_t n, n_items;
    int kind;
    double sink[64]; /* per item: keeps the read loop from being optimised away */
} bw_ctx;

static void bw_items(void *vctx, int64_t i0, int64_t i1, int ith) {
    (void)ith;
    bw_ctx *c = vctx;
    for (int64_t it = i0; it < i1; it++) {
        const int64_t lo = c->n * it / c->n_items, hi = c->n * (it + 1) / c->n_items;
        if (c->kind == DS4_MEMBW_READ) {
            /* XOR of 16-byte words into 4 independent accumulators: integer
             * work the core does at 2 loads per cycle, so the loop is bound
             * by memory, not by float-add latency (a float sum without
             * reassociation measured ~30% low). */
            const uint8_t *b = (const uint8_t *)(c->b + lo);
            const int64_t nbytes = (hi - lo) * (int64_t)sizeof(float);
            uint64_t t = 0;
            int64_t i = 0;
#if defined(__SSE2__)
            __m128i x0 = _mm_setzero_si128(), x1 = x0, x2 = x0, x3 = x0;
            for (; i + 64 <= nbytes; i += 64) {
                x0 = _mm_xor_si128(x0, _mm_loadu_si128((const __m128i *)(b + i)));
                x1 = _mm_xor_si128(x1, _mm_loadu_si128((const __m128i *)(b + i + 16)));
                x2 = _mm_xor_si128(x2, _mm_loadu_si128((const __m128i *)(b + i + 32)));
                x3 = _mm_xor_si128(x3, _mm_loadu_si128((const __m128i *)(b + i + 48)));
            }
            x0 = _mm_xor_si128(_mm_xor_si128(x0, x1), _mm_xor_si128(x2, x3));
            uint64_t w[2];
            memcpy(w, &x0, 16);
            t = w[0] ^ w[1];
#endif
            for (; i + 8 <= nbytes; i += 8) {
                uint64_t v;
                memcpy(&v, b + i, 8);
                t ^= v;
            }
            c->sink[it % 64] += (double)(t & 0xFF);
        } else {
            const float k = 3.0f;
            for (int64_t i = lo; i < hi; i++) c->a[i] = c->b[i] + k * c->c[i];
        }
    }
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int ds4_membw(int n_threads, int kind, size_t bytes, int reps, double *gbps, ds4_error *err) {
    if (!gbps) return ds4_fail(err, DS4_ERR_ARG, "ds4_membw: gbps is NULL");
    if (kind != DS4_MEMBW_READ && kind != DS4_MEMBW_TRIAD)
        return ds4_fail(err, DS4_ERR_ARG, "ds4_membw: unknown kind %d", kind);
    if (reps < 1 || bytes < 4096)
        return ds4_fail(err, DS4_ERR_ARG, "ds4_membw: need reps >= 1 and bytes >= 4096");
    ds4_pool *pool;
    int rc = ds4_pool_new(n_threads, &pool, err);
    if (rc) return rc;
    bw_ctx c;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    c.n = (int64_t)(bytes / sizeof(float));
    c.n_items = (int64_t)n_threads;
    c.b = malloc((size_t)c.n * sizeof(float));
    if (kind == DS4_MEMBW_TRIAD) {
        c.a = malloc((size_t)c.n * sizeof(float));
        c.c = malloc((size_t)c.n * sizeof(float));
    }
    if (!c.b || (kind == DS4_MEMBW_TRIAD && (!c.a || !c.c))) {
        free(c.a); free(c.b); free(c.c);
        ds4_pool_free(pool);
        return ds4_fail(err, DS4_ERR_NOMEM, "ds4_membw: cannot allocate %zu bytes", bytes);
    }
    /* first touch (page faults) outside the timing */
    for (int64_t i = 0; i < c.n; i++) c.b[i] = (float)(i & 7);
    if (c.a) {
        memset(c.a, 0, (size_t)c.n * sizeof(float));
        memcpy(c.c, c.b, (size_t)c.n * sizeof(float));
    }
    /* bytes moved per pass: triad reads b and c and writes a (STREAM counts
     * 3 arrays; the write-allocate read is not counted, as in STREAM) */
    const double moved = (double)c.n * sizeof(float) * (kind == DS4_MEMBW_TRIAD ? 3.0 : 1.0);
    double best = 0.0;
    for (int r = 0; r < reps; r++) {
        const double t0 = now_s();
        ds4_pool_for(pool, c.n_items, bw_items, &c);
        const double dt = now_s() - t0;
        if (dt > 0 && moved / dt / 1e9 > best) best = moved / dt / 1e9;
    }
    free(c.a); free(c.b); free(c.c);
    ds4_pool_free(pool);
    *gbps = best;
    return ds4_ok(err);
}
