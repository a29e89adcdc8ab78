"""Evaluating tokens with a loaded model.

    model = ds4py.load("model.gguf", precision="exact")
    with model.new_session() as s:
        last = s.eval([11, 22, 33])                  # float32 [vocab]: the last row
        rows = s.eval([44, 55], all_logits=True)     # float32 [2, vocab]
        logits, hidden = s.eval([66], return_hidden=True)
        logits, layers = s.eval([77], hidden_layers=[0, 2])   # layers: [2, hidden]
        s.n_past                                     # 7
        s.counters()        # {"allocs": ..., "alloc_bytes": ..., "weight_bytes": ...}

A session is one sequence: its KV cache pages, the recurrent (GDN) states and
its position live in the C core (csrc/session.c, csrc/forward/). Each
``eval`` appends its tokens after ``n_past`` and runs them as one batch; the
results do not depend on how a prompt is split into evals, nor on the thread
count (batch invariance, DESIGN.md).

Lifetime of results
  ``eval`` returns read-only numpy **views** of buffers the session owns (no
  copy). They stay valid until the next ``eval`` on this session or its
  ``close()``; after that they may show other rows or freed memory. Keep a
  result with ``np.array(x)`` (a copy).

Errors
  :class:`ds4py.ModelError` (carrying the core's message and ``.code``): no
  tokens, a token id outside ``[0, vocab_size)``, a prompt that does not fit
  (``"prompt of N tokens does not fit: n_past P + N > n_ctx C"``), a
  ``hidden_layers`` entry that is not a trunk layer, a closed session or
  model. A failed eval leaves the session unchanged.

The session holds the C model alive (see ds4py.model, Lifetime), so closing
the Model first is safe.
"""

from __future__ import annotations

import numpy as np

from ._core import ffi, lib, new_error
from .errors import ModelError

__all__ = ["Session"]

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def _check(status: int, err) -> None:
    if status != lib.DS4_OK:
        raise ModelError(ffi.string(err.message).decode("utf-8", "replace"), int(status))


