"""A session's one turn at a time: the turn running now, or the turn suspended in review waiting to be taken up
again (with the decisions the person already made for it), and how a turn's end becomes the session's next
conversation, undo target or suspended turn.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Generic, TypeVar

import attrs
import trio

from trioloop.machine.calls import CallStatus
from trioloop.machine.state import Phase, TurnState
from trioloop.protocol.events import Usage, usage_sum
from trioloop.runtime.controls import TurnControls
from trioloop.runtime.journaling import ResumePoint
from trioloop.runtime.runner import TurnRequest, run_turn

if TYPE_CHECKING:
    from trioloop.runtime.session import Session
    from trioloop.runtime.session_journal import SessionJournal

__all__ = ["SessionBusy", "TurnSlot"]

D = TypeVar("D")


class SessionBusy(RuntimeError):
    """``send`` was called while a turn is still in flight."""


class TurnSlot(Generic[D]):
    """The running turn's controls, or the suspended turn and its pending decisions; the turn count and the turn
    `Session.undo_last_turn` undoes."""

    def __init__(self, session: Session[D]) -> None:
        self.session = session
        self.controls: TurnControls | None = None  # the turn running now
        self.resume: ResumePoint | None = None  # a live turn suspended in review (or cut by a crash)
        self.pending: TurnControls | None = None  # its decisions, taken before `continue_turn`
        self.ended = trio.Event()
        self.ended.set()
        self.started = 0
        self.last_turn_id: str | None = None
        self.usage = Usage()  # every settled turn's tokens (those of a saved or journaled session included)

    def take_up(self, resume: ResumePoint) -> None:
        """Hold ``resume`` (a live turn read back from a journal) until `continue_turn`."""
        self.resume = resume
        self.pending = TurnControls()

    def deciding(self) -> TurnControls | None:
        """Where a decision goes: the running turn, or the suspended one (taken when it continues)."""
        return self.controls if self.controls is not None else self.pending

    def deciding_on(self, call_ids: tuple[str, ...]) -> TurnControls | None:
        """Where a decision on ``call_ids`` goes, or None when one of them has no card open (a late click on a
        card that is gone, another turn's call): such a decision is refused (False), not queued to be dropped."""
        controls = self.deciding()
        state = self.resume.state if self.controls is None and self.resume is not None else self.session.state
        if controls is None or state is None or not call_ids:
            return None
        for call_id in call_ids:
            call = state.call(call_id)
            if call is None or call.status is not CallStatus.PENDING:
                return None
        return controls

    async def send(self, text: str) -> TurnState:
        if self.controls is not None:
            raise SessionBusy("A turn is already running in this session; wait for it or stop it first.")
        if self.resume is not None:
            raise SessionBusy("A turn suspended in review is waiting: take it up with continue_turn() first.")
        controls = TurnControls()
        spent_s = 0.0
        toolsets = self.session._toolsets
        if toolsets:
            # Part of the turn: Stop ends it, and the time it takes counts against the turn's deadline.
            self.controls = controls
            began = trio.current_time()
            listing = trio.CancelScope(deadline=began + self.session.limits.turn_deadline_ms / 1000)
            controls._tool_scopes.add(listing)
            try:
                with listing:
                    await toolsets.refresh()
            finally:
                controls._tool_scopes.discard(listing)
                self.controls = None
            spent_s = trio.current_time() - began
        self.started += 1
        return await self.run(text, f"turn-{self.started}", None, controls, spent_s)

    async def continue_turn(self) -> TurnState:
        if self.controls is not None:
            raise SessionBusy("A turn is already running in this session.")
        resume = self.resume
        if resume is None:
            raise SessionBusy("No suspended turn: there is nothing to continue.")
        session = self.session
        _ = session.nursery  # SessionClosed before the suspended turn is taken, so a refusal loses nothing
        if session._journal is not None:
            session._journal.check()
        controls, self.pending = self.pending, None
        self.resume = None
        if session._journal is not None:
            session._journal.add("resume", {"by": session.actor, "turn_id": resume.state.turn_id})
        return await self.run("", resume.state.turn_id, resume, controls)

    async def run(
        self,
        text: str,
        turn_id: str,
        resume: ResumePoint | None,
        controls: TurnControls | None = None,
        spent_s: float = 0.0,
    ) -> TurnState:
        session = self.session
        journal = session._journal
        if journal is not None:
            journal.check()
        nursery = session.nursery
        publisher = session._publisher
        controls = controls or TurnControls()
        controls.on_questions = publisher.questions_changed
        self.controls = controls
        self.ended = trio.Event()
        request = TurnRequest(
            text=text,
            turn_id=turn_id,
            model=session.model,
            system=session.system_prompt,
            base_messages=session.history,
            registry=session.registry,
            limits=session.limits,
            max_output_tokens=session.max_output_tokens,
            spent_s=spent_s,
        )
        if journal is not None:
            journal.turns.writer.actor = session.actor
            journal.turns.on_settled = partial(self._closing_snapshot, journal, turn_id)
        try:
            state = await run_turn(
                request,
                session._workspace,
                session.provider,
                tool_nursery=nursery,
                controls=controls,
                on_state=session._publish,
                journal=None if journal is None else journal.turns,
                resume=resume,
            )
        finally:
            self.controls = None
            if journal is not None:
                journal.turns.on_settled = None
            final = publisher.state
            if final is not None and final.is_settled:
                session._history = final.messages
                self.last_turn_id = turn_id
                self.usage = usage_sum(self.usage, final.usage)
            elif final is not None and controls.suspended_at is not None:
                machine_ms, review_ms = controls.suspended_at
                digests = {} if resume is None else resume.card_digests
                self.resume = ResumePoint(
                    state=final, machine_ms=machine_ms, review_waited_ms=review_ms, card_digests=digests
                )
                self.pending = TurnControls()
                publisher.tell_suspended(final)
            self.ended.set()
        if journal is None or journal.turns.error is None:  # a failed journal: the last durable state stands
            session._publish(state)
        if journal is not None:
            if state.is_settled and journal.turns.writer.snapshot_due:
                journal.turns.writer.snapshot(session.snapshot())  # compaction: reopening replays from here
            await journal.flush()
        return state

    def _closing_snapshot(self, journal: SessionJournal, turn_id: str, state: TurnState) -> None:
        """The session after the turn that settled in ``state``, as a snapshot, when one is due (compaction:
        reopening replays from here); written in the turn's last append."""
        writer = journal.turns.writer
        if writer.snapshot_due:
            snapshot = self.session.snapshot()
            writer.snapshot(
                attrs.evolve(
                    snapshot,
                    messages=state.messages,
                    last_turn_id=turn_id,
                    usage=usage_sum(self.usage, state.usage),
                )
            )

    async def suspend(self) -> TurnState | None:
        controls = self.controls
        session = self.session
        if controls is not None:
            state = session.state
            if state is not None and state.phase is Phase.AWAITING_APPROVAL:
                controls.suspend()
            else:
                controls.stop()
            await self.ended.wait()
        if session._journal is not None:
            await session._journal.flush()
        return session.state
