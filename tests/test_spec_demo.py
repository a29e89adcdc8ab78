"""Speculative decoding on the shipped demo model (ds4py/models/demo-q8_0.gguf),
whose MTP head is trained: its drafts are accepted most of the time, so
these tests exercise long accepted blocks, the core's head priming across
prefill, verify/accept and prefix-cache restores, and the core's greedy
round (csrc/spec_round.c) against the same steps made from Python.

The reference is always ``generate(..., draft=False)`` (the plain loop,
checked elsewhere against a manual loop and llama.cpp) on a fresh session.
"""

from __future__ import annotations

import numpy as np
import pytest

import ds4py
from ds4py import generate
from ds4py.cache import PrefixCache
from ds4py.demo_model import demo_model_path
from ds4py.spec import AdaptivePolicy, DraftState, FixedPolicy, NextnDrafter, speculative_generate

CODE = ("class Stack:\n    \"\"\"A last-in, first-out stack.\"\"\"\n\n    def __init__(self):\n"
        "        self.items = []\n\n    def push(self, item):\n")
GREEDY = dict(temperature=0)
_model: list = []


def demo() -> ds4py.Model:
    if not _model:
        _model.append(ds4py.load(demo_model_path(), n_threads=2))
    return _model[0]


def long_prompt(m) -> list[int]:
    """A code prompt of more than 256 tokens: it crosses a KV page (and the
    cache snapshots at 256)."""
    ids = m.tokenizer.encode(CODE * 10)
    assert len(ids) > 300
    return ids[:300]


class PyHead(NextnDrafter):
    """The head's greedy steps made from Python (nextn_eval per step and
    np.argmax): overriding _pick takes NextnDrafter off the core's path."""

    name = "nextn-py"

    def _pick(self, logits, j, state):
        return int(np.argmax(logits))


def test_trained_head_is_accepted_and_every_depth_is_exact():
    """Depths 1..8 and adaptive reproduce serial greedy decoding; the trained
    head is accepted (at depth 1 it was measured at ~0.95 on code: a head
    primed from a wrong history falls to near 0, which exactness alone
    would not show)."""
    m = demo()
    ids = m.tokenizer.encode(CODE)
    ref = generate(m, ids, max_tokens=60, draft=False, **GREEDY)
    for pol in [FixedPolicy(k) for k in range(1, 9)] + [AdaptivePolicy()]:
        toks, st = speculative_generate(m, ids, 60, policy=pol)
        assert toks == ref.tokens, pol
        if isinstance(pol, FixedPolicy):
            assert st["draft_rounds"] > 0
        if pol.enabled and isinstance(pol, FixedPolicy) and pol.depth == 1:
            assert st["acceptance"] > 0.5, st


@pytest.mark.parametrize("depth", [1, 3, 5])
def test_core_round_equals_python_round(depth):
    """ds4_spec_propose / ds4_spec_verify_greedy (one call each per round)
    make the same drafts, the same acceptance and the same output as the
    head stepped from Python, and leave the head in the same state."""
    m = demo()
    ids = m.tokenizer.encode(CODE)
    got = {}
    for d in (NextnDrafter(m), PyHead(m)):
        with m.new_session() as s:
            toks, st = speculative_generate(m, ids, 50, session=s, drafter=d,
                                            policy=FixedPolicy(depth))
            hid = np.array(s.last_hidden())
            head = np.array(m.nextn_draft(s, toks[-1], hid)[0])
            got[d.name] = (toks, st["accept_counts"], st["drafted"], head)
    a, b = got["nextn"], got["nextn-py"]
    assert a[0] == b[0] and a[1] == b[1] and a[2] == b[2]
    np.testing.assert_array_equal(a[3], b[3])


