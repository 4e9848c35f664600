"""trioloop's stdio transport (trioloop/mcp/_stdio.py) against a raw server that misbehaves on the wire: a message is
read in time linear in its size and capped (``max_message_bytes``), an endless line never holds the event loop and
drops the connection with `McpMessageTooLarge` once past the cap, a tool list as large as the cap loads, a failed
listing between turns is one log line, and a frozen (SIGSTOPped) server is closed within ``STDIO_CLOSE_TIMEOUT``.

The server (``RAW_SERVER``) is plain Python speaking JSON-RPC by hand, run as ``python -c``, so it can write what no
SDK server would: one line that never ends, or a tool list of an exact size. It answers ``initialize`` as a 2025
server, exits when its stdin closes, and its mode is its first argument.
"""

from __future__ import annotations

import gc
import logging
import os
import re
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, asynccontextmanager, contextmanager, suppress
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from trioloop.machine.reducer import CallStatus, Outcome
from trioloop.machine.tools import PreparedCall, RegisteredTool, ToolOutcome
from trioloop.mcp import McpConnectionError, McpMessageTooLarge, McpToolset, StdioServer
from trioloop.mcp._stdio import STDIO_CLOSE_TIMEOUT, LineSplitter, parse_message
from trioloop.mcp.servers import DEFAULT_MAX_MESSAGE_BYTES
from trioloop.providers.scripted import ScriptedCall, ScriptedProvider, ScriptStep
from trioloop.runtime.tools import ToolExecutionContext
from trioloop.threatmodel import load_thf, threat_model_session

PAYMENT = Path(__file__).resolve().parent.parent / "examples" / "payment.thf"

RAW_SERVER = r'''
import json, os, sys, threading, time

mode, size = (sys.argv[1:] + ["plain", "0"])[:2]
out = sys.stdout.buffer

def send(obj):
    out.write(json.dumps(obj).encode() + b"\n")
    out.flush()

def answer(ident, text):
    send({"jsonrpc": "2.0", "id": ident, "result": {"content": [{"type": "text", "text": text}]}})

def tool_list(ident, size):
    """A tools/list answer of exactly ``size`` bytes, its newline aside: one tool with a long description."""
    def build(pad):
        tool = {"name": "big", "description": "d" * pad, "inputSchema": {"type": "object"}}
        return json.dumps({"jsonrpc": "2.0", "id": ident, "result": {"tools": [tool]}}).encode()
    return build(int(size) - len(build(0)))

def endless(ident, pause):
    """One answer that never ends: no newline, ever (fast, or 1 KiB every ``pause`` seconds)."""
    out.write(b'{"jsonrpc": "2.0", "id": %d, "result": {"content": [{"type": "text", "text": "' % ident)
    block = b"x" * (1024 if pause else 65536)
    while True:
        out.write(block)
        out.flush()
        time.sleep(pause)

TOOLS = [{"name": name, "inputSchema": {"type": "object"}} for name in ("flood", "trickle", "pid", "grow")]
grown = False
for raw in sys.stdin.buffer:
    message = json.loads(raw)
    ident, method = message.get("id"), message.get("method")
    if ident is None:
        continue  # a notification
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": ident, "result": {"protocolVersion": "2025-06-18",
              "capabilities": {"tools": {"listChanged": True}}, "serverInfo": {"name": "raw", "version": "1"}}})
    elif method == "tools/list" and (mode == "list" or grown):
        out.write(tool_list(ident, size) + b"\n")
        out.flush()
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": ident, "result": {"tools": TOOLS}})
    elif method == "tools/call" and message["params"]["name"] == "pid":
        answer(ident, str(os.getpid()))
    elif method == "tools/call" and message["params"]["name"] == "grow":
        grown = mode == "grow"
        send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        answer(ident, "grown")
    elif method == "tools/call":
        pause = 0 if message["params"]["name"] == "flood" else 0.002
        threading.Thread(target=endless, args=(ident, pause), daemon=True).start()
    elif method == "ping":
        send({"jsonrpc": "2.0", "id": ident, "result": {}})
    else:
        send({"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": "Method not found"}})
os._exit(0)  # stdin closed: the host is done (a thread may still be writing)
'''

#: The longest the event loop may go without running a ready task while a server misbehaves (its thread's waits
#: for a core taken out, the collector off): far above what one chunk's work takes, generous for a two-core machine
#: running the suite's other worker beside it, and below the SDK reader's 100-300 ms stalls.
MAX_GAP = 0.08


