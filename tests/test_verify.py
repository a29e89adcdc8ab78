"""Speculative verification: Session.verify(tokens) / Session.accept(k)
(csrc/session.c, GDN rollback in csrc/forward/gdn.c).

Everything is checked BIT for bit against a fresh evaluation of the same
tokens (DESIGN.md invariants 1 and 3):
- verify's rows equal one-token evals of the same tokens (batch invariance);
- after accept(k) the session continues exactly as a session that only ever
  saw the accepted tokens, for every k in 1..n, n in {1, 2, 5, 16}, with the
  verify, the accepted position and the continuation just before, on and
  after the 256-position KV page boundary, dense and MoE, fast (F16 KV,
  quantized activations) and exact (F32) precision.
The rejected rows of a verify hold tokens that differ from what comes next,
so a rollback that leaves anything of them behind (KV rows, recurrent state)
changes the continuation.
"""

from __future__ import annotations

import os

import golden_sessions
import numpy as np
import pytest
from golden_sessions import MODELS, PAGE, TOKS, bits, model, same  # noqa: F401
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ds4py
from ds4py import ModelError
from ds4py.session import VERIFY_MAX, rollback_bytes

CASES = [("dense-q8_0", "fast"), ("moe-q8_0", "fast"), ("dense-f32", "exact"),
         ("moe-f32", "exact")]


def ref(name: str, precision: str):
    """Logits and hidden of every row of TOKS[:400] from one fresh eval."""
    return golden_sessions.ref(name, precision, 400)




def junk(pos: int, n: int, vocab: int, salt: int = 0) -> list[int]:
    """n tokens that each differ from TOKS at positions pos.. (rejected drafts)."""
    return [int((TOKS[pos + i] + 1 + (7 * i + salt) % (vocab - 1)) % vocab) for i in range(n)]


def check_continuation(s, lg_ref, hd_ref, p: int) -> None:
    """The session stands at position p: its last row, one decode step and
    an 8-row eval equal the fresh evaluation's rows."""
    assert s.n_past == p
    same(s.last_logits(), lg_ref[p - 1])
    same(s.last_hidden(), hd_ref[p - 1])
    same(s.eval([int(TOKS[p])]), lg_ref[p])
    same(s.eval(TOKS[p + 1:p + 9], all_logits=True), lg_ref[p + 1:p + 9])


@pytest.mark.parametrize("name,precision", CASES)
@pytest.mark.parametrize("p0", [251, 256])
def test_accept_every_k(name, precision, p0):
    """p0 = 251: 16 rows cross the page boundary, n=5/k=5 lands exactly on
    it, continuations cross it; p0 = 256: the verify starts a new page."""
    m = model(name, precision)
    lg_ref, hd_ref = ref(name, precision)
    vocab = m.config.vocab_size
    for n in (1, 2, 5, 16):
        for k in range(1, n + 1):
            with m.new_session() as s:
                s.eval(TOKS[:p0])
                draft = [int(t) for t in TOKS[p0:p0 + k]] + junk(p0 + k, n - k, vocab)
                rows = s.verify(draft)
                assert rows.shape == (n, vocab) and s.n_past == p0 + n
                same(rows[:k], lg_ref[p0:p0 + k])
                s.accept(k)
                check_continuation(s, lg_ref, hd_ref, p0 + k)


