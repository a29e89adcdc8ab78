"""Opt-in (DS4_REFERENCE=1, -m reference): gguf_tools requantize against
llama.cpp's llama_model_quantize (llama-cpp-python; golden_llama.quantize:
no imatrix, default parameters) on FULL-DEPTH narrow F32 models.

The golden models have 5/4 trunk blocks, too few for llama.cpp's
layer-position rules (llama-quant.cpp use_more_bits(i, n): the first and
last n/8 layers, and every third layer in between) to pick anything but the
edge cases. Here the golden per-block tensors are replicated to a realistic
depth -- dense qwen35: 24 trunk blocks + 1 nextn block (block_count 25, the
Qwen3.5 small-model depth); MoE qwen35moe: 40 trunk blocks + 1 nextn
(block_count 41, the Qwen3.5-35B-A3B depth) -- with full_attention_interval 4
(three Gated-DeltaNet blocks, then one full-attention block, as the real
models). The GDN template is golden block 0, the attention template golden
block 1, the nextn block the golden nextn block; each copy gets its own small
seeded random perturbation so that no two blocks carry identical bytes (an
order/indexing mistake then shows as a byte mismatch). n_embd stays the
golden one (256 dense / 128 MoE: the MoE rows need the K-quant fallbacks).

For every --type that llama.cpp has an ftype for (Q4_64A/Q2_64A have none),
both quantizers run on the same source; the outputs must have the same
tensor order, shapes, types and bytes, the same metadata keys and
general.file_type, and be the same file byte for byte."""

from __future__ import annotations

import filecmp
import io
import os
import zlib

import golden_llama as GL
import numpy as np
import pytest

import ds4py
from ds4py import gguf
from ds4py.gguf import ValueType
from ds4py.gguf_writer import Value, write_gguf
from gguf_tools import requantize as rq

pytestmark = pytest.mark.reference

MODELS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "golden", "models")

