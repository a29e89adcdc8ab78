# ds4py developer tasks. `make dev` once, then `make build` after C changes.
PY ?= python
PYTEST ?= $(PY) -m pytest
# Serialise concurrent rebuilds of the one shared extension module.
LOCK = flock /tmp/ds4py-build.lock
# Kernel tests re-run with the SIMD paths disabled (DS4_FORCE_SCALAR=1).
KERNEL_TESTS = tests/test_quants_scalar.py tests/test_quants_llamacpp.py tests/test_gguf_reader.py

.PHONY: dev build build-fast test test-python test-scalar test-neon test-neon-run test-reference bench bench-spec fuzz lint clean
.PHONY: test-gpu-emul gpu-emul-bin gpu-model-bin cuda cuda-test cuda-bench cuda-model bench-gpu

dev:
	$(PY) -m pip install -e '.[test]'

# Rebuild ds4py/_ds4core*.so in place after editing csrc/. Goes through pip
# (PEP 517 build isolation) so it works with whatever setuptools the
# environment has; `make build-fast` reuses the environment's own setuptools.
build:
	$(LOCK) $(PY) -m pip install -q --no-deps -e .

build-fast:
	$(LOCK) $(PY) setup.py -q build_ext --inplace

# What CI runs (through the README's test command).
test: build test-python test-scalar test-neon test-gpu-emul

test-python:
	$(PYTEST) -q

test-scalar:
	DS4_FORCE_SCALAR=1 $(PYTEST) -q $(KERNEL_TESTS)

# The arm64 NEON(+dotprod) kernels against the scalar reference, cross-built
# and run under qemu-user (Debian packages gcc-aarch64-linux-gnu,
# libc6-dev-arm64-cross, qemu-user). Flags mirror build_core.py's arm64 build:
# only neon.c gets -march. On an arm64 host: make test-neon NEON_CC=gcc NEON_RUN=
NEON_CC ?= aarch64-linux-gnu-gcc
NEON_RUN ?= qemu-aarch64 -cpu max
NEON_OUT = tests/neon/out
NEON_CFLAGS = -std=c11 -O2 -ffp-contract=off -Wall -Wextra -Wno-unused-parameter -D_GNU_SOURCE -Icsrc
NEON_SRCS = tests/neon/test_kernels.c csrc/error.c csrc/cpu.c csrc/quants/traits.c \
	csrc/quants/scalar.c csrc/quants/dispatch.c csrc/quants/kernels_api.c \
	csrc/quants/avx2.c csrc/quants/avx512.c

test-neon:
	@if ! command -v $(firstword $(NEON_CC)) >/dev/null || \
	    { [ -n "$(NEON_RUN)" ] && ! command -v $(firstword $(NEON_RUN)) >/dev/null; }; then \
		if [ "$$CI" = "true" ]; then echo "test-neon: cross tools missing under CI"; exit 1; fi; \
		echo "test-neon: NOT RUN (install gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)"; \
	else $(MAKE) --no-print-directory test-neon-run; fi

test-neon-run:
	mkdir -p $(NEON_OUT)
	$(NEON_CC) $(NEON_CFLAGS) -march=armv8.2-a+dotprod+fp16 -c csrc/quants/neon.c -o $(NEON_OUT)/neon.o
	$(NEON_CC) $(NEON_CFLAGS) -static $(NEON_SRCS) $(NEON_OUT)/neon.o -lpthread -lm -o $(NEON_OUT)/test_kernels
	$(NEON_RUN) $(NEON_OUT)/test_kernels > $(NEON_OUT)/test_kernels.log; rc=$$?; \
		grep -v '^PASS' $(NEON_OUT)/test_kernels.log; exit $$rc

# The shared GPU kernels (gpu/kernels/) compiled as C and run under the
# threadgroup emulator (gpu/emul/) against the CPU reference (docs/gpu.md).
# gpu-emul-bin builds the harness; GPU_EMUL_DEFS plants faults
# (tests/test_gpu_emul.py builds its variants through this target).
GPU_EMUL_CC ?= cc
GPU_EMUL_BIN ?= build/gpu-emul/test_gpu_emul
GPU_EMUL_DEFS ?=
GPU_EMUL_CFLAGS = -std=c11 -O1 -ffp-contract=off -Wall -Wextra -Wno-unused-parameter -D_GNU_SOURCE -Icsrc
GPU_EMUL_SRCS = gpu/tests/test_gpu_emul.c gpu/emul/emul.c gpu/emul/kernels_emul.c gpu/host/bind.c \
	csrc/forward/norm.c csrc/quants/scalar.c csrc/quants/traits.c csrc/error.c

