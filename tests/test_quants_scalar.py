"""The scalar (reference) quant kernels against independent references.

Every kernel is called with isa="scalar". Expected values never come from the
code under test: dequantization is compared with gguf-py 0.19
(`gguf.quants.dequantize`, numpy) bit for bit; ds4's Q4_64A/Q2_64A, the Q8
activation quantizers and the fp16/bf16 conversions with numpy
re-implementations written here from the formulas (ggml-quants.c,
ggml-cpu/arch/x86/quants.c, ds4-notes §2); dot products with float64 sums
over independently decoded values, within a stated rounding bound.

NaN policy (what the core promises, tested below):
  * fp16 -> f32 keeps sign and payload and forces the quiet bit, like F16C's
    vcvtph2ps used by llama.cpp's x86 build. numpy keeps signaling NaNs
    signaling, so for NaN inputs we compare against numpy's bits | quiet bit.
  * f32 -> fp16 of a NaN gives sign | 0x7e00 | top 9 payload bits (F16C);
    numpy instead keeps sNaNs signaling, so NaNs are checked by that formula.
  * f32 -> bf16 follows ggml_compute_fp32_to_bf16 (NaN: top half | 0x40),
    which gguf-py also implements, so all patterns compare bit for bit.
  * Blocks with Inf/NaN scales: IEEE arithmetic fixes which outputs are NaN
    and every non-NaN bit, but not which NaN payload wins when two NaNs meet
    (the compiler may swap the operands of a commutative op), so there we
    require NaN-ness to agree and the rest to be bit-equal.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf import quants as gq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import ds4py
from ds4py import QuantError
from ds4py import quants as Q

ISA = "scalar"
U = 2.0**-24  # unit roundoff of float32
SETTINGS = settings(max_examples=30, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

# Byte offsets of the fp16 scale fields in each ggml block (ggml-common.h).
F16_FIELDS = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
    "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "IQ4_NL": [0], "IQ4_XS": [0],
}
GGUF_TYPES = ["F32", "F16", "BF16", *F16_FIELDS]  # types gguf-py dequantizes that we do
DOT_TYPES = [t.name for t in Q.TYPES if t.can_dot]


def u16(a):
    return np.ascontiguousarray(a).view("<u2")


def u32(a):
    return np.ascontiguousarray(a, dtype=np.float32).view("<u4")


def f16_to_f32(bits):
    return np.asarray(bits, dtype="<u2").view(np.float16).astype(np.float32)


def bf16_to_f32(bits):
    return (np.asarray(bits, dtype="<u2").astype("<u4") << 16).view(np.float32)


def roundf(v):
    """C roundf (ties away from zero), exact for float32 (a - floor(a) is exact)."""
    v = np.asarray(v, dtype=np.float32)
    with np.errstate(invalid="ignore"):
        a = np.abs(v)
        f = np.floor(a)
        r = f + (a - f >= np.float32(0.5)).astype(np.float32)
    return np.copysign(r, v).astype(np.float32)


def random_blocks(name, nblocks, rng, finite=True):
    """Random bytes for nblocks blocks; with finite=True every fp16 scale field
    (every element for F16) has its all-ones exponent cleared."""
    info = Q.type_info(name)
    raw = rng.integers(0, 256, size=(nblocks, info.type_size), dtype=np.uint8)
    if finite:
        offs = range(0, info.type_size, 2) if name == "F16" else F16_FIELDS.get(name, [])
        for off in offs:
            h = u16(raw[:, off:off + 2]).copy()
            h = np.where((h & 0x7C00) == 0x7C00, h ^ 0x4000, h).astype("<u2")
            raw[:, off:off + 2] = h.view(np.uint8)
    return raw.reshape(-1)


def assert_bits_equal(got, want):
    got, want = u32(got), u32(want)
    assert got.shape == want.shape
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, (f"{bad.size} of {got.size} differ; first at {bad[0]}: "
                           f"got {got[bad[0]]:#010x} want {want[bad[0]]:#010x}")


blocks_st = st.tuples(st.integers(0, 2**32 - 1), st.sampled_from([1, 3, 5, 7]))


# ----------------------------------------------------------- dequantize --

@pytest.mark.parametrize("name", GGUF_TYPES)
@SETTINGS
@given(blocks_st)
def test_dequantize_matches_gguf_py_bit_for_bit(name, seed_nb):
    seed, nb = seed_nb
    if Q.type_info(name).block_size == 1:
        nb *= 37  # plain types: odd element counts
    raw = random_blocks(name, nb, np.random.default_rng(seed))
    got = Q.dequantize(name, raw, isa=ISA)
    want = gq.dequantize(raw, GT[name])
    assert_bits_equal(got, want)


@pytest.mark.parametrize("name", list(F16_FIELDS))
@SETTINGS
@given(blocks_st)
def test_dequantize_with_inf_nan_scales(name, seed_nb):
    """Every fp16 pattern allowed in the scale fields, and at least one Inf and
    one NaN forced in: NaN-ness must agree and non-NaN values be bit-equal."""
    seed, nb = seed_nb
    rng = np.random.default_rng(seed)
    raw = random_blocks(name, nb, rng, finite=False).reshape(nb, -1)
    off = F16_FIELDS[name][0]
    raw[0, off:off + 2] = np.array([0x7C00 | (0x8000 * (seed & 1))], "<u2").view(np.uint8)
    if nb > 1:
        raw[1, off:off + 2] = np.array([0x7C01 + (seed % 0x3FE)], "<u2").view(np.uint8)
    raw = raw.reshape(-1)
    got = Q.dequantize(name, raw, isa=ISA)
    with np.errstate(all="ignore"):
        want = gq.dequantize(raw, GT[name])
    assert np.array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    assert_bits_equal(got[ok], want[ok])


def test_dequantize_inf_scale_follows_ieee():
    """Q8_0 block with d = +Inf: q*Inf is +-Inf, 0*Inf is NaN."""
    blk = np.zeros(34, np.uint8)
    blk[0:2] = np.array([0x7C00], "<u2").view(np.uint8)
    q = np.arange(-16, 16, dtype=np.int8)
    blk[2:] = q.view(np.uint8)
    got = Q.dequantize("Q8_0", blk, isa=ISA)
    assert np.all(np.isposinf(got[q > 0])) and np.all(np.isneginf(got[q < 0]))
    assert np.isnan(got[q == 0]).all()


def decode_q8_0(raw):
    b = np.asarray(raw, np.uint8).reshape(-1, 34)
    return f16_to_f32(u16(b[:, 0:2])), b[:, 2:].view(np.int8)


def decode_q8_1(raw):
    b = np.asarray(raw, np.uint8).reshape(-1, 36)
    return f16_to_f32(u16(b[:, 0:2])), f16_to_f32(u16(b[:, 2:4])), b[:, 4:].view(np.int8)


def decode_q8_K(raw):
    b = np.asarray(raw, np.uint8).reshape(-1, 292)
    d = np.ascontiguousarray(b[:, 0:4]).view("<f4")
    return d, b[:, 4:260].view(np.int8), np.ascontiguousarray(b[:, 260:292]).view("<i2")


@SETTINGS
@given(blocks_st)
def test_dequantize_activation_types(seed_nb):
    """Q8_1 and Q8_K (gguf-py lacks them): x = d*q in float32."""
    seed, nb = seed_nb
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(nb, 36), dtype=np.uint8)
    raw[:, 1] &= 0x7B  # finite d
    d, _, q = decode_q8_1(raw)
    assert_bits_equal(Q.dequantize("Q8_1", raw, isa=ISA), (q.astype(np.float32) * d).ravel())
    raw = rng.integers(0, 256, size=(nb, 292), dtype=np.uint8)
    raw[:, 3] &= 0x3F  # positive d below 2 (finite)
    d, q, _ = decode_q8_K(raw)
    assert_bits_equal(Q.dequantize("Q8_K", raw, isa=ISA), (d * q.astype(np.float32)).ravel())


# ------------------------------------------------ ds4's Q4_64A / Q2_64A --

A64 = {"Q4_64A": dict(maxq=15, ts=36, ncode_bytes=32, bits=4),
       "Q2_64A": dict(maxq=3, ts=20, ncode_bytes=16, bits=2)}


def a64_unpack(name, raw):
    """(codes[nb,64], scale bits, bias bits) from the layout in ds4-notes §2."""
    p = A64[name]
    b = np.asarray(raw, np.uint8).reshape(-1, p["ts"])
    qs = b[:, :p["ncode_bytes"]]
    per = 8 // p["bits"]
    j = np.arange(64)
    codes = (qs[:, j // per] >> ((j % per) * p["bits"]).astype(np.uint8)) & (p["maxq"])
    nc = p["ncode_bytes"]
    return codes.astype(np.int64), u16(b[:, nc:nc + 2]).ravel(), u16(b[:, nc + 2:nc + 4]).ravel()


def a64_dequant_ref(name, raw):
    codes, sb, bb = a64_unpack(name, raw)
    s, b = bf16_to_f32(sb)[:, None], bf16_to_f32(bb)[:, None]
    return (codes.astype(np.float32) * s + b).astype(np.float32).ravel()


@pytest.mark.parametrize("name", list(A64))
@SETTINGS
@given(blocks_st)
def test_a64_dequantize_matches_layout_reference(name, seed_nb):
    seed, nb = seed_nb
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(nb, A64[name]["ts"]), dtype=np.uint8)
    with np.errstate(all="ignore"):
        want = a64_dequant_ref(name, raw)
    got = Q.dequantize(name, raw.ravel(), isa=ISA)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    assert_bits_equal(got[ok], want[ok])


def test_a64_code_order_is_pairwise_low_nibble_first():
    """Q4_64A code j lives in byte j/2, even j in the LOW nibble (not Q4_0's
    split halves); Q2_64A code j at bits 2*(j%4) of byte j/4."""
    blk = np.zeros(36, np.uint8)
    blk[0] = 0x21  # codes 0 -> 1, 1 -> 2
    blk[32:34] = np.array([0x3F80], "<u2").view(np.uint8)  # scale 1.0, bias 0
    got = Q.dequantize("Q4_64A", blk, isa=ISA)
    assert got[0] == 1 and got[1] == 2 and not got[2:].any()
    blk = np.zeros(20, np.uint8)
    blk[0] = 0b11100100  # codes 0,1,2,3
    blk[16:18] = np.array([0x3F80], "<u2").view(np.uint8)
    got = Q.dequantize("Q2_64A", blk, isa=ISA)
    assert list(got[:4]) == [0, 1, 2, 3] and not got[4:].any()


def a64_quant_ref(name, x, store="trunc", codes_from="stored", tie="away"):
    """ds4's quantizer in numpy. store: how scale/bias become bf16 ("trunc" as
    ds4 does, "rne" for contrast); codes_from: "stored" (the fixed ds4
    behaviour) or "float" (the old bug: unrounded f32 scale/bias); tie:
    "away" (C roundf) or "even" (np.rint)."""
    p = A64[name]
    maxq = p["maxq"]
    g = np.asarray(x, np.float32).reshape(-1, 64)
    out = []
    for blk in g:
        # first occurrence, as ds4's strict '<' / '>' scan keeps it (+0 vs -0)
        mn, mx = blk[np.argmin(blk)], blk[np.argmax(blk)]
        with np.errstate(all="ignore"):
            scale = np.float32(0) if mx == mn else np.float32(mx - mn) / np.float32(maxq)
        fbits = np.array([scale, mn], np.float32).view("<u4")
        if store == "trunc":
            hb = (fbits >> 16).astype("<u2")
        else:  # round to nearest even (no NaNs in these fixtures)
            hb = ((fbits + 0x7FFF + ((fbits >> 16) & 1)) >> 16).astype("<u2")
        if codes_from == "stored":
            s, b = bf16_to_f32(hb)
        else:
            s, b = scale, mn
        if s == 0:
            codes = np.zeros(64, np.int64)
        else:
            with np.errstate(all="ignore"):
                v = ((blk - b) / s).astype(np.float32)
                r = roundf(v) if tie == "away" else np.rint(v)
                codes = np.where(r > maxq, maxq, np.where(r >= 0, r, 0)).astype(np.int64)
        per = 8 // p["bits"]
        packed = np.zeros(p["ncode_bytes"], np.uint8)
        for j in range(64):
            packed[j // per] |= np.uint8(codes[j] << ((j % per) * p["bits"]))
        out.append(np.concatenate([packed, hb.view(np.uint8)]))
    return np.concatenate(out)


floats32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


def activation_rows(n, nonfinite=False):
    """Float32 rows: arbitrary finite floats (hypothesis' extremes: 0, tiny,
    huge, repeated values) or normal noise at a random power-of-two scale;
    with nonfinite=True also rows holding Inf and NaN."""
    wild = hnp.arrays(np.float32, n, elements=floats32)
    tame = st.tuples(st.integers(0, 2**32 - 1), st.integers(-30, 30)).map(
        lambda se: (np.random.default_rng(se[0]).standard_normal(n) * 2.0 ** se[1])
        .astype(np.float32))
    if not nonfinite:
        return st.one_of(wild, tame)
    return st.one_of(wild, tame, hnp.arrays(np.float32, n, elements=st.floats(width=32)))


@pytest.mark.parametrize("name", list(A64))
@SETTINGS
@given(activation_rows(3 * 64))
def test_a64_quantizer_matches_numpy_reference(name, x):
    got = Q.quantize(name, x, isa=ISA)
    assert np.array_equal(got, a64_quant_ref(name, x))


@pytest.mark.parametrize("name", list(A64))
@SETTINGS
@given(activation_rows(2 * 64))
def test_a64_codes_derive_from_stored_params(name, x):
    """Decode what was stored and re-derive each code from the stored bf16
    scale/bias: clamp(roundf((x - bias)/scale), 0, maxq); zero scale -> 0."""
    maxq = A64[name]["maxq"]
    codes, sb, bb = a64_unpack(name, Q.quantize(name, x, isa=ISA))
    s, b = bf16_to_f32(sb)[:, None], bf16_to_f32(bb)[:, None]
    g = x.reshape(-1, 64)
    with np.errstate(all="ignore"):
        r = roundf(((g - b) / s).astype(np.float32))
    want = np.where(s == 0, 0, np.where(r > maxq, maxq, np.where(r >= 0, r, 0)))
    assert np.array_equal(codes, want)
    # the stored bias is the block minimum (first one, so +0 before -0)
    # truncated to bf16
    first_min = g[np.arange(len(g)), np.argmin(g, axis=1)]
    assert np.array_equal(bb, (u32(first_min) >> 16).astype("<u2"))


def lcg_sine_fixture(rows=64, cols=64):
    """ds4's test_q64a_quant style fixture: a sine plus LCG noise."""
    state = 12345
    out = np.empty(rows * cols, np.float32)
    for i in range(out.size):
        state = (1103515245 * state + 12345) & 0x7FFFFFFF
        out[i] = np.float32(0.5 * np.sin(0.37 * i) + (state / 2**31 - 0.5) * 0.3 + 0.01 * (i % 7))
    return out


