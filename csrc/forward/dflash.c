/*
 * dflash.c — the classic DFlash drafter's forward pass and its persistent
 * context KV (contract and sources: dflash.h).
 *
 * Everything runs in F32 over the dequantized drafter weights (dflash_load.c)
 * plus the target's token_embd rows and LM head, read from the target's
 * mapping. Every output element is one dot product in a fixed order inside
 * one pool item, so results do not depend on the thread count; rows do not
 * interact except through attention, so ds4_dflash_ctx_add over n rows in
 * one call equals n one-row calls bit for bit (the context rows' K/V depend
 * only on their own taps and position).
 *
 * Fast precision (the target loaded with DS4_PRECISION_FAST, the default):
 * the drafter rounds like the target's own fast matmuls -- its matrices as
 * Q8_0 (quantized from the F32 copy when the context is created) against
 * Q8_0-quantized activation rows through the ISA's int8 dot kernel, and the
 * LM head in its file type against its paired activation type. A draft only
 * proposes (the target verifies every token), so this changes acceptance at
 * most, never output; exact precision keeps the all-F32 path the numpy
 * reference tests pin (tests/test_dflash.py). Still per row and per output
 * element in a fixed order: thread-count and batch invariant as above.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../error.h"
#include "../model.h"
#include "dflash.h"
#include "forward.h"

/* Context rows projected per step of ds4_dflash_ctx_add: bounds scratch. */
#define CTX_CHUNK 64
/* Output rows per pool item of a matmul / the LM head. */
#define MM_BLOCK 16
#define HEAD_BLOCK 64

/* A drafter matrix's Q8_0 copy, found by its F32 pointer (mm's key). */
typedef struct {
    const float *f;
    const uint8_t *q;
} qmat;

/* Activation rows quantized at once in fast precision: the larger of the
 * block's B rows and a context chunk. */
#define XQ_ROWS (CTX_CHUNK > 64 ? CTX_CHUNK : 64)

struct ds4_dflash_ctx {
    ds4_dflash *d;
    ds4_pool *pool;
    int n_threads;
    const ds4_kernel_set *k;
    int64_t n_layer;         /* copied: freeing must not read the drafter (any free order) */
    int64_t n, cap;          /* context rows held, and room */
    float **kc, **vc;        /* per layer: cap rows of n_head_kv*head_dim (K normed + roped) */
    /* block scratch, B rows */
    float *h, *a, *q, *kb, *vb, *o, *t, *g, *u;
    float *logits;           /* (B-1) x n_vocab */
    int64_t n_logit_rows;
    float *scores;           /* n_threads x (cap + B) */
    float *head_rows;        /* n_threads x n_embd: a dequantized LM-head row (no f32 dot) */
    /* context scratch, CTX_CHUNK rows */
    float *cfc, *cx;
    /* fast precision: Q8_0 copies of the drafter's matrices (NULL: F32 path) */
    qmat *qm;
    int n_qm;
    uint8_t *qstore;
    uint8_t *xq;             /* quantized activation rows, xq_row bytes each */
    size_t xq_row;
    uint8_t *xp;             /* the same packed for a multi-row kernel, xp_row bytes each */
    size_t xp_row;
};

/* ---------------------------------------------------------------- math -- */

