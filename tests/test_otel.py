"""trioloop.otel: the span tree, attributes and metrics of turns, read back from the SDK's in-memory exporter
and reader; content kept out unless asked for, the API key never in; the extra optional."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from contextlib import aclosing
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from opentelemetry.metrics import Meter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import StatusCode

from trioloop import (
    DEFAULT_TURN_LIMITS,
    AnthropicProvider,
    CallStatus,
    OpenAIProvider,
    OpenAIResponsesProvider,
    Outcome,
    Phase,
    ScriptedProvider,
    Session,
    ToolExecutionContext,
    ToolOutcome,
    TurnLimits,
    TurnState,
    create_tool_registry,
    define_document_kind,
    function_tool,
    otel,
)
from trioloop.durable.store import MemoryJournalStore
from trioloop.lowlevel import Submit, reduce_turn
from trioloop.machine.conditions import Condition
from trioloop.machine.rules import ApprovalRule
from trioloop.otel import OtelObserver, gen_ai_provider_name, instrument
from trioloop.protocol.events import MessageStart, MessageStop, StopReason, StreamEvent, TextDelta, Usage
from trioloop.protocol.messages import ToolCallBlock
from trioloop.providers._loopback import LoopbackResponse, open_loopback_server, replay
from trioloop.providers.anthropic import ANTHROPIC_WIRE
from trioloop.providers.base import WireResponse
from trioloop.providers.scripted import ScriptedCall, ScriptStep

NOTE = define_document_kind("note", dump=lambda text: text, load=lambda text: text)
FIXTURES = Path(__file__).parent / "fixtures" / "providers"
CANARY = "sk-ant-canary-0c9e1f7a4b2d8e6f3a5c7b9d1e2f4a6c8b0d2e4f6a8c"


@function_tool
async def append_line(ctx: ToolExecutionContext[str], line: str) -> ToolOutcome[str]:
    """Append one line to the note."""
    return ToolOutcome.success(f"appended {line}", document=ctx.document + line + "\n")


@function_tool(effect="read")
def read_note(ctx: ToolExecutionContext[str]) -> ToolOutcome[str]:
    """Read the note."""
    return ToolOutcome.success(ctx.document)


@function_tool(effect="read")
async def slow_read(ctx: ToolExecutionContext[str]) -> ToolOutcome[str]:
    """Read the note, slowly."""
    await trio.sleep(3600)
    return ToolOutcome.success(ctx.document)


@function_tool(effect="read")
def broken_read(ctx: ToolExecutionContext[str]) -> ToolOutcome[str]:
    """A read that fails."""
    raise RuntimeError("broken")


TOOLS = [append_line, read_note, slow_read, broken_read]


@attrs.frozen
class Telemetry:
    exporter: InMemorySpanExporter
    tracer_provider: TracerProvider
    reader: InMemoryMetricReader
    meter_provider: MeterProvider

    def spans(self) -> tuple[ReadableSpan, ...]:
        return tuple(self.exporter.get_finished_spans())

    def named(self, prefix: str) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.name.startswith(prefix)]

    def one(self, prefix: str) -> ReadableSpan:
        (span,) = self.named(prefix)
        return span

    def tree(self) -> list[tuple[str, str | None]]:
        """(name, parent's name) of every span, sorted."""
        names = {s.context.span_id: s.name for s in self.spans()}
        return sorted((s.name, names.get(s.parent.span_id) if s.parent else None) for s in self.spans())

    def metrics(self) -> dict[str, list[Any]]:
        found: dict[str, list[Any]] = {}
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    found.setdefault(metric.name, []).extend(metric.data.data_points)
        return found

    def exported_text(self) -> str:
        """Everything exported, spans and metrics, as one string to search."""
        data = self.reader.get_metrics_data()
        return "\n".join([*(s.to_json() for s in self.spans()), data.to_json() if data else ""])


@pytest.fixture
def telemetry() -> Telemetry:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    return Telemetry(exporter, tracer_provider, reader, MeterProvider(metric_readers=[reader]))


def attrs_of(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def call(cid: str, name: str, **tool_input: Any) -> ScriptedCall:
    return ScriptedCall(id=cid, name=name, input=tool_input)


async def wait_for(session: Session[str], predicate: Callable[[TurnState], bool]) -> TurnState:
    async with aclosing(session.states()) as states:
        async for state in states:
            if predicate(state):
                return state
    raise AssertionError("unreachable")


async def decide(session: Session[str], verdict: str = "approve", reason: str = "") -> None:
    """A reviewer task: answers every pending call with ``verdict``."""
    async with aclosing(session.states()) as states:
        async for state in states:
            if state.phase is Phase.AWAITING_APPROVAL:
                for pending in state.current_calls:
                    if pending.status is CallStatus.PENDING:
                        if verdict == "deny":
                            session.deny(pending.id, reason)
                        else:
                            session.approve(pending.id)


async def run_turn(
    telemetry: Telemetry,
    steps: Sequence[ScriptStep],
    text: str = "go",
    *,
    verdict: str = "approve",
    reason: str = "",
    document: str = "",
    limits: TurnLimits | None = None,
    **options: Any,
) -> TurnState:
    async with ScriptedProvider(steps) as provider:
        session = Session(
            document=document,
            kind=NOTE,
            provider=provider,
            model="scripted-1",
            tools=TOOLS,
            limits=limits or DEFAULT_TURN_LIMITS,
        )
        instrument(
            session, tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider, **options
        )
        async with session, trio.open_nursery() as nursery:
            nursery.start_soon(decide, session, verdict, reason)
            state = await session.send(text)
            nursery.cancel_scope.cancel()
    return state


READ_AND_MUTATE = [
    ScriptStep(text="Let me look.", tool_calls=[call("r1", "read_note"), call("m1", "append_line", line="x")]),
    ScriptStep(text="Done."),
]


async def test_a_completed_turn_with_a_read_and_an_approved_mutation(telemetry: Telemetry) -> None:
    state = await run_turn(telemetry, READ_AND_MUTATE)
    assert state.outcome is Outcome.COMPLETED
    assert telemetry.tree() == [
        ("await_review", "invoke_agent"),
        ("chat scripted-1", "invoke_agent"),
        ("chat scripted-1", "invoke_agent"),
        ("execute_tool append_line", "invoke_agent"),
        ("execute_tool read_note", "invoke_agent"),
        ("invoke_agent", None),
    ]
    turn = telemetry.one("invoke_agent")
    assert {s.context.trace_id for s in telemetry.spans()} == {turn.context.trace_id}
    assert attrs_of(turn) | {"gen_ai.usage.input_tokens": 0, "gen_ai.usage.output_tokens": 0} == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.provider.name": "anthropic",
        "gen_ai.request.model": "scripted-1",
        "gen_ai.usage.input_tokens": 0,
        "gen_ai.usage.output_tokens": 0,
        "trioloop.turn.id": "turn-1",
        "trioloop.turn.resumed": False,
        "trioloop.turn.status": "settled",
        "trioloop.turn.outcome": "completed",
        "trioloop.turn.iterations": 2,
        "trioloop.turn.retries": 0,
        "trioloop.turn.violations": 0,
        "trioloop.turn.calls": 2,
        "trioloop.turn.calls.pending": 0,
        "trioloop.turn.calls.approved": 0,
        "trioloop.turn.calls.running": 0,
        "trioloop.turn.calls.succeeded": 2,
        "trioloop.turn.calls.failed": 0,
        "trioloop.turn.calls.undone": 0,
        "trioloop.turn.calls.denied": 0,
    }
    assert attrs_of(turn)["gen_ai.usage.input_tokens"] == state.usage.input_tokens > 0
    assert turn.status.status_code is StatusCode.UNSET

    first, second = sorted(telemetry.named("chat"), key=lambda s: s.start_time or 0)
    assert attrs_of(first)["trioloop.iteration"] == 1 and attrs_of(second)["trioloop.iteration"] == 2
    assert attrs_of(first)["gen_ai.operation.name"] == "chat"
    assert attrs_of(first)["gen_ai.response.finish_reasons"] == ("tool_use",)
    assert attrs_of(second)["gen_ai.response.finish_reasons"] == ("end_turn",)  # the reducer keeps the stop reason
    assert attrs_of(first)["gen_ai.response.model"] == "scripted-1"  # as the server named it
    assert attrs_of(first)["gen_ai.usage.input_tokens"] + attrs_of(second)["gen_ai.usage.input_tokens"] == (
        state.usage.input_tokens
    )
    assert attrs_of(second)["gen_ai.usage.output_tokens"] > 0
    assert attrs_of(second)["trioloop.request.outcome"] == "responded"
    assert attrs_of(first)["gen_ai.response.time_to_first_chunk"] >= 0

    review = telemetry.one("await_review")
    assert {k: v for k, v in attrs_of(review).items() if k != "trioloop.review.wait_s"} == {
        "trioloop.turn.id": "turn-1",
        "trioloop.iteration": 1,
        "trioloop.review.outcome": "decided",
        "trioloop.review.calls": 1,
        "trioloop.review.approved": 1,
        "trioloop.review.denied": 0,
        "trioloop.review.edited": 0,
        "trioloop.review.undecided": 0,
    }
    assert first.end_time is not None and review.start_time is not None and first.end_time <= review.start_time

    mutation = telemetry.one("execute_tool append_line")
    assert attrs_of(mutation) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "append_line",
        "gen_ai.tool.call.id": "m1",
        "gen_ai.tool.type": "function",
        "trioloop.call.effect": "mutate",
        "trioloop.call.destructive": False,
        "trioloop.call.input_digest": state.calls[1].input_digest,
        "trioloop.call.iteration": 1,
        "trioloop.call.decided_by": "person",
        "trioloop.call.decider": "approved by the person",
        "trioloop.call.status": "succeeded",
        "trioloop.call.ran": True,
    }
    assert attrs_of(telemetry.one("execute_tool read_note"))["trioloop.call.effect"] == "read"
    assert review.end_time is not None and mutation.start_time is not None and review.end_time <= mutation.start_time


