/*
 * kv.c — KV cache pages of the attention layers.
 *
 * Pages of DS4_KV_PAGE positions are allocated as the context grows (a
 * session that only ever sees short prompts never pays for n_ctx), never
 * during a chunk: ds4_fwd_reserve runs before any state changes, so an
 * allocation failure leaves the session as it was.
 */
#include "forward.h"
#include "../error.h"

#include <stdlib.h>

static size_t page_bytes(const ds4_fwd *f) {
    return (size_t)f->c.n_head_kv * DS4_KV_PAGE * (size_t)f->c.head_dim * f->kv_elem_bytes;
}

int ds4_kv_init(ds4_fwd *f, ds4_error *err) {
    f->n_pages_max = (f->n_ctx + DS4_KV_PAGE - 1) / DS4_KV_PAGE;
    for (int64_t il = 0; il < f->c.n_main; il++) {
        if (f->m->layers[il].kind != DS4_LAYER_ATTN) continue;
        ds4_kv_layer *kv = &f->kv[il];
        kv->k = ds4_fwd_calloc(f, (size_t)f->n_pages_max, sizeof *kv->k);
        kv->v = ds4_fwd_calloc(f, (size_t)f->n_pages_max, sizeof *kv->v);
        if (!kv->k || !kv->v)
            return ds4_fail(err, DS4_ERR_NOMEM, "out of memory for the KV page table of layer %lld",
                            (long long)il);
    }
    return ds4_ok(err);
}

void ds4_kv_free(ds4_fwd *f) {
    if (!f->kv) return;
    for (int64_t il = 0; il < f->c.n_main; il++) {
        ds4_kv_layer *kv = &f->kv[il];
        for (int64_t p = 0; p < kv->n_pages; p++) {
            free(kv->k[p]);
            free(kv->v[p]);
        }
        free(kv->k);
        free(kv->v);
    }
}

int ds4_fwd_reserve(ds4_fwd *f, int64_t n_pos, ds4_error *err) {
    const int64_t need = (n_pos + DS4_KV_PAGE - 1) / DS4_KV_PAGE;
    if (need > f->n_pages_max)
        return ds4_fail(err, DS4_ERR_ARG, "%lld positions exceed n_ctx %lld", (long long)n_pos,
                        (long long)f->n_ctx);
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
    const size_t pb = page_bytes(f);
    for (int64_t il = 0; il < f->c.n_main; il++) {
        if (f->m->layers[il].kind != DS4_LAYER_ATTN) continue;
        ds4_kv_layer *kv = &f->kv[il];
        while (kv->n_pages < need) {
            /* calloc: a page's unused tail is never read (attention stops at
             * the row's position), but zeroed memory keeps any future bug
             * deterministic. */
            uint8_t *k = ds4_fwd_calloc(f, 1, pb), *v = ds4_fwd_calloc(f, 1, pb);
            if (!k || !v) {
                free(k);
                free(v);
                return ds4_fail(err, DS4_ERR_NOMEM,
                                "out of memory for KV page %lld of layer %lld (%zu bytes)",
                                (long long)kv->n_pages, (long long)il, 2 * pb);
            }
            kv->k[kv->n_pages] = k;
            kv->v[kv->n_pages] = v;
            kv->n_pages++;
        }
    }
    return ds4_ok(err);
}
