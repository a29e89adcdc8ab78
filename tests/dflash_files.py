"""Test helpers for DFlash: random drafters for the golden trunks, written
with training/export_dflash.py (numpy only), and an independent float64
numpy reference of the forward pass in csrc/forward/dflash.h."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "training"))

from export_dflash import gguf_items  # noqa: E402

from ds4py.gguf_writer import write_gguf  # noqa: E402

DENSE_F32 = os.path.join(ROOT, "tests", "golden", "models", "dense-f32.gguf")


def config(**kw) -> SimpleNamespace:
    """A drafter for the golden dense trunk (E 256, 5 layers, vocab 512)."""
    c = dict(n_embd=256, n_layer=2, n_head=4, n_head_kv=2, head_dim=64, n_ff=128,
             rms_eps=1e-6, rope_base=10000.0, block_size=6, target_layers=[0, 2, 4],
             mask_token_id=500)
    c.update(kw)
    return SimpleNamespace(**c)


def random_arrays(cfg, seed: int = 0, scale: float = 0.08) -> dict:
    """GGUF name -> float32 array (numpy order: out, in), norms around 1."""
    rng = np.random.default_rng(seed)
    E, hd, ff = cfg.n_embd, cfg.head_dim, cfg.n_ff
    qd, kd = cfg.n_head * hd, cfg.n_head_kv * hd

    def mat(o, i):
        return (rng.standard_normal((o, i)) * scale).astype(np.float32)

    def vec(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    a = {"fc.weight": mat(E, len(cfg.target_layers) * E), "enc.output_norm.weight": vec(E),
         "output_norm.weight": vec(E)}
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        a.update({p + "attn_norm.weight": vec(E), p + "attn_q.weight": mat(qd, E),
                  p + "attn_k.weight": mat(kd, E), p + "attn_v.weight": mat(kd, E),
                  p + "attn_output.weight": mat(E, qd), p + "attn_q_norm.weight": vec(hd),
                  p + "attn_k_norm.weight": vec(hd), p + "ffn_norm.weight": vec(E),
                  p + "ffn_gate.weight": mat(ff, E), p + "ffn_up.weight": mat(ff, E),
                  p + "ffn_down.weight": mat(E, ff)})
    return a


def write(path, cfg, arrays, version: int = 1, wtype: str = "F32", meta_edit=None,
          tensor_edit=None) -> str:
    meta, tensors = gguf_items(cfg, arrays, version, wtype)
    if meta_edit:
        meta_edit(meta)
    if tensor_edit:
        tensor_edit(tensors)
    write_gguf(str(path), meta, tensors)
    return str(path)


# ------------------------------------------------------- numpy reference --

def _rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope(x, pos, base):
    """x [T, H, D], pos [T]: NeoX rotate-half over the whole head."""
    d = x.shape[-1]
    inv = float(base) ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    ang = np.asarray(pos, dtype=np.float64)[:, None] * inv  # [T, D/2]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def ref_propose(cfg, W: dict, taps: np.ndarray, anchor: int, emb: np.ndarray,
                head: np.ndarray) -> np.ndarray:
    """float64 logits [B-1, V] of the block at S = len(taps) (dflash.h)."""
    W = {k: np.asarray(v, np.float64) for k, v in W.items()}
    eps, base, hd = cfg.rms_eps, cfg.rope_base, cfg.head_dim
    S, B = taps.shape[0], cfg.block_size
    flat = np.asarray(taps, np.float64).reshape(S, taps.shape[1] * taps.shape[2])
    x = _rms(flat @ W["fc.weight"].T,
             W["enc.output_norm.weight"], eps)
    h = np.asarray(emb, np.float64)[[anchor] + [cfg.mask_token_id] * (B - 1)]
    cpos, bpos = np.arange(S), np.arange(S, S + B)
    grp = cfg.n_head // cfg.n_head_kv
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        a = _rms(h, W[p + "attn_norm.weight"], eps)

        def heads(y, n):
            return y.reshape(y.shape[0], n, hd)

        q = _rope(_rms(heads(a @ W[p + "attn_q.weight"].T, cfg.n_head),
                       W[p + "attn_q_norm.weight"], eps), bpos, base)
        k = np.concatenate([
            _rope(_rms(heads(x @ W[p + "attn_k.weight"].T, cfg.n_head_kv),
                       W[p + "attn_k_norm.weight"], eps), cpos, base),
            _rope(_rms(heads(a @ W[p + "attn_k.weight"].T, cfg.n_head_kv),
                       W[p + "attn_k_norm.weight"], eps), bpos, base)])
        v = np.concatenate([heads(x @ W[p + "attn_v.weight"].T, cfg.n_head_kv),
                            heads(a @ W[p + "attn_v.weight"].T, cfg.n_head_kv)])
        o = np.empty((B, cfg.n_head, hd))
        for j in range(cfg.n_head):
            sc = q[:, j] @ k[:, j // grp].T / np.sqrt(hd)  # [B, S+B], no mask
            sc = np.exp(sc - sc.max(-1, keepdims=True))
            o[:, j] = (sc / sc.sum(-1, keepdims=True)) @ v[:, j // grp]
        h = h + o.reshape(B, -1) @ W[p + "attn_output.weight"].T
        f = _rms(h, W[p + "ffn_norm.weight"], eps)
        g = f @ W[p + "ffn_gate.weight"].T
        act = (g / (1 + np.exp(-g))) * (f @ W[p + "ffn_up.weight"].T)
        h = h + act @ W[p + "ffn_down.weight"].T
    y = _rms(h[1:], W["output_norm.weight"], eps)
    return y @ np.asarray(head, np.float64).T
