"""Read GGUF files through the C core's validating reader.

    with ds4py.gguf.open("model.gguf") as f:
        f.metadata["general.architecture"]       # -> "qwen35"
        f.tensors["token_embd.weight"].shape     # GGUF order: ne[0] first
        w = f.array("output_norm.weight")        # numpy, numpy order (dims reversed)

The core validates the whole file at open (see csrc/gguf.c); anything wrong
raises :class:`ds4py.GGUFError` carrying the core's message and ``.code`` (a
``ds4_status``).

Values
  - integers -> ``int``, FLOAT32/FLOAT64 -> ``float``, BOOL -> ``bool``
    (any nonzero byte is True: the format does not forbid other bytes and
    llama.cpp does not check them);
  - STRING -> ``str``; a string value that is not valid UTF-8 comes back as
    ``bytes`` rather than failing the whole file (llama.cpp accepts any bytes
    in values; keys and tensor names, which the core does validate, are
    always ``str``);
  - ARRAY -> ``list`` (arrays of arrays -> nested lists), whatever its length:
    numeric arrays are decoded with numpy and converted with ``.tolist()``,
    so a 150k-entry token-type array is a plain list of ints.
  ``metadata_types[key]`` gives the stored type: ``(ValueType.X,)`` for a
  scalar, ``(ValueType.ARRAY, element_type)`` for an array.

Lifetime
  ``array()`` (for F32/F16/F64/I8..I64) and ``raw()`` return read-only numpy
  views of the mapped file, not copies. Each view keeps the mapping alive:
  ``close()`` (or leaving the ``with`` block) detaches the file object at
  once -- every later access through it raises ``GGUFError`` -- and the
  mapping itself is released when the last view is gone. BF16 and quantized
  tensors are converted into a new float32 array (owned by numpy).
"""

from __future__ import annotations

import enum
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._core import check, ffi, lib, new_error
from .errors import GGUFError, QuantError

__all__ = ["open", "open_bytes", "GGUFFile", "TensorInfo", "ValueType"]


class ValueType(enum.IntEnum):
    """GGUF metadata value types (gguf.h enum gguf_type)."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# Fixed-size value types: struct format for scalars, numpy dtype for arrays.
_STRUCT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B",
           10: "<Q", 11: "<q", 12: "<d"}
_DTYPE = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1",
          10: "<u8", 11: "<i8", 12: "<f8"}

# Tensor types that are viewed as-is (no conversion) by array().
_NATIVE = {lib.DS4_TYPE_F32: "<f4", lib.DS4_TYPE_F16: "<f2", lib.DS4_TYPE_F64: "<f8",
           lib.DS4_TYPE_I8: "<i1", lib.DS4_TYPE_I16: "<i2", lib.DS4_TYPE_I32: "<i4",
           lib.DS4_TYPE_I64: "<i8"}

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's table entry. shape is in GGUF order (ne[0], the row
    length, first); offset is relative to the start of the data section."""

    name: str
    type_name: str
    type_id: int
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def _decode_str(b) -> str | bytes:
    try:
        return str(b, "utf-8")
    except UnicodeDecodeError:
        return bytes(b)


def _decode_array(mem: memoryview, pos: int, etype: int, count: int) -> tuple[list, int]:
    """Decode `count` elements of `etype` starting at mem[pos]; return the
    list and the position after it. The core has validated the layout."""
    if etype in _DTYPE:
        a = np.frombuffer(mem, dtype=_DTYPE[etype], count=count, offset=pos)
        end = pos + a.nbytes
        return ((a != 0).tolist() if etype == ValueType.BOOL else a.tolist()), end
    out: list[Any] = []
    if etype == ValueType.STRING:
        for _ in range(count):
            n = _U64.unpack_from(mem, pos)[0]
            pos += 8
            out.append(_decode_str(mem[pos:pos + n]))
            pos += n
        return out, pos
    # ARRAY: each element carries its own element type and count
    for _ in range(count):
        et = _U32.unpack_from(mem, pos)[0]
        n = _U64.unpack_from(mem, pos + 4)[0]
        sub, pos = _decode_array(mem, pos + 12, et, n)
        out.append(sub)
    return out, pos


