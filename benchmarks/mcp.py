"""MCP tools: what trioloop adds to a call over the SDK, and what rendering a result costs as it grows.

Case ``call``: one stdio server (tests/fixtures/mcp_server.py), the same ``echo`` call made through the
SDK's ``Client.call_tool`` directly and through a trioloop MCP tool (schema validation, digest, card, the
call, sanitizing and fencing the result), interleaved one each, in the same process and connection.
Case ``render``: ``mcp_result_outcome`` alone (sans-IO) on text results of growing size; it must stay flat,
because nothing past the 8192-byte cap is ever walked.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from benchmarks._common import case_record, emit, print_table, summarize
from trioloop.machine.tools import PreparedCall
from trioloop.runtime.tools import ToolExecutionContext

SERVER = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "mcp_server.py"


def _no_document() -> Any:
    raise AssertionError("MCP tools never read the document")


async def call_case(rounds: int, text_size: int) -> dict[str, list[float]]:
    from trioloop.mcp import McpToolset, StdioServer

    toolset = McpToolset(StdioServer(name="fx", command=sys.executable, args=(str(SERVER), "stdio")))
    samples: dict[str, list[float]] = {"sdk": [], "trioloop": []}
    text = "w" * text_size
    async with trio.open_nursery() as nursery:
        tools = {tool.name: tool for tool in await nursery.start(toolset.run)}
        echo = tools["fx__echo"]
        client = toolset._connection.client  # type: ignore[union-attr]  # the same connection, for the SDK side
        for _ in range(rounds):
            start = time.perf_counter()
            await client.call_tool("echo", {"text": text})
            samples["sdk"].append(time.perf_counter() - start)
            start = time.perf_counter()
            prepared = echo.prepare({"text": text})
            assert isinstance(prepared, PreparedCall)
            outcome = await prepared.run(ToolExecutionContext.deferred(_no_document, cancel_scope=trio.CancelScope()))
            assert outcome.ok
            samples["trioloop"].append(time.perf_counter() - start)
        nursery.cancel_scope.cancel()
    return samples


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


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    rounds = int(args[0]) if args else 200
    rows = []
    for size in (100, 20_000):
        samples = trio.run(call_case, rounds, size)
        sdk, ours = summarize(samples["sdk"]), summarize(samples["trioloop"])
        ratio = round(ours["median"] / sdk["median"], 2)
        emit(case_record("mcp", f"call text={size}", ("mcp", "jsonschema"), sdk_us=sdk, trioloop_us=ours, ratio=ratio))
        rows.append((f"call, {size} chars", sdk["median"], ours["median"], ratio))
    render_rows = []
    base = None
    for size in (1_000, 100_000, 10_000_000):
        render = summarize(render_case(size, 50))
        base = base or render["median"]
        emit(case_record("mcp", f"render text={size}", ("mcp",), render_us=render))
        render_rows.append((f"render, {size} chars", render["median"], round(render["median"] / base, 2)))
    print()
    print_table(("case", "SDK call_tool µs (median)", "trioloop tool µs (median)", "ratio"), rows)
    print()
    print_table(("case", "mcp_result_outcome µs (median)", "vs 1000 chars"), render_rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