async def test_metrics_follow_the_genai_conventions(telemetry: Telemetry) -> None:
    state = await run_turn(telemetry, READ_AND_MUTATE)
    metrics = telemetry.metrics()
    tokens = {p.attributes["gen_ai.token.type"]: p for p in metrics["gen_ai.client.token.usage"]}
    assert tokens["input"].sum == state.usage.input_tokens and tokens["input"].count == 2
    assert tokens["output"].sum == state.usage.output_tokens
    assert dict(tokens["input"].attributes) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "anthropic",
        "gen_ai.request.model": "scripted-1",
        "gen_ai.token.type": "input",
    }
    if "explicit_bucket_boundaries_advisory" in inspect.signature(Meter.create_histogram).parameters:
        assert tokens["input"].explicit_bounds[:3] == (1, 4, 16)  # the conventions' buckets (API 1.30 on)
    durations = {p.attributes["gen_ai.operation.name"]: p for p in metrics["gen_ai.client.operation.duration"]}
    assert durations["chat"].count == 2 and durations["invoke_agent"].count == 1
    assert sum(p.count for p in metrics["gen_ai.client.operation.duration"] if "gen_ai.tool.name" in p.attributes) == 2
    (review,) = metrics["trioloop.review.duration"]
    assert review.count == 1 and dict(review.attributes) == {"trioloop.review.outcome": "decided"}
    counted = {
        (p.attributes["gen_ai.tool.name"], p.attributes["trioloop.call.status"]): p.value
        for p in metrics["trioloop.calls"]
    }
    assert counted == {("append_line", "succeeded"): 1, ("read_note", "succeeded"): 1}


