/*
 * attn_avx512.c — the staged F16 attention recipe's two hot loops
 * (attn_simd.h) with AVX-512.
 *
 * Scores (ds4_attn_f16_scores_avx512): each K row is widened once, 64
 * values at a time in registers, and serves every query head of the pass;
 * each head's dot keeps exactly the AVX-512 kernel set's dot_f32_f32 /
 * dot_f16_f32 order (quants/avx512.c FLOAT_DOT512: four accumulators over
 * 64-value steps, a 16-value step into the first, a masked tail into the
 * second, then ((a0 + a1) + (a2 + a3)) folded 512 -> 256 and summed
 * pairwise as its hsum256). attention.c uses this only while the session
 * runs the AVX-512 set, and tests/test_attention_staged.py compares the
 * result bit for bit with the position-by-position loop over that set's
 * own dot: a change of FLOAT_DOT512's order must be mirrored here.
 *
 * V step (ds4_attn_f16_acc_avx512): the accumulators of up to 16 (head,
 * 16-lane chunk) pairs stay in registers over all P positions of the block,
 * each V chunk widened once for the heads of the pass; the round trip
 * through F16 (vcvtps2ph nearest-even, vcvtph2ps) after each multiply and
 * add is what the recipe prescribes. Every step is one IEEE operation or an
 * exact conversion, so the bits are those of any other implementation.
 */
#include "attn_simd.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>

#define RNE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

static inline __m512 f16_round(__m512 x) { return _mm512_cvtph_ps(_mm512_cvtps_ph(x, RNE)); }

static inline __mmask16 lanes(int64_t n) { /* the first min(n, 16) lanes */
    return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u);
}

int ds4_attn_f16_acc_avx512_ok(void) { return 1; }

/* ------------------------------------------------------------- scores -- */

/* quants/avx512.c fold512 + hsum256, the same adds in the same order. */
static inline float hsum512(__m512 v) {
    const __m256 f = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(f), _mm256_extractf128_ps(f, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#define KV(i) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kr + (i))))

/* GT (1..4) heads' dots with one K row, FLOAT_DOT512's order per head. */
static inline void dots(const uint16_t *kr, const float *q, int64_t qs, int GT, int64_t n,
                        float scale, float *s, int64_t ss) {
    __m512 a[4][4];
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++)
        for (int j = 0; j < 4; j++) a[g][j] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        const __m512 k0 = KV(i), k1 = KV(i + 16), k2 = KV(i + 32), k3 = KV(i + 48);
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            if (g >= GT) break;
            const float *qg = q + g * qs + i;
            a[g][0] = _mm512_fmadd_ps(k0, _mm512_loadu_ps(qg), a[g][0]);
            a[g][1] = _mm512_fmadd_ps(k1, _mm512_loadu_ps(qg + 16), a[g][1]);
            a[g][2] = _mm512_fmadd_ps(k2, _mm512_loadu_ps(qg + 32), a[g][2]);
            a[g][3] = _mm512_fmadd_ps(k3, _mm512_loadu_ps(qg + 48), a[g][3]);
        }
    }
    for (; i + 16 <= n; i += 16) {
        const __m512 k0 = KV(i);
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            if (g >= GT) break;
            a[g][0] = _mm512_fmadd_ps(k0, _mm512_loadu_ps(q + g * qs + i), a[g][0]);
        }
    }
    if (i < n) {
        const __mmask16 m = lanes(n - i);
        const __m512 k0 = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, kr + i));
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            if (g >= GT) break;
            a[g][1] = _mm512_fmadd_ps(k0, _mm512_maskz_loadu_ps(m, q + g * qs + i), a[g][1]);
        }
    }
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++) {
        if (g >= GT) break;
        const float d = hsum512(_mm512_add_ps(_mm512_add_ps(a[g][0], a[g][1]),
                                              _mm512_add_ps(a[g][2], a[g][3])));
        s[g * ss] = d * scale;
    }
}

