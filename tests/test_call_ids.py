"""Call ids are unique within a session whatever the server sends, and no call is ever dropped.

Servers number their calls anew in every response (``call_1`` each time), send none, or repeat one inside a
message. For every such sequence, across iterations and turns: every call the server sent is a call record
with a result the model receives, the history's ids are unique and pair exactly, a repeat inside one message
is the only ``duplicate_call_id``, and a renamed id keeps the shape its server accepts back.
"""

from __future__ import annotations

import re

from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_machine import REGISTRY

from trioloop.machine.authorization import Violation
from trioloop.machine.ids import fresh_call_id
from trioloop.machine.limits import TurnLimits
from trioloop.machine.reducer import (
    Advance,
    ApproveCall,
    CallSettled,
    CallStatus,
    Phase,
    StartCall,
    Submit,
    TurnState,
    reduce_turn,
)
from trioloop.machine.tools import ToolOutcome
from trioloop.protocol import (
    Message,
    MessageStart,
    MessageStop,
    TextDelta,
    ToolCallBlock,
    ToolCallComplete,
    ToolResultBlock,
    assert_tool_pairing,
)

SERVER_IDS = st.sampled_from(
    [
        "call_1",
        "call_2",
        "",
        "abcDEF123",  # Mistral: nine letters and digits
        "functions.read:0",  # Kimi: NAME:INDEX
        "toolu_01A09q90qw90lq917835lq9",
        "call_" + "x" * 35,  # exactly 40
        "c" * 60,  # longer than OpenAI's 40: the server took it, so it takes it back
    ]
)
#: turns -> iterations -> calls (server id, tool)
SESSIONS = st.lists(
    st.lists(st.lists(st.tuples(SERVER_IDS, st.sampled_from(["read", "update"])), max_size=4), min_size=1, max_size=3),
    min_size=1,
    max_size=3,
)
_LIMITS = TurnLimits(max_iterations=8, max_tool_calls_per_iteration=12, max_tool_calls_per_turn=32)
_ANTHROPIC_ID = re.compile(r"[A-Za-z0-9_-]+")


def _finish_iteration(state: TurnState, now: int) -> TurnState:
    """Approve every pending call, run every approved one, advance."""
    for record in state.current_calls:
        if record.status is CallStatus.PENDING:
            state = reduce_turn(state, ApproveCall(call_id=record.id))
    for record in state.current_calls:
        if record.status is CallStatus.APPROVED:
            state = reduce_turn(state, StartCall(call_id=record.id, now_ms=now))
            state = reduce_turn(
                state, CallSettled(call_id=record.id, outcome=ToolOutcome.success(f"ran {record.id}"), now_ms=now)
            )
    return reduce_turn(state, Advance(now_ms=now))


def _run_session(turns: list[list[list[tuple[str, str]]]]) -> list[tuple[TurnState, list[list[str]]]]:
    history: tuple[Message, ...] = ()
    out = []
    for number, iterations in enumerate(turns, 1):
        state = reduce_turn(
            TurnState.idle(),
            Submit(
                turn_id=f"turn-{number}", text="go", base_messages=history, tool_set=REGISTRY, limits=_LIMITS, now_ms=0
            ),
        )
        sent: list[list[str]] = []
        for calls in iterations:
            if state.is_settled:  # an iteration without a call ended the turn (a tool_use stop with none)
                break
            state = reduce_turn(state, MessageStart(model="m"))
            state = reduce_turn(state, TextDelta(text="working"))
            for server_id, tool in calls:
                state = reduce_turn(state, ToolCallComplete(id=server_id, name=tool, input={"name": "web"}))
            sent.append([server_id for server_id, _ in calls])
            state = reduce_turn(state, MessageStop(stop_reason="tool_use"))
            if state.phase is not Phase.SETTLED:
                state = _finish_iteration(state, 1)
        if not state.is_settled:
            state = reduce_turn(state, MessageStart(model="m"))
            state = reduce_turn(state, TextDelta(text="done"))
            state = reduce_turn(state, MessageStop(stop_reason="end_turn"))
        assert state.is_settled
        history = state.messages
        out.append((state, sent))
    return out


