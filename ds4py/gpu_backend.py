"""GPU backends behind ``ds4py.load(..., backend=...)``.

    model = ds4py.load("model.gguf", backend="cuda")     # or "auto", "cpu", "gpu-emul"
    model.backend                                        # "cuda"
    g = ds4py.generate(model, "Hello", max_tokens=64, temperature=0)

Backends
  ``cpu`` (the default): the C core's forward pass, everything supported.
  ``cuda``: the GPU layer loop (gpu/host/runner.c, docs/gpu.md section 7) on
  NVIDIA GPU 0. ``gpu-emul``: the same loop and kernels as plain C under the
  threadgroup emulator (every access checked) -- a test/debug backend, slow
  (seconds per token even for the demo model). ``metal``: declared; its host
  is a later increment, so it is refused (on Linux: "macOS only").
  ``auto``: cuda when an NVIDIA GPU is present, the plugin builds and loads,
  the device opens and the GPU can run this model; else cpu.
  ``model.backend`` is the one chosen and ``model.backend_note`` why (auto).
  ``auto`` is not the default: the GPU session lacks features the CPU one
  has (below), so a GPU must be asked for.

The plugin
  A GPU backend is a shared library (gpu/host/plugin.h: the runner + the
  device + its own copy of the core) opened with cffi's ABI mode. It is
  compiled on first use (gpu/tools/build_plugin.py: nvcc for cuda, the C
  compiler for gpu-emul) into ``$DS4PY_CACHE_DIR`` (default
  ``~/.cache/ds4py``)``/gpu/``, keyed by a hash of the sources and the
  toolchain, so ``pip install`` needs no CUDA. The sources are read from the
  checkout the package lives in (an editable install) or from
  ``ds4py/_native/``, where setup.py puts them in a wheel.

What a GPU session does (GpuSession): eval (last row or every row),
verify / accept (exact rollback), logits back to the host so sampling,
logprobs and stop strings are the CPU's Python code; snapshot / restore
(GpuSnapshot: the whole state copied on the device, the CPU session's
semantics) and so the prefix cache (``generate(..., cache=)``); the
post-final-norm hidden state (``eval(..., return_hidden=True)``,
``last_hidden()``); the model's nextn (MTP) head, bundled or a
``draft_head`` sidecar (gpu/host/runner_head.c: head priming,
``nextn_propose``, ``nextn_step``), so ``generate`` drafts with it as on the
CPU -- greedy, the exact seeded sampling mode or rejection sampling, the
same adaptive policy and pairing classifier; verify's ``return_hidden``
(every row's post-norm hidden state); layer taps (``hidden_layers`` on eval and verify: the residual
stream after chosen trunk layers), so a DFlash drafter (``dflash=FILE``)
drafts for a GPU target -- the drafter itself runs on the CPU side, fed the
device's taps through its TapSession. What it does not do yet,
refused with a ModelError naming it: precision="exact", weight types other
than Q8_0 / Q4_K / Q5_K / Q6_K / Q4_64A (Q4_64A: dense matrices only, not
routed experts).

Numerics: the GPU is not bit-identical to the CPU (docs/gpu.md section 7:
float V accumulation in attention, 1-ulp differences flipping Q8 activation
roundings); on the golden model its logits are within 0.5 of the CPU's.
Greedy speculative output equals serial output on the same backend, bit
for bit.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import threading

import numpy as np

from .errors import ModelError
from .model import Model

__all__ = ["BACKENDS", "GpuModel", "GpuSession", "GpuSnapshot", "load", "backend_of", "on_gpu",
           "plugin_path", "gpu_draft_plan"]

BACKENDS = ("auto", "cpu", "cuda", "metal", "gpu-emul")
# backend name -> plugin kind (gpu/tools/build_plugin.py KINDS)
_KIND = {"cuda": "cuda", "gpu-emul": "emul"}
ABI_VERSION = 6  # gpu/host/plugin.h DS4_GPU_ABI_VERSION this module calls
_ERR_CAP = 1024
# ds4_status codes (csrc/ds4.h) this module tells apart
_ERR_ARG, _ERR_NOMEM, _ERR_UNSUPPORTED, _ERR_BAD_MODEL, _ERR_INTERNAL = 2, 3, 4, 5, 26


def backend_of(model) -> str:
    """The backend a model runs on ("cpu" for a plain :class:`ds4py.Model`)."""
    return getattr(model, "backend", "cpu")


def on_gpu(model) -> bool:
    return backend_of(model) != "cpu"


# ------------------------------------------------------------ the plugin --

def source_root() -> str:
    """The directory holding ds4py's C sources (build_core.py, csrc/, gpu/,
    cuda/): ds4py/_native/ in a wheel (setup.py copies them there), else the
    checkout the package was installed from in editable mode."""
    pkg = os.path.dirname(os.path.abspath(__file__))
    for root in (os.path.join(pkg, "_native"), os.path.dirname(pkg)):
        if os.path.isfile(os.path.join(root, "gpu", "host", "plugin.h")) and \
                os.path.isfile(os.path.join(root, "build_core.py")):
            return root
    raise ModelError("the GPU backends are compiled on first use from ds4py's C sources "
                     "(csrc/, gpu/, cuda/), which this install does not carry: install ds4py "
                     "from a source checkout (`pip install -e .`) or a wheel built from one",
                     _ERR_UNSUPPORTED)


def cache_dir() -> str:
    base = os.environ.get("DS4PY_CACHE_DIR")
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "ds4py")
    return os.path.join(base, "gpu")


def _build_module(root: str):
    spec = importlib.util.spec_from_file_location(
        "_ds4py_build_plugin", os.path.join(root, "gpu", "tools", "build_plugin.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _log(msg: str) -> None:
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def plugin_path(kind: str) -> str:
    """The plugin .so for kind ("cuda" / "emul"), built now if this source
    version has none in the cache. ModelError names what is missing."""
    root = source_root()
    bp = _build_module(root)
    try:
        return bp.ensure(root, kind, cache_dir(), log=_log)
    except bp.BuildError as e:
        raise ModelError(f"cannot build the {kind} GPU plugin: {e}", _ERR_UNSUPPORTED) from None
    except OSError as e:
        raise ModelError(f"cannot build the {kind} GPU plugin in {cache_dir()}: {e} (set "
                         f"DS4PY_CACHE_DIR to a writable directory)", _ERR_UNSUPPORTED) from None


def _cdef(root: str) -> str:
    with open(os.path.join(root, "gpu", "host", "plugin.h")) as f:
        body = f.read().split("/* --- cffi reads from here on --- */", 1)[1]
    return "\n".join(ln for ln in body.splitlines()
                     if not ln.lstrip().startswith("#") or ln.lstrip().startswith("#define"))


class _Plugin:
    """One dlopen'ed plugin (kept for the process: sessions' destructors
    call into it)."""

    def __init__(self, kind: str, path: str, root: str):
        import cffi

        self.kind, self.path = kind, path
        self.ffi = cffi.FFI()
        self.ffi.cdef(_cdef(root))
        try:
            self.lib = self.ffi.dlopen(path)
        except OSError as e:
            raise ModelError(f"cannot load the {kind} GPU plugin {path}: {e}",
                             _ERR_UNSUPPORTED) from None
        v = int(self.lib.ds4_gpu_abi_version())
        if v != ABI_VERSION:
            raise ModelError(f"the GPU plugin {path} speaks ABI {v}, this ds4py {ABI_VERSION}",
                             _ERR_UNSUPPORTED)
        self.verify_max = int(self.lib.ds4_gpu_verify_max())

    def err(self):
        return self.ffi.new("char[]", _ERR_CAP)

    def message(self, err) -> str:
        return self.ffi.string(err).decode("utf-8", "replace")


_PLUGINS: dict[str, _Plugin] = {}
_PLUGINS_LOCK = threading.Lock()


def _plugin(kind: str) -> _Plugin:
    with _PLUGINS_LOCK:
        p = _PLUGINS.get(kind)
        if p is None:
            path = plugin_path(kind)
            p = _PLUGINS[kind] = _Plugin(kind, path, source_root())
        return p


def _nvidia_gpu_missing() -> str | None:
    """Why this machine has no NVIDIA GPU, or None when it seems to have one
    (checked before compiling anything: nvcc takes minutes)."""
    if any(os.path.exists(f"/dev/nvidia{i}") for i in range(16)):
        return None
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        import subprocess

        try:
            r = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
            if r.returncode == 0 and "GPU" in r.stdout:
                return None
        except (OSError, subprocess.TimeoutExpired):
            pass
    return "no NVIDIA GPU here (no /dev/nvidia* device, nvidia-smi lists none)"


def _open_plugin(backend: str) -> _Plugin:
    """The plugin of a GPU backend, its device probed. ModelError if not."""
    if backend == "cuda":
        why = _nvidia_gpu_missing()
        if why is not None:
            raise ModelError(f"backend 'cuda': {why}", _ERR_UNSUPPORTED)
    plug = _plugin(_KIND[backend])
    err = plug.err()
    if plug.lib.ds4_gpu_probe(err, _ERR_CAP) != 0:
        raise ModelError(f"backend {backend!r}: {plug.message(err)}", _ERR_UNSUPPORTED)
    return plug


# ------------------------------------------------------------- the model --

class GpuModel(Model):
    """A :class:`ds4py.Model` whose sessions run on a GPU backend. The CPU
    side keeps what is not math (config, tokenizer, tensors); the plugin
    holds its own mapping of the file and the weights on the device."""

    def __init__(self, ptr, path: str):
        super().__init__(ptr, path)
        self.backend = ""         # "cuda" / "gpu-emul", set by open()
        self.backend_note = ""
        self._plugin: _Plugin | None = None
        self._gpu = None          # ds4_gpu_model *, ffi.gc-managed
        self.device_bytes = 0     # weights on the device
        # kernel launches of the last step, kept apart so the DS4PY_PATHS
        # report can read it after the model is gone
        self._stats = {"launches": 0}

    @property
    def launches(self) -> int:
        """Kernel launches of the last eval/verify/step on any of its sessions."""
        return self._stats["launches"]

    @property
    def snapshot_bytes(self) -> int:
        """Device bytes held by the live snapshots of this model's sessions
        (each :attr:`GpuSnapshot.nbytes`; back to 0 when all are freed)."""
        return int(self._plugin.lib.ds4_gpu_model_snapshot_bytes(self._live_gpu()))

    @property
    def snapshots(self) -> int:
        """Live snapshots of this model's sessions."""
        return int(self._plugin.lib.ds4_gpu_model_snapshots(self._live_gpu()))

    @classmethod
    def open(cls, path, backend: str, plug: _Plugin, n_threads, n_ctx,
             draft_head=None) -> GpuModel:
        # The CPU side loads the draft_head too: its checks (a full model is
        # not a head, shapes, settings) run once more in the plugin's own
        # load, and model.draft_head / nextn_source feed the classifier.
        model = super().load(path, n_threads=n_threads, n_ctx=n_ctx, precision="fast",
                             draft_head=draft_head)
        try:
            pp = plug.ffi.new("ds4_gpu_model **")
            err = plug.err()
            head = plug.ffi.NULL if model.draft_head is None else os.fsencode(model.draft_head)
            status = plug.lib.ds4_gpu_model_open(os.fsencode(model.path), head, pp, err, _ERR_CAP)
            if status != 0:
                raise ModelError(f"backend {backend!r} cannot run {model.path!r}: "
                                 f"{plug.message(err)}", int(status))
        except BaseException:
            model.close()
            raise
        model.backend = backend
        model._plugin = plug
        model._gpu = plug.ffi.gc(pp[0], plug.lib.ds4_gpu_model_close)
        model.device_bytes = int(plug.lib.ds4_gpu_model_device_bytes(pp[0]))
        return model

    def close(self) -> None:
        """As :meth:`Model.close`; the device weights are freed once no
        session holds them either."""
        super().close()
        if self._gpu is not None:
            gpu, self._gpu = self._gpu, None
            self._plugin.ffi.release(gpu)

    def _live_gpu(self):
        self._live()
        if self._gpu is None:
            raise ModelError(f"model {self.path!r} is closed", _ERR_ARG)
        return self._gpu

    @property
    def nextn_on_gpu(self) -> bool:
        """The model's nextn head runs on the device (it has one and the
        GPU can run it)."""
        return bool(self._plugin.lib.ds4_gpu_model_has_nextn(self._live_gpu()))

    @property
    def nextn_refusal(self) -> str:
        """Why the model's nextn head (its file's, or the draft_head it was
        loaded with) does not run on the device ("" when it does or there
        is none)."""
        p = self._plugin.lib.ds4_gpu_model_nextn_refusal(self._live_gpu())
        return self._plugin.ffi.string(p).decode("utf-8", "replace") if p else ""

    def new_session(self, nextn_prime: bool = False) -> GpuSession:
        s = GpuSession(self)
        if nextn_prime:
            s.nextn_prime = True
        return s

    def _session_ptr(self, session):
        raise ModelError(f"this call needs a CPU session (the {self.backend} session drafts "
                         f"through GpuSession.nextn_propose)", _ERR_UNSUPPORTED)

    def __repr__(self) -> str:
        state = "closed" if self._ptr is None else f"n_ctx={self.n_ctx}"
        return f"<ds4py.Model {self.config.arch} {self.path!r} backend={self.backend} {state}>"


