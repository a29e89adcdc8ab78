/*
 * runner_head.c — the nextn (MTP) head on the GPU layer loop (runner.h),
 * row for row what csrc/forward/nextn.c computes on the CPU. A row is
 * (token x, hidden h) at position p, h being the trunk's post-norm hidden
 * of p - 1 (or, chaining drafts, the head's own output of the step before):
 *   [e ; g] = [rmsnorm(E[x]) * enorm ; rmsnorm(h) * hnorm]  (side by side in hin)
 *   u  = eh_proj [e ; g]
 *   u += attn(attn_norm(u))              gated attention over the head's OWN KV
 *   u += ffn(post_attention_norm(u))     the trunk's kind (dense or routed MoE)
 *   hm = rmsnorm(u) * shared_head_norm;  logits = LM head(hm); draft = argmax
 * Each step is the trunk's own kernel through runner.c's helpers, so the
 * numerics are the trunk's (docs/gpu.md §3) and a row never depends on how
 * many rows share its call.
 *
 * KV. The head's KV is one attention layer's pools; slot p - 1 holds
 * position p (position 0 has no hidden before it, so the head never holds
 * it; the CPU's head starts at position 1 as well). RoPE uses the real
 * position (the cs/sn rows uploaded here), attention runs over the slots.
 * Priming rows (KV-only) stop after the K/V store: a row's K/V depend on
 * nothing after it (the attention, FFN and LM head), which is why the CPU
 * skips them too.
 *
 * The carry. hrows row 0 holds the trunk's post-norm hidden before the
 * rows waiting for the head (the h of the first of them); their hidden rows
 * follow it, so row t of the head's input is hrows row t.
 *
 * Deferred rows (the CPU's session.c does the same). A priming session's
 * committed eval rows are not given to the head one step at a time: each
 * chunk's hidden rows, embedding rows (hemb) and RoPE rows (hcs/hsn) are
 * kept on the device with device copies, and the head gets all of them in
 * one batched KV-only call when it is needed -- before a draft, a verify
 * or a snapshot, when priming is turned off, or when a chunk would not fit
 * beside them (ROWS). A plain decode step then pays four device copies for
 * the head instead of its launches (H200, demo model: ~50 us a step). A
 * verify's rows reach the head at accept(k) (commit_rows).
 */
#include "runner_int.h"

#include <stdlib.h>
#include <string.h>

static int need(const ds4_tensor *t, const char *what, ds4_error *err) {
    return t->data ? 0 : ds4_fail(err, DS4_ERR_UNSUPPORTED, "nextn head: no %s tensor", what);
}

int kr_head_open(k_gpu_model *g, ds4_error *err) {
    const ds4_model_config *c = &g->c;
    const ds4_model *m = g->m;
    const ds4_layer *T = &m->layers[c->n_main];
    const int64_t E = c->n_embd;
    int rc;
    if (T->kind != DS4_LAYER_NEXTN)
        return ds4_fail(err, DS4_ERR_UNSUPPORTED, "block %lld is not a nextn block", (long long)c->n_main);
    if ((rc = need(&T->nextn_enorm, "nextn.enorm", err)) || (rc = need(&T->nextn_hnorm, "nextn.hnorm", err)) ||
        (rc = need(&T->nextn_shared_head_norm, "nextn.shared_head_norm", err)) ||
        (rc = need(&T->nextn_eh_proj, "nextn.eh_proj", err)) || (rc = need(&T->attn_q, "attn_q", err)))
        return rc;
    if (T->nextn_eh_proj.ne[0] != 2 * E || T->nextn_eh_proj.ne[1] != E)
        return ds4_fail(err, DS4_ERR_UNSUPPORTED, "nextn head: nextn.eh_proj is {%lld, %lld}, the head needs {%lld, %lld}",
                        (long long)T->nextn_eh_proj.ne[0], (long long)T->nextn_eh_proj.ne[1], (long long)(2 * E),
                        (long long)E);
    dev_head *H = calloc(1, sizeof *H);
    if (!H) return ds4_fail(err, DS4_ERR_NOMEM, "out of host memory");
    H->L.kind = DS4_LAYER_ATTN;
    rc = 0;
    if (!(H->enorm = kr_upload_f32(g, &T->nextn_enorm, E, err)) ||
        !(H->hnorm = kr_upload_f32(g, &T->nextn_hnorm, E, err)) ||
        !(H->out_norm = kr_upload_f32(g, &T->nextn_shared_head_norm, E, err)))
        rc = err->code;
    if (!rc && !(rc = kr_upload_mat(g, &T->nextn_eh_proj, &H->eh, err)) && !(rc = kr_open_attn(g, T, &H->L, err)) &&
        !(rc = kr_open_ffn(g, T, &H->L, err)) && T->nextn_shared_head_head.data)
        rc = kr_upload_mat(g, &T->nextn_shared_head_head, &H->own_lm, err);
    if (rc) { /* what was uploaded stays in g's arena until the model closes */
        free(H);
        return rc;
    }
    H->lm = T->nextn_shared_head_head.data ? &H->own_lm : &g->head;
    H->embd = T->nextn_embed_tokens.data ? &T->nextn_embed_tokens : &m->token_embd;
    g->nh = H;
    return 0;
}