def test_prefix_cache_hit_keeps_the_heads_history():
    """A drafting request fills the cache with snapshots that carry the
    head's history; a later request that hits them (whole prompt, and a
    continuation that hits the end-of-generation entry) drafts at once,
    with drafts equal to a fresh session's, and its output is the serial
    output."""
    m = demo()
    ids = long_prompt(m)
    ref = generate(m, ids, max_tokens=40, draft=False, **GREEDY)
    cache = PrefixCache(m)
    g1 = generate(m, ids, max_tokens=40, cache=cache, draft_depth=3, **GREEDY)
    assert g1.tokens == ref.tokens and g1.cached_tokens == 0
    assert g1.draft["drafting"] and g1.draft["accepted"] > 0
    assert cache.head_kv_pages > 0
    for key in cache.keys():
        assert cache.lookup(key)[1].nextn_covered
    g2 = generate(m, ids, max_tokens=40, cache=cache, draft_depth=3, **GREEDY)
    assert g2.cached_tokens == len(ids) and g2.tokens == ref.tokens
    assert g2.draft["drafting"] and g2.draft["accepted"] > 0
    # the restored head drafts what a head primed by a fresh evaluation drafts
    with m.new_session() as s:
        s.nextn_prime = True
        s.restore(cache.lookup(ids)[1])
        t = ref.tokens[0]
        restored = NextnDrafter(m).propose(DraftState(s, s.n_past, t, None), 4)
    with m.new_session(nextn_prime=True) as s:
        s.eval(ids)
        fresh = NextnDrafter(m).propose(DraftState(s, s.n_past, t, None), 4)
    assert restored == fresh
    # a continuation: hits the end-of-generation entry (prompt + 39 tokens)
    ids3 = ids + ref.tokens + m.tokenizer.encode("\n    def pop(self):\n")
    ref3 = generate(m, ids3, max_tokens=30, draft=False, **GREEDY)
    g3 = generate(m, ids3, max_tokens=30, cache=cache, draft_depth=2, **GREEDY)
    assert g3.cached_tokens == len(ids) + 39
    assert g3.tokens == ref3.tokens and g3.draft["drafting"] and g3.draft["accepted"] > 0


def test_entries_without_the_heads_history_are_not_restored_for_drafting():
    """Snapshots taken by a request that did not draft lack the head's
    history: a drafting request does not restore them (it evaluates the
    prompt, priming the head, and its snapshots replace them); a serial
    request restores either kind."""
    m = demo()
    ids = long_prompt(m)
    ref = generate(m, ids, max_tokens=30, draft=False, **GREEDY)
    cache = PrefixCache(m)
    generate(m, ids, max_tokens=30, draft=False, cache=cache, **GREEDY)
    n, snap = cache.lookup(ids)
    assert n == len(ids) and not snap.nextn_covered and cache.head_kv_pages == 0
    g = generate(m, ids, max_tokens=30, cache=cache, draft_depth=3, **GREEDY)
    assert g.cached_tokens == 0 and g.tokens == ref.tokens
    assert g.draft["drafting"] and g.draft["accepted"] > 0
    assert cache.lookup(ids)[1].nextn_covered  # replaced by the priming session's
    g = generate(m, ids, max_tokens=30, cache=cache, draft_depth=3, **GREEDY)
    assert g.cached_tokens == len(ids) and g.tokens == ref.tokens and g.draft["drafting"]
    with m.new_session(nextn_prime=True) as s:  # a serial request on a priming session
        g = generate(m, ids, max_tokens=30, cache=cache, session=s, draft=False, **GREEDY)
        assert g.cached_tokens == len(ids) and g.tokens == ref.tokens