gpu-emul-bin:
	mkdir -p $(dir $(GPU_EMUL_BIN))
	$(GPU_EMUL_CC) $(GPU_EMUL_CFLAGS) $(GPU_EMUL_DEFS) $(GPU_EMUL_SRCS) -lm -o $(GPU_EMUL_BIN)

test-gpu-emul: gpu-emul-bin
	$(GPU_EMUL_BIN) > build/gpu-emul/test_gpu_emul.log; rc=$$?; \
		grep -v '^PASS' build/gpu-emul/test_gpu_emul.log; exit $$rc

# A whole dense model through the GPU layer loop (gpu/host/runner.c) with
# the core: on the emulator (tests/test_gpu_model.py builds it) or on CUDA
# (cuda-model: run it on the GPU machine, docs/gpu.md section 7).
GPU_MODEL_DIR ?= build/gpu-model-emul
GPU_MODEL_DEFS ?=
gpu-model-bin:
	GPU_MODEL_DEFS="$(GPU_MODEL_DEFS)" $(PY) gpu/tools/build_model_test.py emul $(GPU_MODEL_DIR) > /dev/null

cuda-model:
	$(PY) gpu/tools/build_model_test.py cuda build/gpu-model-cuda > /dev/null

# On the GPU machine: build, correctness outputs, speculative == serial,
# memcheck, the bench models' decode/prefill and a per-kernel profile
# (GGUF_PY: a directory holding gguf-py when it is not installed there).
bench-gpu:
	bash gpu/tools/device_model.sh $(GGUF_PY)

# The CUDA backend's kernels and host (needs nvcc; built and run on the GPU
# machine, see docs/gpu.md). CUDA_ARCH: sm_90 is the H200.
NVCC ?= nvcc
CUDA_ARCH ?= sm_90
CUDA_FLAGS = -std=c++17 -O3 -arch=$(CUDA_ARCH) --fmad=false -Xcompiler -fPIC -Icsrc
cuda:
	mkdir -p build/cuda
	$(NVCC) $(CUDA_FLAGS) -c cuda/kernels.cu -o build/cuda/kernels.o
	$(NVCC) $(CUDA_FLAGS) -c cuda/host.cu -o build/cuda/host.o
	$(CC) -std=c11 -O2 -fPIC -c gpu/host/bind.c -o build/cuda/bind.o
	$(NVCC) $(CUDA_FLAGS) -shared build/cuda/kernels.o build/cuda/host.o build/cuda/bind.o -o build/cuda/libds4cuda.so

# The emulator's harness run on the GPU: the same checks, CUDA launches.
cuda-test: cuda
	$(CC) $(GPU_EMUL_CFLAGS) $(GPU_EMUL_DEFS) -DK_TEST_CUDA -c gpu/tests/test_gpu_emul.c -o build/cuda/test_gpu_emul.o
	$(CC) $(GPU_EMUL_CFLAGS) -c csrc/forward/norm.c -o build/cuda/norm.o
	$(CC) $(GPU_EMUL_CFLAGS) -c csrc/quants/scalar.c -o build/cuda/scalar.o
	$(CC) $(GPU_EMUL_CFLAGS) -c csrc/quants/traits.c -o build/cuda/traits.o
	$(CC) $(GPU_EMUL_CFLAGS) -c csrc/error.c -o build/cuda/error.o
	$(NVCC) $(CUDA_FLAGS) build/cuda/test_gpu_emul.o build/cuda/norm.o build/cuda/scalar.o \
		build/cuda/traits.o build/cuda/error.o build/cuda/kernels.o build/cuda/host.o build/cuda/bind.o \
		-o build/cuda/test_gpu_cuda

