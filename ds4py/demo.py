"""`python -m ds4py info [PATH]`: summarize a GGUF file, or, without PATH,
write a small GGUF of random weights in several quant types, read it back
through the core and check every tensor against the original values."""

from __future__ import annotations

import os
import sys
import tempfile
from typing import TextIO

import numpy as np

from . import gguf, quants
from ._core import ffi, lib
from .errors import DS4Error, QuantError
from .gguf_writer import GGUFWriter, ValueType

# The weight types the core can quantize, in the order the demo writes them.
DEMO_TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_64A", "Q2_64A"]


def isa_name() -> str:
    """The kernel instruction set in use (after DS4_FORCE_SCALAR)."""
    return ffi.string(lib.ds4_isa_name(lib.ds4_isa_auto())).decode()


def type_label(type_id: int) -> str:
    t = quants.type_info(type_id)
    return f"{t.name} (ds4-only)" if t.ds4_only else t.name


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def short_value(v, width: int = 60) -> str:
    """A value cut to about `width` characters; long arrays show their head."""
    if isinstance(v, list):
        head = ", ".join(short_value(x, 20) for x in v[:4])
        more = f", ... ({len(v)} items)" if len(v) > 4 else ""
        text = f"[{head}{more}]"
    else:
        text = repr(v)
    return text if len(text) <= width else text[:width - 3] + "..."


def _type_name(types: tuple) -> str:
    if types[0] == ValueType.ARRAY:
        return f"ARRAY[{ValueType(types[1]).name}]"
    return ValueType(types[0]).name


def print_tensor_table(rows: list[tuple], header: tuple, out: TextIO) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        cells = (str(c).ljust(w) for c, w in zip(r, widths, strict=True))
        print(("  " + "  ".join(cells)).rstrip(), file=out)


def summarize(path: str, out: TextIO = sys.stdout) -> int:
    """Print a file's header, metadata and tensor table. Returns 0."""
    with gguf.open(path) as f:
        print(f"{path}: GGUF v{f.version}, {_size(f.file_size)}, alignment {f.alignment}, "
              f"data at offset {f.data_offset}", file=out)
        print(f"kernel ISA: {isa_name()}", file=out)
        meta, types = f.metadata, f.metadata_types
        print(f"metadata ({len(meta)} keys):", file=out)
        kw = max((len(k) for k in meta), default=0)
        for k, v in meta.items():
            print(f"  {k.ljust(kw)}  {_type_name(types[k]):<14} {short_value(v)}", file=out)
        tensors = f.tensors
        total = sum(t.nbytes for t in tensors.values())
        print(f"tensors ({len(tensors)}, {_size(total)}):", file=out)
        rows = [(t.name, type_label(t.type_id), "x".join(map(str, t.shape)), _size(t.nbytes))
                for t in tensors.values()]
        print_tensor_table(rows, ("name", "type", "shape", "size"), out)
    return 0


# ------------------------------------------------------------- self-check --

def error_bound(type_name: str, x: np.ndarray) -> np.ndarray:
    """Largest |dequant(quant(x)) - x| each element may show, from the format.

    x is in numpy order (rows last axis); quant blocks run along rows. `a` is
    the absolute maximum of each element's block.
    """
    bs = quants.type_info(type_name).block_size
    a = np.abs(x).reshape(-1, bs).max(axis=1, keepdims=True)
    a = np.broadcast_to(a, (a.shape[0], bs)).reshape(x.shape).astype(np.float64)
    if type_name == "F32":
        return np.zeros_like(a)
    if type_name == "F16":   # round to nearest: half an ulp (2^-11 relative), or
        return a * 2.0**-11 + 2.0**-25   # half the smallest subnormal (2^-24)
    if type_name == "BF16":  # round to nearest with 8 significant bits
        return a * 2.0**-8
    if type_name == "Q8_0":
        # Step d = a/127: codes round to within d/2; the scale is stored as
        # fp16 (relative error 2^-11), which moves code 127 by up to 127*d*2^-11.
        return a * (0.5 / 127 + 2.0**-11) * 1.01
    maxq = {"Q4_64A": 15, "Q2_64A": 3}.get(type_name)
    if maxq is not None:
        # scale = (max-min)/maxq <= 2a/maxq, codes round to half a step; scale
        # and bias are bf16 truncated (relative error < 2^-7), which can pull
        # the top code in by (range + |min|) * 2^-7 <= 3a/128 (ds4-notes.md).
        return a * (1.0 / maxq + 3.0 / 128) * 1.01
    raise QuantError(f"no error bound for {type_name}")


