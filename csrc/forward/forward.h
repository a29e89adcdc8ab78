/*
 * forward.h — internal: the CPU forward pass of a Qwen3.5 trunk
 * (qwen35-spec.md §3–§6), and the per-session state it runs over.
 *
 * One ds4_fwd belongs to one session: its KV pages, recurrent states,
 * scratch and thread pool. The math lives in one file per concept:
 *   matmul.c     y = W x over rows of tokens (the precision seam)
 *   norm.c       RMSNorm, L2 norm, activations
 *   gdn.c        gated DeltaNet mixer (conv, delta rule, gated norm)
 *   attention.c  gated full attention (q/k norm, RoPE, KV pages, split-K)
 *   ffn.c        dense SwiGLU FFN
 *   moe.c        routed experts + shared expert
 *   nextn.c      the nextn / MTP head (its own KV; the blocks above reused)
 *   kv.c         KV page allocation
 *   forward.c    state/scratch setup and the layer loop of one chunk
 *
 * Batch invariance (DESIGN.md invariant 1) is a property of every file
 * here: each output element of a row is computed by one fixed sequence of
 * float operations that depends only on that row (and on the state left by
 * earlier rows), never on how many rows share the chunk, where a chunk
 * starts, or which thread runs it.
 */
#ifndef DS4_FORWARD_H
#define DS4_FORWARD_H

#include <stddef.h>
#include <stdint.h>

#include "../model.h"
#include "../pool.h"
#include "../quants/quants.h"

/* Positions per KV page, and the split-K block of attention. Fixed (never
 * derived from the thread count) so the softmax merge order of a row is
 * the same however the work is spread. */
#define DS4_KV_PAGE 256
/* Rows per internal prefill chunk: bounds the scratch; results do not
 * depend on it. 256, not 64: a MoE chunk gives each of its routed experts
 * chunk x top-k / experts rows, and a GEMM tile wants 12 or more rows (the
 * AVX-512 Q4_K panel: quants.h dot_tile_min_rows); on the bench MoE (64
 * experts, top-8) 64 rows gave 8 per expert, 256 give 32 (README,
 * Benchmarks: the chunk of 256). */
#define DS4_CHUNK_ROWS 256
/* Fast precision's attention recipe (attention.c, which says why 1): 1 = Q
 * rounded to F16 and V accumulated in F16 (llama.cpp's one-chunk kernel,
 * needs F16 KV), 0 = Q and the V accumulation in F32 (like llama.cpp's
 * tiled kernel). */
#define DS4_FAST_ATTN_F16 1
/* Quantized activation sources one ds4_matmul dispatch can hold at once
 * (fast precision); a call needing more is run in several dispatches, which
 * changes no value (each output element is still one dot). */
#define DS4_MM_SOURCES 4

struct ds4_fwd;

/* Every heap allocation of a session's forward state goes through these, so
 * the session's counters (ds4_session_counters) see it. */
void *ds4_fwd_calloc(struct ds4_fwd *f, size_t n, size_t size);
void *ds4_fwd_malloc(struct ds4_fwd *f, size_t size);
void *ds4_fwd_realloc(struct ds4_fwd *f, void *p, size_t size);

/* ------------------------------------------------------------- matmul -- */

/* One matrix-times-rows job: for r < n_rows, y_row(r)[o] = W_o · x_row(r),
 * o < n_out. x_row(r) is x + (x_idx ? x_idx[r] : r) * x_stride, likewise y.
 * W row o is at w + o*row_bytes (n_in weights of `type`). */
typedef struct {
    int type;
    const uint8_t *w;
    size_t row_bytes;
    int64_t n_in, n_out;
    const float *x;
    int64_t x_stride;
    const int32_t *x_idx;
    float *y;
    int64_t y_stride;
    const int32_t *y_idx;
    int64_t n_rows;
} ds4_mm_job;

/* A job over rows [row0, row0+n_out) of tensor t (expert `expert` of a 3-D
 * tensor, 0 otherwise), contiguous x/y rows. */