# The matvec microbenchmark (GB/s of weights read; gpu/tools/device_check.sh) and the
# streaming read bandwidth probe (cuda/bench_bw.cu).
cuda-bench: cuda
	$(NVCC) $(CUDA_FLAGS) cuda/bench_matvec.cu build/cuda/kernels.o build/cuda/host.o build/cuda/bind.o \
		-o build/cuda/bench_matvec
	$(NVCC) $(CUDA_FLAGS) cuda/bench_bw.cu -o build/cuda/bench_bw

lint:
	ruff check ds4py tests bench build_core.py setup.py
	$(LOCK) env CFLAGS="-Werror" $(PY) setup.py -q build_ext --inplace --force

bench: build
	$(PY) bench/bench_kernels.py
	$(PY) bench/bench_rows.py
	$(PY) bench/bench_sampling.py
	$(PY) bench/bench_generate.py
	$(PY) bench/bench_cpu.py

# ds4py vs llama.cpp (llama-cpp-python, matplotlib: pip install -e '.[bench]')
# on a small bench model; a few minutes. Results in bench/results/.
.PHONY: bench-quick
bench-quick: build
	$(PY) bench/bench_cpu.py --quick

bench-spec: build
	$(PY) bench/spec_replay.py
	$(PY) bench/bench_spec.py

# Bounded load test of ds4py-server on loopback (stops by itself).
.PHONY: bench-server
bench-server: build
	$(PY) bench/bench_server.py

# Fuzz the GGUF reader with libFuzzer (clang): build fuzz/out/fuzz_gguf from
# the reader's sources with ASan+UBSan, seed it from fuzz/make_corpus.py and
# run FUZZ_SECONDS (findings land in fuzz/out/ as crash-*/timeout-*).
FUZZ_CC ?= clang
FUZZ_SECONDS ?= 60
FUZZ_FLAGS = -std=c11 -g -O1 -D_GNU_SOURCE -Icsrc -fsanitize=fuzzer,address,undefined \
	-fno-sanitize-recover=all
FUZZ_SRCS = fuzz/fuzz_gguf.c csrc/gguf.c csrc/error.c csrc/quants/traits.c

fuzz/out/fuzz_gguf: $(FUZZ_SRCS) csrc/ds4.h csrc/error.h csrc/quants/quants.h
	mkdir -p fuzz/out
	$(FUZZ_CC) $(FUZZ_FLAGS) $(FUZZ_SRCS) -o $@

fuzz: fuzz/out/fuzz_gguf
	mkdir -p fuzz/out/corpus fuzz/out/seeds
	$(PY) fuzz/make_corpus.py fuzz/out/seeds
	cd fuzz/out && ./fuzz_gguf -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
		-dict=../gguf.dict -max_len=4096 corpus seeds > fuzz.log 2>&1; rc=$$?; \
		grep -E '^(Done|SUMMARY)|ERROR' fuzz.log; grep -E 'stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' fuzz.log; \
		echo "fuzz exit status $$rc (log: fuzz/out/fuzz.log)"; exit $$rc

# Opt-in: ds4py's kernels against llama.cpp's ggml, live, on fresh hypothesis
# inputs (needs llama-cpp-python built as tests/golden/quants/README.md says).
.PHONY: golden-quants
test-reference: build
	DS4_REFERENCE=1 $(PYTEST) -q -m reference tests/reference

# Regenerate the committed llama.cpp fixtures in tests/golden/quants/.
golden-quants:
	$(PY) tests/reference/make_quant_fixtures.py

# Regenerate the forward-pass reference set (tests/golden/models/ and
# tests/golden/logits/): needs torch 2.13.0 (CPU), transformers 5.24 and
# llama-cpp-python 0.3.36 (see tests/golden/README.md, "models and logits").
# GOLDEN_ARGS="--stage logits" keeps the GGUFs; "--llama-src DIR" names the
# llama.cpp sources (else $$DS4_LLAMA_CPP_SRC, else the sdist is downloaded).
.PHONY: golden
golden:
	$(PY) tests/reference/make_golden.py $(GOLDEN_ARGS)

clean:
	rm -rf build dist *.egg-info ds4py/_ds4core*.so ds4py/_ds4core.c fuzz/out tests/neon/out
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
