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
 * computes the blocks' partials in parallel and merges them afterwards;
 * its work items are (kv head, block), each serving the kv head's whole GQA
 * group so every K/V row is read once per token, not once per query head.
 * Both do the same float operations in the same order, so a row's output
 * does not depend on which path, chunk or thread count produced it.
 *
 * Numerics per precision (K·Q, softmax, ·V):
 *  EXACT: K/V pages F32. Score = F32 dot of the K row with the F32 query,
 *    times scale. Per block: the max first, then e = expf(s - max) in
 *    float, summed in float, acc += e * v in float. Blocks merged in float
 *    (ascending); out = acc / sum.
 *  FAST (DS4_FAST_ATTN_F16 = 1): K/V pages F16 (llama.cpp's default cache
 *    type; K stored after norm and RoPE, V raw, both rounded to nearest-even
 *    like ggml's F16C cpy). Every row runs llama.cpp's CPU flash-attention
 *    one-chunk recipe (ggml-cpu ops.cpp
 *    ggml_compute_forward_flash_attn_ext_f16_one_chunk): the query rounded to
 *    F16 once; score = F16 x F16 dot (products exact, summed in float) times
 *    scale; an online softmax position by position (new max M: the
 *    accumulator is scaled by expf(M_old - M) and re-rounded to F16; else the
 *    position's weight is expf(s - M)); V accumulated IN F16 (each step
 *    a = f16(a + v*w)); S = S*ms + w in float. Per 256-position block; the
 *    blocks' widened partials are merged in float in ascending order (the
 *    same formula as llama.cpp's split-KV reduce); out = acc * (1/S).
 *  llama.cpp itself picks by batch shape, so it is not batch invariant:
 *    - ubatch of < 64 query rows (every decode step, short prompts,
 *      speculative verify batches): the one-chunk recipe above, over all
 *      positions in one online pass;
 *    - one query row over >= 512 KV cells: the same recipe per KV chunk of
 *      n_kv / n_threads cells, chunks merged in float;
 *    - >= 64 query rows (GGML_FA_TILE_Q): a tiled kernel with Q in F32, K/V
 *      widened to F32, scores by an F32 GEMM, softmax per 64-cell tile
 *      (vector exp, sum in double), V accumulated in F32.
 *    We must stay batch invariant (DESIGN.md invariant 1), so one recipe
 *    serves every row. Measured against llama.cpp's logits on the golden
 *    files (tests/test_forward_fast.py), the F16 recipe reproduces the
 *    small-batch and decode path: s16 prompts and the greedy decode steps
 *    match to ~2e-6 on dense-q8_0 / moe-q4_k_m, and every greedy
 *    continuation equals llama.cpp's up to the first near-tie (on AVX-512,
 *    15 of 16 for all 32 steps; dense-bf16's 16-token one at step 0, where
 *    the top-2 margin is 0.023); against the
 *    tiled path (prompts of 100/700 rows in one batch) it is as far from
 *    llama.cpp as llama.cpp's own two paths are from each other. The
 *    alternative F32 recipe (DS4_FAST_ATTN_F16 = 0: exact's block code over
 *    F16 pages) is closer on those long prompts (mean KL 0.0017 vs 0.0023 on
 *    dense-q8_0 s700) but diverges from llama.cpp's greedy decoding at a
 *    clear margin (moe-q8_0: steps 9 and 10, our margins 0.07 and 0.26) and
 *    misses the short prompts (dense-q8_0 s16: max |d| 0.39 instead of 2e-6).
 *    Remaining differences from llama.cpp's one-chunk path: for head dims of
 *    64 and more its F16 mad uses an FMA before rounding (we multiply, then
 *    add), its dot sums in another order, and its split-KV chunks are not our
 *    256-position blocks.
 */
#include "forward.h"
#include "../paths.h"

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

/* scores of one block, the merge state's acc, one block's acc, one V row,
 * and for the F16 recipe a float copy of the F16 accumulator, the F16-rounded
 * query widened to float (dh floats), the F16 accumulator (dh halves, one
 * float per half: generous), plus the widened queries of one GQA group for
 * the decode group kernel (group * dh floats). */
