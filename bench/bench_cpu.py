"""CPU benchmark: ds4py against llama.cpp on the same GGUF, in one run.

    python bench/bench_cpu.py [--quick] [--threads 2] [--reps 2] [--models ...]
                              [--repack on|off|both] [--out DIR]

Both engines run in their own worker process (so each one's peak RSS is its
own), driven alternately A/B/A/B with the order flipped every repetition; the
first run of every measurement is a warm-up and is discarded (--light-warmup:
one short prefill per engine instead of a whole repetition). Settings are
matched: same file, same thread count, F16 KV cache, flash attention off,
batch 512 for llama.cpp (ds4py runs its 64-row chunks), logits for the last
token only. ds4py runs precision="fast".

Measured per model:
  prefill   tok/s for N tokens from an empty context (512 and 2048; 512 in
            --quick, which also runs only the 0.8B-shape Q4_K_M model);
  decode    tok/s of single-token steps at contexts 128, 1k, 4k, 8k (128 and
            1k in --quick): one growing context per repetition, prefilled up
            to each point and then decoded DECODE_STEPS tokens.
Beside every decode figure: the bandwidth bound. The harness measures this
machine's memory bandwidth with the same thread count (csrc/membw.c: a
STREAM-like read and triad), computes the bytes one decode step at that
context must move (weights touched -- routed experts only for MoE -- plus the
head, GDN state read + write, KV read), prints the breakdown, and reports
tok/s as a fraction of read-bandwidth / bytes.

Writes DIR/bench_cpu.json, DIR/bench_cpu.csv and DIR/bench_cpu.png (tok/s vs
context, both engines; matplotlib). DIR defaults to bench/results/ (ignored by
git). Bench models come from bench/bench_models.py (generated on first use
into ~/.cache/ds4py-bench). llama.cpp is the llama-cpp-python package (a
benchmark dependency only): build it without AMX (this VM faults on it), e.g.
CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON
-DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF".
--repack says whether llama.cpp may repack weights (its default, "on",
use_extra_bufts); "both" runs it twice as two engines.

Numbers depend on the machine and its load: read the min/median/max, and the
ratios measured side by side. Not a test.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

DECODE_STEPS = 16
PREFILLS = (512, 2048)
CONTEXTS = (128, 1024, 4096, 8192)
MODELS = ("dense08b-Q8_0", "dense08b-Q4_K_M", "moe-Q4_K_M", "moe-Q8_0")
QUICK_MODELS = ("dense08b-Q4_K_M",)


# ------------------------------------------------------------------ workers
# A worker loads one engine and answers JSON commands on stdin:
#   {"op": "prefill", "n": N}            -> {"s": seconds}
#   {"op": "decode_sweep", "ctx": [...], "steps": k} -> {"tps": [...]}
#   {"op": "rss"}                        -> {"rss_mb": peak}
#   {"op": "paths"}                      -> {"paths": DS4PY_PATHS record} (ds4py)

def _tokens(n: int, vocab: int, salt: int) -> list[int]:
    # deterministic, spread over the vocabulary, no special meaning
    return [(i * 7919 + salt * 104729) % (vocab - 16) + 8 for i in range(n)]


class _Ds4:
    def __init__(self, path, threads, n_ctx):
        import ds4py
        self.m = ds4py.Model.load(path, n_threads=threads, n_ctx=n_ctx, precision="fast")
        self.vocab = self.m.config.vocab_size

    def prefill(self, n):
        toks = _tokens(n, self.vocab, 1)
        with self.m.new_session() as s:
            t = time.perf_counter()
            s.eval(toks)
            return time.perf_counter() - t

    def decode_sweep(self, ctxs, steps):
        out = []
        with self.m.new_session() as s:
            pos = 0
            for c in ctxs:
                s.eval(_tokens(c - pos, self.vocab, 2 + c))
                tok = 11
                t = time.perf_counter()
                for _ in range(steps):
                    lg = s.eval([tok])
                    tok = int(lg.argmax())
                out.append(steps / (time.perf_counter() - t))
                pos = c + steps
        return out


class _Llama:
    def __init__(self, path, threads, n_ctx, repack):
        import llama_cpp as lc
        self.lc = lc
        lc.llama_backend_init()
        mp = lc.llama_model_default_params()
        mp.use_extra_bufts = bool(repack)
        self.model = lc.llama_model_load_from_file(path.encode(), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        cp = lc.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = cp.n_ubatch = 512
        cp.n_threads = cp.n_threads_batch = threads
        cp.type_k = cp.type_v = 1  # GGML_TYPE_F16
        cp.flash_attn_type = 0     # LLAMA_FLASH_ATTN_TYPE_DISABLED
        cp.no_perf = True
        self.ctx = lc.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create a context")
        self.vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))
        self.pos = 0

    def _clear(self):
        self.lc.llama_memory_clear(self.lc.llama_get_memory(self.ctx), True)
        self.pos = 0

    def _eval(self, toks):
        lc = self.lc
        for i in range(0, len(toks), 512):
            part = toks[i:i + 512]
            arr = (lc.llama_token * len(part))(*part)
            rc = lc.llama_decode(self.ctx, lc.llama_batch_get_one(arr, len(part)))
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")
        self.pos += len(toks)

    def _argmax(self):
        import numpy as np
        p = self.lc.llama_get_logits_ith(self.ctx, -1)
        return int(np.ctypeslib.as_array(p, shape=(self.vocab,)).argmax())

    def prefill(self, n):
        self._clear()
        toks = _tokens(n, self.vocab, 1)
        t = time.perf_counter()
        self._eval(toks)
        return time.perf_counter() - t

    def decode_sweep(self, ctxs, steps):
        self._clear()
        out = []
        for c in ctxs:
            self._eval(_tokens(c - self.pos, self.vocab, 2 + c))
            tok = 11
            t = time.perf_counter()
            for _ in range(steps):
                self._eval([tok])
                tok = self._argmax()
            out.append(steps / (time.perf_counter() - t))
        return out


def _peak_rss_mb() -> float:
    """This process's peak RSS: VmHWM (reset by exec, unlike ru_maxrss, which
    a worker would inherit from the harness that forked it)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker_main(engine, path, threads, n_ctx, repack):
    eng = _Ds4(path, threads, n_ctx) if engine == "ds4py" else _Llama(path, threads, n_ctx, repack)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "prefill":
            r = {"s": eng.prefill(cmd["n"])}
        elif cmd["op"] == "decode_sweep":
            r = {"tps": eng.decode_sweep(cmd["ctx"], cmd["steps"])}
        elif cmd["op"] == "rss":
            r = {"rss_mb": _peak_rss_mb()}
        elif cmd["op"] == "paths":
            from ds4py._core import paths_report
            r = {"paths": paths_report()}
        else:
            r = {"error": f"unknown op {cmd['op']!r}"}
        print(json.dumps(r), flush=True)


