"""A streaming GGUF v3 writer in pure Python.

Why our own: gguf-py can neither write nor read files holding ds4's tensor
types 36 (Q4_64A) and 37 (Q2_64A), and tools that requantize files larger
than memory need to stream tensor data through without holding it.

Usage::

    with GGUFWriter("out.gguf") as w:
        w.add_metadata("general.architecture", "qwen35")
        w.add_metadata("qwen35.block_count", 24, ValueType.UINT32)
        w.add_tensor_info("token_embd.weight", (1024, 4096), "Q4_64A")
        w.add_tensor_info("output_norm.weight", (1024,), "F32")
        w.write_tensor_data("token_embd.weight", chunk_iterator)   # streams
        w.write_tensor_data("output_norm.weight", np.ones(1024, np.float32))

Metadata and tensor infos are declared first (the header precedes the data);
tensor data is then written in declaration order. Shapes are in GGUF order:
``ne[0]`` (the row length, numpy's last axis) first.

Metadata type inference when no type is given:
  bool -> BOOL; int -> INT32 if it fits, else INT64, else UINT64;
  float -> FLOAT32; str -> STRING (UTF-8); bytes -> STRING (raw bytes);
  numpy scalars and arrays -> the type of their dtype (float64 -> FLOAT64);
  list/tuple -> ARRAY whose element type is inferred over all elements
  (all bools -> BOOL; all ints -> the smallest of INT32/INT64/UINT64 that
  holds every one; ints and floats -> FLOAT32; strings -> STRING; lists ->
  arrays of arrays, each inner array inferred on its own); an empty list
  without an element type is an INT32 array.
llama.cpp checks the exact type of many keys (e.g. UINT32 for
``<arch>.block_count``), so pass an explicit ``ValueType`` for those.

The file is written to a temporary file in the destination's directory and
moved into place (after fsync) only when ``close()`` succeeds with every
declared tensor written. On any error the temporary file is removed and the
destination is left untouched. Where the OS offers it (Linux ``O_TMPFILE``
with /proc), the temporary file has no name at all until ``close()`` links
it in, so even a process killed with SIGKILL leaves nothing behind
(``GGUFWriter.anonymous`` says which mode a writer uses); elsewhere it is a
hidden ``.<name>.XXXXXXXX.tmp`` beside the destination.
"""

from __future__ import annotations

import math
import os
import secrets
import struct
import tempfile
import weakref
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import numpy as np

from ._core import ffi, lib, new_error
from .errors import GGUFError
from .gguf import ValueType  # one enum of GGUF value type ids, shared with the reader

__all__ = [
    "GGUF_MAGIC", "GGUF_VERSION", "GGUF_DEFAULT_ALIGNMENT", "ValueType", "Value",
    "TensorType", "tensor_type", "tensor_types", "GGUFWriter", "write_gguf",
]

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
GGUF_DEFAULT_ALIGNMENT = 32
# ggml.h GGML_MAX_DIMS; llama.cpp's gguf.cpp (gguf_init_from_file_impl)
# refuses more dimensions and names of GGML_MAX_NAME (64) bytes or longer.
MAX_DIMS = 4
MAX_NAME_BYTES = 63


class Value(NamedTuple):
    """A metadata value with an explicit type, for ``write_gguf``'s dict."""
    value: Any
    type: ValueType | None = None
    element_type: ValueType | None = None


_V = ValueType
_DTYPE = {
    _V.UINT8: np.dtype("<u1"), _V.INT8: np.dtype("<i1"), _V.UINT16: np.dtype("<u2"),
    _V.INT16: np.dtype("<i2"), _V.UINT32: np.dtype("<u4"), _V.INT32: np.dtype("<i4"),
    _V.FLOAT32: np.dtype("<f4"), _V.BOOL: np.dtype("u1"), _V.UINT64: np.dtype("<u8"),
    _V.INT64: np.dtype("<i8"), _V.FLOAT64: np.dtype("<f8"),
}
_INT_TYPES = {t: (int(np.iinfo(_DTYPE[t]).min), int(np.iinfo(_DTYPE[t]).max))
              for t in (_V.UINT8, _V.INT8, _V.UINT16, _V.INT16, _V.UINT32, _V.INT32,
                        _V.UINT64, _V.INT64)}
