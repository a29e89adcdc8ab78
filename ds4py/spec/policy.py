"""Draft-depth policies: how many tokens to draft in each speculative round.

    policy = AdaptivePolicy()          # the default: cost model + probes
    policy = FixedPolicy(3)            # always depth 3 (measurement; --draft-depth 3)
    policy = FixedPolicy(0)            # never draft (--no-draft); NO_DRAFT is one

One policy object serves every drafter. The loop (ds4py.spec.loop) asks
``choose(cap)`` before each round (cap: the deepest round that still fits the
token budget and the verify width), then reports what happened:
``observe(depth, accepted, stopped)`` and the measured costs
(``record_plain``, ``record_verify``, ``record_draft``, ``record_overhead``).
``enabled`` is the admission decision: a policy that can never draft lets the
loop skip priming the drafter (prefill and decode take the same decision).

AdaptivePolicy (ds4-notes §4 "Adaptive depth", a port of ds4's / mlx.fast's
``costModelDepth``, with the verify cost measured instead of guessed):

* Acceptance: a per-position estimate ``p[d]`` (d = 1..max_depth: the
  chance that draft d is accepted given drafts 1..d-1 were), initialised to
  ``0.85 * 0.98**d`` (or a caller's list). After a round
  of depth k with m drafts accepted -- every drafting round: chosen, probe
  or burst --, positions 1..m observe success, position m+1 (when m < k)
  observes failure, deeper positions observe nothing. The estimate is a
  mean over *rounds* (an EMA in time, not in observations): every round
  (depth 0 included) each position's evidence loses weight by ``discount``
  (0.85), and the starting estimate weighs ``prior_weight`` (2)
  observations, p = (S + 2 * start) / (W + 2) with S and W the discounted
  sums of observations and of their weights. So recent evidence decides,
  whatever its source (a probe or a drafting round), and a position that
  has not been observed for a while relaxes back toward where the request
  started. Why: on the demo model's acceptance traces (bench prompts,
  replayed through this class, tests/test_policy.py) text often opens
  unpredictably and turns predictable; the earlier estimator (below) kept
  the opening's failures and needed 5-6 successful probes at intervals 8,
  16, 32.. to draft again: math stayed at depth 0 for 128 tokens where
  depth 2 gives 1.22x. ``discount=None`` (or ``prior_weight=None``) keeps
  that estimator, for comparison: an observation moves p by ``max(rate,
  1/(prior_weight + n + 1))`` (n: the position's earlier observations; the
  rate ``alpha`` (0.25) for a probe's observation, ``steady_alpha`` (0.05)
  for a drafting round's), ``prior_weight=None`` giving ds4's plain EMA
  (one rate 0.15 there made a session at 0.94 acceptance fall below the
  break-even of depth 2 after two unlucky rejections, and climbing back took
  a probe per 4, 8,
  16, 32.. rounds.) A position this policy has not observed is priced at least at the
  one before it times 0.98 (:meth:`AdaptivePolicy.acceptance`). A round
  that ended the generation (a stop/EOS token, or the budget) observes no
  failure, and its successes count only up to the stop token (stop tokens
  don't update the statistics).
* Cold start: the first ``burst`` (3) rounds draft at least ``burst_depth``
  (2) whatever the cost model says: the measurements a choice needs
  (acceptance of positions 1-2, verify widths) arrive in the first rounds.
  At most 3 rounds of a loss where drafting never pays, fewer under
  the exploration budget (below).
* Cost, in seconds measured in this session (:class:`CostModel`):
  ``cost(0)`` = a plain one-token decode, ``cost(d)`` = verify(d+1) +
  d x draft_step + round overhead (the head's catch-up) [+ (1 - P(all d
  drafts accepted)) x rollback, what an accept that rolls back costs
  beyond one that keeps every row, with CostModel(split_rollback=True):
  its "Rollback", off by default], each the lower
  quartile of recent samples (robust to the scheduler stalls of a shared
  machine, see CostModel), verify(w) of width w's own samples once there
  are 3, else the line a + b*w fitted online through the measured widths.
  Until there is data the costs come from ds4's measured ratios (priors
  below), scaled by the measured plain step. That one is always measured:
  the first ``calibrate`` (3) rounds of a policy whose costs hold fewer plain
  steps are plain decodes (calibration), and so is one round after every
  ``recalibrate`` (32) drafting rounds in a row -- a policy that keeps
  drafting would otherwise price depth 0 from old samples forever. The
  runner times every plain round (two clock reads), and the policy
  re-prices only when the plain cost moves by more than 1%. A calibration
  round costs nothing against plain decoding. A cost model made with
  ``correct=True`` then corrects the drafting depths' prices by what rounds
  take start to start (CostModel, "End-to-end correction": a drafting
  round's wall over its parts' sum against a plain stretch's wall per token
  over the plain step; never below 1); off by default (measured there).
* Re-pricing: the depths' costs are re-priced from the cost model at once
  when a new kind of estimate appears (CostModel.epoch: a first sample of
  a kind, a verify width reaching 3 samples or leaving the window) or the
  plain step moves by more than 1%, and otherwise at most every
  ``reprice_every`` (REPRICE_EVERY, 8) rounds; the acceptance side is
  re-evaluated at every choice. Why: re-pricing after every record (the
  low quartiles' sorts, the line fit, the scatter) was most of the policy's
  own time, and that time is paid in every drafting round: a round's
  choose + observe + records took 27.9 us in a warm synthetic loop before
  and 8.3 us after, and ~3x that right after a core call (cold caches),
  where it counts: the demo model's plain step is ~0.43 ms on the 2-core
  Zen 5 VM of 2026-12-07, and a policy's overhead per round measured
  0.30 plain steps there against fixed depth 2's ~0.1.
* Choice: the depth in 0..min(cap, max_depth) maximising expected tokens per
  second, E(d) / cost(d), with E(d) = 1 + sum_{j<=d} prod_{i<=j} p[i] (the
  target's own token always comes). Ties go to the shallower depth; depth 0
  is always a candidate, and a drafting depth must beat it by ``margin``
  (5%), or by NOISE_Z (2) standard errors of its price where the cost
  samples scatter more (CostModel.uncertainty), to start drafting: at
  break-even drafting has nothing to gain and the estimates' noise to lose.
  Once the cost model drafts, it goes on while drafting beats depth 0 by
  half the noise term (no fixed margin: hysteresis; without it, every small dip of
  the estimates flipped a session with a ~10% gain back to depth 0).
  ``quiet`` after a depth-0 choice: the rounds until the next probe (the
  runner takes a fast path over them, ds4py.spec.runner "Quiet stretches").
  Cost exploration: one chosen drafting round (depth d) in ``explore`` (16)
  drafts d + 1 while width d + 2 has fewer than 3 measured verifies, so
  the next deeper depth is priced by its own measurement, not by the line's
  extrapolation (``explore=0``: never).
* Probes (ds4-notes §4 "Probe, fixing the EMA latch"; pitfall 7): a round of
  depth 0 carries no evidence, so a policy that has chosen 0 would never
  learn that drafting started to pay. After ``interval`` consecutive
  evidence-free rounds the next round that the cost model would give depth 0
  is a depth-1 probe. The interval starts at ``probe_interval`` (4) and
  doubles after every probe, accepted or not (cap ``probe_cap``, 256); it is
  reset only when the cost model itself chooses a depth > 0 (ds4 measured
  -26% when an *accepted* probe reset it: accepted is not profitable).
  ``probe_interval=0`` disables probes (ds4's old, latching behaviour).
  Follow-ups: a probe (or follow-up) whose drafts were all accepted is
  followed at once by another probe, at most ``follow_max`` (4) in a row,
  the i-th of depth min(i, ``follow_depth``) (so 1, 2, 2, 2); a rejected
  draft ends the chain, and so does the cost model choosing to draft.
  Follow-ups leave the interval alone (it doubles once per scheduled probe),
  and there are none where drafting could not pay even if every draft were
  accepted (no evidence could change the choice there: ds4's "accepted is
  not profitable"). Why: the discount forgets a probe's
  evidence within ~10 rounds, so probes 8, 16, 32.. rounds apart can never
  move the estimate above where the request started. On the demo model that
  start (0.85 * 0.98**d) sits at the break-even of every depth, and code and
  math prompts whose opening failed the cold-start burst stayed at depth 0
  for good while fixed depth 2 measured 1.2x serial: their probes were
  accepted one by one, each forgotten before the next. A chain of accepted
  probes is evidence that adds up (and each accepted probe is a profitable
  round); on text where drafting never pays the chain ends at the first
  rejection. On the demo model's 21 acceptance traces under its measured
  costs (tests/test_policy.py test_trace_replay), with drafting priced 6%
  dearer (about as the live cost model priced it in this session's traces:
  its plain step, a lower quartile, sat ~5% below the serial loop's
  per-token time), the policy without follow-ups averaged 1.00x serial and
  with them 1.07x (the best fixed depth 1.06x). The first follow-up is of
  depth 1 because most chains on text where drafting is break-even end
  there: in two 10-repetition A/Bs on the demo model (prose / math / chat /
  code prompts) chains starting at depth 2 measured 0.92-0.94 / 1.13-1.14 /
  0.98-0.99 / 0.99-1.03x serial, chains starting at 1 0.95 / 1.12-1.15 /
  0.98-1.00 / 1.07-1.10x. (Three bench runs after the change measured math
  1.09-1.14x where four before it measured 1.15-1.20x; the A/Bs, interleaved
  in one process, are the fairer comparison.)

* Exploration budget: the rounds the policy forces for evidence -- the
  cold-start burst (where it drafts deeper than the cost model would),
  scheduled probes and follow-ups -- are priced after the fact: cost(d) /
  cost(0) minus the tokens the round committed, in plain steps (negative
  when it gained). Once their sum exceeds ``explore_allow`` (1) plus
  ``explore_share`` (2%) of the request's rounds, the optional ones wait:
  the burst ends and a probe chain gets no follow-up. Scheduled probes are
  never held back (the issue's rule against the latch) but their losses
  count. Why: on text where drafting never pays, the forced rounds were
  most of what the policy lost -- on an AVX2-only machine (verify(2) 1.63
  plain steps, overhead 0.22) the 3-round burst at depth 2 and a chain of 4
  follow-ups cost ~4% of a 128-token prose run (live A/B, 20 interleaved
  repetitions: prose 0.93-0.94x serial without the budget, 0.95-0.98x
  with it); on the demo model's traces under the AVX-512 machine's costs
  the budget also raises the mean (1.123 -> 1.130x), because a failed
  opening no longer spends the whole burst (tests/test_policy.py).
  ``explore_allow=None``: no budget.

The cost model may be replaced, for deterministic tests and what-if runs, by
``cost=lambda d: seconds`` (the cost of a round of depth d); the measured
``record_*`` calls are then ignored. Nothing in the policy reads a clock.

FixedPolicy(k) drafts exactly min(k, cap) every round and learns nothing; it
is the explicit measurement mode. A fixed depth *replaces* the adaptive
policy (there is no "ceiling" meaning hidden in it; for a ceiling pass
``AdaptivePolicy(max_depth=k)``) -- ds4's DS4_QWEN_MTP_K was meant as a
ceiling and silently overrode AUTO (ds4-notes §7 pitfall 7).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

__all__ = ["AdaptivePolicy", "FixedPolicy", "NO_DRAFT", "CostModel", "Policy"]

# ds4-notes §4 "Verify widths": at 2554 tokens verify(w) ~ 30.6 + 8.74*w ms
# against 37.4 ms for a plain decode (Qwen3.5-27B, Metal). Used, in units of
# a plain decode, only until this session has measured its own costs.
PRIOR_VERIFY_A = 30.6 / 37.4
PRIOR_VERIFY_B = 8.74 / 37.4
# ds4-notes §4: a draft step costs h plain steps, DS4_QWEN_MTP_H default 0.18.
PRIOR_DRAFT_H = 0.18
# ds4-notes §4: EMA init 0.85 * 0.98^d, alpha 0.15; chooser cap 7; probe
# interval starts at 4 and is capped at 256.
P_INIT, P_DECAY, DS4_ALPHA = 0.85, 0.98, 0.15
MAX_DEPTH = 7
# The expected rate of a drafting depth must exceed plain decoding's by this
# fraction for the cost model to choose it (probes aside). The bar is
# "never below 0.95x serial"; a choice at break-even risks that for nothing.
MARGIN = 0.05
# ... and, on a noisy machine, by NOISE_Z standard errors of its estimated
# price (CostModel.uncertainty); once drafting, by half that (no MARGIN).
# The cost model prices a round from lower quartiles of recent samples; on a
# shared VM whose speed moves 20-40% within a second (the AVX2 EPYC of
# 2026-11-30) those estimates scatter by ~+-15% (the estimated verify(2) /
# plain ratio at each choice: 1.0-1.43, 10th-90th percentile, against 1.42
# from samples paired in time), and a policy drafting whenever the estimate
# says "gain" drafts mostly when the noise favours it: its chosen depth-1
# rounds were priced 1.52 plain steps and cost 1.77 (prose, 286 rounds), and
# prose ran at 0.92x serial. A choice inside the noise has nothing to gain.
NOISE_Z = 2.0
# The end-to-end correction's cap (CostModel.correction): a drafting round
# measured at more than twice its parts' sum is a stall, not a price.
CORRECTION_MAX = 2.0
PROBE_INTERVAL, PROBE_CAP = 4, 256
# A probe whose drafts were all accepted is followed at once by another
# probe, up to FOLLOW_MAX in a row, the i-th of depth min(i, FOLLOW_DEPTH)
# (module doc "Probes"): isolated probes 8-64 rounds apart cannot lift the
# estimate above the starting one, since the discount forgets each before
# the next.
FOLLOW_DEPTH, FOLLOW_MAX = 2, 4
# Learning a session's acceptance fast: the starting estimate weighs
# PRIOR_WEIGHT observations (a running mean until it is as slow as the EMA);
# the first BURST rounds draft at least BURST_DEPTH (cold start); depth 0 is
# priced from CALIBRATE measured plain steps at least.
PRIOR_WEIGHT = 2.0
# EMA rates (module doc "Acceptance"): an observation of a probe moves the
# estimate by ALPHA, one of a drafting round by STEADY_ALPHA. ds4 used 0.15
# for both; simulated on the demo model's measured costs (tests/test_policy.py
# demo_cost, acceptance 0.94, 12 seeds x 300 tokens) that gave 0.92 plain
# steps per token (worst seed 1.01: a few unlucky rejections latched it at
# depth 0), these 0.855 (worst 0.91; the best fixed depth gives 0.82).
ALPHA, STEADY_ALPHA = 0.25, 0.05
# The default estimator (module doc "Acceptance"): evidence loses weight by
# DISCOUNT per round and the estimate relaxes toward where the request
# started, which weighs PRIOR_WEIGHT observations. Chosen on acceptance
# traces of the demo model (12 workloads: the bench's code/prose/math/chat
# prompts at 128 and 256 tokens and 8 held-out prompts at 192, replayed
# through this class under the measured CPU costs; tests/test_policy.py
# test_trace_replay): the old EMA averaged 1.05x serial (worst 0.99, math
# 0.99 where depth 2 gives 1.22), discount 0.85 averages 1.12x (worst 1.04);
# the best fixed depth (2) 1.11x (worst 1.00). 0.8..0.93 all lie within 2%.
DISCOUNT = 0.85
# ... but a drafting round that fails at its first draft doubles the number
# of rounds one discount step takes (up to PATIENCE_CAP), and one that
# accepts a draft resets it: otherwise, where drafting never pays but the
# starting estimate says it does (ds4's GPU costs: break-even at p1 = 0.47),
# the estimate relaxes back above the break-even within a few rounds and the
# cost model drafts -- and fails -- every 4th round (22% slower than plain;
# with the patience 1.4-2.1%, tests/test_policy.py)
PATIENCE_CAP = 16
BURST, BURST_DEPTH = 3, 2
# The exploration budget (module doc "Exploration budget"): the rounds the
# policy forces for evidence (cold-start burst, probes, follow-ups) may lose
# at most EXPLORE_ALLOW plain steps plus EXPLORE_SHARE of the request's rounds,
# priced by the cost model with their realized acceptance; past it the
# optional ones (burst, follow-ups) wait.
EXPLORE_ALLOW, EXPLORE_SHARE = 1.0, 0.02
CALIBRATE = 3
# Depth-1 probes (scheduled, follow-ups, a cold-start burst at depth 1) run
# as shadows where the runner can (ds4py.spec.runner "Shadow probes").
SHADOW = True
# one chosen drafting round in EXPLORE drafts one deeper when that width's
# verify cost is not measured yet (AdaptivePolicy.choose)
EXPLORE = 16
# the policy re-prices the depths from the cost model at most every
# REPRICE_EVERY rounds while no new kind of estimate appeared (module doc
# "Re-pricing"): pricing every round was most of the policy's own time
REPRICE_EVERY = 8


class Policy:
    """The interface the loop drives (see the module doc). The base class
    records nothing and never drafts."""

    enabled = False
    last_was_probe = False   # the last choose() was a probe (stats)
    needs_plain = False      # the last choose() was 0 to measure a plain step: time it
    # after a choose() of 0: how many more rounds will be 0 unless new
    # evidence arrives (the runner's fast path over them)
    quiet = 0
    # the runner may run this policy's depth-1 probes as shadows
    # (ds4py.spec.runner "Shadow probes")
    shadow = False

    def choose(self, cap: int) -> int:
        return 0

    def pass_quiet(self, n: int) -> None:
        """n more depth-0 rounds passed without choose() calls (n <= the
        ``quiet`` the last choose() promised): the runner's fast path."""

    def observe(self, depth: int, accepted: int, stopped: bool = False) -> None:
        pass

    def observe_shadow(self, accepted: bool, stopped: bool = False) -> None:
        """A depth-1 probe the runner ran as a shadow (ds4py.spec.runner
        "Shadow probes"): the same evidence as observe(1, accepted)."""
        self.observe(1, int(accepted), stopped)

    def record_plain(self, seconds: float) -> None:
        pass

    def record_plain_many(self, samples) -> None:
        for t in samples:
            self.record_plain(t)

    def record_verify(self, width: int, seconds: float) -> None:
        pass

    def record_draft(self, steps: int, seconds: float) -> None:
        pass

    def record_overhead(self, seconds: float, rolled_back: bool = False,
                        warm: bool = True) -> None:
        """A drafting round's work beyond its drafts and verify;
        ``rolled_back``: the round rejected a draft (or stopped inside its
        block), so its accept rolled the session back; ``warm``: the round
        before it drafted too (CostModel "Rollback", "Warm rounds")."""

    def summary(self) -> dict:
        return {}


