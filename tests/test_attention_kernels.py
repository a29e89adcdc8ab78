"""The AVX-512 kernels of the staged F16 attention recipe, one by one, against
plain loops of the recipe, bit for bit, on inputs a model rarely produces.

tests/test_attention_staged.py checks whole forward passes against the
position-by-position recipe (DS4_ATTN_REFERENCE=1); the shapes and values a
small model produces leave corners unvisited: NaN and infinite scores, tied
maxima and signed zeros (the softmax's running max), F16 subnormals and
values near the F16 overflow in the V accumulator, more than 16 heads per
group, blocks shorter than 256 positions, head dims with and without
64-value steps and masked tails. A C harness (below) compiled against
csrc/quants/attn_avx512.c with the build's own flags runs each kernel and a
plain loop of the recipe on thousands of such inputs and counts the results
whose bits differ. Exact comparison: no tolerance (the kernels promise the
recipe's bits).

The plain loops are written from the recipe (attention.c block_partial_f16 /
f16_softmax_portable and attn_simd.h), not from the kernels: the dot in the
AVX-512 set's FLOAT_DOT512 order (four accumulators over 64-value steps,
16-value steps into the first, a masked tail into the second, then
((a0 + a1) + (a2 + a3)) and fold512/hsum256), one head and one position at a
time; the softmax scalars and S position by position with libm expf; the V
step one value at a time with F16C's scalar conversions.
"""

from __future__ import annotations

import os
import subprocess

import pytest

