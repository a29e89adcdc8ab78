"""Regenerate tests/golden/quants_weights/ from llama.cpp's weight quantizers.

    python3 tests/reference/make_weight_quant_fixtures.py

Needs llama-cpp-python built as tests/golden/quants/README.md says (its
libggml-base is the reference; ds4py is not imported). Every expected byte is
ggml_quantize_chunk(type, x, dst, 0, n_rows, n_per_row, imatrix=NULL) of the
stored float32 inputs, one call per (type, row length) over the whole matrix
of rows. Deterministic for a given ggml build: fixed seeds, no timestamps in
the .npz files (the date lives in manifest.json only).

Files written (all .npz members are plain numpy arrays, no pickles):

inputs.npz
    kinds           <U..   [K]        the input kinds, KINDS order
    L{n}_x          float32 [R, n]    R = ROWS_PER_KIND * K rows; row r is kind r // ROWS_PER_KIND
expected.npz
    {TYPE}_L{n}     uint8   [R, row_bytes]  llama.cpp's bytes for L{n}_x
      (for every TYPE in TYPES except F32 and every n in LENGTHS[block size];
       F32's ggml_quantize_chunk is a memcpy: checked here, not stored)
manifest.json   sha256 of each file, provenance, the kinds and lengths
"""

from __future__ import annotations

import datetime
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llamacpp_ggml as L  # noqa: E402
from make_quant_fixtures import BUILD_CMAKE_ARGS, cpu_flags, cpu_model, rng_for  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "golden" / "quants_weights"

# Every type ds4_quantize_weights writes (ggml ids; ds4's Q4_64A/Q2_64A are
# not ggml types and are tested elsewhere).
TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K",
         "Q6_K", "IQ4_NL", "IQ4_XS"]
# Row lengths by block size: 1, 3, 7 blocks of 32 and the K-quant lengths
# (1, 2, 16 super-blocks) for the 32-blocks; the K-quant lengths for 256.
LENGTHS = {1: [32, 96, 224, 256, 512, 4096], 32: [32, 96, 224, 256, 512, 4096],
           256: [256, 512, 4096]}
ALL_LENGTHS = sorted({n for ls in LENGTHS.values() for n in ls})
ROWS_PER_KIND = 2
KINDS = ["normal", "heavy", "uniform", "zeros", "constant", "outlier", "tiny",
         "block_scaled", "one_sided", "grid", "nonfinite", "bit_patterns"]


def weight_rows(rng: np.random.Generator, kind: str, rows: int, n: int) -> np.ndarray:
    """`rows` x `n` float32 inputs of one kind (see KINDS)."""
    out = np.empty((rows, n), np.float32)
    for r in range(rows):
        out[r] = _row(rng, kind, r, n)
    return out


