"""A session's one turn at a time: the turn running now, or the turn suspended in review waiting to be taken up
again (with the decisions the person already made for it), and how a turn's end becomes the session's next
conversation, undo target or suspended turn.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Generic, TypeVar

import attrs
import trio

from trioloop.durable.session_file import SessionSnapshot
from trioloop.machine.calls import CallStatus
from trioloop.machine.limits import NO_SPENDING, Spending, SpendLimits, TurnLimits
from trioloop.machine.prices import ModelPrice
from trioloop.machine.rules import EMPTY_RULES, SESSION_SOURCE, ApprovalRule, RuleSet
from trioloop.machine.state import Phase, TurnState
from trioloop.protocol.events import Usage, usage_sum
from trioloop.protocol.messages import Message
from trioloop.protocol.provider import ChatProvider
from trioloop.runtime.answers import AnswerForm, answer_form
from trioloop.runtime.controls import TurnControls
from trioloop.runtime.journaling import ResumePoint
from trioloop.runtime.publisher import StatePublisher
from trioloop.runtime.remote_review import RemoteReview
from trioloop.runtime.runner import run_turn
from trioloop.runtime.session_journal import JournalHandle, SessionJournal
from trioloop.runtime.spending import turn_spending
from trioloop.runtime.toolsets import Toolsets
from trioloop.runtime.workspace import TurnRequest, Workspace

__all__ = ["APPROVED_ALREADY", "SessionBusy", "TurnSetup", "TurnSlot"]

#: The statuses of calls already approved (by the person, or the read-only policy), running or run: a batch that
#: lists one (a face's "approve all" over the current calls) simply covers it. A call decided against (denied,
#: failed) or unknown still refuses the whole batch.
APPROVED_ALREADY: frozenset[CallStatus] = frozenset({CallStatus.APPROVED, CallStatus.RUNNING, CallStatus.SUCCEEDED})

D = TypeVar("D")


class SessionBusy(RuntimeError):
    """``send`` was called while a turn is still in flight."""


@attrs.frozen(kw_only=True)
class TurnSetup:
    """The session's settings as the next turn takes them (an app may change them between turns)."""

    provider: ChatProvider
    model: str
    system: str
    limits: TurnLimits
    max_output_tokens: int
    #: Who decides, as the journal records each decision.
    actor: str
    #: The session's token and cost bounds across its turns, and the app's prices (before trioloop's table).
    session_limits: SpendLimits | None = None
    prices: Mapping[str, ModelPrice] | None = None
    #: The approval rules the turn decides by (the app's, the files', the session's).
    rules: RuleSet = EMPTY_RULES


