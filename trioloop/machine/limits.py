"""The ceilings of one turn and the only code that compares against them.

`TurnLimits` holds every ceiling, validated when it is built; `TurnBudget` counts what the turn has
spent. `budget_exhaustion` decides whether the turn may start another iteration, `spend_overrun` whether
its tokens and money allow another request (and which bound, with its figures, when not), and
`tool_call_cap` whether one more tool call may be admitted; nothing else in trioloop compares a
count with a limit, so a bound cannot be checked two different ways.
"""

from __future__ import annotations

import enum
from decimal import Decimal
from typing import Final, Literal, final

import attrs

from trioloop.machine.prices import ModelPrice, request_cost, usage_cost
from trioloop.protocol.events import Usage, usage_sum

__all__ = [
    "DEFAULT_TURN_LIMITS",
    "NO_SPENDING",
    "Bound",
    "Overrun",
    "SpendLimits",
    "Spending",
    "TurnBudget",
    "TurnLimits",
    "bound_notice",
    "budget_exhaustion",
    "overrun_notice",
    "question_cap",
    "sampling_tokens",
    "spend_limits",
    "spend_overrun",
    "timing_exhaustion",
    "tool_call_cap",
    "usd_text",
]


@final
class Bound(enum.StrEnum):
    """Which ceiling stopped a turn, in the order `budget_exhaustion` checks them."""

    ITERATIONS = "iterations"
    TOOL_CALLS = "tool_calls"
    RETRIES = "retries"
    OUTPUT_RETRIES = "output_retries"
    TOKENS = "tokens"
    COST = "cost"
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


def _optional_usd(instance: object, attribute: attrs.Attribute[Decimal | None], value: object) -> None:
    # Money is exact: a float (0.1 is not a tenth) and an int (a typo for cents?) are refused alike.
    if value is None:
        return
    if type(value) is not Decimal:
        raise TypeError(f'Limit "{attribute.name}" must be a Decimal amount of US dollars, received {value!r}.')
    if not value.is_finite() or value <= 0:
        raise ValueError(f'Limit "{attribute.name}" must be a finite, positive Decimal, received {value!r}.')


def _tokens() -> int | None:
    return attrs.field(default=None, validator=_optional_positive_int)


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
    #: Token bounds of the turn (None: unbounded). Input tokens are what the provider bills as input: the
    #: prompt with its cache reads and writes; output tokens include reasoning; total is the two added.
    max_input_tokens: int | None = _tokens()
    max_output_tokens: int | None = _tokens()
    max_total_tokens: int | None = _tokens()
    #: The most the turn may cost, in US dollars (a `Decimal`), at its model's price.
    max_cost_usd: Decimal | None = attrs.field(default=None, validator=_optional_usd)
    #: How many times a typed answer may be asked for again (an answer that failed its checks, or a text reply
    #: with no answer): one more settles the turn bounded, naming the last problem. Only typed answers count.
    max_output_retries: int = _limit(3)

    def __attrs_post_init__(self) -> None:
        # Each request reserves ``reserve_output_tokens`` against the output and total bounds: a bound below
        # the reserve would refuse every request, which is refused here, saying what to change.
        for name in ("max_output_tokens", "max_total_tokens"):
            bound = getattr(self, name)
            if bound is not None and bound < self.reserve_output_tokens:
                raise ValueError(
                    f'Turn limit "{name}" ({bound}) is below "reserve_output_tokens" ({self.reserve_output_tokens}),'
                    " which every request reserves: no request could be sent. Lower reserve_output_tokens."
                )


DEFAULT_TURN_LIMITS: Final = TurnLimits()


@final
@attrs.frozen(kw_only=True)
class SpendLimits:
    """Bounds on tokens and money alone (a session's, across its turns), as `TurnLimits` names them."""

    max_input_tokens: int | None = _tokens()
    max_output_tokens: int | None = _tokens()
    max_total_tokens: int | None = _tokens()
    max_cost_usd: Decimal | None = attrs.field(default=None, validator=_optional_usd)

    @property
    def bounded(self) -> bool:
        """Whether any bound is set."""
        return any(v is not None for v in attrs.astuple(self))


def spend_limits(limits: TurnLimits | SpendLimits) -> SpendLimits:
    """The token and cost bounds of ``limits``."""
    return SpendLimits(
        max_input_tokens=limits.max_input_tokens,
        max_output_tokens=limits.max_output_tokens,
        max_total_tokens=limits.max_total_tokens,
        max_cost_usd=limits.max_cost_usd,
    )


_NO_USAGE: Final = Usage()