_FLOAT_TYPES = (_V.FLOAT32, _V.FLOAT64)
_STRUCT = {_V.UINT8: "<B", _V.INT8: "<b", _V.UINT16: "<H", _V.INT16: "<h", _V.UINT32: "<I",
           _V.INT32: "<i", _V.UINT64: "<Q", _V.INT64: "<q"}
_FROM_DTYPE = {np.dtype(np.bool_): _V.BOOL, np.dtype(np.float16): _V.FLOAT32}
_FROM_DTYPE.update({d.newbyteorder("="): t for t, d in _DTYPE.items() if t != _V.BOOL})


# --------------------------------------------------------------- tensor types

class TensorType(NamedTuple):
    id: int
    name: str
    block_size: int     # weights per block
    type_size: int      # bytes per block
    ds4_only: bool      # ds4's own id (36/37), unreadable by ggml/gguf-py


def _load_type_table() -> dict[int, TensorType]:
    # The core's traits table is the one source of block/type sizes.
    table = {}
    for tid in range(lib.DS4_TYPE_COUNT):
        info, err = ffi.new("ds4_type_info *"), new_error()
        if lib.ds4_type_get_info(tid, info, err) != lib.DS4_OK:
            continue
        if not info.flags & lib.DS4_TYPE_KNOWN:
            continue
        table[tid] = TensorType(tid, ffi.string(info.name).decode("ascii"),
                                int(info.block_size), int(info.type_size),
                                bool(info.flags & lib.DS4_TYPE_DS4_ONLY))
    return table


_TYPES = _load_type_table()
_TYPES_BY_NAME = {t.name.upper(): t for t in _TYPES.values()}


def tensor_types() -> list[TensorType]:
    """Every tensor type the core knows, by id."""
    return [_TYPES[k] for k in sorted(_TYPES)]


def tensor_type(t: str | int) -> TensorType:
    """Look a tensor type up by name (case-insensitive, e.g. "q4_k") or id."""
    if isinstance(t, str):
        found = _TYPES_BY_NAME.get(t.upper())
        if found is None:
            raise GGUFError(f"unknown tensor type {t!r}")
        return found
    if isinstance(t, (int, np.integer)) and not isinstance(t, bool):
        found = _TYPES.get(int(t))
        if found is None:
            raise GGUFError(f"unknown tensor type id {int(t)}")
        return found
    raise GGUFError(f"tensor type must be a name or an id, not {type(t).__name__}")


# Tensor types whose natural numpy dtype we can check data arrays against.
_TENSOR_DTYPE = {
    "F32": np.dtype(np.float32), "F16": np.dtype(np.float16), "F64": np.dtype(np.float64),
    "I8": np.dtype(np.int8), "I16": np.dtype(np.int16), "I32": np.dtype(np.int32),
    "I64": np.dtype(np.int64),
}


# ------------------------------------------------------------ value encoding

def _utf8(s: str, what: str) -> bytes:
    try:
        return s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise GGUFError(f"{what} is not valid UTF-8: {e}") from None


