"""``python -m gguf_tools requantize SRC DST --type T``: rewrite a GGUF in another type.

Uniform target types only (``--type`` one of TARGET_TYPES); llama.cpp's
mixes (Q4_K_M, Q5_K_S, ...) are refused with "mixes are not implemented yet".

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
     block size, after llama-quant.cpp tensor_type_fallback: Q6_K -> Q8_0
     (llama.cpp's rule); for ds4's 64-weight types, mirroring llama.cpp's
     Q4_K -> Q5_0 and Q2_K -> Q4_0, Q4_64A -> Q5_0 and Q2_64A -> Q4_0 (our
     choice; llama.cpp has no such types); and, as llama.cpp does, a
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
MOSTLY_Q8_0 = 7, MOSTLY_Q6_K = 18, MOSTLY_BF16 = 32). For Q4_64A/Q2_64A
there is no llama_ftype, so general.file_type is left OUT (llama.cpp reads a
missing key as LLAMA_FTYPE_GUESSED; any number we wrote would name another
format). general.quantization_version = 2 (ggml.h GGML_QNT_VERSION) is added
if absent and any output tensor is block-quantized. The alignment is kept.

Output goes through ds4py.gguf_writer.GGUFWriter: streamed tensor by tensor
into a temporary file next to DST, renamed into place only on success.
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

__all__ = ["TARGET_TYPES", "LLAMA_FTYPE", "FALLBACK", "RequantizeError", "Step", "plan",
           "requantize", "cmd_requantize"]

TARGET_TYPES = ("Q8_0", "Q6_K", "Q4_64A", "Q2_64A", "BF16", "F16")
# llama.h enum llama_ftype
LLAMA_FTYPE = {"F16": 1, "Q8_0": 7, "Q6_K": 18, "BF16": 32}
GGML_QNT_VERSION = 2  # ggml.h
# see the module docstring, rule 3
FALLBACK = {"Q6_K": "Q8_0", "Q4_64A": "Q5_0", "Q2_64A": "Q4_0"}
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


def plan(f: gguf.GGUFFile, target: str, tensor_types=(), keeps=(),
         allow_requantize: bool = False) -> list[Step]:
    """The per-tensor plan (see the module docstring). tensor_types: list of
    (compiled regex, type name); keeps: compiled regexes."""
    target = _check_target(target, "--type", TARGET_TYPES)
    steps = []
    for t in f.tensors.values():
        src = t.type_name
        reason = _keep_reason(t.name, t.shape, keeps)
        if reason is not None:
            steps.append(Step(t.name, t.shape, src, src, "copy", reason, t.nbytes, t.nbytes))
            continue
        dst, why = target, "--type"
        for rx, ty in tensor_types:
            if rx.search(t.name):
                dst, why = ty, f"--tensor-type {rx.pattern}"
                break
        ncols = t.shape[0]
        if ncols % type_info(dst).block_size:
            fb = FALLBACK.get(dst, dst)
            if ncols % type_info(fb).block_size:
                fb = "F16"
            why = (f"fallback: ne[0]={ncols} is not a multiple of "
                   f"{type_info(dst).block_size} ({dst})")
            dst = fb
        if dst == src:
            steps.append(Step(t.name, t.shape, src, dst, "copy", why + "; same type",
                              t.nbytes, t.nbytes))
            continue
        if src not in FLOAT_TYPES and not allow_requantize:
            raise RequantizeError(
                f"tensor {t.name} is already quantized ({src}); converting it to {dst} "
                "needs --allow-requantize")
        if not type_info(src).can_dequantize:
            raise RequantizeError(f"tensor {t.name}: ds4py cannot dequantize {src}")
        steps.append(Step(t.name, t.shape, src, dst, "convert", why, t.nbytes,
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


def requantize(src: str, dst: str, target: str, tensor_types=(), keeps=(),
               allow_requantize: bool = False, threads: int | None = None,
               dry_run: bool = False, out: TextIO | None = None,
               err: TextIO | None = None) -> list[Step]:
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

    with gguf.open(src) as f:
        steps = plan(f, target, tts, kps, allow_requantize)
        if dry_run:
            width = max((len(s.name) for s in steps), default=4)
            for s in steps:
                shape = "x".join(map(str, s.shape))
                out.write(f"{s.name:<{width}}  {shape:>16}  {s.src_type:>6} -> "
                          f"{s.dst_type:<6}  {s.action:<7} {s.src_bytes:>12} -> "
                          f"{s.dst_bytes:<12} {s.reason}\n")
            _write_summary(steps, out)
            return steps
        total = sum(s.src_bytes for s in steps if s.action == "convert")
        progress = _Progress(total, err)
        pool = ThreadPoolExecutor(threads) if threads > 1 else None
        try:
            with GGUFWriter(dst, alignment=f.alignment) as w:
                for k, v, ty, et in _metadata(f, target, steps):
                    w.add_metadata(k, v, ty, et)
                for s in steps:
                    w.add_tensor_info(s.name, s.shape, s.dst_type)
                for s in steps:
                    if s.action == "copy":
                        w.write_tensor_data(s.name, f.raw(s.name))
                    else:
                        w.write_tensor_data(s.name, _convert_tensor(f, s, pool, threads,
                                                                    progress))
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        progress.finish()
        src_size = f.file_size
    _write_summary(steps, out, src_size, os.path.getsize(dst))
    return steps


def cmd_requantize(args, out: TextIO, err: TextIO) -> int:
    requantize(args.src, args.dst, args.type, args.tensor_type, args.keep,
               args.allow_requantize, args.threads, args.dry_run, out, err)
    return 0
