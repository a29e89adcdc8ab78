"""Step 2 of the demo-model recipe: train trunk + MTP jointly (one GPU).

    python training/train.py --data training/data --ckpt DIR --out OUT
        [--steps N] [--minutes M] [--batch B] [--seq T]

Loss = CE(trunk next token) + MTP_WEIGHT * CE(MTP next-next token). AdamW,
linear warm-up then cosine decay to 10% over --steps; bf16 autocast, fp32
master weights. The run stops at --steps or after --minutes of wall time,
whichever comes first, and writes a resumable state (fp32 weights + optimizer
+ step + RNG) to --ckpt, so one schedule can span several time-limited
commands. --out receives the exported HF checkpoint (bf16 safetensors shards,
config.json with mtp_num_hidden_layers = 1, mtp.safetensors) and a JSON log.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import demo_model as D  # noqa: E402

MTP_WEIGHT = 0.5


def batches(data: np.ndarray, batch: int, seq: int, gen: torch.Generator, device):
    n = data.size - (seq + 2)
    while True:
        starts = torch.randint(0, n, (batch,), generator=gen).numpy()
        x = np.stack([data[s : s + seq + 2] for s in starts]).astype(np.int64)
        yield torch.from_numpy(x).to(device, non_blocking=True)


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    p = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


@torch.no_grad()
def evaluate(trunk, mtp, data: np.ndarray, seq: int, device, max_windows: int = 64) -> dict:
    """Held-out metrics over consecutive windows (no sampling noise)."""
    trunk.eval(), mtp.eval()
    ce_sum = mce_sum = 0.0
    n = acc = nn_acc = nxt = 0
    step = seq + 2
    for w in range(min(max_windows, (data.size - 2) // step)):
        x = torch.from_numpy(data[w * step : (w + 1) * step].astype(np.int64))[None].to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
            ce, mce, lg, mlg = D.losses(trunk, mtp, x)
        ce_sum += ce.item() * (seq + 1)
        mce_sum += mce.item() * seq
        ta = lg[0, 1:].argmax(-1)
        ma = mlg[0].argmax(-1)
        acc += (ta == ma).sum().item()
        nn_acc += (ma == x[0, 2:]).sum().item()
        nxt += (lg[0].argmax(-1) == x[0, 1:]).sum().item()
        n += seq
    trunk.train(), mtp.train()
    return {
        "heldout_loss": ce_sum / (n + n // seq),
        "heldout_ppl": math.exp(ce_sum / (n + n // seq)),
        "mtp_loss": mce_sum / n,
        "mtp_acceptance": acc / n,  # P(MTP argmax == trunk argmax at the next position)
        "mtp_next_next_acc": nn_acc / n,
        "trunk_next_acc": nxt / (n + n // seq),
        "eval_tokens": n,
    }


def save_state(path: Path, trunk, mtp, opt, step: int, gen, elapsed: float, total: int) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "trunk": trunk.state_dict(),
            "mtp": mtp.state_dict(),
            "opt": opt.state_dict(),
            "step": step,
            "gen": gen.get_state(),
            "elapsed": elapsed,
            "total_steps": total,
        },
        tmp,
    )
    os.replace(tmp, path)


def export_hf(trunk, mtp, out: Path) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    trunk_bf = D.build()[0]
    trunk_bf.load_state_dict(trunk.state_dict())
    trunk_bf.to(torch.bfloat16).save_pretrained(out, safe_serialization=True, max_shard_size="15MB")
    mtp_state = {
        k: v.detach().to(torch.bfloat16).contiguous().cpu()
        for k, v in mtp.checkpoint_state().items()
    }
    save_file(mtp_state, str(out / "mtp.safetensors"), metadata={"format": "pt"})
    idx = out / "model.safetensors.index.json"
    if idx.exists():
        wm = json.loads(idx.read_text())["weight_map"]
    else:
        with safe_open(str(out / "model.safetensors"), "pt") as f:
            wm = {k: "model.safetensors" for k in f.keys()}
    wm.update({k: "mtp.safetensors" for k in mtp_state})
    idx.write_text(json.dumps({"metadata": {}, "weight_map": wm}, indent=1))
    cfg = json.loads((out / "config.json").read_text())
    cfg["mtp_num_hidden_layers"] = 1
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--steps",
        type=int,
        default=3000,
        help="schedule length; capped by --budget-minutes at the measured step time",
    )
    ap.add_argument(
        "--budget-minutes",
        type=float,
        default=0.0,
        help="if > 0 on a fresh start: time 20 steps, then shorten --steps to fit",
    )
    ap.add_argument("--minutes", type=float, default=8.0)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--init", help="HF checkpoint dir to start from (weights only)")
    args = ap.parse_args()

    t0 = time.time()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    data_dir = Path(args.data)
    train = np.fromfile(data_dir / "train.bin", dtype=np.uint16)
    held = np.fromfile(data_dir / "heldout.bin", dtype=np.uint16)

    trunk, mtp = D.build()
    trunk.to(device), mtp.to(device)
    params = list(trunk.parameters()) + list(mtp.parameters())
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
        fused=device.type == "cuda",
    )
    gen = torch.Generator().manual_seed(args.seed)
    step, elapsed = 0, 0.0
    ckpt = Path(args.ckpt)
    ckpt.mkdir(parents=True, exist_ok=True)
    state_path = ckpt / "state.pt"
    if state_path.exists():
        st = torch.load(state_path, map_location=device, weights_only=False)
        trunk.load_state_dict(st["trunk"]), mtp.load_state_dict(st["mtp"])
        opt.load_state_dict(st["opt"])
        gen.set_state(st["gen"])
        step, elapsed = st["step"], st["elapsed"]
        args.steps = st.get("total_steps", args.steps)
        print(f"resumed at step {step} ({elapsed:.0f} s trained)", flush=True)
    elif args.init:
        from safetensors.torch import load_file
        from transformers import Qwen3_5ForCausalLM

        trunk.load_state_dict(Qwen3_5ForCausalLM.from_pretrained(args.init).state_dict())
        ms = load_file(str(Path(args.init) / "mtp.safetensors"))
        names = {id(p): n for n, p in mtp.checkpoint_state().items()}
        with torch.no_grad():
            for p in mtp.parameters():
                p.copy_(ms[names[id(p)]].float())
        print(f"initialised from {args.init}", flush=True)
    n_params = sum(p.numel() for p in trunk.parameters())
    n_mtp = sum(p.numel() for p in mtp.parameters())
    print(
        f"params trunk {n_params} mtp {n_mtp} train tokens {train.size} device {device}", flush=True
    )

    log = {"args": vars(args), "evals": [], "train": []}
    logp = Path(args.out) / "train_log.json"
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if (ckpt / "train_log.json").exists():
        log = json.loads((ckpt / "train_log.json").read_text())
    it = batches(train, args.batch, args.seq, gen, device)
    run_start = time.time()
    deadline = run_start + args.minutes * 60
    tok_per_step = args.batch * (args.seq + 1)
    sized = step > 0 or args.budget_minutes <= 0
    while step < args.steps and time.time() < deadline:
        if not sized and step == 20:
            torch.cuda.synchronize() if device.type == "cuda" else None
            per_step = (time.time() - run_start) / 20
            fit = int(args.budget_minutes * 60 / per_step)
            print(
                f"{per_step * 1000:.0f} ms/step: budget fits {fit} steps; schedule "
                f"{min(fit, args.steps)} steps",
                flush=True,
            )
            args.steps = min(fit, args.steps)
            sized = True
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        x = next(it)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            ce, mce, _, _ = D.losses(trunk, mtp, x)
        loss = ce + MTP_WEIGHT * mce
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        if step % 50 == 0 or step == 1:
            now = time.time()
            rate = tok_per_step * step / max(1e-9, elapsed + now - run_start) if step else 0
            rec = {
                "step": step,
                "ce": round(ce.item(), 4),
                "mtp_ce": round(mce.item(), 4),
                "gnorm": round(gn.item(), 3),
                "lr": opt.param_groups[0]["lr"],
                "tok_s": round(rate),
            }
            log["train"].append(rec)
            print(json.dumps(rec), flush=True)
        if step % args.eval_every == 0:
            ev = evaluate(trunk, mtp, held, args.seq, device)
            ev["step"] = step
            log["evals"].append(ev)
            print("EVAL", json.dumps(ev), flush=True)
    elapsed += time.time() - run_start
    ev = evaluate(trunk, mtp, held, args.seq, device)
    ev["step"] = step
    log["evals"].append(ev)
    log["elapsed_train_s"] = elapsed
    log["tokens_seen"] = step * tok_per_step
    print("FINAL", json.dumps(ev), flush=True)
    save_state(state_path, trunk, mtp, opt, step, gen, elapsed, args.steps)
    (ckpt / "train_log.json").write_text(json.dumps(log, indent=1))
    logp.write_text(json.dumps(log, indent=1))
    export_hf(trunk, mtp, Path(args.out) / "hf")
    print(
        f"done: step {step}/{args.steps}, {elapsed:.0f} s trained, wall {time.time() - t0:.0f} s",
        flush=True,
    )


if __name__ == "__main__":
    main()
