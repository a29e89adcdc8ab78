"""Head priming (Session.nextn_prime; csrc/session.c "priming", csrc/forward/
nextn.c KV-only rows) and the head's state across verify/accept and
snapshot/restore.

Everything is checked BIT for bit (no tolerance: batch invariance and
exact rollback are promises of the core, DESIGN.md invariants 1 and 3)
against the plainest possible reference: a session that evaluates the same
tokens with no priming, then gives the head its rows one at a time through
full ``nextn_eval`` calls (logits and all), i.e. token-by-token priming.
What is compared is what drafting reads next: the head's range, the next
draft's logits and output hidden, and the target's next logits.
"""

from __future__ import annotations

import os

import nextn_files as NF
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ds4py
from ds4py import ModelError

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "golden", "models")
TOKS = np.load(os.path.join(HERE, "golden", "logits", "sequences.npz"))["s700"].astype(np.int32)

CASES = [("dense-q8_0", "fast"), ("moe-q4_k_m", "fast"), ("moe-f32", "exact"),
         ("dense-bf16", "exact")]

_models: dict = {}
_refs: dict = {}


def model(name: str, precision: str = "fast") -> ds4py.Model:
    if (name, precision) not in _models:
        _models[name, precision] = ds4py.load(os.path.join(MODELS, name + ".gguf"),
                                              precision=precision, n_threads=2)
    return _models[name, precision]


def bits(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def same(a, b) -> None:
    np.testing.assert_array_equal(bits(a), bits(b))


def probe(m, s, p: int) -> dict:
    """What drafting at position p reads from session s (which holds p
    tokens of TOKS): a draft of TOKS[p] with the trunk's last hidden, then
    the target's logits for TOKS[p], then a draft at p+1 (after that eval
    primed row p over the draft's row)."""
    out = {"range": m.nextn_range(s), "n_past": s.n_past}
    lg, hd = m.nextn_draft(s, int(TOKS[p]), s.last_hidden())
    out["draft"], out["draft_h"] = np.array(lg), np.array(hd)
    out["target"] = np.array(s.eval([int(TOKS[p])]))
    lg, _ = m.nextn_draft(s, int(TOKS[p + 1]), s.last_hidden())
    out["draft2"] = np.array(lg)
    return out


def reference(name: str, precision: str, p: int) -> dict:
    """probe() after the plainest priming: TOKS[:p] evaluated with priming
    off, then head rows 1..p-1 given one full nextn_eval call each."""
    key = (name, precision, p)
    if key not in _refs:
        m = model(name, precision)
        with m.new_session() as s:
            _, h = s.eval(TOKS[:p], all_logits=True, return_hidden=True)
            h = np.array(h)
            for q in range(1, p):
                m.nextn_eval(s, TOKS[q:q + 1], h[q - 1:q], [q])
            r = probe(m, s, p)
        assert r["range"] == (1, p)
        _refs[key] = r
    return _refs[key]


def check(got: dict, want: dict) -> None:
    assert got["range"] == want["range"] and got["n_past"] == want["n_past"]
    for k in ("draft", "draft_h", "target", "draft2"):
        same(got[k], want[k])


# ------------------------------------------------------------ prefill --


@pytest.mark.parametrize("name,precision", CASES)
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_prefill_priming_equals_one_row_priming(name, precision, data):
    """A prompt of 300 tokens (past the 256-row chunk and the 256-position
    KV page) evaluated with priming on, split into evals anywhere, with or
    without all rows, at any thread count: the head is exactly
    token-by-token primed (the reference ran on 2 threads)."""
    p = 300
    want = reference(name, precision, p)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, p - 1), max_size=4))))
    m = ds4py.load(os.path.join(MODELS, name + ".gguf"), precision=precision,
                   n_threads=data.draw(st.sampled_from([1, 3])))
    with m, m.new_session(nextn_prime=True) as s:
        for a, b in zip([0] + cuts, cuts + [p], strict=True):
            s.eval(TOKS[a:b], all_logits=data.draw(st.booleans()))
        assert s.nextn_covered
        check(probe(m, s, p), want)


@pytest.mark.parametrize("steps", [20, 150])  # 150: waiting rows cross two full batches of 64
def test_decode_steps_prime_like_a_prompt(steps):
    """One-token evals (the decode path, split-K attention past a page)
    prime the head as one prompt eval does: the rows the core defers
    (csrc/session.c "Deferred rows") reach it before the draft reads it."""
    m = model("dense-q8_0")
    with m.new_session(nextn_prime=True) as s:
        s.eval(TOKS[:250])
        for t in TOKS[250:250 + steps]:
            s.eval([int(t)])
        check(probe(m, s, 250 + steps), reference("dense-q8_0", "fast", 250 + steps))


