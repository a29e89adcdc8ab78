/*
 * pool.h — internal: a small persistent pthread pool.
 *
 * ds4_pool_for() splits n_items independent work items among the threads
 * and returns when all are done. Which thread runs an item is not fixed, so
 * a caller keeps results bit-identical for any thread count by computing
 * every output element entirely inside one item (never summing partial
 * results across items in thread order). `ith` (0 = the calling thread)
 * only selects per-thread scratch.
 *
 * One ds4_pool_for at a time per pool; fn must not call ds4_pool_for on the
 * same pool.
 */
#ifndef DS4_POOL_H
#define DS4_POOL_H

#include <stdint.h>

#include "ds4.h"

typedef struct ds4_pool ds4_pool;

/* Run items [i0, i1) on thread ith. */
typedef void (*ds4_pool_fn)(void *ctx, int64_t i0, int64_t i1, int ith);

/* n_threads >= 1 (1: everything runs on the caller, no threads started). */
int ds4_pool_new(int n_threads, ds4_pool **out, ds4_error *err);
void ds4_pool_free(ds4_pool *p);
int ds4_pool_size(const ds4_pool *p);
void ds4_pool_for(ds4_pool *p, int64_t n_items, ds4_pool_fn fn, void *ctx);

#endif