# trunk depth per golden model (the nextn block comes on top)
DEPTH = {"dense": 24, "moe": 40}
INTERVAL = 4
TYPES = ["Q8_0", "Q6_K", "BF16", "F16", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M"]


def _blk(name: str):
    return int(name.split(".")[1]) if name.startswith("blk.") else None


def _perturbed(shape, raw: bytes, seed: int) -> bytes:
    # relative noise of 1/20 of each value's magnitude plus a tiny absolute
    # term: blocks differ in every element, yet keep the golden distribution
    # (norm weights stay near their values, no sign flips of large entries)
    x = np.frombuffer(raw, dtype=np.float32).astype(np.float64)
    rng = np.random.default_rng(seed)
    y = x * (1.0 + 0.05 * rng.standard_normal(x.size)) + 1e-3 * rng.standard_normal(x.size)
    return y.astype(np.float32).tobytes()


def build_fulldepth(kind: str, path: str) -> str:
    with gguf.open(os.path.join(MODELS, f"{kind}-f32.gguf")) as f:
        types = f.metadata_types
        meta = {k: Value(v, types[k][0], types[k][1] if len(types[k]) > 1 else None)
                for k, v in f.metadata.items()}
        tensors = {n: (ti.type_name, ti.shape, bytes(f.raw(n))) for n, ti in f.tensors.items()}
    a = meta["general.architecture"].value
    n_old = meta[f"{a}.block_count"].value
    nextn = meta[f"{a}.nextn_predict_layers"].value
    assert nextn == 1
    head_old = n_old - 1
    rl_old = meta[f"{a}.attention.recurrent_layers"].value
    # golden layout this construction relies on: block 0 GDN, block 1 attention
    assert rl_old[0] is True and rl_old[1] is False

    n_trunk = DEPTH[kind]
    n_total = n_trunk + 1
    recurrent = [(i + 1) % INTERVAL != 0 for i in range(n_trunk)] + [False]

    def block_tensors(src_blk: int, dst_blk: int):
        out = {}
        for n, (t, shape, b) in tensors.items():
            if _blk(n) == src_blk:
                new = n.replace(f"blk.{src_blk}.", f"blk.{dst_blk}.", 1)
                out[new] = (t, shape, _perturbed(shape, b, _seed(kind, new)))
        return out

    # keep the golden file's order: globals before the blocks, the trunk,
    # output_norm, then the nextn block
    before = [n for n in tensors if _blk(n) is None and n != "output_norm.weight"]
    new_t = {n: tensors[n] for n in before}
    for i in range(n_trunk):
        new_t.update(block_tensors(0 if recurrent[i] else 1, i))
    new_t["output_norm.weight"] = tensors["output_norm.weight"]
    new_t.update(block_tensors(head_old, n_trunk))
    assert [n for n in tensors if _blk(n) is None] and all(
        n in new_t for n in tensors if _blk(n) is None)

    meta[f"{a}.block_count"] = Value(n_total, ValueType.UINT32)
    meta[f"{a}.full_attention_interval"] = Value(INTERVAL, ValueType.UINT32)
    rl = meta[f"{a}.attention.recurrent_layers"]
    meta[f"{a}.attention.recurrent_layers"] = Value(recurrent, rl.type, rl.element_type)
    # any other per-layer array must be per-block too; the golden models have
    # none besides recurrent_layers (checked here so a new one is not missed)
    for k, v in meta.items():
        if isinstance(v.value, list) and len(v.value) == n_old and not k.startswith("tokenizer."):
            assert k == f"{a}.attention.recurrent_layers", k
    write_gguf(path, meta, new_t)
    return path


def _seed(kind: str, name: str) -> int:
    # deterministic across runs (str hash() is salted per process)
    return zlib.crc32(f"{kind}:{name}".encode())


@pytest.fixture(scope="module")
def fulldepth(tmp_path_factory):
    d = tmp_path_factory.mktemp("fulldepth")
    return {k: build_fulldepth(k, str(d / f"{k}-full-f32.gguf")) for k in DEPTH}


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_fulldepth_loads(fulldepth, kind):
    with ds4py.load(fulldepth[kind]) as m:
        c = m.config
        assert c.n_layers == DEPTH[kind]
        assert c.n_nextn_layers == 1
        assert c.n_blocks == DEPTH[kind] + 1
        assert c.is_moe == (kind == "moe")


def _squeeze(shape):
    # gguf_add_tensor stores ggml_n_dims dims: trailing 1s dropped
    shape = tuple(shape)
    while len(shape) > 1 and shape[-1] == 1:
        shape = shape[:-1]
    return shape


def _diff(ref: str, ours: str, layout: bool) -> list[str]:
    """Differences between llama.cpp's output and ours. layout=False (the
    uniform types): requantize keeps the SOURCE's tensor order, shapes and
    metadata order by design (module docstring: llama.cpp's order, trailing-1
    dropping and key order only for the mixes), so only per-tensor type,
    shape up to trailing 1s, bytes, key set and general.file_type count."""
    bad = []
    with gguf.open(ref) as r, gguf.open(ours) as o:
        if set(o.tensors) != set(r.tensors):
            bad.append(f"tensor sets differ: only ours {set(o.tensors) - set(r.tensors)} "
                       f"only ref {set(r.tensors) - set(o.tensors)}")
        if layout and list(o.tensors) != list(r.tensors):
            bad.append(f"tensor order/names differ: ours {list(o.tensors)[:5]}... "
                       f"ref {list(r.tensors)[:5]}...")
        for n, t in r.tensors.items():
            if n not in o.tensors:
                bad.append(f"{n}: missing in ours")
                continue
            ot = o.tensors[n]
            oshape, rshape = ((ot.shape, t.shape) if layout
                              else (_squeeze(ot.shape), _squeeze(t.shape)))
            if (ot.type_name, oshape) != (t.type_name, rshape):
                bad.append(f"{n}: ours {ot.type_name} {ot.shape} vs llama.cpp "
                           f"{t.type_name} {t.shape}")
            elif not np.array_equal(np.asarray(o.raw(n)), np.asarray(r.raw(n))):
                bad.append(f"{n}: {t.type_name} bytes differ")
        if (list(o.metadata) if layout else set(o.metadata)) != \
                (list(r.metadata) if layout else set(r.metadata)):
            bad.append(f"metadata keys differ: ours {list(o.metadata)} ref {list(r.metadata)}")
        if o.metadata.get("general.file_type") != r.metadata.get("general.file_type"):
            bad.append(f"general.file_type ours {o.metadata.get('general.file_type')} "
                       f"ref {r.metadata.get('general.file_type')}")
    return bad


@pytest.mark.parametrize("target", TYPES)
@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_fulldepth_matches_llama_model_quantize(fulldepth, kind, target, tmp_path):
    src = fulldepth[kind]
    ref, ours = str(tmp_path / "ref.gguf"), str(tmp_path / "ours.gguf")
    GL.quiet()
    GL.quantize(src, ref, target)
    rq.requantize(src, ours, target, out=io.StringIO(), err=io.StringIO())
    layout = target in rq.MIXES
    bad = _diff(ref, ours, layout)
    assert not bad, "\n".join(bad)
    if layout:
        assert filecmp.cmp(ours, ref, shallow=False)
