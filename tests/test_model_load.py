"""The model loader (csrc/model.c, csrc/model_config.c, ds4py/model.py).

Independent references: the transformers configs the golden models were
made from (tests/golden/models/*.config.json) and gguf-py's own reading of
the files. Refusals are checked on copies of a golden model edited with
ds4py.gguf_writer; each test checks that the message names the culprit.
"""

from __future__ import annotations

import json
import math
import os

import gguf as gguf_py
import numpy as np
import pytest

import ds4py
from ds4py import GGUFError, Model, ModelError
from ds4py._core import ffi, lib
from ds4py.gguf import ValueType
from ds4py.gguf_writer import Value, write_gguf

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "golden", "models")
QUANTS = ["f32", "bf16", "q8_0", "q4_k_m"]
GOLDEN = [f"{kind}-{q}" for kind in ("dense", "moe") for q in QUANTS]


def golden_path(name: str) -> str:
    return os.path.join(MODELS, name + ".gguf")


def hf_config(kind: str) -> dict:
    with open(os.path.join(MODELS, f"{kind}.config.json")) as f:
        return json.load(f)


# --------------------------------------------------------------- golden files

@pytest.mark.parametrize("name", GOLDEN)
def test_golden_config_matches_hf(name):
    kind = name.split("-")[0]
    hf = hf_config(kind)
    rope = hf["rope_parameters"]
    n_mtp = hf["mtp_num_hidden_layers"]
    with Model.load(golden_path(name)) as m:
        c = m.config
    assert c.arch == ("qwen35" if kind == "dense" else "qwen35moe")
    assert c.is_moe == (kind == "moe")
    assert c.vocab_size == hf["vocab_size"]
    assert c.hidden_size == hf["hidden_size"]
    assert c.n_layers == hf["num_hidden_layers"]
    assert c.n_nextn_layers == n_mtp
    assert c.n_blocks == hf["num_hidden_layers"] + n_mtp
    assert c.context_length == hf["max_position_embeddings"]
    # the GGUF stores float32: exact equality with the float32 of the HF value
    assert c.rms_norm_eps == float(np.float32(hf["rms_norm_eps"]))
    assert c.rope_theta == float(np.float32(rope["rope_theta"]))
    assert c.n_heads == hf["num_attention_heads"]
    assert c.n_kv_heads == hf["num_key_value_heads"]
    assert c.head_dim == hf["head_dim"]
    assert c.rope_dims == int(hf["head_dim"] * rope["partial_rotary_factor"])
    # 1/sqrt(head_dim) computed in float32 by the core (1.0f / sqrtf): within
    # one float32 rounding (rel 2^-23) of the exact value
    assert c.attention_scale == pytest.approx(1 / math.sqrt(hf["head_dim"]), rel=2**-23)
    assert c.conv_kernel == hf["linear_conv_kernel_dim"]
    assert c.ssm_state_size == hf["linear_key_head_dim"] == hf["linear_value_head_dim"]
    assert c.ssm_n_key_heads == hf["linear_num_key_heads"]
    assert c.ssm_n_value_heads == hf["linear_num_value_heads"]
    assert c.ssm_inner_size == hf["linear_value_head_dim"] * hf["linear_num_value_heads"]
    if kind == "dense":
        assert c.ffn_size == hf["intermediate_size"]
        assert (c.n_experts, c.n_experts_used, c.expert_ffn_size, c.shared_expert_ffn_size) == \
            (0, 0, 0, 0)
    else:
        assert c.ffn_size == 0
        assert c.n_experts == hf["num_experts"]
        assert c.n_experts_used == hf["num_experts_per_tok"]
        assert c.expert_ffn_size == hf["moe_intermediate_size"]
        assert c.shared_expert_ffn_size == hf["shared_expert_intermediate_size"]
    assert c.tied_embeddings == hf["tie_word_embeddings"]
    assert c.fused_gate_up_exps is False
    kinds = {"linear_attention": "gdn", "full_attention": "attn"}
    assert c.layer_kinds == tuple(kinds[t] for t in hf["layer_types"]) + ("nextn",) * n_mtp


