"""The StreamEvent union: the only vocabulary a loop consumer sees from any provider."""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from typing import Final, TypeAlias

import attrs

from trioloop.protocol.errors import ProtocolErrorCode, redact_provider_detail
from trioloop.protocol.messages import JsonValue, ProviderBlock, RedactedThinkingBlock, ThinkingBlock

__all__ = [
    "Aborted",
    "MessageStart",
    "MessageStop",
    "ProviderBlockComplete",
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
    "retry_label",
    "terminal_cut",
    "usage_sum",
]


class StopReason(enum.StrEnum):
    """Why a response ended. ``PAUSE_TURN``: the server paused a long turn of its own tools (Anthropic's
    ``pause_turn``); the response goes back as it is so the model continues, as the next iteration."""

    END_TURN = "end_turn"
    TOOL_USE = "tool_use"
    MAX_TOKENS = "max_tokens"
    STOP_SEQUENCE = "stop_sequence"
    REFUSAL = "refusal"
    PAUSE_TURN = "pause_turn"
    OTHER = "other"


def _str(inst: object, attribute: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{attribute.name} must be str, got {type(value).__name__}")


def _count(inst: object, attribute: attrs.Attribute[int], value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{attribute.name} must be a non-negative int, got {value!r}")


@attrs.frozen(kw_only=True)
class MessageStart:
    """A response began; ``model`` is the model the server named (may be empty). ``provider`` names the provider
    that answered when a `FallbackProvider` chose among several (its name for it), else it is empty."""

    model: str = attrs.field(default="", validator=_str)
    provider: str = attrs.field(default="", validator=_str)


@attrs.frozen(kw_only=True)
class TextDelta:
    """A piece of the response's text, in order."""

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


def _provider_block(inst: object, attribute: attrs.Attribute[ProviderBlock], value: object) -> None:
    if not isinstance(value, ProviderBlock):
        raise TypeError(f"{attribute.name} must be a ProviderBlock")


@attrs.frozen(kw_only=True)
class ProviderBlockComplete:
    """A whole block only its wire understands (a server tool's use or result, a reasoning item): it joins
    the assistant message in stream order and goes back to that wire verbatim. Nothing runs for it."""

    block: ProviderBlock = attrs.field(validator=_provider_block)


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


def _optional_str(inst: object, attribute: attrs.Attribute[str | None], value: object) -> None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{attribute.name} must be str or None, got {type(value).__name__}")


@attrs.frozen(kw_only=True)
class ToolCallComplete:
    """A whole tool call; ``input`` is the parsed arguments, untrusted and unvalidated.

    ``input_error`` set means the arguments could not be read (not JSON, cut off): ``input`` is then
    ``{}``, and the call is answered with this error and never prepared, so the model learns of it and the
    person sees it, instead of the call vanishing.
    """

    id: str = attrs.field(validator=_str)
    name: str = attrs.field(validator=_str)
    input: JsonValue = None
    input_error: str | None = attrs.field(default=None, validator=_optional_str)


@attrs.frozen(kw_only=True)
class Usage:
    """Token counts; ``input_tokens`` includes the cache reads and writes, which are also given apart,
    and ``output_tokens`` includes the reasoning tokens, also given apart."""

    input_tokens: int = attrs.field(default=0, validator=_count)
    output_tokens: int = attrs.field(default=0, validator=_count)
    cache_read_input_tokens: int = attrs.field(default=0, validator=_count)
    cache_creation_input_tokens: int = attrs.field(default=0, validator=_count)
    reasoning_tokens: int = attrs.field(default=0, validator=_count)


def usage_sum(a: Usage, b: Usage) -> Usage:
    """Both counts added, field by field (a turn's iterations, a session's turns)."""
    return Usage(
        input_tokens=a.input_tokens + b.input_tokens,
        output_tokens=a.output_tokens + b.output_tokens,
        cache_read_input_tokens=a.cache_read_input_tokens + b.cache_read_input_tokens,
        cache_creation_input_tokens=a.cache_creation_input_tokens + b.cache_creation_input_tokens,
        reasoning_tokens=a.reasoning_tokens + b.reasoning_tokens,
    )


@attrs.frozen(kw_only=True)
class MessageStop:
    """A response ended, with the server's ``stop_reason`` (end_turn, tool_use, max_tokens, ...)."""

    stop_reason: StopReason = attrs.field(converter=StopReason)


def _optional_seconds(inst: object, attribute: attrs.Attribute[float | None], value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{attribute.name} must be None or a finite number >= 0, got {value!r}")


def _redact_optional(value: str | None) -> str | None:
    return None if value is None else redact_provider_detail(value)


@attrs.frozen(kw_only=True)
class StreamError:
    """A provider failure inside the stream.

    ``terminal=False`` is a notice: one bad frame was skipped (always ``malformed_stream``) and the
    stream goes on. ``provider_detail`` is redacted on construction, whoever builds the event.
    ``retry_after`` is the server's own wait hint in seconds (``retry-after``), when it gave one.
    ``provider`` names the provider that failed when a `FallbackProvider` chose among several, else it is empty.
    """

    code: ProtocolErrorCode = attrs.field(converter=ProtocolErrorCode)
    message: str = attrs.field(validator=_str)
    provider_detail: str | None = attrs.field(default=None, converter=_redact_optional)
    terminal: bool = attrs.field(default=True)
    retry_after: float | None = attrs.field(default=None, validator=_optional_seconds)
    provider: str = attrs.field(default="", validator=_str)

    @terminal.validator
    def _notice_is_malformed(self, attribute: attrs.Attribute[bool], value: bool) -> None:
        if not value and self.code is not ProtocolErrorCode.MALFORMED_STREAM:
            raise ValueError("only malformed_stream errors can be non-terminal notices")


def retry_label(failure: StreamError) -> str:
    """The short name of a failure: ``HTTP 529`` from its detail, else the network cause, else its message."""
    detail = failure.provider_detail or ""
    if detail.startswith("HTTP "):
        return detail.split(":", 1)[0]
    return detail or failure.message


@attrs.frozen(kw_only=True)
class Aborted:
    """The stream was cancelled by its consumer. Not an error."""


StreamEvent: TypeAlias = (
    MessageStart
    | TextDelta
    | ThinkingDelta
    | ThinkingComplete
    | ProviderBlockComplete
    | ToolCallStart
    | ToolCallInputDelta
    | ToolCallComplete
    | Usage
    | MessageStop
    | StreamError
    | Aborted
)


#: The events that are never terminal and make up nearly every stream: checked first, by exact type.
_NEVER_TERMINAL: Final = frozenset({TextDelta, ThinkingDelta, ToolCallInputDelta, ToolCallStart, MessageStart, Usage})


def is_terminal(event: StreamEvent) -> bool:
    """True for the events that end a stream: a stop, a terminal error, or an abort."""
    if type(event) in _NEVER_TERMINAL:  # the common case, decided without an isinstance walk
        return False
    if isinstance(event, MessageStop | Aborted):
        return True
    return isinstance(event, StreamError) and event.terminal


def terminal_cut(events: Sequence[StreamEvent]) -> tuple[int, bool]:
    """How many of ``events`` go on (up to and including the first terminal one), and whether that last one
    ends the stream: one pass, for the channels that stop forwarding at a terminal event."""
    for index, event in enumerate(events):
        if type(event) not in _NEVER_TERMINAL and is_terminal(event):
            return index + 1, True
    return len(events), False
