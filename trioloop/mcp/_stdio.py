"""trioloop's stdio transport: an MCP server as a subprocess, spoken to in JSON-RPC lines over its stdin and stdout.

It takes the place of the SDK's ``stdio_client``. Why not the SDK's: its reader joins what it holds of an unfinished
line to each new chunk, decodes and splits it all again, on the event loop, so a line without a newline costs time
quadratic in its length (a server writing one endless line held the loop up to 300 ms at a time, and a 50 MB tool
list never loaded). Here each byte is looked at once: a chunk is split at its newlines on its own (`LineSplitter`),
the pieces of an unfinished line wait in a list that is joined once, when its newline comes, and a line that passes
the server's ``max_message_bytes`` drops the connection (`McpMessageTooLarge`) there and then, however long it would
have run. Each read takes one chunk of at most 64 KiB and is a checkpoint, so the loop is held no longer than one
chunk's work, or one message's parse: that is linear in the message's size, runs in a worker thread past 1 MiB, and
still holds the interpreter lock while ``json`` builds the message (about a millisecond per MB: tens of ms for a
tool list of tens of MB; the cap bounds it).

The rest follows the SDK: the server starts in a session of its own (so its whole process group can be signalled),
with the SDK's safe default environment under the server's ``env``, its stderr where ``errlog`` says; messages meet
the SDK's session in zero-buffer memory streams (nothing is read ahead of a message not yet taken); a close lets the
writer flush, closes stdin, waits for the server to exit, then escalates to SIGTERM and SIGKILL, all within
`STDIO_CLOSE_TIMEOUT`, shielded, so a cancelled caller neither leaks the process nor waits on a frozen one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Final, TextIO, final

import anyio
import mcp_types
import trio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.client._transport import TransportStreams
from mcp.client.stdio import get_default_environment
from mcp.shared.message import SessionMessage

from trioloop.mcp.errors import McpMessageTooLarge
from trioloop.mcp.servers import StdioServer

__all__ = ["STDIO_CLOSE_TIMEOUT", "LineSplitter", "parse_message", "stdio_transport"]

_log = logging.getLogger("trioloop.mcp")

#: How long closing a stdio server takes at most before it is killed: its stdin is closed and it has half of this to
#: exit (as MCP's lifecycle asks), then its process group gets SIGTERM and the other half, then SIGKILL. A frozen
#: (SIGSTOPped) server is killed at this bound, and gone a moment later.
STDIO_CLOSE_TIMEOUT: Final = 2.0
#: The most one read takes from the server's stdout (a pipe's default capacity on Linux).
_CHUNK: Final = 65_536
#: From this size on (1 MiB: about 2 ms of parsing) a message is parsed in a worker thread. The parse still holds the
#: interpreter lock while ``json`` builds it, but the loop runs between its decoding and its parse, which halves the
#: longest hold of a message of tens of MB (about a millisecond per MB remains: ``json``'s).
_THREAD_PARSE_BYTES: Final = 1 << 20
#: How long, within the close, the writer may take to write the messages it accepted (a last cancellation notice).
_FLUSH_TIMEOUT: Final = 0.25
#: How long the kernel may take to end a SIGKILLed server: only a process that cannot die runs it out.
_REAP_TIMEOUT: Final = 0.5
_PIPE_ERRORS: Final = (
    trio.BrokenResourceError,
    trio.ClosedResourceError,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    OSError,
)


@final
class LineSplitter:
    """Newline-delimited messages out of a stream of chunks, in time linear in their size (sans-IO).

    Each chunk is split once, in C (``bytes.split``: a Python loop over a chunk of 65,536 newlines would hold the
    event loop for tens of ms); an unfinished line is kept as a list of pieces and joined once, by its newline, never
    copied or searched again as it grows. An empty line is no message and is dropped. A line longer than ``limit``
    bytes (its newline aside) ends the splitting as soon as the cap is passed: ``overflowed`` is set and later chunks
    are ignored.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.overflowed = False
        self._pieces: list[bytes] = []
        self._held = 0  # bytes of the unfinished line in _pieces

    @property
    def held(self) -> int:
        """How many bytes of an unfinished line are waiting for its newline."""
        return self._held

    def feed(self, chunk: bytes) -> list[bytes]:
        """The lines ``chunk`` ends, in order, each without its newline; those before an overflow are still
        returned."""
        if self.overflowed:
            return []
        ended = chunk.split(b"\n")
        rest = ended.pop()
        if ended and self._pieces:
            ended[0] = b"".join((*self._pieces, ended[0]))
            self._pieces.clear()
            self._held = 0
        # Only the first line can be longer than the chunk: the others need a look only under a cap that small.
        if ended and (len(ended[0]) > self.limit or (len(chunk) > self.limit and max(map(len, ended)) > self.limit)):
            self.overflowed = True
            first_too_long = next(index for index, line in enumerate(ended) if len(line) > self.limit)
            return list(filter(None, ended[:first_too_long]))
        if rest:
            self._held += len(rest)
            if self._held > self.limit:
                self.overflowed = True
                self._pieces.clear()
            else:
                self._pieces.append(rest)
        return list(filter(None, ended))