@pytest.mark.parametrize("name", ["dense-q8_0", "moe-q4_k_m"])
def test_golden_config_matches_gguf_py(name):
    r = gguf_py.GGUFReader(golden_path(name))

    def kv(key):
        return r.fields[key].contents()

    arch = kv("general.architecture")
    a = arch + "."
    with Model.load(golden_path(name)) as m:
        c = m.config
    assert c.arch == arch
    assert c.n_blocks == kv(a + "block_count")
    assert c.n_nextn_layers == kv(a + "nextn_predict_layers")
    assert c.n_layers == kv(a + "block_count") - kv(a + "nextn_predict_layers")
    assert c.context_length == kv(a + "context_length")
    assert c.hidden_size == kv(a + "embedding_length")
    assert c.rms_norm_eps == kv(a + "attention.layer_norm_rms_epsilon")
    assert c.n_heads == kv(a + "attention.head_count")
    assert c.n_kv_heads == kv(a + "attention.head_count_kv")
    assert c.head_dim == kv(a + "attention.key_length") == kv(a + "attention.value_length")
    assert c.rope_dims == kv(a + "rope.dimension_count")
    assert c.rope_theta == kv(a + "rope.freq_base")
    assert c.conv_kernel == kv(a + "ssm.conv_kernel")
    assert c.ssm_state_size == kv(a + "ssm.state_size")
    assert c.ssm_n_key_heads == kv(a + "ssm.group_count")
    assert c.ssm_n_value_heads == kv(a + "ssm.time_step_rank")
    assert c.ssm_inner_size == kv(a + "ssm.inner_size")
    rec = kv(a + "attention.recurrent_layers")
    assert c.layer_kinds == tuple("nextn" if i >= c.n_layers else "gdn" if x else "attn"
                                  for i, x in enumerate(rec))
    if arch == "qwen35":
        assert c.ffn_size == kv(a + "feed_forward_length")
    else:
        assert c.n_experts == kv(a + "expert_count")
        assert c.n_experts_used == kv(a + "expert_used_count")
        assert c.expert_ffn_size == kv(a + "expert_feed_forward_length")
        assert c.shared_expert_ffn_size == kv(a + "expert_shared_feed_forward_length")
    assert c.vocab_size == len(kv("tokenizer.ggml.tokens"))
    names = {t.name for t in r.tensors}
    assert c.tied_embeddings == ("output.weight" not in names)


# role -> GGUF name, written out here from qwen35-spec.md §2 (independent of
# the loader's tables)
GLOBAL_NAMES = {"token_embd": "token_embd.weight", "output_norm": "output_norm.weight",
                "output": "output.weight"}
LAYER_SUFFIX = {
    "attn_norm": "attn_norm.weight", "post_attention_norm": "post_attention_norm.weight",
    "attn_qkv": "attn_qkv.weight", "attn_gate": "attn_gate.weight",
    "ssm_conv1d": "ssm_conv1d.weight", "ssm_dt_bias": "ssm_dt.bias", "ssm_a": "ssm_a",
    "ssm_beta": "ssm_beta.weight", "ssm_alpha": "ssm_alpha.weight",
    "ssm_norm": "ssm_norm.weight", "ssm_out": "ssm_out.weight",
    "attn_q": "attn_q.weight", "attn_k": "attn_k.weight", "attn_v": "attn_v.weight",
    "attn_output": "attn_output.weight", "attn_q_norm": "attn_q_norm.weight",
    "attn_k_norm": "attn_k_norm.weight",
    "ffn_gate": "ffn_gate.weight", "ffn_up": "ffn_up.weight", "ffn_down": "ffn_down.weight",
    "ffn_gate_inp": "ffn_gate_inp.weight", "ffn_gate_exps": "ffn_gate_exps.weight",
    "ffn_up_exps": "ffn_up_exps.weight", "ffn_gate_up_exps": "ffn_gate_up_exps.weight",
    "ffn_down_exps": "ffn_down_exps.weight", "ffn_gate_inp_shexp": "ffn_gate_inp_shexp.weight",
    "ffn_gate_shexp": "ffn_gate_shexp.weight", "ffn_up_shexp": "ffn_up_shexp.weight",
    "ffn_down_shexp": "ffn_down_shexp.weight",
    "nextn_eh_proj": "nextn.eh_proj.weight", "nextn_enorm": "nextn.enorm.weight",
    "nextn_hnorm": "nextn.hnorm.weight", "nextn_shared_head_norm": "nextn.shared_head_norm.weight",
    "nextn_embed_tokens": "nextn.embed_tokens.weight",
    "nextn_shared_head_head": "nextn.shared_head_head.weight",
}
COMMON = {"attn_norm", "post_attention_norm"}
GDN_ROLES = {"attn_qkv", "attn_gate", "ssm_conv1d", "ssm_dt_bias", "ssm_a", "ssm_beta",
             "ssm_alpha", "ssm_norm", "ssm_out"}
