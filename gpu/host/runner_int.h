/*
 * runner_int.h — internal to the GPU layer loop: the device-side model and
 * session structs and the helpers runner.c (the trunk) shares with
 * runner_head.c (the nextn head). Not an API: runner.h is.
 */
#ifndef K_RUNNER_INT_H
#define K_RUNNER_INT_H

#include "runner.h"

#include "../../csrc/error.h"
#include "../../csrc/forward/forward.h"
#include "../../csrc/model.h"

/* Rows per eval chunk: the GEMM (gemm.h) serves chunks wider than the
 * matvecs' K_MATVEC_MAX_ROWS with every value's bits unchanged, so the
 * chunk size is a speed and memory knob only. K_RUNNER_CHUNK rows when
 * every row's logits come back (verify, logprobs, the tests' all-rows
 * evals: the logits scratch is K_RUNNER_CHUNK x vocabulary, 64 MB at a
 * 248k vocabulary); K_RUNNER_PREFILL_CHUNK rows when only the last row's
 * are wanted (prefill), so the GEMM reads each weight once per 512 rows
 * instead of 64 (H200, 2026-11-29: 128 / 256-row chunks +5% / +8% prefill
 * on the 27B-like shape; 2026-12-02, 512 against 256, one call: the
 * 35B-A3B-like MoE +8%, whose grouped experts get twice the pairs per
 * tile, the 27B-like +2%, the 0.8B +1%, for ~165 MB more scratch on the
 * 27B-like). The other scratch scales with the larger;
 * K_RUNNER_PREFILL_CHUNK in the environment lowers it (tests, A/B); -D
 * overrides change the build. Attention runs its rows ATTN_ROWS at a time
 * (its partials buffer grows with rows x context). */
#ifndef K_RUNNER_CHUNK
#define K_RUNNER_CHUNK 64
#endif
#ifndef K_RUNNER_PREFILL_CHUNK
#define K_RUNNER_PREFILL_CHUNK 512
#endif
#define ROWS (K_RUNNER_PREFILL_CHUNK > K_RUNNER_CHUNK ? K_RUNNER_PREFILL_CHUNK : K_RUNNER_CHUNK) /* scratch rows */
#define OUT_ROWS K_RUNNER_CHUNK /* logits / argmax scratch rows */
#define ATTN_ROWS K_MATVEC_MAX_ROWS
typedef char k_runner_chunk_ok[K_RUNNER_CHUNK >= K_MATVEC_MAX_ROWS && K_RUNNER_CHUNK >= K_RUNNER_VERIFY_MAX ? 1 : -1];
#define MATVEC_TG K_MATVEC_MAX_TG
#define STATUS_BIND(K) K_BIND(K, status, r->status, 8)
#define F4(n) ((size_t)(n) * sizeof(float))

typedef struct {
    void *p;
    int type;
    int64_t n_in, n_out;
    size_t bytes;
} dev_mat;

/* Consecutive matrices of one input group that share a type, as one
 * matrix (upload_group); `first`: the group index of its first member. */
typedef struct {
    dev_mat m;
    int first;
} mat_run;

/* A qwen35moe layer's routed FFN on the device (gpu/kernels/moe.h): the
 * router (ffn_gate_inp, and ffn_gate_inp_shexp as one more row) in F32;
 * the experts' 3-D gate/up tensors and the shared expert's gate/up in one
 * buffer (wgu), the experts' down and the shared down in another (wdn), at
 * the byte offsets the kernels take (moe_gate_up / moe_down params). */
typedef struct {
    void *router;
    int shgate;
    void *wgu, *wdn;
    uint32_t t_gate, t_up, t_down, t_sgate, t_sup, t_sdown;
    uint32_t g_estride, u_base, u_estride, u_row0, sg_base, su_base, sd_base;
    size_t gu_bytes, dn_bytes;
    int64_t n_ff_sh; /* 0: no shared expert */
    /* the grouped prefill path (moe_gemm.h), set at load: the up matrix's
     * first row and the down experts' stride in bytes, and whether
     * moe_gemm can take this layer (16-aligned offsets; the Q8_0 GEMM's
     * order when a matrix is Q8_0) */
    uint32_t up0, d_estride;
    int group_ok;
    int all_kq;      /* every matrix a K-quant: moe_gemm_mma (int8 MMA) can take the grouped GEMMs */
    unsigned want;   /* what pre_norm writes for it: K_NQ_X (the router's float rows) | activation types */
} dev_moe;

