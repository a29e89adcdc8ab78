/*
 * model_config.c — the qwen35 / qwen35moe metadata: which keys are read,
 * their defaults, and every consistency rule the forward pass relies on.
 *
 * Sources for keys and defaults (qwen35-spec.md §1): llama.cpp
 * src/llama-model.cpp llama_model_base::load_hparams (the generic keys) and
 * src/models/qwen35.cpp / qwen35moe.cpp load_arch_hparams (the rest).
 * We are stricter than llama.cpp in one way: anything it would accept but
 * then compute with differently from what our forward pass does (rope
 * scaling, expert groups, per-layer head counts, a rope section that is not
 * plain text position) is refused here, naming the key.
 *
 * Integer keys are accepted in any GGUF integer type (llama.cpp insists on
 * UINT32 for most); values are range-checked instead.
 */
#include "model_config.h"
#include "error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every dimension is capped at INT32_MAX: llama.cpp holds them in uint32,
 * and the cap keeps products of two of them inside int64. */
#define DIM_MAX INT32_MAX
/* llama.cpp src/llama-hparams.h LLAMA_MAX_LAYERS / LLAMA_MAX_EXPERTS: it
 * asserts block_count and expert_count against these. */
#define MAX_LAYERS 512
#define MAX_EXPERTS 1024

typedef struct {
    const ds4_gguf *g;
    const char *arch;
    ds4_error *err;
    char key[DS4_MODEL_KEY_MAX]; /* the key last looked up, for messages */
} kvr;

const char *ds4_model_arch_name(int arch) {
    return arch == DS4_ARCH_QWEN35MOE ? "qwen35moe" : "qwen35";
}

void ds4_model_quote(char *out, size_t cap, const char *s, size_t len) {
    size_t o = 0;
    if (cap < 8) {
        if (cap) out[0] = 0;
        return;
    }
    out[o++] = '\'';
    for (size_t i = 0; i < len && o + 6 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') out[o++] = (char)c;
        else o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
    }
    out[o++] = '\'';
    out[o] = 0;
}

static const char *value_type_name(int t) {
    static const char *names[] = {"UINT8", "INT8",   "UINT16", "INT16", "UINT32",
                                  "INT32", "FLOAT32", "BOOL",  "STRING", "ARRAY",
                                  "UINT64", "INT64", "FLOAT64"};
    return t >= 0 && t <= DS4_GGUF_FLOAT64 ? names[t] : "?";
}

static int is_int_type(int t) {
    return t == DS4_GGUF_UINT8 || t == DS4_GGUF_INT8 || t == DS4_GGUF_UINT16 ||
           t == DS4_GGUF_INT16 || t == DS4_GGUF_UINT32 || t == DS4_GGUF_INT32 ||
           t == DS4_GGUF_UINT64 || t == DS4_GGUF_INT64;
}

static int int_size(int t) {
    switch (t) {
    case DS4_GGUF_UINT8: case DS4_GGUF_INT8: case DS4_GGUF_BOOL: return 1;
    case DS4_GGUF_UINT16: case DS4_GGUF_INT16: return 2;
    case DS4_GGUF_UINT32: case DS4_GGUF_INT32: return 4;
    default: return 8;
    }
}

/* GGUF is little-endian; assemble bytes so the host order does not matter. */
static uint64_t le_bits(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* Element i of an integer (or BOOL) value at p. Returns 0, or -1 for a
 * UINT64 above INT64_MAX. */
static int decode_int(int t, const uint8_t *p, int64_t *out) {
    int n = int_size(t);
    uint64_t u = le_bits(p, n);
    switch (t) {
    case DS4_GGUF_INT8: *out = (int8_t)(uint8_t)u; return 0;
    case DS4_GGUF_INT16: *out = (int16_t)(uint16_t)u; return 0;
    case DS4_GGUF_INT32: *out = (int32_t)(uint32_t)u; return 0;
    case DS4_GGUF_INT64: *out = (int64_t)u; return 0;
    case DS4_GGUF_BOOL: *out = u != 0; return 0;
    default:
        if (u > (uint64_t)INT64_MAX) return -1;
        *out = (int64_t)u;
        return 0;
    }
}

static int lookup(kvr *r, const char *suffix, ds4_gguf_kv *kv) {
    snprintf(r->key, sizeof r->key, "%s.%s", r->arch, suffix);
    int64_t i = ds4_gguf_find_kv(r->g, r->key);
    if (i < 0) return 0;
    ds4_gguf_get_kv(r->g, i, kv, NULL); /* cannot fail for an index find returned */
    return 1;
}

static int missing(kvr *r) {
    return ds4_fail(r->err, DS4_ERR_NOT_FOUND, "required key '%s' is missing", r->key);
}

static int check_range(kvr *r, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo || v > hi)
        return ds4_fail(r->err, DS4_ERR_BAD_MODEL, "key '%s' = %lld is out of range [%lld, %lld]",
                        r->key, (long long)v, (long long)lo, (long long)hi);
    return DS4_OK;
}

