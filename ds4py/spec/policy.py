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

* Acceptance: a per-position EMA ``p[d]`` (d = 1..max_depth: the chance
  that draft d is accepted given drafts 1..d-1 were), initialised to
  ``0.85 * 0.98**d``, alpha 0.15. After a round of depth k with m drafts
  accepted, positions 1..m observe success, position m+1 (when m < k)
  observes failure, deeper positions observe nothing. A round that ended the
  generation (a stop/EOS token, or the budget) observes no failure, and its
  successes count only up to the stop token (stop tokens don't update the
  statistics).
* Cost, in seconds measured in this session (:class:`CostModel`):
  ``cost(0)`` = a plain one-token decode, ``cost(d)`` = verify(d+1) +
  d x draft_step + round overhead (the head's catch-up), with verify(w) the
  median of width w's recent verifies once there are 3, else a + b*w fitted
  online by least squares over the last ``window`` verifies.
  Until there is data the costs come from ds4's measured ratios (priors
  below), scaled by the measured plain step. That one is always measured:
  the first round of a policy whose costs hold no plain step is a plain
  decode (calibration), and so is one round after every ``recalibrate``
  (32) drafting rounds in a row -- a policy that keeps drafting would
  otherwise price depth 0 from one old sample forever (a stall measured
  once would keep it drafting at a loss). A calibration round costs
  nothing against plain decoding; it forgoes one round's drafting gain.