def _unsupported(backend: str, what: str) -> ModelError:
    return ModelError(f"{what} is not available on the {backend} backend yet (docs/gpu.md); "
                      f"use backend='cpu'", _ERR_UNSUPPORTED)


class _DeviceHandle:
    """close() / closed for an object whose device memory is freed through
    its cffi gc pointer ``_ptr`` (``self._ffi.release`` runs the plugin's
    free at once instead of at garbage collection)."""

    _ptr = None
    _ffi = None

    def close(self) -> None:
        """Free the device memory now. Idempotent."""
        if self._ptr is not None:
            ptr, self._ptr = self._ptr, None
            self._ffi.release(ptr)

    @property
    def closed(self) -> bool:
        return self._ptr is None


class GpuSnapshot(_DeviceHandle):
    """A GPU session's state at one point (:meth:`GpuSession.snapshot`), the
    CPU's :class:`ds4py.Snapshot` semantics: restore it into any session of
    the same model (:meth:`GpuSession.restore`), any number of times; what
    follows is bit-identical to a session that evaluated the same tokens.
    ``n_past``: its position; ``nbytes``: the device bytes it holds (it
    copies its KV pages: gpu/host/runner.c says why; the prefix cache
    charges exactly this). The device memory is freed when it is
    garbage-collected or closed (:meth:`close`); the plugin keeps the device
    model alive until then, whatever is closed first."""

    def __init__(self, session: GpuSession, ptr):
        lib, ffi = session._lib, session._ffi
        self.model = session.model
        self.backend = session.backend
        self._ptr = ffi.gc(ptr, lib.ds4_gpu_snapshot_free)
        self._ffi = ffi
        self.n_past = int(lib.ds4_gpu_snapshot_n_past(ptr))
        self.nbytes = int(lib.ds4_gpu_snapshot_device_bytes(ptr))
        self.has_logits = bool(lib.ds4_gpu_snapshot_has_logits(ptr))
        # it carries the nextn head's history (taken from a priming session
        # with no verify pending): a priming session restores only these
        self.nextn_covered = bool(lib.ds4_gpu_snapshot_nextn_covered(ptr))

    def __repr__(self) -> str:
        state = "closed" if self._ptr is None else f"n_past={self.n_past}"
        return f"<ds4py.GpuSnapshot {self.backend} {state}>"