ds4_mm_job ds4_mm(const ds4_tensor *t, int64_t expert, int64_t row0, int64_t n_out,
                  const float *x, int64_t x_stride, float *y, int64_t y_stride,
                  int64_t n_rows);

/* Bytes of one activation row of n_in values at the vec_dot_type of
 * weight_type (0 when that is F32: fast precision dots F32 weights against
 * the float rows themselves). */
size_t ds4_mm_act_row_bytes(int weight_type, int64_t n_in);

/* Run all jobs (one pool dispatch, or a few when fast precision needs more
 * quantized-activation room than DS4_MM_SOURCES sources). Adds each job's
 * weight bytes (n_out * row_bytes, once per job whatever its n_rows) to
 * the session's weight_bytes counter. */
void ds4_matmul(struct ds4_fwd *f, const ds4_mm_job *jobs, int n_jobs);

/* --------------------------------------------------------------- norm -- */

/* y = x / sqrt(mean(x^2) + eps) * w (w may be NULL), n elements; the sum of
 * squares in double (ggml-cpu ops.cpp ggml_compute_forward_rms_norm_f32).
 * y may alias x. */
void ds4_rmsnorm(const float *x, const float *w, float *y, int64_t n, float eps);
/* x *= 1/sqrt(sum(x^2) + eps) in place (transformers modeling_qwen3_5.py
 * l2norm), sum in double. */
void ds4_l2norm(float *x, int64_t n, float eps);
/* llama.cpp's GDN L2 norm (src/models/models.h build_gdn_l2_norm):
 * rms_norm(x, eps/n) then scale by 1/sqrt(n), in place. */
void ds4_l2norm_ggml(float *x, int64_t n, float eps);
float ds4_silu(float x);
float ds4_sigmoid(float x);
float ds4_softplus(float x);
/* ggml's op_softplus (ggml-cpu unary-ops.cpp): logf(1 + expf(x)) below 20. */
float ds4_softplus_ggml(float x);

/* ------------------------------------------------------------- state -- */

typedef struct {
    int64_t n_pages;   /* pages held (positions [0, n_pages*DS4_KV_PAGE)); each is
                          reference counted and may be shared with snapshots (kv.c) */
    uint8_t **k, **v;  /* n_pages_max slots. A page is [n_head_kv][DS4_KV_PAGE][head_dim]
                          elements of the session's kv_type: one kv head's rows are
                          contiguous, which is what a head's attention scans. */
} ds4_kv_layer;

typedef struct {
    float *conv;  /* (K-1) x conv_dim raw attn_qkv rows, oldest first */
    float *ssm;   /* n_v heads of d_v x d_k: head j, S[i][m] at j*d_k*d_v + m*d_k + i */
} ds4_gdn_state;

