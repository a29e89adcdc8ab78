/*
 * avx2_fwd.c — the AVX2 kernel set's forward-pass kernels (avx2_fwd.h):
 * the GDN state rows, SiLU with a vectorised libm-exact expf, and the F16
 * attention accumulation step. Twins of quants/avx512.c's, with AVX2's own
 * float-dot order where a dot is involved; every one promises the bits of
 * the portable code it replaces (tests/test_prefill_kernels.py runs them for
 * every ISA that has them, tests/test_avx2_paths.py forces this set on an
 * AVX-512 machine).
 *
 * Compiled with -mavx2 -mfma -mf16c (build_core.py SIMD_VARIANTS); without
 * them it compiles to nothing and avx2.c's init, itself a stub then, never
 * refers to it.
 */
#include "avx2_fwd.h"
#include "quants.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#include <math.h>

/* avx2.c hsum_ps: (lo128 + hi128), then pairs, then the last two. */
static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* avx2.c dot_f32_f32 (FLOAT_DOT_BODY), the same operations in the same
 * order: four accumulators over 32-value steps (vector j of a step into
 * accumulator j), 8-value steps into the first, ((a0 + a1) + (a2 + a3)),
 * hsum_ps, then the scalar tail in index order (multiply, then add: the
 * build has -ffp-contract=off). A change there must be mirrored here. */
static float dot_f32(const float *x, const float *y, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), _mm256_loadu_ps(y + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), _mm256_loadu_ps(y + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), a0);
    float sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) sum += x[i] * y[i];
    return sum;
}

/* ----------------------------------------------------- GDN state rows -- */
/* Per row m, forward/gdn.c delta_row's operations with this set's float dot:
 * Sm *= decay; u = dot(Sm, k); d = (v[m] - u)*beta; Sm += k*d (multiply,
 * then add); out[m] = dot(Sm, q). For d_k = 128 and 64 two passes over the
 * row (decay + dot with k; decay again + update + dot with q; the row stays
 * in L1) instead of the loop's four and its calls through the kernel table,
 * and one store of the row instead of two.
 *
 * Tiny decays, as quants/avx512.c (which has the full argument): a decay
 * below 2^-64 makes S*decay subnormal, and an Intel core takes a microcode
 * assist on every multiply or FMA with a subnormal input or result (~20x a
 * normal row). Then the product is formed in double (exact) and rounded
 * once to float (the float multiply's rounding, subnormals included), and
 * the dot with k is skipped when |S.k| < ulp(v_m)/4 provably (so v_m - S.k
 * rounds to v_m and d = v_m*beta bit for bit). The bound: AVX2's dot rounds
 * each product through at most 4 FMAs and 5 adds, fewer than avx512.c's 136
 * steps, so its 1.01 * max|S| * sum|k| + 2^-140 covers it too. Exact either
 * way: the threshold decides speed, never a value. */
#define GDN_TINY_DECAY 0x1p-64f

static inline __m256 abs_ps(__m256 x) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x); }

/* x * d rounded once to float, through the exact double product. */
static inline __m256 mul_via_double(__m256 x, __m256d d) {
    const __m128 lo = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(x)), d));
    const __m128 hi = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)), d));
    return _mm256_set_m128(hi, lo);
}

/* Two rows of the float path (no tiny decay) at once: each row's operations
 * are the one-row loop's below, in its order, but the two rows' chains of
 * FMAs and their hsums interleave. One row's passes are dependent chains
 * (the dot with k, its hsum, d, then the update), so one row at a time left
 * the core waiting on latency (d_k 128: ~95 cycles a row). */
