"""Write a seed corpus of small valid GGUF files for fuzz/fuzz_gguf.c.

    python fuzz/make_corpus.py OUT_DIR

Seeds cover: gguf-py's writer (v3, default and custom alignment, string
arrays, several tensor types) and the raw builder from tests/ (v2, every
scalar type, nested arrays, ds4's own tensor types, non-UTF-8 string values).
They are kept small so the fuzzer mutates structure, not bulk data.
"""

import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import gguf  # noqa: E402  (gguf-py)
from gguf_builder import (  # noqa: E402
    ARRAY,
    BF16,
    BOOL,
    F32,
    FLOAT32,
    FLOAT64,
    INT8,
    INT16,
    INT32,
    INT64,
    Q2_64A,
    Q4_0,
    Q4_64A,
    Q4_K,
    Q8_0,
    STRING,
    UINT8,
    UINT16,
    UINT32,
    UINT64,
    Arr,
    Builder,
    nested,
)


def writer_seed(alignment=None, version_tensors=True) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "s.gguf")
        w = gguf.GGUFWriter(path, "qwen35")
        if alignment:
            w.add_custom_alignment(alignment)
        w.add_uint32("qwen35.block_count", 2)
        w.add_float32("qwen35.rope.freq_base", 1e6)
        w.add_array("tokenizer.ggml.tokens", ["a", "b", "<|im_end|>", "\u00e9"])
        w.add_array("tokenizer.ggml.token_type", [1, 1, 3, 1])
        w.add_bool("tokenizer.ggml.add_bos_token", False)
        if version_tensors:
            w.add_tensor("token_embd.weight", np.arange(32, dtype=np.float32).reshape(4, 8))
            w.add_tensor("blk.0.attn_norm.weight", np.ones(8, dtype=np.float16))
            w.add_tensor("blk.0.ffn_up.weight", np.zeros((2, 34), dtype=np.uint8),
                         raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        with open(path, "rb") as f:
            return f.read()


def builder_seeds() -> dict[str, bytes]:
    out = {}
    b = Builder(version=2)
    for i, (t, v) in enumerate([(UINT8, 7), (INT8, -7), (UINT16, 700), (INT16, -700),
                                (UINT32, 70000), (INT32, -70000), (FLOAT32, 0.5), (BOOL, True),
                                (STRING, "x\u2603"), (UINT64, 2**40), (INT64, -2**40),
                                (FLOAT64, 0.25)]):
        b.kv(f"k.{i}", t, v)
    b.kv("s.bytes", STRING, b"\xff\xc0\x80")
    b.kv("a.nested", ARRAY, nested(3, UINT16, [1, 2, 3]))
    b.kv("a.empty", ARRAY, Arr(STRING, []))
    b.tensor("t.f32", [4], F32).tensor("t.bf16", [2, 2], BF16)
    out["builder_v2"] = b.build()

    b = Builder(alignment=64)
    b.kv("general.alignment", UINT32, 64)
    b.kv("a.strs", ARRAY, Arr(STRING, ["", "a", "bc"]))
    b.kv("a.deep", ARRAY, nested(8))
    b.tensor("q4_64a", [64], Q4_64A).tensor("q2_64a", [64, 2], Q2_64A)
    b.tensor("q4_0", [32], Q4_0).tensor("q4_k", [256], Q4_K).tensor("q8_0", [32, 1, 1, 2], Q8_0)
    out["builder_align64"] = b.build()

    b = Builder()
    b.kv("only.key", ARRAY, Arr(ARRAY, [Arr(INT8, [1]), Arr(STRING, ["z"]), Arr(FLOAT64, [1.0])]))
    out["builder_no_tensors"] = b.build()
    out["header_only"] = Builder().build()
    return out


def main(argv):
    if len(argv) != 2:
        sys.exit("usage: make_corpus.py OUT_DIR")
    os.makedirs(argv[1], exist_ok=True)
    seeds = {"writer_default": writer_seed(), "writer_align128": writer_seed(128),
             "writer_meta_only": writer_seed(version_tensors=False)}
    seeds.update(builder_seeds())
    for name, blob in seeds.items():
        with open(os.path.join(argv[1], name + ".gguf"), "wb") as f:
            f.write(blob)
    print(f"wrote {len(seeds)} seeds to {argv[1]}")


if __name__ == "__main__":
    main(sys.argv)
