"""OpenTelemetry traces and metrics for every turn, derived from the states a session publishes.

`OtelObserver` is a `TurnObserver`: it reads nothing but the `TurnState`s a `Session` publishes, in order,
and compares each with the one before. A turn becomes one ``invoke_agent`` span; under it, one ``chat
{model}`` span per model request (from the phase entering ``requesting`` until the response ends), one
``await_review`` span per review wait and one ``execute_tool {tool}`` span per call, named and attributed
after the OpenTelemetry GenAI semantic conventions (``gen_ai.*``; trioloop's own facts under
``trioloop.*``). Timestamps are taken when a state is published, so a span opened at one publication and
ended at a later one lasts as long as that took. Content (prompts, completions, tool input and results,
the reviewer's words) is recorded only with ``capture_content=True``; no key is ever read.

Needs the OpenTelemetry API (``pip install "trioloop[otel]"``); the app configures the SDK and exporter. A
turn that begins with neither a tracer nor a meter provider configured (the API's no-op default) is followed
by its id alone, so the observer then costs next to nothing.
"""

from __future__ import annotations

import json
import re
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, Literal, TypeAlias, final

try:
    from opentelemetry import metrics, trace
    from opentelemetry.trace import Span, SpanKind, StatusCode
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by tests/test_otel.py
    raise ImportError(
        'trioloop.otel needs the OpenTelemetry API, which is not installed: pip install "trioloop[otel]"'
    ) from exc

from trioloop import __version__
from trioloop.machine.limits import Bound, bound_notice
from trioloop.machine.reducer import CallRecord, CallStatus, DenialReason, Outcome, Phase, TurnState
from trioloop.protocol.events import Usage
from trioloop.protocol.messages import (
    Message,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
    ToolResultBlock,
)
from trioloop.providers.anthropic import AnthropicProvider
from trioloop.providers.openai import OpenAIProvider
from trioloop.providers.openai_responses import OpenAIResponsesProvider
from trioloop.runtime.session import Session

__all__ = ["OtelObserver", "gen_ai_provider_name", "instrument"]

TurnEnd: TypeAlias = Literal["settled", "suspended", "abandoned"]
_Attrs: TypeAlias = dict[str, Any]

_SCOPE: Final = "trioloop"
#: Bucket boundaries the GenAI conventions give for the two ``gen_ai.client.*`` histograms.
_TOKEN_BUCKETS: Final = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
_SECONDS_BUCKETS: Final = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
_REVIEW_BUCKETS: Final = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 900.0, 1800.0, 3600.0, 14400.0, 86400.0)
#: A retry notice as `trioloop.loop` words it: "HTTP 529, retry 1 of 3 in 0.5 s".
_RETRY: Final = re.compile(
    r"^(?P<cause>.*), retry (?P<n>\d+) of (?P<of>\d+) in (?P<wait>\d+(?:\.\d+)?(?:e[+-]?\d+)?) s$"
)
_BOUNDS: Final = {bound_notice(bound): bound for bound in Bound}
_IN_REQUEST: Final = frozenset({Phase.REQUESTING, Phase.STREAMING})
_SETTLED: Final = Phase.SETTLED
_NO_TRACING: Final = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
_STATUSES: Final = tuple(CallStatus)


def gen_ai_provider_name(provider: object) -> str:
    """The ``gen_ai.provider.name`` for a provider: ``anthropic`` or ``openai`` for the shipped ones (the
    scripted provider by the wire it serves), else the provider's class name."""
    if isinstance(provider, AnthropicProvider):
        return "anthropic"
    if isinstance(provider, OpenAIProvider | OpenAIResponsesProvider):
        return "openai"
    # HttpChatProvider and ScriptedProvider keep their WireFormat here; its ``name`` is public protocol.
    name = getattr(getattr(provider, "_wire", None), "name", None)
    return name if isinstance(name, str) and name else type(provider).__name__


