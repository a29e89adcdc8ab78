/*
 * session.c — a sequence being evaluated: its position, its forward state
 * (KV pages, recurrent states, scratch, threads: forward/forward.h), the
 * results of the last eval, snapshots, and verify/accept.
 *
 * An eval checks everything and allocates everything it needs (output rows,
 * KV pages) before the first state change, so a failed eval leaves the
 * session exactly as it was. The tokens of one eval are one batch; it runs
 * as fixed chunks of DS4_CHUNK_ROWS rows, and since every row's math is
 * batch invariant the chunking is invisible in the results.
 *
 * Snapshots. A snapshot holds references to the KV pages covering
 * [0, n_past) of every KV layer (trunk attention layers, and the nextn
 * head's when the model has one) and copies of the GDN conv + ssm states and
 * of the last result row (logits and hidden), so a restored session can
 * continue at once. The pages are shared, not copied (kv.c: reference
 * counts, copy-on-write), so a snapshot costs its recurrent state plus a
 * page table, and the session pays one page copy per K/V page of each
 * attention layer when it next writes into a page the snapshot shares.
 *
 * Verify / accept. verify(n <= DS4_VERIFY_MAX tokens) is an eval of all rows
 * that also keeps what rollback needs; accept(k) then leaves the session as
 * if only the first k rows had been evaluated. The attention KV needs
 * nothing (n_past moves back; rows past it are overwritten before anything
 * reads them). The GDN state needs the state after row k-1. Two ways:
 *  A. keep the full state after every row: (K-1)*conv_dim + n_v*d_k*d_v
 *     floats per GDN layer per row;
 *  B. keep the state before the verify (one extra state per session,
 *     written by the verify itself: gdn_alt) plus, per row, the update's
 *     inputs (raw conv row, k, v, g, beta: 2*conv_dim - key_dim + 2*n_v
 *     floats per GDN layer), and on accept(k < n) replay k rows' rank-1
 *     updates with the same code (gdn.c delta_update): bit for bit the
 *     verify's own arithmetic.
 * On a Qwen3.5-27B shape (48 GDN layers of 64; n_v 48, n_k 16,
 * d_k = d_v = 128, K 4, conv_dim 10240): A keeps 817,152 floats =
 * 3,268,608 bytes per layer, 156,893,184 bytes (150 MiB) per row, 2.5 GB at
 * n = 16; B keeps 18,528 floats = 74,112 bytes per layer, 3,557,376 bytes
 * (3.4 MiB) per row (57 MB at n = 16) plus the one extra state of
 * 156,893,184 bytes. B is what this file does (ds4_rollback_bytes computes
 * these figures; tests/test_verify.py checks them). The replay costs about
 * what the verify's delta rule cost for those k rows, a small fraction of
 * the matmuls.
 */
#include "model.h"
#include "error.h"
#include "forward/forward.h"
#include "forward/nextn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(DS4_VERIFY_MAX <= DS4_CHUNK_ROWS, "a verify must be one chunk");

/* Committed rows go to the head in batches of DS4_PRIME_ROWS ("Deferred
 * rows" below); fewer than that wait. The buffer holds the waiting rows
 * plus one eval chunk's. */
#define DS4_PRIME_ROWS 64
#define PRIME_CAP (DS4_CHUNK_ROWS + DS4_PRIME_ROWS - 1)

struct ds4_session {
    ds4_model *m;
    ds4_fwd f;
    int64_t n_past;
    float *logits, *hidden;   /* cap_rows rows each */
    int64_t cap_rows, n_rows; /* n_rows: rows of the last eval's results */
    int64_t row0;             /* the getters show rows [row0, row0 + n_rows) (accept) */
    float *layer_hidden;      /* rows x n_lh x n_embd of the last eval */
    int64_t cap_lh;           /* its capacity in rows x layers */
    int64_t n_lh;             /* layers the last eval captured */
    int64_t ver_n;            /* rows of the verify accept() may roll back; 0: none */
    int64_t ver_n_past;       /* n_past before that verify */
    /* Head priming (ds4.h ds4_session_set_nextn_prime; "Head priming" below). */
    int prime;                /* on */
    float *prime_h;           /* (PRIME_CAP + 1) x n_embd: row 0 the trunk hidden of the
                                 position before the rows being primed, then theirs */
    float *prime_last;        /* n_embd: the trunk's hidden of the last committed position */
    int32_t ver_tok[DS4_VERIFY_MAX]; /* the pending verify's tokens ... */
    int64_t prime_pending;    /* ... and how many of its rows the head still lacks */
    /* Committed rows waiting for the head ("Deferred rows" below): tokens
     * of positions [defer_p0, defer_p0 + defer_n), their hidden rows in
     * prime_h rows 1..defer_n (row 0: the hidden of defer_p0 - 1). */
    int32_t defer_tok[PRIME_CAP];
    int64_t defer_p0, defer_n;
    uint64_t own_allocs, own_alloc_bytes; /* the session struct itself */
};

