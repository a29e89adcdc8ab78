"""Greedy speculative decoding (ds4py.spec) against serial greedy decoding.

    python bench/bench_spec.py [-m MODEL.gguf ...] [--tokens 256] [--reps 3]
                               [--threads 1] [--prompt 64]

For each model, the same greedy generation of N tokens after a prompt
(the first P tokens of tests/golden/logits/sequences.npz s700), timed in
rotating order each repetition:

  serial        a Python loop: Session.eval of one token + np.argmax
  no-draft      speculative_generate with FixedPolicy(0): the loop's own
                overhead at depth 0
  nextn K       the model's nextn head, fixed depth K = 1..4
  nextn adapt   the head with AdaptivePolicy (measured costs)
  oracle K      a drafter replaying the serial output (every draft
                accepted): what the verify/accept machinery gives when the
                drafter is perfect, i.e. the ceiling on this machine
  oracle adapt  the same with AdaptivePolicy

Every run must produce the serial tokens (checked). Printed per mode:
decode tok/s (tokens after the first / time after the prefill) min /
median / max over repetitions, the ratio of the medians to serial,
acceptance (accepted / drafted drafts), generated tokens per round, and
for the adaptive modes the depth histogram of the last repetition.

On the tiny golden models the nextn heads are random, so their drafts are
essentially never accepted, and a verify row costs about as much as a
one-token eval on a CPU (no memory-bandwidth amortisation at this size):
speculation cannot pay here, and the adaptive policy is expected to settle
at depth 0 with periodic probes. Not a test: numbers depend on the machine
and its load.
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
from ds4py.spec import (  # noqa: E402
    AdaptivePolicy,
    Drafter,
    FixedPolicy,
    speculative_generate,
)

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODELS = [os.path.join(HERE, "tests", "golden", "models", f)
                  for f in ("dense-q8_0.gguf", "moe-q8_0.gguf")]
SEQ = os.path.join(HERE, "tests", "golden", "logits", "sequences.npz")


class Oracle(Drafter):
    name = "oracle"

    def __init__(self, tokens):
        self.tokens = tokens

    def propose(self, state, k):
        g = len(state.generated)
        return [self.tokens[i] if i < len(self.tokens) else 0 for i in range(g, g + k)]


def serial(model, prompt, n):
    with model.new_session() as s:
        t0 = time.perf_counter()
        lg = s.eval(prompt)
        t1 = time.perf_counter()
        out = [int(np.argmax(lg))]
        for _ in range(n - 1):
            out.append(int(np.argmax(s.eval([out[-1]]))))
        t2 = time.perf_counter()
    return out, {"decode_s": t2 - t1, "prompt_s": t1 - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", action="append", help="GGUF file(s)")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--precision", default="fast")
    args = ap.parse_args()
    prompt = [int(t) for t in np.load(SEQ)["s700"][:args.prompt]]
    n = args.tokens
    for path in args.model or DEFAULT_MODELS:
        model = ds4py.load(path, n_threads=args.threads, precision=args.precision)
        ref, _ = serial(model, prompt, n)
        modes = [("serial", None)]
        modes.append(("no-draft", lambda: dict(policy=FixedPolicy(0))))
        for k in (1, 2, 3, 4):
            modes.append((f"nextn {k}", lambda k=k: dict(policy=FixedPolicy(k))))
        modes.append(("nextn adapt", lambda: dict(policy=AdaptivePolicy())))
        for k in (1, 3, 7):
            modes.append((f"oracle {k}", lambda k=k, ref=ref: dict(policy=FixedPolicy(k),
                                                                   drafter=Oracle(ref))))
        modes.append(("oracle adapt", lambda ref=ref: dict(policy=AdaptivePolicy(),
                                                           drafter=Oracle(ref))))
        results: dict = {name: [] for name, _ in modes}
        last: dict = {}
        for rep in range(args.reps + 1):  # rep 0 warms up and is discarded
            order = modes[rep % len(modes):] + modes[:rep % len(modes)]
            for name, kw in order:
                if kw is None:
                    out, st = serial(model, prompt, n)
                else:
                    out, st = speculative_generate(model, prompt, n, **kw())
                if out != ref:
                    raise SystemExit(f"{name}: output differs from serial greedy decoding")
                if rep:
                    results[name].append((n - 1) / st["decode_s"])
                    last[name] = st
        print(f"\n{os.path.basename(path)}  ({args.precision}, {args.threads} thread(s), "
              f"prompt {len(prompt)}, {n} tokens, {args.reps} reps)")
        print(f"{'mode':<13} {'tok/s min':>9} {'median':>9} {'max':>9} {'x serial':>8} "
              f"{'accept':>7} {'tok/round':>9}  depths (last rep)")
        base = statistics.median(results["serial"])
        for name, _ in modes:
            v = results[name]
            med = statistics.median(v)
            st = last[name]
            acc = f"{st['acceptance']:.3f}" if st.get("drafted") else "-"
            tpr = f"{st['tokens_per_round']:.2f}" if "tokens_per_round" in st else "-"
            dep = st.get("depth_counts", "") if "adapt" in name else ""
            print(f"{name:<13} {min(v):9.0f} {med:9.0f} {max(v):9.0f} {med / base:8.2f} "
                  f"{acc:>7} {tpr:>9}  {dep}")
        st = last["nextn adapt"]
        pol = st["policy"]
        if "costs" in pol:
            c = pol["costs"]
            print(f"adaptive (nextn) measured: plain {c['plain_s'] * 1e3:.3f} ms, verify(w) = "
                  f"{c['verify_a_s'] * 1e3:.3f} + {c['verify_b_s'] * 1e3:.3f} w ms, draft step "
                  f"{c['draft_step_s'] * 1e3:.3f} ms; probes {st['probes']}, "
                  f"p = {pol['p'][:3]}")
        model.close()


if __name__ == "__main__":
    main()
