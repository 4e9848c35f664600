"""The contract every model provider meets: one neutral request in, stream events out.

It lives with the vocabulary (not in ``trioloop.providers``) so the loop depends only on this contract,
and an app can bring its own provider without importing any of the shipped ones.
"""

from __future__ import annotations

from typing import Protocol

import trio

from trioloop.protocol.events import StreamEvent
from trioloop.protocol.tools import ChatRequest

__all__ = ["ChatProvider"]


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
    ) -> None: ...