struct ds4_snapshot {
    const ds4_model *m;
    int64_t n_past;
    int64_t np;               /* pages per trunk attention layer: ceil(n_past / PAGE) */
    int64_t n_attn;           /* trunk attention layers */
    int has_nextn;            /* the head's KV is in the snapshot */
    int64_t nextn_pos0, nextn_n_pos, nextn_np;
    uint8_t **pages;          /* per trunk attention layer (ascending): np K pages, np V
                                 pages; then the head's nextn_np K, nextn_np V pages */
    int64_t n_rows;           /* 1: logits/hidden hold the last result row; 0: none */
    float *data;              /* GDN states (per GDN layer ascending: conv, ssm), then
                                 the logits row, then the hidden row */
    uint64_t bytes;           /* what the snapshot allocated itself */
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
    free(s->prime_h);
    free(s->prime_last);
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

/* Argument checks shared by eval and verify. */
static int check_tokens(const ds4_session *s, const int32_t *tokens, int64_t n,
                        const int64_t *layers, int64_t n_layers, ds4_error *err) {
    if (!tokens) return ds4_fail(err, DS4_ERR_ARG, "tokens is NULL");
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
    return DS4_OK;
}

/* ---------------------------------------------------------- priming -- */
/* Head priming (ds4.h ds4_session_set_nextn_prime). The head's row p is
 * token p with the trunk's post-final-norm hidden of position p-1, so the
 * rows of trunk positions [a, b) need the hidden of a-1 (prime_last: the
 * last committed position's) and of a..b-2 (the rows themselves). An eval
 * gets its rows' hidden from the chunk's residual stream, which
 * ds4_fwd_chunk leaves in f->h for every row, normed here with output_norm
 * by the same ds4_rmsnorm forward.c applies to its output rows (so a row's
 * hidden is bit for bit the one ds4_session_hidden would show, without an
 * LM head row per prompt token); a verify's rows wait in the results
 * buffer (all rows) for their accept. Every head call is KV-only: nobody
 * reads a primed row's logits, and the next draft's first row is a new one
 * (the last token with the trunk's hidden). Position 0 has no row. */

/* 1 when a head holding [pos0, n_pos) has every row a draft at `upto`
 * needs: [1, upto) (a row at 0 as well is fine). */
static int head_covers(int64_t pos0, int64_t n_pos, int64_t upto) {
    return upto <= 1 || (n_pos > pos0 && pos0 <= 1 && n_pos >= upto);
}

/* Check and allocate head rows for trunk positions [a, b). */
static int prime_prepare(ds4_session *s, int64_t a, int64_t b, ds4_error *err) {
    if (a < 1) a = 1;
    if (b <= a) return DS4_OK;
    int rc = ds4_nextn_prepare(&s->f, a, b - a, DS4_NEXTN_OUT_KV, err);
    if (rc) {
        char msg[sizeof err->message];
        snprintf(msg, sizeof msg, "%s", err ? err->message : "");
        return ds4_fail(err, rc, "head priming: %s", msg);
    }
    return DS4_OK;
}

/* Head rows at trunk positions p0.. for tokens[0..n), hid[r] the hidden of
 * position p0+r-1 (row 0 is skipped at position 0). Prepared. */
static void prime_rows(ds4_session *s, const int32_t *tokens, const float *hid, int64_t n,
                       int64_t p0) {
    if (p0 == 0) {
        tokens++;
        hid += s->f.c.n_embd;
        n--;
        p0 = 1;
    }
    if (n > 0) ds4_nextn_run(&s->f, tokens, hid, p0, n, DS4_NEXTN_OUT_KV);
}

/* prime_h row 0 = prime_last, rows 1..pend = the pending verify's hidden
 * rows (still in the results buffer). */
static void stage_verify_rows(ds4_session *s, int64_t pend) {
    const int64_t E = s->f.c.n_embd;
    memcpy(s->prime_h, s->prime_last, (size_t)E * sizeof(float));
    memcpy(s->prime_h + E, s->hidden, (size_t)(pend * E) * sizeof(float));
}

/* Give the head the staged rows of the pending verify (all of them: this
 * call commits them) and move prime_last to its last row. */
static void prime_staged(ds4_session *s, int64_t pend) {
    const int64_t E = s->f.c.n_embd;
    prime_rows(s, s->ver_tok, s->prime_h, pend, s->ver_n_past);
    memcpy(s->prime_last, s->prime_h + pend * E, (size_t)E * sizeof(float));
    s->prime_pending = 0;
}

/* Deferred rows. An eval's rows do not reach the head at once: their
 * (token, normed hidden) pairs wait in prime_h / defer_tok, and whole
 * batches of DS4_PRIME_ROWS go to the head in one KV-only call as they
 * fill (an eval chunk of 256 rows gives 256 at once); the rest wait until
 * anything reads or changes the head (a verify, a nextn call, a snapshot,
 * priming turned off). Decode commits one row per eval, and one head row
 * per token cost two pool dispatches and a weight read of the head's
 * eh_proj, attn_k and attn_v per token: ~2% of a plain decode step on the
 * demo model at 2 threads (0.887 vs 0.905 ms/step, interleaved) -- what a
 * run that admits drafting but never drafts lost to serial. A batch of 64
 * rows reads those weights once. The rows are the same (batch invariance,
 * DESIGN.md invariant 1), so only when the head gets them differs, and
 * nobody can observe the head in between: the head KV pages for the
 * waiting rows are reserved when the rows are deferred (so the catch-up
 * cannot fail), every call that reads or writes the head catches it up
 * first, and ds4_session_nextn_range/covered report the head as caught
 * up. */

/* Give the head the first n waiting rows (reserved when deferred: cannot
 * fail); prime_h row 0 becomes the hidden of the last of them, the rest
 * move to the front. */
static void prime_give(ds4_session *s, int64_t n) {
    if (!n) return;
    const int64_t E = s->f.c.n_embd, left = s->defer_n - n;
    prime_rows(s, s->defer_tok, s->prime_h, n, s->defer_p0);
    memmove(s->prime_h, s->prime_h + n * E, (size_t)((left + 1) * E) * sizeof(float));
    memmove(s->defer_tok, s->defer_tok + n, (size_t)left * sizeof *s->defer_tok);
    s->defer_p0 += n;
    s->defer_n = left;
}

/* Give the head every waiting row. */
static void prime_flush(ds4_session *s) { prime_give(s, s->defer_n); }

/* After trunk chunk tokens[0..n) at positions defer_p0 + defer_n..: the
 * chunk's rows, normed from the residual stream ds4_fwd_chunk left in f->h,
 * join the waiting rows (run() made room before the chunk: the head's
 * own pass reuses the forward scratch f->h lives in); the full batches go
 * to the head. */
static void defer_chunk(ds4_session *s, const int32_t *tokens, int64_t n) {
    ds4_fwd *f = &s->f;
    const int64_t E = f->c.n_embd;
    const float *on = (const float *)f->m->output_norm.data;
    float *dst = s->prime_h + (s->defer_n + 1) * E;
    for (int64_t t = 0; t < n; t++) ds4_rmsnorm(f->h + t * E, on, dst + t * E, E, f->c.rms_eps);
    memcpy(s->defer_tok + s->defer_n, tokens, (size_t)n * sizeof *tokens);
    s->defer_n += n;
    prime_give(s, s->defer_n / DS4_PRIME_ROWS * DS4_PRIME_ROWS);
}

/* The head's range [first, next) as it is once the waiting rows are in. */
static void head_range(const ds4_session *s, int64_t *first, int64_t *next) {
    *first = s->f.nextn_pos0;
    *next = s->f.nextn_n_pos;
    const int64_t p0 = s->defer_p0 < 1 ? 1 : s->defer_p0, end = s->defer_p0 + s->defer_n;
    if (!s->defer_n || end <= p0) return; /* nothing, or only a row at position 0 */
    if (*next <= *first || p0 <= *first) *first = p0; /* forward/nextn.c head_base */
    *next = end;
}

/* Run checked tokens; verify != 0: one chunk (n <= DS4_VERIFY_MAX) with the
 * rollback capture. Everything that can fail happens before the first state
 * change. */
static int run(ds4_session *s, const int32_t *tokens, int64_t n, int all_rows,
               const int64_t *layers, int64_t n_layers, int verify, ds4_error *err) {
    const ds4_model_config *c = &s->f.c;
    const int64_t n_out = all_rows ? n : 1;
    const int64_t pend = s->prime ? s->prime_pending : 0;
    /* A verify's rows the head still lacks are committed by this call:
     * stage their hidden rows now, before grow_outputs may free them (a
     * verify caught the head up, so no deferred rows wait in prime_h). */
    if (pend) stage_verify_rows(s, pend);
    int rc;
    if ((rc = ds4_fwd_reserve(&s->f, s->n_past, s->n_past + n, err)) ||
        (rc = grow_outputs(s, n_out, n_layers, err)) ||
        (verify && (rc = ds4_fwd_verify_reserve(&s->f, n, err))))
        return rc;
    /* The head rows this call writes or defers: the waiting ones or the
     * pending verify's, then (an eval's own rows; a verify's wait for their
     * accept) this call's. */
    if (s->prime) {
        const int64_t a = s->defer_n ? s->defer_p0 : pend ? s->ver_n_past : s->n_past;
        if ((rc = prime_prepare(s, a, s->n_past + (verify ? 0 : n), err))) return rc;
    }

    /* Nothing below can fail. */
    if (pend) prime_staged(s, pend);
    if (s->prime && verify) prime_flush(s); /* the accept primes right after them */
    if (s->prime && !s->defer_n) {
        memcpy(s->prime_h, s->prime_last, (size_t)c->n_embd * sizeof(float));
        s->defer_p0 = s->n_past;
    }
    s->f.cap_layers = layers;
    s->f.n_cap = n_layers;
    s->f.verify = verify;
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
        if (s->prime && !verify && s->defer_n + cn > PRIME_CAP) prime_flush(s);
        ds4_fwd_chunk(&s->f, tokens + c0, cn, s->n_past + c0, out_row0, lg, hd);
        if (s->prime && !verify) defer_chunk(s, tokens + c0, cn);
    }
    s->f.verify = 0;
    s->f.cap_layers = NULL;
    s->f.n_cap = 0;
    s->f.cap_out = NULL;
    if (s->prime) {
        if (verify) {
            memcpy(s->ver_tok, tokens, (size_t)n * sizeof *tokens);
            s->prime_pending = n;
        } else {
            memcpy(s->prime_last, s->prime_h + s->defer_n * c->n_embd,
                   (size_t)c->n_embd * sizeof(float));
        }
    }
    if (verify) {
        /* gdn now holds the state after the verify, gdn_alt the one before */
        ds4_fwd_swap_gdn(&s->f);
        s->ver_n = n;
        s->ver_n_past = s->n_past;
    } else {
        s->ver_n = 0;
    }
    s->n_past += n;
    s->n_rows = n_out;
    s->row0 = 0;
    s->n_lh = n_layers;
    return ds4_ok(err);
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
    int rc = check_tokens(s, tokens, n, layers, n_layers, err);
    if (rc) return rc;
    return run(s, tokens, n, all_rows, layers, n_layers, 0, err);
}

