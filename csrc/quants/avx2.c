/*
 * avx2.c — AVX2 + FMA + F16C kernels for every weight type ds4 computes with.
 *
 * Contract with the scalar reference (scalar.c, itself ggml's formulas):
 *  - to_float is bit-exact: each output is produced by the same IEEE float
 *    operations in the same order as the reference (a multiply then a separate
 *    add/sub where the reference has x*d + m; never an FMA there). fp16 -> f32
 *    goes through vcvtph2ps: exact, and NaNs quieted as scalar.c does.
 *  - from_float (Q8_0, Q8_1, Q8_K, F16, BF16) is byte-identical: the same
 *    scale arithmetic, round-to-nearest-even of x*id as llama.cpp's x86
 *    build, NaN and Inf inputs included.
 *  - dots compute the integer part of each block exactly (int32 lanes; their
 *    conversion to float is exact below 2^24, which the per-kernel bounds
 *    keep except Q6_K's theoretical extreme); only the float rounding and
 *    accumulation order differ from the reference. Every kernel uses a fixed
 *    order that depends on nothing but n, so results are deterministic.
 *
 * Activation precondition for the paired dots: the int8 quants of Q8_0/Q8_1/
 * Q8_K activations lie in [-127, 127], which every quantizer guarantees. The
 * sign trick (|x| as unsigned times sign(x)*y, vpmaddubsw) would negate -128
 * into itself. Weight quants may use the whole int8 range.
 *
 * No heap, no reads past a row's last block: every vector load is inside one
 * block struct (see the offsets in quants.h).
 *
 * The body is compiled only with -mavx2 -mfma -mf16c (build_core.py); anywhere
 * else the init reports "not provided".
 */
#include "quants.h"
#include "avx2_fwd.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

/* ------------------------------------------------------------- helpers -- */

static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }
/* Nearest-even, as ds4_f32_to_fp16 and ggml's F16C build. */
static inline uint16_t f2h(float f) { return (uint16_t)_cvtss_sh(f, 0); }

/* Fixed-order horizontal sums: (lo128 + hi128), then pairs, then the last two. */
static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* s[r] = hsum_ps(v[r]) + 0.0f for four rows at once: each step adds the
 * same two values as hsum_ps does for that row (two rows per vector, then
 * four), and float addition is commutative, so every bit is the same; ~12
 * instructions instead of ~28 (the end of a row is a sizable part of a
 * short one: the demo model's E = 256 is 8 Q8_0 blocks). */
static inline void hsum4_ps(const __m256 v[4], float s[4]) {
    /* lo128 + hi128: row 0 | row 1, row 2 | row 3 */
    const __m256 a = _mm256_add_ps(_mm256_permute2f128_ps(v[0], v[1], 0x20),
                                   _mm256_permute2f128_ps(v[0], v[1], 0x31));
    const __m256 b = _mm256_add_ps(_mm256_permute2f128_ps(v[2], v[3], 0x20),
                                   _mm256_permute2f128_ps(v[2], v[3], 0x31));
    /* t0 = s0 + s2, t1 = s1 + s3: [t0, t1 of row 0, t0, t1 of row 2 | rows 1, 3] */
    const __m256 t = _mm256_add_ps(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
    /* t0 + t1: [row 0, row 2, .. | row 1, row 3, ..], then + 0.0f */
    const __m256 u = _mm256_add_ps(_mm256_shuffle_ps(t, t, _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm256_shuffle_ps(t, t, _MM_SHUFFLE(3, 1, 3, 1)));
    float out[8];
    _mm256_storeu_ps(out, _mm256_add_ps(u, _mm256_setzero_ps()));
    s[0] = out[0], s[1] = out[4], s[2] = out[1], s[3] = out[5];
}

static inline int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    return _mm_cvtsi128_si32(s);
}

/* Operand order as llama.cpp's x86 quantize_row_q8_0 (hi half first): maxps
 * returns its second operand when either is NaN, so only NaN inputs can tell
 * the orders apart, and then the quantizers stay byte-identical to scalar.c. */
static inline float hmax_ps(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* 8 int8 from the low half of v -> 8 exact floats. */
static inline __m256 i8x8_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }

/* The four 8-float pieces of 32 int8 lanes, in lane order. */
static inline void i8x32_ps(__m256i q, __m256 f[4]) {
    __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    f[0] = i8x8_ps(lo);
    f[1] = i8x8_ps(_mm_srli_si128(lo, 8));
    f[2] = i8x8_ps(hi);
    f[3] = i8x8_ps(_mm_srli_si128(hi, 8));
}

/* y[j] = (float)q[j] * d — one rounding, as the reference's q*d. */
static inline void store_mul32(float *y, __m256i q, __m256 d) {
    __m256 f[4];
    i8x32_ps(q, f);
    for (int k = 0; k < 4; k++) _mm256_storeu_ps(y + 8 * k, _mm256_mul_ps(f[k], d));
}

static inline void store_mul16(float *y, __m128i q, __m256 d) {
    _mm256_storeu_ps(y, _mm256_mul_ps(i8x8_ps(q), d));
    _mm256_storeu_ps(y + 8, _mm256_mul_ps(i8x8_ps(_mm_srli_si128(q, 8)), d));
}

/* y[j] = q[j]*d + m: multiply, round, add, round (q4_1/q5_1/64A). */
static inline void store_affine32(float *y, __m256i q, __m256 d, __m256 m) {
    __m256 f[4];
    i8x32_ps(q, f);
    for (int k = 0; k < 4; k++)
        _mm256_storeu_ps(y + 8 * k, _mm256_add_ps(_mm256_mul_ps(f[k], d), m));
}

/* y[j] = d*q[j] - m: the K-quants' d1*q - m1, again unfused. */
static inline void store_kmin32(float *y, __m256i q, __m256 d, __m256 m) {
    __m256 f[4];
    i8x32_ps(q, f);
    for (int k = 0; k < 4; k++)
        _mm256_storeu_ps(y + 8 * k, _mm256_sub_ps(_mm256_mul_ps(d, f[k]), m));
}

/* 16 bytes -> 32 lanes: low nibbles of b[0..15], then high nibbles (the
 * Q4_0/Q4_1/Q5_x/IQ4_NL order). */
static inline __m256i nibbles_split16(const uint8_t *p) {
    __m128i t = _mm_loadu_si128((const __m128i *)p);
    __m256i v = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

/* 16 bytes -> 32 lanes in the Q4_64A order: code 2k is the low nibble of
 * byte k, code 2k+1 its high nibble. In 16-bit lanes holding b,
 * (b | b << 4) & 0x0F0F puts b & 15 in the low byte and b >> 4 in the high. */
static inline __m256i nibbles_pairs16(const uint8_t *p) {
    __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
    w = _mm256_or_si256(w, _mm256_slli_epi16(w, 4));
    return _mm256_and_si256(w, _mm256_set1_epi16(0x0F0F));
}

/* 8 bytes -> 32 lanes in the Q2_64A order: code 4k+s is bits 2s..2s+1 of
 * byte k. In 32-bit lanes holding b, b | b<<6 | b<<12 | b<<18 (built as
 * t = b | b<<12; t | t<<6) has bits 2s..2s+1 of b at bit 8s. */
static inline __m256i crumbs8(const uint8_t *p) {
    __m256i w = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    w = _mm256_or_si256(w, _mm256_slli_epi32(w, 12));
    w = _mm256_or_si256(w, _mm256_slli_epi32(w, 6));
    return _mm256_and_si256(w, _mm256_set1_epi32(0x03030303));
}

/* 32 bits -> 32 bytes, byte j = 0xFF when bit j is set. */
static inline __m256i bits_to_mask32(uint32_t bits) {
    const __m256i shuf = _mm256_setr_epi64x(0x0000000000000000LL, 0x0101010101010101LL,
                                            0x0202020202020202LL, 0x0303030303030303LL);
    const __m256i sel = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), shuf);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, sel), sel);
}

