"""The person's handle on a live turn (`TurnControls`) and the turn's inbox: every decision, every stream event
and every tool settlement reaches the reducer as one item of one channel, consumed by one task.

`TurnControls` methods are synchronous, so a UI task calls them directly; each becomes exactly one inbox item
(Stop and suspend also cancel the turn's scope at once). The open questions of running calls live here too,
beside the state rather than in it: a question lives only as long as the call that asked it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

import attrs
import trio

from trioloop.machine.inputs import ApproveBatch, ApproveCall, DenyCall, TurnInput
from trioloop.machine.questions import Answer, AnswerAction, Question
from trioloop.protocol.events import StreamEvent, ThinkingDelta, ToolCallInputDelta, ToolCallStart

__all__ = ["InboxItem", "QuestionWaiter", "RequestEnded", "StreamBatch", "StreamItem", "TurnControls"]


@attrs.frozen
class RequestEnded:
    """The request task finished; ``terminal_sent`` says whether the provider sent a terminal event."""

    attempt: int
    terminal_sent: bool


@attrs.frozen
class StreamItem:
    """One stream event handed over alone (a provider that sends event by event)."""

    attempt: int
    event: StreamEvent


@attrs.frozen
class StreamBatch:
    """The events of one network read, handed over together: one inbox item, one consumer wake-up."""

    attempt: int
    events: tuple[StreamEvent, ...]


InboxItem: TypeAlias = TurnInput | StreamItem | StreamBatch | RequestEnded


class TurnControls:
    """The user's handle on a live turn. Every method is synchronous and becomes one reducer input.

    Call them from any Trio task (a UI task, a test). After the turn settles they do nothing and
    return False.
    """

    def __init__(self) -> None:
        send, receive = trio.open_memory_channel[InboxItem](math.inf)
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
        self._waiting: dict[str, QuestionWaiter] = {}
        #: Called (synchronously) each time a question opens or closes: the session wakes its faces.
        self.on_questions: Callable[[], None] | None = None

    def _put(self, item: InboxItem) -> bool:
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


class QuestionWaiter:
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
