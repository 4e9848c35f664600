"""MCP tools: what trioloop adds to a call over the SDK, and what rendering a result costs as it grows.

Case ``call``: one stdio server (tests/fixtures/mcp_server.py), the same ``echo`` call made through the
SDK's ``Client.call_tool`` directly, through the SDK as trioloop asks it (under a timeout's cancel scope, with
a progress callback), and through a trioloop MCP tool (schema validation, digest, card, the call, sanitizing
and fencing the result); one of each per round in a shuffled order, in the same process and connection.
Case ``render``: ``mcp_result_outcome`` alone (sans-IO) on text results of growing size; it must stay flat,
because nothing past the 8192-byte cap is ever walked.

``--parts`` times each step of the trioloop half alone, right after an SDK call (so with the caches as a real
call leaves them), and ``--profile`` runs cProfile around the trioloop half only.

``--stdio`` compares the stdio transports, the SDK's ``stdio_client`` and trioloop's own (``trioloop.mcp._stdio``),
each under the SDK's ``Client`` against the raw server of tests/test_mcp_stdio.py: (1) a call answered by one endless
line, for ``--window`` seconds at most: the longest and p99 hold of the event loop (the gaps of a task that sleeps
1 ms at a time) and when the connection dropped; (2) tool lists of 1 to 50 MB: the time to list them, per MB (flat
when linear), and the longest hold of the loop meanwhile (the SDK only up to 16 MB: its time grows with the square
of the size); (3) closing a frozen (SIGSTOPped) server.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import trio

from benchmarks._common import case_record, emit, percentile, print_profile, print_table, summarize
from trioloop.machine.tools import PreparedCall
from trioloop.runtime.tools import ToolExecutionContext

SERVER = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "mcp_server.py"
SIZES = (100, 20_000)
CALL_TIMEOUT = 120.0  # McpToolset's default


def _no_document() -> Any:
    raise AssertionError("MCP tools never read the document")


def _context() -> ToolExecutionContext[Any]:
    return ToolExecutionContext.deferred(_no_document, cancel_scope=trio.CancelScope())


async def _ignore_progress(progress: float, total: float | None, message: str | None) -> None:
    """A progress callback that keeps nothing."""


async def call_case(rounds: int, text_size: int, profiler: cProfile.Profile | None = None) -> dict[str, list[float]]:
    from trioloop.mcp import McpToolset, StdioServer

    toolset = McpToolset(StdioServer(name="fx", command=sys.executable, args=(str(SERVER), "stdio")))
    text = "w" * text_size
    async with trio.open_nursery() as nursery:
        tools = {tool.name: tool for tool in await nursery.start(toolset.run)}
        echo = tools["fx__echo"]
        client = toolset._connection.client  # type: ignore[union-attr]  # the same connection, for the SDK side

        async def sdk() -> None:
            await client.call_tool("echo", {"text": text})

        async def sdk_bounded() -> None:
            with trio.move_on_after(CALL_TIMEOUT):
                await client.call_tool("echo", {"text": text}, progress_callback=_ignore_progress)

        async def trioloop() -> None:
            if profiler is not None:
                profiler.enable()
            prepared = echo.prepare({"text": text})
            assert isinstance(prepared, PreparedCall)
            outcome = await prepared.run(_context())
            if profiler is not None:
                profiler.disable()
            assert outcome.ok

        cases: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("sdk", sdk),
            ("sdk_bounded", sdk_bounded),
            ("trioloop", trioloop),
        ]
        samples: dict[str, list[float]] = {name: [] for name, _ in cases}
        for _ in range(rounds):
            random.shuffle(cases)
            for name, case in cases:
                start = time.perf_counter()
                await case()
                samples[name].append(time.perf_counter() - start)
        nursery.cancel_scope.cancel()
    return samples


async def parts_case(rounds: int, text_size: int) -> dict[str, list[float]]:
    """Each step of the trioloop half timed alone, right after an SDK call on the same connection."""
    import mcp_types

    from trioloop.machine.canonical import canonical_digest, canonical_json
    from trioloop.mcp import McpToolset, StdioServer
    from trioloop.mcp.results import mcp_result_outcome

    toolset = McpToolset(StdioServer(name="fx", command=sys.executable, args=(str(SERVER), "stdio")))
    arguments = {"text": "w" * text_size}
    async with trio.open_nursery() as nursery:
        echo = {tool.name: tool for tool in await nursery.start(toolset.run)}["fx__echo"]
        client = toolset._connection.client  # type: ignore[union-attr]
        result = await client.call_tool("echo", arguments)
        assert isinstance(result, mcp_types.CallToolResult)
        text = canonical_json(arguments)

        async def timeout_scope() -> None:
            with trio.move_on_after(CALL_TIMEOUT):
                await client.call_tool("echo", arguments)

        async def progress_callback() -> None:
            await client.call_tool("echo", arguments, progress_callback=_ignore_progress)

        steps: dict[str, Callable[[], object]] = {
            "prepare: all of it": lambda: echo.prepare(arguments),
            "prepare: canonical_json (machine)": lambda: canonical_json(arguments),
            "prepare: canonical_digest (machine)": lambda: canonical_digest(text),
            "result: mcp_result_outcome": lambda: mcp_result_outcome("fx__echo", "fx", result),
            "the tool context and its scope": _context,
        }
        # What trioloop asks of the SDK call itself, as the difference from a bare call measured beside it.
        calls: dict[str, Callable[[], Awaitable[None]]] = {
            "call: under a timeout's cancel scope": timeout_scope,
            "call: with a progress callback": progress_callback,
        }
        samples: dict[str, list[float]] = {name: [] for name in [*steps, *calls, "call: bare"]}
        order = list(steps.items())
        for _ in range(rounds):
            random.shuffle(order)
            for name, step in order:
                await client.call_tool("echo", arguments)
                start = time.perf_counter()
                step()
                samples[name].append(time.perf_counter() - start)
            for name, call in random.sample([*calls.items(), ("call: bare", _bare(client, arguments))], 3):
                start = time.perf_counter()
                await call()
                samples[name].append(time.perf_counter() - start)
        nursery.cancel_scope.cancel()
    return samples


def _bare(client: Any, arguments: dict[str, Any]) -> Callable[[], Awaitable[None]]:
    async def bare() -> None:
        await client.call_tool("echo", arguments)

    return bare


def render_case(size: int, repeat: int) -> list[float]:
    import mcp_types

    from trioloop.mcp.results import mcp_result_outcome

    result = mcp_types.CallToolResult(content=[mcp_types.TextContent(type="text", text="é<" * (size // 2))])
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        mcp_result_outcome("fx__echo", "fx", result)
        samples.append(time.perf_counter() - start)
    return samples


def _parts(rounds: int) -> int:
    for size in SIZES:
        samples = trio.run(parts_case, rounds, size)
        bare = statistics.median(samples.pop("call: bare"))
        rows = []
        for name, values in samples.items():
            median = statistics.median(values)
            rows.append((name, round((median - bare if name.startswith("call:") else median) * 1e6, 1)))
        print()
        print_table((f"trioloop half, {size} chars", "µs (median, caches as a call leaves them)"), rows)
    return 0


def _profile(rounds: int) -> int:
    for size in SIZES:
        profiler = cProfile.Profile()
        trio.run(call_case, rounds, size, profiler)
        print(f"\n== the trioloop half of {rounds} calls, {size} chars")
        print_profile(pstats.Stats(profiler), 30)
    return 0


# -- --stdio: the transports -----------------------------------------------------------------------------------


def _stdio_transport(kind: str, *mode: str, errlog: Any) -> Any:
    """A transport to the raw server (in ``mode``): the SDK's ``stdio_client`` or trioloop's, default cap."""
    from mcp.client.stdio import StdioServerParameters, stdio_client

    from tests.test_mcp_stdio import RAW_SERVER
    from trioloop.mcp import StdioServer
    from trioloop.mcp._stdio import stdio_transport

    args = ["-c", RAW_SERVER, *mode]
    if kind == "sdk":
        parameters = StdioServerParameters(command=sys.executable, args=args, encoding_error_handler="replace")
        return stdio_client(parameters, errlog=errlog)
    return stdio_transport(StdioServer(name="raw", command=sys.executable, args=args), errlog)


class _Gaps:
    """The gaps between the wake-ups of a task that sleeps 1 ms at a time: how long the loop was held."""

    def __init__(self) -> None:
        self.seen: list[float] = []

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        last = trio.current_time()
        while True:
            await trio.sleep(0.001)
            now = trio.current_time()
            self.seen.append(now - last)
            last = now


async def _timed(kind: str, mode: Sequence[str], work: Callable[[Any], Awaitable[Any]], limit: float) -> dict[str, Any]:
    """``work(client)`` on a fresh connection of ``kind``, at most ``limit`` s: how long it took, how it ended, and
    the loop's holds meanwhile (in ms)."""
    import os

    from mcp import Client

    gaps = _Gaps()
    with open(os.devnull, "w") as devnull:  # noqa: ASYNC230  # /dev/null does not block
        transport = _stdio_transport(kind, *mode, errlog=devnull)
        async with trio.open_nursery() as nursery, Client(transport, cache=None) as client:
            await nursery.start(gaps.run)
            start = trio.current_time()
            ended = "timeout"
            try:
                with trio.move_on_after(limit):
                    await work(client)
                    ended = "ok"
            except Exception as exc:
                ended = type(exc).__name__
            took = trio.current_time() - start
            nursery.cancel_scope.cancel()
    return {
        "s": round(took, 3),
        "ended": ended,
        "max_hold_ms": round(max(gaps.seen, default=0) * 1e3, 1),
        "p99_hold_ms": round(percentile(gaps.seen, 99) * 1e3, 1) if gaps.seen else 0.0,
    }


