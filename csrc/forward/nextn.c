/*
 * nextn.c — the nextn / MTP head (qwen35-spec.md §7; llama.cpp
 * src/models/qwen35.cpp and qwen35moe.cpp graph_mtp).
 *
 * A row is (token x, hidden h) at a position p, where h is the trunk's
 * post-final-norm hidden of position p-1 (or, when chaining drafts, the
 * head's own output of the previous row):
 *   e = RMSNorm(E[x]) * enorm      E = nextn.embed_tokens, else token_embd
 *   g = RMSNorm(h) * hnorm
 *   u = eh_proj [e ; g]            embedding first (spec pitfall 11)
 *   u += attn(attn_norm(u))        gated attention over the head's OWN KV
 *   u += ffn(post_attention_norm(u))   the trunk's kind (dense or MoE)
 *   hm = RMSNorm(u) * shared_head_norm (falls back to output_norm)
 *   logits = W hm                  W = shared_head_head, else the LM head
 * and hm is returned too (the next chained draft's h).
 *
 * Everything but the first three lines is the trunk's own code (matmul.c,
 * attention.c through ds4_attn_block, ffn.c, moe.c, norm.c) on the head's
 * block, so both precisions and batch invariance carry over unchanged: a
 * row's result depends only on its inputs and the head's KV before it,
 * never on how many rows share the call (nextn_eval over n rows equals n
 * one-row calls bit for bit).
 *
 * Positions. The head's KV is its own ds4_kv_layer (trunk page structure).
 * Entry i holds the row at position nextn_pos0 + i. An empty head takes its
 * first row at any position p >= 0 (llama.cpp's MTP context mirrors a fresh
 * sequence from position 1, since position 0 has no h; a caller may instead
 * give position 0 a zero h, as common/speculative.cpp's zero-initialised
 * pending h does). Later rows must be consecutive and may start at any
 * position up to the head's next one: rows at or after it replace the
 * head's KV from there (a rewind, as after a rejected draft). RoPE uses the
 * real position; attention runs over the KV entries, which is the same
 * thing since the entries are consecutive positions.
 */
#include "nextn.h"
#include "../error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const ds4_layer *head_of(const ds4_fwd *f) { return &f->m->layers[f->c.n_main]; }

/* The embedding table the head reads: its own if the file has one. */
static const ds4_tensor *head_embd(const ds4_fwd *f) {
    const ds4_layer *L = head_of(f);
    return L->nextn_embed_tokens.data ? &L->nextn_embed_tokens : &f->m->token_embd;
}

/* The LM head: shared_head_head, else the model's (output or token_embd). */
static const ds4_tensor *head_lm(const ds4_fwd *f) {
    const ds4_layer *L = head_of(f);
    return L->nextn_shared_head_head.data ? &L->nextn_shared_head_head : ds4_model_head(f->m);
}

static uint64_t tbytes(const ds4_tensor *t) {
    if (!t->data) return 0;
    uint64_t rows = 1;
    for (int d = 1; d < t->n_dims; d++) rows *= (uint64_t)t->ne[d];
    return rows * t->row_bytes;
}

/* The head's small F32 tensors, read once per chunk (the weight_bytes
 * counter, ds4.h). */
static uint64_t small_bytes(const ds4_layer *L) {
    return tbytes(&L->attn_norm) + tbytes(&L->post_attention_norm) + tbytes(&L->attn_q_norm) +
           tbytes(&L->attn_k_norm) + tbytes(&L->nextn_enorm) + tbytes(&L->nextn_hnorm) +
           tbytes(&L->nextn_shared_head_norm);
}

/* ------------------------------------------------------------- checks -- */

/* The loader bound every tensor with its shape and a type with kernels;
 * this re-checks what this file indexes memory by, so a model the head
 * cannot run is refused with a message instead of crashing. */
static int check_f32(const ds4_tensor *t, const char *what, int64_t n, ds4_error *err) {
    if (!t->data || t->type != DS4_TYPE_F32 || t->ne[0] < n)
        return ds4_fail(err, DS4_ERR_UNSUPPORTED,
                        "nextn head: %s is missing or not an F32 vector of %lld",
                        t->name ? t->name : what, (long long)n);
    return DS4_OK;
}

