"""The journal's JSON for a turn's limits and spending: money as a decimal string, read back to the same `Decimal`.

``attrs.asdict`` of `TurnLimits` holds a `Decimal` once a cost bound is set, which JSON has no type for: it is
written as its exact string (``"0.50"``) and read back with `Decimal`, never through a float. A journal written
before the token and cost bounds existed has none of their fields and replays with them unset.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

import attrs

from trioloop.machine.limits import NO_SPENDING, Spending, SpendLimits, TurnLimits
from trioloop.machine.prices import ModelPrice
from trioloop.protocol.events import Usage

__all__ = ["limits_from_json", "limits_to_json", "spending_from_json", "spending_to_json"]

_MONEY = ("max_cost_usd", "input_per_mtok", "output_per_mtok", "cache_read_per_mtok", "cache_write_per_mtok")


def _plain(value: Any) -> dict[str, Any]:
    return {k: str(v) if isinstance(v, Decimal) else v for k, v in attrs.asdict(value).items()}


def _money(value: dict[str, Any]) -> dict[str, Any]:
    """``value`` with its money fields as `Decimal` (ValueError for one that is not a decimal string)."""
    out = dict(value)
    for name in _MONEY:
        text = out.get(name)
        if text is None:
            continue
        if type(text) is not str:
            raise ValueError(f"{name} must be written as a decimal string")
        try:
            out[name] = Decimal(text)
        except InvalidOperation:
            raise ValueError(f"{name} is not a decimal") from None
    return out


#: Fields written only when they differ from their default: added after journals existed, so a turn that leaves
#: them alone is journaled byte for byte as before (and an older journal, which has none, reads as the default).
_NEWER_DEFAULTS = {"max_output_retries": TurnLimits().max_output_retries}


def limits_to_json(limits: TurnLimits) -> dict[str, Any]:
    """Every field of ``limits``; a cost bound as its exact decimal string."""
    plain = _plain(limits)
    for name, default in _NEWER_DEFAULTS.items():
        if plain.get(name) == default:
            del plain[name]
    return plain


def limits_from_json(value: dict[str, Any]) -> TurnLimits:
    """The `TurnLimits` a journal wrote (TypeError or ValueError when they are not valid limits)."""
    return TurnLimits(**_money(value))


def spending_to_json(spending: Spending) -> dict[str, Any] | None:
    """The price and session bounds a turn was submitted with; None when it had neither (nor spent before)."""
    if spending == NO_SPENDING:
        return None
    return {
        "price": None if spending.price is None else _plain(spending.price),
        "session_limits": None if spending.session_limits is None else _plain(spending.session_limits),
        "session_before": attrs.asdict(spending.session_before),
    }


def spending_from_json(value: object) -> Spending:
    """The `Spending` a journal wrote (TypeError or ValueError when it is not valid); none written: none."""
    if value is None:
        return NO_SPENDING
    if type(value) is not dict:
        raise TypeError("spending must be an object")
    price, bounds, before = value.get("price"), value.get("session_limits"), value.get("session_before")
    if not all(v is None or type(v) is dict for v in (price, bounds, before)):
        raise TypeError("spending's parts must be objects")
    return Spending(
        price=None if price is None else ModelPrice(**_money(price)),
        session_limits=None if bounds is None else SpendLimits(**_money(bounds)),
        session_before=Usage() if before is None else Usage(**before),
    )
