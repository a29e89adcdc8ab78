/*
 * forward.c — per-session forward state, and the layer loop of one chunk
 * (qwen35-spec.md §6): embedding, for each trunk layer
 * h += mixer(norm(h)); h += ffn(norm(h)), then the final norm and the head.
 */
#include "forward.h"
#include "../error.h"

#include <math.h>
#include <stdlib.h>

/* ------------------------------------------------------------ checks -- */
/* The loader validates names and shapes; these re-check what this file
 * relies on to index memory, so a model the math cannot run is refused
 * here with a message instead of being run into a crash. */

static int need_present(const ds4_tensor *t, const char *what, int64_t il, ds4_error *err) {
    if (t->data) return DS4_OK;
    return ds4_fail(err, DS4_ERR_UNSUPPORTED, "layer %lld has no %s tensor", (long long)il, what);
}

static int need_f32(const ds4_tensor *t, const char *what, int64_t il, int64_t n,
                    ds4_error *err) {
    int rc = need_present(t, what, il, err);
    if (rc) return rc;
    if (t->type != DS4_TYPE_F32)
        return ds4_fail(err, DS4_ERR_UNSUPPORTED, "%s must be F32 for the forward pass, not %s",
                        t->name ? t->name : what, ds4_type_traits_table[t->type].name);
    int64_t ne = 1;
    for (int d = 0; d < t->n_dims; d++) ne *= t->ne[d];
    if (ne < n)
        return ds4_fail(err, DS4_ERR_UNSUPPORTED, "%s has %lld elements, the forward pass needs %lld",
                        t->name ? t->name : what, (long long)ne, (long long)n);
    return DS4_OK;
}

static int need_matrix(const ds4_fwd *f, const ds4_tensor *t, const char *what, int64_t il,
                       int64_t n_in, int64_t n_out, ds4_error *err) {
    int rc = need_present(t, what, il, err);
    if (rc) return rc;
    if (t->type < 0 || t->type >= DS4_TYPE_COUNT || !f->k->vec_dot_f32[t->type])
        return ds4_fail(err, DS4_ERR_UNSUPPORTED, "%s: no dot kernel for its type id %d",
                        t->name ? t->name : what, t->type);
    if (t->ne[0] != n_in || t->ne[1] < n_out)
        return ds4_fail(err, DS4_ERR_UNSUPPORTED,
                        "%s is {%lld, %lld}, the forward pass needs {%lld, %lld}",
                        t->name ? t->name : what, (long long)t->ne[0], (long long)t->ne[1],
                        (long long)n_in, (long long)n_out);
    return DS4_OK;
}

