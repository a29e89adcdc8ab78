"""Bench models for the CPU benchmark (bench/bench_cpu.py), generated on demand.

Random-weight GGUFs of real model shapes, written directly as random quantized
blocks (random codes, small finite scales): no float intermediate, so a
multi-GB file costs only its own bytes of memory per tensor. The tensor types
are the ones llama.cpp's quantizer would pick (gguf_tools.requantize.plan, the
Q4_K_M mix ported from llama-quant.cpp; Q8_0 for every matrix in the Q8_0
files; norms and GDN scalars F32). Files are cached outside the repository in
$DS4PY_BENCH_CACHE (default ~/.cache/ds4py-bench) and reused while the
generator's version and the shape are unchanged.

    python bench/bench_models.py [--list] [NAME ...]      # prints the paths

Shapes (issue 18):
  dense08b   the Qwen3.5-0.8B shape: 24 layers (18 GDN + 6 attention), E 1024,
             H 8 / KV 2, head 256, Hk = Hv = 16, dk = dv = 128, FFN 3584, the
             real vocabulary size (248320), tied embeddings;
  moe        a Qwen3.5-35B-A3B-like MoE scaled to this machine: 20 layers,
             E 2048, H 16 / KV 2, head 256, Hk 16 / Hv 32, dk = dv = 128,
             64 experts top-8, expert FFN 512, shared expert 512, untied head;
  dense08b_l6  the dense shape cut to 6 layers (a faster smoke run);
  dense08b_mtp the dense shape plus one random nextn (MTP) block (bench_spec).
The vocabulary is synthetic (token strings "<t…>", no merges): the benchmark
feeds token ids, never text.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import sys
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.random_blocks import random_blocks as _random_blocks  # noqa: E402
from bench.random_blocks import small_f32 as _small_f32  # noqa: E402
from ds4py.gguf_writer import GGUFWriter  # noqa: E402
from gguf_tools import requantize as RQ  # noqa: E402

GENERATOR_VERSION = 2


@dataclasses.dataclass(frozen=True)
class Shape:
    arch: str            # qwen35 | qwen35moe
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    ssm_nk: int          # Hk (ssm.group_count)
    ssm_nv: int          # Hv (ssm.time_step_rank)
    ssm_d: int           # dk = dv (ssm.state_size)
    n_ff: int = 0        # dense FFN
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    n_ff_shexp: int = 0
    n_vocab: int = 248320
    tied: bool = True
    attn_interval: int = 4
    n_rot: int = 64      # partial rotary 0.25 of head 256
    n_nextn: int = 0     # nextn (MTP) blocks after the trunk: 0 or 1 (bench_spec's drafter)


SHAPES = {
    "dense08b": Shape("qwen35", 24, 1024, 8, 2, 256, 16, 16, 128, n_ff=3584),
    "dense08b_l6": Shape("qwen35", 6, 1024, 8, 2, 256, 16, 16, 128, n_ff=3584),
    # the 0.8B shape with one random nextn head (bench/bench_spec.py: a random
    # head drafts noise, so this measures verify widths and what the policy
    # costs where drafting never pays, on a memory-bound model)
    "dense08b_mtp": Shape("qwen35", 24, 1024, 8, 2, 256, 16, 16, 128, n_ff=3584, n_nextn=1),
    # Qwen3.5-27B-like (issue 19's H200 bench; too big to make on a CI-class
    # machine): 64 layers, E 5120, H 24 / KV 4, head 256, Hk 16 / Hv 48, FFN 17408
    "dense27b": Shape("qwen35", 64, 5120, 24, 4, 256, 16, 48, 128, n_ff=17408),
    "moe": Shape("qwen35moe", 20, 2048, 16, 2, 256, 16, 32, 128, n_expert=64,
                 n_expert_used=8, n_ff_exp=512, n_ff_shexp=512, tied=False),
}
QUANTS = ("Q8_0", "Q4_K_M")


def cache_dir() -> str:
    d = os.environ.get("DS4PY_BENCH_CACHE") or os.path.join(os.path.expanduser("~"), ".cache",
                                                            "ds4py-bench")
    os.makedirs(d, exist_ok=True)
    return d


def _is_attn(s: Shape, il: int) -> bool:
    return (il + 1) % s.attn_interval == 0


def tensors(s: Shape) -> list[tuple[str, tuple[int, ...]]]:
    """(name, GGUF shape) of every tensor, in the converter's naming."""
    E, out = s.n_embd, []
    out.append(("token_embd.weight", (E, s.n_vocab)))
    out.append(("output_norm.weight", (E,)))
    if not s.tied:
        out.append(("output.weight", (E, s.n_vocab)))
    key_dim, inner = s.ssm_nk * s.ssm_d, s.ssm_nv * s.ssm_d
    for il in range(s.n_layer):
        b = f"blk.{il}."
        out += [(b + "attn_norm.weight", (E,)), (b + "post_attention_norm.weight", (E,))]
        if _is_attn(s, il):
            out += [(b + "attn_q.weight", (E, 2 * s.n_head * s.head_dim)),
                    (b + "attn_k.weight", (E, s.n_head_kv * s.head_dim)),
                    (b + "attn_v.weight", (E, s.n_head_kv * s.head_dim)),
                    (b + "attn_output.weight", (s.n_head * s.head_dim, E)),
                    (b + "attn_q_norm.weight", (s.head_dim,)),
                    (b + "attn_k_norm.weight", (s.head_dim,))]
        else:
            cd = 2 * key_dim + inner
            out += [(b + "attn_qkv.weight", (E, cd)), (b + "attn_gate.weight", (E, inner)),
                    (b + "ssm_alpha.weight", (E, s.ssm_nv)), (b + "ssm_beta.weight", (E, s.ssm_nv)),
                    (b + "ssm_out.weight", (inner, E)), (b + "ssm_conv1d.weight", (4, cd)),
                    (b + "ssm_a", (s.ssm_nv,)), (b + "ssm_dt.bias", (s.ssm_nv,)),
                    (b + "ssm_norm.weight", (s.ssm_d,))]
        if s.arch == "qwen35moe":
            ne, fe, fs = s.n_expert, s.n_ff_exp, s.n_ff_shexp
            out += [(b + "ffn_gate_inp.weight", (E, ne)),
                    (b + "ffn_gate_exps.weight", (E, fe, ne)),
                    (b + "ffn_up_exps.weight", (E, fe, ne)),
                    (b + "ffn_down_exps.weight", (fe, E, ne)),
                    (b + "ffn_gate_inp_shexp.weight", (E,)),
                    (b + "ffn_gate_shexp.weight", (E, fs)), (b + "ffn_up_shexp.weight", (E, fs)),
                    (b + "ffn_down_shexp.weight", (fs, E))]
        else:
            out += [(b + "ffn_gate.weight", (E, s.n_ff)), (b + "ffn_up.weight", (E, s.n_ff)),
                    (b + "ffn_down.weight", (s.n_ff, E))]
    for il in range(s.n_layer, s.n_layer + s.n_nextn):
        # the nextn block: a full-attention dense block after the trunk plus
        # its input projection and norms (the converter's names)
        b = f"blk.{il}."
        out += [(b + "nextn.eh_proj.weight", (2 * E, E)), (b + "nextn.enorm.weight", (E,)),
                (b + "nextn.hnorm.weight", (E,)), (b + "nextn.shared_head_norm.weight", (E,)),
                (b + "attn_norm.weight", (E,)), (b + "post_attention_norm.weight", (E,)),
                (b + "attn_q.weight", (E, 2 * s.n_head * s.head_dim)),
                (b + "attn_k.weight", (E, s.n_head_kv * s.head_dim)),
                (b + "attn_v.weight", (E, s.n_head_kv * s.head_dim)),
                (b + "attn_output.weight", (s.n_head * s.head_dim, E)),
                (b + "attn_q_norm.weight", (s.head_dim,)),
                (b + "attn_k_norm.weight", (s.head_dim,)),
                (b + "ffn_gate.weight", (E, s.n_ff)), (b + "ffn_up.weight", (E, s.n_ff)),
                (b + "ffn_down.weight", (s.n_ff, E))]
    return out


