/*
 * session.c — a sequence being evaluated: its position, its forward state
 * (KV pages, recurrent states, scratch, threads: forward/forward.h) and the
 * results of the last eval.
 *
 * An eval checks everything and allocates everything it needs (output rows,
 * KV pages) before the first state change, so a failed eval leaves the
 * session exactly as it was. The tokens of one eval are one batch; it runs
 * as fixed chunks of DS4_CHUNK_ROWS rows, and since every row's math is
 * batch invariant the chunking is invisible in the results.
 */
#include "model.h"
#include "error.h"
#include "forward/forward.h"

#include <stdlib.h>

struct ds4_session {
    ds4_model *m;
    ds4_fwd f;
    int64_t n_past;
    float *logits, *hidden;   /* cap_rows rows each */
    int64_t cap_rows, n_rows; /* n_rows: rows of the last eval's results */
    float *layer_hidden;      /* n_rows x n_lh x n_embd of the last eval */
    int64_t cap_lh;           /* its capacity in rows x layers */
    int64_t n_lh;             /* layers the last eval captured */
    uint64_t own_allocs, own_alloc_bytes; /* the session struct itself */
};

int ds4_session_new(ds4_model *m, ds4_session **out, ds4_error *err) {
    *out = NULL;
    if (!m) return ds4_fail(err, DS4_ERR_ARG, "ds4_session_new: model is NULL");
    ds4_session *s = calloc(1, sizeof *s);
    if (!s) return ds4_fail(err, DS4_ERR_NOMEM, "out of memory for a session");
    s->m = m;
    s->own_allocs = 1;
    s->own_alloc_bytes = sizeof *s;
    /* Exact precision keeps K/V in F32; fast precision stores F16 pages,
     * llama.cpp's default cache type (qwen35-spec.md §10). */
    const int kv_type = m->params.precision == DS4_PRECISION_EXACT ? DS4_TYPE_F32 : DS4_TYPE_F16;
    int rc = ds4_fwd_init(&s->f, m, kv_type, err);
    if (rc) {
        free(s);
        return rc;
    }
    *out = s;
    return ds4_ok(err);
}

void ds4_session_free(ds4_session *s) {
    if (!s) return;
    ds4_fwd_free(&s->f);
    free(s->logits);
    free(s->hidden);
    free(s->layer_hidden);
    free(s);
}

/* Room for n_out result rows. Old results are not kept: they are only
 * valid until the next eval. */
static int grow_outputs(ds4_session *s, int64_t n_out, int64_t n_layers, ds4_error *err) {
    const ds4_model_config *c = &s->f.c;
    if (n_out * n_layers > s->cap_lh) {
        float *lh = ds4_fwd_malloc(&s->f, (size_t)(n_out * n_layers) * (size_t)c->n_embd *
                                              sizeof(float));
        if (!lh)
            return ds4_fail(err, DS4_ERR_NOMEM, "out of memory for %lld x %lld layer rows",
                            (long long)n_out, (long long)n_layers);
        free(s->layer_hidden);
        s->layer_hidden = lh;
        s->cap_lh = n_out * n_layers;
        s->n_rows = 0;
    }
    if (n_out <= s->cap_rows) return DS4_OK;
    float *lg = ds4_fwd_malloc(&s->f, (size_t)n_out * (size_t)c->n_vocab * sizeof(float));
    float *hd = ds4_fwd_malloc(&s->f, (size_t)n_out * (size_t)c->n_embd * sizeof(float));
    if (!lg || !hd) {
        free(lg);
        free(hd);
        return ds4_fail(err, DS4_ERR_NOMEM, "out of memory for %lld rows of logits",
                        (long long)n_out);
    }
    free(s->logits);
    free(s->hidden);
    s->logits = lg;
    s->hidden = hd;
    s->cap_rows = n_out;
    s->n_rows = 0;
    return DS4_OK;
}

int ds4_session_eval(ds4_session *s, const int32_t *tokens, int64_t n, int all_rows,
                     ds4_error *err) {
    return ds4_session_eval_layers(s, tokens, n, all_rows, NULL, 0, err);
}

