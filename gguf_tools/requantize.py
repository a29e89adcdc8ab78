"""``python -m gguf_tools requantize SRC DST --type T``: rewrite a GGUF in another type.

``--type`` is a uniform type (TARGET_TYPES) or one of llama.cpp's mixes
Q4_K_M, Q4_K_S, Q5_K_M, Q5_K_S (MIXES); the other mixes (Q3_K_M, IQ4_XS, ...)
are refused with "mixes are not implemented yet".

Mixes (``_MixRules``, ported from llama-quant.cpp for a non-Falcon model,
no imatrix, no output/token-embedding type override): the base type is Q4_K
(Q4_K_*) or Q5_K (Q5_K_*); llama_tensor_get_type_impl then picks per tensor,
replacing rule 2's ``--type`` (a ``--tensor-type`` match skips it, as
llama.cpp's manual override does, and then does not advance the counters):
  - output.weight, and token_embd.weight when there is no output.weight
    (tied): Q6_K, or Q8_0 if ne[0] is not whole base blocks;
  - attn_v / attn_qkv / attn_kv_b (category_is_attn_v; attn_qkv never
    reaches the later ATTENTION_QKV branch): _M -> Q6_K when
    use_more_bits(i, n) (i: the running count, n: all such tensors in the
    file); Q4_K_S -> Q5_K for the first 4; with exactly 8 experts -> Q8_0;
  - attn_k: 8 experts -> Q8_0;  attn_output: 8 experts and Q4_K_S/Q4_K_M
    -> Q5_K;
  - ffn_down* (substring, so _exps/_shexp too): layer i of n = block_count
    (hparams.n_layer_all, the nextn block included), i parsed from
    "blk.N." when there is more than one expert, else the running count;
    _M -> Q6_K when use_more_bits(i, n); Q4_K_S -> Q5_K when i < n/8;
  - anything else: the base type.
use_more_bits(i, n) = i < n/8 or i >= 7n/8 or (i - n/8) % 3 == 2. Tensors
are visited, and written, in llama.cpp's order (layer, then name); shapes
are written with trailing 1s dropped (gguf_add_tensor stores ggml_n_dims);
the metadata keys are copied in order with general.quantization_version = 2
and general.file_type moved to the end (gguf_set_val_* removes and appends).
From the golden F32 files this reproduces llama_model_quantize's output
byte for byte for all four mixes (tests/test_gguf_tools_mixes.py for
Q4_K_M against the committed files; tests/reference/test_live_mixes.py
live). Not ported: LLM_TYPE_70B's attn_v bump, Falcon's branches, imatrix
rules, --output-tensor-type/--token-embedding-type, --pure.

Per-tensor rules, in order (``plan()``; ``--dry-run`` prints the result):
  1. Tensors llama.cpp never quantizes are copied unchanged (so an F32
     source keeps them F32). From llama-quant.cpp
     tensor_allows_quantization: fewer than 2 dims as ggml_n_dims counts them
     (trailing 1s dropped, so ffn_gate_inp_shexp.weight [n, 1] is 1-D), a
     name not ending in "weight" (ssm_a, ssm_dt.bias), "_norm.weight",
     "ffn_gate_inp.weight", "ssm_conv1d". We also keep
     "ffn_gate_inp_shexp" whatever its shape. ``--keep REGEX`` adds more.
  2. The target is the first ``--tensor-type REGEX=TYPE`` whose regex
     matches (re.search on the name), else ``--type``.
  3. Fallback when the row length ne[0] is not a multiple of the target's
     block size, after llama-quant.cpp tensor_type_fallback: Q6_K -> Q8_0,
     Q4_K -> Q5_0, Q5_K -> Q5_1 (llama.cpp's rules); for ds4's 64-weight
     types, mirroring llama.cpp's Q4_K -> Q5_0 and Q2_K -> Q4_0,
     Q4_64A -> Q5_0 and Q2_64A -> Q4_0 (our choice; llama.cpp has no such
     types); and, as llama.cpp does, a
     32-block type (or a fallback) that still does not fit -> F16.
  4. Target type == source type: the bytes are copied verbatim.
  5. A quantized source (anything but F32/F16/BF16) converted to another
     type needs ``--allow-requantize`` (llama.cpp's rule: requantizing
     compounds the error); without it the run stops naming the tensor.
  6. Otherwise: dequantize the source with the C core, quantize with the C
     core (ds4py.quants.quantize_weights, byte-identical to llama.cpp's
     ggml_quantize_chunk without an imatrix; Q4_64A/Q2_64A through
     ds4py.quants.quantize, ds4's own quantizer), in chunks of rows.

Threads: the cffi calls (API mode, out of line) release the GIL, so chunks
of one tensor are quantized concurrently on a ThreadPoolExecutor (at most
2 x threads chunks in flight, so memory stays bounded); output order is
kept.

Metadata is copied key by key with its stored type. general.file_type is
set to llama.cpp's llama_ftype for the --type (llama.h: MOSTLY_F16 = 1,
MOSTLY_Q8_0 = 7, MOSTLY_Q4_K_S = 14, MOSTLY_Q4_K_M = 15, MOSTLY_Q5_K_S = 16,
MOSTLY_Q5_K_M = 17, MOSTLY_Q6_K = 18, MOSTLY_BF16 = 32; for a mix the key
order is llama.cpp's, see above). For Q4_64A/Q2_64A
there is no llama_ftype, so general.file_type is left OUT (llama.cpp reads a
missing key as LLAMA_FTYPE_GUESSED; any number we wrote would name another
format). general.quantization_version = 2 (ggml.h GGML_QNT_VERSION) is added
if absent and any output tensor is block-quantized. The alignment is kept.

Output goes through ds4py.gguf_writer.GGUFWriter: streamed tensor by tensor
into a temporary file next to DST, renamed into place only on success.
On Linux the temporary file is unnamed (O_TMPFILE) until that moment, so
even a run killed outright (SIGKILL) leaves nothing behind and DST untouched.
Elsewhere it is ".<DST name>.XXXXXXXX.tmp" in DST's directory. An error or an
exception removes it; a process killed outright (SIGKILL, power loss)
cannot, and leaves it behind while DST is untouched (absent, or the
previous DST). The next run to the
same DST removes such stale temps: exactly the files of that pattern for
that DST name whose mtime is older than the run's start (a live writer of
the same DST keeps touching its own temp; nothing else is removed).

Test hook (tests/test_gguf_tools_compare.py, not an interface):
DS4_GGUF_TOOLS_TEST_DELAY_AFTER_TENSOR=k makes the run sleep 60 s after
writing the data of tensor k (0-based, write order), after printing
"test hook: sleeping after tensor k" to stderr, so that a test can kill it
mid-write.
"""

