"""Quant formats: type facts and the core's reference/SIMD kernels from Python.

A thin layer over the C kernels (through ``ds4py._core`` only). Everything
here is for inspection and testing: dequantize a row, quantize a row, take one
dot product. Types are named as ggml names them ("Q4_K", "Q4_64A") or given
by id; ``isa`` is "auto", "scalar", "avx2", "avx512" or "neon".

Errors (unknown type, a length that is not whole blocks, an activation type the
weight type does not pair with, an ISA this CPU lacks) raise ``QuantError``
carrying the core's message.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import _core
from ._core import ffi, lib
from .errors import QuantError

__all__ = [
    "TypeInfo",
    "TYPES",
    "type_info",
    "dequantize",
    "quantize",
    "quantize_q8_0_ref",
    "quantize_weights",
    "WEIGHT_QUANT_TYPES",
    "vec_dot",
    "available_isas",
]


@dataclass(frozen=True)
class TypeInfo:
    """What the core knows about one ggml type id."""

    name: str
    id: int
    block_size: int          # weights per block
    type_size: int           # bytes per block
    vec_dot_type: str | None  # activation type its dot pairs with, or None
    can_dequantize: bool
    can_dot: bool
    can_quantize: bool
    ds4_only: bool           # ds4's own id (Q4_64A, Q2_64A), not a ggml type


def _info_from_core(type_id: int) -> TypeInfo:
    out = ffi.new("ds4_type_info *")
    err = _core.new_error()
    _core.check(lib.ds4_type_get_info(type_id, out, err), err, QuantError)
    vdt = None
    if out.vec_dot_type >= 0:
        vdt_out = ffi.new("ds4_type_info *")
        _core.check(lib.ds4_type_get_info(out.vec_dot_type, vdt_out, err), err, QuantError)
        vdt = ffi.string(vdt_out.name).decode()
    flags = out.flags
    return TypeInfo(
        name=ffi.string(out.name).decode(),
        id=type_id,
        block_size=int(out.block_size),
        type_size=int(out.type_size),
        vec_dot_type=vdt,
        can_dequantize=bool(flags & lib.DS4_TYPE_DEQUANT),
        can_dot=bool(flags & lib.DS4_TYPE_DOT),
        can_quantize=bool(flags & lib.DS4_TYPE_QUANTIZE),
        ds4_only=bool(flags & lib.DS4_TYPE_DS4_ONLY),
    )


def _known_types() -> tuple[TypeInfo, ...]:
    found = []
    for t in range(lib.DS4_TYPE_COUNT):
        try:
            found.append(_info_from_core(t))
        except QuantError:
            pass  # an id ggml left unused
    return tuple(found)


#: Every type id the core knows, in id order.
TYPES: tuple[TypeInfo, ...] = _known_types()
_BY_NAME = {t.name.upper(): t for t in TYPES}
_BY_ID = {t.id: t for t in TYPES}


def type_info(t: str | int | TypeInfo) -> TypeInfo:
    """Facts about a type given by name (case-insensitive), id or TypeInfo."""
    if isinstance(t, TypeInfo):
        return t
    if isinstance(t, (int, np.integer)) and not isinstance(t, bool):
        if int(t) in _BY_ID:
            return _BY_ID[int(t)]
        # let the core word the error for an unknown id
        return _info_from_core(int(t))
    if isinstance(t, str):
        try:
            return _BY_NAME[t.upper()]
        except KeyError:
            raise QuantError(
                f"unknown quant type name {t!r}; known: {', '.join(x.name for x in TYPES)}"
            ) from None
    raise QuantError(f"a quant type is a name or an id, not {type(t).__name__}")


def available_isas() -> list[str]:
    """Kernel ISAs this CPU (and OS) can run, scalar first."""
    return _core.available_isas()


def _isa(isa: str | int) -> int:
    try:
        return _core.isa_id(isa)
    except ValueError as e:
        raise QuantError(str(e)) from None


def _as_bytes(data, what: str) -> np.ndarray:
    """A C-contiguous uint8 array over raw block bytes (copying only when the
    buffer is not contiguous or not aligned for the block structs)."""
    if isinstance(data, np.ndarray):
        arr = data.reshape(-1).view(np.uint8) if data.dtype != np.uint8 else data.reshape(-1)
    else:
        try:
            arr = np.frombuffer(data, dtype=np.uint8)
        except TypeError:
            raise QuantError(f"{what} must be bytes-like or a numpy array, "
                             f"not {type(data).__name__}") from None
    # Block structs hold uint16/float fields: the kernels need 4-byte alignment.
    if not arr.flags.c_contiguous or arr.ctypes.data % 16:
        arr = np.array(arr, dtype=np.uint8, copy=True, order="C")
    return arr


def _n_from_bytes(info: TypeInfo, nbytes: int, what: str) -> int:
    if nbytes % info.type_size:
        raise QuantError(
            f"{what} has {nbytes} bytes, not a whole number of {info.name} blocks "
            f"({info.type_size} bytes each)")
    return nbytes // info.type_size * info.block_size


def _as_f32(x, what: str) -> np.ndarray:
    try:
        arr = np.ascontiguousarray(np.asarray(x, dtype=np.float32).reshape(-1))
    except (TypeError, ValueError) as e:
        raise QuantError(f"{what} must be convertible to float32: {e}") from None
    return arr


def dequantize(type: str | int, data, isa: str | int = "auto") -> np.ndarray:
    """Decode whole blocks of `type` into a float32 array."""
    info = type_info(type)
    raw = _as_bytes(data, "data")
    n = _n_from_bytes(info, raw.size, "data")
    out = np.empty(n, dtype=np.float32)
    err = _core.new_error()
    _core.check(lib.ds4_dequantize_row(_isa(isa), info.id, _core.ptr(raw),
                                       _core.ptr(out, "float *"), n, err), err, QuantError)
    return out


def _quantize_with(fn, info: TypeInfo, x, isa: int | None) -> np.ndarray:
    src = _as_f32(x, "x")
    n = src.size
    nbytes = -(-n // info.block_size) * info.type_size  # the core refuses partial blocks
    out = np.zeros(nbytes, dtype=np.uint8)
    err = _core.new_error()
    args = (_core.ptr(src, "float *"), _core.ptr(out), n, err)
    status = fn(isa, info.id, *args) if isa is not None else fn(*args)
    _core.check(status, err, QuantError)
    return out


def quantize(type: str | int, x, isa: str | int = "auto") -> np.ndarray:
    """Encode float32 values as `type` blocks (activation types Q8_0, Q8_1,
    Q8_K, F32, F16, BF16 and ds4's Q4_64A/Q2_64A). Q8_0/Q8_1 round like
    llama.cpp's x86 AVX2 build (nearest-even of x*(127/amax))."""
    return _quantize_with(lib.ds4_quantize_row, type_info(type), x, _isa(isa))


def quantize_q8_0_ref(x) -> np.ndarray:
    """Q8_0 as ggml's reference quantizer writes model files:
    roundf(x/d), ties away from zero."""
    return _quantize_with(lib.ds4_quantize_row_q8_0_ref, type_info("Q8_0"), x, None)


def _weight_quant_types() -> tuple[str, ...]:
    # A zero-row call checks only the type: it succeeds exactly for the
    # types ds4_quantize_weights implements.
    err = _core.new_error()
    return tuple(t.name for t in TYPES
                 if lib.ds4_quantize_weights(t.id, ffi.NULL, ffi.NULL, 0, 0, err) == 0)


#: Types `quantize_weights` can write, in id order.
WEIGHT_QUANT_TYPES: tuple[str, ...] = _weight_quant_types()


def quantize_weights(type: str | int, x) -> np.ndarray:
    """Quantize a weight matrix (2-D: rows x n_per_row) or one row (1-D) into
    `type`, byte for byte as llama.cpp's ggml_quantize_chunk writes it with
    no importance matrix. Returns uint8 of shape (rows, row_bytes) for 2-D
    input, (row_bytes,) for 1-D. n_per_row must be whole blocks (32; 256 for
    the K-quants and IQ4_XS). Types: WEIGHT_QUANT_TYPES. Runs on the calling
    thread with the GIL released, so threads may quantize disjoint rows."""
    info = type_info(type)
    try:
        arr = np.asarray(x, dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise QuantError(f"x must be convertible to float32: {e}") from None
    if arr.ndim not in (1, 2):
        raise QuantError(f"x must be 1-D (one row) or 2-D (rows x n_per_row), not {arr.ndim}-D")
    src = np.ascontiguousarray(arr)
    n_rows, n_per_row = (1, src.shape[0]) if src.ndim == 1 else src.shape
    row_bytes = -(-n_per_row // info.block_size) * info.type_size  # partial rows are refused
    out = np.zeros((n_rows, row_bytes), dtype=np.uint8)
    err = _core.new_error()
    _core.check(lib.ds4_quantize_weights(info.id, _core.ptr(src, "float *"), _core.ptr(out),
                                         n_rows, n_per_row, err), err, QuantError)
    return out.reshape(-1) if src.ndim == 1 else out


def vec_dot(type: str | int, w, act, act_type: str | int = "F32",
            isa: str | int = "auto") -> float:
    """Dot product of one weight row (raw `type` blocks) with an activation
    row: float values when act_type is "F32" (raw bytes / a uint8 array are
    taken as the float32 row's bytes), else raw blocks of the weight type's
    paired activation type (from `quantize`)."""
    info = type_info(type)
    ainfo = type_info(act_type)
    raw_w = _as_bytes(w, "w")
    n = _n_from_bytes(info, raw_w.size, "w")
    if ainfo.id == lib.DS4_TYPE_F32:
        if isinstance(act, (bytes, bytearray, memoryview)) or (
                isinstance(act, np.ndarray) and act.dtype == np.uint8):
            act = _as_bytes(act, "act").view(np.float32)  # raw F32 row (quantize("F32"))
        a = _as_f32(act, "act")
        if a.size != n:
            raise QuantError(f"act has {a.size} values but the {info.name} row has {n} weights")
    else:
        a = _as_bytes(act, "act")
        if ainfo.id == info.id or ainfo.name == info.vec_dot_type:
            n_act = _n_from_bytes(ainfo, a.size, "act")
            if n_act != n:
                raise QuantError(f"act holds {n_act} {ainfo.name} values but the "
                                 f"{info.name} row has {n} weights")
        # any other act_type: the core refuses it with its own message
    out = ffi.new("float *")
    err = _core.new_error()
    _core.check(lib.ds4_vec_dot(_isa(isa), info.id, _core.ptr(raw_w), ainfo.id,
                                _core.ptr(a), n, out, err), err, QuantError)
    return float(out[0])