class _Instruments:
    """The metric instruments, made once per meter provider."""

    def __init__(self, meter: metrics.Meter) -> None:
        self.tokens = _histogram(meter, "gen_ai.client.token.usage", "{token}", _TOKEN_BUCKETS)
        self.duration = _histogram(meter, "gen_ai.client.operation.duration", "s", _SECONDS_BUCKETS)
        self.review = _histogram(meter, "trioloop.review.duration", "s", _REVIEW_BUCKETS)
        self.calls = meter.create_counter(
            "trioloop.calls", unit="{call}", description="Tool calls the model opened, by the status they ended in."
        )


_DESCRIPTIONS: Final = {
    "gen_ai.client.token.usage": "Number of input and output tokens used.",
    "gen_ai.client.operation.duration": "GenAI operation duration.",
    "trioloop.review.duration": "How long a turn waited for the person to decide its review.",
}


def _histogram(meter: metrics.Meter, name: str, unit: str, buckets: Sequence[float]) -> metrics.Histogram:
    description = _DESCRIPTIONS[name]
    try:
        return meter.create_histogram(name, unit, description, explicit_bucket_boundaries_advisory=buckets)
    except TypeError:  # opentelemetry-api before 1.30 takes no advice: the SDK's (or the view's) buckets apply
        return meter.create_histogram(name, unit, description)


_GLOBAL_INSTRUMENTS: list[_Instruments] = []
_INSTRUMENTS: weakref.WeakKeyDictionary[metrics.MeterProvider, _Instruments] = weakref.WeakKeyDictionary()