class Worker:
    def __init__(self, name, engine, path, threads, n_ctx, repack, log_dir, extra_env=None):
        self.name = name
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), **(extra_env or {})}
        # the engines' own logging (llama.cpp's is verbose) goes to a file
        self.log = open(os.path.join(log_dir, f"worker-{name.replace(' ', '_')}.log"), "w")
        self.p = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", engine, path, str(threads),
             str(n_ctx), "1" if repack else "0"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        ready = self.p.stdout.readline()
        if not ready:
            raise RuntimeError(f"worker {name} failed to start")

    def ask(self, **cmd):
        self.p.stdin.write(json.dumps(cmd) + "\n")
        self.p.stdin.flush()
        r = json.loads(self.p.stdout.readline())
        if "error" in r:
            raise RuntimeError(r["error"])
        return r

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=60)
        self.log.close()


# ------------------------------------------------------------- bandwidth

def bandwidth(threads: int) -> dict:
    from ds4py._core import ffi, lib, new_error
    out = {}
    for kind, name in ((lib.DS4_MEMBW_READ, "read"), (lib.DS4_MEMBW_TRIAD, "triad")):
        g, err = ffi.new("double *"), new_error()
        if lib.ds4_membw(threads, kind, 1 << 30, 5, g, err) != 0:
            raise RuntimeError(ffi.string(err.message).decode())
        out[name] = g[0]
    return out


