"""Snapshots: Session.snapshot() / Session.restore(snap) (csrc/session.c,
KV page sharing in csrc/forward/kv.c).

Checked BIT for bit against a fresh evaluation of the same tokens (DESIGN.md
invariant 3), dense and MoE, fast (F16 KV) and exact (F32 KV):
- a restored session continues exactly as a fresh one, at positions just
  before, on and after the 256-position KV page boundary, restored twice,
  into another session of the same model;
- snapshots stay valid and unchanged while the session moves on (the
  session writes different tokens over the same positions: copy-on-write);
- snapshot memory is what differs: the recurrent states, the last row and a
  page table per snapshot, plus one copy of each shared K/V page the session
  writes into afterwards, nothing proportional to the context (counters);
- every KV page is given back when sessions and snapshots go away.
"""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest
from golden_sessions import MODELS, PAGE, TOKS, bits, model, ref, same  # noqa: F401
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ds4py
from ds4py import ModelError, Snapshot
from ds4py.session import kv_live_pages, rollback_bytes

PAGE_HEADER = 64  # DS4_KV_PAGE_HEADER: the reference count in front of each page

CASES = [("dense-q8_0", "fast"), ("moe-q8_0", "fast"), ("dense-f32", "exact"),
         ("moe-f32", "exact")]




def other_tokens(pos: int, n: int, vocab: int) -> np.ndarray:
    """n tokens differing from TOKS at each of positions pos.., so writing
    them over a shared page would change what a snapshot reads."""
    return ((TOKS[pos:pos + n] + 1 + np.arange(n) % 97) % vocab).astype(np.int32)


def check_continuation(s, lg_ref, hd_ref, p: int, n: int = 8) -> None:
    assert s.n_past == p
    if p > 0:
        same(s.last_logits(), lg_ref[p - 1])
        same(s.last_hidden(), hd_ref[p - 1])
    else:
        assert s.last_logits() is None and s.last_hidden() is None
    same(s.eval([int(TOKS[p])]), lg_ref[p])
    same(s.eval(TOKS[p + 1:p + n], all_logits=True), lg_ref[p + 1:p + n])


@pytest.mark.parametrize("name,precision", CASES)
@pytest.mark.parametrize("p", [0, 255, 256, 257])
def test_restore_continues_like_fresh(name, precision, p):
    m = model(name, precision)
    lg_ref, hd_ref = ref(name, precision)
    vocab = m.config.vocab_size
    with m.new_session() as s:
        if p:
            s.eval(TOKS[:p])
        snap = s.snapshot()
        assert isinstance(snap, Snapshot) and snap.n_past == p
        # move on over the same positions with other tokens (COW), past a page
        s.eval(other_tokens(p, 300, vocab))
        s.restore(snap)
        check_continuation(s, lg_ref, hd_ref, p)
        s.eval(other_tokens(p + 8, 20, vocab))
        s.restore(snap)  # twice
        check_continuation(s, lg_ref, hd_ref, p)
        with m.new_session() as s2:  # another session of the same model
            s2.eval(TOKS[:40])
            s2.restore(snap)
            check_continuation(s2, lg_ref, hd_ref, p)
        # the source session still works from where it was
        check_continuation(s, lg_ref, hd_ref, p + 8)


@pytest.mark.parametrize("name,precision", [("moe-q8_0", "fast"), ("dense-f32", "exact")])
def test_snapshot_unchanged_after_300_tokens(name, precision):
    """COW: snapshot mid-page, the session writes 300 other tokens (over the
    snapshot's page and into new ones), restore is still exact; so is the
    session's own path (its pages are private copies, not the snapshot's)."""
    m = model(name, precision)
    lg_ref, hd_ref = ref(name, precision)
    with m.new_session() as s:
        s.eval(TOKS[:250])
        snap = s.snapshot()
        tail = np.array(s.eval(other_tokens(250, 300, m.config.vocab_size), all_logits=True))
        s.restore(snap)
        check_continuation(s, lg_ref, hd_ref, 250)
    with m.new_session() as fresh:  # the other tokens' own fresh rows
        fresh.eval(TOKS[:250])
        same(fresh.eval(other_tokens(250, 300, m.config.vocab_size), all_logits=True), tail)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(CASES),
       points=st.lists(st.integers(1, 600), min_size=1, max_size=5, unique=True),
       order=st.randoms(use_true_random=False))