/* IQ4_NL code book in both lanes, for vpshufb lookups. */
static inline __m256i iq4nl_table(void) {
    __m128i t = _mm_loadu_si128((const __m128i *)ds4_kvalues_iq4nl);
    return _mm256_set_m128i(t, t);
}

/* Sums of 4 adjacent products of unsigned u and signed y, as 8 int32 lanes.
 * vpmaddubsw saturates its int16 pair sums, so every caller keeps
 * |u0*y0 + u1*y1| <= 32767 (bounds stated at each call). */
static inline __m256i dot_u8(__m256i u, __m256i y) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, y), _mm256_set1_epi16(1));
}

/* Same for signed x: |x| (x = -128 reads as unsigned 128) times sign(x)*y.
 * Pairs stay within int16: 2*128*127 = 32512. */
static inline __m256i dot_i8(__m256i x, __m256i y) {
    return dot_u8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

/* Same but the int16 pair sums are weighted by s before widening. */
static inline __m256i dot_u8_scaled(__m256i u, __m256i y, __m256i s16) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, y), s16);
}

/* Q4_K/Q5_K 6-bit scales and mins (ggml-quants.c, get_scale_min_k4), four
 * at a time in 32-bit words w0..w2 = the 12 bytes q[0..11]:
 *   sc[0..3] = q[j] & 63                 -> w0 & 0x3f..
 *   mn[0..3] = q[j+4] & 63               -> w1 & 0x3f..
 *   sc[4..7] = (q[j+4] & 15) | (q[j-4] >> 6) << 4   (j = 4..7)
 *   mn[4..7] = (q[j+4] >> 4) | (q[j] >> 6) << 4
 * out[0..7] = scales, out[8..15] = mins. */
static inline void k4_scales(const uint8_t *q, uint8_t out[16]) {
    uint32_t w[3], r[4];
    memcpy(w, q, 12);
    r[0] = w[0] & 0x3f3f3f3fu;
    r[1] = (w[2] & 0x0f0f0f0fu) | (((w[0] >> 6) & 0x03030303u) << 4);
    r[2] = w[1] & 0x3f3f3f3fu;
    r[3] = ((w[2] >> 4) & 0x0f0f0f0fu) | (((w[1] >> 6) & 0x03030303u) << 4);
    memcpy(out, r, 16);
}

/* Per sub-block j of a Q4_K/Q5_K block: min_j * (bsums[2j] + bsums[2j+1]),
 * exact in int32 (|.| <= 63 * 2 * 16 * 127), as 8 lanes. */
static inline __m256i k4_min_terms(const uint8_t sm[16], const int16_t *bsums) {
    __m128i m16 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(sm + 8)));
    __m256i mm = _mm256_set_m128i(_mm_unpackhi_epi16(m16, m16), _mm_unpacklo_epi16(m16, m16));
    return _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)bsums), mm);
}

/* IQ4_XS 6-bit sub-block scale ib (ggml-quants.c, dequantize_row_iq4_xs). */
static inline int iq4xs_scale(const block_iq4_xs *b, int ib) {
    return ((b->scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((b->scales_h >> (2 * ib)) & 3) << 4);
}

/* Q5_K: the 32 codes of sub-block 2c (hi=0) or 2c+1 (hi=1) of a 64-chunk. */
static inline __m256i q5k_codes(__m256i nib, __m256i qh, int bit) {
    __m256i h = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(bit)), _mm256_set1_epi8(1));
    return _mm256_or_si256(nib, _mm256_slli_epi16(h, 4));
}

/* Q6_K: the four 32-code groups (unsigned 0..63) of a 128-chunk, in output order. */
static inline void q6k_codes(const uint8_t *ql, const uint8_t *qh, __m256i q[4]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
    __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
    __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
    __m256i h = _mm256_loadu_si256((const __m256i *)qh);
    q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(h, m3), 4));
    q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m3), 4));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), m3), 4));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), m3), 4));
}

static inline __m256i load32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* ----------------------------------------------------------- to_float -- */

static void deq_f32(const void *src, float *y, int64_t n) { memcpy(y, src, (size_t)n * 4); }

static void deq_f16(const void *src, float *y, int64_t n) {
    const uint16_t *x = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    for (; i < n; i++) y[i] = h2f(x[i]);
}

static inline __m256 bf16x8_ps(const uint16_t *p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

static void deq_bf16(const void *src, float *y, int64_t n) {
    const uint16_t *x = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, bf16x8_ps(x + i));
    for (; i < n; i++) y[i] = ds4_bf16_to_f32(x[i]);
}

static void deq_q4_0(const void *src, float *y, int64_t n) {
    const block_q4_0 *x = src;
    for (int64_t i = 0; i < n / QK4_0; i++) {
        __m256i q = _mm256_sub_epi8(nibbles_split16(x[i].qs), _mm256_set1_epi8(8));
        store_mul32(y + i * 32, q, _mm256_set1_ps(h2f(x[i].d)));
    }
}

static void deq_q4_1(const void *src, float *y, int64_t n) {
    const block_q4_1 *x = src;
    for (int64_t i = 0; i < n / QK4_1; i++)
        store_affine32(y + i * 32, nibbles_split16(x[i].qs), _mm256_set1_ps(h2f(x[i].d)),
                       _mm256_set1_ps(h2f(x[i].m)));
}

/* Q5_0/Q5_1 5-bit codes: bit j of qh is bit 4 of code j (both halves). */
static inline __m256i q5_codes(const uint8_t qh[4], const uint8_t *qs) {
    uint32_t h;
    memcpy(&h, qh, 4);
    __m256i hb = _mm256_and_si256(bits_to_mask32(h), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(nibbles_split16(qs), hb);
}

static void deq_q5_0(const void *src, float *y, int64_t n) {
    const block_q5_0 *x = src;
    for (int64_t i = 0; i < n / QK5_0; i++) {
        __m256i q = _mm256_sub_epi8(q5_codes(x[i].qh, x[i].qs), _mm256_set1_epi8(16));
        store_mul32(y + i * 32, q, _mm256_set1_ps(h2f(x[i].d)));
    }
}

static void deq_q5_1(const void *src, float *y, int64_t n) {
    const block_q5_1 *x = src;
    for (int64_t i = 0; i < n / QK5_1; i++)
        store_affine32(y + i * 32, q5_codes(x[i].qh, x[i].qs), _mm256_set1_ps(h2f(x[i].d)),
                       _mm256_set1_ps(h2f(x[i].m)));
}

static void deq_q8_0(const void *src, float *y, int64_t n) {
    const block_q8_0 *x = src;
    for (int64_t i = 0; i < n / QK8_0; i++)
        store_mul32(y + i * 32, load32(x[i].qs), _mm256_set1_ps(h2f(x[i].d)));
}

static void deq_iq4_nl(const void *src, float *y, int64_t n) {
    const block_iq4_nl *x = src;
    const __m256i tab = iq4nl_table();
    for (int64_t i = 0; i < n / QK4_NL; i++) {
        __m256i q = _mm256_shuffle_epi8(tab, nibbles_split16(x[i].qs));
        store_mul32(y + i * 32, q, _mm256_set1_ps(h2f(x[i].d)));
    }
}

static void deq_q4_k(const void *src, float *y, int64_t n) {
    const block_q4_K *x = src;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int64_t i = 0; i < n / QK_K; i++, y += QK_K) {
        const float d = h2f(x[i].d), dmin = h2f(x[i].dmin);
        uint8_t sm[16];
        k4_scales(x[i].scales, sm);
        const uint8_t *sc = sm, *mn = sm + 8;
        for (int c = 0; c < 4; c++) {
            __m256i q = load32(x[i].qs + 32 * c);
            /* d1 = d*sc and m1 = min*m rounded as floats first, as the reference. */
            store_kmin32(y + 64 * c, _mm256_and_si256(q, m4), _mm256_set1_ps(d * sc[2 * c]),
                         _mm256_set1_ps(dmin * mn[2 * c]));
            store_kmin32(y + 64 * c + 32, _mm256_and_si256(_mm256_srli_epi16(q, 4), m4),
                         _mm256_set1_ps(d * sc[2 * c + 1]), _mm256_set1_ps(dmin * mn[2 * c + 1]));
        }
    }
}

