"""Session counters (ds4_session_counters / Session.counters()): heap
allocations and weight bytes read.

DESIGN.md invariant 5: no allocation per token in the decode path. KV pages
are allocated lazily, DS4_KV_PAGE (256) positions at a time, so a decode
step that enters a new page allocates exactly: one K and one V page per
attention layer, plus one regrowth (realloc) of the decode split-K partial
buffer (n_head x pages x (2 + head_dim) floats). Every other decode step
allocates nothing.

Weight bytes: a decode step reads every trunk matrix once, the small F32
tensors once, one embedding row, and, in a MoE layer, exactly the k routed
experts' gate/up/down matrices (top-k picks k distinct experts, so a
one-token step reads k of them). Expected values come from the GGUF file
itself (gguf-py), not from the engine.
"""

from __future__ import annotations

import os

import gguf as gguf_py
import numpy as np
import pytest

import ds4py

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "golden", "models")
TOKS = np.load(os.path.join(HERE, "golden", "logits", "sequences.npz"))["s700"]
PAGE = 256  # DS4_KV_PAGE (csrc/forward/forward.h)
# Each page allocation carries a reference-count header in front of the data
# (DS4_KV_PAGE_HEADER, csrc/forward/forward.h; pages are shared with snapshots).
PAGE_HEADER = 64


def file_bytes(name: str, n_main: int, k: int):
    """(dense part of one decode step, bytes of one step's routed experts)
    from the GGUF's own tensor table."""
    reader = gguf_py.GGUFReader(os.path.join(MODELS, name + ".gguf"))
    by = {t.name: t for t in reader.tensors}
    dense = 0
    experts = 0
    for t in reader.tensors:
        parts = t.name.split(".")
        if parts[0] != "blk" or int(parts[1]) >= n_main:
            continue  # globals below; the nextn block is not run by the trunk
        if t.name.endswith("_exps.weight"):
            n_expert = int(t.shape[-1])
            experts += k * (int(t.n_bytes) // n_expert)
        else:
            dense += int(t.n_bytes)
    emb = by["token_embd.weight"]
    head = by.get("output.weight", emb)  # tied head: token_embd is read whole
    n_vocab = int(emb.shape[-1])
    dense += int(by["output_norm.weight"].n_bytes) + int(head.n_bytes)
    dense += int(emb.n_bytes) // n_vocab  # the embedding row of the token
    return dense, experts


def decode_steps(s, toks):
    for t in toks:
        s.eval([int(t)])


CASES = [("dense-q8_0", "fast"), ("moe-q4_k_m", "fast"), ("moe-f32", "exact"),
         ("dense-bf16", "exact")]


@pytest.mark.parametrize("name,precision", CASES)
def test_decode_allocates_only_new_pages(name, precision):
    with ds4py.load(os.path.join(MODELS, name + ".gguf"), precision=precision,
                    n_threads=2) as m, m.new_session() as s:
        cfg = m.config
        n_attn = sum(1 for kind in cfg.layer_kinds[:cfg.n_layers] if kind == "attn")
        assert n_attn >= 1
        elem = 2 if precision == "fast" else 4  # F16 / F32 KV pages
        page_bytes = cfg.n_kv_heads * PAGE * cfg.head_dim * elem + PAGE_HEADER

        s.eval(TOKS[:200])  # prefill: allocations happen here (scratch, page 1)
        s.eval([int(TOKS[200])])  # first decode step sizes the 1-row result buffers
        # Decode steps inside page 1 (positions 201..255): no allocation.
        c0 = s.counters()
        decode_steps(s, TOKS[201:256])
        assert s.n_past == 256
        c1 = s.counters()
        assert c1["allocs"] == c0["allocs"] and c1["alloc_bytes"] == c0["alloc_bytes"]
        # The step at position 256 enters page 2: 2 pages per attention layer
        # and the split-K partials regrown to n_head x 2 pages x (2 + head_dim).
        s.eval([int(TOKS[256])])
        c2 = s.counters()
        assert c2["allocs"] - c1["allocs"] == 2 * n_attn + 1
        assert c2["alloc_bytes"] - c1["alloc_bytes"] == (
            2 * n_attn * page_bytes + cfg.n_heads * 2 * (2 + cfg.head_dim) * 4)
        # Then nothing again for the rest of page 2 (also with the
        # layer-hidden capture, after its buffer exists).
        s.eval([int(TOKS[257])], hidden_layers=[0, cfg.n_layers - 1])
        c3 = s.counters()
        for t in TOKS[258:300]:
            s.eval([int(t)], hidden_layers=[0, cfg.n_layers - 1])
        decode_steps(s, TOKS[300:320])
        c4 = s.counters()
        assert c4["allocs"] == c3["allocs"] and c4["alloc_bytes"] == c3["alloc_bytes"]
        # weight bytes keep being counted meanwhile
        assert c4["weight_bytes"] > c3["weight_bytes"] > c0["weight_bytes"]


@pytest.mark.parametrize("name,precision", [("moe-q8_0", "fast"), ("moe-f32", "exact"),
                                            ("moe-q4_k_m", "fast"), ("dense-q4_k_m", "fast"),
                                            ("dense-f32", "exact")])
def test_decode_step_weight_bytes(name, precision):
    with ds4py.load(os.path.join(MODELS, name + ".gguf"), precision=precision,
                    n_threads=2) as m, m.new_session() as s:
        cfg = m.config
        k = cfg.n_experts_used if cfg.is_moe else 0
        dense, experts = file_bytes(name, cfg.n_layers, k)
        if cfg.is_moe:
            assert experts > 0 and cfg.n_experts > k  # unrouted experts exist
        s.eval(TOKS[:20])
        for t in TOKS[20:40]:
            before = s.counters()["weight_bytes"]
            s.eval([int(t)])
            step = s.counters()["weight_bytes"] - before
            # Exactly the dense part plus k experts per MoE layer: reading any
            # unrouted expert, or skipping a matrix, changes the count.
            assert step == dense + experts, (step, dense, experts)


def test_prefill_reads_each_matrix_once_per_chunk():
    """A multi-row chunk reads a weight row once for all its rows: 64 tokens
    (one internal chunk) read no more matrix bytes than one token, except
    more embedding rows and, in a MoE layer, the union of the experts the
    rows route to (between k and all of them)."""
    name = "moe-q8_0"
    with ds4py.load(os.path.join(MODELS, name + ".gguf"), n_threads=2) as m, \
            m.new_session() as s:
        cfg = m.config
        dense, experts_k = file_bytes(name, cfg.n_layers, cfg.n_experts_used)
        _, experts_all = file_bytes(name, cfg.n_layers, cfg.n_experts)
        reader = gguf_py.GGUFReader(os.path.join(MODELS, name + ".gguf"))
        emb = next(t for t in reader.tensors if t.name == "token_embd.weight")
        row = int(emb.n_bytes) // int(emb.shape[-1])
        s.eval(TOKS[:64])
        got = s.counters()["weight_bytes"]
        assert dense + experts_k + 63 * row <= got <= dense + experts_all + 63 * row
        # 64 different tokens over 4 MoE layers route to more than k experts
        # somewhere (otherwise the router would be constant).
        assert got > dense + experts_k + 63 * row
