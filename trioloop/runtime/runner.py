"""The Trio shell around the pure turn machine: `run_turn` drives one turn to a settled state.

``run_turn`` owns one cancel scope (the turn deadline; Stop cancels it) and one nursery per turn, which
holds that scope. The provider request is a child task of that nursery, outside the turn's scope, so
Stop and the deadline reach the consumer first and the request is cancelled once the turn has settled.
Every ``async`` tool run is a child task of the *tool nursery* the caller owns (the `Session` passes
its own), so a tool that ignores cancellation can be abandoned after a bounded grace without leaving
the structured-concurrency tree: it still has a parent, which cancels and awaits it when it closes.
Everything the tasks learn reaches the reducer through one inbox consumed by one task (`Turn`), so state
has a single writer and a single order. The runner knows no document type: the `DocumentKind` in the
`Workspace` validates, copies and compares documents. It performs only the effects the state asks for
and decides nothing about authorization: it starts what the reducer moved to ``running`` and nothing else.
The turn deadline measures the machine, not the person (`TurnClock`): while the turn waits for the person,
the scope's deadline stands still.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeAlias, TypeVar

import attrs
import trio

from trioloop.durable.replay import recovery_inputs
from trioloop.machine.document import DocumentKind
from trioloop.machine.inputs import Submit
from trioloop.machine.limits import DEFAULT_TURN_LIMITS, TurnLimits
from trioloop.machine.state import Phase, TurnState
from trioloop.machine.tools import ToolRegistry
from trioloop.machine.transaction import UndoHistory
from trioloop.protocol.messages import Message
from trioloop.protocol.provider import ChatProvider
from trioloop.runtime.clock import REQUEST_DEADLINE_GRACE_S, now_ms
from trioloop.runtime.controls import TurnControls
from trioloop.runtime.journaling import ResumePoint, TurnJournal
from trioloop.runtime.sharpener import LEAD_S as SHARPEN_LEAD_S
from trioloop.runtime.tool_calls import TOOL_CANCEL_GRACE_S
from trioloop.runtime.turn import Turn

__all__ = ["StateObserver", "TurnRequest", "Workspace", "run_turn"]

StateObserver: TypeAlias = Callable[[TurnState], None]

D = TypeVar("D")


@attrs.define(kw_only=True)
class Workspace(Generic[D]):
    """The live document, how to treat it, and its undo history: the only mutable things a turn writes."""

    document: D
    kind: DocumentKind[D]
    undo: UndoHistory[D] = attrs.field(factory=UndoHistory)


@attrs.frozen(kw_only=True)
class TurnRequest(Generic[D]):
    """Everything one turn needs besides the live workspace."""

    text: str
    turn_id: str
    model: str
    system: str = ""
    base_messages: tuple[Message, ...] = ()
    registry: ToolRegistry[D] = attrs.field(factory=lambda: ToolRegistry(()))
    limits: TurnLimits = DEFAULT_TURN_LIMITS
    max_output_tokens: int = 4096
    tool_cancel_grace_s: float = TOOL_CANCEL_GRACE_S
    #: Seconds of the turn already spent before it was driven (listing a toolset's tools again, say): its
    #: deadline counts them.
    spent_s: float = 0.0


async def run_turn(
    request: TurnRequest[D],
    workspace: Workspace[D],
    provider: ChatProvider,
    *,
    tool_nursery: trio.Nursery | None = None,
    controls: TurnControls | None = None,
    on_state: StateObserver | None = None,
    journal: TurnJournal | None = None,
    resume: ResumePoint | None = None,
) -> TurnState:
    """Drive one turn to a settled state. Expected outcomes (stop, deadline, provider or tool failure)
    are states, never exceptions; only a cancellation from outside the turn propagates.

    Tool runs are child tasks of ``tool_nursery``. Pass a nursery that outlives the turn (the `Session`
    passes its own): a tool that ignores cancellation is then abandoned after the grace, its value
    discarded, and the nursery cancels and awaits it when it closes. Without one, the turn opens its own,
    and returning waits until every tool task has really ended.

    With a ``journal``, every input that must survive is appended before its effect is visible outside the
    process. ``resume`` takes up a live turn from its journal instead of submitting ``request.text``: it
    comes back in its phase, with the machine time it had spent; a call that was running is settled failed
    (never run again), a call whose tool changed is revoked, a request in flight is asked again. A turn
    suspended in review (`TurnControls.suspend`) returns its live state, not settled.
    """
    started_at = trio.current_time() - request.spent_s  # the turn's clock (and its deadline) runs from the call
    if resume is not None:
        started_at -= resume.machine_ms / 1000
    if tool_nursery is not None:
        return await _drive(request, workspace, provider, tool_nursery, controls, on_state, started_at, journal, resume)
    async with trio.open_nursery() as own:
        state = await _drive(request, workspace, provider, own, controls, on_state, started_at, journal, resume)
        own.cancel_scope.cancel()  # the turn is settled: anything still running is not wanted
    return state


def _take_up(turn: Turn[Any], resume: ResumePoint, now_ms: int) -> None:
    """Put a journaled live turn back in place: its state, its review clock, then the recovery inputs."""
    state = resume.state
    turn.state = state
    if state.phase is Phase.AWAITING_APPROVAL:
        turn.clock.take_up_review(resume.review_waited_ms, state.limits.review_timeout_ms)
    if turn.on_state is not None:
        turn.on_state(state)
    for item in recovery_inputs(state, resume.card_digests, now_ms=now_ms):
        turn.apply(item)


async def _drive(
    request: TurnRequest[D],
    workspace: Workspace[D],
    provider: ChatProvider,
    tool_nursery: trio.Nursery,
    controls: TurnControls | None,
    on_state: StateObserver | None,
    started_at: float,
    journal: TurnJournal | None = None,
    resume: ResumePoint | None = None,
) -> TurnState:
    controls = controls or TurnControls()
    turn = Turn(request, workspace, provider, controls, on_state, tool_nursery, started_at, journal)
    if resume is None:
        turn.apply(
            Submit(
                turn_id=request.turn_id,
                text=request.text,
                base_messages=request.base_messages,
                tool_set=request.registry,
                limits=request.limits,
                now_ms=int(started_at * 1000),
            )
        )
    else:
        # ``started_at`` is now minus the machine time already spent: the deadline continues where it stood.
        turn.clock.restart(started_at, resume.state.limits.turn_deadline_ms)
    try:
        # The request tasks' nursery holds the turn's scope, not the other way round: Stop and the deadline
        # cancel the turn's scope, the consumer settles, and only then are the requests cancelled (below).
        # Its own deadline, just after the turn's, is the backstop and what a provider sees as its own.
        async with trio.open_nursery() as requests:
            turn.requests.nursery = requests
            turn.clock.backstop = requests.cancel_scope
            requests.cancel_scope.deadline = turn.clock.deadline + REQUEST_DEADLINE_GRACE_S
            try:
                with trio.CancelScope(deadline=turn.clock.deadline) as turn_scope:
                    controls._scope = turn_scope
                    if resume is not None:
                        _take_up(turn, resume, now_ms())
                    if controls.stop_requested:
                        turn_scope.cancel()
                    with trio.CancelScope(deadline=turn.clock.deadline - SHARPEN_LEAD_S) as approach:
                        turn.clock.approach = approach
                        approach.deadline = turn_scope.deadline - SHARPEN_LEAD_S  # a resumed review moved it
                        await turn.consume()
                    turn.clock.approach = None
                    if not turn.state.is_settled and not turn.suspended:
                        # The deadline is near (and only then, so a turn that ends sooner spawns nothing):
                        # Trio's timer rounds up to the millisecond, the sharpener makes it fire on time.
                        requests.start_soon(turn.clock.sharpener.run, name="trioloop deadline sharpener")
                        await turn.consume()
            finally:
                # Settled (or failing): nothing still running (a request, the sharpener) is wanted, on
                # every way out. A cancel costs even when no task is left to see it.
                if requests.child_tasks:
                    requests.cancel_scope.cancel()
    finally:
        # Runs on Stop, on the deadline, and even when a scope outside the turn cancels us: the turn
        # always ends settled (unless suspended in review). The one await is shielded and bounded.
        if turn.suspended:
            await turn.sync()
        else:
            await turn.settle()
        controls._scope = None
        controls._send.close()
    return turn.state