static int check_model(const ds4_fwd *f, ds4_error *err) {
    const ds4_model_config *c = &f->c;
    const ds4_model *m = f->m;
    const int64_t E = c->n_embd;
    int rc;
    if (c->n_main < 1 || E < 1 || c->n_vocab < 1)
        return ds4_fail(err, DS4_ERR_UNSUPPORTED, "model has no trunk to run");
    if (!m->token_embd.data || !f->k->to_float[m->token_embd.type] || m->token_embd.ne[0] != E ||
        m->token_embd.ne[1] < c->n_vocab)
        return ds4_fail(err, DS4_ERR_UNSUPPORTED, "token_embd cannot be read as %lld rows of %lld",
                        (long long)c->n_vocab, (long long)E);
    if ((rc = need_f32(&m->output_norm, "output_norm", -1, E, err)) ||
        (rc = need_matrix(f, ds4_model_head(m), "output", -1, E, c->n_vocab, err)))
        return rc;
    int has_gdn = 0, has_attn = 0;
    for (int64_t il = 0; il < c->n_main; il++) {
        const ds4_layer *L = &m->layers[il];
        if ((rc = need_f32(&L->attn_norm, "attn_norm", il, E, err)) ||
            (rc = need_f32(&L->post_attention_norm, "post_attention_norm", il, E, err)))
            return rc;
        if (L->kind == DS4_LAYER_GDN) {
            has_gdn = 1;
            const int64_t dk = c->ssm_d_state, nk = c->ssm_n_k, nv = c->ssm_n_v;
            const int64_t cd = 2 * nk * dk + c->ssm_d_inner;
            if ((rc = need_matrix(f, &L->attn_qkv, "attn_qkv", il, E, cd, err)) ||
                (rc = need_matrix(f, &L->attn_gate, "attn_gate", il, E, c->ssm_d_inner, err)) ||
                (rc = need_matrix(f, &L->ssm_beta, "ssm_beta", il, E, nv, err)) ||
                (rc = need_matrix(f, &L->ssm_alpha, "ssm_alpha", il, E, nv, err)) ||
                (rc = need_matrix(f, &L->ssm_out, "ssm_out", il, c->ssm_d_inner, E, err)) ||
                (rc = need_f32(&L->ssm_conv1d, "ssm_conv1d", il, cd * c->ssm_conv_kernel, err)) ||
                (rc = need_f32(&L->ssm_a, "ssm_a", il, nv, err)) ||
                (rc = need_f32(&L->ssm_dt_bias, "ssm_dt.bias", il, nv, err)) ||
                (rc = need_f32(&L->ssm_norm, "ssm_norm", il, dk, err)))
                return rc;
        } else if (L->kind == DS4_LAYER_ATTN) {
            has_attn = 1;
            const int64_t dh = c->head_dim, nh = c->n_head, nkv = c->n_head_kv;
            if ((rc = need_matrix(f, &L->attn_q, "attn_q", il, E, 2 * nh * dh, err)) ||
                (rc = need_matrix(f, &L->attn_k, "attn_k", il, E, nkv * dh, err)) ||
                (rc = need_matrix(f, &L->attn_v, "attn_v", il, E, nkv * dh, err)) ||
                (rc = need_matrix(f, &L->attn_output, "attn_output", il, nh * dh, E, err)) ||
                (rc = need_f32(&L->attn_q_norm, "attn_q_norm", il, dh, err)) ||
                (rc = need_f32(&L->attn_k_norm, "attn_k_norm", il, dh, err)))
                return rc;
        } else {
            return ds4_fail(err, DS4_ERR_UNSUPPORTED, "trunk layer %lld is not GDN or attention",
                            (long long)il);
        }
        if (c->arch == DS4_ARCH_QWEN35MOE) {
            const int64_t ne = c->n_expert, fe = c->n_ff_exp, fs = c->n_ff_shexp;
            if ((rc = need_matrix(f, &L->ffn_gate_inp, "ffn_gate_inp", il, E, ne, err)))
                return rc;
            if (L->ffn_gate_up_exps.data) {
                if ((rc = need_matrix(f, &L->ffn_gate_up_exps, "ffn_gate_up_exps", il, E, 2 * fe,
                                      err)))
                    return rc;
            } else if ((rc = need_matrix(f, &L->ffn_gate_exps, "ffn_gate_exps", il, E, fe, err)) ||
                       (rc = need_matrix(f, &L->ffn_up_exps, "ffn_up_exps", il, E, fe, err))) {
                return rc;
            }
            if ((rc = need_matrix(f, &L->ffn_down_exps, "ffn_down_exps", il, fe, E, err)))
                return rc;
            const ds4_tensor *ex[3] = {L->ffn_gate_up_exps.data ? &L->ffn_gate_up_exps
                                                                : &L->ffn_gate_exps,
                                       L->ffn_gate_up_exps.data ? &L->ffn_gate_up_exps
                                                                : &L->ffn_up_exps,
                                       &L->ffn_down_exps};
            for (int i = 0; i < 3; i++)
                if (ex[i]->ne[2] < ne || ex[i]->expert_bytes < ex[i]->row_bytes * ex[i]->ne[1])
                    return ds4_fail(err, DS4_ERR_UNSUPPORTED,
                                    "%s does not hold %lld experts", ex[i]->name ? ex[i]->name : "an expert tensor",
                                    (long long)ne);
            if (L->ffn_gate_shexp.data &&
                ((rc = need_matrix(f, &L->ffn_gate_shexp, "ffn_gate_shexp", il, E, fs, err)) ||
                 (rc = need_matrix(f, &L->ffn_up_shexp, "ffn_up_shexp", il, E, fs, err)) ||
                 (rc = need_matrix(f, &L->ffn_down_shexp, "ffn_down_shexp", il, fs, E, err))))
                return rc;
            if (L->ffn_gate_shexp.data && L->ffn_gate_inp_shexp.data &&
                (rc = need_matrix(f, &L->ffn_gate_inp_shexp, "ffn_gate_inp_shexp", il, E, 1, err)))
                return rc;
        } else if ((rc = need_matrix(f, &L->ffn_gate, "ffn_gate", il, E, c->n_ff, err)) ||
                   (rc = need_matrix(f, &L->ffn_up, "ffn_up", il, E, c->n_ff, err)) ||
                   (rc = need_matrix(f, &L->ffn_down, "ffn_down", il, c->n_ff, E, err))) {
            return rc;
        }
    }
    if (has_gdn) {
        if (c->ssm_conv_kernel < 1 || c->ssm_conv_kernel > 16)
            return ds4_fail(err, DS4_ERR_UNSUPPORTED, "ssm.conv_kernel %lld is outside 1..16",
                            (long long)c->ssm_conv_kernel);
        if (c->ssm_n_k < 1 || c->ssm_n_v % c->ssm_n_k != 0 ||
            c->ssm_d_inner != c->ssm_n_v * c->ssm_d_state)
            return ds4_fail(err, DS4_ERR_UNSUPPORTED,
                            "GDN heads do not tile: n_k %lld, n_v %lld, d_state %lld, inner %lld",
                            (long long)c->ssm_n_k, (long long)c->ssm_n_v,
                            (long long)c->ssm_d_state, (long long)c->ssm_d_inner);
    }
    if (has_attn) {
        if (c->n_head_kv < 1 || c->n_head % c->n_head_kv != 0 || c->n_rot % 2 != 0 ||
            c->n_rot > c->head_dim || c->n_rot < 0)
            return ds4_fail(err, DS4_ERR_UNSUPPORTED,
                            "attention shape not runnable: %lld heads, %lld kv heads, rot %lld of %lld",
                            (long long)c->n_head, (long long)c->n_head_kv, (long long)c->n_rot,
                            (long long)c->head_dim);
    }
    if (c->arch == DS4_ARCH_QWEN35MOE &&
        (c->n_expert < 1 || c->n_expert_used < 1 || c->n_expert_used > c->n_expert))
        return ds4_fail(err, DS4_ERR_UNSUPPORTED, "MoE with %lld of %lld experts is not runnable",
                        (long long)c->n_expert_used, (long long)c->n_expert);
    return DS4_OK;
}

