"""Anthropic's server-side blocks, tool input given whole, blocks inside ``message_start``, and sending them back.

The fixtures in ``fixtures/providers/anthropic_server`` follow the event sequences Anthropic documents for web
search, code execution, programmatic tool calling, the MCP connector, compaction and paused turns. Each is read
over real loopback HTTP through ``AnthropicProvider``; the turn-level tests drive ``run_turn`` against the same
server and read what the next request sent back.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_machine import run, submit
from test_provider_contract import collect
from torture_support import check_stream

from trioloop.machine.reducer import CallStatus, Outcome, Phase
from trioloop.machine.tool_input import tool_field
from trioloop.machine.tools import ToolOutcome, create_tool_registry
from trioloop.protocol import (
    ChatRequest,
    Message,
    MessageStart,
    MessageStop,
    ProviderBlock,
    ProviderBlockComplete,
    RedactedThinkingBlock,
    StopReason,
    StreamError,
    StreamEvent,
    TextBlock,
    TextDelta,
    ThinkingBlock,
    ThinkingComplete,
    ThinkingDelta,
    ToolCallBlock,
    ToolCallComplete,
    ToolCallInputDelta,
    ToolCallStart,
    ToolResultBlock,
    Usage,
    assert_tool_pairing,
)
from trioloop.providers import AnthropicProvider
from trioloop.providers._anthropic_stream import CALLER_MARKER, CONTAINER_MARKER
from trioloop.providers._loopback import LoopbackResponse, open_loopback_server, replay
from trioloop.providers.anthropic import (
    ANTHROPIC_WIRE,
    SERVER_INPUT_UNREADABLE,
    AnthropicRequestOptions,
    AnthropicStreamMapper,
    build_anthropic_body,
    render_anthropic_stream,
)
from trioloop.providers.base import Messages, WireResponse, map_chunks
from trioloop.providers.sse import SseFrame
from trioloop.runtime.runner import TurnRequest, Workspace, run_turn
from trioloop.runtime.tools import ToolExecutionContext, define_executable_tool
from trioloop.threatmodel import THREAT_MODEL, load_thf

SERVER = Path(__file__).parent / "fixtures" / "providers" / "anthropic_server"
PAYMENT = Path(__file__).resolve().parent.parent / "examples" / "payment.thf"
KEY = "sk-ant-server-canary-0123456789abcdef"
MODEL = "claude-sonnet-4-5-20250929"
NO_CACHE = AnthropicRequestOptions(prompt_caching=False)
START = MessageStart(model=MODEL)

SEARCH_ID = "srvtoolu_01WYG3ziw53XMcoyKL4XcZmE"
SECOND_SEARCH = "srvtoolu_01Hq7pTnqv5XNEaQw1J2KmRk"
CODE_ID = "srvtoolu_01B3C5rqVmGU7z2Ypa9JvAm5"
EDIT_ID = "srvtoolu_01D5nL6tUQ2R8ZxWJgYb4hLs"
PROG_CODE = "srvtoolu_01Prog7xUqN3dH1aR5cY2vEw"
PROG_CALL = "toolu_01Prog9mV4kTz2QwB8nL6sHfX"
MCP_ID = "mcptoolu_014Q35RayjACSWkSj4X2yov1"


def body(name: str) -> bytes:
    return (SERVER / f"{name}.sse").read_bytes()


def started_blocks(name: str) -> dict[int, dict[str, Any]]:
    """Each ``content_block_start``'s block by index, read straight from the fixture (not by the mapper)."""
    blocks: dict[int, dict[str, Any]] = {}
    for line in body(name).decode().splitlines():
        if line.startswith("data: "):
            payload = json.loads(line[len("data: ") :])
            if payload["type"] == "content_block_start":
                blocks[payload["index"]] = payload["content_block"]
    return blocks


def compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def server_block(value: dict[str, Any]) -> ProviderBlockComplete:
    return ProviderBlockComplete(block=ProviderBlock(wire="anthropic", kind=value["type"], data=compact(value)))


def with_input(name: str, index: int, value: Any) -> ProviderBlockComplete:
    """The fixture's block at ``index`` with the input its deltas streamed (the SDK's accumulation)."""
    return server_block({**started_blocks(name)[index], "input": value})


def as_started(name: str, index: int) -> ProviderBlockComplete:
    return server_block(started_blocks(name)[index])


def usage(output: int, input_tokens: int = 2100) -> Usage:
    return Usage(input_tokens=input_tokens, output_tokens=output)


def weather(call_id: str, city: str) -> ToolCallComplete:
    return ToolCallComplete(id=call_id, name="get_weather", input={"city": city})


CONTAINER = "container_011CUJj8xtzGqYcnK7Cf2Zwp"
CALLER = {"type": "code_execution_20250825", "tool_id": "srvtoolu_01Prog7xUqN3dH1aR5cY2vEw"}


def container_marker() -> ProviderBlockComplete:
    data = json.dumps({"id": CONTAINER, "expires_at": "2026-12-04T20:17:00.000000Z"}, separators=(",", ":"))
    return ProviderBlockComplete(block=ProviderBlock(wire="anthropic", kind=CONTAINER_MARKER, data=data))


