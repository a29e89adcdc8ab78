"""DFlash drafting end to end: ``ds4py.load(..., dflash=FILE)`` /
``generate(..., drafter=...)`` / ``--dflash FILE``, the pairing verdicts
it runs under, the prefix cache keeping its draft history, and exactness:
every output equals the same call with ``draft=False`` (the plain loop,
checked elsewhere against llama.cpp), byte for byte, with the session left
at the same rows.

Drafters are test-made (tests/dflash_files.py) for the golden dense trunk,
plus the shipped demo pair (ds4py/models/: the demo model and the DFlash
drafter distilled for it)."""

from __future__ import annotations

import io
import json
import os

import numpy as np
import pytest
from dflash_files import DENSE_F32, config, random_arrays, write

import ds4py
from ds4py import cli, generate, stream_generate
from ds4py.cache import PrefixCache
from ds4py.dflash import DFlashDrafter, TapSession
from ds4py.errors import ModelError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(ROOT, "ds4py", "models", "demo-q8_0.gguf")
DEMO_DFLASH = os.path.join(ROOT, "ds4py", "models", "demo-dflash-q8_0.gguf")
PROMPT = [(11 * i + 5) % 480 for i in range(23)]
GREEDY = dict(temperature=0)
SAMPLED = dict(temperature=0.9, top_k=50, top_p=0.95, seed=77)


@pytest.fixture(scope="module")
def plain():
    return ds4py.load(DENSE_F32, precision="exact", n_threads=2)


@pytest.fixture(scope="module")
def agreeing(plain, tmp_path_factory):
    """A drafter that agrees with the target often but not always (as
    test_dflash._agreeing_drafter): no attention/FFN output, so every draft
    is argmax(E . E[mask]) = the mask token; mask = the token serial greedy
    decoding repeats most."""
    serial = generate(plain, PROMPT, max_tokens=40, draft=False, **GREEDY).tokens
    mask = int(np.bincount(serial).argmax())
    cfg = config(mask_token_id=mask)
    arrays = random_arrays(cfg, seed=5)
    for i in range(cfg.n_layer):
        arrays[f"blk.{i}.attn_output.weight"][:] = 0
        arrays[f"blk.{i}.ffn_down.weight"][:] = 0
    arrays["output_norm.weight"][:] = 1
    return write(tmp_path_factory.mktemp("dfl") / "agree.gguf", cfg, arrays)


@pytest.fixture(scope="module")
def target(agreeing):
    m = ds4py.load(DENSE_F32, precision="exact", n_threads=2, dflash=agreeing)
    assert m.dflash.config.block_size == 6
    return m


def run(m, prompt=PROMPT, **kw):
    with m.new_session() as s:
        g = generate(m, prompt, session=s, **kw)
        return g, s.n_past, np.array(s.last_logits())


def same(a, b):
    (ga, na, la), (gb, nb, lb) = a, b
    assert (gb.tokens, gb.text, gb.finish_reason, gb.stop_string, gb.evaluated_tokens) == \
        (ga.tokens, ga.text, ga.finish_reason, ga.stop_string, ga.evaluated_tokens)
    assert nb == na
    np.testing.assert_array_equal(lb, la)  # the session holds exactly the serial rows


@pytest.mark.parametrize("kw", [GREEDY, SAMPLED, dict(SAMPLED, draw="position")],
                         ids=["greedy", "stream", "position"])
@pytest.mark.parametrize("depth", [1, 3, 5, None])
def test_load_dflash_generate_equals_serial(target, kw, depth):
    ref = run(target, max_tokens=40, draft=False, **kw)
    got = run(target, max_tokens=40, draft_depth=depth, force_draft=True, **kw)
    same(ref, got)
    d = got[0].draft
    assert d["drafter"] == "dflash" and d["drafting"] and d["verdict"] == "ALLOW_FORCED_UNKNOWN"
    assert d["pairing"]["draft"]["kind"] == "dflash"
    if depth is not None:
        # the depth asked for (shallower only where the budget's end is nearer)
        assert d["drafted"] > 0 and max(d["depth_counts"]) == depth
    if depth is not None and kw is GREEDY:
        assert 0 < d["accepted"] < d["drafted"]  # both outcomes happen


