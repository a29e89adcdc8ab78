"""ds4py's quant kernels against llama.cpp's ggml, live, on fresh
hypothesis-generated inputs (opt-in: `make test-reference`).

The same four properties as tests/test_quants_llamacpp.py (which checks the
committed fixtures in the default suite), on many more inputs, plus
gguf-py's numpy dequantizer as a second, independent reference. Needs
llama-cpp-python built as tests/golden/quants/README.md describes; if it is
missing this module fails to import, i.e. the opt-in run FAILS rather than
skipping.
"""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import llamacpp_ggml as L
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from make_quant_fixtures import SCALE_FIELDS, dot_magnitudes

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_quants_llamacpp import PAIRED, WEIGHT_TYPES, act_key, dot_bound  # noqa: E402

from ds4py import quants  # noqa: E402

pytestmark = pytest.mark.reference

G = L.load()
ISAS = quants.available_isas()
# gguf-py's numpy dequantizers exist for these (gguf.quants._type_traits).
GGUF_DEQUANT = {"F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K",
                "Q6_K", "IQ4_NL", "IQ4_XS"}

# Fresh inputs each run (no derandomize): this is a search, the fixtures are
# the fixed regression set. 150 examples x ~13 types keeps a run ~1-2 min.
LIVE = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def tid(name: str) -> int:
    return L.GGML_TYPES[name]


# -------------------------------------------------------------- strategies --
def finite_f32(bound: float):
    return st.floats(min_value=-bound, max_value=bound, width=32, allow_nan=False,
                     allow_infinity=False, allow_subnormal=True)


@st.composite
def row_length(draw, name: str) -> int:
    bs = G.block_size(tid(name))
    if bs == 1:
        return draw(st.integers(1, 300))
    if bs == 32:
        return 32 * draw(st.sampled_from([1, 2, 3, 5, 7, 9]))
    return 256 * draw(st.sampled_from([1, 2, 3]))


