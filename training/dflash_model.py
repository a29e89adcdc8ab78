"""The classic DFlash draft model in PyTorch: the training module and the
reference implementation of csrc/forward/dflash.h (the contract this file
follows; read it first).

A DFlash drafter proposes a block of tokens in one pass. It owns no
embedding and no LM head: it reads the TARGET's token embedding for its
input rows and the target's LM head for its logits. Its context is the
target's residual stream after a few tapped trunk layers, concatenated per
position and projected to the drafter's width:

    x_p = RMSNorm(fc . concat_l h_l(p)) * hidden_norm          (context rows)

A block at position S (the target holds [0, S), t_S is the last committed
token) is the rows [t_S, MASK x (B-1)] at positions S..S+B-1. Every drafter
layer lets the block rows attend, without a causal mask, to the context rows
[0, S) and to the whole block; the context rows only provide keys and
values (no query, no FFN), the same x_p in every layer. Rows 1..B-1 of the
final norm go through the target's LM head: the B-1 drafts.

    cfg = DFlashConfig(n_embd=256, target_layers=[1, 5, 9], mask_token_id=8191)
    m = DFlashDraftModel(cfg)
    y = m(ctx_taps, ctx_pos, block_emb, block_pos, mask)   # [batch, rows, E]

Shapes: ctx_taps [b, C, n_taps*E] (taps concatenated in target_layers
order), block_emb [b, N, E], ctx_pos [C] / block_pos [b, N] (int64),
mask [b, N, C + N] bool (True = may attend). ``propose_logits`` is the
single-block reference the tests compare the C forward with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

__all__ = ["DFlashConfig", "DFlashDraftModel", "rms_norm", "rope_neox", "propose_logits",
           "default_target_layers"]


def default_target_layers(n_target_layers: int, n_taps: int) -> list[int]:
    """Evenly spaced taps from layer 1 to n-3 (z-lab dflash model.py
    build_target_layer_ids: the first layer is too shallow to carry much
    and the last ones are specialised to the LM head); one tap: the middle."""
    if n_taps == 1:
        return [n_target_layers // 2]
    start, end = 1, max(1, n_target_layers - 3)
    return [int(round(start + i * (end - start) / (n_taps - 1))) for i in range(n_taps)]


@dataclass
class DFlashConfig:
    n_embd: int = 256
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64
    n_ff: int = 768
    rms_eps: float = 1e-6
    rope_base: float = 10000000.0
    block_size: int = 8
    target_layers: list[int] = field(default_factory=lambda: [1, 5, 9])  # 0-based
    mask_token_id: int = 0

    def check(self) -> None:
        if self.n_head * self.head_dim != self.n_embd:
            raise ValueError("classic DFlash needs n_head * head_dim == n_embd")
        if self.head_dim % 2 or self.n_head % self.n_head_kv:
            raise ValueError("head_dim must be even and n_head a multiple of n_head_kv")
        if not 2 <= self.block_size <= 16:
            raise ValueError("block_size must be in 2..16 (ds4py verifies at most 16 rows)")


def rms_norm(x: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    """Qwen3RMSNorm: the weight is used as stored (no +1 offset)."""
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if w is None else y * w


def rope_neox(x: torch.Tensor, pos: torch.Tensor, base: float) -> torch.Tensor:
    """Rotate-half RoPE over the whole head (x [..., T, H, D], pos [..., T]):
    pairs (i, i + D/2) turn by pos * base^(-2i/D)."""
    d = x.shape[-1]
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d)
    ang = pos.to(torch.float64)[..., None] * inv  # [..., T, D/2]
    cos = torch.cos(ang).to(x.dtype)[..., None, :]
    sin = torch.sin(ang).to(x.dtype)[..., None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class DFlashLayer(nn.Module):
    def __init__(self, c: DFlashConfig):
        super().__init__()
        E, hd = c.n_embd, c.head_dim
        self.c = c
        self.attn_norm = nn.Parameter(torch.ones(E))
        self.q = nn.Linear(E, c.n_head * hd, bias=False)
        self.k = nn.Linear(E, c.n_head_kv * hd, bias=False)
        self.v = nn.Linear(E, c.n_head_kv * hd, bias=False)
        self.o = nn.Linear(c.n_head * hd, E, bias=False)
        self.q_norm = nn.Parameter(torch.ones(hd))
        self.k_norm = nn.Parameter(torch.ones(hd))
        self.ffn_norm = nn.Parameter(torch.ones(E))
        self.gate = nn.Linear(E, c.n_ff, bias=False)
        self.up = nn.Linear(E, c.n_ff, bias=False)
        self.down = nn.Linear(c.n_ff, E, bias=False)

    def _heads(self, y, n):
        return y.view(*y.shape[:-1], n, self.c.head_dim)

    def forward(self, h, x, ctx_pos, block_pos, mask):
        c = self.c
        a = rms_norm(h, self.attn_norm, c.rms_eps)
        q = rope_neox(rms_norm(self._heads(self.q(a), c.n_head), self.q_norm, c.rms_eps),
                      block_pos, c.rope_base)
        kx = rope_neox(rms_norm(self._heads(self.k(x), c.n_head_kv), self.k_norm, c.rms_eps),
                       ctx_pos, c.rope_base)
        ka = rope_neox(rms_norm(self._heads(self.k(a), c.n_head_kv), self.k_norm, c.rms_eps),
                       block_pos, c.rope_base)
        k = torch.cat([kx.expand(h.shape[0], *kx.shape[1:]), ka], dim=1)
        vx = self._heads(self.v(x), c.n_head_kv)
        v = torch.cat([vx.expand(h.shape[0], *vx.shape[1:]), self._heads(self.v(a), c.n_head_kv)],
                      dim=1)
        g = c.n_head // c.n_head_kv  # GQA: query head j reads kv head j // g
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        o = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None],
                                                       scale=1.0 / math.sqrt(c.head_dim))
        h = h + self.o(o.transpose(1, 2).flatten(2))
        f = rms_norm(h, self.ffn_norm, c.rms_eps)
        return h + self.down(nn.functional.silu(self.gate(f)) * self.up(f))


class DFlashDraftModel(nn.Module):
    """See the module doc. Parameters are named for the export
    (training/export_dflash.py maps them to GGUF names)."""

    def __init__(self, c: DFlashConfig):
        super().__init__()
        c.check()
        self.c = c
        n_taps = len(c.target_layers)
        self.fc = nn.Linear(n_taps * c.n_embd, c.n_embd, bias=False)
        self.hidden_norm = nn.Parameter(torch.ones(c.n_embd))
        self.layers = nn.ModuleList(DFlashLayer(c) for _ in range(c.n_layer))
        self.norm = nn.Parameter(torch.ones(c.n_embd))

    def context(self, ctx_taps: torch.Tensor) -> torch.Tensor:
        return rms_norm(self.fc(ctx_taps), self.hidden_norm, self.c.rms_eps)

    def forward(self, ctx_taps, ctx_pos, block_emb, block_pos, mask):
        x = self.context(ctx_taps)
        h = block_emb
        for layer in self.layers:
            h = layer(h, x, ctx_pos, block_pos, mask)
        return rms_norm(h, self.norm, self.c.rms_eps)


@torch.no_grad()
def propose_logits(model: DFlashDraftModel, taps: torch.Tensor, anchor: int,
                   embed: torch.Tensor, lm_head: torch.Tensor) -> torch.Tensor:
    """One round of the contract: taps [S, n_taps, E] of positions [0, S),
    the anchor token t_S, the target's embedding [V, E] and LM head [V, E].
    Returns the logits [B-1, V] of rows 1..B-1 (drafts = their argmax)."""
    c = model.c
    S, B = taps.shape[0], c.block_size
    dt = embed.dtype
    toks = torch.tensor([anchor] + [c.mask_token_id] * (B - 1))
    block_emb = embed[toks][None]
    ctx = taps.reshape(1, S, -1).to(dt)
    ctx_pos = torch.arange(S)
    block_pos = torch.arange(S, S + B)[None]
    mask = torch.ones(1, B, S + B, dtype=torch.bool)
    y = model(ctx, ctx_pos, block_emb, block_pos, mask)[0, 1:]
    return y @ lm_head.T
