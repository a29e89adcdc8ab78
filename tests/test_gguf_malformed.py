"""Every validation rule of the GGUF reader, one malformed file per rule.

Each test builds its file with tests/gguf_builder.py and asserts the specific
ds4_status (err.code) and that the message names the key or tensor (and the
offending number). Codes are ds4.h's ds4_status values.
"""

from __future__ import annotations

import os
import time

import gguf_builder as gb
import pytest
from gguf_builder import (
    ARRAY,
    BOOL,
    F16,
    F32,
    INT32,
    Q2_64A,
    Q4_0,
    Q4_64A,
    Q4_K,
    STRING,
    UINT8,
    UINT32,
    UINT64,
    Arr,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ds4py
from ds4py import GGUFError
from ds4py._core import lib

E_IO = lib.DS4_ERR_IO
E_TRUNC = lib.DS4_ERR_TRUNCATED
E_MAGIC = lib.DS4_ERR_BAD_MAGIC
E_VERSION = lib.DS4_ERR_BAD_VERSION
E_COUNT = lib.DS4_ERR_BAD_COUNT
E_STRING = lib.DS4_ERR_BAD_STRING
E_VTYPE = lib.DS4_ERR_BAD_VALUE_TYPE
E_NEST = lib.DS4_ERR_NESTING
E_DUPKEY = lib.DS4_ERR_DUPLICATE_KEY
E_ALIGN = lib.DS4_ERR_BAD_ALIGNMENT
E_DIMS = lib.DS4_ERR_BAD_DIMS
E_TTYPE = lib.DS4_ERR_BAD_TENSOR_TYPE
E_ROW = lib.DS4_ERR_BAD_ROW
E_OFFSET = lib.DS4_ERR_BAD_OFFSET
E_OVERLAP = lib.DS4_ERR_OVERLAP
E_DUPTENSOR = lib.DS4_ERR_DUPLICATE_TENSOR


def fails(blob: bytes, code: int, *needles: str) -> str:
    """Opening blob raises GGUFError with `code`; the message holds every needle."""
    with pytest.raises(GGUFError) as ei:
        ds4py.gguf.open_bytes(blob)
    msg = str(ei.value)
    assert ei.value.code == code, msg
    for n in needles:
        assert n in msg, (n, msg)
    return msg


def base() -> gb.Builder:
    b = gb.Builder()
    b.kv("general.architecture", STRING, "qwen35")
    b.kv("qwen35.block_count", UINT32, 2)
    b.tensor("token_embd.weight", [32, 2], F32)
    b.tensor("blk.0.ffn_up.weight", [256], Q4_K)
    return b


def test_base_is_valid():
    # every test below changes one thing in this file
    f = ds4py.gguf.open_bytes(base().build())
    assert len(f.tensors) == 2 and f.metadata["qwen35.block_count"] == 2


# ------------------------------------------------------- magic / version --

@pytest.mark.parametrize("magic", [b"GGUG", b"ggml", b"\0\0\0\0", b"FUGG"])
def test_bad_magic(magic):
    b = base()
    b.magic = magic
    fails(b.build(), E_MAGIC, "not a GGUF file")


def test_short_garbage_is_bad_magic_and_short_prefix_is_truncated():
    fails(b"XY", E_MAGIC)
    fails(b"GG", E_TRUNC)
    fails(b"", E_TRUNC)


@pytest.mark.parametrize("version", [0, 1, 4, 0xFFFFFFFF])
def test_bad_version(version):
    b = base()
    b.version = version
    fails(b.build(), E_VERSION, f"version {version}")


def test_big_endian_version_is_named():
    b = base()
    b.version = 0x03000000  # a v3 file written big-endian
    fails(b.build(), E_VERSION, "big-endian")


# ------------------------------------------------------------- counts --

def test_kv_count_2_62_fails_fast():
    t0 = time.perf_counter()
    fails(base().build(n_kv=2**62), E_COUNT, "kv count", str(2**62))
    # 1 s: the count must be refused arithmetically; trying to allocate or
    # walk 2^62 entries would take far longer (or fail with NOMEM instead).
    assert time.perf_counter() - t0 < 1.0


def test_tensor_count_2_62_fails_fast():
    t0 = time.perf_counter()
    fails(base().build(n_tensors=2**62), E_COUNT, "tensor count", str(2**62))
    assert time.perf_counter() - t0 < 1.0  # see test_kv_count_2_62_fails_fast


@pytest.mark.parametrize("n", [2**64 - 1, 2**63, 10_000])
def test_counts_larger_than_file(n):
    fails(base().build(n_tensors=n), E_COUNT, "tensor count", str(n))
    fails(base().build(n_kv=n), E_COUNT, "kv count", str(n))


def test_count_that_fits_but_entries_missing():
    # 3 kvs declared, 2 present: the third is read from the tensor table.
    b = base()
    blob = b.build(n_kv=3)
    with pytest.raises(GGUFError):
        ds4py.gguf.open_bytes(blob)


def test_array_count_2_62():
    b = base()
    b.kv("tokenizer.ggml.scores", ARRAY, Arr(UINT32, [1, 2], count=2**62))
    fails(b.build(), E_COUNT, "'tokenizer.ggml.scores'", "array length", str(2**62))


def test_string_array_count_2_62():
    b = base()
    b.kv("tokenizer.ggml.tokens", ARRAY, Arr(STRING, ["a"], count=2**62))
    fails(b.build(), E_COUNT, "'tokenizer.ggml.tokens'", str(2**62))


def test_nested_array_count_2_62():
    b = base()
    b.kv("nest", ARRAY, Arr(ARRAY, [Arr(UINT8, [1], count=2**62)]))
    fails(b.build(), E_COUNT, "'nest'", str(2**62), "depth 2")


# ------------------------------------------------------------- strings --

def test_string_value_length_2_63():
    b = base()
    b.kv("general.name", STRING, raw_value=gb.gstr("abc", length=2**63))
    fails(b.build(), E_STRING, "'general.name'", "string value length", str(2**63))


def test_key_length_2_63():
    b = base()
    b.kv("general.name", STRING, "x", key_len=2**63)
    fails(b.build(), E_STRING, "kv 2", "key length", str(2**63))


def test_tensor_name_length_past_end():
    b = base()
    b.tensor("blk.1.w", [32], F32, name_len=2**63 + 5)
    fails(b.build(), E_STRING, "tensor 2", "name length", str(2**63 + 5))


def test_string_array_element_length_past_end():
    b = base()
    b.kv("tokenizer.ggml.tokens", ARRAY,
         raw_value=(gb.u32(STRING) + gb.u64(3) + gb.gstr("a") + gb.gstr("b", length=1 << 40)
                    + gb.gstr("c")))
    fails(b.build(), E_STRING, "'tokenizer.ggml.tokens'", "array element 1", str(1 << 40))


# ------------------------------------------------------------- nesting --

def test_nesting_depth_8_is_allowed():
    b = base()
    b.kv("deep", ARRAY, gb.nested(8))
    f = ds4py.gguf.open_bytes(b.build())
    v = f.metadata["deep"]
    for _ in range(7):
        (v,) = v
    assert v == [1, 2]


@pytest.mark.parametrize("depth", [9, 10, 100])
def test_nesting_depth_9_plus(depth):
    b = base()
    b.kv("too.deep", ARRAY, gb.nested(depth))
    fails(b.build(), E_NEST, "'too.deep'", "nested 9 deep", "at most 8")


def test_empty_array_of_arrays_at_depth_8_declares_depth_9():
    b = base()
    b.kv("too.deep", ARRAY, gb.nested(8, ARRAY, []))
    fails(b.build(), E_NEST, "'too.deep'")


# --------------------------------------------------------- value types --

@pytest.mark.parametrize("vtype", [13, 255, 0xFFFFFFFF])
def test_unknown_value_type(vtype):
    b = base()
    b.kv("weird", vtype, raw_value=b"\0" * 8)
    fails(b.build(), E_VTYPE, "'weird'", f"value type {vtype}")


def test_unknown_array_element_type():
    b = base()
    b.kv("weird.arr", ARRAY, raw_value=gb.u32(13) + gb.u64(1) + b"\0" * 8)
    fails(b.build(), E_VTYPE, "'weird.arr'", "array element type 13")


def test_unknown_nested_element_type():
    b = base()
    b.kv("weird.nest", ARRAY, raw_value=gb.u32(ARRAY) + gb.u64(1) + gb.u32(99) + gb.u64(0))
    fails(b.build(), E_VTYPE, "'weird.nest'", "99")


# ---------------------------------------------------------- duplicates --

def test_duplicate_key_not_adjacent():
    b = base()
    b.kv("x.other", UINT8, 1)
    b.kv("qwen35.block_count", UINT32, 3)
    fails(b.build(), E_DUPKEY, "'qwen35.block_count'", "kv 1", "kv 3")


def test_duplicate_tensor_name():
    b = base()
    b.tensor("token_embd.weight", [32], F32)
    fails(b.build(), E_DUPTENSOR, "'token_embd.weight'", "tensor 0", "tensor 2")


# ----------------------------------------------------------- alignment --

@pytest.mark.parametrize("value", [0, 48, 3, 2**31 + 1])
def test_alignment_not_power_of_two(value):
    b = base()
    b.kv("general.alignment", UINT32, value)
    fails(b.build(), E_ALIGN, "'general.alignment'", str(value))


@pytest.mark.parametrize("vtype,value", [(UINT64, 32), (INT32, 32), (UINT8, 32), (STRING, "32")])
def test_alignment_wrong_type(vtype, value):
    b = base()
    b.kv("general.alignment", vtype, value)
    fails(b.build(), E_ALIGN, "'general.alignment'", "UINT32")


def test_custom_alignment_applies_to_offsets():
    def build(layout_alignment):
        b = gb.Builder(alignment=layout_alignment)
        b.kv("general.alignment", UINT32, 64)
        b.tensor("a", [8], F32).tensor("b", [8], F32)  # 32 bytes each
        return b.build()

    f = ds4py.gguf.open_bytes(build(64))
    assert f.alignment == 64 and f.data_offset % 64 == 0
    assert f.tensors["b"].offset == 64
    # the same file laid out with the default 32 puts "b" at 32: refused
    fails(build(32), E_OFFSET, "'b'", "offset 32", "alignment 64")


# -------------------------------------------------------------- tensors --

@pytest.mark.parametrize("n_dims", [0, 5, 0xFFFFFFFF])
def test_n_dims_out_of_range(n_dims):
    b = base()
    b.tensor("bad.dims", [32], F32, n_dims=n_dims)
    fails(b.build(), E_DIMS, "'bad.dims'", f"n_dims is {n_dims}")


def test_zero_dim():
    b = base()
    b.tensor("zero", [32, 0], F32, data=b"")
    fails(b.build(), E_DIMS, "'zero'", "ne[1] is 0")


def test_negative_dim():
    b = base()
    b.tensor("neg", [32, 2**64 - 2], F32, data=b"")  # int64 -2
    fails(b.build(), E_DIMS, "'neg'", "ne[1] is -2")


def test_dims_product_overflow():
    b = base()
    b.tensor("huge", [2**32, 2**32], F32, data=b"")
    fails(b.build(), E_DIMS, "'huge'", "overflows", str(2**32))


def test_byte_size_overflow():
    b = base()
    b.tensor("huge.bytes", [2**31, 2**31], F32, data=b"")  # 2^62 elements, 2^64 bytes
    fails(b.build(), E_DIMS, "'huge.bytes'", "overflow")


@pytest.mark.parametrize("ttype", [4, 5, 31, 32, 33, 38, 43, 1000, 0xFFFFFFFF])
def test_unknown_tensor_type(ttype):
    b = base()
    b.tensor("odd.type", [256], ttype, data=b"")
    fails(b.build(), E_TTYPE, "'odd.type'", f"type id {ttype}")


def test_ds4_type_ids_are_valid():
    b = base()
    b.tensor("a", [64, 3], Q4_64A).tensor("b", [128], Q2_64A)
    f = ds4py.gguf.open_bytes(b.build())
    assert f.tensors["a"].type_name == "Q4_64A" and f.tensors["b"].type_name == "Q2_64A"


@pytest.mark.parametrize("ttype,ne0,bs", [(Q4_0, 48, 32), (Q4_K, 128, 256), (Q4_64A, 32, 64)])
def test_row_not_multiple_of_block(ttype, ne0, bs):
    b = base()
    b.tensor("bad.row", [ne0, 4], ttype, data=b"")
    fails(b.build(), E_ROW, "'bad.row'", f"ne[0]={ne0}", f"block size {bs}")


def test_misaligned_offset():
    b = base()
    b.tensors[1].offset = 256 + 4
    fails(b.build(), E_OFFSET, "'blk.0.ffn_up.weight'", "offset 260", "alignment 32")


def test_offset_outside_data():
    b = base()
    b.tensor("far", [8], F32, data=b"", offset=1 << 20)
    fails(b.build(), E_OFFSET, "'far'", str(1 << 20))


def test_tensor_data_runs_past_end():
    blob = base().build()
    fails(blob[:-1], E_OFFSET, "'blk.0.ffn_up.weight'", "144")


def test_offset_wraps():
    b = base()
    b.tensor("wrap", [8], F32, data=b"", offset=2**64 - 32)
    fails(b.build(), E_OFFSET, "'wrap'", str(2**64 - 32))


def test_offset_plus_size_wraps_is_named():
    # offset is in bounds of nothing; make offset+nbytes exceed 2^64
    b = base()
    b.tensor("wrap2", [2**40], F32, data=b"", offset=2**64 - 2**41)
    fails(b.build(), E_OFFSET, "'wrap2'", "wrap")


def test_overlapping_tensors():
    b = base()
    b.tensor("overlap", [32], F32, offset=128)  # inside token_embd.weight [0, 256)
    fails(b.build(), E_OVERLAP, "'token_embd.weight'", "'overlap'", "0..256", "128..256")


def test_same_offset_overlaps():
    b = base()
    b.tensor("twin", [32], F32, offset=256)
    fails(b.build(), E_OVERLAP, "'blk.0.ffn_up.weight'", "'twin'")


def test_adjacent_tensors_do_not_overlap():
    b = gb.Builder(alignment=1)
    b.kv("general.alignment", UINT32, 1)
    b.tensor("a", [3], F16).tensor("b", [1], F16, offset=6).tensor("c", [1], F16, offset=8)
    f = ds4py.gguf.open_bytes(b.build())
    assert [t.offset for t in f.tensors.values()] == [0, 6, 8]


# ---------------------------------------------------------------- UTF-8 --

INVALID_UTF8 = [
    b"\xc0\x80",          # overlong NUL
    b"\xc1\xbf",          # overlong 2-byte
    b"\xe0\x80\xaf",      # overlong 3-byte
    b"\xf0\x80\x80\xaf",  # overlong 4-byte
    b"\xed\xa0\x80",      # surrogate U+D800
    b"\xed\xbf\xbf",      # surrogate U+DFFF
    b"\xf4\x90\x80\x80",  # U+110000
    b"\xf5\x80\x80\x80",  # lead byte > F4
    b"\xff",
    b"\x80",              # lone continuation
    b"\xe2\x82",          # truncated sequence
    b"\xe2\x28\xa1",      # bad continuation
]
VALID_UTF8 = ["\u00e9", "\u20ac", "\uffff", "\U0001F600", "\U0010FFFF", "\ud7ff", "\ue000"]


@pytest.mark.parametrize("bad", INVALID_UTF8)
def test_non_utf8_key(bad):
    b = base()
    b.kv(b"key." + bad, UINT8, 1)
    fails(b.build(), E_STRING, "kv 2", "not valid UTF-8")


@pytest.mark.parametrize("bad", INVALID_UTF8)
def test_non_utf8_tensor_name(bad):
    b = base()
    b.tensor(b"blk." + bad, [32], F32)
    fails(b.build(), E_STRING, "tensor 2", "not valid UTF-8")


@pytest.mark.parametrize("good", VALID_UTF8)
def test_valid_utf8_names_accepted(good):
    b = base()
    b.kv("key." + good, UINT8, 1)
    b.tensor("blk." + good, [32], F32)
    f = ds4py.gguf.open_bytes(b.build())
    assert f.metadata["key." + good] == 1 and "blk." + good in f.tensors


def test_non_utf8_string_value_is_accepted_as_bytes():
    # decision: values are not validated (llama.cpp does not either)
    b = base()
    b.kv("general.name", STRING, b"\xc0\x80\xff")
    assert ds4py.gguf.open_bytes(b.build()).metadata["general.name"] == b"\xc0\x80\xff"


# ------------------------------------------------------------ truncation --

def _small_valid() -> bytes:
    b = gb.Builder()
    b.kv("general.architecture", STRING, "q")
    b.kv("a", ARRAY, Arr(STRING, ["x", "yz"]))
    b.kv("n", ARRAY, gb.nested(2, UINT8, [7]))
    b.kv("b", BOOL, True)
    b.tensor("t", [2], F32).tensor("u", [32], Q4_0)
    return b.build()


def test_truncation_at_every_offset():
    blob = _small_valid()
    ds4py.gguf.open_bytes(blob)  # the whole file is valid
    codes = set()
    for n in range(len(blob)):
        with pytest.raises(GGUFError) as ei:
            ds4py.gguf.open_bytes(blob[:n])
        codes.add(ei.value.code)
    # truncation shows up as several distinct, specific errors, never a crash
    assert {E_TRUNC, E_OFFSET, E_COUNT} <= codes


def test_truncated_files_on_disk(tmp_path):
    blob = _small_valid()
    for n in (0, 3, 24, len(blob) // 2, len(blob) - 1):
        p = tmp_path / f"t{n}.gguf"
        p.write_bytes(blob[:n])
        with pytest.raises(GGUFError) as ei:
            ds4py.gguf.open(p)
        assert str(p) in str(ei.value)  # file errors are prefixed by the path


# ----------------------------------------------------- garbage / paths --

def test_open_memory_on_garbage():
    rng = __import__("random").Random(7)
    for size in (1, 7, 24, 100, 4096):
        for _ in range(20):
            data = bytes(rng.randrange(256) for _ in range(size))
            with pytest.raises(GGUFError):
                ds4py.gguf.open_bytes(data)
    # garbage after a valid-looking header
    for _ in range(50):
        data = b"GGUF" + gb.u32(3) + bytes(rng.randrange(256) for _ in range(200))
        try:
            ds4py.gguf.open_bytes(data)
        except GGUFError:
            pass


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=512))
def test_hypothesis_garbage(data):
    try:
        ds4py.gguf.open_bytes(b"GGUF" + gb.u32(3) + data)
    except GGUFError as e:
        assert e.code != 0 and str(e)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_hypothesis_mutations_of_valid_file(data):
    blob = bytearray(_small_valid())
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(blob) - 1))
        blob[i] = data.draw(st.integers(0, 255))
    try:
        f = ds4py.gguf.open_bytes(bytes(blob))
    except GGUFError as e:
        assert e.code != 0 and str(e)
    else:
        # an accepted file decodes fully
        assert len(f.metadata) == len(f.metadata_types)
        for name in f.tensors:
            f.raw(name)


