/*
 * model.c — loading a qwen35 / qwen35moe GGUF: parameters, tensor binding by
 * name with shape and type checks, and the model's accessors.
 *
 * Metadata is read and checked in model_config.c. Tensor names and shapes
 * follow llama.cpp src/models/qwen35.cpp / qwen35moe.cpp load_arch_tensors
 * (qwen35-spec.md §2); a shape matches as llama.cpp's check_tensor_dims
 * does: all four ne[] equal, unused dimensions 1 (so {n} and {n, 1} are the
 * same shape).
 *
 * Fail closed (DESIGN.md invariant 4): every tensor the forward pass reads is
 * checked here for what the forward pass will do with it —
 *  - a matrix (y = W x, or a row lookup for the embeddings) needs a type with
 *    dot kernels (DS4_TYPE_DOT, which also dequantizes) and whole blocks per
 *    row;
 *  - a vector read as plain floats (norm weights, ssm_conv1d, ssm_a,
 *    ssm_dt.bias, the routers ffn_gate_inp and ffn_gate_inp_shexp) must be F32,
 *    which is what the converter writes (spec §2 "F32 rule") and what
 *    llama-quantize leaves alone;
 *  - every tensor's data must be 4-byte aligned (the forward pass casts F32
 *    data to float *; only a file with general.alignment < 4 can break it).
 * A tensor in the file that no slot takes is refused too, as llama.cpp does
 * ("wrong number of tensors"): it would mean a variant (biases, a fused
 * attention qkv, rope factors, ...) that we would otherwise silently ignore.
 */
#include "model.h"
#include "error.h"
#include "model_config.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* n_ctx default cap (ds4.h ds4_model_params), and the largest n_ctx: ggml
 * and our sessions hold positions as int32. */
#define DEFAULT_N_CTX_CAP 8192
#define MAX_N_CTX INT32_MAX
/* More threads than this is a caller mistake, not a machine. */
#define MAX_THREADS 4096
/* "blk.<il>." + the longest suffix + NUL, with room to spare. */
#define NAME_MAX_LEN 96

typedef enum { T_MATRIX, T_F32 } tensor_use;

typedef struct {
    ds4_model *m;
    const ds4_gguf *g;
    uint8_t *used;     /* per file tensor: taken by a slot */
    size_t *name_off;  /* per file tensor: its name in pool */
    ds4_error *err;
    char *pool;        /* NUL-terminated names of g's tensors (m->name_pool, or
                          m->head_name_pool for a draft head) */
} binder;

