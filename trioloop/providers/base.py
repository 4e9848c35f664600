"""The provider contract, the seams between its layers, and the pieces both wire mappers share.

A ``ChatProvider`` turns one neutral ``ChatRequest`` into ``StreamEvent``s on a send channel, ending with
exactly one terminal event. Below it sit a ``Transport`` (one HTTP attempt, or a retrying wrapper around
one) and a ``WireFormat`` (everything that knows a provider's JSON). Authored failure messages live here
so the classification that decides retries reads one set of constants.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NoReturn, Protocol, final

import attrs
import trio

from trioloop.protocol.errors import ProtocolError, ProtocolErrorCode
from trioloop.protocol.events import StopReason, StreamError, StreamEvent, ToolCallComplete, is_terminal
from trioloop.protocol.messages import JsonValue, ToolCallBlock
from trioloop.protocol.provider import ChatProvider
from trioloop.protocol.tools import ChatRequest
from trioloop.providers.sse import SseDecoder, SseFrame

__all__ = [
    "AttemptOutcome",
    "ChatProvider",
    "ErrorBody",
    "Messages",
    "NoticeFolder",
    "StreamMapper",
    "TransientFailure",
    "Transport",
    "WireFormat",
    "WireResponse",
    "arguments_json",
    "compact_json",
    "decode_json_object",
    "effective_stop",
    "finish_tool_call",
    "is_retriable",
    "loads_strict_json",
    "map_chunks",
    "no_scrub",
    "non_negative_int",
    "notice",
    "split_text",
    "text_or_empty",
    "unreadable_call",
]


@final
class Messages:
    """Authored, user-safe sentences for every failure the providers report (no provider text inside)."""

    UNDECODABLE_EVENT = "The AI provider sent a stream event that could not be decoded; it was skipped."
    ORPHAN_ARGUMENTS = "The AI provider sent tool-call arguments for a call that was never started; they were ignored."
    # Why a call's arguments could not be read: its ``input_error`` (the call is answered, never run).
    BAD_TOOL_ARGUMENTS = "not valid JSON"
    UNFINISHED_CALL = "cut off: the call never finished streaming"
    NOTICES_FOLDED = "{count} more stream notice(s) like the ones above were folded into this one."
    STREAM_RATE_LIMITED = "The AI provider's rate limit or quota was exceeded; wait and try again."
    STREAM_PROVIDER_ERROR = "The AI provider reported an error while streaming the response."
    INCOMPLETE_STREAM = "The AI response ended before it was complete. Please try again."
    NO_API_KEY = "No API key is configured for this AI provider."
    AUTH_REJECTED = "The AI provider rejected the API key."
    RATE_LIMITED = "The AI provider's rate limit or quota was exceeded; wait and try again."
    SERVER_ERROR = "The AI provider had a temporary server error."
    REQUEST_REJECTED = "The AI provider rejected the request."
    REDIRECT_REFUSED = "The AI provider answered with a redirect, which is never followed."
    NETWORK = "The connection to the AI provider failed."
    READ_TIMEOUT = "The AI provider stopped sending data before the response was complete."
    TOO_LARGE = "The AI response was larger than allowed (response_too_large)."
    INSECURE_URL = "The AI provider URL must use https unless it points at this machine."
    REQUEST_FAILED = "The AI request could not be completed."


class TransientFailure(enum.StrEnum):
    """Why a failure is worth another attempt; ``classify`` returns None for the permanent ones."""

    RATE_LIMITED = "rate_limited"
    SERVER_ERROR = "server_error"
    NETWORK = "network"

    @classmethod
    def classify(cls, error: StreamError) -> TransientFailure | None:
        """429 or an in-stream rate limit, an HTTP 5xx (always before the first byte), or a network failure.

        Decided from the code and the authored message, so it survives a round trip through JSON.
        A too-large response, a malformed stream, a 4xx or an in-stream provider error are permanent.
        """
        if not error.terminal:
            return None
        if error.code is ProtocolErrorCode.RATE_LIMITED:
            return cls.RATE_LIMITED
        if error.code is ProtocolErrorCode.HTTP_STATUS and error.message == Messages.SERVER_ERROR:
            return cls.SERVER_ERROR
        if error.code is ProtocolErrorCode.TRANSPORT and error.message in (Messages.NETWORK, Messages.READ_TIMEOUT):
            return cls.NETWORK
        return None


def is_retriable(error: StreamError) -> bool:
    """True when a fresh request may succeed: rate limits, 5xx before the first byte, network failures."""
    return TransientFailure.classify(error) is not None


@final
@attrs.frozen(kw_only=True)
class AttemptOutcome:
    """How one transport attempt ended.

    ``failure`` is the terminal error, held back so a retry layer can decide whether the consumer sees it;
    None means a ``MessageStop`` was already sent. ``committed`` is true once any event reached ``send``.
    """

    failure: StreamError | None = None
    committed: bool = False
    retry_after: float | None = None


class Transport(Protocol):
    """Runs one request: forwards every event except a terminal error, which it returns instead."""

    async def attempt(self, request: ChatRequest, send: trio.abc.SendChannel[StreamEvent]) -> AttemptOutcome: ...


class StreamMapper(Protocol):
    """Sans-IO translation of one provider's SSE frames into ``StreamEvent``s."""

    @property
    def done(self) -> bool:
        """True once a terminal event was produced; later frames are ignored."""
        ...

    def feed(self, frame: SseFrame) -> list[StreamEvent]: ...

    def finish(self) -> list[StreamEvent]:
        """End of body: a ``malformed_stream`` failure unless a terminal event was already produced."""
        ...


