"""ScriptedProvider: a deterministic model speaking a real wire format over a real loopback socket."""

from __future__ import annotations

import math

import pytest
import trio
import trio.testing

from trioloop.protocol import (
    Aborted,
    ChatRequest,
    Message,
    MessageStart,
    MessageStop,
    ProtocolErrorCode,
    StopReason,
    StreamError,
    StreamEvent,
    TextBlock,
    TextDelta,
    ToolCallBlock,
    ToolCallComplete,
    ToolDefinition,
    ToolResultBlock,
    Usage,
    is_terminal,
)
from trioloop.providers import ChatProvider, ScriptedCall, ScriptedProvider, ScriptStep
from trioloop.providers.base import Messages
from trioloop.providers.scripted import EXHAUSTED_TEXT, SCRIPTED_API_KEY, WireName

WIRES: tuple[WireName, ...] = ("anthropic", "openai")
TOOL = ToolDefinition(name="get_entity", description="Read one entity.", json_schema={"type": "object"})
REQUEST = ChatRequest(model="scripted-1", system="sys", messages=(Message.user("hi"),), tools=(TOOL,))


async def collect(
    provider: ChatProvider, request: ChatRequest = REQUEST, cancel_scope: trio.CancelScope | None = None
) -> list[StreamEvent]:
    send, receive = trio.open_memory_channel[StreamEvent](math.inf)
    await provider.stream(request, send, cancel_scope=cancel_scope)
    send.close()
    events = [event async for event in receive]
    assert sum(is_terminal(e) for e in events) == 1 and is_terminal(events[-1]), events
    return events


def without_usage(events: list[StreamEvent]) -> list[StreamEvent]:
    return [e for e in events if not isinstance(e, Usage)]


@pytest.mark.parametrize("wire", WIRES)
async def test_text_and_tool_calls(wire: WireName, autojump_clock: trio.testing.MockClock) -> None:
    calls = (ScriptedCall(id="c1", name="get_entity", input={"id": "web"}), ScriptedCall(id="c2", name="get_entity"))
    async with ScriptedProvider([ScriptStep(text="Checking ✓", tool_calls=calls, chunk_size=5)], wire=wire) as provider:
        events = await collect(provider)
    assert events[0] == MessageStart(model="scripted-1")
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Checking ✓"
    assert [e for e in events if isinstance(e, ToolCallComplete)] == [
        ToolCallComplete(id="c1", name="get_entity", input={"id": "web"}),
        ToolCallComplete(id="c2", name="get_entity", input={}),
    ]
    assert isinstance(events[-2], Usage)
    assert events[-1] == MessageStop(stop_reason=StopReason.TOOL_USE)


async def test_both_wires_give_the_same_events_apart_from_token_counts(autojump_clock: trio.testing.MockClock) -> None:
    step = ScriptStep(text="a" * 40, tool_calls=(ScriptedCall(id="x", name="get_entity", input={"k": [1, 2]}),))
    results = []
    for wire in WIRES:
        async with ScriptedProvider([step], wire=wire) as provider:
            results.append(without_usage(await collect(provider)))
    assert results[0] == results[1]


@pytest.mark.parametrize("wire", WIRES)
async def test_requests_are_recorded_for_inspection(wire: WireName, autojump_clock: trio.testing.MockClock) -> None:
    steps = [
        ScriptStep(tool_calls=(ScriptedCall(id="c1", name="get_entity", input={"id": "a"}),)),
        ScriptStep(text="ok"),
    ]
    async with ScriptedProvider(steps, wire=wire) as provider:
        await collect(provider)
        follow_up = (
            *REQUEST.messages,
            Message(role="assistant", content=(ToolCallBlock(id="c1", name="get_entity", input={"id": "a"}),)),
            Message(role="user", content=(ToolResultBlock(call_id="c1", content="entity a"),)),
        )
        events = await collect(provider, ChatRequest(model="scripted-1", messages=follow_up, tools=(TOOL,)))
        assert len(provider.requests) == 2
        second = provider.requests[1]
        header = "x-api-key" if wire == "anthropic" else "authorization"
        assert SCRIPTED_API_KEY in (provider.server.requests[1].header(header) or "")
    assert events[-1] == MessageStop(stop_reason=StopReason.END_TURN)
    assert isinstance(second, dict)
    if wire == "anthropic":
        assert second["messages"][-1] == {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "c1",
                    "content": "entity a",
                    "is_error": False,
                    "cache_control": {"type": "ephemeral"},  # the conversation prefix is a cache breakpoint
                }
            ],
        }
    else:
        assert second["messages"][-1] == {"role": "tool", "tool_call_id": "c1", "content": "entity a"}


@pytest.mark.parametrize("wire", WIRES)
async def test_exhausted_script_answers_briefly(wire: WireName, autojump_clock: trio.testing.MockClock) -> None:
    async with ScriptedProvider([], wire=wire) as provider:
        events = await collect(provider)
        assert provider.steps_left == 0
    assert [e for e in events if isinstance(e, TextDelta)] == [TextDelta(text=EXHAUSTED_TEXT)]
    assert events[-1] == MessageStop(stop_reason=StopReason.END_TURN)


