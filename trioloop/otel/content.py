"""What users wrote, as the spans carry it with ``capture_content=True`` only: messages in the GenAI
conventions' JSON form (role and parts), and a call's summary, arguments, edits and result.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from trioloop.machine.reducer import CallRecord, TurnState
from trioloop.otel.conventions import _Attrs
from trioloop.protocol.messages import (
    Message,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
    ToolResultBlock,
)


def _call_content(call: CallRecord, state: TurnState) -> _Attrs:
    content: _Attrs = {"trioloop.call.summary": call.summary}
    for message in state.turn_messages:
        for block in message.content:
            if isinstance(block, ToolCallBlock) and block.id == call.id:
                content["gen_ai.tool.call.arguments"] = _json(block.input)
    if call.edits:
        content["trioloop.call.edits"] = _json([list(edit) for edit in call.edits])
    if call.result is not None:
        content["gen_ai.tool.call.result"] = call.result
    return content


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _messages_json(messages: Iterable[Message]) -> str:
    """Messages in the GenAI conventions' JSON form (role and parts)."""
    return _json([_message_parts(message) for message in messages])


def _message_parts(message: Message) -> Mapping[str, Any]:
    parts: list[Mapping[str, Any]] = []
    for block in message.content:
        if isinstance(block, TextBlock):
            parts.append({"type": "text", "content": block.text})
        elif isinstance(block, ToolCallBlock):
            parts.append({"type": "tool_call", "id": block.id, "name": block.name, "arguments": block.input})
        elif isinstance(block, ToolResultBlock):
            parts.append({"type": "tool_call_response", "id": block.call_id, "response": block.content})
        elif isinstance(block, ThinkingBlock):
            parts.append({"type": "reasoning", "content": block.thinking})
        elif isinstance(block, RedactedThinkingBlock):
            parts.append({"type": "redacted_reasoning"})
        else:
            parts.append({"type": block.kind})
    results_only = bool(parts) and all(isinstance(block, ToolResultBlock) for block in message.content)
    return {"role": "tool" if results_only else message.role, "parts": parts}
