"""Cancellation latency: Stop with 1, 12 and 100 running tools, and the overshoot of a 50 ms turn deadline.

Run ``python -m benchmarks.cancel``. Stop case: the model asks for n read tools that sleep forever; once
all n are inside their sleep and every task is blocked, ``TurnControls.stop()`` is called and the clock
runs until the runner publishes the settled state. The floor, measured in the same run and interleaved
with it, is a bare Trio nursery of n sleeping tasks cancelled through its scope, timed until the nursery
exits. Each n runs twice: warm (no forced collection) and cold (``gc.collect()`` before every
measurement of either kind). Target: trioloop's median at most 3x the floor's. The tools come in two
kinds: ``hang`` never reads ``ctx.document`` (so no copy of it is ever made), ``hold`` reads it before
waiting, so each holds its own copy and Stop frees n copies as the tools unwind; for ``hold`` a second
floor is measured too, bare tasks that each make and keep the same copy (the same work, no runner), and
the ratio to it is the runner's own share. Deadline case: a turn with
``turn_deadline_ms=50`` whose stream stalls, once over loopback HTTP from a server in a separate process
(``benchmarks._sse_server``, ``stall`` mode: 200 bytes of the answer, then silence; the Anthropic
provider on its own keep-alive client) and once from an in-process provider that goes silent after its
first events (the runner alone, no HTTP teardown); the overshoot is the settled time minus (start + 50 ms), beside a
bare ``CancelScope(deadline=...)`` around ``sleep_forever`` parked at once (the target's floor), and
once more parked at a random phase within Trio's 1 ms timer granularity (what Trio gives a deadline set at
an arbitrary moment; see ``_bare_overshoot``). All times are the real clock.
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from collections.abc import Sequence
from functools import partial
from typing import Any

import attrs
import httpx
import trio
import trio.testing

from benchmarks._common import (
    PAYMENT_THF,
    InProcessProvider,
    case_record,
    emit,
    iteration_of,
    print_table,
    summarize,
    wire_events,
)
from benchmarks._sse_server import MODEL, TABLE, server_stats, spawned_server
from trioloop.machine.limits import TurnLimits
from trioloop.machine.reducer import CallStatus, Cancel, Outcome, TurnState, reduce_turn
from trioloop.machine.tool_input import tool_field
from trioloop.machine.tools import ToolOutcome, create_tool_registry
from trioloop.protocol.events import StreamEvent
from trioloop.protocol.tools import ChatRequest
from trioloop.providers import AnthropicProvider
from trioloop.providers.base import ChatProvider
from trioloop.runtime.controls import TurnControls
from trioloop.runtime.runner import TurnRequest, Workspace, run_turn
from trioloop.runtime.tools import ToolExecutionContext, define_executable_tool
from trioloop.threatmodel import THREAT_MODEL, ThreatModel, load_thf
from trioloop.threatmodel.model import detached_copy

TOOL_COUNTS = (1, 12, 100)
DEADLINE_MS = 50
STALLED_TEXT = "The answer starts and then the stream stalls."
#: Room for 100 calls in one iteration (the defaults allow 12).
LIMITS = TurnLimits(max_tool_calls_per_iteration=100, max_tool_calls_per_turn=100)


class _Sleepers:
    """Counts tools that reached their sleep; ``all_in`` fires when the expected number did."""

    def __init__(self) -> None:
        self.expected = 0
        self.entered = 0
        self.all_in = trio.Event()

    def reset(self, expected: int) -> None:
        self.expected, self.entered, self.all_in = expected, 0, trio.Event()

    async def sleep(self) -> None:
        self.entered += 1
        if self.entered == self.expected:
            self.all_in.set()
        await trio.sleep_forever()


SLEEPERS = _Sleepers()


@attrs.frozen(kw_only=True)
class HangInput:
    id: str = tool_field(description="Which wait.", min_length=1, max_length=16)


async def _hang(request: HangInput, ctx: ToolExecutionContext) -> ToolOutcome:
    await SLEEPERS.sleep()
    return ToolOutcome.success("unreachable")


async def _hold(request: HangInput, ctx: ToolExecutionContext) -> ToolOutcome:
    # Reads the document first, as a read tool would: it then holds its own copy while it waits,
    # and Stop has to free that copy as the tool unwinds.
    if not ctx.document.elements:
        raise RuntimeError("the benchmark document has elements")
    await SLEEPERS.sleep()
    return ToolOutcome.success("unreachable")


#: The tools a Stop case runs: "hang" never reads its document, "hold" reads it before waiting.
TOOL_KINDS = ("hang", "hold")

REGISTRY = create_tool_registry(
    [
        define_executable_tool(
            name=name,
            description="Wait forever.",
            effect="read",
            destructive=False,
            input_type=HangInput,
            run=run,
            summarize=lambda request: f"Wait {request.id}",
        )
        for name, run in (("hang", _hang), ("hold", _hold))
    ]
)


def _answer_with(n: int, tool: str = "hang") -> InProcessProvider:
    calls = [(f"h{i}", tool, {"id": f"h{i}"}) for i in range(n)]

    def answer(request: ChatRequest) -> Sequence[StreamEvent]:
        return wire_events(calls=calls) if iteration_of(request) == 0 else wire_events(text="unreachable")

    return InProcessProvider(answer)


def _request(limits: TurnLimits) -> TurnRequest:
    return TurnRequest(text="Wait.", turn_id="turn-1", model="scripted-1", registry=REGISTRY, limits=limits)


class _SettleClock:
    """An ``on_state`` observer noting when (real and CPU clock) the first settled state was published,
    and the last state before it."""

    def __init__(self) -> None:
        self.at: float | None = None
        self.cpu_at = 0.0
        self.before: TurnState | None = None

    def __call__(self, state: TurnState) -> None:
        if self.at is not None:
            return
        if state.is_settled:
            self.at = trio.current_time()
            self.cpu_at = time.process_time()
        else:
            self.before = state


async def _quiet() -> None:
    # Every other task is blocked (tools asleep, the consumer waiting on its inbox): nothing but the
    # cancellation itself runs inside the timed window.
    await trio.testing.wait_all_tasks_blocked()


def _reducer_cancel_cost(before: TurnState) -> float:
    """CPU seconds ``reduce_turn`` alone takes to settle ``before`` as cancelled (the pure part of Stop)."""
    started = time.process_time()
    reduce_turn(before, Cancel(reason="stop"))
    return time.process_time() - started


async def trioloop_stop(n: int, provider: InProcessProvider, document: ThreatModel) -> tuple[float, float, float]:
    """One Stop with n running tools, from stop() to the settled state: (wall s, CPU s, reducer CPU s)."""
    SLEEPERS.reset(n)
    controls = TurnControls()
    clock = _SettleClock()
    marks: dict[str, float] = {}

    async def stopper() -> None:
        await SLEEPERS.all_in.wait()
        await _quiet()
        marks["cpu"] = time.process_time()
        marks["wall"] = trio.current_time()
        controls.stop()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stopper)
        final = await run_turn(
            _request(LIMITS),
            Workspace(document=document, kind=THREAT_MODEL),
            provider,
            controls=controls,
            on_state=clock,
        )
    if final.outcome is not Outcome.CANCELLED or len(final.calls) != n or clock.at is None or clock.before is None:
        raise RuntimeError(f"unexpected turn: {final.outcome} with {len(final.calls)} calls")
    if any(c.status is not CallStatus.DENIED for c in final.calls):
        raise RuntimeError("a stopped call did not end denied")
    return clock.at - marks["wall"], clock.cpu_at - marks["cpu"], _reducer_cancel_cost(clock.before)


async def _holding(document: ThreatModel) -> None:
    copy = detached_copy(document)  # what a "hold" tool keeps while it waits, freed as it unwinds
    await SLEEPERS.sleep()
    del copy


async def bare_cancel(n: int, holding: ThreatModel | None = None) -> tuple[float, float]:
    """The floor: n tasks asleep in one nursery, cancelled through its scope, timed until it exits.

    With ``holding``, each task first makes and keeps a detached copy of that document (the same
    work a "hold" tool does), so the difference to trioloop is the runner alone."""
    SLEEPERS.reset(n)
    async with trio.open_nursery() as nursery:
        for _ in range(n):
            if holding is None:
                nursery.start_soon(SLEEPERS.sleep)
            else:
                nursery.start_soon(_holding, holding)
        await SLEEPERS.all_in.wait()
        await _quiet()
        cpu = time.process_time()
        started = trio.current_time()
        nursery.cancel_scope.cancel()
    return trio.current_time() - started, time.process_time() - cpu


async def stop_case(
    n: int, repeat: int, document: ThreatModel, *, cold: bool, tool: str = "hang"
) -> dict[str, list[tuple[float, ...]]]:
    """``repeat`` rounds of (trioloop Stop, bare cancel[, bare cancel of tasks holding a copy]),
    interleaved so load on the machine hits all alike.

    The order inside a round rotates. ``cold`` runs ``gc.collect()`` before every measurement of any
    kind (caches cold, no collection due inside the window); warm runs none (collections fall where they
    fall, as in a live app). Collecting before only one side would skew the ratio either way.
    """
    provider = _answer_with(n, tool)
    kinds = ("trioloop", "bare") if tool == "hang" else ("trioloop", "bare", "bare_holding")

    async def measure(kind: str) -> tuple[float, ...]:
        if kind == "trioloop":
            return await trioloop_stop(n, provider, document)
        return await bare_cancel(n, document if kind == "bare_holding" else None)

    for _ in range(3):  # warm-up
        for kind in kinds:
            await measure(kind)
    found: dict[str, list[tuple[float, ...]]] = {kind: [] for kind in kinds}
    for i in range(repeat):
        shift = i % len(kinds)
        for kind in kinds[shift:] + kinds[:shift]:
            if cold:
                gc.collect()
            found[kind].append(await measure(kind))
    return found


class _StallingProvider:
    """In process: the first events of an answer, then silence (no transport to tear down)."""

    async def stream(
        self,
        request: ChatRequest,
        send: trio.abc.SendChannel[StreamEvent],
        *,
        cancel_scope: trio.CancelScope | None = None,
    ) -> None:
        for event in wire_events(text=STALLED_TEXT)[:2]:  # MessageStart, then one TextDelta
            await send.send(event)
        await trio.sleep_forever()


async def _overshoot(provider: ChatProvider, document: ThreatModel, *, model: str = "scripted-1") -> float:
    """Settled time minus the turn's deadline (start + 50 ms) for a turn whose stream stalls."""
    clock = _SettleClock()
    start = trio.current_time()
    request = attrs.evolve(_request(TurnLimits(turn_deadline_ms=DEADLINE_MS)), model=model)
    final = await run_turn(request, Workspace(document=document, kind=THREAT_MODEL), provider, on_state=clock)
    if final.outcome is not Outcome.BOUNDED or clock.at is None:
        raise RuntimeError(f"unexpected turn: {final.outcome}")
    return clock.at - (start + DEADLINE_MS / 1000)


