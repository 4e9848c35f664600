"""The person's handle on a live turn (`TurnControls`): every decision becomes exactly one item of the turn's
inbox, Stop and suspend reach the turn's scopes at once, and the faces read the open questions and each running
call's progress here.

`TurnControls` methods are synchronous, so a UI task calls them directly. The handle composes the parts the turn
is driven through (`TurnInbox`, `TurnScopes`, `OpenQuestions`, `CallProgress`); `run_turn` hands each part to the
piece of the turn that needs it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from trioloop.machine.inputs import ApproveBatch, ApproveCall, DenyCall, ForgetRule
from trioloop.machine.questions import AnswerAction, Question
from trioloop.machine.rules import Always
from trioloop.runtime.asking import OpenQuestions, QuestionWaiter
from trioloop.runtime.inbox import InboxItem, RequestEnded, StreamBatch, StreamItem, TurnInbox
from trioloop.runtime.progress import CallProgress
from trioloop.runtime.scopes import TurnScopes

__all__ = ["InboxItem", "QuestionWaiter", "RequestEnded", "StreamBatch", "StreamItem", "TurnControls"]


class TurnControls:
    """The user's handle on a live turn. Every method is synchronous and becomes one reducer input.

    Call them from any Trio task (a UI task, a test). After the turn settles they do nothing and
    return False.
    """

    def __init__(self) -> None:
        #: The turn's inbox: what the decisions below are queued in, for the turn's one consumer.
        self.inbox = TurnInbox()
        #: The cancel scopes Stop and the deadline reach.
        self.scopes = TurnScopes()
        #: The questions running calls put to the person (see `questions`).
        self.asking = OpenQuestions()
        #: Each running call's progress and the streaming tool call input (see `call_progress`).
        self.progress = CallProgress()
        #: Set when the turn ended suspended in review: the machine time it had spent, the review's wait.
        self.suspended_at: tuple[int, int] | None = None

    def approve(
        self, call_id: str, edited_input: dict[str, Any] | None = None, always: Always | str | None = None
    ) -> bool:
        """Approve one call, or (with ``edited_input``) the user's edit of its input: the edit is prepared by
        the call's own tool, the grant binds the edited input, and the model is told which fields changed.
        ``always`` also allows this tool ("tool") or this tool with this input ("input") for the session."""
        return self.inbox.put(ApproveCall(call_id=call_id, edited_input=edited_input, always=always))

    def decide(self, decision: ApproveCall | DenyCall) -> bool:
        """Queue a decision made as a whole elsewhere (a reviewer's, from the web inbox: bound to the card's digest
        and naming the reviewer)."""
        return self.inbox.put(decision)

    def approve_batch(self, call_ids: tuple[str, ...]) -> bool:
        """Approve the listed calls together (an explicit tuple captured at the click; destructive calls never
        included)."""
        return self.inbox.put(ApproveBatch(call_ids=tuple(call_ids)))

    def deny(self, call_id: str, reason: str = "", always: Always | str | None = None) -> bool:
        """Decline one call; ``reason``, if given, reaches the model as the user's words (sanitized, capped).
        ``always="tool"`` also denies this tool for the rest of the session, with that reason."""
        return self.inbox.put(DenyCall(call_id=call_id, reason=reason, always=always))

    def forget_rule(self, number: int) -> bool:
        """Remove session rule ``number`` from this turn on."""
        return self.inbox.put(ForgetRule(number=number))

    def stop(self) -> bool:
        """Cancel the turn: its scope is cancelled now; the consumer settles it ``cancelled``."""
        if self.inbox.closed:
            return False
        self.asking.end()  # nobody answers an open question of a stopped turn
        self.scopes.stop()
        return True

    def suspend(self) -> bool:
        """End the turn's tasks without settling it, if it is waiting for the review (else it is a Stop):
        the consumer takes the decisions already queued, then, still in review, ends the turn suspended."""
        if self.inbox.closed:
            return False
        self.scopes.suspend()
        return True

    @property
    def questions(self) -> tuple[Question, ...]:
        """The questions running calls put to the person and not yet answered, oldest first. Not part of the
        state: a question lives only as long as the call that asked it."""
        return self.asking.questions

    def answer(self, question_id: str, action: AnswerAction, content: Mapping[str, Any] | None = None) -> bool:
        """Answer an open question: ``accept`` (a form's values, checked against its fields, a left-out field
        given its default), ``decline`` or ``cancel``. False if the question is not open (answered, ended).

        Raises `AnswerError` for values that do not fit (nothing is answered: ask the person again) and
        ``ValueError`` for an unknown action or values with a decline or cancel."""
        return self.asking.answer(question_id, action, content)

    @property
    def on_questions(self) -> Callable[[], None] | None:
        """Called (synchronously) each time a question opens or closes: the session wakes its faces."""
        return self.asking.on_change

    @on_questions.setter
    def on_questions(self, hook: Callable[[], None] | None) -> None:
        self.asking.on_change = hook

    @property
    def call_progress(self) -> dict[str, tuple[float, float | None, str]]:
        """What each running call last said of its progress (``ToolExecutionContext.report_progress``): call
        id -> (progress, total or None, message). A call's entry goes when it settles. Not part of the state."""
        return self.progress.calls

    @property
    def input_streaming(self) -> tuple[str, int] | None:
        """The tool call whose input is streaming now (its tool's name and the input's length so far), for a
        face to show while the model writes a long input; None between calls. Not part of the state."""
        return self.progress.input_streaming

    @property
    def turn_cancelled(self) -> bool:
        """Whether the turn is being cancelled (Stop, or its deadline passed)."""
        return self.scopes.turn_cancelled

    @property
    def stop_requested(self) -> bool:
        """Whether Stop was asked for."""
        return self.scopes.stop_requested
