/*
 * forward.c — per-session forward state, and the layer loop of one chunk
 * (qwen35-spec.md §6): embedding, for each trunk layer
 * h += mixer(norm(h)); h += ffn(norm(h)), then the final norm and the head.
 */
#include "forward.h"
#include "../error.h"
#include "../paths.h"

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

void *ds4_fwd_calloc(ds4_fwd *f, size_t n, size_t size) {
    void *p = calloc(n, size);
    if (p) {
        f->cnt.allocs++;
        f->cnt.alloc_bytes += (uint64_t)n * size;
    }
    return p;
}

void *ds4_fwd_malloc(ds4_fwd *f, size_t size) {
    void *p = malloc(size);
    if (p) {
        f->cnt.allocs++;
        f->cnt.alloc_bytes += size;
    }
    return p;
}

void *ds4_fwd_realloc(ds4_fwd *f, void *old, size_t size) {
    void *p = realloc(old, size);
    if (p) {
        f->cnt.allocs++;
        f->cnt.alloc_bytes += size;
    }
    return p;
}

/* Bytes of a whole bound tensor. */
static uint64_t tensor_bytes(const ds4_tensor *t) {
    if (!t->data) return 0;
    uint64_t rows = 1;
    for (int d = 1; d < t->n_dims; d++) rows *= (uint64_t)t->ne[d];
    return rows * t->row_bytes;
}

/* The largest quantized activation source one matmul job can need: rows x
 * the activation row bytes of its weight's vec_dot_type (ds4_matmul takes
 * at most DS4_MM_SOURCES of them per dispatch). */
static size_t max_act_source(const ds4_fwd *f) {
    const ds4_model *m = f->m;
    const int64_t R = DS4_CHUNK_ROWS;
    const int64_t RK = R * (f->c.n_expert_used > 0 ? f->c.n_expert_used : 1);
    size_t mx = (size_t)R * ds4_mm_act_row_bytes(ds4_model_head(m)->type, f->c.n_embd);
    for (int64_t il = 0; il < f->c.n_main; il++) {
        const ds4_layer *L = &m->layers[il];
        const ds4_tensor *ts[] = {&L->attn_qkv, &L->attn_gate, &L->ssm_beta, &L->ssm_alpha,
                                  &L->ssm_out, &L->attn_q, &L->attn_k, &L->attn_v,
                                  &L->attn_output, &L->ffn_gate, &L->ffn_up, &L->ffn_down,
                                  &L->ffn_gate_inp, &L->ffn_gate_exps, &L->ffn_up_exps,
                                  &L->ffn_gate_up_exps, &L->ffn_down_exps,
                                  &L->ffn_gate_inp_shexp, &L->ffn_gate_shexp,
                                  &L->ffn_up_shexp, &L->ffn_down_shexp};
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
            if (!ts[i]->data) continue;
            /* the experts' down projection reads one row per (token, slot) */
            const int64_t rows = ts[i] == &L->ffn_down_exps ? RK : R;
            size_t b = (size_t)rows * ds4_mm_act_row_bytes(ts[i]->type, ts[i]->ne[0]);
            if (b > mx) mx = b;
        }
    }
    return mx;
}

/* Bytes of the small F32 tensors a layer reads besides its matrices (the
 * weight_bytes counter, ds4.h). */
static uint64_t layer_small_bytes(const ds4_layer *L) {
    return tensor_bytes(&L->attn_norm) + tensor_bytes(&L->post_attention_norm) +
           tensor_bytes(&L->ssm_conv1d) + tensor_bytes(&L->ssm_dt_bias) +
           tensor_bytes(&L->ssm_a) + tensor_bytes(&L->ssm_norm) +
           tensor_bytes(&L->attn_q_norm) + tensor_bytes(&L->attn_k_norm);
}

