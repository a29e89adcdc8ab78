"""DFlash drafting: a separate small draft model that reads the target's
hidden states at a few tapped trunk layers and proposes a block of tokens
in one pass (contract: csrc/forward/dflash.h; PyTorch reference:
training/dflash_model.py).

    model = ds4py.load("target.gguf")
    drafter = DFlashDrafter.load(model, "drafter.gguf")   # refused if unsupported
    s = drafter.session(model.session())   # a Session whose evals feed the drafter
    run = SpecRunner(model, s, Policy(...), drafter)       # ds4py.spec, unchanged
    ...

The drafter's context is the target's residual stream after its tapped
layers at every committed position; the core keeps it as a persistent
per-layer KV (``ds4_dflash_ctx``). Committed rows reach it through
:class:`TapSession`, a thin wrapper of the target :class:`~ds4py.Session`
that asks every eval and verify for the tapped layers' rows:

* ``eval(tokens)``: all the rows' taps enter the tap history (so it needs
  every row's taps: the eval runs with all rows kept and returns what the
  caller asked for); ``step(token)`` is the plain decode step's fast form;
* the context follows the history lazily: ``sync()`` computes the context
  rows it lacks in batched calls, and the drafter calls it before every
  propose and at admission (``LAZY_CONTEXT``: a run of plain rounds then
  costs a tap copy per token, not a context row);
* ``verify(tokens)`` keeps the taps aside; ``accept(k)`` adds the first k
  rows (one batched call); an eval right after a verify (which keeps all
  rows, Session.verify) adds them all first;
* ``snapshot()`` records the taps of the snapshot's whole history next to
  it (a view of the session's tap history, shared, never written again:
  the history is copied before a restored session writes into it), and
  ``restore(snapshot)`` rebuilds the context from them in one batched
  ``ctx.add`` (or just truncates it when the session's own context already
  holds that history), so a prefix-cache hit keeps drafting; the context
  is then bit-identical to one built by a fresh evaluation (context rows
  depend on their taps and position only). A snapshot taken elsewhere
  carries no taps: the session is then not drafting-ready until
  :meth:`TapSession.rebuild` re-evaluates the prefix for its taps (what
  ds4py.generate does with a prefix-cache hit) -- ``admit`` says why
  otherwise. Exactness never depends on any of it. A PrefixCache charges
  the recorded taps (n_taps x n_embd floats a position) to its budget, each
  shared history buffer once (:func:`snapshot_tap_buffer`).

Rejected drafts never enter the context, so rollback is "context = committed
positions" (``DFlashContext.truncate`` for anything else).

A block is [last, MASK x (B-1)] at positions P..P+B-1; it gives B-1 drafts.
``propose(state, k)`` returns the first k of them; for k > B-1 (a caller
that ignores ``max_depth``) the block's last draft is repeated, which the
verify rejects at worst. Greedy output is exact whatever the drafter says.
"""

from __future__ import annotations

import os
import threading
import weakref
from dataclasses import dataclass

import numpy as np

from ._core import ffi, lib, new_error
from .errors import GGUFError, ModelError
from .spec.drafter import Drafter, DraftError, DraftState

__all__ = ["DFlashConfig", "DFlash", "DFlashContext", "DFlashDrafter", "TapSession",
           "attach_dflash", "load"]

_IDLE_LOCK = threading.Lock()  # DFlash.context / recycle (server threads)
# Snapshot -> (tap layers, taps [n_past, n_taps, n_embd]) of the snapshot's
# history, recorded by TapSession.snapshot (weak: it goes with the snapshot).
_SNAPSHOT_TAPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# Prompt rows per eval when only the last row's logits are wanted: every
# row's taps are needed, so the eval keeps every row's logits too; pieces
# bound that to PIECE x vocab floats (batch invariance: same results).
PIECE = 256
# The context is brought up to date lazily (TapSession.sync): committed rows
# go to the tap history only, and the context KV is computed for all the rows
# it lacks in one batched call when a propose needs it (context rows depend
# only on their taps and positions: any split gives the same bits). A run of
# plain rounds, where the policy does not draft, then costs a tap copy per
# token instead of a context row (measured on the demo model, 1 thread: a
# plain step 1.224 ms, with taps 1.273, with a context row 1.339).
LAZY_CONTEXT = True