def test_depth_is_capped_by_the_block(target):
    """A forced depth deeper than the block (B-1 = 5 drafts) drafts B-1."""
    g = generate(target, PROMPT, max_tokens=30, draft_depth=7, force_draft=True, **GREEDY)
    assert max(g.draft["depth_counts"]) == 5 and g.draft["drafted"] > 0


def test_unknown_pairing_is_refused_without_force(target):
    ref = run(target, max_tokens=20, draft=False, **GREEDY)
    got = run(target, max_tokens=20, **GREEDY)
    same(ref, got)
    d = got[0].draft
    assert d["drafting"] is False and d["verdict"] == "REFUSE_UNKNOWN"


def test_finish_inside_a_drafted_block(target):
    toks = run(target, max_tokens=40, draft=False, **GREEDY)[0].tokens
    tok = target.tokenizer
    for mt in (1, 2, 7, 13):
        same(run(target, max_tokens=mt, draft=False, **GREEDY),
             run(target, max_tokens=mt, draft_depth=5, force_draft=True, **GREEDY))
    for at in (5, 12):
        stop = tok.decode(toks[at - 1:at + 1])
        a = run(target, max_tokens=40, draft=False, stop=stop, **GREEDY)
        assert a[0].finish_reason == "stop"
        same(a, run(target, max_tokens=40, draft_depth=5, force_draft=True, stop=stop,
                    **GREEDY))


def test_stream_and_explicit_drafter(target, plain, agreeing):
    ref = run(target, max_tokens=30, draft=False, **GREEDY)[0]
    chunks = list(stream_generate(target, PROMPT, max_tokens=30, draft_depth=3,
                                  force_draft=True, **GREEDY))
    assert [c.token for c in chunks if c.token is not None] == ref.tokens
    # generate(drafter=...) on a model loaded without one: the caller's drafter
    d = DFlashDrafter.load(plain, agreeing)
    g = generate(plain, PROMPT, max_tokens=30, drafter=d, draft_depth=3, **GREEDY)
    assert g.tokens == ref.tokens and g.draft["drafter"] == "dflash" and g.draft["drafted"]
    assert d.passes > 0


def test_load_refusals(agreeing):
    with pytest.raises(ModelError, match="both given"):
        ds4py.load(DENSE_F32, dflash=agreeing, draft_head=agreeing)
    with pytest.raises(ModelError, match="a full model, not a DFlash drafter"):
        ds4py.load(DENSE_F32, dflash=DENSE_F32)


# ------------------------------------------------------------ prefix cache --

def _cached_calls(m, ids, cache, n, **kw):
    out = []
    for _ in range(n):
        with m.new_session() as s:
            g = generate(m, ids, session=s, cache=cache, max_tokens=30, **kw)
            out.append((g, s.n_past, np.array(s.last_logits())))
    return out