@final
@attrs.frozen(kw_only=True)
class ErrorBody:
    """What a non-2xx body says, reduced to redactable text and the one fact the transport acts on."""

    detail: str
    context_overflow: bool = False


@final
@attrs.frozen(kw_only=True)
class WireResponse:
    """One logical model response, in no wire's shape; each wire module renders it as its own SSE bytes.

    The scripted provider, the fixture tests and the benchmark build responses with it. ``error_type``
    set means the stream breaks off with an in-stream error after the text.
    """

    model: str
    text: str = ""
    tool_calls: tuple[ToolCallBlock, ...] = ()
    stop_reason: StopReason = StopReason.END_TURN
    input_tokens: int = 0
    output_tokens: int = 0
    error_type: str | None = None
    error_message: str = ""
    text_piece: int = 16
    arguments_piece: int = 16


class WireFormat(Protocol):
    """Everything that knows one provider's JSON: request body, auth headers, stream mapper, error bodies."""

    @property
    def name(self) -> str: ...

    @property
    def env_var(self) -> str: ...

    @property
    def default_base_url(self) -> str: ...

    @property
    def endpoint(self) -> str: ...

    def auth_headers(self, api_key: str) -> dict[str, str]: ...

    def build_body(self, request: ChatRequest) -> dict[str, Any]: ...

    def new_mapper(self, *, scrub: Callable[[str], str] | None = None) -> StreamMapper:
        """A fresh mapper; ``scrub`` cleans provider text (the transport passes its key scrubber)."""
        ...

    def describe_error_body(self, body: bytes) -> ErrorBody: ...

    def render_stream(self, response: WireResponse) -> bytes: ...

    def render_error_body(self, status: int, message: str) -> bytes: ...


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"non-standard JSON constant {name}")


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError("duplicate object key")
        result[key] = value
    return result


def loads_strict_json(text: str) -> JsonValue:
    """RFC 8259 JSON only: NaN/Infinity and duplicate object keys are rejected; any failure is ValueError.

    Duplicate keys are refused because two readers of the same arguments could disagree on the value.
    """
    try:
        return json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_unique_object)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


_FRAME_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def decode_json_object(data: str) -> Mapping[str, Any] | None:
    """The frame's data as a JSON object, or None when it is anything else (NaN/Infinity included)."""
    try:
        value = _FRAME_DECODER.decode(data)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def text_or_empty(value: object) -> str:
    """``value`` when it is a string, else "" (a field a hostile server filled with anything else)."""
    return value if isinstance(value, str) else ""


def no_scrub(text: str) -> str:
    """The scrubber of a mapper nobody gave one: the text as it is."""
    return text


def compact_json(value: JsonValue) -> str | None:
    """``value`` as strict compact JSON, or None when it has none (a float too large for JSON, a non-JSON type).

    What goes back to a server verbatim (a kept block, a call's arguments) must read back exactly: a decoded
    ``1e999`` is infinite, and its non-strict text (``Infinity``) would not.
    """
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return None


def arguments_json(value: JsonValue) -> str:
    """A call's arguments as they go back in a request: strict compact JSON, ``{}`` when there is none."""
    return compact_json(value) or "{}"


