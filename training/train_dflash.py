"""Distil a classic DFlash drafter (training/dflash_model.py) from the demo
target, then export it as GGUF (training/export_dflash.py).

    python training/train_dflash.py --hf /tmp/demo/hf --data training/data \
        --out /tmp/dflash_out --minutes 8

Data: windows of the prepared corpus (train.bin, uint16 ids). For each
window the frozen HF trunk (transformers' Qwen3_5ForCausalLM, the same
weights as ds4py/models/demo-q8_0.gguf) gives, under no_grad:
  * the taps: the residual stream after each tapped layer (forward hooks on
    the decoder layers: what ds4py's hidden_layers returns);
  * the labels: the target's own greedy token at every position (argmax of
    its logits one row earlier) -- distillation, so the drafter learns to
    agree with the verifier rather than with the text (--labels text
    trains on the corpus tokens instead).
The block objective: n_blocks anchors S per window; block rows [x_S, MASK x
(B-1)] at positions S..S+B-1 attend to the context rows p < S and to their
own block (one attention mask for all blocks of a window); row r predicts
the label at S+r through the target's (frozen) LM head; row r's loss is
weighted exp(-(r-1)/gamma) (an early row's error ends the accepted prefix).

Resumes from --resume FILE or OUT/state.pt; stops at --minutes (wall) or --steps; always
writes OUT/state.pt, OUT/train_log.json, OUT/dflash.pt and the GGUF
OUT/demo-dflash-q8_0.gguf. Held-out metrics: per-row accuracy against the
labels and the expected accepted drafts per round at the full block
(mean length of the agreeing prefix), the figure speculative decoding sees.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dflash_model import DFlashConfig, DFlashDraftModel, default_target_layers  # noqa: E402


def load_target(hf_dir: str, device):
    from transformers import Qwen3_5ForCausalLM

    trunk = Qwen3_5ForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    trunk.to(device).eval()
    for p in trunk.parameters():
        p.requires_grad_(False)
    return trunk


class Taps:
    """Forward hooks that keep the residual stream after the tapped layers."""

    def __init__(self, trunk, layers):
        self.out = {}
        self.layers = list(layers)
        for li in self.layers:
            trunk.model.layers[li].register_forward_hook(self._hook(li))

    def _hook(self, li):
        def fn(mod, inp, out):
            self.out[li] = out[0] if isinstance(out, tuple) else out
        return fn

    def cat(self) -> torch.Tensor:
        return torch.cat([self.out[li] for li in self.layers], dim=-1)


@torch.no_grad()
def target_pass(trunk, taps: Taps, x: torch.Tensor):
    """x [b, T] -> (taps [b, T, n_taps*E] float32, greedy labels [b, T]:
    label[t] = the target's argmax for position t, from row t-1 (label[0] = x[0])."""
    out = trunk.model(input_ids=x)
    logits = trunk.lm_head(out.last_hidden_state)
    g = torch.empty_like(x)
    g[:, 0] = x[:, 0]
    g[:, 1:] = logits[:, :-1].argmax(-1)
    return taps.cat().float(), g


def block_batch(x, labels, n_blocks: int, B: int, mask_id: int, gen: torch.Generator):
    """Anchors, block tokens/positions/labels and the attention mask."""
    b, T = x.shape
    dev = x.device
    S = torch.randint(1, T - B + 1, (b, n_blocks), generator=gen).to(dev)  # anchors
    r = torch.arange(B, device=dev)
    pos = (S[..., None] + r).reshape(b, -1)                       # [b, N]
    toks = torch.full_like(pos, mask_id)
    toks.view(b, n_blocks, B)[..., 0] = torch.gather(x, 1, S)
    lab = torch.gather(labels, 1, pos)                            # label at S + r
    N = n_blocks * B
    ctx_ok = torch.arange(T, device=dev)[None, None] < S.repeat_interleave(B, 1)[..., None]
    blk = torch.arange(N, device=dev) // B
    own = (blk[:, None] == blk[None, :])[None].expand(b, -1, -1)
    mask = torch.cat([ctx_ok, own], dim=-1)                       # [b, N, T + N]
    return toks, pos, lab, mask


def block_loss(model, trunk, ctx, toks, pos, lab, mask, B: int, gamma: float):
    T = ctx.shape[1]
    emb = trunk.model.embed_tokens(toks)
    y = model(ctx, torch.arange(T, device=ctx.device), emb, pos, mask)
    b, N, E = y.shape
    y = y.view(b, N // B, B, E)[:, :, 1:]                         # draft rows
    logits = trunk.lm_head(y).float()
    tgt = lab.view(b, N // B, B)[:, :, 1:]
    ce = nn.functional.cross_entropy(logits.flatten(0, 2), tgt.flatten(), reduction="none")
    w = torch.exp(-torch.arange(B - 1, device=y.device, dtype=torch.float32) / gamma)
    ce = ce.view(b, N // B, B - 1) * w
    return ce.sum() / (w.sum() * b * (N // B)), logits, tgt


@torch.no_grad()
def evaluate(model, trunk, taps, data, args, device) -> dict:
    model.eval()
    gen = torch.Generator().manual_seed(1234)
    B = model.c.block_size
    hits = torch.zeros(B - 1)
    acc_len, n = 0.0, 0
    n_win = max(1, min(args.eval_windows, (data.size - 1) // args.seq))
    for i in range(n_win):
        win = data[i * args.seq:(i + 1) * args.seq].astype(np.int64)
        x = torch.from_numpy(win)[None].to(device)
        ctx, g = target_pass(trunk, taps, x)
        labels = g if args.labels == "target" else x
        toks, pos, lab, mask = block_batch(x, labels, args.blocks, B, args.mask_id, gen)
        _, logits, tgt = block_loss(model, trunk, ctx, toks, pos, lab, mask, B, args.gamma)
        ok = (logits.argmax(-1) == tgt).float()[0]                # [blocks, B-1]
        hits += ok.sum(0).cpu()
        acc_len += torch.cumprod(ok, dim=1).sum().item()
        n += ok.shape[0]
    model.train()
    return {"row_accuracy": (hits / n).tolist(), "mean_accepted_drafts": acc_len / n,
            "mean_tokens_per_round": acc_len / n + 1.0, "blocks": n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hf", required=True, help="HF checkpoint of the target (train.py export)")
    ap.add_argument("--data", default=str(Path(__file__).resolve().parent / "data"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=8.0, help="wall-clock budget of this run")
    ap.add_argument("--steps", type=int, default=4000, help="schedule length (LR decay)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--blocks", type=int, default=32, help="anchors per window")
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--n-ff", type=int, default=768)
    ap.add_argument("--taps", type=int, default=3, help="number of tapped target layers")
    ap.add_argument("--mask-id", type=int, default=8191,
                    help="MASK token (</tool_response>: never in the corpus)")
    ap.add_argument("--labels", choices=["target", "text"], default="target")
    ap.add_argument("--gamma", type=float, default=4.0)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--eval-windows", type=int, default=32)
    ap.add_argument("--export-type", default="Q8_0", choices=["F32", "F16", "Q8_0"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--resume", help="a state.pt to continue from (default: OUT/state.pt)")
    ap.add_argument("--fit-steps", action="store_true",
                    help="on a fresh start, time 20 steps and shorten --steps so the LR "
                         "schedule ends inside --minutes")
    args = ap.parse_args()

    t_start = time.time()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    train = np.fromfile(Path(args.data) / "train.bin", dtype=np.uint16)
    held = np.fromfile(Path(args.data) / "heldout.bin", dtype=np.uint16)
    trunk = load_target(args.hf, device)
    tc = trunk.config
    state_path = out / "state.pt"
    src = Path(args.resume) if args.resume else state_path
    st = torch.load(src, map_location=device, weights_only=False) if src.exists() else None
    if st is not None:
        cfg = DFlashConfig(**st["config"])
    else:
        E = tc.hidden_size
        heads = max(1, E // 64)
        cfg = DFlashConfig(n_embd=E, n_layer=args.layers, n_head=heads,
                           n_head_kv=max(1, heads // 2), head_dim=E // heads, n_ff=args.n_ff,
                           rms_eps=tc.rms_norm_eps,
                           rope_base=float(tc.rope_parameters["rope_theta"]),
                           block_size=args.block_size,
                           target_layers=default_target_layers(tc.num_hidden_layers, args.taps),
                           mask_token_id=args.mask_id)
    args.mask_id = cfg.mask_token_id
    model = DFlashDraftModel(cfg).to(device)
    taps = Taps(trunk, cfg.target_layers)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95),
                            weight_decay=0.01)
    gen = torch.Generator().manual_seed(args.seed)
    step, trained_s = 0, 0.0
    log = {"args": vars(args), "config": asdict(cfg), "train": [], "evals": []}
    if st is not None:
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        gen.set_state(st["gen"])
        step, trained_s, log = st["step"], st["trained_s"], st["log"]
        print(f"resumed at step {step} ({trained_s:.0f} s trained)", flush=True)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"drafter {n_params} params, taps {cfg.target_layers}, block {cfg.block_size}, "
          f"device {device}", flush=True)

    def save():
        tmp = state_path.with_suffix(".tmp")
        torch.save({"config": asdict(cfg), "model": model.state_dict(), "opt": opt.state_dict(),
                    "gen": gen.get_state(), "step": step, "log": log,
                    "trained_s": trained_s + (time.time() - t_run)}, tmp)
        os.replace(tmp, state_path)

    t_run = time.time()
    deadline = t_start + args.minutes * 60
    amp = dict(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    while step < args.steps and time.time() < deadline - 30:
        lr = args.lr * min(1.0, (step + 1) / args.warmup) * \
            0.5 * (1 + math.cos(math.pi * min(1.0, step / max(1, args.steps))))
        for g_ in opt.param_groups:
            g_["lr"] = lr
        starts = torch.randint(0, train.size - args.seq - 1, (args.batch,), generator=gen)
        x = torch.from_numpy(np.stack([train[s:s + args.seq] for s in starts.tolist()])
                             .astype(np.int64)).to(device)
        with torch.autocast(**amp):
            ctx, g = target_pass(trunk, taps, x)
            labels = g if args.labels == "target" else x
            toks, pos, lab, mask = block_batch(x, labels, args.blocks, cfg.block_size,
                                               cfg.mask_token_id, gen)
            loss, _, _ = block_loss(model, trunk, ctx.float(), toks, pos, lab, mask,
                                    cfg.block_size, args.gamma)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if args.fit_steps and st is None and step == 20:
            per_step = (time.time() - t_run) / 20
            fit = int((deadline - 60 - t_run) / per_step)
            print(f"{per_step * 1000:.0f} ms/step: schedule {min(fit, args.steps)} steps",
                  flush=True)
            args.steps = min(fit, args.steps)
        if step % 50 == 0 or step == 1:
            log["train"].append({"step": step, "loss": loss.item(), "lr": lr})
            print(f"step {step} loss {loss.item():.4f} lr {lr:.2e} "
                  f"({time.time() - t_run:.0f} s)", flush=True)
        if step % args.eval_every == 0:
            ev = evaluate(model, trunk, taps, held, args, device)
            log["evals"].append({"step": step, **ev})
            print(f"eval {step}: {json.dumps(ev)}", flush=True)
            save()
    ev = evaluate(model, trunk, taps, held, args, device)
    log["evals"].append({"step": step, "final": True, **ev})
    print(f"final eval {step}: {json.dumps(ev)}", flush=True)
    save()
    (out / "train_log.json").write_text(json.dumps(log, indent=1))
    torch.save({"config": asdict(cfg), "model": model.state_dict()}, out / "dflash.pt")
    try:  # the exporter needs ds4py's built core; a bare GPU machine may lack it
        from export_dflash import export
    except ImportError as e:
        print(f"export skipped ({e}); run training/export_dflash.py on {out / 'dflash.pt'}",
              flush=True)
        return
    gguf = out / f"demo-dflash-{args.export_type.lower()}.gguf"
    export(model.cpu(), gguf, wtype=args.export_type)
    print(f"wrote {gguf} ({gguf.stat().st_size} bytes) after {time.time() - t_start:.0f} s",
          flush=True)


if __name__ == "__main__":
    main()
