"""ds4py.gguf_writer: files read back identically by independent readers.

Three independent checks of what the writer emits:
  * gguf-py's own GGUFWriter, given the same content, writes the same bytes,
    and gguf-py's GGUFReader reads our keys/values/types and tensors back;
  * a small struct-based parser in this file (written from the GGUF spec, not
    from our writer) checks the layouts gguf-py cannot read: ds4's tensor
    types 36/37, nested and empty arrays, the inferred value types;
  * ds4py.gguf (the C reader), when it is built, reads our files back.
"""

from __future__ import annotations

import gc
import os
import stat
import struct
import tracemalloc

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ds4py import GGUFError
from ds4py.gguf_writer import GGUFWriter, Value, ValueType, tensor_type, write_gguf

V = ValueType


# ------------------------------------------------ independent GGUF parser --
# Written from the GGUF v3 spec (ggml docs/gguf.md), deliberately sharing
# nothing with ds4py.gguf_writer.

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
           10: "<Q", 11: "<q", 12: "<d"}


class _Buf:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def take(self, fmt: str):
        (v,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return v

    def string(self) -> bytes:
        n = self.take("<Q")
        s = self.data[self.pos:self.pos + n]
        assert len(s) == n, "string runs past the end of the file"
        self.pos += n
        return s

    def value(self, vtype: int):
        """(type, value); arrays are (9, (element_type, [values]))."""
        if vtype == 8:
            return vtype, self.string()
        if vtype == 9:
            et, n = self.take("<I"), self.take("<Q")
            return vtype, (et, [self.value(et)[1] for _ in range(n)])
        return vtype, self.take(_SCALAR[vtype])


def parse_gguf(path):
    with open(path, "rb") as f:
        data = f.read()
    b = _Buf(data)
    assert data[:4] == b"GGUF"
    b.pos = 4
    version, n_tensors, n_kv = b.take("<I"), b.take("<Q"), b.take("<Q")
    kv = {}
    for _ in range(n_kv):
        key = b.string().decode("utf-8")
        assert key not in kv
        kv[key] = b.value(b.take("<I"))
    tensors = []
    for _ in range(n_tensors):
        name = b.string().decode("utf-8")
        nd = b.take("<I")
        shape = tuple(b.take("<Q") for _ in range(nd))
        tensors.append((name, shape, b.take("<I"), b.take("<Q")))
    align = kv["general.alignment"][1] if "general.alignment" in kv else 32
    data_start = (b.pos + align - 1) // align * align
    assert data[b.pos:data_start] == bytes(data_start - b.pos), "header padding not zero"
    return {"version": version, "kv": kv, "tensors": tensors, "alignment": align,
            "data_start": data_start, "data": data}


# ------------------------------------------------- gguf-py byte comparison --

# Types whose sizes gguf-py 0.19 and ds4 agree on (gguf-py's Q8_1 is stale).
STD_TYPES = ["F32", "F16", "BF16", "F64", "I8", "I16", "I32", "Q4_0", "Q5_1", "Q8_0",
             "Q2_K", "Q4_K", "Q6_K", "IQ4_NL", "IQ4_XS"]


def test_std_type_sizes_agree_with_gguf_py():
    # If this fails, the comparison test below would compare apples to pears.
    for name in STD_TYPES:
        t = tensor_type(name)
        assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]] == (t.block_size,
                                                                           t.type_size), name


_INT_RANGES = {V.UINT8: (0, 2**8 - 1), V.INT8: (-2**7, 2**7 - 1), V.UINT16: (0, 2**16 - 1),
               V.INT16: (-2**15, 2**15 - 1), V.UINT32: (0, 2**32 - 1),
               V.INT32: (-2**31, 2**31 - 1), V.UINT64: (0, 2**64 - 1),
               V.INT64: (-2**63, 2**63 - 1)}
_TEXT = st.text(st.characters(codec="utf-8"), max_size=12)


