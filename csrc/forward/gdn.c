/*
 * gdn.c — the gated DeltaNet mixer (qwen35-spec.md §3).
 *
 * Per chunk: the four input projections in one dispatch; the causal conv
 * over [conv state ; new rows] with SiLU after it; L2 norm of q and k heads,
 * and the 1/sqrt(d_k) scale (on q in exact precision, on the output in fast
 * precision, as transformers and llama.cpp respectively); then, per value
 * head in parallel, the delta rule token by token followed by the gated
 * RMSNorm; then ssm_out.
 *
 * The recurrence runs one token at a time in every case (no chunked
 * triangular solve), so a row's result is the same whatever chunk it is in.
 *
 * In a verify (f->verify) the layer writes its new state to gdn_alt,
 * leaving gdn as the state before the chunk, and records each row's update
 * inputs; ds4_gdn_replay rebuilds the state after any prefix of the rows
 * from them (see "verify rollback" below).
 */
#include "forward.h"
#include "../paths.h"

#include <math.h>
#include <string.h>

/* Layout of f->work for a GDN layer, DS4_CHUNK_ROWS rows per region. */
typedef struct {
    float *qkv;  /* raw attn_qkv rows (conv input), conv_dim each */
    float *z;    /* attn_gate rows, value_dim */
    float *beta; /* ssm_beta rows -> sigmoid, n_v */
    float *g;    /* ssm_alpha rows -> log-decay, n_v */
    float *cv;   /* conv + SiLU output: q | k | v, conv_dim */
    float *o;    /* delta-rule output, then gated-norm output, value_dim */
} gdn_work;

static int64_t conv_dim(const ds4_model_config *c) {
    return 2 * c->ssm_n_k * c->ssm_d_state + c->ssm_d_inner;
}

int64_t ds4_gdn_work_per_row(const ds4_model_config *c) {
    return 2 * conv_dim(c) + 2 * c->ssm_d_inner + 2 * c->ssm_n_v;
}

int64_t ds4_gdn_thread_floats(const ds4_model_config *c) { return c->ssm_d_state; }

static gdn_work carve(const ds4_fwd *f) {
    const ds4_model_config *c = &f->c;
    const int64_t R = DS4_CHUNK_ROWS;
    gdn_work w;
    w.qkv = f->work;
    w.z = w.qkv + R * conv_dim(c);
    w.beta = w.z + R * c->ssm_d_inner;
    w.g = w.beta + R * c->ssm_n_v;
    w.cv = w.g + R * c->ssm_n_v;
    w.o = w.cv + R * conv_dim(c);
    return w;
}

/* The conv state after n more rows: the last K-1 rows of [state ; rows],
 * where row t is rows + t*stride. Reads `in`, writes `out`; they may be
 * the same buffer: row n+s >= s is read before row s is written (ascending
 * s), so the shift works in place. */
static void conv_shift(const float *in, float *out, const float *rows, int64_t stride, int64_t n,
                       int64_t K, int64_t cd) {
    for (int64_t s = 0; s < K - 1; s++) {
        int64_t i = n + s;
        const float *src = i < K - 1 ? in + i * cd : rows + (i - (K - 1)) * stride;
        if (src != out + s * cd) memcpy(out + s * cd, src, (size_t)cd * sizeof(float));
    }
}

/* y = SiLU(x) * m (m NULL: SiLU(x)) over n values: ds4_silu, vectorised
 * where the kernel set can do it bit for bit (quants.h silu_mul). */
static void silu_row(const ds4_fwd *f, float *y, const float *x, const float *m, int64_t n) {
    if (f->k->silu_mul) {
        f->k->silu_mul(y, x, m, n);
        return;
    }
    for (int64_t i = 0; i < n; i++) y[i] = m ? ds4_silu(x[i]) * m[i] : ds4_silu(x[i]);
}