async def test_a_stopped_turn_ends_every_span(telemetry: Telemetry) -> None:
    async with ScriptedProvider([ScriptStep(text="slow " * 200, stall_after_bytes=400)]) as provider:
        session = Session(document="", kind=NOTE, provider=provider, model="scripted-1", tools=TOOLS)
        instrument(session, tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider)
        async with session, trio.open_nursery() as nursery:
            nursery.start_soon(session.send, "go")
            await wait_for(session, lambda s: s.phase is Phase.STREAMING)
            assert session.stop()
    assert session.state is not None and session.state.outcome is Outcome.CANCELLED
    assert telemetry.tree() == [("chat scripted-1", "invoke_agent"), ("invoke_agent", None)]
    turn, chat = telemetry.one("invoke_agent"), telemetry.one("chat")
    assert attrs_of(turn)["trioloop.turn.outcome"] == "cancelled"
    assert attrs_of(turn)["trioloop.turn.status"] == "settled"
    assert attrs_of(chat)["trioloop.request.outcome"] == "cancelled"
    assert "gen_ai.response.finish_reasons" not in attrs_of(chat)
    assert turn.status.status_code is StatusCode.UNSET and chat.status.status_code is StatusCode.UNSET


async def test_a_turn_bounded_by_the_deadline_while_a_tool_runs(
    telemetry: Telemetry, autojump_clock: trio.testing.MockClock
) -> None:
    steps = [ScriptStep(tool_calls=[call("s1", "slow_read")]), ScriptStep(text="never")]
    state = await run_turn(
        telemetry,
        steps,
        limits=TurnLimits(turn_deadline_ms=5000),
        clock=lambda: int(trio.current_time() * 1e9),  # the mock clock, so durations are exact
    )
    assert state.outcome is Outcome.BOUNDED
    assert telemetry.tree() == [
        ("chat scripted-1", "invoke_agent"),
        ("execute_tool slow_read", "invoke_agent"),
        ("invoke_agent", None),
    ]
    turn, tool = telemetry.one("invoke_agent"), telemetry.one("execute_tool")
    assert attrs_of(turn)["trioloop.turn.outcome"] == "bounded"
    assert attrs_of(turn)["trioloop.turn.bound"] == "deadline"
    assert attrs_of(turn)["trioloop.turn.calls.denied"] == 1
    assert {k: attrs_of(tool)[k] for k in ("trioloop.call.status", "trioloop.call.denial_reason")} == {
        "trioloop.call.status": "denied",
        "trioloop.call.denial_reason": "limit_exceeded",
    }
    assert attrs_of(tool)["trioloop.call.ran"] and attrs_of(tool)["trioloop.call.interrupted"]
    assert turn.start_time is not None and turn.end_time is not None
    assert tool.start_time is not None and tool.end_time is not None
    assert (turn.end_time - turn.start_time) / 1e9 == pytest.approx(5.0, abs=0.05)
    assert 4.9 < (tool.end_time - tool.start_time) / 1e9 <= 5.0


