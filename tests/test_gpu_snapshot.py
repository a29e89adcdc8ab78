"""Snapshot / restore on the GPU backend (ds4py/gpu_backend.py GpuSnapshot,
gpu/host/runner.c k_runner_snapshot / k_runner_restore), and the prefix
cache running on it, tested through the emulator backend ("gpu-emul"): the
plugin and the layer loop a CUDA build runs, as plain C.

The invariant is the CPU's "resumed equals fresh" (DESIGN.md): after
``restore(snap)`` and ``eval(tokens)`` the logits are BIT-IDENTICAL to a
fresh session that evaluated the whole sequence on the same backend. The
GPU loop is deterministic and batch invariant (a row's bits never depend
on how the prompt is split into evals: tests/test_gpu_model.py), so every
comparison here is exact equality; no tolerance.

Model: the golden dense Q8_0 model (2 attention + 3 GDN layers, 512-token
vocabulary) with n_ctx 320, the smallest context that holds two KV pages
(DS4_KV_PAGE = 256), so snapshots before and after the page boundary and a
resume that crosses it are all exercised. Tokens: the golden s700
sequence.

A planted fault turns these tests red: build the plugin with
-DPLANT_SNAPSHOT_NO_GDN (runner.c: restore then skips the GDN states), e.g.
``printf '#!/bin/sh\\nexec cc -DPLANT_SNAPSHOT_NO_GDN "$@"\\n' > /tmp/cc-plant;
chmod +x /tmp/cc-plant; CC=/tmp/cc-plant DS4PY_CACHE_DIR=$(mktemp -d)
python -m pytest -q tests/test_gpu_snapshot.py`` (the compiler is part of
the plugin's cache key, so a planted build never mixes with a real one).
"""

import gc
import os

import numpy as np
import pytest

import ds4py
from ds4py.gpu_backend import GpuSnapshot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, "tests", "golden")
DENSE = os.path.join(GOLDEN, "models", "dense-q8_0.gguf")
PAGE = 256      # DS4_KV_PAGE == K_ATTN_BLOCK: positions per KV page
N_CTX = 320     # two KV pages
RESUME = 4      # tokens evaluated after each restore
# snapshot points: empty, inside the first page, 2 before the page boundary
# (its resume crosses it), inside the second page
POINTS = (0, 7, PAGE - 2, PAGE + 2)
SEQ = [int(t) for t in np.load(os.path.join(GOLDEN, "logits", "sequences.npz"))["s700"]]
TOKENS = SEQ[:PAGE + 2 + RESUME]


@pytest.fixture(scope="module")
def gpu():
    m = ds4py.load(DENSE, backend="gpu-emul", n_ctx=N_CTX)
    yield m
    m.close()


@pytest.fixture(scope="module")
def taken(gpu):
    """One fresh session evaluates TOKENS from position 0 in pieces that end
    at POINTS, taking a snapshot at each, and goes on to the end (the
    snapshots must not follow it). Its rows are the reference "fresh"
    evaluation: it never restores, and a snapshot only reads the session (a
    snapshot that disturbed it would show as a mismatch in every resume
    below). Under the emulator a 262-token prefill takes ~30 s, so the
    sequence is evaluated once for every test here (the rows do not depend
    on how a sequence is split into evals: tests/test_gpu_model.py)."""
    s = gpu.new_session()
    snaps, rows, hid, done = {}, [], [], 0
    for k in (*POINTS, len(TOKENS)):
        if k > done:
            lg, h = s.eval(TOKENS[done:k], all_logits=True, return_hidden=True)
            rows.append(np.array(lg))
            hid.append(np.array(h))
        if k in POINTS:
            snaps[k] = s.snapshot()
        done = k
    yield s, snaps, np.concatenate(rows), np.concatenate(hid)
    s.close()


@pytest.fixture(scope="module")
def fresh(taken):
    """The reference rows: (logits, post-norm hidden) of every position."""
    return taken[2], taken[3]


@pytest.fixture(scope="module")
def fresh_rows(fresh):
    return fresh[0]


@pytest.fixture(scope="module")
def snaps(taken):
    return taken[0], taken[1]