/* -------------------------------------------------------------- setup -- */

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

int ds4_fwd_init(ds4_fwd *f, const ds4_model *m, int kv_type, ds4_error *err) {
    memset(f, 0, sizeof *f);
    f->m = m;
    f->c = m->cfg;
    f->precision = m->params.precision;
    f->n_ctx = m->params.n_ctx;
    f->n_threads = m->params.n_threads < 1 ? 1 : m->params.n_threads;
    f->kv_type = kv_type;
    f->k = ds4_kernels_for(DS4_ISA_AUTO);
    if (!f->k) return ds4_fail(err, DS4_ERR_UNSUPPORTED, "no kernel set for this CPU");
    if (kv_type != DS4_TYPE_F32 && kv_type != DS4_TYPE_F16)
        return ds4_fail(err, DS4_ERR_UNSUPPORTED, "KV cache type id %d is not supported", kv_type);
    f->kv_elem_bytes = kv_type == DS4_TYPE_F32 ? 4 : 2;
    if (f->n_ctx < 1) return ds4_fail(err, DS4_ERR_ARG, "n_ctx %lld < 1", (long long)f->n_ctx);

    int rc = check_model(f, err);
    if (rc) return rc;

    const ds4_model_config *c = &f->c;
    const int64_t R = DS4_CHUNK_ROWS, E = c->n_embd;
    int64_t wpr = 0, tpf = 1;
    for (int64_t il = 0; il < c->n_main; il++) {
        if (m->layers[il].kind == DS4_LAYER_GDN) {
            wpr = max64(wpr, ds4_gdn_work_per_row(c));
            tpf = max64(tpf, ds4_gdn_thread_floats(c));
        } else {
            wpr = max64(wpr, ds4_attn_work_per_row(c));
            tpf = max64(tpf, ds4_attn_thread_floats(c));
        }
    }
    wpr = max64(wpr, c->arch == DS4_ARCH_QWEN35MOE ? ds4_moe_work_per_row(c)
                                                   : ds4_ffn_dense_work_per_row(c));
    f->work_per_row = wpr;
    f->per_thread_floats = tpf;

    const int64_t half = c->n_rot / 2 > 0 ? c->n_rot / 2 : 1;
    const int64_t ku = c->n_expert_used > 0 ? c->n_expert_used : 1;
    f->h = calloc((size_t)(R * E), sizeof(float));
    f->x = calloc((size_t)(R * E), sizeof(float));
    f->y = calloc((size_t)(R * E), sizeof(float));
    f->work = calloc((size_t)(R * wpr), sizeof(float));
    f->rope_cos = calloc((size_t)(R * half), sizeof(float));
    f->rope_sin = calloc((size_t)(R * half), sizeof(float));
    f->thread_scratch = calloc((size_t)(f->n_threads * tpf), sizeof(float));
    f->kv = calloc((size_t)c->n_main, sizeof *f->kv);
    f->gdn = calloc((size_t)c->n_main, sizeof *f->gdn);
    f->moe_sel = calloc((size_t)(R * ku), sizeof(int32_t));
    f->moe_w = calloc((size_t)(R * ku), sizeof(float));
    f->moe_idx = calloc((size_t)(R * ku), sizeof(int32_t));
    f->moe_src = calloc((size_t)(R * ku), sizeof(int32_t));
    f->moe_off = calloc((size_t)(c->n_expert + 1), sizeof(int64_t));
    f->moe_jobs = calloc((size_t)(2 * c->n_expert + 4), sizeof(ds4_mm_job));
    if (!f->h || !f->x || !f->y || !f->work || !f->rope_cos || !f->rope_sin ||
        !f->thread_scratch || !f->kv || !f->gdn || !f->moe_sel || !f->moe_w || !f->moe_idx ||
        !f->moe_src || !f->moe_off || !f->moe_jobs) {
        ds4_fwd_free(f);
        return ds4_fail(err, DS4_ERR_NOMEM, "out of memory for the forward scratch");
    }
    if ((rc = ds4_kv_init(f, err))) {
        ds4_fwd_free(f);
        return rc;
    }
    const int64_t cd = 2 * c->ssm_n_k * c->ssm_d_state + c->ssm_d_inner;
    for (int64_t il = 0; il < c->n_main; il++) {
        if (m->layers[il].kind != DS4_LAYER_GDN) continue;
        /* Recurrent state starts at zero (spec §3). */
        f->gdn[il].conv = calloc((size_t)((c->ssm_conv_kernel - 1) * cd) + 1, sizeof(float));
        f->gdn[il].ssm = calloc((size_t)(c->ssm_n_v * c->ssm_d_state * c->ssm_d_state),
                                sizeof(float));
        if (!f->gdn[il].conv || !f->gdn[il].ssm) {
            ds4_fwd_free(f);
            return ds4_fail(err, DS4_ERR_NOMEM, "out of memory for the recurrent state of layer %lld",
                            (long long)il);
        }
    }
    if ((rc = ds4_pool_new(f->n_threads, &f->pool, err))) {
        ds4_fwd_free(f);
        return rc;
    }
    return ds4_ok(err);
}

