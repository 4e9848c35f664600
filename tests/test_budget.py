import pytest
from hypothesis import given
from hypothesis import strategies as st

from trioloop.protocol import (
    Message,
    ProtocolError,
    ProtocolErrorCode,
    ToolCallBlock,
    ToolResultBlock,
    assert_tool_pairing,
    budget_messages,
    estimate_message_tokens,
    turn_groups,
)


def test_estimate_is_chars_over_four_plus_overhead() -> None:
    assert estimate_message_tokens(Message.user("a" * 8)) == 2 + 4
    assert estimate_message_tokens(Message.user("a" * 9)) == 3 + 4


def tool_round(cid: str, size: int) -> list[Message]:
    return [
        Message(role="assistant", content=(ToolCallBlock(id=cid, name="t", input={"x": "y" * size}),)),
        Message(role="user", content=(ToolResultBlock(call_id=cid, content="z" * size),)),
    ]


def test_drops_oldest_whole_groups() -> None:
    history = [Message.user("q" * 400), *tool_round("a", 400), Message.user("newest")]
    kept = budget_messages(history, max_input_tokens=260, reserve_output_tokens=0)
    assert kept[-1] == Message.user("newest")
    assert assert_tool_pairing(kept) == ()
    assert Message.user("q" * 400) not in kept


def test_overflow_when_newest_group_does_not_fit() -> None:
    with pytest.raises(ProtocolError) as info:
        budget_messages([Message.user("x" * 4000)], max_input_tokens=100, reserve_output_tokens=10)
    assert info.value.code is ProtocolErrorCode.CONTEXT_OVERFLOW


def test_empty_history_is_fine() -> None:
    assert budget_messages([], 10, 5) == ()


def test_open_trailing_group_is_kept_whole() -> None:
    history = [*tool_round("a", 4), Message(role="assistant", content=(ToolCallBlock(id="b", name="t", input={}),))]
    assert turn_groups(history)[-1] == (history[-1],)


@given(
    st.lists(st.tuples(st.booleans(), st.integers(0, 300)), min_size=1, max_size=12),
    st.integers(20, 2000),
)
def test_budget_never_breaks_pairing_and_keeps_a_suffix(shape: list[tuple[bool, int]], limit: int) -> None:
    history: list[Message] = []
    for index, (is_tool, size) in enumerate(shape):
        history += tool_round(f"c{index}", size) if is_tool else [Message.user("u" * size)]
    try:
        kept = budget_messages(history, max_input_tokens=limit, reserve_output_tokens=10)
    except ProtocolError as err:
        assert err.code is ProtocolErrorCode.CONTEXT_OVERFLOW
        return
    assert assert_tool_pairing(kept) == ()
    assert tuple(history[len(history) - len(kept) :]) == kept
    assert sum(estimate_message_tokens(m) for m in kept) <= limit - 10