static int64_t sat_mul(int64_t a, int64_t b) {
    int64_t r;
    return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

static void fmt_shape(char *out, size_t cap, const int64_t ne[4]) {
    int n = 4;
    while (n > 1 && ne[n - 1] == 1) n--;
    size_t o = (size_t)snprintf(out, cap, "[");
    for (int i = 0; i < n && o < cap; i++)
        o += (size_t)snprintf(out + o, cap - o, i ? ", %lld" : "%lld", (long long)ne[i]);
    if (o < cap) snprintf(out + o, cap - o, "]");
}

/* Bind file tensor `name` into slot t, checking its shape against
 * {e0, e1, e2} (described as `desc` in messages) and its type against `use`.
 * A missing optional tensor leaves the slot zeroed (data == NULL). */
static int bind(binder *b, ds4_tensor *t, const char *name, tensor_use use, int required,
                int64_t e0, int64_t e1, int64_t e2, const char *desc) {
    memset(t, 0, sizeof *t);
    int64_t gi = ds4_gguf_find_tensor(b->g, name);
    if (gi < 0) {
        if (!required) return DS4_OK;
        return ds4_fail(b->err, DS4_ERR_NOT_FOUND, "required tensor '%s' is missing", name);
    }
    ds4_gguf_tensor gt;
    ds4_gguf_get_tensor(b->g, gi, &gt, NULL); /* cannot fail for a found index */
    const int64_t want[4] = {e0, e1, e2, 1};
    for (int d = 0; d < 4; d++) {
        if (gt.ne[d] != want[d]) {
            char got_s[96], want_s[96];
            fmt_shape(got_s, sizeof got_s, gt.ne);
            fmt_shape(want_s, sizeof want_s, want);
            return ds4_fail(b->err, DS4_ERR_BAD_MODEL,
                            "tensor '%s' has shape %s; expected %s = %s", name, got_s, want_s,
                            desc);
        }
    }
    ds4_type_info info;
    if (ds4_type_get_info(gt.type, &info, NULL) != DS4_OK) /* the reader checked the id */
        return ds4_fail(b->err, DS4_ERR_BAD_MODEL, "tensor '%s' has unknown type %d", name,
                        gt.type);
    if (use == T_F32 && gt.type != DS4_TYPE_F32)
        return ds4_fail(b->err, DS4_ERR_UNSUPPORTED,
                        "tensor '%s' is %s; ds4py reads it as plain floats and needs F32", name,
                        info.name);
    if (use == T_MATRIX && !(info.flags & DS4_TYPE_DOT))
        return ds4_fail(b->err, DS4_ERR_UNSUPPORTED,
                        "tensor '%s' is %s, a type ds4py has no matrix kernels for", name,
                        info.name);
    if (gt.ne[0] % info.block_size != 0) /* the reader checks this too; cheap to be sure */
        return ds4_fail(b->err, DS4_ERR_BAD_MODEL,
                        "tensor '%s': row length %lld is not a multiple of %s's block size %lld",
                        name, (long long)gt.ne[0], info.name, (long long)info.block_size);
    if ((uintptr_t)gt.data % 4 != 0)
        return ds4_fail(b->err, DS4_ERR_UNSUPPORTED,
                        "tensor '%s' data is not 4-byte aligned (general.alignment = %llu)", name,
                        (unsigned long long)ds4_gguf_alignment(b->g));
    t->name = b->pool + b->name_off[gi];
    t->type = gt.type;
    t->n_dims = gt.n_dims;
    memcpy(t->ne, gt.ne, sizeof t->ne);
    t->data = gt.data;
    t->row_bytes = (size_t)(gt.ne[0] / info.block_size * info.type_size);
    t->expert_bytes = t->row_bytes * (size_t)gt.ne[1];
    b->used[gi] = 1;
    return DS4_OK;
}

static int has_tensor(const binder *b, const char *name) {
    return ds4_gguf_find_tensor(b->g, name) >= 0;
}

/* Name of block il's tensor `suffix` in buf. */
static const char *blk(char *buf, int64_t il, const char *suffix) {
    snprintf(buf, NAME_MAX_LEN, "blk.%lld.%s", (long long)il, suffix);
    return buf;
}

#define BIND(slot, suffix, use, req, e0, e1, e2, desc)                                       \
    do {                                                                                     \
        int rc_ = bind(b, &L->slot, blk(nm, il, suffix), use, req, e0, e1, e2, desc);        \
        if (rc_) return rc_;                                                                 \
    } while (0)

static int bind_gdn(binder *b, ds4_layer *L, int64_t il) {
    const ds4_model_config *c = &b->m->cfg;
    char nm[NAME_MAX_LEN];
    int64_t E = c->n_embd, n_v = c->ssm_n_v;
    int64_t key_dim = c->ssm_d_state * c->ssm_n_k; /* <= d_inner: n_k divides n_v */
    int64_t value_dim = c->ssm_d_inner;            /* == n_v * d_state (model_config.c) */
    int64_t conv_dim = 2 * key_dim + value_dim;
    BIND(attn_qkv, "attn_qkv.weight", T_MATRIX, 1, E, conv_dim, 1, "{n_embd, 2*n_k*d_state + d_inner}");
    BIND(attn_gate, "attn_gate.weight", T_MATRIX, 1, E, value_dim, 1, "{n_embd, d_inner}");
    BIND(ssm_conv1d, "ssm_conv1d.weight", T_F32, 1, c->ssm_conv_kernel, conv_dim, 1,
         "{ssm.conv_kernel, 2*n_k*d_state + d_inner}");
    BIND(ssm_dt_bias, "ssm_dt.bias", T_F32, 1, n_v, 1, 1, "{ssm.time_step_rank}");
    BIND(ssm_a, "ssm_a", T_F32, 1, n_v, 1, 1, "{ssm.time_step_rank}");
    BIND(ssm_beta, "ssm_beta.weight", T_MATRIX, 1, E, n_v, 1, "{n_embd, ssm.time_step_rank}");
    BIND(ssm_alpha, "ssm_alpha.weight", T_MATRIX, 1, E, n_v, 1, "{n_embd, ssm.time_step_rank}");
    BIND(ssm_norm, "ssm_norm.weight", T_F32, 1, c->ssm_d_state, 1, 1, "{ssm.state_size}");
    BIND(ssm_out, "ssm_out.weight", T_MATRIX, 1, value_dim, E, 1, "{d_inner, n_embd}");
    return DS4_OK;
}

static int bind_attn(binder *b, ds4_layer *L, int64_t il) {
    const ds4_model_config *c = &b->m->cfg;
    char nm[NAME_MAX_LEN];
    int64_t E = c->n_embd, hd = c->head_dim;
    int64_t q_dim = sat_mul(sat_mul(2, c->n_head), hd), kv_dim = sat_mul(c->n_head_kv, hd);
    int64_t o_dim = sat_mul(c->n_head, hd);
    /* llama.cpp create_tensor_qkv also takes a fused attn_qkv (and q/k/v
     * biases) for attention layers; no Qwen3.5 converter writes them and our
     * forward pass has no slot for them. */
    if (has_tensor(b, blk(nm, il, "attn_qkv.weight")))
        return ds4_fail(b->err, DS4_ERR_UNSUPPORTED,
                        "tensor '%s': a fused q/k/v projection in an attention block is not "
                        "supported",
                        nm);
    BIND(attn_q, "attn_q.weight", T_MATRIX, 1, E, q_dim, 1, "{n_embd, 2*n_head*head_dim}");
    BIND(attn_k, "attn_k.weight", T_MATRIX, 1, E, kv_dim, 1, "{n_embd, n_head_kv*head_dim}");
    BIND(attn_v, "attn_v.weight", T_MATRIX, 1, E, kv_dim, 1, "{n_embd, n_head_kv*head_dim}");
    BIND(attn_output, "attn_output.weight", T_MATRIX, 1, o_dim, E, 1, "{n_head*head_dim, n_embd}");
    BIND(attn_q_norm, "attn_q_norm.weight", T_F32, 1, hd, 1, 1, "{head_dim}");
    BIND(attn_k_norm, "attn_k_norm.weight", T_F32, 1, hd, 1, 1, "{head_dim}");
    return DS4_OK;
}

static int bind_ffn(binder *b, ds4_layer *L, int64_t il) {
    const ds4_model_config *c = &b->m->cfg;
    char nm[NAME_MAX_LEN];
    int64_t E = c->n_embd;
    if (c->arch == DS4_ARCH_QWEN35) {
        BIND(ffn_gate, "ffn_gate.weight", T_MATRIX, 1, E, c->n_ff, 1, "{n_embd, n_ff}");
        BIND(ffn_up, "ffn_up.weight", T_MATRIX, 1, E, c->n_ff, 1, "{n_embd, n_ff}");
        BIND(ffn_down, "ffn_down.weight", T_MATRIX, 1, c->n_ff, E, 1, "{n_ff, n_embd}");
        return DS4_OK;
    }
    int64_t X = c->n_expert, F = c->n_ff_exp, S = c->n_ff_shexp;
    BIND(ffn_gate_inp, "ffn_gate_inp.weight", T_F32, 1, E, X, 1, "{n_embd, n_expert}");
    /* llama.cpp create_tensor_gate_up_exps: a fused gate_up_exps replaces the
     * pair; a file with both would fail its tensor count, and so it does here */
    int fused = has_tensor(b, blk(nm, il, "ffn_gate_up_exps.weight"));
    if (fused) {
        if (has_tensor(b, blk(nm, il, "ffn_gate_exps.weight")) ||
            has_tensor(b, blk(nm, il, "ffn_up_exps.weight")))
            return ds4_fail(b->err, DS4_ERR_BAD_MODEL,
                            "block %lld has both ffn_gate_up_exps and separate "
                            "ffn_gate_exps/ffn_up_exps (%s)",
                            (long long)il, nm);
        BIND(ffn_gate_up_exps, "ffn_gate_up_exps.weight", T_MATRIX, 1, E, sat_mul(2, F), X,
             "{n_embd, 2*n_ff_exp, n_expert}");
    } else {
        BIND(ffn_gate_exps, "ffn_gate_exps.weight", T_MATRIX, 1, E, F, X, "{n_embd, n_ff_exp, n_expert}");
        BIND(ffn_up_exps, "ffn_up_exps.weight", T_MATRIX, 1, E, F, X, "{n_embd, n_ff_exp, n_expert}");
    }
    if (il == 0) b->m->cfg.fused_gate_up_exps = fused;
    else if (fused != b->m->cfg.fused_gate_up_exps)
        return ds4_fail(b->err, DS4_ERR_UNSUPPORTED,
                        "block %lld %s a fused ffn_gate_up_exps but block 0 %s; mixing fused and "
                        "separate expert gate/up is not supported",
                        (long long)il, fused ? "has" : "lacks", fused ? "does not" : "does");
    BIND(ffn_down_exps, "ffn_down_exps.weight", T_MATRIX, 1, F, E, X, "{n_ff_exp, n_embd, n_expert}");
    BIND(ffn_gate_inp_shexp, "ffn_gate_inp_shexp.weight", T_F32, 1, E, 1, 1, "{n_embd}");
    BIND(ffn_gate_shexp, "ffn_gate_shexp.weight", T_MATRIX, 1, E, S, 1, "{n_embd, n_ff_shexp}");
    BIND(ffn_up_shexp, "ffn_up_shexp.weight", T_MATRIX, 1, E, S, 1, "{n_embd, n_ff_shexp}");
    BIND(ffn_down_shexp, "ffn_down_shexp.weight", T_MATRIX, 1, S, E, 1, "{n_ff_shexp, n_embd}");
    return DS4_OK;
}

static int bind_nextn(binder *b, ds4_layer *L, int64_t il) {
    const ds4_model_config *c = &b->m->cfg;
    char nm[NAME_MAX_LEN];
    int64_t E = c->n_embd, V = c->n_vocab;
    BIND(nextn_eh_proj, "nextn.eh_proj.weight", T_MATRIX, 1, sat_mul(2, E), E, 1, "{2*n_embd, n_embd}");
    BIND(nextn_enorm, "nextn.enorm.weight", T_F32, 1, E, 1, 1, "{n_embd}");
    BIND(nextn_hnorm, "nextn.hnorm.weight", T_F32, 1, E, 1, 1, "{n_embd}");
    BIND(nextn_embed_tokens, "nextn.embed_tokens.weight", T_MATRIX, 0, E, V, 1, "{n_embd, n_vocab}");
    BIND(nextn_shared_head_head, "nextn.shared_head_head.weight", T_MATRIX, 0, E, V, 1,
         "{n_embd, n_vocab}");
    BIND(nextn_shared_head_norm, "nextn.shared_head_norm.weight", T_F32, 0, E, 1, 1, "{n_embd}");
    /* llama.cpp (qwen35*.cpp graph_mtp) falls back to output_norm when the
     * block has no shared_head_norm; fill the slot with it so the forward
     * pass always finds one. */
    if (!L->nextn_shared_head_norm.data) L->nextn_shared_head_norm = b->m->output_norm;
    return DS4_OK;
}

static int bind_layer_into(binder *b, ds4_layer *L, int64_t il) {
    char nm[NAME_MAX_LEN];
    int rc;
    BIND(attn_norm, "attn_norm.weight", T_F32, 1, b->m->cfg.n_embd, 1, 1, "{n_embd}");
    BIND(post_attention_norm, "post_attention_norm.weight", T_F32, 1, b->m->cfg.n_embd, 1, 1,
         "{n_embd}");
    if (L->kind == DS4_LAYER_GDN) rc = bind_gdn(b, L, il);
    else rc = bind_attn(b, L, il);
    if (rc) return rc;
    if ((rc = bind_ffn(b, L, il))) return rc;
    if (L->kind == DS4_LAYER_NEXTN) return bind_nextn(b, L, il);
    return DS4_OK;
}

static int bind_layer(binder *b, int64_t il) { return bind_layer_into(b, &b->m->layers[il], il); }

#undef BIND

/* The vocabulary size is token_embd's row count; a tokenizer in the file must
 * agree (llama.cpp sizes token_embd from the vocab, so they are equal there). */
static int bind_globals(binder *b) {
    ds4_model *m = b->m;
    int64_t gi = ds4_gguf_find_tensor(b->g, "token_embd.weight");
    if (gi < 0)
        return ds4_fail(b->err, DS4_ERR_NOT_FOUND, "required tensor 'token_embd.weight' is missing");
    ds4_gguf_tensor gt;
    ds4_gguf_get_tensor(b->g, gi, &gt, NULL);
    m->cfg.n_vocab = gt.ne[1];
    int rc = bind(b, &m->token_embd, "token_embd.weight", T_MATRIX, 1, m->cfg.n_embd,
                  m->cfg.n_vocab, 1, "{n_embd, n_vocab}");
    if (rc) return rc;
    int64_t ki = ds4_gguf_find_kv(b->g, "tokenizer.ggml.tokens");
    if (ki >= 0) {
        ds4_gguf_kv kv;
        ds4_gguf_get_kv(b->g, ki, &kv, NULL);
        if (kv.type == DS4_GGUF_ARRAY && (int64_t)kv.array_count != m->cfg.n_vocab)
            return ds4_fail(b->err, DS4_ERR_BAD_MODEL,
                            "tokenizer.ggml.tokens has %llu tokens but token_embd.weight has %lld "
                            "rows (n_vocab)",
                            (unsigned long long)kv.array_count, (long long)m->cfg.n_vocab);
    }
    if ((rc = bind(b, &m->output_norm, "output_norm.weight", T_F32, 1, m->cfg.n_embd, 1, 1,
                   "{n_embd}")))
        return rc;
    if ((rc = bind(b, &m->output, "output.weight", T_MATRIX, 0, m->cfg.n_embd, m->cfg.n_vocab, 1,
                   "{n_embd, n_vocab}")))
        return rc;
    m->cfg.tied_head = m->output.data == NULL;
    return DS4_OK;
}

/* A binder over g: per-tensor flags and NUL-terminated copies of the
 * names (the file's are not terminated), returned in *pool. */
static int binder_open(binder *b, ds4_model *m, const ds4_gguf *g, char **pool, ds4_error *err) {
    int64_t n = ds4_gguf_n_tensors(g);
    b->m = m;
    b->g = g;
    b->err = err;
    b->used = calloc((size_t)n + 1, 1);
    b->name_off = malloc(((size_t)n + 1) * sizeof(size_t));
    b->pool = NULL;
    if (!b->used || !b->name_off)
        return ds4_fail(err, DS4_ERR_NOMEM, "out of memory binding %lld tensors", (long long)n);
    size_t total = 1;
    for (int64_t i = 0; i < n; i++) {
        ds4_gguf_tensor gt;
        ds4_gguf_get_tensor(g, i, &gt, NULL);
        b->name_off[i] = total;
        total += gt.name_len + 1;
    }
    if (!(b->pool = calloc(total, 1)))
        return ds4_fail(err, DS4_ERR_NOMEM, "out of memory for tensor names");
    for (int64_t i = 0; i < n; i++) {
        ds4_gguf_tensor gt;
        ds4_gguf_get_tensor(g, i, &gt, NULL);
        memcpy(b->pool + b->name_off[i], gt.name, gt.name_len);
    }
    *pool = b->pool;
    return DS4_OK;
}

static void binder_close(binder *b) {
    free(b->used);
    free(b->name_off);
}

/* The first tensor no slot took: refused (unused tensors are refused, as
 * llama.cpp does), naming it and saying what it is not part of. */
static int refuse_unused(binder *b, const char *what) {
    int64_t n = ds4_gguf_n_tensors(b->g);
    for (int64_t i = 0; i < n; i++) {
        if (b->used[i]) continue;
        ds4_gguf_tensor gt;
        char q[NAME_MAX_LEN + 40];
        ds4_gguf_get_tensor(b->g, i, &gt, NULL);
        ds4_model_quote(q, sizeof q, gt.name, gt.name_len < 80 ? gt.name_len : 80);
        return ds4_fail(b->err, DS4_ERR_BAD_MODEL,
                        "tensor %s is not part of %s with this configuration (unused "
                        "tensors are refused, as llama.cpp does)",
                        q, what);
    }
    return DS4_OK;
}

static int bind_all(ds4_model *m, const int *kinds, ds4_error *err) {
    const ds4_gguf *g = m->gguf;
    binder b;
    int rc = binder_open(&b, m, g, &m->name_pool, err);
    if (rc) goto done;

    if (m->cfg.n_nextn > 0 && !has_tensor(&b, "blk.0.attn_norm.weight")) {
        /* qwen35*.cpp load_arch_tensors: "mtp_only" files hold only a nextn
         * head (plus embeddings/norm/head) for another file's trunk. */
        rc = ds4_fail(err, DS4_ERR_UNSUPPORTED,
                      "this is an MTP-only GGUF (a nextn head without trunk layers: no "
                      "blk.0.attn_norm.weight); it cannot be loaded as a model: load its trunk "
                      "and give this file as the trunk's draft_head");
        goto done;
    }
    if ((rc = bind_globals(&b))) goto done;
    for (int64_t il = 0; il < m->cfg.n_layer_all; il++) {
        m->layers[il].kind = kinds[il];
        if ((rc = bind_layer(&b, il))) goto done;
    }
    char what[64];
    snprintf(what, sizeof what, "a %s model", ds4_model_arch_name(m->cfg.arch));
    if ((rc = refuse_unused(&b, what))) goto done;
    if (m->cfg.n_nextn > 0) m->nextn_source = DS4_NEXTN_BUNDLED;
done:
    binder_close(&b);
    return rc;
}

/* Parameter checks that need no file, so a bad call fails before any I/O. */
static int check_params(const ds4_model_params *p, ds4_error *err) {
    if (p->precision != DS4_PRECISION_FAST && p->precision != DS4_PRECISION_EXACT)
        return ds4_fail(err, DS4_ERR_ARG,
                        "precision = %d: expected DS4_PRECISION_FAST (0) or DS4_PRECISION_EXACT (1)",
                        p->precision);
    if (p->n_threads > MAX_THREADS)
        return ds4_fail(err, DS4_ERR_ARG, "n_threads = %d: at most %d", p->n_threads, MAX_THREADS);
    if (p->n_ctx > MAX_N_CTX)
        return ds4_fail(err, DS4_ERR_ARG, "n_ctx = %lld: at most %lld (positions are int32)",
                        (long long)p->n_ctx, (long long)MAX_N_CTX);
    return DS4_OK;
}

static void resolve_params(ds4_model *m, const ds4_model_params *p) {
    m->params = *p;
    if (m->params.n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        m->params.n_threads = n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : (int)n;
    }
    /* n_ctx above context_length is allowed (llama.cpp only warns). */
    if (m->params.n_ctx <= 0)
        m->params.n_ctx = m->cfg.n_ctx_train < DEFAULT_N_CTX_CAP ? m->cfg.n_ctx_train
                                                                 : DEFAULT_N_CTX_CAP;
}

/* --------------------------------------------------------- draft head -- */
/* A standalone nextn head (ds4.h ds4_model_nextn_source): the layout
 * llama.cpp's converter writes for MTP-only output (conversion/qwen.py
 * _QwenMtpMixin with mtp_only: the full model's metadata, blk.N.* of the
 * head, plus token_embd / output_norm / output; llama.cpp's qwen35*.cpp
 * load_arch_tensors recognises it by the missing blk.0.attn_norm.weight).
 * Its tensors are bound against the TRUNK's configuration, so a head made
 * for another model fails on the first tensor whose shape differs, named.
 * Its own token_embd / output / output_norm, when present, take the places
 * of nextn.embed_tokens / shared_head_head / the shared_head_norm fallback,
 * which is what llama.cpp computes when it runs that file (graph_mtp reads
 * the head file's own tok_embd, output and output_norm). */

/* k of a "blk.<k>.<...>" name, or -1 for any other name. */
static int64_t block_index(const char *name) {
    if (strncmp(name, "blk.", 4) != 0) return -1;
    const char *p = name + 4;
    int64_t k = 0;
    if (*p < '0' || *p > '9') return -1;
    for (; *p >= '0' && *p <= '9'; p++)
        if ((k = k * 10 + (*p - '0')) > INT32_MAX) return INT32_MAX;
    return *p == '.' ? k : -1;
}

/* Settings no tensor shape shows, which the head must share with the trunk
 * (the forward pass runs the head with the trunk's configuration). */
static int same_settings(const ds4_model_config *t, const ds4_model_config *h, ds4_error *err) {
    const char *a = ds4_model_arch_name(t->arch);
    const struct {
        const char *key;
        double tv, hv;
    } f[] = {
        {"attention.layer_norm_rms_epsilon", t->rms_eps, h->rms_eps},
        {"rope.freq_base", t->rope_base, h->rope_base},
        {"rope.dimension_count", (double)t->n_rot, (double)h->n_rot},
        {"attention.scale", t->attn_scale, h->attn_scale},
        {"expert_used_count", (double)t->n_expert_used, (double)h->n_expert_used},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].tv != f[i].hv)
            return ds4_fail(err, DS4_ERR_BAD_MODEL,
                            "%s.%s is %g in the head file but %g in the trunk", a, f[i].key,
                            f[i].hv, f[i].tv);
    return DS4_OK;
}

