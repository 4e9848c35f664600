"""Grant constructors and the authorize_start gate, check by check and in order."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trioloop.machine.authorization import (
    Denial,
    Grant,
    Violation,
    authorize_start,
    auto_grant_read_only,
    grant_for_batch,
    grant_for_call,
)
from trioloop.machine.canonical import input_digest
from trioloop.machine.reducer import ApproveCall, CallStatus, Phase, Submit, TurnInput, TurnState, reduce_turn
from trioloop.machine.tool_input import tool_field
from trioloop.machine.tools import RegisteredTool, ToolOutcome, create_tool_registry
from trioloop.protocol import MessageStart, MessageStop, ToolCallComplete
from trioloop.runtime.tools import define_executable_tool


@attrs.frozen(kw_only=True)
class Target:
    name: str = tool_field(min_length=1)


def _tool(name: str, effect: str, destructive: bool) -> RegisteredTool:
    return define_executable_tool(
        name=name,
        description=f"{name} a target",
        effect=effect,  # type: ignore[arg-type]
        destructive=destructive,
        input_type=Target,
        run=lambda value, ctx: ToolOutcome.success("done"),
        summarize=lambda value: f"{name} {value.name}",
    )


READ = _tool("read", "read", False)
UPDATE = _tool("update", "mutate", False)
DELETE = _tool("delete", "mutate", True)
REGISTRY = create_tool_registry([READ, UPDATE, DELETE])


def run(inputs: Iterable[TurnInput], state: TurnState | None = None) -> TurnState:
    state = state or TurnState.idle()
    for item in inputs:
        state = reduce_turn(state, item)
    return state


def awaiting(*calls: tuple[str, str, str]) -> TurnState:
    """A turn awaiting approval with the given (id, tool, target) calls."""
    inputs: list[TurnInput] = [Submit(turn_id="t", text="go", tool_set=REGISTRY, now_ms=0), MessageStart(model="m")]
    inputs += [ToolCallComplete(id=i, name=tool, input={"name": target}) for i, tool, target in calls]
    inputs.append(MessageStop(stop_reason="tool_use"))
    return run(inputs)


def approved_state() -> TurnState:
    state = run([ApproveCall(call_id="c1")], awaiting(("c1", "update", "web")))
    assert state.phase is Phase.EXECUTING and state.call("c1").status is CallStatus.APPROVED  # type: ignore[union-attr]
    return state


# -- grant_for_call -------------------------------------------------------------------------------


def test_grant_for_call_binds_id_tool_digest_and_iteration() -> None:
    state = awaiting(("c1", "update", "web"))
    grant = grant_for_call(state, "c1")
    assert grant == Grant(
        call_id="c1", tool_name="update", input_digest=input_digest({"name": "web"}), iteration=1, consumed=False
    )


def test_grant_for_call_allows_a_single_destructive_call() -> None:
    assert grant_for_call(awaiting(("d1", "delete", "web")), "d1") is not None


def test_grant_for_call_refuses_missing_and_non_pending_calls() -> None:
    state = awaiting(("c1", "update", "web"), ("r1", "read", "web"), ("x1", "nope", "web"), ("b1", "update", ""))
    assert grant_for_call(state, "missing") is None
    assert grant_for_call(state, "r1") is None  # already approved by the read-only policy
    assert grant_for_call(state, "x1") is None  # unknown tool, failed
    assert grant_for_call(state, "b1") is None  # invalid input, failed
    assert grant_for_call(approved_state(), "c1") is None  # already approved


# -- grant_for_batch ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "not_a_tuple",
    [["c1"], {"c1"}, frozenset({"c1"}), lambda call: True, (i for i in ["c1"]), "c1", None],
    ids=["list", "set", "frozenset", "predicate", "generator", "str", "none"],
)
def test_grant_for_batch_refuses_anything_but_an_explicit_tuple(not_a_tuple: object) -> None:
    with pytest.raises(TypeError):
        grant_for_batch(awaiting(("c1", "update", "web")), not_a_tuple)  # type: ignore[arg-type]


def test_grant_for_batch_refuses_non_str_ids() -> None:
    with pytest.raises(TypeError):
        grant_for_batch(awaiting(("c1", "update", "web")), ("c1", 1))  # type: ignore[arg-type]


def test_grant_for_batch_skips_destructive_unlisted_and_non_pending_calls_in_emission_order() -> None:
    state = awaiting(("c1", "update", "a"), ("d1", "delete", "b"), ("c2", "update", "c"), ("c3", "update", "d"))
    grants = grant_for_batch(state, ("c2", "d1", "c1", "ghost"))
    assert [g.call_id for g in grants] == ["c1", "c2"]
    assert grant_for_batch(state, ()) == ()


# -- auto_grant_read_only -------------------------------------------------------------------------


def test_auto_grant_read_only_refuses_mutating_and_destructive_tools() -> None:
    state = awaiting(("c1", "update", "web"), ("d1", "delete", "web"), ("r1", "read", "web"))
    with pytest.raises(ValueError, match="mutating"):
        auto_grant_read_only(UPDATE, state.call("c1"), 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="mutating"):
        auto_grant_read_only(DELETE, state.call("d1"), 1)  # type: ignore[arg-type]
    # A read tool cannot be built destructive; forge one to prove the policy checks it anyway.
    forged = attrs.evolve(READ)
    object.__setattr__(forged, "destructive", True)
    with pytest.raises(ValueError, match="destructive"):
        auto_grant_read_only(forged, state.call("r1"), 1)  # type: ignore[arg-type]


def test_auto_grant_read_only_refuses_a_call_of_another_tool() -> None:
    state = awaiting(("c1", "update", "web"))
    with pytest.raises(ValueError):
        auto_grant_read_only(READ, state.call("c1"), 1)  # type: ignore[arg-type]


def test_auto_grant_read_only_grants_the_read_call() -> None:
    state = awaiting(("r1", "read", "web"))
    grant = auto_grant_read_only(READ, state.call("r1"), 1)  # type: ignore[arg-type]
    assert (grant.call_id, grant.tool_name, grant.iteration, grant.consumed) == ("r1", "read", 1, False)
    assert state.grants == (grant,)


# -- authorize_start ------------------------------------------------------------------------------


def test_authorize_start_admits_an_approved_call_with_its_grant() -> None:
    state = approved_state()
    assert authorize_start(state, "c1") == state.grants[0]


def _with_call(state: TurnState, **changes: object) -> TurnState:
    calls = tuple(attrs.evolve(c, **changes) if c.id == "c1" else c for c in state.calls)
    return attrs.evolve(state, calls=calls)


def _with_grant(state: TurnState, **changes: object) -> TurnState:
    return attrs.evolve(state, grants=tuple(attrs.evolve(g, **changes) for g in state.grants))


# Each breaks exactly one check, listed in the order authorize_start applies them.
BREAKS: list[tuple[str, Violation, Callable[[TurnState], TurnState]]] = [
    ("missing_call", Violation.NO_GRANT, lambda s: attrs.evolve(s, calls=())),
    ("unknown_tool", Violation.UNKNOWN_TOOL, lambda s: attrs.evolve(s, tool_set=create_tool_registry([READ]))),
    (
        "denied",
        Violation.DENIED_REPLAY,
        lambda s: attrs.evolve(s, denials=(Denial(tool_name="update", input_digest=s.calls[0].input_digest),)),
    ),
    ("no_grant", Violation.NO_GRANT, lambda s: attrs.evolve(s, grants=())),
    ("digest", Violation.DIGEST_MISMATCH, lambda s: _with_grant(s, input_digest=input_digest({"name": "db"}))),
    ("foreign", Violation.FOREIGN_ITERATION, lambda s: _with_grant(s, iteration=7)),
    ("consumed", Violation.GRANT_ALREADY_CONSUMED, lambda s: _with_grant(s, consumed=True)),
]


@pytest.mark.parametrize(("name", "expected", "breaker"), BREAKS, ids=[b[0] for b in BREAKS])
def test_each_check_refuses_on_its_own(
    name: str, expected: Violation, breaker: Callable[[TurnState], TurnState]
) -> None:
    assert authorize_start(breaker(approved_state()), "c1") is expected


@given(st.sets(st.integers(min_value=1, max_value=len(BREAKS) - 1), min_size=1))
def test_the_first_failing_check_wins(broken: set[int]) -> None:
    # Index 0 (missing call) hides every other check, so it is covered separately above.
    state = approved_state()
    for index in sorted(broken, reverse=True):
        state = BREAKS[index][2](state)
    assert authorize_start(state, "c1") is BREAKS[min(broken)][1]


def test_a_grant_for_another_tool_is_a_digest_mismatch() -> None:
    assert authorize_start(_with_grant(approved_state(), tool_name="delete"), "c1") is Violation.DIGEST_MISMATCH


def test_a_record_whose_prepared_run_is_for_another_input_is_a_digest_mismatch() -> None:
    other = UPDATE.prepare({"name": "payments-db"})
    state = _with_call(approved_state(), prepared=other)
    assert authorize_start(state, "c1") is Violation.DIGEST_MISMATCH


def test_a_call_no_longer_approved_has_spent_its_grant() -> None:
    state = _with_call(approved_state(), status=CallStatus.RUNNING)
    assert authorize_start(state, "c1") is Violation.GRANT_ALREADY_CONSUMED


def test_a_call_of_an_earlier_iteration_is_foreign_even_with_a_matching_grant() -> None:
    state = approved_state()
    state = _with_grant(_with_call(attrs.evolve(state, iteration=2), iteration=1), iteration=2)
    assert authorize_start(state, "c1") is Violation.FOREIGN_ITERATION


def test_authorize_start_never_mutates() -> None:
    state = approved_state()
    before = attrs.asdict(state, recurse=False)
    authorize_start(state, "c1")
    assert attrs.asdict(state, recurse=False) == before
