"""Micro-benchmark of the multi-row GEMM kernels (quants.h dot_rows), one thread.

    python bench/bench_rows.py [--types Q8_0,Q4_K,Q6_K] [--isas avx2,avx512]
                               [--out 1024] [--n 1024] [--nr 1,4,8,16] [--reps 40]

Times ds4_matmul_rows (the forward pass's fast-precision product on the
calling thread: pack the activation rows if the kernel wants its own layout,
then one dot_rows call per weight row) over an OUT x N weight matrix and NR
activation rows, against the same call with the one-row kernel (multi_row=0).
Prints, per type, ISA and NR, the fastest repetition as ns per 256 weights
and activation row, GMAC/s, and the one-row kernel's ns for comparison.

Minimum over repetitions: on a shared machine every disturbance adds time,
so the fastest repetition is the kernel's own speed. A 1024 x 1024 matrix
(under 1.2 MB) stays in L2/L3: this is compute throughput, not bandwidth
(bench/bench_kernels.py and bench_cpu.py measure those). Not a test: numbers
depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ds4py import quants as Q  # noqa: E402
from ds4py._core import ffi, lib, new_error  # noqa: E402


def weights(t, n_out: int, n: int, rng) -> np.ndarray:
    """n_out rows of n weights of type t, quantized from floats."""
    x = (rng.standard_normal((n_out, n)) * 0.05).astype(np.float32)
    out = np.zeros(n_out * n // t.block_size * t.type_size, np.uint8)
    err = new_error()
    if lib.ds4_quantize_weights(t.id, ffi.cast("float *", ffi.from_buffer(x)),
                                ffi.from_buffer(out), n_out, n, err):
        raise RuntimeError(ffi.string(err.message).decode())
    return out


def best_time(isa_id, t, w, n_out, act, stride, n, nr, multi, reps) -> float:
    out = np.empty(nr * n_out, np.float32)
    err = new_error()
    row_bytes = n // t.block_size * t.type_size
    args = (isa_id, t.id, ffi.from_buffer(w), row_bytes, n_out, ffi.from_buffer(act), stride,
            n, nr, multi, ffi.cast("float *", ffi.from_buffer(out)), err)
    best = float("inf")
    for _ in range(reps + 1):  # the first is a warm-up
        t0 = time.perf_counter()
        rc = lib.ds4_matmul_rows(*args)
        best = min(best, time.perf_counter() - t0)
        if rc:
            raise RuntimeError(ffi.string(err.message).decode())
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", default="Q8_0,Q4_K,Q6_K")
    ap.add_argument("--isas", default="", help="comma-separated ISAs (default: all available)")
    ap.add_argument("--out", type=int, default=1024, help="weight rows")
    ap.add_argument("--n", type=int, default=1024, help="weights per row")
    ap.add_argument("--nr", default="1,4,8,16", help="activation rows")
    ap.add_argument("--reps", type=int, default=40)
    args = ap.parse_args()
    isas = Q.available_isas()
    if args.isas:
        isas = [i for i in args.isas.split(",") if i in isas]
    rng = np.random.default_rng(0)
    print(f"{args.out} x {args.n} weights, one thread, fastest of {args.reps}; "
          "ns per 256 weights x row (multi-row kernel | one-row kernel)")
    for name in args.types.split(","):
        t = Q.type_info(name.strip())
        p = Q.type_info(t.vec_dot_type)
        w = weights(t, args.out, args.n, rng)
        for isa in isas:
            isa_id = Q._isa(isa)
            kernel = lib.ds4_matmul_rows_kernel(isa_id, t.id)
            if kernel == ffi.NULL:
                print(f"{t.name:6s} {isa:7s} no multi-row kernel")
                continue
            for nr in (int(v) for v in args.nr.split(",")):
                rows = [Q.quantize(p.name, rng.standard_normal(args.n).astype(np.float32))
                        for _ in range(nr)]
                act = np.concatenate(rows)
                per = args.out * args.n / 256 * nr
                multi = best_time(isa_id, t, w, args.out, act, rows[0].size, args.n, nr, 1,
                                  args.reps)
                one = best_time(isa_id, t, w, args.out, act, rows[0].size, args.n, nr, 0,
                                args.reps)
                print(f"{t.name:6s} {isa:7s} nr {nr:2d}: {multi / per * 1e9:6.2f} ns "
                      f"({args.out * args.n * nr / multi / 1e9:5.1f} GMAC/s) | "
                      f"{one / per * 1e9:6.2f} ns   [{ffi.string(kernel).decode()}]")


if __name__ == "__main__":
    main()
