/*
 * avx512.c — AVX-512 (F/BW/DQ/VL/VNNI) dot kernels.
 *
 * The set starts as a copy of the AVX2 set (dispatch.c); this file overrides
 * the paired dots of every weight type and the float dots, where 512-bit
 * registers and VNNI pay:
 *  - F32/F16/BF16: 64 weights per step in four zmm accumulators, a masked
 *    load for the tail (masked-off lanes are never touched, so no read past
 *    the row);
 *  - 32-wide blocks x Q8_0/Q8_1: one ymm vpdpbusd per block for the integer
 *    dot (unsigned codes directly; signed codes through the |x| * sign(x)*y
 *    trick, as in avx2.c);
 *  - Q4_K/Q6_K x Q8_K: 64 codes per zmm, vpdpbusd sums of 4 products,
 *    two vectors' sums narrowed to int16 (exact) and vpdpwssd applies the
 *    scales (k_pair); one kernel per type serves one row and groups of up
 *    to 8 activation rows (the GEMM), so a row's bits never depend on the
 *    batch;
 *  - Q5_K x Q8_K: vpmaddubsw then vpdpwssd applies the sub-block scales
 *    and accumulates in one instruction; IQ4_XS the same on ymm;
 *  - Q4_64A/Q2_64A x Q8_0: a whole 64-wide block per zmm, vpdpbusd for
 *    sum(q*a) and sum(a).
 * to_float, from_float and the quantized x f32 dots stay AVX2 (they are
 * bound by memory, not by the vector width).
 *
 * Same contract as avx2.c: exact integer parts, fixed float order depending
 * only on n, activation quants in [-127, 127], no heap, every load inside a
 * block or masked. The small decoding helpers mirror avx2.c's (each SIMD file
 * is compiled on its own with its own flags, so they cannot be shared).
 */
#include "quants.h"

#include <math.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && \
    defined(__AVX512VL__) && defined(__AVX512VNNI__) && defined(__AVX2__) && \
    defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#include "expf_avx512.h"

/* ------------------------------------------------------------- helpers -- */

static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

static inline __m256i load32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* Two 32-byte halves -> one zmm (lo first). */
static inline __m512i join(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}
static inline __m512 join_ps(float lo, float hi) {
    return _mm512_insertf32x8(_mm512_set1_ps(lo), _mm256_set1_ps(hi), 1);
}

/* Fixed-order reductions: 512 -> 256 (lo + hi), then 128, pairs, last two. */
static inline __m256 fold512(__m512 v) {
    return _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
}
static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline int32_t hsum_i32_256(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    return _mm_cvtsi128_si32(s);
}

/* 16 bytes -> 32 lanes: low nibbles of b[0..15], then high nibbles. */
static inline __m256i nibbles_split16(const uint8_t *p) {
    __m128i t = _mm_loadu_si128((const __m128i *)p);
    __m256i v = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

/* 32 bits -> 32 bytes, byte j = 0xFF when bit j is set. */
static inline __m256i bits_to_mask32(uint32_t bits) {
    return _mm256_movm_epi8((__mmask32)bits);
}

static inline __m256i q5_codes(const uint8_t qh[4], const uint8_t *qs) {
    uint32_t h;
    memcpy(&h, qh, 4);
    __m256i hb = _mm256_and_si256(bits_to_mask32(h), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(nibbles_split16(qs), hb);
}

static inline __m256i iq4nl_table(void) {
    __m128i t = _mm_loadu_si128((const __m128i *)ds4_kvalues_iq4nl);
    return _mm256_set_m128i(t, t);
}

/* Q4_K/Q5_K scales and mins (ggml-quants.c get_scale_min_k4), word-wise as
 * in avx2.c: out[0..7] = scales, out[8..15] = mins. */
static inline void k4_scales(const uint8_t *q, uint8_t out[16]) {
    uint32_t w[3], r[4];
    memcpy(w, q, 12);
    r[0] = w[0] & 0x3f3f3f3fu;
    r[1] = (w[2] & 0x0f0f0f0fu) | (((w[0] >> 6) & 0x03030303u) << 4);
    r[2] = w[1] & 0x3f3f3f3fu;
    r[3] = ((w[2] >> 4) & 0x0f0f0f0fu) | (((w[1] >> 6) & 0x03030303u) << 4);
    memcpy(out, r, 16);
}

/* min_j * (bsums[2j] + bsums[2j+1]) per sub-block j, exact int32, 8 lanes. */
static inline __m256i k4_min_terms(const uint8_t sm[16], const int16_t *bsums) {
    __m128i m16 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(sm + 8)));
    __m256i mm = _mm256_set_m128i(_mm_unpackhi_epi16(m16, m16), _mm_unpacklo_epi16(m16, m16));
    return _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)bsums), mm);
}

static inline int iq4xs_scale(const block_iq4_xs *b, int ib) {
    return ((b->scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((b->scales_h >> (2 * ib)) & 3) << 4);
}

/* Integer dot of signed x and y in 4-byte groups: |x| (x = -128 reads as
 * unsigned 128) times sign(x)*y; exact in int32 (vpdpbusd does not
 * saturate). y = -128 would negate to itself: activations stay in
 * [-127, 127]. */
static inline __m256i sdot256(__m256i x, __m256i y) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

/* ------------------------------------------------------- float dots -- */

/* Four zmm accumulators over 64-element steps, one zmm step at a time
 * after, then one masked step for the last < 16; combined as
 * ((a0+a1)+(a2+a3)), folded to 256 then summed in a fixed order. */
#define FLOAT_DOT512(LOADX, LOADY, MLOADX, MLOADY)                                   \
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                        \
    int64_t i = 0;                                                                     \
    for (; i + 64 <= n; i += 64) {                                                     \
        a0 = _mm512_fmadd_ps(LOADX(i), LOADY(i), a0);                                  \
        a1 = _mm512_fmadd_ps(LOADX(i + 16), LOADY(i + 16), a1);                        \
        a2 = _mm512_fmadd_ps(LOADX(i + 32), LOADY(i + 32), a2);                        \
        a3 = _mm512_fmadd_ps(LOADX(i + 48), LOADY(i + 48), a3);                        \
    }                                                                                  \
    for (; i + 16 <= n; i += 16) a0 = _mm512_fmadd_ps(LOADX(i), LOADY(i), a0);         \
    if (i < n) {                                                                       \
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);                         \
        a1 = _mm512_fmadd_ps(MLOADX(m, i), MLOADY(m, i), a1);                          \
    }                                                                                  \
    *s = hsum256(fold512(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3))));

#define LD_F32X(i) _mm512_loadu_ps(x + (i))
#define LD_F32Y(i) _mm512_loadu_ps(y + (i))
#define ML_F32X(m, i) _mm512_maskz_loadu_ps(m, x + (i))
#define ML_F32Y(m, i) _mm512_maskz_loadu_ps(m, y + (i))
#define LD_F16X(i) _mm512_cvtph_ps(load32(x + (i)))
#define LD_F16Y(i) _mm512_cvtph_ps(load32(y + (i)))
#define ML_F16X(m, i) _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x + (i)))
#define ML_F16Y(m, i) _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, y + (i)))
#define BF16_PS(v) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16))
#define LD_BF16X(i) BF16_PS(load32(x + (i)))
#define LD_BF16Y(i) BF16_PS(load32(y + (i)))
#define ML_BF16X(m, i) BF16_PS(_mm256_maskz_loadu_epi16(m, x + (i)))
#define ML_BF16Y(m, i) BF16_PS(_mm256_maskz_loadu_epi16(m, y + (i)))

static void dot_f32_f32(int64_t n, float *s, const void *vx, const void *vy) {
    const float *x = vx, *y = vy;
    FLOAT_DOT512(LD_F32X, LD_F32Y, ML_F32X, ML_F32Y)
}
static void dot_f16_f16(int64_t n, float *s, const void *vx, const void *vy) {
    const uint16_t *x = vx, *y = vy;
    FLOAT_DOT512(LD_F16X, LD_F16Y, ML_F16X, ML_F16Y)
}
static void dot_f16_f32(int64_t n, float *s, const void *vx, const void *vy) {
    const uint16_t *x = vx;
    const float *y = vy;
    FLOAT_DOT512(LD_F16X, LD_F32Y, ML_F16X, ML_F32Y)
}
static void dot_bf16_bf16(int64_t n, float *s, const void *vx, const void *vy) {
    const uint16_t *x = vx, *y = vy;
    FLOAT_DOT512(LD_BF16X, LD_BF16Y, ML_BF16X, ML_BF16Y)
}
static void dot_bf16_f32(int64_t n, float *s, const void *vx, const void *vy) {
    const uint16_t *x = vx;
    const float *y = vy;
    FLOAT_DOT512(LD_BF16X, LD_F32Y, ML_BF16X, ML_F32Y)
}

/* ------------------------------------------------ F16 attention step -- */
/* quants.h f16_acc_row in one pass (vcvtph2ps, fused multiply-add, vcvtps2ph
 * nearest-even, vcvtph2ps back): the conversions are the F16C ones the
 * AVX2 set's to_float/from_float[F16] use, so the values are those of the
 * three-pass loop it replaces. */
static void f16_acc_row(float *a, const uint16_t *v, float vs, int64_t n) {
    const __m512 s = _mm512_set1_ps(vs);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 t = _mm512_fmadd_ps(_mm512_cvtph_ps(load32(v + i)), s, _mm512_loadu_ps(a + i));
        _mm512_storeu_ps(a + i, _mm512_cvtph_ps(_mm512_cvtps_ph(t, _MM_FROUND_TO_NEAREST_INT |
                                                                       _MM_FROUND_NO_EXC)));
    }
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        const __m512 t = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, v + i)), s,
                                         _mm512_maskz_loadu_ps(m, a + i));
        _mm512_mask_storeu_ps(a + i, m, _mm512_cvtph_ps(_mm512_cvtps_ph(t, _MM_FROUND_TO_NEAREST_INT |
                                                                                _MM_FROUND_NO_EXC)));
    }
}

/* ----------------------------------------------------- GDN state rows -- */
/* quants.h gdn_rows: per row, the portable loop's float operations (gdn.c
 * delta_row, with this set's dot_f32_f32 for both dots: the same FMAs into
 * the same four accumulators, combined and reduced in the same order), so
 * the values are those of the per-row loop whatever nr is.
 *
 * For d_k = 128 (every Qwen3.5 size) a row lives in eight zmm registers:
 * loaded once, decayed, dotted with k, updated, dotted with q, stored once
 * (the general form below makes four passes over it).
 *
 * Denormals. A decay below 2^-64 (the random-weight bench model has ~5% of
 * them; a real model's gates can get there too) makes S*decay subnormal,
 * and an Intel core then takes a microcode assist (~100 cycles) on every
 * vector multiply or FMA whose result or input is subnormal: such a row
 * costs ~20x a normal one. Adds with subnormals and double arithmetic do
 * not assist, so for a tiny decay the row
 *  - forms S*decay in double (the product of two floats is exact in
 *    double, and one rounding to float is the float multiply's rounding,
 *    subnormal results included), and
 *  - skips the dot with k when it cannot matter: d = (v_m - S.k)*beta, and
 *    if |S.k| < ulp(v_m)/4 (bounded via max|S| and sum|k|, see below)
 *    then v_m - S.k rounds to v_m, so d = v_m*beta bit for bit; otherwise
 *    it runs the dot as usual.
 * Both are exact, so the threshold only decides speed, never a value. */
