"""MCP tools: what trioloop adds to a call over the SDK, and what rendering a result costs as it grows.

Case ``call``: one stdio server (tests/fixtures/mcp_server.py), the same ``echo`` call made through the
SDK's ``Client.call_tool`` directly, through the SDK as trioloop asks it (under a timeout's cancel scope, with
a progress callback), and through a trioloop MCP tool (schema validation, digest, card, the call, sanitizing
and fencing the result); one of each per round in a shuffled order, in the same process and connection.
Case ``render``: ``mcp_result_outcome`` alone (sans-IO) on text results of growing size; it must stay flat,
because nothing past the 8192-byte cap is ever walked.

``--parts`` times each step of the trioloop half alone, right after an SDK call (so with the caches as a real
call leaves them), and ``--profile`` runs cProfile around the trioloop half only.
"""

from __future__ import annotations

import argparse
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

from benchmarks._common import case_record, emit, print_profile, print_table, summarize
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("rounds", type=int, nargs="?", default=200, help="calls of each kind (default 200)")
    parser.add_argument("--parts", action="store_true", help="time each step of the trioloop half instead")
    parser.add_argument("--profile", action="store_true", help="cProfile the trioloop half instead of timing")
    args = parser.parse_args(argv)
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
