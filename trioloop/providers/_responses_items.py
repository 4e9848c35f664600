"""What an OpenAI Responses stream may carry: the fields its events are read from, the record an open call
accumulates in, and what an unfinished or failed response means.

Each reader takes one event's JSON object and returns a field in its documented shape, or raises
``Undecodable`` (the mapper reports that event as undecodable and goes on). The stream's state (which items
are open, what was shown, the end) is the mapper's, in ``_responses_stream.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs

from trioloop.protocol.events import StopReason, Usage
from trioloop.providers.base import non_negative_int, text_or_empty

__all__ = [
    "INCOMPLETE_REASONS",
    "TRANSIENT_LABELS",
    "UNFINISHED_STATUSES",
    "OpenCall",
    "Undecodable",
    "event_item",
    "locate",
    "parts_text",
    "read_usage",
    "string_field",
]

INCOMPLETE_REASONS: Final[Mapping[str, StopReason]] = {
    "max_output_tokens": StopReason.MAX_TOKENS,
    "content_filter": StopReason.REFUSAL,
}
TRANSIENT_LABELS: Final = ("server_error", "overloaded", "api_error", "internal_error")
UNFINISHED_STATUSES: Final = frozenset({"in_progress", "incomplete"})


class Undecodable(Exception):
    """An event whose JSON does not have the documented shape."""


@attrs.define
class OpenCall:
    """A function call whose arguments are still streaming."""

    id: str
    name: str
    fragments: list[str] = attrs.field(factory=list)
    final: str | None = None  # the arguments ``function_call_arguments.done`` gave


def locate(payload: Mapping[str, Any]) -> tuple[int | None, str]:
    raw = payload.get("output_index")
    index = non_negative_int(raw)
    if raw is not None and index is None:
        raise Undecodable
    return index, text_or_empty(payload.get("item_id"))


def event_item(payload: Mapping[str, Any]) -> tuple[int | None, Mapping[str, Any]]:
    item = payload.get("item")
    if not isinstance(item, dict):
        raise Undecodable
    index, _ = locate(payload)
    return index, item


def string_field(payload: Mapping[str, Any], field: str) -> str:
    value = payload.get(field)
    if not isinstance(value, str):
        raise Undecodable
    return value


def parts_text(parts: Any, kinds: Iterable[str], separator: str = "") -> str:
    if not isinstance(parts, list):
        return ""
    wanted = tuple(kinds)
    texts = []
    for part in parts:
        if isinstance(part, dict) and part.get("type") in wanted:
            texts.append(text_or_empty(part.get("text")) or text_or_empty(part.get("refusal")))
    return separator.join(t for t in texts if t)


def read_usage(usage: Mapping[str, Any]) -> Usage:
    """Input tokens include the cached ones, output tokens the reasoning ones; both also given apart."""
    inputs, outputs = usage.get("input_tokens_details"), usage.get("output_tokens_details")
    cached = non_negative_int(inputs.get("cached_tokens")) if isinstance(inputs, dict) else None
    reasoning = non_negative_int(outputs.get("reasoning_tokens")) if isinstance(outputs, dict) else None
    return Usage(
        input_tokens=non_negative_int(usage.get("input_tokens")) or 0,
        output_tokens=non_negative_int(usage.get("output_tokens")) or 0,
        cache_read_input_tokens=cached or 0,
        reasoning_tokens=reasoning or 0,
    )
