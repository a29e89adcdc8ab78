/*
 * attn_avx512.c — the staged F16 attention recipe's three hot loops
 * (attn_simd.h) with AVX-512.
 *
 * Scores (ds4_attn_f16_scores_avx512): each K row is widened once, 64
 * values at a time in registers, and serves up to four query heads; with
 * more heads the widened row is kept in a stack buffer for the next four
 * (a load instead of a second widening). Each head's dot keeps exactly the
 * AVX-512 kernel set's dot_f32_f32 / dot_f16_f32 order (quants/avx512.c
 * FLOAT_DOT512: four accumulators over 64-value steps, a 16-value step into
 * the first, a masked tail into the second, then ((a0 + a1) + (a2 + a3))
 * folded 512 -> 256 and summed pairwise as its hsum256); the horizontal
 * sums are taken sixteen dots at a time (hsum16: the same adds, two
 * shuffles and one add per level instead of a shuffle and an add per dot
 * and level). attention.c uses this only while the session runs the
 * AVX-512 set; tests/test_attention_staged.py compares whole forward passes
 * bit for bit with the position-by-position loop over that set's own dot
 * and tests/test_attention_kernels.py this kernel with a plain
 * FLOAT_DOT512: a change of FLOAT_DOT512's order must be mirrored here.
 *
 * Softmax (ds4_attn_f16_softmax_avx512): pass 2, 16 positions of a head at
 * a time: the running max by a log-step scan of "right > left ? right :
 * left" (the scalar loop's update, associative once NaN reads as -inf),
 * the expf arguments of both branches, glibc's expf in 16 lanes (checked
 * against this process's expf once), then S = S*ms + vs position by
 * position with the heads in lanes.
 *
 * V step (ds4_attn_f16_acc_avx512): the accumulators of up to 16 (head,
 * 16-lane chunk) pairs stay in registers over all P positions of the block,
 * each V chunk widened once for the heads of the pass; the round trip
 * through F16 (vcvtps2ph nearest-even, vcvtph2ps) after each multiply and
 * add is what the recipe prescribes. Every step is one IEEE operation or an
 * exact conversion, so the bits are those of any other implementation. The
 * per-position rescale test runs only at the positions pass 2 marked, and
 * whole chunk groups run without lane masks. Per head-chunk step this is
 * one FMA and two 2-uop conversions, all on ports 0 and 5: ~2.5 cycles is
 * the floor (a multiply and an add, before the recipe took llama.cpp's FMA,
 * measured ~3.7 against a floor of 3, on head 256, group 4).
 */
#include "attn_simd.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "expf_avx512.h"

#define RNE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

static inline __m512 f16_round(__m512 x) { return _mm512_cvtph_ps(_mm512_cvtps_ph(x, RNE)); }

static inline __mmask16 lanes(int64_t n) { /* the first min(n, 16) lanes */
    return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u);
}

int ds4_attn_f16_acc_avx512_ok(void) { return 1; }

/* ------------------------------------------------------------- scores -- */

/* Horizontal sums of 16 vectors x[0..15], each by quants/avx512.c's
 * fold512 + hsum256 tree (lane i + lane i+8; then j + j+4; then k + k+2;
 * then elements 0 + 1): the same adds of the same values, for 16 vectors
 * at once, each level adding two shuffled halves instead of one vector's
 * halves. Float addition is commutative, so which operand comes first
 * changes no bit. out[n] = the sum of x[n]. */
static inline void hsum16(const __m512 *x, float *out) {
    __m512 y[8], z[4], u[2];
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) /* [x.lo256 | x'.lo256] + [x.hi256 | x'.hi256] */
        y[j] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * j], x[2 * j + 1], 0x44),
                             _mm512_shuffle_f32x4(x[2 * j], x[2 * j + 1], 0xEE));
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) /* each folded half's 128-bit blocks 0 + 1 */
        z[j] = _mm512_add_ps(_mm512_shuffle_f32x4(y[2 * j], y[2 * j + 1], 0x88),
                             _mm512_shuffle_f32x4(y[2 * j], y[2 * j + 1], 0xDD));
    /* z[m]'s block t: vector 4m + t's four partial sums s0..s3 */
#pragma GCC unroll 2
    for (int j = 0; j < 2; j++) /* s0 + s2, s1 + s3 */
        u[j] = _mm512_add_ps(_mm512_shuffle_ps(z[2 * j], z[2 * j + 1], 0x44),
                             _mm512_shuffle_ps(z[2 * j], z[2 * j + 1], 0xEE));
    /* (s0 + s2) + (s1 + s3), lane 4t + e holding vector 4e + t */
    const __m512 f = _mm512_add_ps(_mm512_shuffle_ps(u[0], u[1], 0x88),
                                   _mm512_shuffle_ps(u[0], u[1], 0xDD));
    const __m512i back = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    _mm512_storeu_ps(out, _mm512_permutexvar_ps(back, f));
}

