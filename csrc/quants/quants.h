/*
 * quants.h — internal: block layouts, scalar helpers and the kernel tables.
 *
 * One table row per ggml type id (traits.c) says how big a block is and which
 * activation type its dot pairs with; one kernel set per ISA (scalar.c,
 * avx2.c, avx512.c, neon.c) holds the function pointers. A SIMD set starts as
 * a copy of the scalar set and overrides what it implements, so a missing
 * SIMD kernel silently falls back to the reference instead of crashing.
 */
#ifndef DS4_QUANTS_H
#define DS4_QUANTS_H

#include <stdint.h>
#include <string.h>
#include "../ds4.h"

/* ------------------------------------------------------ block layouts -- */
/* Byte-for-byte ggml's (ggml-common.h), asserted below. fp16/bf16 scales are
 * stored as raw uint16_t and converted with the helpers further down. */

#define QK4_0 32
typedef struct { uint16_t d; uint8_t qs[QK4_0 / 2]; } block_q4_0;
#define QK4_1 32
typedef struct { uint16_t d, m; uint8_t qs[QK4_1 / 2]; } block_q4_1;
#define QK5_0 32
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; } block_q5_0;
#define QK5_1 32
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; } block_q5_1;
#define QK8_0 32
typedef struct { uint16_t d; int8_t qs[QK8_0]; } block_q8_0;
#define QK8_1 32
typedef struct { uint16_t d, s; int8_t qs[QK8_1]; } block_q8_1; /* s = d * sum(qs) */

#define QK_K 256
#define K_SCALE_SIZE 12
typedef struct { uint16_t d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; } block_q4_K;
typedef struct { uint16_t d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; } block_q5_K;
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint16_t d; } block_q6_K;
typedef struct { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; } block_q8_K;

#define QK4_NL 32
typedef struct { uint16_t d; uint8_t qs[QK4_NL / 2]; } block_iq4_nl;
typedef struct { uint16_t d; uint16_t scales_h; uint8_t scales_l[QK_K / 64]; uint8_t qs[QK_K / 2]; } block_iq4_xs;

/* ds4's affine 64-wide types (ds4-notes §2): codes first, then bf16 scale and
 * bf16 bias; x = q*scale + bias. */
#define QK64A 64
typedef struct { uint8_t qs[QK64A / 2]; uint16_t scale, bias; } block_q4_64a; /* even j low nibble of byte j/2 */
typedef struct { uint8_t qs[QK64A / 4]; uint16_t scale, bias; } block_q2_64a; /* j at bits 2*(j%4) of byte j/4 */

_Static_assert(sizeof(block_q4_0) == 18, "q4_0");
_Static_assert(sizeof(block_q4_1) == 20, "q4_1");
_Static_assert(sizeof(block_q5_0) == 22, "q5_0");
_Static_assert(sizeof(block_q5_1) == 24, "q5_1");
_Static_assert(sizeof(block_q8_0) == 34, "q8_0");
_Static_assert(sizeof(block_q8_1) == 36, "q8_1");
_Static_assert(sizeof(block_q4_K) == 144, "q4_K");
_Static_assert(sizeof(block_q5_K) == 176, "q5_K");
_Static_assert(sizeof(block_q6_K) == 210, "q6_K");
_Static_assert(sizeof(block_q8_K) == 292, "q8_K");
_Static_assert(sizeof(block_iq4_nl) == 18, "iq4_nl");
_Static_assert(sizeof(block_iq4_xs) == 136, "iq4_xs");
_Static_assert(sizeof(block_q4_64a) == 36, "q4_64a");
_Static_assert(sizeof(block_q2_64a) == 20, "q2_64a");

/* IQ4_NL / IQ4_XS code book (ggml-common.h, kvalues_iq4nl). */
extern const int8_t ds4_kvalues_iq4nl[16];

/* --------------------------------------------------- scalar conversions -- */
/* Bit-exact IEEE conversions, no FPU-mode dependence. fp16 -> f32 is exact
 * for every input including subnormals, Inf and NaN (payload kept, quiet bit
 * forced, as F16C's vcvtph2ps and so ggml's x86 build do); f32 -> fp16 rounds
 * to nearest-even like F16C's vcvtps2ph with imm 0, which is what ggml's x86
 * build uses (scalar.c matches both instructions on every input). */
