"""commit_tool_outcome's refusal order, the once-per-turn snapshot, and whole-turn undo."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trioloop.machine.tools import RegisteredTool, ToolOutcome
from trioloop.machine.transaction import (
    Committed,
    Refusal,
    Refused,
    Unchanged,
    UndoAvailability,
    UndoEntry,
    UndoHistory,
    commit_tool_outcome,
    turn_undo_availability,
    undo_turn,
)
from trioloop.runtime.tools import define_executable_tool
from trioloop.threatmodel import THREAT_MODEL
from trioloop.threatmodel.model import DataFlow, Element, Metadata, ThreatModel


@attrs.frozen(kw_only=True)
class Empty:
    pass


def _tool(effect: str) -> RegisteredTool:
    return define_executable_tool(
        name=f"{effect}_tool",
        description="test tool",
        effect=effect,  # type: ignore[arg-type]
        destructive=False,
        input_type=Empty,
        run=lambda value, ctx: ToolOutcome.success("ok"),
        summarize=lambda value: "test",
    )


READ = _tool("read")
MUTATE = _tool("mutate")

BASE = ThreatModel(metadata=Metadata(title="Shop"), elements=(Element(id="web", type="process", name="Web"),))


def retitled(document: ThreatModel, title: str) -> ThreatModel:
    return attrs.evolve(document, metadata=attrs.evolve(document.metadata, title=title))


def commit(
    live: ThreatModel,
    outcome: ToolOutcome,
    *,
    snapshot: ThreatModel | None = None,
    tool: RegisteredTool = MUTATE,
    history: UndoHistory | None = None,
    turn_id: str = "t1",
) -> Committed | Unchanged | Refused:
    return commit_tool_outcome(
        live,
        live if snapshot is None else snapshot,
        outcome,
        tool,
        history or UndoHistory(),
        turn_id=turn_id,
        kind=THREAT_MODEL,
    )


# -- refusals, first wins -------------------------------------------------------------------------------


def test_a_failed_tool_is_refused_with_its_own_text() -> None:
    result = commit(BASE, ToolOutcome.failure("could not find it"))
    assert result == Refused(refusal=Refusal.TOOL_ERROR, result="could not find it")


def test_a_success_without_a_document_is_unchanged() -> None:
    assert commit(BASE, ToolOutcome.success("read it"), tool=READ) == Unchanged(result="read it")
    assert commit(BASE, ToolOutcome.success("nothing to do")) == Unchanged(result="nothing to do")


def test_a_read_tool_proposing_a_document_is_refused() -> None:
    result = commit(BASE, ToolOutcome.success("ok", document=retitled(BASE, "Hacked")), tool=READ)
    assert isinstance(result, Refused) and result.refusal is Refusal.READ_TOOL_MUTATED


def test_a_document_changed_under_the_call_is_refused_even_when_equal() -> None:
    proposed = retitled(BASE, "New")
    changed = commit(retitled(BASE, "Other"), ToolOutcome.success("ok", document=proposed), snapshot=BASE)
    assert isinstance(changed, Refused) and changed.refusal is Refusal.DOCUMENT_CHANGED
    equal_copy = attrs.evolve(BASE)
    assert equal_copy == BASE and equal_copy is not BASE
    refused = commit(equal_copy, ToolOutcome.success("ok", document=proposed), snapshot=BASE)
    assert isinstance(refused, Refused) and refused.refusal is Refusal.DOCUMENT_CHANGED


def test_an_invalid_document_is_refused_with_the_validators_message() -> None:
    broken = attrs.evolve(BASE, data_flows=(DataFlow(id="f1", source="web", target="ghost"),))
    result = commit(BASE, ToolOutcome.success("ok", document=broken))
    assert isinstance(result, Refused) and result.refusal is Refusal.INVALID_DOCUMENT
    assert "ghost" in result.result and "f1" in result.result


def test_refusal_order_tool_error_then_read_then_changed_then_invalid() -> None:
    broken = attrs.evolve(BASE, version="9.9")
    other = retitled(BASE, "Other")

    def refusal(outcome: ToolOutcome, tool: RegisteredTool) -> Refusal:
        result = commit(other, outcome, snapshot=BASE, tool=tool)
        assert isinstance(result, Refused)
        return result.refusal

    assert refusal(ToolOutcome(ok=False, result="x", document=broken), READ) is Refusal.TOOL_ERROR
    assert refusal(ToolOutcome.success("x", document=broken), READ) is Refusal.READ_TOOL_MUTATED
    assert refusal(ToolOutcome.success("x", document=broken), MUTATE) is Refusal.DOCUMENT_CHANGED
    result = commit(BASE, ToolOutcome.success("x", document=broken))
    assert isinstance(result, Refused) and result.refusal is Refusal.INVALID_DOCUMENT


# -- commit and the once-per-turn snapshot ------------------------------------------------------------


def test_the_first_commit_pushes_the_pre_turn_document_and_later_ones_do_not() -> None:
    first = commit(BASE, ToolOutcome.success("renamed", document=retitled(BASE, "A")))
    assert isinstance(first, Committed) and first.result == "renamed"
    assert first.history.entries == (UndoEntry(turn_id="t1", document=BASE),)
    assert first.history.top is not None and first.history.top.document is BASE
    second = commit(first.document, ToolOutcome.success("again", document=retitled(BASE, "B")), history=first.history)
    assert isinstance(second, Committed) and second.history is first.history
    third = commit(
        second.document,
        ToolOutcome.success("next turn", document=retitled(BASE, "C")),
        history=second.history,
        turn_id="t2",
    )
    assert isinstance(third, Committed)
    assert [e.turn_id for e in third.history.entries] == ["t1", "t2"]
    assert third.history.entries[1].document is second.document


def test_history_keeps_twenty_entries_dropping_the_oldest() -> None:
    history = UndoHistory()
    for index in range(25):
        history = history.push(UndoEntry(turn_id=f"t{index}", document=retitled(BASE, str(index))))
    assert history.max_entries == 20 and len(history.entries) == 20
    assert [e.turn_id for e in history.entries] == [f"t{i}" for i in range(5, 25)]


def test_undo_history_is_immutable() -> None:
    history = UndoHistory()
    pushed = history.push(UndoEntry(turn_id="t", document=BASE))
    assert history.entries == () and pushed.entries != ()
    assert pushed.pop().entries == () and pushed.entries != ()
    assert UndoHistory().pop() == UndoHistory()
    with pytest.raises(ValueError):
        UndoHistory(max_entries=0)


# -- undo ----------------------------------------------------------------------------------------------


def _turn(live: ThreatModel, history: UndoHistory, turn_id: str, *titles: str) -> tuple[ThreatModel, UndoHistory]:
    for title in titles:
        result = commit(
            live, ToolOutcome.success("ok", document=retitled(live, title)), history=history, turn_id=turn_id
        )
        assert isinstance(result, Committed)
        live, history = result.document, result.history
    return live, history


def test_undo_restores_exactly_the_pre_turn_document() -> None:
    live, history = _turn(BASE, UndoHistory(), "t1", "A", "B", "C")
    assert turn_undo_availability(history, "t1") is UndoAvailability.UNDOABLE
    assert turn_undo_availability(history, "t1").undoable
    undone = undo_turn(history, live, "t1")
    assert undone is not None
    restored, after = undone
    assert restored is BASE and after.entries == ()
    assert turn_undo_availability(after, "t1") is UndoAvailability.ALREADY_UNDONE
    assert undo_turn(after, restored, "t1") is None


def test_a_turn_that_committed_nothing_has_nothing_to_undo() -> None:
    _, history = _turn(BASE, UndoHistory(), "t1", "A")
    assert turn_undo_availability(history, "t0") is UndoAvailability.NOTHING_TO_UNDO
    assert turn_undo_availability(UndoHistory(), "t1") is UndoAvailability.NOTHING_TO_UNDO
    assert not UndoAvailability.NOTHING_TO_UNDO.undoable


def test_a_later_turn_supersedes_an_earlier_one() -> None:
    live, history = _turn(BASE, UndoHistory(), "t1", "A")
    live, history = _turn(live, history, "t2", "B")
    assert turn_undo_availability(history, "t1") is UndoAvailability.SUPERSEDED
    assert undo_turn(history, live, "t1") is None
    assert turn_undo_availability(history, "t2") is UndoAvailability.UNDOABLE


def test_after_twenty_unrelated_pushes_the_turn_is_superseded_not_aliased() -> None:
    live, history = _turn(BASE, UndoHistory(), "t1", "A")
    for index in range(20):
        history = history.push(UndoEntry(turn_id=f"other{index}", document=retitled(BASE, str(index))))
    assert all(e.turn_id != "t1" for e in history.entries)
    assert turn_undo_availability(history, "t1") is UndoAvailability.SUPERSEDED
    assert turn_undo_availability(history, "t1", BASE) is UndoAvailability.SUPERSEDED
    assert undo_turn(history, live, "t1") is None


def test_the_snapshot_is_compared_by_value_with_the_top_entry() -> None:
    _, history = _turn(BASE, UndoHistory(), "t1", "A")
    assert turn_undo_availability(history, "t1", attrs.evolve(BASE)) is UndoAvailability.UNDOABLE
    assert turn_undo_availability(history, "t1", retitled(BASE, "else")) is UndoAvailability.SUPERSEDED


# -- a model of the stack -----------------------------------------------------------------------------

operations = st.lists(
    st.one_of(st.tuples(st.just("push"), st.integers(min_value=0, max_value=6)), st.tuples(st.just("pop"), st.just(0))),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(operations, st.integers(min_value=1, max_value=5))
def test_availability_agrees_with_a_list_model(ops: list[tuple[str, int]], cap: int) -> None:
    history = UndoHistory(max_entries=cap)
    stack: list[str] = []
    fate: dict[str, UndoAvailability] = {}
    for op, turn in ops:
        if op == "push":
            name = f"t{turn}"
            history = history.push(UndoEntry(turn_id=name, document=retitled(BASE, name)))
            stack.append(name)
            for trimmed in stack[:-cap]:
                fate[trimmed] = UndoAvailability.SUPERSEDED
            stack = stack[-cap:]
        elif stack:
            fate[stack.pop()] = UndoAvailability.ALREADY_UNDONE
            history = history.pop()
        assert [e.turn_id for e in history.entries] == stack
    for turn in range(7):
        name = f"t{turn}"
        if stack and stack[-1] == name:
            expected = UndoAvailability.UNDOABLE
        elif name in stack:
            expected = UndoAvailability.SUPERSEDED
        else:
            expected = fate.get(name, UndoAvailability.NOTHING_TO_UNDO)
        got = turn_undo_availability(history, name)
        # ``retired`` keeps only the newest cap records; older fates may be forgotten.
        assert got is expected or (got is UndoAvailability.NOTHING_TO_UNDO and name in fate)
        assert (undo_turn(history, BASE, name) is not None) == got.undoable


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["commit", "undo", "redo"]), max_size=40), st.integers(1, 6))
def test_undo_and_redo_steps_agree_with_a_model_of_two_stacks(ops: list[str], cap: int) -> None:
    """For any run of commits, undo steps and redo steps: the document is what a plain model of the two
    stacks says, undo reaches back as far as the cap, and a commit clears what could be redone."""
    from trioloop.machine.transaction import redo_step, undo_step

    history: UndoHistory[str] = UndoHistory(max_entries=cap)
    document = "d0"
    model_undo: list[tuple[str, str]] = []  # (turn id, pre-turn document)
    model_redo: list[tuple[str, str]] = []  # (turn id, document the turn had left)
    for index, op in enumerate(ops):
        if op == "commit":
            turn_id = f"turn-{index}"
            history = history.push(UndoEntry(turn_id=turn_id, document=document))
            model_undo = [*model_undo, (turn_id, document)][-cap:]
            model_redo = []
            document = f"d{index + 1}"
        elif op == "undo":
            stepped = undo_step(history, document)
            if not model_undo:
                assert stepped is None
                continue
            assert stepped is not None
            turn_id, before = model_undo.pop()
            model_redo = [*model_redo, (turn_id, document)][-cap:]
            assert stepped[0] == before and stepped[2] == turn_id
            document, history = stepped[0], stepped[1]
        else:
            stepped = redo_step(history, document)
            if not model_redo:
                assert stepped is None
                continue
            assert stepped is not None
            turn_id, after = model_redo.pop()
            model_undo = [*model_undo, (turn_id, document)][-cap:]
            assert stepped[0] == after and stepped[2] == turn_id
            document, history = stepped[0], stepped[1]
        assert [(e.turn_id, e.document) for e in history.entries] == model_undo
        assert [(e.turn_id, e.document) for e in history.redo] == model_redo
        top = history.top
        if top is not None:
            assert turn_undo_availability(history, top.turn_id).undoable