/* An integer key. *found (may be NULL) says whether it was present. */
static int get_int(kvr *r, const char *suffix, int required, int64_t def, int64_t lo, int64_t hi,
                   int64_t *out, int *found) {
    ds4_gguf_kv kv;
    if (found) *found = 0;
    if (!lookup(r, suffix, &kv)) {
        if (required) return missing(r);
        *out = def;
        return DS4_OK;
    }
    if (!is_int_type(kv.type))
        return ds4_fail(r->err, DS4_ERR_BAD_MODEL, "key '%s' is %s; expected an integer", r->key,
                        value_type_name(kv.type));
    int64_t v;
    if (decode_int(kv.type, kv.value, &v))
        return ds4_fail(r->err, DS4_ERR_BAD_MODEL, "key '%s' is too large", r->key);
    int rc = check_range(r, v, lo, hi);
    if (rc) return rc;
    if (found) *found = 1;
    *out = v;
    return DS4_OK;
}

/* An integer key that llama.cpp reads with get_key_or_arr: one value, or an
 * array of one value per block. Per-layer values are not something the
 * engine runs, so an array must hold n equal values. */
static int get_int_or_arr(kvr *r, const char *suffix, int required, int64_t def, int64_t n,
                          int64_t lo, int64_t hi, int64_t *out, int *found) {
    ds4_gguf_kv kv;
    if (!lookup(r, suffix, &kv) || kv.type != DS4_GGUF_ARRAY)
        return get_int(r, suffix, required, def, lo, hi, out, found);
    if (!is_int_type(kv.array_type))
        return ds4_fail(r->err, DS4_ERR_BAD_MODEL, "key '%s' is an array of %s; expected integers",
                        r->key, value_type_name(kv.array_type));
    if ((int64_t)kv.array_count != n)
        return ds4_fail(r->err, DS4_ERR_BAD_MODEL,
                        "key '%s' has %llu entries; expected one per block (%lld)", r->key,
                        (unsigned long long)kv.array_count, (long long)n);
    int64_t first = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t v;
        if (decode_int(kv.array_type, kv.value + i * int_size(kv.array_type), &v))
            return ds4_fail(r->err, DS4_ERR_BAD_MODEL, "key '%s'[%lld] is too large", r->key,
                            (long long)i);
        if (i == 0) first = v;
        else if (v != first)
            return ds4_fail(r->err, DS4_ERR_UNSUPPORTED,
                            "key '%s' gives different values per block (%lld at block 0, %lld at "
                            "block %lld); ds4py runs only uniform layers",
                            r->key, (long long)first, (long long)v, (long long)i);
    }
    int rc = check_range(r, first, lo, hi);
    if (rc) return rc;
    if (found) *found = 1;
    *out = first;
    return DS4_OK;
}

static int get_float(kvr *r, const char *suffix, int required, float def, float *out, int *found) {
    ds4_gguf_kv kv;
    if (found) *found = 0;
    if (!lookup(r, suffix, &kv)) {
        if (required) return missing(r);
        *out = def;
        return DS4_OK;
    }
    if (kv.type == DS4_GGUF_FLOAT32) {
        uint32_t u = (uint32_t)le_bits(kv.value, 4);
        memcpy(out, &u, 4);
    } else if (kv.type == DS4_GGUF_FLOAT64) {
        uint64_t u = le_bits(kv.value, 8);
        double d;
        memcpy(&d, &u, 8);
        *out = (float)d;
    } else {
        return ds4_fail(r->err, DS4_ERR_BAD_MODEL, "key '%s' is %s; expected a float", r->key,
                        value_type_name(kv.type));
    }
    if (!isfinite(*out))
        return ds4_fail(r->err, DS4_ERR_BAD_MODEL, "key '%s' is not finite", r->key);
    if (found) *found = 1;
    return DS4_OK;
}

