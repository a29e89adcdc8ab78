"""Sessions (csrc/session.c, ds4py/session.py): batch invariance, threads,
context limits, errors, result views, per-layer hidden states.

Batch invariance (DESIGN.md invariant 1) is checked BIT for bit, in both
precisions: a row's logits must not depend on how a prompt is split into
evals (chunk sizes 1, 7, 64, 256 and all at once over the 700-token
sequence: 3 KV pages, so the decode path's split-K over several pages is
exercised against the prefill path), nor on the thread count. Fast precision
is checked on the quantized files (Q8_0, Q4_K_M: per-row activation
quantization, F16 KV) as well as F32/BF16.
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


def whole(name: str, seq: str = "s700", precision: str = "exact") -> np.ndarray:
    """All rows of `seq` in one eval, 2 threads (the baseline)."""
    if (name, seq, precision) not in _whole:
        with load(name, precision=precision) as m:
            _whole[name, seq, precision] = run_chunked(m, SEQS[seq], len(SEQS[seq]))
    return _whole[name, seq, precision]


# (file, precision) pairs whose invariance is checked: exact on the float
# files (its tests against transformers use them), fast on every file type
# (Q8_0 and Q4_K_M quantize activations per row; all use F16 KV pages).
INVARIANCE = [("dense-f32", "exact"), ("moe-f32", "exact"),
              ("dense-q4_k_m", "fast"), ("moe-q8_0", "fast"),
              ("dense-q8_0", "fast"), ("moe-q4_k_m", "fast"), ("moe-bf16", "fast")]


@pytest.mark.parametrize("name,precision", INVARIANCE)
@pytest.mark.parametrize("chunk", [1, 7, 64, 256])
def test_chunked_prefill_is_bit_identical(name, precision, chunk):
    with load(name, precision=precision) as m:
        got = run_chunked(m, SEQS["s700"], chunk)
    np.testing.assert_array_equal(bits(got), bits(whole(name, precision=precision)))


@pytest.mark.parametrize("name,precision", [("dense-bf16", "exact"), ("moe-f32", "exact"),
                                            ("dense-q4_k_m", "fast"), ("moe-q8_0", "fast"),
                                            ("dense-bf16", "fast")])
def test_thread_count_is_bit_identical(name, precision):
    with load(name, n_threads=1, precision=precision) as m1:
        one = run_chunked(m1, SEQS["s700"], 700)
        one_c = run_chunked(m1, SEQS["s700"][:300], 1)
    with load(name, n_threads=2, precision=precision) as m2:
        two = run_chunked(m2, SEQS["s700"], 700)
    np.testing.assert_array_equal(bits(one), bits(two))
    np.testing.assert_array_equal(bits(one_c), bits(two[:300]))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cuts=st.lists(st.integers(1, 99), max_size=6, unique=True),
       case=st.sampled_from([("moe-f32", "exact"), ("moe-q4_k_m", "fast")]))
def test_any_split_is_bit_identical(cuts, case):
    """Random split points of the 100-token sequence into evals."""
    name, precision = case
    toks = SEQS["s100"]
    bounds = [0] + sorted(cuts) + [len(toks)]
    with load(name, precision=precision) as m, m.new_session() as s:
        parts = [np.array(s.eval(toks[a:b], all_logits=True))
                 for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    np.testing.assert_array_equal(bits(np.concatenate(parts)),
                                  bits(whole(name, "s100", precision)))


def test_precisions_differ_and_fast_is_default():
    """Fast precision really runs other numerics than exact (quantized
    activations, F16 KV): the two must not be bit-identical on a Q8_0 file,
    yet stay close (llama.cpp-vs-transformers distance on this file is ~2.6,
    README; 3.0 leaves margin). Fast is the default."""
    with ds4py.load(os.path.join(MODELS, "dense-q8_0.gguf"), n_threads=2) as m:
        assert m.precision == "fast"
        fast = run_chunked(m, SEQS["s100"], 100)
    exact = whole("dense-q8_0", "s100", "exact")
    assert not np.array_equal(bits(fast), bits(exact))
    assert float(np.abs(fast - exact).max()) < 3.0


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


def rmsnorm64(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * w.astype(np.float64)


@pytest.mark.parametrize("name,precision", [("moe-f32", "exact"), ("dense-q8_0", "fast")])
def test_hidden_layers(name, precision):
    toks = SEQS["s100"]
    with load(name, precision=precision) as m:
        cfg = m.config
        last = cfg.n_layers - 1
        layers = [0, last, 1, last]  # any order, repeats allowed
        with m.new_session() as s:
            # return order: (logits, hidden, layer_hidden)
            lg, hid, lh = s.eval(toks, all_logits=True, return_hidden=True,
                                 hidden_layers=layers)
            assert lg.shape == (100, cfg.vocab_size) and hid.shape == (100, cfg.hidden_size)
            assert lh.shape == (100, 4, cfg.hidden_size) and not lh.flags.writeable
            lg, hid, lh = np.array(lg), np.array(hid), np.array(lh)
        with m.new_session() as s:
            # chunked: 1-token and 37-token evals, last row only
            parts = []
            for a, b in [(0, 1), (1, 38), (38, 39), (39, 100)]:
                r_lg, r_lh = s.eval(toks[a:b], hidden_layers=layers)
                assert r_lg.shape == (cfg.vocab_size,) and r_lh.shape == (4, cfg.hidden_size)
                parts.append((b - 1, np.array(r_lg), np.array(r_lh)))
            only = s.eval(toks[:2], hidden_layers=[])  # empty list: logits + [0, hidden]
            assert only[1].shape == (0, cfg.hidden_size)
            with pytest.raises(ModelError, match="not a trunk layer"):
                s.eval(toks[:1], hidden_layers=[cfg.n_layers])
            with pytest.raises(ModelError, match="not a trunk layer"):
                s.eval(toks[:1], hidden_layers=[-1])
            assert s.n_past == 102
    # invariant to chunking, bit for bit
    for row, r_lg, r_lh in parts:
        np.testing.assert_array_equal(bits(r_lg), bits(lg[row]))
        np.testing.assert_array_equal(bits(r_lh), bits(lh[row]))
    np.testing.assert_array_equal(bits(lh[:, 1]), bits(lh[:, 3]))
    # Different layers hold different residual streams.
    assert not np.allclose(lh[:, 0], lh[:, 1])
    # The last layer's residual, RMS-normalised and times output_norm (numpy,
    # float64), is the returned post-final-norm hidden. Tolerance: the core
    # computes the norm in float32 (sum of squares in double), i.e. relative
    # rounding of a few ulp, ~1e-6 of the values (|h| <= ~5 here).
    reader = gguf_py.GGUFReader(os.path.join(MODELS, name + ".gguf"))
    onorm = next(np.asarray(t.data) for t in reader.tensors if t.name == "output_norm.weight")
    want = rmsnorm64(lh[:, 1], onorm, cfg.rms_norm_eps)
    np.testing.assert_allclose(want, hid, rtol=0, atol=2e-5 * float(np.abs(hid).max()))
    # and layer 0's residual is not the embedding (the layer really ran)
    emb = next(t for t in reader.tensors if t.name == "token_embd.weight")
    if emb.tensor_type == gguf_py.GGMLQuantizationType.F32:
        e0 = np.asarray(emb.data).reshape(-1, cfg.hidden_size)[toks[0]]
        assert not np.allclose(e0, lh[0, 0], atol=1e-3)


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
