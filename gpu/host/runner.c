/*
 * runner.c — the dense Qwen3.5 layer loop on a k_device (runner.h).
 *
 * Mirrors csrc/forward/forward.c ds4_fwd_chunk step for step, so a reader
 * can hold the two side by side: embedding rows (dequantized on the host
 * by the CPU's own kernels and uploaded: E floats per token), then per
 * layer RMSNorm -> mixer (GDN or gated attention) -> residual add ->
 * RMSNorm -> SwiGLU FFN -> residual add, then the output norm, the LM head
 * and the on-device argmax. Each step is one kernel of gpu/kernels/ (the
 * file named beside it); the CPU code it reproduces is named there too.
 *
 * Rows are processed in chunks of K_RUNNER_PREFILL_CHUNK (512; K_RUNNER_CHUNK,
 * 64, when every row's logits are wanted): the matrices of a
 * chunk wider than K_MATVEC_MAX_ROWS (16) go through the prefill GEMM
 * (gemm_mma.h's staged int8 tensor-core GEMMs on CUDA and the emulator,
 * gemm.h's dp4a on Metal; K_RUNNER_GEMM picks), narrower ones (decode, verify) through the matvecs, the same
 * bits per value either way; the GDN conv + recurrence of all the chunk's
 * tokens is one gdn_seq launch per layer (state on chip between tokens);
 * attention serves up to 16 rows per split-K launch (row t sees positions
 * [0, pos0 + t]).
 *
 * Numerics: per kernel, docs/gpu.md §3 states what is bit-identical to the
 * CPU's fast precision (matvec integer dots, RoPE, K/V fp16 stores) and
 * what is within a stated tolerance (float sums where the CPU sums in
 * double, the attention recipe, device exp); the model-level comparison is
 * tests/test_gpu_model.py.
 */
#include "runner_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/attn_plan.h"
#include "q8_0_rows.h"

#ifndef K_GDN_SEQ_TARGET_GROUPS
/* gdn_seq's split for runs of at least K_GDN_SEQ_SPLIT_MIN tokens (every
 * run, decode included, by default): G threadgroups per value head, d / G
 * state rows each, then gdn_norm over the raw outputs (one more launch). G is the largest
 * of 1, 2, 4, 8 dividing d with n_v G <= this target: gdn_seq runs one
 * threadgroup per GPU core (its registers), so a split past the core count
 * makes a second wave (H200, 132 SMs, 27B-like n_v 48: split 4 = 192
 * threadgroups ran no faster than 1). The bits do not depend on G (gdn.h;
 * test_gpu_emul gdnseq); K_RUNNER_GDN_SPLIT fixes it (1 turns it off). */
#define K_GDN_SEQ_TARGET_GROUPS 132u
#endif
#ifndef K_GDN_SEQ_SPLIT_MIN
/* 1 since measured on the H200 2026-12-01 (ncu, one-token decode runs):
 * gdn_seq 18.6 us unsplit vs 13.8 (split 8) + 3.2 (gdn_norm) on the 0.8B
 * shape, 18.8 vs 14.4 + 3.3 on the 35B-A3B-like MoE (split 4) */
#define K_GDN_SEQ_SPLIT_MIN 1
#endif

#ifndef K_FUSED_CHUNK_ROWS_MAX
/* swiglu_quant / attn_gate_quant (fused.h) take one SIMD-group per 32
 * values up to this many rows (a decode step, a verify: the shortest
 * chain; H100, 27B-like decode, swiglu_quant 8.5 -> 7.6 us and the step
 * -4%), one per 256-value block (K_NQ_BLOCKS) past it (prefill: the
 * per-32 layout recomputes each block 8 times; 27B-like prefill was 2%
 * slower with it). The bits are the same either way. */
#define K_FUSED_CHUNK_ROWS_MAX 16
#endif
static unsigned fused_units(int64_t rows) { return rows > K_FUSED_CHUNK_ROWS_MAX ? K_NQ_BLOCKS : 0u; }

#ifndef K_ATTN_PART_BYTES_MAX
/* the attention partials buffer's cap when the runner picks its query rows
 * per launch (below: 512 rows at n_ctx 4096 on the 0.8B shape, 68 MB;
 * 128 rows at 32k, 135 MB) */
#define K_ATTN_PART_BYTES_MAX (256ll << 20)
#endif

#ifndef K_GDN_ROWS_MIN
/* runs of at least this many tokens take gdn_prep + gdn_rows + gdn_norm
 * instead of gdn_seq (the same bits: test_gpu_emul gdnseq): H100, a
 * 27B-like layer (bench_matvec), us per token, gdn_seq at its best split
 * vs the three launches: 4 tokens 7.07 vs 4.81, 16 4.83 vs 2.17, 512
 * 4.16 vs 1.57; one token (decode) keeps gdn_seq's single launch */
#define K_GDN_ROWS_MIN 2
#endif
#ifndef K_GDN_ROWS_TARGET_WARPS
/* gdn_rows' SIMD-groups that one wave holds: 132 SMs x 16 (the H100 /
 * H200 at gdn_rows' 128 registers since its two-token look-ahead and
 * paired butterflies: 4 threadgroups of 4 SIMD-groups an SM; 20 at the
 * 89 before). H200, 512 tokens, rows us at 1 / 2 rows a SIMD-group: n_v
 * 16 (2048 / 1024 SIMD-groups) 267.7 / 295.9, n_v 32 (4096 / 2048)
 * 526.5 / 376.9, n_v 48 (6144 / 3072) 784.7 / 639.9 */
#define K_GDN_ROWS_TARGET_WARPS (132u * 16u)
#endif

#ifndef K_MOE_LOGITS_SPLIT
/* SIMD-groups per router row (moe_logits), the default of r->moe_split.
 * The H200 sweep of 2026-11-30 (the 35B-A3B-like MoE, docs/gpu.md) chose
 * it; 1 is the unsplit order. */
#define K_MOE_LOGITS_SPLIT 16u
#endif

#ifndef K_ATTN_WIDE_MIN
/* Query rows from which attention takes attn_partials_wide (the same
 * partials; only speed depends on it): verify widths (2..16) keep
 * attn_partials, whose head split keeps more of the GPU busy. */
#define K_ATTN_WIDE_MIN 32
#endif

#ifndef K_MOE_LOGITS_WIDE_MIN
/* Token rows from which the router takes moe_logits_wide (the same bits;
 * only speed depends on it): below, moe_logits' one threadgroup per router
 * row keeps more of the GPU busy. */
#define K_MOE_LOGITS_WIDE_MIN 32
#endif

/* Threadgroups the split-K attention aims for: two per SM of an H100's or
 * H200's 132, as many as are resident at once (attn.h: 2 x 512 threads at
 * 64 registers). Only speed depends on it. 256 made a 32768 + 40-token
 * context (129 blocks, 2 KV heads) take 65 splits of 2 blocks: 130
 * threadgroups, one an SM, each twice as long (ncu, session 22). */
#define ATTN_TARGET_GROUPS 264
/* Threadgroups below which attn_partials splits a GQA group's query heads
 * over several threadgroups (attn_plan.h k_attn_head_split): about one per
 * H200 core. Only speed depends on it; K_RUNNER_ATTN_HS=N (a divisor of G)
 * fixes the split, for A/B runs. */
#ifndef K_ATTN_HEAD_SPLIT_GROUPS
#define K_ATTN_HEAD_SPLIT_GROUPS 128u
#endif
/* Threads of an attn_partials threadgroup on CUDA (a speed knob: the score
 * loop's positions spread over its SIMD-groups; the bits never depend on
 * it). 1024 measured best on the H200 in the first sweep (attn.h); since the
 * head split and the L2 look-ahead, 512 (H200, 2026-12-01, two builds
 * interleaved, 2 repetitions, docs/gpu.md §7): 0.8B Q8_0 prefill +2% / +10%
 * / +30% at ctx 512 / 4k / 32k, decode within ±2%; MoE decode +4% at 512 and
 * 4k; golden and demo outputs cmp-identical to 1024's. The emulator and
 * Metal keep 256 (the emulator's fibers cost per thread, and a Metal
 * pipeline's maxTotalThreadsPerThreadgroup may be below 512: unmeasured). */
#ifndef K_ATTN_TG
#define K_ATTN_TG 512
#endif


/* ---------------------------------------------------------- memory -- */

static void *mem_alloc(k_device *d, k_allocs *a, size_t bytes, ds4_error *err) {
    if (a->n == a->cap) {
        const int64_t cap = a->cap ? 2 * a->cap : 64;
        void **np = realloc(a->p, (size_t)cap * sizeof *np);
        if (!np) {
            ds4_fail(err, DS4_ERR_NOMEM, "out of host memory");
            return NULL;
        }
        a->p = np;
        a->cap = cap;
    }
    void *p = d->alloc(d, bytes);
    if (!p) {
        ds4_fail(err, DS4_ERR_NOMEM, "%s: cannot allocate %zu bytes: %s", d->name, bytes, d->err);
        return NULL;
    }
    a->p[a->n++] = p;
    a->bytes += bytes;
    return p;
}

static void mem_release(k_device *d, k_allocs *a) {
    for (int64_t i = 0; i < a->n; i++) d->release(d, a->p[i]);
    free(a->p);
    memset(a, 0, sizeof *a);
}

void *kr_mem_upload(k_device *d, k_allocs *a, const void *src, size_t bytes, ds4_error *err) {
    void *p = mem_alloc(d, a, bytes, err);
    if (!p) return NULL;
    if (d->upload(d, p, src, bytes)) {
        ds4_fail(err, DS4_ERR_INTERNAL, "%s upload: %s", d->name, d->err);
        return NULL;
    }
    return p;
}

/* `bytes` of weight rows (n_in values each) of ds4 type `type` to byte `off`
 * of the device buffer dst. Q8_0 rows go in the device layout
 * (q8_0_rows.h: the same bytes per row, codes then scales), repacked a
 * bounded slice at a time so no host copy of a whole matrix is made; every
 * other type as it is. */
static int kr_upload_weights(k_device *d, void *dst, size_t off, const void *src, size_t bytes, int type, int64_t n_in,
                             ds4_error *err) {
    if (!bytes) return 0;
    if (type != DS4_TYPE_Q8_0) {
        if (d->upload(d, (uint8_t *)dst + off, src, bytes))
            return ds4_fail(err, DS4_ERR_INTERNAL, "%s upload: %s", d->name, d->err);
        return 0;
    }
    const size_t rb = (size_t)n_in / 32 * 34, slice = rb * (((size_t)1 << 20) / rb + 1); /* ~1 MB */
    if (n_in <= 0 || n_in % 32 || bytes % rb)
        return ds4_fail(err, DS4_ERR_INTERNAL, "Q8_0 upload: %zu bytes are not whole rows of %lld values", bytes,
                        (long long)n_in);
    uint8_t *host = malloc(slice < bytes ? slice : bytes);
    if (!host) return ds4_fail(err, DS4_ERR_NOMEM, "out of host memory");
    int rc = 0;
    for (size_t o = 0; o < bytes && !rc; o += slice) {
        const size_t n = bytes - o < slice ? bytes - o : slice;
        k_q8_0_rows_to_device(host, (const uint8_t *)src + o, n / rb, (size_t)n_in);
        if (d->upload(d, (uint8_t *)dst + off + o, host, n))
            rc = ds4_fail(err, DS4_ERR_INTERNAL, "%s upload: %s", d->name, d->err);
    }
    free(host);
    return rc;
}

/* Session memory. */
void *kr_dalloc(k_runner *r, size_t bytes, ds4_error *err) { return mem_alloc(r->dev, &r->mem, bytes, err); }
static void *upload(k_runner *r, const void *src, size_t bytes, ds4_error *err) {
    return kr_mem_upload(r->dev, &r->mem, src, bytes, err);
}

/* Dense matrix types with a GPU matvec (Q4_64A: quant_q4_64a.h, dense
 * matrices only: the MoE kernels have no Q4_64A dot, moe_type refuses it). */
static int mat_type_ok(int type) {
    return type == DS4_TYPE_Q8_0 || type == DS4_TYPE_Q4_K || type == DS4_TYPE_Q5_K ||
           type == DS4_TYPE_Q6_K || type == DS4_TYPE_Q4_64A;
}

int kr_upload_mat(k_gpu_model *r, const ds4_tensor *t, dev_mat *out, ds4_error *err) {
    if (!mat_type_ok(t->type)) {
        ds4_type_info ti;
        ds4_error e2;
        const char *tn = ds4_type_get_info(t->type, &ti, &e2) == 0 ? ti.name : "?";
        return ds4_fail(err, DS4_ERR_UNSUPPORTED,
                        "%s: tensor %s has type %s, which has no GPU kernel yet (GPU matrices: "
                        "Q8_0, Q4_K, Q5_K, Q6_K, Q4_64A)",
                        r->dev->name, t->name, tn);
    }
    out->type = t->type;
    out->n_in = t->ne[0];
    out->n_out = t->ne[1];
    out->bytes = t->row_bytes * (size_t)t->ne[1];
    out->p = mem_alloc(r->dev, &r->mem, out->bytes, err);
    if (!out->p) return err->code;
    return kr_upload_weights(r->dev, out->p, 0, t->data, out->bytes, t->type, t->ne[0], err);
}

/* Matrices that read the same activations and whose outputs sit side by
 * side (a GDN layer's four input projections, the FFN's gate and up):
 * each run of consecutive ones sharing a type and n_in is uploaded as ONE
 * matrix, rows concatenated in order, so one matvec launch computes the
 * whole run (issue 19: fewer launches). A row's sum never depends on the
 * launch that computes it (quant_q8_0.h / quant_kq.h), so the bits are
 * those of separate launches. Each matrix keeps its own dev_mat pointing
 * inside its run (offsets are whole matrices of one type, each at least
 * 4-aligned: see the loop) for the unfused path (K_RUNNER_FUSE=0). *n_runs
 * runs land in runs[]. */
int kr_upload_group(k_gpu_model *r, const ds4_tensor *const *t, dev_mat *const *out, int k, mat_run *runs,
                        int *n_runs, ds4_error *err) {
    int rc;
    *n_runs = 0;
    for (int i0 = 0; i0 < k;) {
        int i1 = i0 + 1;
        /* a matrix joins the run only where it starts 4-aligned: K_RUNNER_FUSE=0
         * binds the run's matrices one by one, and the Q8_0 / Q6_K kernels
         * read 2-aligned blocks with 4-byte loads relative to the binding
         * (34- and 210-byte blocks: a run of an odd number of them ends
         * 2 mod 4; no real shape has one) */
        size_t joined = t[i0]->row_bytes * (size_t)t[i0]->ne[1];
        if (mat_type_ok(t[i0]->type))
            while (i1 < k && t[i1]->type == t[i0]->type && t[i1]->ne[0] == t[i0]->ne[0] && joined % 4 == 0)
                joined += t[i1]->row_bytes * (size_t)t[i1]->ne[1], i1++;
        mat_run *run = &runs[(*n_runs)++];
        run->first = i0;
        if (i1 - i0 == 1) {
            if ((rc = kr_upload_mat(r, t[i0], out[i0], err))) return rc;
            run->m = *out[i0];
            i0 = i1;
            continue;
        }
        size_t total = 0, off = 0;
        for (int i = i0; i < i1; i++) total += t[i]->row_bytes * (size_t)t[i]->ne[1];
        uint8_t *dev = mem_alloc(r->dev, &r->mem, total, err);
        if (!dev) return err->code;
        for (int i = i0; i < i1; i++) {
            const size_t bytes = t[i]->row_bytes * (size_t)t[i]->ne[1];
            if ((rc = kr_upload_weights(r->dev, dev, off, t[i]->data, bytes, t[i]->type, t[i]->ne[0], err))) return rc;
            off += bytes;
        }
        run->m = (dev_mat){dev, t[i0]->type, t[i0]->ne[0], 0, total};
        for (off = 0; i0 < i1; i0++) {
            const size_t bytes = t[i0]->row_bytes * (size_t)t[i0]->ne[1];
            *out[i0] = (dev_mat){dev + off, t[i0]->type, t[i0]->ne[0], t[i0]->ne[1], bytes};
            run->m.n_out += t[i0]->ne[1];
            off += bytes;
        }
    }
    return 0;
}

void *kr_upload_f32(k_gpu_model *r, const ds4_tensor *t, int64_t n, ds4_error *err) {
    if (t->type != DS4_TYPE_F32) {
        ds4_fail(err, DS4_ERR_UNSUPPORTED, "%s: tensor %s must be F32 on the GPU", r->dev->name, t->name);
        return NULL;
    }
    return kr_mem_upload(r->dev, &r->mem, t->data, (size_t)n * sizeof(float), err);
}

/* --------------------------------------------------------- launches -- */

int kr_launch(k_runner *r, int id, uint32_t gx, uint32_t gy, uint32_t gz, uint32_t tg,
                  const k_binding *b, int nb, ds4_error *err) {
    const uint32_t grid[3] = {gx ? gx : 1, gy ? gy : 1, gz ? gz : 1};
    r->launches++;
    if (r->dev->launch(r->dev, id, grid, tg, b, nb)) {
        const k_kernel_desc *d = k_kernel_desc_of(id);
        return ds4_fail(err, DS4_ERR_INTERNAL, "%s: launch of %s failed: %s", r->dev->name,
                        d ? d->name : "?", r->dev->err);
    }
    return 0;
}


/* Threads for a one-threadgroup-per-row reduction over n elements: fixed
 * per n (a row's float sum order depends on it, never on the row count). */
uint32_t kr_row_tg(int64_t n) {
    if (n >= 4096) return 1024; /* 27B-like E 5120: one SM per row, so use it all */
    if (n >= 256) return 256;
    return (uint32_t)((n + 31) / 32 * 32);
}

/* y_row = rmsnorm(x_row) * w for n_rows rows, `stride` floats apart in x
 * and `ystride` in y (rmsnorm.h). */
int kr_rmsnorm(k_runner *r, const float *x, const void *w, float *y, int64_t n, int64_t n_rows, int64_t stride,
               int64_t ystride, ds4_error *err) {
    k_rmsnorm_params p = {K_TAG_OF(rmsnorm), (uint32_t)n, (uint32_t)n_rows, (uint32_t)stride,
                          r->c.rms_eps, 1, (uint32_t)ystride};
    k_binding b[] = {STATUS_BIND(rmsnorm), K_BIND(rmsnorm, p, &p, sizeof p),
                     K_BIND(rmsnorm, x, x, F4((n_rows - 1) * stride + n)), K_BIND(rmsnorm, w, w, F4(n)),
                     K_BIND(rmsnorm, y, y, F4((n_rows - 1) * ystride + n))};
    return kr_launch(r, K_ID_rmsnorm, (uint32_t)n_rows, 1, 1, kr_row_tg(n), b, 5, err);
}


