/*
 * dflash_load.c — bind a classic DFlash drafter GGUF to a target model
 * (contract: forward/dflash.h). Everything that the forward pass could not
 * run correctly is refused here, naming the key or tensor (DESIGN.md
 * invariant 4, fail closed): a drafter silently run from the wrong layers
 * or with the wrong mask drafts garbage that verification then throws
 * away, which looks like "DFlash is slow" rather than like a bug.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds4.h"
#include "error.h"
#include "forward/dflash.h"
#include "model.h"

#define P "dflash."

/* ------------------------------------------------------------ metadata -- */

static int find(const ds4_gguf *g, const char *key, ds4_gguf_kv *kv) {
    int64_t i = ds4_gguf_find_kv(g, key);
    if (i < 0)
        return 0;
    ds4_error e;
    return ds4_gguf_get_kv(g, i, kv, &e) == DS4_OK;
}

/* An integer of any GGUF integer type (values were validated by gguf.c). */
static int int_value(int type, const uint8_t *v, int64_t *out) {
    switch (type) {
    case DS4_GGUF_UINT8: *out = v[0]; return 1;
    case DS4_GGUF_INT8: *out = (int8_t)v[0]; return 1;
    case DS4_GGUF_UINT16: { uint16_t x; memcpy(&x, v, 2); *out = x; return 1; }
    case DS4_GGUF_INT16: { int16_t x; memcpy(&x, v, 2); *out = x; return 1; }
    case DS4_GGUF_UINT32: { uint32_t x; memcpy(&x, v, 4); *out = x; return 1; }
    case DS4_GGUF_INT32: { int32_t x; memcpy(&x, v, 4); *out = x; return 1; }
    case DS4_GGUF_UINT64: { uint64_t x; memcpy(&x, v, 8); *out = x > INT64_MAX ? -1 : (int64_t)x; return 1; }
    case DS4_GGUF_INT64: { int64_t x; memcpy(&x, v, 8); *out = x; return 1; }
    default: return 0;
    }
}

static int int_size(int type) {
    switch (type) {
    case DS4_GGUF_UINT8: case DS4_GGUF_INT8: return 1;
    case DS4_GGUF_UINT16: case DS4_GGUF_INT16: return 2;
    case DS4_GGUF_UINT32: case DS4_GGUF_INT32: return 4;
    case DS4_GGUF_UINT64: case DS4_GGUF_INT64: return 8;
    default: return 0;
    }
}

/* A required (def < 0: absent is an error) integer key in [lo, hi]. */
static int get_int(const ds4_gguf *g, const char *key, int64_t def, int64_t lo, int64_t hi,
                   int64_t *out, ds4_error *err) {
    ds4_gguf_kv kv;
    if (!find(g, key, &kv)) {
        if (def < 0)
            return ds4_fail(err, DS4_ERR_BAD_MODEL, "DFlash drafter: missing key %s", key);
        *out = def;
        return DS4_OK;
    }
    if (kv.type == DS4_GGUF_BOOL || !int_value(kv.type, kv.value, out))
        return ds4_fail(err, DS4_ERR_BAD_MODEL, "DFlash drafter: key %s is not an integer", key);
    if (*out < lo || *out > hi)
        return ds4_fail(err, DS4_ERR_BAD_MODEL, "DFlash drafter: %s = %lld is out of range [%lld, %lld]",
                        key, (long long)*out, (long long)lo, (long long)hi);
    return DS4_OK;
}

static int get_float(const ds4_gguf *g, const char *key, float *out, ds4_error *err) {
    ds4_gguf_kv kv;
    if (!find(g, key, &kv))
        return ds4_fail(err, DS4_ERR_BAD_MODEL, "DFlash drafter: missing key %s", key);
    if (kv.type == DS4_GGUF_FLOAT32) {
        memcpy(out, kv.value, 4);
    } else if (kv.type == DS4_GGUF_FLOAT64) {
        double x;
        memcpy(&x, kv.value, 8);
        *out = (float)x;
    } else {
        return ds4_fail(err, DS4_ERR_BAD_MODEL, "DFlash drafter: key %s is not a float", key);
    }
    if (!(*out > 0.0f) || *out != *out || *out > 1e30f)
        return ds4_fail(err, DS4_ERR_BAD_MODEL, "DFlash drafter: %s = %g must be positive and finite",
                        key, (double)*out);
    return DS4_OK;
}

