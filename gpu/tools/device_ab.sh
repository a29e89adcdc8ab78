#!/usr/bin/env bash
# device_ab.sh — the working tree against an older build, side by side in one
# call on the CUDA machine: bit-identity of whole-model outputs, gdn_seq and
# GEMM microbenchmarks, and model prefill / decode, interleaved new / old.
#
# Here, first (the device gets the working tree, not the git history):
#   rm -rf .oldtree && mkdir .oldtree && git archive REV Makefile build_core.py \
#       csrc gpu cuda metal | tar -x -C .oldtree
#   grep -qx '/.oldtree/' .git/info/exclude || echo '/.oldtree/' >> .git/info/exclude
# then run `bash gpu/tools/device_ab.sh` there with carry [".oldtree",
# "training/carry/gguf_py"] (gguf-py for the bench recipes, docs/gpu.md §7;
# GGUF_PY=DIR names another folder holding the gguf package).
#
# Knobs: MODELS (bench recipes of gpu/bench/, default the 0.8B shapes and the
# 27B-like), REPS (2), CTX (512,4096), STEPS (32), CHECK=0 skips
# device_check.sh. Outputs "SAME"/"DIFFER" per file for the golden dense and
# demo models and, when dense08b-q8_0 is among MODELS, 300 tokens of that
# shape (head_dim 256; the kernels promise the old bits unless the change says
# not), then BENCH lines prefixed by model and build.
set -u
cd "$(dirname "$0")/../.."
OUT="${OUT:-build/device_ab}"; mkdir -p "$OUT"
W=/tmp/ds4py-gpu; mkdir -p $W
# GGUF_PY: a folder holding the gguf package (gguf-py), when python3 lacks it
export PYTHONPATH="${GGUF_PY:-$(pwd)/training/carry/gguf_py}${PYTHONPATH:+:$PYTHONPATH}"
MODELS=${MODELS:-dense08b-q4_k_m dense08b-q8_0 dense27b-q4_k_m}
[ -d .oldtree ] || { echo "no .oldtree (see the header)"; exit 2; }
if [ "${CHECK:-1}" != 0 ]; then
  (OUT=$OUT bash gpu/tools/device_check.sh > "$OUT/check.log" 2>&1; echo "check rc=$?"
   make -s cuda-model PY=python3 > "$OUT/new_build.log" 2>&1 || echo "NEW MODEL BUILD FAILED") &
else
  (make -s -j8 cuda cuda-bench > "$OUT/new_build.log" 2>&1 && make -s cuda-model PY=python3 >> "$OUT/new_build.log" 2>&1 ||
   echo "NEW BUILD FAILED") &
fi
(cd .oldtree && make -s -j8 cuda cuda-bench > "$OUT/old_build.log" 2>&1 &&
 make -s cuda-model PY=python3 >> "$OUT/old_build.log" 2>&1; echo "old build rc=$?")
for n in $MODELS; do
  [ -f "$W/$n.gguf" ] || timeout 300 python3 gpu/tools/gpu_bench_models.py expand "gpu/bench/$n.json" "$W/$n.gguf" >/dev/null ||
    echo "EXPAND FAILED $n"
done
wait
[ -f "$OUT/check.log" ] && grep -E "SUMMARY|STEP FAILED" "$OUT/check.log"
NEW=build/gpu-model-cuda/test_gpu_model OLD=.oldtree/build/gpu-model-cuda/test_gpu_model
python3 -c "
import numpy as np
np.load('tests/golden/logits/sequences.npz')['s100'].astype(np.int32).tofile('$W/s100.i32')"
for t in new old; do B=$NEW; [ $t = old ] && B=$OLD
  $B tests/golden/models/dense-q8_0.gguf $W/s100.i32 $W/g_$t 16 >/dev/null
  $B ds4py/models/demo-q8_0.gguf gpu/bench/demo_tokens.i32 $W/d_$t 8 >/dev/null
done
for f in prefill.f32 decode.f32 greedy.i32; do
  for m in g d; do cmp -s $W/${m}_new.$f $W/${m}_old.$f && echo "SAME $m $f" || echo "DIFFER $m $f"; done
done
# the real models' head_dim (256: attention's constant path; the golden and
# demo models have 16 and 64) and vocabulary: 300 random tokens (two KV
# blocks) of the 0.8B Q8_0 bench shape, when its file is there; ~300 MB a file
if [ -f "$W/dense08b-q8_0.gguf" ]; then
  python3 -c "
import numpy as np
np.random.default_rng(7).integers(0, 248320, 300).astype(np.int32).tofile('$W/t300.i32')"
  for t in new old; do B=$NEW; [ $t = old ] && B=$OLD
    timeout 120 $B $W/dense08b-q8_0.gguf $W/t300.i32 $W/b_$t 4 >/dev/null
  done
  for f in prefill.f32 decode.f32 last.f32 greedy.i32; do
    cmp -s $W/b_new.$f $W/b_old.$f && echo "SAME 08b $f" || echo "DIFFER 08b $f"
  done
  cmp -s $W/b_new.prefill.f32 $W/b_new.decode.f32 && echo "SAME 08b new prefill==decode" ||
    echo "DIFFER 08b new prefill/decode"
  rm -f $W/b_*.f32
fi
for t in new old; do B=build/cuda/bench_matvec; [ $t = old ] && B=.oldtree/build/cuda/bench_matvec
  timeout 60 $B 5120 17408 2>&1 | grep "^PREFILL" | sed "s/^/$t /"; done
for rep in $(seq 1 "${REPS:-2}"); do
  for m in $MODELS; do
    for t in new old; do B=$NEW; [ $t = old ] && B=$OLD
      timeout 200 $B --bench "$W/$m.gguf" "${CTX:-512,4096}" "${STEPS:-32}" | grep BENCH | sed "s/^/$m $t /"
    done
  done
done