int ds4_session_verify(ds4_session *s, const int32_t *tokens, int64_t n, const int64_t *layers,
                       int64_t n_layers, ds4_error *err) {
    if (!s) return ds4_fail(err, DS4_ERR_ARG, "ds4_session_verify: session is NULL");
    if (n < 1 || n > DS4_VERIFY_MAX)
        return ds4_fail(err, DS4_ERR_ARG, "verify takes 1 to %d tokens (got %lld)", DS4_VERIFY_MAX,
                        (long long)n);
    int rc = check_tokens(s, tokens, n, layers, n_layers, err);
    if (rc) return rc;
    return run(s, tokens, n, 1, layers, n_layers, 1, err);
}

/* The nextn head's KV is a sequence of its own (forward.h): the head holds
 * entries [0, nextn_n_pos - nextn_pos0) for positions nextn_pos0 .. */
static int has_nextn_kv(const ds4_fwd *f) { return f->nextn_kv.k != NULL; }

int ds4_session_accept(ds4_session *s, int64_t k, ds4_error *err) {
    if (!s) return ds4_fail(err, DS4_ERR_ARG, "ds4_session_accept: session is NULL");
    if (s->ver_n == 0)
        return ds4_fail(err, DS4_ERR_ARG,
                        "accept(%lld) without a verify to accept: accept follows verify directly "
                        "(an eval, restore or accept in between ends it)",
                        (long long)k);
    if (k < 1 || k > s->ver_n)
        return ds4_fail(err, DS4_ERR_ARG, "accept(%lld): k must be in 1..%lld, the rows of the last verify",
                        (long long)k, (long long)s->ver_n);
    /* Priming: the k accepted rows go to the head in one call (KV only). */
    const int64_t pend = s->prime ? s->prime_pending : 0;
    int rc;
    if (pend && (rc = prime_prepare(s, s->ver_n_past, s->ver_n_past + k, err))) return rc;

    /* Nothing below can fail. */
    if (pend) {
        const int64_t E = s->f.c.n_embd;
        memcpy(s->prime_h, s->prime_last, (size_t)E * sizeof(float));
        memcpy(s->prime_h + E, s->hidden, (size_t)((k - 1) * E) * sizeof(float));
        prime_rows(s, s->ver_tok, s->prime_h, k, s->ver_n_past);
        s->prime_pending = 0;
    }
    if (s->prime)
        memcpy(s->prime_last, s->hidden + (k - 1) * s->f.c.n_embd,
               (size_t)s->f.c.n_embd * sizeof(float));
    if (k < s->ver_n) {
        /* gdn_alt holds the state before the verify: replay k rows on it
         * and make it current. */
        ds4_gdn_replay(&s->f, k);
        ds4_fwd_swap_gdn(&s->f);
    }
    s->n_past = s->ver_n_past + k;
    /* The results show row k-1, the new last position (the verify's rows
     * stay in the buffer: earlier views of them still read them). */
    s->row0 = k - 1;
    s->n_rows = 1;
    s->ver_n = 0;
    /* The head's entries at positions the trunk no longer holds cannot be
     * valid after the rollback. */
    ds4_fwd *f = &s->f;
    if (has_nextn_kv(f) && f->nextn_n_pos > s->n_past)
        f->nextn_n_pos = s->n_past > f->nextn_pos0 ? s->n_past : f->nextn_pos0;
    return ds4_ok(err);
}

