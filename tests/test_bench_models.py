"""The CPU benchmark's model generator and bandwidth arithmetic (bench/).

The generator writes random quantized blocks straight into a GGUF; what must
hold is that the file is a model both engines load and run (finite logits),
with the tensor types llama.cpp's quantizer would choose and the sizes the
shapes imply. A tiny shape keeps this fast; the real shapes' sizes are
checked from the plan alone (no file written).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "bench"))

import bench_cpu  # noqa: E402
import bench_models as BM  # noqa: E402

import ds4py  # noqa: E402
from ds4py import gguf  # noqa: E402
from ds4py import quants as Q  # noqa: E402

TINY_DENSE = BM.Shape("qwen35", 4, 256, 2, 1, 64, 2, 4, 64, n_ff=512, n_vocab=1024)
TINY_MOE = BM.Shape("qwen35moe", 4, 256, 2, 1, 64, 2, 4, 64, n_expert=8, n_expert_used=2,
                    n_ff_exp=256, n_ff_shexp=256, n_vocab=1024, tied=False)


def _file_bytes(shape, quant):
    types = BM.plan_types(shape, quant)
    total = 0
    for name, dims in BM.tensors(shape):
        i = Q.type_info(types[name])
        total += int(np.prod(dims)) // i.block_size * i.type_size
    return total


@pytest.mark.parametrize("name,quant,gb", [
    # the anchor table: 0.80 / 0.52 GB dense, 6.1 / 3.6 GB MoE
    ("dense08b", "Q8_0", 0.80), ("dense08b", "Q4_K_M", 0.52),
    ("moe", "Q8_0", 6.12), ("moe", "Q4_K_M", 3.59),
])
def test_real_shapes_have_the_expected_size(name, quant, gb):
    assert abs(_file_bytes(BM.SHAPES[name], quant) / 1e9 - gb) < 0.01


def test_q4_k_m_plan_is_llama_cpps_mix():
    t = BM.plan_types(BM.SHAPES["dense08b"], "Q4_K_M")
    assert t["token_embd.weight"] == "Q6_K"           # tied: the output rule
    assert t["blk.0.ffn_down.weight"] == "Q6_K"       # use_more_bits: first eighth
    assert t["blk.4.ffn_down.weight"] == "Q4_K"
    assert t["blk.0.ffn_gate.weight"] == "Q4_K"
    assert t["blk.0.attn_norm.weight"] == "F32" and t["blk.0.ssm_conv1d.weight"] == "F32"
    assert set(BM.plan_types(BM.SHAPES["dense08b"], "Q8_0").values()) == {"Q8_0", "F32"}


@pytest.mark.parametrize("shape,quant", [(TINY_DENSE, "Q8_0"), (TINY_DENSE, "Q4_K_M"),
                                         (TINY_MOE, "Q4_K_M")])
def test_generated_model_loads_and_runs(tmp_path, shape, quant):
    path = str(tmp_path / "m.gguf")
    BM.write_model(shape, quant, path)
    assert os.path.getsize(path) > _file_bytes(shape, quant)  # data plus header
    f = gguf.open(path)
    types = BM.plan_types(shape, quant)
    for name, dims in BM.tensors(shape):
        assert f.tensors[name].type_name == types[name]
        assert tuple(f.tensors[name].shape) == tuple(dims)
    m = ds4py.Model.load(path, n_threads=1, n_ctx=256)
    with m.new_session() as s:
        lg = np.array(s.eval(list(range(40)), all_logits=True))
    assert lg.shape == (40, shape.n_vocab) and np.isfinite(lg).all()
    # random weights, but not degenerate: logits vary across the vocabulary
    assert lg.std() > 1e-3


def test_bytes_per_token(tmp_path):
    """The decode bytes breakdown, recomputed by hand from the shape."""
    path = str(tmp_path / "m.gguf")
    s = TINY_MOE
    BM.write_model(s, "Q8_0", path)
    b = bench_cpu.bytes_per_token(path, 1000)
    f = gguf.open(path)
    exp = sum(t.nbytes for n, t in f.tensors.items() if "_exps." in n)
    other = sum(t.nbytes for n, t in f.tensors.items()
                if "_exps." not in n and n not in ("token_embd.weight", "output.weight"))
    assert b["weights"] == other + exp * s.n_expert_used // s.n_expert
    assert b["head"] == f.tensors["output.weight"].nbytes
    n_attn = s.n_layer // s.attn_interval
    assert b["kv"] == n_attn * 2 * s.n_head_kv * s.head_dim * 1000 * 2       # F16 K and V
    n_gdn = s.n_layer - n_attn
    conv = 3 * (2 * s.ssm_nk * s.ssm_d + s.ssm_nv * s.ssm_d) * 4
    assert b["gdn_state"] == n_gdn * 2 * (s.ssm_nv * s.ssm_d * s.ssm_d * 4 + conv)
    assert b["total"] == b["weights"] + b["head"] + b["kv"] + b["gdn_state"]


def test_membw_measures_and_refuses_bad_arguments():
    from ds4py._core import ffi, lib, new_error
    g, err = ffi.new("double *"), new_error()
    for kind in (lib.DS4_MEMBW_READ, lib.DS4_MEMBW_TRIAD):
        assert lib.ds4_membw(2, kind, 1 << 22, 2, g, err) == 0
        # any real memory system moves more than 0.1 GB/s; a wrong byte count
        # or timer would show as 0 or as something absurd
        assert 0.1 < g[0] < 10000
    assert lib.ds4_membw(2, 7, 1 << 22, 2, g, err) == lib.DS4_ERR_ARG
    assert lib.ds4_membw(2, lib.DS4_MEMBW_READ, 100, 2, g, err) == lib.DS4_ERR_ARG
    assert lib.ds4_membw(0, lib.DS4_MEMBW_READ, 1 << 22, 2, g, err) == lib.DS4_ERR_ARG
