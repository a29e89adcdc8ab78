"""One request's generation, advanced one step at a time by the scheduler.

``Job.step()`` does one unit of work: one piece of the prefill (through the
shared PrefixCache, one KV block per round while other jobs run), or one
decode step (sample, detokenize, stop strings, output
parser, evaluate the token). It is ``ds4py.generate``'s loop (generate.py,
``_loop``) cut into steps so that the scheduler can interleave many jobs token
by token; the rules are the same, so a greedy (or seeded) request gives the
tokens ``ds4py.generate`` gives (tests/test_server_openai.py checks it):

- greedy without bias/penalties/grammar is ``argmax`` of the raw logits (ties
  to the lowest id); anything else goes through ``ds4py.Sampler`` (seeded
  Mt19937, the prompt's last ``repeat_last_n`` tokens in the penalty window);
- log-probabilities are taken on the raw logits;
- ``eos`` ends without the token; ``max_tokens`` and the context end give
  ``length``; a stop string gives ``stop``.

Two server-only additions, applied to a copy of the logits before sampling:
a grammar (``grammar.GrammarConstraint``: disallowed tokens get -inf) and a
forced-token list (test hook: the next token is taken from the list instead of
sampled, so tool-call parsing and SSE deltas run for real on random weights).

Speculative decoding: a job drafts exactly when ``ds4py.generate`` would
with the same arguments (``ds4py.spec.plan.draft_plan``: the model's
bundled head, a draft head or a DFlash drafter the pairing classifier
allows; ``JobSpec.draft=False`` turns it off), through the same
``ds4py.spec.runner.SpecRunner`` and the same sampler call per committed
token, so its tokens stay ``ds4py.generate``'s. A decode step is then one
speculative round: the tokens of the previous round are committed (one
``Delta`` each, with the serial rules above), the round is settled and the
next one is run. Jobs with a grammar or forced tokens do not draft (their
picks are not the sampler's). ``Done.draft`` carries the statistics
(``usage.draft`` in the API responses).

Every method here runs on the scheduler thread; results leave through
``emit`` (thread-safe, set by the HTTP side).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..cache import BLOCK
from ..dflash import DFlashDrafter
from ..output_parser import OutputParser, ToolCall
from ..sampling import Sampler, SamplingParams, TokenLogprobs
from ..sampling import logprobs as token_logprobs
from ..spec.drafter import NextnDrafter
from ..spec.plan import draft_plan
from ..spec.runner import SpecRunner, argmax_pick
from ..stop import StopMatcher

FINISH_EOS, FINISH_STOP, FINISH_LENGTH, FINISH_CANCELLED = "eos", "stop", "length", "cancelled"
# A job whose reader has this many events waiting stops being stepped until the
# reader catches up (each event is one token's delta: a few hundred bytes).
MAX_BACKLOG = 256


@dataclass
class JobSpec:
    """What to generate (already validated and tokenized by the HTTP side)."""

    ids: list[int]
    max_tokens: int
    params: SamplingParams
    stop: Sequence[str] = ()
    n_logprobs: int | None = None
    parse_output: bool = False          # split into reasoning / content / tool calls
    starts_in_thinking: bool = False
    tools: Sequence[dict] | None = None
    grammar: Any = None                 # a grammar.GrammarConstraint, or None
    forced_tokens: Sequence[int] | None = None
    pause_after: int | None = None      # test hook: stop stepping after this many tokens
    draft: bool | None = None           # speculative decoding: None = as generate, False = off
    force_draft: bool = False           # draft_plan's force_draft (--force-draft)


@dataclass
class Delta:
    """Text released by one step (parsed into sections when parse_output)."""

    text: str = ""
    reasoning: str = ""
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    token: int | None = None
    logprobs: TokenLogprobs | None = None


@dataclass
class Done:
    """The end of a job (also sent after an error, with ``error`` set)."""

    finish_reason: str
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    prompt_tokens: int = 0          # the whole prompt (OpenAI's usage.prompt_tokens)
    cached_tokens: int = 0          # of which restored from the prefix cache
    reasoning: str | None = None
    content: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    stop_string: str | None = None
    ttft_s: float = 0.0
    generation_s: float = 0.0
    error: BaseException | None = None
    draft: dict | None = None       # speculative decoding statistics (None: not considered)


@dataclass
class Prefilled:
    """Sent once the prompt is in the session (streams use it to stop keep-alives)."""

    cached_tokens: int


class Job:
    """A request's state between scheduler steps."""

    def __init__(self, spec: JobSpec, emit: Callable[[object], None]):
        self.spec = spec
        self._emit = emit
        # Backpressure counters: written by one thread each (emitted by the
        # scheduler, taken by the event loop); a stale read only delays a pause
        # or a resume by a round.
        self._emitted = 0
        self._taken = 0
        self._prefilled: int | None = None
        self.final: Done | None = None  # the Done event, once finished
        self.cancelled = False          # set from the HTTP side; read each round
        self.done = False
        self.t_submit = time.perf_counter()
        self._session = None
        self._logits = None
        self._tokens: list[int] = []
        self._evaluated = 0             # generated tokens evaluated into the session
        self._pieces: list[str] = []
        self._n_cached = 0
        self._budget = 0
        self._t_first = 0.0
        self._ttft = 0.0
        self._track = None
        self._plan = None               # ds4py.spec.plan.DraftPlan when drafting was considered
        self._run: SpecRunner | None = None
        self._block = None              # the last round's [(token, logits row)], uncommitted
        self._p_start = 0

    # -- called by the scheduler --------------------------------------------------
    def start(self, model, session, cache) -> None:
        """Take a session and evaluate the prompt (restoring the cached prefix)."""
        sp = self.spec
        self._model, self._session, self._cache = model, session, cache
        vocab = model.config.vocab_size
        p = sp.params
        self._fast_greedy = p.greedy and not p.logit_bias and not p.penalties_on
        self._sampler = None if self._fast_greedy else Sampler(p, vocab)
        if self._sampler is not None and p.penalties_on:
            self._sampler.accept_many(sp.ids[-p.repeat_last_n:])
        self._matcher = StopMatcher(sp.stop) if sp.stop else None
        self._parser = (OutputParser(starts_in_thinking=sp.starts_in_thinking, tools=sp.tools)
                        if sp.parse_output else None)
        self._dec = model.tokenizer.stream(special=True)
        self._eog = model.tokenizer.eog_ids
        self._forced = list(sp.forced_tokens or ())
        if sp.grammar is None and not self._forced and sp.draft is not False:
            self._start_drafting(model, session)
        # The longest cached prefix decides where the first piece ends (one
        # restore, then up to the next BLOCK boundary); its length is what the
        # client is told was cached.
        self._n_cached, _ = cache.lookup(sp.ids)
        self._prefilled = None
        self.prefill_step(whole=False)

    @property
    def prefilling(self) -> bool:
        return self._prefilled is None or self._prefilled < len(self.spec.ids)

    def prefill_step(self, whole: bool) -> None:
        """Put the next piece of the prompt into the session: up to the next
        ``BLOCK`` boundary, or all of the rest when ``whole`` (the scheduler
        says so when no other job is running).

        Why pieces: a long prompt evaluated in one call would stall every other
        slot's stream for its whole duration; one BLOCK per scheduler round
        lets them keep streaming. Each piece is ``PrefixCache.prefill`` of the
        prompt up to the piece's end: it restores the snapshot the previous
        piece left at its BLOCK boundary (or re-evaluates from a shorter prefix
        if that entry was evicted), so the session always ends exactly at the
        prompt prefix, and the logits are the same as those of one call
        (resumed equals fresh)."""
        ids = self.spec.ids
        done = self._n_cached if self._prefilled is None else self._prefilled
        end = len(ids) if whole else min((done // BLOCK + 1) * BLOCK, len(ids))
        if self._run is None:
            _, self._logits, _, self._track = self._cache.prefill(self._session, ids[:end])
        else:
            # admission right after each restore (generate's rule): the nextn
            # head's history comes with head-carrying snapshots, a DFlash
            # TapSession's with the taps recorded next to its snapshots
            _, self._logits, _, self._track = self._cache.prefill(
                self._session, ids[:end], head=isinstance(self._plan.drafter, NextnDrafter),
                prepare=self._admit)
        self._prefilled = end
        if end < len(ids):
            return
        self._p_start = self._session.n_past
        self._budget = min(self.spec.max_tokens, self._model.n_ctx - self._session.n_past)
        self.emit(Prefilled(self._n_cached))
        if self._budget <= 0:
            self._finish(FINISH_LENGTH, Delta())

    @property
    def paused(self) -> bool:
        """Holds its slot without progressing: its reader is ``MAX_BACKLOG``
        events behind (a slow client: generating further would only queue
        more in memory), or the test hook ``pause_after`` was reached."""
        if self.backlog() >= MAX_BACKLOG:
            return True
        return self.spec.pause_after is not None and len(self._tokens) >= self.spec.pause_after

    def backlog(self) -> int:
        """Events emitted and not yet taken by the reader."""
        return self._emitted - self._taken

    def taken(self) -> None:
        """The reader took one event (called from the HTTP side)."""
        self._taken += 1

    def emit(self, ev: object) -> None:
        self._emitted += 1
        self._emit(ev)

    def step(self, alone: bool = False) -> None:
        """One unit of work: the next prefill piece, or one decode step (sample
        a token, release its text, evaluate it)."""
        if self.prefilling:
            self.prefill_step(whole=alone)
            return
        if self._run is not None:
            self._round()
            return
        sp = self.spec
        raw = self._logits
        x = raw
        if sp.grammar is not None:
            x = sp.grammar.masked(raw)
        if self._forced:
            t = int(self._forced.pop(0))
        elif self._fast_greedy and sp.grammar is None:
            t = int(x.argmax())
            if x[t] != x[t]:
                raise ValueError("the model produced NaN logits")
        elif self._sampler is None:     # greedy under a grammar: argmax of the masked row
            t = int(np.argmax(x))
        else:
            t = self._sampler.sample(x)
            if sp.params.penalties_on:
                self._sampler.accept(t)
        finish, delta = self._commit(t, raw)
        if finish is None:
            self._logits = self._session.eval([t])
            self._evaluated += 1
            self.emit(delta)
            return
        self._finish(finish, delta)

    def _commit(self, t: int, raw) -> tuple[str | None, Delta]:
        """Commit the token ``t`` picked from the logits row ``raw``: its
        log-probabilities, the grammar, the finish rules, its text. Returns
        (finish reason or None, its Delta)."""
        sp = self.spec
        lp = token_logprobs(raw, t, sp.n_logprobs) if sp.n_logprobs is not None else None
        if sp.grammar is not None:
            sp.grammar.consume(t)
        if not self._tokens:
            self._t_first = time.perf_counter()
            self._ttft = self._t_first - self.t_submit
        finish = None
        if t in self._eog:
            finish, token = FINISH_EOS, None
        else:
            self._tokens.append(t)
            token = t
            if len(self._tokens) >= self._budget:
                finish = FINISH_LENGTH
            elif sp.grammar is not None and sp.grammar.finished():
                finish = FINISH_EOS    # the grammar admits nothing more
        piece = self._dec.feed(t) if token is not None else ""
        if finish is not None:
            piece += self._dec.finish()
        if self._matcher is not None:
            piece, stopped = self._matcher.feed(piece)
            if stopped:
                finish = FINISH_STOP
            elif finish is not None:
                piece += self._matcher.flush()
        if piece:
            self._pieces.append(piece)
        events = list(self._parser.feed(piece)) if self._parser is not None and piece else []
        if finish is not None and self._parser is not None:
            events += self._parser.finish()
        return finish, _delta(piece, token, lp if token is not None else None, events)

    # -- speculative decoding ---------------------------------------------------------
    def _start_drafting(self, model, session) -> None:
        """generate's draft plan for this job; when it drafts, the runner (and
        for DFlash the TapSession wrapping the slot's session)."""
        plan = self._plan = draft_plan(model, self.spec.draft, force_draft=self.spec.force_draft)
        if not plan.active:
            return
        if isinstance(plan.drafter, DFlashDrafter):
            self._session = plan.drafter.session(session)
        if self._fast_greedy:
            pick = argmax_pick
        else:
            pick = self._sampler.pick  # sample (or sample_at) + accept: the serial step's draw
        self._run = SpecRunner(model, self._session, plan.policy, plan.drafter, pick,
                               greedy=self._fast_greedy)

    def _admit(self) -> None:
        s = self._session
        if isinstance(self._plan.drafter, DFlashDrafter) and not s.valid and s.n_past:
            s.rebuild(self.spec.ids[:s.n_past])  # a snapshot without taps (generate does too)
        self._run.admit()

    def _round(self) -> None:
        """Commit the last round's tokens (the first one: picked from the
        prompt's logits), settle it, run the next one."""
        run = self._run
        if self._block is None:
            lg = self._logits
            self._block = [(run.pick(lg, self._session.n_past), lg)]
        block = self._block
        j, finish, delta = len(block) - 1, None, Delta()
        for i, (t, row) in enumerate(block):
            if self._fast_greedy and row[t] != row[t]:
                raise ValueError("the model produced NaN logits")
            finish, delta = self._commit(t, row)
            if finish is not None:
                j = i
                break
            self.emit(delta)
        run.settle(j, finish is not None)
        if finish is None:
            self._block = run.round(block[j][0], self._budget - len(self._tokens))
            return
        run.finish()
        self._evaluated = self._session.n_past - self._p_start
        self._finish(finish, delta)

    def draft_stats(self) -> dict | None:
        """Done.draft: generate's Generation.draft keys."""
        plan = self._plan
        if plan is None:
            return None
        rep = plan.report
        common = {"verdict": None if rep is None else rep.verdict,
                  "pairing": None if rep is None else rep.to_dict()}
        run = self._run
        if run is None:
            return {"drafter": None, "drafting": False, "refused": plan.reason, **common}
        st = run.stats()
        gen_s = time.perf_counter() - self._t_first if self._tokens else 0.0
        st.update({"drafting": run.admitted, "refused": run.refused, **common,
                   "decode_tps": self._evaluated / gen_s if self._evaluated and gen_s > 0
                   else 0.0})
        return st

    def cancel_cleanup(self) -> None:
        self.done = True
        self._emit_done(Done(FINISH_CANCELLED, list(self._tokens),
                             prompt_tokens=len(self.spec.ids), cached_tokens=self._n_cached))

    def fail(self, exc: BaseException) -> None:
        self.done = True
        self._emit_done(Done("error", list(self._tokens), error=exc))

    def _emit_done(self, done: Done) -> None:
        self.final = done
        self.emit(done)

    # -- internals -----------------------------------------------------------------
    def _finish(self, finish: str, last: Delta) -> None:
        evaluated = self._evaluated
        if self._track is not None and evaluated:
            # End of this turn in the prefix cache (as generate does): prompt + evaluated tokens.
            self._cache._extend(self._track, self._tokens[:evaluated])
        if last.text or last.reasoning or last.content or last.tool_calls or last.token is not None:
            self.emit(last)
        p = self._parser
        now = time.perf_counter()
        self.done = True
        draft = self.draft_stats()
        self._emit_done(Done(
            finish_reason=finish, tokens=list(self._tokens), text="".join(self._pieces),
            prompt_tokens=len(self.spec.ids), cached_tokens=self._n_cached,
            reasoning=p.reasoning if p else None, content=p.content if p else None,
            tool_calls=list(p.tool_calls) if p else [],
            stop_string=self._matcher.matched if finish == FINISH_STOP else None,
            ttft_s=self._ttft, generation_s=now - self._t_first if self._tokens else 0.0,
            draft=draft))


def _delta(piece: str, token: int | None, lp, events) -> Delta:
    d = Delta(text=piece, token=token, logprobs=lp)
    if events:
        d.reasoning = "".join(e.text for e in events if e.kind == "reasoning")
        d.content = "".join(e.text for e in events if e.kind == "content")
        d.tool_calls = tuple(e.tool_call for e in events if e.kind == "tool_call")
    return d
