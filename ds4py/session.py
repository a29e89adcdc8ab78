"""Evaluating tokens with a loaded model.

    model = ds4py.load("model.gguf", precision="exact")
    with model.new_session() as s:
        last = s.eval([11, 22, 33])                  # float32 [vocab]: the last row
        rows = s.eval([44, 55], all_logits=True)     # float32 [2, vocab]
        logits, hidden = s.eval([66], return_hidden=True)
        logits, layers = s.eval([77], hidden_layers=[0, 2])   # layers: [2, hidden]
        s.n_past                                     # 7
        s.counters()        # {"allocs": ..., "alloc_bytes": ..., "weight_bytes": ...}

        snap = s.snapshot()                          # cheap: shares the KV pages
        s.eval([1, 2, 3])
        s.restore(snap)                              # back at n_past 7, any number of times
        s.last_logits()                              # the row of position 6 again

        rows = s.verify([5, 6, 7, 8])                # float32 [4, vocab], one batch
        s.accept(2)                                  # as if only [5, 6] had been evaluated
        s.n_past                                     # 9

A session is one sequence: its KV cache pages, the recurrent (GDN) states and
its position live in the C core (csrc/session.c, csrc/forward/). Each
``eval`` appends its tokens after ``n_past`` and runs them as one batch; the
results do not depend on how a prompt is split into evals, nor on the thread
count (batch invariance, DESIGN.md).

Lifetime of results
  ``eval`` and ``verify`` return read-only numpy **views** of buffers the
  session owns (no copy). They stay valid until the next ``eval``,
  ``verify`` or ``restore`` on this session or its ``close()`` (``accept``
  keeps them: a verify's rows stay readable after it); after that they may
  show other rows or freed memory. Keep a result with ``np.array(x)`` (a
  copy).

Snapshots (csrc/session.c)
  ``snapshot()`` captures the whole state: position, KV pages (shared with
  the session, reference counted, copy-on-write: only the page the session
  writes next is ever copied), the GDN conv and recurrent states (copied),
  the nextn head's KV when the model has a head, and the last result row.
  ``restore(snap)`` puts a session (this one or another session of the same
  Model) back exactly there: what follows is bit-identical to a fresh
  evaluation of the same tokens, and ``last_logits()``/``last_hidden()``
  show the snapshot's last row. A snapshot stays valid and unchanged while
  sessions move on, can be restored any number of times, and frees its
  memory when garbage-collected or ``close()``d.

Verify / accept (speculative decoding)
  ``verify(tokens)`` evaluates 1..16 tokens (``VERIFY_MAX``) as one batch
  and returns the logits of every row, bit-identical to evaluating them one
  at a time. ``accept(k)`` (1 <= k <= n) then leaves the session exactly as
  if only the first k tokens had been evaluated (``n_past`` = before + k,
  ``last_logits()`` is row k-1). Accept applies to the last verify, until
  the next eval, verify, restore or accept; an ``eval`` right after a
  verify keeps all its rows. Rollback keeps, per verified row, the inputs of
  the GDN state updates and replays k of them on accept (not a state per
  row); ``rollback_bytes`` gives the figures.

Head priming (speculative decoding with the nextn head; csrc/session.c)
  ``session.nextn_prime = True`` (or ``model.new_session(nextn_prime=True)``)
  is the one admission decision for drafting with the model's nextn head,
  prefill and decode alike: from then on every row the trunk commits reaches
  the head's KV inside the same core call, batched and KV-only (no head
  logits are computed for primed rows): an ``eval`` primes its rows chunk by
  chunk, a ``verify``'s rows reach the head at ``accept(k)`` (the k accepted
  rows, one call) or, when no accept follows, at the next ``eval`` or
  ``snapshot``. The head then always holds positions ``[1, n_past)``, what a
  draft at ``n_past`` needs (``nextn_covered``), bit for bit what priming the
  same rows one at a time gives. Turning it on is refused (ModelError) once
  the session holds tokens the head never saw, so drafting can never start
  from a history with a gap; a snapshot carries the head's KV and the last
  hidden row, and restoring one whose head lacks that history
  (``Snapshot.nextn_covered`` False) into a priming session is refused.

Errors
  :class:`ds4py.ModelError` (carrying the core's message and ``.code``): no
  tokens, a token id outside ``[0, vocab_size)``, a prompt that does not fit
  (``"prompt of N tokens does not fit: n_past P + N > n_ctx C"``), a
  ``hidden_layers`` entry that is not a trunk layer, a closed session or
  model; verify of 0 or more than 16 tokens; accept without a verify to
  accept or with k outside 1..n; restore of a snapshot from another model's
  session, or of something that is not a live Snapshot. A failed call
  leaves the session unchanged.

The session holds the C model alive (see ds4py.model, Lifetime), so closing
the Model first is safe.
"""