static int attach_checked(ds4_model *m, ds4_gguf *g, char **pool, ds4_error *err) {
    ds4_model_config hc;
    int *kinds = NULL;
    int rc = ds4_model_config_read(g, &hc, &kinds, err);
    free(kinds);
    if (rc) return rc;
    const int64_t N = m->cfg.n_main;
    /* The head-only guard first, whatever else the file says: a full model
     * carries its trunk blocks (and perhaps its own head) and must never be
     * taken as a head (ds4-notes: qwen_nextn_head_only). */
    binder b;
    if ((rc = binder_open(&b, m, g, pool, err))) goto done;
    const int64_t n = ds4_gguf_n_tensors(g);
    for (int64_t i = 0; i < n; i++) {
        const char *name = b.pool + b.name_off[i];
        int64_t k = block_index(name);
        if (k >= 0 && k != hc.n_main) {
            rc = ds4_fail(err, DS4_ERR_BAD_MODEL,
                          "carries tensors outside blk.%lld (e.g. '%s'); not a standalone head",
                          (long long)hc.n_main, name);
            goto done;
        }
    }
    if (hc.n_nextn != 1) {
        rc = ds4_fail(err, DS4_ERR_BAD_MODEL,
                      "%s.nextn_predict_layers is %lld; a standalone head has one nextn block",
                      ds4_model_arch_name(hc.arch), (long long)hc.n_nextn);
        goto done;
    }
    if (hc.arch != m->cfg.arch) {
        rc = ds4_fail(err, DS4_ERR_BAD_MODEL, "is a %s head (%s FFN); the trunk is %s (%s FFN)",
                      ds4_model_arch_name(hc.arch),
                      hc.arch == DS4_ARCH_QWEN35MOE ? "routed MoE" : "dense",
                      ds4_model_arch_name(m->cfg.arch),
                      m->cfg.arch == DS4_ARCH_QWEN35MOE ? "routed MoE" : "dense");
        goto done;
    }
    if (hc.n_main != N) {
        rc = ds4_fail(err, DS4_ERR_BAD_MODEL,
                      "is the head of a %lld-layer trunk (blk.%lld); this trunk has %lld layers",
                      (long long)hc.n_main, (long long)hc.n_main, (long long)N);
        goto done;
    }
    int64_t ki = ds4_gguf_find_kv(g, "tokenizer.ggml.tokens");
    if (ki >= 0) {
        ds4_gguf_kv kv;
        ds4_gguf_get_kv(g, ki, &kv, NULL);
        if (kv.type == DS4_GGUF_ARRAY && (int64_t)kv.array_count != m->cfg.n_vocab) {
            rc = ds4_fail(err, DS4_ERR_BAD_MODEL,
                          "tokenizer.ggml.tokens has %llu tokens; the trunk's vocabulary has %lld",
                          (unsigned long long)kv.array_count, (long long)m->cfg.n_vocab);
            goto done;
        }
    }

    const int64_t E = m->cfg.n_embd, V = m->cfg.n_vocab;
    ds4_tensor emb, onorm, out;
    if ((rc = bind(&b, &emb, "token_embd.weight", T_MATRIX, 0, E, V, 1, "{n_embd, n_vocab}")) ||
        (rc = bind(&b, &onorm, "output_norm.weight", T_F32, 0, E, 1, 1, "{n_embd}")) ||
        (rc = bind(&b, &out, "output.weight", T_MATRIX, 0, E, V, 1, "{n_embd, n_vocab}")))
        goto done;
    ds4_layer L;
    memset(&L, 0, sizeof L);
    L.kind = DS4_LAYER_NEXTN;
    if ((rc = bind_layer_into(&b, &L, N))) goto done;
    if ((rc = refuse_unused(&b, "a standalone nextn head"))) goto done;
    /* after the shapes, so a head of another width names a tensor */
    if ((rc = same_settings(&m->cfg, &hc, err))) goto done;
    if (!L.nextn_embed_tokens.data && emb.data) L.nextn_embed_tokens = emb;
    if (!L.nextn_shared_head_head.data) {
        if (out.data) L.nextn_shared_head_head = out;
        else if (emb.data) L.nextn_shared_head_head = emb; /* the head file's tied head */
    }
    /* bind_nextn fell back to the trunk's output_norm; the head file's own
     * is the one its shared_head_norm falls back to */
    if (L.nextn_shared_head_norm.data == m->output_norm.data && onorm.data)
        L.nextn_shared_head_norm = onorm;

    if (m->cfg.n_layer_all <= N) {
        ds4_layer *ls = realloc(m->layers, (size_t)(N + 1) * sizeof *ls);
        if (!ls) {
            rc = ds4_fail(err, DS4_ERR_NOMEM, "out of memory for the head's layer");
            goto done;
        }
        m->layers = ls;
    }
    m->layers[N] = L;
    m->cfg.n_layer_all = N + 1;
    m->cfg.n_nextn = 1;
    m->nextn_source |= DS4_NEXTN_DRAFT_HEAD;
done:
    binder_close(&b);
    return rc;
}

