"""The OpenAI Responses wire: its fixtures against the shared contract, parity with the other wires, the
request it builds (stateless, and with ``previous_response_id``), whole tool loops whose reasoning items
round-trip through a strict imitation of a reasoning model, the key canary, and the CLI's provider choice.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_provider_contract import EXPECTED as CONTRACT
from test_provider_contract import RESPONSES as LOGICAL_RESPONSES
from torture_support import check_stream

from trioloop import OpenAIResponsesProvider as TopLevelProvider
from trioloop import define_document_kind, function_tool
from trioloop.cli.chat import _chat
from trioloop.cli.parser import _build_parser
from trioloop.machine.reducer import Outcome
from trioloop.protocol import (
    ChatRequest,
    Message,
    MessageStart,
    MessageStop,
    ProtocolErrorCode,
    ProviderBlock,
    ProviderBlockComplete,
    StopReason,
    StreamError,
    StreamEvent,
    TextBlock,
    TextDelta,
    ThinkingBlock,
    ThinkingDelta,
    ToolCallBlock,
    ToolCallComplete,
    ToolCallInputDelta,
    ToolCallStart,
    ToolDefinition,
    ToolResultBlock,
    Usage,
    is_terminal,
)
from trioloop.providers import OpenAIResponsesProvider
from trioloop.providers._loopback import LoopbackRequest, LoopbackResponse, open_loopback_server, replay
from trioloop.providers.anthropic import AnthropicStreamMapper, render_anthropic_stream
from trioloop.providers.base import Messages, WireResponse, map_chunks
from trioloop.providers.openai import OpenAIStreamMapper, render_openai_stream
from trioloop.providers.openai_responses import (
    RESPONSES_BLOCK_WIRE,
    RESPONSES_WIRE,
    OpenAIResponsesOptions,
    OpenAIResponsesWire,
    ResponsesStreamMapper,
    build_responses_body,
    render_responses_stream,
)
from trioloop.providers.scripted import ScriptedCall, ScriptedProvider, ScriptStep
from trioloop.providers.sse import SseFrame
from trioloop.runtime.session import Session
from trioloop.runtime.tools import ToolExecutionContext

FIXTURES = Path(__file__).parent / "fixtures" / "providers"
RESPONSES = FIXTURES / "responses"
MODEL = "fixture-model-1"
KEY = "sk-responses-canary-0123456789abcdef"
PAYMENT = Path(__file__).resolve().parent.parent / "examples" / "payment.thf"
REQUEST = ChatRequest(model=MODEL, system="You are terse.", messages=(Message.user("hello"),))
START = MessageStart(model=MODEL)


def fixture(name: str) -> bytes:
    return (RESPONSES / f"{name}.sse").read_bytes()


def mapped(body: bytes, chunks: int = 1) -> list[StreamEvent]:
    size = max(1, math.ceil(len(body) / chunks))
    return map_chunks(ResponsesStreamMapper(), [body[i : i + size] for i in range(0, len(body), size)])


async def collect(chat: OpenAIResponsesProvider, request: ChatRequest = REQUEST) -> list[StreamEvent]:
    send, receive = trio.open_memory_channel[StreamEvent](math.inf)
    await chat.stream(request, send)
    send.close()
    async with receive:
        events = [event async for event in receive]
    assert sum(is_terminal(e) for e in events) == 1 and is_terminal(events[-1]), events
    return events


def usage(input_tokens: int, output_tokens: int, *, cached: int = 0, reasoning: int = 0) -> Usage:
    return Usage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cache_read_input_tokens=cached,
        reasoning_tokens=reasoning,
    )


# --- the fixtures: the shared contract's names mean the same logical response ----------------------------

SHARED = sorted(p.stem for p in RESPONSES.glob("*.sse") if p.stem in CONTRACT)

REASONING_ITEM = {
    "id": "rs_67ccd2bf6a4c8190b7cf1c8f0d3b6e01",
    "type": "reasoning",
    "summary": [
        {"type": "summary_text", "text": "**Checking the model**\n\nI should look up the web app first."},
        {"type": "summary_text", "text": "Then I can answer."},
    ],
    "encrypted_content": "gAAAAABoFixtureEncryptedReasoning0123456789abcdefghij==",
}
OPEN_MODEL_REASONING = {
    "id": "rs_oss_0",
    "type": "reasoning",
    "summary": [],
    "content": [{"type": "reasoning_text", "text": "The user greets me. Reply briefly."}],
    "status": "completed",
}


def block(item: dict[str, Any]) -> ProviderBlockComplete:
    data = json.dumps(item, separators=(",", ":"), ensure_ascii=False)
    return ProviderBlockComplete(block=ProviderBlock(wire=RESPONSES_BLOCK_WIRE, kind="reasoning", data=data))


OWN: dict[str, list[StreamEvent]] = {
    # Summary deltas stream as thinking (a new summary part is a new paragraph); the whole item, encrypted
    # content included, goes into the history; cached and reasoning tokens are given apart.
    "reasoning_tool_call": [
        START,
        ThinkingDelta(text="**Checking the model**\n\n"),
        ThinkingDelta(text="I should look up the web app first."),
        ThinkingDelta(text="\n\nThen I can answer."),
        block(REASONING_ITEM),
        ToolCallStart(id="call_web_app", name="get_entity"),
        ToolCallInputDelta(id="call_web_app", partial_json='{"kind": "elements", '),
        ToolCallInputDelta(id="call_web_app", partial_json='"id": "web-app"}'),
        ToolCallComplete(id="call_web_app", name="get_entity", input={"kind": "elements", "id": "web-app"}),
        usage(2048, 320, cached=1920, reasoning=256),
        MessageStop(stop_reason=StopReason.TOOL_USE),
    ],
    # An open model behind vLLM or LM Studio streams its raw reasoning (reasoning_text), not a summary.
    "reasoning_text_open_model": [
        START,
        ThinkingDelta(text="The user greets me. "),
        ThinkingDelta(text="Reply briefly."),
        block(OPEN_MODEL_REASONING),
        TextDelta(text="Hi!"),
        usage(40, 12, reasoning=8),
        MessageStop(stop_reason=StopReason.END_TURN),
    ],
    "content_filter": [
        START,
        TextDelta(text="I will not describe "),
        usage(30, 4),
        MessageStop(stop_reason=StopReason.REFUSAL),
    ],
    # After content a failed response is a provider error, shown and not retried.
    "failed_after_text": [
        START,
        TextDelta(text="Working on "),
        StreamError(
            code=ProtocolErrorCode.HTTP_STATUS,
            message=Messages.STREAM_PROVIDER_ERROR,
            provider_detail="Invalid prompt: flagged.",
        ),
    ],
    # No call_id: the call is still made and answered, under the item's id.
    "missing_call_id": [
        START,
        ToolCallStart(id="fc_no_call_id", name="get_entity"),
        ToolCallInputDelta(id="fc_no_call_id", partial_json='{"id": "db"}'),
        ToolCallComplete(id="fc_no_call_id", name="get_entity", input={"id": "db"}),
        usage(20, 6),
        MessageStop(stop_reason=StopReason.TOOL_USE),
    ],
    # Servers that send finished items only, or only the final response, give the same kind of events.
    "item_done_only": [
        START,
        TextDelta(text="One moment."),
        ToolCallStart(id="call_done_only", name="list_entities"),
        ToolCallInputDelta(id="call_done_only", partial_json='{"kind": "threats"}'),
        ToolCallComplete(id="call_done_only", name="list_entities", input={"kind": "threats"}),
        usage(25, 9),
        MessageStop(stop_reason=StopReason.TOOL_USE),
    ],
    "final_output_only": [
        START,
        TextDelta(text="All at once."),
        ToolCallStart(id="call_final", name="list_entities"),
        ToolCallInputDelta(id="call_final", partial_json="{}"),
        ToolCallComplete(id="call_final", name="list_entities", input={}),
        usage(25, 9),
        MessageStop(stop_reason=StopReason.TOOL_USE),
    ],
    # The output cap cut a call mid-arguments: answered as unfinished, never run.
    "call_cut_by_max_tokens": [
        START,
        ToolCallStart(id="call_cut", name="delete_element"),
        ToolCallInputDelta(id="call_cut", partial_json='{"id": "d'),
        ToolCallComplete(id="call_cut", name="delete_element", input={}, input_error=Messages.UNFINISHED_CALL),
        usage(50, 11),
        MessageStop(stop_reason=StopReason.MAX_TOKENS),
    ],
}
ALL = {**{name: CONTRACT[name] for name in SHARED}, **OWN}


def test_every_fixture_has_an_expectation_and_the_contract_is_covered() -> None:
    assert sorted(p.stem for p in RESPONSES.glob("*.sse")) == sorted(ALL)
    for name in ("text_answer", "parallel_tools", "refusal", "max_tokens", "rate_limit_in_stream"):
        assert name in SHARED
    assert "overloaded_in_stream" in SHARED and "truncated" in SHARED


@pytest.mark.parametrize("name", sorted(ALL))
def test_fixture_maps_to_its_events(name: str) -> None:
    assert mapped(fixture(name)) == ALL[name]


@pytest.mark.parametrize("name", SHARED)
def test_the_same_logical_response_gives_the_same_events_as_the_other_wires(name: str) -> None:
    anthropic = map_chunks(AnthropicStreamMapper(), [(FIXTURES / "anthropic" / f"{name}.sse").read_bytes()])
    openai = map_chunks(OpenAIStreamMapper(), [(FIXTURES / "openai" / f"{name}.sse").read_bytes()])
    assert mapped(fixture(name)) == anthropic == openai


@pytest.mark.parametrize("name", ["parallel_tools", "reasoning_tool_call"])
def test_split_at_every_offset(name: str) -> None:
    raw = fixture(name)
    for offset in range(0, len(raw) + 1, 7):
        assert map_chunks(ResponsesStreamMapper(), [raw[:offset], raw[offset:]]) == ALL[name], offset


@settings(max_examples=80, deadline=None)
@given(name=st.sampled_from(sorted(ALL)), cuts=st.lists(st.floats(0, 1), max_size=30))
def test_split_anywhere_many_times(name: str, cuts: list[float]) -> None:
    raw = fixture(name)
    points = sorted(int(c * len(raw)) for c in cuts)
    chunks = [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True)]
    assert map_chunks(ResponsesStreamMapper(), chunks) == ALL[name]


@pytest.mark.parametrize("name", sorted(ALL))
async def test_the_real_transport_gives_the_same_events(name: str, autojump_clock: trio.testing.MockClock) -> None:
    response = LoopbackResponse(body=fixture(name), chunk_size=89, delay_between_chunks=0.01)
    async with open_loopback_server(replay([response], fallback=response)) as server:
        events = await collect(OpenAIResponsesProvider(KEY, base_url=server.url + "/v1"))
    assert events == ALL[name]
    # Only an error before any content is retried (a server error before the first event).
    assert len(server.requests) == (3 if name == "overloaded_in_stream" else 1)
    request = server.requests[0]
    assert request.target == "/v1/responses" and request.header("authorization") == f"Bearer {KEY}"


# --- any logical response, rendered by each of the three wires, maps to the same events ------------------


@settings(max_examples=150, deadline=None)
@given(response=LOGICAL_RESPONSES, cut=st.floats(0, 1))
def test_rendered_responses_map_identically_on_all_three_wires(response: WireResponse, cut: float) -> None:
    assume(response.tool_calls or response.stop_reason is not StopReason.TOOL_USE)
    results = []
    for render, new in (
        (render_anthropic_stream, AnthropicStreamMapper),
        (render_openai_stream, OpenAIStreamMapper),
        (render_responses_stream, ResponsesStreamMapper),
    ):
        raw = render(response)
        at = int(cut * len(raw))
        results.append(map_chunks(new(), [raw[:at], raw[at:]]))
    anthropic, openai, responses = results
    assert responses == anthropic == openai
    assert "".join(e.text for e in responses if isinstance(e, TextDelta)) == response.text


@settings(max_examples=40, deadline=None)
@given(response=LOGICAL_RESPONSES, chunks=st.integers(1, 40))
def test_any_chunking_gives_the_same_events(response: WireResponse, chunks: int) -> None:
    raw = render_responses_stream(response)
    assert mapped(raw, chunks) == mapped(raw)


# --- hostile streams: never an exception, always the stream contract ------------------------------------

_junk = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12)
_json_like = st.recursive(
    _junk,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


def _maybe(value: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(value, value, value, _json_like)


_indexes = _maybe(st.integers(0, 3))
_item_ids = _maybe(st.sampled_from(["fc_1", "fc_2", "rs_1", "msg_1", ""]))
_texts = _maybe(st.sampled_from(["Hi", "", '{"kind": ', '"x"}', "{}", "NaN", "{", "sk-x"]))
_items = st.fixed_dictionaries(
    {"type": _maybe(st.sampled_from(["function_call", "message", "reasoning", "web_search_call"]))},
    optional={
        "id": _item_ids,
        "call_id": _maybe(st.sampled_from(["call_1", "call_2", ""])),
        "name": _maybe(st.sampled_from(["get_entity", ""])),
        "arguments": _texts,
        "status": _maybe(st.sampled_from(["completed", "incomplete", "in_progress"])),
        "content": _maybe(st.lists(st.fixed_dictionaries({"type": _maybe(st.just("output_text")), "text": _texts}))),
        "summary": _maybe(st.lists(st.fixed_dictionaries({"type": st.just("summary_text"), "text": _texts}))),
        "encrypted_content": _texts,
    },
)
_response_objects = st.fixed_dictionaries(
    {},
    optional={
        "id": _maybe(st.just("resp_1")),
        "model": _maybe(st.just(MODEL)),
        "output": _maybe(st.lists(_items, max_size=3)),
        "usage": _maybe(st.fixed_dictionaries({"input_tokens": _indexes, "output_tokens": _indexes})),
        "incomplete_details": _maybe(st.fixed_dictionaries({"reason": _maybe(st.just("max_output_tokens"))})),
        "error": _maybe(st.fixed_dictionaries({"code": _texts, "message": _texts})),
    },
)
_payloads = st.fixed_dictionaries(
    {
        "type": st.sampled_from(
            [
                "response.created",
                "response.output_item.added",
                "response.output_item.done",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_text.delta",
                "response.output_text.done",
                "response.refusal.delta",
                "response.refusal.done",
                "response.reasoning_summary_text.delta",
                "response.reasoning_text.delta",
                "response.completed",
                "response.incomplete",
                "response.failed",
                "error",
                "response.bogus",
            ]
        )
    },
    optional={
        "output_index": _indexes,
        "item_id": _item_ids,
        "item": _maybe(_items),
        "delta": _texts,
        "text": _texts,
        "arguments": _texts,
        "refusal": _texts,
        "summary_index": _indexes,
        "response": _maybe(_response_objects),
        "code": _texts,
        "message": _texts,
        "error": _maybe(st.fixed_dictionaries({"code": _texts, "message": _texts})),
    },
)


def _frames(payloads: list[dict[str, Any]]) -> bytes:
    return "".join(f"event: {p['type']}\ndata: {json.dumps(p)}\n\n" for p in payloads).encode()


_FUZZ = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)


@_FUZZ
@given(payloads=st.lists(_payloads, max_size=12), cut=st.floats(0, 1))
def test_hostile_event_sequences_keep_the_stream_contract(payloads: list[dict[str, Any]], cut: float) -> None:
    raw = _frames(payloads)
    at = int(cut * len(raw))
    check_stream(RESPONSES_WIRE, [raw[:at], raw[at:]])


@_FUZZ
@given(data=_json_like, event=st.sampled_from(["message", "response.completed", "error", "x"]))
def test_the_mapper_never_raises_on_any_frame(data: Any, event: str) -> None:
    mapper = ResponsesStreamMapper()
    events: list[StreamEvent] = []
    for frame in (SseFrame(event=event, data=json.dumps(data)), SseFrame(event=event, data="{cut", at_eof=True)):
        events += mapper.feed(frame)
    events += mapper.finish()
    assert mapper.done and sum(is_terminal(e) for e in events) == 1 and is_terminal(events[-1])


def test_hostile_shapes_are_notices_and_nameless_calls_are_said() -> None:
    frames = [
        {"type": "response.created", "response": {"id": "resp_h", "model": MODEL}},
        {"type": "response.output_text.delta", "output_index": 0, "delta": ["not", "text"]},
        {"type": "response.output_item.added", "output_index": 1, "item": {"type": "function_call", "call_id": "c"}},
        {"type": "response.function_call_arguments.delta", "output_index": 1, "delta": '{"x": 1}'},
        {"type": "response.output_item.done", "output_index": 1, "item": {"type": "function_call", "call_id": "c"}},
        {"type": "response.output_text.delta", "output_index": 0, "delta": "ok"},
        {"type": "response.completed", "response": {"id": "resp_h", "usage": "lots"}},
    ]
    events = mapped(_frames(frames))
    notices = [e for e in events if isinstance(e, StreamError)]
    assert len(notices) == 3 and all(not n.terminal for n in notices)
    assert [e for e in events if isinstance(e, TextDelta)] == [TextDelta(text="ok")]
    assert not any(isinstance(e, ToolCallStart | ToolCallComplete) for e in events)
    assert events[-1] == MessageStop(stop_reason=StopReason.END_TURN)


def test_the_final_item_settles_what_the_deltas_left_open() -> None:
    call = {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "look", "arguments": ""}
    frames = [
        {"type": "response.created", "response": {"id": "r", "model": MODEL}},
        {"type": "response.output_item.added", "output_index": 0, "item": call},
        {"type": "response.function_call_arguments.delta", "output_index": 0, "item_id": "fc_1", "delta": '{"a": 1}'},
        # A done item with empty arguments does not erase the streamed ones.
        {"type": "response.output_item.done", "output_index": 0, "item": {**call, "status": "completed"}},
        {"type": "response.output_item.added", "output_index": 1, "item": {**call, "id": "fc_2", "call_id": "c2"}},
        {"type": "response.function_call_arguments.delta", "output_index": 1, "item_id": "fc_2", "delta": "{}"},
        {
            "type": "response.incomplete",
            "response": {
                "id": "r",
                "incomplete_details": {"reason": "max_output_tokens"},
                # The final object says the second call finished: it is read, not cut off.
                "output": [
                    {**call, "status": "completed"},
                    {**call, "id": "fc_2", "call_id": "c2", "status": "completed"},
                ],
            },
        },
    ]
    completed = [e for e in mapped(_frames(frames)) if isinstance(e, ToolCallComplete)]
    assert completed == [
        ToolCallComplete(id="c1", name="look", input={"a": 1}),
        ToolCallComplete(id="c2", name="look", input={}),
    ]


def two_calls_under_one_item_id(response_id: str = "r", *, second_streams: bool = True) -> list[dict[str, Any]]:
    """Two function calls sharing the item id ``fc_shared``, each with its own ``call_id``, deltas interleaved."""
    first = {"type": "function_call", "id": "fc_shared", "call_id": "call_a", "name": "look", "arguments": ""}
    second = {**first, "call_id": "call_b"}
    whole = [{**first, "arguments": '{"heading": "Intro"}'}, {**second, "arguments": '{"heading": "End"}'}]
    done = [{**item, "status": "completed"} for item in whole]

    def pieces(index: int, *deltas: str) -> list[dict[str, Any]]:
        kind = "response.function_call_arguments.delta"
        return [{"type": kind, "item_id": "fc_shared", "output_index": index, "delta": d} for d in deltas]

    a, b = pieces(0, '{"heading": ', '"Intro"}'), pieces(1, '{"heading": ', '"End"}')
    streamed = [
        {"type": "response.output_item.added", "output_index": 1, "item": second},
        b[0],
        a[1],
        b[1],
        {
            "type": "response.function_call_arguments.done",
            "item_id": "fc_shared",
            "output_index": 1,
            "arguments": whole[1]["arguments"],
        },
        {"type": "response.output_item.done", "output_index": 1, "item": done[1]},
    ]
    return [
        {"type": "response.created", "response": response_object(response_id, [], "in_progress")},
        {"type": "response.output_item.added", "output_index": 0, "item": first},
        a[0],
        *(streamed if second_streams else [a[1]]),
        {
            "type": "response.function_call_arguments.done",
            "item_id": "fc_shared",
            "output_index": 0,
            "arguments": whole[0]["arguments"],
        },
        {"type": "response.output_item.done", "output_index": 0, "item": done[0]},
        {"type": "response.completed", "response": response_object(response_id, done)},
    ]


@pytest.mark.parametrize("second_streams", [True, False])
def test_two_calls_under_one_item_id_each_come_through_whole(second_streams: bool) -> None:
    # Issue 40: the second call of a shared item id was lost behind a notice. Calls are told apart by call_id,
    # and argument deltas by output_index; one only in the final response object is read from it.
    events = mapped(sse(*two_calls_under_one_item_id(second_streams=second_streams)))
    assert not any(isinstance(e, StreamError) for e in events)
    assert sorted(e.id for e in events if isinstance(e, ToolCallStart)) == ["call_a", "call_b"]
    assert sorted((e for e in events if isinstance(e, ToolCallComplete)), key=lambda e: e.id) == [
        ToolCallComplete(id="call_a", name="look", input={"heading": "Intro"}),
        ToolCallComplete(id="call_b", name="look", input={"heading": "End"}),
    ]
    deltas = [e for e in events if isinstance(e, ToolCallInputDelta)]
    for call_id, heading in (("call_a", "Intro"), ("call_b", "End")):
        assert "".join(d.partial_json for d in deltas if d.id == call_id) == f'{{"heading": "{heading}"}}'
    assert events[-1] == MessageStop(stop_reason=StopReason.TOOL_USE)


def test_an_error_event_nested_or_flat_is_classified_like_the_other_wires() -> None:
    flat = {"type": "error", "code": "rate_limit_exceeded", "message": "slow down", "param": None}
    nested = {"type": "error", "error": {"type": "server_error", "code": "server_error", "message": "boom"}}
    assert mapped(_frames([flat])) == [
        StreamError(
            code=ProtocolErrorCode.RATE_LIMITED, message=Messages.STREAM_RATE_LIMITED, provider_detail="slow down"
        )
    ]
    assert mapped(_frames([nested])) == [
        StreamError(code=ProtocolErrorCode.HTTP_STATUS, message=Messages.SERVER_ERROR, provider_detail="boom")
    ]


# --- the request ------------------------------------------------------------------------------------------

TOOL = ToolDefinition(
    name="look",
    description="Read one section.",
    json_schema={"type": "object", "properties": {"heading": {"type": "string"}}, "required": ["heading"]},
)


def reasoning_block(item_id: str = "rs_1", encrypted: str | None = "ENC==") -> ProviderBlock:
    item: dict[str, Any] = {"id": item_id, "type": "reasoning", "summary": [{"type": "summary_text", "text": "t"}]}
    if encrypted is not None:
        item["encrypted_content"] = encrypted
    return ProviderBlock(wire=RESPONSES_BLOCK_WIRE, kind="reasoning", data=json.dumps(item))


def marker(response_id: str, *call_ids: str) -> ProviderBlock:
    data = json.dumps({"id": response_id, "call_ids": list(call_ids)})
    return ProviderBlock(wire=RESPONSES_BLOCK_WIRE, kind="response", data=data)


HISTORY = (
    Message.user("look at the intro"),
    Message(
        role="assistant",
        content=(
            reasoning_block(),
            TextBlock(text="Looking."),
            ToolCallBlock(id="call_1", name="look", input={"heading": "Intro"}),
            ProviderBlock(wire="anthropic", kind="server_tool_use", data='{"id": "srvtoolu_1"}'),
            ThinkingBlock(thinking="from another wire", signature="sig"),
        ),
    ),
    Message(role="user", content=(ToolResultBlock(call_id="call_1", content="Intro: hello"),)),
)


def test_the_stateless_body_carries_the_whole_history_in_order() -> None:
    request = ChatRequest(model="gpt-5", system="Be brief.", messages=HISTORY, tools=(TOOL,), max_tokens=1000)
    body = build_responses_body(request)
    assert body == {
        "model": "gpt-5",
        "instructions": "Be brief.",
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "look at the intro"}]},
            # The reasoning item verbatim but for its id: with store false an id is looked up and not found.
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "t"}], "encrypted_content": "ENC=="},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
            {"type": "function_call", "call_id": "call_1", "name": "look", "arguments": '{"heading":"Intro"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "Intro: hello"},
        ],
        "tools": [
            {
                "type": "function",
                "name": "look",
                "description": "Read one section.",
                "parameters": dict(TOOL.json_schema),
                "strict": False,
            }
        ],
        "max_output_tokens": 1000,
        "stream": True,
        "store": False,
        "include": ["reasoning.encrypted_content"],
    }


def test_a_reasoning_item_without_content_to_send_back_is_left_out() -> None:
    history = (Message.user("hi"), Message(role="assistant", content=(reasoning_block(encrypted=None),)))
    body = build_responses_body(ChatRequest(model="m", messages=(*history, Message.user("again"))))
    assert [item["type"] for item in body["input"]] == ["message", "message"]


def test_options_for_each_kind_of_server() -> None:
    assert OpenAIResponsesOptions.for_base_url(None) == OpenAIResponsesOptions()
    assert OpenAIResponsesOptions.for_base_url("https://openrouter.ai/api/v1") == OpenAIResponsesOptions()
    azure = OpenAIResponsesOptions.for_base_url("https://acme.openai.azure.com/openai/v1")
    assert azure.auth == "api-key" and azure.store is False
    assert OpenAIResponsesWire(azure).auth_headers("k") == {"api-key": "k"}
    for local in ("http://localhost:11434/v1", "http://127.0.0.1:1234/v1", "http://[::1]:8000/v1"):
        options = OpenAIResponsesOptions.for_base_url(local)
        assert not options.include_encrypted_reasoning and options.send_item_ids and not options.assistant_text_parts
    body = build_responses_body(
        ChatRequest(model="m", messages=HISTORY), OpenAIResponsesOptions.for_base_url("http://localhost:8000/v1")
    )
    assert "include" not in body and body["input"][1]["id"] == "rs_1"
    assert body["input"][2] == {"type": "message", "role": "assistant", "content": "Looking."}
    bare = build_responses_body(REQUEST, OpenAIResponsesOptions(store=None, include_encrypted_reasoning=False))
    assert "store" not in bare and "include" not in bare
    reasoning = build_responses_body(REQUEST, OpenAIResponsesOptions(reasoning_effort="low", reasoning_summary="auto"))
    assert reasoning["reasoning"] == {"effort": "low", "summary": "auto"}
    with pytest.raises(ValueError, match="store=True"):
        OpenAIResponsesOptions(previous_response_id=True)


CHAINED = OpenAIResponsesOptions(store=True, previous_response_id=True)


def test_previous_response_id_sends_only_what_came_after_the_stored_response() -> None:
    assistant = HISTORY[1]
    stored = (HISTORY[0], Message(role="assistant", content=(*assistant.content, marker("resp_1", "call_1"))))
    request = ChatRequest(model="m", messages=(*stored, HISTORY[2]))
    body = build_responses_body(request, CHAINED)
    assert body["previous_response_id"] == "resp_1" and body["store"] is True
    assert body["input"] == [{"type": "function_call_output", "call_id": "call_1", "output": "Intro: hello"}]
    # Not opted in: the marker is ignored and everything goes, as without it.
    assert build_responses_body(request) == build_responses_body(ChatRequest(model="m", messages=HISTORY))


def test_a_renamed_call_id_falls_back_to_the_whole_history() -> None:
    # The turn renamed the server's id (a repeat): the stored response no longer pairs with our results.
    assistant = Message(role="assistant", content=(ToolCallBlock(id="call_1~2", name="look"), marker("r", "call_1")))
    request = ChatRequest(model="m", messages=(HISTORY[0], assistant, Message.user("next")))
    body = build_responses_body(request, CHAINED)
    assert "previous_response_id" not in body and len(body["input"]) == 3


def test_error_bodies() -> None:
    overflow = b'{"error": {"message": "too long", "type": "invalid_request_error", "code": "context_length_exceeded"}}'
    assert RESPONSES_WIRE.describe_error_body(overflow).context_overflow
    openrouter = b'{"error": {"code": "invalid_prompt", "message": "Missing model."}, "metadata": null}'
    assert RESPONSES_WIRE.describe_error_body(openrouter).detail == "invalid_prompt: Missing model."
    assert RESPONSES_WIRE.describe_error_body(b"plain").detail == "plain"
    rendered = json.loads(RESPONSES_WIRE.render_error_body(429, "slow"))
    assert rendered["error"]["code"] == "rate_limit_exceeded"


async def test_a_context_overflow_status_is_typed(autojump_clock: trio.testing.MockClock) -> None:
    body = b'{"error": {"message": "too long", "type": "invalid_request_error", "code": "context_length_exceeded"}}'
    answer = LoopbackResponse(status=400, headers=(("content-type", "application/json"),), body=body)
    async with open_loopback_server(replay([answer])) as server:
        events = await collect(OpenAIResponsesProvider(KEY, base_url=server.url + "/v1"))
    assert len(events) == 1 and isinstance(events[0], StreamError)
    assert events[0].code is ProtocolErrorCode.CONTEXT_OVERFLOW


# --- whole tool loops against an imitation of a reasoning model --------------------------------------------

TEXT = define_document_kind("text")
ENCRYPTED = "gAAAAABoImitationEncryptedReasoning=="
NOT_FOUND = (
    "Item with id 'rs_imitation' not found. Items are not persisted when `store` is set to false. "
    "Try again with `store` set to true, or remove this item from your input."
)
MISSING = (
    "Item 'fc_imitation' of type 'function_call' was provided without its required 'reasoning' item: 'rs_imitation'."
)


@function_tool(effect="read")
async def look(ctx: ToolExecutionContext[str], heading: str) -> str:
    """Read one section of the document.

    Args:
        heading: The heading to read.
    """
    return f"{heading}: {ctx.document}"


def sse(*events: dict[str, Any]) -> bytes:
    parts = []
    for number, event in enumerate(events):
        payload = {**event, "sequence_number": number}
        parts.append(f"event: {event['type']}\ndata: {json.dumps(payload)}\n\n")
    return "".join(parts).encode()


def response_object(response_id: str, output: list[dict[str, Any]], status: str = "completed") -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "response",
        "status": status,
        "model": "o4-mini",
        "output": output,
        "usage": {
            "input_tokens": 50,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 20,
            "output_tokens_details": {"reasoning_tokens": 12},
            "total_tokens": 70,
        },
    }


def reasoning_then_call(response_id: str) -> bytes:
    reasoning = {
        "id": "rs_imitation",
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "I need the intro."}],
        "encrypted_content": ENCRYPTED,
    }
    call = {
        "id": "fc_imitation",
        "type": "function_call",
        "status": "completed",
        "call_id": "call_look",
        "name": "look",
        "arguments": '{"heading": "Intro"}',
    }
    shell = response_object(response_id, [], "in_progress")
    return sse(
        {"type": "response.created", "response": shell},
        {"type": "response.output_item.added", "output_index": 0, "item": {**reasoning, "summary": []}},
        {
            "type": "response.reasoning_summary_text.delta",
            "item_id": "rs_imitation",
            "output_index": 0,
            "summary_index": 0,
            "delta": "I need the intro.",
        },
        {"type": "response.output_item.done", "output_index": 0, "item": reasoning},
        {"type": "response.output_item.added", "output_index": 1, "item": {**call, "arguments": ""}},
        {
            "type": "response.function_call_arguments.delta",
            "item_id": "fc_imitation",
            "output_index": 1,
            "delta": '{"heading": "Intro"}',
        },
        {"type": "response.output_item.done", "output_index": 1, "item": call},
        {"type": "response.completed", "response": response_object(response_id, [reasoning, call])},
    )


def answer(response_id: str, text: str) -> bytes:
    message = {
        "id": f"msg_{response_id}",
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    return sse(
        {"type": "response.created", "response": response_object(response_id, [], "in_progress")},
        {"type": "response.output_text.delta", "item_id": message["id"], "output_index": 0, "delta": text},
        {"type": "response.output_item.done", "output_index": 0, "item": message},
        {"type": "response.completed", "response": response_object(response_id, [message])},
    )


def refusal(status: int, message: str) -> LoopbackResponse:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": "input", "code": None}}
    return LoopbackResponse(
        status=status, headers=(("content-type", "application/json"),), body=json.dumps(body).encode()
    )


def stateless_problem(body: dict[str, Any]) -> LoopbackResponse | None:
    """What OpenAI answers a ``store: false`` continuation that does not carry its reasoning as required."""
    items = body["input"]
    outputs = [i for i, item in enumerate(items) if item.get("type") == "function_call_output"]
    if not outputs:
        return None
    reasoning = [i for i, item in enumerate(items) if item.get("type") == "reasoning"]
    calls = [i for i, item in enumerate(items) if item.get("type") == "function_call"]
    if not reasoning:
        return refusal(400, MISSING)
    item = items[reasoning[0]]
    if "id" in item and body.get("store") is False:
        return refusal(404, NOT_FOUND)
    if item.get("encrypted_content") != ENCRYPTED or not isinstance(item.get("summary"), list):
        return refusal(400, "The encrypted content for item rs_imitation could not be verified.")
    if not calls or not reasoning[0] < calls[0] < outputs[0] or items[calls[0]]["call_id"] != "call_look":
        return refusal(400, "No tool call found for function call output with call_id call_look.")
    if items[outputs[0]]["call_id"] != "call_look":
        return refusal(400, "No tool call found for function call output.")
    return None


class ReasoningModel:
    """A loopback imitation of a reasoning model on the Responses API, strict about what must come back."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.statuses: list[int] = []
        self.stored: set[str] = set()  # the ids of the responses made with store true
        self.served = 0

    def __call__(self, request: LoopbackRequest) -> LoopbackResponse:
        body = request.json()
        self.bodies.append(body)
        reply = self._reply(body)
        self.statuses.append(reply.status)
        return reply

    def _reply(self, body: dict[str, Any]) -> LoopbackResponse:
        previous = body.get("previous_response_id")
        if previous is not None and previous not in self.stored:
            return refusal(404, f"Previous response with id '{previous}' not found.")
        if previous is None:
            problem = stateless_problem(body)
            if problem is not None:
                return problem
        self.served += 1
        response_id = f"resp_{self.served}"
        if body.get("store"):
            self.stored.add(response_id)
        outputs = [item for item in body["input"] if item.get("type") == "function_call_output"]
        if outputs:
            raw = answer(response_id, f"The intro says {outputs[0]['output']!r}.")
        elif previous is None and len(body["input"]) == 1:
            raw = reasoning_then_call(response_id)  # the opening question: think, then look
        else:
            raw = answer(response_id, "Hello again.")
        return LoopbackResponse(body=raw, chunk_size=53)