import build_core
from ds4py import _core

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HARNESS = r"""
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "attn_simd.h"

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}
static float unif(void) { return (float)(rnd() & 0xFFFFFF) / 16777216.0f; }
static int same(float a, float b) { return memcmp(&a, &b, 4) == 0; }
static float f16r(float x) { return _cvtsh_ss(_cvtss_sh(x, 0)); }

/* FLOAT_DOT512's order, one K row (F16) with one query. */
static float dot_ref(const uint16_t *k, const float *q, int n) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int i = 0;
#define K(i) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(k + (i))))
    for (; i + 64 <= n; i += 64) {
        a0 = _mm512_fmadd_ps(K(i), _mm512_loadu_ps(q + i), a0);
        a1 = _mm512_fmadd_ps(K(i + 16), _mm512_loadu_ps(q + i + 16), a1);
        a2 = _mm512_fmadd_ps(K(i + 32), _mm512_loadu_ps(q + i + 32), a2);
        a3 = _mm512_fmadd_ps(K(i + 48), _mm512_loadu_ps(q + i + 48), a3);
    }
    for (; i + 16 <= n; i += 16) a0 = _mm512_fmadd_ps(K(i), _mm512_loadu_ps(q + i), a0);
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        a1 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, k + i)),
                             _mm512_maskz_loadu_ps(m, q + i), a1);
    }
    const __m512 v = _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
    const __m256 f = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(f), _mm256_extractf128_ps(f, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* A score of one of the softmax corner families. */
static float score(int fam, int i) {
    switch (fam) {
    case 0: return (unif() - 0.5f) * 20.0f;
    case 1: { /* ties, +-0 */
        const float x = (float)(rnd() % 5) - 2.0f;
        return rnd() % 3 == 0 ? -x * 0.0f : x;
    }
    case 2: {
        const uint32_t c = rnd() % 64;
        return c == 0 ? NAN : c == 1 ? -INFINITY : c == 2 ? INFINITY : unif() * 10.0f;
    }
    case 3: return (float)i * 0.01f + (float)(rnd() % 3) * 0.001f; /* a new max at most positions */
    case 4: return -(float)i + unif(); /* the first position stays the max */
    default: return (unif() - 0.5f) * 300.0f; /* weights that underflow */
    }
}

/* A V value: mostly ordinary, some F16 subnormals, some near the top. */
static uint16_t vval(int fam) {
    const uint32_t c = rnd() % 16;
    float x = (unif() - 0.5f) * 4.0f;
    if (fam % 2 && c == 0) x *= 1e-6f;   /* F16 subnormal range */
    if (fam % 3 == 2 && c == 1) x *= 30000.0f; /* near 65504: sums may overflow to inf */
    return _cvtss_sh(x, 0);
}

int main(int argc, char **argv) {
    const int trials = argc > 1 ? atoi(argv[1]) : 400;
    static const int dhs[] = {16, 40, 64, 72, 128, 136, 256, 320};
    long bad_s = 0, bad_m = 0, bad_v = 0, n_s = 0, n_m = 0, n_v = 0;
    if (!ds4_attn_f16_acc_avx512_ok()) { printf("not-built\n"); return 2; }
    const int sm_ok = ds4_attn_f16_softmax_avx512_ok();
    for (int t = 0; t < trials; t++) {
        const int G = 1 + (int)(rnd() % 18), P = t % 3 ? 1 + (int)(rnd() % 256) : 256;
        const int dh = dhs[rnd() % (sizeof dhs / sizeof dhs[0])], fam = (int)(rnd() % 6);
        const int rs = 256, hs = 2 + dh;
        uint16_t *k = malloc((size_t)P * dh * 2), *v = malloc((size_t)P * dh * 2);
        float *q = malloc((size_t)G * dh * 4), *s1 = malloc((size_t)G * rs * 4);
        float *s2 = malloc((size_t)G * rs * 4), *w = malloc((size_t)G * rs * 4);
        float *r = malloc((size_t)G * rs * 4), *m = malloc((size_t)G * rs * 4);
        float *r2 = malloc((size_t)G * rs * 4), *st = malloc((size_t)G * hs * 4);
        float *st2 = malloc((size_t)G * hs * 4), *a1 = malloc((size_t)G * dh * 4);
        float *a2 = malloc((size_t)G * dh * 4);
        for (int i = 0; i < P * dh; i++) {
            k[i] = _cvtss_sh((unif() - 0.5f) * (fam == 5 ? 60.0f : 4.0f), 0);
            v[i] = vval(fam);
        }
        for (int i = 0; i < G * dh; i++) q[i] = f16r(unif() - 0.5f);
        /* scores */
        const float scale = 1.0f / sqrtf((float)dh);
        ds4_attn_f16_scores_avx512(k, P, q, G, dh, scale, s1, rs, t % 2 ? v : NULL);
        for (int g = 0; g < G; g++)
            for (int i = 0; i < P; i++, n_s++)
                bad_s += !same(s1[g * rs + i], dot_ref(k + i * dh, q + g * dh, dh) * scale);
        /* softmax: on corner-family scores */
        for (int g = 0; g < G; g++)
            for (int i = 0; i < P; i++) s1[g * rs + i] = s2[g * rs + i] = score(fam, i);
        for (int g = 0; g < G; g++) {
            float M = -INFINITY, S = 0.0f;
            for (int i = 0; i < P; i++) {
                const float sc = s1[g * rs + i];
                float ms = 1.0f, vs = 1.0f, x = 1.0f;
                if (sc > M) {
                    const float Mold = M;
                    M = sc;
                    ms = expf(Mold - M);
                    if (Mold != -INFINITY) x = ms;
                } else {
                    vs = expf(sc - M);
                }
                w[g * rs + i] = vs, r[g * rs + i] = x, m[g * rs + i] = ms;
            }
            for (int i = 0; i < P; i++) S = S * m[g * rs + i] + w[g * rs + i];
            st[g * hs] = M, st[g * hs + 1] = S;
        }
        if (sm_ok) {
            ds4_attn_f16_softmax_avx512(s2, r2, rs, G, P, st2, hs);
            for (int g = 0; g < G; g++) {
                for (int i = 0; i < P; i++, n_m += 2)
                    bad_m += !same(s2[g * rs + i], w[g * rs + i]) +
                             !same(r2[g * rs + i], r[g * rs + i]);
                bad_m += !same(st2[g * hs], st[g * hs]) + !same(st2[g * hs + 1], st[g * hs + 1]);
                n_m += 2;
            }
        }
        /* V step with those weights and factors, from a nonzero F16 start */
        for (int i = 0; i < G * dh; i++) a1[i] = a2[i] = f16r((unif() - 0.5f) * 2.0f);
        ds4_attn_f16_acc_avx512(a2, dh, G, v, P, w, r, rs, dh, t % 2 ? k : NULL, t % 2 ? v : NULL,
                                t % 2 ? P : 0);
        for (int g = 0; g < G; g++)
            for (int i = 0; i < P; i++) {
                const float x = r[g * rs + i], ws = w[g * rs + i];
                for (int d = 0; d < dh; d++) {
                    float a = a1[g * dh + d];
                    if (x != 1.0f) a = f16r(a * x);
                    a1[g * dh + d] = f16r(fmaf(_cvtsh_ss(v[i * dh + d]), ws, a));
                }
            }
        for (int i = 0; i < G * dh; i++, n_v++) bad_v += !same(a1[i], a2[i]);
        free(k), free(v), free(q), free(s1), free(s2), free(w), free(r), free(m), free(r2);
        free(st), free(st2), free(a1), free(a2);
    }
    printf("scores %ld/%ld softmax %ld/%ld vstep %ld/%ld softmax_kernel %d\n", bad_s, n_s, bad_m,
           n_m, bad_v, n_v, sm_ok);
    return 0;
}
"""


