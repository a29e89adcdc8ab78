"""Regenerate tests/golden/quants/ from llama.cpp's own ggml code.

    make golden-quants          # == python3 tests/reference/make_quant_fixtures.py

Needs llama-cpp-python built as tests/golden/quants/README.md says (its ggml
shared libraries are the reference; ds4py is not imported). Output is
deterministic for a given ggml build: fixed seeds, no timestamps inside the
.npz files (the date lives in manifest.json / README.md only).

Files written (all .npz members are plain numpy arrays, no pickles):

activations.npz
    L{n}_x          float32 [A, n]   activation rows (A = len(ACT_KINDS))
    L{n}_q8_0       uint8   [A, b]   CPU from_float Q8_0 (x86: AVX/AVX2 path, RNE of x*127/amax)
    L{n}_q8_0_ref   uint8   [A, b]   ggml_quantize_chunk(Q8_0) (quantize_row_q8_0_ref, roundf(x/d))
    L{n}_q8_1       uint8   [A, b]   CPU from_float Q8_1
    L{n}_q8_1_ref   uint8   [A, b]   type_traits[Q8_1].from_float_ref
    L{n}_q8_K       uint8   [A, b]   CPU from_float Q8_K
    L{n}_f16        uint8   [A, 2n]  CPU from_float F16 (F16C vcvtps2ph)
    L{n}_bf16       uint8   [A, 2n]  CPU from_float BF16
      (Q8_* members only where n is a multiple of the block size)
    tie_x, tie_q8_0, tie_q8_0_ref, tie_q8_1, tie_q8_1_ref, tie_q8_K
                                     vectors whose x*127/amax land exactly on k+0.5
    special_x, special_f16, special_f16_ref, special_bf16, special_bf16_ref
                                     inf/nan/subnormal/overflow/tie inputs for F16/BF16
weights_{TYPE}.npz (one per weight type)
    type_id, vec_dot_type, block_size, type_size, lengths
    L{n}_raw        uint8   [R, bytes]  weight rows as stored in GGUF
    L{n}_kind       int8    [R]         WEIGHT_KINDS index: how the row was made
    L{n}_deq        uint32  [R, n]      llama.cpp to_float output, float32 bits
    L{n}_dot        float32 [R, A]      llama.cpp CPU vec_dot(weight row r, L{n}_<paired act>[a])
    L{n}_absterms   float64 [R, A]      sum_j (|w_scale_part_j| + |w_offset_part_j|) * |act_j|
                                        (Q8_1 pairs: sum_j |w_scale_part_j*act_j|
                                         + sum_blocks |m*s|),
                                        the magnitude the dot tolerance scales with (see the test)
    L{n}_allow      float64 [R, A]      absolute allowance for flush-to-zero (BF16 only, else 0)
    (F16/BF16 also: all_raw / all_deq = every 16-bit pattern and its to_float.)
manifest.json   sha256 of each file + provenance
"""

from __future__ import annotations

import datetime
import hashlib
import json
import platform
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llamacpp_ggml as L  # noqa: E402

# The llama-cpp-python build the README documents (GGML_NATIVE=OFF: a native
# build dies with SIGILL on the CI VMs; AMX off: we never compare against AMX).
BUILD_CMAKE_ARGS = ("-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON "
                    "-DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON "
                    "-DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF "
                    "-DGGML_AMX_BF16=OFF")

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "golden" / "quants"

WEIGHT_TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"]
WEIGHT_KINDS = ["ggml_normal", "ggml_heavy", "ggml_zeros", "bytes_a", "bytes_b"]
ACT_KINDS = ["normal", "heavy", "zeros", "block_scaled"]

# Row lengths: 1, 3 and 7 blocks (odd counts, so no kernel can assume pairs
# of blocks) and one model-sized row.
LENGTHS = {32: [32, 96, 224, 4096], 256: [256, 768, 1792, 4096], 1: [1, 33, 255, 4096]}

# fp16 scale fields of one block: (byte offset, role). 'd' multiplies the
# codes, 'm' is the additive part (ggml-common.h layouts). Used to replace
# random bytes with finite scales, and to split a weight into its scale
# part and offset part for the dot tolerance.
SCALE_FIELDS = {
    "Q4_0": [(0, "d")], "Q5_0": [(0, "d")], "Q8_0": [(0, "d")],
    "IQ4_NL": [(0, "d")], "IQ4_XS": [(0, "d")],
    "Q4_1": [(0, "d"), (2, "m")], "Q5_1": [(0, "d"), (2, "m")],
    "Q4_K": [(0, "d"), (2, "m")], "Q5_K": [(0, "d"), (2, "m")],
    "Q6_K": [(208, "d")],
}