def caller_marker(call_id: str) -> ProviderBlockComplete:
    data = json.dumps({"tool_use_id": call_id, "caller": CALLER}, separators=(",", ":"))
    return ProviderBlockComplete(block=ProviderBlock(wire="anthropic", kind=CALLER_MARKER, data=data))


EXPECTED: dict[str, list[StreamEvent]] = {
    # Text around a search; the citations_delta on block 3 is read without a notice (citations are not kept).
    "web_search": [
        START,
        TextDelta(text="I'll search for "),
        TextDelta(text="the latest release."),
        with_input("web_search", 1, {"query": "trio latest release"}),
        as_started("web_search", 2),
        TextDelta(text="The latest release is Trio 0.30.0"),
        TextDelta(text=", released in April 2025."),
        usage(510),
        MessageStop(stop_reason=StopReason.END_TURN),
    ],
    "pause_turn": [
        START,
        TextDelta(text="Searching several sources."),
        with_input("pause_turn", 1, {"query": "trio structured concurrency"}),
        as_started("pause_turn", 2),
        with_input("pause_turn", 3, {"query": "trio nurseries"}),
        usage(120),
        MessageStop(stop_reason=StopReason.PAUSE_TURN),
    ],
    "code_execution": [
        START,
        TextDelta(text="I'll compute that in the sandbox."),
        with_input("code_execution", 1, {"command": "python3 -c 'print(sum(range(10)))'"}),
        as_started("code_execution", 2),
        with_input("code_execution", 3, {"command": "create", "path": "/tmp/sum.py", "file_text": "print(45)\n"}),
        as_started("code_execution", 4),
        TextDelta(text="The sum is 45."),
        usage(230),
        container_marker(),
        MessageStop(stop_reason=StopReason.END_TURN),
    ],
    # A tool called from code execution: its input comes whole in content_block_start, with a caller.
    "programmatic_tool_call": [
        START,
        TextDelta(text="I'll fetch the weather from code."),
        with_input("programmatic_tool_call", 1, {"code": "w = await get_weather(city='Paris')\nprint(w)"}),
        ToolCallStart(id=PROG_CALL, name="get_weather"),
        weather(PROG_CALL, "Paris"),
        caller_marker(PROG_CALL),
        usage(95),
        container_marker(),
        MessageStop(stop_reason=StopReason.TOOL_USE),
    ],
    # Two blocks already in message_start (indices 0 and 1), then a streamed call at index 2.
    "tool_use_in_message_start": [
        START,
        TextDelta(text="Checking two cities."),
        ToolCallStart(id="toolu_01MsgStartOslo", name="get_weather"),
        weather("toolu_01MsgStartOslo", "Oslo"),
        ToolCallStart(id="toolu_01StreamedRome", name="get_weather"),
        ToolCallInputDelta(id="toolu_01StreamedRome", partial_json='{"city": '),
        ToolCallInputDelta(id="toolu_01StreamedRome", partial_json='"Rome"}'),
        weather("toolu_01StreamedRome", "Rome"),
        usage(60),
        MessageStop(stop_reason=StopReason.TOOL_USE),
    ],
    "mcp_connector": [
        START,
        TextDelta(text="Asking the MCP server."),
        with_input("mcp_connector", 1, {"message": "hello"}),
        as_started("mcp_connector", 2),
        TextDelta(text="The server echoed hello."),
        usage(40),
        MessageStop(stop_reason=StopReason.END_TURN),
    ],
    # The summary arrives whole in one compaction_delta, with opaque state to send back verbatim.
    "compaction": [
        START,
        server_block(
            {
                "type": "compaction",
                "content": "<summary>The user is building a threat model of a payment service.</summary>",
                "encrypted_content": "Ev0BCkYIBRgCKkDe3kF2",
            }
        ),
        TextDelta(text="Continuing from the summary."),
        usage(1000, input_tokens=23000),
        MessageStop(stop_reason=StopReason.END_TURN),
    ],
    "model_context_window_exceeded": [
        START,
        TextDelta(text="The list continues with"),
        usage(4096),
        MessageStop(stop_reason=StopReason.MAX_TOKENS),
    ],
    "final_answer": [
        START,
        TextDelta(text="Trio's nurseries "),
        TextDelta(text="own their tasks."),
        usage(12),
        MessageStop(stop_reason=StopReason.END_TURN),
    ],
}
NAMES = sorted(EXPECTED)


def test_every_fixture_has_an_expectation() -> None:
    assert sorted(p.stem for p in SERVER.glob("*.sse")) == NAMES


async def over_loopback(raw: bytes, **options: Any) -> tuple[list[StreamEvent], Any]:
    response = LoopbackResponse(body=raw, chunk_size=53)
    async with open_loopback_server(replay([response], fallback=response)) as server:
        events = await collect(AnthropicProvider(KEY, base_url=server.url, retry=None, **options))
    return events, server