/* Keys whose presence means a mask or variant this engine does not run. */
static int refuse_unsupported_keys(const ds4_gguf *g, ds4_error *err) {
    static const char *const dflash2[] = {P "conv_kernel_size", P "conv_group_size",
                                          P "selector_rank", P "selector_top_k"};
    for (size_t i = 0; i < sizeof dflash2 / sizeof dflash2[0]; i++)
        if (ds4_gguf_find_kv(g, dflash2[i]) >= 0)
            return ds4_fail(err, DS4_ERR_UNSUPPORTED,
                            "DFlash2 drafters are not supported (the file has %s)", dflash2[i]);
    static const char *const window[] = {P "attention.sliding_window",
                                         P "attention.sliding_window_pattern",
                                         P "attention.full_layer"};
    for (size_t i = 0; i < sizeof window / sizeof window[0]; i++)
        if (ds4_gguf_find_kv(g, window[i]) >= 0)
            return ds4_fail(err, DS4_ERR_UNSUPPORTED,
                            "DFlash drafter: %s (a windowed attention mask) is not supported; "
                            "classic DFlash attends to the whole context", window[i]);
    ds4_gguf_kv kv;
    if (find(g, P "attention.causal", &kv)) {
        if (kv.type != DS4_GGUF_BOOL)
            return ds4_fail(err, DS4_ERR_BAD_MODEL, "DFlash drafter: %sattention.causal is not a bool", P);
        if (kv.value[0])
            return ds4_fail(err, DS4_ERR_UNSUPPORTED,
                            "DFlash drafter: %sattention.causal = true is not supported; classic "
                            "DFlash blocks are non-causal", P);
    }
    return DS4_OK;
}

/* ------------------------------------------------------------- tensors -- */

typedef struct {
    char name[64];
    float **dst;
    int64_t ne0, ne1;       /* ne1 == 0: a vector */
} want;

static int name_has(const ds4_gguf_tensor *t, const char *s) {
    size_t n = strlen(s);
    for (uint64_t i = 0; i + n <= t->name_len; i++)
        if (memcmp(t->name + i, s, n) == 0)
            return 1;
    return 0;
}

static int name_eq(const ds4_gguf_tensor *t, const char *s) {
    return t->name_len == strlen(s) && memcmp(t->name, s, t->name_len) == 0;
}

/* Tensors that identify another model, with the reason. */
static int refuse_foreign_tensor(const ds4_gguf_tensor *t, ds4_error *err) {
    int len = (int)(t->name_len > 200 ? 200 : t->name_len);
    if (name_has(t, "attn_conv_base") || name_has(t, "ffn_conv_base") || name_has(t, "selector"))
        return ds4_fail(err, DS4_ERR_UNSUPPORTED,
                        "DFlash2 drafters are not supported (the file has tensor %.*s)", len, t->name);
    if (name_eq(t, "token_embd.weight") || name_eq(t, "output.weight") || name_has(t, "d2t"))
        return ds4_fail(err, DS4_ERR_UNSUPPORTED,
                        "DFlash drafter: tensor %.*s: a drafter with its own embedding or LM head "
                        "(a reduced-vocabulary export) is not supported; classic DFlash shares the "
                        "target's", len, t->name);
    if (name_has(t, ".bias"))
        return ds4_fail(err, DS4_ERR_UNSUPPORTED,
                        "DFlash drafter: tensor %.*s: biases are not part of the classic layout",
                        len, t->name);
    return ds4_fail(err, DS4_ERR_BAD_MODEL, "DFlash drafter: unexpected tensor %.*s", len, t->name);
}