def _has_avx512() -> bool:
    return bool(_core.lib.ds4_isa_available() & (1 << _core.lib.DS4_ISA_AVX512))


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    if build_core.machine() != "x86_64":
        pytest.skip("the AVX-512 attention kernels are x86-64 only")
    if not _has_avx512():
        pytest.skip("this CPU (or OS) grants no AVX-512: the kernels never run here")
    d = tmp_path_factory.mktemp("attn_kernels")
    src = d / "harness.c"
    src.write_text(HARNESS)
    flags = dict(build_core.SIMD_VARIANTS["x86_64"])["csrc/quants/attn_avx512.c"]
    exe = str(d / "harness")
    cc = os.environ.get("CC", "gcc")
    subprocess.run([cc, *build_core.BASE_CFLAGS, *flags, "-Icsrc/quants", str(src),
                    "csrc/quants/attn_avx512.c", "-o", exe, "-lm", "-lpthread"],
                   cwd=ROOT, check=True, capture_output=True)
    return exe


def test_avx512_kernels_equal_the_recipe_loops(harness):
    r = subprocess.run([harness, "600"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    f = r.stdout.split()
    counts = {f[0]: f[1], f[2]: f[3], f[4]: f[5]}
    assert f[7] == "1", "the vectorised expf does not match this libm: softmax kernel not checked"
    for name, c in counts.items():
        bad, total = map(int, c.split("/"))
        assert total > 100_000, (name, total)  # the trials did run
        assert bad == 0, f"{name}: {bad} of {total} results differ from the recipe's loop"


def test_harness_can_fail(harness, tmp_path):
    """The comparison sees small differences: the harness built against a V
    step whose weights are off by one ulp must report mismatches."""
    src = open(os.path.join(ROOT, "csrc/quants/attn_avx512.c")).read()
    planted = src.replace("_mm512_fmadd_ps(vv, _mm512_set1_ps(w[g * rs + i]), acc[g][c])",
                          "_mm512_fmadd_ps(vv, _mm512_set1_ps(w[g * rs + i] * 1.0000001f), "
                          "acc[g][c])", 1)
    assert planted != src, "the planted change no longer applies: update this test"
    kern = tmp_path / "attn_avx512.c"
    kern.write_text(planted)
    (tmp_path / "harness.c").write_text(HARNESS)
    flags = dict(build_core.SIMD_VARIANTS["x86_64"])["csrc/quants/attn_avx512.c"]
    exe = str(tmp_path / "harness")
    subprocess.run([os.environ.get("CC", "gcc"), *build_core.BASE_CFLAGS, *flags,
                    "-I" + os.path.join(ROOT, "csrc/quants"), str(tmp_path / "harness.c"),
                    str(kern), "-o", exe, "-lm", "-lpthread"], check=True, capture_output=True)
    r = subprocess.run([exe, "40"], capture_output=True, text=True, timeout=120)
    f = r.stdout.split()
    bad_v = int(f[5].split("/")[0])
    assert bad_v > 0, r.stdout