def test_many_snapshots_restore_in_any_order(case, points, order):
    """Snapshots at random points of one session, each followed by other
    tokens written over the following positions; restored in random order,
    each continues like a fresh session."""
    name, precision = case
    m = model(name, precision)
    lg_ref, hd_ref = ref(name, precision)
    snaps = []
    with m.new_session() as s:
        for p in sorted(points):
            if snaps:  # back on the true path: the last snapshot's position
                s.restore(snaps[-1][1])
            s.eval(TOKS[s.n_past:p])
            snaps.append((p, s.snapshot()))
            s.eval(other_tokens(p, 30, m.config.vocab_size))
        order.shuffle(snaps)
        for p, snap in snaps:
            s.restore(snap)
            check_continuation(s, lg_ref, hd_ref, p, n=4)


def test_snapshot_with_pending_verify():
    """A snapshot taken between verify and accept holds all verified rows;
    the accept that follows does not touch it."""
    m = model("moe-f32", "exact")
    lg_ref, hd_ref = ref("moe-f32", "exact")
    with m.new_session() as s:
        s.eval(TOKS[:250])
        s.verify(TOKS[250:260])
        snap = s.snapshot()
        s.accept(3)
        check_continuation(s, lg_ref, hd_ref, 253)
        s.restore(snap)
        check_continuation(s, lg_ref, hd_ref, 260)
        with pytest.raises(ModelError, match="without a verify"):
            s.accept(1)  # restore ends a pending verify