#define GDN_TINY_DECAY 0x1p-64f

/* dot_f32_f32 of nv = 4 or 8 vectors (n = 64 or 128) in registers with y:
 * accumulator c % 4 takes vector c, then ((a0+a1)+(a2+a3)), fold512,
 * hsum256 -- FLOAT_DOT512's operations for those n, in its order. */
static inline __attribute__((always_inline)) float dot_regs(const __m512 *x, const float *y,
                                                           const int nv) {
    __m512 a[4];
    _Pragma("GCC unroll 8") for (int c = 0; c < 4; c++) a[c] = _mm512_fmadd_ps(x[c], _mm512_loadu_ps(y + 16 * c), _mm512_setzero_ps());
    _Pragma("GCC unroll 8") for (int c = 4; c < nv; c++) a[c - 4] = _mm512_fmadd_ps(x[c], _mm512_loadu_ps(y + 16 * c), a[c - 4]);
    return hsum256(fold512(_mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3]))));
}

/* x * d rounded once to float, computed in double (exact product). */
static inline __m512 mul_via_double(__m512 x, __m512d d) {
    const __m256 lo = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(x)), d));
    const __m256 hi = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1)), d));
    return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
}

/* d_k = 16 * nv (nv = 4: d_k 64, small models and the demo; nv = 8: d_k
 * 128, every Qwen3.5 size): the row lives in nv zmm registers. */
static inline __attribute__((always_inline)) void gdn_rows_regs(
    float *S, int64_t nr, const float *k, const float *q, float decay, const float *v,
    float beta, float *out, const int nv) {
    const __m512 dc = _mm512_set1_ps(decay);
    /* 0 is no subnormal hazard (S*0 is a zero, no assist): the float path */
    const int tiny = decay < GDN_TINY_DECAY && decay != 0.0f;
    const __m512d dcd = _mm512_set1_pd((double)decay);
    /* ksum >= sum |k_i| (float sums of non-negative terms, each rounding
     * relative 2^-24; the 1.01 below covers them); NaN or Inf k fails
     * every comparison, so the dot then runs. */
    float ksum = 0.0f;
    if (tiny) {
        __m512 a = _mm512_setzero_ps();
        _Pragma("GCC unroll 8") for (int c = 0; c < nv; c++) a = _mm512_add_ps(a, _mm512_abs_ps(_mm512_loadu_ps(k + 16 * c)));
        ksum = hsum256(fold512(a));
    }
    for (int64_t m = 0; m < nr; m++) {
        float *Sm = S + m * 16 * nv;
        __m512 x[8];
        float u = 0.0f;
        int skip = 0;
        if (!tiny) {
            _Pragma("GCC unroll 8") for (int c = 0; c < nv; c++) x[c] = _mm512_mul_ps(_mm512_loadu_ps(Sm + 16 * c), dc);
        } else {
            __m512 mx = _mm512_setzero_ps();
            __mmask16 bad = 0;
            _Pragma("GCC unroll 8") for (int c = 0; c < nv; c++) {
                x[c] = mul_via_double(_mm512_loadu_ps(Sm + 16 * c), dcd);
                mx = _mm512_max_ps(mx, _mm512_abs_ps(x[c]));
                bad |= _mm512_fpclass_ps_mask(x[c], 0x99); /* QNaN, SNaN, +-Inf */
            }
            /* |computed S.k| <= sum|S_i k_i| (1 + 2^-24)^136 + 136 * 2^-150
             * (each FMA/add rounds by a relative 2^-24, or by 2^-150 in the
             * subnormal range) < 1.01 * max|S| * sum|k| + 2^-140; and
             * |v_m| * 2^-26 <= ulp(v_m)/4 (subnormal v_m included). In
             * double, so no bound itself underflows. For d_k = 64 there are
             * fewer terms: the same bound holds. */
            const double bound = 1.01 * (double)_mm512_reduce_max_ps(mx) * (double)ksum + 0x1p-140;
            skip = !bad && v[m] != 0.0f && bound < fabs((double)v[m]) * 0x1p-26;
        }
        if (!skip) u = dot_regs(x, k, nv);
        const __m512 dm = _mm512_set1_ps((v[m] - u) * beta);
        _Pragma("GCC unroll 8") for (int c = 0; c < nv; c++) {
            x[c] = _mm512_add_ps(x[c], _mm512_mul_ps(_mm512_loadu_ps(k + 16 * c), dm));
            _mm512_storeu_ps(Sm + 16 * c, x[c]);
        }
        if (out) out[m] = dot_regs(x, q, nv);
    }
}

/* Any d_k: the row in four passes (decay, dot, update, dot), masked tail. */
static void gdn_row_any(float *Sm, const float *k, const float *q, int64_t dk, float decay,
                        float vm, float beta, float *out) {
    const __m512 dc = _mm512_set1_ps(decay);
    int64_t i = 0;
    for (; i + 16 <= dk; i += 16) _mm512_storeu_ps(Sm + i, _mm512_mul_ps(_mm512_loadu_ps(Sm + i), dc));
    if (i < dk) {
        const __mmask16 m = (__mmask16)((1u << (dk - i)) - 1u);
        _mm512_mask_storeu_ps(Sm + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, Sm + i), dc));
    }
    float u = 0.0f;
    dot_f32_f32(dk, &u, Sm, k);
    const __m512 dm = _mm512_set1_ps((vm - u) * beta);
    for (i = 0; i + 16 <= dk; i += 16)
        _mm512_storeu_ps(Sm + i, _mm512_add_ps(_mm512_loadu_ps(Sm + i),
                                               _mm512_mul_ps(_mm512_loadu_ps(k + i), dm)));
    if (i < dk) {
        const __mmask16 m = (__mmask16)((1u << (dk - i)) - 1u);
        _mm512_mask_storeu_ps(Sm + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, Sm + i),
                                                       _mm512_mul_ps(_mm512_maskz_loadu_ps(m, k + i), dm)));
    }
    if (out) {
        *out = 0.0f;
        dot_f32_f32(dk, out, Sm, q);
    }
}

static void gdn_rows(float *S, int64_t nr, const float *k, const float *q, int64_t dk,
                     float decay, const float *v, float beta, float *out) {
    if (dk == 128) {
        gdn_rows_regs(S, nr, k, q, decay, v, beta, out, 8);
        return;
    }
    if (dk == 64) {
        gdn_rows_regs(S, nr, k, q, decay, v, beta, out, 4);
        return;
    }
    for (int64_t m = 0; m < nr; m++)
        gdn_row_any(S + m * dk, k, q, dk, decay, v[m], beta, out ? out + m : NULL);
}

/* -------------------------------------------------------------- SiLU -- */
/* quants.h silu_mul: x / (1 + expf(-x)) with glibc's expf 16 lanes at a
 * time, bit for bit (expf_avx512.h: the algorithm). The add and the divide
 * are the C formula's float operations, so the values are forward/norm.c
 * ds4_silu's. The set installs it only after expf_vec_matches (below). */
static void silu_mul(float *y, const float *x, const float *m, int64_t n) {
    int64_t i = 0;
    const __m512 sign = _mm512_set1_ps(-0.0f);
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        const __m512 e = expf16(_mm512_xor_ps(v, sign)); /* expf(-x) */
        __m512 s = _mm512_div_ps(v, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
        if (m) s = _mm512_mul_ps(s, _mm512_loadu_ps(m + i));
        _mm512_storeu_ps(y + i, s);
    }
    for (; i < n; i++) {
        const float s = x[i] / (1.0f + expf(-x[i]));
        y[i] = m ? s * m[i] : s;
    }
}

/* expf16 == this process's expf on probes over the normal range (every
 * table index and both signs of r, steps of 2^-7 through [-85, 85]) and
 * the special-case edges; a libm other than the one expf16 mirrors fails
 * it at once (a different algorithm misses on a large share of inputs). */
static int expf_vec_matches(void) {
    float xs[16];
    int l = 0;
    for (float a = -85.0f; a <= 85.0f; a += 0x1p-7f) {
        xs[l++] = a;
        if (l < 16) continue;
        float es[16];
        _mm512_storeu_ps(es, expf16(_mm512_loadu_ps(xs)));
        for (int j = 0; j < 16; j++)
            if (ds4_bits_from_f32(es[j]) != ds4_bits_from_f32(expf(xs[j]))) return 0;
        l = 0;
    }
    return 1;
}

/* ---------------------------------------------- 32-wide blocks x Q8_x -- */
/* One block per ymm step: a single vpdpbusd replaces AVX2's vpmaddubsw +
 * vpmaddwd pair (unsigned codes <= 31 feed it directly; signed ones through
 * the |x| * sign(x)*y trick). Block i's 8 int32 sums scale by d_x*d_y and
 * FMA into accumulator i & 1; hsum(acc0 + acc1) at the end, plus the Q8_1
 * m*s terms summed in block order. (Pairing two blocks per zmm measured ~25%
 * slower: the ymm->zmm joins cost more than the wider multiply saves.) */
#define Y32_DOT(name, wblock_t, ablock_t, CODES, SIGNED, EXTRA)                           \
    static void name(int64_t n, float *s, const void *vx, const void *vy) {              \
        const wblock_t *x = vx;                                                           \
        const ablock_t *y = vy;                                                           \
        const int64_t nb = n / 32;                                                        \
        __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};                       \
        float extra = 0.0f;                                                               \
        for (int64_t i = 0; i < nb; i++) {                                                \
            __m256i q = CODES(&x[i]), a = load32(y[i].qs);                                \
            __m256i p = SIGNED ? sdot256(q, a)                                            \
                               : _mm256_dpbusd_epi32(_mm256_setzero_si256(), q, a);       \
            acc[i & 1] = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d)),      \
                                         _mm256_cvtepi32_ps(p), acc[i & 1]);             \
            EXTRA(i);                                                                     \
        }                                                                                 \
        *s = hsum256(_mm256_add_ps(acc[0], acc[1])) + extra;                              \
    }

static inline __m256i codes_q4_0(const block_q4_0 *b) {
    return _mm256_sub_epi8(nibbles_split16(b->qs), _mm256_set1_epi8(8));
}
static inline __m256i codes_q4_1(const block_q4_1 *b) { return nibbles_split16(b->qs); }
static inline __m256i codes_q5_0(const block_q5_0 *b) {
    return _mm256_sub_epi8(q5_codes(b->qh, b->qs), _mm256_set1_epi8(16));
}
static inline __m256i codes_q5_1(const block_q5_1 *b) { return q5_codes(b->qh, b->qs); }
static inline __m256i codes_q8_0(const block_q8_0 *b) { return load32(b->qs); }
static inline __m256i codes_iq4_nl(const block_iq4_nl *b) {
    return _mm256_shuffle_epi8(iq4nl_table(), nibbles_split16(b->qs));
}

#define NO_EXTRA(i) ((void)0)
#define Q8_1_EXTRA(i) (extra += h2f(x[i].m) * h2f(y[i].s))

