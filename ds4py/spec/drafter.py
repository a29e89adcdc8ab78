"""Drafters: who proposes the tokens a speculative round verifies.

    drafter = NextnDrafter(model)     # the model's nextn (MTP) head
    drafter.attach(session)           # admission: None, or why it cannot draft
    drafter.propose(state, k)         # -> k token ids

One interface (:class:`Drafter`) for every drafter. ``attach`` is the one
admission decision of a generation (prefill and decode alike), made before
the prompt is evaluated; ``propose`` gets a :class:`DraftState`. A drafter
that needs no target history (an n-gram table, a test oracle) needs nothing
else.

NextnDrafter (ds4-notes §4 "MTP/nextn drafting"; csrc/forward/nextn.c). The
head keeps its own KV cache in the session; row p of it pairs token p with
the trunk's post-final-norm hidden of position p-1 and predicts token p+1.
Its history is kept by the core, not by Python: ``attach`` turns on the
session's head priming (``Session.nextn_prime``, csrc/session.c), after
which every row the trunk commits reaches the head's KV inside the same core
call, batched and KV-only -- the prompt chunk by chunk during prefill, each
plain decode step's row with that step, a verify's accepted rows at
``accept(k)`` in one call. Priming cannot be turned on for a session that
already holds tokens the head never saw (the trunk's hidden rows of those
positions are gone), and a priming session restores only snapshots that
carry the head's history; so it is impossible to draft from a head that
missed part of the history (and ``propose`` checks ``nextn_covered`` again).

Drafting at position P (the trunk holds positions < P; ``last`` is the token
at P, not yet evaluated): step 1 is the row (last, trunk hidden of P-1) at
P, step j > 1 chains the head's own output hidden: (d_{j-1}, head hidden of
step j-1) at P+j-1; each draft is the head's argmax (lowest id on ties).
The rows the drafts wrote past P are replaced by the committed rows when
the round's accept primes them. The greedy steps run in the core
(``ds4_spec_propose``: one call per round); a subclass that overrides
:meth:`NextnDrafter._pick` gets the same steps from Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .._core import ffi, lib, new_error
from ..errors import ModelError

__all__ = ["DraftState", "Drafter", "NextnDrafter", "DraftError"]


class DraftError(RuntimeError):
    """A drafter asked to draft in a state it cannot draft from."""


@dataclass
class DraftState:
    """What a drafter may look at when proposing.

    session: the target's session (``n_past == position``).
    position: where ``last_token`` goes (the trunk holds positions < it).
    last_token: the last committed token, not yet evaluated by the target.
    last_hidden: the trunk's post-final-norm hidden of position-1 (float32
      [hidden], a view) when the drafter said ``needs_hidden``, else None.
    generated: every token generated so far in this call, ``last_token``
      included (read only).
    """

    session: object
    position: int
    last_token: int
    last_hidden: np.ndarray | None
    generated: list[int] = field(default_factory=list)


class Drafter:
    """The drafter interface. ``needs_hidden``: the runner passes the trunk's
    last hidden row in :class:`DraftState`."""

    name = "drafter"
    needs_hidden = False

    def attach(self, session) -> str | None:
        """Admission, before the prompt is evaluated: None if this drafter can
        draft in ``session`` (it may configure the session for it), else the
        reason it cannot."""
        return None

    def propose(self, state: DraftState, k: int) -> list[int]:
        raise NotImplementedError

    # a drafter that can sample its drafts (stochastic drafting, rejection
    # sampling: ds4py.spec.runner sampling="rejection") overrides this
    can_sample = False

    def propose_dist(self, state: DraftState, k: int, dist, uniforms) -> tuple[list, list]:
        """k drafts *sampled* from the drafter's own distribution q under the
        target's sampling transform: ``dist(logits)`` gives q (a probability
        vector over the vocabulary, float64) for a row of the drafter's
        logits, and draft j is drawn from it with ``uniforms[j]``
        (:func:`ds4py.spec.rejection.draw_from`). Returns (drafts, q rows)."""
        raise DraftError(f"{self.name}: this drafter cannot sample its drafts")

    def finish(self, session) -> None:
        """The generation ended."""


class NextnDrafter(Drafter):
    """The model's nextn (MTP) head (module doc)."""

    name = "nextn"
    needs_hidden = True

    def __init__(self, model):
        if model.nextn_source is None:
            raise DraftError(f"{model.path!r} has no nextn (MTP) head")
        self.model = model
        self.draft_steps = 0
        self._err = new_error()
        self._out = ffi.new(f"int32_t[{int(lib.DS4_VERIFY_MAX)}]")
        # the core's greedy steps unless a subclass picks its own tokens
        self._in_core = type(self)._pick is NextnDrafter._pick
        self.needs_hidden = not self._in_core  # the core reads the hidden row itself

    def attach(self, session) -> str | None:
        try:
            session.nextn_prime = True
        except ModelError as e:
            return f"the nextn head cannot keep this session's history: {e}"
        return None

    # -- drafting ------------------------------------------------------------
    def _pick(self, logits: np.ndarray, j: int, state: DraftState) -> int:
        """The draft token of step j (0-based) from the head's logits."""
        return int(logits.argmax())

    def propose(self, state: DraftState, k: int) -> list[int]:
        s = state.session
        gpu = getattr(s, "nextn_propose", None)  # a GPU session: the head runs on the device
        if gpu is not None:
            if not self._in_core:
                raise DraftError(f"{type(self).__name__} picks its own drafts: on a GPU session "
                                 "the head's steps run on the device, greedy only")
            if not s.nextn_covered:
                raise DraftError(f"the nextn head is not primed: drafting at {state.position} "
                                 f"needs rows 1..{state.position - 1}")
            out = gpu(int(state.last_token), k)
            self.draft_steps += k
            return out
        if self._in_core:
            st = lib.ds4_spec_propose(self.model._live(), s._live(), int(state.last_token), k,
                                      self._out, self._err)
            if st:
                msg = ffi.string(self._err.message).decode("utf-8", "replace")
                if st == lib.DS4_ERR_ARG and "nextn head" in msg:
                    raise DraftError(msg)
                raise ModelError(msg, int(st))
            self.draft_steps += k
            return list(self._out[0:k])
        if not s.nextn_covered:
            raise DraftError(f"the nextn head is not primed: drafting at {state.position} "
                             f"needs rows 1..{state.position - 1}")
        hid = state.last_hidden if state.last_hidden is not None else s.last_hidden()
        out: list[int] = []
        tok, pos = int(state.last_token), state.position
        for j in range(k):
            # explicit positions: step 1 rewinds a head holding rows past P
            lg, hd = self.model.nextn_eval(s, [tok], np.asarray(hid)[None], [pos + j])
            tok = self._pick(lg[0], j, state)
            hid = hd[0]
            out.append(tok)
        self.draft_steps += k
        return out

    can_sample = True

    def propose_dist(self, state: DraftState, k: int, dist, uniforms) -> tuple[list, list]:
        """The chained head steps of :meth:`propose`, each draft drawn from
        q = dist(head logits) instead of the argmax."""
        from .rejection import draw_from

        s = state.session
        if not s.nextn_covered:
            raise DraftError(f"the nextn head is not primed: drafting at {state.position} "
                             f"needs rows 1..{state.position - 1}")
        toks: list[int] = []
        qs: list = []
        tok, pos = int(state.last_token), state.position
        step = getattr(s, "nextn_step", None)  # a GPU session: the head's steps on the device
        if step is not None:
            for j in range(k):
                q = dist(step(tok, j))
                tok = draw_from(q, uniforms[j])
                toks.append(tok)
                qs.append(q)
            self.draft_steps += k
            return toks, qs
        hid = state.last_hidden if state.last_hidden is not None else s.last_hidden()
        for j in range(k):
            lg, hd = self.model.nextn_eval(s, [tok], np.asarray(hid)[None], [pos + j])
            q = dist(lg[0])
            tok = draw_from(q, uniforms[j])
            hid = hd[0]
            toks.append(tok)
            qs.append(q)
        self.draft_steps += k
        return toks, qs

    def __repr__(self) -> str:
        return f"NextnDrafter({self.model.path!r})"