int64_t ds4_attn_thread_floats(const ds4_model_config *c) {
    const int64_t group = c->n_head_kv > 0 ? c->n_head / c->n_head_kv : 1;
    return DS4_KV_PAGE + 6 * c->head_dim + (group > 0 ? group : 1) * c->head_dim;
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

/* Per-thread scratch of one work item (see ds4_attn_thread_floats). */
typedef struct {
    float *scores; /* DS4_KV_PAGE */
    float *A;      /* merge state acc, dh */
    float *acc;    /* one block's acc, dh */
    float *vtmp;   /* one V row in float, dh */
    float *tmp;    /* F16 recipe: the F16 accumulator in float, dh */
    float *qw;     /* F16 recipe: the query rounded to F16, widened back, dh */
    uint16_t *a16; /* F16 recipe: the F16 accumulator, dh */
    float *qgw;    /* decode group kernel: the group's queries as qw, group*dh */
} attn_scratch;

static attn_scratch scratch_of(const ds4_fwd *f, int ith) {
    const int64_t dh = f->c.head_dim;
    float *ts = f->thread_scratch + (int64_t)ith * f->per_thread_floats;
    attn_scratch s;
    s.scores = ts;
    s.A = ts + DS4_KV_PAGE;
    s.acc = s.A + dh;
    s.vtmp = s.acc + dh;
    s.tmp = s.vtmp + dh;
    s.qw = s.tmp + dh;
    s.a16 = (uint16_t *)(s.tmp + 2 * dh);
    s.qgw = s.tmp + 3 * dh;
    return s;
}

/* Partial over the positions [b*PAGE, min((b+1)*PAGE, n_vis)) of kv head
 * kvh for query q: *m = max score, *l = sum of exp(score - m), acc = sum of
 * exp(score - m) * v (positions ascending).
 *
 * F32 recipe (exact precision, and fast precision unless attn_f16): the
 * scores are dots of the K rows (F32 or F16, widened exactly) with the F32
 * query, times scale; the block's max first, then exp(s - max) in float
 * (expf) summed in float, and V rows (widened exactly) accumulated in
 * float: acc += e * v. */
static void block_partial_f32(const kv_view *kv, int64_t kvh, const float *q, int64_t b,
                              int64_t n_vis, const attn_scratch *sc, float *m, float *l,
                              float *acc) {
    const ds4_fwd *f = kv->f;
    const int64_t dh = f->c.head_dim;
    const int64_t p0 = b * DS4_KV_PAGE;
    const int64_t p1 = p0 + DS4_KV_PAGE < n_vis ? p0 + DS4_KV_PAGE : n_vis;
    ds4_vec_dot_fn dot = f->k->vec_dot_f32[f->kv_type];
    ds4_to_float_fn to_f = f->k->to_float[f->kv_type];
    float *scores = sc->scores;
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
            to_f(vr, sc->vtmp, dh);
            v = sc->vtmp;
        }
        sum += e;
        for (int64_t d = 0; d < dh; d++) acc[d] += e * v[d];
    }
    *m = mx;
    *l = sum;
}

/* F16 recipe (fast precision with attn_f16; F16 KV only): llama.cpp's CPU
 * flash-attention one-chunk kernel (ggml-cpu ops.cpp
 * ggml_compute_forward_flash_attn_ext_f16_one_chunk) over one block: the
 * query rounded to F16 once (qw: widened back, see F16_DOT_WHY), scores =
 * F16 x F16 dot times scale, an online softmax position by position (on a
 * new max M: the accumulator is scaled by expf(M_old - M), else the
 * position's weight is expf(s - M)),
 * and the V accumulator kept in F16: after every scale or add each element
 * is rounded back to F16 (a = f16(a + v*w), the product and sum rounded to
 * float first). S = S*ms + w in float. The block's F16 accumulator is
 * widened to float for the merge. */
