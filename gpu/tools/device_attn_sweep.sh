#!/usr/bin/env bash
# device_attn_sweep.sh — the split-K decode attention's speed knobs on the
# CUDA machine (attn.h K_ATTN_KPOS, K_ATTN_VAHEAD; runner.c K_ATTN_TG): one
# cuda-model build per setting, then decode of the 0.8B Q8_0 bench shape at
# ctx 128 / 32768 and attn_partials' GPU time per launch at ctx 128 and 32768
# (K_CUDA_PROFILE=1). The bits never depend on these knobs (docs/gpu.md §4).
#
#   bash gpu/tools/device_attn_sweep.sh GGUF_PY_DIR ["KPOS VAHEAD TG" ...]
set -u
cd "$(dirname "$0")/../.."
W=/tmp/ds4py-gpu
mkdir -p "$W"
export PYTHONPATH="${1:-}${PYTHONPATH:+:$PYTHONPATH}"
shift
PYBIN="$(command -v python3 || command -v python)"
M=$W/dense08b-q8_0.gguf
[ -f "$M" ] || "$PYBIN" gpu/tools/gpu_bench_models.py expand gpu/bench/dense08b-q8_0.json "$M" >/dev/null || exit 1
BIN=build/gpu-model-cuda/test_gpu_model
configs=("$@")
[ ${#configs[@]} -eq 0 ] && configs=("2 8 256" "1 8 256" "4 8 256" "2 16 256" "4 32 256" "2 8 512" "4 16 512" "2 8 1024")
for c in "${configs[@]}"; do
  set -- $c
  defs="-DK_ATTN_KPOS=$1u -DK_ATTN_VAHEAD=$2u -DK_ATTN_TG=$3"
  echo "=== KPOS $1 VAHEAD $2 TG $3 ($(date +%T))"
  GPU_MODEL_DEFS="$defs" NVCC_APPEND_FLAGS="$defs" make -s cuda-model PY="$PYBIN" >/dev/null 2>&1 || { echo "BUILD FAILED"; continue; }
  timeout 120 $BIN --bench "$M" 128,32768 32 | grep '^BENCH'
  K_CUDA_PROFILE=1 timeout 120 $BIN --bench "$M" 128,32768 8 | grep 'decode kernel=attn_partials'
done
