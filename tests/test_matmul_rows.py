"""Multi-row matmul kernels (csrc/quants, dot_rows) keep batch invariance.

The forward pass (csrc/forward/matmul.c) dots each weight row against a group
of token rows in one multi-row kernel call where the ISA has one. DESIGN.md
invariant 1 needs every row's result to be exactly what the one-row kernel
gives that row alone, whatever the width of the batch. Checked here through
ds4_matmul_rows for every ISA this CPU runs, every weight type the forward
computes with, widths 1..16 and odd block counts:
  * multi-row result == ds4_vec_dot's kernel row by row, as uint32 bit
    patterns (no tolerance: the promise is bit identity);
  * row r of a width-w call == a width-1 call on row r alone;
  * the values are right: within a float-rounding bound of a float64 dot of
    the scalar ISA's dequantized weights and activations (so a kernel that
    is consistently wrong for every width still fails).
The forward-level twin (verify of 16 rows == 16 one-token evals, dense and
MoE, fast precision) is tests/test_verify.py; test_forced_scalar_forward
below runs it with DS4_FORCE_SCALAR too.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from ds4py import quants as Q
from ds4py._core import ffi, lib, new_error

ISAS = Q.available_isas()
# Weight types the forward pass computes with in fast precision.
WEIGHT_TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "Q4_K", "Q5_K", "Q6_K",
                "IQ4_XS", "F16", "BF16", "F32"]
# Where a multi-row kernel must exist (guards against a wrong gate silently
# dropping it: the forward would still be right, only slower).
EXPECTED_ROWS = {"avx512": {"Q8_0", "Q4_K", "Q6_K"}, "avx2": {"Q8_0", "Q4_K", "Q6_K"}}
WIDTHS = range(1, 17)


def _id(t: str) -> int:
    return Q.type_info(t).id


def _paired(t: str) -> str:
    return Q.type_info(t).vec_dot_type


def _weights(t: str, n_out: int, n: int, rng) -> np.ndarray:
    """n_out rows of n weights of type t, from floats (quantize_weights)."""
    x = (rng.standard_normal((n_out, n)) * 0.05).astype(np.float32)
    out = np.zeros(n_out * n // Q.type_info(t).block_size * Q.type_info(t).type_size, np.uint8)
    err = new_error()
    rc = lib.ds4_quantize_weights(_id(t), ffi.cast("float *", ffi.from_buffer(x)),
                                  ffi.from_buffer(out), n_out, n, err)
    assert rc == 0, ffi.string(err.message)
    return out


def _q8_0_wild(n_out: int, n: int, rng) -> np.ndarray:
    """Q8_0 rows of uniformly random codes, -128 included (a file may hold
    them; the multi-row kernel's unsigned-bias trick must stay exact)."""
    nb = n_out * n // 32
    raw = rng.integers(0, 256, size=(nb, 34), dtype=np.uint8)
    raw[:, 0:2] = (rng.standard_normal(nb) * 0.01).astype(np.float16).view(np.uint8).reshape(nb, 2)
    return raw.reshape(-1)


def _acts(t: str, nr: int, n: int, rng) -> tuple[np.ndarray, int, np.ndarray]:
    """nr activation rows quantized to t's paired type: (bytes, stride, floats)."""
    p = _paired(t)
    x = rng.standard_normal((nr, n)).astype(np.float32)
    x[0, : n // 3] *= 40.0  # rows with different scales across their blocks
    rows = [Q.quantize(p, x[r]) for r in range(nr)]
    return np.concatenate(rows), rows[0].size, x


def _matmul(isa, t, w, n_out, act, stride, n, nr, multi) -> tuple[int, np.ndarray]:
    out = np.full(nr * n_out, np.nan, np.float32)
    err = new_error()
    rb = n // Q.type_info(t).block_size * Q.type_info(t).type_size
    rc = lib.ds4_matmul_rows(Q._isa(isa), _id(t), ffi.from_buffer(w), rb, n_out,
                             ffi.from_buffer(act), stride, n, nr, multi,
                             ffi.cast("float *", ffi.from_buffer(out)), err)
    return rc, out.reshape(nr, n_out)


def _bits(a) -> np.ndarray:
    return np.asarray(a, np.float32).view(np.uint32)


def _n_values(t: str) -> list[int]:
    bs = Q.type_info(t).block_size
    if bs == 256:
        return [256, 768, 2304]  # 9 superblocks: an odd count (one-row sums go 8 at a time)
    if bs == 32:
        return [32, 96, 256, 352]  # 1, 3, 8, 11 blocks: odd counts run the tail
    return [64, 200]


@pytest.mark.parametrize("isa", ISAS)
def test_expected_kernels_present(isa):
    have = {t for t in WEIGHT_TYPES if lib.ds4_matmul_rows_kernel(Q._isa(isa), _id(t)) != ffi.NULL}
    assert EXPECTED_ROWS.get(isa, set()) <= have, f"{isa} lost multi-row kernels: {have}"


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("t", WEIGHT_TYPES)
def test_rows_bit_identical_across_widths(isa, t):
    rng = np.random.default_rng(_id(t) * 7 + len(isa))
    n_out = 7  # a tile kernel's 4 + 2 + 1 and 2 + 2 + 2 + 1 weight rows
    name = lib.ds4_matmul_rows_kernel(Q._isa(isa), _id(t))
    for n in _n_values(t):
        weights = [_weights(t, n_out, n, rng)]
        if t == "Q8_0":
            weights.append(_q8_0_wild(n_out, n, rng))
        act, stride, x = _acts(t, max(WIDTHS), n, rng)
        for w in weights:
            rc, ref = _matmul(isa, t, w, n_out, act, stride, n, max(WIDTHS), 0)
            assert rc == 0
            if name == ffi.NULL:
                # no multi-row kernel: the forward loops the one-row kernel,
                # and asking for the multi-row one is refused, not faked
                rc, _ = _matmul(isa, t, w, n_out, act, stride, n, 1, 1)
                assert rc == lib.DS4_ERR_UNSUPPORTED
                continue
            for width in WIDTHS:
                rc, got = _matmul(isa, t, w, n_out, act, stride, n, width, 1)
                assert rc == 0
                np.testing.assert_array_equal(_bits(got), _bits(ref[:width]),
                                              err_msg=f"{isa} {t} n={n} width {width}")
            for r in (0, 5, 15):  # one row alone, from the middle of the buffer
                rc, one = _matmul(isa, t, w, n_out, act[r * stride:], stride, n, 1, 1)
                assert rc == 0
                np.testing.assert_array_equal(_bits(one[0]), _bits(ref[r]))
            # the values themselves, against float64 over the scalar ISA's
            # dequantized operands
            wd = Q.dequantize(t, w, isa="scalar").reshape(n_out, n).astype(np.float64)
            ad = np.stack([Q.dequantize(_paired(t), act[r * stride:(r + 1) * stride],
                                        isa="scalar") for r in range(max(WIDTHS))])
            exact = ad.astype(np.float64) @ wd.T
            # float32 accumulation over n products (a few roundings each):
            # error <= n * 2^-22 * sum|w*a|, far above real rounding noise
            # and far below any wrong-block or wrong-scale error.
            bound = n * 2.0**-22 * (np.abs(ad) @ np.abs(wd).T) + 1e-30
            assert np.all(np.abs(ref - exact) <= bound), f"{isa} {t} n={n}"


@pytest.mark.parametrize("isa", [i for i in ISAS if "Q8_0" in EXPECTED_ROWS.get(i, ())])
def test_q8_0_tiles_bit_identical(isa):
    """Q8_0's tile kernels (AVX2: 4 weight rows a tile; AVX-512: 8, 4, 2 or 1
    by the activation rows, and one at a time past n = 512) over 37 weight
    rows -- the forward's tile calls of 16, 16 and 5 rows, so whole tiles and
    every remainder -- against 1..9 activation rows, at 1, 3, 8 and 11
    blocks, 16 blocks (the last short width) and 17 (past it): every value
    bit-identical to the one-row kernel's, uniform random codes (-128
    included) as well as quantized ones."""
    rng = np.random.default_rng(2026 + len(isa))
    n_out = 37
    for n in (32, 96, 256, 352, 512, 544):
        act, stride, _ = _acts("Q8_0", 9, n, rng)
        for w in (_weights("Q8_0", n_out, n, rng), _q8_0_wild(n_out, n, rng)):
            rc, ref = _matmul(isa, "Q8_0", w, n_out, act, stride, n, 9, 0)
            assert rc == 0
            for width in range(1, 10):
                rc, got = _matmul(isa, "Q8_0", w, n_out, act, stride, n, width, 1)
                assert rc == 0
                np.testing.assert_array_equal(_bits(got), _bits(ref[:width]),
                                              err_msg=f"{isa} Q8_0 n={n} width {width}")


# Widths past the 16-row groups: the AVX-512 K-quant panel GEMM (12 rows
# and up, 16 tokens a panel, 4 panels a pass: 64, then a second pass) with
# panels of 12..16 tokens and a tail of fewer than 12 left to the rows groups.
PANEL_WIDTHS = (12, 15, 16, 28, 31, 64, 75, 80, 91, 128, 139, 203)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("t", WEIGHT_TYPES)
def test_tile_widths_bit_identical(isa, t):
    """141 weight rows (the forward's tile calls of 128 and 13: whole 8-row
    bands of the panel GEMM, then 5 rows it leaves to the rows groups)
    against up to 203 activation rows (calls of 64 or 128: up to 8 panels of
    16, a short last panel, then rows groups): every value bit-identical to
    the one-row kernel's."""
    rng = np.random.default_rng(_id(t) * 11 + len(isa))
    n_out, n = 141, _n_values(t)[-1]
    w = _weights(t, n_out, n, rng)
    act, stride, _ = _acts(t, max(PANEL_WIDTHS), n, rng)
    rc, ref = _matmul(isa, t, w, n_out, act, stride, n, max(PANEL_WIDTHS), 0)
    assert rc == 0
    if lib.ds4_matmul_rows_kernel(Q._isa(isa), _id(t)) == ffi.NULL:
        # no multi-row kernel (test_expected_kernels_present says which
        # must exist): asking for one is refused
        rc, _ = _matmul(isa, t, w, n_out, act, stride, n, 12, 1)
        assert rc == lib.DS4_ERR_UNSUPPORTED
        return
    for width in PANEL_WIDTHS:
        rc, got = _matmul(isa, t, w, n_out, act, stride, n, width, 1)
        assert rc == 0
        np.testing.assert_array_equal(_bits(got), _bits(ref[:width]),
                                      err_msg=f"{isa} {t} n={n} width {width}")


def test_refuses_bad_arguments():
    err = new_error()
    w = np.zeros(34, np.uint8)
    out = np.zeros(1, np.float32)
    fp = ffi.cast("float *", ffi.from_buffer(out))
    # a row length that is not whole blocks
    assert lib.ds4_matmul_rows(lib.DS4_ISA_SCALAR, _id("Q8_0"), ffi.from_buffer(w), 34, 1,
                               ffi.from_buffer(w), 34, 33, 1, 0, fp, err) == lib.DS4_ERR_BAD_ROW
    assert b"block size" in ffi.string(err.message)
    # negative sizes
    assert lib.ds4_matmul_rows(lib.DS4_ISA_SCALAR, _id("Q8_0"), ffi.from_buffer(w), 34, -1,
                               ffi.from_buffer(w), 34, 32, 1, 0, fp, err) == lib.DS4_ERR_ARG
    # a type the core does not compute with
    assert lib.ds4_matmul_rows(lib.DS4_ISA_SCALAR, _id("Q2_K"), ffi.from_buffer(w), 34, 1,
                               ffi.from_buffer(w), 34, 256, 1, 0, fp, err) \
        == lib.DS4_ERR_UNSUPPORTED


_FORCED = r"""
import numpy as np, ds4py
m = ds4py.Model.load({path!r}, n_threads=2, n_ctx=512)
rng = np.random.default_rng(1)
pre = rng.integers(0, m.config.vocab_size, 40).tolist()
toks = rng.integers(0, m.config.vocab_size, 16).tolist()
with m.new_session() as s:
    s.eval(pre)
    serial = np.stack([np.array(s.eval([t])) for t in toks])
for w in (1, 2, 3, 8, 16):
    with m.new_session() as s:
        s.eval(pre)
        rows = []
        for i in range(0, 16, w):
            rows.append(np.array(s.verify(toks[i:i + w])))
            s.accept(len(toks[i:i + w]))
        got = np.concatenate(rows)
    assert np.array_equal(got.view(np.uint32), serial.reshape(got.shape).view(np.uint32)), w
print("ok")
"""


@pytest.mark.parametrize("force_scalar", [False, True])
def test_forced_scalar_forward(force_scalar):
    """Verify widths 1..16 on the demo model (Q8_0: the multi-row kernel's
    type) give the serial evals' logits bit for bit, on the AUTO ISA and
    under DS4_FORCE_SCALAR (where the one-row kernel runs)."""
    path = os.path.join(os.path.dirname(__file__), "..", "ds4py", "models", "demo-q8_0.gguf")
    assert os.path.exists(path), "the bundled demo model is missing"
    env = {**os.environ}
    env.pop("DS4_FORCE_SCALAR", None)
    if force_scalar:
        env["DS4_FORCE_SCALAR"] = "1"
    r = subprocess.run([sys.executable, "-c", _FORCED.format(path=os.path.abspath(path))],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-2000:]


_PATHS = r"""
import ds4py
m = ds4py.Model.load({path!r}, n_threads=2, n_ctx=512)
with m.new_session() as s:
    s.eval(list(range(300)))   # prefill (GEMM) past one 256-position KV block
    s.eval([5])                # decode (matvec, split-K attention)
"""


@pytest.mark.parametrize("force_scalar", [False, True])
@pytest.mark.parametrize("on", [False, True])
def test_paths_report(force_scalar, on):
    """DS4PY_PATHS=1 prints, once at exit, the variant each layer ran; it
    names the kernel the gate actually chose (so a wrong gate shows)."""
    path = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "ds4py", "models",
                                        "demo-q8_0.gguf"))
    env = {k: v for k, v in os.environ.items() if k not in ("DS4_FORCE_SCALAR", "DS4PY_PATHS")}
    if force_scalar:
        env["DS4_FORCE_SCALAR"] = "1"
    if on:
        env["DS4PY_PATHS"] = "1"
    r = subprocess.run([sys.executable, "-c", _PATHS.format(path=path)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    if not on:
        assert "DS4PY_PATHS" not in r.stderr
        return
    assert r.stderr.count("DS4PY_PATHS:") == 1
    lines = r.stderr.splitlines()
    # 12 trunk layers (GDN:attention 3:1) and the head
    for il in range(12):
        mine = [ln for ln in lines if ln.startswith(f"layer {il:3d}")]
        assert any("matvec Q8_0" in ln for ln in mine) and any("gemm Q8_0" in ln for ln in mine)
        kind = "attention" if il % 4 == 3 else "gdn recurrence"
        assert any(kind in ln for ln in mine), mine
    assert any(ln.startswith("head") for ln in lines)
    assert any("split-K decode" in ln for ln in lines)
    # matmul.c names its weight prefetch with the kernel (every ISA)
    assert all("prefetch 4096 B" in ln for ln in lines if "matvec" in ln or "gemm" in ln)
    if force_scalar:
        assert "scalar vec_dot" in r.stderr
        assert "q8x rows" not in r.stderr and "gdn_row (SIMD)" not in r.stderr
    elif "avx512" in ISAS:
        assert "avx512 q8_0 x q8x rows" in r.stderr and "gdn_row (SIMD)" in r.stderr


def test_paths_report_names_whole():
    """The report carries each kernel's whole name (the AVX-512 K-quant
    names are the longest: a 96-byte buffer once cut them mid-word), on the
    golden Q4_K_M model (Q4_K and Q6_K matrices)."""
    path = os.path.abspath(os.path.join(os.path.dirname(__file__), "golden", "models",
                                        "dense-q4_k_m.gguf"))
    env = {k: v for k, v in os.environ.items() if k != "DS4_FORCE_SCALAR"}
    env["DS4PY_PATHS"] = "1"
    r = subprocess.run([sys.executable, "-c", _PATHS.format(path=path)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if " gemm " in ln or " matvec " in ln]
    assert any("Q4_K" in ln for ln in lines) and any("Q6_K" in ln for ln in lines), lines
    assert all(ln.endswith("prefetch 4096 B") for ln in lines), lines
    for t in ("Q4_K", "Q6_K"):
        name = lib.ds4_matmul_rows_kernel(Q._isa(ISAS[-1]), _id(t))
        if name != ffi.NULL:   # the best ISA here has a multi-row kernel for t: named whole
            assert any(ffi.string(name).decode() in ln for ln in lines), (t, lines)