static void block_partial_f16(const kv_view *kv, int64_t kvh, int64_t b, int64_t n_vis,
                              const attn_scratch *sc, float *m, float *l, float *acc) {
    const ds4_fwd *f = kv->f;
    const int64_t dh = f->c.head_dim;
    const int64_t p0 = b * DS4_KV_PAGE;
    const int64_t p1 = p0 + DS4_KV_PAGE < n_vis ? p0 + DS4_KV_PAGE : n_vis;
    ds4_vec_dot_fn dot = f->k->vec_dot_f32[DS4_TYPE_F16]; /* see F16_DOT_WHY */
    ds4_to_float_fn to_f = f->k->to_float[DS4_TYPE_F16];
    ds4_from_float_fn from_f = f->k->from_float[DS4_TYPE_F16];
    float *a = sc->tmp;      /* == to_float(a16) at all times */
    float *v = sc->vtmp;
    float M = -INFINITY, S = 0.0f;
    for (int64_t d = 0; d < dh; d++) a[d] = 0.0f;
    for (int64_t p = p0; p < p1; p++) {
        float s = 0.0f;
        dot(dh, &s, ds4_kv_row(f, kv->kp, kvh, p), sc->qw);
        s *= kv->scale;
        float ms = 1.0f, vs = 1.0f;
        if (s > M) {
            const float Mold = M;
            M = s;
            ms = expf(Mold - M);
            if (Mold != -INFINITY) { /* else the accumulator is still zero */
                for (int64_t d = 0; d < dh; d++) a[d] *= ms;
                from_f(a, sc->a16, dh);
                to_f(sc->a16, a, dh);
            }
        } else {
            vs = expf(s - M);
        }
        if (f->k->f16_acc_row) { /* the same three steps in one pass (quants.h) */
            f->k->f16_acc_row(a, (const uint16_t *)ds4_kv_row(f, kv->vp, kvh, p), vs, dh);
        } else {
            to_f(ds4_kv_row(f, kv->vp, kvh, p), v, dh);
            for (int64_t d = 0; d < dh; d++) a[d] += v[d] * vs;
            from_f(a, sc->a16, dh);
            to_f(sc->a16, a, dh);
        }
        S = S * ms + vs;
    }
    for (int64_t d = 0; d < dh; d++) acc[d] = a[d];
    *m = M;
    *l = S;
}

