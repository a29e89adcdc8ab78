"""Split a Qwen3.5 reply, as it streams, into reasoning, content and tool calls.

    p = OutputParser(starts_in_thinking=True, tools=tools)   # prompt ended "<think>\\n"
    for piece in pieces:                  # str, or bytes (split anywhere)
        for ev in p.feed(piece):
            ...                          # Event("reasoning"|"content", text=...) or
                                         # Event("tool_call", tool_call=ToolCall(...))
    for ev in p.finish(): ...
    p.reasoning, p.content, p.tool_calls # everything, once finished

The reply format is the one the Qwen3.5 chat template (tokenizer.chat_template)
asks for and re-renders:

- Reasoning. With thinking on, the generation prompt ends with ``<think>\\n``,
  so the reply starts inside the reasoning block and ``</think>`` ends it
  (``starts_in_thinking=True``). With thinking off the prompt already holds an
  empty block and the reply is content; a reply that nevertheless opens with
  ``<think>`` (after optional newlines) starts a reasoning block. A ``<think>``
  anywhere else is text.
- Tool calls, in the content part only::

      <tool_call>
      <function=NAME>
      <parameter=ARG>
      VALUE
      </parameter>
      </function>
      </tool_call>

  VALUE is the text between ``<parameter=ARG>\\n`` and ``\\n</parameter>``. The
  template writes strings raw, objects/arrays as JSON and other values with
  Python's ``str``. With ``tools`` (JSON schemas) each argument is converted to
  its declared type (string: kept; integer/number/boolean/null/object/array:
  parsed, "True"/"False"/"None" accepted for the Python spellings); an argument
  without a declared type is parsed as JSON when it is valid JSON and kept as
  text otherwise. A value that does not convert stays text. The older form
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` is accepted too.
  A block that parses as neither is passed through as content, tags included.
  A block still open at ``finish()`` is taken as a call if its body is complete
  (``</function>`` seen, or whole JSON), otherwise passed through as content.

Whitespace: the template re-renders a turn as ``<think>\\n`` + reasoning +
``\\n</think>\\n\\n`` + content (stripping newlines it finds there), and separates
content from a following tool call with ``\\n\\n``. So newlines (``\\n`` only) at the
start and end of the reasoning, and at the start and end of the content, are
dropped; content is everything outside the think block and the tool-call
blocks, joined. Streaming holds back a trailing run of newlines until more text
shows it is inside the section, and holds back any text that may be the start of
a tag (``</think>`` in reasoning, ``<tool_call>`` in content, ``<think>`` at the
very start), so no partial tag is ever emitted as text.

Invariant (tests/test_output_parser.py): the concatenated reasoning and content
deltas, the tool-call events in order, and the final ``reasoning``, ``content``
and ``tool_calls`` do not depend on how the reply was split into pieces --
characters, bytes or tokens (only the sizes of the deltas do).
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["OutputParser", "Event", "ToolCall", "ParsedOutput", "parse_output",
           "parse_tool_call_body", "prompt_ends_in_thinking"]

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
TOOL_OPEN = "<tool_call>"
TOOL_CLOSE = "</tool_call>"
_NL = "\n"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]
    raw: str = field(default="", compare=False)  # the block's text between the tags

    def to_openai(self) -> dict:
        return {"type": "function",
                "function": {"name": self.name,
                             "arguments": json.dumps(self.arguments, ensure_ascii=False)}}


@dataclass(frozen=True)
class Event:
    kind: str                      # "reasoning", "content" or "tool_call"
    text: str = ""
    tool_call: ToolCall | None = None


@dataclass(frozen=True)
class ParsedOutput:
    reasoning: str
    content: str
    tool_calls: tuple[ToolCall, ...]


# -- tool-call bodies -------------------------------------------------------------------

_FUNC_RE = re.compile(r"\A\s*<function=([^>\n]+)>(.*)</function>\s*\Z", re.S)
_PARAM_RE = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)


def _param_types(tools: Sequence[Mapping] | None) -> dict[str, dict[str, Any]]:
    """function name -> {argument name -> JSON-schema type (str or list)}."""
    out: dict[str, dict[str, Any]] = {}
    for t in tools or ():
        fn = t.get("function", t) if isinstance(t, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            continue
        props = (fn.get("parameters") or {}).get("properties") or {}
        out[fn["name"]] = {k: (v.get("type") if isinstance(v, Mapping) else None)
                           for k, v in props.items()} if isinstance(props, Mapping) else {}
    return out


_PY_LITERALS = {"True": True, "False": False, "None": None, "true": True, "false": False,
                "null": None}
_SENTINEL = object()


def _convert_one(text: str, ty: str) -> Any:
    if ty == "string":
        return text
    s = text.strip()
    if ty == "boolean":
        v = _PY_LITERALS.get(s, _SENTINEL)
        return v if isinstance(v, bool) else _SENTINEL
    if ty == "null":
        return None if s in ("None", "null") else _SENTINEL
    if ty == "integer":
        try:
            return int(s)
        except ValueError:
            return _SENTINEL
    if ty == "number":
        try:
            v = json.loads(s)
        except ValueError:
            return _SENTINEL
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) else _SENTINEL
    if ty in ("object", "array"):
        try:
            v = json.loads(s)
        except ValueError:
            return _SENTINEL
        want = dict if ty == "object" else list
        return v if isinstance(v, want) else _SENTINEL
    return _SENTINEL


def _convert(text: str, ty: Any) -> Any:
    if ty is None:
        try:
            return json.loads(text)
        except ValueError:
            return text
    types = ty if isinstance(ty, list) else [ty]
    if "string" in types and len(types) == 1:
        return text
    for t in types:  # a union: the first type the text converts to, strings last
        if t == "string":
            continue
        v = _convert_one(text, t)
        if v is not _SENTINEL:
            return v
    return text


def parse_tool_call_body(body: str, tools: Sequence[Mapping] | None = None,
                         _types: dict | None = None) -> ToolCall | None:
    """Parse the text between ``<tool_call>`` and ``</tool_call>``; None if it is
    neither the XML nor the JSON form."""
    types = _types if _types is not None else _param_types(tools)
    m = _FUNC_RE.match(body)
    if m:
        name, inner = m.group(1).strip(), m.group(2)
        if not name:
            return None
        declared = types.get(name, {})
        args: dict[str, Any] = {}
        pos = 0
        for pm in _PARAM_RE.finditer(inner):
            if inner[pos:pm.start()].strip():  # stray text between parameters
                return None
            value = pm.group(2)
            if value.startswith(_NL):
                value = value[1:]
            if value.endswith(_NL):
                value = value[:-1]
            key = pm.group(1).strip()
            args[key] = _convert(value, declared.get(key))
            pos = pm.end()
        if inner[pos:].strip():
            return None
        return ToolCall(name, args, body)
    s = body.strip()
    if s.startswith("{"):
        try:
            obj = json.loads(s)
        except ValueError:
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                return None
        if not isinstance(args, dict):
            return None
        return ToolCall(obj["name"], args, body)
    return None


# -- streaming --------------------------------------------------------------------------


def _partial_suffix(buf: str, tag: str) -> int:
    """Length of the longest suffix of ``buf`` that is a proper prefix of ``tag``."""
    for n in range(min(len(buf), len(tag) - 1), 0, -1):
        if tag.startswith(buf[-n:]):
            return n
    return 0


class _Section:
    """Newline trimming at both ends of a section, streaming: leading newlines are
    dropped, a trailing run is held until non-newline text follows, and dropped
    at the end."""

    def __init__(self):
        self.leading = True
        self.held = ""
        self.text = []

    def emit(self, s: str) -> str:
        if not s:
            return ""
        if self.leading:
            s = s.lstrip(_NL)
            if not s:
                return ""
            self.leading = False
        body = s.rstrip(_NL)
        if not body:
            self.held += s
            return ""
        out = self.held + body
        self.held = s[len(body):]
        self.text.append(out)
        return out

    def value(self) -> str:
        return "".join(self.text)


_REASONING, _CONTENT, _TOOL = "reasoning", "content", "tool"


class OutputParser:
    """Incremental parser; see the module docstring."""

    @classmethod
    def for_prompt(cls, prompt: str, tools: Sequence[Mapping] | None = None) -> OutputParser:
        """A parser for the reply to ``prompt`` (its start state read off the prompt)."""
        return cls(starts_in_thinking=prompt_ends_in_thinking(prompt), tools=tools)

    def __init__(self, starts_in_thinking: bool = True,
                 tools: Sequence[Mapping] | None = None):
        self._state = _REASONING if starts_in_thinking else _CONTENT
        # At the very start a "<think>" may open (or, in thinking mode, repeat) the
        # reasoning block.
        self._at_start = True
        self._buf = ""
        self._tool_body = ""
        self._reasoning = _Section()
        self._content = _Section()
        self._calls: list[ToolCall] = []
        self._types = _param_types(tools)
        self._bytes = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._finished = False

    # -- public -------------------------------------------------------------------------

    def feed(self, piece: str | bytes) -> list[Event]:
        if self._finished:
            raise RuntimeError("OutputParser.feed after finish()")
        if isinstance(piece, (bytes, bytearray, memoryview)):
            piece = self._bytes.decode(bytes(piece))
        elif self._bytes.getstate()[0]:
            raise ValueError("OutputParser: text fed while bytes of an unfinished UTF-8 "
                             "character are pending")
        self._buf += piece
        out: list[Event] = []
        self._run(out, final=False)
        return out

    def finish(self) -> list[Event]:
        if self._finished:
            return []
        self._buf += self._bytes.decode(b"", final=True)
        out: list[Event] = []
        self._run(out, final=True)
        self._finished = True
        return out

    @property
    def reasoning(self) -> str:
        return self._reasoning.value()

    @property
    def content(self) -> str:
        return self._content.value()

    @property
    def tool_calls(self) -> list[ToolCall]:
        return list(self._calls)

    @property
    def in_reasoning(self) -> bool:
        return self._state == _REASONING

    def result(self) -> ParsedOutput:
        return ParsedOutput(self.reasoning, self.content, tuple(self._calls))

    # -- internals ------------------------------------------------------------------------

    def _say(self, out: list[Event], kind: str, text: str) -> None:
        sec = self._reasoning if kind == _REASONING else self._content
        s = sec.emit(text)
        if s:
            out.append(Event(kind, s))

    def _run(self, out: list[Event], final: bool) -> None:
        while True:
            if self._at_start:
                # Only newlines may precede an opening "<think>"; they are trimmed anyway.
                rest = self._buf.lstrip(_NL)
                if rest.startswith(THINK_OPEN):
                    self._buf = rest[len(THINK_OPEN):]
                    self._state = _REASONING
                    self._at_start = False
                    continue
                if THINK_OPEN.startswith(rest) and not final:
                    return  # nothing yet, or a prefix of "<think>": wait
                self._at_start = False
            if self._state == _REASONING:
                i = self._buf.find(THINK_CLOSE)
                if i >= 0:
                    self._say(out, _REASONING, self._buf[:i])
                    self._buf = self._buf[i + len(THINK_CLOSE):]
                    self._state = _CONTENT
                    continue
                keep = 0 if final else _partial_suffix(self._buf, THINK_CLOSE)
                self._say(out, _REASONING, self._buf[:len(self._buf) - keep])
                self._buf = self._buf[len(self._buf) - keep:]
                return
            if self._state == _CONTENT:
                i = self._buf.find(TOOL_OPEN)
                if i >= 0:
                    self._say(out, _CONTENT, self._buf[:i])
                    self._buf = self._buf[i + len(TOOL_OPEN):]
                    self._state = _TOOL
                    continue
                keep = 0 if final else _partial_suffix(self._buf, TOOL_OPEN)
                self._say(out, _CONTENT, self._buf[:len(self._buf) - keep])
                self._buf = self._buf[len(self._buf) - keep:]
                return
            # _TOOL: wait for the closing tag; the whole block is parsed at once.
            i = self._buf.find(TOOL_CLOSE)
            if i >= 0:
                body = self._buf[:i]
                self._buf = self._buf[i + len(TOOL_CLOSE):]
                self._state = _CONTENT
                self._close_tool(out, body, TOOL_OPEN + body + TOOL_CLOSE)
                continue
            if final:
                body = self._buf
                self._buf = ""
                self._state = _CONTENT
                self._close_tool(out, body, TOOL_OPEN + body)
            return

    def _close_tool(self, out: list[Event], body: str, raw: str) -> None:
        call = parse_tool_call_body(body, _types=self._types)
        if call is None:
            self._say(out, _CONTENT, raw)
        else:
            self._calls.append(call)
            out.append(Event("tool_call", tool_call=call))


def prompt_ends_in_thinking(prompt: str) -> bool:
    """True when the rendered prompt leaves the reply inside an open ``<think>`` block
    (the Qwen3.5 generation prompt with thinking on ends ``<think>\\n``; with thinking
    off it ends with a closed, empty block)."""
    return prompt.rfind(THINK_OPEN) > prompt.rfind(THINK_CLOSE)


def parse_output(text: str, starts_in_thinking: bool = True,
                 tools: Sequence[Mapping] | None = None) -> ParsedOutput:
    """Parse a whole reply at once."""
    p = OutputParser(starts_in_thinking=starts_in_thinking, tools=tools)
    p.feed(text)
    p.finish()
    return p.result()


def collect(events: Iterable[Event]) -> ParsedOutput:
    """Fold a list of events into a ParsedOutput (for tests and simple callers)."""
    r, c, t = [], [], []
    for e in events:
        if e.kind == "reasoning":
            r.append(e.text)
        elif e.kind == "content":
            c.append(e.text)
        else:
            t.append(e.tool_call)
    return ParsedOutput("".join(r), "".join(c), tuple(t))
