/*
 * kv.c — KV cache pages of the attention layers.
 *
 * Pages of DS4_KV_PAGE positions are allocated as the context grows (a
 * session that only ever sees short prompts never pays for n_ctx), never
 * during a chunk: ds4_fwd_reserve runs before any state changes, so an
 * allocation failure leaves the session as it was.
 *
 * Pages are reference counted so snapshots (session.c) can share them with
 * the session instead of copying the cache: a snapshot of a 100k-token
 * session costs a page table, not gigabytes. A shared page is read-only;
 * the writer copies it first (copy-on-write, ds4_kv_layer_reserve). Since
 * positions only grow, the only page a session ever writes after a
 * snapshot is the one holding its next position: one copy per K/V page of
 * each attention layer per snapshot taken mid-page, made by the first
 * write after the snapshot. That is the only allocation snapshots add to
 * the decode path (DESIGN.md invariant 5 is about steady-state decoding;
 * taking a snapshot is not a per-token event).
 *
 * The reference count lives in a header in front of the page data, so a
 * page travels as one plain pointer (attention.c indexes the data) and can
 * be shared between sessions of the same model and freed by whichever
 * holder is last. It is atomic because sessions (and the snapshots they
 * share pages with) may be used from different threads.
 */
#include "forward.h"
#include "../error.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    atomic_long refs;
} page_header;

_Static_assert(sizeof(page_header) <= DS4_KV_PAGE_HEADER, "page header too large");

/* Pages alive in the process (ds4_kv_live_pages): tests check that
 * sessions and snapshots give back every page they took. */
static atomic_long live_pages;

static page_header *header_of(const uint8_t *page) {
    return (page_header *)(void *)(page - DS4_KV_PAGE_HEADER);
}

size_t ds4_kv_page_bytes(const ds4_fwd *f) {
    return (size_t)f->c.n_head_kv * DS4_KV_PAGE * (size_t)f->c.head_dim * f->kv_elem_bytes;
}

/* Header plus data in one counted allocation; the data starts
 * DS4_KV_PAGE_HEADER bytes in, which keeps malloc's alignment. */
static uint8_t *page_alloc(ds4_fwd *f, int zero) {
    const size_t n = DS4_KV_PAGE_HEADER + ds4_kv_page_bytes(f);
    uint8_t *raw = zero ? ds4_fwd_calloc(f, 1, n) : ds4_fwd_malloc(f, n);
    if (!raw) return NULL;
    atomic_init(&((page_header *)(void *)raw)->refs, 1);
    atomic_fetch_add_explicit(&live_pages, 1, memory_order_relaxed);
    return raw + DS4_KV_PAGE_HEADER;
}

uint8_t *ds4_kv_page_new(ds4_fwd *f) {
    /* calloc: a page's unused tail is never read (attention stops at the
     * row's position), but zeroed memory keeps any future bug
     * deterministic. */
    return page_alloc(f, 1);
}

void ds4_kv_page_ref(uint8_t *page) {
    atomic_fetch_add_explicit(&header_of(page)->refs, 1, memory_order_relaxed);
}

void ds4_kv_page_unref(uint8_t *page) {
    if (!page) return;
    /* acq_rel: the freeing holder must see every other holder's reads as
     * finished (the usual reference-count ordering). */
    if (atomic_fetch_sub_explicit(&header_of(page)->refs, 1, memory_order_acq_rel) == 1) {
        free(header_of(page));
        atomic_fetch_sub_explicit(&live_pages, 1, memory_order_relaxed);
    }
}

int64_t ds4_kv_live_pages(void) {
    return (int64_t)atomic_load_explicit(&live_pages, memory_order_relaxed);
}

int ds4_kv_page_shared(const uint8_t *page) {
    return atomic_load_explicit(&header_of(page)->refs, memory_order_acquire) > 1;
}

int ds4_kv_layer_init(ds4_fwd *f, ds4_kv_layer *kvl, ds4_error *err) {
    kvl->n_pages = 0;
    kvl->k = ds4_fwd_calloc(f, (size_t)(f->n_pages_max ? f->n_pages_max : 1), sizeof *kvl->k);
    kvl->v = ds4_fwd_calloc(f, (size_t)(f->n_pages_max ? f->n_pages_max : 1), sizeof *kvl->v);
    if (!kvl->k || !kvl->v) {
        free(kvl->k);
        free(kvl->v);
        kvl->k = kvl->v = NULL;
        return ds4_fail(err, DS4_ERR_NOMEM, "out of memory for a KV page table");
    }
    return ds4_ok(err);
}

void ds4_kv_layer_truncate(ds4_kv_layer *kvl, int64_t n_keep) {
    if (n_keep < 0) n_keep = 0;
    while (kvl->n_pages > n_keep) {
        kvl->n_pages--;
        ds4_kv_page_unref(kvl->k[kvl->n_pages]);
        ds4_kv_page_unref(kvl->v[kvl->n_pages]);
        kvl->k[kvl->n_pages] = kvl->v[kvl->n_pages] = NULL;
    }
}