def bytes_per_token(path: str, ctx: int) -> dict:
    """What one decode step at context ctx must move (see the module doc)."""
    from ds4py import gguf
    f = gguf.open(path)
    md = f.metadata
    a = md["general.architecture"]
    n_layer = md[f"{a}.block_count"]
    interval = md.get(f"{a}.full_attention_interval", 4)
    n_exp, n_used = md.get(f"{a}.expert_count", 0), md.get(f"{a}.expert_used_count", 0)
    w_all = w_exp = head = 0
    for name, t in f.tensors.items():
        if name == "token_embd.weight":
            continue
        if "_exps." in name:
            w_exp += t.nbytes
        elif name == "output.weight":
            head += t.nbytes
        else:
            w_all += t.nbytes
    if "output.weight" not in f.tensors:
        head = f.tensors["token_embd.weight"].nbytes  # tied: the head reads it all
    routed = w_exp * n_used // n_exp if n_exp else 0
    n_attn = sum(1 for il in range(n_layer) if (il + 1) % interval == 0)
    n_gdn = n_layer - n_attn
    dk, nv = md[f"{a}.ssm.state_size"], md[f"{a}.ssm.time_step_rank"]
    nk = md[f"{a}.ssm.group_count"]
    conv = 3 * (2 * nk * dk + nv * dk) * 4
    gdn = n_gdn * 2 * (nv * dk * dk * 4 + conv)
    kv = n_attn * 2 * md[f"{a}.attention.head_count_kv"] * md[f"{a}.attention.key_length"] * ctx * 2
    b = {"weights": w_all + routed, "head": head, "gdn_state": gdn, "kv": kv}
    b["total"] = sum(b.values())
    return b


# ----------------------------------------------------------------- driver

def _stats(v):
    return {"min": min(v), "median": statistics.median(v), "max": max(v), "n": len(v)}


def run_model(spec, a, bw, log):
    import bench_models
    shape, _, quant = spec.partition("-")
    path = bench_models.ensure(shape, quant, log=log)
    ctxs = [c for c in (CONTEXTS[:2] if a.quick else CONTEXTS)]
    prefills = PREFILLS[:1] if a.quick else PREFILLS
    n_ctx = max(max(ctxs) + DECODE_STEPS * len(ctxs) + 16, max(prefills)) + 64
    engines = [("ds4py", "ds4py", True)]
    if a.repack in ("on", "both"):
        engines.append(("llama.cpp" + ("" if a.repack == "on" else " repack"), "llama", True))
    if a.repack in ("off", "both"):
        engines.append(("llama.cpp no-repack", "llama", False))
    workers = [Worker(n, e, path, a.threads, n_ctx, rp, a.out) for n, e, rp in engines]
    res = {w.name: {"prefill": {}, "decode": {}} for w in workers}
    try:
        for rep in range(a.reps + 1):  # rep 0: warm-up, discarded
            order = workers if rep % 2 == 0 else workers[::-1]
            if rep == 0 and a.light_warmup:
                # the weights paged in and the code paths run once: one short
                # prefill per engine (a full repetition at 8k contexts costs
                # ~8 minutes on the MoE model)
                for w in order:
                    w.ask(op="prefill", n=prefills[0])
                log(f"  {spec}: light warm-up done")
                continue
            for n in prefills:
                for w in order:
                    s = w.ask(op="prefill", n=n)["s"]
                    if rep:
                        res[w.name]["prefill"].setdefault(n, []).append(n / s)
            for w in order:
                tps = w.ask(op="decode_sweep", ctx=ctxs, steps=DECODE_STEPS)["tps"]
                if rep:
                    for c, v in zip(ctxs, tps, strict=True):
                        res[w.name]["decode"].setdefault(c, []).append(v)
            log(f"  {spec}: repetition {rep}{' (warm-up)' if rep == 0 else ''} done")
        rss = {w.name: w.ask(op="rss")["rss_mb"] for w in workers}
    finally:
        for w in workers:
            w.close()
    out = {"model": spec, "path": path, "file_gb": os.path.getsize(path) / 1e9, "engines": {}}
    for name, r in res.items():
        out["engines"][name] = {
            "prefill": {n: _stats(v) for n, v in r["prefill"].items()},
            "decode": {c: _stats(v) for c, v in r["decode"].items()},
            "peak_rss_mb": rss[name],
        }
    # split-K decode attention runs once a row sees two 256-blocks
    # (attention.c: n == 1 && nb > 1): 1k shows the decode paths without
    # another 8k prefill
    out["paths"] = kernel_paths(path, a, prefills[0], min(ctxs[-1], 1024), log)
    out["bytes_per_token"] = {c: bytes_per_token(path, c) for c in ctxs}
    out["bound_tps"] = {c: bw["read"] * 1e9 / out["bytes_per_token"][c]["total"] for c in ctxs}
    return out


