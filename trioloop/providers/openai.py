"""The OpenAI Chat Completions wire shape: request body, auth header, chunk mapping, error bodies.

This and ``anthropic.py`` are the only modules that know a provider's JSON. Tool calls arrive as
fragments keyed by ``index``; a call is complete when the index moves on or ``finish_reason`` arrives,
which gives the same event order Anthropic's content blocks give. ``data: [DONE]`` ends the stream.
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
    ToolCallInputDelta,
    ToolCallStart,
    Usage,
)
from trioloop.protocol.messages import Message, TextBlock, ToolCallBlock, ToolResultBlock
from trioloop.protocol.preflight import MODEL_TABLE, ModelCapabilities
from trioloop.protocol.tools import ChatRequest
from trioloop.providers.base import (
    ErrorBody,
    Messages,
    WireResponse,
    decode_json_object,
    finish_tool_call,
    non_negative_int,
    notice,
    split_text,
)
from trioloop.providers.retry import DEFAULT_RETRY_POLICY, RetryPolicy
from trioloop.providers.sse import SseFrame
from trioloop.providers.transport import (
    DEFAULT_MAX_RESPONSE_BYTES,
    DEFAULT_READ_TIMEOUT,
    HttpChatProvider,
)

__all__ = [
    "OPENAI_WIRE",
    "OpenAIProvider",
    "OpenAIStreamMapper",
    "OpenAIWire",
    "build_openai_body",
    "render_openai_stream",
]

_FINISH_REASONS: Final[Mapping[str, StopReason]] = {
    "stop": StopReason.END_TURN,
    "tool_calls": StopReason.TOOL_USE,
    "length": StopReason.MAX_TOKENS,
    "content_filter": StopReason.REFUSAL,
}
_WIRE_FINISH_REASONS: Final[Mapping[StopReason, str]] = {
    StopReason.END_TURN: "stop",
    StopReason.TOOL_USE: "tool_calls",
    StopReason.MAX_TOKENS: "length",
    StopReason.STOP_SEQUENCE: "stop",  # Chat Completions does not distinguish a stop sequence
    StopReason.REFUSAL: "content_filter",
    StopReason.OTHER: "function_call",
}
_ERROR_KINDS: Final[Mapping[int, tuple[str, str]]] = {
    400: ("invalid_request_error", "invalid_request"),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "unsupported_country_region_territory"),
    404: ("invalid_request_error", "model_not_found"),
    429: ("requests", "rate_limit_exceeded"),
}


def _identity(text: str) -> str:
    return text


class _Undecodable(Exception):
    """A chunk whose JSON does not have the documented shape."""


@attrs.define
class _OpenCall:
    index: int
    id: str
    name: str
    fragments: list[str] = attrs.field(factory=list)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


@final
class OpenAIStreamMapper:
    """Maps Chat Completions stream chunks onto ``StreamEvent``s; one instance per response."""

    def __init__(self, *, scrub: Callable[[str], str] | None = None) -> None:
        self._scrub = scrub or _identity
        self._started = False
        self._done = False
        self._stop: StopReason | None = None
        self._open: _OpenCall | None = None
        self._used_indexes: set[int] = set()
        self._refused = False

    @property
    def done(self) -> bool:
        return self._done

    def feed(self, frame: SseFrame) -> list[StreamEvent]:
        if self._done:
            return []
        if frame.data.strip() == "[DONE]":
            return self._end()
        payload = decode_json_object(frame.data)
        if payload is None:
            return [notice(Messages.UNDECODABLE_EVENT, self._scrub(frame.data))]
        error = payload.get("error")
        if error is not None:
            return [self._error(error)]
        out: list[StreamEvent] = []
        try:
            self._chunk(payload, out)
        except _Undecodable:
            out.append(notice(Messages.UNDECODABLE_EVENT, self._scrub(frame.data)))
        return out

    def finish(self) -> list[StreamEvent]:
        if self._done:
            return []
        self._done = True
        return [StreamError(code=ProtocolErrorCode.MALFORMED_STREAM, message=Messages.INCOMPLETE_STREAM)]

    def _chunk(self, payload: Mapping[str, Any], out: list[StreamEvent]) -> None:
        if not self._started:
            self._started = True
            out.append(MessageStart(model=_text(payload.get("model"))))
        choices = payload.get("choices")
        usage = payload.get("usage")
        if (choices is not None and not isinstance(choices, list)) or (
            usage is not None and not isinstance(usage, dict)
        ):
            raise _Undecodable
        choice = next((c for c in choices or () if isinstance(c, dict) and c.get("index", 0) == 0), None)
        if choice is not None:
            delta = choice.get("delta")
            if delta is not None and not isinstance(delta, dict):
                raise _Undecodable
            if delta:
                content = delta.get("content")
                if content is not None and not isinstance(content, str):
                    raise _Undecodable
                if content:
                    out.append(TextDelta(text=content))
                refusal = delta.get("refusal")
                if refusal is not None and not isinstance(refusal, str):
                    raise _Undecodable
                if refusal:
                    # A refusal streams in its own field; it reads like Anthropic's refusal text + stop reason.
                    self._refused = True
                    out.append(TextDelta(text=refusal))
                fragments = delta.get("tool_calls")
                if fragments is not None and not isinstance(fragments, list):
                    raise _Undecodable
                for fragment in fragments or ():
                    self._fragment(fragment, out)
            reason = choice.get("finish_reason")
            if isinstance(reason, str):
                self._close_open_call(out)
                self._stop = _FINISH_REASONS.get(reason, StopReason.OTHER)
                if self._refused and self._stop is StopReason.END_TURN:
                    self._stop = StopReason.REFUSAL
        if isinstance(usage, dict):
            out.append(
                Usage(
                    input_tokens=non_negative_int(usage.get("prompt_tokens")) or 0,
                    output_tokens=non_negative_int(usage.get("completion_tokens")) or 0,
                )
            )

    def _fragment(self, fragment: Any, out: list[StreamEvent]) -> None:
        if not isinstance(fragment, dict):
            raise _Undecodable
        index = non_negative_int(fragment.get("index"))
        function = fragment.get("function")
        if function is None:
            function = {}
        if index is None or not isinstance(function, dict):
            raise _Undecodable
        arguments = function.get("arguments")
        if arguments is not None and not isinstance(arguments, str):
            raise _Undecodable
        arguments = arguments or ""
        current = self._open
        if current is not None and current.index == index:
            if arguments:
                current.fragments.append(arguments)
                out.append(ToolCallInputDelta(id=current.id, partial_json=arguments))
            return
        call_id, name = _text(fragment.get("id")), _text(function.get("name"))
        if index in self._used_indexes or not call_id or not name:
            out.append(notice(Messages.ORPHAN_ARGUMENTS, self._scrub(arguments)))
            return
        self._close_open_call(out)
        self._used_indexes.add(index)
        self._open = _OpenCall(index, call_id, name)
        out.append(ToolCallStart(id=call_id, name=name))
        if arguments:
            self._open.fragments.append(arguments)
            out.append(ToolCallInputDelta(id=call_id, partial_json=arguments))

    def _close_open_call(self, out: list[StreamEvent]) -> None:
        if self._open is not None:
            call, self._open = self._open, None
            out.append(finish_tool_call(call.id, call.name, call.fragments))

    def _end(self) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        if not self._started:
            self._started = True
            out.append(MessageStart(model=""))
        if self._open is not None:
            out.append(notice(Messages.UNFINISHED_CALL, self._scrub(self._open.name)))
            self._open = None
        out.append(MessageStop(stop_reason=self._stop or StopReason.OTHER))
        self._done = True
        return out

    def _error(self, error: Any) -> StreamError:
        self._done = True
        if isinstance(error, dict):
            kind, code, message = _text(error.get("type")), _text(error.get("code")), _text(error.get("message"))
        else:
            kind, code, message = "", "", _text(error)
        label = f"{kind} {code}"
        rate_limited = "rate_limit" in label or "insufficient_quota" in label
        return StreamError(
            code=ProtocolErrorCode.RATE_LIMITED if rate_limited else ProtocolErrorCode.HTTP_STATUS,
            message=Messages.STREAM_RATE_LIMITED if rate_limited else Messages.STREAM_PROVIDER_ERROR,
            provider_detail=self._scrub(message or code or kind) or None,
        )


def _arguments(value: Any) -> str:
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        return "{}"


def _messages_to_wire(message: Message) -> list[dict[str, Any]]:
    text = "".join(b.text for b in message.content if isinstance(b, TextBlock))
    if message.role == "assistant":
        calls = [b for b in message.content if isinstance(b, ToolCallBlock)]
        wire: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
        if calls:
            wire["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": _arguments(c.input)}}
                for c in calls
            ]
        return [wire]
    results = [b for b in message.content if isinstance(b, ToolResultBlock)]
    out: list[dict[str, Any]] = [{"role": "tool", "tool_call_id": r.call_id, "content": r.content} for r in results]
    if text or not results:
        out.append({"role": "user", "content": text})
    return out


def build_openai_body(request: ChatRequest) -> dict[str, Any]:
    """The Chat Completions request: leading system message, tool_calls, role "tool" results, usage on."""
    messages: list[dict[str, Any]] = []
    if request.system:
        messages.append({"role": "system", "content": request.system})
    for message in request.messages:
        messages.extend(_messages_to_wire(message))
    body: dict[str, Any] = {
        "model": request.model,
        "max_completion_tokens": request.max_tokens,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description, "parameters": dict(t.json_schema)},
            }
            for t in request.tools
        ]
    return body


def _data(payload: Mapping[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'), ensure_ascii=False)}\n\n"


def render_openai_stream(response: WireResponse) -> bytes:
    """``response`` as Chat Completions would stream it with ``stream_options.include_usage``."""

    def chunk(delta: Mapping[str, Any], finish: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return _data(
            {
                "id": "chatcmpl-scripted",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": response.model,
                "choices": [choice],
            }
        )

    parts = [chunk({"role": "assistant", "content": ""})]
    for piece in split_text(response.text, response.text_piece):
        parts.append(chunk({"content": piece}))
    if response.error_type is not None:
        error = {"message": response.error_message, "type": response.error_type, "param": None, "code": None}
        parts.append(_data({"error": error}))
        return "".join(parts).encode()
    for index, call in enumerate(response.tool_calls):
        first = {"index": index, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}
        parts.append(chunk({"tool_calls": [first]}))
        for piece in split_text(_arguments(call.input), response.arguments_piece):
            parts.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
    parts.append(chunk({}, _WIRE_FINISH_REASONS[response.stop_reason]))
    usage = {
        "prompt_tokens": response.input_tokens,
        "completion_tokens": response.output_tokens,
        "total_tokens": response.input_tokens + response.output_tokens,
    }
    parts.append(
        _data(
            {
                "id": "chatcmpl-scripted",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": response.model,
                "choices": [],
                "usage": usage,
            }
        )
    )
    parts.append("data: [DONE]\n\n")
    return "".join(parts).encode()


@final
class OpenAIWire:
    """The ``WireFormat`` for OpenAI Chat Completions."""

    name: Final = "openai"
    env_var: Final = "OPENAI_API_KEY"
    default_base_url: Final = "https://api.openai.com/v1"
    endpoint: Final = "/chat/completions"

    def auth_headers(self, api_key: str) -> dict[str, str]:
        return {"authorization": f"Bearer {api_key}"}

    def build_body(self, request: ChatRequest) -> dict[str, Any]:
        return build_openai_body(request)

    def new_mapper(self, *, scrub: Callable[[str], str] | None = None) -> OpenAIStreamMapper:
        return OpenAIStreamMapper(scrub=scrub)

    def describe_error_body(self, body: bytes) -> ErrorBody:
        payload = decode_json_object(body.decode("utf-8", errors="replace"))
        error = payload.get("error") if payload is not None else None
        if isinstance(error, dict):
            message, code, kind = _text(error.get("message")), _text(error.get("code")), _text(error.get("type"))
            label = ": ".join(part for part in (code or kind, message) if part)
            return ErrorBody(detail=label, context_overflow=code == "context_length_exceeded")
        return ErrorBody(detail=body.decode("utf-8", errors="replace"))

    def render_stream(self, response: WireResponse) -> bytes:
        return render_openai_stream(response)

    def render_error_body(self, status: int, message: str) -> bytes:
        kind, code = _ERROR_KINDS.get(status, ("server_error", "server_error"))
        return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()


OPENAI_WIRE: Final = OpenAIWire()


@final
class OpenAIProvider(HttpChatProvider):
    """Streams from OpenAI Chat Completions; the key comes from ``api_key`` or ``OPENAI_API_KEY``."""

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
    ) -> None:
        super().__init__(
            OPENAI_WIRE,
            api_key=api_key,
            base_url=base_url,
            client=client,
            read_timeout=read_timeout,
            max_response_bytes=max_response_bytes,
            retry=retry,
            model_table=model_table,
        )