Y32_DOT(dot_q4_0, block_q4_0, block_q8_0, codes_q4_0, 1, NO_EXTRA)
Y32_DOT(dot_q4_1, block_q4_1, block_q8_1, codes_q4_1, 0, Q8_1_EXTRA)
Y32_DOT(dot_q5_0, block_q5_0, block_q8_0, codes_q5_0, 1, NO_EXTRA)
Y32_DOT(dot_q5_1, block_q5_1, block_q8_1, codes_q5_1, 0, Q8_1_EXTRA)
Y32_DOT(dot_q8_0, block_q8_0, block_q8_0, codes_q8_0, 1, NO_EXTRA)
Y32_DOT(dot_iq4_nl, block_iq4_nl, block_q8_0, codes_iq4_nl, 1, NO_EXTRA)

/* ------------------------------------------- Q8_0 x Q8X, many rows -- */
/* The multi-row twin of dot_q8_0 (matmul.c runs it for every Q8_0 matrix in
 * fast precision). dot_q8_0 accumulates block i into acc[i & 1] (ymm); here
 * one zmm holds both: lanes 0..7 are acc[0] (even blocks), lanes 8..15
 * acc[1] (odd blocks), so a step of two blocks performs, lane for lane, the
 * same FMA of the same int32 sums by the same d_x*d_y products (exact
 * fp16 -> f32 widening, one rounding for the product) as two dot_q8_0
 * steps; an odd last block goes into lanes 0..7 only (masked FMA, lanes
 * 8..15 untouched), and the end is fold512 = acc[0] + acc[1], then the same
 * hsum256. So every row's result is bit-identical to dot_q8_0 on that row,
 * for any nr.
 *
 * The int32 sums are exact however computed. The packed activation codes
 * are stored biased, u = a + 128 (unsigned, what vpdpbusd multiplies), and
 * sum(w*a) = sum(w*u) - 128*sum(w): the correction depends on the weights
 * only, so it is computed once per block pair and is the accumulator that
 * each row's vpdpbusd starts from. A row then costs, per two blocks, one
 * vpdpbusd, a convert, the d_x*d_y multiply (its scales come pre-widened)
 * and the FMA; the weight pair is loaded and its scales widened once for
 * up to ROWS_GROUP rows. */
#define ROWS_GROUP 8

/* s[r] = hsum256(fold512(acc[r])) for r < g (4 <= g <= 8), the same adds of
 * the same values as that per-row tree -- lane i + i+8, then 128-bit block
 * 0 + 1, then lanes (0 + 2) and (1 + 3), then those two -- done for eight
 * vectors at once (each level adds two shuffled halves that hold two or
 * four rows' partials instead of one row's): ~26 instructions for eight
 * rows instead of ~64. Float addition is commutative, so operand order
 * changes no bit; rows past g are zero and their sums are dropped. The
 * end of a row group is a sizable part of a short row (on the demo
 * model's E = 256 a Q8_0 row is four block pairs), which is where verify
 * and prefill rows spend it. */
static inline __attribute__((always_inline)) void hsum_rows8(const __m512 *acc, int g, float *s) {
    __m512 x[8], z[4], w[2];
    _Pragma("GCC unroll 8") for (int r = 0; r < 8; r++) x[r] = r < g ? acc[r] : _mm512_setzero_ps();
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) /* [x.lo256 | x'.lo256] + [x.hi256 | x'.hi256] */
        z[j] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * j], x[2 * j + 1], 0x44),
                             _mm512_shuffle_f32x4(x[2 * j], x[2 * j + 1], 0xEE));
    _Pragma("GCC unroll 2") for (int j = 0; j < 2; j++) /* each row's blocks 0 + 1 */
        w[j] = _mm512_add_ps(_mm512_shuffle_f32x4(z[2 * j], z[2 * j + 1], 0x88),
                             _mm512_shuffle_f32x4(z[2 * j], z[2 * j + 1], 0xDD));
    /* w[m]'s block t: row 4m + t's four partials p0..p3; then (p0 + p2), (p1 + p3) */
    const __m512 u = _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], 0x44),
                                   _mm512_shuffle_ps(w[0], w[1], 0xEE));
    /* block t: [row t: p0+p2, p1+p3 | row t+4: p0+p2, p1+p3] -> lanes 4t, 4t+1 the sums */
    const __m512 f = _mm512_add_ps(_mm512_shuffle_ps(u, u, 0x88), _mm512_shuffle_ps(u, u, 0xDD));
    float out[16];
    _mm512_storeu_ps(out, f);
    _Pragma("GCC unroll 8") for (int r = 0; r < g; r++) s[r] = out[4 * (r & 3) + (r >> 2)];
}

/* The end of a rows group: per row, or (g >= 4) hsum_rows8's same bits. */
static inline __attribute__((always_inline)) void rows_sums(const __m512 *acc, int g, float *s) {
    if (g >= 4) {
        hsum_rows8(acc, g, s);
        return;
    }
    _Pragma("GCC unroll 3") for (int r = 0; r < g; r++) s[r] = hsum256(fold512(acc[r]));
}

static void pack_q8x(const void *src, void *dst, int64_t n) { ds4_pack_q8_pairs(src, dst, n, 128); }

/* One pass of weight row x over g <= ROWS_GROUP activation rows: acc[r] as
 * the row's sums stand before their final reduction (rows_sums). PREFETCH:
 * request the weight row's lines DS4_WEIGHT_PREFETCH_BYTES ahead (the tile
 * kernel, which has no caller doing it; quants.h dot_tile). */
static inline __attribute__((always_inline)) void q8x_pass(
    int64_t n, int g, __m512 *acc, const block_q8_0 *x, const void *const *y, int PREFETCH) {
    const int64_t nb = n / QK8_0;
    const uint8_t *yb[ROWS_GROUP];
    _Pragma("GCC unroll 8") for (int r = 0; r < g; r++) {
        acc[r] = _mm512_setzero_ps();
        yb[r] = y[r];
    }
    const __m512i zero = _mm512_setzero_si512(), u128 = _mm512_set1_epi8((char)0x80);
    int64_t i = 0;
    /* pair i/2 of a row: codes at 64*i, scales at 64*i + 64 */
    for (; i + 2 <= nb; i += 2) {
        if (PREFETCH) _mm_prefetch((const char *)(x + i) + DS4_WEIGHT_PREFETCH_BYTES, _MM_HINT_T0);
        const __m512i w = join(load32(x[i].qs), load32(x[i + 1].qs));
        const __m512i corr = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, u128, w));
        const __m512 dx = join_ps(h2f(x[i].d), h2f(x[i + 1].d));
        _Pragma("GCC unroll 8") for (int r = 0; r < g; r++) {
            const __m512i p = _mm512_dpbusd_epi32(corr, _mm512_loadu_si512(yb[r] + 64 * i), w);
            const __m512 dd = _mm512_mul_ps(dx, _mm512_loadu_ps(yb[r] + 64 * i + 64));
            acc[r] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(p), acc[r]);
        }
    }
    if (i < nb) { /* odd last block: lanes 0..7 (acc[0] of dot_q8_0) only */
        const __m512i w = _mm512_zextsi256_si512(load32(x[i].qs));
        const __m512i corr = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, u128, w));
        const __m512 dx = _mm512_set1_ps(h2f(x[i].d));
        _Pragma("GCC unroll 8") for (int r = 0; r < g; r++) {
            const __m512i p = _mm512_dpbusd_epi32(corr, _mm512_loadu_si512(yb[r] + 64 * i), w);
            const __m512 dd = _mm512_mul_ps(dx, _mm512_loadu_ps(yb[r] + 64 * i + 64));
            acc[r] = _mm512_mask3_fmadd_ps(dd, _mm512_cvtepi32_ps(p), acc[r], (__mmask16)0x00FF);
        }
    }
}

static inline __attribute__((always_inline)) void q8x_rows_group(
    int64_t n, int g, float *s, const block_q8_0 *x, const void *const *y) {
    __m512 acc[ROWS_GROUP];
    q8x_pass(n, g, acc, x, y, 0);
    rows_sums(acc, g, s);
}

/* nr rows in groups of ROWS_GROUP, the remainder with a constant group size
 * each so the row loops unroll and the accumulators stay in registers. ONE,
 * if not NULL, is the one-row kernel, run for a single row where it
 * measured faster than a group of one (it is what the group mirrors). */
#define ROWS_DISPATCH(name, wblock_t, GROUP, ONE)                                       \
    static void name(int64_t n, int nr, float *s, const void *vx, const void *const *y) { \
        const wblock_t *x = vx;                                                         \
        const ds4_vec_dot_fn one = ONE; /* a variable: NULL or a kernel, no -Waddress */ \
        if (nr == 1 && one != NULL) {                                                   \
            one(n, s, vx, y[0]);                                                        \
            return;                                                                     \
        }                                                                               \
        int r = 0;                                                                      \
        for (; r + ROWS_GROUP <= nr; r += ROWS_GROUP) GROUP(n, ROWS_GROUP, s + r, x, y + r); \
        switch (nr - r) {                                                               \
        case 7: GROUP(n, 7, s + r, x, y + r); break;                                    \
        case 6: GROUP(n, 6, s + r, x, y + r); break;                                    \
        case 5: GROUP(n, 5, s + r, x, y + r); break;                                    \
        case 4: GROUP(n, 4, s + r, x, y + r); break;                                    \
        case 3: GROUP(n, 3, s + r, x, y + r); break;                                    \
        case 2: GROUP(n, 2, s + r, x, y + r); break;                                    \
        case 1: GROUP(n, 1, s + r, x, y + r); break;                                    \
        default: break;                                                                 \
        }                                                                               \
    }

ROWS_DISPATCH(dot_rows_q8_0, block_q8_0, q8x_rows_group, NULL)

/* quants.h dot_tile for Q8_0: Q8_TILE_NO(NR) weight rows against NR <= 8
 * activation rows per tile, NO * NR <= 8 accumulators, summed together by
 * one hsum_rows8 (rows_sums: the same bits per value as a row's own
 * reduction, so each value equals dot_rows_q8_0's, hence dot_q8_0's).
 * Where few activation rows share a weight row (decode, short verifies) its
 * work is short -- 4 block pairs at n = 256, the demo model's width -- and
 * one dot_rows call per weight row paid the call, the reduction and its
 * latency per row: on the demo model's 768 x 256 the rows path measured
 * 13.3 ns per 256 weights at one activation row against 7.5 for the AVX2
 * set's tile (Zen 5, bench/bench_rows.py); the tile 5.3-5.5. Weight rows
 * are streamed one after another, not in lockstep (the AVX2 tile's note:
 * the prefetcher loses interleaved streams). Measured against the rows
 * path, interleaved, 2 threads: demo model decode 1.20-1.23x tok/s (1.31x
 * at one thread); 0.8B Q8_0 bench model decode 1.01x (tiles of one weight
 * row there, Q8_TILE_MAX_N) and prefill of 256 tokens 1.35x CPU-time rate
 * (the forward's tile calls: 16 rows x 16 outputs). */
