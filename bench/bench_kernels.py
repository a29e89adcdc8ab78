"""Micro-benchmark of the quant kernels: dequantize and paired dot, per weight
type and per ISA, over a ROWS x COLS weight matrix (default 4096 x 4096).

    python bench/bench_kernels.py [--types Q4_K,Q8_0] [--isas avx2,avx512]
                                  [--rows 4096] [--cols 4096] [--reps 7]
                                  [--rows-per-call 32]

Prints GB/s of WEIGHT bytes processed (min / median / max over repetitions;
"min" is the slowest repetition). Buffers are allocated once and reused.

  dequant   one ds4_dequantize_row call over the whole matrix into a reused
            float buffer (so it also writes 4 bytes per weight).
  dot       ds4_vec_dot of the weights against activations of the paired
            type (quantized once). A Python/cffi call costs about a
            microsecond, as much as the kernel needs for one 4096-wide row, so
            each call covers ROWS_PER_CALL consecutive rows as one long row
            against the activation row tiled ROWS_PER_CALL times. Every call
            reuses that same tile, so it stays in cache as the activation
            vector does in a real matrix-vector product, while the weights
            stream. `dot*` subtracts the remaining call overhead (measured by
            the same number of calls on one-block rows).

Reading the numbers: dequant is bound by writing 4 float bytes per weight,
so its GB/s of weight bytes is low for the small types. The dot's "min" is
usually its first repetition, right after the dequant pass has flushed the
caches with 64 MB of floats (weights then come from DRAM); later repetitions
find a 4-bit 4096 x 4096 matrix (~9 MB) in the last-level cache where it
fits. Use --rows to change the matrix size.

Not a test: numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import membw  # noqa: E402  (bench/membw.py, beside this file)

from ds4py import quants as Q  # noqa: E402
from ds4py._core import ffi, lib  # noqa: E402

# Half-precision scale/offset fields per block (byte offset, kind), from the
# block structs in csrc/quants/quants.h.
HALF_FIELDS = {
    "Q4_0": [(0, "f16")], "Q4_1": [(0, "f16"), (2, "f16")], "Q5_0": [(0, "f16")],
    "Q5_1": [(0, "f16"), (2, "f16")], "Q8_0": [(0, "f16")], "IQ4_NL": [(0, "f16")],
    "Q4_K": [(0, "f16"), (2, "f16")], "Q5_K": [(0, "f16"), (2, "f16")], "Q6_K": [(208, "f16")],
    "IQ4_XS": [(0, "f16")], "Q4_64A": [(32, "bf16"), (34, "bf16")],
    "Q2_64A": [(16, "bf16"), (18, "bf16")],
}


def weight_bytes(info, rows, cols, rng):
    """Random weights with realistic finite values: real fp16/bf16/f32 numbers
    for the float types; random codes with scale fields around 1e-2 for the
    quantized ones (uniformly random scale bytes would include tiny values
    whose products go subnormal, which is slow on every x86 core and says
    nothing about real models)."""
    n = rows * cols
    if info.name == "F32":
        return rng.standard_normal(n, dtype=np.float32).view(np.uint8)
    if info.name == "F16":
        return rng.standard_normal(n, dtype=np.float32).astype(np.float16).view(np.uint8)
    if info.name == "BF16":
        f = rng.standard_normal(n, dtype=np.float32)
        return (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    nb = n // info.block_size
    raw = rng.integers(0, 256, size=(nb, info.type_size), dtype=np.uint8)
    for off, kind in HALF_FIELDS.get(info.name, []):
        v = (rng.standard_normal(nb, dtype=np.float32) * 0.01 + 0.02).astype(np.float32)
        h = v.astype(np.float16).view(np.uint16) if kind == "f16" else \
            (v.view(np.uint32) >> 16).astype(np.uint16)
        raw[:, off:off + 2] = h.view(np.uint8).reshape(nb, 2)
    return raw.reshape(-1)


def dequant_call(isa_id, type_id, src, dst, n, err):
    if lib.ds4_dequantize_row(isa_id, type_id, src, dst, n, err):
        raise RuntimeError(ffi.string(err.message).decode())


def dot_calls(isa_id, type_id, row_ptrs, act_type_id, act, n, res, err):
    f = lib.ds4_vec_dot
    for p in row_ptrs:
        f(isa_id, type_id, p, act_type_id, act, n, res, err)
    if err.code:  # checked once per batch: the loop is what is timed
        raise RuntimeError(ffi.string(err.message).decode())


def timed(fn, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def rates(nbytes, times):
    """(slowest, median, fastest) GB/s."""
    g = [nbytes / t / 1e9 for t in times]
    return min(g), statistics.median(g), max(g)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", default="", help="comma-separated type names (default: all)")
    ap.add_argument("--isas", default="", help="comma-separated ISAs (default: all available)")
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--rows-per-call", type=int, default=32)
    args = ap.parse_args()

    types = [t for t in Q.TYPES if t.can_dot]
    if args.types:
        want = {s.strip().upper() for s in args.types.split(",")}
        types = [t for t in types if t.name.upper() in want]
    isas = Q.available_isas()
    if args.isas:
        isas = [i for i in args.isas.split(",") if i in isas]
    rows, cols = args.rows, args.cols
    rpc = max(1, min(args.rows_per_call, rows))
    rows -= rows % rpc
    rng = np.random.default_rng(0)
    out = np.empty(rows * cols, dtype=np.float32)  # reused dequant target
    res = ffi.new("float *")
    err = ffi.new("ds4_error *")

    bw = membw.measure()
    read_med = bw["read"][1]
    for k, (lo, med, hi) in bw.items():
        print(f"memory {k:4s} bandwidth, one thread: min {lo:.1f}  median {med:.1f}  "
              f"max {hi:.1f} GB/s (bench/membw.py)")
    print(f"matrix {rows} x {cols}, {rpc} rows per dot call, {args.reps} reps, "
          f"ISAs {', '.join(isas)}")
    print("dot* = dot with the per-call Python overhead subtracted; "
          "%bw = median dot GB/s / median read bandwidth\n"
          "(a matrix smaller than the last-level cache can exceed 100%: pass --rows "
          "to size it past the cache for a DRAM-bound figure)")
    print(f"{'type':8s} {'isa':7s} {'MB':>7s} | {'dequant GB/s (min/med/max)':>27s} | "
          f"{'dot GB/s (min/med/max)':>24s} | {'dot* med':>8s} | {'%bw':>5s}")
    for info in types:
        if cols % info.block_size:
            print(f"{info.name:8s} skipped: {cols} columns are not whole "
                  f"{info.block_size}-blocks")
            continue
        w = weight_bytes(info, rows, cols, rng)  # a whole number of chunks of rows
        row_bytes = cols // info.block_size * info.type_size
        x = rng.standard_normal(cols, dtype=np.float32)
        act_t = Q.type_info(info.vec_dot_type)
        act = x if act_t.name == "F32" else Q.quantize(act_t.name, x, isa="scalar")
        act = np.tile(act.view(np.uint8), rpc)  # ROWS_PER_CALL copies, reused
        pw = ffi.cast("char *", ffi.from_buffer(w))
        pa = ffi.cast("void *", ffi.from_buffer(act))
        pout = ffi.cast("float *", ffi.from_buffer(out))
        row_ptrs = [pw + r * row_bytes for r in range(0, rows, rpc)]
        for isa in isas:
            isa_id = Q._isa(isa)
            deq = functools.partial(dequant_call, isa_id, info.id, pw, pout, rows * cols, err)
            dot = functools.partial(dot_calls, isa_id, info.id, row_ptrs, act_t.id, pa,
                                    cols * rpc, res, err)
            dot_calls(isa_id, info.id, row_ptrs[:2], act_t.id, pa, cols * rpc, res, err)  # warm
            dq = rates(w.size, timed(deq, args.reps))
            dt_times = timed(dot, args.reps)
            dt = rates(w.size, dt_times)
            # call overhead: the same number of calls on one-block rows
            one = functools.partial(dot_calls, isa_id, info.id, [row_ptrs[0]] * len(row_ptrs),
                                    act_t.id, pa, info.block_size, res, err)
            kern = statistics.median(dt_times) - statistics.median(timed(one, args.reps))
            corr = f"{w.size / kern / 1e9:8.2f}" if kern > 0 else "     n/a"
            print(f"{info.name:8s} {isa:7s} {w.size / 1e6:7.1f} | "
                  f"{dq[0]:8.2f} {dq[1]:8.2f} {dq[2]:8.2f}  | "
                  f"{dt[0]:7.2f} {dt[1]:7.2f} {dt[2]:7.2f}  | {corr} | "
                  f"{100 * dt[1] / read_med:5.0f}")

if __name__ == "__main__":
    main()