def _scalar(t: ValueType):
    if t in _INT_RANGES:
        return st.integers(*_INT_RANGES[t])
    if t == V.FLOAT32:
        return st.floats(width=32, allow_nan=False)
    if t == V.FLOAT64:
        return st.floats(allow_nan=False)
    if t == V.BOOL:
        return st.booleans()
    return _TEXT


_SCALAR_TYPES = [t for t in ValueType if t != V.ARRAY]


@st.composite
def _kv(draw):
    t = draw(st.sampled_from(_SCALAR_TYPES + [V.ARRAY]))
    if t != V.ARRAY:
        return t, None, draw(_scalar(t))
    et = draw(st.sampled_from(_SCALAR_TYPES))
    return t, et, draw(st.lists(_scalar(et), min_size=1, max_size=6))


@st.composite
def _tensor(draw):
    tt = tensor_type(draw(st.sampled_from(STD_TYPES)))
    nd = draw(st.integers(1, 3))
    shape = [tt.block_size * draw(st.integers(1, 3))] + [draw(st.integers(1, 3))
                                                         for _ in range(nd - 1)]
    nbytes = int(np.prod(shape)) // tt.block_size * tt.type_size
    return tt.name, tuple(shape), draw(st.binary(min_size=nbytes, max_size=nbytes))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kvs=st.dictionaries(st.from_regex(r"[a-z]{1,6}(\.[a-z_]{1,6}){0,2}", fullmatch=True),
                           _kv(), max_size=6),
       tensors=st.dictionaries(st.from_regex(r"[a-z]{1,5}\.[a-z0-9_]{1,8}", fullmatch=True),
                               _tensor(), max_size=4),
       alignment=st.sampled_from([32, 1, 8, 64, 256]))
