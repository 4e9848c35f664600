"""A turn's tokens and money as the runtime sets them up: the model's price looked up when the turn starts (a cost
bound on a model with no known price is refused then, before anything is sent), the session's bounds and what its
earlier turns spent, and the estimate each request is checked with before it is sent (`BeforeRequest`).
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal

from trioloop.machine.inputs import BeforeRequest
from trioloop.machine.limits import NO_SPENDING, Spending, SpendLimits, TurnLimits
from trioloop.machine.prices import ModelPrice, lookup_price, usage_cost
from trioloop.machine.state import TurnState
from trioloop.protocol.budget import estimate_request_tokens
from trioloop.protocol.events import Usage
from trioloop.protocol.tools import ChatRequest

__all__ = ["PriceUnknown", "before_request", "check_priced", "session_cost", "turn_cost", "turn_spending"]


class PriceUnknown(ValueError):
    """A cost bound was set for a model whose price nobody knows: the turn is refused before anything is sent."""

    def __init__(self, model: str) -> None:
        self.model = model
        super().__init__(
            f"The turn has a cost bound, but the price of model {model!r} is not known: trioloop's price table has no"
            " entry for it. Pass its price (prices={model: ModelPrice(...)}) or remove the cost bound."
        )


def turn_spending(
    *,
    model: str,
    limits: TurnLimits,
    session_limits: SpendLimits | None,
    prices: Mapping[str, ModelPrice] | None,
    session_before: Usage,
) -> Spending:
    """What a new turn's spending is measured with; `PriceUnknown` for a cost bound on a model with no price."""
    price = lookup_price(model, overrides=prices)
    cost_bounded = limits.max_cost_usd is not None or (
        session_limits is not None and session_limits.max_cost_usd is not None
    )
    if cost_bounded and price is None:
        raise PriceUnknown(model)
    if session_limits is not None and not session_limits.bounded:
        session_limits = None
    spending = Spending(price=price, session_limits=session_limits, session_before=session_before)
    return NO_SPENDING if spending == NO_SPENDING else spending


def check_priced(model: str, limits: TurnLimits, spending: Spending) -> None:
    """`PriceUnknown` when the turn (or its session) has a cost bound and no price to count it with."""
    bounds = spending.session_limits
    if spending.price is None and (
        limits.max_cost_usd is not None or (bounds is not None and bounds.max_cost_usd is not None)
    ):
        raise PriceUnknown(model)


def _spend_bounded(state: TurnState) -> bool:
    limits, bounds = state.limits, state.spending.session_limits
    return (
        limits.max_input_tokens is not None
        or limits.max_output_tokens is not None
        or limits.max_total_tokens is not None
        or limits.max_cost_usd is not None
        or bounds is not None
    )


def before_request(state: TurnState, request: ChatRequest) -> BeforeRequest | None:
    """The check a request passes before it is sent (None for a turn with no token or cost bound: nothing to
    check, and no estimate is made): its preflight input estimate and the output its limits reserve."""
    if not _spend_bounded(state):
        return None
    estimate = estimate_request_tokens(request.system, request.messages, request.tools)
    return BeforeRequest(input_tokens=estimate, output_tokens=state.limits.reserve_output_tokens)


def turn_cost(state: TurnState) -> Decimal | None:
    """What the turn's tokens cost at its model's price, or None when the price is not known."""
    price = state.spending.price
    return None if price is None else usage_cost(state.usage, price)


def session_cost(usage: Usage, model: str, prices: Mapping[str, ModelPrice] | None = None) -> Decimal | None:
    """What a session's tokens cost at its model's price (the app's first), or None when it is not known."""
    price = lookup_price(model, overrides=prices)
    return None if price is None else usage_cost(usage, price)
