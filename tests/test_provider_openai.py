"""The OpenAI wire: request body shape and chunk-mapping rules the shared corpus does not pin down."""

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
    ProviderBlockComplete,
    StopReason,
    StreamError,
    StreamEvent,
    TextBlock,
    TextDelta,
    ThinkingComplete,
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
from trioloop.providers.base import Messages
from trioloop.providers.openai import OPENAI_WIRE, OpenAIStreamMapper, build_openai_body
from trioloop.providers.sse import SseFrame

TOOL = ToolDefinition(name="get_entity", description="Read one.", json_schema={"type": "object"})


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> SseFrame:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return SseFrame(data=json.dumps({"model": "m", "choices": choices, **extra}))


DONE = SseFrame(data="[DONE]")


def feed(*frames: SseFrame) -> list[StreamEvent]:
    mapper = OpenAIStreamMapper()
    return [event for f in frames for event in mapper.feed(f)] + mapper.finish()


def call_fragment(
    index: int, call_id: str | None = None, name: str | None = None, arguments: str = ""
) -> dict[str, Any]:
    fragment: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
    if call_id is not None:
        fragment["id"] = call_id
        fragment["type"] = "function"
    if name is not None:
        fragment["function"]["name"] = name
    return {"tool_calls": [fragment]}


def test_body_has_leading_system_tool_messages_and_usage_option() -> None:
    history = (
        Message.user("list the flows"),
        Message(role="assistant", content=(ToolCallBlock(id="c1", name="get_entity", input={"id": "ü"}),)),
        Message(
            role="user",
            content=(
                ToolResultBlock(call_id="c1", content="found", is_error=False),
                TextBlock(text="thanks"),
            ),
        ),
        Message(role="assistant", content=(TextBlock(text="Done "), TextBlock(text="now."))),
        Message(role="user", content=(ToolResultBlock(call_id="c9", content="late"),)),
    )
    body = build_openai_body(ChatRequest(model="m", system="Be terse.", messages=history, tools=(TOOL,), max_tokens=9))
    assert body == {
        "model": "m",
        "max_completion_tokens": 9,
        "stream": True,
        "stream_options": {"include_usage": True},
        "tools": [
            {
                "type": "function",
                "function": {"name": "get_entity", "description": "Read one.", "parameters": {"type": "object"}},
            }
        ],
        "messages": [
            {"role": "system", "content": "Be terse."},
            {"role": "user", "content": "list the flows"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_entity", "arguments": '{"id":"ü"}'}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "found"},
            {"role": "user", "content": "thanks"},
            {"role": "assistant", "content": "Done now."},
            {"role": "tool", "tool_call_id": "c9", "content": "late"},
        ],
    }


def test_body_without_system_or_tools() -> None:
    body = build_openai_body(ChatRequest(model="m", messages=(Message.user(""),)))
    assert body["messages"] == [{"role": "user", "content": ""}] and "tools" not in body


def test_index_change_completes_the_previous_call() -> None:
    events = feed(
        chunk({"role": "assistant"}),
        chunk(call_fragment(0, "a", "first", '{"x":')),
        chunk(call_fragment(0, arguments="1}")),
        chunk(call_fragment(1, "b", "second")),
        chunk({}, "tool_calls"),
        DONE,
    )
    assert events == [
        MessageStart(model="m"),
        ToolCallStart(id="a", name="first"),
        ToolCallInputDelta(id="a", partial_json='{"x":'),
        ToolCallInputDelta(id="a", partial_json="1}"),
        ToolCallComplete(id="a", name="first", input={"x": 1}),
        ToolCallStart(id="b", name="second"),
        ToolCallComplete(id="b", name="second", input={}),
        MessageStop(stop_reason=StopReason.TOOL_USE),
    ]


def test_fragment_for_a_finished_index_or_an_unnamed_call_is_an_orphan() -> None:
    events = feed(
        chunk(call_fragment(0, "a", "first", "{}")),
        chunk(call_fragment(1, "b", "second", "{}")),
        chunk(call_fragment(0, arguments='{"late": 1}')),
        chunk(call_fragment(2, "c", None, "{}")),
        chunk({}, "tool_calls"),
        DONE,
    )
    orphans = [e for e in events if isinstance(e, StreamError)]
    assert [e.message for e in orphans] == [Messages.ORPHAN_ARGUMENTS] * 2
    assert all(not e.terminal for e in orphans)
    assert [e.id for e in events if isinstance(e, ToolCallComplete)] == ["a", "b"]


def test_text_tool_calls_and_finish_in_one_chunk_keep_their_order() -> None:
    delta = {"content": "ok", **call_fragment(0, "a", "f", "{}")}
    events = feed(chunk(delta, "tool_calls"), chunk(None, usage={"prompt_tokens": 3, "completion_tokens": 4}), DONE)
    assert events == [
        MessageStart(model="m"),
        TextDelta(text="ok"),
        ToolCallStart(id="a", name="f"),
        ToolCallInputDelta(id="a", partial_json="{}"),
        ToolCallComplete(id="a", name="f", input={}),
        Usage(input_tokens=3, output_tokens=4),
        MessageStop(stop_reason=StopReason.TOOL_USE),
    ]


def test_refusal_field_reads_as_text_with_a_refusal_stop() -> None:
    events = feed(chunk({"role": "assistant", "refusal": None}), chunk({"refusal": "I can't"}), chunk({}, "stop"), DONE)
    assert events == [MessageStart(model="m"), TextDelta(text="I can't"), MessageStop(stop_reason=StopReason.REFUSAL)]
    assert feed(chunk({"refusal": 3}))[-2].terminal is False  # type: ignore[union-attr]


def test_chunk_without_model_still_starts_the_message() -> None:
    events = feed(SseFrame(data='{"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"stop"}]}'), DONE)
    assert events == [MessageStart(model=""), TextDelta(text="x"), MessageStop(stop_reason=StopReason.END_TURN)]


def test_only_the_first_choice_is_read() -> None:
    frame = SseFrame(
        data=json.dumps({"choices": [{"index": 1, "delta": {"content": "B"}}, {"index": 0, "delta": {"content": "A"}}]})
    )
    assert TextDelta(text="A") in feed(frame, DONE) and TextDelta(text="B") not in feed(frame, DONE)


def test_error_chunks() -> None:
    for error, code in [
        (
            {"message": "quota", "type": "insufficient_quota", "code": "insufficient_quota"},
            ProtocolErrorCode.RATE_LIMITED,
        ),
        ({"message": "slow", "type": "requests", "code": "rate_limit_exceeded"}, ProtocolErrorCode.RATE_LIMITED),
        ({"message": "boom", "type": "server_error", "code": None}, ProtocolErrorCode.HTTP_STATUS),
        ("plain text", ProtocolErrorCode.HTTP_STATUS),
    ]:
        events = feed(chunk({"content": "x"}), SseFrame(data=json.dumps({"error": error})), DONE)
        assert isinstance(events[-1], StreamError) and events[-1].code is code and events[-1].terminal
        assert events[-1].provider_detail in ("quota", "slow", "boom", "plain text")


def test_malformed_chunks_are_notices_and_keep_what_was_valid() -> None:
    for data in (
        '{"choices": "nope"}',
        '{"choices": [{"index": 0, "delta": {"content": 7}}]}',
        '{"choices": [{"index": 0, "delta": {"tool_calls": [{"index": "0"}]}}]}',
        '{"usage": [1]}',
        "[1, 2, 3]",
        '{"choices": [], "usage": {"prompt_tokens": Infinity}}',
    ):
        events = OpenAIStreamMapper().feed(SseFrame(data=data))
        assert isinstance(events[-1], StreamError) and not events[-1].terminal, data


def test_a_content_part_whose_type_is_not_text_is_skipped_not_a_crash() -> None:
    # Found by the stream fuzzer: a list-typed "type" was looked up in a frozenset (unhashable).
    for kind in ([], {}, 7, None):
        events = OpenAIStreamMapper().feed(chunk({"content": [{"type": kind}, {"type": "text", "text": "ok"}]}))
        assert [e.text for e in events if isinstance(e, TextDelta)] == ["ok"], kind


def test_finish_reason_mapping() -> None:
    for reason, expected in [
        ("stop", StopReason.END_TURN),
        ("tool_calls", StopReason.TOOL_USE),
        ("length", StopReason.MAX_TOKENS),
        ("content_filter", StopReason.REFUSAL),
        ("function_call", StopReason.OTHER),
        ("brand_new", StopReason.OTHER),
        ("model_length", StopReason.MAX_TOKENS),  # Mistral
        ("eos_token", StopReason.END_TURN),  # TGI before v2.2
        ("stop_sequence", StopReason.STOP_SEQUENCE),  # TGI
    ]:
        assert feed(chunk({}, reason), DONE)[-1] == MessageStop(stop_reason=expected)


def test_finish_reasons_that_mean_the_answer_broke_off_are_failures() -> None:
    for reason, before, after in [
        ("error", Messages.STREAM_PROVIDER_ERROR, Messages.STREAM_PROVIDER_ERROR),
        ("insufficient_system_resource", Messages.SERVER_ERROR, Messages.STREAM_PROVIDER_ERROR),
    ]:
        # Before any content the failure is all there is (and a server error may be retried) ...
        assert feed(chunk({}, reason), DONE) == [
            StreamError(code=ProtocolErrorCode.HTTP_STATUS, message=before, provider_detail=reason)
        ]
        # ... after some, the content stays and the stream still ends failed, never as a short answer.
        events = feed(chunk({"content": "Half"}, reason), DONE)
        assert events == [
            MessageStart(model="m"),
            TextDelta(text="Half"),
            StreamError(code=ProtocolErrorCode.HTTP_STATUS, message=after, provider_detail=reason),
        ]


def test_usage_carries_cache_reads_and_reasoning_tokens() -> None:
    usage = {
        "prompt_tokens": 30,
        "completion_tokens": 20,
        "prompt_tokens_details": {"cached_tokens": 12},
        "completion_tokens_details": {"reasoning_tokens": 15},
    }
    events = feed(chunk({}, "stop"), chunk(None, usage=usage), DONE)
    assert Usage(input_tokens=30, output_tokens=20, cache_read_input_tokens=12, reasoning_tokens=15) in events


def test_error_body_description() -> None:
    body = {
        "error": {
            "message": "maximum context length",
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
        }
    }
    described = OPENAI_WIRE.describe_error_body(json.dumps(body).encode())
    assert described.context_overflow and described.detail == "context_length_exceeded: maximum context length"
    assert not OPENAI_WIRE.describe_error_body(b"{}").context_overflow


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)
_fragment = st.fixed_dictionaries(
    {},
    optional={
        "index": st.integers(-1, 3) | _json,
        "id": st.sampled_from(["a", "b", ""]) | _json,
        "function": st.fixed_dictionaries(
            {}, optional={"name": st.sampled_from(["f", ""]) | _json, "arguments": st.text(max_size=6) | _json}
        )
        | _json,
    },
)
_chunk = st.fixed_dictionaries(
    {},
    optional={
        "model": _json,
        "choices": st.lists(
            st.fixed_dictionaries(
                {},
                optional={
                    "index": st.just(0) | _json,
                    "delta": st.fixed_dictionaries(
                        {},
                        optional={
                            "content": st.text(max_size=4) | _json,
                            "reasoning_content": st.text(max_size=4) | _json,
                            "reasoning": st.text(max_size=4) | _json,
                            "reasoning_details": st.lists(
                                st.fixed_dictionaries(
                                    {},
                                    optional={
                                        "type": st.sampled_from(["reasoning.text", "reasoning.encrypted"]) | _json,
                                        "index": st.integers(-1, 2) | _json,
                                        "text": st.text(max_size=4) | _json,
                                        "signature": st.text(max_size=4) | _json,
                                        "data": st.text(max_size=4) | _json,
                                    },
                                )
                                | _json,
                                max_size=2,
                            )
                            | _json,
                            "tool_calls": st.lists(_fragment, max_size=2),
                        },
                    )
                    | _json,
                    "finish_reason": st.sampled_from(["stop", "tool_calls", "x", "error", "model_length"]) | _json,
                    "usage": _json,
                },
            ),
            max_size=2,
        )
        | _json,
        "usage": _json,
        "error": st.none() | _json,
    },
)


