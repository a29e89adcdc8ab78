"""One-token decode steps straight through the C API (the serial loop's step).

Shared by the plain decode loop (ds4py.generate) and the depth-0 rounds of
speculative decoding (ds4py.spec.runner), so that a round that does not
draft costs exactly what a serial decode step costs.
"""

from __future__ import annotations

import numpy as np

from .._core import ffi, lib, new_error
from ..errors import ModelError

__all__ = ["Stepper"]


class Stepper:
    """One-token evals straight through the C API with a reused token buffer and
    a cached logits view: the per-token cost of ``Session.eval`` (argument
    conversion and checks, a fresh numpy view each call: several µs) is what
    would make Python the bottleneck on small models. It relies on Session
    keeping no state of its own beyond ``_ptr`` (true of ds4py.session today);
    the session's liveness is re-checked every step, since user code runs
    between steps of a stream and may close it."""

    __slots__ = ("_session", "_tok", "_err", "_n", "_p", "_view", "_vocab")

    def __init__(self, session, vocab: int):
        session._live()
        self._session = session
        self._tok = ffi.new("int32_t[1]")
        self._err = new_error()
        self._n = ffi.new("int64_t *")
        self._p = ffi.NULL
        self._view = None
        self._vocab = vocab

    def step(self, token: int) -> np.ndarray:
        ptr = self._session._live()
        tok = self._tok
        tok[0] = token
        status = _EVAL(ptr, tok, 1, 0, self._err)
        if status:
            raise ModelError(ffi.string(self._err.message).decode("utf-8", "replace"),
                             int(status))
        p = _LOGITS(ptr, self._n)
        if p != self._p or self._view is None:
            # The buffer moved (or is new): a fresh read-only view of its first row.
            v = np.frombuffer(ffi.buffer(p, self._vocab * 4), dtype=np.float32)
            v.flags.writeable = False
            self._p, self._view = p, v
        return self._view


# bound once: a module attribute lookup on `lib` per call is measurable here
_EVAL = lib.ds4_session_eval
_LOGITS = lib.ds4_session_logits