@pytest.mark.parametrize("name", NAMES)
async def test_each_fixture_over_real_loopback_http(name: str, autojump_clock: trio.testing.MockClock) -> None:
    events, server = await over_loopback(body(name))
    assert events == EXPECTED[name]
    assert len(server.requests) == 1
    # Server blocks are kept, never turned into a call of ours.
    server_ids = {SEARCH_ID, SECOND_SEARCH, CODE_ID, EDIT_ID, PROG_CODE, MCP_ID}
    assert not {e.id for e in events if isinstance(e, ToolCallStart | ToolCallComplete)} & server_ids


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(NAMES), cuts=st.lists(st.floats(0, 1), max_size=30))
def test_any_split_of_the_bytes_gives_the_same_events(name: str, cuts: list[float]) -> None:
    raw = body(name)
    points = sorted(int(c * len(raw)) for c in cuts)
    chunks = [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True)]
    assert map_chunks(AnthropicStreamMapper(), chunks) == EXPECTED[name]


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_damaged_server_streams_keep_the_stream_contract(data: st.DataObject) -> None:
    """Flipped, inserted, deleted, duplicated or cut bytes: the stream contract holds (``check_stream``)."""
    raw = bytearray(body(data.draw(st.sampled_from(NAMES))))
    for _ in range(data.draw(st.integers(1, 5))):
        if not raw:
            break
        at = data.draw(st.integers(0, len(raw) - 1))
        op = data.draw(st.sampled_from(["flip", "insert", "delete", "duplicate", "truncate"]))
        if op == "flip":
            raw[at] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "insert":
            raw[at:at] = data.draw(st.sampled_from([b"\n\n", b'"', b"}", b"1e400", b'"index":0,', b"NaN"]))
        elif op == "delete":
            del raw[at : at + data.draw(st.integers(1, 60))]
        elif op == "duplicate":
            end = min(len(raw), at + data.draw(st.integers(1, 400)))
            raw[end:end] = raw[at:end]
        else:
            del raw[at + 1 :]
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=6)))
    chunks = [bytes(raw[a:b]) for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    events = check_stream(ANTHROPIC_WIRE, chunks)
    ours = {"text", "tool_use", "thinking", "redacted_thinking", "tool_result", "image", "document", "search_result"}
    assert not any(isinstance(e, ProviderBlockComplete) and e.block.kind in ours for e in events)


# -- frames, fed one by one ------------------------------------------------------------------------


def frame(event: str, **data: Any) -> SseFrame:
    return SseFrame(event=event, data=json.dumps({"type": event, **data}))


def start_frame(content: Any = None, model: str = "m") -> SseFrame:
    return frame("message_start", message={"model": model, "content": [] if content is None else content})


def block(index: int, content_block: Any) -> SseFrame:
    return frame("content_block_start", index=index, content_block=content_block)


def delta(index: int, **value: Any) -> SseFrame:
    return frame("content_block_delta", index=index, delta=value)


def stop(index: int) -> SseFrame:
    return frame("content_block_stop", index=index)


def ending(reason: str = "end_turn") -> list[SseFrame]:
    return [frame("message_delta", delta={"stop_reason": reason}), frame("message_stop")]


def feed(*frames: SseFrame) -> list[StreamEvent]:
    mapper = AnthropicStreamMapper()
    return [event for f in frames for event in mapper.feed(f)] + mapper.finish()


def notices(events: list[StreamEvent]) -> list[StreamError]:
    return [e for e in events if isinstance(e, StreamError) and not e.terminal]


def completed(events: list[StreamEvent]) -> list[ToolCallComplete]:
    return [e for e in events if isinstance(e, ToolCallComplete)]


def provider_blocks(events: list[StreamEvent]) -> list[dict[str, Any]]:
    return [json.loads(e.block.data) for e in events if isinstance(e, ProviderBlockComplete)]


def call_with(start_input: Any, *fragments: str, raw_start: str | None = None) -> ToolCallComplete:
    """The one call a tool_use block makes from its start's ``input`` (``...`` leaves the key out)."""
    content: dict[str, Any] = {"type": "tool_use", "id": "t1", "name": "get_weather"}
    if start_input is not ...:
        content["input"] = start_input
    opening = block(0, content)
    if raw_start is not None:
        opening = SseFrame(event="content_block_start", data=raw_start)
    frames = [start_frame(), opening, *(delta(0, type="input_json_delta", partial_json=f) for f in fragments)]
    [call] = completed(feed(*frames, stop(0), *ending("tool_use")))
    return call


# -- 1: a tool_use whose input arrives whole in content_block_start --------------------------------


def test_the_starts_input_is_the_calls_input_unless_a_delta_replaces_it() -> None:
    assert call_with({"city": "Paris"}) == weather("t1", "Paris")
    # Empty deltas (the API sends one before the first real fragment) leave the start's input standing.
    assert call_with({"city": "Paris"}, "", "") == weather("t1", "Paris")
    # Any non-empty delta: the input is the parse of the concatenated deltas, as the SDK reads it.
    assert call_with({"city": "Paris"}, '{"city":', ' "Rome"}') == weather("t1", "Rome")
    assert call_with({}, '{"city": "Rome"}') == weather("t1", "Rome")
    # Deltas that do not parse make the call unreadable, whatever the start carried: it is never run.
    bad = call_with({"city": "Paris"}, '{"city": ')
    assert bad.input == {} and (bad.input_error or "").startswith(Messages.BAD_TOOL_ARGUMENTS)


def test_no_input_or_null_is_a_call_without_arguments() -> None:
    assert call_with(...).input == {}
    assert call_with(None).input == {}
    assert call_with({}).input_error is None


@pytest.mark.parametrize("value", [["Paris"], "Paris", 3, True, '{"city": "Paris"}'])
def test_a_non_object_start_input_is_kept_as_the_sdk_keeps_it_and_never_runs(value: Any) -> None:
    # The SDK builds the block without validation and keeps such an input as it is; so do we, so the
    # tool's input check refuses it and the model is told, instead of the call running with {}.
    call = call_with(value)
    assert call.input == value and call.input_error is None
    state = run([submit(), MessageStart(model="m"), ToolCallComplete(id="t1", name="update", input=value)])
    [record] = state.calls
    assert record.status is CallStatus.FAILED and record.is_error and record.prepared is None


def test_a_start_input_without_a_strict_json_reading_is_unreadable() -> None:
    duplicate = json.dumps(
        {"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": "t1", "name": "n"}}
    ).replace('"name": "n"}', '"name": "n", "input": {"city": "Paris", "city": "Rome"}}')
    for raw in (duplicate, duplicate.replace('"Rome"', "1e400").replace('"Paris"', "1")):
        call = call_with(..., raw_start=raw)
        assert call.input == {} and (call.input_error or "").startswith(Messages.BAD_TOOL_ARGUMENTS), raw
    # A delta still replaces such a start, as it replaces any.
    assert call_with(..., '{"city": "Oslo"}', raw_start=duplicate).input == {"city": "Oslo"}