static void deq_q5_k(const void *src, float *y, int64_t n) {
    const block_q5_K *x = src;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int64_t i = 0; i < n / QK_K; i++, y += QK_K) {
        const float d = h2f(x[i].d), dmin = h2f(x[i].dmin);
        uint8_t sm[16];
        k4_scales(x[i].scales, sm);
        const uint8_t *sc = sm, *mn = sm + 8;
        __m256i qh = load32(x[i].qh);
        for (int c = 0; c < 4; c++) {
            __m256i q = load32(x[i].qs + 32 * c);
            __m256i lo = q5k_codes(_mm256_and_si256(q, m4), qh, 2 * c);
            __m256i hi = q5k_codes(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), qh, 2 * c + 1);
            store_kmin32(y + 64 * c, lo, _mm256_set1_ps(d * sc[2 * c]),
                         _mm256_set1_ps(dmin * mn[2 * c]));
            store_kmin32(y + 64 * c + 32, hi, _mm256_set1_ps(d * sc[2 * c + 1]),
                         _mm256_set1_ps(dmin * mn[2 * c + 1]));
        }
    }
}

static void deq_q6_k(const void *src, float *y, int64_t n) {
    const block_q6_K *x = src;
    const __m256i m32 = _mm256_set1_epi8(32);
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = h2f(x[i].d);
        for (int c = 0; c < 2; c++, y += 128) {
            __m256i q[4];
            q6k_codes(x[i].ql + 64 * c, x[i].qh + 32 * c, q);
            const int8_t *sc = x[i].scales + 8 * c;
            for (int g = 0; g < 4; g++) {
                __m256i s = _mm256_sub_epi8(q[g], m32);
                /* (d * sc) * q, left to right as the reference. */
                store_mul16(y + 32 * g, _mm256_castsi256_si128(s), _mm256_set1_ps(d * sc[2 * g]));
                store_mul16(y + 32 * g + 16, _mm256_extracti128_si256(s, 1),
                            _mm256_set1_ps(d * sc[2 * g + 1]));
            }
        }
    }
}

static void deq_iq4_xs(const void *src, float *y, int64_t n) {
    const block_iq4_xs *x = src;
    const __m256i tab = iq4nl_table();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = h2f(x[i].d);
        for (int ib = 0; ib < 8; ib++, y += 32) {
            __m256i q = _mm256_shuffle_epi8(tab, nibbles_split16(x[i].qs + 16 * ib));
            store_mul32(y, q, _mm256_set1_ps(d * (float)(iq4xs_scale(&x[i], ib) - 32)));
        }
    }
}

static void deq_q4_64a(const void *src, float *y, int64_t n) {
    const block_q4_64a *x = src;
    for (int64_t i = 0; i < n / QK64A; i++) {
        __m256 s = _mm256_set1_ps(ds4_bf16_to_f32(x[i].scale));
        __m256 b = _mm256_set1_ps(ds4_bf16_to_f32(x[i].bias));
        store_affine32(y + i * 64, nibbles_pairs16(x[i].qs), s, b);
        store_affine32(y + i * 64 + 32, nibbles_pairs16(x[i].qs + 16), s, b);
    }
}

static void deq_q2_64a(const void *src, float *y, int64_t n) {
    const block_q2_64a *x = src;
    for (int64_t i = 0; i < n / QK64A; i++) {
        __m256 s = _mm256_set1_ps(ds4_bf16_to_f32(x[i].scale));
        __m256 b = _mm256_set1_ps(ds4_bf16_to_f32(x[i].bias));
        store_affine32(y + i * 64, crumbs8(x[i].qs), s, b);
        store_affine32(y + i * 64 + 32, crumbs8(x[i].qs + 8), s, b);
    }
}

/* --------------------------------------------------------- from_float -- */

/* Q8_0/Q8_1 (llama.cpp ggml-cpu/arch/x86/quants.c, quantize_row_q8_0/_1):
 * amax over the block, d = amax/127, id = 127/amax (0 for an all-zero
 * block), q = round-to-nearest-even(x*id). Returns the 32 quants packed in
 * order and their int sum through *sum. */
static inline __m256i q8_block(const float *x, float *d_out, int32_t *sum) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4];
    for (int k = 0; k < 4; k++) v[k] = _mm256_loadu_ps(x + 8 * k);
    __m256 am = _mm256_andnot_ps(sign, v[0]);
    for (int k = 1; k < 4; k++) am = _mm256_max_ps(am, _mm256_andnot_ps(sign, v[k]));
    const float amax = hmax_ps(am);
    *d_out = amax / 127.f;
    const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.f / amax : 0.0f);
    __m256i q[4];
    for (int k = 0; k < 4; k++)
        q[k] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[k], id),
                                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    *sum = hsum_i32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
    /* packs work per 128-bit lane; the dword permute restores element order. */
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

static void quant_q8_0(const float *x, void *dst, int64_t n) {
    block_q8_0 *y = dst;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        float d;
        int32_t sum;
        __m256i q = q8_block(x + 32 * i, &d, &sum);
        y[i].d = f2h(d);
        _mm256_storeu_si256((__m256i *)y[i].qs, q);
    }
}

static void quant_q8_1(const float *x, void *dst, int64_t n) {
    block_q8_1 *y = dst;
    for (int64_t i = 0; i < n / QK8_1; i++) {
        float d;
        int32_t sum;
        __m256i q = q8_block(x + 32 * i, &d, &sum);
        y[i].d = f2h(d);
        y[i].s = f2h(d * (float)sum);
        _mm256_storeu_si256((__m256i *)y[i].qs, q);
    }
}

/* F16 activations: vcvtps2ph with imm 0 (nearest-even; a NaN stays a quiet
 * NaN with its top payload bits), which ds4_f32_to_fp16 reproduces. */
static void quant_f16(const float *x, void *dst, int64_t n) {
    uint16_t *y = dst;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), 0));
    for (; i < n; i++) y[i] = f2h(x[i]);
}

/* BF16 activations: ggml_compute_fp32_to_bf16's integer round-to-nearest-
 * even, (u + 0x7fff + ((u >> 16) & 1)) >> 16, and a NaN keeps its top bits
 * with the quiet bit (64) set; the same integer steps 8 lanes at a time. */
static inline __m256i bf16_bits8(const float *x) {
    __m256 v = _mm256_loadu_ps(x);
    __m256i u = _mm256_castps_si256(v);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd)), 16);
    __m256i qn = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(64));
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    return _mm256_blendv_epi8(r, qn, nan);
}

static void quant_bf16(const float *x, void *dst, int64_t n) {
    uint16_t *y = dst;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        /* packus works per 128-bit lane; the qword permute restores order */
        __m256i p = _mm256_packus_epi32(bf16_bits8(x + i), bf16_bits8(x + i + 8));
        _mm256_storeu_si256((__m256i *)(y + i), _mm256_permute4x64_epi64(p, 0xD8));
    }
    for (; i < n; i++) y[i] = ds4_f32_to_bf16(x[i]);
}

