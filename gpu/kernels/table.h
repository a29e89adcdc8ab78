/*
 * table.h — every GPU kernel's argument table, declared once.
 *
 * Read by all four consumers: the kernels themselves (Metal, CUDA, and C
 * under the emulator: the dialect headers turn a table into a kernel signature), and
 * the hosts (metal/, cuda/, gpu/emul/), which bind buffers by the names
 * declared here (K_ARG_<kernel>_<name>), never by a hand-written slot number,
 * and validate every binding with k_check_bindings() (host/bind.c) before a
 * launch: each slot bound exactly once, of the declared kind, at least as
 * large as the size expression below says for these params. A kernel also
 * checks at its first instruction that its params carry its own tag
 * (K_TAG_<kernel>) and, if not, raises K_ERR_TAG in the status word instead
 * of returning quietly: ds4 once shipped a decode kernel whose arguments
 * were bound one slot off, every thread returned early and the host
 * reported success; here that is a refused launch or a raised status.
 *
 * Table rows: X(slot, name, element type, kind, min elements). Slot 0 is
 * always the status word, slot 1 the params struct (constant memory on
 * Metal, a by-value argument on CUDA). The min-elements expression may use
 * the params fields as `p.field`.
 *
 * Params structs hold only 4-byte scalars so their layout is identical in
 * MSL, CUDA C++ and C11 (asserted on the host side by k_check_bindings
 * through sizeof, and by _Static_assert here where the language allows).
 */
#ifndef K_TABLE_H
#define K_TABLE_H

#ifndef K_DEVICE_METAL
#include <stdint.h>
typedef uint32_t k_u32;
typedef int32_t k_i32;
typedef uint16_t k_u16;
typedef uint8_t k_u8;
#else
typedef uint k_u32;
typedef int k_i32;
typedef ushort k_u16;
typedef uchar k_u8;
#endif

/* Argument kinds. */
#define K_STATUS 0 /* k_u32[2]: [0] error bits (K_ERR_*), [1] tag of the first failure */
#define K_PARAMS 1 /* the params struct */
#define K_IN 2     /* device buffer the kernel only reads */
#define K_OUT 3    /* device buffer the kernel writes (and may read) */

/* Status bits a kernel raises (OR-ed into status[0]). */
#define K_ERR_TAG 1u    /* params are not this kernel's (mis-bound arguments) */
#define K_ERR_SHAPE 2u  /* params violate a kernel precondition */

/* The kernels, with their ids (tags are derived from them). */
#define K_KERNEL_LIST(X) \
    X(1, rmsnorm)        \
    X(2, quantize_q8_0)  \
    X(3, matvec_q8_0)    \
    X(4, rope_neox)      \
    X(5, attn_partials)  \
    X(6, attn_merge)     \
    X(7, quantize_q8_K)  \
    X(8, matvec_kq)      \
    X(9, gdn_conv)       \
    X(10, gdn_delta)     \
    X(11, argmax_rows)   \
    X(12, matvec_kq1)    \
    X(13, matvec_kq4)    \
    X(14, add_rows)      \
    X(15, swiglu)        \
    X(16, attn_gate)     \
    X(17, kv_store)      \
    X(18, norm_quant)    \
    X(19, swiglu_quant)  \
    X(20, qk_norm_rope)  \
    X(21, attn_gate_quant) \
    X(22, moe_logits)    \
    X(23, moe_route)     \
    X(24, moe_gate_up)   \
    X(25, moe_down) \
    X(30, gdn_seq)       \
    X(31, gemm_q8_0)     \
    X(32, gemm_kq)       \
    K_MMA_KERNEL_LIST(X) \
    X(35, matvec_q4_64a1) \
    X(36, matvec_q4_64a4) \
    X(37, matvec_q4_64a) \
    X(38, gdn_norm)      \
    X(39, moe_group)     \
    X(40, moe_gemm)      \
    X(41, moe_combine)   \
    K_MMA_KERNEL_LIST_TAIL(X) \
    X(43, gdn_prep)      \
    X(44, gdn_rows)      \
    X(45, gemm_q4_64a)   \
    X(46, gdn_norm_quant) \
    X(47, moe_logits_wide) \
    X(48, attn_partials_wide)

/* The int8 tensor-core GEMMs (gemm_mma.h) exist on CUDA and under the
 * emulator only: Metal has no int8 simdgroup matrix, so neither its kernel
 * source (K_DEVICE_METAL) nor its Objective-C host (__OBJC__) lists them,
 * and a Metal runner keeps the dp4a GEMM (docs/gpu.md section 4). */
#if defined(K_DEVICE_METAL) || defined(__OBJC__) || defined(K_NO_MMA)
#define K_MMA_KERNEL_LIST(X)
#define K_MMA_KERNEL_LIST_TAIL(X)
#else
#define K_MMA_KERNEL_LIST(X) X(33, gemm_q8_0_mma) X(34, gemm_kq_mma)
#define K_MMA_KERNEL_LIST_TAIL(X) X(42, moe_gemm_mma) /* after 41: the largest id stays last */
#define K_HAS_MMA_KERNELS 1
#endif

/* A params struct starts with its tag: 0xD5A0 in the high half, the kernel
 * id in the low half. */
#define K_TAG(id) (0xD5A00000u | (k_u32)(id))

/* ------------------------------------------------------------ rmsnorm -- */
/* y_row = x_row / sqrt(mean(x_row^2) + eps) * w, one threadgroup per row. */
typedef struct {
    k_u32 tag;
    k_u32 n;        /* elements per row */
    k_u32 n_rows;
    k_u32 stride;   /* elements between rows of x (and of y when ystride is 0) */
    float eps;
    k_u32 has_w;    /* 0: no weight (w still bound, may be 1 element) */
    k_u32 ystride;  /* elements between rows of y; 0: stride */
} k_rmsnorm_params;
#define K_RMSNORM_YSTRIDE(p) ((p).ystride ? (p).ystride : (p).stride)
#define K_ARGS_rmsnorm(X, K)                                              \
    X(K, 0, status, k_u32, K_STATUS, 2)                                   \
    X(K, 1, p, k_rmsnorm_params, K_PARAMS, 1)                             \
    X(K, 2, x, float, K_IN, (p.n_rows - 1) * p.stride + p.n)              \
    X(K, 3, w, float, K_IN, p.has_w ? p.n : 1)                            \
    X(K, 4, y, float, K_OUT, (p.n_rows - 1) * K_RMSNORM_YSTRIDE(p) + p.n)

/* ------------------------------------------------------ quantize_q8_0 -- */
/* Activation rows -> Q8_0 blocks (34 bytes: fp16 d, 32 int8), exactly as
 * the CPU's fast precision quantizes them (csrc/quants/scalar.c
 * quant_block_q8_avx2). One SIMD-group per block. */
typedef struct {
    k_u32 tag;
    k_u32 n;        /* elements per row, a multiple of 32 */
    k_u32 n_rows;
    k_u32 x_stride; /* floats between rows of x */
} k_quantize_q8_0_params;
#define K_ARGS_quantize_q8_0(X, K)                                        \
    X(K, 0, status, k_u32, K_STATUS, 2)                                   \
    X(K, 1, p, k_quantize_q8_0_params, K_PARAMS, 1)                       \
    X(K, 2, x, float, K_IN, (p.n_rows - 1) * p.x_stride + p.n)            \
    X(K, 3, q, k_u8, K_OUT, p.n_rows * (p.n / 32) * 34)

/* -------------------------------------------------------- matvec_q8_0 -- */
/* y[r][o] = W_o . xq_r for r < n_rows (1..16: decode and the verify widths,
 * every weight block read once for all rows), W rows of n_in Q8_0 weights
 * in the device layout (quant_q8_0.h: a row's codes, then its scales; every
 * Q8_0 weight buffer of every kernel is so), xq rows of Q8_0 activations
 * (quantize_q8_0's output, the file's 34-byte blocks; the binding
 * 4-aligned, as every Q8_0 activation binding). A SIMD-group
 * serves K_MATVEC_ROWS_PER_SIMD = 1 output row (quant_q8_0.h refuses
 * another value: its order is the one the GEMMs reproduce); launch
 * K_MATVEC_GROUPS(n_out, SIMD-groups per threadgroup) threadgroups (a grid
 * too small for n_out raises K_ERR_SHAPE). A row's float summation order
 * never depends on the width or the threadgroup size. */
#define K_MATVEC_MAX_ROWS 16
#ifndef K_MATVEC_ROWS_PER_SIMD
#define K_MATVEC_ROWS_PER_SIMD 1 /* a whole SIMD-group streams one weight row: enough loads in flight */
#endif
#define K_MATVEC_MAX_TG 128 /* threads per threadgroup, at most (CUDA register cap) */
#define K_MATVEC_GROUPS(n_out, nsg) (((n_out) + K_MATVEC_ROWS_PER_SIMD * (nsg) - 1) / (K_MATVEC_ROWS_PER_SIMD * (nsg)))
typedef struct {
    k_u32 tag;
    k_u32 n_in;     /* a multiple of 32 */
    k_u32 n_out;
    k_u32 n_rows;   /* 1..K_MATVEC_MAX_ROWS */
    k_u32 y_stride; /* floats between rows of y */
} k_matvec_q8_0_params;
#define K_ARGS_matvec_q8_0(X, K)                                          \
    X(K, 0, status, k_u32, K_STATUS, 2)                                   \
    X(K, 1, p, k_matvec_q8_0_params, K_PARAMS, 1)                         \
    X(K, 2, w, k_u8, K_IN, p.n_out * (p.n_in / 32) * 34)                  \
    X(K, 3, xq, k_u8, K_IN, p.n_rows * (p.n_in / 32) * 34)                \
    X(K, 4, y, float, K_OUT, (p.n_rows - 1) * p.y_stride + p.n_out)

/* ---------------------------------------------------------- rope_neox -- */
/* Partial NEOX RoPE in place on the first n_rot dims of every head of
 * every row: pairs (i, i + n_rot/2), cos/sin tables from the host (one row
 * of n_rot/2 per query row, the CPU's ds4_rope_tables). */