def test_a_tool_use_with_a_caller_keeps_only_what_a_call_needs() -> None:
    caller = {"type": "code_execution_20250825", "tool_id": PROG_CODE}
    content = {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}, "caller": caller}
    events = feed(start_frame(), block(0, content), stop(0), *ending("tool_use"))
    assert completed(events) == [weather("t1", "Paris")] and not notices(events)


# -- 2: blocks already in message_start ------------------------------------------------------------

_MESSAGE_BLOCKS = [
    {"type": "text", "text": "Hello."},
    {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Oslo"}},
    {"type": "thinking", "thinking": "Let me see.", "signature": "sig=="},
    {"type": "redacted_thinking", "data": "opaque"},
    {"type": "server_tool_use", "id": SEARCH_ID, "name": "web_search", "input": {"query": "q"}},
    {"type": "web_search_tool_result", "tool_use_id": SEARCH_ID, "content": []},
    {"type": "a_future_block", "payload": [1, 2]},
]


@settings(max_examples=80, deadline=None)
@given(blocks=st.lists(st.sampled_from(_MESSAGE_BLOCKS), max_size=6))
def test_message_start_blocks_map_as_if_each_streamed_whole_before_the_rest(blocks: list[dict[str, Any]]) -> None:
    blocks = [{**b, "id": f"t{i}"} if b["type"] == "tool_use" else b for i, b in enumerate(blocks)]
    after = [block(len(blocks), {"type": "text", "text": ""}), delta(len(blocks), type="text_delta", text="after")]
    inline = feed(start_frame(blocks), *after, stop(len(blocks)), *ending())
    streamed = feed(
        start_frame(),
        *(f for i, b in enumerate(blocks) for f in (block(i, b), stop(i))),
        *after,
        stop(len(blocks)),
        *ending(),
    )
    assert inline == streamed
    assert inline[0] == MessageStart(model="m") and TextDelta(text="after") in inline
    assert not notices(inline)


def test_message_start_blocks_come_in_order_right_after_message_start() -> None:
    events = feed(start_frame(_MESSAGE_BLOCKS), *ending("tool_use"))
    assert events == [
        MessageStart(model="m"),
        TextDelta(text="Hello."),
        ToolCallStart(id="t1", name="get_weather"),
        weather("t1", "Oslo"),
        ThinkingDelta(text="Let me see."),
        ThinkingComplete(block=ThinkingBlock(thinking="Let me see.", signature="sig==")),
        ThinkingComplete(block=RedactedThinkingBlock(data="opaque")),
        server_block(_MESSAGE_BLOCKS[4]),
        server_block(_MESSAGE_BLOCKS[5]),
        server_block(_MESSAGE_BLOCKS[6]),
        MessageStop(stop_reason=StopReason.TOOL_USE),
    ]


def test_hostile_message_start_content_is_total() -> None:
    # Not a list: one notice, the message itself still read.
    events = feed(start_frame("x", model="m2"), *ending())
    assert events[0] == MessageStart(model="m2") and len(notices(events)) == 1
    assert events[-1] == MessageStop(stop_reason=StopReason.END_TURN)
    # Bad entries are notices, one each; the good ones around them are kept.
    bad = [7, {"type": "tool_use", "id": "t", "name": ""}, {"no": "type"}, {"type": "text", "text": "ok"}]
    events = feed(start_frame(bad), *ending())
    assert [e for e in events if isinstance(e, TextDelta)] == [TextDelta(text="ok")] and len(notices(events)) == 3
    # A second message_start never adds its blocks again.
    again = feed(start_frame([{"type": "text", "text": "once"}]), start_frame([{"type": "text", "text": "twice"}]))
    assert [e.text for e in again if isinstance(e, TextDelta)] == ["once"]


def test_later_indices_continue_after_message_start_blocks_and_hostile_indices_are_total() -> None:
    oslo = {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Oslo"}}
    events = feed(
        start_frame([oslo]),
        # A delta for the message_start call's index: it is complete already, so this is an orphan.
        delta(0, type="input_json_delta", partial_json='{"city": "Rome"}'),
        # A delta for an index nothing started: an orphan too.
        delta(9, type="input_json_delta", partial_json="{}"),
        block(1, {"type": "tool_use", "id": "t2", "name": "get_weather", "input": {}}),
        # The same index started twice while open: a notice, the first block stands.
        block(1, {"type": "server_tool_use", "id": "s", "name": "web_search", "input": {}}),
        delta(1, type="input_json_delta", partial_json='{"city": "Bergen"}'),
        stop(1),
        stop(7),  # a stop for an index never opened: nothing
        *ending("tool_use"),
    )
    assert completed(events) == [weather("t1", "Oslo"), weather("t2", "Bergen")]
    assert [n.message for n in notices(events)] == [Messages.ORPHAN_ARGUMENTS] * 2 + [Messages.UNDECODABLE_EVENT]
    assert not provider_blocks(events)


def test_a_huge_message_start_list_is_read_whole_and_fast() -> None:
    many = [{"type": "text", "text": "x"}] * 20_000 + [{"type": "fallback", "to": {"model": "m"}}] * 20_000
    began = time.perf_counter()
    events = feed(start_frame(many), *ending())
    assert time.perf_counter() - began < 10  # no quadratic walk: a fraction of a second here
    assert sum(isinstance(e, TextDelta) for e in events) == 20_000
    assert sum(isinstance(e, ProviderBlockComplete) for e in events) == 20_000


# -- 3: server blocks, accumulated as the SDK accumulates them --------------------------------------


def test_server_tool_use_input_that_does_not_parse_keeps_the_block_and_says_so() -> None:
    started = {"type": "server_tool_use", "id": SEARCH_ID, "name": "web_search", "input": {}}
    cut = delta(0, type="input_json_delta", partial_json='{"q": ')
    events = feed(start_frame(), block(0, started), cut, stop(0), *ending())
    assert provider_blocks(events) == [started] and events[-1] == MessageStop(stop_reason=StopReason.END_TURN)
    [warning] = notices(events)
    assert warning.message == SERVER_INPUT_UNREADABLE and warning.provider_detail == '{"q": '
    # Duplicate keys are refused the same way: two readers must not disagree on what the server ran.
    events = feed(
        start_frame(), block(0, started), delta(0, type="input_json_delta", partial_json='{"q": 1, "q": 2}'), stop(0)
    )
    assert provider_blocks(events) == [started] and notices(events)[0].message == SERVER_INPUT_UNREADABLE


def test_a_server_block_without_input_stays_as_the_server_sent_it() -> None:
    documented = {"type": "server_tool_use", "id": SEARCH_ID, "name": "web_search"}  # the docs' example shape
    assert provider_blocks(feed(start_frame(), block(0, documented), stop(0), *ending())) == [documented]
    streamed = feed(
        start_frame(), block(0, documented), delta(0, type="input_json_delta", partial_json='{"query": "q"}'), stop(0)
    )
    assert provider_blocks(streamed) == [{**documented, "input": {"query": "q"}}]


def test_an_unfinished_server_block_is_kept_before_the_stop() -> None:
    started = {"type": "web_fetch_tool_result", "tool_use_id": "srvtoolu_x", "content": {"type": "web_fetch_result"}}
    events = feed(start_frame(), block(0, started), *ending())
    assert events[-2:] == [server_block(started), MessageStop(stop_reason=StopReason.END_TURN)]


def test_unknown_block_types_are_kept_unless_a_delta_changed_them() -> None:
    fallback = {"type": "fallback", "from": {"model": "a"}, "to": {"model": "b"}}
    future = {"type": "a_future_block", "payload": {"k": [1]}}
    events = feed(
        start_frame(),
        block(0, fallback),
        stop(0),
        block(1, future),
        stop(1),
        block(2, {"type": "another_future_block"}),
        delta(2, type="future_delta", payload="x"),
        delta(2, type="input_json_delta", partial_json="{}"),
        stop(2),
        *ending(),
    )
    # Kept as the SDK keeps it, unless a delta we cannot apply made our copy stale: then left out, quietly,
    # as the same response from a wire with no such block would be.
    assert provider_blocks(events) == [fallback, future]
    assert not notices(events)


def test_request_only_blocks_in_a_response_are_notices_never_kept() -> None:
    # Kept, a tool_result in the assistant message would make every later request of the session fail.
    forged = [{"type": "tool_result", "tool_use_id": "t1", "content": "x"}, {"type": "image", "source": {}}]
    events = feed(start_frame(forged), block(2, {"type": "document", "source": {}}), stop(2), *ending())
    assert not provider_blocks(events) and len(notices(events)) == 3
    assert events[-1] == MessageStop(stop_reason=StopReason.END_TURN)


def test_deltas_that_do_not_fit_their_block() -> None:
    started = {"type": "web_search_tool_result", "tool_use_id": SEARCH_ID, "content": []}
    events = feed(
        start_frame(),
        block(0, started),
        delta(0, type="text_delta", text="not here"),  # text into a server block: a notice, not answer text
        delta(0, type="input_json_delta", partial_json="{}"),  # a result has no input: a notice
        delta(0, type="a_future_delta", x=1),  # a delta kind newer than the mapper: ignored
        stop(0),
        block(1, {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}),
        delta(1, type="thinking_delta", thinking="no"),
        stop(1),
        *ending("tool_use"),
    )
    assert provider_blocks(events) == [started]
    assert not [e for e in events if isinstance(e, TextDelta | ThinkingDelta)]
    assert [n.message for n in notices(events)] == [Messages.UNDECODABLE_EVENT] * 3
    assert completed(events) == [ToolCallComplete(id="t1", name="get_weather", input={})]


def test_citations_are_read_quietly_and_the_text_streams() -> None:
    citation = {"type": "char_location", "cited_text": "c", "document_index": 0}
    events = feed(
        start_frame(),
        block(0, {"type": "text", "text": "", "citations": []}),
        delta(0, type="citations_delta", citation=citation),
        delta(0, type="text_delta", text="cited"),
        delta(5, type="citations_delta", citation=citation),  # even for an index nothing started
        stop(0),
        *ending(),
    )
    assert events == [
        MessageStart(model="m"),
        TextDelta(text="cited"),
        MessageStop(stop_reason=StopReason.END_TURN),
    ]


def test_one_signature_per_thinking_block_in_any_order() -> None:
    def thinking(*deltas: SseFrame, signature: str = "") -> ThinkingBlock:
        started = {"type": "thinking", "thinking": "", "signature": signature}
        [done] = [
            e for e in feed(start_frame(), block(0, started), *deltas, stop(0)) if isinstance(e, ThinkingComplete)
        ]
        assert isinstance(done.block, ThinkingBlock)
        return done.block

    text, sig = delta(0, type="thinking_delta", thinking="hm"), delta(0, type="signature_delta", signature="EqQB")
    assert thinking(text, sig) == thinking(sig, text) == ThinkingBlock(thinking="hm", signature="EqQB")
    # The documented stream has one signature_delta; a later one replaces, as in the SDK (never a concatenation).
    assert thinking(text, sig, signature="stale").signature == "EqQB"
    assert thinking(sig, delta(0, type="signature_delta", signature="Fr5C")).signature == "Fr5C"


def test_a_compaction_delta_replaces_the_summary() -> None:
    events = feed(
        start_frame(),
        block(0, {"type": "compaction", "content": None}),
        delta(0, type="compaction_delta", content="summary"),
        stop(0),
        block(1, {"type": "compaction", "content": None, "encrypted_content": "old"}),
        delta(1, type="compaction_delta", content=None, encrypted_content="new"),
        stop(1),
        block(2, {"type": "compaction", "content": None}),
        delta(2, type="compaction_delta", content=5),
        stop(2),
        *ending(),
    )
    assert provider_blocks(events) == [
        {"type": "compaction", "content": "summary"},
        {"type": "compaction", "content": None, "encrypted_content": "new"},
        {"type": "compaction", "content": None},
    ]
    assert [n.message for n in notices(events)] == [Messages.UNDECODABLE_EVENT]


# -- 5: stop reasons -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("pause_turn", StopReason.PAUSE_TURN),
        ("compaction", StopReason.PAUSE_TURN),
        ("model_context_window_exceeded", StopReason.MAX_TOKENS),
        ("refusal", StopReason.REFUSAL),
        ("a_future_reason", StopReason.OTHER),
    ],
)
def test_stop_reasons(reason: str, expected: StopReason) -> None:
    text = [block(0, {"type": "text", "text": "t"}), stop(0)]
    assert feed(start_frame(), *text, *ending(reason))[-1] == MessageStop(stop_reason=expected)