async def test_a_denied_call_never_carries_the_reason(telemetry: Telemetry) -> None:
    steps = [ScriptStep(tool_calls=[call("m1", "append_line", line="x")]), ScriptStep(text="Understood.")]
    state = await run_turn(telemetry, steps, verdict="deny", reason="PERSONAL-REASON")
    assert state.calls[0].status is CallStatus.DENIED
    review, tool = telemetry.one("await_review"), telemetry.one("execute_tool append_line")
    assert attrs_of(review)["trioloop.review.denied"] == 1 and attrs_of(review)["trioloop.review.approved"] == 0
    assert attrs_of(tool)["trioloop.call.status"] == "denied"
    assert attrs_of(tool)["trioloop.call.denial_reason"] == "user_declined"
    assert not attrs_of(tool)["trioloop.call.ran"]
    assert tool.start_time == tool.end_time  # it never ran: a span of no length, when it was decided
    assert "PERSONAL-REASON" not in telemetry.exported_text()
    counted = {p.attributes["trioloop.call.status"]: p.value for p in telemetry.metrics()["trioloop.calls"]}
    assert counted == {"denied": 1}


async def test_the_reason_is_recorded_when_content_is_captured(telemetry: Telemetry) -> None:
    steps = [ScriptStep(tool_calls=[call("m1", "append_line", line="x")]), ScriptStep(text="Understood.")]
    await run_turn(telemetry, steps, verdict="deny", reason="PERSONAL-REASON", capture_content=True)
    (denial,) = attrs_of(telemetry.one("await_review"))["trioloop.review.denials"]
    assert "PERSONAL-REASON" in denial


async def test_a_failed_tool_and_an_unknown_tool(telemetry: Telemetry) -> None:
    steps = [ScriptStep(tool_calls=[call("b1", "broken_read"), call("u1", "no_such_tool")]), ScriptStep(text="ok")]
    state = await run_turn(telemetry, steps)
    assert state.outcome is Outcome.COMPLETED
    broken, unknown = telemetry.one("execute_tool broken_read"), telemetry.one("execute_tool no_such_tool")
    assert attrs_of(broken)["trioloop.call.status"] == "failed" and attrs_of(broken)["error.type"] == "tool_error"
    assert broken.status.status_code is StatusCode.ERROR and attrs_of(broken)["trioloop.call.ran"]
    assert attrs_of(unknown)["error.type"] == "unknown_tool" and not attrs_of(unknown)["trioloop.call.ran"]
    assert attrs_of(telemetry.one("invoke_agent"))["trioloop.turn.calls.failed"] == 2
    assert "broken" not in json.dumps([attrs_of(s) for s in telemetry.spans()]).replace("broken_read", "")


async def test_retries_are_events_of_the_request(telemetry: Telemetry, autojump_clock: trio.testing.MockClock) -> None:
    state = await run_turn(telemetry, [ScriptStep(status=529), ScriptStep(text="finally")])
    assert state.outcome is Outcome.COMPLETED and state.budget.retries_used == 1
    chat = telemetry.one("chat")
    assert attrs_of(chat)["trioloop.request.retries"] == 1
    (event,) = chat.events
    assert event.name == "trioloop.retry"
    assert dict(event.attributes or {}) == {
        "trioloop.retry.attempt": 1,
        "trioloop.retry.of": 3,
        "trioloop.retry.wait_s": 0.5,
        "trioloop.retry.cause": "HTTP 529",
    }
    assert attrs_of(telemetry.one("invoke_agent"))["trioloop.turn.retries"] == 1


async def test_a_failed_turn_sets_the_error(telemetry: Telemetry) -> None:
    state = await run_turn(telemetry, [ScriptStep(status=400)])
    assert state.outcome is Outcome.FAILED and state.error is not None
    turn, chat = telemetry.one("invoke_agent"), telemetry.one("chat")
    for span in (turn, chat):
        assert attrs_of(span)["error.type"] == state.error.code.value
        assert span.status.status_code is StatusCode.ERROR
    assert attrs_of(chat)["trioloop.request.outcome"] == "failed"
    (failed,) = [
        p
        for p in telemetry.metrics()["gen_ai.client.operation.duration"]
        if p.attributes["gen_ai.operation.name"] == "chat"
    ]
    assert failed.attributes["error.type"] == state.error.code.value


