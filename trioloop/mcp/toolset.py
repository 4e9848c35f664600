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
import logging
import weakref
from typing import Any, Final, TextIO, final

import attrs
import mcp_types
import trio
from mcp import Client
from mcp.client.session import ClientRequestContext

from trioloop.machine.tools import RegisteredTool, ToolOutcome
from trioloop.machine.untrusted_text import sanitize_scalar
from trioloop.mcp._calls import answer_elicitation, answer_sampling, call_on_connection
from trioloop.mcp._connection import CLIENT_INFO, Connection, describe, server_errlog, server_transport, watched
from trioloop.mcp.errors import McpConnectionError
from trioloop.mcp.servers import HttpServer, McpServer
from trioloop.mcp.tools import McpCall, UnusableTool, build_mcp_tool, namespaced_name
from trioloop.runtime.tools import ToolExecutionContext

_log = logging.getLogger("trioloop.mcp")

__all__ = ["McpConnectionError", "McpToolset", "SkippedTool"]

DEFAULT_CALL_TIMEOUT: Final = 120.0
DEFAULT_CONNECT_TIMEOUT: Final = 30.0
MAX_TOOLS: Final = 128
_MAX_PAGES: Final = 20
#: The answer to a server's request that arrives once its connection is gone.
_GONE: Final = mcp_types.ErrorData(code=mcp_types.INTERNAL_ERROR, message="The connection has ended.")
CLOSE_TIMEOUT: Final = 5.0
"""How long closing one connection may take (the HTTP session's DELETE; a stdio server is killed sooner, at
``STDIO_CLOSE_TIMEOUT``)."""


@final
@attrs.frozen(kw_only=True)
class SkippedTool:
    """A tool the server listed that is not offered to the model, and why (both sanitized)."""

    name: str
    reason: str


def _lone_connection_error(group: BaseExceptionGroup[BaseException]) -> McpConnectionError | None:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc if isinstance(exc, McpConnectionError) else None


