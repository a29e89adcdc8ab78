/*
 * matmul.c — y = W x over rows of tokens.
 *
 * Each output element y[r][o] is one call of the weight type's dot kernel
 * on weight row o and activation row r, the same kernel for every row, so
 * its reduction order is fixed and independent of the batch, the chunk and
 * the thread count. Work is split over tiles of output rows (a weight row
 * is read once per tile and reused for every token row of the chunk).
 *
 * Precision seam.
 *  EXACT: float activations against the weights (kernel set vec_dot_f32).
 *  FAST:  llama.cpp's CPU pairing (ggml-cpu.c type_traits_cpu, qwen35-spec.md
 *         §10): every activation row is first converted ONCE to the weight
 *         type's vec_dot_type with the kernel set's from_float (Q8_0 for
 *         Q4_0/Q5_0/Q8_0/IQ4_NL/Q4_64A/Q2_64A, Q8_1 for Q4_1/Q5_1, Q8_K for
 *         the K-quants and IQ4_XS, F16 for F16, BF16 for BF16), then every
 *         output is the paired integer/half dot (vec_dot). F32 weights keep
 *         F32 activations (their vec_dot_type is F32), so the router stays
 *         F32 as in llama.cpp. The quantization is per row, so it keeps batch
 *         invariance; its buffer (f->mm_q) is sized at init.
 * Jobs of one call that read the same activation rows at the same
 * vec_dot_type (q/k/v, gate/up, the experts of a MoE layer) share one
 * quantized copy.
 *
 * Multi-row kernels. Where the kernel set has dot_rows for a weight type
 * (quants.h), a work item dots each weight row against all its token rows
 * in one call, which reads and decodes every weight block once for all of
 * them instead of once per row; such a job's activation source is stored
 * in the kernel's rows layout (pack_rows, e.g. Q8X), packed right after the
 * per-row quantization. dot_rows is bit-identical to vec_dot row by row,
 * so this changes no value: a row's result still depends on that row only.
 */
#include "forward.h"
#include "../paths.h"

#include <stdio.h>
#include <string.h>

/* Output rows per work item: small enough to spread a decode step's
 * matrices over the threads, large enough to amortise the dispatch. */
#define MM_TILE 8
/* A GEMM's (n_rows > 1) work item: 16 outputs, so each token row's results
 * of an item are one whole 64-byte line of y, written once (with 8, every
 * line of y was fetched and written by two items). A job whose tile kernel
 * asks for more weight rows per call (quants.h dot_tile_out) gets items of
 * that many: the AVX-512 Q4_K panel, built once per call, then serves 128
 * weight rows (bench/bench_rows.py, Q4_K 512 x 2048, 16 rows, one thread:
 * 3.59 ns per 256 weights x row before the panel, 2.93 with the panel
 * built per 16 weight rows, 2.33 per 64; avx512.c K4_OUT for 128). Other
 * jobs keep 16: items of 64
 * for every GEMM spread a demo-model verify's small matrices over too few
 * items (drafting rounds per request fell by half, bench/spec_policy_ab.py). */
#define MM_GEMM_TILE 16
/* The widest item of a job without a tile kernel. */
#define MM_ROWS_ITEM (MM_GEMM_TILE > MM_TILE ? MM_GEMM_TILE : MM_TILE)
/* Jobs per dispatch; longer lists go in slices (one expert = two jobs). */
#define MM_MAX_JOBS 64
/* Token rows per dot_rows call (the kernels take them in their own groups
 * of 4 or 8), so the call's activation rows stay in L1 while the tile's
 * weight rows pass over them; a dot_tile call takes ds4_tile_rows (quants.h:
 * 16, or what the set asks for: the AVX-512 Q4_K bands prepare each weight
 * row once per call and share it among 64). */
#define MM_ROWS_CALL 16
/* Values quantized per piece before packing (whole Q8_0 block pairs). */
#define MM_PACK_PIECE 256
/* Software prefetch distance in weight bytes. A decode step streams every
 * weight once, and the hardware prefetcher alone does not keep a thread's
 * stream ahead of the kernels: timing one decode step's matvecs over the
 * real weights of the 0.8B Q4_K_M bench model (2 threads, AVX-512, 2-core
 * Xeon VM whose read bandwidth measures 21.5 GB/s), they ran at 13-16 GB/s
 * without, ~20 GB/s with the lines 1 KiB ahead and ~22.7 GB/s with 4 KiB
 * (8 KiB: no better) requested while the current row is computed.
 * Prefetches never fault and never change a value. */
