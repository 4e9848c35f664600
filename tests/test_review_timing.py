"""The turn deadline measures the machine, not the person; review_timeout_ms bounds the person (MockClock, ms)."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import trio
import trio.testing

from trioloop.machine.limits import Bound, TurnLimits, bound_notice
from trioloop.machine.reducer import CallStatus, DenialReason, Outcome, Phase, TurnState
from trioloop.machine.tools import ToolOutcome, create_tool_registry
from trioloop.protocol import assert_tool_pairing
from trioloop.providers.scripted import ScriptedCall, ScriptedProvider, ScriptStep
from trioloop.runtime.controls import TurnControls
from trioloop.runtime.runner import TurnRequest, Workspace, run_turn
from trioloop.runtime.tools import ToolExecutionContext, define_executable_tool
from trioloop.threatmodel import THREAT_MODEL, load_thf

PAYMENT = Path(__file__).resolve().parent.parent / "examples" / "payment.thf"


@attrs.frozen(kw_only=True)
class Nap:
    note: str = ""


def napping_tool(seconds: float) -> object:
    async def run(inp: Nap, ctx: ToolExecutionContext) -> ToolOutcome:
        await trio.sleep(seconds)
        return ToolOutcome.success(f"napped {inp.note}")

    return define_executable_tool(
        name="nap",
        description="sleeps, then succeeds",
        effect="mutate",
        destructive=False,
        input_type=Nap,
        run=run,
        summarize=lambda inp: f"nap {inp.note}",
    )


async def review_turn(
    steps: list[ScriptStep], tool_seconds: float, review_s: float | None, **limits: int
) -> tuple[TurnState, float]:
    """Run one turn whose reviewer approves every card ``review_s`` seconds after it appears (never if None).

    Returns the settled state and how long the turn took on the (mock) clock.
    """
    registry = create_tool_registry([napping_tool(tool_seconds)])  # type: ignore[list-item]
    request = TurnRequest(
        text="go", turn_id="turn-1", model="scripted-1", registry=registry, limits=TurnLimits(**limits)
    )
    controls = TurnControls()
    waiting: list[TurnState] = []
    wake = trio.Event()

    def observe(state: TurnState) -> None:
        if state.phase is Phase.AWAITING_APPROVAL and (not waiting or waiting[-1].iteration != state.iteration):
            waiting.append(state)
            wake.set()

    async def reviewer() -> None:
        nonlocal wake
        while True:
            await wake.wait()
            wake = trio.Event()
            if review_s is None:
                continue
            await trio.sleep(review_s)
            for call in waiting[-1].current_calls:
                if call.status is CallStatus.PENDING:
                    controls.approve(call.id)

    start = trio.current_time()
    async with ScriptedProvider(steps) as provider, trio.open_nursery() as nursery:
        nursery.start_soon(reviewer)
        final = await run_turn(
            request,
            Workspace(document=load_thf(PAYMENT), kind=THREAT_MODEL),
            provider,
            controls=controls,
            on_state=observe,
        )
        nursery.cancel_scope.cancel()
    assert final.is_settled and assert_tool_pairing(final.messages) == ()
    return final, trio.current_time() - start


def one_nap(call_id: str = "n1") -> ScriptStep:
    return ScriptStep(tool_calls=(ScriptedCall(id=call_id, name="nap", input={"note": call_id}),))


async def test_time_spent_reading_cards_does_not_count_against_the_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The case: a 2 s deadline and a reviewer who takes 3 s.
    final, took = await review_turn([one_nap(), ScriptStep(text="done")], 1.5, 3.0, turn_deadline_ms=2_000)
    assert final.outcome is Outcome.COMPLETED, final.notices
    assert final.calls[0].status is CallStatus.SUCCEEDED
    assert took == pytest.approx(4.5, abs=0.001)


async def test_the_deadline_still_cuts_the_machine_exactly_after_a_long_review(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # 3 s of review are not counted; the tool's 2.5 s are, so the turn ends at 3 s + 2 s of machine time.
    final, took = await review_turn([one_nap(), ScriptStep(text="done")], 2.5, 3.0, turn_deadline_ms=2_000)
    assert final.outcome is Outcome.BOUNDED
    assert final.notices[-1] == bound_notice(Bound.DEADLINE)
    assert final.calls[0].status is CallStatus.DENIED and "discarded" in (final.calls[0].result or "")
    assert took == pytest.approx(5.0, abs=0.001)


async def test_paused_time_adds_up_over_several_reviews(autojump_clock: trio.testing.MockClock) -> None:
    # Two reviews of 10 s each and two 0.9 s tools fit a 2 s deadline: only the 1.8 s of machine time count.
    steps = [one_nap("n1"), one_nap("n2"), ScriptStep(text="done")]
    final, took = await review_turn(steps, 0.9, 10.0, turn_deadline_ms=2_000)
    assert final.outcome is Outcome.COMPLETED, final.notices
    assert took == pytest.approx(21.8, abs=0.001)


async def test_without_a_review_timeout_the_turn_waits_for_the_reviewer(autojump_clock: trio.testing.MockClock) -> None:
    final, took = await review_turn([one_nap(), ScriptStep(text="done")], 0.0, 3600.0, turn_deadline_ms=1_000)
    assert final.outcome is Outcome.COMPLETED
    assert took == pytest.approx(3600.0, abs=0.001)


async def test_the_review_timeout_settles_bounded_with_its_own_notice(autojump_clock: trio.testing.MockClock) -> None:
    final, took = await review_turn([one_nap(), ScriptStep(text="done")], 0.0, None, review_timeout_ms=1_500)
    assert final.outcome is Outcome.BOUNDED
    assert final.notices[-1] == bound_notice(Bound.REVIEW_TIMEOUT)
    record = final.calls[0]
    assert record.status is CallStatus.DENIED and record.denial_reason is DenialReason.LIMIT_EXCEEDED
    assert took == pytest.approx(1.5, abs=0.001)


async def test_the_review_timeout_counts_each_review_on_its_own(autojump_clock: trio.testing.MockClock) -> None:
    # Two reviews of 1 s each under a 1.5 s review timeout: neither alone runs out.
    steps = [one_nap("n1"), one_nap("n2"), ScriptStep(text="done")]
    final, took = await review_turn(steps, 0.0, 1.0, review_timeout_ms=1_500)
    assert final.outcome is Outcome.COMPLETED, final.notices
    assert took == pytest.approx(2.0, abs=0.001)


async def test_a_reviewer_answering_one_ms_before_the_timeout_is_in_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    final, _ = await review_turn([one_nap(), ScriptStep(text="done")], 0.0, 1.499, review_timeout_ms=1_500)
    assert final.outcome is Outcome.COMPLETED
    late, took = await review_turn([one_nap(), ScriptStep(text="done")], 0.0, 1.501, review_timeout_ms=1_500)
    assert late.outcome is Outcome.BOUNDED and took == pytest.approx(1.5, abs=0.001)


async def test_stop_while_waiting_is_stop_not_a_timeout(autojump_clock: trio.testing.MockClock) -> None:
    registry = create_tool_registry([napping_tool(0.0)])  # type: ignore[list-item]
    limits = TurnLimits(review_timeout_ms=5_000, turn_deadline_ms=1_000)
    request = TurnRequest(text="go", turn_id="turn-1", model="scripted-1", registry=registry, limits=limits)
    controls = TurnControls()

    async def stop_later() -> None:
        await trio.sleep(2.0)
        controls.stop()

    async with ScriptedProvider([one_nap()]) as provider, trio.open_nursery() as nursery:
        nursery.start_soon(stop_later)
        final = await run_turn(
            request, Workspace(document=load_thf(PAYMENT), kind=THREAT_MODEL), provider, controls=controls
        )
    assert final.outcome is Outcome.CANCELLED
