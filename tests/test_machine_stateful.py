"""reduce_turn under arbitrary interleavings: every step obeys the transition tables and the turn's
structure only grows (budget, violations, calls, closed history), and replay is deterministic.

The security invariants (grants, runs, pairing at settle) are driven by the adversarial machine in
test_injection.py. Set TRIOLOOP_TORTURE_SCALE=N to run N times as many examples locally.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import attrs
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from trioloop.machine.authorization import Violation
from trioloop.machine.inputs import classify
from trioloop.machine.limits import TurnLimits
from trioloop.machine.reducer import (
    CALL_STATUS_EDGES,
    PHASE_TRANSITIONS,
    Advance,
    ApproveBatch,
    ApproveCall,
    CallSettled,
    Cancel,
    DenyCall,
    Phase,
    Retry,
    StartCall,
    Submit,
    TurnInput,
    TurnState,
    UndoTurn,
    reduce_turn,
)
from trioloop.machine.tables import INITIAL_CALL_STATUSES
from trioloop.machine.tool_input import tool_field
from trioloop.machine.tools import RegisteredTool, ToolOutcome, create_tool_registry
from trioloop.protocol import (
    Aborted,
    MessageStart,
    MessageStop,
    StopReason,
    StreamError,
    TextDelta,
    ToolCallComplete,
    ToolCallInputDelta,
    ToolCallStart,
    Usage,
    assert_tool_pairing,
)
from trioloop.runtime.tools import define_executable_tool

SCALE = max(1, int(os.environ.get("TRIOLOOP_TORTURE_SCALE", "1")))


@attrs.frozen(kw_only=True)
class Target:
    name: str = tool_field(min_length=1)


def _tool(name: str, effect: str, destructive: bool) -> RegisteredTool:
    return define_executable_tool(
        name=name,
        description=name,
        effect=effect,  # type: ignore[arg-type]
        destructive=destructive,
        input_type=Target,
        run=lambda value, ctx: ToolOutcome.success("done"),
        summarize=lambda value: f"{name} {value.name}",
    )


REGISTRY = create_tool_registry(
    [_tool("read", "read", False), _tool("update", "mutate", False), _tool("delete", "mutate", True)]
)
IDS = ("c1", "c2", "c3", "r1", "d1", "")
# Repeats weight the draw towards calls that get accepted, so turns get past their first iteration.
NAMES = ("read", "read", "update", "update", "delete", "Update", "nope")
RAW_INPUTS: tuple[Any, ...] = ({"name": "web"}, {"name": "web"}, {"name": "db"}, {"name": "db"}, {"name": ""}, {}, None)

ids = st.one_of(st.sampled_from(IDS), st.text(max_size=3))
texts = st.text(max_size=8)


class TurnTableMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = TurnState.idle()
        self.inputs: list[TurnInput] = []
        self.now = 0

    def feed(self, item: TurnInput) -> None:
        before = self.state
        after = reduce_turn(before, item)
        self.inputs.append(item)
        self.state = after
        kind = classify(item)
        assert kind is not None
        admitted = PHASE_TRANSITIONS[before.phase].get(kind)
        if admitted is None:
            if before.phase is Phase.SETTLED:
                assert len(after.violations) == len(before.violations) + 1
                assert after.violations[-1].violation is Violation.POST_SETTLEMENT_EVENT
                assert attrs.evolve(after, violation_log=before.violation_log) == before
            else:
                assert after is before
            return
        assert after.phase in admitted
        if kind.value == "submit":
            return
        # Everything a turn accumulates only grows.
        assert after.violations[: len(before.violations)] == before.violations
        assert after.notices[: len(before.notices)] == before.notices
        assert [c.id for c in after.calls[: len(before.calls)]] == [c.id for c in before.calls]
        closed = before.base_messages + before.closed_messages
        assert after.messages[: len(closed)] == closed
        assert after.iteration >= before.iteration
        for field in ("iterations_started", "tool_calls_accepted", "retries_used"):
            assert getattr(after.budget, field) >= getattr(before.budget, field)
        old = {c.id: c.status for c in before.calls}
        for record in after.calls:
            if record.id not in old:
                assert record.status in INITIAL_CALL_STATUSES
            elif record.status is not old[record.id]:
                assert record.status in CALL_STATUS_EDGES[old[record.id]]
        if isinstance(item, TextDelta) and before.phase is Phase.STREAMING:
            assert after.streaming_text == before.streaming_text + item.text
        if isinstance(item, StartCall) and before.phase is Phase.EXECUTING:
            # Liveness: a start either runs the call or ends it; nothing is left waiting on a start
            # that can never succeed.
            started = after.call(item.call_id)
            if started is not None and old[item.call_id].value in ("pending", "approved"):
                assert started.status.value == "running" or started.is_terminal

    # Rules with a precondition follow the turn so interleavings get deep; `noise` sends any input in
    # any phase. Endings are held back for the first inputs, and rare branches sit on middle values
    # (hypothesis draws the minimum of a range far more often than the rest).

    @property
    def late(self) -> bool:
        return len(self.inputs) > 25

    def _in(self, *phases: Phase) -> bool:
        return self.state.phase in phases

    def _some_id(self, data: st.DataObject) -> str:
        """Mostly a call of this iteration, sometimes any call of the turn, sometimes any id at all."""
        current = [c.id for c in self.state.current_calls]
        known = [c.id for c in self.state.calls]
        pick = data.draw(st.integers(0, 4))
        if current and pick <= 2:
            return data.draw(st.sampled_from(current))
        if known and pick == 3:
            return data.draw(st.sampled_from(known))
        return data.draw(ids)

    @initialize(
        iterations=st.integers(2, 4),
        per_turn=st.integers(2, 8),
        per_iteration=st.integers(2, 4),
        retries=st.integers(1, 2),
        deadline=st.integers(100, 400),
    )
    def begin(self, iterations: int, per_turn: int, per_iteration: int, retries: int, deadline: int) -> None:
        limits = TurnLimits(
            max_iterations=iterations,
            max_tool_calls_per_turn=per_turn,
            max_tool_calls_per_iteration=per_iteration,
            max_retries_per_turn=retries,
            turn_deadline_ms=deadline,
        )
        self.feed(Submit(turn_id="t", text="go", tool_set=REGISTRY, limits=limits, now_ms=self.now))

    @precondition(lambda self: self._in(Phase.REQUESTING))
    @rule(retry=st.integers(0, 4), tokens=st.integers(0, 50))
    def request(self, retry: int, tokens: int) -> None:
        if retry == 3:
            self.feed(Retry(now_ms=self.now))
        self.feed(MessageStart(model="m"))
        self.feed(Usage(input_tokens=tokens, output_tokens=tokens // 2))

    @precondition(lambda self: self._in(Phase.STREAMING))
    @rule(
        text=texts, reuse=st.integers(0, 3), call_id=ids, name=st.sampled_from(NAMES), raw=st.sampled_from(RAW_INPUTS)
    )
    def stream_piece(self, text: str, reuse: int, call_id: str, name: str, raw: Any) -> None:
        self.feed(TextDelta(text=text))
        fresh = call_id if reuse == 2 else f"call_{len(self.inputs)}"
        self.feed(ToolCallStart(id=fresh, name=name))
        self.feed(ToolCallInputDelta(id=fresh, partial_json="{"))
        self.feed(ToolCallComplete(id=fresh, name=name, input=raw))

    @precondition(lambda self: self._in(Phase.STREAMING) and (self.late or bool(self.state.current_calls)))
    @rule(odds=st.integers(0, 9), reason=st.sampled_from(list(StopReason)))
    def stream_end(self, odds: int, reason: StopReason) -> None:
        if odds == 3 and self.late:
            self.feed(StreamError(code="http_status", message="trouble"))
        elif odds == 6 and self.late:
            self.feed(MessageStop(stop_reason=reason))
        else:
            self.feed(MessageStop(stop_reason=StopReason.TOOL_USE))

    @precondition(lambda self: self._in(Phase.AWAITING_APPROVAL, Phase.EXECUTING))
    @rule(data=st.data(), how=st.integers(0, 6))
    def user_decides(self, data: st.DataObject, how: int) -> None:
        if how == 5:
            # An edited approval of any id, with any input (valid, invalid, hostile).
            edited = data.draw(st.sampled_from([r for r in RAW_INPUTS if isinstance(r, dict)]))
            self.feed(ApproveCall(call_id=self._some_id(data), edited_input=edited))
        elif how == 6:
            self.feed(DenyCall(call_id=self._some_id(data), reason=data.draw(texts)))
        elif how == 0:
            self.feed(DenyCall(call_id=self._some_id(data)))
        elif how == 1:
            self.feed(ApproveBatch(call_ids=tuple(self._some_id(data) for _ in range(data.draw(st.integers(0, 4))))))
        elif how == 2:
            pending = tuple(c.id for c in self.state.current_calls if c.status.value == "pending")
            self.feed(ApproveBatch(call_ids=pending))
        elif how == 4:
            # Approve one call, then a misbehaving runner starts another that still waits for the user.
            pending = [c.id for c in self.state.current_calls if c.status.value == "pending"]
            if pending:
                self.feed(ApproveCall(call_id=pending[0]))
                self.feed(StartCall(call_id=pending[-1], now_ms=self.now))
        else:
            self.feed(ApproveCall(call_id=self._some_id(data)))

    @precondition(lambda self: self._in(Phase.EXECUTING))
    @rule(ok=st.booleans(), elapsed=st.integers(0, 60), stray=st.integers(0, 3))
    def runner(self, ok: bool, elapsed: int, stray: int) -> None:
        """What a runner does: start every approved call of the iteration, report it, then advance.
        Sometimes it misbehaves first and starts a call still waiting for the user."""
        waiting = [c.id for c in self.state.current_calls if c.status.value == "pending"]
        if stray == 2 and waiting:
            self.feed(StartCall(call_id=waiting[0], now_ms=self.now))
            self.feed(ApproveCall(call_id=waiting[0]))  # too late: a refused start ends the call
        for record in self.state.current_calls:
            if record.status.value == "approved":
                self.feed(StartCall(call_id=record.id, now_ms=self.now))
                outcome = ToolOutcome.success("ran") if ok else ToolOutcome.failure("broke")
                self.feed(CallSettled(call_id=record.id, outcome=outcome, now_ms=self.now, changed_document=ok))
        self.now += elapsed
        self.feed(Advance(now_ms=self.now))

    @rule(data=st.data(), which=st.integers(0, 12), ok=st.booleans())
    def noise(self, data: st.DataObject, which: int, ok: bool) -> None:
        some_id = lambda: self._some_id(data)  # noqa: E731 -- drawn only for the input chosen
        outcome = ToolOutcome.success("x") if ok else ToolOutcome.failure("x")
        inputs: list[Callable[[], TurnInput]] = [
            lambda: MessageStart(model="m"),
            lambda: TextDelta(text=data.draw(texts)),
            lambda: ToolCallComplete(
                id=some_id(), name=data.draw(st.sampled_from(NAMES)), input=data.draw(st.sampled_from(RAW_INPUTS))
            ),
            lambda: StreamError(code="malformed_stream", message="skipped a frame", terminal=False),
            lambda: Usage(input_tokens=1, output_tokens=1),
            lambda: ApproveCall(call_id=some_id()),
            lambda: ApproveBatch(call_ids=(some_id(),)),
            lambda: DenyCall(call_id=some_id()),
            lambda: StartCall(call_id=some_id(), now_ms=self.now),
            lambda: CallSettled(call_id=some_id(), outcome=outcome, now_ms=self.now),
            lambda: Advance(now_ms=self.now),
            lambda: Retry(now_ms=self.now),
            UndoTurn,
        ]
        self.feed(inputs[which]())

    @precondition(lambda self: self.late)
    @rule(which=st.integers(0, 9))
    def ender(self, which: int) -> None:
        enders: dict[int, TurnInput] = {
            3: Aborted(),
            4: Cancel(),
            5: Cancel(reason="deadline"),
            6: StreamError(code="transport", message="gone"),
            7: MessageStop(stop_reason=StopReason.END_TURN),
        }
        if which in enders:
            self.feed(enders[which])

    # -- invariants ---------------------------------------------------------------------------------------

    @invariant()
    def settled_turns_are_whole(self) -> None:
        state = self.state
        assert state.is_settled == (state.phase is Phase.SETTLED)
        assert state.is_live == (state.phase not in (Phase.IDLE, Phase.SETTLED))
        if state.is_settled:
            assert state.outcome is not None
            assert all(c.is_terminal for c in state.calls)
            assert assert_tool_pairing(state.messages) == ()
            assert (state.error is not None) == (state.outcome.value == "failed")
            if state.outcome.value == "bounded":
                assert state.notices
        else:
            assert state.outcome is None
        if state.is_live:
            assert state.iteration == state.budget.iterations_started

    def teardown(self) -> None:
        replayed = TurnState.idle()
        for item in self.inputs:
            replayed = reduce_turn(replayed, item)
        assert replayed == self.state


TurnTableMachine.TestCase.settings = settings(
    max_examples=100 * SCALE, stateful_step_count=40, deadline=None, suppress_health_check=[]
)
TestTurnTable = TurnTableMachine.TestCase
