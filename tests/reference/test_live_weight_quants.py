"""ds4py's weight quantizers against llama.cpp's ggml_quantize_chunk, live, on
fresh hypothesis-generated matrices (opt-in: `make test-reference`).

The property of tests/test_quantize_weights.py (byte identity with
ggml_quantize_chunk(type, ..., imatrix=NULL)) on many more inputs: the
fixture generator's 12 input kinds with fresh seeds and shapes, and raw
hypothesis floats (any finite value, ±Inf, payload-free NaNs of both signs).
NaNs with a payload are excluded: ggml's own result for them is an accident
of its register allocation (tests/golden/quants_weights/README.md). Needs
llama-cpp-python built as tests/golden/quants/README.md describes; if it is
missing this module fails to import, i.e. the opt-in run FAILS rather than
skipping.
"""

from __future__ import annotations

import llamacpp_ggml as L
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from make_weight_quant_fixtures import KINDS, TYPES, weight_rows

from ds4py import quants

pytestmark = pytest.mark.reference

G = L.load()

# Fresh inputs each run (no derandomize): this is a search, the fixtures are
# the fixed regression set. ~13 types x 2 tests x 200 examples: about half a minute.
LIVE = settings(max_examples=200, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

POS_NAN = np.array([0x7FC00000], np.uint32).view(np.float32)[0]
NEG_NAN = np.array([0xFFC00000], np.uint32).view(np.float32)[0]


def shape_for(draw, name: str) -> tuple[int, int]:
    bs = max(G.block_size(L.GGML_TYPES[name]), 32)
    rows = draw(st.integers(1, 4))
    blocks = draw(st.sampled_from([1, 2, 3, 5, 16]))
    return rows, blocks * bs


def assert_same(name: str, x: np.ndarray) -> None:
    t = L.GGML_TYPES[name]
    with np.errstate(all="ignore"):
        want = G.quantize_chunk(t, x, nrows=x.shape[0]).reshape(x.shape[0], -1)
    got = quants.quantize_weights(name, x)
    if not np.array_equal(got, want):
        r, b = (int(v[0]) for v in np.nonzero(got != want))
        ts = G.type_size(t)
        raise AssertionError(f"{name} {x.shape}: row {r} block {b // ts} byte {b % ts}: "
                             f"got {got[r, b]:#04x}, llama.cpp {want[r, b]:#04x}")


@pytest.mark.parametrize("name", TYPES)
@LIVE
@given(data=st.data())
def test_kinds_match_llamacpp(name, data):
    kind = data.draw(st.sampled_from(KINDS))
    seed = data.draw(st.integers(0, 2**63 - 1))
    rows, n = shape_for(data.draw, name)
    with np.errstate(all="ignore"):
        x = weight_rows(np.random.default_rng(seed), kind, rows, n)
    assert_same(name, x)


_any_value = st.one_of(
    st.floats(width=32, allow_nan=False),                 # any finite value or ±Inf
    st.floats(-1.0, 1.0, width=32),                       # plain weights
    st.sampled_from([0.0, -0.0, POS_NAN, NEG_NAN, 1e-45, -1e-15, 65504.0, 65520.0]),
)


@pytest.mark.parametrize("name", TYPES)
@LIVE
@given(data=st.data())
def test_raw_floats_match_llamacpp(name, data):
    rows, n = shape_for(data.draw, name)
    scale = data.draw(st.sampled_from([1.0, 1e-20, 1e20]))
    # Hypothesis draws at most a few thousand list elements, so the matrix is
    # filled from a drawn pool of values at drawn positions (a drawn seed).
    pool = data.draw(st.lists(_any_value, min_size=1, max_size=300))
    seed = data.draw(st.integers(0, 2**63 - 1))
    idx = np.random.default_rng(seed).integers(0, len(pool), rows * n)
    with np.errstate(all="ignore"):
        x = (np.array(pool, dtype=np.float32)[idx] * np.float32(scale)).reshape(rows, n)
    # A nonzero finite scale keeps every NaN's (zero) payload and makes no new
    # NaN, so only the two payload-free NaNs of _any_value appear.
    assert_same(name, x)