#define Q8_TILE_NO(NR) ((NR) == 1 ? 8 : (NR) == 2 ? 4 : (NR) <= 4 ? 2 : 1)
#define Q8_TILE_MAX_N 512
static inline __attribute__((always_inline)) void q8x_tile(int64_t n, int NO, int NR, float *out,
                                                           const uint8_t *xw, size_t xs,
                                                           const void *const *y) {
    __m512 v[ROWS_GROUP];
    _Pragma("GCC unroll 8") for (int o = 0; o < NO; o++)
        q8x_pass(n, NR, v + o * NR, (const block_q8_0 *)(xw + (size_t)o * xs), y, 1);
    rows_sums(v, NO * NR, out);
}
#define Q8_TILE_PUT(NO, NR)                                                                \
    do {                                                                                   \
        float t_[ROWS_GROUP];                                                              \
        q8x_tile(n, NO, NR, t_, xb + (size_t)o * xs, xs, y + r0);                          \
        for (int oo = 0; oo < (NO); oo++)                                                  \
            for (int r = 0; r < (NR); r++) s[(r0 + r) * ss + o + oo] = t_[oo * (NR) + r];  \
    } while (0)
#define Q8_TILE_ROWS(NR)                                                                   \
    do {                                                                                   \
        int o = 0;                                                                         \
        if (short_rows)                                                                    \
            for (; o + Q8_TILE_NO(NR) <= no; o += Q8_TILE_NO(NR)) Q8_TILE_PUT(Q8_TILE_NO(NR), NR); \
        for (; o < no; o++) Q8_TILE_PUT(1, NR);                                            \
    } while (0)
static void tile_q8_0(int64_t n, int no, int nr, float *s, int64_t ss, const void *x,
                      size_t xs, const void *const *y) {
    const uint8_t *xb = x;
    /* several weight rows per tile only where rows are short (the demo
     * model's 256 and 512): with them at n = 1024 too, a decode of the 0.8B
     * Q8_0 bench model (weights streamed from memory) ran 0.83x as fast as
     * one weight row at a time (2 threads, 6 interleaved pairs), and at
     * n = 3584 (2048 rows) tiles of 4 x 2 and 2 x 4 measured 1.1-1.3x slower */
    const int short_rows = n <= Q8_TILE_MAX_N;
    for (int r0 = 0; r0 < nr; r0 += ROWS_GROUP) {
        switch (nr - r0 < ROWS_GROUP ? nr - r0 : ROWS_GROUP) {
        case 1: Q8_TILE_ROWS(1); break;
        case 2: Q8_TILE_ROWS(2); break;
        case 3: Q8_TILE_ROWS(3); break;
        case 4: Q8_TILE_ROWS(4); break;
        case 5: Q8_TILE_ROWS(5); break;
        case 6: Q8_TILE_ROWS(6); break;
        case 7: Q8_TILE_ROWS(7); break;
        default: Q8_TILE_ROWS(8); break;
        }
    }
}
#undef Q8_TILE_ROWS
#undef Q8_TILE_PUT

/* -------------------------------------------------- K-quants x Q8_K -- */
/* Per block 16 lanes of exact int32 partial sums (unsigned codes <= 63 keep
 * vpmaddubsw's int16 pairs <= 16002; vpdpwssd applies the scales after
 * widening and accumulates), converted to float and FMA'd with d_y*d_x into
 * a zmm accumulator in block order; mins (8 lanes) into a ymm one. At the
 * end fold(zmm) + ymm, then one fixed-order hsum. */

/* The 32 int16 lanes of a 64-code zmm pair codes 2L, 2L+1: lanes 0..15 are
 * the first 32 codes (sub-block 2c), lanes 16..31 the next 32 (2c+1). */
#define UPPER16 ((__mmask32)0xFFFF0000u)

/* vpermw indices picking scale j for lanes 0..15 and j+1 for 16..31. */
static inline __m512i k4_scale_idx0(void) {
    return _mm512_mask_blend_epi16(UPPER16, _mm512_setzero_si512(), _mm512_set1_epi16(1));
}

/* Q4_K scales and mins (as k4_scales) decoded in registers, per 128-bit
 * lane one superblock: 32-bit lanes [r0, r1, r2, r3] of lane k, i.e. bytes
 * 16k..16k+7 superblock k's eight 6-bit scales, 16k+8..16k+15 its mins.
 * Lane k of v holds the 16 bytes from that superblock's scales[12] (the
 * last 4 are qs, inside the block, never used). In-lane operations only,
 * so one decode serves up to four superblocks: the one-row dot decodes four
 * at once, and takes each superblock's mins as a third vpermw of the same
 * words (before: one 128-bit decode per superblock and a 6-operation mins
 * build): 0.89-0.94x the time per superblock at rows of 1024-3584, 0.97-1.0x
 * at 512 (Zen 5 VM, one thread, in cache, interleaved, 2026-12-07).
 * No round trip through memory (a store of four words then an 8-byte
 * reload defeats store forwarding). */
static inline __m512i k4_scales_dec(__m512i v) {
    const __m512i a = _mm512_shuffle_epi32(v, _MM_PERM_BBAA);  /* w0 w0 w1 w1 */
    const __m512i w2 = _mm512_shuffle_epi32(v, _MM_PERM_CCCC);
    const __m512i lo = _mm512_and_si512(a, _mm512_set1_epi8(0x3f)); /* r0, r2 */
    /* ((w >> 6) & 3) << 4 per byte == (w >> 2) & 0x30 */
    const __m512i hi = _mm512_and_si512(_mm512_srli_epi32(a, 2), _mm512_set1_epi8(0x30));
    const __m512i m = _mm512_and_si512(
        _mm512_srlv_epi32(w2, _mm512_setr_epi32(0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0, 4)),
        _mm512_set1_epi8(0x0f));
    return _mm512_mask_blend_epi32(0xAAAA, lo, _mm512_or_si512(m, hi)); /* r1, r3 */
}

static inline __m128i k4_scales_raw(const block_q4_K *x) {
    return _mm_loadu_si128((const __m128i *)x->scales);
}

/* The integer core of the K-quant kernels below. Per 64-code vector v a
 * vpdpbusd gives 16 int32 lanes, lane k the sum of codes 4k..4k+3 times
 * their activations: |.| <= 4 * 63 * 128 < 2^15, so vpackssdw of two such
 * vectors is exact (never saturates). Per 128-bit lane L the pack holds
 * [4 lanes of v | 4 lanes of v+1], 16 codes each, and vpdpwssd multiplies
 * each pair of them by the scale of its codes (the idx vectors below) and
 * adds into the int32 sum. So a pair of 64-code vectors costs 2 vpdpbusd,
 * 1 vpackssdw, 1 vpdpwssd per row instead of 2 x (vpmaddubsw + vpdpwssd):
 * fewer port-0 multiplies. The integer result is exact whatever the order;
 * the lane partition is what dot and rows kernels must share, and they do
 * (one function, k_pair). */
static inline __m512i k_pair(__m512i isum, __m512i c0, __m512i c1, const int8_t *y, __m512i scl) {
    const __m512i z = _mm512_setzero_si512();
    const __m512i p0 = _mm512_dpbusd_epi32(z, c0, _mm512_loadu_si512(y));
    const __m512i p1 = _mm512_dpbusd_epi32(z, c1, _mm512_loadu_si512(y + 64));
    return _mm512_dpwssd_epi32(isum, _mm512_packs_epi32(p0, p1), scl);
}

/* vpermw indices for k_pair's scale lanes: int16 lane 8L + p (L the 128-bit
 * lane, p < 8) takes the scale of vector v (p < 4) or v + 1 (p >= 4), codes
 * 16L.. of it. Q4_K (32 codes per scale; vector v = [sub-block 2v in L 0,1
 * | 2v+1 in L 2,3]): scale 2v + (L >= 2) + 2(p >= 4), for v = 0 and 2.
 * Q6_K (16 codes per scale; vector v = groups 4v..4v+3): scale
 * 4v + L + 4(p >= 4), for v = 0 and 2. */
static const int16_t k_idx_q4k[2][32] = {
    {0, 0, 0, 0, 2, 2, 2, 2, 0, 0, 0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 3, 3, 3, 3, 1, 1, 1, 1, 3, 3, 3, 3},
    {4, 4, 4, 4, 6, 6, 6, 6, 4, 4, 4, 4, 6, 6, 6, 6, 5, 5, 5, 5, 7, 7, 7, 7, 5, 5, 5, 5, 7, 7, 7, 7}};
/* The Q4_K min weights [m0 m0 m1 m1 .. m7 m7] twice, from the same words. */
static const int16_t k_idx_q4k_mins[32] = {8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15,
                                           8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15};
static const int16_t k_idx_q6k[2][32] = {
    {0, 0, 0, 0, 4, 4, 4, 4, 1, 1, 1, 1, 5, 5, 5, 5, 2, 2, 2, 2, 6, 6, 6, 6, 3, 3, 3, 3, 7, 7, 7, 7},
    {8, 8, 8, 8, 12, 12, 12, 12, 9, 9, 9, 9, 13, 13, 13, 13,
     10, 10, 10, 10, 14, 14, 14, 14, 11, 11, 11, 11, 15, 15, 15, 15}};

/* isum's 16 lanes folded to 8 (exact int32 adds: lane j + lane j+8) in
 * lanes 0..7, `other`'s lanes 8..15 kept: one vector holding the scaled
 * code sums and the K-quant's 8-lane offset term (mins, or Q6_K's -32),
 * so one convert and one FMA per row and block serve both. */
static inline __m512i k_fold_with(__m512i isum, __m512i other) {
    return _mm512_mask_add_epi32(other, 0x00FF, isum, _mm512_shuffle_i64x2(isum, isum, 0xEE));
}

/* Q4_K x Q8_K: EXACT SUPERBLOCK SUMS. This set's Q4_K numerics: per
 * superblock b of a weight row x and an activation row a, two exact int32
 * sums,
 *   S1 = sum_j sc_j * sum_{e in sub-block j} q_e * a_e   (|S1| < 8*63*32*15*128 < 2^26)
 *   S2 = sum_j mn_j * (bsums[2j] + bsums[2j+1])          (the mins term)
 * then one fixed float recipe, acc starting at 0:
 *   r = (float)S1 * d;  r = fmaf(-dmin, (float)S2, r);  acc = fmaf(r, d_a, acc)
 * (k4_recipe). The integer sums are exact however they are formed, so the
 * one-row dot, the rows groups (up to 8 activation rows, lanes = rows) and
 * the 16-token panel GEMM (lanes = tokens, quants.h dot_tile) give the same
 * bits: each forms S1 and S2 its own way and applies the same recipe in
 * the same superblock order. (llama.cpp's x86 vec_dot keeps 8 float lanes
 * per superblock; its tiled GEMM, like this, sums a superblock exactly in
 * integers. Against llama.cpp's logits this is one more float reordering,
 * within the tests' bounds.) Why: a panel GEMM vectorised over tokens
 * needs whole-superblock integer sums; per weight row and 16 tokens it
 * costs 64 vpdpbusd + 8 scale multiplies per superblock where the
 * per-row kernel spent ~14 vector operations per row. */
static inline float k4_recipe(int32_t s1, int32_t s2, const block_q4_K *x, float da, float acc) {
    const float r = fmaf(-h2f(x->dmin), (float)s2, (float)s1 * h2f(x->d));
    return fmaf(r, da, acc);
}