def _pack_string(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_real(v) -> bool:
    return _is_int(v) or isinstance(v, (float, np.floating))


def _as_value_type(t, what: str) -> ValueType:
    try:
        return ValueType(t) if not isinstance(t, str) else ValueType[t.upper()]
    except (ValueError, KeyError):
        raise GGUFError(f"{what}: unknown metadata value type {t!r}") from None


def _infer_int_type(values) -> ValueType:
    lo, hi = min(values), max(values)
    for t in (_V.INT32, _V.INT64, _V.UINT64):
        if _INT_TYPES[t][0] <= lo and hi <= _INT_TYPES[t][1]:
            return t
    raise GGUFError(f"integer {lo if lo < 0 else hi} does not fit any GGUF integer type")


def _infer_type(v, where: str) -> ValueType:
    if isinstance(v, (bool, np.bool_)):
        return _V.BOOL
    if isinstance(v, (str, bytes, bytearray)):   # before np.generic: np.str_ is both
        return _V.STRING
    if isinstance(v, np.generic):
        t = _FROM_DTYPE.get(v.dtype)
        if t is None:
            raise GGUFError(f"{where}: numpy type {v.dtype} has no GGUF value type")
        return t
    if isinstance(v, int):
        return _infer_int_type([v])
    if isinstance(v, float):
        return _V.FLOAT32
    if isinstance(v, (list, tuple, np.ndarray)):
        return _V.ARRAY
    raise GGUFError(f"{where}: cannot store a {type(v).__name__} in GGUF metadata")


def _infer_element_type(values, where: str) -> ValueType:
    if isinstance(values, np.ndarray):
        if values.ndim > 1:
            return _V.ARRAY
        if values.dtype.kind in "USO":   # strings, bytes or Python objects
            return _infer_element_type(values.tolist(), where)
        t = _FROM_DTYPE.get(values.dtype.newbyteorder("="))
        if t is None:
            raise GGUFError(f"{where}: numpy dtype {values.dtype} has no GGUF value type")
        return t
    if len(values) == 0:
        return _V.INT32
    # Fast paths for the common plain-Python lists (vocabularies of ~10^5).
    pytypes = set(map(type, values))
    if pytypes == {str}:
        return _V.STRING
    if pytypes == {int}:
        return _infer_int_type(values)
    if pytypes <= {int, float}:
        return _V.FLOAT32
    kinds = {_infer_type(v, where) for v in values}
    if kinds == {_V.BOOL}:
        return _V.BOOL
    if kinds == {_V.STRING}:
        return _V.STRING
    if kinds == {_V.ARRAY}:
        return _V.ARRAY
    if all(_is_int(v) for v in values):
        return _infer_int_type([int(v) for v in values])
    if all(_is_real(v) for v in values):
        return _V.FLOAT64 if kinds == {_V.FLOAT64} else _V.FLOAT32
    raise GGUFError(f"{where}: array mixes element kinds {sorted(k.name for k in kinds)}; "
                    "give element_type or make them uniform")


def _check_int_range(lo, hi, t: ValueType, where: str) -> None:
    tlo, thi = _INT_TYPES[t]
    if lo < tlo or hi > thi:
        bad = lo if lo < tlo else hi
        raise GGUFError(f"{where}: {bad} is out of range for {t.name}")


def _encode_scalar(v, t: ValueType, where: str) -> bytes:
    if t == _V.STRING:
        if isinstance(v, str):
            return _pack_string(_utf8(v, where))
        if isinstance(v, (bytes, bytearray)):
            return _pack_string(bytes(v))
        raise GGUFError(f"{where}: STRING needs str or bytes, got {type(v).__name__}")
    if t == _V.BOOL:
        if isinstance(v, (bool, np.bool_)) or (_is_int(v) and int(v) in (0, 1)):
            return b"\x01" if v else b"\x00"
        raise GGUFError(f"{where}: BOOL needs a bool, got {v!r}")
    if t in _INT_TYPES:
        if not _is_int(v):
            raise GGUFError(f"{where}: {t.name} needs an int, got {type(v).__name__} {v!r}")
        _check_int_range(int(v), int(v), t, where)
        return struct.pack(_STRUCT[t], int(v))
    if t in _FLOAT_TYPES:
        if not _is_real(v):
            raise GGUFError(f"{where}: {t.name} needs a number, got {type(v).__name__}")
        try:
            return struct.pack("<f" if t == _V.FLOAT32 else "<d", float(v))
        except OverflowError:
            raise GGUFError(f"{where}: {v!r} overflows {t.name}") from None
    raise GGUFError(f"{where}: {t.name} is not a scalar type")


def _encode_array(values, et: ValueType | None, where: str) -> bytes:
    if not isinstance(values, (list, tuple, np.ndarray)):
        raise GGUFError(f"{where}: ARRAY needs a list, tuple or numpy array, "
                        f"got {type(values).__name__}")
    if isinstance(values, np.ndarray) and values.ndim == 0:
        raise GGUFError(f"{where}: a 0-d numpy array is a scalar, not an ARRAY")
    if isinstance(values, np.ndarray) and values.dtype.kind in "USO":
        values = values.tolist()   # strings, bytes or Python objects: element-wise
    if et is None:
        et = _infer_element_type(values, where)
    head = struct.pack("<IQ", int(et), len(values))
    if et == _V.ARRAY:
        return head + b"".join(_encode_value(v, _V.ARRAY, None, f"{where}[{i}]")[1]
                               for i, v in enumerate(values))
    if et == _V.STRING:
        if set(map(type, values)) <= {str}:
            try:
                enc = [v.encode("utf-8") for v in values]
            except UnicodeEncodeError as e:
                raise GGUFError(f"{where}: a string is not valid UTF-8: {e}") from None
            pack = struct.Struct("<Q").pack
            return head + b"".join(pack(len(b)) + b for b in enc)
        return head + b"".join(_encode_scalar(v, _V.STRING, f"{where}[{i}]")
                               for i, v in enumerate(values))
    if len(values) == 0:
        return head
    # Numeric arrays (token scores, type lists: up to ~10^6 entries) go
    # through numpy; range and kind are checked first so nothing wraps.
    arr = values if isinstance(values, np.ndarray) else None
    if et == _V.BOOL:
        if arr is not None and arr.dtype.kind == "b":
            return head + arr.astype(np.uint8).tobytes()
        return head + b"".join(_encode_scalar(v, _V.BOOL, f"{where}[{i}]")
                               for i, v in enumerate(values))
    if et in _INT_TYPES:
        if arr is not None:
            if arr.dtype.kind not in "iu":
                raise GGUFError(f"{where}: {et.name} array needs integers, got dtype {arr.dtype}")
            lo, hi = int(arr.min()), int(arr.max())
        else:
            ints = values if set(map(type, values)) == {int} else None
            if ints is None:
                if not all(_is_int(v) for v in values):
                    raise GGUFError(f"{where}: {et.name} array needs integers only")
                ints = [int(v) for v in values]
            lo, hi = min(ints), max(ints)
            _check_int_range(lo, hi, et, where)
            return head + np.array(ints, dtype=_DTYPE[et]).tobytes()
        _check_int_range(lo, hi, et, where)
        return head + arr.astype(_DTYPE[et]).tobytes()
    if et in _FLOAT_TYPES:
        if arr is None:
            if not set(map(type, values)) <= {int, float}:
                if not all(_is_real(v) for v in values):
                    raise GGUFError(f"{where}: {et.name} array needs numbers only")
                values = [float(v) for v in values]
            try:
                arr = np.array(values, dtype=np.float64)
            except OverflowError:   # an int beyond float64
                raise GGUFError(f"{where}: a value overflows {et.name}") from None
        elif arr.dtype.kind not in "iuf":
            raise GGUFError(f"{where}: {et.name} array needs numbers, got dtype {arr.dtype}")
        if et == _V.FLOAT32:
            a64 = arr.astype(np.float64)
            finite = a64[np.isfinite(a64)]
            if finite.size and np.abs(finite).max() > np.finfo(np.float32).max:
                raise GGUFError(f"{where}: a value overflows FLOAT32")
        return head + arr.astype(_DTYPE[et]).tobytes()
    raise GGUFError(f"{where}: bad element type {et!r}")


def _encode_value(value, vtype, element_type, where: str) -> tuple[ValueType, bytes]:
    """(type, encoded value without the type id) for one metadata value."""
    if vtype is None and element_type is not None:
        vtype = _V.ARRAY
    vtype = _infer_type(value, where) if vtype is None else _as_value_type(vtype, where)
    et = None if element_type is None else _as_value_type(element_type, where)
    if vtype == _V.ARRAY:
        if isinstance(value, np.ndarray) and value.ndim > 1:
            # A 2-d array is an array of arrays (rows), typed by the dtype.
            inner = et if et not in (None, _V.ARRAY) else None
            body = struct.pack("<IQ", int(_V.ARRAY), len(value)) + b"".join(
                _encode_value(row, _V.ARRAY, inner, f"{where}[{i}]")[1]
                for i, row in enumerate(value))
            return vtype, body
        return vtype, _encode_array(value, et, where)
    if et is not None:
        raise GGUFError(f"{where}: element_type given for a non-array {vtype.name}")
    if isinstance(value, np.ndarray):
        if value.ndim != 0:
            raise GGUFError(f"{where}: {vtype.name} needs a scalar, got an array")
        value = value[()]
    return vtype, _encode_scalar(value, vtype, where)


# ---------------------------------------------------------------- the writer

class _TensorInfo(NamedTuple):
    name: str
    shape: tuple[int, ...]
    type: TensorType
    nbytes: int
    offset: int       # from the start of the data section


def _pad(n: int, align: int) -> int:
    return (n + align - 1) // align * align


def _default_mode(path: str) -> int:
    """Permission bits for the new file: the replaced file's, else 0666 & ~umask."""
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        pass
    umask = None
    try:  # Linux reports the umask without changing it (no race with threads)
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    umask = int(line.split()[1], 8)
    except OSError:
        pass
    if umask is None:
        umask = os.umask(0o022)
        os.umask(umask)
    return 0o666 & ~umask


def _open_anonymous(directory: str) -> int | None:
    """A writable file in `directory` with no name (Linux O_TMPFILE), or None
    where the OS or the filesystem cannot make one or /proc is missing (close()
    names it through /proc/self/fd)."""
    flag = getattr(os, "O_TMPFILE", None)
    if flag is None or not os.path.isdir("/proc/self/fd"):
        return None
    try:
        return os.open(directory, flag | os.O_RDWR, 0o600)
    except OSError:
        return None


def _name_anonymous(fd: int, directory: str, prefix: str) -> str:
    """Link the O_TMPFILE file `fd` into `directory` under a fresh hidden
    name and return it. linkat(AT_SYMLINK_FOLLOW) on /proc/self/fd/N is the
    documented way (open(2), O_TMPFILE); where that fails, copy the data
    into a named temp file instead (the fd is readable: opened O_RDWR)."""
    import ctypes

    at_fdcwd, at_symlink_follow = -100, 0x400
    libc = ctypes.CDLL(None, use_errno=True)
    src = f"/proc/self/fd/{fd}".encode()
    for _ in range(100):
        name = os.path.join(directory, prefix + secrets.token_hex(4) + ".tmp")
        if libc.linkat(at_fdcwd, src, at_fdcwd, os.fsencode(name), at_symlink_follow) == 0:
            return name
        if ctypes.get_errno() != 17:  # EEXIST: try another name
            break
    out_fd, name = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=directory)
    try:
        os.fchmod(out_fd, os.fstat(fd).st_mode & 0o777)
        offset, size = 0, os.fstat(fd).st_size
        while offset < size:
            chunk = os.pread(fd, min(1 << 24, size - offset), offset)
            if not chunk:
                break
            os.write(out_fd, chunk)
            offset += len(chunk)
        os.fsync(out_fd)
    except BaseException:
        os.close(out_fd)
        _remove(name)
        raise
    os.close(out_fd)
    return name


