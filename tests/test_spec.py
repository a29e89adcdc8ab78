"""Greedy speculative decoding (ds4py/spec): the output is byte-identical to
serial greedy decoding, whatever the drafter, depth or acceptance pattern.

The reference is written here, independent of the loop: a fresh session,
``eval`` of the prompt, then one ``eval`` per token with ``np.argmax`` (ties
to the lowest id). ``expected`` cuts that sequence the way generation stops
(an EOS id: excluded; ``stop_check`` true: the token included;
``max_tokens``; the context). Every comparison is exact (token ids), and
after each call the session must hold exactly the rows a serial decode
evaluates: its ``n_past`` and its last logits row, bit for bit.

Drafters:
- the model's nextn head (NextnDrafter). On these tiny random models the
  head's drafts are essentially never accepted (measured 0 of ~1000), so it
  exercises rejection at depth 1..7 and the head's bookkeeping;
- Oracle: replays the serial output, optionally corrupted at chosen
  generated indices (every acceptance count 0..k occurs);
- OracleHead: the real head stepping (its KV rows written, chained on its
  own hiddens) but choosing the oracle's tokens, so accepted drafts come
  with head rows that the catch-up must rewrite;
- AlwaysWrong (rejected at the first draft) and Random.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ds4py
from ds4py.spec import (
    NO_DRAFT,
    AdaptivePolicy,
    Drafter,
    DraftError,
    DraftState,
    FixedPolicy,
    NextnDrafter,
    speculative_generate,
)
from ds4py.spec.policy import Policy

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "golden", "models")
SEQ = [int(t) for t in np.load(os.path.join(HERE, "golden", "logits", "sequences.npz"))["s700"]]
CASES = [("dense-q8_0", "fast"), ("moe-q8_0", "fast"), ("dense-f32", "exact"),
         ("moe-f32", "exact")]
PROMPT = SEQ[:24]
N_REF = 64

_models: dict = {}
_refs: dict = {}


def model(name: str, precision: str, n_ctx: int | None = None) -> ds4py.Model:
    key = (name, precision, n_ctx)
    if key not in _models:
        _models[key] = ds4py.load(os.path.join(MODELS, name + ".gguf"), precision=precision,
                                  n_threads=2, n_ctx=n_ctx)
    return _models[key]


class Ref:
    """Serial greedy decoding: tokens[i] and the logits row it was picked from."""

    def __init__(self, m, prompt, n):
        self.prompt = list(prompt)
        toks, rows = [], []
        with m.new_session() as s:
            lg = s.eval(self.prompt)
            for i in range(n):
                rows.append(np.array(lg))
                toks.append(int(np.argmax(lg)))
                if i + 1 < n and s.n_past < m.n_ctx:
                    lg = s.eval([toks[-1]])
        self.tokens, self.logits = toks, np.stack(rows)


def ref(case, prompt=PROMPT, n=N_REF) -> Ref:
    key = (case, tuple(prompt), n)
    if key not in _refs:
        _refs[key] = Ref(model(*case), prompt, n)
    return _refs[key]


def expected(r: Ref, max_tokens, eos=(), stop=None, budget=None):
    """(tokens, finish_reason, rows evaluated after the prompt) of serial
    generation, cut from the serial output."""
    out = []
    limit = max_tokens if budget is None else min(max_tokens, budget)
    if limit <= 0:
        return [], "length", 0
    for t in r.tokens:
        if t in eos:
            return out, "eos", len(out)
        out.append(t)
        if stop is not None and stop(out):
            return out, "stop", len(out) - 1
        if len(out) >= limit:
            return out, "length", len(out) - 1
    raise AssertionError("reference too short")


def check(case, r: Ref, max_tokens, eos=(), stop=None, **kw):
    """Run speculative_generate on a fresh session and compare everything.
    Returns (tokens, stats, the head's range afterwards or None)."""
    m = model(*case)
    with m.new_session() as s:
        toks, stats = speculative_generate(m, r.prompt, max_tokens, eos_ids=eos,
                                           stop_check=stop, session=s, **kw)
        want, reason, rows = expected(r, max_tokens, eos, stop)
        assert toks == want, (kw, stats)
        assert stats["finish_reason"] == reason
        assert s.n_past == len(r.prompt) + rows == stats["n_past"]
        # the session holds exactly what serial decoding evaluated
        np.testing.assert_array_equal(s.last_logits(), r.logits[rows])
        head = m.nextn_range(s) if m.nextn_source else None
        return toks, stats, head


class Oracle(Drafter):
    """Replays the serial output; drafts for generated indices in `corrupt`
    are wrong."""

    name = "oracle"

    def __init__(self, r: Ref, corrupt=(), vocab=512):
        self.r, self.corrupt, self.vocab = r, set(corrupt), vocab

    def token(self, i: int) -> int:
        t = self.r.tokens[i] if i < len(self.r.tokens) else 0
        return (t + 1) % self.vocab if i in self.corrupt else t

    def propose(self, state: DraftState, k: int) -> list[int]:
        g = len(state.generated)  # the next token's generated index
        return [self.token(g + j) for j in range(k)]


class AlwaysWrong(Oracle):
    name = "always-wrong"

    def token(self, i: int) -> int:
        t = self.r.tokens[i] if i < len(self.r.tokens) else 0
        return (t + 1) % self.vocab


class RandomDrafter(Drafter):
    name = "random"

    def __init__(self, seed: int, vocab=512):
        self.rng = np.random.default_rng(seed)
        self.vocab = vocab

    def propose(self, state, k):
        return [int(x) for x in self.rng.integers(0, self.vocab, size=k)]


class OracleHead(NextnDrafter):
    """The real head's steps (KV rows written, chained on its own hidden
    rows), with the oracle's tokens chosen."""

    name = "oracle-head"

    def __init__(self, m, r: Ref, corrupt=()):
        super().__init__(m)
        self.oracle = Oracle(r, corrupt, m.config.vocab_size)

    def _pick(self, logits, j, state):
        return self.oracle.token(len(state.generated) + j)


class Recorder(Policy):
    """Wraps a policy and records what the loop tells it."""

    def __init__(self, inner):
        self.inner, self.enabled = inner, inner.enabled
        self.observed, self.chosen = [], []

    def choose(self, cap):
        k = self.inner.choose(cap)
        self.chosen.append((cap, k))
        return k

    def observe(self, depth, accepted, stopped=False):
        self.observed.append((depth, accepted, stopped))
        self.inner.observe(depth, accepted, stopped)

    @property
    def last_was_probe(self):
        return getattr(self.inner, "last_was_probe", False)


def cheap(d: int) -> float:
    """An injected cost model under which drafting always pays: the adaptive
    policy drafts as deep as its acceptance estimates allow."""
    return 1.0 + 0.01 * d


# ds4's measured round costs in plain-decode units (ds4-notes §4): verify(w)
# = 30.6 + 8.74 w ms vs 37.4 ms plain, draft step h = 0.18.
def ds4_cost(d: int) -> float:
    return 1.0 if d == 0 else (30.6 + 8.74 * (d + 1)) / 37.4 + 0.18 * d


def fresh_head_logits(m, seq, token, hidden_last):
    """The head's draft after a fresh evaluation of `seq` and one catch-up
    call over rows 1..len-1 (what the head must equal after generation)."""
    with m.new_session() as s2:
        _, H = s2.eval(seq, all_logits=True, return_hidden=True)
        H = np.array(H)
        m.nextn_eval(s2, seq[1:], H[:-1], np.arange(1, len(seq)))
        np.testing.assert_array_equal(H[-1], hidden_last)
        return np.array(m.nextn_draft(s2, token, H[-1])[0])


# ------------------------------------------------------------ nextn --


@pytest.mark.parametrize("case", CASES)
def test_nextn_every_depth_identical(case):
    """The bundled head at fixed depths 1..7 and adaptive (measured costs,
    and an injected cost that makes it draft deep): the serial output, and
    the head ends holding the rows a fresh catch-up gives."""
    r = ref(case)
    m = model(*case)
    policies = [FixedPolicy(k) for k in range(1, 8)] + [AdaptivePolicy(),
                                                       AdaptivePolicy(cost=cheap)]
    for pol in policies:
        toks, stats, head = check(case, r, 40, policy=pol)
        assert stats["drafter"] == "nextn" and stats["draft_admitted"]
        if isinstance(pol, FixedPolicy):
            # every round drafts, as deep as the remaining budget allows
            # (the last, with one token left, is a plain step)
            assert stats["draft_rounds"] == stats["rounds"] - 1
            assert max(stats["depth_counts"]) == pol.depth
        # the head holds rows 1..n_past-1
        assert head == (1, stats["n_past"])
    seq = r.prompt + r.tokens[:39]
    with m.new_session() as s:
        toks, stats = speculative_generate(m, r.prompt, 40, session=s, policy=FixedPolicy(3))
        hid = np.array(s.last_hidden())
        got = np.array(m.nextn_draft(s, toks[-1], hid)[0])
    np.testing.assert_array_equal(got, fresh_head_logits(m, seq, toks[-1], hid))


@pytest.mark.parametrize("case", CASES[:2])
@pytest.mark.parametrize("depth", [1, 3, 7])
def test_head_rows_after_accepted_drafts(case, depth):
    """OracleHead: drafts are accepted (some corrupted: every acceptance
    count), the head's chained rows must be replaced by the verify's rows
    when the core primes the accepted ones (at accept); at the end the head
    equals a fresh one-call catch-up over the whole sequence, bit for bit."""
    r = ref(case)
    m = model(*case)
    corrupt = {3, 9, 10, 17, 30}
    with m.new_session() as s:
        d = OracleHead(m, r, corrupt)
        toks, stats = speculative_generate(m, r.prompt, 50, session=s,
                                           policy=FixedPolicy(depth), drafter=d)
        want, _, rows = expected(r, 50)
        assert toks == want
        assert stats["accepted"] > 0
        assert s.nextn_prime and s.nextn_covered
        assert m.nextn_range(s) == (1, s.n_past)
        hid = np.array(s.last_hidden())
        got = np.array(m.nextn_draft(s, toks[-1], hid)[0])
    np.testing.assert_array_equal(
        got, fresh_head_logits(m, r.prompt + want[:-1], toks[-1], hid))


def test_prompt_primes_head_in_prefill():
    """An admitted run's prefill is one eval in which the core primes the
    head (no head call from Python): afterwards the head holds rows 1..299
    and drafts what a fresh catch-up gives."""
    case = CASES[1]
    m = model(*case)
    prompt = SEQ[:300]
    with m.new_session() as s:
        d = NextnDrafter(m)
        toks, stats = speculative_generate(m, prompt, 1, session=s, drafter=d,
                                           policy=FixedPolicy(2))
        assert stats["finish_reason"] == "length" and len(toks) == 1
        assert d.draft_steps == 0 and s.nextn_prime
        assert m.nextn_range(s) == (1, 300)
        hid = np.array(s.last_hidden())
        got = np.array(m.nextn_draft(s, toks[0], hid)[0])
    np.testing.assert_array_equal(got, fresh_head_logits(m, prompt, toks[0], hid))


# ------------------------------------------------ finishing mid-block --


def eos_choices(r: Ref, n: int = 20) -> list[int]:
    """Tokens whose first occurrence in the serial output is within the
    first n, one per first-occurrence index."""
    seen, out = set(), []
    for t in r.tokens[:n]:
        if t not in seen:
            seen.add(t)
            out.append(t)
    return out


@pytest.mark.parametrize("case", CASES)
def test_finish_inside_drafted_block(case):
    """The oracle at depth 7 commits blocks of 8 tokens; max_tokens, an EOS
    id and a stop_check land at every offset inside them. Also with
    corrupted drafts (partial acceptance)."""
    r = ref(case)
    for drafter in (Oracle(r), Oracle(r, corrupt={2, 5, 6, 13})):
        for mt in range(1, 21):
            check(case, r, mt, policy=FixedPolicy(7), drafter=drafter)
        for e in eos_choices(r):
            check(case, r, 30, eos={e}, policy=FixedPolicy(7), drafter=drafter)
        for cut in range(1, 18):
            limit = sum(r.tokens[:cut])
            check(case, r, 30, stop=lambda t, lim=limit: sum(t) >= lim,
                  policy=FixedPolicy(7), drafter=drafter)
    # EOS as the very first token: nothing generated, only the prompt held
    toks, stats, _ = check(case, r, 10, eos={r.tokens[0]}, policy=FixedPolicy(3),
                           drafter=Oracle(r))
    assert toks == [] and stats["finish_reason"] == "eos"
    toks, stats, _ = check(case, r, 0, policy=FixedPolicy(3))
    assert toks == [] and stats["rounds"] == 0


@pytest.mark.parametrize("case", CASES)
def test_bad_and_perfect_drafters(case):
    r = ref(case)
    m = model(*case)
    V = m.config.vocab_size
    for k in range(1, 8):
        _, st_ok, _ = check(case, r, 40, policy=FixedPolicy(k), drafter=Oracle(r, vocab=V))
        # perfect: every round but the last commits k + 1 tokens
        assert st_ok["rounds"] == math.ceil(39 / (k + 1))
        assert st_ok["accepted"] == 39 - st_ok["rounds"]
        _, st_bad, _ = check(case, r, 40, policy=FixedPolicy(k),
                             drafter=AlwaysWrong(r, vocab=V))
        assert st_bad["accepted"] == 0 and st_bad["rounds"] == 39
        check(case, r, 40, policy=FixedPolicy(k), drafter=RandomDrafter(k, V))
    for d in (Oracle(r, vocab=V), AlwaysWrong(r, vocab=V), RandomDrafter(9, V)):
        check(case, r, 40, policy=AdaptivePolicy(cost=cheap), drafter=d)
        check(case, r, 40, policy=AdaptivePolicy(), drafter=d)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(CASES), depth=st.integers(0, 8),
       corrupt=st.sets(st.integers(0, 40), max_size=12),
       max_tokens=st.integers(1, 45), finish=st.sampled_from(["none", "eos", "stop"]),
       where=st.integers(0, 30), head=st.booleans())
