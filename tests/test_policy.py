"""The draft-depth policies (ds4py/spec/policy.py), without a model.

Everything here is deterministic: the adaptive policy's cost model is
either replaced by an injected cost function (``cost=``) or fed synthetic
timings through its ``record_*`` methods; no test reads a clock.

The acceptance EMA, the cost model's choice and the probe rule are checked
against ds4's description (ds4-notes §4 "Adaptive depth", "Probe, fixing the
EMA latch"; §7 pitfall 7), with the expected values written out here, and a
round simulator (``simulate``) replays acceptance schedules:
- a regime change (unpredictable, then perfectly predictable text): the
  latched policy resumes drafting within a bound derived from the probe rule;
- text where drafting never pays: total cost within 5% of plain decoding.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ds4py.spec.policy import NO_DRAFT, AdaptivePolicy, CostModel, FixedPolicy

# ds4's measured round costs in plain-decode units (ds4-notes §4 "Verify
# widths": verify(w) ~ 30.6 + 8.74 w ms against 37.4 ms plain; a draft step
# costs h = 0.18 plain steps). Written out, not imported from the policy.
A_REL, B_REL, H_REL = 30.6 / 37.4, 8.74 / 37.4, 0.18


def ds4_cost(d: int) -> float:
    return 1.0 if d == 0 else A_REL + B_REL * (d + 1) + H_REL * d


def never(d: int) -> float:
    """Drafting is never worth it (the cost model always answers 0)."""
    return 1.0 if d == 0 else 1000.0


def simulate(policy, accept, n_tokens: int, cost=ds4_cost, cap: int = 7):
    """Rounds until n_tokens are produced: each round the policy picks k,
    ``accept(round, k)`` drafts are accepted, the round yields that many + 1
    tokens and costs cost(k). Returns the per-round (k, accepted) list and
    the total cost."""
    rounds, total, made = [], 0.0, 0
    while made < n_tokens:
        k = policy.choose(cap)
        a = accept(len(rounds), k)
        policy.observe(k, a)
        rounds.append((k, a))
        total += cost(k)
        made += a + 1
    return rounds, total


# ---------------------------------------------------------------- EMA --


def test_ema_init_and_updates():
    pol = AdaptivePolicy(cost=ds4_cost)
    init = [0.85 * 0.98 ** d for d in range(1, 8)]
    assert pol.p == pytest.approx(init, rel=1e-12)
    # depth 4, 2 accepted: positions 1, 2 succeed, 3 fails, 4 observes nothing
    pol.observe(4, 2)
    want = list(init)
    want[0] = 0.85 * init[0] + 0.15
    want[1] = 0.85 * init[1] + 0.15
    want[2] = 0.85 * init[2]
    assert pol.p == pytest.approx(want, rel=1e-12)
    # all accepted: no failure anywhere
    pol.observe(2, 2)
    want[0] = 0.85 * want[0] + 0.15
    want[1] = 0.85 * want[1] + 0.15
    assert pol.p == pytest.approx(want, rel=1e-12)
    # depth 0 carries no evidence
    pol.observe(0, 0)
    assert pol.p == pytest.approx(want, rel=1e-12)


def test_stop_tokens_do_not_update_statistics():
    """A round that stopped (stop/EOS token, or the budget) observes no
    failure; its successes are the drafts committed before the stop token,
    which the loop passes as ``accepted``."""
    pol = AdaptivePolicy(cost=ds4_cost)
    before = list(pol.p)
    pol.observe(5, 0, stopped=True)      # the stop token was the first draft / bonus
    assert pol.p == before
    pol.observe(5, 2, stopped=True)      # two drafts, then the stop token
    want = list(before)
    want[0] = 0.85 * want[0] + 0.15
    want[1] = 0.85 * want[1] + 0.15
    assert pol.p == pytest.approx(want, rel=1e-12)   # position 3 untouched
    # the same round without the stop: position 3 fails
    pol2 = AdaptivePolicy(cost=ds4_cost)
    pol2.observe(5, 2)
    assert pol2.p[2] == pytest.approx(0.85 * before[2], rel=1e-12)


# ------------------------------------------------------------ choice --


@settings(max_examples=200, deadline=None)
@given(p=st.lists(st.floats(0.0, 1.0), min_size=7, max_size=7),
       a=st.floats(0.1, 2.0), b=st.floats(0.0, 1.0), h=st.floats(0.0, 1.0),
       cap=st.integers(1, 7))
def test_choice_maximises_expected_tokens_per_cost(p, a, b, h, cap):
    def cost(d):
        return 1.0 if d == 0 else a + b * (d + 1) + h * d
    margin = 0.05
    pol = AdaptivePolicy(cost=cost, probe_interval=0, margin=margin)
    pol.p = list(p)
    rates = []
    for d in range(cap + 1):
        e = 1.0 + sum(math.prod(p[:j]) for j in range(1, d + 1))
        rates.append(e / cost(d))
    # depth 0 competes with its rate raised by the margin
    rates[0] *= 1 + margin
    got = pol.choose(cap)
    assert 0 <= got <= cap
    # the choice attains the best rate (up to float rounding), and nothing
    # shallower does strictly better than it by more than rounding
    assert rates[got] >= max(rates) * (1 - 1e-12)
    assert all(r <= rates[got] * (1 + 1e-12) for r in rates[:got])


def test_depth_zero_always_a_candidate_and_cap():
    pol = AdaptivePolicy(cost=ds4_cost)
    assert pol.choose(0) == 0 and pol.n_rounds == 0  # no decision, no round
    assert pol.choose(1) == 1  # fresh EMA (0.85) at depth 1: drafting pays under ds4_cost
    pol.p = [1.0] * 7
    assert pol.choose(3) == 3  # perfect acceptance, drafting cheap: as deep as allowed
    pol.p = [0.0] * 7
    assert pol.choose(7) == 0


# ------------------------------------------------------------ probes --


def probe_rounds(interval0: int, cap: int, n: int) -> list[int]:
    """Round indices of probes when the cost model always says 0 (the rule
    as quoted: after `interval` evidence-free rounds one depth-1 probe; the
    interval doubles after every probe, capped)."""
    out, r, interval = [], 0, interval0
    while True:
        r += interval          # `interval` rounds of depth 0 ...
        if r >= n:
            return out
        out.append(r)          # ... then the probe
        r += 1
        interval = min(2 * interval, cap)


def test_probe_interval_doubles_to_cap():
    pol = AdaptivePolicy(cost=never)
    n = 2000
    picks = [pol.choose(7) for _ in range(n)]
    probes = [i for i, k in enumerate(picks) if k]
    assert set(picks) == {0, 1}
    assert probes == probe_rounds(4, 256, n)
    assert probes[:4] == [4, 13, 30, 63]          # 4, 8, 16, 32 idle rounds between
    gaps = [b - a - 1 for a, b in zip(probes, probes[1:], strict=False)]
    assert gaps[-3:] == [256, 256, 256]
    assert pol.n_probes == len(probes)


def test_accepted_probe_does_not_reset_interval():
    pol = AdaptivePolicy(cost=never)
    seen = []
    for _ in range(200):
        k = pol.choose(7)
        if k:
            pol.observe(k, k)  # every probe accepted
            seen.append(pol.interval)
    # accepted is not profitable: the interval keeps doubling
    assert seen == [8, 16, 32, 64, 128]


def test_interval_resets_only_when_cost_model_drafts():
    costs = {"f": never}
    pol = AdaptivePolicy(cost=lambda d: costs["f"](d))
    for _ in range(100):
        pol.choose(7)
    assert pol.interval == 64
    costs["f"] = ds4_cost          # drafting pays now: the model chooses > 0
    assert pol.choose(7) > 0 and not pol.last_was_probe
    assert pol.interval == 4 and pol.idle == 0
    costs["f"] = never             # latched again: the short interval is back
    picks = [pol.choose(7) for _ in range(20)]
    assert [i for i, k in enumerate(picks) if k] == [4, 13]


def test_probe_interval_zero_latches():
    """ds4's old behaviour (DS4_QWEN_MTP_PROBE=0): never drafts again."""
    pol = AdaptivePolicy(cost=never, probe_interval=0)
    assert all(pol.choose(7) == 0 for _ in range(1000))