# ------------------------------------------------------ deferred rows --


def head_bytes(m, s, fn) -> int:
    """Weight bytes the session read while fn() ran."""
    before = s.counters()["weight_bytes"]
    fn()
    return s.counters()["weight_bytes"] - before


def test_decode_rows_wait_and_go_to_the_head_in_batches_of_64():
    """The point of deferring: a plain decode step of a priming session
    reads exactly the weights of a step without priming (no head weights
    per token), and the head's weights are read once per 64 waiting rows.
    The counters are the core's own (every matvec adds its weight bytes),
    so this fails if a step primes its row at once."""
    m = model("dense-q8_0")
    with m.new_session() as plain, m.new_session(nextn_prime=True) as s:
        plain.eval(TOKS[:100])
        s.eval(TOKS[:100])  # rows 64..99 wait: 36 of them
        per_step = head_bytes(m, plain, lambda: plain.eval([int(TOKS[100])]))
        assert head_bytes(m, s, lambda: s.eval([int(TOKS[100])])) == per_step
        for t in TOKS[101:127]:  # 63 rows wait
            assert head_bytes(m, s, lambda t=t: s.eval([int(t)])) == per_step
        flush = head_bytes(m, s, lambda: s.eval([int(TOKS[127])]))  # the 64th
        assert flush > per_step
        # a draft catches up the rows that wait (one more batch call) first
        s.eval([int(TOKS[128])])
        assert m.nextn_range(s) == (1, 129)  # reported as caught up meanwhile
        check(probe(m, s, 129), reference("dense-q8_0", "fast", 129))


def test_catch_up_gives_the_waiting_rows_now():
    """nextn_catch_up hands the waiting rows to the head in one batch call
    (reading the head's weights once), returns how many there were, and
    changes nothing a draft sees: the next draft and the target equal
    those of a session that caught up inside the draft. With nothing
    waiting it returns 0 and reads nothing."""
    m = model("dense-q8_0")
    with m.new_session(nextn_prime=True) as s:
        s.eval(TOKS[:70])                       # rows 64..69 wait
        for t in TOKS[70:75]:
            s.eval([int(t)])                    # and 5 more
        read = head_bytes(m, s, lambda: s.nextn_catch_up())
        assert read > 0
        assert s.nextn_catch_up() == 0
        assert head_bytes(m, s, lambda: s.nextn_catch_up()) == 0
        assert m.nextn_range(s) == (1, 75)
        check(probe(m, s, 75), reference("dense-q8_0", "fast", 75))
    with m.new_session(nextn_prime=True) as s:
        s.eval(TOKS[:70])
        for t in TOKS[70:75]:
            s.eval([int(t)])
        assert s.nextn_catch_up() == 11
    with m.new_session() as s:                  # priming off: nothing ever waits
        s.eval(TOKS[:10])
        assert s.nextn_catch_up() == 0


def test_snapshot_with_waiting_rows_carries_them():
    """A snapshot taken while rows wait holds the head caught up: restored
    into a fresh session it drafts what a fresh evaluation drafts."""
    m = model("dense-q8_0")
    with m.new_session(nextn_prime=True) as s:
        s.eval(TOKS[:70])
        for t in TOKS[70:80]:
            s.eval([int(t)])
        snap = s.snapshot()
    assert snap.nextn_covered
    with m.new_session(nextn_prime=True) as s2:
        s2.restore(snap)
        check(probe(m, s2, 80), reference("dense-q8_0", "fast", 80))


def test_restore_drops_the_replaced_histories_waiting_rows():
    """Rows that wait when a restore replaces the history never reach the
    head (they would land at positions past the snapshot's and misplace
    the next draft)."""
    m = model("dense-q8_0")
    with m.new_session(nextn_prime=True) as s:
        s.eval(TOKS[:90])
        snap = s.snapshot()
        for t in TOKS[200:210]:  # other tokens, waiting
            s.eval([int(t)])
        s.restore(snap)
        assert m.nextn_range(s) == (1, 90)
        check(probe(m, s, 90), reference("dense-q8_0", "fast", 90))


