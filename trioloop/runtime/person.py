"""The turn waiting for the person: review cards, a running call's questions (`ToolExecutionContext.ask`), and
its sampling requests (`ToolExecutionContext.sample`), each holding the turn deadline still while it waits.

A question is numbered, tied to the call that asked, shown to the faces through `TurnControls.questions`, and
answered only through `TurnControls.answer` (Stop, the call's end and the turn's end cancel it). A sampling
request is a question first; only once the person accepts does it go to the session's model, fenced, without
tools, under the call's cancellation and the turn deadline (which runs again while the model answers).
"""

from __future__ import annotations

import math

import attrs
import trio

from trioloop.machine.limits import question_cap, sampling_tokens
from trioloop.machine.questions import Answer, Question, QuestionRefused, Sampled
from trioloop.machine.state import Phase
from trioloop.protocol.events import StreamEvent
from trioloop.protocol.provider import ChatProvider
from trioloop.runtime.asking import OpenQuestions
from trioloop.runtime.clock import TurnClock
from trioloop.runtime.inbox import TurnInbox, TurnView
from trioloop.runtime.sampling import sampled_from, sampling_chat_request
from trioloop.runtime.scopes import TurnScopes

__all__ = ["PersonWaits"]


class PersonWaits:
    """Whether the turn waits for the person (the deadline stands still then), and the questions it puts."""

    def __init__(
        self,
        turn: TurnView,
        *,
        asking: OpenQuestions,
        scopes: TurnScopes,
        inbox: TurnInbox,
        clock: TurnClock,
        provider: ChatProvider,
        model: str,
    ) -> None:
        self.turn = turn
        self.asking = asking
        self.scopes = scopes
        self.inbox = inbox
        self.clock = clock
        self.provider = provider
        self.model = model
        self.asked = 0

    def check(self) -> None:
        """Hold the deadline still, or let it run again, as the turn starts or stops waiting for the person:
        in review, or while a running call's question is open."""
        state = self.turn.state
        waiting = state.phase is Phase.AWAITING_APPROVAL or bool(self.asking)
        clock = self.clock
        if waiting is not clock.waiting:
            clock.wait_for_person(waiting, state.limits.review_timeout_ms)

    async def ask(self, call_id: str, tool_name: str, question: Question) -> Answer:
        """A running call's question: numbered, shown to the faces, answered by the person (or cancelled by
        Stop, the call's end or the turn's end), the deadline standing still meanwhile."""
        state = self.turn.state
        if self.inbox.closed or self.scopes.settling or self.scopes.turn_cancelled or state.is_settled:
            await trio.lowlevel.checkpoint()
            raise QuestionRefused("No one can be asked: the turn is ending.")
        if question_cap(self.asked, state.limits):
            await trio.lowlevel.checkpoint()
            raise QuestionRefused(
                f"No one was asked: this turn has already put its {state.limits.max_questions_per_turn} "
                "questions to the person (max_questions_per_turn)."
            )
        self.asked += 1
        # Named after the turn too: an answer meant for an earlier turn's question (a late click) is refused,
        # never taken for this turn's question of the same number.
        question_id = f"{state.turn_id}:q{self.asked}"
        question = attrs.evolve(question, id=question_id, call_id=call_id, tool_name=tool_name)
        waiter = self.asking.open(question)
        self.check()
        self.asking.changed()
        try:
            await waiter.done.wait()
        finally:
            self.asking.close(waiter)
            self.check()
            self.asking.changed()
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
        request = attrs.evolve(request, max_tokens=sampling_tokens(request.max_tokens, self.turn.state.limits))
        question = attrs.evolve(question, sampling=request)
        answer = await self.ask(call_id, tool_name, question)
        if answer.action != "accept":
            return Sampled(action=answer.action)
        model = self.model
        chat = sampling_chat_request(question, model, request.max_tokens)
        send, receive = trio.open_memory_channel[StreamEvent](math.inf)
        scope = trio.CancelScope(deadline=self.clock.scope_deadline)
        self.scopes.work.add(scope)
        try:
            with scope:
                await self.provider.stream(chat, send)
        finally:
            self.scopes.work.discard(scope)
        if scope.cancelled_caught:
            return Sampled(action="accept", error="The turn was stopped before the model answered.")
        return sampled_from(receive, model)