@st.composite
def float_row(draw, n: int, bound: float = 1e3) -> np.ndarray:
    """Values from hypothesis (edge values, repeats, zeros, subnormals),
    optionally with 32-blocks rescaled over 1e-8..1 (fp16 scales near
    underflow)."""
    mode = draw(st.sampled_from(["hypothesis", "normal", "heavy"]))
    if mode == "hypothesis":
        # hnp.arrays draws a few distinct elements and a fill value: repeated
        # values, exact ties for amax, zeros, subnormals.
        x = draw(hnp.arrays(np.float32, n, elements=finite_f32(bound)))
    else:
        # Dense variety that hypothesis' sparse arrays lack; the seed shrinks.
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        v = rng.standard_normal(n) if mode == "normal" else rng.standard_t(1.5, n)
        v[rng.random(n) < 0.2] = 0.0
        x = np.clip(v * 10.0 ** draw(st.floats(-3, 2)), -bound, bound).astype(np.float32)
    if draw(st.booleans()):
        scales = draw(hnp.arrays(np.float64, -(-n // 32), elements=st.floats(-8, 0)))
        x = (x.astype(np.float64) * np.repeat(10.0 ** scales, 32)[:n]).astype(np.float32)
    return np.ascontiguousarray(x)


@st.composite
def tie_row(draw, n: int) -> np.ndarray:
    """x*127/amax exactly k+0.5 in every 32-block (see make_quant_fixtures.tie_vectors)."""
    e = draw(st.integers(-14, 8))
    k = draw(hnp.arrays(np.int64, n, elements=st.integers(0, 126)))
    sg = draw(hnp.arrays(np.int64, n, elements=st.sampled_from([-1, 1])))
    x = sg * (k + 0.5) * 2.0 ** e
    for b in range(0, n, 32):
        x[b + draw(st.integers(0, 31))] = draw(st.sampled_from([-1, 1])) * 127.0 * 2.0 ** e
    return x.astype(np.float32)


@st.composite
def weight_row(draw, name: str, n: int, allow_nonfinite: bool = False) -> np.ndarray:
    """Raw bytes of one row: llama.cpp's quantizer on hypothesis floats, or
    arbitrary bytes with every fp16 scale field forced finite (the top
    exponent bit cleared), so odd code patterns are covered."""
    t = tid(name)
    nbytes = G.row_bytes(t, n)
    if draw(st.booleans()):
        return G.quantize_chunk(t, draw(float_row(n, bound=1e2)))
    if draw(st.booleans()):
        raw = draw(hnp.arrays(np.uint8, nbytes))
    else:
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        raw = rng.integers(0, 256, nbytes, dtype=np.uint16).astype(np.uint8)
    if name in SCALE_FIELDS:
        blocks = raw.reshape(-1, G.type_size(t))
        for off, _ in SCALE_FIELDS[name]:
            h = blocks[:, off:off + 2].copy().view(np.uint16)
            bad = (h & 0x7C00) == 0x7C00
            h[bad] &= np.uint16(0xBFFF)
            blocks[:, off:off + 2] = h.view(np.uint8).reshape(-1, 2)
    elif not allow_nonfinite and name in ("F16", "BF16", "F32"):
        # Keep products finite in a dot: clamp the exponent to 2^-40..2^40.
        if name == "F16":
            h = raw.view(np.uint16)
            h[(h & 0x7C00) == 0x7C00] &= np.uint16(0xBFFF)
        elif name == "BF16":
            h = raw.view(np.uint16)
            e = (h >> 7) & 0xFF
            big = (e > 127 + 40) & (e != 0)
            h[big] = (h[big] & np.uint16(0x807F)) | np.uint16((127 + 40) << 7)
        else:
            u = raw.view(np.uint32)
            e = (u >> 23) & 0xFF
            big = e > 127 + 40
            u[big] = (u[big] & np.uint32(0x807FFFFF)) | np.uint32((127 + 40) << 23)
    return raw


# ------------------------------------------------------------------ tests --
@pytest.mark.parametrize("name", WEIGHT_TYPES)
@LIVE
@given(data=st.data())
def test_dequantize_live(name, data):
    n = data.draw(row_length(name))
    raw = data.draw(weight_row(name, n, allow_nonfinite=True))
    if name == "F32":
        want = raw.view(np.uint32)  # ggml has no to_float for F32: identity
    else:
        want = G.to_float(tid(name), raw, n).view(np.uint32)
    for isa in ISAS:
        got = quants.dequantize(name, raw, isa=isa).view(np.uint32)
        assert np.array_equal(got, want), f"{name} n={n} isa={isa}"
    if name in GGUF_DEQUANT:
        # gguf-py (numpy) is bit-exact with ggml on finite values; NaN
        # payload handling of numpy's float16 conversion is not ggml's, so
        # only finite outputs are compared.
        g = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[name]).astype(np.float32)
        g = g.reshape(-1).view(np.uint32)
        fin = np.isfinite(want.view(np.float32))
        assert np.array_equal(g[fin], want[fin]), f"gguf-py disagrees with ggml: {name} n={n}"


@pytest.mark.parametrize("act", ["Q8_0", "Q8_1", "Q8_K", "F16", "BF16"])
@LIVE
@given(data=st.data())
def test_quantize_live(act, data):
    bs = {"Q8_K": 256, "Q8_0": 32, "Q8_1": 32}.get(act, 1)
    n = bs * data.draw(st.integers(1, 3)) if bs > 1 else data.draw(st.integers(1, 300))
    if bs > 1 and data.draw(st.integers(0, 3)) == 0:
        x = data.draw(tie_row(n))
    else:
        x = data.draw(float_row(n))
    want = G.from_float_cpu(tid(act), x)
    for isa in ISAS:
        got = np.asarray(quants.quantize(act, x, isa=isa)).view(np.uint8).reshape(-1)
        assert np.array_equal(got, want), f"{act} n={n} isa={isa}"
    if act == "Q8_0":
        ref = G.quantize_chunk(tid("Q8_0"), x)
        got = np.asarray(quants.quantize_q8_0_ref(x)).view(np.uint8).reshape(-1)
        assert np.array_equal(got, ref), f"Q8_0 ref n={n}"


@pytest.mark.parametrize("name", WEIGHT_TYPES)
@LIVE
@given(data=st.data())
def test_vec_dot_live(name, data):
    n = data.draw(row_length(name))
    w = data.draw(weight_row(name, n))
    x = data.draw(float_row(n))
    paired = PAIRED[name]
    t = tid(name)
    aq = x.view(np.uint8) if paired == "F32" else G.from_float_cpu(tid(paired), x)
    want = float(G.vec_dot(t, w, aq, n))
    absterms, allow = dot_magnitudes(G, name, w, aq, n)
    bound = dot_bound(name, n, absterms, allow)
    act = x if paired == "F32" else aq
    for isa in ISAS:
        got = quants.vec_dot(name, w, act, act_type=paired, isa=isa)
        assert abs(np.float64(got) - want) <= bound, (
            f"{name} x {paired} n={n} isa={isa}: ds4py {got!r} llama.cpp {want!r} "
            f"bound {bound:.3g}")
        if paired != "F32":
            own = np.asarray(quants.quantize(paired, x, isa=isa)).view(np.uint8).reshape(-1)
            assert np.array_equal(own, aq), f"{paired} activation n={n} isa={isa}"


def test_act_key_names_fixture_members():
    # guards the shared helper the fixtures and this test both use
    assert act_key("Q8_K") == "q8_K" and act_key("Q8_0") == "q8_0"
