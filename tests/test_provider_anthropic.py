"""The Anthropic wire: request body shape and mapper rules the shared corpus does not pin down."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

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
    ToolCallBlock,
    ToolCallComplete,
    ToolCallInputDelta,
    ToolCallStart,
    ToolDefinition,
    ToolResultBlock,
    Usage,
    is_terminal,
)
from trioloop.providers.anthropic import (
    ANTHROPIC_WIRE,
    AnthropicRequestOptions,
    AnthropicStreamMapper,
    build_anthropic_body,
)
from trioloop.providers.base import Messages
from trioloop.providers.sse import SseFrame

TOOL = ToolDefinition(name="get_entity", description="Read one.", json_schema={"type": "object", "properties": {}})


def frame(event: str, **data: Any) -> SseFrame:
    return SseFrame(event=event, data=json.dumps({"type": event, **data}))


def feed(*frames: SseFrame) -> list[StreamEvent]:
    mapper = AnthropicStreamMapper()
    return [event for f in frames for event in mapper.feed(f)] + mapper.finish()


def test_body_has_top_level_system_blocks_and_stream() -> None:
    history = (
        Message.user("list the flows"),
        Message(
            role="assistant",
            content=(TextBlock(text="Looking."), ToolCallBlock(id="t1", name="get_entity", input={"id": "a"})),
        ),
        Message(
            role="user",
            content=(TextBlock(text="and then?"), ToolResultBlock(call_id="t1", content="boom", is_error=True)),
        ),
    )
    body = build_anthropic_body(
        ChatRequest(model="m", system="Be terse.", messages=history, tools=(TOOL,), max_tokens=77),
        AnthropicRequestOptions(prompt_caching=False),
    )
    assert body == {
        "model": "m",
        "max_tokens": 77,
        "stream": True,
        "system": "Be terse.",
        "tools": [
            {"name": "get_entity", "description": "Read one.", "input_schema": {"type": "object", "properties": {}}}
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "list the flows"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Looking."},
                    {"type": "tool_use", "id": "t1", "name": "get_entity", "input": {"id": "a"}},
                ],
            },
            {
                "role": "user",
                "content": [  # tool results lead the message, as the API requires
                    {"type": "tool_result", "tool_use_id": "t1", "content": "boom", "is_error": True},
                    {"type": "text", "text": "and then?"},
                ],
            },
        ],
    }


def test_body_omits_empty_system_tools_and_empty_text() -> None:
    history = (
        Message(role="assistant", content=(TextBlock(text=""), ToolCallBlock(id="t", name="x", input=[1]))),
        Message(role="user", content=(TextBlock(text=""),)),
    )
    body = build_anthropic_body(ChatRequest(model="m", messages=history), AnthropicRequestOptions(prompt_caching=False))
    assert "system" not in body and "tools" not in body
    assert body["messages"] == [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "x", "input": {}}]}
    ]


def test_events_before_message_start_get_a_synthesized_start() -> None:
    events = feed(
        frame("content_block_delta", index=0, delta={"type": "text_delta", "text": "hi"}),
        frame("message_stop"),
    )
    assert events == [MessageStart(model=""), TextDelta(text="hi"), MessageStop(stop_reason=StopReason.OTHER)]


def test_nothing_after_a_terminal_event() -> None:
    mapper = AnthropicStreamMapper()
    assert mapper.feed(frame("message_stop"))[-1] == MessageStop(stop_reason=StopReason.OTHER)
    assert mapper.done
    assert mapper.feed(frame("content_block_delta", index=0, delta={"type": "text_delta", "text": "late"})) == []
    assert mapper.finish() == []


def test_usage_sums_cache_tokens_and_prefers_the_delta_count() -> None:
    start = frame("message_start", message={"model": "m", "usage": {"input_tokens": 5, "cache_read_input_tokens": 100}})
    assert feed(start, frame("message_delta", delta={}, usage={"output_tokens": 3}))[1] == Usage(
        input_tokens=105, output_tokens=3, cache_read_input_tokens=100
    )
    assert feed(start, frame("message_delta", delta={}, usage={"input_tokens": 9, "output_tokens": 3}))[1] == Usage(
        input_tokens=9, output_tokens=3, cache_read_input_tokens=100
    )
    assert feed(start, frame("message_delta", delta={}, usage={"output_tokens": -1}))[1] == Usage(
        input_tokens=105, output_tokens=0, cache_read_input_tokens=100
    )


def test_api_error_types_and_detail() -> None:
    text = frame("content_block_delta", index=0, delta={"type": "text_delta", "text": "hi"})
    *_, error = feed(text, frame("error", error={"type": "api_error", "message": "Internal"}))
    assert error == StreamError(
        code=ProtocolErrorCode.HTTP_STATUS, message=Messages.STREAM_PROVIDER_ERROR, provider_detail="Internal"
    )
    # Before any content an overload or api error is a temporary server error: retried like HTTP 529.
    for kind in ("overloaded_error", "api_error"):
        [error] = feed(frame("message_start", message={"model": "m"}), frame("error", error={"type": kind}))
        assert error == StreamError(
            code=ProtocolErrorCode.HTTP_STATUS, message=Messages.SERVER_ERROR, provider_detail=kind
        )
    [error] = feed(frame("error", error={"type": "rate_limit_error"}))
    assert isinstance(error, StreamError) and error.code is ProtocolErrorCode.RATE_LIMITED
    assert error.provider_detail == "rate_limit_error"


def test_malformed_shapes_are_notices() -> None:
    bad = [
        frame("content_block_start", index=0, content_block={"type": "tool_use", "id": "t", "name": ""}),
        frame("content_block_start", index=-1, content_block={"type": "text", "text": ""}),
        frame("content_block_delta", index=0, delta={"type": "text_delta", "text": 5}),
        frame("message_delta", delta="end_turn"),
        frame("message_start", message=None),
        frame("error", error="oops"),
        SseFrame(event="ping", data="[1, 2]"),
        SseFrame(event="content_block_delta", data='{"type": "content_block_delta", "index": NaN}'),
    ]
    for item in bad:
        events = AnthropicStreamMapper().feed(item)
        assert events[:-1] in ([], [MessageStart(model="")]), item
        assert isinstance(events[-1], StreamError) and not events[-1].terminal, item


def test_duplicate_keys_and_deep_nesting_make_an_unreadable_call_without_crashing() -> None:
    def call(arguments: str) -> list[StreamEvent]:
        return feed(
            frame("content_block_start", index=0, content_block={"type": "tool_use", "id": "t", "name": "n"}),
            frame("content_block_delta", index=0, delta={"type": "input_json_delta", "partial_json": arguments}),
            frame("content_block_stop", index=0),
            frame("message_stop"),
        )

    for arguments in ('{"id": "a", "id": "b"}', "[" * 100_000 + "]" * 100_000, '{"a": 1} trailing'):
        events = call(arguments)
        (complete,) = [e for e in events if isinstance(e, ToolCallComplete)]
        assert complete.input == {} and (complete.input_error or "").startswith(Messages.BAD_TOOL_ARGUMENTS)
    assert ToolCallComplete(id="t", name="n", input={"ok": [1.5, None]}) in call('{"ok": [1.5, null]}')


def test_a_tool_use_without_an_id_gets_one_of_ours_unique_in_the_response() -> None:
    # Issue 40: an empty, missing or null id made the call vanish behind a notice; like the other wires, the
    # call now gets an id (toolu_<index>, suffixed while this response already holds it) and flows as any call.
    def call(index: int, **content_block: Any) -> list[SseFrame]:
        opening = frame("content_block_start", index=index, content_block={"type": "tool_use", **content_block})
        return [opening, frame("content_block_stop", index=index)]

    events = feed(
        frame("message_start", message={"model": "m", "content": []}),
        frame("content_block_start", index=0, content_block={"type": "tool_use", "id": "", "name": "get_entity"}),
        frame("content_block_delta", index=0, delta={"type": "input_json_delta", "partial_json": '{"id": '}),
        frame("content_block_delta", index=0, delta={"type": "input_json_delta", "partial_json": '"a"}'}),
        frame("content_block_stop", index=0),
        *call(1, id="toolu_2", name="get_entity", input={"id": "b"}),  # a server's own id: untouched
        *call(2, name="get_entity", input={"id": "c"}),  # no id, and toolu_2 is taken
        *call(3, id=None, name="get_entity"),
        frame("message_delta", delta={"stop_reason": "tool_use"}),
        frame("message_stop"),
    )
    assert events == [
        MessageStart(model="m"),
        ToolCallStart(id="toolu_0", name="get_entity"),
        ToolCallInputDelta(id="toolu_0", partial_json='{"id": '),
        ToolCallInputDelta(id="toolu_0", partial_json='"a"}'),
        ToolCallComplete(id="toolu_0", name="get_entity", input={"id": "a"}),
        ToolCallStart(id="toolu_2", name="get_entity"),
        ToolCallComplete(id="toolu_2", name="get_entity", input={"id": "b"}),
        ToolCallStart(id="toolu_2_1", name="get_entity"),
        ToolCallComplete(id="toolu_2_1", name="get_entity", input={"id": "c"}),
        ToolCallStart(id="toolu_3", name="get_entity"),
        ToolCallComplete(id="toolu_3", name="get_entity", input={}),
        MessageStop(stop_reason=StopReason.TOOL_USE),
    ]
    # A block already in message_start is read the same way.
    block = {"type": "tool_use", "id": "", "name": "get_entity", "input": {"id": "d"}}
    started = feed(frame("message_start", message={"model": "m", "content": [block]}), frame("message_stop"))
    assert ToolCallComplete(id="toolu_0", name="get_entity", input={"id": "d"}) in started
    assert not any(isinstance(e, StreamError) for e in started)


def test_server_block_deltas_are_its_input_not_orphans_and_never_a_call() -> None:
    events = feed(
        frame("content_block_start", index=0, content_block={"type": "server_tool_use", "id": "s", "name": "web"}),
        frame("content_block_delta", index=0, delta={"type": "input_json_delta", "partial_json": '{"q": 1}'}),
        frame("content_block_stop", index=0),
        frame("message_stop"),
    )
    data = '{"type":"server_tool_use","id":"s","name":"web","input":{"q":1}}'
    assert events == [
        MessageStart(model=""),
        ProviderBlockComplete(block=ProviderBlock(wire="anthropic", kind="server_tool_use", data=data)),
        MessageStop(stop_reason=StopReason.OTHER),
    ]


def test_error_body_description() -> None:
    body = json.dumps({"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 1"}})
    described = ANTHROPIC_WIRE.describe_error_body(body.encode())
    assert described.context_overflow and described.detail == "invalid_request_error: prompt is too long: 1"
    assert ANTHROPIC_WIRE.describe_error_body(b"\xff oops").detail == "\ufffd oops"


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)
_events = st.sampled_from(
    [
        "message",
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
        "ping",
        "error",
        "other",
    ]
)
_payloads = st.fixed_dictionaries(
    {},
    optional={
        "type": _events,
        "index": st.integers(-1, 3) | _json,
        "message": st.fixed_dictionaries({}, optional={"model": _json, "usage": _json}) | _json,
        "content_block": st.fixed_dictionaries(
            {}, optional={"type": st.sampled_from(["text", "tool_use", "x"]), "id": _json, "name": _json, "text": _json}
        ),
        "delta": st.fixed_dictionaries(
            {},
            optional={
                "type": st.sampled_from(["text_delta", "input_json_delta", "x"]),
                "text": _json,
                "partial_json": st.text(max_size=8),
                "stop_reason": _json,
            },
        ),
        "usage": _json,
        "error": _json,
    },
)


@settings(max_examples=100, deadline=None)
@given(frames=st.lists(st.tuples(_events, _payloads | st.text(max_size=10)), max_size=12))
def test_never_crashes_and_nothing_follows_a_terminal_event(frames: list[tuple[str, Any]]) -> None:
    mapper = AnthropicStreamMapper()
    events: list[StreamEvent] = []
    for event, payload in frames:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        events += mapper.feed(SseFrame(event=event, data=data))
    events += mapper.finish()
    terminals = [i for i, e in enumerate(events) if is_terminal(e)]
    assert terminals == [len(events) - 1]
    started = {e.id for e in events if isinstance(e, ToolCallStart)}
    assert {e.id for e in events if isinstance(e, ToolCallComplete)} <= started
    assert sum(isinstance(e, MessageStart) for e in events) <= 1