@pytest.mark.parametrize("kw", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_prefix_cache_hit_keeps_drafting(target, kw, monkeypatch):
    """The snapshots carry the DFlash taps: a hit (on the whole prompt, then
    on a prefix of a longer one crossing a 256-token page) keeps drafting
    and gives the uncached serial result."""
    def no_rebuild(self, ids):
        raise AssertionError("the context was re-evaluated, not restored from the taps")
    monkeypatch.setattr(TapSession, "rebuild", no_rebuild)
    ids = [(7 * i + 3) % 480 for i in range(300)]
    longer = ids + [(5 * i + 1) % 480 for i in range(40)]
    cache = PrefixCache(target)
    hits = _cached_calls(target, ids, cache, 2, draft_depth=3, force_draft=True, **kw)
    hits += _cached_calls(target, longer, cache, 1, draft_depth=3, force_draft=True, **kw)
    assert hits[1][0].cached_tokens == len(ids) and hits[2][0].cached_tokens >= len(ids)
    for got, prompt in zip(hits, (ids, ids, longer), strict=True):
        same(run(target, prompt, max_tokens=30, draft=False, **kw), got)
        d = got[0].draft
        assert d["drafting"] and d["drafted"] > 0, d["refused"]


def test_prefix_cache_charges_the_tap_history_once(target):
    """Entries cached by a drafting request carry the DFlash taps of their
    history (n_taps x n_embd floats a position) and the cache charges them:
    the same entries cost more than a non-drafting request's by one history
    buffer -- at least the longest entry's rows, and under the TapSession's
    growth bound (capacity max(2 * rows, 64) when it last grew, so < 2 x the
    rows + 64) rather than once per entry (3 entries would be ~3x). Clearing
    the cache releases it."""
    ids = [(7 * i + 3) % 480 for i in range(300)]
    plain_cache, drafted_cache = PrefixCache(target), PrefixCache(target)
    _cached_calls(target, ids, plain_cache, 1, draft=False, **GREEDY)
    _cached_calls(target, ids, drafted_cache, 1, draft_depth=3, force_draft=True, **GREEDY)
    entries = drafted_cache.entries()
    assert entries == plain_cache.entries() and len(entries) >= 2
    row = len(target.dflash.config.target_layers) * target.dflash.config.n_embd * 4
    longest = max(n for n, _ in entries)
    extra = drafted_cache.nbytes - plain_cache.nbytes
    assert longest * row <= extra < (2 * longest + 64) * row, (extra / row, longest)
    # a second identical request hits and adds no entry: nothing more charged
    _cached_calls(target, ids, drafted_cache, 1, draft_depth=3, force_draft=True, **GREEDY)
    assert drafted_cache.entries() == entries
    assert drafted_cache.nbytes - plain_cache.nbytes == extra
    drafted_cache.clear()
    assert drafted_cache.nbytes == 0


def test_prefix_cache_hit_on_a_snapshot_without_taps(target):
    """An entry cached by a request that did not draft carries no taps: the
    DFlash request rebuilds its context from the prefix and still drafts."""
    ids = [(3 * i + 2) % 480 for i in range(60)]
    cache = PrefixCache(target)
    _cached_calls(target, ids, cache, 1, draft=False, **GREEDY)
    got = _cached_calls(target, ids, cache, 1, draft_depth=3, force_draft=True, **GREEDY)[0]
    assert got[0].cached_tokens == len(ids)
    same(run(target, ids, max_tokens=30, draft=False, **GREEDY), got)
    assert got[0].draft["drafting"] and got[0].draft["drafted"] > 0


def test_restored_context_is_a_fresh_context(plain, agreeing):
    """After a restore from a tapped snapshot, the drafter's block logits are
    bit-identical to those of a context built from one fresh evaluation."""
    d = DFlashDrafter.load(plain, agreeing)
    s = d.session(plain.new_session())
    s.eval(PROMPT)
    snap = s.snapshot()
    s.eval([1, 2, 3, 4])  # move on, then come back
    s.restore(snap)
    s.sync()   # the context is filled lazily (before a propose): bring it up to date
    assert s.valid and d.ctx.n == len(PROMPT)
    d2 = DFlashDrafter.load(plain, agreeing)
    s2 = d2.session(plain.new_session())
    s2.restore(snap)  # another session, another drafter: rebuilt from the taps
    s2.sync()
    assert s2.valid and d2.ctx.n == len(PROMPT)
    fresh = DFlashDrafter.load(plain, agreeing)
    fs = fresh.session(plain.new_session())
    fs.eval(PROMPT)
    fs.sync()
    want = np.array(fresh.ctx.propose(9, len(PROMPT))[1])
    assert np.array_equal(d.ctx.propose(9, len(PROMPT))[1], want)
    assert np.array_equal(d2.ctx.propose(9, len(PROMPT))[1], want)
    # the restored history is copied before it is written: the snapshot's taps stay
    s.eval([5, 6])
    s3 = DFlashDrafter.load(plain, agreeing)
    ss3 = s3.session(plain.new_session())
    ss3.restore(snap)
    ss3.sync()
    assert np.array_equal(s3.ctx.propose(9, len(PROMPT))[1], want)


# --------------------------------------------------------------------- CLI --

def _cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_cli_dflash_refusals(agreeing, tmp_path):
    code, _, err = _cli("generate", "-m", DENSE_F32, "-p", "x", "--raw", "--draft-head",
                        agreeing, "--max-tokens", "2")
    assert code == 2 and "a DFlash drafter" in err and "pass it with --dflash" in err
    code, _, err = _cli("generate", "-m", DENSE_F32, "-p", "x", "--raw", "--dflash", DENSE_F32,
                        "--max-tokens", "2")
    assert code == 2 and "--dflash" in err and "a full model, not a DFlash drafter" in err
    code, _, err = _cli("generate", "-m", DENSE_F32, "-p", "x", "--raw", "--dflash", agreeing,
                        "--draft-head", agreeing, "--max-tokens", "2")
    assert code == 2 and "draft with one" in err


def _cli_json(*argv):
    code, out, err = _cli("generate", *argv, "--json", "--threads", "2")
    assert code == 0, err
    return json.loads(out), err


@pytest.mark.parametrize("prompt", ["def fibonacci(n):", "The capital of France is"])
def test_demo_cli_dflash_equals_no_draft(prompt):
    """The shipped pair was measured to lose speed (ds4py/spec/pairs.json:
    REFUSE_MEASURED_BAD): --dflash with --force-draft is refused all the
    same (never overridable), without it too; the output is --no-draft's."""
    base = ["-m", DEMO, "-p", prompt, "--raw", "--temp", "0", "--max-tokens", "48"]
    ref, _ = _cli_json(*base, "--no-draft")
    for force in (["--force-draft"], []):
        got, err = _cli_json(*base, "--dflash", DEMO_DFLASH, *force)
        assert got["text"] == ref["text"] and got["tokens"] == ref["tokens"]
        # the CLI checks the pairing at attach: the verdict line, then no drafting
        assert '"verdict": "REFUSE_MEASURED_BAD"' in err
        assert got["draft"]["drafting"] is False and got["draft"]["drafter"] is None


@pytest.mark.parametrize("prompt", ["def fibonacci(n):", "The capital of France is"])
def test_demo_dflash_drafting_equals_serial(prompt):
    """Drafting with the shipped drafter as spec-calibrate measures it
    (classifier.measuring(): the table is not consulted), adaptive and at a
    fixed depth: the output is serial's, token for token."""
    from ds4py.spec.classifier import measuring

    serial_model = ds4py.load(DEMO, n_threads=2)
    m = ds4py.load(DEMO, n_threads=2, dflash=DEMO_DFLASH)
    try:
        ref = generate(serial_model, prompt, max_tokens=48, temperature=0, chat=False,
                       draft=False)
        for kw in ({}, {"draft_depth": 3}):
            with measuring():
                got = generate(m, prompt, max_tokens=48, temperature=0, chat=False,
                               force_draft=True, **kw)
            assert got.tokens == ref.tokens and got.text == ref.text
            d = got.draft
            assert d["drafter"] == "dflash" and d["drafting"], d
            if kw:  # a fixed depth drafts every round: what is accepted does not depend on timing
                assert d["drafted"] > 0 and d["accepted"] > 0
    finally:
        m.close()
        serial_model.close()


def test_long_prompt_prefill_in_pieces(target):
    """A prompt longer than TapSession's eval piece (256 rows: every row's
    taps are needed, so pieces bound the rows kept) crossing KV pages."""
    ids = [(13 * i + 7) % 480 for i in range(600)]
    ref = run(target, ids, max_tokens=20, draft=False, **GREEDY)
    got = run(target, ids, max_tokens=20, draft_depth=4, force_draft=True, **GREEDY)
    same(ref, got)
    assert got[0].draft["drafting"] and got[0].draft["drafted"] > 0