def snapshot_tap_buffer(snap) -> np.ndarray | None:
    """The array holding ``snap``'s recorded taps (None: it carries none).
    The snapshots of one history share it (they record views of it), so a
    memory account charges each distinct buffer once (ds4py.cache)."""
    rec = _SNAPSHOT_TAPS.get(snap)
    if rec is None:
        return None
    taps = rec[1]
    return taps if taps.base is None else taps.base


def _check(status: int, err) -> None:
    if status != lib.DS4_OK:
        msg = ffi.string(err.message).decode("utf-8", "replace")
        raise ModelError(msg, int(status))


@dataclass(frozen=True)
class DFlashConfig:
    version: int
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    block_size: int
    target_layers: tuple[int, ...]   # 0-based trunk layers (version 0 files shifted)
    mask_token_id: int
    rms_eps: float
    rope_base: float


class DFlash:
    """A DFlash drafter file bound to a target model (the core keeps a
    reference-free pointer to the target, so this object holds the target
    alive)."""

    def __init__(self, model, path: str | os.PathLike):
        bpath = os.fsencode(path)
        if b"\0" in bpath:
            raise GGUFError(f"path {os.fsdecode(bpath)!r} contains a NUL byte", lib.DS4_ERR_ARG)
        self.model = model
        self._model_ptr = model._live()
        self.path = os.fsdecode(bpath)
        pp = ffi.new("ds4_dflash **")
        err = new_error()
        _check(lib.ds4_dflash_load(bpath, self._model_ptr, pp, err), err)
        self._ptr = ffi.gc(pp[0], lib.ds4_dflash_free)
        c = ffi.new("ds4_dflash_config *")
        lib.ds4_dflash_get_config(self._ptr, c)
        self.config = DFlashConfig(
            int(c.version), int(c.n_layer), int(c.n_embd), int(c.n_ff), int(c.n_head),
            int(c.n_head_kv), int(c.head_dim), int(c.block_size),
            tuple(int(c.target_layers[i]) for i in range(c.n_taps)), int(c.mask_token_id),
            float(c.rms_eps), float(c.rope_base))

    # Contexts of finished drafters kept for the next one: a new context
    # costs a thread pool and its buffers (3.3 ms on the demo drafter, 2
    # threads: 4 plain steps of the demo target, paid by every generate()
    # call). A recycled context is truncated to 0 rows, so it holds nothing
    # of its last user. At most IDLE_CONTEXTS are kept (the server's
    # parallel slots each hold one while drafting).
    IDLE_CONTEXTS = 4

    def context(self) -> DFlashContext:
        """A context with no rows: a recycled one if a finished drafter left
        one (:meth:`recycle`), else a new one."""
        with _IDLE_LOCK:
            idle = self.__dict__.setdefault("_idle", [])
            ctx = idle.pop() if idle else None
        if ctx is None:
            return DFlashContext(self)
        ctx.truncate(0)
        return ctx

    def recycle(self, ctx: DFlashContext) -> None:
        """Take back the context of a drafter that is gone."""
        with _IDLE_LOCK:
            idle = self.__dict__.setdefault("_idle", [])
            if len(idle) < self.IDLE_CONTEXTS:
                idle.append(ctx)

    def __repr__(self) -> str:
        c = self.config
        return (f"<ds4py.DFlash {self.path!r} layers={c.n_layer} block={c.block_size} "
                f"taps={list(c.target_layers)}>")


