#!/usr/bin/env bash
# device_router_sweep.sh — the MoE router's split on the H200 (moe_logits:
# SIMD-groups per router row, K_RUNNER_MOE_SPLIT; gpu/kernels/moe.h), in one
# command from the repository root:
#
#   bash gpu/tools/device_router_sweep.sh
#
#  1. expands the moe35b recipe (gpu/bench/moe35b-q4_k_m.json) to
#     /tmp/ds4py-gpu/ in the background (gguf-py: training/carry/gguf_py
#     when it is not installed), unless it is there already;
#  2. meanwhile runs device_check.sh (every kernel suite on the GPU, the
#     router at splits 1, 2, 3, 8 and 32 among them, and the sanitizers);
#  3. builds test_gpu_model for CUDA and profiles a decode step at context
#     128 (K_CUDA_PROFILE=1, 16 steps) for each split in $SPLITS.
#
# Output: stdout and $OUT (default build/router_sweep).
set -u
cd "$(dirname "$0")/../.."
OUT="${OUT:-build/router_sweep}"
mkdir -p "$OUT" /tmp/ds4py-gpu
M=/tmp/ds4py-gpu/moe35b-q4_k_m.gguf
T0=$(date +%s)
(
  [ -f "$M" ] || PYTHONPATH="${GGUF_PY:-training/carry/gguf_py}" timeout "${EXPAND_TIMEOUT:-400}" \
    python3 gpu/tools/gpu_bench_models.py expand gpu/bench/moe35b-q4_k_m.json "$M"
) > "$OUT/expand.log" 2>&1 &
EXP=$!
OUT="$OUT/check" timeout 330 bash gpu/tools/device_check.sh > "$OUT/check.log" 2>&1
echo "device_check rc=$? ($(( $(date +%s) - T0 )) s)"
grep -E "STEP FAILED|passed, .* failed|ALL STEPS" "$OUT/check.log" | tail -6
timeout 240 python3 gpu/tools/build_model_test.py cuda build/gpu-model-cuda > "$OUT/build.log" 2>&1 || echo "BUILD FAILED"
wait "$EXP"
echo "expand rc=$? ($(( $(date +%s) - T0 )) s)"
tail -2 "$OUT/expand.log"
for S in ${SPLITS:-1 4 8 16}; do
  K_RUNNER_MOE_SPLIT=$S K_CUDA_PROFILE=1 timeout 150 build/gpu-model-cuda/test_gpu_model --bench "$M" 128 16 \
    > "$OUT/prof-$S.log" 2>&1
  echo "split $S ($(( $(date +%s) - T0 )) s):"
  grep -E "^BENCH|moe_logits" "$OUT/prof-$S.log" | head -4
done
