"""/v1/chat/completions and /v1/completions: responses and SSE chunks in the
shapes the OpenAI SDKs parse (role chunk, content / reasoning_content /
tool_calls deltas, a finish chunk, an optional usage chunk, ``data: [DONE]``)."""

from __future__ import annotations

import json
import secrets
import time

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from . import convert, jobs
from .engine import Delta, Done
from .schemas import ChatRequest, CompletionRequest
from .sse import sse_data, sse_done, sse_keepalive

router = APIRouter()


def _id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def finish_reason(done: Done, had_tools: bool) -> str:
    if had_tools:
        return "tool_calls"
    return "length" if done.finish_reason == "length" else "stop"


def usage(done: Done) -> dict:
    u = {"prompt_tokens": done.prompt_tokens, "completion_tokens": len(done.tokens),
         "total_tokens": done.prompt_tokens + len(done.tokens),
         "prompt_tokens_details": {"cached_tokens": done.cached_tokens}}
    if done.draft is not None:  # speculative decoding statistics (engine.py)
        u["draft"] = done.draft
    return u


def _token_str(tok, t: int) -> tuple[str, list[int]]:
    b = tok.token_bytes(t, special=True)
    return b.decode("utf-8", "replace"), list(b)


def chat_logprobs(tok, deltas: list[Delta]) -> dict:
    content = []
    for d in deltas:
        lp = d.logprobs
        if lp is None:
            continue
        s, b = _token_str(tok, lp.token)
        tops = []
        for i, v in zip(lp.top_ids, lp.top_logprobs, strict=True):
            ts, tb = _token_str(tok, i)
            tops.append({"token": ts, "logprob": v, "bytes": tb})
        content.append({"token": s, "logprob": lp.logprob, "bytes": b, "top_logprobs": tops})
    return {"content": content}


def completion_logprobs(tok, deltas: list[Delta]) -> dict:
    tokens, lps, tops, offsets = [], [], [], []
    offset = 0
    for d in deltas:
        lp = d.logprobs
        if lp is None:
            continue
        s, _ = _token_str(tok, lp.token)
        tokens.append(s)
        lps.append(lp.logprob)
        tops.append({_token_str(tok, i)[0]: v
                     for i, v in zip(lp.top_ids, lp.top_logprobs, strict=True)})
        offsets.append(offset)
        offset += len(s)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops,
            "text_offset": offsets}


def tool_call_out(call, index: int | None = None) -> dict:
    d = {"id": "call_" + secrets.token_hex(12), "type": "function",
         "function": {"name": call.name,
                      "arguments": json.dumps(call.arguments, ensure_ascii=False)}}
    if index is not None:
        d["index"] = index
    return d


