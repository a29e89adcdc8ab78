"""Quiet stretches (ds4py/spec/runner.py): when the policy promises plain
rounds, the runner steps without asking it each round, and the core defers
the head's rows of those steps (csrc/session.c "Deferred rows";
tests/test_nextn_prime.py checks the rows bit for bit).

The claims checked, on the demo model (trained head: its drafts are often
accepted, so a head with a wrong history would show in the acceptance) and
a random golden model:
- a run with long depth-0 stretches between probes produces the serial
  tokens, drafts exactly what the same run through choose() every round
  drafts (same accepted counts per round), and leaves the head holding
  every position [1, n_past) with priming on;
- the prefix cache keeps the head's history after such a run;
- a drafting round's choice is charged to that round's overhead;
- the plain step right after a drafting round is not a cost sample.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import ds4py
from ds4py.demo_model import demo_model_path
from ds4py.spec import AdaptivePolicy, speculative_generate
from ds4py.spec import runner as runner_mod
from ds4py.spec.stepper import Stepper

HERE = os.path.dirname(os.path.abspath(__file__))
CODE = "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n"
PROSE = ('def parse(text):\n    """Parse the text of a configuration file. The file is read '
         'line by line, and')
_models: dict = {}


def demo() -> ds4py.Model:
    if "demo" not in _models:
        _models["demo"] = ds4py.load(demo_model_path(), n_threads=2)
    return _models["demo"]


def golden() -> ds4py.Model:
    if "golden" not in _models:
        _models["golden"] = ds4py.load(os.path.join(HERE, "golden", "models", "dense-f32.gguf"),
                                       precision="exact", n_threads=2)
    return _models["golden"]


def plain_steps(m, s, first, n):
    """n greedy plain steps after `first`. Returns the tokens evaluated."""
    st = Stepper(s, m.config.vocab_size)
    tok, out = first, []
    for _ in range(n):
        lg = st.step(tok)
        out.append(tok)
        tok = int(lg.argmax())
    return out, tok


def never(d: int) -> float:
    """The cost model always answers 0: plain stretches between probes
    (4, 8, 16, ... rounds)."""
    return 1.0 if d == 0 else 1000.0


@pytest.mark.parametrize("which", ["demo", "golden"])
def test_run_with_quiet_stretches_is_exact_and_drafts_the_same(which, monkeypatch):
    m = demo() if which == "demo" else golden()
    ids = (m.tokenizer.encode(CODE) if which == "demo"
           else [int(t) for t in np.load(os.path.join(HERE, "golden", "logits",
                                                      "sequences.npz"))["s700"]][:24])
    n = 150
    with m.new_session() as s:   # serial greedy decoding, by hand
        first = int(s.eval(ids).argmax())
        ref, last = plain_steps(m, s, first, n - 1)
        ref.append(last)

    def run(shadow):
        with m.new_session() as s:
            pol = AdaptivePolicy(cost=never, burst=0, shadow=shadow)
            toks, st = speculative_generate(m, ids, n, policy=pol, session=s)
            assert s.nextn_prime and s.nextn_covered
            return toks, st

    # the probes as drafting rounds, then as shadows (runner "Shadow probes")
    keys = {False: ("draft_rounds", "drafted", "accepted", "accept_counts", "depth_counts"),
            True: ("shadow_probes", "depth_tried", "depth_accepted", "depth_counts")}
    for shadow in (False, True):
        monkeypatch.setattr(runner_mod, "QUIET_MIN", 1)
        toks, st = run(shadow)
        assert toks == ref
        if shadow:
            assert st["shadow_probes"] >= 4 and st["draft_rounds"] == 0
        else:
            assert st["draft_rounds"] >= 4 and st["shadow_probes"] == 0  # the probes
        monkeypatch.setattr(runner_mod, "QUIET_MIN", 10 ** 9)   # choose() every round
        toks0, st0 = run(shadow)
        assert toks0 == ref
        # the probes drafted from the same head rows: the same outcome round by round
        for key in keys[shadow]:
            assert st[key] == st0[key], key


