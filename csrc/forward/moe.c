/*
 * moe.c — routed experts plus the shared expert (qwen35-spec.md §5).
 *
 * Router softmax over all experts, top-k (ties to the lower expert id),
 * weights renormalised with the 6.103515625e-5 clamp, expert outputs scaled
 * by their weight and added in slot order, plus sigmoid(shexp gate) times
 * the shared expert. Rows are grouped by expert so an expert's weights are
 * streamed once per chunk; every (row, slot) element is still one dot of
 * the same kernel, so grouping does not change any value.
 */
#include "forward.h"
#include "../paths.h"

#include <math.h>

/* llama-graph.cpp build_moe_ffn: the renormalisation's lower clamp on the
 * sum of the selected weights. */
#define MOE_WSUM_MIN 6.103515625e-5f

typedef struct {
    float *logits;  /* router rows, n_expert */
    float *g, *u;   /* expert gate/up per (row, slot) pair, n_ff_exp */
    float *d;       /* expert down per pair, n_embd */
    float *sg, *su; /* shared gate/up rows, n_ff_shexp */
    float *sd;      /* shared down rows, n_embd */
    float *sgate;   /* shared gate scalar per row */
} moe_work;

int64_t ds4_moe_work_per_row(const ds4_model_config *c) {
    const int64_t k = c->n_expert_used;
    return c->n_expert + 2 * k * c->n_ff_exp + k * c->n_embd + 2 * c->n_ff_shexp +
           c->n_embd + 1;
}

static moe_work carve(const ds4_fwd *f) {
    const ds4_model_config *c = &f->c;
    const int64_t R = DS4_CHUNK_ROWS, k = c->n_expert_used;
    moe_work w;
    w.logits = f->work;
    w.g = w.logits + R * c->n_expert;
    w.u = w.g + R * k * c->n_ff_exp;
    w.d = w.u + R * k * c->n_ff_exp;
    w.sg = w.d + R * k * c->n_embd;
    w.su = w.sg + R * c->n_ff_shexp;
    w.sd = w.su + R * c->n_ff_shexp;
    w.sgate = w.sd + R * c->n_embd;
    return w;
}

/* Softmax over all experts, then the top-k by probability: repeated
 * arg-max scanning upward with a strict '>', so equal probabilities go to
 * the lower id (a stable descending sort's order). */