/* Causal depthwise conv, no bias, taps oldest -> newest (spec §3.4, pitfall
 * 5), then SiLU. The state is read from `in`; the new state (the last K-1
 * raw rows) goes to `out` (== in, except in a verify). */
static void conv_step(ds4_fwd *f, const ds4_layer *L, const float *in, float *out,
                      const gdn_work *w, int64_t n) {
    const int64_t K = f->c.ssm_conv_kernel, cd = conv_dim(&f->c);
    const float *cw = (const float *)L->ssm_conv1d.data; /* channel ch: taps cw[ch*K .. +K) */
    for (int64_t t = 0; t < n; t++) {
        const float *rows[16];
        /* seq index t+kk: state row t+kk while < K-1, else new row t+kk-(K-1) */
        for (int64_t kk = 0; kk < K; kk++) {
            int64_t j = t + kk - (K - 1);
            rows[kk] = j < 0 ? in + (K - 1 + j) * cd : w->qkv + j * cd;
        }
        float *o = w->cv + t * cd;
        for (int64_t ch = 0; ch < cd; ch++) {
            const float *tap = cw + ch * K;
            float acc = 0.0f;
            for (int64_t kk = 0; kk < K; kk++) acc += tap[kk] * rows[kk][ch];
            o[ch] = acc;
        }
        silu_row(f, o, o, NULL, cd);
    }
    conv_shift(in, out, w->qkv, cd, n, K, cd);
}

/* One token's update of one value head's state (spec §3.7):
 * S <- exp(g)*S; delta = (v - S.k)*beta; S += k (x) delta. The forward pass
 * and accept's replay (ds4_gdn_replay) both call this, so a replayed row
 * runs the very float operations the row ran in its verify.
 *
 * Row m of S needs only row m: its decay, its dot with k, its delta_m and
 * its rank-1 update touch nothing else, so the update runs row by row in
 * one pass over S (the row stays in L1) instead of three passes over the
 * whole d_k x d_v state; every float operation is the one the three-pass
 * form did, in the same order per element. */
static inline void delta_row(float *Sm, const float *k, float decay, float vm, float beta,
                             ds4_vec_dot_fn dot, int64_t dk) {
    for (int64_t i = 0; i < dk; i++) Sm[i] *= decay;
    float u = 0.0f;
    dot(dk, &u, Sm, k);
    const float dm = (vm - u) * beta;
    for (int64_t i = 0; i < dk; i++) Sm[i] += k[i] * dm;
}

static inline void delta_update(const ds4_kernel_set *ks, float *S, const float *k,
                                const float *v, float g, float beta, int64_t dk, int64_t dv) {
    const float decay = expf(g);
    if (ks->gdn_rows) { /* the same operations, vectorised (quants.h) */
        ks->gdn_rows(S, dv, k, NULL, dk, decay, v, beta, NULL);
        return;
    }
    ds4_vec_dot_fn dot = ks->vec_dot_f32[DS4_TYPE_F32];
    for (int64_t m = 0; m < dv; m++) delta_row(S + m * dk, k, decay, v[m], beta, dot, dk);
}

/* State rows per block in delta_heads: 32 rows of d_k = 128 floats are
 * 16 KiB, which stay in L1 while the chunk's tokens pass over them. */
#define GDN_ROW_BLOCK 32

typedef struct {
    ds4_fwd *f;
    const ds4_layer *L;
    const ds4_gdn_state *in; /* state before the chunk */
    ds4_gdn_state *out;      /* state after it (== in, except in a verify) */
    gdn_work w;
    int64_t n;
} gdn_ctx;

/* Value heads [j0, j1): the delta rule over the chunk's tokens, then the
 * gated norm of each output row of the head. */
