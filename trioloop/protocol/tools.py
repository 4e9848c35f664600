"""What a model is told about a tool, and the neutral request every provider builds from."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal, TypeAlias

import attrs

from trioloop.protocol.messages import Message

__all__ = ["ChatRequest", "ToolChoice", "ToolDefinition"]

#: Whether the model may answer in text (``"auto"``, every provider's default) or must call one of the request's
#: tools (``"required"``: Anthropic ``{"type": "any"}``, OpenAI ``"required"``).
ToolChoice: TypeAlias = Literal["auto", "required"]


def _freeze_schema(value: Mapping[str, Any]) -> Mapping[str, Any]:
    return dict(value)


@attrs.frozen(kw_only=True)
class ToolDefinition:
    """A tool as the model sees it: name, description and the JSON schema of its input."""

    name: str
    description: str
    json_schema: Mapping[str, Any] = attrs.field(converter=_freeze_schema, eq=False, hash=False)


def _messages(value: Iterable[Message]) -> tuple[Message, ...]:
    return tuple(value)


def _tools(value: Iterable[ToolDefinition]) -> tuple[ToolDefinition, ...]:
    return tuple(value)


@attrs.frozen(kw_only=True)
class ChatRequest:
    """One provider request, in no provider's shape; the mappers translate it.

    ``caller_retries`` says the sender retries transient failures itself and counts them in its own
    budget (a turn does, against ``TurnLimits.max_retries_per_turn``): a provider then makes one attempt
    and reports a failure, with the server's ``retry-after`` hint, instead of retrying on its own, so
    one counter bounds the requests a turn sends.

    ``tool_choice`` ``"required"`` asks the model to call one of ``tools`` (a typed answer's final tool among
    them); ``"auto"``, the default, sends no tool choice at all, so the request is what it always was.
    """

    model: str
    system: str = ""
    messages: tuple[Message, ...] = attrs.field(converter=_messages, factory=tuple)
    tools: tuple[ToolDefinition, ...] = attrs.field(converter=_tools, factory=tuple)
    max_tokens: int = 4096
    caller_retries: bool = False
    tool_choice: ToolChoice = attrs.field(default="auto", validator=attrs.validators.in_(("auto", "required")))