/* Dots waiting for their horizontal sums, sixteen at a time. */
typedef struct {
    __m512 x[16];
    float *dst[16];
    int n;
    float scale;
} pending;

static inline void flush(pending *pd) {
    float out[16];
    for (int j = pd->n; j < 16; j++) pd->x[j] = _mm512_setzero_ps();
    hsum16(pd->x, out);
    for (int j = 0; j < pd->n; j++) *pd->dst[j] = out[j] * pd->scale;
    pd->n = 0;
}

static inline void push(pending *pd, __m512 x, float *dst) {
    pd->x[pd->n] = x;
    pd->dst[pd->n] = dst;
    if (++pd->n == 16) flush(pd);
}

#define KV(i) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kr + (i))))

/* GT (1..4) heads' dots with one K row in FLOAT_DOT512's order, up to the
 * ((a0 + a1) + (a2 + a3)) that the horizontal sum folds (pushed to pd, the
 * result for head g going to s[g*ss]). kf (may be NULL): the row's 64-value
 * steps widened, written when `widen`, else read instead of widening. */
static inline __attribute__((always_inline)) void dots(const uint16_t *kr, float *kf, int widen,
                                                       const float *q, int64_t qs, int GT,
                                                       int64_t n, pending *pd, float *s,
                                                       int64_t ss) {
    __m512 a[4][4];
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++)
        for (int j = 0; j < 4; j++) a[g][j] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512 k0, k1, k2, k3;
        if (widen) {
            k0 = KV(i), k1 = KV(i + 16), k2 = KV(i + 32), k3 = KV(i + 48);
            if (kf) {
                _mm512_store_ps(kf + i, k0), _mm512_store_ps(kf + i + 16, k1);
                _mm512_store_ps(kf + i + 32, k2), _mm512_store_ps(kf + i + 48, k3);
            }
        } else {
            k0 = _mm512_load_ps(kf + i), k1 = _mm512_load_ps(kf + i + 16);
            k2 = _mm512_load_ps(kf + i + 32), k3 = _mm512_load_ps(kf + i + 48);
        }
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
        push(pd, _mm512_add_ps(_mm512_add_ps(a[g][0], a[g][1]), _mm512_add_ps(a[g][2], a[g][3])),
             s + g * ss);
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

/* Head dims up to this keep one widened K row for the heads past the first
 * four (the 64-value steps' part of it: a 4 KiB stack buffer). */
#define KF_MAX 1024

void ds4_attn_f16_scores_avx512(const uint16_t *k, int64_t P, const float *q, int64_t G,
                                int64_t dh, float scale, float *s, int64_t ss,
                                const uint16_t *v) {
    float kf[KF_MAX] __attribute__((aligned(64)));
    float *keep = G > 4 && dh <= KF_MAX ? kf : NULL;
    pending pd;
    pd.n = 0;
    pd.scale = scale;
    for (int64_t i = 0; i < P; i++) {
        /* The V step reads the block's V rows in strips of 16-lane
         * chunks: bring them to L2 while the scores compute. */
        if (i + K_AHEAD < P) prefetch_row(k + (i + K_AHEAD) * dh, dh, 0);
        if (v) prefetch_row(v + i * dh, dh, 1);
        const uint16_t *kr = k + i * dh;
        for (int64_t g0 = 0; g0 < G; g0 += 4) {
            const int GT = G - g0 < 4 ? (int)(G - g0) : 4;
            dots(kr, keep, g0 == 0 || !keep, q + g0 * dh, dh, GT, dh, &pd, s + g0 * ss + i, ss);
        }
    }
    if (pd.n) flush(&pd);
}

/* ------------------------------------------------------------ softmax -- */

/* glibc's expf, 16 lanes: expf16 (expf_avx512.h, shared with quants/avx512.c's
 * SiLU); used only after check_expf() found it equal to this process's expf. */

/* expf16 == this process's expf on probes over the normal range and the
 * special-case edges (quants/avx512.c expf_vec_matches' probes, plus the
 * infinities and a NaN the softmax can feed it). */
static int expf_ok;
static pthread_once_t expf_once = PTHREAD_ONCE_INIT;

