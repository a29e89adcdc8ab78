"""The prefix cache (ds4py/cache.py) and generate(..., cache=) on the golden
test models (tiny random-weight qwen35 / qwen35moe GGUFs, fast precision).

References, all independent of ds4py.cache:
- results: fresh sessions (Session.eval of the whole sequence) and uncached
  ds4py.generate runs, compared BIT for bit (DESIGN.md invariant 3: resumed
  equals fresh; no tolerance anywhere in this file);
- reuse counts: the longest snapshot point that is a prefix of the new
  prompt, computed here from plain lists (the documented points: every
  multiple of 256 of each earlier prompt, its end, and the end of its
  evaluated generation), plus the literal numbers for the chat test (its
  replies are one token per word, so the counts depend on the tokenizer only);
- memory: ds4py.session.kv_live_pages() (the core's count of live KV pages)
  and the page size from the model config (the formula
  tests/test_snapshot.py checks against the core's allocation counters);
- LRU: a list simulation of least-recently-used order.
"""

from __future__ import annotations

import gc
import math
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ds4py
from ds4py import PrefixCache, generate, stream_generate
from ds4py.session import kv_live_pages

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "golden", "models")
TOKS = [int(t) for t in np.load(os.path.join(HERE, "golden", "logits", "sequences.npz"))["s700"]]
BLOCK = 256
PAGE_HEADER = 64  # DS4_KV_PAGE_HEADER (csrc/forward/forward.h)


@pytest.fixture(scope="module")
def dense():
    return ds4py.load(os.path.join(MODELS, "dense-q8_0.gguf"), n_threads=2)


@pytest.fixture(scope="module")
def moe():
    return ds4py.load(os.path.join(MODELS, "moe-q8_0.gguf"), n_threads=2)


@pytest.fixture(scope="module", params=["dense", "moe"])
def model(request, dense, moe):
    return {"dense": dense, "moe": moe}[request.param]