@final
@attrs.frozen(kw_only=True)
class Spending:
    """What a turn's tokens and money are measured with, fixed when it is submitted (and journaled with it):
    its model's price (None: unknown), the session's bounds and what the session's earlier turns spent."""

    price: ModelPrice | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(ModelPrice))
    )
    session_limits: SpendLimits | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(SpendLimits))
    )
    session_before: Usage = attrs.field(default=_NO_USAGE, validator=attrs.validators.instance_of(Usage))


NO_SPENDING: Final = Spending()

Scope = Literal["turn", "session"]
Measure = Literal["input", "output", "total", "cost"]


@final
@attrs.frozen(kw_only=True)
class Overrun:
    """A token or cost bound a turn reached, with the figures its notice gives.

    ``spent`` is what was spent (tokens, or USD; for ``scope="session"`` the session's earlier turns
    included); ``upcoming`` what the request about to be sent may add (its estimated input and reserved
    output, priced for a cost bound), 0 after a response. ``spent`` is None for a cost bound with no known price.
    """

    bound: Bound
    scope: Scope
    measure: Measure
    spent: int | Decimal | None
    upcoming: int | Decimal
    limit: int | Decimal
    price_source: str = ""


def _tokens_over(scope: Scope, bounds: SpendLimits, used: Usage, next_input: int, next_output: int) -> Overrun | None:
    total = used.input_tokens + used.output_tokens
    figures: tuple[tuple[Measure, int | None, int, int], ...] = (
        ("input", bounds.max_input_tokens, used.input_tokens, next_input),
        ("output", bounds.max_output_tokens, used.output_tokens, next_output),
        ("total", bounds.max_total_tokens, total, next_input + next_output),
    )
    for measure, limit, spent, upcoming in figures:
        if limit is not None and spent + upcoming > limit:
            return Overrun(
                bound=Bound.TOKENS, scope=scope, measure=measure, spent=spent, upcoming=upcoming, limit=limit
            )
    return None


def _cost_over(
    scope: Scope, bounds: SpendLimits, used: Usage, price: ModelPrice | None, next_input: int, next_output: int
) -> Overrun | None:
    limit = bounds.max_cost_usd
    if limit is None:
        return None
    if price is None:  # a bound that cannot be measured is reached: never spend money nobody can count
        return Overrun(bound=Bound.COST, scope=scope, measure="cost", spent=None, upcoming=0, limit=limit)
    spent = usage_cost(used, price)
    upcoming = request_cost(next_input, next_output, price)
    if spent + upcoming > limit:
        return Overrun(
            bound=Bound.COST,
            scope=scope,
            measure="cost",
            spent=spent,
            upcoming=upcoming,
            limit=limit,
            price_source=price.source,
        )
    return None


def spend_overrun(
    usage: Usage,
    limits: TurnLimits,
    spending: Spending = NO_SPENDING,
    *,
    next_input_tokens: int = 0,
    next_output_tokens: int = 0,
) -> Overrun | None:
    """The first token or cost bound ``usage`` (the turn's) passes, or would pass with one more request of
    ``next_input_tokens`` in and ``next_output_tokens`` out; None when all allow it.

    Passing means exceeding: a request is sent exactly when what was spent plus its estimate and reserve
    stays within every bound. Order: the turn's token bounds (input, output, total), the session's, then
    the turn's cost bound, the session's. A cost bound with no known price is always passed.
    """
    if (
        spending.session_limits is None
        and limits.max_input_tokens is None
        and limits.max_output_tokens is None
        and limits.max_total_tokens is None
        and limits.max_cost_usd is None
    ):
        return None  # no token or cost bound: nothing to compare (every iteration asks twice)
    scopes: list[tuple[Scope, SpendLimits, Usage]] = [("turn", spend_limits(limits), usage)]
    if spending.session_limits is not None:
        scopes.append(("session", spending.session_limits, usage_sum(spending.session_before, usage)))
    for scope, bounds, used in scopes:
        over = _tokens_over(scope, bounds, used, next_input_tokens, next_output_tokens)
        if over is not None:
            return over
    for scope, bounds, used in scopes:
        over = _cost_over(scope, bounds, used, spending.price, next_input_tokens, next_output_tokens)
        if over is not None:
            return over
    return None