static void delta_heads(void *vctx, int64_t j0, int64_t j1, int ith) {
    const gdn_ctx *c = vctx;
    ds4_fwd *f = c->f;
    const ds4_model_config *cf = &f->c;
    const int64_t dk = cf->ssm_d_state, dv = cf->ssm_d_state, nk = cf->ssm_n_k;
    const int64_t nv = cf->ssm_n_v, cd = conv_dim(cf), key_dim = nk * dk, vd = cf->ssm_d_inner;
    ds4_vec_dot_fn dot = f->k->vec_dot_f32[DS4_TYPE_F32];
    const float *norm_w = (const float *)c->L->ssm_norm.data;
    /* FAST scales the output by 1/sqrt(d_k) (ggml's fused gated_delta_net op,
     * ops.cpp: scale = 1.0f / sqrtf((float) S_v)); EXACT scaled q instead. */
    const float oscale = f->fast ? 1.0f / sqrtf((float)dk) : 1.0f;
    for (int64_t j = j0; j < j1; j++) {
        const int64_t kh = j % nk; /* tiled v-head -> k-head rule (spec §3.8, pitfall 3) */
        float *S = c->out->ssm + j * dk * dv;
        if (c->in != c->out)
            memcpy(S, c->in->ssm + j * dk * dv, (size_t)(dk * dv) * sizeof(float));
        /* The delta rule is row-local: row m of S needs only row m, and
         * o_m of token t only row m after token t. So the state goes in
         * blocks of rows, each taken through all the chunk's tokens while
         * it sits in L1 (a 64 KiB head state streamed once per chunk
         * instead of once per token); every row still sees the same
         * operations in the same token order, so no value changes. */
        float decay[DS4_CHUNK_ROWS];
        for (int64_t t = 0; t < c->n; t++) decay[t] = expf(c->w.g[t * nv + j]);
        for (int64_t m0 = 0; m0 < dv; m0 += GDN_ROW_BLOCK) {
            const int64_t nr = dv - m0 < GDN_ROW_BLOCK ? dv - m0 : GDN_ROW_BLOCK;
            for (int64_t t = 0; t < c->n; t++) {
                const float *row = c->w.cv + t * cd;
                const float *q = row + kh * dk, *k = row + key_dim + kh * dk;
                const float *v = row + 2 * key_dim + j * dv + m0;
                float *o = c->w.o + t * vd + j * dv + m0;
                const float beta = c->w.beta[t * nv + j];
                float *Sb = S + m0 * dk;
                if (f->k->gdn_rows) {
                    f->k->gdn_rows(Sb, nr, k, q, dk, decay[t], v, beta, o);
                    continue;
                }
                for (int64_t m = 0; m < nr; m++) {
                    delta_row(Sb + m * dk, k, decay[t], v[m], beta, dot, dk);
                    o[m] = 0.0f;
                    dot(dk, &o[m], Sb + m * dk, q);
                }
            }
        }
        for (int64_t t = 0; t < c->n; t++) {
            float *o = c->w.o + t * vd + j * dv;
            for (int64_t m = 0; m < dv; m++) o[m] = o[m] * oscale;
            /* Gated RMSNorm over the head: norm(o) * ssm_norm * SiLU(z)
             * (spec §3.9; transformers Qwen3_5RMSNormGated). */
            ds4_rmsnorm(o, norm_w, o, dv, cf->rms_eps);
            silu_row(f, o, c->w.z + t * vd + j * dv, o, dv);
        }
    }
}

/* ------------------------------------------------- verify rollback -- */
/* A verify (session.c) keeps, per row of each GDN layer, what the row's
 * state update consumes: the raw attn_qkv row (the conv state is the last
 * K-1 of those), the normed k heads and the v heads, g and beta. Replaying
 * the first k rows from the state before the verify gives the state after
 * them, bit for bit (delta_update is the same code). Keeping these inputs
 * instead of a full state per row costs (2*conv_dim - key_dim + 2*n_v)
 * floats per row and layer instead of (K-1)*conv_dim + n_v*d_k*d_v: about
 * 3.6 MB instead of 157 MB per row on Qwen3.5-27B (session.c has the
 * figures), for one extra full state (gdn_alt) per session. */

