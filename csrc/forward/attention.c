/*
 * attention.c — gated full attention (qwen35-spec.md §4).
 *
 * q/gate interleaved per head, RMSNorm of q and k heads, partial NEOX RoPE
 * on the first n_rot dims, K (after norm and rope) and V (raw) stored in the
 * session's KV pages, causal softmax attention with grouped GQA, sigmoid
 * gate, output projection.
 *
 * Split-K: the positions a row sees are cut into fixed blocks of
 * DS4_KV_PAGE. Each block yields a partial (max, sum, acc); partials are
 * merged in ascending block order by one merge routine. A prefill row runs
 * the blocks one after the other on one thread; a decode row (chunk of one)
 * computes the blocks' partials in parallel and merges them afterwards.
 * Both do the same float operations in the same order, so a row's output
 * does not depend on which path, chunk or thread count produced it.
 */
#include "forward.h"

#include <math.h>

typedef struct {
    float *qf;    /* attn_q rows: per head [q_h | gate_h], 2*n_head*d_h */
    float *k;     /* attn_k rows, n_head_kv*d_h */
    float *v;     /* attn_v rows */
    float *attn;  /* attention output rows, n_head*d_h */
} attn_work;

int64_t ds4_attn_work_per_row(const ds4_model_config *c) {
    return 3 * c->n_head * c->head_dim + 2 * c->n_head_kv * c->head_dim;
}

/* scores of one block, the merge state's acc, one block's acc, one V row */
int64_t ds4_attn_thread_floats(const ds4_model_config *c) {
    return DS4_KV_PAGE + 3 * c->head_dim;
}

static attn_work carve(const ds4_fwd *f) {
    const ds4_model_config *c = &f->c;
    const int64_t R = DS4_CHUNK_ROWS, dh = c->head_dim;
    attn_work w;
    w.qf = f->work;
    w.k = w.qf + R * 2 * c->n_head * dh;
    w.v = w.k + R * c->n_head_kv * dh;
    w.attn = w.v + R * c->n_head_kv * dh;
    return w;
}

/* NEOX rotation of the first n_rot dims: pairs (i, i + n_rot/2), written as
 * transformers' q*cos + rotate_half(q)*sin. */
static void rope(float *x, const float *cs, const float *sn, int64_t half) {
    for (int64_t i = 0; i < half; i++) {
        const float lo = x[i], hi = x[i + half];
        x[i] = lo * cs[i] + (-hi) * sn[i];
        x[i + half] = hi * cs[i] + lo * sn[i];
    }
}

/* ------------------------------------------------------------ split-K -- */

typedef struct {
    const ds4_fwd *f;
    uint8_t *const *kp, *const *vp;
    float scale;
} kv_view;

/* Partial over the positions [b*PAGE, min((b+1)*PAGE, n_vis)) of kv head
 * kvh for query q: *m = max score, *l = sum of exp(score - m), acc = sum of
 * exp(score - m) * v (positions ascending). */
static void block_partial(const kv_view *kv, int64_t kvh, const float *q, int64_t b,
                          int64_t n_vis, float *scores, float *vtmp, float *m, float *l,
                          float *acc) {
    const ds4_fwd *f = kv->f;
    const int64_t dh = f->c.head_dim;
    const int64_t p0 = b * DS4_KV_PAGE;
    const int64_t p1 = p0 + DS4_KV_PAGE < n_vis ? p0 + DS4_KV_PAGE : n_vis;
    ds4_vec_dot_fn dot = f->k->vec_dot_f32[f->kv_type];
    ds4_to_float_fn to_f = f->k->to_float[f->kv_type];
    float mx = -INFINITY;
    for (int64_t p = p0; p < p1; p++) {
        float s = 0.0f;
        dot(dh, &s, ds4_kv_row(f, kv->kp, kvh, p), q);
        s *= kv->scale;
        scores[p - p0] = s;
        if (s > mx) mx = s;
    }
    float sum = 0.0f;
    for (int64_t d = 0; d < dh; d++) acc[d] = 0.0f;
    for (int64_t p = p0; p < p1; p++) {
        const float e = expf(scores[p - p0] - mx);
        const uint8_t *vr = ds4_kv_row(f, kv->vp, kvh, p);
        const float *v = (const float *)vr;
        if (f->kv_type != DS4_TYPE_F32) {
            to_f(vr, vtmp, dh);
            v = vtmp;
        }
        sum += e;
        for (int64_t d = 0; d < dh; d++) acc[d] += e * v[d];
    }
    *m = mx;
    *l = sum;
}