/* Q8_K (ggml-quants.c, quantize_row_q8_K_ref): the element of largest |x|
 * (the first one on ties; NaNs never win, as `ax > amax` is false for them)
 * sets iscale = -127/max; q = (int8)min(127, nearest_int(iscale*x)); d =
 * 1/iscale; bsums are the sums of each 16 stored quants. nearest_int is the
 * 1.5*2^23 magic add, done here the same way (a plain add, then the mantissa
 * bits) so that even Inf/NaN inputs give the reference's bytes; the int8
 * store truncates to the low byte, as the reference's C conversion does. */
static void quant_q8_k(const float *x, void *dst, int64_t n) {
    block_q8_K *y = dst;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        __m256 am = _mm256_setzero_ps();
        for (int k = 0; k < QK_K; k += 8) /* |x| first: a NaN lane keeps am */
            am = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + k)), am);
        const float amax = hmax_ps(am);
        if (amax == 0.0f) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        float mx = 0.0f;
        const __m256 va = _mm256_set1_ps(amax);
        for (int k = 0; k < QK_K; k += 8) {
            __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + k));
            int m = _mm256_movemask_ps(_mm256_cmp_ps(a, va, _CMP_EQ_OQ));
            if (m) {
                mx = x[k + __builtin_ctz((unsigned)m)];
                break;
            }
        }
        const float iscale = -127.f / mx;
        const __m256 vs = _mm256_set1_ps(iscale);
        const __m256 magic = _mm256_set1_ps(12582912.f);
        const __m256i mant = _mm256_set1_epi32(0x007fffff), half = _mm256_set1_epi32(0x00400000);
        const __m256i c127 = _mm256_set1_epi32(127);
        for (int k = 0; k < QK_K; k += 32) {
            __m256i q[4];
            for (int j = 0; j < 4; j++) {
                __m256 v = _mm256_add_ps(_mm256_mul_ps(vs, _mm256_loadu_ps(x + k + 8 * j)), magic);
                __m256i r = _mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(v), mant), half);
                r = _mm256_min_epi32(r, c127);
                /* the low byte, sign-extended: what (int8_t) keeps */
                q[j] = _mm256_srai_epi32(_mm256_slli_epi32(r, 24), 24);
            }
            /* The 16-element sums: q[0]+q[1] covers elements k..k+15. */
            y[i].bsums[k / 16] = (int16_t)hsum_i32(_mm256_add_epi32(q[0], q[1]));
            y[i].bsums[k / 16 + 1] = (int16_t)hsum_i32(_mm256_add_epi32(q[2], q[3]));
            __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]),
                                           _mm256_packs_epi32(q[2], q[3]));
            p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(y[i].qs + k), p);
        }
        y[i].d = 1 / iscale;
    }
}

/* ------------------------------------------------------- float dots -- */

/* Four 8-lane accumulators over 32-element steps, then one 8-wide step and a
 * scalar tail; combined as ((a0+a1)+(a2+a3)) then hsum, then the tail in
 * index order. The order depends only on n. */
#define FLOAT_DOT_BODY(LOADX, LOADY, SCALX, SCALY)                                   \
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                        \
    int64_t i = 0;                                                                     \
    for (; i + 32 <= n; i += 32) {                                                     \
        a0 = _mm256_fmadd_ps(LOADX(i), LOADY(i), a0);                                  \
        a1 = _mm256_fmadd_ps(LOADX(i + 8), LOADY(i + 8), a1);                          \
        a2 = _mm256_fmadd_ps(LOADX(i + 16), LOADY(i + 16), a2);                        \
        a3 = _mm256_fmadd_ps(LOADX(i + 24), LOADY(i + 24), a3);                        \
    }                                                                                  \
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(LOADX(i), LOADY(i), a0);           \
    float sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));  \
    for (; i < n; i++) sum += SCALX(i) * SCALY(i);                                     \
    *s = sum;

#define LD_F32X(i) _mm256_loadu_ps(x + (i))
#define LD_F32Y(i) _mm256_loadu_ps(y + (i))
#define LD_F16X(i) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + (i))))
#define LD_F16Y(i) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(y + (i))))
#define LD_BF16X(i) bf16x8_ps(x + (i))
#define LD_BF16Y(i) bf16x8_ps(y + (i))
#define SC_F32X(i) x[i]
#define SC_F32Y(i) y[i]
#define SC_F16X(i) h2f(x[i])
#define SC_F16Y(i) h2f(y[i])
#define SC_BF16X(i) ds4_bf16_to_f32(x[i])
#define SC_BF16Y(i) ds4_bf16_to_f32(y[i])

static void dot_f32_f32(int64_t n, float *s, const void *vx, const void *vy) {
    const float *x = vx, *y = vy;
    FLOAT_DOT_BODY(LD_F32X, LD_F32Y, SC_F32X, SC_F32Y)
}

static void dot_f16_f16(int64_t n, float *s, const void *vx, const void *vy) {
    const uint16_t *x = vx, *y = vy;
    FLOAT_DOT_BODY(LD_F16X, LD_F16Y, SC_F16X, SC_F16Y)
}

static void dot_f16_f32(int64_t n, float *s, const void *vx, const void *vy) {
    const uint16_t *x = vx;
    const float *y = vy;
    FLOAT_DOT_BODY(LD_F16X, LD_F32Y, SC_F16X, SC_F32Y)
}

static void dot_bf16_bf16(int64_t n, float *s, const void *vx, const void *vy) {
    const uint16_t *x = vx, *y = vy;
    FLOAT_DOT_BODY(LD_BF16X, LD_BF16Y, SC_BF16X, SC_BF16Y)
}

static void dot_bf16_f32(int64_t n, float *s, const void *vx, const void *vy) {
    const uint16_t *x = vx;
    const float *y = vy;
    FLOAT_DOT_BODY(LD_BF16X, LD_F32Y, SC_BF16X, SC_F32Y)
}

/* Quantized weights x plain floats: dequantize (bit-exactly, with the kernels
 * above) up to 256 weights into a stack buffer, FMA them with the
 * activations into four accumulators that run across the whole row. */
static inline void dot_f32_via(ds4_to_float_fn deq, int64_t bs, int64_t ts, int64_t n, float *s,
                               const void *vx, const float *y) {
    float buf[QK_K];
    const uint8_t *x = vx;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t done = 0; done < n;) {
        int64_t len = n - done < QK_K ? n - done : QK_K; /* a multiple of bs */
        deq(x, buf, len);
        for (int64_t j = 0; j < len; j += 32, y += 32) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(buf + j), _mm256_loadu_ps(y), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(buf + j + 8), _mm256_loadu_ps(y + 8), a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(buf + j + 16), _mm256_loadu_ps(y + 16), a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(buf + j + 24), _mm256_loadu_ps(y + 24), a3);
        }
        x += (len / bs) * ts;
        done += len;
    }
    *s = hsum_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}

#define DOT_F32_VIA(name, deq, block_t, bs)                                        \
    static void name(int64_t n, float *s, const void *vx, const void *vy) {       \
        dot_f32_via(deq, bs, (int64_t)sizeof(block_t), n, s, vx, (const float *)vy); \
    }

DOT_F32_VIA(dotf_q4_0, deq_q4_0, block_q4_0, QK4_0)
DOT_F32_VIA(dotf_q4_1, deq_q4_1, block_q4_1, QK4_1)
DOT_F32_VIA(dotf_q5_0, deq_q5_0, block_q5_0, QK5_0)
DOT_F32_VIA(dotf_q5_1, deq_q5_1, block_q5_1, QK5_1)
DOT_F32_VIA(dotf_q8_0, deq_q8_0, block_q8_0, QK8_0)
DOT_F32_VIA(dotf_iq4_nl, deq_iq4_nl, block_iq4_nl, QK4_NL)
DOT_F32_VIA(dotf_q4_k, deq_q4_k, block_q4_K, QK_K)
DOT_F32_VIA(dotf_q5_k, deq_q5_k, block_q5_K, QK_K)
DOT_F32_VIA(dotf_q6_k, deq_q6_k, block_q6_K, QK_K)
DOT_F32_VIA(dotf_iq4_xs, deq_iq4_xs, block_iq4_xs, QK_K)
DOT_F32_VIA(dotf_q4_64a, deq_q4_64a, block_q4_64a, QK64A)
DOT_F32_VIA(dotf_q2_64a, deq_q2_64a, block_q2_64a, QK64A)