class GpuSession(_DeviceHandle):
    """One sequence on a GPU backend: :class:`ds4py.Session`'s eval / verify /
    accept / snapshot / restore with the same arguments, results and
    lifetimes (read-only views, valid until the next eval, verify or restore
    on this session), the post-norm hidden state (eval's and verify's
    ``return_hidden``, :meth:`last_hidden`) and layer taps
    (``hidden_layers``). The nextn head:
    :attr:`nextn_prime`, :attr:`nextn_covered`, :meth:`nextn_propose`. A
    device failure (not a bad argument) leaves the session unusable."""

    def __init__(self, model: GpuModel):
        gpu = model._live_gpu()
        plug = model._plugin
        self._plug, self._lib, self._ffi = plug, plug.lib, plug.ffi
        self.model = model      # keeps the config, tokenizer and CPU-side model alive
        # the CPU-side model's pointer: the identity the prefix cache checks
        # (ds4py.cache PrefixCache.prefill), as on a CPU session
        self._model_ptr = model._live()
        self.backend = model.backend
        self.vocab_size = model.config.vocab_size
        self.hidden_size = model.config.hidden_size
        self._err = plug.err()
        self._stats = model._stats
        pp = self._ffi.new("ds4_gpu_session **")
        status = self._lib.ds4_gpu_session_new(gpu, model.n_ctx, pp, self._err, _ERR_CAP)
        if status != 0:
            raise ModelError(f"{self.backend}: {plug.message(self._err)}", int(status))
        self._ptr = self._ffi.gc(pp[0], self._lib.ds4_gpu_session_free)
        self._broken: str | None = None
        # results: rows of the last eval/verify; grown for all_logits evals
        self._rows = np.zeros((plug.verify_max, self.vocab_size), dtype=np.float32)
        self._n_rows = 0
        # last_logits(): row of _rows holding position n_past - 1; -1 none,
        # -2 chosen on the device (step_argmax), -3 on the device after a
        # restore (copied back on the first last_logits())
        self._last_row = -1
        self._tok1 = np.zeros(1, dtype=np.int32)
        self._tok1_p = self._ffi.cast("int32_t *", self._ffi.from_buffer(self._tok1))
        self._arg1 = np.zeros(1, dtype=np.int32)   # step_argmax's answer
        self._arg1_p = self._ffi.cast("int32_t *", self._ffi.from_buffer(self._arg1))
        self._rows_p = self._fptr(self._rows)
        self._step_view = self._ro(self._rows[0])
        # eval(return_hidden=True) rows, grown on demand; last_hidden()'s row
        self._hid = np.zeros((0, self.hidden_size), dtype=np.float32)
        self._hid1 = np.zeros(self.hidden_size, dtype=np.float32)
        self._hid1_p = self._fptr(self._hid1)

    # -- helpers ----------------------------------------------------------
    def _fptr(self, arr: np.ndarray):
        return self._ffi.cast("float *", self._ffi.from_buffer(arr))

    @staticmethod
    def _ro(arr: np.ndarray) -> np.ndarray:
        v = arr.view()
        v.flags.writeable = False
        return v

    def _live(self):
        if self._ptr is None:
            raise ModelError("session is closed", _ERR_ARG)
        if self._broken is not None:
            raise ModelError(f"session is unusable after a device error: {self._broken}",
                             _ERR_INTERNAL)
        return self._ptr

    def _check(self, status: int) -> None:
        if status == 0:
            return
        msg = self._plug.message(self._err)
        if status != _ERR_ARG:  # the runner left device state part-written
            self._broken = msg
        raise ModelError(f"{self.backend}: {msg}", int(status))

    def _tokens(self, tokens):
        from .session import _as_tokens

        arr = _as_tokens(tokens)
        if arr.size == 0:
            raise ModelError("no tokens to evaluate", _ERR_ARG)
        return arr, self._ffi.cast("int32_t *", self._ffi.from_buffer(arr))

    def _taps(self, hidden_layers, n: int):
        """(layers int64 array, a [n, len, hidden] buffer, its pointers) for
        ``hidden_layers`` (None: no taps)."""
        from .session import _as_layers

        if hidden_layers is None:
            return None, None, self._ffi.NULL, self._ffi.NULL
        layers = _as_layers(hidden_layers)
        buf = np.zeros((n, layers.size, self.hidden_size), dtype=np.float32)
        if layers.size == 0:
            return layers, buf, self._ffi.NULL, self._ffi.NULL
        return (layers, buf, self._ffi.cast("int64_t *", self._ffi.from_buffer(layers)),
                self._fptr(buf))

    # -- evaluation -------------------------------------------------------
    def eval(self, tokens, all_logits: bool = False, return_hidden: bool = False,
             hidden_layers=None):
        """As :meth:`ds4py.Session.eval`: float32 ``[vocab]`` logits of the
        last row, or ``[n, vocab]`` with ``all_logits``; with
        ``return_hidden`` also the post-final-norm hidden state of the same
        rows (``[hidden]`` or ``[n, hidden]``), as ``(logits, hidden)``;
        with ``hidden_layers`` also the residual stream after those trunk
        layers (layer taps: ``[len, hidden]`` or ``[n, len, hidden]``, last),
        what a DFlash drafter reads. Taps are taken from every row: an eval
        asking for them keeps every row's logits on the way."""
        ptr = self._live()
        arr, tok_p = self._tokens(tokens)
        if hidden_layers is not None and not all_logits:
            from .session import _as_layers

            if _as_layers(hidden_layers).size:  # taps need every row: compute all, keep the last
                return tuple(x[-1] for x in self.eval(arr, True, return_hidden, hidden_layers))
        layers, taps, lay_p, taps_p = self._taps(hidden_layers, arr.size)
        n = arr.size if all_logits else 1
        if n > self._rows.shape[0]:
            self._rows = np.zeros((n, self.vocab_size), dtype=np.float32)
            self._rows_p = self._fptr(self._rows)
            self._step_view = self._ro(self._rows[0])
        hid_p = self._ffi.NULL
        if return_hidden:
            if n > self._hid.shape[0]:
                self._hid = np.zeros((n, self.hidden_size), dtype=np.float32)
            hid_p = self._fptr(self._hid)
        self._check(self._lib.ds4_gpu_eval_taps(ptr, tok_p, arr.size, 1 if all_logits else 0,
                                                self._rows_p, self._ffi.NULL, hid_p, lay_p,
                                                0 if layers is None else layers.size, taps_p,
                                                self._err, _ERR_CAP))
        self._stats["launches"] = int(self._lib.ds4_gpu_launches(ptr))
        self._n_rows, self._last_row = n, n - 1
        rows = self._ro(self._rows[:n])
        out = [rows]
        if return_hidden:
            out.append(self._ro(self._hid[:n]))
        if layers is not None:
            out.append(self._ro(taps))
        if not all_logits:
            out = [x[0] for x in out]
        return out[0] if len(out) == 1 else tuple(out)

    def step(self, token: int) -> np.ndarray:
        """One decode step (ds4py.generate's loop): logits ``[vocab]`` of
        ``token`` evaluated after n_past, a view reused every step."""
        ptr = self._live()
        self._tok1[0] = token
        self._check(self._lib.ds4_gpu_eval(ptr, self._tok1_p, 1, 0, self._rows_p, self._ffi.NULL,
                                           self._err, _ERR_CAP))
        self._stats["launches"] = int(self._lib.ds4_gpu_launches(ptr))
        self._n_rows, self._last_row = 1, 0
        return self._step_view

    def step_argmax(self, token: int) -> int:
        """One greedy decode step with the choice made on the device: the id
        of the largest logit after ``token`` (ties to the lowest id, as
        ``int(logits.argmax())``), copying back 4 bytes, not the logits. A
        row holding a NaN raises ModelError, as the CPU loop does. The
        logits stay on the device: ``last_logits()`` raises until the next
        eval or verify."""
        ptr = self._live()
        self._tok1[0] = token
        self._check(self._lib.ds4_gpu_eval(ptr, self._tok1_p, 1, 0, self._ffi.NULL,
                                           self._arg1_p, self._err, _ERR_CAP))
        self._stats["launches"] = int(self._lib.ds4_gpu_launches(ptr))
        self._n_rows, self._last_row = 0, -2   # -2: the logits were not copied back
        t = int(self._arg1[0])
        if t < 0 or t >= self.vocab_size:    # K_ARGMAX_NAN / NONE (gpu/kernels/table.h)
            raise ModelError("the model produced NaN logits", _ERR_BAD_MODEL)
        return t

    def verify(self, tokens, return_hidden: bool = False, hidden_layers=None):
        """As :meth:`ds4py.Session.verify`: 1..VERIFY_MAX rows, logits of every
        row, equal to evaluating them one at a time on this backend; with
        ``return_hidden`` also every row's post-final-norm hidden state
        ``[n, hidden]`` and with ``hidden_layers`` the rows' layer taps
        ``[n, len, hidden]``, as ``(logits[, hidden][, taps])``."""
        ptr = self._live()
        arr, tok_p = self._tokens(tokens)
        if arr.size > self._plug.verify_max:
            raise ModelError(f"verify takes 1 to {self._plug.verify_max} tokens (got {arr.size})",
                             _ERR_ARG)
        layers, taps, lay_p, taps_p = self._taps(hidden_layers, arr.size)
        hid_p = self._ffi.NULL   # self._rows holds verify_max rows from the start
        if return_hidden:
            if arr.size > self._hid.shape[0]:
                self._hid = np.zeros((arr.size, self.hidden_size), dtype=np.float32)
            hid_p = self._fptr(self._hid)
        self._check(self._lib.ds4_gpu_verify_taps(ptr, tok_p, arr.size, self._rows_p,
                                                  self._ffi.NULL, hid_p, lay_p,
                                                  0 if layers is None else layers.size, taps_p,
                                                  self._err, _ERR_CAP))
        self._stats["launches"] = int(self._lib.ds4_gpu_launches(ptr))
        self._n_rows, self._last_row = arr.size, arr.size - 1
        out = [self._ro(self._rows[:arr.size])]
        if return_hidden:
            out.append(self._ro(self._hid[:arr.size]))
        if layers is not None:
            out.append(self._ro(taps))
        return out[0] if len(out) == 1 else tuple(out)

    def accept(self, k: int) -> None:
        """As :meth:`ds4py.Session.accept`: keep the first k rows of the last
        verify, exactly as k serial evals would leave the session."""
        ptr = self._live()
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise ModelError(f"accept(k): k must be an int, got {k!r}", _ERR_ARG)
        k = int(k)
        if not -(2**63) <= k < 2**63:
            raise ModelError(f"accept({k}): k is out of range", _ERR_ARG)
        self._check(self._lib.ds4_gpu_accept(ptr, k, self._err, _ERR_CAP))
        self._last_row = k - 1

    def last_logits(self):
        """float32 ``[vocab]`` logits of position ``n_past - 1`` (None before
        any eval); a view, lifetime as eval's. After :meth:`step_argmax` the
        logits were never copied back: ModelError."""
        ptr = self._live()
        if self._last_row == -2:
            raise ModelError("the last step chose its token on the device (step_argmax): "
                             "its logits were not copied back", _ERR_ARG)
        if self._last_row == -3:  # restored: the snapshot's row is on the device
            self._check(self._lib.ds4_gpu_last_logits(ptr, self._rows_p, self._err, _ERR_CAP))
            self._last_row = 0
        return None if self._last_row < 0 else self._ro(self._rows[self._last_row])

    @property
    def n_past(self) -> int:
        return int(self._lib.ds4_gpu_n_past(self._live()))

    @property
    def device_bytes(self) -> int:
        """Device memory this session and its model's weights hold."""
        return int(self._lib.ds4_gpu_session_device_bytes(self._live()))

    # -- snapshots --------------------------------------------------------
    def snapshot(self) -> GpuSnapshot:
        """The session's whole state now, copied on the device (GpuSnapshot):
        position, the K/V pages of positions [0, n_past), every GDN layer's
        conv and recurrent state, the logits and hidden rows of position
        n_past - 1.
        Taken between a verify and its accept, it holds every verified row,
        as an eval of them would (verify == serial, bit for bit), and the
        session can still accept (the CPU's rule)."""
        ptr = self._live()
        pp = self._ffi.new("ds4_gpu_snapshot **")
        status = self._lib.ds4_gpu_session_snapshot(ptr, pp, self._err, _ERR_CAP)
        if status == _ERR_NOMEM:  # nothing was written: the session is intact
            raise ModelError(f"{self.backend}: {self._plug.message(self._err)}", int(status))
        self._check(status)
        return GpuSnapshot(self, pp[0])

    def restore(self, snap: GpuSnapshot) -> None:
        """Put this session back at ``snap`` (taken from any session of the
        same model): what follows is bit-identical to a session that
        evaluated the same tokens, and ``last_logits()`` / ``last_hidden()``
        show the snapshot's last row. The snapshot stays valid. A pending verify ends (accept
        then refuses). Refused, the session unchanged: a snapshot of another
        model or backend, a closed one, anything else."""
        from .session import Snapshot

        ptr = self._live()
        if not isinstance(snap, GpuSnapshot):
            if isinstance(snap, Snapshot):
                raise ModelError("restore: a CPU session's Snapshot cannot be restored into a "
                                 f"{self.backend} session (snapshot of another model)", _ERR_ARG)
            raise ModelError(f"restore needs a Snapshot, got {type(snap).__name__}", _ERR_ARG)
        if snap._ptr is None:
            raise ModelError("snapshot is closed", _ERR_ARG)
        if snap.model is not self.model:
            raise ModelError("snapshot was taken from a session of another model; a snapshot "
                             "restores only into sessions of the model it came from", _ERR_ARG)
        self._check(self._lib.ds4_gpu_session_restore(ptr, snap._ptr, self._err, _ERR_CAP))
        self._n_rows = 0
        self._last_row = -3 if snap.has_logits else -1

    def last_hidden(self):
        """float32 ``[hidden]`` post-final-norm hidden state of position
        ``n_past - 1`` (None before any eval), copied back from the device
        (also after :meth:`step_argmax` and :meth:`restore`); a view, valid
        until the next call of this method, eval or close."""
        ptr = self._live()
        if self._last_row == -1:
            return None
        self._check(self._lib.ds4_gpu_last_hidden(ptr, self._hid1_p, self._err, _ERR_CAP))
        return self._ro(self._hid1)

    # -- what a GPU session cannot do yet -----------------------------------

    def counters(self) -> dict:
        raise _unsupported(self.backend, "counters() (host allocation counts)")

    # -- the nextn head (gpu/host/runner_head.c) ---------------------------
    @property
    def nextn_prime(self) -> bool:
        """Head priming (:attr:`ds4py.Session.nextn_prime`): while on, every
        committed row reaches the head's KV on the device in the same call.
        Turning it on raises ModelError for a model without a GPU head or a
        session holding rows the head never saw."""
        return bool(self._lib.ds4_gpu_nextn_prime(self._live()))

    @nextn_prime.setter
    def nextn_prime(self, on: bool) -> None:
        ptr = self._live()
        status = self._lib.ds4_gpu_set_nextn_prime(ptr, 1 if on else 0, self._err, _ERR_CAP)
        if status:  # a refusal changes nothing
            raise ModelError(f"nextn_prime: {self._plug.message(self._err)}", int(status))

    @property
    def nextn_covered(self) -> bool:
        """A draft at n_past can run: priming on, the head holding [1, n_past)."""
        return bool(self._lib.ds4_gpu_nextn_covered(self._live()))

    # the serial step of speculative rounds (ds4py.spec.runner): this session's own
    @property
    def stepper(self) -> GpuSession:
        return self

    def nextn_step(self, token: int, j: int) -> np.ndarray:
        """Step j of a draft chain whose tokens the caller picks (sampled
        drafts, :meth:`NextnDrafter.propose_dist`): step 0 is ``token`` (the
        committed token at n_past) with the trunk's hidden of n_past - 1,
        step j > 0 is ``token`` (the draft of step j - 1) with the head's
        own output hidden, allowed only right after step j - 1. Returns the
        step's head logits ``[vocab]`` (a new array)."""
        ptr = self._live()
        out = np.empty(self.vocab_size, dtype=np.float32)
        status = self._lib.ds4_gpu_nextn_step(ptr, int(token), int(j), self._fptr(out),
                                              self._err, _ERR_CAP)
        if status == _ERR_ARG:
            raise ModelError(f"{self.backend}: {self._plug.message(self._err)}", int(status))
        self._check(status)
        self._stats["launches"] = int(self._lib.ds4_gpu_launches(ptr))
        return out

    def nextn_propose(self, last: int, k: int) -> list[int]:
        """k chained greedy drafts of the head after ``last`` (the committed
        token at n_past, not yet evaluated): ds4_spec_propose's rows, on the
        device. ModelError (DS4_ERR_ARG) unless :attr:`nextn_covered`."""
        ptr = self._live()
        out = self._ffi.new(f"int32_t[{max(int(k), 1)}]")
        status = self._lib.ds4_gpu_nextn_propose(ptr, int(last), int(k), out, self._err, _ERR_CAP)
        if status == _ERR_ARG:
            raise ModelError(f"{self.backend}: {self._plug.message(self._err)}", int(status))
        self._check(status)
        self._stats["launches"] = int(self._lib.ds4_gpu_launches(ptr))
        return list(out[0:k])

    # -- lifetime (close / closed: _DeviceHandle) -------------------------
    def __enter__(self) -> GpuSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._ptr is None else f"n_past={self.n_past}"
        return f"<ds4py.GpuSession {self.backend} {state}>"