def test_random_acceptance_patterns(case, depth, corrupt, max_tokens, finish, where, head):
    """Random corruption patterns (every acceptance count), depths (8 =
    adaptive with the injected cheap cost), budgets and stop points."""
    r = ref(case)
    m = model(*case)
    pol = AdaptivePolicy(cost=cheap) if depth == 8 else FixedPolicy(depth)
    drafter = OracleHead(m, r, corrupt) if head else Oracle(r, corrupt)
    eos, stop = (), None
    if finish == "eos":
        eos = {r.tokens[where]}
    elif finish == "stop":
        limit = sum(r.tokens[:where + 1])
        stop = lambda t: sum(t) >= limit  # noqa: E731
    check(case, r, max_tokens, eos=eos, stop=stop, policy=pol, drafter=drafter)


def test_context_limit_inside_block():
    """n_ctx 48, a 24-token prompt: 24 tokens fit (the last is never
    evaluated); rounds near the end are cut to what still fits."""
    case = ("dense-q8_0", "fast")
    m = model(*case, n_ctx=48)
    r = Ref(m, PROMPT, 24)
    for pol, d in [(FixedPolicy(7), Oracle(r)), (FixedPolicy(5), None),
                   (AdaptivePolicy(cost=cheap), Oracle(r, corrupt={20}))]:
        with m.new_session() as s:
            toks, stats = speculative_generate(m, PROMPT, 100, policy=pol, drafter=d,
                                               session=s)
            assert toks == r.tokens and stats["finish_reason"] == "length"
            assert s.n_past == 47
            np.testing.assert_array_equal(s.last_logits(), r.logits[23])