#define MM_PREFETCH_BYTES DS4_WEIGHT_PREFETCH_BYTES

/* Ask for the cache lines of [row, row + row_bytes) MM_PREFETCH_BYTES ahead,
 * clipped to the matrix end (nothing past the job's weights is touched). */
static inline void prefetch_ahead(const uint8_t *row, size_t row_bytes, const uint8_t *end) {
    const uint8_t *p = row + MM_PREFETCH_BYTES, *q = p + row_bytes;
    if (q > end) q = end;
    for (; p < q; p += 64) __builtin_prefetch(p, 0, 3);
}

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

/* Bytes of one activation row of n values stored as `type`. */
static size_t act_row_bytes(int type, int64_t n) {
    const ds4_type_traits *t = &ds4_type_traits_table[type];
    return (size_t)(n / t->block_size) * (size_t)t->type_size;
}

size_t ds4_mm_act_row_bytes(int weight_type, int64_t n_in) {
    const int vdt = ds4_type_traits_table[weight_type].vec_dot_type;
    if (vdt == DS4_TYPE_F32 || vdt < 0) return 0;
    const size_t plain = act_row_bytes(vdt, n_in);
    /* the forward runs the AUTO set (forward.c), whose rows layout may be larger */
    const ds4_kernel_set *k = ds4_kernels_for(DS4_ISA_AUTO);
    const size_t rows = k ? ds4_rows_act_bytes(k, weight_type, n_in) : 0;
    return rows > plain ? rows : plain;
}

/* One quantized activation source: rows [0, n_rows) of x (stride x_stride,
 * n_in values each) converted to `type`, row r at q + r*q_stride. */
typedef struct {
    const float *x;
    int64_t x_stride, n_in, n_rows;
    int type;
    ds4_pack_rows_fn pack; /* non-NULL: rows stored in this packer's layout */
    uint8_t *q;
    size_t q_stride;
} mm_src;

typedef struct {
    const ds4_mm_job *jobs;
    int n_jobs;
    int64_t tile_start[MM_MAX_JOBS + 1]; /* first item of each job */
    const ds4_kernel_set *k;
    /* per job: the dot kernel and, in fast precision, its activation rows */
    ds4_vec_dot_fn dot[MM_MAX_JOBS];
    ds4_dot_rows_fn rows[MM_MAX_JOBS]; /* non-NULL: the multi-row kernel instead */
    ds4_dot_tile_fn tile[MM_MAX_JOBS]; /* non-NULL: ... several weight rows per call */
    const uint8_t *act[MM_MAX_JOBS]; /* NULL: the job's float x rows */
    size_t act_stride[MM_MAX_JOBS];
    /* quantization items: row `it - src_start[s]` of source s */
    mm_src src[DS4_MM_SOURCES];
    int n_src;
    int64_t src_start[DS4_MM_SOURCES + 1];
} mm_ctx;

static void quant_items(void *vctx, int64_t i0, int64_t i1, int ith) {
    (void)ith;
    const mm_ctx *c = vctx;
    int s = 0;
    for (int64_t it = i0; it < i1; it++) {
        while (it >= c->src_start[s + 1]) s++;
        const mm_src *sr = &c->src[s];
        const int64_t r = it - c->src_start[s];
        const float *x = sr->x + r * sr->x_stride;
        uint8_t *q = sr->q + (size_t)r * sr->q_stride;
        if (!sr->pack) {
            c->k->from_float[sr->type](x, q, sr->n_in);
            continue;
        }
        /* Quantize a piece, then pack it (packed sources are Q8_0 rows in
         * the Q8X layout). Q8_0 quantization is per block, so a piece's
         * blocks equal the whole row's. */
        uint8_t tmp[MM_PACK_PIECE / 32 * sizeof(block_q8_0)];
        for (int64_t i = 0; i < sr->n_in; i += MM_PACK_PIECE) {
            const int64_t m = sr->n_in - i < MM_PACK_PIECE ? sr->n_in - i : MM_PACK_PIECE;
            c->k->from_float[sr->type](x + i, tmp, m);
            sr->pack(tmp, q + ds4_q8x_row_bytes(i), m);
        }
    }
}

/* Output rows of job j's work item (see MM_GEMM_TILE). */
static int64_t job_tile(const mm_ctx *c, int j) {
    const ds4_mm_job *jb = &c->jobs[j];
    if (jb->n_rows <= 1) return MM_TILE;
    const int64_t to = c->tile[j] ? ds4_tile_out(c->k, jb->type) : 0;
    return to > MM_GEMM_TILE ? to : MM_GEMM_TILE;
}