# ----------------------------------------------------------- generation --

def gpu_draft_plan(model, kw: dict, cache):
    """ds4py.generate's DraftPlan on a GPU backend: :func:`ds4py.spec.plan.
    draft_plan`'s (the same policy, pairing classifier and drafters: the
    nextn head on the device, GpuSession.nextn_propose, or nextn_step's
    logits for rejection sampling's drawn drafts; DFlash on the device's
    layer taps), except a head the GPU cannot run: head drafting is then
    turned off with the reason in ``Generation.draft``, and an explicit
    request for it raises ModelError (asked for, cannot be done: fail
    closed). A caller's own ``drafter`` runs through verify/accept."""
    from .spec.plan import DraftPlan, draft_plan

    backend = backend_of(model)
    depth = kw.get("draft_depth")
    explicit = (kw.get("draft") is True or kw.get("draft_policy") is not None
                or bool(kw.get("force_draft"))
                or (depth is not None and not isinstance(depth, bool) and depth != 0))
    why = None
    if kw.get("drafter") is None and kw.get("draft") is not False and depth != 0:
        if model.nextn_refusal and getattr(model, "dflash", None) is None:
            why = f"the nextn head does not run on the {backend} backend: {model.nextn_refusal}"
    if why is not None:
        if explicit:
            raise ModelError(why, _ERR_UNSUPPORTED)
        return DraftPlan(None, None, None, why)
    return draft_plan(model, kw.get("draft"), depth, bool(kw.get("force_draft")),
                      kw.get("draft_policy"), kw.get("drafter"), sampling=kw.get("spec_sampling"))