static inline __attribute__((always_inline)) void gdn_float_rows2(
    float *S0, const float *k, const float *q, __m256 dc, const float *v, float beta,
    float *out, const int nc, const int with_out) {
    float *S1 = S0 + 8 * nc;
    __m256 a0[4], a1[4];
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) a0[j] = a1[j] = _mm256_setzero_ps();
    _Pragma("GCC unroll 16") for (int c = 0; c < nc; c++) {
        const __m256 kc = _mm256_loadu_ps(k + 8 * c);
        a0[c & 3] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(S0 + 8 * c), dc), kc, a0[c & 3]);
        a1[c & 3] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(S1 + 8 * c), dc), kc, a1[c & 3]);
    }
    const float u0 = hsum_ps(_mm256_add_ps(_mm256_add_ps(a0[0], a0[1]), _mm256_add_ps(a0[2], a0[3])));
    const float u1 = hsum_ps(_mm256_add_ps(_mm256_add_ps(a1[0], a1[1]), _mm256_add_ps(a1[2], a1[3])));
    const __m256 dm0 = _mm256_set1_ps((v[0] - u0) * beta), dm1 = _mm256_set1_ps((v[1] - u1) * beta);
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) a0[j] = a1[j] = _mm256_setzero_ps();
    _Pragma("GCC unroll 16") for (int c = 0; c < nc; c++) {
        const __m256 kc = _mm256_loadu_ps(k + 8 * c);
        const __m256 x0 = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(S0 + 8 * c), dc),
                                        _mm256_mul_ps(kc, dm0));
        const __m256 x1 = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(S1 + 8 * c), dc),
                                        _mm256_mul_ps(kc, dm1));
        _mm256_storeu_ps(S0 + 8 * c, x0);
        _mm256_storeu_ps(S1 + 8 * c, x1);
        if (with_out) { /* q is NULL without out (a replay) */
            const __m256 qc = _mm256_loadu_ps(q + 8 * c);
            a0[c & 3] = _mm256_fmadd_ps(x0, qc, a0[c & 3]);
            a1[c & 3] = _mm256_fmadd_ps(x1, qc, a1[c & 3]);
        }
    }
    if (with_out) {
        out[0] = hsum_ps(_mm256_add_ps(_mm256_add_ps(a0[0], a0[1]), _mm256_add_ps(a0[2], a0[3])));
        out[1] = hsum_ps(_mm256_add_ps(_mm256_add_ps(a1[0], a1[1]), _mm256_add_ps(a1[2], a1[3])));
    }
}

/* d_k = 8 * nc, a multiple of 32 (so dot_f32 has no 8-value steps or tail
 * and accumulates vector c into accumulator c % 4, as here). */
static inline __attribute__((always_inline)) void gdn_rows_x32(
    float *S, int64_t nr, const float *k, const float *q, float decay, const float *v,
    float beta, float *out, const int nc) {
    const int64_t dk = 8 * (int64_t)nc;
    const __m256 dc = _mm256_set1_ps(decay);
    /* 0 is no subnormal hazard (S*0 is a zero): the float path */
    const int tiny = decay < GDN_TINY_DECAY && decay != 0.0f;
    const __m256d dcd = _mm256_set1_pd((double)decay);
    const __m256 inf = _mm256_set1_ps(INFINITY);
    float ksum = 0.0f; /* >= sum |k_i| up to float rounding (the 1.01 covers it) */
    if (tiny) {
        __m256 a = _mm256_setzero_ps();
        for (int c = 0; c < nc; c++) a = _mm256_add_ps(a, abs_ps(_mm256_loadu_ps(k + 8 * c)));
        ksum = hsum_ps(a);
    }
    int64_t m = 0;
    if (!tiny)
        for (; m + 2 <= nr; m += 2) {
            if (out) gdn_float_rows2(S + m * dk, k, q, dc, v + m, beta, out + m, nc, 1);
            else gdn_float_rows2(S + m * dk, k, q, dc, v + m, beta, NULL, nc, 0);
        }
    for (; m < nr; m++) {
        float *Sm = S + m * dk;
        float u = 0.0f;
        if (!tiny) {
            __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                           _mm256_setzero_ps()};
            /* the decayed row is not stored here: the update below
             * recomputes it (the same multiply, so the same bits), which
             * halves the row's 256-bit stores, the bound of this loop on
             * AVX2 cores that retire one such store per cycle (Zen 3) */
            _Pragma("GCC unroll 16") for (int c = 0; c < nc; c++) {
                const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(Sm + 8 * c), dc);
                a[c & 3] = _mm256_fmadd_ps(x, _mm256_loadu_ps(k + 8 * c), a[c & 3]);
            }
            u = hsum_ps(_mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3])));
        } else {
            __m256 mx = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
            _Pragma("GCC unroll 16") for (int c = 0; c < nc; c++) {
                const __m256 x = mul_via_double(_mm256_loadu_ps(Sm + 8 * c), dcd);
                _mm256_storeu_ps(Sm + 8 * c, x);
                mx = _mm256_max_ps(mx, abs_ps(x));
                /* NaN or +-Inf: not less than Inf, or unordered */
                bad = _mm256_or_ps(bad, _mm256_cmp_ps(abs_ps(x), inf, _CMP_NLT_UQ));
            }
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
            /* in double, so no bound itself underflows (avx512.c) */
            const double bound = 1.01 * (double)_mm_cvtss_f32(m4) * (double)ksum + 0x1p-140;
            const int skip = !_mm256_movemask_ps(bad) && v[m] != 0.0f &&
                             bound < fabs((double)v[m]) * 0x1p-26;
            if (!skip) u = dot_f32(Sm, k, dk);
        }
        const __m256 dm = _mm256_set1_ps((v[m] - u) * beta);
        __m256 b[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                       _mm256_setzero_ps()};
        _Pragma("GCC unroll 16") for (int c = 0; c < nc; c++) {
            /* the float path's decayed row was not stored: the same multiply
             * again; the tiny path stored its (maybe subnormal) row, which is
             * not multiplied again (no assist on an Intel core) */
            const __m256 sc = tiny ? _mm256_loadu_ps(Sm + 8 * c)
                                   : _mm256_mul_ps(_mm256_loadu_ps(Sm + 8 * c), dc);
            const __m256 x = _mm256_add_ps(sc, _mm256_mul_ps(_mm256_loadu_ps(k + 8 * c), dm));
            _mm256_storeu_ps(Sm + 8 * c, x);
            if (out) b[c & 3] = _mm256_fmadd_ps(x, _mm256_loadu_ps(q + 8 * c), b[c & 3]);
        }
        if (out) out[m] = hsum_ps(_mm256_add_ps(_mm256_add_ps(b[0], b[1]), _mm256_add_ps(b[2], b[3])));
    }
}