typedef struct ds4_fwd {
    const ds4_model *m;
    ds4_model_config c;
    const ds4_kernel_set *k;
    ds4_pool *pool;
    int n_threads;
    int precision;            /* DS4_PRECISION_* */
    int fast;                 /* precision == FAST: llama.cpp's CPU numerics (matmul.c,
                                 attention.c, gdn.c, moe.c say which) */
    int attn_f16;             /* attention recipe: Q rounded to F16, V accumulated in
                                 F16 (attention.c); else Q and V accumulation in F32 */

    /* KV cache */
    int kv_type;              /* DS4_TYPE_F32 (exact) or DS4_TYPE_F16 (fast) */
    size_t kv_elem_bytes;
    int64_t n_ctx, n_pages_max;
    ds4_kv_layer *kv;         /* n_main entries (used for attention layers) */
    ds4_gdn_state *gdn;       /* n_main entries (used for GDN layers) */

    /* Verify (session.c ds4_session_verify): with `verify` set, a GDN layer
     * reads its state from gdn[il] and writes the state after the chunk to
     * gdn_alt[il] (gdn[il] keeps the state before it), and records per row
     * what replaying the row's update needs (gdn.c ds4_gdn_capture_floats):
     * row t of the GDN layer with ordinal g at vcap + (g*vcap_rows + t) *
     * ds4_gdn_capture_floats(). gdn_alt and vcap are allocated at the first
     * verify (ds4_fwd_verify_reserve). */
    int verify;
    ds4_gdn_state *gdn_alt;   /* n_main entries, like gdn */
    float *vcap;
    int64_t vcap_rows;        /* rows vcap holds per GDN layer */

    /* scratch for DS4_CHUNK_ROWS rows */
    float *h;                 /* residual stream, rows x n_embd */
    float *x;                 /* normed input of a mixer/FFN */
    float *y;                 /* its output */
    float *work;              /* rows x work_per_row, carved per layer kind */
    int64_t work_per_row;
    float *rope_cos, *rope_sin; /* rows x n_rot/2 */
    int32_t *moe_sel;         /* rows x n_expert_used */
    float *moe_w;             /* rows x n_expert_used */
    int32_t *moe_idx;         /* rows x n_expert_used (row, slot) pairs grouped by expert */
    int32_t *moe_src;         /* the source row of each pair in moe_idx */
    int64_t *moe_off;         /* n_expert + 1: expert e's pairs are moe_idx[off[e], off[e+1]) */
    ds4_mm_job *moe_jobs;     /* 2 * n_expert + 1 */
    float *thread_scratch;    /* n_threads x per_thread_floats */
    int64_t per_thread_floats;
    float *attn_part;         /* decode split-K partials: n_head x nb x (2+head_dim), nb <= */
    int64_t attn_part_pages;  /* this many blocks (grown with the KV pages) */
    uint8_t *mm_q;            /* fast precision: quantized activation rows (matmul.c) */
    size_t mm_qcap;           /* its bytes: DS4_MM_SOURCES x the largest one source */

    /* Residual-stream capture (ds4_fwd_chunk): after trunk layer cap_layers[j]
     * the rows >= out_row0 of h are copied to cap_out + (row*n_cap + j)*n_embd. */
    const int64_t *cap_layers;
    int64_t n_cap;
    float *cap_out;

    ds4_counters cnt;         /* cumulative: allocations and weight bytes read */
    int64_t path_layer;       /* DS4PY_PATHS label of the running layer (paths.h) */

    /* The nextn / MTP head (nextn.c), when the model has one (bundled or a
     * draft_head file). Its own KV cache has the trunk attention layers'
     * page structure; entry i holds the row at position nextn_pos0 + i, and
     * the head holds entries [0, nextn_n_pos - nextn_pos0) (empty when
     * nextn_n_pos == nextn_pos0). Snapshot/rollback of the head is: these
     * pages plus the two positions. */
    ds4_kv_layer nextn_kv;
    int64_t nextn_pos0, nextn_n_pos;
    int nextn_ready;          /* 1 when the model has a runnable head */
    float *nextn_cat;         /* DS4_CHUNK_ROWS x 2*n_embd: [enorm(emb) | hnorm(h)] rows */
    float *nextn_logits;      /* results of the last nextn eval: n_rows x n_vocab */
    float *nextn_hidden;      /* and n_rows x n_embd (the head's post-norm output): one of */
    float *nextn_hbuf[2];     /* two buffers used in turn, so the last result can be */
    int64_t nextn_hcap[2];    /* the next call's input (chained drafts) */
    int64_t nextn_cap_rows, nextn_n_rows;
} ds4_fwd;

/* Set up state and scratch for model m (all state zero: position 0). */
int ds4_fwd_init(ds4_fwd *f, const ds4_model *m, int kv_type, ds4_error *err);
void ds4_fwd_free(ds4_fwd *f);
/* Before a chunk writing trunk positions [w0, n_pos): KV pages exist for
 * [0, n_pos) in every trunk attention layer, those holding [w0, n_pos) are
 * the session's own (ds4_kv_layer_reserve), the split-K partials are sized.
 * On failure the pages that were allocated or copied stay (harmless) and
 * nothing else changes. */
