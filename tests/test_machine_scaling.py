"""Hostile volume costs linear work: the reducer's cost per refused call does not grow with the calls so far.

Counted, not timed: the number of Python bytecode instructions the reducer executes (``sys.settrace``
with opcode events) and the memory that every intermediate state keeps alive (``tracemalloc``). A
step that scans the calls so far shows in the first; a step that copies them shows in the second.
"""

from __future__ import annotations

import gc
import itertools
import sys
import tracemalloc
from types import FrameType
from typing import Any

import attrs
from hypothesis import example, given, settings
from hypothesis import strategies as st

from trioloop.machine.reducer import CallStatus, DenialReason, Submit, TurnState, reduce_turn
from trioloop.machine.state import CallRecord, CallTable
from trioloop.machine.tool_input import tool_field
from trioloop.machine.tools import ToolOutcome, create_tool_registry
from trioloop.protocol import MessageStart, MessageStop, ToolCallComplete
from trioloop.runtime.tools import define_executable_tool


@attrs.frozen(kw_only=True)
class _Input:
    name: str = tool_field(min_length=1)


_TOOL = define_executable_tool(
    name="rename",
    description="Rename something.",
    effect="mutate",
    destructive=False,
    input_type=_Input,
    run=lambda value, ctx: ToolOutcome.success("renamed"),
    summarize=lambda value: f"Rename to {value.name}",
)


def _streaming() -> TurnState:
    state = reduce_turn(
        TurnState.idle(), Submit(turn_id="t", text="go", tool_set=create_tool_registry([_TOOL]), now_ms=0)
    )
    return reduce_turn(state, MessageStart(model="m"))


def _events(first: int, count: int) -> list[ToolCallComplete]:
    return [ToolCallComplete(id=f"c{i}", name="rename", input={"name": "x"}) for i in range(first, first + count)]


def _opcodes_for(state: TurnState, events: list[ToolCallComplete]) -> tuple[int, TurnState]:
    count = 0

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        frame.f_trace_opcodes = True
        if event == "opcode":
            count += 1
        return tracer

    sys.settrace(tracer)
    try:
        for event in events:
            state = reduce_turn(state, event)
    finally:
        sys.settrace(None)
    return count, state


def _after(calls: int) -> TurnState:
    state = _streaming()
    for event in _events(0, calls):
        state = reduce_turn(state, event)
    return state


def test_refusing_a_call_executes_the_same_instructions_however_many_calls_came_before() -> None:
    probe = 50
    _opcodes_for(_after(20), _events(20, probe))  # warm-up: on 3.12 the first traced run reports no opcode events
    early, _ = _opcodes_for(_after(20), _events(20, probe))
    late, state = _opcodes_for(_after(2_000), _events(2_000, probe))
    # Quadratic code (a scan of the calls so far per call) executes ~100x more here; allow noise only.
    assert early > 0 and late <= early * 1.2, (early, late)
    refused = [c for c in state.calls if c.denial_reason is DenialReason.LIMIT_EXCEEDED]
    assert len(refused) == 2_050 - 12 and len(state.current_calls) == 2_050
    assert state.call("c2049") is state.calls[-1] and state.calls.pending_count == 12


def _retained_per_call(calls: int) -> float:
    state = _after(10)
    events = _events(10, calls)
    kept: list[TurnState] = []
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for event in events:
            state = reduce_turn(state, event)
            kept.append(state)  # every version stays alive: a copying step would keep O(n) per version
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert all(later.calls[: len(earlier.calls)] == tuple(earlier.calls) for earlier, later in itertools.pairwise(kept))
    return (after - before) / calls


def test_every_version_of_a_flooded_turn_shares_the_calls_before_it() -> None:
    small, large = _retained_per_call(250), _retained_per_call(2_000)
    # A whole-tuple copy per call keeps ~8 bytes x calls-so-far per version: ~8x more per call at 2,000.
    assert large <= small * 1.5, (small, large)


