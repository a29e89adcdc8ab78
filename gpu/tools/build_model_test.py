"""Build gpu/tests/test_gpu_model.c: the GPU layer loop (gpu/host/runner.c)
linked with the C core, on the emulator (`emul`, gcc: CI) or on CUDA (`cuda`,
nvcc: the GPU machine).

The core's source lists and per-ISA flags come from build_core.py (the cffi
build), so this binary compiles exactly the files the Python extension does.

    python gpu/tools/build_model_test.py emul|cuda [OUT_DIR]
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)

try:
    import cffi  # noqa: F401
except ImportError:
    # The GPU machine has no cffi; build_core.py builds its FFI object at
    # import, but this script only reads its source lists and flags.
    import types

    class _NoFFI:
        def __getattr__(self, name):
            return lambda *a, **k: None

    sys.modules["cffi"] = types.SimpleNamespace(FFI=_NoFFI)

import build_core  # noqa: E402

GPU_C = ["gpu/host/runner.c", "gpu/host/runner_head.c", "gpu/host/bind.c",
         "gpu/tests/test_gpu_model.c"]
EMUL_C = ["gpu/emul/emul.c", "gpu/emul/kernels_emul.c", "gpu/emul/device_emul.c"]
CUDA_CU = ["cuda/kernels.cu", "cuda/host.cu", "cuda/device.cu"]


def run(cmd: list[str]) -> None:
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)


def main() -> int:
    target = sys.argv[1] if len(sys.argv) > 1 else "emul"
    # an absolute OUT_DIR stays absolute (os.path.join drops ROOT)
    out = os.path.join(ROOT, sys.argv[2] if len(sys.argv) > 2 else f"build/gpu-model-{target}")
    os.makedirs(out, exist_ok=True)
    cc = os.environ.get("CC", "cc")
    base = [f for f in build_core.BASE_CFLAGS if f != "-fvisibility=hidden"]
    base += ["-Icsrc", "-pthread"]
    if target == "cuda":
        base.append("-DK_TEST_CUDA")
    # planted faults for the tests (tests/test_gpu_model.py), e.g. -DPLANT_ACCEPT_NO_REPLAY
    base += os.environ.get("GPU_MODEL_DEFS", "").split()
    units: list[tuple[str, list[str]]] = [(s, []) for s in build_core.GENERIC_SOURCES]
    units += [(s, flags) for s, flags in build_core.SIMD_VARIANTS.get(build_core.machine(), [])]
    units += [("metal/metal_stub.c", [])] + [(s, []) for s in GPU_C]
    if target == "emul":
        units += [(s, []) for s in EMUL_C]
    objs = [os.path.join(out, src.replace("/", "_").replace(".c", ".o")) for src, _ in units]
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(lambda u: run([cc, *base, *u[0][1], "-c", u[0][0], "-o", u[1]]),
                      zip(units, objs, strict=True)))
    exe = os.path.join(out, "test_gpu_model")
    if target == "cuda":
        nvcc = os.environ.get("NVCC", "nvcc")
        arch = os.environ.get("CUDA_ARCH", "sm_90")
        cu_flags = ["-std=c++17", "-O3", f"-arch={arch}", "--fmad=false", "-Icsrc"]
        cu_objs = [os.path.join(out, src.replace("/", "_").replace(".cu", ".o")) for src in CUDA_CU]
        with ThreadPoolExecutor(len(CUDA_CU)) as pool:
            list(pool.map(lambda u: run([nvcc, *cu_flags, "-c", u[0], "-o", u[1]]),
                          zip(CUDA_CU, cu_objs, strict=True)))
        objs += cu_objs
        run([nvcc, f"-arch={arch}", *objs, "-lpthread", "-lm", "-o", exe])
    else:
        run([cc, *objs, "-pthread", "-lm", "-o", exe])
    print(exe)
    return 0


if __name__ == "__main__":
    sys.exit(main())
