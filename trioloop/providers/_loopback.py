"""A small HTTP/1.1 server on 127.0.0.1 (trio sockets + h11) that replays prepared responses.

It exists so the scripted provider and the tests drive the real transport, SSE decoder and mapper
over a real socket. Every response can be cut into chunks, paced, stalled, truncated or broken off,
and carry any status and headers (redirects included). By default one request per connection (the
server answers ``Connection: close``); with ``keep_alive=True`` a connection serves request after
request, as a real API does, and ``LoopbackServer.connections`` counts the TCP connections accepted.
"""

from __future__ import annotations

import inspect
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Final, TypeAlias, final

import attrs
import h11
import trio

from trioloop.protocol.messages import JsonValue

__all__ = [
    "SSE_HEADERS",
    "LoopbackHandler",
    "LoopbackRequest",
    "LoopbackResponse",
    "LoopbackServer",
    "open_loopback_server",
    "replay",
]

_RECEIVE_SIZE: Final = 65536
SSE_HEADERS: Final = (("content-type", "text/event-stream"), ("cache-control", "no-cache"))


def _headers(value: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    return tuple((str(k), str(v)) for k, v in value)


@final
@attrs.frozen(kw_only=True)
class LoopbackRequest:
    """One request as the server received it (header names lower-cased)."""

    method: str
    target: str
    headers: tuple[tuple[str, str], ...]
    body: bytes

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (case-insensitive), or None."""
        wanted = name.lower()
        return next((v for k, v in self.headers if k == wanted), None)

    def json(self) -> JsonValue:
        """The body parsed as JSON (raises ``ValueError`` when it is not)."""
        return json.loads(self.body)


@final
@attrs.frozen(kw_only=True)
class LoopbackResponse:
    """What to answer and how to deliver it.

    ``chunks`` (or ``body`` cut every ``chunk_size`` bytes) are written one HTTP chunk each, with
    ``delay_between_chunks`` seconds between them. ``stall_after_bytes`` sends that many body bytes and
    then goes silent until the client hangs up; ``disconnect_after_bytes`` sends that many and closes the
    socket mid-body. ``content_length`` uses a Content-Length header instead of chunked framing.
    """

    status: int = 200
    headers: tuple[tuple[str, str], ...] = attrs.field(default=SSE_HEADERS, converter=_headers)
    body: bytes = b""
    chunks: tuple[bytes, ...] | None = None
    chunk_size: int | None = None
    delay_between_chunks: float = 0.0
    stall_after_bytes: int | None = None
    disconnect_after_bytes: int | None = None
    content_length: bool = False

    def pieces(self) -> list[bytes]:
        """The body as the chunks it will be written in."""
        if self.chunks is not None:
            return [c for c in self.chunks if c]
        if self.chunk_size is None or self.chunk_size <= 0:
            return [self.body] if self.body else []
        size = self.chunk_size
        return [self.body[i : i + size] for i in range(0, len(self.body), size)]


LoopbackHandler: TypeAlias = Callable[[LoopbackRequest], "LoopbackResponse | Awaitable[LoopbackResponse]"]


#: What a replaying server answers to a models list (``GET .../models``), the check a client makes first.
MODELS_LIST: Final = LoopbackResponse(
    status=200, headers=(("content-type", "application/json"),), body=b'{"object":"list","data":[]}'
)


def replay(responses: Iterable[LoopbackResponse], *, fallback: LoopbackResponse | None = None) -> LoopbackHandler:
    """A handler answering requests with ``responses`` in order, then ``fallback`` (default: a 500). A models
    list (``GET`` of a path ending in ``/models``) is answered with an empty list and takes none of them."""
    queue = list(responses)
    last = fallback or LoopbackResponse(status=500, headers=(("content-type", "text/plain"),), body=b"no response left")

    def handler(request: LoopbackRequest) -> LoopbackResponse:
        if request.method == "GET" and request.target.split("?", 1)[0].endswith("/models"):
            return MODELS_LIST
        return queue.pop(0) if queue else last

    return handler


@final
class LoopbackServer:
    """A running server: its ``url`` and every request it has received, in order."""

    def __init__(self, handler: LoopbackHandler, port: int, *, keep_alive: bool = False) -> None:
        self._handler = handler
        self._keep_alive = keep_alive
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.requests: list[LoopbackRequest] = []
        self.connections = 0

    def __repr__(self) -> str:
        return f"LoopbackServer(url={self.url!r}, requests={len(self.requests)})"

    async def serve(self, listener: trio.SocketListener) -> None:
        async with trio.open_nursery() as nursery:
            while True:
                stream = await listener.accept()
                self.connections += 1
                nursery.start_soon(self._connection, stream)

    async def _connection(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                request = await self._read_request(conn, stream)
                if request is None:
                    return
                self.requests.append(request)
                answer = self._handler(request)
                response = await answer if inspect.isawaitable(answer) else answer
                await self._write_response(conn, stream, response)
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            pass
        finally:
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def _read_request(self, conn: h11.Connection, stream: trio.SocketStream) -> LoopbackRequest | None:
        head: h11.Request | None = None
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some(_RECEIVE_SIZE))
            elif isinstance(event, h11.Request):
                head = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage) and head is not None:
                return LoopbackRequest(
                    method=head.method.decode("ascii"),
                    target=head.target.decode("ascii"),
                    headers=tuple((k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in head.headers),
                    body=bytes(body),
                )
            else:
                return None

    async def _write_response(
        self, conn: h11.Connection, stream: trio.SocketStream, response: LoopbackResponse
    ) -> None:
        pieces = response.pieces()
        headers = [(k, v) for k, v in response.headers if k.lower() not in ("connection", "content-length")]
        if not self._keep_alive:
            headers.append(("connection", "close"))
        if response.content_length:
            headers.append(("content-length", str(sum(len(p) for p in pieces))))
        await stream.send_all(conn.send(h11.Response(status_code=response.status, headers=headers)))
        cut = min(
            (n for n in (response.stall_after_bytes, response.disconnect_after_bytes) if n is not None),
            default=None,
        )
        sent = 0
        for number, piece in enumerate(pieces):
            if number and response.delay_between_chunks > 0:
                await trio.sleep(response.delay_between_chunks)
            if cut is not None and sent + len(piece) >= cut:
                piece = piece[: cut - sent]
            if piece:
                data = conn.send(h11.Data(data=piece))
                assert data is not None
                await stream.send_all(data)
                sent += len(piece)
            if cut is not None and sent >= cut:
                break
        if response.stall_after_bytes is not None and response.stall_after_bytes == cut:
            # Silent until the client hangs up; then the connection ends (mid-body: not reused).
            while await stream.receive_some(_RECEIVE_SIZE):
                pass
            return
        if response.disconnect_after_bytes is not None:
            return
        ending = conn.send(h11.EndOfMessage())
        assert ending is not None
        await stream.send_all(ending)


@asynccontextmanager
async def open_loopback_server(handler: LoopbackHandler, *, keep_alive: bool = False) -> AsyncIterator[LoopbackServer]:
    """Serve ``handler`` on an ephemeral 127.0.0.1 port until the block exits (see the module for ``keep_alive``)."""
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    await sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    listener = trio.SocketListener(sock)
    server = LoopbackServer(handler, sock.getsockname()[1], keep_alive=keep_alive)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.serve, listener)
            yield server
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await listener.aclose()