static int check_mat(const ds4_fwd *f, const ds4_tensor *t, const char *what, int64_t n_in,
                     int64_t n_out, ds4_error *err) {
    if (!t->data)
        return ds4_fail(err, DS4_ERR_UNSUPPORTED, "nextn head: no %s tensor", what);
    if (t->type < 0 || t->type >= DS4_TYPE_COUNT || !f->k->vec_dot_f32[t->type] ||
        !f->k->vec_dot[t->type] || !f->k->to_float[t->type])
        return ds4_fail(err, DS4_ERR_UNSUPPORTED, "nextn head: %s: no kernels for its type id %d",
                        t->name ? t->name : what, t->type);
    if (t->ne[0] != n_in || t->ne[1] < n_out)
        return ds4_fail(err, DS4_ERR_UNSUPPORTED,
                        "nextn head: %s is {%lld, %lld}, the head needs {%lld, %lld}",
                        t->name ? t->name : what, (long long)t->ne[0], (long long)t->ne[1],
                        (long long)n_in, (long long)n_out);
    return DS4_OK;
}

static int check_head(const ds4_fwd *f, ds4_error *err) {
    const ds4_model_config *c = &f->c;
    const ds4_layer *L = head_of(f);
    const int64_t E = c->n_embd, dh = c->head_dim, nh = c->n_head, nkv = c->n_head_kv;
    int rc;
    if ((rc = check_f32(&L->attn_norm, "attn_norm", E, err)) ||
        (rc = check_f32(&L->post_attention_norm, "post_attention_norm", E, err)) ||
        (rc = check_f32(&L->attn_q_norm, "attn_q_norm", dh, err)) ||
        (rc = check_f32(&L->attn_k_norm, "attn_k_norm", dh, err)) ||
        (rc = check_f32(&L->nextn_enorm, "nextn.enorm", E, err)) ||
        (rc = check_f32(&L->nextn_hnorm, "nextn.hnorm", E, err)) ||
        (rc = check_f32(&L->nextn_shared_head_norm, "nextn.shared_head_norm", E, err)) ||
        (rc = check_mat(f, &L->nextn_eh_proj, "nextn.eh_proj", 2 * E, E, err)) ||
        (rc = check_mat(f, head_embd(f), "embedding", E, c->n_vocab, err)) ||
        (rc = check_mat(f, head_lm(f), "LM head", E, c->n_vocab, err)) ||
        (rc = check_mat(f, &L->attn_q, "attn_q", E, 2 * nh * dh, err)) ||
        (rc = check_mat(f, &L->attn_k, "attn_k", E, nkv * dh, err)) ||
        (rc = check_mat(f, &L->attn_v, "attn_v", E, nkv * dh, err)) ||
        (rc = check_mat(f, &L->attn_output, "attn_output", nh * dh, E, err)))
        return rc;
    if (nkv < 1 || nh % nkv != 0 || c->n_rot % 2 != 0 || c->n_rot > dh || c->n_rot < 0)
        return ds4_fail(err, DS4_ERR_UNSUPPORTED,
                        "nextn head: attention shape not runnable: %lld heads, %lld kv heads, "
                        "rot %lld of %lld",
                        (long long)nh, (long long)nkv, (long long)c->n_rot, (long long)dh);
    if (c->arch != DS4_ARCH_QWEN35MOE)
        return (rc = check_mat(f, &L->ffn_gate, "ffn_gate", E, c->n_ff, err)) ||
                       (rc = check_mat(f, &L->ffn_up, "ffn_up", E, c->n_ff, err)) ||
                       (rc = check_mat(f, &L->ffn_down, "ffn_down", c->n_ff, E, err))
                   ? rc
                   : DS4_OK;
    const int64_t ne = c->n_expert, fe = c->n_ff_exp, fs = c->n_ff_shexp;
    if (ne < 1 || c->n_expert_used < 1 || c->n_expert_used > ne)
        return ds4_fail(err, DS4_ERR_UNSUPPORTED, "nextn head: MoE with %lld of %lld experts",
                        (long long)c->n_expert_used, (long long)ne);
    if ((rc = check_mat(f, &L->ffn_gate_inp, "ffn_gate_inp", E, ne, err))) return rc;
    const ds4_tensor *ex[3];
    if (L->ffn_gate_up_exps.data) {
        if ((rc = check_mat(f, &L->ffn_gate_up_exps, "ffn_gate_up_exps", E, 2 * fe, err)))
            return rc;
        ex[0] = ex[1] = &L->ffn_gate_up_exps;
    } else {
        if ((rc = check_mat(f, &L->ffn_gate_exps, "ffn_gate_exps", E, fe, err)) ||
            (rc = check_mat(f, &L->ffn_up_exps, "ffn_up_exps", E, fe, err)))
            return rc;
        ex[0] = &L->ffn_gate_exps;
        ex[1] = &L->ffn_up_exps;
    }
    if ((rc = check_mat(f, &L->ffn_down_exps, "ffn_down_exps", fe, E, err))) return rc;
    ex[2] = &L->ffn_down_exps;
    for (int i = 0; i < 3; i++)
        if (ex[i]->ne[2] < ne || ex[i]->expert_bytes < ex[i]->row_bytes * ex[i]->ne[1])
            return ds4_fail(err, DS4_ERR_UNSUPPORTED, "nextn head: %s does not hold %lld experts",
                            ex[i]->name ? ex[i]->name : "an expert tensor", (long long)ne);
    if (L->ffn_gate_shexp.data &&
        ((rc = check_mat(f, &L->ffn_gate_shexp, "ffn_gate_shexp", E, fs, err)) ||
         (rc = check_mat(f, &L->ffn_up_shexp, "ffn_up_shexp", E, fs, err)) ||
         (rc = check_mat(f, &L->ffn_down_shexp, "ffn_down_shexp", fs, E, err))))
        return rc;
    if (L->ffn_gate_shexp.data && L->ffn_gate_inp_shexp.data &&
        (rc = check_mat(f, &L->ffn_gate_inp_shexp, "ffn_gate_inp_shexp", E, 1, err)))
        return rc;
    return DS4_OK;
}

