"""ds4py.sampling against (1) an independent pure-Python reference of
llama.cpp's sampler stages written here from the definitions in
src/llama-sampler.cpp (loops over lists, float32 scalar arithmetic where
llama.cpp uses float, float64 where it uses double), (2) the committed
fixture tests/golden/sampling/ recorded from llama.cpp itself
(tests/reference/make_sampling_fixtures.py), and (3) known values of
std::mt19937 / std::uniform_real_distribution<double>.

Nothing here computes an expected value with the code under test.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ds4py import sampling as S

F32 = np.float32
GOLDEN = Path(__file__).resolve().parent / "golden" / "sampling"

# A hypothesis example runs the reference in pure Python over <= 300 tokens.
FAST = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ============================================================ reference ==
# Candidates are lists of (id, np.float32 logit); "srt" is llama.cpp's
# cur_p->sorted. Sorting is by (logit desc, id asc), the order ds4py
# documents for ties (llama.cpp's own order among ties is unspecified).

def expf(v) -> F32:
    # glibc's expf is correctly rounded but for rare cases: exp in double,
    # rounded once to float.
    return F32(math.exp(float(v)))


def logf(v) -> F32:
    return F32(math.log(float(F32(v))))


def ref_sort(cands):
    return sorted(cands, key=lambda t: (-float(t[1]), t[0]))


def ref_bias(cands, bias):
    return [(i, F32(lg + F32(bias[i])) if i in bias else lg) for i, lg in cands]


def ref_penalties(cands, window, repeat, freq, present):
    counts = Counter(int(t) for t in window)
    out = []
    for i, lg in cands:
        c = counts.get(i, 0)
        if c:
            lg = F32(lg * F32(repeat)) if lg <= 0 else F32(lg / F32(repeat))
            lg = F32(lg - F32(F32(F32(c) * F32(freq)) + F32(present)))
        out.append((i, lg))
    return out


def ref_top_k(cands, srt, k):
    if k <= 0:
        return cands, srt
    k = min(k, len(cands))
    return (cands if srt else ref_sort(cands))[:k], True


def ref_top_p(cands, srt, p, min_keep):
    if p >= 1.0:
        return cands, srt
    mx = max(lg for _, lg in cands)
    e = {i: expf(F32(lg - mx)) for i, lg in cands}
    s = F32(0)
    for i, _ in cands:  # float running sum, in the current order
        s = F32(s + e[i])
    order = cands if srt else ref_sort(cands)
    cum = F32(0)
    for j, (i, _) in enumerate(order):
        cum = F32(cum + F32(e[i] / s))
        if cum >= F32(p) and j + 1 >= min_keep:
            return order[: j + 1], True
    return order, True


def ref_min_p(cands, srt, p, min_keep):
    if p <= 0.0 or not cands:
        return cands, srt
    if not srt:
        mx = max(max(lg for _, lg in cands), -np.finfo(F32).max)
        thr = F32(F32(mx) + logf(p))
        kept = [(i, lg) for i, lg in cands if lg >= thr]
        if kept and len(kept) >= min_keep:
            return kept, False
        cands = ref_sort(cands)
    thr = F32(cands[0][1] + logf(p))
    j = 1
    while j < len(cands):
        if cands[j][1] < thr and j >= min_keep:
            break
        j += 1
    return cands[:j], True


def ref_temp(cands, srt, t):
    if t == 1.0:
        return cands, srt
    if t <= 0.0:  # all but the first maximum -> -inf
        best = 0
        for j in range(1, len(cands)):
            if cands[j][1] > cands[best][1]:
                best = j
        return [(i, lg if j == best else F32(-np.inf)) for j, (i, lg) in enumerate(cands)], srt
    return [(i, F32(lg / F32(t))) for i, lg in cands], srt


def ref_stages(logits, params: S.SamplingParams, window):
    """Candidate set after each stage: [(ids, logits, sorted)] x 6."""
    cands = ref_bias([(i, F32(v)) for i, v in enumerate(logits)], dict(params.logit_bias))
    snaps = [(cands, False)]
    if params.repeat_last_n > 0 and not (params.repeat_penalty == 1.0 and
                                         params.frequency_penalty == 0.0 and
                                         params.presence_penalty == 0.0):
        cands = ref_penalties(cands, list(window)[-params.repeat_last_n:], params.repeat_penalty,
                              params.frequency_penalty, params.presence_penalty)
    snaps.append((cands, False))
    srt = False
    cands, srt = ref_top_k(cands, srt, params.top_k)
    snaps.append((cands, srt))
    cands, srt = ref_top_p(cands, srt, params.top_p, params.min_keep)
    snaps.append((cands, srt))
    cands, srt = ref_min_p(cands, srt, params.min_p, params.min_keep)
    snaps.append((cands, srt))
    cands, srt = ref_temp(cands, srt, params.temperature)
    snaps.append((cands, srt))
    return [(np.array([i for i, _ in c], dtype=np.int64),
             np.array([lg for _, lg in c], dtype=F32), s) for c, s in snaps]


def ref_dist(ids, logits):
    """The dist sampler's distribution: weights expf(lg - max), normalised in
    double. Returns (ids, probabilities, running double sums)."""
    mx = max(logits)
    w = [float(expf(F32(lg - mx))) for lg in logits]
    run, cs = 0.0, []
    for v in w:
        run += v
        cs.append(run)
    return ids, np.array(w) / run, np.array(cs)


def ref_draw(ids, logits, u):
    _, _, cs = ref_dist(ids, logits)
    tgt = cs[-1] * u
    for j, v in enumerate(cs):
        if v >= tgt:
            return int(ids[j])
    raise AssertionError("unreachable")


def module_stages(logits, params: S.SamplingParams, window):
    """The same six snapshots from ds4py's stage functions."""
    x = np.array(logits, dtype=F32)
    bias = dict(params.logit_bias)
    bids = np.array(sorted(bias), dtype=np.int64)
    S.apply_logit_bias(x, bids, np.array([bias[t] for t in sorted(bias)], dtype=F32))
    ids = np.arange(x.shape[0], dtype=np.int32)
    snaps = [(ids, x.copy(), False)]
    if params.penalties_on:
        S.apply_penalties(x, list(window)[-params.repeat_last_n:], params.repeat_penalty,
                          params.frequency_penalty, params.presence_penalty)
    snaps.append((ids, x.copy(), False))
    c = S.Candidates(ids, x, False)
    for stage in (lambda c: S.top_k(c, params.top_k),
                  lambda c: S.top_p(c, params.top_p, params.min_keep),
                  lambda c: S.min_p(c, params.min_p, params.min_keep),
                  lambda c: S.temperature(c, params.temperature)):
        c = stage(c)
        snaps.append((c.ids, c.logits, c.sorted))
    return snaps