def test_rendered_stop_reasons_keep_their_own_names() -> None:
    for reason, name in ((StopReason.MAX_TOKENS, "max_tokens"), (StopReason.PAUSE_TURN, "pause_turn")):
        raw = render_anthropic_stream(WireResponse(model="m", text="t", stop_reason=reason))
        assert f'"stop_reason":"{name}"'.encode() in raw


# -- 4: sending back --------------------------------------------------------------------------------

SEARCH = {"type": "server_tool_use", "id": SEARCH_ID, "name": "web_search", "input": {"query": "q"}}
RESULT = {"type": "web_search_tool_result", "tool_use_id": SEARCH_ID, "content": []}


def anthropic(value: dict[str, Any]) -> ProviderBlock:
    return ProviderBlock(wire="anthropic", kind=value["type"], data=compact(value))


def test_blocks_go_back_verbatim_in_place_and_foreign_ones_stay_out() -> None:
    history = (
        Message.user("search"),
        Message(
            role="assistant",
            content=(
                ThinkingBlock(thinking="from another wire", source="reasoning_content"),
                ThinkingBlock(thinking="mine", signature="sig=="),
                TextBlock(text="Searching."),
                anthropic(SEARCH),
                ProviderBlock(wire="openai-responses", kind="reasoning", data='{"type":"reasoning"}'),
                anthropic(RESULT),
                ProviderBlock(wire="anthropic", kind="broken", data="[1, 2]"),
                ToolCallBlock(id="t1", name="get_weather", input={"city": "Oslo"}),
            ),
        ),
        Message(role="assistant", content=(ThinkingBlock(thinking="only foreign", source="reasoning"),)),
        Message(role="user", content=(ToolResultBlock(call_id="t1", content="sunny"),)),
    )
    sent = build_anthropic_body(ChatRequest(model="m", messages=history), NO_CACHE)["messages"]
    assert sent[1]["content"] == [
        {"type": "thinking", "thinking": "mine", "signature": "sig=="},
        {"type": "text", "text": "Searching."},
        SEARCH,
        RESULT,
        {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Oslo"}},
    ]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]  # the emptied message is dropped


