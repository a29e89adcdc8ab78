"""Interleaved A/B of draft-policy variants against serial decoding, many
repetitions (the policy's losses on a machine where drafting barely pays are
a few percent, under the noise of a short bench_spec run).

    python bench/spec_policy_ab.py [--reps 100] [--variants adaptive,idle,noburst]
                                   [--tokens 128] [--threads 2] [--backend cpu]

Demo model, bench_spec's four workloads, greedy. Every repetition runs every
mode on every prompt of a workload, the modes in order and reversed on
alternate repetitions (repetition 0 warms up and is discarded). Variants
share the model's measured costs (ds4py.spec.plan.model_costs), as requests
of ds4py.generate do:

  adaptive  generate()'s default policy
  idle      admitted (the head is primed, as when drafting) but never drafts
            or probes: what being admitted costs by itself
  noburst   AdaptivePolicy(burst=0): no cold-start burst
  burst1    AdaptivePolicy(burst_depth=1): the burst as depth-1 shadow probes
  noprobe   AdaptivePolicy(probe_interval=0): no scheduled probes
  costonly  no burst and no probes: the cost model's own choices only
  corr      the default policy with its own cost model, whose end-to-end
            correction is on (ds4py.spec.policy.CostModel(correct=True): the
            default from 2026-12-06 to 2026-12-07; older trees call the
            opposite variant nocorr)
  nonoise   AdaptivePolicy(noise_z=0): starting to draft needs the margin
            alone, not also NOISE_Z standard errors of the price
  nobudget  AdaptivePolicy(explore_allow=None): no exploration budget (the
            cold-start burst and probe follow-ups are never held back)
  rbsplit   the default policy with its own cost model, which prices the
            rollback apart from the overhead (CostModel(split_rollback=True):
            its class doc "Rollback"; off by default)
  absolute  the default policy with its own cost model, which keeps its
            samples in seconds (CostModel(relative=False), as before
            2026-12-07) instead of as ratios to the plain step of their time
  reprice1  AdaptivePolicy(reprice_every=1): the depths re-priced after every
            record, as before 2026-12-07
  nowarm    the default policy with its own cost model, whose overhead comes
            from every round's samples alike
            (CostModel(split_warm=False)), as before 2026-12-07
  fixedK    a fixed draft depth K (1..4): what drafting itself gives here

Printed per workload and variant: tok/s ratio to serial as the ratio of the
medians / the median of per-repetition ratios [min..max of those], and the
mean drafting rounds per request. Not a test: the figures depend on the
machine and its load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_spec import WORKLOADS  # noqa: E402

import ds4py  # noqa: E402
from ds4py.demo_model import demo_model_path  # noqa: E402
from ds4py.spec.plan import model_costs  # noqa: E402
from ds4py.spec.policy import AdaptivePolicy, CostModel, FixedPolicy  # noqa: E402


class IdlePolicy(FixedPolicy):
    """Admitted, never drafts, and promises one endless plain stretch."""

    def __init__(self):
        super().__init__(0)
        self.enabled = True
        self.quiet = 1 << 30

    def choose(self, cap: int) -> int:
        self.quiet = 1 << 30
        return 0

    def pass_quiet(self, n: int) -> None:
        pass


def variants(costs) -> dict:
    corrected = CostModel(correct=True)
    rollback_apart = CostModel(split_rollback=True)
    any_round = CostModel(split_warm=False)
    seconds = CostModel(relative=False)
    return {
        "adaptive": lambda: {},
        "idle": lambda: {"draft_policy": IdlePolicy()},
        "noburst": lambda: {"draft_policy": AdaptivePolicy(costs=costs, burst=0)},
        "burst1": lambda: {"draft_policy": AdaptivePolicy(costs=costs, burst_depth=1)},
        "noprobe": lambda: {"draft_policy": AdaptivePolicy(costs=costs, probe_interval=0)},
        "costonly": lambda: {"draft_policy": AdaptivePolicy(costs=costs, burst=0,
                                                             probe_interval=0)},
        "corr": lambda: {"draft_policy": AdaptivePolicy(costs=corrected)},
        "nonoise": lambda: {"draft_policy": AdaptivePolicy(costs=costs, noise_z=0.0)},
        "nobudget": lambda: {"draft_policy": AdaptivePolicy(costs=costs, explore_allow=None)},
        "rbsplit": lambda: {"draft_policy": AdaptivePolicy(costs=rollback_apart)},
        "absolute": lambda: {"draft_policy": AdaptivePolicy(costs=seconds)},
        "reprice1": lambda: {"draft_policy": AdaptivePolicy(costs=costs, reprice_every=1)},
        "nowarm": lambda: {"draft_policy": AdaptivePolicy(costs=any_round)},
        **{f"fixed{k}": (lambda k=k: {"draft_policy": FixedPolicy(k)}) for k in range(1, 5)},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--variants", default="adaptive,idle,noburst")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--backend", default="cpu", help="cpu (default), cuda or metal")
    ap.add_argument("--workloads", default=",".join(WORKLOADS),
                    help="comma list of bench_spec workloads (default: all four); the model's "
                         "measured costs are shared by the requests of all of them")
    a = ap.parse_args()
    model = ds4py.load(demo_model_path(), n_threads=a.threads, backend=a.backend)
    table = variants(model_costs(model))
    names = [v for v in a.variants.split(",") if v]
    bad = [v for v in names if v not in table]
    if bad:
        raise SystemExit(f"unknown variant(s) {bad}; one of {sorted(table)}")
    modes = [("serial", lambda: {"draft": False})] + [(v, table[v]) for v in names]
    loads = {w: WORKLOADS[w] for w in a.workloads.split(",") if w}
    if not loads or set(loads) - set(WORKLOADS):
        raise SystemExit(f"--workloads: some of {sorted(WORKLOADS)}")
    tps = {w: {m: [] for m, _ in modes} for w in loads}
    rounds = {w: {m: 0 for m, _ in modes} for w in loads}
    for rep in range(a.reps + 1):
        for w, prompts in loads.items():
            for name, kw in (modes if rep % 2 == 0 else modes[::-1]):
                toks = secs = 0.0
                for text, chat in prompts:
                    g = ds4py.generate(model, text, max_tokens=a.tokens, temperature=0,
                                       chat=chat, **kw())
                    toks += g.evaluated_tokens
                    secs += g.generation_s
                    if rep:
                        rounds[w][name] += (g.draft or {}).get("draft_rounds") or 0
                if rep:
                    tps[w][name].append(toks / secs)
    print(f"{a.reps} repetitions, {a.tokens} tokens, {a.threads} threads, {a.backend}; "
          f"ratio to serial: "
          f"ratio of medians / median of ratios [min..max]; r = drafting rounds per request")
    for w, prompts in loads.items():
        s = tps[w]["serial"]
        line = f"{w:6s} serial {statistics.median(s):7.1f} tok/s"
        for name in names:
            x = tps[w][name]
            rs = [p / q for p, q in zip(x, s, strict=True)]
            line += (f" | {name} {statistics.median(x) / statistics.median(s):.3f} / "
                     f"{statistics.median(rs):.3f} [{min(rs):.2f}..{max(rs):.2f}] "
                     f"r{rounds[w][name] / (a.reps * len(prompts)):.1f}")
        print(line)


if __name__ == "__main__":
    main()
