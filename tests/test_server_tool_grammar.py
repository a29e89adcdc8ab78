"""The forced tool-call grammar (ds4py/server/tool_grammar.py) in process: which
replies it admits, token by token, on both tokenizers (the dense test model's and
the demo model's, where <tool_call> is a special token)."""

from __future__ import annotations

import pytest

import ds4py
from ds4py.server.grammar import GrammarCompiler
from ds4py.server.tool_grammar import MAX_STRING_CHARS, tag, tool_call_lark
from tests.server.proc import DEMO, DENSE

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "required": ["city"],
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                   "opts": {"type": "array", "items": {"type": "integer"}},
                   "unit": {"enum": ["c", "f"]}, "exact": {"type": "boolean"}}}}},
    {"type": "function", "function": {"name": "now"}}]
B, E = "<tool_call>\n<function=get_weather>\n", "</function>\n</tool_call>"


def _p(name: str, value: str) -> str:
    return f"<parameter={name}>\n{value}\n</parameter>\n"


@pytest.fixture(scope="module", params=[DENSE, DEMO], ids=["dense", "demo"])
def admits(request):
    m = ds4py.load(request.param)
    tok = m.tokenizer
    comp = GrammarCompiler(tok, m.config.vocab_size)
    lark = tool_call_lark(TOOLS, ["get_weather", "now"], tag(tok, "<tool_call>"),
                          tag(tok, "</tool_call>"))

    def check(text: str) -> bool:
        """True when the grammar takes every token of text and then accepts."""
        g = comp.lark(lark)
        for t in tok.encode(text, special=True):
            if not g.allowed()[t]:
                return False
            g.consume(t)
        return g.finished()
    return check


@pytest.mark.parametrize("reply", [
    B + _p("city", "Paris") + E,
    B + _p("city", "Paris") + _p("days", "-3") + E,
    B + _p("city", "two\nlines") + _p("opts", "[1, 2]") + _p("unit", "f") + E,
    B + _p("city", "x") + _p("exact", "true") + E,
    B + _p("city", "x" * MAX_STRING_CHARS) + E,
    "<tool_call>\n<function=now>\n</function>\n</tool_call>",
    "<tool_call>\n<function=now>\n" + _p("anything", "1") + "</function>\n</tool_call>",
])
def test_admits_calls_that_match_the_schema(admits, reply):
    assert admits(reply)


@pytest.mark.parametrize("reply", [
    B + E,                                                  # required city missing
    B + _p("days", "3") + E,                                # required city missing
    B + _p("city", "Paris") + _p("days", "abc") + E,        # not an integer
    B + _p("city", "Paris") + _p("unit", "kelvin") + E,     # not in the enum
    B + _p("city", "Paris") + _p("opts", "[1, \"a\"]") + E,  # array of integers
    B + _p("city", "Paris") + _p("zzz", "1") + E,           # undeclared argument
    B + _p("days", "3") + _p("city", "Paris") + E,          # out of declared order
    B + _p("city", "Paris") + _p("city", "Rome") + E,       # repeated
    B + _p("city", "x" * (MAX_STRING_CHARS + 1)) + E,       # over the bound
    B + _p("city", "a<b") + E,                              # '<' would open a tag
    "<tool_call>\n<function=other>\n</function>\n</tool_call>",  # unknown function
    "Sure! " + B + _p("city", "Paris") + E,                 # text before the call
])
def test_refuses_calls_that_do_not(admits, reply):
    assert not admits(reply)
