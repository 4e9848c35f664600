"""One connection to an MCP server: its state, its transport, and the server's stderr in the log.

The transport is a stdio process (trioloop's own, `trioloop.mcp._stdio`: linear in a message's size, capped) or
streamable HTTP (its header values masked in every log line), with a watch on its read stream so a server that went
away, or that the transport gave up on, is noticed between calls; the server's stderr and any stdout line that is
not JSON-RPC go to the ``trioloop.mcp`` logger.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import Any, Final, Self, TextIO, TypeVar, final

import anyio
import mcp_types
import trio
from mcp import Client
from mcp.client import Transport
from mcp.client._transport import ReadStream, TransportStreams, WriteStream
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.message import SessionMessage

from trioloop.machine.untrusted_text import sanitize_scalar
from trioloop.mcp._stdio import stdio_transport
from trioloop.mcp.errors import McpConnectionError
from trioloop.mcp.servers import HttpServer, McpServer
from trioloop.providers._redact import mask_key_in_logs
from trioloop.runtime.tools import ToolExecutionContext

_log = logging.getLogger("trioloop.mcp")
_R = TypeVar("_R")

__all__ = [
    "CLIENT_INFO",
    "NOTICE_TIMEOUT",
    "SETTLE_TIMEOUT",
    "Connection",
    "RequestAbandoned",
    "describe",
    "server_errlog",
    "server_transport",
    "watched",
]

_LOG_LINE_MAX: Final = 1000
_LOG_BUFFER_MAX: Final = 65_536


async def _log_stderr(server: str, stream: trio.lowlevel.FdStream) -> None:
    """Each line the server writes on stderr, as one ``trioloop.mcp`` info record, until the pipe closes."""
    buffer = b""
    async with stream:
        while chunk := await stream.receive_some(_LOG_BUFFER_MAX):
            *lines, buffer = (buffer + chunk).split(b"\n")
            if len(buffer) >= _LOG_BUFFER_MAX:
                lines.append(buffer)
                buffer = b""
            for line in lines:
                _log_server_line(server, line)
        if buffer:
            _log_server_line(server, buffer)


def _log_server_line(server: str, line: bytes) -> None:
    text = sanitize_scalar(line.decode("utf-8", "replace").rstrip("\r"), _LOG_LINE_MAX)[0]
    if text:
        _log.info("MCP server %s (stderr): %s", server, text)


def _trioloop_version() -> str:
    try:
        return importlib.metadata.version("trioloop")
    except importlib.metadata.PackageNotFoundError:  # a source tree never installed
        return "0+unknown"


#: How the host introduces itself to servers (``initialize``'s clientInfo).
CLIENT_INFO: Final = mcp_types.Implementation(name="trioloop", version=_trioloop_version())


class RequestAbandoned(Exception):
    """A request's task ended without an answer: its connection was closed under it."""


#: How long a cancelled call's ``notifications/cancelled`` may wait for the transport (the SDK's own bound for it).
NOTICE_TIMEOUT: Final = 5.0
#: How long a closing connection waits for the calls its close cut and their notices: a server that takes messages
#: has them at once, and one that stopped reading does not hold up the rest of the close.
SETTLE_TIMEOUT: Final = 1.0