def raw_server(*mode: str, tools: dict[str, str] | None = None, max_message_bytes: int | None = None) -> StdioServer:
    cap = {} if max_message_bytes is None else {"max_message_bytes": max_message_bytes}
    read = dict.fromkeys(("flood", "trickle", "pid", "grow"), "read")
    return StdioServer(name="raw", command=sys.executable, args=("-c", RAW_SERVER, *mode), tools=tools or read, **cap)


def by_name(tools: tuple[RegisteredTool[Any], ...]) -> dict[str, RegisteredTool[Any]]:
    return {tool.name: tool for tool in tools}


def _no_document() -> Any:
    raise AssertionError("an MCP tool must never read the document")


async def call(tool: RegisteredTool[Any], raw: Any) -> ToolOutcome[Any]:
    prepared = tool.prepare(raw)
    assert isinstance(prepared, PreparedCall), prepared
    return await prepared.run(ToolExecutionContext.deferred(_no_document, cancel_scope=trio.CancelScope()))


async def server_pid(tool: RegisteredTool[Any]) -> int:
    """The raw server's process id, from its ``pid`` tool's fenced result."""
    text = (await call(tool, {})).result
    return int(re.search(r'"text": ?"(\d+)"', text).group(1))  # type: ignore[union-attr]


def _waited_for_a_core_s() -> float:
    """How long this thread has waited in the run queue for a core (Linux schedstat; 0 where there is none)."""
    try:
        with open("/proc/thread-self/schedstat") as stat:
            return int(stat.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


class Ticker:
    """A task that sleeps 1 ms at a time and keeps the longest gap between its wake-ups that the event loop was held
    by something else: the wall time between two wake-ups, less what the loop's thread spent waiting for a core
    meanwhile (schedstat). A machine that runs other processes (the suite's other workers) may keep the process off
    a core for tens of milliseconds, which holds nothing of ours; the loop's own work, or a thread holding the GIL,
    still counts. ``longest_wall`` keeps the wall figure, for the message."""

    def __init__(self) -> None:
        self.longest = 0.0
        self.longest_wall = 0.0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        last, last_waited = trio.current_time(), _waited_for_a_core_s()
        while True:
            await trio.sleep(0.001)
            now, waited = trio.current_time(), _waited_for_a_core_s()
            self.longest = max(self.longest, (now - last) - (waited - last_waited))
            self.longest_wall = max(self.longest_wall, now - last)
            last, last_waited = now, waited


def _held(ticker: Ticker) -> str:
    return f"the loop was held {ticker.longest * 1000:.0f} ms ({ticker.longest_wall * 1000:.0f} ms wall)"


@asynccontextmanager
async def ticking() -> AsyncIterator[Ticker]:
    """A `Ticker` for the block, with the garbage collector off meanwhile (collected just before): a full collection of
    the test process's heap (every earlier test's objects, late in a run: 55-61 ms) is the harness's pause, not the
    loop held by what the test runs."""
    ticker = Ticker()
    gc.collect()
    gc.disable()
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(ticker.run)
            yield ticker
            nursery.cancel_scope.cancel()
    finally:
        gc.enable()


@contextmanager
def frozen(pid: int) -> Iterator[None]:
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with suppress(ProcessLookupError):  # already gone: the close killed it
            os.kill(pid, signal.SIGCONT)


# -- the line splitter, without a process ---------------------------------------------------------------------------


def test_lines_split_across_chunks_come_out_whole_and_in_order() -> None:
    splitter = LineSplitter(limit=100)
    assert splitter.feed(b'{"a": 1}\n{"b"') == [b'{"a": 1}']
    assert splitter.held == 4
    assert splitter.feed(b": 2}") == []
    assert splitter.feed(b"\n\r\nlast\nnext") == [b'{"b": 2}', b"\r", b"last"]
    assert splitter.held == 4 and not splitter.overflowed
    assert LineSplitter(limit=1).feed(b"\n\n\n") == []  # an empty line is no message


def test_a_line_as_long_as_the_cap_passes_and_one_byte_more_overflows() -> None:
    at_cap = LineSplitter(limit=10)
    assert at_cap.feed(b"0123456789\n") == [b"0123456789"]
    over = LineSplitter(limit=10)
    assert over.feed(b"ok\n0123456789A\nnever") == [b"ok"]  # the lines before the overflow still count
    assert over.overflowed and over.feed(b"more\n") == []  # nothing after it


def test_an_unfinished_line_overflows_as_soon_as_the_cap_is_passed_never_waiting_for_its_newline() -> None:
    splitter = LineSplitter(limit=1000)
    for _ in range(9):
        assert splitter.feed(b"x" * 100) == [] and not splitter.overflowed
    assert splitter.feed(b"x" * 100) == [] and not splitter.overflowed  # 1000: at the cap, not past it
    assert splitter.feed(b"x") == [] and splitter.overflowed
    assert splitter.held <= 1001  # and nothing more is kept


@given(
    lines=st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=20),
    cuts=st.lists(st.integers(min_value=0, max_value=1000), max_size=30),
    limit=st.integers(min_value=1, max_value=50),
)
def test_any_chunking_gives_the_lines_of_the_whole_until_one_passes_the_cap(
    lines: list[bytes], cuts: list[int], limit: int
) -> None:
    stream = b"".join(line + b"\n" for line in lines)
    points = sorted({min(cut, len(stream)) for cut in cuts} | {0, len(stream)})
    splitter = LineSplitter(limit=limit)
    got = [line for start, end in pairwise(points) for line in splitter.feed(stream[start:end])]
    fitting = []
    for line in lines:
        if len(line) > limit:
            break
        fitting.append(line)
    assert got == [line for line in fitting if line]  # an empty line is no message
    assert splitter.overflowed == (len(fitting) < len(lines))


