"""A server's ``sampling/createMessage`` as a sampling card, and the model's answer as the server's result.

Only text goes to the model: an image, audio or tool block in the server's messages is named in the text
(``[an image the server attached is not sent]``), so the card shows exactly what the model will see. The
server's tools and ``includeContext`` are never honoured: the model gets no tools and no other context.
"""

from __future__ import annotations

from typing import Any, Final

import mcp_types

from trioloop.machine.questions import MAX_SAMPLING_MESSAGES, Sampled, SamplingRequest
from trioloop.mcp.elicitation import UnusableRequest

__all__ = ["REJECTED", "sampling_request", "sampling_result"]

#: The JSON-RPC error code MCP gives a request the person rejected.
REJECTED: Final = -1

_STOP: Final = {"end_turn": "endTurn", "max_tokens": "maxTokens", "stop_sequence": "stopSequence"}


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(_text(part) for part in content)
    kind = getattr(content, "type", "")
    if kind == "text":
        return str(content.text)
    if kind in ("image", "audio"):
        return f"[{'an' if kind == 'image' else 'some'} {kind} the server attached is not sent]"
    return f"[a {kind or 'non-text'} block the server attached is not sent]"


def sampling_request(params: mcp_types.CreateMessageRequestParams) -> SamplingRequest:
    """The card's and the model's view of the server's request."""
    if not params.messages or len(params.messages) > MAX_SAMPLING_MESSAGES:
        raise UnusableRequest(f"a sampling request has 1 to {MAX_SAMPLING_MESSAGES} messages")
    preferences = params.model_preferences
    hints = [h.name for h in (preferences.hints or []) if h.name] if preferences is not None else []
    system = params.system_prompt or ""
    if params.tools:
        names = ", ".join(sorted(t.name for t in params.tools))
        system += f"\n\n[The server offered tools ({names}); they are not offered to the model.]"
    return SamplingRequest(
        messages=tuple((m.role, _text(m.content)) for m in params.messages),
        system_prompt=system.strip(),
        model_hint=", ".join(hints),
        max_tokens=max(1, params.max_tokens),
    )


def sampling_result(sampled: Sampled) -> mcp_types.CreateMessageResult | mcp_types.ErrorData:
    """The server's answer: the model's text, or an error (the person declined, or the model failed)."""
    if sampled.action != "accept":
        return mcp_types.ErrorData(code=REJECTED, message=f"The person did not approve the request ({sampled.action}).")
    if sampled.error:
        return mcp_types.ErrorData(code=mcp_types.INTERNAL_ERROR, message=sampled.error)
    return mcp_types.CreateMessageResult(
        role="assistant",
        content=mcp_types.TextContent(type="text", text=sampled.text),
        model=sampled.model,
        stop_reason=_STOP.get(sampled.stop_reason, sampled.stop_reason or None),
    )
