"""The ceilings of one turn and the only code that compares against them.

`TurnLimits` holds every ceiling, validated when it is built; `TurnBudget` counts what the turn has
spent. `budget_exhaustion` decides whether the turn may start another iteration and
`tool_call_cap` whether one more tool call may be admitted; nothing else in trioloop compares a
count with a limit, so a bound cannot be checked two different ways.
"""

from __future__ import annotations

import enum
from typing import Final, final

import attrs

__all__ = [
    "DEFAULT_TURN_LIMITS",
    "Bound",
    "TurnBudget",
    "TurnLimits",
    "bound_notice",
    "budget_exhaustion",
    "question_cap",
    "sampling_tokens",
    "timing_exhaustion",
    "tool_call_cap",
]


@final
class Bound(enum.StrEnum):
    """Which ceiling stopped a turn, in the order `budget_exhaustion` checks them."""

    ITERATIONS = "iterations"
    TOOL_CALLS = "tool_calls"
    RETRIES = "retries"
    DEADLINE = "deadline"
    REVIEW_TIMEOUT = "review_timeout"


def _positive_int(instance: object, attribute: attrs.Attribute[int], value: object) -> None:
    # bool is an int subclass and a float may be integral or NaN; all are refused so that a
    # limit is always an exact, comparable count.
    if type(value) is not int:
        raise TypeError(f'Turn limit "{attribute.name}" must be a positive integer, received {value!r}.')
    if value <= 0:
        raise ValueError(f'Turn limit "{attribute.name}" must be a positive integer, received {value!r}.')


def _limit(default: int) -> int:
    return attrs.field(default=default, validator=_positive_int)


def _optional_positive_int(instance: object, attribute: attrs.Attribute[int | None], value: object) -> None:
    if value is not None:
        _positive_int(instance, attribute, value)  # type: ignore[arg-type]


@final
@attrs.frozen(kw_only=True)
class TurnLimits:
    """Every ceiling of one turn; invalid values are refused at construction, naming the field."""

    max_iterations: int = _limit(8)
    max_tool_calls_per_turn: int = _limit(32)
    max_tool_calls_per_iteration: int = _limit(12)
    max_retries_per_turn: int = _limit(3)
    turn_deadline_ms: int = _limit(300_000)
    reserve_output_tokens: int = _limit(4096)
    #: How long the turn may wait for the reviewer's decisions on one iteration's cards; None waits for ever.
    #: The turn deadline does not run while the turn waits for the reviewer; this bound does.
    review_timeout_ms: int | None = attrs.field(default=None, validator=_optional_positive_int)
    #: How many questions the turn's running tools may put to the person (an MCP server's elicitation and
    #: sampling requests); one more is refused, and the asker is told why.
    max_questions_per_turn: int = _limit(8)
    #: The most output tokens one approved sampling request may ask the model for (a server asking for more
    #: gets this many).
    max_sampling_tokens: int = _limit(2048)


DEFAULT_TURN_LIMITS: Final = TurnLimits()


@final
@attrs.frozen(kw_only=True)
class TurnBudget:
    """What a turn has spent so far; only the reducer advances it."""

    iterations_started: int = 0
    tool_calls_accepted: int = 0
    retries_used: int = 0
    started_at_ms: int = 0

    def spent(self, *, iterations: int = 0, tool_calls: int = 0, retries: int = 0) -> TurnBudget:
        """This budget with more spent (a direct construction: the reducer calls it every iteration)."""
        return TurnBudget(
            iterations_started=self.iterations_started + iterations,
            tool_calls_accepted=self.tool_calls_accepted + tool_calls,
            retries_used=self.retries_used + retries,
            started_at_ms=self.started_at_ms,
        )


def budget_exhaustion(
    budget: TurnBudget, limits: TurnLimits, now_ms: int, *, review_waited_ms: int | None = None
) -> Bound | None:
    """The first exhausted bound (iterations, tool calls, retries, deadline, review timeout), or None.

    Consulted when an iteration ends, before a retry and when the turn's scope is cancelled; reaching
    a ceiling exactly counts as exhausted, so ``max_iterations = N`` allows exactly N provider requests.
    ``now_ms`` is the turn's machine time (the runner's clock minus the time spent waiting for the
    reviewer); ``review_waited_ms`` is how long the current review has waited, None when none is open.
    """
    if budget.iterations_started >= limits.max_iterations:
        return Bound.ITERATIONS
    if budget.tool_calls_accepted >= limits.max_tool_calls_per_turn:
        return Bound.TOOL_CALLS
    if budget.retries_used >= limits.max_retries_per_turn:
        return Bound.RETRIES
    return timing_exhaustion(budget, limits, now_ms, review_waited_ms=review_waited_ms)


def timing_exhaustion(
    budget: TurnBudget, limits: TurnLimits, now_ms: int, *, review_waited_ms: int | None = None
) -> Bound | None:
    """The bounds of time alone, in `budget_exhaustion`'s order: the deadline, then the review timeout.

    What the runner asks when the turn's scope is cancelled (only time can cancel it), without the
    counting bounds that a turn may also have reached.
    """
    if now_ms - budget.started_at_ms >= limits.turn_deadline_ms:
        return Bound.DEADLINE
    if (
        review_waited_ms is not None
        and limits.review_timeout_ms is not None
        and review_waited_ms >= limits.review_timeout_ms
    ):
        return Bound.REVIEW_TIMEOUT
    return None


def tool_call_cap(budget: TurnBudget, limits: TurnLimits, calls_this_iteration: int) -> Bound | None:
    """`Bound.TOOL_CALLS` when one more call would exceed the per-iteration or per-turn cap.

    ``calls_this_iteration`` counts every call record of the iteration (unknown tools and invalid
    inputs included); the turn count is the accepted calls only.
    """
    if calls_this_iteration >= limits.max_tool_calls_per_iteration:
        return Bound.TOOL_CALLS
    if budget.tool_calls_accepted >= limits.max_tool_calls_per_turn:
        return Bound.TOOL_CALLS
    return None


def question_cap(asked_this_turn: int, limits: TurnLimits) -> bool:
    """Whether the turn has put all the questions ``max_questions_per_turn`` allows (one more is refused)."""
    return asked_this_turn >= limits.max_questions_per_turn


def sampling_tokens(asked: int, limits: TurnLimits) -> int:
    """The output tokens an approved sampling request gets: what it asked for, at most ``max_sampling_tokens``."""
    return min(asked, limits.max_sampling_tokens)


_KEPT: Final = " Changes you already approved were kept and can be undone."

_NOTICES: Final = {
    Bound.ITERATIONS: "This turn stopped because it used all of its model steps." + _KEPT,
    Bound.TOOL_CALLS: "This turn stopped because it used all of its tool calls." + _KEPT,
    Bound.RETRIES: "This turn stopped because the provider needed too many retries." + _KEPT,
    Bound.DEADLINE: "This turn stopped because it ran past its time limit." + _KEPT,
    Bound.REVIEW_TIMEOUT: "This turn stopped because its review cards waited too long for a decision;"
    " the undecided calls were not run." + _KEPT,
}


def bound_notice(bound: Bound) -> str:
    """The user-facing notice for a turn settled by ``bound``: what stopped it and what was kept."""
    return _NOTICES[bound]