async def test_a_suspended_turn_ends_its_spans_and_continues_in_a_new_one(telemetry: Telemetry) -> None:
    steps = [ScriptStep(tool_calls=[call("m1", "append_line", line="x")]), ScriptStep(text="Done.")]
    async with ScriptedProvider(steps) as provider:
        session = Session(document="", kind=NOTE, provider=provider, model="scripted-1", tools=TOOLS)
        instrument(session, tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider)
        async with session:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(session.send, "go")
                await wait_for(session, lambda s: session.busy and s.phase is Phase.AWAITING_APPROVAL)
                await session.suspend()
            assert session.suspended  # the session told the observer (on_suspended): no call needed
            (suspended,) = telemetry.named("invoke_agent")
            assert attrs_of(suspended)["trioloop.turn.status"] == "suspended"
            assert "trioloop.turn.outcome" not in attrs_of(suspended)
            assert attrs_of(suspended)["trioloop.turn.calls.pending"] == 1
            assert attrs_of(telemetry.one("await_review"))["trioloop.review.outcome"] == "suspended"

            async with trio.open_nursery() as nursery:
                nursery.start_soon(decide, session)
                final = await session.continue_turn()
                nursery.cancel_scope.cancel()
    assert final.outcome is Outcome.COMPLETED
    first, second = sorted(telemetry.named("invoke_agent"), key=lambda s: s.start_time or 0)
    assert attrs_of(second)["trioloop.turn.resumed"] and attrs_of(second)["trioloop.turn.outcome"] == "completed"
    assert attrs_of(second)["trioloop.turn.id"] == attrs_of(first)["trioloop.turn.id"]
    assert [attrs_of(s)["trioloop.call.status"] for s in telemetry.named("execute_tool")] == ["succeeded"]


class UsageProvider:
    """An in-process provider answering with every kind of token count."""

    async def stream(
        self, request: Any, send: trio.abc.SendChannel[StreamEvent], *, cancel_scope: trio.CancelScope | None = None
    ) -> None:
        usage = Usage(
            input_tokens=100,
            output_tokens=20,
            cache_read_input_tokens=60,
            cache_creation_input_tokens=10,
            reasoning_tokens=5,
        )
        for event in (MessageStart(model="m"), TextDelta(text="hi"), usage, MessageStop(stop_reason="end_turn")):
            await send.send(event)


async def test_cache_and_reasoning_tokens(telemetry: Telemetry) -> None:
    session = Session(document="", kind=NOTE, provider=UsageProvider(), model="m")
    instrument(session, tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider)
    async with session:
        await session.send("hi")
    expected = {
        "gen_ai.usage.input_tokens": 100,
        "gen_ai.usage.output_tokens": 20,
        "gen_ai.usage.cache_read.input_tokens": 60,
        "gen_ai.usage.cache_creation.input_tokens": 10,
        "gen_ai.usage.reasoning.output_tokens": 5,
    }
    for span in (telemetry.one("chat m"), telemetry.one("invoke_agent")):
        assert {k: v for k, v in attrs_of(span).items() if k.startswith("gen_ai.usage.")} == expected
    assert attrs_of(telemetry.one("invoke_agent"))["gen_ai.provider.name"] == "UsageProvider"


async def test_an_edited_approval_is_counted(telemetry: Telemetry) -> None:
    steps = [ScriptStep(tool_calls=[call("m1", "append_line", line="x")]), ScriptStep(text="ok")]
    async with ScriptedProvider(steps) as provider:
        session = Session(document="", kind=NOTE, provider=provider, model="scripted-1", tools=TOOLS)
        instrument(session, tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider)
        async with session, trio.open_nursery() as nursery:
            nursery.start_soon(session.send, "go")
            await wait_for(session, lambda s: s.phase is Phase.AWAITING_APPROVAL)
            assert session.approve("m1", {"line": "EDITED-SECRET"})
    assert session.document == "EDITED-SECRET\n"
    review, tool = attrs_of(telemetry.one("await_review")), attrs_of(telemetry.one("execute_tool"))
    assert (review["trioloop.review.approved"], review["trioloop.review.edited"]) == (1, 1)
    assert tool["trioloop.call.edited_fields"] == 1 and tool["trioloop.call.status"] == "succeeded"
    assert "EDITED-SECRET" not in telemetry.exported_text()


async def test_sampled_out_turns_still_count_in_the_metrics(telemetry: Telemetry) -> None:
    # Metrics do not depend on sampling: a turn whose spans are dropped is measured all the same.
    sampled_out = TracerProvider(sampler=ALWAYS_OFF)
    sampled_out.add_span_processor(SimpleSpanProcessor(telemetry.exporter))
    async with ScriptedProvider(READ_AND_MUTATE) as provider:
        session = Session(document="", kind=NOTE, provider=provider, model="scripted-1", tools=TOOLS)
        instrument(session, tracer_provider=sampled_out, meter_provider=telemetry.meter_provider)
        async with session, trio.open_nursery() as nursery:
            nursery.start_soon(decide, session)
            await session.send("go")
            nursery.cancel_scope.cancel()
    assert telemetry.spans() == ()
    metrics = telemetry.metrics()
    assert sum(p.value for p in metrics["trioloop.calls"]) == 2
    assert [p.count for p in metrics["trioloop.review.duration"]] == [1]
    assert sum(p.count for p in metrics["gen_ai.client.token.usage"]) == 4