static int bind_tensors(ds4_dflash *d, const ds4_gguf *g, ds4_error *err) {
    const ds4_dflash_config *c = &d->cfg;
    int64_t E = c->n_embd, hd = c->head_dim, qd = c->n_head * hd, kd = c->n_head_kv * hd;
    int64_t n_want = 3 + 11 * c->n_layer;
    want *w = calloc((size_t)n_want, sizeof *w);
    if (!w)
        return ds4_fail(err, DS4_ERR_NOMEM, "DFlash drafter: out of memory");
    int64_t k = 0;
#define WANT(nm, ptr, a, b) do { snprintf(w[k].name, sizeof w[k].name, "%s", nm); \
        w[k].dst = (ptr); w[k].ne0 = (a); w[k].ne1 = (b); k++; } while (0)
    WANT("fc.weight", &d->fc, c->n_taps * E, E);
    WANT("enc.output_norm.weight", &d->enc_norm, E, 0);
    WANT("output_norm.weight", &d->out_norm, E, 0);
    for (int64_t il = 0; il < c->n_layer; il++) {
        ds4_dflash_layer *L = &d->layers[il];
        char nm[64];
#define WL(suffix, field, a, b) do { snprintf(nm, sizeof nm, "blk.%lld." suffix ".weight", \
        (long long)il); WANT(nm, &L->field, a, b); } while (0)
        WL("attn_norm", attn_norm, E, 0);
        WL("attn_q", wq, E, qd);
        WL("attn_k", wk, E, kd);
        WL("attn_v", wv, E, kd);
        WL("attn_output", wo, qd, E);
        WL("attn_q_norm", q_norm, hd, 0);
        WL("attn_k_norm", k_norm, hd, 0);
        WL("ffn_norm", ffn_norm, E, 0);
        WL("ffn_gate", gate, E, c->n_ff);
        WL("ffn_up", up, E, c->n_ff);
        WL("ffn_down", down, c->n_ff, E);
#undef WL
    }
#undef WANT
    int rc = DS4_OK;
    /* every tensor in the file must be one we bind */
    int64_t nt = ds4_gguf_n_tensors(g);
    for (int64_t i = 0; i < nt && rc == DS4_OK; i++) {
        ds4_gguf_tensor t;
        if ((rc = ds4_gguf_get_tensor(g, i, &t, err)) != DS4_OK)
            break;
        int known = 0;
        for (int64_t j = 0; j < n_want && !known; j++)
            known = name_eq(&t, w[j].name);
        if (!known)
            rc = refuse_foreign_tensor(&t, err);
    }
    /* sizes first, so one allocation holds every weight */
    size_t total = 0;
    for (int64_t j = 0; j < n_want && rc == DS4_OK; j++) {
        int64_t i = ds4_gguf_find_tensor(g, w[j].name);
        ds4_gguf_tensor t;
        if (i < 0) {
            rc = ds4_fail(err, DS4_ERR_BAD_MODEL, "DFlash drafter: missing tensor %s", w[j].name);
            break;
        }
        if ((rc = ds4_gguf_get_tensor(g, i, &t, err)) != DS4_OK)
            break;
        int dims = w[j].ne1 ? 2 : 1;
        if (t.n_dims != dims || t.ne[0] != w[j].ne0 || (dims == 2 && t.ne[1] != w[j].ne1)) {
            rc = ds4_fail(err, DS4_ERR_BAD_MODEL,
                          "DFlash drafter: tensor %s has shape {%lld, %lld} (%d-D), expected {%lld, %lld}",
                          w[j].name, (long long)t.ne[0], (long long)t.ne[1], t.n_dims,
                          (long long)w[j].ne0, (long long)(dims == 2 ? w[j].ne1 : 1));
            break;
        }
        ds4_type_info ti;
        if ((rc = ds4_type_get_info(t.type, &ti, err)) != DS4_OK)
            break;
        if (!(ti.flags & DS4_TYPE_DEQUANT)) {
            rc = ds4_fail(err, DS4_ERR_UNSUPPORTED, "DFlash drafter: tensor %s has type %s, which "
                          "cannot be dequantized", w[j].name, ti.name);
            break;
        }
        total += (size_t)(w[j].ne0 * (w[j].ne1 ? w[j].ne1 : 1));
    }
    if (rc == DS4_OK) {
        d->weights = malloc(total * sizeof(float));
        if (!d->weights)
            rc = ds4_fail(err, DS4_ERR_NOMEM, "DFlash drafter: out of memory for %zu weights", total);
    }
    float *at = d->weights;
    for (int64_t j = 0; j < n_want && rc == DS4_OK; j++) {
        ds4_gguf_tensor t;
        rc = ds4_gguf_get_tensor(g, ds4_gguf_find_tensor(g, w[j].name), &t, err);
        int64_t rows = w[j].ne1 ? w[j].ne1 : 1;
        size_t row_bytes = (size_t)(t.nbytes / (uint64_t)rows);
        for (int64_t r = 0; r < rows && rc == DS4_OK; r++)
            rc = ds4_dequantize_row(DS4_ISA_AUTO, t.type, t.data + (size_t)r * row_bytes,
                                    at + r * w[j].ne0, w[j].ne0, err);
        *w[j].dst = at;
        at += w[j].ne0 * rows;
    }
    free(w);
    return rc;
}