def rng_for(*key) -> np.random.Generator:
    h = hashlib.sha256(repr(key).encode()).digest()
    return np.random.default_rng(int.from_bytes(h[:8], "little"))


# ------------------------------------------------------------- generators --
def weight_floats(rng, kind: str, n: int) -> np.ndarray:
    if kind == "ggml_normal":
        x = rng.standard_normal(n) * 0.05
    elif kind == "ggml_heavy":
        x = rng.standard_t(2.0, n) * 0.05
    elif kind == "ggml_zeros":
        x = rng.standard_normal(n) * 0.05
        x[rng.random(n) < 0.4] = 0.0
        x[: min(32, n)] = 0.0                  # an all-zero block
        if n >= 64:
            x[32:64] = 0.0
            x[32 + int(rng.integers(32))] = 0.3  # a block with one non-zero
    else:
        raise ValueError(kind)
    return x.astype(np.float32)


def finite_fp16_bits(rng, size) -> np.ndarray:
    h = rng.integers(0, 1 << 16, size=size, dtype=np.uint32).astype(np.uint16)
    bad = (h & 0x7C00) == 0x7C00
    while bad.any():
        h[bad] = rng.integers(0, 1 << 16, size=int(bad.sum()), dtype=np.uint32)
        bad = (h & 0x7C00) == 0x7C00
    return h


def random_float_bits(rng, name: str, n: int) -> np.ndarray:
    """Raw bytes for a float-type row with odd bit patterns but no overflow
    in a dot product: random sign and mantissa, exponent in 2^-40..2^40 with
    1 in 10 elements subnormal or zero."""
    sign = rng.integers(0, 2, n).astype(np.uint32)
    sub = rng.random(n) < 0.1
    if name == "F16":
        return finite_fp16_bits(rng, n).view(np.uint8)
    if name == "BF16":
        e = rng.integers(127 - 40, 127 + 41, n).astype(np.uint32)
        e[sub] = 0
        m = rng.integers(0, 1 << 7, n).astype(np.uint32)
        return ((sign << 15) | (e << 7) | m).astype(np.uint16).view(np.uint8)
    if name == "F32":
        e = rng.integers(127 - 40, 127 + 41, n).astype(np.uint32)
        e[sub] = 0
        m = rng.integers(0, 1 << 23, n).astype(np.uint32)
        return ((sign << 31) | (e << 23) | m).astype(np.uint32).view(np.uint8)
    raise ValueError(name)


def random_block_bytes(rng, g, name: str, n: int) -> np.ndarray:
    t = L.GGML_TYPES[name]
    ts = g.type_size(t)
    raw = rng.integers(0, 256, g.row_bytes(t, n), dtype=np.uint16).astype(np.uint8)
    blocks = raw.reshape(-1, ts)
    for off, _role in SCALE_FIELDS[name]:
        scales = finite_fp16_bits(rng, blocks.shape[0])
        blocks[:, off:off + 2] = scales.view(np.uint8).reshape(-1, 2)
    return raw


def act_row(rng, kind: str, n: int) -> np.ndarray:
    if kind == "normal":
        x = rng.standard_normal(n)
    elif kind == "heavy":
        # Clipped so Q8_1's s = d*sum(q) (an fp16) stays finite: |s| <= 32*amax.
        x = np.clip(rng.standard_t(1.5, n), -1000.0, 1000.0)
    elif kind == "zeros":
        x = rng.standard_normal(n)
        x[rng.random(n) < 0.4] = 0.0
        x[: min(32, n)] = 0.0
    elif kind == "block_scaled":
        # Per 32-block magnitudes 1e-8..1e3: tiny blocks make Q8_0's fp16 d
        # underflow to zero/subnormal while the codes stay full-range.
        x = rng.standard_normal(n)
        for b in range(0, n, 32):
            x[b:b + 32] *= 10.0 ** rng.uniform(-8, 3)
    else:
        raise ValueError(kind)
    return x.astype(np.float32)