/* Fold block partial (mb, lb, accb) into the running (M, L, A). */
static void merge(float *M, float *L, float *A, float mb, float lb, const float *accb,
                  int64_t dh, int first) {
    if (first) {
        *M = mb;
        *L = lb;
        for (int64_t d = 0; d < dh; d++) A[d] = accb[d];
        return;
    }
    const float nm = *M > mb ? *M : mb;
    const float ea = expf(*M - nm), eb = expf(mb - nm);
    *L = *L * ea + lb * eb;
    for (int64_t d = 0; d < dh; d++) A[d] = A[d] * ea + accb[d] * eb;
    *M = nm;
}

typedef struct {
    kv_view kv;
    const float *qf;     /* row t's q_h at qf + t*qf_stride + 2*h*dh */
    int64_t qf_stride;
    float *attn;         /* row t head h output at attn + t*n_head*dh + h*dh */
    int64_t pos0, n_head, group, nb; /* nb: blocks of the decode row */
    float *part;         /* decode partials: (h*nb + b) * (2 + dh) */
} attn_ctx;

static void finish(float *out, float L, const float *A, int64_t dh) {
    for (int64_t d = 0; d < dh; d++) out[d] = A[d] / L;
}

/* Items (t, h) of a prefill chunk: all blocks of the row, merged as they go. */
static void rows_items(void *vctx, int64_t i0, int64_t i1, int ith) {
    const attn_ctx *c = vctx;
    const ds4_fwd *f = c->kv.f;
    const int64_t dh = f->c.head_dim;
    float *ts = f->thread_scratch + (int64_t)ith * f->per_thread_floats;
    float *scores = ts, *A = ts + DS4_KV_PAGE, *acc = A + dh, *vtmp = acc + dh;
    for (int64_t it = i0; it < i1; it++) {
        const int64_t t = it / c->n_head, h = it % c->n_head;
        const float *q = c->qf + t * c->qf_stride + 2 * h * dh;
        const int64_t n_vis = c->pos0 + t + 1;
        const int64_t nb = (n_vis + DS4_KV_PAGE - 1) / DS4_KV_PAGE;
        float M = 0.0f, L = 0.0f;
        for (int64_t b = 0; b < nb; b++) {
            float mb, lb;
            block_partial(&c->kv, h / c->group, q, b, n_vis, scores, vtmp, &mb, &lb, acc);
            merge(&M, &L, A, mb, lb, acc, dh, b == 0);
        }
        finish(c->attn + t * c->n_head * dh + h * dh, L, A, dh);
    }
}

/* Items (h, b) of a decode row: one block's partial each. */
static void part_items(void *vctx, int64_t i0, int64_t i1, int ith) {
    const attn_ctx *c = vctx;
    const ds4_fwd *f = c->kv.f;
    const int64_t dh = f->c.head_dim;
    float *ts = f->thread_scratch + (int64_t)ith * f->per_thread_floats;
    const int64_t n_vis = c->pos0 + 1;
    for (int64_t it = i0; it < i1; it++) {
        const int64_t h = it / c->nb, b = it % c->nb;
        float *p = c->part + it * (2 + dh);
        block_partial(&c->kv, h / c->group, c->qf + 2 * h * dh, b, n_vis, ts,
                      ts + DS4_KV_PAGE, &p[0], &p[1], p + 2);
    }
}

