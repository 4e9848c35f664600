"""One turn's single consumer: every input reaches the reducer here, from one inbox, in one order.

`Turn` holds the state (its only writer is `reduce_turn`, called from `apply`), takes what each wake-up brought
from the inbox (the stream events of one network read are one reducer step and one published state), performs
the effects the state asks for (a request, the approved calls, the next iteration), makes the journal durable
before an effect is visible outside the process, and settles the turn on Stop or a bound. The jobs around it are
its collaborators: `TurnClock` (the deadline), `PersonWaits` (review and questions), `ProviderRequests` and
`ToolCalls`.
"""

from __future__ import annotations

from typing import Generic, Literal, TypeVar

import trio

from trioloop.durable.replay import recovery_inputs
from trioloop.machine.inputs import (
    Advance,
    ApproveBatch,
    ApproveCall,
    CallSettled,
    Cancel,
    DenyCall,
    Submit,
    TurnInput,
)
from trioloop.machine.limits import Bound
from trioloop.machine.reducer import NO_STATE_CHANGE, reduce_turn
from trioloop.machine.state import Phase, TurnState
from trioloop.machine.stream_fold import fold_text_deltas
from trioloop.protocol.events import StreamError, StreamEvent, ToolCallComplete
from trioloop.protocol.provider import ChatProvider
from trioloop.runtime.approvals import ask_needs_approval
from trioloop.runtime.clock import REQUEST_DEADLINE_GRACE_S, TurnClock, now_ms
from trioloop.runtime.controls import TurnControls
from trioloop.runtime.inbox import InboxItem, RequestEnded, StreamBatch, StreamItem
from trioloop.runtime.journaling import ResumePoint, TurnJournal
from trioloop.runtime.person import PersonWaits
from trioloop.runtime.requests import ProviderRequests
from trioloop.runtime.sharpener import LEAD_S as SHARPEN_LEAD_S
from trioloop.runtime.tool_calls import ToolCalls
from trioloop.runtime.workspace import StateObserver, TurnRequest, Workspace

#: How long after the turn settled (Stop, its deadline, a review timeout) the entries saying how it ended may still
#: take to append. A settled state that holds no new commit is published before that append, so this delays only
#: ``run_turn``'s return; every other wait on the journal ends at the turn's deadline or Stop.
JOURNAL_GRACE_S = 0.25

__all__ = ["EndedTurn", "Turn"]

D = TypeVar("D")


class EndedTurn:
    """A turn whose drive is over, as its parts see it (`TurnView`): its last state; nothing more is fed to it."""

    __slots__ = ("state",)

    def __init__(self, state: TurnState) -> None:
        self.state = state

    def apply(self, item: TurnInput) -> None:
        raise RuntimeError(f"the turn is over: {type(item).__name__} came after its drive ended")

    async def sync(self) -> None:
        await trio.lowlevel.checkpoint()