/* ---------------------------------------------- quantized paired dots -- */
/* 32-wide blocks: per block an exact int32 dot (8 lanes), scaled by
 * d_x*d_y (rounded once, as the reference) and FMA'd into one of two
 * accumulators (even/odd blocks); the Q8_1 pairs add m_x*s_y into a scalar
 * sum in block order. */

#define Q32_DOT(name, wblock_t, ablock_t, INT_DOT, EXTRA)                                \
    static void name(int64_t n, float *s, const void *vx, const void *vy) {             \
        const wblock_t *x = vx;                                                          \
        const ablock_t *y = vy;                                                          \
        const int64_t nb = n / 32;                                                       \
        __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};                      \
        float extra = 0.0f;                                                              \
        for (int64_t i = 0; i < nb; i++) {                                               \
            __m256i p = INT_DOT(&x[i], y[i].qs);                                         \
            __m256 d = _mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d));                        \
            acc[i & 1] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[i & 1]);          \
            EXTRA;                                                                       \
        }                                                                                \
        *s = hsum_ps(_mm256_add_ps(acc[0], acc[1])) + extra;                             \
    }

static inline __m256i idot_q4_0(const block_q4_0 *b, const int8_t *a) {
    return dot_i8(_mm256_sub_epi8(nibbles_split16(b->qs), _mm256_set1_epi8(8)), load32(a));
}
/* Unsigned codes <= 31 times |a| <= 127: pairs <= 7874, no saturation. */
static inline __m256i idot_q4_1(const block_q4_1 *b, const int8_t *a) {
    return dot_u8(nibbles_split16(b->qs), load32(a));
}
static inline __m256i idot_q5_0(const block_q5_0 *b, const int8_t *a) {
    return dot_i8(_mm256_sub_epi8(q5_codes(b->qh, b->qs), _mm256_set1_epi8(16)), load32(a));
}
static inline __m256i idot_q5_1(const block_q5_1 *b, const int8_t *a) {
    return dot_u8(q5_codes(b->qh, b->qs), load32(a));
}
static inline __m256i idot_iq4_nl(const block_iq4_nl *b, const int8_t *a) {
    return dot_i8(_mm256_shuffle_epi8(iq4nl_table(), nibbles_split16(b->qs)), load32(a));
}

#define NO_EXTRA ((void)0)
#define Q8_1_EXTRA (extra += h2f(x[i].m) * h2f(y[i].s))

Q32_DOT(dot_q4_0, block_q4_0, block_q8_0, idot_q4_0, NO_EXTRA)
Q32_DOT(dot_q4_1, block_q4_1, block_q8_1, idot_q4_1, Q8_1_EXTRA)
Q32_DOT(dot_q5_0, block_q5_0, block_q8_0, idot_q5_0, NO_EXTRA)
Q32_DOT(dot_q5_1, block_q5_1, block_q8_1, idot_q5_1, Q8_1_EXTRA)
Q32_DOT(dot_iq4_nl, block_iq4_nl, block_q8_0, idot_iq4_nl, NO_EXTRA)

/* ----------------------------------------------- multi-row dots (GEMM) -- */
/* quants.h dot_rows: one weight row against up to ROWS_GROUP activation
 * rows per pass, each weight block loaded and decoded (codes, scales) once
 * for all of them. The one-row dot of each K-quant type below IS the group
 * kernel with g = 1 (Q8_0's group kernel reads the packed Q8S rows and
 * mirrors dot_q8_0 operation for operation), so every row's float
 * operations (the FMAs into the same accumulators in block order, the same
 * final hsum) are those of vec_dot on that row alone, whatever nr is:
 * bit-identical (tests/test_matmul_rows.py, tests/test_avx2_paths.py). Only the exact
 * int32 work is shared or reordered. Four rows: sixteen ymm registers hold
 * the rows' integer and float accumulators beside the decoded block. */
#define ROWS_GROUP 4

/* An empty asm that takes and gives back v in a register: GCC otherwise
 * reassociates a group's chains of int32 adds into trees whose partial sums
 * spill to the stack (a store and a load per product: the K-quant rows
 * kernels measured ~25% faster with the chains kept, 4 rows x 1024 x 1024,
 * one thread). Integer adds are exact, so no value depends on it. */
#define KEEP_IN_REGISTER(v) __asm__("" : "+x"(v))

/* Q8_0 x Q8_0 (the Q32_DOT recipe above): per block an exact int32 dot,
 * d_x*d_y rounded once, FMA'd into accumulator (block & 1); at the end
 * hsum(acc0 + acc1) + 0.0f (the Q32_DOT form's `+ extra` with nothing to
 * add: it turns a -0.0 sum into +0.0, so it stays). */
static inline __m256 q8_0_block(const block_q8_0 *x, const block_q8_0 *y, __m256 acc) {
    const __m256i w = load32(x->qs);
    const __m256i p = _mm256_madd_epi16(
        _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(load32(y->qs), w)),
        _mm256_set1_epi16(1));
    return _mm256_fmadd_ps(_mm256_set1_ps(h2f(x->d) * h2f(y->d)), _mm256_cvtepi32_ps(p), acc);
}

/* Blocks in pairs, so each block's accumulator is known at compile time
 * (indexed by a run-time i & 1, the accumulators lived on the stack and
 * every FMA went through a store and a reload: one row of 1024, 24.4 ->
 * 20.8 ns per 8 blocks, one thread, Zen 3). */
static void dot_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q8_0 *x = vx, *y = vy;
    const int64_t nb = n / QK8_0;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 1 < nb; i += 2) {
        acc0 = q8_0_block(x + i, y + i, acc0);
        acc1 = q8_0_block(x + i + 1, y + i + 1, acc1);
    }
    if (i < nb) acc0 = q8_0_block(x + i, y + i, acc0);
    *s = hsum_ps(_mm256_add_ps(acc0, acc1)) + 0.0f;
}

/* nr rows in groups of ROWS_GROUP, the rest with a constant group size so
 * the row loops unroll and the accumulators stay in registers. */
#define ROWS_DISPATCH(name, wblock_t, GROUP)                                              \
    static void name(int64_t n, int nr, float *s, const void *vx, const void *const *y) { \
        const wblock_t *x = vx;                                                           \
        int r = 0;                                                                        \
        for (; r + ROWS_GROUP <= nr; r += ROWS_GROUP) GROUP(n, ROWS_GROUP, s + r, x, y + r); \
        switch (nr - r) {                                                                 \
        case 3: GROUP(n, 3, s + r, x, y + r); break;                                      \
        case 2: GROUP(n, 2, s + r, x, y + r); break;                                      \
        case 1: GROUP(n, 1, s + r, x, y + r); break;                                      \
        default: break;                                                                   \
        }                                                                                 \
    }

/* Q8_0 x Q8S, many rows. The rows layout has Q8X's geometry (quants.h:
 * 128 bytes per pair of Q8_0 blocks, their scales widened to float and
 * repeated 8 times after the codes) with the codes kept signed, since AVX2
 * multiplies through the sign trick (vpmaddubsw of |w| by sign(y, w)), not
 * vpdpbusd's unsigned bias. With the scales pre-widened a row's block costs
 * one vmulps for d_x*d_y instead of a 16-bit insert, a widening, a scalar
 * multiply and a broadcast: 6 vector operations instead of 10. The product
 * of the two broadcast floats is the scalar product's value, so each row
 * performs, lane for lane, dot_q8_0's operations on that row: bit-identical
 * for any nr. */