def cache_marks(*blocks: ProviderBlock | TextBlock | ThinkingBlock) -> list[str]:
    history = (Message.user("go"), Message(role="assistant", content=blocks))
    sent = build_anthropic_body(ChatRequest(model="m", messages=history))["messages"]
    return [b["type"] for m in sent for b in m["content"] if "cache_control" in b]


def test_cache_breakpoints_land_only_on_blocks_that_can_carry_one() -> None:
    fallback = anthropic({"type": "fallback", "to": {"model": "b"}})
    future = anthropic({"type": "a_future_block"})
    thinking = ThinkingBlock(thinking="t", signature="s")
    assert cache_marks(TextBlock(text="a"), anthropic(RESULT), fallback, future, thinking) == ["web_search_tool_result"]
    assert cache_marks(anthropic({"type": "compaction", "content": "s"}), fallback) == ["compaction"]
    assert cache_marks(fallback, future, thinking) == []
    # A server's own cache_control never goes back: breakpoints are ours to place (four at most).
    own = anthropic({**SEARCH, "cache_control": {"type": "ephemeral"}})
    assert cache_marks(own, fallback, TextBlock(text="end")) == ["text"]


# -- the turn: a paused server turn continues; a call whose input came whole runs with it ------------


@attrs.frozen(kw_only=True)
class City:
    city: str = tool_field(min_length=1)


