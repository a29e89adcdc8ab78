/*
 * attn_avx2.c — the staged F16 attention recipe's two hot loops
 * (attn_simd.h) with AVX2 + F16C, for sessions running the AVX2 kernel set.
 *
 * Scores (ds4_attn_f16_scores_avx2): each K row is widened 8 values at a
 * time and serves up to two query heads per pass (two heads' four
 * accumulators plus the K vector fill the sixteen ymm registers' useful
 * share); each head's dot keeps exactly the AVX2 kernel set's dot_f32_f32
 * order (quants/avx2.c FLOAT_DOT_BODY: four accumulators over 32-value
 * steps, 8-value steps into the first, ((a0 + a1) + (a2 + a3)), the
 * fixed-order hsum, then a scalar tail in index order), so the scores are
 * those of the position-by-position loop over that set's dot.
 * tests/test_avx2_paths.py compares the whole forward bit for bit with
 * DS4_ATTN_REFERENCE=1: a change of FLOAT_DOT_BODY must be mirrored here.
 *
 * V step (ds4_attn_f16_acc_avx2): the accumulators of up to 12 (head,
 * 8-lane chunk) pairs stay in registers over all P positions of the block,
 * each V chunk widened once for the heads of the pass; lanes past the last
 * whole chunk (dh % 8) take the same steps one value at a time. Every step
 * is one IEEE operation or an exact conversion (vcvtps2ph nearest-even,
 * vcvtph2ps), so the bits are those of any other implementation. Per value
 * the positions are taken in order; values are independent of each other,
 * so how (head, lane) pairs are grouped into passes changes nothing.
 */
#include <math.h>

#include "attn_simd.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#define RNE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

static inline __m256 f16_round(__m256 x) { return _mm256_cvtph_ps(_mm256_cvtps_ph(x, RNE)); }
static inline float f16_round1(float x) { return _cvtsh_ss(_cvtss_sh(x, RNE)); }

int ds4_attn_f16_avx2_ok(void) { return 1; }

/* ------------------------------------------------------------- scores -- */

/* quants/avx2.c hsum_ps, the same adds in the same order. */
static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#define KV8(i) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kr + (i))))

/* GT (1 or 2) heads' dots with one K row, FLOAT_DOT_BODY's order per head. */
static inline __attribute__((always_inline)) void dots(const uint16_t *kr, const float *q,
                                                       int64_t qs, int GT, int64_t n,
                                                       float scale, float *s, int64_t ss) {
    __m256 a[2][4];
    _Pragma("GCC unroll 2") for (int g = 0; g < 2; g++)
        for (int j = 0; j < 4; j++) a[g][j] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
            const __m256 kj = KV8(i + 8 * j);
            _Pragma("GCC unroll 2") for (int g = 0; g < GT; g++)
                a[g][j] = _mm256_fmadd_ps(kj, _mm256_loadu_ps(q + g * qs + i + 8 * j), a[g][j]);
        }
    }
    for (; i + 8 <= n; i += 8) {
        const __m256 k0 = KV8(i);
        _Pragma("GCC unroll 2") for (int g = 0; g < GT; g++)
            a[g][0] = _mm256_fmadd_ps(k0, _mm256_loadu_ps(q + g * qs + i), a[g][0]);
    }
    _Pragma("GCC unroll 2") for (int g = 0; g < GT; g++) {
        float d = hsum_ps(_mm256_add_ps(_mm256_add_ps(a[g][0], a[g][1]),
                                        _mm256_add_ps(a[g][2], a[g][3])));
        for (int64_t t = i; t < n; t++) d += _cvtsh_ss(kr[t]) * q[g * qs + t];
        s[g * ss] = d * scale;
    }
}

void ds4_attn_f16_scores_avx2(const uint16_t *k, int64_t P, const float *q, int64_t G,
                              int64_t dh, float scale, float *s, int64_t ss,
                              const uint16_t *v) {
    (void)v; /* no prefetch hints here: the hardware prefetcher keeps up at AVX2 speed */
    int64_t g0 = 0;
    for (; g0 + 2 <= G; g0 += 2)
        for (int64_t i = 0; i < P; i++)
            dots(k + i * dh, q + g0 * dh, dh, 2, dh, scale, s + g0 * ss + i, ss);
    for (; g0 < G; g0++)
        for (int64_t i = 0; i < P; i++)
            dots(k + i * dh, q + g0 * dh, dh, 1, dh, scale, s + g0 * ss + i, ss);
}

/* ------------------------------------------------------------- V step -- */

/* Heads [0, GT) (pointers already offset) x chunks [c0, c0+NC) of 8 lanes
 * (NC <= NS), GT * NS <= 12 accumulators in registers over the P positions;
 * the weights are broadcast from memory where used, which keeps registers
 * for the accumulators. */
