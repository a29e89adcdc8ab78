/*
 * pool.c — persistent worker threads for the forward pass.
 *
 * A decode step dispatches a few dozen small jobs, so the hand-off has to be
 * cheap: workers spin briefly on a generation counter before sleeping on a
 * condition variable (a sleeping worker costs a futex wake, tens of µs).
 * Items are claimed dynamically in grains from an atomic counter; that only
 * decides who computes an item, never how, so results do not depend on it.
 */
#include "pool.h"
#include "error.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

/* Spin iterations before a worker (or the caller waiting for workers) goes
 * to sleep. Short: the machine may be shared, and between a decode step's
 * jobs the caller does only microseconds of serial work. */
#define SPIN_ITERS 2000

typedef struct {
    ds4_pool *pool;
    int ith;
} worker_arg;

struct ds4_pool {
    int n_threads;
    pthread_t *threads;
    worker_arg *args;
    int n_started;

    pthread_mutex_t mu;
    pthread_cond_t cv_start, cv_done;
    atomic_uint gen;         /* bumped once per job (and once to stop) */
    atomic_int pending;      /* workers still running the current job */
    atomic_int stop;

    /* the current job, written before gen is bumped (release) */
    ds4_pool_fn fn;
    void *ctx;
    int64_t n_items, grain;
    atomic_llong next;
};

static void run_items(ds4_pool *p, int ith) {
    for (;;) {
        int64_t i0 = atomic_fetch_add_explicit(&p->next, p->grain, memory_order_relaxed);
        if (i0 >= p->n_items) break;
        int64_t i1 = i0 + p->grain < p->n_items ? i0 + p->grain : p->n_items;
        p->fn(p->ctx, i0, i1, ith);
    }
}

static void *worker_main(void *varg) {
    worker_arg *a = varg;
    ds4_pool *p = a->pool;
    unsigned seen = 0;
    for (;;) {
        unsigned g = atomic_load_explicit(&p->gen, memory_order_acquire);
        for (int s = 0; g == seen && s < SPIN_ITERS; s++) {
            cpu_relax();
            g = atomic_load_explicit(&p->gen, memory_order_acquire);
        }
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen)
                pthread_cond_wait(&p->cv_start, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        seen = g;
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) break;
        run_items(p, a->ith);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

int ds4_pool_new(int n_threads, ds4_pool **out, ds4_error *err) {
    *out = NULL;
    if (n_threads < 1) return ds4_fail(err, DS4_ERR_ARG, "thread count %d must be >= 1", n_threads);
    ds4_pool *p = calloc(1, sizeof *p);
    if (!p) return ds4_fail(err, DS4_ERR_NOMEM, "out of memory for the thread pool");
    p->n_threads = n_threads;
    atomic_init(&p->gen, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->next, 0);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads, sizeof *p->threads);
        p->args = calloc((size_t)n_threads, sizeof *p->args);
        if (!p->threads || !p->args) {
            free(p->threads); free(p->args); free(p);
            return ds4_fail(err, DS4_ERR_NOMEM, "out of memory for the thread pool");
        }
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_start, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    for (int t = 1; t < n_threads; t++) {
        p->args[t].pool = p;
        p->args[t].ith = t;
        if (pthread_create(&p->threads[t], NULL, worker_main, &p->args[t]) != 0) {
            ds4_pool_free(p);
            return ds4_fail(err, DS4_ERR_NOMEM, "could not start worker thread %d of %d", t,
                            n_threads);
        }
        p->n_started = t;
    }
    *out = p;
    return ds4_ok(err);
}

void ds4_pool_free(ds4_pool *p) {
    if (!p) return;
    if (p->n_started > 0) {
        pthread_mutex_lock(&p->mu);
        atomic_store_explicit(&p->stop, 1, memory_order_release);
        atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
        pthread_cond_broadcast(&p->cv_start);
        pthread_mutex_unlock(&p->mu);
        for (int t = 1; t <= p->n_started; t++) pthread_join(p->threads[t], NULL);
    }
    pthread_cond_destroy(&p->cv_done);
    pthread_cond_destroy(&p->cv_start);
    pthread_mutex_destroy(&p->mu);
    free(p->threads);
    free(p->args);
    free(p);
}

int ds4_pool_size(const ds4_pool *p) { return p ? p->n_threads : 1; }

void ds4_pool_for(ds4_pool *p, int64_t n_items, ds4_pool_fn fn, void *ctx) {
    if (n_items <= 0) return;
    if (!p || p->n_threads == 1 || n_items == 1) {
        fn(ctx, 0, n_items, 0);
        return;
    }
    /* Grains of ~1/4 of a fair share: big enough to keep the atomic counter
     * cold, small enough that a thread slowed by a busy core is helped out. */
    int64_t grain = n_items / ((int64_t)p->n_threads * 4);
    p->fn = fn;
    p->ctx = ctx;
    p->n_items = n_items;
    p->grain = grain < 1 ? 1 : grain;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->pending, p->n_threads - 1, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);

    run_items(p, 0);

    for (int s = 0; s < SPIN_ITERS; s++) {
        if (atomic_load_explicit(&p->pending, memory_order_acquire) == 0) return;
        cpu_relax();
    }
    pthread_mutex_lock(&p->mu);
    while (atomic_load_explicit(&p->pending, memory_order_acquire) != 0)
        pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
