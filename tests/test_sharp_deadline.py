"""The deadline sharpener: a turn's deadline fires on time, not up to Trio's 1 ms epoll rounding late.

The sharpener on its own (`DeadlineSharpener`: when it hands over to a thread, that it follows a moved
deadline and never spins), and in the runner: it is spawned only in the last `LEAD_S` before the deadline,
the approach that starts it loses no event, and Stop, a review pause and completion inside that window
behave as they do anywhere else. Timing figures are in ``benchmarks/cancel.py``, not here.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from trioloop.machine.limits import TurnLimits
from trioloop.machine.reducer import CallStatus, Outcome, TurnState
from trioloop.machine.tools import ToolOutcome, create_tool_registry
from trioloop.protocol import flatten_text
from trioloop.protocol.events import MessageStart, MessageStop, StopReason, StreamEvent, TextDelta, ToolCallComplete
from trioloop.runtime import sharpener as _sharp_deadline
from trioloop.runtime.controls import TurnControls
from trioloop.runtime.runner import TurnRequest, Workspace, run_turn
from trioloop.runtime.sharpener import (
    LEAD_S,
    THREADS,
    DeadlineSharpener,
    sharpener_limiter,
    sleep_in_thread_until,
)
from trioloop.runtime.tools import ToolExecutionContext, define_executable_tool
from trioloop.threatmodel import THREAT_MODEL, load_thf

PAYMENT = Path(__file__).resolve().parent.parent / "examples" / "payment.thf"
SHARPENER = "trioloop deadline sharpener"


class _Steps(trio.abc.Instrument):
    """Counts the tasks spawned under a name and the steps they take (a spinning task takes many)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.spawned = 0
        self.steps = 0

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        if task.name == self.name:
            self.spawned += 1

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task.name == self.name:
            self.steps += 1


class _Recorder:
    """Stands in for the thread: notes (Trio time, seconds to sleep) and sleeps that long on Trio's clock."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, float]] = []

    async def __call__(self, instant: float) -> None:
        seconds = instant - time.perf_counter()
        self.calls.append((trio.current_time(), seconds))
        await trio.sleep(max(seconds, 0.0))


async def _run_sharpener(
    sharpener: DeadlineSharpener, until: float, moves: Sequence[tuple[float, float]] = ()
) -> _Steps:
    """Run ``sharpener`` until ``until`` (Trio time), applying each (at, new deadline) of ``moves`` on the way."""
    steps = _Steps("sharpener")
    trio.lowlevel.add_instrument(steps)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sharpener.run, name="sharpener")
            for at, deadline in moves:
                await trio.sleep_until(at)
                sharpener.move(deadline)
            await trio.sleep_until(until)
            nursery.cancel_scope.cancel()
    finally:
        trio.lowlevel.remove_instrument(steps)
    return steps


async def test_the_last_stretch_is_slept_in_a_thread_once(autojump_clock: trio.testing.MockClock) -> None:
    start = trio.current_time()
    recorder = _Recorder()
    sharpener = DeadlineSharpener(start + 10, sleep_until=recorder)
    steps = await _run_sharpener(sharpener, start + 100)
    assert sharpener.thread_sleeps == 1 and len(recorder.calls) == 1
    at, seconds = recorder.calls[0]
    assert at == pytest.approx(start + 10 - LEAD_S, abs=1e-9)  # handed over LEAD_S before the deadline
    assert 0 < seconds <= LEAD_S
    assert steps.steps <= 6  # woke, slept in the thread, then parked until cancelled: no spinning


@pytest.mark.parametrize("later", [True, False])
async def test_a_moved_deadline_is_followed(autojump_clock: trio.testing.MockClock, later: bool) -> None:
    start = trio.current_time()
    recorder = _Recorder()
    sharpener = DeadlineSharpener(start + 10, sleep_until=recorder)
    moved = start + (30 if later else 6)
    steps = await _run_sharpener(sharpener, start + 100, moves=[(start + 5, moved)])
    assert [at for at, _ in recorder.calls] == [pytest.approx(moved - LEAD_S, abs=1e-9)]
    assert steps.steps <= 8


async def test_a_review_pause_sharpens_nothing_until_the_deadline_comes_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """While the turn waits for its reviewer the deadline is infinite; once it is back, it is sharpened."""
    start = trio.current_time()
    recorder = _Recorder()
    sharpener = DeadlineSharpener(start + 10, sleep_until=recorder)
    moves = [(start + 5, math.inf), (start + 50, start + 60)]
    steps = await _run_sharpener(sharpener, start + 100, moves=moves)
    assert [at for at, _ in recorder.calls] == [pytest.approx(start + 60 - LEAD_S, abs=1e-9)]
    assert steps.steps <= 10


async def test_a_deadline_moved_back_inside_the_window_is_sharpened_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Sharpened once, then the deadline moves later (a review that ended): the new one is sharpened too."""
    start = trio.current_time()
    recorder = _Recorder()
    sharpener = DeadlineSharpener(start + 10, sleep_until=recorder)
    steps = await _run_sharpener(sharpener, start + 100, moves=[(start + 10 - LEAD_S / 2, start + 40)])
    assert [at for at, _ in recorder.calls] == [
        pytest.approx(start + 10 - LEAD_S, abs=1e-9),
        pytest.approx(start + 40 - LEAD_S, abs=1e-9),
    ]
    assert steps.steps <= 12


