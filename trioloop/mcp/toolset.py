"""An MCP server's tools for a session: connect, list, register, call, and close with the owning nursery.

``McpToolset.run`` is a task for ``nursery.start``: it connects, lists the tools, hands them back through
``task_status.started`` and then holds the connection until its nursery is cancelled. The connection's task
lives in the toolset's own nursery, a child of whatever nursery runs ``run``, so it closes with it.

A call runs in the calling tool's task under that tool's cancel scope: Stop or the turn deadline cancels it
and the SDK tells the server (``notifications/cancelled``). A server that crashes, hangs past the call
timeout, or answers with something unusable fails only that call; a lost connection (a crash, a call timeout,
a transport reader that ended) is replaced on the next call, so one bad turn does not disable the server for
the next. A server's stderr and any stdout line that is not JSON-RPC go to the ``trioloop.mcp`` logger, never
to the terminal. Closing the toolset closes each connection cleanly, shielded and bounded, so a cancellation
notice already queued still goes out and a streamable-HTTP session is ended (its DELETE).
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.metadata
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import Any, Final, Self, TextIO, TypeVar, final

import anyio
import attrs
import mcp_types
import trio
from mcp import Client, StdioServerParameters
from mcp.client import Transport
from mcp.client._transport import ReadStream, TransportStreams
from mcp.client.session import ClientRequestContext
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

from trioloop.machine.questions import QuestionRefused
from trioloop.machine.tools import RegisteredTool, ToolOutcome
from trioloop.machine.untrusted_text import sanitize_scalar
from trioloop.mcp.elicitation import UnusableRequest, elicit_result, question_parts
from trioloop.mcp.results import mcp_result_outcome
from trioloop.mcp.sampling import sampling_request, sampling_result
from trioloop.mcp.servers import HttpServer, McpServer
from trioloop.mcp.tools import UnusableTool, build_mcp_tool, namespaced_name
from trioloop.providers._redact import mask_key_in_logs
from trioloop.runtime.tools import ToolExecutionContext

_log = logging.getLogger("trioloop.mcp")
_R = TypeVar("_R")

__all__ = ["McpConnectionError", "McpToolset", "SkippedTool"]

DEFAULT_CALL_TIMEOUT: Final = 120.0
DEFAULT_CONNECT_TIMEOUT: Final = 30.0
MAX_TOOLS: Final = 128
_MAX_PAGES: Final = 20
CLOSE_TIMEOUT: Final = 5.0
"""How long closing one connection may take (the stdio server's exit, the HTTP session's DELETE)."""
_LOG_LINE_MAX: Final = 1000
_LOG_BUFFER_MAX: Final = 65_536
_SDK_STDIO_LOGGER: Final = "mcp.client.stdio"


class _QuietSdkStdioLog(logging.Filter):
    """Turns the SDK stdio transport's tracebacks (one per non-JSON stdout line) into one ``trioloop.mcp``
    warning line without a traceback: with no logging configured, Python would print them on the terminal."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info is None:
            return True
        exc = record.exc_info[1]
        detail = "" if exc is None else f" ({_describe(exc)})"
        _log.warning("%s%s", sanitize_scalar(record.getMessage(), 200)[0], detail)
        return False


_SDK_FILTER: Final = _QuietSdkStdioLog()


def _quiet_sdk_stdio_log() -> None:
    logger = logging.getLogger(_SDK_STDIO_LOGGER)
    if _SDK_FILTER not in logger.filters:
        logger.addFilter(_SDK_FILTER)


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
_CLIENT_INFO: Final = mcp_types.Implementation(name="trioloop", version=_trioloop_version())


def _progress_to(ctx: ToolExecutionContext[Any]) -> ProgressFnT:
    """The SDK's progress callback for one call: each ``notifications/progress`` the server sends for it becomes
    the call's progress (the message is the server's text, capped; the face labels and sanitizes it)."""

    async def report(progress: float, total: float | None, message: str | None) -> None:
        ctx.report_progress(progress, total, (message or "")[:200])

    return report


class McpConnectionError(RuntimeError):
    """The toolset could not connect to its server or list its tools; the message names the server."""


@final
@attrs.frozen(kw_only=True)
class SkippedTool:
    """A tool the server listed that is not offered to the model, and why (both sanitized)."""

    name: str
    reason: str


#: The call whose task this is (set around ``call_tool``): a server request the SDK dispatches inside the call
#: (a 2026-07-28 ``input_required`` round) belongs to it.
_CALLING: Final = contextvars.ContextVar[ToolExecutionContext[Any] | None]("trioloop_mcp_calling", default=None)