int ds4_fwd_init(ds4_fwd *f, const ds4_model *m, int kv_type, ds4_error *err) {
    memset(f, 0, sizeof *f);
    f->m = m;
    f->c = m->cfg;
    f->precision = m->params.precision;
    f->fast = f->precision == DS4_PRECISION_FAST;
    f->path_layer = DS4_PATH_OTHER;
    f->n_ctx = m->params.n_ctx;
    f->n_threads = m->params.n_threads < 1 ? 1 : m->params.n_threads;
    f->kv_type = kv_type;
    /* Fast attention recipe, chosen by measurement against llama.cpp's
     * logits (attention.c); it reads F16 pages. */
    f->attn_f16 = f->fast && DS4_FAST_ATTN_F16 && kv_type == DS4_TYPE_F16;
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
    f->h = ds4_fwd_calloc(f, (size_t)(R * E), sizeof(float));
    f->x = ds4_fwd_calloc(f, (size_t)(R * E), sizeof(float));
    f->y = ds4_fwd_calloc(f, (size_t)(R * E), sizeof(float));
    f->work = ds4_fwd_calloc(f, (size_t)(R * wpr), sizeof(float));
    f->rope_cos = ds4_fwd_calloc(f, (size_t)(R * half), sizeof(float));
    f->rope_sin = ds4_fwd_calloc(f, (size_t)(R * half), sizeof(float));
    f->thread_scratch = ds4_fwd_calloc(f, (size_t)(f->n_threads * tpf), sizeof(float));
    f->kv = ds4_fwd_calloc(f, (size_t)c->n_main, sizeof *f->kv);
    f->gdn = ds4_fwd_calloc(f, (size_t)c->n_main, sizeof *f->gdn);
    f->moe_sel = ds4_fwd_calloc(f, (size_t)(R * ku), sizeof(int32_t));
    f->moe_w = ds4_fwd_calloc(f, (size_t)(R * ku), sizeof(float));
    f->moe_idx = ds4_fwd_calloc(f, (size_t)(R * ku), sizeof(int32_t));
    f->moe_src = ds4_fwd_calloc(f, (size_t)(R * ku), sizeof(int32_t));
    f->moe_off = ds4_fwd_calloc(f, (size_t)(c->n_expert + 1), sizeof(int64_t));
    f->moe_jobs = ds4_fwd_calloc(f, (size_t)(2 * c->n_expert + 4), sizeof(ds4_mm_job));
    if (f->fast) {
        f->mm_qcap = DS4_MM_SOURCES * max_act_source(f);
        f->mm_q = ds4_fwd_malloc(f, f->mm_qcap ? f->mm_qcap : 1);
    }
    if (!f->h || !f->x || !f->y || !f->work || !f->rope_cos || !f->rope_sin ||
        !f->thread_scratch || !f->kv || !f->gdn || !f->moe_sel || !f->moe_w || !f->moe_idx ||
        !f->moe_src || !f->moe_off || !f->moe_jobs || (f->fast && !f->mm_q)) {
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
        f->gdn[il].conv =
            ds4_fwd_calloc(f, (size_t)((c->ssm_conv_kernel - 1) * cd) + 1, sizeof(float));
        f->gdn[il].ssm = ds4_fwd_calloc(
            f, (size_t)(c->ssm_n_v * c->ssm_d_state * c->ssm_d_state), sizeof(float));
        if (!f->gdn[il].conv || !f->gdn[il].ssm) {
            ds4_fwd_free(f);
            return ds4_fail(err, DS4_ERR_NOMEM, "out of memory for the recurrent state of layer %lld",
                            (long long)il);
        }
    }
    if ((rc = ds4_pool_new(f->n_threads, &f->pool, err)) || (rc = ds4_nextn_init(f, err))) {
        ds4_fwd_free(f);
        return rc;
    }
    return ds4_ok(err);
}

/* --------------------------------------------------------- verify -- */

int ds4_fwd_verify_reserve(ds4_fwd *f, int64_t n, ds4_error *err) {
    const ds4_model_config *c = &f->c;
    int64_t n_gdn = 0;
    for (int64_t il = 0; il < c->n_main; il++) n_gdn += f->m->layers[il].kind == DS4_LAYER_GDN;
    if (!f->gdn_alt) {
        /* The second recurrent state a verify writes into; allocated whole
         * or not at all, so a failure leaves gdn_alt NULL. */
        ds4_gdn_state *alt = ds4_fwd_calloc(f, (size_t)c->n_main, sizeof *alt);
        if (!alt) return ds4_fail(err, DS4_ERR_NOMEM, "out of memory for the verify state");
        const int64_t cd = 2 * c->ssm_n_k * c->ssm_d_state + c->ssm_d_inner;
        int ok = 1;
        for (int64_t il = 0; il < c->n_main && ok; il++) {
            if (f->m->layers[il].kind != DS4_LAYER_GDN) continue;
            alt[il].conv =
                ds4_fwd_calloc(f, (size_t)((c->ssm_conv_kernel - 1) * cd) + 1, sizeof(float));
            alt[il].ssm = ds4_fwd_calloc(
                f, (size_t)(c->ssm_n_v * c->ssm_d_state * c->ssm_d_state), sizeof(float));
            ok = alt[il].conv && alt[il].ssm;
        }
        if (!ok) {
            for (int64_t il = 0; il < c->n_main; il++) {
                free(alt[il].conv);
                free(alt[il].ssm);
            }
            free(alt);
            return ds4_fail(err, DS4_ERR_NOMEM, "out of memory for the verify state (%lld GDN layers)",
                            (long long)n_gdn);
        }
        f->gdn_alt = alt;
    }
    if (n > f->vcap_rows) {
        /* Grow only: a speculative loop reaches its largest verify early and
         * then never allocates again. */
        const size_t nf = (size_t)(n_gdn * n * ds4_gdn_capture_floats(c));
        float *p = ds4_fwd_malloc(f, (nf ? nf : 1) * sizeof(float));
        if (!p)
            return ds4_fail(err, DS4_ERR_NOMEM, "out of memory for %lld verify rows", (long long)n);
        free(f->vcap);
        f->vcap = p;
        f->vcap_rows = n;
    }
    return ds4_ok(err);
}