# ---------------------------------------------------------- ds4py.load --

_LOADED: list[list] = []  # DS4PY_PATHS=1: the lines (str or _GpuLine) of each load


def _paths_report() -> None:
    for lines in _LOADED:
        for line in lines:
            sys.stderr.write(f"DS4PY_PATHS: {line}\n")


def _moe_path(backend: str) -> str:
    """The routed MoE kernels the runner takes (gpu/host/runner.c reads the
    same variables when a session opens)."""
    router = ("router: moe_logits at every width (K_RUNNER_MOE_LOGITS_WIDE=0)"
              if os.environ.get("K_RUNNER_MOE_LOGITS_WIDE") == "0"
              else "router: moe_logits_wide for chunks of 32+ rows, else moe_logits")
    if os.environ.get("K_RUNNER_MOE_GROUP") == "0":
        return (f"routed MoE FFN: {router}; moe_gate_up/moe_down per (row, expert) pair "
                f"at every width")
    m = os.environ.get("K_RUNNER_MOE_GROUP_MIN", "")
    rows = int(m) if m.isdigit() and int(m) >= 1 else 17
    gemm_env = os.environ.get("K_RUNNER_GEMM", "")
    mma = backend in ("cuda", "gpu-emul") and gemm_env not in ("0", "dp4a")
    gemm = ("moe_gemm_mma (int8 MMA) for layers whose matrices are all K-quants, else moe_gemm"
            if mma else "moe_gemm")
    return (f"routed MoE FFN: {router}; chunks of {rows}+ rows grouped by expert (moe_group, "
            f"{gemm}, moe_combine; where its shapes allow), narrower ones moe_gate_up/moe_down "
            f"per pair")