int k_gpu_model_has_nextn(const k_gpu_model *g) { return g && g->nh; }
const char *k_gpu_model_nextn_refusal(const k_gpu_model *g) { return g ? g->nh_why : ""; }

/* The head's device state in a session, allocated on first use (priming
 * turned on, or a snapshot with the head's history restored): a session
 * that never drafts pays nothing for it. */
int kr_head_session(k_runner *r, ds4_error *err) {
    if (r->hrows) return 0;
    const ds4_model_config *c = &r->c;
    const int64_t E = c->n_embd;
    const size_t pool = (size_t)r->n_pages * (size_t)c->n_head_kv * K_ATTN_BLOCK * (size_t)c->head_dim * 2;
    if (!(r->hS.kpool = kr_dalloc(r, pool, err)) || !(r->hS.vpool = kr_dalloc(r, pool, err)) ||
        !(r->hin = kr_dalloc(r, F4(ROWS * 2 * E), err)) || !(r->hlog = kr_dalloc(r, F4(c->n_vocab), err)) ||
        !(r->hidx = kr_dalloc(r, 4 * (size_t)(1 + K_TOPK_MAX), err)) || !(r->hemb = kr_dalloc(r, F4(ROWS * E), err)) ||
        !(r->hcs = kr_dalloc(r, F4(ROWS * (c->n_rot / 2 > 0 ? c->n_rot / 2 : 1)), err)) ||
        !(r->hsn = kr_dalloc(r, F4(ROWS * (c->n_rot / 2 > 0 ? c->n_rot / 2 : 1)), err)) ||
        !(r->hrows = kr_dalloc(r, F4((ROWS + 1) * E), err)))
        return err->code;
    if (!(r->pend_tok = malloc(sizeof(int32_t) * ROWS))) return ds4_fail(err, DS4_ERR_NOMEM, "out of host memory");
    r->hemb_ok = r->nh->embd == &r->m->token_embd;
    return 0;
}

/* The launches of n head rows at positions p0.. (embedding rows in emb,
 * RoPE rows in cs/sn); hsrc: their h rows, n_embd floats apart. */
static int head_launches(k_runner *r, const float *emb, const float *hsrc, int64_t n, int64_t p0, int full,
                         ds4_error *err) {
    const dev_head *H = r->nh;
    dev_layer *L = (dev_layer *)&H->L; /* the layer helpers take it mutable; they do not write it */
    const int64_t E = r->c.n_embd, V = r->c.n_vocab;
    unsigned ready;
    int rc;
    mm_job eh = {&H->eh, r->h, E};
    if ((rc = kr_rmsnorm(r, emb, H->enorm, r->hin, E, n, E, 2 * E, err)) ||
        (rc = kr_rmsnorm(r, hsrc, H->hnorm, r->hin + E, E, n, E, 2 * E, err)) ||
        (rc = kr_matmul(r, r->hin, 2 * E, n, &eh, 1, 0, err)))
        return rc;
    const unsigned mix = kr_act_flag(&L->q) | kr_act_flag(&L->k) | kr_act_flag(&L->v);
    if ((rc = kr_pre_norm(r, 0, 0, n, L->attn_norm, mix, &ready, err)) ||
        (rc = kr_attn_layer(r, L, &r->hS, n, p0 - 1, ready, !full, err)) || !full)
        return rc;
    const unsigned ffn = L->is_moe ? L->moe.want : kr_act_flag(&L->ffn_gate) | kr_act_flag(&L->ffn_up);
    mm_job lm = {H->lm, r->hlog, V};
    if ((rc = kr_pre_norm(r, 1, 0, n, L->post_norm, ffn, &ready, err)) ||
        (rc = L->is_moe ? kr_moe_layer(r, L, n, ready, err) : kr_ffn_layer(r, L, n, ready, err)) ||
        (rc = kr_pre_norm(r, 1, 0, n, H->out_norm, kr_act_flag(H->lm) | K_NQ_X, &ready, err)) ||
        (rc = kr_matmul(r, r->x, E, n, &lm, 1, ready, err)))
        return rc;
    k_argmax_rows_params p = {K_TAG_OF(argmax_rows), (uint32_t)V, (uint32_t)n, (uint32_t)V, 0};
    k_binding b[] = {STATUS_BIND(argmax_rows), K_BIND(argmax_rows, p, &p, sizeof p),
                     K_BIND(argmax_rows, x, r->hlog, F4(n * V)),
                     K_BIND(argmax_rows, idx, r->hidx, 4 * (size_t)n * (1 + K_TOPK_MAX))};
    return kr_launch(r, K_ID_argmax_rows, (uint32_t)n, 1, 1, 1024, b, 4, err);
}

