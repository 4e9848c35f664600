import pytest
from hypothesis import given
from hypothesis import strategies as st

from trioloop.protocol import (
    Aborted,
    Message,
    MessageStart,
    MessageStop,
    ProviderBlock,
    ProviderBlockComplete,
    RedactedThinkingBlock,
    SerializationError,
    StopReason,
    StreamError,
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
    event_from_json,
    event_to_json,
    message_from_json,
    message_to_json,
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)
provider_blocks = st.builds(
    ProviderBlock,
    wire=st.sampled_from(["anthropic", "openai-responses"]),
    kind=st.text(max_size=12),
    data=st.text(max_size=30),
)
blocks = st.one_of(
    st.builds(TextBlock, text=st.text(max_size=20)),
    st.builds(ToolCallBlock, id=st.text(max_size=8), name=st.text(max_size=8), input=json_values),
    st.builds(ToolResultBlock, call_id=st.text(max_size=8), content=st.text(max_size=20), is_error=st.booleans()),
    st.builds(ThinkingBlock, thinking=st.text(max_size=20), signature=st.text(max_size=8), source=st.text(max_size=8)),
    st.builds(RedactedThinkingBlock, data=st.text(max_size=20)),
    provider_blocks,
)
thinking_blocks = st.one_of(
    st.builds(ThinkingBlock, thinking=st.text(max_size=20), signature=st.text(max_size=8)),
    st.builds(RedactedThinkingBlock, data=st.text(max_size=20)),
)
messages = st.builds(Message, role=st.sampled_from(["user", "assistant"]), content=st.lists(blocks, max_size=4))
events = st.one_of(
    st.builds(MessageStart, model=st.text(max_size=8)),
    st.builds(TextDelta, text=st.text(max_size=20)),
    st.builds(ThinkingDelta, text=st.text(max_size=20)),
    st.builds(ThinkingComplete, block=thinking_blocks),
    st.builds(ProviderBlockComplete, block=provider_blocks),
    st.builds(ToolCallStart, id=st.text(max_size=8), name=st.text(max_size=8)),
    st.builds(ToolCallInputDelta, id=st.text(max_size=8), partial_json=st.text(max_size=8)),
    st.builds(
        ToolCallComplete,
        id=st.text(max_size=8),
        name=st.text(max_size=8),
        input=json_values,
        input_error=st.none() | st.text(max_size=8),
    ),
    st.builds(
        Usage,
        input_tokens=st.integers(0, 10**6),
        output_tokens=st.integers(0, 10**6),
        cache_read_input_tokens=st.integers(0, 10**6),
        cache_creation_input_tokens=st.integers(0, 10**6),
        reasoning_tokens=st.integers(0, 10**6),
    ),
    st.builds(MessageStop, stop_reason=st.sampled_from(list(StopReason))),
    st.builds(
        StreamError,
        code=st.sampled_from(["transport", "http_status", "rate_limited"]),
        message=st.text(max_size=20),
        provider_detail=st.none() | st.text(max_size=40),
        retry_after=st.none() | st.floats(0, 600),
    ),
    st.builds(StreamError, code=st.just("malformed_stream"), message=st.text(max_size=5), terminal=st.just(False)),
    st.just(Aborted()),
)


@given(messages)
def test_messages_round_trip(message: Message) -> None:
    assert message_from_json(message_to_json(message)) == message


@given(events)
def test_events_round_trip(event: object) -> None:
    assert event_from_json(event_to_json(event)) == event  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "bad",
    [
        None,
        [],
        {"role": "system", "content": []},
        {"role": "user", "content": [{"type": "image"}]},
        {"role": "user", "content": [{"type": "text"}]},
        {"role": "user", "content": [{"type": "text", "text": "x", "extra": 1}]},
    ],
)
def test_invalid_message_json_is_a_typed_error(bad: object) -> None:
    with pytest.raises(SerializationError):
        message_from_json(bad)


def test_invalid_event_json_is_a_typed_error() -> None:
    with pytest.raises(SerializationError):
        event_from_json({"type": "message_stop", "stop_reason": "bogus"})
    with pytest.raises(SerializationError):
        event_from_json({"type": "nope"})