@pytest.mark.parametrize("name", list(A64))
def test_a64_fixture_separates_truncation_and_old_behaviour(name):
    x = lcg_sine_fixture()
    got = Q.quantize(name, x, isa=ISA)
    assert np.array_equal(got, a64_quant_ref(name, x))
    # The fixture is sensitive: rounding the bf16 params instead of truncating
    # them, or deriving codes from the unrounded f32 params (the old ds4 bug),
    # would each give different bytes.
    assert not np.array_equal(got, a64_quant_ref(name, x, store="rne"))
    assert not np.array_equal(got, a64_quant_ref(name, x, codes_from="float"))


@pytest.mark.parametrize("name", list(A64))
def test_a64_ties_round_away_from_zero(name):
    maxq = A64[name]["maxq"]
    x = np.zeros(64, np.float32)
    x[1] = maxq            # min 0, max maxq: scale 1.0 and bias 0 exactly
    x[2:5] = [0.5, 1.5, 2.5]
    codes, sb, bb = a64_unpack(name, Q.quantize(name, x, isa=ISA))
    assert bf16_to_f32(sb)[0] == 1.0 and bf16_to_f32(bb)[0] == 0.0
    assert list(codes[0, 2:5]) == [1, 2, 3]  # np.rint would give 0, 2, 2
    assert not np.array_equal(a64_quant_ref(name, x), a64_quant_ref(name, x, tie="even"))