def bits(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def same(a, b) -> None:
    np.testing.assert_array_equal(bits(a), bits(b))


def n_attn(m) -> int:
    return m.config.layer_kinds[:m.config.n_layers].count("attn")


def page_group_bytes(m) -> int:
    """One KV page index: a K and a V page of every attention layer (F16 KV
    in fast precision, the models here)."""
    c = m.config
    assert m.precision == "fast"
    return 2 * n_attn(m) * (c.n_kv_heads * BLOCK * c.head_dim * 2 + PAGE_HEADER)


def live_groups(m, live0: int) -> float:
    return (kv_live_pages() - live0) / (2 * n_attn(m))


def head_page_bytes(m) -> int:
    """One page of the nextn head's KV: a K and a V page of its one attention
    layer (the trunk's attention shape, F16 in fast precision)."""
    c = m.config
    assert m.precision == "fast"
    return 2 * (c.n_kv_heads * BLOCK * c.head_dim * 2 + PAGE_HEADER)


def other(n: int, salt: int, vocab: int = 512) -> list[int]:
    """n ids unlike TOKS at every position (TOKS[i] + salt + 1 ... mod vocab)."""
    return [(TOKS[i] + salt + 1 + i % 7) % vocab for i in range(n)]


def fresh_rows(m, ids) -> np.ndarray:
    with m.new_session() as s:
        return np.array(s.eval(ids, all_logits=True))


def expected_reuse(points: list[tuple], ids: list[int]) -> int:
    """The longest earlier snapshot point that is a prefix of ids."""
    best = 0
    for p in points:
        if len(p) > best and tuple(ids[:len(p)]) == p:
            best = len(p)
    return best


def points_of(g) -> list[tuple]:
    """The snapshot points the module doc promises for one generate call."""
    p = list(g.prompt_ids)
    pts = [tuple(p[:k]) for k in range(BLOCK, len(p) + 1, BLOCK)]
    pts.append(tuple(p))
    if g.evaluated_tokens:
        pts.append(tuple(p + g.tokens[:g.evaluated_tokens]))
    return pts


# ------------------------------------------------------- same prompt twice --

def test_same_prompt_twice_is_a_bit_identical_hit(model):
    ids = TOKS[:600]
    ref = generate(model, ids, max_tokens=12, temperature=0, logprobs=5)
    rows = fresh_rows(model, ids + ref.tokens[:ref.evaluated_tokens])
    cache = PrefixCache(model)
    g1 = generate(model, ids, max_tokens=12, temperature=0, logprobs=5, cache=cache)
    assert g1.cached_tokens == 0 and g1.prompt_tokens == 600 and g1.prompt_ids == ids
    # the snapshot points: 256, 512, the prompt's end, the generation's end
    gen_end = ids + g1.tokens[:g1.evaluated_tokens]
    assert sorted(cache.keys(), key=len) == [tuple(ids[:256]), tuple(ids[:512]), tuple(ids),
                                             tuple(gen_end)]
    g2 = generate(model, ids, max_tokens=12, temperature=0, logprobs=5, cache=cache)
    assert g2.cached_tokens == 600 and g2.prompt_tokens == 0  # nothing evaluated
    for g in (g1, g2):
        assert g.tokens == ref.tokens and g.finish_reason == ref.finish_reason
        for a, b in zip(g.logprobs, ref.logprobs, strict=True):  # floats, bit for bit
            assert a.token == b.token and a.top_ids == b.top_ids
            same([a.logprob, *a.top_logprobs], [b.logprob, *b.top_logprobs])
    # the cached state is the fresh one: last logits and what follows
    n, snap = cache.lookup(ids)
    assert n == 600 and snap.n_past == 600
    with model.new_session() as s:
        s.restore(snap)
        same(s.last_logits(), rows[599])
        same(s.eval(gen_end[600:], all_logits=True), rows[600:])
    # a session given to generate ends holding the same state as a fresh run
    with model.new_session() as s:
        s.eval(other(50, 3))  # whatever it held is replaced
        g3 = generate(model, ids, max_tokens=12, temperature=0, cache=cache, session=s)
        assert g3.cached_tokens == 600 and g3.tokens == ref.tokens
        assert s.n_past == len(gen_end)
        same(s.last_logits(), rows[-1])
        # a miss with a session that holds something: it starts from empty
        g4 = generate(model, ids, max_tokens=12, temperature=0, cache=PrefixCache(model),
                      session=s)
        assert g4.cached_tokens == 0 and g4.tokens == ref.tokens
        assert s.n_past == len(gen_end)
        same(s.last_logits(), rows[-1])
    # sampling draws the same tokens from the cached logits
    a = generate(model, ids, max_tokens=10, temperature=0.9, seed=7)
    b = generate(model, ids, max_tokens=10, temperature=0.9, seed=7, cache=cache)
    assert b.cached_tokens == 600 and b.tokens == a.tokens


# ----------------------------------------------------------- multi-turn chat --

WORDS = [" model", " attention", " head", " tensor", " batch", " layer", " matrix", " cache",
         " value", " state", " block", " vector", " weight", " hidden", " expert", " sequence"]


def long_question(i: int) -> str:
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india"]
    return f"Question {i}: " + " ".join(words[(i * 7 + j * 3) % 9] + str(j % 13)
                                        for j in range(120))


@pytest.mark.parametrize("name", ["dense", "moe"])
def test_multi_turn_chat_reuses_the_expected_tokens(name, dense, moe):
    """A chat of 4 turns (569 tokens in the first prompt, 2271 in the third)
    with enable_thinking=False. The replies are made of whole-word tokens
    (logit_bias allows only those, and bans end-of-turn) so that they
    re-render to the very tokens generated: each turn then reuses the
    previous turn's end of generation. The 4th turn re-renders the 3rd reply
    without its first words (as Qwen3.5's template re-renders an earlier
    reply without its <think> block): reuse stops at the 3rd prompt's end,
    where the histories first differ."""
    m = {"dense": dense, "moe": moe}[name]
    tok = m.tokenizer
    allowed = {tok.encode(w, special=False)[0] for w in WORDS}
    assert all(len(tok.encode(w, special=False)) == 1 for w in WORDS)
    bias = {t: -math.inf for t in range(m.config.vocab_size) if t not in allowed}
    kw = dict(enable_thinking=False, max_tokens=40, temperature=0, logit_bias=bias, logprobs=2)
    cache = PrefixCache(m)
    points: list[tuple] = []
    msgs: list[dict] = []
    reused, lengths = [], []
    for turn in range(4):
        msgs.append({"role": "user", "content": long_question(turn)})
        if turn == 3:  # an earlier reply re-rendered differently
            msgs[-2] = {"role": "assistant", "content": msgs[-2]["content"].split(" ", 3)[3]}
        ids = tok.encode(tok.apply_chat_template(msgs, enable_thinking=False,
                                                 add_generation_prompt=True), special=True)
        g = generate(m, msgs, cache=cache, **kw)
        assert g.prompt_ids == ids
        want = expected_reuse(points, ids)
        assert g.cached_tokens == want
        assert g.prompt_tokens == len(ids) - want
        # the same reply as without a cache, bit for bit
        ref = generate(m, msgs, **kw)
        assert g.tokens == ref.tokens and g.content == ref.content
        for a, b in zip(g.logprobs, ref.logprobs, strict=True):
            same([a.logprob, *a.top_logprobs], [b.logprob, *b.top_logprobs])
        assert g.finish_reason == "length" and g.evaluated_tokens == 39
        points += points_of(g)
        reused.append(g.cached_tokens)
        lengths.append(len(ids))
        msgs.append({"role": "assistant", "content": g.content})
    assert lengths[0] > 512
    # turn 2 and 3: the previous prompt + its 39 evaluated reply tokens;
    # turn 4: the third prompt's end (2271), not its generation end
    assert reused == [0, 569 + 39, 1380 + 39, 2271]
    assert lengths == [569, 1380, 2271, 2881]


def test_reuse_stops_at_the_last_point_before_a_difference(dense):
    """An earlier prompt's ids are changed at position 300: only the 256
    block before it is reused (not the 300 tokens that still agree)."""
    m = dense
    tok = m.tokenizer
    first = [{"role": "user", "content": long_question(0)}]
    cache = PrefixCache(m)
    g1 = generate(m, first, cache=cache, enable_thinking=False, max_tokens=3, temperature=0)
    ids1 = g1.prompt_ids
    text = tok.apply_chat_template(first, enable_thinking=False, add_generation_prompt=True)
    # change one character where the token index passes 300
    cut = len(tok.decode(ids1[:300]))
    changed = text[:cut] + ("X" if text[cut] != "X" else "Y") + text[cut + 1:]
    ids2 = tok.encode(changed, special=True)
    k = next(i for i, (a, b) in enumerate(zip(ids1, ids2, strict=False)) if a != b)
    assert 256 < k < 512
    g2 = generate(m, changed, cache=cache, max_tokens=3, temperature=0)
    assert g2.prompt_ids == ids2
    assert g2.cached_tokens == 256 == expected_reuse(points_of(g1), ids2)
    assert g2.tokens == generate(m, changed, max_tokens=3, temperature=0).tokens


# --------------------------------------------------------- partial blocks --

def test_partial_block_reuses_up_to_the_last_snapshot_point(model):
    cache = PrefixCache(model)
    generate(model, TOKS[:600], max_tokens=0, cache=cache)  # points 256, 512, 600
    assert sorted(len(k) for k in cache.keys()) == [256, 512, 600]
    cases = [
        (TOKS[:550] + other(20, 1), 512),   # agrees for 550: the 512 point
        (TOKS[:511] + other(20, 2), 256),   # one short of 512
        (TOKS[:255] + other(20, 3), 0),     # one short of 256
        (TOKS[:600] + other(20, 4), 600),   # extends the prompt's end
        (TOKS[:600], 600),                  # the whole prompt
        (TOKS[:599], 512),                  # a prefix of an entry is no entry
    ]
    for ids, want in cases:
        ref = generate(model, ids, max_tokens=4, temperature=0, logprobs=1)
        g = generate(model, ids, max_tokens=4, temperature=0, logprobs=1, cache=cache)
        assert g.cached_tokens == want, (len(ids), g.cached_tokens, want)
        assert g.prompt_tokens == len(ids) - want
        assert g.tokens == ref.tokens
        same([lp.logprob for lp in g.logprobs], [lp.logprob for lp in ref.logprobs])
    assert cache.lookup(TOKS[:599])[0] == 599  # now cached by the last case
    assert cache.lookup(other(30, 9))[0] == 0 and cache.lookup([])[0] == 0


# ---------------------------------------------------------- fork isolation --

def test_fork_isolation(model):
    """Two requests restore the same cached prefix and run interleaved, and
    a user session writes over the positions the snapshot covers: each
    result equals an uncached run, and the cached snapshot still restores
    to the fresh state afterwards."""
    P = TOKS[:300]
    A = P + TOKS[300:330]
    B = P + other(30, 5)
    want_a = generate(model, A, max_tokens=20, temperature=0, logprobs=1)
    want_b = generate(model, B, max_tokens=20, temperature=0, logprobs=1)
    rows_p = fresh_rows(model, TOKS[:320])
    cache = PrefixCache(model)
    generate(model, P, max_tokens=0, cache=cache)
    n, snap = cache.lookup(P)
    assert n == 300
    # a user session restored from the cache's snapshot writes other tokens
    # over positions 250..550 (into the snapshot's partial page and past it)
    with model.new_session() as u:
        u.restore(cache.lookup(TOKS[:256])[1])
        u.eval(other(300, 8))
        it_a = stream_generate(model, A, max_tokens=20, temperature=0, logprobs=1, cache=cache)
        it_b = stream_generate(model, B, max_tokens=20, temperature=0, logprobs=1, cache=cache)
        chunks_a, chunks_b = [next(it_a)], [next(it_b)]
        for ca, cb in zip(it_a, it_b, strict=False):  # alternate steps
            chunks_a.append(ca)
            chunks_b.append(cb)
        chunks_a += list(it_a)
        chunks_b += list(it_b)
        u.eval(other(10, 9))
    ga, gb = chunks_a[-1].generation, chunks_b[-1].generation
    assert ga.cached_tokens == gb.cached_tokens == 300
    for g, want in ((ga, want_a), (gb, want_b)):
        assert g.tokens == want.tokens
        same([lp.logprob for lp in g.logprobs], [lp.logprob for lp in want.logprobs])
    # the snapshot is the same object and still the fresh state
    assert cache.lookup(P) == (300, snap) and not snap.closed
    with model.new_session() as s:
        s.restore(snap)
        same(s.last_logits(), rows_p[299])
        same(s.eval(TOKS[300:320], all_logits=True), rows_p[300:320])
    # and A again from the cache (now a hit on A's own prompt end)
    g = generate(model, A, max_tokens=20, temperature=0, cache=cache)
    assert g.cached_tokens == len(A) and g.tokens == want_a.tokens


# ------------------------------------------------------- bytes and eviction --

def test_shared_pages_are_charged_once_and_exactly(dense):
    m = dense
    gc.collect()
    live0 = kv_live_pages()
    cache = PrefixCache(m)
    generate(m, TOKS[:600], max_tokens=0, cache=cache)  # drafting: the head is primed
    # entries at 256, 512, 600 hold pages {0}, {0, 1}, {0, 1, 2}: 3 pages, not 6
    assert cache.kv_pages == 3
    # The head's KV holds positions [1, n): its pages start at position 1, so
    # at each 256-aligned snapshot its last page is partial and the next
    # write copies it: {h0}, {h0', h1}, {h0', h1', h2} = 5 distinct pages.
    assert cache.head_kv_pages == 5
    assert kv_live_pages() - live0 == 3 * 2 * n_attn(m) + 5 * 2
    own = sum(b for _, b in cache.entries())
    assert cache.nbytes == own + 3 * page_group_bytes(m) + 5 * head_page_bytes(m)
    # forks, generation (copies of partial pages), a kept session: the
    # charge follows the pages the entries really hold
    with m.new_session() as s:
        generate(m, TOKS[:550] + other(30, 1), max_tokens=30, temperature=0, cache=cache)
        generate(m, TOKS[:300] + [5], max_tokens=300, temperature=0, cache=cache, session=s)
        generate(m, TOKS[:600], max_tokens=5, temperature=0, cache=cache)
        generate(m, TOKS[:600], max_tokens=5, temperature=0, cache=cache)  # same again
    gc.collect()
    # every live page (trunk and head) is one an entry holds, and is charged once
    assert kv_live_pages() - live0 == cache.kv_pages * 2 * n_attn(m) + cache.head_kv_pages * 2
    assert cache.nbytes == (sum(b for _, b in cache.entries())
                            + cache.kv_pages * page_group_bytes(m)
                            + cache.head_kv_pages * head_page_bytes(m))
    cache.clear()
    gc.collect()
    assert len(cache) == 0 and cache.nbytes == 0 and kv_live_pages() == live0


def serial_generate(m, prompt, **kw):
    """generate without drafting: the LRU tests count one trunk page group
    per short entry, which a primed nextn head would add to."""
    return generate(m, prompt, draft=False, **kw)


def test_lru_evicts_least_recently_used_and_frees(dense):
    m = dense
    gc.collect()
    live0 = kv_live_pages()
    X, Y, Z = TOKS[0:100], TOKS[100:200], TOKS[200:300]
    probe = PrefixCache(m)
    serial_generate(m, X, max_tokens=0, cache=probe)
    per = probe.entries()[0][1] + page_group_bytes(m)  # one entry: own bytes + 1 page
    probe.clear()
    cache = PrefixCache(m, budget_bytes=2 * per + per // 2)  # room for two entries
    serial_generate(m, X, max_tokens=0, cache=cache)
    serial_generate(m, Y, max_tokens=0, cache=cache)
    _, snap_y = cache.lookup(Y)
    assert cache.keys() == [tuple(X), tuple(Y)]  # Y used last
    g = serial_generate(m, X, max_tokens=1, temperature=0, cache=cache)  # a hit: X used last
    assert g.cached_tokens == 100
    assert cache.keys() == [tuple(Y), tuple(X)]
    serial_generate(m, Z, max_tokens=0, cache=cache)
    assert cache.keys() == [tuple(X), tuple(Z)]  # Y evicted, its snapshot closed
    assert snap_y.closed and cache.stats.evicted == 1
    gc.collect()
    assert cache.nbytes == 2 * per and live_groups(m, live0) == 2
    # lowering the budget evicts at once, least recent first
    cache.budget_bytes = per
    assert cache.keys() == [tuple(Z)] and live_groups(m, live0) == 1
    # a budget below one entry keeps nothing; generation is unaffected
    cache.budget_bytes = per - 1
    g = serial_generate(m, TOKS[:300], max_tokens=5, temperature=0, cache=cache)
    assert len(cache) == 0 and cache.nbytes == 0
    assert g.tokens == serial_generate(m, TOKS[:300], max_tokens=5, temperature=0).tokens
    gc.collect()
    assert kv_live_pages() == live0
    with pytest.raises(ValueError):
        cache.budget_bytes = -1


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(prompts=st.lists(st.lists(st.sampled_from([3, 4, 5]), min_size=1, max_size=10),
                        min_size=1, max_size=14),
       capacity=st.integers(1, 6))
def test_lookup_and_lru_match_a_simulation(dense, prompts, capacity):
    """Short prompts over a 3-id alphabet (many shared prefixes): each
    reuses the longest live earlier prompt, entries are evicted in LRU
    order (simulated with a list), the radix tree keeps no empty nodes, and
    the first generated token equals a fresh session's argmax."""
    m = dense
    probe = PrefixCache(m)
    serial_generate(m, [3], max_tokens=0, cache=probe)
    per = probe.entries()[0][1] + page_group_bytes(m)  # every entry here: one partial page
    probe.clear()
    cache = PrefixCache(m, budget_bytes=capacity * per)
    sim: list[tuple] = []  # least recently used first
    gc.collect()
    live0 = kv_live_pages()
    for p in prompts:
        q = tuple(p)
        hits = [k for k in sim if q[:len(k)] == k]
        want = max((len(k) for k in hits), default=0)
        if hits:
            best = max(hits, key=len)
            sim.remove(best)
            sim.append(best)
        if q not in sim:
            sim.append(q)
            del sim[:-capacity]
        g = serial_generate(m, list(p), max_tokens=1, temperature=0, cache=cache)
        assert g.cached_tokens == want
        with m.new_session() as s:
            assert g.tokens == [int(np.argmax(s.eval(list(p))))]
        assert cache.keys() == sim
    gc.collect()
    assert live_groups(m, live0) == len(sim) == cache.kv_pages

    def check(node, is_root):
        if not is_root:
            assert node.entry is not None or len(node.children) >= 2
        for first, child in node.children.items():
            assert child.edge[0] == first and child.parent is node
            check(child, False)
    check(cache._root, True)
    cache.clear()
    assert not cache._root.children


# ------------------------------------------------------------------ misc --

def test_return_prompt_logits_evaluates_everything(dense):
    m = dense
    ids = TOKS[:300]
    cache = PrefixCache(m)
    generate(m, ids, max_tokens=0, cache=cache)
    g = generate(m, ids, max_tokens=2, temperature=0, cache=cache, return_prompt_logits=True)
    assert g.cached_tokens == 0 and g.prompt_tokens == 300
    same(g.prompt_logits, fresh_rows(m, ids))


def test_chat_repl_uses_the_cache(dense):
    from ds4py import cli

    repl = cli.ChatRepl(dense, max_tokens=3, temperature=0)
    g1, k1 = repl.turn(long_question(1))
    g2, k2 = repl.turn("short")
    assert k1 == 0 and k2 == g2.cached_tokens > 0
    assert k2 == expected_reuse(points_of(g1), g2.prompt_ids)
    assert len(repl.cache) > 0
    repl.reset()
    assert len(repl.cache) == 0


def test_bad_arguments(dense, moe):
    cache = PrefixCache(dense)
    with pytest.raises(ValueError, match="another model"):
        generate(moe, [1, 2, 3], cache=cache)
    with pytest.raises(TypeError, match="PrefixCache"):
        generate(dense, [1, 2, 3], cache={})
    with pytest.raises(ValueError):
        PrefixCache(dense, budget_bytes=-5)
    with pytest.raises(ValueError):
        PrefixCache(dense, budget_bytes=1.5)