@pytest.mark.parametrize("name,precision", [("dense-q8_0", "fast"), ("moe-f32", "exact")])
def test_snapshot_memory_is_what_differs(name, precision):
    """10 snapshots along a 1000-token session cost, on top of the same
    session without them, exactly: each snapshot's own bytes (its recurrent
    states, last logits + hidden row and page table: checked against the
    config) plus, per snapshot taken mid-page, one copy of the K and V page
    of each attention layer (the session's next write lands in the page it
    shares). Nothing scales with the 1000 positions."""
    m = model(name, precision)
    cfg = m.config
    kinds = cfg.layer_kinds[:cfg.n_layers]
    n_attn, n_gdn = kinds.count("attn"), kinds.count("gdn")
    elem = 2 if precision == "fast" else 4
    page_alloc = cfg.n_kv_heads * PAGE * cfg.head_dim * elem + PAGE_HEADER
    state = rollback_bytes(n_gdn_layers=n_gdn, conv_kernel=cfg.conv_kernel,
                           ssm_state_size=cfg.ssm_state_size,
                           ssm_n_key_heads=cfg.ssm_n_key_heads,
                           ssm_n_value_heads=cfg.ssm_n_value_heads)["per_state"]
    row = 4 * (cfg.vocab_size + cfg.hidden_size)
    points = list(range(100, 1001, 100))  # none is a multiple of 256

    seq = np.concatenate([TOKS, other_tokens(0, 320, cfg.vocab_size)])

    def run(take: bool):
        with m.new_session() as s:
            snaps = []
            for p0, p in zip([0] + points[:-1], points, strict=True):
                s.eval(seq[p0:p])
                if take:
                    snaps.append(s.snapshot())
            s.eval(seq[1000:1010])  # the write after the last snapshot
            return s.counters(), snaps

    base, _ = run(False)
    withs, snaps = run(True)
    assert len(snaps) == 10
    own = sum(sn.nbytes for sn in snaps)
    for sn in snaps:
        pages = -(-sn.n_past // PAGE)
        # states + row + page-table pointers (K and V per attention layer
        # and the nextn head's, when it has entries: none here) + struct
        assert state + row <= sn.nbytes <= state + row + 8 * 2 * n_attn * pages + 256
    cow = 10 * 2 * n_attn * page_alloc
    assert withs["allocs"] - base["allocs"] == 10 * 3 + 10 * 2 * n_attn
    assert withs["alloc_bytes"] - base["alloc_bytes"] == own + cow
    # against what copying the KV would cost: at 1000 positions one copy
    # is 4 pages per K/V per attention layer
    kv_copy = 2 * n_attn * 4 * page_alloc
    assert own + cow < 10 * kv_copy


def test_pages_are_given_back():
    """Every page a session or snapshot takes is freed when the last holder
    goes, in any order (closing the session first, or the snapshots)."""
    gc.collect()
    m = model("dense-q8_0", "fast")
    n_attn = m.config.layer_kinds[:m.config.n_layers].count("attn")
    live0 = kv_live_pages()
    s = m.new_session()
    s.eval(TOKS[:600])  # 3 pages per K/V per attention layer
    assert kv_live_pages() - live0 == 3 * 2 * n_attn
    a = s.snapshot()
    assert kv_live_pages() - live0 == 3 * 2 * n_attn  # shared, not copied
    s.eval(TOKS[:10])  # copies the partial page 2
    assert kv_live_pages() - live0 == 4 * 2 * n_attn
    b = s.snapshot()
    s.restore(a)
    s.close()
    assert kv_live_pages() - live0 == 4 * 2 * n_attn  # a and b hold them
    del a
    gc.collect()
    assert kv_live_pages() - live0 == 3 * 2 * n_attn  # b: pages 0, 1 and its page 2
    s2 = m.new_session()
    s2.restore(b)
    b.close()
    b.close()  # idempotent
    assert kv_live_pages() - live0 == 3 * 2 * n_attn
    s2.close()
    assert kv_live_pages() == live0


def test_restore_errors():
    m = model("dense-q8_0", "fast")
    lg_ref, hd_ref = ref("dense-q8_0", "fast")
    with m.new_session() as s:
        s.eval(TOKS[:100])
        good = s.snapshot()
        # the same file loaded again is another model
        with ds4py.load(os.path.join(MODELS, "dense-q8_0.gguf"), n_threads=2) as m2, \
                m2.new_session() as s2:
            s2.eval(TOKS[:50])
            foreign = s2.snapshot()
        with ds4py.load(os.path.join(MODELS, "moe-q8_0.gguf"), n_threads=2) as m3, \
                m3.new_session() as s3:
            moe = s3.snapshot()
        s.eval(TOKS[100:120])
        for snap in (foreign, moe):
            with pytest.raises(ModelError, match="another model"):
                s.restore(snap)
        with pytest.raises(ModelError, match="needs a Snapshot"):
            s.restore(None)
        with pytest.raises(ModelError, match="needs a Snapshot"):
            s.restore(s)
        closed = s.snapshot()
        closed.close()
        assert closed.closed and "closed" in repr(closed)
        with pytest.raises(ModelError, match="snapshot is closed"):
            s.restore(closed)
        # the failures changed nothing: the session is at 120, then at 100
        check_continuation(s, lg_ref, hd_ref, 120, n=2)
        s.restore(good)
        check_continuation(s, lg_ref, hd_ref, 100)
    with pytest.raises(ModelError, match="closed"):
        s.snapshot()
    with pytest.raises(ModelError, match="closed"):
        s.restore(good)


def test_snapshot_outlives_its_session():
    m = model("moe-q8_0", "fast")
    lg_ref, hd_ref = ref("moe-q8_0", "fast")
    s = m.new_session()
    s.eval(TOKS[:300])
    snap = s.snapshot()
    s.close()
    del s
    gc.collect()
    with m.new_session() as s2:
        s2.restore(snap)
        check_continuation(s2, lg_ref, hd_ref, 300)


@pytest.mark.parametrize("name,precision", [("dense-q8_0", "fast"), ("moe-f32", "exact")])
def test_snapshot_covers_nextn_head(name, precision):
    """The nextn head's KV is part of a snapshot: after the head moves on
    (other rows over the snapshot's page and past it), restore gives back its
    range, and the head's next rows equal those of a session that never
    left (its KV pages are shared with the snapshot, copy-on-write)."""
    m = model(name, precision)
    assert m.nextn_source == "bundled"
    lg_ref, hd_ref = ref(name, precision)
    vocab = m.config.vocab_size
    pos = np.arange(1, 300)

    def primed():
        s = m.new_session()
        s.eval(TOKS[:300])
        # head row p: token p with the trunk's hidden of position p-1
        m.nextn_eval(s, TOKS[1:300], hd_ref[0:299], pos)
        return s

    with primed() as s_ref:
        want_lg, want_hd = (np.array(a) for a in m.nextn_eval(
            s_ref, TOKS[300:310], hd_ref[299:309], np.arange(300, 310)))
    with primed() as s:
        snap = s.snapshot()
        # the head rewinds into the shared page and runs past it
        m.nextn_eval(s, other_tokens(250, 100, vocab), hd_ref[100:200], np.arange(250, 350))
        s.eval(other_tokens(300, 10, vocab))
        assert m.nextn_range(s) == (1, 350)
        s.restore(snap)
        assert m.nextn_range(s) == (1, 300)
        lg, hd = m.nextn_eval(s, TOKS[300:310], hd_ref[299:309], np.arange(300, 310))
        same(lg, want_lg)
        same(hd, want_hd)
        s.restore(snap)  # the snapshot's head KV was not touched either
        lg, _ = m.nextn_eval(s, TOKS[300:310], hd_ref[299:309], np.arange(300, 310))
        same(lg, want_lg)
        check_continuation(s, lg_ref, hd_ref, 300)