def test_the_imitation_refuses_what_openai_refuses() -> None:
    request = ChatRequest(model="o4-mini", messages=HISTORY)
    wrong = build_responses_body(request, OpenAIResponsesOptions(send_item_ids=True))
    assert stateless_problem(wrong) is not None  # an id with store false: not found
    without = {**wrong, "input": [i for i in wrong["input"] if i["type"] != "reasoning"]}
    problem = stateless_problem(without)
    assert problem is not None and problem.status == 400


async def run_session(provider: OpenAIResponsesProvider, *texts: str) -> tuple[Session[str], list[Any]]:
    states = []
    async with Session(document="hello", kind=TEXT, provider=provider, model="o4-mini", tools=[look]) as session:
        for text in texts:
            states.append(await session.send(text))
    return session, states


async def test_a_tool_loop_sends_its_reasoning_back_when_nothing_is_stored() -> None:
    model = ReasoningModel()
    async with open_loopback_server(model, keep_alive=True) as server:
        # OpenAI's defaults: a server on this machine would otherwise get the local servers' ones.
        provider = OpenAIResponsesProvider(KEY, base_url=server.url + "/v1", options=OpenAIResponsesOptions())
        session, states = await run_session(provider, "what does the intro say?")
    assert [s.outcome for s in states] == [Outcome.COMPLETED]
    assert model.statuses == [200, 200]
    first, second = model.bodies
    assert first["store"] is False and first["include"] == ["reasoning.encrypted_content"]
    assert "previous_response_id" not in second
    assert [item["type"] for item in second["input"]] == [
        "message",
        "reasoning",
        "function_call",
        "function_call_output",
    ]
    reasoning = second["input"][1]
    assert reasoning["encrypted_content"] == ENCRYPTED and "id" not in reasoning
    assert second["input"][3] == {"type": "function_call_output", "call_id": "call_look", "output": "Intro: hello"}
    assistant = session.history[1]
    assert any(isinstance(b, ProviderBlock) and b.kind == "reasoning" for b in assistant.content)
    assert session.history[-1].content == (TextBlock(text="The intro says 'Intro: hello'."),)


