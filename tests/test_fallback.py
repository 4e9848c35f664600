"""Fallback providers over real loopback HTTP on every wire: the hop before the first event (at once, counted in
the turn's one retry budget, shown to the person), never after it, one error naming every provider when none
answers, Stop and the deadline during a hop, a long Retry-After skipped, and who answered on the state, the
journal and the OTel span."""

from __future__ import annotations

import json
import math
import socket
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from trioloop import AnthropicProvider, Session, TurnLimits, define_document_kind
from trioloop.durable.journal import decode_entries
from trioloop.durable.replay import replay_journal
from trioloop.durable.store import MemoryJournalStore
from trioloop.machine.limits import DEFAULT_TURN_LIMITS
from trioloop.machine.reducer import Outcome, Phase, TurnState
from trioloop.machine.tools import ToolOutcome, create_tool_registry
from trioloop.otel import instrument
from trioloop.protocol.events import (
    Aborted,
    MessageStart,
    MessageStop,
    StopReason,
    StreamError,
    StreamEvent,
    TextDelta,
    is_terminal,
)
from trioloop.protocol.messages import Message
from trioloop.protocol.provider import HoldsConnections
from trioloop.protocol.serialization import event_from_json, event_to_json
from trioloop.protocol.tools import ChatRequest
from trioloop.providers.fallback import FallbackProvider, FallbackRoute, all_failed, may_hop
from trioloop.providers.scripted import ScriptedCall, ScriptedProvider, ScriptStep, WireName
from trioloop.runtime.controls import TurnControls
from trioloop.runtime.runner import TurnRequest, Workspace, run_turn
from trioloop.runtime.tools import ToolExecutionContext
from trioloop.tools import function_tool

WIRES: tuple[WireName, ...] = ("anthropic", "openai", "openai-responses")
NOTE = define_document_kind("note", dump=lambda text: text, load=lambda text: text)
NAMES = ("primary", "backup")


@function_tool(effect="read")
def read_note(ctx: ToolExecutionContext[str]) -> ToolOutcome[str]:
    """Read the note."""
    return ToolOutcome.success(ctx.document)


REGISTRY = create_tool_registry([read_note])


