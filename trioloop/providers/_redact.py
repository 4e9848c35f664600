"""Keeping the literal API key out of every event, even when a hostile endpoint echoes it back.

Whole fields (ids, names, the model name, parsed tool input) are scrubbed by replacement. Streamed text
and argument fragments need more care: the key may be split across deltas, and the consumer joins
them. ``StreamRedactor`` holds back a tail that could be the start of the key and replaces any
occurrence it completes, so the joined output never contains the key. At most the key's first
``MIN_HOLD - 1`` characters (its public prefix, e.g. ``sk-``) can precede the marker.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import Any, Final, final

import attrs

from trioloop.protocol.events import (
    MessageStart,
    ProviderBlockComplete,
    StreamEvent,
    TextDelta,
    ThinkingComplete,
    ThinkingDelta,
    ToolCallComplete,
    ToolCallInputDelta,
    ToolCallStart,
)
from trioloop.protocol.messages import RedactedThinkingBlock, ThinkingBlock
from trioloop.providers.base import compact_json

__all__ = [
    "MASKED_LOGGERS",
    "MIN_HOLD",
    "REDACTED",
    "EventScrubber",
    "KeyLogFilter",
    "StreamRedactor",
    "mask_key_in_logs",
    "scrub_json",
]

REDACTED: Final = "[redacted-key]"
MIN_HOLD: Final = 4


def scrub_json(value: Any, key: str) -> Any:
    """``value`` with ``key`` replaced in every string, object keys included."""
    if isinstance(value, str):
        return value.replace(key, REDACTED) if key in value else value
    if isinstance(value, list):
        return [scrub_json(item, key) for item in value]
    if isinstance(value, dict):
        return {scrub_json(k, key): scrub_json(v, key) for k, v in value.items()}
    return value


@final
class StreamRedactor:
    """Redacts ``key`` from one stream of text fragments; ``push`` each fragment, ``flush`` at its end."""

    __slots__ = ("_hold_from", "_keep", "_key", "_pending", "_probe", "_tail")

    def __init__(self, key: str) -> None:
        self._key = key
        self._hold_from = max(1, min(MIN_HOLD, len(key) - 1))
        self._probe = key[: self._hold_from]  # every occurrence of the key, and every held start, contains it
        self._keep = len(key) - 1
        self._pending = ""  # received, not yet released: it may be the start of the key
        self._tail = ""  # the last len(key) - 1 released characters

    def push(self, text: str) -> str:
        """The part of ``text`` (plus anything held before) that is safe to release now."""
        if not self._pending and self._keep > 1:
            # The common case, one C-level search: with nothing held and the key's first characters nowhere
            # in the released tail and the new text, nothing can be replaced or held: all of it goes out.
            joined = self._tail + text
            if self._probe not in joined:
                self._tail = joined[-self._keep :]
                return text
        return self._push(text)

    def _push(self, text: str) -> str:
        key, n = self._key, len(self._key)
        tail = self._tail
        virtual = tail + self._pending + text
        cursor = len(tail)
        parts: list[str] = []
        found = virtual.find(key)
        while found != -1:
            # An occurrence can start inside the released tail (it was shorter than the hold threshold
            # there); only its unreleased part can still be replaced.
            parts.append(virtual[cursor : max(found, cursor)])
            parts.append(REDACTED)
            cursor = found + n
            found = virtual.find(key, cursor)
        parts.append(virtual[cursor:])
        redacted = "".join(parts)
        # A possible key start may begin in the released tail: measure it over tail + redacted text.
        hold = min(self._held_suffix(tail + redacted), len(redacted))
        release = redacted[: len(redacted) - hold]
        self._pending = redacted[len(redacted) - hold :]
        self._tail = (tail + release)[-(n - 1) :] if n > 1 else ""
        return release

    @property
    def holding(self) -> bool:
        """Whether text is held back (it may be the start of the key) until the next ``push`` or ``flush``."""
        return bool(self._pending)

    def flush(self) -> str:
        """Release what is held; the stream of fragments has ended."""
        if not self._pending:
            return ""
        release, self._pending = self._pending, ""
        if len(self._key) > 1:
            self._tail = (self._tail + release)[-(len(self._key) - 1) :]
        return release

    def _held_suffix(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of the key, if ``MIN_HOLD`` long."""
        key = self._key
        if len(key) <= 1:
            return 0
        start = self._hold_from
        probe = key[:start]
        position = text.find(probe, max(0, len(text) - (len(key) - 1)))
        while position != -1:
            if key.startswith(text[position:]):
                return len(text) - position
            position = text.find(probe, position + 1)
        return 0


