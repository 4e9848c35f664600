"""The Anthropic Messages API wire shape: request body, auth headers, error bodies, the provider.

The wire modules are the only ones that know a provider's JSON; this one's stream mapping (sans-IO) is
``_anthropic_stream.py``. Blocks the server ran itself (server tools, the MCP connector, compaction) go
back in place, verbatim. ``render_stream`` writes the stream shape back out for the scripted provider,
the fixture tests and the benchmark.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Final, final

import attrs
import httpx

from trioloop.protocol.events import (
    StopReason,
)
from trioloop.protocol.messages import (
    Message,
    ProviderBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
    ToolResultBlock,
)
from trioloop.protocol.preflight import MODEL_TABLE, ModelCapabilities
from trioloop.protocol.tools import ChatRequest
from trioloop.providers._anthropic_stream import (
    ANTHROPIC_BLOCK_WIRE,
    BLOCK_NOT_JSON,
    CALLER_MARKER,
    CONTAINER_MARKER,
    SERVER_BLOCKS,
    SERVER_INPUT_UNREADABLE,
    AnthropicStreamMapper,
)
from trioloop.providers.base import (
    ErrorBody,
    WireResponse,
    decode_json_object,
    split_text,
    text_or_empty,
)
from trioloop.providers.retry import DEFAULT_RETRY_POLICY, RetryNotice, RetryPolicy
from trioloop.providers.transport import (
    DEFAULT_MAX_RESPONSE_BYTES,
    DEFAULT_READ_TIMEOUT,
    HttpChatProvider,
)

__all__ = [
    "ANTHROPIC_VERSION",
    "ANTHROPIC_WIRE",
    "BLOCK_NOT_JSON",
    "SERVER_INPUT_UNREADABLE",
    "AnthropicProvider",
    "AnthropicRequestOptions",
    "AnthropicStreamMapper",
    "AnthropicWire",
    "build_anthropic_body",
    "render_anthropic_stream",
]

ANTHROPIC_VERSION: Final = "2023-06-01"

_WIRE_STOP_REASONS: Final[Mapping[StopReason, str]] = {
    StopReason.END_TURN: "end_turn",
    StopReason.TOOL_USE: "tool_use",
    StopReason.MAX_TOKENS: "max_tokens",
    StopReason.STOP_SEQUENCE: "stop_sequence",
    StopReason.REFUSAL: "refusal",
    StopReason.PAUSE_TURN: "pause_turn",
    StopReason.OTHER: "other",
}
_ERROR_TYPES: Final[Mapping[int, str]] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}
_WIRE_NAME: Final = ANTHROPIC_BLOCK_WIRE
_MARKERS: Final = frozenset({CALLER_MARKER, CONTAINER_MARKER})  # facts of ours, never sent as content


def _tool_use_input(value: Any) -> dict[str, Any]:
    # The API only accepts an object here; a non-object input was already answered with an error result.
    return value if isinstance(value, dict) else {}


_EPHEMERAL: Final = {"type": "ephemeral"}
MIN_THINKING_BUDGET: Final = 1024


def _budget(inst: object, attribute: attrs.Attribute[int | None], value: object) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < MIN_THINKING_BUDGET):
        raise ValueError(f"{attribute.name} must be None or an int >= {MIN_THINKING_BUDGET}, got {value!r}")


@final
@attrs.frozen(kw_only=True)
class AnthropicRequestOptions:
    """Opt-in extended thinking and prompt caching for Messages API requests.

    ``thinking_budget_tokens`` turns extended thinking on with that budget (at least 1024; ``max_tokens``
    is raised above it when needed). ``prompt_caching`` puts cache breakpoints on the system prompt,
    the tool list and the conversation so far, so every iteration of a turn rereads the prefix from cache.
    """

    thinking_budget_tokens: int | None = attrs.field(default=None, validator=_budget)
    prompt_caching: bool = True


def _callers(message: Message) -> dict[str, Any]:
    """tool_use id -> the ``caller`` its response gave it (programmatic tool calling), from the markers."""
    callers: dict[str, Any] = {}
    for block in message.content:
        if isinstance(block, ProviderBlock) and block.wire == _WIRE_NAME and block.kind == CALLER_MARKER:
            value = decode_json_object(block.data)
            if (
                value is not None
                and isinstance(value.get("tool_use_id"), str)
                and isinstance(value.get("caller"), dict)
            ):
                callers[value["tool_use_id"]] = value["caller"]
    return callers


def _container(messages: tuple[Message, ...]) -> str | None:
    """The code execution container of the last assistant message, which the next request must name so that
    code waiting there on a tool's result resumes (None when that message ran in none)."""
    for message in reversed(messages):
        if message.role != "assistant":
            continue
        for block in message.content:
            if isinstance(block, ProviderBlock) and block.wire == _WIRE_NAME and block.kind == CONTAINER_MARKER:
                value = decode_json_object(block.data)
                if value is not None and isinstance(value.get("id"), str) and value["id"]:
                    return str(value["id"])
        return None
    return None


