"""Drafters: who proposes the tokens a speculative round verifies.

    drafter = NextnDrafter(model)     # the model's nextn (MTP) head
    drafter.propose(state, k)         # -> k token ids

One interface (:class:`Drafter`) for every drafter. The loop
(ds4py.spec.loop) hands each drafter the rows the target has committed --
``(token p, trunk hidden of p-1)`` at position p, the pairing an MTP head
reads -- through :meth:`Drafter.extend` / :meth:`Drafter.sync`, and asks for
drafts with :meth:`Drafter.propose` and a :class:`DraftState`. A drafter
that needs no target history (an n-gram table, a test oracle) ignores the
rows.

NextnDrafter (ds4-notes §4 "MTP/nextn drafting"; model.nextn_eval /
nextn_draft, csrc/forward/nextn.c). The head keeps its own KV cache in the
session; row p of it pairs token p with the trunk's post-final-norm hidden
of position p-1 and predicts token p+1. Drafting at position P (the trunk
holds positions < P; ``last`` is the token at P, not yet evaluated):

  * the head must hold rows 1..P-1 (the history). Rows arrive through
    ``extend``: the prompt's rows at prefill, the accepted rows after each
    verify, one row per plain decode step. They are queued and written by
    ``sync`` in batched ``nextn_eval`` calls of at most ``window`` rows
    (per-token priming capped ds4's prefill at 150-170 t/s). The loop syncs
    at prefill and after each verify (the accepted rows in one call);
    ``propose`` syncs whatever plain decode steps queued, so a round of
    depth 0 is a plain decode plus one queued row; the rows are written in
    one batched call before the next draft (the head itself costs a row per
    token either way: it needs the whole history).
  * step 1 is the row (last, h_{P-1}) at P; step j > 1 chains the head's own
    output hidden: (d_{j-1}, head hidden of step j-1) at P+j-1. Each draft is
    the argmax of the head's logits (lowest id on ties).
  * after the verify and ``accept``, the core has cut the head back to the
    trunk's position; the rows at P+1.. were made from the head's own
    hiddens, so the loop re-sends the accepted ones with the verify's hidden
    rows (``extend``, then ``sync``: one call).

It is impossible to draft without the history: ``propose`` raises
:class:`DraftError` unless the head (with the queued rows) covers every
position 1..P-1, checked against the core's ``nextn_range``. ``admit``
says, before a generation starts, whether that can hold in a session (a
session that already holds tokens the head never saw cannot be primed: the
trunk's hidden rows of those positions are gone).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

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
      [hidden]) when the loop tracks hiddens (the drafter said
      ``needs_hidden``), else None.
    generated: every token generated so far in this call, ``last_token``
      included (read only).
    """

    session: object
    position: int
    last_token: int
    last_hidden: np.ndarray | None
    generated: list[int] = field(default_factory=list)


class Drafter:
    """The drafter interface, with no-op history handling (for drafters that
    need no target rows). ``needs_hidden``: the loop must fetch the trunk's
    hidden rows and feed ``extend``."""

    name = "drafter"
    needs_hidden = False

    def admit(self, session) -> str | None:
        """None if this drafter can draft in ``session`` (at its current
        position, before the prompt is evaluated), else the reason."""
        return None

    def extend(self, tokens, hiddens, pos0: int) -> None:
        """Queue rows (tokens[i], hiddens[i]) at positions pos0 + i: token p
        with the trunk hidden of position p-1."""

    def sync(self, session) -> None:
        """Write the queued rows (batched)."""

    def reset(self) -> None:
        """Forget queued rows (called when a generation starts)."""

    def propose(self, state: DraftState, k: int) -> list[int]:
        raise NotImplementedError

    def finish(self, session) -> None:
        """The generation ended; leave the drafter's state consistent with
        the session (the next generation on it may draft)."""
        self.sync(session)


