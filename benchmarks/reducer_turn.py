"""The reducer alone over one recorded loop turn: the inputs `benchmarks.loop` feeds it, replayed.

Run ``python -m benchmarks.reducer_turn``. One in-process K = 8 turn of ``benchmarks.loop`` is run once
with ``reduce_turn`` recorded; its inputs are then replayed from the idle state (the reducer is pure,
so every replay makes the same states). The replay alternates, in one process, between the shipped
``TurnState.evolved`` and ``attrs.evolve`` in its place, so the same-run ratio shows what the reducer's
cheaper state copy saves per loop iteration, load included on both sides alike. CPU time per
iteration (turn / K). It also counts the state copies one replay makes (deterministic, load-free).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import trio

from benchmarks import loop
from benchmarks._common import case_record, emit, print_table, summarize
from trioloop.machine.reducer import TurnInput, TurnState, reduce_turn
from trioloop.runtime import turn as runner  # the module that calls reduce_turn for the live turn
from trioloop.threatmodel import load_thf


def record_inputs() -> list[TurnInput]:
    """The inputs of one in-process K = 8 turn, in the order the runner applied them."""
    inputs: list[TurnInput] = []
    original = runner.reduce_turn

    def recording(state: TurnState, item: TurnInput) -> TurnState:
        inputs.append(item)
        return original(state, item)

    runner.reduce_turn = recording  # type: ignore[assignment]
    try:
        trio.run(loop.trioloop_in_process, load_thf(loop.PAYMENT_THF), 1)
    finally:
        runner.reduce_turn = original
    return inputs


def replay(inputs: Sequence[TurnInput]) -> TurnState:
    state = TurnState.idle()
    for item in inputs:
        state = reduce_turn(state, item)
    return state


def count_copies(inputs: Sequence[TurnInput]) -> int:
    """How many states the reducer copies (``TurnState.evolved``) over one replay of the turn."""
    shipped = TurnState.evolved
    count = 0

    def counting(self: TurnState, **changes: Any) -> TurnState:
        nonlocal count
        count += 1
        return shipped(self, **changes)

    TurnState.evolved = counting  # type: ignore[method-assign]
    try:
        replay(inputs)
    finally:
        TurnState.evolved = shipped  # type: ignore[method-assign]
    return count


def _with_attrs_evolve(self: TurnState, **changes: Any) -> TurnState:
    return attrs.evolve(self, **changes)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40, help="alternating rounds of both variants")
    parser.add_argument("--replays", type=int, default=50, help="replays of the turn per round")
    args = parser.parse_args(argv)

    inputs = record_inputs()
    if not replay(inputs).is_settled:
        raise RuntimeError("the recorded turn did not settle on replay")
    shipped = TurnState.evolved
    copies = count_copies(inputs)
    variants: dict[str, Callable[..., TurnState]] = {"evolved": shipped, "attrs_evolve": _with_attrs_evolve}
    samples: dict[str, list[float]] = {name: [] for name in variants}
    try:
        for round_ in range(args.rounds):
            order = list(variants) if round_ % 2 == 0 else list(reversed(variants))
            for name in order:
                TurnState.evolved = variants[name]  # type: ignore[method-assign]
                cpu = time.process_time()
                for _ in range(args.replays):
                    replay(inputs)
                samples[name].append((time.process_time() - cpu) / args.replays / loop.K)
    finally:
        TurnState.evolved = shipped  # type: ignore[method-assign]

    stats = {name: summarize(values) for name, values in samples.items()}
    ratio = round(stats["attrs_evolve"]["median"] / stats["evolved"]["median"], 2)
    for name, summary in stats.items():
        emit(case_record("reducer_turn", name, inputs_per_turn=len(inputs), per_iteration_cpu_us=summary))
    emit(case_record("reducer_turn", "ratio_attrs_evolve_vs_evolved", ratio_cpu=ratio, state_copies_per_turn=copies))
    print()
    rows = [(name, s["median"], s["min"], s["p99"]) for name, s in stats.items()]
    print_table(("reducer per iteration, K=8", "cpu med us", "cpu min us", "cpu p99 us"), rows)
    print(f"{len(inputs)} inputs and {copies} state copies per turn ({copies / loop.K:.1f} per iteration)")
    print(f"attrs.evolve / evolved, median CPU: {ratio}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