/* ---------------------------------------------------------- snapshots -- */

static int64_t n_attn_layers(const ds4_fwd *f) {
    int64_t n = 0;
    for (int64_t il = 0; il < f->c.n_main; il++) n += f->m->layers[il].kind == DS4_LAYER_ATTN;
    return n;
}

/* Floats of one GDN layer's conv state and ssm state. */
static int64_t conv_floats(const ds4_model_config *c) {
    return (c->ssm_conv_kernel - 1) * (2 * c->ssm_n_k * c->ssm_d_state + c->ssm_d_inner);
}
static int64_t ssm_floats(const ds4_model_config *c) {
    return c->ssm_n_v * c->ssm_d_state * c->ssm_d_state;
}

int ds4_session_snapshot(ds4_session *s, ds4_snapshot **out, ds4_error *err) {
    if (!out) return ds4_fail(err, DS4_ERR_ARG, "ds4_session_snapshot: out is NULL");
    *out = NULL;
    if (!s) return ds4_fail(err, DS4_ERR_ARG, "ds4_session_snapshot: session is NULL");
    ds4_fwd *f = &s->f;
    const ds4_model_config *c = &f->c;
    prime_flush(s); /* the snapshot holds the head's pages */
    if (s->prime && s->prime_pending) {
        /* A snapshot holds every verified row (the trunk's), so the head
         * gets them now, as an eval would give them; an accept that follows
         * cuts the head back with the trunk. */
        const int64_t pend = s->prime_pending;
        stage_verify_rows(s, pend);
        int rc = prime_prepare(s, s->ver_n_past, s->ver_n_past + pend, err);
        if (rc) return rc;
        prime_staged(s, pend);
    }
    int64_t n_gdn = 0;
    for (int64_t il = 0; il < c->n_main; il++) n_gdn += f->m->layers[il].kind == DS4_LAYER_GDN;
    const int64_t np = ds4_kv_pages_for(s->n_past), n_attn = n_attn_layers(f);
    const int has_nextn = has_nextn_kv(f);
    const int64_t nextn_np =
        has_nextn ? ds4_kv_pages_for(f->nextn_n_pos - f->nextn_pos0) : 0;
    const int64_t n_rows = s->n_rows > 0 ? 1 : 0;
    const size_t n_pages = (size_t)(2 * (n_attn * np + nextn_np));
    const size_t n_floats = (size_t)(n_gdn * (conv_floats(c) + ssm_floats(c)) +
                                     n_rows * (c->n_vocab + c->n_embd));

    ds4_snapshot *sn = ds4_fwd_malloc(f, sizeof *sn);
    uint8_t **pages = ds4_fwd_malloc(f, (n_pages ? n_pages : 1) * sizeof *pages);
    float *data = ds4_fwd_malloc(f, (n_floats ? n_floats : 1) * sizeof *data);
    if (!sn || !pages || !data) {
        free(sn);
        free(pages);
        free(data);
        return ds4_fail(err, DS4_ERR_NOMEM, "out of memory for a snapshot (%zu floats)", n_floats);
    }
    memset(sn, 0, sizeof *sn);
    sn->m = s->m;
    sn->n_past = s->n_past;
    sn->np = np;
    sn->n_attn = n_attn;
    sn->pages = pages;
    sn->data = data;
    sn->n_rows = n_rows;
    sn->bytes = sizeof *sn + (n_pages ? n_pages : 1) * sizeof *pages +
                (n_floats ? n_floats : 1) * sizeof *data;

    /* Every page of [0, n_past) of every KV layer: shared (one more
     * reference), never copied. */
    size_t ip = 0;
    for (int64_t il = 0; il < c->n_main; il++) {
        if (f->m->layers[il].kind != DS4_LAYER_ATTN) continue;
        const ds4_kv_layer *kv = &f->kv[il];
        for (int64_t p = 0; p < np; p++) ds4_kv_page_ref(pages[ip++] = kv->k[p]);
        for (int64_t p = 0; p < np; p++) ds4_kv_page_ref(pages[ip++] = kv->v[p]);
    }
    if (has_nextn) {
        sn->has_nextn = 1;
        sn->nextn_pos0 = f->nextn_pos0;
        sn->nextn_n_pos = f->nextn_n_pos;
        sn->nextn_np = nextn_np;
        for (int64_t p = 0; p < nextn_np; p++) ds4_kv_page_ref(pages[ip++] = f->nextn_kv.k[p]);
        for (int64_t p = 0; p < nextn_np; p++) ds4_kv_page_ref(pages[ip++] = f->nextn_kv.v[p]);
    }

    /* The recurrent states are copied: they change with every token. */
    float *d = data;
    for (int64_t il = 0; il < c->n_main; il++) {
        if (f->m->layers[il].kind != DS4_LAYER_GDN) continue;
        memcpy(d, f->gdn[il].conv, (size_t)conv_floats(c) * sizeof(float));
        d += conv_floats(c);
        memcpy(d, f->gdn[il].ssm, (size_t)ssm_floats(c) * sizeof(float));
        d += ssm_floats(c);
    }
    if (n_rows) {
        /* The last result row is the one at position n_past - 1. */
        const int64_t r = s->row0 + s->n_rows - 1;
        memcpy(d, s->logits + r * c->n_vocab, (size_t)c->n_vocab * sizeof(float));
        memcpy(d + c->n_vocab, s->hidden + r * c->n_embd, (size_t)c->n_embd * sizeof(float));
    }
    *out = sn;
    return ds4_ok(err);
}