def _provider_block_to_wire(block: ProviderBlock) -> dict[str, Any] | None:
    """An Anthropic block as the server sent it, or None for another wire's block (no other wire takes it).

    ``cache_control`` is left out: breakpoints are ours to place, and a block carrying a server's own would
    count against the four a request may hold.
    """
    if block.wire != _WIRE_NAME or block.kind in _MARKERS:
        return None
    value = decode_json_object(block.data)
    if value is None or not isinstance(value.get("type"), str):
        return None
    return {key: item for key, item in value.items() if key != "cache_control"}


def _message_to_wire(message: Message) -> dict[str, Any] | None:
    results: list[dict[str, Any]] = []
    others: list[dict[str, Any]] = []
    callers = _callers(message) if message.role == "assistant" else {}
    for block in message.content:
        if isinstance(block, ThinkingBlock):
            # Sent back verbatim, signature included: a tool-use continuation is refused without it. An
            # unsigned block is reasoning from another wire, which the API refuses: it is left out.
            if block.signature:
                others.append({"type": "thinking", "thinking": block.thinking, "signature": block.signature})
        elif isinstance(block, RedactedThinkingBlock):
            others.append({"type": "redacted_thinking", "data": block.data})
        elif isinstance(block, TextBlock):
            if block.text:  # the API rejects empty text blocks
                others.append({"type": "text", "text": block.text})
        elif isinstance(block, ToolCallBlock):
            tool_use = {"type": "tool_use", "id": block.id, "name": block.name, "input": _tool_use_input(block.input)}
            if block.id in callers:
                tool_use["caller"] = callers[block.id]
            others.append(tool_use)
        elif isinstance(block, ToolResultBlock):
            results.append(
                {
                    "type": "tool_result",
                    "tool_use_id": block.call_id,
                    "content": block.content,
                    "is_error": block.is_error,
                }
            )
        elif isinstance(block, ProviderBlock):
            wire_block = _provider_block_to_wire(block)
            if wire_block is not None:
                others.append(wire_block)
    content = results + others  # tool results must lead a user message
    if not content:
        return None
    return {"role": message.role, "content": content}


# The block types whose request form takes ``cache_control`` (the Messages API's content block params): ours
# and every server block but the fallback marker; never thinking, redacted thinking, or a type unknown here.
_CACHEABLE: Final = frozenset({"text", "tool_use", "tool_result"} | (SERVER_BLOCKS - {"fallback"}))


def _mark_prefix(messages: list[dict[str, Any]]) -> None:
    """A cache breakpoint on the last block of the last message that can carry one."""
    if not messages:
        return
    content = messages[-1]["content"]
    for index in range(len(content) - 1, -1, -1):
        if content[index].get("type") in _CACHEABLE:
            content[index] = {**content[index], "cache_control": _EPHEMERAL}
            return


def build_anthropic_body(request: ChatRequest, options: AnthropicRequestOptions | None = None) -> dict[str, Any]:
    """The Messages API request: top-level ``system``, tool_use/tool_result blocks, ``stream: true``."""
    options = options or AnthropicRequestOptions()
    messages = [m for m in (_message_to_wire(message) for message in request.messages) if m is not None]
    budget = options.thinking_budget_tokens
    max_tokens = request.max_tokens if budget is None or request.max_tokens > budget else budget + request.max_tokens
    body: dict[str, Any] = {
        "model": request.model,
        "max_tokens": max_tokens,
        "messages": messages,
        "stream": True,
    }
    if budget is not None:
        body["thinking"] = {"type": "enabled", "budget_tokens": budget}
    container = _container(request.messages)
    if container is not None:
        body["container"] = container
    if request.system:
        if options.prompt_caching:
            body["system"] = [{"type": "text", "text": request.system, "cache_control": _EPHEMERAL}]
        else:
            body["system"] = request.system
    if request.tools:
        tools: list[dict[str, Any]] = [
            {"name": tool.name, "description": tool.description, "input_schema": dict(tool.json_schema)}
            for tool in request.tools
        ]
        if options.prompt_caching:
            tools[-1] = {**tools[-1], "cache_control": _EPHEMERAL}
        body["tools"] = tools
        if request.tool_choice == "required" and budget is None:
            # Extended thinking refuses a forced tool choice: with it on, the loop's nudge asks instead.
            body["tool_choice"] = {"type": "any"}
    if options.prompt_caching:
        _mark_prefix(messages)
    return body