/* Item rows of a multi-row job: row chunks outer, so the chunk's activation
 * rows stay in cache while the tile's weight rows pass over them. A chunk's
 * results are gathered in sb and stored row by row (contiguous runs of y)
 * instead of one float per row and output. */
/* The activation rows r0 .. r0+nr of job j. */
static void rows_ptrs(const mm_ctx *c, int j, int64_t r0, int nr, const void **ptr) {
    const ds4_mm_job *jb = &c->jobs[j];
    for (int r = 0; r < nr; r++) {
        const int64_t xr = jb->x_idx ? jb->x_idx[r0 + r] : r0 + r;
        ptr[r] = c->act[j] + (size_t)xr * c->act_stride[j];
    }
}

/* Outputs o0..o1 of rows r0 .. r0+nr, gathered in sb (row stride sbs), to y. */
static void rows_store(const ds4_mm_job *jb, int64_t r0, int nr, const float *sb, int64_t sbs,
                       int64_t o0, int64_t o1) {
    for (int r = 0; r < nr; r++) {
        const int64_t yr = jb->y_idx ? jb->y_idx[r0 + r] : r0 + r;
        memcpy(jb->y + yr * jb->y_stride + o0, sb + r * sbs, (size_t)(o1 - o0) * sizeof(float));
    }
}

/* A tile job's item: ds4_tile_rows activation rows and ds4_tile_out
 * weight rows per dot_tile call (quants.h), which prefetches as it goes:
 * the lines of 4 rows requested at once before the call (68 at 1024 Q8_0
 * inputs) made a decode of the 0.8B Q8_0 bench model 15% slower than one
 * row at a time. Its buffers are its own: the rows path below (every
 * decode matvec) keeps a frame of MM_ROWS_CALL rows (with the 64-row
 * buffers in one function, a decode step of the 0.8B Q4_K_M bench model
 * measured ~3% more CPU time, one thread). */
static void mm_tile_item(const mm_ctx *c, int j, int64_t o0, int64_t o1) {
    const ds4_mm_job *jb = &c->jobs[j];
    const void *ptr[DS4_TILE_ROWS_MAX];
    float sb[DS4_TILE_ROWS_MAX][DS4_TILE_OUT_MAX];
    const int64_t per_call = ds4_tile_rows(c->k, jb->type), to = ds4_tile_out(c->k, jb->type);
    for (int64_t r0 = 0; r0 < jb->n_rows; r0 += per_call) {
        const int nr = (int)(jb->n_rows - r0 < per_call ? jb->n_rows - r0 : per_call);
        rows_ptrs(c, j, r0, nr, ptr);
        for (int64_t o = o0; o < o1; o += to) {
            const int no = (int)(o1 - o < to ? o1 - o : to);
            c->tile[j](jb->n_in, no, nr, &sb[0][o - o0], DS4_TILE_OUT_MAX,
                       jb->w + (size_t)o * jb->row_bytes, jb->row_bytes, ptr);
        }
        rows_store(jb, r0, nr, &sb[0][0], DS4_TILE_OUT_MAX, o0, o1);
    }
}

/* A rows job's item (or a tile job's, see mm_items): row chunks outer, so
 * the chunk's activation rows stay in cache while the item's weight rows
 * pass over them. A chunk's results are gathered in sb and stored row by
 * row (contiguous runs of y) instead of one float per row and output. */
static void mm_rows_item(const mm_ctx *c, int j, int64_t o0, int64_t o1) {
    const ds4_mm_job *jb = &c->jobs[j];
    const void *ptr[MM_ROWS_CALL];
    float s[MM_ROWS_CALL];
    float sb[MM_ROWS_CALL][MM_ROWS_ITEM];
    const uint8_t *end = jb->w + (size_t)jb->n_out * jb->row_bytes;
    for (int64_t r0 = 0; r0 < jb->n_rows; r0 += MM_ROWS_CALL) {
        const int nr = (int)(jb->n_rows - r0 < MM_ROWS_CALL ? jb->n_rows - r0 : MM_ROWS_CALL);
        rows_ptrs(c, j, r0, nr, ptr);
        for (int64_t o = o0; o < o1; o++) {
            /* later row chunks find the item's weights in cache */
            if (r0 == 0) prefetch_ahead(jb->w + (size_t)o * jb->row_bytes, jb->row_bytes, end);
            c->rows[j](jb->n_in, nr, s, jb->w + (size_t)o * jb->row_bytes, ptr);
            for (int r = 0; r < nr; r++) sb[r][o - o0] = s[r];
        }
        rows_store(jb, r0, nr, &sb[0][0], MM_ROWS_ITEM, o0, o1);
    }
}