def test_priming_off_catches_the_head_up_first():
    """Turning priming off gives the head the rows committed while it was
    on, so turning it back on later finds the whole history."""
    m = model("dense-q8_0")
    with m.new_session(nextn_prime=True) as s:
        s.eval(TOKS[:30])
        s.eval([int(TOKS[30])])
        s.nextn_prime = False
        assert m.nextn_range(s) == (1, 31)
        s.nextn_prime = True
        s.eval(TOKS[31:40])
        check(probe(m, s, 40), reference("dense-q8_0", "fast", 40))


def test_kv_only_rows_equal_full_rows_and_skip_the_lm_head():
    """nextn_eval(kv_only=True) writes the same KV entries as a full call
    (the next draft is bit-equal), returns nothing, and reads fewer weight
    bytes than the full call by at least the LM head (the point: no
    logits row per primed token)."""
    m = model("dense-q8_0")
    p = 100
    with m.new_session() as s:
        _, h = s.eval(TOKS[:p], all_logits=True, return_hidden=True)
        h = np.array(h)
    cost, drafts = {}, {}
    for kv_only in (False, True):
        with m.new_session() as s:
            s.eval(TOKS[:p])
            before = s.counters()["weight_bytes"]
            r = m.nextn_eval(s, TOKS[1:p], h[:-1], np.arange(1, p), kv_only=kv_only)
            cost[kv_only] = s.counters()["weight_bytes"] - before
            if kv_only:
                assert r is None
            assert m.nextn_range(s) == (1, p)
            drafts[kv_only] = [np.array(a) for a in m.nextn_draft(s, int(TOKS[p]), h[-1])]
    same(drafts[True][0], drafts[False][0])
    same(drafts[True][1], drafts[False][1])
    with ds4py.gguf.open(os.path.join(MODELS, "dense-q8_0.gguf")) as f:
        lm = "output.weight" if "output.weight" in f.tensors else "token_embd.weight"
        lm_bytes = f.tensors[lm].nbytes
    assert cost[True] + lm_bytes <= cost[False], (cost, lm_bytes)


# ------------------------------------------------------ verify / accept --


@pytest.mark.parametrize("name,precision", [("dense-q8_0", "fast"), ("moe-f32", "exact")])
def test_accept_every_k_equals_fresh(name, precision):
    """A speculative round on a primed session crossing the KV page: three
    chained drafts (head rows from the head's own hiddens), verify of 9
    tokens at 250..258, accept(k): for every k the next draft logits, the
    next target logits and the draft after that are bit-identical to a
    fresh session that evaluated the 250 + k tokens (token-by-token primed),
    so the catch-up replaced every drafted row and cut nothing it needed."""
    m = model(name, precision)
    p0, n = 250, 9
    with m.new_session(nextn_prime=True) as s:
        s.eval(TOKS[:p0])
        snap = s.snapshot()
        for k in range(1, n + 1):
            s.restore(snap)
            tok, hid = int(TOKS[p0]), s.last_hidden()
            for _ in range(3):
                lg, hid = m.nextn_draft(s, tok, hid)
                tok = int(np.argmax(lg))
            assert m.nextn_range(s) == (1, p0 + 3)
            s.verify(TOKS[p0:p0 + n])
            s.accept(k)
            assert s.nextn_covered
            check(probe(m, s, p0 + k), reference(name, precision, p0 + k))


def test_rows_of_a_verify_without_accept_are_primed_by_the_next_eval():
    m = model("dense-q8_0")
    with m.new_session(nextn_prime=True) as s:
        s.eval(TOKS[:40])
        s.verify(TOKS[40:46])
        assert m.nextn_range(s) == (1, 40)  # the 6 rows wait for their accept
        s.verify(TOKS[46:50])       # a verify after a verify keeps the first's rows
        s.eval(TOKS[50:60])
        check(probe(m, s, 60), reference("dense-q8_0", "fast", 60))


def test_snapshot_between_verify_and_accept():
    """The snapshot holds all verified rows, the head's included; the
    accept that follows still cuts the head back exactly."""
    m = model("dense-q8_0")
    with m.new_session(nextn_prime=True) as s:
        s.eval(TOKS[:40])
        s.verify(TOKS[40:48])
        snap = s.snapshot()
        assert snap.nextn_covered
        s.accept(3)
        check(probe(m, s, 43), reference("dense-q8_0", "fast", 43))
        s.restore(snap)
        check(probe(m, s, 48), reference("dense-q8_0", "fast", 48))


