"""Reducer throughput: events per second for long streamed answers and for iterations with many calls.

Run ``python -m benchmarks.reducer``. Prints one JSON object per case, then a short table. The figure
that matters is ``per_event_ratio_100k_vs_1k``: appending a delta must cost the same whether the answer
is short or long (target <= 1.5), which holds only if no step copies the whole text or history.
``per_call_ratio_20k_vs_1k`` is the same check for hostile volume: one response carrying 1k / 10k /
20k tool calls, all but the per-iteration cap refused (target <= 1.5: no step scans or copies the
calls so far).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import attrs

from trioloop.machine.reducer import (
    Advance,
    ApproveBatch,
    CallSettled,
    StartCall,
    Submit,
    TurnInput,
    TurnState,
    reduce_turn,
)
from trioloop.machine.tool_input import tool_field
from trioloop.machine.tools import ToolOutcome, create_tool_registry
from trioloop.protocol import MessageStart, MessageStop, TextDelta, ToolCallComplete
from trioloop.runtime.tools import define_executable_tool


@attrs.frozen(kw_only=True)
class _Input:
    name: str = tool_field(min_length=1)


_TOOL = define_executable_tool(
    name="rename",
    description="Rename something.",
    effect="mutate",
    destructive=False,
    input_type=_Input,
    run=lambda value, ctx: ToolOutcome.success("renamed"),
    summarize=lambda value: f"Rename to {value.name}",
)
_REGISTRY = create_tool_registry([_TOOL])


def _submit() -> Submit:
    return Submit(turn_id="bench", text="go", tool_set=_REGISTRY, now_ms=0)


def text_case(deltas: int) -> list[TurnInput]:
    inputs: list[TurnInput] = [_submit(), MessageStart(model="bench")]
    inputs.extend(TextDelta(text=f"token{i} ") for i in range(deltas))
    inputs.append(MessageStop(stop_reason="end_turn"))
    return inputs


def calls_case(calls: int) -> list[TurnInput]:
    ids = tuple(f"call_{i}" for i in range(calls))
    inputs: list[TurnInput] = [_submit(), MessageStart(model="bench"), TextDelta(text="Let me do that.")]
    inputs.extend(ToolCallComplete(id=i, name="rename", input={"name": i}) for i in ids)
    inputs.append(MessageStop(stop_reason="tool_use"))
    inputs.append(ApproveBatch(call_ids=ids))
    for i in ids:
        inputs.append(StartCall(call_id=i, now_ms=1))
        inputs.append(CallSettled(call_id=i, outcome=ToolOutcome.success("renamed"), now_ms=2))
    inputs.extend([Advance(now_ms=3), MessageStart(model="bench"), MessageStop(stop_reason="end_turn")])
    return inputs


def flood_case(calls: int) -> list[TurnInput]:
    """One response with ``calls`` tool calls: the first ones up to the cap run, the rest are refused."""
    ids = tuple(f"call_{i}" for i in range(calls))
    inputs: list[TurnInput] = [_submit(), MessageStart(model="bench")]
    inputs.extend(ToolCallComplete(id=i, name="rename", input={"name": "n"}) for i in ids)
    inputs.append(MessageStop(stop_reason="tool_use"))
    inputs.append(ApproveBatch(call_ids=ids))
    for i in ids[:12]:  # the default per-iteration cap
        inputs.append(StartCall(call_id=i, now_ms=1))
        inputs.append(CallSettled(call_id=i, outcome=ToolOutcome.success("renamed"), now_ms=2))
    inputs.extend([Advance(now_ms=3), MessageStart(model="bench"), MessageStop(stop_reason="end_turn")])
    return inputs


def _run(inputs: Sequence[TurnInput]) -> TurnState:
    state = TurnState.idle()
    for item in inputs:
        state = reduce_turn(state, item)
    return state


def measure(name: str, build: Callable[[], list[TurnInput]], repeat: int) -> dict[str, Any]:
    inputs = build()
    best = best_cpu = float("inf")
    for _ in range(repeat):
        started, started_cpu = time.perf_counter(), time.process_time()
        final = _run(inputs)
        best = min(best, time.perf_counter() - started)
        best_cpu = min(best_cpu, time.process_time() - started_cpu)
    assert final.is_settled, name
    return {
        "case": name,
        "events": len(inputs),
        "seconds": round(best, 6),
        "events_per_second": round(len(inputs) / best),
        "us_per_event": round(best / len(inputs) * 1e6, 3),
        "cpu_us_per_event": round(best_cpu / len(inputs) * 1e6, 3),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeat", type=int, default=3, help="runs per case; the best is reported")
    args = parser.parse_args(argv)
    results = [measure(f"text_deltas_{n}", partial(text_case, n), args.repeat) for n in (1_000, 10_000, 100_000)]
    results += [measure(f"tool_calls_{n}", partial(calls_case, n), args.repeat) for n in (1, 12, 32)]
    results += [measure(f"call_flood_{n}", partial(flood_case, n), args.repeat) for n in (1_000, 10_000, 20_000)]
    for row in results:
        print(json.dumps(row))
    ratio = results[2]["us_per_event"] / results[0]["us_per_event"]
    flood = results[8]["us_per_event"] / results[6]["us_per_event"]
    flood_cpu = results[8]["cpu_us_per_event"] / results[6]["cpu_us_per_event"]
    print(json.dumps({"case": "per_event_ratio_100k_vs_1k", "ratio": round(ratio, 3), "target": 1.5}))
    print(
        json.dumps(
            {
                "case": "per_call_ratio_20k_vs_1k",
                "ratio": round(flood, 3),
                "cpu_ratio": round(flood_cpu, 3),
                "target": 1.5,
            }
        )
    )
    print()
    print(f"{'case':<22}{'events':>9}{'events/s':>12}{'us/event':>10}{'cpu us/event':>14}")
    for row in results:
        print(
            f"{row['case']:<22}{row['events']:>9}{row['events_per_second']:>12}{row['us_per_event']:>10}"
            f"{row['cpu_us_per_event']:>14}"
        )
    print(f"per-event cost, 100k vs 1k text deltas: {ratio:.2f}x (target <= 1.5)")
    print(f"per-call cost, 20k vs 1k calls in one response: {flood:.2f}x wall, {flood_cpu:.2f}x CPU (target <= 1.5)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
