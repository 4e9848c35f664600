"""The questions running calls put to the person, open until the person answers or the call, Stop or the turn ends
them: beside the turn's state rather than in it, since a question lives only as long as the call that asked it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import trio

from trioloop.machine.questions import Answer, AnswerAction, Question

__all__ = ["OpenQuestions", "QuestionWaiter"]


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


class OpenQuestions:
    """The open questions' waiters by question id, oldest first, and who to tell when one opens or closes."""

    def __init__(self) -> None:
        self.waiting: dict[str, QuestionWaiter] = {}
        #: Called (synchronously) each time a question opens or closes: the session wakes its faces.
        self.on_change: Callable[[], None] | None = None

    def __bool__(self) -> bool:
        return bool(self.waiting)

    @property
    def questions(self) -> tuple[Question, ...]:
        """The open questions, oldest first."""
        return tuple(waiter.question for waiter in self.waiting.values())

    def open(self, question: Question) -> QuestionWaiter:
        """Open ``question`` (its id already given) and return its waiter."""
        waiter = QuestionWaiter(question)
        self.waiting[question.id] = waiter
        return waiter

    def close(self, waiter: QuestionWaiter) -> None:
        """``waiter``'s question is over: cancelled if nobody answered it, and no longer open."""
        waiter.give(Answer.cancelled())
        del self.waiting[waiter.question.id]

    def changed(self) -> None:
        """Tell whoever follows the questions that one opened or closed."""
        if self.on_change is not None:
            self.on_change()

    def answer(self, question_id: str, action: AnswerAction, content: Mapping[str, Any] | None = None) -> bool:
        """Answer an open question: ``accept`` (a form's values, checked against its fields, a left-out field
        given its default), ``decline`` or ``cancel``. False if the question is not open (answered, ended).

        Raises `AnswerError` for values that do not fit (nothing is answered: ask the person again) and
        ``ValueError`` for an unknown action or values with a decline or cancel."""
        waiter = self.waiting.get(question_id)
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

    def end(self, call_id: str | None = None) -> None:
        """Cancel the open questions (of ``call_id`` alone, if given): nobody answers them any more."""
        for waiter in tuple(self.waiting.values()):
            if call_id is None or waiter.question.call_id == call_id:
                waiter.give(Answer.cancelled())