STAGES = ("bias", "penalties", "top_k", "top_p", "min_p", "temp")


def assert_same_stages(got, want):
    for name, (gi, gl, gs), (wi, wl, ws) in zip(STAGES, got, want, strict=True):
        assert gs == ws, f"{name}: sorted {gs} != {ws}"
        np.testing.assert_array_equal(np.asarray(gi, dtype=np.int64),
                                      np.asarray(wi, dtype=np.int64), err_msg=name)
        # Same float32 operations in the same order: bit-identical.
        np.testing.assert_array_equal(np.asarray(gl, F32).view(np.uint32),
                                      np.asarray(wl, F32).view(np.uint32), err_msg=name)


# ============================================================ strategies ==
@st.composite
def logit_rows(draw, max_n=300):
    n = draw(st.integers(1, max_n))
    mode = draw(st.sampled_from(["ties", "normal", "peaked"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if mode == "ties":  # few distinct values: ties everywhere, incl. at cut-offs
        vals = rng.choice(np.array([-3.0, -1.0, 0.0, 0.5, 2.0, 2.0, 7.25]), n)
    elif mode == "normal":
        vals = rng.standard_normal(n) * draw(st.sampled_from([0.1, 1.0, 4.0]))
    else:
        vals = rng.standard_normal(n) * 2.0
        vals[rng.integers(0, n, 3)] += 9.0
    x = vals.astype(F32)
    # Some -inf (what a -inf bias or a model's masked logits give), but
    # never all of them.
    if n > 1 and draw(st.booleans()):
        dead = rng.random(n) < 0.2
        dead[int(np.argmax(x))] = False
        x[dead] = -np.inf
    return x


@st.composite
def params_for(draw, n):
    bias = {}
    if draw(st.booleans()):
        for t in draw(st.lists(st.integers(0, n - 1), max_size=5, unique=True)):
            bias[t] = draw(st.sampled_from([-np.inf, -5.0, -0.5, 0.25, 3.0, 12.0]))
    return S.SamplingParams(
        temperature=draw(st.sampled_from([0.0, -1.0, 0.3, 0.8, 1.0, 1.7])),
        top_k=draw(st.one_of(st.sampled_from([-1, 0, 1, 40]), st.integers(1, n + 3))),
        top_p=draw(st.one_of(st.sampled_from([0.0, 0.5, 0.95, 1.0]),
                             st.floats(0.0, 1.0, width=32))),
        min_p=draw(st.one_of(st.sampled_from([0.0, 0.05, 1.0]), st.floats(0.0, 1.0, width=32))),
        repeat_penalty=draw(st.sampled_from([1.0, 1.1, 1.5, 0.8])),
        repeat_last_n=draw(st.sampled_from([0, 1, 8, 64])),
        frequency_penalty=draw(st.sampled_from([0.0, 0.3, -0.2])),
        presence_penalty=draw(st.sampled_from([0.0, 0.5, -1.0])),
        logit_bias=bias,
        min_keep=draw(st.sampled_from([0, 0, 1, 3])),
        seed=draw(st.integers(0, 2**32 - 1)),
    )


def finite_rows_left(stages) -> bool:
    """A -inf bias can leave no finite logit; the Sampler refuses that row."""
    return bool(np.isfinite(stages[1][1]).any())


# ============================================================== stages ==
@FAST
@given(st.data())
def test_stages_match_reference(data):
    x = data.draw(logit_rows())
    p = data.draw(params_for(x.shape[0]))
    window = data.draw(st.lists(st.integers(0, x.shape[0] - 1), max_size=80))
    with np.errstate(invalid="ignore"):  # all-banned rows give NaN; skipped
        want = ref_stages(x, p, window)
    if not finite_rows_left(want):
        return
    assert_same_stages(module_stages(x, p, window), want)


@FAST
@given(st.data())
def test_sampler_matches_reference_draws(data):
    x = data.draw(logit_rows(max_n=200))
    p = data.draw(params_for(x.shape[0]))
    window = data.draw(st.lists(st.integers(0, x.shape[0] - 1), max_size=80))
    with np.errstate(invalid="ignore"):
        want = ref_stages(x, p, window)
    if not finite_rows_left(want):
        with pytest.raises(ValueError, match="-inf"):
            S.Sampler(p, x.shape[0]).sample(x, history=window)
        return
    s = S.Sampler(p, x.shape[0])
    s.accept_many(window)
    ids, lg, _ = want[-1]
    if p.greedy:
        # The argmax of the biased, penalised logits, lowest id on ties.
        pen = want[1][1]
        best = int(np.flatnonzero(pen == pen.max())[0])
        assert [s.sample(x) for _ in range(3)] == [best] * 3
        return
    # Same seed => the same uniforms as std::mt19937 (checked below).
    rng = S.Mt19937(p.seed)
    for _ in range(5):
        assert s.sample(x) == ref_draw(ids, lg, rng.uniform())
    # history= gives what accept() gave.
    s2 = S.Sampler(p, x.shape[0])
    rng2 = S.Mt19937(p.seed)
    assert s2.sample(x, history=window) == ref_draw(ids, lg, rng2.uniform())


def test_sampler_does_not_modify_logits():
    rng = np.random.default_rng(3)
    x = rng.standard_normal(500).astype(F32)
    x.setflags(write=False)  # a read-only view, like a core-owned buffer
    keep = x.copy()
    p = S.SamplingParams(logit_bias={1: 3.0, 2: -np.inf}, repeat_penalty=1.3,
                         frequency_penalty=0.2, presence_penalty=0.1, seed=5)
    s = S.Sampler(p, 500)
    s.accept_many([1, 3, 3, 7])
    for _ in range(3):
        s.sample(x)
    s.distribution(x)
    np.testing.assert_array_equal(x, keep)


# ========================================================= edge cases ==
def test_top_p_stops_when_sum_equals_p():
    # Two equal tokens of probability 0.5 each: llama.cpp's `cum_sum >= p`
    # keeps one at p = 0.5 (the lower id, ds4py's tie order).
    c = S.top_p(S.Candidates.full(np.array([0.0, 0.0, -np.inf], dtype=F32)), 0.5)
    assert c.ids.tolist() == [0] and c.sorted
    assert ref_top_p([(0, F32(0)), (1, F32(0)), (2, F32(-np.inf))], False, 0.5, 0)[0] == \
        [(0, F32(0))]


def test_draw_boundary_takes_the_earlier_token():
    # u * sum landing exactly on a running sum: `sum_run >= sum_tgt` picks
    # the token that reaches it.
    c = S.Candidates(np.array([5, 9]), np.array([0.0, 0.0], dtype=F32), True)
    assert S.draw(c, 0.5) == 5 == ref_draw([5, 9], [F32(0), F32(0)], 0.5)
    assert S.draw(c, 0.5000001) == 9
    assert S.draw(c, 0.0) == 5
    assert S.draw(S.Candidates(np.array([5, 9]), np.array([-np.inf, 0.0], dtype=F32)), 0.0) == 9


def test_min_p_unsorted_falls_back_for_min_keep():
    # Unsorted min-p keeps 2 tokens; min_keep 4 sends llama.cpp to its
    # sorted path, which keeps the 4 largest, sorted.
    x = np.array([0.0, 5.0, -1.0, 4.9, -2.0, 1.0], dtype=F32)
    c = S.min_p(S.Candidates.full(x), 0.5, min_keep=4)
    assert c.ids.tolist() == [1, 3, 5, 0] and c.sorted
    c = S.min_p(S.Candidates.full(x), 0.5, min_keep=2)
    assert c.ids.tolist() == [1, 3] and not c.sorted


def test_min_p_one_keeps_the_tied_maxima_unsorted():
    # min_p = 1: threshold max + logf(1) = max, so the unsorted path keeps
    # every token equal to the maximum, in id order, still unsorted.
    c = S.min_p(S.Candidates.full(np.array([1.0, 3.0, -2.0, 3.0, 2.0], dtype=F32)), 1.0)
    assert c.ids.tolist() == [1, 3] and not c.sorted
    c = S.min_p(S.Candidates.full(np.array([-1.0, -3.0, -1.0], dtype=F32)), 1.0)
    assert c.ids.tolist() == [0, 2] and not c.sorted


def test_top_p_uses_float32_running_sums():
    # One token of weight 1 and 1499 of weight ~2**-23.5: in float32 each
    # small weight adds a whole ulp to a sum near 1 (rounding up), so the
    # float32 normaliser is ~1.8e-4 too large and the kept prefix is much
    # longer than with exact sums. The reference does llama.cpp's float32
    # loop; an exact computation keeps ~400 tokens fewer.
    rng = np.random.default_rng(5)
    n = 1500
    x = (-16.29 - rng.permutation(n) * 1e-5).astype(F32)
    x[700] = 0.0
    got = S.top_p(S.Candidates.full(x), 0.9999)
    want, _ = ref_top_p([(i, v) for i, v in enumerate(x)], False, 0.9999, 0)
    assert got.ids.tolist() == [i for i, _ in want]
    e = np.exp(x.astype(np.float64))
    exact = int(np.searchsorted(np.cumsum(np.sort(e)[::-1] / e.sum()), 0.9999)) + 1
    assert len(want) - exact > 300


# ======================================================= large vocab path ==
@pytest.mark.parametrize("n", [248320, 40003, 32768])
@pytest.mark.parametrize("k", [1, 7, 40, 400])
def test_top_positions_large_rows_with_ties(n, k):
    """The column pre-filter (rows >= 32768) must give exactly the k largest,
    ties by lower position, including ties straddling the k-th value and a
    tail that does not fill a column."""
    rng = np.random.default_rng(n + k)
    x = rng.integers(-50, 12, n).astype(F32)  # heavy ties
    x[rng.integers(0, n, 5)] = -np.inf
    got = S.top_positions(x, k)
    want = np.lexsort((np.arange(n), -x))[:k]  # value desc, position asc
    np.testing.assert_array_equal(got, want)


def test_signed_zeros_tie():
    # -0.0 == +0.0: a tie, broken by the lower position (the sort packs
    # float bits into integer keys, where the two zeros differ).
    x = np.array([-1.0, -0.0, 0.0, -0.0, 0.0, -2.0], dtype=F32)
    assert S.top_positions(x, 4).tolist() == [1, 2, 3, 4]
    c = S.min_p(S.Candidates.full(x), 1.0, min_keep=5)  # the sorted fallback
    assert c.ids.tolist() == [1, 2, 3, 4, 0]


def test_top_positions_tail_past_the_columns():
    # 40003 = 64 * 625 + 3: the last 3 elements fall outside the column view
    # and must still be found.
    x = np.zeros(40003, dtype=F32)
    x[[40002, 40000, 5]] = [9.0, 8.0, 7.0]
    assert S.top_positions(x, 3).tolist() == [40002, 40000, 5]


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 300))
def test_top_positions_large_random(seed, k):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(32768, 70000))
    x = (rng.standard_normal(n) * 3).astype(F32)
    if rng.random() < 0.5:
        x = np.round(x * 4) / 4  # ties
    got = S.top_positions(x, k)
    np.testing.assert_array_equal(got, np.lexsort((np.arange(n), -x))[:k])


