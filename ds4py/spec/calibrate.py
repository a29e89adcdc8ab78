"""Measure a (target, draft) pair and write a pairs-table entry.

    python -m ds4py spec-calibrate TARGET [--draft-head F | --dflash F] [--out FILE]

For each prompt of a fixed set (code, prose, math, chat), greedy generation
of ``max_tokens`` tokens, serial (``draft=False``) and with drafting
(adaptive policy, the pairing forced: this is the measurement), ``reps``
times each, the order reversed on alternate repetitions (serial first on
even ones) after one discarded warm-up. Recorded per prompt: whether the
drafted output was identical to serial on every repetition, acceptance
(accepted / drafted drafts), tokens per drafting round, and decode tok/s
min / median / max of both.

Verdict: ALLOW_MEASURED_GOOD when every output was identical and the
median speed-up over the prompts is at least ``min_speedup`` (1.0), else
REFUSE_MEASURED_BAD. The entry names both identities (ds4py.spec.classifier),
the evidence, the date, the machine and the backend it ran on
(``backend=``, ``--backend``: cpu by default, or cuda / gpu-emul; the
verdict holds on that backend only, ds4py.spec.classifier "Backends");
``--out`` adds it to a user pairs file (written atomically; an entry for
the same pair and backend is replaced).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import tempfile

from .classifier import (
    ALLOW_MEASURED_GOOD,
    REFUSE_MEASURED_BAD,
    PairingError,
    classify,
    entry_backend,
    measuring,
)

__all__ = ["PROMPTS", "calibrate", "add_entry"]

PROMPTS = {
    "code": "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "prose": "The old lighthouse keeper climbed the stairs every evening, and",
    "math": "Solve for x: 3x + 7 = 22. First subtract 7 from both sides:",
    "chat": "What is the capital of France? Answer in one sentence.",
}


def _run(model, prompt, max_tokens, draft, chat):
    from ..generate import generate

    with measuring():
        g = generate(model, prompt, max_tokens=max_tokens, temperature=0, chat=chat,
                     draft=None if draft else False, force_draft=True)
    if draft and not (g.draft or {}).get("drafting"):
        raise PairingError("spec-calibrate: the drafted run did not draft ("
                           f"{(g.draft or {}).get('refused')}); nothing to measure")
    return g


def calibrate(target: str, draft_head: str | None = None, *, max_tokens: int = 64,
              reps: int = 3, n_threads: int | None = None, min_speedup: float = 1.0,
              log=None, dflash: str | None = None, backend: str = "cpu") -> dict:
    from ..gpu_backend import load

    report = classify(target, draft_head, force=True, dflash=dflash)  # structure first
    model = load(target, n_threads=n_threads, draft_head=draft_head, dflash=dflash,
                 backend=backend)
    try:
        has_template = model.tokenizer.chat_template is not None
        per_prompt = {}
        for name, text in PROMPTS.items():
            chat = name == "chat" and has_template
            serial_tps, spec_tps, exact, acc, tpr = [], [], True, [], []
            for rep in range(reps + 1):
                order = (False, True) if rep % 2 == 0 else (True, False)
                outs = {}
                for draft in order:
                    g = _run(model, text, max_tokens, draft, chat)
                    outs[draft] = g
                    if rep:
                        (spec_tps if draft else serial_tps).append(g.generation_tps)
                d = outs[True].draft
                exact &= outs[True].tokens == outs[False].tokens
                if rep:
                    acc.append(d["accepted"] / d["drafted"] if d.get("drafted") else 0.0)
                    tpr.append(d.get("mean_accepted_length", 0.0))
            med = statistics.median
            per_prompt[name] = {
                "identical": exact, "acceptance": med(acc), "tokens_per_draft_round": med(tpr),
                "serial_tps": [min(serial_tps), med(serial_tps), max(serial_tps)],
                "draft_tps": [min(spec_tps), med(spec_tps), max(spec_tps)],
                "speedup": med(spec_tps) / med(serial_tps) if med(serial_tps) else 0.0}
            if log is not None:
                p = per_prompt[name]
                log(f"{name:6s} identical={exact} acceptance={p['acceptance']:.3f} "
                    f"serial {p['serial_tps'][1]:.1f} tok/s, drafted {p['draft_tps'][1]:.1f} "
                    f"tok/s (x{p['speedup']:.2f})")
    finally:
        model.close()
    identical = all(p["identical"] for p in per_prompt.values())
    speedup = statistics.median(p["speedup"] for p in per_prompt.values())
    good = identical and speedup >= min_speedup
    return {
        "target": report.target.id, "draft": report.draft.id,
        "verdict": ALLOW_MEASURED_GOOD if good else REFUSE_MEASURED_BAD,
        "draft_kind": report.draft.kind,
        "evidence": {"identical": identical, "median_speedup": speedup,
                     "prompts": per_prompt, "max_tokens": max_tokens, "reps": reps,
                     "threads": n_threads},
        "backend": backend,  # where it was measured: the verdict holds there only
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()} {platform.processor() or platform.system()}, "
                   f"{os.cpu_count()} CPUs",
    }


def add_entry(path: str, entry: dict) -> None:
    """Add ``entry`` to the pairs file ``path`` (created if missing; an
    entry for the same pair and backend is replaced), atomically."""
    doc = {"version": 1, "pairs": []}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        if not isinstance(doc, dict) or not isinstance(doc.get("pairs"), list):
            raise ValueError(f"{path}: not a pairs file (an object with a 'pairs' list)")
    key = (entry["target"], entry["draft"], entry_backend(entry))
    doc["pairs"] = [p for p in doc["pairs"]
                    if (p.get("target"), p.get("draft"), entry_backend(p)) != key]
    doc["pairs"].append(entry)
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".pairs-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