/* The activation type a matrix's matvec reads (K_NQ_Q8_0 for Q8_0
 * weights, K_NQ_Q8_K for the K-quants: the CPU's fast precision pairs). */
unsigned kr_act_flag(const dev_mat *w) {
    return w->type == DS4_TYPE_Q8_0 || w->type == DS4_TYPE_Q4_64A ? K_NQ_Q8_0 : K_NQ_Q8_K; /* Q4_64A x Q8_0: traits.c */
}

/* A Q4_64A job (quant_q4_64a.h) over rows of r->xq8: the prefill GEMM
 * (gemm_q4_64a) for more than K_MATVEC_MAX_ROWS rows (unless K_RUNNER_GEMM=0
 * or the grid passes CUDA's 65535 in y; no tensor-core variant), else the
 * matvec variant for each block of at most K_MATVEC_MAX_ROWS rows. Every
 * value has the width-1 matvec's bits on either path (tested: test_gpu_emul
 * q4_64a), so chunk boundaries never show. */
static int mm_rows_q4_64a(k_runner *r, const mm_job *job, int64_t n_rows, ds4_error *err) {
    const dev_mat *w = job->w;
    const int64_t ys = job->y_stride;
    const size_t xrow = (size_t)(w->n_in / 32) * 34;
    if (n_rows > K_MATVEC_MAX_ROWS && r->gemm && K_GEMM_GROUPS_Y((uint64_t)w->n_out) <= 65535u) {
        k_gemm_q4_64a_params p = {K_TAG_OF(gemm_q4_64a), (uint32_t)w->n_in, (uint32_t)w->n_out, (uint32_t)n_rows,
                                  (uint32_t)ys};
        k_binding b[] = {STATUS_BIND(gemm_q4_64a), K_BIND(gemm_q4_64a, p, &p, sizeof p),
                         K_BIND(gemm_q4_64a, w, w->p, w->bytes), K_BIND(gemm_q4_64a, xq, r->xq8, (size_t)n_rows * xrow),
                         K_BIND(gemm_q4_64a, y, job->y, F4((n_rows - 1) * ys + w->n_out))};
        return kr_launch(r, K_ID_gemm_q4_64a, K_GEMM_GROUPS_X((uint32_t)n_rows), K_GEMM_GROUPS_Y((uint32_t)w->n_out), 1,
                         K_GEMM_TG, b, 5, err);
    }
    int rc = 0;
    for (int64_t r0 = 0; r0 < n_rows && !rc; r0 += K_MATVEC_MAX_ROWS) {
        const int64_t nr = n_rows - r0 < K_MATVEC_MAX_ROWS ? n_rows - r0 : K_MATVEC_MAX_ROWS;
        const int id = K_MATVEC_Q4_64A_KERNEL((uint32_t)nr);
        k_matvec_q4_64a_params p = {K_TAG((k_u32)id), (uint32_t)w->n_in, (uint32_t)w->n_out, (uint32_t)nr,
                                    (uint32_t)ys};
        k_binding b[] = {STATUS_BIND(matvec_q4_64a), K_BIND(matvec_q4_64a, p, &p, sizeof p),
                         K_BIND(matvec_q4_64a, w, w->p, w->bytes),
                         K_BIND(matvec_q4_64a, xq, r->xq8 + r0 * xrow, (size_t)nr * xrow),
                         K_BIND(matvec_q4_64a, y, job->y + r0 * ys, F4((nr - 1) * ys + w->n_out))};
        rc = kr_launch(r, id, K_MATVEC_Q4_64A_GROUPS((uint32_t)nr, (uint32_t)w->n_out, MATVEC_TG / 32), 1, 1,
                    MATVEC_TG, b, 5, err);
    }
    return rc;
}

/* y rows [0, n_rows) of one job from the quantized rows in r->xq8 /
 * r->xqk: the prefill GEMM (gemm.h) for more than K_MATVEC_MAX_ROWS rows,
 * else (or with K_RUNNER_GEMM=0, or a Q8_0 matvec order the GEMM does not
 * reproduce, or a grid past CUDA's 65535 in y) the matvec in blocks of at
 * most K_MATVEC_MAX_ROWS rows. Every output value has the same bits on
 * either path (gemm.h; tested: test_gpu_emul gemm), so where a chunk or
 * block boundary falls never shows. */
static int mm_rows(k_runner *r, const mm_job *job, int64_t n_rows, ds4_error *err) {
    const dev_mat *w = job->w;
    if (w->type == DS4_TYPE_Q4_64A) return mm_rows_q4_64a(r, job, n_rows, err);
    const int64_t n_in = w->n_in, ys = job->y_stride, q8 = w->type == DS4_TYPE_Q8_0;
    const size_t xrow = q8 ? (size_t)(n_in / 32) * 34 : (size_t)(n_in / 256) * 292;
    uint8_t *const xq = q8 ? r->xq8 : r->xqk;
#ifdef K_HAS_MMA_KERNELS
    if (n_rows > K_MATVEC_MAX_ROWS && (r->gemm == 2 || (r->gemm == 3 && !q8)) &&
        (q8 ? K_MMA_GROUPS_Y((uint64_t)w->n_out) : K_MMA_KQ_GROUPS_Y((uint64_t)w->n_out)) <= 65535u) { /* int8 tensor cores (gemm_mma.h): the same bits */
        k_matvec_kq_params p = {K_TAG_OF(gemm_kq_mma), (uint32_t)w->type, (uint32_t)n_in, (uint32_t)w->n_out,
                                (uint32_t)n_rows, (uint32_t)ys};
        k_gemm_q8_0_mma_params p8 = {K_TAG_OF(gemm_q8_0_mma), (uint32_t)n_in, (uint32_t)w->n_out, (uint32_t)n_rows,
                                     (uint32_t)ys};
        k_binding b[] = {STATUS_BIND(gemm_kq_mma),
                         q8 ? K_BIND(gemm_q8_0_mma, p, &p8, sizeof p8) : K_BIND(gemm_kq_mma, p, &p, sizeof p),
                         K_BIND(gemm_kq_mma, w, w->p, w->bytes), K_BIND(gemm_kq_mma, xq, xq, (size_t)n_rows * xrow),
                         K_BIND(gemm_kq_mma, y, job->y, F4((n_rows - 1) * ys + w->n_out))};
        if (q8)
            return kr_launch(r, K_ID_gemm_q8_0_mma, K_MMA_GROUPS_X((uint32_t)n_rows), K_MMA_GROUPS_Y((uint32_t)w->n_out),
                             1, K_MMA_TG, b, 5, err);
        return kr_launch(r, K_ID_gemm_kq_mma, K_MMA_KQ_GROUPS_X((uint32_t)n_rows),
                         K_MMA_KQ_GROUPS_Y((uint32_t)w->n_out), 1, K_MMA_KQ_TG, b, 5, err);
    }
#endif
    if (n_rows > K_MATVEC_MAX_ROWS && r->gemm &&
        K_GEMM_GROUPS_Y((uint64_t)w->n_out) <= 65535u) {
        k_matvec_kq_params p = {K_TAG_OF(gemm_kq), (uint32_t)w->type, (uint32_t)n_in, (uint32_t)w->n_out,
                                (uint32_t)n_rows, (uint32_t)ys};
        k_gemm_q8_0_params p8 = {K_TAG_OF(gemm_q8_0), (uint32_t)n_in, (uint32_t)w->n_out, (uint32_t)n_rows,
                                 (uint32_t)ys};
        /* gemm_q8_0 and gemm_kq share the matvecs' tables: slots by name from either */
        k_binding b[] = {STATUS_BIND(gemm_kq), q8 ? K_BIND(gemm_q8_0, p, &p8, sizeof p8) : K_BIND(gemm_kq, p, &p, sizeof p),
                         K_BIND(gemm_kq, w, w->p, w->bytes), K_BIND(gemm_kq, xq, xq, (size_t)n_rows * xrow),
                         K_BIND(gemm_kq, y, job->y, F4((n_rows - 1) * ys + w->n_out))};
        return kr_launch(r, q8 ? K_ID_gemm_q8_0 : K_ID_gemm_kq, K_GEMM_GROUPS_X((uint32_t)n_rows),
                      K_GEMM_GROUPS_Y((uint32_t)w->n_out), 1, K_GEMM_TG, b, 5, err);
    }
    int rc = 0;
    for (int64_t r0 = 0; r0 < n_rows && !rc; r0 += K_MATVEC_MAX_ROWS) {
        const int64_t nr = n_rows - r0 < K_MATVEC_MAX_ROWS ? n_rows - r0 : K_MATVEC_MAX_ROWS;
        float *y = job->y + r0 * ys;
        const size_t ybytes = F4((nr - 1) * ys + w->n_out);
        if (q8) {
            k_matvec_q8_0_params p = {K_TAG_OF(matvec_q8_0), (uint32_t)n_in, (uint32_t)w->n_out, (uint32_t)nr,
                                      (uint32_t)ys};
            k_binding b[] = {STATUS_BIND(matvec_q8_0), K_BIND(matvec_q8_0, p, &p, sizeof p),
                             K_BIND(matvec_q8_0, w, w->p, w->bytes),
                             K_BIND(matvec_q8_0, xq, xq + r0 * xrow, (size_t)nr * xrow),
                             K_BIND(matvec_q8_0, y, y, ybytes)};
            rc = kr_launch(r, K_ID_matvec_q8_0, K_MATVEC_GROUPS((uint32_t)w->n_out, MATVEC_TG / 32), 1, 1,
                        MATVEC_TG, b, 5, err);
        } else {
            const int id = K_MATVEC_KQ_KERNEL((uint32_t)nr);
            k_matvec_kq_params p = {K_TAG((k_u32)id), (uint32_t)w->type, (uint32_t)n_in, (uint32_t)w->n_out,
                                    (uint32_t)nr, (uint32_t)ys};
            k_binding b[] = {STATUS_BIND(matvec_kq), K_BIND(matvec_kq, p, &p, sizeof p),
                             K_BIND(matvec_kq, w, w->p, w->bytes),
                             K_BIND(matvec_kq, xq, xq + r0 * xrow, (size_t)nr * xrow),
                             K_BIND(matvec_kq, y, y, ybytes)};
            rc = kr_launch(r, id, K_MATVEC_KQ_GROUPS((uint32_t)nr, (uint32_t)w->n_out, MATVEC_TG / 32), 1, 1,
                        MATVEC_TG, b, 5, err);
        }
    }
    return rc;
}

/* Quantize the activation rows once per activation type (quant_q8_0.h /
 * quant_kq.h) unless `ready` says a fused kernel already wrote them into
 * r->xq8 / r->xqk (K_NQ_Q8_0 / K_NQ_Q8_K), then each job over all rows
 * (mm_rows: the matvec or the prefill GEMM). */
int kr_matmul(k_runner *r, const float *x, int64_t x_stride, int64_t n_rows, const mm_job *jobs,
                  int n_jobs, unsigned ready, ds4_error *err) {
    const int64_t n_in = jobs[0].w->n_in;
    int have8 = (ready & K_NQ_Q8_0) != 0, havek = (ready & K_NQ_Q8_K) != 0, rc;
    for (int j = 0; j < n_jobs; j++) {
        const dev_mat *w = jobs[j].w;
        if (kr_act_flag(w) == K_NQ_Q8_0) { /* Q8_0 and Q4_64A weights */
            if (!have8) {
                k_quantize_q8_0_params p = {K_TAG_OF(quantize_q8_0), (uint32_t)n_in, (uint32_t)n_rows,
                                            (uint32_t)x_stride};
                const uint32_t blocks = (uint32_t)(n_rows * n_in / 32);
                k_binding b[] = {STATUS_BIND(quantize_q8_0), K_BIND(quantize_q8_0, p, &p, sizeof p),
                                 K_BIND(quantize_q8_0, x, x, F4((n_rows - 1) * x_stride + n_in)),
                                 K_BIND(quantize_q8_0, q, r->xq8, (size_t)blocks * 34)};
                if ((rc = kr_launch(r, K_ID_quantize_q8_0, (blocks + 3) / 4, 1, 1, 128, b, 4, err))) return rc;
                have8 = 1;
            }
        } else if (!havek) {
            k_quantize_q8_K_params p = {K_TAG_OF(quantize_q8_K), (uint32_t)n_in, (uint32_t)n_rows,
                                        (uint32_t)x_stride};
            const uint32_t blocks = (uint32_t)(n_rows * n_in / 256);
            k_binding b[] = {STATUS_BIND(quantize_q8_K), K_BIND(quantize_q8_K, p, &p, sizeof p),
                             K_BIND(quantize_q8_K, x, x, F4((n_rows - 1) * x_stride + n_in)),
                             K_BIND(quantize_q8_K, q, r->xqk, (size_t)blocks * 292)};
            if ((rc = kr_launch(r, K_ID_quantize_q8_K, (blocks + 3) / 4, 1, 1, 128, b, 4, err))) return rc;
            havek = 1;
        }
        if ((rc = mm_rows(r, &jobs[j], n_rows, err))) return rc;
    }
    return 0;
}

static int add_rows(k_runner *r, const float *x, float *y, int64_t n, ds4_error *err) {
    k_add_rows_params p = {K_TAG_OF(add_rows), (uint32_t)n};
    k_binding b[] = {STATUS_BIND(add_rows), K_BIND(add_rows, p, &p, sizeof p), K_BIND(add_rows, x, x, F4(n)),
                     K_BIND(add_rows, y, y, F4(n))};
    return kr_launch(r, K_ID_add_rows, (uint32_t)((n + 255) / 256), 1, 1, 256, b, 4, err);
}

/* Before a layer's matvecs (and the LM head): h += y over rows [row0, row0 +
 * n_rows) when `add`, x = rmsnorm(h) * w, x quantized to the activation
 * types in `want` — one norm_quant launch (fused.h; the quantized rows land
 * in r->xq8 / r->xqk, `*ready` says which; the float x is not stored:
 * only matvecs read it), or, unfused (K_RUNNER_FUSE=0, or a row wider than
 * K_NQ_MAX_N), add_rows + rmsnorm and *ready = 0 (the matvecs quantize).
 * Either way the same bits (gpu/tests/test_gpu_emul.c suite fused). */
int kr_pre_norm(k_runner *r, int add, int64_t row0, int64_t n_rows, const void *w, unsigned want,
                    unsigned *ready, ds4_error *err) {
    const int64_t E = r->c.n_embd;
    float *h = r->h + row0 * E, *y = r->y + row0 * E;
    *ready = 0;
    if (!r->fuse || E > K_NQ_MAX_N) {
        int rc = add ? add_rows(r, y, h, n_rows * E, err) : 0;
        return rc ? rc : kr_rmsnorm(r, h, w, r->x, E, n_rows, E, E, err);
    }
    k_norm_quant_params p = {K_TAG_OF(norm_quant), (uint32_t)E, (uint32_t)n_rows, (uint32_t)E, r->c.rms_eps,
                             (add ? K_NQ_ADD : 0u) | want};
    const size_t span = F4(n_rows * E);
    k_binding b[] = {STATUS_BIND(norm_quant), K_BIND(norm_quant, p, &p, sizeof p), K_BIND(norm_quant, y, y, span),
                     K_BIND(norm_quant, h, h, span), K_BIND(norm_quant, w, w, F4(E)),
                     K_BIND(norm_quant, x, r->x, F4(ROWS * E)), K_BIND(norm_quant, q8, r->xq8, r->xq8_bytes),
                     K_BIND(norm_quant, qk, r->xqk, r->xqk_bytes)};
    int rc = kr_launch(r, K_ID_norm_quant, (uint32_t)n_rows, 1, 1, kr_row_tg(E), b, 8, err);
    if (!rc) *ready = want;
    return rc;
}

/* --------------------------------------------------------- the mixers -- */

static int64_t conv_dim(const ds4_model_config *c) {
    return 2 * c->ssm_n_k * c->ssm_d_state + c->ssm_d_inner;
}

/* The half of a GDN layer's conv state that holds it now. */
static float *conv_now(const dev_state *S, const ds4_model_config *c) {
    return (float *)S->conv_state + (size_t)S->conv_cur * (size_t)((c->ssm_conv_kernel - 1) * conv_dim(c));
}

/* The gated norm of a split or three-launch run over o's raw rows
 * (gdn_norm), with the out projection's activation rows fused in where the
 * shape allows (gdn_norm_quant: a threadgroup of 256 = gdn_tg per 256
 * values; want: the out matrix's K_NQ_* type, 0 = none). *ready says which
 * quantized rows landed in r->xq8 / r->xqk (gdn_layer's kr_matmul then
 * skips its quantizer); the same bits either way (test_gpu_emul gdnnq). */
static int gdn_norm_launch(k_runner *r, const dev_layer *L, const float *in, int64_t n, float *o, unsigned want,
                           unsigned *ready, ds4_error *err) {
    const ds4_model_config *c = &r->c;
    const int64_t cd = conv_dim(c), vd = c->ssm_d_inner, nv = c->ssm_n_v, W = cd + vd + 2 * nv, d = c->ssm_d_state;
    *ready = 0;
    if (r->fuse && r->gdn_nq && want && r->gdn_tg == 256 && d % 32 == 0 && 256 % d == 0 && vd == nv * d &&
        vd % 256 == 0) {
        k_gdn_norm_quant_params p = {K_TAG_OF(gdn_norm_quant), (uint32_t)nv, (uint32_t)d, (uint32_t)n, (uint32_t)W,
                                     (uint32_t)cd, (uint32_t)vd, c->rms_eps, want};
        k_binding b[] = {STATUS_BIND(gdn_norm_quant), K_BIND(gdn_norm_quant, p, &p, sizeof p),
                         K_BIND(gdn_norm_quant, in, in, F4((n - 1) * W + cd + vd)),
                         K_BIND(gdn_norm_quant, hp, L->hp, F4(2 * nv + d)),
                         K_BIND(gdn_norm_quant, o, o, F4((n - 1) * vd + vd)),
                         K_BIND(gdn_norm_quant, q8, r->xq8, (want & K_NQ_Q8_0) ? (size_t)(n * vd / 32) * 34 : 1),
                         K_BIND(gdn_norm_quant, qk, r->xqk, (want & K_NQ_Q8_K) ? (size_t)(n * vd / 256) * 292 : 1)};
        int rc = kr_launch(r, K_ID_gdn_norm_quant, (uint32_t)(vd / 256), (uint32_t)n, 1, 256, b, 7, err);
        if (!rc) *ready = want;
        return rc;
    }
    k_gdn_norm_params pn = {K_TAG_OF(gdn_norm), (uint32_t)nv, (uint32_t)d, (uint32_t)n, (uint32_t)W, (uint32_t)cd,
                            (uint32_t)vd, c->rms_eps, 0u};
    k_binding bn[] = {STATUS_BIND(gdn_norm), K_BIND(gdn_norm, p, &pn, sizeof pn),
                      K_BIND(gdn_norm, in, in, F4((n - 1) * W + cd + vd)), K_BIND(gdn_norm, hp, L->hp, F4(2 * nv + d)),
                      K_BIND(gdn_norm, o, o, F4((n - 1) * vd + vd))};
    return kr_launch(r, K_ID_gdn_norm, (uint32_t)nv, (uint32_t)n, 1, r->gdn_tg, bn, 5, err);
}