def test_a_line_that_is_not_a_message_is_a_value_never_an_exception() -> None:
    good = parse_message(b'{"jsonrpc": "2.0", "id": 7, "result": {}}')
    assert not isinstance(good, Exception) and good.message.id == 7  # type: ignore[union-attr]
    for line in (b"\xff\xfe not utf-8", b"plain words", b'{"jsonrpc": "2.0"}', b"[" * 100_000 + b"]" * 100_000):
        assert isinstance(parse_message(line), ValueError | RecursionError)


# -- a real server on the wire --------------------------------------------------------------------------------------


async def test_an_endless_line_never_stalls_the_loop_and_drops_the_connection_past_the_cap() -> None:
    toolset = McpToolset(raw_server(), call_timeout=20)
    async with trio.open_nursery() as nursery:
        tools = by_name(await nursery.start(toolset.run))
        async with ticking() as ticker:
            with trio.fail_after(10):  # past the default 64 MiB cap long before the 20 s call timeout
                flooded = await call(tools["raw__flood"], {})
        assert ticker.longest < MAX_GAP, _held(ticker)
        assert not flooded.ok and str(McpMessageTooLarge("raw", DEFAULT_MAX_MESSAGE_BYTES)) in flooded.result
        assert "the next call reconnects" in flooded.result and not toolset.connected
        assert (await call(tools["raw__pid"], {})).ok  # a new connection answers
        nursery.cancel_scope.cancel()
    assert toolset.connections_opened == 2


async def test_a_slow_endless_line_ends_the_turn_at_its_call_timeout_and_never_stalls_the_loop() -> None:
    script = [ScriptStep(tool_calls=(ScriptedCall(id="t", name="raw__trickle"),)), ScriptStep(text="It never ended.")]
    async with trio.open_nursery() as nursery, ScriptedProvider(script) as provider:
        session = threat_model_session(
            document=load_thf(PAYMENT), provider=provider, model="scripted-1", tools=(), nursery=nursery
        )
        await session.add_toolset(McpToolset(raw_server(), call_timeout=1.0))
        async with ticking() as ticker:
            start = trio.current_time()
            with trio.fail_after(4):
                state = await session.send("run the trickle")
            took = trio.current_time() - start
        assert state.outcome is Outcome.COMPLETED and state.calls[0].status is CallStatus.FAILED
        assert "did not answer within 1 s" in (state.calls[0].result or "")
        assert 1.0 <= took < 1.0 + 1.5, took  # its call timeout, and a margin
        assert ticker.longest < MAX_GAP, _held(ticker)
        nursery.cancel_scope.cancel()


