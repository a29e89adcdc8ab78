"""Prefill kernels: the GDN multi-row state update and the fast-precision SiLU.

GDN (csrc/quants gdn_rows, run by csrc/forward/gdn.c over blocks of state
rows): for every ISA with the kernel, its result must be the portable per-row
loop's (forward/gdn.c delta_row over the ISA's float dot) bit for bit -- the
state and the outputs, as uint32 patterns -- for any number of rows, so that
a row's values never depend on its block or batch (DESIGN.md invariant 1).
The cases include the kernel's subnormal shortcuts: a decay below 2^-64 makes
S*decay subnormal (computed in double there) and lets it skip the dot with k
when v_m - S.k must round to v_m; v_m = 0, subnormal v_m, NaN and Inf inputs
must take the exact path. Values are also checked against float64 math, so
a kernel and loop that agree on a wrong answer still fail.

SiLU (csrc/quants silu_mul, run by the dense FFN and the GDN conv and gated
norm): bit for bit x / (1 + expf(-x)) with libm's expf (the scalar set's
values), over random bit patterns of every kind and a dense sweep, for any
row length, with the m multiply one float32 rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

from ds4py import _core
from ds4py import quants as Q
from ds4py._core import ffi, lib, new_error

ISAS = Q.available_isas()


def _f(a: np.ndarray):
    return ffi.cast("float *", ffi.from_buffer(a))


def _gdn(isa: str, kernel: int, S, k, q, decay, v, beta, with_out=True):
    S = np.array(S, np.float32, copy=True)
    nr, dk = S.shape
    out = np.full(nr, np.nan, np.float32)
    err = new_error()
    # without out, q is NULL: what forward/gdn.c's replay (accept) passes
    rc = lib.ds4_gdn_rows(_core.isa_id(isa), kernel, _f(S), nr, _f(k),
                          _f(q) if with_out else ffi.NULL, dk,
                          float(decay), _f(v), float(beta), _f(out) if with_out else ffi.NULL,
                          err)
    if rc != 0:
        return rc, None, None
    return rc, S, out


def _has_kernel(isa: str) -> bool:
    z = np.zeros((0, 16), np.float32)
    rc, _, _ = _gdn(isa, 1, z, np.zeros(16, np.float32), np.zeros(16, np.float32), 1.0,
                    np.zeros(1, np.float32), 1.0)
    assert rc in (0, lib.DS4_ERR_UNSUPPORTED)
    return rc == 0


KERNEL_ISAS = [i for i in ISAS if _has_kernel(i)]


def test_kernel_present_where_expected():
    # a wrong gate would drop the kernel silently (still right, only slower)
    if "avx512" in ISAS:
        assert "avx512" in KERNEL_ISAS
    assert "scalar" not in KERNEL_ISAS


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


# Decays: ordinary, small, around the kernel's 2^-64 switch, deep enough that
# S*decay is subnormal or flushes to zero, and zero.
DECAYS = [0.97, 1e-3, 2.0 ** -63, 2.0 ** -64, 2.0 ** -65, 1e-25, 1e-30, 1e-36, 1e-38,
          1e-42, 1e-45, 0.0]


def _case(rng, dk: int, nr: int, decay: float, variant: str):
    S = rng.standard_normal((nr, dk)).astype(np.float32)
    k = rng.standard_normal(dk).astype(np.float32)
    k /= np.float32(np.linalg.norm(k))
    q = (rng.standard_normal(dk) / np.sqrt(dk)).astype(np.float32)
    v = rng.standard_normal(nr).astype(np.float32)
    beta = float(np.float32(rng.uniform(0.05, 0.95)))
    # v rows: zero, subnormal, tiny normal, large (the skip test's edges)
    v[0] = 0.0
    v[1] = np.float32(3e-40)
    v[2] = np.float32(1e-30)
    v[3] = np.float32(1e6)
    S[4] *= np.float32(1e-35)  # a row whose products go subnormal at any decay
    if variant == "nan_s":
        S[5, 7] = np.nan
    elif variant == "inf_s":
        S[5, 3] = np.inf
    elif variant == "nan_k":
        k[11] = np.nan
    elif variant == "inf_k":
        k[2] = -np.inf
    elif variant == "big_s":
        S *= np.float32(1e30)  # so even a 2^-64 decay leaves S.k far from negligible
    elif variant == "edge":
        # v_m = S'.k * 2^(19+m): around the point where v_m - S'.k stops
        # rounding to v_m, i.e. both sides of the kernel's skip bound
        u = (S.astype(np.float64) * np.float32(decay)) @ k.astype(np.float64)
        v = (u * 2.0 ** (19 + np.arange(nr))).astype(np.float32)
    return S, k, q, decay, v, beta


VARIANTS = ["plain", "nan_s", "inf_s", "nan_k", "inf_k", "big_s", "edge"]


@pytest.mark.parametrize("isa", KERNEL_ISAS)
@pytest.mark.parametrize("dk", [128, 64, 48])
def test_gdn_rows_bit_identical_to_loop(isa, dk):
    rng = np.random.default_rng(dk)
    for decay in DECAYS:
        for variant in VARIANTS:
            S, k, q, decay_, v, beta = _case(rng, dk, 9, decay, variant)
            for with_out in (True, False):
                rc, Sk, ok = _gdn(isa, 1, S, k, q, decay_, v, beta, with_out)
                assert rc == 0
                rc, Sl, ol = _gdn(isa, 0, S, k, q, decay_, v, beta, with_out)
                assert rc == 0
                where = f"dk {dk} decay {decay!r} {variant} out {with_out}"
                assert np.array_equal(_bits(Sk), _bits(Sl)), where
                assert np.array_equal(_bits(ok), _bits(ol)), where
            # a row's values do not depend on how many rows share the call
            rc, Sall, oall = _gdn(isa, 1, S, k, q, decay_, v, beta)
            for m in range(S.shape[0]):
                rc, S1, o1 = _gdn(isa, 1, S[m:m + 1], k, q, decay_, v[m:m + 1], beta)
                assert np.array_equal(_bits(S1[0]), _bits(Sall[m])), (decay, variant, m)
                assert np.array_equal(_bits(o1), _bits(oall[m:m + 1])), (decay, variant, m)


@pytest.mark.parametrize("isa", KERNEL_ISAS)
def test_gdn_rows_values(isa):
    """Against float64 math: S' = S*decay + k (x) ((v - (S*decay).k) * beta),
    out = S'.q. Tolerance: float32 rounding of dk-term dots of O(1) values,
    1e-5 relative to the row's scale (about 80 ulp; a wrong term is O(1))."""
    rng = np.random.default_rng(7)
    for decay in DECAYS:
        S, k, q, decay_, v, beta = _case(rng, 128, 9, decay, "plain")
        rc, Sk, ok = _gdn(isa, 1, S, k, q, decay_, v, beta)
        S64 = S.astype(np.float64) * np.float64(np.float32(decay_))
        d = (v.astype(np.float64) - S64 @ k.astype(np.float64)) * beta
        S64 += d[:, None] * k.astype(np.float64)[None, :]
        o64 = S64 @ q.astype(np.float64)
        scale = np.abs(S64).max(axis=1, keepdims=True) + 1e-30
        assert np.all(np.abs(Sk - S64) <= 1e-5 * scale), decay
        assert np.all(np.abs(ok - o64) <= 1e-5 * scale[:, 0] * np.abs(q).sum()), decay