static void pack_q8s(const void *src, void *dst, int64_t n) { ds4_pack_q8_pairs(src, dst, n, 0); }

/* One pass over weight row x against NR <= ROWS_GROUP activation rows:
 * v[r] = acc0 + acc1 of row r, what dot_q8_0 sums at its end. Each row has
 * its own two accumulators and takes exactly dot_q8_0's operations on that
 * row; what rows share is exact (the decoded weight block) or a load. */
static inline __attribute__((always_inline)) void q8s_pass(int64_t n, int NR, __m256 *v,
                                                           const block_q8_0 *x,
                                                           const void *const *vy) {
    const __m256i ones = _mm256_set1_epi16(1);
    const uint8_t *y[ROWS_GROUP];
    __m256 acc[ROWS_GROUP][2];
    _Pragma("GCC unroll 4") for (int r = 0; r < NR; r++) {
        y[r] = vy[r];
        acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    }
    const int64_t nb = n / QK8_0;
    /* block i (h = i & 1) of pair i/2: codes at byte 32*h of the pair, scales
     * at 64 + 32*h; the weight row's lines are requested ahead as it streams
     * (quants.h dot_tile) */
#define Q8S_BLOCK(i, h)                                                                    \
    do {                                                                                   \
        if (!(h)) __builtin_prefetch((const char *)(x + (i)) + DS4_WEIGHT_PREFETCH_BYTES, 0, 3); \
        const __m256i w = load32(x[i].qs);                                                 \
        const __m256i aw = _mm256_sign_epi8(w, w);                                         \
        const __m256 dx = _mm256_set1_ps(h2f(x[i].d));                                     \
        const size_t code = (size_t)((i) & ~(int64_t)1) * 64 + 32 * (h), scale = code + 64; \
        _Pragma("GCC unroll 4") for (int r = 0; r < NR; r++) {                             \
            const __m256i a = _mm256_sign_epi8(load32(y[r] + code), w);                    \
            const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, a), ones);        \
            const __m256 dd = _mm256_mul_ps(dx, _mm256_loadu_ps((const float *)(y[r] + scale))); \
            acc[r][h] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(p), acc[r][h]);            \
        }                                                                                  \
    } while (0)
    int64_t i = 0;
    for (; i + 1 < nb; i += 2) {
        Q8S_BLOCK(i, 0);
        Q8S_BLOCK(i + 1, 1);
    }
    if (i < nb) Q8S_BLOCK(i, 0);
#undef Q8S_BLOCK
    _Pragma("GCC unroll 4") for (int r = 0; r < NR; r++) v[r] = _mm256_add_ps(acc[r][0], acc[r][1]);
}

/* NO weight rows (x + o*xs) against NR activation rows (NO*NR <= 32), out[o*NR + r]:
 * each weight row streamed in order, in passes of up to ROWS_GROUP
 * activation rows, then the final sums four values at a time (hsum4_ps: per
 * value the additions of hsum_ps). Taking the weight rows' blocks in
 * lockstep instead ran 1.6x faster on a matrix in cache but 0.6x on one
 * streamed from memory (the hardware prefetcher loses interleaved streams). */
static inline __attribute__((always_inline)) void q8s_tile(int64_t n, int NO, int NR,
                                                           float *out, const uint8_t *xw,
                                                           size_t xs, const void *const *y) {
    __m256 v[32];
    _Pragma("GCC unroll 4") for (int o = 0; o < NO; o++) {
        const block_q8_0 *x = (const block_q8_0 *)(xw + o * xs);
        _Pragma("GCC unroll 2") for (int g = 0; g < NR; g += ROWS_GROUP)
            q8s_pass(n, NR - g < ROWS_GROUP ? NR - g : ROWS_GROUP, v + o * NR + g, x, y + g);
    }
    int j = 0;
    _Pragma("GCC unroll 8") for (; j + 4 <= NO * NR; j += 4) hsum4_ps(v + j, out + j);
    _Pragma("GCC unroll 4") for (; j < NO * NR; j++) out[j] = hsum_ps(v[j]) + 0.0f;
}

/* One weight row, g activation rows (the dot_rows group). */
static inline __attribute__((always_inline)) void q8s_rows_group(
    int64_t n, int g, float *s, const block_q8_0 *x, const void *const *vy) {
    q8s_tile(n, 1, g, s, (const uint8_t *)x, 0, vy);
}

ROWS_DISPATCH(dot_rows_q8_0, block_q8_0, q8s_rows_group)

/* quants.h dot_tile for Q8_0: tiles of TILE_NO weight rows by up to
 * TILE_NR activation rows. Per weight row the work is short when few
 * activation rows share it (decode, short verifies: 8 blocks at n = 256),
 * and one call per weight row paid the call, the final sums and their
 * latency each time. On Zen 3, one thread, fastest of 60, against dot_rows
 * one weight row per call: 2048 x 256 in cache 1.40x for one activation
 * row; 100000 x 1024 and 20000 x 3584 from memory 1.01-1.05x (figures of
 * the 4 x 1 tile; bench/bench_rows.py measures the others); bit-identical
 * (tests/test_matmul_rows.py). */
#define TILE_NO 4
#define TILE_NR 8
#define TILE_PUT(NO, NR)                                                                   \
    do {                                                                                   \
        float t_[TILE_NO * TILE_NR];                                                       \
        q8s_tile(n, NO, NR, t_, xb + (size_t)o * xs, xs, y + r0);                          \
        for (int oo = 0; oo < (NO); oo++)                                                  \
            for (int r = 0; r < (NR); r++) s[(r0 + r) * ss + o + oo] = t_[oo * (NR) + r];  \
    } while (0)
#define TILE_ROWS(NR)                                                                      \
    do {                                                                                   \
        int o = 0;                                                                         \
        for (; o + TILE_NO <= no; o += TILE_NO) TILE_PUT(TILE_NO, NR);                     \
        for (; o < no; o++) TILE_PUT(1, NR);                                               \
    } while (0)
static void tile_q8_0(int64_t n, int no, int nr, float *s, int64_t ss, const void *x,
                      size_t xs, const void *const *y) {
    const uint8_t *xb = x;
    for (int r0 = 0; r0 < nr; r0 += TILE_NR) {
        switch (nr - r0 < TILE_NR ? nr - r0 : TILE_NR) {
        case 1: TILE_ROWS(1); break;
        case 2: TILE_ROWS(2); break;
        case 3: TILE_ROWS(3); break;
        case 4: TILE_ROWS(4); break;
        case 5: TILE_ROWS(5); break;
        case 6: TILE_ROWS(6); break;
        case 7: TILE_ROWS(7); break;
        default: TILE_ROWS(8); break;
        }
    }
}
#undef TILE_ROWS
#undef TILE_PUT

/* K-quants x Q8_K: per block, 8 lanes of exact int32 partial sums (scales
 * applied after widening); each lane converts to float (exact below 2^24,
 * which the bounds in each kernel keep for Q4_K/Q5_K) and is FMA'd with
 * d_y*d_x into one vector accumulator in block order; the mins (or Q6_K's
 * -32 offset) come through the activation's 16-element sums the same way.
 * One fixed-order hsum at the end. */

/* Q4_K scales and mins (as k4_scales) decoded in a register: bytes 0..7
 * the eight 6-bit scales, 8..15 the mins. The 16-byte load covers scales[12]
 * and the first 4 bytes of qs (inside the block, never used). Kept out of
 * memory: four word stores then an 8-byte reload defeat store forwarding. */
