"""``python -m gguf_tools compare A B --text FILE``: how far B's predictions are from A's.

Both files run the same tokens (A's tokenizer encodes the text; B must have
the same vocabulary: ``tokenizer.ggml.tokens`` equal and B's encoding of the
text equal to A's, else the run stops with exit 2), teacher-forced.

Windows: the token sequence t[0..N) is cut into windows of at most ``--ctx``
tokens that overlap by one token, window w = t[w*(ctx-1) : w*(ctx-1)+ctx].
Each window runs in a fresh session of each model (so no position is ever
beyond ctx), and row i of a window predicts the window's token i+1. With the
one-token overlap every token t[1..N) is predicted exactly once, by a prefix
of at most ctx-1 tokens of its own window (the first token of a window has
less context than it would in one long session; that is the price of a
bounded context). Only one window's logits of each model are held at a time.

Reported over all N-1 predicted positions (float64):
  - kl: mean KL(A || B) = sum_v p_A(v) (log p_A(v) - log p_B(v)), the
    log-softmaxes computed as x - max(x) - log(sum(exp(x - max(x))));
  - top1: fraction of positions where argmax A == argmax B (ties: numpy's
    first index);
  - ppl_a / ppl_b: exp(mean NLL of the actual next token) under each file.
"""

from __future__ import annotations

import json
import math
import os
from typing import TextIO

import numpy as np

__all__ = ["CompareError", "windows", "log_softmax", "compare", "cmd_compare"]


ROWS = 16   # rows per float64 chunk: 16 x vocab x 8 bytes x a few arrays


class CompareError(ValueError):
    pass


def windows(n_tokens: int, ctx: int) -> list[tuple[int, int]]:
    """[start, end) of each window (module docstring): overlap of one token."""
    if ctx < 2:
        raise CompareError(f"--ctx must be >= 2 (a window predicts its tokens 1..), got {ctx}")
    out = []
    start = 0
    while start < n_tokens - 1:
        end = min(start + ctx, n_tokens)
        out.append((start, end))
        start = end - 1
    return out


def log_softmax(x: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64, shifted by the row max (stable)."""
    x = np.asarray(x, dtype=np.float64)
    s = x - x.max(axis=-1, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=-1, keepdims=True))


def _tokens_meta(path: str):
    from ds4py import gguf
    with gguf.open(path) as f:
        return f.metadata.get("tokenizer.ggml.tokens")


def compare(a_path: str, b_path: str, text: str, ctx: int = 512, threads: int | None = None,
            precision: str = "fast") -> dict:
    """Compare two GGUF files on ``text``; returns the report as a dict."""
    import ds4py

    ta, tb = _tokens_meta(a_path), _tokens_meta(b_path)
    if ta is None or tb is None:
        raise CompareError("both files need a tokenizer (tokenizer.ggml.tokens): "
                           f"{a_path if ta is None else b_path} has none")
    if list(ta) != list(tb):
        diff = next((i for i, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y),
                    min(len(ta), len(tb)))
        raise CompareError(f"the files have different vocabularies (tokenizer.ggml.tokens: "
                           f"{len(ta)} vs {len(tb)} tokens, first difference at id {diff}); "
                           "compare needs the same tokens in both")
    wins_n = 0
    with ds4py.load(a_path, n_threads=threads, n_ctx=ctx, precision=precision) as ma, \
            ds4py.load(b_path, n_threads=threads, n_ctx=ctx, precision=precision) as mb:
        ids = ma.tokenizer.encode(text)
        if mb.tokenizer.encode(text) != ids:
            raise CompareError("B's tokenizer encodes the text differently from A's; "
                               "compare needs the same token ids for both")
        if len(ids) < 2:
            raise CompareError(f"the text is {len(ids)} token(s); at least 2 are needed")
        if ma.config.vocab_size != mb.config.vocab_size:
            raise CompareError(f"vocab sizes differ: {ma.config.vocab_size} vs "
                               f"{mb.config.vocab_size}")
        kl_sum = nll_a = nll_b = 0.0
        agree = n = 0
        for s, e in windows(len(ids), ctx):
            win = ids[s:e]
            target = np.asarray(win[1:], dtype=np.int64)
            # each session's float32 view stays valid until that session's next
            # eval; the float64 work goes ROWS rows at a time to bound memory
            with ma.new_session() as sa, mb.new_session() as sb:
                xa = sa.eval(win[:-1], all_logits=True)
                xb = sb.eval(win[:-1], all_logits=True)
                for r0 in range(0, len(target), ROWS):
                    la = log_softmax(xa[r0:r0 + ROWS])
                    lb = log_softmax(xb[r0:r0 + ROWS])
                    tg = target[r0:r0 + ROWS]
                    kl_sum += float((np.exp(la) * (la - lb)).sum())
                    agree += int((la.argmax(axis=-1) == lb.argmax(axis=-1)).sum())
                    rows = np.arange(len(tg))
                    nll_a -= float(la[rows, tg].sum())
                    nll_b -= float(lb[rows, tg].sum())
            n += len(target)
            wins_n += 1
    return {"a": a_path, "b": b_path, "tokens": len(ids), "positions": n, "windows": wins_n,
            "ctx": ctx, "precision": precision, "kl": kl_sum / n, "top1": agree / n,
            "ppl_a": math.exp(nll_a / n), "ppl_b": math.exp(nll_b / n)}


def cmd_compare(args, out: TextIO, err: TextIO) -> int:
    if not os.path.isfile(args.text):
        raise CompareError(f"--text {args.text}: no such file")
    with open(args.text, encoding="utf-8") as fh:
        text = fh.read()
    if args.threads is not None and args.threads < 1:
        raise CompareError(f"--threads must be >= 1, got {args.threads}")
    r = compare(args.a, args.b, text, args.ctx, args.threads, args.precision)
    if args.json:
        out.write(json.dumps(r) + "\n")
        return 0
    out.write(f"A: {r['a']}\nB: {r['b']}\n"
              f"{r['tokens']} tokens, {r['positions']} predicted positions, "
              f"{r['windows']} window(s) of <= {r['ctx']} tokens, precision {r['precision']}\n")
    out.write(f"  {'KL(A||B) mean':<16} {r['kl']:.6g}\n"
              f"  {'top-1 agreement':<16} {r['top1']:.4f}\n"
              f"  {'perplexity A':<16} {r['ppl_a']:.4f}\n"
              f"  {'perplexity B':<16} {r['ppl_b']:.4f}\n")
    return 0
