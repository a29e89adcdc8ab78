"""Write a DFlashDraftModel as a classic DFlash GGUF (the layout
csrc/forward/dflash.h binds), with ds4py's own GGUF writer.

    python training/export_dflash.py CKPT.pt OUT.gguf [--type Q8_0]

CKPT.pt is what training/train_dflash.py saves ({"config": ..., "model":
state_dict}). Matrices are written as --type (F32, F16 or Q8_0; Q8_0 needs
rows of whole 32-blocks); norms always F32. Version 1: target layers stored
0-based. ``gguf_items`` takes plain numpy arrays (no torch) and returns
the metadata and tensors as dicts, so tests can write random drafters and
deliberately broken variants.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ds4py.gguf_writer import Value, ValueType, write_gguf  # noqa: E402

__all__ = ["gguf_items", "export", "tensor_names", "model_arrays"]

U32 = ValueType.UINT32
F32 = ValueType.FLOAT32


def tensor_names(model) -> dict[str, object]:
    """GGUF name -> torch parameter (llama.cpp src/llama-arch.cpp names for
    the dflash architecture)."""
    out = {"fc.weight": model.fc.weight, "enc.output_norm.weight": model.hidden_norm,
           "output_norm.weight": model.norm}
    for i, L in enumerate(model.layers):
        p = f"blk.{i}."
        out.update({
            p + "attn_norm.weight": L.attn_norm, p + "attn_q.weight": L.q.weight,
            p + "attn_k.weight": L.k.weight, p + "attn_v.weight": L.v.weight,
            p + "attn_output.weight": L.o.weight, p + "attn_q_norm.weight": L.q_norm,
            p + "attn_k_norm.weight": L.k_norm, p + "ffn_norm.weight": L.ffn_norm,
            p + "ffn_gate.weight": L.gate.weight, p + "ffn_up.weight": L.up.weight,
            p + "ffn_down.weight": L.down.weight,
        })
    return out


def _tensor(arr: np.ndarray, wtype: str) -> tuple:
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    shape = tuple(reversed(arr.shape))
    if arr.ndim == 1 or wtype == "F32":
        return ("F32", shape, arr)
    if wtype == "F16":
        return ("F16", shape, arr.astype(np.float16))
    from ds4py.quants import quantize_weights
    return (wtype, shape, quantize_weights(wtype, arr))


def gguf_items(cfg, arrays: dict, version: int = 1, wtype: str = "F32") -> tuple[dict, dict]:
    """(metadata, tensors) for write_gguf. cfg: anything with DFlashConfig's
    fields; arrays: GGUF name -> float array in numpy order (out, in)."""
    c = cfg
    layers = [int(x) + (1 if version == 0 else 0) for x in c.target_layers]
    meta = {
        "general.architecture": "dflash",
        "general.name": "ds4py DFlash drafter",
        "dflash.version": Value(version, U32),
        "dflash.block_count": Value(c.n_layer, U32),
        "dflash.embedding_length": Value(c.n_embd, U32),
        "dflash.feed_forward_length": Value(c.n_ff, U32),
        "dflash.attention.head_count": Value(c.n_head, U32),
        "dflash.attention.head_count_kv": Value(c.n_head_kv, U32),
        "dflash.attention.key_length": Value(c.head_dim, U32),
        "dflash.attention.layer_norm_rms_epsilon": Value(float(c.rms_eps), F32),
        "dflash.rope.freq_base": Value(float(c.rope_base), F32),
        "dflash.block_size": Value(c.block_size, U32),
        "dflash.target_layers": Value(layers, ValueType.ARRAY, U32),
        "tokenizer.ggml.mask_token_id": Value(c.mask_token_id, U32),
    }
    tensors = {name: _tensor(a, wtype) for name, a in arrays.items()}
    return meta, tensors


def model_arrays(model) -> dict:
    """GGUF name -> float32 numpy array of a DFlashDraftModel."""
    return {name: p.detach().float().cpu().numpy() for name, p in tensor_names(model).items()}


def export(model, path, version: int = 1, wtype: str = "F32") -> None:
    meta, tensors = gguf_items(model.c, model_arrays(model), version, wtype)
    write_gguf(path, meta, tensors)


def main() -> None:
    import torch
    from dflash_model import DFlashConfig, DFlashDraftModel

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ckpt")
    ap.add_argument("out")
    ap.add_argument("--type", default="Q8_0", choices=["F32", "F16", "Q8_0"])
    a = ap.parse_args()
    st = torch.load(a.ckpt, map_location="cpu", weights_only=False)
    m = DFlashDraftModel(DFlashConfig(**st["config"]))
    m.load_state_dict(st["model"])
    export(m, a.out, wtype=a.type)
    print(f"wrote {a.out} ({Path(a.out).stat().st_size} bytes)")


if __name__ == "__main__":
    main()