/* The weight side of one Q4_K superblock for k_pair rows: the four 64-code
 * vectors ([q | q]: low nibbles in the lower half, high in the upper), the
 * pairs' scale lanes and the int16 min weights [m0 m0 m1 m1 .. m7 m7]. */
typedef struct {
    __m512i codes[4], scl01, scl23, mm;
} k4_side;

/* words: k4_scales_dec's bytes widened to int16, two superblocks a zmm
 * (superblock h's 8 scales and 8 mins at words 16h..16h+15); the three
 * index vectors pick this superblock's (h) lanes. */
static inline __attribute__((always_inline)) void k4_weight_side_w(const block_q4_K *x, __m512i words,
                                                                  int h, k4_side *w) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i off = _mm512_set1_epi16((short)(16 * h));
    w->scl01 = _mm512_permutexvar_epi16(_mm512_add_epi16(_mm512_loadu_si512(k_idx_q4k[0]), off), words);
    w->scl23 = _mm512_permutexvar_epi16(_mm512_add_epi16(_mm512_loadu_si512(k_idx_q4k[1]), off), words);
    w->mm = _mm512_permutexvar_epi16(_mm512_add_epi16(_mm512_loadu_si512(k_idx_q4k_mins), off), words);
    for (int c = 0; c < 4; c++) {
        const __m512i q = _mm512_broadcast_i64x4(load32(x->qs + 32 * c));
        w->codes[c] = _mm512_and_si512(_mm512_mask_srli_epi16(q, UPPER16, q, 4), m4);
    }
}

static inline __attribute__((always_inline)) void k4_weight_side(const block_q4_K *x, k4_side *w) {
    const __m512i r = k4_scales_dec(_mm512_castsi128_si512(k4_scales_raw(x)));
    k4_weight_side_w(x, _mm512_cvtepu8_epi16(_mm512_castsi512_si256(r)), 0, w);
}

/* One activation row against a weight side: lanes 0..7 sum to S1, lanes
 * 8..15 to S2 (both exact). */
static inline __attribute__((always_inline)) __m512i k4_row_sums(const k4_side *w, const block_q8_K *b) {
    __m512i isum = k_pair(_mm512_setzero_si512(), w->codes[0], w->codes[1], b->qs, w->scl01);
    isum = k_pair(isum, w->codes[2], w->codes[3], b->qs + 128, w->scl23);
    const __m512i mt = _mm512_madd_epi16(
        _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)b->bsums)), w->mm);
    return k_fold_with(isum, mt);
}

/* Eight [S1 lanes | S2 lanes] vectors reduced together (exact int32 adds,
 * any order): S1 of vector k in lane k, S2 in lane 8 + k. */
static inline __attribute__((always_inline)) __m512i k4_sums8(const __m512i *v) {
    __m512i t[4], u[2];
    _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) /* per 128-bit block: [a0+a2 b0+b2 a1+a3 b1+b3] */
        t[p] = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * p], v[2 * p + 1]),
                                _mm512_unpackhi_epi32(v[2 * p], v[2 * p + 1]));
    _Pragma("GCC unroll 2") for (int p = 0; p < 2; p++) /* per block: vectors 4p..4p+3's block sums */
        u[p] = _mm512_add_epi32(_mm512_unpacklo_epi64(t[2 * p], t[2 * p + 1]),
                                _mm512_unpackhi_epi64(t[2 * p], t[2 * p + 1]));
    /* [S1 of 0-3 | S2 of 0-3 | S1 of 4-7 | S2 of 4-7] -> [S1 of 0-7 | S2 of 0-7] */
    const __m512i q = _mm512_add_epi32(_mm512_shuffle_i32x4(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                       _mm512_shuffle_i32x4(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_permutexvar_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15), q);
}

/* One row: the superblocks' sums eight at a time (k4_sums8), then the
 * recipe superblock by superblock. */
static void dot_q4_k(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q4_K *x = vx;
    const block_q8_K *y = vy;
    const int64_t nb = n / QK_K;
    float acc = 0.0f;
    for (int64_t i = 0; i < nb; i += 8) {
        const int m = (int)(nb - i < 8 ? nb - i : 8);
        __m512i v[8];
        /* the scales of superblocks 4q..4q+3 in one decode (those past the
         * row's end read superblock i's: never used) */
        __m512i words[4];
        _Pragma("GCC unroll 2") for (int q = 0; q < 2; q++) {
            __m512i raw = _mm512_castsi128_si512(k4_scales_raw(&x[4 * q < m ? i + 4 * q : i]));
            _Pragma("GCC unroll 3") for (int k = 1; k < 4; k++)
                raw = _mm512_inserti32x4(raw, k4_scales_raw(&x[4 * q + k < m ? i + 4 * q + k : i]), k);
            const __m512i r = k4_scales_dec(raw);
            words[2 * q] = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(r));
            words[2 * q + 1] = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(r, 1));
        }
        _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) {
            if (k < m) {
                k4_side w;
                k4_weight_side_w(&x[i + k], words[k >> 1], k & 1, &w);
                v[k] = k4_row_sums(&w, &y[i + k]);
            } else {
                v[k] = _mm512_setzero_si512();
            }
        }
        /* the recipe's first two steps need no order: eight superblocks at
         * once (d and dmin of superblock k from one 32-bit gather at its
         * start); the accumulation then goes superblock by superblock */
        const __m512 f = _mm512_cvtepi32_ps(k4_sums8(v));
        /* masked: no read past the row's last superblock */
        const __m256i ddm = _mm256_mmask_i32gather_epi32(
            _mm256_setzero_si256(), (__mmask8)((1u << m) - 1),
            _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                               _mm256_set1_epi32((int)sizeof(block_q4_K))),
            (const int *)&x[i], 1);
        const __m256 d = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(ddm));
        const __m256 dmin = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_srli_epi32(ddm, 16)));
        const __m256 r = _mm256_fnmadd_ps(dmin, _mm512_extractf32x8_ps(f, 1),
                                          _mm256_mul_ps(_mm512_castps512_ps256(f), d));
        float rk[8];
        _mm256_storeu_ps(rk, r);
        for (int k = 0; k < m; k++) acc = fmaf(rk[k], y[i + k].d, acc);
    }
    *s = acc;
}

/* Q4_K for g <= ROWS_GROUP activation rows: the weight side once, then
 * per row its [S1 lanes | S2 lanes] vector; the eight rows' vectors are
 * reduced together (exact int32 adds in any order), giving S1 of row r in
 * lane r and S2 in lane 8 + r, and the recipe runs on 8 rows at once with
 * the rows in the lanes of one accumulator. */
static inline __attribute__((always_inline)) void q4k_rows_group(
    int64_t n, int g, float *s, const block_q4_K *x, const void *const *vy) {
    const block_q8_K *y[ROWS_GROUP];
    int64_t addr[ROWS_GROUP];
    _Pragma("GCC unroll 8") for (int r = 0; r < ROWS_GROUP; r++) {
        y[r] = r < g ? vy[r] : vy[0];
        addr[r] = (int64_t)(intptr_t)&y[r][0].d;
    }
    const __m512i vaddr = _mm512_loadu_si512(addr);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        k4_side w;
        k4_weight_side(&x[i], &w);
        __m512i v[ROWS_GROUP];
        _Pragma("GCC unroll 8") for (int r = 0; r < ROWS_GROUP; r++)
            v[r] = r < g ? k4_row_sums(&w, &y[r][i]) : _mm512_setzero_si512();
        const __m512 f = _mm512_cvtepi32_ps(k4_sums8(v));
        const __m256 da = _mm512_i64gather_ps(
            _mm512_add_epi64(vaddr, _mm512_set1_epi64(i * (int64_t)sizeof(block_q8_K))), NULL, 1);
        const __m256 r = _mm256_fnmadd_ps(_mm256_set1_ps(h2f(x[i].dmin)), _mm512_extractf32x8_ps(f, 1),
                                          _mm256_mul_ps(_mm512_castps512_ps256(f), _mm256_set1_ps(h2f(x[i].d))));
        acc = _mm256_fmadd_ps(r, da, acc);
    }
    float out[8];
    _mm256_storeu_ps(out, acc);
    _Pragma("GCC unroll 8") for (int r = 0; r < g; r++) s[r] = out[r];
}

ROWS_DISPATCH(dot_rows_q4_k, block_q4_K, q4k_rows_group, dot_q4_k)

/* ---- Q4_K panel GEMM: 16 tokens in the lanes (quants.h dot_tile) ---- */
/* Activation rows are transposed into a panel per superblock: dword k
 * (codes 4k..4k+3) of token t at codes[k][4t..4t+3], the int16 pairs
 * (bsums[2i], bsums[2i+1]) of token t at bs[i][t], and d at d[t]. A weight
 * row's superblock is then, for the 16 tokens at once: its codes widened
 * to bytes (a broadcast dword against a panel row per vpdpbusd, 8 per
 * sub-block), each sub-block's sum times its scale (vpmulld), the mins
 * through vpdpwssd on pairs of sub-block sums (bs32), and k4_recipe in 16
 * lanes (tile_q4_k below says how panels, weight rows and superblocks are
 * ordered). */
#define K4_PANEL_MIN 12 /* fewer rows: the rows groups (the panel's lanes would idle) */

typedef struct {
    uint8_t codes[64][64];
    int32_t bs[8][16];   /* (bsums[2i], bsums[2i+1]): the 16-code sums, paired (Q6_K) */
    int32_t bs32[4][16]; /* (sub-block sums 2j, 2j+1), each bsums[2i] + bsums[2i+1] (Q4_K) */
    float d[16];
} k4_panel;

/* 16 x 16 int32 transpose: r[j] lane i = in[i] lane j. */
static inline __attribute__((always_inline)) void transpose16(__m512i *r) {
    __m512i t[16];
    _Pragma("GCC unroll 8") for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    /* now r[i] holds, per 128-bit block k, column (i%4)... of rows 4k'..: regroup blocks */
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], _MM_SHUFFLE(2, 0, 2, 0));
        t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], _MM_SHUFFLE(3, 1, 3, 1));
        t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], _MM_SHUFFLE(2, 0, 2, 0));
        t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], _MM_SHUFFLE(3, 1, 3, 1));
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
        r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], _MM_SHUFFLE(2, 0, 2, 0));
        r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], _MM_SHUFFLE(3, 1, 3, 1));
        r[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], _MM_SHUFFLE(2, 0, 2, 0));
        r[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], _MM_SHUFFLE(3, 1, 3, 1));
    }
}

