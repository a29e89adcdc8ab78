"""gguf_tools compare, and requantize killed mid-write.

References, independent of the code under test: the logits come from
ds4py sessions (session.eval(all_logits=True)) run here window by window;
KL, argmax and NLL are recomputed here with np.logaddexp.reduce (not the
max-shift log-softmax compare.py uses) and the windows are re-derived here.
"""

from __future__ import annotations

import io
import json
import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import ds4py
from ds4py import gguf
from ds4py.gguf_writer import GGUFWriter
from gguf_tools import main

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODELS = os.path.join(HERE, "golden", "models")

TEXT = (
    "The model reads the tensor file and returns the logits for every token. A quantized\n"
    "weight is stored in blocks, and each block has a scale. When the context grows, the\n"
    "cache keeps the keys and values of earlier tokens so that the next step is cheap.\n"
    "Python calls the core through a small layer; the core never prints or exits.\n")
CTX = 64   # several windows for this text (about 160 tokens with the golden vocabulary)


def model(name: str) -> str:
    return os.path.join(MODELS, name + ".gguf")


def run(argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = main(argv, out, err)
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture
def text_file(tmp_path):
    p = tmp_path / "text.txt"
    p.write_text(TEXT, encoding="utf-8")
    return str(p)


def reference(a: str, b: str, ctx: int) -> dict:
    """KL(A||B), top-1, perplexities from the sessions' logits, computed here."""
    with ds4py.load(a, n_threads=1, n_ctx=ctx) as ma, ds4py.load(b, n_threads=1, n_ctx=ctx) as mb:
        ids = ma.tokenizer.encode(TEXT)
        kl, agree, nll_a, nll_b, n = [], 0, 0.0, 0.0, 0
        start = 0
        while start < len(ids) - 1:    # windows of ctx tokens, one token of overlap
            win = ids[start:start + ctx]
            with ma.new_session() as sa, mb.new_session() as sb:
                xa = np.array(sa.eval(win[:-1], all_logits=True), dtype=np.float64)
                xb = np.array(sb.eval(win[:-1], all_logits=True), dtype=np.float64)
            for i in range(len(win) - 1):
                lpa = xa[i] - np.logaddexp.reduce(xa[i])
                lpb = xb[i] - np.logaddexp.reduce(xb[i])
                kl.append(float(np.sum(np.exp(lpa) * (lpa - lpb))))
                agree += int(np.argmax(xa[i]) == np.argmax(xb[i]))
                nll_a -= lpa[win[i + 1]]
                nll_b -= lpb[win[i + 1]]
                n += 1
            start += ctx - 1
    assert n == len(ids) - 1
    return {"kl": float(np.mean(kl)), "top1": agree / n, "ppl_a": math.exp(nll_a / n),
            "ppl_b": math.exp(nll_b / n), "positions": n, "tokens": len(ids)}


def test_self_compare_is_zero(text_file):
    rc, out, err = run(["compare", model("dense-q8_0"), model("dense-q8_0"), "--text", text_file,
                        "--ctx", str(CTX), "--threads", "1", "--json"])
    assert rc == 0, err
    r = json.loads(out)
    # same file, same windows, deterministic core: the logits are bit-identical,
    # so every KL term is exactly 0 and the perplexities are the same float
    assert r["kl"] == 0.0 and r["top1"] == 1.0 and r["ppl_a"] == r["ppl_b"]
    assert r["windows"] > 1 and r["positions"] == r["tokens"] - 1


@pytest.mark.parametrize("precision", ["fast", "exact"])
def test_f32_vs_q8_0_matches_numpy(text_file, precision):
    a, b = model("dense-f32"), model("dense-q8_0")
    rc, out, err = run(["compare", a, b, "--text", text_file, "--ctx", str(CTX),
                        "--threads", "1", "--precision", precision, "--json"])
    assert rc == 0, err
    r = json.loads(out)
    if precision == "fast":
        ref = reference(a, b, CTX)   # reference() loads with the default, "fast"
        assert (r["positions"], r["tokens"]) == (ref["positions"], ref["tokens"])
        # same float32 logits, two float64 formulas (max-shift vs logaddexp,
        # different summation order): agreement to ~1e-12 relative; 1e-9 is slack
        for k in ("kl", "ppl_a", "ppl_b"):
            assert r[k] == pytest.approx(ref[k], rel=1e-9, abs=1e-12), k
        assert r["top1"] == ref["top1"]
    # Q8_0 weights on a random golden model: measured KL 0.0186 and top-1 0.95
    # (ctx 64, fast); the bounds say "different but close" with margin
    assert 0 < r["kl"] < 0.2
    assert r["top1"] >= 0.8
    assert r["ppl_a"] != r["ppl_b"]


def test_text_table(text_file):
    rc, out, err = run(["compare", model("dense-f32"), model("dense-q8_0"), "--text", text_file,
                        "--ctx", str(CTX), "--threads", "1"])
    assert rc == 0, err
    for label in ("KL(A||B) mean", "top-1 agreement", "perplexity A", "perplexity B"):
        assert label in out


def _copy_with(src: str, dst: str, change) -> None:
    """Copy a GGUF, metadata passed through change(key, value) -> value."""
    with gguf.open(src) as f, GGUFWriter(dst, alignment=f.alignment) as w:
        for k, v in f.metadata.items():
            ty = f.metadata_types[k]
            w.add_metadata(k, change(k, v), ty[0], ty[1] if len(ty) > 1 else None)
        for t in f.tensors.values():
            w.add_tensor_info(t.name, t.shape, t.type_name)
        for t in f.tensors.values():
            w.write_tensor_data(t.name, f.raw(t.name))


def test_different_vocab_refused(text_file, tmp_path):
    other = str(tmp_path / "other-vocab.gguf")

    def change(k, v):
        if k == "tokenizer.ggml.tokens":
            v = list(v)
            v[-1] = "zz-not-in-the-golden-vocab"
        return v
    _copy_with(model("dense-f32"), other, change)
    rc, out, err = run(["compare", model("dense-f32"), other, "--text", text_file])
    assert rc == 2 and out == ""
    assert "different vocabularies" in err and f"first difference at id {511}" in err


def test_different_encoding_refused(text_file, tmp_path):
    # same tokens, no merges: B's BPE encodes the text into other (more) ids
    other = str(tmp_path / "no-merges.gguf")
    _copy_with(model("dense-f32"), other,
               lambda k, v: v[:1] if k == "tokenizer.ggml.merges" else v)
    rc, _, err = run(["compare", model("dense-f32"), other, "--text", text_file])
    assert rc == 2
    assert "encodes the text differently" in err


def test_missing_text_and_bad_ctx(tmp_path, text_file):
    rc, _, err = run(["compare", model("dense-f32"), model("dense-f32"),
                      "--text", str(tmp_path / "nope.txt")])
    assert rc == 2 and "no such file" in err
    rc, _, err = run(["compare", model("dense-f32"), model("dense-f32"), "--text", text_file,
                      "--ctx", "1"])
    assert rc == 2 and "--ctx" in err


# ------------------------------------------- requantize killed mid-write

def _temps(d, name):
    return sorted(n for n in os.listdir(d) if n.startswith("." + name + ".") and n.endswith(".tmp"))


def test_requantize_sigkill_leaves_no_dst_and_next_run_cleans(tmp_path):
    dst = tmp_path / "out.gguf"
    unrelated = tmp_path / ".other.gguf.abcdefgh.tmp"   # another DST's temp: kept
    unrelated.write_bytes(b"x")
    env = dict(os.environ, DS4_GGUF_TOOLS_TEST_DELAY_AFTER_TENSOR="3")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.Popen([sys.executable, "-m", "gguf_tools", "requantize", model("dense-f32"),
                          str(dst), "--type", "Q8_0", "--threads", "1"],
                         cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        # wait until the hook reports tensor 3 written (the run then stalls)
        for line in p.stderr:
            if b"test hook: sleeping after tensor 3" in line:
                break
        else:
            pytest.fail(f"requantize ended before the hook (rc {p.wait()})")
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stderr.close()
    assert p.returncode == -signal.SIGKILL
    assert not dst.exists()
    stale = _temps(tmp_path, "out.gguf")
    if GGUFWriter(tmp_path / "probe.gguf").anonymous:
        # Linux O_TMPFILE: the partial file never had a name; nothing is left.
        assert stale == []
    else:
        assert len(stale) == 1  # a SIGKILLed process cannot remove a named temp
    time.sleep(0.05)           # a stale temp's mtime is strictly before the next run
    rc, _, err = run(["requantize", model("dense-f32"), str(dst), "--type", "Q8_0"])
    assert rc == 0, err
    assert _temps(tmp_path, "out.gguf") == []
    assert unrelated.exists()
    with open(dst, "rb") as a, open(model("dense-q8_0"), "rb") as b:
        assert a.read() == b.read()   # measured: byte-identical to llama.cpp's (test_gguf_tools)