void ds4_fwd_free(ds4_fwd *f) {
    ds4_pool_free(f->pool);
    ds4_kv_free(f);
    if (f->gdn)
        for (int64_t il = 0; il < f->c.n_main; il++) {
            free(f->gdn[il].conv);
            free(f->gdn[il].ssm);
        }
    free(f->gdn);
    free(f->kv);
    free(f->h);
    free(f->x);
    free(f->y);
    free(f->work);
    free(f->rope_cos);
    free(f->rope_sin);
    free(f->thread_scratch);
    free(f->attn_part);
    free(f->moe_sel);
    free(f->moe_w);
    free(f->moe_idx);
    free(f->moe_src);
    free(f->moe_off);
    free(f->moe_jobs);
    memset(f, 0, sizeof *f);
}

/* ------------------------------------------------------------- chunk -- */

/* cos/sin of the rotated pairs at each row's position, shared by every
 * attention layer. Text tokens have t = h = w = pos, so the IMROPE
 * sections collapse to plain NEOX RoPE at pos (spec §4.3). The frequency is
 * computed as transformers does (Qwen3_5TextRotaryEmbedding): inv_freq_i =
 * 1 / base^(2i/n_rot) in float32, angle = float(pos) * inv_freq_i; ggml
 * builds it by repeated multiplication instead (a rounding difference). */