async def test_a_tool_loop_with_previous_response_id_sends_only_the_new_items() -> None:
    model = ReasoningModel()
    async with open_loopback_server(model, keep_alive=True) as server:
        provider = OpenAIResponsesProvider(KEY, base_url=server.url + "/v1", options=CHAINED)
        session, states = await run_session(provider, "what does the intro say?", "and then?")
    assert [s.outcome for s in states] == [Outcome.COMPLETED, Outcome.COMPLETED]
    assert model.statuses == [200, 200, 200]
    first, second, third = model.bodies
    assert first["store"] is True and "previous_response_id" not in first
    assert second["previous_response_id"] == "resp_1"
    assert second["input"] == [{"type": "function_call_output", "call_id": "call_look", "output": "Intro: hello"}]
    assert third["previous_response_id"] == "resp_2"
    assert third["input"] == [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "and then?"}]}
    ]
    # Instructions and tools are not carried over by the API: every request sends them.
    assert all(body["instructions"] and body["tools"] for body in model.bodies)
    markers = [b for m in session.history for b in m.content if isinstance(b, ProviderBlock) and b.kind == "response"]
    assert [json.loads(b.data)["id"] for b in markers] == ["resp_1", "resp_2", "resp_3"]


async def test_without_the_reasoning_item_the_imitation_answers_400(autojump_clock: trio.testing.MockClock) -> None:
    # The control: a history that lost the reasoning item is refused, so the loops above prove something.
    model = ReasoningModel()
    lost = (HISTORY[0], Message(role="assistant", content=HISTORY[1].content[2:3]), HISTORY[2])
    async with open_loopback_server(model) as server:
        provider = OpenAIResponsesProvider(KEY, base_url=server.url + "/v1", options=OpenAIResponsesOptions())
        events = await collect(provider, ChatRequest(model="o4-mini", messages=lost))
    assert model.statuses == [400]
    assert isinstance(events[0], StreamError) and "required 'reasoning' item" in (events[0].provider_detail or "")


