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
    X(6, attn_merge)

/* A params struct starts with its tag: 0xD5A0 in the high half, the kernel
 * id in the low half. */
#define K_TAG(id) (0xD5A00000u | (k_u32)(id))

/* ------------------------------------------------------------ rmsnorm -- */
/* y_row = x_row / sqrt(mean(x_row^2) + eps) * w, one threadgroup per row. */
typedef struct {
    k_u32 tag;
    k_u32 n;        /* elements per row */
    k_u32 n_rows;
    k_u32 stride;   /* elements between rows of x and y */
    float eps;
    k_u32 has_w;    /* 0: no weight (w still bound, may be 1 element) */
} k_rmsnorm_params;
#define K_ARGS_rmsnorm(X, K)                                              \
    X(K, 0, status, k_u32, K_STATUS, 2)                                   \
    X(K, 1, p, k_rmsnorm_params, K_PARAMS, 1)                             \
    X(K, 2, x, float, K_IN, (p.n_rows - 1) * p.stride + p.n)              \
    X(K, 3, w, float, K_IN, p.has_w ? p.n : 1)                            \
    X(K, 4, y, float, K_OUT, (p.n_rows - 1) * p.stride + p.n)

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
 * every weight block read once for all rows), W rows of n_in Q8_0 weights,
 * xq rows of Q8_0 activations (quantize_q8_0's output). One SIMD-group per
 * output row. */
#define K_MATVEC_MAX_ROWS 16
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
 * threadgroup per (kv head, split, query row); it walks its blocks of
 * K_ATTN_BLOCK positions and writes one partial (max, sum, acc[head_dim])
 * per (query head of the GQA group, block). K/V pages are
 * [n_head_kv][K_ATTN_BLOCK][head_dim] F16 (the CPU's KV page layout);
 * block b of the history is page pages[b]. Query row t sees positions
 * [0, pos0 + t + 1). */
#define K_ATTN_BLOCK 256 /* == DS4_KV_PAGE: the CPU's split-K block */
#define K_ATTN_MAX_GROUP 8
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