def test_same_bytes_as_gguf_py_and_reads_back(tmp_path_factory, kvs, tensors, alignment):
    kvs.pop("general.architecture", None)
    kvs.pop("general.alignment", None)
    d = tmp_path_factory.mktemp("rt")
    ours, theirs = d / "ours.gguf", d / "theirs.gguf"

    ref = gguf.GGUFWriter(str(theirs), arch="qwen35")  # adds general.architecture first
    with GGUFWriter(ours, alignment=alignment) as w:
        w.add_metadata("general.architecture", "qwen35")
        if alignment != 32:
            ref.add_custom_alignment(alignment)
            w.add_metadata("general.alignment", alignment, V.UINT32)
        for k, (t, et, v) in kvs.items():
            ref.add_key_value(k, v, gguf.GGUFValueType(t),
                              None if et is None else gguf.GGUFValueType(et))
            w.add_metadata(k, v, t, et)
        for name, (tname, shape, raw) in tensors.items():
            tt = tensor_type(tname)
            np_byte_shape = tuple(reversed(shape[1:])) + (shape[0] // tt.block_size
                                                          * tt.type_size,)
            ref.add_tensor(name, np.frombuffer(raw, np.uint8).reshape(np_byte_shape),
                           raw_dtype=gguf.GGMLQuantizationType[tname])
            w.add_tensor_info(name, shape, tname)
        for name, (_, _, raw) in tensors.items():
            w.write_tensor_data(name, raw)
    ref.write_header_to_file()
    ref.write_kv_data_to_file()
    ref.write_tensors_to_file()
    ref.close()
    assert ours.read_bytes() == theirs.read_bytes()

    r = gguf.GGUFReader(str(ours))
    assert r.alignment == alignment
    fields = {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}
    assert list(fields)[:1] == ["general.architecture"]
    for k, (t, et, v) in kvs.items():
        f = fields[k]
        assert [int(x) for x in f.types] == ([t] if et is None else [t, et]), k
        got = f.contents()
        if t == V.FLOAT32 or et == V.FLOAT32:
            # Float32 values came from width=32 floats: exact after f32 storage.
            assert np.array_equal(np.float32(got), np.float32(v)), k
        else:
            assert got == v, k
    assert [t.name for t in r.tensors] == list(tensors)
    offset = 0
    for rt, (tname, shape, raw) in zip(r.tensors, tensors.values(), strict=True):
        assert rt.tensor_type.name == tname
        assert tuple(int(x) for x in rt.shape) == shape
        assert rt.data_offset == r.data_offset + offset
        assert rt.data_offset % alignment == 0
        assert bytes(rt.data.tobytes()) == raw
        offset += -(-len(raw) // alignment) * alignment

    with _ds4_open(ours) as g:
        assert g.alignment == alignment and g.data_offset == r.data_offset
        for k, (t, et, v) in kvs.items():
            assert g.metadata_types[k] == ((t,) if et is None else (t, et)), k
            assert g.metadata[k] == v, k
        assert {n: (ti.type_name, ti.shape) for n, ti in g.tensors.items()} == {
            n: (tname, shape) for n, (tname, shape, _) in tensors.items()}
        for name, (_, _, raw) in tensors.items():
            assert g.raw(name).tobytes() == raw


# -------------------------------------------------- ds4-only types by hand --

def _s(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


def test_q4_64a_q2_64a_layout_by_hand(tmp_path):
    # Sizes from the ds4 notes (not the core's table): Q4_64A 64 weights in
    # 36 bytes, Q2_64A 64 weights in 20 bytes.
    rng = np.random.default_rng(1)
    up = rng.integers(0, 256, 2 * 2 * 36, dtype=np.uint8).tobytes()    # 128 x 2 weights
    down = rng.integers(0, 256, 20, dtype=np.uint8).tobytes()         # 64 weights
    p = tmp_path / "ds4only.gguf"
    with GGUFWriter(p) as w:
        w.add_metadata("general.architecture", "qwen35")
        w.add_tensor_info("blk.0.ffn_up.weight", (128, 2), "Q4_64A")
        w.add_tensor_info("blk.0.ffn_down.weight", (64,), 37, nbytes=20)
        w.write_tensor_data("blk.0.ffn_up.weight", up)
        w.write_tensor_data("blk.0.ffn_down.weight", [down[:7], np.frombuffer(down[7:], np.uint8)])
    header = (b"GGUF" + struct.pack("<IQQ", 3, 2, 1)
              + _s(b"general.architecture") + struct.pack("<I", 8) + _s(b"qwen35")
              + _s(b"blk.0.ffn_up.weight") + struct.pack("<IQQIQ", 2, 128, 2, 36, 0)
              + _s(b"blk.0.ffn_down.weight") + struct.pack("<IQIQ", 1, 64, 37, 160))
    header += bytes(-len(header) % 32)
    expected = header + up + bytes(160 - 144) + down + bytes(32 - 20)
    assert p.read_bytes() == expected
    with pytest.raises(ValueError, match="36"):  # gguf-py cannot read type 36: why we write our own
        gguf.GGUFReader(str(p))
    _read_back_with_ds4py(p, {"blk.0.ffn_up.weight": ((128, 2), 36, up),
                              "blk.0.ffn_down.weight": ((64,), 37, down)})


def _ds4_open(path):
    """Read back with ds4py's own C reader (an independent implementation of
    the format from this writer's)."""
    import ds4py.gguf as dg
    return dg.open(str(path))


def _read_back_with_ds4py(path, expected: dict):
    with _ds4_open(path) as g:
        assert list(g.tensors) == list(expected)
        for name, (shape, tid, raw) in expected.items():
            assert g.raw(name).tobytes() == raw, name
            assert g.tensors[name].shape == shape, name
            assert g.tensors[name].type_id == tid, name


def _plain(v):
    """Our parser's (type, value) tree -> the reader's Python values."""
    t, x = v
    if t == V.STRING:
        try:
            return x.decode("utf-8")
        except UnicodeDecodeError:
            return x
    if t == V.ARRAY:
        et, items = x
        return [_plain((et, i)) for i in items]
    return x


# ----------------------------------------------------- type inference rules --

INFERRED = [
    (True, V.BOOL, True),
    (5, V.INT32, 5),
    (-2**31, V.INT32, -2**31),
    (2**31, V.INT64, 2**31),
    (-2**63, V.INT64, -2**63),
    (2**63, V.UINT64, 2**63),
    (1.5, V.FLOAT32, 1.5),
    ("héllo", V.STRING, "héllo".encode()),
    (b"\xff\x00raw", V.STRING, b"\xff\x00raw"),   # bytes are written as given
    (np.uint16(7), V.UINT16, 7),
    (np.int8(-3), V.INT8, -3),
    (np.float64(0.1), V.FLOAT64, 0.1),
    (np.float16(0.5), V.FLOAT32, 0.5),
    (np.bool_(False), V.BOOL, False),
    ([1, 2], V.ARRAY, (V.INT32, [1, 2])),
    ([1, 2**40], V.ARRAY, (V.INT64, [1, 2**40])),
    ([0, 2**64 - 1], V.ARRAY, (V.UINT64, [0, 2**64 - 1])),
    ([1, 2.5], V.ARRAY, (V.FLOAT32, [1.0, 2.5])),
    ([True, False], V.ARRAY, (V.BOOL, [True, False])),
    (["a", "bé"], V.ARRAY, (V.STRING, [b"a", "bé".encode()])),
    ([], V.ARRAY, (V.INT32, [])),
    ([[1], [2.5, 3]], V.ARRAY, (V.ARRAY, [(V.INT32, [1]), (V.FLOAT32, [2.5, 3.0])])),
    ([[]], V.ARRAY, (V.ARRAY, [(V.INT32, [])])),
    (np.arange(3, dtype=np.int8), V.ARRAY, (V.INT8, [0, 1, 2])),
    (np.array([0.25, 1], np.float32), V.ARRAY, (V.FLOAT32, [0.25, 1.0])),
    (np.str_("np"), V.STRING, b"np"),
    (np.array(["a", "bc"]), V.ARRAY, (V.STRING, [b"a", b"bc"])),
    (np.array([1, 2**40], dtype=object), V.ARRAY, (V.INT64, [1, 2**40])),
    (np.array([[1, 2], [3, 4]], np.uint8), V.ARRAY,
     (V.ARRAY, [(V.UINT8, [1, 2]), (V.UINT8, [3, 4])])),
]


def test_inferred_types(tmp_path):
    p = tmp_path / "infer.gguf"
    with GGUFWriter(p) as w:
        for i, (value, _, _) in enumerate(INFERRED):
            w.add_metadata(f"k{i}", value)
    kv = parse_gguf(p)["kv"]
    for i, (value, t, expect) in enumerate(INFERRED):
        assert kv[f"k{i}"] == (t, expect), (value, kv[f"k{i}"])
    with _ds4_open(p) as g:
        for i, (_, t, expect) in enumerate(INFERRED):
            assert g.metadata[f"k{i}"] == _plain((t, expect)), i
            assert g.metadata_types[f"k{i}"][0] == t
            if t == V.ARRAY:
                assert g.metadata_types[f"k{i}"][1] == expect[0]


EXPLICIT_OK = [
    (255, V.UINT8, None, (V.UINT8, 255)),
    (-1, V.INT64, None, (V.INT64, -1)),
    (3, V.FLOAT64, None, (V.FLOAT64, 3.0)),
    (1, V.BOOL, None, (V.BOOL, True)),
    (1e39, V.FLOAT64, None, (V.FLOAT64, 1e39)),
    ([1, 2], None, V.UINT8, (V.ARRAY, (V.UINT8, [1, 2]))),
    ([1, 2], V.ARRAY, V.INT16, (V.ARRAY, (V.INT16, [1, 2]))),
    ([], V.ARRAY, V.STRING, (V.ARRAY, (V.STRING, []))),
    (np.array([1, 2], np.int64), V.ARRAY, V.UINT32, (V.ARRAY, (V.UINT32, [1, 2]))),
    ([1.0, 2.0], "array", "float64", (V.ARRAY, (V.FLOAT64, [1.0, 2.0]))),
    (Value(9, V.UINT16), None, None, (V.UINT16, 9)),
]


def test_explicit_types(tmp_path):
    p = tmp_path / "explicit.gguf"
    with GGUFWriter(p) as w:
        for i, (value, t, et, _) in enumerate(EXPLICIT_OK):
            w.add_metadata(f"k{i}", value, t, et)
    kv = parse_gguf(p)["kv"]
    for i, (*_, expect) in enumerate(EXPLICIT_OK):
        assert kv[f"k{i}"] == expect, EXPLICIT_OK[i]
    with _ds4_open(p) as g:
        for i, (*_, expect) in enumerate(EXPLICIT_OK):
            assert g.metadata[f"k{i}"] == _plain(expect), i


@pytest.mark.parametrize("value,t,et", [
    (256, V.UINT8, None), (-1, V.UINT32, None), (2**63, V.INT64, None),
    (2**64, None, None), (1.5, V.INT32, None), ("7", V.INT32, None), (2, V.BOOL, None),
    (1e39, V.FLOAT32, None), (1e39, None, None), (5, V.STRING, None),
    ([1, 300], None, V.UINT8), ([1.5], None, V.INT32), ([1, "a"], None, None),
    ([None], None, None), (None, None, None), ({}, None, None), (np.array([1j]), None, None),
    ([1e39], None, V.FLOAT32), ("x", V.ARRAY, None), (5, V.INT32, V.INT32), (1, 99, None),
    ("\ud800", None, None),   # a lone surrogate is not UTF-8
    (["ok", "\ud800"], None, None), ([1, 2**1100], None, V.FLOAT64),
])
def test_bad_metadata_values(tmp_path, value, t, et):
    with GGUFWriter(tmp_path / "x.gguf") as w:
        with pytest.raises(GGUFError):
            w.add_metadata("k", value, t, et)
    # A refused value left nothing behind: the key is still free.
    assert "k" not in parse_gguf(tmp_path / "x.gguf")["kv"]


# ------------------------------------------------------------ bad requests --

def test_bad_requests(tmp_path):
    p = tmp_path / "bad.gguf"
    with GGUFWriter(p) as w:
        w.add_metadata("a", 1)
        with pytest.raises(GGUFError, match="duplicate metadata key 'a'"):
            w.add_metadata("a", 2)
        for bad_key in ("", 5, "\udcff"):
            with pytest.raises(GGUFError):
                w.add_metadata(bad_key, 1)
        with pytest.raises(GGUFError, match="general.alignment"):
            w.add_metadata("general.alignment", 64)   # writer was made with 32
        with pytest.raises(GGUFError, match="t0.*Q9_9"):
            w.add_tensor_info("t0", (32,), "Q9_9")
        with pytest.raises(GGUFError, match="t0.*38"):
            w.add_tensor_info("t0", (32,), 38)      # an id the table leaves free
        with pytest.raises(GGUFError, match="t0.*nbytes=33"):
            w.add_tensor_info("t0", (32,), "Q8_0", nbytes=33)
        with pytest.raises(GGUFError, match="t0.*block size 256"):
            w.add_tensor_info("t0", (128, 2), "Q4_K")
        for shape in [(), (0,), (-32,), (32, 1, 1, 1, 1), (32.0,), 32, (2**31, 2**31, 2**2)]:
            with pytest.raises(GGUFError, match="t0"):
                w.add_tensor_info("t0", shape, "F32")
        with pytest.raises(GGUFError, match="too long|at most"):
            w.add_tensor_info("x" * 64, (1,), "F32")
        w.add_tensor_info("x" * 63, (1,), "F32")      # the longest name ggml reads
        w.add_tensor_info("t1", (32,), "q8_0")        # names are case-insensitive
        w.add_tensor_info("t2", (4,), gguf.GGMLQuantizationType.F32)
        with pytest.raises(GGUFError, match="duplicate tensor 't1'"):
            w.add_tensor_info("t1", (32,), "Q8_0")

        with pytest.raises(GGUFError, match="'t1' written out of order.*'x{63}' is next"):
            w.write_tensor_data("t1", bytes(34))
        with pytest.raises(GGUFError, match="'nope' was not declared"):
            w.write_tensor_data("nope", bytes(4))
        with pytest.raises(GGUFError, match="got 3 bytes.*takes 4"):
            w.write_tensor_data("x" * 63, bytes(3))
        with pytest.raises(GGUFError, match="must be float32, got float64"):
            w.write_tensor_data("x" * 63, np.zeros(1, np.float64)[:1])  # 8 bytes anyway
        with pytest.raises(GGUFError, match="data must be"):
            w.write_tensor_data("x" * 63, 1.0)
        # Errors found before any byte is written leave the writer usable.
        w.write_tensor_data("x" * 63, np.float32([1.0]))
        with pytest.raises(GGUFError, match="before any tensor data"):
            w.add_metadata("late", 1)
        with pytest.raises(GGUFError, match="before any tensor data"):
            w.add_tensor_info("late", (1,), "F32")
        w.write_tensor_data("t1", bytes(range(34)))
        w.write_tensor_data("t2", np.float32([1, 2, 3, 4]).view(np.uint8))  # raw bytes are fine
        with pytest.raises(GGUFError, match="already written"):
            w.write_tensor_data("t2", bytes(16))
    f = parse_gguf(p)
    assert [t[0] for t in f["tensors"]] == ["x" * 63, "t1", "t2"]
    assert f["kv"] == {"a": (V.INT32, 1)}


@pytest.mark.parametrize("alignment", [0, 3, 48, -32, 2**32, 32.0, True])
def test_bad_alignment(tmp_path, alignment):
    with pytest.raises(GGUFError, match="alignment"):
        GGUFWriter(tmp_path / "a.gguf", alignment=alignment)
    assert os.listdir(tmp_path) == []


def test_alignment_key_written_when_not_default(tmp_path):
    p = tmp_path / "a.gguf"
    write_gguf(p, {"x": 1}, {"t": ("F32", None, np.ones((2, 3), np.float32))}, alignment=4096)
    f = parse_gguf(p)
    assert f["kv"]["general.alignment"] == (V.UINT32, 4096)
    assert f["data_start"] % 4096 == 0 and len(f["data"]) == f["data_start"] + 4096
    assert f["tensors"] == [("t", (3, 2), 0, 0)]
    r = gguf.GGUFReader(str(p))
    assert r.alignment == 4096
    assert np.array_equal(r.tensors[0].data, np.ones((2, 3), np.float32))
    # Default alignment: no key (readers assume 32).
    write_gguf(p, {}, {})
    assert parse_gguf(p)["kv"] == {}


def test_write_gguf_convenience(tmp_path):
    p = tmp_path / "c.gguf"
    emb = np.arange(64 * 3, dtype=np.float16).reshape(3, 64)
    q = bytes(range(36))
    write_gguf(p, {"general.architecture": "qwen35", "n": Value(24, V.UINT32),
                   "scores": np.float32([0.5, -1])},
               {"emb": ("F16", None, emb), "w": ("Q4_64A", (64,), q)})
    f = parse_gguf(p)
    assert f["kv"] == {"general.architecture": (V.STRING, b"qwen35"), "n": (V.UINT32, 24),
                       "scores": (V.ARRAY, (V.FLOAT32, [0.5, -1.0]))}
    assert f["tensors"] == [("emb", (64, 3), 1, 0), ("w", (64,), 36, 384)]
    ds = f["data_start"]
    assert f["data"][ds:ds + 384] == emb.tobytes()
    assert f["data"][ds + 384:ds + 384 + 36] == q
    with pytest.raises(GGUFError, match="shape is needed"):
        write_gguf(p, {}, {"w": ("Q8_0", None, np.zeros(34, np.uint8))})
    assert parse_gguf(p)["tensors"][0][0] == "emb"   # failed call left the old file


# -------------------------------------------------------------- streaming --

def test_streaming_memory_does_not_grow_with_size(tmp_path):
    mib = 1 << 20
    n_chunks = 64
    p = tmp_path / "big.gguf"

    def chunks():
        for i in range(n_chunks):
            yield np.full(mib, i, np.uint8)

    tracemalloc.start()
    try:
        with GGUFWriter(p) as w:
            w.add_tensor_info("big", (n_chunks * mib,), "I8")
            w.add_tensor_info("tail", (32,), "Q8_0")
            w.write_tensor_data("big", chunks())
            w.write_tensor_data("tail", bytes(34))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # One 1 MiB chunk alive at a time plus file buffers: joining the chunks
    # would peak at >= 64 MiB. 8 MiB leaves room for numpy/IO overheads.
    assert peak < 8 * mib, peak
    f = parse_gguf(p)
    ds = f["data_start"]
    assert f["tensors"][1][3] == n_chunks * mib
    for i in (0, 1, 37, n_chunks - 1):
        blob = f["data"][ds + i * mib: ds + (i + 1) * mib]
        assert blob == bytes([i]) * mib


@pytest.mark.parametrize("chunks,msg", [
    ([bytes(20), bytes(20)], "exceed"),
    ([bytes(20)], "gave 20 of its 34"),
    ([bytes(20), "not bytes"], "a chunk must be"),
    ([bytes(20), np.zeros(7, np.float64)], "exceed"),
])
def test_bad_stream_aborts(tmp_path, chunks, msg):
    p = tmp_path / "s.gguf"
    w = GGUFWriter(p)
    w.add_tensor_info("t", (32,), "Q8_0")
    with pytest.raises(GGUFError, match=msg):
        w.write_tensor_data("t", iter(chunks))
    assert os.listdir(tmp_path) == []
    with pytest.raises(GGUFError, match="aborted"):
        w.close()


# -------------------------------------------------------------- atomicity --

def _only_temp_files(d, name):
    return [f for f in os.listdir(d) if f != name]


def test_exception_mid_write_leaves_nothing(tmp_path):
    p = tmp_path / "m.gguf"
    seen = []

    def chunks():
        yield bytes(1000)
        # Mid-write: data goes to a temp file beside the destination — an
        # unnamed one (O_TMPFILE) where the OS allows, else a hidden name.
        seen.append((os.path.exists(p), _only_temp_files(tmp_path, "m.gguf")))
        raise RuntimeError("source died")

    with pytest.raises(RuntimeError, match="source died"):
        with GGUFWriter(p) as w:
            w.add_tensor_info("t", (4000,), "I8")
            w.write_tensor_data("t", chunks())
    assert seen[0][0] is False
    if w.anonymous:
        assert seen[0][1] == []
    else:
        assert len(seen[0][1]) == 1 and seen[0][1][0].startswith(".m.gguf.")
    assert os.listdir(tmp_path) == []


def test_exception_in_with_block_leaves_nothing(tmp_path):
    p = tmp_path / "m.gguf"
    with pytest.raises(KeyError):
        with GGUFWriter(p) as w:
            w.add_tensor_info("t", (4,), "F32")
            w.write_tensor_data("t", np.zeros(4, np.float32))
            raise KeyError("caller failed after all data")
    assert os.listdir(tmp_path) == []


def test_overwrite_replaces_only_on_success(tmp_path):
    p = tmp_path / "o.gguf"
    p.write_bytes(b"old contents")
    os.chmod(p, 0o600)
    during = []

    def chunks(fail):
        yield bytes(8)
        during.append(p.read_bytes())
        if fail:
            raise OSError("disk on fire")
        yield bytes(8)

    with pytest.raises(OSError):
        with GGUFWriter(p) as w:
            w.add_tensor_info("t", (16,), "I8")
            w.write_tensor_data("t", chunks(fail=True))
    assert p.read_bytes() == b"old contents"
    assert os.listdir(tmp_path) == ["o.gguf"]

    with GGUFWriter(p) as w:
        w.add_tensor_info("t", (16,), "I8")
        w.write_tensor_data("t", chunks(fail=False))
        assert p.read_bytes() == b"old contents"     # not yet closed
    assert during == [b"old contents", b"old contents"]
    assert parse_gguf(p)["tensors"] == [("t", (16,), 24, 0)]
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o600   # the replaced file's mode
    assert os.listdir(tmp_path) == ["o.gguf"]


def test_close_before_all_data_written(tmp_path):
    p = tmp_path / "c.gguf"
    p.write_bytes(b"keep me")
    w = GGUFWriter(p)
    w.add_tensor_info("a", (4,), "F32")
    w.add_tensor_info("b", (4,), "F32")
    w.write_tensor_data("a", np.zeros(4, np.float32))
    with pytest.raises(GGUFError, match=r"missing \['b'\]"):
        w.close()
    assert p.read_bytes() == b"keep me"
    assert os.listdir(tmp_path) == ["c.gguf"]
    with pytest.raises(GGUFError):
        w.write_tensor_data("b", np.zeros(4, np.float32))


def test_abandoned_writer_removes_its_temp_file(tmp_path):
    w = GGUFWriter(tmp_path / "z.gguf")
    w.add_tensor_info("a", (4,), "F32")
    assert len(os.listdir(tmp_path)) == (0 if w.anonymous else 1)
    del w
    gc.collect()
    assert os.listdir(tmp_path) == []


def test_new_file_mode_follows_umask(tmp_path):
    old = os.umask(0o027)
    try:
        write_gguf(tmp_path / "u.gguf", {}, {})
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "u.gguf").st_mode) == 0o640