@final
@attrs.frozen(kw_only=True)
class TurnBudget:
    """What a turn has spent so far; only the reducer advances it."""

    iterations_started: int = 0
    tool_calls_accepted: int = 0
    retries_used: int = 0
    started_at_ms: int = 0
    #: Typed answers asked for again (`TurnLimits.max_output_retries`).
    output_retries_used: int = 0

    def spent(
        self, *, iterations: int = 0, tool_calls: int = 0, retries: int = 0, output_retries: int = 0
    ) -> TurnBudget:
        """This budget with more spent (a direct construction: the reducer calls it every iteration)."""
        return TurnBudget(
            iterations_started=self.iterations_started + iterations,
            tool_calls_accepted=self.tool_calls_accepted + tool_calls,
            retries_used=self.retries_used + retries,
            started_at_ms=self.started_at_ms,
            output_retries_used=self.output_retries_used + output_retries,
        )


def budget_exhaustion(
    budget: TurnBudget,
    limits: TurnLimits,
    now_ms: int,
    *,
    review_waited_ms: int | None = None,
    usage: Usage | None = None,
    spending: Spending = NO_SPENDING,
) -> Bound | None:
    """The first exhausted bound (iterations, tool calls, retries, output retries, tokens, cost, deadline, review
    timeout), or None.

    Consulted when an iteration ends, before a retry and when the turn's scope is cancelled; reaching
    a ceiling exactly counts as exhausted, so ``max_iterations = N`` allows exactly N provider requests.
    ``now_ms`` is the turn's machine time (the runner's clock minus the time spent waiting for the
    reviewer); ``review_waited_ms`` is how long the current review has waited, None when none is open.
    Tokens and cost are checked when ``usage`` (the turn's) is given: exceeded, not merely reached, as
    `spend_overrun` says. Output retries are exceeded too, not reached: ``max_output_retries = N`` allows N
    answers asked for again, and the next failure ends the turn.
    """
    if budget.iterations_started >= limits.max_iterations:
        return Bound.ITERATIONS
    if budget.tool_calls_accepted >= limits.max_tool_calls_per_turn:
        return Bound.TOOL_CALLS
    if budget.retries_used >= limits.max_retries_per_turn:
        return Bound.RETRIES
    if budget.output_retries_used > limits.max_output_retries:
        return Bound.OUTPUT_RETRIES
    if usage is not None:
        over = spend_overrun(usage, limits, spending)
        if over is not None:
            return over.bound
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
    Bound.OUTPUT_RETRIES: "This turn stopped because its answer failed its checks too many times; it gives no"
    " answer." + _KEPT,
    Bound.TOKENS: "This turn stopped at a token bound." + _KEPT,
    Bound.COST: "This turn stopped at a cost bound." + _KEPT,
    Bound.DEADLINE: "This turn stopped because it ran past its time limit." + _KEPT,
    Bound.REVIEW_TIMEOUT: "This turn stopped because its review cards waited too long for a decision;"
    " the undecided calls were not run." + _KEPT,
}


def bound_notice(bound: Bound) -> str:
    """The user-facing notice for a turn settled by ``bound``: what stopped it and what was kept.

    A token or cost bound's notice with its figures is `overrun_notice`'s; this is the short one."""
    return _NOTICES[bound]


def _figure(value: int | Decimal) -> str:
    if isinstance(value, Decimal):
        return usd_text(value)
    return f"{value:,}"


def usd_text(value: Decimal) -> str:
    """US dollars as a person reads them: cents always, up to four decimals when a figure is that small."""
    text = f"{value:,.4f}"
    while text.endswith("0") and len(text.rsplit(".", 1)[1]) > 2:
        text = text[:-1]
    return "$" + text


_UNITS: Final = {"input": " input tokens", "output": " output tokens", "total": " tokens", "cost": ""}
_BOUND_NAMES: Final = {"input": "input-token", "output": "output-token", "total": "token", "cost": "cost"}


def overrun_notice(over: Overrun) -> str:
    """The notice for a turn settled by a token or cost bound, with the figures: what was spent, what the
    request not sent would have added, the bound, and for money where the price came from."""
    whose = "its" if over.scope == "turn" else "the session's"
    name = f"{whose} {_BOUND_NAMES[over.measure]} bound of {_figure(over.limit)}"
    if over.spent is None:
        return (
            f"This turn stopped before its first request: {name} cannot be counted, its model has no known price."
            + _KEPT
        )
    unit = _UNITS[over.measure]
    if over.upcoming:
        text = (
            f"This turn stopped before its next model request: {_figure(over.spent)}{unit} spent, and the request"
            f" (up to {_figure(over.upcoming)}{unit} more) would pass {name}{unit}."
        )
    else:
        spent, limit = _figure(over.spent), _figure(over.limit)
        text = f"This turn stopped at {whose} {_BOUND_NAMES[over.measure]} bound: {spent} of {limit}{unit} spent."
    if over.measure == "cost":
        text += f" Prices: {over.price_source}."
    return text + _KEPT