class NextnDrafter(Drafter):
    """The model's nextn (MTP) head (module doc)."""

    name = "nextn"
    needs_hidden = True

    def __init__(self, model, window: int = 256):
        if model.nextn_source is None:
            raise DraftError(f"{model.path!r} has no nextn (MTP) head")
        if window < 1:
            raise ValueError("window must be >= 1")
        self.model = model
        self.window = window
        self._q_tok: list[int] = []
        self._q_hid: list[np.ndarray] = []
        self._q_pos0 = 0
        self.sync_calls = 0        # nextn_eval calls made by sync
        self.synced_rows = 0
        self.draft_steps = 0

    # -- history -------------------------------------------------------------
    def covered(self, session) -> int:
        """The largest c >= 1 such that rows 1..c-1 are in the head or the
        queue (0 when the head has a gap before its first row)."""
        first, nxt = self.model.nextn_range(session)
        head = 1
        if nxt > first:
            if first > 1:
                return 0
            head = nxt
        if self._q_tok:
            if self._q_pos0 > head:
                return 0
            return self._q_pos0 + len(self._q_tok)
        return head

    def admit(self, session) -> str | None:
        p = session.n_past
        c = self.covered(session)
        if c < p:
            return (f"the nextn head holds no rows for positions {max(c, 1)}..{p - 1} of "
                    f"this session (tokens evaluated without the head)")
        return None

    def extend(self, tokens, hiddens, pos0: int) -> None:
        n = len(tokens)
        if n == 0:
            return
        hid = np.asarray(hiddens, dtype=np.float32)
        if hid.shape != (n, self.model.config.hidden_size):
            raise DraftError(f"extend: hiddens must be [{n}, "
                             f"{self.model.config.hidden_size}], got {hid.shape}")
        if self._q_tok:
            end = self._q_pos0 + len(self._q_tok)
            if pos0 > end:
                raise DraftError(f"extend: rows from {pos0} leave a gap after {end}")
            if pos0 < self._q_pos0:
                self._q_tok.clear()
                self._q_hid.clear()
                self._q_pos0 = pos0
            else:  # a rewind inside the queue replaces its tail
                del self._q_tok[pos0 - self._q_pos0:]
                del self._q_hid[pos0 - self._q_pos0:]
        else:
            self._q_pos0 = pos0
        self._q_tok.extend(int(t) for t in tokens)
        self._q_hid.extend(np.array(hid[i]) for i in range(n))  # copies: views die

    def sync(self, session) -> None:
        if not self._q_tok:
            return
        if self.covered(session) == 0:
            first, nxt = self.model.nextn_range(session)
            raise DraftError(f"queued rows from {self._q_pos0} do not continue the head "
                             f"(it holds [{first}, {nxt}))")
        toks, hids, p0 = self._q_tok, self._q_hid, self._q_pos0
        w = self.window
        for i in range(0, len(toks), w):
            n = min(w, len(toks) - i)
            self.model.nextn_eval(session, toks[i:i + n], np.stack(hids[i:i + n]),
                                  np.arange(p0 + i, p0 + i + n))
            self.sync_calls += 1
        self.synced_rows += len(toks)
        self._q_tok, self._q_hid = [], []

    def reset(self) -> None:
        """Drop the queue (a new session)."""
        self._q_tok, self._q_hid = [], []

    # -- drafting ------------------------------------------------------------
    def _pick(self, logits: np.ndarray, j: int, state: DraftState) -> int:
        """The draft token of step j (0-based) from the head's logits."""
        return int(logits.argmax())

    def propose(self, state: DraftState, k: int) -> list[int]:
        s = state.session
        if state.last_hidden is None:
            raise DraftError("NextnDrafter needs the trunk's last hidden row")
        c = self.covered(s)
        if c < state.position:
            raise DraftError(f"the nextn head is not primed: it holds rows up to {c - 1}, "
                             f"drafting at {state.position} needs 1..{state.position - 1}")
        self.sync(s)
        out: list[int] = []
        tok, hid = int(state.last_token), state.last_hidden
        draft = self.model.nextn_draft
        # nextn_draft writes at the head's next position; the head may hold
        # rows past P (a restored snapshot): then step 1 rewinds to P.
        rewind = self.model.nextn_range(s)[1] != state.position
        for j in range(k):
            if j == 0 and rewind:
                lg, hd = self.model.nextn_eval(s, [tok], np.asarray(hid)[None],
                                               [state.position])
                logits, hid = lg[0], hd[0]
            else:
                logits, hid = draft(s, tok, hid)
            tok = self._pick(logits, j, state)
            out.append(tok)
        self.draft_steps += k
        return out

    def __repr__(self) -> str:
        return f"NextnDrafter({self.model.path!r}, window={self.window})"
