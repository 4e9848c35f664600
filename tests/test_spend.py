"""Token and cost bounds in the machine: the limits' validation, `spend_overrun` (the only comparison), prices,
the reducer's `BeforeRequest` and its checks after a response and at an iteration's end, the notices' figures, and
the journal's JSON for limits and spending (a Decimal read back exactly; a journal from before has none)."""

from __future__ import annotations

import math
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_machine import REGISTRY

from trioloop.durable.spend_json import limits_from_json, limits_to_json, spending_from_json, spending_to_json
from trioloop.machine.limits import (
    NO_SPENDING,
    Bound,
    Spending,
    SpendLimits,
    TurnBudget,
    TurnLimits,
    budget_exhaustion,
    overrun_notice,
    spend_overrun,
    usd_text,
)
from trioloop.machine.prices import PRICE_TABLE, PRICE_TABLE_SOURCE, ModelPrice, lookup_price, usage_cost
from trioloop.machine.reducer import (
    Advance,
    BeforeRequest,
    CallSettled,
    CallStatus,
    Outcome,
    Phase,
    StartCall,
    Submit,
    TurnInput,
    TurnState,
    reduce_turn,
)
from trioloop.machine.tools import ToolOutcome
from trioloop.protocol import MessageStart, MessageStop, ToolCallComplete, Usage
from trioloop.protocol.preflight import MODEL_TABLE

PRICE = ModelPrice(input_per_mtok=Decimal("3"), output_per_mtok=Decimal("15"), source="test prices")


def submit(limits: TurnLimits, spending: Spending = NO_SPENDING) -> Submit:
    return Submit(turn_id="t", text="hi", tool_set=REGISTRY, limits=limits, now_ms=0, spending=spending)


def run(inputs: list[TurnInput], state: TurnState | None = None) -> TurnState:
    state = state or TurnState.idle()
    for item in inputs:
        state = reduce_turn(state, item)
    return state


def response(usage: Usage, *, call: str | None = "r1") -> list[TurnInput]:
    """One response: a read call (auto-approved) and its usage, or an answer with no call."""
    items: list[TurnInput] = [MessageStart(model="m")]
    if call is not None:
        items.append(ToolCallComplete(id=call, name="read", input={"name": "web"}))
    items += [usage, MessageStop(stop_reason="tool_use" if call else "end_turn")]
    return items


# -- limits ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad", [0.5, 1, math.nan, "1.00", Decimal("NaN"), Decimal("Infinity"), Decimal(0), Decimal(-1)]
)
def test_a_cost_bound_is_a_positive_finite_decimal(bad: object) -> None:
    with pytest.raises((TypeError, ValueError), match="max_cost_usd"):
        TurnLimits(max_cost_usd=bad)  # type: ignore[arg-type]
    with pytest.raises((TypeError, ValueError), match="max_cost_usd"):
        SpendLimits(max_cost_usd=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["max_output_tokens", "max_total_tokens"])
def test_an_output_or_total_bound_below_the_reserve_is_refused(field: str) -> None:
    with pytest.raises(ValueError, match=f"{field}.*reserve_output_tokens"):
        TurnLimits(**{field: 4095})  # type: ignore[arg-type]
    assert getattr(TurnLimits(**{field: 4096}), field) == 4096  # type: ignore[arg-type]


def test_the_new_bounds_are_off_by_default() -> None:
    limits = TurnLimits()
    assert (limits.max_input_tokens, limits.max_output_tokens, limits.max_total_tokens, limits.max_cost_usd) == (
        None,
        None,
        None,
        None,
    )
    assert spend_overrun(Usage(input_tokens=10**12, output_tokens=10**12), limits) is None
    assert not SpendLimits().bounded and SpendLimits(max_total_tokens=1).bounded


# -- prices ------------------------------------------------------------------------------------------------


