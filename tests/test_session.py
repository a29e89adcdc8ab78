"""Sessions (csrc/session.c, ds4py/session.py): batch invariance, threads,
context limits, errors, result views.

Batch invariance (DESIGN.md invariant 1) is checked BIT for bit: a row's
logits must not depend on how a prompt is split into evals (chunk sizes 1,
7, 64, 256 and all at once over the 700-token sequence: 3 KV pages, so the
decode path's split-K over several pages is exercised against the prefill
path), nor on the thread count.
"""

from __future__ import annotations

import os

import gguf as gguf_py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ds4py
from ds4py import ModelError

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "golden", "models")
SEQS = dict(np.load(os.path.join(HERE, "golden", "logits", "sequences.npz")))


def load(name: str, **kw) -> ds4py.Model:
    kw.setdefault("precision", "exact")
    kw.setdefault("n_threads", 2)
    return ds4py.load(os.path.join(MODELS, name + ".gguf"), **kw)


def run_chunked(model: ds4py.Model, tokens, chunk: int) -> np.ndarray:
    with model.new_session() as s:
        out = [np.array(s.eval(tokens[i:i + chunk], all_logits=True))
               for i in range(0, len(tokens), chunk)]
        assert s.n_past == len(tokens)
    return np.concatenate(out)


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


_whole: dict = {}


def whole(name: str, seq: str = "s700") -> np.ndarray:
    """All rows of `seq` in one eval, 2 threads (the baseline)."""
    if (name, seq) not in _whole:
        with load(name) as m:
            _whole[name, seq] = run_chunked(m, SEQS[seq], len(SEQS[seq]))
    return _whole[name, seq]


@pytest.mark.parametrize("name", ["dense-f32", "moe-f32"])
@pytest.mark.parametrize("chunk", [1, 7, 64, 256])
def test_chunked_prefill_is_bit_identical(name, chunk):
    with load(name) as m:
        got = run_chunked(m, SEQS["s700"], chunk)
    np.testing.assert_array_equal(bits(got), bits(whole(name)))


@pytest.mark.parametrize("name", ["dense-bf16", "moe-f32"])
def test_thread_count_is_bit_identical(name):
    with load(name, n_threads=1) as m1:
        one = run_chunked(m1, SEQS["s700"], 700)
        one_c = run_chunked(m1, SEQS["s700"][:300], 1)
    with load(name, n_threads=2) as m2:
        two = run_chunked(m2, SEQS["s700"], 700)
    np.testing.assert_array_equal(bits(one), bits(two))
    np.testing.assert_array_equal(bits(one_c), bits(two[:300]))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cuts=st.lists(st.integers(1, 99), max_size=6, unique=True))
def test_any_split_is_bit_identical(cuts):
    """Random split points of the 100-token sequence into evals."""
    toks = SEQS["s100"]
    bounds = [0] + sorted(cuts) + [len(toks)]
    with load("moe-f32") as m, m.new_session() as s:
        parts = [np.array(s.eval(toks[a:b], all_logits=True))
                 for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    np.testing.assert_array_equal(bits(np.concatenate(parts)), bits(whole("moe-f32", "s100")))


def test_last_row_and_hidden_views():
    toks = SEQS["s100"]
    with load("dense-f32") as m, m.new_session() as s:
        last, hid = s.eval(toks[:40], return_hidden=True)
        assert last.shape == (512,) and hid.shape == (256,)
        assert last.dtype == np.float32 and not last.flags.writeable
        last, hid = np.array(last), np.array(hid)
        rows, hids = s.eval(toks[40:], all_logits=True, return_hidden=True)
        assert rows.shape == (60, 512) and hids.shape == (60, 256)
        rows, hids = np.array(rows), np.array(hids)
        only_last = np.array(s.eval(toks[:3]))  # positions 100..102
    ref = whole("dense-f32", "s100")
    np.testing.assert_array_equal(bits(last), bits(ref[39]))
    np.testing.assert_array_equal(bits(rows), bits(ref[40:]))
    assert only_last.shape == (512,)
    # The hidden rows are post-final-norm: the (tied) head applied to them
    # in float64 by numpy gives the logits. Tolerance: float32 dot products
    # over 256 terms of size ~|h|*|w|, i.e. ~1e-5 relative to the logit scale.
    emb = gguf_py.GGUFReader(os.path.join(MODELS, "dense-f32.gguf")).get_tensor(0)
    assert emb.name == "token_embd.weight"
    w = np.asarray(emb.data, dtype=np.float64).reshape(512, 256)
    np.testing.assert_allclose(hids.astype(np.float64) @ w.T, rows, rtol=0, atol=1e-4)
    np.testing.assert_allclose(hid.astype(np.float64) @ w.T, last, rtol=0, atol=1e-4)
    # RMS of a post-norm row is about the RMS of the norm weight, not 1 or the
    # residual's scale: checks the final norm ran (weights are ~N(1, 0.15)).
    assert 0.5 < float(np.sqrt((hids ** 2).mean())) < 2.0


def test_context_overflow_leaves_session_unchanged():
    toks = SEQS["s100"]
    with load("dense-f32", n_ctx=32) as m, m.new_session() as s:
        s.eval(toks[:20])
        with pytest.raises(ModelError) as ei:
            s.eval(toks[20:33])
        assert "prompt of 13 tokens does not fit: n_past 20 + 13 > n_ctx 32" in str(ei.value)
        assert s.n_past == 20
        # the failed eval changed nothing: continuing gives a fresh run's rows
        rest = np.array(s.eval(toks[20:32], all_logits=True))
        assert s.n_past == 32
        with pytest.raises(ModelError, match="n_past 32 \\+ 1 > n_ctx 32"):
            s.eval(toks[:1])
    with load("dense-f32", n_ctx=32) as m:
        fresh = run_chunked(m, toks[:32], 32)
    np.testing.assert_array_equal(bits(rest), bits(fresh[20:]))


def test_bad_tokens_are_refused():
    with load("moe-f32") as m, m.new_session() as s:
        s.eval([1, 2, 3])
        first = np.array(s.eval([4], all_logits=True))
        for bad, msg in [([], "at least one token"),
                         ([5, 512], "token id 512 at index 1 is out of range \\[0, 512\\)"),
                         ([-1], "token id -1 at index 0 is out of range"),
                         ([7, 2**40], "token id 1099511627776 at index 1 is out of range"),
                         ([1.5, 2.0], "integer"),
                         ([[1, 2]], "1-D")]:
            with pytest.raises(ModelError, match=msg):
                s.eval(bad)
            assert s.n_past == 4
    # the refusals changed nothing: the same session state as a clean run
    with load("moe-f32") as m, m.new_session() as s:
        s.eval([1, 2, 3])
        np.testing.assert_array_equal(bits(first), bits(np.array(s.eval([4], all_logits=True))))


def test_session_lifetime():
    m = load("dense-f32", n_threads=1)
    s = m.new_session()
    m.close()  # the session keeps the C model alive
    a = np.array(s.eval(SEQS["s16"]))
    s.close()
    s.close()
    assert s.closed
    with pytest.raises(ModelError, match="closed"):
        s.eval([1])
    with pytest.raises(ModelError, match="closed"):
        m.new_session()
    np.testing.assert_array_equal(bits(a), bits(whole("dense-f32", "s16")[-1]))