def parse_message(line: bytes) -> SessionMessage | Exception:
    """One line as a JSON-RPC message, or why it is not one (a value, as the SDK hands it on: the line is skipped
    and the connection kept).

    The bytes decode as UTF-8 with U+FFFD for an invalid byte (one bad byte must not end the connection; a line of
    them fails as JSON), parse with ``json`` and are checked by the SDK's own message adapter: the SDK's
    ``validate_json`` gives the same message but takes several times longer on one of many small objects (a tool
    list with large schemas), and the parse holds the event loop in either."""
    try:
        data = json.loads(line.decode("utf-8", "replace"))
        return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_python(data, by_name=False))
    except (ValueError, RecursionError) as exc:  # not JSON, not JSON-RPC, or nested past the parser's depth
        return exc


async def _read_stdout(
    stdout: trio.abc.ReceiveStream, deliver: MemoryObjectSendStream[SessionMessage | Exception], server: StdioServer
) -> None:
    """Each line of the server's stdout, parsed, to ``deliver``, until the pipe ends, the session stops taking them or
    a line passes the cap (then `McpMessageTooLarge` is the last thing delivered). What the server writes after that
    is read and dropped until the close, so a server blocked on a full stdout can still see its stdin close."""
    splitter = LineSplitter(server.max_message_bytes)
    limiter = trio.CapacityLimiter(1)  # its own: a large message never waits behind another part's blocking work
    try:
        async with deliver:
            while chunk := await stdout.receive_some(_CHUNK):
                for line in splitter.feed(bytes(chunk)):  # (a pipe gives bytes: no copy)
                    if len(line) < _THREAD_PARSE_BYTES:
                        message = parse_message(line)
                    else:  # not abandoned on cancellation: one parse of at most the cap, and no thread outlives us
                        message = await trio.to_thread.run_sync(parse_message, line, limiter=limiter)
                    await deliver.send(message)
                if splitter.overflowed:
                    await deliver.send(McpMessageTooLarge(server.name, server.max_message_bytes))
                    break
    except _PIPE_ERRORS:
        pass  # the session is gone (its end closed), or the close closed stdout under the read
    finally:
        with trio.CancelScope(shield=True):  # ends when the close closes stdout, or the server's last copy of it
            await _discard(stdout)


async def _discard(stdout: trio.abc.ReceiveStream) -> None:
    with contextlib.suppress(*_PIPE_ERRORS):
        while await stdout.receive_some(_CHUNK):
            pass


