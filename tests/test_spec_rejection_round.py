"""Stochastic drafting: standard speculative (rejection) sampling through the
real round code (SpecRunner, sampling="rejection").

The statistical tests drive SpecRunner.round/settle on a synthetic target
whose logits are the same row at every position (so the committed tokens
must be i.i.d. draws from the target's sampling distribution p) with a
drafter that samples from a different distribution q (one token q never
proposes, others over- and under-proposed). Chi-square tests against p,
computed here from the logits with numpy (softmax at the temperature, no
truncation), not by the code under test. Seeds are fixed: each test either
always passes or always fails for given code; the level (1e-3) says how
strong the evidence is. A deliberately broken acceptance rule shows the
test has power.

Then the path on the demo model: deterministic per seed, greedy stays
byte-identical to serial, a drafter that cannot sample is refused.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from test_spec_sampling import chi2, chi2_sf_even  # one chi-square helper for both

import ds4py
from ds4py.demo_model import demo_model_path
from ds4py.sampling import Sampler, SamplingParams
from ds4py.spec import Drafter, FixedPolicy
from ds4py.spec import runner as runner_mod
from ds4py.spec.rejection import draw_from
from ds4py.spec.runner import SpecRunner

V = 6
T = 0.9
LP = np.array([2.0, 1.2, 0.5, 0.0, -0.4, 1.0], dtype=np.float32)       # the target
LQ = np.array([0.3, 2.2, 1.0, -1.0, -np.inf, 0.2], dtype=np.float32)   # the drafter: never 4


def softmax(x: np.ndarray, t: float) -> np.ndarray:
    z = np.exp((x.astype(np.float64) - np.max(x)) / t)
    return z / z.sum()


P_TARGET = softmax(LP, T)


class ConstSession:
    """A target whose every row is LP: verify, accept and plain steps only
    move n_past (what SpecRunner needs of a session)."""

    def __init__(self):
        self.n_past = 1
        self._row = LP.copy()
        self.stepper = self          # SpecRunner takes a session's own stepper
        self.verifies = 0

    def _live(self):
        return self

    def step(self, token):
        self.n_past += 1
        return self._row

    def verify(self, tokens):
        self.verifies += 1
        self._pending = len(tokens)
        return np.tile(self._row, (len(tokens), 1))

    def accept(self, n):
        assert 1 <= n <= self._pending
        self.n_past += n

    def last_hidden(self):
        return np.zeros(4, dtype=np.float32)


class QDrafter(Drafter):
    """Samples its drafts from softmax(LQ / T) through the runner's transform."""

    name = "q-drafter"
    can_sample = True

    def propose_dist(self, state, k, dist, uniforms):
        qs = [dist(LQ) for _ in range(k)]
        return [draw_from(q, u) for q, u in zip(qs, uniforms, strict=True)], qs


MODEL = SimpleNamespace(config=SimpleNamespace(vocab_size=V, hidden_size=4))


def params(seed: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=T, top_k=0, top_p=1.0, min_p=0.0, seed=seed,
                          draw="position", **kw)


def generate(seed: int, n: int, depth: int = 3) -> tuple[list[int], list[int]]:
    """n tokens through SpecRunner rounds; returns (tokens, index of each
    token within its round)."""
    smp = Sampler(params(seed), V)
    s = ConstSession()
    run = SpecRunner(MODEL, s, FixedPolicy(depth), QDrafter(), smp.pick, greedy=False,
                     sampler=smp, sampling="rejection")
    assert run.admit() is None and run.rejection
    toks, idx, last = [], [], 0
    while len(toks) < n:
        block = run.round(last, n - len(toks) + 1)
        j = len(block) - 1
        run.settle(j, False)
        toks += [t for t, _ in block]
        idx += list(range(len(block)))
        last = block[-1][0]
    return toks[:n], idx[:n]


def collect(n_seeds=300, n=60):
    toks, idx, pairs = [], [], []
    for seed in range(n_seeds):
        t, i = generate(seed, n)
        toks += t
        idx += i
        pairs += [a * V + b for a, b in zip(t, t[1:], strict=False)]
    return np.array(toks), np.array(idx), np.array(pairs)


def test_q_is_not_p():
    """The drafter's q differs from p (else the test would test nothing):
    it over-proposes 1 and 2, never proposes 4."""
    q = softmax(LQ, T)
    assert q[4] == 0 and P_TARGET[4] > 0.03
    assert q[1] > P_TARGET[1] + 0.3 and q[0] < P_TARGET[0] - 0.3


