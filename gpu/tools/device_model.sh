#!/usr/bin/env bash
# device_model.sh — the dense layer loop (gpu/host/runner.c) on the CUDA
# machine, in one command (docs/gpu.md §7):
#
#   bash gpu/tools/device_model.sh [GGUF_PY_DIR]     (from the repository root)
#
#  1. builds build/gpu-model-cuda/test_gpu_model (make cuda-model);
#  2. correctness: the golden dense-q8_0 model on the 100-token golden
#     sequence and the demo model on 12 tokens — logits of every row from one
#     eval and from one eval per row, plus greedy tokens — written under
#     $OUT/model_outputs.tar, compared on the development machine with the
#     CPU and llama.cpp (the same checks as tests/test_gpu_model.py);
#     greedy speculative decoding == serial decoding, logits bit for bit
#     (test_gpu_model --spec) on those and on the 0.8B bench shape;
#     compute-sanitizer memcheck over a 16-token run;
#  3. bench: expands the bench-model recipes in gpu/bench/ (numpy + gguf-py,
#     GGUF_PY_DIR on PYTHONPATH when gguf-py is not installed) and times
#     decode at several contexts (argmax on the device, one eval per token)
#     and prefill; also the 0.8B shape's first 4 rows of logits for a CPU
#     cross-check (same recipe expanded here: the sha256 is printed);
#  4. a per-kernel GPU-time profile of decode (K_CUDA_PROFILE=1).
# Prefill GEMM: the default is the staged int8 tensor-core GEMMs (gemm_mma.h,
# = K_RUNNER_GEMM=mma); step 2 compares its outputs with K_RUNNER_GEMM=dp4a
# (gemm.h), =kq (tensor cores for K-quants only) and =0 (matvecs) bit for
# bit, step 3 times the prefill with dp4a beside it.
# The routed MoE (golden moe-q8_0 correctness, the moe35b bench recipe: 21 GB
# expanded, so give it time, or run it alone with
# RECIPES=gpu/bench/moe35b-q4_k_m.json) runs in steps 2-4 too.
set -u
cd "$(dirname "$0")/../.."
OUT="${OUT:-build/device_model}"
mkdir -p "$OUT"
LOG="$OUT/device_model.log"
export PYTHONPATH="${1:-}${PYTHONPATH:+:$PYTHONPATH}"
PYBIN="$(command -v python3 || command -v python)"
W=/tmp/ds4py-gpu
mkdir -p "$W"
BIN=${BIN:-build/gpu-model-cuda/test_gpu_model}