@final
@attrs.define
class EventScrubber:
    """Applies the key redaction to a provider's event stream, in order, without losing content."""

    key: str
    _text: StreamRedactor = attrs.field(init=False)
    _thinking: StreamRedactor = attrs.field(init=False)
    _arguments: StreamRedactor = attrs.field(init=False)
    _arguments_id: str | None = attrs.field(init=False, default=None)
    # Whether the thinking or the argument redactor holds text back, which a text delta must not overtake; kept
    # here, set where either is pushed or flushed, so the common text delta reads one field (it is per event).
    _held_beside_text: bool = attrs.field(init=False, default=False)

    def __attrs_post_init__(self) -> None:
        self._text = StreamRedactor(self.key)
        self._thinking = StreamRedactor(self.key)
        self._arguments = StreamRedactor(self.key)

    def _clean(self, text: str) -> str:
        return text.replace(self.key, REDACTED) if self.key in text else text

    def process(self, event: StreamEvent) -> list[StreamEvent]:
        """``event`` made safe, preceded by any held text it must not overtake (possibly none at all)."""
        if type(event) is TextDelta and not self._held_beside_text:
            # The common case: nothing of another stream held, so nothing to flush before this text.
            text = self._text.push(event.text)
            if text is event.text:
                return [event]  # nothing held or replaced: the event itself, not a copy
            return [TextDelta(text=text)] if text else []
        if isinstance(event, TextDelta):
            out = self._flush_arguments() + self._flush_thinking()
            self._held_beside_text = False
            text = self._text.push(event.text)
            if text is event.text and not out:
                return [event]  # nothing held or replaced: the event itself, not a copy
            return [*out, TextDelta(text=text)] if text else out
        if isinstance(event, ThinkingDelta):
            out = self._flush_text() + self._flush_arguments()
            text = self._thinking.push(event.text)
            self._held_beside_text = self._thinking.holding
            return [*out, ThinkingDelta(text=text)] if text else out
        if isinstance(event, ToolCallInputDelta):
            call_id = self._clean(event.id)
            out = self._flush_text() + self._flush_thinking()
            if self._arguments_id != call_id:
                out += self._flush_arguments()
                self._arguments_id = call_id
            fragment = self._arguments.push(event.partial_json)
            self._held_beside_text = self._arguments.holding
            return [*out, ToolCallInputDelta(id=call_id, partial_json=fragment)] if fragment else out
        out = self._flush_text() + self._flush_thinking() + self._flush_arguments()
        self._held_beside_text = False
        if isinstance(event, MessageStart):
            out.append(MessageStart(model=self._clean(event.model)) if self.key in event.model else event)
        elif isinstance(event, ToolCallStart):
            out.append(ToolCallStart(id=self._clean(event.id), name=self._clean(event.name)))
        elif isinstance(event, ToolCallComplete):
            error = event.input_error
            out.append(
                ToolCallComplete(
                    id=self._clean(event.id),
                    name=self._clean(event.name),
                    input=scrub_json(event.input, self.key),
                    input_error=None if error is None else self._clean(error),
                )
            )
        elif isinstance(event, ThinkingComplete):
            block = event.block
            if isinstance(block, ThinkingBlock):
                clean: ThinkingBlock | RedactedThinkingBlock = ThinkingBlock(
                    thinking=self._clean(block.thinking), signature=self._clean(block.signature), source=block.source
                )
            else:
                clean = RedactedThinkingBlock(data=self._clean(block.data))
            out.append(event if clean == block else ThinkingComplete(block=clean))
        elif isinstance(event, ProviderBlockComplete):
            out.append(self._clean_block(event))
        else:
            out.append(event)
        return out

    def _clean_block(self, event: ProviderBlockComplete) -> ProviderBlockComplete:
        """The block with the key masked in every string of its JSON (decoded, so an escaped key is found)."""
        raw = event.block.data
        try:
            value = json.loads(raw)
        except ValueError:
            return event if self.key not in raw else ProviderBlockComplete(block=attrs.evolve(event.block, data="{}"))
        clean = scrub_json(value, self.key)
        if clean == value:
            return event
        data = compact_json(clean) or "{}"
        return ProviderBlockComplete(block=attrs.evolve(event.block, data=data))

    def flush(self) -> list[StreamEvent]:
        """Everything still held, as events; call before ending the stream another way (a held-back error)."""
        self._held_beside_text = False
        return self._flush_text() + self._flush_thinking() + self._flush_arguments()

    def _flush_text(self) -> list[StreamEvent]:
        text = self._text.flush()
        return [TextDelta(text=text)] if text else []

    def _flush_thinking(self) -> list[StreamEvent]:
        text = self._thinking.flush()
        return [ThinkingDelta(text=text)] if text else []

    def _flush_arguments(self) -> list[StreamEvent]:
        fragment = self._arguments.flush()
        call_id, self._arguments_id = self._arguments_id, None
        return [ToolCallInputDelta(id=call_id, partial_json=fragment)] if fragment and call_id is not None else []