static void check_expf(void) {
    float xs[16];
    int l = 0, ok = 1;
    const float edge[] = {-INFINITY, INFINITY, NAN, -0.0f, 0.0f, 88.72f, -87.3f, -103.97f};
    for (int e = 0; e < (int)(sizeof edge / sizeof edge[0]); e++) xs[l++] = edge[e];
    for (float a = -120.0f; a <= 90.0f && ok; a += 0x1p-7f) {
        xs[l++] = a;
        if (l < 16) continue;
        float es[16];
        _mm512_storeu_ps(es, expf16(_mm512_loadu_ps(xs)));
        for (int j = 0; j < 16; j++) {
            const float want = expf(xs[j]);
            if (memcmp(&es[j], &want, sizeof want) != 0 && !(want != want && es[j] != es[j]))
                ok = 0;
        }
        l = 0;
    }
    expf_ok = ok;
}

int ds4_attn_f16_softmax_avx512_ok(void) {
    pthread_once(&expf_once, check_expf);
    return expf_ok;
}

/* op(left, right) = right > left ? right : left: the scalar loop's running
 * max (a tie or a NaN keeps the left). With NaN replaced by -inf first it
 * is associative (it picks the leftmost maximum), so a log-step scan gives
 * each position the max the scalar loop holds there. */
static inline __m512 op_max(__m512 left, __m512 right) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(right, left, _CMP_GT_OQ), left, right);
}

/* Lanes moved up by d (lane j takes lane j - d), the first d lanes -inf. */
static inline __m512 shift_up(__m512 x, int d, __m512 fill) {
    const __m512i idx = _mm512_sub_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(d));
    return _mm512_mask_permutexvar_ps(fill, (__mmask16)(0xFFFFu << d), idx, x);
}

void ds4_attn_f16_softmax_avx512(float *w, float *r, int64_t rs, int64_t G, int64_t P, float *st,
                                 int64_t hs) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY), one = _mm512_set1_ps(1.0f);
    /* positions where some head has a new max (S's factor ms != 1 there) */
    uint64_t ev[4] = {0, 0, 0, 0};
    float ms[16 * 256] __attribute__((aligned(64))); /* per head: ms, for S */
    for (int64_t g = 0; g < G; g++) {
        float *wg = w + g * rs, *rg = r + g * rs;
        float *mg = ms + (g % 16) * 256;
        __m512 C = ninf; /* the running max before this vector */
        for (int64_t i = 0; i < P; i += 16) {
            const __mmask16 valid = lanes(P - i);
            const __m512 s = _mm512_mask_loadu_ps(ninf, valid, wg + i);
            __m512 t = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(s, s, _CMP_UNORD_Q), s, ninf);
            t = op_max(shift_up(t, 1, ninf), t);
            t = op_max(shift_up(t, 2, ninf), t);
            t = op_max(shift_up(t, 4, ninf), t);
            t = op_max(shift_up(t, 8, ninf), t);
            /* the max held before each position: C, then the prefix */
            const __m512 prev = op_max(C, shift_up(t, 1, ninf));
            const __mmask16 nm = _mm512_mask_cmp_ps_mask(valid, s, prev, _CMP_GT_OQ);
            /* new max: ms = expf(Mold - s); else vs = expf(s - M) */
            const __m512 arg = _mm512_mask_blend_ps(nm, _mm512_sub_ps(s, prev), _mm512_sub_ps(prev, s));
            const __m512 e = expf16(arg);
            _mm512_mask_storeu_ps(wg + i, valid, _mm512_mask_blend_ps(nm, e, one));
            const __mmask16 resc = nm & _mm512_cmp_ps_mask(prev, ninf, _CMP_NEQ_UQ);
            _mm512_mask_storeu_ps(rg + i, valid, _mm512_mask_blend_ps(resc, one, e));
            _mm512_store_ps(mg + i, _mm512_mask_blend_ps(nm, one, e));
            ev[i / 64] |= (uint64_t)nm << (i % 64);
            C = op_max(C, _mm512_permutexvar_ps(_mm512_set1_epi32(15), t));
        }
        st[g * hs] = _mm512_cvtss_f32(C);
        /* S = S*ms + vs position by position, 16 heads at once: between new
         * maxima ms is 1 and S*1 == S, so only the add is made there */
        if (g % 16 == 15 || g == G - 1) {
            const int64_t g0 = g - g % 16, n = g - g0 + 1;
            const __mmask16 hm = lanes(n);
            const __m512i idx = _mm512_mullo_epi32(
                _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                _mm512_set1_epi32((int)rs));
            const __m512i idm = _mm512_mullo_epi32(
                _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                _mm512_set1_epi32(256));
            __m512 S = _mm512_setzero_ps();
            const float *w0 = w + g0 * rs;
            for (int64_t i = 0; i < P; i++) {
                const __m512 vs = _mm512_mask_i32gather_ps(one, hm, idx, w0 + i, 4);
                if (ev[i / 64] >> (i % 64) & 1) {
                    const __m512 m = _mm512_mask_i32gather_ps(one, hm, idm, ms + i, 4);
                    S = _mm512_mul_ps(S, m);
                }
                S = _mm512_add_ps(S, vs);
            }
            float out[16];
            _mm512_storeu_ps(out, S);
            for (int64_t j = 0; j < n; j++) st[(g0 + j) * hs + 1] = out[j];
            ev[0] = ev[1] = ev[2] = ev[3] = 0;
        }
    }
}