/* A string key compared with want; *found set when present. *equal is 1
 * when it equals one of the NULL-terminated list. */
static int get_string_in(kvr *r, const char *suffix, const char *const *allowed, int *found,
                         int *allowed_out) {
    ds4_gguf_kv kv;
    *found = 0;
    *allowed_out = 0;
    if (!lookup(r, suffix, &kv)) return DS4_OK;
    if (kv.type != DS4_GGUF_STRING)
        return ds4_fail(r->err, DS4_ERR_BAD_MODEL, "key '%s' is %s; expected a string", r->key,
                        value_type_name(kv.type));
    *found = 1;
    for (int i = 0; allowed[i]; i++)
        if (kv.value_nbytes == strlen(allowed[i]) &&
            memcmp(kv.value, allowed[i], kv.value_nbytes) == 0)
            *allowed_out = 1;
    return DS4_OK;
}

/* rope.dimension_sections: exactly 4 integers (llama.cpp get_key_or_arr(...,
 * 4, required) in load_arch_hparams; a scalar is repeated 4 times there). */
static int get_sections(kvr *r, int64_t sec[4]) {
    ds4_gguf_kv kv;
    if (!lookup(r, "rope.dimension_sections", &kv)) return missing(r);
    if (kv.type != DS4_GGUF_ARRAY) {
        int64_t v;
        int rc = get_int(r, "rope.dimension_sections", 1, 0, 0, DIM_MAX, &v, NULL);
        if (rc) return rc;
        for (int i = 0; i < 4; i++) sec[i] = v;
        return DS4_OK;
    }
    if (!is_int_type(kv.array_type))
        return ds4_fail(r->err, DS4_ERR_BAD_MODEL, "key '%s' is an array of %s; expected integers",
                        r->key, value_type_name(kv.array_type));
    if (kv.array_count != 4)
        return ds4_fail(r->err, DS4_ERR_BAD_MODEL, "key '%s' has %llu entries; expected 4", r->key,
                        (unsigned long long)kv.array_count);
    for (int i = 0; i < 4; i++) {
        if (decode_int(kv.array_type, kv.value + i * int_size(kv.array_type), &sec[i]) ||
            sec[i] < 0 || sec[i] > DIM_MAX)
            return ds4_fail(r->err, DS4_ERR_BAD_MODEL, "key '%s'[%d] is out of range", r->key, i);
    }
    return DS4_OK;
}

/* The rotated pairs must all take the text position. llama.cpp ropes these
 * architectures as IMROPE (src/llama-model.cpp llama_model_rope_type) with
 * positions [p, p, p, 0] for text; in ggml-cpu/ops.cpp ggml_mrope_cache_init
 * pair i uses sector s = i % sum(sections) and takes h if s%3==1 && s <
 * 3*sec[1], w if s%3==2 && s < 3*sec[2], t if s%3==0 && s < 3*sec[0], and the
 * 4th ("e", position 0 for text) otherwise. t=h=w=p, so as long as no rotated
 * pair lands on e, the rope is plain NEOX rope at p and the forward pass
 * needs no sections. A pair on e would not rotate at all; refuse that. */
static int check_sections(kvr *r, const int64_t sec[4], int64_t n_rot, int64_t head_dim) {
    int64_t sum = sec[0] + sec[1] + sec[2] + sec[3];
    snprintf(r->key, sizeof r->key, "%s.rope.dimension_sections", r->arch);
    if (sec[0] + sec[1] + sec[2] == 0)
        return ds4_fail(r->err, DS4_ERR_BAD_MODEL,
                        "key '%s' = [%lld, %lld, %lld, %lld]: the first three sections are all 0",
                        r->key, (long long)sec[0], (long long)sec[1], (long long)sec[2],
                        (long long)sec[3]);
    if (sum > head_dim) /* ggml_mrope_cache_init asserts sect_dims <= ne0 */
        return ds4_fail(r->err, DS4_ERR_BAD_MODEL,
                        "key '%s' sums to %lld, more than the head dimension %lld", r->key,
                        (long long)sum, (long long)head_dim);
    for (int64_t i = 0; i < n_rot / 2; i++) {
        int64_t s = i % sum;
        int text = (s % 3 == 1 && s < 3 * sec[1]) || (s % 3 == 2 && s < 3 * sec[2]) ||
                   (s % 3 == 0 && s < 3 * sec[0]);
        if (!text)
            return ds4_fail(r->err, DS4_ERR_UNSUPPORTED,
                            "key '%s' = [%lld, %lld, %lld, %lld] puts rotated pair %lld in the "
                            "4th (non-text) section; ds4py ropes text positions only",
                            r->key, (long long)sec[0], (long long)sec[1], (long long)sec[2],
                            (long long)sec[3], (long long)i);
    }
    return DS4_OK;
}