/* n head rows (tokens, h rows hsrc) at positions p0 >= 1: their K/V into
 * slots p0 - 1.., and with `full` (n == 1) the logits, the argmax (hidx)
 * and the output hidden (x row 0). emb: the rows' embeddings already on
 * the device with their RoPE rows in cs/sn (committed rows, hemb), or NULL:
 * dequantized here and uploaded with the RoPE rows. */
static int head_rows(k_runner *r, const int32_t *tokens, const float *emb, const float *hsrc, int64_t n, int64_t p0,
                     int full, ds4_error *err) {
    const ds4_model_config *c = &r->c;
    const ds4_tensor *embd = r->nh->embd;
    const int64_t E = c->n_embd, half = c->n_rot / 2;
    int rc;
    for (int64_t t = 0; t < n && !emb; t++)
        if ((rc = ds4_dequantize_row(r->isa, embd->type, embd->data + (size_t)tokens[t] * embd->row_bytes,
                                     r->h_stage + t * E, E, err)))
            return rc;
    if (!emb && r->dev->upload(r->dev, r->h, r->h_stage, F4(n * E)))
        return ds4_fail(err, DS4_ERR_INTERNAL, "%s upload: %s", r->dev->name, r->dev->err);
    if (!emb && half > 0) {
        ds4_rope_fill(c->n_rot, c->rope_base, 1, n, p0, r->h_cs, r->h_sn);
        if (r->dev->upload(r->dev, r->cs, r->h_cs, F4(n * half)) ||
            r->dev->upload(r->dev, r->sn, r->h_sn, F4(n * half)))
            return ds4_fail(err, DS4_ERR_INTERNAL, "%s upload: %s", r->dev->name, r->dev->err);
    }
    if (r->dev->step_begin && r->dev->step_begin(r->dev))
        return ds4_fail(err, DS4_ERR_INTERNAL, "%s step: %s", r->dev->name, r->dev->err);
    rc = head_launches(r, emb ? emb : r->h, hsrc, n, p0, full, err);
    if (r->dev->step_end && r->dev->step_end(r->dev) && !rc)
        rc = ds4_fail(err, DS4_ERR_INTERNAL, "%s step: %s", r->dev->name, r->dev->err);
    return rc;
}

/* Committed rows at positions p0 .. p0 + n - 1 (h rows: hrows [0, n);
 * embeddings in hemb rows [0, n) when hemb_ok and `rope` says their RoPE
 * rows are in cs/sn, else uploaded) into the head's KV, then the carry
 * moves to hrows row n. Position 0 has no h and is skipped. Rows must
 * continue or rewrite the head's history; past a gap the head is marked
 * empty (never covered again until a restore). */
static int commit_rows(k_runner *r, const int32_t *tokens, int64_t n, int64_t p0, int rope, ds4_error *err) {
    const int64_t E = r->c.n_embd, t0 = p0 == 0;
    /* the first row skipped: the kept rows sit one row off, so upload */
    const float *emb = r->hemb_ok && rope && !t0 ? r->hemb : NULL;
    int rc = 0;
    if (n > t0) rc = head_rows(r, tokens + t0, emb, r->hrows + t0 * E, n - t0, p0 + t0, 0, err);
#ifndef PLANT_HEAD_STALE_CARRY /* planted fault (test_nextn_head_drafts turns red): the carry never moves */
    if (!rc) rc = kr_copy_dev(r, r->hrows, r->hrows + n * E, F4(E), err);
#endif
    if (!rc) r->h_next = p0 + t0 <= (r->h_next > 1 ? r->h_next : 1) ? p0 + n : 0;
    return rc;
}