def test_stop_and_eos_inside_accepted_blocks():
    """Stop strings and an EOS id landing inside long accepted blocks: the
    drafted result (text, tokens, finish, session state) is the serial one."""
    m = demo()
    ids = m.tokenizer.encode(CODE)
    ref = generate(m, ids, max_tokens=60, draft=False, **GREEDY)
    text = ref.text
    for stop in (text[5:9], text[20:23], "\n"):
        for depth in (2, 4, 7):
            with m.new_session() as s1, m.new_session() as s2:
                a = generate(m, ids, max_tokens=60, stop=stop, draft=False, session=s1,
                             **GREEDY)
                b = generate(m, ids, max_tokens=60, stop=stop, draft_depth=depth, session=s2,
                             **GREEDY)
                assert (b.tokens, b.text, b.finish_reason) == (a.tokens, a.text,
                                                               a.finish_reason)
                assert s1.n_past == s2.n_past
                np.testing.assert_array_equal(s1.last_logits(), s2.last_logits())
    # an EOS: the serial output's 12th token declared end-of-generation
    eos = ref.tokens[11]
    want = ref.tokens[:ref.tokens.index(eos)]
    for depth in (3, 6):
        toks, st = speculative_generate(m, ids, 60, eos_ids={eos}, policy=FixedPolicy(depth))
        assert toks == want and st["finish_reason"] == "eos"


def test_default_policies_of_a_model_share_measured_costs():
    """The first drafting request measures a plain step (a calibration
    round); later requests on the same model price rounds with the costs
    already measured (no calibration round), while a fixed depth or a
    caller's policy has its own."""
    from ds4py.spec.plan import draft_plan, model_costs

    m = demo()
    g1 = generate(m, CODE, max_tokens=20, **GREEDY)
    costs = model_costs(m)
    assert costs.plain_samples > 0
    assert g1.draft["drafting"]
    g2 = generate(m, CODE, max_tokens=20, **GREEDY)
    assert g2.draft["policy"]["calibration_rounds"] == 0
    assert draft_plan(m).policy.costs is costs
    assert not hasattr(draft_plan(m, draft_depth=2).policy, "costs")
    assert draft_plan(m, policy=AdaptivePolicy()).policy.costs is not costs


def test_core_propose_refusals():
    """ds4_spec_propose refuses a head without the session's history (no
    priming) and a depth outside 1..VERIFY_MAX-1, naming the problem."""
    from ds4py.spec import DraftError

    m = demo()
    ids = m.tokenizer.encode(CODE)
    with m.new_session() as s:
        s.eval(ids)
        with pytest.raises(DraftError, match="does not hold positions"):
            NextnDrafter(m).propose(DraftState(s, s.n_past, 1, None), 2)
    with m.new_session(nextn_prime=True) as s:
        s.eval(ids)
        for k in (0, 16):
            with pytest.raises(ds4py.ModelError, match="must be in 1..15"):
                NextnDrafter(m).propose(DraftState(s, s.n_past, 1, None), k)


def test_default_policies_share_costs_not_acceptance():
    """Requests on one model share the measured round costs (one CostModel
    per model: the model's and the machine's) but each starts its
    acceptance estimates from the prior: they belong to the text (sharing
    them made prose after code keep drafting at a loss, ds4py/spec/plan.py).
    Output stays the serial output."""
    from ds4py.spec.plan import draft_plan
    from ds4py.spec.policy import P_DECAY, P_INIT

    prior = [P_INIT * P_DECAY ** d for d in range(1, 8)]
    m = ds4py.load(demo_model_path(), n_threads=2)  # its own statistics
    a, b = draft_plan(m), draft_plan(m)
    assert a.active and b.active
    assert a.policy.costs is b.policy.costs
    assert a.policy.p is not b.policy.p and a.policy.p == pytest.approx(prior, rel=1e-12)
    g = generate(m, CODE, max_tokens=48, draft_depth=None, **GREEDY)
    assert g.tokens == generate(m, CODE, max_tokens=48, draft=False, **GREEDY).tokens
    assert g.draft["drafted"] > 0  # some round drafted: that request's estimates moved
    assert g.draft["policy"]["p"] != pytest.approx(prior, abs=1e-4)
    c = draft_plan(m)
    assert c.policy.costs is a.policy.costs and c.policy.costs.plain_samples > 0
    assert c.policy.p == pytest.approx(prior, rel=1e-12)  # ... and the next starts afresh
