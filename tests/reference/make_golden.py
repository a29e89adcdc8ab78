"""Regenerate the forward-pass reference set: tests/golden/models/ (small
random-weight Qwen3.5 GGUFs) and tests/golden/logits/ (llama.cpp and
transformers logits for them). Opt-in (`make golden`); CI only reads the
committed results.

Needs the test-only references: torch 2.13.0 (CPU), transformers 5.24,
llama-cpp-python 0.3.36 built without AMX and with repacking available but
switched off at load (see README), and the llama.cpp sources vendored in that
version's sdist (for convert_hf_to_gguf.py and its gguf-py): --llama-src, or
$DS4_LLAMA_CPP_SRC, or else the sdist is fetched with `pip download` into
build/golden/.

    python tests/reference/make_golden.py            # everything
    python tests/reference/make_golden.py --stage logits   # keep the GGUFs

What is recorded (all float32 logits; K = 16 top entries per row):
- llama.cpp, per GGUF (dense/moe x F32/BF16/Q8_0/Q4_K_M) and per sequence
  (16, 100, 700 fixed token ids): the whole sequence in ONE llama_decode call
  ("one"), the same split in two calls ("two", llama.cpp against itself), the
  MTP head teacher-forced on the trunk's hidden rows ("mtp0": rows 0..n-1 with
  a zero h row for position 0, as llama.cpp's draft driver feeds a fresh
  sequence; "mtp1": rows 1..n-1 only), a 4-step MTP draft chain that feeds the
  head its own output hidden ("chain"), and 32-step greedy continuations of
  the 16- and 100-token prompts ("greedy16", "greedy100").
- transformers in float32 on the same ids, with the F32 weights ("hf-f32") and
  with the weights that the BF16 file stores as BF16 rounded to bfloat16
  ("hf-bf16"), trunk and the MTP reference built from transformers' modules.
Each record holds top-k ids/values for every row, the row's logsumexp (so the
log-probabilities of the stored ids are exact) and the full logits of a few
rows. Metrics of every comparison go to logits/summary.json and the README.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))

import golden_models as G  # noqa: E402

GOLDEN = ROOT / "tests" / "golden"
MODELS = GOLDEN / "models"
LOGITS = GOLDEN / "logits"
WORK = ROOT / "build" / "golden"

VERSIONS = {"torch": "2.13.0", "transformers": "5.24", "llama_cpp": "0.3.36"}
TYPES = ["f32", "bf16", "q8_0", "q4_k_m"]
SEQ_LENS = [16, 100, 700]
# two-batch split points. llama.cpp's CPU flash attention takes a different
# path for a ubatch of < 64 query rows (see README), so a split whose parts are
# both >= 64 rows reproduces the one-batch logits bit for bit; these splits put
# the short part on either side.
SPLITS = {16: 7, 100: 37, 700: 660}
SEQ_SEED = 20240611
TOPK = 16
GREEDY_STEPS = 32
CHAIN_STEPS = 4


def log(msg: str) -> None:
    print(f"[make_golden {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------------------
# environment


def check_versions() -> dict:
    import llama_cpp
    import torch
    import transformers

    got = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "llama_cpp": llama_cpp.__version__,
        "numpy": np.__version__,
    }
    import gguf

    got["gguf (installed)"] = getattr(gguf, "__version__", "?")
    for k, want in VERSIONS.items():
        if not got[k].startswith(want):
            raise SystemExit(
                f"make_golden: {k} {got[k]} installed, the fixtures are made with {want}"
            )
    return got


def llama_src(arg: str | None) -> Path:
    cand = arg or os.environ.get("DS4_LLAMA_CPP_SRC")
    if cand:
        p = Path(cand)
    else:
        p = WORK / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp"
        if not p.exists():
            WORK.mkdir(parents=True, exist_ok=True)
            log("fetching the llama-cpp-python 0.3.36 sdist (for llama.cpp's converter)")
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--no-binary",
                    ":all:",
                    "llama-cpp-python==0.3.36",
                    "-d",
                    str(WORK),
                ],
                check=True,
            )
            subprocess.run(
                ["tar", "-xzf", str(WORK / "llama_cpp_python-0.3.36.tar.gz"), "-C", str(WORK)],
                check=True,
            )
    if not (p / "convert_hf_to_gguf.py").exists():
        raise SystemExit(f"make_golden: no convert_hf_to_gguf.py under {p}")
    return p


def llama_commit(src: Path) -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except Exception:
        return "unknown"


# ---------------------------------------------------------------------------
# models


def gguf_path(name: str, t: str) -> Path:
    return MODELS / f"{name}-{t}.gguf"


def make_models(src: Path) -> dict:
    import golden_llama as GL

    info = {}
    tok_dir = WORK / "tokenizer"
    G.build_tokenizer(tok_dir)
    MODELS.mkdir(parents=True, exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok_dir / f, MODELS / f)
    for name, spec in G.SPECS.items():
        hf_dir = WORK / f"hf_{name}"
        if hf_dir.exists():
            shutil.rmtree(hf_dir)
        model, head = G.build_hf(spec)
        G.save_checkpoint(spec, model, head, hf_dir)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(tok_dir / f, hf_dir / f)
        # transformers' save_pretrained turns full_attention_interval into
        # layer_types and drops it; the released configs carry both, and the
        # converter writes both GGUF keys, so put it back to keep them consistent.
        cfg = json.loads((hf_dir / "config.json").read_text())
        cfg["full_attention_interval"] = spec.hf["full_attention_interval"]
        (hf_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        shutil.copy(hf_dir / "config.json", MODELS / f"{name}.config.json")
        for t in ("f32", "bf16", "q8_0"):
            out = gguf_path(name, t)
            log(f"convert {name} -> {out.name}")
            r = subprocess.run(
                [
                    sys.executable,
                    str(HERE / "golden_convert.py"),
                    str(src),
                    str(hf_dir),
                    str(out),
                    t,
                ],
                capture_output=True,
                text=True,
            )
            (WORK / f"convert-{name}-{t}.log").write_text(r.stdout + r.stderr)
            if r.returncode != 0:
                raise SystemExit(f"converter failed for {name} {t}:\n{r.stderr[-3000:]}")
        log(f"quantize {name} F32 -> Q4_K_M")
        GL.quantize(str(gguf_path(name, "f32")), str(gguf_path(name, "q4_k_m")), "Q4_K_M")
        info[name] = {
            "n_params": int(
                sum(p.numel() for p in model.parameters())
                + sum(p.numel() for p in head.state_dict().values())
            )
        }
    return info


def check_bf16_file(name: str) -> dict:
    """The BF16 file must be the F32 file with exactly the BF16-typed tensors
    rounded (RNE), and the number of BF16 elements must equal the number of
    elements round_params_like_bf16_file rounds on the transformers side."""
    import gguf
    import torch

    f32 = {t.name: t for t in gguf.GGUFReader(str(gguf_path(name, "f32"))).tensors}
    b16 = gguf.GGUFReader(str(gguf_path(name, "bf16"))).tensors
    n_bf16 = 0
    for t in b16:
        ref = np.asarray(f32[t.name].data, dtype=np.float32).reshape(-1)
        if t.tensor_type == gguf.GGMLQuantizationType.BF16:
            got = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)
            if not np.array_equal(got, G.bf16_round_np(ref)):
                raise SystemExit(
                    f"{name}: BF16 tensor {t.name} is not the RNE rounding of its F32 twin"
                )
            n_bf16 += got.size
        elif t.tensor_type == gguf.GGMLQuantizationType.F32:
            if not np.array_equal(np.asarray(t.data, dtype=np.float32).reshape(-1), ref):
                raise SystemExit(
                    f"{name}: F32 tensor {t.name} differs between the F32 and BF16 files"
                )
        else:
            raise SystemExit(
                f"{name}: unexpected type {t.tensor_type.name} for {t.name} in the BF16 file"
            )
    model, head = G.build_hf(G.SPECS[name])
    n_hf = G.round_params_like_bf16_file(model, head)
    if n_hf != n_bf16:
        raise SystemExit(
            f"{name}: the BF16 file has {n_bf16} BF16 elements, the transformers rounding "
            f"touches {n_hf}"
        )
    del torch
    return {"bf16_elements": n_bf16}


def describe_gguf(path: Path) -> dict:
    import gguf

    r = gguf.GGUFReader(str(path))
    kv = {}
    for f in r.fields.values():
        if f.name.startswith("GGUF."):
            continue
        if f.name in (
            "tokenizer.ggml.tokens",
            "tokenizer.ggml.merges",
            "tokenizer.ggml.token_type",
        ):
            kv[f.name] = f"[{len(f.data)} entries]"
            continue
        try:
            v = f.contents()
        except Exception:
            v = "?"
        if isinstance(v, str) and len(v) > 60:
            v = v[:57] + "..."
        kv[f.name] = v
    tensors = [(t.name, [int(x) for x in t.shape], t.tensor_type.name) for t in r.tensors]
    return {"kv": kv, "tensors": tensors}


# ---------------------------------------------------------------------------
# records


def sequences() -> dict:
    rng = np.random.default_rng(SEQ_SEED)
    # ordinary (non-special) token ids only
    return {n: rng.integers(0, G.EOT_ID, size=n, dtype=np.int64).astype(np.int32) for n in SEQ_LENS}


def full_rows(n: int, split: int | None = None) -> np.ndarray:
    if n <= 16:
        return np.arange(n, dtype=np.int32)
    rows = {0, 1, 2, n // 4, n // 2, (3 * n) // 4, n - 3, n - 2, n - 1}
    if split is not None:
        rows |= {split - 1, split}
    return np.array(sorted(r for r in rows if 0 <= r < n), dtype=np.int32)


def lse64(x: np.ndarray) -> np.ndarray:
    """log-sum-exp of each row, in float64 (returned as float64)."""
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return m[..., 0] + np.log(np.exp(x - m).sum(-1))


def pack(out: dict, prefix: str, logits: np.ndarray, rows: np.ndarray | None = None) -> None:
    """top-k ids/values of every row (ties broken by lower id), logsumexp,
    and full logits of the given rows."""
    logits = np.asarray(logits, dtype=np.float32)
    order = np.lexsort(
        (np.broadcast_to(np.arange(logits.shape[1]), logits.shape), -logits), axis=-1
    )
    ids = order[:, :TOPK].astype(np.int32)
    out[prefix + "_topk_ids"] = ids
    out[prefix + "_topk_vals"] = np.take_along_axis(logits, ids, axis=1)
    out[prefix + "_lse"] = lse64(logits).astype(np.float32)
    if rows is None:
        rows = full_rows(logits.shape[0])
    out[prefix + "_full_rows"] = rows.astype(np.int32)
    out[prefix + "_full"] = logits[rows]


def compare(a: np.ndarray, b: np.ndarray) -> dict:
    """max |Δlogit|, mean KL(a||b) over rows (float64), top-1 agreement, and
    top-1 agreement where a's top-1 margin is at least 0.5 (clear margin)."""
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    la = a - lse64(a)[:, None]
    lb = b - lse64(b)[:, None]
    kl = (np.exp(la) * (la - lb)).sum(-1)
    top_a = a.argmax(-1)
    srt = np.sort(a, axis=-1)
    margin = srt[:, -1] - srt[:, -2]
    clear = margin >= 0.5
    return {
        "max_abs": float(np.abs(a - b).max()),
        "mean_kl": float(kl.mean()),
        "top1": float((top_a == b.argmax(-1)).mean()),
        "top1_clear": float((top_a[clear] == b.argmax(-1)[clear]).mean()) if clear.any() else None,
        "n_clear": int(clear.sum()),
        "rows": int(a.shape[0]),
    }


