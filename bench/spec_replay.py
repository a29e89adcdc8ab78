"""What draft-depth policies can reach on real acceptance traces, without timing anything.

    python bench/spec_replay.py [--verify-row 0.45] [--draft-step 0.18] [--overhead 0.11]

Replays the demo head's acceptance traces (tests/golden/spec/demo_traces.json:
for each position of 21 serial greedy generations, how many chained drafts
the target accepts there) under a round-cost model in plain-step units:
cost(0) = 1, cost(d) = verify(d + 1) + d * draft_step + overhead. The default
verify(w) is the demo model's measured table on the 2-core CPU (the adaptive
policy's own estimates in `make bench-spec`); ``--verify-row R`` replaces it
with 1 + R * (w - 1) (R = 0: verify rows free, as on a memory-bound target).

Prints, per workload, tokens per plain step for: the adaptive policy
(ds4py.spec.policy.AdaptivePolicy, as shipped), each fixed depth, and an
oracle that knows every position's acceptance in advance (dynamic
programming over the trace: the best any policy could do with this drafter
at these costs). The oracle is the ceiling a speed goal can be checked
against before any kernel work.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from test_policy import DEMO_VERIFY, replay  # noqa: E402

from ds4py.spec.policy import AdaptivePolicy, FixedPolicy  # noqa: E402


def oracle(L: list[int], cost, max_depth: int = 15) -> float:
    """Tokens per plain step of the best schedule for this trace."""
    best = [0.0] * (len(L) + 1)
    for i in range(len(L) - 1, -1, -1):
        b = cost(0) + best[i + 1]
        for k in range(1, max_depth + 1):
            b = min(b, cost(k) + best[min(i + min(L[i], k) + 1, len(L))])
        best[i] = b
    return (len(L) + 1) / best[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--verify-row", type=float, default=None,
                    help="verify(w) = 1 + R (w - 1) instead of the measured table")
    ap.add_argument("--draft-step", type=float, default=0.18)
    ap.add_argument("--overhead", type=float, default=0.11)
    a = ap.parse_args()

    def verify(w: int) -> float:
        if a.verify_row is not None:
            return 1.0 + a.verify_row * (w - 1)
        ks = sorted(DEMO_VERIFY)
        lo = max(k for k in ks if k <= w)
        hi = min(k for k in ks if k >= w)
        if lo == hi:
            return DEMO_VERIFY[lo]
        return DEMO_VERIFY[lo] + (DEMO_VERIFY[hi] - DEMO_VERIFY[lo]) * (w - lo) / (hi - lo)

    def cost(d: int) -> float:
        return 1.0 if d == 0 else verify(d + 1) + a.draft_step * d + a.overhead

    with open(os.path.join(ROOT, "tests", "golden", "spec", "demo_traces.json")) as fh:
        traces = json.load(fh)["traces"]
    groups: dict = {}
    for t in traces:
        groups.setdefault(t["workload"], []).append(t["L"])
    print(f"costs in plain steps: verify(2..5) = "
          f"{', '.join(f'{verify(w):.2f}' for w in range(2, 6))}, draft step {a.draft_step}, "
          f"overhead {a.overhead}")
    print(f"{'workload':9s} {'traces':>6s} {'adaptive':>9s} " +
          " ".join(f"{'fixed ' + str(k):>8s}" for k in range(1, 6)) + f" {'oracle':>8s}")
    def mean(f, Ls):
        return sum(f(L) for L in Ls) / len(Ls)

    for w, Ls in groups.items():
        ad = mean(lambda L: replay(AdaptivePolicy(cost=cost), L, cost), Ls)
        fx = [mean(lambda L, k=k: replay(FixedPolicy(k), L, cost), Ls) for k in range(1, 6)]
        orc = mean(lambda L: oracle(L, cost), Ls)
        print(f"{w:9s} {len(Ls):6d} {ad:9.3f} " + " ".join(f"{v:8.3f}" for v in fx)
              + f" {orc:8.3f}")


if __name__ == "__main__":
    main()
