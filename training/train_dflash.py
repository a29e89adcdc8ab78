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
    """An HF checkpoint folder, or a training/target_pack.py .npz (the Q8_0
    weights ds4py runs, small enough to carry to the device machine)."""
    if hf_dir.endswith(".npz"):
        from target_pack import load_packed

        trunk = load_packed(hf_dir)
    else:
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


@torch.no_grad()
def generate_pool(trunk, prompts: np.ndarray, gen_len: int, batch: int, sampled_frac: float,
                  temperature: float, device, seed: int) -> np.ndarray:
    """The target's own continuations of corpus prompts: [N, P + gen_len] ids.
    Drafting happens on text the target generates, whose statistics differ from
    the corpus (repetition, the target's habits); training contexts drawn from
    it are what the drafter sees at run time. A fraction of rows is sampled at
    `temperature` (Gumbel-max, seeded) so that sampled decoding is covered too;
    the labels stay the target's greedy tokens either way."""
    g = torch.Generator(device=device).manual_seed(seed)
    out = []
    for i in range(0, len(prompts), batch):
        x = torch.from_numpy(prompts[i:i + batch].astype(np.int64)).to(device)
        sampled = torch.rand(x.shape[0], generator=g, device=device) < sampled_frac
        res = trunk(input_ids=x, use_cache=True)
        past, toks = res.past_key_values, []
        for _ in range(gen_len):
            logits = res.logits[:, -1].float()
            u = torch.rand(logits.shape, generator=g, device=device).clamp_(1e-20, 1.0)
            noisy = logits / temperature - torch.log(-torch.log(u))
            nxt = torch.where(sampled, noisy.argmax(-1), logits.argmax(-1))
            toks.append(nxt)
            res = trunk(input_ids=nxt[:, None], past_key_values=past, use_cache=True)
            past = res.past_key_values
        out.append(torch.cat([x, torch.stack(toks, 1)], 1).cpu().numpy().astype(np.uint16))
    return np.concatenate(out)


def block_batch(x, labels, n_blocks: int, B: int, mask_id: int, gen: torch.Generator,
                lo: int = 1, hi: int | None = None):
    """Anchors (in [lo, min(hi, T - B)]), block tokens/positions/labels and the
    attention mask."""
    b, T = x.shape
    dev = x.device
    top = T - B if hi is None else min(hi, T - B)
    S = torch.randint(lo, top + 1, (b, n_blocks), generator=gen).to(dev)  # anchors
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
    """Held-out block metrics; on generated continuations also the same over
    the first 64 generated tokens only ("early"), where the target has not yet
    settled into the repetition long greedy runs fall into -- closer to what a
    short generation sees."""
    res = _evaluate(model, trunk, taps, data, args, device)
    if data.ndim == 2:
        early = _evaluate(model, trunk, taps, data, args, device, span=64)
        res["early"] = {k: early[k] for k in ("row_accuracy", "mean_accepted_drafts")}
    return res


@torch.no_grad()
def _evaluate(model, trunk, taps, data, args, device, span: int | None = None) -> dict:
    model.eval()
    gen = torch.Generator().manual_seed(1234)
    B = model.c.block_size
    hits = torch.zeros(B - 1)
    acc_len, n = 0.0, 0
    pooled = data.ndim == 2  # generated continuations: anchors after the prompt
    n_win = len(data) if pooled else max(1, min(args.eval_windows, (data.size - 1) // args.seq))
    for i in range(n_win):
        win = data[i] if pooled else data[i * args.seq:(i + 1) * args.seq]
        x = torch.from_numpy(win.astype(np.int64))[None].to(device)
        ctx, g = target_pass(trunk, taps, x)
        labels = g if args.labels == "target" else x
        lo = args.prompt_len if pooled else 1
        hi = None if span is None else lo + span
        toks, pos, lab, mask = block_batch(x, labels, args.blocks, B, args.mask_id, gen, lo, hi)
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
    ap.add_argument("--tap-layers", help="explicit tapped layers, e.g. 3,7,11 (overrides --taps)")
    ap.add_argument("--prompts", help="an .npz with uint16 prompt arrays 'train' [N, P] and "
                                      "'heldout' [M, P]: train on the target's continuations "
                                      "of them (generate_pool) instead of corpus windows")
    ap.add_argument("--gen-batch", type=int, default=1024)
    ap.add_argument("--sampled-frac", type=float, default=0.25)
    ap.add_argument("--temperature", type=float, default=0.8)
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
    trunk = load_target(args.hf, device)
    tc = trunk.config
    args.prompt_len = 0
    if args.prompts:
        z = np.load(args.prompts)
        args.prompt_len = z["train"].shape[1]
        gen_len = args.seq - args.prompt_len
        t0 = time.time()
        pool = generate_pool(trunk, z["train"], gen_len, args.gen_batch, args.sampled_frac,
                             args.temperature, device, args.seed)
        held = generate_pool(trunk, z["heldout"], gen_len, args.gen_batch, 0.0,
                             args.temperature, device, args.seed + 1)
        print(f"generated {pool.shape} + held-out {held.shape} in {time.time() - t0:.0f} s",
              flush=True)
    else:
        pool = None
        train = np.fromfile(Path(args.data) / "train.bin", dtype=np.uint16)
        held = np.fromfile(Path(args.data) / "heldout.bin", dtype=np.uint16)
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
                           target_layers=([int(v) for v in args.tap_layers.split(",")]
                                          if args.tap_layers else
                                          default_target_layers(tc.num_hidden_layers, args.taps)),
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
        if pool is not None:
            rows = torch.randint(0, len(pool), (args.batch,), generator=gen)
            x = torch.from_numpy(pool[rows.numpy()].astype(np.int64)).to(device)
        else:
            starts = torch.randint(0, train.size - args.seq - 1, (args.batch,), generator=gen)
            x = torch.from_numpy(np.stack([train[s:s + args.seq] for s in starts.tolist()])
                                 .astype(np.int64)).to(device)
        # The target pass stays float32: its argmax labels must be the tokens
        # ds4py's float32 forward picks (bf16 flips near-ties).
        ctx, g = target_pass(trunk, taps, x)
        labels = g if args.labels == "target" else x
        with torch.autocast(**amp):
            toks, pos, lab, mask = block_batch(x, labels, args.blocks, cfg.block_size,
                                               cfg.mask_token_id, gen)
            loss, _, _ = block_loss(model, trunk, ctx.float(), toks, pos, lab, mask,
                                    cfg.block_size, args.gamma)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        # Time steps 20..60 (the first ones include CUDA warm-up and autotuning).
        if args.fit_steps and st is None and step == 20:
            t20 = time.time()
        if args.fit_steps and st is None and step == 60:
            per_step = (time.time() - t20) / 40
            evals = max(1, args.steps // args.eval_every)
            fit = step + int((deadline - 45 - 10 * evals - time.time()) / per_step)
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