from __future__ import annotations

import numpy as np

from ._core import ffi, lib, new_error
from .errors import ModelError

__all__ = ["Session", "Snapshot", "VERIFY_MAX", "rollback_bytes", "kv_live_pages"]

VERIFY_MAX = int(lib.DS4_VERIFY_MAX)

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


def rollback_bytes(*, n_gdn_layers: int, conv_kernel: int, ssm_state_size: int,
                   ssm_n_key_heads: int, ssm_n_value_heads: int) -> dict:
    """What verify keeps for rollback on a model of this GDN shape (computed
    by the core, nothing allocated): ``per_row``, bytes per verified row;
    ``per_state``, bytes of one full recurrent state (kept once per session
    as the replay's base; keeping a state per row instead would cost this
    much per row). Arguments are ModelConfig's names."""
    c = ffi.new("ds4_model_config *")
    c.ssm_conv_kernel = conv_kernel
    c.ssm_d_state = ssm_state_size
    c.ssm_n_k = ssm_n_key_heads
    c.ssm_n_v = ssm_n_value_heads
    c.ssm_d_inner = ssm_n_value_heads * ssm_state_size
    row, state = ffi.new("uint64_t *"), ffi.new("uint64_t *")
    lib.ds4_rollback_bytes(c, n_gdn_layers, row, state)
    return {"per_row": int(row[0]), "per_state": int(state[0])}


def kv_live_pages() -> int:
    """KV pages (K and V counted apart) alive in this process, in all
    sessions and snapshots together (each page is freed by its last holder)."""
    return int(lib.ds4_kv_live_pages())


class Snapshot:
    """A session's state at one point (:meth:`Session.snapshot`); restore it
    with :meth:`Session.restore`. ``n_past``: its position; ``nbytes``: the
    memory it holds itself (recurrent states, last row, page table), not the
    KV pages it shares."""

    def __init__(self, ptr, model_ptr):
        # The destructor closes over the model pointer: the model (whose
        # identity restore checks) outlives every snapshot of it.
        self._ptr = ffi.gc(ptr, lambda p, _m=model_ptr: lib.ds4_snapshot_free(p))
        self._model_ptr = model_ptr
        self.n_past = int(lib.ds4_snapshot_n_past(ptr))
        self.nbytes = int(lib.ds4_snapshot_bytes(ptr))
        # the head holds [1, n_past) and the last hidden row is kept: a
        # session with head priming on may restore it (module doc)
        self.nextn_covered = bool(lib.ds4_snapshot_nextn_covered(ptr))

    def close(self) -> None:
        """Free the snapshot now (its references to KV pages too). Idempotent."""
        if self._ptr is not None:
            ptr, self._ptr = self._ptr, None
            ffi.release(ptr)

    @property
    def closed(self) -> bool:
        return self._ptr is None

    def __repr__(self) -> str:
        state = "closed" if self._ptr is None else f"n_past={self.n_past}"
        return f"<ds4py.Snapshot {state}>"