/* Rope scaling is generic in llama.cpp (load_hparams, llama-context.cpp):
 * a factor f != 0, 1 divides positions' angles, yarn changes the mix, and
 * attn_factor scales cos/sin. None is part of Qwen3.5; refuse them. */
static int check_rope_scaling(kvr *r) {
    static const char *const plain[] = {"none", "linear", NULL};
    int found, ok, rc;
    if ((rc = get_string_in(r, "rope.scaling.type", plain, &found, &ok))) return rc;
    if (found && !ok)
        return ds4_fail(r->err, DS4_ERR_UNSUPPORTED,
                        "key '%s': rope scaling other than none/linear is not supported", r->key);
    static const char *const factors[] = {"rope.scaling.factor", "rope.scale_linear",
                                          "rope.scaling.attn_factor"};
    for (int i = 0; i < 3; i++) {
        float f;
        if ((rc = get_float(r, factors[i], 0, 0.0f, &f, &found))) return rc;
        /* factor 0 means "none" for the first two (load_hparams); attn_factor
         * defaults to 1 */
        if (found && f != 1.0f && !(i < 2 && f == 0.0f))
            return ds4_fail(r->err, DS4_ERR_UNSUPPORTED,
                            "key '%s' = %g: rope scaling is not supported", r->key, (double)f);
    }
    return DS4_OK;
}

static int read_arch(const ds4_gguf *g, int *arch, ds4_error *err) {
    int64_t i = ds4_gguf_find_kv(g, "general.architecture");
    if (i < 0)
        return ds4_fail(err, DS4_ERR_NOT_FOUND, "required key 'general.architecture' is missing");
    ds4_gguf_kv kv;
    ds4_gguf_get_kv(g, i, &kv, NULL);
    if (kv.type != DS4_GGUF_STRING)
        return ds4_fail(err, DS4_ERR_BAD_MODEL, "key 'general.architecture' is %s; expected a string",
                        value_type_name(kv.type));
    const char *s = (const char *)kv.value;
    if (kv.value_nbytes == 6 && memcmp(s, "qwen35", 6) == 0) *arch = DS4_ARCH_QWEN35;
    else if (kv.value_nbytes == 9 && memcmp(s, "qwen35moe", 9) == 0) *arch = DS4_ARCH_QWEN35MOE;
    else {
        char q[96];
        ds4_model_quote(q, sizeof q, s, kv.value_nbytes < 64 ? kv.value_nbytes : 64);
        return ds4_fail(err, DS4_ERR_UNSUPPORTED,
                        "unsupported architecture %s (general.architecture); ds4py runs qwen35 "
                        "and qwen35moe",
                        q);
    }
    return DS4_OK;
}