# ------------------------------------------------------------ fixtures --


def test_regime_change_resumes_drafting():
    """Unpredictable text (every draft rejected) for U rounds, then perfectly
    predictable text (every draft accepted). The policy latches at depth 0
    in the first phase and resumes drafting in the second within a bound
    that follows from the rule alone:
      * at the switch p1 >= 0; depth 1 beats plain once (1 + p1)/cost(1) >
        1/cost(0), i.e. p1 > cost(1) - 1 = 0.468 (deeper depths need more:
        their reach is p1 times p2.. <= p1, over a larger cost); n accepted
        probes lift p1 from 0 to 1 - 0.85^n, so 4 probes are enough
        (0.478); the cost model's own choice then drafts;
      * the probes come after at most I, 2I, 4I, 8I idle rounds (each
        capped at 256), I the interval at the switch (4 doubled once per
        probe seen in the first phase), each followed by the probe itself.
    """
    U = 300
    pol = AdaptivePolicy(cost=ds4_cost)
    rounds, _ = simulate(pol, lambda r, k: 0 if r < U else k, 3000)
    first = rounds[:U]
    # phase 1 latches: after the first few rounds only probes draft
    warm = next(i for i, (k, _) in enumerate(first) if k == 0)
    assert warm <= 10
    probes_before = [i for i, (k, _) in enumerate(first) if k and i > warm]
    assert all(first[i][0] == 1 for i in probes_before) and len(probes_before) >= 4
    interval = min(4 * 2 ** len(probes_before), 256)
    bound = sum(min(interval * 2 ** i, 256) + 1 for i in range(4)) + 1
    # resumed: the first round after the switch that is not a depth-1 probe,
    # i.e. the cost model itself chose to draft
    later = rounds[U:]
    resumed = next(i for i, (k, _) in enumerate(later)
                   if k > 1 or (k == 1 and later[i + 1][0] > 0))
    assert resumed <= bound, (resumed, bound)
    # and then it keeps drafting, deeper than a probe
    tail = later[resumed:resumed + 50]
    assert all(k > 0 for k, _ in tail) and max(k for k, _ in tail) >= 3
    # without probes the same schedule never drafts again (the test can fail)
    pol0 = AdaptivePolicy(cost=ds4_cost, probe_interval=0)
    rounds0, _ = simulate(pol0, lambda r, k: 0 if r < U else k, 3000)
    assert all(k == 0 for k, _ in rounds0[U:])


