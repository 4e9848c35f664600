"""The turn's inbox: every decision, stream event and tool settlement reaches the reducer as one item of one
channel, consumed by one task, and the consumer as the turn's parts see it.

The channel is unbounded (a person's click or a tool's settlement never waits), and closes to the person and the
tools once the turn settles or is suspended: after that, a late decision or a late tool value is refused, not
queued to be dropped.
"""

from __future__ import annotations

import math
from typing import Protocol, TypeAlias

import attrs
import trio

from trioloop.machine.inputs import TurnInput
from trioloop.machine.state import TurnState
from trioloop.protocol.events import StreamEvent

__all__ = ["InboxItem", "RequestEnded", "StreamBatch", "StreamItem", "TurnInbox", "TurnView"]


@attrs.frozen
class RequestEnded:
    """The request task finished; ``terminal_sent`` says whether the provider sent a terminal event."""

    attempt: int
    terminal_sent: bool


@attrs.frozen
class StreamItem:
    """One stream event handed over alone (a provider that sends event by event)."""

    attempt: int
    event: StreamEvent


@attrs.frozen
class StreamBatch:
    """The events of one network read, handed over together: one inbox item, one consumer wake-up."""

    attempt: int
    events: tuple[StreamEvent, ...]


InboxItem: TypeAlias = TurnInput | StreamItem | StreamBatch | RequestEnded


class TurnInbox:
    """One turn's channel of inputs: ``sender`` for the request tasks, `put` for the person and the tools,
    ``receiver`` for the one consumer."""

    def __init__(self) -> None:
        self.sender, self.receiver = trio.open_memory_channel[InboxItem](math.inf)
        #: Whether the turn takes no more decisions or tool values (it settled, or was suspended in review).
        self.closed = False

    def put(self, item: InboxItem) -> bool:
        """Queue ``item`` for the consumer; False once the inbox is closed (the turn takes nothing more)."""
        if self.closed:
            return False
        try:
            self.sender.send_nowait(item)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            return False
        return True

    def close(self) -> None:
        """Refuse every decision and tool value from now on."""
        self.closed = True

    def end(self) -> None:
        """The turn's tasks are done: nothing is sent any more."""
        self.sender.close()


class TurnView(Protocol):
    """The one consumer as the turn's parts see it: the state it holds, the inputs it feeds itself (`apply`, for
    the effects a part performs in the consumer's own task), and `sync` (the journal made durable)."""

    @property
    def state(self) -> TurnState:
        """The turn's state now."""
        ...

    def apply(self, item: TurnInput) -> None:
        """Reduce ``item`` into the state now, in the consumer's task."""
        ...

    async def sync(self) -> None:
        """Make the journal entries made so far durable (a failed append stops the turn)."""
        ...