async def test_a_call_without_call_id_is_answered_under_the_id_it_was_given() -> None:
    answers = [LoopbackResponse(body=fixture("missing_call_id")), LoopbackResponse(body=fixture("text_answer"))]
    async with open_loopback_server(replay(answers), keep_alive=True) as server:
        provider = OpenAIResponsesProvider(KEY, base_url=server.url + "/v1", options=OpenAIResponsesOptions())
        _, states = await run_session(provider, "look")
    assert states[0].outcome is Outcome.COMPLETED and len(server.requests) == 2
    items = server.requests[1].json()["input"]
    call = next(item for item in items if item["type"] == "function_call")
    result = next(item for item in items if item["type"] == "function_call_output")
    assert call["call_id"] == result["call_id"] == "fc_no_call_id"  # get_entity is unknown here: answered so


async def test_two_calls_under_one_item_id_are_both_run_and_answered() -> None:
    answers = [
        LoopbackResponse(body=sse(*two_calls_under_one_item_id("resp_1")), chunk_size=61),
        LoopbackResponse(body=answer("resp_2", "Both read.")),
    ]
    async with open_loopback_server(replay(answers), keep_alive=True) as server:
        provider = OpenAIResponsesProvider(KEY, base_url=server.url + "/v1", options=OpenAIResponsesOptions())
        _, states = await run_session(provider, "read the intro and the end")
    assert states[0].outcome is Outcome.COMPLETED and len(server.requests) == 2 and not states[0].notices
    # Recorded in the order they completed (the second call finished first).
    assert sorted((c.id, c.result) for c in states[0].calls) == [("call_a", "Intro: hello"), ("call_b", "End: hello")]
    items = server.requests[1].json()["input"]
    calls = [(i["call_id"], json.loads(i["arguments"])) for i in items if i["type"] == "function_call"]
    assert sorted(calls) == [("call_a", {"heading": "Intro"}), ("call_b", {"heading": "End"})]
    outputs = {i["call_id"]: i["output"] for i in items if i["type"] == "function_call_output"}
    assert outputs == {"call_a": "Intro: hello", "call_b": "End: hello"}


