"""llama.cpp side of the forward-pass fixtures, through llama-cpp-python's
low-level bindings (plus ctypes for the two MTP functions the bindings lack).

Settings (the ones ds4py's `fast` mode promises to match; recorded in the
fixtures' README):
- model: n_gpu_layers 0, use_extra_bufts False (no CPU_REPACK weight
  repacking: the plain ggml vec_dot path), load_mtp True.
- context: n_ctx 1024, n_batch = n_ubatch = 1024 (a whole sequence is one
  ubatch), n_seq_max 1, every row output, n_threads = n_threads_batch =
  THREADS, flash attention ENABLED (what AUTO resolves to on the CPU backend:
  llama_context::resolve_fused_ops keeps it when the FLASH_ATTN_EXT probe runs
  on the layer's device; checked by flash_attn_auto_resolves_on()), K and V
  cache F16 (the defaults), fused Gated-DeltaNet ops on (llama-context.cpp sets
  fused_gdn_ar = fused_gdn_ch = true, not auto).

MTP (spec section 7; common/speculative.cpp common_speculative_impl_draft_mtp,
"neither" mode): a second context of type LLAMA_CONTEXT_TYPE_MTP on the same
model. Row k of the MTP batch is token x_k with, as its embedding, the
target's h_nextn row k-1 (post-final-norm hidden); row 0 gets a zero row, as
the driver's pending_h is zero-initialised for a fresh sequence. The target
context needs llama_set_embeddings_nextn(ctx, true, masked=false) to export
h rows; the MTP context uses masked=true (its own hm rows, for chaining).
Those two functions live in src/llama-ext.h (C++ linkage, not in llama.h or
the Python bindings) and are called here by their mangled names.
"""

from __future__ import annotations

import contextlib
import ctypes
import os

import numpy as np

THREADS = 2
N_CTX = 1024

_LOG_CB = None
_LOG_LINES: list[str] = []


def _L():
    import llama_cpp.llama_cpp as L

    return L


def quiet(capture: bool = False) -> None:
    """Silence llama.cpp's logging (or capture it into _LOG_LINES)."""
    global _LOG_CB
    L = _L()

    @ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
    def cb(level, text, user):
        if capture and text:
            _LOG_LINES.append(text.decode("utf-8", "replace"))

    _LOG_CB = cb
    L.llama_log_set(cb, None)


_backend_ready = False


def init_backend() -> None:
    global _backend_ready
    if not _backend_ready:
        _L().llama_backend_init()
        quiet()
        _backend_ready = True


def _ext():
    """ctypes handles for the llama-ext.h functions (C++ mangled names)."""
    lib = _L()._lib
    f_set = lib._Z26llama_set_embeddings_nextnP13llama_contextbb
    f_set.argtypes = [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool]
    f_set.restype = None
    f_get_ith = lib._Z30llama_get_embeddings_nextn_ithP13llama_contexti
    f_get_ith.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    f_get_ith.restype = ctypes.POINTER(ctypes.c_float)
    f_get = lib._Z26llama_get_embeddings_nextnP13llama_context
    f_get.argtypes = [ctypes.c_void_p]
    f_get.restype = ctypes.POINTER(ctypes.c_float)
    return f_set, f_get, f_get_ith


class Model:
    def __init__(self, path: str, extra_bufts: bool = False):
        init_backend()
        L = _L()
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 0
        mp.use_extra_bufts = extra_bufts
        mp.load_mtp = True
        self.ptr = L.llama_model_load_from_file(path.encode(), mp)
        if not self.ptr:
            raise RuntimeError(f"llama.cpp could not load {path}")
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.ptr))
        self.n_embd = L.llama_model_n_embd(self.ptr)
        self.n_nextn = L.llama_model_n_layer_nextn(self.ptr)

    def close(self):
        if self.ptr:
            _L().llama_model_free(self.ptr)
            self.ptr = None

    def context(self, mtp: bool = False, threads: int = THREADS, flash_attn: int | None = None):
        L = _L()
        cp = L.llama_context_default_params()
        cp.n_ctx = N_CTX
        cp.n_batch = N_CTX
        cp.n_ubatch = N_CTX
        cp.n_seq_max = 1
        cp.n_outputs_max = 0
        cp.n_outputs_max_per_seq = 0
        cp.n_threads = threads
        cp.n_threads_batch = threads
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn is None else flash_attn
        cp.type_k = 1  # GGML_TYPE_F16 (the default, set explicitly)
        cp.type_v = 1
        cp.no_perf = True
        if mtp:
            cp.ctx_type = L.LLAMA_CONTEXT_TYPE_MTP
        ctx = L.llama_init_from_model(self.ptr, cp)
        if not ctx:
            raise RuntimeError("llama_init_from_model failed")
        return Context(self, ctx)


