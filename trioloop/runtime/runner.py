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

from typing import TypeVar

import trio

from trioloop.machine.state import TurnState
from trioloop.protocol.provider import ChatProvider
from trioloop.runtime.controls import TurnControls
from trioloop.runtime.journaling import ResumePoint, TurnJournal
from trioloop.runtime.spending import check_priced
from trioloop.runtime.turn import Turn
from trioloop.runtime.workspace import StateObserver, TurnRequest, Workspace

__all__ = ["StateObserver", "TurnRequest", "Workspace", "run_turn"]

D = TypeVar("D")


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

    A cost bound (the turn's, or the session's in ``request.spending``) with no price for the model raises
    `PriceUnknown` before anything is sent.
    """
    if resume is None:
        check_priced(request.model, request.limits, request.spending)
    started_at = trio.current_time() - request.spent_s  # the turn's clock (and its deadline) runs from the call
    if resume is not None:
        started_at -= resume.machine_ms / 1000
    controls = controls or TurnControls()
    if tool_nursery is not None:
        return await Turn(request, workspace, provider, controls, on_state, tool_nursery, started_at, journal).drive(
            resume
        )
    async with trio.open_nursery() as own:
        state = await Turn(request, workspace, provider, controls, on_state, own, started_at, journal).drive(resume)
        own.cancel_scope.cancel()  # the turn is settled: anything still running is not wanted
    return state