def test_prefix_cache_after_a_quiet_run_keeps_the_heads_history():
    """A request whose decode was mostly plain steps (the core deferring the
    head's rows) ends with a cache entry that carries the head's history,
    and a continuation that hits it drafts at once with the serial output."""
    from ds4py.cache import PrefixCache
    m = demo()
    ids = m.tokenizer.encode(CODE * 3)
    cache = PrefixCache(m)
    g1 = ds4py.generate(m, ids, max_tokens=60, temperature=0, cache=cache,
                        draft_policy=AdaptivePolicy(cost=never, burst=0))
    assert g1.draft["depth_counts"][0] > 40
    for key in cache.keys():
        assert cache.lookup(key)[1].nextn_covered
    ids2 = ids + g1.tokens + m.tokenizer.encode("\n")
    ref = ds4py.generate(m, ids2, max_tokens=30, temperature=0, draft=False)
    g2 = ds4py.generate(m, ids2, max_tokens=30, temperature=0, cache=cache, draft_depth=3)
    assert g2.cached_tokens == len(ids) + len(g1.tokens) - 1
    assert g2.tokens == ref.tokens and g2.draft["drafting"] and g2.draft["accepted"] > 0


def test_short_quiet_stretches_skip_choose(monkeypatch):
    """A promised plain stretch, however short, takes the runner's fast
    path (no choose() per round); the policy still sees every round
    (pass_quiet): the probe schedule,
    the tokens and the drafting outcome equal those of a run that calls
    choose() every round (QUIET_MIN huge)."""
    m = demo()
    ids = m.tokenizer.encode(CODE)
    calls = []

    class Counting(AdaptivePolicy):
        def choose(self, cap):
            calls.append(cap)
            return super().choose(cap)

    def run():
        calls.clear()
        with m.new_session() as s:
            # probes every 4 rounds for good: every stretch is 3 rounds long
            pol = Counting(cost=never, burst=0, probe_cap=4, shadow=False)
            toks, st = speculative_generate(m, ids, 60, policy=pol, session=s)
            assert s.nextn_prime and s.nextn_covered
            return toks, st, len(calls), pol.n_rounds

    toks, st, n_calls, n_rounds = run()
    monkeypatch.setattr(runner_mod, "QUIET_MIN", 10 ** 9)   # choose() every round
    toks0, st0, n_calls0, n_rounds0 = run()
    assert toks == toks0
    # (the policy does not count a last round that had no room to draft)
    assert n_rounds == n_rounds0 >= st["rounds"] - 1
    # a probe, then one call that promises 3 plain rounds: 2 calls per 4 rounds
    assert n_calls0 == n_rounds0 and n_calls <= n_rounds0 // 2 + 2
    for key in ("draft_rounds", "probes", "drafted", "accepted", "accept_counts", "depth_counts"):
        assert st[key] == st0[key], key


def test_a_drafting_rounds_choice_is_charged_to_its_overhead():
    """The time choose() takes belongs to the drafting round it starts (a
    quiet plain round makes no choice; leaving it out priced drafting too
    cheap). A fake clock advances 1 s per read, and choose() itself reads it
    50 times: every recorded overhead of a drafting round holds those 50 s
    (plus the reads between the round's own stamps), every plain sample
    holds none of them."""
    m = demo()
    ids = m.tokenizer.encode(CODE)
    now = [0.0]

    def clock():
        now[0] += 1.0
        return now[0]

    over, plain = [], []

    class Slow(AdaptivePolicy):
        def choose(self, cap):
            for _ in range(50):
                clock()
            return super().choose(cap)

        def record_overhead(self, seconds, rolled_back=False, warm=True):
            over.append(seconds)
            super().record_overhead(seconds, rolled_back, warm)

        def record_plain(self, seconds):
            plain.append(seconds)
            super().record_plain(seconds)

        def record_plain_many(self, samples):
            plain.extend(samples)
            super().record_plain_many(samples)

    # never drafts by choice: depth-1 probes every 4 rounds, plain rounds between
    pol = Slow(cost=never, burst=0, probe_cap=4, shadow=False)
    with m.new_session() as s:
        toks, st = speculative_generate(m, ids, 40, policy=pol, session=s, clock=clock)
    assert st["draft_rounds"] >= 3 and len(plain) >= 10
    # the choice's 50 reads plus 1 after it (t0), then the round's and settle's
    # own stamps: the exact count depends on the round's path, not below 51
    assert all(x >= 51 for x in over), over
    assert all(x < 50 for x in plain), plain


