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
 * Work items are (row, kv head) for prefill and (kv head, block) for a
 * decode row: each serves the kv head's whole GQA group, so every K/V row
 * is read once per item, not once per query head. Both do the same float
 * operations in the same order, so a row's output does not depend on which
 * path, chunk or thread count produced it.
 *
 * The F16 recipe per block runs in three passes (block_f16_staged), each
 * head's float operations exactly those of the position-by-position loop
 * (block_partial_f16, which DS4_ATTN_REFERENCE=1 runs instead: the oracle
 * tests/test_attention_staged.py compares against, bit for bit): (1) the
 * block's scores for all heads, each K row widened once; (2) per head the
 * online-softmax scalars (running max, expf weights, rescale factors, sum),
 * whose expf calls no longer wait on the V accumulation; (3) the V
 * accumulation, every V row widened once for the group (attn_simd.h; an
 * AVX-512 kernel when the session runs that kernel set).
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
 *    a = f16(fma(v, w, a)), as ggml_vec_mad_f16's SIMD loop does); S = S*ms
 *    + w in float. Per 256-position block; the
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
 *    Remaining differences from llama.cpp's one-chunk path: its dot sums in
 *    another order, and its split-KV chunks are not our 256-position blocks.
 *    (Its F16 mad is an FMA before rounding; ours has been too since
 *    2026-11-30, when it was a multiply, then an add.)
 */
#include "forward.h"
#include "../paths.h"
#include "../quants/attn_simd.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    float *qf;    /* attn_q rows: per head [q_h | gate_h], 2*n_head*d_h */
    float *k;     /* attn_k rows, n_head_kv*d_h */
    float *v;     /* attn_v rows */
    float *attn;  /* attention output rows, n_head*d_h */
} attn_work;

int64_t ds4_attn_work_per_row(const ds4_model_config *c) {
    return 3 * c->n_head * c->head_dim + 2 * c->n_head_kv * c->head_dim;
}

static int64_t group_of(const ds4_model_config *c) {
    const int64_t g = c->n_head_kv > 0 ? c->n_head / c->n_head_kv : 1;
    return g > 0 ? g : 1;
}

/* Per-thread scratch, carved by scratch_of: for the position-by-position
 * loops one block's scores and six dh rows (merge state, block acc, a V
 * row, the F16 accumulator in float and in halves, the widened query); for
 * the staged F16 recipe, per head of the GQA group: the block's weights
 * and the two factor rows (3 * DS4_KV_PAGE), the widened query, a merge state
 * and a block partial (2 + dh each), plus one widened K row. */