def _gemm_path(backend: str) -> str:
    """The prefill GEMM the runner takes for chunks of more than 16 rows
    (gpu/host/runner.c reads K_RUNNER_GEMM the same way when a session
    opens; Metal has no int8 MMA, so it always takes the dp4a GEMM)."""
    g = os.environ.get("K_RUNNER_GEMM", "")
    if g == "0":
        return "prefill matrices: the matvecs in 16-row blocks (K_RUNNER_GEMM=0)"
    if backend not in ("cuda", "gpu-emul") or g == "dp4a":
        return "prefill matrices: gemm_q8_0 / gemm_kq (dp4a) above 16 rows"
    if g == "kq":
        return ("prefill matrices: gemm_kq_mma (int8 MMA) for K-quants, gemm_q8_0 (dp4a) for Q8_0, "
                "above 16 rows")
    return "prefill matrices: gemm_q8_0_mma / gemm_kq_mma (int8 MMA) above 16 rows"


def _attn_path() -> str:
    """The attention kernels the runner takes (gpu/host/runner.c reads
    K_RUNNER_ATTN_WIDE the same way when a session opens)."""
    if os.environ.get("K_RUNNER_ATTN_WIDE") == "0":
        return "attention: attn_partials + attn_merge at every width (K_RUNNER_ATTN_WIDE=0)"
    return ("attention: attn_partials_wide + attn_merge for chunks of 32+ rows (head_dim a "
            "multiple of 4), else attn_partials + attn_merge")