@pytest.mark.parametrize("name,precision", CASES)
def test_verify_rows_equal_single_evals(name, precision):
    """16 rows in one verify == 16 one-token evals: logits, hidden and the
    per-layer residual rows, across the page boundary (positions 248..263)."""
    m = model(name, precision)
    last = m.config.n_layers - 1
    toks = junk(248, 16, m.config.vocab_size, salt=3)
    with m.new_session() as s:
        s.eval(TOKS[:248])
        lg, hd, lh = s.verify(toks, return_hidden=True, hidden_layers=[last, 0])
        assert lg.shape[0] == hd.shape[0] == lh.shape[0] == 16 and lh.shape[1] == 2
        lg, hd, lh = np.array(lg), np.array(hd), np.array(lh)
    with m.new_session() as s:
        s.eval(TOKS[:248])
        for r, t in enumerate(toks):
            a, b, c = s.eval([t], return_hidden=True, hidden_layers=[last, 0])
            same(a, lg[r])
            same(b, hd[r])
            same(c, lh[r])


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(CASES), p0=st.integers(200, 270),
       rounds=st.lists(st.tuples(st.integers(1, VERIFY_MAX), st.integers(0, 100),
                                 st.booleans()), min_size=1, max_size=6))
def test_random_speculative_rounds(case, p0, rounds):
    """A speculative loop: rounds of verify(n) / accept(k) with random n, k,
    rejected tokens, and sometimes an eval of the next token between rounds;
    every verified row that was accepted, and the final continuation, equal
    the fresh evaluation."""
    name, precision = case
    m = model(name, precision)
    lg_ref, hd_ref = ref(name, precision)
    with m.new_session() as s:
        s.eval(TOKS[:p0])
        p = p0
        for i, (n, kk, bonus) in enumerate(rounds):
            k = 1 + kk % n
            draft = [int(t) for t in TOKS[p:p + k]] + junk(p + k, n - k, m.config.vocab_size, i)
            rows = np.array(s.verify(draft))
            same(rows[:k], lg_ref[p:p + k])
            s.accept(k)
            p += k
            if bonus:
                same(s.eval([int(TOKS[p])]), lg_ref[p])
                p += 1
        check_continuation(s, lg_ref, hd_ref, p)


def test_eval_after_verify_keeps_all_rows():
    m = model("moe-q8_0", "fast")
    lg_ref, hd_ref = ref("moe-q8_0", "fast")
    with m.new_session() as s:
        s.eval(TOKS[:250])
        s.verify(TOKS[250:255])
        same(s.eval([int(TOKS[255])]), lg_ref[255])
        with pytest.raises(ModelError, match="without a verify"):
            s.accept(1)
        check_continuation(s, lg_ref, hd_ref, 256)


def test_accept_keeps_verify_views_and_shows_row():
    """accept(k) does not move the verify's rows (their views stay valid);
    the session's last row becomes row k-1."""
    m = model("dense-f32", "exact")
    lg_ref, _ = ref("dense-f32", "exact")
    with m.new_session() as s:
        s.eval(TOKS[:30])
        rows = s.verify(TOKS[30:36])
        before = np.array(rows)
        s.accept(2)
        same(rows, before)
        same(s.last_logits(), lg_ref[31])


def test_errors_leave_session_unchanged():
    m = model("dense-q8_0", "fast")
    lg_ref, hd_ref = ref("dense-q8_0", "fast")
    vocab = m.config.vocab_size
    with m.new_session() as s:
        with pytest.raises(ModelError, match="without a verify"):
            s.accept(1)  # fresh session
        s.eval(TOKS[:100])
        with pytest.raises(ModelError, match="without a verify"):
            s.accept(1)  # after an eval
        with pytest.raises(ModelError, match="verify takes 1 to 16 tokens \\(got 0\\)"):
            s.verify([])
        with pytest.raises(ModelError, match="verify takes 1 to 16 tokens \\(got 17\\)"):
            s.verify(TOKS[100:117])
        with pytest.raises(ModelError, match="token id 512 at index 2 is out of range"):
            s.verify([1, 2, vocab])
        with pytest.raises(ModelError, match="not a trunk layer"):
            s.verify([1, 2], hidden_layers=[99])
        assert s.n_past == 100
        s.verify([int(TOKS[100])] + junk(101, 3, vocab))
        for bad in (0, 5, -1, 2**40):
            with pytest.raises(ModelError, match=f"accept\\({bad}\\): k must be in 1..4"):
                s.accept(bad)
        for bad in (1.0, True, "2", None):
            with pytest.raises(ModelError, match="k must be an int"):
                s.accept(bad)
        with pytest.raises(ModelError, match="out of range"):
            s.accept(2**64)
        assert s.n_past == 104
        # a failed verify does not end the pending one
        with pytest.raises(ModelError, match="got 17"):
            s.verify(TOKS[:17])
        s.accept(np.int64(1))  # numpy ints are ints
        with pytest.raises(ModelError, match="without a verify"):
            s.accept(1)  # accept ends it
        check_continuation(s, lg_ref, hd_ref, 101)
    # verify past n_ctx is refused like an eval
    with ds4py.load(os.path.join(MODELS, "dense-q8_0.gguf"), n_ctx=20, n_threads=2) as m2, \
            m2.new_session() as s:
        s.eval(TOKS[:10])
        with pytest.raises(ModelError, match="n_past 10 \\+ 11 > n_ctx 20"):
            s.verify(TOKS[10:21])
        s.verify(TOKS[10:20])
        s.accept(10)
        assert s.n_past == 20
    s.close()
    with pytest.raises(ModelError, match="closed"):
        s.verify([1])
    with pytest.raises(ModelError, match="closed"):
        s.accept(1)


