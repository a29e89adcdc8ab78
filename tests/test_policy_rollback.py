"""The draft policy's rollback price, warm-round samples and lazy re-pricing
(ds4py.spec.policy: CostModel "Rollback", "Warm rounds"; module doc
"Re-pricing"; ds4py.spec.runner "Warm rounds").

Checked here:
- the cost model keeps a round's overhead apart by whether its accept
  rolled back and whether the round before it drafted, prices a round that
  keeps every row from the warm samples first, and the rollback as the
  difference of the two kinds' low quartiles;
- verify, draft and overhead samples are ratios to the plain step of their
  time: a machine that speeds up moves every price with the plain step;
- the policy weighs the rollback with the chance of a rejection, so it
  changes a choice at low acceptance and not at acceptance 1;
- re-pricing happens at once on a new kind of estimate and otherwise at
  most every ``reprice_every`` rounds;
- the runner tells the policy, for every drafting round, whether it rolled
  back (a draft rejected) and whether the round before drafted (demo
  model, a scripted policy).
"""

from __future__ import annotations

import pytest

import ds4py
from ds4py.demo_model import demo_model_path
from ds4py.spec import speculative_generate
from ds4py.spec.policy import AdaptivePolicy, CostModel, Policy

CODE = "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n"


def measured(plain=1.0e-3, verify=(1.4e-3, 1.7e-3, 2.0e-3), draft=0.2e-3) -> CostModel:
    cm = CostModel(split_rollback=True)
    for _ in range(4):
        cm.record_plain(plain)
        cm.record_draft(1, draft)
        for w, t in zip((2, 3, 4), verify, strict=True):
            cm.record_verify(w, t)
    return cm


def test_overheads_kept_apart_by_rollback_and_warmth():
    cm = measured()
    assert cm.overhead() == 0.0 and cm.rollback() == 0.0
    # cold samples only: they price the overhead; no rollback measured yet
    for _ in range(4):
        cm.record_overhead(90e-6, rolled_back=False, warm=False)
    assert cm.overhead() == pytest.approx(90e-6) and cm.rollback() == 0.0
    # a warm sample of the same kind takes over at once
    cm.record_overhead(40e-6, rolled_back=False, warm=True)
    assert cm.overhead() == pytest.approx(40e-6)
    # cold rolled-back rounds: no warm pair yet, so the cold pair prices it
    for _ in range(4):
        cm.record_overhead(150e-6, rolled_back=True, warm=False)
    assert cm.rollback() == pytest.approx(150e-6 - 90e-6)
    # warm rolled-back rounds: the warm pair
    for _ in range(4):
        cm.record_overhead(110e-6, rolled_back=True, warm=True)
    assert cm.rollback() == pytest.approx(110e-6 - 40e-6)
    assert cm.overhead() == pytest.approx(40e-6)
    assert cm.summary()["rollback_s"] == pytest.approx(70e-6)
    # never negative
    for _ in range(16):
        cm.record_overhead(10e-6, rolled_back=True, warm=True)
    assert cm.rollback() == 0.0


def test_unsplit_cost_model_mixes_every_round():
    """Unsplit (the default for the rollback: CostModel "Rollback"), a
    rolled-back round's overhead is a sample like any other."""
    assert CostModel().split_rollback is False and CostModel().split_warm is True
    default = CostModel()
    default.record_overhead(40e-6, rolled_back=False, warm=True)
    default.record_overhead(30e-6, rolled_back=True, warm=True)
    assert default.overhead() == pytest.approx(30e-6) and default.rollback() == 0.0
    cm = measured()
    cm2 = CostModel(split_rollback=False, split_warm=False)
    for c in (cm, cm2):
        c.record_overhead(40e-6, rolled_back=False, warm=True)
        c.record_overhead(200e-6, rolled_back=True, warm=False)
        c.record_overhead(300e-6, rolled_back=True, warm=False)
        c.record_overhead(500e-6, rolled_back=False, warm=False)
    assert cm.overhead() == pytest.approx(40e-6)
    assert cm2.overhead() == pytest.approx(40e-6) and cm2.rollback() == 0.0
    cm2.record_overhead(600e-6)
    # one deque: lower quartile of 5 samples is the second smallest
    assert cm2.overhead() == pytest.approx(200e-6)


