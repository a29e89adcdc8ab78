"""``python -m gguf_tools inspect FILE [--json]``: what one GGUF file holds.

File-level (``python -m ds4py inspect`` is model-level: it loads the model).
Reports the header, the metadata (long arrays such as the tokenizer's
summarised: count + first few), the tensor table, bytes per type, whether a
nextn (MTP) head is present (``blk.N.nextn.*``), ds4-only types labelled
"(ds4-only)", and a warning line for anything ds4py cannot run: a matrix
(ggml_n_dims >= 2) whose type has no DS4_TYPE_DOT kernel, or an
architecture other than qwen35 / qwen35moe.
"""

from __future__ import annotations

import json
import re
from typing import Any, TextIO

from ds4py import gguf
from ds4py.quants import type_info

__all__ = ["inspect_file", "cmd_inspect", "n_dims"]

SUPPORTED_ARCHS = ("qwen35", "qwen35moe")
ARRAY_HEAD = 5          # array elements shown before "..."
LONG_STRING = 120       # strings longer than this are cut in the text output
_NEXTN = re.compile(r"^blk\.(\d+)\.nextn\.")


def n_dims(shape) -> int:
    """ggml_n_dims: trailing dimensions of 1 do not count (a [128, 1]
    tensor is 1-D to ggml), and a scalar is 1-D."""
    n = len(shape)
    while n > 1 and shape[n - 1] == 1:
        n -= 1
    return max(n, 1)


def _summary(value: Any) -> Any:
    if isinstance(value, list) and len(value) > ARRAY_HEAD:
        return {"count": len(value), "first": [_summary(v) for v in value[:ARRAY_HEAD]]}
    if isinstance(value, bytes):
        return {"bytes": value[:LONG_STRING].hex(), "length": len(value)}
    return value


def inspect_file(path: str) -> dict[str, Any]:
    """Every fact `inspect` prints, as one JSON-serialisable dict."""
    with gguf.open(path) as f:
        meta, mtypes = f.metadata, f.metadata_types
        tensors = []
        per_type: dict[str, dict[str, int]] = {}
        warnings = []
        nextn_layers = set()
        for t in f.tensors.values():
            ti = type_info(t.type_id)
            tensors.append({"name": t.name, "type": t.type_name, "shape": list(t.shape),
                            "bytes": t.nbytes, "offset": t.offset, "ds4_only": ti.ds4_only})
            pt = per_type.setdefault(t.type_name, {"tensors": 0, "bytes": 0,
                                                   "ds4_only": ti.ds4_only})
            pt["tensors"] += 1
            pt["bytes"] += t.nbytes
            m = _NEXTN.match(t.name)
            if m:
                nextn_layers.add(int(m.group(1)))
            if n_dims(t.shape) >= 2 and not ti.can_dot:
                warnings.append(f"tensor {t.name}: type {t.type_name} has no dot kernel in "
                                "ds4py (cannot be used as a matrix)")
        arch = meta.get("general.architecture")
        if arch not in SUPPORTED_ARCHS:
            warnings.append(f"architecture {arch!r} is not one ds4py runs "
                            f"({' / '.join(SUPPORTED_ARCHS)})")
        md = []
        for k, v in meta.items():
            ty = mtypes[k]
            md.append({"key": k, "type": "/".join(x.name for x in ty), "value": _summary(v)})
        return {
            "file": path,
            "header": {"version": f.version, "alignment": f.alignment,
                       "n_kv": len(meta), "n_tensors": len(tensors),
                       "data_offset": f.data_offset, "file_size": f.file_size},
            "architecture": arch,
            "metadata": md,
            "tensors": tensors,
            "bytes_per_type": per_type,
            "tensor_bytes": sum(t["bytes"] for t in tensors),
            "nextn": {"present": bool(nextn_layers), "layers": sorted(nextn_layers)},
            "warnings": warnings,
        }


def _fmt_value(v: Any) -> str:
    if isinstance(v, dict) and "count" in v:
        return (f"[{v['count']} items: "
                + ", ".join(_fmt_value(x) for x in v["first"]) + ", ...]")
    s = json.dumps(v, ensure_ascii=False)
    return s if len(s) <= LONG_STRING else s[:LONG_STRING] + f"... ({len(s)} chars)"


def _size(n: int) -> str:
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k:
            return f"{n / k:.2f} {unit}"
    return f"{n} B"


def cmd_inspect(args, out: TextIO, err: TextIO) -> int:
    r = inspect_file(args.file)
    if args.json:
        out.write(json.dumps(r) + "\n")
        return 0
    w = out.write
    h = r["header"]
    w(f"{r['file']}: GGUF v{h['version']}, {_size(h['file_size'])} ({h['file_size']} bytes), "
      f"alignment {h['alignment']}, data at {h['data_offset']}\n")
    w(f"metadata ({h['n_kv']} keys):\n")
    for m in r["metadata"]:
        w(f"  {m['key']:<44} {m['type']:<14} {_fmt_value(m['value'])}\n")
    w(f"tensors ({h['n_tensors']}):\n")
    width = max((len(t["name"]) for t in r["tensors"]), default=4)
    for t in r["tensors"]:
        label = t["type"] + (" (ds4-only)" if t["ds4_only"] else "")
        shape = "x".join(str(d) for d in t["shape"])
        w(f"  {t['name']:<{width}}  {label:<18} {shape:>18} {t['bytes']:>12}\n")
    w(f"bytes per type (total {_size(r['tensor_bytes'])}):\n")
    for name, pt in sorted(r["bytes_per_type"].items(), key=lambda kv: -kv[1]["bytes"]):
        label = name + (" (ds4-only)" if pt["ds4_only"] else "")
        w(f"  {label:<18} {pt['tensors']:5d} tensors {pt['bytes']:>14} bytes "
          f"({_size(pt['bytes'])})\n")
    nx = r["nextn"]
    w("nextn head: " + (f"yes (blk {', '.join(map(str, nx['layers']))})" if nx["present"]
                        else "no") + "\n")
    for msg in r["warnings"]:
        w(f"warning: {msg}\n")
    return 0