step() { echo "=== $* ($(date +%T))"; }
main() {
step build
make -s cuda-model PY="$PYBIN" || { echo "BUILD FAILED"; return 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader

step correctness
"$PYBIN" - <<'PY'
import numpy as np
s = np.load("tests/golden/logits/sequences.npz")
s["s100"].astype(np.int32).tofile("/tmp/ds4py-gpu/s100.i32")
s["s16"].astype(np.int32).tofile("/tmp/ds4py-gpu/s16.i32")
PY
timeout 120 $BIN tests/golden/models/dense-q8_0.gguf $W/s100.i32 $W/golden 16
[ -f gpu/bench/demo_tokens.i32 ] && timeout 120 $BIN ds4py/models/demo-q8_0.gguf gpu/bench/demo_tokens.i32 $W/demo 8
step "speculative == serial (verify/accept, bit for bit)"
timeout 120 $BIN --spec tests/golden/models/dense-q8_0.gguf $W/s16.i32 64
timeout 120 $BIN --spec ds4py/models/demo-q8_0.gguf gpu/bench/demo_tokens.i32 64
step "routed MoE (gpu/kernels/moe.h): the golden qwen35moe model, speculative == serial, unfused == fused"
timeout 120 $BIN tests/golden/models/moe-q8_0.gguf $W/s16.i32 $W/moe 8
timeout 120 $BIN --spec tests/golden/models/moe-q8_0.gguf $W/s16.i32 64
K_RUNNER_FUSE=0 timeout 120 $BIN tests/golden/models/moe-q8_0.gguf $W/s16.i32 $W/moe_u 8
for f in prefill.f32 decode.f32 greedy.i32; do cmp -s $W/moe.$f $W/moe_u.$f && echo "UNFUSED SAME moe.$f" || echo "UNFUSED DIFFERS moe.$f"; done
timeout 150 compute-sanitizer --tool memcheck --print-limit 20 $BIN tests/golden/models/moe-q8_0.gguf $W/s16.i32 $W/mcm 4 2>&1 | tail -3
step "unfused glue kernels (K_RUNNER_FUSE=0): the same outputs bit for bit"
K_RUNNER_FUSE=0 timeout 120 $BIN tests/golden/models/dense-q8_0.gguf $W/s100.i32 $W/golden_u 16
for f in prefill.f32 decode.f32 greedy.i32; do cmp -s $W/golden.$f $W/golden_u.$f && echo "UNFUSED SAME golden.$f" || echo "UNFUSED DIFFERS golden.$f"; done
step "CUDA graphs (K_CUDA_GRAPH=1): the same outputs bit for bit, speculative == serial"
K_CUDA_GRAPH=1 timeout 120 $BIN tests/golden/models/dense-q8_0.gguf $W/s100.i32 $W/golden_g 16
for f in prefill.f32 decode.f32 greedy.i32; do cmp -s $W/golden.$f $W/golden_g.$f && echo "GRAPH SAME golden.$f" || echo "GRAPH DIFFERS golden.$f"; done
K_CUDA_GRAPH=1 timeout 120 $BIN --spec tests/golden/models/dense-q8_0.gguf $W/s16.i32 64
K_CUDA_GRAPH=1 timeout 120 $BIN --spec ds4py/models/demo-q8_0.gguf gpu/bench/demo_tokens.i32 64
step memcheck
timeout 150 compute-sanitizer --tool memcheck --print-limit 20 $BIN tests/golden/models/dense-q8_0.gguf $W/s16.i32 $W/mc 4 2>&1 | tail -5
step "prefill GEMM A/B (mma default / K_RUNNER_GEMM=dp4a / kq / 0 matvecs): the same outputs bit for bit"
# the golden model's 100 rows go as chunks of 64 + 36 through the Q8_0 GEMM;
# prefill.f32 (one eval of all rows) must also equal decode.f32 (one eval per
# row: the matvecs) -- batch invariance across the GEMM and the matvecs
for g in dp4a kq 0; do
  K_RUNNER_GEMM=$g timeout 120 $BIN tests/golden/models/dense-q8_0.gguf $W/s100.i32 $W/golden_$g 16
  for f in prefill.f32 decode.f32 greedy.i32; do cmp -s $W/golden.$f $W/golden_$g.$f && echo "GEMM=$g SAME golden.$f" || echo "GEMM=$g DIFFERS golden.$f"; done
done
cmp -s $W/golden.prefill.f32 $W/golden.decode.f32 && echo "PREFILL == DECODE golden" || echo "PREFILL != DECODE golden"
timeout 150 compute-sanitizer --tool memcheck --print-limit 20 $BIN tests/golden/models/dense-q8_0.gguf $W/s100.i32 $W/mcg 2 2>&1 | tail -3

step bench models
for r in ${RECIPES:-gpu/bench/*.json}; do
  n=$(basename "$r" .json)
  t0=$(date +%s)
  timeout ${EXPAND_TIMEOUT:-400} "$PYBIN" gpu/tools/gpu_bench_models.py expand "$r" "$W/$n.gguf" || { echo "EXPAND FAILED $n"; continue; }
  echo "expanded $n in $(( $(date +%s) - t0 )) s: $(ls -la $W/$n.gguf | awk '{print $5}') bytes sha256 $(sha256sum $W/$n.gguf | cut -c1-16)"
done
if [ -f "$W/dense08b-q4_k_m.gguf" ]; then
  "$PYBIN" -c "import numpy as np; np.array([11, 2222, 33333, 144444], dtype=np.int32).tofile('$W/b4.i32')"
  timeout 200 $BIN $W/dense08b-q4_k_m.gguf $W/b4.i32 $W/bench08 4
  timeout 120 $BIN --spec $W/dense08b-q4_k_m.gguf $W/b4.i32 64
  # K-quant (Q4_K + Q6_K) prefill through the GEMMs: 40 rows (> 16), mma vs
  # dp4a vs the matvecs, and prefill (GEMM) == decode (matvecs), bit for bit
  "$PYBIN" -c "import numpy as np; np.array([(37 * i + 11) % 1000 for i in range(40)], dtype=np.int32).tofile('$W/b40.i32')"
  for g in mma dp4a kq 0; do
    K_RUNNER_GEMM=$g timeout 300 $BIN $W/dense08b-q4_k_m.gguf $W/b40.i32 $W/kq40_$g 2
  done
  for g in dp4a kq 0; do cmp -s $W/kq40_mma.prefill.f32 $W/kq40_$g.prefill.f32 && echo "GEMM=$g SAME kq40.prefill.f32" || echo "GEMM=$g DIFFERS kq40.prefill.f32"; done
  cmp -s $W/kq40_mma.prefill.f32 $W/kq40_mma.decode.f32 && echo "MMA PREFILL == DECODE kq40" || echo "MMA PREFILL != DECODE kq40"
fi
(cd $W && tar cf - golden.* demo.* bench08.* moe.* 2>/dev/null) > "$OUT/model_outputs.tar"

step bench decode
[ -f "$W/dense08b-q4_k_m.gguf" ] && timeout 240 $BIN --bench $W/dense08b-q4_k_m.gguf 128,4096,32768 64
[ -f "$W/dense08b-q8_0.gguf" ] && timeout 120 $BIN --bench $W/dense08b-q8_0.gguf 128,4096 64
[ -f "$W/dense27b-q4_k_m.gguf" ] && timeout 240 $BIN --bench $W/dense27b-q4_k_m.gguf 128,4096 32
# the 35B-A3B-like MoE (routed experts: gpu/kernels/moe.h); llama.cpp's anchor
# on this H200: 249 / 245 / 213 tok/s decode at depth 0 / 4k / 32k (issue 19)
[ -f "$W/moe35b-q4_k_m.gguf" ] && timeout 300 $BIN --bench $W/moe35b-q4_k_m.gguf ${MOE_CTX:-128,4096} 32
[ -f "$W/moe35b-q4_k_m.gguf" ] && timeout 120 $BIN --spec $W/moe35b-q4_k_m.gguf $W/b4.i32 32
step "bench prefill A/B: the default tensor-core GEMMs against the dp4a GEMMs (K_RUNNER_GEMM=dp4a)"
for m in dense27b-q4_k_m dense08b-q8_0 dense08b-q4_k_m moe35b-q4_k_m; do
  [ -f "$W/$m.gguf" ] || continue
  timeout 240 $BIN --bench $W/$m.gguf 512,4096 4 | sed "s/^/$m default /"
  K_RUNNER_GEMM=dp4a timeout 240 $BIN --bench $W/$m.gguf 512,4096 4 | sed "s/^/$m dp4a /"
done
# GPU time per kernel over a 512-token prefill (the GEMM's share), then the same with dp4a
[ -f "$W/dense27b-q4_k_m.gguf" ] && K_CUDA_PROFILE=1 timeout 240 $BIN --bench $W/dense27b-q4_k_m.gguf 512 1 | grep "PROFILE ctx=512 prefill" | head -12
[ -f "$W/dense27b-q4_k_m.gguf" ] && K_RUNNER_GEMM=dp4a K_CUDA_PROFILE=1 timeout 240 $BIN --bench $W/dense27b-q4_k_m.gguf 512 1 | grep "PROFILE ctx=512 prefill" | head -12
if [ -z "${QUICK:-}" ]; then  # QUICK=1: the default build only (no unfused / graph A/B)
step "bench decode, unfused glue kernels (K_RUNNER_FUSE=0: the A/B of the fusion)"
[ -f "$W/dense08b-q4_k_m.gguf" ] && K_RUNNER_FUSE=0 timeout 240 $BIN --bench $W/dense08b-q4_k_m.gguf 128,4096 64
[ -f "$W/dense08b-q8_0.gguf" ] && K_RUNNER_FUSE=0 timeout 120 $BIN --bench $W/dense08b-q8_0.gguf 128 64
[ -f "$W/dense27b-q4_k_m.gguf" ] && K_RUNNER_FUSE=0 timeout 240 $BIN --bench $W/dense27b-q4_k_m.gguf 128 32
[ -f "$W/moe35b-q4_k_m.gguf" ] && K_RUNNER_FUSE=0 timeout 240 $BIN --bench $W/moe35b-q4_k_m.gguf 128 32
step "bench decode with CUDA graphs (K_CUDA_GRAPH=1)"
[ -f "$W/dense08b-q4_k_m.gguf" ] && K_CUDA_GRAPH=1 timeout 240 $BIN --bench $W/dense08b-q4_k_m.gguf 128,4096,32768 64
[ -f "$W/dense08b-q8_0.gguf" ] && K_CUDA_GRAPH=1 timeout 120 $BIN --bench $W/dense08b-q8_0.gguf 128,4096 64
[ -f "$W/dense27b-q4_k_m.gguf" ] && K_CUDA_GRAPH=1 timeout 240 $BIN --bench $W/dense27b-q4_k_m.gguf 128,4096 32
[ -f "$W/dense08b-q4_k_m.gguf" ] && K_CUDA_GRAPH=1 timeout 120 $BIN --spec $W/dense08b-q4_k_m.gguf $W/b4.i32 64
fi
step profile "(K_CUDA_PROFILE=1: GPU time per kernel, event pairs around each launch)"
[ -f "$W/dense08b-q4_k_m.gguf" ] && K_CUDA_PROFILE=1 timeout 120 $BIN --bench $W/dense08b-q4_k_m.gguf 128 32 | grep -v prefill
[ -f "$W/dense27b-q4_k_m.gguf" ] && K_CUDA_PROFILE=1 timeout 120 $BIN --bench $W/dense27b-q4_k_m.gguf 128 16 | grep -v prefill
[ -f "$W/moe35b-q4_k_m.gguf" ] && K_CUDA_PROFILE=1 timeout 120 $BIN --bench $W/moe35b-q4_k_m.gguf 128 16 | grep -v prefill
step done
}
main 2>&1 | tee "$LOG"
