"""Random-weight tensor data for the bench models, written directly as
quantized blocks (random codes, small finite scales): no float intermediate,
so a multi-GB file costs only its own bytes of memory per piece.

numpy + gguf (gguf-py) only, no ds4py: gpu/tools/gpu_bench_models.py runs
this on the GPU machine, where the ds4py extension is not built, to make the
same kind of file bench/bench_models.py makes here.
"""

from __future__ import annotations

import gguf
import numpy as np

CHUNK_BYTES = 64 << 20  # random bytes are made and written in pieces of this size

# Byte offsets of the fp16 scale fields per block (csrc/quants/quants.h).
_HALVES = {"Q8_0": (0,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "Q5_0": (0,),
           "Q5_1": (0, 2), "Q4_0": (0,), "Q4_1": (0, 2), "IQ4_NL": (0,)}


def block_geometry(t: str) -> tuple[int, int]:
    """(weights per block, bytes per block) of ggml type name t."""
    return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[t]]


def random_blocks(rng, t: str, n_values: int, n_in: int):
    """Yield the bytes of n_values weights of type t as random blocks, in
    pieces: random codes, scales sized so a row's dot stays O(1)."""
    if t in ("F32", "F16"):
        dt = np.float32 if t == "F32" else np.float16
        step = CHUNK_BYTES // 4
        for i in range(0, n_values, step):
            m = min(step, n_values - i)
            yield (rng.standard_normal(m) / np.sqrt(n_in)).astype(dt).view(np.uint8)
        return
    block_size, type_size = block_geometry(t)
    nb_total = n_values // block_size
    per = max(1, CHUNK_BYTES // type_size)
    # weight ~ d * code; codes span ~[-8, 8] (4-bit) .. [-128, 127] (8-bit)
    # (|int8 sub-block scale| ~ 64 for Q6_K, 6-bit ~ 32 for Q4_K/Q5_K)
    code_mag = {"Q8_0": 74.0, "Q6_K": 18.0 * 64, "Q4_K": 8.0 * 32, "Q5_K": 16.0 * 32}.get(t, 8.0)
    d = np.float16(1.0 / (code_mag * np.sqrt(n_in)))
    for i in range(0, nb_total, per):
        m = min(per, nb_total - i)
        raw = rng.integers(0, 256, size=(m, type_size), dtype=np.uint8)
        for off in _HALVES.get(t, ()):
            raw[:, off:off + 2] = np.full(m, d, np.float16).view(np.uint8).reshape(m, 2)
        yield raw.reshape(-1)


def small_f32(rng, name: str, shape) -> np.ndarray:
    """Norm weights 1, GDN decay parameters in their trained ranges, else small."""
    n = int(np.prod(shape))
    if name.endswith("ssm_a"):
        return -rng.uniform(0.5, 8.0, n).astype(np.float32)  # -exp(A_log) < 0
    if name.endswith("ssm_dt.bias"):
        return rng.uniform(-2.0, 0.0, n).astype(np.float32)
    if "norm" in name:
        return np.ones(n, np.float32)
    return (rng.standard_normal(n) * 0.1).astype(np.float32)
