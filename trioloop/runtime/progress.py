"""What a face shows of a live turn beside its state: each running call's last progress report, and the tool call
whose input the model is writing now. Neither is part of the state: both are gone when the call or the input is.
"""

from __future__ import annotations

from trioloop.protocol.events import StreamEvent, ThinkingDelta, ToolCallInputDelta, ToolCallStart

__all__ = ["CallProgress"]


class CallProgress:
    """Each running call's last progress report, and the streaming tool call input."""

    def __init__(self) -> None:
        #: Call id -> (progress, total or None, message), from ``ToolExecutionContext.report_progress``. A call's
        #: entry goes when it settles.
        self.calls: dict[str, tuple[float, float | None, str]] = {}
        #: The tool call whose input is streaming now (its tool's name and the input's length so far); None
        #: between calls.
        self.input_streaming: tuple[str, int] | None = None

    def report(self, call_id: str, progress: float, total: float | None, message: str) -> None:
        """``call_id`` said how far it has got."""
        self.calls[call_id] = (progress, total, message)

    def follow(self, event: StreamEvent) -> None:
        """Follow a tool call's input as it streams (`input_streaming`); anything else ends it."""
        cls = type(event)
        if cls is ToolCallInputDelta:
            current = self.input_streaming
            if current is not None:
                self.input_streaming = (current[0], current[1] + len(event.partial_json))  # type: ignore[union-attr]
        elif cls is ToolCallStart:
            self.input_streaming = (event.name, 0)  # type: ignore[union-attr]
        elif self.input_streaming is not None and cls is not ThinkingDelta:
            self.input_streaming = None
