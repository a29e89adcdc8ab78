"""ds4py-server: tool calls, reasoning, structured output, the Anthropic API, the
chat page, and malformed requests. Random weights: the reply is forced with the
test hook ``ds4py_forced_tokens`` (--enable-test-hooks) so the output parser and
the SSE deltas run on a known reply; structured output is the grammar's doing."""

from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ds4py
from tests.server.proc import API_KEY, DEMO, DENSE, ServerProcess

MODEL = "dense-q8_0.gguf"
MODELS = {"dense": DENSE, "demo": DEMO}  # random weights; the trained demo model
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "days": {"type": "integer"}}}}}]
CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def server():
    s = ServerProcess("--parallel", "2")
    s.wait_ready()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key=API_KEY, max_retries=0)


@pytest.fixture(scope="module")
def tok():
    return ds4py.load(DENSE).tokenizer


class Served:
    """A running server on one model, its openai client, tokenizer and model name."""

    def __init__(self, server: ServerProcess, path: str):
        self.server = server
        self.client = openai.OpenAI(base_url=server.base + "/v1", api_key=API_KEY,
                                    max_retries=0)
        self.tok = ds4py.load(path).tokenizer
        self.name = path.rsplit("/", 1)[-1]


@pytest.fixture(scope="module", params=sorted(MODELS))
def served(request, server):
    """The tool-call and reasoning tests on each model: the dense one reuses the
    module's server, the demo model gets its own."""
    path = MODELS[request.param]
    if path == DENSE:
        yield Served(server, path)
        return
    s = ServerProcess("--parallel", "2", model=path)
    s.wait_ready()
    yield Served(s, path)
    s.stop()


def _forced(tok, text: str) -> list[int]:
    return tok.encode(text, special=True) + [tok.eos_id]  # then <|im_end|>


def test_tool_call_parsed(served):
    r = served.client.chat.completions.create(
        model=served.name, messages=[{"role": "user", "content": "weather?"}], tools=TOOLS,
        # thinking off: the demo model's template would open a <think> block first
        extra_body={**NO_THINK,
                    "ds4py_forced_tokens": _forced(served.tok, "Let me look.\n\n" + CALL)})
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    assert ch.message.content == "Let me look."
    (call,) = ch.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3}


def test_tool_call_streamed_as_deltas(served):
    chunks = list(served.client.chat.completions.create(
        model=served.name, messages=[{"role": "user", "content": "weather?"}], tools=TOOLS,
        stream=True, extra_body={**NO_THINK, "ds4py_forced_tokens": _forced(served.tok, CALL)}))
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert len(calls) == 1 and calls[0].index == 0 and calls[0].id.startswith("call_")
    assert calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments) == {"city": "Paris", "days": 3}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ""


def test_reasoning_content(served):
    client, model = served.client, served.name
    forced = _forced(served.tok, "<think>\nponder\n</think>\n\nThe answer.")
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "q"}],
                                       extra_body={"ds4py_forced_tokens": forced})
    msg = r.choices[0].message
    assert msg.content == "The answer."
    assert msg.model_extra["reasoning_content"] == "ponder"
    chunks = list(client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "q"}], stream=True,
        extra_body={"ds4py_forced_tokens": forced}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) \
        == "ponder"
    assert "".join(d.content or "" for d in deltas) == "The answer."


def test_tool_call_after_reasoning(served):
    """Thinking on (the default): reasoning, then the call, parsed apart."""
    forced = _forced(served.tok, "<think>\nI should look it up.\n</think>\n\n" + CALL)
    r = served.client.chat.completions.create(
        model=served.name, messages=[{"role": "user", "content": "weather?"}], tools=TOOLS,
        extra_body={"ds4py_forced_tokens": forced})
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls"
    assert msg.model_extra["reasoning_content"] == "I should look it up."
    assert not msg.content
    (call,) = msg.tool_calls
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3}


def test_tool_choice_required_is_enforced(served):
    # no forcing: the grammar alone makes the model produce a parseable call
    r = served.client.chat.completions.create(
        model=served.name, messages=[{"role": "user", "content": "weather?"}], tools=TOOLS,
        tool_choice="required", max_tokens=300, temperature=0, extra_body=NO_THINK)
    ch = r.choices[0]
    if ch.finish_reason == "length":  # a parameter value may ramble to max_tokens
        pytest.fail(f"the forced tool call did not finish in 300 tokens: {ch.message}")
    assert ch.finish_reason == "tool_calls"
    (call,) = ch.message.tool_calls
    assert call.function.name == "get_weather"
    # the grammar shapes each argument by its schema: declared names, right types
    jsonschema.validate(json.loads(call.function.arguments),
                        TOOLS[0]["function"]["parameters"])


# ---------------------------------------------------------------- structured --
_leaf = st.one_of(
    st.just({"type": "boolean"}),
    st.lists(st.sampled_from(["red", "green", "blue", "x y"]), min_size=1, max_size=3,
             unique=True).map(lambda v: {"enum": v}),
    st.tuples(st.integers(-50, 50), st.integers(0, 60)).map(
        lambda t: {"type": "integer", "minimum": t[0], "maximum": t[0] + t[1]}),
    st.integers(0, 6).map(lambda n: {"type": "string", "maxLength": n}),
    st.just({"type": "null"}),
)


def _obj(children):
    return st.dictionaries(st.sampled_from(["a", "b", "name", "value", "k"]), children,
                           min_size=1, max_size=3).map(
        lambda props: {"type": "object", "properties": props, "required": sorted(props),
                       "additionalProperties": False})


