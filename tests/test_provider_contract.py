"""Contract tests over both wires: the fixture corpus, byte splits, parity, and the real transport path.

Every fixture exists once per provider under the same name and describes the same logical response,
so both must map to the same events, whether fed whole, split anywhere, or served over loopback.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

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
    TextDelta,
    ToolCallBlock,
    ToolCallComplete,
    ToolCallInputDelta,
    ToolCallStart,
    Usage,
    is_terminal,
)
from trioloop.providers import AnthropicProvider, OpenAIProvider
from trioloop.providers._loopback import LoopbackResponse, open_loopback_server, replay
from trioloop.providers.anthropic import AnthropicStreamMapper, render_anthropic_stream
from trioloop.providers.base import Messages, StreamMapper, WireResponse, map_chunks, unreadable_call
from trioloop.providers.openai import OpenAIStreamMapper, render_openai_stream
from trioloop.providers.transport import HttpChatProvider

FIXTURES = Path(__file__).parent / "fixtures" / "providers"
WIRES = ("anthropic", "openai")
NAMES = sorted(p.stem for p in (FIXTURES / "anthropic").glob("*.sse"))
MODEL = "fixture-model-1"
KEY = "test-key-0123456789"


def fixture(wire: str, name: str) -> bytes:
    return (FIXTURES / wire / f"{name}.sse").read_bytes()


def mapper(wire: str) -> StreamMapper:
    return AnthropicStreamMapper() if wire == "anthropic" else OpenAIStreamMapper()


def provider(wire: str, base_url: str, **options: Any) -> HttpChatProvider:
    if wire == "anthropic":
        return AnthropicProvider(KEY, base_url=base_url, **options)
    return OpenAIProvider(KEY, base_url=base_url + "/v1", **options)


REQUEST = ChatRequest(model=MODEL, system="You are terse.", messages=(Message.user("hello"),))


async def collect(
    chat: HttpChatProvider, request: ChatRequest = REQUEST, *, cancel_scope: trio.CancelScope | None = None
) -> list[StreamEvent]:
    send, receive = trio.open_memory_channel[StreamEvent](math.inf)
    await chat.stream(request, send, cancel_scope=cancel_scope)
    send.close()
    async with receive:
        events = [event async for event in receive]
    assert sum(is_terminal(e) for e in events) == 1 and is_terminal(events[-1]), events
    return events


def _notice(message: str, detail: str | None) -> StreamError:
    return StreamError(code=ProtocolErrorCode.MALFORMED_STREAM, message=message, provider_detail=detail, terminal=False)


START = MessageStart(model=MODEL)
INCOMPLETE = StreamError(code=ProtocolErrorCode.MALFORMED_STREAM, message=Messages.INCOMPLETE_STREAM)
CALL_A = "toolu_01A09q90qw90lq917835lq9"
CALL_B = "toolu_01B7hXq3a2FhLqd3yZ9vK2Pm"

EXPECTED: dict[str, list[StreamEvent]] = {
    "text_answer": [
        START,
        TextDelta(text="Hello! "),
        TextDelta(text="Grüße 👋"),
        TextDelta(text=" — 你好."),
        Usage(input_tokens=12, output_tokens=9),
        MessageStop(stop_reason=StopReason.END_TURN),
    ],
    "parallel_tools": [
        START,
        TextDelta(text="Let me check "),
        TextDelta(text="both."),
        ToolCallStart(id=CALL_A, name="get_entity"),
        ToolCallInputDelta(id=CALL_A, partial_json='{"kind": "elements",'),
        ToolCallInputDelta(id=CALL_A, partial_json=' "id": "web-app"}'),
        ToolCallComplete(id=CALL_A, name="get_entity", input={"kind": "elements", "id": "web-app"}),
        ToolCallStart(id=CALL_B, name="list_entities"),
        ToolCallInputDelta(id=CALL_B, partial_json='{"kind": '),
        ToolCallInputDelta(id=CALL_B, partial_json='"data_flows", "limit": 5}'),
        ToolCallComplete(id=CALL_B, name="list_entities", input={"kind": "data_flows", "limit": 5}),
        Usage(input_tokens=120, output_tokens=45),
        MessageStop(stop_reason=StopReason.TOOL_USE),
    ],
    "truncated": [START, TextDelta(text="The answer is"), INCOMPLETE],
    # TGI before 2.1.1 and llama.cpp forks close after the finish without [DONE]; both official SDKs accept it.
    "eof_after_finish": [
        START,
        TextDelta(text="Done."),
        Usage(input_tokens=12, output_tokens=3),
        MessageStop(stop_reason=StopReason.END_TURN),
    ],
    "invalid_json_frame": [
        START,
        TextDelta(text="Before. "),
        _notice(Messages.UNDECODABLE_EVENT, "{not valid json"),
        TextDelta(text="After."),
        Usage(input_tokens=12, output_tokens=4),
        MessageStop(stop_reason=StopReason.END_TURN),
    ],
    "unknown_event": [
        START,
        TextDelta(text="Still fine."),
        Usage(input_tokens=12, output_tokens=7),
        MessageStop(stop_reason=StopReason.END_TURN),
    ],
    "bad_tool_arguments": [
        START,
        ToolCallStart(id="toolu_bad", name="get_entity"),
        ToolCallInputDelta(id="toolu_bad", partial_json='{"kind": "elements"'),
        ToolCallInputDelta(id="toolu_bad", partial_json=', "id": }'),
        unreadable_call("toolu_bad", "get_entity", "not valid JSON: Expecting value: line 1 column 28 (char 27)"),
        ToolCallStart(id="toolu_good", name="list_entities"),
        ToolCallInputDelta(id="toolu_good", partial_json='{"kind": "threats"}'),
        ToolCallComplete(id="toolu_good", name="list_entities", input={"kind": "threats"}),
        Usage(input_tokens=80, output_tokens=30),
        MessageStop(stop_reason=StopReason.TOOL_USE),
    ],
    "nan_arguments": [
        START,
        ToolCallStart(id="toolu_nan", name="list_entities"),
        ToolCallInputDelta(id="toolu_nan", partial_json='{"limit": NaN}'),
        unreadable_call("toolu_nan", "list_entities", "not valid JSON: non-standard JSON constant NaN"),
        ToolCallStart(id="toolu_inf", name="list_entities"),
        ToolCallInputDelta(id="toolu_inf", partial_json='{"limit": -Infinity}'),
        unreadable_call("toolu_inf", "list_entities", "not valid JSON: non-standard JSON constant -Infinity"),
        Usage(input_tokens=80, output_tokens=20),
        MessageStop(stop_reason=StopReason.TOOL_USE),
    ],
    "orphan_fragment": [
        START,
        _notice(Messages.ORPHAN_ARGUMENTS, '{"id": "db"}'),
        TextDelta(text="No call here."),
        Usage(input_tokens=12, output_tokens=5),
        MessageStop(stop_reason=StopReason.END_TURN),
    ],
    "rate_limit_in_stream": [
        START,
        TextDelta(text="Partial"),
        StreamError(
            code=ProtocolErrorCode.RATE_LIMITED,
            message=Messages.STREAM_RATE_LIMITED,
            provider_detail="Rate limit reached for key [redacted-key] in organization org-123. Please retry later.",
        ),
    ],
    # Before any content the overload is a temporary server error, retried like HTTP 529 (nothing was shown).
    "overloaded_in_stream": [
        StreamError(code=ProtocolErrorCode.HTTP_STATUS, message=Messages.SERVER_ERROR, provider_detail="Overloaded"),
    ],
    "refusal": [
        START,
        TextDelta(text="I can't help with that."),
        Usage(input_tokens=30, output_tokens=8),
        MessageStop(stop_reason=StopReason.REFUSAL),
    ],
    "max_tokens": [
        START,
        TextDelta(text="This answer was cut"),
        Usage(input_tokens=30, output_tokens=5),
        MessageStop(stop_reason=StopReason.MAX_TOKENS),
    ],
    "unknown_stop_reason": [
        START,
        TextDelta(text="Pausing here."),
        Usage(input_tokens=30, output_tokens=4),
        MessageStop(stop_reason=StopReason.OTHER),
    ],
    "tool_without_arguments": [
        START,
        ToolCallStart(id="toolu_summary", name="summarize_model"),
        ToolCallComplete(id="toolu_summary", name="summarize_model", input={}),
        Usage(input_tokens=50, output_tokens=11),
        MessageStop(stop_reason=StopReason.TOOL_USE),
    ],
    "unfinished_call": [
        START,
        ToolCallStart(id="toolu_open", name="delete_element"),
        ToolCallInputDelta(id="toolu_open", partial_json='{"id": "db"}'),
        Usage(input_tokens=50, output_tokens=11),
        unreadable_call("toolu_open", "delete_element", Messages.UNFINISHED_CALL),
        MessageStop(stop_reason=StopReason.OTHER),
    ],
    "keepalive_crlf": [
        START,
        TextDelta(text="Line endings "),
        TextDelta(text="do not matter."),
        Usage(input_tokens=12, output_tokens=6),
        MessageStop(stop_reason=StopReason.END_TURN),
    ],
}


def test_corpus_pairs_by_name_and_every_fixture_has_an_expectation() -> None:
    assert sorted(p.stem for p in (FIXTURES / "openai").glob("*.sse")) == NAMES
    assert set(NAMES) == set(EXPECTED)


@pytest.mark.parametrize("name", NAMES)
def test_identical_logical_responses_give_identical_events(name: str) -> None:
    anthropic = map_chunks(mapper("anthropic"), [fixture("anthropic", name)])
    openai = map_chunks(mapper("openai"), [fixture("openai", name)])
    assert anthropic == openai == EXPECTED[name]


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("name", NAMES)
def test_split_at_every_offset(wire: str, name: str) -> None:
    raw = fixture(wire, name)
    for offset in range(len(raw) + 1):
        assert map_chunks(mapper(wire), [raw[:offset], raw[offset:]]) == EXPECTED[name], offset


@settings(max_examples=60, deadline=None)
@given(
    wire=st.sampled_from(WIRES),
    name=st.sampled_from(NAMES),
    cuts=st.lists(st.floats(0, 1), max_size=40),
)
def test_split_anywhere_many_times(wire: str, name: str, cuts: list[float]) -> None:
    raw = fixture(wire, name)
    points = sorted(int(c * len(raw)) for c in cuts)
    chunks = [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True)]
    assert map_chunks(mapper(wire), chunks) == EXPECTED[name]


def test_one_byte_at_a_time() -> None:
    for wire in WIRES:
        raw = fixture(wire, "parallel_tools")
        assert map_chunks(mapper(wire), [raw[i : i + 1] for i in range(len(raw))]) == EXPECTED["parallel_tools"]


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("name", NAMES)
async def test_the_real_transport_gives_the_same_events(
    wire: str, name: str, autojump_clock: trio.testing.MockClock
) -> None:
    response = LoopbackResponse(body=fixture(wire, name), chunk_size=97, delay_between_chunks=0.01)
    async with open_loopback_server(replay([response], fallback=response)) as server:
        events = await collect(provider(wire, server.url))
    assert events == EXPECTED[name]
    # Only an error before any event is retried; everything else in the corpus fails after an event.
    assert len(server.requests) == (3 if name == "overloaded_in_stream" else 1)


@pytest.mark.parametrize("wire", WIRES)
async def test_byte_at_a_time_over_the_socket(wire: str, autojump_clock: trio.testing.MockClock) -> None:
    response = LoopbackResponse(body=fixture(wire, "text_answer"), chunk_size=1)
    async with open_loopback_server(replay([response])) as server:
        assert await collect(provider(wire, server.url)) == EXPECTED["text_answer"]


@pytest.mark.parametrize("wire", WIRES)
async def test_cancelling_the_providers_scope_mid_stream_ends_with_aborted(
    wire: str, autojump_clock: trio.testing.MockClock
) -> None:
    raw = fixture(wire, "parallel_tools")
    stall_at = raw.index(b"\n\n", raw.index(b"both.")) + 2
    response = LoopbackResponse(body=raw, stall_after_bytes=stall_at)
    scope = trio.CancelScope()
    send, receive = trio.open_memory_channel[StreamEvent](math.inf)
    seen: list[StreamEvent] = []
    async with open_loopback_server(replay([response])) as server:
        chat = provider(wire, server.url)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: chat.stream(REQUEST, send, cancel_scope=scope))
            async for event in receive:
                seen.append(event)
                if event == TextDelta(text="both."):
                    scope.cancel()
                if is_terminal(event):
                    break
    assert seen == [START, TextDelta(text="Let me check "), TextDelta(text="both."), Aborted()]
    assert receive.statistics().current_buffer_used == 0


@pytest.mark.parametrize("wire", WIRES)
async def test_an_already_cancelled_scope_aborts_before_any_request(
    wire: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_loopback_server(replay([])) as server:
        scope = trio.CancelScope()
        scope.cancel()
        assert await collect(provider(wire, server.url), cancel_scope=scope) == [Aborted()]
    assert server.requests == []


@pytest.mark.parametrize("wire", WIRES)
async def test_an_outer_cancellation_propagates_without_aborted(
    wire: str, autojump_clock: trio.testing.MockClock
) -> None:
    raw = fixture(wire, "text_answer")
    response = LoopbackResponse(body=raw, stall_after_bytes=raw.index(b"\n\n", raw.index(b"Hello")) + 2)
    send, receive = trio.open_memory_channel[StreamEvent](math.inf)
    async with open_loopback_server(replay([response])) as server:
        with trio.move_on_after(5) as outer:
            await provider(wire, server.url).stream(REQUEST, send, cancel_scope=trio.CancelScope())
    assert outer.cancelled_caught
    send.close()
    events = [event async for event in receive]
    assert events == [START, TextDelta(text="Hello! ")]


# --- any logical response, rendered by each wire, maps back to the same events ---------------------

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)
_calls = st.lists(
    st.builds(
        ToolCallBlock,
        id=st.from_regex(r"[a-z0-9_]{1,8}", fullmatch=True),
        name=st.from_regex(r"[a-z_]{1,10}", fullmatch=True),
        input=st.dictionaries(st.text(max_size=4), _json_values, max_size=3),
    ),
    max_size=3,
    unique_by=lambda c: c.id,
)
#: Any logical response every wire can express (tests/test_provider_responses.py uses it for the third).
RESPONSES = st.builds(
    WireResponse,
    model=st.text(max_size=10),
    text=st.text(max_size=60),
    tool_calls=_calls.map(tuple),
    # Chat Completions has neither a stop sequence nor a paused server turn of its own.
    stop_reason=st.sampled_from([r for r in StopReason if r not in (StopReason.STOP_SEQUENCE, StopReason.PAUSE_TURN)]),
    input_tokens=st.integers(0, 10**6),
    output_tokens=st.integers(0, 10**6),
    text_piece=st.integers(1, 20),
    arguments_piece=st.integers(1, 20),
    error_type=st.sampled_from([None, None, "rate_limit_error", "overloaded_error"]),
    error_message=st.text(max_size=20),
)


@settings(max_examples=120, deadline=None)
@given(response=RESPONSES, cut=st.floats(0, 1))
def test_rendered_responses_map_identically_on_both_wires(response: WireResponse, cut: float) -> None:
    results = []
    for wire, render in (("anthropic", render_anthropic_stream), ("openai", render_openai_stream)):
        raw = render(response)
        at = int(cut * len(raw))
        results.append(map_chunks(mapper(wire), [raw[:at], raw[at:]]))
    anthropic, openai = results
    assert anthropic == openai
    if response.error_type is not None and not response.text:
        assert len(anthropic) == 1  # an error before any content: nothing shown, so it may be retried
    else:
        assert anthropic[0] == MessageStart(model=response.model)
    assert "".join(e.text for e in anthropic if isinstance(e, TextDelta)) == response.text
    if response.error_type is not None:
        assert isinstance(anthropic[-1], StreamError) and anthropic[-1].terminal
        return
    completed = [e for e in anthropic if isinstance(e, ToolCallComplete)]
    assert [(c.id, c.name, c.input) for c in completed] == [(c.id, c.name, c.input) for c in response.tool_calls]
    stop = response.stop_reason
    if completed and stop in (StopReason.END_TURN, StopReason.OTHER):
        stop = StopReason.TOOL_USE  # a completed call is a call whatever the finish reason says
    assert anthropic[-2:] == [
        Usage(input_tokens=response.input_tokens, output_tokens=response.output_tokens),
        MessageStop(stop_reason=stop),
    ]