void ds4_kv_layer_free(ds4_kv_layer *kvl) {
    if (kvl->k && kvl->v) ds4_kv_layer_truncate(kvl, 0);
    free(kvl->k);
    free(kvl->v);
    kvl->k = kvl->v = NULL;
    kvl->n_pages = 0;
}

int ds4_kv_init(ds4_fwd *f, ds4_error *err) {
    f->n_pages_max = ds4_kv_pages_for(f->n_ctx);
    for (int64_t il = 0; il < f->c.n_main; il++) {
        if (f->m->layers[il].kind != DS4_LAYER_ATTN) continue;
        if (ds4_kv_layer_init(f, &f->kv[il], err))
            return ds4_fail(err, DS4_ERR_NOMEM, "out of memory for the KV page table of layer %lld",
                            (long long)il);
    }
    return ds4_ok(err);
}

void ds4_kv_free(ds4_fwd *f) {
    if (!f->kv) return;
    for (int64_t il = 0; il < f->c.n_main; il++) ds4_kv_layer_free(&f->kv[il]);
}

/* Replace *slot, a shared page, by a private copy. */
static int make_own(ds4_fwd *f, uint8_t **slot) {
    uint8_t *cp = page_alloc(f, 0);
    if (!cp) return DS4_ERR_NOMEM;
    /* The whole page, tail included: the copy must read like the original
     * everywhere (the tail is never read, see ds4_kv_page_new). */
    memcpy(cp, *slot, ds4_kv_page_bytes(f));
    ds4_kv_page_unref(*slot);
    *slot = cp;
    return DS4_OK;
}

int ds4_kv_layer_reserve(ds4_fwd *f, ds4_kv_layer *kvl, int64_t w0, int64_t n_pos,
                         ds4_error *err) {
    const int64_t need = ds4_kv_pages_for(n_pos);
    if (need > f->n_pages_max)
        return ds4_fail(err, DS4_ERR_ARG, "%lld positions exceed n_ctx %lld", (long long)n_pos,
                        (long long)f->n_ctx);
    const size_t pb = ds4_kv_page_bytes(f);
    for (int64_t p = w0 < 0 ? 0 : w0 / DS4_KV_PAGE; p < kvl->n_pages && p < need; p++) {
        if ((ds4_kv_page_shared(kvl->k[p]) && make_own(f, &kvl->k[p])) ||
            (ds4_kv_page_shared(kvl->v[p]) && make_own(f, &kvl->v[p])))
            return ds4_fail(err, DS4_ERR_NOMEM, "out of memory to copy shared KV page %lld (%zu bytes)",
                            (long long)p, pb);
    }
    while (kvl->n_pages < need) {
        uint8_t *k = ds4_kv_page_new(f), *v = ds4_kv_page_new(f);
        if (!k || !v) {
            ds4_kv_page_unref(k);
            ds4_kv_page_unref(v);
            return ds4_fail(err, DS4_ERR_NOMEM, "out of memory for KV page %lld (%zu bytes)",
                            (long long)kvl->n_pages, 2 * (pb + DS4_KV_PAGE_HEADER));
        }
        kvl->k[kvl->n_pages] = k;
        kvl->v[kvl->n_pages] = v;
        kvl->n_pages++;
    }
    return ds4_ok(err);
}

int ds4_kv_parts_reserve(ds4_fwd *f, int64_t n_pos, ds4_error *err) {
    const int64_t need = ds4_kv_pages_for(n_pos);
    /* Decode split-K keeps one partial per (head, block) of the row. */
    if (need > f->attn_part_pages) {
        size_t nf = (size_t)(f->c.n_head * need * (2 + f->c.head_dim));
        float *p = ds4_fwd_realloc(f, f->attn_part, (nf ? nf : 1) * sizeof(float));
        if (!p)
            return ds4_fail(err, DS4_ERR_NOMEM, "out of memory for %lld attention partials",
                            (long long)need);
        f->attn_part = p;
        f->attn_part_pages = need;
    }
    return ds4_ok(err);
}

int ds4_fwd_reserve(ds4_fwd *f, int64_t w0, int64_t n_pos, ds4_error *err) {
    if (ds4_kv_pages_for(n_pos) > f->n_pages_max)
        return ds4_fail(err, DS4_ERR_ARG, "%lld positions exceed n_ctx %lld", (long long)n_pos,
                        (long long)f->n_ctx);
    int rc = ds4_kv_parts_reserve(f, n_pos, err);
    if (rc) return rc;
    for (int64_t il = 0; il < f->c.n_main; il++) {
        if (f->m->layers[il].kind != DS4_LAYER_ATTN) continue;
        if ((rc = ds4_kv_layer_reserve(f, &f->kv[il], w0, n_pos, err))) {
            char msg[sizeof err->message];
            snprintf(msg, sizeof msg, "%s", err ? err->message : "");
            return ds4_fail(err, rc, "layer %lld: %s", (long long)il, msg);
        }
    }
    return ds4_ok(err);
}
