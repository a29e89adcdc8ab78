"""Speculative decoding (ds4py.spec) against serial decoding, through ds4py.generate.

    python bench/bench_spec.py [-m MODEL.gguf] [--tokens 128] [--reps 3] [--threads 2]
                               [--json OUT.json]

Default model: the demo model (ds4py/models/demo-q8_0.gguf, with its trained
MTP head). ``make bench-spec`` runs this.

1. Verification throughput (as mere.run measures it): oracle-fed verify at
   widths 1, 2, 4, 8, 9, 16 -- the serial output fed back as drafts, so
   every row is accepted; verified tokens per second of verify + accept
   alone, draft cost excluded. It shows what the verify path can give before
   any drafter is involved (width 1 is a plain one-token step plus the
   rollback bookkeeping).

2. Greedy generation of N tokens on four workloads (code: three Python
   prompts; prose: a docstring; math; chat: a chat-template prompt), each
   mode run on every prompt of the workload, the modes timed in the listed
   order and in reverse on alternate repetitions (repetition 0 warms up and
   is discarded):

     serial      generate(draft=False): the plain decode loop
     adaptive    generate() defaults: the nextn head, AdaptivePolicy
     depth K     generate(draft_depth=K), K = 1..4
     dflash      the same target loaded with a DFlash drafter (--dflash FILE;
                 default with the demo model: its shipped drafter), adaptive
     dflash K    the DFlash drafter at a forced depth K = 2, 4, 8
                 (DFlash pairs run forced under classifier.measuring(): a
                 measurement, whatever the pairs table says of the pair)

   Every mode must produce the serial tokens (checked; a difference aborts).
   Printed per workload and mode: decode tok/s (evaluated tokens / decode
   time, summed over the workload's prompts) min / median / max over the
   repetitions, the ratio of the medians to serial, CPU ms per token
   (process time: on a loaded machine the least noisy figure with one
   thread), acceptance (accepted / drafted), mean accepted length (tokens
   per drafting round) and, for adaptive, the depth histogram of the last
   repetition, with the costs adaptive measured (verify per width, draft
   step, round overhead, in plain steps) and the acceptance per draft
   position at depth 4 -- the breakdown of what limits the speed-up.

A model without a usable text tokenizer (the random bench models,
bench/bench_models.py ``dense08b_mtp``: synthetic vocabulary, one random
nextn head) runs one "random-ids" workload instead: two prompts of 64 seeded
random token ids, through ds4py.spec.speculative_generate (the generate
loop's rounds without text handling): serial = FixedPolicy(0), adaptive =
AdaptivePolicy(), depth K = FixedPolicy(K). A random head's drafts are
noise, so this shows what verify widths cost on a memory-bound model and
what the adaptive policy costs where drafting never pays.

    python bench/bench_spec.py -m $(python bench/bench_models.py dense08b_mtp-Q4_K_M)

Not a test: numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ds4py  # noqa: E402
from ds4py.demo_model import demo_model_path  # noqa: E402

WORKLOADS = {
    "code": [("def fibonacci(n):\n", False),
             ("import os\nimport sys\n\n\ndef main():\n", False),
             ("class Stack:\n    \"\"\"A last-in, first-out stack.\"\"\"\n\n"
              "    def __init__(self):\n", False)],
    "prose": [("def parse(text):\n    \"\"\"Parse the text of a configuration file. The "
               "file is read line by line, and", False)],
    "math": [("Solve for x: 3x + 7 = 22. First subtract 7 from both sides:", False)],
    "chat": [("Write a Python function `is_prime` that returns True if n is prime.", True)],
}
WIDTHS = (1, 2, 4, 8, 9, 16)


def verify_throughput(model, prompt, ref, widths=WIDTHS, reps=3) -> dict:
    """width -> [verified tokens/s per repetition]."""
    out: dict = {w: [] for w in widths}
    for rep in range(reps + 1):
        order = list(widths) if rep % 2 == 0 else list(reversed(widths))
        for w in order:
            with model.new_session() as s:
                s.eval(prompt)
                last, i, t = ref[0], 1, 0.0
                while i + w - 1 <= len(ref) - 1:
                    feed = [last, *ref[i:i + w - 1]]
                    t0 = time.perf_counter()
                    s.verify(feed)
                    s.accept(w)
                    t += time.perf_counter() - t0
                    last, i = ref[i + w - 1], i + w
                if rep:
                    out[w].append((i - 1) / t)
    return out


def ids_workload(model, n_prompts: int = 2, length: int = 64) -> list[list[int]]:
    """Seeded random prompts (token ids) for a model without a text tokenizer."""
    import numpy as np
    rng = np.random.default_rng(1234)
    return [rng.integers(0, model.config.vocab_size - 2, length).tolist()
            for _ in range(n_prompts)]


def _timed_modes(names, prompts, reps, run_one) -> dict:
    """Time every mode on every prompt, the modes in order and reversed on
    alternate repetitions (repetition 0 warms up and is discarded);
    ``run_one(name, prompt) -> (tokens, evaluated, decode_s, draft stats)``.
    Every mode must reproduce serial's tokens. Returns {mode: {"tps",
    "cpu_ms", "last"}}, "last" holding the last repetition's draft figures."""
    refs: dict = {}
    res: dict = {name: {"tps": [], "cpu_ms": [], "last": None} for name in names}
    for rep in range(reps + 1):
        for name in (names if rep % 2 == 0 else names[::-1]):
            toks = secs = cpu = 0.0
            drafted = accepted = rounds = round_tokens = 0
            depth_counts: dict = {}
            tried: dict = {}
            ok: dict = {}
            d: dict = {}
            for i, prompt in enumerate(prompts):
                c0 = time.process_time()
                tokens, evaluated, decode_s, d = run_one(name, prompt)
                cpu += time.process_time() - c0
                if name == "serial":
                    refs.setdefault(i, tokens)
                elif i in refs and tokens != refs[i]:
                    raise SystemExit(f"{name}: output differs from serial on prompt {prompt!r}")
                toks += evaluated
                secs += decode_s
                drafted += d.get("drafted", 0)
                accepted += d.get("accepted", 0)
                dr = d.get("draft_rounds", 0)
                rounds += dr
                round_tokens += (d.get("mean_accepted_length") or 0.0) * dr
                for k, v in (d.get("depth_counts") or {}).items():
                    depth_counts[k] = depth_counts.get(k, 0) + v
                for k, v in (d.get("depth_tried") or {}).items():
                    tried[k] = tried.get(k, 0) + v
                for k, v in (d.get("depth_accepted") or {}).items():
                    ok[k] = ok.get(k, 0) + v
            if rep:
                r = res[name]
                r["tps"].append(toks / secs if secs else 0.0)
                r["cpu_ms"].append(1e3 * cpu / toks if toks else 0.0)
                r["last"] = {"acceptance": accepted / drafted if drafted else None,
                             "mean_accepted_length": round_tokens / rounds if rounds else None,
                             "depth_counts": dict(sorted(depth_counts.items())),
                             "acceptance_per_depth": {k: ok.get(k, 0) / v
                                                      for k, v in sorted(tried.items())},
                             "policy": d.get("policy")}
    return res


