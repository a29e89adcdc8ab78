"""ds4py.generate / stream_generate on the golden test models (tiny random-weight
qwen35 / qwen35moe GGUFs with a 512-token test tokenizer and a ChatML template).

The references are written here, independently of ds4py.generate: manual loops
over Session.eval + np.argmax (or a Sampler), the core's C greedy loop, and
tokenizer.decode of the ids. The text these models generate is gibberish; the
tests are about which tokens are chosen and when generation stops.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

import ds4py
from ds4py import Generation, ModelError, SamplingParams, generate, stream_generate
from ds4py._core import ffi, lib, new_error
from ds4py.sampling import Sampler

MODELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden", "models")
DENSE = os.path.join(MODELS, "dense-q8_0.gguf")
MOE = os.path.join(MODELS, "moe-q8_0.gguf")


@pytest.fixture(scope="module")
def dense():
    return ds4py.load(DENSE)


@pytest.fixture(scope="module")
def moe():
    return ds4py.load(MOE)


@pytest.fixture(scope="module", params=["dense", "moe"])
def model(request, dense, moe):
    return {"dense": dense, "moe": moe}[request.param]


def manual_greedy(model, ids, n, ban=()):
    """Reference: evaluate the prompt, then n times argmax (lowest id on ties)
    and evaluate the choice; stops at an end-of-generation id. ``ban`` ids are
    set to -inf first (what logit_bias -inf does)."""
    eog = model.tokenizer.eog_ids
    s = model.new_session()
    logits = s.eval(ids)
    out = []
    for _ in range(n):
        x = np.array(logits, dtype=np.float32)
        x[list(ban)] = -np.inf
        t = int(np.argmax(x))
        if t in eog:
            return out, "eos"
        out.append(t)
        if len(out) == n:
            break
        logits = s.eval([t])
    return out, "length"


def encode(model, text):
    return model.tokenizer.encode(text, special=True)


# ------------------------------------------------------------------ greedy --

@pytest.mark.parametrize("prompt", ["Hello world", "The quick brown fox"])
def test_greedy_equals_manual_loop(model, prompt):
    ids = encode(model, prompt)
    ref, ref_finish = manual_greedy(model, ids, 24)
    g = generate(model, prompt, max_tokens=24, temperature=0)
    assert isinstance(g, Generation)
    assert g.tokens == ref
    assert g.finish_reason == ref_finish
    assert g.prompt_tokens == len(ids) and g.prompt_ids == ids
    assert g.generated_tokens == len(ref)
    assert g.text == model.tokenizer.decode(ref)
    assert g.seed is None  # greedy consumes no randomness


def test_greedy_equals_c_loop(model):
    first = encode(model, "abc")[-1]
    n = 40
    out = np.zeros(n, dtype=np.int32)
    s = model.new_session()
    err = new_error()
    rc = lib.ds4_greedy_loop(model._ptr, s._ptr, first, n,
                             ffi.cast("int32_t *", ffi.from_buffer(out)), err)
    assert rc == lib.DS4_OK, ffi.string(err.message)
    assert s.n_past == n
    eog = model.tokenizer.eog_ids
    c_ids = out.tolist()
    stop = next((i for i, t in enumerate(c_ids) if t in eog), n)
    g = generate(model, [first], max_tokens=n, temperature=0)
    assert g.tokens == c_ids[:stop]


def test_c_loop_rejects_bad_arguments(dense):
    s = dense.new_session()
    err = new_error()
    buf = np.zeros(1, dtype=np.int32)  # named: the cast pointer does not keep it alive
    out = ffi.cast("int32_t *", ffi.from_buffer(buf))
    assert lib.ds4_greedy_loop(dense._ptr, s._ptr, 1, -1, out, err) == lib.DS4_ERR_ARG
    assert lib.ds4_greedy_loop(dense._ptr, s._ptr, 1, 1, ffi.NULL, err) == lib.DS4_ERR_ARG
    # a token outside the vocabulary: the eval's own error comes through
    assert lib.ds4_greedy_loop(dense._ptr, s._ptr, 10**6, 1, out, err) != lib.DS4_OK
    assert s.n_past == 0


def test_temp0_is_deterministic_and_stream_matches(dense):
    a = generate(dense, "Once upon a time", max_tokens=30, temperature=0)
    b = generate(dense, "Once upon a time", max_tokens=30, temperature=0)
    assert a.tokens == b.tokens and a.text == b.text
    chunks = list(stream_generate(dense, "Once upon a time", max_tokens=30, temperature=0))
    assert [c.token for c in chunks] == a.tokens
    assert "".join(c.text for c in chunks) == a.text
    assert [c.generated_tokens for c in chunks] == list(range(1, 31))
    assert all(c.finish_reason is None and c.generation is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.finish_reason == "length" and last.generation.tokens == a.tokens
    assert all(c.step_s >= 0 for c in chunks)
    assert all(c.ttft_s == last.generation.ttft_s for c in chunks)


# ---------------------------------------------------------------- sampling --

def test_same_seed_same_tokens_different_seeds_differ(dense):
    kw = dict(max_tokens=40, temperature=1.5, top_k=0, top_p=1.0, min_p=0.0)
    a = generate(dense, "Hello world", seed=7, **kw)
    b = generate(dense, "Hello world", seed=7, **kw)
    c = generate(dense, "Hello world", seed=8, **kw)
    assert a.seed == 7 and c.seed == 8
    assert a.tokens == b.tokens
    # 40 draws at temperature 1.5 from a random model's flat-ish distribution:
    # two seeds agreeing on all 40 is vanishingly unlikely.
    assert a.tokens != c.tokens


def test_sampled_generation_equals_manual_sampler_loop(moe):
    params = SamplingParams(temperature=0.9, top_k=50, top_p=0.9, min_p=0.02,
                            repeat_penalty=1.3, repeat_last_n=16, frequency_penalty=0.2,
                            presence_penalty=0.1, seed=1234)
    ids = encode(moe, "The quick brown fox")
    eog = moe.tokenizer.eog_ids
    sampler = Sampler(params, moe.config.vocab_size)
    sampler.accept_many(ids[-16:])  # the prompt's tail enters the penalty window
    s = moe.new_session()
    logits = s.eval(ids)
    ref = []
    for _ in range(30):
        t = sampler.sample(logits)
        sampler.accept(t)
        if t in eog:
            break
        ref.append(t)
        logits = s.eval([t])
    g = generate(moe, "The quick brown fox", max_tokens=30, sampling=params)
    assert g.tokens == ref
    # the keyword overrides a field of `sampling`
    g2 = generate(moe, "The quick brown fox", max_tokens=30, sampling=params, seed=99)
    assert g2.seed == 99


def test_random_seed_is_reported_and_reproduces(dense):
    kw = dict(max_tokens=20, temperature=1.5, top_k=0, top_p=1.0, min_p=0.0)
    a = generate(dense, "abc", **kw)
    assert isinstance(a.seed, int) and 0 <= a.seed < 2**32
    assert generate(dense, "abc", seed=a.seed, **kw).tokens == a.tokens


def test_logprobs(dense):
    ids = encode(dense, "Hello world")
    g = generate(dense, ids, max_tokens=5, temperature=0, logprobs=3)
    s = dense.new_session()
    logits = s.eval(ids)
    assert len(g.logprobs) == 5
    for t, lp in zip(g.tokens, g.logprobs, strict=True):
        x = np.array(logits, dtype=np.float64)
        ls = x - x.max() - math.log(np.exp(x - x.max()).sum())
        assert lp.token == t
        # the implementation sums float32 exps in float64: within ~1e-6 of the
        # float64 log-softmax (sampling.logprobs docstring); 1e-5 leaves margin
        assert lp.logprob == pytest.approx(ls[t], abs=1e-5)
        top = np.argsort(-x, kind="stable")[:3]
        assert list(lp.top_ids) == top.tolist()
        logits = s.eval([t])


# ---------------------------------------------------------------- stopping --

def _stop_across_boundary(model, prompt):
    """A greedy output and a 4-character stop string that straddles the boundary
    between two tokens and occurs nowhere earlier; None if there is none."""
    g = generate(model, prompt, max_tokens=40, temperature=0)
    tok = model.tokenizer
    full = g.text
    for j in range(2, len(g.tokens) - 1):
        before = tok.decode(g.tokens[:j + 1])
        after = tok.decode(g.tokens[:j + 2])
        b = len(before)
        # both prefixes must decode to a prefix of the whole text (no character
        # split by the boundary)
        if not (full.startswith(before) and full.startswith(after)) or b < 2 \
                or len(after) < b + 2:
            continue
        stop = full[b - 2:b + 2]
        if full.find(stop) == b - 2 and stop.isprintable() and "\ufffd" not in stop:
            return g, stop, j
    return None


def test_stop_string_across_token_boundaries(model):
    for prompt in ("Hello world", "Once upon a time", "The quick brown fox", "abc", "x = 1"):
        found = _stop_across_boundary(model, prompt)
        if found:
            break
    assert found, "no greedy output with a stop string across a token boundary"
    g, stop, j = found
    cut = g.text.find(stop)
    s = generate(model, prompt, max_tokens=40, temperature=0, stop=["zzzzzzzz", stop])
    assert s.finish_reason == "stop"
    assert s.stop_string == stop
    assert s.text == g.text[:cut]
    # the token that completed the stop string is the last one generated
    assert s.tokens == g.tokens[:j + 2]
    # streamed: no piece ever shows any part of the stop string's end
    chunks = list(stream_generate(model, prompt, max_tokens=40, temperature=0, stop=stop))
    assert "".join(c.text for c in chunks) == s.text
    assert chunks[-1].finish_reason == "stop"


def test_max_tokens_is_length(dense):
    g = generate(dense, "Hello world", max_tokens=7, temperature=0)
    assert g.finish_reason == "length" and g.generated_tokens == 7 == len(g.tokens)
    assert g.evaluated_tokens == 6  # the last sampled token is not evaluated
    g0 = generate(dense, "Hello world", max_tokens=0, temperature=0)
    assert g0.finish_reason == "length" and g0.tokens == [] and g0.text == ""
    assert g0.prompt_tokens == len(encode(dense, "Hello world"))


def test_context_overflow_stops_at_n_ctx():
    m = ds4py.load(DENSE, n_ctx=32)
    ids = encode(m, "The quick brown fox jumps over the lazy dog")
    assert 10 < len(ids) < 32
    eog = list(m.tokenizer.eog_ids)
    ban = {t: -math.inf for t in eog}  # so that an eos cannot end it first
    g = generate(m, ids, max_tokens=100, temperature=0, logit_bias=ban)
    assert g.finish_reason == "length"
    assert g.generated_tokens == 32 - len(ids)
    ref, _ = manual_greedy(m, ids, 32 - len(ids), ban=eog)
    assert g.tokens == ref
    assert g.n_past == 31  # the last token is not evaluated; it would fit
    # exactly full: nothing can be generated
    g2 = generate(m, list(range(1, 33)), max_tokens=5, temperature=0)
    assert g2.finish_reason == "length" and g2.tokens == []


def test_prompt_too_long_is_a_clear_error():
    m = ds4py.load(DENSE, n_ctx=32)
    with pytest.raises(ModelError, match="does not fit"):
        generate(m, list(range(1, 34)), max_tokens=5)
    s = m.new_session()
    s.eval(list(range(1, 31)))
    with pytest.raises(ModelError, match=r"after the session's 30 tokens.*32"):
        generate(m, [1, 2, 3], session=s)
    assert s.n_past == 30  # nothing was evaluated
    with pytest.raises(ModelError, match="does not fit"):
        stream_generate(m, list(range(1, 40)))  # raised at the call, not at next()


def test_eos_forced_by_logit_bias(model):
    eos = model.tokenizer.eos_id
    g = generate(model, "Hello world", max_tokens=10, temperature=0,
                 logit_bias={eos: 1e9})
    assert g.finish_reason == "eos"
    assert g.tokens == [] and g.text == ""
    chunks = list(stream_generate(model, "Hello world", max_tokens=10, temperature=0.7,
                                  seed=1, logit_bias={eos: 1e9}))
    assert len(chunks) == 1 and chunks[0].token is None and chunks[0].finish_reason == "eos"
    assert chunks[0].text == "" and chunks[0].generation.text == ""


def test_natural_eos_is_excluded(moe):
    # This prompt's greedy continuation on the MoE golden model reaches <|im_end|>
    # after a few tokens (found by running it; the manual loop confirms it).
    ids = encode(moe, "Once upon a time")
    ref, finish = manual_greedy(moe, ids, 40)
    assert finish == "eos"
    g = generate(moe, ids, max_tokens=40, temperature=0)
    assert g.finish_reason == "eos" and g.tokens == ref
    assert g.evaluated_tokens == len(ref)  # every kept token was fed to reach the eos
    assert not set(g.tokens) & moe.tokenizer.eog_ids
    chunks = list(stream_generate(moe, ids, max_tokens=40, temperature=0))
    assert [c.token for c in chunks] == ref + [None]
    assert "".join(c.text for c in chunks) == g.text == moe.tokenizer.decode(ref)


# ------------------------------------------------------------ prompt kinds --

def test_chat_prompt_uses_the_template(dense):
    tok = dense.tokenizer
    msgs = [{"role": "user", "content": "Hi there"}]
    g = generate(dense, msgs, max_tokens=5, temperature=0)
    rendered = "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    assert g.prompt == rendered
    assert g.prompt_ids == tok.encode(rendered, special=True)
    assert g.prompt_ids[0] == tok.token_id("<|im_start|>")
    assert g.reasoning is not None and g.content is not None  # parsed
    # chat=True wraps a str; system= adds a system message (and implies chat)
    assert generate(dense, "Hi there", chat=True, max_tokens=5, temperature=0).tokens == g.tokens
    gs = generate(dense, "Hi there", system="Be brief.", max_tokens=1, temperature=0)
    assert gs.prompt == "<|im_start|>system\nBe brief.<|im_end|>\n" + rendered
    # raw: the text itself, special tokens recognised unless parse_special=False
    raw = generate(dense, "<|im_start|>x", max_tokens=1, temperature=0)
    assert raw.prompt_ids[0] == tok.token_id("<|im_start|>") and raw.reasoning is None
    plain = generate(dense, "<|im_start|>x", max_tokens=1, temperature=0, parse_special=False)
    assert tok.token_id("<|im_start|>") not in plain.prompt_ids


def test_bad_arguments(dense):
    with pytest.raises(ValueError):
        generate(dense, "x", max_tokens=-1)
    with pytest.raises(ValueError):
        generate(dense, "")
    with pytest.raises(ValueError):
        generate(dense, [])
    with pytest.raises(ValueError):
        generate(dense, [{"role": "user", "content": "x"}], chat=False)
    with pytest.raises(ValueError):
        generate(dense, "x", chat=False, system="s")
    with pytest.raises(ValueError):
        generate(dense, [1, 2], chat=True)
    with pytest.raises(ModelError, match="outside the vocabulary"):
        generate(dense, [1, 100000])
    with pytest.raises(TypeError):
        generate(dense, 3.5)


# ---------------------------------------------------------------- sessions --

def test_session_continuation_equals_fresh(dense):
    ids = encode(dense, "Hello world")
    s = dense.new_session()
    a = generate(dense, ids, max_tokens=6, temperature=0, session=s)
    assert s.n_past == len(ids) + a.evaluated_tokens == a.n_past
    more = encode(dense, " and then")
    # continue: feed the unevaluated last token, then new text
    b = generate(dense, a.tokens[a.evaluated_tokens:] + more, max_tokens=8, temperature=0,
                 session=s)
    fresh = generate(dense, ids + a.tokens + more, max_tokens=8, temperature=0)
    assert b.tokens == fresh.tokens
    assert s.n_past == len(ids) + len(a.tokens) + len(more) + b.evaluated_tokens
    s.close()


def test_closing_the_session_mid_stream_raises(dense):
    s = dense.new_session()
    it = stream_generate(dense, "Hello world", max_tokens=20, temperature=0, session=s)
    next(it)
    s.close()
    with pytest.raises(ModelError, match="closed"):
        next(it)


def test_return_prompt_logits(model):
    ids = encode(model, "Hello world, this is")
    g = generate(model, ids, max_tokens=3, temperature=0, return_prompt_logits=True)
    s = model.new_session()  # kept alive: eval returns a view of its buffer
    ref = s.eval(ids, all_logits=True)
    assert g.prompt_logits.shape == (len(ids), model.config.vocab_size)
    np.testing.assert_array_equal(g.prompt_logits, ref)  # same engine: bit for bit
    assert g.tokens == generate(model, ids, max_tokens=3, temperature=0).tokens


def test_statistics_are_sane(dense):
    g = generate(dense, "Hello world", max_tokens=12, temperature=0)
    assert g.prompt_tps > 0 and g.generation_tps > 0 and g.ttft_s > 0
    assert 0 < g.prompt_s <= g.ttft_s <= g.total_s
    assert g.generation_s <= g.total_s
    # 11 decode steps in generation_s
    assert g.generation_tps == pytest.approx(11 / g.generation_s)
    # peak RSS of a Python process with numpy and a 1 MB model mapped: more
    # than 10 MiB, less than 64 GiB
    assert 10 << 20 < g.peak_memory_bytes < 64 << 30
    d = g.to_dict()
    for k in ("text", "tokens", "prompt_tokens", "generated_tokens", "prompt_tps",
              "generation_tps", "ttft_s", "peak_memory_bytes", "finish_reason"):
        assert d[k] == getattr(g, k)
    one = generate(dense, "Hello world", max_tokens=1, temperature=0)
    assert one.generation_tps == 0.0 and one.generated_tokens == 1