typedef struct {
    k_u32 tag;
    k_u32 n_rows;
    k_u32 n_heads;
    k_u32 head_dim;
    k_u32 n_rot;    /* even, <= head_dim */
    k_u32 stride;   /* floats between rows of x */
    k_u32 head_stride; /* floats between heads of a row */
} k_rope_neox_params;
#define K_ARGS_rope_neox(X, K)                                            \
    X(K, 0, status, k_u32, K_STATUS, 2)                                   \
    X(K, 1, p, k_rope_neox_params, K_PARAMS, 1)                           \
    X(K, 2, x, float, K_OUT, (p.n_rows - 1) * p.stride + (p.n_heads - 1) * p.head_stride + p.head_dim) \
    X(K, 3, cs, float, K_IN, p.n_rows * (p.n_rot / 2))                    \
    X(K, 4, sn, float, K_IN, p.n_rows * (p.n_rot / 2))

/* ------------------------------------------------------ attn_partials -- */
/* Split-K decode/verify attention over the F16 KV shadow, first pass: one
 * threadgroup per (kv head x head split, split, group of query rows); it walks its
 * blocks of K_ATTN_BLOCK positions and writes one partial (max, sum,
 * acc[head_dim]) per (query head it serves, block): the GQA group's G query
 * heads are dealt to head_split threadgroups, G / head_split each. K/V pages are
 * [n_head_kv][K_ATTN_BLOCK][head_dim] F16 (the CPU's KV page layout);
 * block b of the history is page pages[b]. Query row t sees positions
 * [0, pos0 + t + 1). */
#define K_ATTN_BLOCK 256 /* == DS4_KV_PAGE: the CPU's split-K block */
#define K_ATTN_MAX_GROUP 8
#define K_ATTN_MAX_DIM 256 /* head_dim, at most */
/* Query vectors (query heads x query rows) one threadgroup serves from one
 * read of each K/V tile: (G / head_split) x group_rows at most this. */
#define K_ATTN_MAX_QV 8
typedef struct {
    k_u32 tag;
    k_u32 n_head;
    k_u32 n_head_kv;
    k_u32 head_dim;
    k_u32 n_rows;           /* query rows (1: decode; verify widths 2..16) */
    k_u32 pos0;             /* position of query row 0 */
    k_u32 n_blocks;         /* blocks of the last row: ceil((pos0+n_rows)/K_ATTN_BLOCK) */
    k_u32 blocks_per_split; /* the split-K plan (attn_plan.h) */
    k_u32 n_pages;          /* pages in the K/V pools */
    k_u32 q_stride;         /* floats between query rows; head h at h*q_head_stride */
    k_u32 q_head_stride;
    float scale;
    k_u32 head_split;       /* threadgroups per GQA group (divides G; attn_plan.h) */
    k_u32 group_rows;       /* query rows per threadgroup (grid z = ceil(n_rows / group_rows)) */
} k_attn_partials_params;
#define K_ATTN_PART_FLOATS(p) (2 + (p).head_dim)
#define K_ARGS_attn_partials(X, K)                                        \
    X(K, 0, status, k_u32, K_STATUS, 2)                                   \
    X(K, 1, p, k_attn_partials_params, K_PARAMS, 1)                       \
    X(K, 2, q, float, K_IN, (p.n_rows - 1) * p.q_stride + (p.n_head - 1) * p.q_head_stride + p.head_dim) \
    X(K, 3, kpool, k_u16, K_IN, p.n_pages * p.n_head_kv * K_ATTN_BLOCK * p.head_dim) \
    X(K, 4, vpool, k_u16, K_IN, p.n_pages * p.n_head_kv * K_ATTN_BLOCK * p.head_dim) \
    X(K, 5, pages, k_u32, K_IN, p.n_blocks)                               \
    X(K, 6, part, float, K_OUT, p.n_rows * p.n_head * p.n_blocks * (2 + p.head_dim))

/* attn_partials for chunks of query rows, the same partials bit for bit
 * (attn.h): one threadgroup of K_ATTN_WIDE_TG threads per (kv head, split,
 * group of group_rows query rows) serves up to K_ATTN_WIDE_QV query vectors
 * (all G heads of the group: head_split must be 1) from one read of each
 * K/V tile, with the queries in registers. head_dim must be a multiple of 4
 * (a thread's V elements are one 8-byte load); anything else raises
 * K_ERR_SHAPE and the runner keeps attn_partials. */
#define K_ATTN_WIDE_QV_METAL 16u /* scores 16 KB + tile 8 KB: within Apple GPUs' 32 KB */
#define K_ATTN_WIDE_QV_OTHER 32u /* scores 32 KB + tile 8 KB: within CUDA's 48 KB of static shared memory */
#ifndef K_ATTN_WIDE_QV /* -DK_ATTN_WIDE_QV=16u: the emulator's run of Metal's value (tests/test_gpu_emul.py) */
#ifdef K_DEVICE_METAL
#define K_ATTN_WIDE_QV K_ATTN_WIDE_QV_METAL /* the kernel's own bound (the host asks by device name) */
#else
#define K_ATTN_WIDE_QV K_ATTN_WIDE_QV_OTHER
#endif
#endif
#define K_ATTN_WIDE_TG 256u   /* threads: 8 SIMD-groups, one per 4 query vectors at most */
#define K_ATTN_WIDE_TILE 16u  /* positions per K/V tile (a divisor of K_ATTN_BLOCK) */
typedef k_attn_partials_params k_attn_partials_wide_params;
#define K_ARGS_attn_partials_wide(X, K) K_ARGS_attn_partials(X, K)

/* --------------------------------------------------------- attn_merge -- */
/* Second pass: per (query head, row), the row's block partials merged in
 * ascending block order with the online-softmax combine, out = acc * (1/sum). */
typedef struct {
    k_u32 tag;
    k_u32 n_head;
    k_u32 head_dim;
    k_u32 n_rows;
    k_u32 pos0;
    k_u32 n_blocks;
    k_u32 out_stride; /* floats between rows of out; head h at h*head_dim */
} k_attn_merge_params;
#define K_ARGS_attn_merge(X, K)                                           \
    X(K, 0, status, k_u32, K_STATUS, 2)                                   \
    X(K, 1, p, k_attn_merge_params, K_PARAMS, 1)                          \
    X(K, 2, part, float, K_IN, p.n_rows * p.n_head * p.n_blocks * (2 + p.head_dim)) \
    X(K, 3, out, float, K_OUT, (p.n_rows - 1) * p.out_stride + p.n_head * p.head_dim)

/* ------------------------------------------------------ quantize_q8_K -- */
/* Activation rows -> Q8_K blocks (292 bytes: float d, 256 int8, 16 int16
 * bsums), exactly as the CPU's quant_q8_K. One SIMD-group per block. */
typedef struct {
    k_u32 tag;
    k_u32 n;        /* elements per row, a multiple of 256 */
    k_u32 n_rows;
    k_u32 x_stride; /* floats between rows of x */
} k_quantize_q8_K_params;
#define K_ARGS_quantize_q8_K(X, K)                                        \
    X(K, 0, status, k_u32, K_STATUS, 2)                                   \
    X(K, 1, p, k_quantize_q8_K_params, K_PARAMS, 1)                       \
    X(K, 2, x, float, K_IN, (p.n_rows - 1) * p.x_stride + p.n)            \
    X(K, 3, q, k_u8, K_OUT, p.n_rows * (p.n / 256) * 292)

/* ---------------------------------------------------------- matvec_kq -- */
/* y[r][o] = W_o . xq_r for K-quant weights (wtype: the ggml type id, Q4_K
 * 12, Q5_K 13, Q6_K 14) and Q8_K activation rows (quantize_q8_K's output),
 * r < n_rows (1..16, every weight block read once for all rows).
 * K_MATVEC_KQ_GROUPS threadgroups (below) of at most K_MATVEC_MAX_TG
 * threads. */
#define K_TYPE_Q4_K 12
#define K_TYPE_Q5_K 13
#define K_TYPE_Q6_K 14
#define K_KQ_BLOCK_BYTES(t) ((t) == K_TYPE_Q4_K ? 144u : (t) == K_TYPE_Q5_K ? 176u : (t) == K_TYPE_Q6_K ? 210u : 0u)
typedef struct {
    k_u32 tag;
    k_u32 wtype;
    k_u32 n_in;     /* a multiple of 256 */
    k_u32 n_out;
    k_u32 n_rows;   /* 1..K_MATVEC_MAX_ROWS */
    k_u32 y_stride; /* floats between rows of y */
} k_matvec_kq_params;
#define K_ARGS_matvec_kq(X, K)                                            \
    X(K, 0, status, k_u32, K_STATUS, 2)                                   \
    X(K, 1, p, k_matvec_kq_params, K_PARAMS, 1)                           \
    X(K, 2, w, k_u8, K_IN, p.n_out * (p.n_in / 256) * K_KQ_BLOCK_BYTES(p.wtype)) \
    X(K, 3, xq, k_u8, K_IN, p.n_rows * (p.n_in / 256) * 292)              \
    X(K, 4, y, float, K_OUT, (p.n_rows - 1) * p.y_stride + p.n_out)
/* The same kernel for n_rows 1 (matvec_kq1) and 1..4 (matvec_kq4), with
 * fewer registers (quant_kq.h); the same table, so bindings made with
 * K_BIND(matvec_kq, ...) fit all three; params carry the variant's tag. */
typedef k_matvec_kq_params k_matvec_kq1_params;
typedef k_matvec_kq_params k_matvec_kq4_params;
#define K_ARGS_matvec_kq1(X, K) K_ARGS_matvec_kq(X, K)
#define K_ARGS_matvec_kq4(X, K) K_ARGS_matvec_kq(X, K)
#define K_MATVEC_KQ_KERNEL(n_rows) ((n_rows) <= 1 ? K_ID_matvec_kq1 : (n_rows) <= 4 ? K_ID_matvec_kq4 : K_ID_matvec_kq)
/* Output rows per SIMD-group of each variant (1, 2 or 4; quant_kq.h says
 * why a row's bits do not depend on it): width 1 streams a row per
 * SIMD-group (loads in flight), the wider ones share each activation read
 * among 2 / 4 rows. Launch K_MATVEC_KQ_GROUPS(n_rows, n_out, SIMD-groups
 * per threadgroup) threadgroups of the kernel K_MATVEC_KQ_KERNEL(n_rows)
 * picks; a grid too small for n_out raises K_ERR_SHAPE. */
