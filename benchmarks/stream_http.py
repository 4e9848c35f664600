"""Streaming into reducer state, beside the anthropic SDK: in process, and over loopback HTTP to another process.

Run ``python -m benchmarks.stream_http``. Two parts, each interleaved (one measurement of each
contender in turn, round after round) so drift on a shared machine hits both alike:

- **in process**: the bytes of a text answer of 1k / 10k / 100k deltas, cut in 16 KiB reads, through
  trioloop's SSE decoder, the Anthropic mapper, the per-read text-delta fold and ``reduce_turn`` (the
  state a UI would show), beside the anthropic SDK's ``messages.stream`` accumulating the same bytes
  served by ``httpx.MockTransport`` (its cheapest path). Figures are microseconds per event.
- **over HTTP**: ``benchmarks._sse_server`` runs in a separate process (so only the client is
  measured) and serves the same answer ``paced`` (one HTTP chunk per SSE event, 0.5 ms apart: how a
  live API sends) or ``bulk`` (the whole body at once). trioloop runs whole turns (``run_turn`` with
  ``AnthropicProvider`` over one app-held ``httpx.AsyncClient``); the SDK streams with its own client.
  Figures are the client's process CPU microseconds per event (the paced wall time is mostly the
  server's pauses), with connects per request counted at the server.

A third contender over HTTP, ``httpx_floor``, sends the same request through a bare ``httpx.AsyncClient``
on Trio and drops the body's bytes: the least any client on httpx's async path can cost, so ``SDK /
floor`` is the highest ratio trioloop could reach without leaving httpx. A fourth, ``sdk_async``, is the
SDK's ``AsyncAnthropic`` on Trio (through anyio): the SDK as a Trio application would have to use it.

Every record carries the load average; the ratios are SDK cost / trioloop cost from the same run.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import httpx
import trio

from benchmarks._common import case_record, emit, print_table
from benchmarks._sse_server import MODEL, TABLE, WORDS, server_stats, spawned_server
from benchmarks.stream import _body, run_anthropic_sdk
from trioloop.machine.limits import TurnLimits
from trioloop.machine.reducer import Outcome, Submit, TurnState, reduce_turn
from trioloop.machine.stream_fold import fold_text_deltas
from trioloop.machine.tools import create_tool_registry
from trioloop.providers import AnthropicProvider
from trioloop.providers.anthropic import AnthropicStreamMapper
from trioloop.providers.sse import SseDecoder
from trioloop.runtime.runner import TurnRequest, Workspace, run_turn
from trioloop.threatmodel import THREAT_MODEL, ThreatModel

READ = 16 * 1024
PEERS = ("anthropic",)
_SUBMITTED = reduce_turn(
    TurnState.idle(),
    Submit(turn_id="t", text="go", base_messages=(), tool_set=create_tool_registry([]), limits=TurnLimits(), now_ms=0),
)


# -- in process --------------------------------------------------------------------------------------


def trioloop_to_state(raw: bytes) -> int:
    decoder, mapper, state = SseDecoder(), AnthropicStreamMapper(), _SUBMITTED
    for start in range(0, len(raw), READ):
        events = [event for frame in decoder.feed(raw[start : start + READ]) for event in mapper.feed(frame)]
        for event in fold_text_deltas(events):
            state = reduce_turn(state, event)
    decoder.close()
    for event in mapper.finish():
        state = reduce_turn(state, event)
    assert state.draft is not None
    return len(state.draft.plain_text)


def sdk_to_message(raw: bytes) -> int:
    return run_anthropic_sdk("anthropic", raw)


def in_process(sizes: list[int], repeats: dict[int, int]) -> list[tuple[Any, ...]]:
    rows = []
    for events in sizes:
        raw = _body("anthropic", events)
        found: dict[str, list[float]] = {"trioloop": [], "sdk": []}
        for fn in (trioloop_to_state, sdk_to_message):  # warm-up
            fn(_body("anthropic", 10))
        for _ in range(repeats.get(events, 3)):
            for name, fn in (("trioloop", trioloop_to_state), ("sdk", sdk_to_message)):
                gc.collect()
                start = time.perf_counter()
                fn(raw)
                found[name].append((time.perf_counter() - start) / events * 1e6)
        med = {name: statistics.median(values) for name, values in found.items()}
        ratio = round(med["sdk"] / med["trioloop"], 2)
        emit(
            case_record(
                "stream_http",
                f"in_process/{events}",
                PEERS,
                events=events,
                trioloop_us_per_event=round(med["trioloop"], 2),
                sdk_us_per_event=round(med["sdk"], 2),
                samples=len(found["sdk"]),
                ratio_sdk_over_trioloop=ratio,
            )
        )
        rows.append(
            (
                f"in process, {events} events",
                round(med["trioloop"], 2),
                round(med["sdk"], 2),
                f"{ratio}x",
                "",
                "",
                "",
                "",
            )
        )
    return rows


# -- over HTTP, server in another process -------------------------------------------------------------


def trioloop_requests(base: str, events: int, count: int, *, key: str = "k") -> list[tuple[float, float]]:
    """Whole turns through `AnthropicProvider` on one app-held client, each timed to its settled state (the
    key scrubber runs over every event, so a real key's length, ``key``, prices it as users pay it)."""
    expected = sum(len(WORDS[i % len(WORDS)]) for i in range(events))

    async def main() -> list[tuple[float, float]]:
        samples = []
        async with httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(30.0, read=None)) as client:
            provider = AnthropicProvider(key, base_url=base, client=client, retry=None, model_table=TABLE)
            for i in range(count):
                wall, cpu = time.perf_counter(), time.process_time()
                state = await run_turn(
                    TurnRequest(text="go", turn_id=f"t{i}", model=MODEL),
                    Workspace(document=ThreatModel(), kind=THREAT_MODEL),
                    provider,
                )
                samples.append((time.perf_counter() - wall, time.process_time() - cpu))
                if state.outcome is not Outcome.COMPLETED or state.draft is None:
                    raise RuntimeError(f"unexpected turn: {state.outcome}")
                if len(state.draft.plain_text) != expected:
                    raise RuntimeError(f"trioloop showed {len(state.draft.plain_text)} characters, not {expected}")
        return samples

    return trio.run(main)