def test_a_price_is_decimal_and_never_a_float() -> None:
    with pytest.raises(TypeError, match="input_per_mtok"):
        ModelPrice(input_per_mtok=3.0, output_per_mtok=Decimal(15))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="output_per_mtok"):
        ModelPrice(input_per_mtok=Decimal(3), output_per_mtok=Decimal(-1))


def test_usage_cost_prices_each_part_at_its_own_rate() -> None:
    price = ModelPrice(
        input_per_mtok=Decimal("3"),
        output_per_mtok=Decimal("15"),
        cache_read_per_mtok=Decimal("0.3"),
        cache_write_per_mtok=Decimal("3.75"),
    )
    # 1,000,000 input tokens of which 200,000 cache reads and 100,000 cache writes; 10,000 out.
    usage = Usage(
        input_tokens=1_000_000,
        cache_read_input_tokens=200_000,
        cache_creation_input_tokens=100_000,
        output_tokens=10_000,
    )
    assert usage_cost(usage, price) == Decimal("2.1") + Decimal("0.06") + Decimal("0.375") + Decimal("0.15")
    assert usage_cost(usage, PRICE) == Decimal("3") + Decimal("0.15")  # no cache rates: the input rate


def test_every_model_of_the_model_table_has_a_price() -> None:
    assert set(MODEL_TABLE) <= set(PRICE_TABLE)
    assert all(price.source == PRICE_TABLE_SOURCE for price in PRICE_TABLE.values())


def test_an_app_price_comes_before_the_table() -> None:
    assert lookup_price("claude-sonnet-4-5") == PRICE_TABLE["claude-sonnet-4-5"]
    assert lookup_price("claude-sonnet-4-5", overrides={"claude-sonnet-4-5": PRICE}) is PRICE
    assert lookup_price("my-local-model") is None
    assert lookup_price("my-local-model", overrides={"my-local-model": PRICE}) is PRICE


# -- the comparison ----------------------------------------------------------------------------------------

counts = st.integers(min_value=0, max_value=10**9)
bounds = st.integers(min_value=1, max_value=2 * 10**9)


@given(spent_in=counts, spent_out=counts, estimate=counts, reserve=counts, bound=bounds)
def test_a_request_is_sent_iff_spent_estimate_and_reserve_fit_the_total_bound(
    spent_in: int, spent_out: int, estimate: int, reserve: int, bound: int
) -> None:
    limits = TurnLimits(max_total_tokens=bound, reserve_output_tokens=1)
    over = spend_overrun(
        Usage(input_tokens=spent_in, output_tokens=spent_out),
        limits,
        next_input_tokens=estimate,
        next_output_tokens=reserve,
    )
    assert (over is None) == (spent_in + spent_out + estimate + reserve <= bound)
    if over is not None:
        assert (over.bound, over.measure, over.spent, over.upcoming, over.limit) == (
            Bound.TOKENS,
            "total",
            spent_in + spent_out,
            estimate + reserve,
            bound,
        )


@given(
    spent_in=counts,
    spent_out=counts,
    estimate=counts,
    reserve=counts,
    cents=st.integers(min_value=1, max_value=10**6),
)
def test_a_request_is_sent_iff_its_priced_estimate_fits_the_cost_bound(
    spent_in: int, spent_out: int, estimate: int, reserve: int, cents: int
) -> None:
    bound = Decimal(cents) / 100
    limits = TurnLimits(max_cost_usd=bound)
    over = spend_overrun(
        Usage(input_tokens=spent_in, output_tokens=spent_out),
        limits,
        Spending(price=PRICE),
        next_input_tokens=estimate,
        next_output_tokens=reserve,
    )
    exact = (Decimal(3) * (spent_in + estimate) + Decimal(15) * (spent_out + reserve)) / 1_000_000
    assert (over is None) == (exact <= bound)
    if over is not None:
        assert over.bound is Bound.COST and over.spent + over.upcoming == exact and over.price_source == "test prices"