ATTN_ROLES = {"attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm"}
DENSE_FFN = {"ffn_gate", "ffn_up", "ffn_down"}
MOE_FFN = {"ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_inp_shexp",
           "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"}
NEXTN_ROLES = {"nextn_eh_proj", "nextn_enorm", "nextn_hnorm", "nextn_shared_head_norm"}


def read_at(address: int, n: int) -> bytes:
    return bytes(ffi.buffer(ffi.cast("char *", address), n))


@pytest.mark.parametrize("name", GOLDEN)
def test_golden_tensors_bound_as_file_says(name):
    r = gguf_py.GGUFReader(golden_path(name))
    file_tensors = {t.name: t for t in r.tensors}
    with open(golden_path(name), "rb") as f:
        blob = f.read()
    with Model.load(golden_path(name)) as m:
        bound = m.tensors()
        c = m.config
        seen = set()
        for b in bound:
            if b.layer < 0:
                assert b.name == GLOBAL_NAMES[b.role]
            else:
                assert b.name == f"blk.{b.layer}.{LAYER_SUFFIX[b.role]}"
            ft = file_tensors[b.name]
            assert b.type_id == int(ft.tensor_type)
            # gguf-py's ReaderTensor.shape is in GGUF order (ne[0] first)
            assert b.shape == tuple(int(d) for d in ft.shape)
            block, size = gguf_py.GGML_QUANT_SIZES[ft.tensor_type]
            assert b.row_bytes == b.shape[0] // block * size
            ne1 = b.shape[1] if len(b.shape) > 1 else 1
            assert b.expert_bytes == b.row_bytes * ne1
            # the slot points at the tensor's bytes inside the mapping
            assert read_at(b.address, int(ft.n_bytes)) == \
                blob[ft.data_offset:ft.data_offset + int(ft.n_bytes)]
            seen.add(b.name)
        # every file tensor is bound exactly once (no aliases in these files)
        assert len(bound) == len(file_tensors) == len(seen)
        # the slots of each block are those of its kind
        for il, k in enumerate(c.layer_kinds):
            roles = {b.role for b in bound if b.layer == il}
            mixer = GDN_ROLES if k == "gdn" else ATTN_ROLES
            ffn = MOE_FFN if c.is_moe else DENSE_FFN
            extra = NEXTN_ROLES if k == "nextn" else set()
            assert roles == COMMON | mixer | ffn | extra
        globals_ = {b.role for b in bound if b.layer < 0}
        head = set() if c.tied_embeddings else {"output"}
        assert globals_ == {"token_embd", "output_norm"} | head


# ------------------------------------------------------ edited golden copies

_CACHE: dict[str, tuple[dict, dict]] = {}


def load_parts(name: str) -> tuple[dict, dict]:
    """(metadata, tensors) of a golden file in write_gguf's form (copies)."""
    if name not in _CACHE:
        with ds4py.gguf.open(golden_path(name)) as f:
            types = f.metadata_types
            meta = {k: Value(v, types[k][0], types[k][1] if len(types[k]) > 1 else None)
                    for k, v in f.metadata.items()}
            tensors = {n: (ti.type_name, ti.shape, bytes(f.raw(n))) for n, ti in f.tensors.items()}
        _CACHE[name] = (meta, tensors)
    meta, tensors = _CACHE[name]
    return dict(meta), dict(tensors)


def build(tmp_path, name: str, edit=None, fname="edited.gguf") -> str:
    meta, tensors = load_parts(name)
    if edit is not None:
        edit(meta, tensors)
    path = str(tmp_path / fname)
    write_gguf(path, meta, tensors)
    return path


def u32(v):
    return Value(v, ValueType.UINT32)


