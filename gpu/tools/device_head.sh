#!/usr/bin/env bash
# device_head.sh — the nextn head on the CUDA machine (gpu/host/runner_head.c),
# in one command:
#
#   bash gpu/tools/device_head.sh          (from the repository root; wheels in .whl/)
#
#  1. builds build/gpu-model-cuda/test_gpu_model (make cuda-model);
#  2. correctness: test_gpu_model --head on the demo model (48 tokens): greedy
#     speculative decoding with the head's drafts == serial, priming in evals
#     of 1, 2, 3, ... rows drafts what one eval's priming drafts; the rounds'
#     drafts land in $OUT/head.drafts.i32 for a CPU comparison on the
#     development machine (tests/test_gpu_model.py test_nextn_head_drafts'
#     check);
#  3. speed of the C loop: test_gpu_model --head-bench (serial, depths 1..4;
#     REPS times);
#  4. with the wheels of device_backend.sh in .whl/: ds4py.generate on
#     backend="cuda", serial (draft=False) against the adaptive policy and
#     forced depths, on code / prose / math / chat prompts, REPS repetitions
#     with the order reversed on alternate ones: tokens compared (must be
#     equal), tok/s min / median / max, the draft statistics, and the
#     adaptive policy's acceptance estimates and cost model (POLICY lines);
#  5. a draft_head sidecar on cuda: the demo model's head extracted by
#     gguf_tools extract-mtp and loaded as draft_head (it replaces the bundled
#     head) drafts what the bundled head drafts: forced depths 2 and 3 on the
#     four prompts, tokens and draft counts compared (SIDECAR lines, all
#     same=True). Both run as the caller's drafter (NextnDrafter): the
#     pairs table refuses this pair as measured bad on the CPU
#     (ds4py/spec/pairs.json), and a caller's drafter is not classified;
#  6. DFlash on cuda: the demo model with its shipped DFlash drafter (the
#     drafter on the CPU side, fed the device's layer taps), forced depths
#     2, 4 and 7 as the caller's drafter (the pairs table refuses this pair
#     on the CPU's measurements) against serial, REPS repetitions: tokens
#     compared, tok/s, draft counts beside the CPU target's at the same
#     depth (DFLASH lines);
#  7. rejection sampling on cuda (spec_sampling="rejection": the head's
#     steps with host-drawn tokens, GpuSession.nextn_step): the same seed
#     twice gives the same tokens, drafts made, tok/s against the exact
#     sampling mode and no drafting (REJECT lines).
# Everything lands in $OUT/device_head.log as well.
set -u
cd "$(dirname "$0")/../.."
OUT="${OUT:-build/device_head}"
mkdir -p "$OUT"
LOG="$OUT/device_head.log"
BIN=build/gpu-model-cuda/test_gpu_model
DEMO=ds4py/models/demo-q8_0.gguf
REPS="${REPS:-3}"
export DS4PY_CACHE_DIR="${DS4PY_CACHE_DIR:-$PWD/build/ds4py-cache}"