/* n tokens of the recurrence in three launches (table.h gdn_prep /
 * gdn_rows, then gdn_norm): every token's conv, norms and gates at once,
 * then the state rows through the n tokens, then the gated norm; gdn_seq's
 * bits (test_gpu_emul gdnseq). The new conv state lands in the other half
 * of conv_state, as gdn_seq's. */
static int gdn_prep_rows(k_runner *r, const dev_layer *L, dev_state *S, const float *in, int64_t n, float *o,
                         unsigned want, unsigned *ready, ds4_error *err) {
    const ds4_model_config *c = &r->c;
    const int64_t cd = conv_dim(c), vd = c->ssm_d_inner, nv = c->ssm_n_v, nk = c->ssm_n_k, W = cd + vd + 2 * nv;
    const int64_t d = c->ssm_d_state, K = c->ssm_conv_kernel, qs = K_GDN_PQ_STRIDE(nk, nv, d);
    k_gdn_prep_params p = {K_TAG_OF(gdn_prep), (uint32_t)nk, (uint32_t)nv, (uint32_t)d, (uint32_t)K,
                           (uint32_t)n, (uint32_t)W, (uint32_t)cd, (uint32_t)(cd + vd), (uint32_t)vd,
                           (uint32_t)S->conv_cur, c->rms_eps, 0u};
    k_binding b[] = {STATUS_BIND(gdn_prep), K_BIND(gdn_prep, p, &p, sizeof p),
                     K_BIND(gdn_prep, in, in, F4((n - 1) * W + cd + vd + 2 * nv)),
                     K_BIND(gdn_prep, cw, L->conv_w, F4(cd * K)),
                     K_BIND(gdn_prep, conv, S->conv_state, F4(2 * (K - 1) * cd)),
                     K_BIND(gdn_prep, hp, L->hp, F4(2 * nv + d)), K_BIND(gdn_prep, pq, r->gpq, F4(n * qs))};
    int rc = kr_launch(r, K_ID_gdn_prep, (uint32_t)(nk + nv), (uint32_t)n, 1, r->gdn_tg, b, 7, err);
    if (rc) return rc;
    S->conv_cur ^= 1;
    k_gdn_rows_params pr = {K_TAG_OF(gdn_rows), (uint32_t)nk, (uint32_t)nv, (uint32_t)d, (uint32_t)n, (uint32_t)vd,
                            r->gdn_rows_r};
    k_binding br[] = {STATUS_BIND(gdn_rows), K_BIND(gdn_rows, p, &pr, sizeof pr),
                      K_BIND(gdn_rows, pq, r->gpq, F4(n * qs)), K_BIND(gdn_rows, s, S->ssm, F4(nv * d * d)),
                      K_BIND(gdn_rows, o, o, F4((n - 1) * vd + vd))};
    const uint32_t warps = K_GDN_ROWS_WARPS((uint32_t)nv, (uint32_t)d, r->gdn_rows_r);
    rc = kr_launch(r, K_ID_gdn_rows, (warps + 3u) / 4u, 1, 1, 128, br, 5, err);
    return rc ? rc : gdn_norm_launch(r, L, in, n, o, want, ready, err);
}

/* n tokens of the recurrence in ONE launch (gdn_seq, gdn.h): rows t < n of
 * `in` ([qkv | z | beta | alpha], W floats apart) into o (vd floats
 * apart); bit for bit n gdn_token calls at the same threadgroup size
 * (tested: test_gpu_emul gdnseq). The new conv state lands in the other
 * half of conv_state. */
static int gdn_seq(k_runner *r, const dev_layer *L, dev_state *S, const float *in, int64_t n, float *o,
                   unsigned want, unsigned *ready, ds4_error *err) {
    const ds4_model_config *c = &r->c;
    const int64_t cd = conv_dim(c), vd = c->ssm_d_inner, nv = c->ssm_n_v, W = cd + vd + 2 * nv;
    const int64_t d = c->ssm_d_state, K = c->ssm_conv_kernel;
    *ready = 0;
    if (r->gdn_rows_min > 0 && n >= r->gdn_rows_min && d <= 32 * K_GDN_SEQ_COLS)
        return gdn_prep_rows(r, L, S, in, n, o, want, ready, err); /* the same bits in three launches */
    /* split: G threadgroups per head (d / G rows each) for runs of at least
     * r->gdn_split_min tokens; a split that does not divide d is not taken */
    uint32_t G = n >= r->gdn_split_min ? r->gdn_split : 1u;
    if (G < 1u || d % G) G = 1u;
    k_gdn_seq_params p = {K_TAG_OF(gdn_seq), (uint32_t)c->ssm_n_k, (uint32_t)nv, (uint32_t)d, (uint32_t)K,
                          (uint32_t)n, (uint32_t)W, (uint32_t)cd, (uint32_t)(cd + vd), (uint32_t)vd,
                          (uint32_t)S->conv_cur, c->rms_eps, G};
    k_binding b[] = {STATUS_BIND(gdn_seq), K_BIND(gdn_seq, p, &p, sizeof p),
                     K_BIND(gdn_seq, in, in, F4((n - 1) * W + cd + vd + 2 * nv)),
                     K_BIND(gdn_seq, cw, L->conv_w, F4(cd * K)),
                     K_BIND(gdn_seq, conv, S->conv_state, F4(2 * (K - 1) * cd)),
                     K_BIND(gdn_seq, hp, L->hp, F4(2 * nv + d)), K_BIND(gdn_seq, s, S->ssm, F4(nv * d * d)),
                     K_BIND(gdn_seq, o, o, F4((n - 1) * vd + vd))};
    int rc = kr_launch(r, K_ID_gdn_seq, (uint32_t)nv * G, 1, 1, r->gdn_tg, b, 8, err);
    if (!rc) S->conv_cur ^= 1;
    if (!rc && G > 1u) /* the gated norm of every (head, token) over the raw rows */
        rc = gdn_norm_launch(r, L, in, n, o, want, ready, err);
    return rc;
}

/* One token of the recurrence for row t of qkv/z/ab: the conv (gdn_conv)
 * then the delta rule + gated norm (gdn_delta) into o. Eval and accept's
 * replay both run this, so a replayed row is the row it was. */
static int gdn_token(k_runner *r, const dev_layer *L, dev_state *S, const float *qkv, const float *z,
                     const float *ab, float *o, ds4_error *err) {
    const ds4_model_config *c = &r->c;
    const int64_t cd = conv_dim(c), vd = c->ssm_d_inner, nv = c->ssm_n_v;
    const int64_t d = c->ssm_d_state, K = c->ssm_conv_kernel;
    k_gdn_conv_params pc = {K_TAG_OF(gdn_conv), (uint32_t)cd, (uint32_t)K};
    k_binding bc[] = {STATUS_BIND(gdn_conv), K_BIND(gdn_conv, p, &pc, sizeof pc),
                      K_BIND(gdn_conv, x, qkv, F4(cd)), K_BIND(gdn_conv, cw, L->conv_w, F4(cd * K)),
                      K_BIND(gdn_conv, state, conv_now(S, c), F4((K - 1) * cd)),
                      K_BIND(gdn_conv, out, r->cv, F4(cd))};
    int rc = kr_launch(r, K_ID_gdn_conv, (uint32_t)((cd + 127) / 128), 1, 1, 128, bc, 6, err);
    if (rc) return rc;
    k_gdn_delta_params pd = {K_TAG_OF(gdn_delta), (uint32_t)c->ssm_n_k, (uint32_t)nv, (uint32_t)d, c->rms_eps};
    k_binding bd[] = {STATUS_BIND(gdn_delta), K_BIND(gdn_delta, p, &pd, sizeof pd),
                      K_BIND(gdn_delta, cv, r->cv, F4(cd)), K_BIND(gdn_delta, z, z, F4(vd)),
                      K_BIND(gdn_delta, ab, ab, F4(2 * nv)), K_BIND(gdn_delta, hp, L->hp, F4(2 * nv + d)),
                      K_BIND(gdn_delta, s, S->ssm, F4(nv * d * d)), K_BIND(gdn_delta, o, o, F4(vd))};
    return kr_launch(r, K_ID_gdn_delta, (uint32_t)nv, 1, 1, r->gdn_tg, bd, 8, err);
}

int kr_copy_dev(k_runner *r, void *dst, const void *src, size_t bytes, ds4_error *err) {
    if (r->dev->copy(r->dev, dst, src, bytes))
        return ds4_fail(err, DS4_ERR_INTERNAL, "%s copy: %s", r->dev->name, r->dev->err);
    return 0;
}

/* gdn.c ds4_gdn_layer: the four projections, then the conv and the delta
 * rule of all n tokens (one gdn_seq launch; unfused: gdn_token per token),
 * then ssm_out. The projections write one row per
 * token, [qkv (cd) | z (vd) | beta (nv) | alpha (nv)] (W = cd + vd + 2 nv
 * floats: fused, one launch per run of one type (gdn_in, upload_group),
 * else four launches into the same places). In a verify the rows are kept
 * (row0: where this chunk's rows start among the verify's). */
static int gdn_layer(k_runner *r, dev_layer *L, dev_state *S, int64_t n, int64_t row0, unsigned ready,
                     ds4_error *err) {
    const ds4_model_config *c = &r->c;
    const int64_t E = c->n_embd, cd = conv_dim(c), vd = c->ssm_d_inner, nv = c->ssm_n_v, W = cd + vd + 2 * nv;
    mm_job in[4] = {{&L->qkv, r->gin, W}, {&L->gate, r->gin + cd, W}, {&L->beta, r->gin + cd + vd, W},
                    {&L->alpha, r->gin + cd + vd + nv, W}};
    mm_job runs[4];
    for (int i = 0; i < L->n_gdn_in; i++) runs[i] = (mm_job){&L->gdn_in[i].m, in[L->gdn_in[i].first].y, W};
    int rc = r->fuse ? kr_matmul(r, r->x, E, n, runs, L->n_gdn_in, ready, err) : kr_matmul(r, r->x, E, n, in, 4, ready, err);
    if (!rc && r->capturing) rc = kr_copy_dev(r, S->cap_in + row0 * W, r->gin, F4(n * W), err);
    unsigned oready = 0; /* the out projection's activation rows, when the norm wrote them */
    if (!rc && r->fuse) /* all n tokens, one launch (+ the norm's when split) */
        rc = gdn_seq(r, L, S, r->gin, n, r->o, kr_act_flag(&L->ssm_out), &oready, err);
    for (int64_t t = 0; t < n && !rc && !r->fuse; t++)
        rc = gdn_token(r, L, S, r->gin + t * W, r->gin + t * W + cd, r->gin + t * W + cd + vd, r->o + t * vd, err);
    if (rc) return rc;
    mm_job out = {&L->ssm_out, r->y, E};
    return kr_matmul(r, r->o, vd, n, &out, 1, oready, err);
}

/* attention.c ds4_attn_block: q (+ gate), k, v projections; per-head
 * RMSNorm of q and k; RoPE; the new K/V rows into the F16 pages; split-K
 * attention over positions [0, pos0 + t]; the sigmoid output gate; the
 * output projection. */
int kr_attn_layer(k_runner *r, dev_layer *L, dev_state *S, int64_t n, int64_t pos0, unsigned ready, int kv_only,
                  ds4_error *err) {
    const ds4_model_config *c = &r->c;
    const int64_t E = c->n_embd, dh = c->head_dim, nh = c->n_head, nkv = c->n_head_kv;
    const int64_t qf_dim = 2 * nh * dh, kv_dim = nkv * dh, half = c->n_rot / 2;
    /* q (+ gate), k and v rows in their own buffers; fused decode (one
     * row): side by side in one row [q | k | v] of arow, so each run of
     * one type (upload_group) is one launch (strides never multiply a
     * single row, so every consumer below reads the same places) */
    float *qf = r->qf, *kraw = r->kraw, *vv = r->vv;
    int rc;
    if (r->fuse && n == 1) {
        qf = r->arow, kraw = r->arow + qf_dim, vv = r->arow + qf_dim + kv_dim;
        float *const y0[3] = {qf, kraw, vv};
        mm_job runs[3];
        for (int i = 0; i < L->n_attn_in; i++)
            runs[i] = (mm_job){&L->attn_in[i].m, y0[L->attn_in[i].first], qf_dim + 2 * kv_dim};
        if ((rc = kr_matmul(r, r->x, E, n, runs, L->n_attn_in, ready, err))) return rc;
    } else {
        mm_job in[3] = {{&L->q, qf, qf_dim}, {&L->k, kraw, kv_dim}, {&L->v, vv, kv_dim}};
        if ((rc = kr_matmul(r, r->x, E, n, in, 3, ready, err))) return rc;
    }
    /* q heads sit 2*dh apart in qf (each followed by its gate). Fused:
     * normed and rotated in place (qk_norm_rope, fused.h: the bits of the
     * unfused launches); else normed into qn / kn, then rotated there. */
    float *qn = r->qn, *kn = r->kn;
    if (r->fuse) {
        qn = qf, kn = kraw;
        k_qk_norm_rope_params p = {K_TAG_OF(qk_norm_rope), (uint32_t)n, (uint32_t)nh, (uint32_t)nkv, (uint32_t)dh,
                                   (uint32_t)c->n_rot, (uint32_t)qf_dim, (uint32_t)(2 * dh), (uint32_t)kv_dim,
                                   c->rms_eps};
        k_binding b[] = {STATUS_BIND(qk_norm_rope), K_BIND(qk_norm_rope, p, &p, sizeof p),
                         K_BIND(qk_norm_rope, q, qf, F4(n * qf_dim)), K_BIND(qk_norm_rope, k, kraw, F4(n * kv_dim)),
                         K_BIND(qk_norm_rope, w, L->q_norm, F4(2 * dh)),
                         K_BIND(qk_norm_rope, cs, r->cs, F4(half > 0 ? n * half : 1)),
                         K_BIND(qk_norm_rope, sn, r->sn, F4(half > 0 ? n * half : 1))};
        if ((rc = kr_launch(r, K_ID_qk_norm_rope, (uint32_t)(nh + nkv), (uint32_t)n, 1, kr_row_tg(dh), b, 7, err))) return rc;
    } else {
        if ((rc = kr_rmsnorm(r, qf, L->q_norm, r->qn, dh, n * nh, 2 * dh, 2 * dh, err)) ||
            (rc = kr_rmsnorm(r, kraw, L->k_norm, r->kn, dh, n * nkv, dh, dh, err)))
            return rc;
        for (int pass = 0; pass < 2 && half > 0; pass++) {
            float *xr = pass ? r->kn : r->qn;
            const int64_t heads = pass ? nkv : nh, hs = pass ? dh : 2 * dh, rs = pass ? kv_dim : qf_dim;
            k_rope_neox_params p = {K_TAG_OF(rope_neox), (uint32_t)n, (uint32_t)heads, (uint32_t)dh,
                                    (uint32_t)c->n_rot, (uint32_t)rs, (uint32_t)hs};
            const uint64_t items = (uint64_t)(n * heads * half);
            k_binding b[] = {STATUS_BIND(rope_neox), K_BIND(rope_neox, p, &p, sizeof p),
                             K_BIND(rope_neox, x, xr, F4((n - 1) * rs + (heads - 1) * hs + dh)),
                             K_BIND(rope_neox, cs, r->cs, F4(n * half)), K_BIND(rope_neox, sn, r->sn, F4(n * half))};
            if ((rc = kr_launch(r, K_ID_rope_neox, (uint32_t)((items + 63) / 64), 1, 1, 64, b, 5, err))) return rc;
        }
    }
    const size_t pool = (size_t)r->n_pages * (size_t)nkv * K_ATTN_BLOCK * (size_t)dh * 2;
    {
        k_kv_store_params p = {K_TAG_OF(kv_store), (uint32_t)n, (uint32_t)pos0, (uint32_t)nkv, (uint32_t)dh,
                               (uint32_t)kv_dim, (uint32_t)r->n_pages};
        const uint64_t items = (uint64_t)(n * kv_dim);
        k_binding b[] = {STATUS_BIND(kv_store), K_BIND(kv_store, p, &p, sizeof p),
                         K_BIND(kv_store, k, kn, F4(n * kv_dim)), K_BIND(kv_store, v, vv, F4(n * kv_dim)),
                         K_BIND(kv_store, pages, r->pages, 4 * (size_t)r->n_pages),
                         K_BIND(kv_store, kpool, S->kpool, pool), K_BIND(kv_store, vpool, S->vpool, pool)};
        if ((rc = kr_launch(r, K_ID_kv_store, (uint32_t)((items + 127) / 128), 1, 1, 128, b, 7, err))) return rc;
    }
    if (kv_only) return 0; /* the nextn head's priming: a row's K/V need nothing below */
    /* split-K attention, r->attn_rows query rows per launch pair (a row's
     * result never depends on its batch: attn.h), so the partials buffer
     * stays attn_rows x context whatever the chunk */
    for (int64_t t0 = 0; t0 < n; t0 += r->attn_rows) {
        const int64_t an = n - t0 < r->attn_rows ? n - t0 : r->attn_rows, apos = pos0 + t0;
        const float *aq = qn + t0 * qf_dim;
        const uint32_t nb = (uint32_t)((apos + an + K_ATTN_BLOCK - 1) / K_ATTN_BLOCK);
        const uint32_t G = (uint32_t)(nh / nkv);
        /* chunks of K_ATTN_WIDE_MIN+ rows: attn_partials_wide (the same
         * partials), r->attn_wide query vectors a threadgroup */
        const int wide = r->attn_wide && an >= K_ATTN_WIDE_MIN && dh % 4 == 0 && G <= r->attn_wide;
        /* query rows per threadgroup: as many as K_ATTN_MAX_QV query vectors
         * allow (each K/V tile then serves them all); K_RUNNER_ATTN_RG fixes it */
        uint32_t rg = wide ? r->attn_wide / G : G <= K_ATTN_MAX_QV ? K_ATTN_MAX_QV / G : 1u;
        if (!wide && r->attn_rg && r->attn_rg * G <= K_ATTN_MAX_QV) rg = r->attn_rg;
        if (rg > (uint32_t)an) rg = (uint32_t)an;
        const uint32_t ng = ((uint32_t)an + rg - 1u) / rg;
        const uint32_t bps = k_attn_blocks_per_split(nb, (uint32_t)nkv, ng, ATTN_TARGET_GROUPS);
        const uint32_t ns = k_attn_n_splits(nb, bps);
        uint32_t hs = k_attn_head_split(G, (uint32_t)nkv * ns * ng, K_ATTN_HEAD_SPLIT_GROUPS);
        if (r->attn_hs && G % r->attn_hs == 0) hs = r->attn_hs;
        if (wide) hs = 1;
        const size_t part = F4((size_t)an * nh * nb * (2 + dh));
        k_attn_partials_params pp = {wide ? K_TAG_OF(attn_partials_wide) : K_TAG_OF(attn_partials),
                                     (uint32_t)nh, (uint32_t)nkv, (uint32_t)dh,
                                     (uint32_t)an, (uint32_t)apos, nb, bps, (uint32_t)r->n_pages,
                                     (uint32_t)qf_dim, (uint32_t)(2 * dh), c->attn_scale, hs, rg};
        k_binding bp[] = {STATUS_BIND(attn_partials), K_BIND(attn_partials, p, &pp, sizeof pp),
                          K_BIND(attn_partials, q, aq, F4((an - 1) * qf_dim + (nh - 1) * 2 * dh + dh)),
                          K_BIND(attn_partials, kpool, S->kpool, pool), K_BIND(attn_partials, vpool, S->vpool, pool),
                          K_BIND(attn_partials, pages, r->pages, 4 * (size_t)nb),
                          K_BIND(attn_partials, part, r->part, part)};
        /* r->attn_tg threads (K_ATTN_TG on CUDA): at short contexts only a
         * few threadgroups exist, so each needs its own latency hiding (no
         * effect on the bits: attn.h's work is placed by position) */
        if ((rc = wide ? kr_launch(r, K_ID_attn_partials_wide, (uint32_t)nkv, ns, ng, K_ATTN_WIDE_TG, bp, 7, err)
                       : kr_launch(r, K_ID_attn_partials, (uint32_t)nkv * hs, ns, ng, r->attn_tg, bp, 7, err)))
            return rc;
        k_attn_merge_params pm = {K_TAG_OF(attn_merge), (uint32_t)nh, (uint32_t)dh, (uint32_t)an, (uint32_t)apos,
                                  nb, (uint32_t)(nh * dh)};
        k_binding bm[] = {STATUS_BIND(attn_merge), K_BIND(attn_merge, p, &pm, sizeof pm),
                          K_BIND(attn_merge, part, r->part, part),
                          K_BIND(attn_merge, out, r->attn + t0 * nh * dh, F4(an * nh * dh))};
        if ((rc = kr_launch(r, K_ID_attn_merge, (uint32_t)nh, (uint32_t)an, 1, k_attn_merge_threads((uint32_t)dh), bm, 4, err))) return rc;
    }
    mm_job out = {&L->o, r->y, E};
    if (r->fuse) { /* the output gate and the o projection's quantizer in one launch (attn_gate_quant) */
        const unsigned q = kr_act_flag(&L->o);
        k_attn_gate_quant_params p = {K_TAG_OF(attn_gate_quant), (uint32_t)n, (uint32_t)nh, (uint32_t)dh,
                                      (uint32_t)qf_dim, q | fused_units(n)};
        k_binding b[] = {STATUS_BIND(attn_gate_quant), K_BIND(attn_gate_quant, p, &p, sizeof p),
                         K_BIND(attn_gate_quant, qf, qf, F4(n * qf_dim)),
                         K_BIND(attn_gate_quant, a, r->attn, F4(n * nh * dh)),
                         K_BIND(attn_gate_quant, q8, r->xq8, r->xq8_bytes),
                         K_BIND(attn_gate_quant, qk, r->xqk, r->xqk_bytes)};
        if ((rc = kr_launch(r, K_ID_attn_gate_quant, (K_ATTN_GATE_QUANT_UNITS(p) + 3) / 4, 1, 1, 128, b, 6, err)))
            return rc;
        return kr_matmul(r, NULL, nh * dh, n, &out, 1, q, err);
    }
    k_attn_gate_params pg = {K_TAG_OF(attn_gate), (uint32_t)n, (uint32_t)nh, (uint32_t)dh, (uint32_t)qf_dim};
    k_binding bg[] = {STATUS_BIND(attn_gate), K_BIND(attn_gate, p, &pg, sizeof pg),
                      K_BIND(attn_gate, qf, qf, F4(n * qf_dim)), K_BIND(attn_gate, a, r->attn, F4(n * nh * dh))};
    if ((rc = kr_launch(r, K_ID_attn_gate, (uint32_t)((n * nh * dh + 127) / 128), 1, 1, 128, bg, 4, err)))
        return rc;
    return kr_matmul(r, r->attn, nh * dh, n, &out, 1, 0, err);
}