def _instruments(meter_provider: metrics.MeterProvider | None) -> _Instruments:
    if meter_provider is None:
        if not _GLOBAL_INSTRUMENTS:  # the global provider's proxy meter follows a provider set later
            _GLOBAL_INSTRUMENTS.append(_Instruments(metrics.get_meter(_SCOPE, __version__)))
        return _GLOBAL_INSTRUMENTS[0]
    made = _INSTRUMENTS.get(meter_provider)
    if made is None:
        made = _INSTRUMENTS[meter_provider] = _Instruments(metrics.get_meter(_SCOPE, __version__, meter_provider))
    return made


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
class OtelObserver:
    """Spans and metrics for the turns of one session, from the states it publishes.

    ``session_or_provider_name`` is the `Session` (its provider names ``gen_ai.provider.name``, its model
    ``gen_ai.request.model`` unless ``model`` is given) or the provider's name itself, with ``model``.
    ``tracer_provider`` and ``meter_provider`` default to the global ones. ``capture_content=True`` adds the
    prompts, completions, tool inputs and results, call summaries and the reviewer's words (``gen_ai.input
    .messages``, ``gen_ai.output.messages``, ``gen_ai.system_instructions``, ``gen_ai.tool.call.arguments``,
    ``gen_ai.tool.call.result``, ``trioloop.call.summary``, ``trioloop.review.denials``); leave it off
    wherever telemetry may not hold what users write. ``clock`` gives span timestamps in ns since the epoch.
    One observer serves one session: turns are told apart by their id.
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
        else:
            # Weakly: the session holds its observers, and a cycle would keep every turn's states alive
            # until the garbage collector's next full pass.
            self._session = weakref.ref(session_or_provider_name)
            self._provider_name = gen_ai_provider_name(session_or_provider_name.provider)
        self._model = model
        self._tracer_provider = tracer_provider
        self._meter_provider = meter_provider
        self._tracer = trace.get_tracer(_SCOPE, __version__, tracer_provider)
        self._instruments = _instruments(meter_provider)
        self._capture = capture_content
        self._agent_name = agent_name
        self._conversation_id = conversation_id
        self._clock = clock
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
            self._end_chat(turn, chat, state, now)
            chat = None
        if state.phase in _IN_REQUEST:
            if chat is None:
                chat = turn.chat = self._start_chat(turn, state, now)
            elif state.phase is Phase.STREAMING and chat.first_chunk is None:
                chat.first_chunk = now
        if len(state.notice_log) != turn.notices:
            self._notices(turn, state, now)
        review = turn.review
        if state.phase is Phase.AWAITING_APPROVAL:
            if review is None or review.iteration != state.iteration:
                if review is not None:
                    self._end_review(turn, review, state, now, "decided")
                review = turn.review = self._start_review(turn, state, now)
            review.pending.update(c.id for c in state.current_calls if c.status is CallStatus.PENDING)
        elif review is not None:
            self._end_review(turn, review, state, now, _review_outcome(state))
        if last is None or state.calls is not last.calls:
            self._calls(turn, state, now)
        if state.is_settled:
            self._end_turn(turn, state, now, "settled")

    def _end_turn(self, turn: _Turn, state: TurnState, now: int, status: TurnEnd) -> None:
        turn.ended = status
        if turn.chat is not None:
            self._end_chat(turn, turn.chat, state, now, None if status == "settled" else status)
        if turn.review is not None:
            self._end_review(turn, turn.review, state, now, "decided" if status == "settled" else status)
        for span, _ in turn.tools.values():  # only a turn that did not settle leaves calls running
            span.set_attribute("trioloop.call.status", "running")
            span.end(end_time=now)
        turn.tools.clear()
        span = turn.span
        outcome = state.outcome
        error = state.error if outcome is Outcome.FAILED else None
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

    # -- model requests --------------------------------------------------------------------------

    def _start_chat(self, turn: _Turn, state: TurnState, now: int) -> _Chat:
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
            session = None if self._session is None else self._session()
            if session is not None:
                instructions = [{"type": "text", "content": session.system_prompt}]
                span.set_attribute("gen_ai.system_instructions", json.dumps(instructions, ensure_ascii=False))
        return chat

    def _end_chat(self, turn: _Turn, chat: _Chat, state: TurnState, now: int, cut: str | None = None) -> None:
        turn.chat = None
        same = state.iteration == chat.iteration
        usage = _usage_minus(state.usage if same else state.usage_before_iteration, chat.base)
        error = state.error if state.outcome is Outcome.FAILED and same else None
        span = chat.span
        if span.is_recording():
            attributes = _usage_attributes(usage)
            attributes["trioloop.request.retries"] = state.budget.retries_used - chat.retries
            attributes["trioloop.request.outcome"] = cut or _request_outcome(state, same)
            first = chat.first_chunk
            if first is None and same and (state.stop_reason is not None or state.response_model):
                # The whole response came in one wake-up of the turn (one state for all its events): its
                # first chunk arrived with its end, as far as anything published can tell.
                first = now
            if first is not None:
                attributes["gen_ai.response.time_to_first_chunk"] = (first - chat.start) / 1e9
            if same and state.stop_reason is not None:
                attributes["gen_ai.response.finish_reasons"] = (state.stop_reason.value,)
            if state.response_model:
                attributes["gen_ai.response.model"] = state.response_model
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
        instruments = self._instruments
        if any(usage):
            instruments.tokens.record(usage[0], {**metric, "gen_ai.token.type": "input"})
            instruments.tokens.record(usage[1], {**metric, "gen_ai.token.type": "output"})
        if error is not None:
            metric = {**metric, "error.type": error.code.value}
        instruments.duration.record((now - chat.start) / 1e9, metric)

    def _notices(self, turn: _Turn, state: TurnState, now: int) -> None:
        fresh = state.notices[turn.notices :]
        turn.notices = len(state.notice_log)
        span = turn.chat.span if turn.chat is not None else turn.span
        if not span.is_recording():
            return
        for text in fresh:
            match = _RETRY.match(text)
            if match is None:
                continue  # bounds, skipped frames, refused edits: the span attributes tell the outcome
            span.add_event(
                "trioloop.retry",
                {
                    "trioloop.retry.attempt": int(match["n"]),
                    "trioloop.retry.of": int(match["of"]),
                    "trioloop.retry.wait_s": float(match["wait"]),
                    "trioloop.retry.cause": match["cause"],
                },
                timestamp=now,
            )

    # -- the review ------------------------------------------------------------------------------

    def _start_review(self, turn: _Turn, state: TurnState, now: int) -> _Review:
        span = self._tracer.start_span(
            "await_review",
            context=turn.context,
            kind=SpanKind.INTERNAL,
            attributes={"trioloop.turn.id": state.turn_id, "trioloop.iteration": state.iteration},
            start_time=now,
        )
        return _Review(span, now, state)

    def _end_review(self, turn: _Turn, review: _Review, state: TurnState, now: int, outcome: str) -> None:
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

    # -- tool calls ------------------------------------------------------------------------------

    def _calls(self, turn: _Turn, state: TurnState, now: int) -> None:
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


# -- pure helpers ------------------------------------------------------------------------------------


def _usage_minus(a: Usage, b: Usage) -> tuple[int, int, int, int, int]:
    return (
        a.input_tokens - b.input_tokens,
        a.output_tokens - b.output_tokens,
        a.cache_read_input_tokens - b.cache_read_input_tokens,
        a.cache_creation_input_tokens - b.cache_creation_input_tokens,
        a.reasoning_tokens - b.reasoning_tokens,
    )


def _usage_attributes(usage: Usage | Sequence[int]) -> _Attrs:
    """The ``gen_ai.usage.*`` attributes; the cache and reasoning ones only when not zero."""
    if isinstance(usage, Usage):
        usage = _usage_minus(usage, Usage())
    attributes: _Attrs = {"gen_ai.usage.input_tokens": usage[0], "gen_ai.usage.output_tokens": usage[1]}
    for name, value in zip(_EXTRA_USAGE, usage[2:], strict=True):
        if value:
            attributes[name] = value
    return attributes


_EXTRA_USAGE: Final = (
    "gen_ai.usage.cache_read.input_tokens",
    "gen_ai.usage.cache_creation.input_tokens",
    "gen_ai.usage.reasoning.output_tokens",
)


def _bound(state: TurnState) -> Bound | None:
    if state.outcome is not Outcome.BOUNDED or not len(state.notice_log):
        return None
    return _BOUNDS.get(state.notices[-1])


def _review_outcome(state: TurnState) -> str:
    if not state.is_settled:
        return "decided"
    bound = _bound(state)
    return bound.value if bound is not None else (state.outcome.value if state.outcome is not None else "settled")


def _request_outcome(state: TurnState, same_iteration: bool) -> str:
    """``responded``, or how the turn settled while the request was open (``cancelled``, ``bounded``, ``failed``)."""
    outcome = state.outcome
    if not same_iteration or outcome is None or outcome is Outcome.COMPLETED:
        return "responded"
    return outcome.value


def _call_error(call: CallRecord, state: TurnState, ran: bool) -> str:
    """A low-cardinality name for why ``call`` failed: the rule it broke, its input, or the tool's run."""
    for record in reversed(state.violations):
        if record.call_id == call.id:
            return record.violation.value
    if not call.input_digest:
        return "invalid_input"
    return "tool_error" if ran else "not_run"