def metadata(s: Shape, quant: str) -> dict:
    a = s.arch
    md = {
        "general.architecture": a, "general.type": "model", "general.name": "ds4py-bench",
        f"{a}.block_count": s.n_layer + s.n_nextn, f"{a}.context_length": 262144,
        f"{a}.embedding_length": s.n_embd, f"{a}.attention.head_count": s.n_head,
        f"{a}.attention.head_count_kv": s.n_head_kv,
        f"{a}.rope.dimension_sections": [11, 11, 10, 0],  # Qwen3.5's mrope_section
        f"{a}.rope.freq_base": 10000000.0,
        f"{a}.attention.layer_norm_rms_epsilon": 1e-6,
        f"{a}.attention.key_length": s.head_dim, f"{a}.attention.value_length": s.head_dim,
        f"{a}.ssm.conv_kernel": 4, f"{a}.ssm.state_size": s.ssm_d,
        f"{a}.ssm.group_count": s.ssm_nk, f"{a}.ssm.time_step_rank": s.ssm_nv,
        f"{a}.ssm.inner_size": s.ssm_nv * s.ssm_d,
        f"{a}.full_attention_interval": s.attn_interval,
        f"{a}.rope.dimension_count": s.n_rot,
        "general.file_type": RQ.LLAMA_FTYPE[quant], "general.quantization_version": 2,
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen35",
        "tokenizer.ggml.tokens": [f"<t{i}>" for i in range(s.n_vocab)],
        "tokenizer.ggml.token_type": [1] * s.n_vocab,
        "tokenizer.ggml.merges": [],
        "tokenizer.ggml.eos_token_id": s.n_vocab - 1,
        "tokenizer.ggml.padding_token_id": s.n_vocab - 2,
        "tokenizer.ggml.add_bos_token": False,
    }
    if s.n_nextn:
        # the layer kinds spelled out: the interval rule alone would make the
        # nextn block (index n_layer) a GDN layer
        md[f"{a}.nextn_predict_layers"] = s.n_nextn
        md[f"{a}.attention.recurrent_layers"] = (
            [not _is_attn(s, il) for il in range(s.n_layer)] + [False] * s.n_nextn)
    if a == "qwen35moe":
        md |= {f"{a}.expert_count": s.n_expert, f"{a}.expert_used_count": s.n_expert_used,
               f"{a}.expert_feed_forward_length": s.n_ff_exp,
               f"{a}.expert_shared_feed_forward_length": s.n_ff_shexp}
    else:
        md[f"{a}.feed_forward_length"] = s.n_ff
    return md


