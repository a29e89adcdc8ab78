"""Single-thread memory bandwidth of this machine, the yardstick for kernels.

Two numbers, both over a buffer far larger than any cache (1 GiB by default):
- read: np.max over float32 (a streaming read with trivial compute; the best
  single-thread read rate numpy reaches here), bytes read / s;
- copy: np.copyto, (bytes read + bytes written) / s.
Each is repeated; the first repetition (page faults) is discarded, and
min/median/max of the rest are reported.
"""

from __future__ import annotations

import statistics
import time

import numpy as np


def _rates(fn, nbytes: int, reps: int) -> list[float]:
    fn()  # warm-up: faults the pages in
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(nbytes / (time.perf_counter() - t) / 1e9)
    return out


def measure(size_bytes: int = 1 << 30, reps: int = 5) -> dict[str, tuple[float, float, float]]:
    a = np.ones(size_bytes // 4, np.float32)
    b = np.empty_like(a)
    res = {
        "read": _rates(lambda: a.max(), a.nbytes, reps),
        "copy": _rates(lambda: np.copyto(b, a), 2 * a.nbytes, reps),
    }
    return {k: (min(v), statistics.median(v), max(v)) for k, v in res.items()}


if __name__ == "__main__":
    for k, (lo, med, hi) in measure().items():
        print(f"{k:5s} GB/s  min {lo:6.1f}  median {med:6.1f}  max {hi:6.1f}")