static int attach_head(ds4_model *m, const char *path, ds4_error *err) {
    ds4_gguf *g = NULL;
    char *pool = NULL;
    int rc = ds4_gguf_open(path, &g, err);
    if (!rc) rc = attach_checked(m, g, &pool, err);
    if (rc) {
        ds4_gguf_close(g);
        free(pool);
        if (err) {
            char msg[sizeof err->message];
            snprintf(msg, sizeof msg, "%s", err->message);
            char q[160];
            ds4_model_quote(q, sizeof q, path, strlen(path) < 120 ? strlen(path) : 120);
            ds4_fail(err, rc, "draft head %s: %s", q, msg);
        }
        return rc;
    }
    m->head_gguf = g;
    m->head_name_pool = pool;
    return DS4_OK;
}

int ds4_model_load(const char *path, const ds4_model_params *params, ds4_model **out,
                   ds4_error *err) {
    if (!out) return ds4_fail(err, DS4_ERR_ARG, "ds4_model_load: out is NULL");
    *out = NULL;
    if (!path) return ds4_fail(err, DS4_ERR_ARG, "ds4_model_load: path is NULL");
    ds4_model_params p = {DS4_PRECISION_FAST, 0, 0, NULL};
    if (params) p = *params;
    int rc = check_params(&p, err);
    if (rc) return rc;

    ds4_model *m = calloc(1, sizeof *m);
    if (!m) return ds4_fail(err, DS4_ERR_NOMEM, "out of memory for the model");
    int *kinds = NULL;
    if ((rc = ds4_gguf_open(path, &m->gguf, err))) goto fail;
    if ((rc = ds4_model_config_read(m->gguf, &m->cfg, &kinds, err))) goto fail;
    if (!(m->layers = calloc((size_t)m->cfg.n_layer_all, sizeof *m->layers))) {
        rc = ds4_fail(err, DS4_ERR_NOMEM, "out of memory for %lld layers",
                      (long long)m->cfg.n_layer_all);
        goto fail;
    }
    if ((rc = bind_all(m, kinds, err))) goto fail;
    if (p.draft_head && (rc = attach_head(m, p.draft_head, err))) goto fail;
    free(kinds);
    resolve_params(m, &p);
    m->params.draft_head = NULL; /* the caller's string: read during the load only */
    *out = m;
    return ds4_ok(err);
fail:
    free(kinds);
    ds4_model_free(m);
    return rc;
}