async def test_a_deadline_already_past_uses_no_thread(autojump_clock: trio.testing.MockClock) -> None:
    start = trio.current_time()
    recorder = _Recorder()
    sharpener = DeadlineSharpener(start - 1, sleep_until=recorder)
    steps = await _run_sharpener(sharpener, start + 100)
    assert recorder.calls == [] and sharpener.thread_sleeps == 0
    assert steps.steps <= 4


async def test_on_the_real_clock_the_thread_sleeps_and_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    """With Trio's own clock and ``time.sleep``: one hand-over, and the sharpener is still cancellable after.

    The lead is widened for the test, so a loaded machine that wakes Trio a few ms late still hands over.
    """
    monkeypatch.setattr(_sharp_deadline, "LEAD_S", 0.02)
    start = trio.current_time()
    sharpener = DeadlineSharpener(start + 0.04)
    await _run_sharpener(sharpener, start + 0.08)
    assert sharpener.thread_sleeps == 1


async def test_sharpeners_hold_their_own_threads_never_trios_default_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """Many deadlines at once: at most THREADS sharpener threads, none of them from the default limiter that
    tools' ``trio.to_thread`` calls share (so a sharpener never keeps a tool waiting for a thread)."""
    monkeypatch.setattr(_sharp_deadline, "LEAD_S", 0.02)  # wide, for a loaded machine (see above)
    default = trio.to_thread.current_default_thread_limiter()
    start = trio.current_time()
    sharpeners = [DeadlineSharpener(start + 0.04) for _ in range(THREADS * 3)]
    seen: list[tuple[int, int]] = []

    async def watch() -> None:
        while True:
            seen.append((sharpener_limiter().borrowed_tokens, default.borrowed_tokens))
            await trio.sleep(0.0002)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        for sharpener in sharpeners:
            nursery.start_soon(sharpener.run)
        await trio.sleep(0.06)
        nursery.cancel_scope.cancel()
    assert max(mine for mine, _ in seen) <= THREADS
    assert max(mine for mine, _ in seen) >= 1  # the watcher saw the sharpeners in their threads
    assert all(theirs == 0 for _, theirs in seen)
    assert sum(s.thread_sleeps for s in sharpeners) >= THREADS  # the ones past the limit waited, not failed


# -- in the runner -----------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Nothing:
    note: str = ""


def _ok(inp: Nothing, ctx: ToolExecutionContext) -> ToolOutcome:
    return ToolOutcome.success("done")


REGISTRY = create_tool_registry(
    [
        define_executable_tool(
            name="act",
            description="Does something that needs approval.",
            effect="mutate",
            destructive=False,
            input_type=Nothing,
            run=_ok,
            summarize=lambda inp: "act",
        )
    ]
)
DEADLINE_MS = 10_000


class _TimedProvider:
    """Sends each (seconds after the turn's start, events) of ``plan`` at that time, then stalls forever
    unless the last event ends the answer; a request after the first is answered "after" at once."""

    def __init__(self, start: float, plan: Sequence[tuple[float, Sequence[StreamEvent]]]) -> None:
        self.start = start
        self.plan = plan
        self.requests = 0

    async def stream(self, request: Any, send: Any, *, cancel_scope: Any = None) -> None:
        self.requests += 1
        if self.requests > 1:
            for event in (MessageStart(model="m"), TextDelta(text="after"), MessageStop(stop_reason="end_turn")):
                await send.send(event)
            return
        for at, events in self.plan:
            await trio.sleep_until(self.start + at)
            for event in events:
                await send.send(event)
        if not self.plan or not isinstance(self.plan[-1][1][-1], MessageStop):
            await trio.sleep_forever()  # stalls, unless the answer ended