@pytest.mark.parametrize("wire", WIRES)
async def test_http_errors_then_success_go_through_the_real_retry(
    wire: WireName, autojump_clock: trio.testing.MockClock
) -> None:
    steps = [ScriptStep(status=429, retry_after=2), ScriptStep(status=503), ScriptStep(text="finally")]
    async with ScriptedProvider(steps, wire=wire) as provider:
        start = trio.current_time()
        events = await collect(provider)
        assert trio.current_time() - start == pytest.approx(3.0)  # max(2, 0.5) then 1.0
        assert len(provider.requests) == 3
    assert TextDelta(text="finally") in events


@pytest.mark.parametrize("wire", WIRES)
async def test_error_body_and_non_retriable_status(wire: WireName, autojump_clock: trio.testing.MockClock) -> None:
    steps = [ScriptStep(status=400, error_body=b'{"error": "no"}'), ScriptStep(text="unused")]
    async with ScriptedProvider(steps, wire=wire) as provider:
        [error] = await collect(provider)
        assert provider.steps_left == 1
    assert isinstance(error, StreamError) and error.message == Messages.REQUEST_REJECTED


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize(("kind", "code"), [("rate_limit_error", "rate_limited"), ("overloaded_error", "http_status")])
async def test_in_stream_errors(wire: WireName, kind: str, code: str, autojump_clock: trio.testing.MockClock) -> None:
    async with ScriptedProvider([ScriptStep(text="part", in_stream_error=kind)], wire=wire) as provider:
        events = await collect(provider)
    assert events[:2] == [MessageStart(model="scripted-1"), TextDelta(text="part")]
    assert isinstance(events[-1], StreamError) and events[-1].code == ProtocolErrorCode(code)


@pytest.mark.parametrize("wire", WIRES)
async def test_stall_hits_the_read_gap_timeout(wire: WireName, autojump_clock: trio.testing.MockClock) -> None:
    step = ScriptStep(text="slow answer", stall_after_bytes=400, delay_between_chunks=1.0, chunk_size=50)
    async with ScriptedProvider([step], wire=wire, read_timeout=10.0) as provider:
        events = await collect(provider)
    assert isinstance(events[-1], StreamError) and events[-1].message == Messages.READ_TIMEOUT


@pytest.mark.parametrize("wire", WIRES)
async def test_disconnect_is_a_network_failure(wire: WireName, autojump_clock: trio.testing.MockClock) -> None:
    async with ScriptedProvider([ScriptStep(text="cut off", disconnect_after_bytes=500)], wire=wire) as provider:
        events = await collect(provider)
    assert isinstance(events[-1], StreamError) and events[-1].message == Messages.NETWORK


async def test_cancel_scope_gives_aborted(autojump_clock: trio.testing.MockClock) -> None:
    async with ScriptedProvider([ScriptStep(text="never finishes", stall_after_bytes=300)]) as provider:
        scope = trio.CancelScope()
        scope.deadline = trio.current_time() + 5
        events = await collect(provider, cancel_scope=scope)
    assert events[-1] == Aborted()


async def test_a_model_the_table_does_not_know_is_still_sent_with_tools(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with ScriptedProvider([ScriptStep(text="x"), ScriptStep(text="y")], model="my-model") as provider:
        other = await collect(provider, ChatRequest(model="other", messages=(Message.user("q"),), tools=(TOOL,)))
        events = await collect(provider, ChatRequest(model="my-model", messages=(Message.user("q"),), tools=(TOOL,)))
        assert [r["model"] for r in provider.requests] == ["other", "my-model"]
    assert other[-1] == MessageStop(stop_reason=StopReason.END_TURN)
    assert events[0] == MessageStart(model="my-model")


async def test_must_be_entered_before_use() -> None:
    provider = ScriptedProvider([])
    with pytest.raises(RuntimeError):
        await collect(provider)
    with pytest.raises(RuntimeError):
        _ = provider.server
    with pytest.raises(ValueError):
        ScriptedProvider([], wire="gemini")  # type: ignore[arg-type]


async def test_history_with_text_and_results_is_accepted(autojump_clock: trio.testing.MockClock) -> None:
    history = (
        Message.user("a"),
        Message(role="assistant", content=(TextBlock(text="b"), ToolCallBlock(id="t", name="get_entity", input={}))),
        Message(role="user", content=(ToolResultBlock(call_id="t", content="r", is_error=True), TextBlock(text="c"))),
    )
    async with ScriptedProvider([ScriptStep(text="fine")], wire="openai") as provider:
        events = await collect(provider, ChatRequest(model="scripted-1", messages=history, tools=(TOOL,)))
    assert TextDelta(text="fine") in events