/* ---------------------------------------------------------------- load -- */

static int read_config(ds4_dflash *d, const ds4_gguf *g, const ds4_model_config *tc,
                       ds4_error *err) {
    ds4_dflash_config *c = &d->cfg;
    ds4_gguf_kv kv;
    int rc;
    if (!find(g, "general.architecture", &kv) || kv.type != DS4_GGUF_STRING)
        return ds4_fail(err, DS4_ERR_BAD_MODEL, "not a DFlash drafter: general.architecture is missing");
    if (kv.value_nbytes != 6 || memcmp(kv.value, "dflash", 6) != 0)
        return ds4_fail(err, DS4_ERR_BAD_MODEL,
                        "not a DFlash drafter: general.architecture is '%.*s', expected 'dflash'",
                        (int)(kv.value_nbytes > 64 ? 64 : kv.value_nbytes), (const char *)kv.value);
    /* version first: a DFlash2 file must be named as such, not as whatever
     * key it lacks */
    if ((rc = get_int(g, P "version", 0, 0, INT64_MAX, &c->version, err)) != DS4_OK)
        return rc;
    if (c->version == 2)
        return ds4_fail(err, DS4_ERR_UNSUPPORTED,
                        "DFlash2 drafters are not supported (dflash.version = 2); only classic "
                        "DFlash (version 0 or 1) is");
    if (c->version > 2)
        return ds4_fail(err, DS4_ERR_UNSUPPORTED,
                        "dflash.version = %lld is not supported (classic DFlash is version 0 or 1)",
                        (long long)c->version);
    if ((rc = refuse_unsupported_keys(g, err)) != DS4_OK)
        return rc;
    if ((rc = get_int(g, P "block_count", -1, 1, 64, &c->n_layer, err)) ||
        (rc = get_int(g, P "embedding_length", -1, 1, 1 << 16, &c->n_embd, err)) ||
        (rc = get_int(g, P "feed_forward_length", -1, 1, 1 << 20, &c->n_ff, err)) ||
        (rc = get_int(g, P "attention.head_count", -1, 1, 1024, &c->n_head, err)) ||
        (rc = get_int(g, P "attention.head_count_kv", -1, 1, 1024, &c->n_head_kv, err)) ||
        (rc = get_int(g, P "attention.key_length", -1, 2, 1024, &c->head_dim, err)) ||
        (rc = get_int(g, P "block_size", -1, 0, INT64_MAX, &c->block_size, err)) ||
        (rc = get_int(g, "tokenizer.ggml.mask_token_id", -1, 0, INT64_MAX, &c->mask_token_id, err)) ||
        (rc = get_float(g, P "attention.layer_norm_rms_epsilon", &c->rms_eps, err)) ||
        (rc = get_float(g, P "rope.freq_base", &c->rope_base, err)))
        return rc;
    if (c->n_embd != tc->n_embd)
        return ds4_fail(err, DS4_ERR_BAD_MODEL,
                        "DFlash drafter: dflash.embedding_length = %lld but the target's n_embd is "
                        "%lld (the drafter reads the target's embedding and hidden states)",
                        (long long)c->n_embd, (long long)tc->n_embd);
    if (c->head_dim % 2)
        return ds4_fail(err, DS4_ERR_BAD_MODEL, "DFlash drafter: attention.key_length = %lld must be "
                        "even (RoPE turns pairs)", (long long)c->head_dim);
    if (c->n_head * c->head_dim != c->n_embd)
        return ds4_fail(err, DS4_ERR_UNSUPPORTED, "DFlash drafter: head_count * key_length = %lld * "
                        "%lld != embedding_length %lld (classic DFlash needs them equal)",
                        (long long)c->n_head, (long long)c->head_dim, (long long)c->n_embd);
    if (c->n_head % c->n_head_kv)
        return ds4_fail(err, DS4_ERR_BAD_MODEL, "DFlash drafter: head_count %lld is not a multiple "
                        "of head_count_kv %lld", (long long)c->n_head, (long long)c->n_head_kv);
    if (c->block_size < 2 || c->block_size > DS4_DFLASH_MAX_BLOCK)
        return ds4_fail(err, DS4_ERR_UNSUPPORTED, "DFlash drafter: dflash.block_size = %lld: "
                        "supported 2..%d (one anchor row plus at most %d drafts, the widest verify)",
                        (long long)c->block_size, DS4_DFLASH_MAX_BLOCK, DS4_VERIFY_MAX - 1);
    if (c->mask_token_id >= tc->n_vocab)
        return ds4_fail(err, DS4_ERR_BAD_MODEL, "DFlash drafter: tokenizer.ggml.mask_token_id = %lld "
                        "is not a token of the target (n_vocab %lld)",
                        (long long)c->mask_token_id, (long long)tc->n_vocab);
    /* the taps */
    if (!find(g, P "target_layers", &kv))
        return ds4_fail(err, DS4_ERR_BAD_MODEL, "DFlash drafter: missing key %starget_layers", P);
    if (kv.type != DS4_GGUF_ARRAY || !int_size(kv.array_type))
        return ds4_fail(err, DS4_ERR_BAD_MODEL, "DFlash drafter: %starget_layers is not an integer array", P);
    if (kv.array_count < 1 || kv.array_count > DS4_DFLASH_MAX_TAPS)
        return ds4_fail(err, DS4_ERR_UNSUPPORTED, "DFlash drafter: %starget_layers has %llu entries "
                        "(supported 1..%d)", P, (unsigned long long)kv.array_count, DS4_DFLASH_MAX_TAPS);
    c->n_taps = (int64_t)kv.array_count;
    for (int64_t i = 0; i < c->n_taps; i++) {
        int64_t id;
        int_value(kv.array_type, kv.value + i * int_size(kv.array_type), &id);
        /* version 0 (llama.cpp's converter) stores "the residual entering
         * layer id", i.e. the output of layer id - 1 (dflash.h) */
        int64_t l = c->version == 0 ? id - 1 : id;
        if (l < 0 || l >= tc->n_main)
            return ds4_fail(err, DS4_ERR_BAD_MODEL,
                            "DFlash drafter: %starget_layers[%lld] = %lld is trunk layer %lld, outside "
                            "the target's trunk [0, %lld)%s", P, (long long)i, (long long)id,
                            (long long)l, (long long)tc->n_main,
                            c->version == 0 ? " (version 0 stores layers + 1)" : "");
        c->target_layers[i] = l;
    }
    return DS4_OK;
}

