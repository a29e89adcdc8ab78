"""ds4py-server against the official openai SDK (a real server process on loopback,
the dense Q8_0 golden model: random weights, so the text is gibberish but every
token is checked against ds4py.generate's)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

import ds4py
from tests.server.proc import API_KEY, DEMO, DENSE, ServerProcess

MSGS = [{"role": "user", "content": "Why is the sky blue?"}]


@pytest.fixture(scope="module")
def server():
    s = ServerProcess("--parallel", "4", "--max-body-bytes", "65536")
    s.wait_ready()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key=API_KEY, max_retries=0)


@pytest.fixture(scope="module")
def model():
    return ds4py.load(DENSE)


def test_health_and_models(server, client):
    assert httpx.get(server.base + "/health").json() == {"status": "ok"}
    ids = [m.id for m in client.models.list()]
    assert ids == ["dense-q8_0.gguf"]


def test_greedy_chat_equals_generate(client, model):
    g = ds4py.generate(model, MSGS, max_tokens=24, temperature=0)
    r = client.chat.completions.create(model="dense-q8_0.gguf", messages=MSGS, max_tokens=24,
                                       temperature=0)
    assert r.choices[0].message.content == g.content
    assert r.usage.completion_tokens == g.generated_tokens
    assert r.usage.prompt_tokens == len(g.prompt_ids)
    assert r.choices[0].finish_reason == ("length" if g.finish_reason == "length" else "stop")


def test_greedy_completion_tokens_equal_generate(client, model):
    g = ds4py.generate(model, "Once upon a time", max_tokens=20, temperature=0, logprobs=0)
    r = client.completions.create(model="dense-q8_0.gguf", prompt="Once upon a time",
                                  max_tokens=20, temperature=0, logprobs=0)
    assert r.choices[0].text == g.text
    # each token's string and log-probability: the same ids, in order
    want = [model.tokenizer.token_bytes(t).decode("utf-8", "replace") for t in g.tokens]
    assert r.choices[0].logprobs.tokens == want
    # logprobs travel as JSON floats (repr round-trips doubles exactly)
    assert r.choices[0].logprobs.token_logprobs == [lp.logprob for lp in g.logprobs]


def test_seeded_sampling_reproducible_and_equal_generate(client, model):
    g = ds4py.generate(model, MSGS, max_tokens=24, temperature=0.9, top_k=40, seed=1234)
    outs = [client.chat.completions.create(messages=MSGS, model="dense-q8_0.gguf",
                                           max_tokens=24, temperature=0.9, seed=1234,
                                           extra_body={"top_k": 40}).choices[0].message.content
            for _ in range(2)]
    assert outs[0] == outs[1] == g.content


def test_stream_equals_non_stream_with_usage_and_cache(client):
    kw = dict(model="dense-q8_0.gguf", messages=[{"role": "user", "content": "stream me"}],
              max_tokens=16, temperature=0)
    full = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(**kw, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finish = [c.choices[0].finish_reason for c in chunks if c.choices
              and c.choices[0].finish_reason]
    assert finish == [full.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    u = chunks[-1].usage
    assert u.completion_tokens == full.usage.completion_tokens
    # the same prompt again: the whole prompt comes from the shared prefix cache
    assert u.prompt_tokens_details.cached_tokens == u.prompt_tokens


def test_follow_up_turn_reuses_previous_turn(client):
    first = [{"role": "user", "content": "first turn"}]
    r1 = client.chat.completions.create(model="dense-q8_0.gguf", messages=first, max_tokens=8,
                                        temperature=0)
    follow = first + [{"role": "assistant", "content": r1.choices[0].message.content},
                      {"role": "user", "content": "second"}]
    r2 = client.chat.completions.create(model="dense-q8_0.gguf", messages=follow,
                                        max_tokens=4, temperature=0)
    # at least the first turn's prompt is reused (snapshot at its end)
    assert r2.usage.prompt_tokens_details.cached_tokens >= r1.usage.prompt_tokens


def test_chat_logprobs_match_generate(client, model):
    g = ds4py.generate(model, MSGS, max_tokens=6, temperature=0, logprobs=3)
    r = client.chat.completions.create(model="dense-q8_0.gguf", messages=MSGS, max_tokens=6,
                                       temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert [c.logprob for c in content] == [lp.logprob for lp in g.logprobs]
    for c, lp in zip(content, g.logprobs, strict=True):
        assert [t.logprob for t in c.top_logprobs] == list(lp.top_logprobs)
        assert bytes(c.bytes) == model.tokenizer.token_bytes(lp.token)


def test_logit_bias_bans_the_greedy_token(client, model):
    g = ds4py.generate(model, MSGS, max_tokens=1, temperature=0)
    first = g.tokens[0]
    r = client.chat.completions.create(model="dense-q8_0.gguf", messages=MSGS, max_tokens=1,
                                       temperature=0, logit_bias={str(first): -100},
                                       logprobs=True)
    assert bytes(r.choices[0].logprobs.content[0].bytes) != model.tokenizer.token_bytes(first)


def test_stop_string_and_length(client, model):
    g = ds4py.generate(model, MSGS, max_tokens=24, temperature=0)
    stop = g.content[5:9]
    r = client.chat.completions.create(model="dense-q8_0.gguf", messages=MSGS, max_tokens=24,
                                       temperature=0, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == g.content[:g.content.index(stop)]


def test_errors(server, client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="dense-q8_0.gguf", messages=MSGS, n=2)
    assert "n other than 1" in e.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4", messages=MSGS)
    bad = openai.OpenAI(base_url=server.base + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="dense-q8_0.gguf", messages=MSGS)
    with pytest.raises(openai.BadRequestError) as e:  # longer than the 4096-token context
        client.completions.create(model="dense-q8_0.gguf", prompt=[1] * 5000, max_tokens=1)
    assert e.value.body["code"] == "context_length_exceeded"
    big = httpx.post(server.base + "/v1/chat/completions", headers=server.headers(),
                     json={"messages": [{"role": "user", "content": "x" * 100_000}]})
    assert big.status_code == 413 and "exceeds the limit" in big.json()["error"]["message"]


def test_context_end_is_length(server):
    r = httpx.post(server.base + "/v1/completions", headers=server.headers(),
                   json={"prompt": [5] * 4090, "max_tokens": 100, "temperature": 0},
                   timeout=120)  # a 4090-token prefill: seconds on a loaded 2-core machine
    assert r.status_code == 200
    body = r.json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 6  # 4096 - 4090


def test_tokenize_detokenize_template(server, model):
    h = server.headers()
    ids = httpx.post(server.base + "/tokenize", headers=h, json={"content": "Hello world"}).json()
    assert ids["tokens"] == model.tokenizer.encode("Hello world")
    text = httpx.post(server.base + "/detokenize", headers=h, json=ids).json()["content"]
    assert text == "Hello world"
    p = httpx.post(server.base + "/apply-template", headers=h, json={"messages": MSGS}).json()
    assert p["prompt"] == model.tokenizer.apply_chat_template(MSGS)
    r = httpx.post(server.base + "/detokenize", headers=h, json={"tokens": [10**6]})
    assert r.status_code == 400


def test_metrics(server, client):
    client.chat.completions.create(model="dense-q8_0.gguf", messages=MSGS, max_tokens=2)
    text = httpx.get(server.base + "/metrics").text
    for name in ("ds4py_prompt_tokens_total", "ds4py_generated_tokens_total",
                 "ds4py_requests_running", "ds4py_requests_queued",
                 "ds4py_prefix_cache_reused_tokens_total",
                 "ds4py_generation_tokens_per_second"):
        assert name in text
    gen = [ln for ln in text.splitlines() if ln.startswith("ds4py_generated_tokens_total")]
    assert float(gen[0].split()[1]) >= 2


def test_ipv6_loopback():
    s = ServerProcess(host="::1", api_key=None)
    try:
        s.wait_ready()
        c = openai.OpenAI(base_url=s.base + "/v1", api_key="none", max_retries=0)
        r = c.chat.completions.create(model="dense-q8_0.gguf", messages=MSGS, max_tokens=2)
        assert r.usage.completion_tokens == 2
    finally:
        s.stop()


def test_response_format_json_object(client):
    r = client.chat.completions.create(
        model="dense-q8_0.gguf", messages=MSGS, max_tokens=200, temperature=0,
        response_format={"type": "json_object"},
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:  # random weights may ramble inside a string until max_tokens: still a JSON prefix
        assert r.choices[0].message.content.startswith("{")


# ---------------------------------------------------------------- demo model --
# The trained demo model is what ds4py-server serves without -m. generate()
# drafts with its bundled MTP head by default; the server's engine does not
# draft. Exact speculation means both give the same greedy tokens.
@pytest.fixture(scope="module")
def demo_server():
    s = ServerProcess("--parallel", "2", model=None)
    s.wait_ready()
    yield s
    s.stop()


@pytest.mark.parametrize("question", ["Parse a URL.", "Return the sum of two numbers."])
def test_demo_greedy_chat_equals_drafted_generate(demo_server, question):
    model = ds4py.load(DEMO)
    msgs = [{"role": "user", "content": question}]
    g = ds4py.generate(model, msgs, max_tokens=64, temperature=0)
    assert g.draft and g.draft.get("drafted", 0) > 0, \
        f"generate() was expected to draft on the demo model: {g.draft}"
    plain = ds4py.generate(model, msgs, max_tokens=64, temperature=0, draft=False)
    assert plain.tokens == g.tokens
    client = openai.OpenAI(base_url=demo_server.base + "/v1", api_key=API_KEY, max_retries=0)
    assert [m.id for m in client.models.list()] == ["demo-q8_0.gguf"]  # the default model
    kw = dict(model="demo-q8_0.gguf", messages=msgs, max_tokens=64, temperature=0)
    r = client.chat.completions.create(**kw, logprobs=True)
    assert r.usage.completion_tokens == g.generated_tokens
    # token by token: each generated token's bytes, in order
    assert [bytes(c.bytes) for c in r.choices[0].logprobs.content] == \
        [model.tokenizer.token_bytes(t) for t in g.tokens]
    assert r.choices[0].message.content == g.content
    assert r.choices[0].message.model_extra.get("reasoning_content") == g.reasoning
    chunks = list(client.chat.completions.create(**kw, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == g.content
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) \
        == g.reasoning