def _row(rng, kind: str, r: int, n: int) -> np.ndarray:
    if kind == "normal":          # model-like weights
        x = rng.standard_normal(n) * 0.02
    elif kind == "heavy":         # Student-t, 2 degrees of freedom: big tails
        x = rng.standard_t(2.0, n) * 0.02
    elif kind == "uniform":
        x = rng.uniform(-1.0, 1.0, n)
    elif kind == "zeros":         # exact zeros, an all-zero 32-block (and 256-block)
        x = rng.standard_normal(n) * 0.02
        x[rng.random(n) < 0.4] = 0.0
        x[:32] = 0.0
        if n >= 512:
            x[256:512] = 0.0
            x[256 + int(rng.integers(256))] = 0.05   # one nonzero in a zero super-block
    elif kind == "constant":      # row 0 one value; row 1 one value per 32-block
        if r % 2 == 0:
            x = np.full(n, 0.37)
        else:
            vals = rng.choice([0.0, -1.5, 2.0 ** -10, 3.0, -0.02], size=n // 32)
            x = np.repeat(vals, 32)
    elif kind == "outlier":       # one huge value in an otherwise normal row
        x = rng.standard_normal(n) * 0.02
        x[int(rng.integers(n))] = (1 if rng.random() < 0.5 else -1) * 10.0 ** rng.uniform(1.5, 3)
    elif kind == "tiny":          # 1e-45..1e-12: float32 subnormals, GROUP_MAX_EPS (1e-15)
        x = np.where(rng.random(n) < 0.5, -1.0, 1.0) * 10.0 ** rng.uniform(-45, -12, n)
    elif kind == "block_scaled":  # per-32-block scale 1e-10..1e6: fp16 scales under/overflow
        x = rng.standard_normal(n)
        for b in range(0, n, 32):
            x[b:b + 32] *= 10.0 ** rng.uniform(-10, 6)
    elif kind == "one_sided":     # row 0 all positive, row 1 all negative (min > 0 paths)
        x = np.abs(rng.standard_normal(n)) * 0.02 + 0.01
        if r % 2:
            x = -x
    elif kind == "grid":          # multiples of 1/8: exact ties in every rounding step
        x = rng.integers(-16, 17, n) * 0.125
    elif kind == "nonfinite":     # +-Inf and payload-free NaNs (both signs) among normals
        x = rng.standard_normal(n)
        u = rng.random(n)
        x[u < 0.01] = np.inf
        x[(u >= 0.01) & (u < 0.02)] = -np.inf
        x[(u >= 0.02) & (u < 0.025)] = np.nan
        x = x.astype(np.float32)
        neg_nan = (u >= 0.025) & (u < 0.03)
        x[neg_nan] = np.array([0xFFC00000], np.uint32).view(np.float32)[0]
        return x
    elif kind == "bit_patterns":  # random float32 bits, NaNs turned into +-Inf
        u = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
        nan = (u & 0x7FFFFFFF) > 0x7F800000
        u[nan] &= 0xFF800000
        return u.view(np.float32)
    else:
        raise ValueError(kind)
    return x.astype(np.float32)


def inputs_for_length(n: int) -> np.ndarray:
    return np.concatenate([weight_rows(rng_for("wq", kind, n), kind, ROWS_PER_KIND, n)
                           for kind in KINDS])


def main() -> int:
    g = L.load()
    OUT.mkdir(parents=True, exist_ok=True)
    inputs = {"kinds": np.array(KINDS)}
    expected = {}
    with np.errstate(all="ignore"):
        for n in ALL_LENGTHS:
            inputs[f"L{n}_x"] = inputs_for_length(n)
        for name in TYPES:
            t = L.GGML_TYPES[name]
            if g.base.ggml_quantize_requires_imatrix(t):
                raise SystemExit(f"{name} needs an imatrix in this ggml")
            for n in LENGTHS[g.block_size(t)]:
                x = inputs[f"L{n}_x"]
                raw = g.quantize_chunk(t, x, nrows=x.shape[0]).reshape(x.shape[0], -1)
                if name == "F32":
                    if not np.array_equal(raw.view(np.uint32), x.view(np.uint32)):
                        raise SystemExit("ggml_quantize_chunk(F32) is not a copy")
                    continue
                expected[f"{name}_L{n}"] = raw
    np.savez_compressed(OUT / "inputs.npz", **inputs)
    np.savez_compressed(OUT / "expected.npz", **expected)
    files = {f: hashlib.sha256((OUT / f).read_bytes()).hexdigest()
             for f in ("inputs.npz", "expected.npz")}
    manifest = {
        "files": files,
        "types": TYPES,
        "kinds": KINDS,
        "rows_per_kind": ROWS_PER_KIND,
        "lengths": {str(k): v for k, v in LENGTHS.items()},
        "f32_is_copy_checked": True,
        "llama_cpp_python": g.llama_cpp_python_version,
        "ggml_commit": g.commit(),
        "ggml_version": g.version(),
        "cmake_args_documented": BUILD_CMAKE_ARGS,
        "cpu_model": cpu_model(),
        "cpu_flags": cpu_flags(),
        "generated_utc": datetime.datetime.now(datetime.timezone.utc)
                                          .strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python3 tests/reference/make_weight_quant_fixtures.py",
        "python": sys.version.split()[0],
        "numpy": np.__version__,
    }
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    total = 0
    for f in files:
        size = (OUT / f).stat().st_size
        total += size
        print(f"{f:16s} {size:9d} bytes")
    print(f"total {total} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