# ------------------------------------------------------ snapshot / restore --


@pytest.mark.parametrize("name,precision", [("moe-q4_k_m", "fast"), ("dense-bf16", "exact")])
def test_restore_keeps_draft_history(name, precision):
    """A prefix-cache hit: a snapshot of a primed session, restored into a
    fresh primed session (and back into its own after it moved on, with
    drafts over the shared page), drafts what a fresh evaluation drafts,
    and keeps priming correctly from there."""
    m = model(name, precision)
    with m.new_session(nextn_prime=True) as s:
        s.eval(TOKS[:300])
        snap = s.snapshot()
        assert snap.nextn_covered
        m.nextn_draft(s, 7, s.last_hidden())
        s.eval(TOKS[300:320] * 0 + 5)  # over the snapshot's last page
        s.restore(snap)
        check(probe(m, s, 300), reference(name, precision, 300))
    with m.new_session(nextn_prime=True) as s2:
        s2.restore(snap)
        assert s2.nextn_covered and m.nextn_range(s2) == (1, 300)
        check(probe(m, s2, 300), reference(name, precision, 300))
    with m.new_session(nextn_prime=True) as s3:
        s3.restore(snap)
        s3.eval(TOKS[300:310])
        check(probe(m, s3, 310), reference(name, precision, 310))
    with m.new_session() as s4:  # priming off: restore is plain
        s4.restore(snap)
        assert m.nextn_range(s4) == (1, 300)


def test_priming_session_refuses_a_snapshot_without_head_history():
    m = model("dense-q8_0")
    with m.new_session() as s:
        s.eval(TOKS[:30])
        snap = s.snapshot()
    assert not snap.nextn_covered
    with m.new_session(nextn_prime=True) as s2:
        s2.eval(TOKS[:5])
        with pytest.raises(ModelError, match=r"nextn head holds positions \[0, 0\), not all "
                                             r"of \[1, 30\).*without head priming"):
            s2.restore(snap)
        assert s2.n_past == 5 and s2.nextn_covered  # unchanged


# ------------------------------------------------------------ admission --


def test_turning_priming_on_needs_the_whole_history():
    m = model("dense-q8_0")
    with m.new_session() as s:
        s.eval(TOKS[:1])
        s.nextn_prime = True  # at n_past 1 the head needs no row yet
        s.eval(TOKS[1:20])
        check(probe(m, s, 20), reference("dense-q8_0", "fast", 20))
    with m.new_session() as s:
        s.eval(TOKS[:20])
        with pytest.raises(ModelError, match=r"holds 20 tokens but the nextn head holds "
                                             r"positions \[0, 0\), not all of \[1, 20\)"):
            s.nextn_prime = True
        assert not s.nextn_prime
        # caught up by hand, the session may prime from here on
        _, h = s.eval(TOKS[20:21], return_hidden=True)
        with m.new_session() as r:
            _, hh = r.eval(TOKS[:21], all_logits=True, return_hidden=True)
            hh = np.array(hh)
        m.nextn_eval(s, TOKS[1:21], hh[:-1], np.arange(1, 21), kv_only=True)
        s.nextn_prime = True
        s.eval(TOKS[21:30])
        check(probe(m, s, 30), reference("dense-q8_0", "fast", 30))
    with m.new_session() as s:
        s.eval(TOKS[:1])
        s.verify(TOKS[1:3])
        with pytest.raises(ModelError, match=r"a verify is waiting for its accept"):
            s.nextn_prime = True
        with pytest.raises(ModelError, match=r"must be a bool"):
            s.nextn_prime = 1


def test_priming_needs_a_head(tmp_path):
    trunk = NF.trunk_file(tmp_path, "dense-q8_0")
    with ds4py.load(trunk, n_threads=1) as m:
        with pytest.raises(ModelError, match=r"head priming: the model has no nextn"):
            m.new_session(nextn_prime=True)
        with m.new_session() as s:
            assert not s.nextn_covered or s.n_past <= 1


def test_no_allocation_in_primed_decode():
    """Priming adds no allocation to the decode path inside a KV page."""
    m = model("dense-q8_0")
    with m.new_session(nextn_prime=True) as s:
        s.eval(TOKS[:20])
        s.eval([int(TOKS[20])])
        before = s.counters()["allocs"]
        for t in TOKS[21:40]:
            s.eval([int(t)])
        assert s.counters()["allocs"] == before