@pytest.mark.parametrize("n_tokens", [400, 2000])
def test_never_pays_costs_under_5_percent(n_tokens):
    """Every draft rejected for the whole generation: the total cost of the
    rounds (ds4's cost ratios) relative to plain decoding of the same tokens
    stays under 1.05. Where it goes: the first rounds draft on the prior
    acceptance (0.85 0.98^d) until the EMA falls, then a probe after 4, 8,
    16, .. 256 idle rounds."""
    pol = AdaptivePolicy(cost=ds4_cost)
    rounds, total = simulate(pol, lambda r, k: 0, n_tokens)
    plain = n_tokens * ds4_cost(0)
    assert len(rounds) == n_tokens  # every round makes exactly one token
    assert total / plain < 1.05, total / plain
    # the bound is not vacuous: a probe every 5th round (no doubling) costs
    # 0.468/5 ~ 9% more than plain
    pol4 = AdaptivePolicy(cost=ds4_cost, probe_interval=4, probe_cap=4)
    _, total4 = simulate(pol4, lambda r, k: 0, n_tokens)
    assert total4 / plain > 1.05


# ------------------------------------------------------ measured costs --


def test_cost_model_priors_then_fit():
    cm = CostModel(window=32)
    # nothing measured: ds4's ratios in plain units
    assert cm.plain() == 1.0
    assert cm.verify(3) == pytest.approx(A_REL + 3 * B_REL)
    assert cm.draft_step() == pytest.approx(H_REL)
    # a plain step measured: the priors scale to it
    cm.record_plain(2e-3)
    assert cm.verify(3) == pytest.approx(2e-3 * (A_REL + 3 * B_REL))
    # one width: the prior slope through that width's mean
    for t in (5e-3, 7e-3):
        cm.record_verify(4, t)
    a, b = cm.verify_line()
    assert b == pytest.approx(2e-3 * B_REL)
    assert a + 4 * b == pytest.approx(6e-3)
    # two or more widths: least squares on the samples (exact line plus
    # +-1e-5 alternating noise; tolerance 5e-5 s: a few times the noise)
    cm2 = CostModel(window=32)
    for i, w in enumerate([2, 3, 4, 5, 2, 3, 4, 5, 8, 8]):
        cm2.record_verify(w, 1e-3 + 4e-4 * w + (1e-5 if i % 2 else -1e-5))
    a, b = cm2.verify_line()
    assert a == pytest.approx(1e-3, abs=5e-5) and b == pytest.approx(4e-4, abs=1e-5)
    # the window forgets: 32 samples of a new line replace the old fit
    for w in [2, 3, 4, 5] * 8:
        cm2.record_verify(w, 2e-3 + 1e-4 * w)
    a, b = cm2.verify_line()
    assert a == pytest.approx(2e-3, rel=1e-9) and b == pytest.approx(1e-4, rel=1e-9)
    # draft steps: seconds per step
    cm2.record_draft(4, 4e-4)
    assert cm2.draft_step() == pytest.approx(1e-4)
    # a decreasing noisy fit is clamped flat, never negative
    cm3 = CostModel()
    cm3.record_verify(2, 3e-3)
    cm3.record_verify(3, 2e-3)
    a, b = cm3.verify_line()
    assert b == 0.0 and a == pytest.approx(2.5e-3)