static void mm_items(void *vctx, int64_t i0, int64_t i1, int ith) {
    (void)ith;
    const mm_ctx *c = vctx;
    int j = 0;
    for (int64_t it = i0; it < i1; it++) {
        while (it >= c->tile_start[j + 1]) j++;
        const ds4_mm_job *jb = &c->jobs[j];
        const ds4_vec_dot_fn dot = c->dot[j];
        const uint8_t *act = c->act[j];
        const int64_t tile = job_tile(c, j);
        int64_t o0 = (it - c->tile_start[j]) * tile;
        int64_t o1 = o0 + tile < jb->n_out ? o0 + tile : jb->n_out;
        if (c->tile[j]) {
            mm_tile_item(c, j, o0, o1);
            continue;
        }
        if (c->rows[j]) {
            mm_rows_item(c, j, o0, o1);
            continue;
        }
        const uint8_t *end = jb->w + (size_t)jb->n_out * jb->row_bytes;
        for (int64_t o = o0; o < o1; o++) {
            const uint8_t *w = jb->w + (size_t)o * jb->row_bytes;
            prefetch_ahead(w, jb->row_bytes, end);
            for (int64_t r = 0; r < jb->n_rows; r++) {
                const int64_t xr = jb->x_idx ? jb->x_idx[r] : r;
                const void *x = act ? (const void *)(act + (size_t)xr * c->act_stride[j])
                                    : (const void *)(jb->x + xr * jb->x_stride);
                float *y = jb->y + (jb->y_idx ? jb->y_idx[r] : r) * jb->y_stride;
                float s = 0.0f;
                dot(jb->n_in, &s, w, x);
                y[o] = s;
            }
        }
    }
}

/* Activation rows a job reads: [0, rows). */
static int64_t job_rows(const ds4_mm_job *jb) {
    if (!jb->x_idx) return jb->n_rows;
    int64_t mx = -1;
    for (int64_t r = 0; r < jb->n_rows; r++)
        if (jb->x_idx[r] > mx) mx = jb->x_idx[r];
    return mx + 1;
}

/* Bytes of one row of a source at `type`, packed by `pack` (Q8X, the one
 * packed rows layout, quants.h) or plain. */
static size_t src_row_bytes(int type, ds4_pack_rows_fn pack, int64_t n) {
    return pack ? ds4_q8x_row_bytes(n) : act_row_bytes(type, n);
}

/* Bytes the sources of c would take if job jb joined them (0 if it needs
 * none); *match is the source it would share, or -1 for a new one. */
static size_t src_bytes_with(const mm_ctx *c, const ds4_mm_job *jb, int vdt,
                             ds4_pack_rows_fn pack, int *match) {
    const int64_t rows = job_rows(jb);
    size_t total = 0;
    *match = -1;
    for (int s = 0; s < c->n_src; s++) {
        const mm_src *sr = &c->src[s];
        int64_t r = sr->n_rows;
        if (sr->x == jb->x && sr->x_stride == jb->x_stride && sr->n_in == jb->n_in &&
            sr->type == vdt && sr->pack == pack) {
            *match = s;
            if (rows > r) r = rows;
        }
        total += (size_t)r * src_row_bytes(sr->type, sr->pack, sr->n_in);
    }
    if (*match < 0) total += (size_t)rows * src_row_bytes(vdt, pack, jb->n_in);
    return total;
}

/* Quantize the sources, point the jobs at them, run the dots. */
static void dispatch(ds4_fwd *f, mm_ctx *c, const int *job_src) {
    if (c->n_src > 0) {
        uint8_t *q = f->mm_q;
        c->src_start[0] = 0;
        for (int s = 0; s < c->n_src; s++) {
            mm_src *sr = &c->src[s];
            sr->q = q;
            sr->q_stride = src_row_bytes(sr->type, sr->pack, sr->n_in);
            q += (size_t)sr->n_rows * sr->q_stride;
            c->src_start[s + 1] = c->src_start[s] + sr->n_rows;
        }
        ds4_pool_for(f->pool, c->src_start[c->n_src], quant_items, c);
    }
    c->tile_start[0] = 0;
    for (int j = 0; j < c->n_jobs; j++) {
        const ds4_mm_job *jb = &c->jobs[j];
        if (job_src[j] >= 0) {
            c->act[j] = c->src[job_src[j]].q;
            c->act_stride[j] = c->src[job_src[j]].q_stride;
        }
        const int64_t tiles = jb->n_rows > 0 ? (jb->n_out + job_tile(c, j) - 1) / job_tile(c, j) : 0;
        c->tile_start[j + 1] = c->tile_start[j] + tiles;
        if (jb->n_rows > 0) f->cnt.weight_bytes += (uint64_t)jb->n_out * jb->row_bytes;
    }
    ds4_pool_for(f->pool, c->tile_start[c->n_jobs], mm_items, c);
}

