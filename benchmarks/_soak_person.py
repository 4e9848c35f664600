"""The soak's person at a session's review panel (see `benchmarks._soak_sessions` for what the soak does with it)."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import trio

from benchmarks._soak_tools import Ledger
from trioloop import AnswerError, CallStatus, Phase, Session, SessionJournalError, TurnState

if TYPE_CHECKING:
    from benchmarks._soak_sessions import Leg, Watch


class Person:
    """One simulated person at the session's review panel (see `benchmarks._soak_sessions`' docstring)."""

    def __init__(self, rng: random.Random, sid: str, ledger: Ledger, watch: Watch, session: Session[str]) -> None:
        self.rng = rng
        self.sid = sid
        self.ledger = ledger
        self.watch = watch
        self.session = session
        self.reviewed: set[tuple[str, int]] = set()
        self.answered: set[str] = set()
        self.gone_calls: list[str] = []
        self.suspending = False
        self.suspended = trio.Event()  # set once a suspend the person asked for has returned
        self.counts: dict[str, int] = {}

    def _count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1
        self.ledger.emit("click", sid=self.sid, what=what)

    def _click(self) -> None:
        leg = self.watch.leg
        if leg is not None:
            leg.last_click = trio.current_time()

    async def run(self) -> None:
        """Read the cards as they come (and, in a task of its own that never waits, the questions)."""
        async with trio.open_nursery() as hands:
            hands.start_soon(self._questions, hands)
            async for state in self.session.states():
                if self.suspending:
                    hands.cancel_scope.cancel()
                    return
                for call in state.calls:
                    if call.is_terminal and call.id not in self.gone_calls:
                        self.gone_calls.append(call.id)
                        del self.gone_calls[:-200]
                key = (state.turn_id, state.iteration)
                if state.phase is Phase.AWAITING_APPROVAL and key not in self.reviewed:
                    self.reviewed.add(key)
                    await self._review(state)

    async def _questions(self, hands: trio.Nursery) -> None:
        async for _ in self.session.states():
            for question in self.session.questions:
                if question.id not in self.answered:
                    self.answered.add(question.id)
                    leg = self.watch.leg
                    if leg is not None:
                        leg.question_opened(question.id, trio.current_time())
                    hands.start_soon(self._answer, question.id, leg)

    async def _answer(self, question_id: str, leg: Leg | None) -> None:
        await trio.sleep(self.rng.uniform(0.0, 0.25))
        roll = self.rng.random()
        if roll < 0.1:
            self._count("question_ignored")  # the review timeout (or Stop, or the turn's end) closes it
            return
        action = "accept" if roll < 0.75 else ("decline" if roll < 0.88 else "cancel")
        content = {"section": self.rng.choice(("top", "end"))} if action == "accept" else None
        try:
            answered = self.session.answer(question_id, action, content)
        except AnswerError:
            answered = False
            self._count("question_answer_error")
        if leg is not None:
            leg.question_closed(question_id, trio.current_time())
        self._count(f"question_{action}" if answered else "question_gone")
        if self.rng.random() < 0.15:
            late = self.session.answer(question_id, "accept", {"section": "top"})  # the card is gone now
            self._count("late_answer_taken" if late else "late_answer_refused")

    async def _review(self, seen: TurnState) -> None:
        await trio.sleep(self.rng.uniform(0.0, 0.3))  # reading the cards
        state = self.session.state
        if state is None or state.phase is not Phase.AWAITING_APPROVAL or state.turn_id != seen.turn_id:
            return
        roll = self.rng.random()
        if roll < 0.03:
            self._count("walk_away")
            return
        if roll < 0.08:
            self._click()
            self._count("stop_in_review" if self.session.stop() else "stop_refused")
            return
        if roll < 0.16:
            self._click()
            self.suspending = True
            self._count("suspend")
            try:
                await self.session.suspend()
            except SessionJournalError:
                self._count("suspend_journal_error")  # the conversation sees it too, and reopens the journal
            finally:
                self.suspended.set()
            return
        self.decide(state)
        if self.gone_calls and self.rng.random() < 0.12:
            old = self.rng.choice(self.gone_calls)
            taken = self.session.approve(old)
            self.ledger.emit("late_click", sid=self.sid, call=old, taken=taken)

    def decide(self, state: TurnState) -> None:
        """Decide every pending card of ``state`` (the newest state: each card is pending when clicked)."""
        for call in state.current_calls:
            if call.status is not CallStatus.PENDING:
                continue
            roll = self.rng.random()
            approve = roll < (0.45 if call.destructive else 0.62)
            edit = approve and call.tool_name == "append_line" and self.rng.random() < 0.2
            self._click()
            if edit:
                token = f"T-{call.id.removeprefix('toolu_').replace('_', '-')}"
                taken = self.session.approve(call.id, edited_input={"call": call.id, "line": f"{token} edited"})
                what = "edit"
            elif approve:
                taken = self.session.approve(call.id)
                what = "approve"
            else:
                taken = self.session.deny(call.id, reason=self.rng.choice(("not now", "wrong line", "no")))
                what = "deny"
            self._count(what if taken else f"{what}_refused")
            if taken and what != "deny":
                self.ledger.emit("approve", sid=self.sid, call=call.id, edited=edit)