int64_t ds4_gdn_capture_floats(const ds4_model_config *c) {
    const int64_t key_dim = c->ssm_n_k * c->ssm_d_state;
    return conv_dim(c) + (conv_dim(c) - key_dim) + 2 * c->ssm_n_v;
}

size_t ds4_gdn_state_bytes(const ds4_model_config *c) {
    return (size_t)((c->ssm_conv_kernel - 1) * conv_dim(c) +
                    c->ssm_n_v * c->ssm_d_state * c->ssm_d_state) *
           sizeof(float);
}

/* Ordinal of GDN layer il among the trunk's GDN layers. */
static int64_t gdn_ordinal(const ds4_fwd *f, int64_t il) {
    int64_t g = 0;
    for (int64_t j = 0; j < il; j++) g += f->m->layers[j].kind == DS4_LAYER_GDN;
    return g;
}

static float *capture_row(const ds4_fwd *f, int64_t g, int64_t t) {
    return f->vcap + (g * f->vcap_rows + t) * ds4_gdn_capture_floats(&f->c);
}

/* Row t's capture: [qkv (cd) | k (key_dim) | v (vd) | g (n_v) | beta (n_v)]. */
static void capture(ds4_fwd *f, int64_t il, const gdn_work *w, int64_t n) {
    const ds4_model_config *c = &f->c;
    const int64_t cd = conv_dim(c), key_dim = c->ssm_n_k * c->ssm_d_state, nv = c->ssm_n_v;
    const int64_t g = gdn_ordinal(f, il);
    for (int64_t t = 0; t < n; t++) {
        float *r = capture_row(f, g, t);
        memcpy(r, w->qkv + t * cd, (size_t)cd * sizeof(float));
        memcpy(r + cd, w->cv + t * cd + key_dim, (size_t)(cd - key_dim) * sizeof(float));
        memcpy(r + 2 * cd - key_dim, w->g + t * nv, (size_t)nv * sizeof(float));
        memcpy(r + 2 * cd - key_dim + nv, w->beta + t * nv, (size_t)nv * sizeof(float));
    }
}

typedef struct {
    ds4_fwd *f;
    int64_t k;
} replay_ctx;

/* Items (trunk layer il, value head j), nothing for a layer that is not
 * GDN: rows 0..k-1 of the head's update, on gdn_alt. */
static void replay_items(void *vctx, int64_t i0, int64_t i1, int ith) {
    const replay_ctx *rc = vctx;
    ds4_fwd *f = rc->f;
    const ds4_model_config *c = &f->c;
    const int64_t dk = c->ssm_d_state, dv = c->ssm_d_state, nk = c->ssm_n_k, nv = c->ssm_n_v;
    const int64_t cd = conv_dim(c), key_dim = nk * dk;
    for (int64_t it = i0; it < i1; it++) {
        const int64_t il = it / nv, j = it % nv;
        if (f->m->layers[il].kind != DS4_LAYER_GDN) continue;
        const int64_t g = gdn_ordinal(f, il);
        float *S = f->gdn_alt[il].ssm + j * dk * dv;
        for (int64_t t = 0; t < rc->k; t++) {
            const float *r = capture_row(f, g, t);
            const float *k = r + cd + (j % nk) * dk; /* tiled v-head -> k-head */
            const float *v = r + cd + key_dim + j * dv;
            const float *gb = r + 2 * cd - key_dim;
            delta_update(f->k, S, k, v, gb[j], gb[nv + j], dk, dv);
        }
    }
}

void ds4_gdn_replay(ds4_fwd *f, int64_t k) {
    const ds4_model_config *c = &f->c;
    for (int64_t il = 0; il < c->n_main; il++) {
        if (f->m->layers[il].kind != DS4_LAYER_GDN) continue;
        ds4_gdn_state *st = &f->gdn_alt[il];
        conv_shift(st->conv, st->conv, capture_row(f, gdn_ordinal(f, il), 0),
                   ds4_gdn_capture_floats(c), k, c->ssm_conv_kernel, conv_dim(c));
    }
    replay_ctx rc = {f, k};
    ds4_pool_for(f->pool, c->n_main * c->ssm_n_v, replay_items, &rc);
}