def test_samples_follow_the_plain_step():
    """Recorded at a plain step of 1 ms, read at 0.5 ms: every price halves
    (relative samples); in seconds (relative=False) they stay."""
    rel, sec = CostModel(split_rollback=True), CostModel(split_rollback=True, relative=False)
    for cm in (rel, sec):
        for _ in range(16):
            cm.record_plain(1e-3)
        for _ in range(4):
            cm.record_verify(3, 1.8e-3)
            cm.record_draft(2, 0.4e-3)
            cm.record_overhead(0.1e-3, rolled_back=False, warm=True)
            cm.record_overhead(0.3e-3, rolled_back=True, warm=True)
        for _ in range(16):
            cm.record_plain(0.5e-3)
    got = [rel.verify_cost(3), rel.draft_step(), rel.overhead(), rel.rollback()]
    assert got == pytest.approx([0.9e-3, 0.1e-3, 0.05e-3, 0.1e-3])
    got = [sec.verify_cost(3), sec.draft_step(), sec.overhead(), sec.rollback()]
    assert got == pytest.approx([1.8e-3, 0.2e-3, 0.1e-3, 0.2e-3])
    # the choice depends on the ratios only: the same price in plain steps
    assert rel.round_costs(2)[2] / rel.plain() == pytest.approx(
        sec.round_costs(2)[2] / 1e-3)


def test_samples_before_any_plain_step_convert_at_the_first():
    cm = CostModel()
    for _ in range(3):
        cm.record_verify(2, 1.5e-3)
    cm.record_draft(1, 0.2e-3)
    assert cm.verify_cost(2) == pytest.approx(1.5e-3)   # seconds until then
    cm.record_plain(1e-3)
    assert cm.verify_cost(2) == pytest.approx(1.5e-3)   # now 1.5 plain steps
    assert cm.draft_step() == pytest.approx(0.2e-3)
    for _ in range(16):
        cm.record_plain(2e-3)
    assert cm.verify_cost(2) == pytest.approx(3e-3)
    assert cm.draft_step() == pytest.approx(0.4e-3)


def policy(p, cm) -> AdaptivePolicy:
    pol = AdaptivePolicy(costs=cm, acceptance=list(p) + [p[-1]] * (7 - len(p)),
                         noise_z=0.0)
    pol.n = [5] * 7   # every position observed: no optimism for unobserved ones
    return pol


def test_rollback_priced_with_the_chance_of_a_rejection():
    # plain 1 ms; depth 1 = 1.4 + 0.2 + 0.1 = 1.7 ms
    cm = measured()
    for _ in range(4):
        cm.record_overhead(0.1e-3, rolled_back=False, warm=True)
    p = [0.9]
    # without a rollback price: E(1) = 1.9 tokens in 1.7 ms, 1.12 per ms: drafts
    assert policy(p, cm).model_depth(1) == 1
    # a rollback of 0.6 ms at a 10% chance: 1.9 / 1.76 = 1.08, still drafts
    for _ in range(4):
        cm.record_overhead(0.7e-3, rolled_back=True, warm=True)
    assert cm.rollback() == pytest.approx(0.6e-3)
    assert policy(p, cm).model_depth(1) == 1
    # at 0.7 acceptance: 1.7 / (1.7 + 0.18) = 0.90 per ms, below plain's 1.0:
    # without the rollback it would have been 1.0 per ms, also not past the
    # 5% margin; at 0.75: 1.75 / 1.85 = 0.95 against 1.75 / 1.7 = 1.03
    assert policy([0.7], cm).model_depth(1) == 0
    # at acceptance 1 nothing is ever rolled back: the rollback costs nothing
    assert policy([1.0], cm).model_depth(1) == 1
    # the choice with and without the rollback price, at a margin where it decides
    cm0 = measured()
    for _ in range(4):
        cm0.record_overhead(0.1e-3, rolled_back=False, warm=True)
    p = [0.85]   # 1.85 / 1.7 = 1.088 without, 1.85 / (1.7 + 0.09) = 1.034 with
    assert policy(p, cm0).model_depth(1) == 1
    assert policy(p, cm).model_depth(1) == 0