@pytest.mark.parametrize("name", list(A64))
def test_a64_constant_block_has_zero_scale_and_codes(name):
    x = np.full(64, -3.1415927, np.float32)
    codes, sb, bb = a64_unpack(name, Q.quantize(name, x, isa=ISA))
    assert sb[0] == 0 and not codes.any()
    assert bb[0] == u32(x[:1])[0] >> 16  # the minimum's top half
    # A bias whose low half is >= 0x8000 tells truncation from rounding apart.
    x = np.full(64, np.array([0x3F80C000], "<u4").view(np.float32)[0])
    _, _, bb = a64_unpack(name, Q.quantize(name, x, isa=ISA))
    assert bb[0] == 0x3F80  # RNE would store 0x3F81


# ------------------------------------------------- fp16 / bf16 conversion --

def test_all_fp16_patterns_to_f32():
    h = np.arange(65536, dtype=np.uint32).astype("<u2")
    got = u32(Q.dequantize("F16", h.view(np.uint8), isa=ISA))
    want = u32(h.view(np.float16).astype(np.float32))
    nan = (h & 0x7C00) == 0x7C00
    nan &= (h & 0x03FF) != 0
    assert np.array_equal(got[~nan], want[~nan])
    # NaNs: numpy's bits (sign and payload kept) with the quiet bit forced
    assert np.array_equal(got[nan], want[nan] | 0x00400000)
    assert nan.sum() == 2046