#ifndef K_KQ1_RPS
#define K_KQ1_RPS 2 /* = quant_kq.h's K_KQ1_RPO */
#endif
#ifndef K_KQ4_RPS
#define K_KQ4_RPS 1 /* H200 sweep (quant_kq.h): 1 and 2 beat 2 and 4 */
#endif
#ifndef K_KQ16_RPS
#define K_KQ16_RPS 2
#endif
#define K_MATVEC_KQ_RPS(n_rows) ((n_rows) <= 1 ? K_KQ1_RPS : (n_rows) <= 4 ? K_KQ4_RPS : K_KQ16_RPS)
#define K_MATVEC_KQ_GROUPS(n_rows, n_out, nsg) \
    (((n_out) + K_MATVEC_KQ_RPS(n_rows) * (nsg) - 1) / (K_MATVEC_KQ_RPS(n_rows) * (nsg)))

/* ----------------------------------------------------------- gdn_conv -- */
/* One token of the GDN causal depthwise conv (decode): out[ch] =
 * SiLU(sum_k w[ch][k] * seq_k[ch]) over seq = [state rows (K-1, oldest
 * first) ; x], then the state shifts by one row (state <- last K-1 rows of
 * seq) in place. One thread per channel. */
#define K_GDN_MAX_CONV 8
typedef struct {
    k_u32 tag;
    k_u32 n_ch;     /* conv_dim */
    k_u32 k;        /* taps, 2..K_GDN_MAX_CONV */
} k_gdn_conv_params;
#define K_ARGS_gdn_conv(X, K)                                             \
    X(K, 0, status, k_u32, K_STATUS, 2)                                   \
    X(K, 1, p, k_gdn_conv_params, K_PARAMS, 1)                            \
    X(K, 2, x, float, K_IN, p.n_ch)                                       \
    X(K, 3, cw, float, K_IN, p.n_ch * p.k)                                \
    X(K, 4, state, float, K_OUT, (p.k - 1) * p.n_ch)                      \
    X(K, 5, out, float, K_OUT, p.n_ch)

/* ---------------------------------------------------------- gdn_delta -- */
/* One token of the gated delta rule for every value head (decode), the
 * CPU's fast precision (csrc/forward/gdn.c): q, k heads L2-normed as
 * llama.cpp (rms_norm with eps/d then 1/sqrt(d)), beta = sigmoid(b), g =
 * ssm_a * softplus(alpha + dt_bias) (ggml's softplus), S <- exp(g) S,
 * delta = (v - S k) beta, S += k (x) delta, o = (S q) / sqrt(d), then the
 * gated RMSNorm o = rmsnorm(o) * norm_w * SiLU(z). One threadgroup per
 * value head, one SIMD-group per state row. cv is the conv output row
 * (q heads | k heads | v heads); value head j reads k-head j % n_k. */
#define K_GDN_MAX_D 256
typedef struct {
    k_u32 tag;
    k_u32 n_k;      /* k heads */
    k_u32 n_v;      /* v heads */
    k_u32 d;        /* d_k == d_v, <= K_GDN_MAX_D */
    float eps;      /* rms_eps */
} k_gdn_delta_params;
#define K_ARGS_gdn_delta(X, K)                                            \
    X(K, 0, status, k_u32, K_STATUS, 2)                                   \
    X(K, 1, p, k_gdn_delta_params, K_PARAMS, 1)                           \
    X(K, 2, cv, float, K_IN, (2 * p.n_k + p.n_v) * p.d)                   \
    X(K, 3, z, float, K_IN, p.n_v * p.d)                                  \
    X(K, 4, ab, float, K_IN, 2 * p.n_v)                                   \
    X(K, 5, hp, float, K_IN, 2 * p.n_v + p.d)                             \
    X(K, 6, s, float, K_OUT, p.n_v * p.d * p.d)                           \
    X(K, 7, o, float, K_OUT, p.n_v * p.d)

/* -------------------------------------------------------- argmax_rows -- */
/* Greedy decoding without copying logits back: per row, the index of the
 * largest logit, ties to the LOWEST index (the CPU's strict > scan,
 * csrc/spec_round.c argmax_row), NaN never chosen (all NaN: index 0, as the
 * CPU). Also the top-k (k <= K_TOPK_MAX) indices by (value desc, index asc)
 * when k > 0. One threadgroup per row. */
#define K_TOPK_MAX 8
#define K_ARGMAX_NAN 0xFFFFFFFFu  /* the row holds a NaN */
#define K_ARGMAX_NONE 0xFFFFFFFEu /* fewer than k non-NaN values */
typedef struct {
    k_u32 tag;
    k_u32 n;        /* vocabulary */
    k_u32 n_rows;
    k_u32 stride;   /* floats between rows */
    k_u32 k;        /* top-k wanted, 0..K_TOPK_MAX (0: argmax only) */
} k_argmax_rows_params;
#define K_ARGS_argmax_rows(X, K)                                          \
    X(K, 0, status, k_u32, K_STATUS, 2)                                   \
    X(K, 1, p, k_argmax_rows_params, K_PARAMS, 1)                         \
    X(K, 2, x, float, K_IN, (p.n_rows - 1) * p.stride + p.n)              \
    X(K, 3, idx, k_u32, K_OUT, p.n_rows * (1 + K_TOPK_MAX))

/* ------------------------------------------- elementwise (elementwise.h) -- */
/* The layer loop's glue (gpu/host/runner.c), one thread per element. */
typedef struct {
    k_u32 tag;
    k_u32 n;        /* elements */
} k_add_rows_params;
#define K_ARGS_add_rows(X, K)                                             \
    X(K, 0, status, k_u32, K_STATUS, 2)                                   \
    X(K, 1, p, k_add_rows_params, K_PARAMS, 1)                            \
    X(K, 2, x, float, K_IN, p.n)                                          \
    X(K, 3, y, float, K_OUT, p.n)

typedef struct {
    k_u32 tag;
    k_u32 n;        /* elements */
} k_swiglu_params;
#define K_ARGS_swiglu(X, K)                                               \
    X(K, 0, status, k_u32, K_STATUS, 2)                                   \
    X(K, 1, p, k_swiglu_params, K_PARAMS, 1)                              \
    X(K, 2, up, float, K_IN, p.n)                                         \
    X(K, 3, gate, float, K_OUT, p.n)

typedef struct {
    k_u32 tag;
    k_u32 n_rows;
    k_u32 n_head;
    k_u32 head_dim;
    k_u32 qf_stride; /* floats between rows of qf (2 * n_head * head_dim) */
} k_attn_gate_params;
#define K_ARGS_attn_gate(X, K)                                            \
    X(K, 0, status, k_u32, K_STATUS, 2)                                   \
    X(K, 1, p, k_attn_gate_params, K_PARAMS, 1)                           \
    X(K, 2, qf, float, K_IN, (p.n_rows - 1) * p.qf_stride + 2 * p.n_head * p.head_dim) \
    X(K, 3, a, float, K_OUT, p.n_rows * p.n_head * p.head_dim)

typedef struct {
    k_u32 tag;
    k_u32 n_rows;
    k_u32 pos0;
    k_u32 n_head_kv;
    k_u32 head_dim;
    k_u32 src_stride; /* floats between rows of k and v */
    k_u32 n_pages;    /* pages in the pools */
} k_kv_store_params;
#define K_ARGS_kv_store(X, K)                                             \
    X(K, 0, status, k_u32, K_STATUS, 2)                                   \
    X(K, 1, p, k_kv_store_params, K_PARAMS, 1)                            \
    X(K, 2, k, float, K_IN, (p.n_rows - 1) * p.src_stride + p.n_head_kv * p.head_dim) \
    X(K, 3, v, float, K_IN, (p.n_rows - 1) * p.src_stride + p.n_head_kv * p.head_dim) \
    X(K, 4, pages, k_u32, K_IN, (p.pos0 + p.n_rows - 1) / K_ATTN_BLOCK + 1) \
    X(K, 5, kpool, k_u16, K_OUT, p.n_pages * p.n_head_kv * K_ATTN_BLOCK * p.head_dim) \
    X(K, 6, vpool, k_u16, K_OUT, p.n_pages * p.n_head_kv * K_ATTN_BLOCK * p.head_dim)

/* ------------------------------------------------- fused (fused.h) -- */
/* Glue fused into its neighbours (issue 19: fewer launches per token), bit
 * for bit the unfused sequence. Flags say which parts run / which outputs
 * are written; an output whose flag is off is still bound (1 element). */
