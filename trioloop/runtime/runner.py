"""The Trio shell around the pure turn machine.

``run_turn`` owns one cancel scope (the turn deadline; Stop cancels it) and one nursery per turn, which
holds that scope. The provider request is a child task of that nursery, outside the turn's scope, so
Stop and the deadline reach the consumer first and the request is cancelled once the turn has settled.
Every ``async`` tool run is a child task of the *tool nursery* the caller owns (the `Session` passes
its own), so a tool that ignores cancellation can be abandoned after a bounded grace without leaving
the structured-concurrency tree: it still has a parent, which cancels and awaits it when it closes. A
plain ``def`` tool has no checkpoint to be cancelled at, so it runs in place, in the consumer, where its
call is started. Everything the tasks learn reaches the reducer through one inbox consumed by one task,
so state has a single writer and a single order. The runner knows no document type: the `DocumentKind`
in the `Workspace` validates, copies and compares documents. The runner performs only the effects the
state asks for and decides nothing about authorization: it starts what the reducer moved to ``running``
and nothing else. The turn deadline measures the machine, not the person: while the turn waits in
``awaiting_approval`` the scope's deadline stands still (``review_timeout_ms``, if set, is the only
bound then) and moves forward by the time waited once the review is decided.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Any, Final, Generic, Literal, TypeAlias, TypeVar

import attrs
import trio

from trioloop.durable.journal import JournalWriter, recovery_inputs
from trioloop.durable.store import StoredEntry
from trioloop.machine.document import DocumentKind
from trioloop.machine.limits import (
    DEFAULT_TURN_LIMITS,
    Bound,
    TurnLimits,
    question_cap,
    sampling_tokens,
    timing_exhaustion,
)
from trioloop.machine.questions import Answer, AnswerAction, Question, QuestionRefused, Sampled
from trioloop.machine.reducer import (
    NO_STATE_CHANGE,
    Advance,
    ApproveBatch,
    ApproveCall,
    CallRecord,
    CallSettled,
    CallStatus,
    Cancel,
    DenyCall,
    Phase,
    Retry,
    StartCall,
    Submit,
    TurnInput,
    TurnState,
    reduce_turn,
)
from trioloop.machine.stream_fold import fold_text_deltas
from trioloop.machine.texts import NOT_TEXT_RESULT
from trioloop.machine.tools import PreparedCall, RegisteredTool, ToolOutcome, ToolRegistry
from trioloop.machine.transaction import Committed, Refused, UndoHistory, commit_tool_outcome
from trioloop.protocol.events import (
    StreamError,
    StreamEvent,
    ThinkingDelta,
    ToolCallInputDelta,
    ToolCallStart,
    is_terminal,
    terminal_cut,
)
from trioloop.protocol.messages import Message
from trioloop.protocol.provider import ChatProvider
from trioloop.protocol.tools import ChatRequest
from trioloop.providers.base import is_retriable
from trioloop.runtime.sampling import sampled_from, sampling_chat_request
from trioloop.runtime.sharpener import LEAD_S as SHARPEN_LEAD_S
from trioloop.runtime.sharpener import DeadlineSharpener
from trioloop.runtime.tools import ToolExecutionContext

__all__ = ["TOOL_CANCEL_GRACE_S", "ResumePoint", "TurnControls", "TurnJournal", "TurnRequest", "Workspace", "run_turn"]

#: How long a cancelled tool may take to unwind before the turn abandons it (its value discarded).
TOOL_CANCEL_GRACE_S = 2.0
NOT_AN_OUTCOME = "The tool returned something that is not a tool outcome."
TOOL_CANCELLED_ITSELF = "The tool cancelled its own run; nothing it returned was used."

#: Turn-level retry backoff: 0.5 s doubling, capped at 10 s; the only retries of a turn's requests (each
#: request asks its provider for one attempt), lengthened by a server's retry-after up to 10 minutes.
_RETRY_BASE_S = 0.5
_RETRY_CAP_S = 10.0
_RETRY_AFTER_CEILING_S = 600.0
#: A request task runs outside the turn's scope and is cancelled by the consumer once the turn settles;
#: its nursery's deadline, this much after the turn's, is the backstop (and what the provider sees as
#: the effective deadline).
_REQUEST_DEADLINE_GRACE_S = 0.25

StateObserver: TypeAlias = Callable[[TurnState], None]


D = TypeVar("D")


@attrs.define(kw_only=True)
class Workspace(Generic[D]):
    """The live document, how to treat it, and its undo history: the only mutable things a turn writes."""

    document: D
    kind: DocumentKind[D]
    undo: UndoHistory[D] = attrs.field(factory=UndoHistory)


@attrs.frozen
class _RequestEnded:
    """The request task finished; ``terminal_sent`` says whether the provider sent a terminal event."""

    attempt: int
    terminal_sent: bool


@attrs.frozen
class _StreamItem:
    attempt: int
    event: StreamEvent


@attrs.frozen
class _StreamBatch:
    """The events of one network read, handed over together: one inbox item, one consumer wake-up."""

    attempt: int
    events: tuple[StreamEvent, ...]


_InboxItem: TypeAlias = TurnInput | _StreamItem | _StreamBatch | _RequestEnded


class TurnJournal:
    """Where a journaled turn writes: the entries `JournalWriter` makes, appended through ``append``.

    The runner appends what is ready before its effect is visible outside the process: every start (and
    the decisions before it) before any tool of that pass runs, a commit before its state is published or
    another call starts, the cards before the review is shown, a turn before its first request; the rest
    rides along with the next of these, or the end of the turn. An append that fails stops the turn
    (nothing runs that could not be recorded); ``error`` keeps the failure, and later entries are dropped.
    """

    def __init__(self, writer: JournalWriter, append: Callable[[Sequence[StoredEntry]], Awaitable[None]]) -> None:
        self.writer = writer
        self._append = append
        self.error: Exception | None = None

    async def flush(self) -> bool:
        """Append what is ready (shielded: a half-known append is worse than a late Stop); False on failure."""
        entries = self.writer.take()
        if not entries or self.error is not None:
            return self.error is None
        try:
            with trio.CancelScope(shield=True):
                await self._append(entries)
        except Exception as exc:
            self.error = exc
            return False
        return True


@attrs.frozen(kw_only=True)
class ResumePoint:
    """A live turn taken up again from its journal: its state, the machine time it had spent, and how long
    its review had waited (when it was suspended in review)."""

    state: TurnState
    machine_ms: int = 0
    review_waited_ms: int = 0
    card_digests: Mapping[str, str] = attrs.field(factory=dict)


class TurnControls:
    """The user's handle on a live turn. Every method is synchronous and becomes one reducer input.

    Call them from any Trio task (a UI task, a test). After the turn settles they do nothing and
    return False.
    """

    def __init__(self) -> None:
        send, receive = trio.open_memory_channel[_InboxItem](math.inf)
        self._send = send
        self._receive = receive
        self._scope: trio.CancelScope | None = None
        self._tool_scopes: set[trio.CancelScope] = set()
        self._stop_requested = False
        self._suspend_requested = False
        self._closed = False
        #: Set when the turn ended suspended in review: the machine time it had spent, the review's wait.
        self.suspended_at: tuple[int, int] | None = None
        #: What each running call last said of its progress (``ToolExecutionContext.report_progress``): call
        #: id -> (progress, total or None, message). A call's entry goes when it settles. Not part of the state.
        self.call_progress: dict[str, tuple[float, float | None, str]] = {}
        #: The tool call whose input is streaming now (its tool's name and the input's length so far), for a
        #: face to show while the model writes a long input; None between calls. Not part of the state.
        self.input_streaming: tuple[str, int] | None = None
        #: The open questions' waiters by question id, oldest first (see `questions`).
        self._waiting: dict[str, _Waiter] = {}
        #: Called (synchronously) each time a question opens or closes: the session wakes its faces.
        self.on_questions: Callable[[], None] | None = None

    def _put(self, item: _InboxItem) -> bool:
        if self._closed:
            return False
        try:
            self._send.send_nowait(item)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            return False
        return True

    def approve(self, call_id: str, edited_input: dict[str, Any] | None = None) -> bool:
        """Approve one call, or (with ``edited_input``) the user's edit of its input: the edit is prepared by
        the call's own tool, the grant binds the edited input, and the model is told which fields changed."""
        return self._put(ApproveCall(call_id=call_id, edited_input=edited_input))

    def approve_batch(self, call_ids: tuple[str, ...]) -> bool:
        """Approve the listed calls together (an explicit tuple captured at the click; destructive calls never
        included)."""
        return self._put(ApproveBatch(call_ids=tuple(call_ids)))

    def deny(self, call_id: str, reason: str = "") -> bool:
        """Decline one call; ``reason``, if given, reaches the model as the user's words (sanitized, capped)."""
        return self._put(DenyCall(call_id=call_id, reason=reason))

    def stop(self) -> bool:
        """Cancel the turn: its scope is cancelled now; the consumer settles it ``cancelled``."""
        if self._closed:
            return False
        self._stop_requested = True
        # Tools' own scopes first, so a running tool sees ``ctx.cancelled`` on its own scope.
        self._cancel_tools()
        if self._scope is not None:
            self._scope.cancel()
        return True

    def suspend(self) -> bool:
        """End the turn's tasks without settling it, if it is waiting for the review (else it is a Stop):
        the consumer takes the decisions already queued, then, still in review, ends the turn suspended."""
        if self._closed:
            return False
        self._suspend_requested = True
        if self._scope is not None:
            self._scope.cancel()
        return True

    @property
    def questions(self) -> tuple[Question, ...]:
        """The questions running calls put to the person and not yet answered, oldest first. Not part of the
        state: a question lives only as long as the call that asked it."""
        return tuple(waiter.question for waiter in self._waiting.values())

    def answer(self, question_id: str, action: AnswerAction, content: Mapping[str, Any] | None = None) -> bool:
        """Answer an open question: ``accept`` (a form's values, checked against its fields, a left-out field
        given its default), ``decline`` or ``cancel``. False if the question is not open (answered, ended).

        Raises `AnswerError` for values that do not fit (nothing is answered: ask the person again) and
        ``ValueError`` for an unknown action or values with a decline or cancel."""
        waiter = self._waiting.get(question_id)
        if waiter is None or waiter.answer is not None:
            return False
        if action == "accept":
            answer = Answer("accept", waiter.question.checked(content))
        elif action in ("decline", "cancel"):
            if content:
                raise ValueError(f"A {action} carries no values.")
            answer = Answer(action)
        else:
            raise ValueError(f"An answer is accept, decline or cancel, not {action!r}.")
        waiter.give(answer)
        return True

    def _end_questions(self, call_id: str | None = None) -> None:
        """Cancel the open questions (of ``call_id`` alone, if given): nobody answers them any more."""
        for waiter in tuple(self._waiting.values()):
            if call_id is None or waiter.question.call_id == call_id:
                waiter.give(Answer.cancelled())

    def _note_call_progress(self, call_id: str, progress: float, total: float | None, message: str) -> None:
        if not self._closed:
            self.call_progress[call_id] = (progress, total, message)

    def _note_progress(self, event: StreamEvent) -> None:
        """Follow a tool call's input as it streams (`input_streaming`); anything else ends it."""
        cls = type(event)
        if cls is ToolCallInputDelta:
            current = self.input_streaming
            if current is not None:
                self.input_streaming = (current[0], current[1] + len(event.partial_json))  # type: ignore[union-attr]
        elif cls is ToolCallStart:
            self.input_streaming = (event.name, 0)  # type: ignore[union-attr]
        elif self.input_streaming is not None and cls is not ThinkingDelta:
            self.input_streaming = None

    def _cancel_tools(self) -> None:
        """Cancel the scope of every tool still running (a tool's scope leaves the set as it ends), and
        every open question."""
        self._end_questions()
        for scope in tuple(self._tool_scopes):
            if not scope.cancel_called:  # cancel() costs even when it has nothing left to do
                scope.cancel()

    @property
    def turn_cancelled(self) -> bool:
        """Whether the turn is being cancelled (Stop, or its deadline passed)."""
        return self._stop_requested or (self._scope is not None and self._scope.cancel_called)

    @property
    def stop_requested(self) -> bool:
        """Whether Stop was asked for."""
        return self._stop_requested


