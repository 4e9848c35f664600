"""TurnLimits validation, the order budget_exhaustion (and timing_exhaustion) checks bounds in, the per-call cap."""

from __future__ import annotations

import math

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trioloop.machine.limits import (
    DEFAULT_TURN_LIMITS,
    Bound,
    TurnBudget,
    TurnLimits,
    bound_notice,
    budget_exhaustion,
    timing_exhaustion,
    tool_call_cap,
)

# The counts (the cost bound is a Decimal, tested in test_spend.py); those that may be None are optional.
FIELDS = [field.name for field in attrs.fields(TurnLimits) if field.name != "max_cost_usd"]
OPTIONAL = {"review_timeout_ms", "max_input_tokens", "max_output_tokens", "max_total_tokens"}
REQUIRED = [name for name in FIELDS if name not in OPTIONAL]


def test_defaults_match_the_design() -> None:
    assert (
        TurnLimits(
            max_iterations=8,
            max_tool_calls_per_turn=32,
            max_tool_calls_per_iteration=12,
            max_retries_per_turn=3,
            turn_deadline_ms=300_000,
            reserve_output_tokens=4096,
        )
        == DEFAULT_TURN_LIMITS
    )


def test_limits_are_frozen() -> None:
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        DEFAULT_TURN_LIMITS.max_iterations = 100  # type: ignore[misc]


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf, 1.5, 2.0, True, False, "3", None])
def test_invalid_limit_is_refused_naming_the_field(field: str, bad: object) -> None:
    if bad is None and field not in REQUIRED:
        assert getattr(TurnLimits(**{field: bad}), field) is None  # type: ignore[arg-type]
        return
    with pytest.raises((TypeError, ValueError)) as caught:
        TurnLimits(**{field: bad})  # type: ignore[arg-type]
    assert field in str(caught.value)


def test_the_review_timeout_is_off_by_default() -> None:
    assert DEFAULT_TURN_LIMITS.review_timeout_ms is None
    limits = TurnLimits(turn_deadline_ms=10)
    assert budget_exhaustion(TurnBudget(), limits, 9, review_waited_ms=10**12) is None


@given(field=st.sampled_from(FIELDS), value=st.integers(max_value=0))
def test_every_non_positive_int_is_refused(field: str, value: int) -> None:
    with pytest.raises(ValueError, match=field):
        TurnLimits(**{field: value})  # type: ignore[arg-type]


@given(field=st.sampled_from(FIELDS), value=st.integers(min_value=1, max_value=10**12))
def test_every_positive_int_is_accepted(field: str, value: int) -> None:
    # (An output or total bound may not be below the output reserve: test_spend.py.)
    assert getattr(TurnLimits(**{"reserve_output_tokens": 1, field: value}), field) == value  # type: ignore[arg-type]


def _reference(budget: TurnBudget, limits: TurnLimits, now_ms: int, waited: int | None = None) -> Bound | None:
    checks = [
        (Bound.ITERATIONS, budget.iterations_started, limits.max_iterations),
        (Bound.TOOL_CALLS, budget.tool_calls_accepted, limits.max_tool_calls_per_turn),
        (Bound.RETRIES, budget.retries_used, limits.max_retries_per_turn),
        (Bound.DEADLINE, now_ms - budget.started_at_ms, limits.turn_deadline_ms),
        (Bound.REVIEW_TIMEOUT, waited, limits.review_timeout_ms),
    ]
    return next(
        (bound for bound, spent, ceiling in checks if spent is not None and ceiling is not None and spent >= ceiling),
        None,
    )


small = st.integers(min_value=0, max_value=6)


@given(
    iterations=small,
    calls=small,
    retries=small,
    started=st.integers(min_value=0, max_value=100),
    elapsed=st.integers(min_value=0, max_value=10),
    caps=st.tuples(*[st.integers(min_value=1, max_value=6)] * 4),
    review_cap=st.none() | st.integers(min_value=1, max_value=6),
    waited=st.none() | st.integers(min_value=0, max_value=10),
)
def test_budget_exhaustion_checks_in_priority_order(
    iterations: int,
    calls: int,
    retries: int,
    started: int,
    elapsed: int,
    caps: tuple[int, int, int, int],
    review_cap: int | None,
    waited: int | None,
) -> None:
    budget = TurnBudget(
        iterations_started=iterations, tool_calls_accepted=calls, retries_used=retries, started_at_ms=started
    )
    limits = TurnLimits(
        max_iterations=caps[0],
        max_tool_calls_per_turn=caps[1],
        max_retries_per_turn=caps[2],
        turn_deadline_ms=caps[3],
        review_timeout_ms=review_cap,
    )
    now = started + elapsed
    assert budget_exhaustion(budget, limits, now, review_waited_ms=waited) == _reference(budget, limits, now, waited)
    # The time-only check ignores the counters: what the reference says with none of them spent.
    idle = TurnBudget(started_at_ms=started)
    assert timing_exhaustion(budget, limits, now, review_waited_ms=waited) == _reference(idle, limits, now, waited)


def test_reaching_a_ceiling_exactly_is_exhaustion() -> None:
    limits = TurnLimits(max_iterations=2, max_tool_calls_per_turn=3, max_retries_per_turn=1, turn_deadline_ms=100)
    fresh = TurnBudget(iterations_started=1, started_at_ms=0)
    assert budget_exhaustion(fresh, limits, 99) is None
    assert budget_exhaustion(attrs.evolve(fresh, iterations_started=2), limits, 0) is Bound.ITERATIONS
    assert budget_exhaustion(attrs.evolve(fresh, tool_calls_accepted=3), limits, 0) is Bound.TOOL_CALLS
    assert budget_exhaustion(attrs.evolve(fresh, retries_used=1), limits, 0) is Bound.RETRIES
    assert budget_exhaustion(fresh, limits, 100) is Bound.DEADLINE


def test_iterations_win_over_every_other_bound() -> None:
    limits = TurnLimits(max_iterations=1, max_tool_calls_per_turn=1, max_retries_per_turn=1, turn_deadline_ms=1)
    spent = TurnBudget(iterations_started=1, tool_calls_accepted=1, retries_used=1, started_at_ms=0)
    assert budget_exhaustion(spent, limits, 5) is Bound.ITERATIONS
    assert budget_exhaustion(attrs.evolve(spent, iterations_started=0), limits, 5) is Bound.TOOL_CALLS
    assert budget_exhaustion(attrs.evolve(spent, iterations_started=0, tool_calls_accepted=0), limits, 5) is (
        Bound.RETRIES
    )


def test_tool_call_cap_per_iteration_and_per_turn() -> None:
    limits = TurnLimits(max_tool_calls_per_iteration=2, max_tool_calls_per_turn=3)
    assert tool_call_cap(TurnBudget(tool_calls_accepted=0), limits, 1) is None
    assert tool_call_cap(TurnBudget(tool_calls_accepted=0), limits, 2) is Bound.TOOL_CALLS
    assert tool_call_cap(TurnBudget(tool_calls_accepted=2), limits, 0) is None
    assert tool_call_cap(TurnBudget(tool_calls_accepted=3), limits, 0) is Bound.TOOL_CALLS


def test_each_bound_has_its_own_notice_saying_what_was_kept() -> None:
    notices = {bound: bound_notice(bound) for bound in Bound}
    assert len(set(notices.values())) == len(Bound)
    assert all("kept" in text for text in notices.values())
    assert "time limit" in notices[Bound.DEADLINE]
    assert "review" in notices[Bound.REVIEW_TIMEOUT] and "not run" in notices[Bound.REVIEW_TIMEOUT]