# ------------------------------------------------------------- memory --

def gdn_row_floats(conv_kernel, d, n_k, n_v):
    """Floats a verify keeps per row and GDN layer, derived by hand from
    qwen35-spec.md §3: the raw attn_qkv row (conv_dim = 2*n_k*d + n_v*d, the
    conv state is its last K-1 rows), the normed k heads (n_k*d) and the v
    heads (n_v*d), g and beta (n_v each)."""
    conv_dim = 2 * n_k * d + n_v * d
    return conv_dim + n_k * d + n_v * d + 2 * n_v


def gdn_state_floats(conv_kernel, d, n_k, n_v):
    """One GDN layer's full state: conv (K-1) x conv_dim, ssm n_v x d x d."""
    return (conv_kernel - 1) * (2 * n_k * d + n_v * d) + n_v * d * d


def test_rollback_bytes_qwen35_27b():
    """The figures on a Qwen3.5-27B shape (ds4-notes §3: 64 layers, one in 4
    full attention, so 48 GDN; 16 k heads, 48 v heads, d_k = d_v = 128,
    conv kernel 4, conv_dim 10240), computed, not allocated.
      kept per verify row (ours): 48 x 18,528 floats = 3,557,376 bytes
      a full state (kept once):   48 x 817,152 floats = 156,893,184 bytes,
    which is what keeping a state per row would cost per row (2.5 GB at
    n = 16, against 57 MB + 157 MB here)."""
    got = rollback_bytes(n_gdn_layers=48, conv_kernel=4, ssm_state_size=128,
                         ssm_n_key_heads=16, ssm_n_value_heads=48)
    assert 2 * 16 * 128 + 48 * 128 == 10240  # the conv_dim ds4-notes quotes
    assert gdn_row_floats(4, 128, 16, 48) == 18528
    assert gdn_state_floats(4, 128, 16, 48) == 817152
    assert got == {"per_row": 3_557_376, "per_state": 156_893_184}
    assert 16 * got["per_row"] + got["per_state"] < 16 * got["per_state"] / 10
    print(f"\nQwen3.5-27B verify rollback: {got['per_row']} bytes/row kept "
          f"(+{got['per_state']} once); a state per row would be {got['per_state']} bytes/row")


