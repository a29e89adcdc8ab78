"""ds4py.output_parser: reasoning / content / tool calls out of a streamed reply.

Expected results are written out by hand from the format the Qwen3.5 chat
template asks for; the assistant turns of the recorded transformers renderings
(tests/golden/tokenizer/chat_renderings.json) are parsed back into the messages
they were rendered from. Every reply is also fed split at every character and
every byte boundary, one byte at a time, at the golden tokenizer's token
boundaries (as bytes and as incrementally decoded text) and at random points;
the result must not change, and what has streamed out must never be taken back.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ds4py.output_parser import (
    OutputParser,
    ParsedOutput,
    ToolCall,
    collect,
    parse_output,
    parse_tool_call_body,
    prompt_ends_in_thinking,
)
from ds4py.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "golden" / "tokenizer" / "chat_renderings.json"

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "unit": {"type": "string"},
            "days": {"type": "integer"}}}}},
    {"type": "function", "function": {
        "name": "run_python",
        "parameters": {"type": "object", "properties": {
            "code": {"type": "string"},
            "options": {"type": "object"},
            "flags": {"type": "array"},
            "ratio": {"type": "number"},
            "dry": {"type": "boolean"},
            "maybe": {"type": ["integer", "null"]},
            "zip": {"type": "string"}}}}},
]


def _xml(name, **params):
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


# (reply, starts_in_thinking, tools, expected ParsedOutput)
CASES = [
    ("Let me think.\nStep 1: 2+2.\n</think>\n\nThe answer is **4**.", True, None,
     ParsedOutput("Let me think.\nStep 1: 2+2.", "The answer is **4**.", ())),
    ("Hello! 👋 <b>bold</b> a < b > c", False, None,
     ParsedOutput("", "Hello! 👋 <b>bold</b> a < b > c", ())),
    ("\n\n<think>\nopened by the model\n</think>\n\nthen content", False, None,
     ParsedOutput("opened by the model", "then content", ())),
    ("<think>\nrepeated open\n</think>\n\ncontent", True, None,
     ParsedOutput("repeated open", "content", ())),
    ("still thinking when cut off\n\n", True, None,
     ParsedOutput("still thinking when cut off", "", ())),
    ("", True, None, ParsedOutput("", "", ())),
    ("\n\n\n", False, None, ParsedOutput("", "", ())),
    # a tool call after content, arguments typed by the tool schemas
    ("I should look it up.\n</think>\n\nChecking the weather.\n\n"
     + _xml("get_weather", city="東京 (Tokyo)", unit="celsius", days="3"), True, TOOLS,
     ParsedOutput("I should look it up.", "Checking the weather.",
                  (ToolCall("get_weather", {"city": "東京 (Tokyo)", "unit": "celsius",
                                            "days": 3}),))),
    # two calls, multi-line string value, JSON values, Python-literal booleans,
    # a union type, a declared string that looks like a number
    ("</think>\n\n" + _xml("run_python", code="import os\nprint('</tool_call')\n\nx = 1 < 2",
                           options='{"timeout": 1.5, "env": {"A": "é"}}', flags="[true, false]",
                           ratio="0.25", dry="True", maybe="None", zip="01234")
     + "\n" + _xml("get_weather", city="Oslo"), True, TOOLS,
     ParsedOutput("", "", (
         ToolCall("run_python", {"code": "import os\nprint('</tool_call')\n\nx = 1 < 2",
                                 "options": {"timeout": 1.5, "env": {"A": "é"}},
                                 "flags": [True, False], "ratio": 0.25, "dry": True,
                                 "maybe": None, "zip": "01234"}),
         ToolCall("get_weather", {"city": "Oslo"})))),
    # without schemas: JSON when the value is JSON, text otherwise
    (_xml("anything", n="42", s="hello world", j='{"a": [1]}', b="False"), False, None,
     ParsedOutput("", "", (ToolCall("anything", {"n": 42, "s": "hello world",
                                                 "j": {"a": [1]}, "b": "False"}),))),
    # a value that does not convert to its declared type stays text
    (_xml("get_weather", city="Rome", days="three"), False, TOOLS,
     ParsedOutput("", "", (ToolCall("get_weather", {"city": "Rome", "days": "three"}),))),
    # the older JSON form
    ('Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lima"}}\n</tool_call>',
     False, None,
     ParsedOutput("", "Sure.", (ToolCall("get_weather", {"city": "Lima"}),))),
    ('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>', False, None,
     ParsedOutput("", "", (ToolCall("f", {"x": 1}),))),
    # text after a call is content: content is the text outside the blocks, joined,
    # with newlines trimmed at its two ends only
    ("A\n\n" + _xml("f", x="1") + "\n" + _xml("g") + "\nB\n", False, None,
     ParsedOutput("", "A\n\n\n\nB", (ToolCall("f", {"x": 1}), ToolCall("g", {})))),
    # malformed blocks pass through as content, tags included
    ("x <tool_call>not a call</tool_call> y", False, None,
     ParsedOutput("", "x <tool_call>not a call</tool_call> y", ())),
    ("<tool_call>\n<function=f>\nstray\n</function>\n</tool_call>", False, None,
     ParsedOutput("", "<tool_call>\n<function=f>\nstray\n</function>\n</tool_call>", ())),
    # still open at the end: a complete body is a call, an incomplete one is text
    ("<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n", False, None,
     ParsedOutput("", "", (ToolCall("f", {"a": 1}),))),
    ("ok <tool_call>\n<function=f>\n<parameter=a>\n1", False, None,
     ParsedOutput("", "ok <tool_call>\n<function=f>\n<parameter=a>\n1", ())),
    # partial tags at the end are text
    ("see <tool_cal", False, None, ParsedOutput("", "see <tool_cal", ())),
    ("almost </thin", True, None, ParsedOutput("almost </thin", "", ())),
    ("<thin", False, None, ParsedOutput("", "<thin", ())),
    # tags inside the reasoning are reasoning text; </think> in content is text
    ("plan: emit <tool_call> later\n</think>\nanswer </think> done", True, None,
     ParsedOutput("plan: emit <tool_call> later", "answer </think> done", ())),
    # a <think> that is not at the very start is content
    ("x <think>y</think>", False, None, ParsedOutput("", "x <think>y</think>", ())),
    # CRLF and interior blank lines are kept; only \n runs at the ends are trimmed
    ("r1\r\n\r\nr2\n</think>\n\nc1\n\n\nc2 \n", True, None,
     ParsedOutput("r1\r\n\r\nr2", "c1\n\n\nc2 ", ())),
]


def _feed_all(pieces, starts_in_thinking, tools):
    """Feed pieces; check that nothing streamed out is ever taken back; return the
    result from the events and from the parser's own accumulators."""
    p = OutputParser(starts_in_thinking=starts_in_thinking, tools=tools)
    events = []
    for piece in pieces:
        events += p.feed(piece)
        so_far = collect(events)
        assert p.reasoning == so_far.reasoning and p.content == so_far.content
    events += p.finish()
    res = p.result()
    assert collect(events) == res
    return res, events