def test_named_temp_fallback_still_atomic(tmp_path, monkeypatch):
    # Where O_TMPFILE is unavailable the writer uses a hidden named temp file;
    # force that path and check the same guarantees.
    import ds4py.gguf_writer as gw

    monkeypatch.setattr(gw, "_open_anonymous", lambda directory: None)
    p = tmp_path / "n.gguf"
    with pytest.raises(RuntimeError):
        with GGUFWriter(p) as w:
            assert not w.anonymous
            w.add_tensor_info("t", (4,), "F32")
            assert len(_only_temp_files(tmp_path, "n.gguf")) == 1
            raise RuntimeError("x")
    assert os.listdir(tmp_path) == []
    write_gguf(p, {"k": 1}, {"t": ("F32", (4,), np.zeros(4, np.float32))})
    assert os.listdir(tmp_path) == ["n.gguf"]


def test_anonymous_temp_is_invisible_until_close(tmp_path):
    w = GGUFWriter(tmp_path / "a.gguf")
    if not w.anonymous:
        w.abort()
        pytest.skip("this OS/filesystem has no O_TMPFILE: the named-temp path is tested above")
    w.add_tensor_info("t", (4,), "F32")
    w.write_tensor_data("t", np.arange(4, dtype=np.float32))
    assert os.listdir(tmp_path) == []      # nothing a crash could leave behind
    w.close()
    assert os.listdir(tmp_path) == ["a.gguf"]
    import ds4py

    with ds4py.gguf.open(tmp_path / "a.gguf") as f:
        assert f.array("t").tolist() == [0.0, 1.0, 2.0, 3.0]