void ds4_model_free(ds4_model *m) {
    if (!m) return;
    ds4_gguf_close(m->gguf);
    ds4_gguf_close(m->head_gguf);
    free(m->head_name_pool);
    free(m->layers);
    free(m->name_pool);
    free(m);
}

void ds4_model_get_config(const ds4_model *m, ds4_model_config *out) { *out = m->cfg; }

int ds4_model_layer_kind(const ds4_model *m, int64_t il) {
    return (il < 0 || il >= m->cfg.n_layer_all) ? -1 : m->layers[il].kind;
}

int64_t ds4_model_n_ctx(const ds4_model *m) { return m->params.n_ctx; }
int ds4_model_nextn_source(const ds4_model *m) { return m->nextn_source; }
int ds4_model_precision(const ds4_model *m) { return m->params.precision; }
int ds4_model_n_threads(const ds4_model *m) { return m->params.n_threads; }

/* ------------------------------------------------------ introspection -- */

/* Every slot, in the order ds4_model_get_tensor lists them: the globals,
 * then each block's slots in ds4_layer order. */
static const struct {
    const char *role;
    size_t off;
} LAYER_SLOTS[] = {
#define S(f) {#f, offsetof(ds4_layer, f)}
    S(attn_norm), S(post_attention_norm),
    S(attn_qkv), S(attn_gate), S(ssm_conv1d), S(ssm_dt_bias), S(ssm_a), S(ssm_beta),
    S(ssm_alpha), S(ssm_norm), S(ssm_out),
    S(attn_q), S(attn_k), S(attn_v), S(attn_output), S(attn_q_norm), S(attn_k_norm),
    S(ffn_gate), S(ffn_up), S(ffn_down),
    S(ffn_gate_inp), S(ffn_gate_exps), S(ffn_up_exps), S(ffn_gate_up_exps), S(ffn_down_exps),
    S(ffn_gate_inp_shexp), S(ffn_gate_shexp), S(ffn_up_shexp), S(ffn_down_shexp),
    S(nextn_eh_proj), S(nextn_enorm), S(nextn_hnorm), S(nextn_shared_head_norm),
    S(nextn_embed_tokens), S(nextn_shared_head_head),
#undef S
};
#define N_LAYER_SLOTS ((int64_t)(sizeof LAYER_SLOTS / sizeof LAYER_SLOTS[0]))