from __future__ import annotations

import math
import os
import re
import sys
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TextIO

import numpy as np

from ds4py import gguf
from ds4py.errors import DS4Error
from ds4py.gguf import ValueType
from ds4py.gguf_writer import GGUFWriter
from ds4py.quants import WEIGHT_QUANT_TYPES, dequantize, quantize, quantize_weights, type_info

from .inspect_cmd import n_dims

__all__ = ["TARGET_TYPES", "MIXES", "LLAMA_FTYPE", "FALLBACK", "RequantizeError", "Step", "plan",
           "requantize", "cmd_requantize"]

TARGET_TYPES = ("Q8_0", "Q6_K", "Q4_64A", "Q2_64A", "BF16", "F16")
# llama.cpp's mixes we port: name -> base type (llama-quant.cpp
# llama_ftype_get_default_type: Q4_K_S/Q4_K_M -> Q4_K, Q5_K_S/Q5_K_M -> Q5_K)
MIXES = {"Q4_K_S": "Q4_K", "Q4_K_M": "Q4_K", "Q5_K_S": "Q5_K", "Q5_K_M": "Q5_K"}
# llama.h enum llama_ftype
LLAMA_FTYPE = {"F16": 1, "Q8_0": 7, "Q6_K": 18, "BF16": 32,
               "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_S": 16, "Q5_K_M": 17}