MASKED_LOGGERS: Final = (
    "httpx",
    "httpcore",
    "httpcore.connection",
    "httpcore.http11",
    "httpcore.http2",
    "httpcore.proxy",
    "httpcore.socks",
    "trioloop",
    "trioloop.providers",
)
"""Where the key could reach a log line. A logger filter sees only records made on that very logger,
so httpcore's per-module loggers are named one by one."""


@final
class KeyLogFilter(logging.Filter):
    """Masks every registered key in a record's formatted message (its args included), then lets it pass.

    With httpcore's debug logging on, a server that echoes the key in a response header would otherwise
    put it in a ``receive_response_headers`` line.
    """

    def __init__(self) -> None:
        super().__init__("trioloop-key-mask")
        self._keys: frozenset[str] = frozenset()

    def add(self, key: str) -> None:
        if key and key not in self._keys:
            self._keys = self._keys | {key}

    def filter(self, record: logging.LogRecord) -> bool:
        keys = self._keys
        if not keys:
            return True
        try:
            message = record.getMessage()
        except Exception:  # a record whose args do not format: logging reports it; nothing to mask here
            return True
        masked = message
        for key in keys:
            if key in masked:
                masked = masked.replace(key, REDACTED)
        if masked is not message:
            record.msg, record.args = masked, None
        return True


_KEY_FILTER: Final = KeyLogFilter()


_LOGGERS: Final[dict[tuple[str, ...], tuple[logging.Logger, ...]]] = {}


def mask_key_in_logs(key: str, loggers: Iterable[str] = MASKED_LOGGERS) -> None:
    """Register ``key`` with the filter on every logger in ``loggers`` (installed once each, idempotent). Run on
    every request, so a logging configuration made since (which may replace a logger's filters) is covered."""
    _KEY_FILTER.add(key)
    names = tuple(loggers)
    found = _LOGGERS.get(names)
    if found is None:  # logging.getLogger always returns the same object for a name: look them up once
        found = _LOGGERS[names] = tuple(logging.getLogger(name) for name in names)
    for logger in found:
        if _KEY_FILTER not in logger.filters:
            logger.addFilter(_KEY_FILTER)