static inline __attribute__((always_inline)) void k_build_panel(k4_panel *p, int nb, int64_t b0, int nt,
                                                                const void *const *y, int bs32) {
    for (int b = 0; b < nb; b++) {
        const block_q8_K *a[16];
        for (int t = 0; t < 16; t++) a[t] = t < nt ? (const block_q8_K *)y[t] + b0 + b : NULL;
        for (int q = 0; q < 4; q++) { /* dwords 16q .. 16q+15 of every token */
            __m512i r[16];
            for (int t = 0; t < 16; t++)
                r[t] = a[t] ? _mm512_loadu_si512(a[t]->qs + 64 * q) : _mm512_setzero_si512();
            transpose16(r);
            for (int k = 0; k < 16; k++) _mm512_storeu_si512(p[b].codes[16 * q + k], r[k]);
        }
        __m512i r[16];
        for (int t = 0; t < 16; t++)
            r[t] = a[t] ? _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)a[t]->bsums))
                        : _mm512_setzero_si512();
        transpose16(r);
        for (int i = 0; i < 8; i++) _mm512_storeu_si512(p[b].bs[i], r[i]);
        /* A 32-code sub-block's sum is at most 32 * 128 in magnitude (a
         * Q8_K row's bsums are its codes' sums): it fits an int16 half. */
        const __m512i one = _mm512_set1_epi16(1), lo = _mm512_set1_epi32(0xFFFF);
        for (int j = 0; j < (bs32 ? 4 : 0); j++) {
            const __m512i s0 = _mm512_madd_epi16(r[2 * j], one), s1 = _mm512_madd_epi16(r[2 * j + 1], one);
            _mm512_storeu_si512(p[b].bs32[j], _mm512_or_si512(_mm512_and_si512(s0, lo), _mm512_slli_epi32(s1, 16)));
        }
        for (int t = 0; t < 16; t++) p[b].d[t] = a[t] ? a[t]->d : 0.0f;
    }
}

/* Q4_K reads bs32, Q6_K bs: each builds only its own. */
static void k4_build_panel(k4_panel *p, int nb, int64_t b0, int nt, const void *const *y) {
    k_build_panel(p, nb, b0, nt, y, 1);
}
static void k6_build_panel(k4_panel *p, int nb, int64_t b0, int nt, const void *const *y) {
    k_build_panel(p, nb, b0, nt, y, 0);
}

/* Eight weight rows against the panel at once (K4_BAND): each panel
 * vector (one dword of 16 tokens' codes) is loaded once for the eight rows
 * and each row's dword is a broadcast, 1 + 8 loads per 8 vpdpbusd where
 * one weight row at a time paid 2 per vpdpbusd (on a Zen 5 core that loads
 * two zmm a cycle and retires two vpdpbusd, loads were the limit: 1.72 ->
 * 1.18 ns per 256 weights x row at 16 rows, bench_rows.py). */
#define K4_BAND 8

typedef struct {
    int32_t q[K4_BAND][64]; /* codes as bytes in element order, 4 per dword */
    int32_t sc[K4_BAND][8]; /* sub-block scales */
    int32_t mn[K4_BAND][4]; /* (min 2j, min 2j+1) as int16 pairs against the panel's bs32 */
    float d[K4_BAND], dmin[K4_BAND];
} k4_band;

static inline __attribute__((always_inline)) void k4_band_unpack(const uint8_t *xb, size_t xs,
                                                                 int64_t b, k4_band *w) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int r = 0; r < K4_BAND; r++) {
        const block_q4_K *x = (const block_q4_K *)(xb + (size_t)r * xs) + b;
        uint8_t sm[16];
        k4_scales(x->scales, sm);
        _mm256_storeu_si256((__m256i *)w->sc[r], _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)sm)));
        _mm_storeu_si128((__m128i *)w->mn[r], _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(sm + 8))));
        w->d[r] = h2f(x->d);
        w->dmin[r] = h2f(x->dmin);
        for (int c = 0; c < 4; c++) {
            const __m256i q = load32(x->qs + 32 * c);
            _mm256_storeu_si256((__m256i *)(w->q[r] + 16 * c), _mm256_and_si256(q, m4));
            _mm256_storeu_si256((__m256i *)(w->q[r] + 16 * c + 8),
                                _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
        }
    }
}

/* The integer sums of a band of weight rows against a panel, for a K-quant
 * with ng scale groups of 64/ng dwords: s1[r] = sum_g sc[r][g] * (the
 * group's code sums), s2[r] = sum_i bs[i] . pair[r * np + i] (vpdpwssd on
 * np int16 pair vectors of the panel: Q4_K's 4 sub-block sum pairs against
 * its mins, Q6_K's 8 bsum pairs against its scale pairs). Exact int32. */
static inline __attribute__((always_inline)) void k_band_sums(const int32_t (*q)[64],
                                                              const int32_t *sc, int ng,
                                                              const int32_t *pair, int np,
                                                              const int32_t (*bs)[16],
                                                              const k4_panel *p, __m512i *s1,
                                                              __m512i *s2) {
    const int gd = 64 / ng;
    _Pragma("GCC unroll 8") for (int r = 0; r < K4_BAND; r++) s1[r] = _mm512_setzero_si512();
    for (int g = 0; g < ng; g++) {
        __m512i a[K4_BAND];
        _Pragma("GCC unroll 8") for (int r = 0; r < K4_BAND; r++) a[r] = _mm512_setzero_si512();
        _Pragma("GCC unroll 8") for (int k = 0; k < gd; k++) {
            const __m512i pc = _mm512_loadu_si512(p->codes[gd * g + k]);
            _Pragma("GCC unroll 8") for (int r = 0; r < K4_BAND; r++)
                a[r] = _mm512_dpbusd_epi32(a[r], _mm512_set1_epi32(q[r][gd * g + k]), pc);
        }
        _Pragma("GCC unroll 8") for (int r = 0; r < K4_BAND; r++)
            s1[r] = _mm512_add_epi32(s1[r], _mm512_mullo_epi32(a[r], _mm512_set1_epi32(sc[r * ng + g])));
    }
    _Pragma("GCC unroll 8") for (int r = 0; r < K4_BAND; r++) s2[r] = _mm512_setzero_si512();
    _Pragma("GCC unroll 8") for (int i = 0; i < np; i++) {
        const __m512i b = _mm512_loadu_si512(bs[i]);
        _Pragma("GCC unroll 8") for (int r = 0; r < K4_BAND; r++)
            s2[r] = _mm512_dpwssd_epi32(s2[r], b, _mm512_set1_epi32(pair[r * np + i]));
    }
}

static inline __attribute__((always_inline)) void k4_band_panel(const k4_band *w, const k4_panel *p,
                                                                __m512 *acc) {
    __m512i s1[K4_BAND], s2[K4_BAND];
    k_band_sums(w->q, &w->sc[0][0], 8, &w->mn[0][0], 4, p->bs32, p, s1, s2);
    const __m512 pd = _mm512_loadu_ps(p->d);
    _Pragma("GCC unroll 8") for (int r = 0; r < K4_BAND; r++) {
        const __m512 rr = _mm512_fnmadd_ps(_mm512_set1_ps(w->dmin[r]), _mm512_cvtepi32_ps(s2[r]),
                                           _mm512_mul_ps(_mm512_cvtepi32_ps(s1[r]), _mm512_set1_ps(w->d[r])));
        acc[r] = _mm512_fmadd_ps(rr, pd, acc[r]);
    }
}

/* The K-quant panel GEMM's driver (Q4_K, Q6_K): up to PANELS panels (16
 * tokens each) per pass, superblock by superblock: the panels of
 * superblock b are built, then each band of K4_BAND weight rows is
 * unpacked once and run against every panel (a weight row's unpack shared
 * by up to 16 * PANELS tokens, a panel's build by up to OUT weight rows);
 * the accumulators wait in acc, and each gets its superblocks in ascending
 * order, so the recipe's order is kept. Weight rows past the last whole
 * band, and tokens past the last panel (fewer than K4_PANEL_MIN), take the
 * rows groups: the same integer sums and recipe, so the same bits.
 *
 * Sizes (bench/bench_rows.py, 2048 x 2048, one thread, Zen 5 VM, ns per
 * 256 weights x row at 64 / 256 activation rows): 64 weight rows x 4
 * panels per call, Q4_K 1.21-1.24 / 1.19-1.20, Q6_K 1.26-1.30 / 1.22-1.28;
 * 128 x 4: Q4_K 1.14-1.19 / 1.12-1.14, Q6_K 1.17-1.23 / 1.16-1.19; 128 x 8:
 * Q4_K 1.12-1.16 / 1.08-1.16, Q6_K 1.19-1.25 / 1.16-1.27; then Q4_K's mins
 * against sub-block pairs (4 vpdpwssd a row, was 8), 128 x 8: 1.07-1.18 at
 * 256 rows where the build without them measured 1.12-1.16 in the same
 * alternation (this VM's speed drifts by ~10% between runs; the tile-size
 * changes measured at the model level: bench/ab_builds.py). The band-
 * panel's own integer work (k_band_sums: vpdpbusd, vpmulld, vpdpwssd, the
 * integer multiply pipes' work) is ~70% of the call at 128 x 8; the rest is
 * the unpack, the panel builds and the accumulators. acc lives on the
 * stack: Q4_K 8 x 128 x 64 B = 64 KiB, Q6_K (4 chains) 4 x 4 x 128 x 64 B =
 * 128 KiB, beside matmul.c's result buffer (DS4_TILE_ROWS_MAX x
 * DS4_TILE_OUT_MAX floats, 64 KiB): fine for glibc's thread stacks (the
 * stack rlimit, 8 MiB by default, or 2 MiB), which run the pool's threads
 * and the caller. */
#define K4_PANELS 8
#define K4_OUT 128
#define K6_PANELS 4
#define K6_OUT 128
#define K_TILE(name, block_t, band_t, BUILD, UNPACK, BAND_PANEL, ROWS, CH, PANELS, OUT)                 \
    static void name(int64_t n, int no, int nr, float *s, int64_t ss, const void *x, size_t xs,  \
                     const void *const *y) {                                                   \
        const uint8_t *xb = x;                                                                 \
        const int64_t nb = n / QK_K;                                                           \
        const int nob = no / K4_BAND * K4_BAND; /* weight rows in whole bands */              \
        int r0 = 0;                                                                            \
        while (nob && nr - r0 >= K4_PANEL_MIN) {                                               \
            int np = 0, nt[PANELS];                                                            \
            for (int t = r0; np < PANELS && nr - t >= K4_PANEL_MIN; t += 16)                   \
                nt[np++] = nr - t < 16 ? nr - t : 16;                                          \
            __m512 acc[PANELS][CH][OUT];                                                       \
            for (int q = 0; q < np; q++)                                                       \
                for (int c = 0; c < CH; c++)                                                   \
                    for (int o = 0; o < nob; o++) acc[q][c][o] = _mm512_setzero_ps();          \
            for (int64_t b = 0; b < nb; b++) {                                                 \
                k4_panel p[PANELS];                                                            \
                for (int q = 0; q < np; q++) BUILD(&p[q], 1, b, nt[q], y + r0 + 16 * q);  \
                for (int o = 0; o < nob; o += K4_BAND) {                                       \
                    if (b + 1 < nb) k_band_prefetch(xb + (size_t)o * xs, xs, b + 1, sizeof(block_t)); \
                    band_t w;                                                                  \
                    UNPACK(xb + (size_t)o * xs, xs, b, &w);                                    \
                    for (int q = 0; q < np; q++) BAND_PANEL(&w, &p[q], &acc[q][b % CH][o]);    \
                }                                                                              \
            }                                                                                  \
            for (int q = 0; q < np; q++)                                                       \
                for (int o = 0; o < nob; o++) {                                                \
                    float out[16];                                                             \
                    _mm512_storeu_ps(out, k_chains_sum(&acc[q][0][0], OUT, CH, o));            \
                    for (int t = 0; t < nt[q]; t++) s[(int64_t)(r0 + 16 * q + t) * ss + o] = out[t]; \
                }                                                                              \
            for (int q = 0; q < np; q++) r0 += nt[q];                                          \
        }                                                                                      \
        float t[ROWS_GROUP];                                                                   \
        for (int o = 0; o < no; o++) /* the rest: rows groups */                             \
            for (int g = o < nob ? r0 : 0; g < nr; g += ROWS_GROUP) {                          \
                const int m = nr - g < ROWS_GROUP ? nr - g : ROWS_GROUP;                       \
                ROWS(n, m, t, xb + (size_t)o * xs, y + g);                                     \
                for (int r = 0; r < m; r++) s[(int64_t)(g + r) * ss + o] = t[r];               \
            }                                                                                  \
    }