GGML_QNT_VERSION = 2  # ggml.h
# see the module docstring, rule 3 (Q4_K/Q5_K: llama-quant.cpp tensor_type_fallback)
FALLBACK = {"Q6_K": "Q8_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1",
            "Q4_64A": "Q5_0", "Q2_64A": "Q4_0"}
FLOAT_TYPES = ("F32", "F16", "BF16")
DS4_QUANTIZERS = ("Q4_64A", "Q2_64A")   # through quants.quantize
ENCODABLE = tuple(WEIGHT_QUANT_TYPES) + DS4_QUANTIZERS
_MIX = re.compile(r"Q[2-6]_K_(S|M|L|XL)|IQ[1-4]_(S|M|XS)|Q4_0_4_[48]|Q4_0_8_8")
_KEEP_SUBSTRINGS = ("_norm.weight", "ffn_gate_inp.weight", "ffn_gate_inp_shexp", "ssm_conv1d")
CHUNK_F32_BYTES = 4 << 20   # rows per chunk: about this much float32 in flight per chunk


class RequantizeError(DS4Error, ValueError):
    pass


@dataclass(frozen=True)
class Step:
    name: str
    shape: tuple[int, ...]
    src_type: str
    dst_type: str
    action: str        # "copy" | "convert"
    reason: str
    src_bytes: int
    dst_bytes: int


def _check_target(t: str, what: str, allowed) -> str:
    u = t.upper()
    if u in allowed:
        return u
    if _MIX.fullmatch(u):
        raise RequantizeError(f"{what} {t}: mixes are not implemented yet "
                              f"(uniform types: {', '.join(allowed)})")
    raise RequantizeError(f"{what} {t}: not supported (supported: {', '.join(allowed)})")


def _dst_bytes(shape, t: str) -> int:
    ti = type_info(t)
    return math.prod(shape) // ti.block_size * ti.type_size


def _keep_reason(name: str, shape, keeps) -> str | None:
    if n_dims(shape) < 2:
        return "1-D (llama.cpp keeps it)"
    if not name.endswith("weight"):
        return "not a .weight (llama.cpp keeps it)"
    for s in _KEEP_SUBSTRINGS:
        if s in name:
            return f"{s} (llama.cpp keeps it)"
    for rx in keeps:
        if rx.search(name):
            return f"--keep {rx.pattern}"
    return None


# ------------------------------------------------------------------ mixes
#
# Ported from llama-quant.cpp (the vendored llama.cpp of llama-cpp-python
# 0.3.36): tensor_get_category, init_quantize_state_counters,
# llama_tensor_get_type_impl, for the four ftypes in MIXES on a non-Falcon
# model without an imatrix and without output/token-embedding type overrides.

_ATTN_V_LIKE = ("attn_qkv", "attn_kv_b", "attn_v")   # category_is_attn_v


def _category(name: str) -> str:
    """tensor_get_category: the first of these tests that matches wins."""
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for cat in ("attn_qkv", "attn_kv_b", "attn_v", "attn_k", "attn_q", "attn_output"):
        if cat + ".weight" in name:
            return cat
    for cat in ("ffn_up", "ffn_gate", "ffn_down"):   # substring: _exps/_shexp too
        if cat in name:
            return cat
    return "other"


_BLK = re.compile(r"blk\.\s*([+-]?\d+)")


def _blk(name: str) -> int | None:
    """The layer sscanf(name, "blk.%d.", ...) reads, or None."""
    m = _BLK.match(name)
    return int(m.group(1)) if m else None