class DFlashContext:
    """The drafter's persistent context KV for one target session."""

    def __init__(self, dflash: DFlash):
        self.dflash = dflash
        pp = ffi.new("ds4_dflash_ctx **")
        err = new_error()
        _check(lib.ds4_dflash_ctx_new(dflash._ptr, pp, err), err)
        self._ptr = ffi.gc(pp[0], lib.ds4_dflash_ctx_free)
        self._drafts = np.zeros(dflash.config.block_size - 1, dtype=np.int32)

    @property
    def n(self) -> int:
        """Context rows held: positions [0, n)."""
        return int(lib.ds4_dflash_ctx_n(self._ptr))

    def add(self, taps, pos0: int) -> None:
        """Rows at pos0.. from taps [n, n_taps, n_embd] (Session's
        ``hidden_layers`` rows); rows from pos0 on are replaced."""
        c = self.dflash.config
        arr = np.ascontiguousarray(taps, dtype=np.float32)
        if arr.ndim != 3 or arr.shape[1:] != (len(c.target_layers), c.n_embd):
            raise ModelError(f"DFlash taps must be [n, {len(c.target_layers)}, {c.n_embd}], "
                             f"got {arr.shape}", lib.DS4_ERR_ARG)
        err = new_error()
        p = ffi.cast("float *", ffi.from_buffer(arr)) if arr.size else ffi.NULL
        _check(lib.ds4_dflash_ctx_add(self._ptr, p, int(pos0), arr.shape[0], err), err)

    def truncate(self, n: int) -> None:
        err = new_error()
        _check(lib.ds4_dflash_ctx_truncate(self._ptr, int(n), err), err)

    def propose(self, anchor: int, pos: int, n: int | None = None) -> tuple[list[int], np.ndarray]:
        """The block at pos (== n) after the committed token ``anchor``:
        (the first ``n`` drafts (default all B-1), their logits [n, vocab] --
        a view valid until the next propose). Only those n rows pay for the
        LM head."""
        n = self.dflash.config.block_size - 1 if n is None else int(n)
        err = new_error()
        _check(lib.ds4_dflash_propose_n(self._ptr, int(anchor), int(pos), n,
                                        ffi.cast("int32_t *", ffi.from_buffer(self._drafts)),
                                        err), err)
        rows = ffi.new("int64_t *")
        lp = lib.ds4_dflash_logits(self._ptr, rows)
        V = self.dflash.model.config.vocab_size
        buf = ffi.buffer(lp, int(rows[0]) * V * 4)
        logits = np.frombuffer(buf, dtype=np.float32).reshape(int(rows[0]), V)
        return [int(x) for x in self._drafts[:n]], logits


