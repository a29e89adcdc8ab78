"""The staged F16 attention recipe against its position-by-position definition.

Fast precision's attention (csrc/forward/attention.c) runs llama.cpp's F16
one-chunk recipe in three passes per 256-position block (scores, softmax
scalars, V accumulation; an AVX-512 V step when the session runs that kernel
set). DS4_ATTN_REFERENCE=1 runs the recipe as written, one position at a
time, head by head: the oracle. The staged passes must give the same bits,
so every comparison here is exact (no tolerance): on prefill rows (the rows
path, several blocks per row), on decode rows past one block (split-K), and
under DS4_FORCE_SCALAR=1 (the portable V step over the scalar kernel set).

Five models, covering the AVX-512 kernels' branches: the golden dense Q8_0
file (head 16, GQA group 2) and two generated ones: head 40 with a GQA group
of 3 (the two-head and one-head V passes, a masked 8-lane tail) and head 72
with a group of 8 (two four-head passes of scores and V step, a 64-value dot
step, then a masked tail); then the 0.8B bench shape's attention (head 256,
group 4: whole 64-value steps) and a group of 17 with head 64 (more heads
than the AVX-512 softmax's 16 lanes). tests/test_attention_kernels.py checks
the kernels one by one on inputs no model here produces (NaN scores, F16
subnormals and overflow, ...).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import bench_models as BM  # noqa: E402

GOLDEN = os.path.join(HERE, "golden", "models", "dense-q8_0.gguf")
# head_dim 40, 12 query heads over 4 kv heads; attn_output's input 12*40 = 480
# is whole Q8_0 blocks.
ODD = BM.Shape("qwen35", 4, 256, 12, 4, 40, 2, 4, 64, n_ff=512, n_vocab=1024, n_rot=16)
# head_dim 72, 8 query heads over 1 kv head (8 * 72 = 576: whole Q8_0 blocks).
WIDE = BM.Shape("qwen35", 4, 256, 8, 1, 72, 2, 4, 64, n_ff=512, n_vocab=1024, n_rot=16)
# The 0.8B bench shape's attention (head 256, 8 query heads over 2 kv heads):
# four whole 64-value dot steps, no tail, the four-head V pass.
DEEP = BM.Shape("qwen35", 4, 256, 8, 2, 256, 2, 4, 64, n_ff=512, n_vocab=1024, n_rot=64)
# 17 query heads over 1 kv head, head 64: more heads than the AVX-512
# softmax's 16 lanes, five score passes sharing one widened K row.
MANY = BM.Shape("qwen35", 4, 256, 17, 1, 64, 2, 4, 64, n_ff=512, n_vocab=1024, n_rot=16)

# Prefill 300 rows in one eval (rows path; rows past 256 see two blocks),
# 40 decode steps (split-K), then 200 more rows in one eval: logits of every
# row, and the same sequence token by token must give the same rows (batch
# invariance across the rows and split-K paths of the staged recipe).
_RUN = r"""
import hashlib, sys
import numpy as np
import ds4py
path, threads = sys.argv[1], int(sys.argv[2])
with ds4py.Model.load(path, n_threads=threads, n_ctx=640, precision="fast") as m:
    V = m.config.vocab_size
    toks = [(i * 7919 + 104729) % (V - 16) + 8 for i in range(540)]
    with m.new_session() as s:
        rows = [np.array(s.eval(toks[:300], all_logits=True))]
        rows += [np.array(s.eval([t]))[None] for t in toks[300:340]]
        rows.append(np.array(s.eval(toks[340:], all_logits=True)))
    batched = np.concatenate(rows)
    with m.new_session() as s:  # rows 250.. token by token
        s.eval(toks[:250])
        serial = np.concatenate([np.array(s.eval([t]))[None] for t in toks[250:]])
    assert batched.shape == (540, V), batched.shape
    assert np.isfinite(batched).all()
    same = np.array_equal(batched[250:].view(np.uint32), serial.view(np.uint32))
    print(hashlib.sha256(batched.tobytes()).hexdigest(), int(same))
