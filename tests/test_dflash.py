"""The DFlash drafter (csrc/forward/dflash.c, csrc/dflash_load.c,
ds4py/dflash.py): forward pass against an independent numpy reference,
exact context rollback, the loader's refusals, and greedy speculative
decoding with it byte-identical to serial decoding."""

from __future__ import annotations

import numpy as np
import pytest
from dflash_files import DENSE_F32, config, random_arrays, ref_propose, write

import ds4py
import ds4py.gguf as G
from ds4py.dflash import DFlashDrafter
from ds4py.errors import ModelError
from ds4py.spec import AdaptivePolicy, FixedPolicy, speculative_generate
from ds4py.spec.runner import SpecRunner

TAPS = [0, 2, 4]


@pytest.fixture(scope="module")
def target():
    return ds4py.load(DENSE_F32, precision="exact", n_threads=2)


@pytest.fixture(scope="module")
def emb():
    # tied embeddings: token_embd is also the LM head
    return np.array(G.open(DENSE_F32).array("token_embd.weight"))


@pytest.fixture(scope="module")
def drafter_file(tmp_path_factory):
    cfg = config()
    arrays = random_arrays(cfg)
    return write(tmp_path_factory.mktemp("dfl") / "d.gguf", cfg, arrays), cfg, arrays


def _taps(target, tokens):
    s = ds4py.Session(target)
    _, taps = s.eval(tokens, all_logits=True, hidden_layers=TAPS)
    return np.array(taps)


