"""SIMD kernels (AVX2, AVX-512, NEON) against the scalar reference.

What each SIMD kernel set promises (csrc/quants/avx2.c, avx512.c):
  * to_float: bit-identical to scalar (compared as uint32 bit patterns, so
    -0.0 vs 0.0 or two different NaNs would fail);
  * the activation quantizers (Q8_0, Q8_1, Q8_K, F16, BF16): byte-identical
    to scalar, ties and non-finite inputs (NaN payloads too) included;
  * dots (paired activation type and plain f32): equal to scalar within the
    float-rounding bound derived in `dot_bound` below, deterministic, and
    independent of where the rows sit in memory;
  * no read past the end of a row (checked against a guard page).

The scalar kernels themselves are checked against llama.cpp/gguf-py
elsewhere; here scalar is the reference, and every expected value comes from
the scalar ISA, never from the ISA under test.
"""

from __future__ import annotations

import mmap
import platform
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ds4py import QuantError
from ds4py import quants as Q
from ds4py._core import ffi, lib

AVAILABLE = Q.available_isas()
# The SIMD variants of this architecture (the other architecture's kernels are
# tested where they run: NEON under qemu-aarch64 by `make test-neon`). A CPU
# of this architecture that lacks one (an x86-64 without AVX-512) skips it.
_ARM = platform.machine().lower() in ("arm64", "aarch64")
SIMD_ISAS = [
    pytest.param(isa, marks=pytest.mark.skipif(isa not in AVAILABLE,
                                               reason=f"this CPU lacks {isa}"))
    for isa in (("neon",) if _ARM else ("avx2", "avx512"))
]

# Every weight type the core computes with (its DS4_TYPE_DOT flag), and every
# type it can dequantize. The expected list guards against a type silently
# losing its kernels.
DOT_TYPES = [t.name for t in Q.TYPES if t.can_dot]
DEQ_TYPES = [t.name for t in Q.TYPES if t.can_dequantize]
EXPECTED_DOT_TYPES = {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                      "IQ4_NL", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "Q4_64A", "Q2_64A"}
ACT_QUANTIZERS = ["Q8_0", "Q8_1", "Q8_K", "F16", "BF16"]


# Half-precision fields inside each block (byte offset, "f16" | "bf16"), from
# the block structs in csrc/quants/quants.h (= ggml-common.h, ds4-notes §2).
# Random block bytes get these overwritten with finite values; every other
# byte (codes, packed scales) stays uniformly random.
HALF_FIELDS = {
    "Q4_0": [(0, "f16")], "Q4_1": [(0, "f16"), (2, "f16")], "Q5_0": [(0, "f16")],
    "Q5_1": [(0, "f16"), (2, "f16")], "Q8_0": [(0, "f16")], "Q8_1": [(0, "f16"), (2, "f16")],
    "IQ4_NL": [(0, "f16")], "Q4_K": [(0, "f16"), (2, "f16")], "Q5_K": [(0, "f16"), (2, "f16")],
    "Q6_K": [(208, "f16")], "IQ4_XS": [(0, "f16")],
    "Q4_64A": [(32, "bf16"), (34, "bf16")], "Q2_64A": [(16, "bf16"), (18, "bf16")],
}
# The additive (offset) field of the affine types: x = s*q + o with o = this
# field (times a 6-bit min for the K-quants). Zeroing it leaves the s*q part.
OFFSET_FIELD = {"Q4_1": 2, "Q5_1": 2, "Q4_K": 2, "Q5_K": 2, "Q4_64A": 34, "Q2_64A": 18}

BLOCK_COUNTS = [1, 3, 7, 33]  # odd, including a single block


def _info(t):
    return Q.type_info(t)


def quant_block(t):
    """Values per quantizer block; 37 for the per-element F16/BF16 so the
    vector loops' tails run too."""
    bs = _info(t).block_size
    return bs if bs > 1 else 37