static int read_attention(kvr *r, ds4_model_config *c) {
    int rc, found;
    int64_t n = c->n_layer_all, kl, vl;
    /* head_count is optional in load_hparams, but without it there is no
     * attention layer to run; the converter always writes it. */
    if ((rc = get_int_or_arr(r, "attention.head_count", 1, 0, n, 1, DIM_MAX, &c->n_head, NULL)))
        return rc;
    /* defaults from load_hparams: n_head_kv = n_head, head dims n_embd/n_head,
     * n_rot = head dim, rope base 10000 */
    if ((rc = get_int_or_arr(r, "attention.head_count_kv", 0, c->n_head, n, 1, DIM_MAX,
                             &c->n_head_kv, NULL)))
        return rc;
    int64_t hd_def = c->n_embd / c->n_head;
    if ((rc = get_int(r, "attention.key_length", 0, hd_def, 1, DIM_MAX, &kl, NULL))) return rc;
    if ((rc = get_int(r, "attention.value_length", 0, hd_def, 1, DIM_MAX, &vl, NULL))) return rc;
    if (kl != vl) /* qwen35*.cpp graph: GGML_ASSERT(n_embd_head_v == n_embd_head_k) */
        return ds4_fail(r->err, DS4_ERR_BAD_MODEL,
                        "%s.attention.key_length (%lld) != %s.attention.value_length (%lld); "
                        "the gated attention needs equal head dims",
                        r->arch, (long long)kl, r->arch, (long long)vl);
    c->head_dim = kl;
    if (c->n_head % c->n_head_kv != 0)
        return ds4_fail(r->err, DS4_ERR_BAD_MODEL,
                        "%s.attention.head_count (%lld) is not a multiple of "
                        "%s.attention.head_count_kv (%lld)",
                        r->arch, (long long)c->n_head, r->arch, (long long)c->n_head_kv);
    if ((rc = get_int(r, "rope.dimension_count", 0, c->head_dim, 0, DIM_MAX, &c->n_rot, NULL)))
        return rc;
    if (c->n_rot < 2 || c->n_rot % 2 || c->n_rot > c->head_dim)
        return ds4_fail(r->err, DS4_ERR_BAD_MODEL,
                        "%s.rope.dimension_count = %lld: must be even, >= 2 and <= the head "
                        "dimension %lld",
                        r->arch, (long long)c->n_rot, (long long)c->head_dim);
    if ((rc = get_float(r, "rope.freq_base", 0, 10000.0f, &c->rope_base, NULL))) return rc;
    if (!(c->rope_base > 0.0f))
        return ds4_fail(r->err, DS4_ERR_BAD_MODEL, "key '%s' = %g must be positive", r->key,
                        (double)c->rope_base);
    int64_t sec[4];
    if ((rc = get_sections(r, sec))) return rc;
    if ((rc = check_sections(r, sec, c->n_rot, c->head_dim))) return rc;
    if ((rc = check_rope_scaling(r))) return rc;
    /* attention.scale: llama.cpp's qwen35* graphs always use 1/sqrt(head_dim)
     * and never read this key, so a file that declares another scale is
     * ambiguous (its author meant something llama.cpp would not run). Fail
     * closed: accept absent, 0 or the value llama.cpp uses; refuse the rest. */
    float scale;
    const float default_scale = 1.0f / sqrtf((float)c->head_dim);
    if ((rc = get_float(r, "attention.scale", 0, 0.0f, &scale, &found))) return rc;
    if (scale != 0.0f && fabsf(scale - default_scale) > 1e-6f * default_scale)
        return ds4_fail(r->err, DS4_ERR_UNSUPPORTED,
                        "key '%s' = %g differs from 1/sqrt(head_dim) = %g, the only "
                        "attention scale qwen35 models run with (llama.cpp ignores the key)",
                        r->key, (double)scale, (double)default_scale);
    c->attn_scale = default_scale;
    return DS4_OK;
}

static int read_ssm(kvr *r, ds4_model_config *c) {
    int rc;
    /* all five are required by load_arch_hparams, even for a file without
     * GDN layers */
    if ((rc = get_int(r, "ssm.conv_kernel", 1, 0, 1, DIM_MAX, &c->ssm_conv_kernel, NULL))) return rc;
    if ((rc = get_int(r, "ssm.state_size", 1, 0, 1, DIM_MAX, &c->ssm_d_state, NULL))) return rc;
    if ((rc = get_int(r, "ssm.group_count", 1, 0, 1, DIM_MAX, &c->ssm_n_k, NULL))) return rc;
    if ((rc = get_int(r, "ssm.time_step_rank", 1, 0, 1, DIM_MAX, &c->ssm_n_v, NULL))) return rc;
    if ((rc = get_int(r, "ssm.inner_size", 1, 0, 1, DIM_MAX, &c->ssm_d_inner, NULL))) return rc;
    if (c->ssm_n_v % c->ssm_n_k != 0) /* qwen35*.cpp: GGML_ASSERT(num_v_heads % num_k_heads == 0) */
        return ds4_fail(r->err, DS4_ERR_BAD_MODEL,
                        "%s.ssm.time_step_rank (%lld value heads) is not a multiple of "
                        "%s.ssm.group_count (%lld key heads)",
                        r->arch, (long long)c->ssm_n_v, r->arch, (long long)c->ssm_n_k);
    /* llama.cpp sizes the value heads with ssm.state_size (load_block_trunk:
     * head_v_dim = ssm_d_state) but the graph reshapes with d_inner / n_v, so
     * the two must agree (qwen35-spec.md pitfall 15). */
    if (c->ssm_d_inner != c->ssm_n_v * c->ssm_d_state)
        return ds4_fail(r->err, DS4_ERR_BAD_MODEL,
                        "%s.ssm.inner_size (%lld) != %s.ssm.time_step_rank (%lld) * "
                        "%s.ssm.state_size (%lld): the value head dim must equal the state size",
                        r->arch, (long long)c->ssm_d_inner, r->arch, (long long)c->ssm_n_v,
                        r->arch, (long long)c->ssm_d_state);
    return DS4_OK;
}