class FixedPolicy(Policy):
    """Always ``min(depth, cap)``; ``FixedPolicy(0)`` never drafts."""

    def __init__(self, depth: int):
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
            raise ValueError(f"depth must be an int >= 0, got {depth!r}")
        self.depth = depth
        self.enabled = depth > 0

    def choose(self, cap: int) -> int:
        return min(self.depth, cap)

    def summary(self) -> dict:
        return {"policy": "fixed", "depth": self.depth}

    def __repr__(self) -> str:
        return f"FixedPolicy({self.depth})"


NO_DRAFT = FixedPolicy(0)


class CostModel:
    """Round costs measured in this session (seconds).

    Every estimate is the lower quartile (:func:`low_quartile`) of recent
    samples: plain() of the last ``recent`` one-token decodes, draft_step()
    of the seconds per chained draft step, overhead() of the extra work of a
    drafting round (argmaxes, accept with the head's catch-up, bookkeeping),
    and verify_cost(w) of width w's samples among the last ``window``
    verifies once there are 3. verify(w) = a + b*w is the line fitted by
    least squares through the per-width estimates (it prices the widths not
    measured yet): with one width, through it and the plain step (a
    measured width-1 pass), or with the prior slope (in plain units) when
    no plain step is measured; with none, the prior line. ``unit()``, the plain-decode time the
    priors are scaled by: measured, else inferred from the verifies, else 1.0.

    Why a low quantile: on a shared 2-core machine a wall-clock sample is
    often a whole scheduler tick (~4 ms) or more above the true cost (one of
    the two threads was descheduled): measured on the demo model, 9 of 20
    plain samples of ~0.9 ms steps read 3-10 ms, so the median of 9 priced
    a plain step at 4.8 ms and the policy drafted depth 6 at 0.58x serial.
    Stalls only ever add time; they hit plain steps and verifies alike (in
    proportion to their length), so the same quantile of each is a fair
    comparison and the quartile sits on the un-stalled cost. (The first
    design, an EMA of plain steps, let one stall make depth 0 look
    expensive; the median needs a majority of clean samples, which a loaded
    machine does not give.)

    Estimates are cached and recomputed only for what a record changed, so
    pricing a round is O(widths) (the policy re-prices when a cost moves).

    **End-to-end correction** (:meth:`correction`). The parts above leave
    out whatever a round costs between its timers (the caller's work per
    committed token, Python between the stamps, the head's catch-up before
    a draft) and carry the lower quartiles' own optimism (a sum of three
    lower quartiles sits further below a round's typical time than one
    quartile sits below a plain step's). So the runner also times every
    round from its start to the next round's start: a drafting round's wall
    over its price (:meth:`record_round`; with what the cold plain step
    after it took beyond a plain token, ds4py.spec.runner "Cold steps"), and
    a plain stretch's wall per token (:meth:`record_plain_run`, the quiet
    steps included). The drafting
    depths are priced ``correction()`` = (median wall / price of drafting
    rounds) / (median plain wall per token / plain step) times their parts'
    sum, clamped to [1, 2]: it never makes drafting cheaper than its parts
    (fail closed), and it is 1 until 3 drafting rounds have been timed.
    Medians on both sides, so a stall hits them alike. Measured
    (2026-12-06, demo model): on a 2-thread AVX2 VM drafting rounds took
    1.09-1.42x their price while plain stretches took 0.66-0.97x theirs
    (the plain step's price includes a host argmax that the decode loop's
    quiet steps skip), so corrections of 1.15-2.0, and the policy drafted
    1.0-1.1 rounds per 128-token request instead of 5.5-7.1 where drafting
    does not pay; on an H100 the two sides were 1.04-1.14x and 1.05-1.20x,
    corrections 1.00-1.03, which changed nothing there. (Both measured
    before a cold step counted with its drafting round; on the H100 such
    steps took 0.55-0.61 ms against a serial token's 0.497.)

    **Off by default since 2026-12-07** (``correct=True`` turns it on; the
    samples are taken and reported either way, :meth:`summary`). Measured
    with it on and off side by side (``bench/spec_policy_ab.py``, demo
    model, ratio of medians to serial, code / prose / math / chat): on an
    H200, four interleaved runs of 16 repetitions, on 1.22-1.43 / 0.93-0.98
    / 1.40-1.52 / 1.01-1.06x and off 1.39-1.43 / 0.98-1.01 / 1.53-1.57 /
    1.04-1.06x (off ahead in 13 of 16 workload-runs); on a 2-core Zen 5 VM,
    two runs of 16, on 0.97-0.99 / 0.94-0.95 / 0.98-0.99 / 0.93-0.98x and
    off 1.06-1.08 / 0.90-0.95 / 1.01-1.12 / 0.93-1.14x; on the AVX2 VM of
    2026-12-06 the two were within its noise (README). Where drafting pays,
    the correction mostly held back rounds that gained.

    **Rollback.** An accept that keeps fewer rows than the verify had
    rolls the session back (the GDN state's replay, csrc/session.c), and
    costs more than one that keeps them all: on the demo model (2 threads,
    the Zen 5 VM of 2026-12-07, code and prose prompts at fixed depth 2)
    ``session.accept`` measured 87 us (lower quartile) when it rolled back
    and 21 us when it kept every row, 0.15 plain steps apart. One overhead
    for both mixed them in proportion to the text's rejections, so prose
    after code found drafting priced too cheap and code after prose too
    dear. The overheads are kept apart (``record_overhead(..., rolled_back)``):
    :meth:`overhead` prices a round that keeps every row and
    :meth:`rollback` the difference, which the policy weighs with the
    chance that a round of depth d rejects a draft, 1 - prod(p[1..d]).
    **Off by default** (``split_rollback=True`` turns it on): on an H100
    (demo model, ``bench/spec_policy_ab.py --backend cuda``, 3 runs of 16
    repetitions, 2026-12-07) the policy with it ran math at 1.44-1.50x
    serial and without it at 1.60-1.62x (code / prose / chat 1.43-1.47 /
    1.02-1.03 / 1.07-1.10x with, 1.43-1.50 / 1.03-1.07 / 1.08-1.11x
    without): the rollback's weight pushes toward shallower rounds where
    the deeper ones paid. On the 2-core Zen 5 VM the two were within its
    noise. Off, a rolled-back round's overhead is a sample like any other.

    **Warm rounds.** A drafting round right after a plain one finds the
    caches cold: with a draft of depth 2 in every round, or in every fourth
    (code prompts, same machine), the verify and the draft step cost the
    same (0.84 / 0.84 ms, 0.084 / 0.091 ms) but the overhead -- Python
    around the core calls -- 40-42 us against 66-93 us. The policy decides
    whether to keep drafting, so it prices the steady state: the overhead
    and the rollback come from warm rounds' samples (``warm``: the round
    before drafted) where there are any, else from cold ones. Before, a
    request that drafted only its cold-start burst priced the overhead at
    its first rounds' (up to 0.46 plain steps) and never drafted again.
    ``split_warm=False``: every round's samples alike.

    **Relative samples.** A verify, a draft step and an overhead are
    recorded as ratios to the plain step of their time (its low quartile
    then), and read back times the plain step now. The choice depends on
    these ratios only, and the plain step is sampled far more often (every
    plain round) than the verifies (drafting rounds only): on a shared VM
    whose speed drifts, a policy that had stopped drafting priced verifies
    it had measured while the machine ran slower against plain steps
    measured after it sped up -- on the 2-core Zen 5 VM of 2026-12-07 (demo
    model, math prompts) the plain step went from 0.41 to 0.33-0.34 ms
    between requests while width 3 kept its seconds, 1.73-1.88 plain steps
    became 2.21-2.29, and the policy stopped drafting where depth 2 ran at
    1.14x serial. Samples recorded before any plain step are kept in
    seconds and converted at the first one. ``relative=False``: seconds,
    as before.
    """

    def __init__(self, window: int = 64, recent: int = 16, correct: bool = False,
                 split_rollback: bool = False, split_warm: bool = True,
                 relative: bool = True):
        if window < 2:
            raise ValueError("window must be >= 2")
        if recent < 1:
            raise ValueError("recent must be >= 1")
        self._window = window
        self._recent = recent
        self.correct = correct   # apply the end-to-end correction (class doc: off by default)
        # price the rollback apart from the overhead (class doc "Rollback":
        # off by default, measured there)
        self.split_rollback = split_rollback
        # price the overhead from warm rounds' samples where there are some
        # (class doc "Warm rounds"; False: every round's samples alike)
        self.split_warm = split_warm
        # keep the verify, draft and overhead samples as ratios to the plain
        # step of their time (class doc "Relative samples"; False: seconds)
        self.relative = relative
        self._raw = False        # samples stored in seconds before any plain step
        self._verify: deque[tuple[int, float]] = deque()   # the window, oldest first
        # the newest (at most `recent`) samples of each width still in the window
        self._by_width: dict[int, deque] = {}
        self._in_window: dict[int, int] = {}
        self._plain: deque[float] = deque(maxlen=recent)
        self.plain_samples = 0
        self._draft: deque[float] = deque(maxlen=recent)
        # overheads by (rolled back, warm): [kept, rolled back] x [cold, warm]
        # (class doc "Rollback", "Warm rounds")
        self._over = {(rb, w): deque(maxlen=recent) for rb in (False, True)
                      for w in (False, True)}
        # end to end (class doc): drafting rounds' wall / price, plain stretches' wall per token
        self._e2e_draft: deque[float] = deque(maxlen=recent)
        # correct=False: the drafting rounds' (depth, seconds, cold) as timed,
        # priced only when reported (record_round)
        self._e2e_raw: deque[tuple] = deque(maxlen=recent)
        self._e2e_plain: deque[float] = deque(maxlen=recent)
        # every record bumps `version`; one that changes which estimates
        # exist or what they rest on (a first sample of a kind, a width
        # reaching 3 samples or leaving the window) bumps `epoch` too: a
        # policy re-prices at once on a new epoch, else at most every
        # REPRICE_EVERY rounds (AdaptivePolicy "Re-pricing")
        self.version = 0
        self.epoch = 0
        # cached estimates: "plain", "draft", "over", ("w", w), "line", "corr"
        self._est: dict = {}

    # -- samples -------------------------------------------------------------
    def record_plain(self, seconds: float) -> None:
        self._plain.append(float(seconds))
        self.plain_samples += 1
        self.version += 1
        if self.plain_samples == 1:
            self.epoch += 1
        self._est.pop("plain", None)
        self._est.pop("unc", None)
        self._est.pop("line", None)   # the priors are scaled by the plain step
        if self._raw:
            self._to_ratios()

    def _ref(self) -> float:
        """What a sample is divided by when it is recorded, and an estimate
        multiplied by when it is read: the plain step (class doc "Relative
        samples"), or 1 (seconds) while there is none or ``relative`` is off."""
        if self.relative and self._plain:
            return self.unit()
        return 1.0

    def _to_ratios(self) -> None:
        """The first plain step arrived: samples recorded in seconds before
        it become ratios to it."""
        u = self.unit()
        self._verify = deque((w, t / u) for w, t in self._verify)
        for w, xs in self._by_width.items():
            self._by_width[w] = deque(t / u for t in xs)
        self._draft = deque((t / u for t in self._draft), maxlen=self._draft.maxlen)
        for k, xs in self._over.items():
            self._over[k] = deque((t / u for t in xs), maxlen=xs.maxlen)
        self._raw = False
        for k in [k for k in self._est if k not in ("plain", "corr")]:
            del self._est[k]

    def record_verify(self, width: int, seconds: float) -> None:
        w, t = int(width), float(seconds) / self._ref()
        self._raw |= self.relative and not self._plain
        if len(self._verify) == self._window:
            ow, _ = self._verify.popleft()
            left = self._in_window[ow] - 1
            xs = self._by_width[ow]
            if len(xs) > left:     # the sample leaving the window is still in its deque
                xs.popleft()
            if left:
                self._in_window[ow] = left
            else:
                del self._in_window[ow], self._by_width[ow]
            if len(xs) == 2 or not left:
                self.epoch += 1    # width ow is no longer priced by its own samples
            self._est.pop(("w", ow), None)
        self._verify.append((w, t))
        self._in_window[w] = self._in_window.get(w, 0) + 1
        xs = self._by_width.setdefault(w, deque())
        xs.append(t)
        if len(xs) > self._recent:
            xs.popleft()
        self.version += 1
        if len(xs) in (1, 3):
            self.epoch += 1        # a new width, or one now priced by its own samples
        self._est.pop(("w", w), None)
        self._est.pop("unc", None)
        self._est.pop("line", None)   # refitted when next priced

    def record_draft(self, steps: int, seconds: float) -> None:
        if steps > 0:
            self._draft.append(float(seconds) / steps / self._ref())
            self._raw |= self.relative and not self._plain
            self._est.pop("draft", None)
            self.version += 1
            if len(self._draft) == 1:
                self.epoch += 1

    def record_overhead(self, seconds: float, rolled_back: bool = False,
                        warm: bool = True) -> None:
        """A drafting round's overhead; ``rolled_back``: its accept rolled
        the session back; ``warm``: the round before it drafted too (class
        doc "Rollback", "Warm rounds")."""
        xs = self._over[(rolled_back and self.split_rollback, warm or not self.split_warm)]
        xs.append(float(seconds) / self._ref())
        self._raw |= self.relative and not self._plain
        self.version += 1
        if len(xs) == 1:
            self.epoch += 1
        self._est.pop("over", None)
        self._est.pop("rb", None)

    def _over_of(self, rolled_back: bool) -> deque | None:
        """The overhead samples that price rounds of this kind: the warm
        ones, else the cold ones; None if neither."""
        for w in (True, False):
            xs = self._over[(rolled_back, w)]
            if xs:
                return xs
        return None

    def record_round(self, depth: int, seconds: float,
                     cold: tuple[int, float] | None = None) -> None:
        """A drafting round of ``depth`` took ``seconds`` from its start to
        the next round's start (class doc, "End-to-end correction"); its
        price is the parts' sum as they stand now (its own samples in).
        ``cold``: (tokens, seconds) of the cold plain step after it and the
        quiet steps after that, start to start: what they took beyond as
        many tokens of a plain stretch (:meth:`plain_wall`) is this round's."""
        if depth < 1 or seconds <= 0.0:
            return
        if not self.correct:
            # only reported (summary): priced there, not per round -- pricing
            # the parts here was ~7 us of Python per drafting round (warm),
            # a cost every round paid for a figure read once per request
            self._e2e_raw.append((depth, float(seconds), cold))
            return
        ratio = self._wall_over_price(depth, float(seconds), cold)
        if ratio is not None:
            self._e2e_draft.append(ratio)
            self._est.pop("corr", None)
            self.version += 1
            self.epoch += len(self._e2e_draft) == 3

    def _wall_over_price(self, depth: int, seconds: float,
                         cold: tuple[int, float] | None) -> float | None:
        """A drafting round's wall (with what its cold step took beyond a
        plain token's, record_round) over its parts' price now; None if the
        price is not positive."""
        priced = self.parts_cost(depth)
        if priced <= 0.0:
            return None
        if cold is not None and cold[0] >= 1:
            seconds += max(0.0, cold[1] - cold[0] * self.plain_wall())
        return seconds / priced

    def _round_wall_over_price(self) -> float | None:
        """The median drafting round's wall over its price: as recorded with
        the correction on; else the raw rounds priced now, with today's
        estimates (summary)."""
        if self.correct or not self._e2e_raw:
            return _median(self._e2e_draft) if self._e2e_draft else None
        out = [r for r in (self._wall_over_price(*x) for x in self._e2e_raw) if r is not None]
        return _median(out) if out else None

    def plain_wall(self) -> float:
        """A plain stretch's wall per token: the median of the timed ones
        once there are 3, else the plain step."""
        if len(self._e2e_plain) >= 3:
            return _median(self._e2e_plain)
        return self.plain()

    def record_plain_run(self, tokens: int, seconds: float) -> None:
        """A plain round and the quiet steps after it committed ``tokens``
        tokens in ``seconds``, from its start to the next round's start."""
        if tokens >= 1 and seconds > 0.0:
            self._e2e_plain.append(float(seconds) / tokens)
            self._est.pop("corr", None)
            self.version += 1

    # -- estimates -------------------------------------------------------------
    def _width(self, w: int) -> float:
        key = ("w", w)
        v = self._est.get(key)
        if v is None:
            v = self._est[key] = low_quartile(self._by_width[w])
        return v * self._ref()

    def unit(self) -> float:
        if self._plain:
            v = self._est.get("plain")
            if v is None:
                v = self._est["plain"] = low_quartile(self._plain)
            return v
        if self._by_width:   # no plain step yet: what the verifies imply under the prior ratios
            return sum(self._width(w) / (PRIOR_VERIFY_A + PRIOR_VERIFY_B * w)
                       for w in self._by_width) / len(self._by_width)
        return 1.0

    def verify_line(self) -> tuple[float, float]:
        """(a, b) of verify(w) = a + b*w."""
        line = self._est.get("line")
        if line is None:
            line = self._est["line"] = self._fit()
        return line

    def _fit(self) -> tuple[float, float]:
        u = self.unit()
        pts = [(w, self._width(w)) for w in self._by_width]
        if not pts:
            return PRIOR_VERIFY_A * u, PRIOR_VERIFY_B * u
        if len(pts) == 1 and pts[0][0] != 1 and self._plain:
            # one width measured: a plain step is this session's measured
            # width-1 pass, a better second point than the prior slope (ds4's
            # GPU ratio, which kept a CPU session that had measured only
            # width 3 from ever trying deeper)
            pts.append((1, u))
        n = len(pts)
        mw = sum(w for w, _ in pts) / n
        mt = sum(t for _, t in pts) / n
        if n == 1:
            b = PRIOR_VERIFY_B * u
            return max(0.0, mt - b * mw), b
        sxx = sum((w - mw) ** 2 for w, _ in pts)
        b = sum((w - mw) * (t - mt) for w, t in pts) / sxx
        a = mt - b * mw
        if b < 0:  # noise on a flat curve: a flat line through the mean
            return mt, 0.0
        if a < 0:  # a line through the origin instead
            return 0.0, sum(w * t for w, t in pts) / sum(w * w for w, _ in pts)
        return a, b

    def verify(self, width: int) -> float:
        a, b = self.verify_line()
        return a + b * width

    def width_samples(self, width: int) -> int:
        """How many samples of this width the window holds (kept ones)."""
        xs = self._by_width.get(width)
        return 0 if xs is None else len(xs)

    def verify_cost(self, width: int, min_samples: int = 3) -> float:
        """What a verify of ``width`` rows costs: this width's own estimate
        once it has ``min_samples``, else the line."""
        xs = self._by_width.get(width)
        if xs is not None and len(xs) >= min_samples:
            return self._width(width)
        return self.verify(width)

    def plain(self) -> float:
        return self.unit()

    def draft_step(self) -> float:
        if not self._draft:
            return PRIOR_DRAFT_H * self.unit()
        v = self._est.get("draft")
        if v is None:
            v = self._est["draft"] = low_quartile(self._draft)
        return v * self._ref()

    def overhead(self) -> float:
        """A drafting round's overhead when it keeps every row: the low
        quartile of those rounds' samples (of the rolled-back rounds' while
        there are none of the first kind)."""
        v = self._est.get("over")
        if v is None:
            xs = self._over_of(False) or self._over_of(True)
            v = self._est["over"] = low_quartile(xs) if xs else 0.0
        return v * self._ref()

    def rollback(self) -> float:
        """What a round that rolls back costs beyond :meth:`overhead` (class
        doc "Rollback"): the two kinds' low quartiles apart, never below 0;
        0 until both kinds have samples."""
        v = self._est.get("rb")
        if v is None:
            v = 0.0
            for w in (True, False):   # the two kinds as warm as both were measured
                kept, rolled = self._over[(False, w)], self._over[(True, w)]
                if kept and rolled:
                    v = max(0.0, low_quartile(rolled) - low_quartile(kept))
                    break
            self._est["rb"] = v
        return v * self._ref()

    def uncertainty(self) -> float:
        """Relative standard error of a drafting round's price in plain
        steps, from the scatter of the samples behind it: per estimate the
        interquartile range over the median over sqrt(n) (a quantile's
        standard error is ~1.2-1.6 sigma/sqrt(n), sigma ~ IQR/1.35), the
        plain step's and the verify widths' (their mean) combined in
        quadrature. 0 until each has 4 samples."""
        v = self._est.get("unc")
        if v is not None:
            return v

        def rel(xs) -> float | None:
            n = len(xs)
            if n < 4:
                return None
            srt = sorted(xs)
            med = srt[(n - 1) // 2]
            return (srt[(3 * (n - 1)) // 4] - srt[(n - 1) // 4]) / med / math.sqrt(n) \
                if med > 0 else None
        rp = rel(self._plain)
        rvs = [r for r in (rel(xs) for xs in self._by_width.values()) if r is not None]
        v = 0.0 if rp is None or not rvs else math.hypot(rp, sum(rvs) / len(rvs))
        self._est["unc"] = v
        return v

    def correction(self) -> float:
        """The factor on every drafting depth's price (class doc,
        "End-to-end correction"): 1.0 until 3 drafting rounds were timed end
        to end, then their median wall / price over the plain stretches'
        median wall per token / plain step (1.0 on that side until 3
        stretches were timed), clamped to [1, 2]."""
        v = self._est.get("corr")
        if v is None:
            v = 1.0
            if self.correct and len(self._e2e_draft) >= 3:
                f = _median(self._e2e_draft)
                plain = self.plain()
                f0 = (_median(self._e2e_plain) / plain
                      if len(self._e2e_plain) >= 3 and plain > 0 else 1.0)
                v = min(CORRECTION_MAX, max(1.0, f / f0)) if f0 > 0 else 1.0
            self._est["corr"] = v
        return v

    def round_costs(self, cap: int, corrected: bool = True) -> list[float]:
        """cost(d) for d = 0..cap: (verify_cost(d + 1) + d x draft_step +
        overhead) x correction() (``corrected=False``: the parts' sum alone),
        inlined (the policy prices every depth after every drafting
        round, right after a core call has left Python's caches cold: the
        call chain per width was half of choose()'s ~17 us warm)."""
        h, over = self.draft_step(), self.overhead()
        a, b = self.verify_line()
        by_width, width = self._by_width, self._width
        g = self.correction() if corrected else 1.0
        out = [self.plain()]
        for d in range(1, cap + 1):
            xs = by_width.get(d + 1)
            v = width(d + 1) if xs is not None and len(xs) >= 3 else a + b * (d + 1)
            out.append((v + d * h + over) * g)
        return out

    def parts_cost(self, depth: int) -> float:
        """A round of ``depth`` priced by its parts alone (no correction)."""
        return self.round_costs(depth, corrected=False)[depth]

    def round_cost(self, depth: int) -> float:
        return self.round_costs(depth)[depth]

    def summary(self) -> dict:
        a, b = self.verify_line()
        return {"plain_s": self.plain(), "verify_a_s": a, "verify_b_s": b,
                "verify_s_per_width": {w: self._width(w) for w in sorted(self._by_width)},
                "draft_step_s": self.draft_step(), "overhead_s": self.overhead(),
                "rollback_s": self.rollback(),
                "verify_samples": len(self._verify), "plain_samples": self.plain_samples,
                "correction": self.correction(),
                # its two sides (None until timed): drafting rounds' median wall / price,
                # plain stretches' median wall per token / plain step
                "round_wall_over_price": self._round_wall_over_price(),
                "plain_wall_over_step": (_median(self._e2e_plain) / self.plain()
                                         if self._e2e_plain and self.plain() > 0 else None),
                "timed_rounds": len(self._e2e_draft) + len(self._e2e_raw),
                "timed_plain_runs": len(self._e2e_plain)}


def _median(xs) -> float:
    v = sorted(xs)
    return v[(len(v) - 1) // 2]


def low_quartile(xs) -> float:
    """The lower quartile of the samples (the minimum up to 4 of them): the
    cost estimator of :class:`CostModel` (why: its doc)."""
    v = sorted(xs)
    return v[(len(v) - 1) // 4]


class AdaptivePolicy(Policy):
    """The cost-model policy with probes (module doc)."""

    enabled = True

    def __init__(self, max_depth: int = MAX_DEPTH, *, alpha: float = ALPHA,
                 probe_interval: int = PROBE_INTERVAL, probe_cap: int = PROBE_CAP,
                 cost: Callable[[int], float] | None = None, window: int = 64,
                 recalibrate: int = 32, costs: CostModel | None = None,
                 margin: float = MARGIN, acceptance: list[float] | None = None,
                 prior_weight: float | None = PRIOR_WEIGHT, burst: int = BURST,
                 burst_depth: int = BURST_DEPTH, calibrate: int = CALIBRATE,
                 steady_alpha: float = STEADY_ALPHA, explore: int = EXPLORE,
                 discount: float | None = DISCOUNT, follow_depth: int = FOLLOW_DEPTH,
                 follow_max: int = FOLLOW_MAX, explore_allow: float | None = EXPLORE_ALLOW,
                 explore_share: float = EXPLORE_SHARE, noise_z: float = NOISE_Z,
                 shadow: bool = SHADOW, reprice_every: int = REPRICE_EVERY):
        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 1:
            raise ValueError(f"max_depth must be an int >= 1, got {max_depth!r}")
        if probe_interval < 0 or (probe_interval and probe_cap < probe_interval):
            raise ValueError("need probe_interval >= 0 and probe_cap >= probe_interval")
        if prior_weight is not None and prior_weight < 0:
            raise ValueError("prior_weight must be >= 0 (or None: a plain EMA)")
        if burst < 0 or burst_depth < 1 or calibrate < 1:
            raise ValueError("need burst >= 0, burst_depth >= 1, calibrate >= 1")
        if discount is not None and not 0.0 < discount < 1.0:
            raise ValueError(f"discount must be in (0, 1) (or None: the EMA), got {discount!r}")
        if discount is not None and prior_weight == 0:
            raise ValueError("the discounted estimator needs prior_weight > 0")
        if follow_depth < 1 or follow_max < 0:
            raise ValueError("need follow_depth >= 1 and follow_max >= 0")
        if explore_allow is not None and (explore_allow < 0 or explore_share < 0):
            raise ValueError("need explore_allow >= 0 (or None: no budget) and explore_share >= 0")
        self.max_depth = max_depth
        self.alpha = alpha
        self.steady_alpha = steady_alpha
        # acceptance per depth: a caller may pass a list that outlives this
        # policy (it is updated in place); draft_plan no longer does: a
        # request relaxes toward where it started, and starting from the
        # previous request's text made prose after code draft at a loss
        # (ds4py/spec/plan.py)
        if acceptance is None:
            acceptance = [P_INIT * P_DECAY ** d for d in range(1, max_depth + 1)]
        elif len(acceptance) != max_depth:
            raise ValueError(f"acceptance must have {max_depth} entries, got {len(acceptance)}")
        self.p = acceptance
        # observations per position in this policy's life: the starting
        # estimate (the prior, or a caller's list) weighs `prior_weight`
        # observations, so each request learns
        # its own text's acceptance in its first rounds (requests differ: on
        # the bench, math after prose started from prose's 0.6 and, with the
        # shared estimate weighted as measured evidence, never drafted where
        # depth 2 measured 1.17x)
        self.n = [0] * max_depth
        self.prior_weight = prior_weight
        # the discounted estimator (module doc): where this request started,
        # and each position's evidence weight (observations, discounted)
        self.discount = discount if prior_weight is not None else None
        self.start = list(acceptance)
        self.weight = [0.0] * max_depth
        self.patience = 1.0      # rounds per discount step (PATIENCE_CAP)
        self._g1 = (0.0, 1.0)    # (patience, discount ** (1 / patience)): _age(1)'s factor
        self.probe_interval0 = probe_interval
        self.probe_cap = probe_cap
        self.interval = probe_interval
        self.follow_depth = follow_depth
        self.follow_max = follow_max
        self.follow_left = 0     # follow-up probes left in this chain
        self.chain_n = 0         # follow-ups made in this chain
        self._in_chain = False   # the probes since the last scheduled one were all accepted
        self._probing = False    # the last choose() was a probe or a follow-up
        self.n_follow = 0
        # the exploration budget: plain steps lost so far by forced rounds
        # (negative: they gained), and whether the last choose() forced one
        self.explore_allow = explore_allow
        self.explore_share = explore_share
        self.explore_loss = 0.0
        self._forced = False
        self.n_held = 0          # burst rounds and follow-ups the budget held back
        self.idle = 0            # consecutive evidence-free rounds
        self.burst_left = burst
        self.burst_depth = burst_depth
        # a caller may share one CostModel between policies (ds4py.spec.plan
        # keeps one per model: the costs belong to the model and the machine,
        # the acceptance to the text being generated)
        self.costs = CostModel(window=window) if costs is None else costs
        self._cost = cost
        self.recalibrate = recalibrate
        self.calibrate = calibrate
        if margin < 0 or noise_z < 0:
            raise ValueError("margin and noise_z must be >= 0")
        if isinstance(reprice_every, bool) or not isinstance(reprice_every, int) \
                or reprice_every < 1:
            raise ValueError(f"reprice_every must be an int >= 1, got {reprice_every!r}")
        self.reprice_every = reprice_every
        self.margin = margin
        self.noise_z = noise_z
        self.since_plain = 0     # drafting rounds since the last measured plain step
        self.last_was_probe = False
        self.needs_plain = False
        self.n_rounds = self.n_probes = self.n_chosen = self.n_calibration = 0
        self.n_burst = 0
        self.n_explore = 0
        self.explore = explore
        self.shadow = bool(shadow)
        # ((cap, drafting), model_depth(cap)) until new evidence or a new cost arrives:
        # a run of plain rounds would otherwise re-price every depth per token
        self._memo: tuple[int, int] | None = None
        self._memo_plain = 0.0   # the plain cost the memo was priced with
        self._memo_corr = 1.0    # ... and the end-to-end correction
        # _prices()'s cache: (costs, rollback, noise, the cost model's
        # version and epoch, n_rounds when priced)
        self._price: tuple | None = None
        self._drafting = False   # the cost model chose to draft last time (hysteresis)

    # -- cost model --------------------------------------------------------
    def round_cost(self, depth: int) -> float:
        return self._cost(depth) if self._cost is not None else self.costs.round_cost(depth)

    def acceptance(self) -> list[float]:
        """The acceptance the cost model prices with, per position: the
        estimate of each position this policy has observed; a position it
        has not observed yet is priced at least as well as the one before
        it times the prior decay (0.98) -- optimism under uncertainty: a
        session whose position 1 measured 0.95 tries depth 2 instead of
        pricing it at the prior 0.82 forever (a depth the policy never
        chooses is never observed)."""
        out, prev = [], 1.0
        for j, pj in enumerate(self.p):
            if j and not self.n[j]:
                pj = max(pj, prev * P_DECAY)
            out.append(pj)
            prev = pj
        return out

    def _prices(self, cap: int) -> tuple[list[float], float, float]:
        """(cost(0..cap), rollback, noise): the round costs, what a round
        that rolls back pays on top (CostModel "Rollback", corrected as the
        depths are) and the margin the costs' scatter asks for (NOISE_Z).
        From the cost model, re-priced at once when its epoch changed and
        else at most every ``reprice_every`` rounds (module doc "Re-pricing");
        from an injected cost function, every call (no rollback, no noise)."""
        if self._cost is not None:
            return [self._cost(d) for d in range(cap + 1)], 0.0, 0.0
        cm, pr = self.costs, self._price
        if pr is None or len(pr[0]) <= cap or (pr[3] != cm.version and (
                pr[4] != cm.epoch or self.n_rounds - pr[5] >= self.reprice_every)):
            cost = cm.round_costs(max(cap, self.max_depth))
            corr = cm.correction()
            pr = self._price = (cost, cm.rollback() * corr, self.noise_z * cm.uncertainty(),
                                cm.version, cm.epoch, self.n_rounds)
            self._memo_plain, self._memo_corr = cost[0], corr
        return pr[0], pr[1], pr[2]

    def model_depth(self, cap: int) -> int:
        """The cost model's own choice (no probe)."""
        cap = min(cap, self.max_depth)
        cost, rb, noise = self._prices(cap)
        p = self.acceptance()
        # drafting must beat plain decoding by `margin` to start: at
        # break-even it has nothing to gain and the estimates' noise to
        # lose; to go on drafting it must only beat it (hysteresis: on the
        # demo model depth 2 gains ~10% on code, and a 5% margin on every
        # round flipped the policy to depth 0 at each small dip of the
        # estimates, half of the rounds)
        margin = 0.5 * noise if self._drafting else max(self.margin, noise)
        best, best_rate = 0, (1.0 + margin) / cost[0]
        # a round that rejects a draft also pays the rollback (CostModel
        # "Rollback"): with probability 1 - reach, reach = P(all d accepted)
        expected, reach = 1.0, 1.0
        for d in range(1, cap + 1):
            reach *= p[d - 1]
            expected += reach
            rate = expected / (cost[d] + (1.0 - reach) * rb)
            if rate > best_rate:
                best, best_rate = d, rate
        return best

    def _could_pay(self, cap: int) -> bool:
        """Whether some depth would beat plain decoding (by the margin) if
        every draft were accepted: else no evidence about acceptance could
        change the choice, and a follow-up probe would only lose time (an
        accepted probe is not a profitable one, ds4-notes §4)."""
        cap = min(cap, self.max_depth)
        cost, _, noise = self._prices(cap)
        bar = (1.0 + max(self.margin, noise)) / cost[0]
        return any((d + 1) / cost[d] > bar for d in range(1, cap + 1))

    def _age(self, rounds: int) -> None:
        """``rounds`` rounds passed: every position's evidence loses weight
        by discount**rounds and its estimate relaxes toward where this request
        started (the discounted mean, module doc). A position never observed
        stays where it is."""
        if self.discount is None or rounds <= 0:
            return
        if rounds == 1:  # every choose(): the factor only changes with the patience
            if self._g1[0] != self.patience:
                self._g1 = (self.patience, self.discount ** (1.0 / self.patience))
            g = self._g1[1]
        else:
            g = self.discount ** (rounds / self.patience)
        w0 = self.prior_weight
        moved = 0.0
        for j, wj in enumerate(self.weight):
            if wj <= 0.0:
                continue
            start, old = self.start[j], self.p[j]
            # p = (S + w0*start) / (w + w0), S the discounted sum of the
            # observations: S - start*w decays with w
            s_ = (old - start) * (wj + w0)
            self.weight[j] = wj * g if wj * g > 1e-9 else 0.0
            self.p[j] = start + s_ * g / (self.weight[j] + w0)
            moved = max(moved, abs(self.p[j] - old))
        if moved > 1e-4:   # re-price (the memo keeps a depth-0 stretch O(1) per round)
            self._memo = None

    def _explore_ok(self) -> bool:
        """Whether the forced rounds so far left room for another optional
        one (module doc "Exploration budget")."""
        return (self.explore_allow is None or self.explore_loss
                <= self.explore_allow + self.explore_share * self.n_rounds)

    def _round_loss(self, depth: int, tokens: int) -> float:
        """Plain steps a round of ``depth`` that committed ``tokens`` cost
        beyond plain decoding of those tokens (negative: it gained)."""
        cs, rb, _ = self._prices(depth)
        c0, cd = cs[0], cs[depth]
        if tokens <= depth:   # a draft was rejected: the round rolled back
            cd += rb
        return cd / c0 - tokens if c0 > 0 else 0.0

    def choose(self, cap: int) -> int:
        if cap <= 0:
            return 0
        self._age(1)
        self.n_rounds += 1
        self.last_was_probe = self._probing = self._forced = False
        self.quiet = 0
        if self._cost is None and (self.costs.plain_samples < self.calibrate or
                                   self.since_plain >= self.recalibrate):
            # Calibration: the price of depth 0 is a measured plain step, never
            # an inference from verify times (which would carry ds4's GPU
            # ratios onto this machine). Costs nothing against plain decoding.
            # It ends when a plain step is recorded (record_plain resets
            # since_plain): the runner drops a step that follows a drafting
            # round, which runs ~4% slow (ds4py.spec.runner "Cold steps").
            self.n_calibration += 1
            self.needs_plain = True
            return 0
        self.needs_plain = False
        memo = self._memo
        key = (cap, self._drafting)
        if memo is not None and memo[0] == key:
            d = memo[1]
        else:
            d = self.model_depth(cap)
            if self._cost is None:  # an injected cost may change behind our back
                self._memo = (key, d)
        self._drafting = d > 0
        if self.burst_left and d < self.burst_depth and not self._explore_ok():
            # the exploration budget is spent: the burst ends here
            self.burst_left = 0
            self.n_held += 1
        if self.burst_left:
            # cold start: the first rounds draft at least burst_depth, so the
            # acceptance of this text is measured in its first few rounds
            # (depth-1 probes after 4, 8, 16.. idle rounds took ~30 rounds to
            # move the estimate off its prior). Evidence, not a probe of the
            # latch: the interval is left alone.
            self._forced = d < self.burst_depth
            self.burst_left -= 1
            self.n_burst += 1
            self.since_plain += 1
            self.last_was_probe = d < self.burst_depth
            return max(d, min(self.burst_depth, cap))
        if d > 0:
            # the cost model itself drafts: the only thing that resets the probe interval
            self.n_chosen += 1
            self.idle = 0
            self.interval = self.probe_interval0
            self.follow_left, self._in_chain = 0, False
            self.since_plain += 1
            if (self.explore and self._cost is None and d < min(cap, self.max_depth)
                    and self.n_chosen % self.explore == 0
                    and self.costs.width_samples(d + 2) < 3):
                # the next deeper width is priced by extrapolation only: one
                # round at d + 1 measures it (a line through the plain step
                # and width 2 over-priced width 3 by ~30% on the demo model
                # and kept a session at depth 1 where depth 2 paid more)
                self.n_explore += 1
                return d + 1
            return d
        if self.follow_left and not self._explore_ok():
            # the exploration budget is spent: the chain ends here
            self.follow_left, self._in_chain = 0, False
            self.n_held += 1
        if self.follow_left and self._could_pay(cap):
            # the last probe's drafts were all accepted: probe again at once
            # (module doc "Probes"; the interval is left alone)
            self._forced = True
            self.follow_left -= 1
            self.chain_n += 1
            self.n_probes += 1
            self.n_follow += 1
            self.idle = 0
            self.last_was_probe = self._probing = True
            self.since_plain += 1
            return min(self.chain_n, self.follow_depth, cap)
        if self.probe_interval0 and self.idle >= self.interval:
            # the probe rule: never held back by the budget, but its
            # loss counts against it
            self._forced = True
            self.n_probes += 1
            self.idle = 0
            self.interval = min(self.interval * 2, self.probe_cap)
            self.last_was_probe = self._probing = True
            self._in_chain = False   # a new chain starts if this one is accepted
            self.since_plain += 1
            return 1
        self.idle += 1
        self.since_plain = 0
        self.quiet = self.interval - self.idle if self.probe_interval0 else 1 << 30
        return 0

    def pass_quiet(self, n: int) -> None:
        if not 0 <= n <= self.quiet:
            raise ValueError(f"pass_quiet({n}): only {self.quiet} quiet rounds were promised")
        # exactly what n choose() calls answering 0 would have done
        self._age(n)
        self.n_rounds += n
        self.idle += n
        self.quiet -= n

    # -- evidence ------------------------------------------------------------
    def _update(self, j: int, x: float) -> None:
        if self.discount is not None:
            # the discounted mean: one more observation of full weight
            w = self.weight[j] + self.prior_weight
            self.p[j] += (x - self.p[j]) / (w + 1.0)
            self.weight[j] += 1.0
            self.n[j] += 1
            return
        # the EMA (discount=None): a probe's observation moves the estimate by alpha; one of a
        # drafting round by the smaller steady_alpha (module doc: memory in
        # rounds, not in observations)
        a = self.alpha if self.last_was_probe else self.steady_alpha
        if self.prior_weight is not None:
            # a running mean (the start weighing prior_weight observations)
            # until it is no faster than the EMA, then the EMA
            a = max(a, 1.0 / (self.prior_weight + self.n[j] + 1))
        self.p[j] += a * (x - self.p[j])
        self.n[j] += 1

    def observe(self, depth: int, accepted: int, stopped: bool = False) -> None:
        """Every drafting round is evidence (probe, burst or chosen): after a
        round of depth k with m drafts accepted, positions 1..m observe
        success, position m+1 (when m < k) failure, deeper ones nothing; a
        round that ended the generation observes no failure."""
        self._memo = None
        if self._forced:
            self._forced = False
            self.explore_loss += self._round_loss(depth, min(accepted, depth) + 1)
        depth = min(depth, self.max_depth)
        accepted = min(accepted, depth)
        for j in range(accepted):
            self._update(j, 1.0)
        if not stopped and accepted < depth:
            self._update(accepted, 0.0)
        if depth > 0:   # the discount's patience (PATIENCE_CAP)
            if accepted > 0:
                self.patience = 1.0
            elif not stopped:
                self.patience = min(2.0 * self.patience, PATIENCE_CAP)
        if self._probing:
            # a probe chain goes on while every draft is accepted (module doc)
            self._probing = False
            if accepted == depth > 0 and not stopped:
                if not self._in_chain:
                    self._in_chain, self.follow_left, self.chain_n = True, self.follow_max, 0
            else:
                self._in_chain, self.follow_left = False, 0

    def observe_shadow(self, accepted: bool, stopped: bool = False) -> None:
        """observe(1, accepted) for a probe run as a shadow, whose cost
        against the exploration budget is its draft step, not a depth-1
        round's (ds4py.spec.runner "Shadow probes")."""
        if self._forced:
            self._forced = False
            self.explore_loss += self.shadow_price()
        self.observe(1, int(accepted), stopped)

    def shadow_price(self) -> float:
        """What a shadow probe costs beyond its plain step, in plain steps:
        one draft step (the prior's with an injected cost function)."""
        if self._cost is not None:
            return PRIOR_DRAFT_H
        plain = self.costs.plain()
        return self.costs.draft_step() / plain if plain > 0 else PRIOR_DRAFT_H

    def record_plain(self, seconds: float) -> None:
        self.costs.record_plain(seconds)
        self.since_plain = 0
        # the runner times every plain step: re-price only when the price of
        # depth 0 moved by more than 1% (the rest of the choice is unchanged)
        if abs(self.costs.plain() - self._memo_plain) > 0.01 * self._memo_plain:
            self._memo = self._price = None

    def record_plain_many(self, samples) -> None:
        """Several plain-step times at once (the runner's fast path)."""
        for t in samples:
            self.costs.record_plain(t)
            self.since_plain = 0
        # the same 1% rule as record_plain: short stretches end often
        if abs(self.costs.plain() - self._memo_plain) > 0.01 * self._memo_plain:
            self._memo = self._price = None

    def record_verify(self, width: int, seconds: float) -> None:
        self._memo = None
        self.costs.record_verify(width, seconds)

    def record_draft(self, steps: int, seconds: float) -> None:
        self._memo = None
        self.costs.record_draft(steps, seconds)

    def record_overhead(self, seconds: float, rolled_back: bool = False,
                        warm: bool = True) -> None:
        self._memo = None
        self.costs.record_overhead(seconds, rolled_back, warm)

    def record_round(self, depth: int, seconds: float,
                     cold: tuple[int, float] | None = None) -> None:
        """A drafting round's wall from its start to the next round's start,
        and the cold step's after it (CostModel, "End-to-end correction")."""
        self._memo = None
        self.costs.record_round(depth, seconds, cold)

    def record_plain_run(self, tokens: int, seconds: float) -> None:
        """A plain round's and its quiet steps' wall, start to next start."""
        self.costs.record_plain_run(tokens, seconds)
        # re-price only when the correction moved by more than 1% (as record_plain)
        if abs(self.costs.correction() - self._memo_corr) > 0.01 * self._memo_corr:
            self._memo = self._price = None

    def summary(self) -> dict:
        out = {"policy": "adaptive", "p": [round(x, 4) for x in self.p],
               "observations": list(self.n),
               "rounds": self.n_rounds, "probes": self.n_probes, "burst_rounds": self.n_burst,
               "chosen_drafting_rounds": self.n_chosen, "probe_interval": self.interval,
               "explore_rounds": self.n_explore, "follow_up_probes": self.n_follow,
               "exploration_loss": round(self.explore_loss, 3), "held_by_budget": self.n_held,
               "calibration_rounds": self.n_calibration}
        if self._cost is None:
            out["costs"] = self.costs.summary()
        return out

    def __repr__(self) -> str:
        return f"AdaptivePolicy(max_depth={self.max_depth})"