static void gdn_rows_128(float *S, int64_t nr, const float *k, const float *q, float decay,
                         const float *v, float beta, float *out) {
    gdn_rows_x32(S, nr, k, q, decay, v, beta, out, 16);
}

static void gdn_rows_64(float *S, int64_t nr, const float *k, const float *q, float decay,
                        const float *v, float beta, float *out) {
    gdn_rows_x32(S, nr, k, q, decay, v, beta, out, 8);
}

/* Any d_k: the row in four passes (decay, dot, update, dot), scalar tails. */
static void gdn_row_any(float *Sm, const float *k, const float *q, int64_t dk, float decay,
                        float vm, float beta, float *out) {
    const __m256 dc = _mm256_set1_ps(decay);
    int64_t i = 0;
    for (; i + 8 <= dk; i += 8) _mm256_storeu_ps(Sm + i, _mm256_mul_ps(_mm256_loadu_ps(Sm + i), dc));
    for (; i < dk; i++) Sm[i] *= decay;
    const float u = dot_f32(Sm, k, dk);
    const float d = (vm - u) * beta;
    const __m256 dm = _mm256_set1_ps(d);
    for (i = 0; i + 8 <= dk; i += 8)
        _mm256_storeu_ps(Sm + i, _mm256_add_ps(_mm256_loadu_ps(Sm + i),
                                               _mm256_mul_ps(_mm256_loadu_ps(k + i), dm)));
    for (; i < dk; i++) Sm[i] += k[i] * d;
    if (out) *out = dot_f32(Sm, q, dk);
}

void ds4_avx2_gdn_rows(float *S, int64_t nr, const float *k, const float *q, int64_t dk,
                       float decay, const float *v, float beta, float *out) {
    if (dk == 128) {
        gdn_rows_128(S, nr, k, q, decay, v, beta, out);
        return;
    }
    if (dk == 64) { /* the demo model's d_k */
        gdn_rows_64(S, nr, k, q, decay, v, beta, out);
        return;
    }
    for (int64_t m = 0; m < nr; m++)
        gdn_row_any(S + m * dk, k, q, dk, decay, v[m], beta, out ? out + m : NULL);
}

/* -------------------------------------------------------------- SiLU -- */
/* x / (1 + expf(-x)) with glibc's expf 4 doubles at a time, bit for bit:
 * the algorithm and constants of expf_avx512.h's expf16 (glibc
 * sysdeps/ieee754/flt-32/e_expf.c as __expf_fma builds it, __exp2f_data
 * with EXP2F_TABLE_BITS 5, the table in expf_tab.h; that header's comment
 * has the details), the table entry T[k % 32] fetched by a gather instead
 * of two permutes. Lanes glibc treats specially (|x| >= 85: top12 > 0x42a,
 * Inf, NaN) go lane by lane to libm expf. Installed only after
 * ds4_avx2_expf_matches() found it equal to this process's expf. */
#include "expf_tab.h"

static inline __m256d pd_bits(uint64_t b) { return _mm256_castsi256_pd(_mm256_set1_epi64x((long long)b)); }