def finish_tool_call(call_id: str, name: str, fragments: list[str], *, default: JsonValue = None) -> ToolCallComplete:
    """Parse a call's concatenated argument fragments once into a complete call.

    No fragments (or only whitespace) give ``default`` (``{}`` when None: a call without arguments).
    Arguments that are not strict JSON give a call with ``input_error`` set, which the turn answers with
    that error and never runs: the call is not dropped, so the model and the person both learn of it.
    """
    text = "".join(fragments)
    if not text.strip():
        return ToolCallComplete(id=call_id, name=name, input={} if default is None else default)
    try:
        value = loads_strict_json(text)
    except ValueError as exc:
        return unreadable_call(call_id, name, f"{Messages.BAD_TOOL_ARGUMENTS}: {exc}")
    return ToolCallComplete(id=call_id, name=name, input=value)


def unreadable_call(call_id: str, name: str, error: str) -> ToolCallComplete:
    """A call whose arguments could not be read: answered with ``error``, never run."""
    return ToolCallComplete(id=call_id, name=name, input={}, input_error=error)


@final
class NoticeFolder:
    """Caps a response's notices: ``per_message`` of each kind pass, the rest are counted.

    One summary notice with the count goes just before the terminal event, so a server that sends a
    shape the mapper skips in every chunk costs a few log lines, not one per chunk.
    """

    __slots__ = ("_folded", "_per_message", "_seen")

    def __init__(self, per_message: int = 3) -> None:
        self._per_message = per_message
        self._seen: dict[str, int] = {}
        self._folded = 0

    def admit(self, events: list[StreamEvent]) -> list[StreamEvent]:
        if not self._folded:
            for event in events:
                if type(event) is StreamError:
                    break
            else:
                return events
        out: list[StreamEvent] = []
        for event in events:
            if isinstance(event, StreamError):
                if not event.terminal:
                    seen = self._seen.get(event.message, 0)
                    self._seen[event.message] = seen + 1
                    if seen >= self._per_message:
                        self._folded += 1
                        continue
                elif self._folded:
                    out.append(self.summary())
            elif is_terminal(event) and self._folded:
                out.append(self.summary())
            out.append(event)
        return out

    def summary(self) -> StreamError:
        folded, self._folded = self._folded, 0
        return notice(Messages.NOTICES_FOLDED.format(count=folded))


def effective_stop(reason: StopReason | None, completed_calls: int) -> StopReason:
    """The stop reason a consumer sees: a response that completed a tool call asks for tools.

    Gemini's OpenAI endpoint, Ollama up to 0.5.11, vLLM with a named tool_choice and LiteLLM over Gemini
    end a tool-calling response with "stop". The calls still need approval like any other.
    """
    stop = reason or StopReason.OTHER
    if completed_calls and stop in (StopReason.END_TURN, StopReason.OTHER):
        return StopReason.TOOL_USE
    return stop


def notice(message: str, detail: str | None = None) -> StreamError:
    """A non-terminal ``malformed_stream`` notice: one frame or call was skipped and the stream goes on."""
    return StreamError(code=ProtocolErrorCode.MALFORMED_STREAM, message=message, provider_detail=detail, terminal=False)


def non_negative_int(value: object) -> int | None:
    """``value`` when it is a real non-negative int (bool excluded), else None."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def split_text(text: str, piece: int) -> list[str]:
    """``text`` cut into pieces of ``piece`` code points (at least one piece for non-empty text)."""
    step = max(1, piece)
    return [text[i : i + step] for i in range(0, len(text), step)]


def map_chunks(mapper: StreamMapper, chunks: Iterable[bytes]) -> list[StreamEvent]:
    """Sans-IO: a whole body through a fresh ``SseDecoder`` and ``mapper``, as the transport reads it.

    Stops at the first terminal event; a decoder failure becomes a terminal ``malformed_stream`` error,
    and a body that ends without a terminal event gets the mapper's ``finish`` failure.
    """
    decoder = SseDecoder()
    out: list[StreamEvent] = []
    try:
        for chunk in chunks:
            for frame in decoder.feed(chunk):
                for event in mapper.feed(frame):
                    out.append(event)
                    if is_terminal(event):
                        return out
        for frame in decoder.close():
            for event in mapper.feed(frame):
                out.append(event)
                if is_terminal(event):
                    return out
    except ProtocolError as exc:
        out.append(StreamError(code=exc.code, message=exc.message))
        return out
    out.extend(mapper.finish())
    return out