def _demo_weights(rng: np.random.Generator) -> np.ndarray:
    # 8 rows of 256: a whole number of blocks for every demo type; a few
    # outliers so blocks differ in range.
    w = rng.standard_normal((8, 256)).astype(np.float32) * 0.05
    w[rng.integers(0, 8, 4), rng.integers(0, 256, 4)] *= 20
    return w


def self_check(out: TextIO = sys.stdout, directory: str | None = None) -> int:
    """Write, read back and verify a small GGUF. Returns 0 when all match."""
    rng = np.random.default_rng(2024)
    originals: dict[str, tuple[str, np.ndarray, np.ndarray]] = {}
    notes = []
    for tname in DEMO_TYPES:
        x = _demo_weights(rng)
        stored = tname
        try:
            raw = quants.quantize(tname, x)
        except QuantError as e:   # a type the core cannot quantize yet
            stored = "F16" if tname != "F32" else "F32"
            raw = quants.quantize(stored, x)
            notes.append(f"{tname}: not quantizable here ({e}); stored as {stored}")
        originals[f"demo.{tname.lower()}.weight"] = (stored, x, raw)

    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        path = os.path.join(tmp, "ds4py-demo.gguf")
        with GGUFWriter(path) as w:
            w.add_metadata("general.architecture", "ds4py-demo")
            w.add_metadata("general.name", "ds4py self-check")
            w.add_metadata("demo.block_count", 1, ValueType.UINT32)
            w.add_metadata("demo.types", DEMO_TYPES)
            for name, (stored, x, raw) in originals.items():
                w.add_tensor_info(name, tuple(reversed(x.shape)), stored, nbytes=raw.size)
            for name, (_, _, raw) in originals.items():
                w.write_tensor_data(name, raw)

        summarize(path, out)
        rows, failures = [], 0
        with gguf.open(path) as f:
            for name, (stored, x, raw) in originals.items():
                info = f.tensors[name]
                same_bytes = f.raw(name).tobytes() == raw.tobytes()
                err = np.abs(f.array(name).astype(np.float64) - x)
                bound = error_bound(stored, x)
                ok = same_bytes and info.type_name == stored and bool(np.all(err <= bound))
                failures += not ok
                rows.append((name, type_label(info.type_id), f"{err.max():.3g}",
                             f"{bound.max():.3g}", "ok" if ok else "MISMATCH"))
    print("self-check (max |dequantized - original| vs the format's bound):", file=out)
    print_tensor_table(rows, ("name", "type", "max err", "bound", ""), out)
    for n in notes:
        print(f"note: {n}", file=out)
    if failures:
        print(f"FAILED: {failures} of {len(rows)} tensors outside their expected error", file=out)
        return 1
    print(f"OK: {len(rows)} tensors written, read back and within their expected error "
          f"(ISA {isa_name()})", file=out)
    return 0


def info(path: str | None, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """The `info` command: 0 ok, 1 self-check mismatch, 2 error."""
    try:
        return summarize(path, out) if path is not None else self_check(out)
    except BrokenPipeError:      # `... | head`: the reader left; not an error
        return 0
    except (DS4Error, OSError, ValueError) as e:
        print(f"error: {e}", file=err)
        return 2
    except Exception as e:       # a bug, but the CLI still never shows a traceback
        print(f"error: unexpected {type(e).__name__}: {e}", file=err)
        return 2
