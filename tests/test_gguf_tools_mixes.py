"""gguf_tools requantize --type {Q4_K_M,Q4_K_S,Q5_K_M,Q5_K_S}: llama.cpp's mixes.

The committed tests/golden/models/*-q4_k_m.gguf were written by llama.cpp's
llama_model_quantize (ftype 15, no imatrix) from the *-f32.gguf next to them
(tests/golden/README.md), so Q4_K_M is checked against them byte for byte.
For the other three mixes there is no committed llama.cpp file; their plans
are checked against expectations written out below from reading
llama-quant.cpp llama_tensor_get_type_impl (the live comparison of all four
mixes against llama.cpp is tests/reference/test_live_mixes.py, opt-in).
"""

from __future__ import annotations

import filecmp
import io
import os
import subprocess
import sys

import numpy as np
import pytest

import ds4py
from ds4py import gguf
from gguf_tools import main
from gguf_tools import requantize as rq

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "golden", "models")


def model(name: str) -> str:
    return os.path.join(MODELS, name + ".gguf")


def run(argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = main(argv, out, err)
    return rc, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("m", ["dense", "moe"])
def test_q4_k_m_plan_matches_llamacpp_file(m):
    """Every tensor's type (and the tensor order) is the one llama.cpp chose."""
    with gguf.open(model(f"{m}-f32")) as f, gguf.open(model(f"{m}-q4_k_m")) as ref:
        steps = rq.plan(f, "Q4_K_M")
        assert [s.name for s in steps] == list(ref.tensors)
        for s in steps:
            r = ref.tensors[s.name]
            assert (s.dst_type, s.shape) == (r.type_name, r.shape), s


@pytest.mark.parametrize("m", ["dense", "moe"])
def test_q4_k_m_byte_identical_to_llamacpp(m, tmp_path):
    dst = str(tmp_path / "out.gguf")
    rc, out, err = run(["requantize", model(f"{m}-f32"), dst, "--type", "Q4_K_M",
                        "--threads", "2"])
    assert rc == 0, err
    if not filecmp.cmp(dst, model(f"{m}-q4_k_m"), shallow=False):
        # say which part differs before failing
        with gguf.open(dst) as a, gguf.open(model(f"{m}-q4_k_m")) as b:
            assert list(a.metadata) == list(b.metadata)
            for n, t in b.tensors.items():
                assert a.tensors[n].type_name == t.type_name, n
                assert np.array_equal(np.asarray(a.raw(n)), np.asarray(b.raw(n))), n
        pytest.fail("files differ outside metadata keys and tensor bytes")


# Expected non-F32 types per mix, from llama-quant.cpp llama_tensor_get_type_impl
# for these two models (dense: qwen35, n_expert 0, block_count 6, tied
# embeddings, rows of 256 for the input projections and 64 for ssm_out /
# attn_output / ffn_down; moe: qwen35moe, n_expert 8, block_count 5, rows of
# 128 except nextn.eh_proj (256) and ssm_out / ffn_down* (64 / 32)).
# Position counters: attn_v-like (attn_qkv + attn_v, visited by layer then
# name) dense 0..5 = blk0 qkv, blk1 v, blk2 qkv, blk3 v, blk4 qkv, blk5 v;
# moe 0..4 = blk0 qkv, blk1 v, blk2 qkv, blk3 v, blk4 v.
# use_more_bits(i, 6) is true for i = 2, 5; use_more_bits(i, 5) for i = 2, 4.
# Fallbacks (row not whole 256-blocks): Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0.
def _base(mix, ncols):
    base = rq.MIXES[mix]
    return base if ncols % 256 == 0 else {"Q4_K": "Q5_0", "Q5_K": "Q5_1"}[base]


EXPECTED_SPECIAL = {
    # tied token_embd takes the output rule -> Q6_K (row 256); Q4_K_S: the
    # first 4 attn_v-like tensors (i_attention_wv < 4) -> Q5_K; ffn_down
    # i_layer < 6/8 = 0: none.
    ("dense", "Q4_K_S"): {
        "token_embd.weight": "Q6_K",
        "blk.0.attn_qkv.weight": "Q5_K", "blk.1.attn_v.weight": "Q5_K",
        "blk.2.attn_qkv.weight": "Q5_K", "blk.3.attn_v.weight": "Q5_K",
    },
    # _M: attn_v-like #2, #5 and ffn_down layers 2, 5 -> Q6_K (ffn_down rows
    # of 64 -> Q8_0)
    ("dense", "Q5_K_M"): {
        "token_embd.weight": "Q6_K",
        "blk.2.attn_qkv.weight": "Q6_K", "blk.5.attn_v.weight": "Q6_K",
        "blk.2.ffn_down.weight": "Q8_0", "blk.5.ffn_down.weight": "Q8_0",
    },
    ("dense", "Q5_K_S"): {"token_embd.weight": "Q6_K"},
    # n_expert == 8: every attn_v-like and attn_k -> Q8_0; output.weight rows of
    # 128 -> Q8_0; untied token_embd keeps the base type (-> fallback);
    # Q4_K_S/Q4_K_M: attn_output -> Q5_K (rows of 128 -> Q5_1).
    ("moe", "Q4_K_S"): {
        "output.weight": "Q8_0",
        **{f"blk.{i}.attn_qkv.weight": "Q8_0" for i in (0, 2)},
        **{f"blk.{i}.{n}.weight": "Q8_0" for i in (1, 3, 4) for n in ("attn_v", "attn_k")},
        **{f"blk.{i}.attn_output.weight": "Q5_1" for i in (1, 3, 4)},
    },
    # _M: ffn_down* of layers 2 and 4 (layer parsed from the name as there are
    # experts; use_more_bits(i, 5)) -> Q6_K -> Q8_0; attn_output stays Q5_K
    # base (not in the n_expert == 8 list for Q5_K_M) -> Q5_1
    ("moe", "Q5_K_M"): {
        "output.weight": "Q8_0",
        **{f"blk.{i}.attn_qkv.weight": "Q8_0" for i in (0, 2)},
        **{f"blk.{i}.{n}.weight": "Q8_0" for i in (1, 3, 4) for n in ("attn_v", "attn_k")},
        **{f"blk.{i}.ffn_down_{e}.weight": "Q8_0" for i in (2, 4) for e in ("exps", "shexp")},
    },
    ("moe", "Q5_K_S"): {
        "output.weight": "Q8_0",
        **{f"blk.{i}.attn_qkv.weight": "Q8_0" for i in (0, 2)},
        **{f"blk.{i}.{n}.weight": "Q8_0" for i in (1, 3, 4) for n in ("attn_v", "attn_k")},
    },
}


@pytest.mark.parametrize("m,mix", sorted(EXPECTED_SPECIAL))
def test_other_mix_plans_follow_documented_rules(m, mix):
    special = EXPECTED_SPECIAL[(m, mix)]
    with gguf.open(model(f"{m}-f32")) as f:
        steps = rq.plan(f, mix)
    names = {s.name for s in steps}
    assert set(special) <= names
    for s in steps:
        if s.action == "copy":
            assert s.dst_type == "F32" and s.name not in special, s
            continue
        want = special.get(s.name, _base(mix, s.shape[0]))
        assert s.dst_type == want, s


@pytest.mark.parametrize("mix,ftype", [("Q4_K_S", 14), ("Q4_K_M", 15), ("Q5_K_S", 16),
                                       ("Q5_K_M", 17)])
def test_mix_metadata(mix, ftype, tmp_path):
    """general.file_type (llama.h llama_ftype) and llama.cpp's key order: the
    two keys it sets are moved to the end."""
    dst = str(tmp_path / "out.gguf")
    rc, _, err = run(["requantize", model("dense-f32"), dst, "--type", mix.lower()])
    assert rc == 0, err
    with gguf.open(dst) as g, gguf.open(model("dense-f32")) as f:
        keys = list(g.metadata)
        assert keys[-2:] == ["general.quantization_version", "general.file_type"]
        assert g.metadata["general.file_type"] == ftype
        assert g.metadata["general.quantization_version"] == 2
        assert keys[:-2] == [k for k in f.metadata
                             if k not in ("general.quantization_version", "general.file_type")]


def test_use_more_bits_pattern():
    # llama_tensor_get_type_impl use_more_bits for 32 layers, written out:
    # i < 4, i >= 28, and (i - 4) % 3 == 2
    want = {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31}
    assert {i for i in range(32) if rq._use_more_bits(i, 32)} == want
    assert {i for i in range(6) if rq._use_more_bits(i, 6)} == {2, 5}


def test_mix_override_and_dry_run():
    """--tensor-type wins over the mix rule (and is still subject to the
    fallback); --dry-run shows the rule that chose each type."""
    out = io.StringIO()
    steps = rq.requantize(model("dense-f32"), os.devnull, "Q4_K_M",
                          tensor_types=[r"attn_v\.weight=Q8_0", r"ffn_down=Q4_K"],
                          dry_run=True, out=out, err=io.StringIO())
    by = {s.name: s for s in steps}
    assert by["blk.5.attn_v.weight"].dst_type == "Q8_0"
    assert by["blk.2.ffn_down.weight"].dst_type == "Q5_0"   # Q4_K, rows of 64
    # the attn_v-like counter skips overridden tensors, as llama.cpp's does:
    # qkv tensors are #0, #1, #2 of 6, none of them use_more_bits-promoted but #2
    assert by["blk.2.attn_qkv.weight"].dst_type == "Q4_K"
    assert by["blk.4.attn_qkv.weight"].dst_type == "Q6_K"
    assert "use_more_bits" in by["blk.4.attn_qkv.weight"].reason
    assert "blk.4.attn_qkv.weight" in out.getvalue()


def test_other_mixes_still_refused(tmp_path):
    rc, _, err = run(["requantize", model("dense-f32"), str(tmp_path / "x"), "--type", "Q3_K_M"])
    assert rc == 2 and "mixes are not implemented yet" in err


# --token-embedding-type / --output-tensor-type, as llama-quant.cpp's outer
# wrapper llama_tensor_get_type orders them: the token embedding takes
# token_embedding_type, output.weight takes output_tensor_type, both ahead of
# the mix rules; a tied head's token embedding takes output_tensor_type only
# when no token_embedding_type is given (the "has_tied_embeddings" branch).
def _types(path, target, **kw):
    with gguf.open(path) as f:
        return {s.name: s.dst_type for s in rq.plan(f, target, **kw)}


def test_output_tensor_type_untied_moe():
    base = _types(os.path.join(MODELS, "moe-f32.gguf"), "Q4_K_M")
    got = _types(os.path.join(MODELS, "moe-f32.gguf"), "Q4_K_M", output_tensor_type="Q4_0")
    assert got["output.weight"] == "Q4_0" and base["output.weight"] != "Q4_0"
    # nothing else moves (the override does not advance the mix's counters)
    assert {k: v for k, v in got.items() if k != "output.weight"} == \
        {k: v for k, v in base.items() if k != "output.weight"}


def test_output_tensor_type_applies_to_tied_embedding():
    got = _types(os.path.join(MODELS, "dense-f32.gguf"), "Q4_K_M", output_tensor_type="Q8_0")
    assert got["token_embd.weight"] == "Q8_0"


def test_token_embedding_type_wins_over_output_type_when_tied():
    got = _types(os.path.join(MODELS, "dense-f32.gguf"), "Q4_K_M", token_embedding_type="Q4_0",
                 output_tensor_type="Q8_0")
    assert got["token_embd.weight"] == "Q4_0"


def test_embedding_overrides_on_cli(tmp_path):
    dst = tmp_path / "o.gguf"
    rc = subprocess.run([sys.executable, "-m", "gguf_tools", "requantize",
                         str(os.path.join(MODELS, "moe-f32.gguf")), str(dst), "--type", "Q8_0",
                         "--token-embedding-type", "Q4_0", "--output-tensor-type", "Q5_0"],
                        capture_output=True, text=True, check=False)
    assert rc.returncode == 0, rc.stderr
    with ds4py.gguf.open(dst) as f:
        assert f.tensors["token_embd.weight"].type_name == "Q4_0"
        assert f.tensors["output.weight"].type_name == "Q5_0"
    ds4py.load(dst)  # and the file runs