def resume_and_check(s, snap, k, fresh_rows, fresh_hidden=None):
    """Restore snap (taken at k) into s, then the next RESUME tokens: their
    logits and the restored last row (logits, and hidden when given) must
    be the fresh session's bits."""
    s.restore(snap)
    assert s.n_past == k
    last = s.last_logits()
    if k == 0:
        assert last is None and s.last_hidden() is None
    else:
        np.testing.assert_array_equal(last, fresh_rows[k - 1])
        if fresh_hidden is not None:
            np.testing.assert_array_equal(s.last_hidden(), fresh_hidden[k - 1])
    rows = np.array(s.eval(TOKENS[k:k + RESUME], all_logits=True))
    np.testing.assert_array_equal(rows, fresh_rows[k:k + RESUME])
    assert s.n_past == k + RESUME


def test_resumed_equals_fresh_in_a_new_session(gpu, fresh, snaps):
    _, sn = snaps
    for k in POINTS:
        assert isinstance(sn[k], GpuSnapshot) and sn[k].n_past == k
        with gpu.new_session() as s:
            resume_and_check(s, sn[k], k, *fresh)


def test_restore_into_a_used_session_twice_and_back(gpu, fresh, snaps):
    """A session with other state (other tokens, GDN state and KV rows that
    differ) restored, twice in a row, then to an earlier point; and the
    session that took the snapshots, restored to its own past."""
    taker, sn = snaps
    k = PAGE - 2
    with gpu.new_session() as s:
        s.eval(SEQ[300:310])
        resume_and_check(s, sn[k], k, *fresh)
        resume_and_check(s, sn[k], k, *fresh)   # the snapshot did not change
        resume_and_check(s, sn[7], 7, *fresh)   # backwards
        resume_and_check(s, sn[PAGE + 2], PAGE + 2, *fresh)
    resume_and_check(taker, sn[7], 7, *fresh)


def test_snapshot_between_verify_and_accept(gpu, fresh_rows, snaps):
    """Well defined, as on the CPU: the snapshot holds every verified row
    (verify == serial evals, bit for bit) and the session can still accept;
    a restore ends the target's pending verify."""
    _, sn = snaps
    with gpu.new_session() as a, gpu.new_session() as b:
        a.restore(sn[7])
        rows = np.array(a.verify(TOKENS[7:11]))
        np.testing.assert_array_equal(rows, fresh_rows[7:11])
        mid = a.snapshot()
        assert mid.n_past == 11
        a.accept(2)                                 # the session still accepts
        assert a.n_past == 9
        np.testing.assert_array_equal(a.eval(TOKENS[9:11], all_logits=True), fresh_rows[9:11])
        b.verify(TOKENS[13:15])                     # a pending verify of b's own
        b.restore(mid)
        assert b.n_past == 11
        np.testing.assert_array_equal(b.last_logits(), fresh_rows[10])
        with pytest.raises(ds4py.ModelError, match="without a verify"):
            b.accept(1)
        np.testing.assert_array_equal(b.eval(TOKENS[11:12], all_logits=True), fresh_rows[11:12])
        mid.close()


def test_refusals_leave_the_session_unchanged(gpu, fresh_rows, snaps):
    _, sn = snaps
    other = ds4py.load(DENSE, backend="gpu-emul", n_ctx=N_CTX)
    cpu = ds4py.load(DENSE, n_threads=1, n_ctx=N_CTX)
    try:
        with other.new_session() as o, cpu.new_session() as c, gpu.new_session() as s:
            o.eval(TOKENS[:3])
            foreign = o.snapshot()
            c.eval(TOKENS[:3])
            cpu_snap = c.snapshot()
            s.restore(sn[7])
            with pytest.raises(ds4py.ModelError, match="another model"):
                s.restore(foreign)
            with pytest.raises(ds4py.ModelError, match="CPU session's Snapshot"):
                s.restore(cpu_snap)
            with pytest.raises(ds4py.ModelError, match="restore needs a Snapshot, got int"):
                s.restore(7)
            with pytest.raises(ds4py.ModelError, match="restore needs a Snapshot"):
                c.restore(foreign)                  # and the CPU session refuses a GPU one
            closed = s.snapshot()
            closed.close()
            closed.close()                          # idempotent
            assert closed.closed
            with pytest.raises(ds4py.ModelError, match="snapshot is closed"):
                s.restore(closed)
            # nothing above changed s: it resumes as if only sn[7] was restored
            assert s.n_past == 7
            np.testing.assert_array_equal(s.last_logits(), fresh_rows[6])
            np.testing.assert_array_equal(s.eval(TOKENS[7:7 + RESUME], all_logits=True),
                                          fresh_rows[7:7 + RESUME])
            foreign.close()
            cpu_snap.close()
        s.close()
        with pytest.raises(ds4py.ModelError, match="closed"):
            s.snapshot()
        with pytest.raises(ds4py.ModelError, match="closed"):
            s.restore(sn[7])
    finally:
        other.close()
        cpu.close()