def run_llama(name: str, t: str, seqs: dict, summary: dict) -> dict:
    import golden_llama as GL

    out: dict = {}
    full: dict = {}
    path = str(gguf_path(name, t))
    with GL.opened(path) as m:
        ctx = m.context()
        ctx_h = m.context()
        ctx_h.export_h(True, masked=False)
        ctx_1t = m.context(threads=1)
        ctx_mtp = m.context(mtp=True)
        ctx_mtp.export_h(True, masked=True)
        for n, toks in seqs.items():
            s = f"s{n}"
            sp = SPLITS[n]
            ctx.clear()
            one = ctx.decode(toks, 0)
            ctx.clear()
            two = np.concatenate([ctx.decode(toks[:sp], 0), ctx.decode(toks[sp:], sp)])
            ctx_h.clear()
            one_h, h = ctx_h.decode(toks, 0, want_h=True)
            ctx_1t.clear()
            one_1t = ctx_1t.decode(toks, 0)
            rows = full_rows(n, sp)
            pack(out, f"{s}_one", one, rows)
            pack(out, f"{s}_two", two, rows)
            out[f"{s}_split"] = np.int32(sp)
            full[f"{s}_one"] = one
            summary[f"{s}_one_vs_two"] = compare(one, two)
            summary[f"{s}_one_vs_export_h"] = float(np.abs(one - one_h).max())
            summary[f"{s}_threads2_vs_1"] = float(np.abs(one - one_1t).max())
            # MTP, teacher-forced on llama.cpp's own h rows
            hz = np.concatenate([np.zeros((1, m.n_embd), np.float32), h[:-1]])
            ctx_mtp.clear()
            mtp0, _ = ctx_mtp.mtp_decode(toks, hz, np.arange(n))
            ctx_mtp.clear()
            mtp1, _ = ctx_mtp.mtp_decode(toks[1:], h[:-1], np.arange(1, n))
            pack(out, f"{s}_mtp0", mtp0)
            pack(out, f"{s}_mtp1", mtp1)
            full[f"{s}_mtp0"] = mtp0
            full[f"{s}_mtp1"] = mtp1
            # draft chain after the whole sequence: x_n = trunk argmax at n-1,
            # row (x_n, h_{n-1}) at n, then (draft, MTP's own hm) at n+1, ...
            # (continues in the mtp0 context's KV)
            ctx_mtp.clear()
            ctx_mtp.mtp_decode(toks, hz, np.arange(n))
            tok = int(one[-1].argmax())
            hrow = h[-1:]
            chain_tok, chain_logits = [tok], []
            for j in range(CHAIN_STEPS):
                lg, hm = ctx_mtp.mtp_decode([tok], hrow, [n + j])
                chain_logits.append(lg[0])
                tok = int(lg[0].argmax())
                hrow = hm
                chain_tok.append(tok)
            out[f"{s}_chain_tokens"] = np.array(chain_tok, dtype=np.int32)
            pack(out, f"{s}_chain", np.stack(chain_logits), np.arange(CHAIN_STEPS, dtype=np.int32))
            full[f"{s}_chain"] = (np.array(chain_tok), np.stack(chain_logits))
        # greedy continuations
        for n in (16, 100):
            toks = seqs[n]
            ctx.clear()
            lg = ctx.decode(toks, 0)[-1]
            gen, steps = [], []
            for j in range(GREEDY_STEPS):
                steps.append(lg)
                tok = int(lg.argmax())
                gen.append(tok)
                lg = ctx.decode([tok], n + j)[0]
            out[f"greedy{n}_tokens"] = np.array(gen, dtype=np.int32)
            st = np.stack(steps)
            pack(out, f"greedy{n}", st, np.arange(0, GREEDY_STEPS, dtype=np.int32)[:0])
            srt = np.sort(st, axis=-1)
            out[f"greedy{n}_margin"] = (srt[:, -1] - srt[:, -2]).astype(np.float32)
            full[f"greedy{n}"] = np.array(gen)
        for c in (ctx, ctx_h, ctx_1t, ctx_mtp):
            c.close()
    return out, full