static void rope_tables(ds4_fwd *f, int64_t n, int64_t pos0) {
    const int64_t half = f->c.n_rot / 2;
    const float base = f->c.rope_base;
    for (int64_t i = 0; i < half; i++) {
        const float expo = (float)(2 * i) / (float)f->c.n_rot;
        const float inv = 1.0f / powf(base, expo);
        for (int64_t t = 0; t < n; t++) {
            const float a = (float)(pos0 + t) * inv;
            f->rope_cos[t * half + i] = cosf(a);
            f->rope_sin[t * half + i] = sinf(a);
        }
    }
}

static void add_rows(float *h, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) h[i] += y[i];
}

void ds4_fwd_chunk(ds4_fwd *f, const int32_t *tokens, int64_t n, int64_t pos0,
                   int64_t out_row0, float *logits, float *hidden) {
    const ds4_model *m = f->m;
    const ds4_model_config *c = &f->c;
    const int64_t E = c->n_embd;
    const float eps = c->rms_eps;

    ds4_to_float_fn emb = f->k->to_float[m->token_embd.type];
    for (int64_t t = 0; t < n; t++)
        emb(m->token_embd.data + (size_t)tokens[t] * m->token_embd.row_bytes, f->h + t * E, E);
    if (c->n_rot > 0) rope_tables(f, n, pos0);

    for (int64_t il = 0; il < c->n_main; il++) {
        const ds4_layer *L = &m->layers[il];
        const float *an = (const float *)L->attn_norm.data;
        for (int64_t t = 0; t < n; t++) ds4_rmsnorm(f->h + t * E, an, f->x + t * E, E, eps);
        if (L->kind == DS4_LAYER_GDN)
            ds4_gdn_layer(f, il, n);
        else
            ds4_attn_layer(f, il, n, pos0);
        add_rows(f->h, f->y, n * E);

        const float *pn = (const float *)L->post_attention_norm.data;
        for (int64_t t = 0; t < n; t++) ds4_rmsnorm(f->h + t * E, pn, f->x + t * E, E, eps);
        if (c->arch == DS4_ARCH_QWEN35MOE)
            ds4_ffn_moe(f, L, n);
        else
            ds4_ffn_dense(f, L, n);
        add_rows(f->h, f->y, n * E);
    }

    if (out_row0 >= n) return;
    const int64_t n_out = n - out_row0;
    const float *on = (const float *)m->output_norm.data;
    for (int64_t t = out_row0; t < n; t++)
        ds4_rmsnorm(f->h + t * E, on, hidden + (t - out_row0) * E, E, eps);
    ds4_mm_job head = ds4_mm(ds4_model_head(m), 0, 0, c->n_vocab, hidden, E, logits, c->n_vocab,
                             n_out);
    ds4_matmul(f, &head, 1);
}
