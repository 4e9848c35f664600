"""Which httpx client carries a streamed request, and how long the clients a provider holds live.

Decides the client options for streamed answers (connect and write bounds, no total read bound, no redirects),
the pool limits of a held provider's clients, which of them (and which kept connection) the next request
takes, and when another client opens beside the busy ones.
"""

from __future__ import annotations

import os
import ssl
from typing import Any, Final, final

import httpx
import trio

__all__ = ["HELD_POOL_LIMITS", "HELD_STREAMS_PER_CLIENT"]

_CLOSE_GRACE: Final = 5.0
#: The pool of each client a provider holds (``async with provider``, or every `Session` using it). Unbounded:
#: a client never makes a stream wait for a connection. An idle connection closes after 4 s: before uvicorn's
#: default 5 s keep-alive (vLLM and many OpenAI-compatible servers) closes it from the other end, which would race
#: a request sent on it. An app that passes its own ``client=`` sets its own limits
#: (``httpx.Limits(max_connections=None, max_keepalive_connections=None)``).
HELD_POOL_LIMITS: Final = httpx.Limits(max_connections=None, max_keepalive_connections=None, keepalive_expiry=4.0)
#: Streams one held client carries at once: one, so N sessions streaming at once through one provider use N
#: clients of one connection each (sharing one TLS context). httpcore 1.0 serves a pool badly under concurrent
#: requests: it hands every request that starts before the first has run the same idle connection, all but
#: one fail and try again on the next scheduler pass, so a burst of k requests on one pool takes k passes (on a
#: busy loop, long enough for idle connections to reach their keep-alive expiry and reconnect); and it walks
#: every connection of the pool for every connection whenever a request starts or ends. A pool of one stream
#: has neither cost.
HELD_STREAMS_PER_CLIENT: Final = 1


#: httpx's default TLS context by the environment it was made under (``SSL_CERT_FILE``, ``SSL_CERT_DIR``).
_TLS: dict[tuple[str | None, str | None], ssl.SSLContext] = {}


def shared_tls() -> ssl.SSLContext:
    """The TLS context httpx would make for a client (certifi's roots, or the file or folder ``SSL_CERT_FILE`` /
    ``SSL_CERT_DIR`` names), made once per value of those variables and shared by every client trioloop's
    providers make: making one loads the roots, about 20 ms of CPU, which a request outside a held provider, and
    every hold, paid again. An `ssl.SSLContext` is safe to share between connections and threads."""
    key = (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    context = _TLS.get(key)
    if context is None:
        context = _TLS[key] = httpx.create_ssl_context()
    return context


def _streaming_client(**options: Any) -> httpx.AsyncClient:
    """A client for streamed answers: 30 s to connect and write, no total read bound (the transport's own
    read gap bounds the silence), redirects refused, the shared TLS context unless ``verify`` says otherwise."""
    options.setdefault("verify", shared_tls())
    return httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=None), follow_redirects=False, **options)


@final
class _HeldClients:
    """The clients a held provider streams through; they close together when the hold ends.

    Each client has `HELD_STREAMS_PER_CLIENT` places for streams. A free place is either one a stream left with
    its connection kept (idle in the client's pool) or one without a connection. The next request takes the
    place a stream left last with its connection kept (its connection is the last to reach its keep-alive
    expiry), else a place without one (a new connection there), else a new client's.
    """

    __slots__ = ("_idle", "_room", "_tls", "busy", "clients")

    def __init__(self) -> None:
        self._tls = shared_tls()
        self.clients: list[httpx.AsyncClient] = []
        #: Streams each client carries now.
        self.busy: list[int] = []
        self._idle: list[int] = []  # a client index per free place with a kept connection, the newest last
        self._room: list[int] = []  # a client index per free place without one
        self._open()

    def _open(self) -> None:
        self._room += [len(self.clients)] * HELD_STREAMS_PER_CLIENT
        self.clients.append(_streaming_client(limits=HELD_POOL_LIMITS, verify=self._tls))
        self.busy.append(0)

    def take(self) -> int:
        """The index of the client the next request goes through, counted busy until `give` returns it."""
        if self._idle:
            index = self._idle.pop()
        else:
            if not self._room:
                self._open()
            index = self._room.pop()
        self.busy[index] += 1
        return index

    def give(self, index: int, reusable: bool) -> None:
        """Client ``index`` carries one stream less; ``reusable`` when its connection went back to the pool."""
        self.busy[index] -= 1
        (self._idle if reusable else self._room).append(index)

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(_CLOSE_GRACE):
            for client in self.clients:
                await client.aclose()
