/*
 * pool.c — persistent worker threads for the forward pass.
 *
 * A decode step dispatches a few dozen small jobs, so the hand-off has to be
 * cheap: workers spin briefly on the job word before sleeping on a condition
 * variable (a sleeping worker costs a futex wake, tens of µs). Items are
 * claimed dynamically in grains from an atomic counter; that only decides
 * who computes an item, never how, so results do not depend on it.
 *
 * The caller never waits for a worker that has not started. On a shared
 * machine a worker can sit descheduled behind another process for a
 * scheduler tick (~1 ms) per job; if the caller waited for every worker to
 * check in, a decode step of ~50 jobs would take ~50 ms instead of ~1 ms
 * (measured: the demo model fell from 790 to 213 tok/s with 2 threads while
 * one core ran another process). So a worker must JOIN a job before it may
 * touch it, and the caller, once it has run out of items, CLOSES the job and
 * waits only for the workers that joined: a late worker finds the job closed
 * (or a newer one) and skips it. Generation, closed flag and the joined
 * count share one atomic word, so joining and closing cannot interleave.
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

/* The job word: generation << 32 | CLOSED | workers that joined. */
#define JOB_CLOSED (1ull << 31)
#define JOB_JOINED_MASK (JOB_CLOSED - 1)
static inline unsigned job_gen(uint64_t w) { return (unsigned)(w >> 32); }

struct ds4_pool {
    int n_threads;
    pthread_t *threads;
    worker_arg *args;
    int n_started;

    pthread_mutex_t mu;
    pthread_cond_t cv_start, cv_done;
    _Atomic uint64_t job;    /* generation bumped once per job (and once to stop) */
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

/* Join job generation g if it is still open: then its parameters are
 * stable until this worker leaves. */
static int try_join(ds4_pool *p, unsigned g) {
    uint64_t w = atomic_load_explicit(&p->job, memory_order_acquire);
    while (job_gen(w) == g && !(w & JOB_CLOSED))
        if (atomic_compare_exchange_weak_explicit(&p->job, &w, w + 1, memory_order_acq_rel,
                                                  memory_order_acquire))
            return 1;
    return 0;
}

static void *worker_main(void *varg) {
    worker_arg *a = varg;
    ds4_pool *p = a->pool;
    unsigned seen = 0;
    for (;;) {
        unsigned g = job_gen(atomic_load_explicit(&p->job, memory_order_acquire));
        for (int s = 0; g == seen && s < SPIN_ITERS; s++) {
            cpu_relax();
            g = job_gen(atomic_load_explicit(&p->job, memory_order_acquire));
        }
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            while ((g = job_gen(atomic_load_explicit(&p->job, memory_order_acquire))) == seen)
                pthread_cond_wait(&p->cv_start, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        seen = g;
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) break;
        if (!try_join(p, g))
            continue; /* closed already: the caller did (or is doing) its items */
        run_items(p, a->ith);
        uint64_t w = atomic_fetch_sub_explicit(&p->job, 1, memory_order_acq_rel) - 1;
        if ((w & JOB_CLOSED) && (w & JOB_JOINED_MASK) == 0) {
            pthread_mutex_lock(&p->mu); /* the caller may be asleep on cv_done */
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
    atomic_init(&p->job, 0);
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
        atomic_fetch_add_explicit(&p->job, 1ull << 32, memory_order_release);
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
    /* a new generation, open, nobody joined (no worker is inside a job here) */
    uint64_t gen = (uint64_t)job_gen(atomic_load_explicit(&p->job, memory_order_relaxed)) + 1;
    pthread_mutex_lock(&p->mu);
    atomic_store_explicit(&p->job, (gen & 0xffffffffu) << 32, memory_order_release);
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);

    run_items(p, 0);

    /* No items left to claim: close the job, then wait for the joined only. */
    uint64_t w = atomic_fetch_or_explicit(&p->job, JOB_CLOSED, memory_order_acq_rel);
    if ((w & JOB_JOINED_MASK) == 0) return;
    for (int s = 0; s < SPIN_ITERS; s++) {
        if ((atomic_load_explicit(&p->job, memory_order_acquire) & JOB_JOINED_MASK) == 0) return;
        cpu_relax();
    }
    pthread_mutex_lock(&p->mu);
    while ((atomic_load_explicit(&p->job, memory_order_acquire) & JOB_JOINED_MASK) != 0)
        pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

/* ------------------------------------------------------- ds4_pool_check -- */

typedef struct {
    _Atomic int32_t *slot;
    int32_t job;
} check_args;

static void check_fn(void *ctx, int64_t i0, int64_t i1, int ith) {
    (void)ith;
    const check_args *a = ctx;
    for (int64_t i = i0; i < i1; i++) {
        /* exactly once: the slot must still hold the previous job's mark */
        int32_t want = a->job - 1;
        if (!atomic_compare_exchange_strong(&a->slot[i], &want, a->job))
            atomic_store(&a->slot[i], -1000000); /* a second visit (or a stale one) */
    }
}

int ds4_pool_check(int n_threads, int n_jobs, int64_t max_items, ds4_error *err) {
    if (n_jobs < 1 || max_items < 1)
        return ds4_fail(err, DS4_ERR_ARG, "ds4_pool_check: n_jobs and max_items must be >= 1");
    ds4_pool *p;
    int rc = ds4_pool_new(n_threads, &p, err);
    if (rc != DS4_OK) return rc;
    _Atomic int32_t *slot = malloc((size_t)max_items * sizeof *slot);
    if (!slot) {
        ds4_pool_free(p);
        return ds4_fail(err, DS4_ERR_NOMEM, "ds4_pool_check: out of memory");
    }
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    for (int64_t i = 0; i < max_items; i++) atomic_init(&slot[i], 0);
    int64_t prev_n = max_items;
    for (int32_t j = 1; j <= n_jobs && rc == DS4_OK; j++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        int64_t n = 1 + (int64_t)(rng % (uint64_t)max_items);
        /* items this job will not touch carry the previous mark forward */
        for (int64_t i = n; i < prev_n; i++) atomic_store(&slot[i], j - 1);
        for (int64_t i = 0; i < n; i++)
            if (atomic_load(&slot[i]) != j - 1) atomic_store(&slot[i], j - 1);
        check_args a = {slot, j};
        ds4_pool_for(p, n, check_fn, &a);
        for (int64_t i = 0; i < n; i++)
            if (atomic_load(&slot[i]) != j) {
                rc = ds4_fail(err, DS4_ERR_INTERNAL, "pool: job %d item %lld of %lld ran %s", j,
                              (long long)i, (long long)n,
                              atomic_load(&slot[i]) == j - 1 ? "not at all (or after return)"
                                                             : "more than once");
                break;
            }
        prev_n = n;
    }
    free(slot);
    ds4_pool_free(p);
    return rc == DS4_OK ? ds4_ok(err) : rc;
}
