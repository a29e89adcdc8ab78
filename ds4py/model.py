"""Loading a Qwen3.5 GGUF (``qwen35`` dense or ``qwen35moe``).

    with ds4py.load("model.gguf", n_ctx=4096) as model:
        model.config.hidden_size          # every dimension, see ModelConfig
        model.config.layer_kinds          # ("gdn", "gdn", "gdn", "attn", ..., "nextn")

The C core (csrc/model.c, csrc/model_config.c) reads every key, binds every
tensor by name, and refuses, at load, anything the engine cannot run
correctly: a missing or inconsistent key, a missing or mis-shaped tensor, a
tensor type without kernels, a tensor the model has no use for. The error
message names the key or tensor.

Errors
  :class:`ds4py.GGUFError` when the file itself cannot be read as GGUF (it
  does not exist, is not a regular file, is truncated or malformed: the
  reader's codes); :class:`ds4py.ModelError` for everything above that (a
  valid GGUF that is not a model we run, bad arguments). Both carry the
  core's message and ``.code`` (a ``ds4_status``).

Lifetime
  The C model is freed when the Model is closed (``close()`` or leaving the
  ``with`` block) or garbage-collected. A session keeps the model alive by
  holding a reference to ``model._ptr`` (the ffi.gc-managed ``ds4_model *``),
  so closing a Model that still has sessions only drops the Model's own
  reference; the weights are unmapped when the last holder is gone.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import numpy as np

from ._core import ffi, lib, new_error
from .errors import GGUFError, ModelError

__all__ = ["Model", "ModelConfig", "BoundTensor", "load"]

_ARCH = {lib.DS4_ARCH_QWEN35: "qwen35", lib.DS4_ARCH_QWEN35MOE: "qwen35moe"}
_KIND = {lib.DS4_LAYER_GDN: "gdn", lib.DS4_LAYER_ATTN: "attn", lib.DS4_LAYER_NEXTN: "nextn"}
_PRECISION = {"fast": lib.DS4_PRECISION_FAST, "exact": lib.DS4_PRECISION_EXACT}
_PRECISION_NAME = {v: k for k, v in _PRECISION.items()}
# Status codes that come from the GGUF reader (the file is not valid GGUF);
# everything else the loader reports is a model-level problem.
_GGUF_CODES = frozenset([lib.DS4_ERR_IO] + list(range(lib.DS4_ERR_TRUNCATED,
                                                      lib.DS4_ERR_DUPLICATE_TENSOR + 1)))


@dataclass(frozen=True)
class ModelConfig:
    """A loaded model's dimensions (``ds4_model_config``; GGUF keys in
    qwen35-spec.md §1). The C field each one mirrors is given in brackets."""

    arch: str                    # "qwen35" (dense) or "qwen35moe"  [arch]
    vocab_size: int              # token_embd rows  [n_vocab]
    hidden_size: int             # [n_embd]
    n_blocks: int                # block_count: trunk + nextn blocks  [n_layer_all]
    n_layers: int                # trunk layers the forward pass runs  [n_main]
    n_nextn_layers: int          # nextn (MTP) blocks, 0 or 1  [n_nextn]
    context_length: int          # training context  [n_ctx_train]
    rms_norm_eps: float          # [rms_eps]
    n_heads: int                 # gated attention  [n_head]
    n_kv_heads: int              # [n_head_kv]
    head_dim: int                # [head_dim]
    rope_dims: int               # rotated dims per head  [n_rot]
    rope_theta: float            # [rope_base]
    attention_scale: float       # resolved: attention.scale or 1/sqrt(head_dim)  [attn_scale]
    conv_kernel: int             # gated delta net: conv width K  [ssm_conv_kernel]
    ssm_state_size: int          # d_k == d_v  [ssm_d_state]
    ssm_n_key_heads: int         # [ssm_n_k]
    ssm_n_value_heads: int       # [ssm_n_v]
    ssm_inner_size: int          # n_v * d_v  [ssm_d_inner]
    ffn_size: int                # dense FFN width; 0 for MoE  [n_ff]
    n_experts: int               # 0 for dense  [n_expert]
    n_experts_used: int          # top-k  [n_expert_used]
    expert_ffn_size: int         # [n_ff_exp]
    shared_expert_ffn_size: int  # [n_ff_shexp]
    tied_embeddings: bool        # no output.weight: the head is token_embd  [tied_head]
    fused_gate_up_exps: bool     # experts' gate/up in one tensor  [fused_gate_up_exps]
    layer_kinds: tuple[str, ...]  # per block: "gdn", "attn" or "nextn"

    @property
    def is_moe(self) -> bool:
        return self.arch == "qwen35moe"


def _raise(status: int, err) -> None:
    msg = ffi.string(err.message).decode("utf-8", "replace")
    exc = GGUFError if status in _GGUF_CODES else ModelError
    raise exc(msg, int(status))


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelError(f"{name} must be a positive int or None, got {value!r}", lib.DS4_ERR_ARG)
    if value <= 0:
        raise ModelError(f"{name} must be positive, got {value}", lib.DS4_ERR_ARG)
    return value


def _precision_id(precision) -> int:
    if isinstance(precision, str):
        pid = _PRECISION.get(precision.lower())
        if pid is None:
            raise ModelError(f"precision must be one of {sorted(_PRECISION)}, got {precision!r}",
                             lib.DS4_ERR_ARG)
        return pid
    if isinstance(precision, int) and not isinstance(precision, bool):
        return precision  # a DS4_PRECISION_* id; the core checks it
    raise ModelError(f"precision must be 'fast' or 'exact', got {precision!r}", lib.DS4_ERR_ARG)


def _read_config(ptr) -> ModelConfig:
    c = ffi.new("ds4_model_config *")
    lib.ds4_model_get_config(ptr, c)
    kinds = tuple(_KIND[lib.ds4_model_layer_kind(ptr, i)] for i in range(c.n_layer_all))
    return ModelConfig(
        arch=_ARCH[c.arch], vocab_size=c.n_vocab, hidden_size=c.n_embd,
        n_blocks=c.n_layer_all, n_layers=c.n_main, n_nextn_layers=c.n_nextn,
        context_length=c.n_ctx_train, rms_norm_eps=c.rms_eps,
        n_heads=c.n_head, n_kv_heads=c.n_head_kv, head_dim=c.head_dim, rope_dims=c.n_rot,
        rope_theta=c.rope_base, attention_scale=c.attn_scale,
        conv_kernel=c.ssm_conv_kernel, ssm_state_size=c.ssm_d_state,
        ssm_n_key_heads=c.ssm_n_k, ssm_n_value_heads=c.ssm_n_v, ssm_inner_size=c.ssm_d_inner,
        ffn_size=c.n_ff, n_experts=c.n_expert, n_experts_used=c.n_expert_used,
        expert_ffn_size=c.n_ff_exp, shared_expert_ffn_size=c.n_ff_shexp,
        tied_embeddings=bool(c.tied_head), fused_gate_up_exps=bool(c.fused_gate_up_exps),
        layer_kinds=kinds,
    )


@dataclass(frozen=True)
class BoundTensor:
    """One tensor slot the loader filled (``ds4_model_tensor_info``)."""

    name: str                # GGUF tensor name
    role: str                # slot: "token_embd", "attn_q", "nextn_eh_proj", ...
    layer: int               # block index, -1 for token_embd / output_norm / output
    type_id: int
    shape: tuple[int, ...]   # GGUF order (ne[0] first), n_dims entries
    address: int             # data address inside the model's mapping
    row_bytes: int
    expert_bytes: int


class Model:
    """A loaded model. Create with :meth:`Model.load` (or ``ds4py.load``)."""

    def __init__(self, ptr, path: str):
        # ptr is an ffi.gc-managed ds4_model*; see the module doc (Lifetime).
        self._ptr = ptr
        self.path = path
        self.config = _read_config(ptr)
        self.n_ctx = int(lib.ds4_model_n_ctx(ptr))
        self.n_threads = int(lib.ds4_model_n_threads(ptr))
        self.precision = _PRECISION_NAME[lib.ds4_model_precision(ptr)]
        self._tokenizer = None
        self._nextn_bits = int(lib.ds4_model_nextn_source(ptr))
        self.draft_head: str | None = None  # the draft_head path given to load()

    @classmethod
    def load(cls, path: str | os.PathLike, n_threads: int | None = None,
             n_ctx: int | None = None, precision: str = "fast",
             draft_head: str | os.PathLike | None = None) -> Model:
        """Load and bind a qwen35/qwen35moe GGUF.

        n_threads: default one per online CPU. n_ctx: default
        min(context_length, 8192); larger than context_length is allowed.
        precision: "fast" (default) runs llama.cpp's x86 CPU numerics: each
        activation row quantized to the weight type's dot partner (Q8_0,
        Q8_1, Q8_K, F16, BF16; F32 weights keep F32 rows), F16 KV cache,
        llama.cpp's small-batch flash-attention rounding (Q in F16, V summed
        in F16) on every row. "exact" runs float32 activations, an F32 KV
        cache and transformers' formulas. Both are batch invariant.
        draft_head: a standalone nextn (MTP) head GGUF to run as this
        model's head (the layout llama.cpp's converter writes with --mtp:
        the model's metadata, the head's blk.N.* tensors, optionally
        token_embd / output_norm / output, which the head then uses). It is
        refused, with the reason, when it carries anything else (a full
        model is never taken as a head), is for another architecture or
        trunk depth, has a tensor whose shape does not fit this model
        (named), or a differing rms eps / rope / attention scale / experts
        per token. A model that bundles its own head runs the draft_head
        instead, with a UserWarning. See :meth:`nextn_eval`.
        """
        prec = _precision_id(precision)
        threads = 0 if n_threads is None else _positive_int("n_threads", n_threads)
        ctx = 0 if n_ctx is None else _positive_int("n_ctx", n_ctx)
        # the C fields are int / int / int64_t; the core checks the values
        if not -2**31 <= prec < 2**31:
            raise ModelError(f"precision {precision!r} is out of range", lib.DS4_ERR_ARG)
        if threads >= 2**31:
            raise ModelError(f"n_threads = {threads} is out of range", lib.DS4_ERR_ARG)
        if ctx >= 2**63:
            raise ModelError(f"n_ctx = {ctx} is out of range", lib.DS4_ERR_ARG)
        params = ffi.new("ds4_model_params *")
        params.precision, params.n_threads, params.n_ctx = prec, threads, ctx
        bpath = os.fsencode(path)
        if b"\0" in bpath:
            raise GGUFError(f"path {os.fsdecode(bpath)!r} contains a NUL byte", lib.DS4_ERR_ARG)
        head_c = ffi.NULL
        if draft_head is not None:
            if not isinstance(draft_head, (str, bytes, os.PathLike)):
                raise ModelError(f"draft_head must be a path or None, got {draft_head!r}",
                                 lib.DS4_ERR_ARG)
            bhead = os.fsencode(draft_head)
            if b"\0" in bhead:
                raise GGUFError(f"draft_head {os.fsdecode(bhead)!r} contains a NUL byte",
                                lib.DS4_ERR_ARG)
            head_c = ffi.new("char[]", bhead)  # alive through the load call
            params.draft_head = head_c
        pp = ffi.new("ds4_model **")
        err = new_error()
        status = lib.ds4_model_load(bpath, params, pp, err)
        if status != lib.DS4_OK:
            _raise(status, err)
        model = cls(ffi.gc(pp[0], lib.ds4_model_free), os.fsdecode(bpath))
        if draft_head is not None:
            model.draft_head = os.fsdecode(os.fsencode(draft_head))
            if model._nextn_bits & lib.DS4_NEXTN_BUNDLED:
                warnings.warn(f"{model.path!r} bundles its own nextn head; the draft_head "
                              f"{model.draft_head!r} replaces it", UserWarning, stacklevel=2)
        return model

    # -- lifetime ---------------------------------------------------------
    def close(self) -> None:
        """Drop this Model's hold on the C model (freed once no session
        holds it either). Later calls that need the model raise ModelError;
        ``config`` and the other plain attributes stay readable."""
        self._ptr = None

    @property
    def closed(self) -> bool:
        return self._ptr is None

    def _live(self):
        if self._ptr is None:
            raise ModelError(f"model {self.path!r} is closed", lib.DS4_ERR_ARG)
        return self._ptr

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._ptr is None else f"n_ctx={self.n_ctx}"
        return f"<ds4py.Model {self.config.arch} {self.path!r} {state}>"

    # -- inspection -------------------------------------------------------
    def tensors(self) -> list[BoundTensor]:
        """Every tensor slot the loader filled, globals first, then by block."""
        ptr = self._live()
        info = ffi.new("ds4_model_tensor_info *")
        err = new_error()
        out = []
        for i in range(lib.ds4_model_n_tensors(ptr)):
            status = lib.ds4_model_get_tensor(ptr, i, info, err)
            if status != lib.DS4_OK:
                _raise(status, err)
            out.append(BoundTensor(
                name=ffi.string(info.name).decode("utf-8"),
                role=ffi.string(info.role).decode("ascii"),
                layer=int(info.layer), type_id=int(info.type),
                shape=tuple(int(info.ne[d]) for d in range(info.n_dims)),
                address=int(ffi.cast("uintptr_t", info.data)),
                row_bytes=int(info.row_bytes), expert_bytes=int(info.expert_bytes)))
        return out

    # -- tokenizer (ds4py.tokenizer) --------------------------------------
    @property
    def tokenizer(self):
        """The model's :class:`ds4py.tokenizer.Tokenizer`, built on first use
        from the file's ``tokenizer.ggml.*`` metadata (a file without it
        raises TokenizerError here, not at load: the engine itself runs on
        token ids)."""
        if self._tokenizer is None:
            from .tokenizer import Tokenizer
            self._tokenizer = Tokenizer.from_gguf(self.path)
        return self._tokenizer

    # -- sessions (ds4py.session) ------------------------------------------
    def new_session(self, nextn_prime: bool = False):
        """A fresh :class:`ds4py.Session` (position 0) over this model;
        ``nextn_prime``: keep the nextn head primed with every committed row
        (ds4py.session, Head priming; ModelError without a head)."""
        from .session import Session
        return Session(self, nextn_prime=nextn_prime)

    # -- nextn / MTP head (csrc/forward/nextn.c) ----------------------------
    @property
    def nextn_source(self) -> str | None:
        """Which nextn (MTP) head runs: ``"draft_head"`` (a standalone head
        file given to :meth:`load`; it replaces a bundled one, with a
        warning at load), ``"bundled"`` (the model file's own block), or
        None (no head: :meth:`nextn_eval` raises ModelError)."""
        if self._nextn_bits & lib.DS4_NEXTN_DRAFT_HEAD:
            return "draft_head"
        return "bundled" if self._nextn_bits & lib.DS4_NEXTN_BUNDLED else None

    def _session_ptr(self, session):
        # The C calls run the head of the session's own model; refuse a
        # session of another Model rather than run a different head.
        mine = self._live()
        theirs = getattr(session, "_model_ptr", None)
        if theirs is None or theirs != mine:
            raise ModelError("session does not belong to this model", lib.DS4_ERR_ARG)
        return session._live()

    def nextn_eval(self, session, tokens, hiddens, positions, *, kv_only: bool = False):
        """Run the nextn head over rows ``(tokens[r], hiddens[r])`` at
        ``positions[r]``, extending the head's own KV cache in ``session``.

        The batched catch-up after a trunk step: row p pairs token p with
        the trunk's post-final-norm hidden of position p-1 (``session.eval(
        ..., return_hidden=True)``), so it predicts token p+2. ``hiddens`` is
        ``[n, hidden_size]``; ``positions`` must be consecutive. An empty head
        takes any first position (llama.cpp mirrors a fresh sequence from
        position 1; position 0 may instead be paired with a zero hidden
        row); after that rows continue the head's KV or rewind into it (rows
        at or after ``positions[0]`` are replaced). n rows in one call give
        bit for bit what n :meth:`nextn_draft`-style one-row calls give.

        ``kv_only``: write the rows' KV entries only (bit for bit the ones a
        full call writes) and compute no logits or hidden -- a row's K/V do
        not depend on the head's attention, FFN or LM head, so a catch-up
        whose results nobody reads skips them; returns None.

        Returns ``(logits [n, vocab], hidden [n, hidden_size])``: read-only
        views of session-owned buffers. ``logits`` is valid until the next
        nextn call on the session; ``hidden`` (the head's own output rows,
        what a chained draft feeds back) stays valid through the next nextn
        call, so it may be passed to it directly.
        """
        ptr = self._session_ptr(session)
        from .session import _as_tokens
        tok = _as_tokens(tokens)
        n = tok.size
        E = self.config.hidden_size
        hid = np.ascontiguousarray(hiddens, dtype=np.float32)
        if hid.shape != (n, E):
            raise ModelError(f"hiddens must be [{n}, {E}] (one row per token), got "
                             f"{hid.shape}", lib.DS4_ERR_ARG)
        pos = np.asarray(positions)
        if pos.dtype == object or pos.dtype == np.bool_ or (
                pos.size and not np.issubdtype(pos.dtype, np.integer)):
            raise ModelError(f"positions must be integers, got dtype {pos.dtype}",
                             lib.DS4_ERR_ARG)
        if pos.shape != (n,):
            raise ModelError(f"positions must be [{n}], got {pos.shape}", lib.DS4_ERR_ARG)
        if n and (int(pos.min()) < -(2**63) or int(pos.max()) >= 2**63):
            raise ModelError("position out of range", lib.DS4_ERR_ARG)
        pos = np.ascontiguousarray(pos, dtype=np.int64)
        err = new_error()
        status = lib.ds4_session_nextn_eval_out(
            ptr, ffi.cast("int32_t *", ffi.from_buffer(tok)) if n else ffi.NULL,
            ffi.cast("float *", ffi.from_buffer(hid, require_writable=False)) if n else ffi.NULL,
            ffi.cast("int64_t *", ffi.from_buffer(pos)) if n else ffi.NULL, n,
            lib.DS4_NEXTN_OUT_KV if kv_only else lib.DS4_NEXTN_OUT_ALL, err)
        if status != lib.DS4_OK:
            _raise(status, err)
        return None if kv_only else self._nextn_views(ptr)

    def nextn_draft(self, session, token: int, hidden):
        """One draft step: the row ``(token, hidden)`` at the head's next
        position (the trunk's ``n_past`` when the head is empty), which
        extends the head's KV. ``hidden`` is ``[hidden_size]``: the trunk's
        last hidden for the first step, then the head's own output hidden of
        the previous step. Returns ``(logits [vocab], hidden [hidden_size])``
        (views; lifetimes as :meth:`nextn_eval`)."""
        ptr = self._session_ptr(session)
        if isinstance(token, bool) or not isinstance(token, (int, np.integer)):
            raise ModelError(f"token must be an int, got {token!r}", lib.DS4_ERR_ARG)
        if not -(2**31) <= int(token) < 2**31:
            raise ModelError(f"token id {int(token)} is out of range", lib.DS4_ERR_ARG)
        E = self.config.hidden_size
        hid = np.ascontiguousarray(hidden, dtype=np.float32)
        if hid.shape != (E,):
            raise ModelError(f"hidden must be [{E}], got {hid.shape}", lib.DS4_ERR_ARG)
        err = new_error()
        status = lib.ds4_session_nextn_draft(
            ptr, int(token), ffi.cast("float *", ffi.from_buffer(hid, require_writable=False)),
            err)
        if status != lib.DS4_OK:
            _raise(status, err)
        logits, hid_out = self._nextn_views(ptr)
        return logits[0], hid_out[0]

    def nextn_range(self, session) -> tuple[int, int]:
        """The positions the head's KV holds in ``session``: ``[first, next)``
        (empty when equal; ``next`` is where the next draft row goes)."""
        ptr = self._session_ptr(session)
        a, b = ffi.new("int64_t *"), ffi.new("int64_t *")
        lib.ds4_session_nextn_range(ptr, a, b)
        return int(a[0]), int(b[0])

    def _nextn_views(self, ptr):
        V, E = self.config.vocab_size, self.config.hidden_size
        nr = ffi.new("int64_t *")
        lp = lib.ds4_session_nextn_logits(ptr, nr)
        rows = int(nr[0])
        logits = np.frombuffer(ffi.buffer(lp, rows * V * 4), dtype=np.float32).reshape(rows, V)
        hp = lib.ds4_session_nextn_hidden(ptr, nr)
        hidden = np.frombuffer(ffi.buffer(hp, rows * E * 4), dtype=np.float32).reshape(rows, E)
        logits.flags.writeable = False
        hidden.flags.writeable = False
        return logits, hidden


load = Model.load