# ------------------------------------------------------------------- chat --
@router.post("/v1/chat/completions")
async def chat_completions(body: ChatRequest, request: Request):
    state = request.app.state.ds4
    state.require_ready()
    state.check_model(body.model)
    n_lp = (body.top_logprobs or 0) if body.logprobs else None
    spec, _ = convert.build_chat_spec(state.model, state.compiler, body, n_lp)
    if state.config.test_hooks and body.ds4py_forced_tokens is not None:
        spec.forced_tokens = body.ds4py_forced_tokens
    if state.config.test_hooks:
        spec.pause_after = body.ds4py_pause_after
    created, cid, name = int(time.time()), _id("chatcmpl"), state.model_name
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        job, q = await jobs.submit(state, spec)
        return StreamingResponse(
            _chat_stream(state, job, q, cid, created, name, include_usage, n_lp is not None),
            media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    deltas, done = await jobs.run_to_end(state, spec, request)
    msg: dict = {"role": "assistant", "content": done.content}
    if done.reasoning:
        msg["reasoning_content"] = done.reasoning
    if done.tool_calls:
        msg["tool_calls"] = [tool_call_out(c) for c in done.tool_calls]
        if not done.content:
            msg["content"] = None
    choice = {"index": 0, "message": msg,
              "finish_reason": finish_reason(done, bool(done.tool_calls)),
              "logprobs": chat_logprobs(state.model.tokenizer, deltas)
              if n_lp is not None else None}
    return {"id": cid, "object": "chat.completion", "created": created, "model": name,
            "choices": [choice], "usage": usage(done), "system_fingerprint": None}


async def _chat_stream(state, job, q, cid, created, name, include_usage, want_lp):
    tok = state.model.tokenizer

    def chunk(delta: dict, finish=None, logprobs=None) -> str:
        c = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": name,
             "choices": [{"index": 0, "delta": delta, "logprobs": logprobs,
                          "finish_reason": finish}]}
        if include_usage:
            c["usage"] = None
        return sse_data(c)

    yield chunk({"role": "assistant", "content": ""})
    n_calls = 0
    async for ev in jobs.events(state, job, q, state.config.keepalive_s):
        if ev is None:
            yield sse_keepalive()
            continue
        if isinstance(ev, Delta):
            lp = chat_logprobs(tok, [ev]) if want_lp and ev.logprobs is not None else None
            if ev.reasoning:
                yield chunk({"reasoning_content": ev.reasoning}, logprobs=lp)
                lp = None
            if ev.content:
                yield chunk({"content": ev.content}, logprobs=lp)
                lp = None
            for call in ev.tool_calls:
                yield chunk({"tool_calls": [tool_call_out(call, n_calls)]})
                n_calls += 1
            if lp is not None:  # a token whose text is held back (partial tag, stop prefix)
                yield chunk({}, logprobs=lp)
            continue
        done: Done = ev
        if done.error is not None:
            err = jobs.job_error(done)
            yield sse_data({"error": {"message": err.message, "type": "server_error",
                                      "code": err.status}})
            return
        if done.finish_reason == "cancelled":
            return
        yield chunk({}, finish_reason(done, n_calls > 0))
        if include_usage:
            yield sse_data({"id": cid, "object": "chat.completion.chunk", "created": created,
                            "model": name, "choices": [], "usage": usage(done)})
        yield sse_done()


# ------------------------------------------------------------- completions --
@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request):
    state = request.app.state.ds4
    state.require_ready()
    state.check_model(body.model)
    spec = convert.build_completion_spec(state.model, body)
    if state.config.test_hooks and body.ds4py_forced_tokens is not None:
        spec.forced_tokens = body.ds4py_forced_tokens
    if state.config.test_hooks:
        spec.pause_after = body.ds4py_pause_after
    created, cid, name = int(time.time()), _id("cmpl"), state.model_name
    tok = state.model.tokenizer
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        job, q = await jobs.submit(state, spec)
        return StreamingResponse(
            _completion_stream(state, job, q, cid, created, name, include_usage,
                               body.logprobs is not None, tok),
            media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    deltas, done = await jobs.run_to_end(state, spec, request)
    choice = {"index": 0, "text": done.text,
              "finish_reason": "length" if done.finish_reason == "length" else "stop",
              "logprobs": completion_logprobs(tok, deltas) if body.logprobs is not None
              else None}
    return {"id": cid, "object": "text_completion", "created": created, "model": name,
            "choices": [choice], "usage": usage(done), "system_fingerprint": None}


async def _completion_stream(state, job, q, cid, created, name, include_usage, want_lp, tok):
    def chunk(text: str, finish=None, logprobs=None) -> str:
        c = {"id": cid, "object": "text_completion", "created": created, "model": name,
             "choices": [{"index": 0, "text": text, "logprobs": logprobs,
                          "finish_reason": finish}]}
        if include_usage:
            c["usage"] = None
        return sse_data(c)

    async for ev in jobs.events(state, job, q, state.config.keepalive_s):
        if ev is None:
            yield sse_keepalive()
            continue
        if isinstance(ev, Delta):
            lp = completion_logprobs(tok, [ev]) if want_lp and ev.logprobs is not None else None
            if ev.text or lp is not None:
                yield chunk(ev.text, logprobs=lp)
            continue
        done: Done = ev
        if done.error is not None:
            err = jobs.job_error(done)
            yield sse_data({"error": {"message": err.message, "type": "server_error",
                                      "code": err.status}})
            return
        if done.finish_reason == "cancelled":
            return
        yield chunk("", "length" if done.finish_reason == "length" else "stop")
        if include_usage:
            yield sse_data({"id": cid, "object": "text_completion", "created": created,
                            "model": name, "choices": [], "usage": usage(done)})
        yield sse_done()
