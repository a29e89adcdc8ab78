"""The demo model's architecture: transformers' own Qwen3_5ForCausalLM (the
reference implementation of the qwen35 trunk) plus one MTP block built from
transformers' decoder layer, trained jointly.

Shape (why): E = 256 so every matrix that reads the residual stream has
256-long rows (whole K-quant super-blocks); 12 layers, GDN : attention = 3 : 1
(full_attention_interval 4) as the released models; Hk = 4, Hv = 8 (Hv = 2*Hk,
so the converter's tiled V-head order is exercised); attention H = 4 / KV 2,
head_dim 64, partial RoPE 0.25 (16 rotated dims), per-head output gate
(Qwen3.5's q_proj carries the gate); FFN 768; vocabulary 8192, tied
embeddings. About 15.6 M parameters (+1.0 M MTP).

MTP (spec section 7): row k reads token x_k and the trunk's post-final-norm
hidden state h_{k-1} of the previous position:
    u = fc([enorm(embed(x_k)) ; hnorm(h_{k-1})]), u = layer(u) (causal
    attention over the MTP rows, RoPE at position k), logits = lm_head(norm(u))
and predicts x_{k+1}: one token further than the trunk row k-1 that made h.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

VOCAB = 8192
EOT_ID = VOCAB - 9  # <|endoftext|> (first added token, see prepare_data.py)
IM_END_ID = EOT_ID + 2

TRUNK = dict(
    vocab_size=VOCAB,
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=12,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=64,
    linear_value_head_dim=64,
    linear_num_key_heads=4,
    linear_num_value_heads=8,
    rms_norm_eps=1e-6,
    max_position_embeddings=32768,
    tie_word_embeddings=True,
    rope_parameters=dict(
        rope_type="default",
        rope_theta=10000000.0,
        partial_rotary_factor=0.25,
        mrope_section=[3, 3, 2],
        mrope_interleaved=True,
    ),
    full_attention_interval=4,
)


def trunk_config(**overrides):
    from transformers import Qwen3_5TextConfig

    kw = dict(TRUNK)
    kw.update(overrides)
    kw.update(bos_token_id=None, eos_token_id=IM_END_ID, pad_token_id=EOT_ID)
    cfg = Qwen3_5TextConfig(**kw)
    cfg.architectures = ["Qwen3_5ForCausalLM"]
    return cfg


class MTPBlock(nn.Module):
    """One MTP block; parameter names match the HF checkpoint's mtp.* names
    once prefixed (see checkpoint_state)."""

    def __init__(self, cfg):
        super().__init__()
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

        lcfg = copy.deepcopy(cfg)
        lcfg.layer_types = list(cfg.layer_types) + ["full_attention"]
        lcfg.num_hidden_layers = cfg.num_hidden_layers + 1
        lcfg._attn_implementation = "sdpa"
        E = cfg.hidden_size
        self.layer = Qwen3_5DecoderLayer(lcfg, cfg.num_hidden_layers)
        self.enorm = Qwen3_5RMSNorm(E, eps=cfg.rms_norm_eps)
        self.hnorm = Qwen3_5RMSNorm(E, eps=cfg.rms_norm_eps)
        self.norm = Qwen3_5RMSNorm(E, eps=cfg.rms_norm_eps)
        self.fc = nn.Linear(2 * E, E, bias=False)

    def forward(self, trunk, tokens, h_prev, positions):
        """tokens [B, T], h_prev [B, T, E] (row k: trunk hidden at k-1),
        positions [B, T]. Returns the post-norm MTP hidden [B, T, E]."""
        e = trunk.model.embed_tokens(tokens)
        u = self.fc(torch.cat([self.enorm(e), self.hnorm(h_prev)], dim=-1))
        pe = trunk.model.rotary_emb(u, positions[None].expand(3, -1, -1))
        out = self.layer(u, position_embeddings=pe, attention_mask=None, position_ids=positions)
        if isinstance(out, tuple):
            out = out[0]
        return self.norm(out)

    def checkpoint_state(self) -> dict:
        d = {
            "mtp.pre_fc_norm_embedding.weight": self.enorm.weight,
            "mtp.pre_fc_norm_hidden.weight": self.hnorm.weight,
            "mtp.norm.weight": self.norm.weight,
            "mtp.fc.weight": self.fc.weight,
        }
        for n, p in self.layer.named_parameters():
            d["mtp.layers.0." + n] = p
        return d


def build(**overrides):
    from transformers import Qwen3_5ForCausalLM

    cfg = trunk_config(**overrides)
    cfg._attn_implementation = "sdpa"
    trunk = Qwen3_5ForCausalLM(cfg)
    mtp = MTPBlock(cfg)
    return trunk, mtp


def losses(trunk, mtp, x):
    """x [B, T+2] token ids. Returns (trunk CE over T+1 targets, MTP CE over
    T targets, trunk logits, MTP logits) -- the MTP rows are k = 1..T, each
    predicting x_{k+1}."""
    out = trunk.model(input_ids=x[:, :-1])
    h = out.last_hidden_state  # post final norm, [B, T+1, E]
    logits = trunk.lm_head(h)
    ce = nn.functional.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten())
    B, T1 = x.shape[0], x.shape[1] - 2
    pos = torch.arange(1, T1 + 1, device=x.device)[None].expand(B, -1)
    hm = mtp(trunk, x[:, 1:-1], h[:, :-1], pos)
    mlogits = trunk.lm_head(hm)
    mce = nn.functional.cross_entropy(mlogits.float().flatten(0, 1), x[:, 2:].flatten())
    return ce, mce, logits, mlogits