# --------------------------------------------------------- admission --


def test_admission_no_draft_never_primes_and_later_cannot_draft():
    case = CASES[0]
    m = model(*case)
    r = ref(case)
    with m.new_session() as s:
        toks, stats = speculative_generate(m, r.prompt, 10, policy=NO_DRAFT, session=s)
        assert toks == r.tokens[:10]
        assert not stats["draft_admitted"] and stats["draft_refused"] == "the policy never drafts"
        assert m.nextn_range(s) == (0, 0)  # prefill did not prime the head
        # drafting requested later on the same session: the head lacks the
        # history, so this generation does not draft (and is still exact)
        more = [toks[-1], 5, 6]
        r2 = ref(case, r.prompt + toks[:-1] + more, 20)
        toks2, st2 = speculative_generate(m, more, 20, policy=FixedPolicy(3), session=s)
        assert toks2 == r2.tokens
        assert not st2["draft_admitted"]
        assert "cannot keep this session's history" in st2["draft_refused"]
        assert st2["draft_rounds"] == 0 and m.nextn_range(s) == (0, 0)
        assert not s.nextn_prime
        # and the drafter itself refuses to draft without the history, in
        # the core (the greedy path) and from Python (a subclass's picks)
        state = DraftState(s, s.n_past, toks2[-1], np.array(s.last_hidden()), toks2)
        with pytest.raises(DraftError, match="nextn head does not hold"):
            NextnDrafter(m).propose(state, 2)
        with pytest.raises(DraftError, match="not primed"):
            OracleHead(m, r).propose(state, 2)


