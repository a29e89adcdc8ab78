"""Request bodies -> JobSpec: messages, sampling, stop, tools, structured output.

Everything a client can get wrong is checked here and raised as a 400
:class:`APIError` naming the field, before a job reaches the scheduler.
"""

from __future__ import annotations

import json
from typing import Any

from ..chat import ChatTemplateError
from ..generate import _prepare_prompt  # the prompt rules generate() uses (shared on purpose)
from ..output_parser import prompt_ends_in_thinking
from ..sampling import SamplingParams
from .engine import JobSpec
from .errors import APIError, bad
from .grammar import GrammarError
from .tool_grammar import tag, tool_call_lark

MAX_STOP = 16


def _text_parts(content: Any, where: str) -> str:
    """OpenAI content: a string or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" \
                    or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise bad(f"{where}.content[{i}]: only text parts are supported, got {kind!r}",
                          f"{where}.content")
            out.append(part["text"])
        return "".join(out)
    raise bad(f"{where}.content must be a string or a list of text parts", f"{where}.content")


def openai_messages(messages: list[dict]) -> list[dict]:
    """Normalise OpenAI messages for the chat template (tool-call arguments as dicts)."""
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        role = m.get("role")
        if role == "developer":
            role = "system"
        if role not in ("system", "user", "assistant", "tool"):
            raise bad(f"{where}.role must be system, user, assistant or tool, got {role!r}",
                      f"{where}.role")
        msg: dict[str, Any] = {"role": role, "content": _text_parts(m.get("content"), where)}
        if role == "assistant":
            if isinstance(m.get("reasoning_content"), str):
                msg["reasoning_content"] = m["reasoning_content"]
            calls = m.get("tool_calls")
            if calls is not None:
                if not isinstance(calls, list):
                    raise bad(f"{where}.tool_calls must be a list", f"{where}.tool_calls")
                msg["tool_calls"] = [_tool_call_in(c, f"{where}.tool_calls[{j}]")
                                     for j, c in enumerate(calls)]
        if role == "tool" and isinstance(m.get("tool_call_id"), str):
            msg["tool_call_id"] = m["tool_call_id"]
        out.append(msg)
    return out


def _tool_call_in(c: Any, where: str) -> dict:
    fn = c.get("function") if isinstance(c, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise bad(f"{where}.function.name is required", where)
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            raise bad(f"{where}.function.arguments is not valid JSON", where) from None
    if not isinstance(args, dict):
        raise bad(f"{where}.function.arguments must be a JSON object", where)
    return {"id": c.get("id"), "type": "function",
            "function": {"name": fn["name"], "arguments": args}}


def check_tools(tools: list[dict] | None) -> list[dict] | None:
    if not tools:
        return None
    for i, t in enumerate(tools):
        fn = t.get("function")
        if t.get("type", "function") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}",
                      "tools")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise bad(f"tools[{i}].function.parameters must be a JSON schema object", "tools")
    return tools


def sampling_params(req, vocab: int) -> SamplingParams:
    bias = {}
    for k, v in (req.logit_bias or {}).items():
        try:
            t = int(k)
        except ValueError:
            raise bad(f"logit_bias key {k!r} is not a token id", "logit_bias") from None
        if not 0 <= t < vocab:
            raise bad(f"logit_bias token id {t} is outside the vocabulary (0..{vocab - 1})",
                      "logit_bias")
        if not -100 <= v <= 100:
            raise bad(f"logit_bias values must be in [-100, 100], got {v}", "logit_bias")
        # OpenAI: -100 bans a token, +100 forces it in practice; map them to -inf/+large
        bias[t] = float("-inf") if v <= -100 else float(v)
    fields: dict[str, Any] = {}
    for name in ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                 "frequency_penalty", "repeat_penalty"):
        v = getattr(req, name, None)
        if v is not None:
            fields[name] = v
    if req.seed is not None:
        fields["seed"] = int(req.seed) & 0xFFFFFFFF  # Mt19937 takes 32 bits, as llama.cpp
    if bias:
        fields["logit_bias"] = bias
    try:
        return SamplingParams(**fields)
    except (TypeError, ValueError) as e:
        raise bad(str(e)) from None


def stop_list(stop) -> list[str]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > MAX_STOP:
        raise bad(f"at most {MAX_STOP} stop strings", "stop")
    if any(s == "" for s in stops):
        raise bad("a stop string must not be empty", "stop")
    return stops


def chat_prompt(model, messages, tools, enable_thinking: bool) -> tuple[list[int], str]:
    try:
        ids, text, _ = _prepare_prompt(model, messages, None, None, enable_thinking, tools,
                                       True, at_start=True)
    except (ChatTemplateError, ValueError, TypeError) as e:
        raise bad(f"could not apply the chat template: {e}", "messages") from None
    return ids, text


def check_fits(model, ids: list[int]) -> None:
    vocab = model.config.vocab_size
    bad_ids = [t for t in ids if not 0 <= t < vocab]
    if bad_ids:
        raise bad(f"prompt token id {bad_ids[0]} is outside the vocabulary (0..{vocab - 1})",
                  "prompt")
    if len(ids) >= model.n_ctx:
        raise APIError(400, f"the prompt has {len(ids)} tokens but the context holds "
                            f"{model.n_ctx} (including at least one generated token)",
                       "messages", "context_length_exceeded")


def max_tokens(model, ids, requested: int | None) -> int:
    room = model.n_ctx - len(ids)
    return room if requested is None else min(int(requested), room)


def tool_grammar(compiler, tools, choice) -> Any:
    """A grammar for tool_choice required / named: exactly one Qwen XML tool call."""
    if compiler is None:
        raise bad("structured output is not available (llguidance is not installed)",
                  "tool_choice")
    names = [t["function"]["name"] for t in tools]
    if isinstance(choice, dict):
        fn = choice.get("function") or {}
        name = fn.get("name")
        if name not in names:
            raise bad(f"tool_choice names {name!r}, which is not in tools", "tool_choice")
        names = [name]
    tok = compiler.tokenizer
    try:
        lark = tool_call_lark(tools, names, tag(tok, "<tool_call>"), tag(tok, "</tool_call>"))
        return compiler.lark(lark)
    except GrammarError as e:
        raise bad(str(e), "tools") from None


def response_grammar(compiler, rf) -> Any:
    if rf is None or rf.type == "text":
        return None
    if compiler is None:
        raise bad("structured output is not available (llguidance is not installed)",
                  "response_format")
    try:
        if rf.type == "json_object":
            return compiler.json_object()
        js = rf.json_schema or {}
        schema = js.get("schema")
        if schema is None:
            raise bad("response_format.json_schema.schema is required", "response_format")
        return compiler.json_schema(schema)
    except GrammarError as e:
        raise bad(str(e), "response_format") from None


def build_chat_spec(model, compiler, req, n_logprobs) -> tuple[JobSpec, str]:
    if req.n not in (None, 1):
        raise bad("n other than 1 is not supported", "n")
    tools = check_tools(req.tools)
    choice = req.tool_choice
    if choice is not None and not (choice in ("auto", "none", "required")
                                   or isinstance(choice, dict)):
        raise bad("tool_choice must be 'auto', 'none', 'required' or a named function",
                  "tool_choice")
    if choice in ("required",) or isinstance(choice, dict):
        if not tools:
            raise bad("tool_choice requires tools", "tool_choice")
    if choice == "none":
        tools = None
    kw = req.chat_template_kwargs or {}
    enable_thinking = kw.get("enable_thinking", True)
    if not isinstance(enable_thinking, bool):
        raise bad("chat_template_kwargs.enable_thinking must be a boolean",
                  "chat_template_kwargs")
    messages = openai_messages(req.messages)
    ids, text = chat_prompt(model, messages, tools, enable_thinking)
    check_fits(model, ids)
    grammar = None
    if req.response_format is not None and req.response_format.type != "text":
        if choice == "required" or isinstance(choice, dict):
            raise bad("response_format and a forced tool_choice cannot be combined",
                      "response_format")
        grammar = response_grammar(compiler, req.response_format)
    elif choice == "required" or isinstance(choice, dict):
        grammar = tool_grammar(compiler, tools, choice)
    requested = req.max_completion_tokens if req.max_completion_tokens is not None \
        else req.max_tokens
    spec = JobSpec(ids=ids, max_tokens=max_tokens(model, ids, requested),
                   params=sampling_params(req, model.config.vocab_size),
                   stop=stop_list(req.stop), n_logprobs=n_logprobs, parse_output=True,
                   starts_in_thinking=prompt_ends_in_thinking(text), tools=tools,
                   grammar=grammar)
    if grammar is not None and spec.starts_in_thinking:
        # The grammar constrains the whole reply; an open <think> block would be
        # forced to hold JSON. Refuse rather than produce reasoning that is not.
        raise bad("structured output needs thinking off "
                  "(chat_template_kwargs: {\"enable_thinking\": false})", "response_format")
    return spec, text


def build_completion_spec(model, req) -> JobSpec:
    if req.n not in (None, 1):
        raise bad("n other than 1 is not supported", "n")
    if req.best_of not in (None, 1):
        raise bad("best_of other than 1 is not supported", "best_of")
    if req.echo:
        raise bad("echo is not supported", "echo")
    if req.suffix:
        raise bad("suffix is not supported", "suffix")
    p = req.prompt
    if isinstance(p, list) and p and all(isinstance(x, str) for x in p):
        if len(p) != 1:
            raise bad("a list of several prompts is not supported; send one", "prompt")
        p = p[0]
    if isinstance(p, str):
        if not p:
            raise bad("the prompt is empty", "prompt")
        ids = model.tokenizer.encode(p, special=True)
        tok = model.tokenizer
        if tok.add_bos and tok.bos_id is not None and (not ids or ids[0] != tok.bos_id):
            ids = [tok.bos_id, *ids]
    else:
        ids = [int(t) for t in p]
    if not ids:
        raise bad("the prompt is empty", "prompt")
    check_fits(model, ids)
    requested = 16 if req.max_tokens is None else req.max_tokens  # OpenAI's default
    return JobSpec(ids=ids, max_tokens=max_tokens(model, ids, requested),
                   params=sampling_params(req, model.config.vocab_size),
                   stop=stop_list(req.stop), n_logprobs=req.logprobs)
