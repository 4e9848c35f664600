"""JSON round-trips for messages and stream events (cattrs), tagged with a ``type`` field."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import cattrs

from trioloop.protocol.errors import ProtocolErrorCode
from trioloop.protocol.events import (
    Aborted,
    MessageStart,
    MessageStop,
    ProviderBlockComplete,
    StopReason,
    StreamError,
    StreamEvent,
    TextDelta,
    ThinkingComplete,
    ThinkingDelta,
    ToolCallComplete,
    ToolCallInputDelta,
    ToolCallStart,
    Usage,
)
from trioloop.protocol.messages import (
    ContentBlock,
    Message,
    ProviderBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
    ToolResultBlock,
)

__all__ = [
    "SerializationError",
    "converter",
    "event_from_json",
    "event_to_json",
    "message_from_json",
    "message_to_json",
    "messages_from_json",
    "messages_to_json",
]


class SerializationError(ValueError):
    """A JSON value that is not a valid message or event."""


_BLOCK_TAGS: dict[type[Any], str] = {
    TextBlock: "text",
    ToolCallBlock: "tool_call",
    ToolResultBlock: "tool_result",
    ThinkingBlock: "thinking",
    RedactedThinkingBlock: "redacted_thinking",
    ProviderBlock: "provider",
}
_EVENT_TAGS: dict[type[Any], str] = {
    MessageStart: "message_start",
    TextDelta: "text_delta",
    ThinkingDelta: "thinking_delta",
    ThinkingComplete: "thinking_complete",
    ProviderBlockComplete: "provider_block_complete",
    ToolCallStart: "tool_call_start",
    ToolCallInputDelta: "tool_call_input_delta",
    ToolCallComplete: "tool_call_complete",
    Usage: "usage",
    MessageStop: "message_stop",
    StreamError: "error",
    Aborted: "aborted",
}

#: The events whose ``provider`` (which provider of a fallback list answered or failed) is left out when empty.
_NAMED_PROVIDER: frozenset[type[Any]] = frozenset({MessageStart, StreamError})

converter = cattrs.Converter(forbid_extra_keys=True)
_flat = cattrs.Converter()  # unstructures one flat block or event; the tag is added around it
_flat.register_unstructure_hook(ProtocolErrorCode, lambda v: v.value)
_flat.register_unstructure_hook(StopReason, lambda v: v.value)
converter.register_structure_hook(ProtocolErrorCode, lambda v, _: ProtocolErrorCode(v))
converter.register_structure_hook(StopReason, lambda v, _: StopReason(v))
converter.register_structure_hook(Any, lambda v, _: v)


def _tagged(tags: dict[type[Any], str]) -> tuple[Any, Any]:
    by_tag = {tag: cls for cls, tag in tags.items()}

    def unstructure(value: Any) -> dict[str, Any]:
        data: dict[str, Any] = _flat.unstructure(value)
        if type(value) in _NAMED_PROVIDER and not data.get("provider"):
            del data["provider"]  # written only when set: a single provider's events read as they always did
        return {"type": tags[type(value)], **data}

    def structure(value: Any, _: Any) -> Any:
        if not isinstance(value, Mapping) or not isinstance(value.get("type"), str):
            raise SerializationError("expected an object with a string 'type'")
        cls = by_tag.get(value["type"])
        if cls is None:
            raise SerializationError(f"unknown type {value['type']!r}")
        if cls is ProviderBlock:
            return _structure_provider_block(value, None)
        fields = {k: v for k, v in value.items() if k != "type"}
        return converter.structure(fields, cls)

    return unstructure, structure


_unstructure_block, _structure_block = _tagged(_BLOCK_TAGS)
_unstructure_event, _structure_event = _tagged(_EVENT_TAGS)
for _cls in _BLOCK_TAGS:
    converter.register_unstructure_hook(_cls, _unstructure_block)
converter.register_structure_hook(ContentBlock, _structure_block)
_plain = cattrs.Converter()  # a block nested in an event, tagged like a message's blocks
for _cls in (ThinkingBlock, RedactedThinkingBlock, ProviderBlock):
    _flat.register_unstructure_hook(_cls, lambda v: {"type": _BLOCK_TAGS[type(v)], **_plain.unstructure(v)})
converter.register_structure_hook(ThinkingBlock | RedactedThinkingBlock, _structure_block)


_leaf = cattrs.Converter(forbid_extra_keys=True)


def _structure_provider_block(value: Any, _: Any) -> ProviderBlock:
    # Its own hook (a field typed ProviderBlock would otherwise be structured untagged), so the leaf
    # converter, not this one, builds the instance.
    if not isinstance(value, Mapping) or value.get("type") != _BLOCK_TAGS[ProviderBlock]:
        raise SerializationError("expected a provider block")
    return _leaf.structure({k: v for k, v in value.items() if k != "type"}, ProviderBlock)


converter.register_structure_hook(ProviderBlock, _structure_provider_block)
for _cls in _EVENT_TAGS:
    converter.register_unstructure_hook(_cls, _unstructure_event)
converter.register_structure_hook(StreamEvent, _structure_event)


def _wrap(fn: Any, value: Any) -> Any:
    try:
        return fn(value)
    except SerializationError:
        raise
    except Exception as exc:  # cattrs/attrs raise many types; callers get one
        raise SerializationError(f"invalid value: {exc}") from None


def message_to_json(message: Message) -> dict[str, Any]:
    result: dict[str, Any] = converter.unstructure(message)
    return result


def message_from_json(value: Any) -> Message:
    return _wrap(lambda v: converter.structure(v, Message), value)  # type: ignore[no-any-return]


def messages_to_json(messages: tuple[Message, ...] | list[Message]) -> list[dict[str, Any]]:
    return [message_to_json(m) for m in messages]


def messages_from_json(value: Any) -> tuple[Message, ...]:
    if not isinstance(value, list):
        raise SerializationError("expected a list of messages")
    return tuple(message_from_json(v) for v in value)


def event_to_json(event: StreamEvent) -> dict[str, Any]:
    result: dict[str, Any] = converter.unstructure(event)
    return result


def event_from_json(value: Any) -> StreamEvent:
    return _wrap(lambda v: _structure_event(v, None), value)  # type: ignore[no-any-return]