def test_admission_continues_a_drafting_session():
    """A session that drafted leaves the head complete: the next generation
    on it (a continuation prompt) is admitted, primes only its own prompt
    rows and stays exact."""
    case = CASES[1]
    m = model(*case)
    r = ref(case)
    with m.new_session() as s:
        toks, st1 = speculative_generate(m, r.prompt, 12, policy=FixedPolicy(2), session=s)
        assert toks == r.tokens[:12] and st1["draft_admitted"]
        more = [toks[-1], 11, 12, 13]
        r2 = ref(case, r.prompt + toks[:-1] + more, 30)
        d = NextnDrafter(m)
        toks2, st2 = speculative_generate(m, more, 30, policy=FixedPolicy(2), drafter=d,
                                          session=s)
        assert toks2 == r2.tokens and st2["draft_admitted"] and st2["draft_rounds"] > 0
        assert m.nextn_range(s) == (1, s.n_past)
        hid = np.array(s.last_hidden())
        got = np.array(m.nextn_draft(s, toks2[-1], hid)[0])
    seq = r2.prompt + toks2[:-1]
    np.testing.assert_array_equal(got, fresh_head_logits(m, seq, toks2[-1], hid))


def test_no_head_means_no_drafting(tmp_path):
    import nextn_files as NF
    trunk = NF.trunk_file(tmp_path, "dense-q8_0")
    with ds4py.load(trunk, n_threads=2) as m:
        r = Ref(m, PROMPT, 20)
        toks, stats = speculative_generate(m, PROMPT, 20)
        assert toks == r.tokens and not stats["draft_admitted"]
        assert "no nextn head" in stats["draft_refused"]
        with pytest.raises(DraftError, match="no nextn"):
            NextnDrafter(m)
        # a drafter that needs no head still drafts on it
        toks, stats = speculative_generate(m, PROMPT, 20, drafter=Oracle(r),
                                           policy=FixedPolicy(4))
        assert toks == r.tokens and stats["accepted"] > 0