int ds4_session_restore(ds4_session *s, const ds4_snapshot *sn, ds4_error *err) {
    if (!s) return ds4_fail(err, DS4_ERR_ARG, "ds4_session_restore: session is NULL");
    if (!sn) return ds4_fail(err, DS4_ERR_ARG, "ds4_session_restore: snapshot is NULL");
    ds4_fwd *f = &s->f;
    const ds4_model_config *c = &f->c;
    if (sn->m != s->m)
        return ds4_fail(err, DS4_ERR_ARG,
                        "snapshot was taken from a session of another model; a snapshot "
                        "restores only into sessions of the model it came from");
    if (sn->has_nextn != has_nextn_kv(f))
        return ds4_fail(err, DS4_ERR_ARG, "snapshot and session disagree on the nextn head's KV");
    if (s->prime && !ds4_snapshot_nextn_covered(sn))
        return ds4_fail(err, DS4_ERR_ARG,
                        "the snapshot's nextn head holds positions [%lld, %lld), not all of [1, "
                        "%lld): it comes from a session without head priming, so this session "
                        "(priming on) could not draft from it; restore it with priming off",
                        (long long)sn->nextn_pos0, (long long)sn->nextn_n_pos,
                        (long long)sn->n_past);
    int rc;
    if (sn->n_rows && (rc = grow_outputs(s, 1, 0, err))) return rc;

    /* Nothing below can fail. Take the snapshot's references before
     * dropping the session's: they may be the same pages. */
    const size_t n_pages = (size_t)(2 * (sn->n_attn * sn->np + sn->nextn_np));
    for (size_t i = 0; i < n_pages; i++) ds4_kv_page_ref(sn->pages[i]);
    size_t ip = 0;
    for (int64_t il = 0; il < c->n_main; il++) {
        if (f->m->layers[il].kind != DS4_LAYER_ATTN) continue;
        ds4_kv_layer *kv = &f->kv[il];
        ds4_kv_layer_truncate(kv, 0);
        for (int64_t p = 0; p < sn->np; p++) kv->k[p] = sn->pages[ip++];
        for (int64_t p = 0; p < sn->np; p++) kv->v[p] = sn->pages[ip++];
        kv->n_pages = sn->np;
    }
    if (sn->has_nextn) {
        ds4_kv_layer *kv = &f->nextn_kv;
        ds4_kv_layer_truncate(kv, 0);
        for (int64_t p = 0; p < sn->nextn_np; p++) kv->k[p] = sn->pages[ip++];
        for (int64_t p = 0; p < sn->nextn_np; p++) kv->v[p] = sn->pages[ip++];
        kv->n_pages = sn->nextn_np;
        f->nextn_pos0 = sn->nextn_pos0;
        f->nextn_n_pos = sn->nextn_n_pos;
        f->nextn_n_rows = 0; /* the head's last results belong to the old state */
    }
    const float *d = sn->data;
    for (int64_t il = 0; il < c->n_main; il++) {
        if (f->m->layers[il].kind != DS4_LAYER_GDN) continue;
        memcpy(f->gdn[il].conv, d, (size_t)conv_floats(c) * sizeof(float));
        d += conv_floats(c);
        memcpy(f->gdn[il].ssm, d, (size_t)ssm_floats(c) * sizeof(float));
        d += ssm_floats(c);
    }
    if (sn->n_rows) {
        memcpy(s->logits, d, (size_t)c->n_vocab * sizeof(float));
        memcpy(s->hidden, d + c->n_vocab, (size_t)c->n_embd * sizeof(float));
    }
    s->n_past = sn->n_past;
    s->n_rows = sn->n_rows;
    s->row0 = 0;
    s->n_lh = 0;
    s->ver_n = 0;
    s->prime_pending = 0;
    s->defer_n = 0; /* rows of the replaced history */
    /* the snapshot's last hidden row is the trunk's hidden of n_past - 1 */
    if (s->prime && sn->n_rows) memcpy(s->prime_last, s->hidden, (size_t)c->n_embd * sizeof(float));
    return ds4_ok(err);
}