async def _turn(
    plan: Sequence[tuple[float, Sequence[StreamEvent]]],
    observe: Callable[[TurnState, TurnControls], None] | None = None,
) -> tuple[TurnState, _Steps, float]:
    start = trio.current_time()
    provider = _TimedProvider(start, plan)
    controls = TurnControls()
    steps = _Steps(SHARPENER)
    trio.lowlevel.add_instrument(steps)
    try:
        final = await run_turn(
            TurnRequest(
                text="go",
                turn_id="turn-1",
                model="m",
                registry=REGISTRY,
                limits=TurnLimits(turn_deadline_ms=DEADLINE_MS),
            ),
            Workspace(document=load_thf(PAYMENT), kind=THREAT_MODEL),
            provider,  # type: ignore[arg-type]
            controls=controls,
            on_state=None if observe is None else (lambda state: observe(state, controls)),
        )
    finally:
        trio.lowlevel.remove_instrument(steps)
    return final, steps, trio.current_time() - start


def _assistant_text(state: TurnState) -> list[str]:
    return [flatten_text(m) for m in state.messages if m.role == "assistant"]


DEADLINE_S = DEADLINE_MS / 1000
END = (MessageStop(stop_reason=StopReason.END_TURN),)


async def test_a_turn_that_ends_before_the_window_spawns_no_sharpener(autojump_clock: trio.testing.MockClock) -> None:
    final, steps, _ = await _turn([(1.0, (MessageStart(model="m"), TextDelta(text="hi"), *END))])
    assert final.outcome is Outcome.COMPLETED and steps.spawned == 0


async def test_a_stalled_turn_is_sharpened_once_and_bounded_at_the_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    final, steps, took = await _turn([(0.0, (MessageStart(model="m"), TextDelta(text="partial")))])
    assert final.outcome is Outcome.BOUNDED
    assert took == pytest.approx(DEADLINE_S, abs=1e-6)
    assert steps.spawned == 1 and steps.steps <= 8  # and it ended with the turn: run_turn returned
    assert _assistant_text(final) == ["partial"]


@pytest.mark.parametrize("before", [2 * LEAD_S, LEAD_S, LEAD_S / 2, LEAD_S / 10, 0.0])
async def test_events_around_the_approach_are_all_taken(autojump_clock: trio.testing.MockClock, before: float) -> None:
    """The approach interrupts the consumer's wait, never an event: what arrives just before, at and after
    the hand-over joins the answer, and the turn completes (or, exactly at the deadline, is bounded)."""
    plan = [
        (0.0, (MessageStart(model="m"), TextDelta(text="a"))),
        (DEADLINE_S - LEAD_S - 1e-4, (TextDelta(text="b"),)),
        (DEADLINE_S - before, (TextDelta(text="c"), *END)),
    ]
    final, _, took = await _turn(plan)
    if before == 0.0:
        assert final.outcome is Outcome.BOUNDED and took == pytest.approx(DEADLINE_S, abs=1e-6)
        assert _assistant_text(final) == ["ab"]  # the deadline came first: what came at it is not taken
    else:
        assert final.outcome is Outcome.COMPLETED
        assert _assistant_text(final) == ["abc"]


async def test_stop_inside_the_window_cancels(autojump_clock: trio.testing.MockClock) -> None:
    plan = [(0.0, (MessageStart(model="m"),)), (DEADLINE_S - LEAD_S / 2, (TextDelta(text="now"),))]

    def stop_on_text(state: TurnState, controls: TurnControls) -> None:
        if state.streaming_text:
            controls.stop()

    final, steps, took = await _turn(plan, stop_on_text)
    assert final.outcome is Outcome.CANCELLED and steps.spawned == 1
    assert took == pytest.approx(DEADLINE_S - LEAD_S / 2, abs=1e-6)