def httpx_floor_requests(base: str, events: int, count: int) -> list[tuple[float, float]]:
    """The floor under any client of ``httpx.AsyncClient`` on Trio: the same request, the body's bytes
    iterated and dropped (no SSE, no events, no state). trioloop cannot cost less than this."""
    body = json.dumps(
        {"model": MODEL, "max_tokens": 10, "stream": True, "messages": [{"role": "user", "content": "go"}]}
    ).encode()

    async def main() -> list[tuple[float, float]]:
        samples = []
        async with httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(30.0, read=None)) as client:
            for _ in range(count):
                wall, cpu = time.perf_counter(), time.process_time()
                received = 0
                async with client.stream("POST", base + "/v1/messages", content=body) as response:
                    async for chunk in response.aiter_raw():
                        received += len(chunk)
                samples.append((time.perf_counter() - wall, time.process_time() - cpu))
                if response.status_code != 200 or not received:
                    raise RuntimeError(f"floor request failed: HTTP {response.status_code}")
        return samples

    return trio.run(main)


def sdk_requests(base: str, events: int, count: int) -> list[tuple[float, float]]:
    import anthropic

    samples = []
    with anthropic.Anthropic(api_key="k", base_url=base, max_retries=0) as client:
        for _ in range(count):
            wall, cpu = time.perf_counter(), time.process_time()
            messages: Any = [{"role": "user", "content": "go"}]
            with client.messages.stream(model=MODEL, max_tokens=10, messages=messages) as stream:
                counted = sum(1 for event in stream if event.type == "text")
                final = stream.get_final_message()
            samples.append((time.perf_counter() - wall, time.process_time() - cpu))
            if counted != events or not final.content:
                raise RuntimeError(f"SDK counted {counted} text events, expected {events}")
    return samples


def async_sdk_requests(base: str, events: int, count: int) -> list[tuple[float, float]]:
    """The SDK's async client on Trio (through anyio), as a Trio app would have to use it."""
    import anthropic

    async def main() -> list[tuple[float, float]]:
        samples = []
        async with anthropic.AsyncAnthropic(api_key="k", base_url=base, max_retries=0) as client:
            for _ in range(count):
                wall, cpu = time.perf_counter(), time.process_time()
                messages: Any = [{"role": "user", "content": "go"}]
                async with client.messages.stream(model=MODEL, max_tokens=10, messages=messages) as stream:
                    counted = 0
                    async for event in stream:
                        counted += event.type == "text"
                    final = await stream.get_final_message()
                samples.append((time.perf_counter() - wall, time.process_time() - cpu))
                if counted != events or not final.content:
                    raise RuntimeError(f"async SDK counted {counted} text events, expected {events}")
        return samples

    return trio.run(main)