def _check_prefix_stream(pieces, starts_in_thinking, tools, final):
    p = OutputParser(starts_in_thinking=starts_in_thinking, tools=tools)
    for piece in pieces:
        p.feed(piece)
        # Monotone: what has come out is a prefix of the final answer.
        assert final.reasoning.startswith(p.reasoning)
        assert final.content.startswith(p.content)
        assert final.tool_calls[:len(p.tool_calls)] == tuple(p.tool_calls)
    p.finish()
    assert p.result() == final


@pytest.mark.parametrize("case", range(len(CASES)))
def test_whole_reply(case):
    reply, thinking, tools, want = CASES[case]
    got = parse_output(reply, starts_in_thinking=thinking, tools=tools)
    assert got == want
    for call in got.tool_calls:
        assert call.raw  # the block text is kept for logging


@pytest.mark.parametrize("case", range(len(CASES)))
def test_every_character_and_byte_split(case):
    reply, thinking, tools, want = CASES[case]
    data = reply.encode("utf-8")
    for k in range(len(reply) + 1):
        assert _feed_all([reply[:k], reply[k:]], thinking, tools)[0] == want
    for k in range(len(data) + 1):
        assert _feed_all([data[:k], data[k:]], thinking, tools)[0] == want
    one_byte = [data[i:i + 1] for i in range(len(data))]
    _check_prefix_stream(one_byte, thinking, tools, want)
    _check_prefix_stream(list(reply), thinking, tools, want)


@pytest.fixture(scope="module")
def golden_tok():
    return Tokenizer.from_gguf(ROOT / "tests" / "golden" / "models" / "dense-q8_0.gguf")