static inline __m128i k4_scales_reg(const uint8_t *q) {
    const __m128i v = _mm_loadu_si128((const __m128i *)q);
    const __m128i a = _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0)); /* w0 w0 w1 w1 */
    const __m128i w2 = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 2, 2, 2));
    const __m128i lo = _mm_and_si128(a, _mm_set1_epi8(0x3f)); /* r0, r2 */
    /* ((w >> 6) & 3) << 4 per byte == (w >> 2) & 0x30 */
    const __m128i hi = _mm_and_si128(_mm_srli_epi32(a, 2), _mm_set1_epi8(0x30));
    const __m128i m = _mm_and_si128(_mm_srlv_epi32(w2, _mm_set_epi32(4, 0, 0, 0)),
                                    _mm_set1_epi8(0x0f));
    return _mm_blend_epi32(lo, _mm_or_si128(m, hi), 0xA); /* r1, r3 */
}

/* vpshufb index giving every int16 lane int16 element j of its 128-bit lane. */
static inline __m256i word_idx(int j) { return _mm256_set1_epi16((short)(((2 * j + 1) << 8) | (2 * j))); }

/* Q4_K x Q8_K for g <= ROWS_GROUP rows. Per block the codes of each 64-code
 * chunk and the scale of each sub-block (a vpshufb of the eight widened
 * scales) are built once; per row the exact int32 sums (unsigned codes
 * <= 15: int16 pairs <= 3810; per lane <= 8 sub-blocks * 63 * 2*3810 <
 * 2^22) and the mins' terms min_j * (bsums[2j] + bsums[2j+1]), then
 * acc = fma(d_y*d, isum, acc) and acc = fnma(d_y*dmin, mins, acc) in block
 * order; one fixed-order hsum at the end. */
static inline __attribute__((always_inline)) void q4k_rows_group(
    int64_t n, int g, float *s, const block_q4_K *x, const void *const *vy) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc[ROWS_GROUP];
    const block_q8_K *y[ROWS_GROUP];
    _Pragma("GCC unroll 4") for (int r = 0; r < g; r++) {
        acc[r] = _mm256_setzero_ps();
        y[r] = vy[r];
    }
    for (int64_t i = 0; i < n / QK_K; i++) {
        const __m128i sm = k4_scales_reg(x[i].scales);
        const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
        const __m128i m16 = _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8));
        const __m256i mm = _mm256_set_m128i(_mm_unpackhi_epi16(m16, m16), _mm_unpacklo_epi16(m16, m16));
        __m256i isum[ROWS_GROUP];
        _Pragma("GCC unroll 4") for (int r = 0; r < g; r++) isum[r] = _mm256_setzero_si256();
        _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) {
            const __m256i q = load32(x[i].qs + 32 * c);
            const __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            const __m256i slo = _mm256_shuffle_epi8(sc, word_idx(2 * c));
            const __m256i shi = _mm256_shuffle_epi8(sc, word_idx(2 * c + 1));
            _Pragma("GCC unroll 4") for (int r = 0; r < g; r++) {
                const int8_t *a = y[r][i].qs + 64 * c;
                isum[r] = _mm256_add_epi32(isum[r], dot_u8_scaled(lo, load32(a), slo));
                isum[r] = _mm256_add_epi32(isum[r], dot_u8_scaled(hi, load32(a + 32), shi));
                KEEP_IN_REGISTER(isum[r]);
            }
        }
        const float xd = h2f(x[i].d), xm = h2f(x[i].dmin);
        _Pragma("GCC unroll 4") for (int r = 0; r < g; r++) {
            const float dy = y[r][i].d;
            const __m256i mt = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y[r][i].bsums), mm);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dy * xd), _mm256_cvtepi32_ps(isum[r]), acc[r]);
            acc[r] = _mm256_fnmadd_ps(_mm256_set1_ps(dy * xm), _mm256_cvtepi32_ps(mt), acc[r]);
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < g; r++) s[r] = hsum_ps(acc[r]);
}

static void dot_q4_k(int64_t n, float *s, const void *vx, const void *vy) {
    q4k_rows_group(n, 1, s, vx, &vy);
}

ROWS_DISPATCH(dot_rows_q4_k, block_q4_K, q4k_rows_group)

static void dot_q5_k(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q5_K *x = vx;
    const block_q8_K *y = vy;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t sm[16];
        k4_scales(x[i].scales, sm);
        __m256i qh = load32(x[i].qh);
        /* codes <= 31: int16 pairs <= 7874; per lane <= 8 * 63 * 2*7874 < 2^23 */
        __m256i isum = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            __m256i q = load32(x[i].qs + 32 * c);
            __m256i lo = q5k_codes(_mm256_and_si256(q, m4), qh, 2 * c);
            __m256i hi = q5k_codes(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), qh, 2 * c + 1);
            isum = _mm256_add_epi32(isum, dot_u8_scaled(lo, load32(y[i].qs + 64 * c),
                                                        _mm256_set1_epi16(sm[2 * c])));
            isum = _mm256_add_epi32(isum, dot_u8_scaled(hi, load32(y[i].qs + 64 * c + 32),
                                                        _mm256_set1_epi16(sm[2 * c + 1])));
        }
        const float dy = y[i].d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dy * h2f(x[i].d)), _mm256_cvtepi32_ps(isum), acc);
        acc = _mm256_fnmadd_ps(_mm256_set1_ps(dy * h2f(x[i].dmin)),
                               _mm256_cvtepi32_ps(k4_min_terms(sm, y[i].bsums)), acc);
    }
    *s = hsum_ps(acc);
}

/* Q6_K x Q8_K for g <= ROWS_GROUP rows. Codes are used unsigned (0..63;
 * int16 pairs <= 16002) and the -32 offset comes back through the
 * activation's 16-element sums: sum_g sc_g * (sum q*a - 32 * bsum_g). Per
 * lane |.| <= 8 * 128 * 2*16002 + 32 * 128 * 2*16*127 < 2^26 (int32-exact;
 * the float conversion can round only in that extreme, the same in every
 * row and in the one-row dot, which is this function). Per 128-code chunk
 * the four code vectors and their scale pairs (scale 2k in the low 128-bit
 * lane, 2k+1 in the high) are built once for all rows. */
static inline __attribute__((always_inline)) void q6k_rows_group(
    int64_t n, int g, float *s, const block_q6_K *x, const void *const *vy) {
    __m256 acc[ROWS_GROUP];
    const block_q8_K *y[ROWS_GROUP];
    _Pragma("GCC unroll 4") for (int r = 0; r < g; r++) {
        acc[r] = _mm256_setzero_ps();
        y[r] = vy[r];
    }
    for (int64_t i = 0; i < n / QK_K; i++) {
        __m256i isum[ROWS_GROUP];
        _Pragma("GCC unroll 4") for (int r = 0; r < g; r++) isum[r] = _mm256_setzero_si256();
        _Pragma("GCC unroll 2") for (int c = 0; c < 2; c++) {
            __m256i q[4];
            q6k_codes(x[i].ql + 64 * c, x[i].qh + 32 * c, q);
            /* the chunk's eight scales as int16 in both 128-bit lanes */
            const __m256i sc = _mm256_broadcastsi128_si256(
                _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(x[i].scales + 8 * c))));
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
                const __m256i sel = _mm256_set_m128i(_mm256_castsi256_si128(word_idx(2 * k + 1)),
                                                     _mm256_castsi256_si128(word_idx(2 * k)));
                const __m256i s16 = _mm256_shuffle_epi8(sc, sel);
                _Pragma("GCC unroll 4") for (int r = 0; r < g; r++) {
                    isum[r] = _mm256_add_epi32(
                        isum[r], dot_u8_scaled(q[k], load32(y[r][i].qs + 128 * c + 32 * k), s16));
                    KEEP_IN_REGISTER(isum[r]);
                }
            }
        }
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[i].scales));
        const float xd = h2f(x[i].d);
        _Pragma("GCC unroll 4") for (int r = 0; r < g; r++) {
            const __m256i corr = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)y[r][i].bsums));
            const __m256i t = _mm256_sub_epi32(isum[r], _mm256_slli_epi32(corr, 5));
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(y[r][i].d * xd), _mm256_cvtepi32_ps(t), acc[r]);
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < g; r++) s[r] = hsum_ps(acc[r]);
}