def run_ids_workload(model, prompts, n, reps) -> dict:
    """run_workload's figures for id prompts, through speculative_generate."""
    from ds4py.spec import AdaptivePolicy, FixedPolicy, speculative_generate
    policies = {"serial": lambda: FixedPolicy(0), "adaptive": AdaptivePolicy,
                **{f"depth {k}": (lambda k=k: FixedPolicy(k)) for k in (1, 2, 3, 4)}}

    def run_one(name, ids):
        out, st = speculative_generate(model, ids, n, policy=policies[name]())
        # the first token comes from the prompt's pass; the policy summary is
        # not the generate loop's (no shared cost model): left out
        draft = {"drafted": st.get("drafted", 0), "accepted": st.get("accepted", 0),
                 "depth_counts": st.get("depth_counts")}
        return out, len(out) - 1, st["decode_s"], draft
    return _timed_modes(list(policies), prompts, reps, run_one)


def modes() -> list[tuple[str, dict]]:
    return ([("serial", dict(draft=False)), ("adaptive", {})]
            + [(f"depth {k}", dict(draft_depth=k)) for k in (1, 2, 3, 4)])


DFLASH_DEPTHS = (2, 4, 8)


def dflash_modes() -> list[tuple[str, dict]]:
    return ([("dflash", {})]
            + [(f"dflash {k}", dict(draft_depth=k)) for k in DFLASH_DEPTHS])