def test_a_plain_step_after_a_drafting_round_is_not_a_cost_sample():
    """Cold steps (ds4py.spec.runner): the plain step right after a drafting
    round runs slow (its caches hold the verify's data), so the runner does
    not give its time to the policy; every other plain round's time is
    recorded. A scripted policy drafts depth 1 at fixed rounds, plain
    rounds between (no quiet stretches: each plain round goes through
    round()); and an adaptive policy's recalibration waits for a recorded
    step."""
    from ds4py.spec.policy import Policy

    m = demo()
    ids = m.tokenizer.encode(CODE)
    script = [0, 0, 1, 0, 0, 0, 1, 1, 0, 0, 1, 0] + [0] * 40
    rounds: list[int] = []
    recorded: list[int] = []     # the round index each recorded sample belongs to

    class Scripted(Policy):
        enabled = True

        def choose(self, cap):
            k = min(script[len(rounds)], cap)
            rounds.append(k)
            return k

        def record_plain(self, seconds):
            recorded.append(len(rounds) - 1)

    with m.new_session() as s:
        toks, st = speculative_generate(m, ids, 30, policy=Scripted(), session=s)
    assert st["draft_rounds"] == 4
    plain = [i for i, k in enumerate(rounds) if k == 0]
    cold = [i for i in plain if i and rounds[i - 1] > 0]
    assert cold == [3, 8, 11]
    # the run's last round has room for no draft, so it asks no choice (its
    # sample carries the previous round's index)
    assert recorded[:-1] == [i for i in plain if i not in cold]
    assert recorded[-1] == len(rounds) - 1

    # the adaptive policy: a recalibration round whose step was not recorded
    # is repeated until one is
    pol = AdaptivePolicy(cost=None, burst=0, recalibrate=2)
    for _ in range(3):
        pol.record_plain(1e-3)
    pol.since_plain = 2
    assert pol.choose(3) == 0 and pol.needs_plain
    assert pol.choose(3) == 0 and pol.needs_plain       # nothing recorded: again
    pol.record_plain(1e-3)
    assert pol.since_plain == 0


@pytest.mark.parametrize("mode", ["greedy", "sampled", "stream", "stop", "logprobs"])
def test_generate_runs_quiet_stretches_in_its_own_loop(mode, monkeypatch):
    """ds4py.generate runs a promised plain stretch itself, one serial step
    per token (runner.take_quiet): the output equals serial decoding's
    (tokens, text, streamed pieces, a stop string or the budget inside a
    stretch, seeded samples, logprobs), the policy sees every round (the
    same probe schedule and drafting outcome as a run that asks choose()
    every round), and most tokens indeed skip runner.round."""
    m = demo()
    kw = dict(max_tokens=90, temperature=0)
    prompt = CODE
    if mode == "sampled":
        kw.update(temperature=0.8, seed=11)
    if mode == "stop":   # (the code prompt's text repeats itself: no late first occurrence)
        prompt = PROSE
    if mode == "logprobs":
        kw.update(logprobs=2)
    ref = ds4py.generate(m, prompt, draft=False, **kw)
    if mode == "stop":
        # a stop string first seen well inside the run (after the third
        # probe), in a quiet stretch
        text = ref.text
        kw["stop"] = next(text[i:i + n] for n in (4, 6, 8, 12, 16)
                          for i in range(len(text) * 2 // 3, len(text) - n)
                          if text.find(text[i:i + n]) == i)
        ref = ds4py.generate(m, prompt, draft=False, **kw)
        assert ref.finish_reason == "stop"
    rounds = []
    orig = runner_mod.SpecRunner.round

    def counting(self, last, room):
        rounds.append(room)
        return orig(self, last, room)

    monkeypatch.setattr(runner_mod.SpecRunner, "round", counting)

    def run():
        rounds.clear()
        pol = AdaptivePolicy(cost=never, burst=0, shadow=False)
        if mode == "stream":
            chunks = list(ds4py.stream_generate(m, prompt, draft_policy=pol, **kw))
            g = chunks[-1].generation
            assert "".join(c.text for c in chunks) == g.text
        else:
            g = ds4py.generate(m, prompt, draft_policy=pol, **kw)
        assert g.tokens == ref.tokens and g.text == ref.text
        assert g.finish_reason == ref.finish_reason
        if mode == "logprobs":
            assert [lp.logprob for lp in g.logprobs] == [lp.logprob for lp in ref.logprobs]
        return g.draft, pol.n_rounds, len(rounds)

    st, n_pol, n_round_calls = run()
    assert st["draft_rounds"] >= 3                       # the probes
    assert n_round_calls < st["rounds"] // 2               # the stretches ran inline
    monkeypatch.setattr(runner_mod, "QUIET_MIN", 10 ** 9)   # choose() every round
    st0, n_pol0, n_round_calls0 = run()
    assert n_round_calls0 == st0["rounds"]
    # (a last round with no room to draft is not counted by choose(), and is
    # by pass_quiet when a stretch covers it)
    assert n_pol0 <= n_pol <= n_pol0 + 1
    for key in ("rounds", "draft_rounds", "probes", "drafted", "accepted", "accept_counts",
                "depth_counts"):
        assert st[key] == st0[key], key
