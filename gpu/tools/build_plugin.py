"""Build a GPU backend plugin (gpu/host/plugin.h): the layer loop
(gpu/host/runner.c) + one device + the C core, linked into one shared
library that ds4py opens with cffi's ABI mode (ds4py/gpu_backend.py).

    python gpu/tools/build_plugin.py emul|cuda [--cache DIR]   # prints the .so path

Kinds:
  emul  the threadgroup emulator (gpu/emul/): the same kernels as plain C,
        slowly, every access checked. A test/debug backend (CI runs it).
  cuda  cuda/*.cu with nvcc (an NVIDIA GPU's compute capability picks -arch).

ds4py calls this on first use (like torch's JIT extensions): the result is
cached under the user's cache directory, keyed by a hash of every source
file, the compiler's version and the flags, so an edited source or another
toolchain builds a new plugin and a stale one is never loaded. Builds are
atomic (a temporary name, then rename) and serialised by a lock file, so
two processes that start at once build it once.

The compile recipe is build_model_test.py's (the same objects the C test
driver links, minus the driver), with -fPIC and hidden visibility: the
plugin's copy of the core must not clash with the Python extension's.
Nothing here needs cffi; the core's source lists come from build_core.py.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import types
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

KINDS = ("emul", "cuda")
# Bumped when the recipe below changes in a way the sources do not show.
RECIPE = 1
# Directories (relative to the source root) whose files can change a plugin.
SOURCE_DIRS = ("csrc", "gpu/host", "gpu/emul", "gpu/kernels", "gpu/dialect", "cuda", "metal")
SOURCE_EXTS = (".c", ".h", ".cu")
PLUGIN_C = ["gpu/host/plugin.c", "gpu/host/runner.c", "gpu/host/runner_head.c", "gpu/host/bind.c",
            "metal/metal_stub.c"]
EMUL_C = ["gpu/emul/emul.c", "gpu/emul/kernels_emul.c", "gpu/emul/device_emul.c"]
CUDA_CU = ["cuda/kernels.cu", "cuda/host.cu", "cuda/device.cu"]


class BuildError(Exception):
    """The plugin cannot be built here; the message says why."""


def _run(cmd: list[str], cwd: str) -> str:
    try:
        r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    except OSError as e:
        raise BuildError(f"cannot run {cmd[0]}: {e}") from None
    if r.returncode != 0:
        tail = (r.stdout + r.stderr).strip()[-3000:]
        raise BuildError(f"{' '.join(cmd[:2])} ... failed (status {r.returncode}):\n{tail}")
    return r.stdout + r.stderr


def _build_core(root: str):
    """build_core.py of the source root, for its source lists and flags
    (cffi stubbed when absent: only the lists are read)."""
    import importlib.util

    path = os.path.join(root, "build_core.py")
    if not os.path.isfile(path):
        raise BuildError(f"{path} is missing: the GPU plugin is built from ds4py's sources")
    saved = sys.modules.get("cffi")
    try:
        import cffi  # noqa: F401
    except ImportError:
        class _NoFFI:
            def __getattr__(self, name):
                return lambda *a, **k: None

        sys.modules["cffi"] = types.SimpleNamespace(FFI=_NoFFI)
    try:
        spec = importlib.util.spec_from_file_location("_ds4py_build_core", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        if saved is not None:
            sys.modules["cffi"] = saved
        elif isinstance(sys.modules.get("cffi"), types.SimpleNamespace):
            del sys.modules["cffi"]


def toolchain(kind: str) -> dict:
    """The compilers a kind needs, with their version text (part of the
    cache key). Raises BuildError naming what is missing."""
    if kind not in KINDS:
        raise BuildError(f"unknown plugin kind {kind!r}; one of {', '.join(KINDS)}")
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise BuildError(f"no C compiler: {cc!r} is not on PATH (set CC)")
    tc = {"kind": kind, "cc": cc, "cc_version": _run([cc, "--version"], ROOT).splitlines()[0]}
    if kind == "cuda":
        nvcc = os.environ.get("NVCC", "nvcc")
        if shutil.which(nvcc) is None:
            raise BuildError("nvcc not found on PATH (install the CUDA toolkit or set NVCC): "
                             "the CUDA plugin is compiled on first use")
        tc["nvcc"] = nvcc
        tc["nvcc_version"] = _run([nvcc, "--version"], ROOT).strip().splitlines()[-1]
        tc["arch"] = cuda_arch()
    return tc


def cuda_arch() -> str:
    """-arch for this machine's GPU 0: DS4PY_CUDA_ARCH (e.g. sm_90), else
    its compute capability from nvidia-smi."""
    arch = os.environ.get("DS4PY_CUDA_ARCH")
    if arch:
        return arch
    smi = shutil.which("nvidia-smi")
    if smi is None:
        raise BuildError("cannot tell the GPU's compute capability: nvidia-smi is not on PATH "
                         "(set DS4PY_CUDA_ARCH, e.g. sm_90)")
    out = _run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"], ROOT).split()
    if not out or "." not in out[0]:
        raise BuildError(f"nvidia-smi reports no compute capability ({' '.join(out)!r}); "
                         f"set DS4PY_CUDA_ARCH, e.g. sm_90")
    major, minor = out[0].split(".", 1)
    return f"sm_{major}{minor}"


def source_files(root: str) -> list[str]:
    """Every file (relative path) that can change a plugin, sorted."""
    files = ["build_core.py", "gpu/tools/build_plugin.py"]
    for d in SOURCE_DIRS:
        for base, _dirs, names in os.walk(os.path.join(root, d)):
            for n in names:
                if n.endswith(SOURCE_EXTS):
                    files.append(os.path.relpath(os.path.join(base, n), root))
    missing = [f for f in PLUGIN_C + EMUL_C + CUDA_CU + ["csrc/ds4.h"]
               if not os.path.isfile(os.path.join(root, f))]
    if missing:
        raise BuildError(f"ds4py's GPU sources are incomplete under {root}: missing "
                         f"{', '.join(missing)}")
    return sorted(set(files))


def source_key(root: str, tc: dict) -> str:
    """The cache key: sources' contents, toolchain, flags, recipe."""
    h = hashlib.sha256(f"recipe={RECIPE}\n".encode())
    for k in sorted(tc):
        h.update(f"{k}={tc[k]}\n".encode())
    for rel in source_files(root):
        h.update(rel.encode() + b"\0")
        with open(os.path.join(root, rel), "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()[:24]


def plugin_name(kind: str, key: str) -> str:
    return f"ds4gpu-{kind}-{key}.so"


def _compile_units(root: str, tc: dict, obj_dir: str) -> list[str]:
    core = _build_core(root)
    kind = tc["kind"]
    # build_core's flags keep -fvisibility=hidden: only plugin.c's
    # DS4_GPU_API functions leave the .so
    base = list(core.BASE_CFLAGS) + ["-fPIC", "-Icsrc", "-pthread"]
    units: list[tuple[str, list[str]]] = [(s, []) for s in core.GENERIC_SOURCES]
    units += [(s, f) for s, f in core.SIMD_VARIANTS.get(core.machine(), [])]
    units += [(s, ["-DDS4_GPU_PLUGIN_CUDA"] if kind == "cuda" and s.endswith("plugin.c") else [])
              for s in PLUGIN_C]
    if kind == "emul":
        units += [(s, []) for s in EMUL_C]
    jobs = []
    for src, flags in units:
        obj = os.path.join(obj_dir, src.replace("/", "_").rsplit(".", 1)[0] + ".o")
        jobs.append(([tc["cc"], *base, *flags, "-c", src, "-o", obj], obj))
    if kind == "cuda":
        cu_flags = ["-std=c++17", "-O3", f"-arch={tc['arch']}", "--fmad=false", "-Icsrc",
                    "-Xcompiler", "-fPIC", "-Xcompiler", "-fvisibility=hidden"]
        for src in CUDA_CU:
            obj = os.path.join(obj_dir, src.replace("/", "_").rsplit(".", 1)[0] + ".o")
            jobs.append(([tc["nvcc"], *cu_flags, "-c", src, "-o", obj], obj))
    with ThreadPoolExecutor(max(1, os.cpu_count() or 1)) as pool:
        list(pool.map(lambda j: _run(j[0], root), jobs))
    return [obj for _, obj in jobs]


def build(root: str, tc: dict, out_path: str) -> str:
    """Compile and link the plugin to out_path atomically (a temporary
    directory next to it, then os.replace)."""
    out_dir = os.path.dirname(os.path.abspath(out_path))
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".build-", dir=out_dir) as tmp:
        objs = _compile_units(root, tc, tmp)
        tmp_so = os.path.join(tmp, "plugin.so")
        if tc["kind"] == "cuda":
            _run([tc["nvcc"], "-shared", f"-arch={tc['arch']}", *objs, "-lpthread", "-lm",
                  "-o", tmp_so], root)
        else:
            _run([tc["cc"], "-shared", *objs, "-pthread", "-lm", "-o", tmp_so], root)
        os.replace(tmp_so, out_path)
    return out_path


def ensure(root: str, kind: str, cache_dir: str, log=None) -> str:
    """The cached plugin for the sources under root, built if missing."""
    tc = toolchain(kind)
    key = source_key(root, tc)
    out = os.path.join(cache_dir, plugin_name(kind, key))
    if os.path.isfile(out):
        return out
    os.makedirs(cache_dir, exist_ok=True)
    with open(os.path.join(cache_dir, f".lock-{kind}"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it
        if not os.path.isfile(out):
            if log is not None:
                log(f"ds4py: building the {kind} GPU plugin into {out} (once per source "
                    f"version; {'minutes with nvcc' if kind == 'cuda' else 'seconds'})")
            build(root, tc, out)
    return out


def main(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kind", choices=KINDS)
    p.add_argument("--cache", default=os.path.join(ROOT, "build", "gpu-plugin"),
                   help="output directory (default: build/gpu-plugin)")
    a = p.parse_args(argv)
    try:
        print(ensure(ROOT, a.kind, a.cache, log=lambda m: print(m, file=sys.stderr)))
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