/* Rows ahead of the one being dotted whose K lines are requested early:
 * a block's K rows are contiguous, but the hardware prefetchers stop at each
 * 4 KiB page (8 rows of head 256). */
#define K_AHEAD 8

static inline void prefetch_row(const uint16_t *row, int64_t dh, int hint) {
    const char *p = (const char *)row;
    for (int64_t o = 0; o < dh * 2; o += 64) {
        if (hint == 0) _mm_prefetch(p + o, _MM_HINT_T0);
        else _mm_prefetch(p + o, _MM_HINT_T1);
    }
}

void ds4_attn_f16_scores_avx512(const uint16_t *k, int64_t P, const float *q, int64_t G,
                                int64_t dh, float scale, float *s, int64_t ss,
                                const uint16_t *v) {
    for (int64_t g0 = 0; g0 < G; g0 += 4) {
        const int GT = G - g0 < 4 ? (int)(G - g0) : 4;
        for (int64_t i = 0; i < P; i++) {
            if (g0 == 0) {
                /* The V step reads the block's V rows in strips of 16-lane
                 * chunks: bring them to L2 while the scores compute. */
                if (i + K_AHEAD < P) prefetch_row(k + (i + K_AHEAD) * dh, dh, 0);
                if (v) prefetch_row(v + i * dh, dh, 1);
            }
            dots(k + i * dh, q + g0 * dh, dh, GT, dh, scale, s + g0 * ss + i, ss);
        }
    }
}

/* ------------------------------------------------------------- V step -- */

/* The next block's K and V lines, requested into L2 a few per position
 * while this block's V step computes, so the next scores pass finds its K
 * rows (and its V step its V rows) in cache: the V step is compute-bound,
 * the scores pass would otherwise wait on memory. */
typedef struct {
    const char *p[2], *end[2];
    int per; /* lines per position step */
} prefetcher;

static inline void prefetch_some(prefetcher *pf) {
    for (int j = 0; j < pf->per; j++) {
        const int w = pf->p[0] < pf->end[0] ? 0 : 1;
        if (pf->p[w] >= pf->end[w]) return;
        _mm_prefetch(pf->p[w], _MM_HINT_T1);
        pf->p[w] += 64;
    }
}

/* Heads [g0, g0+GT) x chunks [c0, c0+NC) of 16 lanes (NC <= NS), with
 * GT * NS <= 16 accumulators in registers over the P positions. */
#define ACC_PASS(GT, NS)                                                                   \
    static void acc_pass_##GT(float *a, int64_t as, const uint16_t *v, int64_t P,           \
                              const float *w, const float *r, int64_t rs, int64_t dh,       \
                              int64_t c0, int NC, prefetcher *pf) {                         \
        __m512 acc[GT][NS];                                                                 \
        __mmask16 mk[NS];                                                                   \
        _Pragma("GCC unroll 8") for (int c = 0; c < NS; c++) {                              \
            mk[c] = c < NC ? lanes(dh - (c0 + c) * 16) : 0;                                 \
            _Pragma("GCC unroll 4") for (int g = 0; g < GT; g++)                            \
                acc[g][c] = _mm512_maskz_loadu_ps(mk[c], a + g * as + (c0 + c) * 16);       \
        }                                                                                   \
        for (int64_t i = 0; i < P; i++) {                                                   \
            const uint16_t *vi = v + i * dh + c0 * 16;                                      \
            prefetch_some(pf);                                                              \
            _Pragma("GCC unroll 4") for (int g = 0; g < GT; g++) {                          \
                const float x = r[g * rs + i];                                              \
                if (x != 1.0f) {                                                            \
                    const __m512 xs = _mm512_set1_ps(x);                                    \
                    _Pragma("GCC unroll 8") for (int c = 0; c < NS; c++)                    \
                        acc[g][c] = f16_round(_mm512_mul_ps(acc[g][c], xs));                \
                }                                                                           \
            }                                                                               \
            __m512 ws[GT];                                                                  \
            _Pragma("GCC unroll 4") for (int g = 0; g < GT; g++)                            \
                ws[g] = _mm512_set1_ps(w[g * rs + i]);                                      \
            _Pragma("GCC unroll 8") for (int c = 0; c < NS; c++) {                          \
                if (c >= NC) break;                                                         \
                const __m512 vv =                                                           \
                    _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk[c], vi + c * 16));          \
                _Pragma("GCC unroll 4") for (int g = 0; g < GT; g++)                        \
                    acc[g][c] = f16_round(_mm512_add_ps(acc[g][c], _mm512_mul_ps(vv, ws[g]))); \
            }                                                                               \
        }                                                                                   \
        _Pragma("GCC unroll 8") for (int c = 0; c < NS; c++) {                              \
            if (c >= NC) break;                                                             \
            _Pragma("GCC unroll 4") for (int g = 0; g < GT; g++)                            \
                _mm512_mask_storeu_ps(a + g * as + (c0 + c) * 16, mk[c], acc[g][c]);        \
        }                                                                                   \
    }