/* ffn.c ds4_ffn_dense: down(SiLU(gate x) * up x). Fused: gate and up
 * write one row [g | u] per token (one launch of the concatenated ffn_in
 * when their types agree, else two into the same places), and swiglu_quant (fused.h) computes the
 * SwiGLU and quantizes it for the down projection: the bits of swiglu +
 * quantize; the float rows are not stored. */
int kr_ffn_layer(k_runner *r, dev_layer *L, int64_t n, unsigned ready, ds4_error *err) {
    const int64_t E = r->c.n_embd, F = r->c.n_ff;
    mm_job out = {&L->ffn_down, r->y, E};
    int rc;
    if (r->fuse) {
        mm_job in[2] = {{&L->ffn_gate, r->gu, 2 * F}, {&L->ffn_up, r->gu + F, 2 * F}};
        mm_job runs[2];
        for (int i = 0; i < L->n_ffn_in; i++) runs[i] = (mm_job){&L->ffn_in[i].m, in[L->ffn_in[i].first].y, 2 * F};
        if ((rc = kr_matmul(r, r->x, E, n, runs, L->n_ffn_in, ready, err))) return rc;
        const unsigned q = kr_act_flag(&L->ffn_down);
        k_swiglu_quant_params p = {K_TAG_OF(swiglu_quant), (uint32_t)F, (uint32_t)n, (uint32_t)(2 * F), (uint32_t)F,
                                   q | fused_units(n)};
        k_binding b[] = {STATUS_BIND(swiglu_quant), K_BIND(swiglu_quant, p, &p, sizeof p),
                         K_BIND(swiglu_quant, gu, r->gu, F4(n * 2 * F)),
                         K_BIND(swiglu_quant, q8, r->xq8, r->xq8_bytes), K_BIND(swiglu_quant, qk, r->xqk, r->xqk_bytes)};
        /* 4 SIMD-groups a threadgroup, one per unit (no effect on the bits) */
        if ((rc = kr_launch(r, K_ID_swiglu_quant, (K_SWIGLU_QUANT_UNITS(p) + 3) / 4, 1, 1, 128, b, 5, err))) return rc;
        return kr_matmul(r, NULL, F, n, &out, 1, q, err);
    }
    mm_job in[2] = {{&L->ffn_gate, r->g, F}, {&L->ffn_up, r->u, F}};
    if ((rc = kr_matmul(r, r->x, E, n, in, 2, ready, err))) return rc;
    k_swiglu_params p = {K_TAG_OF(swiglu), (uint32_t)(n * F)};
    k_binding b[] = {STATUS_BIND(swiglu), K_BIND(swiglu, p, &p, sizeof p), K_BIND(swiglu, up, r->u, F4(n * F)),
                     K_BIND(swiglu, gate, r->g, F4(n * F))};
    if ((rc = kr_launch(r, K_ID_swiglu, (uint32_t)((n * F + 255) / 256), 1, 1, 256, b, 4, err))) return rc;
    return kr_matmul(r, r->g, F, n, &out, 1, 0, err);
}

/* ------------------------------------------------------- routed MoE -- */

/* Rows of n values (x_stride floats apart) quantized for weights of type
 * wtype (Q8_0 blocks for Q8_0, Q8_K for the K-quants) into q: the
 * quantize kernels matmul runs, so the CPU quantizers' bits. */
static int moe_quant(k_runner *r, const float *x, int64_t x_stride, int64_t n, int64_t rows, uint32_t wtype,
                     uint8_t *q, size_t q_bytes, ds4_error *err) {
    const size_t xs = F4((rows - 1) * x_stride + n);
    if (wtype == K_TYPE_Q8_0) {
        k_quantize_q8_0_params p = {K_TAG_OF(quantize_q8_0), (uint32_t)n, (uint32_t)rows, (uint32_t)x_stride};
        const uint32_t blocks = (uint32_t)(rows * n / 32);
        k_binding b[] = {STATUS_BIND(quantize_q8_0), K_BIND(quantize_q8_0, p, &p, sizeof p),
                         K_BIND(quantize_q8_0, x, x, xs), K_BIND(quantize_q8_0, q, q, q_bytes)};
        return kr_launch(r, K_ID_quantize_q8_0, (blocks + 3) / 4, 1, 1, 128, b, 4, err);
    }
    k_quantize_q8_K_params p = {K_TAG_OF(quantize_q8_K), (uint32_t)n, (uint32_t)rows, (uint32_t)x_stride};
    const uint32_t blocks = (uint32_t)(rows * n / 256);
    k_binding b[] = {STATUS_BIND(quantize_q8_K), K_BIND(quantize_q8_K, p, &p, sizeof p),
                     K_BIND(quantize_q8_K, x, x, xs), K_BIND(quantize_q8_K, q, q, q_bytes)};
    return kr_launch(r, K_ID_quantize_q8_K, (blocks + 3) / 4, 1, 1, 128, b, 4, err);
}

/* Whether moe_grouped can serve n rows of this layer: its scratch, the
 * sort's capacity and what kr_open_moe found (dev_moe.group_ok). */
static int moe_grouped_ok(const k_runner *r, const dev_moe *M, int64_t n) {
    return r->moe_gu && M->group_ok && n * r->c.n_expert_used <= (int64_t)K_MOE_GROUP_MAX_PAIRS;
}

/* The routed MoE after moe_route for a prefill chunk, grouped by expert
 * (gpu/kernels/moe_gemm.h): moe_group, moe_gemm over gate and up into [g |
 * u] rows per pair, swiglu_quant into moe_down's quantized layout, moe_gemm
 * over down, moe_combine into y. Every value is the per-pair path's
 * (moe_gate_up, the quantizers, moe_down) bit for bit; each expert's
 * weights are read once per tile of up to K_GEMM_TR of its pairs (moe_gemm)
 * or K_MMA_KQ_TR (moe_gemm_mma: int8 tensor cores, where the device has them,
 * every matrix of the layer is a K-quant and K_RUNNER_GEMM is not dp4a)
 * instead of once per pair. */
static int moe_grouped(k_runner *r, const dev_moe *M, int64_t n, ds4_error *err) {
    const ds4_model_config *c = &r->c;
    const int64_t E = c->n_embd, ne = c->n_expert, k = c->n_expert_used, F = c->n_ff_exp, Fs = M->n_ff_sh;
    const int64_t nf = F > Fs ? F : Fs, nk = n * k, pairs = nk + (Fs ? n : 0);
    uint32_t gemm_id = K_ID_moe_gemm, TR = K_GEMM_TR, tile_rows = K_GEMM_NSG * K_GEMM_TOS, TG = K_GEMM_TG;
#ifdef K_HAS_MMA_KERNELS
    if (r->gemm >= 2 && M->all_kq) gemm_id = K_ID_moe_gemm_mma, TR = K_MMA_KQ_TR, tile_rows = K_MMA_KQ_WR, TG = K_MMA_KQ_TG;
#endif
    const uint32_t T = K_MOE_GROUP_TILES((uint32_t)n, (uint32_t)k, (uint32_t)ne, Fs ? 1u : 0u, TR);
    int rc;
    {
        k_moe_group_params p = {K_TAG_OF(moe_group), (uint32_t)n, (uint32_t)k, (uint32_t)ne, Fs ? 1u : 0u, T, TR};
        k_binding b[] = {STATUS_BIND(moe_group), K_BIND(moe_group, p, &p, sizeof p),
                         K_BIND(moe_group, sel, r->moe_sel, 4 * (size_t)nk),
                         K_BIND(moe_group, order, r->moe_order, 4 * (size_t)pairs),
                         K_BIND(moe_group, tiles, r->moe_tiles, 8 * (size_t)T)};
        if ((rc = kr_launch(r, K_ID_moe_group, 1, 1, 1, K_MOE_GROUP_TG, b, 5, err))) return rc;
    }
    {
        k_moe_gemm_params p = {K_TAG(gemm_id), (uint32_t)n, (uint32_t)k, (uint32_t)ne, T, 0, (uint32_t)E,
                               (uint32_t)E, (uint32_t)F, (uint32_t)Fs, M->t_gate, M->t_up, M->t_sgate, M->t_sup,
                               0, M->g_estride, M->up0, M->u_estride, M->sg_base, M->su_base,
                               (uint32_t)(2 * nf), (uint32_t)nf};
        k_binding b[] = {STATUS_BIND(moe_gemm), K_BIND(moe_gemm, p, &p, sizeof p),
                         K_BIND(moe_gemm, tiles, r->moe_tiles, 8 * (size_t)T),
                         K_BIND(moe_gemm, order, r->moe_order, 4 * (size_t)pairs),
                         K_BIND(moe_gemm, xq8, r->xq8, r->xq8_bytes), K_BIND(moe_gemm, xqk, r->xqk, r->xqk_bytes),
                         K_BIND(moe_gemm, w, M->wgu, M->gu_bytes),
                         K_BIND(moe_gemm, y, r->moe_gu, F4(pairs * 2 * nf))};
        if ((rc = kr_launch(r, gemm_id, T, (uint32_t)((nf + tile_rows - 1) / tile_rows), 2, TG, b, 8, err)))
            return rc;
    }
    /* SiLU(g) * u quantized for the down types: the routed pairs' rows,
     * then the shared rows after n k rows of the shared down's type */
    for (int part = 0; part < (Fs ? 2 : 1); part++) {
        const uint32_t td = part ? M->t_sdown : M->t_down, fl = td == K_TYPE_Q8_0 ? K_NQ_Q8_0 : K_NQ_Q8_K;
        const int64_t nn = part ? Fs : F, rows = part ? n : nk;
        const size_t qoff = part ? (size_t)nk * K_MOE_ACT_BYTES(td, (uint32_t)F) : 0;
        k_swiglu_quant_params p = {K_TAG_OF(swiglu_quant), (uint32_t)nn, (uint32_t)rows, (uint32_t)(2 * nf),
                                   (uint32_t)nf, fl | fused_units(rows)};
        k_binding b[] = {STATUS_BIND(swiglu_quant), K_BIND(swiglu_quant, p, &p, sizeof p),
                         K_BIND(swiglu_quant, gu, r->moe_gu + (part ? nk * 2 * nf : 0), F4(rows * 2 * nf)),
                         K_BIND(swiglu_quant, q8, r->moe_hq8 + (fl == K_NQ_Q8_0 ? qoff : 0),
                                fl == K_NQ_Q8_0 ? r->moe_hq8_bytes - qoff : r->moe_hq8_bytes),
                         K_BIND(swiglu_quant, qk, r->moe_hqk + (fl == K_NQ_Q8_K ? qoff : 0),
                                fl == K_NQ_Q8_K ? r->moe_hqk_bytes - qoff : r->moe_hqk_bytes)};
        if ((rc = kr_launch(r, K_ID_swiglu_quant, (K_SWIGLU_QUANT_UNITS(p) + 3) / 4, 1, 1, 128, b, 5, err))) return rc;
    }
    {
        k_moe_gemm_params p = {K_TAG(gemm_id), (uint32_t)n, (uint32_t)k, (uint32_t)ne, T, 1, (uint32_t)F,
                               (uint32_t)Fs, (uint32_t)E, Fs ? (uint32_t)E : 0u, M->t_down, M->t_down, M->t_sdown,
                               M->t_sdown, 0, M->d_estride, 0, 0, M->sd_base,
                               0, (uint32_t)E, 0};
        k_binding b[] = {STATUS_BIND(moe_gemm), K_BIND(moe_gemm, p, &p, sizeof p),
                         K_BIND(moe_gemm, tiles, r->moe_tiles, 8 * (size_t)T),
                         K_BIND(moe_gemm, order, r->moe_order, 4 * (size_t)pairs),
                         K_BIND(moe_gemm, xq8, r->moe_hq8, r->moe_hq8_bytes),
                         K_BIND(moe_gemm, xqk, r->moe_hqk, r->moe_hqk_bytes), K_BIND(moe_gemm, w, M->wdn, M->dn_bytes),
                         K_BIND(moe_gemm, y, r->moe_dn, F4(pairs * E))};
        if ((rc = kr_launch(r, gemm_id, T, (uint32_t)((E + tile_rows - 1) / tile_rows), 1, TG, b, 8, err)))
            return rc;
    }
    k_moe_combine_params p = {K_TAG_OF(moe_combine), (uint32_t)n, (uint32_t)k, (uint32_t)E, Fs ? 1u : 0u,
                              (uint32_t)E, (uint32_t)E};
    k_binding b[] = {STATUS_BIND(moe_combine), K_BIND(moe_combine, p, &p, sizeof p),
                     K_BIND(moe_combine, wt, r->moe_wt, F4(n * (k + 1))),
                     K_BIND(moe_combine, dn, r->moe_dn, F4(pairs * E)), K_BIND(moe_combine, out, r->y, F4(n * E))};
    return kr_launch(r, K_ID_moe_combine, (uint32_t)((E + 255) / 256), (uint32_t)n, 1, 256, b, 5, err);
}

/* moe.c ds4_ffn_moe on the device (gpu/kernels/moe.h): the router logits
 * (moe_logits, F32 x F32 over the float rows x), softmax + top-k +
 * renormalisation (moe_route), the chosen experts' gate/up + SwiGLU and the
 * shared expert's (moe_gate_up: expert ids read on the device, only their
 * rows read), the SwiGLU rows quantized for the down types, then the down
 * projections weighted and summed in slot order + the gated shared expert
 * (moe_down) into y. Decode: 5 launches (+ x's quantizers when norm_quant
 * did not write them: the unfused path). */