int ds4_fwd_reserve(ds4_fwd *f, int64_t w0, int64_t n_pos, ds4_error *err);
/* Run n <= DS4_CHUNK_ROWS tokens at positions pos0.. through the trunk,
 * updating the KV cache and recurrent states. Rows r >= out_row0 write the
 * post-final-norm hidden (hidden + (r-out_row0)*n_embd) and the logits
 * (logits + (r-out_row0)*n_vocab), and, when f->n_cap > 0, the residual
 * stream after the requested layers (f->cap_out, see above; the caller
 * points cap_out at the chunk's first output row). Cannot fail:
 * ds4_fwd_reserve ran first and the arguments were checked by the caller.
 * On return f->h still holds the residual stream (before the final norm) of
 * all n rows: session.c's head priming norms it into the rows' hidden. */
void ds4_fwd_chunk(ds4_fwd *f, const int32_t *tokens, int64_t n, int64_t pos0,
                   int64_t out_row0, float *logits, float *hidden);

/* Verify support. ds4_fwd_verify_reserve allocates gdn_alt and room to
 * capture n rows (grow only). ds4_fwd_swap_gdn exchanges gdn and gdn_alt.
 * ds4_gdn_replay turns gdn_alt (the state before a verify) into the state
 * after its first k captured rows, by the same float operations the
 * verify's own rows ran (gdn.c). */
int ds4_fwd_verify_reserve(ds4_fwd *f, int64_t n, ds4_error *err);
void ds4_fwd_swap_gdn(ds4_fwd *f);
int64_t ds4_gdn_capture_floats(const ds4_model_config *c);
void ds4_gdn_replay(ds4_fwd *f, int64_t k);
/* Bytes of one recurrent state (conv + ssm) of a GDN layer. */
size_t ds4_gdn_state_bytes(const ds4_model_config *c);

/* Mixers and FFNs: read f->x (n rows, normed), write f->y. */
void ds4_gdn_layer(ds4_fwd *f, int64_t il, int64_t n);
void ds4_attn_layer(ds4_fwd *f, int64_t il, int64_t n, int64_t pos0);
/* The same over any gated-attention block L and KV layer kvl (the nextn
 * head's): rows at KV entries pos0.. (RoPE from f->rope_cos/sin, filled by
 * the caller for the rows' real positions). ds4_attn_layer is this with
 * trunk layer il and its KV. */
void ds4_attn_block(ds4_fwd *f, const ds4_layer *L, ds4_kv_layer *kvl, int64_t n, int64_t pos0);
void ds4_ffn_dense(ds4_fwd *f, const ds4_layer *L, int64_t n);
void ds4_ffn_moe(ds4_fwd *f, const ds4_layer *L, int64_t n);

/* Floats of f->work each kind needs per row, and of per-thread scratch. */
int64_t ds4_gdn_work_per_row(const ds4_model_config *c);
int64_t ds4_attn_work_per_row(const ds4_model_config *c);
int64_t ds4_ffn_dense_work_per_row(const ds4_model_config *c);
int64_t ds4_moe_work_per_row(const ds4_model_config *c);
int64_t ds4_gdn_thread_floats(const ds4_model_config *c);
int64_t ds4_attn_thread_floats(const ds4_model_config *c);

/* cos/sin tables of rows at positions pos0.. (forward.c), shared by every
 * attention block of a chunk. */
void ds4_rope_tables(ds4_fwd *f, int64_t n, int64_t pos0);
/* The same tables into caller-owned rows (n rows of n_rot/2 cos and sin;
 * fast: llama.cpp's theta recurrence, else transformers' inv_freq form):
 * the GPU runner (gpu/host/runner.c) uploads them, so both backends rotate
 * by the very same floats. */
void ds4_rope_fill(int64_t n_rot, float base, int fast, int64_t n, int64_t pos0, float *cos_out,
                   float *sin_out);