static void route(const ds4_model_config *c, int fast, const float *logits, int32_t *sel,
                  float *wt, float *p) {
    const int64_t ne = c->n_expert, k = c->n_expert_used;
    float mx = logits[0];
    for (int64_t e = 1; e < ne; e++)
        if (logits[e] > mx) mx = logits[e];
    if (fast) {
        /* ggml's soft_max (ggml-cpu ops.cpp soft_max_f32 and vec.cpp
         * ggml_vec_soft_max_f32): the sum of exps in double, then every exp
         * multiplied by (float)(1/sum). (Its SIMD body uses a vector exp for
         * runs of 16; we use expf throughout.) */
        double sum = 0.0;
        for (int64_t e = 0; e < ne; e++) {
            p[e] = expf(logits[e] - mx);
            sum += (double)p[e];
        }
        const float inv = (float)(1.0 / sum);
        for (int64_t e = 0; e < ne; e++) p[e] *= inv;
    } else {
        float sum = 0.0f;
        for (int64_t e = 0; e < ne; e++) {
            p[e] = expf(logits[e] - mx);
            sum += p[e];
        }
        for (int64_t e = 0; e < ne; e++) p[e] /= sum;
    }
    for (int64_t s = 0; s < k; s++) {
        int64_t best = -1;
        for (int64_t e = 0; e < ne; e++) {
            int taken = 0;
            for (int64_t q = 0; q < s; q++) taken |= sel[q] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        sel[s] = (int32_t)best;
        wt[s] = p[best];
    }
    float ws = 0.0f;
    if (fast) {
        /* ggml_sum_rows accumulates in double (vec.h ggml_vec_sum_f32). */
        double d = 0.0;
        for (int64_t s = 0; s < k; s++) d += (double)wt[s];
        ws = (float)d;
    } else {
        for (int64_t s = 0; s < k; s++) ws += wt[s];
    }
    if (ws < MOE_WSUM_MIN) ws = MOE_WSUM_MIN;
    for (int64_t s = 0; s < k; s++) wt[s] /= ws;
}

void ds4_ffn_moe(ds4_fwd *f, const ds4_layer *L, int64_t n) {
    const ds4_model_config *c = &f->c;
    const int64_t E = c->n_embd, ne = c->n_expert, k = c->n_expert_used;
    const int64_t Fe = c->n_ff_exp, Fs = c->n_ff_shexp;
    const int shared = L->ffn_gate_shexp.data != NULL;
    moe_work w = carve(f);
    ds4_mm_job *jobs = f->moe_jobs;
    int nj = 0;

    jobs[nj++] = ds4_mm(&L->ffn_gate_inp, 0, 0, ne, f->x, E, w.logits, ne, n);
    if (shared) {
        jobs[nj++] = ds4_mm(&L->ffn_gate_shexp, 0, 0, Fs, f->x, E, w.sg, Fs, n);
        jobs[nj++] = ds4_mm(&L->ffn_up_shexp, 0, 0, Fs, f->x, E, w.su, Fs, n);
        if (L->ffn_gate_inp_shexp.data)
            jobs[nj++] = ds4_mm(&L->ffn_gate_inp_shexp, 0, 0, 1, f->x, E, w.sgate, 1, n);
    }
    ds4_matmul(f, jobs, nj);

    /* Route every row; the probabilities go to the (already read) logits row. */
    for (int64_t t = 0; t < n; t++)
        route(c, f->fast, w.logits + t * ne, f->moe_sel + t * k, f->moe_w + t * k,
              w.logits + t * ne);

    /* Group the (row, slot) pairs by expert, ascending pair index within one. */
    int64_t *off = f->moe_off;
    for (int64_t e = 0; e <= ne; e++) off[e] = 0;
    for (int64_t i = 0; i < n * k; i++) off[f->moe_sel[i] + 1]++;
    for (int64_t e = 0; e < ne; e++) off[e + 1] += off[e];
    for (int64_t i = 0; i < n * k; i++) {
        int64_t e = f->moe_sel[i];
        int64_t at = off[e]++;
        f->moe_idx[at] = (int32_t)i;
        f->moe_src[at] = (int32_t)(i / k);
    }
    for (int64_t e = ne; e > 0; e--) off[e] = off[e - 1]; /* undo the fill's advance */
    off[0] = 0;

    if (ds4_paths_on())
        ds4_path_note(f->path_layer, "moe", L->ffn_gate_up_exps.data
                                                ? "routed experts only, fused gate_up"
                                                : "routed experts only, gate/up separate");
    const ds4_tensor *gt = L->ffn_gate_up_exps.data ? &L->ffn_gate_up_exps : &L->ffn_gate_exps;
    const ds4_tensor *ut = L->ffn_gate_up_exps.data ? &L->ffn_gate_up_exps : &L->ffn_up_exps;
    const int64_t u_row0 = L->ffn_gate_up_exps.data ? Fe : 0; /* fused: gate rows first, then up */
    nj = 0;
    for (int64_t e = 0; e < ne; e++) {
        int64_t cnt = off[e + 1] - off[e];
        if (!cnt) continue;
        ds4_mm_job jg = ds4_mm(gt, e, 0, Fe, f->x, E, w.g, Fe, cnt);
        ds4_mm_job ju = ds4_mm(ut, e, u_row0, Fe, f->x, E, w.u, Fe, cnt);
        jg.x_idx = ju.x_idx = f->moe_src + off[e];
        jg.y_idx = ju.y_idx = f->moe_idx + off[e];
        jobs[nj++] = jg;
        jobs[nj++] = ju;
    }
    ds4_matmul(f, jobs, nj);

    /* SwiGLU: the set's vectorised SiLU where it has one, the same bits as
     * the loops (quants.h silu_mul; ffn.c) */
    if (f->k->silu_mul) {
        f->k->silu_mul(w.g, w.g, w.u, n * k * Fe);
        if (shared) f->k->silu_mul(w.sg, w.sg, w.su, n * Fs);
    } else {
        for (int64_t i = 0; i < n * k * Fe; i++) w.g[i] = ds4_silu(w.g[i]) * w.u[i];
        if (shared)
            for (int64_t i = 0; i < n * Fs; i++) w.sg[i] = ds4_silu(w.sg[i]) * w.su[i];
    }

    nj = 0;
    for (int64_t e = 0; e < ne; e++) {
        int64_t cnt = off[e + 1] - off[e];
        if (!cnt) continue;
        ds4_mm_job jd = ds4_mm(&L->ffn_down_exps, e, 0, E, w.g, Fe, w.d, E, cnt);
        jd.x_idx = jd.y_idx = f->moe_idx + off[e];
        jobs[nj++] = jd;
    }
    if (shared) jobs[nj++] = ds4_mm(&L->ffn_down_shexp, 0, 0, E, w.sg, Fs, w.sd, E, n);
    ds4_matmul(f, jobs, nj);

    for (int64_t t = 0; t < n; t++) {
        float *y = f->y + t * E;
        const float *wt = f->moe_w + t * k;
        for (int64_t i = 0; i < E; i++) y[i] = w.d[(t * k) * E + i] * wt[0];
        for (int64_t s = 1; s < k; s++) {
            const float *d = w.d + (t * k + s) * E;
            for (int64_t i = 0; i < E; i++) y[i] += d[i] * wt[s];
        }
        if (shared) {
            const float gm = L->ffn_gate_inp_shexp.data ? ds4_sigmoid(w.sgate[t]) : 1.0f;
            const float *sd = w.sd + t * E;
            for (int64_t i = 0; i < E; i++) y[i] += gm * sd[i];
        }
    }
}