def run_hf(name: str, variant: str, seqs: dict) -> tuple[dict, dict]:
    import torch

    torch.set_grad_enabled(False)
    model, head = G.build_hf(G.SPECS[name])
    if variant == "bf16":
        G.round_params_like_bf16_file(model, head)
    out: dict = {}
    full: dict = {}
    for n, toks in seqs.items():
        s = f"s{n}"
        ids = torch.tensor(toks, dtype=torch.long)
        logits = model(ids[None]).logits[0].numpy()
        h = model.model(ids[None]).last_hidden_state[0]
        rows = full_rows(n, SPLITS[n])
        pack(out, f"{s}_one", logits, rows)
        full[f"{s}_one"] = logits
        hz = torch.cat([torch.zeros(1, h.shape[1]), h[:-1]])
        mtp0, hm0 = head.forward(ids, hz, torch.arange(n))
        mtp1, _ = head.forward(ids[1:], h[:-1], torch.arange(1, n))
        pack(out, f"{s}_mtp0", mtp0.numpy())
        pack(out, f"{s}_mtp1", mtp1.numpy())
        full[f"{s}_mtp0"] = mtp0.numpy()
        full[f"{s}_mtp1"] = mtp1.numpy()
        # the same chain as llama.cpp's, recomputed: the MTP rows attend to
        # everything before them, so run the whole row sequence each step
        tok = int(logits[-1].argmax())
        chain_tok, chain_logits = [tok], []
        c_tokens = list(toks) + [tok]
        c_h = [hz[i] for i in range(n)] + [h[-1]]
        for j in range(CHAIN_STEPS):
            lg, hm = head.forward(torch.tensor(c_tokens), torch.stack(c_h), torch.arange(n + 1 + j))
            chain_logits.append(lg[-1].numpy())
            tok = int(lg[-1].argmax())
            chain_tok.append(tok)
            c_tokens.append(tok)
            c_h.append(hm[-1])
        out[f"{s}_chain_tokens"] = np.array(chain_tok, dtype=np.int32)
        pack(out, f"{s}_chain", np.stack(chain_logits), np.arange(CHAIN_STEPS, dtype=np.int32))
        full[f"{s}_chain"] = (np.array(chain_tok), np.stack(chain_logits))
        del hm0
    for n in (16, 100):
        cur = list(seqs[n])
        gen, steps = [], []
        for _ in range(GREEDY_STEPS):
            lg = model(torch.tensor(cur)[None]).logits[0, -1].numpy()
            steps.append(lg)
            tok = int(lg.argmax())
            gen.append(tok)
            cur.append(tok)
        out[f"greedy{n}_tokens"] = np.array(gen, dtype=np.int32)
        st = np.stack(steps)
        pack(out, f"greedy{n}", st, np.arange(0, GREEDY_STEPS, dtype=np.int32)[:0])
        srt = np.sort(st, axis=-1)
        out[f"greedy{n}_margin"] = (srt[:, -1] - srt[:, -2]).astype(np.float32)
        full[f"greedy{n}"] = np.array(gen)
    return out, full