def test_drafter_contract_errors():
    case = CASES[0]
    m = model(*case)

    class Short(Drafter):
        def propose(self, state, k):
            return [1] * (k - 1)

    with pytest.raises(DraftError, match="asked for 3 drafts, got 2"):
        speculative_generate(m, PROMPT, 10, drafter=Short(), policy=FixedPolicy(3))

    class OutOfVocab(Drafter):
        def propose(self, state, k):
            return [10**6] * k

    with pytest.raises(ds4py.ModelError, match="out of range"):
        speculative_generate(m, PROMPT, 10, drafter=OutOfVocab(), policy=FixedPolicy(2))
    with pytest.raises(ValueError, match="max_tokens"):
        speculative_generate(m, PROMPT, -1)
    with pytest.raises(ValueError, match="prompt_ids"):
        speculative_generate(m, [], 5)


# ----------------------------------------- policy in the loop (stats) --


def test_stop_round_does_not_update_acceptance():
    """EOS inside a perfectly drafted block: the loop reports the drafts
    committed before it and `stopped`; the policy's EMA sees no failure."""
    case = CASES[0]
    r = ref(case)
    eos = r.tokens[10]  # first occurrence index:
    j = r.tokens.index(eos)
    rec = Recorder(FixedPolicy(7))
    toks, stats, _ = check(case, r, 40, eos={eos}, policy=rec, drafter=Oracle(r))
    depth, acc, stopped = rec.observed[-1]
    assert stopped and depth == 7
    # the last round started at generated index 8*R+1 (R full rounds before)
    start = 1 + 8 * (len(rec.observed) - 1)
    assert acc == j - start
    assert all(not s for _, _, s in rec.observed[:-1])
    # the same through AdaptivePolicy: the EMA after the run equals one that
    # saw only the full rounds' successes
    pol = AdaptivePolicy(cost=cheap)
    check(case, r, 40, eos={eos}, policy=pol, drafter=Oracle(r))
    want = AdaptivePolicy(cost=cheap)
    for d, a, s in rec.observed[:-1]:
        want.choose(7)      # a round passes (the estimate ages per round)
        want.observe(d, a, s)
    want.choose(7)
    want.observe(7, acc, True)
    assert pol.p == want.p