@settings(max_examples=150, deadline=None)
@given(frames=st.lists(_chunk.map(json.dumps) | st.sampled_from(["[DONE]", "", "{", "null"]), max_size=12))
def test_never_crashes_and_nothing_follows_a_terminal_event(frames: list[str]) -> None:
    mapper = OpenAIStreamMapper()
    events: list[StreamEvent] = []
    for data in frames:
        events += mapper.feed(SseFrame(data=data))
    events += mapper.finish()
    assert [i for i, e in enumerate(events) if is_terminal(e)] == [len(events) - 1]
    started = [e.id for e in events if isinstance(e, ToolCallStart)]
    completed = [e.id for e in events if isinstance(e, ToolCallComplete)]
    assert set(completed) <= set(started) and all(completed) and len(completed) <= len(started)
    assert sum(isinstance(e, MessageStart) for e in events) <= 1
    # Every streamed piece of reasoning is in exactly one block when the stream completes.
    if isinstance(events[-1], MessageStop):
        thought = "".join(e.text for e in events if isinstance(e, ThinkingDelta))
        kept = "".join(e.block.thinking for e in events if isinstance(e, ThinkingComplete))  # type: ignore[union-attr]
        assert kept == thought
    for event in events:
        if isinstance(event, ProviderBlockComplete):
            assert isinstance(json.loads(event.block.data)["reasoning_details"], list)