async def _frozen_close(kind: str) -> float:
    """Seconds to close a connection whose server is frozen (SIGSTOP)."""
    import os
    import signal

    from mcp import Client

    with open(os.devnull, "w") as devnull:  # noqa: ASYNC230  # /dev/null does not block
        client = Client(_stdio_transport(kind, errlog=devnull), cache=None)
        await client.__aenter__()
        result = await client.call_tool("pid", {})
        pid = int(result.content[0].text)  # type: ignore[union-attr]
        os.kill(pid, signal.SIGSTOP)
        start = trio.current_time()
        try:
            await client.__aexit__(None, None, None)
        finally:
            took = trio.current_time() - start
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    return took


def _stdio(window: float) -> int:
    rows: list[tuple[Any, ...]] = []

    async def flood(client: Any) -> None:
        await client.call_tool("flood", {})

    for kind in ("sdk", "trioloop"):
        figures = trio.run(_timed, kind, (), flood, window)
        emit(case_record("mcp", f"stdio endless line {kind}", ("mcp",), window_s=window, **figures))
        rows.append(
            (f"endless line, {kind}", figures["s"], figures["ended"], figures["max_hold_ms"], figures["p99_hold_ms"])
        )
    print()
    print_table(("case", "s to the end", "how it ended", "longest hold ms", "p99 hold ms"), rows)

    async def list_tools(client: Any) -> None:
        await client.list_tools()

    rows = []
    for size_mb in (1, 4, 16, 50):
        for kind in ("sdk", "trioloop"):
            if kind == "sdk" and size_mb > 16:
                continue  # quadratic: 50 MB took 33.7 s, then failed
            figures = trio.run(_timed, kind, ("list", str(size_mb * 1_000_000)), list_tools, 120.0)
            emit(case_record("mcp", f"stdio tool list {size_mb} MB {kind}", ("mcp",), **figures))
            per_mb = round(figures["s"] * 1e3 / size_mb, 1)
            rows.append(
                (f"{size_mb} MB tool list, {kind}", figures["s"], per_mb, figures["ended"], figures["max_hold_ms"])
            )
    print()
    print_table(("case", "s to list", "ms per MB", "how it ended", "longest hold ms"), rows)

    rows = []
    for kind in ("sdk", "trioloop"):
        took = trio.run(_frozen_close, kind)
        emit(case_record("mcp", f"stdio close frozen {kind}", ("mcp",), close_s=round(took, 3)))
        rows.append((f"close a frozen server, {kind}", round(took, 3)))
    print()
    print_table(("case", "s"), rows)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("rounds", type=int, nargs="?", default=200, help="calls of each kind (default 200)")
    parser.add_argument("--parts", action="store_true", help="time each step of the trioloop half instead")
    parser.add_argument("--profile", action="store_true", help="cProfile the trioloop half instead of timing")
    parser.add_argument("--stdio", action="store_true", help="compare the stdio transports (the SDK's, trioloop's)")
    parser.add_argument("--window", type=float, default=10.0, help="--stdio: seconds an endless line may run")
    args = parser.parse_args(argv)
    if args.stdio:
        return _stdio(args.window)
    if args.parts:
        return _parts(args.rounds)
    if args.profile:
        return _profile(args.rounds)
    rows = []
    for size in SIZES:
        samples = trio.run(call_case, args.rounds, size)
        sdk, bounded, ours = (summarize(samples[name]) for name in ("sdk", "sdk_bounded", "trioloop"))
        ratio = round(ours["median"] / sdk["median"], 2)
        like_for_like = round(ours["median"] / bounded["median"], 2)
        emit(
            case_record(
                "mcp",
                f"call text={size}",
                ("mcp", "jsonschema"),
                sdk_us=sdk,
                sdk_bounded_us=bounded,
                trioloop_us=ours,
                ratio=ratio,
                ratio_to_bounded=like_for_like,
            )
        )
        rows.append((f"call, {size} chars", sdk["median"], bounded["median"], ours["median"], ratio, like_for_like))
    render_rows = []
    base = None
    for size in (1_000, 100_000, 10_000_000):
        render = summarize(render_case(size, 50))
        base = base or render["median"]
        emit(case_record("mcp", f"render text={size}", ("mcp",), render_us=render))
        render_rows.append((f"render, {size} chars", render["median"], round(render["median"] / base, 2)))
    print()
    print_table(
        (
            "case",
            "SDK call_tool µs",
            "SDK, timeout + progress µs",
            "trioloop tool µs",
            "ratio",
            "ratio to timeout + progress",
        ),
        rows,
    )
    print("(medians; ratio = trioloop / the bare SDK call)")
    print()
    print_table(("case", "mcp_result_outcome µs (median)", "vs 1000 chars"), render_rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