def test_regime_change_end_to_end():
    """A genuine mid-generation regime change on a real model: the drafter
    is useless for the first 150 generated tokens, then perfect. With ds4's
    cost ratios injected, the policy latches at depth 0, keeps probing, and
    drafts again after the change (bound: the first 4 probes after the
    change, at most 257 rounds apart, lift p1 over the threshold, see
    test_policy.test_regime_change_resumes_drafting). Output stays exact."""
    case = CASES[0]
    N, SWITCH = 1500, 150  # room after the resumption for a tail of drafting rounds
    r = ref(case, PROMPT, N)

    class Switch(Oracle):
        def token(self, i):
            t = self.r.tokens[i] if i < len(self.r.tokens) else 0
            return t if i >= SWITCH else (t + 1) % self.vocab

    rec = Recorder(AdaptivePolicy(cost=ds4_cost))
    toks, stats, _ = check(case, r, N, policy=rec, drafter=Switch(r))
    rounds = rec_rounds(rec)
    before = [(k, a) for g0, k, a in rounds if g0 + k <= SWITCH]
    after = [(g0, k, a) for g0, k, a in rounds if g0 >= SWITCH]
    assert sum(a for _, a in before) == 0
    assert sum(1 for k, _ in before[20:] if k == 0) > 0.9 * len(before[20:])  # latched
    # resumption: a drafting round deeper than a probe
    idx = next(i for i, (_, k, _) in enumerate(after) if k >= 2)
    assert idx <= 4 * 257 + 1
    tail = after[idx:]
    assert len(tail) > 20 and all(k > 0 for _, k, _ in tail)
    assert sum(a for *_, a in tail) / len(tail) > 2  # tokens flow again


def rec_rounds(rec) -> list[tuple[int, int, int]]:
    """(generated index at the round's start, depth, accepted) per round the
    policy chose (observe() is called for drafting rounds only, in order)."""
    obs = iter(rec.observed)
    g, out = 1, []
    for _, k in rec.chosen:
        a = next(obs)[1] if k else 0
        out.append((g, k, a))
        g += a + 1
    return out


def test_never_pays_end_to_end():
    """The golden models' random head is never accepted: with ds4's cost
    ratios injected, the rounds the policy chooses cost < 5% more than
    plain decoding of the same tokens."""
    for case in CASES[:2]:
        m = model(*case)
        rec = Recorder(AdaptivePolicy(cost=ds4_cost))
        with m.new_session() as s:
            toks, stats = speculative_generate(m, PROMPT, 1000, policy=rec, session=s)
        assert len(toks) == 1000
        r = ref(case, PROMPT, 1000)
        assert toks == r.tokens
        cost = sum(ds4_cost(k) for _, k in rec.chosen)
        cost += stats["rounds"] - len(rec.chosen)  # the last round: no choice, plain
        plain = len(toks) - 1  # one plain step per token after the first
        assert stats["accepted"] <= 5  # the head stays useless
        assert cost / plain < 1.05, (cost / plain, stats["depth_counts"])
        assert stats["probes"] >= 5
