"""ds4py's quant kernels against llama.cpp, through committed fixtures.

The expected values in tests/golden/quants/ were produced by llama.cpp's own
ggml code (llama-cpp-python 0.3.36, see that directory's README.md and
manifest.json), never by ds4py. This test needs no llama.cpp: it runs in the
default suite. A missing or altered fixture FAILS (never skips): CI must not
quietly lose its reference. Regenerate with `make golden-quants`.

What must hold, for every kernel ISA this machine can run:
- dequantize == llama.cpp to_float, bit for bit (NaN payloads included);
- quantize(activation type) == llama.cpp's CPU from_float, byte for byte
  (x86 build: Q8_0/Q8_1 round x*127/amax to nearest-even);
- quantize_q8_0_ref == ggml_quantize_chunk(Q8_0) (roundf, ties away);
- vec_dot == llama.cpp's CPU vec_dot within a rounding bound derived below.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from ds4py import quants

FIX = Path(__file__).resolve().parent / "golden" / "quants"

# Must match tests/reference/make_quant_fixtures.py; the manifest test checks
# that the committed files are exactly these.
WEIGHT_TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"]
ACT_TYPES = ["Q8_0", "Q8_1", "Q8_K", "F16", "BF16"]
PAIRED = {"F32": "F32", "F16": "F16", "BF16": "BF16", "Q8_0": "Q8_0", "Q4_0": "Q8_0",
          "Q4_1": "Q8_1", "Q5_0": "Q8_0", "Q5_1": "Q8_1", "Q4_K": "Q8_K", "Q5_K": "Q8_K",
          "Q6_K": "Q8_K", "IQ4_NL": "Q8_0", "IQ4_XS": "Q8_K"}
ISAS = quants.available_isas()
EPS32 = 2.0 ** -23

_cache: dict[str, dict] = {}


def load(name: str) -> dict:
    """A fixture file as a dict of arrays; a missing file is a test failure."""
    if name not in _cache:
        path = FIX / name
        if not path.is_file():
            pytest.fail(f"missing reference fixture {path}; regenerate it with "
                        f"`make golden-quants` (tests/golden/quants/README.md)")
        with np.load(path, allow_pickle=False) as z:
            _cache[name] = {k: z[k] for k in z.files}
    return _cache[name]


def act_key(t: str) -> str:
    return {"Q8_K": "q8_K"}.get(t, t.lower())


def first_diff(a: np.ndarray, b: np.ndarray) -> str:
    i = int(np.flatnonzero(a != b)[0])
    return f"first difference at index {i}: got {a[i]:#x}, llama.cpp {b[i]:#x}"


# ------------------------------------------------------------- provenance --
def test_fixture_set_complete_and_unaltered():
    manifest_path = FIX / "manifest.json"
    if not manifest_path.is_file():
        pytest.fail(f"missing {manifest_path}; regenerate with `make golden-quants`")
    manifest = json.loads(manifest_path.read_text())
    expected = {"activations.npz"} | {f"weights_{t}.npz" for t in WEIGHT_TYPES}
    assert set(manifest["files"]) == expected
    for name, digest in manifest["files"].items():
        path = FIX / name
        assert path.is_file(), f"missing fixture {path}"
        assert hashlib.sha256(path.read_bytes()).hexdigest() == digest, f"{name} altered"
    assert (FIX / "README.md").is_file()


def test_tie_vectors_separate_the_two_llamacpp_quantizers():
    """The fixture itself must show that llama.cpp's CPU Q8_0 quantizer and
    its reference one round the k+0.5 ties differently, else the two
    quantize tests below could not tell which one ds4py follows."""
    a = load("activations.npz")
    x = a["tie_x"]
    cpu = a["tie_q8_0"].reshape(x.shape[0], -1, 34)[:, :, 2:].view(np.int8).reshape(x.shape)
    ref = a["tie_q8_0_ref"].reshape(x.shape[0], -1, 34)[:, :, 2:].view(np.int8).reshape(x.shape)
    # Scales are powers of two, so x*127/amax is exactly the half-integer
    # h; ref rounds it away from zero, the CPU path to the even neighbour.
    s = np.abs(x).reshape(x.shape[0], -1, 32).max(axis=2, keepdims=True) / 127.0
    h = (x.reshape(x.shape[0], -1, 32) / s).reshape(x.shape)
    assert np.all(cpu == np.round(h))                       # numpy rounds half to even
    assert np.all(ref == np.sign(h) * np.floor(np.abs(h) + 0.5))
    assert np.count_nonzero(cpu != ref) > 100


# ---------------------------------------------------------------- dequant --
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("wtype", WEIGHT_TYPES)
def test_dequantize_matches_llamacpp_bitwise(wtype, isa):
    w = load(f"weights_{wtype}.npz")
    checked = 0
    for n in w["lengths"]:
        raw, deq = w[f"L{n}_raw"], w[f"L{n}_deq"]
        for r in range(raw.shape[0]):
            got = np.asarray(quants.dequantize(wtype, raw[r], isa=isa), dtype=np.float32)
            assert got.shape == (n,)
            bits = got.view(np.uint32)
            assert np.array_equal(bits, deq[r]), \
                f"{wtype} n={n} row {r} (kind {w[f'L{n}_kind'][r]}): {first_diff(bits, deq[r])}"
            checked += 1
    if "all_raw" in w:  # every 16-bit pattern: subnormals, inf, NaN payloads
        got = np.asarray(quants.dequantize(wtype, w["all_raw"], isa=isa), dtype=np.float32)
        assert np.array_equal(got.view(np.uint32), w["all_deq"]), \
            f"{wtype} all patterns: {first_diff(got.view(np.uint32), w['all_deq'])}"
        checked += 1
    assert checked >= 20


# --------------------------------------------------------------- quantize --
def _quantized_rows(a: dict, key: str):
    """(x, expected) pairs for one activation key suffix, over all lengths."""
    for k in sorted(a):
        if k.startswith("L") and k.endswith("_" + key):
            n = k[1:].split("_")[0]
            x = a[f"L{n}_x"]
            yield from ((f"L{n}[{i}]", x[i], a[k][i]) for i in range(x.shape[0]))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("atype", ACT_TYPES)
def test_quantize_matches_llamacpp_cpu_from_float(atype, isa):
    a = load("activations.npz")
    key = act_key(atype)
    cases = list(_quantized_rows(a, key))
    if atype.startswith("Q8"):
        cases += [(f"tie[{i}]", a["tie_x"][i], a[f"tie_{key}"][i]) for i in range(len(a["tie_x"]))]
    else:
        cases += [("special", a["special_x"][0], a[f"special_{key}"][0])]
    assert len(cases) >= 12
    for label, x, want in cases:
        got = np.asarray(quants.quantize(atype, x, isa=isa)).view(np.uint8).reshape(-1)
        assert got.size == want.size, f"{atype} {label}: {got.size} bytes, llama.cpp {want.size}"
        assert np.array_equal(got, want), f"{atype} {label}: {first_diff(got, want)}"


def test_quantize_q8_0_ref_matches_ggml_quantize_chunk():
    a = load("activations.npz")
    cases = list(_quantized_rows(a, "q8_0_ref"))
    cases += [(f"tie[{i}]", a["tie_x"][i], a["tie_q8_0_ref"][i]) for i in range(len(a["tie_x"]))]
    assert len(cases) >= 12
    for label, x, want in cases:
        got = np.asarray(quants.quantize_q8_0_ref(x)).view(np.uint8).reshape(-1)
        assert np.array_equal(got, want), f"Q8_0 ref {label}: {first_diff(got, want)}"


# ---------------------------------------------------------------- vec_dot --
# Tolerance. Both llama.cpp and ds4py compute the same exact quantity
#   T = sum over blocks of (integer dot of codes) x (scale products) [+ offset terms]
# with exact integer parts; they differ only in how the float terms are
# formed and summed. Write each result as a float sum of terms p_i, where
# each term is formed with at most R roundings (fp16 d x float d_y, an
# int32->float conversion of a partial above 2^24, the product) and passes
# through at most K additions on its way into the total. Standard error
# analysis (Higham, Accuracy and Stability, ch. 4) gives, to first order,
#   |result - T| <= (K + R) * u * sum_i |p_i|,      u = 2^-24 = eps32/2,
# and sum_i |p_i| <= absterms (the fixture's sum over elements of
# |scale part x act| + |offset part x act|, by the triangle inequality).
# So |ds4 - llama| <= (K_ds4 + K_llama + 2R) * u * absterms
#                  =  ((K_ds4 + K_llama)/2 + R) * eps32 * absterms.
# K: any kernel adds its per-block (or per-sub-block) partials one by one
# into a lane accumulator, then folds at most 16 lanes: K <= t*n_blocks + 16,
# where t = 1 float term per block for the 32-wide types and float types
# (a "block" of F32/F16/BF16 is one element) and t = QK_K/16 + 1 = 17 for
# the 256-wide types (up to 16 sub-block scales, plus the dmin term). R = 3.
# The factor (1 + 2^-10) covers the second-order terms (k*u <= 5e-4 here).
# BF16 only: llama.cpp's AVX512-BF16 vdpbf16ps treats subnormal inputs as
# zero and flushes subnormal results; `allow` adds exactly those products
# plus 2^-126 per element (see make_quant_fixtures.py).
# Why this still catches bugs: one wrong code or a dropped block changes the
# result by about absterms/n_elements, versus a bound of about
# (n_blocks+19)*1.2e-7*absterms; with the 1/3/7-block rows that margin is
# >= 100x. (For 4096-element F32/F16/BF16 rows the bound is 5e-4*absterms,
# too loose to see a single element, but the 1/33/255 rows cover the same
# loops and tails.)
R_ROUNDINGS = 3
LANE_FOLD = 16


def dot_bound(wtype: str, n: int, absterms: float, allow: float) -> float:
    info = quants.type_info(wtype)
    n_blocks = n // info.block_size
    t = 17 if info.block_size == 256 else 1
    return (t * n_blocks + LANE_FOLD + R_ROUNDINGS) * EPS32 * absterms * (1 + 2.0 ** -10) + allow



@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("wtype", WEIGHT_TYPES)
def test_vec_dot_matches_llamacpp_within_bound(wtype, isa, record_property):
    w = load(f"weights_{wtype}.npz")
    a = load("activations.npz")
    paired = PAIRED[wtype]
    assert quants.type_info(wtype).vec_dot_type == paired
    worst, checked = 0.0, 0
    for n in w["lengths"]:
        raw, ref = w[f"L{n}_raw"], w[f"L{n}_dot"]
        acts = a[f"L{n}_x"] if paired == "F32" else a[f"L{n}_{act_key(paired)}"]
        for r in range(raw.shape[0]):
            for j in range(acts.shape[0]):
                got = quants.vec_dot(wtype, raw[r], acts[j], act_type=paired, isa=isa)
                want = float(ref[r, j])
                bound = dot_bound(wtype, int(n), float(w[f"L{n}_absterms"][r, j]),
                                  float(w[f"L{n}_allow"][r, j]))
                assert np.isfinite(got), f"{wtype} n={n} w{r} a{j}: {got}"
                diff = abs(np.float32(got) - np.float64(want))
                assert diff <= bound, (
                    f"{wtype} x {paired} [{isa}] n={n} weight row {r} (kind "
                    f"{w[f'L{n}_kind'][r]}) act row {j}: ds4py {got!r} llama.cpp {want!r} "
                    f"|diff| {diff:.3g} > bound {bound:.3g}")
                if bound > 0:
                    worst = max(worst, diff / bound)
                checked += 1
    assert checked >= 60
    record_property("max_diff_over_bound", worst)
    print(f"\n[vec_dot] {wtype:6s} {isa:7s} max |diff|/bound = {worst:.3g}")
