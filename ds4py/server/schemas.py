"""Request bodies (pydantic). Unknown fields are ignored (clients send many);
known fields are type-checked, and a wrong type is a 400 naming the field."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

_BIG = 1 << 31

# Messages are validated by hand in convert.py / anthropic_api.py (their 400s name
# the exact field); the OpenAPI schema still documents their shape, so clients and
# schemathesis (tests/test_server_schema.py) see what a message looks like.
_TEXT_PART = {"type": "object", "required": ["type", "text"],
              "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}
_CONTENT = {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}]}
ChatMessage = Annotated[dict[str, Any], WithJsonSchema({
    "type": "object", "required": ["role", "content"],
    "properties": {"role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
                   "content": _CONTENT, "reasoning_content": {"type": "string"},
                   "tool_call_id": {"type": "string"}, "name": {"type": "string"}}})]
# Accepted only at their default (a 400 otherwise): documented as such.
_ONLY_ONE = Annotated[int | None, WithJsonSchema({"enum": [1]})]
AnthropicMessage = Annotated[dict[str, Any], WithJsonSchema({
    "type": "object", "required": ["role", "content"],
    "properties": {"role": {"enum": ["user", "assistant"]}, "content": _CONTENT}})]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Body):
    include_usage: bool = False


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class _Sampling(_Body):
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=0, lt=_BIG)
    temperature: float | None = Field(default=None, ge=0, le=100)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: int | None = Field(default=None, ge=-1, lt=_BIG)
    min_p: float | None = Field(default=None, ge=0, le=1)
    seed: int | None = Field(default=None, ge=-(1 << 63), lt=1 << 64)
    stop: str | list[str] | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    repeat_penalty: float | None = Field(default=None, gt=0, le=100)
    logit_bias: dict[str, float] | None = None
    n: _ONLY_ONE = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # test hook (only honoured with --enable-test-hooks): token ids to emit in order
    ds4py_forced_tokens: list[int] | None = None
    ds4py_pause_after: int | None = Field(default=None, ge=1)


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=0, lt=_BIG)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: str | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int]
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: Annotated[bool, WithJsonSchema({"enum": [False]})] = False
    suffix: Annotated[str | None, WithJsonSchema({"type": "null"})] = None
    best_of: _ONLY_ONE = None


class MessagesRequest(_Body):
    """Anthropic /v1/messages."""

    model: str | None = None
    max_tokens: int = Field(ge=0, lt=_BIG)
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0, le=100)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: int | None = Field(default=None, ge=-1, lt=_BIG)
    stream: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    ds4py_forced_tokens: list[int] | None = None  # test hook, as in _Sampling


class TokenizeRequest(_Body):
    content: str | None = None
    messages: list[ChatMessage] | None = None
    add_special: bool = False
    with_pieces: bool = False


class DetokenizeRequest(_Body):
    tokens: list[int]


class ApplyTemplateRequest(_Body):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