# The C forward runs float32 (dot products of <= 768 terms, softmax over
# <= ~70 entries); the reference float64. Observed max |diff| ~1e-5 on logits
# of magnitude ~15; 2e-5 * (1 + max|ref|) leaves headroom for other ISAs'
# dot kernels on the target's LM head while still catching any wrong term
# (a missing norm, a wrong RoPE pair or position moves logits by O(1)).
def _close(c, ref):
    tol = 2e-5 * (1.0 + np.abs(ref).max())
    assert np.abs(c - ref).max() <= tol, (np.abs(c - ref).max(), tol)
    top2 = np.sort(ref, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 1e-3  # drafts compared where the argmax is clear
    assert clear.any()
    assert (c.argmax(1)[clear] == ref.argmax(1)[clear]).all()


@pytest.mark.parametrize("n_ctx", [0, 1, 37, 300])
def test_forward_matches_numpy_reference(target, emb, drafter_file, n_ctx):
    path, cfg, arrays = drafter_file
    d = DFlashDrafter.load(target, path)
    assert d.dflash.config.target_layers == tuple(TAPS)
    assert d.max_depth == cfg.block_size - 1
    toks = [(7 * i + 3) % 480 for i in range(n_ctx)]
    taps = _taps(target, toks) if n_ctx else np.zeros((0, 3, 256), np.float32)
    d.ctx.add(taps, 0)
    drafts, logits = d.ctx.propose(41, n_ctx)
    ref = ref_propose(cfg, arrays, taps, 41, emb, emb)
    _close(logits, ref)
    assert drafts == [int(x) for x in logits.argmax(1)]


def test_quantized_drafter_matches_reference_of_its_weights(target, emb, tmp_path):
    cfg = config()
    arrays = random_arrays(cfg, seed=3)
    path = write(tmp_path / "q.gguf", cfg, arrays, wtype="Q8_0")
    g = G.open(path)
    deq = {name: np.array(g.array(name)) for name in arrays}  # what the file holds
    assert g.tensors["blk.0.attn_q.weight"].type_id == 8  # Q8_0 really written
    d = DFlashDrafter.load(target, path)
    taps = _taps(target, list(range(5, 60)))
    d.ctx.add(taps, 0)
    _, logits = d.ctx.propose(9, 55)
    _close(logits, ref_propose(cfg, deq, taps, 9, emb, emb))


@pytest.fixture(scope="module")
def fast_target():
    return ds4py.load(DENSE_F32, precision="fast", n_threads=2)


def test_fast_precision_drafter_rounds_like_a_q8_0_matmul(fast_target, emb, drafter_file):
    """Fast precision runs the drafter's matrices as Q8_0 against Q8_0
    activation rows (dflash.c): its logits differ from the F32 reference by
    that rounding only. Per-block int8 rounding of weights and activations
    (relative step 1/254 each), compounded through the layers' norms and
    softmax, measured 0.34 on logits of max 13 (2.6%) on this file;
    5e-2 * (1 + max|ref|) (= 0.71 here) leaves headroom for other ISAs'
    summation order, while a wrong term (a missing norm, a swapped matrix)
    moves logits by several units. Drafts agree wherever the reference's
    top-2 margin exceeds twice that bound."""
    path, cfg, arrays = drafter_file
    d = DFlashDrafter.load(fast_target, path)
    taps = _taps(fast_target, [(3 * i + 2) % 480 for i in range(50)])
    d.ctx.add(taps, 0)
    drafts, logits = d.ctx.propose(17, 50)
    ref = ref_propose(cfg, arrays, taps, 17, emb, emb)
    tol = 5e-2 * (1.0 + np.abs(ref).max())
    err = np.abs(logits - ref).max()
    assert 0 < err <= tol, (err, tol)  # > 0: the quantized path really ran
    top2 = np.sort(ref, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 2 * tol
    assert clear.any()
    assert (np.array(drafts)[clear] == ref.argmax(1)[clear]).all()


@pytest.mark.parametrize("precision", ["exact", "fast"])
def test_fewer_drafts_are_the_first_rows_of_the_full_block(drafter_file, precision, request):
    """propose(n) runs the whole block through the layers and only n rows
    through the LM head: those rows equal the full block's bit for bit."""
    m = request.getfixturevalue("fast_target" if precision == "fast" else "target")
    path, cfg, _ = drafter_file
    d = DFlashDrafter.load(m, path)
    d.ctx.add(_taps(m, list(range(30))), 0)
    full_d, full_l = d.ctx.propose(5, 30)
    full_l = full_l.copy()
    for n in (1, 3, cfg.block_size - 1):
        dn, ln = d.ctx.propose(5, 30, n)
        assert dn == full_d[:n] and ln.shape[0] == n
        assert np.array_equal(ln, full_l[:n])
    for bad in (0, cfg.block_size):
        with pytest.raises(ModelError, match="drafts asked of a block"):
            d.ctx.propose(5, 30, bad)


def test_version0_stores_layers_plus_one(target, drafter_file, tmp_path):
    path, cfg, arrays = drafter_file
    p0 = write(tmp_path / "v0.gguf", cfg, arrays, version=0)
    assert G.open(p0).metadata["dflash.target_layers"] == [1, 3, 5]
    d0, d1 = DFlashDrafter.load(target, p0), DFlashDrafter.load(target, path)
    assert d0.dflash.config.target_layers == tuple(TAPS)
    taps = _taps(target, list(range(20)))
    for d in (d0, d1):
        d.ctx.add(taps, 0)
    assert np.array_equal(d0.ctx.propose(3, 20)[1], d1.ctx.propose(3, 20)[1])


def test_context_rollback_and_batching_are_exact(target, drafter_file):
    """Rows added one at a time, in one call, or rewritten after a
    truncation give bit-identical blocks (the context K/V of a row depend on
    its taps and position only)."""
    path, _, _ = drafter_file
    taps = _taps(target, [(5 * i + 1) % 500 for i in range(40)])
    a, b = DFlashDrafter.load(target, path), DFlashDrafter.load(target, path)
    a.ctx.add(taps, 0)
    for i in range(40):
        b.ctx.add(taps[i:i + 1], i)
    la = np.array(a.ctx.propose(17, 40)[1])
    assert np.array_equal(la, b.ctx.propose(17, 40)[1])
    # garbage rows past 30, then a rewrite from 30: exactly the original
    b.ctx.add(np.random.default_rng(1).standard_normal((10, 3, 256)).astype(np.float32), 30)
    assert not np.array_equal(la, b.ctx.propose(17, 40)[1])
    b.ctx.truncate(30)
    assert b.ctx.n == 30
    b.ctx.add(taps[30:], 30)
    assert np.array_equal(la, b.ctx.propose(17, 40)[1])


def test_context_misuse_is_refused(target, drafter_file):
    d = DFlashDrafter.load(target, drafter_file[0])
    taps = _taps(target, [1, 2, 3])
    with pytest.raises(ModelError, match="gap"):
        d.ctx.add(taps, 2)
    d.ctx.add(taps, 0)
    with pytest.raises(ModelError, match=r"needs the context of \[0, 2\)"):
        d.ctx.propose(1, 2)
    with pytest.raises(ModelError, match="outside the vocabulary"):
        d.ctx.propose(512, 3)
    with pytest.raises(ModelError, match="taps must be"):
        d.ctx.add(taps[:, :2], 3)
    with pytest.raises(ModelError, match="cannot truncate"):
        d.ctx.truncate(4)
    assert d.ctx.n == 3


# -------------------------------------------------------------- refusals --

def _set(key, value):
    def edit(meta):
        meta[key] = value
    return edit


def _drop_tensor(name):
    def edit(t):
        del t[name]
    return edit


def _add_tensor(name, shape=(256,)):
    def edit(t):
        t[name] = ("F32", tuple(reversed(shape)), np.ones(shape, np.float32))
    return edit


REFUSALS = [
    # (id, config overrides, version, meta edit, tensor edit, message regex)
    ("dflash2-version", {}, 2, None, None,
     r"DFlash2 drafters are not supported \(dflash.version = 2\)"),
    ("version3", {}, 3, None, None, r"dflash.version = 3 is not supported"),
    ("dflash2-key", {}, 1, _set("dflash.conv_kernel_size", 4), None,
     r"DFlash2 drafters are not supported \(the file has dflash.conv_kernel_size\)"),
    ("dflash2-tensor", {}, 1, None, _add_tensor("blk.0.attn_conv_base.weight"),
     r"DFlash2 drafters are not supported \(the file has tensor blk.0.attn_conv_base"),
    ("tap-out-of-range", {"target_layers": [0, 5]}, 1, None, None,
     r"target_layers\[1\] = 5 is trunk layer 5, outside the target's trunk \[0, 5\)"),
    ("v0-tap-zero", {"target_layers": [-1, 2]}, 0, None, None,
     r"target_layers\[0\] = 0 is trunk layer -1.*version 0 stores layers \+ 1"),
    ("n-embd-mismatch", {"n_embd": 128, "n_head": 2}, 1, None, None,
     r"embedding_length = 128 but the target's n_embd is 256"),
    ("odd-head-dim", {"n_head": 8, "head_dim": 31}, 1, None, None, r"key_length = 31 must be even"),
    ("heads-times-dim", {"n_head": 2}, 1, None, None,
     r"head_count \* key_length = 2 \* 64 != embedding_length 256"),
    ("block-1", {"block_size": 1}, 1, None, None, r"block_size = 1: supported 2..16"),
    ("block-17", {"block_size": 17}, 1, None, None, r"block_size = 17: supported 2..16"),
    ("mask-id", {"mask_token_id": 512}, 1, None, None,
     r"mask_token_id = 512 is not a token of the target"),
    ("causal", {}, 1, _set("dflash.attention.causal", True), None,
     r"attention.causal = true is not supported"),
    ("window", {}, 1, _set("dflash.attention.sliding_window", 64), None,
     r"dflash.attention.sliding_window \(a windowed attention mask\) is not supported"),
    ("no-mask-key", {}, 1, lambda m: m.pop("tokenizer.ggml.mask_token_id"), None,
     r"missing key tokenizer.ggml.mask_token_id"),
    ("missing-tensor", {}, 1, None, _drop_tensor("blk.1.ffn_up.weight"),
     r"missing tensor blk.1.ffn_up.weight"),
    ("own-embedding", {}, 1, None, _add_tensor("token_embd.weight", (512, 256)),
     r"tensor token_embd.weight: a drafter with its own embedding or LM head"),
    ("bias", {}, 1, None, _add_tensor("blk.0.attn_q.bias"),
     r"blk.0.attn_q.bias: biases are not part"),
    ("extra-layer", {}, 1, None, _add_tensor("blk.2.attn_norm.weight"),
     r"unexpected tensor blk.2.attn_norm"),
    ("arch", {}, 1, _set("general.architecture", "qwen35"), None,
     r"general.architecture is 'qwen35', expected 'dflash'"),
]


@pytest.mark.parametrize("case", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_unsupported_drafters_are_refused(target, tmp_path, case):
    _, over, version, meta_edit, tensor_edit, msg = case
    cfg = config(**over)
    arrays = random_arrays(cfg)  # shapes follow cfg; refusals come first
    path = write(tmp_path / "bad.gguf", cfg, arrays, version=version, meta_edit=meta_edit,
                 tensor_edit=tensor_edit)
    with pytest.raises(ModelError, match=msg):
        DFlashDrafter.load(target, path)


def test_a_full_model_is_not_a_drafter(target):
    with pytest.raises(ModelError, match="general.architecture is 'qwen35', expected 'dflash'"):
        DFlashDrafter.load(target, DENSE_F32)


# ------------------------------------------------- speculative decoding --

PROMPT = [(11 * i + 5) % 480 for i in range(23)]


@pytest.fixture(scope="module")
def serial(target):
    toks, _ = speculative_generate(target, PROMPT, 40, policy=FixedPolicy(0))
    return toks


def _agreeing_drafter(target, tmp_path, serial):
    """A drafter that often agrees with the target: no attention or FFN
    output (wo = down = 0), so every draft row is norm(embedding of the mask
    token) and the drafts are argmax(E . E[mask]) -- the mask token itself
    on the golden trunk. With mask = the token serial decoding repeats most,
    rounds accept some drafts and reject others."""
    mask = int(np.bincount(serial).argmax())
    cfg = config(mask_token_id=mask)
    arrays = random_arrays(cfg, seed=5)
    for i in range(cfg.n_layer):
        arrays[f"blk.{i}.attn_output.weight"][:] = 0
        arrays[f"blk.{i}.ffn_down.weight"][:] = 0
    arrays["output_norm.weight"][:] = 1
    return write(tmp_path / f"agree{mask}.gguf", cfg, arrays)


@pytest.mark.parametrize("policy", [1, 3, 5, 8, "adaptive"])
def test_greedy_speculative_equals_serial(target, tmp_path, serial, policy):
    d = DFlashDrafter.load(target, _agreeing_drafter(target, tmp_path, serial))
    pol = AdaptivePolicy() if policy == "adaptive" else FixedPolicy(policy)
    s = d.session(ds4py.Session(target))
    toks, stats = speculative_generate(target, PROMPT, 40, policy=pol, drafter=d, session=s)
    assert toks == serial
    assert stats["draft_admitted"] and stats["drafted"] > 0
    if policy != "adaptive":
        # both outcomes happen: accepted drafts and rejected ones
        assert 0 < stats["accepted"] < stats["drafted"]
    # the context followed exactly the committed rows: brought up to date
    # (it is filled lazily, before a propose), it equals a context built
    # from one fresh eval of the same tokens, bit for bit
    assert d.ctx.n <= s.n_past
    s.sync()
    assert d.ctx.n == s.n_past
    fresh = DFlashDrafter.load(target, d.dflash.path)
    fresh.ctx.add(_taps(target, (PROMPT + toks)[:s.n_past]), 0)
    last = toks[-1]
    assert np.array_equal(d.ctx.propose(last, s.n_past)[1], fresh.ctx.propose(last, s.n_past)[1])


def test_random_drafter_is_exact_too(target, drafter_file, serial):
    d = DFlashDrafter.load(target, drafter_file[0])
    s = d.session(ds4py.Session(target))
    toks, stats = speculative_generate(target, PROMPT, 40, policy=FixedPolicy(5), drafter=d,
                                       session=s)
    assert toks == serial and stats["drafted"] > 0


def test_admission_needs_the_wrapped_history(target, drafter_file):
    d = DFlashDrafter.load(target, drafter_file[0])
    plain = ds4py.Session(target)
    run = SpecRunner(target, plain, FixedPolicy(3), d)
    assert "drafter.session(s)" in run.admit()
    s = ds4py.Session(target)
    s.eval([1, 2, 3])
    assert "does not hold this session's history" in SpecRunner(
        target, d.session(s), FixedPolicy(3), d).admit()
    fresh = d.session(ds4py.Session(target))
    fresh.eval([1, 2, 3])
    snap = fresh.snapshot()
    assert SpecRunner(target, fresh, FixedPolicy(3), d).admit() is None
    # a snapshot it took carries its taps: restoring it keeps drafting
    fresh.eval([4, 5])
    fresh.restore(snap)
    assert SpecRunner(target, fresh, FixedPolicy(3), d).admit() is None
    assert d.ctx.n == 3
    # one from an unwrapped session does not, until rebuild() re-evaluates the prefix
    foreign = s.snapshot()
    fresh.restore(foreign)
    assert "restored from a snapshot without taps" in SpecRunner(
        target, fresh, FixedPolicy(3), d).admit()
    fresh.rebuild([1, 2, 3])
    assert SpecRunner(target, fresh, FixedPolicy(3), d).admit() is None