void ds4_snapshot_free(ds4_snapshot *sn) {
    if (!sn) return;
    const size_t n_pages = (size_t)(2 * (sn->n_attn * sn->np + sn->nextn_np));
    for (size_t i = 0; i < n_pages; i++) ds4_kv_page_unref(sn->pages[i]);
    free(sn->pages);
    free(sn->data);
    free(sn);
}

int64_t ds4_snapshot_n_past(const ds4_snapshot *sn) { return sn ? sn->n_past : 0; }

int ds4_snapshot_nextn_covered(const ds4_snapshot *sn) {
    return sn && sn->has_nextn && head_covers(sn->nextn_pos0, sn->nextn_n_pos, sn->n_past) &&
           (sn->n_past == 0 || sn->n_rows == 1);
}

uint64_t ds4_snapshot_bytes(const ds4_snapshot *sn) { return sn ? sn->bytes : 0; }

void ds4_rollback_bytes(const ds4_model_config *c, int64_t n_gdn_layers, uint64_t *per_row,
                        uint64_t *per_state) {
    *per_row = (uint64_t)n_gdn_layers * (uint64_t)ds4_gdn_capture_floats(c) * sizeof(float);
    *per_state = (uint64_t)n_gdn_layers * (uint64_t)ds4_gdn_state_bytes(c);
}

