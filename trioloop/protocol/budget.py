"""History budgeting: fit a conversation into a model's context window without breaking pairing."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence

from trioloop.protocol.errors import ProtocolError, ProtocolErrorCode
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
from trioloop.protocol.tools import ToolDefinition

__all__ = [
    "MESSAGE_OVERHEAD_TOKENS",
    "budget_messages",
    "estimate_message_tokens",
    "estimate_request_tokens",
    "estimate_text_tokens",
    "estimate_tools_tokens",
    "turn_groups",
]

MESSAGE_OVERHEAD_TOKENS = 4
CONTEXT_OVERFLOW_MESSAGE = (
    "This conversation is too long for the model's context window. "
    "Start a new conversation or shorten the latest message."
)


def estimate_text_tokens(text: str) -> int:
    return math.ceil(len(text) / 4)


def _block_chars(block: ContentBlock) -> int:
    if isinstance(block, TextBlock):
        return len(block.text)
    if isinstance(block, ThinkingBlock):
        return len(block.thinking) + len(block.signature)
    if isinstance(block, RedactedThinkingBlock | ProviderBlock):
        return len(block.data)
    if isinstance(block, ToolCallBlock):
        return len(block.name) + len(json.dumps(block.input, ensure_ascii=False, default=str))
    return len(block.content)


def estimate_message_tokens(message: Message) -> int:
    """ceil(chars / 4) plus a fixed per-message overhead."""
    chars = sum(_block_chars(b) for b in message.content)
    return math.ceil(chars / 4) + MESSAGE_OVERHEAD_TOKENS


def estimate_tools_tokens(tools: Iterable[ToolDefinition]) -> int:
    chars = 0
    for tool in tools:
        chars += len(tool.name) + len(tool.description)
        chars += len(json.dumps(tool.json_schema, sort_keys=True, separators=(",", ":")))
    return math.ceil(chars / 4)


def turn_groups(history: Sequence[Message]) -> list[tuple[Message, ...]]:
    """Split history into groups that can be dropped whole: a group closes when no call is left open."""
    groups: list[tuple[Message, ...]] = []
    current: list[Message] = []
    open_calls: set[str] = set()
    for message in history:
        current.append(message)
        for block in message.content:
            if isinstance(block, ToolCallBlock):
                open_calls.add(block.id)
            elif isinstance(block, ToolResultBlock):
                open_calls.discard(block.call_id)
        if not open_calls:
            groups.append(tuple(current))
            current = []
    if current:
        groups.append(tuple(current))
    return groups


def budget_messages(
    history: Iterable[Message],
    max_input_tokens: int,
    reserve_output_tokens: int,
    *,
    fixed_tokens: int = 0,
) -> tuple[Message, ...]:
    """The newest whole turn groups that fit in ``max_input_tokens - reserve_output_tokens - fixed_tokens``.

    Oldest groups are dropped first and never split, so a call is never separated from its result.
    Raises ``ProtocolError(context_overflow)`` when not even the newest group fits.
    """
    messages = tuple(history)
    if not messages:
        return ()
    available = max_input_tokens - reserve_output_tokens - fixed_tokens
    kept: list[tuple[Message, ...]] = []
    used = 0
    for group in reversed(turn_groups(messages)):
        cost = sum(estimate_message_tokens(m) for m in group)
        if used + cost > available:
            break
        kept.append(group)
        used += cost
    if not kept:
        raise ProtocolError(ProtocolErrorCode.CONTEXT_OVERFLOW, CONTEXT_OVERFLOW_MESSAGE)
    return tuple(m for group in reversed(kept) for m in group)


def estimate_request_tokens(system: str, messages: Iterable[Message], tools: Iterable[ToolDefinition]) -> int:
    """The preflight estimate of a request's input: its system prompt, tool schemas and every message."""
    return (
        estimate_text_tokens(system)
        + estimate_tools_tokens(tools)
        + sum(estimate_message_tokens(message) for message in messages)
    )