def test_a_measured_width_is_priced_by_its_own_median():
    """Rounds are priced with the measured verify of their width once it has
    3 samples; the line (clamped through the origin here: a < 0) only
    extrapolates. Values: w=2 measured at 1.2 ms, w=4 at 3.0 ms, so the
    least-squares line has a < 0 and is forced through the origin
    (b = sum(w t) / sum(w w) = 14.4 / 20 = 0.72 ms, verify(2) = 1.44 ms, 20% too
    high)."""
    cm = CostModel(window=32)
    cm.record_plain(1e-3)
    for _ in range(3):
        cm.record_verify(2, 1.2e-3)
        cm.record_verify(4, 3.0e-3)
    a, b = cm.verify_line()
    assert a == 0.0 and b == pytest.approx(0.72e-3, rel=1e-9)
    assert cm.verify(2) == pytest.approx(1.44e-3, rel=1e-9)
    assert cm.verify_cost(2) == pytest.approx(1.2e-3, rel=1e-9)
    cm.record_draft(1, 2e-4)
    costs = cm.round_costs(3)
    assert costs[1] == pytest.approx(1.2e-3 + 2e-4, rel=1e-9)  # measured width 2
    assert costs[2] == pytest.approx(3 * b + 2 * 2e-4, rel=1e-9)  # width 3: the line
    assert costs[3] == pytest.approx(3.0e-3 + 3 * 2e-4, rel=1e-9)  # measured width 4
    # fewer than 3 samples of a width: the line
    cm2 = CostModel(window=32)
    cm2.record_plain(1e-3)
    cm2.record_verify(2, 1.2e-3)
    cm2.record_verify(2, 1.2e-3)
    assert cm2.verify_cost(2) == pytest.approx(cm2.verify(2), rel=1e-12)


