#!/usr/bin/env bash
# device_side_by_side.sh — ours and llama.cpp's CUDA backend on the same bench
# files, interleaved (ours, llama.cpp, ours, llama.cpp), in one command on the
# H200 (issue 19's benchmark: side-by-side ratios, not figures from two runs).
#
#   bash gpu/tools/device_side_by_side.sh [MODEL.gguf ...]
#
# Needs: the bench files expanded by device_model.sh (default: every
# /tmp/ds4py-gpu/*.gguf made from gpu/bench/ recipes), build/gpu-model-cuda/
# test_gpu_model (make cuda-model) and llama-bench built by
# `device_llama.sh build`. Ours: test_gpu_model --bench (a fresh session per
# context: prefill of CTX random tokens, then STEPS timed decode steps, argmax
# on the device). llama.cpp: llama-bench, flash attention on, all layers on
# the GPU, CUDA graphs on (its default): tg128 at each depth, pp512/pp4096.
# Contexts past what our prefill reaches in reasonable time are left out for
# the big shapes (CTX_BIG). After each model, RATIO lines: ours ÷ llama.cpp
# per repetition (gpu/tools/side_by_side_ratios.py).
set -u
cd "$(dirname "$0")/../.."
W=/tmp/ds4py-gpu
BIN=${BIN:-build/gpu-model-cuda/test_gpu_model}
CTX_SMALL=${CTX_SMALL:-512,4096,32768}
CTX_BIG=${CTX_BIG:-512,4096}
REPS=${REPS:-2}
models=("$@")
if [ ${#models[@]} -eq 0 ]; then
  for r in gpu/bench/*.json; do
    f="$W/$(basename "$r" .json).gguf"
    [ -f "$f" ] && models+=("$f")
  done
fi
for f in "${models[@]}"; do
  sz=$(stat -c %s "$f")
  if [ "$sz" -gt 4000000000 ]; then ctx=$CTX_BIG; steps=32; else ctx=$CTX_SMALL; steps=64; fi
  echo "=== $(basename "$f") ($((sz / 1000000)) MB) ours ctx $ctx, llama.cpp depths 0,4096,32768 ($(date +%T))"
  lines=$(mktemp)
  for rep in $(seq 1 "$REPS"); do
    timeout 400 "$BIN" --bench "$f" "$ctx" "$steps" | grep '^BENCH' | sed "s/^/rep $rep ours: /" | tee -a "$lines"
    timeout 400 bash gpu/tools/device_llama.sh bench "$f" 0,4096,32768 512,4096 1 \
      | grep '^|' | sed "s/^/rep $rep llama.cpp: /" | tee -a "$lines"
  done
  # ours ÷ llama.cpp per repetition (decode at ctx C by tg128 at depth C, prefill by ppC)
  python3 gpu/tools/side_by_side_ratios.py "$lines"
  rm -f "$lines"
done