def kernel_paths(path, a, prefill_n, ctx, log):
    """Which kernel variant each layer ran (DS4PY_PATHS=1), from a separate
    ds4py worker after the timed runs: the record takes a lock per noted
    call, so it must not share a process with a timed figure. The worker
    runs one prefill (the GEMM paths) and a few decode steps at ctx (the
    matvec and split-K attention paths). Returns {(op, variant): layers}
    as a list of [op, variant, n_layers] rows."""
    env = {"DS4PY_PATHS": "1"}
    n_ctx = max(prefill_n, ctx + 8) + 64
    w = Worker("ds4py paths", "ds4py", path, a.threads, n_ctx, True, a.out, extra_env=env)
    try:
        w.ask(op="prefill", n=prefill_n)
        w.ask(op="decode_sweep", ctx=[ctx], steps=2)
        rep = w.ask(op="paths")["paths"]
    finally:
        w.close()
    count: dict = {}
    for line in rep.splitlines():
        m = re.match(r"layer +-?\d+  (.{22}) (.*)$", line)  # paths.c's "layer %3lld  %-22s %s"
        if not m:
            continue
        key = (m.group(1).strip(), m.group(2).strip())
        count[key] = count.get(key, 0) + 1
    rows = [[op, var, n] for (op, var), n in sorted(count.items())]
    if not rows:
        log("  kernel paths: none recorded (DS4PY_PATHS gave no report)")
    return rows


def l3_bytes() -> int:
    """Size of the last-level cache (Linux sysfs), 0 if unknown."""
    best = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        entries = [d for d in os.listdir(base) if d.startswith("index")]
    except OSError:
        return 0
    for d in entries:
        try:
            with open(os.path.join(base, d, "size")) as fh:
                v = fh.read().strip()
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(v[-1:], 1)
            best = max(best, int(v.rstrip("KMG")) * mult)
        except (OSError, ValueError):
            continue
    return best