class _Region:
    """A numpy-viewable piece of the mapping that holds the mapping alive
    (numpy keeps the object exposing __array_interface__ as the view's base)."""

    __slots__ = ("__array_interface__", "_owner")

    def __init__(self, owner: _Mapping, addr: int, shape: tuple[int, ...], typestr: str):
        self._owner = owner
        self.__array_interface__ = {"data": (addr, True), "shape": shape,
                                    "typestr": typestr, "version": 3}


class _Mapping:
    """Owns the core handle (and, for open_bytes, the caller's buffer)."""

    def __init__(self, handle, keepalive=None):
        self.handle = handle
        self._keepalive = keepalive
        # held here so __del__ works during interpreter shutdown, when module
        # globals may already be gone
        self._close = lib.ds4_gguf_close

    def __del__(self):
        h, self.handle = getattr(self, "handle", None), None
        if h is not None:
            self._close(h)


class GGUFFile:
    """An open, fully validated GGUF file. Use ``ds4py.gguf.open``."""

    def __init__(self, mapping: _Mapping, name: str):
        self._map: _Mapping | None = mapping
        self._name = name
        self._metadata: dict[str, Any] | None = None
        self._types: dict[str, tuple[ValueType, ...]] | None = None
        self._tensors: dict[str, TensorInfo] | None = None
        self._addr: dict[str, int] = {}
        h = mapping.handle
        self._version = int(lib.ds4_gguf_version(h))
        self._alignment = int(lib.ds4_gguf_alignment(h))
        self._data_offset = int(lib.ds4_gguf_data_offset(h))
        self._file_size = int(lib.ds4_gguf_file_size(h))

    # -- lifetime ---------------------------------------------------------
    def close(self) -> None:
        """Detach from the file. Views already handed out stay valid."""
        self._map = None
        self._addr = {}

    @property
    def closed(self) -> bool:
        return self._map is None

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._map is None else f"v{self._version}"
        return f"<ds4py.gguf.GGUFFile {self._name!r} {state}>"

    def _live(self) -> _Mapping:
        if self._map is None:
            raise GGUFError(f"GGUF file {self._name!r} is closed", 0)
        return self._map

    # -- header -----------------------------------------------------------
    @property
    def version(self) -> int:
        self._live()
        return self._version

    @property
    def alignment(self) -> int:
        self._live()
        return self._alignment

    @property
    def data_offset(self) -> int:
        """File offset of the data section (tensor offsets are relative to it)."""
        self._live()
        return self._data_offset

    @property
    def file_size(self) -> int:
        self._live()
        return self._file_size

    # -- metadata ---------------------------------------------------------
    def _load_metadata(self) -> None:
        h = self._live().handle
        err = new_error()
        kv = ffi.new("ds4_gguf_kv *")
        meta: dict[str, Any] = {}
        types: dict[str, tuple[ValueType, ...]] = {}
        for i in range(lib.ds4_gguf_n_kv(h)):
            check(lib.ds4_gguf_get_kv(h, i, kv, err), err, GGUFError)
            key = str(ffi.buffer(kv.key, kv.key_len), "utf-8")
            mem = memoryview(ffi.buffer(kv.value, kv.value_nbytes))
            t = kv.type
            if t == ValueType.STRING:
                val: Any = _decode_str(mem)
                types[key] = (ValueType.STRING,)
            elif t == ValueType.ARRAY:
                val, _ = _decode_array(mem, 0, kv.array_type, kv.array_count)
                types[key] = (ValueType.ARRAY, ValueType(kv.array_type))
            else:
                val = struct.unpack_from(_STRUCT[t], mem)[0]
                if t == ValueType.BOOL:
                    val = val != 0
                types[key] = (ValueType(t),)
            meta[key] = val
        self._metadata, self._types = meta, types

    @property
    def metadata(self) -> dict[str, Any]:
        """key -> value, in file order (decoded on first access)."""
        self._live()
        if self._metadata is None:
            self._load_metadata()
        return self._metadata  # type: ignore[return-value]

    @property
    def metadata_types(self) -> dict[str, tuple[ValueType, ...]]:
        """key -> (type,) or (ARRAY, element type)."""
        self._live()
        if self._types is None:
            self._load_metadata()
        return self._types  # type: ignore[return-value]

    # -- tensors ----------------------------------------------------------
    @property
    def tensors(self) -> dict[str, TensorInfo]:
        """name -> TensorInfo, in file order."""
        h = self._live().handle
        if self._tensors is None:
            err = new_error()
            t = ffi.new("ds4_gguf_tensor *")
            info = ffi.new("ds4_type_info *")
            type_names: dict[int, str] = {}
            out: dict[str, TensorInfo] = {}
            addr: dict[str, int] = {}
            for i in range(lib.ds4_gguf_n_tensors(h)):
                check(lib.ds4_gguf_get_tensor(h, i, t, err), err, GGUFError)
                name = str(ffi.buffer(t.name, t.name_len), "utf-8")
                tid = int(t.type)
                if tid not in type_names:
                    check(lib.ds4_type_get_info(tid, info, err), err, GGUFError)
                    type_names[tid] = ffi.string(info.name).decode("ascii")
                out[name] = TensorInfo(name, type_names[tid], tid,
                                       tuple(int(t.ne[d]) for d in range(t.n_dims)),
                                       int(t.offset), int(t.nbytes))
                addr[name] = int(ffi.cast("uintptr_t", t.data))
            self._tensors, self._addr = out, addr
        return self._tensors

    def _tensor(self, name: str) -> tuple[_Mapping, TensorInfo, int]:
        m = self._live()
        ti = self.tensors.get(name)
        if ti is None:
            raise GGUFError(f"no tensor named {name!r} in {self._name!r}",
                            lib.DS4_ERR_NOT_FOUND)
        return m, ti, self._addr[name]

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only 1-D uint8 view of the file."""
        m, ti, addr = self._tensor(name)
        return np.asarray(_Region(m, addr, (ti.nbytes,), "|u1"))

    def array(self, name: str) -> np.ndarray:
        """The tensor in numpy order (shape reversed from GGUF's).

        F32/F16/F64/I8/I16/I32/I64: a zero-copy read-only view in that dtype.
        BF16: a new float32 array (exact: bf16 is the top half of an f32).
        Quantized types: a new float32 array from the core's
        ds4_dequantize_row; a type without a dequantizer raises QuantError.
        """
        m, ti, addr = self._tensor(name)
        shape = tuple(reversed(ti.shape))
        if ti.type_id in _NATIVE:
            return np.asarray(_Region(m, addr, shape, _NATIVE[ti.type_id]))
        if ti.type_id == lib.DS4_TYPE_BF16:
            u16 = np.asarray(_Region(m, addr, (ti.n_elements,), "<u2"))
            return (u16.astype(np.uint32) << 16).view(np.float32).reshape(shape)
        out = np.empty(ti.n_elements, dtype=np.float32)
        err = new_error()
        # _Mapping m is referenced for the duration of the call, so the
        # source pointer stays mapped even if the file is closed meanwhile.
        check(lib.ds4_dequantize_row(lib.DS4_ISA_AUTO, ti.type_id, ffi.cast("void *", addr),
                                     ffi.cast("float *", ffi.from_buffer(out)), ti.n_elements,
                                     err), err, QuantError)
        return out.reshape(shape)


def _open_handle(opener, name: str, keepalive=None) -> GGUFFile:
    pp = ffi.new("ds4_gguf **")
    err = new_error()
    check(opener(pp, err), err, GGUFError)
    return GGUFFile(_Mapping(pp[0], keepalive), name)


def open(path: str | bytes | os.PathLike) -> GGUFFile:  # noqa: A001  (module-level API name)
    """Map and validate a GGUF file (read-only)."""
    bpath = os.fsencode(path)
    if b"\0" in bpath:
        raise GGUFError(f"path {os.fsdecode(bpath)!r} contains a NUL byte", lib.DS4_ERR_ARG)
    return _open_handle(lambda pp, err: lib.ds4_gguf_open(bpath, pp, err), os.fsdecode(bpath))


def open_bytes(data) -> GGUFFile:
    """Validate a GGUF held in memory (any bytes-like object; it is kept
    referenced for as long as the file or any view of it lives). A mutable
    buffer must not be changed while it is open."""
    buf = ffi.from_buffer(data)
    return _open_handle(lambda pp, err: lib.ds4_gguf_open_memory(buf, len(buf), pp, err),
                        "<memory>", keepalive=(data, buf))