def test_gdn_rows_bad_arguments():
    z = np.zeros(16, np.float32)
    err = new_error()
    rc = lib.ds4_gdn_rows(_core.isa_id("scalar"), 0, _f(z), -1, _f(z), _f(z), 16, 1.0,
                          _f(z), 1.0, ffi.NULL, err)
    assert rc == lib.DS4_ERR_ARG
    rc = lib.ds4_gdn_rows(_core.isa_id("scalar"), 1, _f(z), 1, _f(z), _f(z), 16, 1.0,
                          _f(z), 1.0, ffi.NULL, err)
    assert rc == lib.DS4_ERR_UNSUPPORTED  # the scalar set has no kernel: the loop is it


# ----------------------------------------------------------------- SiLU --

def _silu(isa: str, x: np.ndarray, m: np.ndarray | None = None):
    x = np.ascontiguousarray(x, np.float32)
    y = np.full_like(x, np.nan)
    vec = ffi.new("int *")
    err = new_error()
    rc = lib.ds4_silu_row(_core.isa_id(isa), _f(y), _f(x),
                          _f(np.ascontiguousarray(m, np.float32)) if m is not None else ffi.NULL,
                          len(x), vec, err)
    assert rc == 0, ffi.string(err.message)
    return y, bool(vec[0])


