"""Server-sent events framing."""

from __future__ import annotations

import json


def sse_data(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


def sse_event(name: str, obj) -> str:
    """A named event (the Anthropic stream names each one)."""
    return f"event: {name}\ndata: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


def sse_done() -> str:
    return "data: [DONE]\n\n"


def sse_keepalive() -> str:
    # A comment line: clients ignore it, proxies see traffic during a long prefill.
    return ": keep-alive\n\n"