def plan_types(s: Shape, quant: str) -> dict[str, str]:
    """Tensor name -> type, as llama.cpp's quantizer would choose from F32."""
    infos = {}
    for name, shape in tensors(s):
        n = int(np.prod(shape))
        infos[name] = SimpleNamespace(name=name, shape=shape, type_name="F32", nbytes=4 * n)
    fake = SimpleNamespace(metadata={f"{s.arch}.block_count": s.n_layer,
                                     "general.architecture": s.arch,
                                     f"{s.arch}.expert_count": s.n_expert},
                           tensors=infos)
    return {st.name: st.dst_type for st in RQ.plan(fake, quant)}


def model_path(name: str, quant: str) -> str:
    s = SHAPES[name]
    shape = dataclasses.asdict(s)
    if not s.n_nextn:   # added later: files without a head keep their names
        del shape["n_nextn"]
    key = json.dumps([GENERATOR_VERSION, shape, quant]).encode()
    tag = hashlib.sha256(key).hexdigest()[:10]
    return os.path.join(cache_dir(), f"{name}-{quant.lower()}-{tag}.gguf")


def ensure(name: str, quant: str, log=print) -> str:
    """Path of the bench model, generating it if it is not cached."""
    path = model_path(name, quant)
    if os.path.exists(path):
        return path
    log(f"generating {path} ...")
    write_model(SHAPES[name], quant, path)
    return path


def write_model(s: Shape, quant: str, path: str, seed: int | None = None) -> None:
    """Write shape s as a random-weight GGUF of mix `quant` to path
    (atomically: GGUFWriter moves the finished file into place). The
    weights come from `seed`, by default one derived from the path."""
    types = plan_types(s, quant)
    if seed is None:
        seed = int.from_bytes(hashlib.sha256(path.encode()).digest()[:8], "little")
    rng = np.random.default_rng(seed)
    with GGUFWriter(path) as w:
        for k, v in metadata(s, quant).items():
            # llama.cpp checks key types: counts UINT32, arrays of ints INT32
            if isinstance(v, bool) or isinstance(v, str):
                w.add_metadata(k, v)
            elif isinstance(v, int):
                w.add_metadata(k, v, type="UINT32")
            elif isinstance(v, float):
                w.add_metadata(k, v, type="FLOAT32")
            elif v and isinstance(v[0], bool):
                w.add_metadata(k, v, type="ARRAY", element_type="BOOL")
            elif v and isinstance(v[0], int):
                w.add_metadata(k, v, type="ARRAY", element_type="INT32")
            else:
                w.add_metadata(k, v, type="ARRAY", element_type="STRING")
        shapes = dict(tensors(s))
        for name_, shape in tensors(s):
            w.add_tensor_info(name_, shape, types[name_])
        for name_, shape in tensors(s):
            t = types[name_]
            if len(shape) == 1 or t == "F32" and not name_.endswith(".weight"):
                w.write_tensor_data(name_, _small_f32(rng, name_, shape))
            elif t == "F32" and len(shape) >= 2 and "conv1d" in name_:
                w.write_tensor_data(name_, _small_f32(rng, name_, shape))
            else:
                w.write_tensor_data(name_, _random_blocks(rng, t, int(np.prod(shape)),
                                                          shapes[name_][0]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="NAME-QUANT, e.g. dense08b-Q4_K_M (default: all)")
    ap.add_argument("--list", action="store_true", help="list the shapes and cached paths")
    a = ap.parse_args(argv)
    wanted = a.names or [f"{n}-{q}" for n in SHAPES for q in QUANTS]
    for spec in wanted:
        n, _, q = spec.partition("-")
        if n not in SHAPES or q not in QUANTS:
            ap.error(f"unknown bench model {spec!r}; shapes {list(SHAPES)}, quants {list(QUANTS)}")
        p = model_path(n, q)
        if a.list:
            print(f"{spec:22s} {'cached' if os.path.exists(p) else 'absent':7s} {p}")
        else:
            print(ensure(n, q))
    return 0


if __name__ == "__main__":
    sys.exit(main())