def _as_tokens(tokens) -> np.ndarray:
    arr = np.asarray(tokens)
    if arr.dtype == object or arr.dtype == np.bool_ or (
            arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise ModelError(f"tokens must be integer ids, got dtype {arr.dtype}", lib.DS4_ERR_ARG)
    if arr.ndim != 1:
        raise ModelError(f"tokens must be a 1-D sequence, got shape {arr.shape}", lib.DS4_ERR_ARG)
    if arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < _INT32_MIN or hi > _INT32_MAX:
            bad = lo if lo < _INT32_MIN else hi
            i = int(np.flatnonzero(arr == bad)[0])
            raise ModelError(f"token id {bad} at index {i} is out of range", lib.DS4_ERR_ARG)
    return np.ascontiguousarray(arr, dtype=np.int32)


def _as_layers(layers) -> np.ndarray:
    arr = np.asarray(layers)
    if arr.dtype == object or arr.dtype == np.bool_ or (
            arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise ModelError(f"hidden_layers must be integer layer indices, got dtype {arr.dtype}",
                         lib.DS4_ERR_ARG)
    if arr.ndim != 1:
        raise ModelError(f"hidden_layers must be a 1-D sequence, got shape {arr.shape}",
                         lib.DS4_ERR_ARG)
    if arr.size and (int(arr.min()) < -(2**63) or int(arr.max()) >= 2**63):
        raise ModelError("hidden_layers entry out of range", lib.DS4_ERR_ARG)
    return np.ascontiguousarray(arr, dtype=np.int64)


class Session:
    """One sequence being evaluated. Create with ``Model.new_session()``."""

    def __init__(self, model):
        model_ptr = model._live()
        pp = ffi.new("ds4_session **")
        err = new_error()
        _check(lib.ds4_session_new(model_ptr, pp, err), err)
        # The destructor closes over the model pointer, so the C model cannot
        # be freed before this session is (ffi.gc order is otherwise unspecified).
        self._ptr = ffi.gc(pp[0], lambda p, _m=model_ptr: lib.ds4_session_free(p))
        self.vocab_size = model.config.vocab_size
        self.hidden_size = model.config.hidden_size

    # -- evaluation -------------------------------------------------------
    def eval(self, tokens, all_logits: bool = False, return_hidden: bool = False,
             hidden_layers=None):
        """Evaluate ``tokens`` (ints) after the current position.

        Rows: the last row only, or every row of ``tokens`` with
        ``all_logits``. Returns, in this order, only the parts asked for:

        - ``logits``: float32 ``[vocab]`` (last row) or ``[n, vocab]``;
          always returned.
        - ``hidden`` (with ``return_hidden``): the post-final-norm hidden
          state of the same rows (what the LM head and an MTP head read),
          ``[hidden]`` or ``[n, hidden]``.
        - ``layer_hidden`` (with ``hidden_layers=[i, ...]``, trunk layer
          indices ``0 <= i < config.n_layers``, repeats allowed): the
          residual stream after each of those layers, before any final norm
          (what drafters such as DFlash read from the target),
          ``[len(hidden_layers), hidden]`` or ``[n, len(hidden_layers), hidden]``.

        So ``eval(t)`` is ``logits``; ``eval(t, return_hidden=True)`` is
        ``(logits, hidden)``; ``eval(t, hidden_layers=L)`` is
        ``(logits, layer_hidden)``; both flags give
        ``(logits, hidden, layer_hidden)``. Views valid until the next eval
        or close (module doc).
        """
        ptr = self._live()
        arr = _as_tokens(tokens)
        layers = None if hidden_layers is None else _as_layers(hidden_layers)
        err = new_error()
        tok_ptr = ffi.cast("int32_t *", ffi.from_buffer(arr)) if arr.size else ffi.NULL
        rows_flag = 1 if all_logits else 0
        if layers is None or layers.size == 0:
            _check(lib.ds4_session_eval(ptr, tok_ptr, arr.size, rows_flag, err), err)
        else:
            lay_ptr = ffi.cast("int64_t *", ffi.from_buffer(layers))
            _check(lib.ds4_session_eval_layers(ptr, tok_ptr, arr.size, rows_flag, lay_ptr,
                                               layers.size, err), err)
        logits = self._view(lib.ds4_session_logits, self.vocab_size)
        out = [logits if all_logits else logits[0]]
        if return_hidden:
            hidden = self._view(lib.ds4_session_hidden, self.hidden_size)
            out.append(hidden if all_logits else hidden[0])
        if layers is not None:
            lh = self._layer_view(layers.size, logits.shape[0])
            out.append(lh if all_logits else lh[0])
        return out[0] if len(out) == 1 else tuple(out)

    def _layer_view(self, n_layers: int, n_rows: int) -> np.ndarray:
        if n_layers == 0:
            out = np.zeros((n_rows, 0, self.hidden_size), dtype=np.float32)
        else:
            nr, nl = ffi.new("int64_t *"), ffi.new("int64_t *")
            p = lib.ds4_session_layer_hidden(self._ptr, nr, nl)
            rows, lay = int(nr[0]), int(nl[0])
            out = np.frombuffer(ffi.buffer(p, rows * lay * self.hidden_size * 4),
                                dtype=np.float32).reshape(rows, lay, self.hidden_size)
        out.flags.writeable = False
        return out

    def counters(self) -> dict:
        """Cumulative counts since the session was created (ds4.h
        ds4_counters): ``allocs`` and ``alloc_bytes``, every heap allocation
        the session made for itself (the decode path allocates only when a
        step enters a new KV page: one K and one V page per attention layer
        and one regrowth of the split-K partials); ``weight_bytes``, model
        weight bytes the forward pass read (per matmul job n_out x row_bytes,
        once per job however many tokens share it; one embedding row per
        token; the small F32 tensors of each layer once per chunk)."""
        c = ffi.new("ds4_counters *")
        lib.ds4_session_counters(self._live(), c)
        return {"allocs": int(c.allocs), "alloc_bytes": int(c.alloc_bytes),
                "weight_bytes": int(c.weight_bytes)}

    def _view(self, getter, width: int) -> np.ndarray:
        n = ffi.new("int64_t *")
        p = getter(self._ptr, n)
        rows = int(n[0])
        out = np.frombuffer(ffi.buffer(p, rows * width * 4), dtype=np.float32).reshape(rows, width)
        out.flags.writeable = False
        return out

    @property
    def n_past(self) -> int:
        """Tokens evaluated so far (the next token's position)."""
        return int(lib.ds4_session_n_past(self._live()))

    # -- lifetime ---------------------------------------------------------
    def close(self) -> None:
        """Free the session now (KV cache, states, threads). Results of its
        evals become invalid. Idempotent."""
        if self._ptr is not None:
            ptr, self._ptr = self._ptr, None
            ffi.release(ptr)

    @property
    def closed(self) -> bool:
        return self._ptr is None

    def _live(self):
        if self._ptr is None:
            raise ModelError("session is closed", lib.DS4_ERR_ARG)
        return self._ptr

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._ptr is None else f"n_past={self.n_past}"
        return f"<ds4py.Session {state}>"