int kr_moe_layer(k_runner *r, dev_layer *L, int64_t n, unsigned ready, ds4_error *err) {
    const ds4_model_config *c = &r->c;
    const dev_moe *M = &L->moe;
    const int64_t E = c->n_embd, ne = c->n_expert, k = c->n_expert_used, F = c->n_ff_exp, Fs = M->n_ff_sh;
    const int64_t nf = F > Fs ? F : Fs, pairs = n * k + (Fs ? n : 0);
    const int grouped = n >= r->moe_group_min && moe_grouped_ok(r, M, n);
    int rc;
    if ((M->want & K_NQ_Q8_0) && !(ready & K_NQ_Q8_0) &&
        (rc = moe_quant(r, r->x, E, E, n, K_TYPE_Q8_0, r->xq8, r->xq8_bytes, err)))
        return rc;
    if ((M->want & K_NQ_Q8_K) && !(ready & K_NQ_Q8_K) &&
        (rc = moe_quant(r, r->x, E, E, n, K_TYPE_Q4_K, r->xqk, r->xqk_bytes, err)))
        return rc;
    const int64_t nl = ne + M->shgate, ls = ne + 1;
    {
        /* one threadgroup per router row, K_MOE_LOGITS_SPLIT SIMD-groups
         * splitting it (gpu/kernels/moe.h): the same split for every width,
         * so a row's logits never depend on how many token rows share it.
         * Chunks of K_MOE_LOGITS_WIDE_MIN+ rows take moe_logits_wide (at
         * splits up to K_MOE_LOGITS_WIDE_MAX_SPLIT): the same bits, a row of
         * x read once per K_MOE_LOGITS_WIDE_O router rows (its argument
         * slots are moe_logits', table.h). H100, the 35B-A3B-like MoE,
         * against the build before (session 32, 3 repetitions): prefill
         * 3815-3839 -> 4084-4109 tok/s at 512, 3479-3482 -> 3689-3695 at
         * 4096. */
        const int wide = r->moe_lw && n >= K_MOE_LOGITS_WIDE_MIN && r->moe_split <= K_MOE_LOGITS_WIDE_MAX_SPLIT;
        k_moe_logits_params p = {wide ? K_TAG_OF(moe_logits_wide) : K_TAG_OF(moe_logits), (uint32_t)E,
                                 (uint32_t)nl, (uint32_t)n, (uint32_t)E, (uint32_t)ls};
        k_binding b[] = {STATUS_BIND(moe_logits), K_BIND(moe_logits, p, &p, sizeof p),
                         K_BIND(moe_logits, w, M->router, F4(nl * E)), K_BIND(moe_logits, x, r->x, F4(n * E)),
                         K_BIND(moe_logits, y, r->moe_logits, F4(n * ls))};
        if (wide)
            rc = kr_launch(r, K_ID_moe_logits_wide, (uint32_t)((nl + K_MOE_LOGITS_WIDE_O - 1) / K_MOE_LOGITS_WIDE_O),
                           (uint32_t)((n + K_MOE_LOGITS_WIDE_ROWS - 1) / K_MOE_LOGITS_WIDE_ROWS), 1,
                           32u * r->moe_split, b, 5, err);
        else
            rc = kr_launch(r, K_ID_moe_logits, (uint32_t)nl, 1, 1, 32u * r->moe_split, b, 5, err);
        if (rc) return rc;
    }
    {
        k_moe_route_params p = {K_TAG_OF(moe_route), (uint32_t)ne, (uint32_t)k, (uint32_t)n, (uint32_t)ls,
                                M->shgate ? K_MOE_SHGATE : 0u};
        k_binding b[] = {STATUS_BIND(moe_route), K_BIND(moe_route, p, &p, sizeof p),
                         K_BIND(moe_route, logits, r->moe_logits, F4(n * ls)),
                         K_BIND(moe_route, sel, r->moe_sel, 4 * (size_t)(n * k)),
                         K_BIND(moe_route, wt, r->moe_wt, F4(n * (k + 1)))};
        if ((rc = kr_launch(r, K_ID_moe_route, (uint32_t)((n + 3) / 4), 1, 1, 128, b, 5, err))) return rc;
    }
    if (grouped) return moe_grouped(r, M, n, err); /* prefill chunks */
    {
        k_moe_gate_up_params p = {K_TAG_OF(moe_gate_up), (uint32_t)E, (uint32_t)F, (uint32_t)Fs, (uint32_t)k,
                                  (uint32_t)n, (uint32_t)ne, M->t_gate, M->t_up, M->t_sgate, M->t_sup,
                                  M->g_estride, M->u_base, M->u_estride, M->u_row0, M->sg_base, M->su_base,
                                  (uint32_t)nf};
        k_binding b[] = {STATUS_BIND(moe_gate_up), K_BIND(moe_gate_up, p, &p, sizeof p),
                         K_BIND(moe_gate_up, sel, r->moe_sel, 4 * (size_t)(n * k)),
                         K_BIND(moe_gate_up, xq8, r->xq8, r->xq8_bytes), K_BIND(moe_gate_up, xqk, r->xqk, r->xqk_bytes),
                         K_BIND(moe_gate_up, w, M->wgu, M->gu_bytes),
                         K_BIND(moe_gate_up, h, r->moe_h, F4(pairs * nf))};
        /* one SIMD-group per (pair, output row): decode of a 35B-A3B-like
         * layer is 9 pairs x 512 rows = 4608 SIMD-groups */
        if ((rc = kr_launch(r, K_ID_moe_gate_up, (uint32_t)((nf + 3) / 4), (uint32_t)pairs, 1, 128, b, 7, err)))
            return rc;
    }
    /* the SwiGLU rows quantized as moe_down reads them: the routed pairs'
     * rows for the down type, the shared rows for the shared down's type
     * after n k rows of the first (one launch when they agree) */
    uint8_t *const qd = M->t_down == K_TYPE_Q8_0 ? r->moe_hq8 : r->moe_hqk;
    uint8_t *const qs = M->t_sdown == K_TYPE_Q8_0 ? r->moe_hq8 : r->moe_hqk;
    const size_t qd_bytes = M->t_down == K_TYPE_Q8_0 ? r->moe_hq8_bytes : r->moe_hqk_bytes;
    const size_t qs_bytes = M->t_sdown == K_TYPE_Q8_0 ? r->moe_hq8_bytes : r->moe_hqk_bytes;
    if (Fs && qd == qs && F == Fs && nf == F) {
        if ((rc = moe_quant(r, r->moe_h, nf, F, pairs, M->t_down, qd, qd_bytes, err))) return rc;
    } else {
        if ((rc = moe_quant(r, r->moe_h, nf, F, n * k, M->t_down, qd, qd_bytes, err))) return rc;
        const size_t off = (size_t)(n * k) * K_MOE_ACT_BYTES(M->t_sdown, (uint32_t)F);
        if (Fs && (rc = moe_quant(r, r->moe_h + n * k * nf, nf, Fs, n, M->t_sdown, qs + off, qs_bytes - off, err)))
            return rc;
    }
    k_moe_down_params p = {K_TAG_OF(moe_down), (uint32_t)F, (uint32_t)Fs, (uint32_t)E, (uint32_t)k, (uint32_t)n,
                           (uint32_t)ne, M->t_down, M->t_sdown, M->sd_base, (uint32_t)E};
    k_binding b[] = {STATUS_BIND(moe_down), K_BIND(moe_down, p, &p, sizeof p),
                     K_BIND(moe_down, sel, r->moe_sel, 4 * (size_t)(n * k)),
                     K_BIND(moe_down, wt, r->moe_wt, F4(n * (k + 1))),
                     K_BIND(moe_down, hq8, r->moe_hq8, r->moe_hq8_bytes), K_BIND(moe_down, hqk, r->moe_hqk, r->moe_hqk_bytes),
                     K_BIND(moe_down, w, M->wdn, M->dn_bytes), K_BIND(moe_down, out, r->y, F4(n * E))};
    return kr_launch(r, K_ID_moe_down, (uint32_t)((E + 3) / 4), (uint32_t)n, 1, 128, b, 8, err);
}

/* The first `bytes` of weight tensor t at byte `off` of the device buffer
 * dst (kr_upload_weights: Q8_0 rows in the device layout). */
static int upload_w(k_gpu_model *g, void *dst, size_t off, const ds4_tensor *t, size_t bytes, ds4_error *err) {
    return kr_upload_weights(g->dev, dst, off, t->data, bytes, t->type, t->ne[0], err);
}

static int moe_type(const k_gpu_model *g, const ds4_tensor *t, uint32_t *out, ds4_error *err) {
    if (!mat_type_ok(t->type) || t->type == DS4_TYPE_Q4_64A) { /* no Q4_64A expert dot (moe.h) */
        ds4_type_info ti;
        ds4_error e2;
        const char *tn = ds4_type_get_info(t->type, &ti, &e2) == 0 ? ti.name : "?";
        return ds4_fail(err, DS4_ERR_UNSUPPORTED,
                        "%s: tensor %s has type %s, which has no GPU kernel yet (GPU experts: Q8_0, Q4_K, Q5_K, "
                        "Q6_K)", g->dev->name, t->name, tn);
    }
    *out = (uint32_t)t->type;
    return 0;
}

#define PAD16(x) (((x) + 15u) / 16u * 16u)

/* One MoE layer's weights (dev_moe): the router rows (+ the shared gate),
 * the experts' 3-D tensors and the shared expert's matrices at the offsets
 * moe.h's kernels take. Offsets are 32-bit in the kernels: a layer whose
 * gate/up or down buffer reaches 4 GiB is refused. */
int kr_open_moe(k_gpu_model *g, const ds4_layer *T, dev_layer *L, ds4_error *err) {
    const ds4_model_config *c = &g->c;
    dev_moe *M = &L->moe;
    const int64_t E = c->n_embd, ne = c->n_expert, k = c->n_expert_used, F = c->n_ff_exp;
    const int fused = T->ffn_gate_up_exps.data != NULL, shared = T->ffn_gate_shexp.data != NULL;
    int rc;
    if (ne < 1 || ne > K_MOE_MAX_EXPERTS || k < 1 || k > K_MOE_MAX_K || k > ne)
        return ds4_fail(err, DS4_ERR_UNSUPPORTED,
                        "%s: %lld experts, %lld used per token: the GPU MoE kernels take 1..%d experts and 1..%d "
                        "used", g->dev->name, (long long)ne, (long long)k, K_MOE_MAX_EXPERTS, K_MOE_MAX_K);
    L->is_moe = 1;
    const ds4_tensor *tg = fused ? &T->ffn_gate_up_exps : &T->ffn_gate_exps;
    const ds4_tensor *tu = fused ? &T->ffn_gate_up_exps : &T->ffn_up_exps;
    if ((rc = moe_type(g, tg, &M->t_gate, err)) || (rc = moe_type(g, tu, &M->t_up, err)) ||
        (rc = moe_type(g, &T->ffn_down_exps, &M->t_down, err)))
        return rc;
    M->n_ff_sh = shared ? c->n_ff_shexp : 0;
    M->t_sgate = M->t_sup = M->t_sdown = K_TYPE_Q8_0;
    if (shared && ((rc = moe_type(g, &T->ffn_gate_shexp, &M->t_sgate, err)) ||
                   (rc = moe_type(g, &T->ffn_up_shexp, &M->t_sup, err)) ||
                   (rc = moe_type(g, &T->ffn_down_shexp, &M->t_sdown, err))))
        return rc;
    /* gate/up buffer: [gate experts | up experts (unless fused) | shared gate | shared up] */
    const uint64_t gbytes = tg->expert_bytes * (uint64_t)ne, ubytes = fused ? 0 : tu->expert_bytes * (uint64_t)ne;
    const uint64_t sgb = shared ? T->ffn_gate_shexp.row_bytes * (uint64_t)T->ffn_gate_shexp.ne[1] : 0;
    const uint64_t sub = shared ? T->ffn_up_shexp.row_bytes * (uint64_t)T->ffn_up_shexp.ne[1] : 0;
    const uint64_t u_base = fused ? 0 : PAD16(gbytes), sg_base = PAD16(fused ? gbytes : u_base + ubytes);
    const uint64_t su_base = PAD16(sg_base + sgb), gu_bytes = su_base + sub;
    const uint64_t dbytes = T->ffn_down_exps.expert_bytes * (uint64_t)ne, sd_base = PAD16(dbytes);
    const uint64_t sdb = shared ? T->ffn_down_shexp.row_bytes * (uint64_t)T->ffn_down_shexp.ne[1] : 0;
    const uint64_t dn_bytes = sd_base + sdb;
    if (gu_bytes >= (1ull << 32) || dn_bytes >= (1ull << 32))
        return ds4_fail(err, DS4_ERR_UNSUPPORTED,
                        "%s: %s: the layer's expert matrices (%llu + %llu bytes) exceed the GPU MoE kernels' 32-bit "
                        "offsets", g->dev->name, tg->name, (unsigned long long)gu_bytes, (unsigned long long)dn_bytes);
    if (tg->expert_bytes % 16 || tu->expert_bytes % 16)
        return ds4_fail(err, DS4_ERR_UNSUPPORTED,
                        "%s: %s: an expert's matrix is %zu bytes, not a multiple of 16 (the GPU MoE kernels' "
                        "alignment)", g->dev->name, tg->expert_bytes % 16 ? tg->name : tu->name,
                        tg->expert_bytes % 16 ? tg->expert_bytes : tu->expert_bytes);
    M->g_estride = (uint32_t)tg->expert_bytes;
    M->u_base = (uint32_t)u_base;
    M->u_estride = (uint32_t)tu->expert_bytes;
    M->u_row0 = fused ? (uint32_t)F : 0u;
    M->sg_base = (uint32_t)sg_base, M->su_base = (uint32_t)su_base, M->sd_base = (uint32_t)sd_base;
    M->gu_bytes = (size_t)gu_bytes, M->dn_bytes = (size_t)dn_bytes;
    if (!(M->wgu = mem_alloc(g->dev, &g->mem, M->gu_bytes, err)) ||
        !(M->wdn = mem_alloc(g->dev, &g->mem, M->dn_bytes, err)))
        return err->code;
    if ((rc = upload_w(g, M->wgu, 0, tg, gbytes, err)) || (!fused && (rc = upload_w(g, M->wgu, u_base, tu, ubytes, err))) ||
        (rc = upload_w(g, M->wgu, sg_base, &T->ffn_gate_shexp, sgb, err)) ||
        (rc = upload_w(g, M->wgu, su_base, &T->ffn_up_shexp, sub, err)) ||
        (rc = upload_w(g, M->wdn, 0, &T->ffn_down_exps, dbytes, err)) ||
        (rc = upload_w(g, M->wdn, sd_base, &T->ffn_down_shexp, sdb, err)))
        return rc;
    /* the router, and the shared expert's gate as row n_expert */
    if (T->ffn_gate_inp.type != DS4_TYPE_F32 || (T->ffn_gate_inp_shexp.data && T->ffn_gate_inp_shexp.type != DS4_TYPE_F32))
        return ds4_fail(err, DS4_ERR_UNSUPPORTED, "%s: %s: the router must be F32 on the GPU", g->dev->name,
                        T->ffn_gate_inp.name);
    M->shgate = shared && T->ffn_gate_inp_shexp.data != NULL;
    float *rt = malloc(F4((ne + 1) * E));
    if (!rt) return ds4_fail(err, DS4_ERR_NOMEM, "out of host memory");
    memcpy(rt, T->ffn_gate_inp.data, F4(ne * E));
    if (M->shgate) memcpy(rt + ne * E, T->ffn_gate_inp_shexp.data, F4(E));
    M->router = kr_mem_upload(g->dev, &g->mem, rt, F4((ne + M->shgate) * E), err);
    free(rt);
    if (!M->router) return err->code;
    M->want = K_NQ_X;
    const uint32_t ty[4] = {M->t_gate, M->t_up, M->t_sgate, M->t_sup};
    for (int i = 0; i < (shared ? 4 : 2); i++) M->want |= ty[i] == K_TYPE_Q8_0 ? K_NQ_Q8_0 : K_NQ_Q8_K;
    M->up0 = M->u_base + M->u_row0 * K_MOE_ROW_BYTES(M->t_up, (uint32_t)g->c.n_embd);
    M->d_estride = (uint32_t)g->c.n_embd * K_MOE_ROW_BYTES(M->t_down, (uint32_t)g->c.n_ff_exp);
    const int q8 = (M->want & K_NQ_Q8_0) || M->t_down == K_TYPE_Q8_0 || (shared && M->t_sdown == K_TYPE_Q8_0);
    M->group_ok = (M->up0 | M->d_estride) % 16u == 0;
    M->all_kq = !q8;
    return 0;
}

/* A session's MoE scratch for ROWS token rows (moe_layer). */
static int open_moe_scratch(k_runner *r, ds4_error *err) {
    const ds4_model_config *c = &r->c;
    if (c->arch != DS4_ARCH_QWEN35MOE) return 0;
    const int64_t ne = c->n_expert, k = c->n_expert_used, F = c->n_ff_exp, Fs = c->n_ff_shexp;
    const int64_t nf = F > Fs ? F : Fs;
    r->moe_hq8_bytes = (size_t)(ROWS * k) * K_MOE_ACT_BYTES(K_TYPE_Q8_0, (uint32_t)F) +
                       (size_t)ROWS * K_MOE_ACT_BYTES(K_TYPE_Q8_0, (uint32_t)Fs) + 16;
    r->moe_hqk_bytes = (size_t)(ROWS * k) * K_MOE_ACT_BYTES(K_TYPE_Q4_K, (uint32_t)F) +
                       (size_t)ROWS * K_MOE_ACT_BYTES(K_TYPE_Q4_K, (uint32_t)Fs) + 16;
    if (!(r->moe_logits = kr_dalloc(r, F4(ROWS * (ne + 1)), err)) || !(r->moe_wt = kr_dalloc(r, F4(ROWS * (k + 1)), err)) ||
        !(r->moe_sel = kr_dalloc(r, 4 * (size_t)(ROWS * k), err)) ||
        !(r->moe_h = kr_dalloc(r, F4(ROWS * (k + 1) * nf), err)) || !(r->moe_hq8 = kr_dalloc(r, r->moe_hq8_bytes, err)) ||
        !(r->moe_hqk = kr_dalloc(r, r->moe_hqk_bytes, err)))
        return err->code;
    /* the grouped path's (moe_grouped): [g | u] and down rows per pair, the sort */
    if (ROWS * k <= (int64_t)K_MOE_GROUP_MAX_PAIRS &&
        (!(r->moe_gu = kr_dalloc(r, F4(ROWS * (k + 1) * 2 * nf), err)) ||
         !(r->moe_dn = kr_dalloc(r, F4(ROWS * (k + 1) * c->n_embd), err)) ||
         !(r->moe_order = kr_dalloc(r, 4 * (size_t)(ROWS * (k + 1)), err)) ||
         !(r->moe_tiles = kr_dalloc(r, 8 * (size_t)K_MOE_GROUP_TILES(ROWS, (uint32_t)k, (uint32_t)ne, 1u,
                                                                   K_GEMM_TR < K_MMA_KQ_TR ? K_GEMM_TR : K_MMA_KQ_TR),
                                         err))))
        return err->code;
    return 0;
}