def closed_port() -> int:
    """A loopback port nothing listens on: a request to it is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def request(text: str = "go", **limits: Any) -> TurnRequest[str]:
    return TurnRequest(text=text, turn_id="turn-1", model="scripted-1", registry=REGISTRY, limits=TurnLimits(**limits))


async def drive(
    provider: Any,
    *,
    on_state: Callable[[TurnState, TurnControls], None] | None = None,
    **limits: Any,
) -> tuple[TurnState, list[TurnState]]:
    controls = TurnControls()
    states: list[TurnState] = []

    def observe(state: TurnState) -> None:
        states.append(state)
        if on_state is not None:
            on_state(state, controls)

    workspace: Workspace[str] = Workspace(document="", kind=NOTE)
    final = await run_turn(request(**limits), workspace, provider, controls=controls, on_state=observe)
    assert final.is_settled
    return final, states


async def scripted(stack: AsyncExitStack, wire: WireName, steps: Sequence[ScriptStep]) -> ScriptedProvider:
    return await stack.enter_async_context(ScriptedProvider(steps, wire=wire))


def answer_text(state: TurnState) -> str:
    return "".join(str(m) for m in state.turn_messages if m.role == "assistant")


# --- a hop before the first event ------------------------------------------------------------------


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("status", [529, 503, 500, 429])
async def test_an_overloaded_provider_hands_the_request_on_at_once(
    wire: WireName, status: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with AsyncExitStack() as stack:
        primary = await scripted(stack, wire, [ScriptStep(status=status)])
        backup = await scripted(stack, wire, [ScriptStep(text="from the backup")])
        start = trio.current_time()
        final, states = await drive(FallbackProvider([primary, backup], names=NAMES))
    assert trio.current_time() - start < 0.01  # no backoff when another provider is next
    assert final.outcome is Outcome.COMPLETED and "from the backup" in answer_text(final)
    assert final.answered_by == "backup" and final.budget.retries_used == 1
    assert len(primary.requests) == 1 and len(backup.requests) == 1
    assert final.notices == (f"primary: HTTP {status}, retry 1 of 3 in 0 s on the next provider",)
    # The person saw the hop while it happened, as a retry.
    assert any(s.notices and not s.is_settled for s in states)


@pytest.mark.parametrize("wire", WIRES)
async def test_a_connection_reset_or_refused_hands_the_request_on(
    wire: WireName, autojump_clock: trio.testing.MockClock
) -> None:
    async with AsyncExitStack() as stack:
        reset = await scripted(stack, wire, [ScriptStep(text="never seen", disconnect_after_bytes=0)])
        refused = AnthropicProvider("k", base_url=f"http://127.0.0.1:{closed_port()}")
        backup = await scripted(stack, wire, [ScriptStep(text="third time")])
        provider = FallbackProvider([reset, refused, backup], names=["reset", "refused", "backup"])
        final, _ = await drive(provider)
    assert final.outcome is Outcome.COMPLETED and final.answered_by == "backup"
    assert final.budget.retries_used == 2 and "never seen" not in answer_text(final)
    assert [n.split(":")[0] for n in final.notices] == ["reset", "refused"]


@pytest.mark.parametrize("wire", WIRES)
async def test_a_long_retry_after_is_skipped_not_waited_on(
    wire: WireName, autojump_clock: trio.testing.MockClock
) -> None:
    # Alone, such a provider fails the turn at once (the wait outlasts the turn); in a list, the next is asked.
    async with AsyncExitStack() as stack:
        primary = await scripted(stack, wire, [ScriptStep(status=429, retry_after=100_000)])
        backup = await scripted(stack, wire, [ScriptStep(text="no waiting")])
        start = trio.current_time()
        final, _ = await drive(FallbackProvider([primary, backup], names=NAMES))
    assert final.outcome is Outcome.COMPLETED and final.answered_by == "backup"
    assert trio.current_time() - start < 0.01


async def test_later_requests_of_the_turn_start_with_the_provider_that_answered() -> None:
    # The real clock: the read tool runs in a worker thread, which a jumping clock would not wait for.
    async with AsyncExitStack() as stack:
        primary = await scripted(stack, "anthropic", [ScriptStep(status=529), ScriptStep(text="primary again")])
        backup = await scripted(
            stack,
            "openai",
            [ScriptStep(tool_calls=[ScriptedCall(id="r1", name="read_note")]), ScriptStep(text="done here")],
        )
        final, _ = await drive(FallbackProvider([primary, backup], names=NAMES))
    assert final.outcome is Outcome.COMPLETED and final.iteration == 2
    assert "done here" in answer_text(final) and final.answered_by == "backup"
    assert len(primary.requests) == 1 and len(backup.requests) == 2 and final.budget.retries_used == 1


async def test_a_provider_that_fails_for_good_is_not_hopped_over(autojump_clock: trio.testing.MockClock) -> None:
    # A rejected key or a bad request is not what another provider mends: the turn fails with it, named.
    async with AsyncExitStack() as stack:
        primary = await scripted(stack, "anthropic", [ScriptStep(status=401)])
        backup = await scripted(stack, "anthropic", [ScriptStep(text="unused")])
        final, _ = await drive(FallbackProvider([primary, backup], names=NAMES))
    assert final.outcome is Outcome.FAILED and len(backup.requests) == 0 and final.budget.retries_used == 0
    assert final.error is not None and final.error.provider == "primary" and final.error.code == "http_status"


# --- never after the first event --------------------------------------------------------------------


@pytest.mark.parametrize("wire", WIRES)
async def test_a_failure_after_the_first_event_is_not_taken_elsewhere(wire: WireName) -> None:
    async with AsyncExitStack() as stack:
        cut = ScriptStep(text="partial answer " * 300, disconnect_after_bytes=3000)
        primary = await scripted(stack, wire, [cut])
        backup = await scripted(stack, wire, [ScriptStep(text="should not be used")])
        final, states = await drive(FallbackProvider([primary, backup], names=NAMES))
    assert final.outcome is Outcome.FAILED and final.budget.retries_used == 0
    assert len(backup.requests) == 0 and final.answered_by == "primary"
    assert "should not be used" not in json.dumps([answer_text(s) for s in states])


# --- when no provider answers -----------------------------------------------------------------------


@pytest.mark.parametrize("wire", WIRES)
async def test_all_failing_gives_one_error_naming_each(wire: WireName, autojump_clock: trio.testing.MockClock) -> None:
    async with AsyncExitStack() as stack:
        primary = await scripted(stack, wire, [ScriptStep(status=529)] * 9)
        backup = await scripted(stack, wire, [ScriptStep(status=503)] * 9)
        start = trio.current_time()
        final, _ = await drive(FallbackProvider([primary, backup], names=NAMES))
    # primary, backup at once; a new round after the backoff (1 s, the second retry's); primary, backup at once.
    assert final.outcome is Outcome.FAILED and final.budget.retries_used == 3
    assert len(primary.requests) == 2 and len(backup.requests) == 2
    assert trio.current_time() - start == pytest.approx(1.0)
    assert final.notices == (
        "primary: HTTP 529, retry 1 of 3 in 0 s on the next provider",
        "backup: HTTP 503, retry 2 of 3 in 1 s",
        "primary: HTTP 529, retry 3 of 3 in 0 s on the next provider",
    )
    error = final.error
    assert error is not None and error.message == "No AI provider could answer: primary (HTTP 529), backup (HTTP 503)."
    assert error.provider == "" and error.provider_detail is not None
    assert "primary: HTTP 529" in error.provider_detail and "backup: HTTP 503" in error.provider_detail


async def test_providers_the_budget_never_reached_are_named_as_not_tried(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with AsyncExitStack() as stack:
        providers = [await scripted(stack, "anthropic", [ScriptStep(status=529)]) for _ in range(3)]
        final, _ = await drive(FallbackProvider(providers, names=["a", "b", "c"]), max_retries_per_turn=1)
    assert final.outcome is Outcome.FAILED and final.budget.retries_used == 1
    assert final.error is not None
    assert final.error.message == (
        "No AI provider could answer: a (HTTP 529), b (HTTP 529), c (not tried: the retry budget was spent)."
    )


# --- Stop and the deadline during a hop -------------------------------------------------------------


@pytest.mark.parametrize("wire", WIRES)
async def test_stop_during_a_hop_is_honoured_at_once(wire: WireName, autojump_clock: trio.testing.MockClock) -> None:
    def stop_on_hop(state: TurnState, controls: TurnControls) -> None:
        if state.notices and not state.is_settled:
            controls.stop()

    async with AsyncExitStack() as stack:
        primary = await scripted(stack, wire, [ScriptStep(status=529)])
        stalled = await scripted(stack, wire, [ScriptStep(text="slow", stall_after_bytes=0)])
        start = trio.current_time()
        final, _ = await drive(FallbackProvider([primary, stalled], names=NAMES), on_state=stop_on_hop)
    assert final.outcome is Outcome.CANCELLED and trio.current_time() - start < 0.01
    assert final.budget.retries_used == 1


async def test_the_deadline_during_a_hop_is_honoured(autojump_clock: trio.testing.MockClock) -> None:
    async with AsyncExitStack() as stack:
        primary = await scripted(stack, "openai", [ScriptStep(status=503)])
        stalled = await scripted(stack, "openai", [ScriptStep(text="slow", stall_after_bytes=0)])
        start = trio.current_time()
        final, _ = await drive(FallbackProvider([primary, stalled], names=NAMES), turn_deadline_ms=2_000)
    assert final.outcome is Outcome.BOUNDED
    assert trio.current_time() - start == pytest.approx(2.0, abs=0.05)


# --- a single provider is unchanged ----------------------------------------------------------------


async def test_a_single_provider_names_no_one(autojump_clock: trio.testing.MockClock) -> None:
    async with ScriptedProvider([ScriptStep(status=529), ScriptStep(text="ok")]) as provider:
        final, _ = await drive(provider)
    assert final.answered_by == "" and final.notices == ("HTTP 529, retry 1 of 3 in 0.5 s",)


async def test_a_list_of_one_keeps_the_turns_backoff(autojump_clock: trio.testing.MockClock) -> None:
    async with ScriptedProvider([ScriptStep(status=429, retry_after=7), ScriptStep(text="ok")]) as only:
        start = trio.current_time()
        final, _ = await drive(FallbackProvider([only], names=["only"]))
    assert final.outcome is Outcome.COMPLETED and final.answered_by == "only"
    assert trio.current_time() - start >= 7
    assert final.notices == ("only: HTTP 429, retry 1 of 3 in 7 s",)


# --- for all sequences of failures -------------------------------------------------------------------

KINDS = st.sampled_from(["ok", "529", "503", "429", "reset", "401", "late"])


def step_for(kind: str, name: str) -> ScriptStep:
    if kind == "ok":
        return ScriptStep(text=f"answer from {name}")
    if kind == "reset":
        return ScriptStep(text=f"lost from {name}", disconnect_after_bytes=0)
    if kind == "late":  # fails after its first event
        return ScriptStep(text=f"partial from {name} " * 200, disconnect_after_bytes=3000)
    return ScriptStep(status=int(kind), error_body=f"failed {name}".encode())


def expected(kinds: Sequence[str], budget: int) -> tuple[int | None, int]:
    """Which provider answers (None: the turn fails) and how many retries it took: down the list, round again
    while the budget lasts (each provider fails the same way every time)."""
    retries = 0
    while True:
        index = retries % len(kinds)
        if kinds[index] in ("ok", "late"):
            return index, retries
        if kinds[index] == "401" or retries >= budget:
            return None, retries
        retries += 1


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kinds=st.lists(KINDS, min_size=1, max_size=4), budget=st.integers(min_value=1, max_value=4))
def test_the_first_provider_that_answers_within_the_budget_answers(kinds: list[str], budget: int) -> None:
    names = [f"p{i}" for i in range(len(kinds))]

    async def main() -> TurnState:
        async with AsyncExitStack() as stack:
            providers = [
                await scripted(stack, "openai", [step_for(k, n)] * 6) for k, n in zip(kinds, names, strict=True)
            ]
            final, states = await drive(FallbackProvider(providers, names=names), max_retries_per_turn=budget)
        seen = json.dumps([answer_text(s) for s in states])
        answering, _ = expected(kinds, budget)
        answered = {s.answered_by for s in states}
        assert answered <= ({""} if answering is None else {"", names[answering]})
        for index, name in enumerate(names):
            if index != answering:
                assert f"from {name}" not in seen  # no event of a provider that failed reached the state
        return final

    final = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    answering, retries = expected(kinds, budget)
    assert final.budget.retries_used == retries
    if answering is None:
        assert final.outcome is Outcome.FAILED and final.answered_by == ""
        assert final.error is not None
        if retries:  # more than one failure: one error naming each provider tried
            assert final.error.message.startswith("No AI provider could answer: ")
            assert all(name in final.error.message for name in names)
    else:
        assert final.answered_by == names[answering] and final.budget.retries_used == retries
        ok = kinds[answering] == "ok"
        assert final.outcome is (Outcome.COMPLETED if ok else Outcome.FAILED)


@given(
    count=st.integers(min_value=1, max_value=5),
    start=st.integers(min_value=0, max_value=4),
    hints=st.lists(st.one_of(st.none(), st.floats(min_value=0, max_value=1e6)), min_size=1, max_size=12),
)
def test_a_route_tries_each_provider_once_a_round_and_waits_only_between_rounds(
    count: int, start: int, hints: list[float | None]
) -> None:
    route = FallbackRoute.starting(count, start % count)
    tried = [route.current]
    now = 0.0
    for hint in hints:
        route, wait = route.failed(hint, now, backoff=0.5)
        assert 0 <= route.current < count
        if len(tried) < count:
            assert wait == 0 and route.current not in tried  # a hop: at once, to one not tried this round
            tried.append(route.current)
        else:
            assert 0.5 <= wait <= 600  # a new round: the backoff, or the shortest Retry-After left
            tried = [route.current]
        now += wait


# --- the provider on its own --------------------------------------------------------------------------

REQUEST = ChatRequest(model="scripted-1", messages=(Message.user("hi"),))


async def collect(provider: FallbackProvider) -> list[StreamEvent]:
    send, receive = trio.open_memory_channel[StreamEvent](math.inf)
    await provider.stream(REQUEST, send)
    send.close()
    events = [event async for event in receive]
    assert sum(is_terminal(e) for e in events) == 1 and is_terminal(events[-1])
    return events


@pytest.mark.parametrize("wire", WIRES)
async def test_on_its_own_it_asks_each_once_and_names_who_answered(
    wire: WireName, autojump_clock: trio.testing.MockClock
) -> None:
    async with AsyncExitStack() as stack:
        primary = await scripted(stack, wire, [ScriptStep(status=529), ScriptStep(text="retried")])
        backup = await scripted(stack, wire, [ScriptStep(text="hello")])
        events = await collect(FallbackProvider([primary, backup], names=NAMES))
    starts = [e for e in events if isinstance(e, MessageStart)]
    assert [s.provider for s in starts] == ["backup"]
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "hello"
    assert events[-1] == MessageStop(stop_reason=StopReason.END_TURN)
    assert len(primary.requests) == 1  # one attempt: the hop replaces the provider's own retries


async def test_on_its_own_all_failing_is_one_error(autojump_clock: trio.testing.MockClock) -> None:
    async with AsyncExitStack() as stack:
        primary = await scripted(stack, "anthropic", [ScriptStep(status=529)])
        backup = await scripted(stack, "openai", [ScriptStep(status=429)])
        events = await collect(FallbackProvider([primary, backup], names=NAMES))
    (error,) = events
    assert isinstance(error, StreamError) and error.code == "rate_limited"
    assert error.message == "No AI provider could answer: primary (HTTP 529), backup (HTTP 429)."


async def test_on_its_own_a_late_failure_is_not_taken_elsewhere() -> None:
    async with AsyncExitStack() as stack:
        primary = await scripted(stack, "openai", [ScriptStep(text="partial " * 40, disconnect_after_bytes=600)])
        backup = await scripted(stack, "openai", [ScriptStep(text="unused")])
        events = await collect(FallbackProvider([primary, backup], names=NAMES))
    assert isinstance(events[-1], StreamError) and events[-1].provider == "primary"
    assert len(backup.requests) == 0


async def test_on_its_own_a_cancel_scope_aborts() -> None:
    async with AsyncExitStack() as stack:
        stalled = await scripted(stack, "anthropic", [ScriptStep(text="slow", stall_after_bytes=0)])
        send, receive = trio.open_memory_channel[StreamEvent](math.inf)
        scope = trio.CancelScope()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: FallbackProvider([stalled]).stream(REQUEST, send, cancel_scope=scope))
            await trio.sleep(0.2)
            scope.cancel()
        send.close()
        assert [e async for e in receive][-1] == Aborted()


# --- the names, the holds, the events' round trip ----------------------------------------------------


class Held:
    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name

    async def stream(self, request: ChatRequest, send: Any, *, cancel_scope: Any = None) -> None:
        await send.send(MessageStop(stop_reason=StopReason.END_TURN))

    def hold_connections(self) -> Any:
        provider = self

        class _Hold:
            async def __aenter__(self) -> None:
                provider.log.append(f"hold {provider.name}")

            async def __aexit__(self, *exc: object) -> None:
                provider.log.append(f"release {provider.name}")

        return _Hold()


class Plain:
    async def stream(self, request: ChatRequest, send: Any, *, cancel_scope: Any = None) -> None:
        await send.send(MessageStop(stop_reason=StopReason.END_TURN))


async def test_holding_it_holds_every_provider_that_keeps_connections() -> None:
    log: list[str] = []
    provider = FallbackProvider([Held(log, "a"), Plain(), Held(log, "b")])
    assert isinstance(provider, HoldsConnections)
    async with provider.hold_connections():
        assert log == ["hold a", "hold b"]
    assert log == ["hold a", "hold b", "release b", "release a"]
    assert provider.names == ("Held", "Plain", "Held#2")


def test_names_must_match_and_be_unique() -> None:
    with pytest.raises(ValueError, match="at least one"):
        FallbackProvider([])
    with pytest.raises(ValueError, match="entries"):
        FallbackProvider([Held([], "a")], names=["a", "b"])
    with pytest.raises(ValueError, match="unique"):
        FallbackProvider([Held([], "a"), Held([], "b")], names=["x", "x"])
    with pytest.raises(ValueError, match="non-empty"):
        FallbackProvider([Held([], "a")], names=[" "])
    with pytest.raises(TypeError):
        FallbackProvider([object()])  # type: ignore[list-item]


def test_events_round_trip_and_old_ones_read() -> None:
    for event in (
        MessageStart(model="m", provider="backup"),
        StreamError(code="rate_limited", message="slow", provider="primary", retry_after=3.0),
    ):
        assert event_from_json(event_to_json(event)) == event
    # A single provider's events are written as before, and an old journal's read with no provider.
    assert event_to_json(MessageStart(model="m")) == {"type": "message_start", "model": "m"}
    assert event_from_json({"type": "message_start", "model": "m"}) == MessageStart(model="m")
    assert "provider" not in event_to_json(StreamError(code="transport", message="x"))


def test_which_failures_hop() -> None:
    overloaded = StreamError(code="http_status", message="The AI provider had a temporary server error.")
    assert may_hop(StreamError(code="rate_limited", message="slow"))
    assert may_hop(StreamError(code="malformed_stream", message="cut"))
    assert not may_hop(StreamError(code="http_status", message="The AI provider rejected the API key."))
    assert may_hop(overloaded)
    with pytest.raises(ValueError):
        all_failed([])


# --- the journal and the span --------------------------------------------------------------------


async def test_the_journal_and_the_span_name_who_answered(autojump_clock: trio.testing.MockClock) -> None:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    store = MemoryJournalStore()
    async with AsyncExitStack() as stack:
        primary = await scripted(stack, "anthropic", [ScriptStep(status=529)])
        backup = await scripted(stack, "openai", [ScriptStep(text="hi from openai")])
        provider = FallbackProvider([primary, backup], names=NAMES)
        session = await Session.open(
            store, "s1", kind=NOTE, provider=provider, document="", model="scripted-1", tools=[read_note]
        )
        instrument(session, tracer_provider=tracer_provider, meter_provider=meter_provider)
        async with session:
            state = await session.send("go")
    assert state.outcome is Outcome.COMPLETED and state.answered_by == "backup"
    (chat,) = [s for s in exporter.get_finished_spans() if s.name.startswith("chat")]
    attributes = dict(chat.attributes or {})
    assert attributes["trioloop.provider"] == "backup" and attributes["gen_ai.provider.name"] == "openai"
    assert attributes["trioloop.request.retries"] == 1
    (retry,) = chat.events
    assert dict(retry.attributes or {})["trioloop.retry.next_provider"] is True
    (agent,) = [s for s in exporter.get_finished_spans() if s.name.startswith("invoke_agent")]
    assert dict(agent.attributes or {})["gen_ai.provider.name"] == "anthropic"  # the list's first

    stored = await store.read("s1")
    entries = decode_entries(stored)
    kinds = [(e.kind, e.data) for e in entries]
    (retry_entry,) = [data for kind, data in kinds if kind == "retry"]
    assert retry_entry["failure"]["provider"] == "primary" and retry_entry["wait_ms"] == 0
    starts = [ev for kind, data in kinds if kind == "stream" for ev in data["events"] if ev["type"] == "message_start"]
    assert [ev["provider"] for ev in starts] == ["backup"]
    # Replayed up to the turn's end (before the snapshot that closes it), the journal gives the live state back.
    last_snapshot = max(i for i, e in enumerate(entries) if e.kind == "snapshot")
    replayed = replay_journal(entries[:last_snapshot], load_document=str, registry=create_tool_registry([read_note]))
    assert replayed.state is not None
    assert replayed.state.answered_by == "backup" and replayed.state.notices == state.notices
    assert replayed.state.messages == state.messages and replayed.state.budget == state.budget
    whole = replay_journal(entries, load_document=str, registry=create_tool_registry([read_note]))
    assert whole.turn_count == 1


async def test_a_journaled_turn_that_no_provider_answered_replays_to_its_one_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = MemoryJournalStore()
    async with AsyncExitStack() as stack:
        primary = await scripted(stack, "anthropic", [ScriptStep(status=529)] * 4)
        backup = await scripted(stack, "openai-responses", [ScriptStep(status=503)] * 4)
        provider = FallbackProvider([primary, backup], names=NAMES)
        session = await Session.open(
            store, "s2", kind=NOTE, provider=provider, document="", model="scripted-1", tools=[read_note]
        )
        async with session:
            state = await session.send("go")
    assert state.outcome is Outcome.FAILED and state.error is not None
    assert state.error.message.startswith("No AI provider could answer: primary (HTTP 529), backup (HTTP 503)")
    entries = decode_entries(await store.read("s2"))
    last_snapshot = max(i for i, e in enumerate(entries) if e.kind == "snapshot")
    replayed = replay_journal(entries[:last_snapshot], load_document=str, registry=create_tool_registry([read_note]))
    assert replayed.state is not None
    assert replayed.state.error == state.error and replayed.state.notices == state.notices


def test_limits_default_is_three() -> None:
    assert DEFAULT_TURN_LIMITS.max_retries_per_turn == 3
    assert Phase.REQUESTING.value


# --- a list given to a Session -------------------------------------------------------------------------------------


async def test_a_session_given_a_list_tries_it_in_order() -> None:
    # Session(provider=[a, b]) is FallbackProvider([a, b]): the first overloaded, the second answers, and the session
    # keeps both held for its turns.
    async with AsyncExitStack() as stack:
        primary = await scripted(stack, "anthropic", [ScriptStep(status=529)])
        backup = await scripted(stack, "anthropic", [ScriptStep(text="from the second")])
        session = Session(document="", kind=NOTE, provider=[primary, backup], model="scripted-1")
        assert isinstance(session.provider, FallbackProvider) and session.provider.providers == (primary, backup)
        async with session:
            state = await session.send("go")
    assert state.outcome is Outcome.COMPLETED and "from the second" in answer_text(state)
    assert state.answered_by == session.provider.names[1]
    with pytest.raises(TypeError):
        Session(document="", kind=NOTE, provider=[object()], model="scripted-1")  # type: ignore[list-item]
