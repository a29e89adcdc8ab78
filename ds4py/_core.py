"""The one module that talks to cffi. Everything else imports from here.

Helpers turn a failed status into a typed exception carrying the core's
message, and wrap numpy arrays as C pointers without copying.
"""

from __future__ import annotations

import numpy as np

from ._ds4core import ffi, lib  # noqa: F401  (re-exported for ds4py modules)
from .errors import DS4Error

__all__ = ["ffi", "lib", "new_error", "check", "ptr", "isa_id", "ISA_NAMES"]

ISA_NAMES = {
    "auto": lib.DS4_ISA_AUTO,
    "scalar": lib.DS4_ISA_SCALAR,
    "avx2": lib.DS4_ISA_AVX2,
    "avx512": lib.DS4_ISA_AVX512,
    "neon": lib.DS4_ISA_NEON,
}


def new_error():
    """A fresh ds4_error* to pass to a core call."""
    return ffi.new("ds4_error *")


def check(status: int, err, exc: type[DS4Error] = DS4Error) -> None:
    """Raise exc(core message) when a core call returned a failure status."""
    if status != lib.DS4_OK:
        raise exc(ffi.string(err.message).decode("utf-8", "replace"), int(status))


def ptr(array: np.ndarray, ctype: str = "void *"):
    """A C pointer to a C-contiguous numpy array's data (no copy)."""
    if not array.flags.c_contiguous:
        raise ValueError("array must be C-contiguous")
    return ffi.cast(ctype, ffi.from_buffer(array, require_writable=False))


def isa_id(isa: str | int) -> int:
    if isinstance(isa, int):
        return isa
    try:
        return ISA_NAMES[isa]
    except KeyError:
        raise ValueError(f"unknown ISA {isa!r}; one of {sorted(ISA_NAMES)}") from None


def available_isas() -> list[str]:
    """ISAs whose kernels this CPU (and OS) can run, best last."""
    mask = lib.ds4_isa_available()
    return [name for name, i in ISA_NAMES.items() if i and mask & (1 << i)]


def paths_report() -> str:
    """The DS4PY_PATHS=1 record: which kernel variant each layer's matvec /
    GEMM, attention, GDN recurrence and MoE ran in this process ("" when
    the switch is off)."""
    n = lib.ds4_paths_report(ffi.NULL, 0)
    if n <= 0:
        return ""
    buf = ffi.new("char[]", n + 1)
    lib.ds4_paths_report(buf, n + 1)
    return ffi.string(buf).decode("utf-8", "replace")


def _print_paths_at_exit() -> None:
    import sys

    rep = paths_report()
    if rep:
        sys.stderr.write("DS4PY_PATHS: kernel variants that ran (layer, op, variant); "
                         "AMX: unused (no AMX kernels)\n" + rep)


import os as _os  # noqa: E402

if _os.environ.get("DS4PY_PATHS") == "1":
    import atexit as _atexit

    _atexit.register(_print_paths_at_exit)