def zeros(type_name: str, shape) -> bytes:
    block, size = gguf_py.GGML_QUANT_SIZES[gguf_py.GGMLQuantizationType[type_name]]
    n = int(np.prod(shape))
    return bytes(n // block * size)


def retype(tensors, tname, type_name):
    shape = tensors[tname][1]
    tensors[tname] = (type_name, shape, zeros(type_name, shape))


def test_unchanged_copy_loads(tmp_path):
    # the edit machinery itself does not break a file
    with Model.load(build(tmp_path, "moe-q8_0")) as m:
        assert m.config.n_experts == 8


def test_shared_head_norm_falls_back_to_output_norm(tmp_path):
    def edit(meta, tensors):
        del tensors["blk.5.nextn.shared_head_norm.weight"]
    with Model.load(build(tmp_path, "dense-q8_0", edit)) as m:
        slot = [b for b in m.tensors() if b.role == "nextn_shared_head_norm"]
        out_norm = [b for b in m.tensors() if b.role == "output_norm"]
    assert len(slot) == 1 and slot[0].name == "output_norm.weight"
    assert slot[0].layer == 5 and slot[0].address == out_norm[0].address


def test_optional_nextn_tensors_bound(tmp_path):
    def edit(meta, tensors):
        tensors["blk.5.nextn.embed_tokens.weight"] = tensors["token_embd.weight"]
        tensors["blk.5.nextn.shared_head_head.weight"] = ("F32", (256, 512), bytes(256 * 512 * 4))
    with Model.load(build(tmp_path, "dense-q8_0", edit)) as m:
        roles = {b.role: b for b in m.tensors() if b.layer == 5}
    assert roles["nextn_embed_tokens"].shape == (256, 512)
    assert roles["nextn_shared_head_head"].type_id == lib.DS4_TYPE_F32


def test_fused_gate_up_experts(tmp_path):
    """ffn_gate_up_exps {n_embd, 2*n_ff_exp, n_expert}: gate rows then up rows
    of each expert (qwen35-spec.md §2)."""
    def edit(meta, tensors):
        for il in range(5):
            g = tensors.pop(f"blk.{il}.ffn_gate_exps.weight")
            u = tensors.pop(f"blk.{il}.ffn_up_exps.weight")
            ne0, ff, ne = g[1]
            gb = np.frombuffer(g[2], np.uint8).reshape(ne, -1)
            ub = np.frombuffer(u[2], np.uint8).reshape(ne, -1)
            tensors[f"blk.{il}.ffn_gate_up_exps.weight"] = (
                g[0], (ne0, 2 * ff, ne), np.concatenate([gb, ub], axis=1).tobytes())
    _, tensors0 = load_parts("moe-q8_0")
    with Model.load(build(tmp_path, "moe-q8_0", edit)) as m:
        assert m.config.fused_gate_up_exps is True
        b = [t for t in m.tensors() if t.layer == 2 and t.role == "ffn_gate_up_exps"][0]
        assert not [t for t in m.tensors() if t.role in ("ffn_gate_exps", "ffn_up_exps")]
        assert b.shape == (128, 64, 8)
        # expert 3, first half = the original gate of expert 3
        gate = tensors0["blk.2.ffn_gate_exps.weight"][2]
        per = len(gate) // 8
        assert read_at(b.address + 3 * b.expert_bytes, per) == gate[3 * per:4 * per]
        assert b.expert_bytes == 2 * per


def test_layer_kinds_from_interval(tmp_path):
    # without recurrent_layers, full_attention_interval (2 here) decides
    def edit(meta, tensors):
        del meta["qwen35.attention.recurrent_layers"]
    with Model.load(build(tmp_path, "dense-q8_0", edit)) as m:
        assert m.config.layer_kinds == ("gdn", "attn", "gdn", "attn", "gdn", "nextn")


def test_layer_kinds_int_array(tmp_path):
    def edit(meta, tensors):
        meta["qwen35.attention.recurrent_layers"] = Value([1, 0, 1, 0, 1, 0], ValueType.ARRAY,
                                                          ValueType.INT32)
    with Model.load(build(tmp_path, "dense-q8_0", edit)) as m:
        assert m.config.layer_kinds == ("gdn", "attn", "gdn", "attn", "gdn", "nextn")


def test_default_interval_is_4(tmp_path):
    # neither key: interval 4 makes block 1 a GDN layer, whose tensors the
    # file (made with interval 2) does not have
    def edit(meta, tensors):
        del meta["qwen35.attention.recurrent_layers"]
        del meta["qwen35.full_attention_interval"]
    with pytest.raises(ModelError, match=r"blk\.1\.attn_qkv\.weight"):
        Model.load(build(tmp_path, "dense-q8_0", edit))


def test_moe_fallback_ffn_sizes(tmp_path):
    # expert sizes fall back to feed_forward_length / expert_used_count and
    # feed_forward_length (qwen35moe.cpp load_block_trunk)
    def edit(meta, tensors):
        del meta["qwen35moe.expert_feed_forward_length"]
        del meta["qwen35moe.expert_shared_feed_forward_length"]
        meta["qwen35moe.feed_forward_length"] = u32(96)
    with pytest.raises(ModelError, match=r"ffn_gate_shexp\.weight.*\[128, 32\].*\[128, 96\]"):
        # n_ff_exp = 96 // 3 = 32 fits the experts, n_ff_shexp = 96 does not
        Model.load(build(tmp_path, "moe-q8_0", edit))


def drop_trunk(meta, tensors):
    for n in list(tensors):
        if n.startswith("blk.") and int(n.split(".")[1]) < 5:
            del tensors[n]


def _del(key):
    def edit(meta, tensors):
        del meta[key]
    return edit


def _set(key, value):
    def edit(meta, tensors):
        meta[key] = value
    return edit


def _drop_tensor(name):
    def edit(meta, tensors):
        del tensors[name]
    return edit


def _retype(name, type_name):
    def edit(meta, tensors):
        retype(tensors, name, type_name)
    return edit


def _transpose(name):
    def edit(meta, tensors):
        t, shape, data = tensors[name]
        tensors[name] = (t, (shape[1], shape[0]) + tuple(shape[2:]), data)
    return edit


def _add_tensor(name, type_name, shape):
    def edit(meta, tensors):
        tensors[name] = (type_name, shape, zeros(type_name, shape))
    return edit


def _arch_llama(meta, tensors):
    meta["general.architecture"] = Value("llama", ValueType.STRING)
    for k in list(meta):
        if k.startswith("qwen35."):
            meta["llama." + k[len("qwen35."):]] = meta.pop(k)


def _both_expert_forms(meta, tensors):
    g = tensors["blk.0.ffn_gate_exps.weight"]
    tensors["blk.0.ffn_gate_up_exps.weight"] = (g[0], (128, 64, 8), g[2] * 2)


def _truncate_vocab(meta, tensors):
    toks = meta["tokenizer.ggml.tokens"]
    meta["tokenizer.ggml.tokens"] = Value(toks.value[:500], toks.type, toks.element_type)


# (id, golden file, edit, regex the message must match, expected code)
REFUSALS = [
    ("missing-state-size", "dense-q8_0", _del("qwen35.ssm.state_size"),
     r"'qwen35\.ssm\.state_size' is missing", lib.DS4_ERR_NOT_FOUND),
    ("missing-sections", "dense-q8_0", _del("qwen35.rope.dimension_sections"),
     r"'qwen35\.rope\.dimension_sections' is missing", lib.DS4_ERR_NOT_FOUND),
    ("missing-arch", "dense-q8_0", _del("general.architecture"),
     r"'general\.architecture' is missing", lib.DS4_ERR_NOT_FOUND),
    ("missing-eps", "moe-q8_0", _del("qwen35moe.attention.layer_norm_rms_epsilon"),
     r"'qwen35moe\.attention\.layer_norm_rms_epsilon' is missing", lib.DS4_ERR_NOT_FOUND),
    ("missing-expert-count", "moe-q8_0", _del("qwen35moe.expert_count"),
     r"'qwen35moe\.expert_count' is missing", lib.DS4_ERR_NOT_FOUND),
    ("missing-block-count", "moe-q8_0", _del("qwen35moe.block_count"),
     r"'qwen35moe\.block_count' is missing", lib.DS4_ERR_NOT_FOUND),
    ("arch-llama", "dense-q8_0", _arch_llama,
     r"unsupported architecture 'llama'", lib.DS4_ERR_UNSUPPORTED),
    ("block-count-string", "dense-q8_0", _set("qwen35.block_count", Value("6", ValueType.STRING)),
     r"'qwen35\.block_count' is STRING", lib.DS4_ERR_BAD_MODEL),
    ("attention-scale", "dense-q8_0",
     _set("qwen35.attention.scale", Value(0.5, ValueType.FLOAT32)),
     r"'qwen35\.attention\.scale' = 0\.5 differs from 1/sqrt\(head_dim\) = 0\.25",
     lib.DS4_ERR_UNSUPPORTED),
    ("missing-tensor", "dense-q8_0", _drop_tensor("blk.1.attn_k.weight"),
     r"'blk\.1\.attn_k\.weight' is missing", lib.DS4_ERR_NOT_FOUND),
    ("missing-embd", "moe-q8_0", _drop_tensor("token_embd.weight"),
     r"'token_embd\.weight' is missing", lib.DS4_ERR_NOT_FOUND),
    ("missing-shexp", "moe-q8_0", _drop_tensor("blk.3.ffn_down_shexp.weight"),
     r"'blk\.3\.ffn_down_shexp\.weight' is missing", lib.DS4_ERR_NOT_FOUND),
    ("missing-eh-proj", "dense-q8_0", _drop_tensor("blk.5.nextn.eh_proj.weight"),
     r"'blk\.5\.nextn\.eh_proj\.weight' is missing", lib.DS4_ERR_NOT_FOUND),
    ("wrong-shape", "dense-q8_0", _transpose("blk.2.ssm_out.weight"),
     r"'blk\.2\.ssm_out\.weight' has shape \[256, 64\]; expected \[64, 256\]",
     lib.DS4_ERR_BAD_MODEL),
    ("wrong-shape-experts", "moe-q8_0", _transpose("blk.1.ffn_down_exps.weight"),
     r"'blk\.1\.ffn_down_exps\.weight' has shape", lib.DS4_ERR_BAD_MODEL),
    ("q2_k-weight", "dense-q8_0", _retype("blk.0.attn_qkv.weight", "Q2_K"),
     r"'blk\.0\.attn_qkv\.weight' is Q2_K", lib.DS4_ERR_UNSUPPORTED),
    ("i32-weight", "dense-q8_0", _retype("blk.0.ffn_up.weight", "I32"),
     r"'blk\.0\.ffn_up\.weight' is I32", lib.DS4_ERR_UNSUPPORTED),
    ("iq2_xxs-embd", "dense-q8_0", _retype("token_embd.weight", "IQ2_XXS"),
     r"'token_embd\.weight' is IQ2_XXS", lib.DS4_ERR_UNSUPPORTED),
    ("f16-norm", "dense-q8_0", _retype("blk.1.attn_q_norm.weight", "F16"),
     r"'blk\.1\.attn_q_norm\.weight' is F16.*needs F32", lib.DS4_ERR_UNSUPPORTED),
    ("bf16-conv", "dense-q8_0", _retype("blk.2.ssm_conv1d.weight", "BF16"),
     r"'blk\.2\.ssm_conv1d\.weight' is BF16", lib.DS4_ERR_UNSUPPORTED),
    ("q8_0-router", "moe-q8_0", _retype("blk.0.ffn_gate_inp.weight", "Q8_0"),
     r"'blk\.0\.ffn_gate_inp\.weight' is Q8_0", lib.DS4_ERR_UNSUPPORTED),
    ("mtp-only", "dense-q8_0", drop_trunk, r"MTP-only", lib.DS4_ERR_UNSUPPORTED),
    ("two-nextn", "dense-q8_0", _set("qwen35.nextn_predict_layers", u32(2)),
     r"nextn_predict_layers = 2", lib.DS4_ERR_UNSUPPORTED),
    ("nextn-no-trunk", "dense-q8_0", _set("qwen35.nextn_predict_layers", u32(6)),
     r"nextn_predict_layers \(6\) leaves no trunk", lib.DS4_ERR_BAD_MODEL),
    ("ssm-inner", "dense-q8_0", _set("qwen35.ssm.inner_size", u32(96)),
     r"ssm\.inner_size \(96\) != .*time_step_rank \(4\) \* .*state_size \(16\)",
     lib.DS4_ERR_BAD_MODEL),
    ("ssm-groups", "moe-q8_0", _set("qwen35moe.ssm.group_count", u32(3)),
     r"time_step_rank \(4 value heads\) is not a multiple of .*group_count \(3",
     lib.DS4_ERR_BAD_MODEL),
    ("gqa", "dense-q8_0", _set("qwen35.attention.head_count_kv", u32(3)),
     r"head_count \(4\) is not a multiple of .*head_count_kv \(3\)", lib.DS4_ERR_BAD_MODEL),
    ("head-dims", "dense-q8_0", _set("qwen35.attention.key_length", u32(32)),
     r"key_length \(32\) != .*value_length \(16\)", lib.DS4_ERR_BAD_MODEL),
    ("n-rot-odd", "dense-q8_0", _set("qwen35.rope.dimension_count", u32(7)),
     r"rope\.dimension_count = 7", lib.DS4_ERR_BAD_MODEL),
    ("n-rot-big", "dense-q8_0", _set("qwen35.rope.dimension_count", u32(18)),
     r"rope\.dimension_count = 18", lib.DS4_ERR_BAD_MODEL),
    ("sections-non-text", "dense-q8_0",
     _set("qwen35.rope.dimension_sections", Value([1, 0, 0, 3], ValueType.ARRAY, ValueType.INT32)),
     r"dimension_sections' = \[1, 0, 0, 3\] puts rotated pair 1", lib.DS4_ERR_UNSUPPORTED),
    ("sections-length", "dense-q8_0",
     _set("qwen35.rope.dimension_sections", Value([2, 1, 1], ValueType.ARRAY, ValueType.INT32)),
     r"dimension_sections' has 3 entries; expected 4", lib.DS4_ERR_BAD_MODEL),
    ("yarn", "dense-q8_0", _set("qwen35.rope.scaling.type", Value("yarn", ValueType.STRING)),
     r"'qwen35\.rope\.scaling\.type'", lib.DS4_ERR_UNSUPPORTED),
    ("rope-factor", "dense-q8_0", _set("qwen35.rope.scaling.factor", Value(4.0, ValueType.FLOAT32)),
     r"'qwen35\.rope\.scaling\.factor' = 4", lib.DS4_ERR_UNSUPPORTED),
    ("recurrent-length", "dense-q8_0",
     _set("qwen35.attention.recurrent_layers", Value([True, False, True, False, True],
                                                      ValueType.ARRAY, ValueType.BOOL)),
     r"recurrent_layers' has 5 entries; expected one per block \(block_count = 6\)",
     lib.DS4_ERR_BAD_MODEL),
    ("recurrent-nextn", "dense-q8_0",
     _set("qwen35.attention.recurrent_layers", Value([True, False, True, False, True, True],
                                                      ValueType.ARRAY, ValueType.BOOL)),
     r"marks block 5 recurrent", lib.DS4_ERR_BAD_MODEL),
    ("interval-zero", "dense-q8_0",
     lambda meta, tensors: (meta.pop("qwen35.attention.recurrent_layers"),
                            meta.__setitem__("qwen35.full_attention_interval", u32(0))),
     r"'qwen35\.full_attention_interval' = 0 is out of range", lib.DS4_ERR_BAD_MODEL),
    ("extra-bias", "dense-q8_0", _add_tensor("blk.1.attn_q.bias", "F32", (128,)),
     r"tensor 'blk\.1\.attn_q\.bias' is not part of a qwen35 model", lib.DS4_ERR_BAD_MODEL),
    ("extra-rope-freqs", "moe-q8_0", _add_tensor("rope_freqs.weight", "F32", (4,)),
     r"'rope_freqs\.weight' is not part of a qwen35moe model", lib.DS4_ERR_BAD_MODEL),
    ("fused-attn-qkv", "dense-q8_0", _add_tensor("blk.1.attn_qkv.weight", "F32", (256, 128)),
     r"'blk\.1\.attn_qkv\.weight': a fused q/k/v", lib.DS4_ERR_UNSUPPORTED),
    ("both-expert-forms", "moe-q8_0", _both_expert_forms,
     r"block 0 has both ffn_gate_up_exps and separate", lib.DS4_ERR_BAD_MODEL),
    ("dense-with-experts", "dense-q8_0", _set("qwen35.expert_count", u32(8)),
     r"'qwen35\.expert_count' = 8 in a qwen35 \(dense\) file", lib.DS4_ERR_BAD_MODEL),
    ("per-layer-heads", "dense-q8_0",
     _set("qwen35.attention.head_count", Value([4, 4, 4, 8, 4, 4], ValueType.ARRAY,
                                               ValueType.UINT32)),
     r"'qwen35\.attention\.head_count' gives different values per block", lib.DS4_ERR_UNSUPPORTED),
    ("experts-used", "moe-q8_0", _set("qwen35moe.expert_used_count", u32(9)),
     r"'qwen35moe\.expert_used_count' = 9 is out of range \[1, 8\]", lib.DS4_ERR_BAD_MODEL),
    ("expert-groups", "moe-q8_0", _set("qwen35moe.expert_group_count", u32(2)),
     r"'qwen35moe\.expert_group_count' = 2", lib.DS4_ERR_UNSUPPORTED),
    ("vocab-mismatch", "dense-q8_0", _truncate_vocab,
     r"tokenizer\.ggml\.tokens has 500 tokens but token_embd\.weight has 512 rows",
     lib.DS4_ERR_BAD_MODEL),
    ("eps-zero", "dense-q8_0",
     _set("qwen35.attention.layer_norm_rms_epsilon", Value(0.0, ValueType.FLOAT32)),
     r"layer_norm_rms_epsilon' = 0 must be positive", lib.DS4_ERR_BAD_MODEL),
]


@pytest.mark.parametrize("src,edit,pattern,code", [r[1:] for r in REFUSALS],
                         ids=[r[0] for r in REFUSALS])
def test_refused(tmp_path, src, edit, pattern, code):
    path = build(tmp_path, src, edit)
    with pytest.raises(ModelError, match=pattern) as ei:
        Model.load(path)
    assert ei.value.code == code


def test_misaligned_tensor_refused(tmp_path):
    # general.alignment = 1 packs tensors at odd offsets; the forward pass
    # reads F32 data through float pointers, so the loader refuses
    meta, tensors = load_parts("dense-q8_0")
    path = str(tmp_path / "align1.gguf")
    write_gguf(path, meta, tensors, alignment=1)
    with pytest.raises(ModelError, match=r"tensor '.*' data is not 4-byte aligned") as ei:
        Model.load(path)
    assert ei.value.code == lib.DS4_ERR_UNSUPPORTED


# ---------------------------------------------------------------- parameters

def test_params_defaults_and_explicit():
    path = golden_path("dense-q8_0")
    with Model.load(path) as m:
        assert m.n_ctx == 4096          # min(context_length 4096, 8192)
        assert m.precision == "fast"
        assert m.n_threads == os.sysconf("SC_NPROCESSORS_ONLN")
        assert m.path == path
    with Model.load(path, n_threads=3, n_ctx=100, precision="exact") as m:
        assert (m.n_threads, m.n_ctx, m.precision) == (3, 100, "exact")
    with Model.load(path, n_ctx=10000) as m:   # beyond context_length is allowed
        assert m.n_ctx == 10000


def test_default_n_ctx_capped(tmp_path):
    path = build(tmp_path, "dense-q8_0", _set("qwen35.context_length", u32(262144)))
    with Model.load(path) as m:
        assert m.n_ctx == 8192
        assert m.config.context_length == 262144


@pytest.mark.parametrize("kwargs,pattern", [
    ({"precision": "turbo"}, r"precision must be one of"),
    ({"precision": 7}, r"precision = 7"),
    ({"precision": None}, r"precision must be"),
    ({"n_ctx": 0}, r"n_ctx must be positive"),
    ({"n_ctx": -5}, r"n_ctx must be positive"),
    ({"n_ctx": 2**40}, r"n_ctx = 1099511627776: at most 2147483647"),
    ({"n_ctx": 1.5}, r"n_ctx must be a positive int"),
    ({"n_threads": 0}, r"n_threads must be positive"),
    ({"n_threads": True}, r"n_threads must be a positive int"),
    ({"n_threads": 10**6}, r"n_threads = 1000000: at most"),
])
def test_bad_params(kwargs, pattern):
    with pytest.raises(ModelError, match=pattern):
        Model.load(golden_path("dense-q8_0"), **kwargs)


def test_c_api_null_params_and_bad_precision():
    pp = ffi.new("ds4_model **")
    err = ffi.new("ds4_error *")
    assert lib.ds4_model_load(golden_path("moe-q8_0").encode(), ffi.NULL, pp, err) == lib.DS4_OK
    try:
        assert lib.ds4_model_n_ctx(pp[0]) == 4096
        assert lib.ds4_model_precision(pp[0]) == lib.DS4_PRECISION_FAST
        assert lib.ds4_model_layer_kind(pp[0], -1) == -1
        assert lib.ds4_model_layer_kind(pp[0], 5) == -1
        assert lib.ds4_model_layer_kind(pp[0], 4) == lib.DS4_LAYER_NEXTN
        info = ffi.new("ds4_model_tensor_info *")
        n = lib.ds4_model_n_tensors(pp[0])
        assert lib.ds4_model_get_tensor(pp[0], n, info, err) == lib.DS4_ERR_ARG
    finally:
        lib.ds4_model_free(pp[0])
    params = ffi.new("ds4_model_params *", {"precision": -1})
    assert lib.ds4_model_load(golden_path("moe-q8_0").encode(), params, pp, err) == lib.DS4_ERR_ARG
    assert pp[0] == ffi.NULL
    assert b"precision = -1" in ffi.string(err.message)
    lib.ds4_model_free(ffi.NULL)   # a no-op, like free(NULL)


# ------------------------------------------------------ files and lifetime

def test_missing_file_is_gguf_error(tmp_path):
    with pytest.raises(GGUFError, match="cannot open") as ei:
        Model.load(tmp_path / "nope.gguf")
    assert ei.value.code == lib.DS4_ERR_IO


def test_truncated_file_is_gguf_error(tmp_path):
    p = tmp_path / "cut.gguf"
    with open(golden_path("dense-q8_0"), "rb") as f:
        p.write_bytes(f.read()[:5000])
    with pytest.raises(GGUFError):
        Model.load(p)


def test_close_and_context_manager():
    with ds4py.load(golden_path("moe-bf16")) as m:
        assert not m.closed
        assert m.tensors()
        assert isinstance(m._ptr, ffi.CData)
    assert m.closed and m._ptr is None
    assert m.config.arch == "qwen35moe"     # plain attributes stay readable
    with pytest.raises(ModelError, match="is closed"):
        m.tensors()
    m.close()                               # idempotent
    assert "closed" in repr(m)
