"""Interleaved A/B of two built trees (checkouts) on one model: decode or prefill.

    python bench/ab_builds.py TREE_A TREE_B MODEL [--threads 2] [--tokens 400]
                              [--reps 8] [--mode decode|prefill]

Each repetition runs one fresh process per tree, in order A B, then B A on
the next repetition; a process imports ds4py from its tree (built in place:
``python setup.py build_ext --inplace`` there), loads MODEL in fast
precision and times either ``--tokens`` greedy one-token decode steps after
a 128-token prompt (wall tok/s, and process CPU ms per token), or the
prefill of ``--tokens`` tokens (the best of two, as a process-CPU-time rate:
on a shared VM CPU time is steadier than wall time). Prints the medians and
the median [min..max] of the per-pair ratios B/A. Not a test: the numbers
depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

CHILD = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
import ds4py
m = ds4py.load(sys.argv[2], n_threads=int(sys.argv[3]), precision="fast")
V = m.config.vocab_size
n, mode = int(sys.argv[4]), sys.argv[5]
if mode == "decode":
    toks = [(i * 7919 + 104729) % (V - 16) + 8 for i in range(128)]
    with m.new_session() as s:
        s.eval(toks)
        tok = 11
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(n):
            tok = int(s.eval([tok]).argmax())
        print(n / (time.perf_counter() - t0), (time.process_time() - c0) / n * 1e3)
else:
    toks = [(i * 7919 + 104729) % (V - 16) + 8 for i in range(n)]
    best = float("inf")
    for _ in range(2):
        with m.new_session() as s:
            c0 = time.process_time()
            s.eval(toks)
            best = min(best, time.process_time() - c0)
    print(n / best, best * 1e3)
"""


def run(tree: str, a) -> tuple[float, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, tree, a.model, str(a.threads),
                          str(a.tokens), a.mode], capture_output=True, text=True, check=True)
    x, y = out.stdout.split()
    return float(x), float(y)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("tree_a")
    ap.add_argument("tree_b")
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=400)
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--mode", choices=("decode", "prefill"), default="decode")
    a = ap.parse_args()
    res: dict[str, list] = {a.tree_a: [], a.tree_b: []}
    for k in range(a.reps):
        for t in ((a.tree_a, a.tree_b) if k % 2 == 0 else (a.tree_b, a.tree_a)):
            res[t].append(run(t, a))
    names = (("tok/s wall", "cpu ms/token") if a.mode == "decode"
             else ("tok/s of process CPU time", "cpu ms"))
    for j, name in enumerate(names):
        xa = [r[j] for r in res[a.tree_a]]
        xb = [r[j] for r in res[a.tree_b]]
        rs = [y / x for x, y in zip(xa, xb, strict=True)]
        print(f"{a.mode} {name}: A median {statistics.median(xa):.2f}, B median "
              f"{statistics.median(xb):.2f}; B/A median {statistics.median(rs):.3f} "
              f"[{min(rs):.3f}..{max(rs):.3f}]")


if __name__ == "__main__":
    main()