ACC_PASS(4, 4)
ACC_PASS(2, 8)
ACC_PASS(1, 8)

void ds4_attn_f16_acc_avx512(float *a, int64_t as, int64_t G, const uint16_t *v, int64_t P,
                             const float *w, const float *r, int64_t rs, int64_t dh,
                             const uint16_t *nk, const uint16_t *nv, int64_t nP) {
    const int64_t nc = (dh + 15) / 16;
    /* position steps of all passes below, and the next block's lines */
    const int64_t steps = P * ((G / 4) * ((nc + 3) / 4) + ((G % 4) / 2) * ((nc + 7) / 8) +
                               (G % 2) * ((nc + 7) / 8));
    const int64_t bytes = nk && nv ? nP * dh * 2 : 0;
    prefetcher pf = {{(const char *)nk, (const char *)nv},
                     {(const char *)nk + bytes, (const char *)nv + bytes},
                     steps > 0 ? (int)((2 * bytes / 64 + steps - 1) / steps) : 0};
    if (!bytes) pf.per = 0;
    int64_t g = 0;
    for (; g + 4 <= G; g += 4)
        for (int64_t c0 = 0; c0 < nc; c0 += 4)
            acc_pass_4(a + g * as, as, v, P, w + g * rs, r + g * rs, rs, dh, c0,
                       (int)(nc - c0 < 4 ? nc - c0 : 4), &pf);
    for (; g + 2 <= G; g += 2)
        for (int64_t c0 = 0; c0 < nc; c0 += 8)
            acc_pass_2(a + g * as, as, v, P, w + g * rs, r + g * rs, rs, dh, c0,
                       (int)(nc - c0 < 8 ? nc - c0 : 8), &pf);
    for (; g < G; g++)
        for (int64_t c0 = 0; c0 < nc; c0 += 8)
            acc_pass_1(a + g * as, as, v, P, w + g * rs, r + g * rs, rs, dh, c0,
                       (int)(nc - c0 < 8 ? nc - c0 : 8), &pf);
}

#else /* built without AVX-512 flags: stubs attention.c never calls */

int ds4_attn_f16_acc_avx512_ok(void) { return 0; }

void ds4_attn_f16_scores_avx512(const uint16_t *k, int64_t P, const float *q, int64_t G,
                                int64_t dh, float scale, float *s, int64_t ss,
                                const uint16_t *v) {
    (void)k, (void)P, (void)q, (void)G, (void)dh, (void)scale, (void)s, (void)ss, (void)v;
}

void ds4_attn_f16_acc_avx512(float *a, int64_t as, int64_t G, const uint16_t *v, int64_t P,
                             const float *w, const float *r, int64_t rs, int64_t dh,
                             const uint16_t *nk, const uint16_t *nv, int64_t nP) {
    (void)a, (void)as, (void)G, (void)v, (void)P, (void)w, (void)r, (void)rs, (void)dh;
    (void)nk, (void)nv, (void)nP;
}

#endif