/* expf of 4 floats in the normal range, in double, not yet rounded. */
static inline __m256d expf_core4(__m128 x) {
    const __m256d xd = _mm256_cvtps_pd(x);
    const __m256d inv = pd_bits(0x40471547652b82feull), shift = pd_bits(0x4338000000000000ull);
    const __m256d z = _mm256_fmadd_pd(inv, xd, shift);
    const __m256i ki = _mm256_castpd_si256(z);
    const __m256d kd = _mm256_sub_pd(z, shift);
    const __m256d r = _mm256_fmsub_pd(inv, xd, kd);
    const __m256i tk = _mm256_i64gather_epi64((const long long *)expf_tab,
                                              _mm256_and_si256(ki, _mm256_set1_epi64x(31)), 8);
    const __m256i t = _mm256_add_epi64(tk, _mm256_slli_epi64(ki, 47));
    const __m256d c0 = pd_bits(0x3ebc6af84b912394ull), c1 = pd_bits(0x3f2ebfce50fac4f3ull);
    const __m256d c2 = pd_bits(0x3f962e42ff0c52d6ull);
    const __m256d p = _mm256_fmadd_pd(c0, r, c1);
    const __m256d r2 = _mm256_mul_pd(r, r);
    const __m256d y = _mm256_fmadd_pd(p, r2, _mm256_fmadd_pd(r, c2, _mm256_set1_pd(1.0)));
    return _mm256_mul_pd(y, _mm256_castsi256_pd(t));
}

static inline __m256 expf8(__m256 x) {
    const __m256i top = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(x), 20),
                                         _mm256_set1_epi32(0x7ff));
    const int special =
        _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(top, _mm256_set1_epi32(0x42a))));
    const __m128 lo = _mm256_cvtpd_ps(expf_core4(_mm256_castps256_ps128(x)));
    const __m128 hi = _mm256_cvtpd_ps(expf_core4(_mm256_extractf128_ps(x, 1)));
    __m256 e = _mm256_set_m128(hi, lo);
    if (special) {
        float xs[8], es[8];
        _mm256_storeu_ps(xs, x);
        _mm256_storeu_ps(es, e);
        for (int l = 0; l < 8; l++)
            if (special & (1 << l)) es[l] = expf(xs[l]);
        e = _mm256_loadu_ps(es);
    }
    return e;
}

void ds4_avx2_silu_mul(float *y, const float *x, const float *m, int64_t n) {
    const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256 e = expf8(_mm256_xor_ps(v, sign)); /* expf(-x) */
        __m256 s = _mm256_div_ps(v, _mm256_add_ps(one, e));
        if (m) s = _mm256_mul_ps(s, _mm256_loadu_ps(m + i));
        _mm256_storeu_ps(y + i, s);
    }
    for (; i < n; i++) {
        const float s = x[i] / (1.0f + expf(-x[i]));
        y[i] = m ? s * m[i] : s;
    }
}

/* expf8 == this process's expf on every table index and both signs of r,
 * steps of 2^-7 through [-85, 85] (as avx512.c expf_vec_matches): another
 * libm's algorithm misses on a large share of these at once. */
int ds4_avx2_expf_matches(void) {
    float xs[8];
    int l = 0;
    for (float a = -85.0f; a <= 85.0f; a += 0x1p-7f) {
        xs[l++] = a;
        if (l < 8) continue;
        float es[8];
        _mm256_storeu_ps(es, expf8(_mm256_loadu_ps(xs)));
        for (int j = 0; j < 8; j++)
            if (ds4_bits_from_f32(es[j]) != ds4_bits_from_f32(expf(xs[j]))) return 0;
        l = 0;
    }
    return 1;
}

/* ------------------------------------------------ F16 attention step -- */
/* quants.h f16_acc_row in one pass: vcvtph2ps, fused multiply-add, vcvtps2ph
 * nearest-even, vcvtph2ps back, the conversions the set's to_float /
 * from_float[F16] make, so the values are the three-pass loop's. */
void ds4_avx2_f16_acc_row(float *a, const uint16_t *v, float vs, int64_t n) {
    const __m256 s = _mm256_set1_ps(vs);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 t = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + i))), s,
                                         _mm256_loadu_ps(a + i));
        _mm256_storeu_ps(a + i, _mm256_cvtph_ps(_mm256_cvtps_ph(t, _MM_FROUND_TO_NEAREST_INT |
                                                                     _MM_FROUND_NO_EXC)));
    }
    for (; i < n; i++) {
        const float t = fmaf(_cvtsh_ss(v[i]), vs, a[i]);
        a[i] = _cvtsh_ss(_cvtss_sh(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
}

#else /* built without AVX2 flags: avx2.c is a stub too and never calls these */

typedef int ds4_avx2_fwd_empty; /* ISO C wants a translation unit to declare something */

#endif