def expected_nbytes(cfg, n_past, head=False):
    """Device bytes a snapshot at n_past holds, from the model's shape (not
    from the code under test): per attention layer the K and V pages of
    [0, n_past) in F16, per GDN layer its conv state (conv_kernel - 1 rows
    of q, k and v channels) and its recurrent state (a d x d matrix per
    value head), in float; and the last logits and hidden rows when
    n_past > 0. ``head``: taken from a session priming the nextn head (one
    attention layer's shape), which adds the head's K and V pages of
    positions [1, n_past)."""
    kinds = cfg.layer_kinds[:cfg.n_layers]
    page = 2 * cfg.n_kv_heads * PAGE * cfg.head_dim * 2
    kv = -(-n_past // PAGE) * page
    conv_dim = 2 * cfg.ssm_n_key_heads * cfg.ssm_state_size + cfg.ssm_inner_size
    gdn = 4 * ((cfg.conv_kernel - 1) * conv_dim
               + cfg.ssm_n_value_heads * cfg.ssm_state_size * cfg.ssm_state_size)
    head_kv = -(-(n_past - 1) // PAGE) * page if head and n_past > 1 else 0
    return (kinds.count("attn") * kv + kinds.count("gdn") * gdn + head_kv
            + (4 * (cfg.vocab_size + cfg.hidden_size) if n_past else 0))


def test_snapshot_memory_is_released(fresh_rows):
    """nbytes is the device memory a snapshot holds; it is freed on close()
    or garbage collection, and the device model outlives its last snapshot
    (the model and the session may be closed first)."""
    m = ds4py.load(DENSE, backend="gpu-emul", n_ctx=N_CTX)
    s = m.new_session()
    assert m.snapshot_bytes == 0 and m.snapshots == 0
    session_bytes = s.device_bytes
    empty = s.snapshot()
    assert empty.nbytes == expected_nbytes(m.config, 0) and m.snapshot_bytes == empty.nbytes
    s.eval(TOKENS[:10])
    a = s.snapshot()
    assert a.nbytes == expected_nbytes(m.config, 10)
    assert m.snapshot_bytes == empty.nbytes + a.nbytes and m.snapshots == 2
    assert s.device_bytes == session_bytes      # a snapshot is not the session's memory
    empty.close()
    assert m.snapshot_bytes == a.nbytes and m.snapshots == 1
    b = s.snapshot()
    del b
    gc.collect()
    assert m.snapshot_bytes == a.nbytes and m.snapshots == 1
    # closing the model first: its sessions and snapshots keep it alive
    m.close()
    s.restore(a)
    np.testing.assert_array_equal(s.eval(TOKENS[10:12], all_logits=True), fresh_rows[10:12])
    s.close()
    with pytest.raises(ds4py.ModelError, match="closed"):
        _ = m.snapshot_bytes
    a.close()                                   # frees the device model last
    del a
    gc.collect()


def test_generate_with_a_prefix_cache(gpu):
    """generate(cache=) on the GPU: a follow-up with a shared prefix
    restores it (the cache's hit statistics say so) and gives the tokens of
    a cache-less run; a prompt equal to a cached key samples from the
    snapshot's last logits, also where that snapshot was taken after
    greedy steps that chose on the device (logits never copied back)."""
    p1, p2 = SEQ[:20], SEQ[:20] + SEQ[400:406]
    n1 = len(p1)
    cache = ds4py.PrefixCache(gpu)
    g1 = ds4py.generate(gpu, p1, max_tokens=3, temperature=0, cache=cache)
    assert g1.cached_tokens == 0 and len(g1.tokens) == 3
    assert cache.stats.hits == 0 and cache.stats.inserted == 2   # prompt end, generation end
    # each entry is charged its snapshot's device bytes (KV pages included):
    # a GPU snapshot shares no pages, so nothing else is charged. The golden
    # model's nextn head drafts on the GPU (g1 drafted): its sessions prime
    # the head, and their snapshots carry its pages too
    assert g1.draft["drafting"] is True
    cfg = gpu.config
    assert cache.entries() == [(n, expected_nbytes(cfg, n, head=True)) for n in (n1, n1 + 2)]
    assert cache.nbytes == (expected_nbytes(cfg, n1, head=True)
                            + expected_nbytes(cfg, n1 + 2, head=True))
    g2 = ds4py.generate(gpu, p2, max_tokens=3, temperature=0, cache=cache)
    plain = ds4py.generate(gpu, p2, max_tokens=3, temperature=0)
    assert cache.stats.hits == 1 and g2.cached_tokens == n1
    assert g2.tokens == plain.tokens
    # the whole prompt cached: nothing evaluated, the snapshot's last row sampled
    again = ds4py.generate(gpu, p1, max_tokens=3, temperature=0, cache=cache)
    assert again.cached_tokens == n1 and again.tokens == g1.tokens
    # the end-of-generation key: prompt + the 2 tokens evaluated by device-argmax steps
    cont = ds4py.generate(gpu, p1 + g1.tokens[:2], max_tokens=1, temperature=0, cache=cache)
    assert cont.cached_tokens == n1 + 2 and cont.tokens == g1.tokens[2:3]
    assert cache.stats.hits == 3
    # sampling with logprobs (the logits copied back every step) agrees bit for bit
    lp_c = ds4py.generate(gpu, p2, max_tokens=2, temperature=0, logprobs=3, cache=cache)
    lp_p = ds4py.generate(gpu, p2, max_tokens=2, temperature=0, logprobs=3)
    assert lp_c.cached_tokens == len(p2) and lp_c.tokens == plain.tokens[:2]
    assert [(x.logprob, x.top_logprobs) for x in lp_c.logprobs] == \
        [(x.logprob, x.top_logprobs) for x in lp_p.logprobs]
    cache.clear()


# ------------------------------------------------------------ hidden state --

# GPU vs CPU post-norm hidden: tests/test_gpu_model.py's logits-level bound
# (1.0, about 2x the measured 0.47 on logits: the same float-V attention and
# Q8 rounding flips, docs/gpu.md section 7); the hidden state is the LM
# head's input, so its differences are what those logit differences come from.
# Measured: 0.091 over the first 20 rows of s700 (hidden values up to 4.4).
MAX_ABS_HIDDEN_VS_CPU = 1.0
N_HIDDEN = 5


def test_hidden_prefill_equals_decode_and_tracks_the_cpu(gpu, fresh):
    """eval(return_hidden=True): the post-final-norm rows, one batch ==
    one eval per row bit for bit (batch invariance on the GPU), the last
    row again from last_hidden() (also after a step that chose its token on
    the device), and within the stated bound of the CPU backend's."""
    rows, hid = fresh
    ids = TOKENS[:N_HIDDEN]
    with gpu.new_session() as s:
        for t in range(N_HIDDEN):
            lg, h = s.eval(ids[t:t + 1], return_hidden=True)
            assert lg.shape == (gpu.config.vocab_size,) and h.shape == (gpu.config.hidden_size,)
            np.testing.assert_array_equal(h, hid[t])
            np.testing.assert_array_equal(lg, rows[t])
            np.testing.assert_array_equal(s.last_hidden(), hid[t])
        s.step_argmax(TOKENS[N_HIDDEN])
        np.testing.assert_array_equal(s.last_hidden(), hid[N_HIDDEN])
    cpu = ds4py.load(DENSE, n_threads=1, n_ctx=N_CTX)
    try:
        with cpu.new_session() as c:
            _, ch = c.eval(ids, all_logits=True, return_hidden=True)
            assert np.abs(np.asarray(ch) - hid[:N_HIDDEN]).max() <= MAX_ABS_HIDDEN_VS_CPU
    finally:
        cpu.close()


def test_verify_returns_each_rows_hidden(gpu, fresh):
    """verify(return_hidden=True): every verified row's post-final-norm
    hidden state, bit for bit the fresh evaluation's at those positions
    (verify rows equal serial rows on one backend), beside the same logits;
    with hidden_layers too, (logits, hidden, taps); accept(k) then leaves
    row k-1's hidden as last_hidden()."""
    rows, hid = fresh
    with gpu.new_session() as s:
        s.eval(TOKENS[:3])
        lg, h = s.verify(TOKENS[3:7], return_hidden=True)
        assert h.shape == (4, gpu.config.hidden_size)
        np.testing.assert_array_equal(h, hid[3:7])
        np.testing.assert_array_equal(lg, rows[3:7])
        s.accept(2)
        np.testing.assert_array_equal(s.last_hidden(), hid[4])
        out = s.verify(TOKENS[5:7], return_hidden=True, hidden_layers=[0])
        assert len(out) == 3 and out[2].shape == (2, 1, gpu.config.hidden_size)
        np.testing.assert_array_equal(out[1], hid[5:7])
        np.testing.assert_array_equal(out[0], rows[5:7])
