/*
 * expf_avx512.h — glibc's expf in AVX-512 lanes, shared by the kernel sets
 * compiled with AVX-512 flags (quants/avx512.c: SiLU; quants/attn_avx512.c:
 * the attention softmax). Include only from such a file.
 */
#ifndef DS4_EXPF_AVX512_H
#define DS4_EXPF_AVX512_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "expf_tab.h"

/* glibc's expf computed 8 lanes at a time (16 per expf16), bit for bit. x86-64 glibc runs __expf_fma on every CPU with
 * FMA (all AVX-512 ones): sysdeps/ieee754/flt-32/e_expf.c (after ARM's
 * optimized-routines) built with FMA contraction. In double: k = round(x *
 * 32/ln2) by the 1.5 * 2^52 shift, r = x * 32/ln2 - k (one FMA), 2^(k/32)
 * = T[k % 32] with k/32 added to the exponent, and e^x = 2^(k/32) * (1 +
 * C2 r + (C1 + C0 r) r^2), the three polynomial steps FMAs as glibc's
 * build has them, then one rounding to float. The constants are glibc's
 * __exp2f_data (e_exp2f_data.c: EXP2F_TABLE_BITS 5, the _scaled
 * polynomial). |x| >= 85 (glibc's special-case test, top12(x) > 0x42a)
 * and NaN go lane by lane to libm expf itself. Because this leans on
 * one libm's algorithm, every user checks it against this process's expf
 * before use (avx512.c expf_vec_matches, attn_avx512.c check_expf); a libm
 * that computes otherwise keeps the scalar loops. */
static inline __m512d pd_bits(uint64_t b) { return _mm512_castsi512_pd(_mm512_set1_epi64((long long)b)); }

/* expf of 8 floats in the normal range (|x| < 85), as double, not yet rounded. */
static inline __m512d expf_core8(__m256 x) {
    const __m512d xd = _mm512_cvtps_pd(x);
    const __m512d inv = pd_bits(0x40471547652b82feull), shift = pd_bits(0x4338000000000000ull);
    const __m512d z = _mm512_fmadd_pd(inv, xd, shift);
    const __m512i ki = _mm512_castpd_si512(z);
    const __m512d kd = _mm512_sub_pd(z, shift);
    const __m512d r = _mm512_fmsub_pd(inv, xd, kd);
    /* T[ki % 32]: two 16-entry lookups on bits 0..3, bit 4 picks one */
    const __m512i t0 = _mm512_loadu_si512(expf_tab), t1 = _mm512_loadu_si512(expf_tab + 8);
    const __m512i t2 = _mm512_loadu_si512(expf_tab + 16), t3 = _mm512_loadu_si512(expf_tab + 24);
    const __m512i lo = _mm512_permutex2var_epi64(t0, ki, t1), hi = _mm512_permutex2var_epi64(t2, ki, t3);
    const __mmask8 upper = _mm512_test_epi64_mask(ki, _mm512_set1_epi64(16));
    const __m512i t = _mm512_add_epi64(_mm512_mask_blend_epi64(upper, lo, hi), _mm512_slli_epi64(ki, 47));
    const __m512d c0 = pd_bits(0x3ebc6af84b912394ull), c1 = pd_bits(0x3f2ebfce50fac4f3ull);
    const __m512d c2 = pd_bits(0x3f962e42ff0c52d6ull);
    const __m512d p = _mm512_fmadd_pd(c0, r, c1);
    const __m512d r2 = _mm512_mul_pd(r, r);
    const __m512d y = _mm512_fmadd_pd(p, r2, _mm512_fmadd_pd(r, c2, _mm512_set1_pd(1.0)));
    return _mm512_mul_pd(y, _mm512_castsi512_pd(t));
}

/* expf of 16 floats; lanes glibc treats specially (top12 > 0x42a: |x| >=
 * 85, Inf, NaN) through libm. */
static inline __m512 expf16(__m512 x) {
    const __m512i top = _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(x), 20),
                                         _mm512_set1_epi32(0x7ff));
    const __mmask16 special = _mm512_cmpgt_epi32_mask(top, _mm512_set1_epi32(0x42a));
    const __m256 lo = _mm512_cvtpd_ps(expf_core8(_mm512_castps512_ps256(x)));
    const __m256 hi = _mm512_cvtpd_ps(expf_core8(_mm512_extractf32x8_ps(x, 1)));
    __m512 e = _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
    if (special) {
        float xs[16], es[16];
        _mm512_storeu_ps(xs, x);
        _mm512_storeu_ps(es, e);
        for (int l = 0; l < 16; l++)
            if (special & (1u << l)) es[l] = expf(xs[l]);
        e = _mm512_loadu_ps(es);
    }
    return e;
}

#endif
