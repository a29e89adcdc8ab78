"""The forward pass in precision="exact" against transformers.

Reference: tests/golden/logits/{dense,moe}-hf-{f32,bf16}.npz, recorded by
tests/reference/make_golden.py from transformers' own Qwen3.5 modules in
float32 (the hf-bf16 files from the same modules with exactly the weights
the BF16 GGUF stores as BF16 rounded to bfloat16, so they are the exact
float32 function of what that file holds). See tests/golden/README.md.

Exact mode promises transformers' float32 function up to float32 rounding
differences (summation order, a different but equivalent chunked delta-rule
algorithm in transformers, libm vs torch's exp/cos). Tolerance, per row:
max |Δlogit| <= 5e-4 x (logit range of the reference row). For scale: the
bugs transformers-side simulations show (README "How discriminating") move
logits by 10-35, a 0.05% weight perturbation by 0.04-0.17, while the golden
rows' range is ~20-45, i.e. a tolerance of ~0.01-0.02; llama.cpp itself
(F16 KV, different algorithms) sits at ~0.003-0.007 on the F32 files.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import ds4py

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "golden", "models")
LOGITS = os.path.join(HERE, "golden", "logits")

REL_TOL = 5e-4  # x logit range; see the module docstring
CASES = [("dense-f32", "dense-hf-f32"), ("moe-f32", "moe-hf-f32"),
         ("dense-bf16", "dense-hf-bf16"), ("moe-bf16", "moe-hf-bf16")]
SEQS = ["s16", "s100", "s700"]

_cache: dict = {}


def ref(name: str):
    if name not in _cache:
        _cache[name] = dict(np.load(os.path.join(LOGITS, name + ".npz")))
    return _cache[name]


def sequences():
    return ref("sequences")


def run_exact(model_name: str, tokens, n_threads: int = 2) -> np.ndarray:
    with ds4py.load(os.path.join(MODELS, model_name + ".gguf"), precision="exact",
                    n_threads=n_threads) as m, m.new_session() as s:
        return np.array(s.eval(tokens, all_logits=True))


def check_rows(ours: np.ndarray, r: dict, rec: str):
    """Compare rows `ours` (one per record row) with record `rec` of r."""
    # 1. Rows stored in full: every logit, tolerance from the row's own range.
    rows, full = r[f"{rec}_full_rows"], r[f"{rec}_full"]
    for i, row in enumerate(rows):
        rng = float(full[i].max() - full[i].min())
        err = float(np.abs(ours[row].astype(np.float64) - full[i]).max())
        assert err <= REL_TOL * rng, f"{rec} row {row}: max|d|={err:.3g}, range {rng:.3g}"
    # 2. Every row: the 16 top logits (at the reference's ids) and the
    # log-sum-exp of the whole row. The full range is not stored for these
    # rows; top1 - top16 is a lower bound of it, so this tolerance is
    # stricter than the stated one.
    ids, vals = r[f"{rec}_topk_ids"], r[f"{rec}_topk_vals"].astype(np.float64)
    tol = REL_TOL * (vals[:, 0] - vals[:, -1])
    got = np.take_along_axis(ours, ids.astype(np.int64), axis=1).astype(np.float64)
    err = np.abs(got - vals).max(axis=1)
    bad = np.flatnonzero(err > tol)
    assert bad.size == 0, f"{rec}: top-16 logits off at rows {bad[:10]} (max|d| {err.max():.3g})"
    o64 = ours.astype(np.float64)
    mx = o64.max(axis=1)
    lse = mx + np.log(np.exp(o64 - mx[:, None]).sum(axis=1))
    lse_err = np.abs(lse - r[f"{rec}_lse"])
    assert (lse_err <= tol).all(), f"{rec}: log-sum-exp off by up to {lse_err.max():.3g}"
    # 3. Top-1 identical wherever the reference's top-1/top-2 margin exceeds
    # twice the tolerance (errors within tolerance cannot flip it there).
    margin = vals[:, 0] - vals[:, 1]
    clear = margin > 2 * tol
    flips = np.flatnonzero(clear & (ours.argmax(axis=1) != ids[:, 0]))
    assert flips.size == 0, f"{rec}: top-1 differs at clear-margin rows {flips[:10]}"
    return float(err.max())


@pytest.mark.parametrize("model_name,ref_name", CASES)
@pytest.mark.parametrize("seq", SEQS)
def test_prefill_matches_transformers(model_name, ref_name, seq):
    tokens = sequences()[seq]
    ours = run_exact(model_name, tokens)
    assert ours.shape == (len(tokens), 512)
    check_rows(ours, ref(ref_name), f"{seq}_one")


@pytest.mark.parametrize("model_name,ref_name", CASES[:2])
@pytest.mark.parametrize("prompt", ["greedy16", "greedy100"])
def test_decode_steps_match_transformers(model_name, ref_name, prompt):
    """The greedy records: the prompt in one eval, then 32 one-token evals
    (the decode path, split-K over the KV pages), teacher-forced on the
    reference's generated tokens so one near-tie cannot derail the rest."""
    r = ref(ref_name)
    prompt_tokens = sequences()["s16" if prompt == "greedy16" else "s100"]
    gen = r[f"{prompt}_tokens"]
    rows = []
    with ds4py.load(os.path.join(MODELS, model_name + ".gguf"), precision="exact",
                    n_threads=2) as m, m.new_session() as s:
        rows.append(np.array(s.eval(prompt_tokens)))
        for t in gen[:-1]:
            rows.append(np.array(s.eval([int(t)])))
        assert s.n_past == len(prompt_tokens) + len(gen) - 1
    ours = np.stack(rows)
    check_rows(ours, r, prompt)
    # The generated tokens are the reference's argmax; ours must agree on
    # every step whose margin is clear of twice the (lower-bound) tolerance
    # -- in these records that is every step (smallest margin 0.026, tolerance
    # below 0.002).
    vals = r[f"{prompt}_topk_vals"].astype(np.float64)
    clear = r[f"{prompt}_margin"] > 2 * REL_TOL * (vals[:, 0] - vals[:, -1])
    assert clear.all()
    assert np.array_equal(ours.argmax(axis=1), gen)
