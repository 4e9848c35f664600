"""`OtelObserver` and `instrument`: which turns are followed, when a state opens or ends a span (by
comparing it with the one before), and the ``invoke_agent`` span and duration of each turn.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any, Final, final

from opentelemetry import metrics, trace
from opentelemetry.trace import SpanKind, StatusCode

from trioloop import __version__
from trioloop.machine.prices import usage_cost
from trioloop.machine.reducer import CallStatus, Outcome, Phase, TurnState
from trioloop.otel.content import _messages_json
from trioloop.otel.conventions import (
    _SCOPE,
    TurnEnd,
    _Attrs,
    _bound,
    _review_outcome,
    _usage_attributes,
    answering_names,
    gen_ai_provider_name,
)
from trioloop.otel.instruments import _instruments
from trioloop.otel.iteration import _notices, _Spans, _Turn
from trioloop.runtime.session import Session

_IN_REQUEST: Final = frozenset({Phase.REQUESTING, Phase.STREAMING})
_SETTLED: Final = Phase.SETTLED
_NO_TRACING: Final = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
_STATUSES: Final = tuple(CallStatus)


@final
class OtelObserver:
    """Spans and metrics for the turns of one session, from the states it publishes.

    ``session_or_provider_name`` is the `Session` (its provider names ``gen_ai.provider.name``, its model
    ``gen_ai.request.model`` unless ``model`` is given) or the provider's name itself, with ``model``.
    ``tracer_provider`` and ``meter_provider`` default to the global ones. ``capture_content=True`` adds the
    prompts, completions, tool inputs and results, call summaries and the reviewer's words (``gen_ai.input
    .messages``, ``gen_ai.output.messages``, ``gen_ai.system_instructions``, ``gen_ai.tool.call.arguments``,
    ``gen_ai.tool.call.result``, ``trioloop.call.summary``, ``trioloop.review.denials``, and in
    ``trioloop.call.decider`` what the deciding rule says of the input); leave it off wherever telemetry may not
    hold what users write. Each ``execute_tool`` span says who decided its call: ``trioloop.call.decided_by``
    (person, read_only_policy, rule, code) and ``trioloop.call.decider`` ("approved by app rule 1"). ``clock``
    gives span timestamps in ns since the epoch. One observer serves one session: turns are told apart by their id.
    """

    def __init__(
        self,
        session_or_provider_name: Session[Any] | str,
        model: str | None = None,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        capture_content: bool = False,
        agent_name: str | None = None,
        conversation_id: str | None = None,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        if isinstance(session_or_provider_name, str):
            if model is None:
                raise TypeError("OtelObserver(provider_name, model): name the model as well")
            self._session: weakref.ref[Session[Any]] | None = None
            self._provider_name = session_or_provider_name
            answering: dict[str, str] = {}
        else:
            # Weakly: the session holds its observers, and a cycle would keep every turn's states alive
            # until the garbage collector's next full pass.
            self._session = weakref.ref(session_or_provider_name)
            self._provider_name = gen_ai_provider_name(session_or_provider_name.provider)
            answering = answering_names(session_or_provider_name.provider)
        self._model = model
        self._tracer_provider = tracer_provider
        self._meter_provider = meter_provider
        self._tracer = trace.get_tracer(_SCOPE, __version__, tracer_provider)
        self._instruments = _instruments(meter_provider)
        self._capture = capture_content
        self._agent_name = agent_name
        self._conversation_id = conversation_id
        self._clock = clock
        self._spans = _Spans(
            self._tracer,
            self._instruments,
            capture=capture_content,
            provider_name=self._provider_name,
            system_prompt=_system_prompt_of(self._session),
            answering=answering,
        )
        self._turn: _Turn | None = None
        self._unfollowed: str | None = None  # the id of a live turn that began with nothing configured

    # -- the observer protocol -------------------------------------------------------------------

    def on_state(self, state: TurnState) -> None:
        """Open and close spans for what changed since the state before (called by the session)."""
        if state.turn_id is self._unfollowed:
            if state.phase is _SETTLED:
                self._unfollowed = None
            return  # a turn that began with nothing configured: followed by its id alone
        turn = self._turn
        if turn is None or turn.ended is not None or state.turn_id != turn.turn_id:
            self._begin(state)
            return
        last, turn.last = turn.last, state
        if (
            state.phase is last.phase
            and state.calls is last.calls
            and state.iteration == last.iteration
            and len(state.notice_log) == turn.notices
        ):
            return  # text or usage streaming in: nothing to open or close
        self._advance(turn, last, state, self._clock())

    def on_suspended(self, state: TurnState) -> None:
        """The session's hook for a turn suspended in review: its span ends with ``status`` suspended."""
        self.end_open_turn("suspended")

    def end_open_turn(self, status: TurnEnd = "suspended") -> None:
        """End the spans of a turn that is still open, marked ``trioloop.turn.status=status``.

        The session calls it (through `on_suspended`) when a turn is suspended in review; call it yourself
        before shutting down with a turn in flight. A turn continued later (`Session.continue_turn`,
        here or in another process) gets a new span, marked ``trioloop.turn.resumed``.
        """
        self._unfollowed = None
        turn = self._turn
        if turn is not None and turn.ended is None:
            self._end_turn(turn, turn.last, self._clock(), status)

    # -- turns -----------------------------------------------------------------------------------

    def _begin(self, state: TurnState) -> None:
        turn = self._turn
        if turn is not None and state.turn_id == turn.turn_id and turn.ended in (None, "settled"):
            return  # a later state of a settled turn (undo): its spans are closed
        if turn is not None and turn.ended is None:
            self._end_turn(turn, turn.last, self._clock(), "abandoned")
        self._unfollowed = None
        if not state.is_live:
            return  # idle, or a settled turn never seen live: nothing to time
        if not self._configured():
            self._unfollowed = state.turn_id
            return
        session = None if self._session is None else self._session()
        model = self._model if self._model is not None else "" if session is None else session.model
        metric = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": self._provider_name,
            "gen_ai.request.model": model,
        }
        now = self._clock()
        resumed = (turn is not None and state.turn_id == turn.turn_id) or not (
            state.phase is Phase.REQUESTING and state.iteration == 1 and not len(state.calls)
        )
        attributes: _Attrs = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.provider.name": self._provider_name,
            "gen_ai.request.model": model,
            "trioloop.turn.id": state.turn_id,
            "trioloop.turn.resumed": resumed,
        }
        if self._agent_name is not None:
            attributes["gen_ai.agent.name"] = self._agent_name
        if self._conversation_id is not None:
            attributes["gen_ai.conversation.id"] = self._conversation_id
        name = "invoke_agent" if self._agent_name is None else f"invoke_agent {self._agent_name}"
        span = self._tracer.start_span(name, kind=SpanKind.INTERNAL, attributes=attributes, start_time=now)
        turn = self._turn = _Turn(state, span, now, model, metric)
        if resumed:  # what ended before the turn was taken up was reported then (or in another process)
            for call in state.calls:
                if call.is_terminal:
                    turn.done.add(call.id)
        self._advance(turn, None, state, now)

    def _configured(self) -> bool:
        """Whether a tracer or meter provider is configured, asked as each turn begins: a turn that began
        with neither (the API's no-op default) is followed by its id alone, and costs next to nothing."""
        tracing = self._tracer_provider if self._tracer_provider is not None else trace.get_tracer_provider()
        if not isinstance(tracing, _NO_TRACING):
            return True
        meters = self._meter_provider if self._meter_provider is not None else metrics.get_meter_provider()
        # The API's global default until one is set is a proxy of a private class, known here by its name (were
        # it renamed, metrics would just count as configured).
        return not isinstance(meters, metrics.NoOpMeterProvider) and type(meters).__name__ != "_ProxyMeterProvider"

    def _advance(self, turn: _Turn, last: TurnState | None, state: TurnState, now: int) -> None:
        chat = turn.chat
        if chat is not None and (state.phase not in _IN_REQUEST or state.iteration != chat.iteration):
            self._spans.end_chat(turn, chat, state, now)
            chat = None
        if state.phase in _IN_REQUEST:
            if chat is None:
                chat = turn.chat = self._spans.start_chat(turn, state, now)
            elif state.phase is Phase.STREAMING and chat.first_chunk is None:
                chat.first_chunk = now
        if len(state.notice_log) != turn.notices:
            _notices(turn, state, now)
        review = turn.review
        if state.phase is Phase.AWAITING_APPROVAL:
            if review is None or review.iteration != state.iteration:
                if review is not None:
                    self._spans.end_review(turn, review, state, now, "decided")
                review = turn.review = self._spans.start_review(turn, state, now)
            review.pending.update(c.id for c in state.current_calls if c.status is CallStatus.PENDING)
        elif review is not None:
            self._spans.end_review(turn, review, state, now, _review_outcome(state))
        if last is None or state.calls is not last.calls:
            self._spans.calls(turn, state, now)
        if state.is_settled:
            self._end_turn(turn, state, now, "settled")

    def _end_turn(self, turn: _Turn, state: TurnState, now: int, status: TurnEnd) -> None:
        turn.ended = status
        if turn.chat is not None:
            self._spans.end_chat(turn, turn.chat, state, now, None if status == "settled" else status)
        if turn.review is not None:
            self._spans.end_review(turn, turn.review, state, now, "decided" if status == "settled" else status)
        for span, _ in turn.tools.values():  # only a turn that did not settle leaves calls running
            span.set_attribute("trioloop.call.status", "running")
            span.end(end_time=now)
        turn.tools.clear()
        span = turn.span
        outcome = state.outcome
        error = state.error if outcome is Outcome.FAILED else None
        price = state.spending.price
        cost = None if price is None or status != "settled" else usage_cost(state.usage, price)
        if span.is_recording():
            attributes: _Attrs = {
                "trioloop.turn.status": status,
                "trioloop.turn.iterations": state.iteration,
                "trioloop.turn.retries": state.budget.retries_used,
                "trioloop.turn.violations": len(state.violation_log),
                "trioloop.turn.calls": len(state.calls),
                **_usage_attributes(state.usage),
            }
            counts = dict.fromkeys(_STATUSES, 0)
            for call in state.calls:
                counts[call.status] += 1
            attributes.update({f"trioloop.turn.calls.{s.value}": n for s, n in counts.items()})
            if outcome is not None:
                attributes["trioloop.turn.outcome"] = outcome.value
            bound = _bound(state)
            if bound is not None:
                attributes["trioloop.turn.bound"] = bound.value
            if cost is not None:
                attributes["trioloop.turn.cost_usd"] = float(cost)
            if error is not None:
                attributes["error.type"] = error.code.value
                if self._capture:
                    attributes["trioloop.error.message"] = error.message
            if self._capture:
                attributes.update(self._turn_content(state))
            span.set_attributes(attributes)
            if error is not None:
                span.set_status(StatusCode.ERROR, error.code.value)
        span.end(end_time=now)
        metric: _Attrs = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.provider.name": self._provider_name,
            "gen_ai.request.model": turn.model,
        }
        if error is not None:
            metric["error.type"] = error.code.value
        self._instruments.duration.record((now - turn.start) / 1e9, metric)
        if cost is not None:
            self._instruments.cost.add(float(cost), metric)

    # -- content (capture_content=True only) -----------------------------------------------------

    def _turn_content(self, state: TurnState) -> _Attrs:
        messages = state.turn_messages
        content: _Attrs = {}
        if messages:
            content["gen_ai.input.messages"] = _messages_json(messages[:1])
        output = [m for m in messages[1:] if m.role == "assistant"]
        if output:
            content["gen_ai.output.messages"] = _messages_json(output[-1:])
        return content


def _system_prompt_of(session: weakref.ref[Session[Any]] | None) -> Callable[[], str | None]:
    """The session's system prompt when asked (None without a session, or once it is gone); the session is held
    weakly, and the observer not at all, so its spans part makes no cycle with it."""

    def system_prompt() -> str | None:
        live = None if session is None else session()
        return None if live is None else live.system_prompt

    return system_prompt


def instrument(
    session: Session[Any],
    model: str | None = None,
    *,
    tracer_provider: trace.TracerProvider | None = None,
    meter_provider: metrics.MeterProvider | None = None,
    capture_content: bool = False,
    agent_name: str | None = None,
    conversation_id: str | None = None,
    clock: Callable[[], int] = time.time_ns,
) -> OtelObserver:
    """Attach an `OtelObserver` to ``session`` (the arguments are its constructor's) and return it."""
    observer = OtelObserver(
        session,
        model,
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        capture_content=capture_content,
        agent_name=agent_name,
        conversation_id=conversation_id,
        clock=clock,
    )
    session.observe(observer)
    return observer