def weather_registry(seen: list[str]) -> Any:
    def run_tool(value: City, ctx: ToolExecutionContext) -> ToolOutcome:
        seen.append(value.city)
        return ToolOutcome.success(f"{value.city}: sunny")

    tool = define_executable_tool(
        name="get_weather",
        description="Weather for a city.",
        effect="read",
        destructive=False,
        input_type=City,
        run=run_tool,
        summarize=lambda value: f"weather in {value.city}",
    )
    return create_tool_registry([tool])


async def drive_turn(bodies: list[bytes], seen: list[str]) -> tuple[Any, list[Any]]:
    responses = [LoopbackResponse(body=raw, chunk_size=89) for raw in bodies]
    async with open_loopback_server(replay(responses)) as server:
        provider = AnthropicProvider(KEY, base_url=server.url, retry=None, options=NO_CACHE)
        request = TurnRequest(text="go", turn_id="turn-1", model=MODEL, registry=weather_registry(seen))
        final = await run_turn(request, Workspace(document=load_thf(PAYMENT), kind=THREAT_MODEL), provider)
    assert final.is_settled and assert_tool_pairing(final.messages) == ()
    return final, [r.json() for r in server.requests]


async def test_a_paused_server_turn_goes_back_verbatim_and_continues(autojump_clock: trio.testing.MockClock) -> None:
    final, requests = await drive_turn([body("pause_turn"), body("final_answer")], [])
    assert final.outcome is Outcome.COMPLETED and len(requests) == 2
    blocks = started_blocks("pause_turn")
    paused = requests[1]["messages"]
    assert paused[-1] == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Searching several sources."},
            {**blocks[1], "input": {"query": "trio structured concurrency"}},
            blocks[2],
            {**blocks[3], "input": {"query": "trio nurseries"}},
        ],
    }
    assert paused[:-1] == requests[0]["messages"]  # the request before it, plus the paused answer, nothing else
    assert final.messages[-1].content[-1] == TextBlock(text="Trio's nurseries own their tasks.")


