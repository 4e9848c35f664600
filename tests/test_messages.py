from hypothesis import given
from hypothesis import strategies as st

from trioloop.protocol import (
    Message,
    PairingViolationKind,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    assert_tool_pairing,
    flatten_text,
)


def call(cid: str) -> Message:
    return Message(role="assistant", content=(ToolCallBlock(id=cid, name="t", input={}),))


def result(*cids: str) -> Message:
    return Message(role="user", content=tuple(ToolResultBlock(call_id=c, content="ok") for c in cids))


def kinds(history: list[Message]) -> list[tuple[PairingViolationKind, str]]:
    return [(v.kind, v.call_id) for v in assert_tool_pairing(history)]


def test_paired_history_has_no_violations() -> None:
    assert kinds([Message.user("hi"), call("a"), result("a"), Message.assistant("done")]) == []


def test_unanswered_call() -> None:
    assert kinds([call("a")]) == [(PairingViolationKind.UNANSWERED_TOOL_CALL, "a")]


def test_orphan_result() -> None:
    assert kinds([result("zzz")]) == [(PairingViolationKind.ORPHAN_TOOL_RESULT, "zzz")]


def test_result_in_same_message_as_call_is_orphan() -> None:
    msg = Message(
        role="assistant",
        content=(ToolCallBlock(id="a", name="t", input={}), ToolResultBlock(call_id="a", content="x")),
    )
    found = kinds([msg])
    assert (PairingViolationKind.ORPHAN_TOOL_RESULT, "a") in found
    assert (PairingViolationKind.UNANSWERED_TOOL_CALL, "a") in found


def test_result_before_call() -> None:
    found = kinds([result("a"), call("a")])
    assert found[0] == (PairingViolationKind.RESULT_BEFORE_CALL, "a")


def test_duplicate_call_id() -> None:
    found = kinds([call("a"), result("a"), call("a"), result("a")])
    assert (PairingViolationKind.DUPLICATE_TOOL_CALL_ID, "a") in found


def test_second_result_for_same_call_is_reported() -> None:
    assert kinds([call("a"), result("a"), result("a")]) == [(PairingViolationKind.ORPHAN_TOOL_RESULT, "a")]


def test_every_violation_is_returned_not_just_the_first() -> None:
    assert len(assert_tool_pairing([result("x"), call("a"), call("b")])) == 3


def test_flatten_text_joins_text_blocks_only() -> None:
    msg = Message(role="assistant", content=(TextBlock(text="a"), ToolCallBlock(id="1", name="t"), TextBlock(text="b")))
    assert flatten_text(msg) == "ab"


ids = st.text(alphabet="abc", min_size=1, max_size=2)


@given(st.lists(ids, unique=True, max_size=8))
def test_any_history_answering_each_call_later_is_pairable(call_ids: list[str]) -> None:
    history = [Message.user("go")]
    for cid in call_ids:
        history += [call(cid), result(cid)]
    assert assert_tool_pairing(history) == ()


@given(st.lists(ids, unique=True, min_size=1, max_size=8), st.data())
def test_dropping_any_result_is_detected(call_ids: list[str], data: st.DataObject) -> None:
    dropped = data.draw(st.sampled_from(call_ids))
    history = [Message.user("go")]
    for cid in call_ids:
        history.append(call(cid))
        if cid != dropped:
            history.append(result(cid))
    assert kinds(history) == [(PairingViolationKind.UNANSWERED_TOOL_CALL, dropped)]
