"""Chat prompts: render a GGUF's ``tokenizer.chat_template`` (Jinja) the way
transformers' ``apply_chat_template`` does, byte for byte.

    tmpl = ChatTemplate(template_text, eos_token="<|im_end|>")
    prompt = tmpl.render([{"role": "user", "content": "Hi"}], enable_thinking=False)
    ids = tokenizer.encode(prompt, special=True)

Usually reached through ``Tokenizer.apply_chat_template``.

What the template sees, and why (transformers 5.x, utils/chat_template_utils.py and
tokenization_utils_base.py ``apply_chat_template``, which the fixtures in
tests/golden/tokenizer/ were recorded from):

- A sandboxed environment (jinja2 ``ImmutableSandboxedEnvironment``: templates
  are untrusted data inside a model file) with ``trim_blocks`` and
  ``lstrip_blocks`` on, the loop-controls extension (``break``/``continue``) and
  a ``{% generation %}`` block tag that renders its body (transformers uses it to
  track assistant spans).
- ``tojson`` overridden as ``json.dumps(x, ensure_ascii=False, indent=None,
  separators=None, sort_keys=False)`` -- jinja's own filter HTML-escapes ``<>&'``
  and would change the text; ``raise_exception(msg)``; ``strftime_now(fmt)``
  (local time); ``dict`` and a ``namespace`` that refuses names starting with "_".
- Variables: ``messages``, ``tools`` (None when not given), ``documents`` (None),
  ``add_generation_prompt``, ``enable_thinking`` and any extra keyword, plus
  ``bos_token``/``eos_token`` (transformers passes its special-tokens map; we pass
  the two the GGUF names by id -- llama.cpp passes the same two).
- Messages are copied to plain JSON-like data (dicts, lists, str, int, float,
  bool, None; anything else becomes the string "<TypeName>"), keys whose value
  is None are dropped from each message, and a message's reasoning under
  ``reasoning_content``, ``thinking`` or ``reasoning`` (first non-None) is
  exposed under both ``reasoning_content`` and ``thinking``.
- Tools must be JSON-schema dicts (transformers also converts Python
  functions; we do not, and say so).

Errors: a template that raises (``raise_exception``) or fails to compile or
render raises :class:`ChatTemplateError` with jinja's message.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from .errors import DS4Error

__all__ = ["ChatTemplate", "ChatTemplateError", "render_chat_template"]


class ChatTemplateError(DS4Error, ValueError):
    """The chat template could not be compiled or rendered for these messages."""


# Names a message's reasoning may come under; the first is what templates read
# (transformers chat_template_utils._REASONING_FIELDS).
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _plain(value: Any) -> Any:
    """Deep copy into plain JSON-like types (transformers' _plain_template_data): the
    sandbox cannot know which methods of rich objects are dangerous."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    item = getattr(value, "item", None)
    if callable(item) and type(value).__module__ == "numpy":
        return _plain(value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    dump = getattr(value, "model_dump", None)
    if callable(dump):  # pydantic models (e.g. OpenAI SDK messages)
        return _plain(dump())
    return f"<{type(value).__name__}>"


def _prepare_messages(messages: Sequence[Any]) -> list[dict]:
    out = []
    for m in messages:
        m = _plain(m)
        if not isinstance(m, dict):
            raise ChatTemplateError(f"a chat message must be a dict, not {m!r}")
        # transformers _normalize_chat_messages: drop keys whose value is None
        m = {k: v for k, v in m.items() if v is not None}
        # transformers _alias_reasoning_fields
        reasoning = next((m[k] for k in _REASONING_FIELDS if m.get(k) is not None), None)
        if reasoning is not None:
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        out.append(m)
    return out


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


def _environment():
    import jinja2
    import jinja2.ext
    from jinja2 import nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}`` renders its body unchanged."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    class TemplateDict:
        # dict(...) and dict.fromkeys(...) without exposing the dict type itself
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        # Underscore names could reach interpreter internals through attribute access.
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"chat templates cannot store underscore-prefixed attributes on a "
                    f"namespace, got {name!r}")

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env


class ChatTemplate:
    """A compiled chat template. ``bos_token``/``eos_token`` are the token texts the
    template may refer to."""

    def __init__(self, source: str, *, bos_token: str | None = None,
                 eos_token: str | None = None):
        import jinja2

        if not isinstance(source, str):
            raise ChatTemplateError("a chat template must be text")
        self.source = source
        self._special = {k: v for k, v in (("bos_token", bos_token), ("eos_token", eos_token))
                         if v is not None}
        try:
            self._template = _environment().from_string(source)
        except jinja2.exceptions.TemplateError as e:
            raise ChatTemplateError(f"chat template does not compile: {e}") from e

    def render(self, messages: Sequence[Any], tools: Sequence[Mapping] | None = None,
               enable_thinking: bool = True, add_generation_prompt: bool = True,
               documents: Sequence[Mapping] | None = None, **extra: Any) -> str:
        """The prompt text for ``messages`` (a list of {"role", "content", ...} dicts,
        OpenAI-style ``tool_calls`` and ``reasoning_content`` included)."""
        import jinja2

        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
            raise ChatTemplateError("messages must be a list of message dicts")
        if not messages:
            # transformers refuses an empty conversation before rendering
            raise ChatTemplateError("cannot render an empty conversation")
        if tools is not None:
            for t in tools:
                if not isinstance(t, Mapping):
                    raise ChatTemplateError(
                        f"a tool must be a JSON-schema dict, not {type(t).__name__}")
            tools = _plain(list(tools))
        if documents is not None:
            for d in documents:
                if not isinstance(d, Mapping):
                    raise ChatTemplateError("documents must be dicts with 'title' and 'text'")
            documents = _plain(list(documents))
        kwargs = {**self._special, "enable_thinking": enable_thinking, **extra}
        kwargs = _plain(kwargs)
        try:
            return self._template.render(
                messages=_prepare_messages(messages), tools=tools, documents=documents,
                add_generation_prompt=add_generation_prompt, **kwargs)
        except jinja2.exceptions.TemplateError as e:
            raise ChatTemplateError(f"chat template: {e}") from e


def render_chat_template(source: str, messages: Sequence[Any], **kwargs: Any) -> str:
    """One-off rendering of ``source`` (compiles it each call)."""
    bos = kwargs.pop("bos_token", None)
    eos = kwargs.pop("eos_token", None)
    return ChatTemplate(source, bos_token=bos, eos_token=eos).render(messages, **kwargs)