/* ------------------------------------------------------------- V step -- */

typedef struct {
    const char *p[2], *end[2];
    int per; /* lines per position step */
} prefetcher;

/* `per` lines of the next block per position step: K lines first, then V */
static inline void prefetch_some(prefetcher *pf) {
    for (int j = 0; j < pf->per; j++) {
        const int w = pf->p[0] < pf->end[0] ? 0 : 1;
        if (pf->p[w] >= pf->end[w]) return;
        _mm_prefetch(pf->p[w], _MM_HINT_T1);
        pf->p[w] += 64;
    }
}

/* Positions where some head of [g0, g0+GT) rescales (r != 1), as a bitmap. */
static inline void events_of(const float *r, int64_t rs, int64_t GT, int64_t P, uint64_t *ev) {
    for (int64_t j = 0; j < (P + 63) / 64; j++) ev[j] = 0;
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t g = 0; g < GT; g++)
        for (int64_t i = 0; i < P; i += 16) {
            const __mmask16 m = lanes(P - i);
            const __mmask16 ne =
                _mm512_mask_cmp_ps_mask(m, _mm512_maskz_loadu_ps(m, r + g * rs + i), one, _CMP_NEQ_UQ);
            ev[i / 64] |= (uint64_t)ne << (i % 64);
        }
}

/* Heads [0, GT) (pointers already offset) x chunks [c0, c0+NC) of 16 lanes
 * (NC <= NS), GT * NS <= 16 accumulators in registers over the P positions.
 * FULL (NC == NS and every chunk whole): the same steps without lane masks
 * or chunk-count tests (~8% faster per step measured on head 256). ev: the
 * positions where some head of the pass rescales (bit i of ev[i / 64]); the
 * positions between two of them run with no per-head test. */
