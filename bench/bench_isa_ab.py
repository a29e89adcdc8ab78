"""Interleaved A/B of ds4py builds and forced kernel ISAs on one GGUF file.

Each configuration is LABEL=ROOT:ISA: ROOT a checkout whose ds4py/ has a
built extension (e.g. a `git worktree` of the previous commit), ISA what
DS4_FORCE_ISA selects there (avx2, avx512, scalar; "auto" leaves it unset).
Every configuration runs in its own worker process, loaded once; then each
repetition measures every worker in turn (prefill of N tokens in a fresh
session; decode: restore a snapshot taken at each context, time `steps`
single-token steps), so slow drifts of a shared machine hit all of them
alike. Prints min / median / max per configuration and the ratio of the
medians to the first configuration.

    python bench/bench_isa_ab.py MODEL.gguf old=/tmp/wt:avx2 new=.:avx2 \
        --ctx 128,1024,4096 --prefill 512 --reps 5 --threads 2

DS4PY_PATHS=1 in the environment makes every worker print the kernel
variants it ran (stderr), so the report names the paths measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

_WORKER = r"""
import json, sys, time
import ds4py
path, threads, n_ctx = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ctxs = [int(c) for c in sys.argv[4].split(",") if c]
m = ds4py.Model.load(path, n_threads=threads, n_ctx=n_ctx, precision="fast")
V = m.config.vocab_size
def toks(n, salt):
    return [(i * 7919 + salt * 104729) % (V - 16) + 8 for i in range(n)]
sess, snaps = m.new_session(), {}
for c in ctxs:  # one session grown through the contexts, a snapshot at each
    sess.eval(toks(c - sess.n_past, 2 + c))
    snaps[c] = sess.snapshot()
print(json.dumps({"ready": 1}), flush=True)
for line in sys.stdin:
    cmd = json.loads(line)
    if cmd["op"] == "prefill":
        with m.new_session() as s:
            t = time.perf_counter()
            s.eval(toks(cmd["n"], 1))
            r = {"tps": cmd["n"] / (time.perf_counter() - t)}
    else:
        sess.restore(snaps[cmd["ctx"]])
        tok, t = 11, time.perf_counter()
        for _ in range(cmd["steps"]):
            tok = int(sess.eval([tok]).argmax())
        r = {"tps": cmd["steps"] / (time.perf_counter() - t)}
    print(json.dumps(r), flush=True)
"""


class Worker:
    def __init__(self, label, root, isa, model, threads, n_ctx, ctxs):
        env = {k: v for k, v in os.environ.items()
               if k not in ("DS4_FORCE_ISA", "DS4_FORCE_SCALAR", "PYTHONPATH")}
        env["PYTHONPATH"] = os.path.abspath(root)
        if isa != "auto":
            env["DS4_FORCE_ISA"] = isa
        self.label = label
        self.p = subprocess.Popen(
            [sys.executable, "-c", _WORKER, model, str(threads), str(n_ctx),
             ",".join(map(str, ctxs))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
            cwd=os.path.abspath(root))
        self._read()

    def _read(self):
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.label} died")
        return json.loads(line)

    def ask(self, **cmd):
        self.p.stdin.write(json.dumps(cmd) + "\n")
        self.p.stdin.flush()
        return self._read()["tps"]

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=60)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("configs", nargs="+", help="LABEL=ROOT:ISA")
    ap.add_argument("--ctx", default="128,1024,4096")
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="write the raw figures here")
    a = ap.parse_args(argv)
    ctxs = [int(c) for c in a.ctx.split(",") if c]
    n_ctx = max(ctxs + [a.prefill]) + a.steps + 64
    workers = []
    for c in a.configs:
        label, rest = c.split("=", 1)
        root, isa = rest.rsplit(":", 1)
        t = time.perf_counter()
        workers.append(Worker(label, root, isa, a.model, a.threads, n_ctx, ctxs))
        print(f"# {label}: ready in {time.perf_counter() - t:.0f} s", flush=True)
    points = ([("prefill", a.prefill)] if a.prefill else []) + [("decode", c) for c in ctxs]
    res = {w.label: {f"{k} {n}": [] for k, n in points} for w in workers}
    for rep in range(a.reps + 1):  # rep 0: warm-up, discarded
        for k, n in points:
            for w in (workers if rep % 2 == 0 else workers[::-1]):
                tps = (w.ask(op="prefill", n=n) if k == "prefill"
                       else w.ask(op="decode", ctx=n, steps=a.steps))
                if rep > 0:
                    res[w.label][f"{k} {n}"].append(tps)
    for w in workers:
        w.close()
    base = workers[0].label
    # ratio: per repetition tok/s over the first configuration's in the
    # same repetition (paired, so a slow stretch of the machine cancels)
    print(f"{'point':14s} {'config':10s} {'min':>8s} {'median':>8s} {'max':>8s}"
          f"   ratio vs {base}: min / median / max")
    for k, n in points:
        key = f"{k} {n}"
        for w in workers:
            v = res[w.label][key]
            r = [x / y for x, y in zip(v, res[base][key], strict=True)]
            print(f"{key:14s} {w.label:10s} {min(v):8.2f} {statistics.median(v):8.2f} "
                  f"{max(v):8.2f}   {min(r):.3f} / {statistics.median(r):.3f} / {max(r):.3f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