"""


@pytest.fixture(scope="module")
def odd_model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("attn") / "odd-q8_0.gguf")
    BM.write_model(ODD, "Q8_0", path, seed=11)  # fixed weights: a fixed check
    return path


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("attn") / "wide-q8_0.gguf")
    BM.write_model(WIDE, "Q8_0", path, seed=12)  # fixed weights: a fixed check
    return path


@pytest.fixture(scope="module")
def deep_model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("attn") / "deep-q8_0.gguf")
    BM.write_model(DEEP, "Q8_0", path, seed=13)  # fixed weights: a fixed check
    return path


@pytest.fixture(scope="module")
def many_model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("attn") / "many-q8_0.gguf")
    BM.write_model(MANY, "Q8_0", path, seed=14)  # fixed weights: a fixed check
    return path


def _run(path: str, threads: int, reference: bool, scalar: bool) -> tuple[str, int]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("DS4_FORCE_SCALAR", "DS4_ATTN_REFERENCE", "DS4PY_PATHS")}
    if reference:
        env["DS4_ATTN_REFERENCE"] = "1"
    if scalar:
        env["DS4_FORCE_SCALAR"] = "1"
    r = subprocess.run([sys.executable, "-c", _RUN, path, str(threads)], env=env,
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    digest, same = r.stdout.split()
    return digest, int(same)


@pytest.mark.parametrize("scalar", [False, True], ids=["auto-isa", "scalar"])
@pytest.mark.parametrize("which", ["golden", "odd", "wide"])
def test_staged_equals_reference(which, scalar, odd_model, wide_model):
    assert os.path.exists(GOLDEN), "the golden dense-q8_0 model is missing"
    path = {"golden": GOLDEN, "odd": odd_model, "wide": wide_model}[which]
    staged, same = _run(path, 2, reference=False, scalar=scalar)
    ref, ref_same = _run(path, 2, reference=True, scalar=scalar)
    assert same == 1, "staged: token-by-token rows differ from batched rows"
    assert ref_same == 1, "reference: token-by-token rows differ from batched rows"
    assert staged == ref, "the staged F16 recipe differs from the position-by-position one"


@pytest.mark.parametrize("which", ["deep", "many"])
def test_staged_equals_reference_bench_shapes(which, deep_model, many_model):
    """The session's own kernel set (AVX-512 here) on head dims with whole
    64-value dot steps and on a GQA group wider than 16 heads."""
    path = {"deep": deep_model, "many": many_model}[which]
    staged, same = _run(path, 2, reference=False, scalar=False)
    ref, ref_same = _run(path, 2, reference=True, scalar=False)
    assert same == 1 and ref_same == 1, "token-by-token rows differ from batched rows"
    assert staged == ref, "the staged F16 recipe differs from the position-by-position one"


def test_staged_thread_counts(odd_model):
    """Split-K items are (kv head, block): any thread count, same bits."""
    one = _run(odd_model, 1, reference=False, scalar=False)
    three = _run(odd_model, 3, reference=False, scalar=False)
    assert one == three


_PATHS = r"""
import sys
import ds4py
with ds4py.Model.load(sys.argv[1], n_threads=2, n_ctx=512, precision="fast") as m:
    with m.new_session() as s:
        s.eval(list(range(300)))
        s.eval([5])
"""


@pytest.mark.parametrize("mode", ["auto", "scalar", "reference"])
def test_paths_name_the_attention_variant(mode, odd_model):
    """DS4PY_PATHS names the recipe and V step that ran, so a gate that
    silently falls back shows."""
    from ds4py import _core
    env = {k: v for k, v in os.environ.items()
           if k not in ("DS4_FORCE_SCALAR", "DS4_ATTN_REFERENCE")}
    env["DS4PY_PATHS"] = "1"
    if mode == "scalar":
        env["DS4_FORCE_SCALAR"] = "1"
    if mode == "reference":
        env["DS4_ATTN_REFERENCE"] = "1"
    r = subprocess.run([sys.executable, "-c", _PATHS, odd_model], env=env,
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    attn = [ln for ln in r.stderr.splitlines() if "attention" in ln]
    assert any("split-K decode" in ln for ln in attn), attn
    assert any("rows, " in ln for ln in attn), attn
    if mode == "reference":
        want = "reference loop"
    elif mode == "scalar" or not (_core.lib.ds4_isa_available() & (1 << _core.lib.DS4_ISA_AVX2)):
        want = "staged, scores+V step portable"
    elif not (_core.lib.ds4_isa_available() & (1 << _core.lib.DS4_ISA_AVX512)):
        want = "staged, scores+V step avx2"  # an AVX2-only machine (attn_avx2.c)
    else:
        want = "staged, scores+V step avx512"
    assert all(want in ln for ln in attn), attn
