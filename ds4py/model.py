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
from dataclasses import dataclass

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
        """
        if draft_head is not None:
            raise ModelError("draft_head is not supported yet", lib.DS4_ERR_UNSUPPORTED)
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
        pp = ffi.new("ds4_model **")
        err = new_error()
        status = lib.ds4_model_load(bpath, params, pp, err)
        if status != lib.DS4_OK:
            _raise(status, err)
        return cls(ffi.gc(pp[0], lib.ds4_model_free), os.fsdecode(bpath))

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
    def new_session(self):
        """A fresh :class:`ds4py.Session` (position 0) over this model."""
        from .session import Session
        return Session(self)


load = Model.load