async def _drop_when_cancelled(connection: Connection) -> None:
    """Until ``connection`` is closed; cancelled first (the toolset's nursery closing), it ends the connection."""
    try:
        await connection.closed.wait()
    finally:
        connection.lose()


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
        self._connection: Connection | None = None
        self._connecting = trio.Lock()
        self.tools: tuple[RegisteredTool[Any], ...] = ()
        self.skipped: tuple[SkippedTool, ...] = ()
        self.connections_opened = 0
        self._tools_changed = False  # the server sent notifications/tools/list_changed since the last listing

    @property
    def name(self) -> str:
        """The server's name: what a log line about this toolset names it by."""
        return self.server.name

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
                    listed = await self._list_tools(connection)
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

    async def _connect(self) -> Connection:
        assert self._nursery is not None
        try:
            connection: Connection = await self._nursery.start(self._hold_connection)
        except McpConnectionError:
            raise
        except Exception as exc:
            raise McpConnectionError(f'Cannot connect to MCP server "{self.server.name}" ({describe(exc)}).') from None
        self._connection = connection
        self.connections_opened += 1
        return connection

    def _client(self, errlog: TextIO, connection: Connection) -> Client:
        server = self.server
        transport = server_transport(server, errlog)
        # The client's callbacks reach the toolset and the connection (which holds the client) weakly: no
        # reference cycle, so a connection's objects go as soon as it ends, not at the next full collection.
        name, toolset, held = server.name, weakref.ref(self), weakref.ref(connection)

        async def on_message(message: Any) -> None:
            alive = toolset()
            if alive is None:
                await trio.lowlevel.checkpoint()
            else:
                await alive._on_server_message(message)

        async def elicit(
            context: ClientRequestContext, params: mcp_types.ElicitRequestParams
        ) -> mcp_types.ElicitResult | mcp_types.ErrorData:
            alive = held()
            if alive is None:
                return _GONE
            return await answer_elicitation(name, alive, params)

        async def sample(
            context: ClientRequestContext, params: mcp_types.CreateMessageRequestParams
        ) -> mcp_types.CreateMessageResult | mcp_types.ErrorData:
            alive = held()
            if alive is None:
                return _GONE
            return await answer_sampling(name, alive, params)

        return Client(
            watched(transport, connection, server.name),
            cache=None,
            client_info=CLIENT_INFO,
            message_handler=on_message,
            elicitation_callback=elicit,
            # Declared (and answered) only for a server the app allows; otherwise the SDK refuses every request.
            sampling_callback=sample if server.sampling else None,
        )

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
        None. The session calls it as a turn begins, where Stop and the turn deadline apply; it takes at most
        ``call_timeout`` (a server that does not answer in time loses its connection, keeps its old tools and
        is listed again next turn). New tools are classified as `StdioServer.tools` says.

        Raises ``McpConnectionError`` (naming the server and why) when the tools could not be listed."""
        if not self._tools_changed:
            await trio.lowlevel.checkpoint()
            return None
        self._tools_changed = False
        try:
            listed = await self._list_again()
        except BaseException:
            self._tools_changed = True  # not listed (too slow, failed, or Stop): listed again next time
            raise
        self.tools = self._build(listed)
        return self.tools

    async def _list_again(self) -> list[mcp_types.Tool]:
        connection: Connection | None = None
        try:
            with trio.move_on_after(self.call_timeout):
                connection = live = await self._live_connection()
                return await live.request(lambda: self._list_tools(live))
        except McpConnectionError:
            raise
        except Exception as exc:  # the connection closed under the listing, or a new one did not come up in time
            failure = None if connection is None else connection.failure
            raise failure or McpConnectionError(
                f'MCP server "{self.server.name}" did not list its tools again ({describe(exc)}); its old tools stay'
            ) from None
        if self._connection is not None:
            self._connection.lose()  # a server this slow may be hung as a whole: the next call reconnects
        raise McpConnectionError(
            f'MCP server "{self.server.name}" did not list its tools again within {self.call_timeout:g} s; its '
            "connection was closed and its old tools stay"
        )

    async def _hold_connection(self, *, task_status: trio.TaskStatus[Connection] = trio.TASK_STATUS_IGNORED) -> None:
        """One connection's lifetime. Failures after it is up end only this connection, never the nursery."""
        connection = Connection(self._nursery)
        started = False
        # Once connected, the SDK's own tasks (its readers and writers) live under a shield, so a cancellation
        # from outside (the session closing) never tears them mid-close: it reaches the connection through
        # `_drop_when_cancelled` instead, which ends it cleanly. The close is then shielded and bounded: a
        # notifications/cancelled already queued is still sent, and an HTTP session is ended (DELETE).
        closing = trio.CancelScope()
        try:
            with closing:
                async with contextlib.AsyncExitStack() as stack:
                    errlog = await stack.enter_async_context(server_errlog(self.server, self._errlog, self._nursery))
                    client = await stack.enter_async_context(self._client(errlog, connection))
                    connection.client = client
                    if self._nursery is not None:  # (a connection held on its own has no watch: unshielded)
                        closing.shield = True
                        self._nursery.start_soon(_drop_when_cancelled, connection, name="trioloop MCP connection watch")
                    task_status.started(connection)
                    started = True
                    try:
                        with connection.scope:
                            await self._listen_for_tool_changes(client)
                            await trio.sleep_forever()
                    finally:
                        closing.deadline = trio.current_time() + CLOSE_TIMEOUT
                        connection.lose()
                        await connection.settle()  # a call cut by the close still gets its notice out
        except Exception as exc:
            if not started:
                raise connection.failure or McpConnectionError(
                    f'Cannot connect to MCP server "{self.server.name}" ({describe(exc)}).'
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
            connection.closed.set()

    async def _list_tools(self, connection: Connection) -> list[mcp_types.Tool]:
        listed: list[mcp_types.Tool] = []
        cursor: str | None = None
        try:
            for _ in range(_MAX_PAGES):
                page = await connection.client.list_tools(cursor=cursor)
                listed.extend(page.tools)
                cursor = page.next_cursor
                if cursor is None or len(listed) >= MAX_TOOLS:
                    break
        except Exception as exc:
            raise connection.failure or McpConnectionError(
                f'MCP server "{self.server.name}" did not list its tools ({describe(exc)}).'
            ) from None
        return listed

    def _build(self, listed: list[mcp_types.Tool]) -> tuple[RegisteredTool[Any], ...]:
        tools: dict[str, RegisteredTool[Any]] = {}
        skipped: list[SkippedTool] = []
        call = _weak_call(weakref.ref(self))  # the tools (which the toolset keeps) reach it weakly: no cycle
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
                tools[name] = build_mcp_tool(self.server.name, tool, tool_class, call)
            except UnusableTool as exc:
                skipped.append(SkippedTool(name=shown, reason=str(exc)))
            except Exception as exc:  # e.g. a schema nested too deep to walk: skip the tool, keep the server
                skipped.append(SkippedTool(name=shown, reason=f"it could not be prepared ({type(exc).__name__})"))
        self.skipped = tuple(skipped)
        return tuple(tools.values())

    # -- calls ------------------------------------------------------------------------------------

    async def _live_connection(self) -> Connection:
        async with self._connecting:
            connection = self._connection
            if connection is not None and not connection.lost:
                return connection
            if self._nursery is None:
                raise McpConnectionError(f'The toolset for MCP server "{self.server.name}" is closed.')
            with trio.fail_after(self.connect_timeout):
                return await self._connect()

    async def _call(self, tool: str, arguments: dict[str, Any], ctx: ToolExecutionContext[Any]) -> ToolOutcome[Any]:
        connection = self._connection
        if connection is None or connection.lost:
            try:
                connection = await self._live_connection()
            except (McpConnectionError, trio.TooSlowError) as exc:
                late = f"it did not connect within {self.connect_timeout:g} s."
                reason = str(exc) if isinstance(exc, McpConnectionError) else late
                shown = namespaced_name(self.server.name, tool)
                return ToolOutcome.failure(f'The MCP tool "{shown}" was not called: {reason}')
        return await call_on_connection(
            connection, tool, arguments, ctx, server=self.server.name, call_timeout=self.call_timeout
        )


def _weak_call(toolset: weakref.ref[McpToolset]) -> McpCall:
    """The toolset's ``_call`` reached through ``toolset``."""

    async def call(tool: str, arguments: dict[str, Any], ctx: ToolExecutionContext[Any]) -> ToolOutcome[Any]:
        alive = toolset()
        if alive is None:
            await trio.lowlevel.checkpoint()
            return ToolOutcome.failure(f'The MCP tool "{tool}" was not called: its server\'s toolset has ended.')
        return await alive._call(tool, arguments, ctx)

    return call