def test_silu_vectorised_where_expected():
    # the AVX-512 kernel installs itself only after matching libm's expf
    # (quants/avx512.c expf_vec_matches): on glibc x86-64 it must be there
    if "avx512" in ISAS:
        assert _silu("avx512", np.zeros(16, np.float32))[1]
    assert not _silu("scalar", np.zeros(16, np.float32))[1]


def _all_kinds(rng) -> np.ndarray:
    """Random floats of every magnitude and both signs (random bit patterns:
    NaNs, infinities, subnormals included), a dense sweep of the range that
    matters for activations, and glibc expf's special-case edges."""
    bits = rng.integers(0, 2 ** 32, 1 << 16, dtype=np.uint64).astype(np.uint32).view(np.float32)
    sweep = rng.uniform(-30, 30, 1 << 16).astype(np.float32)
    edges = np.array([0.0, -0.0, 84.99, 85.0, -85.0, 88.72, -88.72, 88.73, 89.0, -89.0,
                      103.27, -103.27, -103.28, -103.97, -103.98, -104.0, 1e-45, -1e-45,
                      np.inf, -np.inf, np.nan], np.float32)
    return np.concatenate([bits, sweep, edges])


@pytest.mark.parametrize("isa", ISAS)
def test_silu_bit_identical_to_formula(isa):
    """Every ISA's SiLU is x / (1 + expf(-x)) in float32 with libm's expf,
    bit for bit (the scalar set computes exactly that C expression): the
    vectorised kernel reproduces glibc's expf, so no forward value moves."""
    x = _all_kinds(np.random.default_rng(11))
    y, _ = _silu(isa, x)
    ys, vec = _silu("scalar", x)
    assert not vec
    assert np.array_equal(_bits(y), _bits(ys))


def test_silu_scalar_values():
    """The reference itself is SiLU: within 3 ulp of float64 where the
    result is a normal float (expf is within 1 ulp, then the add and the
    divide round once each: measured 2.1 ulp at x ~ -16.7, where 1 + e^-x
    ~ 2e7 keeps only part of the 1); below x = -88.7 e^-x overflows and
    the formula gives -0 (true values ~1e-37)."""
    x = _all_kinds(np.random.default_rng(12))
    y, _ = _silu("scalar", x)
    with np.errstate(over="ignore", invalid="ignore"):
        x64 = x.astype(np.float64)
        ref = x64 / (1.0 + np.exp(-x64))
    assert np.array_equal(np.isnan(y), np.isnan(ref))
    flush = np.isfinite(ref) & (x < -88.0)
    assert np.all(np.abs(y[flush]) <= np.abs(ref[flush]) * (1 + 2.0 ** -20))
    fin = np.isfinite(ref) & (x >= -88.0) & (np.abs(ref) >= 2.0 ** -126)
    ulp = np.spacing(np.abs(ref[fin]).astype(np.float32)).astype(np.float64)
    assert np.all(np.abs(y[fin].astype(np.float64) - ref[fin]) <= 3 * ulp)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("n", [1, 15, 16, 17, 100, 3584])
def test_silu_rows_and_multiply(isa, n):
    """Any length (vector body and tail), and the multiply is one float32
    rounding of SiLU(x) * m."""
    rng = np.random.default_rng(n)
    x = _all_kinds(rng)[-n:] if n <= 21 else rng.uniform(-30, 30, n).astype(np.float32)
    y, _ = _silu(isa, x)
    ys, _ = _silu("scalar", x)
    assert np.array_equal(_bits(y), _bits(ys))
    m = rng.standard_normal(n).astype(np.float32)
    ym, _ = _silu(isa, x, m)
    with np.errstate(invalid="ignore", over="ignore"):
        want = (ys * m).astype(np.float32)
    assert np.array_equal(_bits(ym), _bits(want))