def _finite_halves(rng, n, kind, wild):
    """n finite fp16/bf16 bit patterns. wild: any finite pattern (subnormals,
    huge values, -0); else tame magnitudes around 1e-2 as real scales have."""
    if wild:
        bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint32).astype(np.uint16)
        exp_mask = 0x7C00 if kind == "f16" else 0x7F80
        bits[(bits & exp_mask) == exp_mask] &= ~np.uint16(0x4000)  # Inf/NaN -> finite
        return bits
    vals = (rng.standard_normal(n) * 0.02).astype(np.float32)
    if kind == "f16":
        return vals.astype(np.float16).view(np.uint16)
    return (vals.view(np.uint32) >> 16).astype(np.uint16)


def random_row(t, nblocks, rng, wild=False):
    """Raw bytes of nblocks random blocks of type t with finite scales."""
    info = _info(t)
    nb = nblocks * info.block_size if info.block_size == 1 else nblocks
    if t == "F32":
        scale = 1.0 if not wild else 1e30
        return (rng.standard_normal(nb) * scale).astype(np.float32).view(np.uint8)
    if t in ("F16", "BF16"):
        return _finite_halves(rng, nb, t.lower(), wild).view(np.uint8)
    raw = rng.integers(0, 256, size=(nb, info.type_size), dtype=np.uint8)
    for off, kind in HALF_FIELDS.get(t, []):
        raw[:, off:off + 2] = _finite_halves(rng, nb, kind, wild).view(np.uint8).reshape(nb, 2)
    if t == "Q8_K":
        d = (rng.standard_normal(nb) * 0.01).astype(np.float32)
        raw[:, 0:4] = d.view(np.uint8).reshape(nb, 4)
    return raw.reshape(-1)


def nweights(t, raw):
    info = _info(t)
    return raw.size // info.type_size * info.block_size


# ---------------------------------------------------------------- setup --

def test_every_weight_type_has_kernels():
    assert set(DOT_TYPES) == EXPECTED_DOT_TYPES


@pytest.mark.parametrize("isa", SIMD_ISAS)
def test_isa_is_usable_when_the_cpu_has_it(isa):
    # available_isas() reports CPU support; the kernels must also be compiled
    # in, or every call below would fail with "not available".
    out = Q.dequantize("Q8_0", random_row("Q8_0", 1, np.random.default_rng(0)), isa=isa)
    assert out.shape == (32,)


# ---------------------------------------------------------- dequantize --

@pytest.mark.parametrize("isa", SIMD_ISAS)
@pytest.mark.parametrize("t", DEQ_TYPES)
def test_dequantize_bit_exact(isa, t):
    rng = np.random.default_rng(0xDE0 + lib_type_id(t))
    for nblocks in BLOCK_COUNTS:
        for wild in (False, True):
            raw = random_row(t, nblocks, rng, wild=wild)
            ref = Q.dequantize(t, raw, isa="scalar")
            got = Q.dequantize(t, raw, isa=isa)
            np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32),
                                          err_msg=f"{t} {isa} {nblocks} blocks wild={wild}")


@pytest.mark.parametrize("isa", SIMD_ISAS)
@pytest.mark.parametrize("t", ["F16", "BF16"])
def test_dequantize_every_half_pattern(isa, t):
    # All 65536 bit patterns: subnormals, +-0, Inf and NaNs (F16C's vcvtph2ps
    # quiets signaling NaNs; scalar.c documents doing the same). Odd count:
    # 65535 + the last pattern alone exercises the vector tail.
    raw = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.uint8)
    for cut in (raw, raw[:-2]):
        ref = Q.dequantize(t, cut, isa="scalar")
        got = Q.dequantize(t, cut, isa=isa)
        np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))


def lib_type_id(t):
    return _info(t).id


# ----------------------------------------------------------- quantizers --

