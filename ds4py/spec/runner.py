"""One speculative decoding run on a session, driven token by token from outside.

    run = SpecRunner(model, session, policy, drafter, pick)
    refused = run.admit()                 # None: this run drafts
    logits, _ = run.prefill(ids)          # the core primes the head meanwhile
    first = pick(logits, session.n_past)
    block = run.round(first, room)        # [(token, logits row), ...] in order
    ...                                   # the caller commits tokens until it stops
    run.settle(j, stopped)                # j: index in block of the last one committed
    run.finish()

Both ``ds4py.spec.speculative_generate`` and ``ds4py.generate`` drive this
object, so the exactness argument lives in one place:

* ``pick(row, position)`` is the caller's sampler: the token that goes at
  ``position`` given the target's logits ``row`` of position-1 (greedy argmax,
  or a seeded sampler; it may keep state such as a penalty window, because
  it is called exactly once per committed token, in order).
* a round of depth 0 evaluates ``last`` and picks once: the serial decode
  step itself (:class:`ds4py.spec.stepper.Stepper`, the plain loop's step),
  so a round that does not draft costs what a serial step costs;
* a round of depth k > 0 drafts k tokens, verifies ``[last, d1..dk]`` in one
  batched pass (bit-identical to k+1 one-token evals, DESIGN.md invariant 1),
  then picks row 0, 1, ... in order and stops at the first row whose pick
  differs from the draft after it: the picks are exactly the tokens a
  serial decode picks, from exactly the same rows, in the same order. Rows
  after the first mismatch are never picked (a stateful sampler never sees
  them). Greedy with the nextn head, the drafts and the rows' argmaxes come
  from the core in two calls (csrc/spec_round.c).
* ``settle(j)``: the caller committed block[0..j] (it stops early at EOS, a
  stop string or the budget); ``session.accept(j + 1)`` keeps ``last`` and
  block[0..j-1] -- what a serial decode has evaluated -- and, with head
  priming on, gives the head those rows in the same call.

Sampled rounds (temperature > 0), ``sampling=``:

* ``"exact"`` (the default): the round above with the caller's seeded
  ``pick`` -- a drafted token is kept exactly when it equals the target's
  own sample there, so the output is byte-identical to the same seed
  without drafting (for a drafter proposing its argmax, the acceptance is
  standard speculative sampling's);
* ``"rejection"`` (``--spec-sampling rejection``): stochastic drafting. The
  drafter samples its drafts from its own distribution q under the target's
  sampling transform (``Drafter.propose_dist``; the nextn head), and the
  round applies standard speculative sampling (accept with min(1, p/q),
  else a draw from the normalised residual; ds4py.spec.rejection) with
  uniforms keyed by (seed, position). Each token is distributed as the
  target's sample, but the tokens are not those of an undrafted run. A
  drafter that cannot sample is refused at admission (no drafting).

A drafter with ``max_depth`` (DFlash: B-1 drafts per pass) caps the depth
the policy may choose.

Admission (one decision for prefill and decode): drafting happens only if
the policy can draft, there is a drafter and it accepts the session
(``Drafter.attach``, which for the nextn head turns on the session's head
priming: from then on the core keeps the head's KV in step with every row
the trunk commits, prefill included). A refused run never drafts.

Costs reach the policy as wall times from ``clock``, measured the same way
for every depth: from the start of the round's core work to the end of its
Python bookkeeping, excluding only what the caller does per committed token
(the same whether or not the token came from a draft). A drafting round's
overhead also carries its ``choose`` call (~15 us warm, 30-60 us right after
an eval leaves the caches cold): a quiet plain round makes no choice, so
without it drafting was priced ~5% of a plain step too cheap and drafted at
a loss where it breaks even (prose on the demo model: 0.93x serial before,
0.96-0.98x after, A/B interleaved on a loaded machine). Every depth-0 round
of an admitted run is timed (two clock reads): on a shared machine many
samples are scheduler stalls, and the cost model's low quantile needs a
steady supply of clean ones (the policy re-prices only when the plain cost
moves). Statistics accumulate in ``stats()``.

Cold steps: the first plain step after a drafting round runs ~4% slower
than one after a plain step (the demo model on a 2-thread AVX2 VM, 300
pairs: lower quartiles 2067 vs 1980 us -- the verify and the rollback left
other data in the caches). Recorded, such steps made the plain cost look
dearer, so drafting cheaper, the more the policy drafted (its plain samples
then come mostly from such steps: recalibration follows 32 drafting rounds).
The runner times them but does not record them; the policy's calibration
goes on until a step is recorded (the next one).

Warm rounds: every drafting round's overhead goes to the policy with two
flags (``record_overhead(seconds, rolled_back, warm)``): whether its accept
rolled the session back (a draft rejected, or the caller stopped inside the
block: ``j < k``) and whether the round before it drafted too. A round
after a plain one runs its Python with cold caches and an accept that
rolls back replays the GDN state; the cost model prices the two apart
(ds4py.spec.policy.CostModel "Rollback", "Warm rounds"). The first drafting
round of a run records no costs at all: its verify allocates the session's
rollback state and touches it for the first time (demo model, 2 threads,
Zen 5 VM, 2026-12-07: the first depth-2 verify of a request took 1.66-1.67
ms against 0.76-1.03 for the ones after it), a cost once per session that
priced width 3 ~2x where a request drafted only its cold-start burst.

Quiet stretches: when the policy answers 0 and promises ``quiet`` >= 1
more depth-0 rounds (the rounds until its next probe), the next min(quiet,
QUIET_MAX) rounds take a fast path -- the serial step, its time kept,
nothing else -- and the policy hears of them at once at the end
(``pass_quiet``, ``record_plain_many``): a round through ``choose`` and
``record_plain`` measured 60-65 us on the demo model (a cold cache after
each eval makes Python slow), 5% of a one-thread plain step and ~8% of a
two-thread one, and the short stretches between probes (3, 7, 15 rounds)
are most of the plain rounds where drafting is near break-even (prose).
ds4py.generate's decode loop goes one step further: it takes the stretch
over (:meth:`SpecRunner.take_quiet`) and runs those steps in its own loop,
exactly as its serial loop does, since a trip through ``round``/``settle``
and a fresh one-token block per token still cost ~2.5% of a demo-model step.
The nextn head's rows of plain steps cost nothing per step either: the core
defers them and catches the head up in batches of 64, or before the next
draft reads it (csrc/session.c "Deferred rows").

End to end: the parts above leave out what a round costs between its
timers (the caller's work per token among it), so the runner also times
every round from its start to the next round's start and hands the policy
a drafting round's wall (``record_round``) and a plain round's together
with its quiet steps (``record_plain_run``: wall and tokens); a cost model
made with ``correct=True`` corrects the drafting depths' prices by the ratio
of the two (ds4py.spec.policy.CostModel, "End-to-end correction"; off by
default since 2026-12-07, the samples reported either way). A cold step (and the quiet steps
after it) goes with the drafting round before it (``record_round(...,
cold=(tokens, seconds))``: what it took beyond plain tokens is that round's
cost). Not timed so: a shadow probe, a round that ended the generation (no
next start).

Shadow probes: a depth-1 probe (the policy's scheduled probe, a depth-1
follow-up; ``policy.shadow``) with the nextn head in the core (greedy) is
run as a shadow: the head drafts the next token (ds4_spec_propose, one
draft step), then the serial step runs as in a plain round, and settle()
tells the policy whether the draft equals the token picked -- exactly the
evidence a depth-1 drafting round gives (accepted iff the draft is the
target's own choice there), for one draft step instead of a 2-row verify,
its rollback and the cold step after it. The draft wrote the head's row at
the step's position; the committed row overwrites it (ds4.h "Head
priming"), and the output is the serial step's. On the demo model on an
AVX2 VM (2026-11-30, after the Q8_0 tile kernels made a plain step ~1.3x
faster) a depth-1 round took ~2.1 plain steps of wall time (code, 505
rounds) and a draft step ~0.17 of one.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import numpy as np

from .._core import ffi, lib, new_error
from ..errors import ModelError
from ..session import VERIFY_MAX
from .drafter import Drafter, DraftError, DraftState, NextnDrafter
from .policy import Policy
from .rejection import SALT_ACCEPT, SALT_DRAFT, SALT_RESIDUAL, dense, keyed, rejection_step
from .stepper import Stepper

__all__ = ["SpecRunner", "argmax_pick"]

# the fast path takes a promised plain stretch of at least this many rounds
# (module doc "Quiet stretches"; 8 before 2026-11-29: the A/B knob)
QUIET_MIN = 1
# a fast-path stretch ends after this many rounds at most, so the policy
# re-prices at least this often (plain-cost changes reach it)
QUIET_MAX = 64
# how a sampled (temperature > 0) round decides (module doc)
SAMPLING_MODES = ("exact", "rejection")


def argmax_pick(row: np.ndarray, position: int) -> int:
    """Greedy: the first maximum (ties to the lowest id)."""
    return int(row.argmax())


class SpecRunner:
    """See the module doc."""

    def __init__(self, model, session, policy: Policy, drafter: Drafter | None,
                 pick: Callable[[np.ndarray, int], int] = argmax_pick, *,
                 clock: Callable[[], float] = time.perf_counter,
                 greedy: bool | None = None, sampler=None, sampling: str = "exact"):
        if sampling not in SAMPLING_MODES:
            raise ValueError(f"sampling must be one of {SAMPLING_MODES}, got {sampling!r}")
        self.model, self.s, self.policy, self.drafter = model, session, policy, drafter
        self.pick = pick
        self._vocab = model.config.vocab_size
        # greedy picks of a whole verify at once (argmax of every row) equal
        # the row-by-row picks; only the plain argmax may take that shortcut
        self.greedy = (pick is argmax_pick) if greedy is None else greedy
        self.clock = clock
        # rejection sampling needs the sampler's distributions; greedy needs
        # none (a one-hot p accepts exactly the target's argmax: the exact path)
        self.sampler = sampler
        self.rejection = (sampling == "rejection" and sampler is not None
                          and not sampler.params.greedy)
        self.admitted = False
        self.refused: str | None = "not admitted yet"
        self.generated: list[int] = []
        self._pending: tuple | None = None
        # a session that must see every eval (ds4py.dflash.TapSession) brings its own stepper
        self._step = getattr(session, "stepper", None) or Stepper(session, model.config.vocab_size)
        # a drafter whose one pass makes at most max_depth drafts (DFlash: B-1)
        self._max_depth = int(getattr(drafter, "max_depth", None) or VERIFY_MAX - 1)
        self._quiet_left = 0                 # fast-path rounds left in this stretch
        self._quiet_t: list[float] = []      # their step times, for the policy
        self._cold = False                   # the last round drafted (module doc "Cold steps")
        # the round before this one was a drafting round (module doc "Warm
        # rounds"): this round's overhead is a warm sample
        self._after_draft = False
        # no drafting round has settled in this run yet: the first one's
        # costs are not samples (module doc "Warm rounds")
        self._first_round = True
        self._shadow: tuple[int, int] | None = None  # (draft, picked) of a shadow probe
        # the caller's one-token step that returns only its token (a GPU
        # session's step_argmax: 4 bytes back instead of the logits row), for
        # the plain steps of greedy runs whose caller needs no rows (no
        # logprobs); ds4py.generate sets it. Such a step's row is None.
        self.plain_argmax: Callable[[int], int] | None = None
        # (start, depth) of the last round timed end to end (module doc "End to
        # end"; depth -1: a cold step), and a drafting round's (depth, wall)
        # held until the next round says whether a cold step follows it
        self._span: tuple[float, int] | None = None
        self._held: tuple[int, float] | None = None
        self._spans = hasattr(policy, "record_round")
        # the core's greedy round: drafts and row argmaxes in two calls
        # (a CPU session's: a GPU session drafts through NextnDrafter.propose)
        self._core = (self.greedy and isinstance(drafter, NextnDrafter) and drafter._in_core
                      and not hasattr(session, "nextn_propose"))
        # a drafter reading the nextn head of this session (its rows are deferred)
        self._head = isinstance(drafter, NextnDrafter) and hasattr(session, "nextn_catch_up")
        self._buf = ffi.new(f"int32_t[{VERIFY_MAX}]")
        self._arg = ffi.new(f"int32_t[{VERIFY_MAX}]")
        self._err = new_error()
        # statistics
        self.rounds = self.probes = self.drafted = self.accepted = 0
        self.shadows = 0                        # probes run as shadows
        self.depth_counts: Counter = Counter()
        self.accept_counts: Counter = Counter()
        self.pos_tried: Counter = Counter()     # draft position d (1-based): rounds reaching it
        self.pos_ok: Counter = Counter()        # ... and accepted there
        self.verify_s: dict[int, list[float]] = {}
        self.round_tokens = 0                   # tokens committed by drafting rounds

    # -- admission and prefill ---------------------------------------------
    def admit(self) -> str | None:
        """Decide once whether this run drafts (before the prompt is
        evaluated, or right after a prefix-cache restore); returns the
        refusal or None."""
        if not self.policy.enabled:
            refused = "the policy never drafts"
        elif self.drafter is None:
            refused = "no drafter (the model has no nextn head)"
        elif self.rejection and not getattr(self.drafter, "can_sample", False):
            refused = (f"the {self.drafter.name} drafter cannot sample its drafts "
                       "(rejection sampling needs the drafter's distribution)")
        else:
            refused = self.drafter.attach(self.s)
        self.refused, self.admitted = refused, refused is None
        return refused

    def prefill(self, ids: list[int], all_logits: bool = False):
        """Evaluate ``ids`` after ``session.n_past`` in one call (a priming
        session primes the head chunk by chunk inside it); returns the last
        logits row (a view) and, with ``all_logits``, a copy of every row."""
        if all_logits:
            rows = self.s.eval(ids, all_logits=True)
            return rows[-1], np.array(rows)
        return self.s.eval(ids), None

    # -- rounds ----------------------------------------------------------------
    def round(self, last: int, room: int) -> list[tuple[int, np.ndarray]]:
        """One round after the committed, not yet evaluated token ``last``.
        ``room``: how many more tokens the caller may still commit after
        ``last`` (the deepest useful round is room - 1 drafts). Returns
        [(token, logits row it was picked from)], the rows being views valid
        until the next call on the session (None for a plain round's token
        chosen through :attr:`plain_argmax`). Follow with :meth:`settle`."""
        if self._quiet_left:
            # the fast path of a quiet stretch (module doc): the serial step,
            # its time kept, the policy told at the end of the stretch
            self._quiet_left -= 1
            self.generated.append(last)
            clock = self.clock
            t0 = clock()
            t, lg = self._plain_step(last)
            self._quiet_t.append(clock() - t0)
            return [(t, lg)]
        s, policy = self.s, self.policy
        start = 0.0
        if self._spans:
            start = self.clock()
            if self._span is not None:
                self._end_span(start)
        if self._quiet_t:
            self._end_quiet()
        self.generated.append(last)
        self.rounds += 1
        warm, self._after_draft = self._after_draft, False
        cap = min(room - 1, VERIFY_MAX - 1, self._max_depth) if self.admitted else 0
        t_choose = self.clock()
        k = min(policy.choose(cap), cap) if cap > 0 else 0
        self._pending = None
        if k == 1 and self._core and policy.last_was_probe and policy.shadow:
            self._release_held()
            return self._shadow_round(last)
        self.depth_counts[k] += 1
        if k == 0:
            # the serial step, timed when the policy learns (module doc)
            if self.admitted:
                if policy.quiet >= QUIET_MIN:
                    # a promised plain stretch: the fast path from the next round on
                    self._quiet_left = min(policy.quiet, QUIET_MAX)
                clock = self.clock
                t0 = clock()
                t, lg = self._plain_step(last)
                if self._cold:
                    self._cold = False
                    if self._spans:
                        self._span = (start, -1)
                else:
                    policy.record_plain(clock() - t0)
                    if self._spans:
                        self._span = (start, 0)
            else:
                t, lg = self._plain_step(last)
            return [(t, lg)]
        self.probes += bool(policy.last_was_probe)
        if self._spans:
            self._release_held()
            self._span = (start, k)
        P = s.n_past
        # the choice is part of what a drafting round costs: a quiet plain
        # round never makes one (module doc "Quiet stretches"), so leaving it
        # out priced drafting ~40 us (~5% of a plain step) too cheap
        t_choose = self.clock() - t_choose
        if self._head:
            # the head's rows of the plain steps before this round: priming
            # (paid whatever the depth), not this round's cost -- inside the
            # draft it added up to ~0.5 ms to the first draft after a plain
            # stretch, and a policy probing between stretches priced a draft
            # step 10-25% too high (bench-spec's measured draft step: 0.15-0.18
            # ms on prose against 0.14-0.15 with this)
            lib.ds4_session_nextn_catch_up(s._live())
        t0 = self.clock()
        if self.rejection:
            out, m, drafts, t1, t2 = self._rejection_round(last, k, P)
        elif self._core:
            drafts = self._core_round(last, k)
            t1 = self._t1
            t2 = self.clock()
            rows = s._view(lib.ds4_session_logits, s.vocab_size)
            g = self._arg
            m = 0
            while m < k and drafts[m] == g[m]:
                m += 1
            out = [(drafts[i], rows[i]) for i in range(m)] + [(int(g[m]), rows[m])]
        else:
            d = self.drafter
            hid = s.last_hidden() if d.needs_hidden else None
            drafts = [int(x) for x in d.propose(DraftState(s, P, last, hid, self.generated), k)]
            if len(drafts) != k:
                raise DraftError(f"{d.name}: asked for {k} drafts, got {len(drafts)}")
            t1 = self.clock()
            rows = s.verify([last, *drafts])
            t2 = self.clock()
            out = []
            if self.greedy:
                g = rows.argmax(axis=1)  # first maximum: ties to the lowest id
                m = 0
                while m < k and drafts[m] == int(g[m]):
                    m += 1
                out = [(drafts[i], rows[i]) for i in range(m)] + [(int(g[m]), rows[m])]
            else:
                m = 0
                while True:
                    t = self.pick(rows[m], P + m + 1)
                    out.append((t, rows[m]))
                    if m == k or t != drafts[m]:
                        break
                    m += 1
        self._pending = (k, m, drafts, t0, t1, t2, self.clock(), t_choose, warm)
        return out

    def _dist(self, row: np.ndarray) -> np.ndarray:
        """The sampler's distribution for a logits row, over the vocabulary."""
        ids, probs = self.sampler.distribution(row)
        return dense(ids, probs, self._vocab)

    def _rejection_round(self, last: int, k: int, P: int):
        """Stochastic drafting: drafts sampled from the drafter's q (the
        target's sampling transform on the drafter's logits), then standard
        speculative sampling (ds4py.spec.rejection): draft i is accepted with
        min(1, p/q), the first rejected one is replaced by a draw from the
        normalised residual max(0, p - q), and when every draft is accepted
        the target draws its own next token. Each committed token is then
        distributed as the target's sample there (not the same token as an
        undrafted run with the same seed: that is the exact mode)."""
        s, smp, seed = self.s, self.sampler, self.sampler.seed
        hid = s.last_hidden()
        us = [keyed(seed, SALT_DRAFT, P + 1 + j) for j in range(k)]
        drafts, qs = self.drafter.propose_dist(
            DraftState(s, P, last, hid, self.generated), k, self._dist, us)
        if len(drafts) != k or len(qs) != k:
            raise DraftError(f"{self.drafter.name}: asked for {k} drafts, got {len(drafts)}")
        t1 = self.clock()
        rows = s.verify([last, *drafts])
        t2 = self.clock()
        out = []
        penalties = smp.params.penalties_on
        for i in range(k):
            pos = P + 1 + i
            ok, t = rejection_step(self._dist(rows[i]), qs[i], drafts[i],
                                   keyed(seed, SALT_ACCEPT, pos), keyed(seed, SALT_RESIDUAL, pos))
            if penalties:
                smp.accept(t)   # the next row's distribution sees it, as a serial pick would
            out.append((t, rows[i]))
            if not ok:
                return out, i, drafts, t1, t2
        # every draft accepted: the target's own draw after them (pick accepts it)
        out.append((self.pick(rows[k], P + k + 1), rows[k]))
        return out, k, drafts, t1, t2

    def _propose(self, last: int, k: int, out) -> None:
        """k chained greedy drafts of the head after ``last`` into out[0..k)."""
        err = self._err
        st = lib.ds4_spec_propose(self.model._live(), self.s._live(), last, k, out, err)
        if st:
            msg = ffi.string(err.message).decode("utf-8", "replace")
            raise DraftError(msg) if st == lib.DS4_ERR_ARG else ModelError(msg, int(st))

    def _core_round(self, last: int, k: int) -> list[int]:
        """Drafts (ds4_spec_propose) and the verify with its row argmaxes
        (ds4_spec_verify_greedy, into self._arg); sets self._t1 between them."""
        mp, sp, err, buf = self.model._live(), self.s._live(), self._err, self._buf
        self._propose(last, k, buf + 1)
        self._t1 = self.clock()
        buf[0] = last
        st = lib.ds4_spec_verify_greedy(mp, sp, buf, k + 1, self._arg, err)
        if st:
            raise ModelError(ffi.string(err.message).decode("utf-8", "replace"), int(st))
        self.drafter.draft_steps += k
        return list(buf[1:k + 1])

    def _shadow_round(self, last: int) -> list[tuple[int, np.ndarray]]:
        """A depth-1 probe as a shadow (module doc "Shadow probes"): the
        head's draft for the next position, then the serial step; settle()
        tells the policy whether the draft equals the token picked."""
        s = self.s
        self.probes += 1
        self.shadows += 1
        self.depth_counts[0] += 1
        if self._head:
            lib.ds4_session_nextn_catch_up(s._live())   # priming, as before a draft
        buf = self._buf
        t0 = self.clock()
        self._propose(last, 1, buf)
        t1 = self.clock()
        self.drafter.draft_steps += 1
        t, lg = self._plain_step(last)
        self.policy.record_draft(1, t1 - t0)
        self._shadow = (int(buf[0]), t)
        return [(t, lg)]

    def settle(self, j: int, stopped: bool) -> None:
        """The caller committed tokens 0..j of the last round (``stopped``:
        token j ended the generation)."""
        if self._pending is None:  # a plain step: nothing to roll back
            if self._shadow is not None:
                draft, picked = self._shadow
                self._shadow = None
                ok = draft == picked
                # a stopping token is no evidence (as in a drafting round)
                self.policy.observe_shadow(ok and not stopped, stopped)
                if not stopped:
                    self.pos_tried[1] += 1
                    self.pos_ok[1] += ok
                # the head's step left other data in the caches: not a cost sample
                self._cold = True
            return
        k, m, drafts, t0, t1, t2, t_out, t_choose, warm = self._pending
        self._pending = None
        policy = self.policy
        self._cold = self._after_draft = True
        t3 = self.clock()
        self.s.accept(j + 1)  # keeps last and the committed tokens before the final one
        # stop tokens don't update the statistics: a round that ended the
        # generation counts only the drafts before the stopping token
        n_ok = min(m, j) if stopped else m
        policy.observe(k, n_ok, stopped)
        self.drafted += k
        self.accepted += n_ok
        self.accept_counts[n_ok] += 1
        for dpos in range(1, min(k, n_ok + (0 if stopped else 1)) + 1):
            self.pos_tried[dpos] += 1
            if dpos <= n_ok:
                self.pos_ok[dpos] += 1
        self.round_tokens += j + 1
        # the tokens committed in this round after `last` become history for
        # the drafter's `generated` view (the final one arrives as `last`)
        self.generated.extend(drafts[:j])
        self.verify_s.setdefault(k + 1, []).append(t2 - t1)
        t4 = self.clock()
        if self._first_round:
            self._first_round = False
            return
        policy.record_draft(k, t1 - t0)
        policy.record_verify(k + 1, t2 - t1)
        # j < k: accept(j + 1) of k + 1 rows rolled the session back
        policy.record_overhead(t_choose + (t_out - t2) + (t4 - t3), j < k, warm)

    # -- a caller's own fast path (ds4py.generate's decode loop) ------------
    @property
    def stepper(self) -> Stepper:
        """The serial one-token step the plain rounds use."""
        return self._step

    @property
    def quiet_times(self) -> list[float]:
        """Where a caller running a quiet stretch itself (:meth:`take_quiet`)
        appends each step's seconds (step + pick), as the fast path does."""
        return self._quiet_t

    def take_quiet(self) -> int:
        """After a round: hand the rest of a promised plain stretch to the
        caller, who then runs up to that many serial steps itself -- per step:
        ``generated.append(last)``, the stepper's step, the pick, the seconds
        appended to :attr:`quiet_times` -- before the next :meth:`round`,
        which tells the policy about them (module doc "Quiet stretches").
        Stopping early is fine. Returns the number of rounds handed over."""
        n, self._quiet_left = self._quiet_left, 0
        return n

    def _plain_step(self, last: int) -> tuple[int, np.ndarray | None]:
        """The serial step of a plain round: (token, its logits row), or
        (token, None) through :attr:`plain_argmax`."""
        if self.plain_argmax is not None:
            return self.plain_argmax(last), None
        lg = self._step.step(last)
        return self.pick(lg, self.s.n_past), lg

    def _end_span(self, now: float) -> None:
        """The last timed round ended where this one starts (module doc "End
        to end"): a plain round's span holds its quiet steps too; a drafting
        round waits for the next round (``_held``); a cold step's span goes
        with the drafting round before it."""
        start, k = self._span
        self._span = None
        wall = now - start
        if k > 0:
            self._held = (k, wall)
        elif k == 0:
            self.policy.record_plain_run(1 + len(self._quiet_t), wall)
        elif self._held is not None:
            (dk, dwall), self._held = self._held, None
            self.policy.record_round(dk, dwall, cold=(1 + len(self._quiet_t), wall))

    def _release_held(self) -> None:
        """A held drafting round was not followed by a cold step: recorded
        as it is."""
        if self._held is not None:
            (dk, dwall), self._held = self._held, None
            self.policy.record_round(dk, dwall)

    def _end_quiet(self) -> None:
        """Tell the policy about the fast path's rounds."""
        n = len(self._quiet_t)
        self.rounds += n
        self.depth_counts[0] += n
        self.policy.pass_quiet(n)
        self.policy.record_plain_many(self._quiet_t)
        self._quiet_t.clear()   # in place: quiet_times is held by callers
        self._quiet_left = 0

    def finish(self) -> None:
        if self._spans:
            self._release_held()
        if self._quiet_t:
            self._end_quiet()
        if self.admitted:
            self.drafter.finish(self.s)

    # -- statistics ------------------------------------------------------------
    def stats(self) -> dict:
        if self._quiet_t:
            self._end_quiet()
        draft_rounds = self.rounds - self.depth_counts.get(0, 0)
        return {
            "drafter": None if self.drafter is None else self.drafter.name,
            "draft_admitted": self.admitted, "draft_refused": self.refused,
            "rounds": self.rounds, "draft_rounds": draft_rounds, "probes": self.probes,
            "shadow_probes": self.shadows,
            "drafted": self.drafted, "accepted": self.accepted,
            "acceptance": self.accepted / self.drafted if self.drafted else 0.0,
            # P(draft d accepted | drafts 1..d-1 were), over rounds that reached d
            "acceptance_per_depth": {d: self.pos_ok[d] / n
                                     for d, n in sorted(self.pos_tried.items())},
            # the counts behind it (rounds reaching draft position d, accepted there)
            "depth_tried": dict(sorted(self.pos_tried.items())),
            "depth_accepted": {d: self.pos_ok[d] for d in sorted(self.pos_tried)},
            # tokens committed per drafting round (accepted drafts + the target's own)
            "mean_accepted_length": (self.round_tokens / draft_rounds
                                     if draft_rounds else 0.0),
            "verify_ms_per_width": {w: 1000.0 * sum(v) / len(v)
                                    for w, v in sorted(self.verify_s.items())},
            "depth_counts": dict(sorted(self.depth_counts.items())),
            "accept_counts": dict(sorted(self.accept_counts.items())),
            # the serial baseline, when one was measured: a plain decode step's
            # rate as the policy's cost model timed it (lower quartile of the
            # recent plain rounds of this model's requests); None for a fixed
            # depth, which never runs a plain round
            "serial_tps": self._serial_tps(),
            "policy": self.policy.summary(),
        }

    def _serial_tps(self) -> float | None:
        costs = getattr(self.policy, "costs", None)
        if costs is None or not getattr(costs, "plain_samples", 0):
            return None
        plain = costs.plain()
        return 1.0 / plain if plain > 0 else None
