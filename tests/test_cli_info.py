"""`python -m ds4py info [PATH]`: exit codes, the summary, the self-check."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import numpy as np
import pytest

from ds4py import demo, quants
from ds4py.errors import QuantError
from ds4py.gguf_writer import GGUFWriter, ValueType

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "ds4py", *args], capture_output=True,
                          text=True, cwd=REPO, env=env, timeout=120)


def test_self_check_exits_0():
    r = run_cli("info")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.rstrip().splitlines()[-1].startswith("OK: 6 tensors")
    for t in ("F32", "F16", "BF16", "Q8_0", "Q4_64A (ds4-only)", "Q2_64A (ds4-only)"):
        assert any(t in line and line.rstrip().endswith(" ok") for line in r.stdout.splitlines()
                   if line.strip().startswith("demo.")), t
    assert "kernel ISA: " in r.stdout
    assert r.stderr == ""


def test_scalar_isa_is_reported():
    r = run_cli("info", env={**os.environ, "DS4_FORCE_SCALAR": "1"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "kernel ISA: scalar" in r.stdout


def test_summary_of_a_file(tmp_path):
    p = tmp_path / "m.gguf"
    with GGUFWriter(p, alignment=64) as w:
        w.add_metadata("general.architecture", "qwen35")
        w.add_metadata("general.description", "x" * 500)
        w.add_metadata("tokenizer.ggml.tokens", [f"tok{i}" for i in range(1000)])
        w.add_metadata("qwen35.block_count", 24, ValueType.UINT32)
        w.add_tensor_info("blk.0.ffn_up.weight", (128, 2), "Q4_64A")
        w.add_tensor_info("output_norm.weight", (64,), "F32")
        w.write_tensor_data("blk.0.ffn_up.weight", bytes(144))
        w.write_tensor_data("output_norm.weight", np.ones(64, np.float32))
    r = run_cli("info", str(p))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "GGUF v3" in out and "alignment 64" in out
    lines = out.splitlines()
    tok = next(line for line in lines if "tokenizer.ggml.tokens" in line)
    assert "ARRAY[STRING]" in tok and "(1000 items)" in tok and "tok999" not in tok
    desc = next(line for line in lines if "general.description" in line)
    assert len(desc) < 120 and desc.endswith("...")
    assert any("qwen35.block_count" in line and "UINT32" in line and line.endswith(" 24")
               for line in lines)
    up = next(line for line in lines if line.strip().startswith("blk.0.ffn_up.weight"))
    assert up.split()[1:5] == ["Q4_64A", "(ds4-only)", "128x2", "144"]
    norm = next(line for line in lines if line.strip().startswith("output_norm.weight"))
    assert norm.split()[1:3] == ["F32", "64"]


@pytest.mark.parametrize("content", [
    b"garbage that is not gguf",
    b"GGUF" + (3).to_bytes(4, "little") + (5).to_bytes(8, "little"),  # cut in the header
    b"",
])
def test_malformed_file_exits_2_with_message(tmp_path, content):
    p = tmp_path / "bad.gguf"
    p.write_bytes(content)
    r = run_cli("info", str(p))
    assert r.returncode == 2
    assert r.stderr.startswith("error: ") and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_missing_file_exits_2(tmp_path):
    r = run_cli("info", str(tmp_path / "nope.gguf"))
    assert r.returncode == 2
    assert r.stderr.startswith("error: ") and "nope.gguf" in r.stderr


def test_help():
    r = run_cli("info", "--help")
    assert r.returncode == 0 and "PATH" in r.stdout
    r = run_cli()
    assert r.returncode == 2 and "COMMAND" in r.stderr


# In-process: the self-check must be able to fail, and fall back cleanly.

def test_self_check_reports_mismatch(monkeypatch):
    # A zero bound makes every lossy type fail; F32 is exact and still passes.
    monkeypatch.setattr(demo, "error_bound", lambda t, x: np.zeros(x.shape))
    out = io.StringIO()
    assert demo.self_check(out) == 1
    text = out.getvalue()
    assert "FAILED: 5 of 6" in text and text.count("MISMATCH") == 5


def test_self_check_falls_back_when_a_type_cannot_be_quantized(monkeypatch):
    real = quants.quantize

    def quantize(t, x, isa="auto"):
        if t == "Q2_64A":
            raise QuantError("quantizing to Q2_64A is not supported")
        return real(t, x, isa)

    monkeypatch.setattr(quants, "quantize", quantize)
    out = io.StringIO()
    assert demo.self_check(out) == 0
    text = out.getvalue()
    assert "note: Q2_64A: not quantizable here" in text and "stored as F16" in text
    assert "Q2_64A (ds4-only)" not in text


def test_error_bounds_are_not_vacuous():
    # The bounds must be tight enough to notice a quantizer off by one code
    # step: for 4-bit codes on [-1, 1] one step is 2/15.
    x = np.linspace(-1, 1, 256, dtype=np.float32).reshape(1, 256)
    assert demo.error_bound("Q4_64A", x).max() < 2 / 15
    assert demo.error_bound("Q8_0", x).max() < 1 / 127
    assert demo.error_bound("F32", x).max() == 0
