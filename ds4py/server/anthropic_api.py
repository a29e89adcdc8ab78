"""/v1/messages: the Anthropic Messages API over the same engine.

Text, system prompts, tool_use / tool_result blocks and tools are mapped onto
the chat template; reasoning comes back as a ``thinking`` block when the
request asks for thinking (``thinking: {"type": "enabled"}``), else the
template's thinking is switched off. Streaming sends Anthropic's event
sequence (message_start, content_block_start/delta/stop, message_delta,
message_stop)."""

from __future__ import annotations

import json
import secrets

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from ..output_parser import prompt_ends_in_thinking
from . import convert, jobs
from .engine import Delta, Done, JobSpec, Prefilled
from .errors import bad
from .schemas import MessagesRequest
from .sse import sse_event, sse_keepalive

router = APIRouter()


def _messages(req: MessagesRequest) -> list[dict]:
    out: list[dict] = []
    if req.system is not None:
        sys_text = req.system if isinstance(req.system, str) else "".join(
            b.get("text", "") for b in req.system if isinstance(b, dict))
        out.append({"role": "system", "content": sys_text})
    for i, m in enumerate(req.messages):
        role = m.get("role")
        if role not in ("user", "assistant"):
            raise bad(f"messages[{i}].role must be user or assistant", "messages")
        content = m.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise bad(f"messages[{i}].content must be a string or a list of blocks", "messages")
        text, calls = [], []
        for j, b in enumerate(content):
            kind = b.get("type") if isinstance(b, dict) else None
            if kind == "text" and isinstance(b.get("text"), str):
                text.append(b["text"])
            elif kind == "tool_use" and role == "assistant":
                calls.append({"id": b.get("id"), "type": "function",
                              "function": {"name": b.get("name"),
                                           "arguments": b.get("input") or {}}})
            elif kind == "tool_result" and role == "user":
                c = b.get("content")
                if isinstance(c, list):
                    c = "".join(x.get("text", "") for x in c if isinstance(x, dict))
                out.append({"role": "tool", "content": c if isinstance(c, str) else "",
                            "tool_call_id": b.get("tool_use_id")})
            elif kind == "thinking" and role == "assistant":
                continue  # the template drops earlier reasoning anyway
            else:
                raise bad(f"messages[{i}].content[{j}]: block type {kind!r} is not supported",
                          "messages")
        if text or calls:
            msg = {"role": role, "content": "".join(text)}
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
    return out


def _tools(req: MessagesRequest):
    if not req.tools:
        return None
    tools = []
    for i, t in enumerate(req.tools):
        if not isinstance(t.get("name"), str):
            raise bad(f"tools[{i}].name is required", "tools")
        tools.append({"type": "function", "function": {
            "name": t["name"], "description": t.get("description", ""),
            "parameters": t.get("input_schema") or {"type": "object"}}})
    return tools


def _stop_reason(done: Done, had_tools: bool) -> str:
    if had_tools:
        return "tool_use"
    return {"length": "max_tokens", "stop": "stop_sequence"}.get(done.finish_reason, "end_turn")


def _usage(done: Done) -> dict:
    u = {"input_tokens": done.prompt_tokens - done.cached_tokens,
         "output_tokens": len(done.tokens),
         "cache_read_input_tokens": done.cached_tokens, "cache_creation_input_tokens": 0}
    if done.draft is not None:  # speculative decoding statistics, as OpenAI's usage.draft
        u["draft"] = done.draft
    return u


def _delta_usage(done: Done) -> dict:
    u = {"output_tokens": len(done.tokens)}
    if done.draft is not None:
        u["draft"] = done.draft
    return u