def fp16_midpoints():
    """f32 values exactly halfway between adjacent fp16 values (all are f32-
    representable), across subnormals, normals and the top of the range."""
    h = np.arange(0, 0x7BFF, dtype=np.uint32).astype("<u2")
    lo = h.view(np.float16).astype(np.float64)
    hi = (h + 1).astype("<u2").view(np.float16).astype(np.float64)
    mid = ((lo + hi) / 2).astype(np.float32)
    assert np.array_equal(mid.astype(np.float64), (lo + hi) / 2)
    return mid


def test_f32_to_fp16_matches_numpy_rne():
    rng = np.random.default_rng(7)
    mids = fp16_midpoints()
    vals = np.concatenate([
        rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype("<u4").view(np.float32),
        (rng.standard_normal(100_000) * 2.0 ** rng.integers(-30, 18, 100_000)).astype(np.float32),
        mids, np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(0)),
        np.array([0.0, 2**-24, 2**-25, 2**-25 * 1.0000001, 2**-26, 3 * 2**-26, 2**-14,
                  65504, 65519.996, 65520, 65536, np.inf, 1e-45, 6e-8], np.float32),
    ])
    vals = np.concatenate([vals, -vals])
    got = u16(Q.quantize("F16", vals, isa=ISA))
    isnan = np.isnan(vals)
    with np.errstate(over="ignore"):
        want = u16(vals[~isnan].astype(np.float16))
    assert np.array_equal(got[~isnan], want)
    # NaN: quiet NaN, sign kept, top 9 payload bits kept (F16C vcvtps2ph)
    b = u32(vals[isnan])
    want_nan = ((b >> 16) & 0x8000) | 0x7E00 | ((b >> 13) & 0x3FF)
    assert isnan.sum() > 100 and np.array_equal(got[isnan], want_nan.astype("<u2"))