async def test_a_journaled_turn_makes_the_same_tree(telemetry: Telemetry) -> None:
    # A journal holds states back until they are durable, so the observer sees fewer of them.
    async with ScriptedProvider(READ_AND_MUTATE) as provider:
        session = await Session.open(
            MemoryJournalStore(), "s1", kind=NOTE, provider=provider, document="", model="scripted-1", tools=TOOLS
        )
        instrument(session, tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider)
        async with session, trio.open_nursery() as nursery:
            nursery.start_soon(decide, session)
            state = await session.send("go")
            nursery.cancel_scope.cancel()
    assert state.outcome is Outcome.COMPLETED
    assert [name for name, _ in telemetry.tree()] == [
        "await_review",
        "chat scripted-1",
        "chat scripted-1",
        "execute_tool append_line",
        "execute_tool read_note",
        "invoke_agent",
    ]
    assert [attrs_of(s)["trioloop.call.status"] for s in telemetry.named("execute_tool")] == ["succeeded"] * 2


SECRETS = ("PROMPT-SECRET", "COMPLETION-SECRET", "INPUT-SECRET", "DOC-SECRET")
CONTENT_STEPS = [
    ScriptStep(
        text="COMPLETION-SECRET", tool_calls=[call("r1", "read_note"), call("m1", "append_line", line="INPUT-SECRET")]
    ),
    ScriptStep(text="COMPLETION-SECRET again."),
]


async def test_no_content_by_default(telemetry: Telemetry) -> None:
    state = await run_turn(telemetry, CONTENT_STEPS, "PROMPT-SECRET", document="DOC-SECRET\n")
    assert state.outcome is Outcome.COMPLETED
    exported = telemetry.exported_text()
    assert [secret for secret in SECRETS if secret in exported] == []


async def test_content_when_captured(telemetry: Telemetry) -> None:
    await run_turn(telemetry, CONTENT_STEPS, "PROMPT-SECRET", document="DOC-SECRET\n", capture_content=True)
    turn = attrs_of(telemetry.one("invoke_agent"))
    assert json.loads(turn["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": "PROMPT-SECRET"}]}
    ]
    assert "COMPLETION-SECRET again." in turn["gen_ai.output.messages"]
    first = min(telemetry.named("chat"), key=lambda s: s.start_time or 0)
    output = json.loads(attrs_of(first)["gen_ai.output.messages"])
    assert output[0]["role"] == "assistant" and output[0]["parts"][0] == {
        "type": "text",
        "content": "COMPLETION-SECRET",
    }
    assert "PROMPT-SECRET" in attrs_of(first)["gen_ai.input.messages"]
    assert "gen_ai.system_instructions" in attrs_of(first)
    mutation = attrs_of(telemetry.one("execute_tool append_line"))
    assert json.loads(mutation["gen_ai.tool.call.arguments"]) == {"line": "INPUT-SECRET"}
    assert mutation["gen_ai.tool.call.result"] == "appended INPUT-SECRET"
    assert "DOC-SECRET" in attrs_of(telemetry.one("execute_tool read_note"))["gen_ai.tool.call.result"]


def _recorded(text: str = "", calls: Sequence[ToolCallBlock] = ()) -> LoopbackResponse:
    response = WireResponse(
        model="fixture-model-1", text=text, tool_calls=tuple(calls), input_tokens=9, output_tokens=3
    )
    if calls:
        response = attrs.evolve(response, stop_reason=StopReason.TOOL_USE)
    return LoopbackResponse(body=ANTHROPIC_WIRE.render_stream(response))


async def test_the_api_key_is_never_exported(telemetry: Telemetry) -> None:
    # A hostile endpoint echoes the key in its text, in a tool's input and in an error body; content is
    # captured; the key reaches no span, event or metric (the provider scrubs what it echoes).
    echo = f"Your key is {CANARY}."
    responses = [
        _recorded(echo, [ToolCallBlock(id="m1", name="append_line", input={"line": CANARY})]),
        LoopbackResponse(body=(FIXTURES / "anthropic" / "text_answer.sse").read_bytes()),
        LoopbackResponse(
            status=401,
            headers=(("content-type", "application/json"),),
            body=ANTHROPIC_WIRE.render_error_body(401, f"invalid x-api-key {CANARY}"),
        ),
    ]
    async with open_loopback_server(replay(responses)) as server:
        provider = AnthropicProvider(api_key=CANARY, base_url=server.url, retry=None)
        session = Session(document="", kind=NOTE, provider=provider, model="fixture-model-1", tools=TOOLS)
        instrument(
            session,
            tracer_provider=telemetry.tracer_provider,
            meter_provider=telemetry.meter_provider,
            capture_content=True,
        )
        async with session, trio.open_nursery() as nursery:
            nursery.start_soon(decide, session)
            first = await session.send(f"use {CANARY[:12]}")
            second = await session.send("and again")
            nursery.cancel_scope.cancel()
    assert first.outcome is Outcome.COMPLETED and second.outcome is Outcome.FAILED
    assert len(server.requests) == 3
    assert len(telemetry.named("invoke_agent")) == 2
    exported = telemetry.exported_text()
    assert "gen_ai.tool.call.arguments" in exported and "Your key is [redacted-key]" in exported  # echoed, scrubbed
    assert CANARY not in exported and CANARY[12:] not in exported


