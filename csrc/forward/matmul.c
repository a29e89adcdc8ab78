/*
 * matmul.c — y = W x over rows of tokens.
 *
 * Each output element y[r][o] is one call of the weight type's dot kernel
 * on weight row o and activation row r, the same kernel for every row, so
 * its reduction order is fixed and independent of the batch, the chunk and
 * the thread count. Work is split over tiles of output rows (a weight row
 * is read once per tile and reused for every token row of the chunk).
 *
 * Precision seam: EXACT dots float activations against the weights
 * (kernel set vec_dot_f32). FAST (not built yet) will quantize each
 * activation row once to the type's vec_dot_type with from_float, as
 * llama.cpp does (qwen35-spec.md §10), and call vec_dot instead; that
 * quantization is per row, so it keeps batch invariance.
 */
#include "forward.h"

/* Output rows per work item: small enough to spread a decode step's
 * matrices over the threads, large enough to amortise the dispatch. */
#define MM_TILE 8

ds4_mm_job ds4_mm(const ds4_tensor *t, int64_t expert, int64_t row0, int64_t n_out,
                  const float *x, int64_t x_stride, float *y, int64_t y_stride,
                  int64_t n_rows) {
    ds4_mm_job j;
    j.type = t->type;
    j.row_bytes = t->row_bytes;
    j.w = t->data + (size_t)expert * t->expert_bytes + (size_t)row0 * t->row_bytes;
    j.n_in = t->ne[0];
    j.n_out = n_out;
    j.x = x;
    j.x_stride = x_stride;
    j.x_idx = NULL;
    j.y = y;
    j.y_stride = y_stride;
    j.y_idx = NULL;
    j.n_rows = n_rows;
    return j;
}

typedef struct {
    const ds4_mm_job *jobs;
    int n_jobs;
    int64_t tile_start[64 + 1]; /* first item of each job; jobs per call are few */
    const ds4_kernel_set *k;
} mm_ctx;

static void mm_items(void *vctx, int64_t i0, int64_t i1, int ith) {
    (void)ith;
    const mm_ctx *c = vctx;
    int j = 0;
    for (int64_t it = i0; it < i1; it++) {
        while (it >= c->tile_start[j + 1]) j++;
        const ds4_mm_job *jb = &c->jobs[j];
        ds4_vec_dot_fn dot = c->k->vec_dot_f32[jb->type];
        int64_t o0 = (it - c->tile_start[j]) * MM_TILE;
        int64_t o1 = o0 + MM_TILE < jb->n_out ? o0 + MM_TILE : jb->n_out;
        for (int64_t o = o0; o < o1; o++) {
            const uint8_t *w = jb->w + (size_t)o * jb->row_bytes;
            for (int64_t r = 0; r < jb->n_rows; r++) {
                const float *x = jb->x + (jb->x_idx ? jb->x_idx[r] : r) * jb->x_stride;
                float *y = jb->y + (jb->y_idx ? jb->y_idx[r] : r) * jb->y_stride;
                float s = 0.0f;
                dot(jb->n_in, &s, w, x);
                y[o] = s;
            }
        }
    }
}

void ds4_matmul(ds4_fwd *f, const ds4_mm_job *jobs, int n_jobs) {
    /* Callers batch at most a handful of jobs (q/k/v, gate/up, one per expert);
     * larger lists go in slices of 64. */
    while (n_jobs > 0) {
        int nj = n_jobs < 64 ? n_jobs : 64;
        mm_ctx c;
        c.jobs = jobs;
        c.n_jobs = nj;
        c.k = f->k;
        c.tile_start[0] = 0;
        for (int j = 0; j < nj; j++) {
            int64_t tiles = jobs[j].n_rows > 0 ? (jobs[j].n_out + MM_TILE - 1) / MM_TILE : 0;
            c.tile_start[j + 1] = c.tile_start[j] + tiles;
        }
        ds4_pool_for(f->pool, c.tile_start[nj], mm_items, &c);
        jobs += nj;
        n_jobs -= nj;
    }
}