/* DS4PY_PATHS: the kernel each job of this dispatch runs. */
static void note_paths(const ds4_fwd *f, const mm_ctx *c) {
    for (int j = 0; j < c->n_jobs; j++) {
        const ds4_mm_job *jb = &c->jobs[j];
        if (jb->n_rows <= 0) continue;
        char op[48], var[192];
        snprintf(op, sizeof op, "%s %s%s", jb->n_rows > 1 ? "gemm" : "matvec",
                 ds4_type_traits_table[jb->type].name, jb->x_idx ? " (experts)" : "");
        if (c->rows[j])
            snprintf(var, sizeof var, "%s, prefetch %d B", f->k->dot_rows_name[jb->type],
                     MM_PREFETCH_BYTES);
        else
            snprintf(var, sizeof var, "%s %s, one row per call, prefetch %d B", f->k->isa_name,
                     f->fast ? "vec_dot" : "vec_dot_f32", MM_PREFETCH_BYTES);
        ds4_path_note(f->path_layer, op, var);
    }
}

void ds4_matmul(ds4_fwd *f, const ds4_mm_job *jobs, int n_jobs) {
    mm_ctx c;
    int job_src[MM_MAX_JOBS];
    c.k = f->k;
    while (n_jobs > 0) {
        c.jobs = jobs;
        c.n_jobs = 0;
        c.n_src = 0;
        /* Take jobs while there is room: at most MM_MAX_JOBS, and in fast
         * precision at most DS4_MM_SOURCES sources that fit in mm_q. */
        while (c.n_jobs < n_jobs && c.n_jobs < MM_MAX_JOBS) {
            const ds4_mm_job *jb = &jobs[c.n_jobs];
            const int j = c.n_jobs;
            const int vdt = ds4_type_traits_table[jb->type].vec_dot_type;
            if (!f->fast || vdt == DS4_TYPE_F32 || jb->n_rows <= 0) {
                c.dot[j] = f->fast ? f->k->vec_dot[jb->type] : f->k->vec_dot_f32[jb->type];
                c.rows[j] = NULL;
                c.tile[j] = NULL;
                c.act[j] = NULL;
                c.act_stride[j] = 0;
                job_src[j] = -1;
                c.n_jobs++;
                continue;
            }
            /* the multi-row kernel when the set has one for this type */
            const ds4_dot_rows_fn rows_fn = f->k->dot_rows[jb->type];
            const ds4_pack_rows_fn pack = rows_fn ? f->k->pack_rows[jb->type] : NULL;
            int match;
            const size_t need = src_bytes_with(&c, jb, vdt, pack, &match);
            if (c.n_jobs > 0 &&
                (need > f->mm_qcap || (match < 0 && c.n_src == DS4_MM_SOURCES)))
                break; /* run what we have; this job starts the next dispatch */
            if (match < 0) {
                match = c.n_src++;
                c.src[match].x = jb->x;
                c.src[match].x_stride = jb->x_stride;
                c.src[match].n_in = jb->n_in;
                c.src[match].type = vdt;
                c.src[match].pack = pack;
                c.src[match].n_rows = 0;
            }
            const int64_t rows = job_rows(jb);
            if (rows > c.src[match].n_rows) c.src[match].n_rows = rows;
            c.dot[j] = f->k->vec_dot[jb->type];
            c.rows[j] = rows_fn;
            c.tile[j] = rows_fn && jb->n_rows >= f->k->dot_tile_min_rows[jb->type]
                            ? f->k->dot_tile[jb->type]
                            : NULL;
            c.act[j] = NULL;
            job_src[j] = match;
            c.n_jobs++;
        }
        if (ds4_paths_on()) note_paths(f, &c);
        dispatch(f, &c, job_src);
        jobs += c.n_jobs;
        n_jobs -= c.n_jobs;
    }
}