static inline float ds4_f32_from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t ds4_bits_from_f32(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

float ds4_fp16_to_f32(uint16_t h);
uint16_t ds4_f32_to_fp16(float f);
static inline float ds4_bf16_to_f32(uint16_t h) { return ds4_f32_from_bits((uint32_t)h << 16); }
/* Round-to-nearest-even, NaN quieted (ggml_compute_fp32_to_bf16). */
uint16_t ds4_f32_to_bf16(float f);
/* Truncation: ds4's Q4_64A/Q2_64A quantizer stores scale/bias this way. */
static inline uint16_t ds4_f32_to_bf16_trunc(float f) { return (uint16_t)(ds4_bits_from_f32(f) >> 16); }

/* ----------------------------------------------------------- kernel sets -- */
typedef void (*ds4_to_float_fn)(const void *src, float *dst, int64_t n);
typedef void (*ds4_from_float_fn)(const float *src, void *dst, int64_t n);
/* *s = dot(x, y) over n weights: x the weight row, y the activation row. */
typedef void (*ds4_vec_dot_fn)(int64_t n, float *s, const void *x, const void *y);

/* Multi-row dot (matmul.c): s[r] = dot(x, y[r]) for r < nr, one weight
 * row x against nr activation rows in the ROWS LAYOUT of x's type (what
 * pack_rows wrote, or plain paired-type rows when pack_rows is NULL). It
 * reads each weight block once for all rows, and every s[r] is bit-identical
 * to vec_dot(n, &s, x, <row r in the paired type>): the same float
 * operations in the same order per row (tests/test_matmul_rows.py). */
typedef void (*ds4_dot_rows_fn)(int64_t n, int nr, float *s, const void *x,
                                const void *const *y);
/* Multi-output tile (matmul.c): s[r*ss + o] = dot(x + o*x_stride, y[r]) for
 * o < no, r < nr -- no consecutive weight rows against nr activation rows in
 * the rows layout of dot_rows, each value bit-identical to dot_rows on that
 * weight row alone (so to vec_dot). Where a call has few activation rows
 * (decode, short verifies) a weight row's work is short, and one call per
 * weight row paid the call, the final sums and their latency per row; a
 * tile shares them (and the activation loads) between weight rows. It
 * prefetches its weight rows DS4_WEIGHT_PREFETCH_BYTES ahead as it goes. */
/* Weight rows the forward hands a dot_tile per call (the kernel tiles them
 * further) unless the set asks for more (dot_tile_out). */
#define DS4_TILE_OUT 4
/* The most weight rows a set may ask for per dot_tile call. */
#define DS4_TILE_OUT_MAX 128
/* Activation rows the forward hands a dot_tile per call unless the set
 * asks for more (dot_tile_rows), and the most it may ask for. */
#define DS4_TILE_ROWS 16
#define DS4_TILE_ROWS_MAX 128
typedef void (*ds4_dot_tile_fn)(int64_t n, int no, int nr, float *s, int64_t ss,
                                const void *x, size_t x_stride, const void *const *y);
/* How far ahead of the weight row being computed the forward asks for its
 * lines (forward/matmul.c MM_PREFETCH_BYTES says why 4 KiB); a tile kernel
 * requests them itself, spread over its blocks. */
#define DS4_WEIGHT_PREFETCH_BYTES 4096
/* Paired-type activation row (n values) -> its rows layout at dst. */
typedef void (*ds4_pack_rows_fn)(const void *src, void *dst, int64_t n);

/* The Q8X rows layout (Q8_0-paired types), 128 bytes per pair of Q8_0
 * blocks: their 64 int8 codes biased to unsigned (a + 128), then each
 * block's fp16 scale widened to float and repeated 8 times (two blocks'
 * scales are one 64-byte load).
 * An odd last block fills its pair's first half; the rest is zero. Each
 * pair depends only on its own two blocks, so a row can be packed in
 * pieces of whole pairs. */
static inline size_t ds4_q8x_row_bytes(int64_t n) { return (size_t)((n / 32 + 1) / 2) * 128; }
/* A Q8_0 row of n values (src) in that geometry at dst, every code plus
 * `bias` (128: Q8X's unsigned codes; 0: AVX2's signed Q8S, avx2.c); an odd
 * last block's empty half holds codes `bias` and scales 0. */
void ds4_pack_q8_pairs(const void *src, void *dst, int64_t n, uint8_t bias);

typedef struct {
    ds4_to_float_fn to_float[DS4_TYPE_COUNT];
    ds4_from_float_fn from_float[DS4_TYPE_COUNT];
    ds4_vec_dot_fn vec_dot[DS4_TYPE_COUNT];      /* with the paired activation type */
    ds4_vec_dot_fn vec_dot_f32[DS4_TYPE_COUNT];  /* with plain f32 activations */
    /* Optional multi-row kernels (NULL: matmul loops vec_dot over rows),
     * the packer of their activation rows (NULL: plain paired rows), and
     * a name for DS4PY_PATHS reports. */
    ds4_dot_rows_fn dot_rows[DS4_TYPE_COUNT];
    /* optional with dot_rows: several weight rows per call (NULL: one) */
    ds4_dot_tile_fn dot_tile[DS4_TYPE_COUNT];
    /* the forward calls dot_tile for jobs of at least this many activation
     * rows, dot_rows for fewer (the same bits either way: the tile kernel
     * must be right for any nr; this only says where it is the faster) */
    uint8_t dot_tile_min_rows[DS4_TYPE_COUNT];
    /* weight rows per dot_tile call (0: DS4_TILE_OUT; at most
     * DS4_TILE_OUT_MAX): a kernel that prepares its activation rows once per
     * call (the AVX-512 Q4_K panel) shares that work among all of them; the
     * forward's GEMM work items are then this many outputs */
    uint8_t dot_tile_out[DS4_TYPE_COUNT];
    /* activation rows per dot_tile call (0: DS4_TILE_ROWS; at most
     * DS4_TILE_ROWS_MAX): a kernel that prepares each weight row once per
     * call (the AVX-512 Q4_K bands) shares that work among all of them */
    uint8_t dot_tile_rows[DS4_TYPE_COUNT];
    ds4_pack_rows_fn pack_rows[DS4_TYPE_COUNT];
    const char *dot_rows_name[DS4_TYPE_COUNT];
    /* Optional: rows [0, nr) of a GDN head's state for one token, row m at
     * S + m*dk (forward/gdn.c delta_row): Sm *= decay; u = dot(Sm, k);
     * d = (v[m] - u)*beta; Sm += k*d (multiply, then add: no FMA); then, if
     * out, out[m] = dot(Sm, q); both dots this set's vec_dot_f32[F32]. Each
     * row's values are those of that per-row loop, whatever nr is. NULL:
     * gdn.c's portable loop does the same. */
    void (*gdn_rows)(float *S, int64_t nr, const float *k, const float *q, int64_t dk,
                     float decay, const float *v, float beta, float *out);
    /* Optional: y[i] = x[i] / (1 + expf(-x[i])) * m[i] (m NULL: no
     * multiply) for i < n, bit for bit forward/norm.c ds4_silu with this
     * process's libm expf (the set's file says how it makes sure). NULL:
     * the forward's scalar loop. */
    void (*silu_mul)(float *y, const float *x, const float *m, int64_t n);
    /* Optional: a[d] = f32(f16(fmaf(f32(v[d]), vs, a[d]))) for d < n, v F16
     * (the F16-accumulated attention step, forward/attention.c
     * block_partial_f16): one fused multiply-add, then round to F16
     * nearest-even and widen back, exactly what to_float/from_float[F16] of
     * the set and a C loop with fmaf do. */
    void (*f16_acc_row)(float *a, const uint16_t *v, float vs, int64_t n);
    const char *isa_name; /* set by dispatch.c, for DS4PY_PATHS reports */
} ds4_kernel_set;

/* Bytes of one activation row of n values in the rows layout the set's
 * dot_rows[type] takes (0 when it has none). */
size_t ds4_rows_act_bytes(const ds4_kernel_set *k, int type, int64_t n);

/* Weight rows per dot_tile call of a set for a type (dot_tile_out or DS4_TILE_OUT). */
static inline int ds4_tile_out(const ds4_kernel_set *k, int type) {
    return k->dot_tile_out[type] ? k->dot_tile_out[type] : DS4_TILE_OUT;
}

/* Activation rows per dot_tile call of a set for a type (dot_tile_rows or DS4_TILE_ROWS). */
static inline int ds4_tile_rows(const ds4_kernel_set *k, int type) {
    return k->dot_tile_rows[type] ? k->dot_tile_rows[type] : DS4_TILE_ROWS;
}

typedef struct {
    const char *name;
    int64_t block_size;
    int64_t type_size;
    int vec_dot_type;   /* -1: not a weight type we compute with */
    int ds4_only;
} ds4_type_traits;

/* traits.c: indexed by type id; block_size == 0 marks an unknown id. */
extern const ds4_type_traits ds4_type_traits_table[DS4_TYPE_COUNT];

/* Each file fills a set; the SIMD ones start from a copy of the scalar set.
 * A SIMD file compiled for another architecture defines its init as a no-op
 * returning 0 (not provided). */
void ds4_kernels_init_scalar(ds4_kernel_set *k);
int ds4_kernels_init_avx2(ds4_kernel_set *k);
int ds4_kernels_init_avx512(ds4_kernel_set *k);
int ds4_kernels_init_neon(ds4_kernel_set *k);

/* dispatch.c: the set for an ISA, or NULL if unavailable here. */
const ds4_kernel_set *ds4_kernels_for(int isa);

#endif