/* The nextn / MTP head (nextn.c). ds4_nextn_init sets up its KV page table
 * and scratch (from ds4_fwd_init, after everything else; a model without a
 * head leaves nextn_ready 0); ds4_nextn_free releases them (safe on a
 * zeroed ds4_fwd). */
int ds4_nextn_init(ds4_fwd *f, ds4_error *err);
void ds4_nextn_free(ds4_fwd *f);
/* Rows (tokens[r], hiddens[r]) at positions first_pos + r, r < n: check the
 * arguments against the head's state, allocate everything, then run them
 * (rows at or after the head's next position replace its KV from
 * first_pos on). Results in f->nextn_logits / f->nextn_hidden (n rows).
 * A failure changes nothing. */
int ds4_nextn_eval(ds4_fwd *f, const int32_t *tokens, const float *hiddens,
                   const int64_t *positions, int64_t n, ds4_error *err);

/* KV pages (kv.c). A page is reference counted: a session and any number
 * of snapshots (session.c) may hold it; whoever drops the last reference
 * frees it. A page held by more than one is never written: before a write
 * the writer makes the pages holding the written entries its own
 * (ds4_kv_layer_reserve copies a shared page: copy-on-write). Positions only
 * grow between snapshots, so only the page holding the next entry can ever
 * need a copy. Every KV layer a session owns (trunk attention layers and the
 * nextn head's f->nextn_kv) uses these functions for its pages. */
int ds4_kv_init(ds4_fwd *f, ds4_error *err);
void ds4_kv_free(ds4_fwd *f);
/* Bytes of one K (or V) page of this session, and what allocating one costs
 * (page plus its reference-count header: DS4_KV_PAGE_HEADER bytes). */
#define DS4_KV_PAGE_HEADER 64
size_t ds4_kv_page_bytes(const ds4_fwd *f);
/* A new page (reference count 1), zeroed, through the counted allocator;
 * NULL when out of memory. */
uint8_t *ds4_kv_page_new(ds4_fwd *f);
void ds4_kv_page_ref(uint8_t *page);
/* Drop one reference; the last one frees the page. NULL is a no-op. */
void ds4_kv_page_unref(uint8_t *page);
int ds4_kv_page_shared(const uint8_t *page);
/* A KV layer's page table: n_pages_max slots for K and V, no pages. */
int ds4_kv_layer_init(ds4_fwd *f, ds4_kv_layer *kvl, ds4_error *err);
/* Drop every page and free the table (safe on a zeroed layer). */
void ds4_kv_layer_free(ds4_kv_layer *kvl);
/* Before writing entries [w0, n_pos) of kvl: pages exist for entries
 * [0, n_pos), and the ones holding [w0, n_pos) belong to kvl alone (a
 * shared one is replaced by a private copy). On failure what was done stays
 * (extra pages, private copies: both invisible) and nothing else changes. */
int ds4_kv_layer_reserve(ds4_fwd *f, ds4_kv_layer *kvl, int64_t w0, int64_t n_pos,
                         ds4_error *err);
/* Drop the pages from index n_keep on. */
void ds4_kv_layer_truncate(ds4_kv_layer *kvl, int64_t n_keep);
/* Pages needed for n entries. */
static inline int64_t ds4_kv_pages_for(int64_t n) { return (n + DS4_KV_PAGE - 1) / DS4_KV_PAGE; }
/* The decode split-K partial buffer sized for rows that see n_pos entries
 * (every attention block's decode row uses f->attn_part). */
int ds4_kv_parts_reserve(ds4_fwd *f, int64_t n_pos, ds4_error *err);
/* Element pointer of (layer kv, kv head, position) in the K or V pages. */
static inline uint8_t *ds4_kv_row(const ds4_fwd *f, uint8_t *const *pages, int64_t kvh,
                                  int64_t pos) {
    return pages[pos / DS4_KV_PAGE] +
           ((size_t)kvh * DS4_KV_PAGE + (size_t)(pos % DS4_KV_PAGE)) *
               (size_t)f->c.head_dim * f->kv_elem_bytes;
}

#endif