async def test_a_call_whose_input_came_in_its_start_runs_with_that_input(
    autojump_clock: trio.testing.MockClock,
) -> None:
    seen: list[str] = []
    final, requests = await drive_turn([body("programmatic_tool_call"), body("final_answer")], seen)
    assert seen == ["Paris"]  # never {}
    assert final.outcome is Outcome.COMPLETED and final.phase is Phase.SETTLED
    [record] = final.calls
    assert record.id == PROG_CALL and record.status is CallStatus.SUCCEEDED
    sent = requests[1]["messages"]
    blocks = started_blocks("programmatic_tool_call")
    # The block goes back with its caller, and the request names the container the code waits in.
    assert sent[-2]["content"] == [
        {"type": "text", "text": "I'll fetch the weather from code."},
        {**blocks[1], "input": {"code": "w = await get_weather(city='Paris')\nprint(w)"}},
        {"type": "tool_use", "id": PROG_CALL, "name": "get_weather", "input": {"city": "Paris"}, "caller": CALLER},
    ]
    assert requests[1]["container"] == CONTAINER and "container" not in requests[0]
    [result] = sent[-1]["content"]
    assert result["type"] == "tool_result" and result["tool_use_id"] == PROG_CALL and not result["is_error"]


async def test_calls_in_message_start_run_too(autojump_clock: trio.testing.MockClock) -> None:
    seen: list[str] = []
    final, _ = await drive_turn([body("tool_use_in_message_start"), body("final_answer")], seen)
    assert sorted(seen) == ["Oslo", "Rome"] and final.outcome is Outcome.COMPLETED


async def test_a_tool_use_without_an_id_is_recorded_and_answered(autojump_clock: trio.testing.MockClock) -> None:
    # Issue 40: a tool_use with an empty id used to be dropped (a notice, no record, the model never told).
    frames = [
        start_frame(model=MODEL),
        block(0, {"type": "text", "text": "Checking."}),
        stop(0),
        block(1, {"type": "tool_use", "id": "", "name": "get_weather", "input": {}}),
        delta(1, type="input_json_delta", partial_json='{"city": '),
        delta(1, type="input_json_delta", partial_json='"Paris"}'),
        stop(1),
        *ending("tool_use"),
    ]
    raw = "".join(f"event: {f.event}\ndata: {f.data}\n\n" for f in frames).encode()
    seen: list[str] = []
    final, requests = await drive_turn([raw, body("final_answer")], seen)
    assert seen == ["Paris"] and final.outcome is Outcome.COMPLETED
    [record] = final.calls
    assert record.id == "toolu_1" and record.status is CallStatus.SUCCEEDED and not final.notices
    sent = requests[1]["messages"]
    assert sent[-2]["content"][-1] == {
        "type": "tool_use",
        "id": record.id,
        "name": "get_weather",
        "input": {"city": "Paris"},
    }
    [result] = sent[-1]["content"]
    assert result["type"] == "tool_result" and result["tool_use_id"] == record.id and not result["is_error"]


# -- the key canary: a server block echoing the key is scrubbed before anything sees it -------------


async def test_a_server_block_carrying_the_key_is_scrubbed_by_the_transport(
    autojump_clock: trio.testing.MockClock,
) -> None:
    escaped = "".join(f"\\u{ord(c):04x}" for c in KEY)  # the key spelled with JSON escapes
    raw = (
        body("web_search")
        .replace(b"Release history", KEY.encode())
        .replace(b"https://pypi.org/project/trio/", escaped.encode())
    )
    events, _ = await over_loopback(raw)
    assert KEY not in repr(events)
    result = provider_blocks(events)[1]
    assert result["content"][0]["title"].startswith("[redacted-key]")
    assert result["content"][1]["url"] == "[redacted-key]"
    # Everything else about the response is unchanged.
    assert [type(e) for e in events] == [type(e) for e in EXPECTED["web_search"]]
    assert events[-1] == MessageStop(stop_reason=StopReason.END_TURN)


def test_only_the_last_assistant_message_names_a_container_and_markers_never_go_as_content() -> None:
    container = container_marker().block
    caller = caller_marker("toolu_x").block
    earlier = Message(role="assistant", content=(TextBlock(text="ran code"), container))
    later = Message(role="assistant", content=(TextBlock(text="no code this time"),))
    history = (Message.user("a"), earlier, Message.user("b"), later, Message.user("c"))
    body = build_anthropic_body(ChatRequest(model="m", messages=history))
    assert "container" not in body  # an old container may have expired: only a continuation names one
    body = build_anthropic_body(ChatRequest(model="m", messages=history[:2]))
    assert body["container"] == CONTAINER
    assert all(block["type"] == "text" for block in body["messages"][1]["content"])
    lone = Message(role="assistant", content=(caller,))
    assert build_anthropic_body(ChatRequest(model="m", messages=(Message.user("a"), lone)))["messages"][1:] == []