#define K_NQ_ADD 1u  /* norm_quant: h += y first (add_rows) */
#define K_NQ_X 2u    /* store the float row (x; swiglu_quant: gate in place) */
#define K_NQ_Q8_0 4u /* store Q8_0 blocks (quantize_q8_0) */
#define K_NQ_Q8_K 8u /* store Q8_K blocks (quantize_q8_K) */
#define K_NQ_BLOCKS 16u /* swiglu_quant / attn_gate_quant with K_NQ_Q8_K: one SIMD-group per 256-value
                          * block (its 8 chunks in turn) instead of one per 32 values (each of a block's 8
                          * SIMD-groups computing the block's values and max, then writing its chunk): the
                          * host's choice for many rows, where that 8-fold recomputation costs more than
                          * the shorter chain saves; the same bits either way */
#define K_NQ_MAX_N 7168u /* norm_quant's n, at most (its row in threadgroup memory: 28 KB, within Apple's 32 KB; wider rows take add_rows + rmsnorm) */

/* Per row (one threadgroup per row, of rmsnorm's size for this n): h += y
 * (K_NQ_ADD), x = rmsnorm(h) * w (eps), then x's Q8_0 and/or Q8_K blocks
 * (rows of n/32 * 34 / n/256 * 292 bytes, as the quantizers write them). */
typedef struct {
    k_u32 tag;
    k_u32 n;        /* elements per row (a multiple of 32 / 256 for Q8_0 / Q8_K) */
    k_u32 n_rows;
    k_u32 stride;   /* floats between rows of y, h and x */
    float eps;
    k_u32 flags;    /* K_NQ_* */
} k_norm_quant_params;
#define K_ARGS_norm_quant(X, K)                                           \
    X(K, 0, status, k_u32, K_STATUS, 2)                                   \
    X(K, 1, p, k_norm_quant_params, K_PARAMS, 1)                          \
    X(K, 2, y, float, K_IN, (p.flags & K_NQ_ADD) ? (p.n_rows - 1) * p.stride + p.n : 1) \
    X(K, 3, h, float, K_OUT, (p.n_rows - 1) * p.stride + p.n)             \
    X(K, 4, w, float, K_IN, p.n)                                          \
    X(K, 5, x, float, K_OUT, (p.flags & K_NQ_X) ? (p.n_rows - 1) * p.stride + p.n : 1) \
    X(K, 6, q8, k_u8, K_OUT, (p.flags & K_NQ_Q8_0) ? p.n_rows * (p.n / 32) * 34 : 1) \
    X(K, 7, qk, k_u8, K_OUT, (p.flags & K_NQ_Q8_K) ? p.n_rows * (p.n / 256) * 292 : 1)

/* g = SiLU(g) * u (swiglu) over n_rows rows, g and u read from one buffer
 * (row r: g at r stride, u at r stride + up_off), then g's Q8_0 and/or
 * Q8_K blocks (rows of n values). One SIMD-group per 256 values with
 * K_NQ_Q8_K, else per 32. */
typedef struct {
    k_u32 tag;
    k_u32 n;        /* values per row, a multiple of 32 (256 with K_NQ_Q8_K) */
    k_u32 n_rows;
    k_u32 stride;   /* floats between rows of gu */
    k_u32 up_off;   /* floats from a row's g to its u, >= n */
    k_u32 flags;    /* K_NQ_Q8_0, K_NQ_Q8_K */
} k_swiglu_quant_params;
/* SIMD-groups: one per 32 values, or per 256 with K_NQ_Q8_K | K_NQ_BLOCKS */
#define K_FUSED_UNIT_VALUES(flags) ((((flags) & (K_NQ_Q8_K | K_NQ_BLOCKS)) == (K_NQ_Q8_K | K_NQ_BLOCKS)) ? 256u : 32u)
#define K_SWIGLU_QUANT_UNITS(p) ((p).n_rows * ((p).n / K_FUSED_UNIT_VALUES((p).flags)))
#define K_ARGS_swiglu_quant(X, K)                                         \
    X(K, 0, status, k_u32, K_STATUS, 2)                                   \
    X(K, 1, p, k_swiglu_quant_params, K_PARAMS, 1)                        \
    X(K, 2, gu, float, K_IN, (p.n_rows - 1) * p.stride + p.up_off + p.n)  \
    X(K, 3, q8, k_u8, K_OUT, (p.flags & K_NQ_Q8_0) ? p.n_rows * (p.n / 32) * 34 : 1) \
    X(K, 4, qk, k_u8, K_OUT, (p.flags & K_NQ_Q8_K) ? p.n_rows * (p.n / 256) * 292 : 1)

/* Attention's q/k head RMSNorm + partial NEOX RoPE in place (rmsnorm x2 +
 * rope_neox x2): grid (n_head + n_head_kv, n_rows) threadgroups of
 * rmsnorm's size for head_dim; w is q_norm then k_norm. */
typedef struct {
    k_u32 tag;
    k_u32 n_rows;
    k_u32 n_head;
    k_u32 n_head_kv;
    k_u32 head_dim;      /* <= K_ATTN_MAX_DIM */
    k_u32 n_rot;         /* even, <= head_dim */
    k_u32 q_stride;      /* floats between rows of q */
    k_u32 q_head_stride; /* floats between heads of a row of q */
    k_u32 k_stride;      /* floats between rows of k (heads head_dim apart) */
    float eps;
} k_qk_norm_rope_params;
#define K_ARGS_qk_norm_rope(X, K)                                         \
    X(K, 0, status, k_u32, K_STATUS, 2)                                   \
    X(K, 1, p, k_qk_norm_rope_params, K_PARAMS, 1)                        \
    X(K, 2, q, float, K_OUT, (p.n_rows - 1) * p.q_stride + (p.n_head - 1) * p.q_head_stride + p.head_dim) \
    X(K, 3, k, float, K_OUT, (p.n_rows - 1) * p.k_stride + p.n_head_kv * p.head_dim) \
    X(K, 4, w, float, K_IN, 2 * p.head_dim)                               \
    X(K, 5, cs, float, K_IN, p.n_rot ? p.n_rows * (p.n_rot / 2) : 1)      \
    X(K, 6, sn, float, K_IN, p.n_rot ? p.n_rows * (p.n_rot / 2) : 1)

/* attn_gate + the o projection's quantizer: rows of n_head * head_dim
 * values a * sigmoid(gate) (gate: the second half of each head of qf) as
 * Q8_0 and/or Q8_K blocks. One SIMD-group per 256 values with K_NQ_Q8_K,
 * else per 32. */
typedef struct {
    k_u32 tag;
    k_u32 n_rows;
    k_u32 n_head;
    k_u32 head_dim;
    k_u32 qf_stride; /* floats between rows of qf (2 * n_head * head_dim) */
    k_u32 flags;     /* K_NQ_Q8_0, K_NQ_Q8_K */
} k_attn_gate_quant_params;
#define K_ATTN_GATE_QUANT_UNITS(p) ((p).n_rows * ((p).n_head * (p).head_dim / K_FUSED_UNIT_VALUES((p).flags)))
#define K_ARGS_attn_gate_quant(X, K)                                      \
    X(K, 0, status, k_u32, K_STATUS, 2)                                   \
    X(K, 1, p, k_attn_gate_quant_params, K_PARAMS, 1)                     \
    X(K, 2, qf, float, K_IN, (p.n_rows - 1) * p.qf_stride + 2 * p.n_head * p.head_dim) \
    X(K, 3, a, float, K_IN, p.n_rows * p.n_head * p.head_dim)             \
    X(K, 4, q8, k_u8, K_OUT, (p.flags & K_NQ_Q8_0) ? p.n_rows * (p.n_head * p.head_dim / 32) * 34 : 1) \
    X(K, 5, qk, k_u8, K_OUT, (p.flags & K_NQ_Q8_K) ? p.n_rows * (p.n_head * p.head_dim / 256) * 292 : 1)

/* ------------------------------------------------------------ gdn_seq -- */
/* n_tok tokens of one GDN layer in ONE launch (prefill chunks, verify rows,
 * accept's replay, decode): per token the causal conv + SiLU (gdn_conv),
 * then the gated delta rule + gated RMSNorm (gdn_delta), the same
 * operations in the same order per value, so the outputs and the final
 * state are bit for bit those of n_tok launches of the two single-token
 * kernels at the same threadgroup size (the norms' float sums depend on
 * it). The recurrent state rows stay in registers between tokens
 * (K_GDN_SEQ_RPS rows per SIMD-group, K_GDN_SEQ_COLS elements per lane;
 * rows past that stay in device memory), written back once at the end.
 * Token t's row of `in` holds [qkv (conv_dim) ... z at z_off ... beta |
 * alpha at ab_off] (the runner's projection rows). The conv state is two
 * halves of `conv`: read from half `cur`, the shifted state written to half
 * 1 - cur (the q/k channels of a k head are read by every value head that
 * uses it, so an in-place update would race across threadgroups). split
 * threadgroups per value head (K_GX = head * split + part), each taking
 * d / split state rows; with split > 1 the gated norm is left to gdn_norm
 * (o gets the raw rows). n_v >= n_k (each k head's conv state written by
 * value head kh's first part). */
#ifndef K_GDN_SEQ_MAX_TG
#define K_GDN_SEQ_MAX_TG 256 /* threads per threadgroup, at most (CUDA register cap) */
#endif
typedef struct {
    k_u32 tag;
    k_u32 n_k;       /* k heads */
    k_u32 n_v;       /* v heads, >= n_k */
    k_u32 d;         /* d_k == d_v, <= K_GDN_MAX_D */
    k_u32 k;         /* conv taps, 2..K_GDN_MAX_CONV */
    k_u32 n_tok;     /* tokens, >= 1 */
    k_u32 in_stride; /* floats between token rows of in */
    k_u32 z_off;     /* z's offset in a row, >= conv_dim */
    k_u32 ab_off;    /* beta's offset (alpha follows), >= z_off + n_v d */
    k_u32 o_stride;  /* floats between token rows of o, >= n_v d */
    k_u32 cur;       /* 0 or 1: the half of conv holding the state now */
    float eps;
    k_u32 split;     /* threadgroups per value head, each d / split state rows
                      * (0 or 1: one, with the gated norm inline; > 1: o gets
                      * the raw outputs and gdn_norm finishes them) */
} k_gdn_seq_params;
#define K_GDN_SEQ_CD(p) ((2 * (p).n_k + (p).n_v) * (p).d)
#define K_ARGS_gdn_seq(X, K)                                              \
    X(K, 0, status, k_u32, K_STATUS, 2)                                   \
    X(K, 1, p, k_gdn_seq_params, K_PARAMS, 1)                             \
    X(K, 2, in, float, K_IN, (p.n_tok - 1) * p.in_stride + p.ab_off + 2 * p.n_v) \
    X(K, 3, cw, float, K_IN, K_GDN_SEQ_CD(p) * p.k)                       \
    X(K, 4, conv, float, K_OUT, 2 * (p.k - 1) * K_GDN_SEQ_CD(p))          \
    X(K, 5, hp, float, K_IN, 2 * p.n_v + p.d)                             \
    X(K, 6, s, float, K_OUT, p.n_v * p.d * p.d)                           \
    X(K, 7, o, float, K_OUT, (p.n_tok - 1) * p.o_stride + p.n_v * p.d)

/* ----------------------------------------------------------- gdn_norm -- */
/* gdn_seq's gated RMSNorm when it ran split (split > 1): o rows hold the raw
 * outputs (S q / sqrt(d)); each (value head K_GX, token K_GY) becomes
 * rmsnorm(o) * norm_w * SiLU(z) in place, gdn_delta's operations in its
 * order at the same threadgroup size (the runner's gdn_tg), so the bits of
 * the unsplit kernel. */
typedef struct {
    k_u32 tag;
    k_u32 n_v;       /* v heads */
    k_u32 d;         /* d_v, <= K_GDN_MAX_D */
    k_u32 n_tok;     /* tokens, >= 1 */
    k_u32 in_stride; /* floats between token rows of in (z at z_off) */
    k_u32 z_off;
    k_u32 o_stride;  /* floats between token rows of o, >= n_v d */
    float eps;
    k_u32 flags;     /* gdn_norm_quant (below): K_NQ_Q8_0 and/or K_NQ_Q8_K; gdn_norm: 0 */
} k_gdn_norm_params;
#define K_ARGS_gdn_norm(X, K)                                             \
    X(K, 0, status, k_u32, K_STATUS, 2)                                   \
    X(K, 1, p, k_gdn_norm_params, K_PARAMS, 1)                            \
    X(K, 2, in, float, K_IN, (p.n_tok - 1) * p.in_stride + p.z_off + p.n_v * p.d) \
    X(K, 3, hp, float, K_IN, 2 * p.n_v + p.d)                             \
    X(K, 4, o, float, K_OUT, (p.n_tok - 1) * p.o_stride + p.n_v * p.d)

/* ----------------------------------------------------- gdn_norm_quant -- */
/* gdn_norm, then the out projection's activation rows (quantize_q8_0 /
 * quantize_q8_K of o's rows: flags K_NQ_Q8_0 / K_NQ_Q8_K, rows of n_v d / 32
 * * 34 / n_v d / 256 * 292 bytes): threadgroup (K_GX, token K_GY), 256
 * threads, takes o's values 256 K_GX .. 256 K_GX + 255 (256 / d heads;
 * d a multiple of 32 dividing 256, n_v d a multiple of 256). The bits of
 * gdn_norm at a threadgroup of 256 (the runner's gdn_tg) and then the
 * quantizer (gdn.h). gdn_norm's params (flags) and first five slots. */
typedef k_gdn_norm_params k_gdn_norm_quant_params;
#define K_ARGS_gdn_norm_quant(X, K)                                       \
    K_ARGS_gdn_norm(X, K)                                                 \
    X(K, 5, q8, k_u8, K_OUT, (p.flags & K_NQ_Q8_0) ? p.n_tok * (p.n_v * p.d / 32) * 34 : 1) \
    X(K, 6, qk, k_u8, K_OUT, (p.flags & K_NQ_Q8_K) ? p.n_tok * (p.n_v * p.d / 256) * 292 : 1)

/* ----------------------------------------------------- gdn_prep / gdn_rows -- */
/* gdn_seq in two launches (then gdn_norm), for runs of many tokens: only
 * the state rows carry the recurrence, so everything else of a token is
 * computed for every token at once first.
 *
 * gdn_prep: threadgroup (g, t) = (k head g < n_k, or value head g - n_k;
 * token t). A k head's threadgroup runs the conv (gdn_conv's taps) of its
 * q and k channels and k_gdn_l2norm2's operations on them, thread tid
 * taking elements tid, tid + tgs, ...: at the runner's gdn_tg these are
 * gdn_seq's bits. A value head's runs the conv of its v channels and its
 * gates (beta, decay: gdn_delta's expressions). Token row t of pq holds
 * [q^ (n_k d) | k^ (n_k d) | v (n_v d) | beta (n_v) | decay (n_v)]
 * (q^, k^ normalised and scaled by 1/sqrt(d), as gdn_seq keeps them); the
 * token n_tok - 1 threadgroups write the shifted conv state to half
 * 1 - cur, as gdn_seq does. Grid (n_k + n_v, n_tok).
 *
 * gdn_rows: each SIMD-group takes p.rows (1..K_GDN_ROWS_MAX) consecutive
 * state rows of one value head (K_GDN_ROWS_WARPS(n_v, d, rows) SIMD-groups
 * in all; the runner picks rows so that they fit the GPU at once) through
 * n_tok tokens: gdn_seq's row operations on pq's row t, the raw outputs
 * S q / sqrt(d) to o for gdn_norm. No threadgroup memory, no barrier; d
 * at most 32 K_GDN_SEQ_COLS (the runner keeps gdn_seq above). */
/* gdn_seq's register tile of the state (gdn.h): rows per SIMD-group and
 * elements per lane of a row; gdn_rows keeps a row in K_GDN_SEQ_COLS
 * elements per lane too */
#ifndef K_GDN_SEQ_RPS
#define K_GDN_SEQ_RPS 16
#endif
#ifndef K_GDN_SEQ_COLS
#define K_GDN_SEQ_COLS 4
#endif
#ifndef K_GDN_ROWS_MAX
/* state rows per SIMD-group, at most: each costs registers for every run
 * (H100, gdn_rows on a 27B-like layer's 512 tokens: at most 4, 133
 * registers, rows 1 / 2 / 4 took 1285 / 852 / 661 us; at most 2, ~88
 * registers, 799 / 708; 0.8B-like heads (n_v 16) 570 / 393 / 577 vs 281 /
 * 333: fewer registers, more SIMD-groups resident, won) */
#define K_GDN_ROWS_MAX 2
#endif
#define K_GDN_PQ_STRIDE(n_k, n_v, d) ((2 * (n_k) + (n_v)) * (d) + 2 * (n_v))
/* gdn_rows loads the inputs of tokens in groups of K_GDN_AHEAD, a group
 * ahead (the same operations whatever it is: a test knob). */
#ifndef K_GDN_AHEAD
#define K_GDN_AHEAD 2
#endif
/* gdn_rows overlaps token t's S.q butterfly with token t + 1's S.k one
 * (1), or runs k_gdn_row_step token by token (0); the same bits. */
#ifndef K_GDN_ROWS_PIPE
#define K_GDN_ROWS_PIPE 1
#endif
#define K_GDN_ROWS_WARPS(n_v, d, rows) ((n_v) * (((d) + (rows) - 1) / (rows)))
typedef k_gdn_seq_params k_gdn_prep_params; /* split, o_stride unused */
#define K_ARGS_gdn_prep(X, K)                                             \
    X(K, 0, status, k_u32, K_STATUS, 2)                                   \
    X(K, 1, p, k_gdn_prep_params, K_PARAMS, 1)                            \
    X(K, 2, in, float, K_IN, (p.n_tok - 1) * p.in_stride + p.ab_off + 2 * p.n_v) \
    X(K, 3, cw, float, K_IN, K_GDN_SEQ_CD(p) * p.k)                       \
    X(K, 4, conv, float, K_OUT, 2 * (p.k - 1) * K_GDN_SEQ_CD(p))          \
    X(K, 5, hp, float, K_IN, 2 * p.n_v + p.d)                             \
    X(K, 6, pq, float, K_OUT, p.n_tok * K_GDN_PQ_STRIDE(p.n_k, p.n_v, p.d))
typedef struct {
    k_u32 tag;
    k_u32 n_k;      /* k heads */
    k_u32 n_v;      /* v heads, >= n_k */
    k_u32 d;        /* d_k == d_v, <= 32 K_GDN_SEQ_COLS */
    k_u32 n_tok;    /* tokens, >= 1 */
    k_u32 o_stride; /* floats between token rows of o, >= n_v d */
    k_u32 rows;     /* state rows per SIMD-group, 1..K_GDN_ROWS_MAX */
} k_gdn_rows_params;
#define K_ARGS_gdn_rows(X, K)                                             \
    X(K, 0, status, k_u32, K_STATUS, 2)                                   \
    X(K, 1, p, k_gdn_rows_params, K_PARAMS, 1)                            \
    X(K, 2, pq, float, K_IN, p.n_tok * K_GDN_PQ_STRIDE(p.n_k, p.n_v, p.d)) \
    X(K, 3, s, float, K_OUT, p.n_v * p.d * p.d)                           \
    X(K, 4, o, float, K_OUT, (p.n_tok - 1) * p.o_stride + p.n_v * p.d)

/* ---------------------------------------------------------- gemm (gemm.h) -- */
/* Prefill GEMM: y[r][o] = W_o . xq_r for n_rows activation rows of any
 * count (the runner's chunks wider than K_MATVEC_MAX_ROWS), every output
 * value bit for bit the width-1 matvec's (matvec_q8_0 / matvec_kq: the
 * same exact integer block sums, the same float terms, each added to the
 * same one of 32 per-lane accumulators in the same order, the same
 * butterfly), so batch invariance holds across the two paths. Tiled: a
 * threadgroup of K_GEMM_NSG SIMD-groups serves K_GEMM_NSG * K_GEMM_TOS
 * weight rows x K_GEMM_TR activation rows; the activation tile is staged
 * in threadgroup memory once per 1024 inputs and read by every SIMD-group,
 * each weight word is loaded once per tile and dotted with K_GEMM_TR rows.
 * Launch K_GEMM_GROUPS_X(n_rows) x K_GEMM_GROUPS_Y(n_out) threadgroups of
 * 32 K_GEMM_NSG threads (anything else raises K_ERR_SHAPE). The params are
 * the matvecs' (k_matvec_q8_0_params / k_matvec_kq_params) except n_rows,
 * which may exceed K_MATVEC_MAX_ROWS. */
#ifndef K_GEMM_NSG
#define K_GEMM_NSG 4 /* SIMD-groups per threadgroup */
#endif
#ifndef K_GEMM_TOS
#define K_GEMM_TOS 4 /* weight rows per SIMD-group */
#endif
#ifndef K_GEMM_TR
#define K_GEMM_TR 16 /* activation rows per threadgroup tile */
#endif
#define K_GEMM_TG (32 * K_GEMM_NSG)
/* grid x: activation-row tiles (consecutive threadgroups share weight rows:
 * L2 hits), grid y: weight-row tiles */
#define K_GEMM_GROUPS_X(n_rows) (((n_rows) + K_GEMM_TR - 1) / K_GEMM_TR)
#define K_GEMM_GROUPS_Y(n_out) (((n_out) + K_GEMM_NSG * K_GEMM_TOS - 1) / (K_GEMM_NSG * K_GEMM_TOS))
typedef k_matvec_q8_0_params k_gemm_q8_0_params;
typedef k_matvec_kq_params k_gemm_kq_params;
#define K_ARGS_gemm_q8_0(X, K) K_ARGS_matvec_q8_0(X, K)
#define K_ARGS_gemm_kq(X, K) K_ARGS_matvec_kq(X, K)

/* ------------------------------------------------ gemm_mma (gemm_mma.h) -- */
/* The same products as gemm_q8_0 / gemm_kq, bit for bit (every value the
 * width-1 matvec's), with the exact integer block dot products from int8
 * tensor-core MMA (CUDA mma.sync m16n8k16/k32; the emulator emulates its
 * fragment layout; not on Metal). A threadgroup of K_MMA_NSG SIMD-groups
 * serves 16 K_MMA_NSG weight rows (16 per SIMD-group) x K_MMA_TR = 8
 * K_MMA_NT activation rows. Launch K_MMA_GROUPS_X(n_rows) x
 * K_MMA_GROUPS_Y(n_out) threadgroups of K_MMA_TG threads (anything else
 * raises K_ERR_SHAPE). Same params and tables as the matvecs (n_rows any
 * count). gemm_kq_mma stages each step's weight and activation slices in
 * threadgroup memory (gemm_mma.h) and takes the Q4_K/Q5_K min terms from
 * the Q8_K bsums, as the matvec does. */
#ifndef K_MMA_NSG
#define K_MMA_NSG 4 /* SIMD-groups per threadgroup (16 weight rows each) */
#endif
#ifndef K_MMA_NT
#define K_MMA_NT 4 /* 8-row activation tiles per SIMD-group */
#endif
#define K_MMA_TG (32 * K_MMA_NSG)
#define K_MMA_TR (8 * K_MMA_NT)
#define K_MMA_WR (16u * K_MMA_NSG) /* weight rows per threadgroup */
#define K_MMA_GROUPS_X(n_rows) (((n_rows) + K_MMA_TR - 1) / K_MMA_TR)
#define K_MMA_GROUPS_Y(n_out) (((n_out) + 16 * K_MMA_NSG - 1) / (16 * K_MMA_NSG))
/* gemm_kq_mma and moe_gemm_mma have their own tile (the same meaning:
 * 16 K_MMA_KQ_NSG weight rows x 8 K_MMA_KQ_NT activation rows, K_MMA_KQ_TG
 * threads); under K_KQ_ORDER 1 it must be Q8_0's (the shared first tile). */
#ifndef K_MMA_KQ_NSG
#define K_MMA_KQ_NSG K_MMA_NSG
#endif
#ifndef K_MMA_KQ_NT
#define K_MMA_KQ_NT K_MMA_NT
#endif
#define K_MMA_KQ_TG (32 * K_MMA_KQ_NSG)
#define K_MMA_KQ_TR (8 * K_MMA_KQ_NT)
#define K_MMA_KQ_WR (16u * K_MMA_KQ_NSG)
#define K_MMA_KQ_GROUPS_X(n_rows) (((n_rows) + K_MMA_KQ_TR - 1) / K_MMA_KQ_TR)
#define K_MMA_KQ_GROUPS_Y(n_out) (((n_out) + 16 * K_MMA_KQ_NSG - 1) / (16 * K_MMA_KQ_NSG))
typedef k_matvec_q8_0_params k_gemm_q8_0_mma_params;
typedef k_matvec_kq_params k_gemm_kq_mma_params;
#define K_ARGS_gemm_q8_0_mma(X, K) K_ARGS_matvec_q8_0(X, K)
#define K_ARGS_gemm_kq_mma(X, K) K_ARGS_matvec_kq(X, K)

/* ------------------------------------------------------ moe (moe.h) -- */
/* The routed MoE FFN of qwen35moe (gpu/kernels/moe.h; ids 22..25: the
 * largest id stays last in the list, Metal's K_ID_END_ sizes its tables). Expert matrices are the file's 3-D tensors
 * (expert e at e * rows * row bytes); types Q8_0 (ggml 8), Q4_K, Q5_K, Q6_K. */
#define K_TYPE_Q8_0 8
#define K_MOE_MAX_EXPERTS 512
#define K_MOE_MAX_K 16
#define K_MOE_SHGATE 1u      /* moe_route: logit n_expert is the shared expert's gate */
#define K_ERR_MOE_LOGIT 4u   /* moe_route: a router logit is NaN or infinite */
#define K_MOE_TYPE_OK(t) ((t) == K_TYPE_Q8_0 || K_KQ_BLOCK_BYTES(t) != 0u)
/* bytes of one weight row of n values of type t / of its activation row
 * (Q8_0 blocks for Q8_0 weights, Q8_K for the K-quants) */
#define K_MOE_ROW_BYTES(t, n) ((t) == K_TYPE_Q8_0 ? (n) / 32u * 34u : (n) / 256u * K_KQ_BLOCK_BYTES(t))
#define K_MOE_ACT_BYTES(t, n) ((t) == K_TYPE_Q8_0 ? (n) / 32u * 34u : (n) / 256u * 292u)
#define K_MOE_IS_Q8_0(t) ((t) == K_TYPE_Q8_0 ? 1u : 0u)

/* y[r][o] = W_o . x_r, F32 weights and activations (the router, with the
 * shared expert's gate as one more row). One SIMD-group per output row:
 * launch >= n_out / (SIMD-groups per threadgroup) threadgroups. */
typedef struct {
    k_u32 tag;
    k_u32 n_in;
    k_u32 n_out;
    k_u32 n_rows;
    k_u32 x_stride; /* floats between rows of x */
    k_u32 y_stride; /* floats between rows of y */
} k_moe_logits_params;
#define K_ARGS_moe_logits(X, K)                                           \
    X(K, 0, status, k_u32, K_STATUS, 2)                                   \
    X(K, 1, p, k_moe_logits_params, K_PARAMS, 1)                          \
    X(K, 2, w, float, K_IN, p.n_out * p.n_in)                             \
    X(K, 3, x, float, K_IN, (p.n_rows - 1) * p.x_stride + p.n_in)         \
    X(K, 4, y, float, K_OUT, (p.n_rows - 1) * p.y_stride + p.n_out)

/* moe_logits for chunks of token rows, the same bits (moe.h): threadgroup
 * (K_GX, K_GY) takes router rows K_MOE_LOGITS_WIDE_O K_GX .. and token rows
 * K_MOE_LOGITS_WIDE_ROWS K_GY ..; its SIMD-groups split the rows' inputs as
 * moe_logits' do. */
#ifndef K_MOE_LOGITS_WIDE_O
#define K_MOE_LOGITS_WIDE_O 4u /* router rows per threadgroup */
#endif
#ifndef K_MOE_LOGITS_WIDE_ROWS
#define K_MOE_LOGITS_WIDE_ROWS 64u /* token rows per threadgroup */
#endif
/* The most SIMD-groups a threadgroup of it may have: 32 (1024 threads)
 * asked an H100 for more registers than an SM has ("too many resources
 * requested for launch", session 32); the runner keeps moe_logits there. */
#define K_MOE_LOGITS_WIDE_MAX_SPLIT 16u
typedef k_moe_logits_params k_moe_logits_wide_params;
#define K_ARGS_moe_logits_wide(X, K) K_ARGS_moe_logits(X, K)

/* Per token row (one SIMD-group each): softmax over n_expert logits, the
 * top k (ties to the lower id), weights renormalised (sum clamped below at
 * 6.103515625e-5); sel[r][s] the expert of slot s, wt[r][s] its weight,
 * wt[r][k] sigmoid(the shared gate) with K_MOE_SHGATE (else 1). */
typedef struct {
    k_u32 tag;
    k_u32 n_expert; /* 1..K_MOE_MAX_EXPERTS */
    k_u32 k;        /* 1..K_MOE_MAX_K, <= n_expert */
    k_u32 n_rows;
    k_u32 stride;   /* floats between rows of logits */
    k_u32 flags;    /* K_MOE_SHGATE */
} k_moe_route_params;
#define K_ARGS_moe_route(X, K)                                            \
    X(K, 0, status, k_u32, K_STATUS, 2)                                   \
    X(K, 1, p, k_moe_route_params, K_PARAMS, 1)                           \
    X(K, 2, logits, float, K_IN, (p.n_rows - 1) * p.stride + p.n_expert + (p.flags & K_MOE_SHGATE ? 1 : 0)) \
    X(K, 3, sel, k_u32, K_OUT, p.n_rows * p.k)                            \
    X(K, 4, wt, float, K_OUT, p.n_rows * (p.k + 1))

/* h[P][j] = SiLU(gate_j . x_t) * (up_j . x_t) for pair P = t k + s of
 * expert sel[P] (pairs n_rows k ..: the shared expert of row P - n_rows k),
 * j < n_ff (shared: n_ff_sh). Grid: >= max(n_ff, n_ff_sh) / (SIMD-groups
 * per threadgroup) x K_MOE_PAIRS(p). x_t: row t of xq8 (Q8_0) / xqk (Q8_K),
 * as the matrix types need. All four matrices live in one buffer w (the
 * emulator takes 8 bindings at most), at byte offsets multiple of 16:
 * expert e's gate at e g_estride, its up at u_base + e u_estride from row
 * u_row0 (a fused gate_up tensor: u_base 0, u_row0 n_ff), the shared
 * expert's gate / up at sg_base / su_base. */
typedef struct {
    k_u32 tag;
    k_u32 n_in;     /* n_embd: a multiple of 32 (256 when a K-quant matrix reads it) */
    k_u32 n_ff;     /* routed rows (n_ff_exp) */
    k_u32 n_ff_sh;  /* shared expert rows (0: no shared expert) */
    k_u32 k;
    k_u32 n_rows;
    k_u32 n_expert;
    k_u32 t_gate, t_up, t_sgate, t_sup; /* ggml types */
    k_u32 g_estride, u_base, u_estride, u_row0, sg_base, su_base; /* bytes (u_row0: rows) */
    k_u32 h_stride; /* floats between pair rows of h, >= max(n_ff, n_ff_sh) */
} k_moe_gate_up_params;
#define K_MOE_MAX2(a, b) ((a) > (b) ? (a) : (b))
#define K_MOE_PAIRS(p) ((p).n_rows * (p).k + ((p).n_ff_sh ? (p).n_rows : 0u))
#define K_MOE_GU_Q8_0(p) (K_MOE_IS_Q8_0((p).t_gate) | K_MOE_IS_Q8_0((p).t_up) | \
                          ((p).n_ff_sh ? K_MOE_IS_Q8_0((p).t_sgate) | K_MOE_IS_Q8_0((p).t_sup) : 0u))