class Session:
    """One sequence being evaluated. Create with ``Model.new_session()``."""

    def __init__(self, model, nextn_prime: bool = False):
        model_ptr = model._live()
        pp = ffi.new("ds4_session **")
        err = new_error()
        _check(lib.ds4_session_new(model_ptr, pp, err), err)
        # The destructor closes over the model pointer, so the C model cannot
        # be freed before this session is (ffi.gc order is otherwise unspecified).
        self._ptr = ffi.gc(pp[0], lambda p, _m=model_ptr: lib.ds4_session_free(p))
        self._model_ptr = model_ptr
        self.vocab_size = model.config.vocab_size
        self.hidden_size = model.config.hidden_size
        if nextn_prime:
            self.nextn_prime = True

    # -- nextn head priming (module doc) ------------------------------------
    @property
    def nextn_prime(self) -> bool:
        """Head priming on (module doc, Head priming)."""
        return bool(lib.ds4_session_nextn_prime(self._live()))

    @nextn_prime.setter
    def nextn_prime(self, on: bool) -> None:
        if not isinstance(on, (bool, np.bool_)):
            raise ModelError(f"nextn_prime must be a bool, got {on!r}", lib.DS4_ERR_ARG)
        err = new_error()
        _check(lib.ds4_session_set_nextn_prime(self._live(), 1 if on else 0, err), err)

    @property
    def nextn_covered(self) -> bool:
        """The nextn head holds every row a draft at ``n_past`` needs
        (positions ``[1, n_past)``); False for a model without a head."""
        return bool(lib.ds4_session_nextn_covered(self._live()))

    def nextn_catch_up(self) -> int:
        """Give the head the committed rows still waiting for it (module doc,
        Head priming) now, in one batched call; returns how many. Nothing
        observable changes (the head reads as caught up either way): it
        moves that work out of the next draft or verify, which a caller
        timing its rounds (ds4py.spec.runner) wants."""
        return int(lib.ds4_session_nextn_catch_up(self._live()))

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

    # -- speculative verification -----------------------------------------
    def verify(self, tokens, return_hidden: bool = False, hidden_layers=None):
        """Evaluate 1..VERIFY_MAX ``tokens`` after the current position as one
        batch; returns float32 ``[n, vocab]`` logits of every row (views, as
        eval), bit-identical to evaluating the tokens one at a time.
        ``return_hidden`` / ``hidden_layers`` add ``[n, hidden]`` /
        ``[n, len(hidden_layers), hidden]`` as in :meth:`eval`. Follow with
        :meth:`accept`; without one (an eval next) all n rows stay."""
        ptr = self._live()
        arr = _as_tokens(tokens)
        layers = None if hidden_layers is None else _as_layers(hidden_layers)
        err = new_error()
        tok_ptr = ffi.cast("int32_t *", ffi.from_buffer(arr)) if arr.size else ffi.NULL
        n_layers = 0 if layers is None else layers.size
        lay_ptr = ffi.cast("int64_t *", ffi.from_buffer(layers)) if n_layers else ffi.NULL
        _check(lib.ds4_session_verify(ptr, tok_ptr, arr.size, lay_ptr, n_layers, err), err)
        out = [self._view(lib.ds4_session_logits, self.vocab_size)]
        if return_hidden:
            out.append(self._view(lib.ds4_session_hidden, self.hidden_size))
        if layers is not None:
            out.append(self._layer_view(layers.size, out[0].shape[0]))
        return out[0] if len(out) == 1 else tuple(out)

    def accept(self, k: int) -> None:
        """Keep the first ``k`` rows (1 <= k <= n) of the last verify: the
        session is then exactly as if only those tokens had been evaluated
        (``n_past`` = before + k; ``last_logits()`` / ``last_hidden()`` show
        row k-1)."""
        ptr = self._live()
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise ModelError(f"accept(k): k must be an int, got {k!r}", lib.DS4_ERR_ARG)
        k = int(k)
        if not -(2**63) <= k < 2**63:
            raise ModelError(f"accept({k}): k is out of range", lib.DS4_ERR_ARG)
        err = new_error()
        _check(lib.ds4_session_accept(ptr, k, err), err)

    # -- snapshots --------------------------------------------------------
    def snapshot(self) -> Snapshot:
        """The session's whole state now (module doc, Snapshots)."""
        ptr = self._live()
        pp = ffi.new("ds4_snapshot **")
        err = new_error()
        _check(lib.ds4_session_snapshot(ptr, pp, err), err)
        return Snapshot(pp[0], self._model_ptr)

    def restore(self, snap: Snapshot) -> None:
        """Put this session back at ``snap`` (taken from any session of the
        same Model). The snapshot stays valid."""
        ptr = self._live()
        if not isinstance(snap, Snapshot):
            raise ModelError(f"restore needs a Snapshot, got {type(snap).__name__}",
                             lib.DS4_ERR_ARG)
        if snap._ptr is None:
            raise ModelError("snapshot is closed", lib.DS4_ERR_ARG)
        err = new_error()
        _check(lib.ds4_session_restore(ptr, snap._ptr, err), err)

    def last_logits(self):
        """float32 ``[vocab]`` logits of the last evaluated position
        (``n_past - 1``), or None before any eval (view; lifetime as eval's)."""
        rows = self._view(lib.ds4_session_logits, self.vocab_size, live=True)
        return rows[-1] if rows.shape[0] else None

    def last_hidden(self):
        """float32 ``[hidden]`` post-final-norm hidden of the last evaluated
        position, or None before any eval."""
        rows = self._view(lib.ds4_session_hidden, self.hidden_size, live=True)
        return rows[-1] if rows.shape[0] else None

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

    def _view(self, getter, width: int, live: bool = False) -> np.ndarray:
        n = ffi.new("int64_t *")
        p = getter(self._live() if live else self._ptr, n)
        rows = int(n[0])
        if rows == 0:
            out = np.zeros((0, width), dtype=np.float32)
        else:
            out = np.frombuffer(ffi.buffer(p, rows * width * 4),
                                dtype=np.float32).reshape(rows, width)
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
