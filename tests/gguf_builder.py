"""Build raw GGUF bytes field by field, so tests can craft malformed files.

Deliberately independent of ds4py: it writes the format as the GGUF spec
(ggml docs/gguf.md) lays it out, and every field can be overridden with a
wrong value (counts, lengths, types, dims, offsets).

    b = Builder()
    b.kv("general.architecture", STRING, "qwen35")
    b.kv("a.list", ARRAY, Arr(UINT32, [1, 2, 3]))
    b.tensor("w", [64, 2], F32)            # data filled with a byte pattern
    blob = b.build()
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import gguf as _gguf_py

# metadata value types (gguf.h enum gguf_type)
(UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64,
 FLOAT64) = range(13)

_FMT = {UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i",
        FLOAT32: "<f", BOOL: "<B", UINT64: "<Q", INT64: "<q", FLOAT64: "<d"}

# ggml type ids used by the tests
F32, F16, Q4_0, Q8_0, Q8_1, Q4_K = 0, 1, 2, 8, 9, 12
I8, I32, BF16, Q4_64A, Q2_64A = 24, 26, 30, 36, 37

# (block size, bytes per block) per ggml type id. From gguf-py's table, with
# ds4's own ids 36/37 (ds4-notes: Q4_64A = 32 code bytes + bf16 scale + bf16
# bias per 64 weights; Q2_64A = 16 + 2 + 2) and Q8_1 as ggml's block_q8_1
# (2 fp16 + 32 int8 = 36 bytes; gguf-py 0.19 still says 40).
TYPE_SIZES: dict[int, tuple[int, int]] = {int(k): v for k, v in _gguf_py.GGML_QUANT_SIZES.items()}
TYPE_SIZES.update({Q4_64A: (64, 36), Q2_64A: (64, 20), Q8_1: (32, 36)})


def u8(v: int) -> bytes:
    return struct.pack("<B", v & 0xFF)


def u32(v: int) -> bytes:
    return struct.pack("<I", v & 0xFFFFFFFF)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v & 0xFFFFFFFFFFFFFFFF)


def gstr(s: str | bytes, length: int | None = None) -> bytes:
    """A GGUF string: u64 length + bytes; `length` overrides the stored length."""
    b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    return u64(len(b) if length is None else length) + b


@dataclass
class Arr:
    """An array value: element type + items (items of an ARRAY-typed array are
    Arr themselves). `count` overrides the stored element count."""

    etype: int
    items: list
    count: int | None = None


def value(vtype: int, v: Any) -> bytes:
    """Encoding of a value of `vtype` (without the leading value type)."""
    if vtype == STRING:
        return gstr(v)
    if vtype == ARRAY:
        assert isinstance(v, Arr)
        out = u32(v.etype) + u64(len(v.items) if v.count is None else v.count)
        return out + b"".join(value(v.etype, it) for it in v.items)
    if vtype == BOOL:
        return u8(int(v))
    return struct.pack(_FMT[vtype], v)


def nested(depth: int, leaf_type: int = UINT8, leaf: list | None = None) -> Arr:
    """An array nested `depth` levels deep (depth 1 = a plain array)."""
    a = Arr(leaf_type, [1, 2] if leaf is None else leaf)
    for _ in range(depth - 1):
        a = Arr(ARRAY, [a])
    return a


def tensor_nbytes(dims: list[int], ttype: int) -> int:
    bs, ts = TYPE_SIZES[ttype]
    n = 1
    for d in dims:
        n *= d
    return n // bs * ts


@dataclass
class _Tensor:
    name: bytes
    dims: list[int]
    ttype: int
    offset: int | None
    data: bytes
    n_dims: int | None
    name_len: int | None


@dataclass
class Builder:
    """Assembles header + kvs + tensor infos + padding + data.

    `alignment` is the layout alignment (data start and auto-placed tensor
    offsets); it does NOT add a general.alignment kv -- add that yourself."""

    version: int = 3
    magic: bytes = b"GGUF"
    alignment: int = 32
    kvs: list[bytes] = field(default_factory=list)
    tensors: list[_Tensor] = field(default_factory=list)

    def kv(self, key: str | bytes, vtype: int, val: Any = None, *, key_len: int | None = None,
           raw_value: bytes | None = None) -> Builder:
        body = raw_value if raw_value is not None else value(vtype, val)
        self.kvs.append(gstr(key, key_len) + u32(vtype) + body)
        return self

    def raw_kv(self, blob: bytes) -> Builder:
        self.kvs.append(blob)
        return self

    def tensor(self, name: str | bytes, dims: list[int], ttype: int, data: bytes | None = None,
               *, offset: int | None = None, n_dims: int | None = None,
               name_len: int | None = None) -> Builder:
        """`data` None: a byte pattern of the type's exact size (so dims and
        type must be valid); pass data=b"" for a tensor whose bytes are absent."""
        if data is None:
            n = tensor_nbytes(dims, ttype)
            data = bytes((i * 7 + len(self.tensors)) & 0xFF for i in range(n))
        nm = name.encode("utf-8") if isinstance(name, str) else bytes(name)
        self.tensors.append(_Tensor(nm, list(dims), ttype, offset, data, n_dims, name_len))
        return self

    def _place(self) -> list[int]:
        offs, cur = [], 0
        for t in self.tensors:
            if t.offset is None:
                cur = -(-cur // self.alignment) * self.alignment
                offs.append(cur)
                cur += len(t.data)
            else:
                offs.append(t.offset)
        return offs

    def header(self, n_tensors: int | None = None, n_kv: int | None = None) -> bytes:
        return (self.magic + u32(self.version)
                + u64(len(self.tensors) if n_tensors is None else n_tensors)
                + u64(len(self.kvs) if n_kv is None else n_kv))

    def build(self, *, n_tensors: int | None = None, n_kv: int | None = None,
              pad: bool = True) -> bytes:
        """pad=False leaves out the padding before the data section."""
        offs = self._place()
        infos = []
        for t, off in zip(self.tensors, offs, strict=True):
            infos.append(gstr(t.name, t.name_len))
            infos.append(u32(len(t.dims) if t.n_dims is None else t.n_dims))
            infos.extend(u64(d) for d in t.dims)
            infos.append(u32(t.ttype) + u64(off))
        head = self.header(n_tensors, n_kv) + b"".join(self.kvs) + b"".join(infos)
        if pad:
            head += b"\0" * (-len(head) % self.alignment)
        placed = list(zip(self.tensors, offs, strict=True))
        end = max((off + len(t.data) for t, off in placed if t.data), default=0)
        data = bytearray(end)
        for t, off in placed:
            if t.data:
                data[off:off + len(t.data)] = t.data
        return head + bytes(data)