#define K_MOE_GU_Q8_K(p) ((1u - K_MOE_IS_Q8_0((p).t_gate)) | (1u - K_MOE_IS_Q8_0((p).t_up)) | \
                          ((p).n_ff_sh ? (1u - K_MOE_IS_Q8_0((p).t_sgate)) | (1u - K_MOE_IS_Q8_0((p).t_sup)) : 0u))
#define K_MOE_IN_ALIGN(p) (K_MOE_GU_Q8_K(p) ? 256u : 32u)
#define K_MOE_GU_W_BYTES(p)                                                                          \
    K_MOE_MAX2(K_MOE_MAX2((p).n_expert * (p).g_estride, (p).u_base + (p).n_expert * (p).u_estride), \
               (p).n_ff_sh ? K_MOE_MAX2((p).sg_base + (p).n_ff_sh * K_MOE_ROW_BYTES((p).t_sgate, (p).n_in), \
                                        (p).su_base + (p).n_ff_sh * K_MOE_ROW_BYTES((p).t_sup, (p).n_in)) : 0u)
#define K_ARGS_moe_gate_up(X, K)                                          \
    X(K, 0, status, k_u32, K_STATUS, 2)                                   \
    X(K, 1, p, k_moe_gate_up_params, K_PARAMS, 1)                         \
    X(K, 2, sel, k_u32, K_IN, p.n_rows * p.k)                             \
    X(K, 3, xq8, k_u8, K_IN, K_MOE_GU_Q8_0(p) ? p.n_rows * K_MOE_ACT_BYTES(K_TYPE_Q8_0, p.n_in) : 1) \
    X(K, 4, xqk, k_u8, K_IN, K_MOE_GU_Q8_K(p) ? p.n_rows * K_MOE_ACT_BYTES(K_TYPE_Q4_K, p.n_in) : 1) \
    X(K, 5, w, k_u8, K_IN, K_MOE_GU_W_BYTES(p))                           \
    X(K, 6, h, float, K_OUT, K_MOE_PAIRS(p) * p.h_stride)

