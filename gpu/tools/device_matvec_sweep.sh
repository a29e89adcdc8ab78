#!/usr/bin/env bash
# device_matvec_sweep.sh — the decode matvecs' speed knobs on the CUDA
# machine (H200), one build per setting, each checked for bits first:
#
#   bash gpu/tools/device_matvec_sweep.sh              (from the repository root)
#   bash gpu/tools/device_matvec_sweep.sh "CFG" ...    (these -D sets instead)
#
# For every setting (the current defaults first): build the kernels, the
# CUDA harness and bench_matvec with the setting's -Ds (make cuda-bench
# cuda-test NVCC="nvcc CFG" GPU_EMUL_DEFS="CFG": the harness's host code
# computes its grids with the same K_KQ1_RPS as the kernels), run the
# harness (every suite, against the CPU references: it must end "N passed,
# 0 failed"; width 1 is checked bit for bit against widths 2..16 and the
# prefill GEMMs, so a setting that changed a result bit fails here), then
# time widths 1 and 4 of Q4_K, Q6_K and Q8_0 at 5120x17408, 17408x5120 and
# 5120x6144 and print one summary line per setting: width-1 and width-4
# microseconds and % of 4300 GB/s per (type, shape). Ends by rebuilding the
# defaults. Knobs (gpu/kernels/quant_kq.h, quant_q8_0.h; the bits never
# depend on them):
#   K_KQ1_RPO / K_KQ1_RPS  width-1 K-quant rows per SIMD-group sharing each
#                          activation read (1: the generic kernel; 2 or 4:
#                          k_matvec_kq1_shared; the two must be equal)
#   K_KQ1_STEP             super-blocks per octet (and row) per loop step
#   K_KQ1_TGS              resident threadgroups per SM (CUDA register cap:
#                          65536 / (128 TGS) registers a thread)
#   K_KQ_AHEAD             super-blocks of L2 prefetch ahead (all K-quant widths)
#   K_KQ_STREAM            1: the shared design's weight loads evict first
#                          (ld.global.cs), keeping the activations in L1
#   K_Q8_0_WSTEP           the Q8_0 matvec's 32-block windows whose weight
#                          loads are issued together
#   K_Q8_0_TGS             the Q8_0 matvec's resident threadgroups per SM
# The K-quant and Q8_0 knobs touch different kernels, so each build tries
# one setting of each.
# Log: $OUT/matvec_sweep.log when OUT is set (else build/matvec_sweep.log).
# Budget: about 40 s a setting on one H200 (build ~15 s, harness, bench);
# settings past ~6 minutes are skipped so the whole run stays under 7.
set -u
cd "$(dirname "$0")/../.."
LOGDIR="${OUT:-build}"
mkdir -p "$LOGDIR"
LOG="$LOGDIR/matvec_sweep.log"
JOBS=$(nproc 2>/dev/null || echo 4)
SHAPES="${SHAPES:-5120 17408 17408 5120 5120 6144}" # pairs n_in n_out (multiples of 256 in)

configs=("$@")
[ ${#configs[@]} -eq 0 ] && configs=(
  ""
  "-DK_KQ1_TGS=8 -DK_Q8_0_WSTEP=2u"
  "-DK_KQ1_TGS=6 -DK_Q8_0_TGS=12"
  "-DK_KQ1_TGS=8 -DK_Q8_0_WSTEP=4u"
  "-DK_KQ1_RPO=4 -DK_KQ1_RPS=4 -DK_KQ1_TGS=5"
  "-DK_KQ_AHEAD=16u -DK_KQ_STREAM=0"
)

main() {
  T0=$(date +%s)
  SUMMARY=()
  nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader 2>&1 | head -1
  for cfg in "${configs[@]}"; do
    el=$(($(date +%s) - T0))
    name="${cfg:-defaults}"
    if [ $el -gt 360 ]; then
      echo "=== [$name] SKIPPED (${el} s spent: time budget)"
      SUMMARY+=("[$name] SKIPPED (time budget)")
      continue
    fi
    echo; echo "=== [$name] (${el} s)"
    if ! timeout 150 make -s -j"$JOBS" cuda-bench cuda-test NVCC="nvcc $cfg" GPU_EMUL_DEFS="$cfg" >"$LOGDIR/build_sweep.tmp" 2>&1; then
      tail -20 "$LOGDIR/build_sweep.tmp"
      SUMMARY+=("[$name] BUILD FAILED")
      continue
    fi
    rm -f "$LOGDIR/build_sweep.tmp"
    timeout 120 ./build/cuda/test_gpu_cuda >"$LOGDIR/harness_sweep.tmp" 2>&1
    hrc=$?
    grep -v '^PASS' "$LOGDIR/harness_sweep.tmp" | tail -30
    hres=$(tail -1 "$LOGDIR/harness_sweep.tmp")
    rm -f "$LOGDIR/harness_sweep.tmp"
    if [ $hrc -ne 0 ]; then
      SUMMARY+=("[$name] HARNESS FAILED (rc $hrc: $hres): not timed")
      continue
    fi
    BENCH_TYPES=${BENCH_TYPES:-Q4_K,Q6_K,Q8_0} BENCH_WIDTHS=1,4 BENCH_MATVEC_ONLY=1 timeout 120 \
      ./build/cuda/bench_matvec $SHAPES >"$LOGDIR/bench_sweep.tmp" 2>&1
    brc=$?
    grep -E '^(SWEEP|FAIL)|SUMMARY|^Q[0-9]_' "$LOGDIR/bench_sweep.tmp"
    # one line: per (type, shape) "w1 us/% w4 us/%"
    line=$(awk '/^SWEEP/ { k = $2 " " $3; if (!(k in seen)) { seen[k] = 1; order[++n] = k }
                           v[k] = v[k] " " $4 " " $5 "us/" $7 }
                END { for (i = 1; i <= n; i++) printf "%s%s |", order[i], v[order[i]] }' "$LOGDIR/bench_sweep.tmp")
    rm -f "$LOGDIR/bench_sweep.tmp"
    [ $brc -eq 0 ] || line="BENCH FAILED (rc $brc) $line"
    SUMMARY+=("[$name] harness: $hres | $line")
  done
  echo; echo "=== rebuilding the defaults ($(($(date +%s) - T0)) s)"
  timeout 150 make -s -j"$JOBS" cuda cuda-test cuda-bench >/dev/null 2>&1 && echo "defaults rebuilt" || echo "DEFAULT REBUILD FAILED"
  echo; echo "SWEEP SUMMARY (width 1 / width 4: us per launch / % of 4300 GB/s; $(($(date +%s) - T0)) s in all)"
  for s in "${SUMMARY[@]}"; do echo "$s"; done
}

main 2>&1 | tee "$LOG"
