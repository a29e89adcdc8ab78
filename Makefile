# ds4py developer tasks. `make dev` once, then `make build` after C changes.
PY ?= python3
PYTEST ?= $(PY) -m pytest
# Serialise concurrent rebuilds of the one shared extension module.
LOCK = flock /tmp/ds4py-build.lock

.PHONY: dev build test test-scalar test-reference test-neon bench fuzz lint clean golden

dev:
	$(PY) -m pip install -e '.[test]'

# Fast in-place rebuild of ds4py/_ds4core*.so after editing csrc/.
build:
	$(LOCK) $(PY) setup.py -q build_ext --inplace

test: build
	$(PYTEST) -q
	DS4_FORCE_SCALAR=1 $(PYTEST) -q tests -k "quant or kernel"

test-scalar: build
	DS4_FORCE_SCALAR=1 $(PYTEST) -q

clean:
	rm -rf build dist *.egg-info ds4py/_ds4core*.so ds4py/_ds4core.c fuzz/out
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