/* out[t][o] = sum over slots s = 0..k-1 in order of wt[t][s] * (down_o of
 * expert sel[t k + s] . hq of pair t k + s), + wt[t][k] * (shared down_o .
 * hq of the shared pair of t). hq8 / hqk: the SwiGLU rows quantized for
 * the down types (Q8_0 / Q8_K): pair P at P * act_bytes(n_ff), the shared
 * row of t at n_rows k act_bytes(n_ff) + t act_bytes(n_ff_sh) of the buffer
 * of its type. w: the experts' down matrices (expert e at e n_out
 * row_bytes), the shared expert's at sd_base (a multiple of 16). Grid: >=
 * n_out / (SIMD-groups per threadgroup) x n_rows. */
typedef struct {
    k_u32 tag;
    k_u32 n_ff;     /* routed down's n_in */
    k_u32 n_ff_sh;  /* shared down's n_in (0: no shared expert) */
    k_u32 n_out;    /* n_embd */
    k_u32 k;
    k_u32 n_rows;
    k_u32 n_expert;
    k_u32 t_down, t_sdown;
    k_u32 sd_base;  /* bytes */
    k_u32 y_stride; /* floats between rows of out */
} k_moe_down_params;
#define K_MOE_HQ_NEED(p, q80) \
    ((K_MOE_IS_Q8_0((p).t_down) == (q80) || ((p).n_ff_sh && K_MOE_IS_Q8_0((p).t_sdown) == (q80)))                \
         ? (p).n_rows * (p).k * K_MOE_ACT_BYTES((q80) ? K_TYPE_Q8_0 : K_TYPE_Q4_K, (p).n_ff) +                  \
               ((p).n_ff_sh && K_MOE_IS_Q8_0((p).t_sdown) == (q80)                                            \
                    ? (p).n_rows * K_MOE_ACT_BYTES((q80) ? K_TYPE_Q8_0 : K_TYPE_Q4_K, (p).n_ff_sh) : 0u) \
         : 1u)
