"""What approval rules cost: deciding one call against 50 rules, and admitting a call through the reducer with and
without rules.

Run ``python -m benchmarks.rules``. Prints one JSON object per case, then a table. The targets (issue 50): rule
evaluation costs <= 5 us per call with 50 rules (``decide`` cases: `RuleSet.deciding` plus `decide_call`, the
per-tool candidates already found, as in every call of a turn after its first), and a turn without rules pays
nothing for them (``admit`` cases: one `ToolCallComplete` through `reduce_turn`, no rules against 50 rules,
measured interleaved in the same process so the ratio holds under the same load). The first call of each tool
in a turn also finds the tool's candidate rules (``first_call``); that figure is reported too.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable
from typing import Any

import attrs

from benchmarks._common import case_record, emit, print_table, summarize
from trioloop.machine.conditions import Condition
from trioloop.machine.reducer import Submit, TurnState, reduce_turn
from trioloop.machine.rules import ApprovalRule, RuleSet, decide_call, numbered
from trioloop.machine.tool_input import tool_field
from trioloop.machine.tools import ToolOutcome, create_tool_registry
from trioloop.protocol import MessageStart, ToolCallComplete
from trioloop.runtime.tools import define_executable_tool


@attrs.frozen(kw_only=True)
class _Write:
    path: str = tool_field(min_length=1)
    size: int = 0
    mode: str = "w"


def _tool(name: str) -> Any:
    return define_executable_tool(
        name=name,
        description=name,
        effect="mutate",
        destructive=False,
        input_type=_Write,
        run=lambda value, ctx: ToolOutcome.success("ok"),
        summarize=lambda value: f"{name} {value.path}",
    )


TOOLS = ("write_file", "delete_file", "gh__create_issue", "gh__comment", "fs__move")
REGISTRY = create_tool_registry([_tool(name) for name in TOOLS])


def fifty_rules() -> RuleSet:
    """50 rules of every kind, most of them naming the tool the benchmark calls (the worst case: each is tried)."""
    made: list[ApprovalRule] = []
    for i in range(10):
        made.append(ApprovalRule(tool="write_file", verdict="allow", when=(Condition.glob("/path", f"docs{i}/**"),)))
        made.append(ApprovalRule(tool="write_*", verdict="ask", when=(Condition.prefix("/path", f"/etc{i}"),)))
        made.append(ApprovalRule(tool="**", verdict="deny", when=(Condition.equals("/mode", f"x{i}"),), reason="no"))
        made.append(ApprovalRule(tool="gh__*", verdict="allow", when=(Condition.in_range("/size", 0, i),)))
        made.append(
            ApprovalRule(tool="write_file", verdict="allow", when=(Condition.one_of("/mode", ["a", "w", f"m{i}"]),))
        )
    return RuleSet(numbered(made))


def _timed(fn: Callable[[], object], rounds: int) -> list[float]:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return samples


def decide_cases(rounds: int, per: int) -> list[dict[str, Any]]:
    rules = fifty_rules()
    inputs = [{"path": f"docs{i % 12}/page.md", "size": i, "mode": "w"} for i in range(per)]

    def decide_all() -> None:
        for canonical in inputs:
            rule = rules.deciding("write_file", canonical)
            decide_call(effect="mutate", destructive=False, rule=rule, code=None)

    def first_calls() -> None:
        for canonical in inputs[:20]:
            fresh = RuleSet(rules.rules)  # no candidates found yet: the first call of a tool in a turn
            rule = fresh.deciding("write_file", canonical)
            decide_call(effect="mutate", destructive=False, rule=rule, code=None)

    decide_all()
    gc.collect()
    steady = [s / per for s in _timed(decide_all, rounds)]
    first = [s / 20 for s in _timed(first_calls, rounds)]
    return [
        case_record("rules", "decide_50_rules", per_call_us=summarize(steady, digits=2), target_us=5.0),
        case_record("rules", "first_call_50_rules", per_call_us=summarize(first, digits=2)),
    ]


def admit_cases(rounds: int, per: int) -> list[dict[str, Any]]:
    base = Submit(turn_id="t", text="go", tool_set=REGISTRY, now_ms=0)
    ruled = attrs.evolve(base, rules=fifty_rules())
    starts = {
        name: reduce_turn(reduce_turn(TurnState.idle(), submit), MessageStart(model="m"))
        for name, submit in (("none", base), ("fifty", ruled))
    }
    events = [ToolCallComplete(id=f"c{i}", name="write_file", input={"path": f"src/{i}.py"}) for i in range(per)]

    def admit(state: TurnState) -> None:
        for event in events:
            reduce_turn(state, event)  # each call admitted into the same state: the admission alone

    samples: dict[str, list[float]] = {"none": [], "fifty": []}
    for _ in range(rounds):  # interleaved: both see the same load
        for name, state in starts.items():
            started = time.perf_counter()
            admit(state)
            samples[name].append((time.perf_counter() - started) / per)
    none, fifty = summarize(samples["none"], digits=2), summarize(samples["fifty"], digits=2)
    return [
        case_record("rules", "admit_no_rules", per_call_us=none),
        case_record(
            "rules", "admit_50_rules", per_call_us=fifty, over_no_rules_us=round(fifty["median"] - none["median"], 2)
        ),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--per", type=int, default=200)
    args = parser.parse_args(argv)
    records = [*decide_cases(args.rounds, args.per), *admit_cases(args.rounds, args.per)]
    for record in records:
        emit(record)
    print_table(
        ["case", "median us/call", "p99", "min"],
        [(r["case"], r["per_call_us"]["median"], r["per_call_us"]["p99"], r["per_call_us"]["min"]) for r in records],
    )
    print(f"load average: {records[0]['machine']['loadavg']}")


if __name__ == "__main__":
    main()