class Context:
    def __init__(self, model: Model, ptr):
        self.model = model
        self.ptr = ptr

    def close(self):
        if self.ptr:
            _L().llama_free(self.ptr)
            self.ptr = None

    def export_h(self, on: bool, masked: bool = False):
        f_set, _, _ = _ext()
        f_set(self.ptr, on, masked)

    def decode(self, tokens, pos0: int, want_h: bool = False):
        """Decode tokens at positions pos0.. in one llama_decode call with
        every row output; returns logits [n, V] (and h rows [n, E])."""
        L = _L()
        n = len(tokens)
        b = L.llama_batch_init(n, 0, 1)
        try:
            for i, t in enumerate(tokens):
                b.token[i] = int(t)
                b.pos[i] = pos0 + i
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = 0
                b.logits[i] = 1
            b.n_tokens = n
            rc = L.llama_decode(self.ptr, b)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")
        finally:
            L.llama_batch_free(b)
        V = self.model.n_vocab
        out = np.empty((n, V), dtype=np.float32)
        for i in range(n):
            p = L.llama_get_logits_ith(self.ptr, i)
            out[i] = np.ctypeslib.as_array(p, shape=(V,))
        if not want_h:
            return out
        _, f_get, _ = _ext()
        E = self.model.n_embd
        p = f_get(self.ptr)
        h = np.ctypeslib.as_array(p, shape=(n * E,)).reshape(n, E).copy()
        return out, h

    def mtp_decode(self, tokens, h_rows, positions):
        """One llama_process call on an MTP context: row i = (tokens[i],
        h_rows[i]) at positions[i]. Returns (logits [n, V], hm [n, E])."""
        L = _L()
        _, _, f_get_ith = _ext()
        n = len(tokens)
        E = self.model.n_embd
        h_rows = np.ascontiguousarray(h_rows, dtype=np.float32)
        assert h_rows.shape == (n, E)
        batch = L.llama_batch_ext_init(self.ptr)
        if not batch:
            raise RuntimeError("llama_batch_ext_init failed")
        try:
            pos_buf = (ctypes.c_int32 * 4)()
            hp = h_rows.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            for i in range(n):
                idx = L.llama_batch_ext_add_token(batch, 0, int(tokens[i]))
                if idx != i:
                    raise RuntimeError(f"llama_batch_ext_add_token -> {idx}")
                # as common_batch::add: {pos, 0, 0, 0}; a text token uses pos[0] only
                pos_buf[0] = int(positions[i])
                L.llama_batch_ext_set_pos(batch, idx, pos_buf)
                emb = L.llama_embd()
                emb.data = ctypes.cast(
                    ctypes.addressof(hp.contents) + i * E * 4, ctypes.POINTER(ctypes.c_float)
                )
                emb.n_rows = 1
                emb.n_embd = E
                if not L.llama_batch_ext_set_embd_token(batch, idx, emb):
                    raise RuntimeError("llama_batch_ext_set_embd_token failed")
                L.llama_batch_ext_set_output_logits(batch, idx, True)
            rc = L.llama_process(self.ptr, L.LLAMA_PROCESS_TYPE_DECODE, batch)
            if rc != 0:
                raise RuntimeError(f"llama_process returned {rc}")
        finally:
            L.llama_batch_ext_free(batch)
        V = self.model.n_vocab
        logits = np.empty((n, V), dtype=np.float32)
        hm = np.empty((n, E), dtype=np.float32)
        for i in range(n):
            logits[i] = np.ctypeslib.as_array(L.llama_get_logits_ith(self.ptr, i), shape=(V,))
            hm[i] = np.ctypeslib.as_array(f_get_ith(self.ptr, i), shape=(E,))
        return logits, hm

    def clear(self):
        L = _L()
        L.llama_memory_clear(L.llama_get_memory(self.ptr), True)


@contextlib.contextmanager
def opened(path: str, **kw):
    m = Model(path, **kw)
    try:
        yield m
    finally:
        m.close()


def flash_attn_auto_resolves_on(path: str) -> bool:
    """Create a context with flash_attn_type AUTO and read llama.cpp's log for
    how it resolved (llama_context::resolve_fused_ops logs "<probe> enabled")."""
    init_backend()
    _LOG_LINES.clear()
    quiet(capture=True)
    try:
        with opened(path) as m:
            c = m.context(flash_attn=_L().LLAMA_FLASH_ATTN_TYPE_AUTO)
            c.close()
    finally:
        quiet()
    text = "".join(_LOG_LINES)
    lines = [ln for ln in text.splitlines() if "lash" in ln]
    on = any("enabled" in ln and "not" not in ln for ln in lines)
    off = any("disabled" in ln for ln in lines)
    if on == off:
        raise RuntimeError("could not tell how flash_attn AUTO resolved:\n" + "\n".join(lines))
    return on


def quantize(src: str, dst: str, ftype_name: str = "Q4_K_M", threads: int = THREADS) -> None:
    """llama-quantize's job through the library's llama_model_quantize (no
    imatrix, default parameters otherwise)."""
    init_backend()
    L = _L()
    qp = L.llama_model_quantize_default_params()
    qp.ftype = getattr(L, f"LLAMA_FTYPE_MOSTLY_{ftype_name}")
    qp.nthread = threads
    rc = L.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(qp))
    if rc != 0 or not os.path.exists(dst):
        raise RuntimeError(f"llama_model_quantize returned {rc}")