_schema = st.recursive(_leaf, lambda ch: st.one_of(
    _obj(ch), ch.map(lambda c: {"type": "array", "items": c, "maxItems": 3})), max_leaves=6)


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schema=_schema.map(lambda s: s if s.get("type") == "object" else
                          {"type": "object", "properties": {"v": s}, "required": ["v"],
                           "additionalProperties": False}),
       seed=st.integers(0, 2**32 - 1))
def test_json_schema_output_validates(client, schema, seed):
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "json please"}], max_tokens=400,
        temperature=0.7, seed=seed, extra_body=NO_THINK,
        response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": schema}})
    ch = r.choices[0]
    assert ch.finish_reason == "stop", (schema, ch.message.content)
    jsonschema.validate(json.loads(ch.message.content), schema)


def test_structured_output_errors(server, client):
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], extra_body=NO_THINK,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "t", "schema": {"type": "frobnicate"}}})
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                       tools=TOOLS, tool_choice={"type": "function",
                                                                 "function": {"name": "nope"}})


# ----------------------------------------------------------------- anthropic --
def test_anthropic_messages(server, tok):
    c = anthropic.Anthropic(base_url=server.base, api_key=API_KEY, max_retries=0)
    m = c.messages.create(model=MODEL, max_tokens=8, extra_body={"temperature": 0},
                          messages=[{"role": "user", "content": "hello"}])
    assert m.role == "assistant" and m.stop_reason in ("max_tokens", "end_turn")
    if m.stop_reason == "max_tokens":
        assert m.usage.output_tokens == 8
    text = "".join(b.text for b in m.content if b.type == "text")
    with c.messages.stream(model=MODEL, max_tokens=8, extra_body={"temperature": 0},
                           messages=[{"role": "user", "content": "hello"}]) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    assert streamed == text
    assert final.stop_reason == m.stop_reason
    # the stream's message_start reports the prefix cache too (the same prompt ran above)
    with c.messages.stream(model=MODEL, max_tokens=2, messages=[{"role": "user",
                                                                 "content": "hello"}]) as s:
        start = next(ev for ev in s if ev.type == "message_start")
        list(s)
    cached = start.message.usage.cache_read_input_tokens
    assert cached > 0
    assert start.message.usage.input_tokens + cached == m.usage.input_tokens + \
        m.usage.cache_read_input_tokens
    again = c.messages.create(model=MODEL, max_tokens=1,
                              messages=[{"role": "user", "content": "hello"}])
    # the same prompt again is read from the prefix cache
    assert again.usage.cache_read_input_tokens > 0


def test_anthropic_tool_use(served):
    c = anthropic.Anthropic(base_url=served.server.base, api_key=API_KEY, max_retries=0)
    m = c.messages.create(
        model=served.name, max_tokens=200, messages=[{"role": "user", "content": "weather?"}],
        tools=[{"name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]}],
        extra_body={"ds4py_forced_tokens": _forced(served.tok, CALL)})
    assert m.stop_reason == "tool_use"
    (use,) = [b for b in m.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.input == {"city": "Paris", "days": 3}


# ------------------------------------------------------------------- the page --
def test_chat_page_served(server):
    page = httpx.get(server.base + "/")
    assert page.status_code == 200 and "<textarea" in page.text
    js = httpx.get(server.base + "/static/chat.js")
    assert js.status_code == 200 and "/v1/chat/completions" in js.text
    assert "http://" not in page.text and "https://" not in page.text  # no external assets


# ------------------------------------------------------------------ malformed --
MALFORMED = [
    b"", b"null", b"[]", b"42", b'"text"', b"{", b"\xff\xfe\xfd", b'{"messages": null}',
    b'{"messages": []}', b'{"messages": [1, 2]}', b'{"messages": [{"role": "robot"}]}',
    b'{"messages": [{"role": "user", "content": 5}]}',
    b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}',
    b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}',
    b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 1e300}',
    b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 99999999999999999999}',
    b'{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}',
    b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}',
    b'{"messages": [{"role": "user", "content": "x"}], "top_p": 7}',
    b'{"messages": [{"role": "user", "content": "x"}], "logit_bias": {"abc": 1}}',
    b'{"messages": [{"role": "user", "content": "x"}], "logit_bias": {"99999": 1}}',
    b'{"messages": [{"role": "user", "content": "x"}], "stop": [""]}',
    b'{"messages": [{"role": "user", "content": "x"}], "seed": 1e400}',
    b'{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "x"}]}',
    b'{"messages": [{"role": "user", "content": "x"}], "tool_choice": "sometimes"}',
    b'{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}}',
    b'{"messages": [{"role": "assistant", "content": "x", "tool_calls": [{"function": '
    b'{"name": "f", "arguments": "{not json"}}]}]}',
    b'{"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": '
    b'{"enable_thinking": "yes"}}',
]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/messages",
                                  "/tokenize", "/detokenize", "/apply-template"])
def test_malformed_requests_never_5xx(server, path):
    """Each body is malformed for chat completions (400 expected there); other
    endpoints ignore fields they do not have, so they may accept some: never a 5xx."""
    h = {**server.headers(), "content-type": "application/json"}
    for body in MALFORMED:
        r = httpx.post(server.base + path, content=body, headers=h)
        assert r.status_code < 500, (path, body, r.status_code, r.text)
        if path == "/v1/chat/completions" or r.status_code != 200:
            assert r.status_code == 400, (path, body, r.status_code, r.text)
            assert "message" in r.json()["error"], (path, body)
    assert httpx.get(server.base + "/health").status_code == 200


def test_completion_prompt_ids_out_of_vocab(server):
    r = httpx.post(server.base + "/v1/completions", headers=server.headers(),
                   json={"prompt": [10**9], "max_tokens": 1})
    assert r.status_code == 400 and "vocabulary" in r.json()["error"]["message"]