def tie_vectors() -> np.ndarray:
    """Rows of length 256 where every x*127/amax is exactly k+0.5 (k < 127)
    except the block maximum, which is exactly +-127*s (s a power of two, so
    d = amax/127 = s, 1/d and 127/amax are exact and both quantizers see the
    same half-integers). roundf (ref) goes away from zero, the CPU path's
    round-to-nearest-even goes to the even neighbour: they differ whenever
    k is even."""
    rows = []
    rng = rng_for("tie")
    for s in (1.0, 2.0 ** -3, 2.0 ** -10, 2.0 ** 4):
        x = np.empty(256, np.float64)
        for b in range(0, 256, 32):
            k = rng.integers(0, 127, 32)
            sign = np.where(rng.random(32) < 0.5, -1.0, 1.0)
            blk = sign * (k + 0.5) * s
            blk[int(rng.integers(32))] = (1 if rng.random() < 0.5 else -1) * 127.0 * s
            x[b:b + 32] = blk
        rows.append(x.astype(np.float32))
    return np.stack(rows)


def special_values() -> np.ndarray:
    f = np.float32
    bits = np.array([0x7FC00000, 0x7F800001, 0xFFC12345, 0x7FA00000, 0x00000001,
                     0x807FFFFF, 0x00800000, 0x3F808000, 0x3F818000, 0x3F807FFF],
                    dtype=np.uint32).view(np.float32)
    vals = [0.0, -0.0, np.inf, -np.inf, 65504.0, 65519.0, 65520.0, -65520.0, 1e-8,
            2.0 ** -24, 2.0 ** -25, -(2.0 ** -25), 3 * 2.0 ** -26, 1.0 + 2.0 ** -11,
            1.0 + 3 * 2.0 ** -11, 1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, 1e38, 3.4e38,
            -3.39e38, 6.0e-5, 6.1e-5, 1e-40, -1e-45]
    x = np.concatenate([np.array(vals, dtype=f), bits])
    rng = rng_for("special")
    pad = (rng.standard_normal(64 - x.size) * 10.0 ** rng.uniform(-6, 5, 64 - x.size)).astype(f)
    return np.concatenate([x, pad]).reshape(1, 64)


# ------------------------------------------------------------ llama.cpp --
def dequant_act(g, act_type: int, raw: np.ndarray, n: int) -> np.ndarray:
    """float64 values of a quantized activation row (for tolerance magnitudes)."""
    name = L.TYPE_NAMES[act_type]
    if name == "F32":
        return raw.view(np.float32).astype(np.float64)
    if name in ("F16", "BF16", "Q8_0"):
        return g.to_float(act_type, raw, n).astype(np.float64)
    if name == "Q8_1":   # ggml-common.h block_q8_1: fp16 d, fp16 s, int8 qs[32]
        b = raw.reshape(-1, 36)
        d = b[:, 0:2].copy().view(np.float16).astype(np.float64)
        return (d * b[:, 4:].view(np.int8)).reshape(-1)
    if name == "Q8_K":   # block_q8_K: float d, int8 qs[256], int16 bsums[16]
        b = raw.reshape(-1, 292)
        d = b[:, 0:4].copy().view(np.float32).astype(np.float64)
        return (d * b[:, 4:260].view(np.int8)).reshape(-1)
    raise ValueError(name)


def weight_parts(g, name: str, raw: np.ndarray, n: int):
    """(scale part, offset part) of each weight, both float64, via llama.cpp's
    to_float on copies with the offset (resp. scale) fields zeroed."""
    t = L.GGML_TYPES[name]
    if name == "F32":
        return raw.view(np.float32).astype(np.float64), np.zeros(n)
    full = g.to_float(t, raw, n).astype(np.float64)
    roles = dict((r, o) for o, r in SCALE_FIELDS.get(name, []))
    if "m" not in roles:
        return full, np.zeros(n)
    ts = g.type_size(t)
    no_m = raw.copy().reshape(-1, ts)
    no_m[:, roles["m"]:roles["m"] + 2] = 0
    no_d = raw.copy().reshape(-1, ts)
    no_d[:, roles["d"]:roles["d"] + 2] = 0
    return (g.to_float(t, no_m.reshape(-1), n).astype(np.float64),
            g.to_float(t, no_d.reshape(-1), n).astype(np.float64))