class TurnSlot(Generic[D]):
    """The running turn's controls, or the suspended turn and its pending decisions; the conversation, the turn
    count, the tokens of the settled turns, and the turn `Session.undo_last_turn` undoes.

    Given the workspace its turns write, the publisher their states go to, the toolsets (listed again before a
    turn, and the tools it offers), the session's journal, and two callbacks into the session: ``nursery`` (the
    one its tools live in; `SessionClosed` without one) and ``snapshot`` (the session as a session file holds it,
    for a compacted journal)."""

    def __init__(
        self,
        *,
        workspace: Workspace[D],
        publisher: StatePublisher,
        toolsets: Toolsets[D],
        journal: JournalHandle,
        nursery: Callable[[], trio.Nursery],
        snapshot: Callable[[], SessionSnapshot[D]],
        history: tuple[Message, ...] = (),
    ) -> None:
        self.workspace = workspace
        self.publisher = publisher
        self.toolsets = toolsets
        self.journals = journal
        self.nursery = nursery
        self.snapshot = snapshot
        #: The conversation so far (pairable): what the next turn sends.
        self.history = history
        self.controls: TurnControls | None = None  # the turn running now
        self.resume: ResumePoint | None = None  # a live turn suspended in review (or cut by a crash)
        self.pending: TurnControls | None = None  # its decisions, taken before `continue_turn`
        self.ended = trio.Event()
        self.ended.set()
        self.started = 0
        self.last_turn_id: str | None = None
        self.usage = Usage()  # every settled turn's tokens (those of a saved or journaled session included)
        #: The session's own rules (a person's "always" from a card), as the last turn left them.
        self.session_rules: tuple[ApprovalRule, ...] = ()
        self.running = ""  # the id of the turn running now (its states carry the rules it decides by)
        self.answer: AnswerForm[Any] | None = None  # the typed answer of the turn last sent or continued

    def restore(
        self, *, started: int, last_turn_id: str | None, usage: Usage, rules: tuple[ApprovalRule, ...] = ()
    ) -> None:
        """Continue a saved or journaled session's numbering, token count and session rules."""
        self.started, self.last_turn_id, self.usage = started, last_turn_id, usage
        self.session_rules = rules

    def live_rules(self) -> RuleSet | None:
        """The rules of the turn running or suspended now (a person's "always" changes them mid-turn), or None
        (between turns, or a turn not yet submitted: it decides by the session's)."""
        if self.controls is not None:
            state = self.publisher.state
            return state.rules if state is not None and state.turn_id == self.running else None
        if self.resume is not None:
            return self.resume.state.rules
        return None

    def forget_rule(self, number: int, actor: str) -> bool:
        """Remove session rule ``number``: from the live turn's rules (a reducer input, journaled), or between
        turns from the session's (journaled as a ``rules`` entry with the next append). False when there is none."""
        live = self.live_rules()
        rules = live.rules if live is not None else self.session_rules
        if not any(r.source == SESSION_SOURCE and r.number == number for r in rules):
            return False
        controls = self.deciding()
        if controls is not None:  # a turn runs (or waits, suspended): its reducer forgets it, journaled
            return controls.forget_rule(number)
        self.session_rules = tuple(r for r in self.session_rules if r.number != number)
        journal = self.journals.journal
        if journal is not None:
            journal.add("rules", {"rules": [r.to_json() for r in self.session_rules], "by": actor})
        return True

    def live_review(self) -> tuple[TurnControls, TurnState, bool] | None:
        """The controls a decision goes to, the state it is judged against, and whether the turn is suspended;
        None when no turn is live."""
        if self.controls is not None:
            state = self.publisher.state
            if state is None or state.turn_id != self.running:
                return None
            return self.controls, state, False
        if self.resume is not None and self.pending is not None:
            return self.pending, self.resume.state, True
        return None

    def remote_review(self, poll_s: float) -> RemoteReview | None:
        """The session's decision box judged against its live turn, when its journal's store has one."""
        journal = self.journals.journal
        if journal is None or journal.box is None:
            return None
        writer = journal.turns.writer
        return RemoteReview(
            box=journal.box,
            session_id=journal.lease.session_id,
            keys=lambda: journal.keys,
            live=self.live_review,
            vouch=writer.vouch,
            newest=lambda: self.publisher.state,
            states=self.publisher.states,
            poll_s=poll_s,
        )

    def take_up(self, resume: ResumePoint) -> None:
        """Hold ``resume`` (a live turn read back from a journal) until `continue_turn`."""
        self.resume = resume
        self.pending = TurnControls()

    def publish(self, state: TurnState) -> None:
        """Publish ``state`` (a settled turn's last state is handed over once)."""
        self.publisher.publish(state, turn_running=self.controls is not None)

    def deciding(self) -> TurnControls | None:
        """Where a decision goes: the running turn, or the suspended one (taken when it continues)."""
        return self.controls if self.controls is not None else self.pending

    def deciding_on(
        self, call_ids: tuple[str, ...], *, covered: frozenset[CallStatus] = frozenset()
    ) -> TurnControls | None:
        """Where a decision on ``call_ids`` goes, or None when one of them has no card open (a late click on a
        card that is gone, another turn's call): such a decision is refused (False), not queued to be dropped. A
        call in a ``covered`` status (a batch's: one already approved) is no reason to refuse."""
        controls = self.deciding()
        state = self.resume.state if self.controls is None and self.resume is not None else self.publisher.state
        if controls is None or state is None or not call_ids:
            return None
        for call_id in call_ids:
            call = state.call(call_id)
            if call is None or (call.status is not CallStatus.PENDING and call.status not in covered):
                return None
        return controls

    async def send(self, text: str, setup: TurnSetup, answer: AnswerForm[Any] | None = None) -> TurnState:
        if self.controls is not None:
            raise SessionBusy("A turn is already running in this session; wait for it or stop it first.")
        if self.resume is not None:
            raise SessionBusy("A turn suspended in review is waiting: take it up with continue_turn() first.")
        spending = turn_spending(  # PriceUnknown now, before anything is listed or sent
            model=setup.model,
            limits=setup.limits,
            session_limits=setup.session_limits,
            prices=setup.prices,
            session_before=self.usage,
        )
        controls = TurnControls()
        spent_s = 0.0
        toolsets = self.toolsets
        if toolsets:
            # Part of the turn: Stop ends it, and the time it takes counts against the turn's deadline.
            self.controls = controls
            began = trio.current_time()
            listing = trio.CancelScope(deadline=began + setup.limits.turn_deadline_ms / 1000)
            controls.scopes.work.add(listing)
            try:
                with listing:
                    await toolsets.refresh()
            finally:
                controls.scopes.work.discard(listing)
                self.controls = None
            spent_s = trio.current_time() - began
        self.started += 1
        self.answer = answer
        return await self.run(text, f"turn-{self.started}", setup, None, controls, spent_s, spending)

    def answer_for(self, output: Any, default: Any) -> AnswerForm[Any] | None:
        """The typed answer a suspended turn continues with: made for ``output`` with the tool its state names, else
        the one its ``send`` gave (``default`` when ``output`` is not given), if it is that turn's."""
        spec = None if self.resume is None else self.resume.state.answer
        if spec is None:
            return None
        form = self.answer if output is default else answer_form(output, tool_name=spec.tool_name)
        return form if form is not None and form.spec.to_json() == spec.to_json() else None

    async def continue_turn(self, setup: TurnSetup, answer: AnswerForm[Any] | None = None) -> TurnState:
        if self.controls is not None:
            raise SessionBusy("A turn is already running in this session.")
        resume = self.resume
        if resume is None:
            raise SessionBusy("No suspended turn: there is nothing to continue.")
        _ = self.nursery()  # SessionClosed before the suspended turn is taken, so a refusal loses nothing
        journal = self.journals.journal
        if journal is not None:
            journal.check()
        controls, self.pending = self.pending, None
        self.resume = None
        if journal is not None:
            journal.add("resume", {"by": setup.actor, "turn_id": resume.state.turn_id})
        self.answer = answer
        return await self.run("", resume.state.turn_id, setup, resume, controls)

    async def run(
        self,
        text: str,
        turn_id: str,
        setup: TurnSetup,
        resume: ResumePoint | None,
        controls: TurnControls | None = None,
        spent_s: float = 0.0,
        spending: Spending = NO_SPENDING,
    ) -> TurnState:
        journal = self.journals.journal
        if journal is not None:
            journal.check()
        nursery = self.nursery()
        publisher = self.publisher
        self.running = turn_id
        controls = controls or TurnControls()
        controls.on_questions = publisher.questions_changed
        self.controls = controls
        self.ended = trio.Event()
        request = TurnRequest(
            text=text,
            turn_id=turn_id,
            model=setup.model,
            system=setup.system,
            base_messages=self.history,
            registry=self.toolsets.registry,
            limits=setup.limits,
            max_output_tokens=setup.max_output_tokens,
            spent_s=spent_s,
            spending=spending,
            rules=setup.rules,
            answer=self.answer,
        )
        if journal is not None:
            journal.turns.writer.actor = setup.actor
            journal.turns.on_settled = partial(self._closing_snapshot, journal, turn_id)
        try:
            state = await run_turn(
                request,
                self.workspace,
                setup.provider,
                tool_nursery=nursery,
                controls=controls,
                on_state=self.publish,
                journal=None if journal is None else journal.turns,
                resume=resume,
            )
        finally:
            self.controls = None
            if journal is not None:
                journal.turns.on_settled = None
            final = publisher.state
            if final is not None and final.turn_id == turn_id:  # this turn's rules (an "always" added some)
                self.session_rules = final.rules.of_source(SESSION_SOURCE)
            if final is not None and final.is_settled:
                self.history = final.messages
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
            self.publish(state)
        if journal is not None:
            if state.is_settled and journal.turns.writer.snapshot_due:
                journal.turns.writer.snapshot(self.snapshot())  # compaction: reopening replays from here
            await journal.flush()
        return state

    def _closing_snapshot(self, journal: SessionJournal, turn_id: str, state: TurnState) -> None:
        """The session after the turn that settled in ``state``, as a snapshot, when one is due (compaction:
        reopening replays from here); written in the turn's last append."""
        writer = journal.turns.writer
        if writer.snapshot_due:
            writer.snapshot(
                attrs.evolve(
                    self.snapshot(),
                    messages=state.messages,
                    last_turn_id=turn_id,
                    usage=usage_sum(self.usage, state.usage),
                    rules=state.rules.of_source(SESSION_SOURCE),
                )
            )

    async def suspend(self) -> TurnState | None:
        controls = self.controls
        if controls is not None:
            state = self.publisher.state
            if state is not None and state.phase is Phase.AWAITING_APPROVAL:
                controls.suspend()
            else:
                controls.stop()
            await self.ended.wait()
        journal = self.journals.journal
        if journal is not None:
            await journal.flush()
        return self.publisher.state