async def test_a_review_inside_the_window_holds_the_deadline_and_the_turn_goes_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A call that needs approval arrives in the last stretch: the deadline stands still for the reviewer
    (the sharpener follows it to infinity and back), the approved call runs and the turn completes."""
    call = (MessageStart(model="m"), ToolCallComplete(id="c1", name="act", input={}))
    plan = [(DEADLINE_S - LEAD_S / 2, (*call, MessageStop(stop_reason=StopReason.TOOL_USE)))]
    box: list[TurnControls] = []

    async def reviewer() -> None:
        await trio.sleep(60)  # the reviewer takes a minute, far past the turn's deadline
        box[0].approve("c1")

    def observe(state: TurnState, controls: TurnControls) -> None:
        if not box:
            box.append(controls)
            nursery.start_soon(reviewer)

    async with trio.open_nursery() as nursery:
        final, steps, took = await _turn(plan, observe)
    assert final.outcome is Outcome.COMPLETED
    assert [c.status for c in final.calls] == [CallStatus.SUCCEEDED]
    assert _assistant_text(final)[-1] == "after"
    assert took >= 60 and steps.spawned == 1 and steps.steps <= 16


@settings(max_examples=60, deadline=None)
@given(
    times=st.lists(st.floats(min_value=0.0, max_value=3 * LEAD_S), min_size=1, max_size=6),
    ends=st.booleans(),
)
def test_every_event_before_the_deadline_is_taken(times: list[float], ends: bool) -> None:
    """For all arrival times in the last 3 * LEAD_S (the approach at LEAD_S included): each text delta that
    arrives before the deadline is in the answer, in order; the turn completes when the answer ends before
    the deadline and is bounded at the deadline otherwise."""
    arrivals = sorted(DEADLINE_S - t for t in times)  # seconds after the start, latest last
    plan: list[tuple[float, tuple[StreamEvent, ...]]] = [(0.0, (MessageStart(model="m"),))]
    plan += [(at, (TextDelta(text=f"<{i}>"),)) for i, at in enumerate(arrivals)]
    if ends:
        plan[-1] = (plan[-1][0], (*plan[-1][1], *END))

    async def main() -> tuple[TurnState, _Steps, float]:
        return await _turn(plan)

    final, steps, took = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    taken = "".join(f"<{i}>" for i, at in enumerate(arrivals) if at < DEADLINE_S)
    text = "".join(_assistant_text(final))
    if ends and arrivals[-1] < DEADLINE_S:
        assert final.outcome is Outcome.COMPLETED and text == taken
    else:
        assert final.outcome is Outcome.BOUNDED and took == pytest.approx(DEADLINE_S, abs=1e-6)
        assert text == taken
    assert steps.spawned <= 1


def test_in_guest_mode_a_stalled_turn_is_sharpened_and_bounded_at_its_deadline() -> None:
    """Beside a host loop (asyncio here, where an app would have its GUI's): the sharpener's thread hands
    back through the host's ``call_soon_threadsafe`` and the turn ends bounded at its deadline."""
    steps = _Steps(SHARPENER)

    async def trio_main() -> tuple[TurnState, float]:
        await sleep_in_thread_until(time.perf_counter() + 0.001)  # the hand-over itself, through the host
        start = trio.current_time()
        provider = _TimedProvider(start, [(0.0, (MessageStart(model="m"), TextDelta(text="partial")))])
        final = await run_turn(
            TurnRequest(text="go", turn_id="t", model="m", registry=REGISTRY, limits=TurnLimits(turn_deadline_ms=50)),
            Workspace(document=load_thf(PAYMENT), kind=THREAT_MODEL),
            provider,  # type: ignore[arg-type]
        )
        return final, trio.current_time() - start

    async def host() -> tuple[TurnState, float]:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        trio.lowlevel.start_guest_run(
            trio_main,
            run_sync_soon_threadsafe=loop.call_soon_threadsafe,
            done_callback=done.set_result,
            host_uses_signal_set_wakeup_fd=True,
            instruments=(steps,),
        )
        result: tuple[TurnState, float] = (await done).unwrap()
        return result

    final, took = asyncio.run(host())
    assert final.outcome is Outcome.BOUNDED and _assistant_text(final) == ["partial"]
    # One sharpener, or none when the host woke Trio so late that the approach and the deadline expired
    # in the same pass (the turn then settles on Trio's timer, as it would without a sharpener).
    assert steps.spawned <= 1
    assert 0.05 <= took < 5.0  # at the deadline, not before; the upper bound only says it was not stuck