@given(before=counts, spent=counts, bound=bounds)
def test_a_session_bound_counts_the_earlier_turns(before: int, spent: int, bound: int) -> None:
    spending = Spending(session_limits=SpendLimits(max_input_tokens=bound), session_before=Usage(input_tokens=before))
    over = spend_overrun(Usage(input_tokens=spent), TurnLimits(), spending)
    assert (over is None) == (before + spent <= bound)
    if over is not None:
        assert (over.scope, over.measure, over.spent) == ("session", "input", before + spent)


def test_tokens_come_before_cost_and_the_turn_before_the_session() -> None:
    spending = Spending(price=PRICE, session_limits=SpendLimits(max_output_tokens=1, max_cost_usd=Decimal("0.01")))
    limits = TurnLimits(max_input_tokens=5, max_cost_usd=Decimal("0.01"))
    over = spend_overrun(Usage(input_tokens=10**6, output_tokens=10**6), limits, spending)
    assert over is not None and (over.bound, over.scope, over.measure) == (Bound.TOKENS, "turn", "input")
    over = spend_overrun(Usage(input_tokens=5, output_tokens=10**6), limits, spending)
    assert over is not None and (over.bound, over.scope, over.measure) == (Bound.TOKENS, "session", "output")
    over = spend_overrun(Usage(input_tokens=5), limits, Spending(price=PRICE))
    assert over is None


def test_a_cost_bound_with_no_price_is_always_passed() -> None:
    over = spend_overrun(Usage(), TurnLimits(max_cost_usd=Decimal(100)))
    assert over is not None and over.bound is Bound.COST and over.spent is None
    assert "no known price" in overrun_notice(over)


def test_budget_exhaustion_checks_tokens_and_cost_after_retries_and_before_the_deadline() -> None:
    limits = TurnLimits(max_retries_per_turn=1, max_total_tokens=10, turn_deadline_ms=5, reserve_output_tokens=1)
    usage = Usage(input_tokens=11)
    assert budget_exhaustion(TurnBudget(retries_used=1), limits, 10, usage=usage) is Bound.RETRIES
    assert budget_exhaustion(TurnBudget(), limits, 10, usage=usage) is Bound.TOKENS
    assert budget_exhaustion(TurnBudget(), limits, 10) is Bound.DEADLINE  # no usage given: tokens not checked
    cost = TurnLimits(max_cost_usd=Decimal("0.00001"))
    assert budget_exhaustion(TurnBudget(), cost, 0, usage=usage, spending=Spending(price=PRICE)) is Bound.COST


def test_money_is_shown_in_cents_or_finer() -> None:
    assert [usd_text(Decimal(v)) for v in ("0.5", "0.93", "0.3524", "1234.5")] == [
        "$0.50",
        "$0.93",
        "$0.3524",
        "$1,234.50",
    ]


# -- the reducer -------------------------------------------------------------------------------------------


def test_a_request_that_would_pass_the_bound_is_not_sent_and_settles_bounded() -> None:
    limits = TurnLimits(max_total_tokens=40_000, reserve_output_tokens=4_096)
    state = run([submit(limits), *response(Usage(input_tokens=30_000, output_tokens=1_000))])
    assert state.phase is Phase.EXECUTING
    state = run(
        [StartCall(call_id="r1", now_ms=1), CallSettled(call_id="r1", outcome=ToolOutcome.success("x"), now_ms=2)],
        state,
    )
    state = run([Advance(now_ms=3)], state)
    assert state.phase is Phase.REQUESTING
    fits = BeforeRequest(input_tokens=40_000 - 31_000 - 4_096, output_tokens=4_096)
    assert reduce_turn(state, fits) is state  # nothing changes: the request is sent
    settled = reduce_turn(state, BeforeRequest(input_tokens=fits.input_tokens + 1, output_tokens=4_096))
    assert (settled.outcome, settled.bound) == (Outcome.BOUNDED, Bound.TOKENS)
    assert settled.notices[-1].startswith(
        "This turn stopped before its next model request: 31,000 tokens spent, and the request (up to 9,001 tokens"
        " more) would pass its token bound of 40,000 tokens."
    )
    assert settled.call("r1") is not None and settled.call("r1").status is CallStatus.SUCCEEDED  # commits kept