def test_a_turn_left_open_is_ended_as_abandoned_when_another_begins(telemetry: Telemetry) -> None:
    observer = OtelObserver(
        "p", "m", tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider
    )
    registry = create_tool_registry(())
    for turn_id in ("turn-1", "turn-2"):
        submit = Submit(turn_id=turn_id, text="hi", tool_set=registry, now_ms=0)
        observer.on_state(reduce_turn(TurnState.idle(), submit))
    observer.end_open_turn("abandoned")
    first, second = telemetry.named("invoke_agent")
    assert [attrs_of(s)["trioloop.turn.id"] for s in (first, second)] == ["turn-1", "turn-2"]
    assert [attrs_of(s)["trioloop.turn.status"] for s in (first, second)] == ["abandoned", "abandoned"]
    assert [attrs_of(s)["trioloop.request.outcome"] for s in telemetry.named("chat")] == ["abandoned"] * 2


def test_provider_names() -> None:
    assert gen_ai_provider_name(AnthropicProvider("k")) == "anthropic"
    assert gen_ai_provider_name(OpenAIProvider("k")) == "openai"
    assert gen_ai_provider_name(OpenAIResponsesProvider("k")) == "openai"
    assert gen_ai_provider_name(ScriptedProvider()) == "anthropic"
    assert gen_ai_provider_name(ScriptedProvider(wire="openai-responses")) == "openai"

    class OwnProvider:
        pass

    assert gen_ai_provider_name(OwnProvider()) == "OwnProvider"


async def test_a_named_provider_and_an_agent_name(telemetry: Telemetry) -> None:
    async with ScriptedProvider([ScriptStep(text="hi")]) as provider:
        observer = OtelObserver(
            "my.gateway",
            "model-x",
            tracer_provider=telemetry.tracer_provider,
            meter_provider=telemetry.meter_provider,
            agent_name="Notes",
            conversation_id="conv-1",
        )
        async with Session(document="", kind=NOTE, provider=provider, model="m", observers=[observer]) as session:
            await session.send("hi")
    turn = attrs_of(telemetry.one("invoke_agent Notes"))
    assert (turn["gen_ai.provider.name"], turn["gen_ai.request.model"]) == ("my.gateway", "model-x")
    assert (turn["gen_ai.agent.name"], turn["gen_ai.conversation.id"]) == ("Notes", "conv-1")
    assert telemetry.one("chat model-x")
    with pytest.raises(TypeError):
        OtelObserver("my.gateway")


async def test_with_no_provider_configured_nothing_breaks(caplog: pytest.LogCaptureFixture) -> None:
    # The API's global no-op providers: spans are not recorded, the observer stays attached, the turn is the same.
    async with ScriptedProvider(READ_AND_MUTATE) as provider:
        session = Session(document="", kind=NOTE, provider=provider, model="scripted-1", tools=TOOLS)
        instrument(session)
        async with session, trio.open_nursery() as nursery:
            nursery.start_soon(decide, session)
            state = await session.send("go")
            nursery.cancel_scope.cancel()
    assert state.outcome is Outcome.COMPLETED
    assert "failed and was removed" not in caplog.text


def test_histograms_without_bucket_advice_on_an_older_api() -> None:
    class OldMeter:  # opentelemetry-api before 1.30: create_histogram(name, unit, description) only
        def __init__(self) -> None:
            self.made: list[tuple[str, str, str]] = []

        def create_histogram(self, name: str, unit: str = "", description: str = "") -> Any:
            self.made.append((name, unit, description))
            return object()

        def create_counter(self, name: str, unit: str = "", description: str = "") -> Any:
            return object()

    meter = OldMeter()
    otel._Instruments(meter)  # type: ignore[arg-type]
    assert [(name, unit) for name, unit, _ in meter.made] == [
        ("gen_ai.client.token.usage", "{token}"),
        ("gen_ai.client.operation.duration", "s"),
        ("trioloop.review.duration", "s"),
    ]


def test_importing_trioloop_imports_no_opentelemetry() -> None:
    probe = "import sys, trioloop; print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.strip() == "[]"


def test_the_otel_module_names_its_extra_when_the_api_is_missing() -> None:
    probe = "import sys; sys.modules['opentelemetry'] = None; import trioloop.otel"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode != 0
    assert 'pip install "trioloop[otel]"' in done.stderr


def test_the_guides_example_runs() -> None:
    page = (Path(__file__).resolve().parent.parent / "docs" / "howto" / "observability.md").read_text(encoding="utf-8")
    code = page.split("```python\n", 1)[1].split("```", 1)[0]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    names = [json.loads(chunk)["name"] for chunk in done.stdout.replace("}\n{", "}\0{").split("\0") if chunk.strip()]
    assert sorted(names) == ["chat scripted-1", "invoke_agent"]


