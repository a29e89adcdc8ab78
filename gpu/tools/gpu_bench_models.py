"""Bench models for the GPU machine, where the ds4py extension is not built.

A bench model (bench/bench_models.py: random-weight GGUFs of real shapes) is
0.5-16 GB, too big to send; its recipe (metadata, tensor names, shapes and
types, as bench_models plans them) is a few KB. Here `recipe` writes that
recipe with the full ds4py; there `expand` writes the GGUF from it with
numpy and gguf-py only (bench/random_blocks.py makes the same kind of random
blocks bench_models does).

    python gpu/tools/gpu_bench_models.py recipe dense08b Q4_K_M OUT.json   # here
    python3 gpu/tools/gpu_bench_models.py expand RECIPE.json OUT.gguf      # there
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


def shapes(BM) -> dict:
    """bench_models' shapes plus those only the GPU machine expands (too big
    to make on a CI-class machine): moe35b, issue 19's 35B-A3B-like MoE
    (Qwen3.5-35B-A3B's shape: 40 layers, E 2048, H 16 / KV 2, head 256,
    Hk 16 / Hv 32 of 128, 256 experts of 512, 8 used, a 512 shared expert;
    19.7 GB in Q4_K_M, llama.cpp's anchor 249 / 245 / 213 tok/s decode at
    depth 0 / 4k / 32k on the H200)."""
    return {**BM.SHAPES,
            "moe35b": BM.Shape("qwen35moe", 40, 2048, 16, 2, 256, 16, 32, 128, n_expert=256,
                               n_expert_used=8, n_ff_exp=512, n_ff_shexp=512, tied=False)}


def recipe(name: str, quant: str, out: str) -> None:
    from bench import bench_models as BM

    s = shapes(BM)[name]
    md = BM.metadata(s, quant)
    n_vocab = len(md.pop("tokenizer.ggml.tokens"))
    md.pop("tokenizer.ggml.token_type")
    types = BM.plan_types(s, quant)
    doc = {"name": name, "quant": quant, "arch": s.arch, "n_vocab": n_vocab,
           "metadata": md, "tensors": [[n, list(shape), types[n]] for n, shape in BM.tensors(s)]}
    with open(out + ".tmp", "w") as f:
        json.dump(doc, f)
    os.replace(out + ".tmp", out)


def expand(recipe_path: str, out: str) -> None:
    import gguf

    from bench.random_blocks import block_geometry, random_blocks, small_f32

    with open(recipe_path) as f:
        doc = json.load(f)
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(out.encode()).digest()[:8], "little"))
    w = gguf.GGUFWriter(out + ".tmp", doc["arch"])
    for k, v in doc["metadata"].items():
        if k == "general.architecture":
            continue
        if k == "tokenizer.ggml.merges" and not v:
            # gguf-py drops an empty array, and llama.cpp refuses a gpt2
            # vocabulary without the key ("cannot find tokenizer merges"):
            # one merge of two synthetic tokens, which no text ever meets
            w.add_array(k, ["<t0> <t1>"])
        elif isinstance(v, bool):
            w.add_bool(k, v)
        elif isinstance(v, str):
            w.add_string(k, v)
        elif isinstance(v, int):
            w.add_uint32(k, v)
        elif isinstance(v, float):
            w.add_float32(k, v)
        elif v and isinstance(v[0], bool):   # before int: a bool is an int
            w.add_key_value(k, [bool(x) for x in v], gguf.GGUFValueType.ARRAY,
                            sub_type=gguf.GGUFValueType.BOOL)
        elif v and isinstance(v[0], int):
            w.add_array(k, [int(x) for x in v])
        else:
            w.add_array(k, list(v))
    n = doc["n_vocab"]
    w.add_array("tokenizer.ggml.tokens", [f"<t{i}>" for i in range(n)])
    w.add_array("tokenizer.ggml.token_type", [1] * n)
    for name, shape, t in doc["tensors"]:
        n_values = int(np.prod(shape))
        if t == "F32":
            w.add_tensor_info(name, list(reversed(shape)), np.float32, 4 * n_values)
        else:
            bs, ts = block_geometry(t)
            row_bytes = shape[0] // bs * ts
            byte_shape = list(reversed(shape[1:])) + [row_bytes]
            w.add_tensor_info(name, byte_shape, np.uint8, n_values // bs * ts,
                              raw_dtype=gguf.GGMLQuantizationType[t])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape, t in doc["tensors"]:
        if t == "F32" and (len(shape) == 1 or "conv1d" in name or not name.endswith(".weight")):
            data = small_f32(rng, name, shape)
        else:
            data = np.concatenate(list(random_blocks(rng, t, int(np.prod(shape)), shape[0])))
        w.write_tensor_data(data)
    w.close()
    os.replace(out + ".tmp", out)


def main(argv: list[str]) -> int:
    if len(argv) == 4 and argv[0] == "recipe":
        recipe(argv[1], argv[2], argv[3])
    elif len(argv) == 3 and argv[0] == "expand":
        expand(argv[1], argv[2])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