class _Connection:
    """One connection's state; ``client`` is set once the handshake is done."""

    client: Client

    def __init__(self) -> None:
        #: The calls in flight on this connection (each one's timeout scope -> its context), oldest first: a
        #: server request that arrives outside any call's task (a 2025 server's own JSON-RPC request) is put to
        #: the person for the oldest.
        self.running: dict[trio.CancelScope, ToolExecutionContext[Any]] = {}
        self.lost = False
        self.scope = trio.CancelScope()

    def lose(self) -> None:
        """Mark the connection unusable: end its in-flight calls and close it (its task unwinds)."""
        self.lost = True
        for call in self.running:
            call.cancel()
        self.scope.cancel()


@final
class _WatchedReadStream:
    """The transport's read stream, reporting its end: a server that died between calls is noticed (and
    replaced on the next call) without sending anything. Everything else is passed through."""

    def __init__(self, inner: ReadStream[SessionMessage | Exception], on_end: Callable[[], None], server: str) -> None:
        self._inner = inner
        self._on_end = on_end
        self._server = server

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        try:
            item = await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._on_end()
            raise
        except Exception:
            self._on_end()  # a reader that failed is a connection that hears nothing more
            raise
        if isinstance(item, Exception):  # a line that is not JSON-RPC, or a transport fault: skipped by the SDK
            _log.warning("MCP server %s sent something unusable, skipped (%s)", self._server, _describe(item))
        return item

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> _WatchedReadStream:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


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
async def _watched(transport: Transport, on_end: Callable[[], None], server: str) -> AsyncIterator[TransportStreams]:
    async with transport as (read_stream, write_stream):
        yield _WatchedReadStream(read_stream, on_end, server), write_stream