def test_tokens_are_distributed_as_the_target():
    toks, idx, pairs = collect()
    assert len(toks) == 18000
    # drafting happened and drafts were both accepted and rejected
    assert (idx >= 1).mean() > 0.2 and (idx == 3).mean() > 0.01
    counts = np.bincount(toks, minlength=V)
    # marginal: df = 5 (6 cells); the sf is computed for df 6 (even), which
    # is stricter than the nominal 1e-3
    assert chi2_sf_even(chi2(counts.tolist(), P_TARGET.tolist()), 6) > 1e-3, counts
    # per index within the round (first token: an accepted draft or the
    # residual; the later ones: after accepted drafts) -- a wrong rule shows here
    for i in (0, 1, 2):
        c = np.bincount(toks[idx == i], minlength=V)
        assert c.sum() > 1500
        assert chi2_sf_even(chi2(c.tolist(), P_TARGET.tolist()), 6) > 1e-3, (i, c)
    # consecutive pairs are independent draws: 36 cells, df 35 (sf for 36)
    pc = np.bincount(pairs, minlength=V * V)
    pp = np.outer(P_TARGET, P_TARGET).reshape(-1)
    assert chi2_sf_even(chi2(pc.tolist(), pp.tolist()), 36) > 1e-3


def test_the_chi_square_test_has_power(monkeypatch):
    """Accepting every draft (no min(1, p/q) test) gives tokens distributed
    like q, not p: the same test rejects it."""
    def accept_all(p, q, draft, ua, ur):
        return True, int(draft)
    monkeypatch.setattr(runner_mod, "rejection_step", accept_all)
    toks, _, _ = collect(n_seeds=60)
    counts = np.bincount(toks, minlength=V)
    assert chi2_sf_even(chi2(counts.tolist(), P_TARGET.tolist()), 6) < 1e-6


def test_deterministic_per_seed_and_seed_dependent():
    assert generate(7, 50) == generate(7, 50)
    assert generate(7, 50)[0] != generate(8, 50)[0]


def test_bad_mode_and_greedy():
    smp = Sampler(params(1), V)
    with pytest.raises(ValueError, match="sampling must be one of"):
        SpecRunner(MODEL, ConstSession(), FixedPolicy(2), QDrafter(), smp.pick,
                   sampler=smp, sampling="nucleus")
    # greedy params: the exact path (a one-hot p accepts exactly the argmax)
    g = Sampler(SamplingParams(temperature=0.0), V)
    run = SpecRunner(MODEL, ConstSession(), FixedPolicy(2), QDrafter(), g.pick,
                     sampler=g, sampling="rejection")
    assert not run.rejection


# ------------------------------------------------------------- demo model --

_m: list = []


def demo():
    if not _m:
        _m.append(ds4py.load(demo_model_path(), n_threads=2))
    return _m[0]


PROMPT = "def fibonacci(n):\n"


def test_demo_rejection_mode_runs_and_is_reproducible():
    m = demo()
    kw = dict(max_tokens=40, temperature=0.8, seed=11, draft_depth=3, spec_sampling="rejection")
    a = ds4py.generate(m, PROMPT, **kw)
    b = ds4py.generate(m, PROMPT, **kw)
    assert a.tokens == b.tokens and len(a.tokens) == 40
    assert a.draft["draft_admitted"] and a.draft["drafted"] > 0
    # the trained head is accepted often even when sampling (measured ~0.5 at T=0.8)
    assert a.draft["accepted"] > 0
    # with penalties the window follows the committed tokens: still runs, reproducibly
    kw["repeat_penalty"] = 1.3
    assert ds4py.generate(m, PROMPT, **kw).tokens == ds4py.generate(m, PROMPT, **kw).tokens
    with pytest.raises(ValueError, match="spec_sampling"):
        ds4py.generate(m, PROMPT, max_tokens=4, temperature=0.8, spec_sampling="gumbel")


def test_demo_greedy_rejection_is_serial():
    m = demo()
    ref = ds4py.generate(m, PROMPT, max_tokens=40, temperature=0, draft=False)
    got = ds4py.generate(m, PROMPT, max_tokens=40, temperature=0, draft_depth=3,
                         spec_sampling="rejection")
    assert got.tokens == ref.tokens and got.draft["accepted"] > 0


def test_demo_drafter_that_cannot_sample_is_refused():
    """A drafter without propose_dist: rejection mode refuses it at
    admission, and the generation is the undrafted one (exact mode's output
    for the seed)."""
    m = demo()

    class ArgmaxOnly(Drafter):
        name = "argmax-only"

        def propose(self, state, k):
            return [0] * k

    kw = dict(max_tokens=30, temperature=0.8, seed=5)
    ref = ds4py.generate(m, PROMPT, draft=False, **kw)
    got = ds4py.generate(m, PROMPT, draft_depth=2, drafter=ArgmaxOnly(),
                         spec_sampling="rejection", **kw)
    assert not got.draft["draft_admitted"]
    assert "cannot sample" in got.draft["draft_refused"]
    assert got.tokens == ref.tokens
