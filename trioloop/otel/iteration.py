"""The spans under a turn's, and the metrics they record: each model request (``chat {model}``, with its
retries as events), each review wait (``await_review``) and each tool call (``execute_tool {tool}``). `_Spans`
is given the tracer, the instruments and the settings it uses (whether content is captured, the provider's name,
where the system prompt is read); the observer decides when.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Final, final

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, StatusCode, Tracer

from trioloop.machine.reducer import CallRecord, CallStatus, DenialReason, Outcome, TurnState
from trioloop.machine.texts import HOP_SUFFIX
from trioloop.otel.content import _call_content, _messages_json
from trioloop.otel.conventions import (
    TurnEnd,
    _Attrs,
    _call_error,
    _decider_attributes,
    _request_outcome,
    _usage_attributes,
    _usage_minus,
)
from trioloop.otel.instruments import _Instruments

#: A retry notice as `trioloop.loop` words it: "HTTP 529, retry 1 of 3 in 0.5 s".
_RETRY: Final = re.compile(
    r"^(?P<cause>.*), retry (?P<n>\d+) of (?P<of>\d+) in (?P<wait>\d+(?:\.\d+)?(?:e[+-]?\d+)?) s"
    + f"(?P<hop>{re.escape(HOP_SUFFIX)})?$"
)


@final
class _Chat:
    __slots__ = ("base", "first_chunk", "iteration", "messages", "retries", "span", "start")

    def __init__(self, span: Span, start: int, state: TurnState) -> None:
        self.span = span
        self.start = start
        self.iteration = state.iteration
        self.base = state.usage_before_iteration
        self.retries = state.budget.retries_used
        self.first_chunk: int | None = None
        self.messages = 0  # how many turn messages there were when it started (content capture only)


@final
class _Review:
    __slots__ = ("iteration", "pending", "span", "start")

    def __init__(self, span: Span, start: int, state: TurnState) -> None:
        self.span = span
        self.start = start
        self.iteration = state.iteration
        self.pending: set[str] = set()


@final
class _Turn:
    """What is open of one turn, and what the observer has seen of it."""

    def __init__(self, state: TurnState, span: Span, start: int, model: str, metric: _Attrs) -> None:
        self.turn_id = state.turn_id
        self.span = span
        self.context = trace.set_span_in_context(span)  # the parent of every span of the turn
        self.start = start
        self.model = model
        self.metric = metric  # the attributes every chat metric of the turn has
        self.last = state
        self.ended: TurnEnd | None = None
        self.chat: _Chat | None = None
        self.review: _Review | None = None
        self.tools: dict[str, tuple[Span, int]] = {}  # running calls: their span and start
        self.ran: set[str] = set()  # calls seen running
        self.done: set[str] = set()  # calls seen terminal (their span ended, counted)
        self.seen: dict[str, CallRecord] = {}  # the record each call had when last looked at
        self.scan_from = 0  # calls before this position are all done
        self.notices = len(state.notice_log)


@final
class _Spans:
    """Opens and ends the spans under a turn's and records their metrics, with the tracer, the instruments and the
    settings it was given: ``capture`` content, the ``provider_name``, and ``system_prompt()``, the session's system
    prompt as it is when a request starts (None without a session). With a `FallbackProvider`, ``answering`` maps
    each of its names to that provider's ``gen_ai.provider.name``: a ``chat`` span names the one that answered."""

    __slots__ = ("_answering", "_capture", "_instruments", "_provider_name", "_system_prompt", "_tracer")

    def __init__(
        self,
        tracer: Tracer,
        instruments: _Instruments,
        *,
        capture: bool,
        provider_name: str,
        system_prompt: Callable[[], str | None],
        answering: Mapping[str, str] | None = None,
    ) -> None:
        self._answering: Mapping[str, str] = {} if answering is None else answering
        self._tracer = tracer
        self._instruments = instruments
        self._capture = capture
        self._provider_name = provider_name
        self._system_prompt = system_prompt

    # -- model requests ------------------------------------------------------------------------------

    def start_chat(self, turn: _Turn, state: TurnState, now: int) -> _Chat:
        attributes = {**turn.metric, "trioloop.iteration": state.iteration}
        span = self._tracer.start_span(
            f"chat {turn.model}",
            context=turn.context,
            kind=SpanKind.CLIENT,
            attributes=attributes,
            start_time=now,
        )
        chat = _Chat(span, now, state)
        if self._capture and span.is_recording():
            chat.messages = len(state.turn_messages)
            span.set_attribute("gen_ai.input.messages", _messages_json(state.messages))
            system_prompt = self._system_prompt()
            if system_prompt is not None:
                instructions = [{"type": "text", "content": system_prompt}]
                span.set_attribute("gen_ai.system_instructions", json.dumps(instructions, ensure_ascii=False))
        return chat

    def end_chat(self, turn: _Turn, chat: _Chat, state: TurnState, now: int, cut: str | None = None) -> None:
        turn.chat = None
        same = state.iteration == chat.iteration
        usage = _usage_minus(state.usage if same else state.usage_before_iteration, chat.base)
        error = state.error if state.outcome is Outcome.FAILED and same else None
        span = chat.span
        first = chat.first_chunk
        if first is None and same and (state.stop_reason is not None or state.response_model):
            # The whole response came in one wake-up of the turn (one state for all its events): its
            # first chunk arrived with its end, as far as anything published can tell.
            first = now
        # A provider list's choice, when this request was answered: its name (``trioloop.provider``), and that
        # provider's own ``gen_ai.provider.name`` in place of the list's, on the span and the metrics.
        answered = state.answered_by if chat.first_chunk is not None or (first is not None and error is None) else ""
        answering = self._answering.get(answered) if answered else None
        if span.is_recording():
            attributes = _usage_attributes(usage)
            attributes["trioloop.request.retries"] = state.budget.retries_used - chat.retries
            attributes["trioloop.request.outcome"] = cut or _request_outcome(state, same)
            if first is not None:
                attributes["gen_ai.response.time_to_first_chunk"] = (first - chat.start) / 1e9
            if same and state.stop_reason is not None:
                attributes["gen_ai.response.finish_reasons"] = (state.stop_reason.value,)
            if state.response_model:
                attributes["gen_ai.response.model"] = state.response_model
            if answered:
                attributes["trioloop.provider"] = answered
                if answering is not None:
                    attributes["gen_ai.provider.name"] = answering
            if error is not None:
                attributes["error.type"] = error.code.value
            if self._capture:
                output = [m for m in state.turn_messages[chat.messages :] if m.role == "assistant"]
                if output:
                    attributes["gen_ai.output.messages"] = _messages_json(output)
            span.set_attributes(attributes)
            if error is not None:
                span.set_status(StatusCode.ERROR, error.code.value)
        span.end(end_time=now)
        metric = turn.metric
        if answering is not None:
            metric = {**metric, "gen_ai.provider.name": answering}
        instruments = self._instruments
        if any(usage):
            instruments.tokens.record(usage[0], {**metric, "gen_ai.token.type": "input"})
            instruments.tokens.record(usage[1], {**metric, "gen_ai.token.type": "output"})
        if error is not None:
            metric = {**metric, "error.type": error.code.value}
        instruments.duration.record((now - chat.start) / 1e9, metric)

    # -- the review ----------------------------------------------------------------------------------

    def start_review(self, turn: _Turn, state: TurnState, now: int) -> _Review:
        span = self._tracer.start_span(
            "await_review",
            context=turn.context,
            kind=SpanKind.INTERNAL,
            attributes={"trioloop.turn.id": state.turn_id, "trioloop.iteration": state.iteration},
            start_time=now,
        )
        return _Review(span, now, state)

    def end_review(self, turn: _Turn, review: _Review, state: TurnState, now: int, outcome: str) -> None:
        turn.review = None
        waited = (now - review.start) / 1e9
        span = review.span
        if span.is_recording():
            granted = {grant.call_id for grant in state.grants}
            approved = denied = edited = 0
            denials: list[str] = []
            for call_id in review.pending:
                call = state.call(call_id)
                if call is None:
                    continue
                if call.denial_reason is DenialReason.USER_DECLINED:
                    denied += 1
                    if call.result is not None:
                        denials.append(call.result)
                elif call_id in granted:
                    approved += 1
                    edited += bool(call.edits)
            attributes: _Attrs = {
                "trioloop.review.outcome": outcome,
                "trioloop.review.calls": len(review.pending),
                "trioloop.review.approved": approved,
                "trioloop.review.denied": denied,
                "trioloop.review.edited": edited,
                "trioloop.review.undecided": len(review.pending) - approved - denied,
                "trioloop.review.wait_s": waited,
            }
            if self._capture and denials:
                attributes["trioloop.review.denials"] = tuple(denials)
            span.set_attributes(attributes)
        span.end(end_time=now)
        self._instruments.review.record(waited, {"trioloop.review.outcome": outcome})

    # -- tool calls ----------------------------------------------------------------------------------

    def calls(self, turn: _Turn, state: TurnState, now: int) -> None:
        calls = state.calls
        start = min(turn.scan_from, state.iteration_first_call)
        caught_up = True
        for position in range(start, len(calls)):
            call = calls[position]
            if turn.seen.get(call.id) is not call:
                turn.seen[call.id] = call
                if call.id in turn.done:
                    pass
                elif call.status is CallStatus.RUNNING and call.id not in turn.tools:
                    turn.ran.add(call.id)
                    turn.tools[call.id] = (self._start_tool(turn, call, now), now)
                elif call.is_terminal:
                    self._end_tool(turn, call, state, now)
            if caught_up:
                if call.id in turn.done:
                    turn.scan_from = position + 1
                else:
                    caught_up = False

    def _start_tool(self, turn: _Turn, call: CallRecord, now: int) -> Span:
        attributes: _Attrs = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call.tool_name,
            "gen_ai.tool.call.id": call.id,
            "gen_ai.tool.type": "function",
            "trioloop.call.effect": call.effect,
            "trioloop.call.destructive": call.destructive,
            "trioloop.call.input_digest": call.input_digest,
            "trioloop.call.iteration": call.iteration,
            **_decider_attributes(call.decided_by, capture=self._capture),
        }
        return self._tracer.start_span(
            f"execute_tool {call.tool_name}",
            context=turn.context,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=now,
        )

    def _end_tool(self, turn: _Turn, call: CallRecord, state: TurnState, now: int) -> None:
        """End the call's span; one that never ran (denied, refused) gets a span of no length, here."""
        turn.done.add(call.id)
        opened = turn.tools.pop(call.id, None)
        ran = call.id in turn.ran
        span, start = opened if opened is not None else (self._start_tool(turn, call, now), now)
        error_type = _call_error(call, state, ran) if call.status is CallStatus.FAILED else None
        if span.is_recording():
            attributes: _Attrs = {"trioloop.call.status": call.status.value, "trioloop.call.ran": ran}
            if call.denial_reason is not None:
                attributes["trioloop.call.denial_reason"] = call.denial_reason.value
                attributes["trioloop.call.interrupted"] = ran
            if call.edits:
                attributes["trioloop.call.edited_fields"] = len(call.edits)
            if error_type is not None:
                attributes["error.type"] = error_type
            if self._capture:
                attributes.update(_call_content(call, state))
            span.set_attributes(attributes)
            if error_type is not None:
                span.set_status(StatusCode.ERROR, error_type)
        span.end(end_time=now)
        counted: _Attrs = {
            "gen_ai.tool.name": call.tool_name,
            "trioloop.call.status": call.status.value,
            "trioloop.call.effect": call.effect,
        }
        if call.denial_reason is not None:
            counted["trioloop.call.denial_reason"] = call.denial_reason.value
        self._instruments.calls.add(1, counted)
        if ran:
            metric: _Attrs = {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.provider.name": self._provider_name,
                "gen_ai.tool.name": call.tool_name,
            }
            if error_type is not None:
                metric["error.type"] = error_type
            self._instruments.duration.record((now - start) / 1e9, metric)


# -- retries -----------------------------------------------------------------------------------------


def _notices(turn: _Turn, state: TurnState, now: int) -> None:
    fresh = state.notices[turn.notices :]
    turn.notices = len(state.notice_log)
    span = turn.chat.span if turn.chat is not None else turn.span
    if not span.is_recording():
        return
    for text in fresh:
        match = _RETRY.match(text)
        if match is None:
            continue  # bounds, skipped frames, refused edits: the span attributes tell the outcome
        event: _Attrs = {
            "trioloop.retry.attempt": int(match["n"]),
            "trioloop.retry.of": int(match["of"]),
            "trioloop.retry.wait_s": float(match["wait"]),
            "trioloop.retry.cause": match["cause"],
        }
        if match["hop"]:
            event["trioloop.retry.next_provider"] = True  # a fallback list's hop, at once
        span.add_event("trioloop.retry", event, timestamp=now)