def _llama_order(name: str):
    """llama-model-loader.h weight_name_comparer: by layer (-1 for non-blk
    tensors, so they come first), then by name as bytes. llama_model_quantize
    visits (and writes) the tensors in this order, so the position counters
    below depend on it."""
    b = _blk(name)
    return (-1 if b is None else b, name.encode())


def _use_more_bits(i: int, n: int) -> bool:
    # llama_tensor_get_type_impl use_more_bits: the first and last eighth of the
    # layers and every third one in between (C integer division; i >= n/8 when
    # the modulo is reached, so it is never negative)
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


class _MixRules:
    """The per-tensor type choice of one llama.cpp mix. choose() must be
    called in _llama_order, only for tensors that are quantized and not given a
    type by --tensor-type (llama.cpp calls llama_tensor_get_type_impl, which
    advances the counters, only for those)."""

    def __init__(self, f: gguf.GGUFFile, mix: str):
        self.mix = mix
        arch = f.metadata.get("general.architecture", "")
        # hparams.n_expert (0 when the key is absent)
        self.n_expert = int(f.metadata.get(f"{arch}.expert_count", 0) or 0)
        # n_ffn_down = hparams.n_layer_all = block_count, nextn block included
        # (init_quantize_state_counters); the committed dense Q4_K_M file
        # confirms it: blk.4.ffn_down is not promoted, as it would be with n=5.
        if f"{arch}.block_count" not in f.metadata:
            raise RequantizeError(f"--type {mix}: the file has no {arch}.block_count")
        self.n_layer = int(f.metadata[f"{arch}.block_count"])
        # init_quantize_state_counters: every tensor in the file whose category
        # is attn_v-like counts, whether it is quantized or not
        self.n_attention_wv = sum(_category(n) in _ATTN_V_LIKE for n in f.tensors)
        # has_tied_embeddings: true until a tensor named output.weight is seen
        self.tied = "output.weight" not in f.tensors
        self.i_attention_wv = 0
        self.i_ffn = {"ffn_down": 0, "ffn_gate": 0, "ffn_up": 0}

    def _layer(self, cat: str, name: str) -> int:
        """layer_info: with more than one expert the layer is parsed from the
        name (expert tensors are not consecutive in some models), else it is
        the running count of this category."""
        i = self.i_ffn[cat]
        self.i_ffn[cat] += 1
        if max(1, self.n_expert) > 1:
            b = _blk(name)
            if b is None:
                raise RequantizeError(f"--type {self.mix}: cannot tell the layer of {name}")
            if not 0 <= b < self.n_layer:
                raise RequantizeError(f"--type {self.mix}: bad layer {b} for {name}; "
                                      f"must be in [0, {self.n_layer})")
            return b
        return i

    def choose(self, name: str, ncols: int, base: str) -> tuple[str, str]:
        """(type before the fallback, reason)."""
        mix, cat = self.mix, _category(name)
        m = mix.endswith("_M")
        if cat == "output" or (self.tied and cat == "token_embd"):
            # the output rule (a tied token_embd is the output): Q8_0 when the
            # row is not whole blocks of the base type, else Q6_K
            if ncols % type_info(base).block_size:
                return "Q8_0", f"{mix}: output, ne[0] % {type_info(base).block_size} != 0"
            return "Q6_K", f"{mix}: output" + (" (tied token_embd)" if cat == "token_embd" else "")
        if cat == "token_embd":
            return base, f"{mix}: token_embd (untied: base type)"
        if cat in _ATTN_V_LIKE:
            # attn_v branch (attn_qkv and attn_kv_b are caught here too, so the
            # later ATTENTION_QKV branch never runs for them)
            i, n = self.i_attention_wv, self.n_attention_wv
            self.i_attention_wv += 1
            t, why = base, f"{mix}: attn_v-like #{i} of {n}"
            if m and _use_more_bits(i, n):
                t, why = "Q6_K", why + ", use_more_bits"
            elif mix == "Q4_K_S" and i < 4:
                t, why = "Q5_K", why + ", i_attention_wv < 4"
            # (the LLM_TYPE_70B bump applies to 80-layer models only; not ported)
            if self.n_expert == 8:
                t, why = "Q8_0", why + ", n_expert == 8 -> Q8_0"
            return t, why
        if cat == "attn_k":
            if self.n_expert == 8:
                return "Q8_0", f"{mix}: attn_k, n_expert == 8"
            return base, f"{mix}: attn_k"
        if cat == "ffn_down":
            i, n = self._layer(cat, name), self.n_layer
            why = f"{mix}: ffn_down layer {i} of {n}"
            if m and _use_more_bits(i, n):
                return "Q6_K", why + ", use_more_bits"
            if mix == "Q4_K_S" and i < n // 8:
                return "Q5_K", why + ", i_layer < n_layer/8"
            return base, why
        if cat == "attn_output":
            if self.n_expert == 8 and mix in ("Q4_K_S", "Q4_K_M"):
                return "Q5_K", f"{mix}: attn_output, n_expert == 8"
            return base, f"{mix}: attn_output"
        if cat in ("ffn_gate", "ffn_up"):
            self._layer(cat, name)   # no rule for these mixes; counts and checks only
        return base, f"{mix}: {cat} (base type)"