/* ------------------------------------------------------------ open -- */

/* A gated-attention block's projections and q/k norms (a trunk layer or
 * the nextn head's block). */
int kr_open_attn(k_gpu_model *r, const ds4_layer *T, dev_layer *L, ds4_error *err) {
    const ds4_tensor *in[3] = {&T->attn_q, &T->attn_k, &T->attn_v};
    dev_mat *const din[3] = {&L->q, &L->k, &L->v};
    int rc;
    if ((rc = kr_upload_group(r, in, din, 3, L->attn_in, &L->n_attn_in, err)) ||
        (rc = kr_upload_mat(r, &T->attn_output, &L->o, err)))
        return rc;
    if (T->attn_q_norm.type != DS4_TYPE_F32 || T->attn_k_norm.type != DS4_TYPE_F32)
        return ds4_fail(err, DS4_ERR_UNSUPPORTED, "%s: attention q/k norms must be F32 on the GPU", r->dev->name);
    float *qk = malloc(F4(2 * r->c.head_dim));
    if (!qk) return ds4_fail(err, DS4_ERR_NOMEM, "out of host memory");
    memcpy(qk, T->attn_q_norm.data, F4(r->c.head_dim));
    memcpy(qk + r->c.head_dim, T->attn_k_norm.data, F4(r->c.head_dim));
    L->q_norm = kr_mem_upload(r->dev, &r->mem, qk, F4(2 * r->c.head_dim), err);
    free(qk);
    if (!L->q_norm) return err->code;
    L->k_norm = (float *)L->q_norm + r->c.head_dim;
    return 0;
}

/* A block's norms and its FFN: the routed MoE of a qwen35moe model, else
 * the dense SwiGLU. */
int kr_open_ffn(k_gpu_model *r, const ds4_layer *T, dev_layer *L, ds4_error *err) {
    const int64_t E = r->c.n_embd;
    if (!(L->attn_norm = kr_upload_f32(r, &T->attn_norm, E, err)) ||
        !(L->post_norm = kr_upload_f32(r, &T->post_attention_norm, E, err)))
        return err->code;
    if (r->c.arch == DS4_ARCH_QWEN35MOE) return kr_open_moe(r, T, L, err);
    const ds4_tensor *fin[2] = {&T->ffn_gate, &T->ffn_up};
    dev_mat *const dfin[2] = {&L->ffn_gate, &L->ffn_up};
    int rc = kr_upload_group(r, fin, dfin, 2, L->ffn_in, &L->n_ffn_in, err);
    return rc ? rc : kr_upload_mat(r, &T->ffn_down, &L->ffn_down, err);
}

static int open_layers(k_gpu_model *r, ds4_error *err) {
    const ds4_model_config *c = &r->c;
    const ds4_model *m = r->m;
    const int64_t cd = conv_dim(c), nv = c->ssm_n_v, d = c->ssm_d_state;
    for (int64_t il = 0; il < c->n_main; il++) {
        const ds4_layer *T = &m->layers[il];
        dev_layer *L = &r->L[il];
        L->kind = T->kind;
        int rc;
        if (T->kind == DS4_LAYER_GDN) {
            const ds4_tensor *in[4] = {&T->attn_qkv, &T->attn_gate, &T->ssm_beta, &T->ssm_alpha};
            dev_mat *const din[4] = {&L->qkv, &L->gate, &L->beta, &L->alpha};
            if ((rc = kr_upload_group(r, in, din, 4, L->gdn_in, &L->n_gdn_in, err)) ||
                (rc = kr_upload_mat(r, &T->ssm_out, &L->ssm_out, err)))
                return rc;
            if (!(L->conv_w = kr_upload_f32(r, &T->ssm_conv1d, cd * c->ssm_conv_kernel, err))) return err->code;
            float *hp = malloc(F4(2 * nv + d));
            if (!hp) return ds4_fail(err, DS4_ERR_NOMEM, "out of host memory");
            memcpy(hp, T->ssm_a.data, F4(nv));
            memcpy(hp + nv, T->ssm_dt_bias.data, F4(nv));
            memcpy(hp + 2 * nv, T->ssm_norm.data, F4(d));
            L->hp = kr_mem_upload(r->dev, &r->mem, hp, F4(2 * nv + d), err);
            free(hp);
            if (!L->hp) return err->code;
        } else if ((rc = kr_open_attn(r, T, L, err))) {
            return rc;
        }
        if ((rc = kr_open_ffn(r, T, L, err))) return rc;
    }
    return 0;
}

/* Per layer: the recurrent state with its verify backup and capture rows
 * (GDN), or the KV pools (attention). */
static int open_state(k_runner *r, ds4_error *err) {
    const ds4_model_config *c = &r->c;
    const int64_t cd = conv_dim(c), vd = c->ssm_d_inner, nv = c->ssm_n_v, d = c->ssm_d_state;
    const size_t conv = F4((c->ssm_conv_kernel - 1) * cd), ssm = F4(nv * d * d);
    const size_t pool = (size_t)r->n_pages * (size_t)c->n_head_kv * K_ATTN_BLOCK * (size_t)c->head_dim * 2;
    for (int64_t il = 0; il < c->n_main; il++) {
        dev_state *S = &r->S[il];
        if (r->L[il].kind == DS4_LAYER_GDN) {
            if (!(S->conv_state = kr_dalloc(r, 2 * conv, err)) || !(S->ssm = kr_dalloc(r, ssm, err)) ||
                !(S->conv_bak = kr_dalloc(r, conv, err)) || !(S->ssm_bak = kr_dalloc(r, ssm, err)) ||
                !(S->cap_in = kr_dalloc(r, F4(K_RUNNER_VERIFY_MAX * (cd + vd + 2 * nv)), err)))
                return err->code;
        } else if (!(S->kpool = kr_dalloc(r, pool, err)) || !(S->vpool = kr_dalloc(r, pool, err))) {
            return err->code;
        }
    }
    return 0;
}

static int open_scratch(k_runner *r, ds4_error *err) {
    const ds4_model_config *c = &r->c;
    const int64_t E = c->n_embd, cd = conv_dim(c), vd = c->ssm_d_inner, nv = c->ssm_n_v;
    const int64_t qf_dim = 2 * c->n_head * c->head_dim, kv_dim = c->n_head_kv * c->head_dim;
    const int64_t half = c->n_rot / 2 > 0 ? c->n_rot / 2 : 1;
    /* widest matvec input: E, value_dim (ssm_out), n_head*head_dim (attn_output), n_ff (ffn_down) */
    int64_t w = E;
    if (vd > w) w = vd;
    if (c->n_head * c->head_dim > w) w = c->n_head * c->head_dim;
    if (c->n_ff > w) w = c->n_ff;
    if (r->nh && 2 * E > w) w = 2 * E; /* the head's eh_proj reads [e ; g] */
    r->xq8_bytes = (size_t)(ROWS * w / 32) * 34;
    r->xqk_bytes = (size_t)(ROWS * w / 256 + 1) * 292;
    r->part_floats = (size_t)r->attn_rows * (size_t)c->n_head * (size_t)r->n_pages * (size_t)(2 + c->head_dim);
    struct {
        float **p;
        int64_t n;
    } fl[] = {{&r->h, E},       {&r->x, E},        {&r->y, E},       {&r->gin, cd + vd + 2 * nv},
              {&r->cv, cd},      {&r->o, vd},      {&r->qf, qf_dim}, {&r->qn, qf_dim},
              {&r->kraw, kv_dim}, {&r->kn, kv_dim}, {&r->vv, kv_dim}, {&r->arow, (qf_dim + 2 * kv_dim + ROWS - 1) / ROWS},
              {&r->attn, qf_dim / 2},
              {&r->g, c->n_ff}, {&r->u, c->n_ff},  {&r->gu, 2 * c->n_ff},
              {&r->cs, half},   {&r->sn, half},
              {&r->gpq, K_GDN_PQ_STRIDE(c->ssm_n_k, nv, c->ssm_d_state)}};
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++)
        if (!(*fl[i].p = kr_dalloc(r, F4(ROWS * (fl[i].n > 0 ? fl[i].n : 1)), err))) return err->code;
    if (!(r->logits = kr_dalloc(r, F4(OUT_ROWS * c->n_vocab), err)) || !(r->part = kr_dalloc(r, F4(r->part_floats), err)) ||
        !(r->xq8 = kr_dalloc(r, r->xq8_bytes, err)) || !(r->xqk = kr_dalloc(r, r->xqk_bytes, err)) ||
        !(r->idx = kr_dalloc(r, 4 * (size_t)OUT_ROWS * (1 + K_TOPK_MAX), err)) || !(r->status = kr_dalloc(r, 8, err)))
        return err->code;
    uint32_t *pg = malloc(4 * (size_t)r->n_pages);
    if (!pg) return ds4_fail(err, DS4_ERR_NOMEM, "out of host memory");
    for (int64_t i = 0; i < r->n_pages; i++) pg[i] = (uint32_t)i;
    r->pages = upload(r, pg, 4 * (size_t)r->n_pages, err);
    free(pg);
    if (!r->pages) return err->code;
    r->h_stage = malloc(F4(ROWS * E));
    r->h_cs = malloc(F4(ROWS * half));
    r->h_sn = malloc(F4(ROWS * half));
    r->h_idx = malloc(4 * (size_t)OUT_ROWS * (1 + K_TOPK_MAX));
    if (!r->h_stage || !r->h_cs || !r->h_sn || !r->h_idx) return ds4_fail(err, DS4_ERR_NOMEM, "out of host memory");
    return 0;
}

int k_gpu_model_open(k_device *d, const ds4_model *m, k_gpu_model **out, ds4_error *err) {
    *out = NULL;
    if (!d || !m) return ds4_fail(err, DS4_ERR_ARG, "k_gpu_model_open: device or model is NULL");
    const ds4_model_config *c = &m->cfg;
    if (c->arch != DS4_ARCH_QWEN35 && c->arch != DS4_ARCH_QWEN35MOE)
        return ds4_fail(err, DS4_ERR_UNSUPPORTED, "%s: only qwen35 and qwen35moe models run on the GPU", d->name);
    if (m->params.precision != DS4_PRECISION_FAST)
        return ds4_fail(err, DS4_ERR_UNSUPPORTED, "%s: the GPU runs fast precision only", d->name);
    if (c->head_dim > K_ATTN_MAX_DIM || c->n_head % c->n_head_kv || c->n_head / c->n_head_kv > K_ATTN_MAX_GROUP ||
        c->ssm_d_state > K_GDN_MAX_D || c->ssm_conv_kernel > K_GDN_MAX_CONV || c->n_rot > c->head_dim)
        return ds4_fail(err, DS4_ERR_UNSUPPORTED,
                        "%s: shape outside the kernels' limits (head_dim %lld <= %d, GQA group <= %d, "
                        "ssm d_state %lld <= %d, conv kernel %lld <= %d)",
                        d->name, (long long)c->head_dim, K_ATTN_MAX_DIM, K_ATTN_MAX_GROUP,
                        (long long)c->ssm_d_state, K_GDN_MAX_D, (long long)c->ssm_conv_kernel, K_GDN_MAX_CONV);
    k_gpu_model *g = calloc(1, sizeof *g);
    if (!g) return ds4_fail(err, DS4_ERR_NOMEM, "out of host memory");
    g->dev = d;
    g->m = m;
    g->c = *c;
    g->isa = ds4_isa_auto();
    /* gdn_delta: one SIMD-group per state row, up to 8 per threadgroup */
    g->gdn_tg = c->ssm_d_state >= 8 ? 256 : (uint32_t)(32 * c->ssm_d_state);
    g->L = calloc((size_t)c->n_main, sizeof *g->L);
    int rc = g->L ? 0 : ds4_fail(err, DS4_ERR_NOMEM, "out of host memory");
    if (!rc) rc = open_layers(g, err);
    if (!rc) rc = kr_upload_mat(g, ds4_model_head(m), &g->head, err);
    if (!rc && !(g->output_norm = kr_upload_f32(g, &m->output_norm, c->n_embd, err))) rc = err->code;
    if (!rc && c->n_nextn > 0) {
        /* a head the GPU cannot run leaves the trunk running: drafting is
         * then refused with this reason (k_gpu_model_nextn_refusal) */
        ds4_error herr = {0};
        if (kr_head_open(g, &herr)) snprintf(g->nh_why, sizeof g->nh_why, "%s", herr.message);
    }
    if (rc) {
        k_gpu_model_close(g);
        return rc;
    }
    *out = g;
    return ds4_ok(err);
}

void k_gpu_model_close(k_gpu_model *g) {
    if (!g) return;
    mem_release(g->dev, &g->mem);
    free(g->nh);
    free(g->L);
    free(g);
}

uint64_t k_gpu_model_device_bytes(const k_gpu_model *g) { return g->mem.bytes; }

int k_runner_open(k_gpu_model *g, int64_t n_ctx, k_runner **out, ds4_error *err) {
    *out = NULL;
    if (!g) return ds4_fail(err, DS4_ERR_ARG, "k_runner_open: model is NULL");
    if (n_ctx <= 0) return ds4_fail(err, DS4_ERR_ARG, "n_ctx must be positive (got %lld)", (long long)n_ctx);
    k_runner *r = calloc(1, sizeof *r);
    if (!r) return ds4_fail(err, DS4_ERR_NOMEM, "out of host memory");
    r->gm = g;
    r->dev = g->dev;
    r->m = g->m;
    r->c = g->c;
    r->isa = g->isa;
    r->gdn_tg = g->gdn_tg;
    r->L = g->L;
    r->head = &g->head;
    r->output_norm = g->output_norm;
    r->nh = g->nh;
    r->n_ctx = n_ctx;
    r->n_pages = (n_ctx + K_ATTN_BLOCK - 1) / K_ATTN_BLOCK;
    r->last_row = -1;
    {
        const char *f = getenv("K_RUNNER_FUSE");
        r->fuse = !(f && !strcmp(f, "0"));
        const char *nq = getenv("K_RUNNER_GDN_NQ"); /* 0: gdn_norm then the quantizer (A/B of gdn_norm_quant) */
        r->gdn_nq = !(nq && !strcmp(nq, "0"));
        const char *lw = getenv("K_RUNNER_MOE_LOGITS_WIDE"); /* 0: moe_logits at every width (A/B) */
        r->moe_lw = !(lw && !strcmp(lw, "0"));
        const char *aw = getenv("K_RUNNER_ATTN_WIDE"); /* 0: attn_partials at every width (A/B) */
        r->attn_wide = aw && !strcmp(aw, "0") ? 0u
                       : !strcmp(r->dev->name, "metal") ? K_ATTN_WIDE_QV_METAL : K_ATTN_WIDE_QV_OTHER;
        /* K_RUNNER_GEMM: 0 the matvecs, dp4a the dp4a GEMMs (gemm.h) for
         * every type, kq gemm_kq_mma for the K-quants and gemm.h for Q8_0;
         * unset or mma: the int8 tensor-core GEMMs (gemm_mma.h) for every
         * type where the device has int8 MMA (CUDA, the emulator; Metal:
         * the dp4a GEMMs) -- all the same bits. Why that default: on the
         * H200 (session 20) the staged tensor-core GEMMs ran 5120 x 17408
         * at 512 rows 1.72x (Q4_K), 1.28x (Q6_K) and 1.60x (Q8_0) the dp4a
         * GEMMs; the 0.8B Q8_0 shape's prefill +23% / +19% at 512 / 4k
         * against kq in the same call */
        const char *g = getenv("K_RUNNER_GEMM");
        int mma = 0;
#ifdef K_HAS_MMA_KERNELS
        mma = !strcmp(r->dev->name, "cuda") || !strcmp(r->dev->name, "emul");
#endif
        r->gemm = g && !strcmp(g, "0") ? 0 : g && !strcmp(g, "dp4a") ? 1 : !mma ? 1 : g && !strcmp(g, "kq") ? 3 : 2;
        r->attn_tg = !strcmp(r->dev->name, "cuda") ? K_ATTN_TG : 256;
        const char *ah = getenv("K_RUNNER_ATTN_HS");
        const long ahv = ah ? strtol(ah, NULL, 10) : 0;
        r->attn_hs = ahv >= 1 && ahv <= K_ATTN_MAX_GROUP ? (uint32_t)ahv : 0u;
        const char *ag = getenv("K_RUNNER_ATTN_RG"); /* query rows per attn_partials threadgroup */
        const long agv = ag ? strtol(ag, NULL, 10) : 0;
        r->attn_rg = agv >= 1 && agv <= K_ATTN_MAX_QV ? (uint32_t)agv : 0u;
        const char *at = getenv("K_RUNNER_ATTN_TG"); /* threads per attn_partials threadgroup */
        const long atv = at ? strtol(at, NULL, 10) : 0;
        if (atv >= 32 && atv <= 1024 && atv % 32 == 0) r->attn_tg = (uint32_t)atv;
        /* K_RUNNER_MOE_SPLIT (1..32): the router's split, for sweeps on the
         * device; each value is its own fixed summation order (moe.h) */
        const char *ms = getenv("K_RUNNER_MOE_SPLIT");
        const long msv = ms ? strtol(ms, NULL, 10) : 0;
        r->moe_split = msv >= 1 && msv <= 32 ? (uint32_t)msv : K_MOE_LOGITS_SPLIT;
        /* K_RUNNER_MOE_GROUP=0: every MoE chunk per pair (moe_gate_up / moe_down);
         * K_RUNNER_MOE_GROUP_MIN=N: chunks of N rows or more grouped (default:
         * the prefill GEMM's, wider than K_MATVEC_MAX_ROWS). The same bits. */
        const char *mg = getenv("K_RUNNER_MOE_GROUP"), *mgm = getenv("K_RUNNER_MOE_GROUP_MIN");
        const long mgmv = mgm ? strtol(mgm, NULL, 10) : 0;
        r->moe_group_min = mg && !strcmp(mg, "0") ? INT64_MAX : mgmv >= 1 ? mgmv : K_MATVEC_MAX_ROWS + 1;
        const char *pc = getenv("K_RUNNER_PREFILL_CHUNK");
        const long pcv = pc ? strtol(pc, NULL, 10) : 0;
        r->prefill_chunk = pcv >= 1 && pcv <= ROWS ? pcv : ROWS;
        const char *gs = getenv("K_RUNNER_GDN_SPLIT");
        const long gsv = gs ? strtol(gs, NULL, 10) : 0;
        uint32_t gsplit = 1u;
        while (gsplit < 8u && (uint64_t)r->c.ssm_n_v * gsplit * 2u <= K_GDN_SEQ_TARGET_GROUPS &&
               r->c.ssm_d_state % (gsplit * 2u) == 0)
            gsplit *= 2u;
        r->gdn_split = gsv >= 1 && gsv <= 16 ? (uint32_t)gsv : gsplit;
        const char *gm = getenv("K_RUNNER_GDN_SPLIT_MIN"); /* the shortest split run, for A/B runs */
        const long gmv = gm ? strtol(gm, NULL, 10) : 0;
        r->gdn_split_min = gmv >= 1 ? gmv : K_GDN_SEQ_SPLIT_MIN;
        const char *gr = getenv("K_RUNNER_GDN_ROWS_MIN"); /* 0: never; N: runs of N+ tokens */
        r->gdn_rows_min = gr && *gr ? strtol(gr, NULL, 10) : K_GDN_ROWS_MIN;
        if (r->gdn_rows_min < 0) r->gdn_rows_min = 0;
        /* gdn_rows' state rows per SIMD-group: the fewest (the most
         * SIMD-groups to hide each token's latency chain) whose SIMD-groups
         * all fit on the GPU at once; K_RUNNER_GDN_ROWS_R fixes it */
        uint32_t rr = 1u;
        while (rr < K_GDN_ROWS_MAX &&
               K_GDN_ROWS_WARPS((uint32_t)r->c.ssm_n_v, (uint32_t)r->c.ssm_d_state, rr) > K_GDN_ROWS_TARGET_WARPS)
            rr *= 2u;
        const char *grr = getenv("K_RUNNER_GDN_ROWS_R");
        const long grv = grr ? strtol(grr, NULL, 10) : 0;
        r->gdn_rows_r = grv >= 1 && grv <= K_GDN_ROWS_MAX ? (uint32_t)grv : rr;
        /* Query rows per attention launch pair: a whole chunk where the
         * partials buffer (rows x heads x pages x (2 + head_dim) floats)
         * stays within K_ATTN_PART_BYTES_MAX, else halved down to
         * ATTN_ROWS. H100, 0.8B Q8_0 shape, prefill tok/s at ctx 512 /
         * 4096 (2 repetitions): 16 rows 16403-16582 / 11558-11572, 64 rows
         * 19953-20142 / 13200-13289, 512 rows 20528-20692 / 14162-14193.
         * A row's result does not depend on it (attn.h);
         * K_RUNNER_ATTN_ROWS=N (1..ROWS) fixes it. */
        const int64_t part_row = r->c.n_head * r->n_pages * (2 + r->c.head_dim) * (int64_t)sizeof(float);
        int64_t arows = ROWS;
        while (arows > ATTN_ROWS && arows * part_row > (int64_t)K_ATTN_PART_BYTES_MAX) arows /= 2;
        if (arows < ATTN_ROWS) arows = ATTN_ROWS;
        const char *ar = getenv("K_RUNNER_ATTN_ROWS");
        const long arv = ar ? strtol(ar, NULL, 10) : 0;
        r->attn_rows = arv >= 1 && arv <= ROWS ? arv : arows;
    }
    r->S = calloc((size_t)g->c.n_main, sizeof *r->S);
    int rc = r->S ? 0 : ds4_fail(err, DS4_ERR_NOMEM, "out of host memory");
    if (!rc) rc = open_state(r, err);
    if (!rc) rc = open_scratch(r, err);
    if (!rc) rc = open_moe_scratch(r, err);
    if (rc) {
        k_runner_close(r);
        return rc;
    }
    *out = r;
    return ds4_ok(err);
}

