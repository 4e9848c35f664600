"""Provider-neutral conversation messages and the tool-call pairing check.

A message is a role plus a tuple of content blocks. Tool-call input is kept exactly as the model sent
it (raw, unvalidated JSON); only the tool runtime ever interprets it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any, Literal, TypeAlias

import attrs

__all__ = [
    "ContentBlock",
    "JsonValue",
    "Message",
    "PairingViolation",
    "PairingViolationKind",
    "ProviderBlock",
    "RedactedThinkingBlock",
    "Role",
    "TextBlock",
    "ThinkingBlock",
    "ToolCallBlock",
    "ToolResultBlock",
    "assert_tool_pairing",
    "flatten_text",
]

JsonValue: TypeAlias = Any
"""A value decoded from JSON (dict, list, str, int, float, bool or None). Never trusted."""

Role: TypeAlias = Literal["user", "assistant"]


@attrs.frozen(kw_only=True)
class TextBlock:
    """A block of plain text in a message."""

    text: str = attrs.field(validator=attrs.validators.instance_of(str))


@attrs.frozen(kw_only=True)
class ToolCallBlock:
    """A tool call the model opened; ``input`` is raw model JSON, never validated here."""

    id: str = attrs.field(validator=attrs.validators.instance_of(str))
    name: str = attrs.field(validator=attrs.validators.instance_of(str))
    input: JsonValue = None


@attrs.frozen(kw_only=True)
class ToolResultBlock:
    """The answer to one tool call, sent back to the model: its call id, the text, and whether it is an error."""

    call_id: str = attrs.field(validator=attrs.validators.instance_of(str))
    content: str = attrs.field(validator=attrs.validators.instance_of(str))
    is_error: bool = False


@attrs.frozen(kw_only=True)
class ThinkingBlock:
    """The model's visible reasoning, kept in history and sent back verbatim with its ``signature``.

    Only the model history and the UI see it; no tool receives thinking text. Anthropic's blocks carry a
    ``signature``; reasoning from an OpenAI-compatible server has none and names in ``source`` the field it
    streamed in (``reasoning_content``, ``reasoning``), so it can go back in that field where the server
    requires it (DeepSeek, Kimi). A wire sends back only the thinking it can verify: Anthropic drops
    unsigned blocks.
    """

    thinking: str = attrs.field(validator=attrs.validators.instance_of(str))
    signature: str = attrs.field(default="", validator=attrs.validators.instance_of(str))
    source: str = attrs.field(default="", validator=attrs.validators.instance_of(str))


@attrs.frozen(kw_only=True)
class RedactedThinkingBlock:
    """Reasoning the provider encrypted (``data`` is opaque); kept in history and sent back verbatim."""

    data: str = attrs.field(validator=attrs.validators.instance_of(str))


@attrs.frozen(kw_only=True)
class ProviderBlock:
    """A block only the wire it came from understands, kept in the assistant message and sent back verbatim.

    Anthropic's server-side tool blocks (``server_tool_use``, ``web_search_tool_result``, code execution,
    ``mcp_tool_use``, compaction) and the OpenAI Responses API's reasoning items (encrypted, sent back on
    the next request) are such blocks. ``wire`` names the wire (``"anthropic"``, ``"openai-responses"``),
    ``kind`` the block's own type there, and ``data`` is the block as a JSON object's text. No tool ever
    runs for one and no other wire receives it: a request to another wire leaves it out.
    """

    wire: str = attrs.field(validator=attrs.validators.instance_of(str))
    kind: str = attrs.field(validator=attrs.validators.instance_of(str))
    data: str = attrs.field(default="{}", validator=attrs.validators.instance_of(str))


ContentBlock: TypeAlias = (
    TextBlock | ToolCallBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock | ProviderBlock
)


def _to_blocks(value: Iterable[ContentBlock]) -> tuple[ContentBlock, ...]:
    return tuple(value)


@attrs.frozen(kw_only=True)
class Message:
    """One message of the conversation: a role (``user`` or ``assistant``) and its content blocks."""

    role: Role = attrs.field(validator=attrs.validators.in_(("user", "assistant")))
    content: tuple[ContentBlock, ...] = attrs.field(converter=_to_blocks, factory=tuple)

    @classmethod
    def user(cls, text: str) -> Message:
        """A user message holding ``text`` as one text block."""
        return cls(role="user", content=(TextBlock(text=text),))

    @classmethod
    def assistant(cls, text: str) -> Message:
        """An assistant message holding ``text`` as one text block."""
        return cls(role="assistant", content=(TextBlock(text=text),))


def flatten_text(message: Message) -> str:
    """The message's text blocks concatenated, without separators."""
    return "".join(b.text for b in message.content if isinstance(b, TextBlock))


class PairingViolationKind(enum.StrEnum):
    UNANSWERED_TOOL_CALL = "unanswered_tool_call"
    ORPHAN_TOOL_RESULT = "orphan_tool_result"
    DUPLICATE_TOOL_CALL_ID = "duplicate_tool_call_id"
    RESULT_BEFORE_CALL = "result_before_call"


@attrs.frozen(kw_only=True)
class PairingViolation:
    kind: PairingViolationKind
    call_id: str
    message_index: int


def assert_tool_pairing(history: Iterable[Message]) -> tuple[PairingViolation, ...]:
    """Every way ``history`` breaks call/result pairing; empty means the history is sendable.

    Despite the name it never raises: callers decide. A result must come in a strictly later message
    than its call; a result whose call appears only later is ``result_before_call``; a result with no
    call at all is ``orphan_tool_result``; a reused call id is ``duplicate_tool_call_id``; a call never
    answered is ``unanswered_tool_call`` (reported last, in first-seen order).
    """
    messages = tuple(history)
    call_index: dict[str, int] = {}
    for index, message in enumerate(messages):
        for block in message.content:
            if isinstance(block, ToolCallBlock) and block.id not in call_index:
                call_index[block.id] = index
    violations: list[PairingViolation] = []
    seen_calls: set[str] = set()
    answered: set[str] = set()
    for index, message in enumerate(messages):
        for block in message.content:
            if isinstance(block, ToolCallBlock):
                if block.id in seen_calls:
                    violations.append(
                        PairingViolation(
                            kind=PairingViolationKind.DUPLICATE_TOOL_CALL_ID,
                            call_id=block.id,
                            message_index=index,
                        )
                    )
                seen_calls.add(block.id)
            elif isinstance(block, ToolResultBlock):
                opened_at = call_index.get(block.call_id)
                if opened_at is None:
                    kind: PairingViolationKind | None = PairingViolationKind.ORPHAN_TOOL_RESULT
                elif opened_at > index:
                    kind = PairingViolationKind.RESULT_BEFORE_CALL
                elif opened_at == index or block.call_id in answered:
                    kind = PairingViolationKind.ORPHAN_TOOL_RESULT
                else:
                    kind = None
                if kind is None:
                    answered.add(block.call_id)
                else:
                    violations.append(PairingViolation(kind=kind, call_id=block.call_id, message_index=index))
    for call_id, index in call_index.items():
        if call_id not in answered:
            violations.append(
                PairingViolation(kind=PairingViolationKind.UNANSWERED_TOOL_CALL, call_id=call_id, message_index=index)
            )
    return tuple(violations)
