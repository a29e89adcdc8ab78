"""Acceptance traces of the demo model's bundled head (tests/golden/spec/).

For every decode position i of a serial greedy generation, L[i] is how many
of the head's chained greedy drafts (up to 8), proposed after committing
token i, equal the serial tokens that follow: exactly what a speculative
round of depth k at that position accepts (min(L[i], k)). The policy tests
replay these through AdaptivePolicy under measured costs
(tests/test_policy.py test_trace_replay) -- real text's acceptance comes in
runs (an unpredictable opening, then loops), which Bernoulli schedules do
not have.

    python tests/reference/make_spec_traces.py   # rewrites demo_traces.json

Uses only the public session API (ds4_spec_propose drafts without touching
the trunk's state; a plain eval then commits the serial token).
"""

from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import ds4py  # noqa: E402
from ds4py._core import ffi, lib, new_error  # noqa: E402

K = 8
# (workload, prompt, chat, tokens): the bench prompts (bench/bench_spec.py)
# at 128 and 256 tokens, and held-out prompts at 192
HELD_OUT = {
    "code": [("class Stack:\n    def __init__(self):\n", False),
             ("Write a function that reverses a linked list.", True),
             ("def quicksort(arr):\n", False)],
    "prose": [("Tell me a short story about a dragon who learns to cook.", True),
              ("The history of the printing press begins", False)],
    "math": [("Compute 17 * 23 step by step.", True),
             ("If a train travels 60 km in 1.5 hours, its speed is", False)],
    "chat": [("What is the capital of France, and why is it famous?", True),
             ("Explain recursion to a child.", True)],
}


def trace(m, text: str, chat: bool, n: int) -> dict:
    g = ds4py.generate(m, text, max_tokens=n, temperature=0, chat=chat, draft=False)
    toks = g.tokens
    s = m.new_session()
    s.nextn_prime = True
    s.eval(g.prompt_ids)
    buf, err = ffi.new("int32_t[16]"), new_error()
    L = []
    for i, last in enumerate(toks[:-1]):
        if lib.ds4_spec_propose(m._ptr, s._ptr, last, K, buf, err):
            raise RuntimeError(ffi.string(err.message).decode())
        n_ok = 0
        while n_ok < K and i + 1 + n_ok < len(toks) and buf[n_ok] == toks[i + 1 + n_ok]:
            n_ok += 1
        L.append(n_ok)
        s.eval([last])
    s.close()
    return {"workload": "", "prompt": text, "chat": chat, "tokens": n, "L": L}


def main() -> None:
    from bench_spec import WORKLOADS
    m = ds4py.load(os.path.join(ROOT, "ds4py", "models", "demo-q8_0.gguf"), n_threads=1)
    out = []
    for sets, n in ((WORKLOADS, 128), (WORKLOADS, 256), (HELD_OUT, 192)):
        for w, prompts in sets.items():
            for text, chat in prompts:
                t = trace(m, text, chat, n)
                t["workload"] = w
                out.append(t)
    path = os.path.join(ROOT, "tests", "golden", "spec", "demo_traces.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump({"model": "ds4py/models/demo-q8_0.gguf", "max_drafts": K, "traces": out}, fh)
        fh.write("\n")
    os.replace(tmp, path)
    print(f"wrote {path}: {len(out)} traces")


if __name__ == "__main__":
    main()