async def _bare_overshoot(*, late_park_s: float = 0.0) -> float:
    """A bare ``CancelScope`` deadline around ``sleep_forever``, parked ``late_park_s`` after it was set.

    Trio's epoll wait takes whole milliseconds, rounded up, so a deadline overshoots by what separates the
    time left at the park from the next millisecond. Parked at once (the default), that is about nothing;
    a turn parks some hundred microseconds after its deadline is set (it starts the request first). With
    ``late_park_s`` drawn from [0, 1 ms) the floor is what Trio gives a deadline at an arbitrary phase.
    """
    start = trio.current_time()
    with trio.CancelScope(deadline=start + DEADLINE_MS / 1000):
        busy_until = time.perf_counter() + late_park_s
        while time.perf_counter() < busy_until:  # no checkpoint: the park itself is what is delayed
            pass
        await trio.sleep_forever()
    return trio.current_time() - (start + DEADLINE_MS / 1000)


async def deadline_case(repeat: int, document: ThreatModel, url: str) -> dict[str, list[float]]:
    """Interleaved: loopback HTTP stall (the server at ``url``, in another process), in-process stall,
    bare Trio deadline; the first three rounds are warm-up."""
    found: dict[str, list[float]] = {"loopback": [], "in_process": [], "bare": [], "bare_any_phase": []}
    phases = random.Random(16)
    stalled = _StallingProvider()
    async with httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(30.0, read=None)) as client:
        provider = AnthropicProvider("k", base_url=f"{url}/stall/50", client=client, retry=None, model_table=TABLE)
        for i in range(repeat + 3):
            figures = (
                await _overshoot(provider, document, model=MODEL),
                await _overshoot(stalled, document),
                await _bare_overshoot(),
                await _bare_overshoot(late_park_s=phases.uniform(0.0, 0.001)),
            )
            if i >= 3:
                for key, value in zip(found, figures, strict=True):
                    found[key].append(value)
    return found