#define K_ARGS_moe_down(X, K)                                             \
    X(K, 0, status, k_u32, K_STATUS, 2)                                   \
    X(K, 1, p, k_moe_down_params, K_PARAMS, 1)                            \
    X(K, 2, sel, k_u32, K_IN, p.n_rows * p.k)                             \
    X(K, 3, wt, float, K_IN, p.n_rows * (p.k + 1))                        \
    X(K, 4, hq8, k_u8, K_IN, K_MOE_HQ_NEED(p, 1u))                        \
    X(K, 5, hqk, k_u8, K_IN, K_MOE_HQ_NEED(p, 0u))                        \
    X(K, 6, w, k_u8, K_IN, K_MOE_MAX2(p.n_expert * p.n_out * K_MOE_ROW_BYTES(p.t_down, p.n_ff), \
                                      p.n_ff_sh ? p.sd_base + p.n_out * K_MOE_ROW_BYTES(p.t_sdown, p.n_ff_sh) : 0u)) \
    X(K, 7, out, float, K_OUT, (p.n_rows - 1) * p.y_stride + p.n_out)

/* ------------------------------------------ matvec_q4_64a (quant_q4_64a.h) -- */
/* y[r][o] = W_o . xq_r for Q4_64A weights (ds4's affine 4-bit type: 36-byte
 * blocks of 64 weights, bf16 scale and bias; ids 35..37 after the MMA ids,
 * so the largest id stays last) and Q8_0 activation rows (quantize_q8_0's
 * output: the CPU's pairing, two activation blocks per weight block), r <
 * n_rows (1..16, every weight block read once for all rows). Three
 * variants like matvec_kq1/kq4/kq, one table: widths 1, 2..4, 5..16
 * (K_MATVEC_Q4_64A_KERNEL), RPS rows per SIMD-group each; launch
 * K_MATVEC_Q4_64A_GROUPS(n_rows, n_out, SIMD-groups per threadgroup)
 * threadgroups of at most K_MATVEC_MAX_TG threads (a grid too small for
 * n_out raises K_ERR_SHAPE). A row's float order never depends on the
 * variant, the width or the threadgroup size (quant_q4_64a.h). */
typedef struct {
    k_u32 tag;
    k_u32 n_in;     /* a multiple of 64 */
    k_u32 n_out;
    k_u32 n_rows;   /* 1..K_MATVEC_MAX_ROWS (1 / 4 for the narrow variants) */
    k_u32 y_stride; /* floats between rows of y */
} k_matvec_q4_64a_params;
#define K_ARGS_matvec_q4_64a(X, K)                                        \
    X(K, 0, status, k_u32, K_STATUS, 2)                                   \
    X(K, 1, p, k_matvec_q4_64a_params, K_PARAMS, 1)                       \
    X(K, 2, w, k_u8, K_IN, p.n_out * (p.n_in / 64) * 36)                  \
    X(K, 3, xq, k_u8, K_IN, p.n_rows * (p.n_in / 32) * 34)                \
    X(K, 4, y, float, K_OUT, (p.n_rows - 1) * p.y_stride + p.n_out)
typedef k_matvec_q4_64a_params k_matvec_q4_64a1_params;
typedef k_matvec_q4_64a_params k_matvec_q4_64a4_params;
#define K_ARGS_matvec_q4_64a1(X, K) K_ARGS_matvec_q4_64a(X, K)
#define K_ARGS_matvec_q4_64a4(X, K) K_ARGS_matvec_q4_64a(X, K)
/* the prefill GEMM (quant_q4_64a.h gemm_q4_64a): the matvec's table, K_GEMM_GROUPS_X(n_rows) x
 * K_GEMM_GROUPS_Y(n_out) threadgroups of K_GEMM_TG threads */
typedef k_matvec_q4_64a_params k_gemm_q4_64a_params;
#define K_ARGS_gemm_q4_64a(X, K) K_ARGS_matvec_q4_64a(X, K)
#define K_MATVEC_Q4_64A_KERNEL(n_rows) \
    ((n_rows) <= 1 ? K_ID_matvec_q4_64a1 : (n_rows) <= 4 ? K_ID_matvec_q4_64a4 : K_ID_matvec_q4_64a)
#ifndef K_Q4A1_RPS
#define K_Q4A1_RPS 1 /* width 1: a whole SIMD-group streams one row */
#endif
#ifndef K_Q4A4_RPS
#define K_Q4A4_RPS 1
#endif
#ifndef K_Q4A16_RPS
#define K_Q4A16_RPS 2 /* two rows' octets share each activation read */
#endif
#define K_MATVEC_Q4_64A_RPS(n_rows) ((n_rows) <= 1 ? K_Q4A1_RPS : (n_rows) <= 4 ? K_Q4A4_RPS : K_Q4A16_RPS)
#define K_MATVEC_Q4_64A_GROUPS(n_rows, n_out, nsg) \
    (((n_out) + K_MATVEC_Q4_64A_RPS(n_rows) * (nsg) - 1) / (K_MATVEC_Q4_64A_RPS(n_rows) * (nsg)))

/* ----------------------------------------- grouped MoE (moe_gemm.h) -- */
/* Prefill's routed MoE with the rows grouped by expert, so an expert's
 * weights are read once per tile of K_GEMM_TR pairs instead of once per
 * pair (gpu/kernels/moe_gemm.h): moe_group sorts the pairs, moe_gemm runs
 * the prefill GEMM's tiles on them (gate and up, then down), moe_combine
 * adds the down rows as moe_down does. Every value is the per-pair
 * kernels' (moe_gate_up / moe_down) bit for bit. */
#define K_MOE_GROUP_MAX_PAIRS 8192u /* routed pairs (n_rows k) moe_group sorts at once (16 KB of u16 ids) */
#define K_MOE_TILE_EMPTY 0xffffffffu
#define K_MOE_GROUP_TG 256u /* the runner's moe_group threadgroup: experts counted in parallel (any size works) */
#define K_MOE_TILE_MAX_ROWS 64u /* tile_rows: moe_gemm takes K_GEMM_TR, moe_gemm_mma K_MMA_TR */
/* tiles of tr rows moe_group may write: sum over experts of ceil(count /
 * tr) <= ceil(n k / tr) + (experts with a pair), plus the shared expert's */
#define K_MOE_GROUP_TILES(n_rows, k, n_expert, shared, tr)                                              \
    (((n_rows) * (k) + (tr) - 1) / (tr) +                                                           \
     ((n_expert) < (n_rows) * (k) ? (n_expert) : (n_rows) * (k)) + ((shared) ? ((n_rows) + (tr) - 1) / (tr) : 0))

