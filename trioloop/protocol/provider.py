"""The contract every model provider meets: one neutral request in, stream events out.

It lives with the vocabulary (not in ``trioloop.providers``) so the loop depends only on this contract,
and an app can bring its own provider without importing any of the shipped ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from trioloop.protocol.events import StreamEvent
from trioloop.protocol.tools import ChatRequest

if TYPE_CHECKING:  # only the annotations name Trio: the vocabulary loads without it
    import trio

__all__ = ["BatchSendChannel", "ChatProvider", "HoldsConnections", "send_events"]


class ChatProvider(Protocol):
    """Streams one model response for ``request`` into ``send``.

    Sends zero or more events and then exactly one terminal event (``MessageStop``, a terminal
    ``StreamError`` or ``Aborted``). Expected failures never raise. ``send`` is never closed. When
    ``cancel_scope`` is given the work runs inside it, and its cancellation ends the stream with
    ``Aborted``; an outer cancellation propagates as ``Cancelled`` with no terminal event.
    """

    async def stream(
        self,
        request: ChatRequest,
        send: trio.abc.SendChannel[StreamEvent],
        *,
        cancel_scope: trio.CancelScope | None = None,
    ) -> None:
        """Send ``request`` and write its response to ``send`` as `StreamEvent` values, ending with one terminal
        event; never raise for the server's faults."""
        ...


@runtime_checkable
class HoldsConnections(Protocol):
    """A provider that keeps its connections open across requests while it is held.

    ``hold_connections()`` is an async context manager and re-entrant: holds nest, and the connections
    close when the outermost one ends. A `Session` holds its provider from ``async with session:`` to the
    end of the block, so every turn of the session shares one keep-alive connection (no new TCP connect
    or TLS handshake per iteration) even when the app never opened the provider itself.
    """

    def hold_connections(self) -> AbstractAsyncContextManager[object]: ...


class BatchSendChannel(Protocol):
    """A send channel that also takes several events at once, in order, at the cost of one send.

    The runner's channel offers it, so the events of one network read reach the turn together instead
    of one scheduler hop each. ``send_batch`` behaves as ``send`` called for each event in turn with no
    checkpoint in between: cancellation is seen before any event is delivered or not at all. It must not
    wait for the consumer (the runner's never does: its inbox is unbounded, and the consumer takes every
    batch already waiting in one wake-up): a provider's read-gap clock keeps running while it is called.
    """

    async def send_batch(self, events: Sequence[StreamEvent]) -> None: ...


async def send_events(send: trio.abc.SendChannel[StreamEvent], events: Sequence[StreamEvent]) -> None:
    """Send ``events`` in order: in one batch when ``send`` is a ``BatchSendChannel``, else one by one."""
    batch = getattr(send, "send_batch", None)
    if batch is not None:
        await batch(events)
        return
    for event in events:
        await send.send(event)
