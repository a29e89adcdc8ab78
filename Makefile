# ds4py developer tasks. `make dev` once, then `make build` after C changes.
PY ?= python
PYTEST ?= $(PY) -m pytest
# Serialise concurrent rebuilds of the one shared extension module.
LOCK = flock /tmp/ds4py-build.lock
# Kernel tests re-run with the SIMD paths disabled (DS4_FORCE_SCALAR=1).
KERNEL_TESTS = tests/test_quants_scalar.py tests/test_quants_llamacpp.py tests/test_gguf_reader.py

.PHONY: dev build test test-python test-scalar test-neon test-reference bench fuzz lint clean

dev:
	$(PY) -m pip install -e '.[test]'

# Fast in-place rebuild of ds4py/_ds4core*.so after editing csrc/.
build:
	$(LOCK) $(PY) setup.py -q build_ext --inplace

# What CI runs (through the README's test command).
test: build test-python test-scalar test-neon

test-python:
	$(PYTEST) -q

test-scalar:
	DS4_FORCE_SCALAR=1 $(PYTEST) -q $(KERNEL_TESTS)

lint:
	ruff check ds4py tests bench build_core.py setup.py
	$(LOCK) env CFLAGS="-Werror" $(PY) setup.py -q build_ext --inplace --force

bench: build
	$(PY) bench/bench_kernels.py

clean:
	rm -rf build dist *.egg-info ds4py/_ds4core*.so ds4py/_ds4core.c fuzz/out tests/neon/out
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