@pytest.mark.parametrize("name,precision", [("dense-q8_0", "fast"), ("moe-f32", "exact")])
def test_verify_allocations(name, precision):
    """The first verify allocates the second recurrent state and room for its
    rows (per_row bytes each, as computed); a larger verify grows that room
    once; a speculative loop then allocates nothing until a new KV page."""
    m = model(name, precision)
    cfg = m.config
    n_gdn = sum(1 for kind in cfg.layer_kinds[:cfg.n_layers] if kind == "gdn")
    shape = (cfg.conv_kernel, cfg.ssm_state_size, cfg.ssm_n_key_heads, cfg.ssm_n_value_heads)
    fig = rollback_bytes(n_gdn_layers=n_gdn, conv_kernel=shape[0], ssm_state_size=shape[1],
                         ssm_n_key_heads=shape[2], ssm_n_value_heads=shape[3])
    assert fig["per_row"] == n_gdn * gdn_row_floats(*shape) * 4
    assert fig["per_state"] == n_gdn * gdn_state_floats(*shape) * 4
    with m.new_session() as s:
        s.eval(TOKS[:50], all_logits=True)  # result rows for up to 50 rows exist
        c0 = s.counters()
        s.verify(TOKS[50:52])
        s.accept(1)
        c1 = s.counters()
        # 1 table + conv and ssm per GDN layer, and the 2-row capture
        assert c1["allocs"] - c0["allocs"] == 2 + 2 * n_gdn
        extra = c1["alloc_bytes"] - c0["alloc_bytes"] - fig["per_state"] - 2 * fig["per_row"]
        # the state table (one small struct per trunk layer) and one spare
        # float per conv buffer (forward.c allocates (K-1)*conv_dim + 1)
        assert 0 <= extra <= 16 * cfg.n_layers + 4 * n_gdn
        s.verify(TOKS[51:56])
        c2 = s.counters()
        assert c2["allocs"] - c1["allocs"] == 1
        assert c2["alloc_bytes"] - c1["alloc_bytes"] == 5 * fig["per_row"]
        s.accept(5)
        p = 56
        while p < 240:  # verify/accept/decode inside the first KV page
            n = 1 + p % 5
            s.verify(TOKS[p:p + n])
            s.accept(1 + p % n)
            p += 1 + p % n
            s.eval([int(TOKS[p])])
            p += 1
        c3 = s.counters()
        assert c3["allocs"] == c2["allocs"] and c3["alloc_bytes"] == c2["alloc_bytes"]


def test_accept_cuts_nextn_head_back():
    """accept(k) leaves the nextn head no rows at positions the trunk no
    longer holds (they paired rejected tokens); rows before stay, and the
    head continues there like a head that never drafted past them."""
    m = model("moe-q8_0", "fast")
    lg_ref, hd_ref = ref("moe-q8_0", "fast")
    vocab = m.config.vocab_size

    def primed():
        s = m.new_session()
        s.eval(TOKS[:250])
        m.nextn_eval(s, TOKS[1:250], hd_ref[0:249], np.arange(1, 250))
        return s

    with primed() as s_ref:
        m.nextn_eval(s_ref, TOKS[250:252], hd_ref[249:251], [250, 251])
        want = np.array(m.nextn_eval(s_ref, TOKS[252:255], hd_ref[251:254], [252, 253, 254])[0])
    with primed() as s:
        # draft 4 rows at 250..253, chaining the head's own hidden
        tok, hid = int(TOKS[250]), hd_ref[249]
        for _ in range(4):
            lg, hid = m.nextn_draft(s, tok, hid)
            tok = int((np.argmax(lg) + 1) % vocab)  # force rejected drafts
        assert m.nextn_range(s) == (1, 254)
        s.verify([int(TOKS[250]), int(TOKS[251])] + junk(252, 3, vocab))
        assert m.nextn_range(s) == (1, 254)  # verify leaves the head alone
        s.accept(2)
        assert s.n_past == 252 and m.nextn_range(s) == (1, 252)
        # the drafter rewrites its chained rows with the trunk's hiddens
        m.nextn_eval(s, TOKS[250:252], hd_ref[249:251], [250, 251])
        same(m.nextn_eval(s, TOKS[252:255], hd_ref[251:254], [252, 253, 254])[0], want)
        check_continuation(s, lg_ref, hd_ref, 252)