class TapSession:
    """A target Session whose evals and verifies feed a DFlash context (module
    doc). Everything else is the wrapped session's."""

    def __init__(self, session, drafter: DFlashDrafter):
        self._s = session
        self._d = drafter
        self._pending: tuple[int, np.ndarray] | None = None  # (pos0, verify taps)
        # the taps of positions [0, _len): the context's source (module doc)
        self._hist: np.ndarray | None = None
        self._len = 0
        self._owned = False     # _hist may be written past _len (no snapshot shares it)
        self.valid = session.n_past == 0  # the context holds the whole history
        if self.valid:
            drafter.ctx.truncate(0)
        # step(): one-token evals straight through the C API (ds4py.spec.stepper's reasons)
        self._layers = np.ascontiguousarray(list(drafter.tap_layers), dtype=np.int64)
        self._lay_p = ffi.cast("int64_t *", ffi.from_buffer(self._layers))
        self._tok = ffi.new("int32_t[1]")
        self._err = new_error()
        self._nr, self._nl = ffi.new("int64_t *"), ffi.new("int64_t *")
        self._vocab = session.vocab_size
        self._tap_shape = (1, len(self._layers), drafter.dflash.config.n_embd)
        self._tap_bytes = 4 * len(self._layers) * drafter.dflash.config.n_embd
        self._ctx_ptr = drafter.ctx._ptr
        self._lp = self._lg = None  # step()'s cached buffer addresses and views
        self._taps_view = self._logits_view = None
        # a GPU session (ds4py.gpu_backend.GpuSession) has no C session for
        # step()'s direct calls: its steps go through eval(hidden_layers=)
        from .session import Session

        self._cpu = isinstance(session, Session)

    def __getattr__(self, name):
        return getattr(self._s, name)

    @property
    def stepper(self) -> TapSession:
        """What ds4py.spec's runner uses for plain (depth-0) steps: this
        session itself, so a plain step's taps reach the context too (the
        runner's default Stepper calls the core directly)."""
        return self

    def step(self, token: int):
        """One plain decode step (the runner's stepper): logits [vocab] of
        ``token``, its taps into the history. As eval([token]), without its
        per-call conversions."""
        if self._pending is not None:
            self._flush()
        if not self._cpu:
            return self._eval([int(token)], False, False, None)
        ptr = self._s._live()
        p0 = lib.ds4_session_n_past(ptr)
        self._tok[0] = token
        status = lib.ds4_session_eval_layers(ptr, self._tok, 1, 0, self._lay_p,
                                             self._layers.size, self._err)
        if status:
            raise ModelError(ffi.string(self._err.message).decode("utf-8", "replace"),
                             int(status))
        # the session's tap and logits buffers move only when they grow: the
        # numpy views are rebuilt then (a view per step costs ~10 us of
        # Python, ~1% of a demo-model step, as does np.prod of the shape)
        lp = lib.ds4_session_layer_hidden(ptr, self._nr, self._nl)
        if lp != self._lp:
            self._lp = lp
            self._taps_view = np.frombuffer(ffi.buffer(lp, self._tap_bytes),
                                            dtype=np.float32).reshape(self._tap_shape)
        h = self._hist
        if (self.valid and self._owned and h is not None and p0 == self._len
                and p0 < h.shape[0] and lib.ds4_dflash_ctx_n(self._ctx_ptr) <= p0):
            h[p0] = self._taps_view[0]   # _add's common case: append one row
            self._len = p0 + 1
            if not LAZY_CONTEXT:
                self.sync()
        else:
            self._add(self._taps_view, p0)
        lg = lib.ds4_session_logits(ptr, self._nr)
        if lg != self._lg:
            self._lg = lg
            out = np.frombuffer(ffi.buffer(lg, self._vocab * 4), dtype=np.float32)
            out.flags.writeable = False
            self._logits_view = out
        return self._logits_view

    @property
    def session(self):
        return self._s

    @property
    def n_past(self) -> int:
        return self._s.n_past

    @property
    def nextn_prime(self) -> bool:
        return self._s.nextn_prime

    @nextn_prime.setter
    def nextn_prime(self, on: bool) -> None:
        self._s.nextn_prime = on

    # -- the context and its tap history ---------------------------------------
    def _add(self, taps: np.ndarray, pos0: int) -> None:
        """History rows at pos0.. from ``taps``; the context follows lazily
        (:meth:`sync`, LAZY_CONTEXT)."""
        if not self.valid:
            return
        ctx = self._d.ctx
        if ctx.n > pos0:
            ctx.truncate(pos0)   # rows from pos0 on are replaced
        n = taps.shape[0]
        end = pos0 + n
        h = self._hist
        if h is None or not self._owned or pos0 < self._len or end > h.shape[0]:
            # a fresh buffer: the old one may be shared with snapshots
            cap = max(2 * end, 64)
            new = np.empty((cap, *taps.shape[1:]), dtype=np.float32)
            if pos0:
                new[:pos0] = h[:pos0]
            self._hist, self._owned, h = new, True, new
        h[pos0:end] = taps
        self._len = end
        if not LAZY_CONTEXT:
            self.sync()

    def sync(self) -> None:
        """The context catches up with the tap history: the rows it lacks,
        in batched calls of up to PIECE rows."""
        if not self.valid:
            return
        ctx = self._d.ctx
        n = ctx.n
        while n < self._len:
            m = min(self._len, n + PIECE)
            ctx.add(self._hist[n:m], n)
            n = m

    def _adopt(self, taps: np.ndarray) -> None:
        """The context becomes the history ``taps`` (positions [0, n))."""
        n = taps.shape[0]
        ctx = self._d.ctx
        h = self._hist
        same = (self.valid and h is not None and self._len >= n
                and (h.__array_interface__["data"][0] == taps.__array_interface__["data"][0]
                     or np.array_equal(h[:n], taps)))
        if same:
            if ctx.n > n:
                ctx.truncate(n)  # what the context holds of [0, n) is this history's
        else:
            ctx.truncate(0)
        self._hist, self._len, self._owned, self.valid = taps, n, False, True
        if not LAZY_CONTEXT:
            self.sync()

    def _flush(self) -> None:
        if self._pending is not None:
            pos0, taps = self._pending
            self._pending = None
            self._add(taps, pos0)

    # -- evaluation ------------------------------------------------------------
    def eval(self, tokens, all_logits: bool = False, return_hidden: bool = False,
             hidden_layers=None):
        self._flush()
        toks = tokens if isinstance(tokens, np.ndarray) else list(tokens)
        if all_logits or len(toks) <= PIECE:
            return self._eval(toks, all_logits, return_hidden, hidden_layers)
        last = (len(toks) - 1) // PIECE * PIECE  # the last piece's start
        for i in range(0, last, PIECE):
            self._eval(toks[i:i + PIECE], False, False, None)
        return self._eval(toks[last:], False, return_hidden, hidden_layers)

    def _eval(self, tokens, all_logits, return_hidden, hidden_layers):
        taps = list(self._d.tap_layers)
        extra = [] if hidden_layers is None else list(hidden_layers)
        p0 = self._s.n_past
        out = self._s.eval(tokens, all_logits=True, return_hidden=return_hidden,
                           hidden_layers=taps + extra)
        logits, rest = out[0], list(out[1:])
        lh = rest.pop()
        self._add(lh[:, :len(taps)], p0)
        res = [logits if all_logits else logits[-1]]
        if return_hidden:
            h = rest.pop(0)
            res.append(h if all_logits else h[-1])
        if hidden_layers is not None:
            mine = lh[:, len(taps):]
            res.append(mine if all_logits else mine[-1])
        return res[0] if len(res) == 1 else tuple(res)

    def verify(self, tokens, return_hidden: bool = False, hidden_layers=None):
        self._flush()
        taps = list(self._d.tap_layers)
        extra = [] if hidden_layers is None else list(hidden_layers)
        p0 = self._s.n_past
        out = self._s.verify(tokens, return_hidden=return_hidden, hidden_layers=taps + extra)
        logits, rest = out[0], list(out[1:])
        lh = rest.pop()
        self._pending = (p0, np.array(lh[:, :len(taps)]))  # copy: the view dies at the next eval
        res = [logits]
        if return_hidden:
            res.append(rest.pop(0))
        if hidden_layers is not None:
            res.append(lh[:, len(taps):])
        return res[0] if len(res) == 1 else tuple(res)

    def accept(self, k: int) -> None:
        self._s.accept(k)
        if self._pending is not None:
            pos0, taps = self._pending
            self._pending = None
            self._add(taps[:int(k)], pos0)

    # -- snapshots -------------------------------------------------------------
    def snapshot(self):
        """The wrapped session's snapshot, with this history's taps recorded
        next to it (module doc)."""
        self._flush()  # a verify without accept keeps all its rows
        snap = self._s.snapshot()
        if self.valid and self._len == snap.n_past:
            h = self._hist
            taps = h[:self._len] if h is not None else np.zeros(
                (0, len(self._d.tap_layers), self._d.dflash.config.n_embd), np.float32)
            taps.flags.writeable = False
            _SNAPSHOT_TAPS[snap] = (tuple(self._d.tap_layers), taps)
        return snap

    def restore(self, snap) -> None:
        self._s.restore(snap)
        self._pending = None
        rec = _SNAPSHOT_TAPS.get(snap)
        n = self._s.n_past
        if n == 0:
            self.valid = True
            self._d.ctx.truncate(0)
            self._hist, self._len, self._owned = None, 0, False
        elif rec is not None and rec[0] == tuple(self._d.tap_layers) and rec[1].shape[0] == n:
            self._adopt(rec[1])
        else:
            self.valid = False  # a snapshot without taps: rebuild() or no drafting

    def rebuild(self, ids) -> None:
        """Make the context hold this session's history again from its token
        ids (positions [0, n_past)): a scratch session evaluates them for
        their taps (in pieces; batch invariance makes them the rows the
        session had), then one batched ``ctx.add``. Costs a prefill of the
        prefix; for sessions restored from a snapshot without taps."""
        n = self._s.n_past
        ids = [int(t) for t in ids]
        if len(ids) != n:
            raise ModelError(f"rebuild: {len(ids)} token ids for a session at {n}",
                             lib.DS4_ERR_ARG)
        taps = list(self._d.tap_layers)
        rows = []
        with self._d.model.new_session() as scratch:
            for i in range(0, n, PIECE):
                _, lh = scratch.eval(ids[i:i + PIECE], all_logits=True, hidden_layers=taps)
                rows.append(np.array(lh))
        self.valid = True
        self._hist, self._len, self._owned = None, 0, False
        self._adopt(np.concatenate(rows) if rows else np.zeros(
            (0, len(taps), self._d.dflash.config.n_embd), np.float32))

    def __repr__(self) -> str:
        return f"TapSession({self._s!r}, valid={self.valid})"


