"""ds4py's weight quantizers (ds4_quantize_weights) against llama.cpp.

The expected bytes in tests/golden/quants_weights/ were written by llama.cpp's
own ggml_quantize_chunk(type, ..., imatrix=NULL) (llama-cpp-python 0.3.36;
see that directory's README.md and manifest.json), never by ds4py. This test
needs no llama.cpp and runs in the default suite. A missing or altered
fixture FAILS (never skips). Regenerate with
`python3 tests/reference/make_weight_quant_fixtures.py`.

What must hold:
- quantize_weights(type, x) == llama.cpp's bytes, for every stored input
  (12 kinds x 2 rows, every row length) and type;
- re-quantizing the float32 golden models (tests/golden/models/) gives the
  bytes of llama.cpp's own Q4_K_M / Q8_0 / BF16 files of them;
- dequantize(quantize_weights(x)) is close to x, within bounds derived below
  from each format's step size (a sanity check independent of llama.cpp);
- rows and blocks are quantized independently (the documented contract that
  lets gguf_tools split work over threads), dst needs no alignment, and bad
  arguments raise QuantError.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ds4py import QuantError, quants
from ds4py._core import ffi, lib

FIX = Path(__file__).resolve().parent / "golden" / "quants_weights"

# Must match tests/reference/make_weight_quant_fixtures.py (the manifest test
# checks the committed set is exactly this).
TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K",
         "Q6_K", "IQ4_NL", "IQ4_XS"]
KINDS = ["normal", "heavy", "uniform", "zeros", "constant", "outlier", "tiny",
         "block_scaled", "one_sided", "grid", "nonfinite", "bit_patterns"]
ROWS_PER_KIND = 2
LENGTHS = {1: [32, 96, 224, 256, 512, 4096], 32: [32, 96, 224, 256, 512, 4096],
           256: [256, 512, 4096]}

_cache: dict[str, dict] = {}


def load(name: str) -> dict:
    """A fixture file as a dict of arrays; a missing file is a test failure."""
    if name not in _cache:
        path = FIX / name
        if not path.is_file():
            pytest.fail(f"missing reference fixture {path}; regenerate it with "
                        "`python3 tests/reference/make_weight_quant_fixtures.py` "
                        "(tests/golden/quants_weights/README.md)")
        with np.load(path, allow_pickle=False) as z:
            _cache[name] = {k: z[k] for k in z.files}
    return _cache[name]


def lengths(t: str) -> list[int]:
    return LENGTHS[quants.type_info(t).block_size]


def rows_of(kind: str) -> slice:
    k = KINDS.index(kind)
    return slice(k * ROWS_PER_KIND, (k + 1) * ROWS_PER_KIND)


# ------------------------------------------------------------- provenance --
def test_fixture_set_complete_and_unaltered():
    manifest_path = FIX / "manifest.json"
    if not manifest_path.is_file():
        pytest.fail(f"missing {manifest_path}; regenerate with "
                    "`python3 tests/reference/make_weight_quant_fixtures.py`")
    manifest = json.loads(manifest_path.read_text())
    assert set(manifest["files"]) == {"inputs.npz", "expected.npz"}
    for name, digest in manifest["files"].items():
        path = FIX / name
        assert path.is_file(), f"missing fixture {path}"
        assert hashlib.sha256(path.read_bytes()).hexdigest() == digest, f"{name} altered"
    assert manifest["types"] == TYPES and manifest["kinds"] == KINDS
    assert manifest["rows_per_kind"] == ROWS_PER_KIND
    assert {int(k): v for k, v in manifest["lengths"].items()} == LENGTHS
    assert (FIX / "README.md").is_file()
    inputs, expected = load("inputs.npz"), load("expected.npz")
    assert list(inputs["kinds"]) == KINDS
    want = {f"{t}_L{n}" for t in TYPES if t != "F32" for n in lengths(t)}
    assert set(expected) == want


def test_ds4py_writes_exactly_these_types():
    assert set(quants.WEIGHT_QUANT_TYPES) == set(TYPES)


# ------------------------------------------------------- byte identity --
@pytest.mark.parametrize("wtype", TYPES)
def test_matches_llamacpp_bytes(wtype):
    inputs, expected = load("inputs.npz"), load("expected.npz")
    info = quants.type_info(wtype)
    checked = 0
    for n in lengths(wtype):
        x = inputs[f"L{n}_x"]
        got = quants.quantize_weights(wtype, x)
        # F32: ggml_quantize_chunk is a memcpy (the generator checked that
        # against llama.cpp), so the input's own bytes are the reference.
        want = x.view(np.uint8).reshape(x.shape[0], -1) if wtype == "F32" \
            else expected[f"{wtype}_L{n}"]
        assert got.shape == want.shape
        if not np.array_equal(got, want):
            r, byte = (int(v[0]) for v in np.nonzero(got != want))
            pytest.fail(f"{wtype} n={n}: row {r} (kind {KINDS[r // ROWS_PER_KIND]}) "
                        f"block {byte // info.type_size} byte {byte % info.type_size}: "
                        f"got {got[r, byte]:#04x}, llama.cpp {want[r, byte]:#04x}")
        checked += x.shape[0]
    assert checked >= 3 * len(KINDS) * ROWS_PER_KIND


# The forward-pass reference models in tests/golden/models/ were quantized by
# llama.cpp itself (Q4_K_M: llama_model_quantize, no imatrix, 2 threads; Q8_0
# and BF16: its converter, convert_hf_to_gguf.py with gguf-py) from the same
# float32 weights the F32 file holds (tests/golden/README.md). Re-quantizing
# every tensor of the F32 file to the type the other file stores must give
# that file's bytes: an end-to-end check on real weight shapes, independent
# of the fixtures above.
@pytest.mark.parametrize("model", ["dense", "moe"])
@pytest.mark.parametrize("variant", ["q4_k_m", "q8_0", "bf16"])
def test_requantizing_golden_models_reproduces_llamacpp_files(model, variant):
    models = Path(__file__).resolve().parent / "golden" / "models"
    paths = [models / f"{model}-f32.gguf", models / f"{model}-{variant}.gguf"]
    for p in paths:
        if not p.is_file():
            pytest.fail(f"missing reference model {p} (tests/golden/README.md, `make golden`)")
    src = {t.name: t for t in gguf.GGUFReader(paths[0]).tensors}
    seen = set()
    for t in gguf.GGUFReader(paths[1]).tensors:
        name = gguf.GGMLQuantizationType(t.tensor_type).name
        x = np.asarray(src[t.name].data, dtype=np.float32).reshape(-1, int(t.shape[0]))
        got = quants.quantize_weights(name, x).reshape(-1)
        want = np.asarray(t.data).view(np.uint8).reshape(-1)
        assert np.array_equal(got, want), f"{model}-{variant} {t.name} ({name}) differs"
        seen.add(name)
    assert seen - {"F32"}, "no quantized tensor in the file"


# ------------------------------------------------------ round-trip sanity --
def _roundtrip(t: str, x: np.ndarray) -> np.ndarray:
    q = quants.quantize_weights(t, x)
    return np.stack([quants.dequantize(t, row, isa="scalar") for row in q])


# Worst-case per-block error of the 32-weight formats for finite inputs whose
# scales stay normal fp16 numbers. From the quantizers' definitions:
#   Q4_0: codes round(x/d)+8 with d = max/-8, clamped at 15: the side opposite
#         the max can be off by a whole step, so |err| <= amax/8; Q5_0: amax/16.
#   Q8_0: roundf(x/d), d = amax/127: |err| <= amax/254.
#   Q4_1: d = range/15, codes round-half-up of (x-min)/d: |err| <= range/30;
#         Q5_1: range/62.
# Plus storing d (and m) as fp16: relative 2^-11 each, times at most the
# largest code magnitude (q*|d16-d| <= amax*2^-11 resp. range*2^-11 and
# |m16-m| <= |min|*2^-11); we allow 2^-10 for those terms and 1e-6 relative
# for the float32 arithmetic.
def _block_bound(t: str, xb: np.ndarray) -> np.ndarray:
    xb = xb.astype(np.float64)
    amax = np.abs(xb).max(axis=-1)
    lo, hi = xb.min(axis=-1), xb.max(axis=-1)
    rng = hi - lo
    fp16 = 2.0 ** -10
    if t == "Q4_0":
        b = amax * (1 / 8 + fp16)
    elif t == "Q5_0":
        b = amax * (1 / 16 + fp16)
    elif t == "Q8_0":
        b = amax * (1 / 254 + fp16)
    elif t == "Q4_1":
        b = rng * (1 / 30 + fp16) + np.abs(lo) * fp16
    elif t == "Q5_1":
        b = rng * (1 / 62 + fp16) + np.abs(lo) * fp16
    else:
        raise ValueError(t)
    return b + 1e-6 * amax


# Kinds whose 32-blocks have normal-fp16 scales (no underflow/overflow, no
# Inf/NaN): the bound above applies to them.
MODERATE = ["normal", "heavy", "uniform", "zeros", "constant", "outlier", "one_sided", "grid"]


@pytest.mark.parametrize("wtype", ["Q4_0", "Q5_0", "Q8_0", "Q4_1", "Q5_1"])
def test_roundtrip_blockwise_error_bound(wtype):
    inputs = load("inputs.npz")
    for n in lengths(wtype):
        for kind in MODERATE:
            x = inputs[f"L{n}_x"][rows_of(kind)]
            y = _roundtrip(wtype, x)
            err = np.abs(y.astype(np.float64) - x).reshape(x.shape[0], -1, 32).max(axis=-1)
            bound = _block_bound(wtype, x.reshape(x.shape[0], -1, 32))
            bad = np.argwhere(err > bound)
            assert bad.size == 0, (f"{wtype} n={n} {kind}: block {bad[0].tolist()} error "
                                   f"{err[tuple(bad[0])]:.3g} > bound {bound[tuple(bad[0])]:.3g}")


# Relative RMS error ||x - x̂|| / ||x|| per row, for Gaussian and uniform rows.
# A uniform quantizer of step D has RMS error D/sqrt(12). For N(0, s^2)
# blocks of 32, E[max|x|] ~ 2.1s and E[range] ~ 4.1s (blocks of 16: max|x|
# ~ 1.8s), giving D: Q4_0 amax/8, Q5_0 amax/16, Q8_0 amax/127, Q4_1/Q4_K
# range/15, Q5_1/Q5_K range/31, Q6_K amax/32 (16-blocks); IQ4_NL/IQ4_XS use
# a non-uniform 16-level book over [-127, 113]*d with gaps up to 24*d around
# d ~ amax/127 (D ~ 14*amax/127 on average). The bound is 1.5x that nominal
# D/sqrt(12)/s (slack for the fp16 / 6-bit scale rounding and for the
# sampling spread of max and range); uniform rows have a smaller relative
# error than Gaussian ones under every one of these steps. F16/BF16 round to
# 11/8 significant bits: a step of at most 2^-10 / 2^-7 of |x|.
def _nominal_rel_rmse(t: str) -> float:
    step = {"Q4_0": 2.1 / 8, "Q5_0": 2.1 / 16, "Q8_0": 2.1 / 127,
            "Q4_1": 4.1 / 15, "Q4_K": 4.1 / 15, "Q5_1": 4.1 / 31, "Q5_K": 4.1 / 31,
            "Q6_K": 1.8 / 32, "IQ4_NL": 14 * 2.1 / 127, "IQ4_XS": 14 * 2.1 / 127,
            "F16": 2.0 ** -10, "BF16": 2.0 ** -7}[t]
    return step / math.sqrt(12)


@pytest.mark.parametrize("wtype", [t for t in TYPES if t != "F32"])
def test_roundtrip_rms_error_bound(wtype):
    inputs = load("inputs.npz")
    bound = 1.5 * _nominal_rel_rmse(wtype)
    for n in lengths(wtype):
        if n < 256:
            continue  # too few weights for an RMS statistic
        for kind in ("normal", "uniform"):
            x = inputs[f"L{n}_x"][rows_of(kind)].astype(np.float64)
            y = _roundtrip(wtype, x.astype(np.float32)).astype(np.float64)
            rel = np.sqrt(np.mean((y - x) ** 2, axis=1) / np.mean(x ** 2, axis=1))
            assert np.all(rel <= bound), f"{wtype} n={n} {kind}: rel RMSE {rel} > {bound:.4f}"


def test_f32_roundtrip_is_identity():
    x = load("inputs.npz")["L512_x"]
    assert np.array_equal(_roundtrip("F32", x).view(np.uint32), x.view(np.uint32))


# ---------------------------------------------------- layout contracts --
# Finite floats across many magnitudes (subnormal to ~1e6) and exact zeros.
_finite = st.one_of(
    st.floats(-1e6, 1e6, width=32, allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, -0.0, 1e-40, -3e-39, 0.125, -0.5]),
)


@st.composite
def _matrix(draw, wtype: str):
    bs = quants.type_info(wtype).block_size
    bs = max(bs, 32)
    rows = draw(st.integers(1, 3))
    blocks = draw(st.integers(1, 3))
    n = rows * blocks * bs
    vals = draw(st.lists(_finite, min_size=n, max_size=n))
    return np.array(vals, dtype=np.float32).reshape(rows, blocks * bs)


@pytest.mark.parametrize("wtype", TYPES)
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_rows_and_blocks_are_independent(wtype, data):
    """A matrix quantizes to its rows' quantizations, and a row to the
    concatenation of its blocks' (K-quants: 256-blocks): what lets callers
    split the work anywhere on a block boundary."""
    x = data.draw(_matrix(wtype))
    info = quants.type_info(wtype)
    bs = max(info.block_size, 32)
    per_block = bs // info.block_size * info.type_size
    whole = quants.quantize_weights(wtype, x)
    assert whole.shape == (x.shape[0], x.shape[1] // bs * per_block)
    for r in range(x.shape[0]):
        assert np.array_equal(quants.quantize_weights(wtype, x[r]), whole[r])
        for b in range(x.shape[1] // bs):
            one = quants.quantize_weights(wtype, x[r, b * bs:(b + 1) * bs])
            assert np.array_equal(one, whole[r, b * per_block:(b + 1) * per_block])


@pytest.mark.parametrize("wtype", ["Q8_0", "Q4_K", "IQ4_XS", "F16"])
def test_unaligned_destination(wtype):
    """dst needs no alignment (blocks are built locally and copied out)."""
    x = load("inputs.npz")["L512_x"][:3]
    want = quants.quantize_weights(wtype, x)
    buf = np.zeros(want.size + 8, dtype=np.uint8)
    err = ffi.new("ds4_error *")
    base = buf.ctypes.data
    off = next(o for o in range(1, 8) if (base + o) % 2 == 1)  # an odd address
    dst = ffi.cast("uint8_t *", ffi.from_buffer(buf)) + off
    src = ffi.cast("float *", ffi.from_buffer(np.ascontiguousarray(x)))
    rc = lib.ds4_quantize_weights(quants.type_info(wtype).id, src, dst, 3, 512, err)
    assert rc == 0, ffi.string(err.message).decode()
    assert np.array_equal(buf[off:off + want.size], want.reshape(-1))
    assert not buf[:off].any() and not buf[off + want.size:].any()


# ------------------------------------------------------------- errors --
def test_unsupported_and_unknown_types_raise():
    x = np.zeros((1, 256), np.float32)
    for t in ("Q8_1", "Q8_K", "Q2_K", "Q4_64A", "Q2_64A"):
        with pytest.raises(QuantError, match="not supported"):
            quants.quantize_weights(t, x)
    err = ffi.new("ds4_error *")
    assert lib.ds4_quantize_weights(4, ffi.NULL, ffi.NULL, 0, 0, err) == lib.DS4_ERR_BAD_TENSOR_TYPE
    assert lib.ds4_quantize_weights(-1, ffi.NULL, ffi.NULL, 0, 0, err) == \
        lib.DS4_ERR_BAD_TENSOR_TYPE


def test_bad_shapes_raise():
    with pytest.raises(QuantError, match="block size 256"):
        quants.quantize_weights("Q4_K", np.zeros((2, 288), np.float32))
    with pytest.raises(QuantError, match="block size 32"):
        quants.quantize_weights("Q4_0", np.zeros(33, np.float32))
    with pytest.raises(QuantError, match="1-D"):
        quants.quantize_weights("Q4_0", np.zeros((2, 2, 32), np.float32))
    err = ffi.new("ds4_error *")
    t = quants.type_info("Q4_0").id
    assert lib.ds4_quantize_weights(t, ffi.NULL, ffi.NULL, -1, 32, err) == lib.DS4_ERR_ARG
    assert lib.ds4_quantize_weights(t, ffi.NULL, ffi.NULL, 1, 32, err) == lib.DS4_ERR_ARG
    assert lib.ds4_quantize_weights(t, ffi.NULL, ffi.NULL, 1 << 40, 1 << 40, err) == \
        lib.DS4_ERR_ARG
    assert "overflow" in ffi.string(err.message).decode()
    # zero rows / zero-length rows: nothing to do, no pointer needed
    assert lib.ds4_quantize_weights(t, ffi.NULL, ffi.NULL, 0, 32, err) == 0
    assert quants.quantize_weights("Q4_0", np.zeros((3, 0), np.float32)).shape == (3, 0)


def test_q8_0_nan_scale_stored_as_ggml_base_does():
    """ggml_quantize_chunk(Q8_0) stores d with ggml-base's software fp16
    conversion (ggml-impl.h ggml_compute_fp32_to_fp16), which turns every NaN
    into sign|0x7e00; ds4's F16C-exact conversion would keep the payload. A
    NaN reaches d only as the last element of a block (ggml's MAX lets it
    through there; fabsf clears its sign). Checked live against llama.cpp
    when this was written; the committed fixtures hold no payload NaNs."""
    x = np.linspace(-1, 1, 32, dtype=np.float32)
    x[31] = np.array([0xFFA00001], np.uint32).view(np.float32)[0]  # signalling, payload
    q = quants.quantize_weights("Q8_0", x)
    assert q[:2].view(np.uint16)[0] == 0x7E00