def test_nonexistent_path(tmp_path):
    p = tmp_path / "no" / "such.gguf"
    with pytest.raises(GGUFError) as ei:
        ds4py.gguf.open(p)
    assert ei.value.code == E_IO and str(p) in str(ei.value)


def test_directory_path(tmp_path):
    with pytest.raises(GGUFError) as ei:
        ds4py.gguf.open(tmp_path)
    assert ei.value.code == E_IO and str(tmp_path) in str(ei.value)


def test_error_on_disk_names_path_and_tensor(tmp_path):
    b = base()
    b.tensor("token_embd.weight", [32], F32)
    p = tmp_path / "dup.gguf"
    p.write_bytes(b.build())
    with pytest.raises(GGUFError) as ei:
        ds4py.gguf.open(os.fspath(p))
    assert ei.value.code == E_DUPTENSOR
    assert str(p) in str(ei.value) and "'token_embd.weight'" in str(ei.value)


def test_fifo_path_is_refused_without_blocking(tmp_path):
    # Opening a FIFO must not wait for a writer; run in a child so a
    # regression shows as a timeout instead of a hung test session.
    import subprocess
    import sys
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    code = (f"import ds4py\ntry:\n    ds4py.gguf.open({str(fifo)!r})\n"
            "except ds4py.GGUFError as e:\n    print(e.code, e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)  # 60 s: only ever reached if open() blocks
    assert out.stdout.startswith(f"{E_IO} ") and "not a regular file" in out.stdout, out