step() { echo "=== $* ($(date +%T))"; }
main() {
step build
make -s cuda-model || { echo "BUILD FAILED"; return 1; }
step "head: speculative == serial, priming invariance, drafts for the CPU comparison"
timeout 120 $BIN --head $DEMO gpu/bench/demo_tokens.i32 48 "$OUT/head" || echo "HEAD CHECK FAILED rc=$?"
step "head-bench (C loop, demo model, 256 tokens)"
for i in $(seq "$REPS"); do timeout 120 $BIN --head-bench $DEMO gpu/bench/demo_tokens.i32 256; done

[ -d .whl ] || { step "no .whl/: the Python part is skipped"; return 0; }
step "python: install wheels, build the extension and the CUDA plugin"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || { echo "WHEEL INSTALL FAILED"; return 1; }
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
python3 setup.py -q build_ext --inplace > "$OUT/build_ext.log" 2>&1 \
    || { tail -20 "$OUT/build_ext.log"; echo "EXTENSION BUILD FAILED"; return 1; }
timeout 400 python3 gpu/tools/build_plugin.py cuda --cache "$DS4PY_CACHE_DIR/gpu" \
    || { echo "PLUGIN BUILD FAILED"; return 1; }
step "python: generate on cuda, serial vs drafting"
REPS="$REPS" timeout 400 python3 - <<'PY' || echo "PYTHON PART FAILED rc=$?"
import os, statistics, time
import ds4py

reps = int(os.environ["REPS"])
m = ds4py.load("ds4py/models/demo-q8_0.gguf", backend="cuda")
print("nextn on gpu:", m.nextn_on_gpu, repr(m.nextn_refusal))
prompts = {
    "code": "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "prose": "Once upon a time, in a small village by the sea,",
    "math": "Question: what is 17 * 23? Answer step by step.\n",
    "chat": None,
}
variants = {"serial": dict(draft=False), "adaptive": {}, "depth2": dict(draft_depth=2),
            "depth3": dict(draft_depth=3)}
for name, p in prompts.items():
    kw = dict(max_tokens=128, temperature=0)
    if p is None:
        p = [{"role": "user", "content": "Write a short poem about the sea."}]
    else:
        kw["chat"] = False
    ds4py.generate(m, p, **{**kw, "max_tokens": 8})  # warm-up
    tps = {v: [] for v in variants}
    toks, stats = {}, {}
    for r in range(reps):
        order = list(variants) if r % 2 == 0 else list(reversed(variants))
        for v in order:
            g = ds4py.generate(m, p, **kw, **variants[v])
            tps[v].append(g.generation_tps)
            toks[v], stats[v] = g.tokens, g.draft
    base = statistics.median(tps["serial"])
    for v in variants:
        t = sorted(tps[v])
        d = stats[v]
        print(f"GEN {name:5s} {v:8s} tok/s min/med/max {t[0]:7.1f} {statistics.median(t):7.1f} "
              f"{t[-1]:7.1f}  x{statistics.median(t) / base:.2f}  tokens_equal={toks[v] == toks['serial']} "
              f"n={len(toks[v])} rounds={d.get('draft_rounds')} drafted={d.get('drafted')} "
              f"accepted={d.get('accepted')} refused={d.get('refused')!r}", flush=True)
    pol = stats["adaptive"].get("policy", {})
    costs = {k: (round(v * 1e3, 3) if isinstance(v, float) else v)
             for k, v in pol.get("costs", {}).items() if k != "verify_s_per_width"}
    print(f"POLICY {name:5s} p={pol.get('p')} observations={pol.get('observations')} "
          f"chosen_drafting_rounds={pol.get('chosen_drafting_rounds')} costs_ms={costs}", flush=True)
PY
step "python: a draft_head sidecar drafts as the bundled head"
timeout 60 python3 -m gguf_tools extract-mtp $DEMO "$OUT/demo-mtp.gguf" || echo "EXTRACT FAILED"
HEAD="$OUT/demo-mtp.gguf" timeout 300 python3 - <<'PY' || echo "SIDECAR PART FAILED rc=$?"
import os, warnings
import ds4py
from ds4py.spec.drafter import NextnDrafter

demo = "ds4py/models/demo-q8_0.gguf"
bundled = ds4py.load(demo, backend="cuda")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # "bundles its own nextn head; the draft_head replaces it"
    side = ds4py.load(demo, backend="cuda", draft_head=os.environ["HEAD"])
print("sidecar:", side.nextn_source, side.nextn_on_gpu, repr(side.nextn_refusal))
prompts = ["def fibonacci(n):\n", "Once upon a time, in a small village by the sea,",
           "Question: what is 17 * 23? Answer step by step.\n",
           [{"role": "user", "content": "Write a short poem about the sea."}]]
for i, p in enumerate(prompts):
    kw = dict(max_tokens=64, temperature=0)
    if isinstance(p, str):
        kw["chat"] = False
    for depth in (2, 3):
        a = ds4py.generate(bundled, p, draft_depth=depth, drafter=NextnDrafter(bundled), **kw)
        b = ds4py.generate(side, p, draft_depth=depth, drafter=NextnDrafter(side), **kw)
        ka = [a.draft.get(k) for k in ("draft_rounds", "drafted", "accepted")]
        kb = [b.draft.get(k) for k in ("draft_rounds", "drafted", "accepted")]
        print(f"SIDECAR prompt={i} depth={depth} same={a.tokens == b.tokens and ka == kb} "
              f"bundled={ka} sidecar={kb} drafter={b.draft.get('drafter')}", flush=True)
PY
step "python: DFlash with a cuda target"
REPS="$REPS" timeout 300 python3 - <<'PY' || echo "DFLASH PART FAILED rc=$?"
import os, statistics
import ds4py
from ds4py.dflash import DFlashDrafter

demo, dfl = "ds4py/models/demo-q8_0.gguf", "ds4py/models/demo-dflash-q8_0.gguf"
reps = int(os.environ["REPS"])
m = ds4py.load(demo, backend="cuda", dflash=dfl)
cpu = ds4py.load(demo, n_threads=4, dflash=dfl)
print("dflash on", m.backend, m.dflash)
prompts = {"code": "def fibonacci(n):\n", "prose": "Once upon a time, in a small village by the sea,",
           "chat": [{"role": "user", "content": "Write a short poem about the sea."}]}
for name, p in prompts.items():
    kw = dict(max_tokens=96, temperature=0)
    if isinstance(p, str):
        kw["chat"] = False
    ds4py.generate(m, p, **{**kw, "max_tokens": 8})  # warm-up
    modes = ["serial", 2, 4, 7]
    tps = {v: [] for v in modes}
    res = {}
    for r in range(reps):
        for v in (modes if r % 2 == 0 else modes[::-1]):
            g = (ds4py.generate(m, p, draft=False, **kw) if v == "serial" else
                 ds4py.generate(m, p, draft_depth=v, drafter=DFlashDrafter(m.dflash), **kw))
            tps[v].append(g.generation_tps)
            res[v] = g
    base = statistics.median(tps["serial"])
    for v in modes[1:]:
        g = res[v]
        c = ds4py.generate(cpu, p, draft_depth=v, drafter=DFlashDrafter(cpu.dflash), **kw)
        print(f"DFLASH {name:5s} depth={v} tokens_equal={g.tokens == res['serial'].tokens} "
              f"tok/s med {statistics.median(tps[v]):7.1f} x{statistics.median(tps[v]) / base:.2f} "
              f"(serial {base:7.1f}) drafted={g.draft.get('drafted')} accepted={g.draft.get('accepted')} "
              f"cpu_target: drafted={c.draft.get('drafted')} accepted={c.draft.get('accepted')} "
              f"same_tokens={c.tokens == g.tokens}", flush=True)
PY
step "python: rejection sampling on cuda"
REPS="$REPS" timeout 200 python3 - <<'PY' || echo "REJECT PART FAILED rc=$?"
import os, statistics
import ds4py

reps = int(os.environ["REPS"])
m = ds4py.load("ds4py/models/demo-q8_0.gguf", backend="cuda")
p = "def fibonacci(n):\n"
kw = dict(max_tokens=96, temperature=0.7, seed=5, chat=False)
modes = {"plain": dict(draft=False), "exact": dict(draft_depth=2),
         "rejection": dict(draft_depth=2, spec_sampling="rejection")}
tps = {k: [] for k in modes}
out = {}
for r in range(reps + 1):
    for k in (list(modes) if r % 2 == 0 else list(modes)[::-1]):
        g = ds4py.generate(m, p, **kw, **modes[k])
        if r:
            tps[k].append(g.generation_tps)
        out.setdefault(k, []).append(g)
base = statistics.median(tps["plain"])
for k in modes:
    gs = out[k]
    d = gs[-1].draft
    print(f"REJECT {k:9s} same_seed_same_tokens={all(g.tokens == gs[0].tokens for g in gs)} "
          f"equal_to_plain={gs[0].tokens == out['plain'][0].tokens} tok/s med {statistics.median(tps[k]):7.1f} "
          f"x{statistics.median(tps[k]) / base:.2f} drafted={d.get('drafted')} accepted={d.get('accepted')}",
          flush=True)
PY
}
main 2>&1 | tee "$LOG"