void ds4_fwd_swap_gdn(ds4_fwd *f) {
    ds4_gdn_state *t = f->gdn;
    f->gdn = f->gdn_alt;
    f->gdn_alt = t;
}

void ds4_fwd_free(ds4_fwd *f) {
    ds4_nextn_free(f);
    ds4_pool_free(f->pool);
    ds4_kv_free(f);
    if (f->gdn)
        for (int64_t il = 0; il < f->c.n_main; il++) {
            free(f->gdn[il].conv);
            free(f->gdn[il].ssm);
        }
    free(f->gdn);
    if (f->gdn_alt)
        for (int64_t il = 0; il < f->c.n_main; il++) {
            free(f->gdn_alt[il].conv);
            free(f->gdn_alt[il].ssm);
        }
    free(f->gdn_alt);
    free(f->vcap);
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
    free(f->mm_q);
    memset(f, 0, sizeof *f);
}

/* ------------------------------------------------------------- chunk -- */

/* cos/sin of the rotated pairs at each row's position, shared by every
 * attention layer. Text tokens have t = h = w = pos, so the IMROPE
 * sections collapse to plain NEOX RoPE at pos (spec §4.3).
 * EXACT computes the frequency as transformers does
 * (Qwen3_5TextRotaryEmbedding): inv_freq_i = 1 / base^(2i/n_rot) in float32,
 * angle = float(pos) * inv_freq_i. FAST builds it as ggml's rope cache does
 * (ggml-cpu ops.cpp ggml_mrope_cache_init / rope_yarn with freq_scale 1 and
 * no YaRN): theta_0 = float(pos), theta_{i+1} = theta_i * base^(-2/n_rot),
 * each product rounded to float. */
void ds4_rope_fill(int64_t n_rot, float base, int fast, int64_t n, int64_t pos0, float *cos_out,
                   float *sin_out) {
    const int64_t half = n_rot / 2;
    if (fast) {
        const float theta_scale = powf(base, -2.0f / (float)n_rot);
        for (int64_t t = 0; t < n; t++) {
            float theta = (float)(pos0 + t);
            for (int64_t i = 0; i < half; i++) {
                cos_out[t * half + i] = cosf(theta);
                sin_out[t * half + i] = sinf(theta);
                theta *= theta_scale;
            }
        }
        return;
    }
    for (int64_t i = 0; i < half; i++) {
        const float expo = (float)(2 * i) / (float)n_rot;
        const float inv = 1.0f / powf(base, expo);
        for (int64_t t = 0; t < n; t++) {
            const float a = (float)(pos0 + t) * inv;
            cos_out[t * half + i] = cosf(a);
            sin_out[t * half + i] = sinf(a);
        }
    }
}

void ds4_rope_tables(ds4_fwd *f, int64_t n, int64_t pos0) {
    ds4_rope_fill(f->c.n_rot, f->c.rope_base, f->fast, n, pos0, f->rope_cos, f->rope_sin);
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
    f->cnt.weight_bytes += (uint64_t)n * m->token_embd.row_bytes;
    if (c->n_rot > 0) ds4_rope_tables(f, n, pos0);

    for (int64_t il = 0; il < c->n_main; il++) {
        const ds4_layer *L = &m->layers[il];
        f->path_layer = il;
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
        f->cnt.weight_bytes += layer_small_bytes(L);

        for (int64_t j = 0; j < f->n_cap; j++) {
            if (f->cap_layers[j] != il) continue;
            for (int64_t t = out_row0; t < n; t++)
                memcpy(f->cap_out + ((t - out_row0) * f->n_cap + j) * E, f->h + t * E,
                       (size_t)E * sizeof(float));
        }
    }

    f->path_layer = DS4_PATH_OTHER;
    if (out_row0 >= n) return;
    const int64_t n_out = n - out_row0;
    const float *on = (const float *)m->output_norm.data;
    f->cnt.weight_bytes += tensor_bytes(&m->output_norm);
    for (int64_t t = out_row0; t < n; t++)
        ds4_rmsnorm(f->h + t * E, on, hidden + (t - out_row0) * E, E, eps);
    ds4_mm_job head = ds4_mm(ds4_model_head(m), 0, 0, c->n_vocab, hidden, E, logits, c->n_vocab,
                             n_out);
    f->path_layer = DS4_PATH_HEAD;
    ds4_matmul(f, &head, 1);
    f->path_layer = DS4_PATH_OTHER;
}