async def test_the_scripted_provider_speaks_the_responses_wire() -> None:
    steps = [
        ScriptStep(tool_calls=[ScriptedCall(id="c1", name="look", input={"heading": "Intro"})]),
        ScriptStep(text="ok"),
    ]
    async with (
        ScriptedProvider(steps, wire="openai-responses") as provider,
        Session(document="doc", kind=TEXT, provider=provider, model="scripted-1", tools=[look]) as session,
    ):
        state = await session.send("go")
    assert state.outcome is Outcome.COMPLETED
    second = provider.requests[1]
    assert isinstance(second, dict)
    assert [item["type"] for item in second["input"]] == ["message", "function_call", "function_call_output"]


# --- the key canary -----------------------------------------------------------------------------------------


def echoing_stream() -> bytes:
    half = len(KEY) // 2
    reasoning = {
        "id": "rs_echo",
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": f"the key is {KEY}"}],
        "encrypted_content": f"enc-{KEY}",
    }
    call = {
        "id": "fc_echo",
        "type": "function_call",
        "status": "completed",
        "call_id": f"call_{KEY}",
        "name": "look",
        "arguments": json.dumps({"heading": KEY}),
    }
    return sse(
        {"type": "response.created", "response": response_object("resp_echo", [], "in_progress")},
        {"type": "response.reasoning_summary_text.delta", "item_id": "rs_echo", "output_index": 0, "delta": KEY[:half]},
        {"type": "response.reasoning_summary_text.delta", "item_id": "rs_echo", "output_index": 0, "delta": KEY[half:]},
        {"type": "response.output_item.done", "output_index": 0, "item": reasoning},
        {"type": "response.output_text.delta", "item_id": "m", "output_index": 1, "delta": f"Your key: {KEY[:5]}"},
        {"type": "response.output_text.delta", "item_id": "m", "output_index": 1, "delta": KEY[5:]},
        {"type": "response.output_item.added", "output_index": 2, "item": {**call, "arguments": ""}},
        {
            "type": "response.function_call_arguments.delta",
            "item_id": "fc_echo",
            "output_index": 2,
            "delta": call["arguments"],
        },
        {"type": "response.output_item.done", "output_index": 2, "item": call},
        {"type": "response.completed", "response": response_object("resp_echo", [reasoning, call])},
    )


