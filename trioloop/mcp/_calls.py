"""One tool call on an MCP connection, and the server's requests for the person during it.

The call has its own timeout, reports the server's progress and ends in a result or a failure the model can read;
an elicitation or a sampling request is put to the person during the call it belongs to, and answered by no one
else.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

import mcp_types
import trio
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError

from trioloop.machine.questions import QuestionRefused
from trioloop.machine.tools import ToolOutcome
from trioloop.machine.untrusted_text import sanitize_scalar
from trioloop.mcp._connection import Connection, describe
from trioloop.mcp.elicitation import UnusableRequest, elicit_result, question_parts
from trioloop.mcp.results import mcp_result_outcome
from trioloop.mcp.sampling import sampling_request, sampling_result
from trioloop.mcp.tools import namespaced_name
from trioloop.runtime.tools import ToolExecutionContext

_log = logging.getLogger("trioloop.mcp")
_R = TypeVar("_R")

__all__ = ["answer_elicitation", "answer_sampling", "call_on_connection"]

#: The call whose task this is (set around ``call_tool``): a server request the SDK dispatches inside the call
#: (a 2026-07-28 ``input_required`` round) belongs to it.
_CALLING: Final = contextvars.ContextVar[ToolExecutionContext[Any] | None]("trioloop_mcp_calling", default=None)


def _progress_to(ctx: ToolExecutionContext[Any]) -> ProgressFnT:
    """The SDK's progress callback for one call: each ``notifications/progress`` the server sends for it becomes
    the call's progress (the message is the server's text, capped; the face labels and sanitizes it)."""

    async def report(progress: float, total: float | None, message: str | None) -> None:
        ctx.report_progress(progress, total, (message or "")[:200])

    return report


async def call_on_connection(
    connection: Connection,
    tool: str,
    arguments: dict[str, Any],
    ctx: ToolExecutionContext[Any],
    *,
    server: str,
    call_timeout: float,
) -> ToolOutcome[Any]:
    """Server ``server``'s ``tool`` called on ``connection`` within ``call_timeout`` seconds: its result for the
    model, or why it failed. A connection that closed, or did not answer in time, is lost for the next call.

    The call runs in the caller's task: at its timeout, or Stop, the SDK's cancellation notice is handed to a task
    of the connection's (see `_NoticeWriteStream`), so the caller returns at once whatever the server does."""
    watch = trio.CancelScope(deadline=trio.current_time() + call_timeout)
    connection.running[watch] = ctx
    if connection.lost:  # lost since it was handed out: it will not answer
        watch.cancel()
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
        failure = f"the call failed ({describe(exc)}). Whether it took effect is unknown"
    finally:
        _CALLING.reset(calling)
        connection.call_ended(watch)
    shown = namespaced_name(server, tool)
    if result is not None:
        return mcp_result_outcome(shown, server, result)
    timed_out = watch.cancelled_caught and not connection.lost
    if timed_out:
        # The server did not answer in time: it may be hung as a whole, so the next call must not wait on
        # this connection for the whole timeout again. (Stop and the turn deadline are not this case.)
        connection.lose()
    if failure is None and connection.failure is not None:  # the transport gave the connection up
        failure = f"{connection.failure}. Whether the call took effect is unknown; the next call reconnects"
    elif failure is None and not timed_out:
        failure = (
            "the server closed the connection during the call (it may have crashed). Whether the call took "
            "effect is unknown; the next call starts a new connection"
        )
    elif failure is None:
        failure = (
            f"the server did not answer within {call_timeout:g} s, so the call was cancelled (the server "
            "was told) and the next call starts a new connection. Whether it took effect is unknown"
        )
    return ToolOutcome.failure(f'The MCP tool "{shown}" failed: {failure}.')


def _asker(connection: Connection) -> ToolExecutionContext[Any] | None:
    """The call a server request belongs to: the one whose task it arrived in, else the oldest running."""
    return _CALLING.get() or next(iter(connection.running.values()), None)


async def _server_request(
    server: str, connection: Connection, what: str, put: Callable[[ToolExecutionContext[Any], str], Awaitable[_R]]
) -> _R | mcp_types.ErrorData:
    """A server's request for the person (``what``), put to them during the call it belongs to by ``put``.

    Never answered by anyone but the person: outside a call, past the turn's question limit or for a request
    that cannot be shown faithfully, the server gets an error, not an answer."""
    ctx = _asker(connection)
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


async def answer_sampling(
    server: str, connection: Connection, params: mcp_types.CreateMessageRequestParams
) -> mcp_types.CreateMessageResult | mcp_types.ErrorData:
    """A server's ``sampling/createMessage`` (allowed for this server): a sampling card, then, approved, one
    request to the session's model; the answer goes back to the server, never into the conversation."""

    async def put(ctx: ToolExecutionContext[Any], source: str) -> mcp_types.CreateMessageResult | mcp_types.ErrorData:
        sampled = await ctx.sample(source=source, request=sampling_request(params))
        _log.info("%s: its sampling request was %s", source, sampled.action)
        return sampling_result(sampled)

    return await _server_request(server, connection, "a sampling request", put)


async def answer_elicitation(
    server: str, connection: Connection, params: mcp_types.ElicitRequestParams
) -> mcp_types.ElicitResult | mcp_types.ErrorData:
    """A server's ``elicitation/create``: a question card for the person, during the call it belongs to."""

    async def put(ctx: ToolExecutionContext[Any], source: str) -> mcp_types.ElicitResult:
        answer = await ctx.ask(source=source, **question_parts(params))
        _log.info("%s: the person answered its question: %s", source, answer.action)
        return elicit_result(answer)

    return await _server_request(server, connection, "a question", put)