def count_pricing(monkeypatch) -> list[int]:
    calls = [0]
    real = CostModel.round_costs

    def counted(self, cap, corrected=True):
        calls[0] += 1
        return real(self, cap, corrected)

    monkeypatch.setattr(CostModel, "round_costs", counted)
    return calls


@pytest.mark.parametrize("every", [1, 8])
def test_repricing_waits_for_new_kinds_or_reprice_every(monkeypatch, every):
    cm = measured()
    cm.record_overhead(0.1e-3)
    pol = AdaptivePolicy(costs=cm, burst=0, calibrate=1, reprice_every=every)
    calls = count_pricing(monkeypatch)
    pol.choose(4)
    assert calls[0] == 1
    priced = calls[0]
    # records that bring no new kind of estimate: re-priced every `every` rounds
    for _ in range(24):
        pol.observe(2, 2)
        pol.record_draft(2, 0.4e-3)
        pol.record_verify(3, 1.7e-3)
        pol.record_overhead(0.1e-3, False, True)
        pol.choose(4)
    assert calls[0] - priced == 24 // every
    # a new width's first sample is a new epoch: re-priced at the next choice
    priced = calls[0]
    pol.record_verify(6, 3.0e-3)
    pol.choose(4)
    assert calls[0] == priced + 1
    # a plain step that moves by more than 1%: at once as well
    priced = calls[0]
    for _ in range(16):
        pol.record_plain(2.0e-3)
    pol.choose(4)
    assert calls[0] == priced + 1


def test_stale_prices_stay_within_reprice_every():
    """A verify that turned 9x dearer shows in the choice at the
    reprice_every-th round after the last pricing, not before."""
    cm = measured(verify=(1.2e-3, 1.4e-3, 1.6e-3))
    cm.record_overhead(0.05e-3)
    pol = AdaptivePolicy(costs=cm, burst=0, calibrate=1, probe_interval=0,
                         acceptance=[0.9] * 7, reprice_every=8)
    assert pol.choose(3) > 0      # priced at round 1
    for _ in range(16):
        for w in (2, 3, 4):
            pol.record_verify(w, 9e-3)
    depths = []
    for _ in range(8):
        d = pol.choose(3)
        pol.observe(d, d)
        depths.append(d)
    assert all(d > 0 for d in depths[:7]) and depths[7] == 0, depths


class Recording(Policy):
    """Depths from a script; records the runner's evidence and overhead flags."""

    enabled = True

    def __init__(self, script):
        self.script = script
        self.rounds: list[int] = []
        self.seen: list[tuple[int, int, bool]] = []
        self.flags: list[tuple[bool, bool]] = []

    def choose(self, cap):
        k = min(self.script[len(self.rounds)] if len(self.rounds) < len(self.script) else 0, cap)
        self.rounds.append(k)
        return k

    def observe(self, depth, accepted, stopped=False):
        self.seen.append((depth, accepted, stopped))

    def record_overhead(self, seconds, rolled_back=False, warm=True):
        self.flags.append((rolled_back, warm))


def test_runner_flags_rollback_and_warm_rounds():
    m = ds4py.load(demo_model_path(), n_threads=2)
    ids = m.tokenizer.encode(CODE)
    script = [2, 2, 0, 3, 0, 0, 4, 4, 4, 1, 0, 2] + [0] * 60
    pol = Recording(script)
    with m.new_session() as s:
        toks, st = speculative_generate(m, ids, 40, policy=pol, session=s)
    drafting = [i for i, k in enumerate(pol.rounds) if k > 0]
    assert len(pol.seen) == len(drafting) == st["draft_rounds"]
    # the run's first drafting round records no costs (its verify allocates
    # the session's rollback state: ds4py.spec.runner "Warm rounds")
    assert len(pol.flags) == len(drafting) - 1
    for (depth, acc, stopped), (rolled, warm), i in zip(pol.seen[1:], pol.flags, drafting[1:],
                                                       strict=True):
        assert not stopped
        assert rolled == (acc < depth), (i, depth, acc)
        assert warm == (i > 0 and pol.rounds[i - 1] > 0), i
    # the script has both kinds of each
    assert {r for r, _ in pol.flags} == {True, False}
    assert {w for _, w in pol.flags} == {True, False}
