"""The chat's token counts and their cost: the line after each turn and ``/usage``, from the turn's state and
`Session.usage` (the session's settled turns, those before a ``--resume`` included). A cost is shown when the
model's price is known (the app's ``prices``, else trioloop's table), never guessed."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from rich.console import Console
from rich.text import Text

from trioloop.machine.limits import usd_text
from trioloop.machine.state import TurnState
from trioloop.protocol.events import Usage
from trioloop.runtime.session import Session
from trioloop.runtime.spending import turn_cost

__all__ = ["show_turn_usage", "show_usage", "usage_report", "usage_text"]


def usage_text(usage: Usage, cost: Decimal | None = None) -> str:
    cache = ""
    if usage.cache_read_input_tokens or usage.cache_creation_input_tokens:
        cache = f" (cache: {usage.cache_read_input_tokens} read, {usage.cache_creation_input_tokens} written)"
    text = f"{usage.input_tokens} in{cache}, {usage.output_tokens} out"
    return text if cost is None else f"{text}, {usd_text(cost)}"


def show_usage(
    console: Console,
    turn: Usage,
    totals: Usage,
    *,
    turn_cost: Decimal | None = None,
    session_cost: Decimal | None = None,
) -> None:
    """The turn's tokens (cache reads and writes apart) and the session's running totals, with their cost."""
    if not (turn.input_tokens or turn.output_tokens):
        return
    console.print(
        Text(f"tokens: {usage_text(turn, turn_cost)}; session: {usage_text(totals, session_cost)}", style="dim")
    )


def show_turn_usage(console: Console, session: Session[Any], state: TurnState) -> None:
    """`show_usage` for the turn that settled in ``state`` and its session."""
    show_usage(console, state.usage, session.usage, turn_cost=turn_cost(state), session_cost=session.cost_usd)


def usage_report(session: Session[Any]) -> str:
    """What ``/usage`` says: the session's tokens and cost, then the last turn's."""
    text = f"This session: {usage_text(session.usage, session.cost_usd)}"
    state = session.state
    if state is not None and (state.usage.input_tokens or state.usage.output_tokens):
        text += f"; last turn: {usage_text(state.usage, turn_cost(state))}"
    if session.cost_usd is None:
        text += f" (no price known for {session.model!r}: cost not shown)"
    return text
