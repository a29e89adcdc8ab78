"""ds4py.gguf agrees with gguf-py's GGUFReader (the reference reader) on files
written by gguf-py's GGUFWriter and by tests/gguf_builder.py, and its values
match what the test put in."""

from __future__ import annotations

import gc
import math
import os
import struct
import tempfile
import time

import gguf
import gguf_builder as gb
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ds4py
from ds4py import GGUFError
from ds4py.gguf import ValueType

VT = gguf.GGUFValueType
QT = gguf.GGMLQuantizationType


# ------------------------------------------------------------- helpers --

def same_value(a, b) -> bool:
    """Equal, treating NaN == NaN (both readers decode the same bytes)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def same_list(a: list, b: list) -> bool:
    return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))


def flatten(v):
    if isinstance(v, list):
        out = []
        for x in v:
            out.extend(flatten(x) if isinstance(x, list) else [x])
        return out
    return [v]


def compare_with_gguf_py(path: str) -> ds4py.GGUFFile:
    """Assert ds4py and gguf-py read `path` identically; return our file."""
    r = gguf.GGUFReader(path)
    f = ds4py.gguf.open(path)
    assert f.version == r.fields["GGUF.version"].contents()
    assert f.alignment == int(r.alignment)
    assert f.data_offset == r.data_offset
    assert f.file_size == os.path.getsize(path)

    keys = [k for k in r.fields if not k.startswith("GGUF.")]
    assert list(f.metadata) == keys  # same keys, file order
    for k in keys:
        field, ours, types = r.fields[k], f.metadata[k], f.metadata_types[k]
        assert types[0] == field.types[0], k
        if types[0] == ValueType.ARRAY:
            # gguf-py records the element type only when the array is non-empty
            if field.types[1:]:
                assert types[1] == field.types[1], k
            else:
                assert ours == [], k
            # gguf-py flattens arrays of arrays; compare the leaves in order
            assert same_list(flatten(ours), field.contents()), k
        else:
            assert same_value(ours, field.contents()), (k, ours, field.contents())

    assert list(f.tensors) == [t.name for t in r.tensors]
    for rt in r.tensors:
        ti = f.tensors[rt.name]
        assert ti.type_id == int(rt.tensor_type)
        assert ti.type_name == rt.tensor_type.name
        assert ti.shape == tuple(int(d) for d in rt.shape)
        assert f.data_offset + ti.offset == rt.data_offset
        assert ti.nbytes == rt.n_bytes
        assert f.raw(rt.name).tobytes() == rt.data.tobytes()
        if rt.tensor_type in (QT.F32, QT.F16, QT.F64, QT.I8, QT.I16, QT.I32, QT.I64):
            a = f.array(rt.name)
            assert a.dtype == rt.data.dtype and a.shape == rt.data.shape
            assert a.tobytes() == rt.data.tobytes()  # bitwise, NaN-safe
            assert not a.flags.writeable
    return f


def write_with_gguf_py(path, kvs=(), tensors=(), alignment=None):
    """kvs: (key, value, vtype, sub_type); tensors: (name, array, raw_dtype)."""
    w = gguf.GGUFWriter(path, "qwen35")
    if alignment:
        w.add_custom_alignment(alignment)
    for key, val, vtype, sub in kvs:
        w.add_key_value(key, val, vtype, sub)
    for name, arr, raw_dtype in tensors:
        w.add_tensor(name, arr, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


RNG = np.random.default_rng(1234)

RICH_KVS = [
    ("t.u8", 200, VT.UINT8, None), ("t.i8", -100, VT.INT8, None),
    ("t.u16", 60000, VT.UINT16, None), ("t.i16", -30000, VT.INT16, None),
    ("t.u32", 4_000_000_000, VT.UINT32, None), ("t.i32", -2_000_000_000, VT.INT32, None),
    ("t.f32", 0.1, VT.FLOAT32, None), ("t.f32.inf", float("-inf"), VT.FLOAT32, None),
    ("t.u64", 2**64 - 1, VT.UINT64, None), ("t.i64", -2**63, VT.INT64, None),
    ("t.f64", 1e300, VT.FLOAT64, None), ("t.bool.t", True, VT.BOOL, None),
    ("t.bool.f", False, VT.BOOL, None), ("t.str", "h\u00e9llo \u2603 \U0001F600", VT.STRING, None),
    ("t.str.empty", "", VT.STRING, None),
    ("a.u8", [0, 1, 255], VT.ARRAY, VT.UINT8), ("a.i8", [-128, 127], VT.ARRAY, VT.INT8),
    ("a.u16", [1, 65535], VT.ARRAY, VT.UINT16), ("a.i16", [-32768, 5], VT.ARRAY, VT.INT16),
    ("a.u32", [7, 2**32 - 1], VT.ARRAY, VT.UINT32), ("a.i32", [-1, 3], VT.ARRAY, VT.INT32),
    ("a.f32", [0.5, -2.25, 1e-30], VT.ARRAY, VT.FLOAT32),
    ("a.u64", [2**63, 1], VT.ARRAY, VT.UINT64), ("a.i64", [-5, 2**62], VT.ARRAY, VT.INT64),
    ("a.f64", [math.pi, -0.0], VT.ARRAY, VT.FLOAT64),
    ("a.bool", [True, False, True], VT.ARRAY, VT.BOOL),
    ("a.str", ["", "a", "<|im_end|>", "\u0120the", "\U0010FFFF"], VT.ARRAY, VT.STRING),
    # arrays of arrays: gguf-py's writer infers the inner types (INT32, STRING, ...)
    ("a.nested.int", [[1, 2], [3], [4, 5, 6]], VT.ARRAY, None),
    ("a.nested.str", [["x", "yz"], ["w"]], VT.ARRAY, None),
    ("a.nested.3", [[[1.5], [2.5, 3.5]], [[4.5]]], VT.ARRAY, None),
    ("a.big", list(range(70000)), VT.ARRAY, VT.INT32),
]


def quant_bytes(rows: int, cols: int, qtype) -> np.ndarray:
    bs, ts = gguf.GGML_QUANT_SIZES[qtype]
    return RNG.integers(0, 256, size=(rows, cols // bs * ts), dtype=np.uint8)


RICH_TENSORS = [
    ("f32", RNG.standard_normal((3, 5), dtype=np.float32), None),
    ("f32.1d", np.array([np.nan, np.inf, -0.0, 1.0], dtype=np.float32), None),
    ("f16", RNG.standard_normal((2, 3, 4)).astype(np.float16), None),
    ("f64", RNG.standard_normal((2, 2)), None),
    ("i8", np.arange(-4, 4, dtype=np.int8), None),
    ("i16", np.arange(6, dtype=np.int16).reshape(2, 3), None),
    ("i32", np.arange(6, dtype=np.int32).reshape(3, 2), None),
    ("i64", np.arange(4, dtype=np.int64), None),
    ("bf16", RNG.integers(0, 256, size=(2, 16), dtype=np.uint8), QT.BF16),
    ("q8_0", quant_bytes(2, 64, QT.Q8_0), QT.Q8_0),
    ("q4_0", quant_bytes(1, 32, QT.Q4_0), QT.Q4_0),
    ("q4_k", quant_bytes(3, 256, QT.Q4_K), QT.Q4_K),
    ("q6_k", quant_bytes(1, 512, QT.Q6_K), QT.Q6_K),
    ("iq4_xs", quant_bytes(2, 256, QT.IQ4_XS), QT.IQ4_XS),
    ("4d", RNG.standard_normal((2, 1, 3, 4), dtype=np.float32), None),
]


# --------------------------------------------------------------- tests --

@pytest.mark.parametrize("alignment", [None, 64, 1, 256])
def test_writer_file_matches_gguf_py(tmp_path, alignment):
    path = str(tmp_path / "rich.gguf")
    write_with_gguf_py(path, RICH_KVS, RICH_TENSORS, alignment)
    with compare_with_gguf_py(path) as f:
        assert f.version == 3
        assert f.alignment == (alignment or 32)
        assert f.data_offset % f.alignment == 0
        # values against what was written (independent of both readers)
        for key, val, vtype, _sub in RICH_KVS:
            got = f.metadata[key]
            if vtype == VT.FLOAT32:
                assert got == struct.unpack("<f", struct.pack("<f", val))[0]
            elif key == "a.f32":
                assert got == [struct.unpack("<f", struct.pack("<f", x))[0] for x in val]
            elif key == "a.nested.3":
                assert got == val  # 1.5, 2.5, ... are exact in float32
            else:
                assert got == val and type(got) is type(val), key
        assert f.metadata_types["a.nested.int"] == (ValueType.ARRAY, ValueType.ARRAY)
        assert f.metadata_types["a.u64"] == (ValueType.ARRAY, ValueType.UINT64)
        assert f.metadata_types["t.bool.t"] == (ValueType.BOOL,)
        assert f.metadata["general.architecture"] == "qwen35"
        assert isinstance(f.metadata["a.big"], list)
        # numpy order view equals what was written
        for name, arr, raw in RICH_TENSORS:
            if raw is None:
                assert f.array(name).tobytes() == arr.tobytes()
                assert f.array(name).shape == arr.shape
                assert f.tensors[name].shape == tuple(reversed(arr.shape))


def test_bf16_array_is_exact(tmp_path):
    # bf16 values built from float32s whose low 16 bits are zero, so the
    # expected float32 values are known exactly without any conversion code.
    vals = np.array([1.0, -2.5, 0.0, -0.0, np.inf, 3.140625, 2.0**-126, 2.0**-133],
                    dtype=np.float32).reshape(2, 4)
    assert not (vals.view(np.uint32) & 0xFFFF).any()
    bf16 = (vals.view(np.uint32) >> 16).astype(np.uint16)
    path = str(tmp_path / "bf16.gguf")
    write_with_gguf_py(path, tensors=[("b", bf16.view(np.uint8), QT.BF16)])
    with compare_with_gguf_py(path) as f:
        assert f.tensors["b"].shape == (4, 2)
        a = f.array("b")
        assert a.dtype == np.float32 and a.shape == (2, 4)
        assert a.tobytes() == vals.tobytes()


def test_v2_and_builder_file_matches_gguf_py(tmp_path):
    b = gb.Builder(version=2, alignment=16)
    b.kv("general.alignment", gb.UINT32, 16)
    b.kv("u8", gb.UINT8, 255).kv("i64", gb.INT64, -(2**63)).kv("f64", gb.FLOAT64, 0.1)
    b.kv("s", gb.STRING, "v2 \u00fc")
    b.kv("arr.empty", gb.ARRAY, gb.Arr(gb.UINT32, []))
    b.kv("arr.empty.str", gb.ARRAY, gb.Arr(gb.STRING, []))
    b.kv("nest.mixed", gb.ARRAY, gb.Arr(gb.ARRAY, [gb.Arr(gb.UINT16, [1, 2]), gb.Arr(gb.UINT16, []),
                                                    gb.Arr(gb.UINT16, [3])]))
    b.kv("nest.deep8", gb.ARRAY, gb.nested(8, gb.INT8, [-1, 1]))
    b.kv("bool.two", gb.BOOL, 2)  # any nonzero byte is True
    b.tensor("a", [16, 3], gb.F32).tensor("b", [8], gb.F16)
    b.tensor("q", [64, 2], gb.Q8_0)
    path = str(tmp_path / "v2.gguf")
    with open(path, "wb") as fh:
        fh.write(b.build())
    with compare_with_gguf_py(path) as f:
        assert f.version == 2
        assert f.alignment == 16
        m = f.metadata
        assert m["arr.empty"] == [] and m["arr.empty.str"] == []
        assert m["nest.mixed"] == [[1, 2], [], [3]]
        assert m["nest.deep8"] == [[[[[[[[-1, 1]]]]]]]]
        assert m["bool.two"] is True
        assert f.metadata_types["arr.empty"] == (ValueType.ARRAY, ValueType.UINT32)
        assert f.tensors["q"].nbytes == 2 * 2 * 34  # 2 rows of 2 Q8_0 blocks of 34 bytes


def test_arrays_of_arrays_hold_their_values(tmp_path):
    # Values per inner array may differ in element type (the format allows it).
    v = gb.Arr(gb.ARRAY, [gb.Arr(gb.STRING, ["a", "\u00df"]), gb.Arr(gb.FLOAT64, [0.5]),
                          gb.Arr(gb.ARRAY, [gb.Arr(gb.BOOL, [1, 0])])])
    blob = gb.Builder().kv("k", gb.ARRAY, v).build()
    f = ds4py.gguf.open_bytes(blob)
    assert f.metadata["k"] == [["a", "\u00df"], [0.5], [[True, False]]]


def test_non_utf8_string_values_come_back_as_bytes():
    b = gb.Builder()
    b.kv("bad", gb.STRING, b"\xff\xfe ok")
    b.kv("bad.arr", gb.ARRAY, gb.Arr(gb.STRING, [b"\xc0\x80", "fine"]))
    f = ds4py.gguf.open_bytes(b.build())
    assert f.metadata["bad"] == b"\xff\xfe ok"
    assert f.metadata["bad.arr"] == [b"\xc0\x80", "fine"]


def test_ds4_types_and_quantized_array(tmp_path):
    # Random codes with moderate bf16 scale/bias (0.01..4 in magnitude), so
    # every code's position matters in the decoded value.
    rng = np.random.default_rng(7)

    def blocks(n, code_bytes):
        out = rng.integers(0, 256, size=(n, code_bytes + 4), dtype=np.uint8)
        sign = rng.choice([-1.0, 1.0], (n, 2))
        params = (rng.uniform(0.01, 4.0, size=(n, 2)) * sign).astype(np.float32)
        out[:, code_bytes:] = (params.view(np.uint32) >> 16).astype("<u2").view(np.uint8)
        return out.tobytes()

    b = gb.Builder()
    b.tensor("q4a", [128, 2], gb.Q4_64A, blocks(4, 32))
    b.tensor("q2a", [64], gb.Q2_64A, blocks(1, 16))
    f = ds4py.gguf.open_bytes(b.build())
    assert f.tensors["q4a"].type_name == "Q4_64A" and f.tensors["q4a"].nbytes == 4 * 36
    assert f.tensors["q2a"].type_id == 37 and f.tensors["q2a"].nbytes == 20
    assert f.raw("q2a").tobytes() == b.tensors[1].data
    # array() on the ds4-only types goes through ds4_dequantize_row; compare
    # with a numpy decoding written here from the layout (ds4-notes §2):
    # codes, then bf16 scale and bf16 bias; x = q*scale + bias (one float32
    # multiply, one add: numpy does not fuse them, nor does the core).
    def decode(raw, nbits):
        per_byte = 8 // nbits
        blocks = raw.reshape(-1, 64 // per_byte + 4)
        codes = blocks[:, : 64 // per_byte]
        q = np.stack([(codes >> (nbits * k)) & ((1 << nbits) - 1) for k in range(per_byte)],
                     axis=-1).reshape(-1, 64).astype(np.float32)
        tail = blocks[:, 64 // per_byte:].copy().view("<u2").astype(np.uint32) << 16
        scale, bias = tail.view(np.float32)[:, :1], tail.view(np.float32)[:, 1:2]
        return (q * scale + bias).reshape(-1)

    a = f.array("q4a")
    assert a.shape == (2, 128) and a.dtype == np.float32
    np.testing.assert_array_equal(a.reshape(-1), decode(f.raw("q4a"), 4))
    np.testing.assert_array_equal(f.array("q2a"), decode(f.raw("q2a"), 2))


@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q4_0])
def test_quantized_array_matches_gguf_py_dequantize(tmp_path, qtype):
    # Q8_0/Q4_0 dequantize to fp16 scale * small integer: one float32
    # product, exact in both implementations, so the comparison is bitwise.
    data = RNG.standard_normal((3, 64)).astype(np.float32)
    q = gguf.quants.quantize(data, qtype)
    path = str(tmp_path / "q.gguf")
    write_with_gguf_py(path, tensors=[("q", q, qtype)])
    with compare_with_gguf_py(path) as f:
        a = f.array("q")
        expected = gguf.quants.dequantize(q, qtype)
        assert a.dtype == np.float32 and a.shape == (3, 64) == expected.shape
        assert a.tobytes() == expected.astype(np.float32).tobytes()


def test_views_outlive_close_and_closed_file_raises(tmp_path):
    path = str(tmp_path / "v.gguf")
    data = np.arange(64, dtype=np.float32).reshape(4, 16)
    write_with_gguf_py(path, tensors=[("w", data, None)])
    f = ds4py.gguf.open(path)
    view = f.array("w")
    raw = f.raw("w")
    with pytest.raises(ValueError):
        view[0, 0] = 1.0  # read-only mapping
    f.close()
    assert f.closed
    for attr in ("metadata", "metadata_types", "tensors", "version", "data_offset"):
        with pytest.raises(GGUFError, match="closed"):
            getattr(f, attr)
    for method in (f.array, f.raw):
        with pytest.raises(GGUFError, match="closed"):
            method("w")
    del f
    gc.collect()
    # the views still read the mapped file
    assert view.tobytes() == data.tobytes()
    assert raw.tobytes() == data.tobytes()
    with ds4py.gguf.open(path) as g:
        assert g.array("w").sum() == data.sum()
    with pytest.raises(GGUFError, match="no tensor named 'nope'"):
        ds4py.gguf.open(path).array("nope")


def test_c_api_edges():
    from ds4py._core import ffi, lib, new_error
    blob = gb.Builder().kv("a", gb.UINT8, 1).kv("b.c", gb.UINT8, 2).tensor("t", [4], gb.F32).build()
    buf = ffi.from_buffer(blob)
    pp, err = ffi.new("ds4_gguf **"), new_error()
    assert lib.ds4_gguf_open_memory(buf, len(blob), pp, err) == lib.DS4_OK
    g = pp[0]
    try:
        assert lib.ds4_gguf_find_kv(g, b"b.c") == 1 and lib.ds4_gguf_find_kv(g, b"b") == -1
        assert lib.ds4_gguf_find_tensor(g, b"t") == 0 and lib.ds4_gguf_find_tensor(g, b"") == -1
        kv = ffi.new("ds4_gguf_kv *")
        assert lib.ds4_gguf_get_kv(g, 2, kv, err) == lib.DS4_ERR_ARG
        assert b"kv index 2" in ffi.string(err.message)
        t = ffi.new("ds4_gguf_tensor *")
        assert lib.ds4_gguf_get_tensor(g, -1, t, err) == lib.DS4_ERR_ARG
        assert lib.ds4_gguf_get_tensor(g, 0, t, err) == lib.DS4_OK
        assert t.ne[1] == 1 and t.ne[3] == 1 and t.n_dims == 1  # unused dims are 1
    finally:
        lib.ds4_gguf_close(g)
    lib.ds4_gguf_close(ffi.NULL)  # closing NULL is a no-op


def test_large_tables_open_fast():
    # 200k keys and 200k tensors; names share a long prefix and arrive in
    # descending order, which a quadratic duplicate check would choke on.
    n = 200_000
    prefix = "blk.layer." + "x" * 40 + "."
    b = gb.Builder()
    b.kvs = [gb.gstr(f"{prefix}{i:07d}") + gb.u32(gb.UINT8) + b"\x01" for i in range(n, 0, -1)]
    dims = gb.u32(1) + gb.u64(1) + gb.u32(gb.I8)
    infos = b"".join(gb.gstr(f"{prefix}{i:07d}") + dims + gb.u64(32 * (n - i))
                     for i in range(n, 0, -1))
    head = b.header(n_tensors=n, n_kv=n) + b"".join(b.kvs) + infos
    blob = head + b"\0" * (-len(head) % 32) + b"\x05" * (32 * n)
    t0 = time.perf_counter()
    f = ds4py.gguf.open_bytes(blob)
    opened = time.perf_counter() - t0
    # 2 s: the C open does two O(n log n) sorts of 200k names (tens of ms);
    # a quadratic check would need ~10^10 comparisons (minutes).
    assert opened < 2.0, opened
    from ds4py._core import lib
    assert lib.ds4_gguf_n_kv(f._map.handle) == n
    assert lib.ds4_gguf_n_tensors(f._map.handle) == n
    assert lib.ds4_gguf_find_kv(f._map.handle, f"{prefix}{1234:07d}".encode()) == n - 1234
    # duplicate at the far end of the table is still found
    dup = head.replace(gb.gstr(f"{prefix}{1:07d}"), gb.gstr(f"{prefix}{n:07d}"), 1)
    with pytest.raises(GGUFError) as ei:
        ds4py.gguf.open_bytes(dup + blob[len(head):])
    assert ei.value.code == 17 and f"{prefix}{n:07d}" in str(ei.value)  # DS4_ERR_DUPLICATE_KEY


# ---------------------------------------------------------- hypothesis --

_INT_RANGES = {VT.UINT8: (0, 2**8 - 1), VT.INT8: (-2**7, 2**7 - 1), VT.UINT16: (0, 2**16 - 1),
               VT.INT16: (-2**15, 2**15 - 1), VT.UINT32: (0, 2**32 - 1),
               VT.INT32: (-2**31, 2**31 - 1), VT.UINT64: (0, 2**64 - 1),
               VT.INT64: (-2**63, 2**63 - 1)}


def _scalar(vt):
    if vt in _INT_RANGES:
        return st.integers(*_INT_RANGES[vt])
    if vt == VT.FLOAT32:
        return st.floats(width=32)
    if vt == VT.FLOAT64:
        return st.floats()
    if vt == VT.BOOL:
        return st.booleans()
    return st.text(max_size=20)


_SCALAR_TYPES = list(_INT_RANGES) + [VT.FLOAT32, VT.FLOAT64, VT.BOOL, VT.STRING]


@st.composite
def _kv_value(draw):
    kind = draw(st.sampled_from(["scalar", "array", "nested"]))
    vt = draw(st.sampled_from(_SCALAR_TYPES))
    if kind == "scalar":
        return draw(_scalar(vt)), vt, None
    if kind == "array":  # gguf-py's writer refuses empty arrays
        return draw(st.lists(_scalar(vt), min_size=1, max_size=8)), VT.ARRAY, vt
    # the writer infers nested element types: int -> INT32, str -> STRING
    leaf = draw(st.sampled_from([st.integers(-2**31, 2**31 - 1), st.text(max_size=5)]))
    nested = draw(st.lists(st.lists(leaf, min_size=1, max_size=4), min_size=1, max_size=4))
    return nested, VT.ARRAY, None


_KEYS = st.text(min_size=1, max_size=24).filter(
    lambda k: k not in ("general.architecture", "general.alignment"))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(_KEYS, _kv_value(), max_size=8))
def test_hypothesis_metadata_matches_gguf_py(meta):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "h.gguf")
        kvs = [(k, v, vt, sub) for k, (v, vt, sub) in meta.items()]
        write_with_gguf_py(path, kvs, [("t", np.ones(3, dtype=np.float32), None)])
        with compare_with_gguf_py(path) as f:
            for k, (v, vt, sub) in meta.items():
                got = f.metadata[k]
                if VT.FLOAT32 in (vt, sub):
                    rt = [struct.unpack("<f", struct.pack("<f", x))[0] for x in flatten(v)]
                    assert same_list(flatten(got), rt)
                else:
                    assert same_list(flatten(got), flatten(v))
                assert f.metadata_types[k][0] == vt