def over_http(url: str, cases: list[tuple[str, int]], rounds: int, per_round: int) -> list[tuple[Any, ...]]:
    rows = []
    contenders: tuple[tuple[str, Callable[[str, int, int], list[tuple[float, float]]]], ...] = (
        ("trioloop", trioloop_requests),
        ("sdk", sdk_requests),
        ("sdk_async", async_sdk_requests),
        ("httpx_floor", httpx_floor_requests),
    )
    for mode, events in cases:
        base = f"{url}/{mode}/{events}"
        for _, fn in contenders:
            fn(base, events, 2)  # warm-up: imports, first connection
        cpu: dict[str, list[float]] = {name: [] for name, _ in contenders}
        wall: dict[str, list[float]] = {name: [] for name, _ in contenders}
        connects: dict[str, list[float]] = {name: [] for name, _ in contenders}
        for _ in range(rounds):
            for name, fn in contenders:
                gc.collect()
                before = server_stats(url)
                samples = fn(base, events, per_round)
                after = server_stats(url)
                # one connection of the difference is our own /stats request
                connects[name].append((after["connections"] - before["connections"] - 1) / per_round)
                cpu[name] += [c / events * 1e6 for _, c in samples]
                wall[name] += [w / events * 1e6 for w, _ in samples]
        med_cpu = {name: statistics.median(values) for name, values in cpu.items()}
        med_wall = {name: statistics.median(values) for name, values in wall.items()}
        per_request = {name: round(statistics.mean(values), 3) for name, values in connects.items()}
        ratio = round(med_cpu["sdk"] / med_cpu["trioloop"], 2)
        ceiling = round(med_cpu["sdk"] / med_cpu["httpx_floor"], 2)
        ratio_async = round(med_cpu["sdk_async"] / med_cpu["trioloop"], 2)
        emit(
            case_record(
                "stream_http",
                f"http_{mode}/{events}",
                PEERS,
                events=events,
                mode=mode,
                trioloop_cpu_us_per_event=round(med_cpu["trioloop"], 2),
                sdk_cpu_us_per_event=round(med_cpu["sdk"], 2),
                trioloop_wall_us_per_event=round(med_wall["trioloop"], 2),
                sdk_wall_us_per_event=round(med_wall["sdk"], 2),
                sdk_async_cpu_us_per_event=round(med_cpu["sdk_async"], 2),
                httpx_floor_cpu_us_per_event=round(med_cpu["httpx_floor"], 2),
                connects_per_request=per_request,
                requests=len(cpu["sdk"]),
                ratio_sdk_over_trioloop_cpu=ratio,
                ratio_sdk_async_over_trioloop_cpu=ratio_async,
                ratio_sdk_over_httpx_floor_cpu=ceiling,
                trioloop_above_floor_us_per_event=round(med_cpu["trioloop"] - med_cpu["httpx_floor"], 2),
            )
        )
        rows.append(
            (
                f"HTTP {mode}, {events} events (cpu)",
                round(med_cpu["trioloop"], 2),
                round(med_cpu["sdk"], 2),
                f"{ratio}x",
                f"{ratio_async}x",
                round(med_cpu["httpx_floor"], 2),
                f"{ceiling}x",
                f"{per_request['trioloop']} / {per_request['sdk']}",
            )
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", type=int, nargs="*", default=[1_000, 10_000, 100_000])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the HTTP cases")
    parser.add_argument("--per-round", type=int, default=4, help="requests per contender per round")
    parser.add_argument("--paced-events", type=int, default=300)
    parser.add_argument("--bulk-events", type=int, default=10_000)
    parser.add_argument("--skip-in-process", action="store_true")
    args = parser.parse_args(argv)
    rows: list[tuple[Any, ...]] = []
    if not args.skip_in_process:
        rows += in_process(sorted(args.sizes), {1_000: 15, 10_000: 5, 100_000: 2})
    with spawned_server() as url:
        rows += over_http(url, [("paced", args.paced_events), ("bulk", args.bulk_events)], args.rounds, args.per_round)
    print()
    print_table(
        (
            "us per event",
            "trioloop",
            "anthropic SDK",
            "SDK / trioloop",
            "async SDK / trioloop",
            "httpx floor",
            "SDK / floor",
            "connects/request (t / sdk)",
        ),
        rows,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