def test_large_vocab_chain_against_reference():
    """Over sets larger than EXACT_MAX ds4py uses numpy's float32 exp and
    blocked float64 sums (module docstring). The candidate sets must still
    be the reference's, up to a top-p cut-off that moves only where the
    reference's float32 running sum is within 1e-5 of p (float32 rounding of
    sums over ~50k terms: the weights may differ by an ulp), and where the
    sets agree the draw must land on the token whose reference cumulative
    interval holds u, up to 1e-6 (same reason, relative to the total)."""
    rng = np.random.default_rng(11)
    n = 50000
    for trial, p in enumerate([
            S.SamplingParams(top_k=0, top_p=0.9, min_p=0.0, temperature=1.0, seed=1),
            S.SamplingParams(top_k=0, top_p=1.0, min_p=0.02, temperature=0.7, seed=2),
            S.SamplingParams(top_k=0, top_p=1.0, min_p=0.0, temperature=0.9, seed=3),
            S.SamplingParams(top_k=8000, top_p=0.6, min_p=0.0, temperature=1.3, seed=4)]):
        x = (rng.standard_normal(n) * 1.5).astype(F32)
        x[rng.integers(0, n, 6)] += 7.0
        want = ref_stages(x, p, [])
        got = module_stages(x, p, [])
        wi, wl, ws = want[-1]
        gi, gl, gs = got[-1]
        assert gs == ws
        if not np.array_equal(gi, wi):
            assert p.top_p < 1.0
            # Sorted sets from the same order: one is a prefix of the other.
            short, long_ = sorted([wi, gi], key=len)
            np.testing.assert_array_equal(long_[: len(short)], short)
            e = np.exp(want[2][1].astype(np.float64) - want[2][1].max())
            cum = np.cumsum(e[np.lexsort((want[2][0], -want[2][1]))] / e.sum())
            assert np.all(np.abs(cum[len(short) - 1: len(long_)] - p.top_p) < 1e-5)
            continue  # the totals differ by the boundary tokens: draws may shift
        s = S.Sampler(p, n)
        rng_u = S.Mt19937(p.seed)
        _, probs, _ = ref_dist(wi, wl)
        cs = np.concatenate([[0.0], np.cumsum(probs)])
        for _ in range(20):
            u = rng_u.uniform()
            tok = s.sample(x)
            j = int(np.flatnonzero(wi == tok)[0])
            assert cs[j] - 1e-6 <= u <= cs[j + 1] + 1e-6, (trial, tok, u, cs[j], cs[j + 1])