def _describe(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {sanitize_scalar(str(exc), 160)[0]}"


def _lone_connection_error(group: BaseExceptionGroup[BaseException]) -> McpConnectionError | None:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc if isinstance(exc, McpConnectionError) else None


@final
class McpToolset:
    """The tools of one MCP server, under the app's static classification (``server.tools``).

    Use ``tools = await nursery.start(toolset.run)``; the tools stay callable while ``run`` runs.
    """

    def __init__(
        self,
        server: McpServer,
        *,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        errlog: TextIO | None = None,
    ) -> None:
        if not call_timeout > 0 or not connect_timeout > 0:
            raise ValueError("call_timeout and connect_timeout must be positive numbers of seconds")
        if isinstance(server, HttpServer) and server.oauth and server.auth is None:
            raise ValueError(
                f'MCP server "{server.name}" signs in with OAuth: give it auth= (the SDK\'s OAuthClientProvider).'
            )
        self.server = server
        self.call_timeout = call_timeout
        self.connect_timeout = connect_timeout
        self._errlog = errlog
        self._nursery: trio.Nursery | None = None
        self._connection: _Connection | None = None
        self._connecting = trio.Lock()
        self.tools: tuple[RegisteredTool[Any], ...] = ()
        self.skipped: tuple[SkippedTool, ...] = ()
        self.connections_opened = 0
        self._tools_changed = False  # the server sent notifications/tools/list_changed since the last listing

    @property
    def connected(self) -> bool:
        """Whether a connection is open now (False after the server went away, until the next call reconnects)."""
        return self._connection is not None and not self._connection.lost

    # -- lifecycle --------------------------------------------------------------------------------

    async def run(
        self, *, task_status: trio.TaskStatus[tuple[RegisteredTool[Any], ...]] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Connect, list and build the tools, report them, then hold the connection until cancelled.

        Raises ``McpConnectionError`` (before reporting any tools) if the server cannot be reached or listed.
        """
        if self._nursery is not None:
            raise RuntimeError(f'The toolset for MCP server "{self.server.name}" is already running.')
        try:
            await self._run(task_status)
        except BaseExceptionGroup as group:
            failure = _lone_connection_error(group)
            if failure is None:
                raise
            raise failure from None

    async def _run(self, task_status: trio.TaskStatus[tuple[RegisteredTool[Any], ...]]) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                with trio.fail_after(self.connect_timeout):
                    connection = await self._connect()
                    listed = await self._list_tools(connection.client)
            except trio.TooSlowError:
                raise McpConnectionError(
                    f'MCP server "{self.server.name}" did not finish connecting within {self.connect_timeout:g} s.'
                ) from None
            self.tools = self._build(listed)
            task_status.started(self.tools)
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None

    async def _connect(self) -> _Connection:
        assert self._nursery is not None
        try:
            connection: _Connection = await self._nursery.start(self._hold_connection)
        except McpConnectionError:
            raise
        except Exception as exc:
            raise McpConnectionError(f'Cannot connect to MCP server "{self.server.name}" ({_describe(exc)}).') from None
        self._connection = connection
        self.connections_opened += 1
        return connection

    @contextlib.asynccontextmanager
    async def _errlog_file(self) -> AsyncIterator[TextIO]:
        """Where the server's stderr goes: the app's ``errlog``, else a pipe whose lines are logged."""
        if self._errlog is not None:
            yield self._errlog
            return
        if isinstance(self.server, HttpServer) or self._nursery is None:
            with open(os.devnull, "w") as devnull:  # noqa: ASYNC230  # opening /dev/null does not block
                yield devnull
            return
        read_end, write_end = os.pipe()
        # The reader lives in the toolset's nursery and ends when the server's last copy of the pipe closes,
        # so a crashing server's last words are logged after its connection is gone.
        self._nursery.start_soon(_log_stderr, self.server.name, trio.lowlevel.FdStream(read_end))
        with open(write_end, "w", closefd=True) as errlog:  # noqa: ASYNC230  # a pipe's fd: no blocking open
            yield errlog

    def _client(self, errlog: TextIO, connection: _Connection) -> Client:
        server = self.server
        transport: Transport
        if isinstance(server, HttpServer):
            transport = (
                _authorized_http(server)
                if server.headers or server.auth is not None
                else streamable_http_client(server.url, terminate_on_close=True)
            )
        else:
            _quiet_sdk_stdio_log()
            parameters = StdioServerParameters(
                command=server.command,
                args=list(server.args),
                env=dict(server.env) if server.env is not None else None,
                cwd=server.cwd,
                # One invalid UTF-8 byte must not end the SDK's reader (it would then drain stdout for ever,
                # and the connection hear nothing more): the line decodes with U+FFFD and is skipped as non-JSON.
                encoding_error_handler="replace",
            )
            transport = stdio_client(parameters, errlog=errlog)

        async def elicit(
            context: ClientRequestContext, params: mcp_types.ElicitRequestParams
        ) -> mcp_types.ElicitResult | mcp_types.ErrorData:
            return await self._elicit(connection, params)

        async def sample(
            context: ClientRequestContext, params: mcp_types.CreateMessageRequestParams
        ) -> mcp_types.CreateMessageResult | mcp_types.ErrorData:
            return await self._sample(connection, params)

        return Client(
            _watched(transport, connection.lose, server.name),
            cache=None,
            client_info=_CLIENT_INFO,
            message_handler=self._on_server_message,
            elicitation_callback=elicit,
            # Declared (and answered) only for a server the app allows; otherwise the SDK refuses every request.
            sampling_callback=sample if server.sampling else None,
        )

    def _asker(self, connection: _Connection) -> ToolExecutionContext[Any] | None:
        """The call a server request belongs to: the one whose task it arrived in, else the oldest running."""
        return _CALLING.get() or next(iter(connection.running.values()), None)

    async def _server_request(
        self, connection: _Connection, what: str, put: Callable[[ToolExecutionContext[Any], str], Awaitable[_R]]
    ) -> _R | mcp_types.ErrorData:
        """A server's request for the person (``what``), put to them during the call it belongs to by ``put``.

        Never answered by anyone but the person: outside a call, past the turn's question limit or for a request
        that cannot be shown faithfully, the server gets an error, not an answer."""
        server = self.server.name
        ctx = self._asker(connection)
        try:
            if ctx is None:
                await trio.lowlevel.checkpoint()
                raise QuestionRefused("This host asks the person only during one of this server's tool calls.")
            return await put(ctx, f'MCP server "{server}"')
        except (UnusableRequest, ValueError) as exc:
            _log.warning("MCP server %s sent %s that cannot be shown: %s", server, what, exc)
            return mcp_types.ErrorData(code=mcp_types.INVALID_PARAMS, message=f"The request cannot be shown: {exc}")
        except QuestionRefused as exc:
            _log.warning("MCP server %s: %s refused: %s", server, what, exc)
            return mcp_types.ErrorData(code=mcp_types.INVALID_REQUEST, message=str(exc))

    async def _sample(
        self, connection: _Connection, params: mcp_types.CreateMessageRequestParams
    ) -> mcp_types.CreateMessageResult | mcp_types.ErrorData:
        """A server's ``sampling/createMessage`` (allowed for this server): a sampling card, then, approved, one
        request to the session's model; the answer goes back to the server, never into the conversation."""

        async def put(
            ctx: ToolExecutionContext[Any], source: str
        ) -> mcp_types.CreateMessageResult | mcp_types.ErrorData:
            sampled = await ctx.sample(source=source, request=sampling_request(params))
            _log.info("%s: its sampling request was %s", source, sampled.action)
            return sampling_result(sampled)

        return await self._server_request(connection, "a sampling request", put)

    async def _elicit(
        self, connection: _Connection, params: mcp_types.ElicitRequestParams
    ) -> mcp_types.ElicitResult | mcp_types.ErrorData:
        """A server's ``elicitation/create``: a question card for the person, during the call it belongs to."""

        async def put(ctx: ToolExecutionContext[Any], source: str) -> mcp_types.ElicitResult:
            answer = await ctx.ask(source=source, **question_parts(params))
            _log.info("%s: the person answered its question: %s", source, answer.action)
            return elicit_result(answer)

        return await self._server_request(connection, "a question", put)

    async def _listen_for_tool_changes(self, client: Client) -> None:
        """On a 2026-07-28 connection, subscribe to tool-list changes (``subscriptions/listen``) and mark the tools
        to list again at each; returns when the server does not offer it (an older protocol tells through
        ``notifications/tools/list_changed`` instead, see `_on_server_message`) or the subscription ends."""
        try:
            async with client.listen(tools_list_changed=True) as subscription:
                async for _ in subscription:
                    self._tools_changed = True
        except Exception as exc:  # not offered, refused or lost: changes are then heard as notifications, if at all
            _log.debug("MCP server %s: no tool-list subscription (%s)", self.server.name, type(exc).__name__)

    async def _on_server_message(self, message: Any) -> None:
        """A server's notifications: ``tools/list_changed`` marks the tools to list again before the next turn
        (`refresh`); a turn's tool set never changes while it runs."""
        await trio.lowlevel.checkpoint()
        if isinstance(message, mcp_types.ToolListChangedNotification):
            self._tools_changed = True

    @property
    def tools_changed(self) -> bool:
        """Whether the server said its tools changed since they were last listed."""
        return self._tools_changed

    async def refresh(self) -> tuple[RegisteredTool[Any], ...] | None:
        """The server's tools listed again if it said they changed (``notifications/tools/list_changed``), else
        None. The session calls it between turns; new tools are classified as `StdioServer.tools` says."""
        if not self._tools_changed:
            await trio.lowlevel.checkpoint()
            return None
        self._tools_changed = False
        connection = await self._live_connection()
        with trio.fail_after(self.connect_timeout):
            listed = await self._list_tools(connection.client)
        self.tools = self._build(listed)
        return self.tools

    async def _hold_connection(self, *, task_status: trio.TaskStatus[_Connection] = trio.TASK_STATUS_IGNORED) -> None:
        """One connection's lifetime. Failures after it is up end only this connection, never the nursery."""
        connection = _Connection()
        started = False
        try:
            async with contextlib.AsyncExitStack() as stack:
                errlog = await stack.enter_async_context(self._errlog_file())
                client = await stack.enter_async_context(self._client(errlog, connection))
                connection.client = client
                task_status.started(connection)
                started = True
                try:
                    with connection.scope:
                        await self._listen_for_tool_changes(client)
                        await trio.sleep_forever()
                finally:
                    # Closed as on a clean exit, shielded and bounded, even when the owner is cancelled: a
                    # notifications/cancelled already queued is still sent, and an HTTP session is ended.
                    with trio.CancelScope(deadline=trio.current_time() + CLOSE_TIMEOUT, shield=True):
                        await stack.aclose()
        except Exception as exc:
            if not started:
                raise McpConnectionError(
                    f'Cannot connect to MCP server "{self.server.name}" ({_describe(exc)}).'
                ) from None
        except BaseExceptionGroup as group:
            # A cancellation that met the connection's own failure: let the cancellation through, alone, so
            # the failure of this one connection never reaches the nursery above.
            _, rest = group.split(Exception)
            if rest is None:  # pragma: no cover  # a group of Exceptions only is an Exception, handled above
                raise
            raise rest from None
        finally:
            connection.lose()

    async def _list_tools(self, client: Client) -> list[mcp_types.Tool]:
        listed: list[mcp_types.Tool] = []
        cursor: str | None = None
        try:
            for _ in range(_MAX_PAGES):
                page = await client.list_tools(cursor=cursor)
                listed.extend(page.tools)
                cursor = page.next_cursor
                if cursor is None or len(listed) >= MAX_TOOLS:
                    break
        except Exception as exc:
            raise McpConnectionError(
                f'MCP server "{self.server.name}" did not list its tools ({_describe(exc)}).'
            ) from None
        return listed

    def _build(self, listed: list[mcp_types.Tool]) -> tuple[RegisteredTool[Any], ...]:
        tools: dict[str, RegisteredTool[Any]] = {}
        skipped: list[SkippedTool] = []
        for tool in listed:
            shown = sanitize_scalar(tool.name, 80)[0]
            if len(tools) >= MAX_TOOLS:
                skipped.append(SkippedTool(name=shown, reason=f"the server lists more than {MAX_TOOLS} tools"))
                continue
            name = namespaced_name(self.server.name, tool.name)
            if name in tools:
                skipped.append(SkippedTool(name=shown, reason=f'its name collides with another tool as "{name}"'))
                continue
            if tool.execution is not None and tool.execution.task_support == "required":
                reason = 'it runs only as an MCP task (its taskSupport is "required"), which this app does not run'
                skipped.append(SkippedTool(name=shown, reason=reason))
                continue
            tool_class = self.server.tools.get(tool.name, "destructive")
            try:
                tools[name] = build_mcp_tool(self.server.name, tool, tool_class, self._call)
            except UnusableTool as exc:
                skipped.append(SkippedTool(name=shown, reason=str(exc)))
            except Exception as exc:  # e.g. a schema nested too deep to walk: skip the tool, keep the server
                skipped.append(SkippedTool(name=shown, reason=f"it could not be prepared ({type(exc).__name__})"))
        self.skipped = tuple(skipped)
        return tuple(tools.values())

    # -- calls ------------------------------------------------------------------------------------

    async def _live_connection(self) -> _Connection:
        async with self._connecting:
            connection = self._connection
            if connection is not None and not connection.lost:
                return connection
            if self._nursery is None:
                raise McpConnectionError(f'The toolset for MCP server "{self.server.name}" is closed.')
            with trio.fail_after(self.connect_timeout):
                return await self._connect()

    async def _call(self, tool: str, arguments: dict[str, Any], ctx: ToolExecutionContext[Any]) -> ToolOutcome[Any]:
        server = self.server.name
        shown = namespaced_name(server, tool)
        try:
            connection = await self._live_connection()
        except (McpConnectionError, trio.TooSlowError) as exc:
            late = f"it did not connect within {self.connect_timeout:g} s."
            reason = str(exc) if isinstance(exc, McpConnectionError) else late
            return ToolOutcome.failure(f'The MCP tool "{shown}" was not called: {reason}')
        watch = trio.CancelScope(deadline=trio.current_time() + self.call_timeout)
        connection.running[watch] = ctx
        calling = _CALLING.set(ctx)
        result: mcp_types.CallToolResult | None = None
        failure: str | None = None
        try:
            with watch:
                result = await connection.client.call_tool(tool, arguments, progress_callback=_progress_to(ctx))
        except MCPError as exc:
            if exc.code == mcp_types.CONNECTION_CLOSED:
                connection.lose()
            else:
                failure = f"the server answered with error {exc.code}: {sanitize_scalar(exc.message, 200)[0]}"
        except Exception as exc:  # e.g. a result that does not parse; a dead connection is noticed on its own
            failure = f"the call failed ({_describe(exc)}). Whether it took effect is unknown"
        finally:
            _CALLING.reset(calling)
            connection.running.pop(watch, None)
        timed_out = watch.cancelled_caught and not connection.lost
        if timed_out:
            # The server did not answer in time: it may be hung as a whole, so the next call must not wait on
            # this connection for the whole timeout again. (Stop and the turn deadline are not this case.)
            connection.lose()
        if result is not None:
            return mcp_result_outcome(shown, server, result)
        if failure is None and not timed_out:
            failure = (
                "the server closed the connection during the call (it may have crashed). Whether the call took "
                "effect is unknown; the next call starts a new connection"
            )
        elif failure is None:
            failure = (
                f"the server did not answer within {self.call_timeout:g} s, so the call was cancelled (the server "
                "was told) and the next call starts a new connection. Whether it took effect is unknown"
            )
        return ToolOutcome.failure(f'The MCP tool "{shown}" failed: {failure}.')