def run_workload(model, prompts, n, reps, dmodel=None) -> dict:
    """dmodel: the same target loaded with a DFlash drafter (its modes are
    added, the pairing forced under classifier.measuring(): this is a
    measurement, whatever the pairs table says of the pair)."""
    from ds4py.spec.classifier import measuring

    kws = dict(modes())
    dkws = dict(dflash_modes()) if dmodel is not None else {}

    def run_one(name, prompt):
        text, chat = prompt
        if name in dkws:
            with measuring():
                g = ds4py.generate(dmodel, text, max_tokens=n, temperature=0, chat=chat,
                                   force_draft=True, **dkws[name])
            if not (g.draft or {}).get("drafting"):
                raise SystemExit(f"{name}: the DFlash drafter did not draft "
                                 f"({(g.draft or {}).get('refused')})")
        else:
            g = ds4py.generate(model, text, max_tokens=n, temperature=0, chat=chat, **kws[name])
        return g.tokens, g.evaluated_tokens, g.generation_s, g.draft or {}
    return _timed_modes(list(kws) + list(dkws), prompts, reps, run_one)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", default=None, help="GGUF file (default: the demo model)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workload", action="append", choices=sorted(WORKLOADS),
                    help="run only these workloads")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--dflash", default=None,
                    help="also run these DFlash drafter modes (default with the demo model: "
                         "its shipped drafter; 'none' to skip)")
    args = ap.parse_args()
    path = args.model or demo_model_path()
    model = ds4py.load(path, n_threads=args.threads)
    dflash = args.dflash
    if dflash is None and args.model is None:
        dflash = os.path.join(os.path.dirname(path), "demo-dflash-q8_0.gguf")
    dmodel = None
    if dflash and dflash != "none":
        from ds4py.dflash import load as load_dflash
        dmodel = load_dflash(path, n_threads=args.threads, dflash=dflash)
    name = os.path.basename(path)
    print(f"{name}: {args.threads} thread(s), {args.tokens} tokens, greedy, "
          f"{args.reps} reps (+1 warm-up), load average {os.getloadavg()[0]:.2f}")
    report: dict = {"model": name, "threads": args.threads, "tokens": args.tokens,
                    "reps": args.reps, "verify": {}, "workloads": {}}

    try:
        code = model.tokenizer.encode(WORKLOADS["code"][0][0])
        id_prompts = None
    except ds4py.TokenizerError as e:
        print(f"no text tokenizer ({e}): the random-ids workload")
        id_prompts = ids_workload(model)
        code = id_prompts[0]
    if id_prompts is None:
        ref = ds4py.generate(model, code, max_tokens=max(args.tokens, 64), temperature=0,
                             draft=False).tokens
    else:
        from ds4py.spec import FixedPolicy, speculative_generate
        ref, _ = speculative_generate(model, code, max(args.tokens, 64), policy=FixedPolicy(0))
    vt = verify_throughput(model, code, ref, reps=args.reps)
    print("\noracle-fed verify throughput (verified tok/s, draft cost excluded; "
          "min / median / max)")
    base_v = statistics.median(vt[1])
    for w, v in vt.items():
        med = statistics.median(v)
        # one verify + accept of w rows in width-1 steps: w * (tok/s at 1) / (tok/s at w)
        print(f"  width {w:2d}: {min(v):8.0f} {med:8.0f} {max(v):8.0f}   x{med / base_v:.2f} "
              f"vs width 1   verify({w}) = {w * base_v / med:.2f} width-1 steps")
        report["verify"][w] = {"min": min(v), "median": med, "max": max(v)}

    names = ["random-ids"] if id_prompts is not None else (args.workload or list(WORKLOADS))
    for wl in names:
        if id_prompts is not None:
            res = run_ids_workload(model, id_prompts, args.tokens, args.reps)
        else:
            res = run_workload(model, WORKLOADS[wl], args.tokens, args.reps, dmodel)
        base = statistics.median(res["serial"]["tps"])
        n_prompts = len(id_prompts) if id_prompts is not None else len(WORKLOADS[wl])
        print(f"\n{wl}: {n_prompts} prompt(s)")
        print(f"  {'mode':<9} {'tok/s min':>9} {'median':>8} {'max':>8} {'x serial':>8} "
              f"{'cpu ms/t':>8} {'accept':>7} {'len':>5}  depths (last rep)")
        report["workloads"][wl] = {}
        for mode, r in res.items():
            v = r["tps"]
            med = statistics.median(v)
            last = r["last"] or {}
            acc = last.get("acceptance")
            mal = last.get("mean_accepted_length")
            dep = last.get("depth_counts") if mode in ("adaptive", "dflash") else ""
            print(f"  {mode:<9} {min(v):9.0f} {med:8.0f} {max(v):8.0f} {med / base:8.2f} "
                  f"{statistics.median(r['cpu_ms']):8.3f} "
                  f"{'-' if acc is None else f'{acc:.3f}':>7} "
                  f"{'-' if mal is None else f'{mal:.2f}':>5}  {dep}")
            report["workloads"][wl][mode] = {
                "tps": {"min": min(v), "median": med, "max": max(v)},
                "x_serial": med / base, "cpu_ms_per_token": statistics.median(r["cpu_ms"]),
                **{k: last.get(k) for k in ("acceptance", "mean_accepted_length",
                                            "depth_counts")}}
            if mode == "adaptive" and last.get("policy") and "costs" in last["policy"]:
                c = last["policy"]["costs"]
                pl = c["plain_s"]
                per_w = ", ".join(f"{w}: {t / pl:.2f}" for w, t in
                                  (c.get("verify_s_per_width") or {}).items())
                print(f"            adaptive's costs: plain {pl * 1e3:.3f} ms, "
                      f"verify(w) = {c['verify_a_s'] * 1e3:.3f} + {c['verify_b_s'] * 1e3:.3f} w"
                      f" ms, draft step {c['draft_step_s'] * 1e3:.3f} ms, round overhead "
                      f"{c['overhead_s'] * 1e3:.3f} ms")
                print(f"            in plain steps: verify per width {{{per_w}}}, draft step "
                      f"{c['draft_step_s'] / pl:.2f}, overhead {c['overhead_s'] / pl:.2f}")
        # acceptance per draft position d (P(d accepted | 1..d-1 were)), from
        # the deepest fixed depth: what limits the deeper rounds
        apd = (res["depth 4"]["last"] or {}).get("acceptance_per_depth") or {}
        if apd:
            print("  acceptance per draft position (depth 4): "
                  + ", ".join(f"{k}: {v:.3f}" for k, v in apd.items()))
            report["workloads"][wl]["acceptance_per_position"] = apd
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
    model.close()
    if dmodel is not None:
        dmodel.close()


if __name__ == "__main__":
    main()