# ================================================================ greedy ==
@FAST
@given(logit_rows())
def test_greedy_is_argmax_lowest_id(x):
    for t in (0.0, -0.5):
        s = S.Sampler(S.SamplingParams(temperature=t), x.shape[0])
        best = min(i for i in range(x.shape[0]) if x[i] == max(x))
        assert s.sample(x) == best
        ids, probs = s.distribution(x)
        assert ids.tolist() == [best] and probs.tolist() == [1.0]


def test_greedy_sees_bias_and_penalties():
    x = np.array([5.0, 4.0, 3.0, -1.0], dtype=F32)
    s = S.Sampler(S.SamplingParams(temperature=0, logit_bias={0: -np.inf}), 4)
    assert s.sample(x) == 1
    s = S.Sampler(S.SamplingParams(temperature=0, repeat_penalty=2.0), 4)
    s.accept_many([0, 1])  # 5/2 = 2.5, 4/2 = 2 -> token 2 (3.0) wins
    assert s.sample(x) == 2


# =============================================================== the RNG ==
# std::uniform_real_distribution<double>(0, 1) over std::mt19937(seed), first
# four values, printed with %.17g by this C++ program built with g++ 13
# (libstdc++):
#   std::mt19937 g(s); std::uniform_real_distribution<double> d(0.0, 1.0);
#   for (int i = 0; i < 4; i++) printf(" %.17g", d(g));
STD_UNIFORMS = {
    0: [0.59284461651668263, 0.84426574425659828, 0.85794561998982988, 0.84725173738433124],
    1: [0.99718480823026556, 0.93255736136816547, 0.128124447772306, 0.99904051546527362],
    5489: [0.1354770042967805, 0.8350085899945795, 0.96886777112423139, 0.2210340429827049],
    42: [0.79654298428784598, 0.18343478789336848, 0.77969099761266125, 0.59685016158005655],
    4294967295: [0.11160666544400902, 0.56269337421105781, 0.52632130700839574,
                 0.77061474201735192],
}


