"""The Lark grammar (llguidance dialect) for a forced tool call
(``tool_choice: "required"`` or a named function).

The reply must be exactly one call in the Qwen XML form the chat template
teaches and ``output_parser`` reads::

    <tool_call>
    <function=NAME>
    <parameter=ARG>
    VALUE
    </parameter>
    ...
    </function>
    </tool_call>

Why per-tool rules and not one generic ``<parameter=ANY>`` rule: with a generic
rule a model may invent argument names, put text where an integer belongs, or
repeat parameters until max_tokens. Here each function's declared parameters
appear at most once, in declaration order (required ones always), and each
value is shaped by its schema: integers, numbers, booleans and string enums as
literals the parser converts, objects/arrays/unions as JSON (llguidance's
``%json``), free strings as bounded raw text (no ``<``, which would open the
closing tag). So the call always parses, and its arguments have the declared
names and types.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

# Longest free-text string argument, in characters: bounds a rambling model's
# call so it ends before a modest max_tokens (a longer value is cut by the grammar).
MAX_STRING_CHARS = 256
_INT = r"/-?[0-9]{1,15}/"
_NUM = r"/-?[0-9]{1,15}(\.[0-9]{1,15})?([eE][-+]?[0-9]{1,3})?/"


def _lit(s: str) -> str:
    return json.dumps(s)


# A free string and its closing tag in one regex: the value may hold newlines, and
# a separate "\n</parameter>" terminal after a greedy /[^<]*/ would never match
# (the lexer would already have taken the newline into the string).
_FREE = f'/[^<]{{0,{MAX_STRING_CHARS}}}\\n<\\/parameter>\\n/'
_CLOSE = '"\\n</parameter>\\n"'


def tag(tokenizer, text: str) -> str:
    """``text`` as a grammar term: the model's special token when its vocabulary
    has one (Qwen's <tool_call> is; llguidance never matches a special token's
    text byte by byte), else the literal text."""
    ids = tokenizer.encode(text, special=True)
    if len(ids) == 1 and ids[0] in tokenizer.special_ids:
        return f"<[{ids[0]}]>"
    return _lit(text)


def _value_rule(schema: Any) -> str:
    """A rule body matching one parameter's raw value and its closing tag."""
    return _FREE if _is_free_string(schema) else f"({_typed_value(schema)}) {_CLOSE}"


def _is_free_string(schema: Any) -> bool:
    return not isinstance(schema, Mapping) or (schema.get("type") == "string"
                                               and "enum" not in schema)


def _typed_value(schema: Mapping) -> str:
    enum = schema.get("enum")
    if isinstance(enum, list) and enum and all(isinstance(v, str) and "<" not in v
                                               for v in enum):
        return " | ".join(_lit(v) for v in enum)
    ty = schema.get("type")
    if ty == "integer" and "enum" not in schema:
        return _INT
    if ty == "number" and "enum" not in schema:
        return _NUM
    if ty == "boolean":
        return '"true" | "false"'
    if ty == "null":
        return '"null"'
    # objects, arrays, unions, constrained numbers: JSON, validated by its schema
    return "%json " + json.dumps(dict(schema))


def tool_call_lark(tools: list[dict], names: list[str], open_tag: str = '"<tool_call>"',
                   close_tag: str = '"</tool_call>"') -> str:
    """A grammar admitting exactly one call to one of ``names`` (tags as
    :func:`tag` writes them)."""
    by_name = {t["function"]["name"]: t["function"] for t in tools}
    lines = [f'start: {open_tag} "\\n" call {close_tag}',
             "call: " + " | ".join(f"call_{i}" for i in range(len(names)))]
    for i, name in enumerate(names):
        params = by_name[name].get("parameters") or {}
        props = params.get("properties") if isinstance(params, Mapping) else None
        required = set(params.get("required") or ()) if isinstance(params, Mapping) else set()
        parts = []
        if isinstance(props, Mapping) and props:
            for j, (arg, schema) in enumerate(props.items()):
                rule = f"p_{i}_{j}"
                lines.append(f'{rule}: "<parameter=" {_lit(str(arg))} ">\\n" '
                             f"{_value_rule(schema)}")
                parts.append(rule if arg in required else f"{rule}?")
        else:  # no declared parameters: any names, bounded raw values
            lines.append(f'p_{i}_any: "<parameter=" /[A-Za-z_][A-Za-z0-9_]{{0,63}}/ ">\\n" '
                         f"{_FREE}")
            parts.append(f"p_{i}_any*")
        lines.append(f'call_{i}: "<function=" {_lit(name)} ">\\n" {" ".join(parts)} '
                     f'"</function>\\n"')
    return "\n".join(lines) + "\n"