def _remove(path: str | None) -> None:
    if path is None:
        return
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class GGUFWriter:
    """Writes one GGUF v3 file; see the module docstring for the protocol."""

    def __init__(self, path: str | os.PathLike, alignment: int = GGUF_DEFAULT_ALIGNMENT):
        if (not _is_int(alignment) or alignment <= 0 or alignment & (alignment - 1)
                or alignment > 0xFFFFFFFF):
            raise GGUFError(f"alignment must be a power of two that fits UINT32, got {alignment!r}")
        self.path = os.fspath(path)
        self.alignment = int(alignment)
        self._kv: dict[str, bytes] = {}          # key -> encoded (type id + value)
        self._tensors: list[_TensorInfo] = []
        self._by_name: dict[str, int] = {}
        self._data_size = 0                       # padded size of declared data
        self._next = 0                            # index of the next tensor to write
        self._pos = 0                             # bytes written to the file so far
        self._data_start: int | None = None       # set once the header is written
        self._state = "open"                      # open | closed | aborted
        directory = os.path.dirname(os.path.abspath(self.path))
        self._dir = directory
        fd = _open_anonymous(directory)
        self.anonymous = fd is not None
        if fd is None:
            fd, self._tmp = tempfile.mkstemp(prefix=self._temp_prefix(), suffix=".tmp",
                                             dir=directory)
        else:
            self._tmp = None
        self._file = os.fdopen(fd, "wb", closefd=True) if self._tmp else os.fdopen(fd, "r+b")
        # Remove a named temp file if the writer is dropped without close()
        # (an anonymous one vanishes with its descriptor).
        self._finalizer = weakref.finalize(self, _remove, self._tmp)

    def _temp_prefix(self) -> str:
        return "." + os.path.basename(self.path) + "."

    # -- declaring -----------------------------------------------------------

    def add_metadata(self, key: str, value, type: ValueType | int | str | None = None,
                     element_type: ValueType | int | str | None = None) -> None:
        """Add one key. type/element_type override inference (see module doc)."""
        self._check_declaring()
        if not isinstance(key, str) or not key:
            raise GGUFError(f"metadata key must be a non-empty str, got {key!r}")
        kb = _utf8(key, f"metadata key {key!r}")
        if key in self._kv:
            raise GGUFError(f"duplicate metadata key {key!r}")
        if isinstance(value, Value):
            if type is not None or element_type is not None:
                raise GGUFError(f"{key}: type given twice (Value and argument)")
            value, type, element_type = value
        vtype, body = _encode_value(value, type, element_type, key)
        if key == "general.alignment":
            if vtype != _V.UINT32 and type is None and _is_int(value):
                vtype, body = _encode_value(value, _V.UINT32, None, key)
            if vtype != _V.UINT32 or struct.unpack("<I", body)[0] != self.alignment:
                raise GGUFError(f"general.alignment must be UINT32 {self.alignment} "
                                "(set it with GGUFWriter(alignment=...))")
        self._kv[key] = _pack_string(kb) + struct.pack("<I", int(vtype)) + body

    def add_tensor_info(self, name: str, shape, type: str | int,
                        nbytes: int | None = None) -> None:
        """Declare a tensor. shape is in GGUF order (ne[0], the row, first)."""
        self._check_declaring()
        if not isinstance(name, str) or not name:
            raise GGUFError(f"tensor name must be a non-empty str, got {name!r}")
        nb = _utf8(name, f"tensor name {name!r}")
        if len(nb) > MAX_NAME_BYTES:
            raise GGUFError(f"tensor name {name!r} is {len(nb)} bytes; GGUF readers "
                            f"(ggml GGML_MAX_NAME) allow at most {MAX_NAME_BYTES}")
        if name in self._by_name:
            raise GGUFError(f"duplicate tensor {name!r}")
        try:
            tt = tensor_type(type)
        except GGUFError as e:
            raise GGUFError(f"tensor {name!r}: {e}") from None
        shape = tuple(shape) if isinstance(shape, (list, tuple, np.ndarray)) else None
        if not shape or len(shape) > MAX_DIMS or not all(_is_int(d) and d >= 1 for d in shape):
            raise GGUFError(f"tensor {name!r}: shape must be 1..{MAX_DIMS} positive ints, "
                            f"got {shape!r}")
        shape = tuple(int(d) for d in shape)
        if shape[0] % tt.block_size:
            raise GGUFError(f"tensor {name!r}: row length ne[0]={shape[0]} is not a multiple "
                            f"of {tt.name}'s block size {tt.block_size}")
        n = math.prod(shape)
        size = n // tt.block_size * tt.type_size
        if max(n, size) > 2**63 - 1:   # readers hold both in int64
            raise GGUFError(f"tensor {name!r}: {list(shape)} is too large for GGUF (int64)")
        if nbytes is not None and nbytes != size:
            raise GGUFError(f"tensor {name!r}: nbytes={nbytes} but {tt.name} {list(shape)} "
                            f"takes {size} bytes")
        self._by_name[name] = len(self._tensors)
        self._tensors.append(_TensorInfo(name, shape, tt, size, self._data_size))
        self._data_size += _pad(size, self.alignment)

    # -- writing -------------------------------------------------------------

    def write_header(self) -> None:
        """Write everything before the tensor data. Called implicitly by the
        first write_tensor_data (or close); declarations end here."""
        self._check_open()
        if self._data_start is not None:
            return
        kv = dict(self._kv)
        if self.alignment != GGUF_DEFAULT_ALIGNMENT and "general.alignment" not in kv:
            kv["general.alignment"] = (_pack_string(b"general.alignment")
                                       + struct.pack("<II", int(_V.UINT32), self.alignment))
        parts = [GGUF_MAGIC, struct.pack("<IQQ", GGUF_VERSION, len(self._tensors), len(kv))]
        parts += kv.values()
        for t in self._tensors:
            parts.append(_pack_string(t.name.encode("utf-8")))
            parts.append(struct.pack(f"<I{len(t.shape)}QIQ", len(t.shape), *t.shape,
                                     t.type.id, t.offset))
        header = b"".join(parts)
        self._guarded(self._write, header)
        self._guarded(self._write_padding)
        self._data_start = self._pos

    def write_tensor_data(self, name: str, data) -> None:
        """Write the next declared tensor's bytes: bytes-like, a numpy array,
        or an iterable of such chunks (streamed, never joined in memory)."""
        self._check_open()
        if self._next >= len(self._tensors):
            raise GGUFError(f"tensor {name!r}: every declared tensor is already written")
        info = self._tensors[self._next]
        if name != info.name:
            if name in self._by_name:
                raise GGUFError(f"tensor {name!r} written out of order: {info.name!r} is next "
                                "(write tensors in declaration order)")
            raise GGUFError(f"tensor {name!r} was not declared with add_tensor_info")
        chunk = self._as_bytes(info, data)
        if chunk is None and (isinstance(data, (str, Mapping)) or not isinstance(data, Iterable)):
            raise GGUFError(f"tensor {name!r}: data must be bytes, a numpy array or an "
                            f"iterable of chunks, got {type(data).__name__}")
        if chunk is not None and len(chunk) != info.nbytes:
            raise GGUFError(f"tensor {name!r}: got {len(chunk)} bytes, "
                            f"{info.type.name} {list(info.shape)} takes {info.nbytes}")
        self.write_header()
        self._guarded(self._write_tensor, info, [chunk] if chunk is not None else data)
        self._next += 1

    def close(self) -> None:
        """Finish the file and move it into place. Raises (and leaves the
        destination untouched) unless every declared tensor was written."""
        if self._state == "closed":
            return
        self._check_open()
        if self._next < len(self._tensors):
            missing = [t.name for t in self._tensors[self._next:]]
            self.abort()
            raise GGUFError(f"{self.path}: closed before all tensor data was written; "
                            f"missing {missing[:5]}{' ...' if len(missing) > 5 else ''}")
        self.write_header()

        def finish():
            self._file.flush()
            os.fchmod(self._file.fileno(), _default_mode(self.path))
            os.fsync(self._file.fileno())
            if self._tmp is None:
                # Give the anonymous file a name only now, then rename it
                # over the destination (link cannot replace a file).
                self._tmp = _name_anonymous(self._file.fileno(), self._dir,
                                            self._temp_prefix())
            self._file.close()
            try:
                os.replace(self._tmp, self.path)
            except BaseException:
                _remove(self._tmp)
                raise
        self._guarded(finish)
        self._state = "closed"
        self._finalizer.detach()
        self._fsync_dir()

    def abort(self) -> None:
        """Drop the partial file; the destination is left as it was."""
        if self._state != "open":
            return
        self._state = "aborted"
        try:
            self._file.close()
        finally:
            if self._tmp is not None:
                _remove(self._tmp)
            self._finalizer.detach()

    def __enter__(self) -> GGUFWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    # -- internals -----------------------------------------------------------

    def _check_open(self) -> None:
        if self._state != "open":
            raise GGUFError(f"{self.path}: writer is {self._state}")

    def _check_declaring(self) -> None:
        self._check_open()
        if self._data_start is not None:
            raise GGUFError("metadata and tensor infos must be added before any tensor data")

    def _guarded(self, fn, *args):
        # A failure half-way through writing leaves a file we cannot finish:
        # drop it now so the error cannot be followed by a bad close().
        try:
            return fn(*args)
        except BaseException:
            self.abort()
            raise

    def _write(self, b) -> None:
        self._file.write(b)
        self._pos += len(b)

    def _write_padding(self) -> None:
        self._write(bytes(_pad(self._pos, self.alignment) - self._pos))

    @staticmethod
    def _as_bytes(info: _TensorInfo, data):
        """A flat byte view of bytes-like or numpy data, else None."""
        if isinstance(data, np.ndarray):
            want = _TENSOR_DTYPE.get(info.type.name)
            if want is not None and data.dtype.itemsize > 1 and data.dtype != want:
                raise GGUFError(f"tensor {info.name!r}: {info.type.name} data must be {want}, "
                                f"got {data.dtype}")
            return memoryview(np.ascontiguousarray(data).reshape(-1).view(np.uint8))
        if isinstance(data, (bytes, bytearray, memoryview)):
            try:
                return memoryview(data).cast("B")
            except TypeError as e:  # a non-contiguous memoryview
                raise GGUFError(f"tensor {info.name!r}: {e}") from None
        return None

    def _write_tensor(self, info: _TensorInfo, chunks) -> None:
        assert self._pos == self._data_start + info.offset
        done = 0
        for chunk in chunks:
            b = self._as_bytes(info, chunk)
            if b is None:
                raise GGUFError(f"tensor {info.name!r}: a chunk must be bytes-like or a numpy "
                                f"array, got {type(chunk).__name__}")
            if done + len(b) > info.nbytes:
                raise GGUFError(f"tensor {info.name!r}: chunks exceed its {info.nbytes} bytes")
            self._write(b)
            done += len(b)
        if done != info.nbytes:
            raise GGUFError(f"tensor {info.name!r}: chunks gave {done} of its {info.nbytes} bytes")
        self._write_padding()

    def _fsync_dir(self) -> None:
        # The rename is durable only once the directory entry is on disk.
        try:
            fd = os.open(os.path.dirname(os.path.abspath(self.path)), os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)


def write_gguf(path: str | os.PathLike, metadata: Mapping[str, Any],
               tensors: Mapping[str, tuple], alignment: int = GGUF_DEFAULT_ALIGNMENT) -> None:
    """Write a whole file at once.

    metadata: key -> value (inferred type) or ``Value(value, type, element_type)``.
    tensors: name -> (type, shape, data); shape in GGUF order, or None to take
    it from a numpy array (reversed) for the one-weight-per-block types.
    """
    with GGUFWriter(path, alignment=alignment) as w:
        for key, value in metadata.items():
            w.add_metadata(key, value)
        prepared = []
        for name, spec in tensors.items():
            if not isinstance(spec, tuple) or len(spec) != 3:
                raise GGUFError(f"tensor {name!r}: expected (type, shape, data)")
            ttype, shape, data = spec
            if shape is None:
                if not isinstance(data, np.ndarray) or tensor_type(ttype).block_size != 1:
                    raise GGUFError(f"tensor {name!r}: shape is needed unless data is a numpy "
                                    "array of a one-weight-per-block type")
                shape = tuple(reversed(data.shape))
            w.add_tensor_info(name, shape, ttype)
            prepared.append((name, data))
        for name, data in prepared:
            w.write_tensor_data(name, data)