@pytest.mark.parametrize("seed", sorted(STD_UNIFORMS))
def test_uniforms_match_std(seed):
    g = S.Mt19937(seed)
    assert [g.uniform() for _ in range(4)] == STD_UNIFORMS[seed]


def test_mt19937_10000th_output():
    # C++ [rand.predef]: the 10000th consecutive invocation of a
    # default-constructed std::mt19937 (seed 5489) produces 4123659995.
    g = S.Mt19937(5489)
    for _ in range(9999):
        g.next_u32()
    assert g.next_u32() == 4123659995


def test_same_seed_same_sequence_different_seed_differs():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(1000) * 0.5).astype(F32)  # broad: many tokens likely
    p = S.SamplingParams(top_k=0, top_p=1.0, min_p=0.0, temperature=1.0, seed=123)
    a = S.Sampler(p, 1000)
    b = S.Sampler(p, 1000)
    seq_a = [a.sample(x) for _ in range(64)]
    assert seq_a == [b.sample(x) for _ in range(64)]
    a.reset()
    assert [a.sample(x) for _ in range(64)] == seq_a
    # ~1000 near-equally likely tokens: two different seeds agreeing on 64
    # draws has probability ~1e-190.
    c = S.Sampler(S.SamplingParams(top_k=0, top_p=1.0, min_p=0.0, temperature=1.0, seed=124),
                  1000)
    assert [c.sample(x) for _ in range(64)] != seq_a