* Choice: the depth in 0..min(cap, max_depth) maximising expected tokens per
  second, E(d) / cost(d), with E(d) = 1 + sum_{j<=d} prod_{i<=j} p[i] (the
  target's own token always comes). Ties go to the shallower depth; depth 0
  is always a candidate, and a drafting depth must beat it by ``margin``
  (5%): at break-even drafting has nothing to gain and the estimates' noise
  to lose.
* Probes (ds4-notes §4 "Probe, fixing the EMA latch"; pitfall 7): a round of
  depth 0 carries no evidence, so a policy that has chosen 0 would never
  learn that drafting started to pay. After ``interval`` consecutive
  evidence-free rounds the next round that the cost model would give depth 0
  is a depth-1 probe. The interval starts at ``probe_interval`` (4) and
  doubles after every probe, accepted or not (cap ``probe_cap``, 256); it is
  reset only when the cost model itself chooses a depth > 0 (ds4 measured
  -26% when an *accepted* probe reset it: accepted is not profitable).
  ``probe_interval=0`` disables probes (ds4's old, latching behaviour).

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
P_INIT, P_DECAY, ALPHA = 0.85, 0.98, 0.15
MAX_DEPTH = 7
# The expected rate of a drafting depth must exceed plain decoding's by this
# fraction for the cost model to choose it (probes aside). The bar is
# "never below 0.95x serial"; a choice at break-even risks that for nothing.
MARGIN = 0.05
PROBE_INTERVAL, PROBE_CAP = 4, 256


class Policy:
    """The interface the loop drives (see the module doc). The base class
    records nothing and never drafts."""

    enabled = False
    last_was_probe = False   # the last choose() was a probe (stats)
    needs_plain = False      # the last choose() was 0 to measure a plain step: time it

    def choose(self, cap: int) -> int:
        return 0

    def observe(self, depth: int, accepted: int, stopped: bool = False) -> None:
        pass

    def record_plain(self, seconds: float) -> None:
        pass

    def record_verify(self, width: int, seconds: float) -> None:
        pass

    def record_draft(self, steps: int, seconds: float) -> None:
        pass

    def record_overhead(self, seconds: float) -> None:
        pass

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

    plain(): median of the last ``recent`` one-token decode times.
    draft_step(): median of the last seconds per chained draft step.
    overhead(): median of the last extra work of a drafting round (argmaxes,
    accept with the head's catch-up, bookkeeping). verify(w): a + b*w by
    least squares over the last ``window`` (width, seconds) samples once
    they span two widths; with one width, the prior slope (in plain units)
    through that width's mean; with none, the prior line. ``unit()``, the
    plain-decode time the priors are scaled by: measured, else inferred from
    the verifies, else 1.0.

    Robust to stalls: on a shared machine a wall-clock sample is now and
    then many times the true cost (the process was descheduled). Medians
    ignore such samples, and a verify sample is clipped to ``clip`` times
    the current line's prediction once the line rests on ``window // 4``
    samples. (An EMA of plain steps, the first design, let one stall make
    depth 0 look expensive; the policy then drafted at a loss until the next
    plain measurement.) Sums are kept incrementally: O(1) per verify sample,
    O(recent) per query (the policy asks only when something changed).
    """

    def __init__(self, window: int = 64, recent: int = 9, clip: float = 3.0):
        if window < 2:
            raise ValueError("window must be >= 2")
        if recent < 1:
            raise ValueError("recent must be >= 1")
        self._verify: deque[tuple[int, float]] = deque()
        self._window = window
        self._clip = clip
        self._plain: deque[float] = deque(maxlen=recent)
        self.plain_samples = 0
        self._draft: deque[float] = deque(maxlen=recent)
        self._over: deque[float] = deque(maxlen=recent)
        # running sums over the window: n, w, t, w*w, w*t, t / prior(w)
        self._s = [0, 0.0, 0.0, 0.0, 0.0, 0.0]
        self._widths: dict[int, int] = {}
        self._line: tuple[float, float] | None = None
        # recent samples per width: a width the session has measured is priced
        # by its own median, the line only extrapolates to unmeasured widths
        # (a least-squares line over two noisy widths, clamped to a >= 0,
        # over-priced the 2-row verify by ~25% on the demo model and kept the
        # policy at depth 0 where depth 1-2 measured 1.1-1.2x serial)
        self._recent = recent
        self._by_width: dict[int, deque] = {}

    @staticmethod
    def _median(xs: deque) -> float:
        v = sorted(xs)
        n = len(v)
        return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])

    def record_plain(self, seconds: float) -> None:
        self._plain.append(float(seconds))
        self.plain_samples += 1
        self._line = None

    def _add(self, w: int, t: float, sign: int) -> None:
        s = self._s
        s[0] += sign
        s[1] += sign * w
        s[2] += sign * t
        s[3] += sign * w * w
        s[4] += sign * w * t
        s[5] += sign * t / (PRIOR_VERIFY_A + PRIOR_VERIFY_B * w)
        c = self._widths.get(w, 0) + sign
        if c:
            self._widths[w] = c
        else:
            del self._widths[w]

    def record_verify(self, width: int, seconds: float) -> None:
        w, t = int(width), float(seconds)
        if self._s[0] >= max(2, self._window // 4) and len(self._widths) > 1:
            t = min(t, self._clip * self.verify(w))  # a stall, not the cost
        if len(self._verify) == self._window:
            self._add(*self._verify.popleft(), -1)
        self._verify.append((w, t))
        self._add(w, t, 1)
        self._by_width.setdefault(w, deque(maxlen=self._recent)).append(t)
        self._line = None

    def record_draft(self, steps: int, seconds: float) -> None:
        if steps > 0:
            self._draft.append(float(seconds) / steps)

    def record_overhead(self, seconds: float) -> None:
        self._over.append(float(seconds))

    def unit(self) -> float:
        if self._plain:
            return self._median(self._plain)
        if self._s[0]:
            return self._s[5] / self._s[0]
        return 1.0

    def verify_line(self) -> tuple[float, float]:
        """(a, b) of verify(w) = a + b*w."""
        if self._line is None:
            self._line = self._fit()
        return self._line

    def _fit(self) -> tuple[float, float]:
        u = self.unit()
        n, sw, st, sww, swt, _ = self._s
        if n == 0:
            return PRIOR_VERIFY_A * u, PRIOR_VERIFY_B * u
        mw, mt = sw / n, st / n
        if len(self._widths) == 1:
            b = PRIOR_VERIFY_B * u
            return max(0.0, mt - b * mw), b
        b = (swt - sw * mt) / (sww - sw * mw)
        a = mt - b * mw
        if b < 0:  # noise on a flat curve: a flat line through the mean
            return mt, 0.0
        if a < 0:  # a line through the origin instead
            return 0.0, swt / sww
        return a, b

    def verify(self, width: int) -> float:
        a, b = self.verify_line()
        return a + b * width

    def verify_cost(self, width: int, min_samples: int = 3) -> float:
        """What a verify of ``width`` rows costs: the median of this width's
        recent samples once there are ``min_samples``, else the line."""
        xs = self._by_width.get(width)
        if xs is not None and len(xs) >= min_samples:
            return self._median(xs)
        return self.verify(width)

    def plain(self) -> float:
        return self.unit()

    def draft_step(self) -> float:
        return self._median(self._draft) if self._draft else PRIOR_DRAFT_H * self.unit()

    def overhead(self) -> float:
        return self._median(self._over) if self._over else 0.0

    def round_costs(self, cap: int) -> list[float]:
        """cost(d) for d = 0..cap."""
        h, over = self.draft_step(), self.overhead()
        return [self.plain()] + [self.verify_cost(d + 1) + d * h + over
                                 for d in range(1, cap + 1)]

    def round_cost(self, depth: int) -> float:
        return self.round_costs(depth)[depth]

    def summary(self) -> dict:
        a, b = self.verify_line()
        return {"plain_s": self.plain(), "verify_a_s": a, "verify_b_s": b,
                "draft_step_s": self.draft_step(), "overhead_s": self.overhead(),
                "verify_samples": self._s[0]}


class AdaptivePolicy(Policy):
    """The cost-model policy with probes (module doc)."""

    enabled = True

    def __init__(self, max_depth: int = MAX_DEPTH, *, alpha: float = ALPHA,
                 probe_interval: int = PROBE_INTERVAL, probe_cap: int = PROBE_CAP,
                 cost: Callable[[int], float] | None = None, window: int = 64,
                 recalibrate: int = 32, costs: CostModel | None = None,
                 margin: float = MARGIN, acceptance: list[float] | None = None):
        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 1:
            raise ValueError(f"max_depth must be an int >= 1, got {max_depth!r}")
        if probe_interval < 0 or (probe_interval and probe_cap < probe_interval):
            raise ValueError("need probe_interval >= 0 and probe_cap >= probe_interval")
        self.max_depth = max_depth
        self.alpha = alpha
        # acceptance per depth: a caller may pass a list that outlives this
        # policy (draft_plan shares one per model and drafter, so a request
        # starts from what earlier requests measured instead of the prior --
        # with rare probes the EMA otherwise stays near its prior for
        # hundreds of rounds); it is updated in place
        if acceptance is None:
            acceptance = [P_INIT * P_DECAY ** d for d in range(1, max_depth + 1)]
        elif len(acceptance) != max_depth:
            raise ValueError(f"acceptance must have {max_depth} entries, got {len(acceptance)}")
        self.p = acceptance
        self.probe_interval0 = probe_interval
        self.probe_cap = probe_cap
        self.interval = probe_interval
        self.idle = 0            # consecutive evidence-free rounds
        # a caller may share one CostModel between policies (ds4py.spec.plan
        # keeps one per model: the costs belong to the model and the machine,
        # the acceptance to the text being generated)
        self.costs = CostModel(window=window) if costs is None else costs
        self._cost = cost
        self.recalibrate = recalibrate
        if margin < 0:
            raise ValueError("margin must be >= 0")
        self.margin = margin
        self.since_plain = 0     # drafting rounds since the last measured plain step
        self.last_was_probe = False
        self.needs_plain = False
        self.n_rounds = self.n_probes = self.n_chosen = self.n_calibration = 0
        # (cap, model_depth(cap)) until new evidence or a new cost arrives:
        # a run of plain rounds would otherwise re-price every depth per token
        self._memo: tuple[int, int] | None = None

    # -- cost model --------------------------------------------------------
    def round_cost(self, depth: int) -> float:
        return self._cost(depth) if self._cost is not None else self.costs.round_cost(depth)

    def model_depth(self, cap: int) -> int:
        """The cost model's own choice (no probe)."""
        cap = min(cap, self.max_depth)
        if self._cost is not None:
            cost = [self._cost(d) for d in range(cap + 1)]
        else:
            cost = self.costs.round_costs(cap)
        # drafting must beat plain decoding by `margin`: at break-even it has
        # nothing to gain and the estimates' noise to lose
        best, best_rate = 0, (1.0 + self.margin) / cost[0]
        expected, reach = 1.0, 1.0
        for d in range(1, cap + 1):
            reach *= self.p[d - 1]
            expected += reach
            rate = expected / cost[d]
            if rate > best_rate:
                best, best_rate = d, rate
        return best

    def choose(self, cap: int) -> int:
        if cap <= 0:
            return 0
        self.n_rounds += 1
        self.last_was_probe = False
        if self._cost is None and (self.costs.plain_samples == 0 or
                                   self.since_plain >= self.recalibrate):
            # Calibration: the price of depth 0 is a measured plain step, never
            # an inference from verify times (which would carry ds4's GPU
            # ratios onto this machine). Costs nothing against plain decoding.
            self.n_calibration += 1
            self.since_plain = 0
            self.needs_plain = True
            return 0
        self.needs_plain = False
        memo = self._memo
        if memo is not None and memo[0] == cap:
            d = memo[1]
        else:
            d = self.model_depth(cap)
            if self._cost is None:  # an injected cost may change behind our back
                self._memo = (cap, d)
        if d > 0:
            # the cost model itself drafts: the only thing that resets the probe interval
            self.n_chosen += 1
            self.idle = 0
            self.interval = self.probe_interval0
            self.since_plain += 1
            return d
        if self.probe_interval0 and self.idle >= self.interval:
            self.n_probes += 1
            self.idle = 0
            self.interval = min(self.interval * 2, self.probe_cap)
            self.last_was_probe = True
            self.since_plain += 1
            return 1
        self.idle += 1
        self.since_plain = 0
        return 0

    # -- evidence ------------------------------------------------------------
    def observe(self, depth: int, accepted: int, stopped: bool = False) -> None:
        self._memo = None
        depth = min(depth, self.max_depth)
        accepted = min(accepted, depth)
        a = self.alpha
        for j in range(accepted):
            self.p[j] += a * (1.0 - self.p[j])
        if not stopped and accepted < depth:
            self.p[accepted] -= a * self.p[accepted]

    def record_plain(self, seconds: float) -> None:
        self._memo = None
        self.costs.record_plain(seconds)

    def record_verify(self, width: int, seconds: float) -> None:
        self._memo = None
        self.costs.record_verify(width, seconds)

    def record_draft(self, steps: int, seconds: float) -> None:
        self._memo = None
        self.costs.record_draft(steps, seconds)

    def record_overhead(self, seconds: float) -> None:
        self._memo = None
        self.costs.record_overhead(seconds)

    def summary(self) -> dict:
        out = {"policy": "adaptive", "p": [round(x, 4) for x in self.p],
               "rounds": self.n_rounds, "probes": self.n_probes,
               "chosen_drafting_rounds": self.n_chosen, "probe_interval": self.interval,
               "calibration_rounds": self.n_calibration}
        if self._cost is None:
            out["costs"] = self.costs.summary()
        return out

    def __repr__(self) -> str:
        return f"AdaptivePolicy(max_depth={self.max_depth})"