async def test_a_stream_echoing_the_key_never_shows_it(autojump_clock: trio.testing.MockClock) -> None:
    failing = sse({"type": "error", "code": "invalid_api_key", "message": f"Incorrect API key provided: {KEY}"})
    answers = [LoopbackResponse(body=echoing_stream(), chunk_size=7), LoopbackResponse(body=failing)]
    async with open_loopback_server(replay(answers)) as server:
        provider = OpenAIResponsesProvider(KEY, base_url=server.url + "/v1")
        events = await collect(provider) + await collect(provider)
    shown = repr(events)
    assert KEY not in shown and KEY[: len(KEY) - 4] not in shown
    assert any(isinstance(e, ProviderBlockComplete) for e in events)
    assert any(isinstance(e, ToolCallComplete) for e in events) and isinstance(events[-1], StreamError)


# --- the public surface and the CLI ------------------------------------------------------------------------


def test_exported_at_the_top_level_and_from_providers() -> None:
    assert TopLevelProvider is OpenAIResponsesProvider
    assert "OpenAIResponsesProvider" in repr(OpenAIResponsesProvider(KEY))


@pytest.fixture
def _no_openai_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    yield


def one_request() -> Callable[[str], str]:
    answers = iter(["summarize the model"])

    def prompt(label: str) -> str:
        try:
            return next(answers)
        except StopIteration:
            raise EOFError from None

    return prompt