static void merge_items(void *vctx, int64_t h0, int64_t h1, int ith) {
    const attn_ctx *c = vctx;
    const ds4_fwd *f = c->kv.f;
    const int64_t dh = f->c.head_dim;
    float *A = f->thread_scratch + (int64_t)ith * f->per_thread_floats + DS4_KV_PAGE;
    for (int64_t h = h0; h < h1; h++) {
        float M = 0.0f, L = 0.0f;
        for (int64_t b = 0; b < c->nb; b++) {
            const float *p = c->part + (h * c->nb + b) * (2 + dh);
            merge(&M, &L, A, p[0], p[1], p + 2, dh, b == 0);
        }
        finish(c->attn + h * dh, L, A, dh);
    }
}

/* ------------------------------------------------------------- layer -- */

void ds4_attn_layer(ds4_fwd *f, int64_t il, int64_t n, int64_t pos0) {
    const ds4_model_config *c = &f->c;
    const ds4_layer *L = &f->m->layers[il];
    ds4_kv_layer *kvl = &f->kv[il];
    const int64_t E = c->n_embd, dh = c->head_dim, nh = c->n_head, nkv = c->n_head_kv;
    const int64_t qf_dim = 2 * nh * dh, kv_dim = nkv * dh, half = c->n_rot / 2;
    attn_work w = carve(f);

    ds4_mm_job jobs[3] = {
        ds4_mm(&L->attn_q, 0, 0, qf_dim, f->x, E, w.qf, qf_dim, n),
        ds4_mm(&L->attn_k, 0, 0, kv_dim, f->x, E, w.k, kv_dim, n),
        ds4_mm(&L->attn_v, 0, 0, kv_dim, f->x, E, w.v, kv_dim, n),
    };
    ds4_matmul(f, jobs, 3);

    const float *qn = (const float *)L->attn_q_norm.data;
    const float *kn = (const float *)L->attn_k_norm.data;
    ds4_from_float_fn store = f->k->from_float[f->kv_type];
    for (int64_t t = 0; t < n; t++) {
        const float *cs = f->rope_cos + t * half, *sn = f->rope_sin + t * half;
        for (int64_t h = 0; h < nh; h++) {
            float *q = w.qf + t * qf_dim + 2 * h * dh;
            ds4_rmsnorm(q, qn, q, dh, c->rms_eps);
            rope(q, cs, sn, half);
        }
        for (int64_t h = 0; h < nkv; h++) {
            float *k = w.k + t * kv_dim + h * dh;
            ds4_rmsnorm(k, kn, k, dh, c->rms_eps);
            rope(k, cs, sn, half);
            store(k, ds4_kv_row(f, kvl->k, h, pos0 + t), dh);
            store(w.v + t * kv_dim + h * dh, ds4_kv_row(f, kvl->v, h, pos0 + t), dh);
        }
    }

    attn_ctx ac;
    ac.kv.f = f;
    ac.kv.kp = kvl->k;
    ac.kv.vp = kvl->v;
    ac.kv.scale = c->attn_scale;
    ac.qf = w.qf;
    ac.qf_stride = qf_dim;
    ac.attn = w.attn;
    ac.pos0 = pos0;
    ac.n_head = nh;
    ac.group = nh / nkv; /* grouped GQA: q head h reads kv head h/group (pitfall 3) */
    ac.nb = (pos0 + 1 + DS4_KV_PAGE - 1) / DS4_KV_PAGE;
    ac.part = f->attn_part;
    if (n == 1 && ac.nb > 1) {
        ds4_pool_for(f->pool, nh * ac.nb, part_items, &ac);
        ds4_pool_for(f->pool, nh, merge_items, &ac);
    } else {
        ds4_pool_for(f->pool, n * nh, rows_items, &ac);
    }

    /* Output gate: attn * sigmoid(gate), gate_h interleaved after q_h. */
    for (int64_t t = 0; t < n; t++)
        for (int64_t h = 0; h < nh; h++) {
            float *a = w.attn + t * nh * dh + h * dh;
            const float *g = w.qf + t * qf_dim + 2 * h * dh + dh;
            for (int64_t d = 0; d < dh; d++) a[d] *= ds4_sigmoid(g[d]);
        }

    ds4_mm_job out = ds4_mm(&L->attn_output, 0, 0, E, w.attn, nh * dh, f->y, E, n);
    ds4_matmul(f, &out, 1);
}
