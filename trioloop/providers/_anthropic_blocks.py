"""What an Anthropic Messages stream may carry, and the records its open content blocks accumulate in.

Decides which events, blocks and deltas are known (server-run blocks kept whole, request-only content refused,
which delta applies to which open block) and what each stop reason means. The helpers read the fields frames
share and apply a compaction delta (raising ``_Undecodable`` for a frame without the documented shape), and
build the marker blocks (``CALLER_MARKER``, ``CONTAINER_MARKER``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Final

import attrs

from trioloop.protocol.events import ProviderBlockComplete, StopReason, StreamEvent
from trioloop.protocol.messages import JsonValue, ProviderBlock
from trioloop.providers.base import compact_json, non_negative_int

__all__ = [
    "ANTHROPIC_BLOCK_WIRE",
    "BLOCK_NOT_JSON",
    "CALLER_MARKER",
    "CONTAINER_MARKER",
    "SERVER_BLOCKS",
    "SERVER_INPUT_UNREADABLE",
    "STOP_REASONS",
]

ANTHROPIC_BLOCK_WIRE: Final = "anthropic"
"""``ProviderBlock.wire`` of the blocks this wire keeps (and the wire's name)."""
_WIRE_NAME: Final = ANTHROPIC_BLOCK_WIRE
# Facts about a response that belong to no content block, kept as provider blocks of our own (never sent as
# content): who called a tool_use (programmatic tool calling: code running in a container called it, and
# its ``caller`` must go back on the block) and the code execution container the response ran in (the next
# request names it, so code waiting on a tool's result resumes there).
CALLER_MARKER: Final = "trioloop.caller"
CONTAINER_MARKER: Final = "trioloop.container"

STOP_REASONS: Final[Mapping[str, StopReason]] = {
    "end_turn": StopReason.END_TURN,
    "tool_use": StopReason.TOOL_USE,
    "max_tokens": StopReason.MAX_TOKENS,
    "stop_sequence": StopReason.STOP_SEQUENCE,
    "refusal": StopReason.REFUSAL,
    "pause_turn": StopReason.PAUSE_TURN,
    # The answer was cut off at the model's context window rather than at max_tokens: the same
    # truncation, reached by another ceiling (the Messages API's stop reasons, "Handling stop reasons").
    "model_context_window_exceeded": StopReason.MAX_TOKENS,
    # Sent only when a request asks for pause_after_compaction: the response holds the compaction block
    # and the docs' next step is to send it back and continue, which is exactly a paused turn.
    "compaction": StopReason.PAUSE_TURN,
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
# Blocks the server produced and runs itself (server tools, the MCP connector, container uploads,
# compaction, the fallback marker): kept whole and sent back in place, never run by us.
SERVER_BLOCKS: Final = frozenset(
    {
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "tool_search_tool_result",
        "advisor_tool_result",
        "mcp_tool_use",
        "mcp_tool_result",
        "container_upload",
        "compaction",
        "fallback",
    }
)
# Content only a request carries: one in a response is hostile, and kept it would make every later
# request of the session fail (a tool_result in an assistant message is refused).
_REQUEST_ONLY: Final = frozenset({"tool_result", "image", "document", "search_result"})
# The server blocks whose ``input`` streams as ``input_json_delta`` (the SDK tracks the same ones).
_INPUT_BLOCKS: Final = frozenset({"server_tool_use", "mcp_tool_use"})
# The open block types each documented delta applies to (the SDK ignores one sent to any other).
_DELTA_TARGETS: Final[Mapping[str, frozenset[str]]] = {
    "text_delta": frozenset({"text"}),
    "citations_delta": frozenset({"text"}),
    "thinking_delta": frozenset({"thinking"}),
    "signature_delta": frozenset({"thinking"}),
    "input_json_delta": frozenset({"tool_use", *_INPUT_BLOCKS}),
    "compaction_delta": frozenset({"compaction"}),
}
SERVER_INPUT_UNREADABLE: Final = (
    "The AI provider sent a server tool's input that could not be read; the block was kept with its first input."
)
BLOCK_NOT_JSON: Final = "The AI provider sent a block that cannot be sent back as JSON; it was left out."


class _Undecodable(Exception):
    """A frame whose JSON does not have the documented shape."""


@attrs.define
class _OpenText:
    """A text block: its text streams straight out; citations are not kept (text goes back without them)."""

    kind: ClassVar[str] = "text"


@attrs.define
class _OpenCall:
    """A tool_use of ours. ``start`` is the input its start carried (the input unless a fragment follows)."""

    kind: ClassVar[str] = "tool_use"
    id: str
    name: str
    start: JsonValue = None
    start_error: str | None = None
    fragments: list[str] = attrs.field(factory=list)
    caller: JsonValue = None  # a dict when code in a container called it (programmatic tool calling)


@attrs.define
class _OpenThinking:
    kind: ClassVar[str] = "thinking"
    parts: list[str] = attrs.field(factory=list)
    signature: str = ""


@attrs.define
class _OpenServer:
    """A block only the Anthropic wire understands, accumulated as the SDK does until it stops.

    ``known`` is false for a type this mapper was not written for; ``stale`` is set when such a block
    received a delta this mapper cannot apply, so the copy held is no longer the server's block.
    """

    block: dict[str, Any]
    known: bool
    fragments: list[str] = attrs.field(factory=list)
    stale: bool = False

    @property
    def kind(self) -> str:
        return str(self.block["type"])


_OpenBlock = _OpenText | _OpenCall | _OpenThinking | _OpenServer


_TRANSIENT_ERRORS: Final = frozenset({"overloaded_error", "api_error"})


def _input_tokens(usage: Mapping[str, Any]) -> int | None:
    """Billed prompt tokens: fresh input plus cache writes and reads (OpenAI's prompt_tokens counts all three)."""
    base = non_negative_int(usage.get("input_tokens"))
    if base is None:
        return None
    extra = (non_negative_int(usage.get(k)) or 0 for k in ("cache_creation_input_tokens", "cache_read_input_tokens"))
    return base + sum(extra)


def _index(payload: Mapping[str, Any]) -> int:
    index = non_negative_int(payload.get("index"))
    if index is None:
        raise _Undecodable
    return index


def _marker(kind: str, value: Mapping[str, Any], out: list[StreamEvent]) -> None:
    data = compact_json(value)
    if data is not None:
        out.append(ProviderBlockComplete(block=ProviderBlock(wire=_WIRE_NAME, kind=kind, data=data)))


def _compaction_delta(block: _OpenServer, delta: Mapping[str, Any]) -> None:
    """The summary arrives whole in one delta and replaces the block's ``content``, as in the SDK.

    ``encrypted_content`` is opaque state the docs say to send back verbatim, so a delta's is kept too.
    """
    content, encrypted = delta.get("content"), delta.get("encrypted_content")
    if not (content is None or isinstance(content, str)) or not (encrypted is None or isinstance(encrypted, str)):
        raise _Undecodable
    block.block["content"] = content
    if encrypted is not None:
        block.block["encrypted_content"] = encrypted
