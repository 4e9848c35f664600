"""The Anthropic Messages API wire shape: request body, auth headers, stream mapping, error bodies.

This and ``openai.py`` are the only modules that know a provider's JSON. The mapper is sans-IO: SSE
frames in, ``StreamEvent``s out, never raising on hostile input. ``render_stream`` writes the same
shape back out for the scripted provider, the fixture tests and the benchmark.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Final, final

import attrs
import httpx

from trioloop.protocol.errors import ProtocolErrorCode
from trioloop.protocol.events import (
    MessageStart,
    MessageStop,
    StopReason,
    StreamError,
    StreamEvent,
    TextDelta,
    ThinkingComplete,
    ThinkingDelta,
    ToolCallInputDelta,
    ToolCallStart,
    Usage,
    is_terminal,
)
from trioloop.protocol.messages import (
    Message,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
    ToolResultBlock,
)
from trioloop.protocol.preflight import MODEL_TABLE, ModelCapabilities
from trioloop.protocol.tools import ChatRequest
from trioloop.providers.base import (
    ErrorBody,
    Messages,
    NoticeFolder,
    WireResponse,
    decode_json_object,
    effective_stop,
    finish_tool_call,
    non_negative_int,
    notice,
    split_text,
    unreadable_call,
)
from trioloop.providers.retry import DEFAULT_RETRY_POLICY, RetryNotice, RetryPolicy
from trioloop.providers.sse import SseFrame
from trioloop.providers.transport import (
    DEFAULT_MAX_RESPONSE_BYTES,
    DEFAULT_READ_TIMEOUT,
    HttpChatProvider,
)

__all__ = [
    "ANTHROPIC_VERSION",
    "ANTHROPIC_WIRE",
    "AnthropicProvider",
    "AnthropicRequestOptions",
    "AnthropicStreamMapper",
    "AnthropicWire",
    "build_anthropic_body",
    "render_anthropic_stream",
]

ANTHROPIC_VERSION: Final = "2023-06-01"

_STOP_REASONS: Final[Mapping[str, StopReason]] = {
    "end_turn": StopReason.END_TURN,
    "tool_use": StopReason.TOOL_USE,
    "max_tokens": StopReason.MAX_TOKENS,
    "stop_sequence": StopReason.STOP_SEQUENCE,
    "refusal": StopReason.REFUSAL,
    "pause_turn": StopReason.PAUSE_TURN,
}
_WIRE_STOP_REASONS: Final[Mapping[StopReason, str]] = {
    **{reason: name for name, reason in _STOP_REASONS.items()},
    StopReason.OTHER: "other",
}
_KNOWN_EVENTS: Final = frozenset(
    {
        "message",
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
        "ping",
        "error",
    }
)
_ERROR_TYPES: Final[Mapping[int, str]] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def _identity(text: str) -> str:
    return text


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


class _Undecodable(Exception):
    """A frame whose JSON does not have the documented shape."""


@attrs.define
class _OpenCall:
    id: str
    name: str
    fragments: list[str] = attrs.field(factory=list)


@attrs.define
class _OpenThinking:
    parts: list[str] = attrs.field(factory=list)
    signature: list[str] = attrs.field(factory=list)


_TRANSIENT_ERRORS: Final = frozenset({"overloaded_error", "api_error"})


def _input_tokens(usage: Mapping[str, Any]) -> int | None:
    """Billed prompt tokens: fresh input plus cache writes and reads (OpenAI's prompt_tokens counts all three)."""
    base = non_negative_int(usage.get("input_tokens"))
    if base is None:
        return None
    extra = (non_negative_int(usage.get(k)) or 0 for k in ("cache_creation_input_tokens", "cache_read_input_tokens"))
    return base + sum(extra)


@final
class AnthropicStreamMapper:
    """Maps Anthropic Messages stream frames onto ``StreamEvent``s; one instance per response."""

    def __init__(self, *, scrub: Callable[[str], str] | None = None) -> None:
        self._scrub = scrub or _identity
        self._started = False
        self._done = False
        self._input_tokens = 0
        self._stop: StopReason | None = None
        self._calls: dict[int, _OpenCall] = {}
        self._thinking: dict[int, _OpenThinking] = {}
        self._completed_calls = 0
        self._ignored: set[int] = set()
        self._model = ""
        self._cache_read = 0
        self._cache_write = 0
        self._folder = NoticeFolder()

    @property
    def done(self) -> bool:
        return self._done

    def feed(self, frame: SseFrame) -> list[StreamEvent]:
        if self._done or frame.event not in _KNOWN_EVENTS:
            return []
        payload = decode_json_object(frame.data)
        if payload is None:
            if frame.at_eof:  # the body ended inside this event: a cut frame, finish() decides
                return []
            return self._folder.admit([notice(Messages.UNDECODABLE_EVENT, self._scrub(frame.data))])
        kind = frame.event
        if kind == "message":
            kind = _text(payload.get("type"))
        out: list[StreamEvent] = []
        try:
            self._dispatch(kind, payload, out)
        except _Undecodable:
            out.append(notice(Messages.UNDECODABLE_EVENT, self._scrub(frame.data)))
        if not self._started and any(not is_terminal(event) for event in out):
            self._started = True
            out.insert(0, MessageStart(model=self._model))
        return self._folder.admit(out)

    def finish(self) -> list[StreamEvent]:
        """End of body: after a ``message_delta`` with a stop reason the stream is complete; else a failure."""
        if self._done:
            return []
        if self._stop is not None:
            out: list[StreamEvent] = []
            self._dispatch("message_stop", {}, out)
            return self._folder.admit(out)
        self._done = True
        return self._folder.admit(
            [StreamError(code=ProtocolErrorCode.MALFORMED_STREAM, message=Messages.INCOMPLETE_STREAM)]
        )

    def _dispatch(self, kind: str, payload: Mapping[str, Any], out: list[StreamEvent]) -> None:
        if kind == "message_start":
            self._message_start(payload, out)
        elif kind == "content_block_start":
            self._block_start(payload, out)
        elif kind == "content_block_delta":
            self._block_delta(payload, out)
        elif kind == "content_block_stop":
            index = _index(payload)
            call = self._calls.pop(index, None)
            if call is not None:
                event = finish_tool_call(call.id, call.name, call.fragments)
                self._completed_calls += 1
                out.append(event)
            thinking = self._thinking.pop(index, None)
            if thinking is not None:
                block = ThinkingBlock(thinking="".join(thinking.parts), signature="".join(thinking.signature))
                out.append(ThinkingComplete(block=block))
        elif kind == "message_delta":
            self._message_delta(payload, out)
        elif kind == "message_stop":
            self._start(out)
            for index in sorted(self._calls):
                call = self._calls[index]
                out.append(unreadable_call(call.id, call.name, Messages.UNFINISHED_CALL))
            self._calls.clear()
            self._thinking.clear()
            out.append(MessageStop(stop_reason=effective_stop(self._stop, self._completed_calls)))
            self._done = True
        elif kind == "error":
            self._error(payload, out)

    def _start(self, out: list[StreamEvent]) -> None:
        """``MessageStart`` goes out with the first content, so an error before any content can be retried."""
        if not self._started:
            self._started = True
            out.append(MessageStart(model=self._model))

    def _message_start(self, payload: Mapping[str, Any], out: list[StreamEvent]) -> None:
        message = payload.get("message")
        if not isinstance(message, dict):
            raise _Undecodable
        if self._started:
            return
        model = message.get("model")
        usage = message.get("usage")
        if isinstance(usage, dict):
            self._input_tokens = _input_tokens(usage) or 0
            self._cache_usage(usage)
        self._model = model if isinstance(model, str) else ""

    def _cache_usage(self, usage: Mapping[str, Any]) -> None:
        read = non_negative_int(usage.get("cache_read_input_tokens"))
        write = non_negative_int(usage.get("cache_creation_input_tokens"))
        self._cache_read = self._cache_read if read is None else read
        self._cache_write = self._cache_write if write is None else write

    def _block_start(self, payload: Mapping[str, Any], out: list[StreamEvent]) -> None:
        index = _index(payload)
        block = payload.get("content_block")
        if not isinstance(block, dict):
            raise _Undecodable
        kind = block.get("type")
        if kind == "tool_use":
            call_id, name = block.get("id"), block.get("name")
            if not (isinstance(call_id, str) and call_id and isinstance(name, str) and name):
                raise _Undecodable
            if index in self._calls:
                raise _Undecodable
            self._start(out)
            self._calls[index] = _OpenCall(call_id, name)
            out.append(ToolCallStart(id=call_id, name=name))
        elif kind == "text":
            text = block.get("text", "")
            if not isinstance(text, str):
                raise _Undecodable
            self._start(out)
            if text:
                out.append(TextDelta(text=text))
        elif kind == "thinking":
            text, signature = block.get("thinking", ""), block.get("signature", "")
            if not isinstance(text, str) or not isinstance(signature, str) or index in self._thinking:
                raise _Undecodable
            self._start(out)
            self._thinking[index] = _OpenThinking([text] if text else [], [signature] if signature else [])
            if text:
                out.append(ThinkingDelta(text=text))
        elif kind == "redacted_thinking":
            data = block.get("data")
            if not isinstance(data, str):
                raise _Undecodable
            self._start(out)
            self._ignored.add(index)
            out.append(ThinkingComplete(block=RedactedThinkingBlock(data=data)))
        else:
            self._ignored.add(index)

    def _block_delta(self, payload: Mapping[str, Any], out: list[StreamEvent]) -> None:
        index = _index(payload)
        delta = payload.get("delta")
        if not isinstance(delta, dict):
            raise _Undecodable
        kind = delta.get("type")
        if kind == "text_delta":
            text = delta.get("text")
            if not isinstance(text, str):
                raise _Undecodable
            if text:
                self._start(out)
                out.append(TextDelta(text=text))
        elif kind in ("thinking_delta", "signature_delta"):
            field = "thinking" if kind == "thinking_delta" else "signature"
            piece = delta.get(field)
            if not isinstance(piece, str):
                raise _Undecodable
            thinking = self._thinking.get(index)
            if thinking is None:
                raise _Undecodable
            if kind == "thinking_delta":
                thinking.parts.append(piece)
                if piece:
                    out.append(ThinkingDelta(text=piece))
            else:
                thinking.signature.append(piece)
        elif kind == "input_json_delta":
            fragment = delta.get("partial_json")
            if not isinstance(fragment, str):
                raise _Undecodable
            call = self._calls.get(index)
            if call is None:
                if index not in self._ignored:
                    out.append(notice(Messages.ORPHAN_ARGUMENTS, self._scrub(fragment)))
            elif fragment:
                call.fragments.append(fragment)
                out.append(ToolCallInputDelta(id=call.id, partial_json=fragment))

    def _message_delta(self, payload: Mapping[str, Any], out: list[StreamEvent]) -> None:
        delta = payload.get("delta")
        usage = payload.get("usage")
        if not isinstance(delta, dict) or (usage is not None and not isinstance(usage, dict)):
            raise _Undecodable
        reason = delta.get("stop_reason")
        if isinstance(reason, str):
            self._stop = _STOP_REASONS.get(reason, StopReason.OTHER)
        if isinstance(usage, dict):
            self._start(out)
            input_tokens = _input_tokens(usage)
            self._cache_usage(usage)
            out.append(
                Usage(
                    input_tokens=self._input_tokens if input_tokens is None else input_tokens,
                    output_tokens=non_negative_int(usage.get("output_tokens")) or 0,
                    cache_read_input_tokens=self._cache_read,
                    cache_creation_input_tokens=self._cache_write,
                )
            )

    def _error(self, payload: Mapping[str, Any], out: list[StreamEvent]) -> None:
        error = payload.get("error")
        if not isinstance(error, dict):
            raise _Undecodable
        kind, message = _text(error.get("type")), _text(error.get("message"))
        rate_limited = kind == "rate_limit_error"
        if rate_limited:
            text = Messages.STREAM_RATE_LIMITED
        elif kind in _TRANSIENT_ERRORS and not self._started:
            text = Messages.SERVER_ERROR  # before any content, an overload is retried like HTTP 529
        else:
            text = Messages.STREAM_PROVIDER_ERROR
        out.append(
            StreamError(
                code=ProtocolErrorCode.RATE_LIMITED if rate_limited else ProtocolErrorCode.HTTP_STATUS,
                message=text,
                provider_detail=self._scrub(message or kind) or None,
            )
        )
        self._done = True


def _index(payload: Mapping[str, Any]) -> int:
    index = non_negative_int(payload.get("index"))
    if index is None:
        raise _Undecodable
    return index


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


def _message_to_wire(message: Message) -> dict[str, Any] | None:
    results: list[dict[str, Any]] = []
    others: list[dict[str, Any]] = []
    for block in message.content:
        if isinstance(block, ThinkingBlock):
            # Sent back verbatim, signature included: a tool-use continuation is refused without it.
            others.append({"type": "thinking", "thinking": block.thinking, "signature": block.signature})
        elif isinstance(block, RedactedThinkingBlock):
            others.append({"type": "redacted_thinking", "data": block.data})
        elif isinstance(block, TextBlock):
            if block.text:  # the API rejects empty text blocks
                others.append({"type": "text", "text": block.text})
        elif isinstance(block, ToolCallBlock):
            others.append(
                {"type": "tool_use", "id": block.id, "name": block.name, "input": _tool_use_input(block.input)}
            )
        elif isinstance(block, ToolResultBlock):
            results.append(
                {
                    "type": "tool_result",
                    "tool_use_id": block.call_id,
                    "content": block.content,
                    "is_error": block.is_error,
                }
            )
    content = results + others  # tool results must lead a user message
    if not content:
        return None
    return {"role": message.role, "content": content}


def _mark_prefix(messages: list[dict[str, Any]]) -> None:
    """A cache breakpoint on the last block of the last message that can carry one (not a thinking block)."""
    if not messages:
        return
    content = messages[-1]["content"]
    for index in range(len(content) - 1, -1, -1):
        if content[index]["type"] not in ("thinking", "redacted_thinking"):
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

    name: Final = "anthropic"
    env_var: Final = "ANTHROPIC_API_KEY"
    default_base_url: Final = "https://api.anthropic.com"
    endpoint: Final = "/v1/messages"

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
            message, kind = _text(error.get("message")), _text(error.get("type"))
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
