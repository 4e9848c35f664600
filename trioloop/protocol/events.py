"""The StreamEvent union: the only vocabulary a loop consumer sees from any provider."""

from __future__ import annotations

import enum
from typing import TypeAlias

import attrs

from trioloop.protocol.errors import ProtocolErrorCode, redact_provider_detail
from trioloop.protocol.messages import JsonValue, RedactedThinkingBlock, ThinkingBlock

__all__ = [
    "Aborted",
    "MessageStart",
    "MessageStop",
    "StopReason",
    "StreamError",
    "StreamEvent",
    "TextDelta",
    "ThinkingComplete",
    "ThinkingDelta",
    "ToolCallComplete",
    "ToolCallInputDelta",
    "ToolCallStart",
    "Usage",
    "is_terminal",
    "usage_sum",
]


class StopReason(enum.StrEnum):
    END_TURN = "end_turn"
    TOOL_USE = "tool_use"
    MAX_TOKENS = "max_tokens"
    STOP_SEQUENCE = "stop_sequence"
    REFUSAL = "refusal"
    OTHER = "other"


def _str(inst: object, attribute: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{attribute.name} must be str, got {type(value).__name__}")


def _count(inst: object, attribute: attrs.Attribute[int], value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{attribute.name} must be a non-negative int, got {value!r}")


@attrs.frozen(kw_only=True)
class MessageStart:
    model: str = attrs.field(default="", validator=_str)


@attrs.frozen(kw_only=True)
class TextDelta:
    text: str = attrs.field(validator=_str)


@attrs.frozen(kw_only=True)
class ThinkingDelta:
    """Informational: a piece of the model's reasoning text, for a UI to show; never part of the answer."""

    text: str = attrs.field(validator=_str)


def _thinking_block(
    inst: object, attribute: attrs.Attribute[ThinkingBlock | RedactedThinkingBlock], value: object
) -> None:
    if not isinstance(value, ThinkingBlock | RedactedThinkingBlock):
        raise TypeError(f"{attribute.name} must be a ThinkingBlock or RedactedThinkingBlock")


@attrs.frozen(kw_only=True)
class ThinkingComplete:
    """A whole thinking block (signature included) that belongs in the assistant message, in stream order."""

    block: ThinkingBlock | RedactedThinkingBlock = attrs.field(validator=_thinking_block)


@attrs.frozen(kw_only=True)
class ToolCallStart:
    """Informational: a call began streaming. Never creates a call by itself."""

    id: str = attrs.field(validator=_str)
    name: str = attrs.field(validator=_str)


@attrs.frozen(kw_only=True)
class ToolCallInputDelta:
    """Informational: one fragment of a call's JSON arguments (not JSON on its own)."""

    id: str = attrs.field(validator=_str)
    partial_json: str = attrs.field(validator=_str)


@attrs.frozen(kw_only=True)
class ToolCallComplete:
    """A whole tool call; ``input`` is the parsed arguments, untrusted and unvalidated."""

    id: str = attrs.field(validator=_str)
    name: str = attrs.field(validator=_str)
    input: JsonValue = None


@attrs.frozen(kw_only=True)
class Usage:
    """Token counts; ``input_tokens`` includes the cache reads and writes, which are also given apart."""

    input_tokens: int = attrs.field(default=0, validator=_count)
    output_tokens: int = attrs.field(default=0, validator=_count)
    cache_read_input_tokens: int = attrs.field(default=0, validator=_count)
    cache_creation_input_tokens: int = attrs.field(default=0, validator=_count)


def usage_sum(a: Usage, b: Usage) -> Usage:
    """Both counts added, field by field (a turn's iterations, a session's turns)."""
    return Usage(
        input_tokens=a.input_tokens + b.input_tokens,
        output_tokens=a.output_tokens + b.output_tokens,
        cache_read_input_tokens=a.cache_read_input_tokens + b.cache_read_input_tokens,
        cache_creation_input_tokens=a.cache_creation_input_tokens + b.cache_creation_input_tokens,
    )


@attrs.frozen(kw_only=True)
class MessageStop:
    stop_reason: StopReason = attrs.field(converter=StopReason)


def _redact_optional(value: str | None) -> str | None:
    return None if value is None else redact_provider_detail(value)


@attrs.frozen(kw_only=True)
class StreamError:
    """A provider failure inside the stream.

    ``terminal=False`` is a notice: one bad frame was skipped (always ``malformed_stream``) and the
    stream goes on. ``provider_detail`` is redacted on construction, whoever builds the event.
    """

    code: ProtocolErrorCode = attrs.field(converter=ProtocolErrorCode)
    message: str = attrs.field(validator=_str)
    provider_detail: str | None = attrs.field(default=None, converter=_redact_optional)
    terminal: bool = attrs.field(default=True)

    @terminal.validator
    def _notice_is_malformed(self, attribute: attrs.Attribute[bool], value: bool) -> None:
        if not value and self.code is not ProtocolErrorCode.MALFORMED_STREAM:
            raise ValueError("only malformed_stream errors can be non-terminal notices")


@attrs.frozen(kw_only=True)
class Aborted:
    """The stream was cancelled by its consumer. Not an error."""


StreamEvent: TypeAlias = (
    MessageStart
    | TextDelta
    | ThinkingDelta
    | ThinkingComplete
    | ToolCallStart
    | ToolCallInputDelta
    | ToolCallComplete
    | Usage
    | MessageStop
    | StreamError
    | Aborted
)


def is_terminal(event: StreamEvent) -> bool:
    """True for the events that end a stream: a stop, a terminal error, or an abort."""
    if isinstance(event, MessageStop | Aborted):
        return True
    return isinstance(event, StreamError) and event.terminal
