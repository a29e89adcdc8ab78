"""A Q4_64A model on the GPU layer loop (gpu/host/runner.c + the Q4_64A matvec,
gpu/kernels/quant_q4_64a.h), through ``ds4py.load(..., backend="gpu-emul")``:
the plugin and the kernels a CUDA build runs, as plain C under the emulator.

The model is the golden dense model (2 attention + 3 GDN layers, E 256)
requantized by gguf_tools to Q4_64A (every matrix; n_in 64 or 256, so all
are multiples of 64), so each layer's projections, the FFN and the LM head
run the Q4_64A kernels: 20 prompt rows take the prefill GEMM (gemm_q4_64a,
bit for bit the width-1 matvec's values), decoding the width-1 matvec.

Tolerances (against the CPU backend on the same file): the GPU is not
bit-identical to the CPU by design (docs/gpu.md §7: its attention
accumulates V in float where the CPU's fast path keeps an F16 accumulator,
and 1-ulp differences flip Q8_0 activation roundings; the Q4_64A matvec
itself adds the same block terms in another order, within ~(2.25 nb + 10)
float ulps of the row's absolute terms, docs/gpu.md §4). The bounds are
tests/test_gpu_model.py's (max |logit difference| 1.0, mean KL 0.01),
about 2x what the Q8_0 golden model shows there. Within the GPU backend
everything is compared bit for bit: prefill (one eval of 20 rows) equals
decode (20 one-row evals), so batch invariance holds on this path too.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

import ds4py
from ds4py import gguf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, "tests", "golden")
DENSE_BF16 = os.path.join(GOLDEN, "models", "dense-bf16.gguf")
MOE_BF16 = os.path.join(GOLDEN, "models", "moe-bf16.gguf")
TOKENS = [int(t) for t in np.load(os.path.join(GOLDEN, "logits", "sequences.npz"))["s100"][:20]]

MAX_ABS_VS_CPU = 1.0   # every logit vs the CPU fast path (reason above)
MEAN_KL_VS_CPU = 0.01


def requantize(src, dst, *args):
    r = subprocess.run([sys.executable, "-m", "gguf_tools", "requantize", *args, src, dst],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    return dst


@pytest.fixture(scope="module")
def q4a_path(tmp_path_factory):
    path = requantize(DENSE_BF16, str(tmp_path_factory.mktemp("q4a") / "dense-q4_64a.gguf"),
                      "--type", "Q4_64A")
    # the test is only meaningful if the matrices really are Q4_64A
    with gguf.open(path) as f:
        types = {name: t.type_name for name, t in f.tensors.items()}
    mats = [n for n in types if n.startswith("blk.") and n.endswith(".weight")
            and any(k in n for k in ("attn_qkv", "attn_gate", "ssm_out", "attn_q.", "attn_k.",
                                     "attn_v.", "attn_output", "ffn_gate", "ffn_up", "ffn_down"))]
    assert len(mats) >= 5 * 3, mats
    assert all(types[n] == "Q4_64A" for n in mats), {n: types[n] for n in mats}
    return path


@pytest.fixture(scope="module")
def gpu(q4a_path):
    m = ds4py.load(q4a_path, backend="gpu-emul")
    yield m
    m.close()


@pytest.fixture(scope="module")
def prefill(gpu):
    """One eval of all 20 rows: the prefill GEMM (more than 16 rows)."""
    with gpu.new_session() as s:
        return np.array(s.eval(TOKENS, all_logits=True))


def log_softmax(x):
    x = x.astype(np.float64)
    x = x - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def test_logits_match_the_cpu_backend(q4a_path, prefill):
    cpu = ds4py.load(q4a_path, n_threads=2)
    try:
        with cpu.new_session() as s:
            ref = np.array(s.eval(TOKENS, all_logits=True))
    finally:
        cpu.close()
    assert prefill.shape == ref.shape and np.isfinite(prefill).all()
    diff = np.abs(prefill - ref).max()
    assert diff <= MAX_ABS_VS_CPU, np.abs(prefill - ref).max(axis=1)
    p, q = log_softmax(ref), log_softmax(prefill)
    kl = (np.exp(p) * (p - q)).sum(axis=1)
    assert kl.mean() <= MEAN_KL_VS_CPU, kl
    # not a vacuous comparison: the logits spread over several units
    assert np.ptp(ref, axis=1).min() > 1.0


def test_prefill_equals_decode_bit_for_bit(gpu, prefill):
    """20 one-row evals (the width-1 matvec) give the bits of the 20-row
    eval (the GEMM): batch invariance on the Q4_64A path."""
    rows = []
    with gpu.new_session() as s:
        for t in TOKENS:
            rows.append(np.array(s.eval([t])))
    np.testing.assert_array_equal(np.stack(rows).view(np.uint32), prefill.view(np.uint32))


def test_q4_64a_experts_are_refused_by_name(tmp_path):
    """The MoE kernels have no Q4_64A dot: a routed expert tensor in Q4_64A
    is refused at load, naming it (fail closed), not run wrongly."""
    path = requantize(MOE_BF16, str(tmp_path / "moe-q4a-gate.gguf"), "--type", "Q8_0",
                      "--tensor-type", r"ffn_gate_exps=Q4_64A")
    with pytest.raises(ds4py.ModelError) as e:
        ds4py.load(path, backend="gpu-emul")
    msg = str(e.value)
    assert "ffn_gate_exps" in msg and "Q4_64A" in msg and "has no GPU kernel" in msg, msg