static const ds4_tensor *slot_at(const ds4_model *m, int64_t layer, int64_t s, const char **role) {
    if (layer < 0) {
        static const char *const g[] = {"token_embd", "output_norm", "output"};
        const ds4_tensor *t[] = {&m->token_embd, &m->output_norm, &m->output};
        *role = g[s];
        return t[s];
    }
    *role = LAYER_SLOTS[s].role;
    return (const ds4_tensor *)((const char *)&m->layers[layer] + LAYER_SLOTS[s].off);
}

/* Walk the filled slots; the i-th one (or the count, with i < 0). */
static int64_t walk(const ds4_model *m, int64_t want, ds4_model_tensor_info *out) {
    int64_t k = 0;
    for (int64_t layer = -1; layer < m->cfg.n_layer_all; layer++) {
        int64_t ns = layer < 0 ? 3 : N_LAYER_SLOTS;
        for (int64_t s = 0; s < ns; s++) {
            const char *role;
            const ds4_tensor *t = slot_at(m, layer, s, &role);
            if (!t->data) continue;
            if (k == want) {
                out->name = t->name;
                out->role = role;
                out->layer = layer;
                out->type = t->type;
                out->n_dims = t->n_dims;
                memcpy(out->ne, t->ne, sizeof out->ne);
                out->data = t->data;
                out->row_bytes = t->row_bytes;
                out->expert_bytes = t->expert_bytes;
                return k;
            }
            k++;
        }
    }
    return k;
}

int64_t ds4_model_n_tensors(const ds4_model *m) { return walk(m, -1, NULL); }

int ds4_model_get_tensor(const ds4_model *m, int64_t i, ds4_model_tensor_info *out,
                         ds4_error *err) {
    if (!m || !out) return ds4_fail(err, DS4_ERR_ARG, "ds4_model_get_tensor: NULL argument");
    int64_t n = ds4_model_n_tensors(m);
    if (i < 0 || i >= n)
        return ds4_fail(err, DS4_ERR_ARG, "tensor slot %lld out of range (the model has %lld)",
                        (long long)i, (long long)n);
    walk(m, i, out);
    return ds4_ok(err);
}