/* ------------------------------------------------------------ results -- */

const float *ds4_session_logits(const ds4_session *s, int64_t *n_rows) {
    *n_rows = s && s->n_rows ? s->n_rows : 0;
    return *n_rows ? s->logits + s->row0 * s->f.c.n_vocab : NULL;
}

const float *ds4_session_hidden(const ds4_session *s, int64_t *n_rows) {
    *n_rows = s && s->n_rows ? s->n_rows : 0;
    return *n_rows ? s->hidden + s->row0 * s->f.c.n_embd : NULL;
}

int64_t ds4_session_n_past(const ds4_session *s) { return s ? s->n_past : 0; }

const float *ds4_session_layer_hidden(const ds4_session *s, int64_t *n_rows, int64_t *n_layers) {
    *n_rows = s && s->n_rows ? s->n_rows : 0;
    *n_layers = *n_rows ? s->n_lh : 0;
    return *n_layers ? s->layer_hidden + s->row0 * s->n_lh * s->f.c.n_embd : NULL;
}

void ds4_session_counters(const ds4_session *s, ds4_counters *out) {
    memset(out, 0, sizeof *out);
    if (!s) return;
    *out = s->f.cnt;
    out->allocs += s->own_allocs;
    out->alloc_bytes += s->own_alloc_bytes;
}

/* ------------------------------------------- nextn head (forward/nextn.c) -- */

int ds4_session_nextn_eval(ds4_session *s, const int32_t *tokens, const float *hiddens,
                           const int64_t *positions, int64_t n, ds4_error *err) {
    if (!s) return ds4_fail(err, DS4_ERR_ARG, "ds4_session_nextn_eval: session is NULL");
    prime_flush(s);
    return ds4_nextn_eval(&s->f, tokens, hiddens, positions, n, err);
}

