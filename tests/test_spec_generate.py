"""Speculative decoding inside ds4py.generate: the output is the serial output.

The reference is ``generate(..., draft=False)`` (the plain loop, one eval per
token, already checked against a manual loop and llama.cpp's sampler in
test_generate.py / test_sampling.py). With drafting, an Oracle drafter
replays that reference (optionally corrupted at chosen generated indices),
so drafted blocks are accepted and rejected at every depth; the model's
bundled random head is accepted essentially never. Compared exactly:
tokens, text, finish reason, stop string, the session's n_past and last
logits row, evaluated_tokens.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import ds4py
from ds4py import generate, stream_generate
from ds4py.cache import PrefixCache
from ds4py.spec import Drafter, FixedPolicy

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "golden", "models")
PROMPT = "The quick brown fox"
_models: dict = {}


def model(name="dense-q8_0"):
    if name not in _models:
        _models[name] = ds4py.load(os.path.join(MODELS, name + ".gguf"), n_threads=2)
    return _models[name]


class Oracle(Drafter):
    """Drafts the reference tokens; generated indices in `corrupt` get a wrong one."""

    name = "oracle"

    def __init__(self, tokens, corrupt=(), vocab=512):
        self.tokens, self.corrupt, self.vocab = list(tokens), set(corrupt), vocab

    def propose(self, state, k):
        g = len(state.generated)
        out = []
        for i in range(g, g + k):
            t = self.tokens[i] if i < len(self.tokens) else 0
            out.append((t + 1) % self.vocab if i in self.corrupt else t)
        return out


def run(m, prompt=PROMPT, **kw):
    with m.new_session() as s:
        g = generate(m, prompt, session=s, **kw)
        return g, s.n_past, np.array(s.last_logits())


def same(a, b):
    ga, na, la = a
    gb, nb, lb = b
    assert gb.tokens == ga.tokens
    assert gb.text == ga.text
    assert gb.finish_reason == ga.finish_reason
    assert gb.stop_string == ga.stop_string
    assert gb.evaluated_tokens == ga.evaluated_tokens
    assert nb == na
    np.testing.assert_array_equal(lb, la)  # the session holds exactly the serial rows


GREEDY = dict(temperature=0)
SAMPLED = dict(temperature=0.9, top_k=50, top_p=0.95, min_p=0.02, seed=1234)
PENALISED = dict(SAMPLED, repeat_penalty=1.3, repeat_last_n=16, frequency_penalty=0.2,
                 presence_penalty=0.1)
CORRUPT = (2, 3, 9, 17, 18, 19, 30)


@pytest.mark.parametrize("mode", ["greedy", "stream", "position", "penalised"])
@pytest.mark.parametrize("depth", [1, 2, 3, 4, 8, None])
def test_drafted_equals_serial(mode, depth):
    """Greedy and seeded sampling (both draw modes, with penalties): every
    forced depth and the adaptive policy give the serial output."""
    m = model()
    kw = {"greedy": GREEDY, "stream": SAMPLED, "position": dict(SAMPLED, draw="position"),
          "penalised": PENALISED}[mode]
    ref = run(m, max_tokens=40, draft=False, **kw)
    assert ref[0].draft["drafting"] is False
    pol = FixedPolicy(depth) if depth else None
    got = run(m, max_tokens=40, drafter=Oracle(ref[0].tokens, CORRUPT), draft_policy=pol, **kw)
    same(ref, got)
    d = got[0].draft
    assert d["drafting"] and d["drafter"] == "oracle"
    if depth:
        # accepted drafts really happened (the oracle is right except at CORRUPT)
        assert d["accepted"] > 0 and d["drafted"] > d["accepted"]


@pytest.mark.parametrize("depth", [1, 3, 7])
def test_bundled_head_default_on(depth):
    """The golden model bundles a head: drafting is on by default
    (NOT_APPLICABLE verdict), greedy and sampled, and changes nothing."""
    m = model("moe-q8_0")
    for kw in (GREEDY, SAMPLED):
        ref = run(m, max_tokens=24, draft=False, **kw)
        auto = run(m, max_tokens=24, **kw)
        forced = run(m, max_tokens=24, draft_depth=depth, **kw)
        same(ref, auto)
        same(ref, forced)
        assert auto[0].draft["verdict"] == "NOT_APPLICABLE" and auto[0].draft["drafting"]
        assert forced[0].draft["drafted"] > 0


def _stop_inside_block(ref_tokens, tok, at):
    """A stop string that the reference completes at generated index `at`."""
    return tok.decode(ref_tokens[at - 1:at + 1])


@pytest.mark.parametrize("kw", [GREEDY, SAMPLED])
def test_finish_inside_drafted_block(kw):
    """max_tokens, a stop string and EOS landing inside a depth-7 block."""
    m = model()
    tok = m.tokenizer
    ref = run(m, max_tokens=40, draft=False, **kw)
    toks = ref[0].tokens
    for mt in (1, 2, 5, 11, 13):
        a = run(m, max_tokens=mt, draft=False, **kw)
        b = run(m, max_tokens=mt, drafter=Oracle(toks), draft_depth=7, **kw)
        same(a, b)
    for at in (4, 10, 20):
        stop = _stop_inside_block(toks, tok, at)
        a = run(m, max_tokens=40, draft=False, stop=stop, **kw)
        b = run(m, max_tokens=40, drafter=Oracle(toks), draft_depth=7, stop=stop, **kw)
        assert a[0].finish_reason == "stop"
        same(a, b)
    # EOS: the bias makes the end-of-generation id certain from index 0 on
    eos = sorted(tok.eog_ids)[0]
    a = run(m, max_tokens=40, draft=False, logit_bias={eos: 1e9}, **kw)
    b = run(m, max_tokens=40, drafter=Oracle([eos] * 40), draft_depth=5,
            logit_bias={eos: 1e9}, **kw)
    assert a[0].finish_reason == "eos"
    same(a, b)


@pytest.mark.parametrize("kw", [GREEDY, SAMPLED])
def test_eos_inside_a_block_after_accepted_drafts(kw, monkeypatch):
    """The reference's token at generated index 10 is declared the
    end-of-generation id (the tokenizer's eog set, patched for the test):
    it then falls inside a depth-7 block of accepted drafts, and generation
    ends there exactly as serial (the EOS token in neither tokens nor text)."""
    m = model()
    ref = run(m, max_tokens=40, draft=False, **kw)
    toks = ref[0].tokens
    eos = toks[10]
    monkeypatch.setattr(type(m.tokenizer), "eog_ids", property(lambda self: frozenset({eos})))
    a = run(m, max_tokens=40, draft=False, **kw)
    b = run(m, max_tokens=40, drafter=Oracle(toks), draft_depth=7, **kw)
    assert a[0].finish_reason == "eos" and a[0].tokens == toks[:toks.index(eos)]
    same(a, b)
    assert b[0].draft["accepted"] > 0


@pytest.mark.parametrize("kw", [GREEDY, SAMPLED])
def test_prefix_cache_hit_then_drafting(kw):
    """A prefix-cache hit restores the session, then drafting runs: the
    result equals the uncached serial one."""
    m = model()
    ids = m.tokenizer.encode(PROMPT * 20)
    ref = run(m, ids, max_tokens=30, draft=False, **kw)
    cache = PrefixCache(m)
    run_cached = []
    for _ in range(2):  # miss, then hit on the whole prompt
        with m.new_session() as s:
            g = generate(m, ids, session=s, cache=cache, max_tokens=30,
                         drafter=Oracle(ref[0].tokens, CORRUPT), draft_depth=4, **kw)
            run_cached.append((g, s.n_past, np.array(s.last_logits())))
    assert run_cached[1][0].cached_tokens > 0
    for got in run_cached:
        same(ref, got)
        assert got[0].draft["drafting"] and got[0].draft["accepted"] > 0


def test_stream_chunks_join_to_the_text():
    m = model()
    ref = run(m, max_tokens=30, draft=False, **SAMPLED)
    chunks = list(stream_generate(m, PROMPT, max_tokens=30, drafter=Oracle(ref[0].tokens),
                                  draft_depth=4, **SAMPLED))
    assert "".join(c.text for c in chunks) == ref[0].text
    assert [c.token for c in chunks if c.token is not None] == ref[0].tokens
    assert chunks[-1].generation.tokens == ref[0].tokens


def test_session_continuation_with_drafting():
    """A second call on the same session continues exactly as serial."""
    m = model()
    outs = []
    for draft in (False, None):
        with m.new_session() as s:
            a = generate(m, PROMPT, session=s, max_tokens=12, draft=draft, **GREEDY)
            b = generate(m, " and then", session=s, max_tokens=12, draft=draft,
                         draft_depth=None if draft is None else None, **GREEDY)
            outs.append((a.tokens, b.tokens, s.n_past))
    assert outs[0] == outs[1]


def test_json_draft_stats_keys():
    m = model()
    g = generate(m, PROMPT, max_tokens=20, draft_depth=2, **GREEDY)
    d = g.to_dict()["draft"]
    for k in ("drafter", "verdict", "rounds", "drafted", "accepted", "acceptance_per_depth",
              "mean_accepted_length", "verify_ms_per_width", "decode_tps"):
        assert k in d, k
    assert d["drafter"] == "nextn" and set(d["verify_ms_per_width"]) <= {2, 3}
    assert d["drafted"] == sum(k * n for k, n in d["depth_counts"].items())
    assert d["serial_tps"] is None  # a fixed depth never times a plain step
    # the adaptive policy times plain rounds (calibration at least): the
    # serial baseline is their rate (0.2-5x the run's decode rate: drafting moves it by
    # tens of %, a unit slip would by 1000x)
    g = generate(m, PROMPT, max_tokens=20, **GREEDY)
    d = g.to_dict()["draft"]
    assert d["drafting"] and d["serial_tps"] is not None
    plain_s = d["policy"]["costs"]["plain_s"]
    assert d["serial_tps"] == pytest.approx(1.0 / plain_s, rel=1e-9)
    assert 0.2 * g.generation_tps < d["serial_tps"] < 5.0 * g.generation_tps


def test_bad_draft_arguments():
    m = model()
    with pytest.raises(ValueError, match="draft_depth"):
        generate(m, PROMPT, max_tokens=2, draft_depth=-1)
    with pytest.raises(ValueError, match="draw"):
        generate(m, PROMPT, max_tokens=2, draw="sideways")