def test_f32_to_bf16_matches_ggml_formula_via_gguf_py():
    rng = np.random.default_rng(11)
    bits = rng.integers(0, 2**32, 300_000, dtype=np.uint64).astype("<u4")
    ties = (rng.integers(0, 2**16, 1000, dtype=np.uint32) << 16 | 0x8000).astype("<u4")
    vals = np.concatenate([bits, ties, ties + 1, ties - 1]).view(np.float32)
    got = Q.quantize("BF16", vals, isa=ISA)
    want = gq.quantize(vals, GT.BF16)
    assert np.array_equal(got, np.asarray(want).view(np.uint8).ravel())
    # round trip through the bf16 dequantizer is the plain 16-bit shift
    back = Q.dequantize("BF16", got, isa=ISA)
    assert np.array_equal(u32(back), u16(got).astype("<u4") << 16)


def test_f32_quantize_is_a_copy():
    x = np.array([1.5, -0.0, np.nan, np.inf, 1e-45], np.float32)
    assert np.array_equal(Q.quantize("F32", x, isa=ISA), x.view(np.uint8))


# ------------------------------------------------ activation quantizers --

def cvt_i32_x86(r):
    """cvtps2dq: NaN or out of int32 range gives 0x80000000."""
    r = np.asarray(r, np.float64)
    with np.errstate(invalid="ignore"):
        ok = (r >= -2.0**31) & (r < 2.0**31)
    return np.where(ok, np.nan_to_num(r), -(2**31)).astype(np.int64)


def maxps(a, b):
    """SSE/AVX maxps: a if a > b else b (so a NaN in either gives b)."""
    return np.where(a > b, a, b)


def amax_avx2(blk):
    """max|x| reduced in the AVX2 kernel's order: 4 vectors of 8 folded lane-
    wise, then high/low 128-bit halves, movehl, movehdup. Only NaN cares."""
    v = np.abs(blk).reshape(4, 8)
    m = v[0]
    for k in (1, 2, 3):
        m = maxps(m, v[k])
    m4 = maxps(m[4:], m[:4])
    return np.float32(maxps(maxps(m4[0], m4[2]), maxps(m4[1], m4[3])))


def q8_avx2_ref(x, with_s=False):
    """llama.cpp x86 AVX2 quantize_row_q8_0/_q8_1 in numpy: d = amax/127 (fp16
    RNE), id = 127/amax (0 if amax == 0), q = RNE(x*id) in float32, int32
    conversion then saturating packs to int8; Q8_1 adds s = fp16(d*sum(q32))."""
    g = np.asarray(x, np.float32).reshape(-1, 32)
    out = []
    for blk in g:
        amax = amax_avx2(blk)
        with np.errstate(all="ignore"):
            d = amax / np.float32(127)
            inv = np.float32(127) / amax if amax != 0 else np.float32(0)
            q32 = cvt_i32_x86(np.rint((blk * inv).astype(np.float32)))
            parts = [np.array([d], np.float32).astype(np.float16).view(np.uint8)]
            if with_s:
                total = int(q32.sum())
                s32 = (total + 2**31) % 2**32 - 2**31  # int32 wrap, as vpaddd
                parts.append(np.array([d * np.float32(s32)], np.float32)
                             .astype(np.float16).view(np.uint8))
        parts.append(np.clip(q32, -128, 127).astype(np.int8).view(np.uint8))
        out.append(np.concatenate(parts))
    return np.concatenate(out)


def q8_0_ref_ref(x):
    """ggml-quants.c quantize_row_q8_0_ref: d = amax/127, id = 1/d, roundf."""
    g = np.asarray(x, np.float32).reshape(-1, 32)
    out = []
    for blk in g:
        amax = np.float32(0)
        for v in np.abs(blk):  # ggml's MAX(a, b) = a > b ? a : b, in index order
            amax = amax if amax > v else v
        with np.errstate(all="ignore"):
            d = amax / np.float32(127)
            inv = np.float32(1) / d if d != 0 else np.float32(0)
            d16 = np.array([d], np.float32).astype(np.float16)
            q = roundf((blk * inv).astype(np.float32))
        # |roundf(x/d)| <= 127 unless 1/d overflowed (then cvttss2si gives
        # 0x80000000, whose low byte is 0); those rows are checked as such.
        q = cvt_i32_x86(q).astype(np.uint32).astype(np.uint8)
        out.append(np.concatenate([d16.view(np.uint8), q]))
    return np.concatenate(out)


def q8_K_ref(x):
    """ggml-quants.c quantize_row_q8_K_ref: max = first value of largest |x|,
    iscale = -127/max, q = min(127, nearest_int(iscale*x)) where nearest_int is
    the 1.5*2^23 magic add, d = 1/iscale, bsums of 16. All-zero block: zeros."""
    g = np.asarray(x, np.float32).reshape(-1, 256)
    out = []
    for blk in g:
        i, amax = 0, np.float32(0)
        for j, v in enumerate(np.abs(blk)):  # strict '>': first max, NaN skipped
            if v > amax:
                i, amax = j, v
        if amax == 0:
            out.append(np.zeros(292, np.uint8))
            continue
        with np.errstate(all="ignore"):
            iscale = np.float32(-127) / blk[i]
            v = ((iscale * blk).astype(np.float32) + np.float32(12582912)).astype(np.float32)
        ni = (v.view("<i4") & 0x007FFFFF) - 0x00400000
        q = np.minimum(127, ni).astype(np.int8)
        bsums = q.astype(np.int64).reshape(16, 16).sum(axis=1).astype("<i2")
        with np.errstate(all="ignore"):
            d = np.array([np.float32(1) / iscale], "<f4")
        out.append(np.concatenate([d.view(np.uint8), q.view(np.uint8), bsums.view(np.uint8)]))
    return np.concatenate(out)