static int read_ffn(kvr *r, ds4_model_config *c) {
    int rc, found;
    int64_t n = c->n_layer_all, n_ff;
    if (c->arch == DS4_ARCH_QWEN35) {
        if ((rc = get_int_or_arr(r, "feed_forward_length", 1, 0, n, 1, DIM_MAX, &c->n_ff, NULL)))
            return rc;
        int64_t ne;
        if ((rc = get_int(r, "expert_count", 0, 0, 0, INT64_MAX, &ne, NULL))) return rc;
        if (ne != 0)
            return ds4_fail(r->err, DS4_ERR_BAD_MODEL,
                            "key '%s' = %lld in a qwen35 (dense) file; a MoE model is qwen35moe",
                            r->key, (long long)ne);
        return DS4_OK;
    }
    if ((rc = get_int(r, "expert_count", 1, 0, 1, MAX_EXPERTS, &c->n_expert, NULL))) return rc;
    if ((rc = get_int_or_arr(r, "expert_used_count", 1, 0, n, 1, c->n_expert, &c->n_expert_used,
                             NULL)))
        return rc;
    int64_t groups;
    if ((rc = get_int(r, "expert_group_count", 0, 0, 0, INT64_MAX, &groups, NULL))) return rc;
    if (groups > 1) /* llama-graph.cpp build_moe_ffn then routes by group */
        return ds4_fail(r->err, DS4_ERR_UNSUPPORTED,
                        "key '%s' = %lld: grouped expert routing is not supported", r->key,
                        (long long)groups);
    /* qwen35moe.cpp load_block_trunk: n_ff_exp falls back to
     * n_ff / n_expert_used, n_ff_shexp to n_ff */
    if ((rc = get_int_or_arr(r, "feed_forward_length", 0, 0, n, 0, DIM_MAX, &n_ff, NULL))) return rc;
    if ((rc = get_int_or_arr(r, "expert_feed_forward_length", 0, 0, n, 0, DIM_MAX, &c->n_ff_exp,
                             &found)))
        return rc;
    if (c->n_ff_exp == 0) c->n_ff_exp = n_ff / c->n_expert_used;
    if (c->n_ff_exp == 0)
        return ds4_fail(r->err, DS4_ERR_NOT_FOUND,
                        "required key '%s.expert_feed_forward_length' is missing (and "
                        "feed_forward_length gives no fallback)",
                        r->arch);
    if ((rc = get_int(r, "expert_shared_feed_forward_length", 0, 0, 0, DIM_MAX, &c->n_ff_shexp,
                      NULL)))
        return rc;
    if (c->n_ff_shexp == 0) c->n_ff_shexp = n_ff;
    if (c->n_ff_shexp == 0)
        return ds4_fail(r->err, DS4_ERR_NOT_FOUND,
                        "required key '%s.expert_shared_feed_forward_length' is missing (and "
                        "feed_forward_length gives no fallback)",
                        r->arch);
    c->n_ff = 0;
    return DS4_OK;
}

/* Layer kinds (qwen35*.cpp load_arch_hparams): attention.recurrent_layers
 * (one bool/int per block) if present, else full_attention_interval
 * (default 4): block i < n_main is GDN iff (i+1) % interval != 0. */
