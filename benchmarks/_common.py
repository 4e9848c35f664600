"""Shared pieces of the benchmarks: timing summaries, the report format, and an in-process provider.

Every script prints one JSON object per case (built with ``case_record``, so each carries the machine and
the versions of everything compared) followed by a short table. ``InProcessProvider`` implements the
``ChatProvider`` protocol without a socket: it sends, for each request, exactly the ``StreamEvent``s the
loopback HTTP path would produce for the same scripted answer, so a timing with it isolates the loop
from the transport.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import pstats
import statistics
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

import trio

from benchmarks._load import load_line as _load_line
from benchmarks._load import run_info
from trioloop.protocol.events import Aborted, StopReason, StreamEvent, is_terminal
from trioloop.protocol.messages import JsonValue, Message, ToolCallBlock, ToolResultBlock
from trioloop.protocol.provider import send_events
from trioloop.protocol.tools import ChatRequest
from trioloop.providers.anthropic import ANTHROPIC_WIRE
from trioloop.providers.base import WireResponse, map_chunks

__all__ = [
    "PAYMENT_THF",
    "InProcessProvider",
    "case_record",
    "emit",
    "iteration_of",
    "load_line",
    "machine",
    "percentile",
    "print_profile",
    "print_table",
    "profile_breakdown",
    "summarize",
    "versions",
    "wire_events",
]

PAYMENT_THF = Path(__file__).resolve().parent.parent / "examples" / "payment.thf"

#: Distributions whose versions every record carries when installed (the peers only where compared).
_CORE_DISTS = ("trioloop", "trio", "httpx", "h11", "attrs", "cattrs")


# -- statistics ------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100): an observed value, never an interpolation between two."""
    if not values:
        raise ValueError("no samples")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summarize(samples: Sequence[float], *, scale: float = 1e6, digits: int = 1) -> dict[str, Any]:
    """Median, p99, min and max of ``samples`` (seconds) in the unit ``scale`` gives (default µs)."""
    return {
        "n": len(samples),
        "median": round(statistics.median(samples) * scale, digits),
        "p99": round(percentile(samples, 99) * scale, digits),
        "min": round(min(samples) * scale, digits),
        "max": round(max(samples) * scale, digits),
    }


# -- environment -----------------------------------------------------------------------------------