def prefix_probe(toks: np.ndarray) -> dict:
    """llama.cpp against itself by ubatch size: the first k rows decoded as a
    k-token batch vs the same rows of a 200-token batch (max |Δlogit|)."""
    import golden_llama as GL

    res = {}
    for t in ("f32", "q8_0"):
        with GL.opened(str(gguf_path("dense", t))) as m:
            c = m.context()
            c.clear()
            ref = c.decode(toks[:200], 0)
            row = {}
            for k in (1, 2, 16, 63, 64, 65, 128):
                c.clear()
                row[str(k)] = float(np.abs(c.decode(toks[:k], 0) - ref[:k]).max())
            c.close()
        res[f"dense-{t}"] = row
    return res


def _perm_v_heads(m, cfg):
    """Relabel the GDN value heads grouped<->tiled in every v-indexed weight:
    the function is then that of a runtime using the wrong k-head rule."""
    import torch

    nk, nv, d = cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim
    perm = torch.arange(nv).view(nk, nv // nk).t().reshape(-1)
    idx = (perm[:, None] * d + torch.arange(d)).reshape(-1)
    kd = nk * d
    for i, lt in enumerate(cfg.layer_types):
        if lt != "linear_attention":
            continue
        la = m.model.layers[i].linear_attn
        w = la.in_proj_qkv.weight
        w[2 * kd :] = w[2 * kd :].clone()[idx]
        cw = la.conv1d.weight
        cw[2 * kd :] = cw[2 * kd :].clone()[idx]
        la.in_proj_z.weight.copy_(la.in_proj_z.weight[idx].clone())
        for p in (la.in_proj_b.weight, la.in_proj_a.weight, la.A_log, la.dt_bias):
            p.copy_(p[perm].clone())
        la.out_proj.weight.copy_(la.out_proj.weight[:, idx].clone())


def _perm_q_heads(m, cfg):
    """Relabel attention query heads so GQA pairs them with kv heads tiled
    (h % n_kv) instead of grouped (h // group)."""
    import torch

    nh, nkv, dh = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    perm = torch.arange(nh).view(nkv, nh // nkv).t().reshape(-1)
    i2 = (perm[:, None] * 2 * dh + torch.arange(2 * dh)).reshape(-1)
    i1 = (perm[:, None] * dh + torch.arange(dh)).reshape(-1)
    for i, lt in enumerate(cfg.layer_types):
        if lt == "full_attention":
            a = m.model.layers[i].self_attn
            a.q_proj.weight.copy_(a.q_proj.weight[i2].clone())
            a.o_proj.weight.copy_(a.o_proj.weight[:, i1].clone())


def sensitivity(toks: np.ndarray) -> dict:
    """How far typical implementation bugs (simulated in transformers by
    editing weights) and small weight noise move the float32 logits of the
    100-token sequence: the scale the forward-pass tolerances must stay under."""
    import torch

    torch.set_grad_enabled(False)
    ids = torch.tensor(toks, dtype=torch.long)[None]

    def noise(rel):
        def f(m, cfg):
            g = torch.Generator().manual_seed(99)
            for _, p in m.named_parameters():
                p.add_(torch.randn(p.shape, generator=g) * p.abs().mean() * rel)

        return f

    def norms_plus_one(m, cfg):
        for n, p in m.named_parameters():
            if (
                n.endswith(("layernorm.weight", "q_norm.weight", "k_norm.weight"))
                or n == "model.norm.weight"
            ):
                p.add_(1.0)

    def conv_reversed(m, cfg):
        for n, p in m.named_parameters():
            if n.endswith("conv1d.weight"):
                p.copy_(p.flip(-1))

    cases = {
        "weight noise 0.05%": noise(5e-4),
        "weight noise 0.5%": noise(5e-3),
        "norm weights +1 again": norms_plus_one,
        "conv taps reversed": conv_reversed,
        "GDN v-head rule grouped<->tiled": _perm_v_heads,
        "GQA rule grouped<->tiled": _perm_q_heads,
    }
    res = {}
    for name, spec in G.SPECS.items():
        base, _ = G.build_hf(spec)
        ref = base(ids).logits[0].numpy()
        row = {}
        for cname, fn in cases.items():
            m, _ = G.build_hf(spec)
            fn(m, m.config)
            row[cname] = compare(ref, m(ids).logits[0].numpy())
        res[name] = row
    return res


def make_logits(meta: dict) -> dict:
    import golden_llama as GL

    LOGITS.mkdir(parents=True, exist_ok=True)
    seqs = sequences()
    np.savez_compressed(
        LOGITS / "sequences.npz",
        **{f"s{n}": v for n, v in seqs.items()},
        **{f"s{n}_split": np.int32(SPLITS[n]) for n in seqs},
    )
    summary: dict = {"llama": {}, "hf_vs_llama": {}, "mtp": {}, "greedy": {}, "chain": {}}
    meta["flash_attn_auto_on"] = GL.flash_attn_auto_resolves_on(str(gguf_path("dense", "f32")))
    hf_full = {}
    for name in G.SPECS:
        for variant in ("f32", "bf16"):
            log(f"transformers {name} {variant}")
            out, full = run_hf(name, variant, seqs)
            np.savez_compressed(LOGITS / f"{name}-hf-{variant}.npz", **out)
            hf_full[(name, variant)] = full
    for name in G.SPECS:
        for t in TYPES:
            log(f"llama.cpp {name} {t}")
            s: dict = {}
            out, full = run_llama(name, t, seqs, s)
            out["gguf_sha256"] = np.array(sha256(gguf_path(name, t)))
            np.savez_compressed(LOGITS / f"{name}-{t}.npz", **out)
            summary["llama"][f"{name}-{t}"] = s
            ref_variant = "bf16" if t == "bf16" else "f32"
            ref = hf_full[(name, ref_variant)]
            key = f"{name}-{t} vs hf-{ref_variant}"
            summary["hf_vs_llama"][key] = {
                f"s{n}": compare(full[f"s{n}_one"], ref[f"s{n}_one"]) for n in SEQ_LENS
            }
            summary["mtp"][key] = {
                f"s{n}_{k}": compare(full[f"s{n}_{k}"], ref[f"s{n}_{k}"])
                for n in SEQ_LENS
                for k in ("mtp0", "mtp1")
            }
            summary["chain"][key] = {
                f"s{n}": {
                    "llama_tokens": full[f"s{n}_chain"][0].tolist(),
                    "hf_tokens": ref[f"s{n}_chain"][0].tolist(),
                    "max_abs_step0": float(
                        np.abs(full[f"s{n}_chain"][1][0] - ref[f"s{n}_chain"][1][0]).max()
                    ),
                }
                for n in SEQ_LENS
            }
            summary["greedy"][key] = {
                f"greedy{n}": {
                    "same_tokens": int((full[f"greedy{n}"] == ref[f"greedy{n}"]).cumprod().sum())
                }
                for n in (16, 100)
            }
    summary["prefix_probe"] = prefix_probe(seqs[700])
    summary["sensitivity"] = sensitivity(seqs[100])
    (LOGITS / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--llama-src", help="llama.cpp source tree (vendored in the llama-cpp-python sdist)"
    )
    ap.add_argument("--stage", choices=["all", "models", "logits"], default="all")
    args = ap.parse_args()
    versions = check_versions()
    src = llama_src(args.llama_src)
    meta = {"versions": versions, "llama_cpp_commit": llama_commit(src), "llama_src": str(src)}
    if args.stage in ("all", "models"):
        meta["models"] = make_models(src)
    else:
        meta["models"] = {}
        for name, spec in G.SPECS.items():
            model, head = G.build_hf(spec)
            meta["models"][name] = {
                "n_params": int(
                    sum(p.numel() for p in model.parameters())
                    + sum(p.numel() for p in head.state_dict().values())
                )
            }
    for name in G.SPECS:
        meta.setdefault("bf16_check", {})[name] = check_bf16_file(name)
    if args.stage in ("all", "logits"):
        make_logits(meta)
    meta["files"] = {
        p.name: {"bytes": p.stat().st_size, "sha256": sha256(p)}
        for p in sorted(MODELS.glob("*.gguf"))
    }
    meta["describe"] = {n: describe_gguf(gguf_path(n, "q4_k_m")) for n in G.SPECS}
    meta["describe_f32"] = {n: describe_gguf(gguf_path(n, "f32")) for n in G.SPECS}
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / "meta.json").write_text(json.dumps(meta, indent=1, default=str) + "\n")
    summary_path = LOGITS / "summary.json"
    if summary_path.exists():
        import golden_readme

        readme = golden_readme.write(
            meta, json.loads(summary_path.read_text()), sys.modules[__name__]
        )
        log(f"wrote {readme}")
    log(f"done; meta in {WORK / 'meta.json'}")


if __name__ == "__main__":
    main()