void k_runner_close(k_runner *r) {
    if (!r) return;
    mem_release(r->dev, &r->mem);
    free(r->pend_tok);
    free(r->tap_want);
    free(r->h_taps);
    free(r->S);
    free(r->h_stage);
    free(r->h_cs);
    free(r->h_sn);
    free(r->h_idx);
    free(r);
}

int64_t k_runner_n_past(const k_runner *r) { return r->n_past; }
uint64_t k_runner_device_bytes(const k_runner *r) { return r->mem.bytes + r->gm->mem.bytes; }
int64_t k_runner_launches(const k_runner *r) { return r->launches; }

/* ------------------------------------------------------------ eval -- */

static int chunk_launches(k_runner *r, int64_t n, int64_t pos0, int64_t row0, int64_t out0, int want_argmax,
                          ds4_error *err);

/* Layer taps. Layer l's residual rows are complete in h once the next
 * norm has added its last output (each layer's closing h += y is done by
 * the next layer's pre-norm, or the output norm's): called there, they are
 * copied to slot l of the device tap buffer. */
static int tap_copy(k_runner *r, int64_t l, int64_t n, ds4_error *err) {
    if (!r->tap_want || l < 0 || !r->tap_want[l]) return 0;
    const int64_t E = r->c.n_embd;
    return kr_copy_dev(r, r->taps + (size_t)l * OUT_ROWS * E, r->h, F4(n * E), err);
}

/* After a chunk of n rows (row0.. of the call): the tapped slots back to
 * the host, scattered into the caller's rows x tap_n x n_embd. */
static int tap_download(k_runner *r, int64_t n, int64_t row0, ds4_error *err) {
    const int64_t E = r->c.n_embd;
    for (int64_t l = 0; l < r->c.n_main; l++)
        if (r->tap_want[l] && r->dev->download(r->dev, r->h_taps + (size_t)l * OUT_ROWS * E,
                                               r->taps + (size_t)l * OUT_ROWS * E, F4(n * E)))
            return ds4_fail(err, DS4_ERR_INTERNAL, "%s download: %s", r->dev->name, r->dev->err);
    for (int64_t t = 0; t < n; t++)
        for (int64_t j = 0; j < r->tap_n; j++)
            memcpy(r->tap_dst + ((row0 + t) * r->tap_n + j) * E,
                   r->h_taps + ((size_t)r->tap_layers[j] * OUT_ROWS + (size_t)t) * E, F4(E));
    return 0;
}

/* Arm the taps of one call (tap_end disarms them); the buffers on first use. */
static int tap_begin(k_runner *r, int all_rows, const int64_t *layers, int64_t n_layers, float *taps,
                     ds4_error *err) {
    const ds4_model_config *c = &r->c;
    if (n_layers <= 0) return 0;
    if (!layers || !taps) return ds4_fail(err, DS4_ERR_ARG, "layer taps: layers or taps is NULL");
    if (!all_rows) return ds4_fail(err, DS4_ERR_ARG, "layer taps need every row's outputs (all_rows)");
    for (int64_t j = 0; j < n_layers; j++)
        if (layers[j] < 0 || layers[j] >= c->n_main)
            return ds4_fail(err, DS4_ERR_ARG, "layer tap %lld is outside the trunk's layers 0..%lld",
                            (long long)layers[j], (long long)c->n_main - 1);
    if (!r->taps) {
        const size_t floats = (size_t)c->n_main * OUT_ROWS * (size_t)c->n_embd;
        if (!(r->taps = kr_dalloc(r, F4(floats), err))) return err->code;
        if (!(r->h_taps = malloc(F4(floats))) || !(r->tap_want = malloc((size_t)c->n_main)))
            return ds4_fail(err, DS4_ERR_NOMEM, "out of host memory");
    }
    memset(r->tap_want, 0, (size_t)c->n_main);
    for (int64_t j = 0; j < n_layers; j++) r->tap_want[layers[j]] = 1;
    r->tap_layers = layers;
    r->tap_n = n_layers;
    r->tap_dst = taps;
    return 0;
}

static void tap_end(k_runner *r) {
    if (r->tap_want) memset(r->tap_want, 0, (size_t)r->c.n_main);
    r->tap_n = 0;
    r->tap_layers = NULL;
    r->tap_dst = NULL;
}

/* Rows [0, n) of one chunk at positions pos0..; outputs for rows >= out0. */
static int eval_chunk(k_runner *r, const int32_t *tokens, int64_t n, int64_t pos0, int64_t row0, int64_t out0,
                      float *logits, int32_t *argmax, float *hidden, ds4_error *err) {
    const ds4_model_config *c = &r->c;
    const ds4_model *m = r->m;
    const int64_t E = c->n_embd, V = c->n_vocab, half = c->n_rot / 2;
    int rc;
    if (r->prime && (rc = kr_head_chunk_start(r, n, err))) return rc;
    for (int64_t t = 0; t < n; t++)
        if ((rc = ds4_dequantize_row(r->isa, m->token_embd.type,
                                     m->token_embd.data + (size_t)tokens[t] * m->token_embd.row_bytes,
                                     r->h_stage + t * E, E, err)))
            return rc;
    if (r->dev->upload(r->dev, r->h, r->h_stage, F4(n * E)))
        return ds4_fail(err, DS4_ERR_INTERNAL, "%s upload: %s", r->dev->name, r->dev->err);
    if (half > 0) {
        ds4_rope_fill(c->n_rot, c->rope_base, 1, n, pos0, r->h_cs, r->h_sn);
        if (r->dev->upload(r->dev, r->cs, r->h_cs, F4(n * half)) ||
            r->dev->upload(r->dev, r->sn, r->h_sn, F4(n * half)))
            return ds4_fail(err, DS4_ERR_INTERNAL, "%s upload: %s", r->dev->name, r->dev->err);
    }
    /* a priming session keeps the rows' embeddings for the head (runner_head.c
     * "Deferred rows"): giving it the rows then uploads nothing */
    if (r->prime && (rc = kr_head_keep_embeddings(r, n, pos0, err))) return rc;
    /* the chunk's launches are one device step (device.h: a CUDA graph
     * with K_CUDA_GRAPH=1), between the uploads above and the downloads */
    if (r->dev->step_begin && r->dev->step_begin(r->dev))
        return ds4_fail(err, DS4_ERR_INTERNAL, "%s step: %s", r->dev->name, r->dev->err);
    rc = chunk_launches(r, n, pos0, row0, out0, argmax != NULL, err);
    if (r->dev->step_end && r->dev->step_end(r->dev) && !rc)
        rc = ds4_fail(err, DS4_ERR_INTERNAL, "%s step: %s", r->dev->name, r->dev->err);
    if (rc) return rc;
    const int priming = r->prime && !r->capturing; /* x holds every row then (chunk_launches) */
    if (out0 < n) {
        const int64_t n_out = n - out0;
        if (argmax) {
            if (r->dev->download(r->dev, r->h_idx, r->idx, 4 * (size_t)n_out * (1 + K_TOPK_MAX)))
                return ds4_fail(err, DS4_ERR_INTERNAL, "%s download: %s", r->dev->name, r->dev->err);
            for (int64_t t = 0; t < n_out; t++) argmax[t] = (int32_t)r->h_idx[t * (1 + K_TOPK_MAX)];
        }
        if (logits && r->dev->download(r->dev, logits, r->logits, F4(n_out * V)))
            return ds4_fail(err, DS4_ERR_INTERNAL, "%s download: %s", r->dev->name, r->dev->err);
        if (hidden && r->dev->download(r->dev, hidden, r->x + (priming ? out0 : 0) * c->n_embd,
                                       F4(n_out * c->n_embd)))
            return ds4_fail(err, DS4_ERR_INTERNAL, "%s download: %s", r->dev->name, r->dev->err);
        if (r->tap_n && (rc = tap_download(r, n, row0, err))) return rc; /* taps: all rows (out0 == 0) */
    }
    /* after the downloads: the head's launches overwrite x, and they run
     * while the host samples */
    return priming ? kr_head_prime_chunk(r, tokens, n, pos0, err) : 0;
}

/* eval_chunk's kernels: the layers, then for rows >= out0 the final norm,
 * the LM head and (want_argmax) the on-device argmax. */
static int chunk_launches(k_runner *r, int64_t n, int64_t pos0, int64_t row0, int64_t out0, int want_argmax,
                          ds4_error *err) {
    const ds4_model_config *c = &r->c;
    const int64_t E = c->n_embd, V = c->n_vocab;
    unsigned ready; /* the activation types norm_quant wrote for the next matvecs */
    int rc;
    /* each layer's closing residual add (h += y) is done by the next norm:
     * the next layer's attn_norm or the output norm (pre_norm) */
    for (int64_t il = 0; il < c->n_main; il++) {
        dev_layer *L = &r->L[il];
        const unsigned mix = L->kind == DS4_LAYER_GDN
                                 ? kr_act_flag(&L->qkv) | kr_act_flag(&L->gate) | kr_act_flag(&L->beta) | kr_act_flag(&L->alpha)
                                 : kr_act_flag(&L->q) | kr_act_flag(&L->k) | kr_act_flag(&L->v);
        const unsigned ffn = L->is_moe ? L->moe.want : kr_act_flag(&L->ffn_gate) | kr_act_flag(&L->ffn_up);
        if ((rc = kr_pre_norm(r, il > 0, 0, n, L->attn_norm, mix, &ready, err)) ||
            (il > 0 && (rc = tap_copy(r, il - 1, n, err))) ||
            (rc = L->kind == DS4_LAYER_GDN ? gdn_layer(r, L, &r->S[il], n, row0, ready, err)
                                           : kr_attn_layer(r, L, &r->S[il], n, pos0, ready, 0, err)) ||
            (rc = kr_pre_norm(r, 1, 0, n, L->post_norm, ffn, &ready, err)) ||
            (rc = L->is_moe ? kr_moe_layer(r, L, n, ready, err) : kr_ffn_layer(r, L, n, ready, err)))
            return rc;
    }
    const int64_t n_out = n - out0;
    /* rows [nrm, n) get the final norm: the output rows, or every row when
     * the nextn head primes from their hidden states (x row t - nrm holds
     * row t) */
    const int64_t nrm = r->prime && !r->capturing ? 0 : out0; /* taps need all_rows: out0 == 0 */
    mm_job head = {r->head, r->logits, V};
    if (nrm < n && r->fuse && c->n_main > 0) {
        /* only these rows get the last add: h of rows below nrm is
         * not read again (the next chunk uploads its own embeddings); the
         * float rows are stored too (K_NQ_X: the post-norm hidden state the
         * session hands out and snapshots keep; as the unfused rmsnorm
         * below writes them, the same bits) */
        if ((rc = kr_pre_norm(r, 1, nrm, n - nrm, r->output_norm, kr_act_flag(r->head) | K_NQ_X, &ready, err)) ||
            (rc = tap_copy(r, c->n_main - 1, n, err)))
            return rc;
    } else {
        if (c->n_main > 0 && ((rc = add_rows(r, r->y, r->h, n * E, err)) || (rc = tap_copy(r, c->n_main - 1, n, err))))
            return rc;
        if (nrm >= n) return 0;
        ready = 0;
        if ((rc = kr_rmsnorm(r, r->h + nrm * E, r->output_norm, r->x, E, n - nrm, E, E, err))) return rc;
    }
    if (out0 >= n) return 0;
    /* the LM head's rows start past the quantized ones: it quantizes its own (the same bits) */
    if (out0 > nrm) ready = 0;
    if ((rc = kr_matmul(r, r->x + (out0 - nrm) * E, E, n_out, &head, 1, ready, err))) return rc;
    if (want_argmax) {
        k_argmax_rows_params p = {K_TAG_OF(argmax_rows), (uint32_t)V, (uint32_t)n_out, (uint32_t)V, 0};
        k_binding b[] = {STATUS_BIND(argmax_rows), K_BIND(argmax_rows, p, &p, sizeof p),
                         K_BIND(argmax_rows, x, r->logits, F4(n_out * V)),
                         K_BIND(argmax_rows, idx, r->idx, 4 * (size_t)n_out * (1 + K_TOPK_MAX))};
        /* one threadgroup per row: the widest (1024) scans a 248k vocabulary
         * in ~55 us on the H200, 256 threads took 333 us */
        if ((rc = kr_launch(r, K_ID_argmax_rows, (uint32_t)n_out, 1, 1, 1024, b, 4, err))) return rc;
    }
    return 0;
}

static int check_rows(const k_runner *r, const int32_t *tokens, int64_t n, ds4_error *err) {
    if (!r || !tokens || n <= 0) return ds4_fail(err, DS4_ERR_ARG, "k_runner: no tokens");
    if (r->n_past + n > r->n_ctx)
        return ds4_fail(err, DS4_ERR_ARG, "%lld tokens at position %lld run past the context (%lld)",
                        (long long)n, (long long)r->n_past, (long long)r->n_ctx);
    for (int64_t t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= r->c.n_vocab)
            return ds4_fail(err, DS4_ERR_ARG, "token %d at row %lld is outside the vocabulary (%lld)",
                            tokens[t], (long long)t, (long long)r->c.n_vocab);
    return 0;
}

/* Wait for the launches, then the status word every kernel raises into. */
int kr_finish(k_runner *r, ds4_error *err) {
    uint32_t st[2] = {0, 0};
    if (r->dev->sync(r->dev) || r->dev->download(r->dev, st, r->status, sizeof st))
        return ds4_fail(err, DS4_ERR_INTERNAL, "%s: %s", r->dev->name, r->dev->err);
    if (st[0])
        return ds4_fail(err, DS4_ERR_INTERNAL, "%s: a kernel raised status 0x%x (tag 0x%x)", r->dev->name, st[0],
                        st[1]);
    return 0;
}

static int run_rows(k_runner *r, const int32_t *tokens, int64_t n, int all_rows, float *logits, int32_t *argmax,
                    float *hidden, ds4_error *err) {
    r->launches = 0;
    r->chain_next = 0; /* the rows overwrite x: a sampled draft chain ends */
    const int64_t V = r->c.n_vocab;
    int rc = 0;
    /* all rows' logits: OUT_ROWS a chunk (the logits scratch); else the
     * prefill chunk (only the last row has outputs) */
    const int64_t step = all_rows ? OUT_ROWS : r->prefill_chunk;
    for (int64_t c0 = 0; c0 < n && !rc; c0 += step) {
        const int64_t cn = n - c0 < step ? n - c0 : step;
        const int last = c0 + cn == n;
        int64_t out0 = all_rows ? 0 : last ? cn - 1 : cn;
        rc = eval_chunk(r, tokens + c0, cn, r->n_past + c0, c0, out0, logits ? logits + (all_rows ? c0 * V : 0) : NULL,
                        argmax ? argmax + (all_rows ? c0 : 0) : NULL,
                        hidden ? hidden + (all_rows ? c0 * r->c.n_embd : 0) : NULL, err);
    }
    if (!rc) rc = kr_finish(r, err);
    /* A failed call leaves device state part-written: the runner is then
     * only good for closing (the session layer will restore a snapshot). */
    return rc;
}