int64_t ds4_attn_thread_floats(const ds4_model_config *c) {
    const int64_t g = group_of(c), dh = c->head_dim;
    return DS4_KV_PAGE + 6 * dh + g * (3 * DS4_KV_PAGE + dh + 2 * (2 + dh)) + dh;
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

/* DS4_ATTN_REFERENCE=1: run the F16 recipe position by position
 * (block_partial_f16 per head) instead of the staged passes. Read once. */
static pthread_once_t g_ref_once = PTHREAD_ONCE_INIT;
static int g_ref;

static void read_ref_env(void) {
    const char *v = getenv("DS4_ATTN_REFERENCE");
    g_ref = v && strcmp(v, "1") == 0;
}

static int attn_reference(void) {
    pthread_once(&g_ref_once, read_ref_env);
    return g_ref;
}

/* ------------------------------------------------------------ split-K -- */

/* The staged F16 recipe's V step (attn_simd.h): the portable loop over the
 * kernel set's own steps, or an ISA kernel giving the same bits. */
typedef void (*f16_acc_fn)(float *a, int64_t as, int64_t G, const uint16_t *v, int64_t P,
                           const float *w, const float *r, int64_t rs, int64_t dh,
                           const uint16_t *nk, const uint16_t *nv, int64_t nP);

/* The staged recipe's scores (attn_simd.h), bit-identical to the kernel
 * set's own dots only for the set they were written against. */
typedef void (*f16_scores_fn)(const uint16_t *k, int64_t P, const float *q, int64_t G,
                              int64_t dh, float scale, float *s, int64_t ss,
                              const uint16_t *v);

typedef struct {
    const ds4_fwd *f;
    uint8_t *const *kp, *const *vp;
    float scale;
    f16_acc_fn acc;       /* NULL: the portable V step */
    f16_scores_fn scores; /* NULL: the set's to_float + vec_dot_f32[F32] */
    /* NULL: the portable pass 2 (softmax scalars and S, position by position) */
    void (*softmax)(float *w, float *r, int64_t rs, int64_t G, int64_t P, float *st, int64_t hs);
    int staged;     /* F16 recipe in three passes (else position by position) */
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
    /* staged F16 recipe, G = the GQA group */
    float *sw;     /* G x DS4_KV_PAGE: scores, then the weights expf(s - M) */
    float *sr;     /* G x DS4_KV_PAGE: rescale factors of the accumulator (1: none) */
    float *sm;     /* G x DS4_KV_PAGE: the factors ms of the sum S = S*ms + vs */
    float *qgw;    /* G x dh: the group's queries as qw */
    float *ms;     /* G x (2 + dh): merge states (M, L, A) of the rows path */
    float *bp;     /* G x (2 + dh): block partials (M, S, acc) of the rows path */
    float *kf;     /* dh: one K row widened */
} attn_scratch;

static attn_scratch scratch_of(const ds4_fwd *f, int ith) {
    const int64_t dh = f->c.head_dim, g = group_of(&f->c);
    float *ts = f->thread_scratch + (int64_t)ith * f->per_thread_floats;
    attn_scratch s;
    s.scores = ts;
    s.A = ts + DS4_KV_PAGE;
    s.acc = s.A + dh;
    s.vtmp = s.acc + dh;
    s.tmp = s.vtmp + dh;
    s.qw = s.tmp + dh;
    s.a16 = (uint16_t *)(s.tmp + 2 * dh);
    s.sw = s.tmp + 3 * dh;
    s.sr = s.sw + g * DS4_KV_PAGE;
    s.sm = s.sr + g * DS4_KV_PAGE;
    s.qgw = s.sm + g * DS4_KV_PAGE;
    s.ms = s.qgw + g * dh;
    s.bp = s.ms + g * (2 + dh);
    s.kf = s.bp + g * (2 + dh);
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
 * is rounded back to F16 (a = f16(fma(v, w, a)): one rounding to float, as
 * llama.cpp's SIMD ggml_vec_mad_f16 does, then to F16). S = S*ms + w in float. The block's F16 accumulator is
 * widened to float for the merge.
 *
 * This is the definition of the recipe, run as written only under
 * DS4_ATTN_REFERENCE=1: sessions run block_f16_staged, which gives the
 * same bits faster. */
static void block_partial_f16(const kv_view *kv, int64_t kvh, const float *qw, int64_t b,
                              int64_t n_vis, const attn_scratch *sc, float *m, float *l,
                              float *acc) {
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
        dot(dh, &s, ds4_kv_row(f, kv->kp, kvh, p), qw);
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
            for (int64_t d = 0; d < dh; d++) a[d] = fmaf(v[d], vs, a[d]);
            from_f(a, sc->a16, dh);
            to_f(sc->a16, a, dh);
        }
        S = S * ms + vs;
    }
    for (int64_t d = 0; d < dh; d++) acc[d] = a[d];
    *m = M;
    *l = S;
}

/* attn_simd.h's V step on the kernel set's own steps (f16_acc_row, or
 * to_float / multiply-add / from_float / to_float), for sets without an
 * ISA kernel: the operations block_partial_f16 makes, head by head. */
static void f16_acc_portable(const ds4_fwd *f, const attn_scratch *sc, float *a, int64_t as,
                             int64_t G, const uint16_t *v, int64_t P, const float *w,
                             const float *r, int64_t rs) {
    const int64_t dh = f->c.head_dim;
    ds4_to_float_fn to_f = f->k->to_float[DS4_TYPE_F16];
    ds4_from_float_fn from_f = f->k->from_float[DS4_TYPE_F16];
    for (int64_t i = 0; i < P; i++) {
        const uint16_t *vi = v + i * dh;
        for (int64_t g = 0; g < G; g++) {
            float *ag = a + g * as;
            const float x = r[g * rs + i], vs = w[g * rs + i];
            if (x != 1.0f) {
                for (int64_t d = 0; d < dh; d++) ag[d] *= x;
                from_f(ag, sc->a16, dh);
                to_f(sc->a16, ag, dh);
            }
            if (f->k->f16_acc_row) {
                f->k->f16_acc_row(ag, vi, vs, dh);
            } else {
                to_f(vi, sc->vtmp, dh);
                for (int64_t d = 0; d < dh; d++) ag[d] = fmaf(sc->vtmp[d], vs, ag[d]);
                from_f(ag, sc->a16, dh);
                to_f(sc->a16, ag, dh);
            }
        }
    }
}

/* Pass 2 of block_f16_staged, position by position (the definition the
 * AVX-512 kernel ds4_attn_f16_softmax_avx512 reproduces bit for bit): per
 * head the weights over the scores in sw, the rescale factors in sr, the
 * factors ms in sm; st[g*hstride] = M, st[g*hstride + 1] = S. */
static void f16_softmax_portable(const attn_scratch *sc, int64_t G, int64_t P, float *st,
                                 int64_t hstride) {
    for (int64_t g = 0; g < G; g++) {
        float *w = sc->sw + g * DS4_KV_PAGE, *r = sc->sr + g * DS4_KV_PAGE;
        float *m = sc->sm + g * DS4_KV_PAGE;
        float M = -INFINITY;
        for (int64_t i = 0; i < P; i++) {
            const float s = w[i];
            float ms = 1.0f, vs = 1.0f, x = 1.0f;
            if (s > M) {
                const float Mold = M;
                M = s;
                ms = expf(Mold - M);
                if (Mold != -INFINITY) x = ms;
            } else {
                vs = expf(s - M);
            }
            w[i] = vs;
            r[i] = x;
            m[i] = ms;
        }
        st[g * hstride] = M;
    }
    /* S = S*ms + vs, position by position, for up to four heads at once:
     * each head's chain of dependent multiply-adds overlaps the others'. */
    for (int64_t g0 = 0; g0 < G; g0 += 4) {
        const int64_t n = G - g0 < 4 ? G - g0 : 4;
        float S[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int64_t i = 0; i < P; i++)
            for (int64_t j = 0; j < n; j++) {
                const int64_t o = (g0 + j) * DS4_KV_PAGE + i;
                S[j] = S[j] * sc->sm[o] + sc->sw[o];
            }
        for (int64_t j = 0; j < n; j++) st[(g0 + j) * hstride + 1] = S[j];
    }
}

/* block_partial_f16 for the G query heads of kv head kvh (queries qgw,
 * G x dh, already rounded to F16 and widened), in three passes over the
 * block. Head g's partial goes to st + g*hstride: [0] = M, [1] = S,
 * [2..2+dh) = the F16 accumulator widened. Per head the float operations
 * and their order are block_partial_f16's:
 *  1. scores: the K row widened once (exact) and dotted with each query by
 *     the set's vec_dot_f32[F32], which every set builds from the same loop
 *     as vec_dot_f32[F16] (F16_DOT_WHY): the same sums;
 *  2. softmax scalars, position by position: on a new max the rescale
 *     factor expf(Mold - M) (1 = none: the first position, whose
 *     accumulator is zero; a factor that rounds to exactly 1 changes no
 *     F16 value either, so skipping it is the same), else the weight
 *     expf(s - M); then S = S*ms + vs (ms = expf(Mold - M) on a new max,
 *     else 1), up to four heads' chains interleaved (f16_softmax_portable;
 *     the AVX-512 set runs ds4_attn_f16_softmax_avx512, the same values 16
 *     positions at a time with glibc's expf vectorised, used only where
 *     that expf was found equal to this process's);
 *  3. the V accumulation with those factors (attn_simd.h).
 * Pass 2's expf calls depend only on the scores, so they overlap each
 * other instead of waiting on each position's V step. Memory hints (AVX-512
 * kernels only; they change no value): `next` asks pass 3 to bring block
 * b+1's K and V rows into cache (the caller runs b+1 next on this thread),
 * `prefetched` says the previous block did so for this one, else pass 1
 * brings this block's V rows in for pass 3. */
static void block_f16_staged(const kv_view *kv, int64_t kvh, int64_t G, const float *qgw,
                             int64_t b, int64_t n_vis, const attn_scratch *sc, float *st,
                             int64_t hstride, int prefetched, int next) {
    const ds4_fwd *f = kv->f;
    const int64_t dh = f->c.head_dim;
    const int64_t p0 = b * DS4_KV_PAGE;
    const int64_t P = (p0 + DS4_KV_PAGE < n_vis ? p0 + DS4_KV_PAGE : n_vis) - p0;
    ds4_vec_dot_fn dot = f->k->vec_dot_f32[DS4_TYPE_F32];
    ds4_to_float_fn to_f = f->k->to_float[DS4_TYPE_F16];
    /* A block lies in one page, where a kv head's rows are contiguous. */
    const uint16_t *k0 = (const uint16_t *)ds4_kv_row(f, kv->kp, kvh, p0);
    const uint16_t *v0 = (const uint16_t *)ds4_kv_row(f, kv->vp, kvh, p0);
    if (kv->scores) {
        kv->scores(k0, P, qgw, G, dh, kv->scale, sc->sw, DS4_KV_PAGE, prefetched ? NULL : v0);
    } else {
        for (int64_t i = 0; i < P; i++) {
            to_f(k0 + i * dh, sc->kf, dh);
            for (int64_t g = 0; g < G; g++) {
                float s = 0.0f;
                dot(dh, &s, sc->kf, qgw + g * dh);
                sc->sw[g * DS4_KV_PAGE + i] = s * kv->scale;
            }
        }
    }
    for (int64_t g = 0; g < G; g++) {
        float *o = st + g * hstride;
        for (int64_t d = 0; d < dh; d++) o[2 + d] = 0.0f;
    }
    if (kv->softmax) {
        kv->softmax(sc->sw, sc->sr, DS4_KV_PAGE, G, P, st, hstride);
    } else {
        f16_softmax_portable(sc, G, P, st, hstride);
    }
    if (kv->acc) {
        /* block b+1 (it exists when `next`: the row sees past this block) */
        const int64_t q0 = p0 + DS4_KV_PAGE;
        const int64_t nP = n_vis - q0 < DS4_KV_PAGE ? n_vis - q0 : DS4_KV_PAGE;
        const int pf = next && nP > 0;
        kv->acc(st + 2, hstride, G, v0, P, sc->sw, sc->sr, DS4_KV_PAGE, dh,
                pf ? (const uint16_t *)ds4_kv_row(f, kv->kp, kvh, q0) : NULL,
                pf ? (const uint16_t *)ds4_kv_row(f, kv->vp, kvh, q0) : NULL, pf ? nP : 0);
    } else {
        f16_acc_portable(f, sc, st + 2, hstride, G, v0, P, sc->sw, sc->sr, DS4_KV_PAGE);
    }
}

static void block_partial(const kv_view *kv, int64_t kvh, const float *q, int64_t b,
                          int64_t n_vis, const attn_scratch *sc, float *m, float *l,
                          float *acc) {
    if (kv->f->attn_f16)
        block_partial_f16(kv, kvh, q, b, n_vis, sc, m, l, acc);
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
 * position: the conversions, not memory, bound this loop. The same holds
 * one step further: each set builds vec_dot_f32[F32] from that loop too, so
 * the staged pass widens the K row once for the group and takes
 * vec_dot_f32[F32]. */

/* The F16 recipe's query: q rounded to F16 once per (row, head), widened
 * back to float into qw (a16 is free between blocks). */
static void prep_query_to(const ds4_fwd *f, const float *q, const attn_scratch *sc, float *qw) {
    f->k->from_float[DS4_TYPE_F16](q, sc->a16, f->c.head_dim);
    f->k->to_float[DS4_TYPE_F16](sc->a16, qw, f->c.head_dim);
}

/* The queries a head of row t reads: the F16 recipe's widened F16 copy or
 * the F32 row itself. */
static const float *query_of(const attn_ctx *c, const attn_scratch *sc, int64_t t, int64_t h) {
    const ds4_fwd *f = c->kv.f;
    const float *q = c->qf + t * c->qf_stride + 2 * h * f->c.head_dim;
    if (!f->attn_f16) return q;
    prep_query_to(f, q, sc, sc->qw);
    return sc->qw;
}

/* Items (t, kv head) of a prefill chunk: every query head of the group,
 * all blocks of the row, merged as they go. */
static void rows_items(void *vctx, int64_t i0, int64_t i1, int ith) {
    const attn_ctx *c = vctx;
    const ds4_fwd *f = c->kv.f;
    const int64_t dh = f->c.head_dim, G = c->group, stride = 2 + dh;
    const attn_scratch sc = scratch_of(f, ith);
    const int64_t n_kv = c->n_head / G;
    for (int64_t it = i0; it < i1; it++) {
        const int64_t t = it / n_kv, kvh = it % n_kv, h0 = kvh * G;
        const int64_t n_vis = c->pos0 + t + 1;
        const int64_t nb = (n_vis + DS4_KV_PAGE - 1) / DS4_KV_PAGE;
        float *out = c->attn + t * c->n_head * dh;
        if (c->kv.staged) {
            for (int64_t g = 0; g < G; g++)
                prep_query_to(f, c->qf + t * c->qf_stride + 2 * (h0 + g) * dh, &sc,
                              sc.qgw + g * dh);
            for (int64_t b = 0; b < nb; b++) {
                block_f16_staged(&c->kv, kvh, G, sc.qgw, b, n_vis, &sc, sc.bp, stride, b > 0,
                                 b + 1 < nb);
                for (int64_t g = 0; g < G; g++) {
                    float *m = sc.ms + g * stride;
                    const float *p = sc.bp + g * stride;
                    merge(&m[0], &m[1], m + 2, p[0], p[1], p + 2, dh, b == 0);
                }
            }
            for (int64_t g = 0; g < G; g++) {
                const float *m = sc.ms + g * stride;
                finish(f, out + (h0 + g) * dh, m[1], m + 2, dh);
            }
            continue;
        }
        for (int64_t h = h0; h < h0 + G; h++) {
            const float *q = query_of(c, &sc, t, h);
            float M = 0.0f, L = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                float mb, lb;
                block_partial(&c->kv, kvh, q, b, n_vis, &sc, &mb, &lb, sc.acc);
                merge(&M, &L, sc.A, mb, lb, sc.acc, dh, b == 0);
            }
            finish(f, out + h * dh, L, sc.A, dh);
        }
    }
}

/* Items (kv head, b) of a decode row: block b's partial for every query
 * head of the kv head's GQA group, each K/V block read once for the group
 * (the staged F16 recipe in one pass over the block, the others head after
 * head while the 256-position block is still in cache). Partial of head h,
 * block b at part + (h*nb + b)*(2 + dh), as merge_items reads them. */
static void part_items(void *vctx, int64_t i0, int64_t i1, int ith) {
    const attn_ctx *c = vctx;
    const ds4_fwd *f = c->kv.f;
    const int64_t dh = f->c.head_dim, stride = 2 + dh;
    const attn_scratch sc = scratch_of(f, ith);
    const int64_t n_vis = c->pos0 + 1;
    for (int64_t it = i0; it < i1; it++) {
        const int64_t kvh = it / c->nb, b = it % c->nb, h0 = kvh * c->group;
        if (c->kv.staged) {
            for (int64_t g = 0; g < c->group; g++)
                prep_query_to(f, c->qf + 2 * (h0 + g) * dh, &sc, sc.qgw + g * dh);
            /* items i0..i1 are this thread's: block b was prefetched by
             * item it-1, block b+1 (item it+1) is prefetched here */
            block_f16_staged(&c->kv, kvh, c->group, sc.qgw, b, n_vis, &sc,
                             c->part + (h0 * c->nb + b) * stride, c->nb * stride,
                             it > i0 && b > 0, it + 1 < i1 && b + 1 < c->nb);
            continue;
        }
        for (int64_t h = h0; h < h0 + c->group; h++) {
            float *p = c->part + (h * c->nb + b) * stride;
            block_partial(&c->kv, kvh, query_of(c, &sc, 0, h), b, n_vis, &sc, &p[0], &p[1],
                          p + 2);
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

/* The staged recipe's kernels for this session: AVX-512 ones while the
 * session runs the AVX-512 kernel set (and they were compiled in), else
 * the portable loops (NULL). */
static int avx512_kernels(const ds4_fwd *f) {
    return f->k == ds4_kernels_for(DS4_ISA_AVX512) && ds4_attn_f16_acc_avx512_ok();
}

/* The AVX2 twins (attn_avx2.c) while the session runs the AVX2 set. */
static int avx2_kernels(const ds4_fwd *f) {
    return f->k == ds4_kernels_for(DS4_ISA_AVX2) && ds4_attn_f16_avx2_ok();
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
    ac.kv.staged = f->attn_f16 && !attn_reference();
    ac.kv.acc = ac.kv.staged && avx512_kernels(f) ? ds4_attn_f16_acc_avx512 : NULL;
    ac.kv.scores = ac.kv.staged && avx512_kernels(f) ? ds4_attn_f16_scores_avx512 : NULL;
    /* pass 2 in 16 lanes: glibc's expf vectorised, used only where it was
     * found equal to this process's expf */
    ac.kv.softmax = ac.kv.acc && ds4_attn_f16_softmax_avx512_ok() ? ds4_attn_f16_softmax_avx512
                                                                  : NULL;
    if (ac.kv.staged && avx2_kernels(f)) {
        ac.kv.acc = ds4_attn_f16_acc_avx2;
        ac.kv.scores = ds4_attn_f16_scores_avx2;
    }
    ac.qf = w.qf;
    ac.qf_stride = qf_dim;
    ac.attn = w.attn;
    ac.pos0 = pos0;
    ac.n_head = nh;
    ac.group = nh / nkv; /* grouped GQA: q head h reads kv head h/group (pitfall 3) */
    ac.nb = (pos0 + 1 + DS4_KV_PAGE - 1) / DS4_KV_PAGE;
    ac.part = f->attn_part;
    const int split = n == 1 && ac.nb > 1;
    if (ds4_paths_on()) {
        char v[128];
        snprintf(v, sizeof v, "%s, 256-blocks per GQA group, %s",
                 split ? "split-K decode" : "rows",
                 !f->attn_f16 ? "F32 Q/V"
                 : !ac.kv.staged ? "F16 KV, Q/V in F16, reference loop"
                 : ac.kv.acc == ds4_attn_f16_acc_avx2
                     ? "F16 KV, Q/V in F16, staged, scores+V step avx2"
                 : ac.kv.acc && ac.kv.softmax
                     ? "F16 KV, staged, scores+V step avx512, softmax avx512" /* 95 chars at most */
                 : ac.kv.acc ? "F16 KV, Q/V in F16, staged, scores+V step avx512"
                             : "F16 KV, Q/V in F16, staged, scores+V step portable");
        ds4_path_note(f->path_layer, "attention", v);
    }
    if (split) {
        ds4_pool_for(f->pool, nkv * ac.nb, part_items, &ac);
        ds4_pool_for(f->pool, nh, merge_items, &ac);
    } else {
        ds4_pool_for(f->pool, n * nkv, rows_items, &ac);
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