typedef struct {
    int kind;
    void *attn_norm, *post_norm;
    /* GDN */
    dev_mat qkv, gate, beta, alpha, ssm_out;
    mat_run gdn_in[4]; /* qkv, gate, beta, alpha in runs of one type, concatenated (upload_group) */
    int n_gdn_in;
    void *conv_w; /* F32 [conv_dim][K] */
    void *hp;     /* F32 [ssm_a (n_v) | dt_bias (n_v) | ssm_norm (d)]: gdn_delta's hp */
    /* gated attention */
    dev_mat q, k, v, o;
    mat_run attn_in[3]; /* q, k, v in runs of one type (decode: one row [q | k | v]) */
    int n_attn_in;
    void *q_norm, *k_norm; /* one buffer, q_norm then k_norm (qk_norm_rope's w) */
    /* dense FFN */
    dev_mat ffn_gate, ffn_up, ffn_down;
    mat_run ffn_in[2]; /* ffn_gate, ffn_up: one run when their types agree */
    int n_ffn_in;
    /* routed MoE (qwen35moe): moe_layer instead of ffn_layer */
    int is_moe;
    dev_moe moe;
} dev_layer;

/* A session's device state of one layer. */
typedef struct {
    void *conv_state, *ssm;   /* GDN: the recurrent state (conv: two halves, conv_cur holds it) */
    int conv_cur;             /* GDN: 0/1, the half of conv_state in use (gdn_seq writes the other) */
    void *conv_bak, *ssm_bak; /* GDN: the state before the last verify (conv_bak: unfused loop only) */
    int conv_pre;             /* GDN: conv_cur before the last verify (its half is left intact) */
    float *cap_in;            /* GDN: a verify's input rows [qkv | z | ab] (accept replays them) */
    void *kpool, *vpool;      /* attention: F16 KV pages */
} dev_state;

/* Device allocations of one owner, released together. */
typedef struct {
    void **p;
    int64_t n, cap;
    uint64_t bytes;
} k_allocs;

/* The weights on the device: uploaded once, shared by every session. */
struct k_gpu_model {
    k_device *dev;
    const ds4_model *m;
    ds4_model_config c;
    int isa;
    uint32_t gdn_tg; /* gdn_delta's threadgroup: SIMD-groups of rows (gdn.h) */
    k_allocs mem;
    dev_layer *L;
    dev_mat head;
    void *output_norm;
    struct dev_head *nh; /* the nextn head (runner_head.c); NULL: none, or nh_why says why not */
    char nh_why[512];
    int64_t n_snaps;     /* live snapshots (k_runner_snapshot): freed before the model */
    uint64_t snap_bytes; /* device bytes they hold */
};