/* -------------------------------------------------------------- setup -- */

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* The largest quantized activation source one of the head's matmul jobs
 * needs (matmul.c; eh_proj reads rows of 2*n_embd, which no trunk matrix
 * does, and the head's matrices may have other types than the trunk's). */
static size_t head_act_source(const ds4_fwd *f) {
    const ds4_layer *L = head_of(f);
    const int64_t R = DS4_CHUNK_ROWS;
    const int64_t RK = R * (f->c.n_expert_used > 0 ? f->c.n_expert_used : 1);
    const ds4_tensor *ts[] = {&L->nextn_eh_proj, head_lm(f), &L->attn_q, &L->attn_k,
                              &L->attn_v, &L->attn_output, &L->ffn_gate, &L->ffn_up,
                              &L->ffn_down, &L->ffn_gate_inp, &L->ffn_gate_exps,
                              &L->ffn_up_exps, &L->ffn_gate_up_exps, &L->ffn_down_exps,
                              &L->ffn_gate_inp_shexp, &L->ffn_gate_shexp, &L->ffn_up_shexp,
                              &L->ffn_down_shexp};
    size_t mx = 0;
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        if (!ts[i]->data) continue;
        const int64_t rows = ts[i] == &L->ffn_down_exps ? RK : R;
        size_t b = (size_t)rows * ds4_mm_act_row_bytes(ts[i]->type, ts[i]->ne[0]);
        if (b > mx) mx = b;
    }
    return mx;
}

/* Grow the trunk's shared scratch where the head needs more than the trunk
 * (a trunk without attention layers, a wider activation source). */