def report(results, bw, threads, log):
    rows = []
    log(f"\nmemory bandwidth, {threads} threads: read {bw['read']:.1f} GB/s, "
        f"triad {bw['triad']:.1f} GB/s")
    llc = l3_bytes()
    for r in results:
        log(f"\n== {r['model']} ({r['file_gb']:.2f} GB) ==")
        if llc and r["file_gb"] * 1e9 < 2 * llc:
            # the bound is DRAM bandwidth; a model this size is partly served
            # by the last-level cache, so tok/s can exceed it
            log(f"note: the model is under 2x the {llc / 2**20:.0f} MiB last-level cache: "
                "the bandwidth bound understates what the caches feed")
        names = list(r["engines"])
        base = next((n for n in names if n.startswith("llama")), None)
        for kind in ("prefill", "decode"):
            for key in r["engines"][names[0]][kind]:
                line = f"{kind:7s} {key:>5}: "
                for n in names:
                    st = r["engines"][n][kind][key]
                    line += f"{n} {st['median']:7.1f} tok/s [{st['min']:.1f}..{st['max']:.1f}]  "
                    row = {"model": r["model"], "engine": n, "kind": kind, "tokens": key,
                           **{k: st[k] for k in ("min", "median", "max", "n")},
                           "peak_rss_mb": r["engines"][n]["peak_rss_mb"]}
                    if kind == "decode":
                        row["bound_tps"] = r["bound_tps"][key]
                        row["fraction_of_bound"] = st["median"] / r["bound_tps"][key]
                    rows.append(row)
                if base and base != "ds4py":
                    ratio = (r["engines"]["ds4py"][kind][key]["median"]
                             / r["engines"][base][kind][key]["median"])
                    line += f"ds4py/{base} {ratio:.2f}x"
                if kind == "decode":
                    b = r["bytes_per_token"][key]
                    bound = r["bound_tps"][key]
                    fr = r["engines"]["ds4py"][kind][key]["median"] / bound
                    line += (f"\n               bound {bound:.1f} tok/s (ds4py at {fr:.0%}); "
                             f"bytes/token "
                             f"{b['total'] / 1e6:.1f} MB = weights {b['weights'] / 1e6:.1f} + head "
                             f"{b['head'] / 1e6:.1f} + GDN state {b['gdn_state'] / 1e6:.1f} + KV "
                             f"{b['kv'] / 1e6:.1f}")
                log(line)
        for op, var, n in r.get("paths", []):
            log(f"ds4py path: {op:22s} {var}  ({n} layer{'s' if n != 1 else ''})")
        log("peak RSS: " + ", ".join(f"{n} {r['engines'][n]['peak_rss_mb']:.0f} MB" for n in names))
    return rows


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4), squeeze=False)
    for ax, r in zip(axes[0], results, strict=True):
        for n, e in r["engines"].items():
            cs = sorted(e["decode"], key=int)
            ax.plot([int(c) for c in cs], [e["decode"][c]["median"] for c in cs], "o-", label=n)
        cs = sorted(r["bound_tps"], key=int)
        ax.plot([int(c) for c in cs], [r["bound_tps"][c] for c in cs], "k--",
                label="bandwidth bound")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("decode tok/s")
        ax.set_title(r["model"])
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="the 0.8B-shape Q4_K_M only, 512 prefill, contexts 128/1k")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2, help="measured repetitions (after one warm-up)")
    ap.add_argument("--light-warmup", action="store_true",
                    help="warm up with one short prefill per engine instead of a full repetition")
    ap.add_argument("--models", default=None, help="comma list of NAME-QUANT (bench_models.py)")
    ap.add_argument("--repack", choices=("on", "off", "both"), default="on")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    a = ap.parse_args(argv)
    models = a.models.split(",") if a.models else (QUICK_MODELS if a.quick else MODELS)
    os.makedirs(a.out, exist_ok=True)

    def log(s):
        print(s, flush=True)

    bw = bandwidth(a.threads)
    log(f"bandwidth ({a.threads} threads): read {bw['read']:.1f} GB/s, "
        f"triad {bw['triad']:.1f} GB/s")
    results = [run_model(m, a, bw, log) for m in models]
    rows = report(results, bw, a.threads, log)
    meta = {"threads": a.threads, "reps": a.reps, "bandwidth_gbps": bw, "quick": a.quick,
            "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "load_avg": os.getloadavg(), "decode_steps": DECODE_STEPS, "repack": a.repack}
    with open(os.path.join(a.out, "bench_cpu.json"), "w") as fh:
        json.dump({"meta": meta, "results": results}, fh, indent=1)
    with open(os.path.join(a.out, "bench_cpu.csv"), "w", newline="") as fh:
        wr = csv.DictWriter(fh, fieldnames=sorted({k for r in rows for k in r}))
        wr.writeheader()
        wr.writerows(rows)
    try:
        plot(results, os.path.join(a.out, "bench_cpu.png"))
    except ImportError:
        log("matplotlib is not installed: no plot (pip install matplotlib)")
    log(f"\nwrote {a.out}/bench_cpu.json, .csv, .png")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _, _, engine, path, threads, n_ctx, repack = sys.argv
        worker_main(engine, path, int(threads), int(n_ctx), repack == "1")
        sys.exit(0)
    sys.exit(main())