@SETTINGS
@given(activation_rows(5 * 32, nonfinite=True))
def test_q8_0_matches_avx2_formula(x):
    assert np.array_equal(Q.quantize("Q8_0", x, isa=ISA), q8_avx2_ref(x))


@SETTINGS
@given(activation_rows(5 * 32, nonfinite=True))
def test_q8_1_matches_avx2_formula(x):
    assert np.array_equal(Q.quantize("Q8_1", x, isa=ISA), q8_avx2_ref(x, with_s=True))


@SETTINGS
@given(activation_rows(5 * 32, nonfinite=True))
def test_q8_0_ref_matches_ggml_reference_formula(x):
    assert np.array_equal(Q.quantize_q8_0_ref(x), q8_0_ref_ref(x))


@SETTINGS
@given(activation_rows(3 * 256, nonfinite=True))
def test_q8_K_matches_reference_formula(x):
    assert np.array_equal(Q.quantize("Q8_K", x, isa=ISA), q8_K_ref(x))


def test_q8_0_avx2_and_ref_differ_on_exact_ties():
    """amax = 127 makes the multiplier exactly 1 in both (127/127 and 1/(127/127)),
    so x = 2.5 is an exact tie: AVX2 rounds to even (2), ref away from zero (3)."""
    x = np.zeros(32, np.float32)
    x[0], x[1], x[2], x[3] = 127, 2.5, -2.5, 3.5
    avx2 = Q.quantize("Q8_0", x, isa=ISA)[2:].view(np.int8)
    ref = Q.quantize_q8_0_ref(x)[2:].view(np.int8)
    assert list(avx2[:4]) == [127, 2, -2, 4]
    assert list(ref[:4]) == [127, 3, -3, 4]
    q8k = Q.quantize("Q8_K", np.resize(x, 256), isa=ISA)
    assert list(q8k[4:8].view(np.int8)) == [-127, -2, 2, -4]  # iscale = -1, RNE


def test_q8_zero_block():
    z = np.zeros(256, np.float32)
    assert not Q.quantize("Q8_0", z, isa=ISA).any()
    assert not Q.quantize("Q8_1", z, isa=ISA).any()
    assert not Q.quantize("Q8_K", z, isa=ISA).any()  # bsums zeroed too


# --------------------------------------------------------------- dots --

# Types whose weights are p + o with an additive offset o (min / bias); the
# byte ranges that hold the offset field and the codes (ggml-common.h, §2).
OFFSET_TYPES = {
    "Q4_1": ((2, 4), [(4, 20)]),
    "Q5_1": ((2, 4), [(4, 24)]),
    "Q4_K": ((2, 4), [(16, 144)]),
    "Q5_K": ((2, 4), [(16, 48), (48, 176)]),
    "Q4_64A": ((34, 36), [(0, 32)]),
    "Q2_64A": ((18, 20), [(0, 16)]),
}


def ref_dequant(name, raw):
    """Independent float32 decode: gguf-py, or the layout reference for 64A."""
    if name in A64:
        return a64_dequant_ref(name, raw)
    return gq.dequantize(np.asarray(raw, np.uint8), GT[name]).astype(np.float32)


def weight_parts(name, raw):
    """(p, o): the scale part and the offset part of every weight, both exact
    in float64 (decoding with the offset zeroed, resp. with the codes zeroed:
    each is a single exact product, e.g. d*sc*q has <= 22 significant bits)."""
    ts = Q.type_info(name).type_size
    if name not in OFFSET_TYPES:
        return ref_dequant(name, raw).astype(np.float64), np.zeros(0)
    (o0, o1), code_ranges = OFFSET_TYPES[name]
    b = np.asarray(raw, np.uint8).reshape(-1, ts)
    no_off = b.copy()
    no_off[:, o0:o1] = 0
    no_codes = b.copy()
    for c0, c1 in code_ranges:
        no_codes[:, c0:c1] = 0
    return (ref_dequant(name, no_off.ravel()).astype(np.float64),
            ref_dequant(name, no_codes.ravel()).astype(np.float64))


def moderate_weights(name, nb, rng):
    """Random blocks whose fp16/bf16 scales are modest finite values, so no dot
    overflows (ranges of the codes themselves stay fully random)."""
    info = Q.type_info(name)
    if info.block_size == 1:
        v = (rng.standard_normal(nb) * 0.5).astype(np.float32)
        return Q.quantize(name, v, isa=ISA) if name != "F32" else v.view(np.uint8)
    raw = rng.integers(0, 256, size=(nb, info.type_size), dtype=np.uint8)
    if name in A64:
        nc = A64[name]["ncode_bytes"]
        sb = (rng.standard_normal((nb, 2)) * [0.01, 0.1]).astype(np.float32)
        raw[:, nc:nc + 4] = (u32(sb) >> 16).astype("<u2").view(np.uint8).reshape(nb, 4)
    else:
        for off in F16_FIELDS[name]:
            v = (rng.standard_normal(nb) * 0.01).astype(np.float16)
            raw[:, off:off + 2] = v.view(np.uint8).reshape(nb, 2)
    return raw.ravel()