static int grow_scratch(ds4_fwd *f, ds4_error *err) {
    const ds4_model_config *c = &f->c;
    const int64_t R = DS4_CHUNK_ROWS;
    const int64_t wpr = max64(ds4_attn_work_per_row(c), c->arch == DS4_ARCH_QWEN35MOE
                                                            ? ds4_moe_work_per_row(c)
                                                            : ds4_ffn_dense_work_per_row(c));
    if (wpr > f->work_per_row) {
        float *w = ds4_fwd_realloc(f, f->work, (size_t)(R * wpr) * sizeof(float));
        if (!w) return ds4_fail(err, DS4_ERR_NOMEM, "out of memory for the nextn head's scratch");
        f->work = w;
        f->work_per_row = wpr;
    }
    const int64_t tpf = ds4_attn_thread_floats(c);
    if (tpf > f->per_thread_floats) {
        float *t = ds4_fwd_realloc(f, f->thread_scratch,
                                   (size_t)(f->n_threads * tpf) * sizeof(float));
        if (!t) return ds4_fail(err, DS4_ERR_NOMEM, "out of memory for the nextn head's scratch");
        f->thread_scratch = t;
        f->per_thread_floats = tpf;
    }
    if (f->fast) {
        const size_t need = DS4_MM_SOURCES * head_act_source(f);
        if (need > f->mm_qcap) {
            uint8_t *q = ds4_fwd_realloc(f, f->mm_q, need);
            if (!q)
                return ds4_fail(err, DS4_ERR_NOMEM, "out of memory for the nextn head's scratch");
            f->mm_q = q;
            f->mm_qcap = need;
        }
    }
    return DS4_OK;
}

int ds4_nextn_init(ds4_fwd *f, ds4_error *err) {
    const ds4_model *m = f->m;
    const ds4_model_config *c = &f->c;
    f->nextn_ready = 0;
    if (c->n_nextn < 1 || c->n_layer_all <= c->n_main ||
        m->layers[c->n_main].kind != DS4_LAYER_NEXTN || !m->layers[c->n_main].nextn_eh_proj.data)
        return DS4_OK; /* no head: nextn calls say so */
    int rc;
    if ((rc = check_head(f, err)) || (rc = grow_scratch(f, err))) return rc;
    if ((rc = ds4_kv_layer_init(f, &f->nextn_kv, err))) return rc;
    f->nextn_cat = ds4_fwd_calloc(f, (size_t)(DS4_CHUNK_ROWS * 2 * c->n_embd), sizeof(float));
    if (!f->nextn_cat)
        return ds4_fail(err, DS4_ERR_NOMEM, "out of memory for the nextn head's scratch");
    f->nextn_ready = 1;
    return DS4_OK;
}

void ds4_nextn_free(ds4_fwd *f) {
    ds4_kv_layer_free(&f->nextn_kv);
    free(f->nextn_cat);
    free(f->nextn_logits);
    free(f->nextn_hbuf[0]);
    free(f->nextn_hbuf[1]);
    f->nextn_cat = f->nextn_logits = f->nextn_hidden = NULL;
    f->nextn_hbuf[0] = f->nextn_hbuf[1] = NULL;
    f->nextn_hcap[0] = f->nextn_hcap[1] = 0;
    f->nextn_cap_rows = f->nextn_n_rows = 0;
    f->nextn_pos0 = f->nextn_n_pos = 0;
    f->nextn_ready = 0;
}

/* Before writing entries [e0, n_entries) of the head: pages for
 * [0, n_entries), the written ones the session's own (copy-on-write of a
 * page a snapshot shares), decode split-K room for a row that sees
 * n_entries (kv.c, as for a trunk attention layer). */
static int head_reserve(ds4_fwd *f, int64_t e0, int64_t n_entries, ds4_error *err) {
    int rc;
    if ((rc = ds4_kv_parts_reserve(f, n_entries, err)) ||
        (rc = ds4_kv_layer_reserve(f, &f->nextn_kv, e0, n_entries, err))) {
        char msg[sizeof err->message];
        snprintf(msg, sizeof msg, "%s", err ? err->message : "");
        return ds4_fail(err, rc, "nextn head: %s", msg);
    }
    return DS4_OK;
}

/* Result room for n rows: logits, and the hidden buffer this call writes
 * (not the one the last call wrote, which may be this call's input). */
static int grow_results(ds4_fwd *f, int64_t n, int hb, ds4_error *err) {
    const ds4_model_config *c = &f->c;
    if (n > f->nextn_hcap[hb]) {
        float *h = ds4_fwd_malloc(f, (size_t)n * (size_t)c->n_embd * sizeof(float));
        if (!h) return ds4_fail(err, DS4_ERR_NOMEM, "out of memory for %lld nextn rows", (long long)n);
        free(f->nextn_hbuf[hb]);
        f->nextn_hbuf[hb] = h;
        f->nextn_hcap[hb] = n;
    }
    if (n > f->nextn_cap_rows) {
        float *lg = ds4_fwd_malloc(f, (size_t)n * (size_t)c->n_vocab * sizeof(float));
        if (!lg)
            return ds4_fail(err, DS4_ERR_NOMEM, "out of memory for %lld rows of nextn logits",
                            (long long)n);
        free(f->nextn_logits);
        f->nextn_logits = lg;
        f->nextn_cap_rows = n;
        f->nextn_n_rows = 0;
    }
    return DS4_OK;
}