int ds4_dflash_load(const char *path, const ds4_model *target, ds4_dflash **out,
                    ds4_error *err) {
    if (!out)
        return ds4_fail(err, DS4_ERR_ARG, "ds4_dflash_load: out is NULL");
    *out = NULL;
    if (!path || !target)
        return ds4_fail(err, DS4_ERR_ARG, "ds4_dflash_load: path and target are required");
    ds4_gguf *g = NULL;
    int rc = ds4_gguf_open(path, &g, err);
    if (rc != DS4_OK)
        return rc;
    ds4_dflash *d = calloc(1, sizeof *d);
    if (!d) {
        ds4_gguf_close(g);
        return ds4_fail(err, DS4_ERR_NOMEM, "DFlash drafter: out of memory");
    }
    ds4_model_config tc;
    ds4_model_get_config(target, &tc);
    d->target = target;
    d->n_vocab = tc.n_vocab;
    d->n_ctx = ds4_model_n_ctx(target);
    rc = read_config(d, g, &tc, err);
    if (rc == DS4_OK) {
        d->layers = calloc((size_t)d->cfg.n_layer, sizeof *d->layers);
        rc = d->layers ? bind_tensors(d, g, err)
                       : ds4_fail(err, DS4_ERR_NOMEM, "DFlash drafter: out of memory");
    }
    /* weights were copied out (dequantized): the mapping is not needed */
    ds4_gguf_close(g);
    if (rc != DS4_OK) {
        ds4_dflash_free(d);
        return rc;
    }
    *out = d;
    return DS4_OK;
}

void ds4_dflash_free(ds4_dflash *d) {
    if (!d)
        return;
    free(d->weights);
    free(d->layers);
    free(d);
}

void ds4_dflash_get_config(const ds4_dflash *d, ds4_dflash_config *out) {
    *out = d->cfg;
}