@router.post("/v1/messages")
async def messages(body: MessagesRequest, request: Request):
    state = request.app.state.ds4
    state.require_ready()
    state.check_model(body.model)
    model = state.model
    thinking = bool(body.thinking and body.thinking.get("type") == "enabled")
    tools = _tools(body)
    if body.tool_choice and body.tool_choice.get("type") == "none":
        tools = None
    grammar = None
    if body.tool_choice and body.tool_choice.get("type") in ("any", "tool"):
        if not tools:
            raise bad("tool_choice requires tools", "tool_choice")
        choice = "required" if body.tool_choice["type"] == "any" else \
            {"type": "function", "function": {"name": body.tool_choice.get("name")}}
        grammar = convert.tool_grammar(state.compiler, tools, choice)
        if thinking:
            raise bad("a forced tool_choice needs thinking off", "tool_choice")
    ids, text = convert.chat_prompt(model, _messages(body), tools, thinking)
    convert.check_fits(model, ids)
    fields = type("R", (), {"logit_bias": None, "seed": None, "temperature": body.temperature,
                            "top_p": body.top_p, "top_k": body.top_k, "min_p": None,
                            "presence_penalty": None, "frequency_penalty": None,
                            "repeat_penalty": None})
    spec = JobSpec(ids=ids, max_tokens=convert.max_tokens(model, ids, body.max_tokens),
                   params=convert.sampling_params(fields, model.config.vocab_size),
                   stop=convert.stop_list(body.stop_sequences), parse_output=True,
                   starts_in_thinking=prompt_ends_in_thinking(text), tools=tools,
                   grammar=grammar)
    if state.config.test_hooks and body.ds4py_forced_tokens is not None:
        spec.forced_tokens = body.ds4py_forced_tokens
    mid = "msg_" + secrets.token_hex(12)
    name = state.model_name
    if body.stream:
        job, q = await jobs.submit(state, spec)
        return StreamingResponse(_stream(state, job, q, mid, name, len(ids)),
                                 media_type="text/event-stream")
    _, done = await jobs.run_to_end(state, spec, request)
    content = []
    if done.reasoning:
        content.append({"type": "thinking", "thinking": done.reasoning, "signature": ""})
    if done.content:
        content.append({"type": "text", "text": done.content})
    for c in done.tool_calls:
        content.append({"type": "tool_use", "id": "toolu_" + secrets.token_hex(12),
                        "name": c.name, "input": c.arguments})
    return {"id": mid, "type": "message", "role": "assistant", "model": name,
            "content": content, "stop_reason": _stop_reason(done, bool(done.tool_calls)),
            "stop_sequence": done.stop_string, "usage": _usage(done)}


async def _stream(state, job, q, mid, name, n_prompt):
    # message_start waits for the prefill (keep-alives meanwhile): its usage says
    # how much of the prompt came from the prefix cache, as Anthropic's does.
    def message_start(cached: int) -> str:
        return sse_event("message_start", {"type": "message_start", "message": {
            "id": mid, "type": "message", "role": "assistant", "model": name, "content": [],
            "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": n_prompt - cached, "output_tokens": 0,
                      "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}}})

    started = False
    index = -1
    open_kind = None
    n_calls = 0

    def start(kind):
        nonlocal index, open_kind
        out = []
        if open_kind is not None:
            out.append(sse_event("content_block_stop", {"type": "content_block_stop",
                                                        "index": index}))
        index += 1
        open_kind = kind
        block = {"type": "text", "text": ""} if kind == "text" else \
            {"type": "thinking", "thinking": "", "signature": ""}
        out.append(sse_event("content_block_start", {"type": "content_block_start",
                                                     "index": index, "content_block": block}))
        return "".join(out)

    async for ev in jobs.events(state, job, q, state.config.keepalive_s, with_prefilled=True):
        if ev is None:
            yield sse_keepalive()
            continue
        if isinstance(ev, Prefilled):
            started = True
            yield message_start(ev.cached_tokens)
            continue
        if not started:  # a job that ended before its prefill did (an error, a cancel)
            started = True
            yield message_start(0)
        if isinstance(ev, Delta):
            if ev.reasoning:
                if open_kind != "thinking":
                    yield start("thinking")
                yield sse_event("content_block_delta", {
                    "type": "content_block_delta", "index": index,
                    "delta": {"type": "thinking_delta", "thinking": ev.reasoning}})
            if ev.content:
                if open_kind != "text":
                    yield start("text")
                yield sse_event("content_block_delta", {
                    "type": "content_block_delta", "index": index,
                    "delta": {"type": "text_delta", "text": ev.content}})
            for c in ev.tool_calls:
                if open_kind is not None:
                    yield sse_event("content_block_stop", {"type": "content_block_stop",
                                                           "index": index})
                index += 1
                open_kind = None
                n_calls += 1
                yield sse_event("content_block_start", {
                    "type": "content_block_start", "index": index, "content_block": {
                        "type": "tool_use", "id": "toolu_" + secrets.token_hex(12),
                        "name": c.name, "input": {}}})
                yield sse_event("content_block_delta", {
                    "type": "content_block_delta", "index": index,
                    "delta": {"type": "input_json_delta",
                              "partial_json": json.dumps(c.arguments, ensure_ascii=False)}})
                yield sse_event("content_block_stop", {"type": "content_block_stop",
                                                       "index": index})
            continue
        done: Done = ev
        if done.error is not None:
            err = jobs.job_error(done)
            yield sse_event("error", {"type": "error", "error": {"type": "api_error",
                                                                 "message": err.message}})
            return
        if done.finish_reason == "cancelled":
            return
        if open_kind is not None:
            yield sse_event("content_block_stop", {"type": "content_block_stop",
                                                   "index": index})
        yield sse_event("message_delta", {
            "type": "message_delta",
            "delta": {"stop_reason": _stop_reason(done, n_calls > 0),
                      "stop_sequence": done.stop_string},
            "usage": _delta_usage(done)})
        yield sse_event("message_stop", {"type": "message_stop"})