static void block_partial(const kv_view *kv, int64_t kvh, const float *q, int64_t b,
                          int64_t n_vis, const attn_scratch *sc, float *m, float *l,
                          float *acc) {
    if (kv->f->attn_f16)
        block_partial_f16(kv, kvh, b, n_vis, sc, m, l, acc);
    else
        block_partial_f32(kv, kvh, q, b, n_vis, sc, m, l, acc);
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

/* out = A / L. Fast precision multiplies by 1/L as llama.cpp does
 * (ggml_vec_scale_f32 by S_inv). */
static void finish(const ds4_fwd *f, float *out, float L, const float *A, int64_t dh) {
    if (f->fast) {
        const float inv = 1.0f / L;
        for (int64_t d = 0; d < dh; d++) out[d] = A[d] * inv;
    } else {
        for (int64_t d = 0; d < dh; d++) out[d] = A[d] / L;
    }
}

/* F16_DOT_WHY: the F16 recipe's score is the F16 x F16 dot of the K row
 * with the query rounded to F16. Widening that F16 query to float once
 * (exact) and taking every set's vec_dot_f32[F16] gives the same bits as
 * vec_dot[F16] (each set builds both from one loop, products of the same
 * floats summed in the same order) while converting only the K row per
 * position: the conversions, not memory, bound this loop. */

/* The F16 recipe's query: q rounded to F16 once per (row, head), widened
 * back to float into qw (a16 is free between blocks). */
static void prep_query_to(const ds4_fwd *f, const float *q, const attn_scratch *sc, float *qw) {
    f->k->from_float[DS4_TYPE_F16](q, sc->a16, f->c.head_dim);
    f->k->to_float[DS4_TYPE_F16](sc->a16, qw, f->c.head_dim);
}

static void prep_query(const ds4_fwd *f, const float *q, const attn_scratch *sc) {
    if (f->attn_f16) prep_query_to(f, q, sc, sc->qw);
}

/* Items (t, h) of a prefill chunk: all blocks of the row, merged as they go. */
static void rows_items(void *vctx, int64_t i0, int64_t i1, int ith) {
    const attn_ctx *c = vctx;
    const ds4_fwd *f = c->kv.f;
    const int64_t dh = f->c.head_dim;
    const attn_scratch sc = scratch_of(f, ith);
    for (int64_t it = i0; it < i1; it++) {
        const int64_t t = it / c->n_head, h = it % c->n_head;
        const float *q = c->qf + t * c->qf_stride + 2 * h * dh;
        const int64_t n_vis = c->pos0 + t + 1;
        const int64_t nb = (n_vis + DS4_KV_PAGE - 1) / DS4_KV_PAGE;
        prep_query(f, q, &sc);
        float M = 0.0f, L = 0.0f;
        for (int64_t b = 0; b < nb; b++) {
            float mb, lb;
            block_partial(&c->kv, h / c->group, q, b, n_vis, &sc, &mb, &lb, sc.acc);
            merge(&M, &L, sc.A, mb, lb, sc.acc, dh, b == 0);
        }
        finish(f, c->attn + t * c->n_head * dh + h * dh, L, sc.A, dh);
    }
}

/* block_partial_f16 for all `group` query heads of kv head kvh at once,
 * position by position: each K and V row is read from memory once for the
 * whole GQA group (instead of once per query head), and the group's
 * independent per-head chains overlap in the core. Each head's float
 * operations are exactly block_partial_f16's, in the same order (same dot,
 * expf, f16_acc_row / three-pass fallback), so its partial is bit-identical
 * to what block_partial_f16 gives; the rows path (prefill, and decode with
 * one block) keeps calling block_partial_f16. Head h0+g's running state
 * lives in its partial slot: parts[g*stride] = M, [+1] = S, [+2..] = the
 * F16 accumulator widened to float. */
static void block_group_f16(const kv_view *kv, int64_t kvh, int64_t group, int64_t b,
                            int64_t n_vis, const attn_scratch *sc, float *parts,
                            int64_t stride) {
    const ds4_fwd *f = kv->f;
    const int64_t dh = f->c.head_dim;
    const int64_t p0 = b * DS4_KV_PAGE;
    const int64_t p1 = p0 + DS4_KV_PAGE < n_vis ? p0 + DS4_KV_PAGE : n_vis;
    ds4_vec_dot_fn dot = f->k->vec_dot_f32[DS4_TYPE_F16]; /* see F16_DOT_WHY */
    ds4_to_float_fn to_f = f->k->to_float[DS4_TYPE_F16];
    ds4_from_float_fn from_f = f->k->from_float[DS4_TYPE_F16];
    for (int64_t g = 0; g < group; g++) {
        float *st = parts + g * stride;
        st[0] = -INFINITY;
        st[1] = 0.0f;
        for (int64_t d = 0; d < dh; d++) st[2 + d] = 0.0f;
    }
    for (int64_t p = p0; p < p1; p++) {
        const uint8_t *kr = ds4_kv_row(f, kv->kp, kvh, p);
        const uint16_t *vr = (const uint16_t *)ds4_kv_row(f, kv->vp, kvh, p);
        for (int64_t g = 0; g < group; g++) {
            float *st = parts + g * stride, *a = st + 2;
            float s = 0.0f;
            dot(dh, &s, kr, sc->qgw + g * dh);
            s *= kv->scale;
            float ms = 1.0f, vs = 1.0f;
            if (s > st[0]) {
                const float Mold = st[0];
                st[0] = s;
                ms = expf(Mold - s);
                if (Mold != -INFINITY) {
                    for (int64_t d = 0; d < dh; d++) a[d] *= ms;
                    from_f(a, sc->a16, dh);
                    to_f(sc->a16, a, dh);
                }
            } else {
                vs = expf(s - st[0]);
            }
            if (f->k->f16_acc_row) {
                f->k->f16_acc_row(a, vr, vs, dh);
            } else {
                to_f(vr, sc->vtmp, dh);
                for (int64_t d = 0; d < dh; d++) a[d] += sc->vtmp[d] * vs;
                from_f(a, sc->a16, dh);
                to_f(sc->a16, a, dh);
            }
            st[1] = st[1] * ms + vs;
        }
    }
}

/* Items (kv head, b) of a decode row: block b's partial for every query
 * head of the kv head's GQA group, each K/V block read once for the group
 * (the F16 recipe in one interleaved pass, the F32 recipe head after head
 * while the 256-position block is still in cache). Partial of head h, block
 * b at part + (h*nb + b)*(2 + dh), as merge_items reads them. */
static void part_items(void *vctx, int64_t i0, int64_t i1, int ith) {
    const attn_ctx *c = vctx;
    const ds4_fwd *f = c->kv.f;
    const int64_t dh = f->c.head_dim, stride = 2 + dh;
    const attn_scratch sc = scratch_of(f, ith);
    const int64_t n_vis = c->pos0 + 1;
    for (int64_t it = i0; it < i1; it++) {
        const int64_t kvh = it / c->nb, b = it % c->nb, h0 = kvh * c->group;
        if (f->attn_f16) {
            for (int64_t g = 0; g < c->group; g++)
                prep_query_to(f, c->qf + 2 * (h0 + g) * dh, &sc, sc.qgw + g * dh);
            block_group_f16(&c->kv, kvh, c->group, b, n_vis, &sc,
                            c->part + (h0 * c->nb + b) * stride, c->nb * stride);
            continue;
        }
        for (int64_t h = h0; h < h0 + c->group; h++) {
            float *p = c->part + (h * c->nb + b) * stride;
            const float *q = c->qf + 2 * h * dh;
            block_partial(&c->kv, kvh, q, b, n_vis, &sc, &p[0], &p[1], p + 2);
        }
    }
}

static void merge_items(void *vctx, int64_t h0, int64_t h1, int ith) {
    const attn_ctx *c = vctx;
    const ds4_fwd *f = c->kv.f;
    const int64_t dh = f->c.head_dim;
    const attn_scratch sc = scratch_of(f, ith);
    for (int64_t h = h0; h < h1; h++) {
        float M = 0.0f, L = 0.0f;
        for (int64_t b = 0; b < c->nb; b++) {
            const float *p = c->part + (h * c->nb + b) * (2 + dh);
            merge(&M, &L, sc.A, p[0], p[1], p + 2, dh, b == 0);
        }
        finish(f, c->attn + h * dh, L, sc.A, dh);
    }
}

/* ------------------------------------------------------------- layer -- */

void ds4_attn_layer(ds4_fwd *f, int64_t il, int64_t n, int64_t pos0) {
    ds4_attn_block(f, &f->m->layers[il], &f->kv[il], n, pos0);
}

void ds4_attn_block(ds4_fwd *f, const ds4_layer *L, ds4_kv_layer *kvl, int64_t n, int64_t pos0) {
    const ds4_model_config *c = &f->c;
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
    if (ds4_paths_on()) {
        const char *split =
            f->attn_f16 ? "split-K decode, 256-blocks per GQA group, F16 KV, Q/V in F16"
                        : "split-K decode, 256-blocks per GQA group, F32 Q/V";
        const char *rows = f->attn_f16 ? "rows, 256-blocks, F16 KV, Q/V in F16"
                                       : "rows, 256-blocks, F32 Q/V";
        ds4_path_note(f->path_layer, "attention", n == 1 && ac.nb > 1 ? split : rows);
    }
    if (n == 1 && ac.nb > 1) {
        ds4_pool_for(f->pool, nkv * ac.nb, part_items, &ac);
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