async def _write_stdin(
    stdin: trio.abc.SendStream,
    accepted: MemoryObjectReceiveStream[SessionMessage],
    deliver: MemoryObjectSendStream[SessionMessage | Exception],
    written: trio.Event,
) -> None:
    """Each message the session sends, as one line on the server's stdin; ``written`` is set once none is left."""
    try:
        async with accepted:
            async for message in accepted:
                line = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                await stdin.send_all(line.encode("utf-8", "replace") + b"\n")
    except _PIPE_ERRORS:
        # The server stopped reading (it may still live): the session hears the end, rather than a request waiting
        # for an answer that cannot come.
        await deliver.aclose()
    finally:
        written.set()


def _signal_group(process: trio.Process, number: signal.Signals) -> None:
    """``number`` to the server and every process it started (its session's group, led by its pid)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):  # gone, or only some of it could be signalled
        if sys.platform == "win32":  # pragma: no cover  # no process groups: the server alone, killed
            process.kill()
        else:
            os.killpg(process.pid, number)


async def _exited_by(process: trio.Process, deadline: float) -> bool:
    with trio.move_on_at(deadline):
        await process.wait()
    return process.returncode is not None


async def _close_process(
    process: trio.Process,
    from_server: MemoryObjectReceiveStream[SessionMessage | Exception],
    to_server: MemoryObjectSendStream[SessionMessage],
    written: trio.Event,
) -> None:
    """The close, as MCP's lifecycle has it and within `STDIO_CLOSE_TIMEOUT`: flush, close stdin, wait, SIGTERM,
    wait, SIGKILL. A signal goes only to a server not yet reaped, so its pid (its group's id) is still its own."""
    assert process.stdin is not None and process.stdout is not None
    start = trio.current_time()
    from_server.close()  # nothing more for the session: a reader blocked on a delivery turns to discarding
    to_server.close()  # the writer ends once it has written what it took
    with trio.move_on_after(_FLUSH_TIMEOUT):
        await written.wait()
    with contextlib.suppress(*_PIPE_ERRORS):
        await process.stdin.aclose()  # also wakes a writer blocked on a full pipe
    if not await _exited_by(process, start + STDIO_CLOSE_TIMEOUT / 2):
        _signal_group(process, signal.SIGTERM)
        if not await _exited_by(process, start + STDIO_CLOSE_TIMEOUT):
            _signal_group(process, signal.SIGKILL)
            if not await _exited_by(process, trio.current_time() + _REAP_TIMEOUT):
                _log.warning("MCP server process %d is still alive after SIGKILL; left behind", process.pid)
    with contextlib.suppress(*_PIPE_ERRORS):
        await process.stdout.aclose()  # a child that kept the pipe open would hold the reader otherwise
    await from_server.aclose()
    await to_server.aclose()


@contextlib.asynccontextmanager
async def stdio_transport(server: StdioServer, errlog: TextIO) -> AsyncIterator[TransportStreams]:
    """``server`` started as a subprocess, its stderr to ``errlog``; yields the SDK's (read, write) streams and
    closes the server on the way out (see `_close_process`). Raises ``OSError`` if the server cannot start."""
    process = await trio.lowlevel.open_process(
        [server.command, *server.args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=errlog,
        env=get_default_environment() | dict(server.env or {}),
        cwd=server.cwd,
        start_new_session=True,
    )
    # No checkpoint from here until the close is guarded by the ``finally``: a cancellation in between would leak
    # the running server.
    assert process.stdin is not None and process.stdout is not None
    to_session, from_server = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    to_server, from_session = anyio.create_memory_object_stream[SessionMessage](0)
    written = trio.Event()
    async with trio.open_nursery() as nursery:
        try:
            nursery.start_soon(_read_stdout, process.stdout, to_session, server, name="trioloop MCP stdout")
            nursery.start_soon(
                _write_stdin, process.stdin, from_session, to_session, written, name="trioloop MCP stdin"
            )
            yield from_server, to_server
        finally:
            with trio.CancelScope(shield=True):  # every wait in it is bounded
                await _close_process(process, from_server, to_server, written)
            nursery.cancel_scope.cancel()