static void dot_q6_k(int64_t n, float *s, const void *vx, const void *vy) {
    q6k_rows_group(n, 1, s, vx, &vy);
}

ROWS_DISPATCH(dot_rows_q6_k, block_q6_K, q6k_rows_group)

static void dot_iq4_xs(int64_t n, float *s, const void *vx, const void *vy) {
    const block_iq4_xs *x = vx;
    const block_q8_K *y = vy;
    const __m256i tab = iq4nl_table();
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        /* |code| <= 127: int16 pairs <= 32258, times |ls-32| <= 32 after the
         * madd widening; |total| <= 8 * 32 * 32*127*127 < 2^31. */
        __m256i acc = _mm256_setzero_si256();
        for (int ib = 0; ib < 8; ib++) {
            __m256i k = _mm256_shuffle_epi8(tab, nibbles_split16(x[i].qs + 16 * ib));
            __m256i a = load32(y[i].qs + 32 * ib);
            __m256i ls = _mm256_set1_epi16((int16_t)(iq4xs_scale(&x[i], ib) - 32));
            acc = _mm256_add_epi32(acc, dot_u8_scaled(_mm256_sign_epi8(k, k), _mm256_sign_epi8(a, k), ls));
        }
        sum += y[i].d * h2f(x[i].d) * (float)hsum_i32(acc);
    }
    *s = sum;
}

/* 64-wide affine x Q8_0: weight block b covers activation blocks 2b and 2b+1.
 * Per 32-half h: scale*d_a * sum(q*a) + bias*d_a * sum(a); the integer sums
 * are exact (codes <= 15, pairs <= 3810), the two products accumulate in
 * separate vectors, one FMA each per half. */
static inline void affine64_half(__m256i codes, const block_q8_0 *a, float scale, float bias,
                                 __m256 *acc_q, __m256 *acc_b) {
    __m256i av = load32(a->qs);
    const float da = h2f(a->d);
    __m256i sq = dot_u8(codes, av);
    __m256i sa = dot_u8(_mm256_set1_epi8(1), av);
    *acc_q = _mm256_fmadd_ps(_mm256_set1_ps(scale * da), _mm256_cvtepi32_ps(sq), *acc_q);
    *acc_b = _mm256_fmadd_ps(_mm256_set1_ps(bias * da), _mm256_cvtepi32_ps(sa), *acc_b);
}

static void dot_q4_64a(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q4_64a *x = vx;
    const block_q8_0 *y = vy;
    __m256 aq = _mm256_setzero_ps(), ab = aq;
    for (int64_t i = 0; i < n / QK64A; i++) {
        const float sc = ds4_bf16_to_f32(x[i].scale), bi = ds4_bf16_to_f32(x[i].bias);
        affine64_half(nibbles_pairs16(x[i].qs), &y[2 * i], sc, bi, &aq, &ab);
        affine64_half(nibbles_pairs16(x[i].qs + 16), &y[2 * i + 1], sc, bi, &aq, &ab);
    }
    *s = hsum_ps(aq) + hsum_ps(ab);
}

static void dot_q2_64a(int64_t n, float *s, const void *vx, const void *vy) {
    const block_q2_64a *x = vx;
    const block_q8_0 *y = vy;
    __m256 aq = _mm256_setzero_ps(), ab = aq;
    for (int64_t i = 0; i < n / QK64A; i++) {
        const float sc = ds4_bf16_to_f32(x[i].scale), bi = ds4_bf16_to_f32(x[i].bias);
        affine64_half(crumbs8(x[i].qs), &y[2 * i], sc, bi, &aq, &ab);
        affine64_half(crumbs8(x[i].qs + 8), &y[2 * i + 1], sc, bi, &aq, &ab);
    }
    *s = hsum_ps(aq) + hsum_ps(ab);
}

/* ---------------------------------------------------------------- init -- */

int ds4_kernels_init_avx2(ds4_kernel_set *k) {
#define SET(t, deq, dot, dotf) \
    (k->to_float[t] = deq, k->vec_dot[t] = dot, k->vec_dot_f32[t] = dotf)
    SET(DS4_TYPE_F32, deq_f32, dot_f32_f32, dot_f32_f32);
    SET(DS4_TYPE_F16, deq_f16, dot_f16_f16, dot_f16_f32);
    SET(DS4_TYPE_BF16, deq_bf16, dot_bf16_bf16, dot_bf16_f32);
    SET(DS4_TYPE_Q4_0, deq_q4_0, dot_q4_0, dotf_q4_0);
    SET(DS4_TYPE_Q4_1, deq_q4_1, dot_q4_1, dotf_q4_1);
    SET(DS4_TYPE_Q5_0, deq_q5_0, dot_q5_0, dotf_q5_0);
    SET(DS4_TYPE_Q5_1, deq_q5_1, dot_q5_1, dotf_q5_1);
    SET(DS4_TYPE_Q8_0, deq_q8_0, dot_q8_0, dotf_q8_0);
    SET(DS4_TYPE_IQ4_NL, deq_iq4_nl, dot_iq4_nl, dotf_iq4_nl);
    SET(DS4_TYPE_Q4_K, deq_q4_k, dot_q4_k, dotf_q4_k);
    SET(DS4_TYPE_Q5_K, deq_q5_k, dot_q5_k, dotf_q5_k);
    SET(DS4_TYPE_Q6_K, deq_q6_k, dot_q6_k, dotf_q6_k);
    SET(DS4_TYPE_IQ4_XS, deq_iq4_xs, dot_iq4_xs, dotf_iq4_xs);
    SET(DS4_TYPE_Q4_64A, deq_q4_64a, dot_q4_64a, dotf_q4_64a);
    SET(DS4_TYPE_Q2_64A, deq_q2_64a, dot_q2_64a, dotf_q2_64a);
#undef SET
    k->from_float[DS4_TYPE_Q8_0] = quant_q8_0;
    k->from_float[DS4_TYPE_Q8_1] = quant_q8_1;
    k->from_float[DS4_TYPE_Q8_K] = quant_q8_k;
    k->from_float[DS4_TYPE_F16] = quant_f16;
    k->from_float[DS4_TYPE_BF16] = quant_bf16;
    /* multi-row kernels (Q8_0's over packed Q8S rows, the others over plain paired rows) */
    k->dot_rows[DS4_TYPE_Q8_0] = dot_rows_q8_0;
    k->pack_rows[DS4_TYPE_Q8_0] = pack_q8s;
    k->dot_tile[DS4_TYPE_Q8_0] = tile_q8_0;
    k->dot_rows_name[DS4_TYPE_Q8_0] = "avx2 q8_0 x q8s rows, tiles of 4 weight rows";
    k->dot_rows[DS4_TYPE_Q4_K] = dot_rows_q4_k;
    k->dot_rows_name[DS4_TYPE_Q4_K] = "avx2 q4_K x q8_K rows";
    k->dot_rows[DS4_TYPE_Q6_K] = dot_rows_q6_k;
    k->dot_rows_name[DS4_TYPE_Q6_K] = "avx2 q6_K x q8_K rows";
    /* forward-pass kernels (avx2_fwd.c) */
    k->gdn_rows = ds4_avx2_gdn_rows;
    if (ds4_avx2_expf_matches()) k->silu_mul = ds4_avx2_silu_mul;
    k->f16_acc_row = ds4_avx2_f16_acc_row;
    return 1;
}

#else /* not compiled for AVX2+FMA+F16C */

int ds4_kernels_init_avx2(ds4_kernel_set *k) {
    (void)k;
    return 0;
}

#endif