class Connection:
    """One connection's state; ``client`` is set once the handshake is done."""

    client: Client

    def __init__(self, nursery: trio.Nursery | None = None) -> None:
        #: The calls in flight on this connection (each one's timeout scope -> its context), oldest first: a
        #: server request that arrives outside any call's task (a 2025 server's own JSON-RPC request) is put to
        #: the person for the oldest.
        self.running: dict[trio.CancelScope, ToolExecutionContext[Any]] = {}
        self.lost = False
        #: Why the transport gave the connection up, if it did (a message over the cap): what a call or a listing
        #: cut by the loss reports, rather than a bare "connection closed".
        self.failure: McpConnectionError | None = None
        self.scope = trio.CancelScope()
        self.closed = trio.Event()  # set once the connection's task has closed it
        #: Where requests and cancellation notices run (the toolset's nursery), each in a task of its own.
        self.nursery = nursery
        self._requests: set[trio.CancelScope] = set()
        self._notices = 0  # cancellation notices handed to a task of their own and not yet written
        self._settled = trio.lowlevel.ParkingLot()  # woken when the last call and notice are done

    def lose(self, failure: McpConnectionError | None = None) -> None:
        """Mark the connection unusable: end its in-flight calls and close it (its task unwinds); ``failure`` says
        why, when the transport gave it up."""
        self.lost = True
        self.failure = self.failure or failure
        for call in self.running:
            call.cancel()
        for request in self._requests:
            request.cancel()
        self.scope.cancel()

    def call_ended(self, watch: trio.CancelScope) -> None:
        """``watch``'s call is no longer on this connection."""
        self.running.pop(watch, None)
        if not self.running and not self._notices:
            self._settled.unpark_all()

    async def settle(self) -> None:
        """Wait, at most ``SETTLE_TIMEOUT``, until no call runs on the connection and every cancellation notice
        handed off is written (or gave up): so a call cut as the connection closes is still told to the server."""
        with trio.move_on_after(SETTLE_TIMEOUT):
            while self.running or self._notices:
                await self._settled.park()
        await trio.lowlevel.checkpoint()

    def send_notice(self, send: Callable[[SessionMessage], Awaitable[None]], notice: SessionMessage) -> None:
        """Write ``notice`` (a cancelled call's ``notifications/cancelled``) from a task of its own, shielded and
        bounded by ``NOTICE_TIMEOUT``: its caller never waits on a transport that stopped taking messages."""
        assert self.nursery is not None
        self._notices += 1
        self.nursery.start_soon(self._write_notice, send, notice, name="trioloop MCP cancellation notice")

    async def _write_notice(self, send: Callable[[SessionMessage], Awaitable[None]], notice: SessionMessage) -> None:
        try:
            with trio.move_on_after(NOTICE_TIMEOUT, shield=True) as bound:
                await send(notice)
            if bound.cancelled_caught:
                _log.warning("A cancellation notice gave up: the MCP server is not taking messages")
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass  # the transport closed first: there is no server left to tell
        finally:
            self._notices -= 1
            if not self.running and not self._notices:
                self._settled.unpark_all()

    async def request(self, work: Callable[[], Awaitable[_R]]) -> _R:
        """``work()`` (one SDK request) run in a task of its own, so the caller's wait ends when the caller's
        scope says (its timeout, Stop), whatever the SDK still does; that task is cancelled and left to end with
        the connection (its close is bounded), never waited for. `RequestAbandoned` if the connection went away.

        A tool call needs no such task: the only wait the SDK shields, its cancellation notice, is handed off by
        the connection's write stream (`send_notice`)."""
        if self.nursery is None:  # no nursery to run it in: the caller waits on the request itself
            return await work()
        scope = trio.CancelScope()
        done = trio.Event()
        answered: list[_R] = []
        failed: list[Exception] = []

        async def run() -> None:
            try:
                with scope:
                    answered.append(await work())
            except Exception as exc:
                failed.append(exc)
            finally:
                self._requests.discard(scope)
                done.set()

        self._requests.add(scope)
        self.nursery.start_soon(run, name="trioloop MCP request")
        try:
            await done.wait()
        finally:
            if not done.is_set():
                scope.cancel()  # the caller stopped waiting: the request is cancelled, in its own task
        if failed:
            raise failed[0]
        if not answered:
            raise RequestAbandoned("the connection was closed during the request")
        return answered[0]


class _WrappedStream:
    """What both of a transport's wrapped streams do alike: close the stream they wrap, as a context manager too."""

    _inner: ReadStream[SessionMessage | Exception] | WriteStream[SessionMessage]

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


@final
class _WatchedReadStream(_WrappedStream):
    """The transport's read stream, reporting its end: a server that died between calls is noticed (and
    replaced on the next call) without sending anything. Everything else is passed through."""

    def __init__(
        self,
        inner: ReadStream[SessionMessage | Exception],
        on_end: Callable[[McpConnectionError | None], None],
        server: str,
    ) -> None:
        self._inner: ReadStream[SessionMessage | Exception] = inner
        self._on_end = on_end
        self._server = server

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        try:
            item = await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._on_end(None)
            raise
        except Exception:
            self._on_end(None)  # a reader that failed is a connection that hears nothing more
            raise
        if isinstance(item, McpConnectionError):  # the transport gave the connection up (a message over the cap)
            _log.warning("%s", item)
            self._on_end(item)
            raise anyio.EndOfStream
        if isinstance(item, Exception):  # a line that is not JSON-RPC, or a transport fault: skipped by the SDK
            _log.warning("MCP server %s sent something unusable, skipped (%s)", self._server, describe(item))
        return item

    def __aiter__(self) -> _WatchedReadStream:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None


def _is_cancellation(item: SessionMessage) -> bool:
    message = item.message
    return isinstance(message, mcp_types.JSONRPCNotification) and message.method == "notifications/cancelled"