def _sse(event: str, data: Mapping[str, Any]) -> str:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'), ensure_ascii=False)}\n\n"


def render_anthropic_stream(response: WireResponse) -> bytes:
    """``response`` as the Messages API would stream it (text block first, then one block per tool call)."""
    parts = [
        _sse(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_scripted",
                    "type": "message",
                    "role": "assistant",
                    "model": response.model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": response.input_tokens, "output_tokens": 1},
                },
            },
        ),
        _sse("ping", {"type": "ping"}),
    ]
    index = 0
    if response.text:
        parts.append(
            _sse(
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            )
        )
        for piece in split_text(response.text, response.text_piece):
            parts.append(
                _sse(
                    "content_block_delta",
                    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}},
                )
            )
        parts.append(_sse("content_block_stop", {"type": "content_block_stop", "index": 0}))
        index = 1
    if response.error_type is not None:
        error = {"type": response.error_type, "message": response.error_message}
        parts.append(_sse("error", {"type": "error", "error": error}))
        return "".join(parts).encode()
    for call in response.tool_calls:
        block = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
        parts.append(
            _sse("content_block_start", {"type": "content_block_start", "index": index, "content_block": block})
        )
        arguments = json.dumps(call.input, separators=(",", ":"), ensure_ascii=False)
        for piece in split_text(arguments, response.arguments_piece):
            delta = {"type": "input_json_delta", "partial_json": piece}
            parts.append(_sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}))
        parts.append(_sse("content_block_stop", {"type": "content_block_stop", "index": index}))
        index += 1
    parts.append(
        _sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": _WIRE_STOP_REASONS[response.stop_reason], "stop_sequence": None},
                "usage": {"output_tokens": response.output_tokens},
            },
        )
    )
    parts.append(_sse("message_stop", {"type": "message_stop"}))
    return "".join(parts).encode()


@final
class AnthropicWire:
    """The ``WireFormat`` for the Anthropic Messages API."""

    name: Final = _WIRE_NAME
    env_var: Final = "ANTHROPIC_API_KEY"
    default_base_url: Final = "https://api.anthropic.com"
    endpoint: Final = "/v1/messages"
    models_endpoint: Final = "/v1/models"

    def __init__(self, options: AnthropicRequestOptions | None = None) -> None:
        self.options = options or AnthropicRequestOptions()

    def auth_headers(self, api_key: str) -> dict[str, str]:
        return {"x-api-key": api_key, "anthropic-version": ANTHROPIC_VERSION}

    def build_body(self, request: ChatRequest) -> dict[str, Any]:
        return build_anthropic_body(request, self.options)

    def new_mapper(self, *, scrub: Callable[[str], str] | None = None) -> AnthropicStreamMapper:
        return AnthropicStreamMapper(scrub=scrub)

    def describe_error_body(self, body: bytes) -> ErrorBody:
        payload = decode_json_object(body.decode("utf-8", errors="replace"))
        error = payload.get("error") if payload is not None else None
        if isinstance(error, dict):
            message, kind = text_or_empty(error.get("message")), text_or_empty(error.get("type"))
            return ErrorBody(
                detail=f"{kind}: {message}" if kind and message else (message or kind),
                context_overflow="prompt is too long" in message.lower(),
            )
        return ErrorBody(detail=body.decode("utf-8", errors="replace"))

    def render_stream(self, response: WireResponse) -> bytes:
        return render_anthropic_stream(response)

    def render_error_body(self, status: int, message: str) -> bytes:
        kind = _ERROR_TYPES.get(status, "api_error")
        return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()


ANTHROPIC_WIRE: Final = AnthropicWire()


@final
class AnthropicProvider(HttpChatProvider):
    """Streams from the Anthropic Messages API; the key comes from ``api_key`` or ``ANTHROPIC_API_KEY``."""

    def __init__(
        self,
        api_key: str | None = None,
        *,
        base_url: str | None = None,
        client: httpx.AsyncClient | None = None,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        retry: RetryPolicy | None = DEFAULT_RETRY_POLICY,
        model_table: Mapping[str, ModelCapabilities] = MODEL_TABLE,
        options: AnthropicRequestOptions | None = None,
        on_retry: Callable[[RetryNotice], None] | None = None,
    ) -> None:
        """``options`` turns on extended thinking (opt-in) or off prompt caching (on by default)."""
        super().__init__(
            AnthropicWire(options),
            api_key=api_key,
            base_url=base_url,
            client=client,
            read_timeout=read_timeout,
            max_response_bytes=max_response_bytes,
            retry=retry,
            model_table=model_table,
            on_retry=on_retry,
        )
