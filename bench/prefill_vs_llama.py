"""Prefill only, ds4py against llama.cpp on one GGUF, interleaved (a quick
check of the prefill ratio without bench_cpu.py's decode sweeps).

    python bench/prefill_vs_llama.py MODEL [--reps 4] [--tokens 512,2048]
                                     [--engines ds4py,norepack,repack] [--threads 2]

Each engine is one bench_cpu.py worker (the same settings: precision
"fast", F16 KV cache, flash attention off, n_batch 512; `repack` lets
llama.cpp repack its weights, `norepack` does not). One short prefill per
engine warms up; then every repetition runs each length on every engine,
the engine order reversed on alternate repetitions. Prints tok/s
min / median / max per engine and length, and the per-repetition ratios
ds4py / each llama.cpp path (min / median / max). Not a test: the numbers
depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_cpu  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--tokens", default="512,2048")
    ap.add_argument("--engines", default="ds4py,norepack,repack")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    ns = [int(x) for x in a.tokens.split(",")]
    engines = a.engines.split(",")
    if engines[0] != "ds4py" or not set(engines) <= {"ds4py", "norepack", "repack"}:
        ap.error("--engines: ds4py first, then norepack and/or repack")
    log_dir = tempfile.mkdtemp(prefix="prefill-vs-llama-")
    workers = {e: bench_cpu.Worker(e, "ds4py" if e == "ds4py" else "llama", a.model, a.threads,
                                   max(ns) + 64, e == "repack", log_dir) for e in engines}
    res = {(e, n): [] for e in engines for n in ns}
    try:
        for e in engines:
            workers[e].ask(op="prefill", n=min(ns))
        for rep in range(a.reps):
            order = engines if rep % 2 == 0 else engines[::-1]
            for n in ns:
                for e in order:
                    res[(e, n)].append(n / workers[e].ask(op="prefill", n=n)["s"])
    finally:
        for w in workers.values():
            w.close()
    print(f"{a.model}, {a.threads} threads, {a.reps} repetitions (engine logs in {log_dir})")
    for n in ns:
        for e in engines:
            v = res[(e, n)]
            print(f"prefill {n:5d} {e:9s} tok/s min {min(v):7.1f} median "
                  f"{statistics.median(v):7.1f} max {max(v):7.1f}")
        for e in engines[1:]:
            r = [x / y for x, y in zip(res[("ds4py", n)], res[(e, n)], strict=True)]
            print(f"prefill {n:5d} ds4py/{e}: min {min(r):.3f} median {statistics.median(r):.3f} "
                  f"max {max(r):.3f}")


if __name__ == "__main__":
    main()
