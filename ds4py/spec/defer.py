"""Deferred head priming: a long run of plain rounds catches the head up in batches.

    defer = DeferredPriming(session, hidden_size)
    defer.start()            # the policy expects a long depth-0 stretch
    ...                      # after each plain step of the stretch:
    defer.row(token)         #   the token just evaluated, its hidden row kept
    defer.stop()             # before drafting (and at the end of the run)

With head priming on (ds4py.spec.drafter.NextnDrafter.attach) every plain
decode step also writes the head's KV row of its position inside the same
core call: one KV-only head row per token, ~1.5% of a plain step on the demo
model (measured: 1.264 vs 1.283 ms per step, 1 thread, priming off / on).
While the policy does not draft, nobody reads those rows until the next
probe. So for a stretch the policy expects to be long, priming is turned
off and each step's (token, trunk hidden) kept (a 1 KB copy); the head gets
them in batches of up to ``rows`` through one KV-only call
(``ds4_session_nextn_eval_out``) -- whenever the buffer fills, and before
the stretch ends -- and priming is turned back on, which the core allows
only once the head holds every position [1, n_past) again. So the head's
history has no gap when a draft needs it, and its rows are bit for bit the
ones priming writes (the same head rows from the same inputs: batch
invariance, DESIGN.md invariant 1). Only speed differs; the output never
depends on the head anyway (every committed token is the target's).

Head row p is (token p, trunk hidden of p-1): the stretch starting at
position p0 needs the hidden of p0-1, which is the session's last hidden
row when the stretch starts (after a plain step, an accept or a prefill).
"""

from __future__ import annotations

import numpy as np

from .._core import ffi, lib, new_error
from ..errors import ModelError

__all__ = ["DeferredPriming", "DEFER_ROWS"]

# one KV-only head call per this many deferred rows (the core's chunk size)
DEFER_ROWS = 64


class DeferredPriming:
    """See the module doc."""

    def __init__(self, session, hidden_size: int, rows: int = DEFER_ROWS):
        if rows < 1:
            raise ValueError("rows must be >= 1")
        self.s = session
        self.E = hidden_size
        self.cap = rows
        self.active = False
        self.n = 0            # rows waiting
        self.p0 = 0           # the position of the first waiting row
        self.flushes = 0      # KV-only catch-up calls made (stats)
        self.rows_total = 0   # rows primed that way (stats)
        # H[0]: trunk hidden of p0-1, H[i+1]: of the i-th waiting row's position
        self._H = np.zeros((rows + 1, hidden_size), dtype=np.float32)
        self._T = np.zeros(rows, dtype=np.int32)
        self._P = np.zeros(rows, dtype=np.int64)
        self._Hp = ffi.cast("float *", ffi.from_buffer(self._H))
        self._Tp = ffi.cast("int32_t *", ffi.from_buffer(self._T))
        self._Pp = ffi.cast("int64_t *", ffi.from_buffer(self._P))
        self._rows = ffi.new("int64_t *")
        self._err = new_error()
        self._row_bytes = 4 * hidden_size

    def _last_hidden_into(self, i: int) -> None:
        p = lib.ds4_session_hidden(self.s._live(), self._rows)
        r = int(self._rows[0])
        if r < 1:
            raise ModelError("deferred priming: the session has no hidden row",
                             lib.DS4_ERR_ARG)
        ffi.memmove(self._Hp + i * self.E, p + (r - 1) * self.E, self._row_bytes)

    def start(self) -> None:
        """Turn priming off; the head holds [1, n_past) now (priming was on)."""
        if self.active:
            return
        self._last_hidden_into(0)
        self.s.nextn_prime = False
        self.p0, self.n, self.active = self.s.n_past, 0, True

    def row(self, token: int) -> None:
        """``token`` was just evaluated (at n_past - 1) by a plain step."""
        n = self.n
        self._T[n] = token
        self._last_hidden_into(n + 1)
        self.n = n + 1
        if self.n == self.cap:
            self._flush()

    def _flush(self) -> None:
        n = self.n
        if not n:
            return
        self._P[:n] = np.arange(self.p0, self.p0 + n, dtype=np.int64)
        st = lib.ds4_session_nextn_eval_out(self.s._live(), self._Tp, self._Hp, self._Pp, n,
                                            lib.DS4_NEXTN_OUT_KV, self._err)
        if st:
            raise ModelError(ffi.string(self._err.message).decode("utf-8", "replace"), int(st))
        self._H[0] = self._H[n]
        self.p0 += n
        self.n = 0
        self.flushes += 1
        self.rows_total += n

    def stop(self) -> None:
        """Catch the head up with every waiting row and turn priming back on."""
        if not self.active:
            return
        self._flush()
        self.active = False
        self.s.nextn_prime = True
