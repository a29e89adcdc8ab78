"""Test-only generator of standalone nextn (MTP) head files and trunk-only
models, made from the golden GGUFs with ds4py.gguf_writer.

The layout is the one llama.cpp's converter writes for MTP-only output
(vendor/llama.cpp conversion/qwen.py _QwenMtpMixin with mtp_only, i.e.
``convert_hf_to_gguf.py --mtp``): every metadata key of the full model
(block_count still counts the head block, nextn_predict_layers = 1), the
head's ``blk.N.*`` tensors, and the ``embed_tokens`` / ``norm`` /
``lm_head`` tensors (``token_embd``, ``output_norm``, ``output`` when the
model has one). llama.cpp recognises such a file by its missing
``blk.0.attn_norm.weight`` (src/models/qwen35*.cpp load_arch_tensors).

Besides the converter layout: a minimal head (``blk.N.*`` only), a trunk
without its head (what ``--no-mtp`` writes: block_count and the per-block
arrays shortened, nextn_predict_layers 0), and deliberately wrong heads for
the refusal tests.
"""

from __future__ import annotations

import os

import numpy as np

import ds4py
from ds4py.gguf import ValueType
from ds4py.gguf_writer import Value, write_gguf

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "golden", "models")

_CACHE: dict[str, tuple[dict, dict]] = {}


def golden_path(name: str) -> str:
    return os.path.join(MODELS, name + ".gguf")


def parts(name: str) -> tuple[dict, dict]:
    """(metadata, tensors) of golden file `name` in write_gguf's form:
    key -> Value, tensor name -> (type name, GGUF shape, bytes). Copies."""
    if name not in _CACHE:
        with ds4py.gguf.open(golden_path(name)) as f:
            types = f.metadata_types
            meta = {k: Value(v, types[k][0], types[k][1] if len(types[k]) > 1 else None)
                    for k, v in f.metadata.items()}
            tensors = {n: (ti.type_name, ti.shape, bytes(f.raw(n)))
                       for n, ti in f.tensors.items()}
        _CACHE[name] = (meta, tensors)
    meta, tensors = _CACHE[name]
    return dict(meta), dict(tensors)


def arch(meta: dict) -> str:
    return meta["general.architecture"].value


def n_main(meta: dict) -> int:
    a = arch(meta)
    return meta[f"{a}.block_count"].value - meta[f"{a}.nextn_predict_layers"].value


def block(name: str) -> int | None:
    if not name.startswith("blk."):
        return None
    return int(name.split(".")[1])


GLOBALS = ("token_embd.weight", "output_norm.weight", "output.weight")


def head_parts(name: str, globals_: bool = True) -> tuple[dict, dict]:
    """The converter's MTP-only layout of golden model `name` (globals_
    False: only the blk.N.* tensors)."""
    meta, tensors = parts(name)
    n = n_main(meta)
    keep = {k: v for k, v in tensors.items()
            if block(k) == n or (globals_ and k in GLOBALS)}
    return meta, keep


def trunk_parts(name: str) -> tuple[dict, dict]:
    """Golden model `name` without its nextn block (the converter's --no-mtp
    layout)."""
    meta, tensors = parts(name)
    a, n = arch(meta), n_main(meta)
    meta[f"{a}.block_count"] = Value(n, ValueType.UINT32)
    meta[f"{a}.nextn_predict_layers"] = Value(0, ValueType.UINT32)
    rl = meta[f"{a}.attention.recurrent_layers"]
    meta[f"{a}.attention.recurrent_layers"] = Value(rl.value[:n], rl.type, rl.element_type)
    return meta, {k: v for k, v in tensors.items() if block(k) is None or block(k) < n}


def write(path, meta: dict, tensors: dict) -> str:
    path = str(path)
    write_gguf(path, meta, tensors)
    return path


def head_file(tmp, name: str, globals_: bool = True) -> str:
    return write(os.path.join(tmp, f"mtp-{name}{'' if globals_ else '-min'}.gguf"),
                 *head_parts(name, globals_))


def trunk_file(tmp, name: str) -> str:
    return write(os.path.join(tmp, f"trunk-{name}.gguf"), *trunk_parts(name))


def _f32(shape, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    return rng.normal(0.0, 0.05, n).astype(np.float32).tobytes()


def resized_head(tmp, name: str, new_embd: int, globals_: bool = True) -> str:
    """A head of golden model `name`'s shape except n_embd = new_embd (every
    tensor F32 random; eh_proj's input is 2*n_embd): a head made for a
    narrower or wider model of the same family."""
    meta, tensors = head_parts(name, globals_)
    a = arch(meta)
    old = meta[f"{a}.embedding_length"].value
    meta[f"{a}.embedding_length"] = Value(new_embd, ValueType.UINT32)
    out = {}
    for i, (k, (_t, shape, _b)) in enumerate(sorted(tensors.items())):
        if k.endswith("nextn.eh_proj.weight"):
            shape = (2 * new_embd, new_embd)
        else:
            shape = tuple(new_embd if d == old else d for d in shape)
        out[k] = ("F32", shape, _f32(shape, i))
    return write(os.path.join(tmp, f"mtp-{name}-embd{new_embd}{'' if globals_ else '-min'}.gguf"),
                 meta, out)


def wider_vocab_head(tmp, name: str, extra: int) -> str:
    """Golden model `name`'s head whose token_embd (and output) carry `extra`
    more rows: a head for a bigger vocabulary. The tokenizer keys are
    dropped (the converter would have written the bigger vocabulary)."""
    meta, tensors = head_parts(name)
    meta = {k: v for k, v in meta.items() if not k.startswith("tokenizer.")}
    for k in ("token_embd.weight", "output.weight"):
        if k in tensors:
            t, shape, b = tensors[k]
            row = len(b) // shape[1]
            tensors[k] = (t, (shape[0], shape[1] + extra), b + bytes(row * extra))
    return write(os.path.join(tmp, f"mtp-{name}-vocab+{extra}.gguf"), meta, tensors)


def deeper_head(tmp, name: str) -> str:
    """The head of golden model `name` relabelled as the head of a trunk one
    layer deeper (blk.N -> blk.N+1, block_count + 1)."""
    meta, tensors = head_parts(name)
    a, n = arch(meta), n_main(meta)
    meta[f"{a}.block_count"] = Value(n + 2, ValueType.UINT32)
    rl = meta[f"{a}.attention.recurrent_layers"]
    meta[f"{a}.attention.recurrent_layers"] = Value(rl.value[:n] + [False, False], rl.type,
                                                    rl.element_type)
    out = {}
    for k, v in tensors.items():
        out[k.replace(f"blk.{n}.", f"blk.{n + 1}.") if block(k) == n else k] = v
    return write(os.path.join(tmp, f"mtp-{name}-deeper.gguf"), meta, out)


def head_with(tmp, name: str, fname: str, edit) -> str:
    """The converter layout of `name`'s head after edit(meta, tensors)."""
    meta, tensors = head_parts(name)
    edit(meta, tensors)
    return write(os.path.join(tmp, fname), meta, tensors)