static int read_kinds(kvr *r, const ds4_model_config *c, int *kinds) {
    int64_t n = c->n_layer_all, n_main = c->n_main;
    ds4_gguf_kv kv;
    if (lookup(r, "attention.recurrent_layers", &kv)) {
        int t = kv.type == DS4_GGUF_ARRAY ? kv.array_type : kv.type;
        if (t != DS4_GGUF_BOOL && !is_int_type(t))
            return ds4_fail(r->err, DS4_ERR_BAD_MODEL, "key '%s' holds %s; expected bools or integers",
                            r->key, value_type_name(t));
        if (kv.type == DS4_GGUF_ARRAY && (int64_t)kv.array_count != n)
            return ds4_fail(r->err, DS4_ERR_BAD_MODEL,
                            "key '%s' has %llu entries; expected one per block (block_count = %lld)",
                            r->key, (unsigned long long)kv.array_count, (long long)n);
        for (int64_t i = 0; i < n; i++) {
            int64_t v = 0;
            const uint8_t *p = kv.value + (kv.type == DS4_GGUF_ARRAY ? i * int_size(t) : 0);
            if (decode_int(t, p, &v)) v = 1; /* a huge UINT64 is still nonzero */
            if (i >= n_main && v != 0)
                return ds4_fail(r->err, DS4_ERR_BAD_MODEL,
                                "key '%s' marks block %lld recurrent, but it is the nextn (MTP) "
                                "block, which is always gated attention",
                                r->key, (long long)i);
            kinds[i] = i >= n_main ? DS4_LAYER_NEXTN : v ? DS4_LAYER_GDN : DS4_LAYER_ATTN;
        }
        return DS4_OK;
    }
    int64_t interval;
    int rc = get_int(r, "full_attention_interval", 0, 4, 1, DIM_MAX, &interval, NULL);
    if (rc) return rc;
    for (int64_t i = 0; i < n; i++)
        kinds[i] = i >= n_main ? DS4_LAYER_NEXTN
                   : (i + 1) % interval ? DS4_LAYER_GDN
                                        : DS4_LAYER_ATTN;
    return DS4_OK;
}

int ds4_model_config_read(const ds4_gguf *g, ds4_model_config *cfg, int **kinds_out,
                          ds4_error *err) {
    ds4_model_config c;
    memset(&c, 0, sizeof c);
    *kinds_out = NULL;
    int rc = read_arch(g, &c.arch, err);
    if (rc) return rc;
    kvr r = {g, ds4_model_arch_name(c.arch), err, {0}};

    if ((rc = get_int(&r, "block_count", 1, 0, 1, MAX_LAYERS, &c.n_layer_all, NULL))) return rc;
    if ((rc = get_int(&r, "nextn_predict_layers", 0, 0, 0, DIM_MAX, &c.n_nextn, NULL))) return rc;
    if (c.n_nextn >= c.n_layer_all)
        return ds4_fail(err, DS4_ERR_BAD_MODEL,
                        "%s.nextn_predict_layers (%lld) leaves no trunk layers "
                        "(%s.block_count = %lld)",
                        r.arch, (long long)c.n_nextn, r.arch, (long long)c.n_layer_all);
    if (c.n_nextn > 1) /* qwen35*.cpp graph_mtp: GGML_ASSERT(n_layer_nextn == 1) */
        return ds4_fail(err, DS4_ERR_UNSUPPORTED,
                        "%s.nextn_predict_layers = %lld: at most one nextn (MTP) block is "
                        "supported",
                        r.arch, (long long)c.n_nextn);
    c.n_main = c.n_layer_all - c.n_nextn;
    if ((rc = get_int(&r, "context_length", 1, 0, 1, DIM_MAX, &c.n_ctx_train, NULL))) return rc;
    if ((rc = get_int(&r, "embedding_length", 1, 0, 1, DIM_MAX, &c.n_embd, NULL))) return rc;
    if ((rc = get_float(&r, "attention.layer_norm_rms_epsilon", 1, 0.0f, &c.rms_eps, NULL)))
        return rc;
    if (!(c.rms_eps > 0.0f))
        return ds4_fail(err, DS4_ERR_BAD_MODEL, "key '%s' = %g must be positive", r.key,
                        (double)c.rms_eps);
    if ((rc = read_attention(&r, &c))) return rc;
    if ((rc = read_ssm(&r, &c))) return rc;
    if ((rc = read_ffn(&r, &c))) return rc;

    int *kinds = malloc((size_t)c.n_layer_all * sizeof *kinds);
    if (!kinds) return ds4_fail(err, DS4_ERR_NOMEM, "out of memory for %lld layer kinds",
                                (long long)c.n_layer_all);
    if ((rc = read_kinds(&r, &c, kinds))) {
        free(kinds);
        return rc;
    }
    *cfg = c;
    *kinds_out = kinds;
    return DS4_OK;
}