def test_state_roundtrip():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(300).astype(F32)
    s = S.Sampler(S.SamplingParams(repeat_penalty=1.2, seed=9, top_k=0), 300)
    s.accept_many([1, 2, 3])
    st_ = s.get_state()
    first = [s.sample(x) for _ in range(10)]
    s.accept(5)
    s.set_state(st_)
    assert [s.sample(x) for _ in range(10)] == first
    assert s.window == (1, 2, 3)


def test_random_seed_is_reported():
    s = S.Sampler(S.SamplingParams(seed=None), 10)
    assert 0 <= s.seed < 2**32
    x = np.linspace(0, 1, 10).astype(F32)
    t = S.Sampler(S.SamplingParams(seed=s.seed), 10)
    assert [s.sample(x) for _ in range(20)] == [t.sample(x) for _ in range(20)]


# ========================================================= distribution ==
def test_draw_frequencies_match_chain_probabilities():
    """20k seeded draws: each token's frequency within 5 binomial standard
    deviations (+1/N for the discreteness) of the reference post-chain
    probability; a false failure at 5 sigma over ~20 tokens has probability
    < 1e-5, and the draws are seeded, so the test is deterministic. Tokens
    outside the reference support must never appear."""
    rng = np.random.default_rng(42)
    n = 400
    x = (rng.standard_normal(n) * 1.5).astype(F32)
    x[[3, 50, 77]] += F32(3.0)
    p = S.SamplingParams(top_k=25, top_p=0.9, min_p=0.02, temperature=0.9,
                         repeat_penalty=1.2, presence_penalty=0.3, logit_bias={50: -np.inf},
                         seed=2024)
    window = [3, 3, 8, 12]
    ids, lg, _ = ref_stages(x, p, window)[-1]
    _, probs, _ = ref_dist(ids, lg)
    s = S.Sampler(p, n)
    s.accept_many(window)
    N = 20000
    counts = Counter(s.sample(x) for _ in range(N))
    assert set(counts) <= set(ids.tolist())
    assert 50 not in counts
    for tok, pr in zip(ids.tolist(), probs, strict=True):
        f = counts.get(tok, 0) / N
        assert abs(f - pr) <= 5 * math.sqrt(pr * (1 - pr) / N) + 1 / N, (tok, f, pr)
    # distribution() reports the same set and probabilities (float32 weights,
    # double normalisation: equal to the reference to double rounding).
    gi, gp = s.distribution(x)
    np.testing.assert_array_equal(gi, ids)
    np.testing.assert_allclose(gp, probs, rtol=1e-12, atol=0)