def plan(f: gguf.GGUFFile, target: str, tensor_types=(), keeps=(),
         allow_requantize: bool = False, token_embedding_type: str | None = None,
         output_tensor_type: str | None = None) -> list[Step]:
    """The per-tensor plan (see the module docstring). tensor_types: list of
    (compiled regex, type name); keeps: compiled regexes. For a mix the steps
    come in llama.cpp's tensor order (_llama_order), else in file order.

    token_embedding_type / output_tensor_type follow llama-quant.cpp's outer
    wrapper llama_tensor_get_type: after the keep rules, the token embedding
    takes token_embedding_type and output.weight takes output_tensor_type,
    ahead of --tensor-type and the mix rules; with a tied head (no
    output.weight) the token embedding takes output_tensor_type when no
    token_embedding_type is given (llama_tensor_get_type_impl's
    "has_tied_embeddings && TOKEN_EMBD" branch)."""
    target = _check_target(target, "--type", TARGET_TYPES + tuple(MIXES))
    if token_embedding_type is not None:
        token_embedding_type = _check_target(token_embedding_type, "--token-embedding-type",
                                             ENCODABLE)
    if output_tensor_type is not None:
        output_tensor_type = _check_target(output_tensor_type, "--output-tensor-type",
                                           ENCODABLE)
    tied = "output.weight" not in f.tensors
    tensors = list(f.tensors.values())
    mix = None
    if target in MIXES:
        mix = _MixRules(f, target)
        tensors.sort(key=lambda t: _llama_order(t.name))
    steps = []
    for t in tensors:
        src = t.type_name
        # For a mix the shape is written as llama_model_quantize writes it:
        # gguf_add_tensor records ggml_n_dims dimensions, so trailing 1s are
        # dropped (ffn_gate_inp_shexp.weight [n, 1] becomes [n]).
        shape = tuple(t.shape[:n_dims(t.shape)]) if mix is not None else t.shape
        reason = _keep_reason(t.name, t.shape, keeps)
        if reason is not None:
            steps.append(Step(t.name, shape, src, src, "copy", reason, t.nbytes, t.nbytes))
            continue
        dst, why = MIXES.get(target, target), "--type"
        manual = False
        if token_embedding_type is not None and t.name == "token_embd.weight":
            dst, why, manual = token_embedding_type, "--token-embedding-type", True
        elif output_tensor_type is not None and (
                t.name == "output.weight" or (tied and t.name == "token_embd.weight")):
            dst, why, manual = output_tensor_type, "--output-tensor-type", True
        else:
            for rx, ty in tensor_types:
                if rx.search(t.name):
                    dst, why, manual = ty, f"--tensor-type {rx.pattern}", True
                    break
        ncols = t.shape[0]
        if mix is not None and not manual:
            dst, why = mix.choose(t.name, ncols, dst)
        if ncols % type_info(dst).block_size:
            fb = FALLBACK.get(dst, dst)
            if ncols % type_info(fb).block_size:
                fb = "F16"
            why = (f"fallback: ne[0]={ncols} is not a multiple of "
                   f"{type_info(dst).block_size} ({dst})"
                   + (f"; {why}" if mix is not None else ""))
            dst = fb
        if dst == src:
            steps.append(Step(t.name, shape, src, dst, "copy", why + "; same type",
                              t.nbytes, t.nbytes))
            continue
        if src not in FLOAT_TYPES and not allow_requantize:
            raise RequantizeError(
                f"tensor {t.name} is already quantized ({src}); converting it to {dst} "
                "needs --allow-requantize")
        if not type_info(src).can_dequantize:
            raise RequantizeError(f"tensor {t.name}: ds4py cannot dequantize {src}")
        steps.append(Step(t.name, shape, src, dst, "convert", why, t.nbytes,
                          _dst_bytes(t.shape, dst)))
    return steps