/* One threadgroup: the n_rows k routed pairs P = t k + s (expert sel[P])
 * and, with `shared`, the shared expert's pairs n_rows k + t (as expert
 * n_expert), grouped by expert in ascending expert order, each expert's
 * pairs in ascending P: order[] (every pair once). tiles[2 i], tiles[2 i +
 * 1] for i < n_tiles: the expert, then start | count << 16 (order[start ..
 * start + count), count <= tile_rows); the tiles past the last written
 * K_MOE_TILE_EMPTY. An expert id >= n_expert raises K_ERR_SHAPE. */
typedef struct {
    k_u32 tag;
    k_u32 n_rows;
    k_u32 k;
    k_u32 n_expert; /* 1..K_MOE_MAX_EXPERTS */
    k_u32 shared;   /* 1: the shared expert's pairs too */
    k_u32 n_tiles;  /* K_MOE_GROUP_TILES(n_rows, k, n_expert, shared, tile_rows) */
    k_u32 tile_rows; /* pairs per tile, 1..K_MOE_TILE_MAX_ROWS: the GEMM's tile (K_GEMM_TR / K_MMA_TR) */
} k_moe_group_params;
#define K_ARGS_moe_group(X, K)                                            \
    X(K, 0, status, k_u32, K_STATUS, 2)                                   \
    X(K, 1, p, k_moe_group_params, K_PARAMS, 1)                           \
    X(K, 2, sel, k_u32, K_IN, p.n_rows * p.k)                             \
    X(K, 3, order, k_u32, K_OUT, p.n_rows * p.k + (p.shared ? p.n_rows : 0)) \
    X(K, 4, tiles, k_u32, K_OUT, 2 * p.n_tiles)

/* y[P][z y_zoff + o] = row o of matrix z of pair P's expert . P's
 * activation row, for the tiles of moe_group (grid x: n_tiles, y: weight
 * tiles of K_GEMM_NSG K_GEMM_TOS rows, z: the matrices, 1 or 2), in
 * threadgroups of K_GEMM_TG threads. Matrix z of expert e at byte base_z +
 * e estride_z of w (n_out rows of n_in), the shared expert's (tile expert
 * n_expert) at sbase_z (n_out_sh rows of n_in_sh); types t_z / ts_z.
 * Activations: down = 0 (gate / up): token row P / k (shared: P - n_rows
 * k) of xq8 / xqk, rows of n_in; down = 1: the pair's own quantized SwiGLU
 * row in moe_down's layout (pair P at P act_bytes(n_in); the shared row of
 * t at n_rows k act_bytes(type, n_in) + t act_bytes(type, n_in_sh)). */
typedef struct {
    k_u32 tag;
    k_u32 n_rows, k, n_expert;
    k_u32 n_tiles;
    k_u32 down;
    k_u32 n_in, n_in_sh;   /* routed / shared inputs per row */
    k_u32 n_out, n_out_sh; /* routed / shared matrix rows (0: no shared expert) */
    k_u32 t0, t1, ts0, ts1; /* ggml types of matrices z = 0, 1 (routed, shared) */
    k_u32 base0, estride0, base1, estride1, sbase0, sbase1; /* bytes */
    k_u32 y_stride, y_zoff; /* floats */
} k_moe_gemm_params;
#define K_MOE_GEMM_PAIRS(p) ((p).n_rows * (p).k + ((p).n_out_sh ? (p).n_rows : 0u))
#define K_MOE_GEMM_TYPES_Q8_0(p) (K_MOE_IS_Q8_0((p).t0) | K_MOE_IS_Q8_0((p).t1) | \
                                  ((p).n_out_sh ? K_MOE_IS_Q8_0((p).ts0) | K_MOE_IS_Q8_0((p).ts1) : 0u))
#define K_MOE_GEMM_TYPES_Q8_K(p) ((1u - K_MOE_IS_Q8_0((p).t0)) | (1u - K_MOE_IS_Q8_0((p).t1)) | \
                                  ((p).n_out_sh ? (1u - K_MOE_IS_Q8_0((p).ts0)) | (1u - K_MOE_IS_Q8_0((p).ts1)) : 0u))
/* activation bytes of activation type q8 (1: Q8_0, 0: Q8_K): down, moe_down's
 * layout (K_MOE_HQ_NEED with t_down = t0, t_sdown = ts0); else token rows */
#define K_MOE_GEMM_SH(p) ((p).n_out_sh != 0u)
#define K_MOE_GEMM_HQ(p, q80)                                                                                   \
    ((K_MOE_IS_Q8_0((p).t0) == (q80) || (K_MOE_GEMM_SH(p) && K_MOE_IS_Q8_0((p).ts0) == (q80)))                 \
         ? (p).n_rows * (p).k * K_MOE_ACT_BYTES((q80) ? K_TYPE_Q8_0 : K_TYPE_Q4_K, (p).n_in) +                   \
               (K_MOE_GEMM_SH(p) && K_MOE_IS_Q8_0((p).ts0) == (q80)                                             \
                    ? (p).n_rows * K_MOE_ACT_BYTES((q80) ? K_TYPE_Q8_0 : K_TYPE_Q4_K, (p).n_in_sh) : 0u)         \
         : 1u)
#define K_MOE_GEMM_X(p, q8)                                                                                    \
    ((p).down ? K_MOE_GEMM_HQ(p, q8)                                                                           \
              : ((q8) ? K_MOE_GEMM_TYPES_Q8_0(p) : K_MOE_GEMM_TYPES_Q8_K(p))                                   \
                    ? (p).n_rows * K_MOE_ACT_BYTES((q8) ? K_TYPE_Q8_0 : K_TYPE_Q4_K, (p).n_in) : 1u)
#define K_MOE_GEMM_END(base, es, ne, rows, t, n) ((base) + ((ne) - 1u) * (es) + (rows) * K_MOE_ROW_BYTES((t), (n)))
#define K_MOE_GEMM_W(p)                                                                                         \
    K_MOE_MAX2(K_MOE_MAX2(K_MOE_GEMM_END((p).base0, (p).estride0, (p).n_expert, (p).n_out, (p).t0, (p).n_in),   \
                          (p).down ? 0u : K_MOE_GEMM_END((p).base1, (p).estride1, (p).n_expert, (p).n_out, (p).t1, (p).n_in)), \
               (p).n_out_sh ? K_MOE_MAX2((p).sbase0 + (p).n_out_sh * K_MOE_ROW_BYTES((p).ts0, (p).n_in_sh),      \
                                         (p).down ? 0u : (p).sbase1 + (p).n_out_sh * K_MOE_ROW_BYTES((p).ts1, (p).n_in_sh)) \
                            : 0u)
#define K_ARGS_moe_gemm(X, K)                                             \
    X(K, 0, status, k_u32, K_STATUS, 2)                                   \
    X(K, 1, p, k_moe_gemm_params, K_PARAMS, 1)                            \
    X(K, 2, tiles, k_u32, K_IN, 2 * p.n_tiles)                            \
    X(K, 3, order, k_u32, K_IN, K_MOE_GEMM_PAIRS(p))                      \
    X(K, 4, xq8, k_u8, K_IN, K_MOE_GEMM_X(p, 1u))                         \
    X(K, 5, xqk, k_u8, K_IN, K_MOE_GEMM_X(p, 0u))                         \
    X(K, 6, w, k_u8, K_IN, K_MOE_GEMM_W(p))                               \
    X(K, 7, y, float, K_OUT, K_MOE_GEMM_PAIRS(p) * p.y_stride)
/* moe_gemm_mma (gemm_mma.h; CUDA and the emulator): the same products on
 * int8 tensor cores (gemm_kq_mma's staged tile) for tiles of up to
 * K_MMA_TR pairs (moe_group's tile_rows), grid y: weight tiles of
 * K_MMA_WR = 16 K_MMA_NSG rows, K_MMA_TG threads; K-quant matrices only
 * (a Q8_0 matrix raises K_ERR_SHAPE: the runner takes moe_gemm). */
typedef k_moe_gemm_params k_moe_gemm_mma_params;
#define K_ARGS_moe_gemm_mma(X, K) K_ARGS_moe_gemm(X, K)

/* out[t][o] = moe_down's combine of the down rows dn: y = dn[t k][o] wt[t][0],
 * y = y + dn[t k + s][o] wt[t][s] for s = 1..k-1, then (shared) y = y +
 * wt[t][k] dn[n_rows k + t][o]. One thread per (o, t): grid x >= n_out / threads, y
 * = n_rows. */
typedef struct {
    k_u32 tag;
    k_u32 n_rows, k, n_out;
    k_u32 shared;   /* 1: dn holds the shared expert's rows after the routed ones */
    k_u32 d_stride; /* floats between pair rows of dn */
    k_u32 y_stride; /* floats between rows of out */
} k_moe_combine_params;
#define K_ARGS_moe_combine(X, K)                                          \
    X(K, 0, status, k_u32, K_STATUS, 2)                                   \
    X(K, 1, p, k_moe_combine_params, K_PARAMS, 1)                         \
    X(K, 2, wt, float, K_IN, p.n_rows * (p.k + 1))                        \
    X(K, 3, dn, float, K_IN, (p.n_rows * p.k + (p.shared ? p.n_rows : 0u) - 1) * p.d_stride + p.n_out) \
    X(K, 4, out, float, K_OUT, (p.n_rows - 1) * p.y_stride + p.n_out)

/* ---------------------------------------------------- derived names -- */
/* K_ID_<kernel>, K_TAG_OF(kernel), K_ARG_<kernel>_<name> (the slot of an
 * argument) and K_NARGS_<kernel>. Slots must be 0, 1, 2, ... in table order:
 * host/bind.c checks it for every table at start-up. */
#define K_ID_ITEM_(id, K) K_ID_##K = id,
enum { K_KERNEL_LIST(K_ID_ITEM_) K_ID_END_ };
#define K_TAG_OF(K) K_TAG(K_ID_##K)
#define K_ARG_ITEM_(K, slot, name, T, kind, n) K_ARG_##K##_##name = slot,
#define K_ARG_ENUM_(id, K) enum { K_ARGS_##K(K_ARG_ITEM_, K) K_NARGS_##K };
K_KERNEL_LIST(K_ARG_ENUM_)

#endif