# ============================================================ llama.cpp ==
def _fixture():
    info = json.loads((GOLDEN / "cases.json").read_text())
    return info, np.load(GOLDEN / "llamacpp.npz")


def _load_stages(arrays, key):
    # Reader of make_sampling_fixtures.record's packing (a copy of its
    # load_stages; that module imports llama_cpp, which CI lacks).
    x = arrays[f"{key}_logits"]
    ids_all, vals_all = arrays[f"{key}_ids"], arrays[f"{key}_vals"]
    out, off = [], 0
    for kind, n, srt in arrays[f"{key}_meta"]:
        ids, vals = ids_all[off:off + n], vals_all[off:off + n]
        off += n
        if kind == 0:
            full = x.copy()
            full[ids] = vals
            out.append((np.arange(x.shape[0]), full, bool(srt)))
        else:
            out.append((ids, vals, bool(srt)))
    return out


def _params(entry):
    p = dict(entry["params"])
    if "logit_bias" in p:
        p["logit_bias"] = {int(t): float(b) for t, b in p["logit_bias"].items()}
    return S.SamplingParams(**p, seed=entry["seed"])


FIXTURE_CASES = json.loads((GOLDEN / "cases.json").read_text())["cases"]


@pytest.mark.parametrize("entry", FIXTURE_CASES, ids=[c["name"] for c in FIXTURE_CASES])
def test_matches_llamacpp_fixture(entry):
    """Candidate sets after every stage bit-identical to llama.cpp's, and
    the same 16 tokens drawn with the same seed."""
    _, arrays = _fixture()
    key = entry["key"]
    x = arrays[f"{key}_logits"]
    p = _params(entry)
    assert_same_stages(module_stages(x, p, entry["history"]), _load_stages(arrays, key))
    s = S.Sampler(p, x.shape[0])
    s.accept_many(entry["history"])
    assert [s.sample(x) for _ in range(len(entry["draws"]))] == entry["draws"]


def test_fixture_reference_agrees_with_llamacpp():
    """The pure-Python reference of this file reproduces llama.cpp's
    recorded stages too (so it is a faithful reading of llama.cpp)."""
    _, arrays = _fixture()
    for entry in FIXTURE_CASES:
        key = entry["key"]
        x = arrays[f"{key}_logits"]
        if x.shape[0] > 800:
            continue  # keep the pure-Python loops short
        assert_same_stages(ref_stages(x, _params(entry), entry["history"]),
                           _load_stages(arrays, key))