def test_measured_costs_drive_the_choice():
    """Fed timings where a verify row costs as much as a plain step and a
    draft step 0.7 of one (the tiny golden models on a CPU), even perfect
    acceptance cannot pay: the policy settles on depth 0. Where verify rows
    are nearly free, it drafts deep."""
    def run(verify_b, draft, acc):
        pol = AdaptivePolicy()
        ks = []
        for _ in range(60):
            k = pol.choose(7)
            ks.append(k)
            if k == 0:
                pol.record_plain(1e-3)
            else:
                pol.record_draft(k, draft * k)
                pol.record_verify(k + 1, 0.2e-3 + verify_b * (k + 1))
                pol.observe(k, acc(k))
        return ks, pol
    ks, pol = run(1e-3, 0.7e-3, lambda k: k)
    # (1 + d) / (0.2 + 1.7 d + 1) < 1 for every d >= 1 (ms): never pays
    assert ks[-20:].count(0) >= 18  # probes only
    ks, pol = run(0.02e-3, 0.02e-3, lambda k: k)
    assert all(k >= 5 for k in ks[-20:])
    assert pol.costs.verify_line()[1] == pytest.approx(0.02e-3, rel=1e-6)


# ------------------------------------------------------------- fixed --


def test_fixed_policy():
    assert FixedPolicy(3).choose(7) == 3 and FixedPolicy(3).choose(2) == 2
    assert FixedPolicy(3).enabled and not FixedPolicy(0).enabled and not NO_DRAFT.enabled
    pol = FixedPolicy(2)
    pol.observe(2, 0)  # learns nothing
    assert all(pol.choose(7) == 2 for _ in range(10))
    for bad in (-1, 1.5, True, None):
        with pytest.raises(ValueError):
            FixedPolicy(bad)
    with pytest.raises(ValueError):
        AdaptivePolicy(max_depth=0)


def test_calibration_rounds_measure_plain_decode():
    """With measured costs, the first round is a plain step (the price of
    depth 0 is measured, not inferred), and so is one round after every
    `recalibrate` drafting rounds in a row."""
    pol = AdaptivePolicy(recalibrate=10)
    ks = []
    for _ in range(40):
        k = pol.choose(7)
        ks.append(k)
        if k == 0:
            pol.record_plain(1e-3)
        else:  # drafting is cheap and always accepted: the model keeps drafting
            pol.record_draft(k, 1e-6 * k)
            pol.record_verify(k + 1, 1e-3 + 1e-6 * (k + 1))
            pol.observe(k, k)
    assert [i for i, k in enumerate(ks) if k == 0] == [0, 11, 22, 33]
    assert pol.n_calibration == 4
    # an injected cost function needs no calibration
    assert AdaptivePolicy(cost=ds4_cost).choose(7) > 0


def test_cost_model_ignores_stalls():
    """A wall-clock sample many times the true cost (the process was
    descheduled on a shared machine) must not move the prices: plain steps,
    draft steps and round overheads are medians of recent samples, and a
    verify sample is clipped to clip x the fitted line once it rests on
    window/4 samples of two or more widths."""
    cm = CostModel(window=32, recent=9, clip=3.0)
    for _ in range(5):
        cm.record_plain(1e-3)
        cm.record_draft(2, 2e-4)
        cm.record_overhead(5e-5)
    cm.record_plain(50e-3)
    cm.record_draft(2, 40e-3)
    cm.record_overhead(9e-3)
    assert cm.plain() == 1e-3 and cm.draft_step() == 1e-4 and cm.overhead() == 5e-5
    # an EMA (alpha 0.1) would have moved plain to ~5.9e-3: the old latch
    for w in [2, 3, 4, 5] * 2:
        cm.record_verify(w, 1e-3 + 5e-4 * w)
    a, b = cm.verify_line()
    cm.record_verify(3, 1.0)  # a 1 s stall: enters as 3 x 2.5e-3
    # one of 9 samples 5e-3 above the line moves the fit at w = 3 by well
    # under 1e-3 s (measured 6.5e-4); unclipped it would move by > 0.1 s
    assert abs(cm.verify(3) - (a + 3 * b)) < 1e-3
    # the median follows a real change within `recent` samples
    for _ in range(5):
        cm.record_plain(2e-3)
    assert cm.plain() == 2e-3