class DFlashDrafter(Drafter):
    """A DFlash drafter in ds4py.spec's interface. It needs no hidden rows
    from the loop (``needs_hidden`` False): its context comes from the
    :class:`TapSession` the run must use (``drafter.session(s)``)."""

    name = "dflash"
    needs_hidden = False

    def __init__(self, dflash: DFlash):
        self.dflash = dflash
        self.model = dflash.model
        self.tap_layers = dflash.config.target_layers
        self.block_size = dflash.config.block_size
        self.max_depth = self.block_size - 1  # drafts one pass can make
        self.ctx = dflash.context()
        # the context goes back to the DFlash when this drafter is collected
        # (ds4py.generate makes a drafter per call); the finalizer holds the
        # DFlash and the context, not the drafter
        weakref.finalize(self, dflash.recycle, self.ctx)
        self._bound: TapSession | None = None
        self.passes = 0

    @classmethod
    def load(cls, model, path: str | os.PathLike) -> DFlashDrafter:
        return cls(DFlash(model, path))

    def session(self, session) -> TapSession:
        """Wrap the target session this drafter drafts for (one at a time).
        A session that already holds tokens cannot draft (the context lacks
        their taps); start from an empty session."""
        self._bound = TapSession(session, self)
        return self._bound

    def attach(self, session) -> str | None:
        """Admission (ds4py.spec.drafter.Drafter.attach): None, or why not."""
        if not isinstance(session, TapSession) or session is not self._bound:
            return ("the DFlash drafter needs the session wrapped by drafter.session(s), "
                    "whose evals feed it the target's tapped layers")
        if session.valid:
            session.sync()
        if not session.valid:
            return ("the DFlash context does not hold this session's history (the session "
                    "held tokens before it was wrapped, or was restored from a snapshot "
                    "without taps; TapSession.rebuild(ids) restores it)")
        if self.ctx.n != session.n_past:
            return (f"the DFlash context holds [0, {self.ctx.n}) but the session is at "
                    f"{session.n_past}")
        return None

    admit = attach  # the interface's earlier name

    def finish(self, session) -> None:
        """Nothing to settle: the context follows the session's commits."""

    def propose(self, state: DraftState, k: int) -> list[int]:
        s = state.session
        if isinstance(s, TapSession):
            s._flush()
            s.sync()
        if self.ctx.n != state.position:
            raise DraftError(f"DFlash context holds [0, {self.ctx.n}); a block at "
                             f"{state.position} needs [0, {state.position})")
        drafts, _ = self.ctx.propose(state.last_token, state.position,
                                     max(1, min(k, self.max_depth)))
        self.passes += 1
        if k <= len(drafts):
            return drafts[:k]
        return drafts + [drafts[-1]] * (k - len(drafts))

    def __repr__(self) -> str:
        return f"DFlashDrafter({self.dflash.path!r}, block={self.block_size})"