int ds4_session_nextn_eval_out(ds4_session *s, const int32_t *tokens, const float *hiddens,
                               const int64_t *positions, int64_t n, int out, ds4_error *err) {
    if (!s) return ds4_fail(err, DS4_ERR_ARG, "ds4_session_nextn_eval_out: session is NULL");
    prime_flush(s);
    return ds4_nextn_eval_out(&s->f, tokens, hiddens, positions, n, out, err);
}

int ds4_session_set_nextn_prime(ds4_session *s, int on, ds4_error *err) {
    if (!s) return ds4_fail(err, DS4_ERR_ARG, "ds4_session_set_nextn_prime: session is NULL");
    ds4_fwd *f = &s->f;
    if (!on) {
        prime_flush(s); /* what was committed while priming was on */
        s->prime = 0;
        s->prime_pending = 0;
        return ds4_ok(err);
    }
    if (s->prime) return ds4_ok(err);
    if (!f->nextn_ready)
        return ds4_fail(err, DS4_ERR_UNSUPPORTED,
                        "head priming: the model has no nextn (MTP) head: its file bundles none "
                        "and no draft_head was given");
    if (s->ver_n)
        return ds4_fail(err, DS4_ERR_ARG,
                        "head priming: a verify is waiting for its accept; turn priming on "
                        "before the verify or after its accept");
    if (!head_covers(f->nextn_pos0, f->nextn_n_pos, s->n_past))
        return ds4_fail(err, DS4_ERR_ARG,
                        "head priming: the session holds %lld tokens but the nextn head holds "
                        "positions [%lld, %lld), not all of [1, %lld): turn priming on before "
                        "the prompt (or catch the head up first) so drafting never starts from "
                        "a history with a gap",
                        (long long)s->n_past, (long long)f->nextn_pos0, (long long)f->nextn_n_pos,
                        (long long)s->n_past);
    if (s->n_past > 0 && s->n_rows == 0)
        return ds4_fail(err, DS4_ERR_ARG,
                        "head priming: the session has no last hidden row to continue from");
    const int64_t E = f->c.n_embd;
    if (!s->prime_h) {
        float *ph = ds4_fwd_calloc(f, (size_t)((PRIME_CAP + 1) * E), sizeof(float));
        float *pl = ds4_fwd_calloc(f, (size_t)E, sizeof(float));
        if (!ph || !pl) {
            free(ph);
            free(pl);
            return ds4_fail(err, DS4_ERR_NOMEM, "out of memory for head priming");
        }
        s->prime_h = ph;
        s->prime_last = pl;
    }
    if (s->n_past > 0)
        memcpy(s->prime_last, s->hidden + (s->row0 + s->n_rows - 1) * E, (size_t)E * sizeof(float));
    s->prime = 1;
    s->prime_pending = 0;
    s->defer_n = 0;
    return ds4_ok(err);
}

int ds4_session_nextn_prime(const ds4_session *s) { return s ? s->prime : 0; }

int ds4_session_nextn_covered(const ds4_session *s) {
    if (!s || !s->f.nextn_ready) return 0;
    int64_t first, next;
    head_range(s, &first, &next);
    return head_covers(first, next, s->n_past - s->prime_pending);
}

int64_t ds4_session_nextn_catch_up(ds4_session *s) {
    if (!s) return 0;
    const int64_t n = s->defer_n;
    prime_flush(s);
    return n;
}

int ds4_session_nextn_draft(ds4_session *s, int32_t token, const float *hidden,
                            ds4_error *err) {
    if (!s) return ds4_fail(err, DS4_ERR_ARG, "ds4_session_nextn_draft: session is NULL");
    prime_flush(s);
    /* The next head position; an empty head drafts at the trunk's n_past
     * (row (x_n, h_{n-1}) at position n, spec §7 "Drafting"). */
    const int64_t pos = s->f.nextn_n_pos > s->f.nextn_pos0 ? s->f.nextn_n_pos : s->n_past;
    return ds4_nextn_eval(&s->f, &token, hidden, &pos, 1, err);
}

const float *ds4_session_nextn_logits(const ds4_session *s, int64_t *n_rows) {
    *n_rows = s && s->f.nextn_n_rows ? s->f.nextn_n_rows : 0;
    return *n_rows ? s->f.nextn_logits : NULL;
}

const float *ds4_session_nextn_hidden(const ds4_session *s, int64_t *n_rows) {
    *n_rows = s && s->f.nextn_n_rows ? s->f.nextn_n_rows : 0;
    return *n_rows ? s->f.nextn_hidden : NULL;
}

void ds4_session_nextn_range(const ds4_session *s, int64_t *first, int64_t *next) {
    *first = *next = 0;
    if (s) head_range(s, first, next);
}