/* The end of CH accumulator chains (superblock b in chain b % CH): one
 * chain as it is, four as (c0 + c1) + (c2 + c3). */
static inline __attribute__((always_inline)) __m512 k_chains_sum(const __m512 *acc, int out, int ch,
                                                                 int o) {
    if (ch == 1) return acc[o];
    return _mm512_add_ps(_mm512_add_ps(acc[o], acc[out + o]),
                         _mm512_add_ps(acc[2 * out + o], acc[3 * out + o]));
}

/* The next superblock of a band's weight rows: 64 rows are more streams
 * than the hardware prefetcher follows. */
static inline __attribute__((always_inline)) void k_band_prefetch(const uint8_t *xb, size_t xs,
                                                                  int64_t b, size_t bb) {
    for (int r = 0; r < K4_BAND; r++) {
        const char *nx = (const char *)(xb + (size_t)r * xs + (size_t)b * bb);
        _mm_prefetch(nx, _MM_HINT_T0);
        _mm_prefetch(nx + 64, _MM_HINT_T0);
        _mm_prefetch(nx + bb - 1, _MM_HINT_T0);
    }
}

K_TILE(tile_q4_k, block_q4_K, k4_band, k4_build_panel, k4_band_unpack, k4_band_panel, dot_rows_q4_k, 1, K4_PANELS, K4_OUT)

static void dot_q5_k(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q5_K *x = vx;
    const block_q8_K *y = vy;
    const __m512i m4 = _mm512_set1_epi8(0x0F), one = _mm512_set1_epi8(1), two = _mm512_set1_epi16(2);
    __m512 acc = _mm512_setzero_ps();
    __m256 accm = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t sm[16];
        k4_scales(x[i].scales, sm);
        const __m512i sc = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sm)));
        __m512i idx = k4_scale_idx0();
        /* [qh | qh >> 1]: bit 0 of each byte is then qh bit 2c (low codes) /
         * 2c+1 (high codes) after c further shifts by 2. Shifting 16-bit
         * lanes by <= 7 never moves a neighbour byte's bits into bit 0. */
        __m512i h = _mm512_broadcast_i64x4(load32(x[i].qh));
        h = _mm512_mask_srli_epi16(h, UPPER16, h, 1);
        __m512i isum = _mm512_setzero_si512(); /* per lane <= 4 * 63 * 2*7874 < 2^22 */
        for (int c = 0; c < 4; c++) {
            __m512i q = _mm512_broadcast_i64x4(load32(x[i].qs + 32 * c));
            __m512i codes = _mm512_and_si512(_mm512_mask_srli_epi16(q, UPPER16, q, 4), m4);
            codes = _mm512_or_si512(codes, _mm512_slli_epi16(_mm512_and_si512(h, one), 4));
            __m512i p16 = _mm512_maddubs_epi16(codes, _mm512_loadu_si512(y[i].qs + 64 * c));
            isum = _mm512_dpwssd_epi32(isum, p16, _mm512_permutexvar_epi16(idx, sc));
            idx = _mm512_add_epi16(idx, two);
            h = _mm512_srli_epi16(h, 2);
        }
        const float dy = y[i].d;
        acc = _mm512_fmadd_ps(_mm512_set1_ps(dy * h2f(x[i].d)), _mm512_cvtepi32_ps(isum), acc);
        accm = _mm256_fnmadd_ps(_mm256_set1_ps(dy * h2f(x[i].dmin)),
                                _mm256_cvtepi32_ps(k4_min_terms(sm, y[i].bsums)), accm);
    }
    *s = hsum256(_mm256_add_ps(fold512(acc), accm));
}

/* Q6_K x Q8_K: EXACT SUPERBLOCK SUMS, as Q4_K above. Unsigned codes q
 * 0..63 (the file's code minus -32); per superblock
 *   S = sum_g sc_g * sum_{e in g} q_e * a_e  -  32 * sum_g sc_g * bsum_g
 * (16 groups g of 16 codes; |S| < 2^29, exact int32), then
 *   c[b % 4] = fmaf((float)S * d, d_a, c[b % 4])
 * for superblocks b in ascending order, four chains, and the result is
 * (c[0] + c[1]) + (c[2] + c[3]). Four chains, not one: a row's superblocks
 * are short work and one chain of dependent fmaf (4 cycles each) was most
 * of the one-row kernel's time (4.0 -> 4.6 ns per 256 weights against the
 * float-lane kernel before, bench_rows.py on a Zen 5 VM, with one chain).
 * The one-row dot and the rows groups form S
 * with k_pair (the first sum) and the activation's 16-element sums (the
 * second), the panel with vpdpbusd per group; the same S, the same bits. */

/* The weight side of one Q6_K superblock for k_pair rows: the four 64-code
 * vectors (codes 0..63 of each 128-chunk: (l & 15) | ((h >> {0|2}) & 3) << 4,
 * codes 64..127: (l >> 4) | ((h >> {4|6}) & 3) << 4, {lower|upper} 32 bytes,
 * h = [qh | qh] of the chunk), in element order, the pairs' scale lanes,
 * and 32 * the scales as int16 (the second sum's weights). The high bits
 * are moved straight to bits 4-5 ((h << {4|2}) & 0x30, then h & 0x30 and
 * (h >> 2) & 0x30: 16-bit shifts <= 4 bring a neighbour byte's bits only
 * into bits the mask drops) and joined with the nibble by one vpternlogd
 * ((l & 0x0F) | hi): 7 operations per 128 codes instead of 12, 0.86-0.96x
 * the one-row dot's time in cache at rows of 1024-3584, 0.94-1.0x at 512
 * (Zen 5 VM, 2026-12-07). */
#define K6_CHAINS 4

typedef struct {
    __m512i codes[4], scl01, scl23, sc32;
} k6_side;

/* vpternlogd's truth table for (a & c) | b. */
#define TERN_A_AND_C_OR_B 0xEC

static inline __attribute__((always_inline)) void k6_weight_side(const block_q6_K *x, k6_side *w) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const __m512i shl = _mm512_mask_blend_epi16(UPPER16, _mm512_set1_epi16(4), _mm512_set1_epi16(2));
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales));
    const __m512i sc512 = _mm512_castsi256_si512(sc16);
    w->scl01 = _mm512_permutexvar_epi16(_mm512_loadu_si512(k_idx_q6k[0]), sc512);
    w->scl23 = _mm512_permutexvar_epi16(_mm512_loadu_si512(k_idx_q6k[1]), sc512);
    w->sc32 = _mm512_broadcast_i64x4(_mm256_slli_epi16(sc16, 5));
    for (int c = 0; c < 2; c++) {
        const __m512i l = _mm512_loadu_si512(x->ql + 64 * c);
        const __m512i h = _mm512_broadcast_i64x4(load32(x->qh + 32 * c));
        const __m512i ha = _mm512_and_si512(_mm512_sllv_epi16(h, shl), m30);
        const __m512i hb = _mm512_and_si512(_mm512_mask_srli_epi16(h, UPPER16, h, 2), m30);
        w->codes[2 * c] = _mm512_ternarylogic_epi32(l, ha, m4, TERN_A_AND_C_OR_B);
        w->codes[2 * c + 1] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(l, 4), hb, m4,
                                                        TERN_A_AND_C_OR_B);
    }
}

/* One activation row against a weight side: lanes 0..7 sum to the first
 * sum, lanes 8..15 to the second (S = their difference). */
static inline __attribute__((always_inline)) __m512i k6_row_sums(const k6_side *w, const block_q8_K *b) {
    __m512i isum = k_pair(_mm512_setzero_si512(), w->codes[0], w->codes[1], b->qs, w->scl01);
    isum = k_pair(isum, w->codes[2], w->codes[3], b->qs + 128, w->scl23);
    const __m512i corr = _mm512_madd_epi16(
        _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)b->bsums)), w->sc32);
    return k_fold_with(isum, corr);
}

/* k4_sums8's [first sums | second sums] of eight superblocks -> their S. */
static inline __m256 k6_s8(__m512i v) {
    return _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1)));
}

static void dot_q6_k(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q6_K *x = vx;
    const block_q8_K *y = vy;
    const int64_t nb = n / QK_K;
    __m128 c = _mm_setzero_ps(); /* chain k in lane k */
    for (int64_t i = 0; i < nb; i += 8) {
        const int m = (int)(nb - i < 8 ? nb - i : 8);
        const __mmask8 live = (__mmask8)((1u << m) - 1);
        __m512i v[8];
        _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) {
            if (k < m) {
                k6_side w;
                k6_weight_side(&x[i + k], &w);
                v[k] = k6_row_sums(&w, &y[i + k]);
            } else {
                v[k] = _mm512_setzero_si512();
            }
        }
        /* the scales of the live superblocks, through memory (two gathers
         * per 8 superblocks measured slower on a Zen 5 core) */
        float dk[8] = {0}, dak[8] = {0};
        _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) if (k < m) {
            dk[k] = h2f(x[i + k].d);
            dak[k] = y[i + k].d;
        }
        const __m256 d = _mm256_loadu_ps(dk), da = _mm256_loadu_ps(dak);
        const __m256 r = _mm256_mul_ps(k6_s8(k4_sums8(v)), d);
        /* superblocks i..i+3, then i+4..i+7 (i % 4 == 0: chain k & 3) */
        c = _mm_mask3_fmadd_ps(_mm256_castps256_ps128(r), _mm256_castps256_ps128(da), c, live & 0xF);
        c = _mm_mask3_fmadd_ps(_mm256_extractf128_ps(r, 1), _mm256_extractf128_ps(da, 1), c, live >> 4);
    }
    float cs[4];
    _mm_storeu_ps(cs, c);
    *s = (cs[0] + cs[1]) + (cs[2] + cs[3]);
}

/* Q6_K for g <= ROWS_GROUP activation rows: the weight side once, the rows'
 * S in the lanes of one accumulator (as q4k_rows_group). */