class Turn(Generic[D]):
    """The state of one live turn and the one task that feeds it (see the module docstring)."""

    def __init__(
        self,
        request: TurnRequest[D],
        workspace: Workspace[D],
        provider: ChatProvider,
        controls: TurnControls,
        on_state: StateObserver | None,
        tool_nursery: trio.Nursery,
        started_at: float,
        journal: TurnJournal | None = None,
    ) -> None:
        self.request = request
        self.journal = journal
        self.unpublished = False  # a state not yet published because its journal entries are not durable
        self.holding = False  # inside one wake-up's stream events: states are published once, at its end
        self.held = False  # a state changed while holding
        self.lookahead: InboxItem | None = None  # taken from the inbox while gathering a wake-up, not yet handled
        self.suspended = False
        self.workspace = workspace
        self.controls = controls
        self.inbox = inbox = controls.inbox
        self.receive = inbox.receiver  # the consumer's end of the inbox
        self.scopes = scopes = controls.scopes
        self.progress = controls.progress
        self.on_state = on_state
        self.state = TurnState.idle()
        self.clock = clock = TurnClock(scopes, started_at, request.limits.turn_deadline_ms)
        self.person = PersonWaits(
            self,
            asking=controls.asking,
            scopes=scopes,
            inbox=inbox,
            clock=clock,
            provider=provider,
            model=request.model,
        )
        self.requests = ProviderRequests(self, request=request, provider=provider, inbox=inbox.sender, clock=clock)
        self.tools = ToolCalls(
            self,
            nursery=tool_nursery,
            workspace=workspace,
            request=request,
            inbox=inbox,
            scopes=scopes,
            progress=controls.progress,
            asking=controls.asking,
            person=self.person,
            clock=clock,
            journal=journal,
            stop=controls.stop,
        )
        # The document and undo history as the journal last confirmed them: put back if an append fails, so
        # the live session never holds (or shows) a commit its journal may not have.
        self.durable = (workspace.document, workspace.undo)

    # -- state -----------------------------------------------------------------------------------

    def apply(self, item: TurnInput) -> None:
        new = reduce_turn(self.state, item)
        if new is not self.state:
            old, self.state = self.state, new
            journal = self.journal
            if journal is not None:
                journal.writer.note(item, old, new, self.workspace.document)
            if (old.phase is Phase.AWAITING_APPROVAL) is not (new.phase is Phase.AWAITING_APPROVAL):
                self.person.check()
            if self.on_state is not None:
                if journal is not None and journal.error is not None:
                    pass  # the journal failed: nothing it may not hold is shown (the session raises, reopen it)
                elif journal is not None and (journal.writer.commit_pending or new.phase is Phase.AWAITING_APPROVAL):
                    # Published by `sync`, once durable: a commit, and the cards a person is about to see.
                    self.unpublished = True
                elif self.holding:
                    self.held = True  # published once, when the wake-up's events are all applied
                else:
                    self.on_state(new)

    async def sync(self) -> None:
        """Make the journal entries made so far durable, then publish the state they held back.

        Does nothing (and no checkpoint) without a journal or with nothing to write. A failed append
        stops the turn: nothing that could not be recorded may run."""
        journal = self.journal
        if journal is None:
            return
        # Bounded by Stop and by the turn's deadline (which stands still while the turn waits for the person); once
        # the turn is settling, by what is left of its deadline or a short grace, whichever is longer. An append cut
        # short fails the journal (the turn stops and says so).
        wait_until = self.clock.scope_deadline
        if self.inbox.closed and not self.clock.waiting:
            wait_until = max(wait_until, trio.current_time() + JOURNAL_GRACE_S)
        if journal.writer.has_ready:
            if not await journal.flush(wait_until, self.scopes.work):
                self.controls.stop()
                # What the failed append held is unknown to the journal: the live document goes back to what it
                # confirmed, and the state that held it back is never published (reopening reads the truth).
                self.workspace.document, self.workspace.undo = self.durable
                self.unpublished = False
                return
            self.durable = (self.workspace.document, self.workspace.undo)
        if self.unpublished:
            self.unpublished = False
            if self.on_state is not None:
                self.on_state(self.state)

    # -- driving ---------------------------------------------------------------------------------

    async def drive(self, resume: ResumePoint | None) -> TurnState:
        """Drive the turn to a settled state (or suspended in review): submit the request's text, or take up
        ``resume``, then consume the inbox under the turn's scope until it settles."""
        request, clock, scopes = self.request, self.clock, self.scopes
        if resume is None:
            self.apply(
                Submit(
                    turn_id=request.turn_id,
                    text=request.text,
                    base_messages=request.base_messages,
                    tool_set=request.registry,
                    limits=request.limits,
                    now_ms=int(clock.started_at * 1000),
                    spending=request.spending,
                    rules=request.rules,
                    answer=None if request.answer is None else request.answer.spec,
                )
            )
        else:
            # ``started_at`` is now minus the machine time already spent: the deadline continues where it stood.
            clock.restart(clock.started_at, resume.state.limits.turn_deadline_ms)
        try:
            # The request tasks' nursery holds the turn's scope, not the other way round: Stop and the deadline
            # cancel the turn's scope, the consumer settles, and only then are the requests cancelled (below).
            # Its own deadline, just after the turn's, is the backstop and what a provider sees as its own.
            async with trio.open_nursery() as requests:
                self.requests.nursery = requests
                clock.backstop = requests.cancel_scope
                requests.cancel_scope.deadline = clock.deadline + REQUEST_DEADLINE_GRACE_S
                try:
                    with trio.CancelScope(deadline=clock.deadline) as turn_scope:
                        scopes.turn = turn_scope
                        if resume is not None:
                            self.take_up(resume, now_ms())
                        if scopes.stop_requested:
                            turn_scope.cancel()
                        with trio.CancelScope(deadline=clock.deadline - SHARPEN_LEAD_S) as approach:
                            clock.approach = approach
                            approach.deadline = turn_scope.deadline - SHARPEN_LEAD_S  # a resumed review moved it
                            await self.consume()
                        clock.approach = None
                        if not self.state.is_settled and not self.suspended:
                            # The deadline is near (and only then, so a turn that ends sooner spawns nothing):
                            # Trio's timer rounds up to the millisecond, the sharpener makes it fire on time.
                            requests.start_soon(clock.sharpener.run, name="trioloop deadline sharpener")
                            await self.consume()
                finally:
                    # Settled (or failing): nothing still running (a request, the sharpener) is wanted, on
                    # every way out. A cancel costs even when no task is left to see it.
                    if requests.child_tasks:
                        requests.cancel_scope.cancel()
        finally:
            # Runs on Stop, on the deadline, and even when a scope outside the turn cancels us: the turn
            # always ends settled (unless suspended in review). The one await is shielded and bounded.
            if self.suspended:
                await self.sync()
            else:
                await self.settle()
            scopes.turn = None
            self.inbox.end()
            self.let_go()
        return self.state

    def let_go(self) -> None:
        """The drive is over: each part now sees the turn as its last state alone (`EndedTurn`), so the turn and
        its parts hold no reference cycle, and reference counting frees a turn's objects (its requests, calls,
        channels, scopes) as soon as nothing else needs them, rather than the garbage collector's full walk of
        the process. A tool still running after the drive finds the turn's last state, settled or suspended, as it
        would have on the turn itself."""
        ended = EndedTurn(self.state)
        self.person.turn = self.requests.turn = self.tools.turn = ended

    def take_up(self, resume: ResumePoint, now_ms: int) -> None:
        """Put a journaled live turn back in place: its state, its review clock, then the recovery inputs."""
        state = resume.state
        self.state = state
        if state.phase is Phase.AWAITING_APPROVAL:
            self.clock.take_up_review(resume.review_waited_ms, state.limits.review_timeout_ms)
        if self.on_state is not None:
            self.on_state(state)
        for item in recovery_inputs(state, resume.card_digests, now_ms=now_ms):
            self.apply(item)

    # -- the one consumer ------------------------------------------------------------------------

    async def consume(self) -> None:
        receive = self.receive
        while not self.state.is_settled:
            if self.journal is not None and (
                self.unpublished or (self.state.phase is Phase.AWAITING_APPROVAL and self.journal.writer.has_ready)
            ):
                # A commit is durable before its state is published or anything else runs, and the cards
                # are durable before the turn waits for the person (who may take a day: a crash meanwhile
                # must not lose them).
                await self.sync()
            await self.perform_effects()
            if self.state.is_settled:
                break
            try:
                # What is already in the inbox is taken without a scheduler pass (a batch and the
                # request's end arrive together): the wait, and the pass it costs, come only when the
                # inbox is empty. Stop and the
                # deadline are still seen first, before anything queued is handled.
                await trio.lowlevel.checkpoint_if_cancelled()
                item = self.next_nowait()
                if item is None:
                    item = await receive.receive()
            except trio.Cancelled:
                if self.approaching():
                    raise  # the deadline draws near (only the approach scope is cancelled): `drive` goes on
                if self.scopes.suspend_requested and not self.scopes.stop_requested and self.try_suspend():
                    raise  # suspended in review: nothing settles; `drive` ends the turn's tasks
                # Stop, the deadline or a scope outside: settle now, before the request task is
                # cancelled (``drive`` does that next) and unwinds (an HTTP response being closed):
                # nothing it does can reach the workspace, so the settled state need not wait for it.
                # run_turn still returns only after every task has ended.
                await self.settle()
                raise
            self.take(item)

    def next_nowait(self) -> InboxItem | None:
        """The next inbox item without waiting (the one a wake-up's gathering stopped at first), or None."""
        item, self.lookahead = self.lookahead, None
        if item is not None:
            return item
        try:
            return self.receive.receive_nowait()  # per inbox item: no method of the inbox's in between
        except (trio.WouldBlock, trio.ClosedResourceError, trio.EndOfChannel):
            return None

    def take(self, item: InboxItem) -> None:
        """Handle ``item`` and, if it holds stream events, every stream event already waiting behind it.

        One wake-up of the consumer: the events of the current request that are in the inbox (the batches
        of every HTTP chunk one socket read brought) are folded together (consecutive text deltas become
        one) and applied in order, and the state they make is published once, at the end. The first other
        item stops the gathering and is handled next, after this wake-up's effects.
        """
        if not isinstance(item, StreamBatch | StreamItem):
            self.handle(item)
            return
        attempt = self.requests.attempt
        following: InboxItem | None = self.next_nowait()
        if following is None and type(item) is StreamBatch:
            # The paced case: one batch alone (one HTTP chunk came in since the last wake-up), handled as it is.
            if item.attempt == attempt:
                self.handle_held(item)
            return
        events: list[StreamEvent] = []
        if following is not None:
            self.lookahead = following  # gathered below, in order, after ``item``
        following = item
        while following is not None:
            if not isinstance(following, StreamBatch | StreamItem):
                self.lookahead = following
                break
            if following.attempt == attempt:  # a superseded request's events are never seen
                if isinstance(following, StreamBatch):
                    events += following.events
                else:
                    events.append(following.event)
            following = self.next_nowait()
        if events:
            self.handle_held(StreamBatch(attempt, tuple(events)))

    def handle_held(self, batch: StreamBatch) -> None:
        """Handle one wake-up's events, publishing the state they make once, at the end."""
        self.holding = True
        try:
            self.handle(batch)
        finally:
            self.holding = False
        if self.held:
            self.held = False
            if self.on_state is not None and not self.unpublished:
                self.on_state(self.state)

    def try_suspend(self) -> bool:
        """Suspend the turn if it is (still) in review once the decisions already queued are taken."""
        while self.state.phase is Phase.AWAITING_APPROVAL:
            item = self.next_nowait()
            if item is None:
                break
            if isinstance(item, ApproveCall | ApproveBatch | DenyCall):
                self.apply(item)
        if self.state.phase is not Phase.AWAITING_APPROVAL:
            self.controls.stop()  # decided meanwhile: suspending is Stop in any other phase
            return False
        self.suspended = True
        self.inbox.close()
        waited = self.clock.review_waited_ms() or 0
        machine = max(self.clock.machine_ms(), 0)
        self.controls.suspended_at = (machine, waited)
        if self.journal is not None:
            self.journal.writer.add("suspend", {"machine_ms": machine, "review_waited_ms": waited})
        return True

    def approaching(self) -> bool:
        """Whether the approach scope is cancelled and nothing else that concerns the turn is (yet)."""
        approach = self.clock.approach
        return approach is not None and approach.cancel_called and not self.scopes.turn_cancelled

    def handle(self, item: InboxItem) -> None:
        if isinstance(item, RequestEnded):
            if item.attempt == self.requests.attempt:
                self.requests.open = False
                if not item.terminal_sent and self.state.phase in (Phase.REQUESTING, Phase.STREAMING):
                    self.handle_stream_event(
                        StreamError(
                            code="malformed_stream",
                            message="The AI response ended before it was complete. Please try again.",
                        )
                    )
            return
        if isinstance(item, StreamItem):
            if item.attempt != self.requests.attempt:
                return  # a stale event from a request we already gave up on
            self.handle_stream_event(item.event)
            return
        if isinstance(item, StreamBatch):
            if item.attempt != self.requests.attempt or self.scopes.turn_cancelled:
                return  # stale (a retry superseded it), or Stop or the deadline came first: never seen
            for event in fold_text_deltas(item.events):
                if self.scopes.stop_requested or self.state.is_settled or item.attempt != self.requests.attempt:
                    return  # an observer stopped the turn, or it settled, or retried: the rest is cut off
                if type(event) in NO_STATE_CHANGE:
                    self.requests.saw_first_event = True  # a tool call's start, an input delta: no state to make
                    self.progress.follow(event)
                    continue
                self.handle_stream_event(event)
            return
        self.apply(item)

    def handle_stream_event(self, event: StreamEvent) -> None:
        self.progress.follow(event)
        if not isinstance(event, StreamError) or not event.terminal:
            self.requests.saw_first_event = True
        elif self.requests.retried(event):
            return
        if type(event) is ToolCallComplete:
            answer = self.state.answer
            form = self.request.answer
            if answer is not None and event.name == answer.tool_name:
                if form is not None and form.spec.to_json() == answer.to_json() and event.input_error is None:
                    self.apply(form.check(event))  # checked against the app's type; journaled with the response
                self.apply(event)
                return
            tool = self.request.registry.get(event.name)
            if tool is not None and tool.needs_approval is not None:
                verdict = ask_needs_approval(tool, event)
                if verdict is not None:
                    self.apply(verdict)
        self.apply(event)

    # -- effects ---------------------------------------------------------------------------------

    async def perform_effects(self) -> None:
        # Loop because starting calls or advancing yields a new state that may ask for more.
        while True:
            state = self.state
            if state.phase is Phase.REQUESTING and not self.requests.open:
                if self.journal is not None and self.journal.writer.submit_pending:
                    await self.sync()  # the turn (the person's words) is durable before its first request
                    if self.scopes.turn_cancelled:
                        return
                self.requests.start(backoff_s=0.0)
            elif state.phase is Phase.EXECUTING:
                current = state.current_calls
                await self.tools.start_approved(current)
                if self.state is not state:
                    continue
                if all(c.status.is_terminal for c in current):
                    self.apply(Advance(now_ms=self.machine_now_ms()))
                    if self.state is not state:
                        continue
            return

    # -- settling --------------------------------------------------------------------------------

    async def settle(self) -> None:
        """Settle the turn if it is not settled yet: cancel and await its tools (bounded), record the
        settlements already in the inbox, then ``Cancel`` with the bound that ran out, or ``stop``.

        Runs once where the consumer first sees the cancellation and again (doing nothing new) in
        ``drive``'s ``finally``, which also covers a turn that completed with a tool still running.
        """
        if self.scopes.settling and self.state.is_settled:
            return
        # Which bound ran out matters only to a turn that is not settled yet (a completed turn skips it).
        bound = (
            None
            if self.scopes.stop_requested or self.state.is_settled
            else self.clock.timing_bound(self.state.budget, self.state.limits)
        )
        reason: Literal["stop", "deadline", "review_timeout"] = (
            "review_timeout" if bound is Bound.REVIEW_TIMEOUT else "deadline" if bound is Bound.DEADLINE else "stop"
        )
        await self.tools.cancel_all()
        self.inbox.close()
        if not self.state.is_settled:
            self.drain_settlements()
            self.apply(Cancel(reason=reason))
        if self.journal is not None and self.state.is_settled:
            if self.journal.writer.commit_pending:
                await self.sync()  # its state is published once this is durable: not after a snapshot too
            self.journal.settled(self.state)  # the session's snapshot (when due) goes in the turn's last append
        await self.sync()

    def drain_settlements(self) -> None:
        """Record tool settlements already in the inbox: their commits happened, so state must say so."""
        while (item := self.next_nowait()) is not None:
            if isinstance(item, CallSettled):
                self.apply(item)

    def machine_now_ms(self) -> int:
        """The turn's clock for its bounds: Trio's clock minus every wait for the person, counted from the
        budget's start so a scope deadline that fired is never a millisecond short of the bound."""
        return self.state.budget.started_at_ms + self.clock.machine_ms()