@settings(max_examples=300, deadline=None)
@given(SESSIONS)
def test_for_any_server_ids_every_call_is_kept_answered_and_unique(turns: list[list[list[tuple[str, str]]]]) -> None:
    states = _run_session(turns)
    final = states[-1][0]
    ids = [b.id for m in final.messages for b in m.content if isinstance(b, ToolCallBlock)]
    answered = [b.call_id for m in final.messages for b in m.content if isinstance(b, ToolResultBlock)]
    assert len(ids) == len(set(ids)) and sorted(ids) == sorted(answered)
    assert assert_tool_pairing(final.messages) == ()
    for state, sent in states:
        # Nothing dropped: one record per call the server sent, in order, iteration by iteration.
        assert len(state.calls) == sum(len(calls) for calls in sent)
        # The only violation is a repeat inside one message (by the server's own id; "" is never a repeat).
        repeats = sum(len(calls) - len({i for i in calls if i}) - sum(1 for i in calls if not i) for calls in sent)
        duplicates = [v for v in state.violations if v.violation is Violation.DUPLICATE_CALL_ID]
        assert len(duplicates) == repeats
        assert {v.violation for v in state.violations} <= {Violation.DUPLICATE_CALL_ID}
        for record, server_id in zip(state.calls, [i for calls in sent for i in calls], strict=True):
            if record.id != server_id:
                assert _same_shape(server_id, record.id), (server_id, record.id)


def _same_shape(server_id: str, renamed: str) -> bool:
    if re.fullmatch(r"[A-Za-z0-9]{9}", server_id):
        return re.fullmatch(r"[A-Za-z0-9]{9}", renamed) is not None
    if ":" in server_id and re.fullmatch(r"[0-9]+", server_id.rsplit(":", 1)[1]):  # the index is ASCII digits
        prefix, index = renamed.rsplit(":", 1)
        return prefix == server_id.rsplit(":", 1)[0] and index.isdigit()
    fits = len(renamed) <= 40 if len(server_id) <= 40 else True
    keeps_alphabet = (
        _ANTHROPIC_ID.fullmatch(renamed) is not None if not server_id or _ANTHROPIC_ID.fullmatch(server_id) else True
    )
    return fits and keeps_alphabet


@example(server_id=":0", salt="")  # an empty name before the index (found by this test)
@example(server_id="get\nweather:0123456789", salt="")  # a line break in the name, a ten-digit index
@given(st.text(max_size=50), st.text(max_size=20))
def test_fresh_ids_are_pure_and_shaped(server_id: str, salt: str) -> None:
    first = fresh_call_id(server_id, salt)
    assert first == fresh_call_id(server_id, salt) and first != server_id and first
    assert _same_shape(server_id, first)


def test_a_flood_of_one_repeated_id_costs_no_chain_walk() -> None:
    # 2,000 calls named "call_1" in one message: one kept, the rest answered as duplicates, each under a
    # fresh id found at the first try (derived from its position), so the reducer stays linear.
    state = reduce_turn(
        TurnState.idle(),
        Submit(
            turn_id="t",
            text="go",
            tool_set=REGISTRY,
            limits=TurnLimits(max_tool_calls_per_iteration=5, max_tool_calls_per_turn=5),
            now_ms=0,
        ),
    )
    state = reduce_turn(state, MessageStart(model="m"))
    for _ in range(2000):
        state = reduce_turn(state, ToolCallComplete(id="call_1", name="read", input={"name": "web"}))
    assert len(state.calls) == 2000 and len({c.id for c in state.calls}) == 2000
    assert sum(v.violation is Violation.DUPLICATE_CALL_ID for v in state.violations) == 1999