def test_a_response_past_the_bound_settles_before_its_calls_run() -> None:
    limits = TurnLimits(max_output_tokens=500, reserve_output_tokens=100)
    state = run([submit(limits), *response(Usage(input_tokens=100, output_tokens=501))])
    assert (state.outcome, state.bound) == (Outcome.BOUNDED, Bound.TOKENS)
    record = state.call("r1")
    assert record is not None and record.status is CallStatus.DENIED  # never run
    assert "its output-token bound: 501 of 500 output tokens spent." in state.notices[-1]


def test_an_answer_past_the_bound_still_completes() -> None:
    state = run(
        [
            submit(TurnLimits(max_output_tokens=500, reserve_output_tokens=100)),
            *response(Usage(output_tokens=900), call=None),
        ]
    )
    assert state.outcome is Outcome.COMPLETED and state.bound is None


def test_the_cost_bound_at_an_iterations_end_names_its_figures_and_prices() -> None:
    limits = TurnLimits(max_cost_usd=Decimal("0.05"))
    state = run([submit(limits, Spending(price=PRICE))])
    state = run(response(Usage(input_tokens=10_000, output_tokens=1_000)), state)  # $0.045: within the bound
    assert state.phase is Phase.EXECUTING
    state = run(
        [StartCall(call_id="r1", now_ms=1), CallSettled(call_id="r1", outcome=ToolOutcome.success("x"), now_ms=2)],
        state,
    )
    # A usage that came after the response's end (a server that reports it last) is counted at the iteration's end.
    state = run([Usage(input_tokens=10_000, output_tokens=2_000), Advance(now_ms=3)], state)
    assert (state.outcome, state.bound) == (Outcome.BOUNDED, Bound.COST)
    assert "its cost bound: $0.06 of $0.05 spent. Prices: test prices." in state.notices[-1]


def test_no_price_settles_at_the_first_request() -> None:
    state = run([submit(TurnLimits(max_cost_usd=Decimal(1))), BeforeRequest(input_tokens=10, output_tokens=10)])
    assert (state.outcome, state.bound) == (Outcome.BOUNDED, Bound.COST)


# -- the journal's JSON ------------------------------------------------------------------------------------


def test_limits_round_trip_with_the_exact_decimal() -> None:
    limits = TurnLimits(max_total_tokens=10, max_cost_usd=Decimal("0.10"), reserve_output_tokens=10)
    written = limits_to_json(limits)
    assert written["max_cost_usd"] == "0.10"
    assert limits_from_json(written) == limits
    assert str(limits_from_json(written).max_cost_usd) == "0.10"


def test_limits_from_a_journal_written_before_the_bounds_existed() -> None:
    old = {
        k: v
        for k, v in limits_to_json(TurnLimits()).items()
        if not k.startswith(("max_input", "max_output", "max_total", "max_cost"))
    }
    assert limits_from_json(old) == TurnLimits()
    assert spending_from_json(None) == NO_SPENDING


@pytest.mark.parametrize("bad", [0.1, 1, "one", None])
def test_a_cost_bound_that_is_not_a_decimal_string_is_refused(bad: object) -> None:
    written = limits_to_json(TurnLimits()) | {"max_cost_usd": bad}
    if bad is None:
        assert limits_from_json(written) == TurnLimits()
        return
    with pytest.raises((TypeError, ValueError)):
        limits_from_json(written)


def test_spending_round_trips() -> None:
    spending = Spending(
        price=PRICE_TABLE["claude-haiku-4-5"],
        session_limits=SpendLimits(max_total_tokens=5, max_cost_usd=Decimal("2.50")),
        session_before=Usage(input_tokens=3, output_tokens=4, cache_read_input_tokens=1),
    )
    assert spending_from_json(spending_to_json(spending)) == spending
    assert spending_to_json(NO_SPENDING) is None