@pytest.mark.parametrize("case", range(len(CASES)))
def test_token_boundaries(case, golden_tok):
    """The golden vocabulary has <think>, </think>, <tool_call>, </tool_call> as
    single tokens and splits non-ASCII text into byte tokens, like Qwen's."""
    reply, thinking, tools, want = CASES[case]
    ids = golden_tok.encode(reply, special=True)
    assert golden_tok.decode(ids) == reply
    _check_prefix_stream([golden_tok.token_bytes(i) for i in ids], thinking, tools, want)
    dec = golden_tok.stream()
    texts = [dec.feed(i) for i in ids] + [dec.finish()]
    _check_prefix_stream(texts, thinking, tools, want)


@settings(max_examples=300, deadline=None)
@given(case=st.integers(0, len(CASES) - 1), cuts=st.lists(st.integers(0, 10_000), max_size=12))
def test_random_splits(case, cuts):
    reply, thinking, tools, want = CASES[case]
    data = reply.encode("utf-8")
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces = [data[a:b] for a, b in zip([0] + points, points + [len(data)], strict=True)]
    _check_prefix_stream(pieces, thinking, tools, want)


# -- the real template's renderings, parsed back -----------------------------------------


def _assistant_turns(text: str) -> list[str]:
    turns = []
    for block in text.split("<|im_start|>assistant\n")[1:]:
        if "<|im_end|>" in block:
            turns.append(block.split("<|im_end|>")[0])
    return turns


def test_parses_what_the_qwen35_template_renders():
    """Assistant turns that transformers rendered with the real Qwen3.5 template
    (recorded in the fixture; no template needed here) parse back into the
    reasoning, content and tool calls of the messages they came from."""
    data = json.loads(FIXTURE.read_text(encoding="utf-8"))
    case = next(c for c in data["cases"]
                if c["name"] == "multi-step-tool-reasoning/thinking=on")
    turns = _assistant_turns(case["expected"])
    assert len(turns) == 2
    # Both turns follow the last user query, so the template wrote their reasoning
    # in a <think> block: parse as a reply that opens with one.
    first = parse_output(turns[0], starts_in_thinking=False, tools=case["tools"])
    assert first.reasoning == "The user wants weather; call the tool."
    assert first.content == "Let me check."
    assert first.tool_calls == (
        ToolCall("get_weather", {"city": "Paris", "unit": "celsius", "days": 3}),
        # verbose/limit are not in the tool's schema: their text ("False"/"None",
        # Python's str() in the template) is not JSON and stays text
        ToolCall("run_python", {"code": "print('héllo')\nprint(1 < 2)",
                                "options": {"timeout": 1.5, "nested": [1, "二", None]},
                                "flags": [True, False], "verbose": "False", "limit": "None"}),
    )
    second = parse_output(turns[1], starts_in_thinking=False, tools=case["tools"])
    assert second == ParsedOutput("step 2", "Need more.",
                                  (ToolCall("get_weather", {"city": "Lyon"}),))
    # An earlier turn (before the last query) is rendered without reasoning.
    case = next(c for c in data["cases"] if c["name"] == "history/thinking=off")
    turns = _assistant_turns(case["expected"])
    assert [parse_output(t, starts_in_thinking=False) for t in turns] == [
        ParsedOutput("", "Hello! How can I help?", ()),
        ParsedOutput("", "Why did the GPU stop? It ran out of memory.", ())]


def test_generation_prompt_sets_the_start_state():
    """The recorded generation prompts end inside a think block exactly when thinking
    is on -- what starts_in_thinking must mirror."""
    data = json.loads(FIXTURE.read_text(encoding="utf-8"))
    for c in data["cases"]:
        if c["template"] != "qwen3.5" or "expected" not in c:
            continue
        if not c["kwargs"]["add_generation_prompt"]:
            continue
        on = c["kwargs"]["enable_thinking"]
        assert c["expected"].endswith("<|im_start|>assistant\n<think>\n" if on else
                                      "<|im_start|>assistant\n<think>\n\n</think>\n\n")
        assert prompt_ends_in_thinking(c["expected"]) is on
        assert OutputParser.for_prompt(c["expected"]).in_reasoning is on


def test_misuse():
    p = OutputParser()
    p.feed(b"\xe6")
    with pytest.raises(ValueError):
        p.feed("text while a byte is pending")
    p = OutputParser()
    p.finish()
    with pytest.raises(RuntimeError):
        p.feed("x")
    assert p.finish() == []
    assert parse_tool_call_body("<function=>\n</function>") is None
    assert parse_tool_call_body('{"arguments": {}}') is None
    assert ToolCall("f", {"a": "é"}).to_openai() == {
        "type": "function", "function": {"name": "f", "arguments": '{"a": "é"}'}}
