"""Which httpx client carries a streamed request, and how long the clients a provider holds live.

Decides the client options for streamed answers (connect and write bounds, no total read bound, no redirects),
the pool limits of a held provider's clients, and when another client opens beside the busy ones.
"""

from __future__ import annotations

from typing import Any, Final, final

import httpx
import trio

__all__ = ["HELD_POOL_LIMITS", "HELD_STREAMS_PER_CLIENT"]

_CLOSE_GRACE: Final = 5.0
#: The pool of each client a provider holds (``async with provider``, or every `Session` using it). A streamed
#: answer keeps its HTTP/1.1 connection until it ends, so N sessions streaming at once need N connections:
#: httpx's default pool (at most 100, 20 kept alive) makes the 101st wait for another's answer and reconnects
#: most requests past 20. Unbounded here, the pool holds as many connections as there were concurrent streams,
#: each closed after 4 idle seconds: before uvicorn's default 5 s keep-alive (vLLM and many OpenAI-compatible
#: servers) closes it from the other end, which would race a request sent on it. An app that passes its own
#: ``client=`` sets its own limits (``httpx.Limits(max_connections=None, max_keepalive_connections=None)``).
HELD_POOL_LIMITS: Final = httpx.Limits(max_connections=None, max_keepalive_connections=None, keepalive_expiry=4.0)
#: Streams one held client carries at once before the provider opens another beside it. httpcore 1.0 walks
#: every connection of a pool for every connection each time a request starts or a response closes, so one
#: pool of N connections costs O(N²) per request: 37% of the CPU at 300 sessions on one provider. Pools of
#: at most this many streams keep that walk short; they share one TLS context.
HELD_STREAMS_PER_CLIENT: Final = 32


def _streaming_client(**options: Any) -> httpx.AsyncClient:
    """A client for streamed answers: 30 s to connect and write, no total read bound (the transport's own
    read gap bounds the silence), redirects refused."""
    return httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=None), follow_redirects=False, **options)


@final
class _HeldClients:
    """The clients a held provider streams through: the least busy one takes the next request, and a new one
    opens when every one carries `HELD_STREAMS_PER_CLIENT` streams. They close together when the hold ends."""

    __slots__ = ("_tls", "busy", "clients")

    def __init__(self) -> None:
        self._tls = httpx.create_ssl_context()
        self.clients: list[httpx.AsyncClient] = []
        self.busy: list[int] = []
        self._open()

    def _open(self) -> None:
        self.clients.append(_streaming_client(limits=HELD_POOL_LIMITS, verify=self._tls))
        self.busy.append(0)

    def take(self) -> int:
        """The index of the client the next request goes through, counted busy until `give` returns it."""
        busy = self.busy
        index = min(range(len(busy)), key=busy.__getitem__)
        if busy[index] >= HELD_STREAMS_PER_CLIENT:
            self._open()
            index = len(busy) - 1
        busy[index] += 1
        return index

    def give(self, index: int) -> None:
        self.busy[index] -= 1

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(_CLOSE_GRACE):
            for client in self.clients:
                await client.aclose()
