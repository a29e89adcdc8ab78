"""Greedy generation through ds4py.generate beside the core's own C decode loop.

    python bench/bench_generate.py [-m MODEL.gguf ...] [--tokens 256] [--reps 15]
                                   [--threads N]

For each model: the same greedy decode of N tokens from a one-token prompt,
timed three ways on the same model and thread count, in rotating order each
repetition:

  C       ds4_greedy_loop (csrc/bench_loop.c): N x (ds4_session_eval of one
          token + argmax over the logits) in C, public session API only.
  python  ds4py.generate(model, [first], max_tokens=N, temperature=0,
          session=s): the whole call (prompt eval, N-1 decode steps, the
          argmax, detokenization, the result), on a session made beforehand
          (the C loop's session is made outside its timing too).
  naive   a plain Python loop over Session.eval([t]) + np.argmax, for context:
          what generate's direct stepping saves.

All three evaluate N tokens and must choose the same N ids (checked). Printed
per model, by wall clock and by process CPU time: tok/s (median), the
python/C time ratio (min / median / max over repetitions, paired by
repetition) and the per-token overhead of the Python path in µs
((python - C) / N; min / median / max). With --threads 1 the CPU time is the
steadier figure on a loaded machine (time spent waiting for a core is not
counted); with more threads it also counts the pool's workers.

On the tiny golden models (the default) a forward step costs ~0.1-0.3 ms, so a
few µs of Python per token is a visible fraction; on a real model a step
costs tens of ms and the same µs vanish: the µs figure is the one that
carries over. Not a test: numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ds4py  # noqa: E402
from ds4py._core import ffi, lib, new_error  # noqa: E402

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODELS = [os.path.join(HERE, "tests", "golden", "models", f)
                  for f in ("dense-q8_0.gguf", "moe-q8_0.gguf")]


def c_loop(model, first: int, n: int) -> tuple[tuple[float, float], list[int]]:
    s = model.new_session()
    out = np.zeros(n, dtype=np.int32)
    err = new_error()
    outp = ffi.cast("int32_t *", ffi.from_buffer(out))
    t0, c0 = time.perf_counter(), time.process_time()
    rc = lib.ds4_greedy_loop(model._ptr, s._ptr, first, n, outp, err)
    dt = (time.perf_counter() - t0, time.process_time() - c0)
    if rc != lib.DS4_OK:
        raise RuntimeError(ffi.string(err.message).decode())
    s.close()
    return dt, out.tolist()


def py_generate(model, first: int, n: int) -> tuple[tuple[float, float], list[int]]:
    s = model.new_session()
    t0, c0 = time.perf_counter(), time.process_time()
    g = ds4py.generate(model, [first], max_tokens=n, temperature=0, session=s)
    dt = (time.perf_counter() - t0, time.process_time() - c0)
    s.close()
    if g.generated_tokens != n:  # an eos id would end it early
        raise RuntimeError(f"generate stopped after {g.generated_tokens} tokens "
                           f"({g.finish_reason})")
    return dt, g.tokens


def naive(model, first: int, n: int) -> tuple[tuple[float, float], list[int]]:
    s = model.new_session()
    out = []
    t0, c0 = time.perf_counter(), time.process_time()
    t = first
    for _ in range(n):
        t = int(np.argmax(s.eval([t])))
        out.append(t)
    dt = (time.perf_counter() - t0, time.process_time() - c0)
    s.close()
    return dt, out


def pick_first(model, n: int) -> int:
    """A prompt token whose greedy continuation meets no end-of-generation id
    in n tokens (generate would stop there; the C loop would not)."""
    eog = model.tokenizer.eog_ids
    for first in range(model.config.vocab_size):
        if first in eog:
            continue
        _, toks = c_loop(model, first, n)
        if not eog.intersection(toks):
            return first
    raise RuntimeError("every start token reaches an end-of-generation id")


def stats(xs):
    return min(xs), statistics.median(xs), max(xs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", action="append", help="a GGUF (repeatable); default: "
                    "the golden dense-q8_0 and moe-q8_0 test models")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=None, help="default: one per CPU")
    args = ap.parse_args()
    n = args.tokens
    print(f"greedy decode of {n} tokens, {args.reps} repetitions; ratio = python / C time "
          f"(min / median / max), overhead = (python - C) / tokens")
    for path in args.model or DEFAULT_MODELS:
        model = ds4py.load(path, n_threads=args.threads, n_ctx=max(n + 8, 512))
        first = pick_first(model, n)
        runs = {"C": c_loop, "python": py_generate, "naive": naive}
        for fn in runs.values():  # warm-up (page cache, tokenizer tables, thread pool)
            fn(model, first, min(n, 32))
        times: dict[str, list[tuple[float, float]]] = {k: [] for k in runs}
        ref = None
        order = list(runs)
        for rep in range(args.reps):
            for name in order[rep % 3:] + order[:rep % 3]:
                dt, toks = runs[name](model, first, n)
                if ref is None:
                    ref = toks
                elif toks != ref:
                    raise RuntimeError(f"{name} chose other tokens than the first run")
                times[name].append(dt)
        print(f"\n{os.path.basename(path)} ({model.config.arch}, {model.n_threads} threads, "
              f"vocab {model.config.vocab_size})")
        for clock, k in (("wall clock", 0), ("process CPU time", 1)):
            t = {name: [x[k] for x in v] for name, v in times.items()}
            ratio = [p / c for p, c in zip(t["python"], t["C"], strict=True)]
            over = [(p - c) / n * 1e6 for p, c in zip(t["python"], t["C"], strict=True)]
            over_naive = [(p - c) / n * 1e6 for p, c in zip(t["naive"], t["C"], strict=True)]
            tps = {name: n / statistics.median(v) for name, v in t.items()}
            step_us = statistics.median(t["C"]) / n * 1e6
            print(f"  {clock}: tok/s (median) C {tps['C']:.0f}, python {tps['python']:.0f}, "
                  f"naive {tps['naive']:.0f} (C step {step_us:.1f} µs)")
            for label, xs, fmt in (("python / C ratio:      ", ratio, "{:.4f}"),
                                   ("python overhead µs/tok:", over, "{:.2f}"),
                                   ("naive overhead µs/tok: ", over_naive, "{:.2f}")):
                lo, med, hi = (fmt.format(v) for v in stats(xs))
                print(f"    {label}  min {lo}  median {med}  max {hi}")
        model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