async def test_a_priced_turn_counts_its_cost_and_a_token_bound_is_named(telemetry: Telemetry) -> None:
    from decimal import Decimal

    from trioloop import ModelPrice

    price = ModelPrice(input_per_mtok=Decimal(2), output_per_mtok=Decimal(10), source="app")
    steps = [ScriptStep(tool_calls=[call("r1", "read_note")], input_tokens=1_000, output_tokens=100)]
    async with ScriptedProvider(steps) as provider:
        session = Session(
            document="",
            kind=NOTE,
            provider=provider,
            model="scripted-1",
            tools=TOOLS,
            limits=TurnLimits(max_output_tokens=50, reserve_output_tokens=40),
            prices={"scripted-1": price},
        )
        instrument(session, tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider)
        async with session:
            state = await session.send("go")
    assert state.bound is not None and state.bound.value == "tokens"
    turn = attrs_of(telemetry.one("invoke_agent"))
    assert turn["trioloop.turn.bound"] == "tokens"
    assert turn["trioloop.turn.cost_usd"] == pytest.approx(0.003)  # 1,000 in at $2 and 100 out at $10 a million
    (counted,) = telemetry.metrics()["trioloop.cost"]
    assert counted.value == pytest.approx(0.003) and counted.attributes["gen_ai.request.model"] == "scripted-1"


# -- who decided each call (issue 50) ----------------------------------------------------------------------


async def rules_turn(telemetry: Telemetry, *, capture_content: bool) -> TurnState:
    """A turn whose calls are decided by an app rule (allow, deny), the person and the read-only policy."""
    rules = [
        ApprovalRule(tool="append_line", verdict="allow", when=(Condition.prefix("/line", "RULE-SECRET"),)),
        ApprovalRule(tool="append_line", verdict="deny", when=(Condition.equals("/line", "no"),), reason="never"),
    ]
    calls = [
        call("a", "append_line", line="RULE-SECRET 1"),
        call("b", "append_line", line="no"),
        call("c", "append_line", line="asked"),
        call("r", "read_note"),
    ]
    async with ScriptedProvider([ScriptStep(tool_calls=calls), ScriptStep(text="Done.")]) as provider:
        session = Session(document="", kind=NOTE, provider=provider, model="scripted-1", tools=TOOLS, rules=rules)
        instrument(
            session,
            tracer_provider=telemetry.tracer_provider,
            meter_provider=telemetry.meter_provider,
            capture_content=capture_content,
        )
        async with session, trio.open_nursery() as nursery:
            nursery.start_soon(decide, session)
            state = await session.send("go")
            nursery.cancel_scope.cancel()
    return state


def deciders(telemetry: Telemetry) -> dict[str, tuple[str, str]]:
    return {
        str(attrs_of(s)["gen_ai.tool.call.id"]): (
            attrs_of(s)["trioloop.call.decided_by"],
            attrs_of(s)["trioloop.call.decider"],
        )
        for s in telemetry.named("execute_tool")
    }


async def test_each_tool_span_says_who_decided_the_call(telemetry: Telemetry) -> None:
    state = await rules_turn(telemetry, capture_content=False)
    denied_call = state.call("b")
    assert denied_call is not None and denied_call.status is CallStatus.DENIED
    assert deciders(telemetry) == {
        "a": ("rule", "approved by app rule 1"),
        "b": ("rule", "denied by app rule 2"),
        "c": ("person", "approved by the person"),
        "r": ("read_only_policy", "approved by the read-only policy"),
    }
    denied = attrs_of(next(s for s in telemetry.named("execute_tool") if attrs_of(s)["gen_ai.tool.call.id"] == "b"))
    assert denied["trioloop.call.denial_reason"] == "rule_denied" and not denied["trioloop.call.ran"]
    # What a rule says of the input is content: without capture the span names the rule, not its conditions.
    assert "RULE-SECRET" not in telemetry.exported_text()


async def test_the_rules_conditions_are_recorded_when_content_is_captured(telemetry: Telemetry) -> None:
    await rules_turn(telemetry, capture_content=True)
    found = deciders(telemetry)
    assert found["a"] == ("rule", "approved by app rule 1: append_line line starts with RULE-SECRET")
    assert found["b"] == ("rule", 'denied by app rule 2: append_line line = "no"')


async def test_a_card_still_open_when_the_turn_stopped_names_the_rule_that_asked_for_it(telemetry: Telemetry) -> None:
    steps = [ScriptStep(tool_calls=[call("m1", "append_line", line="x")]), ScriptStep(text="never")]
    async with ScriptedProvider(steps) as provider:
        ask = [ApprovalRule(tool="append_line", verdict="ask")]
        session = Session(document="", kind=NOTE, provider=provider, model="scripted-1", tools=TOOLS, rules=ask)
        instrument(session, tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider)
        async with session, trio.open_nursery() as nursery:
            nursery.start_soon(session.send, "go")
            await wait_for(session, lambda s: s.phase is Phase.AWAITING_APPROVAL)
            assert session.stop()
    tool = attrs_of(telemetry.one("execute_tool append_line"))
    assert tool["trioloop.call.denial_reason"] == "turn_cancelled"
    assert (tool["trioloop.call.decided_by"], tool["trioloop.call.decider"]) == ("rule", "asked by app rule 1")