struct k_runner {
    /* copied from the model, for the layer code's brevity */
    k_device *dev;
    const ds4_model *m;
    ds4_model_config c;
    int isa;
    uint32_t gdn_tg;
    dev_layer *L;
    const dev_mat *head;
    void *output_norm;
    /* this session */
    k_gpu_model *gm;
    k_allocs mem;
    dev_state *S;
    int64_t n_ctx, n_pages, n_past, launches;
    int fuse;               /* fused glue kernels (fused.h); K_RUNNER_FUSE=0: the unfused sequence */
    int gdn_nq;             /* gdn_norm_quant where it fits (gdn.h); K_RUNNER_GDN_NQ=0: gdn_norm + quantizer */
    int moe_lw;             /* moe_logits_wide for chunks (moe.h); K_RUNNER_MOE_LOGITS_WIDE=0: moe_logits */
    uint32_t attn_wide;     /* query vectors per attn_partials_wide threadgroup (attn.h); 0 (K_RUNNER_ATTN_WIDE=0): attn_partials */
    int gemm;               /* prefill GEMM for chunks > 16 rows: 2 gemm_mma.h, 3 gemm_kq_mma for K-quants + gemm.h for Q8_0, 1 gemm.h, 0 matvecs */
    uint32_t moe_split;     /* SIMD-groups per router row (moe_logits); K_RUNNER_MOE_SPLIT overrides */
    int64_t moe_group_min;  /* MoE chunks of at least this many rows run grouped by expert (moe_gemm.h);
                             * K_RUNNER_MOE_GROUP_MIN overrides, K_RUNNER_MOE_GROUP=0 never */
    uint32_t gdn_split;     /* gdn_seq threadgroups per value head (long runs); K_RUNNER_GDN_SPLIT overrides */
    int64_t prefill_chunk;  /* rows per chunk when only the last row's outputs are wanted (<= ROWS) */
    uint32_t attn_tg;       /* attn_partials threads: K_ATTN_TG on CUDA, else 256 */
    int64_t gdn_split_min;  /* runs of at least this many tokens take gdn_seq's split */
    int64_t gdn_rows_min;   /* runs of at least this many tokens take gdn_prep + gdn_rows (d <= 128);
                             * K_RUNNER_GDN_ROWS_MIN overrides, 0 never */
    uint32_t gdn_rows_r;    /* gdn_rows' state rows per SIMD-group; K_RUNNER_GDN_ROWS_R overrides */
    int64_t attn_rows;      /* query rows per attention launch pair (ATTN_ROWS; K_RUNNER_ATTN_ROWS) */
    uint32_t attn_hs;       /* K_RUNNER_ATTN_HS: a fixed head split (0: attn_plan.h decides) */
    uint32_t attn_rg;       /* K_RUNNER_ATTN_RG: query rows per attn_partials threadgroup (0: as many as fit) */
    int capturing;          /* inside a verify: GDN layers keep their rows */
    int64_t ver_n, ver_pos; /* the last verify's rows and first position (0: none) */
    int64_t last_row;       /* the row of `logits` holding position n_past - 1 (-1: none) */
    void *pages; /* u32 page table: identity (one sequence, no sharing yet) */
    /* scratch, ROWS rows each */
    float *h, *x, *y, *gin, *cv, *o, *qf, *qn, *kraw, *kn, *vv, *arow, *attn, *g, *u, *gu, *logits;
    float *part, *cs, *sn;
    float *gpq; /* gdn_prep's token rows (K_GDN_PQ_STRIDE floats each) */
    uint8_t *xq8, *xqk;
    uint32_t *idx, *status;
    size_t xq8_bytes, xqk_bytes, part_floats;
    /* host staging */
    float *h_stage, *h_cs, *h_sn;
    uint32_t *h_idx;
    /* routed MoE scratch, ROWS token rows (open_moe_scratch; qwen35moe only) */
    float *moe_logits, *moe_wt, *moe_h;
    uint32_t *moe_sel;
    uint8_t *moe_hq8, *moe_hqk;
    float *moe_gu, *moe_dn;         /* grouped path: [g | u] rows and down rows per pair */
    uint32_t *moe_order, *moe_tiles; /* grouped path: moe_group's output */
    size_t moe_hq8_bytes, moe_hqk_bytes;
    /* the nextn head (runner_head.c); nothing runs for it while prime is 0 */
    const struct dev_head *nh; /* NULL: the model has no head */
    dev_state hS;              /* its KV pools: slot p - 1 holds position p */
    int prime;                 /* every committed trunk row reaches the head's KV */
    int carry_ok;              /* hrows row 0 holds the trunk's hidden of n_past - 1 */
    int64_t h_next;            /* the head's KV holds positions [1, h_next) */
    int32_t ver_tok[K_RUNNER_VERIFY_MAX]; /* the last verify's tokens (accept primes them) */
    float *hrows; /* (ROWS + 1) x n_embd: row 0 the carry, then a chunk's or a verify's hidden rows */
    float *hin;   /* ROWS x 2 n_embd: the head's input rows [enorm(e) ; hnorm(h)] */
    float *hlog;  /* a draft step's logits (n_vocab) */
    /* deferred rows (runner_head.c): committed rows at positions [h_pos, h_pos + h_pend) whose
     * head KV is written in one batch when needed; their h rows are hrows [0, h_pend) */
    int64_t h_pos, h_pend;
    float *hemb;      /* ROWS x n_embd: their embedding rows, or a verify's (when the head reads token_embd) */
    int hemb_ok;      /* the head reads token_embd: hemb is kept */
    float *hcs, *hsn; /* ROWS x n_rot/2: their RoPE rows */
    int32_t *pend_tok; /* host, ROWS: their tokens */
    uint32_t *hidx;
    /* a sampled draft chain (k_runner_nextn_step): the next step j it may
     * take (0: none open); every call that writes x or moves n_past closes it */
    int64_t chain_next;
    /* layer taps (k_runner_eval_taps): during a call that asks for them,
     * tap_want[l] says trunk layer l's residual rows are copied to slot l
     * of taps (device, n_main x OUT_ROWS x n_embd), staged through h_taps
     * (host, same shape) into tap_dst (rows x tap_n x n_embd). Allocated on
     * first use: a session that never taps pays nothing. */
    unsigned char *tap_want;
    const int64_t *tap_layers;
    int64_t tap_n;
    float *tap_dst, *taps, *h_taps;
};

/* The nextn (MTP) head's weights on the device (runner_head.c): its block
 * (a gated-attention layer + the trunk's FFN kind) and what surrounds it. */
