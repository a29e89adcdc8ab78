"""K-quant dot kernels at the extremes of their integer ranges.

The AVX-512 Q4_K and Q6_K kernels (csrc/quants/avx512.c, k_pair) sum four
code * activation products with vpdpbusd and narrow those sums to int16 with
a saturating pack before the scales apply. That is exact only because
|4 * 63 * 128| < 2^15. Random rows never come near the bound (a quantized
activation block reaches +-127 in one element only), so the rows here put
every code at its maximum (or minimum) under the largest scales, against
activation blocks that are all +127, all -127, or all -128 (the int8
minimum: our quantizer never writes it, but the kernels must not depend on
that for these two types, whose bound holds at 128 too). For every ISA this
CPU runs:
  * the one-row dot equals the exact value (float64 over the scalar ISA's
    dequantized operands) within float rounding -- a saturated or wrapped
    int16 sum would be off by thousands of units of the result;
  * the multi-row kernel equals the one-row kernel bit for bit, for a group
    of rows mixing the extreme blocks (batch invariance at the extremes).
"""

from __future__ import annotations

import numpy as np
import pytest

from ds4py import quants as Q
from ds4py._core import ffi, lib, new_error

ISAS = Q.available_isas()
U = 2.0**-24  # float32 unit roundoff

Q8K = np.dtype([("d", "<f4"), ("qs", "i1", 256), ("bsums", "<i2", 16)])
assert Q8K.itemsize == 292  # block_q8_K (csrc/quants/quants.h)


def _q8k_block(code: int, d: float) -> np.ndarray:
    b = np.zeros(1, Q8K)
    b["d"] = d
    b["qs"] = code
    b["bsums"] = 16 * code  # sums of 16 codes, as the quantizer stores them
    return b.view(np.uint8)


def _q4k_block(code_byte: int, scale_byte: int, d: float, dmin: float) -> np.ndarray:
    # d, dmin (fp16), scales[12] (6-bit scales and mins), qs[128]
    head = np.array([d, dmin], np.float16).view(np.uint8)
    return np.concatenate([head, np.full(12, scale_byte, np.uint8),
                           np.full(128, code_byte, np.uint8)])


def _q6k_block(code_bits: int, scale: int, d: float) -> np.ndarray:
    # ql[128], qh[64], scales[16] (int8), d (fp16)
    ql = np.full(128, 0xFF if code_bits else 0, np.uint8)
    qh = np.full(64, 0xFF if code_bits else 0, np.uint8)
    return np.concatenate([ql, qh, np.full(16, scale, np.int8).view(np.uint8),
                           np.array([d], np.float16).view(np.uint8)])


# (weight type, weight block) at the extremes: all codes 15 (Q4_K) / 63 or 0
# (Q6_K, i.e. +31 and -32 after the offset) under scales 63 / +-127 / -128.
WEIGHTS = {
    "Q4_K": [_q4k_block(0xFF, 0xFF, 2.0**-10, 2.0**-12), _q4k_block(0xFF, 0xFF, 2.0**-10, 0.0),
             _q4k_block(0x00, 0xFF, 2.0**-10, 2.0**-12)],
    "Q6_K": [_q6k_block(1, 127, 2.0**-10), _q6k_block(1, -128, 2.0**-10),
             _q6k_block(0, 127, 2.0**-10), _q6k_block(0, -128, 2.0**-10)],
}
ACT_CODES = [127, -127, -128]
N_BLOCKS = 3  # several blocks, so block-to-block accumulation runs too


def _row(block: np.ndarray) -> np.ndarray:
    return np.tile(block, N_BLOCKS)


def _acts() -> list[np.ndarray]:
    # one row per activation code, plus a row mixing them block by block
    rows = [np.tile(_q8k_block(c, 2.0**-7), N_BLOCKS) for c in ACT_CODES]
    rows.append(np.concatenate([_q8k_block(c, 2.0**-7) for c in ACT_CODES[:N_BLOCKS]]))
    return rows


def _exact(t: str, w: np.ndarray, a: np.ndarray) -> tuple[float, float]:
    wd = Q.dequantize(t, w, isa="scalar").astype(np.float64)
    ad = Q.dequantize("Q8_K", a, isa="scalar").astype(np.float64)
    return float(wd @ ad), float(np.abs(wd) @ np.abs(ad))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("t", sorted(WEIGHTS))
def test_extreme_blocks_exact(isa, t):
    n = 256 * N_BLOCKS
    for wb in WEIGHTS[t]:
        w = _row(wb)
        for a in _acts():
            exact, mag = _exact(t, w, a)
            got = Q.vec_dot(t, w, a, act_type="Q8_K", isa=isa)
            # a handful of float32 roundings per block term and the sum of
            # n terms at most: (n + 8) * u * sum|w*a|, doubled for margin.
            # A saturated int16 partial sum is off by >= 1 code product
            # times the scale (~2^-17 * 63 here, far above this bound).
            bound = 2.0 * (n + 8) * U * mag + 1e-30
            assert abs(got - exact) <= bound, f"{isa} {t}: {got!r} vs exact {exact!r}"


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("t", sorted(WEIGHTS))
def test_extreme_blocks_rows_bit_identical(isa, t):
    has_rows = lib.ds4_matmul_rows_kernel(Q._isa(isa), Q.type_info(t).id) != ffi.NULL
    n = 256 * N_BLOCKS
    w = np.concatenate([_row(wb) for wb in WEIGHTS[t]])
    n_out = len(WEIGHTS[t])
    acts = _acts()
    act = np.concatenate(acts)
    nr, stride = len(acts), acts[0].size
    rb = w.size // n_out
    out, rcs = {}, {}
    for multi in (0, 1):
        o = np.full(nr * n_out, np.nan, np.float32)
        err = new_error()
        rcs[multi] = lib.ds4_matmul_rows(Q._isa(isa), Q.type_info(t).id, ffi.from_buffer(w), rb,
                                         n_out, ffi.from_buffer(act), stride, n, nr, multi,
                                         ffi.cast("float *", ffi.from_buffer(o)), err)
        out[multi] = o
    assert rcs[0] == 0
    if not has_rows:
        # no multi-row kernel: the forward loops the one-row dot, and asking
        # for the multi-row one is refused, not faked
        assert rcs[1] == lib.DS4_ERR_UNSUPPORTED
        return
    assert rcs[1] == 0
    np.testing.assert_array_equal(out[1].view(np.uint32), out[0].view(np.uint32))