def test_old_versions_never_see_later_calls_and_a_branch_gets_its_own_table() -> None:
    base = _after(13)
    grown = reduce_turn(base, _events(13, 1)[0])
    branch = reduce_turn(base, ToolCallComplete(id="other", name="rename", input={"name": "x"}))
    assert len(base.calls) == 13 and base.call("c13") is None and base.call("other") is None
    assert grown.call("c13") is not None and grown.call("other") is None
    assert branch.call("other") is not None and branch.call("c13") is None
    stopped = reduce_turn(grown, MessageStop(stop_reason="tool_use"))
    assert stopped.calls.pending_count == 12
    assert [c.status for c in stopped.current_calls].count(CallStatus.PENDING) == 12


def _record(call_id: str, status: CallStatus = CallStatus.PENDING) -> CallRecord:
    return CallRecord(
        id=call_id,
        tool_name="rename",
        input_digest="d",
        summary="s",
        effect="mutate",
        destructive=False,
        iteration=1,
        status=status,
    )


_P = CallStatus.PENDING
_OPERATIONS = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=30),  # which version so far to start from (a branch when not the last)
        st.sampled_from(["append", "replace"]),
        st.integers(min_value=0, max_value=30),  # the id to append (ids repeat: a forged duplicate), or a position
        st.sampled_from([CallStatus.PENDING, CallStatus.APPROVED, CallStatus.DENIED]),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(_OPERATIONS)
# Two tips sharing one index (a replaced table and the one it came from) once let an append take the
# other line's entry for its own: the table then could not find a call it held.
@example(
    [
        (0, "append", 0, _P),
        (1, "replace", 0, _P),
        (1, "append", 0, _P),
        (0, "append", 0, _P),
        (2, "append", 1, _P),
        (3, "append", 1, _P),
    ]
)
def test_every_version_of_a_call_table_reads_as_the_tuple_it_was_made_from(operations: list[Any]) -> None:
    # Versions share their list and index; appends to old versions (branches) and replacements in any
    # version must leave every other version reading exactly as before.
    versions: list[tuple[CallTable, tuple[CallRecord, ...]]] = [(CallTable(), ())]
    for base, operation, value, status in operations:
        table, model = versions[base % len(versions)]
        if operation == "append":
            record = _record(f"c{value}", status)
            versions.append((table.append(record), (*model, record)))
        elif model:
            position = value % len(model)
            record = _record(model[position].id, status)
            versions.append(
                (table.replaced(((position, record),)), (*model[:position], record, *model[position + 1 :]))
            )
        for table, model in versions:
            assert table.items == model and len(table) == len(model)
            assert table.pending_count == sum(r.status is CallStatus.PENDING for r in model)
            for record in model:
                first = next(r for r in model if r.id == record.id)  # the first of a duplicate id wins
                assert table.get(record.id) is first
            assert table.get("c99") is None


def test_a_long_answer_keeps_no_tracked_object_per_delta() -> None:
    """The draft's text is one shared list of (untracked) strings, not a chain of nodes: a state holding a long
    answer keeps a bounded number of objects the garbage collector tracks, however many deltas it took."""
    from trioloop.machine.limits import TurnLimits
    from trioloop.machine.reducer import Submit, reduce_turn
    from trioloop.machine.state import TurnState
    from trioloop.machine.tools import create_tool_registry
    from trioloop.protocol import MessageStart, TextDelta

    def tracked_after(deltas: int) -> int:
        state = TurnState.idle()
        state = reduce_turn(
            state,
            Submit(turn_id="t", text="hi", tool_set=create_tool_registry(), limits=TurnLimits(), now_ms=0),
        )
        state = reduce_turn(state, MessageStart(model="m"))
        for index in range(deltas):
            state = reduce_turn(state, TextDelta(text=f"w{index} "))
        gc.collect()
        count = len(gc.get_objects())
        assert state.streaming_text.startswith("w0 ")
        return count

    gc.collect()
    small = tracked_after(1_000)
    large = tracked_after(20_000)
    # 19,000 more deltas may not leave 19,000 more tracked objects (a chain of nodes did): a few dozen at most.
    assert large - small < 200, (small, large)