def _call_content(call: CallRecord, state: TurnState) -> _Attrs:
    content: _Attrs = {"trioloop.call.summary": call.summary}
    for message in state.turn_messages:
        for block in message.content:
            if isinstance(block, ToolCallBlock) and block.id == call.id:
                content["gen_ai.tool.call.arguments"] = _json(block.input)
    if call.edits:
        content["trioloop.call.edits"] = _json([list(edit) for edit in call.edits])
    if call.result is not None:
        content["gen_ai.tool.call.result"] = call.result
    return content


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _messages_json(messages: Iterable[Message]) -> str:
    """Messages in the GenAI conventions' JSON form (role and parts)."""
    return _json([_message_parts(message) for message in messages])


def _message_parts(message: Message) -> Mapping[str, Any]:
    parts: list[Mapping[str, Any]] = []
    for block in message.content:
        if isinstance(block, TextBlock):
            parts.append({"type": "text", "content": block.text})
        elif isinstance(block, ToolCallBlock):
            parts.append({"type": "tool_call", "id": block.id, "name": block.name, "arguments": block.input})
        elif isinstance(block, ToolResultBlock):
            parts.append({"type": "tool_call_response", "id": block.call_id, "response": block.content})
        elif isinstance(block, ThinkingBlock):
            parts.append({"type": "reasoning", "content": block.thinking})
        elif isinstance(block, RedactedThinkingBlock):
            parts.append({"type": "redacted_reasoning"})
        else:
            parts.append({"type": block.kind})
    results_only = bool(parts) and all(isinstance(block, ToolResultBlock) for block in message.content)
    return {"role": "tool" if results_only else message.role, "parts": parts}