/* Eight running sums in a fixed order (vectorizable, deterministic). */
static float dot_f32(const float *a, const float *b, int64_t n) {
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            acc[j] += a[i + j] * b[i + j];
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* NeoX rotate-half over the whole head: pair (i, i + hd/2) turns by
 * pos * base^(-2i/hd); the angle in double like the PyTorch reference. */
static void rope_neox(float *x, int64_t hd, int64_t pos, float base) {
    int64_t half = hd / 2;
    for (int64_t i = 0; i < half; i++) {
        double ang = (double)pos * pow((double)base, -(double)(2 * i) / (double)hd);
        float c = (float)cos(ang), s = (float)sin(ang);
        float x1 = x[i], x2 = x[i + half];
        x[i] = x1 * c - x2 * s;
        x[i + half] = x2 * c + x1 * s;
    }
}

typedef struct {
    const float *w;
    int64_t n_in, n_out;
    const float *x;
    float *y;
    int64_t y_stride, n_rows;
} mm_args;

static void mm_fn(void *ctx, int64_t i0, int64_t i1, int ith) {
    const mm_args *a = ctx;
    for (int64_t it = i0; it < i1; it++) {
        int64_t o0 = it * MM_BLOCK, o1 = o0 + MM_BLOCK < a->n_out ? o0 + MM_BLOCK : a->n_out;
        for (int64_t r = 0; r < a->n_rows; r++)
            for (int64_t o = o0; o < o1; o++)
                a->y[r * a->y_stride + o] = dot_f32(a->w + o * a->n_in, a->x + r * a->n_in, a->n_in);
    }
}

/* Multi-row kernel calls take at most this many activation rows. */
#define ROWS_CALL 8

/* Activation rows prepared for one weight type: quantized to its paired
 * type and, where the ISA has a multi-row kernel for the type, in that
 * kernel's layout (each weight block then read once for all rows; the
 * kernel is bit-identical to vec_dot per row, quants.h). */
typedef struct {
    ds4_vec_dot_fn dot;
    ds4_dot_rows_fn rows;        /* NULL: dot row by row */
    const void *ptr[XQ_ROWS];
    int64_t nr;
} qrows;

static void prep_rows(ds4_dflash_ctx *c, int type, const float *x, int64_t n, int64_t nr,
                      qrows *q) {
    const ds4_kernel_set *k = c->k;
    int vdt = ds4_type_traits_table[type].vec_dot_type;
    q->dot = k->vec_dot[type];
    q->rows = k->dot_rows[type] && ds4_rows_act_bytes(k, type, n) <= c->xp_row ? k->dot_rows[type]
                                                                               : NULL;
    q->nr = nr;
    for (int64_t r = 0; r < nr; r++) {
        uint8_t *xr = c->xq + (size_t)r * c->xq_row;
        k->from_float[vdt](x + r * n, xr, n);
        q->ptr[r] = xr;
        if (q->rows && k->pack_rows[type]) {
            uint8_t *pr = c->xp + (size_t)r * c->xp_row;
            k->pack_rows[type](xr, pr, n);
            q->ptr[r] = pr;
        }
    }
}

/* s[r] = w . row r, for every prepared row. */
static void dot_all(const qrows *q, int64_t n, const uint8_t *w, float *s) {
    if (q->rows) {
        for (int64_t r0 = 0; r0 < q->nr; r0 += ROWS_CALL)
            q->rows(n, (int)(q->nr - r0 < ROWS_CALL ? q->nr - r0 : ROWS_CALL), s + r0, w,
                    q->ptr + r0);
        return;
    }
    for (int64_t r = 0; r < q->nr; r++)
        q->dot(n, &s[r], w, q->ptr[r]);
}

typedef struct {
    const qrows *q;
    const uint8_t *w;     /* n_out rows of w_rb bytes */
    size_t w_rb;
    int64_t n_in, n_out;
    float *y;
    int64_t y_stride;
} mmq_args;

static void mmq_fn(void *ctx, int64_t i0, int64_t i1, int ith) {
    (void)ith;
    const mmq_args *a = ctx;
    float s[XQ_ROWS];
    for (int64_t it = i0; it < i1; it++) {
        int64_t o0 = it * MM_BLOCK, o1 = o0 + MM_BLOCK < a->n_out ? o0 + MM_BLOCK : a->n_out;
        for (int64_t o = o0; o < o1; o++) {
            dot_all(a->q, a->n_in, a->w + (size_t)o * a->w_rb, s);
            for (int64_t r = 0; r < a->q->nr; r++)
                a->y[r * a->y_stride + o] = s[r];
        }
    }
}

static const uint8_t *qmat_of(const ds4_dflash_ctx *c, const float *w) {
    for (int i = 0; i < c->n_qm; i++)
        if (c->qm[i].f == w)
            return c->qm[i].q;
    return NULL;
}

static size_t q8_row_bytes(int64_t n) { return (size_t)(n / QK8_0) * sizeof(block_q8_0); }

/* y[r][o] = W[o] . x[r]; x rows are n_in long and contiguous. */
static void mm(ds4_dflash_ctx *c, const float *w, int64_t n_in, int64_t n_out, const float *x,
               float *y, int64_t y_stride, int64_t n_rows) {
    const uint8_t *wq = c->qm ? qmat_of(c, w) : NULL;
    if (wq) {
        for (int64_t r0 = 0; r0 < n_rows; r0 += XQ_ROWS) {
            int64_t m = n_rows - r0 < XQ_ROWS ? n_rows - r0 : XQ_ROWS;
            qrows q;
            prep_rows(c, DS4_TYPE_Q8_0, x + r0 * n_in, n_in, m, &q);
            mmq_args a = {&q, wq, q8_row_bytes(n_in), n_in, n_out, y + r0 * y_stride, y_stride};
            ds4_pool_for(c->pool, (n_out + MM_BLOCK - 1) / MM_BLOCK, mmq_fn, &a);
        }
        return;
    }
    mm_args a = {w, n_in, n_out, x, y, y_stride, n_rows};
    ds4_pool_for(c->pool, (n_out + MM_BLOCK - 1) / MM_BLOCK, mm_fn, &a);
}

/* Per-head RMSNorm (weight w) and RoPE at pos of n_heads heads of x. */
static void norm_rope_heads(float *x, int64_t n_heads, int64_t hd, const float *w, float eps,
                            int64_t pos, float base) {
    for (int64_t j = 0; j < n_heads; j++) {
        ds4_rmsnorm(x + j * hd, w, x + j * hd, hd, eps);
        rope_neox(x + j * hd, hd, pos, base);
    }
}

/* ----------------------------------------------------------- the state -- */

static void ctx_release(ds4_dflash_ctx *c) {
    if (c->kc)
        for (int64_t l = 0; l < c->n_layer; l++)
            free(c->kc[l]), free(c->vc[l]);
    free(c->kc), free(c->vc);
    free(c->h), free(c->a), free(c->q), free(c->kb), free(c->vb), free(c->o), free(c->t);
    free(c->g), free(c->u), free(c->logits), free(c->scores), free(c->head_rows);
    free(c->cfc), free(c->cx);
    free(c->qm), free(c->qstore), free(c->xq), free(c->xp);
    if (c->pool)
        ds4_pool_free(c->pool);
    free(c);
}

/* Bytes of n values of the LM head's paired activation type (0: none). */
static size_t head_act_bytes(const ds4_dflash_ctx *c, int64_t n) {
    const ds4_tensor *head = ds4_model_head(c->d->target);
    int vdt = ds4_type_traits_table[head->type].vec_dot_type;
    if (vdt < 0 || !c->k->vec_dot[head->type] || !c->k->from_float[vdt] ||
        n % ds4_type_traits_table[vdt].block_size)
        return 0;
    return (size_t)(n / ds4_type_traits_table[vdt].block_size) *
           (size_t)ds4_type_traits_table[vdt].type_size;
}

/* Fast precision: the Q8_0 copies of every matrix (file comment). A matrix
 * whose rows are not whole Q8_0 blocks keeps the F32 path. */
static int quantize_matrices(ds4_dflash_ctx *c, ds4_error *err) {
    const ds4_dflash *d = c->d;
    const ds4_dflash_config *cf = &d->cfg;
    if (!c->k->from_float[DS4_TYPE_Q8_0] || !c->k->vec_dot[DS4_TYPE_Q8_0])
        return DS4_OK;
    int64_t E = cf->n_embd, qd = cf->n_head * cf->head_dim, kd = cf->n_head_kv * cf->head_dim;
    if (cf->n_layer < 1 || cf->n_layer > 64)
        return DS4_OK; /* no drafter has this many layers; keep F32 rather than overflow */
    const int n = 1 + 7 * (int)cf->n_layer;
    const float *ws[1 + 7 * 64];
    int64_t ins[1 + 7 * 64], outs[1 + 7 * 64];
    ws[0] = d->fc, ins[0] = cf->n_taps * E, outs[0] = E;
    for (int64_t l = 0; l < cf->n_layer; l++) {
        const ds4_dflash_layer *L = &d->layers[l];
        const float *m[7] = {L->wq, L->wk, L->wv, L->wo, L->gate, L->up, L->down};
        int64_t in[7] = {E, E, E, qd, E, E, cf->n_ff}, o[7] = {qd, kd, kd, E, cf->n_ff, cf->n_ff, E};
        for (int j = 0; j < 7; j++)
            ws[1 + 7 * l + j] = m[j], ins[1 + 7 * l + j] = in[j], outs[1 + 7 * l + j] = o[j];
    }
    const ds4_tensor *head = ds4_model_head(d->target);
    size_t total = 0, max_row = head_act_bytes(c, E);
    size_t max_packed = ds4_rows_act_bytes(c->k, head->type, E);
    for (int i = 0; i < n; i++)
        if (ins[i] % QK8_0 == 0) {
            total += q8_row_bytes(ins[i]) * (size_t)outs[i];
            if (q8_row_bytes(ins[i]) > max_row)
                max_row = q8_row_bytes(ins[i]);
            size_t pb = ds4_rows_act_bytes(c->k, DS4_TYPE_Q8_0, ins[i]);
            if (pb > max_packed)
                max_packed = pb;
        }
    c->qm = calloc((size_t)n, sizeof *c->qm);
    c->qstore = malloc(total ? total : 1);
    c->xq_row = max_row;
    c->xq = malloc((size_t)XQ_ROWS * max_row);
    c->xp_row = max_packed;
    c->xp = malloc((size_t)XQ_ROWS * max_packed + 1);
    if (!c->qm || !c->qstore || !c->xq || !c->xp)
        return ds4_fail(err, DS4_ERR_NOMEM, "DFlash context: out of memory");
    uint8_t *q = c->qstore;
    for (int i = 0; i < n; i++) {
        if (ins[i] % QK8_0)
            continue;
        size_t rb = q8_row_bytes(ins[i]);
        for (int64_t o = 0; o < outs[i]; o++)
            c->k->from_float[DS4_TYPE_Q8_0](ws[i] + o * ins[i], q + (size_t)o * rb, ins[i]);
        c->qm[c->n_qm++] = (qmat){ws[i], q};
        q += rb * (size_t)outs[i];
    }
    return DS4_OK;
}

int ds4_dflash_ctx_new(ds4_dflash *d, ds4_dflash_ctx **out, ds4_error *err) {
    if (!out)
        return ds4_fail(err, DS4_ERR_ARG, "ds4_dflash_ctx_new: out is NULL");
    *out = NULL;
    if (!d)
        return ds4_fail(err, DS4_ERR_ARG, "ds4_dflash_ctx_new: no drafter");
    const ds4_dflash_config *cf = &d->cfg;
    const ds4_kernel_set *k = ds4_kernels_for(DS4_ISA_AUTO);
    const ds4_tensor *head = ds4_model_head(d->target), *emb = &d->target->token_embd;
    if (!k || !k->to_float[emb->type] || !k->to_float[head->type])
        return ds4_fail(err, DS4_ERR_UNSUPPORTED, "DFlash drafter: the target's token_embd/LM head "
                        "type cannot be dequantized here");
    ds4_dflash_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return ds4_fail(err, DS4_ERR_NOMEM, "DFlash context: out of memory");
    c->d = d;
    c->n_layer = cf->n_layer;
    c->k = k;
    c->n_threads = ds4_model_n_threads(d->target);
    int rc = ds4_pool_new(c->n_threads, &c->pool, err);
    if (rc != DS4_OK) {
        c->pool = NULL;
        ctx_release(c);
        return rc;
    }
    int64_t B = cf->block_size, E = cf->n_embd, qd = cf->n_head * cf->head_dim;
    int64_t kd = cf->n_head_kv * cf->head_dim;
    c->kc = calloc((size_t)cf->n_layer, sizeof *c->kc);
    c->vc = calloc((size_t)cf->n_layer, sizeof *c->vc);
    c->h = malloc((size_t)(B * E) * sizeof(float));
    c->a = malloc((size_t)(B * E) * sizeof(float));
    c->q = malloc((size_t)(B * qd) * sizeof(float));
    c->kb = malloc((size_t)(B * kd) * sizeof(float));
    c->vb = malloc((size_t)(B * kd) * sizeof(float));
    c->o = malloc((size_t)(B * qd) * sizeof(float));
    c->t = malloc((size_t)(B * E) * sizeof(float));
    c->g = malloc((size_t)(B * cf->n_ff) * sizeof(float));
    c->u = malloc((size_t)(B * cf->n_ff) * sizeof(float));
    c->logits = malloc((size_t)((B - 1) * d->n_vocab) * sizeof(float));
    c->scores = malloc((size_t)(c->n_threads * B) * sizeof(float));
    c->head_rows = malloc((size_t)(c->n_threads * E) * sizeof(float));
    c->cfc = malloc((size_t)(CTX_CHUNK * E) * sizeof(float));
    c->cx = malloc((size_t)(CTX_CHUNK * E) * sizeof(float));
    if (!c->kc || !c->vc || !c->h || !c->a || !c->q || !c->kb || !c->vb || !c->o || !c->t ||
        !c->g || !c->u || !c->logits || !c->scores || !c->head_rows || !c->cfc || !c->cx) {
        ctx_release(c);
        return ds4_fail(err, DS4_ERR_NOMEM, "DFlash context: out of memory");
    }
    if (ds4_model_precision(d->target) == DS4_PRECISION_FAST) {
        rc = quantize_matrices(c, err);
        if (rc != DS4_OK) {
            ctx_release(c);
            return rc;
        }
    }
    *out = c;
    return DS4_OK;
}

void ds4_dflash_ctx_free(ds4_dflash_ctx *c) {
    if (c)
        ctx_release(c);
}

int64_t ds4_dflash_ctx_n(const ds4_dflash_ctx *c) { return c->n; }

/* Room for n context rows: capacity doubles, so a long generation
 * reallocates O(log n) times, never per token. */
static int reserve(ds4_dflash_ctx *c, int64_t n, ds4_error *err) {
    if (n <= c->cap)
        return DS4_OK;
    const ds4_dflash_config *cf = &c->d->cfg;
    int64_t cap = c->cap ? c->cap : 256;
    while (cap < n)
        cap *= 2;
    size_t row = (size_t)(cf->n_head_kv * cf->head_dim) * sizeof(float);
    for (int64_t l = 0; l < cf->n_layer; l++) {
        float *k = realloc(c->kc[l], (size_t)cap * row);
        if (k)
            c->kc[l] = k;
        float *v = k ? realloc(c->vc[l], (size_t)cap * row) : NULL;
        if (v)
            c->vc[l] = v;
        if (!k || !v)
            return ds4_fail(err, DS4_ERR_NOMEM, "DFlash context: out of memory for %lld rows",
                            (long long)cap);
    }
    float *s = realloc(c->scores, (size_t)(c->n_threads * (cap + cf->block_size)) * sizeof(float));
    if (!s)
        return ds4_fail(err, DS4_ERR_NOMEM, "DFlash context: out of memory for %lld rows",
                        (long long)cap);
    c->scores = s;
    c->cap = cap;
    return DS4_OK;
}

int ds4_dflash_ctx_add(ds4_dflash_ctx *c, const float *taps, int64_t pos0, int64_t n,
                       ds4_error *err) {
    if (!c)
        return ds4_fail(err, DS4_ERR_ARG, "ds4_dflash_ctx_add: no context");
    const ds4_dflash *d = c->d;
    const ds4_dflash_config *cf = &d->cfg;
    if (n < 0 || pos0 < 0 || pos0 > c->n)
        return ds4_fail(err, DS4_ERR_ARG, "DFlash context: rows at %lld (n=%lld) would leave a gap: "
                        "the context holds [0, %lld)", (long long)pos0, (long long)n, (long long)c->n);
    if (n > d->n_ctx - pos0)
        return ds4_fail(err, DS4_ERR_ARG, "DFlash context: rows up to %lld exceed the target's "
                        "n_ctx %lld", (long long)(pos0 + n), (long long)d->n_ctx);
    if (n > 0 && !taps)
        return ds4_fail(err, DS4_ERR_ARG, "DFlash context: taps is NULL");
    int rc = reserve(c, pos0 + n, err);
    if (rc != DS4_OK)
        return rc;
    int64_t E = cf->n_embd, hd = cf->head_dim, kd = cf->n_head_kv * hd;
    int64_t in = cf->n_taps * E;
    for (int64_t i = 0; i < n; i += CTX_CHUNK) {
        int64_t m = n - i < CTX_CHUNK ? n - i : CTX_CHUNK;
        mm(c, d->fc, in, E, taps + i * in, c->cfc, E, m);
        for (int64_t r = 0; r < m; r++)
            ds4_rmsnorm(c->cfc + r * E, d->enc_norm, c->cx + r * E, E, cf->rms_eps);
        for (int64_t l = 0; l < cf->n_layer; l++) {
            const ds4_dflash_layer *L = &d->layers[l];
            float *k = c->kc[l] + (pos0 + i) * kd, *v = c->vc[l] + (pos0 + i) * kd;
            mm(c, L->wk, E, kd, c->cx, k, kd, m);
            mm(c, L->wv, E, kd, c->cx, v, kd, m);
            for (int64_t r = 0; r < m; r++)
                norm_rope_heads(k + r * kd, cf->n_head_kv, hd, L->k_norm, cf->rms_eps,
                                pos0 + i + r, cf->rope_base);
        }
    }
    c->n = pos0 + n;
    return DS4_OK;
}

int ds4_dflash_ctx_truncate(ds4_dflash_ctx *c, int64_t n, ds4_error *err) {
    if (!c)
        return ds4_fail(err, DS4_ERR_ARG, "ds4_dflash_ctx_truncate: no context");
    if (n < 0 || n > c->n)
        return ds4_fail(err, DS4_ERR_ARG, "DFlash context: cannot truncate to %lld: it holds [0, %lld)",
                        (long long)n, (long long)c->n);
    c->n = n;
    return DS4_OK;
}

/* ------------------------------------------------------------ the block -- */

typedef struct {
    const ds4_dflash_ctx *c;
    const float *kc, *vc;   /* this layer's context K/V */
    int64_t S, B;
} attn_args;

/* Item = (block row r, query head j): softmax over the S context entries
 * and all B block entries (no causal mask), in entry order. */
static void attn_fn(void *ctx, int64_t i0, int64_t i1, int ith) {
    const attn_args *a = ctx;
    const ds4_dflash_ctx *c = a->c;
    const ds4_dflash_config *cf = &c->d->cfg;
    int64_t hd = cf->head_dim, kd = cf->n_head_kv * hd, qd = cf->n_head * hd;
    int64_t grp = cf->n_head / cf->n_head_kv;
    float scale = 1.0f / sqrtf((float)hd);
    float *sc = c->scores + (int64_t)ith * (c->cap + a->B);
    for (int64_t it = i0; it < i1; it++) {
        int64_t r = it / cf->n_head, j = it % cf->n_head, g = j / grp;
        const float *q = c->q + r * qd + j * hd;
        int64_t n_ent = a->S + a->B;
        float mx = -INFINITY;
        for (int64_t e = 0; e < n_ent; e++) {
            const float *kr = e < a->S ? a->kc + e * kd : c->kb + (e - a->S) * kd;
            sc[e] = dot_f32(q, kr + g * hd, hd) * scale;
            if (sc[e] > mx)
                mx = sc[e];
        }
        double sum = 0.0;
        for (int64_t e = 0; e < n_ent; e++) {
            sc[e] = expf(sc[e] - mx);
            sum += sc[e];
        }
        float inv = (float)(1.0 / sum);
        float *o = c->o + r * qd + j * hd;
        memset(o, 0, (size_t)hd * sizeof(float));
        for (int64_t e = 0; e < n_ent; e++) {
            const float *vr = (e < a->S ? a->vc + e * kd : c->vb + (e - a->S) * kd) + g * hd;
            float p = sc[e] * inv;
            for (int64_t x = 0; x < hd; x++)
                o[x] += p * vr[x];
        }
    }
}

typedef struct {
    ds4_dflash_ctx *c;
    const float *y;       /* rows x n_embd: the final-normed draft rows */
    int64_t rows;
    const qrows *q;       /* fast precision: y prepared for the head's type */
} head_args;

static void head_fn(void *ctx, int64_t i0, int64_t i1, int ith) {
    const head_args *a = ctx;
    ds4_dflash_ctx *c = a->c;
    const ds4_tensor *head = ds4_model_head(c->d->target);
    int64_t E = c->d->cfg.n_embd, V = c->d->n_vocab;
    ds4_vec_dot_fn dotf = c->k->vec_dot_f32[head->type];
    float *row = c->head_rows + (int64_t)ith * E;
    for (int64_t it = i0; it < i1; it++) {
        int64_t v0 = it * HEAD_BLOCK, v1 = v0 + HEAD_BLOCK < V ? v0 + HEAD_BLOCK : V;
        for (int64_t v = v0; v < v1; v++) {
            const uint8_t *w = head->data + (size_t)v * head->row_bytes;
            if (!dotf)
                c->k->to_float[head->type](w, row, E);
            if (a->q) {
                float s[XQ_ROWS];
                dot_all(a->q, E, w, s);
                for (int64_t r = 0; r < a->rows; r++)
                    c->logits[r * V + v] = s[r];
                continue;
            }
            for (int64_t r = 0; r < a->rows; r++) {
                float s;
                if (dotf)
                    dotf(E, &s, w, a->y + r * E);
                else
                    s = dot_f32(row, a->y + r * E, E);
                c->logits[r * V + v] = s;
            }
        }
    }
}

int ds4_dflash_propose(ds4_dflash_ctx *c, int32_t anchor, int64_t pos, int32_t *drafts,
                       ds4_error *err) {
    if (!c)
        return ds4_fail(err, DS4_ERR_ARG, "ds4_dflash_propose: context and drafts are required");
    return ds4_dflash_propose_n(c, anchor, pos, c->d->cfg.block_size - 1, drafts, err);
}

int ds4_dflash_propose_n(ds4_dflash_ctx *c, int32_t anchor, int64_t pos, int64_t n_drafts,
                         int32_t *drafts, ds4_error *err) {
    if (!c || !drafts)
        return ds4_fail(err, DS4_ERR_ARG, "ds4_dflash_propose: context and drafts are required");
    const ds4_dflash *d = c->d;
    const ds4_dflash_config *cf = &d->cfg;
    if (n_drafts < 1 || n_drafts > cf->block_size - 1)
        return ds4_fail(err, DS4_ERR_ARG, "DFlash: %lld drafts asked of a block of %lld (1..%lld)",
                        (long long)n_drafts, (long long)cf->block_size,
                        (long long)(cf->block_size - 1));
    if (pos != c->n)
        return ds4_fail(err, DS4_ERR_ARG, "DFlash: a block at position %lld needs the context of "
                        "[0, %lld), but it holds [0, %lld)", (long long)pos, (long long)pos,
                        (long long)c->n);
    if (anchor < 0 || anchor >= d->n_vocab)
        return ds4_fail(err, DS4_ERR_ARG, "DFlash: anchor token %d is outside the vocabulary (%lld)",
                        (int)anchor, (long long)d->n_vocab);
    if (pos + cf->block_size > d->n_ctx)
        return ds4_fail(err, DS4_ERR_ARG, "DFlash: a block at %lld runs past n_ctx %lld",
                        (long long)pos, (long long)d->n_ctx);
    int rc = reserve(c, 1, err); /* the score scratch exists even with an empty context */
    if (rc != DS4_OK)
        return rc;
    int64_t B = cf->block_size, E = cf->n_embd, hd = cf->head_dim;
    int64_t qd = cf->n_head * hd, kd = cf->n_head_kv * hd, S = pos;
    const ds4_tensor *emb = &d->target->token_embd;
    for (int64_t r = 0; r < B; r++) {
        int64_t tok = r == 0 ? anchor : cf->mask_token_id;
        c->k->to_float[emb->type](emb->data + (size_t)tok * emb->row_bytes, c->h + r * E, E);
    }
    for (int64_t l = 0; l < cf->n_layer; l++) {
        const ds4_dflash_layer *L = &d->layers[l];
        for (int64_t r = 0; r < B; r++)
            ds4_rmsnorm(c->h + r * E, L->attn_norm, c->a + r * E, E, cf->rms_eps);
        mm(c, L->wq, E, qd, c->a, c->q, qd, B);
        mm(c, L->wk, E, kd, c->a, c->kb, kd, B);
        mm(c, L->wv, E, kd, c->a, c->vb, kd, B);
        for (int64_t r = 0; r < B; r++) {
            norm_rope_heads(c->q + r * qd, cf->n_head, hd, L->q_norm, cf->rms_eps, S + r,
                            cf->rope_base);
            norm_rope_heads(c->kb + r * kd, cf->n_head_kv, hd, L->k_norm, cf->rms_eps, S + r,
                            cf->rope_base);
        }
        attn_args aa = {c, c->kc[l], c->vc[l], S, B};
        ds4_pool_for(c->pool, B * cf->n_head, attn_fn, &aa);
        mm(c, L->wo, qd, E, c->o, c->t, E, B);
        for (int64_t i = 0; i < B * E; i++)
            c->h[i] += c->t[i];
        for (int64_t r = 0; r < B; r++)
            ds4_rmsnorm(c->h + r * E, L->ffn_norm, c->a + r * E, E, cf->rms_eps);
        mm(c, L->gate, E, cf->n_ff, c->a, c->g, cf->n_ff, B);
        mm(c, L->up, E, cf->n_ff, c->a, c->u, cf->n_ff, B);
        if (c->k->silu_mul) /* the same bits as the loop (quants.h silu_mul) */
            c->k->silu_mul(c->g, c->g, c->u, B * cf->n_ff);
        else
            for (int64_t i = 0; i < B * cf->n_ff; i++)
                c->g[i] = ds4_silu(c->g[i]) * c->u[i];
        mm(c, L->down, cf->n_ff, E, c->g, c->t, E, B);
        for (int64_t i = 0; i < B * E; i++)
            c->h[i] += c->t[i];
    }
    /* rows 1..B-1 are the drafts; the anchor row only feeds attention. Every
     * row ran through the layers (the block attends to itself without a
     * mask), but only the n_drafts asked for go through the LM head. */
    for (int64_t r = 1; r <= n_drafts; r++)
        ds4_rmsnorm(c->h + r * E, d->out_norm, c->a + (r - 1) * E, E, cf->rms_eps);
    head_args ha = {c, c->a, n_drafts, NULL};
    qrows hq;
    if (c->qm && head_act_bytes(c, E)) {
        prep_rows(c, ds4_model_head(d->target)->type, c->a, E, n_drafts, &hq);
        ha.q = &hq;
    }
    ds4_pool_for(c->pool, (d->n_vocab + HEAD_BLOCK - 1) / HEAD_BLOCK, head_fn, &ha);
    c->n_logit_rows = n_drafts;
    for (int64_t r = 0; r < n_drafts; r++) {
        const float *lg = c->logits + r * d->n_vocab;
        int64_t best = 0;
        for (int64_t v = 1; v < d->n_vocab; v++)
            if (lg[v] > lg[best])
                best = v;
        drafts[r] = (int32_t)best;
    }
    return DS4_OK;
}

const float *ds4_dflash_logits(const ds4_dflash_ctx *c, int64_t *n_rows) {
    *n_rows = c ? c->n_logit_rows : 0;
    return c ? c->logits : NULL;
}
