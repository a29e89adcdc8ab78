"""ctypes binding to the ggml shared libraries that llama-cpp-python ships.

This is the independent reference for ds4py's quant kernels: it calls
llama.cpp's own code, nothing of ds4py. Used by make_quant_fixtures.py (which
writes tests/golden/quants/) and by test_live_llamacpp.py (opt-in).

What it reaches (struct layouts from the vendored headers of
llama-cpp-python 0.3.36, vendor/llama.cpp/ggml/include):

- libggml-base: ``ggml_get_type_traits(type)`` -> ``struct ggml_type_traits``
  (ggml.h) for ``to_float`` (dequantize) and ``from_float_ref`` (reference
  quantizer), and ``ggml_quantize_chunk`` (the weight quantizers).
- libggml-cpu: ``ggml_get_type_traits_cpu(type)`` -> ``struct
  ggml_type_traits_cpu`` (ggml-cpu.h) for ``from_float`` (the CPU backend's
  activation quantizer: on x86 the AVX/AVX2 quantize_row_q8_0/q8_1) and
  ``vec_dot``.

The library directory is $DS4_GGML_LIB_DIR, else llama_cpp/lib of the
installed llama-cpp-python (found without importing llama_cpp, which would
load libllama as well).

Everything here works on numpy arrays and copies nothing it need not; the
functions are not thread-safe beyond what ggml itself guarantees.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
from pathlib import Path

import numpy as np

# ggml.h, enum ggml_type (the ids GGUF stores; ds4.h uses the same numbers).
GGML_TYPES = {
    "F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8,
    "Q8_1": 9, "Q2_K": 10, "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14,
    "Q8_K": 15, "IQ4_NL": 20, "IQ4_XS": 23, "BF16": 30,
}
TYPE_NAMES = {v: k for k, v in GGML_TYPES.items()}

_to_float_t = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
_from_float_t = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
# ggml-cpu.h: typedef void (*ggml_vec_dot_t)(int n, float *s, size_t bs,
#   const void *x, size_t bx, const void *y, size_t by, int nrc);
_vec_dot_t = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t,
                              ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                              ctypes.c_size_t, ctypes.c_int)


class _TypeTraits(ctypes.Structure):
    # ggml.h, struct ggml_type_traits — field order matters.
    _fields_ = [
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", ctypes.c_void_p),
        ("from_float_ref", ctypes.c_void_p),
    ]


class _TypeTraitsCPU(ctypes.Structure):
    # ggml-cpu.h, struct ggml_type_traits_cpu.
    _fields_ = [
        ("from_float", ctypes.c_void_p),
        ("vec_dot", ctypes.c_void_p),
        ("vec_dot_type", ctypes.c_int),  # enum ggml_type
        ("nrows", ctypes.c_int64),
    ]


def lib_dir() -> Path:
    env = os.environ.get("DS4_GGML_LIB_DIR")
    if env:
        return Path(env)
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "llama-cpp-python is not installed and DS4_GGML_LIB_DIR is unset; "
            "see tests/golden/quants/README.md for the build command")
    return Path(list(spec.submodule_search_locations)[0]) / "lib"


def _version_of_llama_cpp() -> str | None:
    try:
        from importlib.metadata import version
        return version("llama_cpp_python")
    except Exception:
        return None


class GGML:
    """The loaded ggml libraries. One instance per process is enough (`load()`)."""

    def __init__(self, directory: Path | None = None):
        d = Path(directory) if directory else lib_dir()
        mode = getattr(ctypes, "RTLD_GLOBAL", 0)
        # base first: libggml-cpu links against it.
        self.base = ctypes.CDLL(str(d / "libggml-base.so"), mode=mode)
        self.cpu = ctypes.CDLL(str(d / "libggml-cpu.so"), mode=mode)
        self.directory = d
        self.llama_cpp_python_version = _version_of_llama_cpp()

        self.base.ggml_get_type_traits.restype = ctypes.POINTER(_TypeTraits)
        self.base.ggml_get_type_traits.argtypes = [ctypes.c_int]
        self.base.ggml_quantize_chunk.restype = ctypes.c_size_t
        self.base.ggml_quantize_chunk.argtypes = [
            ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
            ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
        self.base.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
        self.base.ggml_quantize_requires_imatrix.argtypes = [ctypes.c_int]
        self.cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(_TypeTraitsCPU)
        self.cpu.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]
        self.base.ggml_commit.restype = ctypes.c_char_p
        self.base.ggml_commit.argtypes = []
        self.base.ggml_version.restype = ctypes.c_char_p
        self.base.ggml_version.argtypes = []
        self.cpu.ggml_cpu_init.restype = None
        self.cpu.ggml_cpu_init.argtypes = []
        # Fills the CPU backend's fp16 tables and feature probes; the CPU
        # kernels may read those tables, so it must run before any of them.
        self.cpu.ggml_cpu_init()

        self._cache: dict = {}

    def commit(self) -> str:
        """The llama.cpp commit ggml was built from (ggml_commit())."""
        return self.base.ggml_commit().decode()

    def version(self) -> str:
        return self.base.ggml_version().decode()

    def compiled_features(self) -> dict[str, int]:
        """libggml-cpu's ggml_cpu_has_*() probes: on x86 these report the
        compile-time ISA flags (#if defined(__AVX512BF16__) ...), i.e. which
        kernels this build runs."""
        out = {}
        for f in ("sse3", "ssse3", "avx", "avx2", "f16c", "fma", "bmi2", "avx_vnni",
                  "avx512", "avx512_vbmi", "avx512_vnni", "avx512_bf16", "amx_int8",
                  "llamafile"):
            fn = getattr(self.cpu, f"ggml_cpu_has_{f}", None)
            if fn is not None:
                fn.restype = ctypes.c_int
                fn.argtypes = []
                out[f] = int(fn())
        return out

    # -------------------------------------------------------------- traits --
    def traits(self, t: int) -> _TypeTraits:
        return self.base.ggml_get_type_traits(int(t)).contents

    def traits_cpu(self, t: int) -> _TypeTraitsCPU:
        return self.cpu.ggml_get_type_traits_cpu(int(t)).contents

    def block_size(self, t: int) -> int:
        return int(self.traits(t).blck_size)

    def type_size(self, t: int) -> int:
        return int(self.traits(t).type_size)

    def row_bytes(self, t: int, n: int) -> int:
        bs = self.block_size(t)
        if n % bs:
            raise ValueError(f"{TYPE_NAMES.get(t, t)}: n={n} not a multiple of {bs}")
        return n // bs * self.type_size(t)

    def vec_dot_type(self, t: int) -> int:
        return int(self.traits_cpu(t).vec_dot_type)

    def _fn(self, key, ptr, proto):
        if key not in self._cache:
            if not ptr:
                tname = TYPE_NAMES.get(key[1], key[1])
                raise NotImplementedError(f"ggml has no {key[0]} for type {tname}")
            self._cache[key] = proto(ptr)
        return self._cache[key]

    # ------------------------------------------------------------- kernels --
    def to_float(self, t: int, raw: np.ndarray, n: int) -> np.ndarray:
        """ggml_get_type_traits(t)->to_float over one row of n weights."""
        raw = np.ascontiguousarray(raw, dtype=np.uint8)
        if raw.size != self.row_bytes(t, n):
            raise ValueError("raw size does not match n")
        fn = self._fn(("to_float", t), self.traits(t).to_float, _to_float_t)
        out = np.empty(n, dtype=np.float32)
        fn(raw.ctypes.data, out.ctypes.data, n)
        return out

    def from_float_ref(self, t: int, x: np.ndarray) -> np.ndarray:
        """ggml_get_type_traits(t)->from_float_ref: ggml's reference quantizer (ggml-quants.c)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        fn = self._fn(("from_float_ref", t), self.traits(t).from_float_ref, _from_float_t)
        out = np.zeros(self.row_bytes(t, x.size), dtype=np.uint8)
        fn(x.ctypes.data, out.ctypes.data, x.size)
        return out

    def from_float_cpu(self, t: int, x: np.ndarray) -> np.ndarray:
        """ggml_get_type_traits_cpu(t)->from_float: the CPU backend's quantizer
        (what llama.cpp runs on activations before a mat-vec)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        fn = self._fn(("from_float", t), self.traits_cpu(t).from_float, _from_float_t)
        out = np.zeros(self.row_bytes(t, x.size), dtype=np.uint8)
        fn(x.ctypes.data, out.ctypes.data, x.size)
        return out

    def quantize_chunk(self, t: int, x: np.ndarray, nrows: int = 1) -> np.ndarray:
        """ggml_quantize_chunk(t, x, dst, 0, nrows, n_per_row, imatrix=NULL)."""
        x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
        if self.base.ggml_quantize_requires_imatrix(int(t)):
            raise NotImplementedError(f"{TYPE_NAMES.get(t, t)} needs an imatrix")
        n_per_row = x.size // nrows
        out = np.zeros(self.row_bytes(t, n_per_row) * nrows, dtype=np.uint8)
        got = self.base.ggml_quantize_chunk(int(t), x.ctypes.data, out.ctypes.data,
                                            0, nrows, n_per_row, None)
        if got != out.size:
            raise RuntimeError(f"ggml_quantize_chunk wrote {got} bytes, expected {out.size}")
        return out

    def vec_dot(self, t: int, w_raw: np.ndarray, act_raw: np.ndarray, n: int) -> np.float32:
        """ggml_get_type_traits_cpu(t)->vec_dot(n, &s, 0, w, 0, act, 0, nrc=1):
        one weight row of type t against one activation row already in
        vec_dot_type(t)."""
        w_raw = np.ascontiguousarray(w_raw, dtype=np.uint8)
        act_raw = np.ascontiguousarray(act_raw, dtype=np.uint8)
        if w_raw.size != self.row_bytes(t, n):
            raise ValueError("weight size does not match n")
        if act_raw.size != self.row_bytes(self.vec_dot_type(t), n):
            raise ValueError("activation size does not match n")
        fn = self._fn(("vec_dot", t), self.traits_cpu(t).vec_dot, _vec_dot_t)
        s = np.zeros(1, dtype=np.float32)
        fn(n, s.ctypes.data, 0, w_raw.ctypes.data, 0, act_raw.ctypes.data, 0, 1)
        return s[0]


_LOADED: GGML | None = None


def load(directory: Path | None = None) -> GGML:
    global _LOADED
    if _LOADED is None:
        _LOADED = GGML(directory)
    return _LOADED