def _gdn_path() -> str:
    """The GDN recurrence kernels the runner takes (gpu/host/runner.c reads
    K_RUNNER_GDN_ROWS_MIN the same way when a session opens)."""
    m = os.environ.get("K_RUNNER_GDN_ROWS_MIN", "")
    rows = int(m) if m.lstrip("-").isdigit() else 17
    if rows <= 0:
        return "GDN recurrence: gdn_seq at every width (K_RUNNER_GDN_ROWS_MIN=0)"
    return (f"GDN recurrence: gdn_prep + gdn_rows + gdn_norm for runs of {rows}+ tokens "
            f"(state width d <= 128), else gdn_seq; gdn_norm and the out projection's quantizer "
            f"in one launch (gdn_norm_quant) where d is a multiple of 32 dividing 256")


class _GpuLine:
    """The GPU loop's line, made at exit (the launch count is the last step's)."""

    def __init__(self, model: GpuModel):
        kinds = [k for k in model.config.layer_kinds if k != "nextn"]
        ffn = _moe_path(model.backend) if model.config.arch == "qwen35moe" else "dense FFN"
        self.head = (f"{model.backend} ({model._plugin.path}): all {len(kinds)} trunk layers "
                     f"on the GPU layer loop (gpu/host/runner.c: {kinds.count('gdn')} gdn, "
                     f"{kinds.count('attn')} attn, "
                     f"{ffn}; "
                     f"{_gemm_path(model.backend)}; {_attn_path()}; {_gdn_path()}), "
                     f"LM head and logits on the "
                     f"device")
        plugin = model._plugin
        self.launch = plugin.ffi.string(plugin.lib.ds4_gpu_launch_note()).decode()
        self.stats = model._stats

    def __str__(self) -> str:
        return (f"{self.head}; {self.launch}; "
                f"{self.stats['launches']} kernel launches in the last step")