int kr_head_flush(k_runner *r, ds4_error *err) {
    const int64_t n = r->h_pend, half = r->c.n_rot / 2;
    r->chain_next = 0; /* its rows overwrite x */
    if (!n) return 0;
    int rc = 0;
    if (r->hemb_ok && half > 0 && !(rc = kr_copy_dev(r, r->cs, r->hcs, F4(n * half), err)))
        rc = kr_copy_dev(r, r->sn, r->hsn, F4(n * half), err);
    if (!rc) rc = commit_rows(r, r->pend_tok, n, r->h_pos, 1, err);
    if (!rc) r->h_pend = 0;
    return rc;
}

int kr_head_chunk_start(k_runner *r, int64_t n, ds4_error *err) {
    return !r->capturing && r->h_pend + n > ROWS ? kr_head_flush(r, err) : 0;
}

int kr_head_keep_embeddings(k_runner *r, int64_t n, int64_t pos0, ds4_error *err) {
    const int64_t E = r->c.n_embd, skip = !r->capturing && pos0 == 0; /* position 0 never reaches the head */
    if (!r->hemb_ok || n <= skip) return 0;
    const int64_t at = r->capturing ? 0 : r->h_pend;
    return kr_copy_dev(r, r->hemb + at * E, r->h + skip * E, F4((n - skip) * E), err);
}

int kr_head_prime_chunk(k_runner *r, const int32_t *tokens, int64_t n, int64_t pos0, ds4_error *err) {
    const int64_t E = r->c.n_embd, half = r->c.n_rot / 2, skip = pos0 == 0;
    if (!r->h_pend) r->h_pos = pos0 + skip;
    /* x row t is the h of position pos0 + t + 1: hrows row pos0 + t + 1 - h_pos */
    int rc = kr_copy_dev(r, r->hrows + (r->h_pend + 1 - skip) * E, r->x, F4(n * E), err);
    if (!rc && half > 0 && n > skip && !(rc = kr_copy_dev(r, r->hcs + r->h_pend * half, r->cs + skip * half,
                                                          F4((n - skip) * half), err)))
        rc = kr_copy_dev(r, r->hsn + r->h_pend * half, r->sn + skip * half, F4((n - skip) * half), err);
    if (rc) return rc;
    if (n > skip) memcpy(r->pend_tok + r->h_pend, tokens + skip, sizeof(int32_t) * (size_t)(n - skip));
    r->h_pend += n - skip;
    return 0;
}

int kr_head_commit_verify(k_runner *r, int64_t k, ds4_error *err) {
    /* the verify's RoPE rows are still in cs/sn: nothing ran since but its accept */
    return commit_rows(r, r->ver_tok, k, r->ver_pos, 1, err);
}

float *kr_hidden_row(k_runner *r) {
    return r->carry_ok && !r->ver_n ? r->hrows + r->h_pend * r->c.n_embd : r->x + r->last_row * r->c.n_embd;
}

/* ------------------------------------------------------------- API -- */

int k_runner_set_nextn_prime(k_runner *r, int on, ds4_error *err) {
    if (!r) return ds4_fail(err, DS4_ERR_ARG, "k_runner_set_nextn_prime: session is NULL");
    if (!on) {
        const int rc = r->prime ? kr_head_flush(r, err) : 0; /* the head keeps what it was given */
        if (rc) return rc;
        r->prime = 0;
        return ds4_ok(err);
    }
    if (!r->nh)
        return ds4_fail(err, DS4_ERR_UNSUPPORTED, "%s", r->gm->nh_why[0] ? r->gm->nh_why : "the model has no nextn head");
    if (r->n_past > 0 && !(r->carry_ok && !r->ver_n && r->h_next >= r->n_past))
        return ds4_fail(err, DS4_ERR_ARG,
                        "the session holds %lld positions the nextn head never saw: turn priming on before the "
                        "first eval, or restore a snapshot that carries the head's history",
                        (long long)r->n_past);
    const int rc = kr_head_session(r, err);
    if (rc) return rc;
    r->prime = 1;
    return ds4_ok(err);
}

int k_runner_nextn_prime(const k_runner *r) { return r && r->prime; }

int k_runner_nextn_covered(const k_runner *r) {
    if (!r || !r->prime || !r->carry_ok || r->ver_n || r->n_past < 1) return 0;
    /* deferred rows count: they continue the head's history and reach it before a draft */
    if (r->h_pend) return r->h_pos <= (r->h_next > 1 ? r->h_next : 1) && r->h_pos + r->h_pend >= r->n_past;
    return r->h_next >= r->n_past;
}