def dot_magnitudes(g, name: str, raw: np.ndarray, aq: np.ndarray, n: int) -> tuple[float, float]:
    """(absterms, allow) for one weight row x one activation row (already in
    the paired type): the magnitude a dot's rounding error scales with, and
    the absolute allowance for flush-to-zero. See test_quants_llamacpp.py."""
    t = L.GGML_TYPES[name]
    vdt = g.vec_dot_type(t)
    sp, op = weight_parts(g, name, raw, n)
    av = dequant_act(g, vdt, aq, n)
    if L.TYPE_NAMES[vdt] == "Q8_1":
        # Q4_1/Q5_1 x Q8_1: ggml forms d*d_a*sum(q*qa) + m*s per block, s
        # being the fp16 stored in the activation block (which need not equal
        # d_a*sum(qa): both are fp16-rounded, and s may be nonzero where d_a
        # underflowed), so the offset magnitude is |m*s| per block.
        s16 = aq.reshape(-1, 36)[:, 2:4].copy().view(np.float16).astype(np.float64).ravel()
        m_b = op.reshape(-1, 32)[:, 0]
        absterms = float(np.sum(np.abs(sp) * np.abs(av)) + np.sum(np.abs(m_b * s16)))
    else:
        absterms = float(np.sum((np.abs(sp) + np.abs(op)) * np.abs(av)))
    allow = 0.0
    if name == "BF16":
        # AVX512-BF16 vdpbf16ps treats subnormal inputs as zero and flushes
        # subnormal results: those products may be lost (one side), plus one
        # 2^-126 per element.
        lost = bf16_subnormal(sp) | bf16_subnormal(av)
        allow = float(np.sum(np.abs(sp[lost] * av[lost]))) + n * 2.0 ** -126
    return absterms, allow


def bf16_subnormal(v: np.ndarray) -> np.ndarray:
    a = np.abs(v)
    return (a > 0) & (a < 2.0 ** -126)


def act_key(act_type: int) -> str:
    return L.TYPE_NAMES[act_type].lower().replace("q8_k", "q8_K")


def make_activations(g) -> dict:
    out = {}
    all_lengths = sorted({n for ls in LENGTHS.values() for n in ls})
    for n in all_lengths:
        x = np.stack([act_row(rng_for("act", k, n), k, n) for k in ACT_KINDS])
        out[f"L{n}_x"] = x
        out[f"L{n}_f16"] = np.stack([g.from_float_cpu(L.GGML_TYPES["F16"], r) for r in x])
        out[f"L{n}_bf16"] = np.stack([g.from_float_cpu(L.GGML_TYPES["BF16"], r) for r in x])
        if n % 32 == 0:
            out[f"L{n}_q8_0"] = np.stack([g.from_float_cpu(8, r) for r in x])
            out[f"L{n}_q8_0_ref"] = np.stack([g.quantize_chunk(8, r) for r in x])
            out[f"L{n}_q8_1"] = np.stack([g.from_float_cpu(9, r) for r in x])
            out[f"L{n}_q8_1_ref"] = np.stack([g.from_float_ref(9, r) for r in x])
        if n % 256 == 0:
            out[f"L{n}_q8_K"] = np.stack([g.from_float_cpu(15, r) for r in x])
    tie = tie_vectors()
    out["tie_x"] = tie
    out["tie_q8_0"] = np.stack([g.from_float_cpu(8, r) for r in tie])
    out["tie_q8_0_ref"] = np.stack([g.quantize_chunk(8, r) for r in tie])
    out["tie_q8_1"] = np.stack([g.from_float_cpu(9, r) for r in tie])
    out["tie_q8_1_ref"] = np.stack([g.from_float_ref(9, r) for r in tie])
    out["tie_q8_K"] = np.stack([g.from_float_cpu(15, r) for r in tie])
    sp = special_values()
    out["special_x"] = sp
    out["special_f16"] = np.stack([g.from_float_cpu(1, r) for r in sp])
    out["special_f16_ref"] = np.stack([g.quantize_chunk(1, r) for r in sp])
    out["special_bf16"] = np.stack([g.from_float_cpu(30, r) for r in sp])
    out["special_bf16_ref"] = np.stack([g.quantize_chunk(30, r) for r in sp])
    return out