#define ACC_PASS(GT, NS)                                                                       \
    static void acc_pass_##GT(float *a, int64_t as, const uint16_t *v, int64_t P,               \
                              const float *w, const float *r, int64_t rs, int64_t dh,           \
                              int64_t c0, int NC) {                                             \
        __m256 acc[GT][NS];                                                                     \
        _Pragma("GCC unroll 12") for (int c = 0; c < NS; c++)                                   \
            _Pragma("GCC unroll 4") for (int g = 0; g < GT; g++)                                \
                acc[g][c] = c < NC ? _mm256_loadu_ps(a + g * as + (c0 + c) * 8)                 \
                                   : _mm256_setzero_ps();                                       \
        for (int64_t i = 0; i < P; i++) {                                                       \
            const uint16_t *vi = v + i * dh + c0 * 8;                                           \
            _Pragma("GCC unroll 4") for (int g = 0; g < GT; g++) {                              \
                const float x = r[g * rs + i];                                                  \
                if (x != 1.0f) {                                                                \
                    const __m256 xs = _mm256_set1_ps(x);                                        \
                    _Pragma("GCC unroll 12") for (int c = 0; c < NS; c++)                       \
                        acc[g][c] = f16_round(_mm256_mul_ps(acc[g][c], xs));                    \
                }                                                                               \
            }                                                                                   \
            _Pragma("GCC unroll 12") for (int c = 0; c < NS; c++) {                             \
                if (c >= NC) break;                                                             \
                const __m256 vv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vi + c * 8))); \
                _Pragma("GCC unroll 4") for (int g = 0; g < GT; g++)                            \
                    acc[g][c] = f16_round(                                                      \
                        _mm256_fmadd_ps(vv, _mm256_broadcast_ss(w + g * rs + i), acc[g][c]));   \
            }                                                                                   \
        }                                                                                       \
        _Pragma("GCC unroll 12") for (int c = 0; c < NS; c++) {                                 \
            if (c >= NC) break;                                                                 \
            _Pragma("GCC unroll 4") for (int g = 0; g < GT; g++)                                \
                _mm256_storeu_ps(a + g * as + (c0 + c) * 8, acc[g][c]);                         \
        }                                                                                       \
    }

ACC_PASS(4, 3)
ACC_PASS(2, 6)
ACC_PASS(1, 12)

/* Lanes [d0, dh) of head g (dh - d0 < 8), one value at a time. */
static void acc_tail(float *ag, const uint16_t *v, int64_t P, const float *w, const float *r,
                     int64_t dh, int64_t d0) {
    for (int64_t i = 0; i < P; i++) {
        const float x = r[i], ws = w[i];
        for (int64_t d = d0; d < dh; d++) {
            float t = ag[d];
            if (x != 1.0f) t = f16_round1(t * x);
            /* one rounding, as the 8-lane passes' _mm256_fmadd_ps and the
             * contract (attn_simd.h: fmaf). A multiply then an add here gave
             * the position-by-position recipe's bits except where the two
             * roundings differ: test_avx2_paths.py's head-36 model failed
             * for about one random model in seven */
            ag[d] = f16_round1(fmaf(_cvtsh_ss(v[i * dh + d]), ws, t));
        }
    }
}

void ds4_attn_f16_acc_avx2(float *a, int64_t as, int64_t G, const uint16_t *v, int64_t P,
                           const float *w, const float *r, int64_t rs, int64_t dh,
                           const uint16_t *nk, const uint16_t *nv, int64_t nP) {
    (void)nk, (void)nv, (void)nP; /* memory hints: none here */
    const int64_t nc = dh / 8; /* whole 8-lane chunks */
    int64_t g = 0;
    for (; g + 4 <= G; g += 4)
        for (int64_t c0 = 0; c0 < nc; c0 += 3)
            acc_pass_4(a + g * as, as, v, P, w + g * rs, r + g * rs, rs, dh, c0,
                       (int)(nc - c0 < 3 ? nc - c0 : 3));
    for (; g + 2 <= G; g += 2)
        for (int64_t c0 = 0; c0 < nc; c0 += 6)
            acc_pass_2(a + g * as, as, v, P, w + g * rs, r + g * rs, rs, dh, c0,
                       (int)(nc - c0 < 6 ? nc - c0 : 6));
    for (; g < G; g++)
        for (int64_t c0 = 0; c0 < nc; c0 += 12)
            acc_pass_1(a + g * as, as, v, P, w + g * rs, r + g * rs, rs, dh, c0,
                       (int)(nc - c0 < 12 ? nc - c0 : 12));
    if (nc * 8 < dh)
        for (g = 0; g < G; g++) acc_tail(a + g * as, v, P, w + g * rs, r + g * rs, dh, nc * 8);
}

#else /* built without AVX2 flags: stubs attention.c never calls */

int ds4_attn_f16_avx2_ok(void) { return 0; }

void ds4_attn_f16_scores_avx2(const uint16_t *k, int64_t P, const float *q, int64_t G,
                              int64_t dh, float scale, float *s, int64_t ss,
                              const uint16_t *v) {
    (void)k, (void)P, (void)q, (void)G, (void)dh, (void)scale, (void)s, (void)ss, (void)v;
}

void ds4_attn_f16_acc_avx2(float *a, int64_t as, int64_t G, const uint16_t *v, int64_t P,
                           const float *w, const float *r, int64_t rs, int64_t dh,
                           const uint16_t *nk, const uint16_t *nv, int64_t nP) {
    (void)a, (void)as, (void)G, (void)v, (void)P, (void)w, (void)r, (void)rs, (void)dh;
    (void)nk, (void)nv, (void)nP;
}

#endif