void ds4_gdn_layer(ds4_fwd *f, int64_t il, int64_t n) {
    const ds4_model_config *c = &f->c;
    const ds4_layer *L = &f->m->layers[il];
    const ds4_gdn_state *st = &f->gdn[il];
    ds4_gdn_state *st_out = f->verify ? &f->gdn_alt[il] : &f->gdn[il];
    const int64_t E = c->n_embd, cd = conv_dim(c), vd = c->ssm_d_inner, nv = c->ssm_n_v;
    const int64_t dk = c->ssm_d_state, nk = c->ssm_n_k, key_dim = nk * dk;
    gdn_work w = carve(f);

    ds4_mm_job jobs[4] = {
        ds4_mm(&L->attn_qkv, 0, 0, cd, f->x, E, w.qkv, cd, n),
        ds4_mm(&L->attn_gate, 0, 0, vd, f->x, E, w.z, vd, n),
        ds4_mm(&L->ssm_beta, 0, 0, nv, f->x, E, w.beta, nv, n),
        ds4_mm(&L->ssm_alpha, 0, 0, nv, f->x, E, w.g, nv, n),
    };
    ds4_matmul(f, jobs, 4);

    conv_step(f, L, st->conv, st_out->conv, &w, n);

    /* q, k: L2 norm per k-head, and the 1/sqrt(d_k) scale. transformers
     * scales q before the recurrence; llama.cpp's fused op scales the output
     * instead (spec §3.7, pitfall 7). Equal in exact arithmetic. EXACT
     * follows transformers (the scale is d_k**-0.5 rounded to float, as torch
     * multiplies a float32 tensor by a Python float; its l2norm, its
     * softplus); FAST follows llama.cpp (output scale in delta_heads, its
     * L2 norm form, ggml's softplus). */
    const float qscale = (float)(1.0 / sqrt((double)dk));
    const float *ssm_a = (const float *)L->ssm_a.data;
    const float *dt_bias = (const float *)L->ssm_dt_bias.data;
    const int fast = f->fast;
    for (int64_t t = 0; t < n; t++) {
        float *row = w.cv + t * cd;
        for (int64_t h = 0; h < nk; h++) {
            float *q = row + h * dk, *k = row + key_dim + h * dk;
            if (fast) {
                ds4_l2norm_ggml(q, dk, c->rms_eps);
                ds4_l2norm_ggml(k, dk, c->rms_eps);
            } else {
                ds4_l2norm(q, dk, c->rms_eps);
                for (int64_t i = 0; i < dk; i++) q[i] *= qscale;
                ds4_l2norm(k, dk, c->rms_eps);
            }
        }
        for (int64_t j = 0; j < nv; j++) {
            float *b = &w.beta[t * nv + j], *g = &w.g[t * nv + j];
            *b = ds4_sigmoid(*b);
            /* ssm_a is already -exp(A_log) (pitfall 2): g = ssm_a * softplus(a + dt_bias). */
            const float a = *g + dt_bias[j];
            const float sp = fast ? ds4_softplus_ggml(a) : ds4_softplus(a);
            *g = ssm_a[j] * sp;
        }
    }

    if (f->verify) capture(f, il, &w, n);

    gdn_ctx ctx = {f, L, st, st_out, w, n};
    if (ds4_paths_on())
        ds4_path_note(f->path_layer, "gdn recurrence",
                      f->k->gdn_rows ? "gdn_row (SIMD) x 32-row blocks, chunk tokens per block"
                                     : "portable loop + vec_dot_f32, 32-row blocks");
    ds4_pool_for(f->pool, nv, delta_heads, &ctx);

    ds4_mm_job out = ds4_mm(&L->ssm_out, 0, 0, E, w.o, vd, f->y, E, n);
    ds4_matmul(f, &out, 1);
}
