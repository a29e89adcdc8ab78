#!/usr/bin/env bash
# device_check.sh — the GPU kernels' whole check on the CUDA machine (H200),
# in one command (docs/gpu.md, "What is tested where"):
#
#   bash gpu/tools/device_check.sh        (from the repository root)
#
#  1. builds the CUDA kernels, host, test harness and benchmark (make cuda
#     cuda-test cuda-bench; sm_90, --fmad=false);
#  2. scans the kernels' SASS for F2I.*F16 — the ptxas miscompile that
#     stored a half's value instead of its low byte (gpu/dialect/f16.h);
#  3. runs the harness (every suite of gpu/tests/test_gpu_emul.c, launched
#     on the GPU, against the same CPU references as under the emulator);
#  4. compute-sanitizer memcheck (all suites), racecheck and synccheck (the
#     suites whose kernels use threadgroup memory and barriers);
#     The mma suite (the int8 tensor-core GEMMs, gemm_mma.h) runs there
#     too: every value bit for bit the dp4a GEMM's and the matvec's, on the
#     real mma.sync fragment layout;
#  5. the matvec microbenchmark at a 27B-like shape (5120 x 17408): GB/s
#     of weights read against the H200's ~4300 GB/s; the GDN step and the
#     argmax / top-8 over a 248320 vocabulary in microseconds.
#
# Everything goes to stdout and to $OUT/device_check.log (OUT defaults to
# build/device_check). Exit status 0 only if every step passed. Designed to
# finish well under 4 minutes; each step has its own timeout.
set -u
cd "$(dirname "$0")/../.."
OUT="${OUT:-build/device_check}"
mkdir -p "$OUT"
LOG="$OUT/device_check.log"

main() {
T0=$(date +%s)
FAILED=()
step() { echo; echo "=== $* ($(($(date +%s) - T0)) s)"; }
fail() { FAILED+=("$1"); echo "STEP FAILED: $1"; }

step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 || fail "nvidia-smi"
nvcc --version | tail -2

step "build (make cuda cuda-test cuda-bench)"
JOBS=$(nproc 2>/dev/null || echo 4)
if ! timeout 180 make -s -j"$JOBS" cuda cuda-test cuda-bench; then
    fail "build"
    echo "nothing else can run without the build"
    echo; echo "SUMMARY: FAILED: ${FAILED[*]}"
    exit 1
fi

step "SASS scan for value-converting byte stores (F2I.*F16)"
if command -v cuobjdump >/dev/null; then
    cuobjdump --dump-sass build/cuda/kernels.o >"$OUT/kernels.sass" 2>&1
    echo "$(grep -c '^\s*/\*[0-9a-f]*\*/' "$OUT/kernels.sass") SASS instructions in build/cuda/kernels.o"
    if grep -n 'F2I[.A-Z0-9]*F16' "$OUT/kernels.sass"; then
        fail "sass-f2i-f16"
    else
        echo "PASS no F2I.*F16 in the kernels' SASS"
    fi
else
    echo "cuobjdump not found: scan skipped"
    fail "sass-scan-missing-cuobjdump"
fi

step "harness on the GPU (build/cuda/test_gpu_cuda, all suites)"
timeout 120 ./build/cuda/test_gpu_cuda >"$OUT/harness.log" 2>&1
rc=$?
cat "$OUT/harness.log"
[ $rc -eq 0 ] || fail "harness (rc $rc)"

# Sanitizers: memcheck over every suite; racecheck / synccheck over the
# suites whose kernels share threadgroup memory or wait at barriers.
BARRIER_SUITES="rmsnorm attn gdn argmax fused gdnseq gemm mma moe"  # the suites whose kernels use threadgroup memory and barriers (fused: norm_quant, qk_norm_rope; gdnseq: gdn_seq; gemm: the activation tile; mma: the staged slices and the per-thread tree slots; moe: moe_group, moe_gemm, moe_gemm_mma)
sanitize() {
    local tool=$1 limit=$2
    shift 2
    step "compute-sanitizer --tool $tool ($*)"
    # --report-api-errors no: the gdnseq and gemm suites launch threadgroups
    # past a kernel's __launch_bounds__ on purpose (refused at launch, checked
    # by the harness, test_gpu_emul.c REFUSED_AT_LAUNCH); the sanitizer would
    # count those refused launches as errors. Every other API call's status is
    # checked by the host code itself.
    timeout "$limit" compute-sanitizer --tool "$tool" --report-api-errors no --error-exitcode 3 \
        ./build/cuda/test_gpu_cuda "$@" \
        >"$OUT/sanitizer_$tool.log" 2>&1
    local rc=$?
    grep -v '^PASS' "$OUT/sanitizer_$tool.log" | tail -25
    echo "$(grep -c '^PASS' "$OUT/sanitizer_$tool.log") PASS lines under $tool"
    if [ $rc -eq 124 ]; then fail "$tool (timeout ${limit}s)"; elif [ $rc -ne 0 ]; then fail "$tool (rc $rc)"; fi
}
if command -v compute-sanitizer >/dev/null; then
    sanitize memcheck 180 tables rmsnorm quantize matvec rope attn kquant gdn argmax glue fused moe gdnseq gemm mma
    sanitize racecheck 150 $BARRIER_SUITES
    sanitize synccheck 90 $BARRIER_SUITES
else
    fail "compute-sanitizer missing"
fi

step "microbenchmark: matvec at 5120 x 17408 (a 27B-like FFN), GDN step, argmax"
timeout 60 ./build/cuda/bench_matvec 5120 17408 2>&1 | tee "$OUT/bench.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || fail "bench"
# PREFILL mma lines: the tensor-core GEMM's outputs at this shape against the
# dp4a GEMM's, bit for bit (random Q8_K rows with consistent bsums)
if grep -q "^PREFILL mma.*DIFFER" "$OUT/bench.log"; then fail "mma-vs-dp4a"; fi
grep -q "^PREFILL mma" "$OUT/bench.log" || fail "mma-bench-missing"

echo
echo "=== done in $(($(date +%s) - T0)) s; logs in $OUT"
if [ ${#FAILED[@]} -eq 0 ]; then
    echo "SUMMARY: ALL STEPS PASSED"
    return 0
fi
echo "SUMMARY: FAILED: ${FAILED[*]}"
return 1
}

main 2>&1 | tee "$LOG"
exit "${PIPESTATUS[0]}"
