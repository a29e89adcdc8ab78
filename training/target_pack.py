"""Pack the demo target's HF checkpoint small enough to travel to the device
machine beside the repository (its 64 MiB upload limit: the repository alone
is ~46 MiB), and unpack it there into transformers' Qwen3_5ForCausalLM.

    python training/target_pack.py training/init training/carry/target.npz

Matrices are stored the way the shipped GGUF stores them: Q8_0 (blocks of 32
int8 codes with one fp16 scale, d = amax/127, code = round(x/d)), so the
unpacked trunk is the Q8_0 model ds4py runs (up to float rounding), which is
the target a drafter must agree with. Vectors (norms, A_log, dt_bias, conv
taps) stay in float32. 14.8 M parameters -> ~15.7 MB.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

QK = 32


def _q8_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    blocks = x.astype(np.float32).reshape(-1, QK)
    amax = np.abs(blocks).max(axis=1)
    d = (amax / 127.0).astype(np.float16)
    inv = np.divide(1.0, d.astype(np.float32), out=np.zeros_like(amax), where=d != 0)
    codes = np.clip(np.rint(blocks * inv[:, None]), -127, 127).astype(np.int8)
    return codes, d


def pack(hf_dir: str | Path, out: str | Path) -> None:
    from safetensors import safe_open

    hf_dir = Path(hf_dir)
    arrays: dict[str, np.ndarray] = {"config.json": np.frombuffer(
        (hf_dir / "config.json").read_bytes(), dtype=np.uint8)}
    for f in sorted(hf_dir.glob("*.safetensors")):
        with safe_open(f, "pt") as s:
            for k in s.keys():
                t = s.get_tensor(k).float().numpy()
                if t.ndim >= 2 and t.size % QK == 0 and t.shape[-1] % QK == 0:
                    codes, d = _q8_0(t)
                    arrays[f"q8:{k}:codes"] = codes
                    arrays[f"q8:{k}:d"] = d
                    arrays[f"q8:{k}:shape"] = np.array(t.shape, dtype=np.int64)
                else:
                    arrays[f"f32:{k}"] = t.astype(np.float32)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp.npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, out)


def unpack_state(path: str | Path) -> tuple[dict, dict]:
    """-> (config dict, {name: float32 ndarray})."""
    z = np.load(path)
    config = json.loads(z["config.json"].tobytes().decode())
    state: dict[str, np.ndarray] = {}
    for key in z.files:
        if key.startswith("f32:"):
            state[key[4:]] = z[key]
        elif key.startswith("q8:") and key.endswith(":codes"):
            name = key[3:-6]
            codes = z[key].astype(np.float32)
            d = z[f"q8:{name}:d"].astype(np.float32)
            state[name] = (codes * d[:, None]).reshape(tuple(z[f"q8:{name}:shape"]))
    return config, state


def load_packed(path: str | Path, dtype=None):
    """A Qwen3_5ForCausalLM holding the packed weights (float32 by default)."""
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    config, state = unpack_state(path)
    cfg = Qwen3_5TextConfig(**{k: v for k, v in config.items() if k != "architectures"})
    model = Qwen3_5ForCausalLM(cfg)
    tensors = {k: torch.from_numpy(v) for k, v in state.items()}
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    # The LM head is tied to the embedding: it is the only key allowed missing.
    missing = [m for m in missing if m != "lm_head.weight"]
    if missing or unexpected:
        raise ValueError(f"packed target does not match the model: missing {missing}, "
                         f"unexpected {unexpected}")
    model.tie_weights()
    return model.to(dtype or torch.float32)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python training/target_pack.py HF_DIR OUT.npz")
    pack(sys.argv[1], sys.argv[2])
    print(f"wrote {sys.argv[2]} ({Path(sys.argv[2]).stat().st_size} bytes)")