typedef struct dev_head {
    dev_layer L;
    void *enorm, *hnorm, *out_norm; /* F32, n_embd each (out_norm: shared_head_norm) */
    dev_mat eh;                     /* eh_proj: [e ; g] (2 n_embd) -> n_embd */
    dev_mat own_lm;                 /* shared_head_head, when the file has one */
    const dev_mat *lm;              /* own_lm, else the model's LM head */
    const ds4_tensor *embd;         /* nextn.embed_tokens, else token_embd (dequantized on the host) */
} dev_head;

typedef struct {
    const dev_mat *w;
    float *y;
    int64_t y_stride;
} mm_job;

/* runner.c's helpers (each documented there). */
void *kr_mem_upload(k_device *d, k_allocs *a, const void *src, size_t bytes, ds4_error *err);
void *kr_dalloc(k_runner *r, size_t bytes, ds4_error *err);
int kr_upload_mat(k_gpu_model *g, const ds4_tensor *t, dev_mat *out, ds4_error *err);
int kr_upload_group(k_gpu_model *g, const ds4_tensor *const *t, dev_mat *const *out, int k, mat_run *runs,
                    int *n_runs, ds4_error *err);
void *kr_upload_f32(k_gpu_model *g, const ds4_tensor *t, int64_t n, ds4_error *err);
int kr_open_moe(k_gpu_model *g, const ds4_layer *T, dev_layer *L, ds4_error *err);
int kr_open_attn(k_gpu_model *g, const ds4_layer *T, dev_layer *L, ds4_error *err);
int kr_open_ffn(k_gpu_model *g, const ds4_layer *T, dev_layer *L, ds4_error *err);
int kr_launch(k_runner *r, int id, uint32_t gx, uint32_t gy, uint32_t gz, uint32_t tg, const k_binding *b, int nb,
              ds4_error *err);
uint32_t kr_row_tg(int64_t n);
int kr_rmsnorm(k_runner *r, const float *x, const void *w, float *y, int64_t n, int64_t n_rows, int64_t stride,
               int64_t ystride, ds4_error *err);
unsigned kr_act_flag(const dev_mat *w);
int kr_matmul(k_runner *r, const float *x, int64_t x_stride, int64_t n_rows, const mm_job *jobs, int n_jobs,
              unsigned ready, ds4_error *err);
int kr_pre_norm(k_runner *r, int add, int64_t row0, int64_t n_rows, const void *w, unsigned want, unsigned *ready,
                ds4_error *err);
int kr_copy_dev(k_runner *r, void *dst, const void *src, size_t bytes, ds4_error *err);
int kr_finish(k_runner *r, ds4_error *err);
int kr_attn_layer(k_runner *r, dev_layer *L, dev_state *S, int64_t n, int64_t pos0, unsigned ready, int kv_only,
                  ds4_error *err);
int kr_ffn_layer(k_runner *r, dev_layer *L, int64_t n, unsigned ready, ds4_error *err);
int kr_moe_layer(k_runner *r, dev_layer *L, int64_t n, unsigned ready, ds4_error *err);

/* runner_head.c, called by runner.c. */
int kr_head_open(k_gpu_model *g, ds4_error *err);   /* the head's weights, when the model has one */
int kr_head_session(k_runner *r, ds4_error *err);   /* its KV pools and scratch in a session (first use) */
/* After a trunk chunk of n rows at pos0 whose post-norm hidden rows are in
 * x rows [0, n) (embeddings kept by kr_head_chunk_start): the rows join the
 * deferred ones. */
int kr_head_prime_chunk(k_runner *r, const int32_t *tokens, int64_t n, int64_t pos0, ds4_error *err);
/* Before a chunk of n rows at pos0 (nothing uploaded yet): the deferred rows
 * go to the head if the chunk's would not fit beside them. */
int kr_head_chunk_start(k_runner *r, int64_t n, ds4_error *err);
/* After the chunk's uploads: its embedding rows into hemb (eval rows after
 * the deferred ones; a verify's from row 0). */
int kr_head_keep_embeddings(k_runner *r, int64_t n, int64_t pos0, ds4_error *err);
/* The deferred rows reach the head's KV now, in one batched call. */
int kr_head_flush(k_runner *r, ds4_error *err);
/* The first k rows of the last verify (hidden rows in hrows [1, k]) reach the head. */
int kr_head_commit_verify(k_runner *r, int64_t k, ds4_error *err);
/* The device row holding the trunk's post-norm hidden of n_past - 1. */
float *kr_hidden_row(k_runner *r);

#endif