/* ------------------------------------------------------------- chunk -- */

static void add_rows(float *h, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) h[i] += y[i];
}

/* n <= DS4_CHUNK_ROWS rows at positions pos.., KV entries e0.. */
static void head_chunk(ds4_fwd *f, const int32_t *tokens, const float *hid, int64_t n,
                       int64_t pos, int64_t e0, float *logits, float *hidden) {
    const ds4_model_config *c = &f->c;
    const ds4_layer *L = head_of(f);
    const int64_t E = c->n_embd;
    const float eps = c->rms_eps;
    const ds4_tensor *et = head_embd(f);
    ds4_to_float_fn emb = f->k->to_float[et->type];
    const float *en = (const float *)L->nextn_enorm.data;
    const float *hn = (const float *)L->nextn_hnorm.data;
    /* Every hidden row is read here, before anything is written. */
    for (int64_t t = 0; t < n; t++) {
        float *cat = f->nextn_cat + t * 2 * E;
        emb(et->data + (size_t)tokens[t] * et->row_bytes, f->x + t * E, E);
        ds4_rmsnorm(f->x + t * E, en, cat, E, eps);
        ds4_rmsnorm(hid + t * E, hn, cat + E, E, eps);
    }
    f->cnt.weight_bytes += (uint64_t)n * et->row_bytes + small_bytes(L);
    ds4_mm_job eh = ds4_mm(&L->nextn_eh_proj, 0, 0, E, f->nextn_cat, 2 * E, f->h, E, n);
    ds4_matmul(f, &eh, 1);

    /* The decoder block, as a trunk attention layer (forward.c). */
    if (c->n_rot > 0) ds4_rope_tables(f, n, pos);
    const float *an = (const float *)L->attn_norm.data;
    for (int64_t t = 0; t < n; t++) ds4_rmsnorm(f->h + t * E, an, f->x + t * E, E, eps);
    ds4_attn_block(f, L, &f->nextn_kv, n, e0);
    add_rows(f->h, f->y, n * E);
    const float *pn = (const float *)L->post_attention_norm.data;
    for (int64_t t = 0; t < n; t++) ds4_rmsnorm(f->h + t * E, pn, f->x + t * E, E, eps);
    if (c->arch == DS4_ARCH_QWEN35MOE)
        ds4_ffn_moe(f, L, n);
    else
        ds4_ffn_dense(f, L, n);
    add_rows(f->h, f->y, n * E);

    const float *sn = (const float *)L->nextn_shared_head_norm.data;
    for (int64_t t = 0; t < n; t++) ds4_rmsnorm(f->h + t * E, sn, hidden + t * E, E, eps);
    ds4_mm_job head = ds4_mm(head_lm(f), 0, 0, c->n_vocab, hidden, E, logits, c->n_vocab, n);
    ds4_matmul(f, &head, 1);
}

/* KV-only rows (nextn.h, DS4_NEXTN_OUT_KV): head_chunk up to the head's
 * K/V store, then nothing. Every step repeats head_chunk's and
 * ds4_attn_block's float operations on the same rows in the same order
 * (rope() is attention.c's rotation, verbatim), so the entries equal the
 * ones a full call writes bit for bit (tests/test_nextn_prime.py). */
static void rope(float *x, const float *cs, const float *sn, int64_t half) {
    for (int64_t i = 0; i < half; i++) {
        const float lo = x[i], hi = x[i + half];
        x[i] = lo * cs[i] + (-hi) * sn[i];
        x[i + half] = hi * cs[i] + lo * sn[i];
    }
}