int ds4_session_eval_layers(ds4_session *s, const int32_t *tokens, int64_t n, int all_rows,
                            const int64_t *layers, int64_t n_layers, ds4_error *err) {
    if (!s) return ds4_fail(err, DS4_ERR_ARG, "ds4_session_eval: session is NULL");
    if (n <= 0)
        return ds4_fail(err, DS4_ERR_ARG, "eval needs at least one token (got %lld)", (long long)n);
    if (!tokens) return ds4_fail(err, DS4_ERR_ARG, "ds4_session_eval: tokens is NULL");
    const ds4_model_config *c = &s->f.c;
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->n_vocab)
            return ds4_fail(err, DS4_ERR_ARG, "token id %d at index %lld is out of range [0, %lld)",
                            tokens[i], (long long)i, (long long)c->n_vocab);
    if (n_layers < 0 || (n_layers > 0 && !layers))
        return ds4_fail(err, DS4_ERR_ARG, "bad hidden-layer list (%lld entries)",
                        (long long)n_layers);
    for (int64_t j = 0; j < n_layers; j++)
        if (layers[j] < 0 || layers[j] >= c->n_main)
            return ds4_fail(err, DS4_ERR_ARG,
                            "hidden layer %lld (entry %lld) is not a trunk layer [0, %lld)",
                            (long long)layers[j], (long long)j, (long long)c->n_main);
    const int64_t n_ctx = s->f.n_ctx;
    if (n > n_ctx - s->n_past)
        return ds4_fail(err, DS4_ERR_ARG,
                        "prompt of %lld tokens does not fit: n_past %lld + %lld > n_ctx %lld",
                        (long long)n, (long long)s->n_past, (long long)n, (long long)n_ctx);
    const int64_t n_out = all_rows ? n : 1;
    int rc;
    if ((rc = ds4_fwd_reserve(&s->f, s->n_past + n, err)) ||
        (rc = grow_outputs(s, n_out, n_layers, err)))
        return rc;

    /* Nothing below can fail. */
    s->f.cap_layers = layers;
    s->f.n_cap = n_layers;
    for (int64_t c0 = 0; c0 < n; c0 += DS4_CHUNK_ROWS) {
        const int64_t cn = n - c0 < DS4_CHUNK_ROWS ? n - c0 : DS4_CHUNK_ROWS;
        int64_t out_row0;
        float *lg = s->logits, *hd = s->hidden;
        s->f.cap_out = s->layer_hidden;
        if (all_rows) {
            out_row0 = 0;
            lg += c0 * c->n_vocab;
            hd += c0 * c->n_embd;
            if (n_layers) s->f.cap_out += c0 * n_layers * c->n_embd;
        } else {
            out_row0 = c0 + cn == n ? cn - 1 : cn; /* only the eval's last row */
        }
        ds4_fwd_chunk(&s->f, tokens + c0, cn, s->n_past + c0, out_row0, lg, hd);
    }
    s->f.cap_layers = NULL;
    s->f.n_cap = 0;
    s->f.cap_out = NULL;
    s->n_past += n;
    s->n_rows = n_out;
    s->n_lh = n_layers;
    return ds4_ok(err);
}

const float *ds4_session_logits(const ds4_session *s, int64_t *n_rows) {
    *n_rows = s && s->n_rows ? s->n_rows : 0;
    return *n_rows ? s->logits : NULL;
}

const float *ds4_session_hidden(const ds4_session *s, int64_t *n_rows) {
    *n_rows = s && s->n_rows ? s->n_rows : 0;
    return *n_rows ? s->hidden : NULL;
}

int64_t ds4_session_n_past(const ds4_session *s) { return s ? s->n_past : 0; }

const float *ds4_session_layer_hidden(const ds4_session *s, int64_t *n_rows, int64_t *n_layers) {
    *n_rows = s && s->n_rows ? s->n_rows : 0;
    *n_layers = *n_rows ? s->n_lh : 0;
    return *n_layers ? s->layer_hidden : NULL;
}

void ds4_session_counters(const ds4_session *s, ds4_counters *out) {
    memset(out, 0, sizeof *out);
    if (!s) return;
    *out = s->f.cnt;
    out->allocs += s->own_allocs;
    out->alloc_bytes += s->own_alloc_bytes;
}