@pytest.mark.usefixtures("_no_openai_environment")
async def test_the_cli_speaks_the_responses_wire(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], autojump_clock: trio.testing.MockClock
) -> None:
    args = _build_parser().parse_args(["chat", str(PAYMENT), "--provider", "openai-responses"])
    assert args.provider == "openai-responses"
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    response = LoopbackResponse(body=fixture("text_answer"))
    async with open_loopback_server(replay([response])) as server:
        code = await _chat(PAYMENT, "openai-responses", None, "none", one_request(), server.url + "/v1")
    captured = capsys.readouterr()
    assert code == 0 and "Grüße" in captured.out and "warning" not in captured.err
    check, request = server.requests  # the URL and key checked first (the models list), then the turn
    assert check.method == "GET" and check.target == "/v1/models"
    assert request.target == "/v1/responses" and request.header("authorization") == f"Bearer {KEY}"
    body = request.json()
    assert body["model"] == "gpt-5" and body["store"] is False


def _sse_body(*events: dict[str, Any]) -> bytes:
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()


def test_items_with_no_strict_json_form_are_said_never_kept_or_run_with_other_input() -> None:
    # 1e999 decodes as infinity, whose JSON text ("Infinity") no server reads back: a reasoning item holding
    # it cannot go back as it came (a notice, not a kept block), and a call's object arguments holding it
    # make an unreadable call (answered, never run), not a call with {} or invented arguments.
    reasoning = '{"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"x","n":1e999}'
    call = '{"type":"function_call","id":"fc_1","call_id":"call_1","name":"f","arguments":{"a":1e999}}'
    done = (
        'event: response.output_item.done\ndata: {{"type":"response.output_item.done","output_index":{},"item":{}}}\n\n'
    )
    raw = (done.format(0, reasoning) + done.format(1, call)).encode()
    raw += _sse_body({"type": "response.completed", "response": {"id": "resp_1", "output": []}})
    events = mapped(raw)
    assert not any(isinstance(e, ProviderBlockComplete) for e in events)
    assert any(isinstance(e, StreamError) and not e.terminal and e.provider_detail == "reasoning" for e in events)
    (complete,) = [e for e in events if isinstance(e, ToolCallComplete)]
    assert complete.id == "call_1" and complete.input == {} and "not representable" in (complete.input_error or "")
    assert isinstance(events[-1], MessageStop)
