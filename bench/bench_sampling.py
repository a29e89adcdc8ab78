"""Micro-benchmark of ds4py.sampling: one Sampler.sample call per token over a
vocabulary of VOCAB float32 logits (default 248,320, Qwen3.5's).

    python bench/bench_sampling.py [--vocab 248320] [--reps 300] [--configs a,b]

Prints ms per token (min / median / max over repetitions) for each
configuration. The logits are LLM-like (a few large values over a broad
N(0, 2^2) floor) and change every repetition (a fresh row from a pool, so the
timing includes reading a cold-ish 1 MB row, as after a forward pass); the
sampler is created once. Configurations:

  greedy        temperature 0 (argmax)
  temp          temperature 0.8 only (top-k, top-p, min-p off): a draw over
                the whole vocabulary
  default       llama.cpp's defaults: top-k 40, top-p 0.95, min-p 0.05, temp 0.8
  penalties     default + repeat 1.1 / frequency 0.1 / presence 0.1 over the
                last 64 tokens (64 accepted tokens in the window)
  logit_bias    default + 16 biased tokens (two of them banned with -inf)
  top_p_only    top-p 0.95 with top-k off (temp 0.8, min-p 0): softmax over the
                whole vocabulary (not llama.cpp's default chain)
  logprobs      logprobs(logits, token, top_n=5): full-vocabulary log-softmax

Not a test: numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ds4py.sampling import Sampler, SamplingParams, logprobs  # noqa: E402


def llm_like_logits(rng: np.random.Generator, n: int) -> np.ndarray:
    x = rng.standard_normal(n, dtype=np.float32) * 2.0
    hot = rng.choice(n, 8, replace=False)
    x[hot] += rng.uniform(6.0, 14.0, 8).astype(np.float32)
    return x


def configs(vocab: int) -> dict[str, SamplingParams]:
    bias = {int(t): float(b) for t, b in zip(range(100, 1700, 100),
                                                       np.linspace(-5, 5, 16), strict=True)}
    bias[7] = -float("inf")
    bias[8] = -float("inf")
    return {
        "greedy": SamplingParams(temperature=0.0, seed=1),
        "temp": SamplingParams(top_k=0, top_p=1.0, min_p=0.0, temperature=0.8, seed=1),
        "default": SamplingParams(seed=1),
        "penalties": SamplingParams(repeat_penalty=1.1, frequency_penalty=0.1,
                                    presence_penalty=0.1, repeat_last_n=64, seed=1),
        "logit_bias": SamplingParams(logit_bias=bias, seed=1),
        "top_p_only": SamplingParams(top_k=0, top_p=0.95, min_p=0.0, seed=1),
    }


def bench(fn, rows: list[np.ndarray], reps: int) -> list[float]:
    for r in rows[:5]:  # warm-up
        fn(r)
    ts = []
    for i in range(reps):
        r = rows[i % len(rows)]
        t0 = time.perf_counter()
        fn(r)
        ts.append(time.perf_counter() - t0)
    return ts


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=248320)
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--configs", default="")
    args = ap.parse_args()

    rng = np.random.default_rng(0)
    rows = [llm_like_logits(rng, args.vocab) for _ in range(16)]
    cfgs = configs(args.vocab)
    names = list(cfgs) + ["logprobs"]
    if args.configs:
        names = [n for n in args.configs.split(",") if n]

    print(f"vocab {args.vocab}, {args.reps} repetitions, numpy {np.__version__}")
    print(f"{'config':<12} {'min ms':>8} {'median ms':>10} {'max ms':>8}")
    for name in names:
        if name == "logprobs":
            def fn(r):
                return logprobs(r, 0, top_n=5)
        else:
            s = Sampler(cfgs[name], args.vocab)
            s.accept_many(rng.integers(0, args.vocab, 64).tolist())
            fn = s.sample
        ts = bench(fn, rows, args.reps)
        print(f"{name:<12} {min(ts) * 1e3:8.3f} {statistics.median(ts) * 1e3:10.3f} "
              f"{max(ts) * 1e3:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
