"""Step 4 of the demo-model recipe: measure the shipped GGUF with ds4py itself.

    python training/evaluate.py [--model ds4py/models/demo-q8_0.gguf]
        [--data training/data] [--out training/results.json]

Reports (all on this machine, CPU, the model's default thread count):
- held-out next-token loss / perplexity through ds4py's forward pass (1024-token
  windows, every row scored), beside a unigram baseline: add-one smoothed
  token frequencies of the train split, scored on the same held-out tokens;
- MTP acceptance through ds4py's nextn head, teacher-forced on the same
  windows: P(head argmax at row p == trunk argmax at position p), and the
  head's next-next-token accuracy against the text;
- 10 fixed prompts, 64 tokens each, greedy and seeded-sampled with the CLI's
  defaults: the texts and the largest number of times any 8-gram occurs
  (the bar: at most 2);
- decode tok/s serial vs with the bundled MTP head (greedy; min/median/max
  of 3, order alternated).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import ds4py  # noqa: E402
from ds4py.demo_model import demo_model_path  # noqa: E402

PROMPTS = [
    ("raw", "def fibonacci(n):\n"),
    ("raw", "import os\nimport sys\n\n\ndef main():\n"),
    ("raw", 'class Stack:\n    """A last-in, first-out stack."""\n\n    def __init__(self):\n'),
    ("raw", "    def __repr__(self):\n"),
    ("raw", "# Copyright (C) 2001 Python Software Foundation\n"),
    ("raw", 'def read_config(path):\n    """Read a config file and return a dict."""\n'),
    ("raw", "try:\n    import threading\nexcept ImportError:\n"),
    ("chat", "Write a Python function `is_prime` that returns True if n is prime."),
    ("chat", "Implement `flatten` in Python. Return a flat list from nested lists."),
    ("chat", "Can you write `word_count`? It should count the words in a string."),
]
CLI_SAMPLING = dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=0)


def max_ngram_repeats(tokens: list[int], n: int = 8) -> int:
    c = Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))
    return max(c.values(), default=0)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def heldout_metrics(model, held: np.ndarray, n_tokens: int, window: int = 1024) -> dict:
    nll = 0.0
    n = acc = nn_acc = mtp_rows = 0
    for start in range(0, min(n_tokens, held.size - 1) - window + 1, window):
        w = held[start : start + window + 1].astype(np.int32)
        s = model.new_session()
        logits, hidden = s.eval(w[:-1], all_logits=True, return_hidden=True)
        logits, hidden = np.array(logits), np.array(hidden)
        lp = log_softmax(logits)
        nll -= lp[np.arange(window), w[1:]].sum()
        n += window
        trunk_arg = logits.argmax(-1)
        # head row r pairs token w[r] with the trunk hidden of position r-1
        # and predicts w[r+1]; the trunk's row r predicts the same token
        rows = np.arange(1, window)
        hl, _ = model.nextn_eval(s, w[rows], hidden[rows - 1], rows)
        head_arg = np.array(hl).argmax(-1)
        acc += int((head_arg == trunk_arg[rows]).sum())
        nn_acc += int((head_arg == w[rows + 1]).sum())
        mtp_rows += rows.size
        s.close()
    return {
        "heldout_tokens_scored": n,
        "heldout_loss": nll / n,
        "heldout_ppl": math.exp(nll / n),
        "mtp_acceptance": acc / mtp_rows,
        "mtp_next_next_acc": nn_acc / mtp_rows,
    }


def unigram_baseline(train: np.ndarray, held: np.ndarray, vocab: int, n_tokens: int) -> dict:
    counts = np.bincount(train, minlength=vocab).astype(np.float64) + 1.0
    lp = np.log(counts / counts.sum())
    h = held[1 : min(n_tokens, held.size - 1) + 1]
    loss = float(-lp[h].mean())
    return {"unigram_loss": loss, "unigram_ppl": math.exp(loss)}


def samples(model) -> list[dict]:
    out = []
    for kind, prompt in PROMPTS:
        rec = {"kind": kind, "prompt": prompt}
        for mode, kw in (("greedy", dict(temperature=0.0)), ("sampled", CLI_SAMPLING)):
            g = ds4py.generate(model, prompt, max_tokens=64, chat=kind == "chat", draft=False, **kw)
            rec[mode] = {
                "text": g.text,
                "tokens": g.tokens,
                "finish": g.finish_reason,
                "max_8gram_repeats": max_ngram_repeats(g.tokens),
            }
        out.append(rec)
    return out


def speed(model, reps: int = 3, dflash_model=None) -> dict:
    """Greedy decode tok/s on 3 code prompts x 128 tokens: serial, the bundled
    MTP head and (``dflash_model``: the target loaded with dflash=FILE) the
    DFlash drafter, both under the adaptive policy and at their best fixed
    depth; modes rotate between repetitions (min/median/max of ``reps``)."""
    prompts = [p for k, p in PROMPTS if k == "raw"][:3]
    modes = {"serial": (model, dict(draft=False)), "mtp": (model, dict(draft=None)),
             "mtp_depth2": (model, dict(draft=None, draft_depth=2))}
    if dflash_model is not None:
        modes["dflash"] = (dflash_model, dict(draft=None, force_draft=True))
        modes["dflash_depth7"] = (dflash_model, dict(draft=None, force_draft=True,
                                                     draft_depth=7))
    res: dict[str, list[float]] = {m: [] for m in modes}
    stats: dict[str, dict] = {}
    names = list(modes)
    for r in range(reps):
        order = names[r % len(names):] + names[:r % len(names)]
        for mode in order:
            m, kw = modes[mode]
            toks = secs = 0.0
            for p in prompts:
                g = ds4py.generate(m, p, max_tokens=128, temperature=0.0, **kw)
                toks += g.generated_tokens
                secs += g.generation_s
                if g.draft:
                    stats[mode] = g.draft
            res[mode].append(toks / secs)
    summary = {
        m: {"min": min(v), "median": statistics.median(v), "max": max(v)} for m, v in res.items()
    }
    for mode in names[1:]:
        summary[mode]["ratio_median"] = summary[mode]["median"] / summary["serial"]["median"]
    summary["draft_stats_last"] = stats
    return summary


def dflash_acceptance(model, path: str, depths=(1, 3, 7), max_tokens: int = 64) -> dict:
    """Mean accepted drafts per drafting round of the DFlash drafter at fixed
    depths (7 = its whole block of 8), greedy, ``max_tokens`` each, on the raw
    prompts and the openings of the held-out sample files. Tokens per round
    (DFlash's "acceptance length" tau) is this + 1, the target's own token."""
    from ds4py.dflash import DFlashDrafter
    from ds4py.spec.loop import speculative_generate
    from ds4py.spec.policy import FixedPolicy

    sample = json.loads((HERE.parent / "tests/golden/demo/heldout_sample.json").read_text())
    prompts = [p for k, p in PROMPTS if k == "raw"] + [t[:600] for t in sample.values()]
    drafter = DFlashDrafter.load(model, path)
    out = {}
    for depth in depths:
        acc = drafted = rounds = 0
        for p in prompts:
            s = drafter.session(model.new_session())
            _, st = speculative_generate(model, model.tokenizer.encode(p), max_tokens,
                                         policy=FixedPolicy(depth), drafter=drafter, session=s)
            acc += st["accepted"]
            drafted += st["drafted"]
            rounds += st.get("draft_rounds", st["rounds"])
            s.close()
        out[str(depth)] = {"accepted": acc, "drafted": drafted,
                           "mean_accepted_per_round": acc / max(1, rounds)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=demo_model_path())
    ap.add_argument("--data", default=str(HERE / "data"))
    ap.add_argument("--out", default=str(HERE / "results.json"))
    ap.add_argument("--heldout-tokens", type=int, default=32768)
    args = ap.parse_args()
    model = ds4py.load(args.model)
    held = np.fromfile(Path(args.data) / "heldout.bin", dtype=np.uint16)
    train = np.fromfile(Path(args.data) / "train.bin", dtype=np.uint16)
    res = {"model": Path(args.model).name, "threads": getattr(model, "n_threads", None)}
    t = time.time()
    res.update(heldout_metrics(model, held, args.heldout_tokens))
    res.update(unigram_baseline(train, held, model.config.vocab_size, args.heldout_tokens))
    print(
        json.dumps({k: v for k, v in res.items()}, indent=1),
        f"({time.time() - t:.0f} s)",
        flush=True,
    )
    res["samples"] = samples(model)
    for s in res["samples"]:
        print(
            f"--- {s['kind']}: {s['prompt']!r}  greedy max8={s['greedy']['max_8gram_repeats']} "
            f"sampled max8={s['sampled']['max_8gram_repeats']}\n{s['sampled']['text']}",
            flush=True,
        )
    dfl = HERE.parent / "ds4py" / "models" / "demo-dflash-q8_0.gguf"
    if dfl.exists():
        res["dflash"] = dflash_acceptance(model, str(dfl))
        res["dflash_256"] = dflash_acceptance(model, str(dfl), depths=(7,), max_tokens=256)
        print("dflash", json.dumps(res["dflash"]), json.dumps(res["dflash_256"]), flush=True)
    res["speed"] = speed(model, dflash_model=ds4py.load(args.model, dflash=str(dfl))
                         if dfl.exists() else None)
    print(json.dumps(res["speed"], indent=1))
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