# ============================================================= logprobs ==
@FAST
@given(logit_rows(max_n=300), st.integers(0, 10), st.data())
def test_logprobs_against_fsum(x, top_n, data):
    tok = data.draw(st.integers(0, x.shape[0] - 1))
    got = S.logprobs(x, tok, top_n)
    xs = [float(v) for v in x]
    m = max(xs)
    lse = m + math.log(math.fsum(math.exp(v - m) for v in xs))

    def lp(i):
        return xs[i] - lse

    # Tolerance 1e-5: exp runs in float32 on float32 differences x - max,
    # whose rounding (half an ulp of |x - max| <= 64: 4e-6) and exp's own
    # error (~1e-7 relative) bound the error of the log-sum; the token's
    # own difference is exact in float64.
    if math.isinf(lp(tok)):
        assert got.logprob == -math.inf
    else:
        assert abs(got.logprob - lp(tok)) <= 1e-5
    want_top = sorted(range(len(xs)), key=lambda i: (-xs[i], i))[:top_n]
    assert list(got.top_ids) == want_top
    for i, v in zip(got.top_ids, got.top_logprobs, strict=True):
        assert v == -math.inf if math.isinf(lp(i)) else abs(v - lp(i)) <= 1e-5


def test_logprobs_are_raw_not_chain():
    # Temperature/top-k play no part: logprobs take the model's logits only.
    x = np.array([2.0, 1.0, 0.0], dtype=F32)
    got = S.logprobs(x, 2, top_n=3)
    lse = math.log(math.exp(2) + math.exp(1) + 1)
    assert abs(got.logprob - (0 - lse)) < 1e-6
    assert got.top_ids == (0, 1, 2)


# ========================================================== refusals ==
def test_refusals():
    s = S.Sampler(S.SamplingParams(seed=1), 4)
    with pytest.raises(ValueError, match="NaN"):
        s.sample(np.array([0, np.nan, 1, 2], dtype=F32))
    with pytest.raises(ValueError, match=r"\+inf"):
        s.sample(np.array([0, np.inf, 1, 2], dtype=F32))
    with pytest.raises(ValueError, match="-inf"):
        s.sample(np.full(4, -np.inf, dtype=F32))
    with pytest.raises(ValueError, match="shape"):
        s.sample(np.zeros(5, dtype=F32))
    with pytest.raises(ValueError, match="outside"):
        s.accept(4)
    with pytest.raises(ValueError, match="outside"):
        S.Sampler(S.SamplingParams(logit_bias={4: 1.0}), 4)
    banned = S.Sampler(S.SamplingParams(logit_bias={0: -np.inf, 1: -np.inf}), 2)
    with pytest.raises(ValueError, match="-inf"):
        banned.sample(np.array([1.0, 2.0], dtype=F32))
    with pytest.raises(ValueError, match="NaN"):
        S.logprobs(np.array([0, np.nan], dtype=F32), 0)
    for bad in [dict(top_p=1.5), dict(min_p=-0.1), dict(repeat_penalty=0.0),
                dict(repeat_last_n=-1), dict(seed=2**32), dict(seed=-1),
                dict(logit_bias={1: np.nan}), dict(logit_bias={1: np.inf}),
                dict(logit_bias={-1: 1.0}), dict(temperature=np.nan), dict(min_keep=-1)]:
        with pytest.raises((ValueError, TypeError)):
            S.SamplingParams(**bad)


def test_defaults_are_llamacpp_common_defaults():
    # common/common.h, struct common_params_sampling.
    p = S.SamplingParams()
    assert (p.temperature, p.top_k, p.top_p, p.min_p) == (0.8, 40, 0.95, 0.05)
    assert (p.repeat_penalty, p.repeat_last_n, p.frequency_penalty, p.presence_penalty,
            p.min_keep) == (1.0, 64, 0.0, 0.0, 0)
    assert not p.penalties_on and not p.greedy