def n_weights(name, k):
    bs = Q.type_info(name).block_size
    return 64 * k if bs == 1 else max(bs, 64) * k  # 64-multiples pair with Q8_0


@pytest.mark.parametrize("name", DOT_TYPES)
@SETTINGS
@given(st.integers(0, 2**32 - 1), st.sampled_from([1, 3, 5]), st.integers(-8, 8))
def test_dot_f32_within_bound(name, seed, k, e):
    rng = np.random.default_rng(seed)
    n = n_weights(name, k)
    bs = Q.type_info(name).block_size
    w = moderate_weights(name, n // bs, rng)
    a = (rng.standard_normal(n) * 2.0**e).astype(np.float32)
    got = Q.vec_dot(name, w, a, act_type="F32", isa=ISA)
    wf = ref_dequant(name, w).astype(np.float64)
    want = float(np.dot(wf, a.astype(np.float64)))
    # Order: float products, float partial per block of bs (k=1 for plain
    # types, which add each product into a double), double total, one final
    # rounding. |error| <= (chunk + 2) * u * sum|w_i*a_i| (product rounding,
    # chunk-1 additions, final rounding; the double part is far below this).
    chunk = 1 if bs == 1 else bs
    bound = (chunk + 2) * U * float(np.abs(wf * a).sum()) + 1e-38
    assert abs(got - want) <= bound, (got, want, bound)


def decode_act(act_type, raw):
    """Activation values from quantized bytes (d*q), decoded here."""
    if act_type == "Q8_0":
        d, q = decode_q8_0(raw)
        return (d.astype(np.float64) * q).ravel()
    if act_type == "Q8_1":
        d, _, q = decode_q8_1(raw)
        return (d.astype(np.float64) * q).ravel()
    if act_type == "Q8_K":
        d, q, bsums = decode_q8_K(raw)
        assert np.array_equal(bsums, q.astype(np.int64).reshape(-1, 16, 16).sum(axis=2))
        return (d.astype(np.float64) * q).ravel()
    if act_type == "F16":
        return f16_to_f32(u16(raw)).astype(np.float64)
    if act_type == "BF16":
        return bf16_to_f32(u16(raw)).astype(np.float64)
    return np.asarray(raw, np.uint8).view(np.float32).astype(np.float64)


@pytest.mark.parametrize("name", DOT_TYPES)
@SETTINGS
@given(st.integers(0, 2**32 - 1), st.sampled_from([1, 3, 5]), st.integers(-8, 8))
def test_dot_paired_within_bound(name, seed, k, e):
    rng = np.random.default_rng(seed)
    info = Q.type_info(name)
    n = n_weights(name, k)
    w = moderate_weights(name, n // info.block_size, rng)
    a = (rng.standard_normal(n) * 2.0**e).astype(np.float32)
    act_type = info.vec_dot_type
    aq = Q.quantize(act_type, a, isa=ISA)
    got = Q.vec_dot(name, w, aq, act_type=act_type, isa=ISA)
    av = decode_act(act_type, aq)
    p, o = weight_parts(name, w)
    want = float(np.dot(p, av))
    mag = float(np.abs(p * av).sum())
    if o.size and act_type == "Q8_1":
        # ggml's Q4_1/Q5_1 x Q8_1 dot takes the min term as m * s per block,
        # s = fp16(d*sum(q)) stored by the quantizer (not d16*sum(q)): that is
        # the value this format defines, so the reference uses s too.
        s = decode_q8_1(aq)[1].ravel().astype(np.float64)
        m = o.reshape(-1, 32)[:, 0]
        want += float(np.dot(m, s))
        mag += float(np.abs(m * s).sum())
    elif o.size:
        want += float(np.dot(o, av))
        mag += float(np.abs(o * av).sum())
    # Integer sums per block are exact; each block term takes <= 5 float
    # roundings and is accumulated in float once per <= 32 weights (K-quants:
    # plus 8 lane sums at the end), so |error| <= (n/32 + 12) * u * M where M
    # sums the magnitudes of the scale and offset parts separately (they are
    # computed separately, so cancellation between them is not free).
    bound = (n / 32 + 12) * U * mag + 1e-38
    assert abs(got - want) <= bound, (got, want, bound)


def test_dot_simple_values_exact():
    """Small integers: every step is exact, so the dots are exact."""
    w = np.zeros(36, np.uint8)
    w[:32] = 0x21  # Q4_64A codes alternate 1, 2
    w[32:34] = np.array([0x4000], "<u2").view(np.uint8)  # scale 2
    w[34:36] = np.array([0xBF80], "<u2").view(np.uint8)  # bias -1 -> weights 1, 3
    a = np.full(64, 127, np.float32)  # Q8_0 d = 1 exactly, q = 127
    assert Q.vec_dot("Q4_64A", w, a, isa=ISA) == 127 * 128
    aq = Q.quantize("Q8_0", a, isa=ISA)
    assert Q.vec_dot("Q4_64A", w, aq, act_type="Q8_0", isa=ISA) == 127 * 128
    assert Q.vec_dot("F32", np.arange(5, dtype=np.float32).view(np.uint8),
                     np.ones(5, np.float32), isa=ISA) == 10.0


# ------------------------------------------------------------ errors --

def test_type_info_and_listing():
    ti = Q.type_info("q4_k")
    assert (ti.name, ti.id, ti.block_size, ti.type_size, ti.vec_dot_type) == \
        ("Q4_K", 12, 256, 144, "Q8_K")
    assert ti.can_dequantize and ti.can_dot and not ti.can_quantize and not ti.ds4_only
    a = Q.type_info(36)
    assert a.name == "Q4_64A" and a.ds4_only and a.can_quantize and a.vec_dot_type == "Q8_0"
    assert Q.type_info("Q8_1").vec_dot_type is None
    names = {t.name for t in Q.TYPES}
    assert {"F32", "Q4_K", "Q2_64A", "IQ4_XS", "Q2_K"} <= names
    assert "scalar" in Q.available_isas()
    assert ds4py.quants is Q


def test_argument_errors():
    with pytest.raises(QuantError, match="unknown ggml type id 99"):
        Q.type_info(99)
    with pytest.raises(QuantError, match="unknown ggml type id 4"):  # a removed ggml id
        Q.dequantize(4, b"\0" * 20, isa=ISA)
    with pytest.raises(QuantError, match="unknown quant type name 'Q9_9'"):
        Q.dequantize("Q9_9", b"", isa=ISA)
    with pytest.raises(QuantError, match="35 bytes, not a whole number of Q8_0 blocks"):
        Q.dequantize("Q8_0", bytes(35), isa=ISA)
    with pytest.raises(QuantError, match="row length 33 is not a multiple of Q8_0's block size 32"):
        Q.quantize("Q8_0", np.zeros(33, np.float32), isa=ISA)
    with pytest.raises(QuantError, match="row length 40 is not a multiple of Q8_0's block size 32"):
        Q.quantize_q8_0_ref(np.zeros(40, np.float32))
    with pytest.raises(QuantError, match="dequantizing Q2_K is not supported"):
        Q.dequantize("Q2_K", bytes(84), isa=ISA)
    with pytest.raises(QuantError, match="quantizing to Q4_K is not supported"):
        Q.quantize("Q4_K", np.zeros(256, np.float32), isa=ISA)
    w = bytes(144)
    with pytest.raises(QuantError, match="Q4_K weights pair with F32 or Q8_K activations, "
                                         "not type id 8"):
        Q.vec_dot("Q4_K", w, bytes(34 * 8), act_type="Q8_0", isa=ISA)
    with pytest.raises(QuantError, match="act has 255 values but the Q4_K row has 256"):
        Q.vec_dot("Q4_K", w, np.zeros(255, np.float32), isa=ISA)
    with pytest.raises(QuantError, match="act holds 512 Q8_K values"):
        Q.vec_dot("Q4_K", w, bytes(292 * 2), act_type="Q8_K", isa=ISA)
    with pytest.raises(QuantError, match="Q8_1 is not a weight type"):
        Q.vec_dot("Q8_1", bytes(36), np.zeros(32, np.float32), isa=ISA)
    with pytest.raises(QuantError, match="unknown ISA"):
        Q.dequantize("Q8_0", bytes(34), isa="sse9")
    missing = [i for i in ("avx2", "avx512", "neon") if i not in Q.available_isas()]
    if missing:
        with pytest.raises(QuantError, match=f"ISA {missing[0]} is not available"):
            Q.dequantize("Q8_0", bytes(34), isa=missing[0])


def test_core_q8_0_ref_status_codes():
    """The public C entry point checks its own arguments."""
    from ds4py._core import ffi, lib, new_error
    err = new_error()
    src = ffi.new("float[32]")
    dst = ffi.new("uint8_t[34]")
    assert lib.ds4_quantize_row_q8_0_ref(src, dst, 31, err) == lib.DS4_ERR_BAD_ROW
    assert b"31" in ffi.string(err.message)
    assert lib.ds4_quantize_row_q8_0_ref(ffi.NULL, dst, 32, err) == lib.DS4_ERR_ARG
    assert lib.ds4_quantize_row_q8_0_ref(src, dst, 32, err) == lib.DS4_OK


def test_misaligned_and_noncontiguous_inputs_are_handled():
    rng = np.random.default_rng(3)
    raw = random_blocks("Q4_K", 3, rng)
    buf = np.zeros(raw.size + 1, np.uint8)
    buf[1:] = raw
    assert_bits_equal(Q.dequantize("Q4_K", buf[1:], isa=ISA), gq.dequantize(raw, GT.Q4_K))
    x = rng.standard_normal(64).astype(np.float32)
    assert np.array_equal(Q.quantize("Q8_0", x[::-1], isa=ISA),
                          Q.quantize("Q8_0", x[::-1].copy(), isa=ISA))