/* Why a draft chain of k steps cannot start at n_past (0: it can). */
static int chain_check(k_runner *r, int32_t last, int64_t k, ds4_error *err) {
    if (k < 1 || k >= K_RUNNER_VERIFY_MAX)
        return ds4_fail(err, DS4_ERR_ARG, "nextn head: %lld drafts asked, 1..%d allowed", (long long)k,
                        K_RUNNER_VERIFY_MAX - 1);
    if (!k_runner_nextn_covered(r))
        return ds4_fail(err, DS4_ERR_ARG, "nextn head: drafting at %lld needs the head primed with rows 1..%lld%s",
                        (long long)r->n_past, (long long)r->n_past - 1,
                        r->ver_n ? " and no verify waiting for its accept" : "");
    if (last < 0 || last >= r->c.n_vocab)
        return ds4_fail(err, DS4_ERR_ARG, "token %d is outside the vocabulary (%lld)", last, (long long)r->c.n_vocab);
    if (r->n_past + k > r->n_ctx)
        return ds4_fail(err, DS4_ERR_ARG, "%lld drafts at position %lld run past the context (%lld)", (long long)k,
                        (long long)r->n_past, (long long)r->n_ctx);
    return 0;
}

int k_runner_nextn_propose(k_runner *r, int32_t last, int64_t k, int32_t *out, ds4_error *err) {
    if (!r || !out) return ds4_fail(err, DS4_ERR_ARG, "k_runner_nextn_propose: session or out is NULL");
    int rc = chain_check(r, last, k, err);
    if (rc) return rc;
    const int64_t P = r->n_past;
    r->launches = 0;
    int32_t tok = last;
    rc = kr_head_flush(r, err);
    for (int64_t j = 0; j < k && !rc; j++) {
        /* step 1's h is the carry; later steps chain the head's own output,
         * still in x (nothing writes x before the step's g norm reads it) */
        rc = head_rows(r, &tok, NULL, j ? r->x : r->hrows, 1, P + j, 1, err);
        uint32_t idx;
        if (!rc && r->dev->download(r->dev, &idx, r->hidx, 4))
            rc = ds4_fail(err, DS4_ERR_INTERNAL, "%s download: %s", r->dev->name, r->dev->err);
        if (!rc) out[j] = tok = (int32_t)idx;
    }
    if (!rc) rc = kr_finish(r, err);
    /* the draft rows sit in slots past n_past - 1: the committed rows replace them */
    if (!rc) r->h_next = P + k;
    return rc;
}

/* One step of a draft chain whose tokens the host picks (rejection
 * sampling draws each draft from the head's distribution): step 0 is
 * (tok, the carry) at n_past, step j > 0 (tok: the draft of step j - 1,
 * the head's own output hidden still in x) at n_past + j, only right after
 * step j - 1. The step's logits (n_vocab floats) into logits. */
int k_runner_nextn_step(k_runner *r, int32_t tok, int64_t j, float *logits, ds4_error *err) {
    if (!r || !logits) return ds4_fail(err, DS4_ERR_ARG, "k_runner_nextn_step: session or logits is NULL");
    int rc;
    if (j == 0) {
        if ((rc = chain_check(r, tok, 1, err))) return rc;
    } else if (j != r->chain_next) {
        return ds4_fail(err, DS4_ERR_ARG,
                        "nextn step %lld must follow step %lld of the same chain with no other call between",
                        (long long)j, (long long)j - 1);
    } else if (tok < 0 || tok >= r->c.n_vocab) {
        return ds4_fail(err, DS4_ERR_ARG, "token %d is outside the vocabulary (%lld)", tok, (long long)r->c.n_vocab);
    } else if (j >= K_RUNNER_VERIFY_MAX - 1 || r->n_past + j >= r->n_ctx) {
        return ds4_fail(err, DS4_ERR_ARG, "nextn step %lld at position %lld: past the drafts a verify can take "
                        "or the context", (long long)j, (long long)r->n_past);
    }
    r->launches = 0;
    if (j == 0 && (rc = kr_head_flush(r, err))) return rc;
    rc = head_rows(r, &tok, NULL, j ? r->x : r->hrows, 1, r->n_past + j, 1, err);
    if (!rc && r->dev->download(r->dev, logits, r->hlog, F4(r->c.n_vocab)))
        rc = ds4_fail(err, DS4_ERR_INTERNAL, "%s download: %s", r->dev->name, r->dev->err);
    if (!rc) rc = kr_finish(r, err);
    if (rc) {
        r->chain_next = 0;
        return rc;
    }
    r->h_next = r->n_past + j + 1; /* draft rows in slots past n_past - 1, as k_runner_nextn_propose */
    r->chain_next = j + 1;
    return 0;
}