def attach_dflash(model, path: str | os.PathLike) -> DFlash:
    """Load the DFlash drafter ``path`` for ``model`` and make it the model's
    drafter (``model.dflash``: ds4py.generate then drafts with it, under the
    pairing classifier's verdict). A file that is not a DFlash drafter for
    this target (a nextn head, a full model, another width, taps outside
    the trunk, ...) is refused by name before the core loads it."""
    from .spec.classifier import PairingError, check_dflash

    try:
        check_dflash(model.path, path)
    except PairingError as e:
        raise ModelError(f"dflash: {e}", lib.DS4_ERR_BAD_MODEL) from None
    d = DFlash(model, path)
    model.dflash = d
    return d


def load(path: str | os.PathLike, n_threads: int | None = None, n_ctx: int | None = None,
         precision: str = "fast", draft_head: str | os.PathLike | None = None,
         dflash: str | os.PathLike | None = None):
    """``ds4py.load``: :meth:`ds4py.Model.load` (see it for the arguments),
    plus ``dflash``: a DFlash drafter GGUF to draft with (attach_dflash).
    A nextn head and a DFlash drafter cannot both be given."""
    from .model import Model

    return open_with_dflash(lambda: Model.load(path, n_threads=n_threads, n_ctx=n_ctx,
                                               precision=precision, draft_head=draft_head),
                            draft_head, dflash)


def open_with_dflash(open_model, draft_head, dflash):
    """``open_model()``, then the DFlash drafter ``dflash`` attached (the
    model closed again when it is refused); ``draft_head`` and ``dflash``
    cannot both be given. The CPU's load and the GPU backend's share it."""
    if dflash is not None and draft_head is not None:
        raise ModelError("draft_head and dflash were both given: draft with one",
                         lib.DS4_ERR_ARG)
    model = open_model()
    if dflash is not None:
        try:
            attach_dflash(model, dflash)
        except BaseException:
            model.close()
            raise
    return model