@final
class _NoticeWriteStream(_WrappedStream):
    """The transport's write stream, with each ``notifications/cancelled`` handed to a task of its own.

    The SDK writes that notice from the cancelled caller's own task, under a shield: behind a server that stopped
    reading, the caller (a call past its timeout, or Stop) would wait up to the SDK's bound for it. Handed off, the
    notice still goes out, after the request it cancels, and the caller returns at once. Every other message is
    written by its sender, as the SDK does."""

    def __init__(self, inner: WriteStream[SessionMessage], connection: Connection) -> None:
        self._inner: WriteStream[SessionMessage] = inner
        self._connection = connection

    async def send(self, item: SessionMessage, /) -> None:
        if self._connection.nursery is None or not _is_cancellation(item):
            await self._inner.send(item)
            return
        self._connection.send_notice(self._inner.send, item)
        await trio.lowlevel.cancel_shielded_checkpoint()


#: Where a remote server's header values could reach a log line: the HTTP client the SDK runs on (httpx2 and
#: httpcore2, whose debug lines show response headers) and the SDK's client modules (ours never logs a header).
#: A logger filter sees only records made on that very logger, so each is named.
_HTTP_LOGGERS: Final = (
    "httpx2",
    "httpcore2",
    "httpcore2.connection",
    "httpcore2.http11",
    "httpcore2.http2",
    "httpcore2.proxy",
    "mcp.client.streamable_http",
    "mcp.client.session",
    "mcp.client.auth.oauth2",
    "mcp.shared.session",
)


@contextlib.asynccontextmanager
async def _authorized_http(server: HttpServer) -> AsyncIterator[TransportStreams]:
    """Streamable HTTP with the server's ``headers`` and ``auth``, on a client this connection owns and closes.

    Every header value is masked in the HTTP client's and the SDK's log lines first (for ``Bearer TOKEN``, the
    token alone too), so a debug log never shows it."""
    for value in server.headers.values():
        mask_key_in_logs(value, _HTTP_LOGGERS)
        scheme, _, token = value.partition(" ")
        if token.strip() and scheme.lower() in ("bearer", "basic", "token"):
            mask_key_in_logs(token.strip(), _HTTP_LOGGERS)
    client = create_mcp_http_client(headers=dict(server.headers), auth=server.auth)
    async with client, streamable_http_client(server.url, http_client=client, terminate_on_close=True) as streams:
        yield streams


@contextlib.asynccontextmanager
async def watched(transport: Transport, connection: Connection, server: str) -> AsyncIterator[TransportStreams]:
    """``transport`` for ``connection``: its read stream watched (the connection is lost when the server can no
    longer be heard) and its cancellation notices written in tasks of their own (`_NoticeWriteStream`)."""
    async with transport as (read_stream, write_stream):
        yield _WatchedReadStream(read_stream, connection.lose, server), _NoticeWriteStream(write_stream, connection)


@contextlib.asynccontextmanager
async def server_errlog(
    server: McpServer, errlog: TextIO | None, nursery: trio.Nursery | None
) -> AsyncIterator[TextIO]:
    """Where the server's stderr goes: the app's ``errlog``, else a pipe whose lines are logged."""
    if errlog is not None:
        yield errlog
        return
    if isinstance(server, HttpServer) or nursery is None:
        with open(os.devnull, "w") as devnull:  # noqa: ASYNC230  # opening /dev/null does not block
            yield devnull
        return
    read_end, write_end = os.pipe()
    # The reader lives in the toolset's nursery and ends when the server's last copy of the pipe closes,
    # so a crashing server's last words are logged after its connection is gone.
    nursery.start_soon(_log_stderr, server.name, trio.lowlevel.FdStream(read_end))
    with open(write_end, "w", closefd=True) as pipe:  # noqa: ASYNC230  # a pipe's fd: no blocking open
        yield pipe


def server_transport(server: McpServer, errlog: TextIO) -> Transport:
    """The transport to ``server``: streamable HTTP (with its headers and auth, if any) or a stdio process whose
    stderr goes to ``errlog``."""
    transport: Transport
    if isinstance(server, HttpServer):
        transport = (
            _authorized_http(server)
            if server.headers or server.auth is not None
            else streamable_http_client(server.url, terminate_on_close=True)
        )
    else:
        transport = stdio_transport(server, errlog)  # trioloop's own: linear in a message's size, capped
    return transport


def describe(exc: BaseException) -> str:
    """An exception as one sanitized line for a message or a log (a group of one is unwrapped)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {sanitize_scalar(str(exc), 160)[0]}"