static void head_kv_chunk(ds4_fwd *f, const int32_t *tokens, const float *hid, int64_t n,
                          int64_t pos, int64_t e0) {
    const ds4_model_config *c = &f->c;
    const ds4_layer *L = head_of(f);
    const int64_t E = c->n_embd, dh = c->head_dim, nkv = c->n_head_kv;
    const int64_t kv_dim = nkv * dh, half = c->n_rot / 2;
    const float eps = c->rms_eps;
    const ds4_tensor *et = head_embd(f);
    ds4_to_float_fn emb = f->k->to_float[et->type];
    const float *en = (const float *)L->nextn_enorm.data;
    const float *hn = (const float *)L->nextn_hnorm.data;
    for (int64_t t = 0; t < n; t++) {
        float *cat = f->nextn_cat + t * 2 * E;
        emb(et->data + (size_t)tokens[t] * et->row_bytes, f->x + t * E, E);
        ds4_rmsnorm(f->x + t * E, en, cat, E, eps);
        ds4_rmsnorm(hid + t * E, hn, cat + E, E, eps);
    }
    f->cnt.weight_bytes += (uint64_t)n * et->row_bytes + tbytes(&L->nextn_enorm) +
                           tbytes(&L->nextn_hnorm) + tbytes(&L->attn_norm) +
                           tbytes(&L->attn_k_norm);
    ds4_mm_job eh = ds4_mm(&L->nextn_eh_proj, 0, 0, E, f->nextn_cat, 2 * E, f->h, E, n);
    ds4_matmul(f, &eh, 1);
    if (c->n_rot > 0) ds4_rope_tables(f, n, pos);
    const float *an = (const float *)L->attn_norm.data;
    for (int64_t t = 0; t < n; t++) ds4_rmsnorm(f->h + t * E, an, f->x + t * E, E, eps);
    /* f->work holds at least ds4_attn_work_per_row floats per row (grow_scratch) */
    float *wk = f->work, *wv = f->work + DS4_CHUNK_ROWS * kv_dim;
    ds4_mm_job jobs[2] = {
        ds4_mm(&L->attn_k, 0, 0, kv_dim, f->x, E, wk, kv_dim, n),
        ds4_mm(&L->attn_v, 0, 0, kv_dim, f->x, E, wv, kv_dim, n),
    };
    ds4_matmul(f, jobs, 2);
    const float *kn = (const float *)L->attn_k_norm.data;
    ds4_from_float_fn store = f->k->from_float[f->kv_type];
    for (int64_t t = 0; t < n; t++) {
        const float *cs = f->rope_cos + t * half, *sn = f->rope_sin + t * half;
        for (int64_t h = 0; h < nkv; h++) {
            float *k = wk + t * kv_dim + h * dh;
            ds4_rmsnorm(k, kn, k, dh, eps);
            rope(k, cs, sn, half);
            store(k, ds4_kv_row(f, f->nextn_kv.k, h, e0 + t), dh);
            store(wv + t * kv_dim + h * dh, ds4_kv_row(f, f->nextn_kv.v, h, e0 + t), dh);
        }
    }
}

/* -------------------------------------------------------------- eval -- */

/* Where the head's KV starts after rows from p0: an empty head, or a row
 * at or before its first position, starts it afresh at p0; otherwise rows
 * continue (or rewind into) it. */
static int64_t head_base(const ds4_fwd *f, int64_t p0) {
    const int empty = f->nextn_n_pos <= f->nextn_pos0;
    return (empty || p0 <= f->nextn_pos0) ? p0 : f->nextn_pos0;
}