static inline __attribute__((always_inline)) void q6k_rows_group(
    int64_t n, int g, float *s, const block_q6_K *x, const void *const *vy) {
    const block_q8_K *y[ROWS_GROUP];
    int64_t addr[ROWS_GROUP];
    _Pragma("GCC unroll 8") for (int r = 0; r < ROWS_GROUP; r++) {
        y[r] = r < g ? vy[r] : vy[0];
        addr[r] = (int64_t)(intptr_t)&y[r][0].d;
    }
    const __m512i vaddr = _mm512_loadu_si512(addr);
    __m256 acc[K6_CHAINS];
    _Pragma("GCC unroll 4") for (int c = 0; c < K6_CHAINS; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        k6_side w;
        k6_weight_side(&x[i], &w);
        __m512i v[ROWS_GROUP];
        _Pragma("GCC unroll 8") for (int r = 0; r < ROWS_GROUP; r++)
            v[r] = r < g ? k6_row_sums(&w, &y[r][i]) : _mm512_setzero_si512();
        const __m256 da = _mm512_i64gather_ps(
            _mm512_add_epi64(vaddr, _mm512_set1_epi64(i * (int64_t)sizeof(block_q8_K))), NULL, 1);
        acc[i % K6_CHAINS] = _mm256_fmadd_ps(_mm256_mul_ps(k6_s8(k4_sums8(v)), _mm256_set1_ps(h2f(x[i].d))),
                                             da, acc[i % K6_CHAINS]);
    }
    float out[8];
    _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    _Pragma("GCC unroll 8") for (int r = 0; r < g; r++) s[r] = out[r];
}

ROWS_DISPATCH(dot_rows_q6_k, block_q6_K, q6k_rows_group, dot_q6_k)

/* Q6_K bands for the panel GEMM (K_TILE): codes in element order as
 * k6_weight_side makes them, the 16 scales, and the scale pairs
 * (sc_2i, sc_2i+1) as int16 pairs against the panel's bsum pairs. */
typedef struct {
    int32_t q[K4_BAND][64];
    int32_t sc[K4_BAND][16];
    int32_t scp[K4_BAND][8];
    float d[K4_BAND];
} k6_band;

static inline __attribute__((always_inline)) void k6_band_unpack(const uint8_t *xb, size_t xs,
                                                                 int64_t b, k6_band *w) {
    for (int r = 0; r < K4_BAND; r++) {
        const block_q6_K *x = (const block_q6_K *)(xb + (size_t)r * xs) + b;
        k6_side sd;
        k6_weight_side(x, &sd);
        for (int c = 0; c < 4; c++) _mm512_storeu_si512(w->q[r] + 16 * c, sd.codes[c]);
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)x->scales);
        _mm512_storeu_si512(w->sc[r], _mm512_cvtepi8_epi32(sc8));
        _mm256_storeu_si256((__m256i *)w->scp[r], _mm256_cvtepi8_epi16(sc8));
        w->d[r] = h2f(x->d);
    }
}

static inline __attribute__((always_inline)) void k6_band_panel(const k6_band *w, const k4_panel *p,
                                                                __m512 *acc) {
    __m512i s1[K4_BAND], s2[K4_BAND];
    k_band_sums(w->q, &w->sc[0][0], 16, &w->scp[0][0], 8, p->bs, p, s1, s2);
    const __m512 pd = _mm512_loadu_ps(p->d);
    _Pragma("GCC unroll 8") for (int r = 0; r < K4_BAND; r++) {
        const __m512 f = _mm512_cvtepi32_ps(_mm512_sub_epi32(s1[r], _mm512_slli_epi32(s2[r], 5)));
        acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(f, _mm512_set1_ps(w->d[r])), pd, acc[r]);
    }
}

K_TILE(tile_q6_k, block_q6_K, k6_band, k6_build_panel, k6_band_unpack, k6_band_panel, dot_rows_q6_k, K6_CHAINS, K6_PANELS, K6_OUT)

static void dot_iq4_xs(int64_t n, float *s, const void *vx, const void *vy) {
    const block_iq4_xs *x = vx;
    const block_q8_K *y = vy;
    const __m256i tab = iq4nl_table();
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        /* |code| <= 127 keeps the int16 pairs <= 32258; scales ls-32 apply
         * after widening (vpdpwssd). */
        __m256i acc = _mm256_setzero_si256();
        for (int ib = 0; ib < 8; ib++) {
            __m256i k = _mm256_shuffle_epi8(tab, nibbles_split16(x[i].qs + 16 * ib));
            __m256i a = load32(y[i].qs + 32 * ib);
            __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(k, k), _mm256_sign_epi8(a, k));
            acc = _mm256_dpwssd_epi32(acc, p16,
                                      _mm256_set1_epi16((int16_t)(iq4xs_scale(&x[i], ib) - 32)));
        }
        sum += y[i].d * h2f(x[i].d) * (float)hsum_i32_256(acc);
    }
    *s = sum;
}

/* ------------------------------------------------ 64-wide affine x Q8_0 -- */
/* One weight block = one zmm of 64 codes against activation blocks 2i and
 * 2i+1 (lanes 0..7 / 8..15 of the int32 sums). Per half:
 * scale*d_a*sum(q*a) + bias*d_a*sum(a), the two products in separate
 * accumulators, each one FMA. */
static inline void affine64(__m512i codes, const block_q8_0 *a, float sc, float bi,
                            __m512 *acc_q, __m512 *acc_b) {
    const __m512i av = join(load32(a[0].qs), load32(a[1].qs));
    const __m512i zero = _mm512_setzero_si512();
    const __m512i sq = _mm512_dpbusd_epi32(zero, codes, av);
    const __m512i sa = _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(1), av);
    /* [d0 x8 | d1 x8] once; scale*d and bias*d are each one rounding, as
     * the scalar products would be */
    const __m512 d = join_ps(h2f(a[0].d), h2f(a[1].d));
    *acc_q = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(sc), d), _mm512_cvtepi32_ps(sq), *acc_q);
    *acc_b = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(bi), d), _mm512_cvtepi32_ps(sa), *acc_b);
}

static void dot_q4_64a(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q4_64a *x = vx;
    const block_q8_0 *y = vy;
    __m512 aq = _mm512_setzero_ps(), ab = aq;
    for (int64_t i = 0; i < n / QK64A; i++) {
        /* 16-bit lanes holding byte b: (b | b<<4) & 0x0F0F = codes 2k, 2k+1 */
        __m512i w = _mm512_cvtepu8_epi16(load32(x[i].qs));
        w = _mm512_and_si512(_mm512_or_si512(w, _mm512_slli_epi16(w, 4)), _mm512_set1_epi16(0x0F0F));
        affine64(w, &y[2 * i], ds4_bf16_to_f32(x[i].scale), ds4_bf16_to_f32(x[i].bias), &aq, &ab);
    }
    *s = hsum256(fold512(aq)) + hsum256(fold512(ab));
}

static void dot_q2_64a(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q2_64a *x = vx;
    const block_q8_0 *y = vy;
    __m512 aq = _mm512_setzero_ps(), ab = aq;
    for (int64_t i = 0; i < n / QK64A; i++) {
        /* 32-bit lanes holding byte b: t = b | b<<12; t | t<<6 puts bits
         * 2s..2s+1 of b at bit 8s, i.e. codes 4k..4k+3 in order */
        __m512i w = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)x[i].qs));
        w = _mm512_or_si512(w, _mm512_slli_epi32(w, 12));
        w = _mm512_or_si512(w, _mm512_slli_epi32(w, 6));
        w = _mm512_and_si512(w, _mm512_set1_epi32(0x03030303));
        affine64(w, &y[2 * i], ds4_bf16_to_f32(x[i].scale), ds4_bf16_to_f32(x[i].bias), &aq, &ab);
    }
    *s = hsum256(fold512(aq)) + hsum256(fold512(ab));
}

/* ---------------------------------------------------------------- init -- */

int ds4_kernels_init_avx512(ds4_kernel_set *k) {
    k->vec_dot[DS4_TYPE_F32] = dot_f32_f32;
    k->vec_dot_f32[DS4_TYPE_F32] = dot_f32_f32;
    k->vec_dot[DS4_TYPE_F16] = dot_f16_f16;
    k->vec_dot_f32[DS4_TYPE_F16] = dot_f16_f32;
    k->vec_dot[DS4_TYPE_BF16] = dot_bf16_bf16;
    k->vec_dot_f32[DS4_TYPE_BF16] = dot_bf16_f32;
    k->vec_dot[DS4_TYPE_Q4_0] = dot_q4_0;
    k->vec_dot[DS4_TYPE_Q4_1] = dot_q4_1;
    k->vec_dot[DS4_TYPE_Q5_0] = dot_q5_0;
    k->vec_dot[DS4_TYPE_Q5_1] = dot_q5_1;
    k->vec_dot[DS4_TYPE_Q8_0] = dot_q8_0;
    k->vec_dot[DS4_TYPE_IQ4_NL] = dot_iq4_nl;
    k->vec_dot[DS4_TYPE_Q4_K] = dot_q4_k;
    k->vec_dot[DS4_TYPE_Q5_K] = dot_q5_k;
    k->vec_dot[DS4_TYPE_Q6_K] = dot_q6_k;
    k->vec_dot[DS4_TYPE_IQ4_XS] = dot_iq4_xs;
    k->vec_dot[DS4_TYPE_Q4_64A] = dot_q4_64a;
    k->vec_dot[DS4_TYPE_Q2_64A] = dot_q2_64a;
    k->gdn_rows = gdn_rows;
    if (expf_vec_matches()) k->silu_mul = silu_mul;
    k->f16_acc_row = f16_acc_row;
    k->dot_rows[DS4_TYPE_Q8_0] = dot_rows_q8_0;
    k->pack_rows[DS4_TYPE_Q8_0] = pack_q8x;
    k->dot_tile[DS4_TYPE_Q8_0] = tile_q8_0;
    k->dot_tile_out[DS4_TYPE_Q8_0] = 16;
    k->dot_rows_name[DS4_TYPE_Q8_0] = "avx512 q8_0 x q8x rows, tiles of up to 8 weight rows at n <= 512";
    k->dot_rows[DS4_TYPE_Q4_K] = dot_rows_q4_k;
    k->dot_tile[DS4_TYPE_Q4_K] = tile_q4_k;
    k->dot_tile_min_rows[DS4_TYPE_Q4_K] = K4_PANEL_MIN;
    k->dot_tile_out[DS4_TYPE_Q4_K] = K4_OUT;
    k->dot_tile_rows[DS4_TYPE_Q4_K] = 16 * K4_PANELS;
    k->dot_tile[DS4_TYPE_Q6_K] = tile_q6_k;
    k->dot_tile_min_rows[DS4_TYPE_Q6_K] = K4_PANEL_MIN;
    k->dot_tile_out[DS4_TYPE_Q6_K] = K6_OUT;
    k->dot_tile_rows[DS4_TYPE_Q6_K] = 16 * K6_PANELS;
    k->dot_rows_name[DS4_TYPE_Q4_K] =
        "avx512 q4_K x q8_K exact superblock sums (rows groups; from 12 rows 8-row bands x 16-token panels)";
    k->dot_rows[DS4_TYPE_Q6_K] = dot_rows_q6_k;
    k->dot_rows_name[DS4_TYPE_Q6_K] =
        "avx512 q6_K x q8_K exact superblock sums (rows groups; from 12 rows 8-row bands x 16-token panels)";
    return 1;
}

#else /* not compiled for AVX-512 F/BW/DQ/VL/VNNI */

int ds4_kernels_init_avx512(ds4_kernel_set *k) {
    (void)k;
    return 0;
}

#endif