int k_runner_eval(k_runner *r, const int32_t *tokens, int64_t n, int all_rows, float *logits,
                  int32_t *argmax, ds4_error *err) {
    return k_runner_eval_hidden(r, tokens, n, all_rows, logits, argmax, NULL, err);
}

int k_runner_eval_hidden(k_runner *r, const int32_t *tokens, int64_t n, int all_rows, float *logits,
                         int32_t *argmax, float *hidden, ds4_error *err) {
    return k_runner_eval_taps(r, tokens, n, all_rows, logits, argmax, hidden, NULL, 0, NULL, err);
}

int k_runner_eval_taps(k_runner *r, const int32_t *tokens, int64_t n, int all_rows, float *logits, int32_t *argmax,
                       float *hidden, const int64_t *layers, int64_t n_layers, float *taps, ds4_error *err) {
    int rc = check_rows(r, tokens, n, err);
    if (!rc) rc = tap_begin(r, all_rows, layers, n_layers, taps, err);
    /* an eval right after a verify keeps all its rows: the head gets them first */
    if (!rc && r->ver_n && r->prime) {
        r->launches = 0;
        if (!(rc = kr_head_commit_verify(r, r->ver_n, err))) rc = kr_finish(r, err);
    }
    if (!rc) rc = run_rows(r, tokens, n, all_rows, logits, argmax, hidden, err);
    tap_end(r);
    if (!rc) {
        r->n_past += n;
        r->ver_n = 0;
        r->carry_ok = r->prime; /* kr_head_prime_chunk kept the last row's hidden */
        /* the head wrote the last chunk's output rows from row 0: all of
         * them (all_rows), else only the last */
        r->last_row = all_rows ? (n - 1) % OUT_ROWS : 0;
    }
    return rc;
}

/* The GDN layers' state is copied aside before the rows and their inputs
 * kept; accept(k) restores the copy and replays k rows through the same
 * two kernels with the same inputs, so the state equals the one k serial
 * rows leave, bit for bit. K/V rows past the accepted ones are left in the
 * pages and overwritten by the next rows (attention reads positions below
 * each row's own). */
int k_runner_verify(k_runner *r, const int32_t *tokens, int64_t n, float *logits, int32_t *argmax,
                    ds4_error *err) {
    return k_runner_verify_taps(r, tokens, n, logits, argmax, NULL, NULL, 0, NULL, err);
}

int k_runner_verify_taps(k_runner *r, const int32_t *tokens, int64_t n, float *logits, int32_t *argmax,
                         float *hidden, const int64_t *layers, int64_t n_layers, float *taps, ds4_error *err) {
    if (n < 1 || n > K_RUNNER_VERIFY_MAX)
        return ds4_fail(err, DS4_ERR_ARG, "verify takes 1 to %d tokens (got %lld)", K_RUNNER_VERIFY_MAX,
                        (long long)n);
    int rc = check_rows(r, tokens, n, err);
    if (!rc) rc = tap_begin(r, 1, layers, n_layers, taps, err);
    /* the verify's rows sit right after the carry in hrows: the deferred
     * rows go to the head first */
    if (!rc && r->prime) rc = kr_head_flush(r, err);
    const ds4_model_config *c = &r->c;
    const size_t conv = F4((c->ssm_conv_kernel - 1) * conv_dim(c)),
                 ssm = F4(c->ssm_n_v * c->ssm_d_state * c->ssm_d_state);
    /* the fused loop's gdn_seq reads the conv state's half conv_cur and
     * writes the other, so the pre-verify conv state stays where it is
     * (accept points conv_cur back at it); the unfused gdn_conv shifts it
     * in place, so there it is copied aside like the recurrent state */
    for (int64_t il = 0; il < c->n_main && !rc; il++) {
        dev_state *S = &r->S[il];
        if (r->L[il].kind != DS4_LAYER_GDN) continue;
        S->conv_pre = S->conv_cur;
        if ((!r->fuse && (rc = kr_copy_dev(r, S->conv_bak, conv_now(S, c), conv, err))) ||
            (rc = kr_copy_dev(r, S->ssm_bak, S->ssm, ssm, err)))
            break;
    }
    if (rc) {
        tap_end(r);
        return rc;
    }
    r->capturing = 1;
    rc = run_rows(r, tokens, n, 1, logits, argmax, hidden, err);
    r->capturing = 0;
    tap_end(r);
    /* the rows reach the nextn head when accepted: keep their tokens and
     * post-norm hidden rows (x rows [0, n)) after the carry in hrows */
    if (!rc && r->prime) rc = kr_copy_dev(r, r->hrows + r->c.n_embd, r->x, F4(n * r->c.n_embd), err);
    if (rc) return rc;
    memcpy(r->ver_tok, tokens, sizeof(int32_t) * (size_t)n);
    r->ver_n = n;
    r->ver_pos = r->n_past;
    r->n_past += n;
    r->last_row = n - 1; /* n <= K_RUNNER_VERIFY_MAX <= OUT_ROWS: one chunk */
    return 0;
}

int k_runner_accept(k_runner *r, int64_t k, ds4_error *err) {
    if (!r || r->ver_n == 0)
        return ds4_fail(err, DS4_ERR_ARG, "accept(%lld) without a verify to accept", (long long)k);
    if (k < 1 || k > r->ver_n)
        return ds4_fail(err, DS4_ERR_ARG, "accept(%lld): k must be in 1..%lld, the rows of the last verify",
                        (long long)k, (long long)r->ver_n);
    int rc = 0;
    r->launches = 0;
    r->chain_next = 0;
    if (k < r->ver_n) {
        const ds4_model_config *c = &r->c;
        const int64_t cd = conv_dim(c), vd = c->ssm_d_inner, nv = c->ssm_n_v, W = cd + vd + 2 * nv;
        const size_t conv = F4((c->ssm_conv_kernel - 1) * cd), ssm = F4(nv * c->ssm_d_state * c->ssm_d_state);
        for (int64_t il = 0; il < c->n_main && !rc; il++) {
            dev_state *S = &r->S[il];
            if (r->L[il].kind != DS4_LAYER_GDN) continue;
            S->conv_cur = S->conv_pre; /* the pre-verify conv state (see verify) */
            if ((!r->fuse && (rc = kr_copy_dev(r, conv_now(S, c), S->conv_bak, conv, err))) ||
                (rc = kr_copy_dev(r, S->ssm, S->ssm_bak, ssm, err)))
                break;
#ifndef PLANT_ACCEPT_NO_REPLAY /* planted fault (tests must turn red): keep the pre-verify state */
            unsigned unused;
            if (r->fuse) /* the k kept rows in one gdn_seq launch: the bits of k gdn_token calls (no out projection) */
                rc = gdn_seq(r, &r->L[il], S, S->cap_in, k, r->o, 0u, &unused, err);
            for (int64_t t = 0; t < k && !rc && !r->fuse; t++)
                rc = gdn_token(r, &r->L[il], S, S->cap_in + t * W, S->cap_in + t * W + cd, S->cap_in + t * W + cd + vd,
                               r->o, err);
#endif
        }
    }
    if (!rc && r->prime) rc = kr_head_commit_verify(r, k, err); /* the k kept rows reach the head */
    if (!rc && r->launches) rc = kr_finish(r, err);
    if (rc) return rc;
    r->carry_ok = r->prime;
    r->n_past = r->ver_pos + k;
    r->ver_n = 0;
    r->last_row = k - 1; /* the replay writes no logits: the verify's row k-1 is still there */
    return 0;
}

/* ------------------------------------------------------- snapshots -- */

/* A session's state, copied into ONE device allocation (layout: per layer
 * in order, a GDN layer's conv state then its recurrent state, an
 * attention layer's K pages then its V pages [0, np); then the logits row
 * and the post-norm hidden row of position n_past - 1 when there is one).
 *
 * Why a device copy and not a host copy or shared pages: restore is then
 * device-to-device copies only (the very `copy` the verify backup uses: on
 * CUDA an ordered cudaMemcpyAsync at HBM speed, on Metal a blit), nothing
 * crosses the bus, and the session's KV pools stay one buffer per layer,
 * as the kernels address them. Shared copy-on-write pages (what the CPU's
 * kv.c does, and what the page table was laid out for: docs/gpu.md §1)
 * would need one device page pool per model with reference counts; until
 * then a snapshot costs its pages' bytes, and its nbytes says so (the
 * prefix cache charges exactly that). Whole pages are copied (the rows
 * past n_past in the last one are never read: attention reads positions
 * below each row's own, and the next rows are written before they are
 * read). Every size and offset is a multiple of 4 bytes (Metal's blit
 * rule on macOS). */
struct k_snapshot {
    k_gpu_model *gm;
    void *buf;
    uint64_t bytes;
    int64_t n_past, np;
    int has_row; /* the logits and hidden rows of position n_past - 1 are kept */
    int head;    /* the nextn head's KV of positions [1, n_past) is kept (runner_head.c) */
    int64_t hnp; /* its pages */
};

static size_t kv_page_bytes(const ds4_model_config *c) {
    return (size_t)c->n_head_kv * K_ATTN_BLOCK * (size_t)c->head_dim * 2;
}

static size_t gdn_conv_bytes(const ds4_model_config *c) { return F4((c->ssm_conv_kernel - 1) * conv_dim(c)); }
static size_t gdn_ssm_bytes(const ds4_model_config *c) { return F4(c->ssm_n_v * c->ssm_d_state * c->ssm_d_state); }

static uint64_t snap_bytes(const k_gpu_model *g, const k_snapshot *sn) {
    const ds4_model_config *c = &g->c;
    uint64_t b = 0;
    for (int64_t il = 0; il < c->n_main; il++)
        b += g->L[il].kind == DS4_LAYER_GDN ? gdn_conv_bytes(c) + gdn_ssm_bytes(c)
                                            : 2 * (uint64_t)sn->np * kv_page_bytes(c);
    return b + (sn->has_row ? F4(c->n_vocab + c->n_embd) : 0) + 2 * (uint64_t)sn->hnp * kv_page_bytes(c);
}

/* One copy between the session and the snapshot: save copies the session's
 * bytes into the snapshot, else back. */
static int snap_xfer(k_runner *r, int save, void *snap, void *state, size_t bytes, ds4_error *err) {
    if (!bytes) return 0;
    return save ? kr_copy_dev(r, snap, state, bytes, err) : kr_copy_dev(r, state, snap, bytes, err);
}

/* Both directions walk the layout here, so snapshot and restore cannot
 * disagree on it. The last row (logits, and hidden from x): saved from
 * `last_row`, restored to row 0. */
static int snap_walk(k_runner *r, const k_snapshot *sn, int save, ds4_error *err) {
    const ds4_model_config *c = &r->c;
    const size_t conv = gdn_conv_bytes(c), ssm = gdn_ssm_bytes(c), kv = (size_t)sn->np * kv_page_bytes(c);
    char *p = sn->buf;
    int rc = 0;
    for (int64_t il = 0; il < c->n_main && !rc; il++) {
        dev_state *S = &r->S[il];
        if (r->L[il].kind == DS4_LAYER_GDN) {
#ifdef PLANT_SNAPSHOT_NO_GDN /* planted fault: restore keeps the session's GDN state (tests/test_gpu_snapshot.py turns red) */
            if (!save) {
                p += conv + ssm;
                continue;
            }
#endif
            if (!(rc = snap_xfer(r, save, p, conv_now(S, c), conv, err)))
                rc = snap_xfer(r, save, p + conv, S->ssm, ssm, err);
            p += conv + ssm;
        } else {
            if (!(rc = snap_xfer(r, save, p, S->kpool, kv, err))) rc = snap_xfer(r, save, p + kv, S->vpool, kv, err);
            p += 2 * kv;
        }
    }
    if (!rc && sn->has_row) {
        const int64_t row = save ? r->last_row : 0;
        float *hid = save ? kr_hidden_row(r) : r->x;
        if (!(rc = snap_xfer(r, save, p, r->logits + row * c->n_vocab, F4(c->n_vocab), err)))
            rc = snap_xfer(r, save, p + F4(c->n_vocab), hid, F4(c->n_embd), err);
        /* the head's carry is the same row */
        if (!rc && !save && sn->head) rc = snap_xfer(r, 0, p + F4(c->n_vocab), r->hrows, F4(c->n_embd), err);
        p += F4(c->n_vocab + c->n_embd);
    }
    if (!rc && sn->head) {
        const size_t hkv = (size_t)sn->hnp * kv_page_bytes(c);
        if (!(rc = snap_xfer(r, save, p, r->hS.kpool, hkv, err))) rc = snap_xfer(r, save, p + hkv, r->hS.vpool, hkv, err);
    }
    if (!rc && r->dev->sync(r->dev)) rc = ds4_fail(err, DS4_ERR_INTERNAL, "%s: %s", r->dev->name, r->dev->err);
    return rc;
}

int k_runner_snapshot(k_runner *r, k_snapshot **out, ds4_error *err) {
    if (!out) return ds4_fail(err, DS4_ERR_ARG, "k_runner_snapshot: out is NULL");
    *out = NULL;
    if (!r) return ds4_fail(err, DS4_ERR_ARG, "k_runner_snapshot: session is NULL");
    int rc0 = r->h_pend ? kr_head_flush(r, err) : 0; /* the head caught up: its KV is what a snapshot keeps */
    if (rc0) return rc0;
    k_snapshot *sn = calloc(1, sizeof *sn);
    if (!sn) return ds4_fail(err, DS4_ERR_NOMEM, "out of host memory");
    sn->gm = r->gm;
    sn->n_past = r->n_past;
    sn->np = (r->n_past + K_ATTN_BLOCK - 1) / K_ATTN_BLOCK;
    sn->has_row = r->n_past > 0 && r->last_row >= 0;
    /* the head's history when it is complete (a verify not yet accepted
     * has rows the head has not seen: then the snapshot has none) */
    sn->head = sn->has_row && r->carry_ok && !r->ver_n && r->h_next >= r->n_past;
    sn->hnp = sn->head ? (r->n_past - 1 + K_ATTN_BLOCK - 1) / K_ATTN_BLOCK : 0;
    sn->bytes = snap_bytes(r->gm, sn);
    sn->buf = r->dev->alloc(r->dev, (size_t)sn->bytes);
    if (!sn->buf) {
        const unsigned long long want = (unsigned long long)sn->bytes;
        free(sn);
        return ds4_fail(err, DS4_ERR_NOMEM, "%s: cannot allocate a snapshot of %llu bytes: %s", r->dev->name,
                        want, r->dev->err);
    }
    const int rc = snap_walk(r, sn, 1, err);
    if (rc) {
        r->dev->release(r->dev, sn->buf);
        free(sn);
        return rc;
    }
    r->gm->n_snaps++;
    r->gm->snap_bytes += sn->bytes;
    *out = sn;
    return ds4_ok(err);
}

int k_runner_restore(k_runner *r, const k_snapshot *sn, ds4_error *err) {
    if (!r || !sn) return ds4_fail(err, DS4_ERR_ARG, "k_runner_restore: session or snapshot is NULL");
    if (sn->gm != r->gm)
        return ds4_fail(err, DS4_ERR_ARG,
                        "snapshot was taken from a session of another model; a snapshot restores only "
                        "into sessions of the model it came from");
    if (sn->n_past > r->n_ctx)
        return ds4_fail(err, DS4_ERR_ARG, "the snapshot holds %lld positions, more than this session's context (%lld)",
                        (long long)sn->n_past, (long long)r->n_ctx);
    if (r->prime && sn->n_past > 0 && !sn->head)
        return ds4_fail(err, DS4_ERR_ARG,
                        "the snapshot has no nextn head history; a session whose head is primed restores only "
                        "snapshots taken with the head caught up");
    r->chain_next = 0;
    int rc = sn->head ? kr_head_session(r, err) : 0;
    if (!rc) rc = snap_walk(r, sn, 0, err);
    if (rc) return rc; /* device state part-written: the session is only good for closing */
    r->n_past = sn->n_past;
    r->ver_n = 0; /* a pending verify belongs to the old state: accept now refuses */
    r->last_row = sn->has_row ? 0 : -1;
    r->carry_ok = sn->head;
    r->h_next = sn->head ? sn->n_past : 0;
    r->h_pend = 0;
    return 0;
}

void k_snapshot_free(k_snapshot *sn) {
    if (!sn) return;
    sn->gm->dev->release(sn->gm->dev, sn->buf);
    sn->gm->n_snaps--;
    sn->gm->snap_bytes -= sn->bytes;
    free(sn);
}

int64_t k_snapshot_n_past(const k_snapshot *sn) { return sn ? sn->n_past : 0; }
uint64_t k_snapshot_device_bytes(const k_snapshot *sn) { return sn ? sn->bytes : 0; }
int k_snapshot_has_logits(const k_snapshot *sn) { return sn ? sn->has_row : 0; }
int k_snapshot_nextn_covered(const k_snapshot *sn) { return sn ? sn->head || sn->n_past == 0 : 0; }
uint64_t k_gpu_model_snapshot_bytes(const k_gpu_model *g) { return g ? g->snap_bytes : 0; }
int64_t k_gpu_model_snapshots(const k_gpu_model *g) { return g ? g->n_snaps : 0; }

/* The last row's logits (hidden = 0) or post-norm hidden state (1). */
static int last_row_out(k_runner *r, int hidden, float *out, ds4_error *err) {
    if (!r || !out) return ds4_fail(err, DS4_ERR_ARG, "k_runner_last_logits/hidden: session or out is NULL");
    if (r->last_row < 0) return ds4_fail(err, DS4_ERR_ARG, "no evaluated row: the session holds no last row");
    const int64_t w = hidden ? r->c.n_embd : r->c.n_vocab;
    if (r->dev->download(r->dev, out, hidden ? kr_hidden_row(r) : r->logits + r->last_row * w, F4(w)))
        return ds4_fail(err, DS4_ERR_INTERNAL, "%s download: %s", r->dev->name, r->dev->err);
    return 0;
}

int k_runner_last_logits(k_runner *r, float *out, ds4_error *err) { return last_row_out(r, 0, out, err); }
int k_runner_last_hidden(k_runner *r, float *out, ds4_error *err) { return last_row_out(r, 1, out, err); }