def make_weights(g, name: str, acts: dict) -> dict:
    t = L.GGML_TYPES[name]
    bs = g.block_size(t)
    vdt = g.vec_dot_type(t)
    out = {"type_id": np.int32(t), "vec_dot_type": np.int32(vdt),
           "block_size": np.int32(bs), "type_size": np.int32(g.type_size(t)),
           "lengths": np.array(LENGTHS[bs], np.int32)}
    for n in LENGTHS[bs]:
        raws, kinds = [], []
        for ki, kind in enumerate(WEIGHT_KINDS):
            rng = rng_for("w", name, kind, n)
            if kind.startswith("ggml_"):
                raw = g.quantize_chunk(t, weight_floats(rng, kind, n))
            elif bs == 1:
                raw = random_float_bits(rng, name, n)
            else:
                raw = random_block_bytes(rng, g, name, n)
            raws.append(raw)
            kinds.append(ki)
        raw = np.stack(raws)
        if name == "F32":
            deq = raw.copy().view(np.uint32)   # ggml has no to_float for F32: identity
        else:
            deq = np.stack([g.to_float(t, r, n) for r in raw]).view(np.uint32)
        act_q = acts[f"L{n}_{act_key(vdt)}"] if name != "F32" else None
        x = acts[f"L{n}_x"]
        A = x.shape[0]
        dot = np.zeros((len(raw), A), np.float32)
        absterms = np.zeros((len(raw), A), np.float64)
        allow = np.zeros((len(raw), A), np.float64)
        for r in range(len(raw)):
            for a in range(A):
                aq = x[a].view(np.uint8) if name == "F32" else act_q[a]
                dot[r, a] = g.vec_dot(t, raw[r], aq, n)
                absterms[r, a], allow[r, a] = dot_magnitudes(g, name, raw[r], aq, n)
        out[f"L{n}_raw"] = raw
        out[f"L{n}_kind"] = np.array(kinds, np.int8)
        out[f"L{n}_deq"] = deq
        out[f"L{n}_dot"] = dot
        out[f"L{n}_absterms"] = absterms
        out[f"L{n}_allow"] = allow
    if name in ("F16", "BF16"):
        allp = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.uint8)
        out["all_raw"] = allp
        out["all_deq"] = g.to_float(t, allp, 1 << 16).view(np.uint32)
    return out


def cpu_flags() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                fl = line.split(":", 1)[1].split()
                keys = ("avx", "fma", "f16c", "amx", "vnni", "bf16", "sse4", "bmi")
                keep = [f for f in fl if any(k in f for k in keys)]
                return " ".join(keep)
    except OSError:
        pass
    return platform.processor()


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main() -> int:
    g = L.load()
    feats = g.compiled_features()
    if feats.get("amx_int8"):
        raise SystemExit("this ggml build uses AMX; rebuild without it (README.md)")
    OUT.mkdir(parents=True, exist_ok=True)
    files = {}
    acts = make_activations(g)
    np.savez_compressed(OUT / "activations.npz", **acts)
    files["activations.npz"] = None
    for name in WEIGHT_TYPES:
        w = make_weights(g, name, acts)
        np.savez_compressed(OUT / f"weights_{name}.npz", **w)
        files[f"weights_{name}.npz"] = None
    for f in files:
        files[f] = hashlib.sha256((OUT / f).read_bytes()).hexdigest()
    tie_diff = int(np.sum(acts["tie_q8_0"] != acts["tie_q8_0_ref"]))
    rand_diff = sum(int(np.sum(acts[k] != acts[k + "_ref"])) for k in acts
                    if k.startswith("L") and k.endswith("_q8_0"))
    manifest = {
        "files": files,
        "llama_cpp_python": g.llama_cpp_python_version,
        "ggml_commit": g.commit(),
        "ggml_version": g.version(),
        # What the fixtures were documented to be built with (README.md); the
        # binary's own compile-time probes follow and are what can be checked.
        "cmake_args_documented": BUILD_CMAKE_ARGS,
        "ggml_cpu_compiled_features": g.compiled_features(),
        "cpu_model": cpu_model(),
        "cpu_flags": cpu_flags(),
        "generated_utc": datetime.datetime.now(datetime.timezone.utc)
                                          .strftime("%Y-%m-%d %H:%M UTC"),
        "command": "make golden-quants  (python3 tests/reference/make_quant_fixtures.py)",
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "tie_q8_0_bytes_differing_cpu_vs_ref": tie_diff,
        "random_q8_0_bytes_differing_cpu_vs_ref": rand_diff,
    }
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    total = sum((OUT / f).stat().st_size for f in files)
    for f in files:
        print(f"{f:28s} {(OUT / f).stat().st_size:9d} bytes")
    print(f"total {total} bytes; tie vectors: {tie_diff} Q8_0 bytes differ between "
          "CPU and ref quantizer; "
          f"random activations: {rand_diff}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