@cache
def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def machine() -> dict[str, Any]:
    """Where the figures came from: core count, CPU model, OS, Python, load average, date (UTC), and the run's
    own circumstances (`benchmarks._load.run_info`): others' CPU during the run where the benchmark sampled it
    (``load_during_run``), the processes it measured in, the helpers it started, the priority in effect.

    The load matters: a wall-clock window longer than a scheduler time slice on a busy machine stretches by the
    competing load, which is why the scripts report CPU time beside wall time.
    """
    return {
        "nproc": os.cpu_count(),
        "cpu": _cpu_model(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "loadavg": _loadavg(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
        **run_info(),
    }


def load_line() -> str:
    """The load line of a summary table: others' CPU during the run (mean / max), load average, cores, priority."""
    return _load_line(_loadavg())


def versions(*extra: str) -> dict[str, str]:
    """Installed versions of trioloop's stack plus the ``extra`` distributions (``missing`` if absent)."""
    found: dict[str, str] = {"python": sys.version.split()[0]}
    for name in (*_CORE_DISTS, *extra):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "missing"
    return found


# -- reporting -------------------------------------------------------------------------------------


def case_record(bench: str, case: str, peers: Iterable[str] = (), **fields: Any) -> dict[str, Any]:
    """One JSON-ready result: the bench and case names, the figures, the versions and the machine."""
    return {"bench": bench, "case": case, **fields, "versions": versions(*peers), "machine": machine()}


def emit(record: Mapping[str, Any]) -> None:
    print(json.dumps(record, ensure_ascii=False), flush=True)


def print_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """A plain, right-aligned text table (first column left-aligned)."""
    body = [[str(cell) for cell in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        first, *rest = cells
        return "  ".join([first.ljust(widths[0]), *(c.rjust(w) for c, w in zip(rest, widths[1:], strict=True))])

    print(line(headers))
    print(line(["-" * w for w in widths]))
    for row in body:
        print(line(row))


# -- profiling -------------------------------------------------------------------------------------

_GROUPS = (
    ("trioloop/providers/_loopback", "trioloop loopback server"),
    ("trioloop/providers", "trioloop providers (transport, SSE, mapper)"),
    ("trioloop/loop", "trioloop loop (reducer, runner, session, tools runtime)"),
    ("trioloop/protocol", "trioloop protocol (messages, budget, events)"),
    ("trioloop/tools", "trioloop tools"),
    ("trioloop/document", "trioloop document"),
    ("benchmarks/", "benchmark harness"),
    ("/trio/", "trio"),
    ("/httpx/", "httpx"),
    ("/httpcore/", "httpcore"),
    ("/h11/", "h11"),
    ("/attr/", "attrs"),
    ("/cattrs/", "cattrs"),
    ("/pydantic_ai/", "pydantic-ai"),
    ("/pydantic_graph/", "pydantic-graph"),
    ("/pydantic/", "pydantic"),
    ("/pydantic_core/", "pydantic"),
    ("/anyio/", "anyio"),
    ("/json/", "json (stdlib)"),
    ("/asyncio/", "asyncio (stdlib)"),
)


def profile_breakdown(stats: pstats.Stats, top: int = 12) -> list[tuple[str, float]]:
    """Own time (tottime) summed per library, largest first, as fractions of the total."""
    totals: dict[str, float] = {}
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    for (filename, _, _), (_, _, tottime, _, _) in raw.items():
        group = next((name for marker, name in _GROUPS if marker in filename), None)
        if group is None:
            group = "builtins (C calls)" if filename == "~" else "other (stdlib, contextlib, outcome, ...)"
        totals[group] = totals.get(group, 0.0) + tottime
    whole = sum(totals.values()) or 1.0
    ranked = sorted(totals.items(), key=lambda item: -item[1])[:top]
    return [(name, value / whole) for name, value in ranked]


def print_profile(stats: pstats.Stats, top: int = 25) -> None:
    """The top functions by own time, then own time per library."""
    stats.sort_stats("tottime").print_stats(top)
    print("own time by library:")
    for name, share in profile_breakdown(stats):
        print(f"  {share:6.1%}  {name}")


# -- an in-process provider ------------------------------------------------------------------------


def wire_body(text: str = "", calls: Sequence[tuple[str, str, JsonValue]] = (), *, model: str = "scripted-1") -> bytes:
    """This answer as the Anthropic Messages API streams it (SSE bytes); ``calls`` are (id, tool name, input)."""
    blocks = tuple(ToolCallBlock(id=i, name=n, input=v) for i, n, v in calls)
    stop = StopReason.TOOL_USE if blocks else StopReason.END_TURN
    return ANTHROPIC_WIRE.render_stream(
        WireResponse(model=model, text=text, tool_calls=blocks, stop_reason=stop, input_tokens=100, output_tokens=10)
    )


@cache
def _wire_events_cached(text: str, calls: tuple[tuple[str, str, str], ...], model: str) -> tuple[StreamEvent, ...]:
    body = wire_body(text, [(i, n, json.loads(raw)) for i, n, raw in calls], model=model)
    return tuple(map_chunks(ANTHROPIC_WIRE.new_mapper(), [body]))


def wire_events(
    text: str = "", calls: Sequence[tuple[str, str, JsonValue]] = (), *, model: str = "scripted-1"
) -> tuple[StreamEvent, ...]:
    """The events the Anthropic wire path yields for this answer (rendered to SSE, then mapped back).

    ``calls`` are (id, tool name, input). The result is cached, so a replay costs no rendering or parsing.
    """
    key = tuple((i, n, json.dumps(v, sort_keys=True)) for i, n, v in calls)
    return _wire_events_cached(text, key, model)


def iteration_of(request: ChatRequest) -> int:
    """Which iteration of the current turn ``request`` opens (0 for the first), read from its messages.

    Counts the assistant messages after the user's prompt (a user message that is not tool results), so
    one stateless provider can serve any number of concurrent sessions.
    """
    count = 0
    for message in reversed(request.messages):
        if message.role == "assistant":
            count += 1
        elif not _is_tool_results(message):
            break
    return count


def wire_iteration_of(body: Any) -> int:
    """`iteration_of` for an Anthropic Messages request body as JSON (what a loopback server receives)."""
    count = 0
    for message in reversed(body["messages"]):
        content = message["content"]
        if message["role"] == "assistant":
            count += 1
        elif not (isinstance(content, list) and content and content[0].get("type") == "tool_result"):
            break
    return count


def _is_tool_results(message: Message) -> bool:
    # A results message holds tool results only (the runner never mixes them with text): its first
    # block says which kind it is, as pydantic-ai's harness checks one isinstance per message.
    return bool(message.content) and isinstance(message.content[0], ToolResultBlock)


class InProcessProvider:
    """A ``ChatProvider`` with no transport: ``answer(request)`` picks the events, they are sent in order.

    By default the whole answer is handed over as one read (``send_events``: one batch when the consumer
    takes batches), as the HTTP provider forwards the events of one network read; with
    ``batched=False`` each event goes through its own ``await send.send(...)``. Only sockets, HTTP, SSE
    parsing and mapping are skipped.
    """

    def __init__(self, answer: Callable[[ChatRequest], Sequence[StreamEvent]], *, batched: bool = True) -> None:
        self._answer = answer
        self._batched = batched
        self.requests = 0

    async def stream(
        self,
        request: ChatRequest,
        send: trio.abc.SendChannel[StreamEvent],
        *,
        cancel_scope: trio.CancelScope | None = None,
    ) -> None:
        self.requests += 1
        events = self._answer(request)
        if cancel_scope is None and self._batched:
            await send_events(send, events)
            return
        if cancel_scope is None:
            for event in events:
                await send.send(event)
            return
        sent_terminal = False
        with cancel_scope:
            for event in events:
                await send.send(event)
                sent_terminal = is_terminal(event)
        if cancel_scope.cancelled_caught and not sent_terminal:
            await send.send(Aborted())