#define ACC_PASS(NAME, GT, NS, FULL)                                                         \
    static void NAME(float *a, int64_t as, const uint16_t *v, int64_t P, const float *w,     \
                     const float *r, int64_t rs, int64_t dh, int64_t c0, int NC,             \
                     prefetcher *pf, const uint64_t *ev) {                                   \
        __m512 acc[GT][NS];                                                                  \
        __mmask16 mk[NS];                                                                    \
        _Pragma("GCC unroll 8") for (int c = 0; c < NS; c++) {                               \
            mk[c] = FULL ? (__mmask16)0xFFFF : c < NC ? lanes(dh - (c0 + c) * 16) : 0;       \
            _Pragma("GCC unroll 4") for (int g = 0; g < GT; g++) acc[g][c] =                 \
                FULL ? _mm512_loadu_ps(a + g * as + (c0 + c) * 16)                           \
                     : _mm512_maskz_loadu_ps(mk[c], a + g * as + (c0 + c) * 16);             \
        }                                                                                    \
        int64_t i = 0;                                                                       \
        while (i < P) {                                                                      \
            int64_t e = P; /* the next rescale at or after i */                              \
            for (int64_t j = i / 64; j < (P + 63) / 64; j++) {                               \
                const uint64_t bits = ev[j] & (j == i / 64 ? ~0ull << (i % 64) : ~0ull);     \
                if (bits) {                                                                  \
                    e = j * 64 + __builtin_ctzll(bits);                                      \
                    break;                                                                   \
                }                                                                            \
            }                                                                                \
            if (e == i) {                                                                    \
                _Pragma("GCC unroll 4") for (int g = 0; g < GT; g++) {                       \
                    const float x = r[g * rs + i];                                           \
                    if (x != 1.0f) {                                                         \
                        const __m512 xs = _mm512_set1_ps(x);                                 \
                        _Pragma("GCC unroll 8") for (int c = 0; c < NS; c++)                 \
                            acc[g][c] = f16_round(_mm512_mul_ps(acc[g][c], xs));             \
                    }                                                                        \
                }                                                                            \
                e = i + 1; /* this position's add follows */                                 \
            }                                                                                \
            for (; i < e; i++) {                                                             \
                const uint16_t *vi = v + i * dh + c0 * 16;                                   \
                prefetch_some(pf);                                                           \
                _Pragma("GCC unroll 8") for (int c = 0; c < NS; c++) {                       \
                    if (!FULL && c >= NC) break;                                             \
                    const __m512 vv = _mm512_cvtph_ps(                                       \
                        FULL ? _mm256_loadu_si256((const __m256i *)(vi + c * 16))            \
                             : _mm256_maskz_loadu_epi16(mk[c], vi + c * 16));                \
                    _Pragma("GCC unroll 4") for (int g = 0; g < GT; g++)                     \
                        acc[g][c] = f16_round(                                               \
                            _mm512_fmadd_ps(vv, _mm512_set1_ps(w[g * rs + i]), acc[g][c]));  \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
        _Pragma("GCC unroll 8") for (int c = 0; c < NS; c++) {                               \
            if (!FULL && c >= NC) break;                                                     \
            _Pragma("GCC unroll 4") for (int g = 0; g < GT; g++) {                           \
                if (FULL) _mm512_storeu_ps(a + g * as + (c0 + c) * 16, acc[g][c]);           \
                else _mm512_mask_storeu_ps(a + g * as + (c0 + c) * 16, mk[c], acc[g][c]);    \
            }                                                                                \
        }                                                                                    \
    }

ACC_PASS(acc_pass_4, 4, 4, 0)
ACC_PASS(acc_full_4, 4, 4, 1)
ACC_PASS(acc_pass_2, 2, 8, 0)
ACC_PASS(acc_full_2, 2, 8, 1)
ACC_PASS(acc_pass_1, 1, 8, 0)
ACC_PASS(acc_full_1, 1, 8, 1)

/* One group of GT heads over all chunks: whole groups of NS chunks by the
 * FULL pass, the rest (a partial group, a masked last chunk) by the other. */
#define ACC_GROUP(GT, NS)                                                                    \
    for (int64_t c0 = 0; c0 < nc; c0 += NS) {                                                \
        const int NC = (int)(nc - c0 < NS ? nc - c0 : NS);                                   \
        if (NC == NS && (c0 + NS) * 16 <= dh)                                                \
            acc_full_##GT(a + g * as, as, v, P, w + g * rs, r + g * rs, rs, dh, c0, NC, &pf, \
                          ev);                                                               \
        else                                                                                 \
            acc_pass_##GT(a + g * as, as, v, P, w + g * rs, r + g * rs, rs, dh, c0, NC, &pf, \
                          ev);                                                               \
    }

void ds4_attn_f16_acc_avx512(float *a, int64_t as, int64_t G, const uint16_t *v, int64_t P,
                             const float *w, const float *r, int64_t rs, int64_t dh,
                             const uint16_t *nk, const uint16_t *nv, int64_t nP) {
    const int64_t nc = (dh + 15) / 16;
    const int64_t bytes = nk && nv ? nP * dh * 2 : 0;
    /* position steps of all passes below, and the next block's lines */
    const int64_t steps = P * ((G / 4) * ((nc + 3) / 4) + ((G % 4) / 2) * ((nc + 7) / 8) +
                               (G % 2) * ((nc + 7) / 8));
    prefetcher pf = {{(const char *)nk, (const char *)nv},
                     {(const char *)nk + bytes, (const char *)nv + bytes},
                     bytes && steps > 0 ? (int)((2 * bytes / 64 + steps - 1) / steps) : 0};
    uint64_t ev[4]; /* P <= 256: one block */
    int64_t g = 0;
    for (; g + 4 <= G; g += 4) {
        events_of(r + g * rs, rs, 4, P, ev);
        ACC_GROUP(4, 4)
    }
    for (; g + 2 <= G; g += 2) {
        events_of(r + g * rs, rs, 2, P, ev);
        ACC_GROUP(2, 8)
    }
    for (; g < G; g++) {
        events_of(r + g * rs, rs, 1, P, ev);
        ACC_GROUP(1, 8)
    }
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

int ds4_attn_f16_softmax_avx512_ok(void) { return 0; }

void ds4_attn_f16_softmax_avx512(float *w, float *r, int64_t rs, int64_t G, int64_t P, float *st,
                                 int64_t hs) {
    (void)w, (void)r, (void)rs, (void)G, (void)P, (void)st, (void)hs;
}

#endif