def _stop_rows(tool: str, cold: bool, repeat: int, document: ThreatModel) -> list[tuple[Any, ...]]:
    """Run the Stop case for every tool count with ``tool``; emit one JSON record per count, return the rows."""
    mode = "cold" if cold else "warm"
    holding = tool == "hold"
    rows: list[tuple[Any, ...]] = []
    for n in TOOL_COUNTS:
        found = trio.run(partial(stop_case, cold=cold, tool=tool), n, repeat, document)
        ours = summarize([sample[0] for sample in found["trioloop"]])
        floor = summarize([sample[0] for sample in found["bare"]])
        ours_cpu = summarize([sample[1] for sample in found["trioloop"]])
        floor_cpu = summarize([sample[1] for sample in found["bare"]])
        reducer_cpu = summarize([sample[2] for sample in found["trioloop"]])
        ratio = ours["median"] / floor["median"]
        ratio_cpu = ours_cpu["median"] / floor_cpu["median"]
        extra: dict[str, Any] = {}
        same_work = ""
        if holding:
            floor_holding = summarize([sample[0] for sample in found["bare_holding"]])
            same_work_ratio = ours["median"] / floor_holding["median"]
            extra = {
                "bare_trio_cancel_tasks_holding_a_copy_us": floor_holding,
                "ratio_to_same_work_floor_median": round(same_work_ratio, 2),
            }
            same_work = f"{same_work_ratio:.2f}x"
        label = "stop_{n}_running_tools_holding_document_{mode}" if holding else "stop_{n}_running_tools_{mode}"
        emit(
            case_record(
                "cancel",
                label.format(n=n, mode=mode),
                running_tools=n,
                tools_read_the_document=holding,
                caches=mode,
                stop_to_settled_us=ours,
                bare_trio_cancel_us=floor,
                ratio_median=round(ratio, 2),
                ratio_p99=round(ours["p99"] / floor["p99"], 2),
                stop_to_settled_cpu_us=ours_cpu,
                bare_trio_cancel_cpu_us=floor_cpu,
                ratio_cpu_median=round(ratio_cpu, 2),
                reducer_cancel_cpu_us=reducer_cpu,
                target_ratio=3.0,
                met=ratio <= 3.0,
                **extra,
            )
        )
        rows.append(
            (
                f"stop, {n} running tools{' holding a copy' if holding else ''}, {mode}",
                ours["median"],
                ours["p99"],
                floor["median"],
                floor["p99"],
                f"{ratio:.2f}x",
                ours_cpu["median"],
                floor_cpu["median"],
                f"{ratio_cpu:.2f}x",
                reducer_cpu["median"],
                "yes" if ratio <= 3 else "NO",
                same_work,
            )
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeat", type=int, default=150, help="Stop measurements per tool count and mode")
    parser.add_argument("--deadline-repeat", type=int, default=150, help="deadline measurements per kind")
    args = parser.parse_args(argv)
    document = load_thf(PAYMENT_THF)

    rows: list[tuple[Any, ...]] = []
    for tool in TOOL_KINDS:
        for cold in (False, True):
            rows.extend(_stop_rows(tool, cold, args.repeat, document))

    with spawned_server() as url:
        before = server_stats(url)
        found_deadline = trio.run(deadline_case, args.deadline_repeat, document, url)
        after = server_stats(url)
    # A stalled response is cut mid-body, so its connection cannot be reused: one connect per request.
    connects = (after["connections"] - before["connections"] - 1) / max(after["requests"] - before["requests"], 1)
    floor = summarize(found_deadline["bare"])
    any_phase = summarize(found_deadline["bare_any_phase"])
    for key, label in (("loopback", "loopback HTTP (server process)"), ("in_process", "in-process")):
        ours = summarize(found_deadline[key])
        ratio = ours["median"] / floor["median"]
        emit(
            case_record(
                "cancel",
                f"deadline_50ms_stalled_stream_{key}",
                turn_deadline_ms=DEADLINE_MS,
                overshoot_us=ours,
                bare_trio_deadline_overshoot_us=floor,
                p99_over_bare_p99_us=round(ours["p99"] - floor["p99"], 1),
                bare_trio_any_phase_overshoot_us=any_phase,
                p99_over_any_phase_p99_us=round(ours["p99"] - any_phase["p99"], 1),
                ratio_median=round(ratio, 2),
                **({"connects_per_request": round(connects, 3)} if key == "loopback" else {}),
            )
        )
        row = (f"deadline 50 ms overshoot, {label} stall", ours["median"], ours["p99"], floor["median"], floor["p99"])
        rows.append((*row, f"{ratio:.2f}x", "", "", "", "", "", ""))
    row = ("deadline 50 ms, bare Trio parked at any phase", any_phase["median"], any_phase["p99"])
    rows.append((*row, floor["median"], floor["p99"], f"{any_phase['median'] / floor['median']:.2f}x", *[""] * 6))
    print()
    headers = ("case (us)", "median", "p99", "floor med", "floor p99", "ratio", "cpu med", "floor cpu", "cpu ratio")
    print_table((*headers, "reducer cpu", "<= 3x", "vs same-work floor"), rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