def _record(model, note: str) -> None:
    if os.environ.get("DS4PY_PATHS") != "1":
        return
    if not _LOADED:
        import atexit

        atexit.register(_paths_report)
    lines = [f"backend {backend_of(model)} for {os.path.basename(model.path)}"
             + (f" ({note})" if note else "")]
    if isinstance(model, GpuModel):
        lines.append(_GpuLine(model))
    _LOADED.append(lines)


def _check_name(backend) -> str:
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; one of {', '.join(BACKENDS)}")
    return backend


def _gpu_refusal(backend: str, precision) -> str | None:
    """Load options a GPU backend cannot honour, as a reason (None: none)."""
    if not (isinstance(precision, str) and precision.lower() == "fast"):
        return (f"precision={precision!r}: the GPU kernels implement the fast recipe only "
                f"(exact is CPU-only)")
    return None


def _open_gpu(path, backend: str, plug, n_threads, n_ctx, draft_head, dflash) -> GpuModel:
    """GpuModel.open, then the DFlash drafter attached (ds4py.dflash: the
    drafter runs on the CPU side, fed the device's layer taps)."""
    from .dflash import open_with_dflash

    return open_with_dflash(lambda: GpuModel.open(path, backend, plug, n_threads, n_ctx,
                                                  draft_head), draft_head, dflash)


def load(path, n_threads: int | None = None, n_ctx: int | None = None, precision: str = "fast",
         draft_head=None, dflash=None, backend: str = "cpu"):
    """``ds4py.load``: :meth:`ds4py.Model.load`'s arguments plus ``dflash``
    (ds4py.dflash.load) and ``backend``: "cpu" (default), "cuda",
    "gpu-emul" (the emulator: tests and debugging), "metal" (refused until
    its host exists) or "auto" (cuda where it can run this model, else cpu;
    ``model.backend_note`` says why). A GPU backend that cannot run here or
    cannot run this model raises ModelError naming the reason."""
    from .dflash import load as cpu_load

    name = _check_name(backend)
    if name == "metal":
        where = "macOS only (Apple GPUs)" if sys.platform != "darwin" else \
            "not wired yet: its Objective-C host is a later increment (docs/gpu.md)"
        raise ModelError(f"backend 'metal' is {where}; this is {sys.platform}: use "
                         f"backend='cpu'", _ERR_UNSUPPORTED)
    note = ""
    if name == "auto":
        why = _gpu_refusal("cuda", precision)
        if why is None:
            try:
                plug = _open_plugin("cuda")
                model = _open_gpu(path, "cuda", plug, n_threads, n_ctx, draft_head, dflash)
                model.backend_note = "auto: cuda"
                _record(model, model.backend_note)
                return model
            except ModelError as e:
                why = str(e)
        note = f"auto: cpu, because {why}"
        name = "cpu"
    if name == "cpu":
        model = cpu_load(path, n_threads=n_threads, n_ctx=n_ctx, precision=precision,
                         draft_head=draft_head, dflash=dflash)
        model.backend = "cpu"
        model.backend_note = note
        _record(model, note)
        return model
    why = _gpu_refusal(name, precision)
    if why is not None:
        raise ModelError(f"backend {name!r}: {why}", _ERR_UNSUPPORTED)
    model = _open_gpu(path, name, _open_plugin(name), n_threads, n_ctx, draft_head, dflash)
    _record(model, "")
    return model