int ds4_nextn_prepare(ds4_fwd *f, int64_t p0, int64_t n, int out, ds4_error *err) {
    if (!f->nextn_ready)
        return ds4_fail(err, DS4_ERR_UNSUPPORTED,
                        "the model has no nextn (MTP) head: its file bundles none and no "
                        "draft_head was given");
    if (n <= 0)
        return ds4_fail(err, DS4_ERR_ARG, "nextn eval needs at least one row (got %lld)",
                        (long long)n);
    if (out != DS4_NEXTN_OUT_KV && out != DS4_NEXTN_OUT_ALL)
        return ds4_fail(err, DS4_ERR_ARG, "nextn eval: output mode %d is not DS4_NEXTN_OUT_KV (0) "
                        "or DS4_NEXTN_OUT_ALL (1)", out);
    if (p0 < 0)
        return ds4_fail(err, DS4_ERR_ARG, "nextn row 0 has position %lld < 0", (long long)p0);
    if (p0 > f->n_ctx - n)
        return ds4_fail(err, DS4_ERR_ARG,
                        "nextn rows at positions %lld..%lld do not fit n_ctx %lld",
                        (long long)p0, (long long)(p0 + n - 1), (long long)f->n_ctx);
    const int empty = f->nextn_n_pos <= f->nextn_pos0;
    if (!empty && p0 > f->nextn_n_pos)
        return ds4_fail(err, DS4_ERR_ARG,
                        "nextn row 0 is at position %lld, past the head's next position %lld "
                        "(its KV holds positions %lld..%lld; rows must continue it or rewind "
                        "into it)",
                        (long long)p0, (long long)f->nextn_n_pos, (long long)f->nextn_pos0,
                        (long long)(f->nextn_n_pos - 1));
    const int64_t e0 = p0 - head_base(f, p0);
    const int hb = f->nextn_hidden == f->nextn_hbuf[0] ? 1 : 0;
    int rc;
    if ((rc = head_reserve(f, e0, e0 + n, err)) ||
        (out == DS4_NEXTN_OUT_ALL && (rc = grow_results(f, n, hb, err))))
        return rc;
    return DS4_OK;
}

void ds4_nextn_run(ds4_fwd *f, const int32_t *tokens, const float *hiddens, int64_t p0,
                   int64_t n, int out) {
    const ds4_model_config *c = &f->c;
    const int64_t E = c->n_embd;
    const int64_t base = head_base(f, p0), e0 = p0 - base;
    const int hb = f->nextn_hidden == f->nextn_hbuf[0] ? 1 : 0;
    float *hid_out = f->nextn_hbuf[hb];
    f->nextn_pos0 = base;
    f->nextn_n_pos = p0; /* rows past p0 are being replaced */
    for (int64_t c0 = 0; c0 < n; c0 += DS4_CHUNK_ROWS) {
        const int64_t cn = n - c0 < DS4_CHUNK_ROWS ? n - c0 : DS4_CHUNK_ROWS;
        if (out == DS4_NEXTN_OUT_KV)
            head_kv_chunk(f, tokens + c0, hiddens + c0 * E, cn, p0 + c0, e0 + c0);
        else
            head_chunk(f, tokens + c0, hiddens + c0 * E, cn, p0 + c0, e0 + c0,
                       f->nextn_logits + c0 * c->n_vocab, hid_out + c0 * E);
    }
    f->nextn_n_pos = p0 + n;
    if (out == DS4_NEXTN_OUT_KV) {
        /* No results; the last call's hidden rows stay where they are. */
        f->nextn_n_rows = 0;
        return;
    }
    f->nextn_hidden = hid_out;
    f->nextn_n_rows = n;
}

int ds4_nextn_eval(ds4_fwd *f, const int32_t *tokens, const float *hiddens,
                   const int64_t *positions, int64_t n, ds4_error *err) {
    return ds4_nextn_eval_out(f, tokens, hiddens, positions, n, DS4_NEXTN_OUT_ALL, err);
}

int ds4_nextn_eval_out(ds4_fwd *f, const int32_t *tokens, const float *hiddens,
                       const int64_t *positions, int64_t n, int out, ds4_error *err) {
    const ds4_model_config *c = &f->c;
    if (!f->nextn_ready || n <= 0) return ds4_nextn_prepare(f, 0, n, out, err);
    if (!tokens || !hiddens || !positions)
        return ds4_fail(err, DS4_ERR_ARG, "nextn eval: tokens, hiddens and positions are needed");
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->n_vocab)
            return ds4_fail(err, DS4_ERR_ARG, "token id %d at row %lld is out of range [0, %lld)",
                            tokens[i], (long long)i, (long long)c->n_vocab);
    const int64_t p0 = positions[0];
    for (int64_t i = 1; i < n; i++)
        if (positions[i] != p0 + i)
            return ds4_fail(err, DS4_ERR_ARG,
                            "nextn rows must have consecutive positions: row %lld has %lld, "
                            "expected %lld",
                            (long long)i, (long long)positions[i], (long long)(p0 + i));
    int rc = ds4_nextn_prepare(f, p0, n, out, err);
    if (rc) return rc;
    /* Nothing below can fail. */
    ds4_nextn_run(f, tokens, hiddens, p0, n, out);
    return ds4_ok(err);
}