# ------------------------------------------------------------------ converting

def _decode(src_type: str, raw: np.ndarray) -> np.ndarray:
    if src_type == "F32":
        return raw.view("<f4")
    return dequantize(src_type, raw)


def _encode(dst_type: str, x: np.ndarray, ncols: int) -> np.ndarray:
    if dst_type == "F32":
        return np.ascontiguousarray(x, dtype="<f4").view(np.uint8)
    if dst_type in DS4_QUANTIZERS:
        # ncols is a multiple of the block size (plan() ensures it), so a flat
        # run of whole rows is whole blocks and no block straddles two rows.
        return quantize(dst_type, x)
    return quantize_weights(dst_type, x.reshape(-1, ncols)).reshape(-1)


def _convert_tensor(f: gguf.GGUFFile, step: Step, pool: ThreadPoolExecutor | None,
                    n_threads: int, progress):
    """Yield the converted tensor's bytes chunk by chunk (in order)."""
    raw = f.raw(step.name)
    ncols = step.shape[0]
    rows = math.prod(step.shape) // ncols
    src_row = step.src_bytes // rows
    per = max(1, CHUNK_F32_BYTES // (4 * ncols))

    def work(r0: int, r1: int) -> np.ndarray:
        x = _decode(step.src_type, raw[r0 * src_row:r1 * src_row])
        return _encode(step.dst_type, x, ncols)

    bounds = [(r0, min(r0 + per, rows)) for r0 in range(0, rows, per)]
    if pool is None or len(bounds) == 1:
        for r0, r1 in bounds:
            out = work(r0, r1)
            progress((r1 - r0) * src_row)
            yield out
        return
    pending: deque = deque()
    for r0, r1 in bounds:
        pending.append((pool.submit(work, r0, r1), (r1 - r0) * src_row))
        if len(pending) >= 2 * n_threads:
            fut, nb = pending.popleft()
            out = fut.result()
            progress(nb)
            yield out
    while pending:
        fut, nb = pending.popleft()
        out = fut.result()
        progress(nb)
        yield out


class _Progress:
    """bytes done / total and an ETA on stderr, at most about once a second."""

    def __init__(self, total: int, err: TextIO):
        self.total, self.done, self.err = max(total, 1), 0, err
        self.t0 = self.last = time.monotonic()

    def __call__(self, nbytes: int) -> None:
        self.done += nbytes
        now = time.monotonic()
        if now - self.last >= 1.0:
            self.last = now
            self._line(now)

    def _line(self, now: float, end: str = "\r") -> None:
        el = now - self.t0
        eta = el / self.done * (self.total - self.done) if self.done else float("nan")
        self.err.write(f"  {self.done / 2**20:8.1f} / {self.total / 2**20:.1f} MiB "
                       f"({100 * self.done / self.total:5.1f}%)  ETA {eta:5.0f} s{end}")
        self.err.flush()

    def finish(self) -> None:
        self._line(time.monotonic(), "\n")


def _metadata(f: gguf.GGUFFile, target: str, steps: list[Step]):
    """(key, value, type, element_type) in file order, file_type updated."""
    items = []
    ftype = LLAMA_FTYPE.get(target)
    if target in MIXES:
        # llama_model_quantize_impl: gguf_set_kv copies every key in order, then
        # gguf_set_val_u32 sets general.quantization_version and then
        # general.file_type; gguf_set_val_* removes a key and appends it, so
        # those two end up last, in that order, whatever the source had.
        for k, v in f.metadata.items():
            if k in ("general.quantization_version", "general.file_type"):
                continue
            ty = f.metadata_types[k]
            items.append((k, v, ty[0], ty[1] if len(ty) > 1 else None))
        items.append(("general.quantization_version", GGML_QNT_VERSION, ValueType.UINT32,
                      None))
        items.append(("general.file_type", ftype, ValueType.UINT32, None))
        return items
    for k, v in f.metadata.items():
        ty = f.metadata_types[k]
        if k == "general.file_type":
            if ftype is None:
                continue   # ds4 types: no llama_ftype (module docstring)
            v, ty = ftype, (ValueType.UINT32,)
            ftype = None
        items.append((k, v, ty[0], ty[1] if len(ty) > 1 else None))
    if ftype is not None:
        items.append(("general.file_type", ftype, ValueType.UINT32, None))
    quantized = any(type_info(s.dst_type).block_size > 1 for s in steps)
    if quantized and "general.quantization_version" not in f.metadata:
        items.append(("general.quantization_version", GGML_QNT_VERSION, ValueType.UINT32,
                      None))
    return items


def _per_type(steps, attr: str, size: str) -> dict[str, list[int]]:
    d: dict[str, list[int]] = {}
    for s in steps:
        e = d.setdefault(getattr(s, attr), [0, 0])
        e[0] += 1
        e[1] += getattr(s, size)
    return d


def _write_summary(steps, out: TextIO, src_size: int | None = None,
                   dst_size: int | None = None) -> None:
    before = sum(s.src_bytes for s in steps)
    after = sum(s.dst_bytes for s in steps)
    fb = sum(1 for s in steps if s.reason.startswith("fallback"))
    out.write(f"tensor data: {before} -> {after} bytes ({after / max(before, 1):.3f}x)"
              + (f"; file: {src_size} -> {dst_size} bytes" if dst_size is not None else "")
              + (f"; {fb} tensor(s) fell back" if fb else "") + "\n")
    for label, attr, size in (("before", "src_type", "src_bytes"),
                              ("after", "dst_type", "dst_bytes")):
        out.write(f"bytes per type {label}:\n")
        for t, (n, nb) in sorted(_per_type(steps, attr, size).items(),
                                 key=lambda kv: -kv[1][1]):
            tag = " (ds4-only)" if type_info(t).ds4_only else ""
            out.write(f"  {t + tag:<18} {n:5d} tensors {nb:>14} bytes\n")


def _remove_stale_temps(dst: str, before: float) -> list[str]:
    """Remove temps that a killed run to DST left (module docstring): names
    ".<DST name>.XXXXXXXX.tmp" in DST's directory with mtime < before."""
    directory = os.path.dirname(os.path.abspath(dst))
    pat = re.compile(re.escape("." + os.path.basename(dst) + ".") + r"[a-z0-9_]{8}\.tmp")
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        if not pat.fullmatch(name):
            continue
        p = os.path.join(directory, name)
        try:
            if os.lstat(p).st_mtime < before and os.path.isfile(p) and not os.path.islink(p):
                os.unlink(p)
                removed.append(p)
        except OSError:
            pass   # gone already, or not ours to remove: leave it
    return removed


def requantize(src: str, dst: str, target: str, tensor_types=(), keeps=(),
               allow_requantize: bool = False, threads: int | None = None,
               dry_run: bool = False, out: TextIO | None = None,
               err: TextIO | None = None, token_embedding_type: str | None = None,
               output_tensor_type: str | None = None) -> list[Step]:
    """Library entry point; returns the plan. tensor_types: "REGEX=TYPE"
    strings or (regex, type) pairs; keeps: regex strings."""
    out = out or sys.stdout
    err = err or sys.stderr
    tts = []
    for spec in tensor_types:
        if isinstance(spec, str):
            rx, sep, ty = spec.rpartition("=")
            if not sep or not rx:
                raise RequantizeError(f"--tensor-type {spec!r}: expected REGEX=TYPE")
        else:
            rx, ty = spec
        try:
            tts.append((re.compile(rx), _check_target(ty, "--tensor-type", ENCODABLE)))
        except re.error as e:
            raise RequantizeError(f"--tensor-type {rx!r}: bad regex: {e}") from None
    try:
        kps = [re.compile(k) for k in keeps]
    except re.error as e:
        raise RequantizeError(f"--keep: bad regex: {e}") from None
    if threads is None:
        threads = min(4, os.cpu_count() or 1)
    if threads < 1:
        raise RequantizeError(f"--threads must be >= 1, got {threads}")
    if os.path.exists(dst) and os.path.samefile(src, dst):
        raise RequantizeError(f"DST {dst} is the source file; write to another path")

    # the name as plan() accepts it (case-insensitive), so that _metadata sees
    # the same spelling as LLAMA_FTYPE / MIXES
    target = _check_target(target, "--type", TARGET_TYPES + tuple(MIXES))
    with gguf.open(src) as f:
        steps = plan(f, target, tts, kps, allow_requantize, token_embedding_type,
                     output_tensor_type)
        if dry_run:
            width = max((len(s.name) for s in steps), default=4)
            for s in steps:
                shape = "x".join(map(str, s.shape))
                out.write(f"{s.name:<{width}}  {shape:>16}  {s.src_type:>6} -> "
                          f"{s.dst_type:<6}  {s.action:<7} {s.src_bytes:>12} -> "
                          f"{s.dst_bytes:<12} {s.reason}\n")
            _write_summary(steps, out)
            return steps
        _remove_stale_temps(dst, time.time())
        delay_after = os.environ.get("DS4_GGUF_TOOLS_TEST_DELAY_AFTER_TENSOR")
        delay_after = int(delay_after) if delay_after else None
        total = sum(s.src_bytes for s in steps if s.action == "convert")
        progress = _Progress(total, err)
        pool = ThreadPoolExecutor(threads) if threads > 1 else None
        try:
            with GGUFWriter(dst, alignment=f.alignment) as w:
                for k, v, ty, et in _metadata(f, target, steps):
                    w.add_metadata(k, v, ty, et)
                for s in steps:
                    w.add_tensor_info(s.name, s.shape, s.dst_type)
                for i, s in enumerate(steps):
                    if s.action == "copy":
                        w.write_tensor_data(s.name, f.raw(s.name))
                    else:
                        w.write_tensor_data(s.name, _convert_tensor(f, s, pool, threads,
                                                                    progress))
                    if delay_after is not None and i == delay_after:
                        # test hook (module docstring): say so, then stall
                        err.write(f"test hook: sleeping after tensor {i}\n")
                        err.flush()
                        time.sleep(60)
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        progress.finish()
        src_size = f.file_size
    _write_summary(steps, out, src_size, os.path.getsize(dst))
    return steps


def cmd_requantize(args, out: TextIO, err: TextIO) -> int:
    requantize(args.src, args.dst, args.type, args.tensor_type, args.keep,
               args.allow_requantize, args.threads, args.dry_run, out, err,
               args.token_embedding_type, args.output_tensor_type)
    return 0