class _Waiter:
    """One open question and, once given, its answer."""

    __slots__ = ("answer", "done", "question")

    def __init__(self, question: Question) -> None:
        self.question = question
        self.answer: Answer | None = None
        self.done = trio.Event()

    def give(self, answer: Answer) -> None:
        if self.answer is None:
            self.answer = answer
            self.done.set()


def _now_ms() -> int:
    return int(trio.current_time() * 1000)


def _ms(seconds: float) -> int:
    """A duration in whole milliseconds; the epsilon keeps 2.0 s from reading as 1999 ms after float error."""
    return math.floor(seconds * 1000 + 1e-6)


#: A provider that never waits between batches (a whole body already buffered) still yields this often, so
#: the consumer (and every other task, a GUI's included) runs while a long answer is being parsed.
_BATCHES_PER_YIELD: Final = 16


class _SendToInbox(trio.abc.SendChannel[StreamEvent]):
    """What the provider writes into: tags events with the request attempt and notes a terminal one."""

    def __init__(self, inbox: trio.MemorySendChannel[_InboxItem], attempt: int) -> None:
        self._inbox = inbox
        self._attempt = attempt
        self._unyielded = 0  # batches delivered since this channel last yielded to the scheduler
        self.terminal_sent = False

    async def send(self, value: StreamEvent) -> None:
        if self.terminal_sent:
            await trio.lowlevel.checkpoint()
            return  # nothing after a terminal event counts
        if is_terminal(value):
            self.terminal_sent = True
        await self._inbox.send(_StreamItem(self._attempt, value))

    def send_nowait(self, value: StreamEvent) -> None:
        if self.terminal_sent:
            return
        if is_terminal(value):
            self.terminal_sent = True
        self._inbox.send_nowait(_StreamItem(self._attempt, value))

    async def send_batch(self, events: Sequence[StreamEvent]) -> None:
        """Like ``send`` for each event in turn: seen cancelled before any is delivered, or not at all.

        A cancel point, and a schedule point only every ``_BATCHES_PER_YIELD`` batches: the provider's
        next network read is the schedule point otherwise, so the batches of the HTTP chunks one socket
        read brought (a fast stream) reach the consumer in one wake-up, and the reducer in one step. A
        batch that ends the stream never yields after it is delivered: nothing the provider sends later
        counts, so the request ends (and its end reaches the inbox) in the same scheduler pass.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        if self.terminal_sent:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        cut, ends = terminal_cut(events)
        if cut:
            self.terminal_sent = ends
            self._inbox.send_nowait(_StreamBatch(self._attempt, tuple(events if cut == len(events) else events[:cut])))
        self._unyielded += 1
        if not self.terminal_sent and self._unyielded >= _BATCHES_PER_YIELD:
            self._unyielded = 0
            await trio.lowlevel.cancel_shielded_checkpoint()

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()

    def clone(self) -> _SendToInbox:
        raise NotImplementedError("the turn's provider channel cannot be cloned")


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


def _failed_while_running(exc: Exception) -> ToolOutcome[Any]:
    return ToolOutcome.failure(f"The tool failed while running ({type(exc).__name__}).")


def _checked_outcome(produced: object, snapshot: D, kind: DocumentKind[D]) -> ToolOutcome[D]:
    """What a tool returned, or a failure naming the fault: only a well-formed outcome may be committed.

    A proposed document must be of the live document's own type; anything else is named, not committed.
    Never raises (a tool's object could misbehave when inspected): the call then fails as not an outcome.
    """
    try:
        return _checked(produced, snapshot, kind)
    except Exception:
        return ToolOutcome.failure(NOT_AN_OUTCOME)


def _checked(produced: object, snapshot: D, kind: DocumentKind[D]) -> ToolOutcome[D]:
    if not isinstance(produced, ToolOutcome):
        return ToolOutcome.failure(NOT_AN_OUTCOME)
    if not produced.is_text:
        return ToolOutcome.failure(NOT_TEXT_RESULT)
    proposed = produced.document
    if proposed is not None and not isinstance(proposed, type(snapshot)):
        return ToolOutcome.failure(
            f"The tool returned a document that is not a {kind.name} "
            f"(got {type(proposed).__name__}, expected {type(snapshot).__name__}); nothing changed."
        )
    checked: ToolOutcome[D] = produced
    return checked


class _Turn(Generic[D]):
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
        self.lookahead: _InboxItem | None = None  # taken from the inbox while gathering a wake-up, not yet handled
        self.suspended = False
        self.workspace = workspace
        self.tool_nursery = tool_nursery
        self.provider = provider
        self.controls = controls
        self.on_state = on_state
        self.state = TurnState.idle()
        self.attempt = 0
        self.request_open = False
        self.saw_first_event = False
        self.started: set[str] = set()
        self.tools_running = 0
        self.tools_idle = trio.Event()
        self.tools_idle.set()
        self.ending = False  # set when the turn starts settling: no tool value is committed after it
        self.started_at = started_at
        self.deadline = self.started_at + request.limits.turn_deadline_ms / 1000
        self.review_paused_s = 0.0  # time spent waiting for the reviewer: the turn deadline does not run then
        self.review_since: float | None = None
        self.waiting_for_person = False  # in review, or a running call's question is open: the deadline stands
        self.scope_deadline = self.deadline  # the deadline the turn's scope and the tools' scopes have now
        self.questions_asked = 0
        # A review taken up from a journal had already waited this long in an earlier process: it counts
        # against the review timeout, never against the turn deadline (it was never machine time).
        self.review_credit_s = 0.0
        self.requests: trio.Nursery | None = None  # the request tasks' nursery, outside the turn's scope
        self.sharpener = DeadlineSharpener(self.deadline)  # wakes the loop on time for the scope's deadline
        self.approach: trio.CancelScope | None = None  # fires SHARPEN_LEAD_S before the deadline: start the sharpener

    # -- state -----------------------------------------------------------------------------------

    def apply(self, item: TurnInput) -> None:
        new = reduce_turn(self.state, item)
        if new is not self.state:
            old, self.state = self.state, new
            journal = self.journal
            if journal is not None:
                journal.writer.note(item, old, new, self.workspace.document)
            if (old.phase is Phase.AWAITING_APPROVAL) is not (new.phase is Phase.AWAITING_APPROVAL):
                self.person_waits()
            if self.on_state is not None:
                if journal is not None and (journal.writer.commit_pending or new.phase is Phase.AWAITING_APPROVAL):
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
        if journal.writer.has_ready and not await journal.flush():
            self.controls.stop()
        if self.unpublished:
            self.unpublished = False
            if self.on_state is not None:
                self.on_state(self.state)

    # -- the reviewer's time ---------------------------------------------------------------------

    def person_waits(self) -> None:
        """Hold the deadline still, or let it run again, as the turn starts or stops waiting for the person:
        in review, or while a running call's question is open."""
        waiting = self.state.phase is Phase.AWAITING_APPROVAL or bool(self.controls._waiting)
        if waiting is not self.waiting_for_person:
            self.pause_deadline_for_review(waiting)

    async def ask(self, call_id: str, tool_name: str, question: Question) -> Answer:
        """A running call's question: numbered, shown to the faces, answered by the person (or cancelled by
        Stop, the call's end or the turn's end), the deadline standing still meanwhile."""
        controls = self.controls
        if controls._closed or self.ending or controls.turn_cancelled or self.state.is_settled:
            await trio.lowlevel.checkpoint()
            raise QuestionRefused("No one can be asked: the turn is ending.")
        if question_cap(self.questions_asked, self.state.limits):
            await trio.lowlevel.checkpoint()
            raise QuestionRefused(
                f"No one was asked: this turn has already put its {self.state.limits.max_questions_per_turn} "
                "questions to the person (max_questions_per_turn)."
            )
        self.questions_asked += 1
        question = attrs.evolve(question, id=f"q{self.questions_asked}", call_id=call_id, tool_name=tool_name)
        waiter = _Waiter(question)
        controls._waiting[question.id] = waiter
        self.person_waits()
        self.tell_questions()
        try:
            await waiter.done.wait()
        finally:
            waiter.give(Answer.cancelled())
            del controls._waiting[question.id]
            self.person_waits()
            self.tell_questions()
        assert waiter.answer is not None
        return waiter.answer

    async def sample(self, call_id: str, tool_name: str, question: Question) -> Sampled:
        """A running call's sampling request: a question card first; once the person accepts, one request to
        the session's model with the asker's text fenced and no tools, under the call's cancellation (Stop)
        and the turn deadline, which runs again while the model answers."""
        request = question.sampling
        if request is None:
            raise ValueError("not a sampling question")
        # The card shows the budget the model will really get.
        request = attrs.evolve(request, max_tokens=sampling_tokens(request.max_tokens, self.state.limits))
        question = attrs.evolve(question, sampling=request)
        answer = await self.ask(call_id, tool_name, question)
        if answer.action != "accept":
            return Sampled(action=answer.action)
        chat = sampling_chat_request(question, self.request.model, request.max_tokens)
        send, receive = trio.open_memory_channel[StreamEvent](math.inf)
        scope = trio.CancelScope(deadline=self.scope_deadline)
        self.controls._tool_scopes.add(scope)
        try:
            with scope:
                await self.provider.stream(chat, send)
        finally:
            self.controls._tool_scopes.discard(scope)
        if scope.cancelled_caught:
            return Sampled(action="accept", error="The turn was stopped before the model answered.")
        return sampled_from(receive, self.request.model)

    def tell_questions(self) -> None:
        hook = self.controls.on_questions
        if hook is not None:
            hook()

    def pause_deadline_for_review(self, waiting: bool) -> None:
        """The turn deadline measures the machine, not the person: it stands still while the turn waits
        in ``awaiting_approval`` and moves forward by the time waited when the review is decided. While
        waiting, the turn scope's deadline is the review timeout (none unless ``review_timeout_ms``)."""
        now = trio.current_time()
        self.waiting_for_person = waiting
        if waiting:
            self.review_since = now
            timeout_ms = self.state.limits.review_timeout_ms
            self.set_deadline(math.inf if timeout_ms is None else now + timeout_ms / 1000)
            return
        self.review_credit_s = 0.0  # the next review (if any) starts from nothing
        if self.review_since is not None:
            waited = now - self.review_since
            self.review_since = None
            self.review_paused_s += waited
            self.deadline += waited
        self.set_deadline(self.deadline)

    def set_deadline(self, deadline: float) -> None:
        """The turn scope's deadline, and the request nursery's backstop just after it. Each running tool's
        scope has the turn deadline too, or none while the turn waits for the person: a review timeout ends
        the turn (which then cancels its tools), never a tool on its own."""
        self.scope_deadline = math.inf if self.waiting_for_person else deadline
        scope = self.controls._scope
        if scope is not None:
            scope.deadline = deadline
        for tool_scope in self.controls._tool_scopes:
            tool_scope.deadline = self.scope_deadline
        if self.approach is not None:
            self.approach.deadline = deadline - SHARPEN_LEAD_S
        self.sharpener.move(deadline)
        if self.requests is not None:
            self.requests.cancel_scope.deadline = deadline + _REQUEST_DEADLINE_GRACE_S

    def machine_now_ms(self) -> int:
        """The turn's clock for its bounds: Trio's clock minus every wait for the reviewer, counted from
        the budget's start so a scope deadline that fired is never a millisecond short of the bound."""
        now = trio.current_time()
        waiting = 0.0 if self.review_since is None else now - self.review_since
        return self.state.budget.started_at_ms + _ms(now - self.started_at - self.review_paused_s - waiting)

    def timing_bound(self) -> Bound | None:
        """Whether the deadline or the review timeout has run out (checked in `budget_exhaustion`'s order)."""
        waited = (
            None if self.review_since is None else _ms(trio.current_time() - self.review_since + self.review_credit_s)
        )
        return timing_exhaustion(self.state.budget, self.state.limits, self.machine_now_ms(), review_waited_ms=waited)

    # -- the one consumer ------------------------------------------------------------------------

    async def consume(self) -> None:
        receive = self.controls._receive
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
                    raise  # the deadline draws near (only the approach scope is cancelled): _drive goes on
                if self.controls._suspend_requested and not self.controls._stop_requested and self.try_suspend():
                    raise  # suspended in review: nothing settles; _drive ends the turn's tasks
                # Stop, the deadline or a scope outside: settle now, before the request task is
                # cancelled (``_drive`` does that next) and unwinds (an HTTP response being closed):
                # nothing it does can reach the workspace, so the settled state need not wait for it.
                # run_turn still returns only after every task has ended.
                await self.settle()
                raise
            self.take(item)

    def next_nowait(self) -> _InboxItem | None:
        """The next inbox item without waiting (the one a wake-up's gathering stopped at first), or None."""
        item, self.lookahead = self.lookahead, None
        if item is not None:
            return item
        try:
            return self.controls._receive.receive_nowait()
        except (trio.WouldBlock, trio.ClosedResourceError, trio.EndOfChannel):
            return None

    def take(self, item: _InboxItem) -> None:
        """Handle ``item`` and, if it holds stream events, every stream event already waiting behind it.

        One wake-up of the consumer: the events of the current request that are in the inbox (the batches
        of every HTTP chunk one socket read brought) are folded together (consecutive text deltas become
        one) and applied in order, and the state they make is published once, at the end. The first other
        item stops the gathering and is handled next, after this wake-up's effects.
        """
        if not isinstance(item, _StreamBatch | _StreamItem):
            self.handle(item)
            return
        attempt = self.attempt
        following: _InboxItem | None = self.next_nowait()
        if following is None and type(item) is _StreamBatch:
            # The paced case: one batch alone (one HTTP chunk came in since the last wake-up), handled as it is.
            if item.attempt == attempt:
                self.handle_held(item)
            return
        events: list[StreamEvent] = []
        if following is not None:
            self.lookahead = following  # gathered below, in order, after ``item``
        following = item
        while following is not None:
            if not isinstance(following, _StreamBatch | _StreamItem):
                self.lookahead = following
                break
            if following.attempt == attempt:  # a superseded request's events are never seen
                if isinstance(following, _StreamBatch):
                    events += following.events
                else:
                    events.append(following.event)
            following = self.next_nowait()
        if events:
            self.handle_held(_StreamBatch(attempt, tuple(events)))

    def handle_held(self, batch: _StreamBatch) -> None:
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
        self.controls._closed = True
        waited = 0.0 if self.review_since is None else trio.current_time() - self.review_since + self.review_credit_s
        machine = max(self.machine_now_ms() - self.state.budget.started_at_ms, 0)
        self.controls.suspended_at = (machine, _ms(waited))
        if self.journal is not None:
            self.journal.writer.add("suspend", {"machine_ms": machine, "review_waited_ms": _ms(waited)})
        return True

    def approaching(self) -> bool:
        """Whether the approach scope is cancelled and nothing else that concerns the turn is (yet)."""
        approach = self.approach
        return approach is not None and approach.cancel_called and not self.controls.turn_cancelled

    def handle(self, item: _InboxItem) -> None:
        if isinstance(item, _RequestEnded):
            if item.attempt == self.attempt:
                self.request_open = False
                if not item.terminal_sent and self.state.phase in (Phase.REQUESTING, Phase.STREAMING):
                    self.handle_stream_event(
                        StreamError(
                            code="malformed_stream",
                            message="The AI response ended before it was complete. Please try again.",
                        )
                    )
            return
        if isinstance(item, _StreamItem):
            if item.attempt != self.attempt:
                return  # a stale event from a request we already gave up on
            self.handle_stream_event(item.event)
            return
        if isinstance(item, _StreamBatch):
            if item.attempt != self.attempt or self.controls.turn_cancelled:
                return  # stale (a retry superseded it), or Stop or the deadline came first: never seen
            for event in fold_text_deltas(item.events):
                if self.controls._stop_requested or self.state.is_settled or item.attempt != self.attempt:
                    return  # an observer stopped the turn, or it settled, or retried: the rest is cut off
                if type(event) in NO_STATE_CHANGE:
                    self.saw_first_event = True  # a tool call's start, an input delta: no state to make
                    self.controls._note_progress(event)
                    continue
                self.handle_stream_event(event)
            return
        self.apply(item)

    def handle_stream_event(self, event: StreamEvent) -> None:
        self.controls._note_progress(event)
        if not isinstance(event, StreamError) or not event.terminal:
            self.saw_first_event = True
        elif (
            self.state.phase is Phase.REQUESTING
            and not self.saw_first_event
            and (is_retriable(event) or event.code == "malformed_stream")
            and self.may_retry()
        ):
            wait = self.retry_backoff(event.retry_after)
            if trio.current_time() + wait < self.deadline:
                # Transient failure before the first event reached the reducer: nothing was shown, so a
                # retry cannot repeat output. The reducer counts it and tells the person (one counter:
                # the provider makes one attempt per request, see ChatRequest.caller_retries); the new
                # attempt supersedes the old. A wait that would outlast the turn is not started: the
                # failure settles the turn now, with the server's own words, instead of at the deadline.
                self.apply(Retry(now_ms=_now_ms(), failure=event, wait_ms=math.ceil(wait * 1000)))
                self.request_open = False
                self.open_request(backoff_s=wait)
                return
        self.apply(event)

    def may_retry(self) -> bool:
        # Only the retry and time bounds matter here: a retry is not a new iteration.
        budget, limits = self.state.budget, self.state.limits
        if budget.retries_used >= limits.max_retries_per_turn:
            return False
        return timing_exhaustion(budget, limits, self.machine_now_ms()) is None

    def retry_backoff(self, retry_after: float | None = None) -> float:
        """0.5 s doubling per retry, capped at 10 s; a server's ``retry-after`` lengthens it (never shortens)."""
        used = self.state.budget.retries_used
        backoff = float(min(_RETRY_BASE_S * 2 ** max(used, 0), _RETRY_CAP_S))
        return backoff if retry_after is None else max(backoff, min(retry_after, _RETRY_AFTER_CEILING_S))

    # -- effects ---------------------------------------------------------------------------------

    async def perform_effects(self) -> None:
        # Loop because starting calls or advancing yields a new state that may ask for more.
        while True:
            state = self.state
            if state.phase is Phase.REQUESTING and not self.request_open:
                if self.journal is not None and self.journal.writer.submit_pending:
                    await self.sync()  # the turn (the person's words) is durable before its first request
                    if self.controls.turn_cancelled:
                        return
                self.open_request(backoff_s=0.0)
            elif state.phase is Phase.EXECUTING:
                current = state.current_calls
                await self.start_approved_calls(current)
                if self.state is not state:
                    continue
                if all(c.status.is_terminal for c in current):
                    self.apply(Advance(now_ms=self.machine_now_ms()))
                    if self.state is not state:
                        continue
            return

    def open_request(self, *, backoff_s: float) -> None:
        self.attempt += 1
        self.request_open = True
        self.saw_first_event = False
        request = ChatRequest(
            model=self.request.model,
            system=self.request.system,
            messages=self.state.messages,
            tools=self.request.registry.definitions(),
            max_tokens=self.request.max_output_tokens,
            caller_retries=True,
        )
        # A child of the request nursery, which is outside the turn's scope: on Stop or the deadline
        # the consumer settles first and then cancels the requests (``_drive``), so the settled state
        # never waits behind a response being torn down. The nursery's deadline is the backstop.
        assert self.requests is not None, "a turn opens requests only inside _drive"
        self.requests.start_soon(self.request_task, self.attempt, request, backoff_s)

    async def request_task(self, attempt: int, request: ChatRequest, backoff_s: float) -> None:
        inbox = self.controls._send
        sink = _SendToInbox(inbox, attempt)
        if backoff_s > 0:
            await trio.sleep(backoff_s)
        try:
            await self.provider.stream(request, sink)
        except trio.Cancelled:
            raise
        except Exception as exc:  # a provider bug must end the turn as a typed failure, not a crash
            await sink.send(
                StreamError(
                    code="transport",
                    message="The AI request could not be completed.",
                    provider_detail=type(exc).__name__,
                )
            )
        inbox.send_nowait(_RequestEnded(attempt, sink.terminal_sent))

    async def start_approved_calls(self, current: Sequence[CallRecord]) -> None:
        """Start the approved calls of ``current`` (the iteration's calls in the state as it is now)."""
        # Reads run concurrently; mutations run one at a time, each from the document as the previous
        # one left it, so two approved edits never race into a document_changed refusal.
        mutating = any(c.status is CallStatus.RUNNING and c.effect == "mutate" for c in current)
        starting: list[tuple[CallRecord, PreparedCall[Any]]] = []
        snapshot = self.workspace.document
        for call in current:
            if call.status is not CallStatus.APPROVED or call.id in self.started:
                continue
            if call.effect == "mutate":
                if mutating:
                    continue
                mutating = True
            self.started.add(call.id)
            self.apply(StartCall(call_id=call.id, now_ms=_now_ms()))
            started = self.state.call(call.id)
            if started is None or started.status is not CallStatus.RUNNING or started.prepared is None:
                continue  # the reducer refused it (recorded as a violation, call made terminal)
            starting.append((started, started.prepared))
        if not starting:
            return
        if self.journal is not None:
            # Every start (and what led to it: the approvals) is durable before any of these tools runs, in
            # one append: a crash never runs a tool twice.
            await self.sync()
        for call, prepared in starting:
            tool = self.state.tool_set.get(call.tool_name)
            if tool is None:  # unreachable: the reducer checked the frozen tool set
                continue
            # The tool's own scope carries the turn deadline, so at the deadline (as on Stop) the
            # tool sees its own scope cancelled, not just a Cancelled from further out.
            if self.controls.turn_cancelled:
                continue  # Stop or the deadline came first: none of the tool's code runs; the settle ends the call
            scope = trio.CancelScope(deadline=self.scope_deadline)
            # The tool gets a private copy, made when it first reads ctx.document (or the snapshot
            # itself when the kind is immutable): nothing it does to it can reach the live document or
            # the undo snapshot that undo restores.
            kind = self.workspace.kind
            progress = partial(self.controls._note_call_progress, call.id)
            ask, sample = partial(self.ask, call.id, call.tool_name), partial(self.sample, call.id, call.tool_name)
            if kind.immutable:
                context = ToolExecutionContext(
                    document=snapshot, cancel_scope=scope, on_progress=progress, on_ask=ask, on_sample=sample
                )
            else:
                context = ToolExecutionContext.deferred(
                    partial(kind.private_copy, snapshot),
                    cancel_scope=scope,
                    on_progress=progress,
                    on_ask=ask,
                    on_sample=sample,
                )
            invoke = prepared.invoke
            if invoke is None:
                pending: Awaitable[object] = prepared.run(context)
            else:
                # A plain ``def`` tool runs here and now, as it would in a task of its own (no checkpoint
                # can come between its start and its end either way): no spawn, no scheduler pass, and
                # its settlement goes straight to the reducer, as the one consumer's own input.
                try:
                    produced = invoke(context)
                except Exception as exc:
                    produced = _failed_while_running(exc)
                if not inspect.isawaitable(produced):
                    outcome = _checked_outcome(produced, snapshot, kind)
                    self.finish_tool(call.id, tool, snapshot, scope, outcome, report=self.apply)
                    continue
                pending = produced
            self.controls._tool_scopes.add(scope)
            if self.tools_running == 0:
                self.tools_idle = trio.Event()  # set again when the last running tool ends
            self.tools_running += 1
            # A child of the tool nursery, not of the turn: a tool that swallows Cancelled and keeps
            # going is abandoned after a bounded grace (``await_tools``) instead of holding the turn,
            # and the nursery's owner cancels and awaits it when it closes.
            self.tool_nursery.start_soon(
                self.tool_task, call.id, tool, pending, snapshot, scope, name=f"trioloop tool {tool.name}"
            )

    async def tool_task(
        self,
        call_id: str,
        tool: RegisteredTool[D],
        pending: Awaitable[object],
        snapshot: D,
        scope: trio.CancelScope,
    ) -> None:
        try:
            outcome: ToolOutcome[D] | None = None
            with scope:
                try:
                    produced = await pending
                except Exception as exc:  # contained to this call (Cancelled is not an Exception), reported
                    produced = _failed_while_running(exc)
                outcome = _checked_outcome(produced, snapshot, self.workspace.kind)
            self.finish_tool(call_id, tool, snapshot, scope, outcome, report=self.controls._put)
        finally:
            self.controls._tool_scopes.discard(scope)
            self.tools_running -= 1
            if self.tools_running == 0:
                self.tools_idle.set()

    def finish_tool(
        self,
        call_id: str,
        tool: RegisteredTool[D],
        snapshot: D,
        scope: trio.CancelScope,
        outcome: ToolOutcome[D] | None,
        *,
        report: Callable[[CallSettled], object],
    ) -> None:
        """Commit a tool's outcome and ``report`` the settlement, unless the call is no longer wanted.

        Commit and report happen with no checkpoint in between, so no cancellation can split them. A
        fault in the commit is reported as the call's failure.
        """
        if self.ending or self.controls.turn_cancelled or self.state.is_settled:
            return  # Stop, the deadline or the end of the turn: whatever it returned is discarded, never committed
        if scope.cancel_called or outcome is None:
            # The tool cancelled its own scope: the call fails (nothing it returned is used) and the turn
            # goes on, rather than waiting for its deadline on a call that will never settle.
            outcome = ToolOutcome.failure(TOOL_CANCELLED_ITSELF)
        try:
            settled = self.commit(call_id, tool, snapshot, outcome)
        except Exception as exc:  # a tool must never crash the turn: report it as this call's failure
            failure: ToolOutcome[D] = ToolOutcome.failure(f"The tool could not be settled ({type(exc).__name__}).")
            settled = CallSettled(call_id=call_id, outcome=failure, now_ms=_now_ms())
        self.controls.call_progress.pop(call_id, None)
        self.controls._end_questions(call_id)
        report(settled)

    def commit(self, call_id: str, tool: RegisteredTool[D], snapshot: D, outcome: ToolOutcome[D]) -> CallSettled:
        """Commit ``outcome`` to the workspace (if it proposes a valid change) and say how the call settled."""
        committed = commit_tool_outcome(
            self.workspace.document,
            snapshot,
            outcome,
            tool,
            self.workspace.undo,
            turn_id=self.request.turn_id,
            kind=self.workspace.kind,
        )
        settled: ToolOutcome[D]
        changed = isinstance(committed, Committed)
        if isinstance(committed, Committed):
            self.workspace.document = committed.document
            self.workspace.undo = committed.history
            settled = ToolOutcome.success(committed.result)
        elif isinstance(committed, Refused):
            settled = ToolOutcome.failure(committed.result)
        else:
            settled = ToolOutcome.success(committed.result)
        return CallSettled(call_id=call_id, outcome=settled, now_ms=_now_ms(), changed_document=changed)

    # -- settling --------------------------------------------------------------------------------

    async def settle(self) -> None:
        """Settle the turn if it is not settled yet: cancel and await its tools (bounded), record the
        settlements already in the inbox, then ``Cancel`` with the bound that ran out, or ``stop``.

        Runs once where the consumer first sees the cancellation and again (doing nothing new) in
        ``_drive``'s ``finally``, which also covers a turn that completed with a tool still running.
        """
        if self.ending and self.state.is_settled:
            return
        # Which bound ran out matters only to a turn that is not settled yet (a completed turn skips it).
        bound = None if self.controls.stop_requested or self.state.is_settled else self.timing_bound()
        reason: Literal["stop", "deadline", "review_timeout"] = (
            "review_timeout" if bound is Bound.REVIEW_TIMEOUT else "deadline" if bound is Bound.DEADLINE else "stop"
        )
        await self.await_tools()
        self.controls._closed = True
        if not self.state.is_settled:
            self.drain_settlements()
            self.apply(Cancel(reason=reason))
        await self.sync()

    async def await_tools(self) -> None:
        """Cancel every tool still running and wait for them to unwind, for at most the grace period.

        Shielded, so it also runs when the turn is being cancelled from outside. A tool still running
        after the grace is abandoned: ``ending`` is set, so its value can never be committed.
        """
        self.ending = True
        self.controls._cancel_tools()
        if self.tools_running:
            with trio.CancelScope(shield=True, deadline=trio.current_time() + self.request.tool_cancel_grace_s):
                await self.tools_idle.wait()

    def drain_settlements(self) -> None:
        """Record tool settlements already in the inbox: their commits happened, so state must say so."""
        while (item := self.next_nowait()) is not None:
            if isinstance(item, CallSettled):
                self.apply(item)


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
    started_at = trio.current_time()  # the turn's clock (and its deadline) runs from the call
    if resume is not None:
        started_at -= resume.machine_ms / 1000
    if tool_nursery is not None:
        return await _drive(request, workspace, provider, tool_nursery, controls, on_state, started_at, journal, resume)
    async with trio.open_nursery() as own:
        state = await _drive(request, workspace, provider, own, controls, on_state, started_at, journal, resume)
        own.cancel_scope.cancel()  # the turn is settled: anything still running is not wanted
    return state


def _take_up(turn: _Turn[Any], resume: ResumePoint, now_ms: int) -> None:
    """Put a journaled live turn back in place: its state, its review clock, then the recovery inputs."""
    state = resume.state
    turn.state = state
    if state.phase is Phase.AWAITING_APPROVAL:
        turn.pause_deadline_for_review(True)
        assert turn.review_since is not None
        turn.review_credit_s = resume.review_waited_ms / 1000
        timeout_ms = state.limits.review_timeout_ms
        if timeout_ms is not None:
            turn.set_deadline(turn.review_since - turn.review_credit_s + timeout_ms / 1000)
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
    turn = _Turn(request, workspace, provider, controls, on_state, tool_nursery, started_at, journal)
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
        turn.deadline = started_at + resume.state.limits.turn_deadline_ms / 1000
        turn.sharpener.move(turn.deadline)
    try:
        # The request tasks' nursery holds the turn's scope, not the other way round: Stop and the deadline
        # cancel the turn's scope, the consumer settles, and only then are the requests cancelled (below).
        # Its own deadline, just after the turn's, is the backstop and what a provider sees as its own.
        async with trio.open_nursery() as requests:
            turn.requests = requests
            requests.cancel_scope.deadline = turn.deadline + _REQUEST_DEADLINE_GRACE_S
            try:
                with trio.CancelScope(deadline=turn.deadline) as turn_scope:
                    controls._scope = turn_scope
                    if resume is not None:
                        _take_up(turn, resume, _now_ms())
                    if controls.stop_requested:
                        turn_scope.cancel()
                    with trio.CancelScope(deadline=turn.deadline - SHARPEN_LEAD_S) as approach:
                        turn.approach = approach
                        approach.deadline = turn_scope.deadline - SHARPEN_LEAD_S  # a resumed review moved it
                        await turn.consume()
                    turn.approach = None
                    if not turn.state.is_settled and not turn.suspended:
                        # The deadline is near (and only then, so a turn that ends sooner spawns nothing):
                        # Trio's timer rounds up to the millisecond, the sharpener makes it fire on time.
                        requests.start_soon(turn.sharpener.run, name="trioloop deadline sharpener")
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