async def test_a_tool_list_as_long_as_the_cap_loads_and_one_byte_more_is_refused() -> None:
    cap = 2_000_000
    async with trio.open_nursery() as nursery:
        with trio.fail_after(10):
            tools = await nursery.start(McpToolset(raw_server("list", str(cap), max_message_bytes=cap)).run)
        assert [tool.name for tool in tools] == ["raw__big"]
        with trio.fail_after(10), pytest.raises(McpMessageTooLarge, match=r'"raw" .* cap of 2,000,000 bytes') as caught:
            await nursery.start(McpToolset(raw_server("list", str(cap + 1), max_message_bytes=cap)).run)
        assert isinstance(caught.value, McpConnectionError) and caught.value.limit == cap
        nursery.cancel_scope.cancel()


async def test_a_50_mb_tool_list_loads_under_the_default_cap() -> None:
    async with trio.open_nursery() as nursery:
        with trio.fail_after(15):  # the SDK's reader took 33.7 s, then failed
            tools = await nursery.start(McpToolset(raw_server("list", str(50_000_000))).run)
        assert [tool.name for tool in tools] == ["raw__big"]
        nursery.cancel_scope.cancel()


async def test_a_failed_listing_between_turns_is_one_log_line_naming_the_server(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    cap = 100_000
    script = [
        ScriptStep(tool_calls=(ScriptedCall(id="g", name="raw__grow"),)),
        ScriptStep(text="Grown."),
        ScriptStep(text="Still here."),
    ]
    async with trio.open_nursery() as nursery, ScriptedProvider(script) as provider:
        session = threat_model_session(
            document=load_thf(PAYMENT), provider=provider, model="scripted-1", tools=(), nursery=nursery
        )
        toolset = McpToolset(raw_server("grow", str(cap + 1), max_message_bytes=cap), call_timeout=5)
        await session.add_toolset(toolset)
        assert (await session.send("grow a tool")).outcome is Outcome.COMPLETED and toolset.tools_changed
        with trio.fail_after(5):
            second = await session.send("go on")  # its listing meets a tool list over the cap
        assert second.outcome is Outcome.COMPLETED and "raw__grow" in second.tool_set  # the old tools stay
        assert toolset.tools_changed  # listed again next turn
        nursery.cancel_scope.cancel()
    refresh = [r for r in caplog.records if "could not list its tools again" in r.getMessage()]
    assert len(refresh) == 1, [r.getMessage() for r in caplog.records]
    line = refresh[0].getMessage()
    assert refresh[0].exc_info is None and "\n" not in line  # no traceback
    assert '"raw"' in line and "McpMessageTooLarge" in line and "cap of 100,000 bytes" in line


async def test_closing_a_frozen_server_takes_no_longer_than_the_close_timeout() -> None:
    toolset = McpToolset(raw_server())
    with ExitStack() as still_frozen:  # until the close is over
        async with trio.open_nursery() as nursery:
            tools = by_name(await nursery.start(toolset.run))
            pid = await server_pid(tools["raw__pid"])
            still_frozen.enter_context(frozen(pid))
            start = trio.current_time()
            nursery.cancel_scope.cancel()
        took = trio.current_time() - start
    assert STDIO_CLOSE_TIMEOUT <= took < STDIO_CLOSE_TIMEOUT + 1.0, took  # the SDK's close took 4.0-5.5 s
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped


def test_the_cap_is_set_where_the_server_is() -> None:
    from trioloop.mcp import McpConfigError, load_mcp_config

    (server,) = load_mcp_config('[servers.big]\ncommand = "srv"\nmax_message_bytes = 1000\n')
    assert isinstance(server, StdioServer) and server.max_message_bytes == 1000
    (default,) = load_mcp_config('[servers.big]\ncommand = "srv"\n')
    assert isinstance(default, StdioServer) and default.max_message_bytes == DEFAULT_MAX_MESSAGE_BYTES
    for bad in ('command = "srv"\nmax_message_bytes = 0', 'command = "srv"\nmax_message_bytes = "1e6"'):
        with pytest.raises(McpConfigError, match="max_message_bytes must be a positive"):
            load_mcp_config(f"[servers.big]\n{bad}\n")
    with pytest.raises(McpConfigError, match="max_message_bytes applies to a command server"):
        load_mcp_config('[servers.web]\nurl = "https://example.com/mcp"\nmax_message_bytes = 1000\n')
    with pytest.raises(McpConfigError, match="max_message_bytes"):
        StdioServer(name="x", command="srv", max_message_bytes=True)
