"""Decode attention at long context: GB/s of F16 KV streamed vs the read bandwidth.

A small random-weight model whose every layer is gated attention with a bench
model's attention shape (dense08b: H 8 / KV 2, head 256; moe: H 16 / KV 2,
head 256), E 256 and a 1k vocabulary, so a decode step at context C is almost
all attention. One worker process per source tree (old build vs new: A/B)
prefills C tokens once, plus a second session at a short context; then the
measurement alternates between trees, step by step: each step is one decode
token, timed, after a 512 MiB read that evicts the KV from the caches (in a
real model the weights stream through every cache level each token, so the
KV is cold as well). The attention time of a step is its time at C minus the
median time at the short context; KV bytes = layers x kv heads x C x head x 2
(K and V) x 2 bytes.

    python bench/bench_attn.py [--shape dense08b|moe] [--ctx 8192] [--layers 2]
                               [--trees /tmp/wt_attn,.] [--reps 20]

Prints per tree: KV GB/s min/median/max and as a fraction of the read
bandwidth (bench_cpu.bandwidth, 2 threads), and for two trees the per-step
time ratios (old/new) min/median/max, measured interleaved.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# (n_head, n_head_kv, head_dim) of the bench models (bench_models.SHAPES)
ATTN_SHAPES = {"dense08b": (8, 2, 256), "moe": (16, 2, 256)}
SHORT_CTX = 16


def model_for(shape: str, layers: int) -> str:
    sys.path.insert(0, HERE)
    import bench_models as BM
    h, kv, dh = ATTN_SHAPES[shape]
    s = BM.Shape("qwen35", layers, 256, h, kv, dh, 2, 4, 64, n_ff=256, n_vocab=1024,
                 attn_interval=1)
    path = os.path.join(BM.cache_dir(), f"attn-{shape}-l{layers}-q8_0.gguf")
    if not os.path.exists(path):
        print(f"generating {path} ...", flush=True)
        BM.write_model(s, "Q8_0", path)
    return path


def worker(tree: str, path: str, threads: int, ctx: int, cpu: bool, short: int,
           do_flush: bool) -> None:
    sys.path.insert(0, tree)
    import numpy as np

    import ds4py
    assert os.path.dirname(os.path.dirname(os.path.abspath(ds4py.__file__))) == \
        os.path.abspath(tree), ds4py.__file__
    flush = np.ones((512 << 20) // 4, np.float32)
    m = ds4py.Model.load(path, n_threads=threads, n_ctx=ctx + 4096, precision="fast")
    V = m.config.vocab_size
    toks = [(i * 7919 + 104729) % (V - 16) + 8 for i in range(ctx)]
    long_s, short_s = m.new_session(), m.new_session()
    long_s.eval(toks)
    short_s.eval(toks[:short])
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        s = long_s if cmd["which"] == "long" else short_s
        if do_flush:
            flush.max()
        clock = time.process_time if cpu else time.perf_counter
        t = clock()
        s.eval([11])
        print(json.dumps({"s": clock() - t}), flush=True)
    long_s.close()
    short_s.close()
    m.close()


def _stats(v):
    return min(v), statistics.median(v), max(v)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(ATTN_SHAPES), default="dense08b")
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--trees", default=ROOT, help="comma list of source trees (built in place)")
    ap.add_argument("--reps", type=int, default=20, help="timed steps per tree (after 3 warm-up)")
    ap.add_argument("--model", default=None,
                    help="time decode steps of this GGUF instead (a bench model: the step "
                         "times and their ratios only, no KV figure)")
    ap.add_argument("--short", type=int, default=SHORT_CTX, help="the short context")
    ap.add_argument("--no-flush", action="store_true",
                    help="no cache eviction before a step (bench_cpu's decode loop)")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time steps by the process's CPU time, not the wall clock (with "
                         "--threads 1: robust to other jobs taking the cores; the pool's "
                         "spinning counts with more threads)")
    a = ap.parse_args(argv)
    sys.path.insert(0, ROOT)
    sys.path.insert(0, HERE)
    from bench_cpu import bandwidth
    bw = bandwidth(a.threads)["read"]
    path = a.model or model_for(a.shape, a.layers)
    trees = [os.path.abspath(t) for t in a.trees.split(",")]
    procs = []
    for t in trees:
        p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", t, path,
                              str(a.threads), str(a.ctx), str(int(a.cpu_time)), str(a.short),
                              str(int(not a.no_flush))],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        procs.append(p)
    for p in procs:  # prefills run concurrently: wait for all before timing
        if not p.stdout.readline():
            raise RuntimeError("worker failed to start")

    def step(p, which):
        p.stdin.write(json.dumps({"which": which}) + "\n")
        p.stdin.flush()
        return json.loads(p.stdout.readline())["s"]

    times = {t: {"long": [], "short": []} for t in trees}
    for rep in range(a.reps + 3):
        for which in ("short", "long"):
            for t, p in zip(trees, procs, strict=True):
                v = step(p, which)
                if rep >= 3:
                    times[t][which].append(v)
    for p in procs:
        p.stdin.close()
        p.wait(timeout=60)
    if a.model:
        print(f"{os.path.basename(a.model)}, {a.threads} threads, "
              f"{'CPU' if a.cpu_time else 'wall'} time, flush {not a.no_flush}: decode step ms "
              "min/median/max")
        for t in trees:
            lo, sh = _stats(times[t]["long"]), _stats(times[t]["short"])
            print(f"  {t}: ctx {a.ctx} {lo[0] * 1e3:.2f} / {lo[1] * 1e3:.2f} / {lo[2] * 1e3:.2f}; "
                  f"ctx {a.short} {sh[0] * 1e3:.2f} / {sh[1] * 1e3:.2f} / {sh[2] * 1e3:.2f}; "
                  f"tok/s at {a.ctx} / at {a.short} (medians) = {sh[1] / lo[1]:.3f}")
        attn = {t: [x - statistics.median(times[t]["short"]) for x in times[t]["long"]]
                for t in trees}
    else:
        h, kv, dh = ATTN_SHAPES[a.shape]
        kv_bytes = a.layers * kv * a.ctx * dh * 2 * 2
        print(f"{a.shape} attention (H {h} / KV {kv}, head {dh}), {a.layers} layers, ctx {a.ctx}, "
              f"{a.threads} threads, {'CPU' if a.cpu_time else 'wall'} time: KV "
              f"{kv_bytes / 1e6:.1f} MB/step; read bandwidth {bw:.1f} GB/s")
        attn = {}
        for t in trees:
            base = statistics.median(times[t]["short"])
            attn[t] = [x - base for x in times[t]["long"]]
            gbs = sorted(kv_bytes / x / 1e9 for x in attn[t])
            lo, med, hi = gbs[0], statistics.median(gbs), gbs[-1]
            print(f"  {t}: step {statistics.median(times[t]['long']) * 1e3:.2f} ms "
                  f"(short ctx {base * 1e3:.2f} ms); KV stream {lo:.1f} / {med:.1f} / {hi:.1f} "
                  f"GB/s (min/median/max) = {med / bw:.0%} of read bandwidth")
    if len(trees) == 2:
        r = _stats([x / y for x, y in zip(times[trees[0]]["long"], times[trees[1]]["long"],
                                          strict=True)])
        ra = _stats([x / y for x, y in zip(attn[trees[0]], attn[trees[1]], strict=True)])
        names = f"{os.path.basename(trees[0])} / {os.path.basename(trees[1])}"
        print(f"  step time ratio {names}: {r[0]:.3f} / {r[1]:.3f} / {r[2]:.3f}; attention-only "
              f"ratio {ra[0]:.3f} / {ra[1]:.3f} / {ra[2]:.3f} (min/median/max, step by step)")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _, _, tree, path, threads, ctx, cpu, short, fl = sys.argv
        worker(tree, path, int(threads), int(ctx), cpu == "1", int(short), fl == "1")
        sys.exit(0)
    sys.exit(main())