def tie_block(rng, size, first_sign, adjacent=False):
    """A block whose values land exactly on .5 after scaling: the largest
    |x| is 127*2^k (so the scale factor is a power of two, exact) and the
    others are (k + 0.5)*2^k. Two elements of equal |x| and opposite sign,
    the first with `first_sign`, test Q8_K's first-of-the-largest rule;
    `adjacent` puts them side by side (so inside one vector's lanes)."""
    p = 2.0 ** int(rng.integers(-20, 20))
    x = (rng.integers(-126, 126, size=size) + 0.5).astype(np.float32)
    if adjacent:
        i = int(rng.integers(0, size // 8)) * 8 + int(rng.integers(0, 7))
        i, j = i, i + 1
    else:
        i, j = sorted(rng.choice(size, size=2, replace=False))
    x[i], x[j] = 127.0 * first_sign, -127.0 * first_sign
    return (x * np.float32(p)).astype(np.float32)


def quantizer_inputs(rng, bs):
    """Rows of 3 blocks each: normal data, ties, zeros/-0, tiny/huge, and
    non-finite values (the byte-identical promise covers them too)."""
    rows = []
    for scale in (1.0, 1e-30, 1e30, 3e-39):
        rows.append((rng.standard_normal(3 * bs) * scale).astype(np.float32))
    rows.append(np.concatenate([tie_block(rng, bs, s) for s in (1, -1, 1)]))
    rows.append(np.concatenate([tie_block(rng, bs, s, adjacent=True) for s in (-1, 1, -1)]))
    z = np.zeros(3 * bs, dtype=np.float32)
    z[bs:2 * bs] = -0.0
    z[2 * bs + 5] = 1e-45  # a lone subnormal
    rows.append(z)
    special = rng.standard_normal(3 * bs).astype(np.float32)
    special[3] = np.inf
    special[bs + 7] = np.nan
    special[2 * bs + 1] = -np.inf
    special[2 * bs + 2] = np.nan
    rows.append(special)
    # NaNs with payloads (quiet and signaling, both signs): Q8_K's magic-add
    # rounding turns the payload bits into the stored code, Q8_0's
    # cvtps2dq does not; SIMD must follow the reference either way.
    payload = rng.standard_normal(3 * bs).astype(np.float32)
    nans = np.array([0x7FC00005, 0xFFC00123, 0x7F800001, 0xFFBFFFFF],
                    dtype=np.uint32).view(np.float32)
    payload[[1, bs + 2, 2 * bs + 3, 2 * bs + 9]] = nans
    rows.append(payload)
    return rows


@pytest.mark.parametrize("isa", SIMD_ISAS)
@pytest.mark.parametrize("t", ACT_QUANTIZERS)
def test_quantizer_byte_identical(isa, t):
    rng = np.random.default_rng(0x0A + lib_type_id(t))
    bs = quant_block(t)
    for x in quantizer_inputs(rng, bs):
        for nblocks in (1, 3):
            xs = x[: nblocks * bs]
            ref = Q.quantize(t, xs, isa="scalar")
            got = Q.quantize(t, xs, isa=isa)
            np.testing.assert_array_equal(got, ref, err_msg=f"{t} {isa} {xs[:8]}")


@pytest.mark.parametrize("isa", SIMD_ISAS)
def test_quantizer_ties_round_to_even(isa):
    # Independent of scalar: with max |x| = 127 the Q8_0 scale is exactly 1,
    # so 2.5 -> 2, 3.5 -> 4, -2.5 -> -2 (nearest-even, llama.cpp's x86 rule).
    x = np.zeros(32, dtype=np.float32)
    x[:5] = [127.0, 2.5, 3.5, -2.5, -0.5]
    qs = Q.quantize("Q8_0", x, isa=isa)[2:].view(np.int8)
    assert list(qs[:5]) == [127, 2, 4, -2, 0]


_f32_any = st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True)


@pytest.mark.parametrize("isa", SIMD_ISAS)
@pytest.mark.parametrize("t", ACT_QUANTIZERS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_quantizer_byte_identical_hypothesis(isa, t, data):
    bs = quant_block(t)
    x = data.draw(hnp.arrays(np.float32, bs, elements=_f32_any))
    np.testing.assert_array_equal(Q.quantize(t, x, isa=isa), Q.quantize(t, x, isa="scalar"))


# ----------------------------------------------------------------- dots --

U = 2.0 ** -24  # unit roundoff of float32


def act_values(t, act, n):
    """The activation row as exact float64 values: f32 as is, else the
    scalar dequantization of the quantized blocks (d*q, exact in f32)."""
    if t == "F32":
        return np.asarray(act, dtype=np.float64)
    return Q.dequantize(t, act, isa="scalar").astype(np.float64)


def magnitude(t, raw, a):
    """M = sum_i (|s_i*q_i| + |o_i|) * |a_i| with w_i = s_i*q_i + o_i split
    into its scaled-code part and its offset part (o = 0 for the symmetric
    types). The offset part is read off by zeroing the offset field."""
    w = Q.dequantize(t, raw, isa="scalar").astype(np.float64)
    if t in OFFSET_FIELD:
        info = _info(t)
        raw0 = raw.copy().reshape(-1, info.type_size)
        off = OFFSET_FIELD[t]
        raw0[:, off:off + 2] = 0
        ws = Q.dequantize(t, raw0.reshape(-1), isa="scalar").astype(np.float64)
    else:
        ws = w
    return float(np.sum((np.abs(ws) + np.abs(w - ws)) * np.abs(a)))


def dot_bound(n, m):
    """|simd - scalar| <= 2 * 1.01 * (n + 8) * u * M.

    Both kernels evaluate the same exact value S = sum over the row's terms:
    the integer parts of a block are exact in both; what differs is how the
    float terms (a product of <= 4 stored factors each, e.g. (d_x*d_y)*isum,
    or w_i*a_i for f32 activations) are formed and summed. Forming a term
    costs <= 4 roundings, and summing N terms in ANY order (the scalar's
    lanes/double, the SIMD's vector lanes and trees) perturbs each by at most
    (N-1) roundings, so each result is within (N + 3) * u * sum|term| of S
    (first order; N*u < 1e-3 here). N <= n (at most one term per weight),
    giving (n + 8) with margin. sum|term| <= M up to the fp16 rounding of
    Q8_1's stored s = d*sum(q) (relative 2^-11) and the rounding in reading
    off o_i: the 1.01. Two results each within that of S: the 2."""
    return 2.0 * 1.01 * (n + 8) * U * m + 1e-35


def _paired_act(t, n, rng):
    info = _info(t)
    x = rng.standard_normal(n).astype(np.float32)
    if info.vec_dot_type == "F32":
        return "F32", x
    # Quantized by scalar: the activation is input data here, not under test.
    return info.vec_dot_type, Q.quantize(info.vec_dot_type, x, isa="scalar")


@pytest.mark.parametrize("isa", SIMD_ISAS)
@pytest.mark.parametrize("t", DOT_TYPES)
def test_dots_within_bound(isa, t):
    rng = np.random.default_rng(0xD07 + lib_type_id(t))
    for nblocks in BLOCK_COUNTS:
        for _row in range(3):  # a few rows of the same length (a tiny matrix)
            raw = random_row(t, nblocks, rng)
            n = nweights(t, raw)
            act_t, act = _paired_act(t, n, rng)
            x = rng.standard_normal(n).astype(np.float32)
            for at, a in ((act_t, act), ("F32", x)):
                ref = Q.vec_dot(t, raw, a, act_type=at, isa="scalar")
                got = Q.vec_dot(t, raw, a, act_type=at, isa=isa)
                bound = dot_bound(n, magnitude(t, raw, act_values(at, a, n)))
                assert abs(got - ref) <= bound, (
                    f"{t}x{at} {isa} n={n}: {got!r} vs scalar {ref!r}, bound {bound:.3g}")


@pytest.mark.parametrize("isa", SIMD_ISAS)
@pytest.mark.parametrize("t", ["F32", "F16", "BF16"])
def test_float_dots_odd_lengths(isa, t):
    # Block size 1: every length, so each vector-tail path is taken.
    rng = np.random.default_rng(0xF1 + lib_type_id(t))
    for n in list(range(1, 70)) + [127, 129, 1023, 4097]:
        raw = random_row(t, n, rng)
        at, act = _paired_act(t, n, rng)
        x = rng.standard_normal(n).astype(np.float32)
        for a_t, a in ((at, act), ("F32", x)):
            ref = Q.vec_dot(t, raw, a, act_type=a_t, isa="scalar")
            got = Q.vec_dot(t, raw, a, act_type=a_t, isa=isa)
            bound = dot_bound(n, magnitude(t, raw, act_values(a_t, a, n)))
            assert abs(got - ref) <= bound, f"{t}x{a_t} {isa} n={n}: {got} vs {ref}"


@pytest.mark.parametrize("isa", SIMD_ISAS)
def test_dot_detects_a_wrong_answer(isa):
    # The bound is tight enough to matter: moving one Q4_K code by 8 steps in
    # a one-block row shifts the dot by more than twice the bound, and the
    # SIMD kernel sees exactly that shift (within the bound).
    rng = np.random.default_rng(5)
    raw = random_row("Q4_K", 1, rng)
    n = nweights("Q4_K", raw)
    act_t, act = _paired_act("Q4_K", n, rng)
    a = act_values(act_t, act, n)
    bound = dot_bound(n, magnitude("Q4_K", raw, a))
    ref = Q.vec_dot("Q4_K", raw, act, act_type=act_t, isa="scalar")
    w = Q.dequantize("Q4_K", raw, isa="scalar").astype(np.float64)
    for byte in range(16, 16 + 128):  # the code bytes; skip codes whose scale is 0
        bad = raw.copy()
        bad[byte] ^= 0x08
        shift = float(np.dot(Q.dequantize("Q4_K", bad, isa="scalar") - w, a))
        if abs(shift) > 4 * bound:
            break
    else:
        pytest.fail("no resolvable single-code change found")
    got = Q.vec_dot("Q4_K", bad, act, act_type=act_t, isa=isa)
    assert abs((got - ref) - shift) <= 2 * bound


# ------------------------------------------------ determinism / memory --

def _ptr_at(buf, offset):
    return ffi.cast("char *", ffi.from_buffer(buf)) + offset


@pytest.mark.parametrize("isa", SIMD_ISAS)
@pytest.mark.parametrize("t", DOT_TYPES)
def test_dots_deterministic_and_placement_independent(isa, t):
    # Same inputs at different addresses (aligned as the block structs need,
    # but not to the vector width) must give the same bits, every time.
    rng = np.random.default_rng(0x5EED + lib_type_id(t))
    raw = random_row(t, 7, rng)
    n = nweights(t, raw)
    act_t, act = _paired_act(t, n, rng)
    act_t_id = _info(act_t).id
    act_bytes = np.ascontiguousarray(act).view(np.uint8)
    results = set()
    for shift in (0, 4, 8, 20, 36):
        wbuf = np.zeros(raw.size + 128, dtype=np.uint8)
        abuf = np.zeros(act_bytes.size + 128, dtype=np.uint8)
        base_w = (-wbuf.ctypes.data) % 64 + shift  # 64-aligned + shift
        base_a = (-abuf.ctypes.data) % 64 + (60 - shift)
        wbuf[base_w:base_w + raw.size] = raw
        abuf[base_a:base_a + act_bytes.size] = act_bytes
        out = ffi.new("float *")
        err = ffi.new("ds4_error *")
        rc = lib.ds4_vec_dot(Q._isa(isa), _info(t).id, _ptr_at(wbuf, base_w), act_t_id,
                             _ptr_at(abuf, base_a), n, out, err)
        assert rc == 0, ffi.string(err.message)
        results.add(np.float32(out[0]).view(np.uint32).item())
        again = Q.vec_dot(t, raw, act, act_type=act_t, isa=isa)  # via the Python API
        results.add(np.float32(again).view(np.uint32).item())
    assert len(results) == 1


GUARD_SCRIPT = textwrap.dedent(r"""
    import ctypes, mmap, sys
    import numpy as np
    from ds4py import quants as Q
    from ds4py._core import ffi, lib
    isa = Q._isa(sys.argv[1])
    PAGE = mmap.PAGESIZE
    libc = ctypes.CDLL(None)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

    class Guarded:
        # nbytes placed so that they end exactly where a PROT_NONE page starts.
        def __init__(self, data):
            data = np.ascontiguousarray(data).view(np.uint8)
            npages = (data.size + PAGE - 1) // PAGE + 1
            self.m = mmap.mmap(-1, (npages + 1) * PAGE)
            self.arr = np.frombuffer(self.m, dtype=np.uint8)
            base = self.arr.ctypes.data
            guard = base + npages * PAGE
            assert libc.mprotect(guard, PAGE, 0) == 0
            self.off = npages * PAGE - data.size
            self.arr[self.off:self.off + data.size] = data
            self.ptr = ffi.cast("char *", base + self.off)

    rng = np.random.default_rng(1)
    err = ffi.new("ds4_error *")
    out1 = ffi.new("float *")
    for t in [t for t in Q.TYPES if t.can_dot]:
        nb = 3
        n = nb * t.block_size if t.block_size > 1 else 37
        raw = rng.integers(0, 256, size=n // t.block_size * t.type_size, dtype=np.uint8)
        raw[1::2] &= 0x3B  # finite 16-bit fields (scale values do not matter here)
        w = Guarded(raw)
        x = rng.standard_normal(n).astype(np.float32)
        xf = Guarded(x)
        dst = Guarded(np.zeros(n, dtype=np.float32))
        assert lib.ds4_dequantize_row(isa, t.id, w.ptr, ffi.cast("float *", dst.ptr), n, err) == 0
        assert lib.ds4_vec_dot(isa, t.id, w.ptr, lib.DS4_TYPE_F32, xf.ptr, n, out1, err) == 0
        at = Q.type_info(t.vec_dot_type)
        if at.name != "F32":
            a = Guarded(Q.quantize(at.name, x, isa="scalar"))
            assert lib.ds4_vec_dot(isa, t.id, w.ptr, at.id, a.ptr, n, out1, err) == 0
    for name in ("Q8_0", "Q8_1", "Q8_K", "F16", "BF16"):
        at = Q.type_info(name)
        n = 3 * at.block_size if at.block_size > 1 else 37
        src = Guarded(rng.standard_normal(n).astype(np.float32))
        dst = Guarded(np.zeros(n // at.block_size * at.type_size, dtype=np.uint8))
        assert lib.ds4_quantize_row(isa, at.id, ffi.cast("float *", src.ptr), dst.ptr, n, err) == 0
    print("ok")
""")


@pytest.mark.parametrize("isa", SIMD_ISAS)
def test_no_read_or_write_past_the_row(isa):
    # Every input/output row ends at a PROT_NONE page: a vector load or store
    # past its end kills the child with SIGSEGV.
    if not hasattr(mmap, "PAGESIZE") or not sys.platform.startswith(("linux", "darwin")):
        pytest.skip("needs mmap + mprotect")
    r = subprocess.run([sys.executable, "-c", GUARD_SCRIPT, isa], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stderr[-2000:])


# --------------------------------------------------------------- ladder --

def test_unavailable_isa_raises():
    missing = [i for i in ("avx2", "avx512", "neon") if i not in AVAILABLE]
    if not missing:
        pytest.skip("every SIMD ISA is available here")
    raw = random_row("Q8_0", 1, np.random.default_rng(0))
    for isa in missing:
        with pytest.raises(QuantError, match=f"(?i){isa}.*not available"):
            Q.dequantize("Q8_0", raw, isa=isa)
        with pytest.raises(QuantError, match=f"(?i){isa}.*not available"):
            Q.vec_dot("Q8_0", raw, np.zeros(32, np.float32), isa=isa)
        with pytest.raises(QuantError, match=f"(?i){isa}.*not available"):
            Q.quantize("Q8_0", np.zeros(32, np.float32), isa=isa)


def test_auto_is_the_resolved_isa():
    # AUTO must run exactly the kernels of the ISA that ds4_isa_auto names
    # (the best available, or scalar under DS4_FORCE_SCALAR=1).
    auto_name = ffi.string(lib.ds4_isa_name(lib.ds4_isa_auto())).decode()
    assert auto_name in AVAILABLE
    rng = np.random.default_rng(11)
    for t in ("Q4_K", "Q8_0", "Q4_64A", "F16"):
        raw = random_row(t, 5, rng)
        n = nweights(t, raw)
        act_t, act = _paired_act(t, n, rng)
        x = rng.standard_normal(n).astype(np.float32)
        for at, a in ((act_t, act), ("F32", x)):
            got = Q.vec_dot(t, raw, a, act_type=at, isa="auto")
            exp = Q.vec_dot(t, raw, a, act_type=at, isa=auto_name)
            assert np.float32(got).view(np.uint32) == np.float32(exp).view(np.uint32)
    x = rng.standard_normal(256).astype(np.float32)
    np.testing.assert_array_equal(Q.quantize("Q8_K", x, isa="auto"),
                                  Q.quantize("Q8_K", x, isa=auto_name))
